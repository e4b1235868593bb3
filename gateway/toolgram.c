/* Tool-call grammars (gateway/toolgram.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/jsonschema.h"
#include "gateway/toolgram.h"

/* Defines rule call-I as body and makes it one of the alternatives. */
static int add_call(mr_jsgram *g, size_t i, const char *body, mr_buf *alts, mr_err *err)
{
    char rule[48];
    snprintf(rule, sizeof rule, "call-%zu", i);
    if (mr_jsgram_add_rule(g, rule, body, err))
        return -1;
    mr_buf_printf(alts, "%s%s", alts->len ? " | " : "", rule);
    return 0;
}

/* call-I ::= "<tool_call>\n{\"name\": " NAME ", \"arguments\": " args-I "}\n</tool_call>" */
static int hermes_call(mr_jsgram *g, size_t i, const json_t *fn, mr_buf *alts, mr_err *err)
{
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *params = json_object_get(fn, "parameters");
    char rule[48], where[64];
    snprintf(rule, sizeof rule, "args-%zu", i);
    snprintf(where, sizeof where, "tools[%zu].function.parameters", i);
    /* no schema: any object, as the template promises arguments to be */
    if (params && !json_is_null(params) ? mr_jsgram_add_schema(g, rule, params, where, err)
                                        : mr_jsgram_add_object(g, rule, err))
        return -1;
    /* the name as JSON writes it (the template writes it raw between
     * quotes: the same bytes for every name without '"' or '\') */
    char *quoted = json_dumps(json_object_get(fn, "name"), JSON_ENCODE_ANY);
    mr_buf head = {0}, body = {0};
    int rc = -1;
    if (!quoted) {
        mr_errf(err, "out of memory");
        goto out;
    }
    mr_buf_adds(&head, "<tool_call>\n{\"name\": ");
    mr_buf_adds(&head, quoted);
    mr_buf_adds(&head, ", \"arguments\": ");
    if (mr_gbnf_literal(&body, head.p, head.len, err)) {
        mr_err_wrap(err, "tools[%zu] (%s)", i, name);
        goto out;
    }
    mr_buf_printf(&body, " %s ", rule);
    if (mr_gbnf_literal(&body, "}\n</tool_call>", 14, err) || add_call(g, i, body.p, alts, err))
        goto out;
    rc = 0;
out:
    free(quoted);
    mr_buf_free(&head);
    mr_buf_free(&body);
    return rc;
}

/* ---- qwen3_xml ----
 *
 * <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
 *
 * The reply parser (gateway/chatout.c) reads VALUE by the parameter's
 * declared type: text for a string, else the JSON it spells ("null" is null
 * for every type).  So a string's VALUE is raw text, which must not hold
 * "</" (the parser looks for the closing tags) nor be "null" in any case
 * unless null is allowed; the other types' VALUE is their schema's JSON. */

/* Raw text without "</" (nor NUL, which no request can hold): runs of '<'
 * are followed by another character or end the text.  xml-string is such
 * text that is not "null" in any case: xml-text-X is xml-text that does
 * not start with X, xml-text-1 one that is not empty. */
static const struct {
    const char *name, *body;
} xml_text_rules[] = {
    {"xml-text", "( [^<\\x00] | \"<\"+ [^</\\x00] )* \"<\"*"},
    {"xml-text-n", "\"\" | [^<nN\\x00] xml-text | \"<\"+ [^</\\x00] xml-text | \"<\"+"},
    {"xml-text-u", "\"\" | [^<uU\\x00] xml-text | \"<\"+ [^</\\x00] xml-text | \"<\"+"},
    {"xml-text-l", "\"\" | [^<lL\\x00] xml-text | \"<\"+ [^</\\x00] xml-text | \"<\"+"},
    {"xml-text-1", "[^<\\x00] xml-text | \"<\"+ [^</\\x00] xml-text | \"<\"+"},
    {"xml-string", "xml-text-n | [nN] ( xml-text-u | [uU] ( xml-text-l | [lL] ( xml-text-l | [lL] xml-text-1 ) ) )"},
};

static bool is_key(const char *k, const char *const *keys)
{
    for (; *keys; keys++)
        if (!strcmp(k, *keys))
            return true;
    return false;
}

/* The declared type of a parameter the way the reply parser reads it: one
 * type, or one type and "null".  NULL: neither (refused). */
static const char *xml_type(const json_t *ps, bool *nullable)
{
    json_t *ty = json_object_get(ps, "type");
    *nullable = false;
    if (json_is_string(ty))
        return json_string_value(ty);
    const char *one = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(ty, i, e)
    {
        const char *t = json_string_value(e);
        if (!t)
            return NULL;
        if (!strcmp(t, "null"))
            *nullable = true;
        else if (one)
            return NULL;
        else
            one = t;
    }
    return one;
}

/* A text value of a string parameter: only an enum / const of strings
 * constrains it (other string keywords have no raw-text grammar here). */
static int xml_string_value(const json_t *ps, bool nullable, const char *where, mr_buf *body, mr_err *err)
{
    static const char *const fine[] = {"type", "enum", "const", "title", "description", "default", "examples",
                                       "$comment", "deprecated", "readOnly", "writeOnly", NULL};
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)ps, k, v)
    {
        if (!is_key(k, fine) && strncmp(k, "x-", 2))
            return mr_errf(err, "%s: keyword \"%s\" has no grammar for a string in the qwen3_xml format", where, k);
    }
    json_t *en = json_object_get(ps, "enum"), *cn = json_object_get(ps, "const");
    if (!en && !cn) {
        mr_buf_adds(body, nullable ? "xml-text" : "xml-string");
        return 0;
    }
    json_t *vals = cn ? json_pack("[O]", cn) : json_incref(en);
    size_t i, n = 0;
    json_array_foreach(vals, i, v)
    {
        const char *sv = json_string_value(v);
        bool null_text = json_is_string(v) && json_string_length(v) == 4 && !strncasecmp(sv, "null", 4);
        if (json_is_null(v) && nullable) {
            mr_buf_adds(body, n++ ? " | \"null\"" : "\"null\"");
            continue;
        }
        if (!sv || strstr(sv, "</") || null_text || memchr(sv, 0, json_string_length(v))) {
            json_decref(vals);
            return mr_errf(err, "%s: enum value %zu cannot be written as text in the qwen3_xml format", where, i);
        }
        mr_buf_adds(body, n++ ? " | " : "");
        if (mr_gbnf_literal(body, sv, json_string_length(v), err)) {
            json_decref(vals);
            return -1;
        }
    }
    json_decref(vals);
    if (!n)
        return mr_errf(err, "%s: an empty enum", where);
    return 0;
}

/* <parameter=P>\nVALUE\n</parameter>\n for property P of tool i. */
static int xml_param(mr_jsgram *g, size_t i, size_t k, const char *pname, const json_t *ps, mr_buf *out,
                     mr_err *err)
{
    char where[96], rule[48];
    snprintf(where, sizeof where, "tools[%zu].function.parameters.properties.%s", i, pname);
    if (!*pname || strpbrk(pname, "<>\n"))
        return mr_errf(err, "%s: a parameter name with '<', '>' or a newline has no qwen3_xml form", where);
    bool nullable;
    const char *type = xml_type(ps, &nullable);
    json_t *en = json_object_get(ps, "enum");
    bool text = type ? !strcmp(type, "string") : (!json_object_get(ps, "type") && (en || json_object_get(ps, "const")));
    mr_buf value = {0};
    int rc = -1;
    if (text) {
        if (xml_string_value(ps, nullable, where, &value, err))
            goto out;
    } else if (type && (!strcmp(type, "integer") || !strcmp(type, "number") || !strcmp(type, "boolean") ||
                        !strcmp(type, "object") || !strcmp(type, "array"))) {
        snprintf(rule, sizeof rule, "xv-%zu-%zu", i, k);
        if (mr_jsgram_add_schema(g, rule, ps, where, err))
            goto out;
        mr_buf_adds(&value, rule);
    } else {
        mr_errf(err, "%s: only one type (and null) per parameter has a qwen3_xml grammar", where);
        goto out;
    }
    mr_buf head = {0};
    mr_buf_printf(&head, "<parameter=%s>\n", pname);
    rc = mr_gbnf_literal(out, head.p, head.len, err);
    mr_buf_free(&head);
    if (!rc) {
        mr_buf_printf(out, " ( %s ) ", value.p);
        rc = mr_gbnf_literal(out, "\n</parameter>\n", 14, err);
    }
out:
    mr_buf_free(&value);
    return rc;
}

static bool in_required(const json_t *req, const char *name)
{
    size_t i;
    json_t *e;
    json_array_foreach((json_t *)req, i, e)
    {
        if (json_is_string(e) && !strcmp(json_string_value(e), name))
            return true;
    }
    return false;
}

/* call-I for the XML form: the parameters in the order "properties" lists
 * them, the required ones always, the others optional. */
static int xml_call(mr_jsgram *g, size_t i, const json_t *fn, mr_buf *alts, mr_err *err)
{
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *params = json_object_get(fn, "parameters");
    json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    if (strpbrk(name, "<>\n"))
        return mr_errf(err, "tools[%zu]: a function name with '<', '>' or a newline has no qwen3_xml form", i);
    size_t r;
    json_t *e;
    json_array_foreach(req, r, e)
    {
        if (!json_is_string(e) || !json_object_get(props, json_string_value(e)))
            return mr_errf(err, "tools[%zu].function.parameters.required[%zu] is not one of its properties", i, r);
    }
    mr_buf body = {0}, head = {0};
    int rc = -1;
    mr_buf_printf(&head, "<tool_call>\n<function=%s>\n", name);
    if (mr_gbnf_literal(&body, head.p, head.len, err))
        goto out;
    const char *pname;
    json_t *ps;
    size_t k = 0;
    json_object_foreach(props, pname, ps)
    {
        bool must = in_required(req, pname);
        mr_buf_adds(&body, must ? " " : " ( ");
        if (xml_param(g, i, k++, pname, ps, &body, err))
            goto out;
        mr_buf_adds(&body, must ? "" : " )?");
    }
    mr_buf_adds(&body, " ");
    if (mr_gbnf_literal(&body, "</function>\n</tool_call>", 24, err) || add_call(g, i, body.p, alts, err))
        goto out;
    rc = 0;
out:
    mr_buf_free(&head);
    mr_buf_free(&body);
    return rc;
}

/* The shared raw-text rules, added once. */
static int add_xml_text_rules(mr_jsgram *g, mr_err *err)
{
    for (size_t i = 0; i < sizeof xml_text_rules / sizeof xml_text_rules[0]; i++)
        if (mr_jsgram_add_rule(g, xml_text_rules[i].name, xml_text_rules[i].body, err))
            return -1;
    return 0;
}

int mr_tool_grammar(mr_tool_format fmt, const json_t *tools, const char *only, bool parallel, char **text,
                    size_t *len, mr_err *err)
{
    *text = NULL;
    if (fmt != MR_TOOLS_HERMES && fmt != MR_TOOLS_QWEN_XML)
        return mr_errf(err, "this model has no tool-call format: only \"auto\" and \"none\" work with it");
    mr_jsgram *g = mr_jsgram_new();
    mr_buf alts = {0};
    int rc = -1;
    if (!g) {
        mr_errf(err, "out of memory");
        return -1;
    }
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (only && strcmp(name, only))
            continue;
        if (fmt == MR_TOOLS_HERMES ? hermes_call(g, i, fn, &alts, err) : xml_call(g, i, fn, &alts, err))
            goto out;
    }
    if (fmt == MR_TOOLS_QWEN_XML && add_xml_text_rules(g, err))
        goto out;
    if (!alts.len) {
        mr_errf(err, "no tool to call");
        goto out;
    }
    if (mr_jsgram_add_rule(g, "call", alts.p, err) ||
        mr_jsgram_add_rule(g, "root", parallel ? "call ( \"\\n\" call )*" : "call", err) ||
        mr_jsgram_finish(g, text, len, err))
        goto out;
    rc = 0;
out:
    mr_buf_free(&alts);
    mr_jsgram_free(g);
    return rc;
}

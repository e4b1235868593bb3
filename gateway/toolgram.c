/* Tool-call grammars (gateway/toolgram.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/jsonschema.h"
#include "gateway/toolgram.h"

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
    if (mr_gbnf_literal(&body, "}\n</tool_call>", 14, err))
        goto out;
    snprintf(rule, sizeof rule, "call-%zu", i);
    if (mr_jsgram_add_rule(g, rule, body.p, err))
        goto out;
    mr_buf_printf(alts, "%s%s", alts->len ? " | " : "", rule);
    rc = 0;
out:
    free(quoted);
    mr_buf_free(&head);
    mr_buf_free(&body);
    return rc;
}

int mr_tool_grammar(mr_tool_format fmt, const json_t *tools, const char *only, bool parallel, char **text,
                    size_t *len, mr_err *err)
{
    *text = NULL;
    if (fmt != MR_TOOLS_HERMES)
        return mr_errf(err, "this model's tool-call format (%s) has no grammar here: only \"auto\" and \"none\" "
                            "work with it",
                       fmt == MR_TOOLS_QWEN_XML ? "qwen3_xml" : "none");
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
        if (hermes_call(g, i, fn, &alts, err))
            goto out;
    }
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

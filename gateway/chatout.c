#include "gateway/chatout.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>";
static const char CALL_CLOSE[] = "</tool_call>";
#define LIT_LEN(s) (sizeof(s) - 1)

enum { S_OPEN, S_THINK, S_CONTENT, S_CALL };

/* ---------- the model's format ---------- */

static bool has(const char *tmpl, const char *marker) { return tmpl && strstr(tmpl, marker); }

int mr_chat_format_resolve(const char *tmpl, const char *reasoning, const char *tools, mr_chat_format *f,
                           mr_err *err)
{
    memset(f, 0, sizeof *f);
    if (!reasoning || !strcmp(reasoning, "auto"))
        f->think = has(tmpl, THINK_CLOSE);
    else if (!strcmp(reasoning, "think"))
        f->think = true;
    else if (strcmp(reasoning, "none"))
        return mr_errf(err, "reasoning_parser \"%s\" is not one of auto, think, none", reasoning);
    if (!tools || !strcmp(tools, "auto")) {
        /* Qwen3-Coder and Qwen3.5/3.6 teach <function=...> inside <tool_call>;
         * Qwen2.5/Qwen3 a JSON object ("hermes") */
        if (has(tmpl, CALL_OPEN))
            f->tools = has(tmpl, "<function=") ? MR_TOOLS_QWEN_XML : MR_TOOLS_HERMES;
    } else if (!strcmp(tools, "hermes")) {
        f->tools = MR_TOOLS_HERMES;
    } else if (!strcmp(tools, "qwen3_xml")) {
        f->tools = MR_TOOLS_QWEN_XML;
    } else if (strcmp(tools, "none")) {
        return mr_errf(err, "tool_parser \"%s\" is not one of auto, hermes, qwen3_xml, none", tools);
    }
    return 0;
}

bool mr_chat_prompt_opens_think(const mr_chat_format *f, const char *prompt, size_t len)
{
    if (!f->think || !prompt)
        return false;
    while (len && isspace((unsigned char)prompt[len - 1]))
        len--;
    return len >= LIT_LEN(THINK_OPEN) && !memcmp(prompt + len - LIT_LEN(THINK_OPEN), THINK_OPEN, LIT_LEN(THINK_OPEN));
}

/* ---------- one tool call ---------- */

static bool all_space(const char *s, const char *e)
{
    for (; s < e; s++)
        if (!isspace((unsigned char)*s))
            return false;
    return true;
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && isspace((unsigned char)**s))
        (*s)++;
    while (*e > *s && isspace((unsigned char)(*e)[-1]))
        (*e)--;
}

/* The arguments' JSON text with each number written as short as reads back
 * the same (jansson's default precision, 17 digits, turns 48.85 into
 * 48.850000000000001). */
static char *args_text(const json_t *args)
{
    for (int prec = 15; prec <= 17; prec++) {
        char *text = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(prec));
        json_t *back = text && prec < 17 ? json_loads(text, 0, NULL) : NULL;
        bool same = prec == 17 || json_equal(back, (json_t *)args);
        json_decref(back);
        if (same || !text)
            return text;
        free(text);
    }
    return NULL;
}

static json_t *call_json(const char *name, size_t name_len, json_t *args)
{
    char *text = args_text(args);
    json_t *call = text ? json_pack("{s:s%, s:s}", "name", name, name_len, "arguments", text) : NULL;
    free(text);
    return call;
}

/* {"name": "f", "arguments": {...}}; arguments may also be a string
 * holding a JSON object (passed on as it is) or absent ({}).  Arguments
 * that are not an object are not a call: clients parse them as one. */
static json_t *parse_hermes(const char *s, size_t n)
{
    json_t *o = json_loadb(s, n, 0, NULL);
    const char *name = json_string_value(json_object_get(o, "name"));
    json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    json_t *call = NULL;
    if (!name || !*name) {
        /* not a call */
    } else if (json_is_string(args)) {
        json_t *inner = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (json_is_object(inner))
            call = json_pack("{s:s, s:s%}", "name", name, "arguments", json_string_value(args),
                             json_string_length(args));
        json_decref(inner);
    } else if (!args || json_is_object(args)) {
        json_t *empty = args ? NULL : json_object();
        call = call_json(name, strlen(name), args ? args : empty);
        json_decref(empty);
    }
    json_decref(o);
    return call;
}

/* The declared JSON type of parameter param of function fn in the
 * request's tools (NULL when it is not declared). */
static const char *param_type(const json_t *tools, const char *fn, const char *param)
{
    size_t i;
    json_t *t;
    json_array_foreach((json_t *)tools, i, t)
    {
        json_t *f = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name || strcmp(name, fn))
            continue;
        json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
        json_t *ty = json_object_get(json_object_get(props, param), "type");
        if (json_is_string(ty))
            return json_string_value(ty);
        size_t k;
        json_t *e;
        json_array_foreach(ty, k, e)
        {
            if (json_is_string(e) && strcmp(json_string_value(e), "null"))
                return json_string_value(e);
        }
        return NULL;
    }
    return NULL;
}

static bool is_one_of(const char *type, const char *const *names)
{
    for (; *names; names++)
        if (!strcmp(type, *names))
            return true;
    return false;
}

/* A parameter's text as the JSON value its declared type says; text that
 * does not read as that type stays a string (as the model wrote it). */
static json_t *xml_value(const char *v, size_t n, const char *type)
{
    static const char *const ints[] = {"integer", "int", NULL};
    static const char *const nums[] = {"number", "float", "double", NULL};
    static const char *const bools[] = {"boolean", "bool", NULL};
    static const char *const structs[] = {"object", "array", NULL};
    if (n == 4 && !strncasecmp(v, "null", 4))
        return json_null();
    if (type && n && n < 64 && (is_one_of(type, ints) || is_one_of(type, nums))) {
        char num[64];
        const char *s = v, *e = v + n;
        trim(&s, &e);
        memcpy(num, s, (size_t)(e - s));
        num[e - s] = 0;
        char *end;
        long long i = strtoll(num, &end, 10);
        if (*num && !*end)
            return json_integer(i);
        double d = strtod(num, &end);
        if (*num && !*end && isfinite(d) && is_one_of(type, nums))
            return json_real(d);
    } else if (type && is_one_of(type, bools)) {
        const char *s = v, *e = v + n;
        trim(&s, &e);
        if (e - s == 4 && !strncasecmp(s, "true", 4))
            return json_true();
        if (e - s == 5 && !strncasecmp(s, "false", 5))
            return json_false();
    } else if (type && is_one_of(type, structs)) {
        json_t *j = json_loadb(v, n, 0, NULL);
        if (j && (json_is_object(j) ? !strcmp(type, "object") : !strcmp(type, "array")))
            return j;
        json_decref(j);
    }
    return json_stringn(v, n);
}

/* <function=NAME>
 * <parameter=P>
 * value (may span lines)
 * </parameter>
 * </function>
 * One newline right after the parameter tag and one right before its
 * closing tag belong to the layout, not to the value. */
static json_t *parse_xml(const char *s, size_t n, const json_t *tools)
{
    const char *end = s + n;
    const char *f = memmem(s, n, "<function=", 10);
    if (!f || !all_space(s, f))
        return NULL;
    const char *nm = f + 10, *gt = memchr(nm, '>', (size_t)(end - nm));
    if (!gt)
        return NULL;
    const char *ne = gt;
    trim(&nm, &ne);
    if (nm == ne)
        return NULL;
    char *name = strndup(nm, (size_t)(ne - nm));
    const char *body = gt + 1;
    const char *fend = memmem(body, (size_t)(end - body), "</function>", 11);
    if (fend && !all_space(fend + 11, end))
        fend = NULL, body = NULL; /* text after the function: not a call */
    else if (!fend)
        fend = end; /* a missing </function> is forgiven */
    json_t *args = body && name ? json_object() : NULL;
    const char *p = body;
    while (args) {
        const char *ps = memmem(p, (size_t)(fend - p), "<parameter=", 11);
        if (!ps) {
            if (!all_space(p, fend))
                json_decref(args), args = NULL;
            break;
        }
        const char *pn = ps + 11, *pg = memchr(pn, '>', (size_t)(fend - pn));
        if (!all_space(p, ps) || !pg) {
            json_decref(args), args = NULL;
            break;
        }
        const char *pe = pg;
        trim(&pn, &pe);
        const char *vs = pg + 1;
        const char *ve = memmem(vs, (size_t)(fend - vs), "</parameter>", 12);
        const char *next = ve ? ve + 12 : NULL;
        if (!ve) { /* unclosed: the value runs to the next parameter */
            ve = memmem(vs, (size_t)(fend - vs), "<parameter=", 11);
            if (!ve)
                ve = fend;
            next = ve;
        }
        if (vs < ve && *vs == '\n')
            vs++;
        if (ve > vs && ve[-1] == '\n')
            ve--;
        char *pname = strndup(pn, (size_t)(pe - pn));
        json_t *v = pname && *pname ? xml_value(vs, (size_t)(ve - vs), param_type(tools, name, pname)) : NULL;
        if (!v || json_object_set_new(args, pname, v))
            json_decref(args), args = NULL;
        free(pname);
        p = next;
    }
    json_t *call = args ? call_json(name, strlen(name), args) : NULL;
    json_decref(args);
    free(name);
    return call;
}

json_t *mr_tool_call_parse(mr_tool_format fmt, const char *s, size_t n, const json_t *tools)
{
    switch (fmt) {
    case MR_TOOLS_HERMES: return parse_hermes(s, n);
    case MR_TOOLS_QWEN_XML: return parse_xml(s, n, tools);
    default: return NULL;
    }
}

/* ---------- events ---------- */

static mr_co_event *ev_new(mr_co_events *e, mr_co_kind kind)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 4;
        mr_co_event *v = realloc(e->v, cap * sizeof *v);
        if (!v)
            abort(); /* out of memory in the gateway, as mr_buf */
        memset(v + e->cap, 0, (cap - e->cap) * sizeof *v);
        e->v = v;
        e->cap = cap;
    }
    mr_co_event *ev = &e->v[e->n++];
    ev->kind = kind;
    mr_buf_clear(&ev->text);
    ev->call = NULL;
    return ev;
}

static void ev_text(mr_co_events *e, mr_co_kind kind, const char *s, size_t n)
{
    if (!n)
        return;
    mr_co_event *ev = e->n && e->v[e->n - 1].kind == kind ? &e->v[e->n - 1] : ev_new(e, kind);
    mr_buf_add(&ev->text, s, n);
}

void mr_co_events_clear(mr_co_events *e)
{
    for (size_t i = 0; i < e->n; i++) {
        json_decref(e->v[i].call);
        e->v[i].call = NULL;
        mr_buf_clear(&e->v[i].text);
    }
    e->n = 0;
}

void mr_co_events_free(mr_co_events *e)
{
    mr_co_events_clear(e);
    for (size_t i = 0; i < e->cap; i++)
        mr_buf_free(&e->v[i].text);
    free(e->v);
    memset(e, 0, sizeof *e);
}

/* ---------- the stream ---------- */

void mr_chatout_init(mr_chatout *c, const mr_chat_format *f, bool in_think, json_t *tools, bool parallel,
                     bool include_reasoning)
{
    memset(c, 0, sizeof *c);
    c->fmt = *f;
    if (f->tools != MR_TOOLS_NONE && tools)
        c->tools = json_incref(tools);
    c->parallel = parallel;
    c->reasoning = include_reasoning;
    if (in_think) {
        c->state = S_THINK;
        c->strip_nl = true;
    } else {
        c->state = f->think ? S_OPEN : S_CONTENT;
    }
}

void mr_chatout_free(mr_chatout *c)
{
    json_decref(c->tools);
    mr_buf_free(&c->pending);
    mr_buf_free(&c->gap);
    memset(c, 0, sizeof *c);
}

static void think_text(mr_chatout *c, mr_co_events *ev, const char *s, size_t n)
{
    if (c->reasoning)
        ev_text(ev, MR_CO_REASONING, s, n);
}

/* Drops what starts pending and strip_nl / strip_ws say to drop; false
 * when nothing is left to look at. */
static bool strip_start(mr_chatout *c)
{
    size_t i = 0;
    const char *s = c->pending.p;
    if (c->strip_ws)
        while (i < c->pending.len && isspace((unsigned char)s[i]))
            i++;
    else if (c->strip_nl)
        while (i < c->pending.len && (s[i] == '\n' || s[i] == '\r'))
            i++;
    mr_buf_consume(&c->pending, i);
    if (!c->pending.len)
        return false;
    c->strip_nl = c->strip_ws = false;
    return true;
}

/* A call's text that is not a call goes to the client as it was written,
 * with the whitespace that came before it. */
static void call_as_text(mr_chatout *c, mr_co_events *ev, const char *s, size_t n, bool closed)
{
    ev_text(ev, MR_CO_CONTENT, c->gap.p, c->gap.len);
    ev_text(ev, MR_CO_CONTENT, CALL_OPEN, LIT_LEN(CALL_OPEN));
    ev_text(ev, MR_CO_CONTENT, s, n);
    if (closed)
        ev_text(ev, MR_CO_CONTENT, CALL_CLOSE, LIT_LEN(CALL_CLOSE));
}

/* One tool call's text, complete: a call event, or the text as content
 * when it does not parse (the client then sees what the model wrote). */
static void call_done(mr_chatout *c, mr_co_events *ev, const char *s, size_t n)
{
    json_t *call = mr_tool_call_parse(c->fmt.tools, s, n, c->tools);
    if (call) {
        if (c->parallel || c->n_calls == 0)
            ev_new(ev, MR_CO_TOOL)->call = call;
        else
            json_decref(call);
        c->n_calls++;
        c->strip_ws = true; /* the whitespace between calls is layout too */
    } else {
        call_as_text(c, ev, s, n, true);
    }
    mr_buf_clear(&c->gap);
}

static void run(mr_chatout *c, mr_co_events *ev, bool final)
{
    for (;;) {
        if ((c->strip_nl || c->strip_ws) && !strip_start(c))
            return;
        const char *s = c->pending.p;
        size_t n = c->pending.len;
        if (!n)
            return;
        const char *hit;
        size_t hold;
        switch (c->state) {
        case S_OPEN: { /* a reply may start with <think> (Qwen3 writes it itself) */
            size_t i = 0;
            while (i < n && isspace((unsigned char)s[i]))
                i++;
            size_t m = n - i < LIT_LEN(THINK_OPEN) ? n - i : LIT_LEN(THINK_OPEN);
            if (memcmp(s + i, THINK_OPEN, m)) {
                c->state = S_CONTENT;
            } else if (m == LIT_LEN(THINK_OPEN)) {
                mr_buf_consume(&c->pending, i + m);
                c->state = S_THINK;
                c->strip_nl = true;
            } else if (final) {
                c->state = S_CONTENT;
            } else {
                return; /* still could be <think> */
            }
            break;
        }
        case S_THINK:
            if ((hit = memmem(s, n, THINK_CLOSE, LIT_LEN(THINK_CLOSE)))) {
                size_t k = (size_t)(hit - s), r = k;
                while (r && (s[r - 1] == '\n' || s[r - 1] == '\r'))
                    r--;
                think_text(c, ev, s, r);
                mr_buf_consume(&c->pending, k + LIT_LEN(THINK_CLOSE));
                c->state = S_CONTENT;
                c->strip_nl = true;
                break;
            }
            /* the newlines that end the reasoning are the template's, as
             * is what could still become </think>: both wait */
            hold = final ? 0 : mr_partial_marker(s, n, THINK_CLOSE, LIT_LEN(THINK_CLOSE));
            while (n - hold > 0 && (s[n - hold - 1] == '\n' || s[n - hold - 1] == '\r'))
                hold++;
            think_text(c, ev, s, n - hold);
            mr_buf_consume(&c->pending, final ? n : n - hold);
            return;
        case S_CONTENT:
            if (c->tools && (hit = memmem(s, n, CALL_OPEN, LIT_LEN(CALL_OPEN)))) {
                /* the whitespace before a call is layout, not content */
                size_t k = (size_t)(hit - s), r = k;
                while (r && isspace((unsigned char)s[r - 1]))
                    r--;
                ev_text(ev, MR_CO_CONTENT, s, r);
                mr_buf_clear(&c->gap);
                mr_buf_add(&c->gap, s + r, k - r);
                mr_buf_consume(&c->pending, k + LIT_LEN(CALL_OPEN));
                c->state = S_CALL;
                break;
            }
            hold = 0;
            if (c->tools && !final) {
                hold = mr_partial_marker(s, n, CALL_OPEN, LIT_LEN(CALL_OPEN));
                while (n - hold > 0 && isspace((unsigned char)s[n - hold - 1]))
                    hold++;
            }
            ev_text(ev, MR_CO_CONTENT, s, n - hold);
            mr_buf_consume(&c->pending, n - hold);
            return;
        case S_CALL: {
            /* a call's text waits whole: search only what came since the
             * last look (a long call must not cost quadratic time) */
            size_t from = c->scanned >= LIT_LEN(CALL_CLOSE) ? c->scanned - (LIT_LEN(CALL_CLOSE) - 1) : 0;
            if ((hit = memmem(s + from, n - from, CALL_CLOSE, LIT_LEN(CALL_CLOSE)))) {
                size_t k = (size_t)(hit - s);
                c->scanned = 0;
                call_done(c, ev, s, k);
                mr_buf_consume(&c->pending, k + LIT_LEN(CALL_CLOSE));
                c->state = S_CONTENT;
                break;
            }
            c->scanned = n;
            if (final) { /* cut off inside a call: the client sees the text */
                call_as_text(c, ev, s, n, false);
                mr_buf_consume(&c->pending, n);
                c->scanned = 0;
            }
            return;
        }
        }
    }
}

void mr_chatout_push(mr_chatout *c, const char *s, size_t n, mr_co_events *ev)
{
    mr_buf_add(&c->pending, s, n);
    run(c, ev, false);
}

void mr_chatout_finish(mr_chatout *c, mr_co_events *ev)
{
    run(c, ev, true);
    mr_buf_consume(&c->pending, c->pending.len);
}

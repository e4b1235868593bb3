#include "gateway/openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "gateway/jsonschema.h"

const char *mr_oai_error_type(int status)
{
    switch (status) {
    case 401:
    case 403: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

int mr_oai_err(mr_oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *mr_oai_error_json(const mr_oai_error *e)
{
    mr_buf clean = {0};
    mr_gw_utf8_sanitize(&clean, e->message, strlen(e->message));
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", clean.p ? clean.p : "", "type",
                          mr_oai_error_type(e->status), "param", e->param[0] ? json_string(e->param) : json_null(),
                          "code", e->code[0] ? json_string(e->code) : json_null());
    mr_buf_free(&clean);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

char *mr_oai_error_json_simple(int status, const char *message)
{
    mr_oai_error e;
    mr_oai_err(&e, status, NULL, NULL, "%s", message);
    return mr_oai_error_json(&e);
}

void mr_oai_req_free(mr_oai_req *r)
{
    json_decref(r->root);
    free(r->prompt_ids);
    free(r->grammar);
    memset(r, 0, sizeof *r);
}

/* A number field within [lo, hi] (open ends when lo_open / hi_open). */
static int num_field(json_t *o, const char *k, double lo, double hi, bool lo_open, float *dst, mr_oai_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return mr_oai_err(e, 400, k, NULL, "'%s' must be a number", k);
    double x = json_number_value(v);
    /* the bounds hold for the float the sampler gets: a tiny positive double
     * (top_p 1e-50) is 0 as a float */
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo) || (lo_open && (float)x <= lo))
        return mr_oai_err(e, 400, k, NULL, "'%s' must be %s %g and <= %g, got %g", k, lo_open ? ">" : ">=", lo, hi,
                          x);
    *dst = (float)x;
    return 0;
}

static int int_field(json_t *o, const char *k, long long lo, long long hi, bool *present, long long *dst,
                     mr_oai_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    /* 3.0 is accepted as an integer (JSON has one number type) */
    long long x;
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else
        return mr_oai_err(e, 400, k, NULL, "'%s' must be an integer", k);
    if (x < lo || x > hi)
        return mr_oai_err(e, 400, k, NULL, "'%s' must be between %lld and %lld, got %lld", k, lo, hi, x);
    if (present)
        *present = true;
    *dst = x;
    return 0;
}

static int str_field(json_t *o, const char *k, size_t max, const char **dst, mr_oai_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return mr_oai_err(e, 400, k, NULL, "'%s' must be a string", k);
    if (json_string_length(v) > max)
        return mr_oai_err(e, 400, k, NULL, "'%s' is longer than %zu bytes", k, max);
    *dst = json_string_value(v);
    return 0;
}

/* An assistant message's tool_calls: [{"id"?, "type"?: "function",
 * "function": {"name", "arguments": a string of JSON or an object}}]. */
static int parse_tool_calls(json_t *m, size_t i, const char *role, mr_oai_error *e)
{
    json_t *calls = json_object_get(m, "tool_calls");
    if (!calls || json_is_null(calls))
        return 0;
    if (strcmp(role, "assistant"))
        return mr_oai_err(e, 400, "messages", NULL, "messages[%zu].tool_calls: only assistant messages have tool calls",
                          i);
    if (!json_is_array(calls))
        return mr_oai_err(e, 400, "messages", NULL, "messages[%zu].tool_calls must be an array", i);
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c)
    {
        json_t *fn = json_object_get(c, "function");
        json_t *type = json_object_get(c, "type");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_object(c) || (type && !json_is_null(type) && !json_is_string(type)) || !json_is_object(fn) ||
            !json_is_string(json_object_get(fn, "name")) ||
            (args && !json_is_null(args) && !json_is_string(args) && !json_is_object(args)))
            return mr_oai_err(e, 400, "messages", NULL,
                              "messages[%zu].tool_calls[%zu] must be {\"type\":\"function\",\"function\":{\"name\":"
                              "string,\"arguments\":string or object}}",
                              i, k);
    }
    return 0;
}

static json_t *find_tool(json_t *tools, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), name))
            return t;
    }
    return NULL;
}

/* tools: [{"type": "function", "function": {"name", "description"?,
 * "parameters"?: object}}]; tool_choice "auto" (the default), "none",
 * "required" or a named function (the last two are kept by a grammar made
 * for the model's tool-call format, gateway/jobs.c). */
static int parse_tools(json_t *o, mr_oai_req *r, mr_oai_error *e)
{
    json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return mr_oai_err(e, 400, "tools", NULL, "'tools' must be an array");
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t)
        {
            json_t *fn = json_object_get(t, "function");
            const char *type = json_string_value(json_object_get(t, "type"));
            const char *name = json_string_value(json_object_get(fn, "name"));
            json_t *params = json_object_get(fn, "parameters");
            if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn) || !name || !*name ||
                (params && !json_is_null(params) && !json_is_object(params)))
                return mr_oai_err(e, 400, "tools", NULL,
                                  "tools[%zu] must be {\"type\":\"function\",\"function\":{\"name\":non-empty string,"
                                  "\"parameters\":object}}",
                                  i);
        }
        if (json_array_size(tools))
            r->tools = tools;
    }
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *s = json_string_value(tc);
        json_t *fn = json_object_get(tc, "function");
        const char *type = json_string_value(json_object_get(tc, "type"));
        if (s && !strcmp(s, "none")) {
            r->tools = NULL;
        } else if (s && !strcmp(s, "required")) {
            r->tool_choice = MR_TOOL_CHOICE_REQUIRED;
        } else if (json_is_object(tc) && type && !strcmp(type, "function") &&
                   json_is_string(json_object_get(fn, "name"))) {
            r->tool_choice = MR_TOOL_CHOICE_NAMED;
            r->tool_name = json_string_value(json_object_get(fn, "name"));
        } else if (!s || strcmp(s, "auto")) {
            return mr_oai_err(e, 400, "tool_choice", NULL,
                              "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                              "{\"type\":\"function\",\"function\":{\"name\":...}}");
        }
        if (r->tool_choice != MR_TOOL_CHOICE_AUTO && !r->tools)
            return mr_oai_err(e, 400, "tool_choice", NULL, "'tool_choice' %s needs 'tools'",
                              r->tool_choice == MR_TOOL_CHOICE_REQUIRED ? "\"required\"" : "naming a function");
        if (r->tool_choice == MR_TOOL_CHOICE_NAMED && !find_tool(r->tools, r->tool_name))
            return mr_oai_err(e, 400, "tool_choice", NULL, "'tool_choice' names '%s', which is not in 'tools'",
                              r->tool_name);
    }
    json_t *ptc = json_object_get(o, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
        return mr_oai_err(e, 400, "parallel_tool_calls", NULL, "'parallel_tool_calls' must be a boolean");
    r->parallel_tool_calls = !json_is_false(ptc);
    json_t *ir = json_object_get(o, "include_reasoning");
    if (ir && !json_is_null(ir) && !json_is_boolean(ir))
        return mr_oai_err(e, 400, "include_reasoning", NULL, "'include_reasoning' must be a boolean");
    r->include_reasoning = !json_is_false(ir);
    json_t *re = json_object_get(o, "reasoning_effort");
    if (re && !json_is_null(re)) {
        static const char *const levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        const char *s = json_string_value(re);
        size_t i = 0;
        while (s && i < sizeof levels / sizeof levels[0] && strcmp(s, levels[i]))
            i++;
        if (!s || i == sizeof levels / sizeof levels[0])
            return mr_oai_err(e, 400, "reasoning_effort", NULL,
                              "'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh");
    }
    return 0;
}

/* The grammar from `response_format` json_object / json_schema (OpenAI) or
 * `grammar` (GBNF text, as llama-server's field), compiled once here so
 * that a bad one is a 400 naming the field (the worker compiles it again:
 * it reads the wire). */
static int parse_format(json_t *o, mr_oai_req *r, mr_oai_error *e)
{
    mr_err err;
    size_t len = 0;
    json_t *rf = json_object_get(o, "response_format");
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (rf && !json_is_null(rf) && (!json_is_object(rf) || !type))
        return mr_oai_err(e, 400, "response_format", NULL, "'response_format' must be {\"type\": ...}");
    if (type && !strcmp(type, "json_object")) {
        if (mr_json_object_grammar(&r->grammar, &len, &err))
            return mr_oai_err(e, 500, "response_format", NULL, "%s", err.msg);
        r->grammar_param = "response_format";
    } else if (type && !strcmp(type, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        json_t *schema = json_object_get(js, "schema");
        json_t *strict = json_object_get(js, "strict");
        if (!json_is_object(js) || (schema && !json_is_object(schema) && !json_is_boolean(schema)) ||
            (strict && !json_is_null(strict) && !json_is_boolean(strict)))
            return mr_oai_err(e, 400, "response_format", NULL,
                              "'response_format' json_schema must be {\"type\":\"json_schema\",\"json_schema\":"
                              "{\"name\":string,\"schema\":object,\"strict\":boolean}}");
        /* no schema: any JSON value (OpenAI's "schema" is optional) */
        int rc = schema ? mr_json_schema_grammar(schema, "response_format.json_schema.schema", &r->grammar, &len, &err)
                        : mr_json_value_grammar(&r->grammar, &len, &err);
        if (rc)
            return mr_oai_err(e, 400, "response_format", NULL, "%s", err.msg);
        r->grammar_param = "response_format";
    } else if (type && strcmp(type, "text")) {
        return mr_oai_err(e, 400, "response_format", NULL,
                          "'response_format' type must be \"text\", \"json_object\" or \"json_schema\"");
    }
    json_t *g = json_object_get(o, "grammar");
    if (g && !json_is_null(g)) {
        if (!json_is_string(g) || !json_string_length(g))
            return mr_oai_err(e, 400, "grammar", NULL, "'grammar' must be a non-empty string (GBNF)");
        if (r->grammar)
            return mr_oai_err(e, 400, "grammar", NULL, "'grammar' and a JSON 'response_format' exclude each other");
        if (json_string_length(g) > MR_GRAMMAR_MAX_TEXT)
            return mr_oai_err(e, 400, "grammar", NULL, "'grammar' is longer than %u bytes", MR_GRAMMAR_MAX_TEXT);
        /* the schema-made grammars were compiled once by mr_jsgram_finish */
        mr_grammar *gr;
        if (mr_grammar_parse(json_string_value(g), json_string_length(g), &gr, &err))
            return mr_oai_err(e, 400, "grammar", NULL, "grammar: %s", err.msg);
        mr_grammar_free(gr);
        if (!(r->grammar = strdup(json_string_value(g))))
            return mr_oai_err(e, 500, NULL, NULL, "out of memory");
        r->grammar_param = "grammar";
    }
    if (r->grammar && r->tool_choice != MR_TOOL_CHOICE_AUTO)
        return mr_oai_err(e, 400, r->grammar_param, NULL,
                          "'%s' and a 'tool_choice' that forces a call exclude each other", r->grammar_param);
    return 0;
}

static int parse_messages(json_t *msgs, mr_oai_error *e)
{
    if (!msgs)
        return mr_oai_err(e, 400, "messages", NULL, "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return mr_oai_err(e, 400, "messages", NULL, "'messages' must be a non-empty array");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (!json_is_object(m))
            return mr_oai_err(e, 400, "messages", NULL, "messages[%zu] must be an object", i);
        json_t *role = json_object_get(m, "role");
        const char *rs = json_string_value(role);
        if (!rs || (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool") &&
                    strcmp(rs, "developer")))
            return mr_oai_err(e, 400, "messages", NULL,
                              "messages[%zu].role must be one of system, developer, user, assistant, tool", i);
        if (parse_tool_calls(m, i, rs, e))
            return -1;
        json_t *c = json_object_get(m, "content");
        if (!c || json_is_null(c) || json_is_string(c))
            continue;
        if (!json_is_array(c))
            return mr_oai_err(e, 400, "messages", NULL, "messages[%zu].content must be a string, an array of parts or null",
                              i);
        size_t j;
        json_t *p;
        json_array_foreach(c, j, p)
        {
            if (!json_is_object(p) || !json_is_string(json_object_get(p, "type")) ||
                strcmp(json_string_value(json_object_get(p, "type")), "text") ||
                !json_is_string(json_object_get(p, "text")))
                return mr_oai_err(e, 400, "messages", NULL,
                                  "messages[%zu].content[%zu]: only {\"type\":\"text\",\"text\":...} parts are supported",
                                  i, j);
        }
    }
    return 0;
}

static int parse_ids(json_t *arr, const char *param, uint32_t **ids, uint32_t *n, mr_oai_error *e)
{
    size_t cnt = json_array_size(arr);
    if (cnt == 0)
        return mr_oai_err(e, 400, param, NULL, "'%s' must not be empty", param);
    if (cnt > MR_MSG_MAX_TOKENS)
        return mr_oai_err(e, 400, param, NULL, "'%s' has more than %u tokens", param, MR_MSG_MAX_TOKENS);
    uint32_t *v = malloc(cnt * sizeof *v);
    if (!v)
        return mr_oai_err(e, 500, NULL, NULL, "out of memory");
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > UINT32_MAX) {
            free(v);
            return mr_oai_err(e, 400, param, NULL, "'%s' token ids must be non-negative integers", param);
        }
        v[i] = (uint32_t)json_integer_value(x);
    }
    *ids = v;
    *n = (uint32_t)cnt;
    return 0;
}

static int parse_prompt(json_t *p, mr_oai_req *r, mr_oai_error *e)
{
    if (!p || json_is_null(p))
        return mr_oai_err(e, 400, "prompt", NULL, "'prompt' is required");
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        if (!r->prompt_len)
            return mr_oai_err(e, 400, "prompt", NULL, "'prompt' must not be empty");
        return 0;
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return mr_oai_err(e, 400, "prompt", NULL,
                          "'prompt' must be a string, an array of strings, or an array of token ids");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first))
        return parse_ids(p, "prompt", &r->prompt_ids, &r->n_prompt_ids, e);
    if (json_array_size(p) > 1)
        return mr_oai_err(e, 400, "prompt", NULL, "only one prompt per request is supported (got %zu)",
                          json_array_size(p));
    if (json_is_string(first)) {
        r->prompt = json_string_value(first);
        r->prompt_len = json_string_length(first);
        if (!r->prompt_len)
            return mr_oai_err(e, 400, "prompt", NULL, "'prompt' must not be empty");
        return 0;
    }
    if (json_is_array(first))
        return parse_ids(first, "prompt", &r->prompt_ids, &r->n_prompt_ids, e);
    return mr_oai_err(e, 400, "prompt", NULL, "'prompt' must be a string, an array of strings, or an array of token ids");
}

int mr_oai_parse(const char *body, size_t len, bool chat, mr_oai_req *r, mr_oai_error *e)
{
    memset(r, 0, sizeof *r);
    r->chat = chat;
    mr_sampling_init(&r->samp);
    json_error_t je;
    /* jansson checks UTF-8 and refuses NUL bytes in strings */
    r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->root)
        return mr_oai_err(e, 400, NULL, NULL, "invalid JSON body: %s (line %d, column %d)", je.text, je.line,
                          je.column);
    json_t *o = r->root;
    if (!json_is_object(o))
        return mr_oai_err(e, 400, NULL, NULL, "the request body must be a JSON object");
    json_t *model = json_object_get(o, "model");
    if (!model)
        return mr_oai_err(e, 400, "model", NULL, "'model' is required");
    if (!json_is_string(model))
        return mr_oai_err(e, 400, "model", NULL, "'model' must be a string");
    r->model = json_string_value(model);
    if (chat) {
        r->messages = json_object_get(o, "messages");
        if (parse_messages((json_t *)r->messages, e) || parse_tools(o, r, e))
            return -1;
    } else if (parse_prompt(json_object_get(o, "prompt"), r, e))
        return -1;
    if (parse_format(o, r, e))
        return -1;

    long long v = 0;
    bool has = false;
    if (int_field(o, "max_tokens", 1, 1 << 24, &has, &v, e))
        return -1;
    if (chat && int_field(o, "max_completion_tokens", 1, 1 << 24, &has, &v, e))
        return -1;
    r->has_max_tokens = has;
    r->max_tokens = (uint32_t)v;
    if (num_field(o, "temperature", 0, 2, false, &r->samp.temperature, e) ||
        num_field(o, "top_p", 0, 1, true, &r->samp.top_p, e) || num_field(o, "min_p", 0, 1, false, &r->samp.min_p, e) ||
        num_field(o, "presence_penalty", -2, 2, false, &r->samp.presence_penalty, e) ||
        num_field(o, "frequency_penalty", -2, 2, false, &r->samp.frequency_penalty, e) ||
        num_field(o, "repetition_penalty", 0, 10, true, &r->samp.repetition_penalty, e))
        return -1;
    v = 0;
    if (int_field(o, "top_k", -1, 1 << 20, NULL, &v, e))
        return -1;
    r->samp.top_k = v < 0 ? 0 : (uint32_t)v; /* -1 means off, as in vLLM */
    has = false;
    if (int_field(o, "seed", INT64_MIN, INT64_MAX, &has, &v, e))
        return -1;
    r->samp.has_seed = has;
    r->samp.seed = (uint64_t)v;
    has = false;
    v = 1;
    if (int_field(o, "n", 1, 1, &has, &v, e)) {
        /* name the parameter and say what is supported */
        return mr_oai_err(e, 400, "n", NULL, "'n' must be 1 (only one choice per request is supported)");
    }
    json_t *bo = json_object_get(o, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == 1))
        return mr_oai_err(e, 400, "best_of", NULL, "'best_of' must be 1");

    json_t *stop = json_object_get(o, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_string(stop)) {
            if (json_string_length(stop) == 0 || json_string_length(stop) > MR_MAX_STOP_LEN)
                return mr_oai_err(e, 400, "stop", NULL, "'stop' strings must be 1..%d bytes", MR_MAX_STOP_LEN);
            r->stops[r->n_stops++] = json_string_value(stop);
        } else if (json_is_array(stop)) {
            if (json_array_size(stop) > MR_MAX_STOPS)
                return mr_oai_err(e, 400, "stop", NULL, "'stop' may hold at most %d strings", MR_MAX_STOPS);
            size_t i;
            json_t *s;
            json_array_foreach(stop, i, s)
            {
                if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > MR_MAX_STOP_LEN)
                    return mr_oai_err(e, 400, "stop", NULL, "'stop' must hold strings of 1..%d bytes",
                                      MR_MAX_STOP_LEN);
                r->stops[r->n_stops++] = json_string_value(s);
            }
        } else
            return mr_oai_err(e, 400, "stop", NULL, "'stop' must be a string or an array of strings");
    }

    json_t *lp = json_object_get(o, "logprobs");
    if (chat) {
        if (lp && !json_is_null(lp) && !json_is_boolean(lp))
            return mr_oai_err(e, 400, "logprobs", NULL, "'logprobs' must be a boolean");
        r->samp.logprobs = json_is_true(lp);
        v = 0;
        has = false;
        if (int_field(o, "top_logprobs", 0, MR_MSG_MAX_TOP_LOGPROBS, &has, &v, e))
            return -1;
        if (has && !r->samp.logprobs)
            return mr_oai_err(e, 400, "top_logprobs", NULL, "'top_logprobs' requires 'logprobs': true");
        r->samp.top_logprobs = (uint32_t)v;
    } else {
        v = 0;
        has = false;
        if (int_field(o, "logprobs", 0, 5, &has, &v, e))
            return -1;
        r->samp.logprobs = has;
        r->samp.top_logprobs = (uint32_t)v;
    }

    json_t *st = json_object_get(o, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st))
        return mr_oai_err(e, 400, "stream", NULL, "'stream' must be a boolean");
    r->stream = json_is_true(st);
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return mr_oai_err(e, 400, "stream_options", NULL, "'stream_options' must be an object");
        if (!r->stream)
            return mr_oai_err(e, 400, "stream_options", NULL, "'stream_options' is only allowed when 'stream' is true");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu))
            return mr_oai_err(e, 400, "stream_options", NULL, "'stream_options.include_usage' must be a boolean");
        r->include_usage = json_is_true(iu);
    }
    if (str_field(o, "user", 256, &r->user, e) || str_field(o, "cache_salt", MR_MSG_SALT_MAX, &r->cache_salt, e))
        return -1;
    json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
        return mr_oai_err(e, 400, "logit_bias", NULL, "'logit_bias' is not supported");
    return 0;
}

/* Chat prompts: builds the template variables of a chat request and renders
 * them with the model's chat template. */
#include "common/chat.h"

#include <stdlib.h>
#include <string.h>

struct mr_chat_tmpl {
    mr_jinja_tmpl *t;
    char *bos, *eos;
};

mr_chat_tmpl *mr_chat_tmpl_new(const char *src, size_t len, const char *bos_token,
                               const char *eos_token, mr_err *err)
{
    mr_chat_tmpl *ct = calloc(1, sizeof *ct);
    if (!ct) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    ct->bos = strdup(bos_token ? bos_token : "");
    ct->eos = strdup(eos_token ? eos_token : "");
    if (!ct->bos || !ct->eos) {
        mr_errf(err, "out of memory");
        mr_chat_tmpl_free(ct);
        return NULL;
    }
    ct->t = mr_jinja_parse(src, len, err);
    if (!ct->t) {
        mr_err_wrap(err, "chat template");
        mr_chat_tmpl_free(ct);
        return NULL;
    }
    return ct;
}

void mr_chat_tmpl_free(mr_chat_tmpl *ct)
{
    if (!ct)
        return;
    mr_jinja_free(ct->t);
    free(ct->bos);
    free(ct->eos);
    free(ct);
}

/* Text of a special token by the id stored under key; NULL when absent. */
static char *token_text(const mr_gguf *g, const char *key, mr_err *err, int *failed)
{
    if (!mr_gguf_find(g, key))
        return NULL;
    uint32_t id;
    const mr_gguf_kv *toks;
    if (mr_gguf_get_u32(g, key, &id, err) != 0 ||
        mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, err) != 0) {
        *failed = 1;
        return NULL;
    }
    if (id >= toks->v.arr.n) {
        mr_errf(err, "%s = %u is not a token id (%llu tokens)", key, id,
                (unsigned long long)toks->v.arr.n);
        *failed = 1;
        return NULL;
    }
    const mr_str *t = &toks->v.arr.strs[id];
    char *s = malloc(t->len + 1);
    if (!s) {
        mr_errf(err, "out of memory");
        *failed = 1;
        return NULL;
    }
    memcpy(s, t->ptr, t->len);
    s[t->len] = '\0';
    return s;
}

mr_chat_tmpl *mr_chat_tmpl_from_gguf(const mr_gguf *g, const char *override, size_t override_len,
                                     mr_err *err)
{
    const mr_gguf_kv *kv = NULL;
    if (!override) {
        kv = mr_gguf_find(g, "tokenizer.chat_template");
        if (!kv || kv->type != MR_GGUF_STRING) {
            mr_errf(err, "the model has no tokenizer.chat_template string");
            return NULL;
        }
    }
    int failed = 0;
    char *bos = token_text(g, "tokenizer.ggml.bos_token_id", err, &failed);
    char *eos = failed ? NULL : token_text(g, "tokenizer.ggml.eos_token_id", err, &failed);
    mr_chat_tmpl *ct = NULL;
    if (!failed)
        ct = override ? mr_chat_tmpl_new(override, override_len, bos, eos, err)
                      : mr_chat_tmpl_new(kv->v.s.ptr, (size_t)kv->v.s.len, bos, eos, err);
    free(bos);
    free(eos);
    return ct;
}

int mr_chat_req_from_json(const json_t *body, mr_chat_req *req, mr_err *err)
{
    memset(req, 0, sizeof *req);
    req->add_generation_prompt = 1;
    req->enable_thinking = -1;
    if (!json_is_object(body))
        return mr_errf(err, "request body must be a JSON object");
    req->messages = json_object_get(body, "messages");
    if (!json_is_array(req->messages))
        return mr_errf(err, "messages must be an array");
    const json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return mr_errf(err, "tools must be an array");
        req->tools = tools;
    }
    /* tool_choice "none": the model is not shown the tools at all */
    const json_t *tc = json_object_get(body, "tool_choice");
    if (json_is_string(tc) && !strcmp(json_string_value(tc), "none"))
        req->tools = NULL;
    const json_t *agp = json_object_get(body, "add_generation_prompt");
    if (agp) {
        if (!json_is_boolean(agp))
            return mr_errf(err, "add_generation_prompt must be a boolean");
        req->add_generation_prompt = json_is_true(agp);
    }
    const json_t *et = json_object_get(body, "enable_thinking");
    if (et && !json_is_null(et)) {
        if (!json_is_boolean(et))
            return mr_errf(err, "enable_thinking must be a boolean");
        req->enable_thinking = json_is_true(et);
    }
    /* OpenAI's reasoning_effort reaches the template (gpt-oss reads it);
     * "none" also turns thinking off, as SGLang and llama-server read it,
     * unless the request sets enable_thinking itself */
    const json_t *re = json_object_get(body, "reasoning_effort");
    if (re && !json_is_null(re)) {
        if (!json_is_string(re))
            return mr_errf(err, "reasoning_effort must be a string");
        req->reasoning_effort = json_string_value(re);
        if (!strcmp(req->reasoning_effort, "none") && req->enable_thinking < 0)
            req->enable_thinking = 0;
    }
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return mr_errf(err, "chat_template_kwargs must be an object");
        req->kwargs = kw;
    }
    return 0;
}

/* A copy of one message with the normalizations described in chat.h. */
static json_t *norm_message(const json_t *m, size_t idx, mr_err *err)
{
    if (!json_is_object(m)) {
        mr_errf(err, "messages[%zu] must be an object", idx);
        return NULL;
    }
    if (!json_is_string(json_object_get(m, "role"))) {
        mr_errf(err, "messages[%zu].role must be a string", idx);
        return NULL;
    }
    json_t *c = json_deep_copy(m);
    if (!c) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    json_t *content = json_object_get(c, "content");
    if (!content || json_is_null(content)) {
        json_object_set_new(c, "content", json_string(""));
    } else if (!json_is_string(content) && !json_is_array(content)) {
        mr_errf(err, "messages[%zu].content must be a string, an array of parts or null", idx);
        json_decref(c);
        return NULL;
    }
    json_t *calls = json_object_get(c, "tool_calls");
    if (calls && !json_is_null(calls)) {
        if (!json_is_array(calls)) {
            mr_errf(err, "messages[%zu].tool_calls must be an array", idx);
            json_decref(c);
            return NULL;
        }
        size_t i;
        json_t *call;
        json_array_foreach(calls, i, call)
        {
            json_t *fn = json_object_get(call, "function");
            json_t *args = json_object_get(fn, "arguments");
            if (!json_is_string(args))
                continue;
            json_t *parsed = json_loadb(json_string_value(args), json_string_length(args),
                                        JSON_DECODE_ANY, NULL);
            if (json_is_object(parsed))
                json_object_set_new(fn, "arguments", parsed);
            else
                json_decref(parsed);
        }
    } else if (calls) {
        json_object_del(c, "tool_calls");
    }
    return c;
}

json_t *mr_chat_context(const mr_chat_tmpl *ct, const mr_chat_req *req, mr_err *err)
{
    if (!json_is_array(req->messages)) {
        mr_errf(err, "messages must be an array");
        return NULL;
    }
    if (req->tools && !json_is_array(req->tools)) {
        mr_errf(err, "tools must be an array");
        return NULL;
    }
    if (req->kwargs && !json_is_object(req->kwargs)) {
        mr_errf(err, "chat_template_kwargs must be an object");
        return NULL;
    }
    json_t *ctx = json_object();
    json_t *msgs = json_array();
    if (!ctx || !msgs)
        goto oom;
    size_t i;
    json_t *m;
    json_array_foreach(req->messages, i, m)
    {
        json_t *c = norm_message(m, i, err);
        if (!c) {
            json_decref(msgs);
            json_decref(ctx);
            return NULL;
        }
        json_array_append_new(msgs, c);
    }
    json_object_set_new(ctx, "messages", msgs);
    if (req->tools)
        json_object_set_new(ctx, "tools", json_deep_copy(req->tools));
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(req->add_generation_prompt));
    if (req->enable_thinking >= 0)
        json_object_set_new(ctx, "enable_thinking", json_boolean(req->enable_thinking));
    if (req->reasoning_effort)
        json_object_set_new(ctx, "reasoning_effort", json_string(req->reasoning_effort));
    json_object_set_new(ctx, "bos_token", json_stringn_nocheck(ct->bos, strlen(ct->bos)));
    json_object_set_new(ctx, "eos_token", json_stringn_nocheck(ct->eos, strlen(ct->eos)));
    if (req->kwargs) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)req->kwargs, k, v)
            json_object_set_new(ctx, k, json_deep_copy(v));
    }
    return ctx;
oom:
    json_decref(msgs);
    json_decref(ctx);
    mr_errf(err, "out of memory");
    return NULL;
}

int mr_chat_render(const mr_chat_tmpl *ct, const mr_chat_req *req, const mr_jinja_opts *opts,
                   char **out, size_t *out_len, mr_err *err)
{
    *out = NULL;
    *out_len = 0;
    json_t *ctx = mr_chat_context(ct, req, err);
    if (!ctx)
        return -1;
    int rc = mr_jinja_render(ct->t, ctx, opts, out, out_len, err);
    json_decref(ctx);
    if (rc != 0)
        return mr_err_wrap(err, "chat template");
    return 0;
}

/* HTTP side of the gateway on h2o (evloop): listener, routes, auth, the
 * error filter that gives h2o's own errors the OpenAI shape, /metrics,
 * /health, /readyz, /v1/models, /tokenize, /detokenize, and the loop that
 * also carries worker events, keyring reloads, supervision and drain. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "gateway/gw.h"

static volatile sig_atomic_t g_sigterm;
static mr_gw *g_gw; /* the handler and filter reach the gateway through it */

/* ---------- small response helpers ---------- */

/* h2o keeps pointers to header names and values: both are copied into the
 * request's pool (callers pass stack buffers). */
static void add_hdr(h2o_req_t *req, const char *name, const char *value)
{
    h2o_iovec_t n = h2o_strdup(&req->pool, name, strlen(name));
    h2o_iovec_t v = h2o_strdup(&req->pool, value, strlen(value));
    h2o_add_header_by_str(&req->pool, &req->res.headers, n.base, n.len, 0, NULL, v.base, v.len);
}

static void send_body(h2o_req_t *req, int status, const char *ctype, const char *body, size_t len, const char *route)
{
    static h2o_generator_t gen = {NULL, NULL};
    req->res.status = status;
    req->res.reason = status == 200 ? "OK" : "Error";
    req->res.content_length = len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, ctype, strlen(ctype));
    h2o_iovec_t b = h2o_strdup(&req->pool, body, len);
    h2o_start_response(req, &gen);
    h2o_send(req, &b, 1, H2O_SEND_STATE_FINAL);
    if (route && g_gw)
        mr_metrics_request(&g_gw->metrics, route, status);
}

void mr_gw_send_json(h2o_req_t *req, int status, const char *body, size_t len, const char *route)
{
    send_body(req, status, "application/json", body, len, route);
}

void mr_gw_send_error(h2o_req_t *req, const mr_oai_error *e, const char *route, int retry_after)
{
    char *s = mr_oai_error_json(e);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        add_hdr(req, "retry-after", v);
        snprintf(v, sizeof v, "%d", retry_after * 1000);
        add_hdr(req, "retry-after-ms", v);
    }
    if (e->status == 401)
        add_hdr(req, "www-authenticate", "Bearer");
    mr_gw_send_json(req, e->status, s, strlen(s), route);
    free(s);
}

static void send_err(h2o_req_t *req, int status, const char *param, const char *code, const char *route,
                     int retry_after, const char *msg)
{
    mr_oai_error e;
    mr_oai_err(&e, status, param, code, "%s", msg);
    mr_gw_send_error(req, &e, route, retry_after);
}

static void send_jobj(h2o_req_t *req, int status, json_t *o, const char *route)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    mr_gw_send_json(req, status, s, strlen(s), route);
    free(s);
}

/* ---------- lookup tables ---------- */

mr_gw_model *mr_gw_find_model(mr_gw *gw, const char *name)
{
    for (int i = 0; i < gw->n_models; i++)
        if (!strcmp(gw->models[i].conf->name, name))
            return &gw->models[i];
    return NULL;
}

mr_tenant_state *mr_gw_tenant(mr_gw *gw, const char *name)
{
    for (int i = 0; i < gw->n_tenants; i++)
        if (!strcmp(gw->tenants[i].name, name))
            return &gw->tenants[i];
    if (gw->n_tenants == (int)(sizeof gw->tenants / sizeof *gw->tenants))
        return NULL;
    mr_tenant_state *t = &gw->tenants[gw->n_tenants++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->cap = gw->conf.default_tenant_max;
    for (int i = 0; i < gw->conf.n_tenants; i++)
        if (!strcmp(gw->conf.tenants[i].name, name))
            t->cap = gw->conf.tenants[i].max_concurrency;
    return t;
}

mr_key_state *mr_gw_key_state(mr_gw *gw, const char *id)
{
    for (int i = 0; i < gw->n_key_states; i++)
        if (!strcmp(gw->key_states[i].id, id))
            return &gw->key_states[i];
    if (gw->n_key_states == (int)(sizeof gw->key_states / sizeof *gw->key_states))
        return NULL;
    mr_key_state *k = &gw->key_states[gw->n_key_states++];
    memset(k, 0, sizeof *k);
    snprintf(k->id, sizeof k->id, "%s", id);
    return k;
}

/* ---------- auth ---------- */

/* Returns 0 with tenant/key set, or -1 after answering 401/403. */
static int authenticate(mr_gw *gw, h2o_req_t *req, const char *route, const char **tenant, const mr_key **key)
{
    *tenant = "default";
    *key = NULL;
    if (!gw->have_keys)
        return 0;
    ssize_t at = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    if (at < 0) {
        send_err(req, 401, NULL, "invalid_api_key", route, 0, "missing API key (Authorization: Bearer <key>)");
        return -1;
    }
    h2o_iovec_t v = req->headers.entries[at].value;
    if (v.len < 7 || strncasecmp(v.base, "Bearer ", 7) != 0) {
        send_err(req, 401, NULL, "invalid_api_key", route, 0, "the Authorization header must be 'Bearer <key>'");
        return -1;
    }
    const mr_key *k = mr_keyring_find(&gw->keys, v.base + 7, v.len - 7);
    if (!k) {
        send_err(req, 401, NULL, "invalid_api_key", route, 0, "invalid API key");
        return -1;
    }
    if (!k->enabled) {
        send_err(req, 403, NULL, "api_key_disabled", route, 0, "this API key is disabled");
        return -1;
    }
    *tenant = k->tenant;
    *key = k;
    return 0;
}

/* ---------- routes ---------- */

static bool is_ready(mr_gw *gw)
{
    if (gw->draining)
        return false;
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            if (!gw->models[m].workers[i].ready)
                return false;
    return true;
}

static json_t *models_json(mr_gw *gw)
{
    json_t *data = json_array();
    for (int m = 0; m < gw->n_models; m++) {
        mr_gw_model *md = &gw->models[m];
        uint32_t ctx = mr_gw_model_ctx(md);
        json_t *params = json_pack("[s,s,s,s,s,s,s,s,s,s,s,s,s,s]", "max_tokens", "max_completion_tokens",
                                   "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty", "logprobs", "top_logprobs",
                                   "stream_options");
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:i, s:o}", "id", md->conf->name, "object",
                                              "model", "created", (json_int_t)md->created, "owned_by", "memra",
                                              "context_length", (int)ctx, "supported_parameters", params));
    }
    return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

static void render_metrics(mr_gw *gw, mr_buf *o)
{
    mr_metrics_render_routes(&gw->metrics, o);
    mr_buf_adds(o, "# HELP memra_prompt_tokens_total Prompt tokens of finished requests.\n"
                   "# TYPE memra_prompt_tokens_total counter\n");
    for (int m = 0; m < gw->n_models; m++)
        mr_buf_printf(o, "memra_prompt_tokens_total{model=\"%s\"} %llu\n", gw->models[m].conf->name,
                      (unsigned long long)gw->models[m].prompt_tokens);
    mr_buf_adds(o, "# HELP memra_generated_tokens_total Generated tokens of finished requests.\n"
                   "# TYPE memra_generated_tokens_total counter\n");
    for (int m = 0; m < gw->n_models; m++)
        mr_buf_printf(o, "memra_generated_tokens_total{model=\"%s\"} %llu\n", gw->models[m].conf->name,
                      (unsigned long long)gw->models[m].gen_tokens);
    mr_buf_adds(o, "# HELP memra_queue_depth Requests admitted and waiting for a worker slot.\n"
                   "# TYPE memra_queue_depth gauge\n");
    for (int m = 0; m < gw->n_models; m++)
        mr_buf_printf(o, "memra_queue_depth{model=\"%s\"} %d\n", gw->models[m].conf->name, gw->models[m].queued);
    mr_buf_adds(o, "# HELP memra_running_requests Requests running on workers.\n"
                   "# TYPE memra_running_requests gauge\n");
    for (int m = 0; m < gw->n_models; m++)
        mr_buf_printf(o, "memra_running_requests{model=\"%s\"} %d\n", gw->models[m].conf->name,
                      gw->models[m].running);
    mr_buf_adds(o, "# HELP memra_time_to_first_token_seconds Time from admission to the first token.\n"
                   "# TYPE memra_time_to_first_token_seconds histogram\n");
    for (int m = 0; m < gw->n_models; m++) {
        char l[200];
        snprintf(l, sizeof l, "model=\"%s\"", gw->models[m].conf->name);
        mr_hist_render(o, "memra_time_to_first_token_seconds", l, &gw->models[m].ttft);
    }
    mr_buf_adds(o, "# HELP memra_inter_token_latency_seconds Time between generated tokens.\n"
                   "# TYPE memra_inter_token_latency_seconds histogram\n");
    for (int m = 0; m < gw->n_models; m++) {
        char l[200];
        snprintf(l, sizeof l, "model=\"%s\"", gw->models[m].conf->name);
        mr_hist_render(o, "memra_inter_token_latency_seconds", l, &gw->models[m].itl);
    }
    mr_buf_adds(o, "# HELP memra_worker_up Whether the worker is connected and ready.\n"
                   "# TYPE memra_worker_up gauge\n");
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            mr_buf_printf(o, "memra_worker_up{model=\"%s\",worker=\"%d\"} %d\n", gw->models[m].conf->name, i,
                          gw->models[m].workers[i].ready ? 1 : 0);
    mr_buf_adds(o, "# HELP memra_worker_restarts_total Worker processes restarted by the supervisor.\n"
                   "# TYPE memra_worker_restarts_total counter\n");
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            mr_buf_printf(o, "memra_worker_restarts_total{model=\"%s\",worker=\"%d\"} %d\n",
                          gw->models[m].conf->name, i, gw->models[m].workers[i].restarts);
    mr_buf_adds(o, "# HELP memra_worker_kv_free_blocks Free KV blocks reported by the worker.\n"
                   "# TYPE memra_worker_kv_free_blocks gauge\n");
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++)
            mr_buf_printf(o, "memra_worker_kv_free_blocks{model=\"%s\",worker=\"%d\"} %llu\n",
                          gw->models[m].conf->name, i, (unsigned long long)gw->models[m].workers[i].cap.kv_free);
    static const struct {
        const char *name, *help, *type;
        size_t off;
    } wcap[] = {
        {"memra_worker_kv_total_blocks", "KV blocks in the worker's pool.", "gauge", offsetof(mr_msg, kv_total)},
        {"memra_worker_kv_block_tokens", "Tokens per KV block (0: no paged KV).", "gauge",
         offsetof(mr_msg, block_tokens)},
        {"memra_worker_queued_requests", "Requests waiting in the worker for KV room.", "gauge",
         offsetof(mr_msg, queued)},
        {"memra_prefix_cache_blocks", "KV blocks the worker's prefix cache holds (occupancy).", "gauge",
         offsetof(mr_msg, cache_blocks)},
        {"memra_prefix_cache_capacity_blocks", "Most KV blocks the prefix cache may hold.", "gauge",
         offsetof(mr_msg, cache_capacity)},
        {"memra_prefix_cache_prompt_tokens_total", "Prompt tokens admitted by the worker.", "counter",
         offsetof(mr_msg, cache_prompt_tokens)},
        {"memra_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", "counter",
         offsetof(mr_msg, cache_hit_tokens)},
        {"memra_prefix_cache_evictions_total", "Prefix-cache blocks evicted.", "counter",
         offsetof(mr_msg, cache_evictions)},
    };
    for (size_t k = 0; k < sizeof wcap / sizeof wcap[0]; k++) {
        mr_buf_printf(o, "# HELP %s %s (last worker report)\n# TYPE %s %s\n", wcap[k].name, wcap[k].help,
                      wcap[k].name, wcap[k].type);
        for (int m = 0; m < gw->n_models; m++)
            for (int i = 0; i < gw->models[m].n_workers; i++) {
                uint64_t v;
                memcpy(&v, (const char *)&gw->models[m].workers[i].cap + wcap[k].off, sizeof v);
                mr_buf_printf(o, "%s{model=\"%s\",worker=\"%d\"} %llu\n", wcap[k].name, gw->models[m].conf->name,
                              i, (unsigned long long)v);
            }
    }
    mr_buf_adds(o, "# HELP memra_cached_prompt_tokens_total Prompt tokens of finished requests served by the "
                   "prefix cache.\n# TYPE memra_cached_prompt_tokens_total counter\n");
    for (int m = 0; m < gw->n_models; m++)
        mr_buf_printf(o, "memra_cached_prompt_tokens_total{model=\"%s\"} %llu\n", gw->models[m].conf->name,
                      (unsigned long long)gw->models[m].cached_tokens);
    mr_buf_adds(o, "# HELP memra_kv_refused_total Requests answered 429 because no worker's KV pool could hold "
                   "them.\n# TYPE memra_kv_refused_total counter\n");
    for (int m = 0; m < gw->n_models; m++)
        mr_buf_printf(o, "memra_kv_refused_total{model=\"%s\"} %llu\n", gw->models[m].conf->name,
                      (unsigned long long)gw->models[m].kv_refused);
    mr_buf_adds(o, "# HELP memra_tenant_requests_total Requests per tenant.\n"
                   "# TYPE memra_tenant_requests_total counter\n");
    for (int t = 0; t < gw->n_tenants; t++)
        mr_buf_printf(o, "memra_tenant_requests_total{tenant=\"%s\"} %llu\n", gw->tenants[t].name,
                      (unsigned long long)gw->tenants[t].requests);
    mr_buf_adds(o, "# HELP memra_tenant_rejected_total Requests per tenant answered 429.\n"
                   "# TYPE memra_tenant_rejected_total counter\n");
    for (int t = 0; t < gw->n_tenants; t++)
        mr_buf_printf(o, "memra_tenant_rejected_total{tenant=\"%s\"} %llu\n", gw->tenants[t].name,
                      (unsigned long long)gw->tenants[t].rejected);
    mr_buf_adds(o, "# HELP memra_tenant_generated_tokens_total Generated tokens per tenant.\n"
                   "# TYPE memra_tenant_generated_tokens_total counter\n");
    for (int t = 0; t < gw->n_tenants; t++)
        mr_buf_printf(o, "memra_tenant_generated_tokens_total{tenant=\"%s\"} %llu\n", gw->tenants[t].name,
                      (unsigned long long)gw->tenants[t].gen_tokens);
    mr_buf_adds(o, "# HELP memra_tenant_running Running requests per tenant.\n"
                   "# TYPE memra_tenant_running gauge\n");
    for (int t = 0; t < gw->n_tenants; t++)
        mr_buf_printf(o, "memra_tenant_running{tenant=\"%s\"} %d\n", gw->tenants[t].name, gw->tenants[t].running);
    mr_buf_printf(o, "# HELP memra_draining 1 while the gateway drains.\n# TYPE memra_draining gauge\nmemra_draining %d\n",
                  gw->draining ? 1 : 0);
}

static void route_tokenize(mr_gw *gw, h2o_req_t *req, bool detok, const char *route)
{
    json_error_t je;
    json_t *o = json_loadb(req->entity.base ? req->entity.base : "", req->entity.len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        send_err(req, 400, NULL, NULL, route, 0, "the request body must be a JSON object");
        return;
    }
    const char *name = json_string_value(json_object_get(o, "model"));
    mr_gw_model *m = name ? mr_gw_find_model(gw, name) : NULL;
    if (!json_is_string(json_object_get(o, "model"))) {
        send_err(req, 400, "model", NULL, route, 0, "'model' is required and must be a string");
    } else if (!m) {
        mr_oai_error e;
        mr_oai_err(&e, 404, "model", "model_not_found", "The model '%s' does not exist", name);
        mr_gw_send_error(req, &e, route, 0);
    } else if (detok) {
        json_t *toks = json_object_get(o, "tokens");
        if (!json_is_array(toks)) {
            send_err(req, 400, "tokens", NULL, route, 0, "'tokens' must be an array of token ids");
        } else {
            mr_buf raw = {0}, txt = {0};
            size_t i;
            json_t *t;
            const char *bad = NULL;
            json_array_foreach(toks, i, t)
            {
                mr_err err;
                if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX ||
                    m->codec->piece(m->codec, (uint32_t)json_integer_value(t), &raw, &err)) {
                    bad = "'tokens' must hold token ids of the model's vocabulary";
                    break;
                }
            }
            if (bad) {
                send_err(req, 400, "tokens", NULL, route, 0, bad);
            } else {
                mr_gw_utf8_sanitize(&txt, raw.p ? raw.p : "", raw.len);
                send_jobj(req, 200, json_pack("{s:s%}", "prompt", txt.p ? txt.p : "", txt.len), route);
            }
            mr_buf_free(&raw);
            mr_buf_free(&txt);
        }
    } else {
        json_t *p = json_object_get(o, "prompt"), *msgs = json_object_get(o, "messages");
        mr_buf text = {0};
        mr_err err;
        int ok = 1;
        if (json_is_string(p)) {
            mr_buf_add(&text, json_string_value(p), json_string_length(p));
        } else if (json_is_array(msgs)) {
            /* validated as a chat request; the template renders the whole
             * body (messages, tools, chat_template_kwargs, ...) */
            mr_oai_error e;
            mr_oai_req r;
            if (mr_oai_parse(req->entity.base, req->entity.len, true, &r, &e)) {
                mr_gw_send_error(req, &e, route, 0);
                ok = 0;
            } else if (m->codec->chat(m->codec, r.root, &text, &err)) {
                send_err(req, 400, "messages", NULL, route, 0, err.msg);
                ok = 0;
            }
            mr_oai_req_free(&r);
        } else {
            send_err(req, 400, "prompt", NULL, route, 0, "'prompt' (a string) or 'messages' is required");
            ok = 0;
        }
        if (ok) {
            uint32_t *ids = NULL, n = 0;
            if (m->codec->encode(m->codec, text.p ? text.p : "", text.len, json_is_array(msgs), &ids, &n, &err)) {
                send_err(req, 400, "prompt", NULL, route, 0, err.msg);
            } else {
                json_t *arr = json_array();
                for (uint32_t i = 0; i < n; i++)
                    json_array_append_new(arr, json_integer(ids[i]));
                send_jobj(req, 200,
                          json_pack("{s:o, s:i, s:i}", "tokens", arr, "count", (int)n, "max_model_len",
                                    (int)m->conf->context_length),
                          route);
            }
            free(ids);
        }
        mr_buf_free(&text);
    }
    json_decref(o);
}

static bool path_is(h2o_req_t *req, const char *p)
{
    return h2o_memis(req->path_normalized.base, req->path_normalized.len, p, strlen(p));
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    mr_gw *gw = g_gw;
    bool get = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("GET"));
    bool post = h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST"));
    const char *route = NULL;
    bool want_post = false;
    static const struct {
        const char *path;
        bool post;
    } routes[] = {{"/health", false},  {"/readyz", false},   {"/metrics", false},
                  {"/v1/models", false}, {"/v1/chat/completions", true}, {"/v1/completions", true},
                  {"/tokenize", true},   {"/detokenize", true}};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (path_is(req, routes[i].path)) {
            route = routes[i].path;
            want_post = routes[i].post;
        }
    if (!route) {
        send_err(req, 404, NULL, "not_found", "other", 0, "no such route");
        return 0;
    }
    if ((want_post && !post) || (!want_post && !get)) {
        add_hdr(req, "allow", want_post ? "POST" : "GET");
        send_err(req, 405, NULL, "method_not_allowed", route, 0, want_post ? "use POST" : "use GET");
        return 0;
    }
    if (!strcmp(route, "/health")) {
        send_jobj(req, 200, json_pack("{s:s}", "status", gw->draining ? "draining" : "ok"), route);
        return 0;
    }
    if (!strcmp(route, "/readyz")) {
        bool ok = is_ready(gw);
        if (!ok) {
            add_hdr(req, "retry-after", "1");
        }
        send_jobj(req, ok ? 200 : 503,
                  json_pack("{s:s}", "status", ok ? "ready" : gw->draining ? "draining" : "not_ready"), route);
        return 0;
    }
    const char *tenant;
    const mr_key *key;
    if (!strcmp(route, "/metrics")) {
        if (authenticate(gw, req, route, &tenant, &key))
            return 0;
        mr_buf b = {0};
        render_metrics(gw, &b);
        send_body(req, 200, "text/plain; version=0.0.4", b.p, b.len, route);
        mr_buf_free(&b);
        return 0;
    }
    if (authenticate(gw, req, route, &tenant, &key))
        return 0;
    if (!strcmp(route, "/v1/models")) {
        send_jobj(req, 200, models_json(gw), route);
        return 0;
    }
    if (!strcmp(route, "/tokenize") || !strcmp(route, "/detokenize")) {
        route_tokenize(gw, req, !strcmp(route, "/detokenize"), route);
        return 0;
    }
    if (gw->draining) {
        send_err(req, 503, NULL, "draining", route, gw->conf.retry_after_s, "the server is shutting down");
        return 0;
    }
    bool chat = !strcmp(route, "/v1/chat/completions");
    mr_oai_req r;
    mr_oai_error e;
    if (mr_oai_parse(req->entity.base ? req->entity.base : "", req->entity.len, chat, &r, &e)) {
        mr_oai_req_free(&r);
        mr_gw_send_error(req, &e, route, 0);
        return 0;
    }
    mr_gw_admit(gw, req, &r, tenant, key, route);
    mr_oai_req_free(&r);
    return 0;
}

/* ---------- h2o's own errors in the OpenAI shape ---------- */

struct errfix {
    h2o_ostream_t super;
    h2o_iovec_t body;
};

static void errfix_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t n, h2o_send_state_t state)
{
    struct errfix *ef = (struct errfix *)self;
    if (h2o_send_state_is_in_progress(state)) {
        h2o_ostream_send_next(self, req, NULL, 0, state);
        return;
    }
    h2o_ostream_send_next(self, req, &ef->body, 1, state);
}

static void errfix_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    ssize_t ct = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (req->res.status >= 400 && ct >= 0 && req->res.headers.entries[ct].value.len >= 10 &&
        !memcmp(req->res.headers.entries[ct].value.base, "text/plain", 10) && g_gw) {
        char *s = mr_oai_error_json_simple(req->res.status, req->res.reason ? req->res.reason : "error");
        struct errfix *ef = (struct errfix *)h2o_add_ostream(req, sizeof *ef, slot);
        ef->super.do_send = errfix_send;
        ef->body = h2o_strdup(&req->pool, s, strlen(s));
        free(s);
        req->res.content_length = ef->body.len;
        req->res.headers.entries[ct].value = h2o_strdup(&req->pool, H2O_STRLIT("application/json"));
        mr_metrics_request(&g_gw->metrics, "other", req->res.status);
        slot = &ef->super.next;
    }
    h2o_setup_next_ostream(req, slot);
}

/* ---------- worker connections ---------- */

static void post_event(mr_gw_worker *w, int kind, mr_msg *m)
{
    mr_wevent *ev = calloc(1, sizeof *ev);
    if (!ev)
        return;
    ev->kind = kind;
    if (m)
        ev->msg = *m;
    h2o_multithread_send_message(&w->receiver, &ev->super);
}

static void on_pipe(int connected, void *arg)
{
    post_event(arg, connected ? MR_WEV_UP : MR_WEV_DOWN, NULL);
}

static void *recv_thread(void *arg)
{
    mr_gw_worker *w = arg;
    for (;;) {
        mr_msg m;
        mr_err err;
        uint64_t bad_id;
        int rc = mr_chan_recv(&w->chan, &m, -1, &bad_id, &err);
        if (rc == MR_CHAN_CLOSED)
            break;
        if (rc == MR_CHAN_TIMEOUT)
            continue;
        if (rc == MR_CHAN_BAD) {
            MR_WARN("gateway: bad message from %s worker %d: %s", w->model->conf->name, w->index, err.msg);
            if (bad_id) {
                mr_msg e;
                mr_msg_make_error(&e, bad_id, "bad_message", "undecodable message from worker: %.200s", err.msg);
                post_event(w, MR_WEV_MSG, &e);
            }
            continue;
        }
        post_event(w, MR_WEV_MSG, &m);
    }
    return NULL;
}

static void on_worker_messages(h2o_multithread_receiver_t *r, h2o_linklist_t *list)
{
    mr_gw_worker *w = H2O_STRUCT_FROM_MEMBER(mr_gw_worker, receiver, r);
    while (!h2o_linklist_is_empty(list)) {
        mr_wevent *ev = H2O_STRUCT_FROM_MEMBER(mr_wevent, super.link, list->next);
        h2o_linklist_unlink(&ev->super.link);
        mr_gw_on_worker_event(w, ev);
        mr_msg_free(&ev->msg);
        free(ev);
    }
}

/* ---------- tick: keyring, capacity, supervision, drain ---------- */

static void reload_keys(mr_gw *gw)
{
    if (!gw->have_keys || !mr_keyring_changed(gw->conf.keyring, &gw->keys))
        return;
    mr_keyring nk;
    mr_err err;
    if (mr_keyring_load(gw->conf.keyring, &nk, &err)) {
        /* never fail open: keep serving with the keys we had */
        MR_WARN("gateway: keyring reload failed, keeping the previous keys: %s", err.msg);
        mr_keyring_stat(gw->conf.keyring, &gw->keys); /* warn once per rewrite */
        return;
    }
    mr_keyring_free(&gw->keys);
    gw->keys = nk;
    MR_INFO("gateway: keyring reloaded (%zu keys)", nk.n);
}

static void on_tick(h2o_timeout_entry_t *entry)
{
    mr_gw *gw = g_gw;
    double now = mr_now();
    if (g_sigterm && !gw->draining) {
        MR_INFO("gateway: SIGTERM: draining (%d running, deadline %d ms)", gw->n_jobs, gw->conf.drain_timeout_ms);
        gw->draining = true;
        gw->drain_deadline = now + gw->conf.drain_timeout_ms / 1000.0;
    }
    if (now - gw->keys_checked > 0.5) {
        gw->keys_checked = now;
        reload_keys(gw);
        /* ask workers for capacity */
        for (int m = 0; m < gw->n_models; m++)
            for (int i = 0; i < gw->models[m].n_workers; i++) {
                mr_gw_worker *w = &gw->models[m].workers[i];
                if (!w->ready)
                    continue;
                mr_msg q;
                mr_msg_init(&q, MR_MSG_CAP_QUERY, 0);
                mr_err err;
                mr_chan_send(&w->chan, &q, 50, &err);
            }
    }
    if (gw->conf.supervise)
        mr_sup_tick(gw);
    mr_gw_jobs_tick(gw);
    h2o_timeout_link(gw->ctx.loop, &gw->tick_timeout, &gw->tick);
}

static void on_sigterm(int sig) { g_sigterm = 1; }

/* ---------- listener ---------- */

static void on_accept(h2o_socket_t *listener, const char *err)
{
    if (err)
        return;
    h2o_socket_t *sock = h2o_evloop_socket_accept(listener);
    if (!sock)
        return;
    if (g_gw->stop) {
        h2o_socket_close(sock);
        return;
    }
    h2o_accept(&g_gw->accept, sock);
}

static int open_listener(mr_gw *gw, mr_err *err)
{
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", gw->conf.port);
    char host[256];
    snprintf(host, sizeof host, "%s", gw->conf.host);
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = 0;
    }
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc)
        return mr_errf(err, "listen %s:%d: %s", gw->conf.host, gw->conf.port, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 1024)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return mr_errf(err, "listen %s:%d: %s", gw->conf.host, gw->conf.port, strerror(e));
    }
    freeaddrinfo(res);
    gw->listener = h2o_evloop_socket_create(gw->ctx.loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    h2o_socket_read_start(gw->listener, on_accept);
    return 0;
}

/* ---------- main ---------- */

int mr_gateway_main(const char *config_path)
{
    signal(SIGPIPE, SIG_IGN);
    mr_gw *gw = calloc(1, sizeof *gw);
    if (!gw)
        return 1;
    g_gw = gw;
    mr_err err;
    if (mr_config_load(config_path, &gw->conf, &err)) {
        fprintf(stderr, "memra-gateway: %s\n", err.msg);
        return 1;
    }
    mr_config *c = &gw->conf;
    gw->have_keys = c->keyring[0] != 0;
    if (!mr_host_is_loopback(c->host) && !gw->have_keys) {
        fprintf(stderr,
                "memra-gateway: refusing to listen on %s:%d: it is not a loopback address and no keyring is "
                "configured, so anyone who can reach it could use the models. Set \"keyring\" in %s (create keys "
                "with `memra-gateway keys add --keyring FILE --tenant NAME`) or listen on 127.0.0.1.\n",
                c->host, c->port, config_path);
        return 1;
    }
    if (gw->have_keys && mr_keyring_load(c->keyring, &gw->keys, &err)) {
        fprintf(stderr, "memra-gateway: %s\n", err.msg);
        return 1;
    }
    h2o_linklist_init_anchor(&gw->jobs);

    h2o_config_init(&gw->h2o);
    gw->h2o.max_request_entity_size = c->max_body_bytes;
    gw->h2o.http1.req_timeout = (uint64_t)c->request_timeout_ms;
    gw->h2o.server_name = h2o_iovec_init(H2O_STRLIT("memra"));
    h2o_hostconf_t *host = h2o_config_register_host(&gw->h2o, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
    h2o_handler_t *h = h2o_create_handler(path, sizeof *h);
    h->on_req = on_req;
    h2o_create_filter(path, sizeof(h2o_filter_t))->on_setup_ostream = errfix_setup;
    h2o_create_filter(&host->fallback_path, sizeof(h2o_filter_t))->on_setup_ostream = errfix_setup;
    h2o_context_init(&gw->ctx, h2o_evloop_create(), &gw->h2o);
    gw->accept.ctx = &gw->ctx;
    gw->accept.hosts = gw->h2o.hosts;
    gw->mq = h2o_multithread_create_queue(gw->ctx.loop);

    for (int m = 0; m < c->n_models; m++) {
        mr_gw_model *md = &gw->models[m];
        md->gw = gw;
        md->conf = &c->models[m];
        md->created = (long)time(NULL);
        h2o_linklist_init_anchor(&md->queue);
        md->codec = mr_codec_open(md->conf->tokenizer, md->conf->path, md->conf->chat_template, &err);
        if (!md->codec || mr_chat_format_resolve(md->codec->tmpl_text, md->conf->reasoning_parser,
                                                 md->conf->tool_parser, &md->fmt, &err)) {
            fprintf(stderr, "memra-gateway: model %s: %s\n", md->conf->name, err.msg);
            return 1;
        }
        md->n_workers = md->conf->n_workers;
        for (int i = 0; i < md->n_workers; i++) {
            mr_gw_worker *w = &md->workers[i];
            w->gw = gw;
            w->model = md;
            w->index = i;
            w->conf = &md->conf->workers[i];
            mr_msg_init(&w->cap, MR_MSG_CAPACITY, 0);
            h2o_multithread_register_receiver(gw->mq, &w->receiver, on_worker_messages);
        }
        gw->n_models++;
    }
    if (open_listener(gw, &err)) {
        fprintf(stderr, "memra-gateway: %s\n", err.msg);
        return 1;
    }
    if (c->supervise)
        mr_sup_start_all(gw);
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++) {
            mr_gw_worker *w = &gw->models[m].workers[i];
            if (mr_chan_dial(&w->chan, w->conf->url, on_pipe, w, &err)) {
                fprintf(stderr, "memra-gateway: %s\n", err.msg);
                return 1;
            }
            pthread_create(&w->thr, NULL, recv_thread, w);
            w->thr_started = true;
        }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    h2o_timeout_init(gw->ctx.loop, &gw->tick_timeout, 100);
    gw->tick.cb = on_tick;
    h2o_timeout_link(gw->ctx.loop, &gw->tick_timeout, &gw->tick);
    MR_INFO("gateway: listening on http://%s:%d (%d models%s)", c->host, c->port, gw->n_models,
            gw->have_keys ? ", keys required" : "");

    while (!gw->stop)
        h2o_evloop_run(gw->ctx.loop, 100);
    /* let final bytes reach the clients */
    for (int i = 0; i < 5; i++)
        h2o_evloop_run(gw->ctx.loop, 20);
    MR_INFO("gateway: drained; stopping");
    h2o_socket_read_stop(gw->listener);
    h2o_socket_close(gw->listener);
    if (c->supervise)
        mr_sup_stop_all(gw, 10000);
    for (int m = 0; m < gw->n_models; m++)
        for (int i = 0; i < gw->models[m].n_workers; i++) {
            mr_gw_worker *w = &gw->models[m].workers[i];
            mr_chan_close(&w->chan);
            if (w->thr_started)
                pthread_join(w->thr, NULL);
        }
    return 0;
}

#include "gateway/config.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "gateway/auth.h"
#include "gateway/chatout.h"
#include "gateway/util.h"

void mr_config_defaults(mr_config *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->host, "127.0.0.1");
    c->port = 8080;
    c->max_body_bytes = 4u << 20;
    c->request_timeout_ms = 10000;
    c->drain_timeout_ms = 30000;
    c->stream_keepalive_ms = 15000;
    strcpy(c->worker_bin, "build/bin/memra-worker");
    c->backoff_min_ms = 200;
    c->backoff_max_ms = 10000;
    c->retry_after_s = 2;
}

void mr_config_free(mr_config *c)
{
    for (int m = 0; m < c->n_models; m++) {
        for (int i = 0; i < c->models[m].n_worker_args; i++)
            free(c->models[m].worker_args[i]);
        free(c->models[m].chat_template);
        c->models[m].chat_template = NULL;
    }
}

bool mr_host_is_loopback(const char *h)
{
    return !strcmp(h, "localhost") || !strncmp(h, "127.", 4) || !strcmp(h, "::1") || !strcmp(h, "[::1]");
}

/* Typed getters: absent fields keep the default; wrong types are errors
 * that name the field path. */
static int get_str(json_t *o, const char *key, const char *path, char *dst, size_t cap, mr_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return mr_errf(err, "%s%s: expected a string", path, key);
    if (json_string_length(v) >= cap || json_string_length(v) == 0)
        return mr_errf(err, "%s%s: length must be 1..%zu", path, key, cap - 1);
    strcpy(dst, json_string_value(v));
    return 0;
}

static int get_int(json_t *o, const char *key, const char *path, long long lo, long long hi, long long *dst,
                   mr_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return mr_errf(err, "%s%s: expected an integer", path, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return mr_errf(err, "%s%s: %lld is outside %lld..%lld", path, key, x, lo, hi);
    *dst = x;
    return 0;
}

/* get_int into the config's narrower fields (the bounds fit them). */
static int get_u32(json_t *o, const char *key, const char *path, long long lo, long long hi, uint32_t *dst,
                   mr_err *err)
{
    long long v = *dst;
    if (get_int(o, key, path, lo, hi, &v, err))
        return -1;
    *dst = (uint32_t)v;
    return 0;
}

static int get_i32(json_t *o, const char *key, const char *path, long long lo, long long hi, int *dst, mr_err *err)
{
    long long v = *dst;
    if (get_int(o, key, path, lo, hi, &v, err))
        return -1;
    *dst = (int)v;
    return 0;
}

static int get_bool(json_t *o, const char *key, const char *path, bool *dst, mr_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return mr_errf(err, "%s%s: expected true or false", path, key);
    *dst = json_is_true(v);
    return 0;
}

static int parse_listen(const char *s, mr_config *c, mr_err *err)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return mr_errf(err, "listen: \"%s\" must be HOST:PORT", s);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return mr_errf(err, "listen: port in \"%s\" must be 1..65535", s);
    size_t hl = (size_t)(colon - s);
    if (hl >= sizeof c->host)
        return mr_errf(err, "listen: host too long");
    memcpy(c->host, s, hl);
    c->host[hl] = 0;
    c->port = (int)port;
    return 0;
}

static int parse_model(json_t *m, int idx, mr_model_conf *mc, mr_err *err)
{
    char path[64];
    snprintf(path, sizeof path, "models[%d].", idx);
    if (!json_is_object(m))
        return mr_errf(err, "models[%d]: expected an object", idx);
    strcpy(mc->tokenizer, "gguf");
    strcpy(mc->backend, "auto");
    strcpy(mc->reasoning_parser, "auto");
    strcpy(mc->tool_parser, "auto");
    mc->context_length = 4096;
    mc->max_tokens_default = 256;
    mc->queue_max = 64;
    mc->max_running = 32;
    if (get_str(m, "name", path, mc->name, sizeof mc->name, err) ||
        get_str(m, "path", path, mc->path, sizeof mc->path, err) ||
        get_str(m, "tokenizer", path, mc->tokenizer, sizeof mc->tokenizer, err) ||
        get_str(m, "backend", path, mc->backend, sizeof mc->backend, err) ||
        get_str(m, "reasoning_parser", path, mc->reasoning_parser, sizeof mc->reasoning_parser, err) ||
        get_str(m, "tool_parser", path, mc->tool_parser, sizeof mc->tool_parser, err))
        return -1;
    mr_chat_format fmt;
    if (mr_chat_format_resolve(NULL, mc->reasoning_parser, mc->tool_parser, &fmt, err))
        return mr_err_wrap(err, "models[%d]", idx);
    if (!mc->name[0])
        return mr_errf(err, "%sname: required", path);
    /* the template text that replaces the GGUF's tokenizer.chat_template */
    json_t *ct = json_object_get(m, "chat_template");
    if (ct && !json_is_null(ct)) {
        if (!json_is_string(ct) || json_string_length(ct) == 0)
            return mr_errf(err, "%schat_template: expected a non-empty string (the template text)", path);
        mc->chat_template = strdup(json_string_value(ct));
        if (!mc->chat_template)
            return mr_errf(err, "out of memory");
    }
    if (strcmp(mc->tokenizer, "gguf") && strcmp(mc->tokenizer, "bytes"))
        return mr_errf(err, "%stokenizer: \"%s\" is not one of gguf, bytes", path, mc->tokenizer);
    if (get_u32(m, "context_length", path, 16, 1 << 24, &mc->context_length, err))
        return -1;
    if (get_u32(m, "max_tokens_default", path, 1, 1 << 24, &mc->max_tokens_default, err))
        return -1;
    if (get_u32(m, "queue_max", path, 0, 1 << 20, &mc->queue_max, err))
        return -1;
    if (get_u32(m, "max_running", path, 1, 1 << 16, &mc->max_running, err))
        return -1;
    json_t *ws = json_object_get(m, "workers");
    if (!json_is_array(ws) || json_array_size(ws) == 0 || json_array_size(ws) > MR_MAX_WORKERS)
        return mr_errf(err, "%sworkers: expected an array of 1..%d workers", path, MR_MAX_WORKERS);
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w)
    {
        char wp[96];
        snprintf(wp, sizeof wp, "%sworkers[%zu].", path, i);
        if (!json_is_object(w))
            return mr_errf(err, "%s: expected an object", wp);
        mr_worker_conf *wc = &mc->workers[i];
        wc->device = -1;
        if (get_str(w, "listen", wp, wc->url, sizeof wc->url, err))
            return -1;
        if (!wc->url[0])
            return mr_errf(err, "%slisten: required (e.g. \"ipc:///run/memra/w0.sock\")", wp);
        if (strncmp(wc->url, "ipc://", 6) && strncmp(wc->url, "tcp://", 6))
            return mr_errf(err, "%slisten: \"%s\" must start with ipc:// or tcp://", wp, wc->url);
        if (get_i32(w, "device", wp, -1, 255, &wc->device, err))
            return -1;
    }
    mc->n_workers = (int)json_array_size(ws);
    json_t *args = json_object_get(m, "worker_args");
    if (args && !json_is_null(args)) {
        if (!json_is_array(args) || json_array_size(args) > MR_MAX_WORKER_ARGS)
            return mr_errf(err, "%sworker_args: expected an array of at most %d strings", path, MR_MAX_WORKER_ARGS);
        json_t *a;
        json_array_foreach(args, i, a)
        {
            if (!json_is_string(a))
                return mr_errf(err, "%sworker_args[%zu]: expected a string", path, i);
            mc->worker_args[mc->n_worker_args++] = strdup(json_string_value(a));
        }
    }
    if (!strcmp(mc->tokenizer, "gguf") && !mc->path[0])
        return mr_errf(err, "%spath: required (the GGUF file) unless tokenizer is \"bytes\"", path);
    return 0;
}

static int parse_root(json_t *root, mr_config *c, mr_err *err)
{
    if (!json_is_object(root))
        return mr_errf(err, "top level: expected an object");
    char listen[300] = "";
    if (get_str(root, "listen", "", listen, sizeof listen, err))
        return -1;
    if (listen[0] && parse_listen(listen, c, err))
        return -1;
    long long v = (long long)c->max_body_bytes;
    if (get_int(root, "max_body_bytes", "", 1024, 1ll << 30, &v, err))
        return -1;
    c->max_body_bytes = (uint64_t)v;
    if (get_i32(root, "request_timeout_ms", "", 100, 3600000, &c->request_timeout_ms, err))
        return -1;
    if (get_i32(root, "drain_timeout_ms", "", 0, 3600000, &c->drain_timeout_ms, err))
        return -1;
    if (get_i32(root, "stream_keepalive_ms", "", 0, 3600000, &c->stream_keepalive_ms, err))
        return -1;
    if (c->stream_keepalive_ms > 0 && c->stream_keepalive_ms < 100)
        return mr_errf(err, "stream_keepalive_ms: 0 (off) or 100 .. 3600000, got %d", c->stream_keepalive_ms);
    if (get_i32(root, "retry_after_s", "", 1, 60, &c->retry_after_s, err))
        return -1;
    if (get_str(root, "keyring", "", c->keyring, sizeof c->keyring, err) ||
        get_bool(root, "supervise", "", &c->supervise, err) ||
        get_str(root, "worker_bin", "", c->worker_bin, sizeof c->worker_bin, err))
        return -1;
    if (get_i32(root, "restart_backoff_min_ms", "", 10, 600000, &c->backoff_min_ms, err))
        return -1;
    if (get_i32(root, "restart_backoff_max_ms", "", 10, 600000, &c->backoff_max_ms, err))
        return -1;
    if (c->backoff_max_ms < c->backoff_min_ms)
        return mr_errf(err, "restart_backoff_max_ms: must be >= restart_backoff_min_ms");
    json_t *t = json_object_get(root, "tenants");
    if (t && !json_is_null(t)) {
        if (!json_is_object(t) || json_object_size(t) > MR_MAX_TENANTS)
            return mr_errf(err, "tenants: expected an object of at most %d tenants", MR_MAX_TENANTS);
        const char *name;
        json_t *tv;
        json_object_foreach(t, name, tv)
        {
            char tp[100];
            snprintf(tp, sizeof tp, "tenants.%.64s.", name);
            if (!json_is_object(tv))
                return mr_errf(err, "tenants.%s: expected an object", name);
            v = 0;
            if (get_int(tv, "max_concurrency", tp, 1, 1000000, &v, err))
                return -1;
            if (!strcmp(name, "*")) {
                c->default_tenant_max = (int)v;
                continue;
            }
            if (!mr_tenant_valid(name))
                return mr_errf(err, "tenants: \"%s\" is not a valid tenant name", name);
            mr_tenant_conf *tc = &c->tenants[c->n_tenants++];
            snprintf(tc->name, sizeof tc->name, "%s", name);
            tc->max_concurrency = (int)v;
        }
    }
    json_t *ms = json_object_get(root, "models");
    if (!json_is_array(ms) || json_array_size(ms) == 0 || json_array_size(ms) > MR_MAX_MODELS)
        return mr_errf(err, "models: expected an array of 1..%d models", MR_MAX_MODELS);
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m)
    {
        c->n_models = (int)i + 1;
        if (parse_model(m, (int)i, &c->models[i], err))
            return -1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->models[j].name, c->models[i].name))
                return mr_errf(err, "models[%zu].name: \"%s\" is already used by models[%zu]", i,
                               c->models[i].name, j);
    }
    return 0;
}

int mr_config_parse(const char *text, mr_config *c, mr_err *err)
{
    mr_config_defaults(c);
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return mr_errf(err, "line %d column %d: %s", je.line, je.column, je.text);
    int rc = parse_root(root, c, err);
    json_decref(root);
    return rc;
}

int mr_config_load(const char *path, mr_config *c, mr_err *err)
{
    size_t len;
    char *text = mr_file_read_max(path, 16u << 20, &len, err);
    if (!text)
        return mr_err_wrap(err, "config");
    int rc = mr_config_parse(text, c, err);
    free(text);
    if (rc)
        return mr_err_wrap(err, "config %s", path);
    return 0;
}

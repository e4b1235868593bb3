#include "proto/msg.h"

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/mpk.h"

static const char *const type_names[] = {
    [MR_MSG_NONE] = "none",         [MR_MSG_HELLO] = "hello",   [MR_MSG_REQUEST] = "request",
    [MR_MSG_CANCEL] = "cancel",     [MR_MSG_TOKENS] = "tokens", [MR_MSG_FINAL] = "final",
    [MR_MSG_ERROR] = "error",       [MR_MSG_CAP_QUERY] = "cap_query",
    [MR_MSG_CAPACITY] = "capacity",
};
static const char *const finish_names[] = {"stop", "length", "cancelled"};

const char *mr_msg_type_name(enum mr_msg_type t)
{
    return (unsigned)t <= MR_MSG_CAPACITY ? type_names[t] : "?";
}

const char *mr_finish_name(enum mr_finish f)
{
    return (unsigned)f <= MR_FINISH_CANCELLED ? finish_names[f] : "?";
}

void mr_sampling_init(mr_sampling *s)
{
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
}

void mr_msg_init(mr_msg *m, enum mr_msg_type type, uint64_t id)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    m->version = MR_PROTO_VERSION;
    m->id = id;
    mr_sampling_init(&m->samp);
    m->max_tokens = 1;
}

void mr_msg_free(mr_msg *m)
{
    free(m->tokens);
    free(m->grammar);
    free(m->stop_ids);
    free(m->logprobs);
    free(m->top_ids);
    free(m->top_lps);
    enum mr_msg_type t = m->type;
    uint64_t id = m->id;
    mr_msg_init(m, t, id);
}

void mr_msg_make_error(mr_msg *m, uint64_t id, const char *code, const char *fmt, ...)
{
    mr_msg_init(m, MR_MSG_ERROR, id);
    snprintf(m->code, sizeof m->code, "%s", code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->text, sizeof m->text, fmt, ap);
    va_end(ap);
}

static bool in(double v, double lo, double hi) { return v >= lo && v <= hi; }

int mr_msg_validate(const mr_msg *m, mr_err *err)
{
    if (m->type <= MR_MSG_NONE || m->type > MR_MSG_CAPACITY)
        return mr_errf(err, "message: unknown type %d", (int)m->type);
    const char *tn = mr_msg_type_name(m->type);
    if (m->version != MR_PROTO_VERSION)
        return mr_errf(err, "%s: protocol version %u, expected %u", tn, m->version, MR_PROTO_VERSION);
    switch (m->type) {
    case MR_MSG_REQUEST: {
        const mr_sampling *s = &m->samp;
        if (m->id == 0)
            return mr_errf(err, "request: id must be non-zero");
        if (m->n_tokens == 0 || m->n_tokens > MR_MSG_MAX_TOKENS || !m->tokens)
            return mr_errf(err, "request %llu: %u prompt tokens, expected 1..%u", (unsigned long long)m->id,
                           m->n_tokens, MR_MSG_MAX_TOKENS);
        if (m->max_tokens == 0)
            return mr_errf(err, "request %llu: max_tokens must be >= 1", (unsigned long long)m->id);
        if (!in(s->temperature, 0, 2) || !(s->top_p > 0 && s->top_p <= 1) || !in(s->min_p, 0, 1) ||
            !in(s->presence_penalty, -2, 2) || !in(s->frequency_penalty, -2, 2) ||
            !(s->repetition_penalty > 0 && s->repetition_penalty <= 10) ||
            s->top_logprobs > MR_MSG_MAX_TOP_LOGPROBS)
            return mr_errf(err, "request %llu: sampling parameter out of range", (unsigned long long)m->id);
        if (m->n_stop_ids > MR_MSG_MAX_STOP_IDS)
            return mr_errf(err, "request %llu: %u stop ids, at most %u", (unsigned long long)m->id,
                           m->n_stop_ids, MR_MSG_MAX_STOP_IDS);
        if (m->grammar && strlen(m->grammar) > MR_MSG_MAX_GRAMMAR)
            return mr_errf(err, "request %llu: grammar longer than %u bytes", (unsigned long long)m->id,
                           MR_MSG_MAX_GRAMMAR);
        break;
    }
    case MR_MSG_CANCEL:
    case MR_MSG_FINAL:
        if (m->id == 0)
            return mr_errf(err, "%s: id must be non-zero", tn);
        if (m->type == MR_MSG_FINAL && (unsigned)m->finish > MR_FINISH_CANCELLED)
            return mr_errf(err, "final: bad finish reason %d", (int)m->finish);
        break;
    case MR_MSG_TOKENS:
        if (m->id == 0)
            return mr_errf(err, "tokens: id must be non-zero");
        if (m->n_tokens == 0 || m->n_tokens > MR_MSG_MAX_TOKENS || !m->tokens)
            return mr_errf(err, "tokens %llu: %u ids, expected 1..%u", (unsigned long long)m->id, m->n_tokens,
                           MR_MSG_MAX_TOKENS);
        if (m->n_top > MR_MSG_MAX_TOP_LOGPROBS)
            return mr_errf(err, "tokens %llu: %u top logprobs, at most %u", (unsigned long long)m->id, m->n_top,
                           MR_MSG_MAX_TOP_LOGPROBS);
        if (m->n_top && (!m->top_ids || !m->top_lps))
            return mr_errf(err, "tokens %llu: n_top without top arrays", (unsigned long long)m->id);
        break;
    case MR_MSG_ERROR:
        if (!m->code[0])
            return mr_errf(err, "error: empty code");
        break;
    default:
        break;
    }
    return 0;
}

/* ---- encode ---- */

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pk_key(msgpack_packer *pk, const char *k) { pk_str(pk, k); }

static void pk_u32s(msgpack_packer *pk, const uint32_t *v, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(pk, v[i]);
}

static void pk_f32s(msgpack_packer *pk, const float *v, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_float(pk, v[i]);
}

#define KU(k, v) (pk_key(&pk, k), msgpack_pack_uint64(&pk, (v)))
#define KF(k, v) (pk_key(&pk, k), msgpack_pack_float(&pk, (v)))
#define KS(k, v) (pk_key(&pk, k), pk_str(&pk, (v)))
#define KB(k, v) (pk_key(&pk, k), (v) ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk))

/* Remembers a failed write (out of memory) of the underlying sink. */
struct sink {
    mr_msg_write_fn write;
    void *data;
    bool failed;
};

static int sink_write(void *data, const char *buf, size_t len)
{
    struct sink *o = data;
    if (!o->failed && o->write(o->data, buf, len))
        o->failed = true;
    return o->failed ? -1 : 0;
}

int mr_msg_pack(const mr_msg *m, mr_msg_write_fn write, void *data, mr_err *err)
{
    if (mr_msg_validate(m, err))
        return mr_err_wrap(err, "encode");
    struct sink out = {write, data, false};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &out, sink_write);
    const mr_sampling *s = &m->samp;
    size_t n = 3;
    switch (m->type) {
    case MR_MSG_HELLO: n += 5; break;
    case MR_MSG_REQUEST:
        n += 16 + (m->grammar != NULL) + (m->n_stop_ids > 0) + (s->has_seed ? 1 : 0) + (m->session[0] != 0);
        break;
    case MR_MSG_TOKENS: n += 1 + (m->logprobs != NULL) + (m->n_top ? 3 : 0); break;
    case MR_MSG_FINAL: n += 4; break;
    case MR_MSG_ERROR: n += 2; break;
    case MR_MSG_CAPACITY: n += 12; break;
    default: break;
    }
    msgpack_pack_map(&pk, n);
    KU("v", m->version);
    KS("type", mr_msg_type_name(m->type));
    KU("id", m->id);
    switch (m->type) {
    case MR_MSG_HELLO:
        KS("model", m->model);
        KU("n_ctx", m->n_ctx);
        KU("n_vocab", m->n_vocab);
        KU("pid", m->pid);
        pk_key(&pk, "device");
        msgpack_pack_int32(&pk, m->device);
        break;
    case MR_MSG_REQUEST:
        pk_key(&pk, "tokens");
        pk_u32s(&pk, m->tokens, m->n_tokens);
        KU("max_tokens", m->max_tokens);
        KF("temperature", s->temperature);
        KF("top_p", s->top_p);
        KF("min_p", s->min_p);
        KF("presence_penalty", s->presence_penalty);
        KF("frequency_penalty", s->frequency_penalty);
        KF("repetition_penalty", s->repetition_penalty);
        KU("top_k", s->top_k);
        if (s->has_seed)
            KU("seed", s->seed);
        KB("logprobs", s->logprobs);
        KU("top_logprobs", s->top_logprobs);
        KS("tenant", m->tenant);
        KS("cache_salt", m->cache_salt);
        if (m->session[0])
            KS("session", m->session);
        if (m->grammar)
            KS("grammar", m->grammar);
        if (m->n_stop_ids) {
            pk_key(&pk, "stop_ids");
            pk_u32s(&pk, m->stop_ids, m->n_stop_ids);
        }
        /* limits the worker enforces on its side too */
        KU("prompt_len", m->n_tokens);
        KU("max_total", (uint64_t)m->n_tokens + m->max_tokens);
        /* reserved for the scheduler issue; sent so old workers skip them */
        KU("priority", 0);
        break;
    case MR_MSG_TOKENS:
        pk_key(&pk, "ids");
        pk_u32s(&pk, m->tokens, m->n_tokens);
        if (m->logprobs) {
            pk_key(&pk, "logprobs");
            pk_f32s(&pk, m->logprobs, m->n_tokens);
        }
        if (m->n_top) {
            KU("n_top", m->n_top);
            pk_key(&pk, "top_ids");
            pk_u32s(&pk, m->top_ids, (size_t)m->n_tokens * m->n_top);
            pk_key(&pk, "top_lps");
            pk_f32s(&pk, m->top_lps, (size_t)m->n_tokens * m->n_top);
        }
        break;
    case MR_MSG_FINAL:
        KS("finish", mr_finish_name(m->finish));
        KU("prompt_tokens", m->prompt_tokens);
        KU("completion_tokens", m->completion_tokens);
        KU("cached_tokens", m->cached_tokens);
        break;
    case MR_MSG_ERROR:
        KS("code", m->code);
        KS("message", m->text);
        break;
    case MR_MSG_CAPACITY:
        KU("kv_free", m->kv_free);
        KU("kv_total", m->kv_total);
        KU("running", m->running);
        KU("queued", m->queued);
        KU("vram_free", m->vram_free);
        KU("vram_total", m->vram_total);
        KU("block_tokens", m->block_tokens);
        KU("cache_blocks", m->cache_blocks);
        KU("cache_capacity", m->cache_capacity);
        KU("cache_prompt_tokens", m->cache_prompt_tokens);
        KU("cache_hit_tokens", m->cache_hit_tokens);
        KU("cache_evictions", m->cache_evictions);
        break;
    default:
        break;
    }
    if (out.failed)
        return mr_errf(err, "encode %s: out of memory", mr_msg_type_name(m->type));
    return 0;
}

int mr_msg_encode(const mr_msg *m, void **out, size_t *out_len, mr_err *err)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (mr_msg_pack(m, msgpack_sbuffer_write, &sb, err)) {
        msgpack_sbuffer_destroy(&sb);
        return -1;
    }
    *out = sb.data; /* ownership passes to the caller (malloc'd by sbuffer) */
    *out_len = sb.size;
    if (!*out) {
        *out = malloc(1);
        if (!*out)
            return mr_errf(err, "encode: out of memory");
    }
    return 0;
}

/* ---- decode ---- */

enum key {
    K_V, K_TYPE, K_ID, K_TOKENS, K_IDS, K_MAX_TOKENS, K_TEMPERATURE, K_TOP_P, K_MIN_P, K_PRESENCE,
    K_FREQUENCY, K_REPETITION, K_TOP_K, K_SEED, K_LOGPROBS, K_TOP_LOGPROBS, K_TENANT, K_SALT, K_GRAMMAR,
    K_STOP_IDS, K_N_TOP, K_TOP_IDS, K_TOP_LPS, K_FINISH, K_PROMPT_TOKENS, K_COMPLETION_TOKENS,
    K_CACHED_TOKENS, K_CODE, K_MESSAGE, K_KV_FREE, K_KV_TOTAL, K_RUNNING, K_QUEUED, K_VRAM_FREE,
    K_VRAM_TOTAL, K_MODEL, K_N_CTX, K_N_VOCAB, K_PID, K_DEVICE, K_SESSION, K_BLOCK_TOKENS, K_CACHE_BLOCKS,
    K_CACHE_CAPACITY, K_CACHE_PROMPT, K_CACHE_HIT, K_CACHE_EVICTIONS, K_COUNT
};
static const char *const key_names[K_COUNT] = {
    "v", "type", "id", "tokens", "ids", "max_tokens", "temperature", "top_p", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "top_k", "seed", "logprobs", "top_logprobs", "tenant",
    "cache_salt", "grammar", "stop_ids", "n_top", "top_ids", "top_lps", "finish", "prompt_tokens",
    "completion_tokens", "cached_tokens", "code", "message", "kv_free", "kv_total", "running", "queued",
    "vram_free", "vram_total", "model", "n_ctx", "n_vocab", "pid", "device", "session", "block_tokens",
    "cache_blocks", "cache_capacity", "cache_prompt_tokens", "cache_hit_tokens", "cache_evictions",
};

static int find_key(const char *s, uint32_t n)
{
    for (int k = 0; k < K_COUNT; k++)
        if (strlen(key_names[k]) == n && memcmp(key_names[k], s, n) == 0)
            return k;
    return -1;
}

static int rd_u64(mr_mpk *r, const char *k, uint64_t max, uint64_t *v, mr_err *err)
{
    if (mr_mpk_uint(r, v, err))
        return mr_err_wrap(err, "field %s", k);
    if (*v > max)
        return mr_errf(err, "field %s: %llu exceeds %llu", k, (unsigned long long)*v, (unsigned long long)max);
    return 0;
}

static int rd_u32(mr_mpk *r, const char *k, uint32_t *v, mr_err *err)
{
    uint64_t u;
    if (rd_u64(r, k, UINT32_MAX, &u, err))
        return -1;
    *v = (uint32_t)u;
    return 0;
}

static int rd_f32(mr_mpk *r, const char *k, float *v, mr_err *err)
{
    double d;
    if (mr_mpk_num(r, &d, err))
        return mr_err_wrap(err, "field %s", k);
    if (fabs(d) > 1e30)
        return mr_errf(err, "field %s: %g out of range", k, d);
    *v = (float)d;
    return 0;
}

static int rd_strbuf(mr_mpk *r, const char *k, char *dst, size_t cap, mr_err *err)
{
    const char *s;
    uint32_t n;
    if (mr_mpk_str(r, &s, &n, err))
        return mr_err_wrap(err, "field %s", k);
    if (n >= cap)
        return mr_errf(err, "field %s: %u bytes, at most %zu", k, n, cap - 1);
    if (memchr(s, 0, n))
        return mr_errf(err, "field %s: contains a NUL byte", k);
    memcpy(dst, s, n);
    dst[n] = 0;
    return 0;
}

static int rd_u32s(mr_mpk *r, const char *k, uint32_t max, uint32_t **out, uint32_t *n_out, mr_err *err)
{
    uint32_t n;
    if (mr_mpk_array(r, &n, err))
        return mr_err_wrap(err, "field %s", k);
    if (n > max)
        return mr_errf(err, "field %s: %u entries, at most %u", k, n, max);
    uint32_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return mr_errf(err, "field %s: out of memory", k);
    for (uint32_t i = 0; i < n; i++)
        if (rd_u32(r, k, &v[i], err)) {
            free(v);
            return -1;
        }
    free(*out);
    *out = v;
    *n_out = n;
    return 0;
}

static int rd_f32s(mr_mpk *r, const char *k, uint32_t max, float **out, uint32_t *n_out, mr_err *err)
{
    uint32_t n;
    if (mr_mpk_array(r, &n, err))
        return mr_err_wrap(err, "field %s", k);
    if (n > max)
        return mr_errf(err, "field %s: %u entries, at most %u", k, n, max);
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return mr_errf(err, "field %s: out of memory", k);
    for (uint32_t i = 0; i < n; i++) {
        double d;
        if (mr_mpk_num(r, &d, err)) {
            free(v);
            return mr_err_wrap(err, "field %s[%u]", k, i);
        }
        /* logprobs are <= 0; -inf is sent as a very negative finite value */
        if (d > 0 || d < -1e30) {
            free(v);
            return mr_errf(err, "field %s[%u]: %g is not a log-probability", k, i, d);
        }
        v[i] = (float)d;
    }
    free(*out);
    *out = v;
    *n_out = n;
    return 0;
}

static int rd_field(mr_mpk *r, mr_msg *m, int k, uint32_t *n_lps, uint32_t *n_top_ids, uint32_t *n_top_lps,
                    mr_err *err)
{
    const char *kn = key_names[k];
    mr_sampling *s = &m->samp;
    uint64_t u;
    switch (k) {
    case K_V: return rd_u32(r, kn, &m->version, err);
    case K_TYPE: {
        const char *t;
        uint32_t n;
        if (mr_mpk_str(r, &t, &n, err))
            return mr_err_wrap(err, "field type");
        for (int i = MR_MSG_HELLO; i <= MR_MSG_CAPACITY; i++)
            if (strlen(type_names[i]) == n && memcmp(type_names[i], t, n) == 0) {
                m->type = (enum mr_msg_type)i;
                return 0;
            }
        return mr_errf(err, "unknown message type \"%.*s\"", (int)(n > 32 ? 32 : n), t);
    }
    case K_ID: return rd_u64(r, kn, UINT64_MAX, &m->id, err);
    case K_TOKENS:
    case K_IDS: return rd_u32s(r, kn, MR_MSG_MAX_TOKENS, &m->tokens, &m->n_tokens, err);
    case K_MAX_TOKENS: return rd_u32(r, kn, &m->max_tokens, err);
    case K_TEMPERATURE: return rd_f32(r, kn, &s->temperature, err);
    case K_TOP_P: return rd_f32(r, kn, &s->top_p, err);
    case K_MIN_P: return rd_f32(r, kn, &s->min_p, err);
    case K_PRESENCE: return rd_f32(r, kn, &s->presence_penalty, err);
    case K_FREQUENCY: return rd_f32(r, kn, &s->frequency_penalty, err);
    case K_REPETITION: return rd_f32(r, kn, &s->repetition_penalty, err);
    case K_TOP_K: return rd_u32(r, kn, &s->top_k, err);
    case K_SEED:
        s->has_seed = true;
        return rd_u64(r, kn, UINT64_MAX, &s->seed, err);
    case K_LOGPROBS: return mr_mpk_bool(r, &s->logprobs, err) ? mr_err_wrap(err, "field logprobs") : 0;
    case K_TOP_LOGPROBS:
        if (rd_u64(r, kn, MR_MSG_MAX_TOP_LOGPROBS, &u, err))
            return -1;
        s->top_logprobs = (uint32_t)u;
        return 0;
    case K_TENANT: return rd_strbuf(r, kn, m->tenant, sizeof m->tenant, err);
    case K_SALT: return rd_strbuf(r, kn, m->cache_salt, sizeof m->cache_salt, err);
    case K_SESSION: return rd_strbuf(r, kn, m->session, sizeof m->session, err);
    case K_BLOCK_TOKENS: return rd_u64(r, kn, 1u << 20, &m->block_tokens, err);
    case K_CACHE_BLOCKS: return rd_u64(r, kn, UINT64_MAX, &m->cache_blocks, err);
    case K_CACHE_CAPACITY: return rd_u64(r, kn, UINT64_MAX, &m->cache_capacity, err);
    case K_CACHE_PROMPT: return rd_u64(r, kn, UINT64_MAX, &m->cache_prompt_tokens, err);
    case K_CACHE_HIT: return rd_u64(r, kn, UINT64_MAX, &m->cache_hit_tokens, err);
    case K_CACHE_EVICTIONS: return rd_u64(r, kn, UINT64_MAX, &m->cache_evictions, err);
    case K_GRAMMAR: {
        const char *g;
        uint32_t n;
        if (mr_mpk_str(r, &g, &n, err))
            return mr_err_wrap(err, "field grammar");
        if (n > MR_MSG_MAX_GRAMMAR || memchr(g, 0, n))
            return mr_errf(err, "field grammar: too long or contains NUL");
        free(m->grammar);
        m->grammar = malloc(n + 1);
        if (!m->grammar)
            return mr_errf(err, "field grammar: out of memory");
        memcpy(m->grammar, g, n);
        m->grammar[n] = 0;
        return 0;
    }
    case K_STOP_IDS: return rd_u32s(r, kn, MR_MSG_MAX_STOP_IDS, &m->stop_ids, &m->n_stop_ids, err);
    case K_N_TOP:
        if (rd_u64(r, kn, MR_MSG_MAX_TOP_LOGPROBS, &u, err))
            return -1;
        m->n_top = (uint32_t)u;
        return 0;
    case K_TOP_IDS:
        return rd_u32s(r, kn, MR_MSG_MAX_TOKENS, &m->top_ids, n_top_ids, err);
    case K_TOP_LPS: return rd_f32s(r, kn, MR_MSG_MAX_TOKENS, &m->top_lps, n_top_lps, err);
    case K_FINISH: {
        const char *f;
        uint32_t n;
        if (mr_mpk_str(r, &f, &n, err))
            return mr_err_wrap(err, "field finish");
        for (int i = 0; i <= MR_FINISH_CANCELLED; i++)
            if (strlen(finish_names[i]) == n && memcmp(finish_names[i], f, n) == 0) {
                m->finish = (enum mr_finish)i;
                return 0;
            }
        return mr_errf(err, "field finish: unknown reason \"%.*s\"", (int)(n > 32 ? 32 : n), f);
    }
    case K_PROMPT_TOKENS: return rd_u32(r, kn, &m->prompt_tokens, err);
    case K_COMPLETION_TOKENS: return rd_u32(r, kn, &m->completion_tokens, err);
    case K_CACHED_TOKENS: return rd_u32(r, kn, &m->cached_tokens, err);
    case K_CODE: return rd_strbuf(r, kn, m->code, sizeof m->code, err);
    case K_MESSAGE: return rd_strbuf(r, kn, m->text, sizeof m->text, err);
    case K_KV_FREE: return rd_u64(r, kn, UINT64_MAX, &m->kv_free, err);
    case K_KV_TOTAL: return rd_u64(r, kn, UINT64_MAX, &m->kv_total, err);
    case K_RUNNING: return rd_u64(r, kn, UINT64_MAX, &m->running, err);
    case K_QUEUED: return rd_u64(r, kn, UINT64_MAX, &m->queued, err);
    case K_VRAM_FREE: return rd_u64(r, kn, UINT64_MAX, &m->vram_free, err);
    case K_VRAM_TOTAL: return rd_u64(r, kn, UINT64_MAX, &m->vram_total, err);
    case K_MODEL: return rd_strbuf(r, kn, m->model, sizeof m->model, err);
    case K_N_CTX: return rd_u32(r, kn, &m->n_ctx, err);
    case K_N_VOCAB: return rd_u32(r, kn, &m->n_vocab, err);
    case K_PID: return rd_u32(r, kn, &m->pid, err);
    case K_DEVICE: {
        int64_t d;
        if (mr_mpk_int(r, &d, err))
            return mr_err_wrap(err, "field device");
        if (d < -1 || d > 4096)
            return mr_errf(err, "field device: %lld out of range", (long long)d);
        m->device = (int32_t)d;
        return 0;
    }
    }
    return mr_errf(err, "internal: key %d", k);
}

int mr_msg_decode(const void *buf, size_t len, mr_msg *m, uint64_t *id_out, mr_err *err)
{
    mr_msg_init(m, MR_MSG_NONE, 0);
    m->version = 0;
    if (id_out)
        *id_out = 0;
    if (len > MR_MSG_MAX_BYTES)
        return mr_errf(err, "message of %zu bytes exceeds %u", len, MR_MSG_MAX_BYTES);
    mr_mpk r;
    mr_mpk_init(&r, buf, len);
    uint32_t n;
    if (mr_mpk_map(&r, &n, err))
        return mr_err_wrap(err, "message");
    uint64_t seen = 0;
    uint32_t n_lps = 0, n_top_ids = 0, n_top_lps = 0;
    float *lps = NULL;
    for (uint32_t i = 0; i < n; i++) {
        const char *ks;
        uint32_t kl;
        if (mr_mpk_str(&r, &ks, &kl, err)) {
            mr_err_wrap(err, "message key %u", i);
            goto fail;
        }
        int k = find_key(ks, kl);
        if (k < 0) {
            if (mr_mpk_skip(&r, 16, err)) {
                mr_err_wrap(err, "unknown field \"%.*s\"", (int)(kl > 32 ? 32 : kl), ks);
                goto fail;
            }
            continue;
        }
        if (seen & (1ull << k)) {
            mr_errf(err, "duplicate field %s", key_names[k]);
            goto fail;
        }
        seen |= 1ull << k;
        int rc;
        if (k == K_LOGPROBS && r.off < r.len && ((r.p[r.off] & 0xf0) == 0x90 || r.p[r.off] == 0xdc ||
                                                  r.p[r.off] == 0xdd))
            rc = rd_f32s(&r, "logprobs", MR_MSG_MAX_TOKENS, &lps, &n_lps, err); /* tokens: array form */
        else
            rc = rd_field(&r, m, k, &n_lps, &n_top_ids, &n_top_lps, err);
        if (rc)
            goto fail;
        if (k == K_ID && id_out)
            *id_out = m->id;
    }
    if (r.off != r.len) {
        mr_errf(err, "message: %zu trailing bytes", r.len - r.off);
        goto fail;
    }
    if (!(seen & (1ull << K_TYPE))) {
        mr_errf(err, "message: no type field");
        goto fail;
    }
    if (!(seen & (1ull << K_V))) {
        mr_errf(err, "%s: no protocol version", mr_msg_type_name(m->type));
        goto fail;
    }
    /* required fields per type */
    uint64_t req = 0;
    switch (m->type) {
    case MR_MSG_REQUEST: req = 1ull << K_ID | 1ull << K_TOKENS | 1ull << K_MAX_TOKENS; break;
    case MR_MSG_CANCEL: req = 1ull << K_ID; break;
    case MR_MSG_TOKENS: req = 1ull << K_ID | 1ull << K_IDS; break;
    case MR_MSG_FINAL: req = 1ull << K_ID | 1ull << K_FINISH; break;
    case MR_MSG_ERROR: req = 1ull << K_CODE; break;
    case MR_MSG_HELLO: req = 1ull << K_MODEL | 1ull << K_N_CTX; break;
    default: break;
    }
    for (int k = 0; k < K_COUNT; k++)
        if ((req & (1ull << k)) && !(seen & (1ull << k))) {
            mr_errf(err, "%s: missing field %s", mr_msg_type_name(m->type), key_names[k]);
            goto fail;
        }
    if (m->type == MR_MSG_TOKENS) {
        if (lps) {
            if (n_lps != m->n_tokens) {
                mr_errf(err, "tokens: %u logprobs for %u ids", n_lps, m->n_tokens);
                goto fail;
            }
            m->logprobs = lps;
            lps = NULL;
        }
        if (m->n_top) {
            uint64_t want = (uint64_t)m->n_top * m->n_tokens;
            if (!m->top_ids || !m->top_lps || n_top_ids != want || n_top_lps != want) {
                mr_errf(err, "tokens: top arrays must hold n_top * ids = %llu entries", (unsigned long long)want);
                goto fail;
            }
        } else if (m->top_ids || m->top_lps) {
            mr_errf(err, "tokens: top arrays without n_top");
            goto fail;
        }
    }
    free(lps);
    lps = NULL;
    if (mr_msg_validate(m, err))
        goto fail;
    return 0;
fail:
    free(lps);
    mr_msg_free(m);
    return -1;
}

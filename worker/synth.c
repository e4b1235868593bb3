/* Synthetic model writer: metadata as the upstream converter writes it for
 * qwen3 / qwen3moe, tensors in the upstream order, random weights streamed
 * by the GGUF writer's threaded fill path.  Every chunk of every tensor is
 * generated from its own PRNG stream seeded by (seed, tensor, offset), so
 * the file does not depend on the thread count. */
#include "worker/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "common/half.h"

const mr_synth_model mr_synth_presets[] = {
    /* Qwen3-8B */
    {.name = "qwen3-8b-q4km", .arch = "qwen3", .n_layer = 36, .n_embd = 4096, .n_head = 32,
     .n_head_kv = 8, .head_dim = 128, .n_ff = 12288, .n_vocab = 151936, .n_ctx = 40960,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* Qwen3-30B-A3B */
    {.name = "qwen3-30b-a3b-q4km", .arch = "qwen3moe", .n_layer = 48, .n_embd = 2048,
     .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_ff = 6144, .n_vocab = 151936,
     .n_ctx = 40960, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768,
     .norm_topk_prob = true, .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* the shapes of the tiny fixture models, for tests */
    {.name = "tiny-qwen3", .arch = "qwen3", .n_layer = 2, .n_embd = 256, .n_head = 4,
     .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_vocab = 1024, .n_ctx = 4096,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    {.name = "tiny-qwen3moe", .arch = "qwen3moe", .n_layer = 2, .n_embd = 256, .n_head = 4,
     .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_vocab = 1024, .n_ctx = 4096,
     .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 256, .norm_topk_prob = true,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    {.name = NULL},
};

const mr_synth_model *mr_synth_find(const char *name)
{
    for (const mr_synth_model *m = mr_synth_presets; m->name; m++)
        if (strcmp(m->name, name) == 0)
            return m;
    return NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

enum mr_type mr_synth_tensor_type(const char *name)
{
    if (ends_with(name, "norm.weight") || ends_with(name, "ffn_gate_inp.weight"))
        return MR_TYPE_F32;
    if (strcmp(name, "output.weight") == 0)
        return MR_TYPE_Q6_K;
    int il;
    if (sscanf(name, "blk.%d.", &il) == 1 && il % 2 == 0 &&
        (ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight") ||
         ends_with(name, ".ffn_down_exps.weight")))
        return MR_TYPE_Q6_K;
    return MR_TYPE_Q4_K;
}

/* ---- random blocks ---- */

typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x = a ^ (b * 0xd1b54a32d192ed03ull) ^ (c * 0x8cb92ba72f3d8dd7ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
static inline uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* uniform in [0, 1) */
static inline float rng_unif(rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

static void fill_random(rng *r, uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(r);
        memcpy(p + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = rng_next(r);
        memcpy(p + i, &v, n - i);
    }
}

/* Q4_K: 256 weights as 8 sub-blocks of 32, w = d*sc*q - dmin*m with 4-bit q
 * and 6-bit sc, m.  m is chosen so each sub-block is centred (m*dmin ~
 * 7.5*d*sc), so w ~ d*sc*(q - 7.5): std = d*sc*4.6 ~ 0.02. */
#define Q4K_BYTES 144
static void gen_q4_k(rng *r, uint8_t *b)
{
    float d = 9.0e-5f * (0.75f + 0.5f * rng_unif(r));
    float dmin = 8.0f * d;
    uint16_t hd = mr_f32_to_f16(d), hm = mr_f32_to_f16(dmin);
    memcpy(b, &hd, 2);
    memcpy(b + 2, &hm, 2);
    uint8_t sc[8], m[8];
    uint64_t bits = rng_next(r);
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(32 + ((bits >> (5 * j)) & 31));     /* 32..63 */
        m[j] = (uint8_t)((sc[j] * 15 + 8) / 16);              /* 7.5/8 of sc, <= 60 */
    }
    uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    fill_random(r, b + 16, 128);
}

/* Q6_K: 256 weights as 16 sub-blocks of 16, w = d*scale*(q - 32) with a
 * 6-bit q and an int8 scale: std = d*scale*18.5 ~ 0.02. */
#define Q6K_BYTES 210
static void gen_q6_k(rng *r, uint8_t *b)
{
    fill_random(r, b, 192); /* ql[128], qh[64] */
    uint64_t bits = rng_next(r);
    for (int j = 0; j < 16; j++)
        b[192 + j] = (uint8_t)(8 + ((bits >> (3 * j)) & 7)); /* 8..15 */
    float d = 9.5e-5f * (0.75f + 0.5f * rng_unif(r));
    uint16_t hd = mr_f32_to_f16(d);
    memcpy(b + 208, &hd, 2);
}

typedef struct synth_ctx {
    uint64_t seed;
} synth_ctx;

static int synth_fill(void *vctx, const mr_gguf_tensor *t, uint64_t index, size_t off, void *dst,
                      size_t len, mr_err *err)
{
    const synth_ctx *c = vctx;
    rng r;
    rng_seed(&r, c->seed, index + 1, off);
    uint8_t *p = dst;
    switch (t->type) {
    case MR_TYPE_Q4_K:
        for (size_t i = 0; i < len; i += Q4K_BYTES)
            gen_q4_k(&r, p + i);
        return 0;
    case MR_TYPE_Q6_K:
        for (size_t i = 0; i < len; i += Q6K_BYTES)
            gen_q6_k(&r, p + i);
        return 0;
    case MR_TYPE_F32: {
        bool router = ends_with(t->name, "ffn_gate_inp.weight");
        for (size_t i = 0; i + 4 <= len; i += 4) {
            float u = rng_unif(&r) - 0.5f;
            /* router: uniform with std 0.02; norms: 1 +- 0.05 */
            float v = router ? u * 0.0693f : 1.0f + u * 0.1f;
            memcpy(p + i, &v, 4);
        }
        return 0;
    }
    default:
        return mr_errf(err, "synth: no generator for type %s", mr_type_name(t->type));
    }
}

/* ---- metadata and tensors ---- */

static int copy_tokenizer(mr_gguf_writer *w, const mr_synth_model *m, const char *path,
                          mr_err *err)
{
    mr_gguf *v;
    if (mr_gguf_open(path, &v, err))
        return mr_err_wrap(err, "synth: --vocab");
    const mr_gguf_kv *toks;
    int rc = -1;
    if (mr_gguf_get_arr(v, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, err)) {
        mr_err_wrap(err, "synth: %s", path);
        goto out;
    }
    if (toks->v.arr.n != m->n_vocab) {
        mr_errf(err, "synth: %s has %llu tokens, %s needs %u", path,
                (unsigned long long)toks->v.arr.n, m->name, m->n_vocab);
        goto out;
    }
    for (uint64_t i = 0; i < v->n_kv; i++) {
        const mr_gguf_kv *kv = &v->kv[i];
        if (kv->key.len > 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0 &&
            mr_gguf_writer_copy_kv(w, kv))
            goto out;
    }
    rc = 0;
out:
    mr_gguf_close(v);
    return rc;
}

/* A minimal byte-level vocabulary: the 256 byte tokens in GPT-2's
 * byte-to-character mapping, unused fillers, and the two Qwen specials at
 * the end as end-of-text and padding. */
static int minimal_tokenizer(mr_gguf_writer *w, const mr_synth_model *m)
{
    uint32_t n = m->n_vocab;
    if (n < 258)
        return -1;
    char **toks = calloc(n, sizeof *toks);
    int32_t *types = calloc(n, sizeof *types);
    int rc = -1;
    if (!toks || !types)
        goto out;
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        uint32_t cp = self ? b : 256 + extra++;
        char *s = malloc(4);
        if (!s)
            goto out;
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xc0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3f));
            s[2] = 0;
        }
        toks[b] = s;
        types[b] = 1; /* normal */
    }
    for (uint32_t i = 256; i < n; i++) {
        const char *special = i == n - 2 ? "<|endoftext|>" : i == n - 1 ? "<|im_end|>" : NULL;
        char buf[32];
        if (!special)
            snprintf(buf, sizeof buf, "[PAD%u]", i);
        toks[i] = strdup(special ? special : buf);
        if (!toks[i])
            goto out;
        types[i] = special ? 3 : 5; /* control, unused */
    }
    rc = mr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") |
         mr_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2") |
         mr_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, n) |
         mr_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", MR_GGUF_INT32, types, n) |
         mr_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, 0) |
         mr_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", n - 1) |
         mr_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", n - 2) |
         mr_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
out:
    if (toks)
        for (uint32_t i = 0; i < n; i++)
            free(toks[i]);
    free(toks);
    free(types);
    return rc ? -1 : 0;
}

static int add_metadata(mr_gguf_writer *w, const mr_synth_model *m)
{
    char k[128];
    int rc = 0;
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, m->arch), k)
    rc |= mr_gguf_writer_set_str(w, "general.architecture", m->arch);
    rc |= mr_gguf_writer_set_str(w, "general.type", "model");
    rc |= mr_gguf_writer_set_str(w, "general.name", m->name);
    rc |= mr_gguf_writer_set_u32(w, KEY("block_count"), m->n_layer);
    rc |= mr_gguf_writer_set_u32(w, KEY("context_length"), m->n_ctx);
    rc |= mr_gguf_writer_set_u32(w, KEY("embedding_length"), m->n_embd);
    rc |= mr_gguf_writer_set_u32(w, KEY("feed_forward_length"), m->n_ff);
    rc |= mr_gguf_writer_set_u32(w, KEY("attention.head_count"), m->n_head);
    rc |= mr_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), m->n_head_kv);
    rc |= mr_gguf_writer_set_f32(w, KEY("rope.freq_base"), m->rope_theta);
    rc |= mr_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), m->rms_eps);
    if (m->n_expert) {
        rc |= mr_gguf_writer_set_u32(w, KEY("expert_count"), m->n_expert);
        rc |= mr_gguf_writer_set_u32(w, KEY("expert_used_count"), m->n_expert_used);
    }
    rc |= mr_gguf_writer_set_u32(w, KEY("attention.key_length"), m->head_dim);
    rc |= mr_gguf_writer_set_u32(w, KEY("attention.value_length"), m->head_dim);
    if (m->n_expert) {
        rc |= mr_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), m->n_ff_exp);
        rc |= mr_gguf_writer_set_bool(w, KEY("expert_weights_norm"), m->norm_topk_prob);
    }
#undef KEY
    return rc ? -1 : 0;
}

static int add_tensor(mr_gguf_writer *w, const char *name, uint32_t nd, int64_t a, int64_t b,
                      int64_t c)
{
    int64_t ne[3] = {a, b, c};
    return mr_gguf_writer_add_tensor(w, name, mr_synth_tensor_type(name), nd, ne, NULL);
}

/* Tensors in the order upstream files list them: output, output_norm,
 * token_embd, then each layer's tensors sorted by name. */
static int add_tensors(mr_gguf_writer *w, const mr_synth_model *m)
{
    int rc = 0;
    int64_t E = m->n_embd, V = m->n_vocab, Q = (int64_t)m->n_head * m->head_dim,
            KV = (int64_t)m->n_head_kv * m->head_dim, D = m->head_dim;
    rc |= add_tensor(w, "output.weight", 2, E, V, 1);
    rc |= add_tensor(w, "output_norm.weight", 1, E, 1, 1);
    rc |= add_tensor(w, "token_embd.weight", 2, E, V, 1);
    for (uint32_t il = 0; il < m->n_layer; il++) {
        char n[96];
#define T(suffix, nd, a, b, c) (snprintf(n, sizeof n, "blk.%u." suffix, il), add_tensor(w, n, nd, a, b, c))
        rc |= T("attn_k.weight", 2, E, KV, 1);
        rc |= T("attn_k_norm.weight", 1, D, 1, 1);
        rc |= T("attn_norm.weight", 1, E, 1, 1);
        rc |= T("attn_output.weight", 2, Q, E, 1);
        rc |= T("attn_q.weight", 2, E, Q, 1);
        rc |= T("attn_q_norm.weight", 1, D, 1, 1);
        rc |= T("attn_v.weight", 2, E, KV, 1);
        if (m->n_expert) {
            int64_t F = m->n_ff_exp, X = m->n_expert;
            rc |= T("ffn_down_exps.weight", 3, F, E, X);
            rc |= T("ffn_gate_exps.weight", 3, E, F, X);
            rc |= T("ffn_gate_inp.weight", 2, E, X, 1);
            rc |= T("ffn_norm.weight", 1, E, 1, 1);
            rc |= T("ffn_up_exps.weight", 3, E, F, X);
        } else {
            int64_t F = m->n_ff;
            rc |= T("ffn_down.weight", 2, F, E, 1);
            rc |= T("ffn_gate.weight", 2, E, F, 1);
            rc |= T("ffn_norm.weight", 1, E, 1, 1);
            rc |= T("ffn_up.weight", 2, E, F, 1);
        }
#undef T
    }
    return rc ? -1 : 0;
}

int mr_synth_write(const mr_synth_model *m, const char *path, const mr_synth_opts *opts,
                   mr_synth_stats *stats, mr_err *err)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mr_gguf_writer *w = mr_gguf_writer_new();
    if (!w)
        return mr_errf(err, "synth: out of memory");
    int rc = -1;
    if (add_metadata(w, m))
        goto werr;
    if (opts && opts->vocab_path) {
        if (copy_tokenizer(w, m, opts->vocab_path, err))
            goto out;
    } else if (minimal_tokenizer(w, m)) {
        mr_errf(err, "synth: %s: cannot build a tokenizer for %u tokens", m->name, m->n_vocab);
        goto out;
    }
    if (mr_gguf_writer_set_u32(w, "general.quantization_version", 2) ||
        mr_gguf_writer_set_u32(w, "general.file_type", 15) /* MOSTLY_Q4_K_M */ ||
        add_tensors(w, m))
        goto werr;
    synth_ctx c = {.seed = opts ? opts->seed : 0};
    if (mr_gguf_writer_write_file(w, path, synth_fill, &c, opts ? opts->n_threads : 0, err))
        goto out;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (stats) {
        mr_gguf *g;
        /* the size and count as a reader sees them */
        if (mr_gguf_open(path, &g, err))
            goto out;
        stats->bytes = g->size;
        stats->n_tensors = g->n_tensors;
        stats->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        mr_gguf_close(g);
    }
    rc = 0;
    goto out;
werr:
    mr_errf(err, "synth: %s", mr_gguf_writer_error(w) ? mr_gguf_writer_error(w) : "bad model description");
out:
    mr_gguf_writer_free(w);
    return rc;
}

/* Synthetic model writer: metadata as the upstream converter writes it for
 * qwen3 / qwen3moe / qwen35 / qwen35moe, tensors in the order of the
 * upstream tool that would have written the file, random weights streamed
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
#include "worker/sample.h"

/* Geometry of the full-size presets, from the public model configs
 * (Hugging Face config.json of each model; for the hybrids the
 * `text_config`, whose defaults in transformers' Qwen3_5MoeTextConfig are
 * the 35B-A3B's).  GGUF keys as the upstream converter derives them:
 * ssm.state_size = linear_key_head_dim, ssm.group_count =
 * linear_num_key_heads, ssm.time_step_rank = linear_num_value_heads,
 * ssm.inner_size = linear_num_value_heads * linear_value_head_dim,
 * rope.dimension_count = head_dim * partial_rotary_factor, block_count =
 * num_hidden_layers + mtp_num_hidden_layers. */
const mr_synth_model mr_synth_presets[] = {
    /* Qwen3-8B */
    {.name = "qwen3-8b-q4km", .arch = "qwen3", .recipe = MR_SYNTH_Q4_K_M, .n_layer = 36,
     .n_embd = 4096, .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 12288,
     .n_vocab = 151936, .n_ctx = 40960, .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* Qwen3-30B-A3B */
    {.name = "qwen3-30b-a3b-q4km", .arch = "qwen3moe", .recipe = MR_SYNTH_Q4_K_M, .n_layer = 48,
     .n_embd = 2048, .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_ff = 6144,
     .n_vocab = 151936, .n_ctx = 40960, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768,
     .rope_theta = 1e6f, .rms_eps = 1e-6f},
    /* Qwen3.6-35B-A3B (Qwen/Qwen3.6-35B-A3B; the same text model as
     * Qwen3.5-35B-A3B): hidden_size 2048, 40 layers, full attention every
     * 4th, 16 q / 2 kv heads of head_dim 256, Gated DeltaNet 32 value /
     * 16 key heads of dim 128, conv kernel 4, 256 experts, 8 routed + 1
     * shared, moe_intermediate_size 512, shared_expert_intermediate_size
     * 512, vocab 248,320 (padded), max_position_embeddings 262,144,
     * rope_theta 1e7, partial_rotary_factor 0.25 (64 of 256 dims), mrope
     * sections [11, 11, 10], rms_norm_eps 1e-6, one MTP layer.
     * feed_forward_length: the converter copies intermediate_size when the
     * config has one (the fixture's does); no qwen35moe tensor uses it, so
     * it is written as the expert width for loaders that expect the key. */
    {.name = "qwen3.6-35b-a3b-iq4xs", .arch = "qwen35moe", .recipe = MR_SYNTH_IQ4_XS,
     .n_layer = 40, .n_embd = 2048, .n_head = 16, .n_head_kv = 2, .head_dim = 256, .n_ff = 512,
     .n_vocab = 248320, .n_ctx = 262144, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512,
     .n_ff_shexp = 512, .rope_theta = 1e7f, .rms_eps = 1e-6f, .full_attn_interval = 4,
     .n_nextn = 1, .n_rot = 64, .rope_sections = {11, 11, 10, 0}, .ssm_conv_kernel = 4,
     .ssm_state = 128, .ssm_groups = 16, .ssm_dt_rank = 32, .ssm_inner = 32 * 128},
    /* Qwen3.5-9B (Qwen/Qwen3.5-9B): hidden_size 4096, 32 layers, full
     * attention every 4th, 16 q / 4 kv heads of head_dim 256,
     * intermediate_size 12288, Gated DeltaNet 32 value / 16 key heads of
     * dim 128 (conv dim 2*16*128 + 32*128 = 8192), conv kernel 4, vocab
     * 248,320, max_position_embeddings 262,144, rope_theta 1e7, 64 rotary
     * dims in sections [11, 11, 10], rms_norm_eps 1e-6, one MTP layer. */
    {.name = "qwen3.5-9b", .arch = "qwen35", .recipe = MR_SYNTH_Q8_0, .n_layer = 32,
     .n_embd = 4096, .n_head = 16, .n_head_kv = 4, .head_dim = 256, .n_ff = 12288,
     .n_vocab = 248320, .n_ctx = 262144, .rope_theta = 1e7f, .rms_eps = 1e-6f,
     .full_attn_interval = 4, .n_nextn = 1, .n_rot = 64, .rope_sections = {11, 11, 10, 0},
     .ssm_conv_kernel = 4, .ssm_state = 128, .ssm_groups = 16, .ssm_dt_rank = 32,
     .ssm_inner = 32 * 128},
    /* the shapes of the tiny fixture models, for tests */
    {.name = "tiny-qwen3", .arch = "qwen3", .recipe = MR_SYNTH_Q4_K_M, .n_layer = 2,
     .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_vocab = 1024,
     .n_ctx = 4096, .rope_theta = 1e6f, .rms_eps = 1e-6f},
    {.name = "tiny-qwen3moe", .arch = "qwen3moe", .recipe = MR_SYNTH_Q4_K_M, .n_layer = 2,
     .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_vocab = 1024,
     .n_ctx = 4096, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 256, .rope_theta = 1e6f,
     .rms_eps = 1e-6f},
    {.name = "tiny-qwen35", .arch = "qwen35", .recipe = MR_SYNTH_Q8_0, .n_layer = 4,
     .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_vocab = 1024,
     .n_ctx = 4096, .rope_theta = 1e6f, .rms_eps = 1e-6f, .full_attn_interval = 4,
     .n_nextn = 1, .n_rot = 16, .rope_sections = {11, 11, 10, 0}, .ssm_conv_kernel = 4,
     .ssm_state = 64, .ssm_groups = 2, .ssm_dt_rank = 4, .ssm_inner = 4 * 64},
    {.name = "tiny-qwen35moe", .arch = "qwen35moe", .recipe = MR_SYNTH_IQ4_XS, .n_layer = 4,
     .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64, .n_ff = 512, .n_vocab = 1024,
     .n_ctx = 4096, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 256, .n_ff_shexp = 256,
     .rope_theta = 1e6f, .rms_eps = 1e-6f, .full_attn_interval = 4, .n_nextn = 1, .n_rot = 16,
     .rope_sections = {11, 11, 10, 0}, .ssm_conv_kernel = 4, .ssm_state = 64, .ssm_groups = 2,
     .ssm_dt_rank = 4, .ssm_inner = 4 * 64},
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

/* What upstream never quantizes: norms, routers, the shared-expert gate,
 * the Gated DeltaNet decay/step/convolution tensors. */
static bool kept_f32(const char *name)
{
    return ends_with(name, "norm.weight") || ends_with(name, "ffn_gate_inp.weight") ||
           ends_with(name, "ffn_gate_inp_shexp.weight") || ends_with(name, ".ssm_a") ||
           ends_with(name, ".ssm_dt.bias") || ends_with(name, ".ssm_conv1d.weight");
}

enum mr_type mr_synth_tensor_type(const mr_synth_model *m, const char *name)
{
    if (kept_f32(name))
        return MR_TYPE_F32;
    switch (m->recipe) {
    case MR_SYNTH_Q8_0:
        return MR_TYPE_Q8_0;
    case MR_SYNTH_IQ4_XS:
        return strcmp(name, "output.weight") == 0 ? MR_TYPE_Q6_K : MR_TYPE_IQ4_XS;
    case MR_SYNTH_Q4_K_M:
    default:
        break;
    }
    if (strcmp(name, "output.weight") == 0)
        return MR_TYPE_Q6_K;
    int il;
    if (sscanf(name, "blk.%d.", &il) == 1 && il % 2 == 0 &&
        (ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight") ||
         ends_with(name, ".ffn_down_exps.weight")))
        return MR_TYPE_Q6_K;
    return MR_TYPE_Q4_K;
}

static uint32_t file_type(const mr_synth_model *m)
{
    /* upstream llama_ftype values */
    switch (m->recipe) {
    case MR_SYNTH_Q8_0:
        return 7;  /* MOSTLY_Q8_0 */
    case MR_SYNTH_IQ4_XS:
        return 30; /* MOSTLY_IQ4_XS */
    default:
        return 15; /* MOSTLY_Q4_K_M */
    }
}

/* ---- random blocks ---- */

typedef mr_rng rng; /* xoshiro256** (worker/sample.h) */

static void rng_seed(rng *r, uint64_t a, uint64_t b, uint64_t c)
{
    mr_rng_seed(r, a ^ (b * 0xd1b54a32d192ed03ull) ^ (c * 0x8cb92ba72f3d8dd7ull));
}

#define rng_next mr_rng_next

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

/* IQ4_XS: 256 weights as 8 sub-blocks of 32, w = d*(ls - 32)*K[q] with
 * K the 16-level code book (mean -5.9, std 66.7 over uniform q).  The
 * sub-block factor ls - 32 is +-2..5 with a random sign, so the code
 * book's offset cancels across sub-blocks: std = d*3.67*66.7 ~ 0.02. */
#define IQ4XS_BYTES 136
static void gen_iq4_xs(rng *r, uint8_t *b)
{
    float d = 8.1e-5f * (0.75f + 0.5f * rng_unif(r));
    uint16_t hd = mr_f32_to_f16(d), sh = 0;
    uint8_t sl[4] = {0};
    uint64_t bits = rng_next(r);
    for (int j = 0; j < 8; j++) {
        int mag = 2 + (int)((bits >> (2 * j)) & 3);
        int ls = (bits >> (16 + j)) & 1 ? 32 - mag : 32 + mag;
        sl[j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
        sh |= (uint16_t)(((ls >> 4) & 3) << (2 * j));
    }
    memcpy(b, &hd, 2);
    memcpy(b + 2, &sh, 2);
    memcpy(b + 4, sl, 4);
    fill_random(r, b + 8, 128);
}

/* Q8_0: 32 weights, w = d*q with an int8 q (std 73.9): std ~ 0.02. */
#define Q80_BYTES 34
static void gen_q8_0(rng *r, uint8_t *b)
{
    float d = 2.7e-4f * (0.75f + 0.5f * rng_unif(r));
    uint16_t hd = mr_f32_to_f16(d);
    memcpy(b, &hd, 2);
    fill_random(r, b + 2, 32);
}

/* F32 tensors by role: norms (and the Gated DeltaNet step bias, which
 * transformers initialises to ones) 1 +- 0.05; ssm_a, stored by upstream
 * as -exp(A_log), log-uniform in [-16, -1]; routers, the shared-expert
 * gate and the short convolution uniform with std 0.02. */
static float f32_value(const char *name, rng *r)
{
    float u = rng_unif(r);
    if (ends_with(name, ".ssm_a"))
        return -expf(u * 2.7725887f); /* ln 16 */
    if (ends_with(name, "norm.weight") || ends_with(name, ".ssm_dt.bias"))
        return 1.0f + (u - 0.5f) * 0.1f;
    return (u - 0.5f) * 0.0693f;
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
    case MR_TYPE_IQ4_XS:
        for (size_t i = 0; i < len; i += IQ4XS_BYTES)
            gen_iq4_xs(&r, p + i);
        return 0;
    case MR_TYPE_Q8_0:
        for (size_t i = 0; i < len; i += Q80_BYTES)
            gen_q8_0(&r, p + i);
        return 0;
    case MR_TYPE_F32:
        for (size_t i = 0; i + 4 <= len; i += 4) {
            float v = f32_value(t->name, &r);
            memcpy(p + i, &v, 4);
        }
        return 0;
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

/* Q8_0 files are laid out as the converter writes them, the others as
 * llama-quantize does (see synth.h). */
static bool converter_layout(const mr_synth_model *m) { return m->recipe == MR_SYNTH_Q8_0; }

/* The architecture keys, in the order and with the types the upstream
 * converter writes them. */
static int add_arch_keys(mr_gguf_writer *w, const mr_synth_model *m)
{
    char k[128];
    int rc = 0;
    bool hybrid = m->full_attn_interval != 0;
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, m->arch), k)
    rc |= mr_gguf_writer_set_u32(w, KEY("block_count"), m->n_layer + m->n_nextn);
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
    if (converter_layout(m))
        rc |= mr_gguf_writer_set_u32(w, "general.file_type", file_type(m));
    if (m->n_expert)
        rc |= mr_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), m->n_ff_exp);
    if (m->n_ff_shexp)
        rc |= mr_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"), m->n_ff_shexp);
    if (hybrid) {
        int32_t sections[4];
        for (int i = 0; i < 4; i++)
            sections[i] = (int32_t)m->rope_sections[i];
        rc |= mr_gguf_writer_set_u32(w, KEY("nextn_predict_layers"), m->n_nextn);
        rc |= mr_gguf_writer_set_u32(w, KEY("ssm.conv_kernel"), m->ssm_conv_kernel);
        rc |= mr_gguf_writer_set_u32(w, KEY("ssm.state_size"), m->ssm_state);
        rc |= mr_gguf_writer_set_u32(w, KEY("ssm.group_count"), m->ssm_groups);
        rc |= mr_gguf_writer_set_u32(w, KEY("ssm.time_step_rank"), m->ssm_dt_rank);
        rc |= mr_gguf_writer_set_u32(w, KEY("ssm.inner_size"), m->ssm_inner);
        rc |= mr_gguf_writer_set_u32(w, KEY("full_attention_interval"), m->full_attn_interval);
        rc |= mr_gguf_writer_set_u32(w, KEY("rope.dimension_count"), m->n_rot);
        rc |= mr_gguf_writer_set_arr(w, KEY("rope.dimension_sections"), MR_GGUF_INT32, sections, 4);
    }
#undef KEY
    return rc ? -1 : 0;
}

/* ---- the tensor list ---- */

typedef struct tdesc {
    char name[64];
    int layer;         /* -1: not in a layer */
    uint32_t nd;
    int64_t ne[3];
} tdesc;

typedef struct tlist {
    tdesc *v;
    size_t n, cap;
    int layer;         /* layer of the next pushes */
    bool oom;
} tlist;

static void push(tlist *l, const char *name, uint32_t nd, int64_t a, int64_t b, int64_t c)
{
    if (l->oom)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        tdesc *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    tdesc *t = &l->v[l->n++];
    if (l->layer >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s", l->layer, name);
    else
        snprintf(t->name, sizeof t->name, "%s", name);
    t->layer = l->layer;
    t->nd = nd;
    t->ne[0] = a;
    t->ne[1] = b;
    t->ne[2] = c;
}

static void push_ffn(tlist *l, const mr_synth_model *m)
{
    int64_t E = m->n_embd;
    if (m->n_expert) {
        int64_t F = m->n_ff_exp, X = m->n_expert, S = m->n_ff_shexp;
        push(l, "ffn_down_exps.weight", 3, F, E, X);
        push(l, "ffn_gate_exps.weight", 3, E, F, X);
        push(l, "ffn_up_exps.weight", 3, E, F, X);
        push(l, "ffn_gate_inp.weight", 2, E, X, 1);
        if (S) {
            push(l, "ffn_down_shexp.weight", 2, S, E, 1);
            push(l, "ffn_gate_shexp.weight", 2, E, S, 1);
            push(l, "ffn_up_shexp.weight", 2, E, S, 1);
            /* the converter writes the [1, E] gate as [E, 1] */
            push(l, "ffn_gate_inp_shexp.weight", 2, E, 1, 1);
        }
    } else {
        int64_t F = m->n_ff;
        push(l, "ffn_down.weight", 2, F, E, 1);
        push(l, "ffn_gate.weight", 2, E, F, 1);
        push(l, "ffn_up.weight", 2, E, F, 1);
    }
}

/* Qwen3 / Qwen3-MoE layer (only ever written in name order). */
static void push_qwen3_layer(tlist *l, const mr_synth_model *m)
{
    int64_t E = m->n_embd, Q = (int64_t)m->n_head * m->head_dim,
            KV = (int64_t)m->n_head_kv * m->head_dim, D = m->head_dim;
    push(l, "attn_k.weight", 2, E, KV, 1);
    push(l, "attn_k_norm.weight", 1, D, 1, 1);
    push(l, "attn_norm.weight", 1, E, 1, 1);
    push(l, "attn_output.weight", 2, Q, E, 1);
    push(l, "attn_q.weight", 2, E, Q, 1);
    push(l, "attn_q_norm.weight", 1, D, 1, 1);
    push(l, "attn_v.weight", 2, E, KV, 1);
    push_ffn(l, m);
    push(l, "ffn_norm.weight", 1, E, 1, 1);
}

/* Hybrid layer in the converter's (checkpoint) order: a Gated DeltaNet
 * layer, or a gated full attention layer (q and its gate in one attn_q),
 * or an MTP block (a full attention layer with the nextn tensors). */
static void push_hybrid_layer(tlist *l, const mr_synth_model *m, bool full, bool nextn)
{
    int64_t E = m->n_embd, Q = (int64_t)m->n_head * m->head_dim,
            KV = (int64_t)m->n_head_kv * m->head_dim, D = m->head_dim;
    if (nextn)
        push(l, "nextn.eh_proj.weight", 2, 2 * E, E, 1);
    push(l, "attn_norm.weight", 1, E, 1, 1);
    if (!full) {
        int64_t NV = m->ssm_dt_rank;
        int64_t conv = 2 * (int64_t)m->ssm_groups * m->ssm_state + m->ssm_inner; /* q, k, v */
        push(l, "ssm_a", 1, NV, 1, 1);
        push(l, "ssm_conv1d.weight", 2, m->ssm_conv_kernel, conv, 1);
        push(l, "ssm_dt.bias", 1, NV, 1, 1);
        push(l, "ssm_alpha.weight", 2, E, NV, 1);
        push(l, "ssm_beta.weight", 2, E, NV, 1);
        push(l, "attn_qkv.weight", 2, E, conv, 1);
        push(l, "attn_gate.weight", 2, E, m->ssm_inner, 1);
        push(l, "ssm_norm.weight", 1, m->ssm_inner / NV, 1, 1);
        push(l, "ssm_out.weight", 2, m->ssm_inner, E, 1);
    }
    push_ffn(l, m);
    push(l, "post_attention_norm.weight", 1, E, 1, 1);
    if (full) {
        push(l, "attn_k_norm.weight", 1, D, 1, 1);
        push(l, "attn_k.weight", 2, E, KV, 1);
        push(l, "attn_output.weight", 2, Q, E, 1);
        push(l, "attn_q_norm.weight", 1, D, 1, 1);
        push(l, "attn_q.weight", 2, E, 2 * Q, 1);
        push(l, "attn_v.weight", 2, E, KV, 1);
    }
    if (nextn) {
        push(l, "nextn.shared_head_norm.weight", 1, E, 1, 1);
        push(l, "nextn.enorm.weight", 1, E, 1, 1);
        push(l, "nextn.hnorm.weight", 1, E, 1, 1);
    }
}

static int by_layer_then_name(const void *pa, const void *pb)
{
    const tdesc *a = pa, *b = pb;
    if (a->layer != b->layer)
        return a->layer < b->layer ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* The model's tensors in file order; 0 or -1 (out of memory). */
static int build_tensors(const mr_synth_model *m, tlist *l)
{
    memset(l, 0, sizeof *l);
    int64_t E = m->n_embd, V = m->n_vocab;
    uint32_t n_block = m->n_layer + m->n_nextn;
    l->layer = -1;
    push(l, "output.weight", 2, E, V, 1);
    push(l, "token_embd.weight", 2, E, V, 1);
    for (uint32_t il = 0; il < n_block; il++) {
        if (il == m->n_layer) {
            l->layer = -1;
            push(l, "output_norm.weight", 1, E, 1, 1);
        }
        l->layer = (int)il;
        if (!m->full_attn_interval) {
            push_qwen3_layer(l, m);
        } else {
            bool nextn = il >= m->n_layer;
            bool full = nextn || il % m->full_attn_interval == m->full_attn_interval - 1;
            push_hybrid_layer(l, m, full, nextn);
        }
    }
    if (n_block == m->n_layer) {
        l->layer = -1;
        push(l, "output_norm.weight", 1, E, 1, 1);
    }
    if (l->oom) {
        free(l->v);
        l->v = NULL;
        return -1;
    }
    if (!converter_layout(m)) {
        qsort(l->v, l->n, sizeof *l->v, by_layer_then_name);
        for (size_t i = 0; i < l->n; i++)
            while (l->v[i].nd > 1 && l->v[i].ne[l->v[i].nd - 1] == 1)
                l->v[i].nd--;
    }
    return 0;
}

uint64_t mr_synth_tensor_bytes(const mr_synth_model *m, uint64_t *n_tensors)
{
    tlist l;
    if (build_tensors(m, &l))
        return 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < l.n; i++)
        bytes += mr_row_size(mr_synth_tensor_type(m, l.v[i].name), l.v[i].ne[0]) *
                 (uint64_t)(l.v[i].ne[1] * l.v[i].ne[2]);
    if (n_tensors)
        *n_tensors = l.n;
    free(l.v);
    return bytes;
}

static int add_tensors(mr_gguf_writer *w, const mr_synth_model *m)
{
    tlist l;
    if (build_tensors(m, &l))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < l.n && !rc; i++)
        rc = mr_gguf_writer_add_tensor(w, l.v[i].name, mr_synth_tensor_type(m, l.v[i].name),
                                       l.v[i].nd, l.v[i].ne, NULL);
    free(l.v);
    return rc;
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
    if (mr_gguf_writer_set_str(w, "general.architecture", m->arch) ||
        mr_gguf_writer_set_str(w, "general.type", "model") ||
        mr_gguf_writer_set_str(w, "general.name", m->name) || add_arch_keys(w, m))
        goto werr;
    if (converter_layout(m) && mr_gguf_writer_set_u32(w, "general.quantization_version", 2))
        goto werr;
    if (opts && opts->vocab_path) {
        if (copy_tokenizer(w, m, opts->vocab_path, err))
            goto out;
    } else if (minimal_tokenizer(w, m)) {
        mr_errf(err, "synth: %s: cannot build a tokenizer for %u tokens", m->name, m->n_vocab);
        goto out;
    }
    if (!converter_layout(m) && (mr_gguf_writer_set_u32(w, "general.quantization_version", 2) ||
                                 mr_gguf_writer_set_u32(w, "general.file_type", file_type(m))))
        goto werr;
    if (add_tensors(w, m))
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

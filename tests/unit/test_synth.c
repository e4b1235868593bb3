/* Synthetic models: the tiny presets have the shapes of the tiny fixture
 * models, so their tensor names, order, shapes and arch keys are checked
 * against those upstream-written files.  Types: the hybrid fixtures' Q8_0
 * and IQ4_XS files are exactly the hybrid recipes as upstream applies them,
 * so the types must equal theirs; the qwen3 presets' Q4_K_M-like mix is
 * checked against the recipe as the benchmark issue states it.  Weights
 * through the CPU dequantizer; full-size sizes from the published shapes. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf.h"
#include "common/half.h"
#include "common/quant.h"
#include "tests/unit/testutil.h"
#include "worker/synth.h"

static char tmpdir[256];

static void make_tmpdir(void) { tmpdir_make(tmpdir, sizeof tmpdir, "synth"); }

static void rm_tmpdir(void) { tmpdir_remove(tmpdir); }

static mr_gguf *open_ok(const char *path)
{
    mr_gguf *g = NULL;
    mr_err err;
    ck_assert_msg(mr_gguf_open(path, &g, &err) == 0, "%s", err.msg);
    return g;
}

/* The Q4_K_M-like recipe, written out from the words. */
static enum mr_type recipe(const char *name)
{
    static const char *const f32[] = {"attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm",
                                      "output_norm", "ffn_gate_inp"};
    char base[64];
    int il = -1;
    if (sscanf(name, "blk.%d.%63[a-z_]", &il, base) != 2) {
        il = -1;
        sscanf(name, "%63[a-z_]", base);
    }
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
        if (strcmp(base, f32[i]) == 0)
            return MR_TYPE_F32;
    if (strcmp(base, "output") == 0)
        return MR_TYPE_Q6_K;
    if (il >= 0 && il % 2 == 0 &&
        (!strcmp(base, "attn_v") || !strcmp(base, "ffn_down") || !strcmp(base, "ffn_down_exps")))
        return MR_TYPE_Q6_K;
    return MR_TYPE_Q4_K;
}

static bool f16_finite(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return ((h >> 10) & 31) != 31;
}

/* Every block's scales are finite and every dequantized weight is finite;
 * the tensors have the intended values: norms (and the Gated DeltaNet step
 * bias) near 1, ssm_a = -exp(A_log) in [-16, -1], everything else centred
 * with a spread near 0.02.  A mean is held to 4 standard errors where the
 * tensor is too small for the fixed 0.1 sd bound. */
static void check_weights(const mr_gguf_tensor *t)
{
    const mr_type_info *ti = mr_type_get(t->type);
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t row_bytes = mr_row_size(t->type, t->ne[0]);
    size_t nblk = t->nbytes / ti->block_bytes;
    size_t bad_scale = 0;
    for (size_t b = 0; b < nblk; b++) {
        const uint8_t *blk = (const uint8_t *)t->data + b * ti->block_bytes;
        if (t->type == MR_TYPE_Q4_K)
            bad_scale += !f16_finite(blk) || !f16_finite(blk + 2);
        else if (t->type == MR_TYPE_Q6_K)
            bad_scale += !f16_finite(blk + 208);
        else if (t->type == MR_TYPE_IQ4_XS || t->type == MR_TYPE_Q8_0)
            bad_scale += !f16_finite(blk);
        else
            ck_assert_msg(t->type == MR_TYPE_F32, "%s: unexpected type %s", t->name,
                          mr_type_name(t->type));
    }
    ck_assert_msg(bad_scale == 0, "%s: %zu blocks with non-finite scales", t->name, bad_scale);
    float *row = malloc((size_t)t->ne[0] * sizeof *row);
    double sum = 0, sum2 = 0, lo = INFINITY, hi = -INFINITY;
    size_t nonfinite = 0;
    for (int64_t r = 0; r < rows; r++) {
        ck_assert_int_eq(mr_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * row_bytes,
                                           row, t->ne[0]), 0);
        for (int64_t i = 0; i < t->ne[0]; i++) {
            nonfinite += !isfinite(row[i]);
            sum += row[i];
            sum2 += (double)row[i] * row[i];
            lo = fmin(lo, row[i]);
            hi = fmax(hi, row[i]);
        }
    }
    free(row);
    ck_assert_msg(nonfinite == 0, "%s: %zu non-finite weights", t->name, nonfinite);
    double n = (double)(rows * t->ne[0]);
    double mean = sum / n, sd = sqrt(fmax(sum2 / n - mean * mean, 0.0));
    size_t len = strlen(t->name);
    bool ssm_a = len > 6 && strcmp(t->name + len - 6, ".ssm_a") == 0;
    bool unit = strstr(t->name, "norm") || strstr(t->name, "ssm_dt.bias");
    if (ssm_a) {
        ck_assert_msg(lo >= -16.0 && hi <= -1.0, "%s: [%g, %g]", t->name, lo, hi);
    } else if (unit) {
        ck_assert_msg(lo >= 0.95 && hi <= 1.05, "%s: [%g, %g]", t->name, lo, hi);
        if (n >= 256)
            ck_assert_msg(fabs(mean - 1.0) < 0.01 && sd < 0.05, "%s: mean %g sd %g", t->name, mean, sd);
    } else {
        ck_assert_msg(sd > 0.012 && sd < 0.03, "%s: sd %g", t->name, sd);
        ck_assert_msg(fabs(mean) < fmax(0.1, 4.0 / sqrt(n)) * sd, "%s: mean %g sd %g", t->name,
                      mean, sd);
    }
}

/* The keys under "ARCH." of a file, in order. */
static int arch_keys(const mr_gguf *g, const char *arch, const mr_gguf_kv **out, int cap)
{
    int n = 0;
    size_t la = strlen(arch);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const mr_gguf_kv *k = &g->kv[i];
        if (k->key.len > la && memcmp(k->key.ptr, arch, la) == 0 && k->key.ptr[la] == '.') {
            ck_assert_int_lt(n, cap);
            out[n++] = k;
        }
    }
    return n;
}

/* exact_types: the fixture is what upstream writes for the preset's
 * recipe, so the types must be the fixture's too. */
static void check_preset(const char *preset, const char *fixture, bool exact_types)
{
    make_tmpdir();
    char path[400];
    snprintf(path, sizeof path, "%s/m.gguf", tmpdir);
    const mr_synth_model *m = mr_synth_find(preset);
    ck_assert_ptr_nonnull(m);
    mr_synth_opts o = {.seed = 7, .n_threads = 2};
    mr_synth_stats st;
    mr_err err;
    ck_assert_msg(mr_synth_write(m, path, &o, &st, &err) == 0, "%s", err.msg);
    mr_gguf *g = open_ok(path);
    mr_gguf *ref = open_ok(fixture_path(fixture));
    ck_assert_uint_eq(st.bytes, g->size);
    ck_assert_uint_eq(st.n_tensors, g->n_tensors);

    /* the architecture's keys: exactly the upstream file's, in its order,
     * with its types and values */
    const mr_gguf_kv *a = mr_gguf_find(ref, "general.architecture");
    char *arch;
    ck_assert_int_eq(mr_gguf_get_str(g, "general.architecture", &arch, &err), 0);
    ck_assert_uint_eq(a->v.s.len, strlen(arch));
    ck_assert(memcmp(a->v.s.ptr, arch, strlen(arch)) == 0);
    const mr_gguf_kv *ours[64], *theirs[64];
    int n_ours = arch_keys(g, arch, ours, 64), n_theirs = arch_keys(ref, arch, theirs, 64);
    ck_assert_int_ge(n_theirs, 10);
    for (int i = 0; i < n_theirs; i++) {
        const mr_gguf_kv *rk = theirs[i];
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)rk->key.len, rk->key.ptr);
        ck_assert_msg(i < n_ours, "%s: key %s missing", preset, key);
        const mr_gguf_kv *k = ours[i];
        bool same = k->key.len == rk->key.len && memcmp(k->key.ptr, rk->key.ptr, rk->key.len) == 0;
        ck_assert_msg(same, "%s: key %d is %.*s, upstream %s", preset, i, (int)k->key.len,
                      k->key.ptr, key);
        ck_assert_msg(k->type == rk->type, "%s: key %s type", preset, key);
        if (k->type == MR_GGUF_UINT32)
            ck_assert_msg(k->v.u == rk->v.u, "%s: %s = %llu, upstream %llu", preset, key,
                          (unsigned long long)k->v.u, (unsigned long long)rk->v.u);
        else if (k->type == MR_GGUF_FLOAT32)
            ck_assert(k->v.f == rk->v.f);
        else if (k->type == MR_GGUF_ARRAY) {
            ck_assert_int_eq(k->v.arr.type, rk->v.arr.type);
            ck_assert_uint_eq(k->v.arr.n, rk->v.arr.n);
            for (uint64_t j = 0; j < k->v.arr.n; j++)
                ck_assert_int_eq(mr_gguf_arr_i64(k, j), mr_gguf_arr_i64(rk, j));
        } else
            ck_abort_msg("%s: key %s of an unexpected type", preset, key);
    }
    ck_assert_int_eq(n_ours, n_theirs);
    free(arch);
    if (exact_types) {
        uint32_t ft, rft;
        ck_assert_int_eq(mr_gguf_get_u32(g, "general.file_type", &ft, &err), 0);
        ck_assert_int_eq(mr_gguf_get_u32(ref, "general.file_type", &rft, &err), 0);
        ck_assert_uint_eq(ft, rft);
    }
    const mr_gguf_kv *toks;
    ck_assert_int_eq(mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, &err), 0);
    ck_assert_uint_eq(toks->v.arr.n, m->n_vocab);

    /* tensors: upstream's names, order and shapes; types upstream's or the recipe's */
    ck_assert_uint_eq(g->n_tensors, ref->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const mr_gguf_tensor *t = &g->tensors[i], *r = &ref->tensors[i];
        ck_assert_str_eq(t->name, r->name);
        ck_assert_uint_eq(t->n_dims, r->n_dims);
        for (int d = 0; d < MR_GGUF_MAX_DIMS; d++)
            ck_assert_int_eq(t->ne[d], r->ne[d]);
        enum mr_type want = exact_types ? r->type : recipe(t->name);
        ck_assert_msg(t->type == want, "%s: %s is %s, want %s", preset, t->name,
                      mr_type_name(t->type), mr_type_name(want));
        ck_assert_int_eq(t->type, mr_synth_tensor_type(m, t->name));
        check_weights(t);
    }
    mr_gguf_close(ref);

    /* the same seed gives the same file whatever the thread count */
    char path1[420];
    snprintf(path1, sizeof path1, "%s/m1.gguf", tmpdir);
    o.n_threads = 1;
    ck_assert_int_eq(mr_synth_write(m, path1, &o, NULL, &err), 0);
    mr_gguf *g1 = open_ok(path1);
    ck_assert_uint_eq(g1->size, g->size);
    ck_assert(memcmp(g1->base, g->base, g->size) == 0);
    mr_gguf_close(g1);
    /* and another seed gives other weights */
    o.seed = 8;
    ck_assert_int_eq(mr_synth_write(m, path1, &o, NULL, &err), 0);
    g1 = open_ok(path1);
    const mr_gguf_tensor *t0 = mr_gguf_find_tensor(g, "token_embd.weight");
    ck_assert(memcmp(mr_gguf_find_tensor(g1, "token_embd.weight")->data, t0->data, t0->nbytes) != 0);
    mr_gguf_close(g1);
    mr_gguf_close(g);
    rm_tmpdir();
}

START_TEST(tiny_qwen3) { check_preset("tiny-qwen3", "models/qwen3/model-Q4_K_M.gguf", false); }
END_TEST

START_TEST(tiny_qwen3moe) { check_preset("tiny-qwen3moe", "models/qwen3moe/model-Q4_K_M.gguf", false); }
END_TEST

/* the converter's own Q8_0 file: its layout and types */
START_TEST(tiny_qwen35) { check_preset("tiny-qwen35", "models/qwen35/model-Q8_0.gguf", true); }
END_TEST

/* llama-quantize's IQ4_XS file: its layout and types */
START_TEST(tiny_qwen35moe)
{
    check_preset("tiny-qwen35moe", "models/qwen35moe/model-IQ4_XS.gguf", true);
}
END_TEST

START_TEST(vocab_copy)
{
    make_tmpdir();
    char path[400];
    snprintf(path, sizeof path, "%s/v.gguf", tmpdir);
    mr_err err;
    /* the fixture models carry a 1024-token vocabulary: the tiny shapes take it */
    char vocab[4096];
    snprintf(vocab, sizeof vocab, "%s", fixture_path("models/qwen3/model-BF16.gguf"));
    mr_synth_opts o = {.vocab_path = vocab, .seed = 1, .n_threads = 2};
    ck_assert_msg(mr_synth_write(mr_synth_find("tiny-qwen3"), path, &o, NULL, &err) == 0, "%s",
                  err.msg);
    mr_gguf *g = open_ok(path), *v = open_ok(vocab);
    int copied = 0;
    for (uint64_t i = 0; i < v->n_kv; i++) {
        const mr_gguf_kv *vk = &v->kv[i];
        if (vk->key.len < 10 || memcmp(vk->key.ptr, "tokenizer.", 10) != 0)
            continue;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)vk->key.len, vk->key.ptr);
        const mr_gguf_kv *k = mr_gguf_find(g, key);
        ck_assert_msg(k && k->type == vk->type, "%s", key);
        if (k->type == MR_GGUF_ARRAY) {
            ck_assert_uint_eq(k->v.arr.n, vk->v.arr.n);
            for (uint64_t j = 0; k->v.arr.type == MR_GGUF_STRING && j < k->v.arr.n; j++)
                if (k->v.arr.strs[j].len != vk->v.arr.strs[j].len ||
                    memcmp(k->v.arr.strs[j].ptr, vk->v.arr.strs[j].ptr, vk->v.arr.strs[j].len))
                    ck_abort_msg("%s[%llu] differs", key, (unsigned long long)j);
        }
        copied++;
    }
    ck_assert_int_ge(copied, 8);
    mr_gguf_close(g);
    mr_gguf_close(v);
    /* a vocabulary of the wrong size is refused, naming both sizes */
    snprintf(vocab, sizeof vocab, "%s", fixture_path("vocab/qwen3-vocab.gguf"));
    ck_assert_int_eq(mr_synth_write(mr_synth_find("tiny-qwen3"), path, &o, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "151936 tokens"));
    ck_assert_ptr_nonnull(strstr(err.msg, "1024"));
    rm_tmpdir();
}
END_TEST

/* The full-size presets carry the published Qwen3 shapes. */
START_TEST(full_presets)
{
    const mr_synth_model *a = mr_synth_find("qwen3-8b-q4km");
    ck_assert_ptr_nonnull(a);
    ck_assert_str_eq(a->arch, "qwen3");
    ck_assert_uint_eq(a->n_layer, 36);
    ck_assert_uint_eq(a->n_embd, 4096);
    ck_assert_uint_eq(a->n_head, 32);
    ck_assert_uint_eq(a->n_head_kv, 8);
    ck_assert_uint_eq(a->head_dim, 128);
    ck_assert_uint_eq(a->n_ff, 12288);
    ck_assert_uint_eq(a->n_vocab, 151936);
    ck_assert_uint_eq(a->n_ctx, 40960);
    ck_assert_uint_eq(a->n_expert, 0);
    const mr_synth_model *b = mr_synth_find("qwen3-30b-a3b-q4km");
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(b->arch, "qwen3moe");
    ck_assert_uint_eq(b->n_layer, 48);
    ck_assert_uint_eq(b->n_embd, 2048);
    ck_assert_uint_eq(b->n_head, 32);
    ck_assert_uint_eq(b->n_head_kv, 4);
    ck_assert_uint_eq(b->head_dim, 128);
    ck_assert_uint_eq(b->n_expert, 128);
    ck_assert_uint_eq(b->n_expert_used, 8);
    ck_assert_uint_eq(b->n_ff_exp, 768);
    ck_assert_uint_eq(b->n_vocab, 151936);
    ck_assert_ptr_null(mr_synth_find("qwen3-9b"));
}
END_TEST

/* Bytes of n weights of a type (whole blocks). */
static double type_bytes(enum mr_type t, double n)
{
    const mr_type_info *ti = mr_type_get(t);
    return n / (double)ti->block_elems * (double)ti->block_bytes;
}

/* Qwen3.6-35B-A3B as published (hidden 2048, 40 layers, full attention
 * every 4th, 16/2 heads of 256, DeltaNet 32 v / 16 k heads of 128, conv 4,
 * 256 experts of 512, shared expert 512, vocab 248320, 262144 context, one
 * MTP layer): the preset's keys, and its size counted weight by weight from
 * those numbers: IQ4_XS everywhere, a Q6_K head, upstream's F32 tensors. */
START_TEST(qwen36_35b_a3b)
{
    const mr_synth_model *m = mr_synth_find("qwen3.6-35b-a3b-iq4xs");
    ck_assert_ptr_nonnull(m);
    ck_assert_str_eq(m->arch, "qwen35moe");
    ck_assert_int_eq(m->recipe, MR_SYNTH_IQ4_XS);
    ck_assert_uint_eq(m->n_layer, 40);
    ck_assert_uint_eq(m->n_nextn, 1);
    ck_assert_uint_eq(m->full_attn_interval, 4);
    ck_assert_uint_eq(m->n_embd, 2048);
    ck_assert_uint_eq(m->n_head, 16);
    ck_assert_uint_eq(m->n_head_kv, 2);
    ck_assert_uint_eq(m->head_dim, 256);
    ck_assert_uint_eq(m->n_rot, 64); /* partial_rotary_factor 0.25 */
    ck_assert_uint_eq(m->rope_sections[0], 11);
    ck_assert_uint_eq(m->rope_sections[1], 11);
    ck_assert_uint_eq(m->rope_sections[2], 10);
    ck_assert_uint_eq(m->rope_sections[3], 0);
    ck_assert(m->rope_theta == 1e7f);
    ck_assert_uint_eq(m->n_expert, 256);
    ck_assert_uint_eq(m->n_expert_used, 8);
    ck_assert_uint_eq(m->n_ff_exp, 512);
    ck_assert_uint_eq(m->n_ff_shexp, 512);
    ck_assert_uint_eq(m->n_vocab, 248320);
    ck_assert_uint_eq(m->n_ctx, 262144);
    ck_assert_uint_eq(m->ssm_conv_kernel, 4);
    ck_assert_uint_eq(m->ssm_state, 128);
    ck_assert_uint_eq(m->ssm_groups, 16);
    ck_assert_uint_eq(m->ssm_dt_rank, 32);
    ck_assert_uint_eq(m->ssm_inner, 32 * 128);

    double E = 2048, V = 248320, X = 256, F = 512, S = 512, QD = 16 * 256, KVD = 2 * 256;
    double NV = 32, VD = 32 * 128, conv = 2 * 16 * 128 + VD;
    double n_lin = 30, n_full = 10 + 1, n_blk = 41;
    double iq4 = E * V                                             /* token_embd */
                 + n_blk * (3 * E * F * X + 3 * E * S)             /* experts, shared expert */
                 + n_lin * (E * conv + E * VD + VD * E + 2 * E * NV) /* qkv gate out alpha beta */
                 + n_full * (E * 2 * QD + 2 * E * KVD + QD * E)    /* q+gate, k, v, o */
                 + 2 * E * E;                                      /* nextn.eh_proj */
    double f32 = E                                                 /* output_norm */
                 + n_blk * (2 * E + E * X + E)                     /* norms, router, shared gate */
                 + n_lin * (NV + NV + 4 * conv + 128)              /* ssm_a, dt, conv1d, ssm_norm */
                 + n_full * 2 * 256                                /* q/k norms */
                 + 3 * E;                                          /* nextn norms */
    double want = type_bytes(MR_TYPE_IQ4_XS, iq4) + type_bytes(MR_TYPE_Q6_K, E * V) + 4 * f32;
    uint64_t n;
    uint64_t bytes = mr_synth_tensor_bytes(m, &n);
    ck_assert_msg((double)bytes == want, "%llu bytes, counted %.0f", (unsigned long long)bytes,
                  want);
    /* 3 global tensors; per layer as in the fixture: 19 (DeltaNet), 16 (attention), +4 (MTP) */
    ck_assert_uint_eq(n, 3 + 30 * 19 + 10 * 16 + 16 + 4);
    /* the size class of the upstream IQ4_XS files of this model: 17-19 GiB */
    double gib = (double)bytes / (1024.0 * 1024 * 1024);
    ck_assert_msg(gib > 17.0 && gib < 19.0, "%.2f GiB", gib);
}
END_TEST

/* Qwen3.5-9B (hidden 4096, 32 layers, 16/4 heads of 256, FFN 12288,
 * DeltaNet 32 v / 16 k heads of 128, conv 4, vocab 248320, one MTP layer),
 * Q8_0 except upstream's F32 tensors. */
START_TEST(qwen35_9b)
{
    const mr_synth_model *m = mr_synth_find("qwen3.5-9b");
    ck_assert_ptr_nonnull(m);
    ck_assert_str_eq(m->arch, "qwen35");
    ck_assert_int_eq(m->recipe, MR_SYNTH_Q8_0);
    ck_assert_uint_eq(m->n_layer, 32);
    ck_assert_uint_eq(m->n_nextn, 1);
    ck_assert_uint_eq(m->full_attn_interval, 4);
    ck_assert_uint_eq(m->n_embd, 4096);
    ck_assert_uint_eq(m->n_head, 16);
    ck_assert_uint_eq(m->n_head_kv, 4);
    ck_assert_uint_eq(m->head_dim, 256);
    ck_assert_uint_eq(m->n_ff, 12288);
    ck_assert_uint_eq(m->n_expert, 0);
    ck_assert_uint_eq(m->n_vocab, 248320);
    ck_assert_uint_eq(m->n_rot, 64);
    ck_assert(m->rope_theta == 1e7f);
    ck_assert_uint_eq(m->rope_sections[0], 11);
    ck_assert_uint_eq(m->rope_sections[2], 10);
    ck_assert_uint_eq(m->ssm_conv_kernel, 4);
    ck_assert_uint_eq(m->ssm_state, 128);
    ck_assert_uint_eq(m->ssm_groups, 16);
    ck_assert_uint_eq(m->ssm_dt_rank, 32);
    ck_assert_uint_eq(2 * m->ssm_groups * m->ssm_state + m->ssm_inner, 8192); /* conv dim */

    double E = 4096, V = 248320, FF = 12288, QD = 16 * 256, KVD = 4 * 256;
    double NV = 32, VD = 32 * 128, conv = 8192;
    double n_lin = 24, n_full = 8 + 1, n_blk = 33;
    double q8 = 2 * E * V + n_blk * 3 * E * FF + n_lin * (E * conv + E * VD + VD * E + 2 * E * NV) +
                n_full * (E * 2 * QD + 2 * E * KVD + QD * E) + 2 * E * E;
    double f32 = E + n_blk * 2 * E + n_lin * (2 * NV + 4 * conv + 128) + n_full * 2 * 256 + 3 * E;
    uint64_t n;
    double want = type_bytes(MR_TYPE_Q8_0, q8) + 4 * f32;
    ck_assert_msg((double)mr_synth_tensor_bytes(m, &n) == want, "counted %.0f", want);
    ck_assert_uint_eq(n, 2 + 1 + 24 * 14 + 8 * 11 + 11 + 4);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synth");
    TCase *tc = tcase_create("synth");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tiny_qwen3);
    tcase_add_test(tc, tiny_qwen3moe);
    tcase_add_test(tc, tiny_qwen35);
    tcase_add_test(tc, tiny_qwen35moe);
    tcase_add_test(tc, vocab_copy);
    tcase_add_test(tc, full_presets);
    tcase_add_test(tc, qwen36_35b_a3b);
    tcase_add_test(tc, qwen35_9b);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

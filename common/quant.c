/* Type table and dispatch for the element types; the plain float types are
 * handled here, the block codecs live in quant_legacy.c, quant_k.c and
 * quant_nl.c.  Sizes and ids follow upstream ggml (include/ggml.h,
 * src/ggml-common.h). */
#include "common/quant.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "common/quant_impl.h"

static void dq_f32(const uint8_t *s, float *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = mr_bits_to_f32(mr_rd32(s + 4 * i));
}

static void dq_f16(const uint8_t *s, float *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = mr_rdf16(s + 2 * i);
}

static void dq_bf16(const uint8_t *s, float *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = mr_bf16_to_f32(mr_rd16(s + 2 * i));
}

static void qz_f32(const float *s, uint8_t *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        mr_wr32(d + 4 * i, mr_f32_to_bits(s[i]));
}

static void qz_f16(const float *s, uint8_t *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        mr_wr16(d + 2 * i, mr_f32_to_f16(s[i]));
}

static void qz_bf16(const float *s, uint8_t *d, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        mr_wr16(d + 2 * i, mr_f32_to_bf16(s[i]));
}

typedef struct type_entry {
    mr_type_info info;
    mr_dequant_fn dequant;
    mr_quant_fn quant;
} type_entry;

#define PLAIN(name, bytes) {{name, 1, bytes, true, false}, NULL, NULL}
#define SIZED(name, elems, bytes) {{name, elems, bytes, true, false}, NULL, NULL}
#define CODEC(name, elems, bytes, dq, qz) {{name, elems, bytes, true, true}, dq, qz}

static const type_entry types[MR_TYPE_COUNT] = {
    [MR_TYPE_F32] = CODEC("F32", 1, 4, dq_f32, qz_f32),
    [MR_TYPE_F16] = CODEC("F16", 1, 2, dq_f16, qz_f16),
    [MR_TYPE_BF16] = CODEC("BF16", 1, 2, dq_bf16, qz_bf16),
    [MR_TYPE_Q4_0] = CODEC("Q4_0", 32, 18, mr_dq_q4_0, mr_qz_q4_0),
    [MR_TYPE_Q4_1] = CODEC("Q4_1", 32, 20, mr_dq_q4_1, mr_qz_q4_1),
    [MR_TYPE_Q5_0] = CODEC("Q5_0", 32, 22, mr_dq_q5_0, mr_qz_q5_0),
    [MR_TYPE_Q5_1] = CODEC("Q5_1", 32, 24, mr_dq_q5_1, mr_qz_q5_1),
    [MR_TYPE_Q8_0] = CODEC("Q8_0", 32, 34, mr_dq_q8_0, mr_qz_q8_0),
    [MR_TYPE_Q8_1] = CODEC("Q8_1", 32, 36, mr_dq_q8_1, mr_qz_q8_1),
    [MR_TYPE_Q2_K] = CODEC("Q2_K", 256, 84, mr_dq_q2_k, mr_qz_q2_k),
    [MR_TYPE_Q3_K] = CODEC("Q3_K", 256, 110, mr_dq_q3_k, mr_qz_q3_k),
    [MR_TYPE_Q4_K] = CODEC("Q4_K", 256, 144, mr_dq_q4_k, mr_qz_q4_k),
    [MR_TYPE_Q5_K] = CODEC("Q5_K", 256, 176, mr_dq_q5_k, mr_qz_q5_k),
    [MR_TYPE_Q6_K] = CODEC("Q6_K", 256, 210, mr_dq_q6_k, mr_qz_q6_k),
    [MR_TYPE_Q8_K] = CODEC("Q8_K", 256, 292, mr_dq_q8_k, mr_qz_q8_k),
    [MR_TYPE_IQ2_XXS] = SIZED("IQ2_XXS", 256, 66),
    [MR_TYPE_IQ2_XS] = SIZED("IQ2_XS", 256, 74),
    [MR_TYPE_IQ3_XXS] = SIZED("IQ3_XXS", 256, 98),
    [MR_TYPE_IQ1_S] = SIZED("IQ1_S", 256, 50),
    [MR_TYPE_IQ4_NL] = CODEC("IQ4_NL", 32, 18, mr_dq_iq4_nl, mr_qz_iq4_nl),
    [MR_TYPE_IQ3_S] = SIZED("IQ3_S", 256, 110),
    [MR_TYPE_IQ2_S] = SIZED("IQ2_S", 256, 82),
    [MR_TYPE_IQ4_XS] = CODEC("IQ4_XS", 256, 136, mr_dq_iq4_xs, mr_qz_iq4_xs),
    [MR_TYPE_I8] = PLAIN("I8", 1),
    [MR_TYPE_I16] = PLAIN("I16", 2),
    [MR_TYPE_I32] = PLAIN("I32", 4),
    [MR_TYPE_I64] = PLAIN("I64", 8),
    [MR_TYPE_F64] = PLAIN("F64", 8),
    [MR_TYPE_IQ1_M] = SIZED("IQ1_M", 256, 56),
    [MR_TYPE_TQ1_0] = SIZED("TQ1_0", 256, 54),
    [MR_TYPE_TQ2_0] = SIZED("TQ2_0", 256, 66),
    [MR_TYPE_MXFP4] = CODEC("MXFP4", 32, 17, mr_dq_mxfp4, mr_qz_mxfp4),
    [MR_TYPE_NVFP4] = CODEC("NVFP4", 64, 36, mr_dq_nvfp4, mr_qz_nvfp4),
    [MR_TYPE_Q1_0] = CODEC("Q1_0", 128, 18, mr_dq_q1_0, mr_qz_q1_0),
    [MR_TYPE_Q2_0] = CODEC("Q2_0", 64, 18, mr_dq_q2_0, mr_qz_q2_0),
};

static const type_entry *entry(int type)
{
    if (type < 0 || type >= MR_TYPE_COUNT || !types[type].info.known)
        return NULL;
    return &types[type];
}

const mr_type_info *mr_type_get(int type)
{
    const type_entry *e = entry(type);
    return e ? &e->info : NULL;
}

const char *mr_type_name(int type)
{
    const type_entry *e = entry(type);
    return e ? e->info.name : "?";
}

int mr_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int t = 0; t < MR_TYPE_COUNT; t++)
        if (types[t].info.known && strcasecmp(types[t].info.name, name) == 0)
            return t;
    return -1;
}

/* Number of blocks in n elements, or -1 when n is negative or not a whole
 * number of blocks. */
static int64_t n_blocks(const type_entry *e, int64_t n)
{
    if (n < 0 || n % e->info.block_elems != 0)
        return -1;
    return n / e->info.block_elems;
}

size_t mr_row_size(int type, int64_t n)
{
    const type_entry *e = entry(type);
    if (!e)
        return 0;
    int64_t nb = n_blocks(e, n);
    if (nb < 0 || (uint64_t)nb > SIZE_MAX / e->info.block_bytes)
        return 0;
    return (size_t)nb * e->info.block_bytes;
}

int mr_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    const type_entry *e = entry(type);
    if (!e || !e->dequant)
        return -1;
    int64_t nb = n_blocks(e, n);
    if (nb < 0)
        return -1;
    e->dequant(src, dst, nb);
    return 0;
}

float mr_vec_dot(int type, const void *row, const float *x, int64_t n)
{
    const type_entry *e = entry(type);
    if (!e || !e->dequant)
        return NAN;
    int64_t nb = n_blocks(e, n);
    if (nb < 0)
        return NAN;
    const uint8_t *src = row;
    const int64_t qk = e->info.block_elems;
    double acc = 0.0;
    if (qk == 1) {
        /* plain types: every element is its own block */
        float buf[64];
        for (int64_t i = 0; i < n; i += 64) {
            int64_t m = n - i < 64 ? n - i : 64;
            e->dequant(src + (size_t)i * e->info.block_bytes, buf, m);
            for (int64_t j = 0; j < m; j++)
                acc += (double)(buf[j] * x[i + j]);
        }
        return (float)acc;
    }
    float buf[MR_QK_K];
    for (int64_t b = 0; b < nb; b++) {
        e->dequant(src + (size_t)b * e->info.block_bytes, buf, 1);
        const float *xb = x + b * qk;
        float s = 0.0f;
        for (int64_t j = 0; j < qk; j++)
            s += buf[j] * xb[j];
        acc += s;
    }
    return (float)acc;
}

size_t mr_quantize_row(int type, const float *src, void *dst, int64_t n)
{
    const type_entry *e = entry(type);
    if (!e || !e->quant)
        return 0;
    int64_t nb = n_blocks(e, n);
    if (nb < 0)
        return 0;
    e->quant(src, dst, nb);
    return (size_t)nb * e->info.block_bytes;
}

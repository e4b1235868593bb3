/* kernel-check: every op of the CUDA backend against a reference on fresh
 * random inputs at several shapes.
 *
 * References: the CPU backend (mr_backend_cpu_create) and, for every op,
 * straightforward float64 math written here; quantized weights are decoded
 * on the host by common/quant.c's mr_dequantize_row, the CPU reference that
 * the unit tests check against upstream-made fixtures.
 * Outputs are poisoned with NaN before each run, so an unwritten element
 * fails; NaN anywhere fails.  Fused ops are checked against the unfused
 * sequence, the fast matvec kernels against the generic ones
 * (MEMRA_CUDA_GENERIC=1), decode batches of experts grouped by expert bit
 * for bit against the per-pair path (MEMRA_CUDA_MOE_GROUPED=0), every row
 * of a product of 2-8 rows bit for bit against the same row alone (the
 * numerics rule on batchmates, check_batch_invariance), and a replayed
 * CUDA graph against direct runs.  Prompt-sized products run in
 * every GEMM precision (MEMRA_CUDA_GEMM f16, tf32, f32 and f16x3), each
 * against its own bound (mm_gemm_bound).  The int8-activation matvec
 * (MEMRA_CUDA_MATVEC=q8) is checked against float64 products with
 * activations quantized here from its definition, and its cost against the
 * float32 activations is printed (check_q8).
 *
 * The sample op is checked against worker/sample.c's mr_sample on the same
 * logits and uniform (check_sample_all).
 *
 * Programmatic dependent launch (MEMRA_CUDA_PDL) is checked by running
 * whole decode steps of a small model with it off and on, bit for bit
 * (check_pdl), and on with the weights' L2 prefetches of MEMRA_CUDA_L2PF
 * and with the shared experts on a side stream of the graph
 * (MEMRA_CUDA_BRANCH).
 *
 * Usage: kernel-check [seed [moe|prompt|sample|pdl|attn|merge|wide|early|loop|route|tail|xmq|xmm|xmp|xmh|xmd|hybrid|tiles|multi|glu|mm|ops|q8]]   Prints
 * a table, then ALL GREEN or FAILED; "moe" runs only the checks of the
 * grouped expert products, "prompt" only those of the prompt products (the
 * GEMM paths and their rows' bits across calls; part of "mm"), "sample"
 * only those of the sample op, "pdl" only the PDL comparison, "attn" only
 * the prompt attention (part of "ops"), "wide" only the rows a block of
 * the one-token Q4_K kernel (part of "mm"), "early" only its weight loads
 * ahead of the PDL wait (part of "mm"), "loop" only its one-wave looping
 * grid (part of "mm"), "tail" only the fused end of a
 * mixture layer, a delta-net layer's gated norm in one launch and its
 * in-projection with the convolution, then the scan with its state loaded
 * before the wait (part of "ops"), "xmq" only the expert products that
 * quantize their inputs in each block (part of "moe"), "merge" only
 * the decode attention's two merges and its batches' two grids (part of
 * "ops"), "hybrid" only the Gated
 * DeltaNet ops against the CPU, with a decode batch's convolutions and
 * scans in shared launches (part of "q8"), "route" only the routing by
 * ranks against the warp kernel (part of "ops"), "tiles" only the
 * tensor-core tiles of decode batches against one token (part of "mm"),
 * "multi" only the products that share a launch and "glu" only the
 * gate/up products with their SwiGLU (both part of "mm"), "pmulti" only
 * the prompt products joined into one GEMM (part of "mm" and "prompt"),
 * "xmm" the Q4_K and Q6_K expert products on the tensor cores (the default; every
 * other part runs with MEMRA_CUDA_XMM=0, the 22-bit dp4a kernel), "xmmt"
 * those with several row tiles a warp (MEMRA_CUDA_XMM_TPW), "xmp"
 * the prompt products of IQ4_XS on the int8 tensor cores (the default;
 * every other part runs with MEMRA_CUDA_XMP=0, the float16 and f16x3
 * kernels); "xmd" the decode batches of dense Q4_K products on the int8
 * tensor cores (the default; every other part runs with MEMRA_CUDA_XMD=0,
 * the float kernels; "pdl" also runs whole steps with them); "xmh" the
 * prompt expert products of Q4_K, Q6_K and IQ4_XS on the float16 tensor
 * cores with weights decoded in registers (the default; every other part runs with
 * MEMRA_CUDA_XMH=0, the float16 kernel of cu_gemm.cu);
 * "mm", "ops" and "q8" one third of
 * the whole each (run the three at once: their union is what no argument
 * runs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/half.h"
#include "common/quant.h"
#include "kernels/ops.h"
#include "worker/sample.h"

#ifndef MR_HAVE_CUDA
/* Built without nvcc: nothing to check (77: skipped, as without a device). */
int main(void)
{
    printf("kernel-check: built without CUDA\n");
    return 77;
}
#else
#include "kernels/cuda/cu_bench.h"


static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return rng_s;
}
static float frand(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }
static float fgauss(void)
{
    double u = ((rnd() >> 11) + 1.0) / 9007199254740993.0, v = (rnd() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static int n_fail, n_pass;
static mr_backend *gpu, *gpu_generic, *cpu, *gpu_r2, *gpu_r4, *gpu_r2_pair, *gpu_r4_pair;
static mr_backend *gpu_x24; /* the default decode kernels (22-bit where they take a product) */
static mr_backend *gpu_x3; /* MEMRA_CUDA_GEMM=f16x3: float32-grade prompt products */
static mr_backend *gpu_sg; /* small dense prompt products in float32 at any row count (cu_sgemm.cu; the
                              others: none) */
static mr_backend *gpu_attn_tc; /* MEMRA_CUDA_ATTN=tc: prompt attention on the tensor cores */
static mr_backend *gpu_attn_mix; /* MEMRA_CUDA_ATTN_TC_FROM=MIX_FROM: float32 prompt attention for a
                                    sequence's first MIX_FROM positions, the tensor cores after (the
                                    hybrids' default until run 211) */
#define MIX_FROM 4096
/* matmul paths compared: the default GPU kernels, the fast kernels with 4
 * and 2 rows per block forced, the generic GPU kernels, the CPU backend,
 * and for expert weights (n_mats > 1) the -r4/-r2 backends again with
 * decode batches of experts on the per-pair path instead of grouped by
 * expert (the grouped results must equal theirs bit for bit), and for
 * prompt-sized calls only (MR_CU_GEMM_MIN_TOKENS or more) the f16x3 GEMMs */
#define N_MM 8
static mr_backend *mm_be[N_MM];
static const char *mm_name[N_MM] = {"", "-r4", "-r2", "-generic", "-cpu", "-r4-pair", "-r2-pair", "-f16x3"};
static const bool mm_experts_only[N_MM] = {false, false, false, false, false, true, true, false};
static const bool mm_gemm_only[N_MM] = {false, false, false, false, false, false, false, true};
/* grouped and per-pair backends compared bit for bit (same R) */
static const int mm_exact[2][2] = {{1, 5}, {2, 6}};
/* Bound of the prompt path (MR_CU_GEMM_MIN_TOKENS or more: dequantize + GEMM) per
 * backend.  The GPU backends are created with MEMRA_CUDA_GEMM set: the
 * default one with f16 (the production default), -r4 with tf32, -r2 and
 * -generic with f32.  f16 and tf32 round both operands to an 11-bit
 * significand (unit roundoff 2^-11 = 4.9e-4; TF32 may truncate, 2^-10):
 * a product's relative error is about that, bound 2e-3.  f32 keeps 2e-5.
 * f16x3 (each operand a float16 high part plus a float16 low part scaled
 * by 2^11, three float16 products; kernels/cuda/cu_gemm.cu) without
 * measuring: a term W x is represented to 3 * 2^-22 at worst (W's split,
 * x's split, the dropped low x low product), ~2^-23 rms; the big product
 * W_hi x_hi is summed in the tensor cores over at most 512 columns (cuBLAS)
 * or 128 (the fused expert kernel), 32 or 8 MMA steps of 16 columns, and
 * the pieces are added in float32 with round to nearest.  Taking each MMA
 * step to truncate at most 2^-22 of its partial sum c_i, all one way (the
 * tensor cores round toward zero), a piece of s steps errs by at most
 * 2^-22 sum |c_i|, which for the random-sign terms here is ~(2/3) s 2^-22
 * of the piece: 5.1e-6 (s = 32) or 1.3e-6 (s = 8), independent of the
 * columns; the round-to-nearest adds and the representation add < 1e-6.
 * Bound 1e-5; expected ~8e-7 through cuBLAS and ~2.5e-7 fused (the same
 * model with an ulp truncated at random each step); float16 is 2e-3. */
static double mm_gemm_bound[N_MM] = {2e-3, 2e-3, 2e-5, 2e-5, 2e-5, 2e-3, 2e-5, 1e-5};
static mr_err err;

static void die(const char *what)
{
    fprintf(stderr, "kernel-check: %s: %s\n", what, err.msg);
    exit(2);
}

/* ---- device buffers ---- */
static void *dalloc(mr_backend *be, size_t n)
{
    void *p = be->alloc(be, n);
    if (!p) {
        snprintf(err.msg, sizeof err.msg, "alloc %zu bytes", n);
        die(be->name);
    }
    return p;
}
static void *dup_to(mr_backend *be, const void *h, size_t n)
{
    void *d = dalloc(be, n);
    if (be->upload(be, d, h, n, &err)) die("upload");
    return d;
}
static void poison(mr_backend *be, void *d, size_t n)
{
    unsigned char *h = malloc(n);
    memset(h, 0xff, n); /* float NaN; int32 -1 */
    if (be->upload(be, d, h, n, &err)) die("upload");
    free(h);
}
/* A CUDA backend created with var=val in the environment (var unset
 * again after); dies when it cannot be made. */
static mr_backend *backend_with(const char *var, const char *val)
{
    setenv(var, val, 1);
    mr_backend *be = mr_backend_cuda_create(0, &err);
    unsetenv(var);
    if (!be) die(var);
    return be;
}

/* The same with two variables set. */
static mr_backend *backend_with2(const char *var, const char *val, const char *var2, const char *val2)
{
    setenv(var, val, 1);
    mr_backend *be = backend_with(var2, val2);
    unsetenv(var);
    return be;
}

/* The op recorder's fusion counts so far (mr_cu_autograph_fusions). */
static mr_cu_fusions fused_ops(mr_backend *be)
{
    mr_cu_fusions f;
    mr_cu_autograph_fusions(be, &f);
    return f;
}

static void fetch(mr_backend *be, void *h, const void *d, size_t n)
{
    if (be->sync(be, &err)) die("sync");
    if (be->download(be, h, d, n, &err)) die("download");
}

/* ---- comparison ---- */
static double rel_l2(const float *a, const double *ref, size_t n, int *nan)
{
    double num = 0, den = 0;
    *nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) {
            (*nan)++;
            continue;
        }
        double d = a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* How many of the n floats of a and b differ in their bits. */
static size_t floats_differ(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], 4) != 0;
    return d;
}

static int floats_nan(const float *a, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += isnan(a[i]);
    return k;
}

/* A cache type as the lines name it. */
static const char *kv_dt_name(mr_kv_dtype dt)
{
    return dt == MR_KV_F32 ? "f32" : dt == MR_KV_F16 ? "f16" : "bf16";
}

/* 0 .. n - 1 in a random order (a KV cache's block table). */
static int32_t *shuffled_table(int n)
{
    int32_t *t = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) t[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(rnd() % (i + 1)), v = t[i];
        t[i] = t[j], t[j] = v;
    }
    return t;
}

static void report(const char *op, const char *shape, double e, int nan, double bound)
{
    int ok = nan == 0 && e <= bound;
    printf("%-14s %-44s %10.3e %9.1e %5d  %s\n", op, shape, e, bound, nan, ok ? "ok" : "FAIL");
    if (ok) n_pass++;
    else n_fail++;
}

static void report_rel(const char *op, const char *shape, const float *a, const double *ref, size_t n,
                       double bound)
{
    int nan;
    double e = rel_l2(a, ref, n, &nan);
    report(op, shape, e, nan, bound);
}

static void report_f(const char *op, const char *shape, const float *a, const float *b, size_t n,
                     double bound)
{
    double *r = calloc(n, sizeof *r);
    for (size_t i = 0; i < n; i++) r[i] = b[i];
    int nan;
    double e = rel_l2(a, r, n, &nan);
    for (size_t i = 0; i < n; i++) if (!isfinite(b[i])) nan++;
    report(op, shape, e, nan, bound);
    free(r);
}

/* The weight types checked; block sizes and names come from common/quant.h,
 * and the host reference decodes with its mr_dequantize_row (itself checked
 * against upstream-made fixtures by the unit tests). */
typedef struct { int type; const char *name; int be, bb; } tdesc;
static const int TYPE_IDS[] = {
    MR_TYPE_F32,  MR_TYPE_F16,    MR_TYPE_BF16,  MR_TYPE_Q8_0,  MR_TYPE_Q4_0, MR_TYPE_Q4_1,
    MR_TYPE_Q5_0, MR_TYPE_Q5_1,   MR_TYPE_IQ4_NL, MR_TYPE_MXFP4, MR_TYPE_NVFP4, MR_TYPE_Q2_K,
    MR_TYPE_Q3_K, MR_TYPE_Q4_K,   MR_TYPE_Q5_K,  MR_TYPE_Q6_K,  MR_TYPE_IQ4_XS,
};
#define N_TYPES ((int)(sizeof TYPE_IDS / sizeof TYPE_IDS[0]))
static tdesc TYPES[N_TYPES];

static void types_init(void)
{
    for (int i = 0; i < N_TYPES; i++) {
        const mr_type_info *ti = mr_type_get(TYPE_IDS[i]);
        if (!ti || !ti->supported) {
            snprintf(err.msg, sizeof err.msg, "type %d has no reference decoder in common/quant.c",
                     TYPE_IDS[i]);
            die("types");
        }
        TYPES[i] = (tdesc){TYPE_IDS[i], ti->name, (int)ti->block_elems, (int)ti->block_bytes};
    }
}

static const tdesc *td_of(int type)
{
    for (int i = 0; i < N_TYPES; i++)
        if (TYPES[i].type == type) return &TYPES[i];
    return NULL;
}

static void deq_row(const tdesc *td, const uint8_t *row, int64_t cols, float *out)
{
    if (mr_dequantize_row(td->type, row, out, cols)) {
        snprintf(err.msg, sizeof err.msg, "mr_dequantize_row(%s, %lld) failed", td->name, (long long)cols);
        die("reference");
    }
}

static void set_h16(uint8_t *p, float v)
{
    uint16_t h = mr_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random but valid blocks: random bits, then sane finite scales. */
static void rand_blocks(const tdesc *td, uint8_t *p, size_t nblocks)
{
    for (size_t i = 0; i < nblocks * td->bb; i++) p[i] = (uint8_t)rnd();
    for (size_t i = 0; i < nblocks; i++) {
        uint8_t *b = p + i * td->bb;
        float s = 0.002f + 0.01f * (frand() * 0.5f + 0.5f);
        switch (td->type) {
        case MR_TYPE_F32: { float v = fgauss() * 0.1f; memcpy(b, &v, 4); break; }
        case MR_TYPE_F16: set_h16(b, fgauss() * 0.1f); break;
        case MR_TYPE_BF16: { uint16_t h = mr_f32_to_bf16(fgauss() * 0.1f); b[0] = (uint8_t)h; b[1] = (uint8_t)(h >> 8); break; }
        case MR_TYPE_Q4_1: case MR_TYPE_Q5_1: set_h16(b, s * 3); set_h16(b + 2, -s * 20); break;
        case MR_TYPE_Q4_0: case MR_TYPE_Q5_0: case MR_TYPE_IQ4_NL: set_h16(b, s * 3); break;
        case MR_TYPE_Q8_0: set_h16(b, s * 0.3f); break;
        case MR_TYPE_IQ4_XS: set_h16(b, s * 0.02f); break;
        case MR_TYPE_Q4_K: case MR_TYPE_Q5_K: set_h16(b, s * 0.1f); set_h16(b + 2, s * 0.1f); break;
        case MR_TYPE_Q6_K: set_h16(b + 208, s * 0.02f); break;
        case MR_TYPE_Q2_K: set_h16(b + 80, s * 0.5f); set_h16(b + 82, s * 0.2f); break;
        case MR_TYPE_Q3_K: set_h16(b + 108, s * 0.1f); break;
        case MR_TYPE_MXFP4: b[0] = (uint8_t)(118 + rnd() % 8); break;
        case MR_TYPE_NVFP4: for (int j = 0; j < 4; j++) b[j] = (uint8_t)(0x20 + rnd() % 0x30); break;
        }
    }
}

/* A weight with random valid blocks, on the GPU (and CPU when present). */
typedef struct {
    mr_weight g, m[N_MM];
    bool loaded[N_MM];
    uint8_t *host;
    size_t bytes;
} tweight;

static void tw_make(tweight *w, const tdesc *td, int64_t cols, int64_t rows, int64_t mats)
{
    memset(w, 0, sizeof *w);
    size_t rb = (size_t)(cols / td->be) * td->bb;
    w->bytes = rb * rows * mats;
    w->host = malloc(w->bytes);
    rand_blocks(td, w->host, w->bytes / td->bb);
    mr_weight base = {td->name, td->type, cols, rows, mats, rb, NULL, NULL};
    for (int i = 0; i < N_MM; i++) {
        w->m[i] = base;
        if (!mm_be[i] || (mm_experts_only[i] && mats == 1))
            continue;
        if (mm_be[i]->weight_load(mm_be[i], &w->m[i], w->host, &err)) die("weight_load");
        w->loaded[i] = true;
    }
    w->g = w->m[0];
}

static void tw_free(tweight *w)
{
    for (int i = 0; i < N_MM; i++)
        if (w->loaded[i]) mm_be[i]->weight_release(mm_be[i], &w->m[i]);
    free(w->host);
}

/* ---- checks ---- */

static void check_get_rows(const tdesc *td, int64_t cols, int64_t rows, int n)
{
    tweight w;
    tw_make(&w, td, cols, rows, 1);
    int32_t *ids = malloc(n * 4);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % rows);
    int32_t *dids = dup_to(gpu, ids, n * 4);
    float *dout = dalloc(gpu, (size_t)n * cols * 4);
    poison(gpu, dout, (size_t)n * cols * 4);
    gpu->get_rows(gpu, &w.g, dids, n, dout);
    float *out = malloc((size_t)n * cols * 4);
    fetch(gpu, out, dout, (size_t)n * cols * 4);
    double *ref = malloc((size_t)n * cols * 8);
    float *tmp = malloc(cols * 4);
    size_t rb = w.g.row_bytes;
    for (int i = 0; i < n; i++) {
        deq_row(td, w.host + ids[i] * rb, cols, tmp);
        for (int64_t c = 0; c < cols; c++) ref[i * cols + c] = tmp[c];
    }
    int nan;
    double e = rel_l2(out, ref, (size_t)n * cols, &nan);
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d", td->name, (long long)rows, (long long)cols, n);
    report("get_rows", shape, e, nan, 0.0); /* a decode is exact */
    gpu->free(gpu, dids);
    gpu->free(gpu, dout);
    free(ids); free(out); free(ref); free(tmp);
    tw_free(&w);
}

/* ref[t][r] = row r of the host blocks (rb bytes a row) times x row t, in
 * float64 on the host-decoded weights, for n rows of x. */
static void ref_plain(const tdesc *td, const uint8_t *host, size_t rb, int64_t cols, int64_t rows, const float *x,
                      int n, double *ref)
{
    float *wr = malloc(cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        deq_row(td, host + (size_t)r * rb, cols, wr);
        for (int t = 0; t < n; t++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += (double)wr[c] * x[t * cols + c];
            ref[t * rows + r] = s;
        }
    }
    free(wr);
}

/* y = W x on the GPU (fast and generic kernels) and the CPU backend, each
 * against float64 math on the host-decoded weights. */
static void check_matmul(const tdesc *td, int64_t cols, int64_t rows, int n)
{
    tweight w;
    tw_make(&w, td, cols, rows, 1);
    size_t xn = (size_t)n * cols, yn = (size_t)n * rows;
    float *x = malloc(xn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    double *ref = calloc(yn, 8);
    ref_plain(td, w.host, w.g.row_bytes, cols, rows, x, n, ref);
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d", td->name, (long long)rows, (long long)cols, n);
    float *y = malloc(yn * 4);
    for (int bi = 0; bi < N_MM; bi++) {
        mr_backend *be = mm_be[bi];
        if (!be || !w.loaded[bi] || (mm_gemm_only[bi] && n < MR_CU_GEMM_MIN_TOKENS)) continue;
        const mr_weight *wt = &w.m[bi];
        char nm[32];
        snprintf(nm, sizeof nm, "matmul%s", mm_name[bi]);
        float *dx = dup_to(be, x, xn * 4), *dy = dalloc(be, yn * 4);
        poison(be, dy, yn * 4);
        be->matmul(be, wt, dx, dy, n);
        fetch(be, y, dy, yn * 4);
        int nan;
        double e = rel_l2(y, ref, yn, &nan);
        const double bound = n >= MR_CU_GEMM_MIN_TOKENS ? mm_gemm_bound[bi] : 2e-5;
        report(nm, shape, e, nan, bound);
        if (nan || e > bound) { /* a failure: which outputs, and does it repeat on the same data? */
            size_t bad = 0, first = yn;
            for (size_t i = 0; i < yn; i++)
                if (!(fabs(y[i] - ref[i]) <= 1e-3 * (fabs(ref[i]) + 1e-3))) {
                    bad++;
                    if (first == yn) first = i;
                }
            poison(be, dy, yn * 4);
            be->matmul(be, wt, dx, dy, n);
            fetch(be, y, dy, yn * 4);
            int nan2;
            double e2 = rel_l2(y, ref, yn, &nan2);
            printf("  (%zu of %zu outputs off, first token %zu row %zu; the same call again: %.3e, %d NaN)\n",
                   bad, yn, first / (size_t)rows, first % (size_t)rows, e2, nan2);
        }
        be->free(be, dx);
        be->free(be, dy);
    }
    free(x); free(ref); free(y);
    tw_free(&w);
}

/* Expert routings of the matmul_id checks. */
enum { ROUTE_MIX, ROUTE_RANDOM, ROUTE_ONE, ROUTE_SPREAD, ROUTE_BAD };
static const char *route_name[] = {"", " rand", " one", " spread", " bad"};

static void make_ids(int32_t *ids, int n, int k, int mats, int route)
{
    const int P = n * k;
    if (route == ROUTE_MIX) { /* overlapping neighbours */
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++) ids[t * k + j] = (int32_t)((t * 7 + j * 3 + (int)(rnd() % 2)) % mats);
        return;
    }
    if (route == ROUTE_ONE) { /* every pair on one expert */
        const int32_t e = (int32_t)(rnd() % mats);
        for (int p = 0; p < P; p++) ids[p] = e;
        return;
    }
    if (route == ROUTE_SPREAD) { /* as many experts as possible, one pair each */
        const int off = (int)(rnd() % mats);
        for (int p = 0; p < P; p++) ids[p] = (int32_t)(((int64_t)p * 37 + off) % mats);
        return;
    }
    /* a router's pick: k distinct random experts a token */
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rnd() % mats);
                dup = false;
                for (int q = 0; q < j && k <= mats; q++) dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + j] = e;
        }
    if (route == ROUTE_BAD) { /* out-of-range ids: their rows must be NaN */
        ids[0] = -1;
        ids[P / 2] = mats;
        ids[P - 1] = mats + 1000;
    }
}

/* y[t*k + j] = W[ids[t*k + j]] x[t*xs + (xs > 1 ? j : 0)] on every matmul
 * backend against float64 math on the host-decoded experts; rows of pairs
 * with an out-of-range id must be NaN (counted in the NaN column when not)
 * and the CPU backend, which rejects such ids, is left out of those. */
static void check_matmul_id_route(const tdesc *td, int64_t cols, int64_t rows, int mats, int k, int xs,
                                  int n, int route)
{
    tweight w;
    tw_make(&w, td, cols, rows, mats);
    const int P = n * k;
    size_t xn = (size_t)n * xs * cols, yn = (size_t)P * rows;
    float *x = malloc(xn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    int32_t *ids = malloc((size_t)P * 4);
    make_ids(ids, n, k, mats, route);
    bool any_bad = false;
    for (int p = 0; p < P; p++) any_bad |= ids[p] < 0 || ids[p] >= mats;
    /* each used expert decoded once */
    double *ref = calloc(yn, 8);
    float *wm = malloc((size_t)rows * cols * 4);
    for (int e = 0; e < mats; e++) {
        bool decoded = false;
        for (int p = 0; p < P; p++) {
            if (ids[p] != e) continue;
            if (!decoded) {
                for (int64_t r = 0; r < rows; r++)
                    deq_row(td, w.host + ((size_t)e * rows + r) * w.g.row_bytes, cols, wm + r * cols);
                decoded = true;
            }
            const int t = p / k, j = p % k;
            const float *xv = x + ((size_t)t * xs + (xs > 1 ? j : 0)) * cols;
            for (int64_t r = 0; r < rows; r++) {
                double sum = 0;
                for (int64_t c = 0; c < cols; c++) sum += (double)wm[r * cols + c] * xv[c];
                ref[(size_t)p * rows + r] = sum;
            }
        }
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s %dx%lldx%lld k=%d xs=%d n=%d%s", td->name, mats, (long long)rows,
             (long long)cols, k, xs, n, route_name[route]);
    float *ys[N_MM] = {0};
    for (int bi = 0; bi < N_MM; bi++) {
        mr_backend *be = mm_be[bi];
        if (!be || !w.loaded[bi] || (any_bad && be == cpu) ||
            (mm_gemm_only[bi] && n < MR_CU_GEMM_MIN_TOKENS))
            continue;
        const mr_weight *wt = &w.m[bi];
        char nm[32];
        snprintf(nm, sizeof nm, "matmul_id%s", mm_name[bi]);
        float *dx = dup_to(be, x, xn * 4), *dy = dalloc(be, yn * 4);
        int32_t *dids = dup_to(be, ids, (size_t)P * 4);
        poison(be, dy, yn * 4);
        be->matmul_id(be, wt, dx, xs, dids, k, dy, n);
        float *y = ys[bi] = malloc(yn * 4);
        fetch(be, y, dy, yn * 4);
        double num = 0, den = 0;
        int wrong = 0; /* NaN in a valid row, or a number in an out-of-range one */
        for (int p = 0; p < P; p++) {
            const bool bad = ids[p] < 0 || ids[p] >= mats;
            for (int64_t r = 0; r < rows; r++) {
                const float v = y[(size_t)p * rows + r];
                if (bad || !isfinite(v)) {
                    wrong += bad ? !isnan(v) : 1;
                    continue;
                }
                const double d = v - ref[(size_t)p * rows + r];
                num += d * d;
                den += ref[(size_t)p * rows + r] * ref[(size_t)p * rows + r];
            }
        }
        report(nm, shape, den > 0 ? sqrt(num / den) : sqrt(num), wrong,
               n >= MR_CU_GEMM_MIN_TOKENS ? mm_gemm_bound[bi] : 2e-5);
        be->free(be, dx);
        be->free(be, dy);
        be->free(be, dids);
    }
    /* decode batches: grouped by expert == per pair, bit for bit (NaN rows
     * included), at the same rows per block */
    for (int q = 0; q < 2 && n >= 2 && n < MR_CU_GEMM_MIN_TOKENS; q++) {
        const float *ga = ys[mm_exact[q][0]], *pa = ys[mm_exact[q][1]];
        if (!ga || !pa) continue;
        size_t diff = 0;
        for (size_t i = 0; i < yn; i++) diff += memcmp(&ga[i], &pa[i], 4) != 0;
        char nm[32];
        snprintf(nm, sizeof nm, "id-exact%s", mm_name[mm_exact[q][0]]);
        report(nm, shape, (double)diff, 0, 0.0);
    }
    for (int bi = 0; bi < N_MM; bi++) free(ys[bi]);
    free(x); free(ids); free(ref); free(wm);
    tw_free(&w);
}

static void check_matmul_id(const tdesc *td, int64_t cols, int64_t rows, int mats, int k, int xs, int n)
{
    check_matmul_id_route(td, cols, rows, mats, k, xs, n, ROUTE_MIX);
}

/* n tokens' k expert ids of mats (random routing), on the host (returned,
 * NULL when mats is 1: a plain product) and in be's memory (*dev). */
static int32_t *random_ids(mr_backend *be, int n, int k, int mats, int32_t **dev)
{
    *dev = NULL;
    if (mats <= 1)
        return NULL;
    int32_t *ids = malloc((size_t)n * k * 4);
    make_ids(ids, n, k, mats, ROUTE_RANDOM);
    *dev = dup_to(be, ids, (size_t)n * k * 4);
    return ids;
}

/* Consecutive matmuls over one input (q/k/v, gate/up; matmul_id at one
 * token with shared ids) that the op recorder sends as one launch: each
 * output against float64 math, and bit for bit against the same calls made
 * one at a time (a sync after each, so nothing is shared); `saved` is how
 * many of the m calls the recorder must report as run inside another's
 * launch (the mv count of fused_ops): a weight of another type starts a new
 * launch, and expert products of 2+ tokens share one only on the 22-bit
 * kernel (be gpu_x24). */
#define MULTI_MAX 4 /* matrices a launch may cover (MR_CU_MV_SUBS) */
static void check_matmul_multi(mr_backend *be, const int *types, const int64_t *rows, int m, int64_t cols, int mats,
                               int k, int n, long saved)
{
    tweight w[MULTI_MAX];
    const int P = mats > 1 ? n * k : n; /* output rows a matrix row has */
    size_t xn = (size_t)n * cols, yn[MULTI_MAX];
    float *x = malloc(xn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    int32_t *dids, *ids = random_ids(be, n, k, mats, &dids);
    float *dx = dup_to(be, x, xn * 4), *dy[MULTI_MAX], *dz[MULTI_MAX];
    char shape[96];
    int len = snprintf(shape, sizeof shape, "%dx", m);
    for (int s = 0; s < m; s++) {
        const tdesc *td = td_of(types[s]);
        tw_make(&w[s], td, cols, rows[s], mats);
        yn[s] = (size_t)P * rows[s];
        dy[s] = dalloc(be, yn[s] * 4);
        dz[s] = dalloc(be, yn[s] * 4);
        poison(be, dy[s], yn[s] * 4);
        poison(be, dz[s], yn[s] * 4);
        len += snprintf(shape + len, sizeof shape - len, "%s%s %lld", s ? "," : "", td->name, (long long)rows[s]);
    }
    snprintf(shape + len, sizeof shape - len, " x%lld%s n=%d", (long long)cols, mats > 1 ? " ids" : "", n);
    long f0 = fused_ops(be).mv;
    for (int s = 0; s < m; s++) { /* recorded back to back: shared launches */
        if (mats > 1) be->matmul_id(be, &w[s].g, dx, 1, dids, k, dy[s], n);
        else be->matmul(be, &w[s].g, dx, dy[s], n);
    }
    if (be->sync(be, &err)) die("sync");
    const long got = fused_ops(be).mv - f0;
    for (int s = 0; s < m; s++) { /* one at a time */
        if (mats > 1) be->matmul_id(be, &w[s].g, dx, 1, dids, k, dz[s], n);
        else be->matmul(be, &w[s].g, dx, dz[s], n);
        if (be->sync(be, &err)) die("sync");
    }
    int nan_all = 0;
    double e_all = 0, diff = 0;
    for (int s = 0; s < m; s++) {
        const tdesc *td = td_of(types[s]);
        float *y = malloc(yn[s] * 4), *z = malloc(yn[s] * 4), *wr = malloc(cols * 4);
        double *ref = calloc(yn[s], 8);
        fetch(be, y, dy[s], yn[s] * 4);
        fetch(be, z, dz[s], yn[s] * 4);
        for (int p = 0; p < P; p++) {
            const int e = mats > 1 ? ids[p] : 0, t = mats > 1 ? p / k : p;
            for (int64_t r = 0; r < rows[s]; r++) {
                deq_row(td, w[s].host + ((size_t)e * rows[s] + r) * w[s].g.row_bytes, cols, wr);
                double acc = 0;
                for (int64_t c = 0; c < cols; c++) acc += (double)wr[c] * x[t * cols + c];
                ref[(size_t)p * rows[s] + r] = acc;
            }
        }
        int nan;
        double e = rel_l2(y, ref, yn[s], &nan);
        nan_all += nan;
        if (e > e_all) e_all = e;
        for (size_t i = 0; i < yn[s]; i++) diff += memcmp(&y[i], &z[i], 4) != 0;
        free(y); free(z); free(wr); free(ref);
    }
    report("matmul-multi", shape, e_all, nan_all, 2e-5);
    report("multi-vs-one", shape, diff, 0, 0.0); /* outputs that differ in any bit */
    report("multi-launches", shape, (double)labs(got - saved), 0, 0.0);
    for (int s = 0; s < m; s++) {
        be->free(be, dy[s]);
        be->free(be, dz[s]);
        tw_free(&w[s]);
    }
    be->free(be, dx);
    if (dids) be->free(be, dids);
    free(x); free(ids);
}

static void check_matmul_multi_all(void)
{
    const int q4 = MR_TYPE_Q4_K, q6 = MR_TYPE_Q6_K;
    { /* q/k/v of one type, 1-8 tokens (launches of 4, 2, 1) and more */
        const int t[3] = {q4, q4, q4};
        const int64_t r[3] = {1024, 256, 256};
        const int ns[] = {1, 2, 3, 5, 8, 21}; /* 21: a decode batch (16 + 4 + 1 a launch on the wide kernel) */
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) check_matmul_multi(gpu, t, r, 3, 2048, 1, 1, ns[i], 2);
    }
    { /* four matrices: a gated delta net layer's qkv, z, alpha and beta (IQ4_XS, the
       * 35B-A3B's shapes) and four Q4_K ones, 1 to 8 tokens: one launch where the
       * recorder takes four (the default; MEMRA_CUDA_FUSE_MV=3: three and one) */
        mr_backend *four = backend_with("MEMRA_CUDA_FUSE_MV", "4");
        const int t[4] = {MR_TYPE_IQ4_XS, MR_TYPE_IQ4_XS, MR_TYPE_IQ4_XS, MR_TYPE_IQ4_XS};
        const int64_t r[4] = {8192, 4096, 32, 32};
        const int u[4] = {q4, q4, q4, q4};
        const int64_t ru[4] = {1024, 256, 256, 72};
        const int ns[] = {1, 2, 5, 8};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            check_matmul_multi(four, t, r, 4, 2048, 1, 1, ns[i], 3);
            check_matmul_multi(four, u, ru, 4, 2048, 1, 1, ns[i], 3);
        }
        mr_backend *three = backend_with("MEMRA_CUDA_FUSE_MV", "3");
        check_matmul_multi(three, t, r, 4, 2048, 1, 1, 1, 2);
        three->destroy(three);
        /* the 22-bit kernel's rows of four sub-matrices (xs_row), one token and a
         * batch (the tensor-core kernel): every matrix at least 12,288 rows, so
         * the rule takes them all */
        const int64_t rx[4] = {12288, 12288, 12800, 16384};
        check_matmul_multi(four, u, rx, 4, 1024, 1, 1, 1, 3);
        check_matmul_multi(four, u, rx, 4, 1024, 1, 1, 5, 3);
        four->destroy(four);
    }
    { /* Q6_K q/k/v of at most 2,048 columns: a decode batch 8 tokens a
       * launch, the chunks of 8 the jobs of one launch (16: one launch of
       * two jobs, 21: two jobs, then 4 and 1; MEMRA_CUDA_FAST8_JOBS=0: a
       * launch each, 8 + 8 + 4 + 1), the three matrices sharing each */
        const int t[3] = {q6, q6, q6};
        const int64_t r[3] = {512, 128, 128};
        check_matmul_multi(gpu, t, r, 3, 2048, 1, 1, 16, 2);
        check_matmul_multi(gpu, t, r, 3, 2048, 1, 1, 21, 2);
        mr_backend *apart = backend_with("MEMRA_CUDA_FAST8_JOBS", "0");
        check_matmul_multi(apart, t, r, 3, 2048, 1, 1, 16, 2);
        check_matmul_multi(apart, t, r, 3, 2048, 1, 1, 21, 2);
        apart->destroy(apart);
    }
    { /* v of another type: q and k share a launch, v runs alone */
        const int t[3] = {q4, q4, q6};
        const int64_t r[3] = {512, 128, 128};
        check_matmul_multi(gpu, t, r, 3, 4096, 1, 1, 1, 1);
    }
    { /* gate/up of every fast type, odd row counts (last block of a matrix partly used) */
        const int ty[] = {MR_TYPE_Q4_K, MR_TYPE_Q5_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_Q4_0,
                          MR_TYPE_IQ4_XS, MR_TYPE_BF16, MR_TYPE_F32};
        for (size_t i = 0; i < sizeof ty / sizeof ty[0]; i++) {
            const int t[2] = {ty[i], ty[i]};
            const int64_t r[2] = {333, 333};
            check_matmul_multi(gpu, t, r, 2, 1024, 1, 1, 1, 1);
            check_matmul_multi(gpu, t, r, 2, 512, 1, 1, 4, 1);
        }
    }
    { /* expert gate/up at one token (k = 8 of 16), and a decode batch (not shared) */
        const int t[2] = {q4, q4};
        const int64_t r[2] = {768, 768};
        check_matmul_multi(gpu, t, r, 2, 2048, 16, 8, 1, 1);
        check_matmul_multi(gpu, t, r, 2, 2048, 16, 8, 3, 0);
        /* the 22-bit kernel shares a decode batch's launch and grouping too */
        check_matmul_multi(gpu_x24, t, r, 2, 2048, 16, 8, 1, 1);
        check_matmul_multi(gpu_x24, t, r, 2, 2048, 16, 8, 3, 1);
        check_matmul_multi(gpu_x24, t, r, 2, 2048, 128, 8, 16, 1);
    }
}

static void load_weight(mr_backend *be, const tdesc *td, const uint8_t *host, int64_t cols, int64_t rows,
                        int64_t mats, mr_weight *w);
static void matmul_host(mr_backend *be, const tdesc *td, const uint8_t *host, int64_t cols, int64_t rows,
                        const float *x, int n, float *y);

/* A SwiGLU MLP's first half: gate and up products over one input, then
 * swiglu(gate, up) into the gate's place (or, sep, a buffer of its own).
 * Recorded back to back the op recorder runs the three as one launch
 * (the glu count of fused_ops: expected once where the kernels have the
 * fused form, else never); with syncs between them they run apart.  Both
 * must write the same bits everywhere, and the result must match a double
 * reference of silu(W_g x) * (W_u x).  be: the float kernels (gpu) or the
 * default decode kernels (gpu_x24: the 22-bit ones where they take a
 * product). */
static void check_glu(mr_backend *be, const char *tag, int type, int64_t rows, int64_t cols, int mats, int k,
                      int n, bool sep, long expect)
{
    const tdesc *td = td_of(type);
    const size_t rb = (size_t)(cols / td->be) * td->bb, wbytes = rb * rows * mats;
    uint8_t *host[2];
    mr_weight w[2];
    for (int s = 0; s < 2; s++) {
        host[s] = malloc(wbytes);
        rand_blocks(td, host[s], wbytes / td->bb);
        load_weight(be, td, host[s], cols, rows, mats, &w[s]);
    }
    const int P = mats > 1 ? n * k : n;
    const size_t xn = (size_t)n * cols, yn = (size_t)P * rows;
    float *x = malloc(xn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    int32_t *dids, *ids = random_ids(be, n, k, mats, &dids);
    float *dx = dup_to(be, x, xn * 4);
    float *got[2][3];
    long fused[2];
    for (int apart = 0; apart < 2; apart++) {
        float *d[3];
        for (int b = 0; b < 3; b++) {
            d[b] = dalloc(be, yn * 4);
            poison(be, d[b], yn * 4);
        }
        float *o = sep ? d[2] : d[0];
        const long f0 = fused_ops(be).glu;
        for (int s = 0; s < 2; s++) {
            if (mats > 1) be->matmul_id(be, &w[s], dx, 1, dids, k, d[s], n);
            else be->matmul(be, &w[s], dx, d[s], n);
            if (apart && be->sync(be, &err)) die("sync");
        }
        be->swiglu(be, d[0], d[1], o, yn);
        if (be->sync(be, &err)) die("sync");
        fused[apart] = fused_ops(be).glu - f0;
        for (int b = 0; b < 3; b++) {
            got[apart][b] = malloc(yn * 4);
            fetch(be, got[apart][b], d[b], yn * 4);
            be->free(be, d[b]);
        }
    }
    double *ref = malloc(yn * 8);
    float *wr = malloc(cols * 4);
    for (int p = 0; p < P; p++) {
        const int e = mats > 1 ? ids[p] : 0, t = mats > 1 ? p / k : p;
        for (int64_t r = 0; r < rows; r++) {
            double acc[2] = {0, 0};
            for (int s = 0; s < 2; s++) {
                deq_row(td, host[s] + ((size_t)e * rows + r) * rb, cols, wr);
                for (int64_t c = 0; c < cols; c++) acc[s] += (double)wr[c] * x[t * cols + c];
            }
            ref[(size_t)p * rows + r] = acc[0] / (1.0 + exp(-acc[0])) * acc[1];
        }
    }
    const float *glu = got[0][sep ? 2 : 0];
    size_t diff = 0;
    for (int b = 0; b < (sep ? 3 : 2); b++)
        for (size_t i = 0; i < yn; i++) diff += memcmp(&got[0][b][i], &got[1][b][i], 4) != 0;
    char shape[112];
    snprintf(shape, sizeof shape, "%s%s %lldx%lld%s n=%d%s", td->name, tag, (long long)rows, (long long)cols,
             mats > 1 ? " ids" : "", n, sep ? " sep" : "");
    report_rel("glu", shape, glu, ref, yn, 2e-5);
    report("glu-vs-apart", shape, (double)diff, 0, 0.0); /* outputs that differ in any bit */
    report("glu-launches", shape, (double)labs(fused[0] - expect) + (double)labs(fused[1]), 0, 0.0);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) free(got[a][b]);
    for (int s = 0; s < 2; s++) {
        be->weight_release(be, &w[s]);
        free(host[s]);
    }
    be->free(be, dx);
    if (dids) be->free(be, dids);
    free(x); free(ids); free(ref); free(wr);
}

static void check_glu_all(void)
{
    const int ty[] = {MR_TYPE_Q4_K, MR_TYPE_Q5_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_Q4_0,
                      MR_TYPE_IQ4_XS, MR_TYPE_BF16, MR_TYPE_F32};
    for (size_t i = 0; i < sizeof ty / sizeof ty[0]; i++) {
        check_glu(gpu, "", ty[i], 333, 1024, 1, 1, 1, false, 1); /* odd rows: a block half used */
        check_glu(gpu, "", ty[i], 333, 512, 1, 1, 7, false, 1);  /* launches of 4, 2, 1 tokens */
        check_glu(gpu, "", ty[i], 768, 2048, 16, 8, 1, false, 1); /* one token's experts */
    }
    check_glu(gpu, "", MR_TYPE_Q4_K, 12288, 4096, 1, 1, 1, false, 1); /* the 8B MLP: 16-weight lanes */
    check_glu(gpu, "", MR_TYPE_Q4_K, 1000, 4096, 1, 1, 3, true, 1);
    check_glu(gpu, "", MR_TYPE_Q4_K, 300, 1024, 1, 1, 21, false, 1); /* a decode batch: 8 tokens a launch */
    check_glu(gpu, "", MR_TYPE_IQ4_XS, 512, 2048, 128, 8, 1, true, 1);
    check_glu(gpu, "", MR_TYPE_Q4_K, 768, 2048, 16, 8, 3, false, 0); /* expert decode batch: apart */
    /* the 22-bit kernels: the 8B MLP (one token fused, a batch apart), one
     * token's experts of each type they take, a bad expert id */
    const int xt[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_IQ4_XS, MR_TYPE_Q8_0};
    for (size_t i = 0; i < sizeof xt / sizeof xt[0]; i++) {
        check_glu(gpu_x24, " x24", xt[i], 12288, 4096, 1, 1, 1, false, 1);
        check_glu(gpu_x24, " x24", xt[i], 768, 2048, 128, 8, 1, false, 1);
    }
    check_glu(gpu_x24, " x24", MR_TYPE_Q4_K, 12288, 4096, 1, 1, 1, true, 1);
    check_glu(gpu_x24, " x24", MR_TYPE_Q4_K, 12288, 4096, 1, 1, 2, false, 0);
    check_glu(gpu_x24, " x24", MR_TYPE_IQ4_XS, 512, 2048, 256, 8, 1, true, 1);
    check_glu(gpu_x24, " x24", MR_TYPE_Q4_K, 768, 2048, 16, 8, 3, false, 0);
}

/* Decode batches of experts (2..64 tokens, k = 8 of 128): the grouped path
 * of every fast weight type under random, one-expert, spread and partly
 * out-of-range routings, with one input row a token (gate/up) and one a
 * pair (down); rows not a multiple of the slab; rows of 10 steps (inputs
 * read from global memory when 4 of them do not fit the stage); the
 * Qwen3-30B-A3B expert shapes. */
static void check_moe_grouped(void)
{
    const int fast[] = {MR_TYPE_Q4_K, MR_TYPE_Q5_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0,
                        MR_TYPE_Q4_0, MR_TYPE_IQ4_XS, MR_TYPE_BF16, MR_TYPE_F32};
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++) {
        const tdesc *td = td_of(fast[i]);
        check_matmul_id_route(td, 512, 70, 128, 8, 1, 2, ROUTE_RANDOM);
        check_matmul_id_route(td, 512, 70, 128, 8, 8, 3, ROUTE_RANDOM);
        check_matmul_id_route(td, 512, 70, 128, 8, 1, 8, ROUTE_RANDOM);
        check_matmul_id_route(td, 512, 70, 128, 8, 8, 16, ROUTE_RANDOM);
        check_matmul_id_route(td, 512, 70, 128, 8, 1, 64, ROUTE_RANDOM);
        check_matmul_id_route(td, 512, 70, 128, 8, 1, 16, ROUTE_ONE);
        check_matmul_id_route(td, 512, 70, 128, 8, 8, 64, ROUTE_ONE);
        check_matmul_id_route(td, 512, 70, 128, 8, 8, 16, ROUTE_SPREAD);
        check_matmul_id_route(td, 512, 70, 128, 8, 1, 64, ROUTE_SPREAD);
        check_matmul_id_route(td, 512, 70, 128, 8, 1, 8, ROUTE_BAD);
        check_matmul_id_route(td, 512, 70, 128, 8, 8, 64, ROUTE_BAD);
    }
    const int wide[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_BF16, MR_TYPE_F32};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        check_matmul_id_route(td_of(wide[i]), 2560, 40, 128, 8, 1, 16, ROUTE_RANDOM);
        check_matmul_id_route(td_of(wide[i]), 2560, 40, 128, 8, 8, 64, ROUTE_RANDOM);
    }
    const tdesc *q4k = td_of(MR_TYPE_Q4_K), *q6k = td_of(MR_TYPE_Q6_K);
    check_matmul_id_route(q4k, 2048, 768, 128, 8, 1, 16, ROUTE_RANDOM); /* gate/up */
    check_matmul_id_route(q4k, 2048, 768, 128, 8, 1, 64, ROUTE_RANDOM);
    check_matmul_id_route(q4k, 2048, 768, 128, 8, 1, 16, ROUTE_BAD);
    check_matmul_id_route(q6k, 768, 2048, 128, 8, 8, 16, ROUTE_RANDOM); /* down */
    check_matmul_id_route(q6k, 768, 2048, 128, 8, 8, 64, ROUTE_RANDOM);
}

/* Prompt-sized products (MR_CU_GEMM_MIN_TOKENS tokens or more) of the
 * weight types the models use, for every GEMM mode and above all the f16x3
 * backend's bound: odd token counts; dense rows not a multiple of a tile;
 * experts through the fused kernel (rows a multiple of 64, columns of 128;
 * the block types) under every routing kind (out-of-range ids leave the
 * GEMM path: their rows must still be NaN) and, with 70 rows or plain
 * types, through the padded dequantize + cuBLAS path; the 35B-A3B's expert
 * shapes at a few experts (512 x 2048 gate/up, 2048 x 512 down). */
static void check_gemm_prompt(void)
{
    const int types[] = {MR_TYPE_IQ4_XS, MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_BF16, MR_TYPE_F32};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const tdesc *td = td_of(types[i]);
        check_matmul(td, 2048, 192, 65);
        check_matmul(td, 1024, 100, 131);
        check_matmul_id_route(td, 1024, 128, 32, 8, 1, 67, ROUTE_RANDOM);
        check_matmul_id_route(td, 512, 128, 32, 4, 4, 65, ROUTE_MIX);
        check_matmul_id_route(td, 512, 64, 32, 4, 1, 97, ROUTE_ONE); /* 388 pairs: 13 tiles of one expert */
        check_matmul_id_route(td, 512, 64, 64, 4, 4, 81, ROUTE_SPREAD);
        check_matmul_id_route(td, 512, 64, 32, 4, 1, 66, ROUTE_BAD);
        check_matmul_id_route(td, 512, 70, 16, 4, 1, 71, ROUTE_RANDOM); /* padded path */
    }
    const tdesc *iq4 = td_of(MR_TYPE_IQ4_XS);
    check_matmul_id_route(iq4, 2048, 512, 8, 2, 1, 65, ROUTE_RANDOM); /* gate/up */
    check_matmul_id_route(iq4, 512, 2048, 8, 2, 2, 65, ROUTE_RANDOM); /* down */
}

/* moe_ffn_prompt (gate, up and down on one grouping, gate and up in one
 * launch, silu(gate) * up taken in the down product's gather) against
 * matmul_id_prompt for gate and for up, swiglu and matmul_id_prompt for
 * down, bit for bit (NaN rows of bad ids included), float16 and f16x3, on
 * the types and expert shapes the models use; BF16 takes the calls apart. */
static void check_moe_ffn_one(mr_backend *be, const char *label, const tdesc *tgu, const tdesc *tdn, int64_t d,
                              int64_t ff, int mats, int k, int n, int route)
{
    const tdesc *td[3] = {tgu, tgu, tdn};
    const int64_t cols[3] = {d, d, ff}, rows[3] = {ff, ff, d};
    uint8_t *host[3];
    mr_weight w[3];
    for (int i = 0; i < 3; i++) {
        const size_t bytes = (size_t)(cols[i] / td[i]->be) * td[i]->bb * rows[i] * mats;
        host[i] = malloc(bytes);
        rand_blocks(td[i], host[i], bytes / td[i]->bb);
        load_weight(be, td[i], host[i], cols[i], rows[i], mats, &w[i]);
    }
    const size_t P = (size_t)n * k;
    float *x = malloc((size_t)n * d * 4);
    for (size_t i = 0; i < (size_t)n * d; i++) x[i] = fgauss();
    int32_t *ids = malloc(P * 4);
    make_ids(ids, n, k, mats, route);
    float *dx = dup_to(be, x, (size_t)n * d * 4);
    int32_t *dids = dup_to(be, ids, P * 4);
    float *g = dalloc(be, P * ff * 4), *u = dalloc(be, P * ff * 4), *dy[2], *y[2];
    for (int i = 0; i < 2; i++) {
        dy[i] = dalloc(be, P * d * 4);
        poison(be, dy[i], P * d * 4);
        y[i] = malloc(P * d * 4);
    }
    be->moe_ffn_prompt(be, &w[0], &w[1], &w[2], dx, dids, k, g, u, dy[0], n);
    be->matmul_id_prompt(be, &w[0], dx, 1, dids, k, g, n);
    be->matmul_id_prompt(be, &w[1], dx, 1, dids, k, u, n);
    be->swiglu(be, g, u, g, P * ff);
    be->matmul_id_prompt(be, &w[2], g, k, dids, k, dy[1], n);
    for (int i = 0; i < 2; i++) fetch(be, y[i], dy[i], P * d * 4);
    size_t diff = 0;
    int nan = 0;
    for (size_t i = 0; i < P * d; i++) diff += memcmp(&y[0][i], &y[1][i], 4) != 0;
    for (size_t p = 0; p < P; p++)
        for (int64_t r = 0; r < d; r++)
            nan += isnan(y[0][p * d + r]) != (ids[p] < 0 || ids[p] >= mats);
    char sh[160];
    snprintf(sh, sizeof sh, "%s/%s %dx%lldx%lld k=%d n=%d%s", tgu->name, tdn->name, mats, (long long)ff,
             (long long)d, k, n, route == ROUTE_BAD ? " bad ids" : "");
    report(label, sh, (double)diff, nan, 0.0);
    for (int i = 0; i < 2; i++) {
        be->free(be, dy[i]);
        free(y[i]);
    }
    for (int i = 0; i < 3; i++) {
        be->weight_release(be, &w[i]);
        free(host[i]);
    }
    be->free(be, g);
    be->free(be, u);
    be->free(be, dx);
    be->free(be, dids);
    free(x); free(ids);
}

/* One token's expert products with each block quantizing its input row
 * and asking for its first weights before that (the default) against the
 * backend blk, bit for bit: a k_x24_quant launch first
 * (MEMRA_CUDA_XM_QUANT=launch, "xm-quant-block"), the weights after the
 * quantization (MEMRA_CUDA_XM_EARLY=0, "xm-early") or the down products of
 * at most 512 columns in whole warps (MEMRA_CUDA_XM_HALF=0, "xm-half");
 * ref: the default backend, gpu_x24, or one with more rows a block, so
 * that a warp makes several passes.  Gate and up with the SwiGLU after them
 * (one launch on the recorder) and down over the k rows of the SwiGLU, NaN
 * rows of bad ids included; n tokens (a decode batch keeps the separate
 * quantization: the same bits too). */
static void check_xm_quant(mr_backend *ref, mr_backend *blk, const char *name, const tdesc *td, int64_t d, int64_t ff,
                           int mats, int k, int n, int route)
{
    const int64_t cols[3] = {d, d, ff}, rows[3] = {ff, ff, d};
    uint8_t *host[3];
    for (int i = 0; i < 3; i++) {
        const size_t bytes = (size_t)(cols[i] / td->be) * td->bb * rows[i] * mats;
        host[i] = malloc(bytes);
        rand_blocks(td, host[i], bytes / td->bb);
    }
    const size_t P = (size_t)n * k;
    float *x = malloc((size_t)n * d * 4);
    for (size_t i = 0; i < (size_t)n * d; i++) x[i] = fgauss();
    int32_t *ids = malloc(P * 4);
    make_ids(ids, n, k, mats, route);
    mr_backend *be[2] = {ref, blk}; /* both on the default decode kernels (gpu: float32 ones) */
    float *out[2][4];
    const size_t on[4] = {P * ff, P * ff, P * ff, P * d};
    for (int b = 0; b < 2; b++) {
        mr_weight w[3];
        for (int i = 0; i < 3; i++) load_weight(be[b], td, host[i], cols[i], rows[i], mats, &w[i]);
        float *dx = dup_to(be[b], x, (size_t)n * d * 4);
        int32_t *dids = dup_to(be[b], ids, P * 4);
        float *dd[4];
        for (int q = 0; q < 4; q++) {
            dd[q] = dalloc(be[b], on[q] * 4);
            poison(be[b], dd[q], on[q] * 4);
        }
        be[b]->matmul_id(be[b], &w[0], dx, 1, dids, k, dd[0], n);
        be[b]->matmul_id(be[b], &w[1], dx, 1, dids, k, dd[1], n);
        be[b]->swiglu(be[b], dd[0], dd[1], dd[2], P * ff);
        be[b]->matmul_id(be[b], &w[2], dd[2], k, dids, k, dd[3], n);
        for (int q = 0; q < 4; q++) {
            out[b][q] = malloc(on[q] * 4);
            fetch(be[b], out[b][q], dd[q], on[q] * 4);
            be[b]->free(be[b], dd[q]);
        }
        be[b]->free(be[b], dx);
        be[b]->free(be[b], dids);
        for (int i = 0; i < 3; i++) be[b]->weight_release(be[b], &w[i]);
    }
    size_t diff = 0;
    int nan = 0;
    for (int q = 0; q < 4; q++)
        diff += floats_differ(out[0][q], out[1][q], on[q]);
    for (size_t p = 0; p < P; p++) /* the down rows of a bad id are NaN, the others not */
        for (int64_t r = 0; r < d; r++) nan += isnan(out[1][3][p * d + r]) != (ids[p] < 0 || ids[p] >= mats);
    char sh[128];
    snprintf(sh, sizeof sh, "%s %dx%lldx%lld k=%d n=%d%s", td->name, mats, (long long)ff, (long long)d, k, n,
             route == ROUTE_BAD ? " bad ids" : "");
    report(name, sh, (double)diff, nan, 0.0);
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 4; q++) free(out[b][q]);
    for (int i = 0; i < 3; i++) free(host[i]);
    free(x); free(ids);
}

static void check_xm_quant_all(void)
{
    /* the default decode kernels (MEMRA_CUDA_MATVEC is unset by now) with
     * the quantization launch, against gpu_x24 (in-block, the default) */
    /* one block an SM (MEMRA_CUDA_XM_BPS1 = 1; XM_BPS for the batch):
     * ~4 times the default's rows a block, more passes a warp */
    setenv("MEMRA_CUDA_XM_BPS", "1", 1);
    mr_backend *tall = backend_with("MEMRA_CUDA_XM_BPS1", "1");
    setenv("MEMRA_CUDA_XM_BPS1", "1", 1);
    mr_backend *tall_late = backend_with("MEMRA_CUDA_XM_EARLY", "0");
    unsetenv("MEMRA_CUDA_XM_BPS1");
    unsetenv("MEMRA_CUDA_XM_BPS");
    mr_backend *blk[4] = {backend_with("MEMRA_CUDA_XM_QUANT", "launch"), backend_with("MEMRA_CUDA_XM_EARLY", "0"),
                          backend_with("MEMRA_CUDA_XM_HALF", "0"), tall_late};
    mr_backend *ref[4] = {gpu_x24, gpu_x24, gpu_x24, tall};
    const char *name[4] = {"xm-quant-block", "xm-early", "xm-half", "xm-early-passes"};
    const int types[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_IQ4_XS, MR_TYPE_Q8_0};
    for (int b = 0; b < 4; b++)
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            const tdesc *td = td_of(types[i]);
            /* the experts' shapes; fewer of them than the models have (the
             * host writes every byte), which changes nothing a block does;
             * 4,096 columns: four units a lane */
            check_xm_quant(ref[b], blk[b], name[b], td, 2048, 768, 32, 8, 1, ROUTE_RANDOM); /* the 30B-A3B */
            check_xm_quant(ref[b], blk[b], name[b], td, 2048, 512, 48, 8, 1, ROUTE_RANDOM); /* the 35B-A3B */
            check_xm_quant(ref[b], blk[b], name[b], td, 1024, 256, 8, 2, 1, ROUTE_BAD);
            check_xm_quant(ref[b], blk[b], name[b], td, 4096, 1536, 8, 8, 1, ROUTE_RANDOM);
            /* a batch: planes as before */
            check_xm_quant(ref[b], blk[b], name[b], td, 2048, 768, 32, 8, 4, ROUTE_RANDOM);
        }
    tall->destroy(tall);
    for (int b = 0; b < 4; b++) blk[b]->destroy(blk[b]);
    /* expert rows of under 1,024 columns a row a quarter warp
     * (MEMRA_CUDA_XM_QUARTER=2; the default takes those of at most 512:
     * decode batches, and one token's Q6_K and Q8_0) against whole warps
     * (=0): the down products of the 30B-A3B (768) and 35B-A3B (512), and
     * 256 columns; 1, 16 and 64 tokens, so that pairs come 1, 2 and 4 a
     * chunk */
    mr_backend *whole = backend_with("MEMRA_CUDA_XM_QUARTER", "0"), *quart = backend_with("MEMRA_CUDA_XM_QUARTER", "2");
    setenv("MEMRA_CUDA_X24_NT", "4", 1);
    mr_backend *quart_nt4 = backend_with("MEMRA_CUDA_XM_QUARTER", "2"),
               *whole_nt4 = backend_with("MEMRA_CUDA_XM_QUARTER", "0");
    unsetenv("MEMRA_CUDA_X24_NT");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const tdesc *td = td_of(types[i]);
        check_xm_quant(whole, quart, "xm-quarter", td, 2048, 768, 32, 8, 1, ROUTE_RANDOM);
        check_xm_quant(whole, quart, "xm-quarter", td, 1024, 256, 8, 2, 1, ROUTE_BAD);
        check_xm_quant(whole, quart, "xm-quarter", td, 2048, 768, 32, 8, 16, ROUTE_RANDOM);
        check_xm_quant(whole, quart, "xm-quarter", td, 2048, 768, 32, 8, 64, ROUTE_RANDOM);
        check_xm_quant(whole, quart, "xm-quarter", td, 2048, 512, 48, 8, 16, ROUTE_RANDOM);
        check_xm_quant(whole, quart, "xm-quarter", td, 1024, 256, 8, 2, 16, ROUTE_BAD);
        check_xm_quant(whole_nt4, quart_nt4, "xm-quarter-nt4", td, 2048, 768, 32, 8, 16, ROUTE_RANDOM);
    }
    whole->destroy(whole);
    quart->destroy(quart);
    quart_nt4->destroy(quart_nt4);
    whole_nt4->destroy(whole_nt4);
}

/* The Q4_K and Q6_K expert products on the tensor cores (MEMRA_CUDA_XMM=2,
 * cu_moemma.cu) in a mixture layer's chain: gate and up over x, the SwiGLU,
 * down over its k rows.  n tokens in one call against each token alone
 * (gate/up and the SwiGLU are one launch on the recorder, one token's or
 * a batch's, whose are grouped by expert), bit for bit ("xmm-batch-inv"), then
 * the batch's products against float64 math on the host-decoded weights
 * with x itself ("xmm-gate", "xmm-up"; "xmm-down" over the GPU's own
 * SwiGLU rows): the 22-bit input costs ~1e-7 of a product, the bound is
 * the x24 kernels' 2e-5.  Rows of bad ids must be NaN and are left out of
 * the reference lines. */
static void check_batch_invariance_one(mr_backend *be, const char *label, const tdesc *td, int64_t cols,
                                       int64_t rows, int mats, int k);

/* ref[r] = row r of expert e (rows x cols blocks of td at host, rb bytes a
 * row) times x, in float64 on the host-decoded weights; wr: cols floats of
 * scratch. */
static void expert_ref(const tdesc *td, const uint8_t *host, size_t rb, int64_t rows, int64_t cols, int e,
                       const float *x, float *wr, double *ref)
{
    for (int64_t r = 0; r < rows; r++) {
        deq_row(td, host + ((size_t)e * rows + r) * rb, cols, wr);
        double a = 0;
        for (int64_t c = 0; c < cols; c++) a += (double)wr[c] * x[c];
        ref[r] = a;
    }
}

static void check_xmm_chain(mr_backend *be, const tdesc *tg, const tdesc *tdn, int64_t d, int64_t ff, int mats,
                            int k, int n, int route)
{
    const int64_t cols[3] = {d, d, ff}, rows[3] = {ff, ff, d};
    const tdesc *tds[3] = {tg, tg, tdn};
    uint8_t *host[3];
    size_t rbytes[3];
    for (int i = 0; i < 3; i++) {
        const tdesc *td = tds[i];
        rbytes[i] = (size_t)(cols[i] / td->be) * td->bb;
        host[i] = malloc(rbytes[i] * rows[i] * mats);
        rand_blocks(td, host[i], rbytes[i] * rows[i] * mats / td->bb);
    }
    const size_t P = (size_t)n * k;
    float *x = malloc((size_t)n * d * 4);
    for (size_t i = 0; i < (size_t)n * d; i++) x[i] = fgauss();
    int32_t *ids = malloc(P * 4);
    make_ids(ids, n, k, mats, route);
    mr_weight w[3];
    for (int i = 0; i < 3; i++) load_weight(be, tds[i], host[i], cols[i], rows[i], mats, &w[i]);
    const size_t on[4] = {P * ff, P * ff, P * ff, P * d};
    float *dx = dup_to(be, x, (size_t)n * d * 4);
    int32_t *dids = dup_to(be, ids, P * 4);
    float *dd[4], *out[2][4];
    for (int q = 0; q < 4; q++) {
        dd[q] = dalloc(be, on[q] * 4);
        out[0][q] = malloc(on[q] * 4);
        out[1][q] = malloc(on[q] * 4);
    }
    const long glu0 = fused_ops(be).glu;
    for (int pass = 0; pass < 2; pass++) { /* 0: the batch, 1: each token alone */
        for (int q = 0; q < 4; q++) poison(be, dd[q], on[q] * 4);
        for (int t = 0; t < (pass ? n : 1); t++) {
            const int nt = pass ? 1 : n;
            const size_t p0 = pass ? (size_t)t * k : 0;
            const float *xt = dx + (pass ? (size_t)t * d : 0);
            be->matmul_id(be, &w[0], xt, 1, dids + p0, k, dd[0] + p0 * ff, nt);
            be->matmul_id(be, &w[1], xt, 1, dids + p0, k, dd[1] + p0 * ff, nt);
            be->swiglu(be, dd[0] + p0 * ff, dd[1] + p0 * ff, dd[2] + p0 * ff, (size_t)nt * k * ff);
            be->matmul_id(be, &w[2], dd[2] + p0 * ff, k, dids + p0, k, dd[3] + p0 * d, nt);
        }
        for (int q = 0; q < 4; q++) fetch(be, out[pass][q], dd[q], on[q] * 4);
    }
    const long glu = fused_ops(be).glu - glu0;
    char sh[128];
    snprintf(sh, sizeof sh, "%s/%s %dx%lldx%lld k=%d n=%d%s", tg->name, tdn->name, mats, (long long)ff,
             (long long)d, k, n, route == ROUTE_BAD ? " bad ids" : "");
    size_t diff = 0;
    int nan = 0;
    for (int q = 0; q < 4; q++) diff += floats_differ(out[0][q], out[1][q], on[q]);
    for (size_t p = 0; p < P; p++) {
        const bool bad = ids[p] < 0 || ids[p] >= mats;
        for (int64_t r = 0; r < d; r++) nan += isnan(out[0][3][p * d + r]) != bad;
        for (int64_t r = 0; r < ff; r++) nan += isnan(out[0][0][p * ff + r]) != bad;
    }
    report("xmm-batch-inv", sh, (double)diff, nan, 0.0);
    /* each token's gate/up alone and the batch's must each have been the
     * recorder's one launch (the SwiGLU inside it) */
    report("xmm-glu-fused", sh, glu == n + 1 ? 0.0 : 1.0, 0, 0.0);
    /* the batch's products against float64 host math, good pairs only */
    size_t ng = 0;
    for (size_t p = 0; p < P; p++) ng += ids[p] >= 0 && ids[p] < mats;
    for (int q = 0; q < 3; q++) {
        const int i = q == 2 ? 2 : q; /* the weight: gate, up, down */
        const int64_t R = rows[i], C = cols[i];
        float *wr = malloc(C * 4), *got = malloc(ng * R * 4);
        double *ref = malloc(ng * R * 8);
        size_t gi = 0;
        for (size_t p = 0; p < P; p++) {
            if (ids[p] < 0 || ids[p] >= mats)
                continue;
            const float *xin = q == 2 ? out[0][2] + p * ff : x + (p / k) * d;
            const float *yv = q == 2 ? out[0][3] + p * d : out[0][q] + p * ff;
            expert_ref(tds[i], host[i], rbytes[i], R, C, ids[p], xin, wr, ref + gi * R);
            memcpy(got + gi * R, yv, R * 4);
            gi++;
        }
        static const char *const nm[3] = {"xmm-gate", "xmm-up", "xmm-down"};
        report_rel(nm[q], sh, got, ref, ng * R, 2e-5);
        free(wr); free(got); free(ref);
    }
    for (int q = 0; q < 4; q++) {
        be->free(be, dd[q]);
        free(out[0][q]);
        free(out[1][q]);
    }
    be->free(be, dx);
    be->free(be, dids);
    for (int i = 0; i < 3; i++) {
        be->weight_release(be, &w[i]);
        free(host[i]);
    }
    free(x); free(ids);
}

/* One expert matrix of rows x cols over k input rows a token (the down
 * products' form) on be against float64 host math: shapes the chain cannot
 * take (rows not a multiple of the tiles). */
/* matmul_id of n tokens (an input row a pair) against float64 sums of
 * the decoded experts, relative L2 error within bound. */
static void check_expert_rows(mr_backend *be, const char *label, const tdesc *td, int64_t cols, int64_t rows,
                              int mats, int k, int n, int route, double bound)
{
    const size_t rb = (size_t)(cols / td->be) * td->bb, P = (size_t)n * k;
    uint8_t *host = malloc(rb * rows * mats);
    rand_blocks(td, host, rb * rows * mats / td->bb);
    float *x = malloc(P * cols * 4), *y = malloc(P * rows * 4), *wr = malloc(cols * 4);
    for (size_t i = 0; i < P * cols; i++) x[i] = fgauss();
    int32_t *ids = malloc(P * 4);
    make_ids(ids, n, k, mats, route);
    mr_weight w;
    load_weight(be, td, host, cols, rows, mats, &w);
    float *dx = dup_to(be, x, P * cols * 4), *dy = dalloc(be, P * rows * 4);
    int32_t *dids = dup_to(be, ids, P * 4);
    poison(be, dy, P * rows * 4);
    be->matmul_id(be, &w, dx, k, dids, k, dy, n);
    fetch(be, y, dy, P * rows * 4);
    double *ref = malloc(P * rows * 8);
    for (size_t p = 0; p < P; p++) expert_ref(td, host, rb, rows, cols, ids[p], x + p * cols, wr, ref + p * rows);
    char sh[96];
    snprintf(sh, sizeof sh, "%s %dx%lldx%lld k=%d n=%d%s", td->name, mats, (long long)rows, (long long)cols, k, n,
             route_name[route]);
    report_rel(label, sh, y, ref, P * rows, bound);
    be->free(be, dx);
    be->free(be, dy);
    be->free(be, dids);
    be->weight_release(be, &w);
    free(host); free(x); free(y); free(wr); free(ids); free(ref);
}

static void check_xmm_rows(mr_backend *be, const tdesc *td, int64_t cols, int64_t rows, int mats, int k, int n)
{
    check_expert_rows(be, "xmm-rows", td, cols, rows, mats, k, n, ROUTE_RANDOM, 2e-5);
}

/* Several row tiles a warp (MEMRA_CUDA_XMM_TPW): each chain's batch
 * against its tokens alone (one token keeps one tile a warp) bit for bit,
 * and against float64.  3 leaves the last blocks' warps fewer tiles than
 * the rest (and some none); 256 columns (the 1,024 x 256 down) are one
 * step a tile, so the ring's first copies reach into the next tiles; auto
 * takes several at 64 tokens of these shapes.  Rows that are not whole
 * tiles keep one a warp.  Each setting must have launched the kernel. */
static void check_xmm_tiles(void)
{
    const tdesc *t4 = td_of(MR_TYPE_Q4_K), *t6 = td_of(MR_TYPE_Q6_K), *ti = td_of(MR_TYPE_IQ4_XS);
    static const char *const tpw[] = {"2", "3", "auto"};
    for (int i = 0; i < 3; i++) {
        mr_backend *mt = backend_with2("MEMRA_CUDA_XMM", "2", "MEMRA_CUDA_XMM_TPW", tpw[i]);
        if (i < 2) {
            for (int v = 0; v < 3; v++) { /* Q4_K; Q6_K down; Q6_K gate/up */
                const tdesc *tg = v < 2 ? t4 : t6, *tdn = v ? t6 : t4;
                check_xmm_chain(mt, tg, tdn, 2048, 768, 32, 8, 16, ROUTE_RANDOM);
                check_xmm_chain(mt, tg, tdn, 2048, 768, 16, 8, 16, ROUTE_MIX);
                check_xmm_chain(mt, tg, tdn, 1024, 256, 8, 2, 5, ROUTE_BAD);
            }
            check_xmm_rows(mt, t4, 1024, 264, 8, 2, 5);
        }
        check_xmm_chain(mt, t4, t6, 2048, 768, 32, 8, 64, ROUTE_RANDOM);
        char sh[64];
        snprintf(sh, sizeof sh, "MEMRA_CUDA_XMM_TPW=%s", tpw[i]);
        report("xmm-tiles-ran", sh, mr_cu_xmm_tiles_launches(mt) > 0 ? 0.0 : 1.0, 0, 0.0);
        mt->destroy(mt);
    }
    /* a block an expert walking its chunks (MEMRA_CUDA_XMM_ITEMS=0) with 2 tiles a warp */
    setenv("MEMRA_CUDA_XMM", "2", 1);
    mr_backend *ms = backend_with2("MEMRA_CUDA_XMM_ITEMS", "0", "MEMRA_CUDA_XMM_TPW", "2");
    check_xmm_chain(ms, t4, t6, 2048, 768, 16, 8, 16, ROUTE_MIX);
    check_xmm_chain(ms, t4, t4, 2048, 768, 32, 8, 16, ROUTE_ONE);
    report("xmm-tiles-ran", "MEMRA_CUDA_XMM_ITEMS=0 TPW=2", mr_cu_xmm_tiles_launches(ms) > 0 ? 0.0 : 1.0, 0, 0.0);
    ms->destroy(ms);
    mr_backend *mi = backend_with2("MEMRA_CUDA_XMM", "iq4", "MEMRA_CUDA_XMM_TPW", "3");
    check_xmm_chain(mi, ti, ti, 2048, 512, 32, 8, 16, ROUTE_RANDOM);
    check_xmm_chain(mi, ti, ti, 2048, 512, 32, 8, 64, ROUTE_RANDOM);
    check_xmm_chain(mi, ti, ti, 1024, 256, 8, 2, 5, ROUTE_BAD);
    report("xmm-tiles-ran", "IQ4_XS MEMRA_CUDA_XMM_TPW=3", mr_cu_xmm_tiles_launches(mi) > 0 ? 0.0 : 1.0, 0, 0.0);
    mi->destroy(mi);
    setenv("MEMRA_CUDA_XMM", "0", 1); /* main's setting */
}

static void check_xmm_all(void)
{
    setenv("MEMRA_CUDA_XMM", "2", 1);
    mr_backend *xmm = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_XMM", "0", 1); /* main's setting */
    if (!xmm) die("cuda (xmm)");
    const tdesc *t4 = td_of(MR_TYPE_Q4_K), *t6 = td_of(MR_TYPE_Q6_K);
    for (int v = 0; v < 3; v++) { /* Q4_K; the 30B-A3B's even layers (Q6_K down); Q6_K gate/up too */
        const tdesc *tg = v < 2 ? t4 : t6, *tdn = v ? t6 : t4;
        check_xmm_chain(xmm, tg, tdn, 2048, 768, 32, 8, 1, ROUTE_RANDOM); /* the 30B-A3B's experts, fewer of them */
        check_xmm_chain(xmm, tg, tdn, 2048, 768, 32, 8, 4, ROUTE_RANDOM);
        check_xmm_chain(xmm, tg, tdn, 2048, 768, 32, 8, 16, ROUTE_RANDOM);
        check_xmm_chain(xmm, tg, tdn, 2048, 768, 16, 8, 16, ROUTE_MIX); /* several pairs an expert */
        check_xmm_chain(xmm, tg, tdn, 2048, 768, 32, 8, 16, ROUTE_ONE); /* 16 pairs on one expert */
        check_xmm_chain(xmm, tg, tdn, 2048, 768, 32, 8, 64, ROUTE_RANDOM);
        check_xmm_chain(xmm, tg, tdn, 1024, 256, 8, 2, 5, ROUTE_BAD);
        check_xmm_chain(xmm, tg, tdn, 4096, 1536, 8, 8, 16, ROUTE_RANDOM);
    }
    /* IQ4_XS (MEMRA_CUDA_XMM=iq4): the 35B-A3B's experts, fewer of them */
    setenv("MEMRA_CUDA_XMM", "iq4", 1);
    mr_backend *xiq = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_XMM", "0", 1);
    if (!xiq) die("cuda (xmm iq4)");
    const tdesc *ti = td_of(MR_TYPE_IQ4_XS);
    check_xmm_chain(xiq, ti, ti, 2048, 512, 32, 8, 1, ROUTE_RANDOM);
    check_xmm_chain(xiq, ti, ti, 2048, 512, 32, 8, 4, ROUTE_RANDOM);
    check_xmm_chain(xiq, ti, ti, 2048, 512, 32, 8, 16, ROUTE_RANDOM);
    check_xmm_chain(xiq, ti, ti, 2048, 512, 16, 8, 16, ROUTE_MIX);
    check_xmm_chain(xiq, ti, ti, 2048, 512, 32, 8, 16, ROUTE_ONE);
    check_xmm_chain(xiq, ti, ti, 2048, 512, 32, 8, 64, ROUTE_RANDOM);
    check_xmm_chain(xiq, ti, ti, 1024, 256, 8, 2, 5, ROUTE_BAD);
    check_batch_invariance_one(xiq, "batch-inv-xmm", ti, 512, 2048, 16, 8);
    check_xmm_rows(xiq, ti, 1024, 264, 8, 2, 5);
    xiq->destroy(xiq);
    for (int v = 0; v < 2; v++) {
        const tdesc *td = v ? t6 : t4;
        /* the matmul_id path alone: 2..5 tokens against each alone (one
         * input row a pair) */
        check_batch_invariance_one(xmm, "batch-inv-xmm", td, 768, 2048, 16, 8);
        check_batch_invariance_one(xmm, "batch-inv-xmm", td, 2048, 768, 16, 8);
        check_batch_invariance_one(xmm, "batch-inv-xmm", td, 1024, 264, 8, 2); /* rows not a multiple of the tiles */
        check_xmm_rows(xmm, td, 1024, 264, 8, 2, 1);
        check_xmm_rows(xmm, td, 1024, 264, 8, 2, 5);
        check_xmm_rows(xmm, td, 4096, 24, 8, 4, 3);
    }
    xmm->destroy(xmm);
    /* a decode batch a block an expert (MEMRA_CUDA_XMM_ITEMS=0) instead of
     * a block a chunk of two pairs: the same bits as each token alone */
    setenv("MEMRA_CUDA_XMM", "2", 1);
    setenv("MEMRA_CUDA_XMM_ITEMS", "0", 1);
    mr_backend *slots = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_XMM", "0", 1);
    unsetenv("MEMRA_CUDA_XMM_ITEMS");
    if (!slots) die("cuda (xmm, a block an expert)");
    for (int v = 0; v < 2; v++) {
        check_batch_invariance_one(slots, "batch-inv-xmm-slots", v ? t6 : t4, 768, 2048, 16, 8);
        check_batch_invariance_one(slots, "batch-inv-xmm-slots", v ? t6 : t4, 2048, 768, 16, 8);
    }
    slots->destroy(slots);
}

static void check_moe_ffn(void)
{
    const int types[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_IQ4_XS, MR_TYPE_Q8_0, MR_TYPE_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const tdesc *td = td_of(types[i]);
        check_moe_ffn_one(gpu, "moe-ffn-bits", td, td, 2048, 768, 16, 8, 150, ROUTE_RANDOM); /* 30B-A3B */
        check_moe_ffn_one(gpu, "moe-ffn-bits", td, td, 2048, 512, 32, 8, 67, ROUTE_RANDOM);  /* 35B-A3B */
        check_moe_ffn_one(gpu, "moe-ffn-bits", td, td, 1024, 256, 8, 2, 65, ROUTE_BAD);
        check_moe_ffn_one(gpu_x3, "moe-ffn-bits-x3", td, td, 2048, 512, 32, 8, 67, ROUTE_RANDOM);
        check_moe_ffn_one(gpu_x3, "moe-ffn-bits-x3", td, td, 1024, 256, 8, 2, 65, ROUTE_BAD);
    }
    /* Q4_K_M's mix: Q4_K gate and up, Q6_K down; and a down the fused path
     * does not take (the calls apart, gate and up each fused on its own) */
    const tdesc *q4k = td_of(MR_TYPE_Q4_K), *q6k = td_of(MR_TYPE_Q6_K), *bf = td_of(MR_TYPE_BF16);
    check_moe_ffn_one(gpu, "moe-ffn-bits", q4k, q6k, 2048, 768, 16, 8, 150, ROUTE_RANDOM); /* 30B-A3B */
    check_moe_ffn_one(gpu, "moe-ffn-bits", q4k, q6k, 1024, 256, 8, 2, 65, ROUTE_BAD);
    check_moe_ffn_one(gpu, "moe-ffn-bits", q4k, bf, 1024, 256, 8, 2, 65, ROUTE_BAD);
    check_moe_ffn_one(gpu, "moe-ffn-bits", td_of(MR_TYPE_Q8_0), td_of(MR_TYPE_Q8_0), 1024, 256, 8, 4, 65,
                      ROUTE_RANDOM);
    check_moe_ffn_one(gpu, "moe-ffn-bits", bf, bf, 1024, 256, 8, 2, 65, ROUTE_RANDOM); /* the calls apart */
    check_moe_ffn_one(gpu_x3, "moe-ffn-bits-x3", q4k, q6k, 1024, 256, 8, 2, 65, ROUTE_BAD);
}

/* ---- prompt rows: the same bits in any call (matmul_prompt) ----
 * A prompt row's product may not depend on how many rows share its call:
 * the scheduler cuts prompts into chunks of any size and adds other
 * requests' prompts to a step.  n = 150 rows in one matmul_prompt call
 * against the same rows in calls of 1, 7, 64 and 65 rows, bit for bit,
 * plain and expert products, for the default (float16) and f16x3 GEMMs; the
 * one-call result against the CPU backend with the GEMM bound. */
static void check_prompt_rows_one(mr_backend *be, const char *label, double bound, const tdesc *td, int64_t cols,
                                  int64_t rows, int mats, int k)
{
    enum { NP = 150 };
    const size_t rb = (size_t)(cols / td->be) * td->bb;
    uint8_t *host = malloc(rb * rows * mats);
    rand_blocks(td, host, rb * rows * mats / td->bb);
    const int xs = mats > 1 ? k : 1;
    const size_t xr = (size_t)xs * cols, yr = (size_t)(mats > 1 ? k : 1) * rows;
    float *x = malloc(NP * xr * 4), *y1 = malloc(NP * yr * 4), *yc = malloc(NP * yr * 4);
    for (size_t i = 0; i < NP * xr; i++) x[i] = fgauss();
    int32_t *ids = malloc(NP * (size_t)k * 4);
    make_ids(ids, NP, k, mats, ROUTE_RANDOM);
    mr_weight w;
    load_weight(be, td, host, cols, rows, mats, &w);
    float *dx = dup_to(be, x, NP * xr * 4), *dy = dalloc(be, NP * yr * 4);
    int32_t *dids = mats > 1 ? dup_to(be, ids, NP * (size_t)k * 4) : NULL;
    char shape[96];
    if (mats > 1)
        snprintf(shape, sizeof shape, "%s %dx%lldx%lld k=%d", td->name, mats, (long long)rows, (long long)cols, k);
    else
        snprintf(shape, sizeof shape, "%s %lldx%lld", td->name, (long long)rows, (long long)cols);
    poison(be, dy, NP * yr * 4);
    if (mats > 1)
        be->matmul_id_prompt(be, &w, dx, xs, dids, k, dy, NP);
    else
        be->matmul_prompt(be, &w, dx, dy, NP);
    fetch(be, y1, dy, NP * yr * 4);
    if (cpu) {
        mr_weight cw;
        load_weight(cpu, td, host, cols, rows, mats, &cw);
        float *cx = dup_to(cpu, x, NP * xr * 4), *cy = dalloc(cpu, NP * yr * 4);
        int32_t *cids = mats > 1 ? dup_to(cpu, ids, NP * (size_t)k * 4) : NULL;
        if (mats > 1)
            cpu->matmul_id(cpu, &cw, cx, xs, cids, k, cy, NP);
        else
            cpu->matmul(cpu, &cw, cx, cy, NP);
        float *yh = malloc(NP * yr * 4);
        fetch(cpu, yh, cy, NP * yr * 4);
        char sh[160];
        snprintf(sh, sizeof sh, "%s n=%d", shape, NP);
        char op[48];
        snprintf(op, sizeof op, "%s-cpu", label);
        report_f(op, sh, y1, yh, NP * yr, bound);
        free(yh);
        cpu->free(cpu, cx); cpu->free(cpu, cy);
        if (cids) cpu->free(cpu, cids);
        cpu->weight_release(cpu, &cw);
    }
    const int steps[] = {1, 7, 64, 65};
    for (size_t q = 0; q < sizeof steps / sizeof steps[0]; q++) {
        poison(be, dy, NP * yr * 4);
        for (int r = 0; r < NP; r += steps[q]) {
            const int n = NP - r < steps[q] ? NP - r : steps[q];
            if (mats > 1)
                be->matmul_id_prompt(be, &w, dx + (size_t)r * xr, xs, dids + (size_t)r * k, k, dy + (size_t)r * yr, n);
            else
                be->matmul_prompt(be, &w, dx + (size_t)r * xr, dy + (size_t)r * yr, n);
        }
        fetch(be, yc, dy, NP * yr * 4);
        size_t diff = 0;
        int nan = 0;
        for (size_t i = 0; i < NP * yr; i++) {
            diff += memcmp(&yc[i], &y1[i], 4) != 0;
            nan += isnan(yc[i]);
        }
        char sh[160];
        snprintf(sh, sizeof sh, "%s calls of %d vs one of %d", shape, steps[q], NP);
        report(label, sh, (double)diff, nan, 0.0);
    }
    be->free(be, dx);
    be->free(be, dy);
    if (dids) be->free(be, dids);
    be->weight_release(be, &w);
    free(host); free(x); free(y1); free(yc); free(ids);
}

/* The prompt products of IQ4_XS on the int8 tensor cores (the default,
 * and MEMRA_CUDA_XMP=4: the same kernels at 4 blocks an SM): experts against float64
 * sums at 65+ tokens (16-bit inputs: 1e-4, the float16 kernel's bound is
 * 2e-3), a prompt's rows the same bits in calls of 1, 7, 64 and 65 tokens
 * as in one call (experts, and the dense products of f16x3 mode: against
 * the CPU backend 1e-5 with their 3 planes), moe_ffn_prompt bit for bit
 * against its calls apart (NaN rows of bad ids included). */
/* A backend with MEMRA_CUDA_XMP=xmp and var=val (var NULL: none); the
 * environment keeps main's MEMRA_CUDA_XMP=0 after. */
static mr_backend *xmp_backend(const char *xmp, const char *var, const char *val)
{
    setenv("MEMRA_CUDA_XMP", xmp, 1);
    mr_backend *be = var ? backend_with(var, val) : mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_XMP", "0", 1);
    if (!be) die("cuda (xmp)");
    return be;
}

static void check_xmp_all(void)
{
    const tdesc *ti = td_of(MR_TYPE_IQ4_XS);
    const char *set[2] = {"1", "4"};
    for (int v = 0; v < 2; v++) {
        mr_backend *be = xmp_backend(set[v], NULL, NULL);
        check_expert_rows(be, "xmp-rows", ti, 2048, 512, 32, 8, 67, ROUTE_RANDOM, 1e-4); /* the 35B-A3B's gate */
        check_expert_rows(be, "xmp-rows", ti, 512, 2048, 32, 8, 67, ROUTE_RANDOM, 1e-4); /* and down */
        check_expert_rows(be, "xmp-rows", ti, 2048, 512, 32, 8, 80, ROUTE_ONE, 1e-4);    /* 640 pairs: 20 tiles */
        check_expert_rows(be, "xmp-rows", ti, 1024, 128, 4, 2, 70, ROUTE_MIX, 1e-4);
        check_expert_rows(be, "xmp-rows", ti, 4096, 64, 8, 4, 70, ROUTE_RANDOM, 1e-4);
        check_prompt_rows_one(be, "xmp-inv", 1e-4, ti, 1024, 128, 32, 8);
        check_prompt_rows_one(be, "xmp-inv", 1e-4, ti, 2048, 512, 128, 8);
        check_moe_ffn_one(be, "xmp-ffn-bits", ti, ti, 2048, 512, 32, 8, 67, ROUTE_RANDOM);
        check_moe_ffn_one(be, "xmp-ffn-bits", ti, ti, 2048, 512, 256, 8, 512, ROUTE_RANDOM); /* the 35B-A3B's pp512 */
        check_moe_ffn_one(be, "xmp-ffn-bits", ti, ti, 1024, 256, 8, 2, 65, ROUTE_BAD);
        be->destroy(be);
        /* dense products, in f16x3 mode (3 planes; float32-grade: f16x3's
         * bound) */
        be = xmp_backend(set[v], "MEMRA_CUDA_GEMM", "f16x3");
        check_prompt_rows_one(be, "xmp-inv-x3", 1e-5, ti, 2048, 512, 1, 1);
        check_prompt_rows_one(be, "xmp-inv-x3", 1e-5, ti, 4096, 256, 1, 1);
        check_prompt_rows_one(be, "xmp-inv-x3", 1e-5, ti, 512, 192, 1, 1);
        be->destroy(be);
    }
    /* Q4_K (experts with MEMRA_CUDA_XMH=0, as main's environment has it; the
     * default is the part "xmh"'s kernel): the 30B-A3B's experts, and dense products
     * in f16x3 mode */
    const tdesc *t4 = td_of(MR_TYPE_Q4_K);
    mr_backend *be = xmp_backend("1", "MEMRA_CUDA_XMP_Q4K", "1");
    setenv("MEMRA_CUDA_GEMM", "f16x3", 1);
    mr_backend *b3 = xmp_backend("1", "MEMRA_CUDA_XMP_Q4K", "1");
    unsetenv("MEMRA_CUDA_GEMM");
    check_expert_rows(be, "xmp-rows", t4, 2048, 768, 32, 8, 67, ROUTE_RANDOM, 1e-4);
    check_expert_rows(be, "xmp-rows", t4, 768, 2048, 32, 8, 67, ROUTE_RANDOM, 1e-4);
    check_expert_rows(be, "xmp-rows", t4, 2048, 768, 32, 8, 80, ROUTE_ONE, 1e-4);
    check_prompt_rows_one(be, "xmp-inv", 1e-4, t4, 1024, 128, 32, 8);
    check_moe_ffn_one(be, "xmp-ffn-bits", t4, t4, 2048, 768, 128, 8, 512, ROUTE_RANDOM); /* the 30B-A3B's pp512 */
    check_moe_ffn_one(be, "xmp-ffn-bits", t4, t4, 1024, 256, 8, 2, 65, ROUTE_BAD);
    /* Q4_K_M's even layers: Q4_K gate/up here, the Q6_K down on the float16 kernel */
    const tdesc *t6 = td_of(MR_TYPE_Q6_K);
    check_moe_ffn_one(be, "xmp-ffn-bits", t4, t6, 2048, 768, 128, 8, 512, ROUTE_RANDOM);
    check_moe_ffn_one(be, "xmp-ffn-bits", t4, t6, 1024, 256, 8, 2, 65, ROUTE_BAD);
    check_prompt_rows_one(b3, "xmp-inv-x3", 1e-5, t4, 2048, 512, 1, 1);
    check_prompt_rows_one(b3, "xmp-inv-x3", 1e-5, t4, 512, 192, 1, 1);
    be->destroy(be);
    b3->destroy(b3);
}

/* Part "xmh": the Q4_K, Q6_K and IQ4_XS expert products on the float16
 * tensor cores with the weights decoded in registers (cu_moemmh.cu, the
 * default):
 * experts against float64 (the float16 kernel's bound, 2e-3) in tiles of
 * 1..64 tokens of an expert (one expert's 640 pairs: 10 full tiles), a
 * prompt's rows the same bits in calls of 1, 7, 64 and 65 tokens as in one
 * call, moe_ffn_prompt bit for bit against its calls apart (a Q6_K down on
 * the float16 kernel; NaN rows of bad ids included). */
/* A backend with MEMRA_CUDA_XMH=xmh (IQ4_XS included, whatever the
 * caller's MEMRA_CUDA_XMH_IQ4); the environment keeps main's
 * MEMRA_CUDA_XMH=0 after (the other parts check the float16 kernel), as
 * xmp_backend does for its switch. */
static mr_backend *xmh_backend(const char *xmh)
{
    setenv("MEMRA_CUDA_XMH", xmh, 1);
    mr_backend *be = backend_with("MEMRA_CUDA_XMH_IQ4", "1");
    setenv("MEMRA_CUDA_XMH", "0", 1);
    return be;
}

static void check_xmh_all(void)
{
    const tdesc *t4 = td_of(MR_TYPE_Q4_K), *t6 = td_of(MR_TYPE_Q6_K), *ti = td_of(MR_TYPE_IQ4_XS);
    mr_backend *be = xmh_backend("1");
    check_expert_rows(be, "xmh-rows", t4, 2048, 768, 32, 8, 67, ROUTE_RANDOM, 2e-3); /* the 30B-A3B's gate */
    check_expert_rows(be, "xmh-rows", t4, 768, 2048, 32, 8, 67, ROUTE_RANDOM, 2e-3); /* and down */
    check_expert_rows(be, "xmh-rows", t4, 2048, 768, 32, 8, 80, ROUTE_ONE, 2e-3);
    check_expert_rows(be, "xmh-rows", t4, 2048, 768, 32, 8, 300, ROUTE_RANDOM, 2e-3); /* ~75 pairs an expert */
    check_expert_rows(be, "xmh-rows", t4, 1024, 128, 4, 2, 70, ROUTE_MIX, 2e-3);
    check_prompt_rows_one(be, "xmh-inv", 2e-3, t4, 1024, 128, 32, 8);
    check_prompt_rows_one(be, "xmh-inv", 2e-3, t4, 768, 2048, 16, 8);
    check_moe_ffn_one(be, "xmh-ffn-bits", t4, t4, 2048, 768, 128, 8, 512, ROUTE_RANDOM); /* the 30B-A3B's pp512 */
    check_moe_ffn_one(be, "xmh-ffn-bits", t4, t4, 1024, 256, 8, 2, 65, ROUTE_BAD);
    /* Q6_K (the 30B-A3B's even layers' down), from the padded copy */
    check_expert_rows(be, "xmh-rows", t6, 768, 2048, 32, 8, 67, ROUTE_RANDOM, 2e-3);
    check_expert_rows(be, "xmh-rows", t6, 768, 2048, 32, 8, 80, ROUTE_ONE, 2e-3);
    check_expert_rows(be, "xmh-rows", t6, 2048, 256, 4, 2, 70, ROUTE_MIX, 2e-3);
    check_prompt_rows_one(be, "xmh-inv", 2e-3, t6, 768, 2048, 16, 8);
    check_moe_ffn_one(be, "xmh-ffn-bits", t4, t6, 2048, 768, 128, 8, 512, ROUTE_RANDOM); /* an even layer */
    check_moe_ffn_one(be, "xmh-ffn-bits", t4, t6, 1024, 256, 8, 2, 65, ROUTE_BAD);
    check_moe_ffn_one(be, "xmh-ffn-bits", t6, t6, 1024, 256, 8, 2, 65, ROUTE_RANDOM);
    /* IQ4_XS: the 35B-A3B's experts */
    check_expert_rows(be, "xmh-rows", ti, 2048, 512, 32, 8, 67, ROUTE_RANDOM, 2e-3);
    check_expert_rows(be, "xmh-rows", ti, 512, 2048, 32, 8, 67, ROUTE_RANDOM, 2e-3);
    check_expert_rows(be, "xmh-rows", ti, 2048, 512, 32, 8, 80, ROUTE_ONE, 2e-3);
    check_prompt_rows_one(be, "xmh-inv", 2e-3, ti, 2048, 512, 128, 8);
    check_moe_ffn_one(be, "xmh-ffn-bits", ti, ti, 2048, 512, 256, 8, 512, ROUTE_RANDOM); /* the 35B-A3B's pp512 */
    check_moe_ffn_one(be, "xmh-ffn-bits", ti, ti, 1024, 256, 8, 2, 65, ROUTE_BAD);
    be->destroy(be);
    /* MEMRA_CUDA_XMH=q4k: the Q6_K down on the float16 kernel beside them */
    be = xmh_backend("q4k");
    check_moe_ffn_one(be, "xmh-ffn-bits", t4, t6, 2048, 768, 128, 8, 512, ROUTE_RANDOM);
    be->destroy(be);
}

static void q8_refs(const tdesc *td, const uint8_t *host, size_t rb, int64_t cols, int64_t rows,
                    const float *x, const double *xh, int64_t xrow, int nt, size_t mat, double *rq,
                    double *rf);
static void check_batch_invariance_ns(mr_backend *be, const char *label, const tdesc *td, int64_t cols,
                                      int64_t rows, int mats, int k, const int *ns, int nn);
static void check_multi_vs_one(mr_backend *be, const char *label, const tdesc *td, int64_t r0, int64_t r1,
                               int64_t r2, int64_t cols, int n, long saved);

/* Decode batches of dense Q4_K products on the int8 tensor cores
 * (cu_mvxmd.cu, the default): against float64 sums at the decode
 * bound (22-bit inputs), a token's rows the same bits at 2..64 tokens a
 * call as alone (1-2 tokens: the kernel quantizes its input itself; 3+:
 * the quantization's launch, then chunks of 8, or of 16 with
 * MEMRA_CUDA_XMD_NG=2), and q, k, v sharing one launch bit for bit
 * against their calls apart. */
static void check_xmd_prec(mr_backend *be, const tdesc *td, int64_t cols, int64_t rows, int n)
{
    const size_t rb = (size_t)(cols / td->be) * td->bb, xn = (size_t)n * cols, yn = (size_t)n * rows;
    uint8_t *host = malloc(rb * rows);
    rand_blocks(td, host, rb * rows / td->bb);
    float *x = malloc(xn * 4), *y = malloc(yn * 4);
    double *xd = malloc(xn * 8), *ref = malloc(yn * 8);
    for (size_t i = 0; i < xn; i++) xd[i] = x[i] = fgauss();
    q8_refs(td, host, rb, cols, rows, x, xd, 0, n, 0, ref, NULL); /* float64 sums against x itself */
    matmul_host(be, td, host, cols, rows, x, n, y);
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d", td->name, (long long)rows, (long long)cols, n);
    report_rel("xmd-matmul", shape, y, ref, yn, 2e-5);
    free(host); free(x); free(y); free(xd); free(ref);
}

/* How many of the shapes sh[i] = (columns, rows, whether the tensor-core
 * rule should take them) mr_cu_xmd_takes_one gets wrong for type td. */
static long xmd_rule_wrong(mr_backend *be, const tdesc *td, const int64_t (*sh)[3], size_t n)
{
    long wrong = 0;
    for (size_t i = 0; i < n; i++) {
        tweight w;
        tw_make(&w, td, sh[i][0], sh[i][1], 1);
        mr_weight wb = w.g;
        wrong += (mr_cu_xmd_takes_one(be, &wb) != 0) != (sh[i][2] != 0);
        tw_free(&w);
    }
    return wrong;
}

/* IQ4_XS on the int8 tensor cores (MEMRA_CUDA_XMD_IQ4XS, on with xmd): with
 * =x24 the 22-bit kernel's shapes (at most 2,048 columns, 4,096 rows or
 * more, or fewer than 128), by default all: that the kernels take them
 * ("xmd-iq4-taken": 0 when every shape that should go there does, and the
 * others do not), the products against float64 at 1, 2 and 3+ tokens on
 * each one-token kernel, a token alone against batches bit for bit, and
 * the 35B-A3B's in-projection launch against its products one at a time. */
static void check_xmd_iq4(void)
{
    const tdesc *ti = td_of(MR_TYPE_IQ4_XS);
    const int ns[] = {2, 3, 5, 8, 9, 16, 17, 21, 40, 64};
    const int nn = (int)(sizeof ns / sizeof ns[0]);
    static const char *const one[] = {"auto", "0", "1", "3"};
    for (int v = 0; v < 4; v++) {
        setenv("MEMRA_CUDA_XMD", "1", 1);
        setenv("MEMRA_CUDA_XMD_ONE", one[v], 1);
        mr_backend *be = backend_with("MEMRA_CUDA_XMD_IQ4XS", "x24");
        unsetenv("MEMRA_CUDA_XMD_IQ4XS");
        unsetenv("MEMRA_CUDA_XMD_ONE");
        setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
        if (v == 0) {
            /* (columns, rows, whether the rule takes them) */
            static const int64_t sh[][3] = {{2048, 8192, 1}, {2048, 4096, 1}, {2048, 32, 1}, {1024, 96, 1},
                                            {2048, 2048, 0}, {4096, 4096, 0}, {2048, 512, 0}, {2048, 40, 0}};
            report("xmd-iq4-taken", "IQ4_XS by the shape rule",
                   (double)xmd_rule_wrong(be, ti, sh, sizeof sh / sizeof sh[0]), 0, 0.0);
            check_multi_vs_one(be, "xmd-iq4", ti, 8192, 4096, 32, 2048, 1, 2);
            check_multi_vs_one(be, "xmd-iq4", ti, 8192, 4096, 32, 2048, 5, 2);
            check_multi_vs_one(be, "xmd-iq4", ti, 4096, 32, 32, 2048, 16, 2);
        }
        char lab[40];
        snprintf(lab, sizeof lab, "xmd-iq4-one%s-inv", one[v]);
        const int pn[] = {1, 2, 3, 9};
        for (size_t i = 0; i < sizeof pn / sizeof pn[0]; i++) {
            check_xmd_prec(be, ti, 2048, 4096, pn[i]);
            check_xmd_prec(be, ti, 1024, 96, pn[i]);
        }
        check_xmd_prec(be, ti, 256, 4096, 1); /* one block a row: slices idle */
        check_xmd_prec(be, ti, 1280, 32, 1);  /* five blocks */
        check_batch_invariance_ns(be, lab, ti, 2048, 8192, 1, 1, ns, nn);
        check_batch_invariance_ns(be, lab, ti, 2048, 32, 1, 1, ns, nn);
        check_batch_invariance_ns(be, lab, ti, 1280, 112, 1, 1, ns, nn);
        be->destroy(be);
    }
    /* MEMRA_CUDA_XMD_IQ4XS=all: every IQ4_XS shape the kernels take (the
     * 35B-A3B's out-projections, 4,096 columns, and its shared expert) */
    setenv("MEMRA_CUDA_XMD", "1", 1);
    mr_backend *be = backend_with("MEMRA_CUDA_XMD_IQ4XS", "all");
    setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
    static const int64_t sh[][3] = {{4096, 2048, 1}, {2048, 512, 1}, {512, 2048, 1}, {2048, 2048, 1},
                                    {4096, 4096, 1}, {2048, 8192, 1}, {2048, 40, 0}, {2048, 16384, 0}};
    report("xmd-iq4-taken", "IQ4_XS, MEMRA_CUDA_XMD_IQ4XS=all",
           (double)xmd_rule_wrong(be, ti, sh, sizeof sh / sizeof sh[0]), 0, 0.0);
    const int pn[] = {1, 2, 3, 9, 16};
    for (size_t i = 0; i < sizeof pn / sizeof pn[0]; i++) {
        check_xmd_prec(be, ti, 4096, 2048, pn[i]);
        check_xmd_prec(be, ti, 512, 2048, pn[i]);
        check_xmd_prec(be, ti, 2048, 512, pn[i]);
    }
    check_batch_invariance_ns(be, "xmd-iq4-all-inv", ti, 4096, 2048, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-iq4-all-inv", ti, 512, 2048, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-iq4-all-inv", ti, 2048, 512, 1, 1, ns, nn);
    check_multi_vs_one(be, "xmd-iq4-all", ti, 512, 512, 512, 2048, 16, 2);
    be->destroy(be);
}

static void check_xmd_all(void)
{
    const tdesc *t4 = td_of(MR_TYPE_Q4_K);
    setenv("MEMRA_CUDA_XMD", "1", 1);
    mr_backend *be = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
    if (!be) die("cuda (xmd)");
    const int pn[] = {1, 2, 7, 8, 9, 16, 21};
    for (size_t i = 0; i < sizeof pn / sizeof pn[0]; i++) {
        check_xmd_prec(be, t4, 2048, 512, pn[i]);
        check_xmd_prec(be, t4, 4096, 96, pn[i]);
    }
    check_xmd_prec(be, t4, 256, 48, 3); /* one block a row: three slices idle */
    check_xmd_prec(be, t4, 1280, 80, 5); /* five blocks: slices of 2, 1, 1, 1 */
    check_xmd_prec(be, t4, 12288, 64, 1); /* the 8B's down: 80 KB of quantized input a block */
    check_xmd_prec(be, t4, 12288, 64, 2);
    check_xmd_prec(be, t4, 10240, 32, 1); /* five steps a warp: two steps a pass and the odd one */
    const int ns[] = {2, 3, 5, 8, 9, 16, 17, 21, 40, 64};
    const int nn = (int)(sizeof ns / sizeof ns[0]);
    check_batch_invariance_ns(be, "xmd-batch-inv", t4, 2048, 5120, 1, 1, ns, nn); /* the 30B-A3B's q/k/v rows */
    check_batch_invariance_ns(be, "xmd-batch-inv", t4, 4096, 2048, 1, 1, ns, nn); /* its o */
    check_batch_invariance_ns(be, "xmd-batch-inv", t4, 1280, 208, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-batch-inv", t4, 12288, 64, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-batch-inv", t4, 10240, 32, 1, 1, ns, nn);
    const int mn[] = {1, 5, 16, 21};
    for (size_t i = 0; i < sizeof mn / sizeof mn[0]; i++)
        check_multi_vs_one(be, "xmd", t4, 4096, 512, 512, 2048, mn[i], 2);
    check_multi_vs_one(be, "xmd", t4, 48, 16, 32, 768, 3, 2);
    be->destroy(be);
    /* MEMRA_CUDA_XMD_ONE: one token on each of its kernels whatever the
     * launch (the default picks by the launch: xmd_pick_one), against
     * float64 and, as each token alone, against batches of 2 (k_xmd2) and
     * more (k_xmd) bit for bit: 2 and 6 steps a warp, 5 (two passes and the
     * odd step), 1 and idle slices */
    static const char *const one[] = {"0", "1", "3"}; /* k_xmd2, k_xmd1 at 2 and 3 blocks an SM */
    for (int v = 0; v < 3; v++) {
        be = backend_with2("MEMRA_CUDA_XMD", "1", "MEMRA_CUDA_XMD_ONE", one[v]);
        setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
        check_xmd_prec(be, t4, 4096, 96, 1);
        check_xmd_prec(be, t4, 12288, 64, 1);
        check_xmd_prec(be, t4, 10240, 32, 1);
        check_xmd_prec(be, t4, 1280, 80, 1);
        check_xmd_prec(be, t4, 256, 48, 1);
        check_batch_invariance_ns(be, "xmd-one-inv", t4, 2048, 5120, 1, 1, ns, nn);
        check_batch_invariance_ns(be, "xmd-one-inv", t4, 4096, 6144, 1, 1, ns, nn); /* the 8B's q/k/v rows */
        check_batch_invariance_ns(be, "xmd-one-inv", t4, 12288, 64, 1, 1, ns, nn);
        check_batch_invariance_ns(be, "xmd-one-inv", t4, 10240, 32, 1, 1, ns, nn);
        check_batch_invariance_ns(be, "xmd-one-inv", t4, 1280, 208, 1, 1, ns, nn);
        be->destroy(be);
    }
    /* MEMRA_CUDA_XMD_NG=2: 9+ tokens in chunks of 16, the same bits */
    setenv("MEMRA_CUDA_XMD", "1", 1);
    be = backend_with("MEMRA_CUDA_XMD_NG", "2");
    setenv("MEMRA_CUDA_XMD", "0", 1);
    check_batch_invariance_ns(be, "xmd-ng2-inv", t4, 2048, 5120, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-ng2-inv", t4, 4096, 2048, 1, 1, ns, nn);
    be->destroy(be);
    /* MEMRA_CUDA_XMD_IL=0: k_xmp_quant's rows instead of the interleaved
     * operand (the default, in every line above), the same bits, both
     * types (the 30B-A3B's q/k/v and o, a partial last chunk, the 8B's
     * down, the 35B-A3B's IQ4_XS shapes) */
    setenv("MEMRA_CUDA_XMD", "1", 1);
    be = backend_with("MEMRA_CUDA_XMD_IL", "0");
    setenv("MEMRA_CUDA_XMD", "0", 1);
    for (size_t i = 0; i < sizeof pn / sizeof pn[0]; i++)
        check_xmd_prec(be, t4, 2048, 512, pn[i]);
    check_xmd_prec(be, t4, 1280, 80, 5);
    check_xmd_prec(be, t4, 12288, 64, 3);
    check_xmd_prec(be, td_of(MR_TYPE_IQ4_XS), 4096, 2048, 16);
    check_batch_invariance_ns(be, "xmd-plain-inv", t4, 2048, 5120, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-plain-inv", t4, 4096, 2048, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-plain-inv", t4, 1280, 208, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-plain-inv", t4, 12288, 64, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-plain-inv", td_of(MR_TYPE_IQ4_XS), 2048, 8192, 1, 1, ns, nn);
    check_batch_invariance_ns(be, "xmd-plain-inv", td_of(MR_TYPE_IQ4_XS), 4096, 2048, 1, 1, ns, nn);
    for (size_t i = 0; i < sizeof mn / sizeof mn[0]; i++)
        check_multi_vs_one(be, "xmd-plain", t4, 4096, 512, 512, 2048, mn[i], 2);
    be->destroy(be);
    check_xmd_iq4();
}

static void check_prompt_rows(void)
{
    const int types[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_IQ4_XS, MR_TYPE_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const tdesc *td = td_of(types[i]);
        check_prompt_rows_one(gpu, "prompt-inv", mm_gemm_bound[0], td, 2048, 300, 1, 1);
        check_prompt_rows_one(gpu, "prompt-inv", mm_gemm_bound[0], td, 1024, 128, 32, 8);
        check_prompt_rows_one(gpu_x3, "prompt-inv-f16x3", 1e-5, td, 2048, 300, 1, 1);
        check_prompt_rows_one(gpu_x3, "prompt-inv-f16x3", 1e-5, td, 1024, 128, 32, 8);
    }
    check_prompt_rows_one(gpu, "prompt-inv", mm_gemm_bound[0], td_of(MR_TYPE_Q4_K), 4096, 4096, 1, 1);
    check_prompt_rows_one(gpu, "prompt-inv", mm_gemm_bound[0], td_of(MR_TYPE_BF16), 1024, 70, 16, 4); /* padded experts */
    /* the float32 path of small matrices: one column chunk (512), several
     * (2048: four partial sums joined; 1280: the last of 256), one row, 32
     * rows (the hybrids' gate projections), rows past a tile; float32
     * sums: the f16x3 bound */
    const int st[] = {MR_TYPE_IQ4_XS, MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_BF16, MR_TYPE_F32};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        const tdesc *td = td_of(st[i]);
        check_prompt_rows_one(gpu_sg, "prompt-inv-small", 1e-5, td, 2048, 1, 1, 1);
        check_prompt_rows_one(gpu_sg, "prompt-inv-small", 1e-5, td, 2048, 32, 1, 1);
        check_prompt_rows_one(gpu_sg, "prompt-inv-small", 1e-5, td, 512, 300, 1, 1);
        check_prompt_rows_one(gpu_sg, "prompt-inv-small", 1e-5, td, 1280, 70, 1, 1);
    }
}

/* ---- prompt products over one input as one GEMM (mr_cu_matmul_prompt_multi) ----
 * m matmul_prompt calls recorded back to back over one input (q/k/v,
 * gate/up of a prompt chunk): the recorder joins them where the float16
 * GEMM takes them all (`fused`: m - 1 products counted inside another's
 * GEMM a group, else 0).  Each output against float64 sums (the GEMM
 * bound); the same products in calls of 7 and 64 rows bit for bit against
 * one call of 150 (a row's sum is a function of the joined shape); the
 * first matrix (over 2,048 rows, so its own call never splits k) bit for
 * bit against its call alone. */
static void check_prompt_multi_one(mr_backend *be, const char *label, const int *types, const int64_t *rows, int m,
                                   int64_t cols, bool fused)
{
    enum { NP = 150 };
    mr_weight w[MULTI_MAX];
    uint8_t *host[MULTI_MAX];
    float *dy[MULTI_MAX], *y1[MULTI_MAX];
    float *x = malloc(NP * (size_t)cols * 4);
    for (size_t i = 0; i < NP * (size_t)cols; i++) x[i] = fgauss();
    float *dx = dup_to(be, x, NP * (size_t)cols * 4);
    char shape[96];
    int len = snprintf(shape, sizeof shape, "%dx", m);
    for (int s = 0; s < m; s++) {
        const tdesc *td = td_of(types[s]);
        const size_t rb = (size_t)(cols / td->be) * td->bb;
        host[s] = malloc(rb * rows[s]);
        rand_blocks(td, host[s], rb * rows[s] / td->bb);
        load_weight(be, td, host[s], cols, rows[s], 1, &w[s]);
        dy[s] = dalloc(be, NP * (size_t)rows[s] * 4);
        y1[s] = malloc(NP * (size_t)rows[s] * 4);
        len += snprintf(shape + len, sizeof shape - len, "%s%s %lld", s ? "," : "", td->name, (long long)rows[s]);
    }
    snprintf(shape + len, sizeof shape - len, " x%lld", (long long)cols);
    /* calls of `step` rows, each call's m products back to back */
    const int steps[] = {NP, 7, 64};
    for (size_t q = 0; q < sizeof steps / sizeof steps[0]; q++) {
        for (int s = 0; s < m; s++) poison(be, dy[s], NP * (size_t)rows[s] * 4);
        const long f0 = fused_ops(be).prompt;
        int calls = 0;
        for (int r = 0; r < NP; r += steps[q], calls++) {
            const int n = NP - r < steps[q] ? NP - r : steps[q];
            for (int s = 0; s < m; s++)
                be->matmul_prompt(be, &w[s], dx + (size_t)r * cols, dy[s] + (size_t)r * rows[s], n);
            if (be->sync(be, &err)) die("sync");
        }
        const long got = fused_ops(be).prompt - f0;
        char sh[160];
        snprintf(sh, sizeof sh, "%s calls of %d", shape, steps[q]);
        report("pmulti-joined", sh, (double)labs(got - (fused ? (long)calls * (m - 1) : 0)), 0, 0.0);
        if (q == 0) {
            double e_all = 0;
            int nan_all = 0;
            for (int s = 0; s < m; s++) {
                const tdesc *td = td_of(types[s]);
                const size_t rb = (size_t)(cols / td->be) * td->bb;
                fetch(be, y1[s], dy[s], NP * (size_t)rows[s] * 4);
                double *ref = calloc(NP * (size_t)rows[s], 8);
                ref_plain(td, host[s], rb, cols, rows[s], x, NP, ref);
                int nan;
                const double e = rel_l2(y1[s], ref, NP * (size_t)rows[s], &nan);
                nan_all += nan;
                if (e > e_all) e_all = e;
                free(ref);
            }
            report(label, shape, e_all, nan_all, mm_gemm_bound[0]);
            continue;
        }
        size_t diff = 0;
        int nan = 0;
        for (int s = 0; s < m; s++) {
            float *yc = malloc(NP * (size_t)rows[s] * 4);
            fetch(be, yc, dy[s], NP * (size_t)rows[s] * 4);
            for (size_t i = 0; i < NP * (size_t)rows[s]; i++) {
                diff += memcmp(&yc[i], &y1[s][i], 4) != 0;
                nan += isnan(yc[i]);
            }
            free(yc);
        }
        report("pmulti-inv", sh, (double)diff, nan, 0.0);
    }
    /* the first matrix in a call of its own */
    poison(be, dy[0], NP * (size_t)rows[0] * 4);
    be->matmul_prompt(be, &w[0], dx, dy[0], NP);
    float *yc = malloc(NP * (size_t)rows[0] * 4);
    fetch(be, yc, dy[0], NP * (size_t)rows[0] * 4);
    size_t diff = 0;
    for (size_t i = 0; i < NP * (size_t)rows[0]; i++) diff += memcmp(&yc[i], &y1[0][i], 4) != 0;
    report("pmulti-vs-one", shape, (double)diff, 0, 0.0);
    free(yc);
    for (int s = 0; s < m; s++) {
        be->free(be, dy[s]);
        be->weight_release(be, &w[s]);
        free(host[s]);
        free(y1[s]);
    }
    be->free(be, dx);
    free(x);
}

static void check_prompt_multi_all(void)
{
    const int q4 = MR_TYPE_Q4_K, q6 = MR_TYPE_Q6_K;
    const int t30[3] = {q4, q4, q6}; /* the 30B-A3B's q/k/v where v is Q6_K */
    const int64_t r30[3] = {4096, 512, 512};
    check_prompt_multi_one(gpu, "pmulti", t30, r30, 3, 2048, true);
    const int t8[3] = {q4, q4, q4}; /* the 8B's q/k/v */
    const int64_t r8[3] = {4096, 1024, 1024};
    check_prompt_multi_one(gpu, "pmulti", t8, r8, 3, 4096, true);
    const int t2[2] = {q6, MR_TYPE_Q8_0}; /* two products (gate/up), other types */
    const int64_t r2[2] = {2304, 768};
    check_prompt_multi_one(gpu, "pmulti", t2, r2, 2, 1024, true);
    /* not joined: a matrix the float32 small products take (the default
     * rule, 128 rows; gpu sends every size to the GEMM), and f16x3 mode */
    mr_backend *sg = backend_with("MEMRA_CUDA_SMALL_GEMM", "128");
    setenv("MEMRA_CUDA_SMALL_GEMM", "0", 1); /* what main set for the backends made after */
    const int64_t rs[3] = {4096, 512, 64};
    check_prompt_multi_one(sg, "pmulti-small", t8, rs, 3, 2048, false);
    check_prompt_multi_one(gpu, "pmulti", t8, rs, 3, 2048, true);
    sg->destroy(sg);
    check_prompt_multi_one(gpu_x3, "pmulti-f16x3", t30, r30, 3, 2048, false);
}

/* A prompt of P queries (positions 0..P-1) through attention_prompt on be
 * in calls of `chunk` queries (P or more: one call), K/V rows in a block
 * table in reverse order: the outputs [P][heads][hd] (malloc'd). */
static float *prompt_attention_out(mr_backend *be, int heads, int kvh, int hd, int P, mr_kv_dtype dt,
                                   const float *K, const float *V, const float *q, int chunk)
{
    const int bt = 16, nblk = (P + bt - 1) / bt + 2, kvdim = kvh * hd;
    mr_kv_cache kv = {.n_layers = 1, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh, .head_dim = hd,
                      .dtype = dt};
    if (be->kv_create(be, &kv, &err)) die("kv_create");
    int32_t *table = malloc(nblk * 4), *pos = malloc(P * 4);
    for (int i = 0; i < nblk; i++) table[i] = nblk - 1 - i;
    for (int i = 0; i < P; i++) pos[i] = i;
    const size_t qn = (size_t)P * heads * hd;
    int32_t *dtab = dup_to(be, table, nblk * 4), *dpos = dup_to(be, pos, P * 4);
    float *dK = dup_to(be, K, (size_t)P * kvdim * 4), *dV = dup_to(be, V, (size_t)P * kvdim * 4);
    float *dq = dup_to(be, q, qn * 4), *dout = dalloc(be, qn * 4), *out = malloc(qn * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    be->kv_store(be, &kv, 0, dtab, dK, dV, dpos, P);
    poison(be, dout, qn * 4);
    for (int t0 = 0; t0 < P; t0 += chunk) {
        const int n = P - t0 < chunk ? P - t0 : chunk;
        const size_t o = (size_t)t0 * heads * hd;
        be->attention_prompt(be, &kv, 0, dtab, dq + o, dpos + t0, n, heads, scale, dout + o, t0);
    }
    fetch(be, out, dout, qn * 4);
    be->free(be, dtab); be->free(be, dpos); be->free(be, dK); be->free(be, dV);
    be->free(be, dq); be->free(be, dout);
    be->kv_destroy(be, &kv);
    free(table); free(pos);
    return out;
}

/* Random K and V of P positions (kvdim values each) and qn query values,
 * the scale of the attention checks' inputs. */
static void attn_random_inputs(int P, int kvdim, size_t qn, float **K, float **V, float **q)
{
    *K = malloc((size_t)P * kvdim * 4);
    *V = malloc((size_t)P * kvdim * 4);
    *q = malloc(qn * 4);
    for (size_t i = 0; i < (size_t)P * kvdim; i++) { (*K)[i] = fgauss(); (*V)[i] = fgauss(); }
    for (size_t i = 0; i < qn; i++) (*q)[i] = fgauss() * 0.5f;
}

/* Prompt attention of P queries (positions 0..P-1) in one attention_prompt
 * call against the same prompt in calls of c queries, bit for bit: a query's
 * result may depend on its position and the keys only. */
static void check_attention_prompt_chunks(mr_backend *be, const char *op, int heads, int kvh, int hd, int P,
                                          mr_kv_dtype dt)
{
    const size_t qn = (size_t)P * heads * hd;
    float *K, *V, *q;
    attn_random_inputs(P, kvh * hd, qn, &K, &V, &q);
    float *one = prompt_attention_out(be, heads, kvh, hd, P, dt, K, V, q, P);
    const int cs[] = {1, 7, 16, 64, 65};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        float *cut = prompt_attention_out(be, heads, kvh, hd, P, dt, K, V, q, cs[i]);
        char shape[96];
        snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=%d calls of %d vs one",
                 kv_dt_name(dt), heads, kvh, hd, P, cs[i]);
        report(op, shape, (double)floats_differ(cut, one, qn), floats_nan(cut, qn), 0.0);
        free(cut);
    }
    free(K); free(V); free(q); free(one);
}

static void check_rmsnorm(int rows, int dim)
{
    size_t n = (size_t)rows * dim;
    float *x = malloc(n * 4), *r = malloc(n * 4), *w = malloc(dim * 4), *y = malloc(n * 4);
    for (size_t i = 0; i < n; i++) { x[i] = fgauss() * 3; r[i] = fgauss(); }
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.1f * fgauss();
    double *ref = malloc(n * 8);
    const float eps = 1e-6f;
    for (int i = 0; i < rows; i++) {
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)x[i * dim + j] * x[i * dim + j];
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int j = 0; j < dim; j++) ref[i * dim + j] = x[i * dim + j] * inv * w[j];
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d", rows, dim);
    float *dx = dup_to(gpu, x, n * 4), *dw = dup_to(gpu, w, dim * 4), *dy = dalloc(gpu, n * 4);
    poison(gpu, dy, n * 4);
    gpu->rmsnorm(gpu, dx, dw, dy, rows, dim, eps);
    fetch(gpu, y, dy, n * 4);
    report_rel("rmsnorm", shape, y, ref, n, 1e-6);
    gpu->rmsnorm(gpu, dx, dw, dx, rows, dim, eps); /* in place */
    fetch(gpu, y, dx, n * 4);
    report_rel("rmsnorm-inplace", shape, y, ref, n, 1e-6);
    if (gpu->add_rmsnorm) {
        /* fused: (r += x; y = norm(r)) against add then rmsnorm */
        float *dr = dup_to(gpu, r, n * 4), *dr2 = dup_to(gpu, r, n * 4);
        float *dx2 = dup_to(gpu, x, n * 4), *dy2 = dalloc(gpu, n * 4);
        float *y2 = malloc(n * 4), *rr = malloc(n * 4), *rr2 = malloc(n * 4);
        poison(gpu, dy, n * 4);
        poison(gpu, dy2, n * 4);
        gpu->add_rmsnorm(gpu, dr, dx2, dw, dy, rows, dim, eps);
        gpu->add(gpu, dr2, dx2, n);
        gpu->rmsnorm(gpu, dr2, dw, dy2, rows, dim, eps);
        fetch(gpu, y, dy, n * 4);
        fetch(gpu, y2, dy2, n * 4);
        fetch(gpu, rr, dr, n * 4);
        fetch(gpu, rr2, dr2, n * 4);
        report_f("add_rmsnorm", shape, y, y2, n, 1e-6);
        report_f("add_rmsnorm-res", shape, rr, rr2, n, 0.0);
        gpu->free(gpu, dr); gpu->free(gpu, dr2); gpu->free(gpu, dx2); gpu->free(gpu, dy2);
        free(y2); free(rr); free(rr2);
    }
    if (cpu) {
        float *cx = dup_to(cpu, x, n * 4), *cw = dup_to(cpu, w, dim * 4), *cy = dalloc(cpu, n * 4);
        cpu->rmsnorm(cpu, cx, cw, cy, rows, dim, eps);
        fetch(cpu, y, cy, n * 4);
        report_rel("rmsnorm-cpu", shape, y, ref, n, 1e-6);
        cpu->free(cpu, cx); cpu->free(cpu, cw); cpu->free(cpu, cy);
    }
    gpu->free(gpu, dx); gpu->free(gpu, dw); gpu->free(gpu, dy);
    free(x); free(r); free(w); free(y); free(ref);
}

static void check_rope(int n, int heads, int hd, int n_rot, int mode)
{
    size_t len = (size_t)n * heads * hd;
    float *x = malloc(len * 4), *y = malloc(len * 4);
    int32_t *pos = malloc(n * 4);
    for (size_t i = 0; i < len; i++) x[i] = fgauss();
    for (int t = 0; t < n; t++) pos[t] = (int32_t)(rnd() % 4096);
    double *ref = malloc(len * 8);
    const float base = 1e6f;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            const float *xh = x + ((size_t)t * heads + h) * hd;
            double *rh = ref + ((size_t)t * heads + h) * hd;
            for (int i = 0; i < hd; i++) rh[i] = xh[i];
            for (int j = 0; j < n_rot / 2; j++) {
                double ang = pos[t] * pow(base, -2.0 * j / n_rot);
                int a = mode == MR_ROPE_NEOX ? j : 2 * j, b = mode == MR_ROPE_NEOX ? j + n_rot / 2 : 2 * j + 1;
                rh[a] = xh[a] * cos(ang) - xh[b] * sin(ang);
                rh[b] = xh[a] * sin(ang) + xh[b] * cos(ang);
            }
        }
    char shape[64];
    snprintf(shape, sizeof shape, "%s n=%d h=%d d=%d rot=%d", mode == MR_ROPE_NEOX ? "neox" : "norm", n,
             heads, hd, n_rot);
    float *dx = dup_to(gpu, x, len * 4);
    int32_t *dp = dup_to(gpu, pos, n * 4);
    gpu->rope(gpu, dx, dp, n, heads, hd, n_rot, base, mode);
    fetch(gpu, y, dx, len * 4);
    /* float32 angles (as transformers computes them) vs float64 here */
    report_rel("rope", shape, y, ref, len, 1e-3);
    if (cpu) {
        float *cx = dup_to(cpu, x, len * 4);
        int32_t *cp = dup_to(cpu, pos, n * 4);
        cpu->rope(cpu, cx, cp, n, heads, hd, n_rot, base, mode);
        float *yc = malloc(len * 4);
        fetch(cpu, yc, cx, len * 4);
        report_f("rope-vs-cpu", shape, y, yc, len, 1e-3);
        free(yc);
        cpu->free(cpu, cx); cpu->free(cpu, cp);
    }
    gpu->free(gpu, dx); gpu->free(gpu, dp);
    free(x); free(y); free(pos); free(ref);
}

/* The four separate ops the fused qk_norm_rope stands for, on backend be:
 * q[n][heads][hd] and k[n][kvh][hd] (host) normalised and rotated into rq,
 * rk (host). */
static void qk_norm_rope_apart(mr_backend *be, const float *q, const float *k, const float *qw, const float *kw,
                               const int32_t *pos, int n, int heads, int kvh, int hd, int n_rot, float base,
                               int mode, float eps, float *rq, float *rk)
{
    size_t lq = (size_t)n * heads * hd, lk = (size_t)n * kvh * hd;
    float *dq = dup_to(be, q, lq * 4), *dk = dup_to(be, k, lk * 4);
    float *dqw = dup_to(be, qw, hd * 4), *dkw = dup_to(be, kw, hd * 4);
    int32_t *dp = dup_to(be, pos, n * 4);
    be->rmsnorm(be, dq, dqw, dq, n * heads, hd, eps);
    be->rmsnorm(be, dk, dkw, dk, n * kvh, hd, eps);
    be->rope(be, dq, dp, n, heads, hd, n_rot, base, mode);
    be->rope(be, dk, dp, n, kvh, hd, n_rot, base, mode);
    fetch(be, rq, dq, lq * 4);
    fetch(be, rk, dk, lk * 4);
    be->free(be, dq); be->free(be, dk); be->free(be, dqw); be->free(be, dkw); be->free(be, dp);
}

/* q[n][heads][hd] and k[n][kvh][hd] (host) through the GPU's qk_norm_rope
 * in calls of `step` tokens (n: one call) into yq, yk (host); the kernel
 * lays a call's rows out over its blocks by the call's size. */
static void qk_norm_rope_calls(const float *q, const float *k, const float *qw, const float *kw,
                               const int32_t *pos, int n, int heads, int kvh, int hd, int n_rot, float base,
                               int mode, float eps, int step, float *yq, float *yk)
{
    const size_t lq = (size_t)n * heads * hd, lk = (size_t)n * kvh * hd;
    float *dq = dup_to(gpu, q, lq * 4), *dk = dup_to(gpu, k, lk * 4);
    float *dqw = dup_to(gpu, qw, hd * 4), *dkw = dup_to(gpu, kw, hd * 4);
    int32_t *dp = dup_to(gpu, pos, n * 4);
    for (int t0 = 0; t0 < n; t0 += step) {
        const int c = n - t0 < step ? n - t0 : step;
        gpu->qk_norm_rope(gpu, dq + (size_t)t0 * heads * hd, dk + (size_t)t0 * kvh * hd, dqw, dkw, dp + t0, c, heads,
                          kvh, hd, n_rot, base, mode, eps);
    }
    fetch(gpu, yq, dq, lq * 4);
    fetch(gpu, yk, dk, lk * 4);
    gpu->free(gpu, dq); gpu->free(gpu, dk); gpu->free(gpu, dqw); gpu->free(gpu, dkw); gpu->free(gpu, dp);
}

/* The fused q/k normalisation + RoPE against the four separate ops on the
 * GPU (same arithmetic, other summation order inside the norm) and on the
 * CPU backend; with 65 tokens or more, the same rows in calls of 1, 7, 63
 * and 64 tokens bit for bit (qk_norm_rope-inv: prompt rows and decode rows
 * go through this one op). */
static void check_qk_norm_rope(int n, int heads, int kvh, int hd, int n_rot, int mode)
{
    if (!gpu->qk_norm_rope)
        return;
    size_t lq = (size_t)n * heads * hd, lk = (size_t)n * kvh * hd;
    float *q = malloc(lq * 4), *k = malloc(lk * 4), *qw = malloc(hd * 4), *kw = malloc(hd * 4);
    float *yq = malloc(lq * 4), *yk = malloc(lk * 4), *rq = malloc(lq * 4), *rk = malloc(lk * 4);
    int32_t *pos = malloc(n * 4);
    for (size_t i = 0; i < lq; i++) q[i] = fgauss() * 2;
    for (size_t i = 0; i < lk; i++) k[i] = fgauss() * 2;
    for (int i = 0; i < hd; i++) { qw[i] = 1.0f + 0.2f * fgauss(); kw[i] = 1.0f + 0.2f * fgauss(); }
    for (int t = 0; t < n; t++) pos[t] = (int32_t)(rnd() % 40000);
    const float base = 1e6f, eps = 1e-6f;
    char shape[64];
    snprintf(shape, sizeof shape, "%s n=%d h=%d/%d d=%d rot=%d", mode == MR_ROPE_NEOX ? "neox" : "norm", n,
             heads, kvh, hd, n_rot);
    qk_norm_rope_calls(q, k, qw, kw, pos, n, heads, kvh, hd, n_rot, base, mode, eps, n, yq, yk);
    qk_norm_rope_apart(gpu, q, k, qw, kw, pos, n, heads, kvh, hd, n_rot, base, mode, eps, rq, rk);
    report_f("qk_norm_rope-q", shape, yq, rq, lq, 1e-6);
    report_f("qk_norm_rope-k", shape, yk, rk, lk, 1e-6);
    if (cpu) {
        qk_norm_rope_apart(cpu, q, k, qw, kw, pos, n, heads, kvh, hd, n_rot, base, mode, eps, rq, rk);
        /* the rope-vs-cpu bound: sin/cos of float32 angles computed apart */
        report_f("qk_norm_rope-q-vs-cpu", shape, yq, rq, lq, 1e-3);
        report_f("qk_norm_rope-k-vs-cpu", shape, yk, rk, lk, 1e-3);
    }
    const int steps[] = {1, 7, 63, 64};
    for (size_t s = 0; n >= 65 && s < sizeof steps / sizeof steps[0]; s++) {
        qk_norm_rope_calls(q, k, qw, kw, pos, n, heads, kvh, hd, n_rot, base, mode, eps, steps[s], rq, rk);
        size_t diff = 0;
        int nan = 0;
        for (size_t i = 0; i < lq; i++) { diff += memcmp(&rq[i], &yq[i], 4) != 0; nan += isnan(rq[i]); }
        for (size_t i = 0; i < lk; i++) { diff += memcmp(&rk[i], &yk[i], 4) != 0; nan += isnan(rk[i]); }
        char sh[96];
        snprintf(sh, sizeof sh, "%s calls of %d vs one", shape, steps[s]);
        report("qk_norm_rope-inv", sh, (double)diff, nan, 0.0);
    }
    free(q); free(k); free(qw); free(kw); free(yq); free(yk); free(rq); free(rk); free(pos);
}

static float kv_round(float v, mr_kv_dtype dt)
{
    if (dt == MR_KV_F16) return mr_f16_to_f32(mr_f32_to_f16(v));
    if (dt == MR_KV_BF16) return mr_bf16_to_f32(mr_f32_to_bf16(v));
    return v;
}

/* qk_norm_rope followed by kv_store of its keys, which the op recorder runs
 * as one launch: q, k and both caches bit for bit against the two ops made
 * apart (a sync between them), on one block table or a table a token
 * (multi: token 1's is NULL, a skipped token), with a negative position
 * (stored nowhere) among them; `qkv-fused` counts the fused stores. */
static void check_qk_norm_rope_kv(int n, int heads, int kvh, int hd, mr_kv_dtype dt, bool multi)
{
    if (!gpu->qk_norm_rope)
        return;
    const int bt = 16, nblk = 8, kvdim = kvh * hd;
    const size_t lq = (size_t)n * heads * hd, lk = (size_t)n * kvdim;
    const size_t esz = dt == MR_KV_F32 ? 4 : 2, cbytes = (size_t)nblk * bt * kvdim * esz;
    float *q = malloc(lq * 4), *k = malloc(lk * 4), *v = malloc(lk * 4), *qw = malloc(hd * 4), *kw = malloc(hd * 4);
    int32_t *pos = malloc(n * 4), table[8];
    for (size_t i = 0; i < lq; i++) q[i] = fgauss() * 2;
    for (size_t i = 0; i < lk; i++) { k[i] = fgauss() * 2; v[i] = fgauss(); }
    for (int i = 0; i < hd; i++) { qw[i] = 1.0f + 0.2f * fgauss(); kw[i] = 1.0f + 0.2f * fgauss(); }
    for (int i = 0; i < nblk; i++) table[i] = (i * 5 + 3) % nblk;
    const int off = (int)(rnd() % (nblk * bt)); /* distinct positions: no two tokens share a slot */
    for (int t = 0; t < n; t++) pos[t] = t == n / 2 && n > 2 ? -1 : (int32_t)((t * 37 + off) % (nblk * bt));
    int32_t *dtab = dup_to(gpu, table, sizeof table), *dp = dup_to(gpu, pos, n * 4);
    const int32_t **tabs = malloc(n * sizeof *tabs);
    for (int t = 0; t < n; t++) tabs[t] = t == 1 ? NULL : dtab;
    const int32_t *const *dtabs = multi ? dup_to(gpu, tabs, n * sizeof *tabs) : NULL;
    float *dqw = dup_to(gpu, qw, hd * 4), *dkw = dup_to(gpu, kw, hd * 4), *dv = dup_to(gpu, v, lk * 4);
    uint8_t *out[2][4]; /* [fused, apart][q, k, K cache, V cache] */
    long fused[2];
    for (int apart = 0; apart < 2; apart++) {
        mr_kv_cache kv = {.n_layers = 2, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh, .head_dim = hd,
                          .dtype = dt};
        if (gpu->kv_create(gpu, &kv, &err)) die("kv_create");
        poison(gpu, kv.k[1], cbytes);
        poison(gpu, kv.v[1], cbytes);
        float *dq = dup_to(gpu, q, lq * 4), *dk = dup_to(gpu, k, lk * 4);
        const long f0 = fused_ops(gpu).kv;
        gpu->qk_norm_rope(gpu, dq, dk, dqw, dkw, dp, n, heads, kvh, hd, hd, 1e6f, MR_ROPE_NEOX, 1e-6f);
        if (apart && gpu->sync(gpu, &err)) die("sync");
        if (multi) gpu->kv_store_multi(gpu, &kv, 1, dtabs, dk, dv, dp, n);
        else gpu->kv_store(gpu, &kv, 1, dtab, dk, dv, dp, n);
        if (gpu->sync(gpu, &err)) die("sync");
        fused[apart] = fused_ops(gpu).kv - f0;
        const size_t sz[4] = {lq * 4, lk * 4, cbytes, cbytes};
        const void *src[4] = {dq, dk, kv.k[1], kv.v[1]};
        for (int b = 0; b < 4; b++) {
            out[apart][b] = malloc(sz[b]);
            fetch(gpu, out[apart][b], src[b], sz[b]);
        }
        gpu->free(gpu, dq);
        gpu->free(gpu, dk);
        gpu->kv_destroy(gpu, &kv);
    }
    static const char *dtn[] = {"f32", "f16", "bf16"};
    char shape[80];
    snprintf(shape, sizeof shape, "n=%d h=%d/%d d=%d %s%s", n, heads, kvh, hd, dtn[dt], multi ? " multi" : "");
    const size_t sz[4] = {lq * 4, lk * 4, cbytes, cbytes};
    static const char *nm[4] = {"qkv-fused-q", "qkv-fused-k", "qkv-fused-K", "qkv-fused-V"};
    for (int b = 0; b < 4; b++) {
        size_t diff = 0;
        for (size_t i = 0; i < sz[b]; i++) diff += out[0][b][i] != out[1][b][i];
        report(nm[b], shape, (double)diff, 0, 0.0); /* bytes that differ */
        free(out[0][b]);
        free(out[1][b]);
    }
    report("qkv-fused", shape, (double)labs(fused[0] - 1) + (double)labs(fused[1]), 0, 0.0);
    gpu->free(gpu, dtab); gpu->free(gpu, dp); gpu->free(gpu, dqw); gpu->free(gpu, dkw); gpu->free(gpu, dv);
    if (dtabs) gpu->free(gpu, (void *)dtabs);
    free(q); free(k); free(v); free(qw); free(kw); free(pos); free(tabs);
}

/* Fill P positions of a sequence (random block table), then n query tokens
 * at positions P-n..P-1 attend causally; reported as op with
 * the given bound on backend be (the CPU comparison runs for the default
 * GPU backend). */
static void check_attention_on(mr_backend *be, const char *op, double bound, int heads, int kvh, int hd,
                               int P, int n, mr_kv_dtype dt, bool prompt)
{
    const int bt = 16, nblk = (P + bt - 1) / bt + 3;
    mr_kv_cache kv = {.n_layers = 2, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh,
                      .head_dim = hd, .dtype = dt};
    if (be->kv_create(be, &kv, &err)) die("kv_create");
    int32_t *table = shuffled_table(nblk);
    const int kvdim = kvh * hd;
    float *K, *V, *q;
    attn_random_inputs(P, kvdim, (size_t)n * heads * hd, &K, &V, &q);
    int32_t *pos = malloc(P * 4);
    for (int i = 0; i < P; i++) pos[i] = i;
    int32_t *dtab = dup_to(be, table, nblk * 4), *dpos = dup_to(be, pos, P * 4);
    float *dK = dup_to(be, K, (size_t)P * kvdim * 4), *dV = dup_to(be, V, (size_t)P * kvdim * 4);
    float *dq = dup_to(be, q, (size_t)n * heads * hd * 4), *dout = dalloc(be, (size_t)n * heads * hd * 4);
    /* store in two chunks to exercise pos-driven placement */
    int half = P / 2;
    be->kv_store(be, &kv, 1, dtab, dK, dV, dpos, half);
    be->kv_store(be, &kv, 1, dtab, dK + (size_t)half * kvdim, dV + (size_t)half * kvdim, dpos + half, P - half);
    poison(be, dout, (size_t)n * heads * hd * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    if (prompt)
        be->attention_prompt(be, &kv, 1, dtab, dq, dpos + (P - n), n, heads, scale, dout, P - n);
    else
        be->attention(be, &kv, 1, dtab, dq, dpos + (P - n), n, heads, scale, dout);
    size_t on = (size_t)n * heads * hd;
    float *out = malloc(on * 4);
    fetch(be, out, dout, on * 4);
    double *ref = calloc(on, 8), *sc = malloc(P * 8);
    for (int t = 0; t < n; t++) {
        int pt = P - n + t;
        for (int h = 0; h < heads; h++) {
            int g = h / (heads / kvh);
            const float *qh = q + ((size_t)t * heads + h) * hd;
            double mx = -INFINITY;
            for (int p = 0; p <= pt; p++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)qh[d] * kv_round(K[(size_t)p * kvdim + g * hd + d], dt);
                sc[p] = s * scale;
                if (sc[p] > mx) mx = sc[p];
            }
            double sum = 0;
            for (int p = 0; p <= pt; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
            double *o = ref + ((size_t)t * heads + h) * hd;
            for (int p = 0; p <= pt; p++)
                for (int d = 0; d < hd; d++) o[d] += sc[p] / sum * kv_round(V[(size_t)p * kvdim + g * hd + d], dt);
        }
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=%d n=%d", kv_dt_name(dt),
             heads, kvh, hd, P, n);
    report_rel(op, shape, out, ref, on, bound);
    if (cpu && dt == MR_KV_F32 && be == gpu) {
        mr_kv_cache ck = kv;
        ck.k = ck.v = NULL;
        if (cpu->kv_create(cpu, &ck, &err)) die("cpu kv_create");
        int32_t *ctab = dup_to(cpu, table, nblk * 4), *cpos = dup_to(cpu, pos, P * 4);
        float *cK = dup_to(cpu, K, (size_t)P * kvdim * 4), *cV = dup_to(cpu, V, (size_t)P * kvdim * 4);
        float *cq = dup_to(cpu, q, on * 4), *co = dalloc(cpu, on * 4);
        cpu->kv_store(cpu, &ck, 1, ctab, cK, cV, cpos, P);
        cpu->attention(cpu, &ck, 1, ctab, cq, cpos + (P - n), n, heads, scale, co);
        float *oc = malloc(on * 4);
        fetch(cpu, oc, co, on * 4);
        report_f("attention-cpu", shape, out, oc, on, 1e-5);
        free(oc);
        cpu->free(cpu, ctab); cpu->free(cpu, cpos); cpu->free(cpu, cK); cpu->free(cpu, cV);
        cpu->free(cpu, cq); cpu->free(cpu, co);
        cpu->kv_destroy(cpu, &ck);
    }
    be->free(be, dtab); be->free(be, dpos); be->free(be, dK); be->free(be, dV);
    be->free(be, dq); be->free(be, dout);
    be->kv_destroy(be, &kv);
    free(table); free(K); free(V); free(pos); free(q); free(out); free(ref); free(sc);
}

/* Decode attention of the n last of P positions on be (K, V: P rows of kvh
 * hd; q: n rows of heads hd; the cache's blocks in the order of table)
 * into out (host). */
static void attn_decode_run(mr_backend *be, int heads, int kvh, int hd, int P, int n, mr_kv_dtype dt,
                            const float *K, const float *V, const float *q, const int32_t *table, int nblk,
                            float *out)
{
    mr_kv_cache kv = {.n_layers = 1, .n_blocks = nblk, .block_tokens = 16, .n_kv_heads = kvh, .head_dim = hd,
                      .dtype = dt};
    if (be->kv_create(be, &kv, &err)) die("kv_create");
    const size_t kn = (size_t)P * kvh * hd, qn = (size_t)n * heads * hd;
    int32_t *pos = malloc(P * 4);
    for (int i = 0; i < P; i++) pos[i] = i;
    int32_t *dtab = dup_to(be, table, nblk * 4), *dpos = dup_to(be, pos, P * 4);
    float *dK = dup_to(be, K, kn * 4), *dV = dup_to(be, V, kn * 4), *dq = dup_to(be, q, qn * 4);
    float *dout = dalloc(be, qn * 4);
    be->kv_store(be, &kv, 0, dtab, dK, dV, dpos, P);
    poison(be, dout, qn * 4);
    be->attention(be, &kv, 0, dtab, dq, dpos + (P - n), n, heads, 1.0f / sqrtf((float)hd), dout);
    fetch(be, out, dout, qn * 4);
    be->free(be, dtab); be->free(be, dpos); be->free(be, dK); be->free(be, dV);
    be->free(be, dq); be->free(be, dout);
    be->kv_destroy(be, &kv);
    free(pos);
}

/* The outputs of be0 and be1 on the same decode rows: how many values
 * differ (bits), with be0's NaNs in *nan. */
static size_t attn_pair_diff(mr_backend *be0, mr_backend *be1, int heads, int kvh, int hd, int P, int n,
                             mr_kv_dtype dt, int *nan)
{
    const int nblk = (P + 15) / 16 + 2, kvdim = kvh * hd;
    int32_t *table = shuffled_table(nblk);
    const size_t qn = (size_t)n * heads * hd;
    float *K, *V, *q, *o[2] = {malloc(qn * 4), malloc(qn * 4)};
    attn_random_inputs(P, kvdim, qn, &K, &V, &q);
    mr_backend *be[2] = {be0, be1};
    for (int b = 0; b < 2; b++) attn_decode_run(be[b], heads, kvh, hd, P, n, dt, K, V, q, table, nblk, o[b]);
    const size_t diff = floats_differ(o[0], o[1], qn);
    *nan = floats_nan(o[0], qn);
    free(table); free(K); free(V); free(q); free(o[0]); free(o[1]);
    return diff;
}

/* The decode attention of n tokens on two backends, bit for bit (op: the
 * line's name). */
static void check_attn_pair(const char *op, mr_backend *be0, mr_backend *be1, int heads, int kvh, int hd, int P,
                            int n, mr_kv_dtype dt)
{
    int nan;
    const size_t diff = attn_pair_diff(be0, be1, heads, kvh, hd, P, n, dt, &nan);
    char shape[64];
    snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=%d n=%d", kv_dt_name(dt),
             heads, kvh, hd, P, n);
    report(op, shape, (double)diff, nan, 0.0);
}

/* That be1 takes another kernel than be0 on these rows: some value must
 * differ (a check of the check's wiring: a switch the backend ignores
 * would pass every bit-for-bit line above it). */
static void check_attn_engaged(const char *op, mr_backend *be0, mr_backend *be1, int heads, int kvh, int hd, int P,
                               int n, mr_kv_dtype dt)
{
    int nan;
    const size_t diff = attn_pair_diff(be0, be1, heads, kvh, hd, P, n, dt, &nan);
    char shape[64];
    snprintf(shape, sizeof shape, "f16 h=%d/%d d=%d P=%d n=%d: %zu differ", heads, kvh, hd, P, n, diff);
    report(op, shape, diff ? 0.0 : 1.0, nan, 0.0);
}

/* A product recorded right after the ops a check runs, as the forward pass
 * calls them (q/k/v after a layer's end, o after the attention): rows x
 * cols of type pt (0: none) over the n rows of the ops' output, the same
 * host blocks on each backend. */
typedef struct {
    const tdesc *td; /* NULL: no product */
    uint8_t *host;
    int64_t cols, rows;
    size_t yn;
    mr_weight w; /* on the backend at hand, next_load .. next_take */
    float *dy;
} next_prod;

static void next_init(next_prod *p, int pt, int64_t cols, int64_t rows, int n)
{
    memset(p, 0, sizeof *p);
    if (!pt)
        return;
    p->td = td_of(pt);
    p->cols = cols;
    p->rows = rows;
    p->yn = (size_t)n * (size_t)rows;
    const size_t bytes = (size_t)(cols / p->td->be) * p->td->bb * (size_t)rows;
    p->host = malloc(bytes);
    rand_blocks(p->td, p->host, bytes / p->td->bb);
}

/* Its weight and a poisoned output on be. */
static void next_load(next_prod *p, mr_backend *be)
{
    if (!p->td)
        return;
    load_weight(be, p->td, p->host, p->cols, p->rows, 1, &p->w);
    p->dy = dalloc(be, p->yn * 4);
    poison(be, p->dy, p->yn * 4);
}

/* Records the product over the n rows of x. */
static void next_run(next_prod *p, mr_backend *be, const float *x, int n)
{
    if (p->td)
        be->matmul(be, &p->w, x, p->dy, n);
}

/* Its output (malloc'd; NULL without a product), the backend's copies freed. */
static float *next_take(next_prod *p, mr_backend *be)
{
    if (!p->td)
        return NULL;
    float *h = malloc(p->yn * 4);
    fetch(be, h, p->dy, p->yn * 4);
    be->free(be, p->dy);
    be->weight_release(be, &p->w);
    return h;
}

static void check_attn_streams(const char *op, mr_backend *be0, mr_backend *be1, int heads, int kvh, int hd,
                               int shared, int own, int ns, int np, int pt);

/* The decode batches' one wave of blocks over the splits that hold
 * positions (k_attn_gqa_loop, the default from 2 tokens) against the grid
 * of a block a split (MEMRA_CUDA_ATTN_LOOP=0), bit for bit: batches of 2
 * to 63 tokens (n <= 63: the decode kernels, not the prompt's) at contexts
 * of one slice to past n_split slices of the minimum, and one token on it
 * (MEMRA_CUDA_ATTN_LOOP=1) against the grid. */
static void check_attn_loop(void)
{
    mr_backend *grid = backend_with("MEMRA_CUDA_ATTN_LOOP", "0"), *all = backend_with("MEMRA_CUDA_ATTN_LOOP", "1");
    static const struct { int P, n; } cs[] = {{2, 2}, {17, 5}, {100, 16}, {300, 16}, {1000, 63}, {4000, 9}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        check_attn_pair("attn-loop", gpu_x24, grid, 32, 4, 128, cs[i].P, cs[i].n, MR_KV_F16); /* the 30B-A3B */
        check_attn_pair("attn-loop", gpu_x24, grid, 32, 8, 128, cs[i].P, cs[i].n, MR_KV_BF16); /* the 8B */
        check_attn_pair("attn-loop", gpu_x24, grid, 16, 2, 256, cs[i].P, cs[i].n, MR_KV_F32); /* the 35B-A3B */
    }
    check_attn_pair("attn-loop", gpu_x24, grid, 6, 3, 64, 700, 3, MR_KV_BF16); /* a group of 2 */
    check_attn_pair("attn-loop-1", all, grid, 32, 4, 128, 300, 1, MR_KV_F16);
    check_attn_pair("attn-loop-1", all, grid, 16, 2, 256, 5000, 1, MR_KV_BF16);
    grid->destroy(grid);
    all->destroy(all);
    /* a decode batch's attention and the o product after it: the merge
     * writing the product's operand (MEMRA_CUDA_FUSE_XQ=3, the default, on
     * the int8 tensor-core products) against the product quantizing it
     * (=0); the
     * 30B-A3B's heads (two a merge block), the 35B-A3B's (one), 64-wide
     * heads (four); 2 rows: the product's own quantization either way */
    setenv("MEMRA_CUDA_XMD", "1", 1);
    mr_backend *xq3 = backend_with("MEMRA_CUDA_FUSE_XQ", "3"), *xq0 = backend_with("MEMRA_CUDA_FUSE_XQ", "0");
    setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
    check_attn_streams("attn-merge-xq", xq3, xq0, 32, 4, 128, 4096, 768, 16, 1, MR_TYPE_Q4_K);
    check_attn_streams("attn-merge-xq", xq3, xq0, 32, 4, 128, 256, 40, 9, 2, MR_TYPE_Q4_K);
    check_attn_streams("attn-merge-xq", xq3, xq0, 16, 2, 256, 1024, 300, 16, 1, MR_TYPE_IQ4_XS);
    check_attn_streams("attn-merge-xq", xq3, xq0, 8, 8, 64, 1024, 100, 5, 1, MR_TYPE_Q4_K);
    check_attn_streams("attn-merge-xq", xq3, xq0, 32, 4, 128, 512, 64, 2, 1, MR_TYPE_Q4_K);
    xq3->destroy(xq3);
    xq0->destroy(xq0);
}

/* The decode attention's merge with a row's records loaded at once
 * (merge_reg, the default) against the loop (MEMRA_CUDA_ATTN_MERGE=
 * loop), bit for bit: contexts of 1 to ~50 records a row (the register
 * path's 16 and past it), the models' head shapes, each cache type; then
 * the decode batches' blocks (check_attn_loop). */
static void check_attn_merge(void)
{
    mr_backend *loop = backend_with("MEMRA_CUDA_ATTN_MERGE", "loop");
    static const int Ps[] = {1, 17, 100, 128, 256, 300, 1000, 4000};
    const mr_kv_dtype dts[] = {MR_KV_F16, MR_KV_BF16, MR_KV_F32};
    for (size_t i = 0; i < sizeof Ps / sizeof Ps[0]; i++)
        for (int d = 0; d < 3; d++) {
            check_attn_pair("attn-merge-reg", gpu_x24, loop, 32, 8, 128, Ps[i], 1, dts[d]); /* the 8B */
            check_attn_pair("attn-merge-reg", gpu_x24, loop, 32, 4, 128, Ps[i], 1, dts[d]); /* the 30B-A3B */
            check_attn_pair("attn-merge-reg", gpu_x24, loop, 16, 2, 256, Ps[i], 1, dts[d]); /* the 35B-A3B */
        }
    check_attn_pair("attn-merge-reg", gpu_x24, loop, 32, 4, 128, 300, 5, MR_KV_F16); /* a decode batch's rows */
    check_attn_pair("attn-merge-reg", gpu_x24, loop, 16, 2, 256, 1000, 3, MR_KV_BF16);
    loop->destroy(loop);
    check_attn_loop();
}

static void check_attention_bad(mr_backend *be, const char *op, int hd, mr_kv_dtype dt, int n, int kvh);

/* A decode batch of n tokens (positions P - n .. P - 1) against each token
 * alone on be, bit for bit: a token's rows must not depend on its
 * batchmates (op: the line's name). */
static void check_attn_alone(const char *op, mr_backend *be, int heads, int kvh, int hd, int P, int n,
                             mr_kv_dtype dt)
{
    const int nblk = (P + 15) / 16 + 2, kvdim = kvh * hd, qd = heads * hd;
    int32_t *table = shuffled_table(nblk);
    const size_t qn = (size_t)n * qd;
    float *K, *V, *q, *o = malloc(qn * 4), *o1 = malloc(qn * 4);
    attn_random_inputs(P, kvdim, qn, &K, &V, &q);
    attn_decode_run(be, heads, kvh, hd, P, n, dt, K, V, q, table, nblk, o);
    for (int t = 0; t < n; t++)
        attn_decode_run(be, heads, kvh, hd, P - n + t + 1, 1, dt, K, V, q + (size_t)t * qd, table, nblk,
                        o1 + (size_t)t * qd);
    const size_t diff = floats_differ(o, o1, qn);
    const int nan = floats_nan(o, qn);
    char shape[64];
    snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=%d n=%d", kv_dt_name(dt),
             heads, kvh, hd, P, n);
    report(op, shape, (double)diff, nan, 0.0);
    free(table); free(K); free(V); free(q); free(o); free(o1);
}

/* The decode rows of ns streams in one attention_multi call on be0 and
 * be1, bit for bit (op: the line's name): np prefixes of `shared`
 * positions (whole blocks), prefix i % np named by the table of stream i,
 * then own + 5 i positions of the stream's own (other slice counts, and
 * with slices of whole multiples of 64 the same cuts for most), stream
 * ns / 2 skipped (a NULL table); the float16 K/V rows written straight into
 * the cache, the blocks in a shuffled order. */
static void check_attn_streams(const char *op, mr_backend *be0, mr_backend *be1, int heads, int kvh, int hd,
                               int shared, int own, int ns, int np, int pt)
{
    const int bt = 16, sb = shared / bt, kvdim = kvh * hd, qd = heads * hd, skip = pt ? -1 : ns / 2;
    const int per = (shared + own + 5 * (ns - 1) + bt - 1) / bt; /* blocks a stream's table */
    const int nblk = np * sb + ns * (per - sb);
    const size_t kvn = (size_t)nblk * bt * kvdim, qn = (size_t)ns * qd;
    int32_t *perm = shuffled_table(nblk), *tab = malloc((size_t)ns * per * 4), *pos = malloc((size_t)ns * 4);
    uint16_t *h16 = malloc(kvn * 2);
    float *q = malloc(qn * 4), *o[2] = {malloc(qn * 4), malloc(qn * 4)};
    for (size_t i = 0; i < kvn; i++) h16[i] = mr_f32_to_f16(fgauss());
    for (size_t i = 0; i < qn; i++) q[i] = fgauss() * 0.5f;
    for (int t = 0; t < ns; t++) {
        pos[t] = shared + own + 5 * t - 1;
        for (int b = 0; b < per; b++)
            tab[t * per + b] = perm[b < sb ? (t % np) * sb + b : np * sb + t * (per - sb) + (b - sb)];
    }
    mr_backend *be[2] = {be0, be1};
    /* pt: the o product, 512 rows of the row's width */
    next_prod pp;
    next_init(&pp, pt, qd, 512, ns);
    float *py[2] = {NULL, NULL};
    long xq[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        mr_kv_cache kv = {.n_layers = 1, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh,
                          .head_dim = hd, .dtype = MR_KV_F16};
        if (be[k]->kv_create(be[k], &kv, &err)) die("kv_create");
        if (be[k]->upload(be[k], kv.k[0], h16, kvn * 2, &err) || be[k]->upload(be[k], kv.v[0], h16, kvn * 2, &err))
            die("upload");
        int32_t *dtab = dup_to(be[k], tab, (size_t)ns * per * 4), *dpos = dup_to(be[k], pos, (size_t)ns * 4);
        const int32_t **htabs = malloc((size_t)ns * sizeof *htabs);
        for (int t = 0; t < ns; t++) htabs[t] = t == skip ? NULL : dtab + (size_t)t * per;
        const int32_t **dtabs = dup_to(be[k], htabs, (size_t)ns * sizeof *htabs);
        float *dq = dup_to(be[k], q, qn * 4), *dout = dalloc(be[k], qn * 4);
        poison(be[k], dout, qn * 4);
        next_load(&pp, be[k]);
        if (be[k]->sync(be[k], &err)) die("sync");
        const long x0 = fused_ops(be[k]).xq;
        be[k]->attention_multi(be[k], &kv, 0, (const int32_t *const *)dtabs, dq, dpos, ns, heads,
                               1.0f / sqrtf((float)hd), dout);
        next_run(&pp, be[k], dout, ns);
        fetch(be[k], o[k], dout, qn * 4);
        xq[k] = fused_ops(be[k]).xq - x0;
        py[k] = next_take(&pp, be[k]);
        be[k]->free(be[k], dtab); be[k]->free(be[k], dpos); be[k]->free(be[k], (void *)dtabs);
        be[k]->free(be[k], dq); be[k]->free(be[k], dout);
        be[k]->kv_destroy(be[k], &kv);
        free(htabs);
    }
    /* the skipped stream's rows are left as they were (poison, NaN) on both */
    int untouched = 1;
    if (skip >= 0) {
        for (int e = 0; e < qd; e++) untouched &= o[0][(size_t)skip * qd + e] != o[0][(size_t)skip * qd + e] &&
                                                  o[1][(size_t)skip * qd + e] != o[1][(size_t)skip * qd + e];
        for (int e = 0; e < qd; e++) o[0][(size_t)skip * qd + e] = o[1][(size_t)skip * qd + e] = 0.0f;
    }
    const size_t diff = floats_differ(o[0], o[1], qn);
    char shape[80];
    snprintf(shape, sizeof shape, "f16 h=%d/%d d=%d %dx(%d/%d+%d)%s%s", heads, kvh, hd, ns, shared, np, own,
             pt ? " then " : "", pt ? pp.td->name : "");
    report(op, shape, (double)diff + (untouched ? 0.0 : 1.0), floats_nan(o[0], qn), 0.0);
    if (pt) {
        /* the product's rows bit for bit, and the operand taken from the
         * merge on be0 only (3+ rows) */
        char on[64];
        snprintf(on, sizeof on, "%s-product", op);
        report(on, shape, (double)floats_differ(py[0], py[1], pp.yn), floats_nan(py[0], pp.yn), 0.0);
        snprintf(on, sizeof on, "%s-xq-taken", op);
        report(on, shape, (double)(labs(xq[0] - (ns >= 3 ? 1 : 0)) + labs(xq[1])), 0, 0.0);
        free(py[0]); free(py[1]);
    }
    free(pp.host);
    free(perm); free(tab); free(pos); free(h16); free(q); free(o[0]); free(o[1]);
}

/* Decode attention on the tensor cores (MEMRA_CUDA_ATTN_DEC_TC: cu_attn.cu
 * ag_split_tc), float16 caches:
 *  - against float64 host math at the models' head shapes, contexts of one
 *    position to past many slices, one token and decode batches, with the
 *    bound of the tensor-core prompt kernel (check_attention_tc: the same
 *    rounding steps, q * scale and P to float16, float32 sums);
 *  - a batch against each token alone bit for bit, with every row on the
 *    tensor cores and with the threshold inside the batch (its tokens on
 *    both kernels);
 *  - the batches' one wave of blocks against the grid of a block a split;
 *  - a bad block id: NaN rows for the queries that see it, finite others;
 *  - a bfloat16 cache and the float32 reference mode keep the float kernel
 *    (the same bits as without the switch);
 *  - the same for blocks of a whole group of 8 heads (..._G8), and a group
 *    of 4 untouched by it; G8 (every call, and =batch: calls of 2+ rows)
 *    against blocks of 4 bit for bit (the same splits);
 *  - decode rows of streams sharing prefixes (check_attn_streams), the
 *    wave against the grid, and with a batch's tokens of one prefix in
 *    pairs against without (MEMRA_CUDA_ATTN_PAIR=0);
 *  - the cut before the slices of whole multiples of 64 positions
 *    (MEMRA_CUDA_ATTN_GRAN=0) the same ways, and that the switch reaches
 *    the cut. */
static void check_attn_dec_tc(void)
{
    /* kernel-check's backends are made with MEMRA_CUDA_ATTN=f32, which
     * keeps decode rows off the tensor cores too (dec_tc_from): this part's
     * are made without it (runs 210-211 ran its lines with it set, so on
     * the float kernel; the engaged lines below now fail in that case) */
    unsetenv("MEMRA_CUDA_ATTN");
    mr_backend *tc = backend_with("MEMRA_CUDA_ATTN_DEC_TC", "0");
    mr_backend *grid = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_LOOP", "0");
    static const struct { int heads, kvh, hd, P, n; } cs[] = {
        {32, 4, 128, 1, 1},    {32, 4, 128, 2, 2},    {32, 4, 128, 17, 1},   {32, 4, 128, 100, 5},
        {32, 4, 128, 1000, 1}, {32, 4, 128, 4900, 16}, {32, 4, 128, 20000, 1}, /* the 30B-A3B */
        {32, 8, 128, 1, 1},    {32, 8, 128, 300, 3},  {32, 8, 128, 4000, 1}, /* the 8B */
        {16, 2, 256, 1, 1},    {16, 2, 256, 17, 2},   {16, 2, 256, 300, 1},  {16, 2, 256, 5000, 4},
        {16, 2, 256, 70000, 1}, /* the 35B-A3B */
        {6, 3, 64, 700, 3},    {8, 8, 64, 129, 2}, /* groups of 2 and 1 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        check_attention_on(tc, "attention-dec-tc", 2e-3, cs[i].heads, cs[i].kvh, cs[i].hd, cs[i].P, cs[i].n,
                           MR_KV_F16, false);
    check_attn_alone("dec-tc-alone", tc, 32, 4, 128, 300, 16, MR_KV_F16);
    check_attn_alone("dec-tc-alone", tc, 16, 2, 256, 5000, 9, MR_KV_F16);
    check_attn_alone("dec-tc-alone", tc, 6, 3, 64, 100, 5, MR_KV_F16);
    /* every row from position 1 on: the instances that also hold the
     * float path (N > 0) give the tensor-core-only ones' bits (N = 0) at
     * the same cut; the 64-position slices are for calls whose rows are all
     * on the tensor cores, so the pair is the cut before (GRAN=0) */
    mr_backend *from1 = backend_with("MEMRA_CUDA_ATTN_DEC_TC", "1");
    mr_backend *only = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_GRAN", "0");
    check_attn_pair("dec-tc-both-vs-only", from1, only, 32, 4, 128, 300, 16, MR_KV_F16);
    check_attn_pair("dec-tc-both-vs-only", from1, only, 16, 2, 256, 5000, 3, MR_KV_F16);
    from1->destroy(from1);
    only->destroy(only);
    /* positions 292 and later on the tensor cores: the last 8 of the 16 rows */
    mr_backend *mid = backend_with("MEMRA_CUDA_ATTN_DEC_TC", "292");
    check_attn_alone("dec-tc-alone-mixed", mid, 32, 4, 128, 300, 16, MR_KV_F16);
    mid->destroy(mid);
    static const struct { int P, n; } ls[] = {{2, 2}, {17, 5}, {300, 16}, {1000, 63}, {4000, 9}};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        check_attn_pair("dec-tc-loop", tc, grid, 32, 4, 128, ls[i].P, ls[i].n, MR_KV_F16);
        check_attn_pair("dec-tc-loop", tc, grid, 16, 2, 256, ls[i].P, ls[i].n, MR_KV_F16);
    }
    check_attention_bad(tc, "attention-dec-tc", 128, MR_KV_F16, 60, 2);
    check_attention_bad(tc, "attention-dec-tc", 256, MR_KV_F16, 60, 2);
    /* a block a whole group of 8 heads (MEMRA_CUDA_ATTN_DEC_TC_G8): the
     * 30B-A3B's and the 35B-A3B's groups, and one of 8 at D = 64 */
    mr_backend *g8 = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_DEC_TC_G8", "1");
    setenv("MEMRA_CUDA_ATTN_LOOP", "0", 1);
    mr_backend *g8grid = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_DEC_TC_G8", "1");
    unsetenv("MEMRA_CUDA_ATTN_LOOP");
    setenv("MEMRA_CUDA_ATTN_DEC_TC_G8", "0", 1); /* main's setting, for the backends made after */
    static const struct { int heads, kvh, hd, P, n; } gs[] = {
        {32, 4, 128, 1, 1}, {32, 4, 128, 100, 5}, {32, 4, 128, 4900, 16}, {32, 4, 128, 20000, 1},
        {16, 2, 256, 17, 2}, {16, 2, 256, 5000, 4}, {8, 1, 64, 700, 3},
    };
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
        check_attention_on(g8, "attention-dec-tc-g8", 2e-3, gs[i].heads, gs[i].kvh, gs[i].hd, gs[i].P, gs[i].n,
                           MR_KV_F16, false);
    check_attn_alone("dec-tc-g8-alone", g8, 32, 4, 128, 300, 16, MR_KV_F16);
    check_attn_alone("dec-tc-g8-alone", g8, 16, 2, 256, 5000, 9, MR_KV_F16);
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        check_attn_pair("dec-tc-g8-loop", g8, g8grid, 32, 4, 128, ls[i].P, ls[i].n, MR_KV_F16);
    check_attention_bad(g8, "attention-dec-tc-g8", 128, MR_KV_F16, 60, 1);
    check_attn_pair("dec-tc-g8-group4", g8, tc, 32, 8, 128, 1000, 3, MR_KV_F16); /* a group of 4: no change */
    /* streams sharing one to three prefixes in one call (the slices of
     * whole multiples of 64 cut most of them in the same places), none,
     * 100 and 130 streams, a deep one; the wave against the grid */
    mr_backend *off = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_GRAN", "0");
    setenv("MEMRA_CUDA_ATTN_GRAN", "0", 1);
    mr_backend *offgrid = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_LOOP", "0");
    unsetenv("MEMRA_CUDA_ATTN_GRAN");
    static const struct { int heads, kvh, hd, shared, own, ns, np; } ss[] = {
        {32, 4, 128, 4096, 768, 16, 1}, {32, 4, 128, 4096, 768, 16, 2}, {32, 4, 128, 0, 533, 16, 1},
        {32, 8, 128, 2048, 64, 16, 3},  {16, 2, 256, 4096, 300, 8, 2},  {6, 3, 64, 1024, 100, 12, 3},
        {32, 4, 128, 1024, 50, 100, 2}, {32, 4, 128, 1024, 50, 130, 2}, {32, 4, 128, 8192, 1000, 16, 1},
    };
    for (size_t i = 0; i < sizeof ss / sizeof ss[0]; i++) {
        const int h = ss[i].heads, k = ss[i].kvh, d = ss[i].hd, sh = ss[i].shared, ow = ss[i].own;
        check_attn_streams("dec-tc-streams", tc, grid, h, k, d, sh, ow, ss[i].ns, ss[i].np, 0);
        check_attn_streams("dec-tc-streams-gran0", off, offgrid, h, k, d, sh, ow, ss[i].ns, ss[i].np, 0);
    }
    /* tokens 2i and 2i + 1 of one prefix share a block's K/V tiles
     * (ag_split_tc's pairs, the default): the same bits as without
     * (MEMRA_CUDA_ATTN_PAIR=0), at the 30B-A3B's and the 35B-A3B's heads,
     * groups of 2 and 1, odd stream counts, neighbours of two prefixes */
    mr_backend *nopair = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_PAIR", "0");
    check_attn_streams("dec-tc-pair-off", tc, nopair, 32, 4, 128, 4096, 768, 16, 1, 0);
    check_attn_streams("dec-tc-pair-off", tc, nopair, 16, 2, 256, 4096, 300, 9, 1, 0);
    check_attn_streams("dec-tc-pair-off", tc, nopair, 6, 3, 64, 1024, 100, 13, 2, 0);
    check_attn_streams("dec-tc-pair-off", tc, nopair, 8, 8, 64, 1024, 100, 6, 1, 0);
    nopair->destroy(nopair);
    check_attn_streams("dec-tc-g8-streams", g8, g8grid, 32, 4, 128, 4096, 768, 16, 2, 0);
    check_attn_streams("dec-tc-g8-streams", g8, g8grid, 16, 2, 256, 4096, 300, 8, 1, 0);
    /* blocks of 8 heads keep the splits of blocks of 4, so a row's bits are
     * gb 4's: G8 against the default (one token, batches, past the
     * contexts where the split count decides the slices: 20,000 and 40,000
     * positions), and =batch (G8 for calls of 2+ rows) the same ways */
    static const struct { int heads, kvh, hd, P, n; } g4s[] = {
        {32, 4, 128, 300, 1},  {32, 4, 128, 4900, 16}, {32, 4, 128, 20000, 1}, {32, 4, 128, 20000, 3},
        {16, 2, 256, 5000, 4}, {16, 2, 256, 40000, 1}, {16, 2, 256, 40000, 2}, {8, 1, 64, 700, 3},
    };
    /* =batch, and the default (the variable unset): the same rule */
    mr_backend *g8b = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_DEC_TC_G8", "batch");
    unsetenv("MEMRA_CUDA_ATTN_DEC_TC_G8");
    mr_backend *g8d = backend_with("MEMRA_CUDA_ATTN_DEC_TC", "0");
    setenv("MEMRA_CUDA_ATTN_DEC_TC_G8", "0", 1);
    for (size_t i = 0; i < sizeof g4s / sizeof g4s[0]; i++) {
        check_attn_pair("dec-tc-g8-vs-g4", g8, tc, g4s[i].heads, g4s[i].kvh, g4s[i].hd, g4s[i].P, g4s[i].n,
                        MR_KV_F16);
        check_attn_pair("dec-tc-g8b-vs-g4", g8b, tc, g4s[i].heads, g4s[i].kvh, g4s[i].hd, g4s[i].P, g4s[i].n,
                        MR_KV_F16);
    }
    check_attn_alone("dec-tc-g8b-alone", g8b, 32, 4, 128, 300, 16, MR_KV_F16);
    check_attn_alone("dec-tc-g8b-alone", g8b, 16, 2, 256, 5000, 9, MR_KV_F16);
    check_attn_streams("dec-tc-g8b-streams", g8b, tc, 32, 4, 128, 4096, 768, 16, 2, 0);
    check_attn_streams("dec-tc-g8b-streams", g8b, tc, 16, 2, 256, 4096, 300, 8, 1, 0);
    check_attn_pair("dec-tc-g8-default", g8d, tc, 32, 4, 128, 4900, 16, MR_KV_F16);
    check_attn_alone("dec-tc-g8-default-alone", g8d, 32, 4, 128, 300, 16, MR_KV_F16);
    g8d->destroy(g8d);
    g8b->destroy(g8b);
    g8grid->destroy(g8grid);
    g8->destroy(g8);
    /* the cut before (MEMRA_CUDA_ATTN_GRAN=0): float64 host math, alone,
     * the wave against the grid, a bad block id */
    static const struct { int heads, kvh, hd, P, n; } os[] = {
        {32, 4, 128, 100, 5}, {32, 4, 128, 4900, 16}, {32, 4, 128, 20000, 1}, {32, 8, 128, 4000, 1},
        {16, 2, 256, 5000, 4}, {6, 3, 64, 700, 3},
    };
    for (size_t i = 0; i < sizeof os / sizeof os[0]; i++)
        check_attention_on(off, "attention-dec-tc-gran0", 2e-3, os[i].heads, os[i].kvh, os[i].hd, os[i].P, os[i].n,
                           MR_KV_F16, false);
    check_attn_alone("dec-tc-gran0-alone", off, 32, 4, 128, 4900, 16, MR_KV_F16);
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        check_attn_pair("dec-tc-gran0-loop", off, offgrid, 32, 4, 128, ls[i].P, ls[i].n, MR_KV_F16);
    check_attention_bad(off, "attention-dec-tc-gran0", 128, MR_KV_F16, 60, 2);
    /* the switch reaches the cut: at 900 positions the slices of a context
     * that keeps 8 (113 positions) become 128 */
    check_attn_engaged("dec-tc-gran-engaged", off, tc, 32, 4, 128, 900, 16, MR_KV_F16);
    /* slices that grow only to 64 positions (the rule before run 285): the
     * same float64 bound, and other sums than the default's 256 at depth */
    mr_backend *w64 = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_ATTN_WIDE", "64");
    check_attention_on(w64, "attention-dec-tc-wide64", 2e-3, 32, 4, 128, 4900, 16, MR_KV_F16, false);
    check_attn_engaged("dec-tc-wide-engaged", w64, tc, 32, 4, 128, 4900, 16, MR_KV_F16);
    w64->destroy(w64);
    offgrid->destroy(offgrid);
    off->destroy(off);
    check_attn_pair("dec-tc-bf16-off", tc, gpu, 32, 4, 128, 1000, 3, MR_KV_BF16);
    mr_backend *ref = backend_with2("MEMRA_CUDA_ATTN_DEC_TC", "0", "MEMRA_CUDA_GEMM", "f32");
    mr_backend *ref0 = backend_with("MEMRA_CUDA_GEMM", "f32");
    check_attn_pair("dec-tc-f32-mode-off", ref, ref0, 32, 4, 128, 1000, 3, MR_KV_F16);
    ref->destroy(ref);
    ref0->destroy(ref0);
    /* the switch reaches the kernel: the tensor-core rows differ from the
     * float kernel's (gpu) at each head size */
    check_attn_engaged("dec-tc-engaged", gpu, tc, 32, 4, 128, 300, 2, MR_KV_F16);
    check_attn_engaged("dec-tc-engaged", gpu, tc, 16, 2, 256, 300, 1, MR_KV_F16);
    check_attn_engaged("dec-tc-engaged", gpu, tc, 6, 3, 64, 100, 3, MR_KV_F16);
    grid->destroy(grid);
    tc->destroy(tc);
    setenv("MEMRA_CUDA_ATTN", "f32", 1);
}

static void check_attention(int heads, int kvh, int hd, int P, int n, mr_kv_dtype dt)
{
    check_attention_on(gpu, "attention", 1e-5, heads, kvh, hd, P, n, dt, false);
}

/* Prompt attention on the tensor cores (MEMRA_CUDA_ATTN=tc).  Q (times
 * scale), K, V and the softmax weights P are rounded to float16 (unit
 * roundoff u = 2^-11 = 4.9e-4); products and sums are float32.  Each
 * product q_d k_d of a score carries a relative error up to 2u, random in
 * sign, so a score's absolute error is about 2u |q| |k| / sqrt(D) * scale
 * (~1e-3 here), which moves its softmax weight by that relative amount;
 * P's and V's own roundings add up to u each, again independent across
 * the keys summed.  The output's relative L2 error is therefore below u
 * (the same rounding steps in float32 host code give 2e-4 to 3e-4 on these
 * shapes); bound 2e-3 = 4u leaves room for the tensor cores' accumulation
 * order.  Float16 K/V are stored exactly; bfloat16 ones convert to float16
 * exactly (8 significant bits), their rounding is in the reference. */
static void check_attention_tc(int heads, int kvh, int hd, int P, int n, mr_kv_dtype dt)
{
    check_attention_on(gpu_attn_tc, "attention-tc", 2e-3, heads, kvh, hd, P, n, dt, false);
}

/* A bad block id in the table (a corrupt table must not read out of
 * bounds): the prompt kernels give NaN rows for every query that sees a
 * position of that block and finite rows for the queries before it.
 * Reported as the number of rows that break the rule. */
static void check_attention_bad(mr_backend *be, const char *op, int hd, mr_kv_dtype dt, int n, int kvh)
{
    const int heads = 8, bt = 16, P = 200, nblk = P / bt + 1;
    const int badb = 9; /* positions 144..159 */
    mr_kv_cache kv = {.n_layers = 1, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh,
                      .head_dim = hd, .dtype = dt};
    if (be->kv_create(be, &kv, &err)) die("kv_create");
    int32_t table[16], pos[200];
    for (int i = 0; i < 16; i++) table[i] = i < nblk ? i : -1;
    for (int i = 0; i < P; i++) pos[i] = i;
    const int kvdim = kvh * hd;
    size_t qn = (size_t)n * heads * hd;
    float *K, *V, *q;
    attn_random_inputs(P, kvdim, qn, &K, &V, &q);
    int32_t *dtab = dup_to(be, table, sizeof table), *dpos = dup_to(be, pos, sizeof pos);
    float *dK = dup_to(be, K, (size_t)P * kvdim * 4), *dV = dup_to(be, V, (size_t)P * kvdim * 4);
    float *dq = dup_to(be, q, qn * 4), *dout = dalloc(be, qn * 4);
    be->kv_store(be, &kv, 0, dtab, dK, dV, dpos, P);
    table[badb] = nblk + 5;
    if (be->upload(be, dtab, table, sizeof table, &err)) die("upload");
    poison(be, dout, qn * 4);
    be->attention(be, &kv, 0, dtab, dq, dpos + (P - n), n, heads, 1.0f / sqrtf((float)hd), dout);
    float *out = malloc(qn * 4);
    fetch(be, out, dout, qn * 4);
    int wrong = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            const float *o = out + ((size_t)t * heads + h) * hd;
            int nan = 0;
            for (int d = 0; d < hd; d++) nan += !isfinite(o[d]);
            const bool sees = P - n + t >= badb * bt;
            wrong += sees ? nan != hd : nan != 0;
        }
    char shape[64];
    snprintf(shape, sizeof shape, "bad block id, %s h=%d/%d d=%d P=%d n=%d", kv_dt_name(dt), heads,
             kvh, hd, P, n);
    report(op, shape, (double)wrong, 0, 0.0);
    be->free(be, dtab); be->free(be, dpos); be->free(be, dK); be->free(be, dV);
    be->free(be, dq); be->free(be, dout);
    be->kv_destroy(be, &kv);
    free(K); free(V); free(q); free(out);
}

/* Multi-sequence K/V store and attention (decode batches): three sequences
 * of different lengths in one cache, each query the last position of its
 * sequence, plus a skipped row (NULL table) whose output must stay as it
 * was; against the one-sequence ops on a second cache filled one sequence
 * at a time. */
static void check_attention_multi(int heads, int kvh, int hd, mr_kv_dtype dt)
{
    enum { NS = 3 };
    const int P[NS] = {37, 130, 5}, bt = 16;
    int nb[NS], nblk = 0;
    for (int i = 0; i < NS; i++) { nb[i] = (P[i] + bt - 1) / bt; nblk += nb[i]; }
    mr_kv_cache ka = {.n_layers = 1, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh,
                      .head_dim = hd, .dtype = dt};
    mr_kv_cache kb = ka;
    if (gpu->kv_create(gpu, &ka, &err) || gpu->kv_create(gpu, &kb, &err)) die("kv_create");
    int32_t *perm = malloc(nblk * 4);
    for (int i = 0; i < nblk; i++) perm[i] = i;
    for (int i = nblk - 1; i > 0; i--) { int j = (int)(rnd() % (i + 1)); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    const int kvdim = kvh * hd, qd = heads * hd;
    int32_t *dtab[NS];
    float *dK[NS], *dV[NS];
    int32_t *dpos[NS];
    int tot = 0, used = 0;
    for (int i = 0; i < NS; i++) tot += P[i];
    /* rows of the one multi store: every position of every sequence */
    const int32_t **htabs = malloc(sizeof(void *) * (size_t)tot);
    float *Kall = malloc((size_t)tot * kvdim * 4), *Vall = malloc((size_t)tot * kvdim * 4);
    int32_t *pall = malloc(tot * 4);
    int row = 0;
    for (int i = 0; i < NS; i++) {
        dtab[i] = dup_to(gpu, perm + used, nb[i] * 4);
        used += nb[i];
        float *K = Kall + (size_t)row * kvdim, *V = Vall + (size_t)row * kvdim;
        for (size_t e = 0; e < (size_t)P[i] * kvdim; e++) { K[e] = fgauss(); V[e] = fgauss(); }
        for (int p = 0; p < P[i]; p++) { pall[row + p] = p; htabs[row + p] = dtab[i]; }
        dK[i] = dup_to(gpu, K, (size_t)P[i] * kvdim * 4);
        dV[i] = dup_to(gpu, V, (size_t)P[i] * kvdim * 4);
        dpos[i] = dup_to(gpu, pall + row, P[i] * 4);
        gpu->kv_store(gpu, &kb, 0, dtab[i], dK[i], dV[i], dpos[i], P[i]);
        row += P[i];
    }
    const int32_t **dtabs = dup_to(gpu, htabs, sizeof(void *) * (size_t)tot);
    float *dKall = dup_to(gpu, Kall, (size_t)tot * kvdim * 4), *dVall = dup_to(gpu, Vall, (size_t)tot * kvdim * 4);
    int32_t *dpall = dup_to(gpu, pall, tot * 4);
    gpu->kv_store_multi(gpu, &ka, 0, dtabs, dKall, dVall, dpall, tot);
    /* queries: rows 0, 2, 3 = the last position of sequences 0, 1, 2; row 1 skipped */
    const int nq = NS + 1;
    const int32_t *qtabs[NS + 1] = {dtab[0], NULL, dtab[1], dtab[2]};
    int32_t qpos[NS + 1] = {P[0] - 1, 0, P[1] - 1, P[2] - 1};
    float *q = malloc((size_t)nq * qd * 4);
    for (size_t e = 0; e < (size_t)nq * qd; e++) q[e] = fgauss() * 0.5f;
    const int32_t **dqt = dup_to(gpu, qtabs, sizeof qtabs);
    int32_t *dqp = dup_to(gpu, qpos, sizeof qpos);
    float *dq = dup_to(gpu, q, (size_t)nq * qd * 4);
    float *dout = dalloc(gpu, (size_t)nq * qd * 4), *dref = dalloc(gpu, (size_t)nq * qd * 4);
    poison(gpu, dout, (size_t)nq * qd * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    gpu->attention_multi(gpu, &ka, 0, dqt, dq, dqp, nq, heads, scale, dout);
    for (int r = 0; r < nq; r++)
        if (qtabs[r])
            gpu->attention(gpu, &kb, 0, qtabs[r], dq + (size_t)r * qd, dqp + r, 1, heads, scale,
                           dref + (size_t)r * qd);
    float *out = malloc((size_t)nq * qd * 4), *ref = malloc((size_t)nq * qd * 4);
    fetch(gpu, out, dout, (size_t)nq * qd * 4);
    fetch(gpu, ref, dref, (size_t)nq * qd * 4);
    /* the skipped row stays poisoned (NaN); compare the others */
    int untouched = 1;
    for (int e = 0; e < qd; e++) untouched &= out[qd + e] != out[qd + e];
    memmove(out + qd, out + 2 * qd, (size_t)(nq - 2) * qd * 4);
    memmove(ref + qd, ref + 2 * qd, (size_t)(nq - 2) * qd * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=37,130,5", kv_dt_name(dt),
             heads, kvh, hd);
    report_f("attention_multi", shape, out, ref, (size_t)(nq - 1) * qd, 1e-5);
    report("attention_multi", "skipped row left as it was", untouched ? 0.0 : 1.0, 0, 0.0);
    for (int i = 0; i < NS; i++) {
        gpu->free(gpu, dtab[i]); gpu->free(gpu, dK[i]); gpu->free(gpu, dV[i]); gpu->free(gpu, dpos[i]);
    }
    gpu->free(gpu, (void *)dtabs); gpu->free(gpu, dKall); gpu->free(gpu, dVall); gpu->free(gpu, dpall);
    gpu->free(gpu, (void *)dqt); gpu->free(gpu, dqp); gpu->free(gpu, dq); gpu->free(gpu, dout); gpu->free(gpu, dref);
    gpu->kv_destroy(gpu, &ka);
    gpu->kv_destroy(gpu, &kb);
    free(perm); free(htabs); free(Kall); free(Vall); free(pall); free(q); free(out); free(ref);
}

static void check_elementwise(size_t n)
{
    float *g = malloc(n * 4), *u = malloc(n * 4), *y = malloc(n * 4);
    double *ref = malloc(n * 8);
    for (size_t i = 0; i < n; i++) { g[i] = fgauss() * 4; u[i] = fgauss(); }
    for (size_t i = 0; i < n; i++) ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    float *dg = dup_to(gpu, g, n * 4), *du = dup_to(gpu, u, n * 4), *dy = dalloc(gpu, n * 4);
    poison(gpu, dy, n * 4);
    gpu->swiglu(gpu, dg, du, dy, n);
    fetch(gpu, y, dy, n * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%zu", n);
    report_rel("swiglu", shape, y, ref, n, 1e-6);
    gpu->swiglu(gpu, dg, du, dg, n); /* aliasing the gate */
    fetch(gpu, y, dg, n * 4);
    report_rel("swiglu-alias", shape, y, ref, n, 1e-6);
    for (size_t i = 0; i < n; i++) ref[i] = (double)u[i] + (double)(float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    gpu->add(gpu, du, dg, n);
    fetch(gpu, y, du, n * 4);
    report_rel("add", shape, y, ref, n, 1e-6);
    gpu->free(gpu, dg); gpu->free(gpu, du); gpu->free(gpu, dy);
    free(g); free(u); free(y); free(ref);
}

static void check_moe(int n, int E, int k, bool norm, bool ties)
{
    size_t ln = (size_t)n * E;
    float *l = malloc(ln * 4);
    for (size_t i = 0; i < ln; i++) l[i] = ties ? (float)(rnd() % 4) : fgauss() * 2;
    int32_t *rid = malloc((size_t)n * k * 4), *gid = malloc((size_t)n * k * 4);
    double *rw = malloc((size_t)n * k * 8);
    float *gw = malloc((size_t)n * k * 4);
    for (int t = 0; t < n; t++) {
        const float *lt = l + (size_t)t * E;
        double mx = -INFINITY, s = 0;
        for (int e = 0; e < E; e++) if (lt[e] > mx) mx = lt[e];
        for (int e = 0; e < E; e++) s += exp(lt[e] - mx);
        char *taken = calloc(E, 1);
        double ws = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || lt[e] > lt[best])) best = e;
            taken[best] = 1;
            rid[t * k + j] = best;
            rw[t * k + j] = exp(lt[best] - mx) / s;
            ws += rw[t * k + j];
        }
        if (norm) for (int j = 0; j < k; j++) rw[t * k + j] /= ws;
        free(taken);
    }
    float *dl = dup_to(gpu, l, ln * 4), *dw = dalloc(gpu, (size_t)n * k * 4);
    int32_t *di = dalloc(gpu, (size_t)n * k * 4);
    poison(gpu, dw, (size_t)n * k * 4);
    poison(gpu, di, (size_t)n * k * 4);
    gpu->moe_route(gpu, dl, n, E, k, norm, di, dw);
    fetch(gpu, gid, di, (size_t)n * k * 4);
    fetch(gpu, gw, dw, (size_t)n * k * 4);
    int idbad = 0;
    for (int i = 0; i < n * k; i++) idbad += gid[i] != rid[i];
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d E=%d k=%d%s%s", n, E, k, norm ? " norm" : "", ties ? " ties" : "");
    report("moe_route-ids", shape, (double)idbad, 0, 0.0);
    report_rel("moe_route-w", shape, gw, rw, (size_t)n * k, 1e-6);
    /* combine: out[t][r] = sum_j w[t][j] * y[t][j][r] */
    const int rows = 300;
    size_t yn = (size_t)n * k * rows;
    float *y = malloc(yn * 4), *o = malloc((size_t)n * rows * 4);
    for (size_t i = 0; i < yn; i++) y[i] = fgauss();
    double *ro = calloc((size_t)n * rows, 8);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++)
            for (int r = 0; r < rows; r++) ro[t * rows + r] += (double)gw[t * k + j] * y[((size_t)t * k + j) * rows + r];
    float *dy = dup_to(gpu, y, yn * 4), *dout = dalloc(gpu, (size_t)n * rows * 4);
    poison(gpu, dout, (size_t)n * rows * 4);
    gpu->moe_combine(gpu, dy, dw, n, k, rows, dout);
    fetch(gpu, o, dout, (size_t)n * rows * 4);
    report_rel("moe_combine", shape, o, ro, (size_t)n * rows, 1e-6);
    gpu->free(gpu, dl); gpu->free(gpu, dw); gpu->free(gpu, di); gpu->free(gpu, dy); gpu->free(gpu, dout);
    free(l); free(rid); free(gid); free(rw); free(gw); free(y); free(o); free(ro);
}

/* moe_route by ranks (the default) against the warp kernel
 * (MEMRA_CUDA_ROUTE=warp) on the same logits: ids and weights bit for bit.  kind 0: Gaussian; 1: values
 * 0..3 (ties); 2: ties and every fifth logit -inf; 3: a NaN in every other
 * row (the rank kernel hands those rows to the warp code). */
static void check_route_rank(mr_backend *warp, int n, int E, int k, bool norm, int kind)
{
    const size_t ln = (size_t)n * E, kn = (size_t)n * k;
    float *l = malloc(ln * 4);
    for (size_t i = 0; i < ln; i++) {
        l[i] = kind ? (float)(rnd() % 4) : fgauss() * 2;
        if (kind == 2 && i % 5 == 2) l[i] = -INFINITY;
        if (kind == 3 && (i / E) % 2 == 0 && i % E == (size_t)(E / 3)) l[i] = NAN;
    }
    int32_t *id[2];
    float *w[2];
    mr_backend *be[2] = {warp, gpu};
    for (int b = 0; b < 2; b++) {
        float *dl = dup_to(be[b], l, ln * 4), *dw = dalloc(be[b], kn * 4);
        int32_t *di = dalloc(be[b], kn * 4);
        poison(be[b], dw, kn * 4);
        poison(be[b], di, kn * 4);
        be[b]->moe_route(be[b], dl, n, E, k, norm, di, dw);
        id[b] = malloc(kn * 4);
        w[b] = malloc(kn * 4);
        fetch(be[b], id[b], di, kn * 4);
        fetch(be[b], w[b], dw, kn * 4);
        be[b]->free(be[b], dl); be[b]->free(be[b], dw); be[b]->free(be[b], di);
    }
    size_t diff = 0;
    for (size_t i = 0; i < kn; i++) diff += id[0][i] != id[1][i] || memcmp(&w[0][i], &w[1][i], 4) != 0;
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d E=%d k=%d%s kind %d", n, E, k, norm ? " norm" : "", kind);
    report("route-rank", shape, (double)diff, 0, 0.0); /* picks that differ in id or in any bit */
    for (int b = 0; b < 2; b++) { free(id[b]); free(w[b]); }
    free(l);
}

/* The end of a mixture layer (moe_combine, with a shared expert's
 * sigmoid_mul and add, then add + rmsnorm as the forward pass calls them)
 * recorded back to back on a backend whose recorder runs them as one
 * launch (mr_cu_moe_tail; MEMRA_CUDA_FUSE_TAIL=2: with and without the
 * shared expert), against a backend with that rule off
 * (MEMRA_CUDA_FUSE_TAIL=0): every buffer the ops write, bit for bit,
 * and the count of ops the rule took (0 where it must not: a width that
 * is not a multiple of 4 or above 4,096).  pt (a weight type; 0: none): a
 * product of 512 x dim of that type over the normed rows follows, as q/k/v
 * follow a layer's end; its output bit for bit, and whether it took the
 * interleaved operand the tail wrote (MEMRA_CUDA_FUSE_XQ's bit 0, on by
 * default: the fusions' xq count; where the rule took the tail, the call is 3+ tokens
 * and whole 256-column blocks, once; else never). */
static void check_moe_tail(mr_backend *on, mr_backend *off, int n, int k, int dim, bool shared, int rule, int pt)
{
    const size_t yn = (size_t)n * k * dim, rn = (size_t)n * dim, wn = (size_t)n * k;
    float *y = malloc(yn * 4), *cw = malloc(wn * 4), *sh = malloc(rn * 4), *g = malloc((size_t)n * 3 * 4);
    float *xr = malloc(rn * 4), *nw = malloc((size_t)dim * 4);
    for (size_t i = 0; i < yn; i++) y[i] = fgauss();
    for (size_t i = 0; i < wn; i++) cw[i] = (float)(rnd() % 1000) / 1000.0f;
    for (size_t i = 0; i < rn; i++) { sh[i] = fgauss(); xr[i] = fgauss() * 4; }
    for (int i = 0; i < n * 3; i++) g[i] = fgauss();
    for (int i = 0; i < dim; i++) nw[i] = 1.0f + 0.1f * fgauss();
    mr_backend *be[2] = {on, off};
    float *res[2][5];
    long took = 0, xq[2] = {0, 0};
    next_prod pp; /* 512 rows */
    next_init(&pp, pt, dim, 512, n);
    for (int b = 0; b < 2; b++) {
        next_load(&pp, be[b]);
        float *dy = dup_to(be[b], y, yn * 4), *dcw = dup_to(be[b], cw, wn * 4), *dsh = dup_to(be[b], sh, rn * 4);
        float *dg = dup_to(be[b], g, (size_t)n * 3 * 4), *dx = dup_to(be[b], xr, rn * 4);
        float *dw = dup_to(be[b], nw, (size_t)dim * 4), *dp = dalloc(be[b], rn * 4), *dout = dalloc(be[b], rn * 4);
        poison(be[b], dp, rn * 4);
        poison(be[b], dout, rn * 4);
        if (be[b]->sync(be[b], &err)) die("sync");
        const long t0 = fused_ops(be[b]).tail, x0 = fused_ops(be[b]).xq;
        be[b]->moe_combine(be[b], dy, dcw, n, k, dim, dp);
        if (shared) {
            be[b]->sigmoid_mul(be[b], dsh, dg, n, dim, 3, true);
            be[b]->add(be[b], dp, dsh, rn);
        }
        be[b]->add(be[b], dx, dp, rn);
        be[b]->rmsnorm(be[b], dx, dw, dout, n, dim, 1e-6f);
        next_run(&pp, be[b], dout, n);
        if (be[b]->sync(be[b], &err)) die("sync");
        if (b == 0) took = fused_ops(be[b]).tail - t0;
        xq[b] = fused_ops(be[b]).xq - x0;
        float *d[4] = {dp, dsh, dx, dout};
        for (int q = 0; q < 4; q++) {
            res[b][q] = malloc(rn * 4);
            fetch(be[b], res[b][q], d[q], rn * 4);
        }
        res[b][4] = next_take(&pp, be[b]);
        be[b]->free(be[b], dy); be[b]->free(be[b], dcw); be[b]->free(be[b], dsh); be[b]->free(be[b], dg);
        be[b]->free(be[b], dx); be[b]->free(be[b], dw); be[b]->free(be[b], dp); be[b]->free(be[b], dout);
    }
    size_t diff = 0;
    int nan = 0;
    for (int q = 0; q < 4; q++) {
        diff += floats_differ(res[0][q], res[1][q], rn);
        for (size_t i = 0; i < rn; i++) nan += isnan(res[0][q][i]);
    }
    char shape[80];
    snprintf(shape, sizeof shape, "n=%d k=%d dim=%d%s%s%s%s", n, k, dim, shared ? " shared" : "",
             rule == 3 ? " default rule" : "", pt ? " then " : "", pt ? pp.td->name : "");
    report("moe-tail-vs-ops", shape, (double)diff, nan, 0.0);
    /* a thread a float4: 1024 at most; rule 3 (the default) takes a plain
     * tail only for 2+ rows */
    const long want = dim % 4 || dim > 4096 ? 0 : shared ? 3 : rule == 2 || n > 1 ? 1 : 0;
    report("moe-tail-ops-taken", shape, (double)labs(took - want), 0, 0.0);
    if (pt) {
        report("moe-tail-then-product", shape, (double)floats_differ(res[0][4], res[1][4], pp.yn),
               floats_nan(res[0][4], pp.yn), 0.0);
        const long wxq = want && n >= 3 && dim % 256 == 0 ? 1 : 0;
        report("moe-tail-xq-taken", shape, (double)(labs(xq[0] - wxq) + labs(xq[1])), 0, 0.0);
    }
    for (int b = 0; b < 2; b++)
        for (int q = 0; q < 5; q++) free(res[b][q]);
    free(y); free(cw); free(sh); free(g); free(xr); free(nw); free(pp.host);
}

/* A delta-net layer's gated norm (rmsnorm(o, w, o) over rows of dim, then
 * swiglu(z, o, o), as the forward pass calls them) on a backend whose
 * recorder runs the two as one launch (mr_cu_rmsnorm_gate) against one
 * with that rule off (MEMRA_CUDA_FUSE_GNORM=0): the output bit for bit,
 * and whether the rule took them (not where a row is not whole float4s).
 * inplace 0: out is another buffer than x (x must then be unchanged). */
static void check_gnorm(mr_backend *on, mr_backend *off, int rows, int dim, bool inplace)
{
    const size_t n = (size_t)rows * dim;
    float *x = malloc(n * 4), *z = malloc(n * 4), *w = malloc((size_t)dim * 4);
    for (size_t i = 0; i < n; i++) { x[i] = fgauss() * 3; z[i] = fgauss() * 2; }
    for (int i = 0; i < dim; i++) w[i] = 1.0f + 0.1f * fgauss();
    mr_backend *be[2] = {on, off};
    float *res[2][2];
    long took = 0;
    for (int b = 0; b < 2; b++) {
        float *dx = dup_to(be[b], x, n * 4), *dz = dup_to(be[b], z, n * 4), *dw = dup_to(be[b], w, (size_t)dim * 4);
        float *dout = inplace ? dx : dalloc(be[b], n * 4);
        if (!inplace)
            poison(be[b], dout, n * 4);
        if (be[b]->sync(be[b], &err)) die("sync");
        const long t0 = fused_ops(be[b]).gnorm;
        be[b]->rmsnorm(be[b], dx, dw, dout, rows, dim, 1e-6f);
        be[b]->swiglu(be[b], dz, dout, dout, n);
        if (be[b]->sync(be[b], &err)) die("sync");
        if (b == 0) took = fused_ops(be[b]).gnorm - t0;
        res[b][0] = malloc(n * 4);
        res[b][1] = malloc(n * 4);
        fetch(be[b], res[b][0], dout, n * 4);
        fetch(be[b], res[b][1], dx, n * 4);
        be[b]->free(be[b], dx); be[b]->free(be[b], dz); be[b]->free(be[b], dw);
        if (!inplace) be[b]->free(be[b], dout);
    }
    size_t diff = floats_differ(res[0][0], res[1][0], n) + floats_differ(res[0][1], res[1][1], n);
    int nan = 0;
    for (size_t i = 0; i < n; i++) nan += isnan(res[0][0][i]);
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d dim=%d%s", rows, dim, inplace ? " in place" : "");
    report("gnorm-vs-ops", shape, (double)diff, nan, 0.0);
    const long want = dim % 4 || dim > 16384 ? 0 : 1;
    report("gnorm-ops-taken", shape, (double)labs(took - want), 0, 0.0);
    for (int b = 0; b < 2; b++) { free(res[b][0]); free(res[b][1]); }
    free(x); free(z); free(w);
}

/* A delta-net layer's in-projection of one token (m products over one
 * input) and the causal convolution of the first product's outputs
 * (conv1d_silu, k taps, over its rows as channels), recorded back to back
 * (the recorder runs them as one launch where the 22-bit kernel takes the
 * products: the conv count of fused_ops, `want`) and with syncs between
 * them (apart).  Every product output, the convolution's outputs and the
 * new state must be the same bits either way; the outputs must match a
 * double reference of silu(conv(state, W0 x)), and the new state must be
 * the old one moved on by one row, the product's outputs last.  n: tokens
 * (the rule takes one). */
static void check_inconv(mr_backend *be, int type, const int64_t *rows, int m, int64_t cols, int k, int n, long want)
{
    const tdesc *td = td_of(type);
    const size_t rb = (size_t)(cols / td->be) * td->bb;
    uint8_t *host[MULTI_MAX];
    mr_weight w[MULTI_MAX];
    for (int s = 0; s < m; s++) {
        host[s] = malloc(rb * rows[s]);
        rand_blocks(td, host[s], rb * rows[s] / td->bb);
        load_weight(be, td, host[s], cols, rows[s], 1, &w[s]);
    }
    const int64_t ch = rows[0];
    const int hist = k - 1;
    const size_t xn = (size_t)n * cols, on = (size_t)n * ch, sn = (size_t)(hist > 0 ? hist : 1) * ch;
    float *x = malloc(xn * 4), *cw = malloc((size_t)ch * k * 4), *st = malloc(sn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    for (size_t i = 0; i < (size_t)ch * k; i++) cw[i] = 0.5f * fgauss();
    for (size_t i = 0; i < sn; i++) st[i] = fgauss();
    float *dx = dup_to(be, x, xn * 4), *dcw = dup_to(be, cw, (size_t)ch * k * 4);
    /* the delta-rule scan of the convolution's outputs after them (heads of
     * 128, as many value heads as the channels hold: the 35B-A3B's at 8,192),
     * whose state the launch before it does not write, so one token's is
     * loaded before the wait (mr_cu_gdn_scan_early) */
    const int nv = ch % 512 == 0 ? (int)(ch / 256) : 0, nk = nv / 2;
    const size_t gsn = (size_t)nv * 128 * 128, gon = (size_t)n * nv * 128;
    float *gal = malloc((size_t)(n * nv + 1) * 4), *gbt = malloc((size_t)(n * nv + 1) * 4);
    float *gA = malloc((size_t)(nv + 1) * 4), *gdt = malloc((size_t)(nv + 1) * 4), *gs0 = malloc((gsn + 1) * 4);
    for (int i = 0; i < n * nv; i++) { gal[i] = 2 * fgauss(); gbt[i] = 2 * fgauss(); }
    for (int h = 0; h < nv; h++) { gA[h] = -expf(0.5f * fgauss()); gdt[h] = fgauss(); }
    for (size_t i = 0; i < gsn; i++) gs0[i] = 0.1f * fgauss();
    float *got[2][MULTI_MAX + 4];
    long fused[2], early[2];
    for (int apart = 0; apart < 2; apart++) {
        float *dy[MULTI_MAX], *dout = dalloc(be, on * 4), *dst = dup_to(be, st, sn * 4);
        poison(be, dout, on * 4);
        for (int s = 0; s < m; s++) {
            dy[s] = dalloc(be, (size_t)n * rows[s] * 4);
            poison(be, dy[s], (size_t)n * rows[s] * 4);
        }
        float *gda = nv ? dup_to(be, gal, (size_t)n * nv * 4) : NULL, *gdb = nv ? dup_to(be, gbt, (size_t)n * nv * 4) : NULL;
        float *gdA = nv ? dup_to(be, gA, (size_t)nv * 4) : NULL, *gddt = nv ? dup_to(be, gdt, (size_t)nv * 4) : NULL;
        float *gds = nv ? dup_to(be, gs0, gsn * 4) : NULL, *gdo = nv ? dalloc(be, gon * 4) : NULL;
        if (nv) poison(be, gdo, gon * 4);
        if (be->sync(be, &err)) die("sync");
        const long f0 = fused_ops(be).conv, e0 = fused_ops(be).scan_early;
        for (int s = 0; s < m; s++) {
            be->matmul(be, &w[s], dx, dy[s], n);
            if (apart && be->sync(be, &err)) die("sync");
        }
        be->conv1d_silu(be, dy[0], dcw, dst, n, (int)ch, k, dout);
        if (apart && be->sync(be, &err)) die("sync");
        if (nv)
            be->gdn_scan(be, dout, (int)ch, gda, gdb, gdA, gddt, gds, n, nk, nv, 128, 128, 1e-6f, gdo);
        if (be->sync(be, &err)) die("sync");
        fused[apart] = fused_ops(be).conv - f0;
        early[apart] = fused_ops(be).scan_early - e0;
        got[apart][m + 2] = malloc((gon + 1) * 4);
        got[apart][m + 3] = malloc((gsn + 1) * 4);
        if (nv) {
            fetch(be, got[apart][m + 2], gdo, gon * 4);
            fetch(be, got[apart][m + 3], gds, gsn * 4);
            be->free(be, gda); be->free(be, gdb); be->free(be, gdA); be->free(be, gddt); be->free(be, gds);
            be->free(be, gdo);
        }
        for (int s = 0; s < m; s++) {
            got[apart][s] = malloc((size_t)n * rows[s] * 4);
            fetch(be, got[apart][s], dy[s], (size_t)n * rows[s] * 4);
            be->free(be, dy[s]);
        }
        got[apart][m] = malloc(on * 4);
        got[apart][m + 1] = malloc(sn * 4);
        fetch(be, got[apart][m], dout, on * 4);
        fetch(be, got[apart][m + 1], dst, sn * 4);
        be->free(be, dout);
        be->free(be, dst);
    }
    size_t diff = 0;
    for (int s = 0; s < m; s++) diff += floats_differ(got[0][s], got[1][s], (size_t)n * rows[s]);
    diff += floats_differ(got[0][m], got[1][m], on) + (hist > 0 ? floats_differ(got[0][m + 1], got[1][m + 1], sn) : 0);
    const size_t sdiff = nv ? floats_differ(got[0][m + 2], got[1][m + 2], gon) + floats_differ(got[0][m + 3], got[1][m + 3], gsn) : 0;
    /* the reference: the convolution in double over the fused launch's own
     * product outputs (their accuracy is the matmul checks' business) */
    const float *qkv = got[0][0];
    double *ref = malloc(on * 8);
    size_t moved = 0;
    for (int64_t c = 0; c < ch; c++) {
        for (int t = 0; t < n; t++) {
            double acc = 0;
            for (int j = 0; j < k; j++) {
                const int p = t - hist + j;
                acc += (double)cw[c * k + j] * (p >= 0 ? qkv[(size_t)p * ch + c] : st[(size_t)(hist + p) * ch + c]);
            }
            ref[(size_t)t * ch + c] = acc / (1.0 + exp(-acc));
        }
        for (int i = 0; i < hist; i++) {
            const int p = n - hist + i;
            const float want_s = p >= 0 ? qkv[(size_t)p * ch + c] : st[(size_t)(hist + p) * ch + c];
            moved += memcmp(&got[0][m + 1][(size_t)i * ch + c], &want_s, 4) != 0;
        }
    }
    char shape[112];
    int len = snprintf(shape, sizeof shape, "%s ", td->name);
    for (int s = 0; s < m; s++) len += snprintf(shape + len, sizeof shape - len, "%s%lld", s ? "," : "", (long long)rows[s]);
    snprintf(shape + len, sizeof shape - len, " x%lld k=%d n=%d", (long long)cols, k, n);
    report_rel("inconv", shape, got[0][m], ref, on, 2e-6);
    report("inconv-state", shape, (double)moved, 0, 0.0);   /* state entries not the old ones moved on */
    report("inconv-vs-apart", shape, (double)diff, 0, 0.0); /* values that differ in any bit */
    report("inconv-taken", shape, (double)labs(fused[0] - want) + (double)labs(fused[1]), 0, 0.0);
    if (nv) {
        report("inconv-scan-vs-apart", shape, (double)sdiff, 0, 0.0); /* the scan's outputs and state, any bit */
        /* a scan follows each fused launch: its state loaded early there, not apart */
        report("inconv-scan-early", shape, (double)labs(early[0] - (want && n == 1)) + (double)labs(early[1]), 0, 0.0);
    }
    free(gal); free(gbt); free(gA); free(gdt); free(gs0);
    for (int a = 0; a < 2; a++)
        for (int s = 0; s < m + 4; s++) free(got[a][s]);
    for (int s = 0; s < m; s++) {
        be->weight_release(be, &w[s]);
        free(host[s]);
    }
    be->free(be, dx);
    be->free(be, dcw);
    free(x); free(cw); free(st); free(ref);
}

static void check_inconv_all(void)
{
    const int64_t gdn35[] = {8192, 4096, 32, 32}; /* the 35B-A3B: qkv, z, alpha, beta */
    const int64_t one[] = {4096};
    const int64_t split[] = {6144, 2048}; /* the 22-bit kernel takes the first only: no shared launch */
    const int64_t q4k[] = {12288, 64};
    const int64_t small[] = {512, 256};
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 4, 1, 1);
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, one, 1, 2048, 4, 1, 1);
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 3, 1, 1);
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, gdn35, 2, 1024, 1, 1, 1); /* one tap: no state */
    check_inconv(gpu_x24, MR_TYPE_Q4_K, q4k, 1, 2048, 4, 1, 1);
    check_inconv(gpu_x24, MR_TYPE_Q4_K, q4k, 2, 2048, 4, 1, 0);     /* 64 rows: not the 22-bit kernel's */
    check_inconv(gpu_x24, MR_TYPE_Q8_0, q4k, 1, 1024, 2, 1, 1);
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 4, 2, 0); /* two tokens */
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 5, 1, 0); /* more taps than the kernel keeps */
    check_inconv(gpu_x24, MR_TYPE_IQ4_XS, split, 2, 2048, 4, 1, 0);
    check_inconv(gpu_x24, MR_TYPE_BF16, small, 2, 1024, 4, 1, 0);   /* the float kernels */
    /* on the int8 tensor cores (k_xmd1's CONV form): IQ4_XS with
     * MEMRA_CUDA_XMD_IQ4XS=x24, and Q4_K */
    setenv("MEMRA_CUDA_XMD", "1", 1);
    mr_backend *xmd = backend_with("MEMRA_CUDA_XMD_IQ4XS", "x24");
    setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
    const int64_t q4kx[] = {4096, 512, 512};
    check_inconv(xmd, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 4, 1, 1);
    check_inconv(xmd, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 3, 1, 1);
    check_inconv(xmd, MR_TYPE_IQ4_XS, one, 1, 2048, 2, 1, 1);
    check_inconv(xmd, MR_TYPE_IQ4_XS, gdn35, 4, 2048, 4, 2, 0); /* two tokens */
    check_inconv(xmd, MR_TYPE_Q4_K, q4kx, 3, 2048, 4, 1, 1);
    check_inconv(xmd, MR_TYPE_Q4_K, q4kx, 3, 4096, 4, 1, 0);    /* 16 blocks a row: k_xmd1 at 3 an SM, no form */
    xmd->destroy(xmd);
}

static void check_moe_tail_all(void)
{
    /* the products after the tail on the int8 tensor-core kernels, which
     * read the operand (kernel-check's own setting is the float kernels) */
    setenv("MEMRA_CUDA_XMD", "1", 1);
    mr_backend *on = backend_with("MEMRA_CUDA_FUSE_TAIL", "2"), *off = backend_with("MEMRA_CUDA_FUSE_TAIL", "0");
    for (int sh = 0; sh < 2; sh++) {
        check_moe_tail(on, off, 1, 8, 2048, sh, 2, 0); /* the 30B-A3B / 35B-A3B decode step */
        check_moe_tail(on, off, 3, 8, 4096, sh, 2, 0);
        check_moe_tail(on, off, 16, 8, 2048, sh, 2, 0); /* a decode batch */
        check_moe_tail(on, off, 2, 4, 1000, sh, 2, 0);
        check_moe_tail(on, off, 2, 2, 1002, sh, 2, 0); /* not taken: not a multiple of 4 */
        check_moe_tail(on, off, 1, 10, 8192, sh, 2, 0); /* not taken: wider than a block's threads */
        check_moe_tail(on, off, 2, 12, 4096, sh, 2, 0); /* two rounds of loads a thread */
        /* then the next layer's first product: its operand from the tail
         * at 3+ tokens (a decode batch; 9 and 21: chunks of 8 not full) */
        check_moe_tail(on, off, 16, 8, 2048, sh, 2, MR_TYPE_Q4_K);
        check_moe_tail(on, off, 9, 8, 2048, sh, 2, MR_TYPE_IQ4_XS);
        check_moe_tail(on, off, 21, 8, 4096, sh, 2, MR_TYPE_Q4_K);
        check_moe_tail(on, off, 3, 8, 4096, sh, 2, MR_TYPE_IQ4_XS);
        check_moe_tail(on, off, 2, 8, 2048, sh, 2, MR_TYPE_Q4_K); /* 2 tokens: their own quantization */
        check_moe_tail(on, off, 1, 10, 8192, sh, 2, MR_TYPE_Q4_K); /* no tail launch: nothing written */
    }
    on->destroy(on);
    unsetenv("MEMRA_CUDA_FUSE_TAIL"); /* the default rule */
    on = mr_backend_cuda_create(0, &err);
    if (!on) die("cuda (the default tail rule)");
    for (int sh = 0; sh < 2; sh++) {
        check_moe_tail(on, off, 1, 8, 2048, sh, 3, 0); /* one token: a plain tail apart */
        check_moe_tail(on, off, 16, 8, 2048, sh, 3, 0);
        check_moe_tail(on, off, 2, 4, 1000, sh, 3, 0);
        check_moe_tail(on, off, 16, 8, 2048, sh, 3, MR_TYPE_Q4_K);
        check_moe_tail(on, off, 16, 8, 2048, sh, 3, MR_TYPE_IQ4_XS);
    }
    on->destroy(on);
    off->destroy(off);
    setenv("MEMRA_CUDA_XMD", "0", 1); /* main's setting */
    on = backend_with("MEMRA_CUDA_FUSE_GNORM", "1");
    off = backend_with("MEMRA_CUDA_FUSE_GNORM", "0");
    check_gnorm(on, off, 32, 128, true);   /* the 35B-A3B's decode step: 32 value heads of 128 */
    check_gnorm(on, off, 512, 128, true);  /* 16 tokens */
    check_gnorm(on, off, 48, 128, false);
    check_gnorm(on, off, 5, 4096, true);   /* four float4 a thread */
    check_gnorm(on, off, 3, 8192, false);
    check_gnorm(on, off, 4, 100, true);
    check_gnorm(on, off, 4, 130, true);    /* not taken: not whole float4s */
    on->destroy(on);
    off->destroy(off);
    check_inconv_all();
}

static void check_route_rank_all(void)
{
    mr_backend *warp = backend_with("MEMRA_CUDA_ROUTE", "warp");
    for (int kind = 0; kind < 4; kind++) {
        check_route_rank(warp, 1, 128, 8, true, kind);  /* the 30B-A3B */
        check_route_rank(warp, 16, 128, 8, true, kind); /* a decode batch */
        check_route_rank(warp, 3, 256, 8, true, kind);  /* the 35B-A3B */
        check_route_rank(warp, 5, 60, 4, false, kind);
        check_route_rank(warp, 2, 300, 10, true, kind);
        check_route_rank(warp, 2, 512, 32, false, kind);
        check_route_rank(warp, 4, 4, 2, true, kind);
    }
    warp->destroy(warp);
}

/* kind 0: Gaussian values; 1: values 0..4 (ties: the lowest index wins);
 * 2: ties with every seventh value NaN and row 0 all NaN (a number beats
 * NaN; an all-NaN row gives 0).  The reference is the host sampler's
 * greedy pick (worker/sample.c), which the worker uses without the GPU. */
static void check_argmax(int n, int dim, int kind)
{
    size_t len = (size_t)n * dim;
    float *x = malloc(len * 4);
    for (size_t i = 0; i < len; i++) {
        x[i] = kind ? (float)(rnd() % 5) : fgauss();
        if (kind == 2 && (i % 7 == 3 || i < (size_t)dim)) x[i] = NAN;
    }
    int32_t *ids = malloc(n * 4);
    float *dx = dup_to(gpu, x, len * 4);
    int32_t *di = dalloc(gpu, n * 4);
    poison(gpu, di, n * 4);
    gpu->argmax(gpu, dx, n, dim, di);
    fetch(gpu, ids, di, n * 4);
    int bad = 0;
    for (int t = 0; t < n; t++) bad += ids[t] != mr_sample_argmax(x + (size_t)t * dim, dim);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d%s", n, dim, kind == 2 ? " ties nan" : kind ? " ties" : "");
    report("argmax", shape, (double)bad, 0, 0.0);
    gpu->free(gpu, dx); gpu->free(gpu, di);
    free(x); free(ids);
}

/* ---- hybrid (Gated DeltaNet) ops: against the CPU backend ---- */

static void *cpu_dup(const void *h, size_t n) { return dup_to(cpu, h, n); }

/* dst rows of dim from src rows with other strides (query half of [q | gate]). */
static void check_copy_2d(int rows, int dim, int ds, int ss, int src_off)
{
    size_t sn = (size_t)rows * ss + src_off, dn = (size_t)rows * ds;
    float *src = malloc(sn * 4), *a = malloc(dn * 4), *b = malloc(dn * 4);
    for (size_t i = 0; i < sn; i++) src[i] = fgauss();
    float *gs = dup_to(gpu, src, sn * 4), *gd = dalloc(gpu, dn * 4);
    float *cs = cpu_dup(src, sn * 4), *cd = dalloc(cpu, dn * 4);
    /* the gaps between rows stay as they were: same poison on both sides */
    poison(gpu, gd, dn * 4);
    poison(cpu, cd, dn * 4);
    gpu->copy_2d(gpu, gd, ds, gs + src_off, ss, rows, dim);
    cpu->copy_2d(cpu, cd, ds, cs + src_off, ss, rows, dim);
    fetch(gpu, a, gd, dn * 4);
    fetch(cpu, b, cd, dn * 4);
    int bad = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < ds; i++) {
            size_t k = (size_t)r * ds + i;
            if (i < dim ? !(a[k] == b[k]) : !isnan(a[k])) bad++;
        }
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d dst/%d src/%d+%d", rows, dim, ds, ss, src_off);
    report("copy_2d-cpu", shape, (double)bad, 0, 0.0); /* a copy is exact */
    gpu->free(gpu, gs); gpu->free(gpu, gd); cpu->free(cpu, cs); cpu->free(cpu, cd);
    free(src); free(a); free(b);
}

static void check_sigmoid_mul(int rows, int dim, int g_stride, int g_off, bool scalar)
{
    size_t yn = (size_t)rows * dim, gn = (size_t)rows * g_stride + g_off;
    float *y = malloc(yn * 4), *g = malloc(gn * 4), *a = malloc(yn * 4), *b = malloc(yn * 4);
    for (size_t i = 0; i < yn; i++) y[i] = fgauss();
    for (size_t i = 0; i < gn; i++) g[i] = fgauss() * 4;
    float *gy = dup_to(gpu, y, yn * 4), *gg = dup_to(gpu, g, gn * 4);
    float *cy = cpu_dup(y, yn * 4), *cg = cpu_dup(g, gn * 4);
    gpu->sigmoid_mul(gpu, gy, gg + g_off, rows, dim, g_stride, scalar);
    cpu->sigmoid_mul(cpu, cy, cg + g_off, rows, dim, g_stride, scalar);
    fetch(gpu, a, gy, yn * 4);
    fetch(cpu, b, cy, yn * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d g/%d+%d%s", rows, dim, g_stride, g_off, scalar ? " scalar" : "");
    report_f("sigmoid_mul-cpu", shape, a, b, yn, 1e-6);
    gpu->free(gpu, gy); gpu->free(gpu, gg); cpu->free(cpu, cy); cpu->free(cpu, cg);
    free(y); free(g); free(a); free(b);
}

/* Two calls of n tokens each on one carried state (random, as if after
 * earlier tokens): both outputs and the final state against the CPU. */
static void check_conv1d(int channels, int k, int n)
{
    size_t xn = (size_t)2 * n * channels, hn = (size_t)(k - 1) * channels, wn = (size_t)channels * k;
    float *x = malloc(xn * 4), *w = malloc(wn * 4), *st = malloc(hn * 4 + 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    for (size_t i = 0; i < wn; i++) w[i] = fgauss() * 0.5f;
    for (size_t i = 0; i < hn; i++) st[i] = fgauss();
    float *gx = dup_to(gpu, x, xn * 4), *gw = dup_to(gpu, w, wn * 4), *gs = dup_to(gpu, st, hn * 4 + 4);
    float *gy = dalloc(gpu, xn * 4);
    float *cx = cpu_dup(x, xn * 4), *cw = cpu_dup(w, wn * 4), *cs = cpu_dup(st, hn * 4 + 4);
    float *cy = dalloc(cpu, xn * 4);
    poison(gpu, gy, xn * 4);
    size_t half = (size_t)n * channels;
    for (int c = 0; c < 2; c++) {
        gpu->conv1d_silu(gpu, gx + c * half, gw, gs, n, channels, k, gy + c * half);
        cpu->conv1d_silu(cpu, cx + c * half, cw, cs, n, channels, k, cy + c * half);
    }
    size_t big = xn > hn ? xn : hn; /* the history can be longer than the calls */
    float *a = malloc(big * 4), *b = malloc(big * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "c=%d k=%d n=%d x2", channels, k, n);
    fetch(gpu, a, gy, xn * 4);
    fetch(cpu, b, cy, xn * 4);
    report_f("conv1d_silu-cpu", shape, a, b, xn, 1e-6);
    if (hn) {
        fetch(gpu, a, gs, hn * 4);
        fetch(cpu, b, cs, hn * 4);
        report_f("conv1d-state", shape, a, b, hn, 0.0); /* the last inputs, copied */
    }
    gpu->free(gpu, gx); gpu->free(gpu, gw); gpu->free(gpu, gs); gpu->free(gpu, gy);
    cpu->free(cpu, cx); cpu->free(cpu, cw); cpu->free(cpu, cs); cpu->free(cpu, cy);
    free(x); free(w); free(st); free(a); free(b);
}

typedef struct {
    int nk, nv, dk, dv, stride, n;
    float *qkv, *alpha, *beta, *a, *dtb, *state; /* host inputs: 2n tokens */
} gdn_case;

static void gdn_make(gdn_case *g, int nk, int nv, int dk, int dv, int pad, int n, float gate_shift)
{
    g->nk = nk; g->nv = nv; g->dk = dk; g->dv = dv; g->n = n;
    g->stride = 2 * nk * dk + nv * dv + pad;
    size_t qn = (size_t)2 * n * g->stride, an = (size_t)2 * n * nv, sn = (size_t)nv * dk * dv;
    g->qkv = malloc(qn * 4); g->alpha = malloc(an * 4); g->beta = malloc(an * 4);
    g->a = malloc(nv * 4); g->dtb = malloc(nv * 4); g->state = malloc(sn * 4);
    for (size_t i = 0; i < qn; i++) g->qkv[i] = fgauss();
    for (size_t i = 0; i < an; i++) { g->alpha[i] = fgauss() * 2 + gate_shift; g->beta[i] = fgauss() * 2; }
    for (int h = 0; h < nv; h++) { g->a[h] = -expf(0.5f * fgauss()); g->dtb[h] = fgauss(); }
    for (size_t i = 0; i < sn; i++) g->state[i] = fgauss() * 0.1f;
}

static void gdn_free(gdn_case *g)
{
    free(g->qkv); free(g->alpha); free(g->beta); free(g->a); free(g->dtb); free(g->state);
}

/* Runs calls of lens[] tokens (summing to 2n) on backend be from the case's
 * initial state; host copies of all outputs and the final state. */
static void gdn_run(mr_backend *be, const gdn_case *g, const int *lens, int n_calls, float *out, float *st)
{
    size_t qn = (size_t)2 * g->n * g->stride, an = (size_t)2 * g->n * g->nv;
    size_t sn = (size_t)g->nv * g->dk * g->dv, on = (size_t)2 * g->n * g->nv * g->dv;
    float *dq = dup_to(be, g->qkv, qn * 4), *da = dup_to(be, g->alpha, an * 4), *db = dup_to(be, g->beta, an * 4);
    float *dA = dup_to(be, g->a, g->nv * 4), *dt = dup_to(be, g->dtb, g->nv * 4);
    float *ds = dup_to(be, g->state, sn * 4), *dout = dalloc(be, on * 4);
    poison(be, dout, on * 4);
    int t0 = 0;
    for (int c = 0; c < n_calls; c++) {
        be->gdn_scan(be, dq + (size_t)t0 * g->stride, g->stride, da + (size_t)t0 * g->nv, db + (size_t)t0 * g->nv,
                     dA, dt, ds, lens[c], g->nk, g->nv, g->dk, g->dv, 1e-6f, dout + (size_t)t0 * g->nv * g->dv);
        t0 += lens[c];
    }
    fetch(be, out, dout, on * 4);
    fetch(be, st, ds, sn * 4);
    be->free(be, dq); be->free(be, da); be->free(be, db); be->free(be, dA); be->free(be, dt);
    be->free(be, ds); be->free(be, dout);
}

static mr_backend *gpu_gdn1; /* MEMRA_CUDA_GDN_TILED=0: the scan token by token */
static mr_backend *gpu_gdn2; /* MEMRA_CUDA_GDN_TILED=2: tiles without the next tile's inputs fetched ahead */
static mr_backend *gpu_gdn4; /* MEMRA_CUDA_GDN_WARPS=4: blocks of at most 4 warps (other sums) */
static mr_backend *gpu_gdn4t; /* and token by token */
static mr_backend *gpu_gdnb; /* MEMRA_CUDA_GDN_LANES=0: the tiles' tokens with a barrier each */

static void check_gdn(int nk, int nv, int dk, int dv, int pad, int n, float gate_shift)
{
    gdn_case g;
    gdn_make(&g, nk, nv, dk, dv, pad, n, gate_shift);
    size_t sn = (size_t)nv * dk * dv, on = (size_t)2 * n * nv * dv;
    float *go = malloc(on * 4), *gs = malloc(sn * 4), *co = malloc(on * 4), *cs = malloc(sn * 4);
    float *go1 = malloc(on * 4), *gs1 = malloc(sn * 4);
    int two[2] = {n, n}, one[1] = {2 * n};
    gdn_run(gpu, &g, two, 2, go, gs);
    gdn_run(cpu, &g, two, 2, co, cs);
    char shape[64];
    snprintf(shape, sizeof shape, "h=%d/%d d=%d/%d n=%d x2%s%s", nk, nv, dk, dv, n, pad ? " pad" : "",
             gate_shift > 10 ? " strong" : "");
    report_f("gdn_scan-cpu", shape, go, co, on, 1e-5);
    report_f("gdn_state-cpu", shape, gs, cs, sn, 1e-5);
    /* where one call ends and the next starts changes nothing on the GPU */
    gdn_run(gpu, &g, one, 1, go1, gs1);
    report_f("gdn_scan-split", shape, go, go1, on, 0.0);
    report_f("gdn_state-split", shape, gs, gs1, sn, 0.0);
    /* the tiled kernel (default) gives the token-by-token kernel's bits */
    gdn_run(gpu_gdn1, &g, two, 2, go1, gs1);
    report_f("gdn_scan-tiled", shape, go, go1, on, 0.0);
    report_f("gdn_state-tiled", shape, gs, gs1, sn, 0.0);
    gdn_run(gpu_gdn2, &g, two, 2, go1, gs1);
    report_f("gdn_scan-nopf", shape, go, go1, on, 0.0);
    report_f("gdn_state-nopf", shape, gs, gs1, sn, 0.0);
    /* a column's partials in one warp's lanes (the default where the rows
     * a thread allow) or in the block's warps with a barrier a token: the
     * same sums in the same order */
    gdn_run(gpu_gdnb, &g, two, 2, go1, gs1);
    report_f("gdn_scan-lanes", shape, go, go1, on, 0.0);
    report_f("gdn_state-lanes", shape, gs, gs1, sn, 0.0);
    gdn_run(gpu_gdn4, &g, two, 2, go1, gs1);
    report_f("gdn_scan-w4-cpu", shape, go1, co, on, 1e-5);
    report_f("gdn_state-w4-cpu", shape, gs1, cs, sn, 1e-5);
    float *go4 = malloc(on * 4), *gs4 = malloc(sn * 4);
    gdn_run(gpu_gdn4t, &g, two, 2, go4, gs4);
    report_f("gdn_scan-w4-tiled", shape, go1, go4, on, 0.0);
    report_f("gdn_state-w4-tiled", shape, gs1, gs4, sn, 0.0);
    free(go4); free(gs4);
    free(go); free(gs); free(co); free(cs); free(go1); free(gs1);
    gdn_free(&g);
}

/* The linear-attention core (conv then scan) captured in a graph and
 * replayed gives what direct launches give, state update included. */
static void check_gdn_graph(void)
{
    if (!gpu->graph_begin) return;
    const int nk = 2, nv = 4, dk = 64, dv = 64, n = 1, k = 4;
    gdn_case g;
    gdn_make(&g, nk, nv, dk, dv, 0, n, 0.0f);
    const int C = g.stride;
    size_t hn = (size_t)(k - 1) * C, wn = (size_t)C * k, sn = (size_t)nv * dk * dv, on = (size_t)nv * dv;
    float *w = malloc(wn * 4), *h0 = malloc(hn * 4);
    for (size_t i = 0; i < wn; i++) w[i] = fgauss() * 0.5f;
    for (size_t i = 0; i < hn; i++) h0[i] = fgauss();
    float *dx = dup_to(gpu, g.qkv, (size_t)C * 4), *dw = dup_to(gpu, w, wn * 4), *dh = dup_to(gpu, h0, hn * 4);
    float *dy = dalloc(gpu, (size_t)C * 4), *da = dup_to(gpu, g.alpha, nv * 4), *db = dup_to(gpu, g.beta, nv * 4);
    float *dA = dup_to(gpu, g.a, nv * 4), *dt = dup_to(gpu, g.dtb, nv * 4), *ds = dup_to(gpu, g.state, sn * 4);
    float *dout = dalloc(gpu, on * 4);
    float *o[2], *s[2], *hh[2];
    for (int i = 0; i < 2; i++) { o[i] = malloc(on * 4); s[i] = malloc(sn * 4); hh[i] = malloc(hn * 4); }
    void *graph = NULL;
    if (gpu->graph_begin(gpu, &err)) die("graph_begin");
    gpu->conv1d_silu(gpu, dx, dw, dh, n, C, k, dy);
    gpu->gdn_scan(gpu, dy, C, da, db, dA, dt, ds, n, nk, nv, dk, dv, 1e-6f, dout);
    if (gpu->graph_end(gpu, &graph, &err)) die("graph_end");
    for (int i = 0; i < 2; i++) {
        /* the same starting state both ways */
        if (gpu->upload(gpu, dh, h0, hn * 4, &err) || gpu->upload(gpu, ds, g.state, sn * 4, &err)) die("upload");
        poison(gpu, dout, on * 4);
        if (i == 0) {
            if (gpu->graph_launch(gpu, graph, &err)) die("graph_launch");
        } else {
            gpu->conv1d_silu(gpu, dx, dw, dh, n, C, k, dy);
            gpu->gdn_scan(gpu, dy, C, da, db, dA, dt, ds, n, nk, nv, dk, dv, 1e-6f, dout);
        }
        fetch(gpu, o[i], dout, on * 4);
        fetch(gpu, s[i], ds, sn * 4);
        fetch(gpu, hh[i], dh, hn * 4);
    }
    gpu->graph_destroy(gpu, graph);
    report_f("gdn-graph", "conv1d_silu+gdn_scan replay: out", o[0], o[1], on, 0.0);
    report_f("gdn-graph", "conv1d_silu+gdn_scan replay: state", s[0], s[1], sn, 0.0);
    report_f("gdn-graph", "conv1d_silu+gdn_scan replay: conv state", hh[0], hh[1], hn, 0.0);
    gpu->free(gpu, dx); gpu->free(gpu, dw); gpu->free(gpu, dh); gpu->free(gpu, dy); gpu->free(gpu, da);
    gpu->free(gpu, db); gpu->free(gpu, dA); gpu->free(gpu, dt); gpu->free(gpu, ds); gpu->free(gpu, dout);
    for (int i = 0; i < 2; i++) { free(o[i]); free(s[i]); free(hh[i]); }
    free(w); free(h0);
    gdn_free(&g);
}

/* A batch's delta-net layer: S sequences of lens[s] tokens (one each where
 * lens is NULL: a decode batch), every one with its own convolution and
 * scan states (separate allocations, as each sequence's are), recorded as
 * the forward pass records them (for each segment its conv1d_silu, then the
 * gdn_scan of that output).  The recorder runs them as one launch of the
 * convolutions and one of the scans (mr_cu_gdn_segs) where every segment
 * has one token, else each convolution and then the scans side by side in
 * one launch (mr_cu_gdn_scan_segs); `want` segments taken
 * (fused_ops().segs).  With the rule off (MEMRA_CUDA_FUSE_SEGS=0) each pair
 * runs by itself.  Every output and
 * state must be the same bits both ways, and within the bounds of the
 * other hybrid lines of the CPU backend's ops.  share: segment 1 uses
 * segment 0's scan state (two calls on one sequence: the rule may not put
 * them in one launch). */
static void check_gdn_segs(mr_backend *on, mr_backend *off, int S, const int *lens, int nk, int nv, int dk, int dv,
                           int k, bool share, long want)
{
    const int C = 2 * nk * dk + nv * dv;
    int *t0 = malloc((size_t)S * sizeof *t0), T = 0;
    for (int s = 0; s < S; s++) {
        t0[s] = T;
        T += lens ? lens[s] : 1;
    }
    const size_t xn = (size_t)T * C, wn = (size_t)C * k, hn = (size_t)(k > 1 ? k - 1 : 1) * C;
    const size_t sn = (size_t)nv * dk * dv, an = (size_t)T * nv, on_ = (size_t)T * nv * dv;
    float *x = malloc(xn * 4), *w = malloc(wn * 4), *al = malloc(an * 4), *bt = malloc(an * 4);
    float *A = malloc(nv * 4), *dt = malloc(nv * 4);
    float **h0 = malloc(S * sizeof *h0), **s0 = malloc(S * sizeof *s0);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    for (size_t i = 0; i < wn; i++) w[i] = 0.5f * fgauss();
    for (size_t i = 0; i < an; i++) { al[i] = 2 * fgauss(); bt[i] = 2 * fgauss(); }
    for (int h = 0; h < nv; h++) { A[h] = -expf(0.5f * fgauss()); dt[h] = fgauss(); }
    for (int s = 0; s < S; s++) {
        h0[s] = malloc(hn * 4);
        s0[s] = malloc(sn * 4);
        for (size_t i = 0; i < hn; i++) h0[s][i] = fgauss();
        for (size_t i = 0; i < sn; i++) s0[s][i] = 0.1f * fgauss();
    }
    /* per backend: conv outputs, scan outputs, then each segment's two states */
    mr_backend *bes[3] = {on, off, cpu};
    float *got[3][4];
    long taken[3] = {0, 0, 0};
    for (int b = 0; b < 3; b++) {
        mr_backend *be = bes[b];
        float *dx = dup_to(be, x, xn * 4), *dw = dup_to(be, w, wn * 4), *da = dup_to(be, al, an * 4);
        float *db = dup_to(be, bt, an * 4), *dA = dup_to(be, A, nv * 4), *ddt = dup_to(be, dt, nv * 4);
        float *dy = dalloc(be, xn * 4), *dout = dalloc(be, on_ * 4);
        float **dh = malloc(S * sizeof *dh), **ds = malloc(S * sizeof *ds);
        poison(be, dy, xn * 4);
        poison(be, dout, on_ * 4);
        for (int s = 0; s < S; s++) {
            dh[s] = dup_to(be, h0[s], hn * 4);
            ds[s] = share && s == 1 ? ds[0] : dup_to(be, s0[s], sn * 4);
        }
        if (be->sync(be, &err)) die("sync");
        const long f0 = b < 2 ? fused_ops(be).segs : 0;
        for (int s = 0; s < S; s++) {
            const size_t r = (size_t)t0[s];
            const int n = lens ? lens[s] : 1;
            be->conv1d_silu(be, dx + r * C, dw, dh[s], n, C, k, dy + r * C);
            be->gdn_scan(be, dy + r * C, C, da + r * nv, db + r * nv, dA, ddt, ds[s], n, nk, nv, dk, dv, 1e-6f,
                         dout + r * nv * dv);
        }
        if (be->sync(be, &err)) die("sync");
        taken[b] = b < 2 ? fused_ops(be).segs - f0 : 0;
        got[b][0] = malloc(xn * 4);
        got[b][1] = malloc(on_ * 4);
        got[b][2] = malloc((size_t)S * hn * 4);
        got[b][3] = malloc((size_t)S * sn * 4);
        fetch(be, got[b][0], dy, xn * 4);
        fetch(be, got[b][1], dout, on_ * 4);
        for (int s = 0; s < S; s++) {
            fetch(be, got[b][2] + (size_t)s * hn, dh[s], hn * 4);
            fetch(be, got[b][3] + (size_t)s * sn, ds[s], sn * 4);
        }
        for (int s = 0; s < S; s++) {
            be->free(be, dh[s]);
            if (!(share && s == 1)) be->free(be, ds[s]);
        }
        free(dh); free(ds);
        be->free(be, dx); be->free(be, dw); be->free(be, da); be->free(be, db); be->free(be, dA);
        be->free(be, ddt); be->free(be, dy); be->free(be, dout);
    }
    char shape[96];
    snprintf(shape, sizeof shape, "S=%d T=%d h=%d/%d d=%d/%d k=%d%s", S, T, nk, nv, dk, dv, k, share ? " shared" : "");
    const size_t hs = k > 1 ? (size_t)S * hn : 0; /* one tap: no state to compare */
    size_t diff = floats_differ(got[0][0], got[1][0], xn) + floats_differ(got[0][1], got[1][1], on_) +
                  floats_differ(got[0][2], got[1][2], hs) + floats_differ(got[0][3], got[1][3], (size_t)S * sn);
    report("gdn_segs-vs-apart", shape, (double)diff, 0, 0.0); /* values that differ in any bit */
    report_f("gdn_segs-conv-cpu", shape, got[0][0], got[2][0], xn, 1e-5);
    report_f("gdn_segs-scan-cpu", shape, got[0][1], got[2][1], on_, 1e-5);
    if (hs) report_f("gdn_segs-convstate-cpu", shape, got[0][2], got[2][2], hs, 0.0); /* copies */
    report_f("gdn_segs-state-cpu", shape, got[0][3], got[2][3], (size_t)S * sn, 1e-5);
    report("gdn_segs-taken", shape, (double)labs(taken[0] - want) + (double)labs(taken[1]), 0, 0.0);
    for (int b = 0; b < 3; b++)
        for (int q = 0; q < 4; q++) free(got[b][q]);
    for (int s = 0; s < S; s++) { free(h0[s]); free(s0[s]); }
    free(h0); free(s0); free(x); free(w); free(al); free(bt); free(A); free(dt); free(t0);
}

static void check_gdn_segs_all(void)
{
    mr_backend *off = backend_with("MEMRA_CUDA_FUSE_SEGS", "0");
    check_gdn_segs(gpu, off, 16, NULL, 16, 32, 128, 128, 4, false, 16); /* the 35B-A3B, a batch of 16 */
    check_gdn_segs(gpu, off, 2, NULL, 16, 32, 128, 128, 4, false, 2);
    check_gdn_segs(gpu, off, 70, NULL, 16, 32, 128, 128, 4, false, 70); /* two launches of each: 64 + 6 */
    check_gdn_segs(gpu, off, 5, NULL, 2, 4, 64, 64, 4, false, 5);       /* the fixtures */
    check_gdn_segs(gpu, off, 3, NULL, 2, 2, 256, 96, 3, false, 3);      /* 32 rows a thread, partial column tiles */
    check_gdn_segs(gpu, off, 4, NULL, 2, 4, 16, 8, 1, false, 4);        /* one tap: no convolution state */
    check_gdn_segs(gpu, off, 6, NULL, 2, 4, 64, 64, 4, true, 5);        /* 0 and 1 one state: 0 alone, then 1-5 */
    check_gdn_segs(gpu, off, 3, NULL, 2, 4, 64, 64, 5, false, 0);       /* more taps than the kernel keeps */
    check_gdn_segs(gpu, off, 1, NULL, 16, 32, 128, 128, 4, false, 0);   /* one sequence: its own launches */
    /* prompt chunks of several sequences, and prompts beside decode tokens:
     * the scans side by side on the tiled kernel (with the next tile's
     * inputs fetched ahead, and without: MEMRA_CUDA_GDN_TILED=2) */
    const int mixed[] = {512, 300, 1, 1, 200}, small[] = {7, 1, 33, 16, 17, 2};
    check_gdn_segs(gpu, off, 5, mixed, 16, 32, 128, 128, 4, false, 5);
    check_gdn_segs(gpu, off, 6, small, 2, 4, 64, 64, 4, false, 6);
    check_gdn_segs(gpu, off, 6, small, 2, 4, 64, 64, 4, true, 5);
    check_gdn_segs(gpu, off, 6, small, 2, 2, 256, 96, 3, false, 6);
    int many[70];
    for (int s = 0; s < 70; s++) many[s] = 1 + s % 5;
    check_gdn_segs(gpu, off, 70, many, 2, 4, 64, 64, 4, false, 70);
    mr_backend *on2 = backend_with("MEMRA_CUDA_GDN_TILED", "2");
    mr_backend *off2 = backend_with2("MEMRA_CUDA_GDN_TILED", "2", "MEMRA_CUDA_FUSE_SEGS", "0");
    check_gdn_segs(on2, off2, 5, mixed, 16, 32, 128, 128, 4, false, 5);
    check_gdn_segs(on2, off2, 6, small, 2, 4, 64, 64, 4, false, 6);
    /* the tiles' tokens with a barrier each, against the lane groups */
    mr_backend *onb = backend_with("MEMRA_CUDA_GDN_LANES", "0");
    check_gdn_segs(onb, off, 5, mixed, 16, 32, 128, 128, 4, false, 5);
    check_gdn_segs(onb, off, 6, small, 2, 4, 64, 64, 4, false, 6);
    onb->destroy(onb);
    on2->destroy(on2);
    off2->destroy(off2);
    off->destroy(off);
}

static void check_hybrid_ops(void)
{
    if (!gpu->copy_2d || !gpu->sigmoid_mul || !gpu->conv1d_silu || !gpu->gdn_scan) {
        report("hybrid-ops", "copy_2d/sigmoid_mul/conv1d_silu/gdn_scan missing", 1.0, 0, 0.0);
        return;
    }
    /* query half of [q | gate] per head; the MTP [e | h] concatenation; a
     * second-half source */
    check_copy_2d(7 * 4, 64, 64, 128, 0);
    check_copy_2d(5, 256, 512, 256, 0);
    check_copy_2d(3, 2048, 4096, 2048, 0);
    check_copy_2d(9, 100, 130, 256, 7);
    /* attention output gate (per element), shared-expert gate (per row) */
    check_sigmoid_mul(7 * 4, 64, 128, 64, false);
    check_sigmoid_mul(1 * 16, 256, 512, 256, false);
    check_sigmoid_mul(7, 256, 1, 0, true);
    check_sigmoid_mul(64, 2048, 1, 0, true);
    check_sigmoid_mul(3, 1000, 1000, 0, false);
    /* the fixtures' conv (2 key heads, 4 value heads of 64: 512 channels),
     * the 35B-A3B's (16 + 16 key heads and 32 value heads of 128: 8192) */
    int ns[3] = {1, 7, 64};
    for (int i = 0; i < 3; i++) {
        check_conv1d(512, 4, ns[i]);
        check_conv1d(8192, 4, ns[i]);
    }
    check_conv1d(37, 3, 5);
    check_conv1d(100, 1, 3);
    check_conv1d(64, 6, 2); /* history longer than a call */
    for (int i = 0; i < 3; i++) {
        check_gdn(2, 4, 64, 64, 0, ns[i], 0.0f);   /* the fixtures */
        check_gdn(16, 32, 128, 128, 0, ns[i], 0.0f); /* Qwen3.6-35B-A3B */
    }
    check_gdn(16, 32, 128, 128, 0, 100, 0.0f); /* tiles of 16 tokens and a partial one, x2 calls */
    check_gdn(1, 3, 48, 40, 5, 7, 0.0f);    /* partial tiles, padded rows */
    check_gdn(2, 2, 256, 96, 0, 7, 0.0f);   /* more warps over the rows */
    check_gdn(2, 4, 16, 8, 3, 9, 0.0f);     /* tiny heads */
    check_gdn(1, 2, 8, 40, 0, 9, 0.0f);     /* two warps over the rows */
    check_gdn(1, 2, 4, 8, 1, 5, 0.0f);      /* one warp */
    check_gdn(2, 4, 64, 64, 0, 7, 25.0f);   /* softplus linear branch: state nearly cleared */
    check_gdn_graph();
    check_gdn_segs_all();
}

/* ---- int8-activation matvec (MEMRA_CUDA_MATVEC=q8) ----
 * The q8 backends quantize each activation row in blocks of 32 and multiply
 * the int8 values with the packed weights.  Two references:
 *  (a) W times x-hat, x-hat the activations quantized here from the
 *      definition (below), W decoded by common/quant.c, in float64: the
 *      kernels' integer sums are exact, so only float rounding of the
 *      scaling and summation order remain: bound 1e-5;
 *  (b) W times x itself (what the float kernels compute): the numerical
 *      cost of int8 activations, printed.  Per element x - x-hat is uniform
 *      in +-d/2, d = absmax/127 of its block, so a product's relative error
 *      is about d/sqrt(12)/sigma; for Gaussian blocks of 32 the absmax is
 *      ~2.0-2.1 sigma: ~4.7e-3.  Bound 2e-2 (4x).
 * Types and shapes the kernels do not take (not a multiple of 256 columns,
 * other types) run the float kernels: checked against (b) at 2e-5.
 *
 * The matvec with 22-bit integer activations (MEMRA_CUDA_MATVEC=x24all,
 * backend "-x24": Q4_K, Q6_K, IQ4_XS and Q8_0 plain products) is checked the
 * same way with its own quantization (absmax / (2^21 - 1) per 32): (a) at
 * 1e-5, (b) at the float kernels' own bound, 2e-5 (expected ~3e-7:
 * d/sqrt(12)/sigma with d 16,500 times smaller than int8's).  "flat x"
 * lines: every input 1, so every q is 2^21 - 1 and a 32-column IQ4_XS or
 * Q8_0 unit's sum q * sum(w) passes 2^31 wherever |sum(w)| > 1024 (~1.5% of
 * the units of random blocks): the sums that must not be formed in
 * int32. */
#define N_Q8 4
#define Q8_X24 3 /* the index of the x24 backend */
static mr_backend *q8_be[N_Q8]; /* q8: default rows per block, forced 4, forced 2; x24 */
static const char *q8_name[N_Q8] = {"-q8", "-q8r4", "-q8r2", "-x24"};

static int q8_handles(int bi, int type, int64_t cols, bool experts)
{
    if (bi == Q8_X24) /* plain products, any token count */
        return cols % 256 == 0 && cols <= 13312 && !experts &&
               (type == MR_TYPE_Q4_K || type == MR_TYPE_Q6_K || type == MR_TYPE_IQ4_XS || type == MR_TYPE_Q8_0);
    return cols % 256 == 0 && (type == MR_TYPE_Q4_K || type == MR_TYPE_Q5_K || type == MR_TYPE_Q6_K ||
                               type == MR_TYPE_Q8_0 || type == MR_TYPE_Q4_0 || type == MR_TYPE_IQ4_XS);
}

/* The activation quantization, from its definition: per block of 32,
 * d = absmax / 127 and q = x * (127 / absmax) rounded to the nearest
 * integer, ties to even (both quotients and the product rounded to float
 * once, as the kernel does); x-hat = d * q.  A block with a NaN or an
 * infinity is all NaN. */
static void q8_ref_quant_to(const float *x, size_t n, double *xh, float qmax)
{
    for (size_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(x[b + i]);
            if (!isfinite(a)) bad = 1;
            else if (a > amax) amax = a;
        }
        float d = amax / qmax, iv = amax > 0.0f ? qmax / amax : 0.0f;
        for (int i = 0; i < 32; i++) {
            float p = x[b + i] * iv;
            long q = lrintf(p); /* the default rounding mode: nearest, ties to even */
            if (q > (long)qmax) q = (long)qmax;
            if (q < -(long)qmax) q = -(long)qmax;
            xh[b + i] = bad ? NAN : (double)d * (double)q;
        }
    }
}

static void q8_ref_quant(const float *x, size_t n, double *xh) { q8_ref_quant_to(x, n, xh, 127.0f); }

/* rq[t][r] = row r of matrix `mat` times x-hat row xrow + t, rf[t][r] the
 * same with x itself, for every row r and nt rows of x, in float64; rf NULL:
 * rq only. */
static void q8_refs(const tdesc *td, const uint8_t *host, size_t rb, int64_t cols, int64_t rows,
                    const float *x, const double *xh, int64_t xrow, int nt, size_t mat, double *rq,
                    double *rf)
{
    float *wr = malloc(cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        deq_row(td, host + (mat * rows + r) * rb, cols, wr);
        for (int t = 0; t < nt; t++) {
            const float *xv = x + (xrow + t) * cols;
            const double *hv = xh + (xrow + t) * cols;
            double a = 0, b = 0;
            for (int64_t c = 0; c < cols; c++) a += (double)wr[c] * hv[c];
            rq[t * rows + r] = a;
            if (!rf)
                continue;
            for (int64_t c = 0; c < cols; c++) b += (double)wr[c] * xv[c];
            rf[t * rows + r] = b;
        }
    }
    free(wr);
}

/* mats matrices of rows x cols blocks of type td from host, loaded on be. */
static void load_weight(mr_backend *be, const tdesc *td, const uint8_t *host, int64_t cols, int64_t rows,
                        int64_t mats, mr_weight *w)
{
    *w = (mr_weight){td->name, td->type, cols, rows, mats, (size_t)(cols / td->be) * td->bb, NULL, NULL};
    if (be->weight_load(be, w, host, &err)) die("weight_load");
}

/* y (n x rows) = be->matmul of the rows x cols matrix host (type td) and
 * the n rows of x, the output poisoned first. */
static void matmul_host(mr_backend *be, const tdesc *td, const uint8_t *host, int64_t cols, int64_t rows,
                        const float *x, int n, float *y)
{
    const size_t xn = (size_t)n * cols, yn = (size_t)n * rows;
    mr_weight w;
    load_weight(be, td, host, cols, rows, 1, &w);
    float *dx = dup_to(be, x, xn * 4), *dy = dalloc(be, yn * 4);
    poison(be, dy, yn * 4);
    be->matmul(be, &w, dx, dy, n);
    fetch(be, y, dy, yn * 4);
    be->free(be, dx);
    be->free(be, dy);
    be->weight_release(be, &w);
}

/* op: the row label; cost: the label of the line against float32 x */
static void q8_report(int bi, const char *op, const char *cost, const char *shape, int handled,
                      const float *y, const double *rq, const double *rf, size_t n)
{
    char nm[32];
    snprintf(nm, sizeof nm, "%s%s", op, q8_name[bi]);
    if (!handled) { /* the float kernels */
        report_rel(nm, shape, y, rf, n, 2e-5);
        return;
    }
    report_rel(nm, shape, y, rq, n, 1e-5);
    if (bi == 0)
        report_rel(cost, shape, y, rf, n, 2e-2);
    if (bi == Q8_X24) {
        report_rel(strncmp(cost, "mmid", 4) ? "mm-x24-cost" : "mmid-x24-cost", shape, y, rf, n, 2e-5);
    }
}

/* y = W x with int8 activations, n <= 64 tokens (matvec path); flat: x
 * all ones instead of Gaussian. */
static void check_q8_x(const tdesc *td, int64_t cols, int64_t rows, int n, bool flat)
{
    size_t rb = (size_t)(cols / td->be) * td->bb, xn = (size_t)n * cols, yn = (size_t)n * rows;
    uint8_t *host = malloc(rb * rows);
    rand_blocks(td, host, rb * rows / td->bb);
    float *x = malloc(xn * 4), *y = malloc(yn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = flat ? 1.0f : fgauss();
    double *xh = malloc(xn * 8), *rq = malloc(yn * 8), *rf = malloc(yn * 8), *rq24 = malloc(yn * 8);
    q8_ref_quant(x, xn, xh);
    q8_refs(td, host, rb, cols, rows, x, xh, 0, n, 0, rq, rf);
    q8_ref_quant_to(x, xn, xh, 2097151.0f);
    q8_refs(td, host, rb, cols, rows, x, xh, 0, n, 0, rq24, NULL);
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d%s", td->name, (long long)rows, (long long)cols, n,
             flat ? " flat x" : "");
    for (int bi = 0; bi < N_Q8; bi++) {
        matmul_host(q8_be[bi], td, host, cols, rows, x, n, y);
        q8_report(bi, "matmul", "mm-q8-cost", shape, q8_handles(bi, td->type, cols, false), y,
                  bi == Q8_X24 ? rq24 : rq, rf, yn);
    }
    free(host); free(x); free(y); free(xh); free(rq); free(rf); free(rq24);
}

static void check_q8(const tdesc *td, int64_t cols, int64_t rows, int n) { check_q8_x(td, cols, rows, n, false); }

/* Expert products with int8 activations.  bad_id: the second pair names
 * expert `mats` (out of range): its rows must come out NaN, the others as
 * usual. */
static void check_q8_id(const tdesc *td, int64_t cols, int64_t rows, int mats, int k, int xs, int n,
                        int bad_id)
{
    size_t rb = (size_t)(cols / td->be) * td->bb, xn = (size_t)n * xs * cols, yn = (size_t)n * k * rows;
    uint8_t *host = malloc(rb * rows * mats);
    rand_blocks(td, host, rb * rows * mats / td->bb);
    float *x = malloc(xn * 4), *y = malloc(yn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    int32_t *ids = malloc((size_t)n * k * 4);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) ids[t * k + j] = (int32_t)((t * 7 + j * 3 + (int)(rnd() % 2)) % mats);
    const int badp = bad_id && n * k > 1 ? 1 : -1; /* the pair with the bad id */
    if (badp >= 0) ids[badp] = mats;
    double *xh = malloc(xn * 8), *rq = malloc(yn * 8), *rf = malloc(yn * 8), *rq24 = malloc(yn * 8);
    for (int pass = 0; pass < 2; pass++) {
        q8_ref_quant_to(x, xn, xh, pass ? 2097151.0f : 127.0f);
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++) {
                size_t p = (size_t)t * k + j;
                if ((int)p == badp) continue;
                q8_refs(td, host, rb, cols, rows, x, xh, (int64_t)t * xs + (xs > 1 ? j : 0), 1,
                        (size_t)ids[p], (pass ? rq24 : rq) + p * rows, pass ? NULL : rf + p * rows);
            }
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s %dx%lldx%lld k=%d xs=%d n=%d%s", td->name, mats, (long long)rows,
             (long long)cols, k, xs, n, badp >= 0 ? " bad id" : "");
    /* compared without the bad pair's rows (moved to the end) */
    size_t cn = badp >= 0 ? yn - (size_t)rows : yn;
    if (badp >= 0) {
        memmove(rq + badp * rows, rq + (badp + 1) * rows, (yn - (badp + 1) * rows) * 8);
        memmove(rq24 + badp * rows, rq24 + (badp + 1) * rows, (yn - (badp + 1) * rows) * 8);
        memmove(rf + badp * rows, rf + (badp + 1) * rows, (yn - (badp + 1) * rows) * 8);
    }
    for (int bi = 0; bi < N_Q8; bi++) {
        mr_backend *be = q8_be[bi];
        mr_weight w;
        load_weight(be, td, host, cols, rows, mats, &w);
        float *dx = dup_to(be, x, xn * 4), *dy = dalloc(be, yn * 4);
        int32_t *dids = dup_to(be, ids, (size_t)n * k * 4);
        poison(be, dy, yn * 4);
        be->matmul_id(be, &w, dx, xs, dids, k, dy, n);
        fetch(be, y, dy, yn * 4);
        if (badp >= 0) {
            /* the bad pair's rows: NaN written over the poison is NaN too,
             * so this checks the value, and the others that no NaN leaked */
            int notnan = 0;
            for (int64_t r = 0; r < rows; r++) notnan += !isnan(y[badp * rows + r]);
            char nm[32];
            snprintf(nm, sizeof nm, "matmul_id%s", q8_name[bi]);
            report(nm, "out-of-range expert id: NaN rows", (double)notnan, 0, 0.0);
            memmove(y + badp * rows, y + (badp + 1) * rows, (yn - (badp + 1) * rows) * 4);
        }
        q8_report(bi, "matmul_id", "mmid-q8-cost", shape, q8_handles(bi, td->type, cols, true), y,
                  bi == Q8_X24 ? rq24 : rq, rf, cn);
        be->free(be, dx);
        be->free(be, dy);
        be->free(be, dids);
        be->weight_release(be, &w);
    }
    free(host); free(x); free(y); free(ids); free(xh); free(rq); free(rf); free(rq24);
}

static void check_q8_all(void)
{
    /* every type at small shapes: the q8 types through the int8 kernels
     * (partial last steps: 256 and 768 columns), the others through the
     * float kernels */
    for (int i = 0; i < N_TYPES; i++) {
        const tdesc *td = &TYPES[i];
        check_q8(td, 512, 67, 1);
        check_q8(td, 256, 130, 8);
        check_q8(td, 768, 96, 3);
        check_q8_id(td, 256, 64, 4, 2, 2, 3, 0);
    }
    check_q8(td_of(MR_TYPE_Q8_0), 96, 40, 2); /* not a whole number of steps: float kernels */
    int q8t[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_Q5_K, MR_TYPE_Q4_0, MR_TYPE_IQ4_XS};
    for (size_t b = 0; b < sizeof q8t / sizeof q8t[0]; b++) {
        const tdesc *td = td_of(q8t[b]);
        for (int n = 1; n <= 8; n++) check_q8(td, 4096, 1024, n);
        check_q8(td, 4096, 4096, 1);
        check_q8(td, 4096, 4096, 2);
        check_q8(td, 4096, 4096, 5);
        check_q8(td, 4096, 4096, 8);
        check_q8(td, 12288, 4096, 1);
        check_q8(td, 12288, 4096, 8);
        check_q8(td, 1280, 96, 21); /* a decode batch: 8 + 8 + 5 tokens */
        check_q8_id(td, 2048, 768, 16, 8, 1, 1, 1);
        check_q8_id(td, 768, 2048, 16, 8, 8, 1, 0);
        check_q8_id(td, 2048, 768, 16, 8, 1, 16, 0);
        check_q8_id(td, 4096, 1024, 4, 2, 2, 3, 1);
    }
    /* sums past 2^31 (flat x), on every type the 22-bit kernel takes */
    const int x24t[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_IQ4_XS, MR_TYPE_Q8_0};
    for (size_t b = 0; b < sizeof x24t / sizeof x24t[0]; b++) {
        check_q8_x(td_of(x24t[b]), 4096, 1024, 1, true);
        check_q8_x(td_of(x24t[b]), 2048, 512, 3, true);
    }
    /* the hybrids' shapes: Qwen3.6-35B-A3B (IQ4_XS: the 8192 x 2048
     * projection, experts 256 x 512 x 2048 gate/up and 256 x 2048 x 512 down
     * at k = 8) and Qwen3.5-9B (Q8_0: gate/up 12288 x 4096) */
    const tdesc *iq = td_of(MR_TYPE_IQ4_XS), *q80 = td_of(MR_TYPE_Q8_0);
    check_q8(iq, 2048, 8192, 1);
    check_q8(iq, 2048, 8192, 2);
    check_q8_id(iq, 2048, 512, 256, 8, 1, 1, 0);
    check_q8_id(iq, 2048, 512, 256, 8, 1, 4, 0);
    check_q8_id(iq, 512, 2048, 256, 8, 8, 1, 0);
    check_q8_id(iq, 512, 2048, 256, 8, 8, 5, 1);
    check_q8(q80, 4096, 12288, 1);
    check_q8(q80, 4096, 12288, 2);
}

/* ---- batch invariance: a row's product alone and among others ----
 * DESIGN.md's numerics rule: a request's tokens do not depend on its
 * batchmates.  The forward pass keeps a step's decode rows in products of
 * fewer than batch_variant_rows rows; below that, the default backend must
 * give every row the same bits whether it is multiplied alone (n = 1, what
 * a lone request's step runs) or with others in one call.  Plain products
 * at n = 2..21 (2..64 on the tensor-core path) and expert products at n =
 * 2..5 (the grouped decode-batch path) against n = 1 calls, bit for bit. */
static const int bi_ns[] = {2, 3, 4, 5, 8, 16, 21}; /* 16, 21: decode batches of several launches, or one */

/* ns[0 .. nn - 1]: the token counts to compare with one token (bi_ns when
 * ns is NULL); at most 64 (the largest decode call). */
static void check_batch_invariance_ns(mr_backend *be, const char *label, const tdesc *td, int64_t cols,
                                      int64_t rows, int mats, int k, const int *ns, int nn)
{
    if (!ns) {
        ns = bi_ns;
        nn = (int)(sizeof bi_ns / sizeof bi_ns[0]);
    }
    int nmax = 1;
    for (int q = 0; q < nn; q++)
        if (ns[q] > nmax) nmax = ns[q];
    const size_t rb = (size_t)(cols / td->be) * td->bb;
    uint8_t *host = malloc(rb * rows * mats);
    rand_blocks(td, host, rb * rows * mats / td->bb);
    const int xs = mats > 1 ? k : 1; /* expert products: one input row a pair (as the down product) */
    const size_t xn = (size_t)nmax * xs * cols, yr = (size_t)(mats > 1 ? k : 1) * rows, yn = nmax * yr;
    float *x = malloc(xn * 4), *y1 = malloc(yn * 4), *yb = malloc(yn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    int32_t ids[64 * 8] = {0};
    for (int i = 0; i < nmax * k; i++) ids[i] = (int32_t)((i * 5 + (int)(rnd() % 3)) % mats);
    mr_weight w;
    load_weight(be, td, host, cols, rows, mats, &w);
    float *dx = dup_to(be, x, xn * 4), *dy = dalloc(be, yn * 4);
    int32_t *dids = mats > 1 ? dup_to(be, ids, sizeof ids) : NULL;
    poison(be, dy, yn * 4);
    for (int t = 0; t < nmax; t++) { /* alone */
        if (mats > 1)
            be->matmul_id(be, &w, dx + (size_t)t * xs * cols, xs, dids + t * k, k, dy + t * yr, 1);
        else
            be->matmul(be, &w, dx + (size_t)t * cols, dy + t * yr, 1);
    }
    fetch(be, y1, dy, yn * 4);
    for (int q = 0; q < nn; q++) {
        const int n = ns[q];
        if (mats > 1 && n > 5)
            continue;
        poison(be, dy, yn * 4);
        if (mats > 1)
            be->matmul_id(be, &w, dx, xs, dids, k, dy, n);
        else
            be->matmul(be, &w, dx, dy, n);
        fetch(be, yb, dy, (size_t)n * yr * 4);
        size_t diff = 0;
        int nan = 0;
        for (size_t i = 0; i < (size_t)n * yr; i++) {
            diff += memcmp(&yb[i], &y1[i], 4) != 0;
            nan += isnan(yb[i]);
        }
        char shape[96];
        if (mats > 1)
            snprintf(shape, sizeof shape, "%s %dx%lldx%lld k=%d n=%d vs n=1", td->name, mats, (long long)rows,
                     (long long)cols, k, n);
        else
            snprintf(shape, sizeof shape, "%s %lldx%lld n=%d vs n=1", td->name, (long long)rows, (long long)cols, n);
        report(label, shape, (double)diff, nan, 0.0);
    }
    be->free(be, dx);
    be->free(be, dy);
    if (dids) be->free(be, dids);
    be->weight_release(be, &w);
    free(host); free(x); free(y1); free(yb);
}

static void check_batch_invariance_one(mr_backend *be, const char *label, const tdesc *td, int64_t cols,
                                       int64_t rows, int mats, int k)
{
    check_batch_invariance_ns(be, label, td, cols, rows, mats, k, NULL, 0);
}

/* A backend with the 22-bit kernel on every shape it takes
 * (MEMRA_CUDA_MATVEC=x24all) and one more switch var=val. */
static mr_backend *x24_backend(const char *var, const char *val)
{
    setenv("MEMRA_CUDA_MATVEC", "x24all", 1);
    mr_backend *be = backend_with(var, val);
    unsetenv("MEMRA_CUDA_MATVEC");
    return be;
}

/* MEMRA_CUDA_X24_PRE=1 (inputs quantized once by their own kernel) against
 * the default x24 path (each block quantizes into shared memory): the same
 * quantized values meet the same sums, so the same bits. */
static void check_x24_pre(mr_backend *pre, const tdesc *td, int64_t cols, int64_t rows, int n)
{
    mr_backend *be[2] = {q8_be[Q8_X24], pre};
    const size_t rb = (size_t)(cols / td->be) * td->bb, xn = (size_t)n * cols, yn = (size_t)n * rows;
    uint8_t *host = malloc(rb * rows);
    rand_blocks(td, host, rb * rows / td->bb);
    float *x = malloc(xn * 4), *y[2] = {malloc(yn * 4), malloc(yn * 4)};
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    for (int b = 0; b < 2; b++) matmul_host(be[b], td, host, cols, rows, x, n, y[b]);
    size_t diff = 0;
    int nan = 0;
    for (size_t i = 0; i < yn; i++) {
        diff += memcmp(&y[0][i], &y[1][i], 4) != 0;
        nan += isnan(y[1][i]);
    }
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d", td->name, (long long)rows, (long long)cols, n);
    report("x24-pre-vs-smem", shape, (double)diff, nan, 0.0);
    free(host); free(x); free(y[0]); free(y[1]);
}

/* Three matrices of type td over one input recorded back to back on be (the
 * recorder shares one launch: sub-matrices, rows r0 + r1 + r2) against the
 * same calls one at a time, bit for bit, at n tokens; saved: the launches
 * the recorder must save (2: one launch; 1: the last two share one, where
 * the first takes another kernel by its shape). */
static void check_multi_vs_one(mr_backend *be, const char *label, const tdesc *td, int64_t r0, int64_t r1,
                               int64_t r2, int64_t cols, int n, long saved);
static void check_x24_multi(mr_backend *be, const tdesc *td, int64_t r0, int64_t r1, int64_t r2, int64_t cols,
                            int n)
{
    check_multi_vs_one(be, "x24mma", td, r0, r1, r2, cols, n, 2);
}

/* The same for any backend; labels label-multi-vs-one and label-multi-launches. */
static void check_multi_vs_one(mr_backend *be, const char *label, const tdesc *td, int64_t r0, int64_t r1,
                               int64_t r2, int64_t cols, int n, long saved)
{
    const int64_t rows[3] = {r0, r1, r2};
    const size_t rb = (size_t)(cols / td->be) * td->bb, xn = (size_t)n * cols;
    float *x = malloc(xn * 4);
    for (size_t i = 0; i < xn; i++) x[i] = fgauss();
    float *dx = dup_to(be, x, xn * 4), *dy[3], *dz[3];
    mr_weight w[3];
    uint8_t *host[3];
    for (int s = 0; s < 3; s++) {
        host[s] = malloc(rb * rows[s]);
        rand_blocks(td, host[s], rb * rows[s] / td->bb);
        load_weight(be, td, host[s], cols, rows[s], 1, &w[s]);
        dy[s] = dalloc(be, (size_t)n * rows[s] * 4);
        dz[s] = dalloc(be, (size_t)n * rows[s] * 4);
        poison(be, dy[s], (size_t)n * rows[s] * 4);
        poison(be, dz[s], (size_t)n * rows[s] * 4);
    }
    const long f0 = fused_ops(be).mv;
    for (int s = 0; s < 3; s++) be->matmul(be, &w[s], dx, dy[s], n); /* one launch */
    if (be->sync(be, &err)) die("sync");
    const long fused = fused_ops(be).mv - f0;
    for (int s = 0; s < 3; s++) { /* one at a time */
        be->matmul(be, &w[s], dx, dz[s], n);
        if (be->sync(be, &err)) die("sync");
    }
    size_t diff = 0;
    int nan = 0;
    for (int s = 0; s < 3; s++) {
        const size_t yn = (size_t)n * rows[s];
        float *y = malloc(yn * 4), *z = malloc(yn * 4);
        fetch(be, y, dy[s], yn * 4);
        fetch(be, z, dz[s], yn * 4);
        for (size_t i = 0; i < yn; i++) {
            diff += memcmp(&y[i], &z[i], 4) != 0;
            nan += isnan(y[i]);
        }
        free(y); free(z);
        be->free(be, dy[s]);
        be->free(be, dz[s]);
        be->weight_release(be, &w[s]);
        free(host[s]);
    }
    be->free(be, dx);
    free(x);
    char shape[96];
    snprintf(shape, sizeof shape, "%s 3x(%lld,%lld,%lld)x%lld n=%d", td->name, (long long)r0, (long long)r1,
             (long long)r2, (long long)cols, n);
    char lab[64];
    snprintf(lab, sizeof lab, "%s-multi-vs-one", label);
    report(lab, shape, (double)diff, nan, 0.0);
    snprintf(lab, sizeof lab, "%s-multi-launches", label);
    report(lab, shape, (double)labs(fused - saved), 0, 0.0);
}

/* The Q4_K float kernel's rows (2048 x 1001 and 4096 x 2048) against the
 * batches' launches with env set to each of vals (labels tag + value). */
static void check_wide_env(const char *env, const char *const *vals, size_t nv, const char *tag)
{
    for (size_t i = 0; i < nv; i++) {
        mr_backend *be = backend_with(env, vals[i]);
        char lab[32];
        snprintf(lab, sizeof lab, "%s%s", tag, vals[i]);
        check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 2048, 1001, 1, 1);
        check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 2048, 1, 1);
        be->destroy(be);
    }
}

/* One token's rows a block of the Q4_K float kernel by the shape (4 at
 * 2048 columns, 2 or 1 past): a row count not a multiple of 4, and the
 * counts forced (MEMRA_CUDA_WIDE_R), each against the batches' launches;
 * the batches' 16 tokens a launch at one row a block (the default: two)
 * and 8 a launch (MEMRA_CUDA_WIDE16=0, the path before), and 8 a launch
 * at two rows a block (the default: four). */
static void check_wide_rows(void)
{
    check_batch_invariance_one(gpu, "batch-inv", td_of(MR_TYPE_Q4_K), 2048, 1001, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv", td_of(MR_TYPE_Q4_K), 2048, 4608, 1, 1);
    static const char *const wrs[] = {"1", "2", "4", "8"}, *const w16[] = {"1", "0"}, *const w8[] = {"2"};
    check_wide_env("MEMRA_CUDA_WIDE_R", wrs, sizeof wrs / sizeof wrs[0], "batch-inv-wr");
    check_wide_env("MEMRA_CUDA_WIDE16", w16, sizeof w16 / sizeof w16[0], "batch-inv-w16-");
    /* eight-token launches at two rows a block (MEMRA_CUDA_WIDE8=2; the
     * default: four) */
    check_wide_env("MEMRA_CUDA_WIDE8", w8, sizeof w8 / sizeof w8[0], "batch-inv-w8r");
    /* the float32 and bfloat16 routers' decode batches, 8 tokens a launch,
     * their chunks of 8 one launch's jobs (Q6_K rows of at most 2,048
     * columns too: the 30B-A3B's v), and with MEMRA_CUDA_FAST8_JOBS=0 a
     * launch a chunk */
    check_batch_invariance_one(gpu, "batch-inv-f8", td_of(MR_TYPE_F32), 2048, 128, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv-f8", td_of(MR_TYPE_BF16), 2048, 128, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv-f8", td_of(MR_TYPE_Q6_K), 2048, 512, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv-f8", td_of(MR_TYPE_Q6_K), 1024, 1001, 1, 1);
    mr_backend *apart = backend_with("MEMRA_CUDA_FAST8_JOBS", "0");
    check_batch_invariance_one(apart, "batch-inv-f8a", td_of(MR_TYPE_F32), 2048, 128, 1, 1);
    check_batch_invariance_one(apart, "batch-inv-f8a", td_of(MR_TYPE_Q6_K), 2048, 512, 1, 1);
    apart->destroy(apart);
}

/* One token's plain Q4_K products load their first weights before the
 * PDL wait (the default; MEMRA_CUDA_EARLY=0: after it).  The same step
 * sums in the same order, so with it on and off a row's bits are those of
 * the batches' launches at every rows-a-block count (forced with
 * MEMRA_CUDA_WIDE_R), k_fast's types beside them are untouched by the
 * switch, and three matrices sharing a launch (q/k/v) give what they give
 * one at a time. */
/* One token's Q4_K rows on be against the batches' launches at the q, o,
 * 8B and odd-row shapes (the lines every one-token Q4_K switch runs). */
static void check_q4k_one_token(mr_backend *be, const char *lab)
{
    check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 2048, 1001, 1, 1);
    check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 2048, 4096, 1, 1);
    check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 2048, 1, 1);
    check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 4096, 1, 1);
}

static void check_early_weights(void)
{
    const char *ews[] = {"1", "0"};
    const char *wrs[] = {"0", "1", "2", "4", "8"};
    for (size_t e = 0; e < 2; e++)
        for (size_t i = 0; i < sizeof wrs / sizeof wrs[0]; i++) {
            mr_backend *be = backend_with2("MEMRA_CUDA_EARLY", ews[e], "MEMRA_CUDA_WIDE_R", wrs[i]);
            char lab[40];
            snprintf(lab, sizeof lab, "early%s-batch-inv-wr%s", ews[e], wrs[i]);
            check_q4k_one_token(be, lab);
            if (!strcmp(wrs[i], "0")) {
                const int ft[] = {MR_TYPE_Q6_K, MR_TYPE_IQ4_XS, MR_TYPE_F32, MR_TYPE_Q8_0, MR_TYPE_Q5_K,
                                  MR_TYPE_Q4_0, MR_TYPE_BF16};
                for (size_t t = 0; t < sizeof ft / sizeof ft[0]; t++) {
                    check_batch_invariance_one(be, lab, td_of(ft[t]), 2048, 512, 1, 1);
                    check_batch_invariance_one(be, lab, td_of(ft[t]), 2048, 4096, 1, 1);
                    check_batch_invariance_one(be, lab, td_of(ft[t]), 4096, 1001, 1, 1);
                }
                snprintf(lab, sizeof lab, "early%s", ews[e]);
                check_multi_vs_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 512, 512, 2048, 1, 2);
                check_multi_vs_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 1024, 1024, 4096, 1, 2);
                /* IQ4_XS by the shape rule (cu_mvx24.cu x24_one): all three on
                 * the float kernels; a 35B-A3B delta net in-proj's (qkv, z,
                 * beta) all on the 22-bit one; its full-attention q on the
                 * 22-bit kernel, k and v together on the float ones */
                check_multi_vs_one(be, lab, td_of(MR_TYPE_IQ4_XS), 2048, 512, 512, 2048, 1, 2);
                check_multi_vs_one(be, lab, td_of(MR_TYPE_IQ4_XS), 8192, 4096, 32, 2048, 1, 2);
                check_multi_vs_one(be, lab, td_of(MR_TYPE_IQ4_XS), 4096, 512, 512, 2048, 1, 1);
                /* float32: a 35B-A3B router and shared-expert gate share a launch */
                check_multi_vs_one(be, lab, td_of(MR_TYPE_F32), 256, 1, 64, 2048, 1, 2);
            }
            be->destroy(be);
        }
    /* one token's IQ4_XS rows on the float kernel with their weights loaded
     * before the PDL wait (MEMRA_CUDA_EARLY_IQ4XS, k_fast EARLY: rows of
     * more than 2,048 columns) against the same rows in batches (no early
     * form), at every rows-a-block count; rows of 4,096 columns (as many
     * steps a warp as it loads early) and 8,192 (more), and shorter ones
     * that stay on the plain form */
    const char *eis[] = {"1", "0"};
    const char *frs[] = {"0", "1", "2", "4"};
    for (size_t e = 0; e < 2; e++)
        for (size_t i = 0; i < sizeof frs / sizeof frs[0]; i++) {
            mr_backend *be = backend_with2("MEMRA_CUDA_EARLY_IQ4XS", eis[e], "MEMRA_CUDA_FAST_R", frs[i]);
            char lab[48];
            snprintf(lab, sizeof lab, "early-iq4xs%s-batch-inv-r%s", eis[e], frs[i]);
            /* (columns, rows): the 35B-A3B's out-projection and shared down */
            check_batch_invariance_one(be, lab, td_of(MR_TYPE_IQ4_XS), 4096, 2048, 1, 1);
            check_batch_invariance_one(be, lab, td_of(MR_TYPE_IQ4_XS), 512, 2048, 1, 1);
            check_batch_invariance_one(be, lab, td_of(MR_TYPE_IQ4_XS), 2048, 1001, 1, 1);
            check_batch_invariance_one(be, lab, td_of(MR_TYPE_IQ4_XS), 8192, 512, 1, 1);
            snprintf(lab, sizeof lab, "early-iq4xs%s-r%s", eis[e], frs[i]);
            check_multi_vs_one(be, lab, td_of(MR_TYPE_IQ4_XS), 2048, 512, 512, 2048, 1, 2);
            check_multi_vs_one(be, lab, td_of(MR_TYPE_IQ4_XS), 2048, 1024, 512, 4096, 1, 2);
            be->destroy(be);
        }
    unsetenv("MEMRA_CUDA_EARLY_IQ4XS");
    unsetenv("MEMRA_CUDA_FAST_R");
}

/* One token's plain Q4_K products in one wave of looping blocks (the
 * default; MEMRA_CUDA_WIDE_LOOP=N: at most N blocks an SM, so 1 makes every
 * block take many blocks of rows): a row's bits are those of the batches'
 * launches at every rows-a-block count, a row count not a multiple of the
 * rows a block included, and q/k/v sharing a launch give what they give
 * one at a time. */
static void check_wide_loop(void)
{
    const char *wls[] = {"0", "1", "3"}; /* 0: k_q4k_wide's early loads, the path before */
    const char *wrs[] = {"0", "1", "2", "4", "8"};
    for (size_t l = 0; l < sizeof wls / sizeof wls[0]; l++)
        for (size_t i = 0; i < sizeof wrs / sizeof wrs[0]; i++) {
            mr_backend *be = backend_with2("MEMRA_CUDA_WIDE_LOOP", wls[l], "MEMRA_CUDA_WIDE_R", wrs[i]);
            char lab[40];
            snprintf(lab, sizeof lab, "loop%s-batch-inv-wr%s", wls[l], wrs[i]);
            check_q4k_one_token(be, lab);
            check_batch_invariance_one(be, lab, td_of(MR_TYPE_Q4_K), 12288, 4096, 1, 1);
            snprintf(lab, sizeof lab, "loop%s-wr%s", wls[l], wrs[i]);
            check_multi_vs_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 512, 512, 2048, 1, 2);
            check_multi_vs_one(be, lab, td_of(MR_TYPE_Q4_K), 4096, 1024, 1024, 4096, 1, 2);
            check_multi_vs_one(be, lab, td_of(MR_TYPE_Q4_K), 1001, 7, 512, 4096, 1, 2);
            be->destroy(be);
        }
}

static void check_x24_tiles(void);

static void check_batch_invariance(void)
{
    mr_backend *pre = x24_backend("MEMRA_CUDA_X24_PRE", "1");
    for (int n = 1; n <= 8; n += 3) {
        check_x24_pre(pre, td_of(MR_TYPE_Q4_K), 4096, 12288, n);
        check_x24_pre(pre, td_of(MR_TYPE_Q6_K), 4096, 1024, n);
        check_x24_pre(pre, td_of(MR_TYPE_Q4_K), 12288, 4096, n);
    }
    for (int n = 1; n <= 8; n += 7) {
        check_x24_pre(pre, td_of(MR_TYPE_IQ4_XS), 2048, 8192, n);
        check_x24_pre(pre, td_of(MR_TYPE_Q8_0), 4096, 12288, n);
    }
    pre->destroy(pre);
    const int types[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_Q5_K, MR_TYPE_Q8_0, MR_TYPE_Q4_0, MR_TYPE_IQ4_XS,
                         MR_TYPE_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const tdesc *td = td_of(types[i]);
        check_batch_invariance_one(gpu, "batch-inv", td, 4096, 1024, 1, 1);
        check_batch_invariance_one(gpu, "batch-inv", td, 4096, 12288, 1, 1);
        check_batch_invariance_one(gpu, "batch-inv", td, 2048, 768, 16, 8);
        check_batch_invariance_one(gpu, "batch-inv", td, 768, 2048, 16, 8);
    }
    check_batch_invariance_one(gpu, "batch-inv", td_of(MR_TYPE_Q4_K), 12288, 4096, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv", td_of(MR_TYPE_Q6_K), 4096, 151936, 1, 1);
    /* Q6_K rows of at most 2,048 columns 8 tokens a launch (the 30B-A3B's v) */
    check_batch_invariance_one(gpu, "batch-inv", td_of(MR_TYPE_Q6_K), 2048, 512, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv", td_of(MR_TYPE_Q6_K), 1024, 1001, 1, 1);
    /* the Q4_K float kernel's eight-token launches take four rows a block
     * by default (the lines above) and one with MEMRA_CUDA_WIDE8=1: the
     * 30B-A3B's q and o shapes and an odd row count on both */
    check_batch_invariance_one(gpu, "batch-inv-w8r4", td_of(MR_TYPE_Q4_K), 2048, 4096, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv-w8r4", td_of(MR_TYPE_Q4_K), 4096, 2048, 1, 1);
    check_batch_invariance_one(gpu, "batch-inv-w8r4", td_of(MR_TYPE_Q4_K), 4096, 1001, 1, 1);
    mr_backend *w8r1 = backend_with("MEMRA_CUDA_WIDE8", "1");
    check_batch_invariance_one(w8r1, "batch-inv-w8r1", td_of(MR_TYPE_Q4_K), 2048, 4096, 1, 1);
    check_batch_invariance_one(w8r1, "batch-inv-w8r1", td_of(MR_TYPE_Q4_K), 4096, 2048, 1, 1);
    check_batch_invariance_one(w8r1, "batch-inv-w8r1", td_of(MR_TYPE_Q4_K), 4096, 1001, 1, 1);
    w8r1->destroy(w8r1);
    check_wide_rows();
    check_early_weights();
    check_wide_loop();
    /* the 22-bit kernel on every shape it takes (MEMRA_CUDA_MATVEC=x24all) */
    const int x24t[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_IQ4_XS, MR_TYPE_Q8_0};
    const int nx24 = (int)(sizeof x24t / sizeof x24t[0]);
    for (int i = 0; i < nx24; i++) {
        const tdesc *td = td_of(x24t[i]);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 4096, 1024, 1, 1);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 4096, 12288, 1, 1);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 12288, 4096, 1, 1);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 2048, 768, 16, 8);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 768, 2048, 128, 8);
    }
    /* the 35B-A3B's shapes (IQ4_XS there; Q8_0 too): the 8192 x 2048
     * projection, experts gate/up 512 x 2048 and down 2048 x 512, k = 8 of 256 */
    for (int i = 2; i < nx24; i++) {
        const tdesc *td = td_of(x24t[i]);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 2048, 8192, 1, 1);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 2048, 512, 256, 8);
        check_batch_invariance_one(q8_be[Q8_X24], "batch-inv-x24", td, 512, 2048, 256, 8);
    }
    /* and with up to 8 tokens a launch (MEMRA_CUDA_X24_NT=8; the default is 2) */
    mr_backend *nt8 = x24_backend("MEMRA_CUDA_X24_NT", "8");
    for (int i = 0; i < nx24; i++) {
        check_batch_invariance_one(nt8, "batch-inv-x24nt8", td_of(x24t[i]), 4096, 12288, 1, 1);
        check_batch_invariance_one(nt8, "batch-inv-x24nt8", td_of(x24t[i]), 2048, 768, 16, 8);
    }
    nt8->destroy(nt8);
    check_x24_tiles();
}

/* The tensor-core tiles of Q4_K and Q6_K decode batches (cu_mvx24mma.cu)
 * against one token (part of "mm"; alone: part "tiles"). */
static void check_x24_tiles(void)
{
    /* the tensor-core path for Q4_K and Q6_K decode batches from 2 tokens
     * (MEMRA_CUDA_X24_MMA=2; by default from 9), against one token */
    mr_backend *mma = x24_backend("MEMRA_CUDA_X24_MMA", "2");
    /* every way a tile meets its tokens (1-2, 3-4, 5-8 real tokens), full
     * and partial last token tiles (9: 8 + 1, 11: 8 + 3, 13: 8 + 5), up to
     * the largest decode call; rows not a multiple of 16 (1000, 200), a
     * block class without blocks (768 columns: 3 blocks a row), the widest
     * input (13312 columns: the most shared memory) */
    static const int mma_ns[] = {2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 21, 33, 64};
    const int mma_nn = (int)(sizeof mma_ns / sizeof mma_ns[0]);
    const tdesc *q4 = td_of(MR_TYPE_Q4_K);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q4, 4096, 1024, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q4, 4096, 12288, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q4, 12288, 4096, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q4, 768, 1000, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q4, 13312, 200, 1, 1, mma_ns, mma_nn);
    /* Q6_K (one mapping of tokens; 13312 columns: shared memory past 48 KB) */
    const tdesc *q6 = td_of(MR_TYPE_Q6_K);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q6, 4096, 1024, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q6, 768, 1000, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q6, 13312, 200, 1, 1, mma_ns, mma_nn);
    /* blocks that walk several row tiles (a grid of about one wave: 768 and
     * 1,250 tiles), a last partial tile among them */
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q4, 2048, 20000, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q6, 2048, 12288, 1, 1, mma_ns, mma_nn);
    check_batch_invariance_ns(mma, "batch-inv-x24mma", q6, 2048, 20000, 1, 1, mma_ns, mma_nn);
    /* sub-matrices in one launch (gate/up, q/k/v), a tile across their
     * boundary (rows 1000 + 600 + 24) */
    static const int multi_ns[] = {2, 3, 5, 9, 17};
    for (int i = 0; i < 5; i++) {
        check_x24_multi(mma, q4, 1000, 600, 24, 768, multi_ns[i]);
        check_x24_multi(mma, q6, 1000, 600, 24, 768, multi_ns[i]);
    }
    mma->destroy(mma);
}

/* A captured graph (rmsnorm -> matmul -> argmax) replayed on new inputs
 * gives what direct launches give, on backend g (tag: its name in the
 * report). */
static void check_graph(mr_backend *g, const char *tag)
{
    if (!g->graph_begin) {
        printf("%-14s (no graph hooks)\n", "graph");
        return;
    }
    const tdesc *td = td_of(MR_TYPE_Q4_K);
    const int cols = 1024, rows = 512;
    size_t rb = (size_t)(cols / td->be) * td->bb;
    uint8_t *host = malloc(rb * rows);
    rand_blocks(td, host, rb * rows / td->bb);
    mr_weight wt = {td->name, td->type, cols, rows, 1, rb, NULL, NULL};
    if (g->weight_load(g, &wt, host, &err)) die("weight_load");
    float *x = malloc(cols * 4), *nw = malloc(cols * 4);
    for (int i = 0; i < cols; i++) nw[i] = 1.0f + 0.1f * fgauss();
    float *dx = dalloc(g, cols * 4), *dn = dup_to(g, nw, cols * 4), *dh = dalloc(g, cols * 4);
    float *dy = dalloc(g, rows * 4);
    int32_t *did = dalloc(g, 4);
    float *ya = malloc(rows * 4), *yb = malloc(rows * 4);
    int32_t ia, ib;
    void *graph = NULL;
    /* warm run sizes any scratch, then capture */
    g->rmsnorm(g, dx, dn, dh, 1, cols, 1e-6f);
    g->matmul(g, &wt, dh, dy, 1);
    g->argmax(g, dy, 1, rows, did);
    if (g->sync(g, &err)) die("graph warm-up");
    if (g->graph_begin(g, &err)) die("graph_begin");
    g->rmsnorm(g, dx, dn, dh, 1, cols, 1e-6f);
    g->matmul(g, &wt, dh, dy, 1);
    g->argmax(g, dy, 1, rows, did);
    if (g->graph_end(g, &graph, &err)) die("graph_end");
    double worst = 0;
    int bad = 0, nan = 0;
    for (int it = 0; it < 3; it++) {
        for (int i = 0; i < cols; i++) x[i] = fgauss();
        if (g->upload(g, dx, x, cols * 4, &err)) die("upload");
        poison(g, dy, rows * 4);
        if (g->graph_launch(g, graph, &err)) die("graph_launch");
        fetch(g, ya, dy, rows * 4);
        fetch(g, &ia, did, 4);
        poison(g, dy, rows * 4);
        g->rmsnorm(g, dx, dn, dh, 1, cols, 1e-6f);
        g->matmul(g, &wt, dh, dy, 1);
        g->argmax(g, dy, 1, rows, did);
        fetch(g, yb, dy, rows * 4);
        fetch(g, &ib, did, 4);
        double *r = malloc(rows * 8);
        for (int i = 0; i < rows; i++) r[i] = yb[i];
        int nn;
        double e = rel_l2(ya, r, rows, &nn);
        nan += nn;
        if (e > worst) worst = e;
        bad += ia != ib;
        free(r);
    }
    g->graph_destroy(g, graph);
    char op[32];
    snprintf(op, sizeof op, "graph-replay%s", tag);
    report(op, "rmsnorm+Q4_K matvec+argmax x3", worst + bad, nan, 0.0);
#ifdef MR_HAVE_CUDA
    /* the three identical direct sequences above: recorded, the second
     * captured automatically, the third replayed; the loop compared them
     * with the explicit graph.  Check that the automatic graph did run. */
    long caps = 0, reps = 0;
    mr_cu_autograph_stats(g, &caps, &reps);
    snprintf(op, sizeof op, "autograph%s", tag);
    char what[64];
    snprintf(what, sizeof what, "automatic graphs: %ld captured, %ld replayed", caps, reps);
    if (getenv("MEMRA_CUDA_AUTOGRAPH") && !strcmp(getenv("MEMRA_CUDA_AUTOGRAPH"), "0"))
        printf("%-14s %-44s (off)\n", op, what);
    else
        report(op, what, caps >= 1 && reps >= 1 ? 0.0 : 1.0, 0, 0.0);
#endif
    g->free(g, dx); g->free(g, dn); g->free(g, dh); g->free(g, dy); g->free(g, did);
    free(x); free(nw); free(ya); free(yb);
    g->weight_release(g, &wt);
    free(host);
}

/* ---- programmatic dependent launch: the same steps with PDL on and off ----
 *
 * With PDL (kernels/cuda/cu_pdl.cuh, sm_90+) a kernel may be scheduled while
 * the one before it still runs, and waits on the device before it touches
 * what that kernel writes; a kernel that touched activations before its
 * wait would read a value of the running kernel or of the step before.  So
 * whole decode steps of a small model run on backends that differ only in
 * MEMRA_CUDA_PDL (0, unset), for each family of decode kernels (the
 * float32 kernels, MEMRA_CUDA_MATVEC=q8 and x24): the same
 * kernels with the same launch shapes, so every logit must be the same
 * bits and every argmax the same id.  A step of n tokens (one sequence):
 * embedding rows (Q8_0), 4 layers (attention: q/k/v products, qk norm +
 * RoPE, KV store, split-K attention, o product; layer 2 a gated delta-net
 * block instead: qkv, convolution, scan, gate; FFN: dense SwiGLU on layers
 * 0 and 2, 2 of 8 experts and a gated shared expert (IQ4_XS) on 1 and 3),
 * final norm, output product, argmax.
 * The first step runs op by op, the second is captured, the others replay
 * the graph (automatic graphs), each step on new token ids and positions. */
#define PDL_D 1024
#define PDL_H 8
#define PDL_KVH 2
#define PDL_HD 128
#define PDL_FF 1536
#define PDL_E 8
#define PDL_K 2
#define PDL_EF 512
#define PDL_V 2048
#define PDL_L 4
#define PDL_NMAX 4
#define PDL_STEPS 5
#define PDL_GNK 2 /* gated delta-net: key heads, value heads, head sizes, taps */
#define PDL_GNV 4
#define PDL_GDK 128
#define PDL_GDV 128
#define PDL_GC (2 * PDL_GNK * PDL_GDK + PDL_GNV * PDL_GDV)
#define PDL_GTAPS 4

typedef struct {
    mr_weight emb, out, router, wq[PDL_L], wk[PDL_L], wv[PDL_L], wo[PDL_L], wg[PDL_L], wu[PDL_L], wd[PDL_L];
    mr_weight gqkv, ga, gb, gz, gout;
    mr_weight shg[PDL_L], shu[PDL_L], shd[PDL_L], shgi; /* shared experts of the mixture layers */
    float *an[PDL_L], *fn[PDL_L], *onorm, *qn, *kn, *convw, *gA, *gdt; /* on gpu */
} pdl_model;

typedef struct {
    mr_backend *be;
    mr_kv_cache kv;
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *s, *f, *rl, *rw, *logits;
    float *qkv, *qkvc, *al, *bt, *gy, *z, *cst, *gst;
    float *sg, *su, *so, *sgl; /* shared expert: gate, up, output, gate logit */
    int32_t *ids, *pos, *tab, *eids, *out;
} pdl_run;

static mr_weight pdl_weight(int type, int64_t cols, int64_t rows, int64_t mats)
{
    const tdesc *td = td_of(type);
    const size_t bytes = (size_t)(cols / td->be) * td->bb * rows * mats;
    uint8_t *h = malloc(bytes);
    rand_blocks(td, h, bytes / td->bb);
    mr_weight w;
    load_weight(gpu, td, h, cols, rows, mats, &w);
    free(h);
    return w;
}

static float *pdl_floats(size_t n, float mean, float sd)
{
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = mean + sd * fgauss();
    float *d = dup_to(gpu, h, n * 4);
    free(h);
    return d;
}

static void pdl_model_make(pdl_model *m)
{
    m->emb = pdl_weight(MR_TYPE_Q8_0, PDL_D, PDL_V, 1);
    m->out = pdl_weight(MR_TYPE_Q6_K, PDL_D, PDL_V, 1);
    m->router = pdl_weight(MR_TYPE_F32, PDL_D, PDL_E, 1);
    for (int l = 0; l < PDL_L; l++) {
        m->wq[l] = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_H * PDL_HD, 1);
        m->wk[l] = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_KVH * PDL_HD, 1);
        m->wv[l] = pdl_weight(MR_TYPE_Q6_K, PDL_D, PDL_KVH * PDL_HD, 1);
        m->wo[l] = pdl_weight(MR_TYPE_Q4_K, PDL_H * PDL_HD, PDL_D, 1);
        if (l & 1) { /* experts */
            m->wg[l] = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_EF, PDL_E);
            m->wu[l] = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_EF, PDL_E);
            m->wd[l] = pdl_weight(MR_TYPE_Q6_K, PDL_EF, PDL_D, PDL_E);
            m->shg[l] = pdl_weight(MR_TYPE_IQ4_XS, PDL_D, PDL_EF, 1);
            m->shu[l] = pdl_weight(MR_TYPE_IQ4_XS, PDL_D, PDL_EF, 1);
            m->shd[l] = pdl_weight(MR_TYPE_IQ4_XS, PDL_EF, PDL_D, 1);
        } else {
            m->wg[l] = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_FF, 1);
            m->wu[l] = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_FF, 1);
            m->wd[l] = pdl_weight(MR_TYPE_Q6_K, PDL_FF, PDL_D, 1);
        }
        m->an[l] = pdl_floats(PDL_D, 1.0f, 0.1f);
        m->fn[l] = pdl_floats(PDL_D, 1.0f, 0.1f);
    }
    m->gqkv = pdl_weight(MR_TYPE_Q4_K, PDL_D, PDL_GC, 1);
    m->ga = pdl_weight(MR_TYPE_F32, PDL_D, PDL_GNV, 1);
    m->gb = pdl_weight(MR_TYPE_F32, PDL_D, PDL_GNV, 1);
    m->gz = pdl_weight(MR_TYPE_Q8_0, PDL_D, PDL_GNV * PDL_GDV, 1);
    m->gout = pdl_weight(MR_TYPE_Q4_K, PDL_GNV * PDL_GDV, PDL_D, 1);
    m->shgi = pdl_weight(MR_TYPE_F32, PDL_D, 1, 1);
    m->onorm = pdl_floats(PDL_D, 1.0f, 0.1f);
    m->qn = pdl_floats(PDL_HD, 1.0f, 0.1f);
    m->kn = pdl_floats(PDL_HD, 1.0f, 0.1f);
    m->convw = pdl_floats((size_t)PDL_GC * PDL_GTAPS, 0.0f, 0.5f);
    float a[PDL_GNV], dt[PDL_GNV];
    for (int i = 0; i < PDL_GNV; i++) { a[i] = -expf(0.5f * fgauss()); dt[i] = fgauss(); }
    m->gA = dup_to(gpu, a, sizeof a);
    m->gdt = dup_to(gpu, dt, sizeof dt);
}

static void pdl_model_free(pdl_model *m)
{
    mr_weight *ws[] = {&m->emb, &m->out, &m->router, &m->gqkv, &m->ga, &m->gb, &m->gz, &m->gout, &m->shgi};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) gpu->weight_release(gpu, ws[i]);
    for (int l = 0; l < PDL_L; l++) {
        gpu->weight_release(gpu, &m->wq[l]); gpu->weight_release(gpu, &m->wk[l]);
        gpu->weight_release(gpu, &m->wv[l]); gpu->weight_release(gpu, &m->wo[l]);
        gpu->weight_release(gpu, &m->wg[l]); gpu->weight_release(gpu, &m->wu[l]);
        gpu->weight_release(gpu, &m->wd[l]);
        if (l & 1) {
            gpu->weight_release(gpu, &m->shg[l]); gpu->weight_release(gpu, &m->shu[l]);
            gpu->weight_release(gpu, &m->shd[l]);
        }
        gpu->free(gpu, m->an[l]); gpu->free(gpu, m->fn[l]);
    }
    float *fs[] = {m->onorm, m->qn, m->kn, m->convw, m->gA, m->gdt};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) gpu->free(gpu, fs[i]);
}

static void pdl_run_make(pdl_run *r, mr_backend *be)
{
    const size_t N = PDL_NMAX;
    memset(r, 0, sizeof *r);
    r->be = be;
    r->kv = (mr_kv_cache){.n_layers = PDL_L, .n_blocks = 8, .block_tokens = 16, .n_kv_heads = PDL_KVH,
                          .head_dim = PDL_HD, .dtype = MR_KV_F16};
    if (be->kv_create(be, &r->kv, &err)) die("kv_create");
    float **fb[] = {&r->x, &r->h, &r->q, &r->att, &r->o, &r->f, &r->so};
    for (size_t i = 0; i < sizeof fb / sizeof fb[0]; i++) *fb[i] = dalloc(be, N * PDL_D * 4);
    r->k = dalloc(be, N * PDL_KVH * PDL_HD * 4);
    r->v = dalloc(be, N * PDL_KVH * PDL_HD * 4);
    r->g = dalloc(be, N * PDL_K * PDL_FF * 4); /* dense (FF a token) or experts (EF a pair) */
    r->u = dalloc(be, N * PDL_K * PDL_FF * 4);
    r->s = dalloc(be, N * PDL_K * PDL_FF * 4);
    r->rl = dalloc(be, N * PDL_E * 4);
    r->sg = dalloc(be, N * PDL_EF * 4);
    r->su = dalloc(be, N * PDL_EF * 4);
    r->sgl = dalloc(be, N * 4);
    r->rw = dalloc(be, N * PDL_K * 4);
    r->logits = dalloc(be, N * PDL_V * 4);
    r->qkv = dalloc(be, N * PDL_GC * 4);
    r->qkvc = dalloc(be, N * PDL_GC * 4);
    r->al = dalloc(be, N * PDL_GNV * 4);
    r->bt = dalloc(be, N * PDL_GNV * 4);
    r->gy = dalloc(be, N * PDL_GNV * PDL_GDV * 4);
    r->z = dalloc(be, N * PDL_GNV * PDL_GDV * 4);
    size_t cs = (size_t)(PDL_GTAPS - 1) * PDL_GC, gs = (size_t)PDL_GNV * PDL_GDK * PDL_GDV;
    float *zero = calloc(cs > gs ? cs : gs, 4);
    r->cst = dup_to(be, zero, cs * 4);
    r->gst = dup_to(be, zero, gs * 4);
    free(zero);
    r->ids = dalloc(be, N * 4);
    r->pos = dalloc(be, N * 4);
    r->eids = dalloc(be, N * PDL_K * 4);
    r->out = dalloc(be, N * 4);
    int32_t tab[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    r->tab = dup_to(be, tab, sizeof tab);
}

static void pdl_run_free(pdl_run *r)
{
    mr_backend *be = r->be;
    void *ps[] = {r->x, r->h, r->q, r->k, r->v, r->att, r->o, r->g, r->u, r->s, r->f, r->rl, r->rw, r->logits,
                  r->qkv, r->qkvc, r->al, r->bt, r->gy, r->z, r->cst, r->gst, r->ids, r->pos, r->tab, r->eids, r->out,
                  r->sg, r->su, r->so, r->sgl};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) be->free(be, ps[i]);
    be->kv_destroy(be, &r->kv);
}

/* One step of n tokens on r's backend; returns the number of ops called. */
static int pdl_step(const pdl_model *m, pdl_run *r, int n)
{
    mr_backend *be = r->be;
    const float eps = 1e-6f;
    int ops = 0;
    be->get_rows(be, &m->emb, r->ids, n, r->x), ops++;
    for (int l = 0; l < PDL_L; l++) {
        be->rmsnorm(be, r->x, m->an[l], r->h, n, PDL_D, eps), ops++;
        if (l == 2) { /* gated delta-net block */
            be->matmul(be, &m->gqkv, r->h, r->qkv, n), ops++;
            be->matmul(be, &m->ga, r->h, r->al, n), ops++;
            be->matmul(be, &m->gb, r->h, r->bt, n), ops++;
            be->matmul(be, &m->gz, r->h, r->z, n), ops++;
            be->conv1d_silu(be, r->qkv, m->convw, r->cst, n, PDL_GC, PDL_GTAPS, r->qkvc), ops++;
            be->gdn_scan(be, r->qkvc, PDL_GC, r->al, r->bt, m->gA, m->gdt, r->gst, n, PDL_GNK, PDL_GNV, PDL_GDK,
                         PDL_GDV, eps, r->gy), ops++;
            be->sigmoid_mul(be, r->gy, r->z, n, PDL_GNV * PDL_GDV, PDL_GNV * PDL_GDV, false), ops++;
            be->matmul(be, &m->gout, r->gy, r->o, n), ops++;
        } else {
            be->matmul(be, &m->wq[l], r->h, r->q, n), ops++;
            be->matmul(be, &m->wk[l], r->h, r->k, n), ops++;
            be->matmul(be, &m->wv[l], r->h, r->v, n), ops++;
            be->qk_norm_rope(be, r->q, r->k, m->qn, m->kn, r->pos, n, PDL_H, PDL_KVH, PDL_HD, PDL_HD, 1e6f,
                             MR_ROPE_NEOX, eps), ops++;
            be->kv_store(be, &r->kv, l, r->tab, r->k, r->v, r->pos, n), ops++;
            be->attention(be, &r->kv, l, r->tab, r->q, r->pos, n, PDL_H, 1.0f / sqrtf((float)PDL_HD), r->att), ops++;
            be->matmul(be, &m->wo[l], r->att, r->o, n), ops++;
        }
        be->add(be, r->x, r->o, (size_t)n * PDL_D), ops++;
        be->rmsnorm(be, r->x, m->fn[l], r->h, n, PDL_D, eps), ops++;
        if (l & 1) { /* in qwen35moe's order (worker/arch/qwen35.c moe_ffn): the shared expert first */
            be->matmul(be, &m->shg[l], r->h, r->sg, n), ops++;
            be->matmul(be, &m->shu[l], r->h, r->su, n), ops++;
            be->swiglu(be, r->sg, r->su, r->sg, (size_t)n * PDL_EF), ops++;
            be->matmul(be, &m->shd[l], r->sg, r->so, n), ops++;
            be->matmul(be, &m->router, r->h, r->rl, n), ops++;
            be->matmul(be, &m->shgi, r->h, r->sgl, n), ops++;
            be->moe_route(be, r->rl, n, PDL_E, PDL_K, true, r->eids, r->rw), ops++;
            be->matmul_id(be, &m->wg[l], r->h, 1, r->eids, PDL_K, r->g, n), ops++;
            be->matmul_id(be, &m->wu[l], r->h, 1, r->eids, PDL_K, r->u, n), ops++;
            be->swiglu(be, r->g, r->u, r->s, (size_t)n * PDL_K * PDL_EF), ops++;
            be->matmul_id(be, &m->wd[l], r->s, PDL_K, r->eids, PDL_K, r->g, n), ops++;
            be->moe_combine(be, r->g, r->rw, n, PDL_K, PDL_D, r->f), ops++;
            be->sigmoid_mul(be, r->so, r->sgl, n, PDL_D, 1, true), ops++;
            be->add(be, r->f, r->so, (size_t)n * PDL_D), ops++;
        } else {
            be->matmul(be, &m->wg[l], r->h, r->g, n), ops++;
            be->matmul(be, &m->wu[l], r->h, r->u, n), ops++;
            be->swiglu(be, r->g, r->u, r->s, (size_t)n * PDL_FF), ops++;
            be->matmul(be, &m->wd[l], r->s, r->f, n), ops++;
        }
        be->add(be, r->x, r->f, (size_t)n * PDL_D), ops++;
    }
    be->rmsnorm(be, r->x, m->onorm, r->h, n, PDL_D, eps), ops++;
    be->matmul(be, &m->out, r->h, r->logits, n), ops++;
    be->argmax(be, r->logits, n, PDL_V, r->out), ops++;
    return ops;
}

/* PDL_STEPS steps of n tokens on a fresh state of backend be: the logits
 * and argmax ids of every step, and the ops a step. */
static int pdl_steps(const pdl_model *m, mr_backend *be, int n, const int32_t *ids, const int32_t *pos,
                     float *logits, int32_t *out)
{
    pdl_run r;
    pdl_run_make(&r, be);
    int ops = 0;
    for (int s = 0; s < PDL_STEPS; s++) {
        if (be->upload(be, r.ids, ids + s * n, (size_t)n * 4, &err) ||
            be->upload(be, r.pos, pos + s * n, (size_t)n * 4, &err))
            die("upload");
        poison(be, r.logits, (size_t)n * PDL_V * 4);
        ops = pdl_step(m, &r, n);
        fetch(be, logits + (size_t)s * n * PDL_V, r.logits, (size_t)n * PDL_V * 4);
        fetch(be, out + s * n, r.out, (size_t)n * 4);
    }
    pdl_run_free(&r);
    return ops;
}

static void check_pdl(void)
{
    enum { NF = 4, NM = 6 };
    /* xmd: the dense Q4_K products on the int8 tensor cores (cu_mvxmd.cu) */
    static const struct { const char *name, *matvec, *xmd; } fam[NF] = {
        {"f32", "f32", "0"}, {"q8", "q8", "0"}, {"x24", "x24all", "0"}, {"xmd", "f32", "1"}};
    /* MEMRA_CUDA_PDL (NULL: unset, the default), and MEMRA_CUDA_L2PF with
     * it: the graphs with the next products' weights asked of L2 on a side
     * stream beside or after the product before (cu_autograph.cu), and
     * with MEMRA_CUDA_L2PF_ID the mixture layers' down experts beside
     * their gate/up; all of them with MEMRA_CUDA_BRANCH=0, and the last
     * with the default, the shared experts on a side stream of the graph
     * beside the routed ones */
    static const char *mode[NM] = {"0", NULL, NULL, NULL, NULL, NULL};
    static const char *l2pf[NM] = {NULL, NULL, "1", "2", "2", NULL};
    static const char *l2pf_id[NM] = {NULL, NULL, NULL, NULL, "1", NULL};
    static const char *branch[NM] = {"0", "0", "0", "0", "0", NULL};
    static const char *mode_name[NM] = {"off", "on", "l2pf1", "l2pf2", "l2pf2id", "branch"};
    pdl_model m;
    pdl_model_make(&m);
    const size_t nl = (size_t)PDL_STEPS * PDL_NMAX * PDL_V;
    float *lg[NM];
    int32_t *ids = malloc(PDL_STEPS * PDL_NMAX * 4), *pos = malloc(PDL_STEPS * PDL_NMAX * 4), *out[NM];
    for (int i = 0; i < NM; i++) {
        lg[i] = malloc(nl * 4);
        out[i] = malloc(PDL_STEPS * PDL_NMAX * 4);
    }
    for (int f = 0; f < NF; f++) {
        mr_backend *be[NM];
        setenv("MEMRA_CUDA_MATVEC", fam[f].matvec, 1);
        setenv("MEMRA_CUDA_XMD", fam[f].xmd, 1);
        for (int i = 0; i < NM; i++) {
            if (mode[i]) setenv("MEMRA_CUDA_PDL", mode[i], 1);
            else unsetenv("MEMRA_CUDA_PDL");
            if (l2pf[i]) setenv("MEMRA_CUDA_L2PF", l2pf[i], 1);
            else unsetenv("MEMRA_CUDA_L2PF");
            if (l2pf_id[i]) setenv("MEMRA_CUDA_L2PF_ID", l2pf_id[i], 1);
            else unsetenv("MEMRA_CUDA_L2PF_ID");
            if (branch[i]) setenv("MEMRA_CUDA_BRANCH", branch[i], 1);
            else unsetenv("MEMRA_CUDA_BRANCH");
            be[i] = mr_backend_cuda_create(0, &err);
            if (!be[i]) die("cuda (pdl)");
        }
        unsetenv("MEMRA_CUDA_PDL");
        unsetenv("MEMRA_CUDA_L2PF");
        unsetenv("MEMRA_CUDA_L2PF_ID");
        unsetenv("MEMRA_CUDA_BRANCH");
        unsetenv("MEMRA_CUDA_MATVEC");
        setenv("MEMRA_CUDA_XMD", "0", 1);
        int pm = 0;
#ifdef MR_HAVE_CUDA
        pm = mr_cuda_pdl_mode(be[1]);
#endif
        const int ns[2] = {1, PDL_NMAX};
        for (int k = 0; k < 2; k++) {
            const int n = ns[k];
            for (int i = 0; i < PDL_STEPS * n; i++) {
                ids[i] = (int32_t)(rnd() % PDL_V);
                pos[i] = 20 + i; /* one sequence, n new positions a step */
            }
            int ops = 0;
            for (int i = 0; i < NM; i++) ops = pdl_steps(&m, be[i], n, ids, pos, lg[i], out[i]);
            const size_t cnt = (size_t)PDL_STEPS * n * PDL_V;
            int nan = 0;
            for (size_t j = 0; j < cnt; j++) nan += !isfinite(lg[0][j]);
            for (int i = 1; i < NM; i++) {
                size_t diff = 0;
                for (size_t j = 0; j < cnt; j++) diff += memcmp(&lg[i][j], &lg[0][j], 4) != 0;
                for (int j = 0; j < PDL_STEPS * n; j++) diff += out[i][j] != out[0][j];
                char shape[96];
                snprintf(shape, sizeof shape, "%s %s=off n=%d %d steps %d ops%s", fam[f].name, mode_name[i], n,
                         PDL_STEPS, ops, pm ? "" : " (no PDL here)");
                report("pdl", shape, (double)diff, nan, 0.0);
            }
        }
#ifdef MR_HAVE_CUDA
        long pf[NM] = {0};
        for (int i = 2; i < 5; i++) { /* that the graphs took prefetches at all */
            char shape[96];
            pf[i] = mr_cu_l2pf_launches(be[i]);
            snprintf(shape, sizeof shape, "%s %s: %ld prefetch launches captured", fam[f].name, mode_name[i], pf[i]);
            report("pdl", shape, pf[i] > 0 ? 0.0 : 1.0, 0, 0.0);
        }
        { /* the down experts' prefetches come on top of the dense ones */
            char shape[96];
            snprintf(shape, sizeof shape, "%s l2pf2id: %ld launches against l2pf2's %ld", fam[f].name, pf[4], pf[3]);
            report("pdl", shape, pf[4] > pf[3] ? 0.0 : 1.0, 0, 0.0);
        }
        { /* that the graphs took branches: two a step (layers 1 and 3) in every
           * capture, where the shared experts' kernels use no scratch buffer
           * (the float ones; the q8 and x24 families' do, and their captures
           * then take none: the equality above is their check) */
            const long br = mr_cu_branch_forks(be[5]);
            const bool need = !strcmp(fam[f].name, "f32") || !strcmp(fam[f].name, "xmd");
            char shape[96];
            snprintf(shape, sizeof shape, "%s branch: %ld shared experts on the side stream%s", fam[f].name, br,
                     need ? "" : " (none needed)");
            report("pdl", shape, !need || br > 0 ? 0.0 : 1.0, 0, 0.0);
        }
#endif
        for (int i = NM - 1; i >= 0; i--) be[i]->destroy(be[i]);
    }
    for (int i = 0; i < NM; i++) {
        free(lg[i]);
        free(out[i]);
    }
    free(ids);
    free(pos);
    pdl_model_free(&m);
}

/* ---- sampling: the sample op against worker/sample.c's mr_sample ----
 *
 * Every row is sampled twice from the same logits: by the op (penalty
 * tables fed the row's prompt and generated ids, the uniform u) and by
 * mr_sample on a host copy with a generator whose first draw is u.  The
 * ids must be equal, except where the host's own float64 arithmetic puts
 * the row within a hair of a decision: u * total within 1e-10 * total of a
 * CDF boundary, the top_p goal within 1e-10 * total of a head sum, or a
 * weight within 1e-12 (relative) of min_p.  Those rows are found by an
 * independent reference here (a full sort, long double sums) and listed as
 * near-boundary, not failed; the reference must agree with mr_sample
 * everywhere else too. */

#define SAMPLE_NEAR_SUM 1e-10
#define SAMPLE_NEAR_MINP 1e-12

typedef struct {
    mr_sample_params p;
    double u;
    int np, ng;
    int32_t *toks; /* prompt then generated ids */
} srow;

typedef struct { float l; int32_t id; } scand;
static int scand_rank(const void *a, const void *b)
{
    const scand *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
typedef struct { int32_t id; double w; } sdraw;
static int sdraw_id(const void *a, const void *b)
{
    const sdraw *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* The reference pick from penalised logits (mr_sample's semantics, sorted,
 * long double sums) and how close the row is to a decision boundary
 * (*near: the smallest margin relative to its threshold; 1 when none). */
static int32_t sample_ref(const float *l, int V, const mr_sample_params *p, double u, double *near,
                          const char **why)
{
    *near = 1.0;
    *why = "";
    if (!(p->temperature > 0.0f)) {
        int32_t b = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[b] || (isnan(l[b]) && !isnan(l[i]))) b = i;
        return b;
    }
    float mx = -INFINITY;
    int32_t best = 0;
    for (int i = 0; i < V; i++)
        if (l[i] > mx) { mx = l[i]; best = i; }
    if (!isfinite(mx)) return best;
    scand *c = malloc(sizeof *c * (size_t)V);
    int n = 0;
    for (int i = 0; i < V; i++)
        if (l[i] == l[i]) c[n++] = (scand){l[i], i};
    qsort(c, (size_t)n, sizeof *c, scand_rank);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double inv_t = 1.0 / (double)p->temperature;
    double *w = malloc(sizeof *w * (size_t)(n > 0 ? n : 1));
    long double total = 0;
    for (int j = 0; j < n; j++) {
        w[j] = exp(((double)c[j].l - (double)mx) * inv_t);
        if (p->min_p > 0.0f && w[j] > 0.0) {
            double m = fabs(w[j] - (double)p->min_p) / (double)p->min_p;
            if (m < *near && m < SAMPLE_NEAR_MINP) { *near = m; *why = "min_p"; }
        }
        if (!(w[j] > 0.0) || (p->min_p > 0.0f && w[j] < (double)p->min_p)) w[j] = 0.0;
        total += w[j];
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        long double goal = (long double)p->top_p * total, head = 0;
        int R = n;
        for (int j = 0; j < n; j++) {
            long double before = head;
            head += w[j];
            if (head >= goal && w[j] > 0.0) {
                double m1 = (double)(fabsl(head - goal) / total), m0 = (double)(fabsl(goal - before) / total);
                double m = m1 < m0 ? m1 : m0;
                if (m < SAMPLE_NEAR_SUM && m < *near) { *near = m; *why = "top_p"; }
                R = j + 1;
                break;
            }
        }
        for (int j = R; j < n; j++) w[j] = 0.0;
    }
    /* survivors in id order */
    sdraw *s = malloc(sizeof *s * (size_t)(n > 0 ? n : 1));
    int ns = 0;
    for (int j = 0; j < n; j++)
        if (w[j] > 0.0) s[ns++] = (sdraw){c[j].id, w[j]};
    qsort(s, (size_t)ns, sizeof *s, sdraw_id);
    long double tot2 = 0;
    for (int j = 0; j < ns; j++) tot2 += s[j].w;
    long double target = (long double)u * tot2, cum = 0;
    int32_t pick = ns ? s[ns - 1].id : best; /* the last survivor when the sum falls short */
    bool found = false;
    for (int j = 0; j < ns && !found; j++) {
        long double before = cum;
        cum += s[j].w;
        if (target < cum) {
            double m1 = (double)((cum - target) / tot2), m0 = (double)((target - before) / tot2);
            double m = m1 < m0 ? m1 : m0;
            if (m < SAMPLE_NEAR_SUM && m < *near) { *near = m; *why = "cdf"; }
            pick = s[j].id;
            found = true;
        }
    }
    if (!found && ns) {
        double m = (double)((target - cum) / tot2);
        if (m < SAMPLE_NEAR_SUM && m < *near) { *near = m; *why = "cdf-end"; }
    }
    free(c); free(w); free(s);
    return pick;
}

static mr_sampler *sample_host;
static int sample_host_v;

/* One call of the op over rows[0..n) of V logits (x, not penalised); with
 * tables (one per penalised row, reset on the first step) fed everything
 * the first step and the ids after given[r] later.  Compares with
 * mr_sample; returns the number of failures. */
static int sample_compare(const char *tag, int V, int n, const float *x, srow *rows, int32_t **tables,
                          const int *given, int *near_rows, bool quiet)
{
    mr_err e2;
    if (sample_host_v != V) {
        mr_sampler_free(sample_host);
        if (mr_sampler_new(V, &sample_host, &e2)) { err = e2; die("sampler"); }
        sample_host_v = V;
    }
    size_t len = (size_t)n * V;
    mr_sample_row *hr = calloc((size_t)n, sizeof *hr);
    size_t n_add = 0;
    for (int r = 0; r < n; r++) n_add += (size_t)rows[r].np + (size_t)rows[r].ng;
    int32_t *add = malloc(sizeof(int32_t) * (n_add ? n_add : 1));
    int off = 0;
    for (int r = 0; r < n; r++) {
        srow *q = &rows[r];
        bool pen = mr_sample_penalized(&q->p);
        hr[r] = (mr_sample_row){.u = q->u, .temperature = q->p.temperature, .top_p = q->p.top_p,
                                .min_p = q->p.min_p, .presence = q->p.presence_penalty,
                                .frequency = q->p.frequency_penalty, .repetition = q->p.repetition_penalty,
                                .top_k = q->p.top_k, .table = pen ? tables[r] : NULL};
        if (!pen) continue;
        int g0 = given ? given[r] : -1; /* -1: first step (reset, everything) */
        hr[r].reset = g0 < 0;
        hr[r].add_off = off;
        if (g0 < 0) {
            memcpy(add + off, q->toks, sizeof(int32_t) * (size_t)(q->np + q->ng));
            hr[r].n_add_prompt = q->np;
            hr[r].n_add_gen = q->ng;
            off += q->np + q->ng;
        } else {
            memcpy(add + off, q->toks + q->np + g0, sizeof(int32_t) * (size_t)(q->ng - g0));
            hr[r].n_add_gen = q->ng - g0;
            off += q->ng - g0;
        }
    }
    float *dl = dup_to(gpu, x, len * 4);
    mr_sample_row *drows = dup_to(gpu, hr, sizeof *hr * (size_t)n);
    int32_t *dadd = dup_to(gpu, add, sizeof(int32_t) * (off ? (size_t)off : 1));
    int32_t *dids = dalloc(gpu, (size_t)n * 4), *ids = malloc((size_t)n * 4);
    poison(gpu, dids, (size_t)n * 4);
    gpu->sample(gpu, dl, n, V, drows, dadd, dids);
    fetch(gpu, ids, dids, (size_t)n * 4);
    int bad = 0, near = 0;
    float *h = malloc((size_t)V * 4);
    for (int r = 0; r < n; r++) {
        srow *q = &rows[r];
        memcpy(h, x + (size_t)r * V, (size_t)V * 4);
        mr_rng g;
        mr_rng_rig(&g, q->u);
        int32_t want = mr_sample(sample_host, &q->p, &g, h, q->toks, q->np, q->toks + q->np, q->ng);
        double m;
        const char *why;
        int32_t ref = sample_ref(h, V, &q->p, q->u, &m, &why); /* h is penalised now */
        bool is_near = m < 1.0;
        if (ids[r] == want && (ref == want || is_near)) continue;
        if (is_near) {
            near++;
            printf("  %s row %d: near a boundary (%s, margin %.2e): op %d, mr_sample %d, reference %d\n", tag, r,
                   why, m, ids[r], want, ref);
            continue;
        }
        bad++;
        if (bad <= 8 || !quiet)
            printf("  %s row %d FAIL: op %d, mr_sample %d, reference %d (T %g top_k %d top_p %g min_p %g pres %g "
                   "freq %g rep %g u %.17g np %d ng %d)\n", tag, r, ids[r], want, ref, (double)q->p.temperature,
                   q->p.top_k, (double)q->p.top_p, (double)q->p.min_p, (double)q->p.presence_penalty,
                   (double)q->p.frequency_penalty, (double)q->p.repetition_penalty, q->u, q->np, q->ng);
    }
    *near_rows += near;
    gpu->free(gpu, dl); gpu->free(gpu, drows); gpu->free(gpu, dadd); gpu->free(gpu, dids);
    free(hr); free(add); free(ids); free(h);
    return bad;
}

/* Logits like a language model's: a broad body and a few strong ids. */
static void sample_logits(float *x, int V, int kind)
{
    for (int i = 0; i < V; i++) {
        switch (kind) {
        case 0: x[i] = 2.5f * fgauss(); break;                      /* body */
        case 1: x[i] = (float)(rnd() % 5); break;                   /* exact ties everywhere */
        case 2: x[i] = rnd() % 2 ? -INFINITY : 3.0f * fgauss(); break; /* half -inf */
        case 3: x[i] = 0.05f * fgauss(); break;                     /* nearly flat */
        }
    }
    if (kind == 0)
        for (int j = 0; j < 24; j++) x[rnd() % (uint64_t)V] = 8.0f + 10.0f * (float)(rnd() % 1000) / 1000.0f;
}

static void srow_ids(srow *q, int V, int np, int ng)
{
    q->np = np;
    q->ng = ng;
    q->toks = malloc(sizeof(int32_t) * (size_t)(np + ng + 1));
    int span = V < 4000 ? V : 4000; /* repeats */
    for (int i = 0; i < np + ng; i++) q->toks[i] = (int32_t)(rnd() % (uint64_t)span);
}

static mr_sample_params sample_params_mixed(int V)
{
    mr_sample_params p = {0};
    int f = (int)(rnd() % 64);
    p.temperature = f % 7 == 0 ? 0.0f : 0.1f + (float)(rnd() % 200) / 100.0f;
    if (f & 1) p.top_k = 1 + (int)(rnd() % (uint64_t)(rnd() % 4 ? 100 : V));
    if (f & 2) p.top_p = 0.3f + (float)(rnd() % 70) / 100.0f;
    if (f & 4) p.min_p = (float)(rnd() % 30) / 100.0f;
    if (f & 8) p.presence_penalty = (float)((int)(rnd() % 41) - 20) / 10.0f;
    if (f & 16) p.frequency_penalty = (float)((int)(rnd() % 41) - 20) / 10.0f;
    if (f & 32) p.repetition_penalty = 0.5f + (float)(rnd() % 20) / 10.0f;
    return p;
}

static double sample_u(void)
{
    mr_rng r;
    mr_rng_seed(&r, rnd());
    return mr_rng_uniform(&r);
}

static void sample_group(const char *name, int V, int n, int kind, const mr_sample_params *fixed, int n_fixed,
                         const double *fixed_u)
{
    float *x = malloc((size_t)n * V * 4);
    srow *rows = calloc((size_t)n, sizeof *rows);
    int32_t **tables = calloc((size_t)n, sizeof *tables);
    for (int r = 0; r < n; r++) {
        sample_logits(x + (size_t)r * V, V, kind);
        rows[r].p = r < n_fixed ? fixed[r] : sample_params_mixed(V);
        rows[r].u = fixed_u && r < n_fixed && fixed_u[r] > 0 ? fixed_u[r] : sample_u();
        srow_ids(&rows[r], V, 1 + (int)(rnd() % 300), (int)(rnd() % 40));
        tables[r] = dalloc(gpu, sizeof(int32_t) * mr_sample_table_ints(V));
        poison(gpu, tables[r], sizeof(int32_t) * mr_sample_table_ints(V)); /* reset must clear it */
    }
    int near = 0;
    int bad = sample_compare(name, V, n, x, rows, tables, NULL, &near, true);
    char shape[64];
    snprintf(shape, sizeof shape, "%s V=%d n=%d (%d near)", name, V, n, near);
    report("sample", shape, (double)bad, 0, 0.0);
    for (int r = 0; r < n; r++) { free(rows[r].toks); gpu->free(gpu, tables[r]); }
    free(x); free(rows); free(tables);
}

/* Tables fed over several steps: the prompt (a long one in row 0) and the
 * generated ids so far with the first step, one more id a step after. */
static void sample_steps(int V, int n, int steps)
{
    float *x = malloc((size_t)n * V * 4);
    srow *rows = calloc((size_t)n, sizeof *rows);
    int32_t **tables = calloc((size_t)n, sizeof *tables);
    int *given = calloc((size_t)n, sizeof *given);
    for (int r = 0; r < n; r++) {
        rows[r].p = (mr_sample_params){.temperature = r % 4 == 3 ? 0.0f : 0.8f, .top_k = r % 2 ? 40 : 0,
                                       .top_p = r % 3 ? 0.9f : 0.0f, .presence_penalty = 0.4f,
                                       .frequency_penalty = 0.3f, .repetition_penalty = r % 2 ? 1.3f : 1.0f};
        srow_ids(&rows[r], V, r == 0 ? 30000 : 50 + r, steps + 2);
        tables[r] = dalloc(gpu, sizeof(int32_t) * mr_sample_table_ints(V));
        poison(gpu, tables[r], sizeof(int32_t) * mr_sample_table_ints(V));
    }
    int bad = 0, near = 0;
    for (int s = 0; s < steps; s++) {
        for (int r = 0; r < n; r++) {
            sample_logits(x + (size_t)r * V, V, 0);
            rows[r].u = sample_u();
            given[r] = rows[r].ng; /* what the table had */
            rows[r].ng = 2 + s;
        }
        bad += sample_compare("steps", V, n, x, rows, tables, s ? given : NULL, &near, true);
    }
    char shape[64];
    snprintf(shape, sizeof shape, "tables over %d steps V=%d n=%d (%d near)", steps, V, n, near);
    report("sample", shape, (double)bad, 0, 0.0);
    for (int r = 0; r < n; r++) { free(rows[r].toks); gpu->free(gpu, tables[r]); }
    free(x); free(rows); free(tables); free(given);
}

/* The op recorded and replayed as a CUDA graph (the automatic graphs:
 * the same call three times, new rows and logits uploaded in between),
 * and inside an explicit capture. */
static void sample_graph(int V, int n)
{
    float *x = malloc((size_t)n * V * 4), *h = malloc((size_t)V * 4);
    mr_sample_row *hr = calloc((size_t)n, sizeof *hr);
    srow *rows = calloc((size_t)n, sizeof *rows);
    float *dl = dalloc(gpu, (size_t)n * V * 4);
    mr_sample_row *drows = dalloc(gpu, sizeof *hr * (size_t)n);
    int32_t *dadd = dalloc(gpu, 4), *dids = dalloc(gpu, (size_t)n * 4), *ids = malloc((size_t)n * 4);
    long caps0 = 0, reps0 = 0, caps1 = 0, reps1 = 0;
#ifdef MR_HAVE_CUDA
    mr_cu_autograph_stats(gpu, &caps0, &reps0);
#endif
    void *graph = NULL;
    int bad = 0;
    for (int it = 0; it < 6; it++) {
        for (int r = 0; r < n; r++) {
            sample_logits(x + (size_t)r * V, V, 0);
            rows[r].p = (mr_sample_params){.temperature = 0.3f + 0.2f * (float)r, .top_k = r % 2 ? 0 : 30,
                                           .top_p = 0.9f};
            rows[r].u = sample_u();
            hr[r] = (mr_sample_row){.u = rows[r].u, .temperature = rows[r].p.temperature, .top_p = 0.9f,
                                    .top_k = rows[r].p.top_k};
        }
        if (gpu->upload(gpu, dl, x, (size_t)n * V * 4, &err) || gpu->upload(gpu, drows, hr, sizeof *hr * (size_t)n, &err))
            die("upload");
        poison(gpu, dids, (size_t)n * 4);
        if (it < 3) { /* automatic: recorded, captured at the second, replayed at the third */
            gpu->sample(gpu, dl, n, V, drows, dadd, dids);
        } else {
            if (it == 3) {
                if (gpu->graph_begin(gpu, &err)) die("graph_begin");
                gpu->sample(gpu, dl, n, V, drows, dadd, dids);
                if (gpu->graph_end(gpu, &graph, &err)) die("graph_end");
            }
            if (gpu->graph_launch(gpu, graph, &err)) die("graph_launch");
        }
        fetch(gpu, ids, dids, (size_t)n * 4);
        for (int r = 0; r < n; r++) {
            memcpy(h, x + (size_t)r * V, (size_t)V * 4);
            mr_rng g;
            mr_rng_rig(&g, rows[r].u);
            int32_t want = mr_sample(sample_host, &rows[r].p, &g, h, NULL, 0, NULL, 0);
            double m;
            const char *why;
            sample_ref(h, V, &rows[r].p, rows[r].u, &m, &why);
            if (ids[r] != want && !(m < 1.0)) {
                bad++;
                printf("  graph step %d row %d FAIL: op %d, mr_sample %d\n", it, r, ids[r], want);
            }
        }
    }
    gpu->graph_destroy(gpu, graph);
#ifdef MR_HAVE_CUDA
    mr_cu_autograph_stats(gpu, &caps1, &reps1);
#endif
    char shape[96];
    snprintf(shape, sizeof shape, "graphs V=%d n=%d (auto: %ld captured, %ld replayed)", V, n, caps1 - caps0,
             reps1 - reps0);
    bool autog = !(getenv("MEMRA_CUDA_AUTOGRAPH") && !strcmp(getenv("MEMRA_CUDA_AUTOGRAPH"), "0"));
    report("sample", shape, (double)bad + (autog && (caps1 - caps0 < 1 || reps1 - reps0 < 1)), 0, 0.0);
    gpu->free(gpu, dl); gpu->free(gpu, drows); gpu->free(gpu, dadd); gpu->free(gpu, dids);
    free(x); free(h); free(hr); free(rows); free(ids);
}

static void check_sample_all(void)
{
    if (!gpu->sample) {
        report("sample", "no sample op", 1.0, 0, 0.0);
        return;
    }
    const int QV = 151936;
    /* each feature alone, then together, and the paths of the kernel:
     * candidates in shared memory (top_k <= 2048, or a nucleus within the
     * 2048 best), the whole row (top_k > 2048, a flat nucleus, none) */
    const mr_sample_params one[] = {
        {.temperature = 1.0f},
        {.temperature = 0.7f, .top_k = 1},
        {.temperature = 0.7f, .top_k = 20},
        {.temperature = 0.9f, .top_k = 2048},
        {.temperature = 0.9f, .top_k = 2049},
        {.temperature = 1.3f, .top_k = 50000},
        {.temperature = 0.8f, .top_p = 0.9f},
        {.temperature = 1.0f, .top_p = 0.999f},
        {.temperature = 1.0f, .min_p = 0.05f},
        {.temperature = 0.6f, .min_p = 0.5f},
        {.temperature = 1.0f, .presence_penalty = 1.5f, .frequency_penalty = 0.5f, .repetition_penalty = 1.3f},
        {.temperature = 0.0f, .presence_penalty = 2.0f, .repetition_penalty = 1.5f},
        {.temperature = 0.0f},
        {.temperature = 1e-4f},
        {.temperature = 50.0f},
        {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .min_p = 0.02f, .presence_penalty = 0.5f,
         .frequency_penalty = 0.3f, .repetition_penalty = 1.1f},
        {.temperature = 50.0f, .top_p = 0.9f},
        {.temperature = 50.0f, .top_k = 3000, .top_p = 0.5f},
        {.temperature = 2.0f, .top_k = 100, .min_p = 0.1f, .repetition_penalty = 0.7f},
        {.temperature = 0.7f, .top_p = 0.8f, .top_k = 20},
    };
    const int n_one = (int)(sizeof one / sizeof one[0]);
    /* u at the ends: the smallest draw, the largest below 1, and 1 itself
     * (what mr_rng_uniform returns for k = 2^53 - 1) */
    double ends_u[6] = {0.5 / 9007199254740992.0, 1.0 - 1.0 / 4503599627370496.0, 1.0,
                        0.5 / 9007199254740992.0, 1.0 - 1.0 / 4503599627370496.0, 1.0};
    const mr_sample_params ends[6] = {
        {.temperature = 1.0f}, {.temperature = 1.0f}, {.temperature = 1.0f},
        {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f}, {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f},
        {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f},
    };
    sample_group("one-by-one", QV, n_one, 0, one, n_one, NULL);
    sample_group("u-ends", QV, 6, 0, ends, 6, ends_u);
    sample_group("mixed", QV, 64, 0, NULL, 0, NULL);
    sample_group("mixed", 1000, 64, 0, NULL, 0, NULL);
    sample_group("mixed", 33, 64, 0, NULL, 0, NULL);
    sample_group("ties", QV, 32, 1, one, n_one, NULL);
    sample_group("ties", 1000, 64, 1, NULL, 0, NULL);
    sample_group("half-inf", QV, 24, 2, one, n_one, NULL);
    sample_group("flat", QV, 24, 3, one, n_one, NULL);
    sample_group("flat", 5003, 32, 3, NULL, 0, NULL);
    sample_steps(QV, 8, 4);
    sample_graph(QV, 4);
    /* rows that cannot be sampled as numbers: all -inf, NaN among them */
    {
        const int V = 1000, n = 4;
        float *x = malloc((size_t)n * V * 4);
        for (int i = 0; i < n * V; i++) x[i] = -INFINITY;
        x[1 * V + 0] = NAN;
        x[2 * V + 0] = NAN;
        x[2 * V + 500] = 1.0f;
        for (int i = 0; i < V; i++) x[3 * V + i] = i % 3 ? NAN : fgauss();
        srow rows[4];
        int32_t *tables[4] = {0};
        mr_sample_params ps[4] = {{.temperature = 1.0f}, {.temperature = 0.0f}, {.temperature = 0.5f, .top_k = 3},
                                  {.temperature = 0.9f, .top_p = 0.5f}};
        for (int r = 0; r < n; r++) {
            rows[r] = (srow){.p = ps[r], .u = sample_u()};
            srow_ids(&rows[r], V, 0, 0);
        }
        int near = 0, bad = sample_compare("odd", V, n, x, rows, tables, NULL, &near, false);
        report("sample", "all -inf / NaN rows V=1000 n=4", (double)bad, 0, 0.0);
        for (int r = 0; r < n; r++) free(rows[r].toks);
        free(x);
    }
    mr_sampler_free(sample_host);
    sample_host = NULL;
    sample_host_v = 0;
}

/* Prompt attention with a threshold (MEMRA_CUDA_ATTN_TC_FROM) takes a row's
 * kernel by its position: rows before MIX_FROM carry the float32 kernel's
 * bits, later rows the tensor-core kernel's, bit for bit, in one call that
 * straddles MIX_FROM. */
static void check_attention_mix_rows(int heads, int kvh, int hd, int P, mr_kv_dtype dt)
{
    const size_t qn = (size_t)P * heads * hd, row = (size_t)heads * hd;
    float *K, *V, *q;
    attn_random_inputs(P, kvh * hd, qn, &K, &V, &q);
    float *mix = prompt_attention_out(gpu_attn_mix, heads, kvh, hd, P, dt, K, V, q, P);
    float *f32 = prompt_attention_out(gpu, heads, kvh, hd, P, dt, K, V, q, P);
    float *tc = prompt_attention_out(gpu_attn_tc, heads, kvh, hd, P, dt, K, V, q, P);
    const size_t cut = (size_t)(P < MIX_FROM ? P : MIX_FROM) * row;
    size_t d_lo = 0, d_hi = 0;
    int nan = 0;
    for (size_t e = 0; e < qn; e++) {
        if (e < cut) d_lo += memcmp(&mix[e], &f32[e], 4) != 0;
        else d_hi += memcmp(&mix[e], &tc[e], 4) != 0;
        nan += isnan(mix[e]);
    }
    char shape[96];
    const char *dn = kv_dt_name(dt);
    snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=%d rows < %d vs float32", dn, heads, kvh, hd, P, MIX_FROM);
    report("attention-mix-rows", shape, (double)d_lo, nan, 0.0);
    snprintf(shape, sizeof shape, "%s h=%d/%d d=%d P=%d rows >= %d vs tensor cores", dn, heads, kvh, hd, P, MIX_FROM);
    report("attention-mix-rows", shape, (double)d_hi, 0, 0.0);
    free(K); free(V); free(q); free(mix); free(f32); free(tc);
}

/* Every check, in order. */
/* Prompt-sized calls: the float32 tiled prefill kernel (the hybrids' and
 * MEMRA_CUDA_ATTN=f32's) and the tensor-core one, both with the keys cut
 * into PF_SLICE-position slices over several blocks; `kernel-check SEED
 * attn` runs only these. */
static void check_attention_prompts(void)
{
    /* prompt-sized calls take the tiled prefill kernel */
    check_attention(32, 8, 128, 300, 200, MR_KV_F16);
    check_attention(32, 8, 128, 700, 64, MR_KV_BF16);
    check_attention(8, 2, 256, 90, 70, MR_KV_F32);
    check_attention(16, 4, 64, 129, 129, MR_KV_F16);
    check_attention(8, 8, 32, 100, 65, MR_KV_F32);
    check_attention(8, 8, 256, 50, 3, MR_KV_F32);
    /* the tensor-core prompt kernel: 64 queries a block, a partial last
     * block (100), chunks after cached tokens (P > n), GQA 8 and 4 (head
     * counts kept small where the float64 reference is long) */
    check_attention_tc(32, 4, 128, 64, 64, MR_KV_F32);
    check_attention_tc(32, 4, 128, 512, 512, MR_KV_F32);
    check_attention_tc(16, 4, 128, 512, 512, MR_KV_F16);
    check_attention_tc(32, 8, 128, 100, 100, MR_KV_F16);
    check_attention_tc(32, 4, 128, 764, 64, MR_KV_F32);
    check_attention_tc(32, 8, 128, 800, 100, MR_KV_F32);
    check_attention_tc(16, 2, 128, 1212, 512, MR_KV_F16);
    check_attention_prompt_chunks(gpu_attn_tc, "attention-prompt-inv-tc", 32, 8, 128, 300, MR_KV_F16);
    check_attention_prompt_chunks(gpu_attn_tc, "attention-prompt-inv-tc", 16, 4, 64, 200, MR_KV_F32);
    check_attention_prompt_chunks(gpu, "attention-prompt-inv", 32, 8, 128, 300, MR_KV_F16);
    check_attention_prompt_chunks(gpu, "attention-prompt-inv", 16, 2, 256, 130, MR_KV_BF16);
    check_attention_tc(16, 2, 256, 512, 512, MR_KV_F32);
    check_attention_tc(16, 4, 256, 100, 100, MR_KV_F16);
    check_attention_tc(16, 2, 256, 764, 64, MR_KV_F16);
    check_attention_tc(16, 4, 256, 800, 100, MR_KV_F32);
    check_attention_tc(8, 2, 256, 1212, 512, MR_KV_F32);
    check_attention_tc(16, 4, 64, 129, 129, MR_KV_BF16);
    check_attention_tc(8, 1, 128, 300, 200, MR_KV_BF16);
    check_attention_tc(8, 8, 32, 100, 65, MR_KV_F32); /* head_dim 32: the float32 kernel */
    check_attention_bad(gpu, "attention", 128, MR_KV_F32, 100, 2);
    check_attention_bad(gpu_attn_tc, "attention-tc", 128, MR_KV_F32, 100, 2);
    check_attention_bad(gpu_attn_tc, "attention-tc", 256, MR_KV_F32, 100, 2);
    /* deep in a context: queries past the first 1,024-position slice join
     * the records of several blocks (5 at 4,900..4,999; at 9,436..9,499 the
     * eight workers walk two slices each), against float64, the CPU backend,
     * and the same prompt cut into calls (1 .. 65 queries) bit for bit */
    check_attention(4, 2, 256, 5000, 100, MR_KV_F32);
    check_attention(2, 1, 128, 9500, 64, MR_KV_F16);
    check_attention(8, 2, 64, 2100, 600, MR_KV_BF16); /* a call of 600: one launch of 3 workers a tile */
    check_attention_prompt_chunks(gpu, "attention-prompt-inv", 4, 2, 256, 2600, MR_KV_F32);
    check_attention_prompt_chunks(gpu, "attention-prompt-inv", 2, 1, 128, 9000, MR_KV_F16);
    /* the same on the tensor-core kernel (its bound, its base-2 records) */
    check_attention_tc(4, 2, 256, 5000, 100, MR_KV_F32);
    check_attention_tc(2, 1, 128, 9500, 64, MR_KV_F16);
    check_attention_tc(8, 2, 64, 2100, 600, MR_KV_BF16);
    check_attention_prompt_chunks(gpu_attn_tc, "attention-prompt-inv-tc", 4, 2, 256, 2600, MR_KV_F16);
    check_attention_prompt_chunks(gpu_attn_tc, "attention-prompt-inv-tc", 2, 1, 128, 9000, MR_KV_F32);
    /* whole prompts from 0 past PF_SLICE in one call: the launch holds only
     * the workers its rows see (2 at 2,100 positions, 5 at 4,200), rows
     * before PF_SLICE written by worker 0 without records, the merge over
     * the rest; 4,200 in one call is six launches of 819 rows, the second
     * straddling position 1,024 */
    check_attention_on(gpu_attn_tc, "attention-tc", 2e-3, 2, 1, 128, 2100, 2100, MR_KV_F16, true);
    check_attention_on(gpu, "attention", 1e-5, 2, 1, 64, 2100, 2100, MR_KV_BF16, true);
    check_attention_prompt_chunks(gpu_attn_tc, "attention-prompt-inv-tc", 4, 1, 128, 4200, MR_KV_F16);
    check_attention_prompt_chunks(gpu, "attention-prompt-inv", 2, 1, 64, 4200, MR_KV_F16);
    /* a threshold's mix (the hybrids' default until run 211): float32
     * before MIX_FROM, tensor cores after; calls that straddle it (rows
     * 3,900..4,199), against float64, bit for bit per row with the kernel
     * its position names, and cut into calls */
    check_attention_on(gpu_attn_mix, "attention-mix", 2e-3, 4, 2, 256, 4200, 300, MR_KV_F32, true);
    check_attention_on(gpu_attn_mix, "attention-mix", 2e-3, 2, 1, 128, 5000, 1100, MR_KV_F16, true);
    check_attention_on(gpu_attn_mix, "attention-mix", 1e-5, 4, 2, 256, 3000, 200, MR_KV_BF16, true);
    check_attention_mix_rows(4, 2, 256, 4500, MR_KV_F16);
    check_attention_mix_rows(2, 1, 128, 4200, MR_KV_BF16);
    check_attention_prompt_chunks(gpu_attn_mix, "attention-prompt-inv-mix", 2, 1, 256, 4400, MR_KV_F16);
}

/* The checks in three parts that can run as separate processes at once
 * (the float64 references are single-threaded host work): PART_MM the
 * matrix products, PART_OPS the other ops, PART_Q8 the int8-activation
 * matvecs and the hybrid ops. */
enum { PART_MM = 1, PART_OPS = 2, PART_Q8 = 4 };

static void check_ops(int parts)
{
    for (int i = 0; i < N_TYPES && (parts & PART_MM); i++) {
        const tdesc *td = &TYPES[i];
        check_get_rows(td, 512, 37, 5);
        check_matmul(td, 512, 67, 1);
        check_matmul(td, 1024, 200, 3);
        check_matmul(td, 256, 130, 8);
        check_matmul(td, 512, 96, 21); /* a decode batch: 8 tokens a launch */
        check_matmul(td, 512, 96, 70); /* prompt path: dequantize + GEMM */
        check_matmul_id(td, 256, 64, 4, 2, 1, 1);
        check_matmul_id(td, 256, 64, 4, 2, 2, 3);
        check_matmul_id(td, 256, 64, 4, 2, 1, 21); /* a decode batch */
        check_matmul_id(td, 256, 64, 4, 2, 1, 70); /* prompt path: grouped by expert */
        check_matmul_id(td, 256, 64, 5, 3, 3, 66);
    }
    /* decode-sized shapes of the types the models use */
    int big[] = {MR_TYPE_Q4_K, MR_TYPE_Q6_K, MR_TYPE_Q8_0, MR_TYPE_BF16, MR_TYPE_Q5_K, MR_TYPE_IQ4_XS, MR_TYPE_Q4_0};
    for (size_t b = 0; b < sizeof big / sizeof big[0] && (parts & PART_MM); b++) {
        const tdesc *td = td_of(big[b]);
        check_matmul(td, 4096, 1024, 1);
        check_matmul(td, 12288, 256, 2);
        check_matmul_id(td, 2048, 768, 16, 8, 1, 1);
        check_matmul_id(td, 768, 2048, 16, 8, 8, 1);
        check_matmul(td, 4096, 512, 80);
        check_matmul_id(td, 2048, 768, 16, 8, 1, 16);
        check_matmul_id(td, 2048, 768, 16, 8, 1, 72);
        check_matmul_id(td, 768, 2048, 16, 8, 8, 72);
    }
    if (parts & PART_MM) {
        check_batch_invariance();
        check_matmul_multi_all();
        check_glu_all();
        check_moe_grouped();
        check_xm_quant_all();
        check_gemm_prompt();
        check_moe_ffn();
        check_prompt_rows();
        check_prompt_multi_all();
    }
    if (!(parts & PART_OPS))
        goto q8;
    check_rmsnorm(1, 4096);
    check_rmsnorm(7, 256);
    check_rmsnorm(3, 1000);
    check_rmsnorm(32, 128);
    check_rmsnorm(2, 2048);
    check_rmsnorm(1, 17000); /* longer than the register-held path */
    check_rmsnorm(3, 4098);  /* not a multiple of 4 */
    check_rmsnorm(130, 4096);
    check_rope(1, 32, 128, 128, MR_ROPE_NEOX);
    check_rope(9, 4, 64, 64, MR_ROPE_NEOX);
    check_rope(5, 8, 128, 64, MR_ROPE_NEOX);
    check_rope(5, 8, 64, 64, MR_ROPE_NORM);
    check_qk_norm_rope(1, 32, 8, 128, 128, MR_ROPE_NEOX);   /* Qwen3-8B decode */
    check_qk_norm_rope(1, 32, 4, 128, 128, MR_ROPE_NEOX);   /* 30B-A3B */
    check_qk_norm_rope(37, 16, 2, 256, 64, MR_ROPE_NEOX);   /* partial rotary, head 256 */
    check_qk_norm_rope(70, 8, 8, 64, 64, MR_ROPE_NORM);
    check_qk_norm_rope(150, 32, 4, 128, 128, MR_ROPE_NEOX); /* a prompt's rows, and in calls */
    check_qk_norm_rope(3, 5, 1, 96, 32, MR_ROPE_NEOX);      /* odd sizes */
    check_qk_norm_rope_kv(1, 32, 8, 128, MR_KV_F16, false); /* Qwen3-8B decode */
    check_qk_norm_rope_kv(5, 32, 4, 128, MR_KV_BF16, false);
    check_qk_norm_rope_kv(3, 8, 2, 64, MR_KV_F32, false);
    check_qk_norm_rope_kv(16, 32, 4, 128, MR_KV_F16, true);  /* a decode batch */
    check_qk_norm_rope_kv(3, 5, 1, 96, MR_KV_BF16, true);
    mr_kv_dtype dts[3] = {MR_KV_F32, MR_KV_F16, MR_KV_BF16};
    for (int d = 0; d < 3; d++) {
        check_attention(4, 2, 64, 1, 1, dts[d]);
        check_attention(4, 2, 64, 37, 1, dts[d]);
        check_attention(32, 8, 128, 1000, 1, dts[d]);
        check_attention(4, 2, 64, 130, 130, dts[d]);
        check_attention(16, 4, 128, 300, 7, dts[d]);
    }
    /* decode at depth: slices longer than the minimum chunk on the grouped
     * kernel (the 35B-A3B's 16/2 x 256, the 30B-A3B's 32/4 x 128), a
     * group of 2 and a head a block (MHA) */
    check_attention(16, 2, 256, 20000, 1, MR_KV_F32);
    check_attention(32, 4, 128, 9000, 2, MR_KV_F16);
    check_attention(6, 3, 64, 700, 3, MR_KV_BF16);
    check_attention(8, 8, 64, 300, 1, MR_KV_BF16);
    check_attn_merge();
    check_attention_prompts();
    for (int d = 0; d < 3; d++) check_attention_multi(32, 8, 128, dts[d]);
    check_attention_multi(4, 2, 64, MR_KV_F32);
    check_attention(4, 1, 32, 20, 2, MR_KV_F32);
    check_elementwise(1);
    check_elementwise(12288);
    check_elementwise(100003);
    check_moe(1, 4, 2, true, false);
    check_moe(9, 4, 2, true, true);
    check_moe(5, 128, 8, true, false);
    check_moe(5, 128, 8, false, true);
    check_moe(3, 60, 4, false, false);
    check_moe(3, 256, 8, true, false); /* 8 logits a lane (the 35B-A3B) */
    check_moe(2, 300, 10, true, true);  /* 16 a lane */
    check_moe(2, 64, 32, true, false);  /* every lane keeps a pick */
    check_route_rank_all();
    check_moe_tail_all();
    check_argmax(1, 151936, 0);
    check_argmax(16, 151936, 1); /* a decode batch's rows, ties across threads */
    check_argmax(4, 1024, 1);
    check_argmax(3, 17, 0);
    check_argmax(2, 5003, 1);    /* rows not 16-byte aligned: the scalar loads */
    check_argmax(3, 248320, 2);  /* NaN */
    check_argmax(2, 4099, 2);
    check_graph(gpu, "");
    check_pdl();
q8:
    if (!(parts & PART_Q8))
        return;
    check_q8_all();
    check_graph(q8_be[0], "-q8");
    if (cpu) check_hybrid_ops();
    check_sample_all();
}

/* The hybrid (Gated DeltaNet) ops against the CPU backend (part of "q8"). */
static void check_part_hybrid(void)
{
    if (cpu) check_hybrid_ops();
    else report("hybrid-ops", "no CPU backend to check against", 1.0, 0, 0.0);
}

/* The parts of one name that run several groups of checks. */
static void check_part_moe(void)
{
    check_moe_grouped();
    check_xm_quant_all();
}

static void check_part_prompt(void)
{
    check_gemm_prompt();
    check_moe_ffn();
    check_prompt_rows();
    check_prompt_multi_all();
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    rng_s ^= seed * 0x2545F4914F6CDD1Dull;
    if (!rng_s) rng_s = 1;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a crash still shows how far the checks got */
    if (!mr_backend_cuda_available()) {
        printf("kernel-check: no CUDA device: skipped\n");
        return 77;
    }
    types_init();
    /* Q4_K expert products on the 22-bit dp4a kernel in every backend below
     * (MEMRA_CUDA_XMM=0), so that its lines keep checking it; the
     * tensor-core kernel, the default, has the part "xmm" */
    setenv("MEMRA_CUDA_XMM", "0", 1);
    /* and the float16 / f16x3 prompt kernels for IQ4_XS, whose int8
     * tensor-core kernels (the default) have the part "xmp" */
    setenv("MEMRA_CUDA_XMP", "0", 1);
    /* and Q4_K's prompt experts on the float16 kernel of cu_gemm.cu (or
     * the part "xmp"'s int8 one), not the part "xmh"'s (the default) */
    setenv("MEMRA_CUDA_XMH", "0", 1);
    /* and the float decode kernels for dense Q4_K products, whose int8
     * tensor-core kernels (the default) have the part "xmd" */
    setenv("MEMRA_CUDA_XMD", "0", 1);
    /* and decode attention in blocks of at most 4 heads in every call: the
     * default's blocks of 8 for batches (the same bits) are checked against
     * them in the part "dectc", and the pairs' lines need blocks of 4 */
    setenv("MEMRA_CUDA_ATTN_DEC_TC_G8", "0", 1);
    /* the float32 decode kernels, whatever the caller's environment; the
     * int8-activation backends are made below */
    setenv("MEMRA_CUDA_MATVEC", "f32", 1);
    setenv("MEMRA_CUDA_GEMM", "f16", 1);
    setenv("MEMRA_CUDA_ATTN", "f32", 1);
    /* every backend but gpu_sg keeps prompt products of any size on the
     * GEMM path the lines were written for */
    setenv("MEMRA_CUDA_SMALL_GEMM", "1073741824", 1);
    gpu_sg = mr_backend_cuda_create(0, &err);
    if (!gpu_sg) die("cuda (small products in float32)");
    setenv("MEMRA_CUDA_SMALL_GEMM", "0", 1);
    gpu = mr_backend_cuda_create(0, &err);
    if (!gpu) die("cuda");
    unsetenv("MEMRA_CUDA_MATVEC");
    gpu_x24 = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_MATVEC", "f32", 1);
    if (!gpu_x24) die("cuda (default decode kernels)");
    setenv("MEMRA_CUDA_GDN_TILED", "0", 1);
    gpu_gdn1 = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_GDN_TILED");
    if (!gpu_gdn1) die("cuda (token-by-token scan)");
    gpu_gdn2 = backend_with("MEMRA_CUDA_GDN_TILED", "2"); /* tiles without fetching ahead */
    gpu_gdn4 = backend_with("MEMRA_CUDA_GDN_WARPS", "4");
    gpu_gdn4t = backend_with2("MEMRA_CUDA_GDN_WARPS", "4", "MEMRA_CUDA_GDN_TILED", "0");
    gpu_gdnb = backend_with("MEMRA_CUDA_GDN_LANES", "0");
    setenv("MEMRA_CUDA_ATTN", "tc", 1);
    gpu_attn_tc = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_ATTN", "f32", 1);
    if (!gpu_attn_tc) die("cuda (tensor-core attention)");
    unsetenv("MEMRA_CUDA_ATTN");
    char mix_from[16];
    snprintf(mix_from, sizeof mix_from, "%d", MIX_FROM);
    gpu_attn_mix = backend_with("MEMRA_CUDA_ATTN_TC_FROM", mix_from);
    setenv("MEMRA_CUDA_ATTN", "f32", 1);
    setenv("MEMRA_CUDA_GEMM", "f32", 1);
    setenv("MEMRA_CUDA_GENERIC", "1", 1);
    gpu_generic = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_GENERIC");
    if (!gpu_generic) die("cuda (generic)");
    /* the forced variants also take the 8-weight Q4_K lanes (the default
     * takes 16-weight lanes where the columns allow) */
    setenv("MEMRA_CUDA_Q4K_WIDE", "0", 1);
    setenv("MEMRA_CUDA_FAST_R", "4", 1);
    setenv("MEMRA_CUDA_GEMM", "tf32", 1);
    gpu_r4 = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_FAST_R", "2", 1);
    setenv("MEMRA_CUDA_GEMM", "f32", 1);
    gpu_r2 = mr_backend_cuda_create(0, &err);
    /* the same two with decode batches of experts on the per-pair path */
    setenv("MEMRA_CUDA_MOE_GROUPED", "0", 1);
    gpu_r2_pair = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_FAST_R", "4", 1);
    setenv("MEMRA_CUDA_GEMM", "tf32", 1);
    gpu_r4_pair = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_MOE_GROUPED");
    unsetenv("MEMRA_CUDA_FAST_R");
    unsetenv("MEMRA_CUDA_Q4K_WIDE");
    setenv("MEMRA_CUDA_GEMM", "f16x3", 1);
    setenv("MEMRA_CUDA_MOE_X3", "1", 1); /* the fused expert kernels in f16x3 too */
    gpu_x3 = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_MOE_X3");
    unsetenv("MEMRA_CUDA_GEMM");
    if (!gpu_r4 || !gpu_r2 || !gpu_r4_pair || !gpu_r2_pair) die("cuda (forced rows per block)");
    if (!gpu_x3) die("cuda (f16x3 GEMMs)");
    setenv("MEMRA_CUDA_MATVEC", "q8", 1);
    q8_be[0] = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_FAST_R", "4", 1);
    q8_be[1] = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_FAST_R", "2", 1);
    q8_be[2] = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_FAST_R");
    setenv("MEMRA_CUDA_MATVEC", "x24all", 1);
    q8_be[Q8_X24] = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_MATVEC");
    if (!q8_be[0] || !q8_be[1] || !q8_be[2] || !q8_be[Q8_X24]) die("cuda (q8 / x24 matvec)");
    cpu = mr_backend_cpu_create(&err);
    if (!cpu) die("cpu");
    mm_be[0] = gpu;
    mm_be[1] = gpu_r4;
    mm_be[2] = gpu_r2;
    mm_be[3] = gpu_generic;
    mm_be[4] = cpu;
    mm_be[5] = gpu_r4_pair;
    mm_be[6] = gpu_r2_pair;
    mm_be[7] = gpu_x3;
    printf("kernel-check seed %llu (GPU vs float64 host math and vs the CPU backend)\n",
           (unsigned long long)seed);
    printf("%-14s %-44s %10s %9s %5s\n", "op", "shape", "rel L2", "bound", "NaN");

    const char *part = argc > 2 ? argv[2] : "";
    const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {
        {"moe", check_part_moe},         {"prompt", check_part_prompt}, {"sample", check_sample_all},
        {"pdl", check_pdl},              {"attn", check_attention_prompts}, {"wide", check_wide_rows},
        {"early", check_early_weights},  {"loop", check_wide_loop},  {"tail", check_moe_tail_all},  {"xmq", check_xm_quant_all}, {"merge", check_attn_merge},
        {"route", check_route_rank_all}, {"hybrid", check_part_hybrid}, {"tiles", check_x24_tiles},
        {"xmm", check_xmm_all},          {"xmmt", check_xmm_tiles}, {"xmp", check_xmp_all}, {"xmd", check_xmd_all},
        {"xmh", check_xmh_all},          {"dectc", check_attn_dec_tc},
        {"multi", check_matmul_multi_all}, {"glu", check_glu_all}, {"pmulti", check_prompt_multi_all},
    };
    size_t pi = 0;
    while (pi < sizeof parts / sizeof parts[0] && strcmp(part, parts[pi].name)) pi++;
    if (pi < sizeof parts / sizeof parts[0])
        parts[pi].run();
    else
        check_ops(!strcmp(part, "mm") ? PART_MM : !strcmp(part, "ops") ? PART_OPS : !strcmp(part, "q8") ? PART_Q8
                                                                                   : PART_MM | PART_OPS | PART_Q8);

    printf("%d checks: %d passed, %d failed\n", n_pass + n_fail, n_pass, n_fail);
    if (cpu) cpu->destroy(cpu);
    for (int i = 0; i < N_Q8; i++) q8_be[i]->destroy(q8_be[i]);
    gpu_attn_tc->destroy(gpu_attn_tc);
    gpu_attn_mix->destroy(gpu_attn_mix);
    gpu_x24->destroy(gpu_x24);
    gpu_gdn1->destroy(gpu_gdn1);
    gpu_gdn2->destroy(gpu_gdn2);
    gpu_gdn4->destroy(gpu_gdn4);
    gpu_gdn4t->destroy(gpu_gdn4t);
    gpu_gdnb->destroy(gpu_gdnb);
    gpu_generic->destroy(gpu_generic);
    gpu_r2->destroy(gpu_r2);
    gpu_r4->destroy(gpu_r4);
    gpu_r2_pair->destroy(gpu_r2_pair);
    gpu_r4_pair->destroy(gpu_r4_pair);
    gpu_x3->destroy(gpu_x3);
    gpu_sg->destroy(gpu_sg);
    gpu->destroy(gpu);
    if (n_fail) {
        printf("FAILED\n");
        return 1;
    }
    printf("ALL GREEN\n");
    return 0;
}
#endif /* MR_HAVE_CUDA */

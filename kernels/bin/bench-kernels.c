/* bench-kernels: decode-shaped matvec timings against measured copy
 * bandwidth (the roofline for a memory-bound kernel), plus attention decode
 * and the expert products of a decode batch (matmul_id, grouped by expert
 * and one job per token-expert pair).
 * Weights are random valid blocks; several copies are rotated so that each
 * call reads from HBM, not from the 60 MB L2.
 *
 * Prompt attention: the float32 kernel against the tensor-core one.
 *
 * Prompt products ("gemm"): one 512-token prompt's dense and expert
 * products in each GEMM precision (MEMRA_CUDA_GEMM f16, f16x3, f32).
 *
 * Sampling: the sample op on rows of a 151,936-id vocabulary against what
 * the host path costs for the same rows (download, then worker/sample.c).
 *
 * Programmatic dependent launch ("pdl"): chains of dependent kernels
 * replayed as graphs with MEMRA_CUDA_PDL=0 and unset (bench_pdl).  With
 * PDL on (the default on sm_90+) the other lines time successive calls
 * that may overlap their ramps too; MEMRA_CUDA_PDL=0 in the environment
 * gives the plain launches for every line.
 *
 * Usage: bench-kernels [iters [moe|moe-sweep|attn|attn-decode|attn-streams|gdn|gemm|sample|pdl]]
 * (needs a CUDA device; "moe": only the expert products of decode batches,
 * "attn": only prompt attention, "attn-decode": only decode attention at
 * depth, "gdn": only the delta-rule scan, "gemm": only the prompt products, "sample": only
 * sampling, "pdl": only the PDL chains, "mv TYPE ROWS COLS [N]": one
 * matvec shape, "moe-sweep": the expert kernel from 8 to 32 tokens,
 * "attn-streams": only decode attention's 16-stream lines, the shared
 * prefix first, e.g. for a profiler) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/half.h"
#include "kernels/ops.h"
#include "worker/sample.h"
#ifdef MR_HAVE_CUDA
#include "kernels/cuda/cu_bench.h"
#include "kernels/cuda/cu_mvq8.h"
#endif

#ifndef MR_HAVE_CUDA
int main(void)
{
    printf("bench-kernels: built without CUDA\n");
    return 77;
}
#else

static uint64_t s = 88172645463325252ull;
static uint64_t rnd(void)
{
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

typedef struct {
    mr_backend *be;
    mr_weight *w;
    int nw, cur, n;
    float *x, *y;
} mv_arg;

static void run_mv(void *p)
{
    mv_arg *a = p;
    a->be->matmul(a->be, &a->w[a->cur], a->x, a->y, a->n);
    a->cur = (a->cur + 1) % a->nw;
}

static int block_of(int t, int *bb)
{
    switch (t) {
    case MR_TYPE_Q4_K: *bb = 144; return 256;
    case MR_TYPE_Q5_K: *bb = 176; return 256;
    case MR_TYPE_Q6_K: *bb = 210; return 256;
    case MR_TYPE_Q8_0: *bb = 34; return 32;
    case MR_TYPE_Q4_0: *bb = 18; return 32;
    case MR_TYPE_IQ4_XS: *bb = 136; return 256;
    case MR_TYPE_BF16: *bb = 2; return 1;
    case MR_TYPE_F32: *bb = 4; return 1;
    }
    return 0;
}

static void fill(uint8_t *p, size_t n, int type, int bb)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    if (type == MR_TYPE_BF16) {
        for (size_t i = 0; i + 1 < n; i += 2) p[i + 1] = (uint8_t)(0x3c + rnd() % 2); /* |v| ~ 0.01..0.03 */
        return;
    }
    if (type == MR_TYPE_F32) {
        for (size_t i = 0; i + 3 < n; i += 4) {
            const float v = (float)((int)(rnd() % 2001) - 1000) * 1e-5f;
            memcpy(p + i, &v, 4);
        }
        return;
    }
    int off[2] = {-1, -1};
    switch (type) {
    case MR_TYPE_Q4_K: case MR_TYPE_Q5_K: off[0] = 0; off[1] = 2; break;
    case MR_TYPE_Q6_K: off[0] = 208; break;
    default: off[0] = 0; break;
    }
    for (size_t b = 0; b + bb <= n; b += bb)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                uint16_t h = mr_f32_to_f16(0.001f + 0.001f * (rnd() % 8));
                p[b + off[k]] = (uint8_t)h;
                p[b + off[k] + 1] = (uint8_t)(h >> 8);
            }
}

static const char *type_name(int type)
{
    return type == MR_TYPE_Q4_K ? "Q4_K" : type == MR_TYPE_Q6_K ? "Q6_K" : type == MR_TYPE_Q8_0 ? "Q8_0" :
           type == MR_TYPE_BF16 ? "BF16" : type == MR_TYPE_Q5_K ? "Q5_K" : type == MR_TYPE_Q4_0 ? "Q4_0" :
           type == MR_TYPE_F32  ? "F32"  : "IQ4_XS";
}

/* A rows x cols matrix of blocks h loaded through be (exits on failure). */
static mr_weight bench_weight(mr_backend *be, const uint8_t *h, int type, int64_t rows, int64_t cols)
{
    int bb = 0, bel = block_of(type, &bb);
    mr_weight w = {"bench", type, cols, rows, 1, (size_t)(cols / bel) * bb, NULL, NULL};
    mr_err err;
    if (be->weight_load(be, &w, h, &err)) {
        fprintf(stderr, "weight_load: %s\n", err.msg);
        exit(1);
    }
    return w;
}

/* Weights in rotation (>= 512 MiB, so each call reads HBM) and the
 * activations of one shape, loaded through `be`; every CUDA backend of the
 * process can use them (they are device pointers on the same device). */
typedef struct {
    mr_backend *be;
    int type, nw, n;
    int64_t rows, cols;
    size_t bytes;
    mr_weight *w;
    float *x, *y;
} mv_set;

static void mv_load(mv_set *m, mr_backend *be, int type, int64_t rows, int64_t cols, int n)
{
    int bb = 0, be_ = block_of(type, &bb);
    size_t rb = (size_t)(cols / be_) * bb, bytes = rb * rows;
    int nw = (int)((512u << 20) / bytes) + 1; /* >= 512 MiB in rotation */
    if (nw > 64) nw = 64;
    if (nw < 2) nw = 2;
    uint8_t *h = malloc(bytes);
    mr_weight *w = calloc(nw, sizeof *w);
    mr_err err;
    for (int i = 0; i < nw; i++) {
        fill(h, bytes, type, bb);
        w[i] = bench_weight(be, h, type, rows, cols);
    }
    float *hx = malloc(cols * n * 4);
    for (int64_t i = 0; i < cols * n; i++) hx[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    float *x = be->alloc(be, cols * n * 4), *y = be->alloc(be, rows * n * 4);
    be->upload(be, x, hx, cols * n * 4, &err);
    free(h);
    free(hx);
    *m = (mv_set){be, type, nw, n, rows, cols, bytes, w, x, y};
}

static void mv_free(mv_set *m)
{
    for (int i = 0; i < m->nw; i++) m->be->weight_release(m->be, &m->w[i]);
    m->be->free(m->be, m->x);
    m->be->free(m->be, m->y);
    free(m->w);
}

static double median3(const double t[3])
{
    double a0 = t[0], a1 = t[1], a2 = t[2];
    return a0 > a1 ? (a1 > a2 ? a1 : (a0 > a2 ? a2 : a0)) : (a0 > a2 ? a0 : (a1 > a2 ? a2 : a1));
}

/* Seconds a call of fn(arg) on be takes: the median of 3 timed batches of
 * iters calls, each after `warm` untimed ones; exits on an error. */
static double call_median(mr_backend *be, void (*fn)(void *), void *arg, const char *label, int warm, int iters)
{
    mr_err err;
    double t[3];
    for (int r = 0; r < 3; r++) t[r] = mr_cuda_time(be, fn, arg, warm, iters);
    if (be->sync(be, &err)) {
        fprintf(stderr, "bench %s: %s\n", label, err.msg);
        exit(1);
    }
    return median3(t);
}

/* The same for be's matmul on the set. */
static double mv_median(mv_set *m, mr_backend *be, const char *label, int warm, int iters)
{
    mv_arg a = {be, m->w, m->nw, 0, m->n, m->x, m->y};
    return call_median(be, run_mv, &a, label, warm, iters);
}

/* Times be's matvec on the set's weights; prints one line. */
static double mv_time(mv_set *m, mr_backend *be, const char *label, int iters, double bw)
{
    double med = mv_median(m, be, label, 10, iters);
    double gbs = m->bytes / med / 1e9;
    printf("%-8s %-9s %7lld x %-6lld n=%d %9.0f KB %8.2f us %8.1f GB/s %6.1f%%\n", label, type_name(m->type),
           (long long)m->rows, (long long)m->cols, m->n, m->bytes / 1024.0, med * 1e6, gbs, 100.0 * gbs / bw);
    return med;
}

typedef struct {
    mr_backend *be;
    mr_weight *w;
    int32_t **ids;
    int nw, cur, n, k, xs;
    float *x, *y;
} id_arg;

static void run_id(void *p)
{
    id_arg *a = p;
    a->be->matmul_id(a->be, &a->w[a->cur], a->x, a->xs, a->ids[a->cur], a->k, a->y, a->n);
    a->cur = (a->cur + 1) % a->nw;
}

/* Expert products of decode batches of ns[] tokens, k of `mats` experts a
 * token picked at random (distinct), on each backend of be[] (same weights
 * and routings); xs input rows a token (1: gate/up, k: down).  Bandwidth
 * counts the bytes of the distinct experts a call reads. */
static void bench_id(mr_backend **be, const char **label, int nbe, int type, int64_t rows,
                     int64_t cols, int mats, int k, int xs, const int *ns, int nn, int iters, double bw,
                     bool flops)
{
    int bb = 0, be_ = block_of(type, &bb);
    size_t rb = (size_t)(cols / be_) * bb, mat = rb * rows, bytes = mat * mats;
    int nw = (int)((512u << 20) / bytes) + 1; /* >= 512 MiB in rotation */
    if (nw > 64) nw = 64;
    if (nw < 2) nw = 2;
    uint8_t *h = malloc(bytes);
    mr_weight *w = calloc((size_t)nw * nbe, sizeof *w);
    mr_err err;
    for (int i = 0; i < nw; i++) {
        fill(h, bytes, type, bb);
        for (int b = 0; b < nbe; b++) {
            mr_weight *wi = &w[b * nw + i];
            *wi = (mr_weight){"bench", type, cols, rows, mats, rb, NULL, NULL};
            if (be[b]->weight_load(be[b], wi, h, &err)) {
                fprintf(stderr, "weight_load: %s\n", err.msg);
                exit(1);
            }
        }
    }
    for (int ni = 0; ni < nn; ni++) {
        const int n = ns[ni];
        const size_t ib = (size_t)n * k * 4;
        int32_t **hids = calloc(nw, sizeof *hids), **ids = calloc((size_t)nw * nbe, sizeof *ids);
        double used = 0;
        for (int i = 0; i < nw; i++) {
            hids[i] = malloc(ib);
            char *hit = calloc(mats, 1);
            for (int t = 0; t < n; t++)
                for (int j = 0; j < k; j++) {
                    int32_t e;
                    int dup;
                    do {
                        e = (int32_t)(rnd() % mats);
                        dup = 0;
                        for (int q = 0; q < j; q++) dup |= hids[i][t * k + q] == e;
                    } while (dup);
                    hids[i][t * k + j] = e;
                    hit[e] = 1;
                }
            for (int e = 0; e < mats; e++) used += hit[e];
            free(hit);
            for (int b = 0; b < nbe; b++) {
                ids[b * nw + i] = be[b]->alloc(be[b], ib);
                if (!ids[b * nw + i] || be[b]->upload(be[b], ids[b * nw + i], hids[i], ib, &err)) {
                    fprintf(stderr, "bench %s: ids\n", label[b]);
                    exit(1);
                }
            }
        }
        used /= nw; /* distinct experts a call, on average */
        const double rbytes = used * mat;
        const size_t xb = (size_t)cols * n * xs * 4, yb = (size_t)rows * n * k * 4;
        float *hx = malloc(xb);
        for (size_t i = 0; i < xb / 4; i++) hx[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
        for (int b = 0; b < nbe; b++) {
            float *x = be[b]->alloc(be[b], xb), *y = be[b]->alloc(be[b], yb);
            if (!x || !y || be[b]->upload(be[b], x, hx, xb, &err)) {
                fprintf(stderr, "bench %s: inputs\n", label[b]);
                exit(1);
            }
            id_arg a = {be[b], w + b * nw, ids + b * nw, nw, 0, n, k, xs, x, y};
            double t[3];
            for (int r = 0; r < 3; r++) t[r] = mr_cuda_time(be[b], run_id, &a, 10, iters);
            if (be[b]->sync(be[b], &err)) {
                fprintf(stderr, "bench %s: %s\n", label[b], err.msg);
                exit(1);
            }
            double med = median3(t), gbs = rbytes / med / 1e9;
            if (flops)
                printf("%-9s %-7s %4d x %5lld x %-5lld k=%d n=%-4d %10.1f us %8.1f TFLOP/s  (%.1f experts used%s)\n",
                       label[b], type_name(type), mats, (long long)rows, (long long)cols, k, n, med * 1e6,
                       2.0 * rows * cols * n * k / med / 1e12, used, xs > 1 ? ", a row per pair" : "");
            else
                printf("%-8s %-9s %7lld x %-6lld n=%d %9.0f KB %8.2f us %8.1f GB/s %6.1f%%  %5.1f of %d experts, k=%d%s\n",
                       label[b], type_name(type), (long long)rows, (long long)cols, n, rbytes / 1024.0, med * 1e6,
                       gbs, 100.0 * gbs / bw, used, mats, k, xs > 1 ? ", a row per pair" : "");
            be[b]->free(be[b], x);
            be[b]->free(be[b], y);
            for (int i = 0; i < nw; i++) be[b]->free(be[b], ids[b * nw + i]);
        }
        for (int i = 0; i < nw; i++) free(hids[i]);
        free(hids);
        free(ids);
        free(hx);
    }
    for (int b = 0; b < nbe; b++)
        for (int i = 0; i < nw; i++) be[b]->weight_release(be[b], &w[b * nw + i]);
    free(w);
    free(h);
}

/* Qwen3-30B-A3B experts (gate/up Q4_K 768x2048, down Q6_K 2048x768 and, on
 * odd layers, Q4_K, k = 8 of 128) and Qwen3.6-35B-A3B experts (gate/up
 * IQ4_XS 512x2048, down 2048x512, k = 8 of 256): decode batches of 1, 4, 8,
 * 16, 64 tokens through the 22-bit kernel (the default), the float kernels
 * grouped by expert (MEMRA_CUDA_X24_MOE=0), the float kernels one job per
 * pair (and MEMRA_CUDA_MOE_GROUPED=0), and for Q4_K and Q6_K the tensor-core
 * kernel (cu_moemma.cu, their default; moe-x24 runs with MEMRA_CUDA_XMM=0). */
static int bench_moe(int iters, double cbw)
{
    mr_err err;
    mr_backend *be[4];
    const char *label[4] = {"moe-x24", "moe-grp", "moe-pair", "moe-xmm"};
    setenv("MEMRA_CUDA_XMM", "0", 1); /* moe-x24: the dp4a kernel */
    be[0] = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_X24_MOE", "0", 1);
    be[1] = be[0] ? mr_backend_cuda_create(0, &err) : NULL;
    setenv("MEMRA_CUDA_MOE_GROUPED", "0", 1);
    be[2] = be[1] ? mr_backend_cuda_create(0, &err) : NULL;
    unsetenv("MEMRA_CUDA_MOE_GROUPED");
    unsetenv("MEMRA_CUDA_X24_MOE");
    setenv("MEMRA_CUDA_XMM", "iq4", 1); /* every type it has, IQ4_XS included */
    be[3] = be[2] ? mr_backend_cuda_create(0, &err) : NULL;
    unsetenv("MEMRA_CUDA_XMM");
    if (!be[0] || !be[1] || !be[2] || !be[3]) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    const int ns[] = {1, 4, 8, 16, 64};
    /* the tensor-core kernel first in the Q4_K lines: a backend list of
     * moe-xmm, moe-x24 */
    mr_backend *bq[2] = {be[3], be[0]};
    const char *lq[2] = {label[3], label[0]};
    bench_id(bq, lq, 2, MR_TYPE_Q4_K, 768, 2048, 128, 8, 1, ns, 5, iters, cbw, false);
    bench_id(bq, lq, 2, MR_TYPE_Q4_K, 2048, 768, 128, 8, 8, ns, 5, iters, cbw, false);
    bench_id(bq, lq, 2, MR_TYPE_Q6_K, 2048, 768, 128, 8, 8, ns, 5, iters, cbw, false);
    bench_id(bq, lq, 2, MR_TYPE_IQ4_XS, 512, 2048, 256, 8, 1, ns, 5, iters, cbw, false);
    bench_id(bq, lq, 2, MR_TYPE_IQ4_XS, 2048, 512, 256, 8, 8, ns, 5, iters, cbw, false);
    bench_id(be, label, 3, MR_TYPE_Q6_K, 2048, 768, 128, 8, 8, ns, 5, iters, cbw, false);
    bench_id(be, label, 3, MR_TYPE_IQ4_XS, 512, 2048, 256, 8, 1, ns, 5, iters, cbw, false);
    bench_id(be, label, 3, MR_TYPE_IQ4_XS, 2048, 512, 256, 8, 8, ns, 5, iters, cbw, false);
    for (int b = 3; b >= 0; b--) be[b]->destroy(be[b]);
    return 0;
}

/* The tensor-core expert kernel (the default) at the 30B-A3B's gate and
 * Q4_K down shapes for decode batches of 8 to 32 tokens, every second
 * count: whether its time steps where its blocks pass whole waves of
 * resident blocks, or grows with the bytes (GPU-NOTES 109). */
static int bench_moe_sweep(int iters, double cbw)
{
    mr_err err;
    mr_backend *be = mr_backend_cuda_create(0, &err);
    if (!be) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    const char *label[1] = {"moe-xmm"};
    int ns[13];
    for (int i = 0; i < 13; i++) ns[i] = 8 + 2 * i;
    bench_id(&be, label, 1, MR_TYPE_Q4_K, 768, 2048, 128, 8, 1, ns, 13, iters, cbw, false);
    bench_id(&be, label, 1, MR_TYPE_Q4_K, 2048, 768, 128, 8, 8, ns, 13, iters, cbw, false);
    be->destroy(be);
    return 0;
}

/* One 512-token prompt's products in each GEMM precision, one backend a
 * mode (MEMRA_CUDA_GEMM f16, f16x3, f32; the hybrids run f16x3 through
 * be->prefer_float32): dense Q4_K 4096 x 2048 and 2048 x 4096, IQ4_XS
 * 8192 x 2048 (the 35B-A3B's widest projection), and expert products with
 * k = 8 distinct random experts a token: the 35B-A3B's IQ4_XS gate/up
 * (256 x 512 x 2048) and down (256 x 2048 x 512, an input row a pair) and
 * the Qwen3-30B-A3B's Q4_K gate/up (128 x 768 x 2048).  FLOP: 2 rows cols n
 * (experts: times k). */
/* Small prompt products (cu_sgemm.cu): the hybrids' and routers' shapes in
 * float32 sums against the GEMM path (MEMRA_CUDA_SMALL_GEMM=0), in f16 and
 * f16x3 modes. */
static void bench_small_gemm(int n, int iters)
{
    static const char *mode[2] = {"f16", "f16x3"};
    mr_backend *be[2][2]; /* [mode][small path] */
    mr_err err;
    for (int md = 0; md < 2; md++)
        for (int sp = 0; sp < 2; sp++) {
            setenv("MEMRA_CUDA_GEMM", mode[md], 1);
            setenv("MEMRA_CUDA_SMALL_GEMM", sp ? "1048576" : "0", 1); /* rows: every shape below */
            be[md][sp] = mr_backend_cuda_create(0, &err);
            if (!be[md][sp]) {
                fprintf(stderr, "cuda (small GEMM): %s\n", err.msg);
                exit(1);
            }
        }
    unsetenv("MEMRA_CUDA_GEMM");
    unsetenv("MEMRA_CUDA_SMALL_GEMM");
    struct { int type; int64_t rows, cols; } sh[] = {
        {MR_TYPE_IQ4_XS, 32, 2048}, {MR_TYPE_IQ4_XS, 512, 2048}, {MR_TYPE_IQ4_XS, 2048, 512},
        {MR_TYPE_F32, 1, 2048}, {MR_TYPE_F32, 256, 2048}, {MR_TYPE_F32, 128, 2048}, {MR_TYPE_Q4_K, 512, 2048},
        {MR_TYPE_Q8_0, 512, 2048},
    };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        mv_set m;
        mv_load(&m, be[0][0], sh[i].type, sh[i].rows, sh[i].cols, n);
        for (int md = 0; md < 2; md++) {
            double tt[2];
            for (int sp = 0; sp < 2; sp++) tt[sp] = mv_median(&m, be[md][sp], "small GEMM", 3, iters);
            printf("small-%-5s %-7s %11lld x %-15lld n=%-4d gemm %8.1f us  float32 %8.1f us  %.2fx\n", mode[md],
                   type_name(sh[i].type), (long long)sh[i].rows, (long long)sh[i].cols, n, tt[0] * 1e6, tt[1] * 1e6,
                   tt[0] / tt[1]);
        }
        mv_free(&m);
    }
    for (int md = 0; md < 2; md++)
        for (int sp = 0; sp < 2; sp++) be[md][sp]->destroy(be[md][sp]);
}

static int bench_gemm(int iters, double cbw)
{
    /* float16 through k_hgemm (every row the same bits in any call), the
     * same through cuBLAS (MEMRA_CUDA_HGEMM=cublas), f16x3, f32 */
    static const char *mode[4] = {"f16", "f16", "f16x3", "f32"};
    const char *label[4] = {"gemm-f16", "gemm-cublas", "gemm-x3", "gemm-f32"};
    mr_backend *be[4];
    mr_err err;
    for (int i = 0; i < 4; i++) {
        setenv("MEMRA_CUDA_GEMM", mode[i], 1);
        if (i == 1) setenv("MEMRA_CUDA_HGEMM", "cublas", 1);
        be[i] = mr_backend_cuda_create(0, &err);
        unsetenv("MEMRA_CUDA_HGEMM");
        if (!be[i]) {
            fprintf(stderr, "cuda (MEMRA_CUDA_GEMM=%s): %s\n", mode[i], err.msg);
            return 1;
        }
    }
    unsetenv("MEMRA_CUDA_GEMM");
    const int n = 512;
    printf("%-11s %-7s %-27s %-6s %13s %16s\n", "mode", "type", "shape", "n", "time", "rate");
    struct { int type; int64_t rows, cols; } dn[] = {
        {MR_TYPE_Q4_K, 4096, 2048}, {MR_TYPE_Q4_K, 2048, 4096}, {MR_TYPE_IQ4_XS, 8192, 2048},
        {MR_TYPE_Q4_K, 4096, 4096}, {MR_TYPE_Q4_K, 12288, 4096}, {MR_TYPE_Q6_K, 4096, 12288},
        {MR_TYPE_Q4_K, 1024, 4096},
    };
    for (size_t i = 0; i < sizeof dn / sizeof dn[0]; i++) {
        mv_set m;
        mv_load(&m, be[0], dn[i].type, dn[i].rows, dn[i].cols, n); /* device pointers: every backend reads them */
        double tt[4];
        for (int b = 0; b < 4; b++) {
            tt[b] = mv_median(&m, be[b], label[b], 3, iters);
            printf("%-11s %-7s %11lld x %-15lld n=%-4d %10.1f us %8.1f TFLOP/s\n", label[b], type_name(dn[i].type),
                   (long long)dn[i].rows, (long long)dn[i].cols, n, tt[b] * 1e6,
                   2.0 * dn[i].rows * dn[i].cols * n / tt[b] / 1e12);
        }
        printf("%-11s k_hgemm %.2fx the time of cuBLAS; f16x3 %.2fx the time of f16, f32 %.2fx the time of f16x3\n",
               "", tt[0] / tt[1], tt[2] / tt[0], tt[3] / tt[2]);
        mv_free(&m);
    }
    bench_small_gemm(n, iters);
    const int ns[1] = {n};
    mr_backend *bx[3] = {be[0], be[2], be[3]};
    const char *lx[3] = {label[0], label[2], label[3]};
    bench_id(bx, lx, 3, MR_TYPE_IQ4_XS, 512, 2048, 256, 8, 1, ns, 1, iters, cbw, true);
    bench_id(bx, lx, 3, MR_TYPE_IQ4_XS, 2048, 512, 256, 8, 8, ns, 1, iters, cbw, true);
    bench_id(bx, lx, 3, MR_TYPE_Q4_K, 768, 2048, 128, 8, 1, ns, 1, iters, cbw, true);
    for (int i = 3; i >= 0; i--) be[i]->destroy(be[i]);
    return 0;
}

/* Prompt attention: n queries of one sequence at positions start..start+n-1
 * over a cache filled with random K/V, the float32 kernel against the
 * tensor-core one (MEMRA_CUDA_ATTN=f32 / tc).  FLOP counted: 4 n ctx D
 * heads with ctx the mean visible length start + (n+1)/2 (Q K^T and P V,
 * 2 each per multiply-add, causal). */
typedef struct {
    mr_backend *be;
    mr_kv_cache *kv;
    int32_t *table, *pos;
    float *q, *out;
    int n, heads;
    float scale;
} att_arg;

static void run_att(void *p)
{
    att_arg *a = p;
    a->be->attention(a->be, a->kv, 0, a->table, a->q, a->pos, a->n, a->heads, a->scale, a->out);
}

static void bench_attn_shape(mr_backend *be[2], const char *const label[2], int heads, int kvh, int D, int start,
                             int n, mr_kv_dtype dtype, int iters)
{
    mr_err err;
    const int bt = 16, P = start + n, nblk = (P + bt - 1) / bt;
    const int kvdim = kvh * D;
    const size_t kvn = (size_t)nblk * bt * kvdim, qn = (size_t)n * heads * D;
    float *h = malloc((kvn > qn ? kvn : qn) * 4);
    int32_t *tab = malloc((size_t)nblk * 4), *pos = malloc((size_t)n * 4);
    if (!h || !tab || !pos) {
        fprintf(stderr, "bench attention: host memory\n");
        exit(1);
    }
    for (int i = 0; i < nblk; i++) tab[i] = i;
    for (int i = 0; i < n; i++) pos[i] = start + i;
    for (size_t i = 0; i < (kvn > qn ? kvn : qn); i++) h[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    const double ctx = start + (n + 1) / 2.0;
    const double flop = 4.0 * n * ctx * D * heads;
    /* the cache's bytes: float32 as they are, 16-bit types converted */
    const size_t esz = dtype == MR_KV_F32 ? 4 : 2;
    uint16_t *h16 = NULL;
    if (esz == 2) {
        h16 = malloc(kvn * 2);
        if (!h16) {
            fprintf(stderr, "bench attention: host memory\n");
            exit(1);
        }
        for (size_t i = 0; i < kvn; i++) h16[i] = dtype == MR_KV_F16 ? mr_f32_to_f16(h[i]) : mr_f32_to_bf16(h[i]);
    }
    const void *kvh_src = esz == 2 ? (const void *)h16 : (const void *)h;
    double t[2] = {0, 0};
    for (int b = 0; b < 2; b++) {
        mr_kv_cache kv = {.n_layers = 1, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh,
                          .head_dim = D, .dtype = dtype};
        if (be[b]->kv_create(be[b], &kv, &err)) {
            printf("attn     skipped h=%d/%d D=%d start=%d n=%d: %s\n", heads, kvh, D, start, n, err.msg);
            free(h); free(h16); free(tab); free(pos);
            return;
        }
        int32_t *dt = be[b]->alloc(be[b], (size_t)nblk * 4), *dp = be[b]->alloc(be[b], (size_t)n * 4);
        float *dq = be[b]->alloc(be[b], qn * 4), *dout = be[b]->alloc(be[b], qn * 4);
        if (!dt || !dp || !dq || !dout || be[b]->upload(be[b], kv.k[0], kvh_src, kvn * esz, &err) ||
            be[b]->upload(be[b], kv.v[0], kvh_src, kvn * esz, &err) ||
            be[b]->upload(be[b], dt, tab, (size_t)nblk * 4, &err) ||
            be[b]->upload(be[b], dp, pos, (size_t)n * 4, &err) || be[b]->upload(be[b], dq, h, qn * 4, &err)) {
            fprintf(stderr, "bench attention: device memory\n");
            exit(1);
        }
        att_arg a = {be[b], &kv, dt, dp, dq, dout, n, heads, 1.0f / sqrtf((float)D)};
        t[b] = call_median(be[b], run_att, &a, "attention", 1, iters);
        printf("attn-%-4s h=%d/%d D=%d %s start=%-6d n=%-4d %10.1f us %7.1f TFLOP/s %7.1f GB/s of K/V\n", label[b],
               heads, kvh, D, esz == 4 ? "f32" : dtype == MR_KV_F16 ? "f16" : "bf16", start, n, t[b] * 1e6,
               flop / t[b] / 1e12, 2.0 * (double)esz * ctx * kvdim / t[b] / 1e9);
        be[b]->free(be[b], dt); be[b]->free(be[b], dp); be[b]->free(be[b], dq); be[b]->free(be[b], dout);
        be[b]->kv_destroy(be[b], &kv);
    }
    printf("attn     h=%d/%d D=%d start=%d n=%d: %s %.2fx %s\n", heads, kvh, D, start, n, label[1], t[0] / t[1],
           label[0]);
    free(h); free(h16); free(tab); free(pos);
}

/* Decode steps of several streams (attention_multi, one row a stream),
 * as the scheduler's batches are: stream i has shared + own + i positions,
 * its first shared positions in blocks every stream's table names (the
 * prefix cache's blocks), the rest in blocks of its own.  The shared-prefix
 * serving shape is 16 streams of 4,096 + ~800; shared 0 is a batch of
 * unrelated prompts. */
typedef struct {
    mr_backend *be;
    mr_kv_cache *kv;
    int32_t **tables, *pos;
    float *q, *out;
    int n, heads;
    float scale;
} att_multi_arg;

static void run_att_multi(void *p)
{
    att_multi_arg *a = p;
    a->be->attention_multi(a->be, a->kv, 0, (const int32_t *const *)a->tables, a->q, a->pos, a->n, a->heads,
                           a->scale, a->out);
}

static void bench_attn_streams(mr_backend *be[2], const char *const label[2], int heads, int kvh, int D,
                               int shared, int own, int ns, int iters)
{
    mr_err err;
    const int bt = 16, sb = shared / bt; /* shared is a whole number of blocks */
    const int per = (shared + own + ns + bt - 1) / bt; /* a stream's table */
    const int nblk = sb + ns * (per - sb), kvdim = kvh * D;
    const size_t kvn = (size_t)nblk * bt * kvdim, qn = (size_t)ns * heads * D;
    float *h = malloc(qn * 4);
    uint16_t *h16 = malloc(kvn * 2);
    int32_t *tab = malloc((size_t)ns * per * 4), *pos = malloc((size_t)ns * 4);
    if (!h || !h16 || !tab || !pos) {
        fprintf(stderr, "bench attention: host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < kvn; i++) h16[i] = mr_f32_to_f16((float)((int)(rnd() % 2001) - 1000) / 1000.0f);
    for (size_t i = 0; i < qn; i++) h[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    double kv_bytes = 0; /* what the rows see, shared blocks counted once */
    for (int t = 0; t < ns; t++) {
        pos[t] = shared + own + t;
        for (int b = 0; b < per; b++) tab[t * per + b] = b < sb ? b : sb + t * (per - sb) + (b - sb);
        kv_bytes += 2.0 * 2 * (double)(pos[t] + 1 - shared) * kvdim;
    }
    kv_bytes += 2.0 * 2 * (double)shared * kvdim;
    double t2[2] = {0, 0};
    for (int b = 0; b < 2; b++) {
        mr_kv_cache kv = {.n_layers = 1, .n_blocks = nblk, .block_tokens = bt, .n_kv_heads = kvh,
                          .head_dim = D, .dtype = MR_KV_F16};
        if (be[b]->kv_create(be[b], &kv, &err)) {
            printf("attn     skipped streams=%d h=%d/%d D=%d: %s\n", ns, heads, kvh, D, err.msg);
            break;
        }
        int32_t *dt = be[b]->alloc(be[b], (size_t)ns * per * 4), *dp = be[b]->alloc(be[b], (size_t)ns * 4);
        int32_t **dtabs = be[b]->alloc(be[b], (size_t)ns * sizeof(int32_t *));
        int32_t **htabs = malloc((size_t)ns * sizeof(int32_t *));
        float *dq = be[b]->alloc(be[b], qn * 4), *dout = be[b]->alloc(be[b], qn * 4);
        if (!htabs || !dt || !dp || !dtabs || !dq || !dout) {
            fprintf(stderr, "bench attention: device memory\n");
            exit(1);
        }
        for (int t = 0; t < ns; t++) htabs[t] = dt + (size_t)t * per;
        if (be[b]->upload(be[b], kv.k[0], h16, kvn * 2, &err) || be[b]->upload(be[b], kv.v[0], h16, kvn * 2, &err) ||
            be[b]->upload(be[b], dt, tab, (size_t)ns * per * 4, &err) ||
            be[b]->upload(be[b], dtabs, htabs, (size_t)ns * sizeof(int32_t *), &err) ||
            be[b]->upload(be[b], dp, pos, (size_t)ns * 4, &err) || be[b]->upload(be[b], dq, h, qn * 4, &err)) {
            fprintf(stderr, "bench attention: upload: %s\n", err.msg);
            exit(1);
        }
        att_multi_arg a = {be[b], &kv, dtabs, dp, dq, dout, ns, heads, 1.0f / sqrtf((float)D)};
        t2[b] = call_median(be[b], run_att_multi, &a, "attention", 1, iters);
        printf("attn-%-4s streams=%d h=%d/%d D=%d f16 shared=%-5d own=%-5d %10.1f us %7.1f GB/s of K/V\n", label[b],
               ns, heads, kvh, D, shared, own, t2[b] * 1e6, kv_bytes / t2[b] / 1e9);
        be[b]->free(be[b], dt); be[b]->free(be[b], dp); be[b]->free(be[b], dtabs); be[b]->free(be[b], dq);
        be[b]->free(be[b], dout);
        be[b]->kv_destroy(be[b], &kv);
        free(htabs);
    }
    if (t2[0] > 0 && t2[1] > 0)
        printf("attn     streams=%d h=%d/%d D=%d shared=%d own=%d: %s %.2fx %s\n", ns, heads, kvh, D, shared, own,
               label[1], t2[0] / t2[1], label[0]);
    free(h); free(h16); free(tab); free(pos);
}

/* Qwen3-30B-A3B (32 heads over 4 KV heads, D 128): a 512-token prompt and
 * the last 256 tokens of a 4,860-token one; the 35B hybrid's attention
 * layers (16 over 2, D 256): 512 tokens from 0 and after 64 Ki; the deep
 * shapes again on a float16 cache (the tensor-core kernel copies its rows
 * without converting them), and whole prompts from 0 on it.
 * MEMRA_CUDA_FATTN=wmma in the environment times the previous tensor-core
 * kernel on the "tc" lines. */
static int bench_attn(int iters)
{
    mr_err err;
    mr_backend *be[2];
    setenv("MEMRA_CUDA_ATTN", "f32", 1);
    be[0] = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_ATTN", "tc", 1);
    be[1] = be[0] ? mr_backend_cuda_create(0, &err) : NULL;
    unsetenv("MEMRA_CUDA_ATTN");
    if (!be[0] || !be[1]) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    int it = iters / 20 > 2 ? iters / 20 : 2;
    static const char *const lab[2] = {"f32", "tc"};
    bench_attn_shape(be, lab, 32, 4, 128, 0, 512, MR_KV_F32, it);
    bench_attn_shape(be, lab, 32, 4, 128, 4604, 256, MR_KV_F32, it);
    bench_attn_shape(be, lab, 32, 4, 128, 0, 4096, MR_KV_F32, 2);
    bench_attn_shape(be, lab, 16, 2, 256, 0, 512, MR_KV_F32, it);
    bench_attn_shape(be, lab, 16, 2, 256, 65536, 512, MR_KV_F32, 2);
    bench_attn_shape(be, lab, 32, 4, 128, 4604, 256, MR_KV_F16, it);
    bench_attn_shape(be, lab, 16, 2, 256, 65536, 512, MR_KV_F16, 2);
    /* whole prompts from position 0 on the float16 cache (the serving
     * default): one call of 512, 2,048 and 8,192 queries */
    bench_attn_shape(be, lab, 32, 4, 128, 0, 512, MR_KV_F16, it);
    bench_attn_shape(be, lab, 32, 4, 128, 0, 2048, MR_KV_F16, it);
    bench_attn_shape(be, lab, 32, 4, 128, 0, 8192, MR_KV_F16, 2);
    be[1]->destroy(be[1]);
    be[0]->destroy(be[0]);
    return 0;
}

/* Decode attention: one query row, or a few of one sequence, at depth; the
 * grouped float kernel (MEMRA_CUDA_ATTN_DEC_TC=off) against the same
 * launches with every row of a float16 cache on the tensor cores (other
 * caches take the float kernel in both columns).  The per-head
 * kernel of run 59 (MEMRA_CUDA_ATTN_GQA=0) is left out.  GB/s: the K/V
 * bytes the rows see over the time. */
static int bench_attn_decode(int iters, bool streams_only)
{
    mr_err err;
    mr_backend *be[2];
    setenv("MEMRA_CUDA_ATTN_DEC_TC", "off", 1);
    be[0] = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_ATTN_DEC_TC", "0", 1);
    be[1] = be[0] ? mr_backend_cuda_create(0, &err) : NULL;
    unsetenv("MEMRA_CUDA_ATTN_DEC_TC");
    if (!be[0] || !be[1]) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    static const char *const lab[2] = {"gqa", "tc"};
    static const struct { int heads, kvh, D, start, n; mr_kv_dtype dt; } sh[] = {
        {32, 8, 128, 1023, 1, MR_KV_F32},  {32, 8, 128, 16383, 1, MR_KV_F32}, {32, 4, 128, 16383, 1, MR_KV_F32},
        {32, 4, 128, 1023, 16, MR_KV_F32}, {16, 2, 256, 8191, 1, MR_KV_F32},  {16, 2, 256, 65535, 1, MR_KV_F32},
        {16, 2, 256, 262143, 1, MR_KV_F32}, {16, 2, 256, 65535, 4, MR_KV_F32},
        /* float16 caches (the CUDA default since run 194): one token from the
         * first slices to 256k, and 16 rows at the gateway's ~550 positions
         * and the shared-prefix shape's ~4,900 */
        {32, 4, 128, 127, 1, MR_KV_F16},   {32, 4, 128, 1023, 1, MR_KV_F16},  {32, 4, 128, 8191, 1, MR_KV_F16},
        {32, 8, 128, 16383, 1, MR_KV_F16}, {32, 4, 128, 533, 16, MR_KV_F16},  {32, 4, 128, 4883, 16, MR_KV_F16},
        {16, 2, 256, 8191, 1, MR_KV_F16},  {16, 2, 256, 65535, 1, MR_KV_F16}, {16, 2, 256, 262143, 1, MR_KV_F16},
        {16, 2, 256, 262143, 1, MR_KV_BF16},
    };
    if (!streams_only)
        for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
            bench_attn_shape(be, lab, sh[i].heads, sh[i].kvh, sh[i].D, sh[i].start, sh[i].n, sh[i].dt, iters);
    /* 16 streams: the shared-prefix serving shape (4,096 shared + ~770 of
     * their own) and C = 16 with 512-token prompts (~530, nothing shared) */
    bench_attn_streams(be, lab, 32, 4, 128, 4096, 768, 16, iters);
    bench_attn_streams(be, lab, 32, 4, 128, 0, 533, 16, iters);
    bench_attn_streams(be, lab, 32, 8, 128, 4096, 768, 16, iters);
    be[1]->destroy(be[1]);
    be[0]->destroy(be[0]);
    return 0;
}

/* ---- the gated delta-rule scan (hybrid models) ----
 * gdn_scan at the Qwen3.6-35B-A3B shape (16 key / 32 value heads of 128)
 * for 1, 16 and 512 tokens a call, token by token (MEMRA_CUDA_GDN_TILED=0)
 * and in tiles (the default): median of 3 event-timed batches. */
typedef struct {
    mr_backend *be;
    const float *qkv, *al, *bt, *a, *dt;
    float *st, *out;
    int n;
} gdn_arg;

static void run_gdn(void *p)
{
    gdn_arg *g = p;
    g->be->gdn_scan(g->be, g->qkv, 2 * 16 * 128 + 32 * 128, g->al, g->bt, g->a, g->dt, g->st, g->n, 16, 32, 128,
                    128, 1e-6f, g->out);
}

static float *gdn_buf(mr_backend *be, size_t n, float scale, float shift)
{
    float *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = shift + scale * ((float)(rnd() >> 40) / 16777216.0f - 0.5f);
    mr_err err;
    float *d = be->alloc(be, n * sizeof *d);
    if (!d || be->upload(be, d, h, n * sizeof *h, &err)) {
        fprintf(stderr, "gdn bench: alloc/upload failed\n");
        exit(1);
    }
    free(h);
    return d;
}

static int bench_gdn(int iters)
{
    mr_err err;
    mr_backend *be[3];
    setenv("MEMRA_CUDA_GDN_TILED", "0", 1);
    be[0] = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_GDN_TILED");
    setenv("MEMRA_CUDA_GDN_LANES", "0", 1);
    be[1] = be[0] ? mr_backend_cuda_create(0, &err) : NULL;
    unsetenv("MEMRA_CUDA_GDN_LANES");
    be[2] = be[1] ? mr_backend_cuda_create(0, &err) : NULL;
    if (!be[0] || !be[1] || !be[2]) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    /* token by token; tiles whose tokens take a barrier each
     * (MEMRA_CUDA_GDN_LANES=0); tiles in lane groups (the default) */
    static const char *const lab[3] = {"token", "tiled", "lanes"};
    const int ns[5] = {1, 5, 16, 512, 2048}, stride = 2 * 16 * 128 + 32 * 128;
    for (int k = 0; k < 5; k++) {
        double t[3];
        for (int b = 0; b < 3; b++) {
            const int n = ns[k];
            gdn_arg g = {be[b], gdn_buf(be[b], (size_t)n * stride, 2.0f, 0.0f), gdn_buf(be[b], (size_t)n * 32, 2.0f, 0.0f),
                         gdn_buf(be[b], (size_t)n * 32, 2.0f, 0.0f), gdn_buf(be[b], 32, 1.0f, -1.0f),
                         gdn_buf(be[b], 32, 1.0f, 0.0f), gdn_buf(be[b], (size_t)32 * 128 * 128, 0.1f, 0.0f),
                         gdn_buf(be[b], (size_t)n * 32 * 128, 0.0f, 0.0f), n};
            double r[3];
            for (int i = 0; i < 3; i++) r[i] = mr_cuda_time(be[b], run_gdn, &g, 3, iters);
            t[b] = r[0] < r[1] ? (r[1] < r[2] ? r[1] : (r[0] < r[2] ? r[2] : r[0]))
                               : (r[0] < r[2] ? r[0] : (r[1] < r[2] ? r[2] : r[1]));
            printf("gdn-%-5s h=16/32 d=128 n=%-4d %10.1f us  %8.3f us a token\n", lab[b], n, 1e6 * t[b],
                   1e6 * t[b] / n);
            be[b]->free(be[b], (void *)g.qkv); be[b]->free(be[b], (void *)g.al); be[b]->free(be[b], (void *)g.bt);
            be[b]->free(be[b], (void *)g.a); be[b]->free(be[b], (void *)g.dt); be[b]->free(be[b], g.st);
            be[b]->free(be[b], g.out);
        }
        printf("gdn      n=%d: tiled %.2fx token, lanes %.2fx tiled\n", ns[k], t[0] / t[1], t[1] / t[2]);
    }
    for (int b = 2; b >= 0; b--) be[b]->destroy(be[b]);
    return 0;
}

/* ---- sampling ---- */

typedef struct {
    mr_backend *be;
    float *l;
    int n, V;
    const mr_sample_row *rows;
    const int32_t *add;
    int32_t *ids;
} samp_arg;

static void run_samp(void *p)
{
    samp_arg *a = p;
    a->be->sample(a->be, a->l, a->n, a->V, a->rows, a->add, a->ids);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float gauss(void)
{
    double u = ((rnd() >> 11) + 1.0) / 9007199254740993.0, v = (rnd() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Per parameter set and rows n = 1, 16, 64 of 151,936 logits shaped like a
 * language model's (a N(0, 2.5) body, 24 ids at 8..18): the op's time per
 * call (a replayed graph, as in a decode step; penalised rows carry a
 * 1,000-id prompt in their tables and add one id a call) against the host
 * path's for the same rows (download the rows, then mr_sample each with
 * its 1,000-id prompt), which the scheduler runs today. */
static int bench_sample(int iters)
{
    mr_err err;
    mr_backend *be = mr_backend_cuda_create(0, &err);
    if (!be || !be->sample) {
        fprintf(stderr, "cuda: %s\n", be ? "no sample op" : err.msg);
        return 1;
    }
    enum { V = 151936, NMAX = 64, NP = 1000 };
    struct { const char *name; mr_sample_params p; } sets[] = {
        {"greedy+pen", {.temperature = 0.0f, .presence_penalty = 0.5f, .repetition_penalty = 1.1f}},
        {"T1", {.temperature = 1.0f}},
        {"T.7-k20-p.8", {.temperature = 0.7f, .top_k = 20, .top_p = 0.8f}},
        {"T.8-p.95", {.temperature = 0.8f, .top_p = 0.95f}},
        {"T.7-minp.05", {.temperature = 0.7f, .min_p = 0.05f}},
        {"T.7-k40-p.95+pen", {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .presence_penalty = 0.5f,
                              .frequency_penalty = 0.2f, .repetition_penalty = 1.1f}},
    };
    float *x = malloc(sizeof(float) * V * NMAX), *h = malloc(sizeof(float) * V * NMAX);
    for (size_t i = 0; i < (size_t)V * NMAX; i++) x[i] = 2.5f * gauss();
    for (int r = 0; r < NMAX; r++)
        for (int j = 0; j < 24; j++) x[(size_t)r * V + rnd() % V] = 8.0f + (float)(rnd() % 1000) / 100.0f;
    int32_t *prompt = malloc(sizeof(int32_t) * (NP + 1) * NMAX);
    for (int i = 0; i < (NP + 1) * NMAX; i++) prompt[i] = (int32_t)(rnd() % 20000);
    float *dl = be->alloc(be, sizeof(float) * V * NMAX);
    mr_sample_row *hr = calloc(NMAX, sizeof *hr), *drows = be->alloc(be, sizeof *hr * NMAX);
    int32_t *dadd = be->alloc(be, sizeof(int32_t) * (NP + 1) * NMAX), *dids = be->alloc(be, 4 * NMAX);
    int32_t *tables = be->alloc(be, sizeof(int32_t) * mr_sample_table_ints(V) * NMAX);
    mr_sampler *smp;
    if (!dl || !drows || !dadd || !dids || !tables || mr_sampler_new(V, &smp, &err) ||
        be->upload(be, dadd, prompt, sizeof(int32_t) * (NP + 1) * NMAX, &err)) {
        fprintf(stderr, "bench sample: %s\n", err.msg);
        return 1;
    }
    printf("%-18s %3s %12s %10s %12s %12s %12s %8s\n", "sample", "n", "op", "op/row", "host", "download",
           "mr_sample", "host/op");
    const int ns[3] = {1, 16, 64};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++)
        for (int k = 0; k < 3; k++) {
            const int n = ns[k];
            const mr_sample_params *p = &sets[si].p;
            bool pen = mr_sample_penalized(p);
            if (be->upload(be, dl, x, sizeof(float) * V * (size_t)n, &err)) break;
            mr_rng rng;
            mr_rng_seed(&rng, 1);
            for (int r = 0; r < n; r++)
                hr[r] = (mr_sample_row){.u = mr_rng_uniform(&rng), .temperature = p->temperature,
                                        .top_p = p->top_p, .min_p = p->min_p, .presence = p->presence_penalty,
                                        .frequency = p->frequency_penalty, .repetition = p->repetition_penalty,
                                        .top_k = p->top_k, .reset = 1, .add_off = r * (NP + 1),
                                        .n_add_prompt = pen ? NP : 0,
                                        .table = pen ? tables + mr_sample_table_ints(V) * (size_t)r : NULL};
            samp_arg a = {be, dl, n, V, drows, dadd, dids};
            /* the prompt into the tables once; then a decode step adds one id */
            if (be->upload(be, drows, hr, sizeof *hr * (size_t)n, &err)) break;
            run_samp(&a);
            for (int r = 0; r < n; r++) {
                hr[r].reset = 0;
                hr[r].add_off = r * (NP + 1) + NP;
                hr[r].n_add_prompt = 0;
                hr[r].n_add_gen = pen ? 1 : 0;
            }
            if (be->upload(be, drows, hr, sizeof *hr * (size_t)n, &err)) break;
            double t[3];
            for (int rep = 0; rep < 3; rep++) t[rep] = mr_cuda_time(be, run_samp, &a, 3, iters);
            if (be->sync(be, &err)) {
                fprintf(stderr, "bench sample: %s\n", err.msg);
                return 1;
            }
            double op = median3(t);
            /* the host path: the rows come down, then one mr_sample each */
            int reps = n >= 16 ? 2 : 5;
            double td = 0, ts = 0;
            for (int rep = 0; rep < reps; rep++) {
                double t0 = now_s();
                if (be->download(be, h, dl, sizeof(float) * V * (size_t)n, &err)) break;
                double t1 = now_s();
                memcpy(h, x, sizeof(float) * V * (size_t)n); /* the unpenalised rows */
                double t2 = now_s();
                for (int r = 0; r < n; r++)
                    mr_sample(smp, p, &rng, h + (size_t)r * V, prompt + r * (NP + 1), NP,
                              prompt + r * (NP + 1) + NP, 1);
                double t3 = now_s();
                td += t1 - t0;
                ts += t3 - t2;
            }
            td /= reps;
            ts /= reps;
            printf("%-18s %3d %9.1f us %7.1f us %9.1f us %9.1f us %9.1f us %7.1fx\n", sets[si].name, n, op * 1e6,
                   op * 1e6 / n, (td + ts) * 1e6, td * 1e6, ts * 1e6, (td + ts) / op);
        }
    mr_sampler_free(smp);
    be->free(be, dl); be->free(be, drows); be->free(be, dadd); be->free(be, dids); be->free(be, tables);
    free(x); free(h); free(hr); free(prompt);
    be->destroy(be);
    return 0;
}

/* ---- programmatic dependent launch ----
 *
 * Chains of dependent kernels, each call one replay of an automatic graph
 * (the same sequence every call), timed on backends that differ only in
 * MEMRA_CUDA_PDL: off (0) and on (unset).  What a graph node costs less
 * with PDL is (off - on) / nodes.
 *   add    432 adds of 4096 floats, each on the previous one's output
 *   mv     432 Q4_K 4096 x 4096 matvecs, x -> y -> x ..., 36 matrices in
 *          turn (340 MB: read from HBM; the values overflow, which costs
 *          nothing on a GPU)
 *   layer  36 layers of the 8B decode step at position 1,023: add +
 *          RMSNorm, q/k/v, qk norm + RoPE, KV store, attention (split and
 *          merge), o, add + RMSNorm, gate/up, SwiGLU, down; 4 sets of
 *          layer weights in turn (490 MB)
 * The matvec kernels are those the environment selects (MEMRA_CUDA_MATVEC=q8
 * applies to both backends). */
#define PB_D 4096
#define PB_FF 12288
#define PB_H 32
#define PB_KVH 8
#define PB_HD 128
#define PB_L 36
#define PB_SETS 4
#define PB_CHAIN 432
#define PB_MATS 36

typedef struct {
    mr_weight q, k, v, o, g, u, d;
} pb_layer;

typedef struct {
    mr_backend *be;
    int kind; /* 0 add, 1 mv, 2 layer */
    mr_weight *mats;
    pb_layer *sets;
    float *x, *y, *h, *q, *k, *v, *att, *o, *g, *u, *s, *f, *norm, *qkn;
    mr_kv_cache *kv;
    int32_t *pos, *tab;
} pb_arg;

static void run_pdl(void *p)
{
    pb_arg *a = p;
    mr_backend *be = a->be;
    if (a->kind == 0) {
        for (int i = 0; i < PB_CHAIN; i++) be->add(be, a->y, a->x, PB_D);
        return;
    }
    if (a->kind == 1) {
        for (int i = 0; i < PB_CHAIN; i++)
            be->matmul(be, &a->mats[i % PB_MATS], i & 1 ? a->y : a->x, i & 1 ? a->x : a->y, 1);
        return;
    }
    for (int l = 0; l < PB_L; l++) {
        const pb_layer *w = &a->sets[l % PB_SETS];
        if (l) be->add(be, a->x, a->f, PB_D); /* fused with the RMSNorm after it */
        be->rmsnorm(be, a->x, a->norm, a->h, 1, PB_D, 1e-6f);
        be->matmul(be, &w->q, a->h, a->q, 1);
        be->matmul(be, &w->k, a->h, a->k, 1);
        be->matmul(be, &w->v, a->h, a->v, 1);
        be->qk_norm_rope(be, a->q, a->k, a->qkn, a->qkn, a->pos, 1, PB_H, PB_KVH, PB_HD, PB_HD, 1e6f,
                         MR_ROPE_NEOX, 1e-6f);
        be->kv_store(be, a->kv, l, a->tab, a->k, a->v, a->pos, 1);
        be->attention(be, a->kv, l, a->tab, a->q, a->pos, 1, PB_H, 0.0884f, a->att);
        be->matmul(be, &w->o, a->att, a->o, 1);
        be->add(be, a->x, a->o, PB_D);
        be->rmsnorm(be, a->x, a->norm, a->h, 1, PB_D, 1e-6f);
        be->matmul(be, &w->g, a->h, a->g, 1);
        be->matmul(be, &w->u, a->h, a->u, 1);
        be->swiglu(be, a->g, a->u, a->s, PB_FF);
        be->matmul(be, &w->d, a->s, a->f, 1);
    }
    be->add(be, a->x, a->f, PB_D);
}

/* n floats base + spread * u, u uniform in [-1, 1], on the device */
static float *pb_floats(mr_backend *be, size_t n, float base, float spread)
{
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = base + spread * (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    mr_err err;
    float *d = be->alloc(be, n * 4);
    if (!d || be->upload(be, d, h, n * 4, &err)) {
        fprintf(stderr, "bench pdl: device memory\n");
        exit(1);
    }
    free(h);
    return d;
}

static int bench_pdl(int iters)
{
    enum { NM = 2 };
    static const char *mode[NM] = {"0", NULL};
    mr_backend *be[NM];
    mr_err err;
    for (int i = 0; i < NM; i++) {
        if (mode[i]) setenv("MEMRA_CUDA_PDL", mode[i], 1);
        else unsetenv("MEMRA_CUDA_PDL");
        be[i] = mr_backend_cuda_create(0, &err);
        if (!be[i]) {
            fprintf(stderr, "cuda: %s\n", err.msg);
            return 1;
        }
    }
    unsetenv("MEMRA_CUDA_PDL");
    const int pm = mr_cuda_pdl_mode(be[NM - 1]);
    printf("pdl: the default backend launches %s\n", pm ? "with PDL" : "without PDL (device or build)");
    /* one host buffer of random blocks, as large as the largest matrix */
    size_t hb = (size_t)PB_D * (PB_FF / 256) * 210;
    uint8_t *h = malloc(hb);
    fill(h, hb, MR_TYPE_Q6_K, 210); /* valid Q6_K blocks; as Q4_K bytes: random scales, finite */
    uint8_t *h4 = malloc(hb);
    fill(h4, hb, MR_TYPE_Q4_K, 144);
    pb_arg a = {0};
    a.mats = calloc(PB_MATS, sizeof *a.mats);
    for (int i = 0; i < PB_MATS; i++) a.mats[i] = bench_weight(be[0], h4, MR_TYPE_Q4_K, PB_D, PB_D);
    a.sets = calloc(PB_SETS, sizeof *a.sets);
    for (int i = 0; i < PB_SETS; i++) {
        pb_layer *w = &a.sets[i];
        w->q = bench_weight(be[0], h4, MR_TYPE_Q4_K, PB_H * PB_HD, PB_D);
        w->k = bench_weight(be[0], h4, MR_TYPE_Q4_K, PB_KVH * PB_HD, PB_D);
        w->v = bench_weight(be[0], h, MR_TYPE_Q6_K, PB_KVH * PB_HD, PB_D);
        w->o = bench_weight(be[0], h4, MR_TYPE_Q4_K, PB_D, PB_H * PB_HD);
        w->g = bench_weight(be[0], h4, MR_TYPE_Q4_K, PB_FF, PB_D);
        w->u = bench_weight(be[0], h4, MR_TYPE_Q4_K, PB_FF, PB_D);
        w->d = bench_weight(be[0], h, MR_TYPE_Q6_K, PB_D, PB_FF);
    }
    free(h);
    free(h4);
    a.x = pb_floats(be[0], PB_D, 0.0f, 1.0f);
    a.y = pb_floats(be[0], PB_D, 0.0f, 1.0f);
    a.norm = pb_floats(be[0], PB_D, 1.0f, 0.0f);
    a.qkn = pb_floats(be[0], PB_HD, 1.0f, 0.0f);
    float **bufs[] = {&a.h, &a.q, &a.att, &a.o, &a.f, &a.k, &a.v, &a.g, &a.u, &a.s};
    const size_t bn[] = {PB_D, PB_D, PB_D, PB_D, PB_D, PB_KVH * PB_HD, PB_KVH * PB_HD, PB_FF, PB_FF, PB_FF};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) *bufs[i] = pb_floats(be[0], bn[i], 0.0f, 1.0f);
    mr_kv_cache kv = {.n_layers = PB_L, .n_blocks = 80, .block_tokens = 16, .n_kv_heads = PB_KVH,
                      .head_dim = PB_HD, .dtype = MR_KV_F16};
    if (be[0]->kv_create(be[0], &kv, &err)) {
        fprintf(stderr, "kv_create: %s\n", err.msg);
        return 1;
    }
    a.kv = &kv;
    int32_t tab[80], pos = 1023;
    for (int i = 0; i < 80; i++) tab[i] = 79 - i;
    a.tab = be[0]->alloc(be[0], sizeof tab);
    a.pos = be[0]->alloc(be[0], 4);
    if (!a.tab || !a.pos || be[0]->upload(be[0], a.tab, tab, sizeof tab, &err) ||
        be[0]->upload(be[0], a.pos, &pos, 4, &err)) {
        fprintf(stderr, "bench pdl: device memory\n");
        return 1;
    }
    printf("%-6s %-6s %6s %11s %11s %13s\n", "pdl", "chain", "nodes", "off", "on", "(off-on)/node");
    static const char *chain[3] = {"add", "mv", "layer"};
    const int it = iters / 4 > 5 ? iters / 4 : 5;
    for (int k = 0; k < 3; k++) {
        double t[NM];
        long nodes = 0;
        for (int b = 0; b < NM; b++) {
            a.be = be[b];
            a.kind = k;
            double r[3];
            for (int i = 0; i < 3; i++) r[i] = mr_cuda_time(be[b], run_pdl, &a, 3, it);
            if (be[b]->sync(be[b], &err)) {
                fprintf(stderr, "bench pdl %s: %s\n", chain[k], err.msg);
                return 1;
            }
            t[b] = median3(r);
            nodes = mr_cu_autograph_nodes(be[b]);
        }
        printf("%-6s %-6s %6ld %8.1f us %8.1f us %10.2f us\n", "pdl", chain[k], nodes, t[0] * 1e6, t[1] * 1e6,
               nodes ? (t[0] - t[1]) * 1e6 / nodes : 0.0);
    }
    for (int i = 0; i < PB_MATS; i++) be[0]->weight_release(be[0], &a.mats[i]);
    for (int i = 0; i < PB_SETS; i++) {
        mr_weight *ws[] = {&a.sets[i].q, &a.sets[i].k, &a.sets[i].v, &a.sets[i].o, &a.sets[i].g, &a.sets[i].u,
                           &a.sets[i].d};
        for (int j = 0; j < 7; j++) be[0]->weight_release(be[0], ws[j]);
    }
    float *fs[] = {a.x, a.y, a.norm, a.qkn, a.h, a.q, a.att, a.o, a.f, a.k, a.v, a.g, a.u, a.s};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) be[0]->free(be[0], fs[i]);
    be[0]->free(be[0], a.tab);
    be[0]->free(be[0], a.pos);
    be[0]->kv_destroy(be[0], &kv);
    free(a.mats);
    free(a.sets);
    for (int i = NM - 1; i >= 0; i--) be[i]->destroy(be[i]);
    return 0;
}

static double bench_mv(mr_backend *be, const char *label, int type, int64_t rows, int64_t cols, int n,
                       int iters, double bw)
{
    mv_set m;
    mv_load(&m, be, type, rows, cols, n);
    double med = mv_time(&m, be, label, iters, bw);
    mv_free(&m);
    return med;
}

/* The activation quantization of a q8 product alone (rows of cols floats
 * in, int8 + two floats per 32 out); bytes = read + written. */
typedef struct {
    mr_backend *be;
    const float *x;
    int64_t rows, cols;
} quant_arg;

static void run_quant(void *p)
{
    quant_arg *a = p;
    if (mr_cuda_q8_quantize(a->be, a->x, a->rows, a->cols)) {
        fprintf(stderr, "q8 quantize failed\n");
        exit(1);
    }
}

static void bench_quant(mr_backend *be, int64_t cols, int n, int iters, double bw)
{
    float *hx = malloc(cols * n * 4);
    for (int64_t i = 0; i < cols * n; i++) hx[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
    mr_err err;
    float *x = be->alloc(be, cols * n * 4);
    be->upload(be, x, hx, cols * n * 4, &err);
    quant_arg a = {be, x, n, cols};
    double t[3];
    for (int r = 0; r < 3; r++) t[r] = mr_cuda_time(be, run_quant, &a, 10, iters);
    if (be->sync(be, &err)) {
        fprintf(stderr, "bench quantize: %s\n", err.msg);
        exit(1);
    }
    double med = median3(t);
    double bytes = (double)cols * n * (4 + 1 + 8.0 / 32);
    printf("%-8s %-9s %7d x %-6lld n=%d %9.0f KB %8.2f us %8.1f GB/s %6.1f%%\n", "q8-quant", "F32>I8", n,
           (long long)cols, n, bytes / 1024.0, med * 1e6, bytes / med / 1e9, 100.0 * bytes / med / 1e9 / bw);
    be->free(be, x);
    free(hx);
}

/* "mv TYPE ROWS COLS [N]": one matvec shape on the default backend (the
 * kernels the environment selects), e.g. under a profiler. */
static int bench_one_mv(int argc, char **argv, int iters, double cbw)
{
    const int type = argc > 0 ? mr_type_from_name(argv[0]) : -1;
    const long long rows = argc > 1 ? atoll(argv[1]) : 0, cols = argc > 2 ? atoll(argv[2]) : 0;
    const int n = argc > 3 ? atoi(argv[3]) : 1;
    int bb = 0;
    const int belems = type < 0 ? 0 : block_of(type, &bb);
    if (rows <= 0 || cols <= 0 || n < 1 || n > 64 || !belems || cols % belems) {
        fprintf(stderr, "usage: bench-kernels ITERS mv TYPE ROWS COLS [N]  (COLS a multiple of the block)\n");
        return 2;
    }
    mr_err err;
    mr_backend *be = mr_backend_cuda_create(0, &err);
    if (!be) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    bench_mv(be, "default", type, rows, cols, n, iters, cbw);
    be->destroy(be);
    return 0;
}

/* "phase [BYTES [BPS [PHASES]]]": one op of a decode step as a phase of a
 * persistent kernel against a launch of a PDL chain (cu_persist.cu);
 * without BYTES the 30B-A3B's and 8B's product sizes at 1 and 2 blocks an
 * SM. */
static int bench_phase(int argc, char **argv, int iters)
{
    const long long one = argc > 0 ? atoll(argv[0]) : 0;
    const int bps1 = argc > 1 ? atoi(argv[1]) : 0, phases = argc > 2 ? atoi(argv[2]) : 64;
    const long long sizes[] = {589824, 4718592, 9437184, 28311552};
    printf("%-10s %4s %6s %10s %10s %10s %10s %10s %11s  (us a phase)\n", "bytes", "bps", "grid", "barrier",
           "load", "prefetch", "chain-nop", "chain-load", "chain-early");
    for (size_t i = 0; i < (one ? 1 : sizeof sizes / sizeof sizes[0]); i++)
        for (int bps = bps1 ? bps1 : 1; bps <= (bps1 ? bps1 : 2); bps++) {
            const long long bytes = one ? one : sizes[i];
            double us[6] = {0, 0, 0, 0, 0, 0};
            const int g = mr_cuda_phase_bench((size_t)bytes, bps, phases, iters, us);
            if (g < 0) {
                printf("%-10lld %4d  not run (%d)\n", bytes, bps, g);
                continue;
            }
            printf("%-10lld %4d %6d %10.2f %10.2f %10.2f %10.2f %10.2f %11.2f\n", bytes, bps, g, us[0], us[1], us[2],
                   us[3], us[4], us[5]);
        }
    return 0;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (!mr_backend_cuda_available()) {
        printf("bench-kernels: no CUDA device\n");
        return 77;
    }
    char name[256];
    int sm;
    mr_cuda_device_info(name, sizeof name, &sm);
    double bw[3];
    for (int i = 0; i < 3; i++) bw[i] = mr_cuda_copy_bandwidth((size_t)2 << 30, 10);
    double cbw = bw[0] > bw[1] ? (bw[1] > bw[2] ? bw[1] : (bw[0] > bw[2] ? bw[2] : bw[0])) : (bw[0] > bw[2] ? bw[0] : (bw[1] > bw[2] ? bw[2] : bw[1]));
    printf("device %s, %d SMs; D2D copy (2 GiB, read+write) median of 3: %.1f GB/s\n", name, sm, cbw);
    if (argc > 2 && !strcmp(argv[2], "attn"))
        return bench_attn(iters);
    if (argc > 2 && (!strcmp(argv[2], "attn-decode") || !strcmp(argv[2], "attn-streams")))
        return bench_attn_decode(iters, !strcmp(argv[2], "attn-streams"));
    if (argc > 2 && !strcmp(argv[2], "gdn"))
        return bench_gdn(iters);
    if (argc > 2 && !strcmp(argv[2], "gemm"))
        return bench_gemm(iters, cbw);
    if (argc > 2 && !strcmp(argv[2], "sample"))
        return bench_sample(iters);
    if (argc > 2 && !strcmp(argv[2], "pdl"))
        return bench_pdl(iters);
    if (argc > 2 && !strcmp(argv[2], "mv"))
        return bench_one_mv(argc - 3, argv + 3, iters, cbw);
    if (argc > 2 && !strcmp(argv[2], "phase"))
        return bench_phase(argc - 3, argv + 3, iters);
    if (argc > 2 && (!strcmp(argv[2], "moe") || !strcmp(argv[2], "moe-sweep"))) {
        printf("%-8s %-9s %-16s %3s %12s %11s %13s %7s\n", "kernel", "type", "rows x cols", "n", "bytes",
               "time", "bandwidth", "%copy");
        return strcmp(argv[2], "moe") ? bench_moe_sweep(iters, cbw) : bench_moe(iters, cbw);
    }
    mr_err err;
    /* "fast": the float32-activation kernels, whatever the environment says */
    setenv("MEMRA_CUDA_MATVEC", "f32", 1);
    mr_backend *fast = mr_backend_cuda_create(0, &err);
    setenv("MEMRA_CUDA_GENERIC", "1", 1);
    mr_backend *gen = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_GENERIC");
    if (!fast || !gen) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    printf("%-8s %-9s %-16s %3s %12s %11s %13s %7s\n", "kernel", "type", "rows x cols", "n", "bytes",
           "time", "bandwidth", "%copy");
    struct { int type; int64_t rows, cols; } sh[] = {
        {MR_TYPE_Q4_K, 4096, 4096}, {MR_TYPE_Q4_K, 12288, 4096}, {MR_TYPE_Q4_K, 4096, 12288},
        {MR_TYPE_Q6_K, 4096, 12288}, {MR_TYPE_Q6_K, 1024, 4096}, {MR_TYPE_Q6_K, 151936, 4096},
        {MR_TYPE_Q4_K, 1024, 4096}, {MR_TYPE_Q8_0, 4096, 4096}, {MR_TYPE_BF16, 4096, 4096},
        {MR_TYPE_Q5_K, 4096, 4096}, {MR_TYPE_IQ4_XS, 4096, 4096}, {MR_TYPE_Q4_0, 4096, 4096},
        {MR_TYPE_Q4_K, 768, 2048}, {MR_TYPE_Q4_K, 2048, 768}, {MR_TYPE_Q6_K, 2048, 768},
    };
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        bench_mv(fast, "fast", sh[i].type, sh[i].rows, sh[i].cols, 1, iters, cbw);
        if (i < 2) bench_mv(gen, "generic", sh[i].type, sh[i].rows, sh[i].cols, 1, iters / 4 + 1, cbw);
    }
    /* Q4_K with 8-weight lanes (before the 16-weight ones) */
    setenv("MEMRA_CUDA_Q4K_WIDE", "0", 1);
    mr_backend *nw = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_Q4K_WIDE");
    if (!nw) return 1;
    bench_mv(nw, "q4k-8w", MR_TYPE_Q4_K, 4096, 4096, 1, iters, cbw);
    bench_mv(nw, "q4k-8w", MR_TYPE_Q4_K, 12288, 4096, 1, iters, cbw);
    bench_mv(nw, "q4k-8w", MR_TYPE_Q4_K, 4096, 12288, 1, iters, cbw);
    bench_mv(nw, "q4k-8w", MR_TYPE_Q4_K, 1024, 4096, 1, iters, cbw);
    nw->destroy(nw);
    bench_mv(fast, "fast", MR_TYPE_Q4_K, 4096, 4096, 2, iters, cbw);
    bench_mv(fast, "fast", MR_TYPE_Q4_K, 4096, 4096, 4, iters, cbw);
    bench_mv(fast, "fast", MR_TYPE_Q4_K, 4096, 4096, 8, iters, cbw);
    /* int8 activations (MEMRA_CUDA_MATVEC=q8) against the float32 kernels
     * on the same weights; a q8 time includes its activation quantization,
     * which the q8-quant lines time alone */
    setenv("MEMRA_CUDA_MATVEC", "q8", 1);
    mr_backend *q8 = mr_backend_cuda_create(0, &err);
    unsetenv("MEMRA_CUDA_MATVEC");
    if (!q8) {
        fprintf(stderr, "cuda (q8): %s\n", err.msg);
        return 1;
    }
    struct { int type; int64_t rows, cols; } qs[] = {
        {MR_TYPE_Q4_K, 4096, 4096}, {MR_TYPE_Q4_K, 12288, 4096}, {MR_TYPE_Q4_K, 4096, 12288},
        {MR_TYPE_Q4_K, 1024, 4096}, {MR_TYPE_Q6_K, 4096, 12288}, {MR_TYPE_Q6_K, 151936, 4096},
        {MR_TYPE_Q8_0, 4096, 4096},
    };
    int ns[2] = {1, 4};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
            mv_set m;
            mv_load(&m, fast, qs[i].type, qs[i].rows, qs[i].cols, ns[k]);
            mv_time(&m, fast, "f32", iters, cbw);
            mv_time(&m, q8, "q8", iters, cbw);
            mv_free(&m);
        }
    for (int k = 0; k < 2; k++) {
        bench_quant(q8, 4096, ns[k], iters, cbw);
        bench_quant(q8, 12288, ns[k], iters, cbw);
    }
    q8->destroy(q8);
    gen->destroy(gen);
    fast->destroy(fast);
    if (bench_attn(iters)) return 1;
    if (bench_sample(iters / 10 > 5 ? iters / 10 : 5)) return 1;
    if (bench_pdl(iters)) return 1;
    return bench_moe(iters, cbw);
}
#endif

/* Small prompt products in float32: y[n][m] = x[n][k] W^T for weight
 * matrices of few elements (the hybrids' 32-row gate projections, the
 * routers, the shared experts, a 1-row shared-expert gate).
 *
 * Why: on the GEMM path (cu_gemm.cu) such a matrix costs a dequantize, an
 * activation gather and a scale pass, and k_hgemm's 128-row tiles leave
 * most of the card idle while each block walks all of k in sequence; in
 * f16x3 mode that is one GEMM over 2k columns and k / 512 more in a row.
 * On an H200 (35B-A3B, 512-token prompt) a 32 x 2048 product took ~100 us
 * and a 1 x 2048 one ~70 us for a few MFLOP.  Here the work is one launch
 * that decodes the GGUF blocks itself (and a join of the partial sums when
 * k spans several chunks), and the sums are plain float32 FMAs on the exact
 * decoded weights and the unrounded activations: float32-grade, at least as
 * precise as f16x3.
 *
 * The sums, fixed by the matrix's shape, never by the call's tokens or the
 * tile (a prompt row must come out the same in a chunk of 7 tokens as in a
 * prompt of 512, see cu_hgemm.cu): element (t, r) is the sum over chunks of
 * 128, 256 or 512 columns (sg_chunk: by the row count), each chunk one
 * float32 FMA chain from zero in column order, the chunks' partial sums
 * then added in chunk order.  Chunks give a small grid blocks to spread
 * over the SMs without letting the call's shape decide an order.
 *
 * Which matrices (mr_cu_small_gemm_takes): those of at most 2^20 weights and
 * 512 rows in f16x3 mode (float16 tensor-core products three times over cost
 * more there), 128 rows in f16 mode: on an H200 (run 87, 512 tokens) this
 * kernel took 17 us for 32 x 2048 (GEMM path f16x3 102), 34 for 256 x 2048
 * (96), 68 for 512 x 2048 (105), but 60 for 2048 x 512 (52) and, in f16
 * mode, lost on 512 x 2048.  MEMRA_CUDA_SMALL_GEMM=N sets the row limit (0:
 * off).  The path is a function of the matrix's shape and the mode, so a
 * matrix always takes one. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_quant.cuh"

#define SG_BM 64       /* weight rows a block */
#define SG_BN 64       /* tokens a block */
#define SG_BK 32       /* columns a shared-memory step: one block-type group */
#define SG_THREADS 256 /* 16 x 16 threads, 4 x 4 outputs each */
#define SG_MAX_WEIGHTS (1LL << 20)

/* Columns a partial sum: a function of the matrix's shape alone (never of
 * the call's tokens), small where few rows would give a prompt few blocks:
 * every block walks its chunk in sequence, and the chunks are what spreads
 * a 32-row matrix over the SMs. */
static int sg_chunk(int64_t rows) { return rows <= 64 ? 128 : rows <= 256 ? 256 : 512; }

/* Chunk blockIdx.z (kc columns, a multiple of SG_BK) for a tile of SG_BM
 * rows x SG_BN tokens: part[z][t][r] (ld m) = sum over the chunk's columns
 * c, in order, of W[r][c] x[t][c].  Rows and tokens past the ends are
 * zeros, not stored.  Two shared-memory stages: the next step's inputs are
 * read from global memory into registers before this step's products and
 * stored after them, so their latency hides behind the FMAs. */
template <int T>
__global__ void __launch_bounds__(SG_THREADS, 2) k_sgemm_small(const uint8_t *__restrict__ W, size_t row_bytes,
                                                           int m, int n, int k, int kc,
                                                           const float *__restrict__ x, float *__restrict__ part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    /* k-major tiles; rows of 68 floats keep the float4 reads aligned */
    __shared__ __align__(16) float Ws[2][SG_BK][SG_BM + 4];
    __shared__ __align__(16) float Xs[2][SG_BK][SG_BN + 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int lane = tid & 31, wrow = (tid >> 5) * 8 + lane; /* block types: lanes 0-7 of each warp decode a row */
    const int m0 = blockIdx.x * SG_BM, n0 = blockIdx.y * SG_BN;
    const int k0 = (int)blockIdx.z * kc, k1 = k - k0 < kc ? k : k0 + kc;
    constexpr bool plain = mr_cu_plain_type(T);
    constexpr int NW = plain ? 8 : 32; /* weights a thread stages a step */
    float xr[8], wr[NW];

    /* the inputs of the step at column kb into registers */
    auto fetch = [&](int kb) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = tid + j * SG_THREADS, t = i / SG_BK, cc = i % SG_BK;
            xr[j] = n0 + t < n && kb + cc < k1 ? x[(size_t)(n0 + t) * k + kb + cc] : 0.0f;
        }
        if constexpr (plain) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int i = tid + j * SG_THREADS, r = i / SG_BK, cc = i % SG_BK;
                wr[j] = m0 + r < m && kb + cc < k1 ? mr_plain_at<T>(W + (size_t)(m0 + r) * row_bytes, kb + cc) : 0.0f;
            }
        } else if (lane < 8) {
            if (m0 + wrow < m)
                mr_dq32<T>(W + (size_t)(m0 + wrow) * row_bytes, kb / 32, wr); /* k is whole groups */
            else
#pragma unroll
                for (int j = 0; j < 32; j++) wr[j] = 0.0f;
        }
    };
    /* the registers into stage st */
    auto stash = [&](int st) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = tid + j * SG_THREADS;
            Xs[st][i % SG_BK][i / SG_BK] = xr[j];
        }
        if constexpr (plain) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int i = tid + j * SG_THREADS;
                Ws[st][i % SG_BK][i / SG_BK] = wr[j];
            }
        } else if (lane < 8) {
#pragma unroll
            for (int j = 0; j < 32; j++) Ws[st][j][wrow] = wr[j];
        }
    };

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    fetch(k0);
    stash(0);
    __syncthreads();
    int st = 0;
    for (int kb = k0; kb < k1; kb += SG_BK, st ^= 1) {
        const bool more = kb + SG_BK < k1;
        if (more)
            fetch(kb + SG_BK);
#pragma unroll 8
        for (int kk = 0; kk < SG_BK; kk++) {
            const float4 a = *(const float4 *)&Ws[st][kk][ty * 4];
            const float4 b = *(const float4 *)&Xs[st][kk][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        /* stage st ^ 1 was last read before the previous barrier */
        if (more)
            stash(st ^ 1);
        __syncthreads();
    }
    float *p = part + (size_t)blockIdx.z * n * m;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int t = n0 + tx * 4 + j;
        if (t >= n)
            continue;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = m0 + ty * 4 + i;
            if (r < m) p[(size_t)t * m + r] = acc[i][j];
        }
    }
}

/* y = part[0] + part[1] + ... + part[nc - 1], added in that order. */
__global__ void k_sgemm_join(const float *__restrict__ part, int nc, size_t total, float *__restrict__ y)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        float s = part[e];
        for (int z = 1; z < nc; z++) s = __fadd_rn(s, part[(size_t)z * total + e]);
        y[e] = s;
    }
}

/* Whether a prompt product of w takes this path (top comment): at most
 * SG_MAX_WEIGHTS weights and the row limit, MEMRA_CUDA_SMALL_GEMM (read at
 * backend creation) or the mode's default. */
bool mr_cu_small_gemm_takes(const mr_cu_ctx *c, const mr_weight *w, bool x3)
{
    const long long rows = c->small_gemm >= 0 ? c->small_gemm : x3 ? 512 : 128;
    return w->rows <= rows && w->rows * w->cols <= SG_MAX_WEIGHTS;
}

void mr_cu_small_gemm_init(mr_cu_ctx *c)
{
    long long v = -1; /* unset: by mode (mr_cu_small_gemm_takes) */
    if (mr_cu_env_int(c, "MEMRA_CUDA_SMALL_GEMM", 0, LLONG_MAX, "a count of weight elements", &v) < 0)
        return;
    c->small_gemm = v;
}

void mr_cu_small_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    const int m = (int)w->rows, k = (int)w->cols, kc = sg_chunk(w->rows), nc = (k + kc - 1) / kc;
    float *part = y;
    if (nc > 1) {
        if (!mr_cu_reserve(c, &c->scratch_act, (size_t)nc * n * m * sizeof(float), "small GEMM partial sums"))
            return;
        part = (float *)c->scratch_act.p;
    }
    const dim3 grid((unsigned)((m + SG_BM - 1) / SG_BM), (unsigned)((n + SG_BN - 1) / SG_BN), (unsigned)nc);
    if (grid.y > 65535) {
        mr_cu_fail(c, "small GEMM: %d tokens is past the grid", n);
        return;
    }
    switch (w->type) {
#define X(TT)                                                                                                  \
    case TT:                                                                                                   \
        mr_cu_launch(c, k_sgemm_small<TT>, grid, SG_THREADS, 0, (const uint8_t *)w->data, w->row_bytes, m, n, \
                     k, kc, x, part);                                                                          \
        break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: mr_cu_fail(c, "small GEMM: unsupported type %d", w->type); return;
    }
    MR_CU_LAUNCHED(c, "small GEMM");
    if (nc > 1)
        mr_cu_join_partials(c, part, nc, (size_t)n * m, y);
}

void mr_cu_join_partials(mr_cu_ctx *c, const float *part, int nc, size_t total, float *y)
{
    mr_cu_launch(c, k_sgemm_join, mr_cu_ew_blocks(c, total, 256), 256, 0, part, nc, total, y);
    MR_CU_LAUNCHED(c, "join of partial sums");
}

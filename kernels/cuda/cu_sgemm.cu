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
 * (two when k > SG_KC) that decodes the GGUF blocks itself, and the sums are
 * plain float32 FMAs on the exact decoded weights and the unrounded
 * activations: float32-grade, at least as precise as f16x3.
 *
 * The sums, fixed by k alone, never by n, m or the tile (a prompt row must
 * come out the same in a chunk of 7 tokens as in a prompt of 512, see
 * cu_hgemm.cu): element (t, r) is the sum over chunks of SG_KC columns,
 * each chunk one float32 FMA chain from zero in column order, the chunks'
 * partial sums then added in chunk order.  Chunks give a small grid blocks
 * to spread over the SMs without letting the call's shape decide an order.
 *
 * Which matrices (mr_cu_small_gemm_limit): those of at most 2^20 elements in
 * f16x3 mode (float16 tensor-core products three times over cost more
 * there), 2^18 in f16 mode; MEMRA_CUDA_SMALL_GEMM=N sets the limit (0: off).
 * A model's choice of matrix is fixed, so a matrix always takes one path. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_quant.cuh"

#define SG_BM 64      /* weight rows a block */
#define SG_BN 64      /* tokens a block */
#define SG_BK 32      /* columns a shared-memory step: one block-type group */
#define SG_KC 512     /* columns a partial sum (a multiple of SG_BK) */
#define SG_THREADS 256 /* 16 x 16 threads, 4 x 4 outputs each */

/* Chunk blockIdx.z of the columns for a tile of SG_BM rows x SG_BN tokens:
 * part[z][t][r] (ld m) = sum over the chunk's columns c, in order, of
 * W[r][c] x[t][c].  Rows and tokens past the ends are zeros, not stored. */
template <int T>
__global__ void __launch_bounds__(SG_THREADS) k_sgemm_small(const uint8_t *__restrict__ W, size_t row_bytes,
                                                           int m, int n, int k, const float *__restrict__ x,
                                                           float *__restrict__ part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    /* k-major tiles; rows of 68 floats keep the float4 reads aligned */
    __shared__ __align__(16) float Ws[SG_BK][SG_BM + 4];
    __shared__ __align__(16) float Xs[SG_BK][SG_BN + 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.x * SG_BM, n0 = blockIdx.y * SG_BN;
    const int k0 = (int)blockIdx.z * SG_KC, k1 = k - k0 < SG_KC ? k : k0 + SG_KC;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;

    for (int kb = k0; kb < k1; kb += SG_BK) {
        if constexpr (mr_cu_plain_type(T)) {
            for (int i = tid; i < SG_BM * SG_BK; i += SG_THREADS) {
                const int r = i / SG_BK, cc = i % SG_BK;
                Ws[cc][r] = m0 + r < m && kb + cc < k1 ? mr_plain_at<T>(W + (size_t)(m0 + r) * row_bytes, kb + cc)
                                                       : 0.0f;
            }
        } else if (tid < SG_BM) { /* a thread decodes one row's group (k is whole groups) */
            float v[32];
            if (m0 + tid < m)
                mr_dq32<T>(W + (size_t)(m0 + tid) * row_bytes, kb / 32, v);
            else
#pragma unroll
                for (int j = 0; j < 32; j++) v[j] = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++) Ws[j][tid] = v[j];
        }
        for (int i = tid; i < SG_BN * SG_BK; i += SG_THREADS) {
            const int t = i / SG_BK, cc = i % SG_BK;
            Xs[cc][t] = n0 + t < n && kb + cc < k1 ? x[(size_t)(n0 + t) * k + kb + cc] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < SG_BK; kk++) {
            const float4 a = *(const float4 *)&Ws[kk][ty * 4];
            const float4 b = *(const float4 *)&Xs[kk][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
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

/* Weight elements up to which a prompt product takes this path: the
 * environment's MEMRA_CUDA_SMALL_GEMM (read at backend creation) or the
 * mode's default (top comment); 0 in the float32 reference modes. */
long long mr_cu_small_gemm_limit(const mr_cu_ctx *c, bool x3)
{
    if (c->small_gemm >= 0)
        return c->small_gemm;
    return x3 ? 1LL << 20 : 1LL << 18;
}

void mr_cu_small_gemm_init(mr_cu_ctx *c)
{
    const char *s = getenv("MEMRA_CUDA_SMALL_GEMM");
    char *end = NULL;
    const long long v = s ? strtoll(s, &end, 10) : -1;
    if (s && (end == s || *end || v < 0)) {
        mr_cu_fail(c, "MEMRA_CUDA_SMALL_GEMM '%s': not a count of weight elements", s);
        return;
    }
    c->small_gemm = v;
}

void mr_cu_small_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    const int m = (int)w->rows, k = (int)w->cols, nc = (k + SG_KC - 1) / SG_KC;
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
                     k, x, part);                                                                              \
        break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: mr_cu_fail(c, "small GEMM: unsupported type %d", w->type); return;
    }
    MR_CU_LAUNCHED(c, "small GEMM");
    if (nc > 1) {
        const size_t total = (size_t)n * m;
        mr_cu_launch(c, k_sgemm_join, mr_cu_ew_blocks(c, total, 256), 256, 0, (const float *)part, nc, total, y);
        MR_CU_LAUNCHED(c, "small GEMM join");
    }
}

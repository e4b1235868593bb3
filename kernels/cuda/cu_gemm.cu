/* Prompt path of the matrix products (MR_CU_GEMM_MIN_TOKENS tokens or more):
 * the GGUF blocks are dequantized tile by tile into scratch and multiplied
 * on the tensor cores (k_hgemm, cu_hgemm.cu; cuBLAS for the float32 modes).
 *
 * Precision (MEMRA_CUDA_GEMM, default f16; a model that calls
 * be->prefer_float32 gets f16x3 unless the variable is set):
 *   f16   weights and activations rounded to float16, products accumulated
 *         in float32 (CUBLAS_COMPUTE_32F).  Each activation row is first
 *         scaled by a power of two so that its largest magnitude is 2^8:
 *         float16's range then never clips a row (Qwen's hidden states have
 *         outliers past float16's 65504), and the scale is undone exactly on
 *         the float32 output.  Relative error of a product ~2^-11.
 *   f16x3 float32-grade products made of float16 tensor-core products with
 *         split operands (below).  Relative error of a product ~2^-20 or
 *         less; three times the MMA work of f16.
 *   tf32  float32 tiles, TF32 tensor-core products (10-bit mantissa, the same
 *         rounding as f16 without the range question, half the rate and
 *         twice the scratch traffic).
 *   f32   float32 SGEMM with pedantic math: the float32 reference.
 *
 * f16x3.  A value v (a decoded weight, or an activation after its row
 * scale) is split into hi = fp16(v) and lo = fp16((v - hi) * 2^11): v - hi
 * is exact in float32, and v = hi + 2^-11 lo up to the rounding of lo,
 * at most 2^-11 |v - hi| <= 2^-22 |v| (plus 2^-36 absolute where lo is a
 * float16 subnormal).  Why 2^11: |v - hi| is at most half a float16 ulp of
 * v, 2^-11 |v|, so |lo| <= |v|: the low part cannot overflow where the high
 * part does not, and it is a normal float16 down to about the magnitudes
 * where the high part is (a shift s > 11 would overflow lo for |v| > 2^(27-s) while
 * hi is still finite; s < 11 would push more low parts into subnormals).
 * Then
 *     W x = W_hi x_hi + 2^-11 (W_lo x_hi + W_hi x_lo)  [+ 2^-22 W_lo x_lo]
 * with the bracketed term left out: each low part is at most 2^-11 of its
 * value, so that term is at most 2^-22 |W x| a term, next to float32's own
 * unit roundoff 2^-24.  Representation error of a term: <= 3 * 2^-22
 * (W's split, x's split, the dropped term), ~2^-23 rms.  float16 products
 * are exact in float32 on the tensor cores, subnormals included.
 *   The accumulation is the other half.  Tensor cores add an MMA's products
 * to the float32 accumulator with truncation (round toward zero, about an
 * ulp per instruction of 16 products, not IEEE round-to-nearest: published
 * measurements of V100 to A100, taken here to hold for Hopper), and a
 * truncation leans one way: over s instructions its error grows like s, not
 * like sqrt(s).  So the big term W_hi x_hi never runs long inside a
 * tensor-core accumulator:
 *   - the GEMM calls (dense products, the padded expert path): W_hi x_hi in chunks
 *     of X3_KC = 512 columns, each chunk a GEMM with beta 1 that adds its
 *     result to C in its float32 epilogue (round to nearest): 32 MMA steps
 *     of 16 columns at most in the tensor cores;
 *   - the fused expert kernel: a fresh accumulator every MG_BK = 128
 *     columns (8 steps), added to the running float32 sum by an ordinary
 *     (round-to-nearest) add.
 * The small terms run the whole K in one accumulator: their truncation is
 * 2^-11 below the result.  Order: the small terms first (one GEMM over the
 * stacked 2K columns [W_lo | W_hi] . [x_hi | x_lo] with alpha 2^-11, beta
 * 0), then the chunks of the big term (beta 1).  Each GEMM after the first
 * rounds C once (round to nearest, at C's scale), so the count of roundings
 * at the result's scale is one a big chunk in either order; small first
 * loses least because the small sum is formed and stored at its own scale
 * (its roundings 2^-11 below the result's) and no accumulator ever holds
 * the big value while the 2K small columns are summed (a GEMM kernel that
 * started its accumulator from beta C would otherwise truncate 2K/16 more
 * times at the result's scale).
 *   What that adds up to, for random-sign terms (the checks' data; a model's
 * products are not worse): a chunk of s MMA steps truncating at most
 * 2^-22 |partial sum| each errs by at most 2^-22 sum_i |c_i| ~ 2^-22 (2/3) s
 * |chunk sum|: 5.1e-6 relative for s = 32 (the GEMM calls), 1.3e-6 for s = 8
 * (fused); the round-to-nearest adds of the chunks and the representation
 * (~2^-23 rms a term) stay below 1e-6.  kernel-check bounds f16x3 at 1e-5.
 * A host model of this (Gaussian terms, each 16-column step truncated to
 * float32 toward zero) gives ~8e-7 through the GEMM calls at any K and ~2.5e-7
 * fused (the representation alone: 8e-8); without the chunks 3.4e-6 at K =
 * 2048, 6.8e-6 at 4096, 1.9e-5 at 12288; float32 FMAs in sequence 1.2e-6
 * at 4096.  Range: the same as f16 (weights beyond float16's 65504 become
 * infinite; activation rows are scaled).
 *
 * Expert matrices (matmul_id) are grouped.  Padded path (plain types and
 * the float32 modes): the host reads the expert ids (one small download:
 * the prompt path is never inside a graph), gathers
 * each expert's tokens into a padded block, dequantizes the experts and
 * runs one strided batched GEMM for all of them, then scatters the rows back
 * to (token, slot) order.  Every expert is read once for the whole prompt
 * instead of once per token.
 *
 * In f16 and f16x3 modes the experts take a fused kernel instead
 * (k_moe_gemm, k_moe_gemm_x3): each block dequantizes a tile of one
 * expert's rows straight from the GGUF blocks into shared memory as float16
 * (f16x3: high and low parts) and multiplies it with that expert's gathered
 * tokens on the tensor cores (WMMA, float32 accumulate), writing the scaled
 * results to (token, slot) order itself; the pairs are grouped by expert
 * on the device (k_moe_group_tiles), so nothing is read back.  No float16 copy of the experts
 * goes through memory, and the work follows the tokens: an expert nobody
 * chose costs nothing.  Same rounding as the GEMM path of the mode (both
 * operands float16, float32 sums), another summation order.
 *
 * IQ4_XS and Q4_K experts (MEMRA_CUDA_XMP_Q4K=0: IQ4_XS only) take the int8
 * tensor-core kernels of cu_moemmp.cu instead, on the same grouping with
 * tiles of mr_cu_xmp_tile_tokens; so do IQ4_XS dense products in f16x3
 * mode (three input planes: float32-grade). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mma.h>
#include <vector>

#include "kernels/cuda/cu_quant.cuh"

#define ROW_SCALE_LOG2 8 /* activation rows are scaled to a largest magnitude of 2^8 */

template <typename O> __device__ __forceinline__ O to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __half to_out<__half>(float v) { return __float2half_rn(v); }

/* f16x3 split (top comment): v = hi + 2^-X3_SHIFT lo. */
#define X3_SHIFT 11
#define X3_LO 2048.0f             /* 2^X3_SHIFT */
#define X3_INV (1.0f / 2048.0f)   /* 2^-X3_SHIFT */
#define X3_KC 512                 /* columns of W_hi x_hi one GEMM call sums in the tensor cores */

/* Two values split at once, as the bits of a float16 pair (hi) and of the
 * scaled low parts (lo).  A value past float16's range keeps lo = 0, so it
 * stays infinite (as in f16 mode) instead of turning into inf - inf = NaN;
 * NaN stays NaN in both parts. */
__device__ __forceinline__ void x3_split2(float a, float b, uint32_t *hi, uint32_t *lo)
{
    const __half2 h = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(h);
    const float la = isinf(hf.x) ? 0.0f : (a - hf.x) * X3_LO;
    const float lb = isinf(hf.y) ? 0.0f : (b - hf.y) * X3_LO;
    const __half2 l = __floats2half2_rn(la, lb);
    *hi = *(const uint32_t *)&h;
    *lo = *(const uint32_t *)&l;
}

__device__ __forceinline__ void x3_split(float v, __half *hi, __half *lo)
{
    const __half h = __float2half_rn(v);
    const float hf = __half2float(h);
    *hi = h;
    *lo = __float2half_rn(isinf(hf) ? 0.0f : (v - hf) * X3_LO);
}

#define DQ_THREADS 256 /* groups of 32 weights per block in the dequantize kernel */

/* Dequantizes rows [r0, r0+nr) of n_mats stacked matrices (matrix stride
 * mat_bytes) into out[m][r][cols]: blockIdx.y is the matrix.  One thread
 * decodes one group of 32 weights; consecutive groups are consecutive in
 * the output, so a block's output is one contiguous span, which it writes
 * from shared memory with 16-byte stores (a thread writing its own 32
 * values would issue 32 scattered 2-byte stores per warp instruction). */
template <int T, typename O>
__global__ void __launch_bounds__(DQ_THREADS)
k_dequant(const uint8_t *W, size_t mat_bytes, size_t row_bytes, int64_t cols, int64_t r0,
          int64_t nr, O *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const uint8_t *Wm = W + (size_t)blockIdx.y * mat_bytes;
    O *om = out + (size_t)blockIdx.y * nr * cols;
    if constexpr (mr_cu_plain_type(T)) {
        const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= nr * cols)
            return;
        const int64_t r = i / cols, c = i % cols;
        om[i] = to_out<O>(mr_plain_at<T>(Wm + (r0 + r) * row_bytes, c));
    } else {
        constexpr int WPG = 32 * sizeof(O) / 4; /* 32-bit words per group */
        constexpr int STRIDE = WPG + 1;         /* odd stride: no bank conflicts */
        __shared__ uint32_t tile[DQ_THREADS * STRIDE];
        const int64_t gpr = cols / 32, groups = nr * gpr;
        const int64_t g0 = (int64_t)blockIdx.x * DQ_THREADS;
        const int64_t i = g0 + threadIdx.x;
        if (i < groups) {
            const int64_t r = i / gpr, g = i % gpr;
            float v[32];
            mr_dq32<T>(Wm + (r0 + r) * row_bytes, g, v);
            uint32_t *tw = tile + threadIdx.x * STRIDE;
#pragma unroll
            for (int q = 0; q < WPG; q++) {
                if constexpr (sizeof(O) == 2) {
                    __half2 h2 = __floats2half2_rn(v[2 * q], v[2 * q + 1]);
                    tw[q] = *(uint32_t *)&h2;
                } else {
                    tw[q] = __float_as_uint(v[q]);
                }
            }
        }
        __syncthreads();
        const int64_t ng = groups - g0 < DQ_THREADS ? groups - g0 : DQ_THREADS;
        const int words = (int)ng * WPG;
        uint4 *dst = (uint4 *)(om + g0 * 32); /* 64- or 128-byte aligned: whole groups */
        for (int w4 = threadIdx.x; w4 < words / 4; w4 += DQ_THREADS) {
            const int w = w4 * 4, grp = w / WPG, off = w % WPG;
            const uint32_t *src = tile + grp * STRIDE + off;
            dst[w4] = make_uint4(src[0], src[1], src[2], src[3]);
        }
    }
}

/* f16x3 weight tiles: rows [r0, r0+nr) of n_mats stacked matrices into
 * out[m][r][2 * cols] halves, the scaled low parts in [0, cols) and the high
 * parts in [cols, 2 cols) of each row, so that one GEMM over all 2 cols
 * columns against activation rows (hi | lo) gives W_lo x_hi + W_hi x_lo, and
 * the high half alone (leading dimension 2 cols) gives W_hi x_hi.  Block
 * types: a thread decodes one group of 32 as in k_dequant; the block writes
 * its high and low spans from shared memory with 16-byte stores (a group's
 * 32 halves are 64 aligned bytes; consecutive groups of a row are
 * consecutive in both halves of the output row). */
template <int T>
__global__ void __launch_bounds__(DQ_THREADS)
k_dequant_x3(const uint8_t *W, size_t mat_bytes, size_t row_bytes, int64_t cols, int64_t r0,
             int64_t nr, __half *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const uint8_t *Wm = W + (size_t)blockIdx.y * mat_bytes;
    __half *om = out + (size_t)blockIdx.y * nr * 2 * cols;
    if constexpr (mr_cu_plain_type(T)) {
        const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= nr * cols)
            return;
        const int64_t r = i / cols, c = i % cols;
        x3_split(mr_plain_at<T>(Wm + (r0 + r) * row_bytes, c), &om[r * 2 * cols + cols + c],
                 &om[r * 2 * cols + c]);
    } else {
        constexpr int STRIDE = 17; /* 16 words a group, odd stride: no bank conflicts */
        __shared__ uint32_t tile[2][DQ_THREADS * STRIDE]; /* [0] high, [1] low */
        const int64_t gpr = cols / 32, groups = nr * gpr;
        const int64_t g0 = (int64_t)blockIdx.x * DQ_THREADS;
        const int64_t i = g0 + threadIdx.x;
        if (i < groups) {
            const int64_t r = i / gpr, g = i % gpr;
            float v[32];
            mr_dq32<T>(Wm + (r0 + r) * row_bytes, g, v);
            uint32_t *th = tile[0] + threadIdx.x * STRIDE, *tl = tile[1] + threadIdx.x * STRIDE;
#pragma unroll
            for (int q = 0; q < 16; q++) x3_split2(v[2 * q], v[2 * q + 1], &th[q], &tl[q]);
        }
        __syncthreads();
        const int ng = (int)(groups - g0 < DQ_THREADS ? groups - g0 : DQ_THREADS);
        /* 4 stores of 16 bytes a group and part; u runs over the high part's
         * stores, then the low part's */
        for (int u = threadIdx.x; u < ng * 8; u += DQ_THREADS) {
            const int part = u >= ng * 4, j = u - part * ng * 4, grp = j >> 2, q4 = j & 3;
            const int64_t G = g0 + grp, r = G / gpr, g = G % gpr;
            const uint32_t *src = tile[part] + grp * STRIDE + 4 * q4;
            __half *d = om + r * 2 * cols + (part ? 0 : cols) + 32 * g + 8 * q4;
            *(uint4 *)d = make_uint4(src[0], src[1], src[2], src[3]);
        }
    }
}

/* Gathers activation rows into a GEMM operand.  Row p of the operand is
 * input row src[p] of x (src NULL: row p); negative src: a padding row of
 * zeros; u (or NULL): the row's values are silu(x) * u, as the swiglu op
 * writes them (mr_silu_mul), from the rows src[p] of x and of u.  For float16 the row is scaled by 2^-e with e chosen so that the
 * largest magnitude lands at 2^ROW_SCALE_LOG2; scale[p] = 2^e undoes it.
 * X3 (f16x3): the operand row is 2 cols halves, the high parts of the
 * scaled row, then its scaled low parts. */
template <typename O, bool X3 = false>
__global__ void k_gather_rows(const float *x, int64_t cols, const int32_t *src, O *out,
                              float *scale, const float *u)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int p = blockIdx.x;
    const int s = src ? src[p] : p;
    const int64_t ld = X3 ? 2 * cols : cols;
    O *o = out + (int64_t)p * ld;
    if (s < 0) {
        for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) o[c] = to_out<O>(0.0f);
        if (scale && threadIdx.x == 0) scale[p] = 0.0f;
        return;
    }
    const float *xr = x + (int64_t)s * cols, *ur = u ? u + (int64_t)s * cols : nullptr;
    auto at = [&](int64_t c) { return ur ? mr_silu_mul(xr[c], ur[c]) : xr[c]; };
    float mul = 1.0f;
    if (scale) {
        __shared__ float red[32];
        float m = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(at(c)));
        m = mr_warp_max(m);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
        __syncthreads();
        if (threadIdx.x < 32) {
            m = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
            m = mr_warp_max(m);
            if (threadIdx.x == 0) red[0] = m;
        }
        __syncthreads();
        m = red[0];
        /* m = f * 2^e, f in [0.5, 1): 2^(e - LOG2) brings m below 2^LOG2.
         * A zero, NaN or Inf row keeps scale 1 (NaN/Inf must propagate). */
        int e = 0;
        if (m > 0.0f && isfinite(m)) frexpf(m, &e);
        e -= ROW_SCALE_LOG2;
        if (!(m > 0.0f && isfinite(m))) e = 0;
        mul = ldexpf(1.0f, -e);
        if (threadIdx.x == 0) scale[p] = ldexpf(1.0f, e);
    }
    if constexpr (X3) {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) x3_split(at(c) * mul, &o[c], &o[cols + c]);
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = to_out<O>(at(c) * mul);
    }
}

/* y[dst[p]][r] = Y[p][r] * scale[p] for the gathered rows that are real
 * (dst[p] >= 0); dst NULL: row p, in place. */
__global__ void k_scatter_rows(const float *Y, int64_t rows, const int32_t *dst, const float *scale,
                               float *y)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int p = blockIdx.x;
    const int d = dst ? dst[p] : p;
    if (d < 0)
        return;
    const float s = scale ? scale[p] : 1.0f;
    const float *src = Y + (int64_t)p * rows;
    float *o = y + (int64_t)d * rows;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) o[r] = src[r] * s;
}

/* Fused expert GEMM tiles: MG_BM weight rows x MG_BN tokens of one expert,
 * MG_BK columns per step; 4 warps, warp w owns rows 16w..16w+15 and the
 * tile's 16-token quarters that hold tokens (MG_NJ of them at most).
 *
 * Why 64 tokens a tile: a 512-token prompt of the 30B-A3B shape gives its
 * 128 experts ~32 tokens each, unevenly.  Every tile decodes its expert's
 * weights again, and that decode, not the MMAs, is the kernel's work (ncu,
 * run 93: L1 / shared memory 81% busy, DRAM 5%), so an expert's tokens
 * belong in as few tiles as possible; quarters past a tile's count skip
 * their MMAs.  A result's arithmetic is the same whatever tile or quarter
 * its token lands in (the MMA of a 16 x 16 output block does not depend on
 * the other blocks).  The decoded tile is written 16 bytes a store: with
 * 4-byte stores, 8 rows x 4 groups of a warp met 4-way bank conflicts.
 * Blocks with blockIdx.z = 1 take W2 and y2 instead (gate and up of one
 * grouping in one launch: moe_ffn_prompt). */
#define MG_BM 64
#define MG_BN 64
static_assert(MG_BN == MR_CU_XMH_TOKENS, "k_xmh takes the float16 kernel's tiles (moe_gemm_launch)");
#define MG_NJ (MG_BN / 16)
#define MG_BK 128
#define MG_PAD 8 /* float16 elements of padding per shared row (bank spread; WMMA wants ldm % 8 == 0) */
#define MG_LD (MG_BK + MG_PAD)

/* One tile of work: expert m, its tokens at rows [row0, row0 + cnt) of the
 * gathered operand (cnt <= MG_BN). */
struct mg_tile {
    int m, row0, cnt;
};

/* Group g (32 weights) of a row, decoded and rounded to float16 pairs. */
template <int T>
__device__ __forceinline__ void mg_decode_f16(const uint8_t *row, int64_t g, uint4 out[4])
{
    float v[32];
    mr_dq32<T>(row, g, v);
    uint32_t hw[16];
#pragma unroll
    for (int q = 0; q < 16; q++) {
        const __half2 h = __floats2half2_rn(v[2 * q], v[2 * q + 1]);
        hw[q] = *(const uint32_t *)&h;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) out[q] = make_uint4(hw[4 * q], hw[4 * q + 1], hw[4 * q + 2], hw[4 * q + 3]);
}

/* y[dst[p]][r0 + r] = the staged result of token t (p = row0 + t) times
 * the row's scale, consecutive threads on consecutive rows. */
__device__ __forceinline__ void mg_write_out(const float (*cs)[MG_BN + 4], const mg_tile &tl, int r0, int rows,
                                             const float *scale, const int32_t *dst, float *y)
{
    for (int u = threadIdx.x; u < MG_BM * tl.cnt; u += blockDim.x) {
        const int t = u / MG_BM, r = u % MG_BM;
        const int p = tl.row0 + t;
        y[(size_t)dst[p] * rows + r0 + r] = cs[r][t] * scale[p];
    }
}

template <int T>
__global__ void __launch_bounds__(128)
k_moe_gemm(const uint8_t *W, size_t mat_bytes, size_t row_bytes, int cols, int rows,
           const __half *X, const float *scale, const int32_t *dst, const mg_tile *tiles,
           const int *n_tiles, float *y, const uint8_t *W2, float *y2)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    using namespace nvcuda;
    typedef __half hrow[MG_LD];
    typedef float crow[MG_BN + 4];
    /* the weight and token tiles, then (after the last step) the output staging */
    __shared__ __align__(128) unsigned char sm[(MG_BM + MG_BN) * MG_LD * sizeof(__half)];
    static_assert(MG_BM * (MG_BN + 4) * sizeof(float) <= sizeof sm, "the output staging fits");
    hrow *ws = (hrow *)sm, *xs = ws + MG_BM;
    crow *cs = (crow *)sm;
    if ((int)blockIdx.y >= *n_tiles) /* the grid is sized for the most tiles the call can have */
        return;
    const mg_tile tl = tiles[blockIdx.y];
    const int r0 = blockIdx.x * MG_BM, tid = threadIdx.x, warp = tid >> 5;
    const int nj = (tl.cnt + 15) / 16; /* quarters with tokens (the same for the whole block) */
    if (blockIdx.z) { /* the second matrix of a pair (gate and up) */
        W = W2;
        y = y2;
    }
    const uint8_t *Wm = W + (size_t)tl.m * mat_bytes;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MG_NJ];
#pragma unroll
    for (int j = 0; j < MG_NJ; j++) wmma::fill_fragment(acc[j], 0.0f);
    for (int k0 = 0; k0 < cols; k0 += MG_BK) {
        /* weights: MG_BM rows x MG_BK/32 groups, two groups a thread */
        for (int u = tid; u < MG_BM * (MG_BK / 32); u += 128) {
            const int r = u / (MG_BK / 32), g = u % (MG_BK / 32);
            uint4 h[4];
            mg_decode_f16<T>(Wm + (size_t)(r0 + r) * row_bytes, (k0 >> 5) + g, h);
            uint4 *d = (uint4 *)&ws[r][32 * g];
#pragma unroll
            for (int q = 0; q < 4; q++) d[q] = h[q];
        }
        /* tokens: the quarters with tokens, MG_BK halves a row, 16 bytes a
         * load; rows past cnt are zero */
        for (int u = tid; u < 16 * nj * (MG_BK / 8); u += 128) {
            const int t = u / (MG_BK / 8), c8 = u % (MG_BK / 8);
            uint4 v = make_uint4(0, 0, 0, 0);
            if (t < tl.cnt)
                v = *(const uint4 *)(X + (size_t)(tl.row0 + t) * cols + k0 + 8 * c8);
            *(uint4 *)&xs[t][8 * c8] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::load_matrix_sync(a, &ws[16 * warp][kk], MG_LD);
#pragma unroll
            for (int j = 0; j < MG_NJ; j++) {
                if (j < nj) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                    wmma::load_matrix_sync(b, &xs[16 * j][kk], MG_LD);
                    wmma::mma_sync(acc[j], a, b, acc[j]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < MG_NJ; j++)
        if (j < nj) wmma::store_matrix_sync(&cs[16 * warp][16 * j], acc[j], MG_BN + 4, wmma::mem_row_major);
    __syncthreads();
    mg_write_out(cs, tl, r0, rows, scale, dst, y);
}

/* The f16x3 fused expert GEMM: k_moe_gemm with high and low weight tiles
 * (decoded and split in shared memory) and activation rows of (hi | lo)
 * halves.  Per MG_BK columns a warp runs W_hi x_hi into a fresh accumulator
 * and adds it to its float32 sums with ordinary adds (the tensor cores'
 * truncation never runs more than MG_BK / 16 = 8 steps; top comment), and
 * W_lo x_hi + W_hi x_lo into one accumulator for the whole K.  As in
 * k_moe_gemm, the 16-token quarters past the tile's count (most of them
 * where 256 experts share a prompt) skip their products, which are all zero
 * rows.  Shared memory: two weight tiles and two token tiles, 68 KiB,
 * dynamic (the limit is raised at init); the output staging reuses the high
 * weight tile. */
#define MG_X3_SMEM ((2 * MG_BM + 2 * MG_BN) * MG_LD * (int)sizeof(__half))
static_assert(MG_BM * (MG_BN + 4) * sizeof(float) <= MG_BM * MG_LD * sizeof(__half),
              "the output staging fits in the high weight tile");

template <int T>
__global__ void __launch_bounds__(128)
k_moe_gemm_x3(const uint8_t *W, size_t mat_bytes, size_t row_bytes, int cols, int rows,
              const __half *X, const float *scale, const int32_t *dst, const mg_tile *tiles,
              const int *n_tiles, float *y, const uint8_t *W2, float *y2)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char mg_smem[]; /* WMMA wants 32-byte alignment */
    typedef __half hrow[MG_LD];
    typedef float crow[MG_BN + 4];
    hrow *wh = (hrow *)mg_smem, *wl = wh + MG_BM, *xh = wl + MG_BM, *xl = xh + MG_BN;
    crow *cs = (crow *)mg_smem; /* after the last k step only */
    if ((int)blockIdx.y >= *n_tiles) /* the grid is sized for the most tiles the call can have */
        return;
    const mg_tile tl = tiles[blockIdx.y];
    const int r0 = blockIdx.x * MG_BM, tid = threadIdx.x, warp = tid >> 5;
    if (blockIdx.z) { /* the second matrix of a pair (gate and up) */
        W = W2;
        y = y2;
    }
    const uint8_t *Wm = W + (size_t)tl.m * mat_bytes;
    const size_t ldx = 2 * (size_t)cols;
    const int nj = (tl.cnt + 15) / 16; /* quarters with tokens (the same for the whole block) */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MG_NJ], accx[MG_NJ], part[MG_NJ];
#pragma unroll
    for (int j = 0; j < MG_NJ; j++) {
        wmma::fill_fragment(acc[j], 0.0f);
        wmma::fill_fragment(accx[j], 0.0f);
    }
    for (int k0 = 0; k0 < cols; k0 += MG_BK) {
        /* weights: MG_BM rows x MG_BK/32 groups, two groups a thread, each
         * written as 4 + 4 stores of 16 bytes (high, low) */
        for (int u = tid; u < MG_BM * (MG_BK / 32); u += 128) {
            const int r = u / (MG_BK / 32), g = u % (MG_BK / 32);
            float v[32];
            mr_dq32<T>(Wm + (size_t)(r0 + r) * row_bytes, (k0 >> 5) + g, v);
            uint32_t hw[16], lw[16];
#pragma unroll
            for (int q = 0; q < 16; q++) x3_split2(v[2 * q], v[2 * q + 1], &hw[q], &lw[q]);
            uint4 *dh = (uint4 *)&wh[r][32 * g], *dl = (uint4 *)&wl[r][32 * g];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                dh[q] = make_uint4(hw[4 * q], hw[4 * q + 1], hw[4 * q + 2], hw[4 * q + 3]);
                dl[q] = make_uint4(lw[4 * q], lw[4 * q + 1], lw[4 * q + 2], lw[4 * q + 3]);
            }
        }
        /* tokens: 16 nj rows x MG_BK halves of each part, 16 bytes a load;
         * rows past cnt are zero */
        for (int u = tid; u < 16 * nj * (MG_BK / 8); u += 128) {
            const int t = u / (MG_BK / 8), c8 = u % (MG_BK / 8);
            uint4 h = make_uint4(0, 0, 0, 0), l = h;
            if (t < tl.cnt) {
                const __half *xr = X + (size_t)(tl.row0 + t) * ldx + k0 + 8 * c8;
                h = *(const uint4 *)xr;
                l = *(const uint4 *)(xr + cols);
            }
            *(uint4 *)&xh[t][8 * c8] = h;
            *(uint4 *)&xl[t][8 * c8] = l;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < MG_NJ; j++) wmma::fill_fragment(part[j], 0.0f);
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> ah, al;
            wmma::load_matrix_sync(ah, &wh[16 * warp][kk], MG_LD);
            wmma::load_matrix_sync(al, &wl[16 * warp][kk], MG_LD);
#pragma unroll
            for (int j = 0; j < MG_NJ; j++) {
                if (j < nj) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bh, bl;
                    wmma::load_matrix_sync(bh, &xh[16 * j][kk], MG_LD);
                    wmma::load_matrix_sync(bl, &xl[16 * j][kk], MG_LD);
                    wmma::mma_sync(part[j], ah, bh, part[j]);
                    wmma::mma_sync(accx[j], al, bh, accx[j]);
                    wmma::mma_sync(accx[j], ah, bl, accx[j]);
                }
            }
        }
        /* same fragment type: the elements correspond one to one */
#pragma unroll
        for (int j = 0; j < MG_NJ; j++)
#pragma unroll
            for (int i = 0; i < part[j].num_elements; i++) acc[j].x[i] += part[j].x[i];
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < MG_NJ; j++) {
#pragma unroll
        for (int i = 0; i < acc[j].num_elements; i++) acc[j].x[i] = fmaf(accx[j].x[i], X3_INV, acc[j].x[i]);
        if (j < nj) wmma::store_matrix_sync(&cs[16 * warp][16 * j], acc[j], MG_BN + 4, wmma::mem_row_major);
    }
    __syncthreads();
    mg_write_out(cs, tl, r0, rows, scale, dst, y);
}

/* ---- host side ---- */

enum gemm_mode { GEMM_F16 = 0, GEMM_TF32, GEMM_F32, GEMM_F16X3 };

static gemm_mode mode_of(mr_cu_ctx *c) { return (gemm_mode)c->gemm_mode; }

/* The fused f16x3 kernels need more than the default 48 KiB of dynamic
 * shared memory. */
template <int T>
static void moe_x3_allow_smem(mr_cu_ctx *c)
{
    if constexpr (!mr_cu_plain_type(T))
        MR_CU_TRY(c, cudaFuncSetAttribute(k_moe_gemm_x3<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          MG_X3_SMEM));
}

/* At backend creation: MEMRA_CUDA_GEMM "f16" (default), "f16x3", "tf32" or
 * "f32".  The shared memory limit of the fused f16x3 kernels is raised
 * whatever the mode (be->prefer_float32 may select f16x3 later), once and
 * outside any graph capture. */
void mr_cu_gemm_init(mr_cu_ctx *c)
{
    const char *m = getenv("MEMRA_CUDA_GEMM");
    c->gemm_mode_forced = m && *m;
    c->gemm_mode = m && !strcmp(m, "f32")     ? GEMM_F32
                   : m && !strcmp(m, "tf32")  ? GEMM_TF32
                   : m && !strcmp(m, "f16x3") ? GEMM_F16X3
                                              : GEMM_F16;
    const char *h = getenv("MEMRA_CUDA_HGEMM");
    c->hgemm_cublas = h && !strcmp(h, "cublas");
    mr_cu_hgemm_init(c);
    mr_cu_small_gemm_init(c);
    const char *f = getenv("MEMRA_CUDA_MOE_FUSED");
    c->moe_fused = !(f && !strcmp(f, "0"));
    const char *x3 = getenv("MEMRA_CUDA_MOE_X3");
    c->moe_x3 = x3 && !strcmp(x3, "1");
#define X(TT) moe_x3_allow_smem<TT>(c);
    MR_CU_TYPE_LIST(X)
#undef X
    if (!mr_cu_xmp_init(c)) /* its ring's shared memory: the float16 kernel then */
        c->xmp = 0;
    if (!mr_cu_xmh_init(c))
        c->xmh = false;
}

/* be->prefer_float32: float32-grade GEMMs (f16x3; MEMRA_CUDA_GEMM=f32 keeps
 * the SGEMM reference), unless MEMRA_CUDA_GEMM chose otherwise.  Attention
 * stays on the tensor cores from position 0: until run 211 the hybrids kept
 * float32 prompt attention for a sequence's first 4,096 positions, for one
 * qwen35moe row of run 82 over the bound; run 211's router dumps showed that
 * row to be a routing near-tie (a CPU gap of 2.3e-5 under a 4.0e-5 router
 * difference, on the float32 mode's line), and every hybrid fixture passes
 * with the tensor cores on every row, while the 35B-A3B's 512-token prompt
 * goes 6,838 -> 7,665 tok/s (docs/PERFORMANCE.md).
 *   The fused expert GEMMs stay float16 (MEMRA_CUDA_MOE_X3=1: f16x3).  The
 * hybrids asked for float32 because their recurrent layers carry the
 * rounding of every prompt token: with every product float16 the fixtures'
 * worst rows were 5.6e-3 / 1.3e-2 against the 5e-3 bound (H200, run 15).
 * The products that feed those layers (the dense projections) are what
 * needs it: with the experts alone in float16 qwen35moe's rows against the
 * CPU are 1.0e-3 median, 3.4e-3 worst (Q4_K_M; run 86), the class of the
 * non-hybrid MoE fixture in float16 (0.9e-3 / 1.7e-3), and the 35B-A3B's
 * 512-token prompt 4,289 -> 4,989 tok/s (run 87). */
void mr_cu_prefer_float32(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be); /* products already recorded keep the precision they were asked in */
    if (!c->gemm_mode_forced)
        c->gemm_mode = GEMM_F16X3;
}

template <typename O>
static void dequant_launch(mr_cu_ctx *c, int type, const uint8_t *W, size_t mat_bytes,
                           size_t row_bytes, int64_t cols, int64_t r0, int64_t nr, int mats, O *out)
{
    const unsigned th = DQ_THREADS;
    size_t units = mr_cu_plain_type(type) ? (size_t)(nr * cols) : (size_t)(nr * (cols / 32));
    dim3 grid(mr_cu_blocks(units, th), mats);
    switch (type) {
#define X(TT) case TT: mr_cu_launch(c, k_dequant<TT, O>, grid, th, 0, W, mat_bytes, row_bytes, cols, r0, nr, out); break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: mr_cu_fail(c, "dequant: unsupported type %d", type); return;
    }
    MR_CU_LAUNCHED(c, "dequant");
}

/* f16x3 weight tiles: rows of (lo | hi) halves (k_dequant_x3). */
static void dequant_x3_launch(mr_cu_ctx *c, int type, const uint8_t *W, size_t mat_bytes,
                              size_t row_bytes, int64_t cols, int64_t r0, int64_t nr, int mats,
                              __half *out)
{
    const unsigned th = DQ_THREADS;
    size_t units = mr_cu_plain_type(type) ? (size_t)(nr * cols) : (size_t)(nr * (cols / 32));
    dim3 grid(mr_cu_blocks(units, th), mats);
    switch (type) {
#define X(TT) case TT: mr_cu_launch(c, k_dequant_x3<TT>, grid, th, 0, W, mat_bytes, row_bytes, cols, r0, nr, out); break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: mr_cu_fail(c, "dequant: unsupported type %d", type); return;
    }
    MR_CU_LAUNCHED(c, "dequant (f16x3)");
}

/* C (m x n, column-major, ldc) = alpha A^T B + beta C: A is k x m with
 * leading dimension lda (our row-major weight rows), B k x n with ldb (our
 * token rows), batched over `batch` matrices with the given strides.
 * float16 operands go to k_hgemm (cu_hgemm.cu), whose rows come out the same
 * whatever the call's size, unless MEMRA_CUDA_HGEMM=cublas; the float32
 * modes (tf32, f32: checks and references) and operands k_hgemm cannot load
 * go to cuBLAS. */
static bool gemm_ex(mr_cu_ctx *c, const char *what, cudaDataType_t t, cublasComputeType_t ct, int m,
                    int n, int k, float alpha, const void *A, int lda, long long sa, const void *B,
                    int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch)
{
    if (t == CUDA_R_16F && !c->hgemm_cublas &&
        mr_cu_hgemm(c, m, n, k, alpha, (const __half *)A, lda, sa, (const __half *)B, ldb, sb, beta, C, ldc, sc,
                    batch))
        return !c->failed;
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A, t, lda, B, t, ldb,
                          &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A, t,
                                        lda, sa, B, t, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                        ct, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        mr_cu_fail(c, "%s: cuBLAS GEMM failed (%d)", what, (int)st);
        return false;
    }
    return true;
}

/* The product of the mode: C = A^T B with A's and B's rows of k elements
 * in the mode's type, strides sa and sb in elements; f16x3: an element is
 * two halves, rows of 2k halves, A's (lo | hi) from k_dequant_x3, B's
 * (hi | lo) from k_gather_rows<__half, true>.  f16x3 order and chunks: top
 * comment. */
static bool gemm(mr_cu_ctx *c, gemm_mode md, const char *what, int m, int n, int k, const void *A,
                 long long sa, const void *B, long long sb, float *C, int ldc, long long sc,
                 int batch)
{
    if (md == GEMM_F16X3) {
        const __half *Ah = (const __half *)A, *Bh = (const __half *)B;
        /* 2^-11 (W_lo x_hi + W_hi x_lo): all 2k columns of both */
        if (!gemm_ex(c, what, CUDA_R_16F, CUBLAS_COMPUTE_32F, m, n, 2 * k, X3_INV, Ah, 2 * k, 2 * sa, Bh,
                     2 * k, 2 * sb, 0.0f, C, ldc, sc, batch))
            return false;
        /* + W_hi x_hi, X3_KC columns a call */
        for (int k0 = 0; k0 < k; k0 += X3_KC) {
            const int kc = k - k0 < X3_KC ? k - k0 : X3_KC;
            if (!gemm_ex(c, what, CUDA_R_16F, CUBLAS_COMPUTE_32F, m, n, kc, 1.0f, Ah + k + k0, 2 * k,
                         2 * sa, Bh + k0, 2 * k, 2 * sb, 1.0f, C, ldc, sc, batch))
                return false;
        }
        return true;
    }
    cudaDataType_t t = md == GEMM_F16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t ct = md == GEMM_F16    ? CUBLAS_COMPUTE_32F
                             : md == GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                               : CUBLAS_COMPUTE_32F_PEDANTIC;
    return gemm_ex(c, what, t, ct, m, n, k, 1.0f, A, k, sa, B, k, sb, 0.0f, C, ldc, sc, batch);
}

/* Bytes of an operand element in the mode's scratch (f16x3: two halves). */
static size_t elem_bytes(gemm_mode md) { return md == GEMM_F16 ? 2 : 4; }

/* Activations in the GEMM's input type: x itself for float32 modes, else a
 * scaled float16 copy (f16x3: high and low parts) in scratch_act with
 * per-row scales after it. */
static const void *prepare_x(mr_cu_ctx *c, gemm_mode md, const float *x, int64_t cols, int n_rows,
                             const int32_t *src, float **scale, const float *u = nullptr)
{
    *scale = NULL;
    size_t xb = (size_t)n_rows * cols * elem_bytes(md);
    xb = (xb + 255) & ~(size_t)255;
    if (!mr_cu_reserve(c, &c->scratch_act, xb + (size_t)n_rows * 4, "GEMM activations"))
        return NULL;
    char *base = (char *)c->scratch_act.p;
    unsigned th = cols >= 1024 ? 256 : 128;
    if (md == GEMM_F16 || md == GEMM_F16X3) {
        *scale = (float *)(base + xb);
        if (md == GEMM_F16X3)
            mr_cu_launch(c, k_gather_rows<__half, true>, n_rows, th, 0, x, cols, src, (__half *)base, *scale, u);
        else
            mr_cu_launch(c, k_gather_rows<__half>, n_rows, th, 0, x, cols, src, (__half *)base, *scale, u);
    } else {
        if (!src && !u)
            return x;
        mr_cu_launch(c, k_gather_rows<float>, n_rows, th, 0, x, cols, src, (float *)base, nullptr, u);
    }
    MR_CU_LAUNCHED(c, "gemm gather");
    return base;
}

/* Weight rows [r0, r0 + nr) of `mats` matrices into scratch in the mode's
 * operand form. */
static void dequant_mode(mr_cu_ctx *c, gemm_mode md, int type, const uint8_t *W, size_t mat_bytes,
                         size_t row_bytes, int64_t cols, int64_t r0, int64_t nr, int mats, void *out)
{
    if (md == GEMM_F16X3)
        dequant_x3_launch(c, type, W, mat_bytes, row_bytes, cols, r0, nr, mats, (__half *)out);
    else if (md == GEMM_F16)
        dequant_launch(c, type, W, mat_bytes, row_bytes, cols, r0, nr, mats, (__half *)out);
    else
        dequant_launch(c, type, W, mat_bytes, row_bytes, cols, r0, nr, mats, (float *)out);
}

/* Bytes of dequantized weights a prompt product holds in scratch at once
 * (a matrix past it runs in row chunks). */
#define GEMM_SCRATCH_W ((int64_t)128 << 20)

/* Columns a partial sum of a float16 GEMM for a matrix of this shape, or 0
 * (k in one accumulator).  k_hgemm walks all of k in sequence a block, and
 * a matrix of few rows makes few blocks for a prompt: the 30B-A3B's 512 x
 * 2048 K and V projections were 32 blocks of 32 steps on 132 SMs (36 us a
 * call, run 87).  Cut into chunks (a batched launch, one partial sum a
 * chunk, joined in chunk order), such a matrix fills the card; the chunks
 * are a function of the shape alone, never of the call's tokens, so a
 * prompt row keeps its bits in any call (NUMERICS.md). */
static int64_t split_cols(gemm_mode md, int64_t rows, int64_t cols)
{
    if (md != GEMM_F16) /* f16x3 has its chunks; the float32 modes are cuBLAS's */
        return 0;
    const int64_t kc = rows <= 512 ? 512 : rows <= 2048 ? 1024 : 0;
    return kc && cols > kc && cols % kc == 0 ? kc : 0;
}

/* y (n x rows, column-major C: ldc rows) = the float16 product of A (rows
 * x cols, the dequantized weights) and the tokens xg, k whole (kc 0) or in
 * split_cols' chunks of kc columns whose partial sums (part: cols / kc x n x
 * rows floats, the caller's scratch) are joined in chunk order.  False
 * where k_hgemm cannot load the operands. */
static bool hgemm_by_shape(mr_cu_ctx *c, const __half *A, int64_t rows, int64_t cols, const __half *xg, int n,
                           int64_t kc, float *part, float *y)
{
    if (!kc)
        return mr_cu_hgemm(c, (int)rows, n, (int)cols, 1.0f, A, (int)cols, 0, xg, (int)cols, 0, 0.0f, y, (int)rows, 0,
                           1);
    const int nc = (int)(cols / kc);
    const size_t each = (size_t)n * (size_t)rows;
    if (!mr_cu_hgemm(c, (int)rows, n, (int)kc, 1.0f, A, (int)cols, kc, xg, (int)cols, kc, 0.0f, part, (int)rows,
                     (long long)each, nc))
        return false;
    mr_cu_join_partials(c, part, nc, each, y);
    return true;
}

/* y[n][rows] = x[n][cols] * W^T for a plain matrix. */
void mr_cu_matmul_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    const gemm_mode md = mode_of(c);
    const int64_t cols = w->cols, rows = w->rows;
    /* IQ4_XS on the int8 tensor cores (cu_moemmp.cu), the input in 3
     * planes, where float32-grade products are asked for (f16x3: three
     * float16 MMAs a product, 296 -> 205 us for the 35B-A3B's in-projection
     * at 512 tokens, run 173).  Not in f16 mode: there each 32-token tile
     * looks the weights up again, and Q4_K that way was 1.75x slower than
     * the float16 GEMM on the 30B-A3B's q and o (run 175). */
    if (md == GEMM_F16X3 && mr_cu_xmp_takes(c, w)) {
        mr_cu_xmp_product(c, w, nullptr, x, nullptr, nullptr, n, 3, nullptr, nullptr, nullptr, 0, y, nullptr);
        return;
    }
    /* few weights: float32 sums, one launch (cu_sgemm.cu); never in the
     * float32 reference modes, whose products stay cuBLAS's */
    if ((md == GEMM_F16 || md == GEMM_F16X3) && mr_cu_small_gemm_takes(c, w, md == GEMM_F16X3)) {
        mr_cu_small_gemm(c, w, x, y, n);
        return;
    }
    const size_t eb = elem_bytes(md);
    float *scale;
    const void *xg = prepare_x(c, md, x, cols, n, NULL, &scale);
    if (!xg)
        return;
    int64_t chunk = GEMM_SCRATCH_W / (cols * (int64_t)eb);
    if (chunk < 1) chunk = 1;
    if (chunk > rows) chunk = rows;
    if (!mr_cu_reserve(c, &c->scratch_w, (size_t)(chunk * cols) * eb, "matmul scratch"))
        return;
    const uint8_t *W = (const uint8_t *)w->data;
    const int64_t kc = c->hgemm_cublas || chunk < rows ? 0 : split_cols(md, rows, cols);
    if (kc) { /* the whole matrix at once, k in chunks: partial sums, then their join */
        const int nc = (int)(cols / kc);
        if (!mr_cu_reserve(c, &c->scratch_split, (size_t)nc * n * rows * sizeof(float), "GEMM partial sums"))
            return;
        dequant_mode(c, md, w->type, W, 0, w->row_bytes, cols, 0, rows, 1, c->scratch_w.p);
        if (!hgemm_by_shape(c, (const __half *)c->scratch_w.p, rows, cols, (const __half *)xg, n, kc,
                            (float *)c->scratch_split.p, y)) {
            mr_cu_fail(c, "%s: GEMM operands the split cannot load", w->name ? w->name : "matmul");
            return;
        }
    } else {
        /* each chunk's k_dequant rewrites the scratch the previous chunk's
         * GEMM read: launched with PDL it may start early, but its
         * mr_pdl_wait returns only once that GEMM has completed (cu_pdl.cuh) */
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
            dequant_mode(c, md, w->type, W, 0, w->row_bytes, cols, r0, nr, 1, c->scratch_w.p);
            if (!gemm(c, md, w->name ? w->name : "matmul", (int)nr, n, (int)cols, c->scratch_w.p, 0, xg, 0,
                      y + r0, (int)rows, 0, 1))
                return;
        }
    }
    if (scale) {
        mr_cu_launch(c, k_scatter_rows, n, 256, 0, y, rows, nullptr, scale, y);
        MR_CU_LAUNCHED(c, "gemm scale");
    }
}

/* The outputs of a fused prompt product (mr_cu_matmul_gemm_multi): matrix
 * s's rows are rows [off[s], off[s + 1]) of the joined result. */
struct gm_split {
    float *y[MR_CU_MV_SUBS];
    int64_t off[MR_CU_MV_SUBS + 1];
    int m;
};

/* Block (t, s): token t's rows of matrix s out of the joined result Y (R =
 * off[m] floats a token) into y[s], times the token's row scale (a power of
 * two: k_scatter_rows' product, so the same floats). */
__global__ void k_split_rows(const float *Y, gm_split a, const float *scale)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int t = blockIdx.x, s = blockIdx.y;
    float *y = a.y[0];
    int64_t o0 = a.off[0], o1 = a.off[1];
#pragma unroll
    for (int u = 1; u < MR_CU_MV_SUBS; u++) /* unrolled selects: no local copy of the arrays */
        if (u == s) y = a.y[u], o0 = a.off[u], o1 = a.off[u + 1];
    const int64_t rows = o1 - o0;
    const float sc = scale ? scale[t] : 1.0f;
    const float *src = Y + (int64_t)t * a.off[a.m] + o0;
    float *dst = y + (int64_t)t * rows;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) dst[r] = src[r] * sc;
}

/* Whether mr_cu_matmul_gemm_multi takes these m matrices: the float16 mode
 * on k_hgemm, plain matrices of one width whose separate calls would each
 * take the dequantize-and-GEMM path whole (not the float32 small products,
 * not the int8 IQ4_XS path of f16x3, not cut into row chunks), their
 * float16 copies together within GEMM_SCRATCH_W.
 * A rule on the shapes alone, so a prompt row meets the same kernel in
 * every call. */
static bool gemm_multi_ok(mr_cu_ctx *c, const mr_weight *const *w, int m, int64_t *total_rows)
{
    if (mode_of(c) != GEMM_F16 || c->hgemm_cublas || m < 2 || m > MR_CU_MV_SUBS)
        return false;
    const int64_t cols = w[0]->cols;
    int64_t R = 0;
    for (int s = 0; s < m; s++) {
        const mr_weight *v = w[s];
        if (!v || !v->data || v->cols != cols || v->n_mats > 1 || cols % 8 || mr_cu_small_gemm_takes(c, v, false))
            return false;
        R += v->rows;
    }
    *total_rows = R;
    return R <= INT_MAX && R * cols * 2 <= GEMM_SCRATCH_W;
}

/* m prompt products over one input as one float16 GEMM: x converted once,
 * each matrix dequantized into its rows of one scratch block, one k_hgemm
 * over the R joined rows (a 512-row k or v alone is 16 blocks of 128 x 128
 * at 512 tokens, ~35 TFLOP/s: GPU-NOTES 127), then each matrix's rows out
 * with the row scale.  A row's sum is k_hgemm's for that row of A and
 * column of B, so q keeps the bits of its own call; matrices that called
 * alone would have split their k (split_cols: 512-row k and v) are summed
 * whole here, a rule of the joined shape.  False, nothing launched, where
 * gemm_multi_ok refuses. */
bool mr_cu_matmul_gemm_multi(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x, int n)
{
    int64_t R = 0;
    if (n < 1 || !gemm_multi_ok(c, w, m, &R))
        return false;
    const gemm_mode md = GEMM_F16;
    const int64_t cols = w[0]->cols;
    float *scale;
    const void *xg = prepare_x(c, md, x, cols, n, NULL, &scale);
    if (!xg || !mr_cu_reserve(c, &c->scratch_w, (size_t)(R * cols) * 2, "matmul scratch"))
        return true; /* the sticky error */
    gm_split sp = {};
    sp.m = m;
    __half *A = (__half *)c->scratch_w.p;
    for (int s = 0; s < m; s++) {
        sp.y[s] = y[s];
        sp.off[s + 1] = sp.off[s] + w[s]->rows;
        dequant_mode(c, md, w[s]->type, (const uint8_t *)w[s]->data, 0, w[s]->row_bytes, cols, 0, w[s]->rows, 1,
                     A + sp.off[s] * cols);
    }
    const int64_t kc = split_cols(md, R, cols);
    const int nc = kc ? (int)(cols / kc) : 0;
    const size_t joined = (size_t)n * (size_t)R;
    if (!mr_cu_reserve(c, &c->scratch_split, (nc + 1) * joined * sizeof(float), "GEMM partial sums"))
        return true;
    float *part = (float *)c->scratch_split.p, *Y = part + (size_t)nc * joined;
    if (!hgemm_by_shape(c, A, R, cols, (const __half *)xg, n, kc, part, Y)) {
        mr_cu_fail(c, "matmul: GEMM operands of %d joined products it cannot load", m);
        return true;
    }
    mr_cu_launch(c, k_split_rows, dim3((unsigned)n, (unsigned)m), 256, 0, (const float *)Y, sp, (const float *)scale);
    MR_CU_LAUNCHED(c, "gemm split");
    return true;
}

template <int T>
static void moe_launch(mr_cu_ctx *c, bool x3, dim3 grid, const uint8_t *W, size_t mat_bytes,
                       size_t row_bytes, int cols, int rows, const __half *X, const float *scale,
                       const int32_t *dst, const mg_tile *tiles, const int *n_tiles, float *y, const uint8_t *W2,
                       float *y2)
{
    if constexpr (!mr_cu_plain_type(T)) { /* the caller sends block types only */
        if (x3)
            mr_cu_launch(c, k_moe_gemm_x3<T>, grid, 128, MG_X3_SMEM, W, mat_bytes, row_bytes, cols, rows, X, scale,
                         dst, tiles, n_tiles, y, W2, y2);
        else
            mr_cu_launch(c, k_moe_gemm<T>, grid, 128, 0, W, mat_bytes, row_bytes, cols, rows, X, scale, dst, tiles,
                         n_tiles, y, W2, y2);
    }
}

/* The grouping of moe_gemm_fused, on the device (one block): the pairs'
 * expert ids are never read back, so the host neither waits for the router
 * nor stalls the stream.  (cu_fast.cu's k_moe_group groups a decode
 * batch's pairs too, but in no fixed order within an expert: its products
 * sum every pair on its own, while here pairs share tiles, and a fixed
 * layout keeps a call's bits the same from run to run.)  Writes, for the P = n k pairs:
 *   map[0, P)   the input row of x of each gathered row (-1 past the valid
 *               pairs: a zero row),
 *   map[P, 2P)  the output row (the pair) of each gathered row,
 *   tiles       runs of up to bn gathered rows of one expert (MG_BN for
 *               k_moe_gemm, mr_cu_xmp_tile_tokens for k_xmp), *n_tiles
 *               of them,
 * with the pairs of an expert in pair order, as the host grouping had them:
 * a stable counting sort.  Counts (atomics: order-free) and their scans
 * first; then the pairs in rounds of one a thread, each pair's place among
 * its expert's pairs of the round from the warp's matching lanes and the
 * earlier warps' counts of that expert (a histogram a warp in shared
 * memory), so the layout is the same every call.  A pair whose id is out
 * of range is left out and gets a NaN output row here, in every output of
 * the call (mg_nan_out). */
/* Where k_moe_group_tiles writes the NaN rows of bad ids: up to three
 * outputs (gate, up and down of a mixture layer), each rows wide. */
struct mg_nan_out {
    float *y[3];
    int64_t rows[3];
};

#define MG_GROUP_THREADS 512
#define MG_GROUP_WARPS (MG_GROUP_THREADS / 32)
#define MG_GROUP_MAX_MATS 512 /* shared memory: a histogram row per warp */
__global__ void __launch_bounds__(MG_GROUP_THREADS)
k_moe_group_tiles(const int32_t *ids, int P, int mats, int k, int x_slots, int bn, int32_t *map, mg_tile *tiles,
                  int *n_tiles, mg_nan_out no)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ int mg_group_smem[];
    int *fill = mg_group_smem, *start = fill + mats, *tstart = start + mats + 1;
    int *hist = tstart + mats + 1; /* [MG_GROUP_WARPS][mats] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < mats; e += MG_GROUP_THREADS) fill[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += MG_GROUP_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < mats) {
            atomicAdd(&fill[e], 1);
        } else {
            const float nan = __int_as_float(0x7fc00000);
            for (int o = 0; o < 3; o++)
                if (no.y[o])
                    for (int64_t r = 0; r < no.rows[o]; r++) no.y[o][(int64_t)p * no.rows[o] + r] = nan;
        }
    }
    __syncthreads();
    /* exclusive scans of the counts and of the tiles an expert needs, by
     * warp 0 in runs of 32 experts */
    if (warp == 0) {
        int run = 0, trun = 0;
        for (int e0 = 0; e0 < mats; e0 += 32) {
            const int e = e0 + lane;
            const int c = e < mats ? fill[e] : 0, t = (c + bn - 1) / bn;
            int ic = c, it = t;
            mr_warp_scan2(&ic, &it);
            if (e < mats) {
                start[e] = run + ic - c;
                tstart[e] = trun + it - t;
            }
            run += __shfl_sync(0xffffffffu, ic, 31);
            trun += __shfl_sync(0xffffffffu, it, 31);
        }
        if (lane == 0) {
            start[mats] = run;
            tstart[mats] = trun;
            *n_tiles = trun;
        }
    }
    __syncthreads();
    const int valid = start[mats];
    for (int p = valid + tid; p < P; p += MG_GROUP_THREADS) {
        map[p] = -1;
        map[P + p] = -1;
    }
    for (int e = tid; e < mats; e += MG_GROUP_THREADS) {
        const int ce = start[e + 1] - start[e];
        for (int t = 0; t * bn < ce; t++)
            tiles[tstart[e] + t] = {e, start[e] + t * bn, ce - t * bn < bn ? ce - t * bn : bn};
        fill[e] = start[e]; /* from here: the next free row of expert e */
    }
    int *my_hist = hist + warp * mats;
    for (int p0 = 0; p0 < P; p0 += MG_GROUP_THREADS) {
        const int p = p0 + tid;
        const int e = p < P ? ids[p] : -1;
        const bool ok = e >= 0 && e < mats;
        for (int i = lane; i < mats; i += 32) my_hist[i] = 0;
        __syncwarp();
        const unsigned same = __match_any_sync(0xffffffffu, ok ? e : -1);
        const int before = __popc(same & ((1u << lane) - 1)); /* matching lanes before this one */
        if (ok && before == 0)
            my_hist[e] = __popc(same);
        __syncthreads(); /* every warp's histogram and the fills of the last round */
        if (ok) {
            int row = fill[e] + before;
            for (int w = 0; w < warp; w++) row += hist[w * mats + e];
            map[row] = (p / k) * x_slots + (x_slots > 1 ? p % k : 0);
            map[P + row] = p;
        }
        __syncthreads();
        for (int i = tid; i < mats; i += MG_GROUP_THREADS) {
            int add = 0;
            for (int w = 0; w < MG_GROUP_WARPS; w++) add += hist[w * mats + i];
            fill[i] += add;
        }
        __syncthreads();
    }
}

/* The f16 / f16x3 expert products through k_moe_gemm / k_moe_gemm_x3: the
 * token-expert pairs are ordered by expert (no padding) on the device
 * (k_moe_group_tiles), gathered and scaled to float16 once, and cut into tiles of
 * up to MG_BN tokens of one expert.  The tile count is known only on the
 * device, so the grid has the most tiles P pairs can make (every expert
 * with tokens may leave one partial tile) and blocks past the count return. */
struct mg_grouping {
    int32_t *map; /* [0, P): the gathered rows' input rows; [P, 2P): their pairs */
    mg_tile *tiles;
    int *n_tiles;
    int64_t max_tiles;
};

/* Groups the P = n k pairs into c->scratch_moe.  -1: more experts than the
 * grouping holds in shared memory (nothing done: the caller groups on the
 * host); 1: failed (recorded); 0: done. */
static int moe_group(mr_cu_ctx *c, const int32_t *ids, int P, int64_t mats, int k, int x_slots,
                     const mg_nan_out &no, mg_grouping *g, int bn = MG_BN)
{
    if (mats > MG_GROUP_MAX_MATS)
        return -1;
    const size_t smem = (size_t)(3 * mats + 2 + MG_GROUP_WARPS * mats) * sizeof(int); /* <= 38 KiB */
    g->max_tiles = P / bn + (mats < P ? mats : P);
    if (g->max_tiles > 65535) {
        mr_cu_fail(c, "matmul_id: up to %lld expert tiles (max 65535)", (long long)g->max_tiles);
        return 1;
    }
    const size_t map_b = (size_t)P * 8, tile_b = (size_t)g->max_tiles * sizeof(mg_tile);
    if (!mr_cu_reserve(c, &c->scratch_moe, map_b + tile_b + sizeof(int), "expert GEMM map"))
        return 1;
    g->map = (int32_t *)c->scratch_moe.p;
    g->tiles = (mg_tile *)((char *)c->scratch_moe.p + map_b);
    g->n_tiles = (int *)((char *)g->tiles + tile_b);
    mr_cu_launch(c, k_moe_group_tiles, 1, MG_GROUP_THREADS, smem, ids, P, (int)mats, k, x_slots, bn, g->map,
                 g->tiles, g->n_tiles, no);
    MR_CU_LAUNCHED(c, "expert grouping");
    return 0;
}

/* The fused kernel for w (and w2, of w's type and shape, into y2: blockIdx.z
 * picks the matrix) on grouped, gathered rows xg. */
static void moe_gemm_launch(mr_cu_ctx *c, gemm_mode md, const mr_weight *w, const mr_weight *w2, const void *xg,
                            const float *scale, const mg_grouping &g, int P, float *y, float *y2)
{
    if (md == GEMM_F16 && mr_cu_xmh_takes(c, w)) { /* weights decoded in registers: the same operand and tiles */
        mr_cu_xmh_product(c, w, w2, (const __half *)xg, scale, g.map + P, g.tiles, g.n_tiles, g.max_tiles, y, y2);
        return;
    }
    const int64_t rows = w->rows;
    dim3 grid((unsigned)(rows / MG_BM), (unsigned)g.max_tiles, w2 ? 2 : 1);
    const uint8_t *W = (const uint8_t *)w->data, *W2 = w2 ? (const uint8_t *)w2->data : nullptr;
    const size_t mat_bytes = w->row_bytes * (size_t)rows;
    switch (w->type) {
#define X(TT) case TT: moe_launch<TT>(c, md == GEMM_F16X3, grid, W, mat_bytes, w->row_bytes, (int)w->cols, \
                                      (int)rows, (const __half *)xg, scale, g.map + P, g.tiles, g.n_tiles, y, \
                                      W2, y2); break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: mr_cu_fail(c, "matmul_id: unsupported type %d", w->type); return;
    }
    MR_CU_LAUNCHED(c, "expert GEMM (fused)");
}

/* Whether the int8 expert kernels (cu_moemmp.cu) take w in mode md: where
 * moe_gemm_launch's float16 kernel with the weights decoded in registers
 * (cu_moemmh.cu) does not. */
static bool moe_xmp(const mr_cu_ctx *c, gemm_mode md, const mr_weight *w)
{
    return md == GEMM_F16 && !mr_cu_xmh_takes(c, w) && mr_cu_xmp_takes(c, w);
}

/* False: more experts than the grouping holds (the caller then groups on
 * the host). */
static bool moe_gemm_fused(mr_cu_ctx *c, gemm_mode md, const mr_weight *w, const float *x, int x_slots,
                           const int32_t *ids, int k, float *y, int n)
{
    const int P = n * k;
    mg_grouping g;
    const bool xmp = moe_xmp(c, md, w);
    const int r = moe_group(c, ids, P, w->n_mats, k, x_slots, {{y, nullptr, nullptr}, {w->rows, 0, 0}}, &g,
                            xmp ? mr_cu_xmp_tile_tokens() : MG_BN);
    if (r)
        return r > 0;
    if (xmp) {
        mr_cu_xmp_product(c, w, nullptr, x, g.map, nullptr, P, 2, g.map + P, g.tiles, g.n_tiles, g.max_tiles, y,
                          nullptr);
        return true;
    }
    float *scale;
    const void *xg = prepare_x(c, md, x, w->cols, P, g.map, &scale);
    if (xg)
        moe_gemm_launch(c, md, w, nullptr, xg, scale, g, P, y, nullptr);
    return true;
}

/* The fused expert kernels' precision in mode md: f16x3 only where asked
 * (MEMRA_CUDA_MOE_X3=1; cu_gemm_init says why). */
static gemm_mode moe_mode(mr_cu_ctx *c, gemm_mode md) { return md == GEMM_F16X3 && !c->moe_x3 ? GEMM_F16 : md; }

/* Whether the fused kernels take w in mode md. */
static bool moe_fused_ok(mr_cu_ctx *c, gemm_mode md, const mr_weight *w)
{
    return (md == GEMM_F16 || md == GEMM_F16X3) && c->moe_fused && !mr_cu_plain_type(w->type) &&
           w->rows % MG_BM == 0 && w->cols % MG_BK == 0;
}

/* ... and a pair of one type and shape (gate and up) in one launch. */
static bool moe_pair_ok(mr_cu_ctx *c, gemm_mode md, const mr_weight *wa, const mr_weight *wb)
{
    return moe_fused_ok(c, md, wa) && wa->type == wb->type && wa->cols == wb->cols && wa->rows == wb->rows &&
           wa->n_mats == wb->n_mats && wa->row_bytes == wb->row_bytes;
}

/* moe_ffn_prompt on the fused path: the pairs grouped and the tokens
 * gathered once for gate and up, both in one launch (blockIdx.z picks the
 * matrix), then down on the same grouping (its input rows, the pairs, are
 * the grouping's second map).  Calls of their own would group the pairs
 * three times, gather the tokens twice and pass over the swiglu op's output;
 * here the down product's gather takes silu(gate) * up from the pairs' gate
 * and up rows with the swiglu op's expression: the same bits.
 * False (nothing done) where the fused path does not take the three. */
bool mr_cu_moe_ffn_gemm(mr_cu_ctx *c, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd, const float *x,
                        const int32_t *ids, int k, float *gate, float *up, float *y, int n)
{
    const gemm_mode md = mode_of(c), mm = moe_mode(c, md);
    if (!moe_pair_ok(c, md, wg, wu) || !moe_fused_ok(c, md, wd) || wd->n_mats != wg->n_mats ||
        wd->cols != wg->rows)
        return false;
    const int P = n * k;
    mg_grouping g;
    const bool xmp_gu = moe_xmp(c, mm, wg), xmp = xmp_gu && moe_xmp(c, mm, wd);
    const int r = moe_group(c, ids, P, wg->n_mats, k, 1, {{gate, up, y}, {wg->rows, wg->rows, wd->rows}}, &g,
                            xmp_gu ? mr_cu_xmp_tile_tokens() : MG_BN);
    if (r)
        return r > 0;
    if (xmp_gu) { /* gate and up, then down over silu(gate) * up of the pairs (the grouping's second map) */
        mr_cu_xmp_product(c, wg, wu, x, g.map, nullptr, P, 2, g.map + P, g.tiles, g.n_tiles, g.max_tiles, gate, up);
        if (xmp) {
            mr_cu_xmp_product(c, wd, nullptr, gate, g.map + P, up, P, 2, g.map + P, g.tiles, g.n_tiles, g.max_tiles,
                              y, nullptr);
            return true;
        }
        /* a down the int8 path does not take (Q4_K_M's Q6_K) on the float16
         * kernel, on a grouping of its own tiles: the products of the calls apart */
        mg_grouping g2;
        if (moe_group(c, ids, P, wd->n_mats, k, 1, {{y, nullptr, nullptr}, {wd->rows, 0, 0}}, &g2))
            return true; /* failed (recorded); -1 cannot happen: the first grouping held these experts */
        float *scale;
        const void *xg = prepare_x(c, mm, gate, wd->cols, P, g2.map + P, &scale, up);
        if (xg)
            moe_gemm_launch(c, mm, wd, nullptr, xg, scale, g2, P, y, nullptr);
        return true;
    }
    float *scale;
    const void *xg = prepare_x(c, mm, x, wg->cols, P, g.map, &scale);
    if (!xg)
        return true;
    moe_gemm_launch(c, mm, wg, wu, xg, scale, g, P, gate, up);
    /* the GEMM above reads the gathered tokens before this gather
     * overwrites them: stream order (and the gather's PDL wait) */
    xg = prepare_x(c, mm, gate, wd->cols, P, g.map + P, &scale, up);
    if (xg)
        moe_gemm_launch(c, mm, wd, nullptr, xg, scale, g, P, y, nullptr);
    return true;
}

/* Expert products for a prompt, grouped by expert (see the top comment).
 * The fused path groups on the device and writes NaN rows for out-of-range
 * ids itself; the padded path reads the ids back and returns false, having
 * done nothing, when one is out of range: the caller then takes the matvec
 * path, which writes NaN rows for those. */
bool mr_cu_matmul_id_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n)
{
    const gemm_mode md = mode_of(c);
    const int64_t cols = w->cols, rows = w->rows, mats = w->n_mats;
    const int P = n * k;
    if (moe_fused_ok(c, md, w) && moe_gemm_fused(c, moe_mode(c, md), w, x, x_slots, ids, k, y, n))
        return true;
    /* the padded path: grouped on the host */
    std::vector<int32_t> h_ids((size_t)P);
    cudaError_t e = cudaMemcpyAsync(h_ids.data(), ids, (size_t)P * 4, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        mr_cu_fail(c, "matmul_id: reading expert ids: %s", cudaGetErrorString(e));
        return true;
    }
    std::vector<int> count((size_t)mats, 0);
    for (int p = 0; p < P; p++) {
        if (h_ids[p] < 0 || h_ids[p] >= mats)
            return false;
        count[h_ids[p]]++;
    }
    int maxc = 0;
    for (int64_t m = 0; m < mats; m++) maxc = count[m] > maxc ? count[m] : maxc;
    /* Padded operand: expert m owns rows [m*maxc, (m+1)*maxc).  src[row] is
     * the input row of x (or -1: padding); dst[row] the output row of y. */
    const int64_t R = mats * maxc;
    std::vector<int32_t> map((size_t)R * 2, -1);
    std::vector<int> fill((size_t)mats, 0);
    for (int p = 0; p < P; p++) {
        int m = h_ids[p];
        int64_t row = (int64_t)m * maxc + fill[m]++;
        int t = p / k, j = p % k;
        map[row] = t * x_slots + (x_slots > 1 ? j : 0);
        map[R + row] = p;
    }
    const size_t eb = elem_bytes(md);
    size_t need = (size_t)R * 8 + (size_t)R * rows * 4;
    if (!mr_cu_reserve(c, &c->scratch_moe, need, "expert GEMM rows"))
        return true;
    int32_t *d_map = (int32_t *)c->scratch_moe.p;
    float *Y = (float *)(d_map + R * 2);
    e = cudaMemcpyAsync(d_map, map.data(), (size_t)R * 8, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) {
        mr_cu_fail(c, "matmul_id: uploading the expert map: %s", cudaGetErrorString(e));
        return true;
    }
    float *scale;
    const void *xg = prepare_x(c, md, x, cols, (int)R, d_map, &scale);
    if (!xg)
        return true;
    /* experts dequantized in groups of up to 512 MiB */
    int64_t per = ((int64_t)512 << 20) / (rows * cols * (int64_t)eb);
    if (per < 1) per = 1;
    if (per > mats) per = mats;
    if (!mr_cu_reserve(c, &c->scratch_w, (size_t)(per * rows * cols) * eb, "expert GEMM scratch"))
        return true;
    const uint8_t *W = (const uint8_t *)w->data;
    const size_t mat_bytes = w->row_bytes * (size_t)rows;
    for (int64_t m0 = 0; m0 < mats; m0 += per) {
        int64_t nm = mats - m0 < per ? mats - m0 : per;
        dequant_mode(c, md, w->type, W + m0 * mat_bytes, mat_bytes, w->row_bytes, cols, 0, rows, (int)nm,
                     c->scratch_w.p);
        const char *B = (const char *)xg + (size_t)(m0 * maxc * cols) * eb;
        if (!gemm(c, md, w->name ? w->name : "matmul_id", (int)rows, maxc, (int)cols, c->scratch_w.p,
                  rows * cols, B, (long long)maxc * cols, Y + m0 * maxc * rows, (int)rows,
                  (long long)maxc * rows, (int)nm))
            return true;
    }
    mr_cu_launch(c, k_scatter_rows, (unsigned)R, 256, 0, Y, rows, d_map + R, scale, y);
    MR_CU_LAUNCHED(c, "expert scatter");
    return true;
}

/* Decode matvec with 22-bit integer activations (Q4_K, Q6_K, IQ4_XS and
 * Q8_0 plain products of 1-8 tokens; on by default for the large ones, see
 * x24_one).
 * A token's sums do not depend on how many tokens share the launch, so a
 * request's tokens do not depend on its batchmates (DESIGN.md, numerics
 * rules; kernel-check batch-inv-x24).  Expert products go through the same
 * units in cu_moex24.cu; the shared device parts are in cu_x24.cuh.
 *
 * Why another kernel: the float32 kernels (cu_fast.cu) give each block a
 * few rows and one or two loads a lane, so a product of a 4096-wide matrix
 * is a few waves of short blocks, each waiting a full memory round trip and
 * then reducing; an ncu profile on the H200 (docs/GPU-NOTES.md 29) has the
 * Q4_K 12288x4096 product issue-bound (0.72 instructions a cycle per
 * scheduler, 64 registers, DRAM at 25%) and the Q6_K output matrix at 31%
 * occupancy.  Here
 *   - the grid is sized to the SMs (as many blocks as fit), not to the
 *     rows: every warp walks its rows R at a time (R = 4 for one token,
 *     sharing each activation load; fewer for more tokens (xs_launch_nt); two
 *     rows for one token was slower, docs/PERFORMANCE.md), so a
 *     block pays its start once and its warps drift apart, some loading
 *     while others compute;
 *   - Q4_K is read from the GGUF blocks (144 bytes: 16-byte aligned, so a
 *     lane's 32 weights and its block's header are two 16-byte loads; the
 *     kernel layout's 148-byte blocks allow only 4-byte loads, which cost
 *     four times the L1 wavefronts); Q6_K from the padded layout (212
 *     bytes) with 4-byte loads; IQ4_XS from the GGUF blocks (136 bytes,
 *     8-byte loads), Q8_0 from the padded layout (36 bytes, 8-byte loads
 *     from the 8-byte boundary at or before the block);
 *   - the activation rows are quantized once per block into shared memory as
 *     integers of 22 bits (d = absmax / (2^21 - 1) per 32 columns, q =
 *     rint(x / d)) in three byte planes (signed high, unsigned middle and
 *     low), so four 4- or 6-bit quants meet four activations in one dp4a
 *     per plane and every 8- to 16-element sum is exact in int32 (at most
 *     63 * 2^21 * 8 < 2^31; IQ4_XS's code book values and Q8_0's quants
 *     against 32 columns need int64 for the join of the planes, see
 *     cu_x24.cuh); only its scaling is float.  ~1.9 instructions a Q4_K
 *     weight against ~3.4 for float32 math.  Rounding x to 22 bits moves
 *     a product by ~5e-7 of its size, below what the float kernels' own
 *     order of summation changes (16 bits, tried first, moved it by 2e-5,
 *     as much as the bound the float kernels are held to).
 * Each row is summed by one warp in a fixed order (a lane's units in order,
 * then a warp sum), so a row's result does not depend on the grid, on the
 * row computed beside it, or on the other matrices of the launch.
 *
 * Rows of a launch: the rows of all sub-matrices (q/k/v or gate/up in one
 * launch, mr_cu_mvjob.n_sub) in order; warp g of the grid takes rows
 * Rg .. Rg + R - 1, then R(g + G) .. (G warps in all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_x24.cuh"


/* NT tokens (rows of a.x, a.cols apart) against R rows at a time: a
 * token's sums are formed exactly as with NT = 1 and any R (its own
 * accumulators, a lane's units in order, then a warp sum), so a row's
 * result does not depend on how many tokens or rows share the launch.
 * xg: NULL, each block quantizes the inputs into shared memory first; with
 * MEMRA_CUDA_X24_PRE=1 the planes k_x24_quant wrote once for the product
 * (same values, so the same sums; slower on the whole, docs/GPU-NOTES.md
 * 32). */
/* CONV (one token, mr_cu_x24_matvec_conv): lane i of a warp's pass also
 * runs the convolution of row i where it is one of the first conv_ch
 * (mr_conv1_fetch, mr_conv1_token). */
template <int T, int R, int NT, bool GLU = false, bool CONV = false>
__global__ void __launch_bounds__(XS_WARPS * 32, 2) k_mvx24(mr_cu_mvjob a, int64_t total_rows, const uint8_t *xg)
{
    static_assert(!CONV || (NT == 1 && !GLU && R <= 32), "the convolution follows one token's plain product");
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    constexpr int S = xs_type<T>::STRIDE;
    extern __shared__ __align__(16) uint8_t xs_sh[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int cols = (int)a.cols, units = cols / 32; /* 8 units a block */
    const int xstride = (int)xs_xbytes(cols);
    const uint8_t *xs = xg;
    if (!xg) { /* the same for the whole block */
        for (int t = 0; t < NT; t++)
            xs_quantize(a.x + (int64_t)t * cols, cols, xs_sh + t * xstride, threadIdx.x, blockDim.x);
        __syncthreads();
        xs = xs_sh;
    }
    const int64_t G = (int64_t)gridDim.x * nw;
    /* GLU (a gate/up pair, total_rows the gate's): a pass takes RO rows of
     * each matrix at the same indices */
    constexpr int RO = GLU ? R / 2 : R;
    for (int64_t r0 = ((int64_t)blockIdx.x * nw + warp) * RO; r0 < total_rows; r0 += G * RO) {
        const uint8_t *W[R];
        float *y[R];
        int64_t ys[R];
#pragma unroll
        for (int i = 0; i < R; i++) { /* past the end: row r0 again (computed, not stored) */
            if constexpr (GLU) {
                const int64_t r = r0 + i % RO < total_rows ? r0 + i % RO : r0;
                W[i] = (i < RO ? a.sub_W[0] : a.sub_W[1]) + (size_t)r * a.row_bytes;
                y[i] = NULL;
                ys[i] = 0;
            } else {
                xs_row(a, r0 + i < total_rows ? r0 + i : r0, &W[i], &y[i], &ys[i]);
            }
        }
        /* the convolution's taps and old state of lane i's row, in flight
         * with the weights (the state: written by an earlier step's launch) */
        float cw[MR_CU_CONV_TAPS], cs[MR_CU_CONV_TAPS - 1];
        if constexpr (CONV)
            if (lane < R && r0 + lane < a.conv_ch)
                mr_conv1_fetch(a.conv_w, a.conv_state, a.conv_ch, r0 + lane, a.conv_k, cw, cs);
        float acc[NT * R];
#pragma unroll
        for (int i = 0; i < NT * R; i++) acc[i] = 0.0f;
        const uint8_t *xt[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) xt[t] = xs + t * xstride;
#pragma unroll(8 / (R * NT) > 0 ? 8 / (R * NT) : 1)
        for (int un = lane; un < units; un += 32) {
            const int b = un >> 3;
            const uint8_t *p[R];
#pragma unroll
            for (int i = 0; i < R; i++) p[i] = W[i] + (size_t)b * S;
            xs_unit<T, R, NT>::run(p, un & 7, xt, cols, 256 * b, acc);
        }
        if constexpr (GLU) {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < RO; i++) {
                    const float g = mr_warp_sum(acc[t * R + i]), u = mr_warp_sum(acc[t * R + RO + i]);
                    if (lane == 0 && r0 + i < total_rows) {
                        const int64_t o = (int64_t)t * total_rows + r0 + i;
                        a.sub_y[1][o] = u;
                        if (a.glu_out != a.sub_y[0]) a.sub_y[0][o] = g;
                        a.glu_out[o] = mr_silu_mul(g, u);
                    }
                }
        } else {
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const float v = mr_warp_sum(acc[t * R + i]);
                    if (lane == 0 && r0 + i < total_rows) y[i][t * ys[i]] = v;
                    if constexpr (CONV)
                        if (lane == i && r0 + i < a.conv_ch)
                            mr_conv1_token(v, cw, cs, a.conv_k, a.conv_ch, r0 + i, a.conv_state, a.conv_y);
                }
        }
    }
}

/* Rows x quantized into planes at out, xs_xbytes(cols) apart: grid.y a row. */
__global__ void __launch_bounds__(256) k_x24_quant(const float *__restrict__ x, int cols, uint8_t *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int64_t t = blockIdx.y;
    xs_quantize(x + t * cols, cols, out + (size_t)t * xs_xbytes(cols), blockIdx.x * blockDim.x + threadIdx.x,
                gridDim.x * blockDim.x);
}

const uint8_t *mr_cu_x24_planes(mr_cu_ctx *c, const float *x, int rows, int64_t cols, int max_rows)
{
    if (!mr_cu_reserve(c, &c->scratch_x24, (size_t)(max_rows > rows ? max_rows : rows) * xs_xbytes(cols),
                       "x24 input planes"))
        return NULL;
    uint8_t *out = (uint8_t *)c->scratch_x24.p;
    mr_cu_launch(c, k_x24_quant, dim3((unsigned)((cols / 8 + 255) / 256), (unsigned)rows), 256, 0, x, (int)cols,
                 out);
    MR_CU_LAUNCHED(c, "x24 input quantization");
    return out;
}

/* ---- dispatch ---- */

/* Blocks of `warps` warps an SM holds for kernel T with NT tokens and smem
 * bytes of shared memory a block (mr_cu_fit: asked once, kept in the
 * context; a launch would otherwise query it up to three times); at least 1. */
template <int T, int R, int NT, bool GLU = false, bool CONV = false>
static int xs_fit(mr_cu_ctx *c, int warps, size_t smem)
{
    const int nb = mr_cu_fit(c, (const void *)k_mvx24<T, R, NT, GLU, CONV>, warps * 32, smem);
    return nb > 0 ? nb : 1;
}

/* Grid: as many blocks as the SMs hold, fewer when the rows run out;
 * blocks of 8 warps, halved (down to 2) while that leaves SMs without a
 * block. */
template <int T, int R, int NT, bool GLU = false, bool CONV = false>
static void xs_launch(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg)
{
    constexpr int RO = GLU ? R / 2 : R; /* rows of output a warp's pass */
    const size_t smem = xg ? 0 : NT * xs_xbytes(a.cols);
    int warps = XS_WARPS, bps = xs_fit<T, R, NT, GLU, CONV>(c, warps, smem);
    for (;;) {
        const int64_t blocks = (total_rows + warps * RO - 1) / (warps * RO);
        if (warps <= 2 || blocks >= c->n_sm * (int64_t)bps)
            break;
        warps /= 2;
        bps = xs_fit<T, R, NT, GLU, CONV>(c, warps, smem);
    }
    int64_t gx = (int64_t)c->n_sm * bps;
    const int64_t need = (total_rows + warps * RO - 1) / (warps * RO);
    if (gx > need) gx = need;
    if (gx < 1) gx = 1;
    mr_cu_launch(c, k_mvx24<T, R, NT, GLU, CONV>, dim3((unsigned)gx), warps * 32, smem, a, total_rows, xg);
    MR_CU_LAUNCHED(c, GLU ? "x24 matvec + swiglu" : CONV ? "x24 matvec + conv1d_silu" : "x24 matvec");
}

/* R rows a warp: 4 for one token; with more tokens as many as the
 * registers allow, per type (cu_x24.cuh, xs_type: Q4_K 4 rows for two
 * tokens and 2 for four or eight, Q6_K 2 and 1). */
template <int T>
static void xs_launch_nt(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, int nt, const uint8_t *xg)
{
    using X = xs_type<T>;
    if (nt == 8) xs_launch<T, X::R8, 8>(c, a, total_rows, xg);
    else if (nt == 4) xs_launch<T, X::R4, 4>(c, a, total_rows, xg);
    else if (nt == 2) xs_launch<T, X::R2, 2>(c, a, total_rows, xg);
    else xs_launch<T, X::R1, 1>(c, a, total_rows, xg);
}

/* Whether matrix w goes to this kernel.  Measured on the H200
 * (docs/GPU-NOTES.md 29): with 4096 columns it wins from about 12,288 rows
 * a launch (the gate/up pair and the output matrix of the 8B shape: 24576 x
 * 4096 20.5 against 32.0 us, 151936 x 4096 Q6_K 146 against 324 us) and
 * loses below (4096 x 4096 9.3 against 7.4 us: every block first quantizes
 * the whole input, a latency the float kernels do not pay), and with
 * 12,288 columns it loses (4096 x 12288 24.6 against 15.3 us).
 * MEMRA_CUDA_MATVEC=x24 takes those shapes, =x24all every shape it can.
 * Q8_0 follows the same rule, not yet timed per shape (docs/GPU-NOTES.md
 * 38).  IQ4_XS, whose float kernel pays a code book lookup a weight, wins
 * earlier: run 121 (H200, us a call, float / this kernel) 8192 x 2048 11.0
 * / 8.4, 4096 x 2048 6.7 / 6.0, but 1024 x 2048 3.6 / 5.0 and 2048 x 4096
 * 6.6 / 8.4; so rows from 4,096 at up to 2,048 columns (the 35B-A3B's gated
 * delta net in-projection and full-attention q).  Matrices of fewer than
 * 128 rows (that layer's alpha and beta) go with them: they add little to
 * a launch and share the in-projection's.  Run 122: 35B-A3B tg128 +5.3 /
 * +5.6% against the Q4_K rule (MEMRA_CUDA_X24_IQ4XS=0); its decode batches
 * of 16 streams -3% (the kernel at 4+ tokens a launch, GPU-NOTES 33).
 * The choice never depends on the token count or on what shares a launch:
 * a row gets the same kernel alone and in a decode batch. */
static bool x24_one(const mr_cu_ctx *c, const mr_weight *w, int T)
{
    if (w->type != T || (xs_padded(T) && !w->priv) || !w->data)
        return false;
    if (c->matvec_x24 == 2)
        return true;
    if (T == MR_TYPE_IQ4_XS && c->x24_iq4xs && w->cols <= 2048 && (w->rows >= 4096 || w->rows < 128))
        return true;
    return w->cols <= 4096 && w->rows >= 12288;
}

const void *mr_cu_x24_source(const mr_weight *w, size_t *row_bytes)
{
    const bool pad = xs_padded(w->type);
    *row_bytes = pad ? mr_cu_fast_row_bytes(w) : w->row_bytes;
    return pad ? w->priv : w->data;
}

int mr_cu_x24_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    const int T = w[0]->type;
    if (!c->matvec_x24 || c->no_fast || !xs_has(T) || w[0]->cols % 256 ||
        w[0]->cols > XS_COLS_MAX || ((uintptr_t)x & 15) || m < 1 || m > MR_CU_MV_SUBS)
        return 0;
    int yes = 0;
    for (int s = 0; s < m; s++) {
        if (w[s]->cols != w[0]->cols || w[s]->n_mats != 1)
            return 0;
        yes += x24_one(c, w[s], T);
    }
    return yes == m ? 1 : yes ? -1 : 0;
}

bool mr_cu_x24_matvec(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x, int n)
{
    if (n < 1 || n >= MR_CU_GEMM_MIN_TOKENS || mr_cu_x24_takes(c, w, m, x) != 1)
        return false;
    const int T = w[0]->type;
    int64_t total, rows_max;
    mr_cu_mvjob a = xs_job(w, y, m, x, &total, &rows_max);
    const size_t xb = xs_xbytes(a.cols);
    /* decode batches from x24_mma_min tokens: the tensor cores, all tokens
     * in one launch (inputs whose sums fit the tile kernel's shared
     * memory; the choice depends on the shape, and both kernels give the
     * same bits) */
    const bool mma = c->x24_mma_min > 0 && n >= c->x24_mma_min && mr_cu_x24_mma_ok(c, T, a.cols);
    const uint8_t *xg = NULL;
    if (mma || c->x24_pre) {
        xg = mr_cu_x24_planes(c, x, n, a.cols, MR_CU_GEMM_MIN_TOKENS - 1);
        if (!xg)
            return true; /* the sticky error */
    }
    if (mma) {
        if (T == MR_TYPE_Q4_K) mr_cu_x24_mma(c, a, total, xg, n);
        else mr_cu_x24_mma_q6k(c, a, total, xg, n);
        return true;
    }
    /* tokens in chunks of 8, 4, 2, 1 (at most x24_nt_max), as many as fit
     * in shared memory: each chunk reads the matrix once */
    while (n > 0) {
        int nt = n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1;
        while (nt > c->x24_nt_max) nt /= 2;
        while (!xg && nt > 1 && nt * xb > c->x24_smem) nt /= 2;
        switch (T) {
        case MR_TYPE_Q4_K: xs_launch_nt<MR_TYPE_Q4_K>(c, a, total, nt, xg); break;
        case MR_TYPE_Q6_K: xs_launch_nt<MR_TYPE_Q6_K>(c, a, total, nt, xg); break;
        case MR_TYPE_IQ4_XS: xs_launch_nt<MR_TYPE_IQ4_XS>(c, a, total, nt, xg); break;
        default: xs_launch_nt<MR_TYPE_Q8_0>(c, a, total, nt, xg); break; /* xs_has */
        }
        if (xg) xg += (size_t)nt * xb;
        a.x += (int64_t)nt * a.cols;
        a.y += (int64_t)nt * a.rows;
        for (int s = 0; s < a.n_sub; s++) a.sub_y[s] += (int64_t)nt * a.sub_rows[s];
        n -= nt;
    }
    return true;
}

/* A gate/up pair of one token and the swiglu after them in one launch
 * (mr_cu_fast_glu's contract, on this kernel's sums): where
 * mr_cu_x24_matvec would take the pair for one token; false, nothing
 * launched, otherwise.  4 rows a pass (2 of each), as R1 = 4 of every type. */
bool mr_cu_x24_glu(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, const float *x, int n)
{
    if (n != 1 || mr_cu_x24_takes(c, w, 2, x) != 1 || w[0]->rows != w[1]->rows)
        return false;
    const int T = w[0]->type;
    int64_t total, rows_max;
    mr_cu_mvjob a = xs_job(w, y, 2, x, &total, &rows_max);
    a.glu_out = o;
    const uint8_t *xg = NULL;
    if (c->x24_pre) {
        xg = mr_cu_x24_planes(c, x, 1, a.cols, MR_CU_GEMM_MIN_TOKENS - 1);
        if (!xg)
            return true; /* the sticky error */
    }
    switch (T) {
    case MR_TYPE_Q4_K: xs_launch<MR_TYPE_Q4_K, 4, 1, true>(c, a, rows_max, xg); break;
    case MR_TYPE_Q6_K: xs_launch<MR_TYPE_Q6_K, 4, 1, true>(c, a, rows_max, xg); break;
    case MR_TYPE_IQ4_XS: xs_launch<MR_TYPE_IQ4_XS, 4, 1, true>(c, a, rows_max, xg); break;
    default: xs_launch<MR_TYPE_Q8_0, 4, 1, true>(c, a, rows_max, xg); break; /* xs_has */
    }
    return true;
}

bool mr_cu_x24_matvec_conv(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                           const float *conv, float *state, int k, float *out)
{
    if (c->x24_pre || k < 1 || k > MR_CU_CONV_TAPS || !conv || !state || !out ||
        mr_cu_x24_takes(c, w, m, x) != 1)
        return false;
    const int T = w[0]->type;
    if (c->x24_mma_min == 1 && mr_cu_x24_mma_ok(c, T, w[0]->cols))
        return false; /* the product alone would run on the tensor cores */
    int64_t total, rows_max;
    mr_cu_mvjob a = xs_job(w, y, m, x, &total, &rows_max);
    a.conv_w = conv;
    a.conv_state = state;
    a.conv_y = out;
    a.conv_ch = w[0]->rows;
    a.conv_k = k;
    switch (T) {
    case MR_TYPE_Q4_K: xs_launch<MR_TYPE_Q4_K, xs_type<MR_TYPE_Q4_K>::R1, 1, false, true>(c, a, total, NULL); break;
    case MR_TYPE_Q6_K: xs_launch<MR_TYPE_Q6_K, xs_type<MR_TYPE_Q6_K>::R1, 1, false, true>(c, a, total, NULL); break;
    case MR_TYPE_IQ4_XS:
        xs_launch<MR_TYPE_IQ4_XS, xs_type<MR_TYPE_IQ4_XS>::R1, 1, false, true>(c, a, total, NULL);
        break;
    default: xs_launch<MR_TYPE_Q8_0, xs_type<MR_TYPE_Q8_0>::R1, 1, false, true>(c, a, total, NULL); break; /* xs_has */
    }
    return true;
}

/* Lets every instance of type T ask for optin bytes of shared memory. */
template <int T>
static bool xs_optin(int optin)
{
    using X = xs_type<T>;
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    return cudaFuncSetAttribute(k_mvx24<T, X::R1, 1>, at, optin) == cudaSuccess &&
           cudaFuncSetAttribute(k_mvx24<T, X::R2, 2>, at, optin) == cudaSuccess &&
           cudaFuncSetAttribute(k_mvx24<T, X::R4, 4>, at, optin) == cudaSuccess &&
           cudaFuncSetAttribute(k_mvx24<T, X::R8, 8>, at, optin) == cudaSuccess &&
           cudaFuncSetAttribute(k_mvx24<T, 4, 1, true>, at, optin) == cudaSuccess &&
           cudaFuncSetAttribute(k_mvx24<T, X::R1, 1, false, true>, at, optin) == cudaSuccess;
}

/* At backend creation: the shared memory a launch may ask for (several
 * tokens' input planes need more than the default 48 KB). */
void mr_cu_x24_init(mr_cu_ctx *c)
{
    const char *pre = getenv("MEMRA_CUDA_X24_PRE"); /* 1: inputs quantized by their own kernel */
    c->x24_pre = pre && atoi(pre) == 1;
    /* tokens a launch at most: 2 (docs/PERFORMANCE.md, run 42: with more,
     * the loads of every token's input planes bound the kernel, and fewer
     * rows a warp share them); MEMRA_CUDA_X24_NT=1, 4 or 8 for timing (a
     * token's sums are the same at any count) */
    const char *nt = getenv("MEMRA_CUDA_X24_NT");
    const int ntv = nt ? atoi(nt) : 0;
    c->x24_nt_max = ntv == 1 || ntv == 4 || ntv == 8 ? ntv : 2;
    /* expert products (cu_moex24.cu): rows a block from 64 blocks an SM,
     * were every slot used (at least 16 rows).  Runs 69-71 (H200, 30B-A3B,
     * 16-token decode steps, sched-bench -c 16 -p 16): 8 blocks 765 output
     * tok/s, 12 823, 16 854, 24 876, 32 887-894, 48 906, 64 901-908: more,
     * shorter blocks spread the used experts' rows over every SM (the
     * grid's slots are sized for all pairs, ~60% are used).  One token's
     * grids are the same from 8 up (the 16-row floor).  MEMRA_CUDA_XM_BPS
     * (1..256) for timing: a row's sums do not depend on it. */
    const char *bps = getenv("MEMRA_CUDA_XM_BPS");
    const int bpsv = bps ? atoi(bps) : 0;
    c->xm_bps = bpsv >= 1 && bpsv <= 256 ? bpsv : 64;
    /* One token's: as many blocks as the card holds at once (4 an SM at
     * k_moex24's 128 registers), each warp making more passes.  Runs
     * 127-128 (H200, tg128): the 30B-A3B's gate/up took 768 blocks and its
     * down 1,024 in 1.5 and 2 waves of 528; at 4 an SM (384 and 512) tg128
     * went 313 -> 324 tok/s; 3: 316, 2: 310.  MEMRA_CUDA_XM_BPS1 (1..256)
     * for timing: a row's sums do not depend on it. */
    const char *bps1 = getenv("MEMRA_CUDA_XM_BPS1");
    const int bps1v = bps1 ? atoi(bps1) : 0;
    c->xm_bps1 = bps1v >= 1 && bps1v <= 256 ? bps1v : XM_MIN_BLOCKS;
    const char *moe = getenv("MEMRA_CUDA_X24_MOE"); /* 0: expert products stay on the float kernels */
    c->x24_moe = !(moe && !strcmp(moe, "0"));
    const char *iq = getenv("MEMRA_CUDA_X24_IQ4XS");
    c->x24_iq4xs = !(iq && !strcmp(iq, "0"));
    /* Q4_K and Q6_K decode batches on the tensor cores (cu_mvx24mma.cu; same
     * bits) from 4 tokens (smaller products win from 2, but the default
     * shape rule, x24_one, gives the 22-bit kernels only Q4_K and Q6_K
     * products of 12288+ rows).
     * Run 51 (H200, us, two-token matvec / tensor cores): Q4_K 24576x4096
     * n = 2 31.7 / 47.8, 4 63.2 / 63.8, 8 126.3 / 88.4, 16 252.6 / 170.5;
     * 4096x4096 n = 2 18.2 / 12.3, 4 35.6 / 16.7, 8 70.2 / 21.4, 16 138.9 /
     * 33.1; Q6_K 151936x4096 n = 2 338 / 467, 4 676 / 518, 8 1354 / 699.
     * MEMRA_CUDA_X24_MMA=N: from N tokens; 0: never */
    const char *mm = getenv("MEMRA_CUDA_X24_MMA");
    c->x24_mma_min = mm ? atoi(mm) : 4;
    if (c->x24_mma_min < 0) c->x24_mma_min = 0;
    int dev = 0, optin = 0;
    c->x24_smem = 48 * 1024;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    const bool ok = xs_optin<MR_TYPE_Q4_K>(optin) && xs_optin<MR_TYPE_Q6_K>(optin) &&
                    xs_optin<MR_TYPE_IQ4_XS>(optin) && xs_optin<MR_TYPE_Q8_0>(optin) && mr_cu_x24_mma_optin(optin) &&
                    mr_cu_xmm_optin(optin);
    if (ok) {
        c->x24_smem = (size_t)optin;
    } else {
        /* not an error (every product still has a kernel), but a slower
         * device: said once a backend, so that a run shows it */
        const cudaError_t e = cudaGetLastError();
        fprintf(stderr, "cuda: a kernel's shared memory opt-in to %d bytes failed (%s): the 22-bit products "
                        "of wide inputs, the tensor-core tiles and the xmm expert products are off\n", optin, cudaGetErrorString(e));
    }
}

/* Decode matvec with 22-bit integer activations (Q4_K and Q6_K plain
 * products of 1-8 tokens; on by default for the large ones, see x24_one).
 * A token's sums do not depend on how many tokens share the launch, so a
 * request's tokens do not depend on its batchmates (DESIGN.md, numerics
 * rules; kernel-check batch-inv-x24).  Expert products are not taken: their
 * decode batches go through the grouped float kernels.
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
 *     sharing each activation load; 2 for two tokens, 1 for four; two
 *     rows for one token was slower, docs/PERFORMANCE.md), so a
 *     block pays its start once and its warps drift apart, some loading
 *     while others compute;
 *   - Q4_K is read from the GGUF blocks (144 bytes: 16-byte aligned, so a
 *     lane's 32 weights and its block's header are two 16-byte loads; the
 *     kernel layout's 148-byte blocks allow only 4-byte loads, which cost
 *     four times the L1 wavefronts); Q6_K from the padded layout (212
 *     bytes) with 4-byte loads;
 *   - the activation rows are quantized once per block into shared memory as
 *     integers of 22 bits (d = absmax / (2^21 - 1) per 32 columns, q =
 *     rint(x / d)) in three byte planes (signed high, unsigned middle and
 *     low), so four 4- or 6-bit quants meet four activations in one dp4a
 *     per plane and every 8- to 16-element sum is exact in int32 (at most
 *     63 * 2^21 * 8 < 2^31); only its scaling is float.  ~1.9 instructions
 *     a weight against ~3.4 for float32 math.  Rounding x to 22 bits moves
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
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_mvq8.cuh" /* q8_dp4a_us, q8_ld32, q8_h2f */

#define XS_WARPS 8 /* warps a block at most */
#define XS_COLS_MAX 13312 /* widest input quantized into shared memory (48 KB) */
#define XS_QMAX 2097151.0f /* 2^21 - 1 */
#define XS_QU 4 /* input rounds whose loads are in flight together */

/* The activation row in shared memory: three planes of cols bytes, hi
 * (int8, q >> 16), mid (uint8, (q >> 8) & 255), lo (uint8, q & 255), so
 * q = 65536 hi + 256 mid + lo; then d[cols / 32] (float) and sq[cols / 8]
 * (int32: the sum of q over each 8 columns); x ~ d q. */
__host__ __device__ constexpr size_t xs_xbytes(int64_t cols) { return (size_t)(3 * cols + cols / 8 + cols / 2); }
__device__ __forceinline__ float *xs_d(uint8_t *xs, int cols) { return (float *)(xs + 3 * cols); }
__device__ __forceinline__ int *xs_sq(uint8_t *xs, int cols) { return (int *)(xs + 3 * cols + cols / 8); }

/* A plane word against four weight quants: the high plane is signed
 * (q8_dp4a_us), the middle and low ones unsigned. */
__device__ __forceinline__ int xs_dp_lo(uint32_t w, uint32_t x, int c)
{
    return (int)__dp4a(w, x, (unsigned)c);
}

/* Word k of a 16-byte run. */
__device__ __forceinline__ uint32_t xs_w(const uint4 &v, int k)
{
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* The sum over the three planes: 65536 hi + 256 mid + lo (exact in int32:
 * the callers' sums are below 2^31, see the top). */
__device__ __forceinline__ int xs_join(const int *p) { return p[0] * 65536 + p[1] * 256 + p[2]; }

/* Quantizes the row x (cols floats) into shared memory, all threads of the
 * block (q = rint(x * ((2^21 - 1) / absmax)), ties to even; d = absmax /
 * (2^21 - 1), both quotients IEEE); 4 consecutive threads a 32-column
 * group (cols % 256 == 0, so a warp is always whole in the loop).  A group with a NaN or an infinity
 * gets d = NaN: its products are NaN, as with float activations. */
__device__ __forceinline__ void xs_quantize(const float *__restrict__ x, int cols, uint8_t *sh, int first,
                                            int step)
{
    float *dq = xs_d(sh, cols);
    int *sq = xs_sq(sh, cols);
    const int n8 = cols / 8;
    /* the loads of XS_QU rounds first, then their work: one memory round
     * trip for up to XS_QU * 2048 columns instead of one a round */
    for (int base = first; base < n8; base += XS_QU * step) {
        float4 va[XS_QU], vb[XS_QU];
#pragma unroll
        for (int u = 0; u < XS_QU; u++) {
            const int g8 = base + u * step;
            if (g8 < n8) {
                va[u] = __ldg((const float4 *)x + 2 * g8);
                vb[u] = __ldg((const float4 *)x + 2 * g8 + 1);
            }
        }
#pragma unroll
        for (int u = 0; u < XS_QU; u++) {
            const int g8 = base + u * step;
            if (g8 >= n8) /* the same for the whole warp: n8, first - lane and step are multiples of 32 */
                break;
            const float v[8] = {va[u].x, va[u].y, va[u].z, va[u].w, vb[u].x, vb[u].y, vb[u].z, vb[u].w};
            float m = 0.0f;
            int bad = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                m = fmaxf(m, fabsf(v[i]));
                bad |= !isfinite(v[i]);
            }
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            bad |= __shfl_xor_sync(0xffffffffu, bad, 1);
            bad |= __shfl_xor_sync(0xffffffffu, bad, 2);
            const float inv = m > 0.0f ? XS_QMAX / m : 0.0f;
            uint32_t pl[3][2] = {{0, 0}, {0, 0}, {0, 0}};
            int s = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int q = bad ? 0 : __float2int_rn(v[i] * inv);
                s += q;
#pragma unroll
                for (int k = 0; k < 3; k++) pl[k][i >> 2] |= ((uint32_t)(q >> (16 - 8 * k)) & 0xffu) << (8 * (i & 3));
            }
#pragma unroll
            for (int k = 0; k < 3; k++) *(uint2 *)(sh + k * cols + 8 * g8) = make_uint2(pl[k][0], pl[k][1]);
            sq[g8] = s;
            if ((threadIdx.x & 3) == 0)
                dq[g8 / 4] = bad ? __int_as_float(0x7fc00000) : m / XS_QMAX;
        }
    }
}

/* One lane's unit (32 weights of one block) of R rows: p[i] the block in
 * row i (global memory), u the unit in the block, c0 the block's first
 * column; acc[i] += the unit's part of row i. */
template <int T, int R, int NT> struct xs_unit;

/* Q4_K (GGUF blocks: d, dmin, 12 bytes of 6-bit scales and mins, qs at
 * +16): unit u = 2j + h takes the 16 qs bytes of half h of group j: low
 * nibbles are columns 64j + 16h + 0..15 (sub-block 2j), high nibbles the
 * same 32 columns on (sub-block 2j + 1). */
template <int R, int NT> struct xs_unit<MR_TYPE_Q4_K, R, NT> {
static __device__ __forceinline__ void run(const uint8_t *const *p, int u, const uint8_t *xs0, int xstride,
                                           int cols, int c0, float *acc)
{
    const int j = u >> 1, h = u & 1;
    const int ca = c0 + 64 * j + 16 * h, cb = ca + 32;
    uint4 hd[R], qv[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        hd[i] = __ldg((const uint4 *)p[i]);
        qv[i] = __ldg((const uint4 *)(p[i] + 16 + 32 * j + 16 * h));
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint8_t *xs = xs0 + t * xstride;
        uint4 xa[3], xb[3]; /* planes hi, mid, lo of the two 16-column runs */
#pragma unroll
        for (int k = 0; k < 3; k++) {
            xa[k] = *(const uint4 *)(xs + k * cols + ca);
            xb[k] = *(const uint4 *)(xs + k * cols + cb);
        }
        const float *dq = xs_d((uint8_t *)xs, cols);
        const int *sq = xs_sq((uint8_t *)xs, cols);
        const float da = dq[ca / 32], db = dq[cb / 32];
        const float qa = (float)(sq[ca / 8] + sq[ca / 8 + 1]), qb = (float)(sq[cb / 8] + sq[cb / 8 + 1]);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint32_t q[4] = {qv[i].x, qv[i].y, qv[i].z, qv[i].w};
            int a[3] = {0, 0, 0}, bb[3] = {0, 0, 0};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t wl = q[k] & 0x0F0F0F0Fu, wh = (q[k] >> 4) & 0x0F0F0F0Fu;
                const uint32_t va[3] = {xs_w(xa[0], k), xs_w(xa[1], k), xs_w(xa[2], k)};
                const uint32_t vb[3] = {xs_w(xb[0], k), xs_w(xb[1], k), xs_w(xb[2], k)};
                a[0] = q8_dp4a_us(wl, va[0], a[0]);
                a[1] = xs_dp_lo(wl, va[1], a[1]);
                a[2] = xs_dp_lo(wl, va[2], a[2]);
                bb[0] = q8_dp4a_us(wh, vb[0], bb[0]);
                bb[1] = xs_dp_lo(wh, vb[1], bb[1]);
                bb[2] = xs_dp_lo(wh, vb[2], bb[2]);
            }
            /* scales and mins of sub-blocks 2j, 2j + 1 (upstream get_scale_min_k4,
             * four at a time): bytes 0..3 from the low 6 bits of s0 / s1, bytes
             * 4..7 from s2's nibbles and the top 2 bits of s0 / s1 */
            const uint32_t s0 = hd[i].y, s1 = hd[i].z, s2 = hd[i].w;
            const uint32_t SC = j < 2 ? (s0 & 0x3F3F3F3Fu) : ((s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u));
            const uint32_t M = j < 2 ? (s1 & 0x3F3F3F3Fu) : (((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u));
            const int sh = 16 * (j & 1);
            const float sa = (float)((SC >> sh) & 0xff), sb = (float)((SC >> (sh + 8)) & 0xff);
            const float ma = (float)((M >> sh) & 0xff), mb = (float)((M >> (sh + 8)) & 0xff);
            const float d = q8_h2f(hd[i].x), dm = q8_h2f(hd[i].x >> 16);
            const float ia = (float)xs_join(a), ib = (float)xs_join(bb);
            acc[t * R + i] += d * (sa * da * ia + sb * db * ib) - dm * (ma * da * qa + mb * db * qb);
        }
    }
}
};

/* Q6_K (padded 212-byte blocks: ql 128, qh 64, sc 16, d): unit u = 4n + k
 * takes positions l = 8k .. 8k + 7 of half n (128 columns): from
 * ql[64n + l], ql[64n + 32 + l] and qh[32n + l] the four quarters
 * 128n + 32qq + l, qq = 0..3, each with its own scale. */
template <int R, int NT> struct xs_unit<MR_TYPE_Q6_K, R, NT> {
static __device__ __forceinline__ void run(const uint8_t *const *p, int u, const uint8_t *xs0, int xstride,
                                           int cols, int c0, float *acc)
{
    const int n = u >> 2, l0 = 8 * (u & 3);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint8_t *xs = xs0 + t * xstride;
        const float *dq = xs_d((uint8_t *)xs, cols);
        const int *sq = xs_sq((uint8_t *)xs, cols);
        uint2 xv[4][3]; /* quarter, plane */
        float dx[4];
        int qs[4];
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const int c = c0 + 128 * n + 32 * qq + l0;
#pragma unroll
            for (int k = 0; k < 3; k++) xv[qq][k] = *(const uint2 *)(xs + k * cols + c);
            dx[qq] = dq[c / 32];
            qs[qq] = 32 * sq[c / 8];
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint8_t *b = p[i];
            int acc3[4][3] = {};
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const uint32_t qa = q8_ld32(b + 64 * n + l0 + 4 * k), qb = q8_ld32(b + 64 * n + 32 + l0 + 4 * k);
                const uint32_t h = q8_ld32(b + 128 + 32 * n + l0 + 4 * k);
                const uint32_t w[4] = {(qa & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u),
                                       (qb & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u),
                                       ((qa >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u),
                                       ((qb >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u)};
#pragma unroll
                for (int qq = 0; qq < 4; qq++) {
                    acc3[qq][0] = q8_dp4a_us(w[qq], k ? xv[qq][0].y : xv[qq][0].x, acc3[qq][0]);
                    acc3[qq][1] = xs_dp_lo(w[qq], k ? xv[qq][1].y : xv[qq][1].x, acc3[qq][1]);
                    acc3[qq][2] = xs_dp_lo(w[qq], k ? xv[qq][2].y : xv[qq][2].x, acc3[qq][2]);
                }
            }
            /* the scales of this lane's positions: sc[8n + l0/16 + 2qq] */
            const uint32_t s01 = q8_ld32(b + 192 + 8 * n), s23 = q8_ld32(b + 196 + 8 * n);
            const int is = 8 * (l0 >> 4);
            const float d = q8_h2f(q8_ld32(b + 208));
            float r = 0.0f;
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const uint32_t sw = qq < 2 ? s01 : s23;
                const float sc = (float)(int8_t)((sw >> (is + 16 * (qq & 1))) & 0xff);
                /* sum (w - 32) q = sum w q - 32 sum q, exact */
                r += sc * dx[qq] * (float)(xs_join(acc3[qq]) - qs[qq]);
            }
            acc[t * R + i] += d * r;
        }
    }
}
};

/* Bytes a block of each layout the kernel reads. */
template <int T> struct xs_type;
template <> struct xs_type<MR_TYPE_Q4_K> { static constexpr int STRIDE = 144; };
template <> struct xs_type<MR_TYPE_Q6_K> { static constexpr int STRIDE = 212; };

/* Row r (of all the launch's rows): its bytes, its output for the first
 * token and the distance between two tokens' outputs. */
__device__ __forceinline__ void xs_row(const mr_cu_mvjob &a, int64_t r, const uint8_t **W, float **y, int64_t *ys)
{
    int s = 0;
    if (a.n_sub > 1 && r >= a.sub_rows[0]) {
        r -= a.sub_rows[0];
        s = 1;
        if (a.n_sub > 2 && r >= a.sub_rows[1]) {
            r -= a.sub_rows[1];
            s = 2;
        }
    }
    const mr_cu_mvjob j = a.n_sub > 1 ? mr_cu_mv_subjob(a, s) : a;
    *W = j.W + (size_t)r * a.row_bytes;
    *y = j.y + r;
    *ys = j.rows;
}

/* NT tokens (rows of a.x, a.cols apart) against R rows at a time: a
 * token's sums are formed exactly as with NT = 1 and any R (its own
 * accumulators, a lane's units in order, then a warp sum), so a row's
 * result does not depend on how many tokens or rows share the launch. */
/* MEMRA_CUDA_X24_PRE=1: the input rows quantized once per product by
 * their own small kernel into device memory (xg), which every block then
 * reads, instead of every block quantizing them into shared memory first
 * (a round trip and a barrier before its first weight load).  Same values,
 * so the same products. */
__global__ void __launch_bounds__(256) k_x24_quant(const float *x, int n, int cols, uint8_t *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int xb = (int)xs_xbytes(cols);
    for (int t = 0; t < n; t++)
        xs_quantize(x + (int64_t)t * cols, cols, out + (size_t)t * xb, blockIdx.x * blockDim.x + threadIdx.x,
                    gridDim.x * blockDim.x);
}

template <int T, int R, int NT>
__global__ void __launch_bounds__(XS_WARPS * 32, 2) k_mvx24(mr_cu_mvjob a, int64_t total_rows, const uint8_t *xg)
{
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
    for (int64_t r0 = ((int64_t)blockIdx.x * nw + warp) * R; r0 < total_rows; r0 += G * R) {
        const uint8_t *W[R];
        float *y[R];
        int64_t ys[R];
#pragma unroll
        for (int i = 0; i < R; i++) /* past the end: row r0 again (computed, not stored) */
            xs_row(a, r0 + i < total_rows ? r0 + i : r0, &W[i], &y[i], &ys[i]);
        float acc[NT * R];
#pragma unroll
        for (int i = 0; i < NT * R; i++) acc[i] = 0.0f;
#pragma unroll(8 / (R * NT) > 0 ? 8 / (R * NT) : 1)
        for (int un = lane; un < units; un += 32) {
            const int b = un >> 3;
            const uint8_t *p[R];
#pragma unroll
            for (int i = 0; i < R; i++) p[i] = W[i] + (size_t)b * S;
            xs_unit<T, R, NT>::run(p, un & 7, xs, xstride, cols, 256 * b, acc);
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < R; i++) {
                const float v = mr_warp_sum(acc[t * R + i]);
                if (lane == 0 && r0 + i < total_rows) y[i][t * ys[i]] = v;
            }
    }
}

/* ---- dispatch ---- */

/* Blocks of `warps` warps an SM holds for kernel T with NT tokens and smem
 * bytes of shared memory a block, asked of the runtime once per
 * shape and kept in the context: a launch would otherwise query it up to
 * three times. */
template <int T, int R, int NT>
static int xs_fit(mr_cu_ctx *c, int warps, size_t smem)
{
    for (int i = 0; i < c->x24_nfit; i++) {
        const mr_cu_x24_fit &f = c->x24_fit[i];
        if (f.type == T && f.nt == NT && f.warps == warps && f.smem == smem)
            return f.blocks;
    }
    int nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_mvx24<T, R, NT>, warps * 32, smem) != cudaSuccess) {
        (void)cudaGetLastError();
        nb = 1;
    }
    nb = nb > 0 ? nb : 1;
    mr_cu_x24_fit &f = c->x24_fit[c->x24_nfit < MR_CU_X24_FITS ? c->x24_nfit++ : (int)(smem % MR_CU_X24_FITS)];
    f = {T, NT, warps, smem, nb};
    return nb;
}

/* Grid: as many blocks as the SMs hold, fewer when the rows run out;
 * blocks of 8 warps, halved (down to 2) while that leaves SMs without a
 * block. */
template <int T, int R, int NT>
static void xs_launch(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg)
{
    const size_t smem = xg ? 0 : NT * xs_xbytes(a.cols);
    int warps = XS_WARPS, bps = xs_fit<T, R, NT>(c, warps, smem);
    for (;;) {
        const int64_t blocks = (total_rows + warps * R - 1) / (warps * R);
        if (warps <= 2 || blocks >= c->n_sm * (int64_t)bps)
            break;
        warps /= 2;
        bps = xs_fit<T, R, NT>(c, warps, smem);
    }
    int64_t gx = (int64_t)c->n_sm * bps;
    const int64_t need = (total_rows + warps * R - 1) / (warps * R);
    if (gx > need) gx = need;
    if (gx < 1) gx = 1;
    mr_cu_launch(c, k_mvx24<T, R, NT>, dim3((unsigned)gx), warps * 32, smem, a, total_rows, xg);
    MR_CU_LAUNCHED(c, "x24 matvec");
}

/* R rows a warp: 4 for one token, fewer with more tokens (registers). */
template <int T>
static void xs_launch_nt(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, int nt, const uint8_t *xg)
{
    if (nt == 4) xs_launch<T, 1, 4>(c, a, total_rows, xg);
    else if (nt == 2) xs_launch<T, 2, 2>(c, a, total_rows, xg);
    else xs_launch<T, 4, 1>(c, a, total_rows, xg);
}

/* Whether matrix w goes to this kernel.  Measured on the H200
 * (docs/GPU-NOTES.md 29): with 4096 columns it wins from about 12,288 rows
 * a launch (the gate/up pair and the output matrix of the 8B shape: 24576 x
 * 4096 20.5 against 32.0 us, 151936 x 4096 Q6_K 146 against 324 us) and
 * loses below (4096 x 4096 9.3 against 7.4 us: every block first quantizes
 * the whole input, a latency the float kernels do not pay), and with
 * 12,288 columns it loses (4096 x 12288 24.6 against 15.3 us).
 * MEMRA_CUDA_MATVEC=x24 takes those shapes, =x24all every shape it can.
 * The choice never depends on the token count: a row gets the same kernel
 * alone and in a decode batch. */
static bool x24_one(const mr_cu_ctx *c, const mr_weight *w, int T)
{
    if (w->type != T || (T == MR_TYPE_Q6_K && !w->priv) || !w->data)
        return false;
    return c->matvec_x24 == 2 || (w->cols <= 4096 && w->rows >= 12288);
}

int mr_cu_x24_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    const int T = w[0]->type;
    if (!c->matvec_x24 || c->no_fast || (T != MR_TYPE_Q4_K && T != MR_TYPE_Q6_K) || w[0]->cols % 256 ||
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
    if (n < 1 || n > MR_CU_MATVEC_MAX || mr_cu_x24_takes(c, w, m, x) != 1)
        return false;
    const int T = w[0]->type;
    /* Q4_K: the GGUF blocks; Q6_K: the padded copy */
    const size_t rb = T == MR_TYPE_Q4_K ? w[0]->row_bytes : mr_cu_fast_row_bytes(w[0]);
    auto base = [&](int s) { return (const uint8_t *)(T == MR_TYPE_Q4_K ? w[s]->data : w[s]->priv); };
    mr_cu_mvjob a = mr_cu_mvjob_plain(base(0), rb, w[0], x, y[0]);
    int64_t total = w[0]->rows;
    if (m > 1) {
        a.n_sub = m;
        total = 0;
        for (int s = 0; s < m; s++) {
            a.sub_W[s] = base(s);
            a.sub_y[s] = y[s];
            a.sub_rows[s] = w[s]->rows;
            total += w[s]->rows;
        }
    }
    /* tokens in chunks of 4, 2, 1, as many as fit in shared memory */
    const size_t xb = xs_xbytes(a.cols);
    const uint8_t *xg = NULL;
    if (c->x24_pre) {
        if (!mr_cu_reserve(c, &c->scratch_x24, (size_t)n * xb, "x24 matvec inputs"))
            return true; /* the sticky error */
        const int blocks = (int)((a.cols / 8 + 255) / 256);
        mr_cu_launch(c, k_x24_quant, dim3((unsigned)blocks), 256, 0, a.x, n, (int)a.cols,
                     (uint8_t *)c->scratch_x24.p);
        MR_CU_LAUNCHED(c, "x24 input quantization");
        xg = (const uint8_t *)c->scratch_x24.p;
    }
    while (n > 0) {
        int nt = n >= 4 ? 4 : n >= 2 ? 2 : 1;
        while (!xg && nt > 1 && nt * xb > c->x24_smem) nt /= 2;
        if (T == MR_TYPE_Q4_K) xs_launch_nt<MR_TYPE_Q4_K>(c, a, total, nt, xg);
        else xs_launch_nt<MR_TYPE_Q6_K>(c, a, total, nt, xg);
        if (xg) xg += (size_t)nt * xb;
        a.x += (int64_t)nt * a.cols;
        a.y += (int64_t)nt * a.rows;
        for (int s = 0; s < a.n_sub; s++) a.sub_y[s] += (int64_t)nt * a.sub_rows[s];
        n -= nt;
    }
    return true;
}

/* At backend creation: the shared memory a launch may ask for (several
 * tokens' input planes need more than the default 48 KB). */
void mr_cu_x24_init(mr_cu_ctx *c)
{
    const char *pre = getenv("MEMRA_CUDA_X24_PRE"); /* 1: inputs quantized by their own kernel */
    c->x24_pre = pre && atoi(pre) == 1;
    int dev = 0, optin = 0;
    c->x24_smem = 48 * 1024;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
#define XS_OPTIN(T, R, NT) (cudaFuncSetAttribute(k_mvx24<T, R, NT>, at, optin) == cudaSuccess)
    const bool ok = XS_OPTIN(MR_TYPE_Q4_K, 4, 1) && XS_OPTIN(MR_TYPE_Q4_K, 2, 2) && XS_OPTIN(MR_TYPE_Q4_K, 1, 4) &&
                    XS_OPTIN(MR_TYPE_Q6_K, 4, 1) && XS_OPTIN(MR_TYPE_Q6_K, 2, 2) && XS_OPTIN(MR_TYPE_Q6_K, 1, 4);
#undef XS_OPTIN
    if (ok)
        c->x24_smem = (size_t)optin;
    else
        (void)cudaGetLastError();
}

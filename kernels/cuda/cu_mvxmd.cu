/* Decode batches of dense Q4_K products on the int8 tensor cores, with the
 * same bits at every token count (the default for matrices of at most
 * XMD_MAX_ROWS rows; MEMRA_CUDA_XMD=0: the float kernels of cu_fast.cu),
 * and of IQ4_XS matrices of the 22-bit kernel's shapes (xmd_type_ok: the
 * 35B-A3B's delta-net in-projection and full-attention q; the A fragments
 * from the code book, cu_xmp.cuh, on signed MMAs; per block f + dx (d
 * join(M)), no mins: xmd_iq4_acc).
 *
 * Why: a decode batch of 16 tokens costs the float kernels about sixteen
 * one-token launches (docs/GPU-NOTES.md 63: the 30B-A3B's q/k/v 5,120 x
 * 2,048 at 16 tokens ~33 us, o 2,048 x 4,096 ~30 us, against ~1.5 us to
 * read either once): each weight is decoded once but meets every token in
 * float FMAs, and every token's input is loaded again for each row group.
 * One m16n8k32 MMA takes 16 rows by a 32-column sub-block of Q4_K quants
 * against 8 tokens of one input plane, so 16 tokens are 6 MMAs a
 * sub-block and the lookups and scales of a weight serve all of them.
 *
 * The input: every token's row quantized once a call into 3 int8 planes
 * of 22 bits per 256 columns (k_xmp_quant, cu_xmp.cuh's layout; d =
 * absmax / (2^21 - 1)), so the products are float32-grade, as the float
 * kernels' are.
 *
 * A (row, token)'s sum, the same in every launch whatever the token count,
 * the chunk, the kernel or the block it falls in:
 *   per 256-column block b, as k_xmp's step (cu_moemmp.cu): the exact
 *   integer sums of each sub-block and plane scaled by sc_j (IMAD), the
 *   mins' sums N from the planes' sub-block sums (two MMAs), then
 *   w = d join(M) - dmin join(N) and f_s = fma(dx_b, w, f_s);
 *   slice s = b % S of the row's blocks in order (one warp each; S =
 *   xmd_slices, from the column count alone), then y = ((f_0 + f_1) + ..).
 * A block is 8 warps: 8 / S row tiles of 16 rows by S slices.  One token
 * (k_xmd1) and two (k_xmd2) quantize their input in the kernel; more are quantized
 * first (k_xmd_quant_il: the tokens of a chunk interleaved, xmd_tok) and go
 * to k_xmd, 8 tokens a block (grid y: chunks
 * of 8; each weight is read once a chunk, the second from L2): at 128
 * registers two blocks an SM, where 16 a block (MEMRA_CUDA_XMD_NG=2, 226
 * registers) holds one (run 184: q/k/v at 16 tokens 18.2 -> 14.7 us).  Up to XMD_MATS
 * matrices of the same columns share a launch (q, k and v): grid x walks
 * their row tiles in turn. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_bench.h"
#include "kernels/cuda/cu_mma.cuh" /* mr_imma32_us */
#include "kernels/cuda/cu_xmp.cuh"

#define XMD_WARPS 8 /* a block: slices x row tiles */
/* Warps along a row, which fix the order of a sum: 4 below 4,096 columns
 * (2,048: 2 blocks a warp), 8 from there (4,096: 2, 12,288: 6); a function
 * of the column count alone. */
__host__ __device__ constexpr int xmd_slices(int nsb) { return nsb >= 16 ? 8 : 4; }
#define XMD_MATS MR_CU_MV_SUBS /* matrices a launch at most: what mr_cu_matmul_multi passes */

struct xmd_args {
    const uint8_t *W[XMD_MATS];
    float *y[XMD_MATS];
    int rows[XMD_MATS];
    int blk0[XMD_MATS + 1]; /* the blocks before matrix s; blk0[m]: all of them */
    int m, cols, n;
    int slices, tl; /* warps along a row (xmd_slices: the sum's order), row tiles a block */
    size_t row_bytes;
    const uint8_t *Xq; /* the operand: n rows of cols / 256 blocks (xmp_blk<type, 3>) */
    const float *x;    /* k_xmd2: the input rows themselves */
    int type;          /* MR_TYPE_Q4_K or MR_TYPE_IQ4_XS (the launch's instance) */
    bool il;           /* Xq interleaved (xmd_tok) */
    /* k_xmd1's CONV form (mr_cu_xmd_matvec_conv): matrix 0's rows are the
     * channels of a causal convolution of conv_k taps run on their sums
     * (as k_mvx24's, cu_mvx24.cu xs_conv_store) */
    const float *conv_w;
    float *conv_state, *conv_y;
    int conv_k;
};

#define XMD_QIN 2 /* tokens a call at most for k_xmd2, which quantizes its own input */
/* k_xmd2's shared memory: slice s's blocks b = s, s + S, .. of each of
 * its q tokens */
__host__ __device__ constexpr int xmd_qin_blocks(int nsb) { return (nsb + xmd_slices(nsb) - 1) / xmd_slices(nsb); }
template <int T> __host__ __device__ constexpr size_t xmd_qin_smem(int nsb, int q)
{
    return (size_t)xmd_slices(nsb) * xmd_qin_blocks(nsb) * q * xmp_blk<T, XMD_PL>();
}

/* A (row, token)'s sum after one IQ4_XS block: f + dx (d join(M)), rounded
 * step by step as written (M: the planes' sub-block sums scaled by ls - 32;
 * no mins).  Every instance of every kernel here takes this one. */
template <int PL>
__device__ __forceinline__ float xmd_iq4_acc(float f, float dx, float d, const int (&M)[PL])
{
    return __fmaf_rn(dx, __fmul_rn(d, xmp_join<PL>(M)), f);
}

/* A sub-block's MMA: Q4_K's quants are unsigned, IQ4_XS's code book values
 * signed; the input planes signed. */
template <int T>
__device__ __forceinline__ void xmd_mma(int (&C)[4], const uint32_t (&A)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (T == MR_TYPE_Q4_K)
        mr_imma32_us(C, A, b0, b1);
    else
        mr_imma32_ss(C, A, b0, b1);
}

/* The end of one token's IQ4_XS step in k_xmd2 and k_xmd1, whose C values
 * hold the token's planes on the MMA's columns: the lo plane of rows a, b
 * from the odd lane (a shuffle every lane makes), then, in the lane that
 * holds the token's sums (mine), f += dx (d join(M)) for both rows, dx the
 * token's block scale in its input block blk. */
__device__ __forceinline__ void xmd_iq4_rows(const int (&M)[4], bool mine, const uint8_t *blk, const xs_iq4w &wa,
                                             const xs_iq4w &wb, float (&f)[2])
{
    const int mla = __shfl_xor_sync(0xffffffffu, M[0], 1), mlb = __shfl_xor_sync(0xffffffffu, M[2], 1);
    if (mine) {
        const float dx = *(const float *)(blk + 256 * XMD_PL);
        const int Ma[XMD_PL] = {M[0], M[1], mla}, Mb[XMD_PL] = {M[2], M[3], mlb};
        f[0] = xmd_iq4_acc<XMD_PL>(f[0], dx, q8_h2f(wa.hd.x), Ma);
        f[1] = xmd_iq4_acc<XMD_PL>(f[1], dx, q8_h2f(wb.hd.x), Mb);
    }
}

/* Sub-block j's A fragment and scales of rows a, b, either type (Q4_K's
 * scale bytes sc from xmp_q4k_scales; unused for IQ4_XS). */
__device__ __forceinline__ void xmd_frag(const xmp_q4k &wa, const xmp_q4k &wb, int j, uint32_t (&A)[4], int &sa,
                                         int &sb, const uint32_t (&sc)[2][2])
{
    xmp_frag(wa, wb, j, A, sa, sb, sc[0][j >> 2], sc[1][j >> 2]);
}
__device__ __forceinline__ void xmd_frag(const xs_iq4w &wa, const xs_iq4w &wb, int j, uint32_t (&A)[4], int &sa,
                                         int &sb, const uint32_t (&)[2][2])
{
    xmp_frag(wa, wb, j, A, sa, sb);
}

/* A warp's share of a block: its matrix (unrolled selects: the
 * arguments' arrays indexed at run time would be copied to local memory),
 * row tile and rows ra, ra + 8, and its slice's first two blocks of
 * weights, loaded before the PDL wait (model weights, never written by the
 * kernel before: cu_pdl.cuh's rule); two blocks a row stay in flight
 * (xmd_next). */
struct xmd_warp {
    const uint8_t *Wa, *Wb;
    float *y;
    int rows, ra;
    bool live;
};

template <int T, class Wd = typename xmp_type<T>::words>
__device__ __forceinline__ xmd_warp xmd_start(const xmd_args &a, int S, int slice, int tile, int g, int c, Wd &ca,
                                              Wd &cb, Wd &na, Wd &nb)
{
    constexpr size_t BB = xmp_type<T>::bytes;
    xmd_warp w;
    const uint8_t *W = a.W[0];
    w.y = a.y[0];
    w.rows = a.rows[0];
    int base = 0;
#pragma unroll
    for (int u = 1; u < XMD_MATS; u++)
        if (u < a.m && (int)blockIdx.x >= a.blk0[u]) {
            W = a.W[u];
            w.y = a.y[u];
            w.rows = a.rows[u];
            base = a.blk0[u];
        }
    const int rt = ((int)blockIdx.x - base) * a.tl + tile, nsb = a.cols / 256;
    w.live = 16 * rt < w.rows; /* rows % 16 == 0 (mr_cu_xmd_takes) */
    w.ra = 16 * rt + g;
    w.Wa = W + (size_t)(w.live ? w.ra : 0) * a.row_bytes;
    w.Wb = w.Wa + 8 * a.row_bytes;
    if (w.live && slice < nsb) {
        xmp_load(w.Wa + (size_t)slice * BB, c, ca);
        xmp_load(w.Wb + (size_t)slice * BB, c, cb);
    }
    if (w.live && slice + S < nsb) {
        xmp_load(w.Wa + (size_t)(slice + S) * BB, c, na);
        xmp_load(w.Wb + (size_t)(slice + S) * BB, c, nb);
    }
    return w;
}

/* After block b: the next block's weights current, block b + 2S's loaded. */
template <int T, class Wd = typename xmp_type<T>::words>
__device__ __forceinline__ void xmd_next(const xmd_warp &w, int b, int S, int nsb, int c, Wd &ca, Wd &cb, Wd &na,
                                         Wd &nb)
{
    constexpr size_t BB = xmp_type<T>::bytes;
    ca = na;
    cb = nb;
    if (b + 2 * S < nsb) {
        xmp_load(w.Wa + (size_t)(b + 2 * S) * BB, c, na);
        xmp_load(w.Wb + (size_t)(b + 2 * S) * BB, c, nb);
    }
}

/* Token t's block b of the operand, whose byte o (o % 8 == 0) is at
 * xmd_tok(..) + xmd_os<IL>() o.  Interleaved (the default, k_xmd_quant_il):
 * the 8 tokens of a chunk side by side a block, word by word (word w of
 * token t at (8 w + t % 8) 8 bytes into the chunk's block), so that a
 * warp's B words of 8 tokens (lanes g = token, c = word) are 256 bytes in
 * a row, 2 cache lines where the plain rows are 8: run 306's ncu had k_xmd
 * bound by L1 wavefronts (66% busy at 18% issue slots).  Plain
 * (MEMRA_CUDA_XMD_IL=0, and the chunks of 16 of MEMRA_CUDA_XMD_NG=2):
 * k_xmp_quant's rows, one token's blocks after another. */
template <bool IL> __host__ __device__ constexpr int xmd_os() { return IL ? 8 : 1; }
template <int BLK, bool IL>
__device__ __forceinline__ const uint8_t *xmd_tok(const uint8_t *Xq, int nsb, int t, int b)
{
    if constexpr (IL)
        return Xq + xmd_il_at<BLK>(nsb, t, b);
    return Xq + ((size_t)t * nsb + b) * BLK;
}

/* The input scales of tokens t, t + 1 (a lane's C columns) in block b of
 * the operand (0 past the call's tokens). */
template <int BLK, bool IL>
__device__ __forceinline__ void xmd_scales(const xmd_args &a, int t, int nsb, int b, float (&dx)[2])
{
#pragma unroll
    for (int h = 0; h < 2; h++)
        dx[h] = t + h < a.n ? __ldg((const float *)(xmd_tok<BLK, IL>(a.Xq, nsb, t + h, b) + xmd_os<IL>() * 256 * XMD_PL))
                            : 0.0f;
}

/* The interleaved operand (xmd_tok) of n rows of x: a warp a 256-column
 * block of one row (xmd_il_block). */
template <int T>
__global__ void __launch_bounds__(256) k_xmd_quant_il(const float *__restrict__ x, int cols, int n, uint8_t *out)
{
    __shared__ __align__(16) uint8_t stage[8][xmp_blk<T, XMD_PL>()];
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nsb = cols / 256;
    const int gw = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int i = gw / nsb, b = gw % nsb;
    if (i >= n)
        return;
    xmd_il_block_at<T>(x + (size_t)i * cols + 256 * b, stage[warp], out, nsb, i, b, lane);
}

/* Calls of 3+ tokens, after the operand's quantization (k_xmd_quant_il,
 * IL; else k_xmp_quant's rows): NG groups of 8 tokens a block (1: calls of
 * at most 8 tokens; grid y: chunks of 8 NG tokens), the operand's B words
 * straight from global memory (the block's row tiles read the same ones:
 * L1). */
template <int NG, int T = MR_TYPE_Q4_K, bool IL = false>
__global__ void __launch_bounds__(XMD_WARPS * 32, NG == 1 ? 2 : 1) k_xmd(const xmd_args a)
{
    constexpr bool Q4K = T == MR_TYPE_Q4_K;
    constexpr int BLK = xmp_blk<T, XMD_PL>(), OS = xmd_os<IL>();
    __shared__ float red[XMD_WARPS][NG * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int S = a.slices, slice = warp % S, tile = warp / S;
    const int nsb = a.cols / 256, t0 = 8 * NG * (int)blockIdx.y;
    typename xmp_type<T>::words ca, cb, na, nb;
    const xmd_warp w = xmd_start<T>(a, S, slice, tile, g, c, ca, cb, na, nb);
    const bool live = w.live;
    int b = slice;
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    float f[NG][4];
#pragma unroll
    for (int q = 0; q < NG; q++) f[q][0] = f[q][1] = f[q][2] = f[q][3] = 0.0f;
    /* this lane's B column g of group q: token t0 + 8q + g */
    bool tg[NG];
#pragma unroll
    for (int q = 0; q < NG; q++) tg[q] = t0 + 8 * q + g < a.n;
    for (; live && b < nsb; b += S) {
        const uint8_t *xg[NG];
#pragma unroll
        for (int q = 0; q < NG; q++) xg[q] = xmd_tok<BLK, IL>(a.Xq, nsb, tg[q] ? t0 + 8 * q + g : 0, b);
        int M[NG][XMD_PL][4];
#pragma unroll
        for (int q = 0; q < NG; q++)
#pragma unroll
            for (int p = 0; p < XMD_PL; p++) M[q][p][0] = M[q][p][1] = M[q][p][2] = M[q][p][3] = 0;
        uint32_t sc[2][2], mn[2][2]; /* rows a, b; sub-blocks 0..3, 4..7 (Q4_K) */
        if constexpr (Q4K)
            xmp_q4k_scales(ca, cb, sc, mn);
        (void)mn;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t A[4];
            int sa, sb;
            xmd_frag(ca, cb, j, A, sa, sb, sc);
#pragma unroll
            for (int q = 0; q < NG; q++) {
#pragma unroll
                for (int p = 0; p < XMD_PL; p++) {
                    const uint2 bw =
                        tg[q] ? __ldg((const uint2 *)(xg[q] + OS * ((XMD_PL * j + p) * 32 + 8 * c))) : make_uint2(0u, 0u);
                    int C[4] = {0, 0, 0, 0};
                    xmd_mma<T>(C, A, bw.x, bw.y);
                    M[q][p][0] += sa * C[0];
                    M[q][p][1] += sa * C[1];
                    M[q][p][2] += sb * C[2];
                    M[q][p][3] += sb * C[3];
                }
            }
        }
        if constexpr (Q4K) {
            /* the mins: N = sum_j m_j S_j a plane, two MMAs (k_xmp's) */
            const uint32_t Am[4] = {c == 0 ? mn[0][0] : c == 1 ? mn[0][1] : 0u,
                                    c == 0 ? mn[1][0] : c == 1 ? mn[1][1] : 0u, 0u, 0u};
            const float da = q8_h2f(ca.h.x), dma = q8_h2f(ca.h.x >> 16);
            const float db = q8_h2f(cb.h.x), dmb = q8_h2f(cb.h.x >> 16);
#pragma unroll
            for (int q = 0; q < NG; q++) {
                int N[XMD_PL][4];
#pragma unroll
                for (int p = 0; p < XMD_PL; p++) {
                    const uint2 xs = tg[q] ? __ldg((const uint2 *)(xg[q] + OS * (256 * XMD_PL + 16 + 16 * p + 8 * (c & 1))))
                                           : make_uint2(0u, 0u);
                    int Nl[4] = {0, 0, 0, 0}, Nh[4] = {0, 0, 0, 0};
                    mr_imma32_us(Nl, Am, xs.x, 0u);
                    mr_imma32_us(Nh, Am, xs.y, 0u);
#pragma unroll
                    for (int v = 0; v < 4; v++) N[p][v] = 256 * Nh[v] + Nl[v];
                }
                /* the scales of tokens t0 + 8q + 2c, + 1 (C columns 2c, 2c + 1) */
                float dx[2];
                xmd_scales<BLK, IL>(a, t0 + 8 * q + 2 * c, nsb, b, dx);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    int Mv[XMD_PL], Nv[XMD_PL];
#pragma unroll
                    for (int p = 0; p < XMD_PL; p++) {
                        Mv[p] = M[q][p][v];
                        Nv[p] = N[p][v];
                    }
                    f[q][v] = xmp_q4k_acc<XMD_PL>(f[q][v], dx[v & 1], v < 2 ? da : db, v < 2 ? dma : dmb, Mv, Nv);
                }
            }
        } else { /* IQ4_XS: no mins */
            const float da = q8_h2f(ca.hd.x), db = q8_h2f(cb.hd.x);
#pragma unroll
            for (int q = 0; q < NG; q++) {
                float dx[2];
                xmd_scales<BLK, IL>(a, t0 + 8 * q + 2 * c, nsb, b, dx);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    int Mv[XMD_PL];
#pragma unroll
                    for (int p = 0; p < XMD_PL; p++) Mv[p] = M[q][p][v];
                    f[q][v] = xmd_iq4_acc<XMD_PL>(f[q][v], dx[v & 1], v < 2 ? da : db, Mv);
                }
            }
        }
        xmd_next<T>(w, b, S, nsb, c, ca, cb, na, nb);
    }
    /* the slices' sums in slice order */
#pragma unroll
    for (int q = 0; q < NG; q++)
#pragma unroll
        for (int v = 0; v < 4; v++) red[warp][4 * q + v][lane] = f[q][v];
    __syncthreads();
    if (slice || !live)
        return;
#pragma unroll
    for (int q = 0; q < NG; q++) {
#pragma unroll
        for (int v = 0; v < 4; v++) {
            float acc = red[warp][4 * q + v][lane];
            for (int u = 1; u < S; u++) acc = __fadd_rn(acc, red[warp + u][4 * q + v][lane]);
            const int t = t0 + 8 * q + 2 * c + (v & 1), r = w.ra + (v < 2 ? 0 : 8);
            if (t < a.n)
                w.y[(size_t)t * w.rows + r] = acc;
        }
    }
}

/* k_xmd1's input (k_xmd2 writes the same inline): the warps of slice s quantize its
 * blocks b = s + S i of each of n tokens (xmp_quant_block) into shared
 * memory at ((s nloc + i) Q + t) BLK, Q the tokens a block holds; returns
 * the slice's first block (the caller's barrier follows). */
template <int Q, int T>
__device__ __forceinline__ uint8_t *xmd_quant_input(const xmd_args &a, uint8_t *sh, int S, int slice, int tile,
                                                    int n, int lane)
{
    constexpr int BLK = xmp_blk<T, XMD_PL>();
    const int nsb = a.cols / 256, nloc = xmd_qin_blocks(nsb);
    uint8_t *own = sh + (size_t)slice * nloc * Q * BLK;
    for (int i = tile; i < nloc && slice + S * i < nsb; i += a.tl) {
        const int bb = slice + S * i;
        for (int t = 0; t < n; t++) {
            const float4 *xr = (const float4 *)(a.x + (size_t)t * a.cols + 256 * bb + 8 * lane);
            const float4 u0 = xr[0], u1 = xr[1];
            const float v[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
            xmp_quant_block<T, XMD_PL>(v, own + ((size_t)i * Q + t) * BLK, lane);
        }
    }
    return own;
}

/* k_xmd1's and k_xmd2's end: the slices' sums of rows ra, ra + 8 of token
 * tc joined in slice order by the slice-0 warp of each row tile (mine: this
 * lane holds that token's sums); then after(h, row, sum) for each (k_xmd1's
 * convolution) */
struct xmd_no_after {
    __device__ void operator()(int, int, float) const {}
};
template <class After = xmd_no_after>
__device__ __forceinline__ void xmd_join_rows(float (*red)[2][32], const xmd_warp &w, const float (&f)[2], int S,
                                              int slice, int warp, int lane, bool mine, int tc,
                                              After after = After())
{
    red[warp][0][lane] = f[0];
    red[warp][1][lane] = f[1];
    __syncthreads();
    if (slice || !w.live || !mine)
        return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float acc = red[warp][h][lane];
        for (int u = 1; u < S; u++) acc = __fadd_rn(acc, red[warp + u][h][lane]);
        const int r = w.ra + 8 * h;
        w.y[(size_t)tc * w.rows + r] = acc;
        after(h, r, acc);
    }
}

/* Calls of at most XMD_QIN tokens: the planes of a token on the MMA's
 * columns (column g: token g / 4, plane g % 4, 3 and 7 zero, cu_moemma.cu's
 * pairs), so a sub-block is one MMA and 4 IMADs instead of three and 12;
 * the same integers, joined by the same float steps (xmp_q4k_acc) in the
 * same order, so the same bits as k_xmd.  Lane (g, c) holds columns 2c,
 * 2c + 1: c even the hi and mid planes of token c / 2, c odd its lo (one
 * shuffle joins them).  The block's row tiles share their input: the warps
 * of a slice quantize its blocks between them into shared memory
 * (xmd_quant_input), then one barrier. */
template <int T = MR_TYPE_Q4_K>
__global__ void __launch_bounds__(XMD_WARPS * 32) k_xmd2(const xmd_args a)
{
    constexpr bool Q4K = T == MR_TYPE_Q4_K;
    constexpr int BLK = xmp_blk<T, XMD_PL>();
    __shared__ float red[XMD_WARPS][2][32];
    extern __shared__ __align__(16) uint8_t xmd_sh[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int S = a.slices, slice = warp % S, tile = warp / S;
    const int nsb = a.cols / 256, nloc = xmd_qin_blocks(nsb);
    typename xmp_type<T>::words ca, cb, na, nb;
    const xmd_warp w = xmd_start<T>(a, S, slice, tile, g, c, ca, cb, na, nb);
    const bool live = w.live;
    int b = slice;
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    /* slice s's block b = s + S i of token t at ((s nloc + i) 2 + t) BLK */
    uint8_t *own = xmd_sh + (size_t)slice * nloc * XMD_QIN * BLK;
    for (int i = tile; i < nloc && slice + S * i < nsb; i += a.tl) {
        const int bb = slice + S * i;
        for (int t = 0; t < a.n; t++) {
            const float4 *xr = (const float4 *)(a.x + (size_t)t * a.cols + 256 * bb + 8 * lane);
            const float4 u0 = xr[0], u1 = xr[1];
            const float v[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
            xmp_quant_block<T, XMD_PL>(v, own + ((size_t)i * XMD_QIN + t) * BLK, lane);
        }
    }
    __syncthreads();
    const int tt = g >> 2, pp = g & 3; /* this lane's B column: token tt, plane pp */
    const bool col = pp < XMD_PL && tt < a.n;
    const int tc = c >> 1; /* the token of this lane's C values (c even: hi, mid; odd: lo) */
    float f[2] = {0.0f, 0.0f}; /* rows ra, ra + 8 of token tc (lanes c even) */
    for (int i = 0; live && b < nsb; b += S, i++) {
        const uint8_t *xb = own + ((size_t)i * XMD_QIN + (col ? tt : 0)) * BLK;
        int M[4] = {0, 0, 0, 0};
        uint32_t sc[2][2], mn[2][2];
        if constexpr (Q4K)
            xmp_q4k_scales(ca, cb, sc, mn);
        (void)mn;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t A[4];
            int sa, sb;
            xmd_frag(ca, cb, j, A, sa, sb, sc);
            const uint2 bw = col ? *(const uint2 *)(xb + (XMD_PL * j + pp) * 32 + 8 * c) : make_uint2(0u, 0u);
            int C[4] = {0, 0, 0, 0};
            xmd_mma<T>(C, A, bw.x, bw.y);
            M[0] += sa * C[0];
            M[1] += sa * C[1];
            M[2] += sb * C[2];
            M[3] += sb * C[3];
        }
        if constexpr (Q4K) {
            const uint32_t Am[4] = {c == 0 ? mn[0][0] : c == 1 ? mn[0][1] : 0u,
                                    c == 0 ? mn[1][0] : c == 1 ? mn[1][1] : 0u, 0u, 0u};
            const uint2 xs =
                col ? *(const uint2 *)(xb + 256 * XMD_PL + 16 + 16 * pp + 8 * (c & 1)) : make_uint2(0u, 0u);
            int Nl[4] = {0, 0, 0, 0}, Nh[4] = {0, 0, 0, 0};
            mr_imma32_us(Nl, Am, xs.x, 0u);
            mr_imma32_us(Nh, Am, xs.y, 0u);
            int N[4];
#pragma unroll
            for (int v = 0; v < 4; v++) N[v] = 256 * Nh[v] + Nl[v];
            /* the lo plane of rows a, b from the odd lane */
            const int mla = __shfl_xor_sync(0xffffffffu, M[0], 1), mlb = __shfl_xor_sync(0xffffffffu, M[2], 1);
            const int nla = __shfl_xor_sync(0xffffffffu, N[0], 1), nlb = __shfl_xor_sync(0xffffffffu, N[2], 1);
            if (!(c & 1) && tc < a.n) {
                const float dx = *(const float *)(own + ((size_t)i * XMD_QIN + tc) * BLK + 256 * XMD_PL);
                const float da = q8_h2f(ca.h.x), dma = q8_h2f(ca.h.x >> 16);
                const float db = q8_h2f(cb.h.x), dmb = q8_h2f(cb.h.x >> 16);
                const int Ma[XMD_PL] = {M[0], M[1], mla}, Mb[XMD_PL] = {M[2], M[3], mlb};
                const int Na[XMD_PL] = {N[0], N[1], nla}, Nb[XMD_PL] = {N[2], N[3], nlb};
                f[0] = xmp_q4k_acc<XMD_PL>(f[0], dx, da, dma, Ma, Na);
                f[1] = xmp_q4k_acc<XMD_PL>(f[1], dx, db, dmb, Mb, Nb);
            }
        } else { /* IQ4_XS: no mins */
            xmd_iq4_rows(M, !(c & 1) && tc < a.n, own + ((size_t)i * XMD_QIN + tc) * BLK, ca, cb, f);
        }
        xmd_next<T>(w, b, S, nsb, c, ca, cb, na, nb);
    }
    xmd_join_rows(red, w, f, S, slice, warp, lane, !(c & 1) && tc < a.n, tc);
}

/* After k_xmd1's step on block b: block b + 2S (two steps ahead) into the
 * same registers, so that two steps a row stay in flight as with xmd_next */
template <int T, class Wd = typename xmp_type<T>::words>
__device__ __forceinline__ void xmd1_refill(const xmd_warp &w, int b, int S, int nsb, int c, Wd &wa, Wd &wb)
{
    constexpr size_t BB = xmp_type<T>::bytes;
    if (b + 2 * S < nsb) {
        xmp_load(w.Wa + (size_t)(b + 2 * S) * BB, c, wa);
        xmp_load(w.Wb + (size_t)(b + 2 * S) * BB, c, wb);
    }
}

/* One-token calls (xmd_pick_one): k_xmd2's numerics with half its shared
 * memory (one token's planes: 40 KB at 12,288 columns) and its walk two
 * steps a pass on two register sets refilled in place, instead of copying
 * the next step's weights into the current set each step (PTX of a step
 * ~404 -> ~325 instructions).  The same steps in the same order: the same
 * bits (kernel-check xmd-one-inv).  BPS: blocks an SM, 2 (96 registers; a
 * bound of 2 would let it take 121) or 3 (80 registers, 16 bytes of stack).
 * k_xmd2 keeps its own copy of the step and the input's quantization:
 * shared with this kernel (a lambda, or xmd_quant_input) they moved its
 * code (92 -> 93, 122 or 123 registers), and the lambda form lost 2-5%
 * (run 237).  The join is shared (92 registers still; its PTX differs from
 * the measured kernel's only in where the join's predicate is computed,
 * outside the walk).  A step helper
 * given the step's two input addresses keeps k_xmd2 at 92 registers but
 * takes this kernel from 96 to 98 and gives the 3-an-SM one 52 bytes of
 * spill loads: not without a GPU to time it. */
template <int BPS, int T = MR_TYPE_Q4_K, bool CONV = false>
__global__ void __launch_bounds__(XMD_WARPS * 32, BPS == 3 ? 3 : 0) k_xmd1(const xmd_args a)
{
    constexpr bool Q4K = T == MR_TYPE_Q4_K;
    using Wd = typename xmp_type<T>::words;
    constexpr int BLK = xmp_blk<T, XMD_PL>();
    __shared__ float red[XMD_WARPS][2][32];
    extern __shared__ __align__(16) uint8_t xmd_sh[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int S = a.slices, slice = warp % S, tile = warp / S;
    const int nsb = a.cols / 256;
    Wd ca, cb, na, nb;
    const xmd_warp w = xmd_start<T>(a, S, slice, tile, g, c, ca, cb, na, nb);
    const bool live = w.live;
    int b = slice;
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    /* CONV: the lanes that will hold rows ra and ra + 8 of matrix 0 load
     * their channels' taps and old state now, in flight with the input's
     * quantization and the products */
    const bool conv = CONV && slice == 0 && c == 0 && live && w.y == a.y[0];
    float cw[2][MR_CU_CONV_TAPS], cs[2][MR_CU_CONV_TAPS - 1];
    if constexpr (CONV) {
        if (conv) {
#pragma unroll
            for (int h = 0; h < 2; h++) /* rows % 16 == 0: both exist */
                mr_conv1_fetch(a.conv_w, a.conv_state, a.rows[0], w.ra + 8 * h, a.conv_k, cw[h], cs[h]);
        }
    }
    const uint8_t *own = xmd_quant_input<1, T>(a, xmd_sh, S, slice, tile, 1, lane);
    __syncthreads();
    const bool col = g < XMD_PL; /* this lane's B column: plane g */
    float f[2] = {0.0f, 0.0f};    /* rows ra, ra + 8 (lane c = 0) */
    /* step i of the warp (its slice's block slice + S i) on the weights of
     * rows a, b: k_xmd2's step for one token, whose C values are in lanes
     * c = 0 (its hi and mid planes) and c = 1 (its lo) */
    auto step = [&](int i, const Wd &wa, const Wd &wb) {
        const uint8_t *xb = own + (size_t)i * BLK;
        int M[4] = {0, 0, 0, 0};
        uint32_t sc[2][2], mn[2][2];
        if constexpr (Q4K)
            xmp_q4k_scales(wa, wb, sc, mn);
        (void)mn;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t A[4];
            int sa, sb;
            xmd_frag(wa, wb, j, A, sa, sb, sc);
            const uint2 bw = col ? *(const uint2 *)(xb + (XMD_PL * j + g) * 32 + 8 * c) : make_uint2(0u, 0u);
            int C[4] = {0, 0, 0, 0};
            xmd_mma<T>(C, A, bw.x, bw.y);
            M[0] += sa * C[0];
            M[1] += sa * C[1];
            M[2] += sb * C[2];
            M[3] += sb * C[3];
        }
        if constexpr (Q4K) {
            const uint32_t Am[4] = {c == 0 ? mn[0][0] : c == 1 ? mn[0][1] : 0u,
                                    c == 0 ? mn[1][0] : c == 1 ? mn[1][1] : 0u, 0u, 0u};
            const uint2 xs = col ? *(const uint2 *)(xb + 256 * XMD_PL + 16 + 16 * g + 8 * (c & 1)) : make_uint2(0u, 0u);
            int Nl[4] = {0, 0, 0, 0}, Nh[4] = {0, 0, 0, 0};
            mr_imma32_us(Nl, Am, xs.x, 0u);
            mr_imma32_us(Nh, Am, xs.y, 0u);
            int N[4];
#pragma unroll
            for (int v = 0; v < 4; v++) N[v] = 256 * Nh[v] + Nl[v];
            const int mla = __shfl_xor_sync(0xffffffffu, M[0], 1), mlb = __shfl_xor_sync(0xffffffffu, M[2], 1);
            const int nla = __shfl_xor_sync(0xffffffffu, N[0], 1), nlb = __shfl_xor_sync(0xffffffffu, N[2], 1);
            if (c == 0) {
                const float dx = *(const float *)(xb + 256 * XMD_PL);
                const float da = q8_h2f(wa.h.x), dma = q8_h2f(wa.h.x >> 16);
                const float db = q8_h2f(wb.h.x), dmb = q8_h2f(wb.h.x >> 16);
                const int Ma[XMD_PL] = {M[0], M[1], mla}, Mb[XMD_PL] = {M[2], M[3], mlb};
                const int Na[XMD_PL] = {N[0], N[1], nla}, Nb[XMD_PL] = {N[2], N[3], nlb};
                f[0] = xmp_q4k_acc<XMD_PL>(f[0], dx, da, dma, Ma, Na);
                f[1] = xmp_q4k_acc<XMD_PL>(f[1], dx, db, dmb, Mb, Nb);
            }
        } else { /* IQ4_XS: no mins */
            xmd_iq4_rows(M, c == 0, xb, wa, wb, f);
        }
    };
    /* two steps a pass, each on its own set of registers, refilled in place */
    int i = 0;
    for (; live && b + S < nsb; b += 2 * S, i += 2) {
        step(i, ca, cb);
        xmd1_refill<T>(w, b, S, nsb, c, ca, cb);
        step(i + 1, na, nb);
        xmd1_refill<T>(w, b + S, S, nsb, c, na, nb);
    }
    if (live && b < nsb)
        step(i, ca, cb);
    if constexpr (!CONV) {
        xmd_join_rows(red, w, f, S, slice, warp, lane, c == 0, 0);
    } else { /* each row's convolution after its join */
        xmd_join_rows(red, w, f, S, slice, warp, lane, c == 0, 0, [&](int h, int r, float acc) {
            if (conv)
                mr_conv1_token(acc, cw[h], cs[h], a.conv_k, a.rows[0], r, a.conv_state, a.conv_y);
        });
    }
}

/* ---- host side ---- */

/* The most shared memory a QIN block may ask for (set at init; 48 KB
 * without the opt-in). */
static size_t xmd_qin_max = 48 * 1024;

void mr_cu_xmd_init(mr_cu_ctx *c)
{
    const char *e = getenv("MEMRA_CUDA_XMD");
    c->xmd = !(e && !strcmp(e, "0"));
    const char *g = getenv("MEMRA_CUDA_XMD_NG");
    c->xmd_ng2 = g && !strcmp(g, "2");
    /* the interleaved operand (xmd_tok), the default; run 307 (H100,
     * 30B-A3B), against k_xmp_quant's rows: q/k/v at 16 tokens 16.6 ->
     * 13.1 us, o 14.5 -> 11.7, decode only C = 16 +4.5%, 512-token prompts
     * +3.0%; the 35B-A3B's decode only +2.0% */
    const char *il = getenv("MEMRA_CUDA_XMD_IL");
    c->xmd_il = !(il && !strcmp(il, "0"));
    /* the operand written by the launch before the product where it can:
     * bit 0 the end of a mixture layer before q/k/v or an in-projection
     * (runs 310-311: decode only C = 16 +0.8-1.0%), bit 1 a decode batch's
     * attention merge before o (run 312: +0.8% more, five pairs); one
     * launch fewer a layer each.  3 (both) by default */
    long long xq = 3;
    mr_cu_env_int(c, "MEMRA_CUDA_FUSE_XQ", 0, 3, "0, 1, 2 or 3", &xq); /* a bad value: the context's error */
    c->xmd_pre_on = (int)xq;
    c->xmd_pre_x = NULL;
    const size_t want = 160 * 1024;
    const char *o = getenv("MEMRA_CUDA_XMD_ONE");
    c->xmd_one = !o || !strcmp(o, "auto") ? -1 : !strcmp(o, "1") ? 2 : !strcmp(o, "3") ? 3 : 0;
    /* IQ4_XS too: every matrix the kernels take (all, the default), those
     * of the 22-bit kernel's shapes (x24) or none (0).  Runs 267-268 (H100,
     * 35B-A3B), x24 against none: decode only C = 16 883 -> 1,052 and 1,087
     * output tok/s; tg128 265.9 -> 265.2 (with k_xmd1's CONV form; without
     * it -3%).  Run 272, all against x24: C = 16 1,330-1,338 -> 1,592-1,597,
     * tg128 +1.0%; pp512 the same each time */
    const char *iq = getenv("MEMRA_CUDA_XMD_IQ4XS");
    c->xmd_iq4 = iq && !strcmp(iq, "0") ? 0 : iq && !strcmp(iq, "x24") ? 1 : 2;
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    if (c->xmd && xmd_qin_max < want && cudaFuncSetAttribute(k_xmd2<>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd1<2>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd1<3>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd2<MR_TYPE_IQ4_XS>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd1<2, MR_TYPE_IQ4_XS>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd1<3, MR_TYPE_IQ4_XS>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd1<2, MR_TYPE_Q4_K, true>, at, (int)want) == cudaSuccess &&
        cudaFuncSetAttribute(k_xmd1<2, MR_TYPE_IQ4_XS, true>, at, (int)want) == cudaSuccess)
        xmd_qin_max = want;
    cudaGetLastError(); /* a refused opt-in leaves the 48 KB */
}

/* Rows a matrix may have (a shape rule, so a matrix's kernel does not
 * depend on the batch): the 8B's gate and up (12,288 rows each) keep the
 * float kernel, whose one token is faster there (run 181: 24,576 x 4,096
 * 21.6 us against 32.9; at 16 tokens the same, 105 against 103). */
#define XMD_MAX_ROWS 8192

/* IQ4_XS: every matrix the kernels take (the default; the 35B-A3B's
 * out-projections, 2,048 x 4,096, were 54.7 us a 16-token call on the float
 * kernel, run 271), or with MEMRA_CUDA_XMD_IQ4XS=x24 only those the 22-bit
 * kernel's shape rule gives it (cu_mvx24.cu x24_one: at most 2,048 columns,
 * 4,096 rows or more, or fewer than 128, which share the in-projection's
 * launch), or none (=0). */
static bool xmd_type_ok(const mr_cu_ctx *c, const mr_weight *v)
{
    if (v->type == MR_TYPE_Q4_K)
        return true;
    if (v->type != MR_TYPE_IQ4_XS || !c->xmd_iq4)
        return false;
    return c->xmd_iq4 == 2 || (v->cols <= 2048 && (v->rows >= 4096 || v->rows < 128));
}

bool mr_cu_xmd_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m)
{
    if (!c->xmd || m < 1 || m > XMD_MATS || !w[0])
        return false;
    for (int s = 0; s < m; s++) {
        const mr_weight *v = w[s];
        if (!v || !v->data || v->type != w[0]->type || !xmd_type_ok(c, v) || v->cols != w[0]->cols ||
            v->cols % 256 || v->cols > (1 << 20) || v->rows % 16 || v->rows > XMD_MAX_ROWS || v->n_mats > 1)
            return false;
    }
    return true;
}

extern "C" int mr_cu_xmd_takes_one(mr_backend *be, const mr_weight *w)
{
    return mr_cu_xmd_takes(mr_cu(be), &w, 1);
}

/* A one-token call's kernel: k_xmd1 at 3 (returns 3) or 2 blocks an SM, or
 * k_xmd2 (0).  MEMRA_CUDA_XMD_ONE=0 / 1 / 3 fix it; auto, the default, goes
 * by the launch, from run 238 (H100, bench-kernels mv Q4_K one token, us,
 * k_xmd2 / k_xmd1<2> / k_xmd1<3>): 3 an SM at 4,096 columns (a warp walks 2
 * steps) where the grid is more than a block an SM (4,096 x 4,096 7.30 /
 * 7.17 / 6.88, 5,120 x 4,096 10.51 / 10.17 / 8.48, 6,144 x 4,096 10.98 /
 * 10.83 / 9.65), else 2 (2,048 x 4,096, 128 blocks: 4.37 / 4.18 / 4.81;
 * 4,096 x 12,288, whose 6 steps a warp pay for the spill: 16.84 / 16.25 /
 * 19.00; 5,120 x 2,048 4.47 / 4.40-5.05 / 4.80). */
static int xmd_pick_one(const mr_cu_ctx *c, int blocks, int nsb)
{
    if (c->xmd_one >= 0)
        return c->xmd_one;
    return nsb == 16 && blocks > c->n_sm ? 3 : 2;
}

/* The arguments of a launch for the m matrices (grid x: a.blk0[m] blocks;
 * a.Xq set by the caller where the operand is quantized first). */
static xmd_args xmd_args_for(const mr_weight *const *w, float *const *y, int m, const float *x, int n)
{
    xmd_args a = {};
    a.m = m;
    a.cols = (int)w[0]->cols;
    a.n = n;
    a.type = w[0]->type;
    a.slices = xmd_slices(a.cols / 256);
    a.tl = XMD_WARPS / a.slices;
    a.row_bytes = w[0]->row_bytes;
    a.x = x;
    a.blk0[0] = 0;
    for (int s = 0; s < m; s++) {
        a.W[s] = (const uint8_t *)w[s]->data;
        a.y[s] = y[s];
        a.rows[s] = (int)w[s]->rows;
        a.blk0[s + 1] = a.blk0[s] + (a.rows[s] / 16 + a.tl - 1) / a.tl;
    }
    return a;
}

/* One launch over the operand a.Xq (NULL: the kernel quantizes x itself;
 * n <= XMD_QIN; one: xmd_pick_one's kernel for n = 1). */
template <int T>
static void xmd_launch_t(mr_cu_ctx *c, const xmd_args &a, int one)
{
    const int cols = a.cols, n = a.n, m = a.m;
    const uint8_t *Xq = a.Xq;
    const dim3 g1((unsigned)a.blk0[m], 1);
    if (one == 3)
        mr_cu_launch(c, k_xmd1<3, T>, g1, XMD_WARPS * 32, xmd_qin_smem<T>(cols / 256, 1), a);
    else if (one)
        mr_cu_launch(c, k_xmd1<2, T>, g1, XMD_WARPS * 32, xmd_qin_smem<T>(cols / 256, 1), a);
    else if (!Xq)
        mr_cu_launch(c, k_xmd2<T>, g1, XMD_WARPS * 32, xmd_qin_smem<T>(cols / 256, XMD_QIN), a);
    else if (a.il)
        mr_cu_launch(c, k_xmd<1, T, true>, dim3((unsigned)a.blk0[m], (unsigned)((n + 7) / 8)), XMD_WARPS * 32, 0, a);
    else if (n <= 8 || !c->xmd_ng2)
        mr_cu_launch(c, k_xmd<1, T>, dim3((unsigned)a.blk0[m], (unsigned)((n + 7) / 8)), XMD_WARPS * 32, 0, a);
    else
        mr_cu_launch(c, k_xmd<2, T>, dim3((unsigned)a.blk0[m], (unsigned)((n + 15) / 16)), XMD_WARPS * 32, 0, a);
    MR_CU_LAUNCHED(c, "xmd matvec");
}

static void xmd_launch(mr_cu_ctx *c, const xmd_args &a, int one)
{
    if (a.type == MR_TYPE_IQ4_XS)
        xmd_launch_t<MR_TYPE_IQ4_XS>(c, a, one);
    else
        xmd_launch_t<MR_TYPE_Q4_K>(c, a, one);
}

/* The shared memory of a launch whose blocks quantize q tokens' input
 * themselves (k_xmd1: 1, k_xmd2: XMD_QIN), by the launch's type. */
static size_t xmd_qin_bytes(const xmd_args &a, int q)
{
    const int nsb = a.cols / 256;
    return a.type == MR_TYPE_IQ4_XS ? xmd_qin_smem<MR_TYPE_IQ4_XS>(nsb, q) : xmd_qin_smem<MR_TYPE_Q4_K>(nsb, q);
}

bool mr_cu_xmd_matvec_conv(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                           const float *conv, float *state, int k, float *out)
{
    if (k < 1 || k > MR_CU_CONV_TAPS || !conv || !state || !out || !mr_cu_xmd_takes(c, w, m))
        return false;
    xmd_args a = xmd_args_for(w, y, m, x, 1);
    /* the form exists for k_xmd1 at 2 blocks an SM, with its input in
     * shared memory: where the one-token call would run anything else, the
     * two stay apart */
    const size_t qin = xmd_qin_bytes(a, 1);
    if (xmd_pick_one(c, a.blk0[m], a.cols / 256) != 2 || qin > xmd_qin_max)
        return false;
    a.conv_w = conv;
    a.conv_state = state;
    a.conv_y = out;
    a.conv_k = k;
    const dim3 g1((unsigned)a.blk0[m], 1);
    if (a.type == MR_TYPE_IQ4_XS)
        mr_cu_launch(c, k_xmd1<2, MR_TYPE_IQ4_XS, true>, g1, XMD_WARPS * 32, qin, a);
    else
        mr_cu_launch(c, k_xmd1<2, MR_TYPE_Q4_K, true>, g1, XMD_WARPS * 32, qin, a);
    MR_CU_LAUNCHED(c, "xmd matvec + conv1d_silu");
    return true;
}

/* The interleaved operand's bytes for n rows of cols (whole chunks of 8
 * tokens), by the products' type. */
static size_t xmd_il_bytes(int n, int cols, int type)
{
    const size_t blk = type == MR_TYPE_IQ4_XS ? xmp_blk<MR_TYPE_IQ4_XS, XMD_PL>() : xmp_blk<MR_TYPE_Q4_K, XMD_PL>();
    return (size_t)(n + 7) / 8 * 8 * (size_t)(cols / 256) * blk;
}

/* Whether a call of n tokens reads the interleaved operand (quantized
 * first; the chunks of 8 alone).  Every type and width: IQ4_XS at 4,096
 * columns is 0.7-0.9 us slower a 16-token call on it than on the rows
 * (runs 307, 310), but the 35B-A3B's decode steps did not gain from those
 * calls on the rows (run 310). */
static bool xmd_il_call(const mr_cu_ctx *c, int n)
{
    return c->xmd_il && (n <= 8 || !c->xmd_ng2);
}

/* The interleaved operand of n rows (k_xmd_quant_il) in the context's
 * scratch; NULL when the reservation fails (the context has failed).  Where
 * the launch before this product wrote it already (mr_cu_xmd_il_made: the
 * end of a mixture layer, cu_ops.cu k_moe_tail, made the same bytes from the
 * same rows), nothing is launched.  Either way the note is spent. */
static const uint8_t *xmd_operand_il(mr_cu_ctx *c, const float *x, int n, int cols, int type)
{
    const bool made = c->xmd_pre_x == x && c->xmd_pre_n == n && c->xmd_pre_cols == cols && c->xmd_pre_type == type;
    c->xmd_pre_x = NULL;
    if (made) {
        c->xmd_pre_used++;
        return (const uint8_t *)c->scratch_xmd.p;
    }
    if (!mr_cu_reserve(c, &c->scratch_xmd, xmd_il_bytes(n, cols, type), "xmd operand"))
        return NULL;
    uint8_t *out = (uint8_t *)c->scratch_xmd.p;
    const unsigned grid = (unsigned)(((size_t)n * (size_t)(cols / 256) + 7) / 8);
    if (type == MR_TYPE_IQ4_XS)
        mr_cu_launch(c, k_xmd_quant_il<MR_TYPE_IQ4_XS>, grid, 256, 0, x, cols, n, out);
    else
        mr_cu_launch(c, k_xmd_quant_il<MR_TYPE_Q4_K>, grid, 256, 0, x, cols, n, out);
    MR_CU_LAUNCHED(c, "xmd input (interleaved)");
    return out;
}

uint8_t *mr_cu_xmd_il_prepare(mr_cu_ctx *c, const mr_weight *w, int n, int from, int *type)
{
    c->xmd_pre_x = NULL;
    if (!(c->xmd_pre_on & from) || n <= XMD_QIN || !xmd_il_call(c, n) || !mr_cu_xmd_takes(c, &w, 1) ||
        !mr_cu_reserve(c, &c->scratch_xmd, xmd_il_bytes(n, (int)w->cols, w->type), "xmd operand"))
        return NULL;
    *type = w->type;
    return (uint8_t *)c->scratch_xmd.p;
}

void mr_cu_xmd_il_made(mr_cu_ctx *c, const float *x, int n, int cols, int type)
{
    c->xmd_pre_x = x;
    c->xmd_pre_n = n;
    c->xmd_pre_cols = cols;
    c->xmd_pre_type = type;
}

bool mr_cu_xmd_matvec(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x, int n)
{
    if (n < 1 || !mr_cu_xmd_takes(c, w, m))
        return false;
    xmd_args a = xmd_args_for(w, y, m, x, n);
    const int nsb = a.cols / 256;
    const int one = n == 1 ? xmd_pick_one(c, a.blk0[m], nsb) : 0;
    if (n > XMD_QIN || xmd_qin_bytes(a, one ? 1 : XMD_QIN) > xmd_qin_max) {
        a.il = xmd_il_call(c, n);
        if (!a.il)
            c->xmd_pre_x = NULL; /* the scratch is written below */
        a.Xq = a.il                        ? xmd_operand_il(c, x, n, a.cols, a.type)
               : a.type == MR_TYPE_IQ4_XS ? mr_cu_xmp_operand_iq4x3(c, &c->scratch_xmd, x, n, a.cols)
                                           : mr_cu_xmp_operand_q4k3(c, &c->scratch_xmd, x, n, a.cols);
        if (!a.Xq)
            return true; /* the context has failed: nothing else runs */
    }
    xmd_launch(c, a, a.Xq ? 0 : one);
    return true;
}

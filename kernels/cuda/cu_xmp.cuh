/* The int8 operand and weight fragments shared by the prompt products of
 * cu_moemmp.cu (k_xmp) and the decode batches of cu_mvxmd.cu (k_xmd): how
 * an input row is laid out once quantized to PL int8 planes (k_xmp_quant
 * writes it), how a lane loads a 256-column block of IQ4_XS or Q4_K
 * weights and turns a sub-block into the A fragment of an m16n8k32 MMA,
 * and how the planes' integer sums are joined in float.  Both kernels form
 * a (row, token)'s sum of a block from these, so their integers agree. */
#ifndef MR_CU_XMP_CUH
#define MR_CU_XMP_CUH

#include "kernels/cuda/cu_x24.cuh" /* xs_iq4nl8, xs_iq4w, q8_h2f */

template <int PL> constexpr int xmp_qmax() { return PL == 2 ? 32639 : 2097151; }
/* A row's 256-column block in the operand: 8 sub-blocks x PL planes x 32
 * bytes, then the block's scale dx (float) in a 16-byte record.  A plane's
 * 32 bytes of a sub-block are in the order of the type's fragments: IQ4_XS
 * (its quant word 4c holds columns 4c.. and 16 + 4c..): lane c's columns
 * 4c .. 4c + 3 then 16 + 4c .. 16 + 4c + 3 at 8c; Q4_K (a byte holds the
 * same column of two sub-blocks): the columns in order, lane c's 8c ..
 * 8c + 7 at 8c.  Q4_K's blocks end with the planes' sums over each
 * sub-block (its mins' term), per plane 16 bytes: balanced base-256 digits
 * of the 8 sums, lo of sub-blocks 0..3, hi of 0..3, lo of 4..7, hi of 4..7
 * (cu_moemma.cu's xmm_quant256 layout). */
template <int T> constexpr bool xmp_nat() { return T == MR_TYPE_Q4_K; }
template <int T, int PL> constexpr int xmp_blk() { return 256 * PL + 16 + (xmp_nat<T>() ? 16 * PL : 0); }

/* A warp's 256-column block of one input row (lane l: columns 8l .. 8l +
 * 7 in v) into its operand block at blk (the layout above): d = absmax /
 * QMAX, q = rint(x / d) as PL balanced int8 digits, Q4_K's sub-block sums,
 * dx.  A block with a NaN or an infinity gets dx = NaN and q = 0: its
 * products are NaN, as with float activations. */
template <int T, int PL>
__device__ __forceinline__ void xmp_quant_block(const float (&v)[8], uint8_t *blk, int lane)
{
    constexpr int QMAX = xmp_qmax<PL>();
    float m, inv;
    const bool bad = xs_absmax256(v, (float)QMAX, &m, &inv);
    /* digit p of columns 8l + 4h .. + 3 in w[p][h]: the lowest digit is q's
     * low byte, the next (q + 128) >> 8's, the top one (q + 32896) >> 16
     * for PL 3 (q + 128 = 256 (q >> 8 rounded) + (lo + 128), lo + 128 in
     * [0, 255]; the same one level up) */
    uint32_t w[PL][2] = {};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int q = bad ? 0 : __float2int_rn(v[k] * inv);
        q = min(max(q, -QMAX), QMAX);
        const int d1 = (q + 128) >> 8, sh = 8 * (k & 3);
        if constexpr (PL == 2) {
            w[0][k >> 2] |= (uint32_t)(d1 & 255) << sh;
        } else {
            w[0][k >> 2] |= (uint32_t)(((q + 32896) >> 16) & 255) << sh;
            w[1][k >> 2] |= (uint32_t)(d1 & 255) << sh;
        }
        w[PL - 1][k >> 2] |= (uint32_t)(q & 255) << sh;
    }
    /* lane l: sub-block j = l / 4, columns k0 = 8 (l % 4) .. of it; IQ4_XS:
     * a run of 4 columns k goes to 8 ((k % 16) / 4) + 4 (k / 16) of its
     * plane; Q4_K: to k */
    const int j = lane >> 2, k0 = 8 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int k = k0 + 4 * h, o = xmp_nat<T>() ? k : 8 * ((k & 15) >> 2) + 4 * (k >> 4);
#pragma unroll
        for (int p = 0; p < PL; p++) *(uint32_t *)(blk + (PL * j + p) * 32 + o) = w[p][h];
    }
    if constexpr (xmp_nat<T>()) {
#pragma unroll
        for (int p = 0; p < PL; p++) xs_plane_sums(w[p][0], w[p][1], blk, 256 * PL + 16 + 16 * p, lane);
    }
    if (lane == 0)
        *(float *)(blk + 256 * PL) = bad ? __int_as_float(0x7fc00000) : m / (float)QMAX;
}

/* The dense decode products' operand of calls of 3+ tokens (cu_mvxmd.cu
 * k_xmd, the default): 3 planes (22 bits), the 8 tokens of a chunk side by
 * side a block, 8-byte word by word.  Byte o (o % 8 == 0) of token t's
 * block b is at xmd_il_at(..) + 8 o: word w of token t at (8 w + t % 8) 8
 * bytes into the chunk's block. */
#define XMD_PL 3
template <int BLK> __host__ __device__ __forceinline__ size_t xmd_il_at(int nsb, int t, int b)
{
    return ((size_t)(t >> 3) * nsb + b) * 8 * BLK + 8 * (t & 7);
}

/* A warp's 256-column block b of token t (lane l: columns 8l .. 8l + 7 in
 * v) into that operand at Xq: quantized by xmp_quant_block into the warp's
 * stage (xmp_blk bytes of shared memory, the plain layout, so the integers
 * are k_xmp_quant's), then its words out to their places.  Every kernel
 * that writes the operand (cu_mvxmd.cu k_xmd_quant_il, cu_ops.cu k_moe_tail,
 * cu_attn.cu k_attn_merge_xq) goes through here. */
template <int T>
__device__ __forceinline__ void xmd_il_block(const float (&v)[8], uint8_t *stage, uint8_t *Xq, int nsb, int t, int b,
                                             int lane)
{
    constexpr int BLK = xmp_blk<T, XMD_PL>();
    static_assert(BLK % 8 == 0, "whole words a block");
    xmp_quant_block<T, XMD_PL>(v, stage, lane);
    __syncwarp();
    uint8_t *dst = Xq + xmd_il_at<BLK>(nsb, t, b);
    for (int k = lane; k < BLK / 8; k += 32) *(uint2 *)(dst + 64 * k) = *(const uint2 *)(stage + 8 * k);
    __syncwarp(); /* the stage is read before the warp's next block */
}

/* The same from the 256 floats at src (global memory; lane l reads columns
 * 8l .. 8l + 7): k_xmd_quant_il's rows, cu_attn.cu k_attn_merge_xq's merged
 * heads. */
template <int T>
__device__ __forceinline__ void xmd_il_block_at(const float *src, uint8_t *stage, uint8_t *Xq, int nsb, int t, int b,
                                                int lane)
{
    const float4 *r = (const float4 *)(src + 8 * lane);
    const float4 u = r[0], w = r[1];
    const float v[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
    xmd_il_block<T>(v, stage, Xq, nsb, t, b, lane);
}

/* A lane's words of a block in one row: IQ4_XS as cu_moemma.cu's (xs_iq4w) */
__device__ __forceinline__ void xmp_load(const uint8_t *blk, int c, xs_iq4w &w) { xs_iq4w_load(blk, c, w); }

/* Q4_K: the header (d, dmin, the 12
 * bytes of scales and mins) and per 32-byte group i (sub-blocks 2i, 2i + 1
 * in the low and high nibbles) its bytes 8c .. 8c + 7. */
struct xmp_q4k {
    uint4 h;
    uint2 q[4];
};

__device__ __forceinline__ void xmp_load(const uint8_t *blk, int c, xmp_q4k &w)
{
    w.h = __ldg((const uint4 *)blk);
#pragma unroll
    for (int i = 0; i < 4; i++) w.q[i] = __ldg((const uint2 *)(blk + 16 + 32 * i + 8 * c));
}

template <int T> struct xmp_type;
template <> struct xmp_type<MR_TYPE_IQ4_XS> {
    using words = xs_iq4w;
    static constexpr int bytes = 136; /* a 256-column block */
};
template <> struct xmp_type<MR_TYPE_Q4_K> {
    using words = xmp_q4k;
    static constexpr int bytes = 144;
};

/* Sub-block j's A fragment of rows a, b (A[0], A[2]: row a's columns of
 * lane c; A[1], A[3]: row b's) and its scales: IQ4_XS code book values
 * (signed) with ls - 32, Q4_K quants (unsigned) with sc (sca, scb: the
 * four sub-blocks' bytes of xs_q4k_bytes). */
__device__ __forceinline__ void xmp_frag(const xs_iq4w &wa, const xs_iq4w &wb, int j, uint32_t (&A)[4], int &sa,
                                         int &sb)
{
    xs_iq4nl8(wa.q[j], &A[0], &A[2]); /* row a: columns 4c.., 16 + 4c.. */
    xs_iq4nl8(wb.q[j], &A[1], &A[3]);
    sa = (int)xs_iq4_ls(wa.hd, j) - 32;
    sb = (int)xs_iq4_ls(wb.hd, j) - 32;
}
__device__ __forceinline__ void xmp_frag(const xmp_q4k &wa, const xmp_q4k &wb, int j, uint32_t (&A)[4], int &sa,
                                         int &sb, uint32_t sca, uint32_t scb)
{
    const int i = j >> 1, h = 4 * (j & 1);
    A[0] = (wa.q[i].x >> h) & 0x0F0F0F0Fu; /* row a: columns 8c .. 8c + 3 */
    A[1] = (wb.q[i].x >> h) & 0x0F0F0F0Fu;
    A[2] = (wa.q[i].y >> h) & 0x0F0F0F0Fu; /* 8c + 4 .. 8c + 7 */
    A[3] = (wb.q[i].y >> h) & 0x0F0F0F0Fu;
    sa = (int)((sca >> (8 * (j & 3))) & 0xffu);
    sb = (int)((scb >> (8 * (j & 3))) & 0xffu);
}

/* Q4_K rows a, b: the scale and min bytes of sub-blocks 0..3 and 4..7
 * (xs_q4k_bytes) */
__device__ __forceinline__ void xmp_q4k_scales(const xmp_q4k &wa, const xmp_q4k &wb, uint32_t (&sc)[2][2],
                                               uint32_t (&mn)[2][2])
{
    xs_q4k_bytes(wa.h, true, sc[0][0], mn[0][0]);
    xs_q4k_bytes(wa.h, false, sc[0][1], mn[0][1]);
    xs_q4k_bytes(wb.h, true, sc[1][0], mn[1][0]);
    xs_q4k_bytes(wb.h, false, sc[1][1], mn[1][1]);
}

/* The planes joined in float: 256 hi + lo, or 65536 hi + (256 mid + lo)
 * (|256 mid + lo| < 2^35 / 2^8: the inner sum is formed in float too). */
template <int PL> __device__ __forceinline__ float xmp_join(const int (&M)[PL])
{
    if constexpr (PL == 2)
        return __fmaf_rn(256.0f, (float)M[0], (float)M[1]);
    else
        return __fmaf_rn(65536.0f, (float)M[0], __fmaf_rn(256.0f, (float)M[1], (float)M[2]));
}

/* A (row, token)'s sum after one Q4_K block: f + dx (d join(M) - dmin
 * join(N)), rounded step by step as written (M: the planes' scaled
 * sub-block sums, N: the mins' term).  k_xmd and k_xmd2 promise each
 * other's bits, so both take this one; k_xmp writes the same steps inline
 * (its measured code). */
template <int PL>
__device__ __forceinline__ float xmp_q4k_acc(float f, float dx, float d, float dmin, const int (&M)[PL],
                                             const int (&N)[PL])
{
    float w = __fmul_rn(d, xmp_join<PL>(M));
    w = __fmaf_rn(-dmin, xmp_join<PL>(N), w);
    return __fmaf_rn(dx, w, f);
}

#endif

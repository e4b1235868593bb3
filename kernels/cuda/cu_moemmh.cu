/* Prompt expert products of Q4_K, Q6_K and IQ4_XS matrices on the float16
 * tensor cores, the weights decoded in registers (the default;
 * MEMRA_CUDA_XMH=0: the int8 kernel of cu_moemmp.cu for Q4_K and IQ4_XS, the
 * float16 kernel of cu_gemm.cu for Q6_K; =q4k: Q6_K on the latter;
 * MEMRA_CUDA_XMH_IQ4=0: IQ4_XS on the int8 kernel), in moe_ffn_prompt and
 * matmul_id_prompt.  H200, the 30B-A3B: a 2,048-token prompt 15,316 /
 * 15,409 -> 20,931 / 20,910 tok/s, pp512 13,564 -> 17,978 (run 202); gate/up
 * 950 -> 473-503 us a layer, down 502 -> 266-280.  The 35B-A3B (IQ4_XS,
 * ~16 tokens an expert at pp512): pp2048 6,854 -> 7,189 / 7,198, pp512 the
 * same (run 204).
 *
 * Why: the int8 kernel (cu_moemmp.cu k_xmp) spends ~14 instructions an
 * MMA (run 199, ncu of a 2,048-token prompt: gate/up 950 us a layer, 491M
 * instructions, issue slots 54% busy): each m16n8k32 MMA of a sub-block's
 * plane is scaled by the sub-block's scale as integers (4 IMADs), two planes
 * a token, the planes joined and the mins' term formed in float every 256
 * columns, and a fetch loop of 16-byte copies with divisions.  Here a lane
 * turns its weight nibbles into float16 values of the matrix (d sc q - dmin
 * m, the sub-block's scale and min folded in), so the MMAs accumulate a
 * whole row in float32 with nothing between them, and one decoded fragment
 * serves the tile's 8 groups of 8 tokens.
 *
 * The input is the float16 operand of the float16 expert kernel (cu_gemm.cu
 * prepare_x: each gathered row scaled by a power of two to a largest
 * magnitude of 2^8, the scale undone on the way out), so the precision is
 * that kernel's: float16 weights (the value formed in float32, then rounded
 * once) and inputs, float32 sums.  (Rounding d sc and dmin m to float16
 * first, three half2 instructions a pair of weights instead of five, gave
 * gate/up 455-464 us against 503 and failed fixture parity: qwen35moe
 * Q4_K_M against the CPU worst row 8.3e-3, run 200.)  A (row, token)'s sum depends only on
 * its own input row and weights, in the same order in any tile or call.
 *
 * Fragments (m16n8k16, A row-major, B column-major): an MMA takes 16
 * columns of one sub-block j, tile t (0, 1).  Lane c (= lane & 3) holds
 * the k slots 2c, 2c + 1, 2c + 8, 2c + 9; they carry the columns 32 j + 8 c
 * + 4 t + 0..3 (a permutation of k that A and B share), so a lane's weights
 * are the 4 bytes 8c + 4t .. of the Q4_K group j / 2 (low nibbles for even
 * j, high for odd: cu_xmp.cuh's xmp_q4k words) and its B values are 4
 * consecutive halves of its token: one 16-byte shared load serves both
 * tiles of a sub-block.
 *
 * A block: 4 warps of 16 rows (64 rows) by one tile of at most XMH_BN
 * tokens of one expert (cu_gemm.cu's grouping; its moe_gemm_launch calls
 * this kernel where it takes the weights); the tile's input rows
 * stream through XMH_STAGES 256-column steps in shared memory (cp.async),
 * each warp's weights one step ahead in registers. */
#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_mma.cuh" /* mr_cp16, mr_mma16816 */
#include "kernels/cuda/cu_pdl.cuh"
#include "kernels/cuda/cu_fast.cuh" /* mr_cu_fast_row_bytes */
#include "kernels/cuda/cu_xmp.cuh" /* xmp_q4k, xmp_load, xmp_q4k_scales; xs_q6k_words */

#include <cuda_fp16.h>
#include <type_traits>

#define XMH_BN MR_CU_XMH_TOKENS /* tokens a tile (cu_gemm.cu's grouping): 8 groups of 8 */
#define XMH_TG (XMH_BN / 8)
/* a token's 256 halves (512 bytes) padded to 64 mod 128: a quarter warp's
 * 16-byte reads (2 tokens by 4 lanes) hit distinct banks; IQ4_XS (two
 * 8-byte reads a sub-block, 4 tokens by 4 lanes a half warp): 32 mod 128 */
template <int T> constexpr int xmh_ts() { return T == MR_TYPE_IQ4_XS ? 544 : 576; }
#define XMH_STAGES 2
template <int T> constexpr int xmh_smem() { return XMH_STAGES * XMH_BN * xmh_ts<T>(); }

struct xmh_tile {
    int m, row0, cnt;
};

/* Four quants (bytes of q: values below 128; Q4_K's 0..15, Q6_K's 0..63)
 * as the float16 values q a - b, bytes 0, 1 into lo, 2, 3 into hi; s =
 * (128 a, -(128 a + b)) in float32.
 * A quant byte becomes the float 1 + q / 128 as bits (0x3F8q0000: the byte
 * 0x80 | q under the exponent byte 0x3F), so one fused multiply-add gives
 * (1 + q / 128) 128 a - (128 a + b) = q a - b, rounded once in float32
 * (s.y's own rounding is 2^-24 of 128 a + b: far below float16's), then
 * once to float16: the weight the float16 expert kernel decodes. */
__device__ __forceinline__ float xmh_w(uint32_t q8, int k, float2 s)
{
    return __fmaf_rn(__uint_as_float(__byte_perm(q8, 0x3F000000u, 0x7044 | (k << 8))), s.x, s.y);
}
__device__ __forceinline__ void xmh_deq(uint32_t q, float2 s, uint32_t &lo, uint32_t &hi)
{
    const uint32_t q8 = q | 0x80808080u;
    const __half2 v0 = __floats2half2_rn(xmh_w(q8, 0, s), xmh_w(q8, 1, s));
    const __half2 v1 = __floats2half2_rn(xmh_w(q8, 2, s), xmh_w(q8, 3, s));
    lo = *(const uint32_t *)&v0;
    hi = *(const uint32_t *)&v1;
}

/* Byte k (0..3) of w (0..255) as a float, exactly: 2^23 + byte as bits,
 * less 2^23.  k is a constant in the unrolled loops: one PRMT. */
__device__ __forceinline__ float xmh_byte(uint32_t w, int k)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540 | k)) - 8388608.0f;
}

/* Row r's sub-block j (the xs_q4k_bytes words of its sub-block group, byte
 * j & 3) as xmh_deq's s: a = d sc_j, b = dmin m_j, both exact in float32;
 * d128 = 128 d. */
__device__ __forceinline__ float2 xmh_scale(uint32_t sc, uint32_t mn, int j, float d128, float dmin)
{
    const float a = xmh_byte(sc, j & 3) * d128;
    return make_float2(a, -__fadd_rn(a, xmh_byte(mn, j & 3) * dmin));
}

/* The two MMAs of a sub-block's tiles (A0: tile 0, A1: tile 1) for each
 * group of 8 tokens with tokens (FULL: all XMH_TG); bj: this lane's B
 * values of the sub-block in token g's row of the slot. */
template <bool FULL>
__device__ __forceinline__ void xmh_mma(const uint32_t (&A0)[4], const uint32_t (&A1)[4], const uint8_t *bj, int ng,
                                        float (&f)[XMH_TG][4])
{
    constexpr int TS = xmh_ts<MR_TYPE_Q4_K>();
#pragma unroll
    for (int q = 0; q < XMH_TG; q++) {
        if (FULL || q < ng) {
            const uint4 bw = *(const uint4 *)(bj + 8 * q * TS);
            mr_mma16816(f[q], A0, bw.x, bw.y);
            mr_mma16816(f[q], A1, bw.z, bw.w);
        }
    }
}

/* Q4_K: a 256-column step of rows a (ca) and b (cb); brow: this lane's B
 * values of the step in token g's row of the slot. */
template <bool FULL>
__device__ __forceinline__ void xmh_step(const xmp_q4k &ca, const xmp_q4k &cb, const uint8_t *brow, int ng,
                                         float (&f)[XMH_TG][4])
{
    uint32_t sc[2][2], mn[2][2];
    xmp_q4k_scales(ca, cb, sc, mn);
    const float d128a = 128.0f * q8_h2f(ca.h.x), dmina = q8_h2f(ca.h.x >> 16);
    const float d128b = 128.0f * q8_h2f(cb.h.x), dminb = q8_h2f(cb.h.x >> 16);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float2 sa = xmh_scale(sc[0][j >> 2], mn[0][j >> 2], j, d128a, dmina);
        const float2 sb = xmh_scale(sc[1][j >> 2], mn[1][j >> 2], j, d128b, dminb);
        const int i = j >> 1, sh = 4 * (j & 1);
        uint32_t A0[4], A1[4]; /* tiles 0 and 1 */
        xmh_deq((ca.q[i].x >> sh) & 0x0F0F0F0Fu, sa, A0[0], A0[2]);
        xmh_deq((cb.q[i].x >> sh) & 0x0F0F0F0Fu, sb, A0[1], A0[3]);
        xmh_deq((ca.q[i].y >> sh) & 0x0F0F0F0Fu, sa, A1[0], A1[2]);
        xmh_deq((cb.q[i].y >> sh) & 0x0F0F0F0Fu, sb, A1[1], A1[3]);
        xmh_mma<FULL>(A0, A1, brow + 64 * j, ng, f);
    }
}

/* Q6_K (the padded copy, 212-byte blocks, 4-byte aligned: ql 128, qh 64,
 * sc 16, d at 208), half n (128 columns, sub-blocks j = 4n + qq of 32
 * columns 128n + 32qq + l): lane c's positions l = 8c + 4t .. + 3 (tile
 * t) are in the words ql[64n + l] (quarters 0, 2), ql[64n + 32 + l] (1, 3)
 * and qh[32n + l]; the half's 8 scales sc[8n ..], position l's of quarter
 * qq sc[8n + 2qq + l / 16] (l / 16 = c / 2 for this lane), and d. */
struct xmh_q6h {
    uint32_t qa[2], qb[2], h[2], s01, s23, d;
};

__device__ __forceinline__ void xmh_q6k_load(const uint8_t *blk, int n, int c, xmh_q6h &w)
{
#pragma unroll
    for (int t = 0; t < 2; t++) {
        w.qa[t] = q8_ld32(blk + 64 * n + 8 * c + 4 * t);
        w.qb[t] = q8_ld32(blk + 64 * n + 32 + 8 * c + 4 * t);
        w.h[t] = q8_ld32(blk + 128 + 32 * n + 8 * c + 4 * t);
    }
    w.s01 = q8_ld32(blk + 192 + 8 * n);
    w.s23 = q8_ld32(blk + 196 + 8 * n);
    w.d = q8_ld32(blk + 208);
}

/* Signed byte k of w as a float, exactly. */
__device__ __forceinline__ float xmh_sbyte(uint32_t w, int k)
{
    return __uint_as_float(__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7540 | k)) - 8388736.0f;
}

/* Quarter qq's xmh_deq scale of a row: w = d sc (q - 32), a = d sc exact,
 * s = (128 a, -160 a), both exact (a has at most 19 significant bits). */
__device__ __forceinline__ float2 xmh_q6k_scale(uint32_t u0, uint32_t u1, int qq, float d)
{
    const float a = xmh_sbyte(qq < 2 ? u0 : u1, 2 * (qq & 1)) * d;
    return make_float2(128.0f * a, -160.0f * a);
}

template <bool FULL>
__device__ __forceinline__ void xmh_half_q6k(const xmh_q6h &ca, const xmh_q6h &cb, int n, int c,
                                             const uint8_t *brow, int ng, float (&f)[XMH_TG][4])
{
    const float da = q8_h2f(ca.d), db = q8_h2f(cb.d);
    const int sh = 8 * (c >> 1); /* this lane's scales: bytes 0 and 2 of u0 (quarters 0, 1), u1 (2, 3) */
    const uint32_t u0a = ca.s01 >> sh, u1a = ca.s23 >> sh, u0b = cb.s01 >> sh, u1b = cb.s23 >> sh;
    uint32_t wa[2][4], wb[2][4]; /* [tile][quarter]: quants 0..63 */
#pragma unroll
    for (int t = 0; t < 2; t++) {
        xs_q6k_words(ca.qa[t], ca.qb[t], ca.h[t], wa[t]);
        xs_q6k_words(cb.qa[t], cb.qb[t], cb.h[t], wb[t]);
    }
#pragma unroll
    for (int qq = 0; qq < 4; qq++) {
        const float2 sa = xmh_q6k_scale(u0a, u1a, qq, da), sb = xmh_q6k_scale(u0b, u1b, qq, db);
        uint32_t A0[4], A1[4];
        xmh_deq(wa[0][qq], sa, A0[0], A0[2]);
        xmh_deq(wb[0][qq], sb, A0[1], A0[3]);
        xmh_deq(wa[1][qq], sa, A1[0], A1[2]);
        xmh_deq(wb[1][qq], sb, A1[1], A1[3]);
        xmh_mma<FULL>(A0, A1, brow + 64 * (4 * n + qq), ng, f);
    }
}

/* IQ4_XS (the GGUF blocks, 136 bytes): a lane's words as the int8 kernels
 * read them (xs_iq4w: per sub-block j the qs word 16 j + 4c, columns 4c ..
 * 4c + 3 in the low nibbles, 16 + 4c .. in the high ones), so tile 0 takes
 * the columns 4c .. 4c + 3 and tile 1 the columns 16 + 4c .., and the B
 * values are two 8-byte reads.  The code book values (xs_iq4nl8, bytes kv)
 * become float16 exactly (kv + 128 under the bits of 1024, less 1152) and
 * are multiplied by d (ls - 32) rounded to float16: two roundings of the
 * value, no cancellation (IQ4_XS has no mins). */
__device__ __forceinline__ void xmh_deq_iq4(uint32_t kv, __half2 s, uint32_t &lo, uint32_t &hi)
{
    const __half2 k1152 = __half2half2(__ushort_as_half((unsigned short)0x6480));
    const uint32_t b = kv ^ 0x80808080u;
    uint32_t u0 = __byte_perm(b, 0x64646464u, 0x4140), u1 = __byte_perm(b, 0x64646464u, 0x4342);
    const __half2 v0 = __hmul2(__hsub2(*(const __half2 *)&u0, k1152), s);
    const __half2 v1 = __hmul2(__hsub2(*(const __half2 *)&u1, k1152), s);
    lo = *(const uint32_t *)&v0;
    hi = *(const uint32_t *)&v1;
}

template <bool FULL>
__device__ __forceinline__ void xmh_step(const xs_iq4w &ca, const xs_iq4w &cb, const uint8_t *brow, int ng,
                                         float (&f)[XMH_TG][4])
{
    constexpr int TS = xmh_ts<MR_TYPE_IQ4_XS>();
    const float da = q8_h2f(ca.hd.x), db = q8_h2f(cb.hd.x);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        /* d (ls - 32): exact in float32 (11 by 6 bits), one rounding to float16 */
        const __half2 sa = __float2half2_rn(da * (float)((int)xs_iq4_ls(ca.hd, j) - 32));
        const __half2 sb = __float2half2_rn(db * (float)((int)xs_iq4_ls(cb.hd, j) - 32));
        uint32_t ka0, ka1, kb0, kb1; /* code book bytes: columns 4c.. (0), 16 + 4c.. (1) */
        xs_iq4nl8(ca.q[j], &ka0, &ka1);
        xs_iq4nl8(cb.q[j], &kb0, &kb1);
        uint32_t A0[4], A1[4];
        xmh_deq_iq4(ka0, sa, A0[0], A0[2]);
        xmh_deq_iq4(kb0, sb, A0[1], A0[3]);
        xmh_deq_iq4(ka1, sa, A1[0], A1[2]);
        xmh_deq_iq4(kb1, sb, A1[1], A1[3]);
        const uint8_t *bj = brow + 64 * j;
#pragma unroll
        for (int q = 0; q < XMH_TG; q++) {
            if (FULL || q < ng) {
                const uint2 b0 = *(const uint2 *)(bj + 8 * q * TS), b1 = *(const uint2 *)(bj + 8 * q * TS + 32);
                mr_mma16816(f[q], A0, b0.x, b0.y);
                mr_mma16816(f[q], A1, b1.x, b1.y);
            }
        }
    }
}

/* grid: x the row blocks of 64, y the tiles (blocks past *n_tiles return),
 * z the matrix (1: W2 into y2).  W: Q4_K's or IQ4_XS's GGUF blocks, or Q6_K's padded
 * copy.  X: the float16 operand rows (cols halves each), scale[i] their
 * scales; dst[i]: the output row of operand row i. */
template <int T>
__global__ void __launch_bounds__(128, 3)
k_xmh(const uint8_t *W, size_t mat_bytes, size_t row_bytes, int cols, int rows, const __half *__restrict__ X,
      const float *__restrict__ scale, const int32_t *__restrict__ dst, const xmh_tile *__restrict__ tiles,
      const int *n_tiles, float *y, const uint8_t *W2, float *y2)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ __align__(16) uint8_t xmh_sh[];
    constexpr int TS = xmh_ts<T>();
    if ((int)blockIdx.y >= *n_tiles) /* the grid is sized for the most tiles the call can have */
        return;
    const xmh_tile tl = tiles[blockIdx.y];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    if (blockIdx.z) {
        W = W2;
        y = y2;
    }
    const int nsb = cols / 256, ng = (tl.cnt + 7) >> 3; /* groups of 8 tokens with tokens */
    const int ra = (int)blockIdx.x * 64 + 16 * warp + g; /* rows ra, ra + 8 (rows % 64 == 0) */
    const uint8_t *Wa = W + (size_t)tl.m * mat_bytes + (size_t)ra * row_bytes, *Wb = Wa + 8 * row_bytes;
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(xmh_sh);
    /* step b's 512 bytes of each of the tile's tokens into slot b %
     * XMH_STAGES: thread tid copies 16-byte chunk tid % 32 of tokens tid /
     * 32, + 4, ... (tokens past cnt are never written: their MMA columns
     * come from stale bytes and are never stored) */
    const int ck = tid & 31, t0 = tid >> 5;
    const char *xsrc = (const char *)(X + (size_t)(tl.row0 + t0) * cols) + 16 * ck;
    const size_t xstep = (size_t)4 * cols * sizeof(__half);
    auto fetch = [&](int b) {
        const uint32_t slot = ring + (uint32_t)((b % XMH_STAGES) * XMH_BN * TS) + t0 * TS + 16 * ck;
        const char *s = xsrc + 512 * (size_t)b;
        for (int t = t0, k = 0; t < tl.cnt; t += 4, k++)
            mr_cp16(slot + (uint32_t)(4 * k * TS), s + k * xstep, true);
    };
    fetch(0);
    asm volatile("cp.async.commit_group;" ::: "memory");
    float f[XMH_TG][4];
#pragma unroll
    for (int q = 0; q < XMH_TG; q++) f[q][0] = f[q][1] = f[q][2] = f[q][3] = 0.0f;
    /* this step's weights of rows a, b and the next one's, one step (Q6_K:
     * one half) ahead */
    using words = typename std::conditional<T == MR_TYPE_Q6_K, xmh_q6h,
                                            typename std::conditional<T == MR_TYPE_IQ4_XS, xs_iq4w, xmp_q4k>::type>::type;
    constexpr int WB = T == MR_TYPE_IQ4_XS ? 136 : 144; /* a 256-column block (Q4_K, IQ4_XS) */
    words ca, cb, na, nb;
    if constexpr (T == MR_TYPE_Q6_K) {
        xmh_q6k_load(Wa, 0, c, ca);
        xmh_q6k_load(Wb, 0, c, cb);
    } else {
        xmp_load(Wa, c, ca);
        xmp_load(Wb, c, cb);
    }
#pragma unroll 1
    for (int b = 0; b < nsb; b++) {
        if (b + 1 < nsb)
            fetch(b + 1);
        asm volatile("cp.async.commit_group;" ::: "memory");
        if constexpr (T != MR_TYPE_Q6_K) {
            if (b + 1 < nsb) {
                xmp_load(Wa + (size_t)(b + 1) * WB, c, na);
                xmp_load(Wb + (size_t)(b + 1) * WB, c, nb);
            }
        }
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncthreads(); /* every thread's copies of step b have landed */
        const uint8_t *brow = xmh_sh + (b % XMH_STAGES) * XMH_BN * TS + g * TS + (T == MR_TYPE_IQ4_XS ? 8 : 16) * c;
        if constexpr (T == MR_TYPE_Q6_K) {
#pragma unroll
            for (int n = 0; n < 2; n++) {
                if (n == 0) {
                    xmh_q6k_load(Wa + (size_t)b * 212, 1, c, na);
                    xmh_q6k_load(Wb + (size_t)b * 212, 1, c, nb);
                } else if (b + 1 < nsb) {
                    xmh_q6k_load(Wa + (size_t)(b + 1) * 212, 0, c, na);
                    xmh_q6k_load(Wb + (size_t)(b + 1) * 212, 0, c, nb);
                }
                if (ng == XMH_TG)
                    xmh_half_q6k<true>(ca, cb, n, c, brow, ng, f);
                else
                    xmh_half_q6k<false>(ca, cb, n, c, brow, ng, f);
                ca = na;
                cb = nb;
            }
        } else { /* Q4_K, IQ4_XS: xmh_step of their words */
            if (ng == XMH_TG)
                xmh_step<true>(ca, cb, brow, ng, f);
            else
                xmh_step<false>(ca, cb, brow, ng, f);
            ca = na;
            cb = nb;
        }
        __syncthreads(); /* the slot is read before step b + XMH_STAGES lands in it */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int q = 0; q < XMH_TG; q++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int t = 8 * q + 2 * c + h;
            if (q < ng && t < tl.cnt) {
                const int p = tl.row0 + t, o = dst[p];
                const float s = scale[p];
                y[(size_t)o * rows + ra] = f[q][h] * s;
                y[(size_t)o * rows + ra + 8] = f[q][2 + h] * s;
            }
        }
    }
}

/* ---- host side ---- */

/* Q4_K from the GGUF blocks, Q6_K from the padded copy (cu_fast.cu),
 * whole 256-column blocks and 64-row tiles. */
bool mr_cu_xmh_takes(const mr_cu_ctx *c, const mr_weight *w)
{
    const bool t = (w->type == MR_TYPE_Q4_K && w->data) || (w->type == MR_TYPE_Q6_K && c->xmh6 && w->priv) ||
                   (w->type == MR_TYPE_IQ4_XS && c->xmh_iq4 && w->data);
    return c->xmh && t && w->cols % 256 == 0 && w->rows % 64 == 0 && w->rows <= (1 << 30);
}

void mr_cu_xmh_product(mr_cu_ctx *c, const mr_weight *w, const mr_weight *w2, const __half *X, const float *scale,
                       const int32_t *dst, const void *tiles, const int *n_tiles, int64_t max_tiles, float *y,
                       float *y2)
{
    static_assert(sizeof(xmh_tile) == 3 * sizeof(int), "the grouping's tile record");
    const bool q6 = w->type == MR_TYPE_Q6_K;
    const size_t rb = q6 ? mr_cu_fast_row_bytes(w) : w->row_bytes;
    const uint8_t *W = (const uint8_t *)(q6 ? w->priv : w->data);
    const uint8_t *W2 = w2 ? (const uint8_t *)(q6 ? w2->priv : w2->data) : nullptr;
    const dim3 grid((unsigned)(w->rows / 64), (unsigned)max_tiles, w2 ? 2 : 1);
#define XMH_ARGS(TT) grid, 128, xmh_smem<TT>(), W, rb * (size_t)w->rows, rb, (int)w->cols, (int)w->rows, X, scale, dst, \
                 (const xmh_tile *)tiles, n_tiles, y, W2, y2
    if (q6)
        mr_cu_launch(c, k_xmh<MR_TYPE_Q6_K>, XMH_ARGS(MR_TYPE_Q6_K));
    else if (w->type == MR_TYPE_IQ4_XS)
        mr_cu_launch(c, k_xmh<MR_TYPE_IQ4_XS>, XMH_ARGS(MR_TYPE_IQ4_XS));
    else
        mr_cu_launch(c, k_xmh<MR_TYPE_Q4_K>, XMH_ARGS(MR_TYPE_Q4_K));
#undef XMH_ARGS
    MR_CU_LAUNCHED(c, "xmh GEMM");
}

/* At backend creation, outside any capture: the ring's shared memory. */
bool mr_cu_xmh_init(mr_cu_ctx *c)
{
    const char *e = getenv("MEMRA_CUDA_XMH");
    c->xmh = !(e && !strcmp(e, "0"));
    c->xmh6 = !(e && !strcmp(e, "q4k"));
    const char *i4 = getenv("MEMRA_CUDA_XMH_IQ4");
    c->xmh_iq4 = !(i4 && !strcmp(i4, "0"));
    return cudaFuncSetAttribute(k_xmh<MR_TYPE_Q4_K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                xmh_smem<MR_TYPE_Q4_K>()) == cudaSuccess &&
           cudaFuncSetAttribute(k_xmh<MR_TYPE_Q6_K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                xmh_smem<MR_TYPE_Q6_K>()) == cudaSuccess &&
           cudaFuncSetAttribute(k_xmh<MR_TYPE_IQ4_XS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                xmh_smem<MR_TYPE_IQ4_XS>()) == cudaSuccess;
}

/* Bandwidth-tuned matvec for decode (1..8 tokens).
 *
 * Layout of the work: a warp owns R rows and walks them together in
 * "steps" of 256 columns; in a step each lane decodes 8 weights of every
 * row from one 4-byte (or 16-byte for BF16) load and multiplies them with
 * 8 activations it loaded once for all R rows (two float4 loads, lanes
 * reading consecutive 16-byte pieces, so the loads are coalesced).  Quants
 * become floats through the exponent trick (0x4B000000 | q is 2^23 + q as
 * a float, exactly), not through the slow int-to-float unit.  Everything
 * accumulates in float32 with float32 activations: same numbers as the
 * generic kernels up to summation order.
 *
 * At load the blocks are copied into a kernel layout (priv) holding the
 * same values: Q6_K/Q8_0/Q4_0 padded to a 4-byte stride (Q8_0/Q4_0 with
 * the quants moved to offset 4) so every load is aligned; Q4_K/Q5_K with
 * their packed 6-bit scales unpacked to bytes (+4 bytes a block) so a lane
 * fetches its two scales and mins with one load and no bit surgery.  The
 * GGUF copy stays for get_rows and the GEMM path. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_quant.cuh"

#define FW 4 /* warps per block */
#define FAST_EARLY 4 /* steps a warp of k_fast's EARLY form loads before the PDL wait */

/* Bytes per block in the kernel's layout (padded where needed). */
__host__ __device__ constexpr int fast_stride(int t)
{
    return t == MR_TYPE_Q4_K ? 148 : t == MR_TYPE_Q5_K ? 180 : t == MR_TYPE_Q6_K ? 212
         : t == MR_TYPE_Q8_0 ? 36 : t == MR_TYPE_Q4_0 ? 20 : t == MR_TYPE_IQ4_XS ? 136
         : t == MR_TYPE_BF16 ? 2 : t == MR_TYPE_F32 ? 4 : 0;
}
__host__ __device__ constexpr int fast_belems(int t)
{
    return (t == MR_TYPE_BF16 || t == MR_TYPE_F32) ? 1 : (t == MR_TYPE_Q8_0 || t == MR_TYPE_Q4_0) ? 32 : 256;
}
static bool fast_has(int t) { return fast_stride(t) != 0; }
static bool fast_padded(int t)
{
    return t == MR_TYPE_Q6_K || t == MR_TYPE_Q8_0 || t == MR_TYPE_Q4_0 || t == MR_TYPE_Q4_K ||
           t == MR_TYPE_Q5_K;
}

/* 2^23 + byte b of w (b = 0..3) as a float; subtract 8388608 to get the byte. */
__device__ __forceinline__ float mag(uint32_t w, int b)
{
    const uint32_t sel = (uint32_t)b | 0x7440u; /* byte b of w, two zero bytes, 0x4B */
    return __uint_as_float(__byte_perm(w, 0x4B000000u, sel));
}
#define MAGIC 8388608.0f

/* 0.5 + q/256 as a float, q = byte c of w (q < 128): one byte_perm, no
 * subtraction; the caller recovers sum q*x as 256*sum(f*x) - 128*sum(x),
 * which loses only a few bits (f stays in [0.5, 1)). */
__device__ __forceinline__ float hq(uint32_t w, int c)
{
    return __uint_as_float(__byte_perm(w, 0x3F800000u, 0x7044u | ((uint32_t)c << 8)));
}

/* Offsets (floats, inside the 256-column step) of the two runs of 4
 * activations lane `lane` multiplies. */
template <int T>
__device__ __forceinline__ void x_offsets(int lane, int *o1, int *o2)
{
    if constexpr (T == MR_TYPE_Q4_K || T == MR_TYPE_Q5_K) {
        int j = lane >> 3, l = 4 * (lane & 7);
        *o1 = 64 * j + l;
        *o2 = 64 * j + 32 + l;
    } else if constexpr (T == MR_TYPE_Q6_K) {
        int n = lane >> 4, qa = (lane >> 3) & 1, l = 4 * (lane & 7);
        *o1 = 128 * n + 32 * qa + l;
        *o2 = 128 * n + 32 * (qa + 2) + l;
    } else if constexpr (T == MR_TYPE_IQ4_XS || T == MR_TYPE_Q4_0) {
        int ib = lane >> 2, l = 4 * (lane & 3);
        *o1 = 32 * ib + l;
        *o2 = 32 * ib + 16 + l;
    } else { /* Q8_0, BF16, F32: 8 consecutive */
        *o1 = 8 * lane;
        *o2 = 8 * lane + 4;
    }
}

__device__ __forceinline__ float dot4(float4 x, float a, float b, float c, float d)
{
    return fmaf(x.x, a, fmaf(x.y, b, fmaf(x.z, c, x.w * d)));
}

/* An IQ4_XS step's words of one row that a lane reads (the block's header:
 * d, scales_h, scales_l; the lane's 4 quant bytes), apart from the math
 * (iq4_dot) so that k_fast's EARLY form can load them before the PDL
 * wait; step_dot runs the two back to back, so both sum alike. */
struct iq4_raw {
    uint2 hd;
    uint32_t q;
};

__device__ __forceinline__ iq4_raw iq4_load(const uint8_t *__restrict__ p, int lane)
{
    const int ib = lane >> 2, l = 4 * (lane & 3);
    iq4_raw r;
    r.hd = *(const uint2 *)p; /* the kernel layout's 136-byte blocks are 8-byte aligned */
    r.q = *(const uint32_t *)(p + 8 + 16 * ib + l);
    return r;
}

__device__ __forceinline__ float iq4_dot(const iq4_raw &r, int lane, float4 xa, float4 xb)
{
    const int ib = lane >> 2;
    const float d = __half2float(__ushort_as_half((uint16_t)(r.hd.x & 0xffff)));
    const uint32_t sh = r.hd.x >> 16;
    const uint32_t sl = (r.hd.y >> (8 * (ib / 2))) & 0xff;
    const int ls = ((sl >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
    /* code book values biased to bytes 1..241, floats by the exponent trick */
    const uint32_t lo = mr_iq4nl4(r.q & 0x0F0F0F0Fu) ^ 0x80808080u;
    const uint32_t hi = mr_iq4nl4((r.q >> 4) & 0x0F0F0F0Fu) ^ 0x80808080u;
    const float M = MAGIC + 128.0f;
    return d * (float)(ls - 32) *
           (dot4(xa, mag(lo, 0) - M, mag(lo, 1) - M, mag(lo, 2) - M, mag(lo, 3) - M) +
            dot4(xb, mag(hi, 0) - M, mag(hi, 1) - M, mag(hi, 2) - M, mag(hi, 3) - M));
}

/* Partial dot of this lane's 8 weights of one step of one row with xa, xb.
 * p points at the step's first byte in this row (kernel layout). */
template <int T>
__device__ __forceinline__ float step_dot(const uint8_t *__restrict__ p, int lane, float4 xa,
                                          float4 xb)
{
    if constexpr (T == MR_TYPE_Q4_K || T == MR_TYPE_Q5_K) {
        /* repacked block: d, dmin | per j: sc[2j] sc[2j+1] m[2j] m[2j+1] | (qh) | qs */
        const int j = lane >> 3, l = 4 * (lane & 7);
        const uint32_t dd = *(const uint32_t *)p;
        const uint32_t sm = *(const uint32_t *)(p + 4 + 4 * j);
        const uint32_t q = *(const uint32_t *)(p + (T == MR_TYPE_Q4_K ? 20 : 52) + 32 * j + l);
        uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
        if constexpr (T == MR_TYPE_Q5_K) {
            const uint32_t h = *(const uint32_t *)(p + 20 + l);
            lo |= ((h >> (2 * j)) & 0x01010101u) << 4;
            hi |= ((h >> (2 * j + 1)) & 0x01010101u) << 4;
        }
        const float d = __half2float(__ushort_as_half((uint16_t)(dd & 0xffff)));
        const float dm = __half2float(__ushort_as_half((uint16_t)(dd >> 16)));
        const float xs0 = xa.x + xa.y + xa.z + xa.w, xs1 = xb.x + xb.y + xb.z + xb.w;
        const float s0 = 256.0f * dot4(xa, hq(lo, 0), hq(lo, 1), hq(lo, 2), hq(lo, 3)) - 128.0f * xs0;
        const float s1 = 256.0f * dot4(xb, hq(hi, 0), hq(hi, 1), hq(hi, 2), hq(hi, 3)) - 128.0f * xs1;
        const float sc0 = mag(sm, 0) - MAGIC, sc1 = mag(sm, 1) - MAGIC;
        const float m0 = mag(sm, 2) - MAGIC, m1 = mag(sm, 3) - MAGIC;
        return d * (sc0 * s0 + sc1 * s1) - dm * (m0 * xs0 + m1 * xs1);
    } else if constexpr (T == MR_TYPE_Q6_K) {
        const int n = lane >> 4, qa = (lane >> 3) & 1, l = 4 * (lane & 7);
        const uint32_t ql = *(const uint32_t *)(p + 64 * n + 32 * qa + l);
        const uint32_t qh = *(const uint32_t *)(p + 128 + 32 * n + l);
        const uint32_t lo = (ql & 0x0F0F0F0Fu) | (((qh >> (2 * qa)) & 0x03030303u) << 4);
        const uint32_t hi = ((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * qa + 4)) & 0x03030303u) << 4);
        const int8_t *sc = (const int8_t *)(p + 192 + 8 * n);
        const int is = l >> 4;
        const float d = __half2float(*(const __half *)(p + 208));
        const float xs0 = xa.x + xa.y + xa.z + xa.w, xs1 = xb.x + xb.y + xb.z + xb.w;
        /* sum (q-32)*x = 256*sum(f*x) - 160*sum(x) */
        const float s0 = 256.0f * dot4(xa, hq(lo, 0), hq(lo, 1), hq(lo, 2), hq(lo, 3)) - 160.0f * xs0;
        const float s1 = 256.0f * dot4(xb, hq(hi, 0), hq(hi, 1), hq(hi, 2), hq(hi, 3)) - 160.0f * xs1;
        return d * ((float)sc[is + 2 * qa] * s0 + (float)sc[is + 2 * qa + 4] * s1);
    } else if constexpr (T == MR_TYPE_IQ4_XS) {
        return iq4_dot(iq4_load(p, lane), lane, xa, xb);
    } else if constexpr (T == MR_TYPE_Q4_0) {
        const int ib = lane >> 2, l = 4 * (lane & 3);
        const uint8_t *b = p + 20 * ib;
        const uint32_t q = *(const uint32_t *)(b + 4 + l); /* padded layout: qs at +4 */
        const float d = __half2float(*(const __half *)b);
        const uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
        const float xs = xa.x + xa.y + xa.z + xa.w + xb.x + xb.y + xb.z + xb.w;
        /* sum (q-8)*x = 256*sum(f*x) - 136*sum(x) */
        return d * (256.0f * (dot4(xa, hq(lo, 0), hq(lo, 1), hq(lo, 2), hq(lo, 3)) +
                              dot4(xb, hq(hi, 0), hq(hi, 1), hq(hi, 2), hq(hi, 3))) - 136.0f * xs);
    } else if constexpr (T == MR_TYPE_Q8_0) {
        const int ib = lane >> 2, l = 8 * (lane & 3);
        const uint8_t *b = p + 36 * ib;
        const float d = __half2float(*(const __half *)b);
        /* qs starts at +2: two 4-byte loads at +4+l-2 would be misaligned, so
         * the padded layout keeps qs at +4 (see repack) */
        const uint32_t q0 = *(const uint32_t *)(b + 4 + l) ^ 0x80808080u;
        const uint32_t q1 = *(const uint32_t *)(b + 8 + l) ^ 0x80808080u;
        const float M = MAGIC + 128.0f;
        return d * (dot4(xa, mag(q0, 0) - M, mag(q0, 1) - M, mag(q0, 2) - M, mag(q0, 3) - M) +
                    dot4(xb, mag(q1, 0) - M, mag(q1, 1) - M, mag(q1, 2) - M, mag(q1, 3) - M));
    } else if constexpr (T == MR_TYPE_F32) { /* 8 consecutive, two 16-byte loads */
        const float4 w0 = *(const float4 *)(p + 32 * lane), w1 = *(const float4 *)(p + 32 * lane + 16);
        return dot4(xa, w0.x, w0.y, w0.z, w0.w) + dot4(xb, w1.x, w1.y, w1.z, w1.w);
    } else { /* BF16: 8 consecutive, one 16-byte load */
        const uint4 w = *(const uint4 *)(p + 16 * lane);
        return dot4(xa, __uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                    __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u)) +
               dot4(xb, __uint_as_float(w.z << 16), __uint_as_float(w.z & 0xffff0000u),
                    __uint_as_float(w.w << 16), __uint_as_float(w.w & 0xffff0000u));
    }
}


/* A gate/up (SwiGLU) job, glu_out set: block blockIdx.x computes gate and
 * up rows r0 .. r0 + R/2 - 1, both, for job blockIdx.y; resolves the two
 * matrices, the input and the three outputs as mr_cu_mv_rows does for one
 * (NaN to the rows of a pair whose expert id is out of range: false). */
template <int R>
__device__ __forceinline__ bool glu_rows(const mr_cu_mvjob &a, int64_t *r0, const uint8_t **Wg, const uint8_t **Wu,
                                         const float **x, float **yg, float **yu, float **yo)
{
    *r0 = (int64_t)blockIdx.x * (R / 2);
    const int64_t rows = a.sub_rows[0];
    int64_t xo = 0, yoff = 0;
    size_t wo = 0;
    bool ok = true;
    if (a.ids) {
        const int job = blockIdx.y, t = job / a.k, j = job % a.k, e = a.ids[job];
        xo = ((int64_t)t * a.x_slots + (a.x_slots > 1 ? j : 0)) * a.cols;
        yoff = (int64_t)job * rows;
        ok = e >= 0 && e < a.n_mats;
        wo = ok ? (size_t)e * a.mat_bytes : 0;
    }
    *x = a.x + xo;
    *yg = a.sub_y[0] + yoff;
    *yu = a.sub_y[1] + yoff;
    *yo = a.glu_out + yoff;
    *Wg = a.sub_W[0] + wo;
    *Wu = a.sub_W[1] + wo;
    if (!ok && threadIdx.x < R / 2 && *r0 + threadIdx.x < rows) {
        const float nan = __int_as_float(0x7fc00000);
        (*yg)[*r0 + threadIdx.x] = nan;
        (*yu)[*r0 + threadIdx.x] = nan;
        (*yo)[*r0 + threadIdx.x] = nan;
    }
    return ok;
}

/* Where a block of a fast matvec reads its R rows and writes them.  GLU:
 * rows 0 .. R/2-1 are the gate's, R/2 .. R-1 the up's at the same
 * indices (glu_rows). */
struct mv_block {
    int64_t r0;
    const float *x;
    float *y, *yu, *yo;
};

template <int R, bool GLU>
__device__ __forceinline__ bool mv_block_rows(const mr_cu_mvjob &job, mr_cu_mvjob *a, mv_block *b,
                                              const uint8_t **rp, int po, unsigned blk = blockIdx.x)
{
    const uint8_t *W, *Wu = NULL;
    if constexpr (GLU) {
        *a = job;
        a->rows = job.sub_rows[0];
        if (!glu_rows<R>(job, &b->r0, &W, &Wu, &b->x, &b->y, &b->yu, &b->yo))
            return false;
    } else {
        *a = mr_cu_mv_sub<R>(job, blk, &b->r0);
        if (!mr_cu_mv_rows<R>(*a, b->r0, &W, &b->x, &b->y))
            return false;
    }
    constexpr int RR = GLU ? R / 2 : R;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int ri = i % RR;
        int64_t r = b->r0 + ri < a->rows ? b->r0 + ri : a->rows - 1; /* clamp; not stored */
        rp[i] = (GLU && i >= RR ? Wu : W) + r * a->row_bytes + po;
    }
    return true;
}

/* The block's sums out of the warps' partials part[FW][NT * R] (the FW
 * partials added in warp order from 0), written to y; GLU: to the gate's
 * and up's outputs and silu(gate) * up to yo (the gate's place when yo is
 * y, as the in-place swiglu leaves it). */
template <int R, int NT, bool GLU>
__device__ __forceinline__ void mv_block_store(float (*part)[NT * R], const mr_cu_mvjob &a, const mv_block &b)
{
    constexpr int RR = GLU ? R / 2 : R;
    if (threadIdx.x >= NT * RR)
        return;
    const int t = threadIdx.x / RR, i = threadIdx.x % RR;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < FW; w++) v += part[w][t * R + i];
    if (b.r0 + i >= a.rows)
        return;
    const int64_t o = (int64_t)t * a.rows + b.r0 + i;
    if constexpr (GLU) {
        float u = 0.0f;
#pragma unroll
        for (int w = 0; w < FW; w++) u += part[w][t * R + RR + i];
        b.yu[o] = u;
        if (b.yo != b.y) b.y[o] = v;
        b.yo[o] = mr_silu_mul(v, u);
    } else {
        b.y[o] = v;
    }
}

/* A block of FW warps owns R rows; warp w takes steps w, w+FW, ... of
 * those rows (split-K inside the block, so even a 1024-row matrix gives
 * thousands of warps with loads in flight), then the warps' partial sums
 * meet in shared memory.  grid.x: row groups, grid.y: jobs (experts).
 * GLU: R/2 rows of the gate and the same of the up (mv_block_rows); each
 * row's sums are formed as without it. */
template <int T, int R, int NT, bool GLU = false, bool EARLY = false>
__global__ void __launch_bounds__(FW * 32) k_fast(mr_cu_mvjob job)
{
    constexpr int E = FAST_EARLY;
    static_assert(!EARLY || (T == MR_TYPE_IQ4_XS && NT == 1 && !GLU), "early weights: one token's IQ4_XS rows");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int SB = fast_stride(T) * (256 / fast_belems(T)); /* bytes per 256-col step */
    mr_cu_mvjob a;
    mv_block b;
    const uint8_t *rp[R];
    /* EARLY (a plain product: no expert ids, so the rows are arithmetic on
     * the job alone): the warp's first E steps of weights are
     * loaded before griddepcontrol.wait, while the op before still runs
     * (no kernel of a step writes weights: cu_pdl.cuh's rule allows it),
     * then summed in the loop's order, so the bits are the same. */
    iq4_raw pre[EARLY ? E : 1][EARLY ? R : 1];
    int nsteps = 0;
    if constexpr (EARLY) {
        mv_block_rows<R, GLU>(job, &a, &b, rp, 0); /* cannot fail without ids */
        nsteps = (int)(a.cols / 256);
#pragma unroll
        for (int e = 0; e < E; e++)
            if (warp + FW * e < nsteps)
#pragma unroll
                for (int i = 0; i < R; i++) pre[e][i] = iq4_load(rp[i] + (size_t)(warp + FW * e) * SB, lane);
    }
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    if (!EARLY && !mv_block_rows<R, GLU>(job, &a, &b, rp, 0))
        return;
    const float *x = b.x;
    int o1, o2;
    x_offsets<T>(lane, &o1, &o2);
    nsteps = (int)(a.cols / 256);
    float acc[NT][R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[t][i] = 0.0f;
    int s0 = warp;
    if constexpr (EARLY) {
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int s = warp + FW * e;
            if (s < nsteps) {
                const float4 xa = __ldg((const float4 *)(x + 256 * s + o1));
                const float4 xb = __ldg((const float4 *)(x + 256 * s + o2));
#pragma unroll
                for (int i = 0; i < R; i++) acc[0][i] += iq4_dot(pre[e][i], lane, xa, xb);
            }
        }
        s0 = warp + FW * E;
    }
#pragma unroll 4
    for (int s = s0; s < nsteps; s += FW) {
        float4 xa[NT], xb[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xs = x + (int64_t)t * a.cols + 256 * s;
            xa[t] = __ldg((const float4 *)(xs + o1));
            xb[t] = __ldg((const float4 *)(xs + o2));
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint8_t *p = rp[i] + (size_t)s * SB;
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t][i] += step_dot<T>(p, lane, xa[t], xb[t]);
        }
    }
    __shared__ float part[FW][NT * R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) {
            float v = mr_warp_sum(acc[t][i]);
            if (lane == 0) part[warp][t * R + i] = v;
        }
    __syncthreads();
    mv_block_store<R, NT, GLU>(part, a, b);
}

/* A lane's 16 weights of one row's Q4_K wide step (p: the row's repacked
 * 296-byte pair of blocks of that step; j, k: the lane's group and quad):
 * the low nibbles l0, l1 and high ones h0, h1, the block's d, dm and the
 * two sub-blocks' scales and mins. */
struct wide_w {
    uint32_t l0, l1, h0, h1;
    float d, dm, sc0, sc1, m0, m1;
};

/* The four words those come from, as loaded: what a kernel keeps in
 * registers while the loads are in flight (4 registers, not 10). */
struct wide_raw {
    uint32_t dd, sm, q0, q1;
};

__device__ __forceinline__ wide_raw wide_fetch(const uint8_t *p, int j, int k)
{
    wide_raw r;
    r.dd = *(const uint32_t *)p;
    r.sm = *(const uint32_t *)(p + 4 + 4 * j);
    r.q0 = *(const uint32_t *)(p + 20 + 32 * j + 4 * k);
    r.q1 = *(const uint32_t *)(p + 20 + 32 * j + 16 + 4 * k);
    return r;
}

__device__ __forceinline__ wide_w wide_decode(const wide_raw &r)
{
    wide_w w;
    const uint32_t dd = r.dd, sm = r.sm, q0 = r.q0, q1 = r.q1;
    w.l0 = q0 & 0x0F0F0F0Fu, w.h0 = (q0 >> 4) & 0x0F0F0F0Fu;
    w.l1 = q1 & 0x0F0F0F0Fu, w.h1 = (q1 >> 4) & 0x0F0F0F0Fu;
    w.d = __half2float(__ushort_as_half((uint16_t)(dd & 0xffff)));
    w.dm = __half2float(__ushort_as_half((uint16_t)(dd >> 16)));
    w.sc0 = mag(sm, 0) - MAGIC, w.sc1 = mag(sm, 1) - MAGIC;
    w.m0 = mag(sm, 2) - MAGIC, w.m1 = mag(sm, 3) - MAGIC;
    return w;
}

__device__ __forceinline__ wide_w wide_load(const uint8_t *p, int j, int k)
{
    return wide_decode(wide_fetch(p, j, k));
}

/* One token's share of a Q4_K wide step: its 16 inputs (a0, a1 against
 * the low nibbles; b0, b1 against the high ones) and their sums xs0, xs1
 * with the row's weights w.  Every instance calls this for every token and
 * step, so a token's sums are formed alike whatever NT. */
__device__ __forceinline__ float wide_tok(const float4 &a0, const float4 &a1, const float4 &b0, const float4 &b1,
                                          float xs0, float xs1, const wide_w &w)
{
    const float f0 = dot4(a0, hq(w.l0, 0), hq(w.l0, 1), hq(w.l0, 2), hq(w.l0, 3)) +
                     dot4(a1, hq(w.l1, 0), hq(w.l1, 1), hq(w.l1, 2), hq(w.l1, 3));
    const float f1 = dot4(b0, hq(w.h0, 0), hq(w.h0, 1), hq(w.h0, 2), hq(w.h0, 3)) +
                     dot4(b1, hq(w.h1, 0), hq(w.h1, 1), hq(w.h1, 2), hq(w.h1, 3));
    const float s0 = 256.0f * f0 - 128.0f * xs0, s1 = 256.0f * f1 - 128.0f * xs1;
    return w.d * (w.sc0 * s0 + w.sc1 * s1) - w.dm * (w.m0 * xs0 + w.m1 * xs1);
}

/* A token's 16 inputs of a wide step and their two 8-column sums. */
__device__ __forceinline__ void wide_x(const float *xs, float4 &a0, float4 &a1, float4 &b0, float4 &b1, float &xs0,
                                       float &xs1)
{
    a0 = __ldg((const float4 *)xs);
    a1 = __ldg((const float4 *)(xs + 16));
    b0 = __ldg((const float4 *)(xs + 32));
    b1 = __ldg((const float4 *)(xs + 48));
    xs0 = (a0.x + a0.y) + (a0.z + a0.w) + (a1.x + a1.y) + (a1.z + a1.w);
    xs1 = (b0.x + b0.y) + (b0.z + b0.w) + (b1.x + b1.y) + (b1.z + b1.w);
}

/* The inputs of tokens t0 .. t0 + TG - 1 of a wide step (xs: token t0's
 * inputs of the step; a token's row is cols further). */
template <int TG>
__device__ __forceinline__ void wide_xg(const float *xs, int64_t cols, int t0, float4 (&a0)[TG], float4 (&a1)[TG],
                                        float4 (&b0)[TG], float4 (&b1)[TG], float (&xs0)[TG], float (&xs1)[TG])
{
#pragma unroll
    for (int t = 0; t < TG; t++)
        wide_x(xs + (int64_t)(t0 + t) * cols, a0[t], a1[t], b0[t], b1[t], xs0[t], xs1[t]);
}

/* Q4_K, 512 columns a step: each lane takes 16 weights of one 64-column
 * group (two 4-byte loads, quads 4k and 16+4k of both nibble halves) so
 * the scale/min work is paid once per 16 weights, not per 8.  NT tokens
 * (1, 2, 4 or 8) share each weight load; a token's sums are formed exactly
 * as with NT = 1 (its own accumulators, the same steps in the same order,
 * the same reductions), so a row's result does not depend on how many
 * tokens share the launch (kernel-check's batch-invariance lines).  Up to
 * 4 tokens the inputs of all of them are loaded first and shared by the R
 * rows; 8 tokens (one row) take their inputs four at a time, after the
 * row's weights, so that the registers hold one group. */
template <int R, int NT, bool GLU = false, bool EARLY = false>
__global__ void __launch_bounds__(FW * 32) k_q4k_wide(mr_cu_mvjob job)
{
    static_assert(NT <= 4 || R <= 2 || (R == 4 && NT == 8), "8 or 16 tokens a launch: at most two rows a block, or "
                                                               "four at 8 tokens");
    static_assert(!EARLY || NT == 1, "early weight loads: one token");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int blk = lane >> 4, j = (lane >> 2) & 3, k = lane & 3;
    const int xo = 256 * blk + 64 * j + 4 * k;
    const int po = 148 * blk; /* block inside the step */
    mr_cu_mvjob a;
    mv_block b;
    const uint8_t *rp[R];
    /* EARLY (a plain product: its rows do not come from expert ids): the
     * warp's first step of weights is loaded before griddepcontrol.wait,
     * while the op before still runs.  The weights are not written by any
     * kernel of the step, so cu_pdl.cuh's rule allows it; the row pointers
     * are arithmetic on the job alone.  The step is then summed first, as
     * the loop below would sum it, so the bits are the same. */
    const bool early = EARLY && !job.ids;
    wide_w w0[EARLY ? R : 1];
    if (early) {
        mv_block_rows<R, GLU>(job, &a, &b, rp, po); /* cannot fail without ids */
        if (warp < (int)(a.cols / 512)) {
#pragma unroll
            for (int i = 0; i < (EARLY ? R : 1); i++) w0[i] = wide_load(rp[i] + (size_t)warp * 296, j, k);
        }
    }
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    if (!early && !mv_block_rows<R, GLU>(job, &a, &b, rp, po))
        return;
    const float *x = b.x;
    const int nsteps = (int)(a.cols / 512);
    /* tokens whose inputs are in registers at once (two where four rows'
     * weights are held with them: 254 registers, no spills) */
    constexpr int TG = NT < 4 ? NT : NT > 4 && R == 4 ? 2 : 4;
    float acc[NT][R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[t][i] = 0.0f;
    int s0 = warp;
    if constexpr (EARLY) {
        if (early && s0 < nsteps) {
            float4 a0[1], a1[1], b0[1], b1[1];
            float xs0[1], xs1[1];
            wide_xg<1>(x + 512 * s0 + xo, a.cols, 0, a0, a1, b0, b1, xs0, xs1);
#pragma unroll
            for (int i = 0; i < R; i++) acc[0][i] += wide_tok(a0[0], a1[0], b0[0], b1[0], xs0[0], xs1[0], w0[i]);
            s0 += FW;
        }
    }
#pragma unroll 2
    for (int s = s0; s < nsteps; s += FW) {
        float4 a0[TG], a1[TG], b0[TG], b1[TG];
        float xs0[TG], xs1[TG];
        if constexpr (NT > 4 && R > 1) {
            /* two rows, eight tokens: both rows' weights of the step decoded
             * first, then each group of four tokens' inputs loaded once for
             * both (half the input loads of one row a block); a (row,
             * token) adds the same wide_tok a step as in every instance */
            wide_w w[R];
#pragma unroll
            for (int i = 0; i < R; i++)
                w[i] = wide_load(rp[i] + (size_t)s * 296, j, k);
#pragma unroll
            for (int t0 = 0; t0 < NT; t0 += TG) {
                wide_xg<TG>(x + 512 * s + xo, a.cols, t0, a0, a1, b0, b1, xs0, xs1);
#pragma unroll
                for (int t = 0; t < TG; t++)
#pragma unroll
                    for (int i = 0; i < R; i++)
                        acc[t0 + t][i] += wide_tok(a0[t], a1[t], b0[t], b1[t], xs0[t], xs1[t], w[i]);
            }
        } else {
            if constexpr (NT <= 4)
                wide_xg<TG>(x + 512 * s + xo, a.cols, 0, a0, a1, b0, b1, xs0, xs1);
#pragma unroll
            for (int i = 0; i < R; i++) {
                const wide_w w = wide_load(rp[i] + (size_t)s * 296, j, k);
#pragma unroll
                for (int t0 = 0; t0 < NT; t0 += TG) {
                    if constexpr (NT > 4)
                        wide_xg<TG>(x + 512 * s + xo, a.cols, t0, a0, a1, b0, b1, xs0, xs1);
#pragma unroll
                    for (int t = 0; t < TG; t++)
                        acc[t0 + t][i] += wide_tok(a0[t], a1[t], b0[t], b1[t], xs0[t], xs1[t], w);
                }
            }
        }
    }
    __shared__ float part[FW][NT * R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float v = mr_warp_sum(acc[t][i]);
            if (lane == 0) part[warp][t * R + i] = v;
        }
    __syncthreads();
    mv_block_store<R, NT, GLU>(part, a, b);
}

/* One token's plain Q4_K product as k_q4k_wide<R, 1, false, EARLY> with
 * a grid of at most one wave: block b takes the blocks of rows b, b + G,
 * b + 2G, ... (G = gridDim.x) of that kernel's grid (nvb of them).  A
 * grid above one wave costs a second latency chain a block (section 61 of
 * docs/GPU-NOTES.md); looping, the block asks for its next rows' first
 * weights before the sums of the rows it has (the raw words, 4 registers
 * a row), so their trip overlaps the reduction and the store.  A row's
 * sums are formed as in k_q4k_wide (the same steps in the same order from
 * 0, the same warp sum, the FW partials in warp order), so the same bits
 * at every grid. */
template <int R>
__global__ void __launch_bounds__(FW * 32, R <= 2 ? 8 : R == 4 ? 5 : 2) k_q4k_loop(mr_cu_mvjob job, unsigned nvb)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int blk = lane >> 4, j = (lane >> 2) & 3, k = lane & 3;
    const int xo = 256 * blk + 64 * j + 4 * k;
    const int po = 148 * blk;
    const int nsteps = (int)(job.cols / 512);
    const bool first = warp < nsteps; /* the warp's first step, s = warp */
    unsigned vb = blockIdx.x;
    mr_cu_mvjob a;
    mv_block b;
    const uint8_t *rp[R];
    wide_raw wr[R];
    mv_block_rows<R, false>(job, &a, &b, rp, po, vb); /* plain: cannot fail */
    if (first) {
#pragma unroll
        for (int i = 0; i < R; i++) wr[i] = wide_fetch(rp[i] + (size_t)warp * 296, j, k);
    }
    mr_pdl_wait(); /* cu_pdl.cuh; the weights are no kernel's output */
    mr_pdl_trigger();
    __shared__ float part[2][FW][R]; /* two: a fast warp's next partials never meet this store's reads */
    for (int it = 0; vb < nvb; vb += gridDim.x, it ^= 1) {
        float acc[R];
#pragma unroll
        for (int i = 0; i < R; i++) acc[i] = 0.0f;
        const float *x = b.x;
        if (first) {
            float4 a0, a1, b0, b1;
            float xs0, xs1;
            wide_x(x + 512 * warp + xo, a0, a1, b0, b1, xs0, xs1);
#pragma unroll
            for (int i = 0; i < R; i++) acc[i] += wide_tok(a0, a1, b0, b1, xs0, xs1, wide_decode(wr[i]));
        }
#pragma unroll 2
        for (int s = warp + FW; s < nsteps; s += FW) {
            float4 a0, a1, b0, b1;
            float xs0, xs1;
            wide_x(x + 512 * s + xo, a0, a1, b0, b1, xs0, xs1);
#pragma unroll
            for (int i = 0; i < R; i++)
                acc[i] += wide_tok(a0, a1, b0, b1, xs0, xs1, wide_load(rp[i] + (size_t)s * 296, j, k));
        }
        /* the next rows' first weights, in flight during the sums below */
        const mr_cu_mvjob a_here = a;
        const mv_block b_here = b;
        if (vb + gridDim.x < nvb) {
            mv_block_rows<R, false>(job, &a, &b, rp, po, vb + gridDim.x);
            if (first) {
#pragma unroll
                for (int i = 0; i < R; i++) wr[i] = wide_fetch(rp[i] + (size_t)warp * 296, j, k);
            }
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float v = mr_warp_sum(acc[i]);
            if (lane == 0) part[it][warp][i] = v;
        }
        __syncthreads();
        mv_block_store<R, 1, false>(part[it], a_here, b_here);
    }
}

/* ---- decode batches of experts, grouped by expert ----
 *
 * matmul_id for 2..64 tokens.  The per-pair path runs one job per (token,
 * expert) pair: an expert chosen by c tokens is read c times, and each
 * block moves a few KB behind two dependent memory round trips.  Here a
 * grouping kernel lists the used experts and each one's pairs (on the
 * device, so the launch does not depend on the ids and can live in a
 * graph), and the product kernel gives each used expert one grid row
 * (slot).  A block copies a slab of RS rows of its expert into shared
 * memory with asynchronous copies (the whole slab in flight at once), then
 * walks the expert's pairs in chunks of up to NT tokens, each chunk over
 * the slab R rows at a time.
 *
 * Exactness: a pair's output value is computed as in k_fast<T,R,1> of the
 * per-pair path: the same step_dot per lane on the same bytes and steps
 * (warp w takes steps w, w+FW, ... in increasing order), the same running
 * float sum per lane starting from 0, the same warp_sum, the same sum of
 * the FW partials in warp order starting from 0.  Tokens never mix (each
 * has its own accumulators), and R, RS, NT and whether the bytes come from
 * shared or global memory only decide which work shares a block, so the
 * grouped results are bitwise equal to the per-pair fast path wherever
 * that path takes k_fast (not the Q4_K 16-weight lanes, which sum in
 * another order).  kernel-check compares the two bit for bit. */

#include <cuda_pipeline_primitives.h>

#define GRP_THREADS 256 /* the grouping kernel's single block */
/* Limits of the grouped path (shared memory of the grouping kernel); larger
 * calls take the per-pair path. */
#define GRP_MAX_PAIRS 4096
#define GRP_MAX_MATS 4096
#define GRP_SLAB_MAX 16384 /* bytes of weights a block stages */
#define GRP_MAX_RS 128     /* rows a slab */
#define GRP_PL 64          /* pair indices a block keeps in shared memory at a time */
#define GRP_NT_MAX 4       /* pairs a chunk at most */
#define GRP_X_MAX 32768    /* bytes of staged input rows a block at most */

/* Scratch layout (int32), S = min(pairs, n_mats) slots:
 *   [0]                  U, the number of used experts (slots 0..U-1)
 *   [1, 1+S)             slot -> expert, ascending
 *   [1+S, 2+2S)          slot -> first index of its pairs in the list; [1+S+U] = listed pairs
 *   [2+2S, 2+2S+P)       the list: pair indices p = t*k + j, grouped by slot
 *   [mr_cu_grp_items_at(S, P), + 4P)  where asked for (xmm's items): per chunk
 *                        of at most two pairs of one expert, int4 {expert, pair,
 *                        second pair or -1, 0}, then {-1, -1, -1, 0} up to P */
static size_t grp_ints(int pairs, int64_t n_mats)
{
    const int64_t S = pairs < n_mats ? pairs : n_mats;
    return (size_t)mr_cu_grp_items_at((int)S, pairs) + 4 * (size_t)pairs;
}

/* One block.  Pairs whose expert id is out of range are not listed; their
 * output rows get NaN here (the per-pair path's rule, mr_cu_mv_rows).  The
 * order of a slot's pairs in the list is not fixed (atomics); no result
 * depends on it, since every pair is summed on its own. */
__global__ void __launch_bounds__(GRP_THREADS)
k_moe_group(const int32_t *__restrict__ ids, int P, int n_mats, int S, int64_t rows, float *y, float *y2,
            float *yo, int32_t *grp, int4 *items)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ int grp_sh[]; /* cnt[n_mats], pos[n_mats] */
    int *cnt = grp_sh, *pos = grp_sh + n_mats;
    __shared__ int wsum[GRP_THREADS / 32][3];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < n_mats; e += GRP_THREADS) cnt[e] = 0;
    if (items) /* the entries past the last chunk; the chunks' own after the last barrier */
        for (int p = tid; p < P; p += GRP_THREADS) items[p] = make_int4(-1, -1, -1, 0);
    __syncthreads();
    for (int p = tid; p < P; p += GRP_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < n_mats)
            atomicAdd(&cnt[e], 1);
    }
    for (int p = warp; p < P; p += GRP_THREADS / 32) { /* a warp a bad pair's row */
        const int e = ids[p];
        if (e < 0 || e >= n_mats)
            for (int64_t r = lane; r < rows; r += 32) {
                const float nan = __int_as_float(0x7fc00000);
                y[(int64_t)p * rows + r] = nan;
                if (y2) y2[(int64_t)p * rows + r] = nan;
                if (yo) yo[(int64_t)p * rows + r] = mr_silu_mul(nan, nan); /* after y: yo may be y */
            }
    }
    __syncthreads();
    /* thread tid owns experts [e0, e1): its used experts and pairs, then an
     * exclusive scan over the block gives its first slot and list index */
    const int per = (n_mats + GRP_THREADS - 1) / GRP_THREADS;
    const int e0 = min(tid * per, n_mats), e1 = min(e0 + per, n_mats);
    int nu = 0, np = 0, nc = 0; /* used experts, pairs, chunks of two */
    for (int e = e0; e < e1; e++) {
        nu += cnt[e] > 0;
        np += cnt[e];
        nc += (cnt[e] + 1) / 2;
    }
    int su = nu, sp = np, sc = nc, unused = 0;
    mr_warp_scan2(&su, &sp);
    mr_warp_scan2(&sc, &unused);
    if (lane == 31) {
        wsum[warp][0] = su;
        wsum[warp][1] = sp;
        wsum[warp][2] = sc;
    }
    __syncthreads();
    int slot = su - nu, off = sp - np, chunk = sc - nc;
    for (int w = 0; w < warp; w++) {
        slot += wsum[w][0];
        off += wsum[w][1];
        chunk += wsum[w][2];
    }
    const int off0 = off;
    int32_t *slot_e = grp + 1, *slot_off = grp + 1 + S, *list = grp + 2 + 2 * S;
    for (int e = e0; e < e1; e++) {
        pos[e] = off;
        if (cnt[e]) {
            slot_e[slot] = e;
            slot_off[slot] = off;
            slot++;
            off += cnt[e];
        }
    }
    if (tid == GRP_THREADS - 1) { /* the last thread ends with the totals */
        grp[0] = slot;
        slot_off[slot] = off;
    }
    __syncthreads();
    for (int p = tid; p < P; p += GRP_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < n_mats)
            list[atomicAdd(&pos[e], 1)] = p;
    }
    if (!items)
        return;
    __syncthreads(); /* the list is whole */
    for (int e = e0, o = off0; e < e1; o += cnt[e], e++)
        for (int q = 0; q < cnt[e]; q += 2)
            items[chunk++] = make_int4(e, list[o + q], q + 1 < cnt[e] ? list[o + q + 1] : -1, 0);
}

/* One chunk of m <= M pairs over the nr staged rows of the slab (rows
 * r0.., row_bytes apart), R rows at a time; x[t] is token t's input row
 * (staged in shared memory or in global memory).  Tokens past m are skipped
 * (m is the same for the whole block, so those are uniform branches).
 * Warp w computes its partial of each row exactly as k_fast does and
 * leaves it in part[(w*M + t)*RS + row]; the block then adds the FW
 * partials of each output in warp order and stores them. */
template <int T, int R, int M>
__device__ __forceinline__ void grp_chunk(const mr_cu_mvjob &a, const uint8_t *slab, int nr, int RS,
                                          int64_t r0, const float *const (&x)[GRP_NT_MAX],
                                          const int32_t *pairs, int m, float *part)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int SB = fast_stride(T) * (256 / fast_belems(T)); /* bytes per 256-col step */
    const size_t rb = a.row_bytes;
    int o1, o2;
    x_offsets<T>(lane, &o1, &o2);
    const int nsteps = (int)(a.cols / 256);
    const int ng = (nr + R - 1) / R;
    for (int g = 0; g < ng; g++) {
        float acc[M][R];
#pragma unroll
        for (int t = 0; t < M; t++)
#pragma unroll
            for (int i = 0; i < R; i++) acc[t][i] = 0.0f;
#pragma unroll 1
        for (int s = warp; s < nsteps; s += FW) {
            float4 xa[M], xb[M];
#pragma unroll
            for (int t = 0; t < M; t++)
                if (t == 0 || t < m) {
                    const float *xs = x[t] + 256 * s;
                    xa[t] = *(const float4 *)(xs + o1);
                    xb[t] = *(const float4 *)(xs + o2);
                }
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int row = g * R + i < nr ? g * R + i : nr - 1; /* clamp; not stored */
                const uint8_t *p = slab + row * rb + (size_t)s * SB;
#pragma unroll
                for (int t = 0; t < M; t++)
                    if (t == 0 || t < m) acc[t][i] += step_dot<T>(p, lane, xa[t], xb[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < M; t++)
            if (t == 0 || t < m)
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const float v = mr_warp_sum(acc[t][i]);
                    if (lane == 0 && g * R + i < nr) part[(warp * M + t) * RS + g * R + i] = v;
                }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < m * nr; idx += FW * 32) {
        const int t = idx / nr, row = idx - t * nr;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < FW; w++) v += part[(w * M + t) * RS + row];
        a.y[(int64_t)pairs[t] * a.rows + r0 + row] = v;
    }
    __syncthreads(); /* part, the staged inputs and the pair window are reused */
}

/* Shared memory of k_fast_grouped: the slab, the staged input rows (NT of
 * them, when xstage), the partials, the pair window. */
__host__ __device__ static inline size_t grp_slab_bytes(int RS, size_t row_bytes)
{
    return ((size_t)RS * row_bytes + 15) & ~(size_t)15;
}
static size_t grp_smem(int RS, size_t row_bytes, int64_t cols, int NT, bool xstage)
{
    return grp_slab_bytes(RS, row_bytes) + (xstage ? (size_t)NT * cols * sizeof(float) : 0) +
           (size_t)FW * NT * RS * sizeof(float) + GRP_PL * sizeof(int32_t);
}

/* Asynchronous copy of `bytes` (a multiple of 4) from global to shared
 * memory by the whole block: 16-byte pieces when both ends allow. */
__device__ __forceinline__ void grp_copy(uint8_t *dst, const uint8_t *src, size_t bytes)
{
    if ((((uintptr_t)src | (uintptr_t)dst | bytes) & 15) == 0) {
        for (size_t i = threadIdx.x; i < bytes / 16; i += FW * 32)
            __pipeline_memcpy_async(dst + 16 * i, src + 16 * i, 16);
    } else {
        for (size_t i = threadIdx.x; i < bytes / 4; i += FW * 32)
            __pipeline_memcpy_async(dst + 4 * i, src + 4 * i, 4);
    }
}

/* grid.x: slabs of RS rows, grid.y: slots (used experts; the others exit
 * at once).  a.ids is unused: the slots come from grp.  xstage: each
 * chunk's input rows are copied to shared memory too (read once per block
 * instead of once per row group). */
template <int T, int R, int NT>
__global__ void __launch_bounds__(FW * 32) k_fast_grouped(mr_cu_mvjob a, const int32_t *__restrict__ grp,
                                                          int S, int RS, int xstage)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ uint4 grp_smem_[];
    const int slot = blockIdx.y;
    const int used = grp[0], e = grp[1 + slot]; /* slot < S: inside the scratch even when unused */
    const int beg = grp[1 + S + slot], end = grp[2 + S + slot];
    if (slot >= used)
        return;
    const int cnt = end - beg;
    const int32_t *list = grp + 2 + 2 * S + beg;
    const int64_t r0 = (int64_t)blockIdx.x * RS;
    const int nr = a.rows - r0 < RS ? (int)(a.rows - r0) : RS;
    uint8_t *slab = (uint8_t *)grp_smem_;
    float *xsh = (float *)(slab + grp_slab_bytes(RS, a.row_bytes));
    float *part = xsh + (xstage ? NT * a.cols : 0);
    int32_t *pl = (int32_t *)(part + FW * NT * RS);
    grp_copy(slab, a.W + (size_t)e * a.mat_bytes + (size_t)r0 * a.row_bytes, (size_t)nr * a.row_bytes);
    for (int c0 = 0; c0 < cnt; c0 += NT) {
        if (c0 % GRP_PL == 0) { /* the next window of pair indices */
            for (int i = threadIdx.x; i < GRP_PL && c0 + i < cnt; i += FW * 32) pl[i] = list[c0 + i];
            __syncthreads();
        }
        const int m = cnt - c0 < NT ? cnt - c0 : NT;
        const int32_t *pairs = pl + c0 % GRP_PL;
        const float *x[GRP_NT_MAX];
#pragma unroll
        for (int t = 0; t < GRP_NT_MAX; t++) {
            const int p = pairs[t < m ? t : 0];
            const int tok = p / a.k, j = p - tok * a.k;
            x[t] = a.x + ((int64_t)tok * a.x_slots + (a.x_slots > 1 ? j : 0)) * a.cols;
            if (xstage && t < m) {
                grp_copy((uint8_t *)(xsh + t * a.cols), (const uint8_t *)x[t], (size_t)a.cols * sizeof(float));
                x[t] = xsh + t * a.cols;
            }
        }
        __pipeline_commit();
        __pipeline_wait_prior(0); /* the slab (first chunk) and this chunk's inputs */
        __syncthreads();
        /* one and two pairs (the common counts) get their exact width */
        if (m == 1)
            grp_chunk<T, R, 1>(a, slab, nr, RS, r0, x, pairs, 1, part);
        else if (NT == 2 || m == 2)
            grp_chunk<T, R, 2>(a, slab, nr, RS, r0, x, pairs, 2, part);
        else
            grp_chunk<T, R, NT>(a, slab, nr, RS, r0, x, pairs, m, part);
    }
}

/* ---- repack at load ---- */

/* Same bytes, block stride padded to a multiple of 4.  Q8_0 and Q4_0 move
 * their qs to offset 4 so they are 4-byte aligned (d stays at 0). */
__global__ void k_pad_blocks(const uint8_t *src, uint8_t *dst, size_t nblocks, int sb, int db,
                             int type)
{
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks)
        return;
    const uint8_t *s = src + b * sb;
    uint8_t *d = dst + b * db;
    if (type == MR_TYPE_Q4_K || type == MR_TYPE_Q5_K) {
        /* 6-bit scales/mins unpacked to one byte each, grouped per 64
         * columns: [sc 2j, sc 2j+1, m 2j, m 2j+1]; d, dmin, qh, qs as is */
        for (int i = 0; i < 4; i++) d[i] = s[i];
        for (int j = 0; j < 4; j++) {
            int sc0, m0, sc1, m1;
            mr_k4_scale_min(2 * j, s + 4, &sc0, &m0);
            mr_k4_scale_min(2 * j + 1, s + 4, &sc1, &m1);
            d[4 + 4 * j] = (uint8_t)sc0;
            d[5 + 4 * j] = (uint8_t)sc1;
            d[6 + 4 * j] = (uint8_t)m0;
            d[7 + 4 * j] = (uint8_t)m1;
        }
        for (int i = 16; i < sb; i++) d[4 + i] = s[i];
    } else if (type == MR_TYPE_Q8_0 || type == MR_TYPE_Q4_0) {
        d[0] = s[0];
        d[1] = s[1];
        d[2] = d[3] = 0;
        for (int i = 2; i < sb; i++) d[2 + i] = s[i];
    } else {
        for (int i = 0; i < sb; i++) d[i] = s[i];
        for (int i = sb; i < db; i++) d[i] = 0;
    }
}

int mr_cu_weight_prepare(mr_backend *be, mr_weight *w, mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    w->priv = NULL;
    if (!fast_padded(w->type) || w->cols % 256)
        return 0;
    const mr_type_info *ti = mr_type_get(w->type);
    size_t nb = (size_t)(w->cols / ti->block_elems) * (size_t)w->rows * (size_t)w->n_mats;
    int db = fast_stride(w->type);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, nb * db);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mr_errf(err, "cuda: weight %s: repack buffer of %zu bytes: %s",
                       w->name ? w->name : "?", nb * db, cudaGetErrorString(e));
    }
    k_pad_blocks<<<mr_cu_blocks(nb, 256), 256, 0, c->stream>>>((const uint8_t *)w->data,
                                                                (uint8_t *)p, nb, (int)ti->block_bytes, db, w->type);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return mr_errf(err, "cuda: weight %s: repack: %s", w->name ? w->name : "?", cudaGetErrorString(e));
    }
    w->priv = p;
    return 0;
}

void mr_cu_weight_free_priv(mr_backend *be, mr_weight *w)
{
    if (w->priv)
        cudaFree(w->priv);
    w->priv = NULL;
}

/* ---- dispatch ---- */

/* Rows of all the matrices of a launch. */
static int64_t job_rows(const mr_cu_mvjob &a)
{
    if (a.n_sub <= 1)
        return a.rows;
    int64_t r = 0;
    for (int s = 0; s < a.n_sub; s++) r += a.sub_rows[s];
    return r;
}

/* grid.x of a launch of R rows a block; for a multi-matrix launch, sets
 * where each matrix's run of blocks starts. */
static unsigned job_blocks(mr_cu_mvjob *a, int R)
{
    if (a->n_sub <= 1)
        return (unsigned)((a->rows + R - 1) / R);
    unsigned b = 0;
    for (int s = 0; s < a->n_sub; s++) {
        a->sub_blk[s] = b;
        b += (unsigned)((a->sub_rows[s] + R - 1) / R);
    }
    return b;
}

/* Whether a one-token product of type T on k_fast takes the EARLY form:
 * IQ4_XS (the type with a split load, iq4_load), no expert ids, more than
 * two steps a warp (rows of more than 2,048 columns), not turned off
 * (MEMRA_CUDA_EARLY_IQ4XS=0).  Run 263 (H100, bench-kernels mv, us, early
 * / not, same rows a block): 2,048 x 4,096 (the 35B-A3B's out-projections)
 * 5.10 / 5.93, but 512 x 2,048 4.15 / 2.82 and 2,048 x 512 4.10 / 3.54:
 * where a warp's steps are few, what the early loads hide is less than
 * what they cost. */
template <int T> static bool fast_early(const mr_cu_ctx *c, const mr_cu_mvjob &a)
{
    return T == MR_TYPE_IQ4_XS && c->early_iq4 && !a.ids && a.cols / 256 > 2 * FW;
}

template <int T, int R, int NT>
static void launch_fast_r(mr_cu_ctx *c, mr_cu_mvjob a, int jobs)
{
    dim3 grid(job_blocks(&a, R), jobs);
    if constexpr (T == MR_TYPE_IQ4_XS && NT == 1) {
        if (fast_early<T>(c, a)) {
            mr_cu_launch(c, k_fast<T, R, 1, false, true>, grid, FW * 32, 0, a);
            MR_CU_LAUNCHED(c, "fast matvec (early weights)");
            return;
        }
    }
    mr_cu_launch(c, k_fast<T, R, NT>, grid, FW * 32, 0, a);
    MR_CU_LAUNCHED(c, "fast matvec");
}

/* Whether a plain Q4_K job goes to the 16-weight-lane kernel
 * (k_q4k_wide): whole 512-column steps, not turned off
 * (MEMRA_CUDA_Q4K_WIDE=0), no expert ids (see launch_fast). */
template <int T> static bool q4k_wide_takes(const mr_cu_ctx *c, const mr_cu_mvjob &a)
{
    return T == MR_TYPE_Q4_K && a.cols % 512 == 0 && c->q4k_wide && !a.ids;
}

/* One token's plain Q4_K product goes to k_q4k_loop with at most one wave
 * of blocks (at most c->wide_loop an SM, MEMRA_CUDA_WIDE_LOOP; 0: never,
 * false and nothing launched: k_q4k_wide then takes it as before).  Its
 * launch bounds hold 8 blocks an SM at 1 and 2 rows a block (64 registers,
 * no spills; k_q4k_wide's 72 hold 7, which put the 30B-A3B's 1,024-block
 * o-projection at 1.11 waves) and 5 at 4. */
template <int R>
static bool launch_wide_loop(mr_cu_ctx *c, mr_cu_mvjob &a, int jobs)
{
    if (!c->wide_loop || jobs != 1)
        return false;
    int fit = mr_cu_fit(c, (const void *)k_q4k_loop<R>, FW * 32, 0);
    fit = fit > 0 ? fit : 1;
    const int bps = c->wide_loop < fit ? c->wide_loop : fit;
    const unsigned nvb = job_blocks(&a, R), wave = (unsigned)(c->n_sm * bps);
    mr_cu_launch(c, k_q4k_loop<R>, dim3(nvb < wave ? nvb : wave), FW * 32, 0, a, nvb);
    MR_CU_LAUNCHED(c, "q4_k wide matvec, one wave");
    return true;
}

/* Rows per block: more rows share each activation load, fewer give more
 * blocks; keep at least ~8 blocks per SM. */
template <int T, int NT>
static void launch_fast(mr_cu_ctx *c, mr_cu_mvjob a, int jobs)
{
    const int64_t units = job_rows(a) * jobs, want = (int64_t)c->n_sm * 8;
    /* Q4_K's 16-weight lanes for every token count of a plain product (the
     * same sums at 1, 2 or 4 tokens); expert products keep the 8-weight
     * lanes at every count, because decode batches of experts go through
     * the grouped kernels, which sum as k_fast does */
    if (q4k_wide_takes<T>(c, a)) {
        /* one token: rows a block by the shape (a row's sums do not depend
         * on it).  Rows of at most 2048 columns are one 512-column step a
         * warp, so four rows a block share the block's start and its input
         * loads; longer rows two where that leaves ~4 blocks an SM.  Run 105
         * (H200, us a call, rows a block 1 / 2 / 4): 4096 x 2048 6.27 / 4.99
         * / 4.36, 2048 x 4096 5.65 / 4.65 / 5.05, 4096 x 4096 8.43 / 7.44 /
         * 7.89, 4096 x 12288 19.07 / 16.17 / 18.39; 30B-A3B tg128 +3% with
         * four everywhere, the 8B -3%.  MEMRA_CUDA_WIDE_R=1, 2, 4 or 8
         * forces it; -1 is the rule before run 105 (two from 2 x 8 blocks
         * an SM, else one). */
        int r = c->wide_r;
        if (r == -1)
            r = units / 2 >= want ? 2 : 1;
        else if (r != 1 && r != 2 && r != 4 && r != 8)
            r = a.cols <= 2048 ? 4 : units / 2 >= want / 2 ? 2 : 1;
        /* one token's plain products load their first weights before the
         * PDL wait (k_q4k_wide's EARLY; the same bits; MEMRA_CUDA_EARLY=0
         * turns it off).  Run 109: 30B-A3B tg128 +3.3%, 8B +0.6-2% */
        const bool early = NT == 1 && c->early_w && !a.ids;
        if (NT == 1 && early &&
            (r == 8 ? launch_wide_loop<8>(c, a, jobs) : r == 4 ? launch_wide_loop<4>(c, a, jobs)
             : r == 2 ? launch_wide_loop<2>(c, a, jobs) : launch_wide_loop<1>(c, a, jobs)))
            return;
        if (NT == 1 && r == 8) {
            if (early) mr_cu_launch(c, k_q4k_wide<8, 1, false, true>, dim3(job_blocks(&a, 8), jobs), FW * 32, 0, a);
            else mr_cu_launch(c, k_q4k_wide<8, 1>, dim3(job_blocks(&a, 8), jobs), FW * 32, 0, a);
        } else if (NT == 1 && r == 4) {
            if (early) mr_cu_launch(c, k_q4k_wide<4, 1, false, true>, dim3(job_blocks(&a, 4), jobs), FW * 32, 0, a);
            else mr_cu_launch(c, k_q4k_wide<4, 1>, dim3(job_blocks(&a, 4), jobs), FW * 32, 0, a);
        } else if (NT == 1 && r == 2) {
            const unsigned gx = job_blocks(&a, 2);
            if (early) mr_cu_launch(c, k_q4k_wide<2, 1, false, true>, dim3(gx, jobs), FW * 32, 0, a);
            else mr_cu_launch(c, k_q4k_wide<2, 1>, dim3(gx, jobs), FW * 32, 0, a);
        } else if (early) {
            mr_cu_launch(c, k_q4k_wide<1, 1, false, true>, dim3(job_blocks(&a, 1), jobs), FW * 32, 0, a);
        } else {
            const unsigned gx = job_blocks(&a, 1);
            mr_cu_launch(c, k_q4k_wide<1, NT>, dim3(gx, jobs), FW * 32, 0, a);
        }
        MR_CU_LAUNCHED(c, "q4_k wide matvec");
        return;
    }
    /* rows a block: 4 where that leaves 8 blocks an SM, else 2, else 1; the
     * early form 2 from 4 blocks an SM (its blocks' loads are all in flight
     * before the wait only while they fit one wave: run 262, H100, IQ4_XS
     * 2,048 x 4,096, us, rows a block 1 / 2: early 5.69 / 5.10, not early
     * 6.32 / 5.94) */
    const int64_t want2 = NT == 1 && fast_early<T>(c, a) ? want / 2 : want;
    if (NT == 1 && c->fast_r != 2 && c->fast_r != 1 && (c->fast_r == 4 || units / 4 >= want))
        launch_fast_r<T, 4, NT>(c, a, jobs);
    else if (c->fast_r != 1 && (c->fast_r == 2 || units / 2 >= want2))
        launch_fast_r<T, 2, NT>(c, a, jobs);
    else
        launch_fast_r<T, 1, NT>(c, a, jobs);
}

/* Whether the Q4_K wide kernel takes 16 tokens a launch: rows of at most
 * 2,048 columns (c->wide16 on).  Run 140: the 30B-A3B's decode only C = 16
 * +1.7..3.4% with it on every width, the 8B's (4,096+ columns) -1.7%. */
static bool wide16_takes(const mr_cu_ctx *c, int64_t cols) { return c->wide16 && cols <= 2048; }

template <int T>
static void launch_fast_n(mr_cu_ctx *c, mr_cu_mvjob a, int n, int jobs)
{
    /* a decode batch (any count below the GEMM's) in chunks of 4, 2, 1
     * tokens (each chunk reads the weights once); 8 for the Q4_K wide
     * kernel (plain products: a decode batch's rows then read and decode
     * the weights half as often; MEMRA_CUDA_WIDE8=0: 4), four rows a block
     * sharing each input load from L1, which bounds these launches (run
     * 144; 2: two rows, 1: one; run 83: 16 tokens of the 30B-A3B's q 44.9
     * -> 29.9 us at two rows, run 147: the 8B's 4096 x 12288 144.0 -> 105.4
     * at four), and 16 on its rows of at most 2,048 columns (wide16_takes,
     * two rows a block) */
    const bool wide8 = c->wide8 && q4k_wide_takes<T>(c, a);
    /* float32 and bfloat16 (the routers) 8 a launch too, so that a
     * 16-token batch's router is two launches of ~3 us, not four
     * (MEMRA_CUDA_FAST8=0: 4, the path before; same bits).  Q6_K 8 a launch
     * lost on long rows (run 147: the 8B's down 4096 x 12288 at 16 tokens
     * 150.7 -> 188.6 us); rows of at most 2,048 columns take it (the
     * 30B-A3B's v, 512 x 2,048: at 16 tokens four launches of half a wave,
     * 14.7 us event-timed in run 288; run 291, H100, bench-kernels mv: 9.6
     * us against 10.7-13.2 with MEMRA_CUDA_FAST8=1, floats only) */
    constexpr bool floats = T == MR_TYPE_F32 || T == MR_TYPE_BF16, f8 = floats || T == MR_TYPE_Q6_K;
    const bool k8 = c->fast8 && (floats || (T == MR_TYPE_Q6_K && c->fast8 == 2 && a.cols <= 2048 && !a.ids));
    while (n > 0) {
        const int nt = n >= 16 && wide8 && wide16_takes(c, a.cols) ? 16
                       : n >= 8 && (wide8 || k8)                  ? 8
                       : n >= 4                                   ? 4
                       : n >= 2                                   ? 2
                                                                  : 1;
        int step = nt; /* tokens this launch takes */
        if (nt == 8 && k8) {
            /* a plain product's chunks of 8 as the jobs of one launch
             * (MEMRA_CUDA_FAST8_JOBS=0: a launch each): the router's 16
             * tokens in one wave of 256 blocks, not two launches of 128
             * (run 293, H100: 7.9-8.6 -> 4.5-4.7 us; v 9.6 -> 7.2) */
            const int chunks = !a.ids && jobs == 1 && c->fast8_jobs ? n / 8 : 1;
            a.tok_chunk = chunks > 1 ? 8 : 0;
            if constexpr (f8) launch_fast<T, 8>(c, a, jobs * chunks);
            a.tok_chunk = 0;
            step = 8 * chunks;
        } else if (nt == 16) { /* a 16-token batch: the weights decoded once, not twice */
            if constexpr (T == MR_TYPE_Q4_K) {
                if (c->wide16 == 1)
                    mr_cu_launch(c, k_q4k_wide<1, 16>, dim3(job_blocks(&a, 1), jobs), FW * 32, 0, a);
                else
                    mr_cu_launch(c, k_q4k_wide<2, 16>, dim3(job_blocks(&a, 2), jobs), FW * 32, 0, a);
                MR_CU_LAUNCHED(c, "q4_k wide matvec");
            }
        } else if (nt == 8) {
            if constexpr (T == MR_TYPE_Q4_K) {
                if (c->wide8_rows == 4)
                    mr_cu_launch(c, k_q4k_wide<4, 8>, dim3(job_blocks(&a, 4), jobs), FW * 32, 0, a);
                else if (c->wide8_rows == 2)
                    mr_cu_launch(c, k_q4k_wide<2, 8>, dim3(job_blocks(&a, 2), jobs), FW * 32, 0, a);
                else
                    mr_cu_launch(c, k_q4k_wide<1, 8>, dim3(job_blocks(&a, 1), jobs), FW * 32, 0, a);
                MR_CU_LAUNCHED(c, "q4_k wide matvec");
            }
        } else if (nt == 4) launch_fast<T, 4>(c, a, jobs);
        else if (nt == 2) launch_fast<T, 2>(c, a, jobs);
        else launch_fast<T, 1>(c, a, jobs);
        a.x += (int64_t)step * a.cols;
        a.y += (int64_t)step * a.rows;
        for (int s = 0; s < a.n_sub; s++) a.sub_y[s] += (int64_t)step * a.sub_rows[s];
        n -= step;
    }
}

static bool fast_ok(mr_cu_ctx *c, const mr_weight *w, const float *x)
{
    if (c->no_fast || !fast_has(w->type) || w->cols % 256 || ((uintptr_t)x & 15))
        return false;
    if (fast_padded(w->type) && !w->priv)
        return false;
    return true;
}

/* The types the fast kernels take (fast_has), for the launch switches. */
#define FAST_TYPES(X) X(MR_TYPE_Q4_K) X(MR_TYPE_Q5_K) X(MR_TYPE_Q6_K) X(MR_TYPE_Q8_0) X(MR_TYPE_Q4_0) \
    X(MR_TYPE_IQ4_XS) X(MR_TYPE_BF16) X(MR_TYPE_F32)

static bool fast_run(mr_cu_ctx *c, const mr_weight *w, mr_cu_mvjob a, int n, int jobs)
{
    switch (w->type) {
#define X(T) case T: launch_fast_n<T>(c, a, n, jobs); break;
        FAST_TYPES(X)
#undef X
    default: return false;
    }
    return true;
}

size_t mr_cu_fast_row_bytes(const mr_weight *w)
{
    return (size_t)(w->cols / fast_belems(w->type)) * fast_stride(w->type);
}

static mr_cu_mvjob make_job(const mr_weight *w, const float *x, float *y)
{
    return mr_cu_mvjob_plain((const uint8_t *)(w->priv ? w->priv : w->data), mr_cu_fast_row_bytes(w), w, x, y);
}

bool mr_cu_fast_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    if (!fast_ok(c, w, x))
        return false;
    return fast_run(c, w, make_job(w, x, y), n, 1);
}

/* The job of m matrices (2..MR_CU_MV_SUBS) of one type and width in one
 * launch, or false when they cannot share one: every one must take the
 * fast kernels, and their expert counts must agree. */
static bool multi_job(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                      mr_cu_mvjob *a)
{
    if (m < 2 || m > MR_CU_MV_SUBS)
        return false;
    for (int s = 0; s < m; s++)
        if (!fast_ok(c, w[s], x) || w[s]->type != w[0]->type || w[s]->cols != w[0]->cols ||
            w[s]->n_mats != w[0]->n_mats)
            return false;
    *a = make_job(w[0], x, y[0]);
    a->n_sub = m;
    for (int s = 0; s < m; s++) {
        a->sub_W[s] = (const uint8_t *)(w[s]->priv ? w[s]->priv : w[s]->data);
        a->sub_y[s] = y[s];
        a->sub_rows[s] = w[s]->rows;
    }
    return true;
}

/* m matrices over the same n input rows in one launch a chunk of tokens:
 * each output row is computed by the code and in the order that
 * mr_cu_fast_matvec uses for its matrix alone (the kernel, R aside, is
 * chosen the same way, and R does not change a row's sums), so the results
 * are bitwise those of m separate calls. */
bool mr_cu_fast_matvec_multi(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m,
                             const float *x, int n)
{
    mr_cu_mvjob a;
    if (!multi_job(c, w, y, m, x, &a))
        return false;
    return fast_run(c, w[0], a, n, 1);
}

/* The same for expert matrices chosen by the same ids (gate and up of a
 * mixture layer), on the one-token path: one job a token-expert pair. */
bool mr_cu_fast_matvec_id_multi(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m,
                                const float *x, int x_slots, const int32_t *ids, int k, int n)
{
    mr_cu_mvjob a;
    if (!multi_job(c, w, y, m, x, &a))
        return false;
    if (mr_cu_x24_matvec_id(c, w, y, m, x, x_slots, ids, k, n))
        return true;
    if (n != 1) /* decode batches share a launch on the 22-bit kernel only */
        return false;
    a.ids = ids;
    a.k = k;
    a.x_slots = x_slots;
    return fast_run(c, w[0], a, 1, n * k);
}

/* ---- gate/up with SwiGLU in one launch ----
 * The kernel and rows a block that the pair's own launch would take
 * (launch_fast: the Q4_K 16-weight lanes for plain products, else k_fast
 * at 4 or 2 rows a block), so every row's sums are the separate
 * products'; a block holds R/2 rows of each (at least one: a forced
 * MEMRA_CUDA_FAST_R=1 leaves the pair to the separate ops). */
template <int T, int R, int NT>
static void launch_glu_r(mr_cu_ctx *c, const mr_cu_mvjob &a, int jobs)
{
    const unsigned gx = (unsigned)((a.sub_rows[0] + R / 2 - 1) / (R / 2));
    mr_cu_launch(c, k_fast<T, R, NT, true>, dim3(gx, jobs), FW * 32, 0, a);
    MR_CU_LAUNCHED(c, "fast matvec + swiglu");
}

template <int T, int NT>
static void launch_glu(mr_cu_ctx *c, const mr_cu_mvjob &a, int jobs)
{
    const int64_t units = 2 * a.sub_rows[0] * jobs, want = (int64_t)c->n_sm * 8;
    if (q4k_wide_takes<T>(c, a)) {
        mr_cu_launch(c, k_q4k_wide<2, NT, true>, dim3((unsigned)a.sub_rows[0], jobs), FW * 32, 0, a);
        MR_CU_LAUNCHED(c, "q4_k wide matvec + swiglu");
        return;
    }
    if (NT == 1 && c->fast_r != 2 && (c->fast_r == 4 || units / 4 >= want))
        launch_glu_r<T, 4, NT>(c, a, jobs);
    else
        launch_glu_r<T, 2, NT>(c, a, jobs);
}

template <int T>
static void launch_glu_n(mr_cu_ctx *c, mr_cu_mvjob a, int n, int jobs)
{
    while (n > 0) { /* chunks of 4, 2, 1 tokens, as launch_fast_n */
        const int nt = n >= 4 ? 4 : n >= 2 ? 2 : 1;
        if (nt == 4) launch_glu<T, 4>(c, a, jobs);
        else if (nt == 2) launch_glu<T, 2>(c, a, jobs);
        else launch_glu<T, 1>(c, a, jobs);
        a.x += (int64_t)nt * a.cols;
        for (int s = 0; s < 2; s++) a.sub_y[s] += (int64_t)nt * a.sub_rows[s];
        a.glu_out += (int64_t)nt * a.sub_rows[0];
        n -= nt;
    }
}

bool mr_cu_fast_glu(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, const float *x,
                    int x_slots, const int32_t *ids, int k, int n)
{
    mr_cu_mvjob a;
    if (c->fast_r == 1 || n < 1 || n > MR_CU_MATVEC_MAX || (ids && n != 1) || !multi_job(c, w, y, 2, x, &a) ||
        w[0]->rows != w[1]->rows)
        return false;
    a.glu_out = o;
    int jobs = 1;
    if (ids) {
        a.ids = ids;
        a.k = k;
        a.x_slots = x_slots;
        jobs = k;
    }
    switch (w[0]->type) {
#define X(T) case T: launch_glu_n<T>(c, a, n, jobs); break;
        FAST_TYPES(X)
#undef X
    default: return false;
    }
    return true;
}

/* At backend creation: MEMRA_CUDA_MOE_GROUPED=0 keeps decode batches of
 * experts on the per-pair path (for timing the two against each other);
 * 2 or 4 fixes the grouped path's pairs per chunk. */
void mr_cu_fast_init(mr_cu_ctx *c)
{
    const char *g = getenv("MEMRA_CUDA_MOE_GROUPED");
    c->moe_grouped = !(g && !strcmp(g, "0"));
    c->moe_nt = g && (!strcmp(g, "2") || !strcmp(g, "4")) ? atoi(g) : 0;
}

/* How a grouped launch splits the work. */
struct grp_plan {
    int R;       /* rows a pass (k_fast's R) */
    int NT;      /* pairs a chunk at most */
    int RS;      /* rows a slab (a multiple of R) */
    bool xstage; /* a chunk's input rows are staged in shared memory */
    size_t smem; /* dynamic shared memory a block (<= 48 KiB: no opt-in needed) */
};

/* R: a forced MEMRA_CUDA_FAST_R (so that the checks compare both paths at
 * the same R), else 2.  NT: 4 where experts get 2+ pairs on average (a
 * chunk's decode work is shared by more tokens), else 2 (fewer registers,
 * more blocks resident); MEMRA_CUDA_MOE_GROUPED=2 or 4 forces it.  RS: as
 * many rows as GRP_SLAB_MAX and the 48 KiB hold, but few enough for ~4
 * blocks an SM when every slot is used.  False when R rows do not fit
 * (then the per-pair path runs). */
static bool grp_plan_make(mr_cu_ctx *c, const mr_cu_mvjob &a, int P, int S, grp_plan *pl)
{
    pl->R = c->fast_r == 1 || c->fast_r == 4 ? c->fast_r : 2;
    pl->NT = c->moe_nt ? c->moe_nt : P >= 2 * a.n_mats ? 4 : 2;
    const size_t xbytes = (size_t)pl->NT * a.cols * sizeof(float);
    pl->xstage = xbytes <= GRP_X_MAX;
    const size_t fixed = (pl->xstage ? xbytes : 0) + GRP_PL * sizeof(int32_t) + 16;
    const size_t per_row = a.row_bytes + (size_t)FW * pl->NT * sizeof(float);
    size_t room = (size_t)48 * 1024 - fixed;
    if (room > GRP_SLAB_MAX) room = GRP_SLAB_MAX;
    int64_t g = (int64_t)(room / (per_row * pl->R)); /* row groups a slab */
    if (g < 1)
        return false;
    const int64_t spread = a.rows * S / ((int64_t)4 * c->n_sm * pl->R);
    if (g > spread) g = spread > 1 ? spread : 1;
    if (g > GRP_MAX_RS / pl->R) g = GRP_MAX_RS / pl->R;
    if (g > (a.rows + pl->R - 1) / pl->R) g = (a.rows + pl->R - 1) / pl->R;
    pl->RS = (int)g * pl->R;
    pl->smem = grp_smem(pl->RS, a.row_bytes, a.cols, pl->NT, pl->xstage);
    return true;
}

template <int T, int R, int NT>
static void launch_grouped_r(mr_cu_ctx *c, const mr_cu_mvjob &a, const int32_t *grp, int S,
                             const grp_plan &pl)
{
    /* the grid counts every slot, used or not: the launch may not depend on the ids */
    dim3 grid((unsigned)((a.rows + pl.RS - 1) / pl.RS), (unsigned)S);
    mr_cu_launch(c, k_fast_grouped<T, R, NT>, grid, FW * 32, pl.smem, a, grp, S, pl.RS, (int)pl.xstage);
    MR_CU_LAUNCHED(c, "grouped expert matvec");
}

template <int T>
static void launch_grouped(mr_cu_ctx *c, const mr_cu_mvjob &a, const int32_t *grp, int S,
                           const grp_plan &pl)
{
    if (pl.NT == 4) {
        if (pl.R == 1) launch_grouped_r<T, 1, 4>(c, a, grp, S, pl);
        else if (pl.R == 2) launch_grouped_r<T, 2, 4>(c, a, grp, S, pl);
        else launch_grouped_r<T, 4, 4>(c, a, grp, S, pl);
    } else {
        if (pl.R == 1) launch_grouped_r<T, 1, 2>(c, a, grp, S, pl);
        else if (pl.R == 2) launch_grouped_r<T, 2, 2>(c, a, grp, S, pl);
        else launch_grouped_r<T, 4, 2>(c, a, grp, S, pl);
    }
}

bool mr_cu_moe_group_fits(int P, int64_t n_mats)
{
    return P <= GRP_MAX_PAIRS && n_mats <= GRP_MAX_MATS;
}

const int32_t *mr_cu_moe_group(mr_cu_ctx *c, const int32_t *ids, int P, int k, int64_t n_mats, int64_t rows,
                               float *y, float *y2, float *yo, int *S, bool items)
{
    if (!mr_cu_moe_group_fits(P, n_mats))
        return NULL;
    *S = (int)(P < n_mats ? P : n_mats);
    /* sized for the largest decode batch at this k and expert count, so that
     * a batch growing step by step does not reallocate it (a reallocation
     * drops the cached graphs) */
    int pmax = (MR_CU_GEMM_MIN_TOKENS - 1) * k;
    if (pmax > GRP_MAX_PAIRS) pmax = GRP_MAX_PAIRS;
    const size_t need = grp_ints(pmax, n_mats) * sizeof(int32_t);
    if (c->scratch_grp.cap < need && c->capturing)
        return NULL;
    if (!mr_cu_reserve(c, &c->scratch_grp, need, "expert grouping"))
        return NULL;
    int32_t *grp = (int32_t *)c->scratch_grp.p;
    int4 *it = items ? (int4 *)(grp + mr_cu_grp_items_at(*S, P)) : NULL;
    mr_cu_launch(c, k_moe_group, 1, GRP_THREADS, (size_t)2 * n_mats * sizeof(int), ids, P, (int)n_mats, *S, rows,
                 y, y2, yo, grp, it);
    MR_CU_LAUNCHED(c, "expert grouping");
    return grp;
}

/* The grouped path (see k_moe_group): false, having launched nothing, when
 * the call is outside its limits or would need scratch inside a capture. */
static bool grouped_run(mr_cu_ctx *c, const mr_weight *w, const mr_cu_mvjob &a, int n)
{
    const int P = n * a.k;
    if (!mr_cu_moe_group_fits(P, a.n_mats))
        return false;
    int S = (int)(P < a.n_mats ? P : a.n_mats);
    grp_plan pl;
    if (!grp_plan_make(c, a, P, S, &pl))
        return false;
    const int32_t *grp = mr_cu_moe_group(c, a.ids, P, a.k, a.n_mats, a.rows, a.y, NULL, NULL, &S, false);
    if (!grp)
        return c->failed; /* capture without scratch: the per-pair path; a failure: recorded */
    switch (w->type) {
#define X(T) case T: launch_grouped<T>(c, a, grp, S, pl); break;
        FAST_TYPES(X)
#undef X
    default: mr_cu_fail(c, "grouped expert matvec: type %d", w->type); break; /* fast_ok let it in */
    }
    return true;
}

bool mr_cu_fast_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n)
{
    if (mr_cu_x24_matvec_id(c, &w, &y, 1, x, x_slots, ids, k, n))
        return true;
    if (!fast_ok(c, w, x))
        return false;
    mr_cu_mvjob a = make_job(w, x, y);
    a.ids = ids;
    a.k = k;
    a.x_slots = x_slots;
    /* a decode batch: each used expert read once per chunk of its pairs
     * (one token keeps the per-pair path, tuned for it) */
    if (c->moe_grouped && n >= 2 && n < MR_CU_GEMM_MIN_TOKENS && grouped_run(c, w, a, n))
        return true;
    /* one token-expert pair per job (grid.y), all in one launch of one
     * token each (the job resolves its own input and output) */
    return fast_run(c, w, a, 1, n * k);
}

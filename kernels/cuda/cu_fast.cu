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

#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_quant.cuh"

#define FW 4 /* warps per block */

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
        const int ib = lane >> 2, l = 4 * (lane & 3);
        const uint32_t q = *(const uint32_t *)(p + 8 + 16 * ib + l);
        const float d = __half2float(*(const __half *)p);
        const uint32_t sh = *(const uint16_t *)(p + 2);
        const int ls = ((p[4 + ib / 2] >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
        /* code book values biased to bytes 1..241, floats by the exponent trick */
        const uint32_t lo = mr_iq4nl4(q & 0x0F0F0F0Fu) ^ 0x80808080u;
        const uint32_t hi = mr_iq4nl4((q >> 4) & 0x0F0F0F0Fu) ^ 0x80808080u;
        const float M = MAGIC + 128.0f;
        return d * (float)(ls - 32) *
               (dot4(xa, mag(lo, 0) - M, mag(lo, 1) - M, mag(lo, 2) - M, mag(lo, 3) - M) +
                dot4(xb, mag(hi, 0) - M, mag(hi, 1) - M, mag(hi, 2) - M, mag(hi, 3) - M));
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


/* A block of FW warps owns R rows; warp w takes steps w, w+FW, ... of
 * those rows (split-K inside the block, so even a 1024-row matrix gives
 * thousands of warps with loads in flight), then the warps' partial sums
 * meet in shared memory.  grid.x: row groups, grid.y: jobs (experts). */
template <int T, int R, int NT>
__global__ void __launch_bounds__(FW * 32) k_fast(mr_cu_mvjob a)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * R;
    const uint8_t *W;
    const float *x;
    float *y;
    if (!mr_cu_mv_rows<R>(a, r0, &W, &x, &y))
        return;
    constexpr int SB = fast_stride(T) * (256 / fast_belems(T)); /* bytes per 256-col step */
    int o1, o2;
    x_offsets<T>(lane, &o1, &o2);
    const int nsteps = (int)(a.cols / 256);
    const uint8_t *rp[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        int64_t r = r0 + i < a.rows ? r0 + i : a.rows - 1; /* clamp; not stored */
        rp[i] = W + r * a.row_bytes;
    }
    float acc[NT][R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[t][i] = 0.0f;
#pragma unroll 4
    for (int s = warp; s < nsteps; s += FW) {
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
    if (threadIdx.x < NT * R) {
        const int t = threadIdx.x / R, i = threadIdx.x % R;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < FW; w++) v += part[w][threadIdx.x];
        if (r0 + i < a.rows) y[(int64_t)t * a.rows + r0 + i] = v;
    }
}

/* Q4_K, one token, 512 columns a step: each lane takes 16 weights of one
 * 64-column group (two 4-byte loads, quads 4k and 16+4k of both nibble
 * halves) so the scale/min work is paid once per 16 weights, not per 8. */
template <int R>
__global__ void __launch_bounds__(FW * 32) k_q4k_wide(mr_cu_mvjob a)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * R;
    const uint8_t *W;
    const float *x;
    float *y;
    if (!mr_cu_mv_rows<R>(a, r0, &W, &x, &y))
        return;
    const int blk = lane >> 4, j = (lane >> 2) & 3, k = lane & 3;
    const int xo = 256 * blk + 64 * j + 4 * k;
    const int po = 148 * blk; /* block inside the step */
    const int nsteps = (int)(a.cols / 512);
    const uint8_t *rp[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        int64_t r = r0 + i < a.rows ? r0 + i : a.rows - 1;
        rp[i] = W + r * a.row_bytes + po;
    }
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.0f;
#pragma unroll 2
    for (int s = warp; s < nsteps; s += FW) {
        const float *xs = x + 512 * s + xo;
        const float4 a0 = __ldg((const float4 *)xs), a1 = __ldg((const float4 *)(xs + 16));
        const float4 b0 = __ldg((const float4 *)(xs + 32)), b1 = __ldg((const float4 *)(xs + 48));
        const float xs0 = (a0.x + a0.y) + (a0.z + a0.w) + (a1.x + a1.y) + (a1.z + a1.w);
        const float xs1 = (b0.x + b0.y) + (b0.z + b0.w) + (b1.x + b1.y) + (b1.z + b1.w);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint8_t *p = rp[i] + (size_t)s * 296;
            const uint32_t dd = *(const uint32_t *)p;
            const uint32_t sm = *(const uint32_t *)(p + 4 + 4 * j);
            const uint32_t q0 = *(const uint32_t *)(p + 20 + 32 * j + 4 * k);
            const uint32_t q1 = *(const uint32_t *)(p + 20 + 32 * j + 16 + 4 * k);
            const uint32_t l0 = q0 & 0x0F0F0F0Fu, h0 = (q0 >> 4) & 0x0F0F0F0Fu;
            const uint32_t l1 = q1 & 0x0F0F0F0Fu, h1 = (q1 >> 4) & 0x0F0F0F0Fu;
            const float f0 = dot4(a0, hq(l0, 0), hq(l0, 1), hq(l0, 2), hq(l0, 3)) +
                             dot4(a1, hq(l1, 0), hq(l1, 1), hq(l1, 2), hq(l1, 3));
            const float f1 = dot4(b0, hq(h0, 0), hq(h0, 1), hq(h0, 2), hq(h0, 3)) +
                             dot4(b1, hq(h1, 0), hq(h1, 1), hq(h1, 2), hq(h1, 3));
            const float s0 = 256.0f * f0 - 128.0f * xs0, s1 = 256.0f * f1 - 128.0f * xs1;
            const float d = __half2float(__ushort_as_half((uint16_t)(dd & 0xffff)));
            const float dm = __half2float(__ushort_as_half((uint16_t)(dd >> 16)));
            const float sc0 = mag(sm, 0) - MAGIC, sc1 = mag(sm, 1) - MAGIC;
            const float m0 = mag(sm, 2) - MAGIC, m1 = mag(sm, 3) - MAGIC;
            acc[i] += d * (sc0 * s0 + sc1 * s1) - dm * (m0 * xs0 + m1 * xs1);
        }
    }
    __shared__ float part[FW][R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        float v = mr_warp_sum(acc[i]);
        if (lane == 0) part[warp][i] = v;
    }
    __syncthreads();
    if (threadIdx.x < R) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < FW; w++) v += part[w][threadIdx.x];
        if (r0 + threadIdx.x < a.rows) y[r0 + threadIdx.x] = v;
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

template <int T, int R, int NT>
static void launch_fast_r(mr_cu_ctx *c, const mr_cu_mvjob &a, int jobs)
{
    dim3 grid((unsigned)((a.rows + R - 1) / R), jobs);
    k_fast<T, R, NT><<<grid, FW * 32, 0, c->stream>>>(a);
    MR_CU_LAUNCHED(c, "fast matvec");
}

/* Rows per block: more rows share each activation load, fewer give more
 * blocks; keep at least ~8 blocks per SM. */
template <int T, int NT>
static void launch_fast(mr_cu_ctx *c, const mr_cu_mvjob &a, int jobs)
{
    if (T == MR_TYPE_Q4_K && NT == 1 && a.cols % 512 == 0 && c->q4k_wide) {
        const int64_t units = a.rows * jobs, want = (int64_t)c->n_sm * 8;
        if (units / 2 >= want) {
            k_q4k_wide<2><<<dim3((unsigned)((a.rows + 1) / 2), jobs), FW * 32, 0, c->stream>>>(a);
        } else {
            k_q4k_wide<1><<<dim3((unsigned)a.rows, jobs), FW * 32, 0, c->stream>>>(a);
        }
        MR_CU_LAUNCHED(c, "q4_k wide matvec");
        return;
    }
    const int64_t want = (int64_t)c->n_sm * 8;
    const int64_t units = a.rows * jobs;
    if (NT == 1 && c->fast_r != 2 && c->fast_r != 1 && (c->fast_r == 4 || units / 4 >= want))
        launch_fast_r<T, 4, NT>(c, a, jobs);
    else if (c->fast_r != 1 && (c->fast_r == 2 || units / 2 >= want))
        launch_fast_r<T, 2, NT>(c, a, jobs);
    else
        launch_fast_r<T, 1, NT>(c, a, jobs);
}

template <int T>
static void launch_fast_n(mr_cu_ctx *c, mr_cu_mvjob a, int n, int jobs)
{
    /* tokens in chunks of 4, 2, 1 (each chunk reads the weights once) */
    while (n > 0) {
        int nt = n >= 4 ? 4 : n >= 2 ? 2 : 1;
        if (nt == 4) launch_fast<T, 4>(c, a, jobs);
        else if (nt == 2) launch_fast<T, 2>(c, a, jobs);
        else launch_fast<T, 1>(c, a, jobs);
        a.x += (int64_t)nt * a.cols;
        a.y += (int64_t)nt * a.rows;
        n -= nt;
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

static bool fast_run(mr_cu_ctx *c, const mr_weight *w, mr_cu_mvjob a, int n, int jobs)
{
    switch (w->type) {
    case MR_TYPE_Q4_K: launch_fast_n<MR_TYPE_Q4_K>(c, a, n, jobs); break;
    case MR_TYPE_Q5_K: launch_fast_n<MR_TYPE_Q5_K>(c, a, n, jobs); break;
    case MR_TYPE_Q6_K: launch_fast_n<MR_TYPE_Q6_K>(c, a, n, jobs); break;
    case MR_TYPE_Q8_0: launch_fast_n<MR_TYPE_Q8_0>(c, a, n, jobs); break;
    case MR_TYPE_Q4_0: launch_fast_n<MR_TYPE_Q4_0>(c, a, n, jobs); break;
    case MR_TYPE_IQ4_XS: launch_fast_n<MR_TYPE_IQ4_XS>(c, a, n, jobs); break;
    case MR_TYPE_BF16: launch_fast_n<MR_TYPE_BF16>(c, a, n, jobs); break;
    case MR_TYPE_F32: launch_fast_n<MR_TYPE_F32>(c, a, n, jobs); break;
    default: return false;
    }
    return true;
}

static mr_cu_mvjob make_job(const mr_weight *w, const float *x, float *y)
{
    size_t rb = (size_t)(w->cols / fast_belems(w->type)) * fast_stride(w->type);
    mr_cu_mvjob a;
    a.W = (const uint8_t *)(w->priv ? w->priv : w->data);
    a.row_bytes = rb;
    a.mat_bytes = rb * (size_t)w->rows;
    a.cols = w->cols;
    a.rows = w->rows;
    a.n_mats = w->n_mats;
    a.x = x;
    a.y = y;
    a.ids = NULL;
    a.k = 1;
    a.x_slots = 1;
    return a;
}

bool mr_cu_fast_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    if (!fast_ok(c, w, x))
        return false;
    return fast_run(c, w, make_job(w, x, y), n, 1);
}

bool mr_cu_fast_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n)
{
    if (!fast_ok(c, w, x))
        return false;
    mr_cu_mvjob a = make_job(w, x, y);
    a.ids = ids;
    a.k = k;
    a.x_slots = x_slots;
    /* one token-expert pair per job (grid.y), all in one launch of one
     * token each (the job resolves its own input and output) */
    return fast_run(c, w, a, 1, n * k);
}

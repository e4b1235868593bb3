/* Per-lane arithmetic of the int8-activation matvec (cu_mvq8.cu): where a
 * lane's weights and activations sit, how they are unpacked, and the dot
 * product of one lane's share of one 1024-column (Q8_0: 256, Q4_0: 512)
 * step of one row.
 *
 * The functions are __host__ __device__ (with plain host versions of the
 * byte intrinsics) so that the lane logic can be exercised on a machine
 * without a GPU; the kernels in cu_mvq8.cu only add the loop over steps and
 * the reductions.
 *
 * Activations (mr_q8act): row r of `cols` values is quantized in blocks of
 * 32: q = round_to_nearest_even(x * (127 / absmax)) in int8, with the block's
 * d = absmax / 127 and s = d * sum(q) stored in two float arrays.  x-hat =
 * d * q is then the activation every product below uses, exactly: each
 * integer dot product over a weight group (16 or 32 elements that share one
 * weight scale and one activation block) is exact in int32, and only its
 * scaling by the float scales rounds.
 *
 * Weights are read in the layout the backend keeps at load (cu_fast.cu,
 * mr_cu_weight_prepare; not changed here): Q4_K 148-byte blocks (d, dmin,
 * then per 64 columns the bytes sc[2j] sc[2j+1] m[2j] m[2j+1], then qs),
 * Q5_K 180 (the same, then qh at 20 and qs at 52), Q6_K padded to 212, Q8_0
 * and Q4_0 padded to 36 and 20 with the quants at offset 4, IQ4_XS as in the
 * file (136 bytes). */
#ifndef MR_CU_MVQ8_CUH
#define MR_CU_MVQ8_CUH

#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_quant.cuh" /* the IQ4_NL code book words */

/* The quantized activations of one call. */
struct mr_q8act {
    const int8_t *q;  /* [rows][cols] */
    const float *d;   /* [rows][cols / 32]: absmax / 127 (NaN when the block has a NaN or Inf) */
    const float *s;   /* [rows][cols / 32]: d * sum of the block's q */
    const float *x0;  /* the float rows they came from: a job's x pointer names its row */
    int64_t cols;
};

/* unrolled on the device; the host pass of these functions (for checks
 * without a GPU) has no such pragma */
#ifdef __CUDA_ARCH__
#define Q8_UNROLL _Pragma("unroll")
#else
#define Q8_UNROLL
#endif

/* ---- byte intrinsics, with host versions ---- */

/* sum of the 4 signed byte products of a and b, plus c */
__host__ __device__ __forceinline__ int q8_dp4a(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int k = 0; k < 4; k++) c += (int)(int8_t)(a >> 8 * k) * (int)(int8_t)(b >> 8 * k);
    return c;
#endif
}

/* the same with a's bytes unsigned (0..255) and b's signed */
__host__ __device__ __forceinline__ int q8_dp4a_us(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    for (int k = 0; k < 4; k++) c += (int)(uint8_t)(a >> 8 * k) * (int)(int8_t)(b >> 8 * k);
    return c;
#endif
}

/* byte n of the result = byte (s >> 4n) & 7 of the 8 bytes {y:x}; callers
 * only pass selector nibbles 0..7 (bit 3, the sign-replicate mode of the
 * hardware instruction, is never set) */
__host__ __device__ __forceinline__ uint32_t q8_perm(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((v >> 8 * ((s >> 4 * n) & 7)) & 0xff) << 8 * n;
    return r;
#endif
}

__host__ __device__ __forceinline__ float q8_h2f(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)(h & 0xffff)));
}

/* A weight word (read-only for the kernel's lifetime).  Explicitly a
 * global load: the pinned pointers below are opaque to the compiler, which
 * would otherwise fall back to generic loads. */
__host__ __device__ __forceinline__ uint32_t q8_ld32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    uint32_t v;
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return *(const uint32_t *)p;
#endif
}

/* Keeps a lane's row pointer in a register for the whole loop: without it
 * the compiler rebuilds it from the matrix base, the row and the lane
 * offsets at every step (three 64-bit adds per pointer instead of one). */
template <typename Ptr> __host__ __device__ __forceinline__ void q8_pin(Ptr &p)
{
#ifdef __CUDA_ARCH__
    asm("" : "+l"(p));
#endif
}

__host__ __device__ __forceinline__ uint4 q8_ldx16(const int8_t *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const uint4 *)p);
#else
    return *(const uint4 *)p;
#endif
}
__host__ __device__ __forceinline__ uint2 q8_ldx8(const int8_t *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const uint2 *)p);
#else
    return *(const uint2 *)p;
#endif
}
template <typename V> __host__ __device__ __forceinline__ V q8_ldf(const float *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const V *)p);
#else
    return *(const V *)p;
#endif
}

/* ---- per type: lane layout and dot product ----
 * STRIDE: bytes per block in the layout read; BELEMS: elements per block;
 * STEP: columns a warp covers per step.
 * active(s, lane, nblk): whether the lane has a block in step s (the last
 *   step of a row may be partial).
 * wptr(row, lane, P): the lane's pointers into a row at step 0 (one per
 *   field whose offset depends on the lane), computed once per row;
 *   load_w(P, so, W): the lane's weights of the step at byte offset so.
 * xptr(xa, row, lane, p): the lane's pointers into quantized row `row` at
 *   step 0; load_x(p, off, X): its activations off values further on (a
 *   token's offset plus the step's).
 * dot(W, X, acc): acc plus their product. */
struct q8xp {
    const int8_t *q;
    const float *d, *s;
};

__host__ __device__ __forceinline__ void q8_xptr(const mr_q8act &xa, int64_t row, int64_t col, q8xp &p)
{
    p.q = xa.q + row * xa.cols + col;
    p.d = xa.d + row * (xa.cols / 32) + col / 32;
    p.s = xa.s + row * (xa.cols / 32) + col / 32;
}

template <int T> struct q8k;

/* Q4_K: lane = (block b of 4, 64-column group j, half h): 16 bytes of qs =
 * 16 weights of sub-block 2j (low nibbles, columns 64j+16h..+15) and 16 of
 * sub-block 2j+1 (high nibbles, 32 columns later).  The high nibbles enter
 * the dot product in place (as 16*q, unsigned), shifted out afterwards. */
template <> struct q8k<MR_TYPE_Q4_K> {
    static constexpr int STRIDE = 148, BELEMS = 256, STEP = 1024;
    struct P {
        const uint8_t *dd, *sm, *qs;
        int msh; /* m of sub-block 2j+h: byte 2+h of the scale word */
    };
    struct W {
        float d, dm; /* dm: dmin * m of this lane's sub-block (2j+h) */
        int sc0, sc1;
        uint32_t lo[4], hi[4];
    };
    struct X {
        uint4 a, b;
        float d0, d1, s;
    };
    static __host__ __device__ __forceinline__ bool active(int s, int lane, int64_t nblk)
    {
        return 4 * (int64_t)s + (lane >> 3) < nblk;
    }
    static __host__ __device__ __forceinline__ void wptr(const uint8_t *row, int lane, P &p)
    {
        const int j = (lane >> 1) & 3, h = lane & 1;
        p.dd = row + STRIDE * (lane >> 3);
        p.sm = p.dd + 4 + 4 * j;
        p.qs = p.dd + 20 + 32 * j + 16 * h;
        p.msh = 16 + 8 * h;
        q8_pin(p.dd);
        q8_pin(p.sm);
        q8_pin(p.qs);
    }
    static __host__ __device__ __forceinline__ void load_w(const P &p, size_t so, W &w)
    {
        const uint32_t dd = q8_ld32(p.dd + so), sm = q8_ld32(p.sm + so);
        const uint8_t *qs = p.qs + so;
        Q8_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t q = q8_ld32(qs + 4 * i);
            w.lo[i] = q & 0x0F0F0F0Fu;
            w.hi[i] = q & 0xF0F0F0F0u;
        }
        w.d = q8_h2f(dd);
        w.dm = q8_h2f(dd >> 16) * (float)((sm >> p.msh) & 0xff);
        w.sc0 = (int)(sm & 0xff);
        w.sc1 = (int)((sm >> 8) & 0xff);
    }
    static __host__ __device__ __forceinline__ void xptr(const mr_q8act &xa, int64_t row, int lane, q8xp &p)
    {
        const int b = lane >> 3, j = (lane >> 1) & 3, h = lane & 1;
        q8_xptr(xa, row, 256 * b + 64 * j + 16 * h, p);
        p.s += h; /* s of sub-block 2j+h (p.d is that of 2j) */
    }
    static __host__ __device__ __forceinline__ void load_x(const q8xp &p, int64_t off, X &x)
    {
        x.a = q8_ldx16(p.q + off);
        x.b = q8_ldx16(p.q + off + 32);
        const float2 d = q8_ldf<float2>(p.d + off / 32);
        x.d0 = d.x;
        x.d1 = d.y;
        x.s = q8_ldf<float>(p.s + off / 32);
    }
    static __host__ __device__ __forceinline__ float dot(const W &w, const X &x, float acc)
    {
        int lo = q8_dp4a(w.lo[0], x.a.x, 0), hi = q8_dp4a_us(w.hi[0], x.b.x, 0);
        lo = q8_dp4a(w.lo[1], x.a.y, lo);
        hi = q8_dp4a_us(w.hi[1], x.b.y, hi);
        lo = q8_dp4a(w.lo[2], x.a.z, lo);
        hi = q8_dp4a_us(w.hi[2], x.b.z, hi);
        lo = q8_dp4a(w.lo[3], x.a.w, lo);
        hi = q8_dp4a_us(w.hi[3], x.b.w, hi);
        /* |sc * sum| < 2^21: exact as a float */
        const float f = x.d0 * (float)(w.sc0 * lo) + x.d1 * (float)(w.sc1 * (hi >> 4));
        /* plus this lane's half of the block's min term: sub-block 2j+h */
        return fmaf(-w.dm, x.s, fmaf(w.d, f, acc));
    }
};

/* Q5_K: Q4_K's lanes, the fifth bit from qh (byte l of qh: bit 2j for
 * column 64j+l, bit 2j+1 for column 64j+32+l). */
template <> struct q8k<MR_TYPE_Q5_K> {
    static constexpr int STRIDE = 180, BELEMS = 256, STEP = 1024;
    using Q4 = q8k<MR_TYPE_Q4_K>;
    struct P {
        const uint8_t *dd, *sm, *qs, *qh;
        int msh, hsh; /* hsh: 2j, the bit of this group in qh */
    };
    using W = Q4::W;
    using X = Q4::X;
    static __host__ __device__ __forceinline__ bool active(int s, int lane, int64_t nblk)
    {
        return Q4::active(s, lane, nblk);
    }
    static __host__ __device__ __forceinline__ void wptr(const uint8_t *row, int lane, P &p)
    {
        const int j = (lane >> 1) & 3, h = lane & 1;
        p.dd = row + STRIDE * (lane >> 3);
        p.sm = p.dd + 4 + 4 * j;
        p.qs = p.dd + 52 + 32 * j + 16 * h;
        p.qh = p.dd + 20 + 16 * h;
        p.msh = 16 + 8 * h;
        p.hsh = 2 * j;
        q8_pin(p.dd);
        q8_pin(p.sm);
        q8_pin(p.qs);
        q8_pin(p.qh);
    }
    static __host__ __device__ __forceinline__ void load_w(const P &p, size_t so, W &w)
    {
        const uint32_t dd = q8_ld32(p.dd + so), sm = q8_ld32(p.sm + so);
        const uint8_t *qs = p.qs + so, *qhp = p.qh + so;
        Q8_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t q = q8_ld32(qs + 4 * i);
            const uint32_t qh = q8_ld32(qhp + 4 * i) >> p.hsh;
            w.lo[i] = (q & 0x0F0F0F0Fu) | ((qh & 0x01010101u) << 4);
            w.hi[i] = ((q >> 4) & 0x0F0F0F0Fu) | ((qh & 0x02020202u) << 3);
        }
        w.d = q8_h2f(dd);
        w.dm = q8_h2f(dd >> 16) * (float)((sm >> p.msh) & 0xff);
        w.sc0 = (int)(sm & 0xff);
        w.sc1 = (int)((sm >> 8) & 0xff);
    }
    static __host__ __device__ __forceinline__ void xptr(const mr_q8act &xa, int64_t row, int lane, q8xp &p)
    {
        Q4::xptr(xa, row, lane, p);
    }
    static __host__ __device__ __forceinline__ void load_x(const q8xp &p, int64_t off, X &x)
    {
        Q4::load_x(p, off, x);
    }
    static __host__ __device__ __forceinline__ float dot(const W &w, const X &x, float acc)
    {
        int lo = q8_dp4a(w.lo[0], x.a.x, 0), hi = q8_dp4a(w.hi[0], x.b.x, 0);
        lo = q8_dp4a(w.lo[1], x.a.y, lo);
        hi = q8_dp4a(w.hi[1], x.b.y, hi);
        lo = q8_dp4a(w.lo[2], x.a.z, lo);
        hi = q8_dp4a(w.hi[2], x.b.z, hi);
        lo = q8_dp4a(w.lo[3], x.a.w, lo);
        hi = q8_dp4a(w.hi[3], x.b.w, hi);
        /* |sc * sum| < 2^22 */
        const float f = x.d0 * (float)(w.sc0 * lo) + x.d1 * (float)(w.sc1 * hi);
        return fmaf(-w.dm, x.s, fmaf(w.d, f, acc));
    }
};

/* Q6_K: lane = (block b of 4, half n of 128 columns, l8): positions
 * l = 8*l8..8*l8+7 of the four 32-column quarters of the half (32 weights,
 * one 16-column scale each).  q - 32 is folded into the dot product by
 * starting each sum at -32 * sum(x) (x-only, shared by all rows). */
template <> struct q8k<MR_TYPE_Q6_K> {
    static constexpr int STRIDE = 212, BELEMS = 256, STEP = 1024;
    struct P {
        const uint8_t *ql, *qh, *sc, *d;
        int g8; /* 8 * (l / 16): the scale byte of quarter 0 in the first scale word */
    };
    struct W {
        float d;
        int sc[4];
        uint32_t q[4][2];
    };
    struct X {
        uint2 v[4];
        int s32[4]; /* -32 * sum of the quarter's 8 activations */
        float4 d;
    };
    static __host__ __device__ __forceinline__ bool active(int s, int lane, int64_t nblk)
    {
        return 4 * (int64_t)s + (lane >> 3) < nblk;
    }
    static __host__ __device__ __forceinline__ void wptr(const uint8_t *row, int lane, P &p)
    {
        const int n = (lane >> 2) & 1, l8 = lane & 3;
        const uint8_t *b = row + STRIDE * (lane >> 3);
        p.ql = b + 64 * n + 8 * l8;
        p.qh = b + 128 + 32 * n + 8 * l8;
        p.sc = b + 192 + 8 * n;
        p.d = b + 208;
        p.g8 = 8 * (l8 >> 1);
        q8_pin(p.ql);
        q8_pin(p.qh);
        q8_pin(p.sc);
        q8_pin(p.d);
    }
    static __host__ __device__ __forceinline__ void load_w(const P &p, size_t so, W &w)
    {
        const uint8_t *ql = p.ql + so, *qhp = p.qh + so, *sc = p.sc + so;
        Q8_UNROLL
        for (int k = 0; k < 2; k++) {
            const uint32_t la = q8_ld32(ql + 4 * k), lb = q8_ld32(ql + 32 + 4 * k);
            const uint32_t qh = q8_ld32(qhp + 4 * k);
            w.q[0][k] = (la & 0x0F0F0F0Fu) | ((qh << 4) & 0x30303030u);
            w.q[1][k] = (lb & 0x0F0F0F0Fu) | ((qh << 2) & 0x30303030u);
            w.q[2][k] = ((la >> 4) & 0x0F0F0F0Fu) | (qh & 0x30303030u);
            w.q[3][k] = ((lb >> 4) & 0x0F0F0F0Fu) | ((qh >> 2) & 0x30303030u);
        }
        /* scale of quarter k: sc[8n + l/16 + 2k] */
        const uint32_t s0 = q8_ld32(sc), s1 = q8_ld32(sc + 4);
        w.sc[0] = (int)(int8_t)(s0 >> p.g8);
        w.sc[1] = (int)(int8_t)(s0 >> (p.g8 + 16));
        w.sc[2] = (int)(int8_t)(s1 >> p.g8);
        w.sc[3] = (int)(int8_t)(s1 >> (p.g8 + 16));
        w.d = q8_h2f(q8_ld32(p.d + so));
    }
    static __host__ __device__ __forceinline__ void xptr(const mr_q8act &xa, int64_t row, int lane, q8xp &p)
    {
        q8_xptr(xa, row, 256 * (lane >> 3) + 128 * ((lane >> 2) & 1) + 8 * (lane & 3), p);
    }
    static __host__ __device__ __forceinline__ void load_x(const q8xp &p, int64_t off, X &x)
    {
        Q8_UNROLL
        for (int k = 0; k < 4; k++) {
            x.v[k] = q8_ldx8(p.q + off + 32 * k);
            x.s32[k] = -32 * q8_dp4a(0x01010101u, x.v[k].x, q8_dp4a(0x01010101u, x.v[k].y, 0));
        }
        x.d = q8_ldf<float4>(p.d + off / 32);
    }
    static __host__ __device__ __forceinline__ float dot(const W &w, const X &x, float acc)
    {
        int q[4];
        Q8_UNROLL
        for (int k = 0; k < 4; k++)
            q[k] = w.sc[k] * q8_dp4a(w.q[k][0], x.v[k].x, q8_dp4a(w.q[k][1], x.v[k].y, x.s32[k]));
        /* |sc * sum| < 2^22 */
        return fmaf(w.d, x.d.x * (float)q[0] + x.d.y * (float)q[1] + x.d.z * (float)q[2] + x.d.w * (float)q[3], acc);
    }
};

/* Q8_0: lane = (block b of 8, quarter): 8 weights.  Lanes of a block read
 * 32 contiguous bytes; 8 weights a lane keep the loads of a warp within a
 * few cache lines (36-byte blocks). */
template <> struct q8k<MR_TYPE_Q8_0> {
    static constexpr int STRIDE = 36, BELEMS = 32, STEP = 256;
    struct P {
        const uint8_t *d, *q;
    };
    struct W {
        float d;
        uint32_t q0, q1;
    };
    struct X {
        uint2 v;
        float d;
    };
    static __host__ __device__ __forceinline__ bool active(int s, int lane, int64_t nblk)
    {
        return 8 * (int64_t)s + (lane >> 2) < nblk;
    }
    static __host__ __device__ __forceinline__ void wptr(const uint8_t *row, int lane, P &p)
    {
        p.d = row + STRIDE * (lane >> 2);
        p.q = p.d + 4 + 8 * (lane & 3);
        q8_pin(p.d);
        q8_pin(p.q);
    }
    static __host__ __device__ __forceinline__ void load_w(const P &p, size_t so, W &w)
    {
        w.q0 = q8_ld32(p.q + so);
        w.q1 = q8_ld32(p.q + so + 4);
        w.d = q8_h2f(q8_ld32(p.d + so));
    }
    static __host__ __device__ __forceinline__ void xptr(const mr_q8act &xa, int64_t row, int lane, q8xp &p)
    {
        q8_xptr(xa, row, 32 * (lane >> 2) + 8 * (lane & 3), p);
    }
    static __host__ __device__ __forceinline__ void load_x(const q8xp &p, int64_t off, X &x)
    {
        x.v = q8_ldx8(p.q + off);
        x.d = q8_ldf<float>(p.d + off / 32);
    }
    static __host__ __device__ __forceinline__ float dot(const W &w, const X &x, float acc)
    {
        const int q = q8_dp4a(w.q0, x.v.x, q8_dp4a(w.q1, x.v.y, 0));
        return fmaf(w.d, x.d * (float)q, acc);
    }
};

/* Q4_0: lane = (block b of 16, half hh): bytes 8hh..8hh+7 of qs = columns
 * 8hh..+7 (low nibbles) and 16+8hh..+7 (high nibbles, as 16*q).  The -8 is
 * applied once per block through the block sum s, by the hh = 0 lane. */
template <> struct q8k<MR_TYPE_Q4_0> {
    static constexpr int STRIDE = 20, BELEMS = 32, STEP = 512;
    struct P {
        const uint8_t *d, *q;
    };
    struct W {
        float d;
        uint32_t lo0, lo1, hi0, hi1;
    };
    struct X {
        uint2 a, b;
        float d16, s8;
    };
    static __host__ __device__ __forceinline__ bool active(int s, int lane, int64_t nblk)
    {
        return 16 * (int64_t)s + (lane >> 1) < nblk;
    }
    static __host__ __device__ __forceinline__ void wptr(const uint8_t *row, int lane, P &p)
    {
        p.d = row + STRIDE * (lane >> 1);
        p.q = p.d + 4 + 8 * (lane & 1);
        q8_pin(p.d);
        q8_pin(p.q);
    }
    static __host__ __device__ __forceinline__ void load_w(const P &p, size_t so, W &w)
    {
        const uint32_t q0 = q8_ld32(p.q + so), q1 = q8_ld32(p.q + so + 4);
        w.lo0 = q0 & 0x0F0F0F0Fu;
        w.lo1 = q1 & 0x0F0F0F0Fu;
        w.hi0 = q0 & 0xF0F0F0F0u;
        w.hi1 = q1 & 0xF0F0F0F0u;
        w.d = q8_h2f(q8_ld32(p.d + so));
    }
    static __host__ __device__ __forceinline__ void xptr(const mr_q8act &xa, int64_t row, int lane, q8xp &p)
    {
        q8_xptr(xa, row, 32 * (lane >> 1) + 8 * (lane & 1), p);
        if (lane & 1)
            p.s = NULL; /* the block's -8 * sum is the other lane's */
    }
    static __host__ __device__ __forceinline__ void load_x(const q8xp &p, int64_t off, X &x)
    {
        x.a = q8_ldx8(p.q + off);
        x.b = q8_ldx8(p.q + off + 16);
        x.d16 = q8_ldf<float>(p.d + off / 32) * 0.0625f;
        x.s8 = p.s ? 8.0f * q8_ldf<float>(p.s + off / 32) : 0.0f;
    }
    static __host__ __device__ __forceinline__ float dot(const W &w, const X &x, float acc)
    {
        const int lo = q8_dp4a(w.lo0, x.a.x, q8_dp4a(w.lo1, x.a.y, 0));
        const int hi = q8_dp4a_us(w.hi0, x.b.x, q8_dp4a_us(w.hi1, x.b.y, 0));
        /* 16 * sum(q * x) < 2^19 */
        return fmaf(w.d, x.d16 * (float)(16 * lo + hi) - x.s8, acc);
    }
};

/* IQ4_XS: lane = (block b of 4, sub-block ib of 8): its 16 bytes of qs =
 * 32 weights with one 6-bit scale.  The non-linear code book is looked up
 * four nibbles at a time with byte permutes; the values come out in the
 * order (byte0 low, byte0 high, byte1 low, byte1 high), so the activations
 * are interleaved to match (once per token, shared by the rows). */
template <> struct q8k<MR_TYPE_IQ4_XS> {
    static constexpr int STRIDE = 136, BELEMS = 256, STEP = 1024;
    struct P {
        const uint8_t *h, *qs;
        int ib;
    };
    struct W {
        float d;
        int sc;
        uint32_t v[8];
    };
    struct X {
        uint32_t v[8];
        float d;
    };
    static __host__ __device__ __forceinline__ bool active(int s, int lane, int64_t nblk)
    {
        return 4 * (int64_t)s + (lane >> 3) < nblk;
    }
    /* code book values of the 4 nibbles in the low 16 bits of s */
    static __host__ __device__ __forceinline__ uint32_t look(uint32_t s)
    {
        /* the code book as bytes, 4 per word (cu_quant.cuh) */
        const uint32_t lo = q8_perm(MR_IQ4NL_W0, MR_IQ4NL_W1, s & 0x7777u);
        const uint32_t hi = q8_perm(MR_IQ4NL_W2, MR_IQ4NL_W3, s & 0x7777u);
        return q8_perm(lo, hi, ((s & 0x8888u) >> 1) | 0x3210u);
    }
    static __host__ __device__ __forceinline__ void wptr(const uint8_t *row, int lane, P &p)
    {
        p.ib = lane & 7;
        p.h = row + STRIDE * (lane >> 3);
        p.qs = p.h + 8 + 16 * p.ib;
        q8_pin(p.h);
        q8_pin(p.qs);
    }
    static __host__ __device__ __forceinline__ void load_w(const P &p, size_t so, W &w)
    {
        const uint32_t h = q8_ld32(p.h + so), sl = q8_ld32(p.h + so + 4);
        const uint8_t *qs = p.qs + so;
        Q8_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t q = q8_ld32(qs + 4 * i);
            w.v[2 * i] = look(q);
            w.v[2 * i + 1] = look(q >> 16);
        }
        w.d = q8_h2f(h);
        w.sc = (int)(((sl >> (4 * p.ib)) & 15) | (((h >> (16 + 2 * p.ib)) & 3) << 4)) - 32;
    }
    static __host__ __device__ __forceinline__ void xptr(const mr_q8act &xa, int64_t row, int lane, q8xp &p)
    {
        q8_xptr(xa, row, 32 * lane, p);
    }
    static __host__ __device__ __forceinline__ void load_x(const q8xp &p, int64_t off, X &x)
    {
        const uint4 a = q8_ldx16(p.q + off), b = q8_ldx16(p.q + off + 16);
        const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
        Q8_UNROLL
        for (int i = 0; i < 4; i++) {
            x.v[2 * i] = q8_perm(av[i], bv[i], 0x5140u);
            x.v[2 * i + 1] = q8_perm(av[i], bv[i], 0x7362u);
        }
        x.d = q8_ldf<float>(p.d + off / 32);
    }
    static __host__ __device__ __forceinline__ float dot(const W &w, const X &x, float acc)
    {
        int q = 0;
        Q8_UNROLL
        for (int i = 0; i < 8; i++) q = q8_dp4a(w.v[i], x.v[i], q);
        /* |q| <= 32 * 127 * 127 and |sc| <= 32: < 2^24, exact as a float */
        return fmaf(w.d, x.d * (float)(w.sc * q), acc);
    }
};

#endif

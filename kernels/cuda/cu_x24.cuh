/* The 22-bit-activation matvec's device parts (cu_mvx24.cu: plain
 * products; cu_moex24.cu: expert products): the input planes, their
 * quantization, and one lane's unit of weights against NT tokens.  Both
 * kernels sum a (row, token) the same way: a lane's units in order, each
 * unit's scaling with its rounding spelled out, then a warp sum.
 *
 * Types: Q4_K, Q6_K (the 8B / 30B-A3B shapes), IQ4_XS (the 35B-A3B hybrid,
 * experts included) and Q8_0 (the 9B hybrid).  A unit is 32 weights of one
 * row; its integer sums against the planes must be exact, so that a
 * token's result does not depend on how it was grouped.  The input q is in
 * [-(2^21 - 1), 2^21 - 1]: plane hi in [-32, 31], mid and lo in [0, 255],
 * and any sum over c columns of w (q - lo) or w q is at most |w|max c 2^21:
 *   - Q4_K: w 0..15, sums of 16 columns: < 2^29, int32 (xs_join);
 *   - Q6_K: w 0..63, sums of 8 columns: < 2^30, and the -32 sum q term
 *     (32 * 8 * 2^21 = 2^29) keeps the difference below 2^31, int32;
 *   - IQ4_XS: w the code book values -127..113, Q8_0: w -128..127, one
 *     scale over 32 columns: the sum reaches 128 * 32 * 2^21 = 2^33, past
 *     int32.  The plane sums stay small (|hi sum| <= 128 * 32 * 32 = 2^17,
 *     |mid sum|, |lo sum| <= 128 * 255 * 32 < 2^20, so 256 mid + lo <
 *     2^29 in int32), and the join 65536 hi + (256 mid + lo) is done in
 *     int64 and rounded to float once (xs_dot32s).  Splitting the unit
 *     into 8-column int32 sums would fit too, at four float scalings a
 *     unit instead of one. */
#ifndef MR_CU_X24_CUH
#define MR_CU_X24_CUH

#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_mvq8.cuh" /* q8_dp4a_us, q8_ld32, q8_h2f; MR_IQ4NL_W* (cu_quant.cuh) */

#define XS_WARPS 8 /* warps a block at most */
#define XS_COLS_MAX 13312 /* widest input quantized into shared memory (48 KB) */
#define XS_QMAX 2097151.0f /* 2^21 - 1 */
#define XS_QU 4 /* input rounds whose loads are in flight together */
/* blocks of the expert kernel (cu_moex24.cu k_moex24, 128 threads) an SM:
 * its launch bounds, so at most 128 registers, which is all 4 leave */
#define XM_MIN_BLOCKS 4

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

/* The same with signed weights (IQ4_XS code book values, Q8_0 quants):
 * against the signed high plane, and against the unsigned middle and low
 * ones. */
__device__ __forceinline__ int xs_dps_hi(uint32_t w, uint32_t x, int c) { return __dp4a((int)w, (int)x, c); }
__device__ __forceinline__ int xs_dps_lo(uint32_t w, uint32_t x, int c)
{
    int r;
    asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(x), "r"(c));
    return r;
}

/* Float steps of a unit's scaling with their rounding fixed: the compiler
 * neither fuses nor splits them, so every instance (any R, NT) rounds a
 * token's sums the same way. */
__device__ __forceinline__ float xs_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float xs_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }

/* Word k of a 16-byte run. */
__device__ __forceinline__ uint32_t xs_w(const uint4 &v, int k)
{
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* The sum over the three planes: 65536 hi + 256 mid + lo (exact in int32:
 * the callers' sums are below 2^31, see the top). */
__device__ __forceinline__ int xs_join(const int *p) { return p[0] * 65536 + p[1] * 256 + p[2]; }

/* 32 signed weights against 32 columns of one token's planes: w[0..3] the
 * 16 columns of xa (word k: columns 4k .. 4k + 3), w[4..7] the 16 of xb.
 * The sum can pass 2^31 (see the top): joined in int64, exactly, and
 * rounded to float once. */
__device__ __forceinline__ float xs_dot32s(const uint32_t *w, const uint4 *xa, const uint4 *xb)
{
    int p[3] = {0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        p[0] = xs_dps_hi(w[k], xs_w(xa[0], k), p[0]);
        p[1] = xs_dps_lo(w[k], xs_w(xa[1], k), p[1]);
        p[2] = xs_dps_lo(w[k], xs_w(xa[2], k), p[2]);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        p[0] = xs_dps_hi(w[4 + k], xs_w(xb[0], k), p[0]);
        p[1] = xs_dps_lo(w[4 + k], xs_w(xb[1], k), p[1]);
        p[2] = xs_dps_lo(w[4 + k], xs_w(xb[2], k), p[2]);
    }
    return __ll2float_rn((long long)p[0] * 65536 + (p[1] * 256 + p[2]));
}

/* The IQ4_NL code book values (int8) of the 8 nibbles of an IQ4_XS qs word
 * (byte k: column k in its low nibble, column k + 16 in its high one), in
 * column order: *lo columns 0..3, *hi columns 16..19.  Byte permutes with
 * the book in registers (cu_quant.cuh's four words, as mr_lut16): the
 * low 3 bits of an index pick one of entries 0-7 and one of 8-15 (the
 * selector's bit 3, the hardware's sign-replicate mode, is cleared), bit
 * 3 then picks between the two.  The selector takes the nibbles in place
 * (columns 0, 16, 1, 17 from the low half-word, 2, 18, 3, 19 from the
 * high one) and two last permutes put them in column order: 8 permutes
 * and ~7 shifts and masks for 8 weights, against ~20 instructions for
 * mr_iq4nl4 twice (which packs each selector first). */
__device__ __forceinline__ void xs_iq4nl8(uint32_t q, uint32_t *lo, uint32_t *hi)
{
    const uint32_t s = q & 0x77777777u;
    const uint32_t h = ((q >> 1) & 0x44444444u) | 0x32103210u; /* byte n from the first lookup or the second */
    const uint32_t a0 = __byte_perm(MR_IQ4NL_W0, MR_IQ4NL_W1, s), b0 = __byte_perm(MR_IQ4NL_W2, MR_IQ4NL_W3, s);
    const uint32_t a1 = __byte_perm(MR_IQ4NL_W0, MR_IQ4NL_W1, s >> 16);
    const uint32_t b1 = __byte_perm(MR_IQ4NL_W2, MR_IQ4NL_W3, s >> 16);
    const uint32_t v0 = __byte_perm(a0, b0, h), v1 = __byte_perm(a1, b1, h >> 16); /* columns 0,16,1,17 / 2,18,3,19 */
    *lo = __byte_perm(v0, v1, 0x6420u);
    *hi = __byte_perm(v0, v1, 0x7531u);
}

/* Sub-block j's 6-bit scale ls of an IQ4_XS block from its first 8 bytes
 * hd (d, scales_h, scales_l): the weights' scale is d (ls - 32). */
__device__ __forceinline__ uint32_t xs_iq4_ls(const uint2 &hd, int j)
{
    return ((hd.y >> (4 * j)) & 15) | (((hd.x >> (16 + 2 * j)) & 3) << 4);
}

/* The int8 tensor-core kernels' view of an IQ4_XS block (cu_moemma.cu's
 * decode products, cu_moemmp.cu's prompt products): a lane's words of one
 * row, per sub-block j its qs word 16 j + 4c (bytes l = 4c .. 4c + 3:
 * columns l in the low nibbles, l + 16 in the high ones, which are the
 * m16n8k32 fragment's columns of lane c) and the header. */
struct xs_iq4w {
    uint32_t q[8];
    uint2 hd;
};

__device__ __forceinline__ void xs_iq4w_load(const uint8_t *blk, int c, xs_iq4w &w)
{
    w.hd = __ldg((const uint2 *)blk);
#pragma unroll
    for (int j = 0; j < 8; j++) w.q[j] = __ldg((const uint32_t *)(blk + 8 + 16 * j + 4 * c));
}

/* A warp's 256 input columns (lane l: v, columns 8l .. 8l + 7) for int8
 * planes: the absolute maximum *m and 1 / its step (qmax / m, 0 for a zero
 * block) in *inv; true where the block holds a NaN or an infinity.  For
 * floats that are not NaN the order of |x|'s bits is the order of |x|, and
 * NaN or an infinity has the largest (>= 0x7f800000), so one integer
 * maximum over the warp gives both. */
__device__ __forceinline__ bool xs_absmax256(const float (&v)[8], float qmax, float *m, float *inv)
{
    uint32_t mb = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) mb = max(mb, __float_as_uint(v[i]) & 0x7fffffffu);
    mb = __reduce_max_sync(0xffffffffu, mb);
    *m = __uint_as_float(mb);
    *inv = *m > 0.0f ? qmax / *m : 0.0f;
    return mb >= 0x7f800000u;
}

/* A plane's sums over the 8 sub-blocks of 32 columns (Q4_K's mins' term),
 * from lane l's 8 digits (w0, w1: columns 8l .. 8l + 7, signed bytes) over
 * the four lanes of sub-block j = l / 4: |S| <= 32 * 128, stored as
 * balanced base-256 digits S = 256 hi + lo (hi in [-16, 16]) in the 16
 * bytes at o + off: lo of sub-blocks 0..3, hi of 0..3, lo of 4..7, hi of
 * 4..7, so that lane c < 2 of an MMA finds its B words at 8c.  A whole
 * warp. */
__device__ __forceinline__ void xs_plane_sums(uint32_t w0, uint32_t w1, uint8_t *o, size_t off, int lane)
{
    int S = __dp4a((int)w0, 0x01010101, __dp4a((int)w1, 0x01010101, 0));
    S += __shfl_xor_sync(0xffffffffu, S, 1);
    S += __shfl_xor_sync(0xffffffffu, S, 2);
    if ((lane & 3) == 0) {
        const int j = lane >> 2;
        uint8_t *b = o + off + 8 * (j >> 2) + (j & 3);
        b[0] = (uint8_t)S;
        b[4] = (uint8_t)((S + 128) >> 8);
    }
}

/* Quantizes the row x (cols floats) into shared memory, all threads of the
 * block (q = rint(x * ((2^21 - 1) / absmax)), ties to even; d = absmax /
 * (2^21 - 1), both quotients IEEE); 4 consecutive threads a 32-column
 * group (cols % 256 == 0, so a warp is always whole in the loop); QU: rounds
 * whose loads are in flight together (fewer registers: see k_moex24 EARLY).  A group with a NaN or an infinity
 * gets d = NaN: its products are NaN, as with float activations. */
template <int QU = XS_QU>
__device__ __forceinline__ void xs_quantize(const float *__restrict__ x, int cols, uint8_t *sh, int first,
                                            int step)
{
    float *dq = xs_d(sh, cols);
    int *sq = xs_sq(sh, cols);
    const int n8 = cols / 8;
    /* the loads of QU rounds first, then their work: one memory round
     * trip for up to QU * 2048 columns instead of one a round */
    for (int base = first; base < n8; base += QU * step) {
        float4 va[QU], vb[QU];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int g8 = base + u * step;
            if (g8 < n8) {
                va[u] = __ldg((const float4 *)x + 2 * g8);
                vb[u] = __ldg((const float4 *)x + 2 * g8 + 1);
            }
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
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
            if (a.n_sub > 3 && r >= a.sub_rows[2]) {
                r -= a.sub_rows[2];
                s = 3;
            }
        }
    }
    const mr_cu_mvjob j = a.n_sub > 1 ? mr_cu_mv_subjob(a, s) : a;
    *W = j.W + (size_t)r * a.row_bytes;
    *y = j.y + r;
    *ys = j.rows;
}

/* Q4_K and Q6_K decode batches on the tensor cores (cu_mvx24mma.cu): n
 * tokens (planes at xg) of the job a's total_rows rows, the bits of the
 * one-token kernel. */
void mr_cu_x24_mma(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int n);
void mr_cu_x24_mma_q6k(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int n);
/* whether the kernel of type T takes cols columns (its shared memory); at
 * backend creation, the shared memory their launches may ask for */
bool mr_cu_x24_mma_ok(const mr_cu_ctx *c, int T, int64_t cols);
bool mr_cu_x24_mma_optin(int bytes);

/* The planes of rows x (rows of them, cols apart) in c->scratch_x24,
 * xs_xbytes(cols) apart, quantized by a small kernel of their own; the
 * buffer is sized for max_rows rows (the largest decode batch of the
 * caller), so that growing batches do not reallocate it (a reallocation
 * drops the cached graphs).  NULL, nothing launched, on a failure
 * (recorded).  One buffer for every x24 product: each call's kernels wait
 * for the previous ones (PDL waits first), so a call never overwrites
 * planes still being read. */
const uint8_t *mr_cu_x24_planes(mr_cu_ctx *c, const float *x, int rows, int64_t cols, int max_rows);

/* Whether the kernels read type t from the padded copy of cu_fast.cu
 * (w->priv: Q6_K's 212-byte blocks, Q8_0's 36-byte ones with the quants
 * 4-byte aligned) rather than from the GGUF blocks (Q4_K 144 bytes, 16-byte
 * aligned; IQ4_XS 136, 8-byte aligned). */
static inline bool xs_padded(int t) { return t == MR_TYPE_Q6_K || t == MR_TYPE_Q8_0; }

/* The types the kernels take. */
static inline bool xs_has(int t)
{
    return t == MR_TYPE_Q4_K || t == MR_TYPE_Q6_K || t == MR_TYPE_IQ4_XS || t == MR_TYPE_Q8_0;
}

/* The job of m matrices (1..MR_CU_MV_SUBS) of one type and width over x
 * into y[]: read from the GGUF blocks or the padded copy (xs_padded);
 * sub-matrices filled in for m > 1.  *total: their rows in all, *rows_max:
 * the most of any. */
static inline mr_cu_mvjob xs_job(const mr_weight *const *w, float *const *y, int m, const float *x,
                                 int64_t *total, int64_t *rows_max)
{
    /* the source first, then the job: the order in which a call's
     * arguments are evaluated is unspecified, and the row stride passed by
     * value could be read before the call that sets it */
    size_t rb = 0;
    const uint8_t *W0 = (const uint8_t *)mr_cu_x24_source(w[0], &rb);
    mr_cu_mvjob a = mr_cu_mvjob_plain(W0, rb, w[0], x, y[0]);
    a.n_sub = m > 1 ? m : 0;
    *total = *rows_max = 0;
    for (int s = 0; s < m; s++) {
        size_t rbs = 0;
        a.sub_W[s] = (const uint8_t *)mr_cu_x24_source(w[s], &rbs);
        a.sub_y[s] = y[s];
        a.sub_rows[s] = w[s]->rows;
        *total += w[s]->rows;
        if (w[s]->rows > *rows_max) *rows_max = w[s]->rows;
    }
    return a;
}

/* A Q4_K unit's share of a row's sum, in three steps that every caller
 * takes in this order, so that all of them round alike (the matvec units
 * through xs_q4k_scale; the tensor-core kernel, cu_mvx24mma.cu, with the
 * first two hoisted out of its unit and token loops, which changes no
 * operand of any rounding):
 *   xs_q4k_sm: the scales and mins of sub-blocks 2j, 2j + 1 from the block
 *     header hd (d, dmin, 12 bytes of 6-bit scales and mins), as floats
 *     (exact: integers below 64);
 *   xs_q4k_tok: those times the input's scales da, db of the unit's two
 *     runs (one rounding each);
 *   xs_q4k_add: acc plus the share, from the exact integer sums ia, ib of
 *     the two 16-column runs against the input, the sums of its integers
 *     qa, qb over those runs, and the block's d and dmin. */
struct xs_q4k_f { float sa, sb, ma, mb; }; /* sub-block 2j: a, 2j + 1: b */
/* The 6-bit scales SC and mins M of sub-blocks 0..3 (lo) or 4..7 (byte i:
 * sub-block i or 4 + i) of the block header hd: upstream get_scale_min_k4,
 * four at a time, bytes 0..3 from the low 6 bits of s0 / s1, bytes 4..7
 * from s2's nibbles and the top 2 bits of s0 / s1. */
__device__ __forceinline__ void xs_q4k_bytes(const uint4 &hd, bool lo, uint32_t &SC, uint32_t &M)
{
    const uint32_t s0 = hd.y, s1 = hd.z, s2 = hd.w;
    SC = lo ? (s0 & 0x3F3F3F3Fu) : ((s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u));
    M = lo ? (s1 & 0x3F3F3F3Fu) : (((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u));
}
__device__ __forceinline__ xs_q4k_f xs_q4k_sm(const uint4 &hd, int j)
{
    uint32_t SC, M;
    xs_q4k_bytes(hd, j < 2, SC, M);
    const int sh = 16 * (j & 1);
    return {(float)((SC >> sh) & 0xff), (float)((SC >> (sh + 8)) & 0xff), (float)((M >> sh) & 0xff),
            (float)((M >> (sh + 8)) & 0xff)};
}
__device__ __forceinline__ xs_q4k_f xs_q4k_tok(const xs_q4k_f &s, float da, float db)
{
    return {xs_mul(s.sa, da), xs_mul(s.sb, db), xs_mul(s.ma, da), xs_mul(s.mb, db)};
}
__device__ __forceinline__ float xs_q4k_add(const xs_q4k_f &p, float d, float dm, int ia_i, int ib_i, float qa,
                                            float qb, float acc)
{
    const float ia = (float)ia_i, ib = (float)ib_i;
    /* rounding spelled out (xs_fma, xs_mul): left to the compiler, the
     * contraction into fused multiply-adds may differ between instances,
     * and a token's bits with them */
    const float sx = xs_fma(p.sa, ia, xs_mul(p.sb, ib));
    const float mx = xs_fma(p.ma, qa, xs_mul(p.mb, qb));
    return xs_fma(d, sx, xs_fma(-dm, mx, acc));
}

/* The three steps at once: unit j of the block with header hd, the input's
 * scales da, db and integer sums qa, qb of the unit's runs. */
__device__ __forceinline__ float xs_q4k_scale(const uint4 &hd, int j, int ia_i, int ib_i, float da, float db,
                                              float qa, float qb, float acc)
{
    return xs_q4k_add(xs_q4k_tok(xs_q4k_sm(hd, j), da, db), q8_h2f(hd.x), q8_h2f(hd.x >> 16), ia_i, ib_i, qa, qb,
                      acc);
}

/* A Q6_K quarter's step (8 columns of one scale): r plus sc dx times the
 * exact sum s of w q over the quarter less 32 times the sum qs of q (the
 * quants are w - 32); a unit's share is d times r over its four quarters in
 * order, from r = 0 (xs_unit<Q6_K>; the tensor-core kernel calls the same
 * step). */
__device__ __forceinline__ float xs_q6k_step(float sc, float dx, int s, int qs, float r)
{
    /* sum (w - 32) q = sum w q - 32 sum q, exact */
    return xs_fma(xs_mul(sc, dx), (float)(s - qs), r);
}

/* One lane's unit (32 weights of one block) of R rows: p[i] the block in
 * row i (global memory), u the unit in the block, c0 the block's first
 * column, xt[t] token t's planes; acc[t R + i] += the unit's part of row i for
 * token t. */
template <int T, int R, int NT> struct xs_unit;

/* Q4_K (GGUF blocks: d, dmin, 12 bytes of 6-bit scales and mins, qs at
 * +16): unit u = 2j + h takes the 16 qs bytes of half h of group j: low
 * nibbles are columns 64j + 16h + 0..15 (sub-block 2j), high nibbles the
 * same 32 columns on (sub-block 2j + 1). */
template <int R, int NT> struct xs_unit<MR_TYPE_Q4_K, R, NT> {
struct raw { uint4 hd[R], qv[R]; }; /* the unit's words of each row: header, quants */
static __device__ __forceinline__ void load(const uint8_t *const *p, int u, raw &w)
{
    const int j = u >> 1, h = u & 1;
#pragma unroll
    for (int i = 0; i < R; i++) {
        w.hd[i] = __ldg((const uint4 *)p[i]);
        w.qv[i] = __ldg((const uint4 *)(p[i] + 16 + 32 * j + 16 * h));
    }
}
static __device__ __forceinline__ void run(const uint8_t *const *p, int u, const uint8_t *const *xt, int cols,
                                           int c0, float *acc)
{
    const int j = u >> 1, h = u & 1;
    const int ca = c0 + 64 * j + 16 * h, cb = ca + 32;
    raw w;
    /* load's loop written out: calling load here reorders the index
     * arithmetic, and ptxas' output of the measured instances with it */
#pragma unroll
    for (int i = 0; i < R; i++) {
        w.hd[i] = __ldg((const uint4 *)p[i]);
        w.qv[i] = __ldg((const uint4 *)(p[i] + 16 + 32 * j + 16 * h));
    }
    dots(w, j, ca, cb, xt, cols, acc);
}
static __device__ __forceinline__ void dot(const raw &w, int u, const uint8_t *const *xt, int cols, int c0,
                                           float *acc)
{
    const int j = u >> 1, h = u & 1;
    const int ca = c0 + 64 * j + 16 * h, cb = ca + 32;
    dots(w, j, ca, cb, xt, cols, acc);
}
static __device__ __forceinline__ void dots(const raw &w, int j, int ca, int cb, const uint8_t *const *xt, int cols,
                                            float *acc)
{
    const uint4 *hd = w.hd, *qv = w.qv;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint8_t *xs = xt[t];
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
            acc[t * R + i] = xs_q4k_scale(hd[i], j, xs_join(a), xs_join(bb), da, db, qa, qb, acc[t * R + i]);
        }
    }
}
};

/* Q6_K quants 0..63 of four positions l .. l + 3 of half n in each quarter
 * qq (columns 128n + 32qq + l ..): from the words ql[64n + l] (qa),
 * ql[64n + 32 + l] (qb) and qh[32n + l] (h). */
__device__ __forceinline__ void xs_q6k_words(uint32_t qa, uint32_t qb, uint32_t h, uint32_t (&w)[4])
{
    w[0] = (qa & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u);
    w[1] = (qb & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u);
    w[2] = ((qa >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u);
    w[3] = ((qb >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u);
}

/* Q6_K (padded 212-byte blocks: ql 128, qh 64, sc 16, d): unit u = 4n + k
 * takes positions l = 8k .. 8k + 7 of half n (128 columns): from
 * ql[64n + l], ql[64n + 32 + l] and qh[32n + l] the four quarters
 * 128n + 32qq + l, qq = 0..3, each with its own scale. */
template <int R, int NT> struct xs_unit<MR_TYPE_Q6_K, R, NT> {
static __device__ __forceinline__ void run(const uint8_t *const *p, int u, const uint8_t *const *xt, int cols,
                                           int c0, float *acc)
{
    const int n = u >> 2, l0 = 8 * (u & 3);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint8_t *xs = xt[t];
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
                uint32_t w[4];
                xs_q6k_words(qa, qb, h, w);
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
                r = xs_q6k_step(sc, dx[qq], xs_join(acc3[qq]), qs[qq], r);
            }
            acc[t * R + i] = xs_fma(d, r, acc[t * R + i]); /* explicit rounding: see Q4_K */
        }
    }
}
};

/* The signed-weight units (IQ4_XS, Q8_0): 32 columns from ca, R rows of
 * eight quant words w[i] with one scale ds[i] each, against NT tokens'
 * planes: acc[t R + i] += (ds[i] dx) (w[i] . x), rounded as spelled. */
template <int R, int NT>
__device__ __forceinline__ void xs_tokens32(const uint32_t (&w)[R][8], const float (&ds)[R], const uint8_t *const *xt,
                                            int cols, int ca, float *acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint8_t *xs = xt[t];
        uint4 xa[3], xb[3]; /* planes hi, mid, lo of columns 0..15 and 16..31 */
#pragma unroll
        for (int k = 0; k < 3; k++) {
            xa[k] = *(const uint4 *)(xs + k * cols + ca);
            xb[k] = *(const uint4 *)(xs + k * cols + ca + 16);
        }
        const float dx = xs_d((uint8_t *)xs, cols)[ca / 32];
#pragma unroll
        for (int i = 0; i < R; i++) /* explicit rounding: see Q4_K */
            acc[t * R + i] = xs_fma(xs_mul(ds[i], dx), xs_dot32s(w[i], xa, xb), acc[t * R + i]);
    }
}

/* IQ4_XS (GGUF blocks of 136 bytes: d, scales_h (2 bits a sub-block),
 * scales_l (4 bits a sub-block), qs at +8): unit u is sub-block u, columns
 * 32u .. 32u + 31, scale d (ls - 32); its 16 qs bytes (two 8-byte loads:
 * the blocks are only 8-byte aligned) hold column k in the low nibble of
 * byte k and column k + 16 in the high one, indices into the code book
 * (xs_iq4nl8).  Each row's weights are looked up once for all NT tokens. */
template <int R, int NT> struct xs_unit<MR_TYPE_IQ4_XS, R, NT> {
struct raw { uint2 hd[R], qa[R], qb[R]; }; /* the unit's words of each row: header, quants */
static __device__ __forceinline__ void load(const uint8_t *const *p, int u, raw &r)
{
#pragma unroll
    for (int i = 0; i < R; i++) {
        r.hd[i] = __ldg((const uint2 *)p[i]);
        r.qa[i] = __ldg((const uint2 *)(p[i] + 8 + 16 * u));
        r.qb[i] = __ldg((const uint2 *)(p[i] + 16 + 16 * u));
    }
}
/* a row's code book values w (words 0..3 columns 0..15, 4..7 columns
 * 16..31) and scale ds from its words */
static __device__ __forceinline__ void look(const uint2 &hd, const uint2 &qa, const uint2 &qb, int u,
                                            uint32_t (&w)[8], float &ds)
{
    xs_iq4nl8(qa.x, &w[0], &w[4]);
    xs_iq4nl8(qa.y, &w[1], &w[5]);
    xs_iq4nl8(qb.x, &w[2], &w[6]);
    xs_iq4nl8(qb.y, &w[3], &w[7]);
    const uint32_t ls = ((hd.y >> (4 * u)) & 15) | (((hd.x >> (16 + 2 * u)) & 3) << 4);
    ds = xs_mul(q8_h2f(hd.x), (float)((int)ls - 32)); /* exact: 11 by 6 bits */
}
static __device__ __forceinline__ void run(const uint8_t *const *p, int u, const uint8_t *const *xt, int cols,
                                           int c0, float *acc)
{
    const int ca = c0 + 32 * u;
    uint32_t w[R][8];
    float ds[R];
#pragma unroll
    for (int i = 0; i < R; i++) { /* load's words, a row at a time */
        const uint2 hd = __ldg((const uint2 *)p[i]);
        const uint2 qa = __ldg((const uint2 *)(p[i] + 8 + 16 * u)), qb = __ldg((const uint2 *)(p[i] + 16 + 16 * u));
        look(hd, qa, qb, u, w[i], ds[i]);
    }
    xs_tokens32<R, NT>(w, ds, xt, cols, ca, acc);
}
static __device__ __forceinline__ void dot(const raw &r, int u, const uint8_t *const *xt, int cols, int c0,
                                           float *acc)
{
    uint32_t w[R][8];
    float ds[R];
#pragma unroll
    for (int i = 0; i < R; i++) look(r.hd[i], r.qa[i], r.qb[i], u, w[i], ds[i]);
    xs_tokens32<R, NT>(w, ds, xt, cols, c0 + 32 * u, acc);
}
};

/* Q8_0 (the padded copy: 36-byte blocks, d at 0, the 32 int8 quants at +4,
 * 8 blocks a 256-column step): unit u is block u.  The block starts 4 bytes
 * past an 8-byte boundary when u is odd, so five 8-byte loads from the
 * boundary at or before it (40 bytes, inside the step) cover it either
 * way, and the words are picked by u's parity: 5 loads instead of 9. */
template <int R, int NT> struct xs_unit<MR_TYPE_Q8_0, R, NT> {
static __device__ __forceinline__ void run(const uint8_t *const *p, int u, const uint8_t *const *xt, int cols,
                                           int c0, float *acc)
{
    const int ca = c0 + 32 * u, o = u & 1;
    uint32_t w[R][8]; /* quants: words 0..3 columns 0..15, 4..7 columns 16..31 */
    float d[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        const uint8_t *b = p[i] + 36 * u - 4 * o;
        uint32_t v[10];
#pragma unroll
        for (int k = 0; k < 5; k++) {
            const uint2 l = __ldg((const uint2 *)(b + 8 * k));
            v[2 * k] = l.x;
            v[2 * k + 1] = l.y;
        }
        d[i] = q8_h2f(o ? v[1] : v[0]);
#pragma unroll
        for (int k = 0; k < 8; k++) w[i][k] = o ? v[k + 2] : v[k + 1];
    }
    xs_tokens32<R, NT>(w, d, xt, cols, ca, acc);
}
};

/* Per layout the kernels read: STRIDE, the bytes of a 256-column step of a
 * row; R1, R2, R4, R8, the rows a warp takes at a time with 1, 2, 4 or 8
 * tokens a launch.  More rows a warp share each load of the input planes,
 * as far as the 128 registers allow: Q4_K's and Q6_K's were timed
 * (docs/GPU-NOTES.md 33; Q6_K takes more registers a unit); IQ4_XS's and
 * Q8_0's are ptxas' (sm_90a): no spills at 1-4 tokens, the fewest at 8
 * (Q8_0 spills at 4 rows and 2 tokens, so 2). */
template <int T> struct xs_type;
template <> struct xs_type<MR_TYPE_Q4_K> {
    static constexpr int STRIDE = 144, R1 = 4, R2 = 4, R4 = 2, R8 = 2;
};
template <> struct xs_type<MR_TYPE_Q6_K> {
    static constexpr int STRIDE = 212, R1 = 4, R2 = 2, R4 = 1, R8 = 1;
};
template <> struct xs_type<MR_TYPE_IQ4_XS> {
    static constexpr int STRIDE = 136, R1 = 4, R2 = 4, R4 = 2, R8 = 2;
};
template <> struct xs_type<MR_TYPE_Q8_0> {
    static constexpr int STRIDE = 8 * 36, R1 = 4, R2 = 2, R4 = 2, R8 = 1;
};

#endif

/* Expert products of decode (matmul_id, 1..MR_CU_GEMM_MIN_TOKENS - 1
 * tokens) on the int8 tensor cores, with the three planes of a 22-bit
 * input as the columns of the MMA: Q4_K (the 30B-A3B's gate, up and odd
 * layers' down) and Q6_K (its even layers' down); the default where the
 * 22-bit expert kernel would take the matrices (MEMRA_CUDA_XMM=0:
 * cu_moex24.cu's dp4a kernel; =q4k: Q4_K only), and IQ4_XS rows of at
 * most 512 columns (the 35B-A3B's down, -40% at 16 tokens in run 158; =2:
 * without them; cu_backend.cu has the runs that chose the default); =iq4
 * every IQ4_XS matrix (its gate/up slower at 1 and 16 tokens).
 *
 * Why: at 16 tokens an expert of the 30B-A3B has ~1.6 pairs, and the dp4a
 * units of cu_moex24.cu spend ~2.5 instructions a weight and pair (three
 * planes, the scale decode, the join) while reading ~1.4 TB/s (GPU-NOTES
 * 67).  The tensor-core tiles tried twice (runs 118, 150) put tokens on the
 * MMA's columns and the planes in three MMAs, so every tile paid a token
 * side, partials and barriers for 1.6 tokens.  Here the 8 columns of one
 * m16n8k32 MMA are (pair, plane): pair 0's hi, mid, lo planes in columns
 * 0..2, pair 1's in 4..6, 3 and 7 zero; one MMA is 16 weight rows by 32
 * columns (one Q4_K sub-block) against two pairs, exact in int32.
 *
 * A warp owns a tile of 16 rows (plain) or 8 rows of the gate and the same
 * 8 of the up matrix (A rows 8..15), walks the whole row, and keeps every
 * sum in registers: no partials parked, no barrier but the block's one a
 * chunk of pairs (the planes); its weights stream through a ring of its
 * own in shared memory (cp.async).  Per 256-column block
 * (one Q4_K super-block and one input scale): per sub-block j an MMA of
 * the quants (4-bit, unsigned) times the planes, scaled by the row's 6-bit
 * sc_j as integers (IMAD), and for the 6-bit mins m_j two MMAs a block,
 * the 8 mins against the planes' sums over each sub-block (formed once, at
 * quantization); then in float, per (row, pair, plane): f += dx (d M -
 * dmin N).
 * At the end the planes join in float, 65536 hi + 256 mid + lo, across the
 * lanes of a quad.  Integer sums are exact (bounds at xmm_q4k_step and
 * xmm_q6k_half), the float steps are per (row, pair) in a fixed order with
 * their roundings spelled out, so a pair's result does not depend on its
 * batchmates, the chunk it falls in or the tile's other rows: gate/up
 * tiles and plain ones give a row the same bits (kernel-check xmm).
 *
 * The input: each block quantizes its chunk's two pairs' rows into shared
 * memory (no launch of its own: one fewer a product, which a one-token
 * step feels), per 256 columns (d = absmax / (2^21 - 1), q = rint(x / d)),
 * as balanced base-256 digits so that all three planes are int8: q =
 * 65536 hi + 256 mid + lo, mid and lo in [-128, 127], hi in [-32, 32].
 * Every block quantizes a row alike, so the planes do not depend on the
 * block.  That quantization and the set-up before it were a third of a
 * 16-token launch (run 166): a warp's loads now go out together and the
 * digits come from q by shifts and byte permutes. */
#include "kernels/cuda/cu_mma.cuh" /* mr_cp16 */
#include "kernels/cuda/cu_x24.cuh"

#define XMM_WARPS 4 /* warps (tiles) a block (8, run 167: 1-5% slower at 4-64 tokens) */
/* 256-column input blocks a warp loads before it quantizes them: 4 (2,048
 * columns, 4 warps); 2 for Q6_K (768 columns: 6 blocks, at most 2 a warp),
 * whose first weights are in registers meanwhile */
template <int T> constexpr int xmm_qu() { return T == MR_TYPE_Q6_K ? 2 : 4; }
#define XMM_QMAXI 2097151
#define XMM_STAGES 4   /* a warp's 256-column steps of weights in flight */
#define XMM_ROWB 160   /* a tile row's 144 bytes of a step in the ring, padded: conflict-free reads */
#define XMM_STEPB (16 * XMM_ROWB)
#define XMM_BPAD 32    /* between two planes of the block's pairs: conflict-free reads */

/* A block's shared memory: its two pairs' planes (pair q's plane p at (3q +
 * p) (cols + XMM_BPAD)), their input scales (pair q's at dx + q cols / 256),
 * the planes' sub-block sums, then each warp's ring of XMM_STAGES steps. */
__host__ __device__ constexpr size_t xmm_bstride(int64_t cols) { return (size_t)cols + XMM_BPAD; }
__host__ __device__ constexpr size_t xmm_dx_off(int64_t cols) { return 6 * xmm_bstride(cols); }
/* then the planes' sub-block sums (Q4_K's mins): per (pair q, plane p) and
 * 256-column block b, 16 bytes at ((3q + p) nsb + b) 16 */
__host__ __device__ constexpr size_t xmm_sum_off(int64_t cols)
{
    return (xmm_dx_off(cols) + 2 * (size_t)(cols / 256) * 4 + 15) / 16 * 16;
}
__host__ __device__ constexpr size_t xmm_ring_off(int64_t cols)
{
    return xmm_sum_off(cols) + 96 * (size_t)(cols / 256);
}
/* the sums and the ring are Q4_K's alone */
__host__ __device__ constexpr size_t xmm_smem(int T, int64_t cols)
{
    return T == MR_TYPE_Q4_K ? xmm_ring_off(cols) + (size_t)XMM_WARPS * XMM_STAGES * XMM_STEPB : xmm_sum_off(cols);
}

/* 256 columns of an input row (lane l: columns 8l .. 8l + 7 in va, vb) into
 * the planes of a block's pair (plane p at pl + p stride, the same
 * columns) and its scale *d; a whole warp.  A block with a NaN or an
 * infinity gets d = NaN and q = 0: its products are NaN, as with float
 * activations. */
template <bool SUMS>
__device__ __forceinline__ void xmm_quant256(const float4 va, const float4 vb, uint8_t *pl, size_t stride, float *d,
                                             uint8_t *sums, size_t sstride, int lane)
{
    const float v[8] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
    float m, inv;
    const bool bad = xs_absmax256(v, (float)XMM_QMAXI, &m, &inv);
    /* q = 65536 hi + 256 mid + lo with lo, mid in [-128, 127]: lo's byte is
     * q's low byte, mid = (q + 128) >> 8 mod 256 and hi = (q + 32896) >> 16
     * (q + 128 = 65536 hi + 256 mid + (lo + 128), lo + 128 in [0, 255]) */
    int dig[3][8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int q = bad ? 0 : __float2int_rn(v[i] * inv);
        q = min(max(q, -XMM_QMAXI), XMM_QMAXI);
        dig[0][i] = (q + 32896) >> 16;
        dig[1][i] = (q + 128) >> 8;
        dig[2][i] = q;
    }
#pragma unroll
    for (int k = 0; k < 3; k++) {
        const uint32_t w0 = __byte_perm(__byte_perm(dig[k][0], dig[k][1], 0x0040),
                                        __byte_perm(dig[k][2], dig[k][3], 0x0040), 0x5410);
        const uint32_t w1 = __byte_perm(__byte_perm(dig[k][4], dig[k][5], 0x0040),
                                        __byte_perm(dig[k][6], dig[k][7], 0x0040), 0x5410);
        *(uint2 *)(pl + k * stride + 8 * lane) = make_uint2(w0, w1);
        if constexpr (SUMS)
            xs_plane_sums(w0, w1, sums, k * sstride, lane);
    }
    if (lane == 0)
        *d = bad ? __int_as_float(0x7fc00000) : m / (float)XMM_QMAXI;
}

/* The kernel's view of a call: matrix 0 (plain, or the gate) and 1 (the
 * up, or NULL), their outputs (a pair's rows at y + p rows), yo the SwiGLU
 * of the two (NULL: none; it may be y0); the input rows of pair p. */
struct xmm_args {
    const uint8_t *W0, *W1;
    const float *x;
    float *y0, *y1, *yo;
    size_t row_bytes, mat_bytes;
    int rows, cols, n_mats, k, x_slots;
    int tpw; /* row tiles a warp (the MT kernel's; xmm_tpw) */
    const int32_t *ids;
    const int4 *items; /* a batch's chunks (the default): grid y their index; NULL: the slot */
};

__device__ __forceinline__ int xmm_in(const xmm_args &a, int p)
{
    return (p / a.k) * a.x_slots + (a.x_slots > 1 ? p % a.k : 0);
}

/* A warp's share of a chunk's input, QU 256-column blocks at once:
 * block it = it0 + XMM_WARPS u (of the 2 nsb: pair p0's nsb, then p1's)
 * into va[u], vb[u] for u in [U0, U1) (lane l: columns 8l .. 8l + 7;
 * zeros past the end or for a missing pair).  All loads are issued before
 * any is used: one round trip a warp instead of one a block (run 166: the
 * wait for these loads was 15% of the 16-token launch's warp samples, 18% of
 * the one-token one's). */
template <int QU, int U0 = 0, int U1 = QU>
__device__ __forceinline__ void xmm_xload(const xmm_args &a, int p0, int p1, int nsb, int it0, int lane,
                                          float4 (&va)[QU], float4 (&vb)[QU])
{
#pragma unroll
    for (int u = U0; u < U1; u++) {
        const int it = it0 + XMM_WARPS * u, qq = it >= nsb, pp = qq ? p1 : p0;
        va[u] = vb[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (it < 2 * nsb && pp >= 0) {
            const float4 *xr =
                (const float4 *)(a.x + (size_t)xmm_in(a, pp) * a.cols + 256 * (it - qq * nsb) + 8 * lane);
            va[u] = __ldg(xr);
            vb[u] = __ldg(xr + 1);
        }
    }
}

/* The blocks xmm_xload brought into the planes of the block's pairs (pair
 * q's plane p at sh + (3q + p) bs), their scales dxs (0 for a missing pair)
 * and with SUMS their sub-block sums (xmm_sum_off). */
template <bool SUMS, int QU>
__device__ __forceinline__ void xmm_xquant(uint8_t *sh, float *dxs, uint8_t *sums, size_t bs, int p0, int p1,
                                           int nsb, int it0, int lane, const float4 (&va)[QU], const float4 (&vb)[QU])
{
#pragma unroll
    for (int u = 0; u < QU; u++) {
        const int it = it0 + XMM_WARPS * u, qq = it >= nsb, pp = qq ? p1 : p0;
        if (it >= 2 * nsb)
            break;
        if (pp >= 0)
            xmm_quant256<SUMS>(va[u], vb[u], sh + 3 * qq * bs + 256 * (it - qq * nsb), bs, dxs + it,
                               sums + 16 * (3 * qq * nsb + it - qq * nsb), 16 * (size_t)nsb, lane);
        else if (lane == 0)
            dxs[it] = 0.0f;
    }
}

/* One 256-column step's words of a lane: its two A rows' headers (d, dmin,
 * the 12 bytes of scales and mins) and quant words (8 bytes of each 32-byte
 * group: columns 8c .. 8c + 7 of both sub-blocks of the group), from the
 * step's slot of the ring (rows XMM_ROWB apart), and its B column's plane
 * words (the same 8 columns of each sub-block; xr NULL: a zero column). */
struct xmm_step {
    uint4 ha, hb;
    uint2 qa[4], qb[4];
    uint2 xv[8];
    uint2 xs; /* lane c < 2: its column's sub-block sums 4c .. 4c + 3, low and high digits */
};

__device__ __forceinline__ void xmm_read(const uint8_t *slot, int ra, int rb, const uint8_t *xr, const uint8_t *xs,
                                         int c, xmm_step &s)
{
    const uint8_t *pa = slot + ra * XMM_ROWB, *pb = slot + rb * XMM_ROWB;
    s.ha = *(const uint4 *)pa;
    s.hb = *(const uint4 *)pb;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s.qa[i] = *(const uint2 *)(pa + 16 + 32 * i + 8 * c);
        s.qb[i] = *(const uint2 *)(pb + 16 + 32 * i + 8 * c);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) s.xv[j] = xr ? *(const uint2 *)(xr + 32 * j) : make_uint2(0u, 0u);
    s.xs = xr && c < 2 ? *(const uint2 *)(xs + 8 * c) : make_uint2(0u, 0u);
}

__device__ __forceinline__ void xmm_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void xmm_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* A lane's share of copying a step of its warp's tiles into the ring's
 * slot (16 rows of 144 bytes, 9 chunks of 16 a row: chunk lane + 32 u);
 * src[u] the chunk's row at the first tile's step 0, dst[u] its place in a
 * slot, off the step's bytes past src (step b of tile t: t tile bytes +
 * 144 b). */
__device__ __forceinline__ void xmm_fetch(const uint8_t *const *src, const uint32_t *dst, uint32_t slot, size_t off)
{
#pragma unroll
    for (int u = 0; u < 5; u++)
        if (src[u])
            mr_cp16(slot + dst[u], src[u] + off, true);
}

/* One 256-column step of a tile against a lane's two pairs: f[v] += dx
 * (d M - dmin N) for its C values v (0, 1: row a, columns 2c, 2c + 1; 2, 3:
 * row b).  M = sum_j sc_j (q . x)_j, an MMA a sub-block j scaled by IMAD; N =
 * sum_j m_j S_j with S_j the plane's sum over sub-block j (xmm_quant256): an
 * MMA of the 8 mins (k = j: lanes c = 0, 1) against S_j's low digits and one
 * against its high digits, N = 256 Nh + Nl, the same integer as one MMA a
 * sub-block of m_j against the planes (run 166: 8 MMAs and 16 byte permutes
 * a step before).
 *
 * A 32-byte group holds sub-block 2i in its low nibbles and 2i + 1 in its
 * high ones.  The high nibbles go into their MMA in place, masked but not
 * shifted (16 q: one AND a word where a shift and an AND were two; the
 * step's SASS 200 -> 189 instructions, 16 shifts fewer, GPU-NOTES 151), and
 * their scaled sums gather in H = 16 sum_odd sc_j (q . x)_j; then 16 M = 16
 * Ml + H (one IMAD) and d M = (d / 16) (16 M): d / 16, the conversion of 16
 * M and 16 times M's conversion are exact (powers of two, no overflow), so
 * the product is d M's to the bit.  Bounds: a sub-block's plane sum is at
 * most 32 * 15 * 128 < 2^16 (16 times that with the high nibbles in place:
 * < 2^20), times sc < 2^6, over 4 sub-blocks each: Ml < 2^24, H < 2^28, so
 * 16 M < 2^29; N at most 63 * 256 * 128 < 2^21; int32 throughout. */
__device__ __forceinline__ void xmm_q4k_step(const xmm_step &s, int c, float dx, float (&f)[4])
{
    uint32_t sca[2], mna[2], scb[2], mnb[2]; /* sub-blocks 0..3, 4..7 */
    xs_q4k_bytes(s.ha, true, sca[0], mna[0]);
    xs_q4k_bytes(s.ha, false, sca[1], mna[1]);
    xs_q4k_bytes(s.hb, true, scb[0], mnb[0]);
    xs_q4k_bytes(s.hb, false, scb[1], mnb[1]);
    int Ml[4] = {0, 0, 0, 0}, H[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = 2 * i + h, w = j >> 2, sel = j & 3;
            const uint32_t m = h ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
            const uint32_t A[4] = {s.qa[i].x & m, s.qb[i].x & m, s.qa[i].y & m, s.qb[i].y & m};
            int C[4] = {0, 0, 0, 0};
            mr_imma32_us(C, A, s.xv[j].x, s.xv[j].y);
            const int sa = (int)__byte_perm(sca[w], 0u, 0x4440u | sel), sb = (int)__byte_perm(scb[w], 0u, 0x4440u | sel);
            int(&acc)[4] = h ? H : Ml;
            acc[0] += sa * C[0];
            acc[1] += sa * C[1];
            acc[2] += sb * C[2];
            acc[3] += sb * C[3];
        }
    int M16[4];
#pragma unroll
    for (int v = 0; v < 4; v++) M16[v] = 16 * Ml[v] + H[v];
    const uint32_t am = c == 0 ? mna[0] : c == 1 ? mna[1] : 0u, bm = c == 0 ? mnb[0] : c == 1 ? mnb[1] : 0u;
    const uint32_t Am[4] = {am, bm, 0u, 0u};
    int Nl[4] = {0, 0, 0, 0}, Nh[4] = {0, 0, 0, 0}, N[4];
    mr_imma32_us(Nl, Am, s.xs.x, 0u);
    mr_imma32_us(Nh, Am, s.xs.y, 0u);
#pragma unroll
    for (int v = 0; v < 4; v++) N[v] = 256 * Nh[v] + Nl[v];
    const float da = q8_h2f(s.ha.x), dma = q8_h2f(s.ha.x >> 16), db = q8_h2f(s.hb.x), dmb = q8_h2f(s.hb.x >> 16);
    const float da16 = __fmul_rn(da, 0.0625f), db16 = __fmul_rn(db, 0.0625f);
    f[0] = __fmaf_rn(dx, __fmaf_rn(-dma, (float)N[0], __fmul_rn(da16, (float)M16[0])), f[0]);
    f[1] = __fmaf_rn(dx, __fmaf_rn(-dma, (float)N[1], __fmul_rn(da16, (float)M16[1])), f[1]);
    f[2] = __fmaf_rn(dx, __fmaf_rn(-dmb, (float)N[2], __fmul_rn(db16, (float)M16[2])), f[2]);
    f[3] = __fmaf_rn(dx, __fmaf_rn(-dmb, (float)N[3], __fmul_rn(db16, (float)M16[3])), f[3]);
}

/* A block's end for the types without mins (Q6_K, IQ4_XS): f[v] += dx (d
 * M[v]) with row a's d for v 0, 1 and row b's for 2, 3. */
__device__ __forceinline__ void xmm_scale(float (&f)[4], float dx, float da, float db, const int (&M)[4])
{
    f[0] = __fmaf_rn(dx, __fmul_rn(da, (float)M[0]), f[0]);
    f[1] = __fmaf_rn(dx, __fmul_rn(da, (float)M[1]), f[1]);
    f[2] = __fmaf_rn(dx, __fmul_rn(db, (float)M[2]), f[2]);
    f[3] = __fmaf_rn(dx, __fmul_rn(db, (float)M[3]), f[3]);
}

/* The planes of a row joined: 65536 hi + 256 mid + lo (the first two
 * products exact). */
__device__ __forceinline__ float xmm_join(float hi, float mid, float lo)
{
    return __fadd_rn(__fadd_rn(__fmul_rn(65536.0f, hi), __fmul_rn(256.0f, mid)), lo);
}

/* Four Q6_K quants (bytes 0..63) as the signed bytes q - 32: each byte
 * + 128 - 32 without a borrow between bytes, then its top bit flipped. */
__device__ __forceinline__ uint32_t xmm_q6s(uint32_t w) { return ((w | 0x80808080u) - 0x20202020u) ^ 0x80808080u; }

/* A lane's words of half n (128 columns) of a Q6_K block in one row (the
 * padded copy: ql 128, qh 64, sc 16, d at 208): for s = 0, 1 the quants of
 * positions l = 16 s + 4c .. + 3 of the half (ql[64n + l], ql[64n + 32 + l],
 * qh[32n + l]: the four quarters), the half's 8 scales and d. */
struct xmm_q6h {
    uint32_t qa[2], qb[2], h[2], sc[2], d;
};

__device__ __forceinline__ void xmm_q6k_load(const uint8_t *blk, int n, int c, xmm_q6h &w)
{
#pragma unroll
    for (int s = 0; s < 2; s++) {
        w.qa[s] = q8_ld32(blk + 64 * n + 16 * s + 4 * c);
        w.qb[s] = q8_ld32(blk + 64 * n + 32 + 16 * s + 4 * c);
        w.h[s] = q8_ld32(blk + 128 + 32 * n + 16 * s + 4 * c);
    }
    w.sc[0] = q8_ld32(blk + 192 + 8 * n);
    w.sc[1] = q8_ld32(blk + 196 + 8 * n);
    w.d = q8_ld32(blk + 208);
}

/* Half n of a step of a tile (rows a: wa, b: wb) against the lane's B
 * column (xr: its planes at the half's first column + 4c, NULL: zero): M[v]
 * += sc (w - 32) . x over the half's 8 scale groups of 16 columns, one
 * m16n8k16 MMA each (k: the group's columns 4c .. 4c + 3 a lane).  Bounds:
 * a group's plane sum is at most 16 * 32 * 128 = 2^16, times |sc| <= 128,
 * over 16 groups a step: < 2^27. */
__device__ __forceinline__ void xmm_q6k_half(const xmm_q6h &wa, const xmm_q6h &wb, const uint8_t *xr, int (&M)[4])
{
#pragma unroll
    for (int s = 0; s < 2; s++) {
        uint32_t qa[4], qb[4];
        xs_q6k_words(wa.qa[s], wa.qb[s], wa.h[s], qa);
        xs_q6k_words(wb.qa[s], wb.qb[s], wb.h[s], qb);
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const int gi = 2 * qq + s; /* the group's scale in the half */
            int C[4] = {0, 0, 0, 0};
            mr_imma16_ss(C, xmm_q6s(qa[qq]), xmm_q6s(qb[qq]), xr ? *(const uint32_t *)(xr + 32 * qq + 16 * s) : 0u);
            const int sa = (int)(int8_t)((wa.sc[gi >> 2] >> (8 * (gi & 3))) & 0xffu);
            const int sb = (int)(int8_t)((wb.sc[gi >> 2] >> (8 * (gi & 3))) & 0xffu);
            M[0] += sa * C[0];
            M[1] += sa * C[1];
            M[2] += sb * C[2];
            M[3] += sb * C[3];
        }
    }
}

/* A step of a tile (rows a: wa, b: wb; code book values as signed bytes)
 * against the lane's B column (xr: its planes at the step's first column
 * + 4c, NULL: zero): M[v] += (ls_j - 32) (w . x) over the 8 sub-blocks.
 * Bounds: a sub-block's plane sum is at most 32 * 127 * 128 < 2^19, times
 * |ls - 32| <= 32, over 8: < 2^27. */
__device__ __forceinline__ void xmm_iq4_step(const xs_iq4w &wa, const xs_iq4w &wb, const uint8_t *xr, int (&M)[4])
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        uint32_t A[4];
        xs_iq4nl8(wa.q[j], &A[0], &A[2]); /* row a: columns 4c.., 16 + 4c.. */
        xs_iq4nl8(wb.q[j], &A[1], &A[3]);
        int C[4] = {0, 0, 0, 0};
        mr_imma32_ss(C, A, xr ? *(const uint32_t *)(xr + 32 * j) : 0u, xr ? *(const uint32_t *)(xr + 32 * j + 16) : 0u);
        const int sa = (int)xs_iq4_ls(wa.hd, j) - 32, sb = (int)xs_iq4_ls(wb.hd, j) - 32;
        M[0] += sa * C[0];
        M[1] += sa * C[1];
        M[2] += sb * C[2];
        M[3] += sb * C[3];
    }
}

/* A tile's end: the planes of each (row, pair) joined across the lanes of
 * a quad and written (rows ra, rb of pair cp; lane c + 1's first column is
 * the lo plane of lane c's pair, c even).  A whole warp. */
template <bool PAIR>
__device__ __forceinline__ void xmm_store(const xmm_args &a, const float (&f)[4], int c, int cp, int64_t ra,
                                          int64_t rb)
{
    const float loa = __shfl_down_sync(0xffffffffu, f[0], 1), lob = __shfl_down_sync(0xffffffffu, f[2], 1);
    if ((c & 1) || cp < 0)
        return;
    const float ya = xmm_join(f[0], f[1], loa), yb = xmm_join(f[2], f[3], lob);
    const int64_t base = (int64_t)cp * a.rows;
    if (PAIR) {
        if (ra < a.rows) {
            a.y1[base + ra] = yb;
            if (a.yo != a.y0) a.y0[base + ra] = ya;
            if (a.yo) a.yo[base + ra] = mr_silu_mul(ya, yb);
        }
    } else {
        if (ra < a.rows) a.y0[base + ra] = ya;
        if (rb < a.rows) a.y0[base + rb] = yb;
    }
}

/* grid: x the tiles over XMM_WARPS (MT: over XMM_WARPS a.tpw), y the chunk
 * of at most two pairs of one expert (a.items, the default: a decode
 * batch's experts with 3+ pairs take several blocks, not one block walking
 * its chunks while the grid's other blocks end; run 171: 16-token gate/up
 * -15%; blocks past the last chunk exit) or the slot (grp without items:
 * used experts first, blocks of unused slots exit; NULL: one token, y is
 * the pair); the input rows at a.x.  PAIR: tiles of 8 gate and 8 up rows
 * (W1, y1; yo where not NULL).  Shared memory: xmm_smem(T, cols).  Per
 * chunk of two pairs the block quantizes their rows into shared memory
 * once.  Q4_K: each warp streams its tile's weights through its ring,
 * XMM_STAGES - 1 steps ahead (cp.async), so that a warp has ~7 KB in flight
 * instead of the one step a register prefetch holds (runs 152-153, 768 x
 * 2,048: one token 10.6 -> 7.7 us with the planes' launch in both; 16
 * tokens unchanged).  Q6_K (the padded copy, 212-byte blocks: only 4-byte
 * aligned, no 16-byte copies): registers, the next half step's words loaded
 * during this one.
 *
 * MT: a warp walks a.tpw tiles of consecutive rows (decode batches whose
 * rows are whole tiles: xmm_tpw) as one sequence of steps, the Q4_K ring's
 * copies and the Q6_K / IQ4_XS register loads running on into the next
 * tile instead of draining at each tile's end, and the block's quantization
 * of a chunk serves a.tpw times the rows.  A row's sum is the same steps in
 * the same order: the same bits as one tile a warp. */
template <int T, bool PAIR, bool MT>
__global__ void __launch_bounds__(XMM_WARPS * 32, 4)
k_xmm(xmm_args a, const int32_t *__restrict__ grp, int S)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ __align__(16) uint8_t xmm_sh[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    constexpr int RT = PAIR ? 8 : 16; /* rows of each matrix a tile */
    const int tpw = MT ? a.tpw : 1;
    const int64_t r0 = ((int64_t)blockIdx.x * XMM_WARPS + warp) * tpw * RT;
    if ((int64_t)blockIdx.x * XMM_WARPS * tpw * RT >= a.rows) /* the whole block: barriers below */
        return;
    /* the warp's tiles: MT's rows are whole tiles */
    const int ntl = MT ? (int)min((int64_t)tpw, r0 < a.rows ? (a.rows - r0) / RT : 0) : (r0 < a.rows);
    const int slot = (int)blockIdx.y;
    const int cols = a.cols, nsb = cols / 256;
    /* one token: the input row is the pair's whatever its expert, so the
     * loads of a warp's first two blocks (all of them up to 2,048 columns)
     * go out with the id's; more would be live across the set-up below (128
     * registers and spills for Q4_K, against 108) */
    constexpr int QU = xmm_qu<T>();
    float4 va[QU], vb[QU];
    if (!grp)
        xmm_xload<QU, 0, 2>(a, slot, -1, nsb, warp, lane, va, vb);
    int e, np = 1, first = 0, c0 = slot, c1 = -1; /* c0, c1: the first chunk's pairs where known */
    if (grp && a.items) { /* one chunk of two pairs at most: e and both pairs in one load */
        const int4 it = a.items[slot];
        if (it.x < 0)
            return;
        e = it.x;
        c0 = it.y;
        c1 = it.z;
    } else if (grp) {
        if (!mr_cu_grp_slot(grp, S, slot, &e, &first, &np))
            return;
    } else if ((e = a.ids[slot]) < 0 || e >= a.n_mats) { /* one token's bad id: NaN rows */
        const float nan = __int_as_float(0x7fc00000);
        for (int i = lane; i < RT * tpw; i += 32) {
            const int64_t r = r0 + i;
            if (r >= a.rows)
                break;
            const int64_t o = (int64_t)slot * a.rows + r;
            a.y0[o] = nan;
            if (PAIR) {
                a.y1[o] = nan;
                /* what the swiglu op computes from the two NaN rows of a
                 * batch (whose grouping writes them): the same bits */
                if (a.yo) a.yo[o] = mr_silu_mul(nan, nan);
            }
        }
        return;
    }
    const int32_t *list = grp && !a.items ? grp + 2 + 2 * S + first : NULL;
    const bool live = ntl > 0; /* the warp has a tile */
    const int64_t ra = r0 + g, rb = PAIR ? ra : ra + 8; /* this lane's output rows (A rows g, g + 8) */
    const size_t bs = xmm_bstride(cols);
    const size_t tile_bytes = (size_t)RT * a.row_bytes; /* from a tile's rows to the next's */
    /* the chunks this lane copies of each step: row t = ch / 9 of the tile
     * (clamped to the last row), 16 bytes at 16 (ch % 9) */
    const uint8_t *src[5];
    uint32_t dst[5];
#pragma unroll
    for (int u = 0; u < 5; u++) {
        const int ch = lane + 32 * u, t = ch / 9, o = ch - 9 * t;
        src[u] = NULL;
        dst[u] = 0;
        if (ch < 144 && live) {
            const int64_t r = PAIR ? r0 + (t & 7) : r0 + t;
            const uint8_t *W = PAIR && t >= 8 ? a.W1 : a.W0;
            src[u] = W + (size_t)e * a.mat_bytes + (size_t)(r < a.rows ? r : a.rows - 1) * a.row_bytes + 16 * o;
            dst[u] = (uint32_t)(t * XMM_ROWB + 16 * o);
        }
    }
    /* Q6_K: this lane's rows a and b (clamped to the last row) */
    const int64_t last = a.rows - 1;
    const uint8_t *W0 = a.W0 + (size_t)e * a.mat_bytes;
    const uint8_t *Wa = W0 + (size_t)(ra < a.rows ? ra : last) * a.row_bytes;
    const uint8_t *Wb = (PAIR ? a.W1 + (size_t)e * a.mat_bytes : W0) + (size_t)(rb < a.rows ? rb : last) * a.row_bytes;
    uint8_t *ring = xmm_sh + xmm_ring_off(cols) + (size_t)warp * XMM_STAGES * XMM_STEPB;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const float *dxs = (const float *)(xmm_sh + xmm_dx_off(cols));
    const int steps = MT ? ntl * nsb : nsb; /* the warp's 256-column steps (Q4_K, IQ4_XS) */
    for (int q = 0; q < np; q += 2) {
        const int p0 = list ? list[q] : c0, p1 = list ? (q + 1 < np ? list[q + 1] : -1) : c1;
        __syncthreads(); /* the previous chunk's planes are read */
        /* the input's loads and the weights' first steps on their way, then
         * the two pairs' planes and scales while the weights travel (a
         * missing pair's columns are never read: xr NULL) */
        if (grp)
            xmm_xload(a, p0, p1, nsb, warp, lane, va, vb);
        else
            xmm_xload<QU, 2, QU>(a, p0, p1, nsb, warp, lane, va, vb);
        if constexpr (T == MR_TYPE_Q4_K) {
#pragma unroll
            for (int b = 0; b < XMM_STAGES - 1; b++) {
                if (b < steps)
                    xmm_fetch(src, dst, ring_s + b * XMM_STEPB,
                              MT ? (size_t)(b / nsb) * tile_bytes + (size_t)(b % nsb) * 144 : (size_t)b * 144);
                xmm_commit();
            }
        }
        /* Q6_K and IQ4_XS: the first step's weights into registers before
         * the quantization, not after the barrier (runs 168-169: Q6_K one
         * token 8.6 -> 8.0 us, IQ4_XS 512 x 2,048 8.3 -> 7.8).  Q6_K then
         * takes 128 registers, 4 blocks an SM: at 96 (5 blocks) it spills
         * and is slower (9.5 us; 16 tokens 62.9 against 58.7) */
        xmm_q6h q6a, q6b;
        xs_iq4w i4a, i4b;
        if (T == MR_TYPE_Q6_K && live) {
            xmm_q6k_load(Wa, 0, c, q6a);
            xmm_q6k_load(Wb, 0, c, q6b);
        }
        if (T == MR_TYPE_IQ4_XS && live) {
            xs_iq4w_load(Wa, c, i4a);
            xs_iq4w_load(Wb, c, i4b);
        }
        for (int it0 = warp; it0 < 2 * nsb; it0 += XMM_WARPS * QU) {
            if (it0 != warp)
                xmm_xload(a, p0, p1, nsb, it0, lane, va, vb);
            xmm_xquant<T == MR_TYPE_Q4_K>(xmm_sh, (float *)dxs, xmm_sh + xmm_sum_off(cols), bs, p0, p1, nsb, it0,
                                          lane, va, vb);
        }
        __syncthreads();
        /* B column g: pair g >> 2, plane g & 3 (3: zero); C columns 2c, 2c + 1:
         * pair c >> 1 */
        const int bp = g >> 2 ? p1 : p0, cp = c >> 1 ? p1 : p0;
        const uint8_t *xp = (g & 3) < 3 && bp >= 0 ? xmm_sh + (3 * (g >> 2) + (g & 3)) * bs : NULL;
        const uint8_t *xsum = xmm_sh + xmm_sum_off(cols) + 16 * (3 * (g >> 2) + (g & 3)) * (size_t)nsb;
        float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int t = 0, tb = 0; /* MT: the tile and its step (Q4_K, IQ4_XS) or half step (Q6_K) */
        if (T == MR_TYPE_Q6_K && live) {
            xmm_q6h ca = q6a, cb = q6b, na, nb;
            int M[4] = {0, 0, 0, 0};
            const uint8_t *La = Wa, *Lb = Wb; /* MT: the tile of the next half step's loads */
            int nh = 1;                        /* and that half step in it */
#pragma unroll 1
            for (int hs = 0; hs < 2 * steps; hs++) {
                const int h = MT ? tb : hs, b = h >> 1, n = h & 1;
                if (MT && nh == 2 * nsb) {
                    nh = 0;
                    La += tile_bytes;
                    Lb += tile_bytes;
                }
                if (hs + 1 < 2 * steps) {
                    const int lh = MT ? nh : hs + 1;
                    const size_t o = (size_t)(lh >> 1) * 212;
                    xmm_q6k_load(La + o, lh & 1, c, na);
                    xmm_q6k_load(Lb + o, lh & 1, c, nb);
                }
                nh++;
                xmm_q6k_half(ca, cb, xp ? xp + 256 * b + 128 * n + 4 * c : NULL, M);
                if (n) { /* the block's end */
                    xmm_scale(f, dxs[(c >> 1) * nsb + b], q8_h2f(ca.d), q8_h2f(cb.d), M);
                    M[0] = M[1] = M[2] = M[3] = 0;
                }
                ca = na;
                cb = nb;
                if (MT && ++tb == 2 * nsb) { /* the tile's end */
                    xmm_store<PAIR>(a, f, c, cp, ra + (int64_t)t * RT, rb + (int64_t)t * RT);
                    f[0] = f[1] = f[2] = f[3] = 0.0f;
                    tb = 0;
                    t++;
                }
            }
        }
        if (T == MR_TYPE_IQ4_XS && live) {
            xs_iq4w ca = i4a, cb = i4b, na, nb;
            const uint8_t *La = Wa, *Lb = Wb; /* MT: the tile of the next step's loads */
            int nl = 1;                        /* and that step in it */
#pragma unroll 1
            for (int s = 0; s < steps; s++) {
                const int b = MT ? tb : s;
                if (MT && nl == nsb) {
                    nl = 0;
                    La += tile_bytes;
                    Lb += tile_bytes;
                }
                if (s + 1 < steps) {
                    const int ls = MT ? nl : s + 1;
                    xs_iq4w_load(La + (size_t)ls * 136, c, na);
                    xs_iq4w_load(Lb + (size_t)ls * 136, c, nb);
                }
                nl++;
                int M[4] = {0, 0, 0, 0};
                xmm_iq4_step(ca, cb, xp ? xp + 256 * b + 4 * c : NULL, M);
                xmm_scale(f, dxs[(c >> 1) * nsb + b], q8_h2f(ca.hd.x), q8_h2f(cb.hd.x), M);
                ca = na;
                cb = nb;
                if (MT && ++tb == nsb) {
                    xmm_store<PAIR>(a, f, c, cp, ra + (int64_t)t * RT, rb + (int64_t)t * RT);
                    f[0] = f[1] = f[2] = f[3] = 0.0f;
                    tb = 0;
                    t++;
                }
            }
        }
        if (T == MR_TYPE_Q4_K && live) {
            /* the step XMM_STAGES - 1 ahead: its tile's bytes and its step in it */
            size_t ft = MT ? (size_t)((XMM_STAGES - 1) / nsb) * tile_bytes : 0;
            int fb = MT ? (XMM_STAGES - 1) % nsb : XMM_STAGES - 1;
#pragma unroll 1
            for (int s = 0; s < steps; s++) {
                const int b = MT ? tb : s;
                if (s + XMM_STAGES - 1 < steps)
                    xmm_fetch(src, dst, ring_s + ((s + XMM_STAGES - 1) % XMM_STAGES) * XMM_STEPB,
                              ft + (size_t)fb * 144);
                if (++fb == nsb && MT) {
                    fb = 0;
                    ft += tile_bytes;
                }
                xmm_commit();
                xmm_wait<XMM_STAGES - 1>();
                __syncwarp();
                xmm_step cur;
                xmm_read(ring + (s % XMM_STAGES) * XMM_STEPB, g, g + 8, xp ? xp + 256 * b + 8 * c : NULL,
                         xsum + 16 * b, c, cur);
                xmm_q4k_step(cur, c, dxs[(c >> 1) * nsb + b], f);
                __syncwarp(); /* the slot is read before a later step's copy lands in it */
                if (MT && ++tb == nsb) {
                    xmm_store<PAIR>(a, f, c, cp, ra + (int64_t)t * RT, rb + (int64_t)t * RT);
                    f[0] = f[1] = f[2] = f[3] = 0.0f;
                    tb = 0;
                    t++;
                }
            }
        }
        if constexpr (T == MR_TYPE_Q4_K)
            xmm_wait<0>();
        if (!MT && live)
            xmm_store<PAIR>(a, f, c, cp, ra, rb);
    }
}

/* ---- dispatch ---- */

/* Row tiles a warp for a decode batch's launch of `tiles` row tiles by Y
 * chunks (at most): c->xmm_tpw where set; else (auto) the most of 4 and 2
 * that still leave 3 waves of blocks (4 an SM), 1 where none does.  Run 227
 * (H200): several tiles a warp lose where the fewer blocks are under ~3
 * waves (the 30B-A3B's gate/up at 16 tokens 35.0 -> 35.7 us at 2; IQ4_XS
 * 512 x 2,048 38.2 -> 43.6); run 228 with this rule: its downs at 16
 * tokens -5..-13%, every shape at 64 tokens -10..-30%, 1-8 tokens within
 * 1%; run 229: decode only C = 16 +2.8%, C = 64 +12%. */
static int xmm_tpw(const mr_cu_ctx *c, int64_t tiles, int Y)
{
    if (c->xmm_tpw > 0)
        return c->xmm_tpw;
    const int64_t wave = 4 * (int64_t)c->n_sm;
    for (int t = 4; t >= 2; t /= 2)
        if ((tiles + XMM_WARPS * t - 1) / (XMM_WARPS * t) * Y >= 3 * wave)
            return t;
    return 1;
}

template <int T>
static void xmm_launch(mr_cu_ctx *c, bool pair, bool mt, dim3 grid, size_t smem, const xmm_args &a,
                       const int32_t *grp, int S)
{
    if (pair && mt)
        mr_cu_launch(c, k_xmm<T, true, true>, grid, XMM_WARPS * 32, smem, a, grp, S);
    else if (pair)
        mr_cu_launch(c, k_xmm<T, true, false>, grid, XMM_WARPS * 32, smem, a, grp, S);
    else if (mt)
        mr_cu_launch(c, k_xmm<T, false, true>, grid, XMM_WARPS * 32, smem, a, grp, S);
    else
        mr_cu_launch(c, k_xmm<T, false, false>, grid, XMM_WARPS * 32, smem, a, grp, S);
}

/* Whether the kernel takes these expert matrices: on for their type (Q4_K
 * from the GGUF blocks; Q6_K from the padded copy), whole 256-column
 * blocks, one type, width and expert count.  Never depends on the token
 * count. */
static bool xmm_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    if (!c->xmm || !c->matvec_x24 || !c->x24_moe || c->no_fast || m < 1 || m > MR_CU_MV_SUBS || ((uintptr_t)x & 15))
        return false;
    for (int s = 0; s < m; s++) {
        const mr_weight *v = w[s];
        const bool q4 = v->type == MR_TYPE_Q4_K, q6 = v->type == MR_TYPE_Q6_K && c->xmm >= 2 && v->priv;
        /* IQ4_XS: 3 rows of at most 512 columns (the 35B-A3B's down), 4 all */
        const bool iq = v->type == MR_TYPE_IQ4_XS && (c->xmm >= 4 || (c->xmm == 3 && w[0]->cols <= 512));
        if (!v->data || !(q4 || q6 || iq) || v->type != w[0]->type || v->cols != w[0]->cols ||
            v->n_mats != w[0]->n_mats || v->n_mats < 2 || v->cols % 256 ||
            xmm_smem(v->type, v->cols) > c->x24_smem ||
            v->rows > (1 << 30))
            return false;
    }
    return true;
}

bool mr_cu_xmm_takes_id(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    return xmm_takes(c, w, m, x);
}

/* m matrices (a gate/up pair of equal rows, with o the SwiGLU of the two
 * where not NULL, or one) of n tokens' expert pairs, under cu_moex24.cu's
 * rules for what a decode batch takes (at most two matrices, equal rows);
 * one token's further matrices run as launches of their own (a row's bits
 * do not depend on the tile).  False, nothing launched, where the kernel
 * does not take the call. */
bool mr_cu_xmm_matvec_id(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, int m, const float *x,
                         int x_slots, const int32_t *ids, int k, int n)
{
    if (n < 1 || n >= MR_CU_GEMM_MIN_TOKENS || k < 1 || !xmm_takes(c, w, m, x))
        return false;
    const int P = n * k;
    const bool pair = m == 2 && w[1]->rows == w[0]->rows;
    if ((n > 1 && (m > 2 || (m == 2 && !pair) || !mr_cu_moe_group_fits(P, w[0]->n_mats))) || (o && !pair))
        return false;
    const int32_t *grp = NULL;
    int S = P, Y = P; /* Y: the grid's y, the slots or the chunks */
    const bool items = n > 1 && c->xmm_items;
    if (n > 1) { /* NaN rows of bad ids written here, in both outputs of a pair */
        grp = mr_cu_moe_group(c, ids, P, k, w[0]->n_mats, w[0]->rows, y[0], pair ? y[1] : NULL, o, &S, items);
        if (!grp)
            return c->failed;
        /* chunks: sum over used experts of ceil(pairs / 2) <= (P + used) / 2 */
        Y = items ? (P + S + 1) / 2 : S;
    }
    const int64_t cols = w[0]->cols;
    const int T = w[0]->type;
    const bool q6 = T == MR_TYPE_Q6_K; /* the padded copy (xs_padded) */
    for (int s = 0; s < m; s += pair ? 2 : 1) {
        xmm_args a;
        a.W0 = (const uint8_t *)(q6 ? w[s]->priv : w[s]->data);
        a.W1 = pair ? (const uint8_t *)(q6 ? w[s + 1]->priv : w[s + 1]->data) : NULL;
        a.y0 = y[s];
        a.y1 = pair ? y[s + 1] : NULL;
        a.yo = o;
        a.row_bytes = q6 ? mr_cu_fast_row_bytes(w[s]) : w[s]->row_bytes;
        a.mat_bytes = a.row_bytes * (size_t)w[s]->rows;
        a.rows = (int)w[s]->rows;
        a.cols = (int)cols;
        a.n_mats = (int)w[s]->n_mats;
        a.k = k;
        a.x_slots = x_slots;
        a.ids = ids;
        a.x = x;
        a.items = items ? (const int4 *)(grp + mr_cu_grp_items_at(S, P)) : NULL;
        const int RT = pair ? 8 : 16;
        const int64_t tiles = (a.rows + RT - 1) / RT;
        a.tpw = n > 1 && a.rows % RT == 0 ? xmm_tpw(c, tiles, Y) : 1;
        const dim3 grid((unsigned)((tiles + XMM_WARPS * a.tpw - 1) / (XMM_WARPS * a.tpw)), (unsigned)Y, 1);
        const size_t smem = xmm_smem(T, cols);
        const bool mt = a.tpw > 1;
        c->xmm_mt_launches += mt;
        if (T == MR_TYPE_IQ4_XS)
            xmm_launch<MR_TYPE_IQ4_XS>(c, pair, mt, grid, smem, a, grp, S);
        else if (q6)
            xmm_launch<MR_TYPE_Q6_K>(c, pair, mt, grid, smem, a, grp, S);
        else
            xmm_launch<MR_TYPE_Q4_K>(c, pair, mt, grid, smem, a, grp, S);
        MR_CU_LAUNCHED(c, "xmm expert matvec");
    }
    return true;
}

/* At backend creation: launches may ask for up to bytes of shared memory
 * (xmm_smem: ~53 KB for Q4_K at 2,048 columns). */
bool mr_cu_xmm_optin(int bytes)
{
    const void *k[] = {
        (const void *)k_xmm<MR_TYPE_Q4_K, true, false>,   (const void *)k_xmm<MR_TYPE_Q4_K, false, false>,
        (const void *)k_xmm<MR_TYPE_Q6_K, true, false>,   (const void *)k_xmm<MR_TYPE_Q6_K, false, false>,
        (const void *)k_xmm<MR_TYPE_IQ4_XS, true, false>, (const void *)k_xmm<MR_TYPE_IQ4_XS, false, false>,
        (const void *)k_xmm<MR_TYPE_Q4_K, true, true>,    (const void *)k_xmm<MR_TYPE_Q4_K, false, true>,
        (const void *)k_xmm<MR_TYPE_Q6_K, true, true>,    (const void *)k_xmm<MR_TYPE_Q6_K, false, true>,
        (const void *)k_xmm<MR_TYPE_IQ4_XS, true, true>,  (const void *)k_xmm<MR_TYPE_IQ4_XS, false, true>};
    for (const void *f : k)
        if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
            return false;
    return true;
}

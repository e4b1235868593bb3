/* Decode batches of Q4_K plain products on the tensor cores, with the same
 * bits as the one-token 22-bit kernel (cu_mvx24.cu); Q6_K the same way at
 * the end of the file.
 *
 * Why: at 2+ tokens a launch the matvec kernels are bound by loading every
 * token's input from L1 once per row group (docs/GPU-NOTES.md 33: Q4_K
 * 24576x4096 at 16 tokens takes 252 us, ~5% of copy bandwidth), while an
 * int8 MMA of 16 rows against 8 tokens reuses each load 8 and 16 times.
 *
 * Why the same bits: the 22-bit kernel forms a (row, token) sum as
 *   lane L (0..31) sums the units L, L + 32, L + 64, ... in order (unit
 *   8b + u: block b, run pair u), each unit's share from the exact integer
 *   sums of its two 16-column runs (xs_q4k_sm, xs_q4k_tok, xs_q4k_add in
 *   cu_x24.cuh), then a warp sum (xor 16, 8, 4, 2, 1).
 * Lane L's units are those of the blocks b = c, c + 4, c + 8, ... (c = L / 8,
 * the block's class) with u = L % 8.  Here a block of four warps takes 16
 * rows against 8 tokens (a tile); warp c walks the blocks of class c in
 * order and keeps, for each of its (row, token) outputs, the 8 running
 * partials of units u = 0..7, rounded step by step by the same functions
 * with the same operands; the MMAs give the same exact integer sums of each
 * 16-column run.  After the walk the warps park their partials in shared
 * memory (partial 8c + u of an output is lane L = 8c + u's accumulator of
 * the matvec) and one thread an output adds its 32 partials in the warp
 * sum's tree (xt_tree).  So a token's rows do not depend on how many tokens
 * share the launch, nor on which kernel ran them (kernel-check:
 * batch-inv-x24mma, 2..64 tokens against one).
 *
 * Fragments (PTX ISA, mma.m16n8k16 with .s8/.u8; g = lane / 4, q = lane %
 * 4): A (16 rows x 16 k) two 32-bit words, row g and row g + 8, k = 4q ..
 * 4q + 3 (byte i: k = 4q + i); B (16 k x 8 columns) one word, column g, k
 * = 4q .. 4q + 3; C/D four s32, (row g, column 2q), (g, 2q + 1), (g + 8,
 * 2q), (g + 8, 2q + 1).  A Q4_K run of 16 columns is 16 qs bytes (low
 * nibbles; the high nibbles are the run 32 columns on), so the word at 4q of
 * a unit's 16 bytes is lane q's A word of both runs, and the plane word at
 * the run's column 4q its B word: k = 4q + i is column 4q + i of the run
 * for both, so the MMA's sum over k is the run's sum, in any order exact.
 *
 * How a tile maps its tokens on the MMA's 8 columns (block-uniform, from
 * the tile's real tokens nt; a token past n is never scaled nor stored):
 *   nt 5..8 (xt_run<4>): column t = token t, one MMA per plane and run,
 *     chained (hi, then mid and lo with the sum so far times 256 as C:
 *     65536 hi + 256 mid + lo, the matvec's xs_join, exact in int32); a
 *     lane scales its C outputs (rows g, g + 8, tokens 2q, 2q + 1);
 *   nt 3..4 (xt_run<2>): the same MMAs; lanes q = 2, 3 take row g + 8 of
 *     lanes q - 2 (one shuffle a sum), so each lane scales 2 outputs (row
 *     g + 8 (q / 2), tokens 2 (q % 2) + 0, 1) instead of 4 with half idle;
 *   nt 1..2 (xt_run<1>): one MMA a run for both tokens: column 4t + p is
 *     token t's plane p (hi; mid - 128; lo - 128, all signed now) and column
 *     4t + 3 all ones (S, the sum of the run's weights), so
 *     65536 hi + 256 mid + lo = (65536 H + 256 M') + (L' + 32896 S)
 *     (M = M' + 128 S, L = L' + 128 S), the two halves in lanes q = 2t and
 *     2t + 1 of a group; one shuffle joins them, and each lane scales 1
 *     output (row g + 8 (q % 2), token q / 2).
 * Integers are exact at every step (every partial value below 2^30 in
 * magnitude), so every mapping gives the matvec's integers; the float steps
 * are xs_q4k_add's per output, the same for every mapping.  A launch of up
 * to 8 tokens runs the kernel of its one mapping; more tokens, the kernel
 * that picks per tile (a last tile of 1-4 tokens costs a fraction of a full
 * one).
 *
 * Per block: the token side of the tile (each unit's qa, qb and each unit
 * pair's da, db, and the tokens' three planes, the MMAs' B words) once into
 * shared memory; each warp loads a block's two 16-byte headers and 16 unit
 * words one block ahead of their use (the next block's words replace the
 * current ones as they are consumed), and the next unit's plane words from
 * shared memory one step ahead; the scale bytes are decoded once per unit
 * pair and row and reused for both units and every token of the lane.
 * Registers (ptxas, sm_90a, __launch_bounds__ for 512 threads): 128 with
 * 44 / 28 bytes spilled (the by-tile kernel, MODE 4), 124 (MODE 2), 105
 * (MODE 1). */
#include <stdlib.h>

#include "kernels/cuda/cu_mma.cuh"
#include "kernels/cuda/cu_x24.cuh"

#define XT_CLS 4   /* warps a block: one per block class */
#define XT_TOK 8   /* tokens a tile: the n of m16n8k16 */
#define XT_ROWS 16 /* rows a tile: the m */
#define XT_PSTR 33 /* floats between two outputs' partials (33: banks) */
#define XT_PART_BYTES (XT_ROWS * XT_TOK * XT_PSTR * 4)

/* 65536 hi + 256 mid + lo of one run for the 4 C outputs, less off[o]
 * where LESS: the three planes' MMAs chained through C (each partial sum
 * times 256 before the next; the subtraction folded into the last MMA's C,
 * one IMAD an output where a multiply and a later IADD were two; every
 * value is exact in int32); a signed (weights), b signed (the high plane,
 * or the signed columns of xt_run<1>: mr_imma16_ss) or unsigned (the
 * middle and low planes: mr_imma16_su, cu_mma.cuh). */
template <bool LESS>
__device__ __forceinline__ void xt_chain3(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t hi, uint32_t mid,
                                          uint32_t lo, const int *off)
{
#pragma unroll
    for (int o = 0; o < 4; o++) d[o] = 0;
    mr_imma16_ss(d, a0, a1, hi);
#pragma unroll
    for (int o = 0; o < 4; o++) d[o] *= 256;
    mr_imma16_su(d, a0, a1, mid);
#pragma unroll
    for (int o = 0; o < 4; o++) {
        if constexpr (LESS)
            d[o] = 256 * d[o] - off[o];
        else
            d[o] *= 256;
    }
    mr_imma16_su(d, a0, a1, lo);
}

__device__ __forceinline__ void xt_run3(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t hi, uint32_t mid,
                                        uint32_t lo)
{
    xt_chain3<false>(d, a0, a1, hi, mid, lo, nullptr);
}

__device__ __forceinline__ void xt_run3_less(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t hi, uint32_t mid,
                                             uint32_t lo, const int (&off)[4])
{
    xt_chain3<true>(d, a0, a1, hi, mid, lo, off);
}

/* The warp sum of mr_warp_sum (lane 0's result) over 32 partials p. */
__device__ __forceinline__ float xt_tree(const float *p)
{
    /* lane l's value after the steps xor 16, 8, 4, 2, 1 is v[l]; each loop
     * with a constant bound, so that all of v stays in registers */
    float v[16];
#pragma unroll
    for (int l = 0; l < 16; l++) v[l] = p[l] + p[l + 16];
#pragma unroll
    for (int l = 0; l < 8; l++) v[l] = v[l] + v[l + 8];
#pragma unroll
    for (int l = 0; l < 4; l++) v[l] = v[l] + v[l + 4];
#pragma unroll
    for (int l = 0; l < 2; l++) v[l] = v[l] + v[l + 2];
    return v[0] + v[1];
}

/* Thread o = threadIdx.x % (XT_ROWS * XT_TOK) of a tile's 128 sums output
 * (row, token) = (o / XT_TOK, o % XT_TOK) from its parked partials in the
 * warp sum's tree and stores it, if that row and token exist. */
__device__ __forceinline__ void xt_store(const mr_cu_mvjob &a, int64_t total_rows, int64_t r0, int tok0, int nt,
                                         const float *xt_sh)
{
    const int o = threadIdx.x % (XT_ROWS * XT_TOK), row = o / XT_TOK, tok = o % XT_TOK;
    if (tok < nt && r0 + row < total_rows) {
        const float v = xt_tree(xt_sh + o * XT_PSTR);
        const uint8_t *W;
        float *y;
        int64_t s;
        xs_row(a, r0 + row, &W, &y, &s);
        y[(int64_t)(tok0 + tok) * s] = v;
    }
}

/* Words between two tokens' planes in shared memory: 3 cols / 4 + 4, so
 * that the 8 tokens x 4 lanes of an MMA's B words fall in 32 banks; and
 * the words of a tile's planes (the partials follow them). */
__host__ __device__ constexpr int xt_pstride(int64_t cols) { return (int)(3 * cols / 4 + 4); }
__host__ __device__ constexpr size_t xt_pwords(int64_t cols) { return (size_t)XT_TOK * xt_pstride(cols); }

/* The three planes of each of the tile's nt real tokens into ps,
 * xt_pstride words apart: the MMAs' B words are read there, not from
 * global memory (run 144: every warp loading them there once a tile kept
 * L1 83-94% busy). */
__device__ __forceinline__ void xt_planes(const uint8_t *xg, int cols, int tok0, int nt, uint32_t *ps)
{
    const size_t xb = xs_xbytes(cols);
    const int pw = 3 * cols / 16, ts = xt_pstride(cols);
#pragma unroll 4
    for (int i = threadIdx.x; i < nt * pw; i += blockDim.x) {
        const int t = i / pw, k = i - t * pw;
        ((uint4 *)(ps + (size_t)t * ts))[k] = __ldg((const uint4 *)(xg + (size_t)(tok0 + t) * xb) + k);
    }
}

/* The input side of the tile's nt real tokens, once a block: tq[8U + t] =
 * (qa, qb), token t's integer sums over the two runs of unit U rounded to
 * float as the matvec rounds them; td[8G + t] = (da, db), its scales of the
 * two runs of unit pair G (units 2G, 2G + 1: the same two 32-column
 * groups); ps: the planes. */
__device__ __forceinline__ void xt_tokens(const uint8_t *xg, int cols, int tok0, int nt, float2 *tq, float2 *td,
                                          uint32_t *ps)
{
    const size_t xb = xs_xbytes(cols);
    const int units = cols / 32, pairs = cols / 64;
    xt_planes(xg, cols, tok0, nt, ps);
    for (int i = threadIdx.x; i < nt * units; i += blockDim.x) {
        const int t = i / units, U = i - t * units;
        const int *sq = xs_sq((uint8_t *)(xg + (size_t)(tok0 + t) * xb), cols);
        const int ca = 256 * (U >> 3) + 64 * ((U & 7) >> 1) + 16 * (U & 1), cb = ca + 32;
        tq[8 * U + t] = make_float2((float)(sq[ca / 8] + sq[ca / 8 + 1]), (float)(sq[cb / 8] + sq[cb / 8 + 1]));
    }
    for (int i = threadIdx.x; i < nt * pairs; i += blockDim.x) {
        const int t = i / pairs, G = i - t * pairs;
        const float *dq = xs_d((uint8_t *)(xg + (size_t)(tok0 + t) * xb), cols);
        td[8 * G + t] = make_float2(dq[2 * G], dq[2 * G + 1]); /* dq[ca / 32], dq[cb / 32] */
    }
}

/* K float2 of shared memory at p (K = 2: 16-byte aligned) into v. */
template <int K> __device__ __forceinline__ void xt_lds(float (&v)[2 * K], const float2 *p)
{
    if constexpr (K == 2) {
        const float4 t = *(const float4 *)p;
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
        const float2 t = *p;
        v[0] = t.x, v[1] = t.y;
    }
}

/* Warp c of the block: the blocks of class c of the tile's 16 rows (from
 * r0) against its tokens tok0 .. tok0 + nt - 1; MODE: how the tokens meet
 * the MMA's columns and which outputs a lane scales (see the top).  tok:
 * the token side (tq, td), formed here first when `setup` (the block's
 * first tile; later tiles of the block reuse it); ends with the partials
 * parked in part (all threads of the block call it alike). */
template <int MODE>
__device__ __forceinline__ void xt_run(const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int64_t r0,
                                       int tok0, int nt, float *tok, uint32_t *ps, float *part, bool setup)
{
    constexpr int R = MODE == 4 ? 2 : 1;  /* rows a lane scales */
    constexpr int K = MODE == 1 ? 1 : 2;  /* tokens a lane scales */
    constexpr int NW = MODE == 1 ? 2 : 6; /* plane words a lane loads a unit */
    const int lane = threadIdx.x & 31, c = (threadIdx.x >> 5) & 3, g = lane >> 2, q = lane & 3;
    const int cols = (int)a.cols, nb = cols / 256, ts = xt_pstride(cols);

    /* the A rows g, g + 8 (past the end: row r0, computed, not stored) */
    const uint8_t *WA, *WB;
    float *yd;
    int64_t ys;
    xs_row(a, r0 + g < total_rows ? r0 + g : r0, &WA, &yd, &ys);
    xs_row(a, r0 + g + 8 < total_rows ? r0 + g + 8 : r0, &WB, &yd, &ys);
    /* the rows (as 0..15) and tokens (0..7) this lane scales, and the
     * headers it reads: both rows' or its one row's */
    int srow[R], stok[K];
    const uint8_t *WS[R];
    if constexpr (MODE == 4) {
        srow[0] = g, srow[1] = g + 8, stok[0] = 2 * q, stok[1] = 2 * q + 1;
        WS[0] = WA, WS[1] = WB;
    } else if constexpr (MODE == 2) {
        srow[0] = g + 8 * (q >> 1), stok[0] = 2 * (q & 1), stok[1] = 2 * (q & 1) + 1;
        WS[0] = q >> 1 ? WB : WA;
    } else {
        srow[0] = g + 8 * (q & 1), stok[0] = q >> 1;
        WS[0] = q & 1 ? WB : WA;
    }
    /* B: MODE 4, 2: token g's planes (an absent token: token tok0's, its
     * column computed, never scaled); MODE 1: column g is token g / 4's
     * plane g % 4, the middle and low planes' bytes as signed v - 128 (v ^
     * 0x80), column 4t + 3 all ones */
    const uint32_t *xS; /* the lane's words in the planes of shared memory (xt_tokens) */
    uint32_t bx = 0;
    bool bone = false;
    if constexpr (MODE == 1) {
        const int t = g >> 2, p = g & 3;
        xS = ps + (size_t)(t < nt ? t : 0) * ts + (p < 3 ? p : 0) * (cols / 4) + q;
        bx = p == 1 || p == 2 ? 0x80808080u : 0u;
        bone = p == 3;
    } else {
        xS = ps + (size_t)(g < nt ? g : 0) * ts + q;
    }
    /* MODE 1: lane q's half of the join (columns 2q, 2q + 1 of C): 65536 H +
     * 256 M' (q even) or L' + 32896 S (q odd) */
    const int j0 = q & 1 ? 1 : 65536, j1 = q & 1 ? 32896 : 256;

    float acc[8][R * K]; /* [unit][output r K + k: row srow[r], token stok[k]] */
#pragma unroll
    for (int u = 0; u < 8; u++)
#pragma unroll
        for (int o = 0; o < R * K; o++) acc[u][o] = 0.0f;

    /* the weights of the current block: headers, and the word at 4q of each
     * unit's 16 qs bytes of rows g (w[0]) and g + 8 (w[1]); the plane words
     * of the current unit (bw) */
    uint4 hd[R];
    uint32_t w[2][8], bw[NW];
    auto bload = [&](int bb, int uu) { /* unit uu of block bb's plane words */
        const int ca = (256 * bb + 64 * (uu >> 1) + 16 * (uu & 1)) / 4; /* in words */
        if constexpr (MODE == 1) {
            bw[0] = xS[ca];
            bw[1] = xS[ca + 8];
        } else {
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int p = 0; p < 3; p++) bw[3 * r + p] = xS[p * (cols / 4) + ca + 8 * r];
        }
    };
    if (c < nb) {
#pragma unroll
        for (int r = 0; r < R; r++) hd[r] = __ldg((const uint4 *)(WS[r] + (size_t)c * 144));
#pragma unroll
        for (int u = 0; u < 8; u++) {
            w[0][u] = q8_ld32(WA + (size_t)c * 144 + 16 + 16 * u + 4 * q);
            w[1][u] = q8_ld32(WB + (size_t)c * 144 + 16 + 16 * u + 4 * q);
        }
    }

    float2 *tq = (float2 *)tok, *td = tq + 8 * (cols / 32);
    if (setup) {
        xt_tokens(xg, cols, tok0, nt, tq, td, ps);
        __syncthreads();
    }
    if (c < nb) bload(c, 0);

    for (int b = c; b < nb; b += XT_CLS) {
        const int bn = b + XT_CLS < nb ? b + XT_CLS : b; /* the next block (the last: itself again) */
        float d[R], dm[R];
#pragma unroll
        for (int r = 0; r < R; r++) d[r] = q8_h2f(hd[r].x), dm[r] = q8_h2f(hd[r].x >> 16);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            /* the scales of unit pair j times the lane's tokens' da, db */
            xs_q4k_f f[R][K];
            {
                float dd[2 * K];
                xt_lds<K>(dd, td + 8 * (4 * b + j) + stok[0]);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const xs_q4k_f s = xs_q4k_sm(hd[r], j);
#pragma unroll
                    for (int k = 0; k < K; k++) f[r][k] = xs_q4k_tok(s, dd[2 * k], dd[2 * k + 1]);
                }
            }
            if (j == 3)
#pragma unroll
                for (int r = 0; r < R; r++) hd[r] = __ldg((const uint4 *)(WS[r] + (size_t)bn * 144));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int u = 2 * j + h;
                /* this unit's words; the next unit's (or the next block's)
                 * loads go out before the MMAs wait on these */
                const uint32_t wA = w[0][u], wB = w[1][u];
                uint32_t x[NW];
#pragma unroll
                for (int i = 0; i < NW; i++) x[i] = bw[i];
                w[0][u] = q8_ld32(WA + (size_t)bn * 144 + 16 + 16 * u + 4 * q);
                w[1][u] = q8_ld32(WB + (size_t)bn * 144 + 16 + 16 * u + 4 * q);
                if (u < 7) bload(b, u + 1);
                else bload(bn, 0);
                float qq[2 * K]; /* qa, qb of the lane's tokens */
                xt_lds<K>(qq, tq + 8 * (8 * b + u) + stok[0]);

                const uint32_t aL0 = wA & 0x0F0F0F0Fu, aL1 = wB & 0x0F0F0F0Fu;
                const uint32_t aH0 = (wA >> 4) & 0x0F0F0F0Fu, aH1 = (wB >> 4) & 0x0F0F0F0Fu;
                int ia[R * K], ib[R * K]; /* the exact sums of runs a, b for the lane's outputs */
                if constexpr (MODE == 1) {
                    int s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
                    mr_imma16_ss(s[0], aL0, aL1, bone ? 0x01010101u : x[0] ^ bx);
                    mr_imma16_ss(s[1], aH0, aH1, bone ? 0x01010101u : x[1] ^ bx);
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const int vg = j0 * s[r][0] + j1 * s[r][1], v8 = j0 * s[r][2] + j1 * s[r][3];
                        /* q even: row g, the partner sends its row g half;
                         * q odd: row g + 8, the partner sends that */
                        const int mine = q & 1 ? v8 : vg, send = q & 1 ? vg : v8;
                        const int v = mine + __shfl_xor_sync(0xffffffffu, send, 1);
                        if (r == 0) ia[0] = v;
                        else ib[0] = v;
                    }
                } else {
                    int s[2][4];
                    xt_run3(s[0], aL0, aL1, x[0], x[1], x[2]);
                    xt_run3(s[1], aH0, aH1, x[3], x[4], x[5]);
                    if constexpr (MODE == 4) {
#pragma unroll
                        for (int o = 0; o < 4; o++) ia[o] = s[0][o], ib[o] = s[1][o];
                    } else { /* row g + 8 of lanes q - 2 to lanes q = 2, 3 */
#pragma unroll
                        for (int k = 0; k < 2; k++) {
                            const int ta = __shfl_xor_sync(0xffffffffu, s[0][2 + k], 2);
                            const int tb = __shfl_xor_sync(0xffffffffu, s[1][2 + k], 2);
                            ia[k] = q >> 1 ? ta : s[0][k];
                            ib[k] = q >> 1 ? tb : s[1][k];
                        }
                    }
                }
#pragma unroll
                for (int k = 0; k < K; k++)
                    if (stok[k] < nt) /* only real tokens: the rest are never stored */
#pragma unroll
                        for (int r = 0; r < R; r++)
                            acc[u][r * K + k] = xs_q4k_add(f[r][k], d[r], dm[r], ia[r * K + k], ib[r * K + k],
                                                           qq[2 * k], qq[2 * k + 1], acc[u][r * K + k]);
            }
        }
    }
    __syncthreads(); /* every thread done with the previous tile's store from part */
#pragma unroll
    for (int u = 0; u < 8; u++)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k < K; k++)
                part[(srow[r] * XT_TOK + stok[k]) * XT_PSTR + 8 * c + u] = acc[u][r * K + k];
}

/* Shared memory of k_mvx24_mma with rt row tiles a block: tq and td (3
 * bytes a column), the 8 tokens' planes (xt_pstride words each), then rt
 * tiles' partials. */
static size_t xt4_smem(int64_t cols, int rt)
{
    return 3 * (size_t)cols + 4 * xt_pwords(cols) + (size_t)rt * XT_PART_BYTES;
}

/* a: the launch's rows (sub-matrices as in k_mvx24); xg: the n tokens'
 * planes (k_x24_quant), xs_xbytes(cols) apart.  Grid: blockIdx.y the
 * token tile, and each block of rt = blockDim.x / 128 row tiles at a time
 * walks the tile groups blockIdx.x, + gridDim.x, ... (a grid of about one
 * wave): the token side is formed once a block, not once a tile (run 136:
 * at 16 tokens the 151,936-row head took 698 us as one block a tile, 7.7x
 * one token), and the 128 threads of group rt take tile rt of a group (so
 * that inputs of 4,096 columns, whose planes leave room for one block an
 * SM, still keep 16 warps an SM).  A tile's sums do not depend on which
 * block runs it.  MODE: xt_run's for every tile (n <= 8: one token tile),
 * 0: each tile's own. */
template <int MODE>
__global__ void __launch_bounds__(XT_CLS * 32 * 4, 1)
    k_mvx24_mma(mr_cu_mvjob a, int64_t total_rows, const uint8_t *xg, int n)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ __align__(16) float xt_sh[]; /* tq, td; the planes; then the partials */
    uint32_t *ps = (uint32_t *)(xt_sh + 3 * a.cols / 4);
    const int rt = blockDim.x / (XT_CLS * 32), grp = threadIdx.x / (XT_CLS * 32);
    float *part = (float *)(ps + xt_pwords(a.cols)) + grp * (XT_PART_BYTES / 4);
    const int tok0 = (int)blockIdx.y * XT_TOK, nt = n - tok0 < XT_TOK ? n - tok0 : XT_TOK;
    const int64_t tiles = (total_rows + XT_ROWS - 1) / XT_ROWS, groups = (tiles + rt - 1) / rt;
    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        /* a group past the last tile computes the last tile again (every
         * thread takes the block's barriers) and stores nothing */
        const int64_t ti = gi * rt + grp, r0 = (ti < tiles ? ti : tiles - 1) * XT_ROWS;
        const bool setup = gi == (int64_t)blockIdx.x;
        if constexpr (MODE != 0) xt_run<MODE>(a, total_rows, xg, r0, tok0, nt, xt_sh, ps, part, setup);
        else if (nt <= 2) xt_run<1>(a, total_rows, xg, r0, tok0, nt, xt_sh, ps, part, setup);
        else if (nt <= 4) xt_run<2>(a, total_rows, xg, r0, tok0, nt, xt_sh, ps, part, setup);
        else xt_run<4>(a, total_rows, xg, r0, tok0, nt, xt_sh, ps, part, setup);
        __syncthreads();
        if (ti < tiles) xt_store(a, total_rows, r0, tok0, nt, part); /* 128 threads a tile: one an output */
    }
}

/* n tokens (1 .. MR_CU_GEMM_MIN_TOKENS - 1) of the job a, Q4_K from the
 * GGUF blocks, total_rows rows (sub-matrices included); xg: the planes.
 * Version 1 (run 47, H200; us, matvec two tokens a launch / v1):
 * 24576x4096 n = 2 31.6 / 87.2, 4: 63.2 / 101.0, 8: 126.1 / 137.7, 16:
 * 251.9 / 206.3; 4096x4096 n = 2 18.2 / 37.8, 16 138.8 / 58.0: correct to
 * the bit, but a fixed ~85 us on the large shape (every tile scaled 8
 * tokens, 194 registers, two warps a block, each walking the four block
 * classes one after another, the scale bytes decoded per token).  This
 * version (four warps a tile, one a class; scaling only for real tokens,
 * spread over the lanes at 1-4 tokens a tile; scales decoded once per unit
 * pair; the next unit's loads ahead of the MMAs): run 51's numbers in
 * mr_cu_x24_init, run 137's (blocks that walk row tiles) in
 * docs/GPU-NOTES.md 63. */
/* The grid of a tile launch: the token tiles in y, and in x as many blocks
 * a token tile as make about one wave of the kernel (fit blocks an SM),
 * at most one a group of rt row tiles. */
static dim3 xt_grid(const mr_cu_ctx *c, int64_t total_rows, int n, int fit, int rt = 1)
{
    const int64_t groups = ((total_rows + XT_ROWS - 1) / XT_ROWS + rt - 1) / rt;
    const int ntt = (n + XT_TOK - 1) / XT_TOK;
    int64_t gx = (int64_t)c->n_sm * (fit > 0 ? fit : 1) / ntt;
    if (gx < 1) gx = 1;
    if (gx > groups) gx = groups;
    return dim3((unsigned)gx, (unsigned)ntt);
}

/* Row tiles a block (1, 2 or 4): the most warps an SM within the shared
 * memory the launches may ask, the fewer tiles a block on a tie. */
template <int MODE>
static int xt4_rt(mr_cu_ctx *c, int64_t cols, int *fit)
{
    int best = 1, bw = -1;
    *fit = 0;
    for (int rt = 1; rt <= 4; rt *= 2) {
        const size_t smem = xt4_smem(cols, rt);
        if (smem > c->x24_smem)
            break;
        const int f = mr_cu_fit(c, (const void *)k_mvx24_mma<MODE>, rt * XT_CLS * 32, smem);
        if (f * rt > bw) best = rt, bw = f * rt, *fit = f;
    }
    return best;
}

template <int MODE>
static void xt_launch(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int n)
{
    int fit;
    const int rt = xt4_rt<MODE>(c, a.cols, &fit);
    mr_cu_launch(c, k_mvx24_mma<MODE>, xt_grid(c, total_rows, n, fit, rt), rt * XT_CLS * 32, xt4_smem(a.cols, rt), a,
                 total_rows, xg, n);
}

void mr_cu_x24_mma(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int n)
{
    if (n <= 2) xt_launch<1>(c, a, total_rows, xg, n);
    else if (n <= 4) xt_launch<2>(c, a, total_rows, xg, n);
    else if (n <= XT_TOK) xt_launch<4>(c, a, total_rows, xg, n);
    else xt_launch<0>(c, a, total_rows, xg, n);
    MR_CU_LAUNCHED(c, "x24 tensor-core matvec");
}

/* ---- Q6_K ----
 * The matvec's Q6_K unit u = 4n + k (cu_x24.cuh, xs_unit<Q6_K>) sums four
 * quarters of 8 columns each (positions l0 = 8k .. 8k + 7 of half n in
 * quarter qq: columns 256b + 128n + 32qq + l0 ..), each quarter's exact
 * integer sum s of w q (w = 0..63) scaled on its own:
 *   r = 0; r = xs_q6k_step(sc, dx, s, 32 sq, r) for qq = 0..3 in order;
 *   the lane's accumulator += d r (xs_fma);
 * with sc the quarter's signed 8-bit scale (sc[8n + l0 / 16 + 2qq]), dx
 * the input's scale of the 32 columns and sq its integer sum over the 8.
 * An 8-column sum does not fill the MMA's 16 k, so an MMA takes two units
 * at once, k = 0..7 the positions of unit k (even), k = 8..15 those of unit
 * k + 1, and one weight row twice: A row g holds the row's quants of unit k at
 * k = 0..7 and zeros at 8..15, A row g + 8 zeros at 0..7 and unit k + 1's at
 * 8..15.  So lane q's A word is the row's quants at pair positions 4q ..
 * 4q + 3 (16k' + 4q with k' = k / 2: positions l0 + 4q of unit k for q < 2,
 * l0 + 8 + 4 (q - 2) of unit k + 1 for q >= 2), in a0 for q < 2 and a1 for
 * q >= 2 (the other word zero), and B is the planes at the same 16 columns
 * (token g, as for Q4_K).  C then holds (row, unit k, tokens 2q, 2q + 1)
 * and (row, unit k + 1, the same tokens): every quarter sum of an output
 * lands in the lane that scales it, and the three planes are joined by the
 * same chained MMAs (|partial| < 2^31: 8 x 63 x 2^21).  Two MMA chains a
 * quarter cover the lane's two rows (g and g + 8 of the tile), so a lane
 * scales 8 outputs (2 rows x 2 units x 2 tokens) of a unit pair with the
 * same float steps, in the same order, as the matvec's lane 8c + u; the
 * partials and the warp sum's tree as for Q4_K.  Half the A bytes are
 * zeros: twice the MMAs of Q4_K a weight, still few against the scaling.
 * Tokens meet the MMA columns one to one (xt_run<4>'s mapping) at any
 * count; absent tokens are not scaled. */

/* The input side of the tile's nt real tokens, once a block: tq6[2 (8 P +
 * t) + e] = 32 sq[2P + e], token t's integer sums over the 8-column groups
 * 2P, 2P + 1 (the quarter of a unit pair: a lane's 4 values of a quarter
 * in one 16-byte load), times 32 as the matvec's qs; td6[8 G + t] = dq[G],
 * its scale of the 32 columns G. */
__device__ __forceinline__ void xt6_tokens(const uint8_t *xg, int cols, int tok0, int nt, int *tq6, float *td6)
{
    const size_t xb = xs_xbytes(cols);
    const int g8 = cols / 8, g32 = cols / 32;
    for (int i = threadIdx.x; i < nt * g8; i += blockDim.x) {
        const int t = i / g8, G = i - t * g8;
        const int *sq = xs_sq((uint8_t *)(xg + (size_t)(tok0 + t) * xb), cols);
        tq6[2 * (8 * (G >> 1) + t) + (G & 1)] = 32 * sq[G];
    }
    for (int i = threadIdx.x; i < nt * g32; i += blockDim.x) {
        const int t = i / g32, G = i - t * g32;
        td6[8 * G + t] = xs_d((uint8_t *)(xg + (size_t)(tok0 + t) * xb), cols)[G];
    }
}

/* Shared memory of k_mvx24_mma6: tq6 and td6 (5 bytes a column), PS: the
 * 8 tokens' planes (xt_pstride words each), then the partials. */
static size_t xt6_smem(int64_t cols, bool ps)
{
    return 5 * (size_t)cols + (ps ? 4 * xt_pwords(cols) : 0) + XT_PART_BYTES;
}

/* a, xg, n as k_mvx24_mma; the job's Q6_K rows in the padded 212-byte
 * blocks (ql 128, qh 64, sc 16, d at 208).  Eight warps a tile: warp w the
 * units 4n .. 4n + 3 (n = w / 4) of the blocks of class c = w % 4, so a
 * lane holds 16 accumulators (4 units x 2 rows x 2 tokens). */
template <bool PS>
__global__ void __launch_bounds__(2 * XT_CLS * 32, 2) k_mvx24_mma6(mr_cu_mvjob a, int64_t total_rows,
                                                                     const uint8_t *xg, int n)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ __align__(16) float xt_sh[]; /* tq6, td6; PS: the planes; then the partials */
    const int tok0 = (int)blockIdx.y * XT_TOK, nt = n - tok0 < XT_TOK ? n - tok0 : XT_TOK;
    const int lane = threadIdx.x & 31, c = (threadIdx.x >> 5) & 3, hn = threadIdx.x >> 7, g = lane >> 2,
              q = lane & 3;
    const int cols = (int)a.cols, nb = cols / 256;
    const size_t xb = xs_xbytes(cols);
    int *tq6 = (int *)xt_sh;
    float *td6 = (float *)(tq6 + 8 * (cols / 8));
    uint32_t *ps = (uint32_t *)(xt_sh + 5 * cols / 4);
    float *part = PS ? (float *)(ps + xt_pwords(cols)) : xt_sh + 5 * cols / 4;
    /* B: token g's planes (an absent token: token tok0's, never scaled),
     * PS: from their copy in shared memory (as the Q4_K tiles) */
    const uint8_t *xB = xg + (size_t)(tok0 + (g < nt ? g : 0)) * xb + 4 * q;
    const uint32_t *xS = ps + (size_t)(g < nt ? g : 0) * xt_pstride(cols) + q;
    xt6_tokens(xg, cols, tok0, nt, tq6, td6);
    if constexpr (PS) xt_planes(xg, cols, tok0, nt, ps);
    __syncthreads();
    const uint32_t alo = q < 2 ? 0xFFFFFFFFu : 0u; /* lane q's word in a0 (q < 2) or a1 */
    const int64_t tiles = (total_rows + XT_ROWS - 1) / XT_ROWS;
    for (int64_t rt = blockIdx.x; rt < tiles; rt += gridDim.x) {
        const int64_t r0 = rt * XT_ROWS;
        /* the lane's rows g, g + 8 (past the end: row r0, computed, not stored) */
        const uint8_t *W[2];
        float *yd;
        int64_t ys;
        xs_row(a, r0 + g < total_rows ? r0 + g : r0, &W[0], &yd, &ys);
        xs_row(a, r0 + g + 8 < total_rows ? r0 + g + 8 : r0, &W[1], &yd, &ys);

        float acc[4][4]; /* [unit 4n + uh][row g + 8 rr, token 2q + k: 2 rr + k] */
#pragma unroll
        for (int uh = 0; uh < 4; uh++)
#pragma unroll
            for (int o = 0; o < 4; o++) acc[uh][o] = 0.0f;
        for (int b = c; b < nb; b += XT_CLS) {
            const uint8_t *p[2] = {W[0] + (size_t)b * 212, W[1] + (size_t)b * 212};
            float d[2];
            uint32_t sw[2][2]; /* the rows' scale words sc[8n .. 8n + 3], sc[8n + 4 .. 8n + 7] */
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                d[rr] = q8_h2f(q8_ld32(p[rr] + 208));
                sw[rr][0] = q8_ld32(p[rr] + 192 + 8 * hn);
                sw[rr][1] = q8_ld32(p[rr] + 196 + 8 * hn);
            }
#pragma unroll
            for (int kp = 0; kp < 2; kp++) { /* units 4n + 2kp + e, e = 0, 1 (uh = 2kp + e) */
                const int l = 16 * kp + 4 * q;
                uint32_t w[2][4]; /* the rows' quants at pair positions 4q .. 4q + 3, quarters 0..3 */
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
                    xs_q6k_words(q8_ld32(p[rr] + 64 * hn + l), q8_ld32(p[rr] + 64 * hn + 32 + l),
                                 q8_ld32(p[rr] + 128 + 32 * hn + l), w[rr]);
                float r[2][2][2] = {}; /* [rr][e][token 2q + k] */
#pragma unroll
                for (int qq = 0; qq < 4; qq++) {
                    const int col = 256 * b + 128 * hn + 32 * qq + 16 * kp; /* the pair's 16 columns */
                    uint32_t x0, x1, x2;
                    if constexpr (PS) {
                        x0 = xS[col / 4], x1 = xS[(cols + col) / 4], x2 = xS[(2 * cols + col) / 4];
                    } else {
                        x0 = q8_ld32(xB + col), x1 = q8_ld32(xB + cols + col), x2 = q8_ld32(xB + 2 * cols + col);
                    }
                    /* 32 sq[c / 8] of units 4n + 2kp + e and dq[c / 32] of
                     * tokens 2q + k (xt6_tokens) */
                    const int4 qv = *(const int4 *)(tq6 + 2 * (8 * (16 * b + 8 * hn + 2 * qq + kp) + 2 * q));
                    /* qs of C output 2e + k (unit 4n + 2kp + e, token 2q + k) */
                    const int qs[4] = {qv.x, qv.z, qv.y, qv.w};
                    const float2 dv = *(const float2 *)(td6 + 8 * (8 * b + 4 * hn + qq) + 2 * q);
                    const float dx[2] = {dv.x, dv.y};
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) {
                        /* (unit 4n + 2kp, tokens 2q, 2q + 1), (the next unit, the
                         * same): each sum of w q less its 32 sum q */
                        int s[4];
                        if constexpr (PS) {
                            xt_run3_less(s, w[rr][qq] & alo, w[rr][qq] & ~alo, x0, x1, x2, qs);
                        } else { /* without the planes in shared memory the fold spills (ptxas) */
                            xt_run3(s, w[rr][qq] & alo, w[rr][qq] & ~alo, x0, x1, x2);
                        }
                        const uint32_t v = sw[rr][qq >> 1];
                        const float sc = (float)(int8_t)((v >> (8 * kp + 16 * (qq & 1))) & 0xff);
#pragma unroll
                        for (int k = 0; k < 2; k++)
                            if (2 * q + k < nt)
#pragma unroll
                                for (int e = 0; e < 2; e++)
                                    r[rr][e][k] = xs_q6k_step(sc, dx[k], s[2 * e + k], PS ? 0 : qs[2 * e + k],
                                                              r[rr][e][k]);
                    }
                }
#pragma unroll
                for (int rr = 0; rr < 2; rr++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
#pragma unroll
                        for (int k = 0; k < 2; k++)
                            acc[2 * kp + e][2 * rr + k] = xs_fma(d[rr], r[rr][e][k], acc[2 * kp + e][2 * rr + k]);
            }
        }
        __syncthreads(); /* every thread done with the previous tile's store from part */
#pragma unroll
        for (int uh = 0; uh < 4; uh++)
#pragma unroll
            for (int o = 0; o < 4; o++)
                part[((g + 8 * (o >> 1)) * XT_TOK + 2 * q + (o & 1)) * XT_PSTR + 8 * c + 4 * hn + uh] = acc[uh][o];
        __syncthreads();
        if (threadIdx.x < XT_ROWS * XT_TOK)
            xt_store(a, total_rows, r0, tok0, nt, part);
    }
}

/* Whether the tile kernel of type T takes cols columns: its shared memory
 * within what the backend's launches may ask (c->x24_smem,
 * mr_cu_x24_init). */
bool mr_cu_x24_mma_ok(const mr_cu_ctx *c, int T, int64_t cols)
{
    if (T == MR_TYPE_Q4_K)
        return xt4_smem(cols, 1) <= c->x24_smem;
    return T == MR_TYPE_Q6_K && xt6_smem(cols, false) <= c->x24_smem;
}

/* At backend creation: launches of the tile kernels may ask for up to
 * bytes of shared memory (wide inputs need more than the default 48 KB). */
bool mr_cu_x24_mma_optin(int bytes)
{
    const void *k[] = {(const void *)k_mvx24_mma6<false>, (const void *)k_mvx24_mma6<true>,
                       (const void *)k_mvx24_mma<0>,        (const void *)k_mvx24_mma<1>,
                       (const void *)k_mvx24_mma<2>,        (const void *)k_mvx24_mma<4>};
    for (const void *f : k)
        if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
            return false;
    return true;
}

/* n tokens of the job a, Q6_K from the padded copy (xs_job), total_rows
 * rows; xg: the planes; cols that mr_cu_x24_mma_ok takes (times:
 * docs/GPU-NOTES.md 63). */
void mr_cu_x24_mma_q6k(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int n)
{
    /* the planes in shared memory where two blocks an SM still fit (the
     * 30B-A3B's head of 2,048 columns, not the 8B's of 4,096) */
    const size_t sps = xt6_smem(a.cols, true), smem = xt6_smem(a.cols, false);
    const int fps = sps <= c->x24_smem ? mr_cu_fit(c, (const void *)k_mvx24_mma6<true>, 2 * XT_CLS * 32, sps) : 0;
    if (fps >= 2) {
        mr_cu_launch(c, k_mvx24_mma6<true>, xt_grid(c, total_rows, n, fps), 2 * XT_CLS * 32, sps, a, total_rows, xg,
                     n);
    } else {
        const int fit = mr_cu_fit(c, (const void *)k_mvx24_mma6<false>, 2 * XT_CLS * 32, smem);
        mr_cu_launch(c, k_mvx24_mma6<false>, xt_grid(c, total_rows, n, fit), 2 * XT_CLS * 32, smem, a, total_rows,
                     xg, n);
    }
    MR_CU_LAUNCHED(c, "x24 tensor-core matvec (Q6_K)");
}

/* Decode batches of Q4_K plain products on the tensor cores, with the same
 * bits as the one-token 22-bit kernel (cu_mvx24.cu).
 *
 * Why: at 2+ tokens a launch the matvec kernels are bound by loading every
 * token's input from L1 once per row group (docs/GPU-NOTES.md 33: Q4_K
 * 24576x4096 at 16 tokens takes 252 us, ~5% of copy bandwidth), while an
 * int8 MMA of 16 rows against 8 tokens reuses each load 8 and 16 times.
 *
 * Why the same bits: the 22-bit kernel forms a (row, token) sum as
 *   lane L (0..31) sums the units L, L + 32, L + 64, ... in order (unit
 *   8b + u: block b, run pair u), each unit's share from the exact integer
 *   sums of its two 16-column runs (xs_q4k_scale), then a warp sum
 *   (xor 16, 8, 4, 2, 1).
 * m16n8k16 with s32 accumulation gives the same exact integer sums for a
 * 16-column run (three byte planes, joined as the matvec joins them), so a
 * warp here walks the blocks in the classes b = c, c + 4, c + 8, ... (the
 * blocks of lanes 8c .. 8c + 7), keeps the eight running partials of that
 * class for each of its (row, token) outputs, parks them in shared memory,
 * and adds the 32 partials of an output in the warp sum's tree.  So a
 * token's rows do not depend on how many tokens share the launch, nor on
 * which kernel ran them (kernel-check: batch-inv-x24 at 4+ tokens against
 * one token).
 *
 * Fragments (PTX ISA, mma.m16n8k16 with .s8/.u8): A (16 rows x 16 columns
 * of weight nibbles): lane (g = lane / 4, q = lane % 4) holds rows g and
 * g + 8, columns 4q .. 4q + 3, one 32-bit word each; B (16 columns x 8
 * tokens): token g, columns 4q .. 4q + 3; C: rows g, g + 8 x tokens 2q,
 * 2q + 1.  A Q4_K run of 16 columns is 16 qs bytes (low nibbles, or high
 * nibbles for the run 32 columns on), so lane q's word of the run is the
 * word at 4q: one 32-bit load a row gives both runs of a unit. */
#include <stdlib.h>

#include "kernels/cuda/cu_x24.cuh"

#define XT_WARPS 2 /* warps a block (16 rows each) */
#define XT_TOK 8   /* tokens a tile: the n of m16n8k16 */
#define XT_ROWS 16 /* rows a warp: the m */

/* d += a b over one 16-column run: a signed (weights), b signed (the high
 * plane) or unsigned (the middle and low planes). */
__device__ __forceinline__ void xt_mma_ss(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void xt_mma_su(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

/* The warp sum of mr_warp_sum (lane 0's result) over 32 partials p. */
__device__ __forceinline__ float xt_tree(const float *p)
{
    float v[16];
#pragma unroll
    for (int l = 0; l < 16; l++) v[l] = p[l] + p[l + 16];
#pragma unroll
    for (int o = 8; o > 0; o >>= 1)
#pragma unroll
        for (int l = 0; l < o; l++) v[l] = v[l] + v[l + o];
    return v[0];
}

/* a: the launch's rows (sub-matrices as in k_mvx24); xg: the n tokens'
 * planes (k_x24_quant), xs_xbytes(cols) apart.  Grid: x the row tiles
 * (XT_WARPS a block), y the token tiles. */
__global__ void __launch_bounds__(XT_WARPS * 32) k_mvx24_mma(mr_cu_mvjob a, int64_t total_rows, const uint8_t *xg,
                                                             int n)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    __shared__ float part[XT_WARPS][XT_ROWS * XT_TOK][33]; /* an output's 32 partials (33: banks) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t r0 = ((int64_t)blockIdx.x * XT_WARPS + warp) * XT_ROWS;
    if (r0 >= total_rows)
        return; /* nothing below synchronizes the block */
    const int tok0 = blockIdx.y * XT_TOK;
    const int cols = (int)a.cols, nb = cols / 256;
    const size_t xb = xs_xbytes(cols);
    /* this lane's two rows (past the end: row r0, computed, not stored) */
    const uint8_t *WA, *WB;
    float *yd;
    int64_t ys;
    xs_row(a, r0 + g < total_rows ? r0 + g : r0, &WA, &yd, &ys);
    xs_row(a, r0 + g + 8 < total_rows ? r0 + g + 8 : r0, &WB, &yd, &ys);
    /* token g's planes (B), and tokens 2q, 2q + 1's scales and sums (C) */
    const uint8_t *xB = xg + (size_t)(tok0 + g < n ? tok0 + g : tok0) * xb;
    const uint8_t *xC[2];
#pragma unroll
    for (int k = 0; k < 2; k++) xC[k] = xg + (size_t)(tok0 + 2 * q + k < n ? tok0 + 2 * q + k : tok0) * xb;

    for (int c = 0; c < 4; c++) {
        float acc[8][4]; /* [unit][output: (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)] */
#pragma unroll
        for (int u = 0; u < 8; u++)
#pragma unroll
            for (int o = 0; o < 4; o++) acc[u][o] = 0.0f;
        for (int b = c; b < nb; b += 4) {
            const uint8_t *bA = WA + (size_t)b * 144, *bB = WB + (size_t)b * 144;
            const uint4 hA = __ldg((const uint4 *)bA), hB = __ldg((const uint4 *)bB);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int j = u >> 1, h = u & 1;
                const int off = 16 + 32 * j + 16 * h + 4 * q;
                const uint32_t wA = q8_ld32(bA + off), wB = q8_ld32(bB + off);
                const int ca = 256 * b + 64 * j + 16 * h, cb = ca + 32; /* the unit's two runs */
                int dl[3][4] = {}, dh[3][4] = {};
                const uint32_t aL0 = wA & 0x0F0F0F0Fu, aL1 = wB & 0x0F0F0F0Fu;
                const uint32_t aH0 = (wA >> 4) & 0x0F0F0F0Fu, aH1 = (wB >> 4) & 0x0F0F0F0Fu;
                xt_mma_ss(dl[0], aL0, aL1, q8_ld32(xB + ca + 4 * q));
                xt_mma_su(dl[1], aL0, aL1, q8_ld32(xB + cols + ca + 4 * q));
                xt_mma_su(dl[2], aL0, aL1, q8_ld32(xB + 2 * cols + ca + 4 * q));
                xt_mma_ss(dh[0], aH0, aH1, q8_ld32(xB + cb + 4 * q));
                xt_mma_su(dh[1], aH0, aH1, q8_ld32(xB + cols + cb + 4 * q));
                xt_mma_su(dh[2], aH0, aH1, q8_ld32(xB + 2 * cols + cb + 4 * q));
#pragma unroll
                for (int k = 0; k < 2; k++) { /* token 2q + k */
                    const float *dq = xs_d((uint8_t *)xC[k], cols);
                    const int *sq = xs_sq((uint8_t *)xC[k], cols);
                    const float da = dq[ca / 32], db = dq[cb / 32];
                    const float qa = (float)(sq[ca / 8] + sq[ca / 8 + 1]), qb = (float)(sq[cb / 8] + sq[cb / 8 + 1]);
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) { /* row g + 8 rr: output 2 rr + k */
                        const int o = 2 * rr + k;
                        const int il[3] = {dl[0][o], dl[1][o], dl[2][o]}, ih[3] = {dh[0][o], dh[1][o], dh[2][o]};
                        acc[u][o] = xs_q4k_scale(rr ? hB : hA, j, xs_join(il), xs_join(ih), da, db, qa, qb, acc[u][o]);
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
#pragma unroll
            for (int o = 0; o < 4; o++) {
                const int row = g + 8 * (o >> 1), tok = 2 * q + (o & 1);
                part[warp][row * XT_TOK + tok][8 * c + u] = acc[u][o];
            }
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < XT_ROWS * XT_TOK / 32; k++) {
        const int out = lane + 32 * k, row = out / XT_TOK, tok = out % XT_TOK;
        const float v = xt_tree(part[warp][out]);
        if (r0 + row < total_rows && tok0 + tok < n) {
            const uint8_t *W;
            float *y;
            int64_t s;
            xs_row(a, r0 + row, &W, &y, &s);
            y[(int64_t)(tok0 + tok) * s] = v;
        }
    }
}

/* n tokens (1 .. MR_CU_GEMM_MIN_TOKENS - 1) of the job a, Q4_K from the
 * GGUF blocks, total_rows rows (sub-matrices included); xg: the planes.
 * Measured (run 47, H200): correct to the bit, but slower than the matvec
 * below ~8 tokens and only ~1.2-2.4x faster at 16 (a first version: every
 * tile runs the float scaling of 8 tokens, 194 registers, two warps a
 * block, the input read from L1). */
void mr_cu_x24_mma(mr_cu_ctx *c, const mr_cu_mvjob &a, int64_t total_rows, const uint8_t *xg, int n)
{
    const int64_t tiles = (total_rows + XT_ROWS - 1) / XT_ROWS;
    const dim3 grid((unsigned)((tiles + XT_WARPS - 1) / XT_WARPS), (unsigned)((n + XT_TOK - 1) / XT_TOK));
    mr_cu_launch(c, k_mvx24_mma, grid, XT_WARPS * 32, 0, a, total_rows, xg, n);
    MR_CU_LAUNCHED(c, "x24 tensor-core matvec");
}

/* Prompt products of IQ4_XS and Q4_K matrices on the int8 tensor cores:
 * the experts (moe_ffn_prompt, matmul_id_prompt), and the dense products
 * (matmul_prompt) where float32-grade products are asked for (f16x3: the
 * hybrids), against inputs quantized to 2 or 3 int8 planes (Q4_K's mins'
 * term as cu_moemma.cu's): the default (MEMRA_CUDA_XMP=4: 4 blocks an SM;
 * =0: the float16 and f16x3 kernels of cu_gemm.cu; MEMRA_CUDA_XMP_Q4K=0:
 * those for Q4_K only).  Run 173 (H200, the 35B-A3B's 512-token prompt):
 * 5,213 -> 6,698 tok/s; the experts 710 -> 465 us a layer, the
 * in-projection 8,192 x 2,048 296 -> 205 us, the o 2,048 x 4,096 216 -> 125;
 * run 177, the 30B-A3B's Q4_K experts: pp512 12,339 / 12,486 -> 13,473 /
 * 13,454.
 *
 * Why: the float16 fused expert kernel (cu_gemm.cu k_moe_gemm) decodes
 * every weight of a tile into shared memory as float16 and reads it back
 * for the WMMAs; with 256 experts a 512-token prompt gives an expert ~16
 * tokens, so each decoded weight serves a quarter of the tile's MMA
 * columns and the decode and the shared memory traffic are the kernel's
 * time (run 134: 712 us a layer of the 35B-A3B's 512-token prompt, 29% of
 * it, against ~120 us to read the layer's 428 MB of experts once).  The
 * dense products of the hybrids are float32-grade (f16x3: three float16
 * MMAs a product, each weight tile decoded and split first): 40% of the
 * 35B-A3B's prompt after the experts (run 172).  Here the weights never
 * leave registers: a lane loads the IQ4_XS quant words of its MMA fragment
 * (cu_x24.cuh's xs_iq4w, as cu_moemma.cu does: a sub-block's qs word 16 j
 * + 4c holds lane c's fragment columns 4c.. in its low nibbles and 16 +
 * 4c.. in its high ones) and looks them up as code book bytes (xs_iq4nl8), so
 * an m16n8k32 MMA takes 16 rows by one 32-column sub-block of weights as
 * they are: the code book values are exact int8.
 *
 * The input: every row (a token's, or for the experts silu(gate) * up of
 * a pair for the down product) is quantized once a call, per 256 columns,
 * to q = rint(x / d), d = absmax / QMAX, as PL balanced int8 digits:
 *   PL 2: q = 256 hi + lo, QMAX 32639: 15 bits of magnitude, a value's
 *         error at most absmax 2^-16 (float16, the kernels these replace
 *         in the default precision: 2^-11 of the value);
 *   PL 3: q = 65536 hi + 256 mid + lo, QMAX 2^21 - 1 (cu_moemma.cu's
 *         planes): absmax 2^-22, float32-grade, for f16x3 mode.
 * An MMA's 8 columns are 8 tokens of one plane, so a lane's C values are
 * its rows g, g + 8 for tokens 2c, 2c + 1, and a (row, token)'s planes sit
 * in the same lane, one MMA apart.
 *
 * Per 256-column block (one IQ4_XS super-block, one input scale): per
 * sub-block j an MMA a plane and 8 tokens, scaled by the row's 6-bit ls_j
 * - 32 as integers (IMAD); then in float per (row, token): f += dx (d v),
 * v the planes joined (256 Mhi + Mlo, or 65536 Mhi + (256 Mmid + Mlo)).
 * Integer sums are exact: a sub-block's plane sum is at most 32 * 127 *
 * 128 < 2^19, times |ls - 32| <= 32, over 8 sub-blocks: < 2^27.  A (row,
 * token)'s result depends on its own input row and weights only, never on
 * the tile it falls in or the call's other tokens.
 *
 * A block: 4 warps of 16 rows each (64 rows), one tile of at most XMP_BN
 * tokens (the experts: of one expert, cu_gemm.cu's grouping with tiles of
 * XMP_BN; dense: tokens 32 y ..); the tile's planes stream through a ring
 * of xmp_stages 256-column steps in shared memory (cp.async), each warp's
 * weights one step ahead in registers. */
#include "kernels/cuda/cu_mma.cuh" /* mr_cp16, mr_imma32_ss */
#include "kernels/cuda/cu_xmp.cuh"

#define XMP_BN 32          /* tokens a tile: 4 MMA groups of 8 */
#define XMP_TG (XMP_BN / 8)
/* a token's block in the ring, padded to 32 mod 128 bytes: a half warp's
 * 8-byte reads (4 tokens, lanes c 0..3) hit distinct banks */
template <int T, int PL> constexpr int xmp_ts() { return (xmp_blk<T, PL>() + 95) / 128 * 128 + 32; }
/* 256-column steps of the tile's planes in flight: 3 (52 KB a block for
 * IQ4_XS at PL 2), 2 at PL 3 (51 KB; a step is 1.5 times the work) */
template <int PL> constexpr int xmp_stages() { return PL == 2 ? 3 : 2; }
template <int T, int PL> constexpr int xmp_smem() { return xmp_stages<PL>() * XMP_BN * xmp_ts<T, PL>(); }

/* Rows of the operand: row i is input row src[i] of x (src NULL: row i;
 * negative: a zero row), or silu(x) * u of that row where u is not NULL,
 * the swiglu op's expression (mr_silu_mul), so that the down product of
 * moe_ffn_prompt sees the values matmul_id_prompt would.  A warp a
 * 256-column block: lane l's columns 8l .. 8l + 7.  A block with a NaN or
 * an infinity gets dx = NaN and q = 0: its products are NaN, as with float
 * activations. */
template <int T, int PL>
__global__ void __launch_bounds__(256) k_xmp_quant(const float *__restrict__ x, int cols, const int32_t *src,
                                                   const float *__restrict__ u, int n_rows, uint8_t *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int lane = threadIdx.x & 31, nsb = cols / 256;
    const int gw = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int i = gw / nsb, b = gw % nsb;
    if (i >= n_rows)
        return;
    const int s = src ? src[i] : i;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (s >= 0) {
        const float4 *xr = (const float4 *)(x + (size_t)s * cols + 256 * b + 8 * lane);
        const float4 a = xr[0], c = xr[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = c.x; v[5] = c.y; v[6] = c.z; v[7] = c.w;
        if (u) {
            const float4 *ur = (const float4 *)(u + (size_t)s * cols + 256 * b + 8 * lane);
            const float4 ua = ur[0], uc = ur[1];
            const float w[8] = {ua.x, ua.y, ua.z, ua.w, uc.x, uc.y, uc.z, uc.w};
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = mr_silu_mul(v[k], w[k]);
        }
    }
    xmp_quant_block<T, PL>(v, out + ((size_t)i * nsb + b) * xmp_blk<T, PL>(), lane);
}

/* Tile of work (cu_gemm.cu's grouping): expert m, its tokens at operand
 * rows [row0, row0 + cnt). */
struct xmp_tile {
    int m, row0, cnt;
};

/* MINB: blocks an SM (PL 2: 3, or 4 with fewer registers:
 * MEMRA_CUDA_XMP=4; PL 3: 3, or 4).
 * grid: x the row blocks of 64, y the tiles (tiles NULL: dense, tile y is
 * tokens 32 y ..; else blocks past *n_tiles return), z the matrix (1: W2
 * into y2, the up of a gate/up pair).  Xq: the operand (k_xmp_quant);
 * dst[i]: the output row of operand row i (NULL: row i). */
template <int T, int PL, int MINB>
__global__ void __launch_bounds__(128, MINB)
k_xmp(const uint8_t *W, size_t mat_bytes, size_t row_bytes, int cols, int rows, int n,
          const uint8_t *__restrict__ Xq, const int32_t *__restrict__ dst, const xmp_tile *__restrict__ tiles,
          const int *n_tiles, float *y, const uint8_t *W2, float *y2)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    constexpr int BLK = xmp_blk<T, PL>(), TS = xmp_ts<T, PL>(), CH = BLK / 16, XMP_STAGES = xmp_stages<PL>();
    constexpr int WB = xmp_type<T>::bytes;
    using words = typename xmp_type<T>::words;
    extern __shared__ __align__(16) uint8_t xmp_sh[];
    xmp_tile tl;
    if (tiles) {
        if ((int)blockIdx.y >= *n_tiles) /* the grid is sized for the most tiles the call can have */
            return;
        tl = tiles[blockIdx.y];
    } else {
        tl.m = 0;
        tl.row0 = XMP_BN * (int)blockIdx.y;
        tl.cnt = min(XMP_BN, n - tl.row0);
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    if (blockIdx.z) {
        W = W2;
        y = y2;
    }
    const int nsb = cols / 256, ng = (tl.cnt + 7) >> 3; /* groups of 8 tokens with tokens */
    const int ra = (int)blockIdx.x * 64 + 16 * warp + g; /* rows ra, ra + 8 (rows % 64 == 0) */
    const uint8_t *Wa = W + (size_t)tl.m * mat_bytes + (size_t)ra * row_bytes, *Wb = Wa + 8 * row_bytes;
    const uint8_t *xsrc = Xq + (size_t)tl.row0 * nsb * BLK;
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(xmp_sh);
    /* step b's blocks of the tile's tokens into slot b % XMP_STAGES, CH
     * chunks of 16 bytes a token (tokens past cnt are never written: their
     * MMA columns are computed from stale bytes and never stored) */
    auto fetch = [&](int b) {
        const uint32_t slot = ring + (uint32_t)((b % XMP_STAGES) * XMP_BN * TS);
        for (int e = tid; e < tl.cnt * CH; e += 128) {
            const int t = e / CH, q = e - CH * t;
            mr_cp16(slot + t * TS + 16 * q, xsrc + ((size_t)t * nsb + b) * BLK + 16 * q, true);
        }
    };
#pragma unroll
    for (int b = 0; b < XMP_STAGES - 1; b++) {
        if (b < nsb)
            fetch(b);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    words ca, cb, na, nb;
    xmp_load(Wa, c, ca);
    xmp_load(Wb, c, cb);
    float f[XMP_TG][4]; /* rows ra, ra + 8 by tokens 8 q + 2c, + 1 */
#pragma unroll
    for (int q = 0; q < XMP_TG; q++) f[q][0] = f[q][1] = f[q][2] = f[q][3] = 0.0f;
    /* this lane's B column g: token 8q + g, at 8c of a plane's 32 bytes */
    const int boff = g * TS + 8 * c;
#pragma unroll 1
    for (int b = 0; b < nsb; b++) {
        if (b + XMP_STAGES - 1 < nsb)
            fetch(b + XMP_STAGES - 1);
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (b + 1 < nsb) {
            xmp_load(Wa + (size_t)(b + 1) * WB, c, na);
            xmp_load(Wb + (size_t)(b + 1) * WB, c, nb);
        }
        asm volatile("cp.async.wait_group %0;" ::"n"(XMP_STAGES - 1) : "memory");
        __syncthreads(); /* every thread's copies of step b have landed */
        const uint8_t *slot = xmp_sh + (b % XMP_STAGES) * XMP_BN * TS;
        int M[XMP_TG][PL][4];
#pragma unroll
        for (int q = 0; q < XMP_TG; q++)
#pragma unroll
            for (int p = 0; p < PL; p++) M[q][p][0] = M[q][p][1] = M[q][p][2] = M[q][p][3] = 0;
        uint32_t sc[2][2] = {}, mn[2][2] = {}; /* Q4_K: rows a, b; sub-blocks 0..3, 4..7 */
        if constexpr (T == MR_TYPE_Q4_K)
            xmp_q4k_scales(ca, cb, sc, mn);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t A[4];
            int sa, sb;
            if constexpr (T == MR_TYPE_Q4_K)
                xmp_frag(ca, cb, j, A, sa, sb, sc[0][j >> 2], sc[1][j >> 2]);
            else
                xmp_frag(ca, cb, j, A, sa, sb);
#pragma unroll
            for (int q = 0; q < XMP_TG; q++) {
                if (q < ng) {
#pragma unroll
                    for (int p = 0; p < PL; p++) {
                        const uint2 bw = *(const uint2 *)(slot + 8 * q * TS + boff + (PL * j + p) * 32);
                        int C[4] = {0, 0, 0, 0};
                        if constexpr (T == MR_TYPE_Q4_K)
                            mr_imma32_us(C, A, bw.x, bw.y);
                        else
                            mr_imma32_ss(C, A, bw.x, bw.y);
                        M[q][p][0] += sa * C[0];
                        M[q][p][1] += sa * C[1];
                        M[q][p][2] += sb * C[2];
                        M[q][p][3] += sb * C[3];
                    }
                }
            }
        }
        /* Q4_K's mins: N = sum_j m_j S_j a plane, two MMAs (the mins as A
         * at k = j, lanes c 0 and 1; the sums' low and high digits as B),
         * N = 256 Nh + Nl (cu_moemma.cu's xmm_q4k_step) */
        int N[XMP_TG][PL][4];
        if constexpr (T == MR_TYPE_Q4_K) {
            const uint32_t Am[4] = {c == 0 ? mn[0][0] : c == 1 ? mn[0][1] : 0u,
                                    c == 0 ? mn[1][0] : c == 1 ? mn[1][1] : 0u, 0u, 0u};
#pragma unroll
            for (int q = 0; q < XMP_TG; q++) {
                if (q < ng) {
#pragma unroll
                    for (int p = 0; p < PL; p++) {
                        const uint2 xs = *(const uint2 *)(slot + (8 * q + g) * TS + 256 * PL + 16 + 16 * p + 8 * (c & 1));
                        int Nl[4] = {0, 0, 0, 0}, Nh[4] = {0, 0, 0, 0};
                        mr_imma32_us(Nl, Am, xs.x, 0u);
                        mr_imma32_us(Nh, Am, xs.y, 0u);
#pragma unroll
                        for (int v = 0; v < 4; v++) N[q][p][v] = 256 * Nh[v] + Nl[v];
                    }
                }
            }
        }
        float da, db, dma = 0.0f, dmb = 0.0f;
        if constexpr (T == MR_TYPE_Q4_K) {
            da = q8_h2f(ca.h.x);
            dma = q8_h2f(ca.h.x >> 16);
            db = q8_h2f(cb.h.x);
            dmb = q8_h2f(cb.h.x >> 16);
        } else {
            da = q8_h2f(ca.hd.x);
            db = q8_h2f(cb.hd.x);
        }
#pragma unroll
        for (int q = 0; q < XMP_TG; q++) {
            if (q < ng) {
                const float dx0 = *(const float *)(slot + (8 * q + 2 * c) * TS + 256 * PL);
                const float dx1 = *(const float *)(slot + (8 * q + 2 * c + 1) * TS + 256 * PL);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    int Mv[PL];
#pragma unroll
                    for (int p = 0; p < PL; p++) Mv[p] = M[q][p][v];
                    float w = __fmul_rn(v < 2 ? da : db, xmp_join<PL>(Mv));
                    if constexpr (T == MR_TYPE_Q4_K) {
                        int Nv[PL];
#pragma unroll
                        for (int p = 0; p < PL; p++) Nv[p] = N[q][p][v];
                        w = __fmaf_rn(-(v < 2 ? dma : dmb), xmp_join<PL>(Nv), w);
                    }
                    f[q][v] = __fmaf_rn(v & 1 ? dx1 : dx0, w, f[q][v]);
                }
            }
        }
        ca = na;
        cb = nb;
        __syncthreads(); /* the slot is read before step b + XMP_STAGES lands in it */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int q = 0; q < XMP_TG; q++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int t = 8 * q + 2 * c + h;
            if (q < ng && t < tl.cnt) {
                const int p = dst ? dst[tl.row0 + t] : tl.row0 + t;
                if (p >= 0) {
                    y[(size_t)p * rows + ra] = f[q][h];
                    y[(size_t)p * rows + ra + 8] = f[q][2 + h];
                }
            }
        }
    }
}

/* ---- host side ---- */

/* Whether the kernels take w: IQ4_XS (unless MEMRA_CUDA_XMP=0) or Q4_K
 * (unless MEMRA_CUDA_XMP_Q4K=0 as well: run 177, fixture parity passed on
 * the qwen3moe and qwen35moe Q4_K_M files with it, sched-bench --check 16
 * of 16, the 30B-A3B's pp512 12,339 / 12,486 -> 13,473 / 13,454 with its
 * Q4_K experts here and its Q6_K downs on the float16 kernel) of whole
 * 256-column blocks and whole 64-row tiles.  Experts go to cu_moemmh.cu
 * first (the float16 tensor cores, weights decoded in registers: run 201,
 * twice this kernel's speed for Q4_K at 32+ tokens an expert); this kernel
 * takes them with MEMRA_CUDA_XMH=0 (IQ4_XS: MEMRA_CUDA_XMH_IQ4=0), and
 * takes the dense products in f16x3 mode. */
bool mr_cu_xmp_takes(const mr_cu_ctx *c, const mr_weight *w)
{
    const bool t = w->type == MR_TYPE_IQ4_XS || (w->type == MR_TYPE_Q4_K && c->xmp_q4k);
    return c->xmp && t && w->data && w->cols % 256 == 0 && w->rows % 64 == 0 && w->rows <= (1 << 30);
}

/* The operand of n_rows rows (k_xmp_quant's comment) in buf, reserved
 * here; NULL when that fails (the context has failed). */
template <int T, int PL>
static const uint8_t *xmp_operand(mr_cu_ctx *c, mr_cu_buf *buf, const float *x, const int32_t *src, const float *u,
                                  int n_rows, int cols)
{
    const size_t blocks = (size_t)n_rows * (size_t)(cols / 256);
    if (!mr_cu_reserve(c, buf, blocks * xmp_blk<T, PL>(), "GEMM int8 operand"))
        return NULL;
    mr_cu_launch(c, k_xmp_quant<T, PL>, (unsigned)((blocks + 7) / 8), 256, 0, x, cols, src, u, n_rows,
                 (uint8_t *)buf->p);
    MR_CU_LAUNCHED(c, "xmp input");
    return (const uint8_t *)buf->p;
}

const uint8_t *mr_cu_xmp_operand_q4k3(mr_cu_ctx *c, mr_cu_buf *buf, const float *x, int n_rows, int cols)
{
    return xmp_operand<MR_TYPE_Q4_K, 3>(c, buf, x, nullptr, nullptr, n_rows, cols);
}

const uint8_t *mr_cu_xmp_operand_iq4x3(mr_cu_ctx *c, mr_cu_buf *buf, const float *x, int n_rows, int cols)
{
    return xmp_operand<MR_TYPE_IQ4_XS, 3>(c, buf, x, nullptr, nullptr, n_rows, cols);
}

/* Quantizes the operand rows into the activation scratch, then launches
 * the products (k_xmp_quant's and k_xmp's comments). */
template <int T, int PL>
static void xmp_run(mr_cu_ctx *c, const mr_weight *w, const mr_weight *w2, const float *x, const int32_t *src,
                    const float *u, int n_rows, const int32_t *dst, const void *tiles, const int *n_tiles,
                    int64_t max_tiles, float *y, float *y2)
{
    static_assert(sizeof(xmp_tile) == 3 * sizeof(int), "the grouping's tile record");
    const int cols = (int)w->cols;
    const uint8_t *Xq = xmp_operand<T, PL>(c, &c->scratch_act, x, src, u, n_rows, cols);
    if (!Xq)
        return;
    const int64_t ty = tiles ? max_tiles : (n_rows + XMP_BN - 1) / XMP_BN;
    const dim3 grid((unsigned)(w->rows / 64), (unsigned)ty, w2 ? 2 : 1);
#define XMP_ARGS grid, 128, xmp_smem<T, PL>(), (const uint8_t *)w->data, w->row_bytes * (size_t)w->rows, w->row_bytes, \
                 cols, (int)w->rows, n_rows, Xq, dst, (const xmp_tile *)tiles, n_tiles, y,                     \
                 w2 ? (const uint8_t *)w2->data : (const uint8_t *)nullptr, y2
    if (c->xmp == 4)
        mr_cu_launch(c, k_xmp<T, PL, 4>, XMP_ARGS);
    else
        mr_cu_launch(c, k_xmp<T, PL, 3>, XMP_ARGS);
#undef XMP_ARGS
    MR_CU_LAUNCHED(c, "xmp GEMM");
}

void mr_cu_xmp_product(mr_cu_ctx *c, const mr_weight *w, const mr_weight *w2, const float *x, const int32_t *src,
                       const float *u, int n_rows, int pl, const int32_t *dst, const void *tiles, const int *n_tiles,
                       int64_t max_tiles, float *y, float *y2)
{
#define XR(TT, PP) xmp_run<TT, PP>(c, w, w2, x, src, u, n_rows, dst, tiles, n_tiles, max_tiles, y, y2)
    if (w->type == MR_TYPE_Q4_K && pl == 3)
        XR(MR_TYPE_Q4_K, 3);
    else if (w->type == MR_TYPE_Q4_K)
        XR(MR_TYPE_Q4_K, 2);
    else if (pl == 3)
        XR(MR_TYPE_IQ4_XS, 3);
    else
        XR(MR_TYPE_IQ4_XS, 2);
#undef XR
}

int mr_cu_xmp_tile_tokens(void) { return XMP_BN; }

template <int T, int PL> static bool xmp_optin()
{
    return cudaFuncSetAttribute(k_xmp<T, PL, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, xmp_smem<T, PL>()) ==
               cudaSuccess &&
           cudaFuncSetAttribute(k_xmp<T, PL, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, xmp_smem<T, PL>()) ==
               cudaSuccess;
}

/* At backend creation, outside any capture: the rings' shared memory. */
bool mr_cu_xmp_init(mr_cu_ctx *c)
{
    const char *e = getenv("MEMRA_CUDA_XMP");
    c->xmp = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "4") ? 4 : 3;
    const char *q = getenv("MEMRA_CUDA_XMP_Q4K");
    c->xmp_q4k = !(q && !strcmp(q, "0"));
    return xmp_optin<MR_TYPE_IQ4_XS, 2>() && xmp_optin<MR_TYPE_IQ4_XS, 3>() && xmp_optin<MR_TYPE_Q4_K, 2>() &&
           xmp_optin<MR_TYPE_Q4_K, 3>();
}

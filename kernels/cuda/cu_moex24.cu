/* Expert products of decode (matmul_id, 1..64 tokens) with 22-bit integer
 * activations: the units of cu_x24.cuh (dp4a on three byte planes of the
 * input; Q4_K and IQ4_XS from the GGUF blocks, Q6_K and Q8_0 from the
 * padded copy) on the experts the tokens chose.
 *
 * Why: a decode batch of 16 tokens on the 30B-A3B shape spends ~12 ms of a
 * ~26 ms step in the float grouped kernels (cu_fast.cu, k_fast_grouped),
 * which are issue-bound (docs/GPU-NOTES.md 16: 12-26% of copy bandwidth),
 * not in moving the ~4 ms of experts it reads; the integer units take ~1.9
 * instructions a weight against ~3.4.  The 35B-A3B's experts are IQ4_XS,
 * whose float kernels also pay a code book lookup a weight (GPU-NOTES
 * 38).
 *
 * Shape of the work.  The inputs are quantized once per call by their own
 * small kernel (k_x24_quant: a row per token, or per pair when each pair
 * has its own input, as the down product).  One token (the common decode
 * step): grid.y is the pair, the block reads its expert id itself.  More
 * tokens: the grouping kernel of cu_fast.cu lists the used experts and
 * their pairs, grid.y is the slot (used experts first; blocks of unused
 * slots exit), and every block walks its rows once per chunk of up to 2 of
 * its expert's pairs (cu_mvx24.cu's x24_nt_max), so an expert is read from
 * memory once per call while its rows stay in L1/L2 between chunks.  grid.z is the matrix (gate and
 * up of one step in one launch).
 *
 * Exactness: a (pair, row) is summed as in the plain x24 kernel (a lane's
 * units in order, each unit's scaling with its rounding spelled out, then
 * a warp sum), whatever the chunk it falls in and however many tokens
 * share the call, so a request's tokens do not depend on its batchmates
 * (kernel-check batch-inv-x24 compares 2..5 tokens with each alone). */
#include <string.h>

#include <type_traits>

#include "kernels/cuda/cu_x24.cuh"

#define XM_WARPS 4 /* warps a block */
#define XM_ROWS 4  /* rows a warp takes at a time */

/* acc[t R + i] = this lane's share of row i (rows at Wr[i]) for token t
 * (planes xt[t]): its units lane, lane + LW, ... in order (LW 16: lane is
 * the lane in its half warp).  The loop is
 * k_mvx24's, written out there too: sharing it with the plain kernel
 * changed ptxas' register spills in the measured one-token kernels (up to
 * 52 bytes instead of 4 for the Q6_K instance), a change no GPU run has
 * timed. */
template <int T, int R, int NT, class P = int, int LW = 32>
__device__ __forceinline__ void xm_units(const uint8_t *const *Wr, const uint8_t *const *xt, int cols, int lane,
                                         float *acc, const P *pre = nullptr)
{
    constexpr int S = xs_type<T>::STRIDE;
#pragma unroll
    for (int i = 0; i < NT * R; i++) acc[i] = 0.0f;
    const int units = cols / 32;
    int un = lane;
    if constexpr (!std::is_same<P, int>::value) { /* the first unit's words loaded before (xm_load) */
        if (un < units)
            xs_unit<T, R, NT>::dot(*pre, un & 7, xt, cols, 256 * (un >> 3), acc);
        un += LW;
    }
    for (; un < units; un += LW) {
        const int b = un >> 3;
        const uint8_t *p[R];
#pragma unroll
        for (int i = 0; i < R; i++) p[i] = Wr[i] + (size_t)b * S;
        xs_unit<T, R, NT>::run(p, un & 7, xt, cols, 256 * b, acc);
    }
}

/* The rows of a pass: Wr[i] row r0 + i of W (r0 itself from `end` on;
 * CLAMP, where r0 may be past the end too: then end - 1). */
template <int R, bool CLAMP = false>
__device__ __forceinline__ void xm_ptrs(const uint8_t *W, size_t row_bytes, int64_t r0, int64_t end,
                                        const uint8_t **Wr)
{
    const int64_t last = CLAMP && r0 >= end ? end - 1 : r0;
#pragma unroll
    for (int i = 0; i < R; i++) Wr[i] = W + (size_t)(r0 + i < end ? r0 + i : last) * row_bytes;
}

/* The sum over a group of LW lanes (32: mr_warp_sum; 16: its last four
 * steps, which give the same bits where a warp's lanes 16..31 hold zeros,
 * as they do when a row has at most 16 units; 8: its last three, after
 * the first two in each lane, xm_row_q). */
template <int LW>
__device__ __forceinline__ float xm_sum(float v)
{
    if constexpr (LW == 32) {
        return mr_warp_sum(v);
    } else {
#pragma unroll
        for (int o = LW / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    }
}

/* Row r of expert matrix W (from `end` on: computed from row end - 1, not
 * stored) for the NT pairs pr[] with planes xt[], by the 8 lanes of a
 * quarter warp (lane: the lane in the warp), rows of at most 32 units
 * (1,024 columns).  Lane j of the quarter stands for lanes j, j + 8, j + 16
 * and j + 24 of xm_rows' whole warp: the unit of each summed as that lane
 * sums it (xm_units), then the warp sum's first two steps (xor 16, then
 * xor 8) in the lane, in their order, and its last three across the
 * quarter (xm_sum<8>): lane 0's sum, so the same bits.  Why: a row of 16 units (the 35B-A3B's down, 512 columns) leaves
 * half of a whole warp's lanes idle through its units, and the warp sums
 * of 4 rows cost 20 shuffle rounds against 3; the price is a unit's input
 * loads serving one row instead of four, which loses at 24 units
 * (xm_launch has the times). */
template <int T, int NT>
__device__ __forceinline__ void xm_row_q(const uint8_t *W, size_t row_bytes, int cols, int64_t r, int64_t end,
                                         const uint8_t *const *xt, const int *pr, float *y, int64_t rows, int lane)
{
    constexpr int S = xs_type<T>::STRIDE;
    const int j = lane & 7, units = cols / 32;
    const uint8_t *Wr[1];
    xm_ptrs<1, true>(W, row_bytes, r, end, Wr);
    /* xm_units for lanes j + 8 i of rows of at most 32 units (a unit a lane
     * at most), written out: its loop form for them is ~9% more PTX
     * instructions (index arithmetic) than the measured instance */
    float acc[4][NT];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[i][t] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int un = j + 8 * i;
        if (un < units) {
            const uint8_t *p[1] = {Wr[0] + (size_t)(un >> 3) * S};
            xs_unit<T, 1, NT>::run(p, un & 7, xt, cols, 256 * (un >> 3), acc[i]);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = xm_sum<8>((acc[0][t] + acc[2][t]) + (acc[1][t] + acc[3][t])); /* xor 16; xor 8 */
        if (j == 0 && r < end) y[(int64_t)pr[t] * rows + r] = v;
    }
}

/* The gate/up form's: rows r0 .. r0 + RH - 1 of Wg, then the same of Wu. */
template <int RH>
__device__ __forceinline__ void xm_ptrs_glu(const uint8_t *Wg, const uint8_t *Wu, size_t row_bytes, int64_t r0,
                                            int64_t end, const uint8_t **Wr)
{
    xm_ptrs<RH>(Wg, row_bytes, r0, end, Wr);
    xm_ptrs<RH>(Wu, row_bytes, r0, end, Wr + RH);
}

/* The words of lane's first unit of rows Wr[] (xm_units' first step), for
 * a block to ask for them before its input quantization (k_moex24 EARLY). */
template <int T, int R>
__device__ __forceinline__ void xm_load(const uint8_t *const *Wr, int cols, int lane,
                                        typename xs_unit<T, R, 1>::raw &w)
{
    if (lane >= cols / 32)
        return;
    const uint8_t *p[R];
#pragma unroll
    for (int i = 0; i < R; i++) p[i] = Wr[i] + (size_t)(lane >> 3) * xs_type<T>::STRIDE;
    xs_unit<T, R, 1>::load(p, lane & 7, w);
}

/* Rows r0 .. r0 + R - 1 (those from `end` on computed but not stored) of
 * expert matrix W for the NT pairs pr[] with planes xt[] (pre: the first
 * unit's words, xm_load's); LW 16: by each half of the warp, lane its lane
 * in the half (r0 may then be past the end: nothing stored). */
template <int T, int R, int NT, class P = int, int LW = 32>
__device__ __forceinline__ void xm_rows(const uint8_t *W, size_t row_bytes, int cols, int64_t r0, int64_t end,
                                        const uint8_t *const *xt, const int *pr, float *y, int64_t rows, int lane,
                                        const P *pre = nullptr)
{
    const uint8_t *Wr[R];
    xm_ptrs<R, LW < 32>(W, row_bytes, r0, end, Wr);
    float acc[NT * R];
    xm_units<T, R, NT, P, LW>(Wr, xt, cols, lane, acc, pre);
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float v = xm_sum<LW>(acc[t * R + i]);
            if (lane == 0 && r0 + i < end) y[(int64_t)pr[t] * rows + r0 + i] = v;
        }
}

/* The gate/up form (a.glu_out, one token): rows r0 .. r0 + RH - 1 of the
 * gate (Wg) and the same rows of the up matrix (Wu) as one pass of 2 RH
 * rows, then silu(gate) * up written as the swiglu op would (cu_common.cuh's
 * mr_silu_mul) beside both products.  Each row is summed as xm_rows sums it. */
template <int T, int RH, class P = int>
__device__ __forceinline__ void xm_rows_glu(const uint8_t *Wg, const uint8_t *Wu, size_t row_bytes, int cols,
                                            int64_t r0, int64_t end, const uint8_t *xt0, int pr, float *yg,
                                            float *yu, float *yo, int64_t rows, int lane, const P *pre = nullptr)
{
    constexpr int R = 2 * RH;
    const uint8_t *Wr[R];
    xm_ptrs_glu<RH>(Wg, Wu, row_bytes, r0, end, Wr);
    float acc[R];
    const uint8_t *xt[1] = {xt0};
    xm_units<T, R, 1>(Wr, xt, cols, lane, acc, pre);
#pragma unroll
    for (int i = 0; i < RH; i++) {
        const float g = mr_warp_sum(acc[i]), u = mr_warp_sum(acc[RH + i]);
        if (lane == 0 && r0 + i < end) {
            const int64_t o = (int64_t)pr * rows + r0 + i;
            yu[o] = u;
            if (yo != yg) yg[o] = g;
            yo[o] = mr_silu_mul(g, u);
        }
    }
}

/* The input row of pair p (token p / k, its slot p % k when each pair has
 * its own input, as the down products do). */
__device__ __forceinline__ int xm_in(const mr_cu_mvjob &a, int p)
{
    return (p / a.k) * a.x_slots + (a.x_slots > 1 ? p % a.k : 0);
}

/* a: the job (W, y, rows of matrix 0 or sub-matrices via n_sub; ids, k,
 * x_slots, n_mats, cols, row_bytes, mat_bytes); grp: the grouping (NULL
 * for one token: grid.y is then the pair; with it, one matrix); S: its
 * slots; RS: rows a block; xg: the quantized inputs, or NULL for one
 * token (grp NULL): then each block quantizes its pair's input row into
 * shared memory first (xs_quantize, what k_x24_quant writes to xg, so the
 * same sums) and the step has one launch fewer (the default;
 * MEMRA_CUDA_XM_QUANT=launch: k_x24_quant first);
 * nt_max: pairs a chunk at most (c->x24_nt_max: 2 unless set for timing).
 * EARLY (one token, the block quantizing its row; Q4_K and IQ4_XS): each
 * warp asks for its first pass's first unit of weights once the block has
 * its expert id, before the quantization and its barrier, so that the
 * weights' trip from memory overlaps the input's; the same sums.  LW 16
 * (EARLY, the down form, at most 16 units a row): each half warp takes
 * XM_ROWS rows, so that no lane idles; the same sums (xm_sum). */
template <int T, bool GLU = false, bool EARLY = false, int LW = 32, bool QUARTER = false>
__global__ void __launch_bounds__(XM_WARPS * 32, XM_MIN_BLOCKS) k_moex24(mr_cu_mvjob a, const int32_t *__restrict__ grp, int S,
                                                          int RS, const uint8_t *__restrict__ xg, int nt_max)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    /* the gate/up form (an instance of its own, so that the others keep
     * their registers) runs both matrices in each block (grid.z 1) */
    constexpr bool glu = GLU;
    const mr_cu_mvjob j = a.n_sub > 1 ? mr_cu_mv_subjob(a, glu ? 0 : (int)blockIdx.z) : a;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t rb = (int64_t)blockIdx.x * RS;
    const int64_t re = rb + RS < j.rows ? rb + RS : j.rows;
    if (rb >= j.rows)
        return;
    const int slot = (int)blockIdx.y;
    int e, np, first = 0;
    if (grp) {
        if (!mr_cu_grp_slot(grp, S, slot, &e, &first, &np))
            return;
    } else {
        e = a.ids[slot];
        np = 1;
        if (e < 0 || e >= a.n_mats) {
            for (int64_t r = rb + threadIdx.x; r < re; r += blockDim.x) {
                j.y[(int64_t)slot * j.rows + r] = __int_as_float(0x7fc00000);
                if constexpr (GLU) {
                    a.sub_y[1][(int64_t)slot * j.rows + r] = __int_as_float(0x7fc00000);
                    a.glu_out[(int64_t)slot * j.rows + r] = __int_as_float(0x7fc00000);
                }
            }
            return;
        }
    }
    const int32_t *list = grp ? grp + 2 + 2 * S + first : NULL;
    const uint8_t *W = j.W + (size_t)e * j.mat_bytes;
    const size_t xb = xs_xbytes(j.cols);
    const int cols = (int)j.cols;
    /* the block's input planes: in xg at row `in`, or (xg NULL, one token)
     * its one pair's row quantized here; every return above is the whole
     * block's, so all its threads meet the barrier */
    extern __shared__ __align__(16) uint8_t xm_sh[];
    if constexpr (EARLY) { /* one token, xg NULL */
        static_assert(LW == 32 || (LW == 16 && !GLU), "half warps: the down form");
        constexpr int RW = GLU ? XM_ROWS / 2 : XM_ROWS; /* rows of each matrix a group of LW lanes takes */
        using raw = typename xs_unit<T, XM_ROWS, 1>::raw;
        raw pre;
        const uint8_t *Wr[XM_ROWS];
        const uint8_t *Wu = GLU ? a.sub_W[1] + (size_t)e * j.mat_bytes : NULL;
        const int sub = lane & (LW - 1), grp_r = (lane / LW) * RW; /* the lane in its group; the group's rows */
        const int64_t w0 = rb + (int64_t)warp * (32 / LW) * RW, pass = XM_WARPS * (32 / LW) * RW;
        if (w0 < re) {
            if constexpr (GLU)
                xm_ptrs_glu<XM_ROWS / 2>(W, Wu, j.row_bytes, w0, re, Wr);
            else
                xm_ptrs<XM_ROWS, LW < 32>(W, j.row_bytes, w0 + grp_r, re, Wr);
            xm_load<T, XM_ROWS>(Wr, cols, sub, pre);
        }
        /* two rounds in flight (2,048 columns for 128 threads): the weights
         * held meanwhile leave fewer registers than XS_QU's four need */
        xs_quantize<2>(a.x + (int64_t)xm_in(a, slot) * cols, cols, xm_sh, threadIdx.x, blockDim.x);
        __syncthreads();
        const int pr[1] = {slot};
        const uint8_t *xt[1] = {xm_sh};
        if (w0 >= re)
            return;
        if constexpr (GLU) {
            xm_rows_glu<T, XM_ROWS / 2>(W, Wu, j.row_bytes, cols, w0, re, xm_sh, slot, j.y, a.sub_y[1], a.glu_out,
                                        j.rows, lane, &pre);
            for (int64_t r = w0 + pass; r < re; r += pass)
                xm_rows_glu<T, XM_ROWS / 2>(W, Wu, j.row_bytes, cols, r, re, xm_sh, slot, j.y, a.sub_y[1],
                                            a.glu_out, j.rows, lane);
        } else {
            xm_rows<T, XM_ROWS, 1, raw, LW>(W, j.row_bytes, cols, w0 + grp_r, re, xt, pr, j.y, j.rows, sub, &pre);
            for (int64_t r = w0 + pass; r < re; r += pass)
                xm_rows<T, XM_ROWS, 1, int, LW>(W, j.row_bytes, cols, r + grp_r, re, xt, pr, j.y, j.rows, sub);
        }
        return;
    }
    if (!xg) {
        xs_quantize(a.x + (int64_t)xm_in(a, slot) * cols, cols, xm_sh, threadIdx.x, blockDim.x);
        __syncthreads();
    }
    auto planes = [&](int in) -> const uint8_t * { return xg ? xg + (size_t)in * xb : xm_sh; };
    if constexpr (GLU) { /* one token (grp NULL): grid.y is the pair */
        const uint8_t *Wu = a.sub_W[1] + (size_t)e * j.mat_bytes;
        const uint8_t *xp = planes(xm_in(a, slot));
        /* a pass: XM_ROWS rows, half of each matrix */
        for (int64_t r0 = rb + (int64_t)warp * (XM_ROWS / 2); r0 < re; r0 += XM_WARPS * (XM_ROWS / 2))
            xm_rows_glu<T, XM_ROWS / 2>(W, Wu, j.row_bytes, cols, r0, re, xp, slot, j.y, a.sub_y[1], a.glu_out,
                                        j.rows, lane);
    } else {
    for (int64_t r0 = rb + (int64_t)warp * XM_ROWS; r0 < re; r0 += XM_WARPS * XM_ROWS) {
        for (int q = 0; q < np;) {
            const int m = np - q >= 4 && nt_max >= 4 ? 4 : np - q >= 2 && nt_max >= 2 ? 2 : 1;
            int pr[4];
            const uint8_t *xt[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int pp = list ? list[q + (t < m ? t : m - 1)] : slot;
                pr[t] = pp;
                xt[t] = planes(xm_in(a, pp)); /* xg NULL: one token, every t the block's pair */
            }
            /* rows a pass as in cu_mvx24.cu's xs_launch_nt (registers);
             * QUARTER: a row a quarter warp */
            constexpr int R4 = xs_type<T>::R4, R2 = xs_type<T>::R2;
            static_assert(XM_ROWS == 4, "a pass: a row a quarter warp");
            if constexpr (QUARTER) {
                const int64_t r = r0 + (lane >> 3);
                if (m == 4) xm_row_q<T, 4>(W, j.row_bytes, cols, r, re, xt, pr, j.y, j.rows, lane);
                else if (m == 2) xm_row_q<T, 2>(W, j.row_bytes, cols, r, re, xt, pr, j.y, j.rows, lane);
                else xm_row_q<T, 1>(W, j.row_bytes, cols, r, re, xt, pr, j.y, j.rows, lane);
            } else if (m == 4) {
#pragma unroll
                for (int i = 0; i < XM_ROWS; i += R4)
                    xm_rows<T, R4, 4>(W, j.row_bytes, cols, r0 + i, re, xt, pr, j.y, j.rows, lane);
            } else if (m == 2) {
#pragma unroll
                for (int i = 0; i < XM_ROWS; i += R2)
                    xm_rows<T, R2, 2>(W, j.row_bytes, cols, r0 + i, re, xt, pr, j.y, j.rows, lane);
            } else {
                xm_rows<T, XM_ROWS, 1>(W, j.row_bytes, cols, r0, re, xt, pr, j.y, j.rows, lane);
            }
            q += m;
        }
    }
    }
}

/* ---- dispatch ---- */

/* Whether the kernel takes these expert matrices: on, Q4_K, Q6_K, IQ4_XS
 * or Q8_0 (Q6_K and Q8_0 with their padded copy), whole 256-column blocks,
 * one type, width and expert count.  Never depends on the token count. */
static bool xm_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    if (!c->matvec_x24 || !c->x24_moe || c->no_fast || m < 1 || m > MR_CU_MV_SUBS || ((uintptr_t)x & 15))
        return false;
    const int T = w[0]->type;
    if (!xs_has(T))
        return false;
    for (int s = 0; s < m; s++) {
        const mr_weight *v = w[s];
        if (!v->data || v->type != T || v->cols != w[0]->cols || v->n_mats != w[0]->n_mats || v->n_mats < 2 ||
            v->cols % 256 || v->cols > XS_COLS_MAX || (xs_padded(T) && !v->priv))
            return false;
    }
    return true;
}

bool mr_cu_x24_takes_id(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    return xm_takes(c, w, m, x);
}

/* The types with an EARLY (and half-warp) form: those whose units split
 * into load and dot (cu_x24.cuh). */
static constexpr bool xm_early_type(int T) { return T == MR_TYPE_Q4_K || T == MR_TYPE_IQ4_XS; }

/* Rows a block of an expert launch: `work` rows over all its slots and
 * matrices spread for bps blocks an SM, a multiple of `step` (the rows of a
 * block's pass) from 1 to 16 passes. */
static int64_t xm_rows_a_block(const mr_cu_ctx *c, int64_t work, int step, int bps)
{
    const int64_t per = (int64_t)bps * c->n_sm;
    int64_t RS = (work + per - 1) / per;
    RS = (RS + step - 1) / step * step;
    if (RS < step) RS = step;
    if (RS > 16 * step) RS = 16 * step;
    return RS;
}

/* xg NULL (one token): each block quantizes its input row (smem bytes). */
template <int T, bool GLU = false>
static void xm_launch(mr_cu_ctx *c, dim3 grid, const mr_cu_mvjob &a, const int32_t *grp, int S, int RS,
                      const uint8_t *xg, bool half = false)
{
    const size_t smem = xg ? 0 : xs_xbytes(a.cols);
    if constexpr (xm_early_type(T)) {
        if (!GLU && half) {
            mr_cu_launch(c, k_moex24<T, false, true, 16>, grid, XM_WARPS * 32, smem, a, grp, S, RS, xg,
                         c->x24_nt_max);
            return;
        }
        if (!xg && c->xm_early) {
            mr_cu_launch(c, k_moex24<T, GLU, true>, grid, XM_WARPS * 32, smem, a, grp, S, RS, xg, c->x24_nt_max);
            return;
        }
    }
    /* rows of at most 16 units (MEMRA_CUDA_XM_QUARTER=2: under 32): decode
     * batches, and one token's where the EARLY form above did not take
     * them (Q6_K, Q8_0).  Run 151, us, whole warps / quarters: IQ4_XS 2048
     * x 512 at 4, 16, 64 tokens 33.5 / 28.0, 110.3 / 88.2, 273.2 / 241.4;
     * Q6_K 2048 x 768 33.1 / 35.8, 98.4 / 102.2, 350.8 / 313.7 (a unit's
     * input loads serve one row instead of four) */
    const int64_t quarter_cols = c->xm_quarter == 2 ? 1023 : c->xm_quarter == 1 ? 512 : 0;
    if (!GLU && a.cols <= quarter_cols) {
        mr_cu_launch(c, k_moex24<T, false, false, 32, true>, grid, XM_WARPS * 32, smem, a, grp, S, RS, xg,
                     c->x24_nt_max);
        return;
    }
    mr_cu_launch(c, k_moex24<T, GLU>, grid, XM_WARPS * 32, smem, a, grp, S, RS, xg, c->x24_nt_max);
}

/* The input planes of an expert launch: NULL where the blocks quantize
 * their rows themselves (one token, unless MEMRA_CUDA_XM_QUANT=launch; planes that
 * fit the default shared memory), else k_x24_quant's output (NULL too on
 * a sticky error, which the caller tells apart by c->failed). */
static const uint8_t *xm_planes(mr_cu_ctx *c, const float *x, int rows, int64_t cols, int x_slots, bool one)
{
    if (one && c->xm_quant_block && xs_xbytes(cols) <= 48 * 1024)
        return NULL;
    return mr_cu_x24_planes(c, x, rows, cols, (MR_CU_GEMM_MIN_TOKENS - 1) * x_slots);
}

/* Whether one token's plain expert product (one matrix, xg NULL: the
 * blocks quantize) runs in half warps: EARLY's types, at most 16 units a
 * row (the 35B-A3B's down, 512 columns: lanes 16..31 of a whole-warp pass
 * idle); MEMRA_CUDA_XM_HALF=0: whole warps. */
static bool xm_half(const mr_cu_ctx *c, int T, int m, int64_t cols, const uint8_t *xg)
{
    return c->xm_half && c->xm_early && !xg && m == 1 && cols <= 16 * 32 && xm_early_type(T);
}

bool mr_cu_x24_matvec_id(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                         int x_slots, const int32_t *ids, int k, int n)
{
    if (mr_cu_xmm_takes_id(c, w, m, x)) /* the tensor-core kernel where it takes the matrices */
        return mr_cu_xmm_matvec_id(c, w, y, NULL, m, x, x_slots, ids, k, n);
    if (n < 1 || n >= MR_CU_GEMM_MIN_TOKENS || k < 1 || !xm_takes(c, w, m, x))
        return false;
    /* decode batches: two matrices of equal rows (gate and up) share a
     * launch and one grouping, which writes the NaN rows of bad ids into
     * both outputs */
    const int T = w[0]->type, P = n * k;
    if ((n > 1 && (m > 2 || (m == 2 && w[1]->rows != w[0]->rows))) || !mr_cu_moe_group_fits(P, w[0]->n_mats))
        return false;
    int64_t total, rows_max;
    mr_cu_mvjob a = xs_job(w, y, m, x, &total, &rows_max);
    a.ids = ids;
    a.k = k;
    a.x_slots = x_slots;
    const int32_t *grp = NULL;
    int S = P;
    if (n > 1) {
        grp = mr_cu_moe_group(c, ids, P, k, a.n_mats, a.rows, a.y, m == 2 ? y[1] : NULL, NULL, &S, false);
        if (!grp)
            return c->failed;
    }
    const uint8_t *xg = xm_planes(c, x, n * x_slots, a.cols, x_slots, !grp);
    if (!xg && c->failed)
        return true; /* the sticky error */
    /* rows a block: a multiple of the block's XM_WARPS * XM_ROWS (twice
     * that in half warps), about c->xm_bps (64) blocks an SM when every
     * slot is used; one token (every slot used): c->xm_bps1, one wave */
    const bool half = xm_half(c, T, m, a.cols, xg);
    const int64_t RS = xm_rows_a_block(c, rows_max * S * m, XM_WARPS * XM_ROWS * (half ? 2 : 1),
                                       n == 1 ? c->xm_bps1 : c->xm_bps);
    const dim3 grid((unsigned)((rows_max + RS - 1) / RS), (unsigned)S, (unsigned)m);
    switch (T) {
    case MR_TYPE_Q4_K: xm_launch<MR_TYPE_Q4_K>(c, grid, a, grp, S, (int)RS, xg, half); break;
    case MR_TYPE_Q6_K: xm_launch<MR_TYPE_Q6_K>(c, grid, a, grp, S, (int)RS, xg); break;
    case MR_TYPE_IQ4_XS: xm_launch<MR_TYPE_IQ4_XS>(c, grid, a, grp, S, (int)RS, xg, half); break;
    default: xm_launch<MR_TYPE_Q8_0>(c, grid, a, grp, S, (int)RS, xg); break; /* xs_has */
    }
    MR_CU_LAUNCHED(c, "x24 expert matvec");
    return true;
}

/* Gate and up experts of one token and the swiglu after them in one launch
 * (mr_cu_fast_glu's contract, on this kernel's sums): false, nothing
 * launched, where mr_cu_x24_matvec_id would not take the pair. */
bool mr_cu_x24_glu_id(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, const float *x,
                      int x_slots, const int32_t *ids, int k, int n)
{
    if (n != 1 || k < 1 || !xm_takes(c, w, 2, x) || w[0]->rows != w[1]->rows ||
        !mr_cu_moe_group_fits(k, w[0]->n_mats))
        return false;
    const int T = w[0]->type;
    int64_t total, rows_max;
    mr_cu_mvjob a = xs_job(w, y, 2, x, &total, &rows_max);
    a.ids = ids;
    a.k = k;
    a.x_slots = x_slots;
    a.glu_out = o;
    const uint8_t *xg = xm_planes(c, x, x_slots, a.cols, x_slots, true);
    if (!xg && c->failed)
        return true; /* the sticky error */
    /* as many blocks and warp passes as mr_cu_x24_matvec_id gives the two
     * matrices: half its rows a block (a pass here takes half its rows of
     * each matrix) */
    const int64_t RS = xm_rows_a_block(c, rows_max * k * 2, XM_WARPS * XM_ROWS, c->xm_bps1) / 2;
    const dim3 grid((unsigned)((rows_max + RS - 1) / RS), (unsigned)k, 1);
    switch (T) {
    case MR_TYPE_Q4_K: xm_launch<MR_TYPE_Q4_K, true>(c, grid, a, NULL, k, (int)RS, xg); break;
    case MR_TYPE_Q6_K: xm_launch<MR_TYPE_Q6_K, true>(c, grid, a, NULL, k, (int)RS, xg); break;
    case MR_TYPE_IQ4_XS: xm_launch<MR_TYPE_IQ4_XS, true>(c, grid, a, NULL, k, (int)RS, xg); break;
    default: xm_launch<MR_TYPE_Q8_0, true>(c, grid, a, NULL, k, (int)RS, xg); break; /* xs_has */
    }
    MR_CU_LAUNCHED(c, "x24 expert matvec + swiglu");
    return true;
}

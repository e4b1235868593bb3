/* Ops of the hybrid (Gated DeltaNet) models: strided row copy, sigmoid
 * gating, the short causal convolution with carried state, and the gated
 * delta-rule scan in its recurrent form (see kernels/ops.h for each).
 *
 * gdn_scan: the state of one value head is S[dk][dv].  Columns j of S are
 * independent given the normalised q and k (every step reads and writes
 * column j only: r_j = sum_i S_ij kn_i, S_ij += kn_i b (v_j - r_j),
 * o_j = sum_i S_ij qn_i), so a block takes one head and a tile of 32
 * columns: lane = column, the warps split the dk rows, and each thread keeps
 * its rows x 1 column of S in registers for all n tokens of the call.  The
 * state is read from and written back to device memory once per call.
 * The output is taken from the decayed state before the update,
 *   o = (S + kn d^T)^T qn = S^T qn + d (kn . qn),
 * so both reductions over the rows share one pass and one exchange. */
#include <stdlib.h>
#include <string.h>

#include <cuda_pipeline_primitives.h>

#include <type_traits>

#include "kernels/cuda/cu_common.cuh"

/* ---- copy_2d ---- */

/* Flat over n_rows * dim elements (a prompt's heads can exceed a grid's
 * 65535 rows), grid-stride. */
__global__ void k_copy_2d(float *dst, int dst_stride, const float *src, int src_stride, int n_rows,
                          int dim)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int64_t total = (int64_t)n_rows * dim;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / dim, i = e % dim;
        dst[r * dst_stride + i] = src[r * src_stride + i];
    }
}

static void cu_copy_2d(mr_backend *be, float *dst, int dst_stride, const float *src, int src_stride,
                       int n_rows, int dim)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n_rows <= 0 || dim <= 0)
        return;
    const size_t total = (size_t)n_rows * (size_t)dim;
    mr_cu_launch(c, k_copy_2d, mr_cu_ew_blocks(c, total, 256), 256, 0, dst, dst_stride, src, src_stride, n_rows,
                 dim);
    MR_CU_LAUNCHED(c, "copy_2d");
}

/* ---- sigmoid_mul ---- */

__global__ void k_sigmoid_mul(float *y, const float *g, int n_rows, int dim, int g_stride, bool g_scalar)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int64_t total = (int64_t)n_rows * dim;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / dim, i = e % dim;
        y[e] *= mr_sigmoidf(g[r * g_stride + (g_scalar ? 0 : i)]);
    }
}

static void cu_sigmoid_mul(mr_backend *be, float *y, const float *g, int n_rows, int dim, int g_stride,
                           bool g_scalar)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n_rows <= 0 || dim <= 0)
        return;
    const size_t total = (size_t)n_rows * (size_t)dim;
    mr_cu_launch(c, k_sigmoid_mul, mr_cu_ew_blocks(c, total, 256), 256, 0, y, g, n_rows, dim, g_stride, g_scalar);
    MR_CU_LAUNCHED(c, "sigmoid_mul");
}

/* ---- conv1d_silu ---- */

/* One thread per (token, channel): the k taps over the previous inputs,
 * which come from x or, before the first token, from the carried state. */
__global__ void k_conv1d_silu(const float *x, const float *w, const float *state, int n, int channels,
                              int k, float *y)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * channels)
        return;
    const int t = (int)(idx / channels), ch = (int)(idx % channels);
    const int hist = k - 1;
    const float *wc = w + (int64_t)ch * k;
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
        const int p = t - hist + j;
        const float in = p >= 0 ? x[(int64_t)p * channels + ch] : state[(int64_t)(hist + p) * channels + ch];
        s = fmaf(wc[j], in, s);
    }
    y[idx] = mr_siluf(s);
}

/* The new state (the last k-1 inputs), in place after k_conv1d_silu has
 * read the old one: entry i comes from old entry n + i (> i) when it
 * predates this call, so ascending i never reads an entry already
 * replaced. */
__global__ void k_conv_state(const float *x, float *state, int n, int channels, int k)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels)
        return;
    const int hist = k - 1;
    for (int i = 0; i < hist; i++) {
        const int p = n - hist + i;
        state[(int64_t)i * channels + ch] =
            p >= 0 ? x[(int64_t)p * channels + ch] : state[(int64_t)(hist + p) * channels + ch];
    }
}

/* Few tokens (decode, speculative verify): one thread per channel runs the
 * tokens in order and then replaces the state, in one launch.  The thread
 * reads all of its channel's old state before writing any of it. */
#define CONV_SEQ_MAX 16
__global__ void k_conv1d_silu_seq(const float *x, const float *w, float *state, int n, int channels,
                                  int k, float *y)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels)
        return;
    const int hist = k - 1;
    const float *wc = w + (int64_t)ch * k;
    for (int t = 0; t < n; t++) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            const int p = t - hist + j;
            const float in = p >= 0 ? x[(int64_t)p * channels + ch] : state[(int64_t)(hist + p) * channels + ch];
            s = fmaf(wc[j], in, s);
        }
        y[(int64_t)t * channels + ch] = mr_siluf(s);
    }
    for (int i = 0; i < hist; i++) {
        const int p = n - hist + i;
        state[(int64_t)i * channels + ch] =
            p >= 0 ? x[(int64_t)p * channels + ch] : state[(int64_t)(hist + p) * channels + ch];
    }
}

/* One token of each of a decode batch's sequences (blockIdx.y: segment s,
 * input row s of x, output row s of y, state st.p[s]): k_conv1d_silu_seq's
 * floats at n = 1 for each (mr_conv1_token's chain), in one launch.  k at
 * most MR_CU_CONV_TAPS. */
__global__ void k_conv1d_silu_segs(const float *x, const float *w, const mr_cu_segs st, int channels, int k,
                                   float *y)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels)
        return;
    const int64_t row = (int64_t)blockIdx.y * channels;
    float cw[MR_CU_CONV_TAPS], cs[MR_CU_CONV_TAPS - 1];
    mr_conv1_fetch(w, st.p[blockIdx.y], channels, ch, k, cw, cs);
    mr_conv1_token(x[row + ch], cw, cs, k, channels, ch, st.p[blockIdx.y], y + row);
}

static void cu_conv1d_silu(mr_backend *be, const float *x, const float *w, float *state, int n,
                           int channels, int k, float *y)
{
    mr_cu_ctx *c = mr_cu(be);
    if (k < 1 || channels < 1 || n < 0) {
        mr_cu_fail(c, "conv1d_silu: bad shape (k %d, channels %d, n %d)", k, channels, n);
        return;
    }
    if (n == 0)
        return;
    const unsigned th = 256;
    if (n <= CONV_SEQ_MAX) {
        mr_cu_launch(c, k_conv1d_silu_seq, mr_cu_blocks((size_t)channels, 128), 128, 0, x, w, state, n, channels,
                     k, y);
        MR_CU_LAUNCHED(c, "conv1d_silu");
        return;
    }
    mr_cu_launch(c, k_conv1d_silu, mr_cu_blocks((size_t)n * (size_t)channels, th), th, 0, x, w, state, n,
                 channels, k, y);
    MR_CU_LAUNCHED(c, "conv1d_silu");
    if (k > 1) {
        mr_cu_launch(c, k_conv_state, mr_cu_blocks((size_t)channels, th), th, 0, x, state, n, channels, k);
        MR_CU_LAUNCHED(c, "conv1d_silu state");
    }
}

/* ---- gdn_scan ---- */

#define GDN_COLS 32    /* columns of S per block: one per lane */
#define GDN_MAX_WARPS 8 /* dk up to 256; more warps would cap the registers that hold S */

/* Pieces both scan kernels take, so that a token's floats are formed alike
 * in each (k_gdn_scan_tiled's bits are k_gdn_scan's). */

/* This thread's RPT rows of column col of the head's state S (zeros past
 * dk and dv), and back. */
template <int RPT>
__device__ __forceinline__ void gdn_state_load(const float *S, float (&s)[RPT], int row0, int col, bool col_ok,
                                               int dk, int dv)
{
#pragma unroll
    for (int r = 0; r < RPT; r++)
        s[r] = col_ok && row0 + r < dk ? S[(int64_t)(row0 + r) * dv + col] : 0.0f;
}
template <int RPT>
__device__ __forceinline__ void gdn_state_store(float *S, const float (&s)[RPT], int row0, int col, bool col_ok,
                                                int dk, int dv)
{
    if (col_ok) {
#pragma unroll
        for (int r = 0; r < RPT; r++)
            if (row0 + r < dk)
                S[(int64_t)(row0 + r) * dv + col] = s[r];
    }
}

/* A token's decay exp(a softplus(alpha + dt_bias)) and beta gate. */
__device__ __forceinline__ void gdn_gates(float al, float dtb, float a_h, float bt, float *decay, float *b)
{
    const float x = al + dtb;
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    *decay = expf(a_h * sp);
    *b = mr_sigmoidf(bt);
}

/* The state decayed, and this thread's shares of S^T kn and S^T qn; kn(r)
 * and qn(r) give the normalised k and q of the thread's row row0 + r (from
 * the token's vectors in shared memory, or from registers). */
template <int RPT, bool CHECK = true, class K, class Q>
__device__ __forceinline__ void gdn_decay_dots_by(float (&s)[RPT], float decay, K kn, Q qn, int row0, int dk,
                                                  float *pr, float *pp)
{
    float r_ = 0.0f, p_ = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        const int i = row0 + r;
        s[r] *= decay;
        if (!CHECK || i < dk) { /* CHECK false: every row of the thread exists */
            r_ = fmaf(s[r], kn(r), r_);
            p_ = fmaf(s[r], qn(r), p_);
        }
    }
    *pr = r_;
    *pp = p_;
}
template <int RPT>
__device__ __forceinline__ void gdn_decay_dots(float (&s)[RPT], float decay, const float *kn, const float *qn,
                                               int row0, int dk, float *pr, float *pp)
{
    gdn_decay_dots_by<RPT>(
        s, decay, [&](int r) { return kn[row0 + r]; }, [&](int r) { return qn[row0 + r]; }, row0, dk, pr, pp);
}

/* The delta-rule update S += kn d^T of this thread's rows (kn(r) and CHECK
 * as above). */
template <int RPT, bool CHECK = true, class K>
__device__ __forceinline__ void gdn_update_by(float (&s)[RPT], K kn, float d, int row0, int dk)
{
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        const int i = row0 + r;
        if (!CHECK || i < dk)
            s[r] = fmaf(kn(r), d, s[r]);
    }
}
template <int RPT>
__device__ __forceinline__ void gdn_update(float (&s)[RPT], const float *kn, float d, int row0, int dk)
{
    gdn_update_by<RPT>(s, [&](int r) { return kn[row0 + r]; }, d, row0, dk);
}

/* Block: W = blockDim.x / 32 warps; thread (w, lane) holds S[w*RPT + r][col]
 * for r < RPT, col = blockIdx.y * 32 + lane.  Rows >= dk and columns >= dv
 * are held as zeros and never stored. */
/* The scan in two parts, so that a kernel can load the state before its
 * PDL wait where it knows the kernel before does not write it
 * (k_gdn_scan_segs) or after it (k_gdn_scan): gdn_scan_state loads this
 * thread's rows of its column of head blockIdx.x's state and returns the
 * head's state; gdn_scan_tokens runs the n tokens and stores it back. */
template <int RPT>
__device__ __forceinline__ float *gdn_scan_state(float *state, int dk, int dv, float (&s)[RPT])
{
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int col = blockIdx.y * GDN_COLS + lane;
    float *S = state + (int64_t)blockIdx.x * dk * dv;
    gdn_state_load<RPT>(S, s, wi * RPT, col, col < dv, dk, dv);
    return S;
}

template <int RPT>
__device__ __forceinline__ void gdn_scan_tokens(float (&s)[RPT], float *S, const float *qkv, int stride,
                                                const float *alpha, const float *beta, const float *a,
                                                const float *dt_bias, int n, int n_k_heads, int n_v_heads, int dk,
                                                int dv, float eps, float *out)
{
    extern __shared__ float sh[];
    const int W = blockDim.x >> 5;
    float *qn = sh;                       /* [dk] */
    float *kn = qn + dk;                  /* [dk] */
    float *red_r = kn + dk;               /* [W][32]: partial S^T kn */
    float *red_p = red_r + W * GDN_COLS;  /* [W][32]: partial S^T qn */
    float *red_n = red_p + W * GDN_COLS;  /* [3][W]: |q|^2, |k|^2, q.k */

    const int h = blockIdx.x, kh = h % n_k_heads;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int col = blockIdx.y * GDN_COLS + lane;
    const bool col_ok = col < dv;
    const int row0 = wi * RPT;

    const float a_h = a[h], dtb = dt_bias[h];
    const float qscale = 1.0f / sqrtf((float)dk);
    const int64_t kdim = (int64_t)n_k_heads * dk;

    /* this thread's inputs of a token: its element of the key head's q and
     * k, its column's v, the head's alpha and beta; loaded one token ahead
     * so that the loads overlap the previous token's work */
    float nq = 0.0f, nk = 0.0f, nv = 0.0f, na = 0.0f, nb = 0.0f;
    auto load = [&](int t) {
        const float *row = qkv + (int64_t)t * stride;
        if (threadIdx.x < dk) {
            nq = row[(int64_t)kh * dk + threadIdx.x];
            nk = row[kdim + (int64_t)kh * dk + threadIdx.x];
        }
        nv = col_ok ? row[2 * kdim + (int64_t)h * dv + col] : 0.0f;
        na = alpha[(int64_t)t * n_v_heads + h];
        nb = beta[(int64_t)t * n_v_heads + h];
    };
    load(0);
    for (int t = 0; t < n; t++) {
        const float qv = nq, kv = nk, v = nv, al = na, bt = nb;
        if (t + 1 < n)
            load(t + 1);
        /* the sums for the norms of q and k, and q.k */
        float sq = mr_warp_sum(qv * qv), sk = mr_warp_sum(kv * kv), sqk = mr_warp_sum(qv * kv);
        if (lane == 0) {
            red_n[wi] = sq;
            red_n[W + wi] = sk;
            red_n[2 * W + wi] = sqk;
        }
        __syncthreads();
        sq = sk = sqk = 0.0f;
        for (int q = 0; q < W; q++) {
            sq += red_n[q];
            sk += red_n[W + q];
            sqk += red_n[2 * W + q];
        }
        const float iq = 1.0f / sqrtf(sq + eps) * qscale, ik = 1.0f / sqrtf(sk + eps);
        if (threadIdx.x < dk) {
            qn[threadIdx.x] = qv * iq;
            kn[threadIdx.x] = kv * ik;
        }
        const float qk = sqk * iq * ik;
        const int64_t th = (int64_t)t * n_v_heads + h;
        float decay, b;
        gdn_gates(al, dtb, a_h, bt, &decay, &b);
        __syncthreads();

        /* decay, then this thread's share of S^T kn and S^T qn */
        float pr, pp;
        gdn_decay_dots<RPT>(s, decay, kn, qn, row0, dk, &pr, &pp);
        red_r[wi * GDN_COLS + lane] = pr;
        red_p[wi * GDN_COLS + lane] = pp;
        __syncthreads();
        float R = 0.0f, P = 0.0f;
        for (int q = 0; q < W; q++) {
            R += red_r[q * GDN_COLS + lane];
            P += red_p[q * GDN_COLS + lane];
        }
        const float d = b * (v - R);
        gdn_update<RPT>(s, kn, d, row0, dk);
        if (wi == 0 && col_ok)
            out[th * dv + col] = fmaf(d, qk, P);
        __syncthreads(); /* qn, kn and the partials are rewritten next token */
    }

    gdn_state_store<RPT>(S, s, row0, col, col_ok, dk, dv);
}

template <int RPT>
__global__ void __launch_bounds__(32 * GDN_MAX_WARPS) k_gdn_scan(const float *qkv, int stride, const float *alpha,
                                                   const float *beta, const float *a,
                                                   const float *dt_bias, float *state, int n,
                                                   int n_k_heads, int n_v_heads, int dk, int dv,
                                                   float eps, float *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    float s[RPT];
    float *S = gdn_scan_state<RPT>(state, dk, dv, s);
    gdn_scan_tokens<RPT>(s, S, qkv, stride, alpha, beta, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, eps, out);
}

/* One token of each of a decode batch's sequences (blockIdx.z: segment s,
 * whose row is s of qkv, alpha, beta and out, and whose state is st.p[s]):
 * k_gdn_scan's floats at n = 1 for each, in one launch instead of one a
 * sequence.  The states are loaded before the PDL wait, while the kernel
 * before still runs: that is the segments' convolution (mr_cu_gdn_segs) or,
 * for one sequence, its in-projection with the convolution
 * (mr_cu_gdn_scan_early), and neither writes them. */
template <int RPT>
__global__ void __launch_bounds__(32 * GDN_MAX_WARPS)
k_gdn_scan_segs(const float *qkv, int stride, const float *alpha, const float *beta, const float *a,
                const float *dt_bias, const mr_cu_segs st, int n_k_heads, int n_v_heads, int dk, int dv, float eps,
                float *out)
{
    const int64_t g = blockIdx.z;
    float s[RPT];
    float *S = gdn_scan_state<RPT>(st.p[g], dk, dv, s);
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    gdn_scan_tokens<RPT>(s, S, qkv + g * stride, stride, alpha + g * n_v_heads, beta + g * n_v_heads, a, dt_bias, 1,
                         n_k_heads, n_v_heads, dk, dv, eps, out + g * n_v_heads * dv);
}

/* The same scan, with the work that does not depend on the state taken out
 * of the token loop.  k_gdn_scan spends ~1.9 us a token at 512 tokens (H200,
 * run 61: 955 us a layer of the 35B-A3B prompt): three barriers a token,
 * and between them the norms' warp sums and exchanges and a chain of
 * sqrt, exp, log1p and a division, one block an SM with 4 warps to hide
 * none of it.  Here a block takes GDN_TT tokens at a time:
 *   A. each warp takes tokens w, w + W, ...: loads their q and k rows and
 *      the block's v columns into shared memory, forms the norms as
 *      k_gdn_scan does (element 32 u + lane in lane `lane`, a warp sum per
 *      run of 32, the runs added in order from 0: the same floats), scales
 *      q and k, and makes the token's decay, beta gate and q.k;
 *   B. the tokens in order: decay, the two partial dots, one barrier (the
 *      partials double-buffered by token parity), the update and the
 *      output, every operation as in k_gdn_scan.
 * So the results are k_gdn_scan's bit for bit (kernel-check gdn_scan-tiled),
 * and a token's work does not depend on the tile it falls in.
 * PF (the default; MEMRA_CUDA_GDN_TILED=2: without): the next tile's raw
 * inputs (q and k rows of the key head, the block's v columns, alpha and
 * beta) are copied into shared memory with asynchronous copies while B of
 * this tile runs, and A reads them there instead of making a global round
 * trip a token of each warp's, one after another (run 135: 714 -> 633 us
 * a 512-token layer of the 35B-A3B).  The same values, so the same bits.
 * LG (lane groups, the default where the block has GDN_MAX_WARPS warps of
 * real rows: dk 32, 64, 128; MEMRA_CUDA_GDN_LANES=0: without): B without a
 * barrier a token.  A column's W partials sit in W neighbouring lanes of one
 * warp instead of in W warps: lane l of warp w holds rows (l % W) RPT .. of
 * column w (32 / W) + l / W of the block's 32, the rows warp l % W would
 * hold, so each lane's two dot chains are the same floats; the W partials
 * are then read across the group with shuffles and added in order from 0,
 * as the barrier's sum adds them from shared memory (gdn_tile_lanes).  A
 * token costs its dot chain, the shuffles and the update, not a barrier of
 * all the block's warps and two round trips through shared memory (run
 * 277: 2,209 us a 2,048-token layer of the 35B-A3B, a third of its prompt;
 * run 281: 772 us).  The normalised
 * q and k of a token sit in shared memory in groups of RPT rows padded by 4
 * floats (gdn_lg_at), so that the W lanes of a group, each reading its own
 * rows 16 bytes at a time, hit different banks. */
#define GDN_TT 16 /* tokens a tile */

/* Where row i of a token's normalised q or k sits in the tiled kernel's
 * shared memory: i, or with lane groups (LG) RPT rows then 4 floats of
 * padding; the floats a token takes there (gdn_lg_stride). */
template <int RPT, bool LG>
__host__ __device__ __forceinline__ int gdn_lg_at(int i)
{
    return LG ? i + (i / RPT) * 4 : i;
}
__host__ __device__ __forceinline__ int gdn_lg_stride(int dk, int rpt, bool lg)
{
    return lg ? (dk + rpt - 1) / rpt * (rpt + 4) : dk;
}

/* Asynchronous copies of tile t0's raw inputs (nt tokens) into rq [TT][dk],
 * rk [TT][dk], rv [TT][32] (zeros past dv), rab [TT][2]; committed as one
 * group.  V4: q, k and v 16 bytes a copy (qkv 16-byte aligned, stride, dk
 * and dv multiples of 4: gdn_tiled_plan), a quarter of the copies. */
template <bool V4>
__device__ __forceinline__ void gdn_tile_fetch(const float *qkv, int stride, const float *alpha, const float *beta,
                                               int t0, int nt, int kh, int h, int n_v_heads, int dk, int dv,
                                               int64_t kdim, float *rq, float *rk, float *rv, float *rab)
{
    if constexpr (V4) {
        const int d4 = dk / 4;
        for (int e = threadIdx.x; e < nt * d4; e += blockDim.x) {
            const int j = e / d4, i = 4 * (e - j * d4);
            const float *row = qkv + (int64_t)(t0 + j) * stride + (int64_t)kh * dk + i;
            __pipeline_memcpy_async(rq + 4 * e, row, 16);
            __pipeline_memcpy_async(rk + 4 * e, row + kdim, 16);
        }
        for (int e = threadIdx.x; e < nt * GDN_COLS / 4; e += blockDim.x) {
            const int j = e / (GDN_COLS / 4), cc = blockIdx.y * GDN_COLS + 4 * (e % (GDN_COLS / 4));
            if (cc < dv) /* dv % 4 == 0: the 4 columns are all in or all out */
                __pipeline_memcpy_async(rv + 4 * e, qkv + (int64_t)(t0 + j) * stride + 2 * kdim + (int64_t)h * dv + cc,
                                        16);
            else
                *(float4 *)(rv + 4 * e) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    } else {
        for (int e = threadIdx.x; e < nt * dk; e += blockDim.x) {
            const int j = e / dk, i = e % dk;
            const float *row = qkv + (int64_t)(t0 + j) * stride;
            __pipeline_memcpy_async(rq + e, row + (int64_t)kh * dk + i, sizeof(float));
            __pipeline_memcpy_async(rk + e, row + kdim + (int64_t)kh * dk + i, sizeof(float));
        }
        for (int e = threadIdx.x; e < nt * GDN_COLS; e += blockDim.x) {
            const int j = e / GDN_COLS, cc = blockIdx.y * GDN_COLS + e % GDN_COLS;
            if (cc < dv)
                __pipeline_memcpy_async(rv + e, qkv + (int64_t)(t0 + j) * stride + 2 * kdim + (int64_t)h * dv + cc,
                                        sizeof(float));
            else
                rv[e] = 0.0f;
        }
    }
    for (int j = threadIdx.x; j < nt; j += blockDim.x) {
        const int64_t th = (int64_t)(t0 + j) * n_v_heads + h;
        __pipeline_memcpy_async(rab + 2 * j, alpha + th, sizeof(float));
        __pipeline_memcpy_async(rab + 2 * j + 1, beta + th, sizeof(float));
    }
    __pipeline_commit();
}

/* B of a tile in lane groups (LG): GDN_MAX_WARPS lanes a column, each with
 * RPT rows that all exist (gdn_tiled_plan), so the rows go unchecked; the
 * lane's state s, the tile's normalised k and q (tk, tq: KS floats a token,
 * gdn_lg_at's layout), v (tv) and per-token scalars (tsc) as
 * gdn_scan_tiled_run keeps them; cb the lane's column in the block's 32;
 * where store, token j's output goes to o + j ostride. */
template <int RPT>
__device__ __forceinline__ void gdn_tile_lanes(float (&s)[RPT], const float *tk, const float *tq, const float *tv,
                                               const float *tsc, int KS, int nt, int row0, int cb, bool store,
                                               float *o, int64_t ostride)
{
    static_assert(RPT <= 16, "lane groups hold at most 16 rows a lane (gdn_tiled_plan)");
    constexpr int G = GDN_MAX_WARPS;
    const float4 *k4 = (const float4 *)(tk + gdn_lg_at<RPT, true>(row0));
    const float4 *q4 = (const float4 *)(tq + gdn_lg_at<RPT, true>(row0));
    for (int j = 0; j < nt; j++, k4 += KS / 4, q4 += KS / 4, o += ostride) {
        const float decay = tsc[j * 4 + 0], b = tsc[j * 4 + 1], qk = tsc[j * 4 + 2];
        float kr[RPT], qr[RPT]; /* the lane's rows of kn and qn, 16 bytes at a time */
#pragma unroll
        for (int m = 0; m < RPT / 4; m++) {
            const float4 kv = k4[m], qv = q4[m];
            kr[4 * m] = kv.x, kr[4 * m + 1] = kv.y, kr[4 * m + 2] = kv.z, kr[4 * m + 3] = kv.w;
            qr[4 * m] = qv.x, qr[4 * m + 1] = qv.y, qr[4 * m + 2] = qv.z, qr[4 * m + 3] = qv.w;
        }
        auto kn = [&](int r) { return kr[r]; };
        float pr, pp;
        gdn_decay_dots_by<RPT, false>(s, decay, kn, [&](int r) { return qr[r]; }, row0, 0, &pr, &pp);
        /* the group's partials, then their sums in order from 0, as the
         * barrier's sum adds them */
        float vr[G], vp[G];
#pragma unroll
        for (int q = 0; q < G; q++) {
            vr[q] = __shfl_sync(0xffffffffu, pr, q, G);
            vp[q] = __shfl_sync(0xffffffffu, pp, q, G);
        }
        float R = 0.0f, P = 0.0f;
#pragma unroll
        for (int q = 0; q < G; q++) {
            R += vr[q];
            P += vp[q];
        }
        const float d = b * (tv[j * GDN_COLS + cb] - R);
        gdn_update_by<RPT, false>(s, kn, d, row0, 0);
        if (store)
            *o = fmaf(d, qk, P);
    }
}

/* The body of k_gdn_scan_tiled and k_gdn_scan_tiled_segs (after the PDL
 * wait). */
template <int RPT, bool PF, bool LG>
__device__ __forceinline__ void gdn_scan_tiled_run(const float *qkv, int stride, const float *alpha,
                                                   const float *beta, const float *a, const float *dt_bias,
                                                   float *state, int n, int n_k_heads, int n_v_heads, int dk, int dv,
                                                   float eps, float *out)
{
    extern __shared__ float sh[];
    const int W = blockDim.x >> 5;
    const int KS = gdn_lg_stride(dk, RPT, LG); /* floats a token's q (k) takes */
    float *tq = sh;                         /* [TT][KS]: q / |q| / sqrt(dk) */
    float *tk = tq + GDN_TT * KS;           /* [TT][KS]: k / |k| */
    float *tv = tk + GDN_TT * KS;           /* [TT][32]: v of the block's columns */
    float *tsc = tv + GDN_TT * GDN_COLS;    /* [TT][4]: decay, beta gate, qn . kn */
    float *red = tsc + GDN_TT * 4;          /* [2][2][W][32]: partials of S^T kn, S^T qn */
    float *rq = red + 4 * W * GDN_COLS;     /* PF: the raw inputs of the tile being fetched */
    float *rk = rq + GDN_TT * dk, *rv = rk + GDN_TT * dk, *rab = rv + GDN_TT * GDN_COLS;

    const int h = blockIdx.x, kh = h % n_k_heads;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    /* the thread's column of the block's 32 and its first row (LG: lane
     * group lane / W of the warp, row part lane % W) */
    const int cb = LG ? wi * (GDN_COLS / W) + lane / W : lane;
    const int row0 = (LG ? lane % W : wi) * RPT;
    const int col = blockIdx.y * GDN_COLS + cb;
    const bool col_ok = col < dv;
    float *S = state + (int64_t)h * dk * dv;

    float s[RPT];
    gdn_state_load<RPT>(S, s, row0, col, col_ok, dk, dv);

    const float a_h = a[h], dtb = dt_bias[h];
    const float qscale = 1.0f / sqrtf((float)dk);
    const int64_t kdim = (int64_t)n_k_heads * dk;

    if (PF)
        gdn_tile_fetch<LG>(qkv, stride, alpha, beta, 0, n < GDN_TT ? n : GDN_TT, kh, h, n_v_heads, dk, dv, kdim, rq,
                           rk, rv, rab);
    for (int t0 = 0; t0 < n; t0 += GDN_TT) {
        const int nt = n - t0 < GDN_TT ? n - t0 : GDN_TT;
        if (PF) {
            __pipeline_wait_prior(0);
            __syncthreads();
        }
        /* A: the tile's inputs and everything that does not need the state
         * (LG: dk = 8 RPT, so the runs of 32 are a constant count, unrolled:
         * the 3 x DU warp sums of a token overlap) */
        constexpr int DU = LG ? GDN_MAX_WARPS * RPT / 32 : 8;
        const int du = LG ? DU : (dk + 31) / 32;
        for (int j = wi; j < nt; j += W) {
            const float *row = qkv + (int64_t)(t0 + j) * stride;
            float *qj = tq + j * KS, *kj = tk + j * KS;
            float sq = 0.0f, sk = 0.0f, sqk = 0.0f;
#pragma unroll
            for (int u = 0; u < DU; u++) { /* as k_gdn_scan's warps u */
                if (!LG && u >= du)
                    break;
                const int i = u * 32 + lane;
                float qv = 0.0f, kv = 0.0f;
                if (LG || i < dk) {
                    qv = PF ? rq[j * dk + i] : row[(int64_t)kh * dk + i];
                    kv = PF ? rk[j * dk + i] : row[kdim + (int64_t)kh * dk + i];
                    qj[gdn_lg_at<RPT, LG>(i)] = qv;
                    kj[gdn_lg_at<RPT, LG>(i)] = kv;
                }
                sq += mr_warp_sum(qv * qv);
                sk += mr_warp_sum(kv * kv);
                sqk += mr_warp_sum(qv * kv);
            }
            const float iq = 1.0f / sqrtf(sq + eps) * qscale, ik = 1.0f / sqrtf(sk + eps);
#pragma unroll
            for (int u = 0; u < DU; u++) {
                const int i = u * 32 + lane;
                if (!LG && u >= du)
                    break;
                if (LG || i < dk) {
                    const int at = gdn_lg_at<RPT, LG>(i);
                    qj[at] = qj[at] * iq;
                    kj[at] = kj[at] * ik;
                }
            }
            if (lane == 0) {
                const int64_t th = (int64_t)(t0 + j) * n_v_heads + h;
                gdn_gates(PF ? rab[2 * j] : alpha[th], dtb, a_h, PF ? rab[2 * j + 1] : beta[th], &tsc[j * 4 + 0],
                          &tsc[j * 4 + 1]);
                tsc[j * 4 + 2] = sqk * iq * ik;
            }
        }
        for (int e = threadIdx.x; e < nt * GDN_COLS; e += blockDim.x) {
            const int j = e / GDN_COLS, cc = blockIdx.y * GDN_COLS + e % GDN_COLS;
            tv[e] = PF ? rv[e] : cc < dv ? qkv[(int64_t)(t0 + j) * stride + 2 * kdim + (int64_t)h * dv + cc] : 0.0f;
        }
        __syncthreads();
        /* the raw buffers are read: the next tile's inputs come in during B */
        if (PF && t0 + GDN_TT < n) {
            const int t1 = t0 + GDN_TT;
            gdn_tile_fetch<LG>(qkv, stride, alpha, beta, t1, n - t1 < GDN_TT ? n - t1 : GDN_TT, kh, h, n_v_heads, dk,
                               dv, kdim, rq, rk, rv, rab);
        }
        /* B: the tokens in order */
        if constexpr (LG) {
            gdn_tile_lanes<RPT>(s, tk, tq, tv, tsc, KS, nt, row0, cb, row0 == 0 && col_ok,
                                out + ((int64_t)t0 * n_v_heads + h) * dv + col, (int64_t)n_v_heads * dv);
        } else {
            for (int j = 0; j < nt; j++) {
                const float decay = tsc[j * 4 + 0], b = tsc[j * 4 + 1], qk = tsc[j * 4 + 2];
                const float *kn = tk + j * KS, *qn = tq + j * KS;
                float pr, pp;
                gdn_decay_dots<RPT>(s, decay, kn, qn, row0, dk, &pr, &pp);
                /* buffer of this token's parity: a warp that runs ahead to
                 * the next token writes the other one, and cannot get two
                 * tokens ahead of the barrier below */
                float *rb = red + ((t0 + j) & 1) * 2 * W * GDN_COLS;
                rb[wi * GDN_COLS + lane] = pr;
                rb[(W + wi) * GDN_COLS + lane] = pp;
                __syncthreads();
                float R = 0.0f, P = 0.0f;
                for (int q = 0; q < W; q++) {
                    R += rb[q * GDN_COLS + lane];
                    P += rb[(W + q) * GDN_COLS + lane];
                }
                const float d = b * (tv[j * GDN_COLS + lane] - R);
                gdn_update<RPT>(s, kn, d, row0, dk);
                if (wi == 0 && col_ok)
                    out[((int64_t)(t0 + j) * n_v_heads + h) * dv + col] = fmaf(d, qk, P);
            }
        }
        __syncthreads(); /* the tile's buffers are refilled next */
    }

    gdn_state_store<RPT>(S, s, row0, col, col_ok, dk, dv);
}

template <int RPT, bool PF, bool LG>
__global__ void __launch_bounds__(32 * GDN_MAX_WARPS, 1)
k_gdn_scan_tiled(const float *qkv, int stride, const float *alpha, const float *beta, const float *a,
                 const float *dt_bias, float *state, int n, int n_k_heads, int n_v_heads, int dk, int dv, float eps,
                 float *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    gdn_scan_tiled_run<RPT, PF, LG>(qkv, stride, alpha, beta, a, dt_bias, state, n, n_k_heads, n_v_heads, dk, dv, eps,
                                out);
}

/* The sequences of a batch, any number of tokens each (blockIdx.z: segment
 * g, its tokens st.t0[g] .. st.t0[g] + st.n[g] - 1 of the rows, its state
 * st.p[g]): k_gdn_scan_tiled's floats for each, side by side in one launch
 * instead of one launch a sequence one after another (a prompt chunk of
 * several sequences, or prompts beside decode tokens).  A segment of one
 * token gets k_gdn_scan's floats: the two kernels' bits are the same. */
template <int RPT, bool PF, bool LG>
__global__ void __launch_bounds__(32 * GDN_MAX_WARPS, 1)
k_gdn_scan_tiled_segs(const float *qkv, int stride, const float *alpha, const float *beta, const float *a,
                      const float *dt_bias, const mr_cu_segs_n st, int n_k_heads, int n_v_heads, int dk, int dv,
                      float eps, float *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int g = blockIdx.z;
    const int64_t t0 = st.t0[g];
    gdn_scan_tiled_run<RPT, PF, LG>(qkv + t0 * stride, stride, alpha + t0 * n_v_heads, beta + t0 * n_v_heads, a,
                                dt_bias, st.p[g], st.n[g], n_k_heads, n_v_heads, dk, dv, eps,
                                out + t0 * n_v_heads * dv);
}

/* Rows of S a thread holds: the smallest of 4, 8, 16, 32 that needs at most
 * gdn_warps warps, else 32 (dk > 32 gdn_warps: more warps).  Every scan
 * kernel takes the same count, so a token's sums are the same in each. */
static int gdn_rpt(const mr_cu_ctx *c, int dk)
{
    int rpt = 4;
    while (rpt < 32 && rpt * c->gdn_warps < dk)
        rpt *= 2;
    return rpt;
}

/* Calls f with rpt (gdn_rpt's 4, 8, 16 or 32) as a compile-time constant,
 * f(std::integral_constant<int, rpt>()), so that each launch site names its
 * kernels once for every row count. */
template <class F>
static void gdn_with_rpt(int rpt, F f)
{
    switch (rpt) {
    case 4: f(std::integral_constant<int, 4>()); break;
    case 8: f(std::integral_constant<int, 8>()); break;
    case 16: f(std::integral_constant<int, 16>()); break;
    default: f(std::integral_constant<int, 32>()); break;
    }
}

/* Whether gdn_scan takes this shape (else it fails the context). */
static bool gdn_shape_ok(int stride, int n_k_heads, int n_v_heads, int dk, int dv)
{
    return n_k_heads >= 1 && n_v_heads >= 1 && n_v_heads % n_k_heads == 0 && dk >= 1 && dv >= 1 &&
           stride >= 2 * n_k_heads * dk + n_v_heads * dv && dk <= 32 * GDN_MAX_WARPS &&
           (dv + GDN_COLS - 1) / GDN_COLS <= 65535;
}

/* How the tiled kernel runs for dk: its shared memory (at most ~43 KB, dk
 * 256 with lane groups), whether the next tile's raw inputs are fetched
 * ahead (pf, unless MEMRA_CUDA_GDN_TILED=2: ~19 KB more at dk 128, which
 * must fit the 48 KB a launch gets without asking, else the tiles go
 * without) and whether B runs in lane groups (lg: GDN_MAX_WARPS warps whose
 * rows are all real (dk 32, 64 or 128) and at most 16 rows a thread,
 * unless MEMRA_CUDA_GDN_LANES=0; at 32, the dk 256 heads or
 * MEMRA_CUDA_GDN_WARPS=4, a lane's rows of q and k would not fit beside its
 * state in 128 registers), whose inputs come 16 bytes a copy (qkv 16-byte
 * aligned, stride and dv multiples of 4; qkv NULL: sizing only). */
struct gdn_tiling {
    size_t shm;
    bool pf, lg;
};
static gdn_tiling gdn_tiled_plan(const mr_cu_ctx *c, int dk, int dv, int stride, const float *qkv)
{
    const int rpt = gdn_rpt(c, dk), W = (dk + rpt - 1) / rpt;
    gdn_tiling t;
    t.lg = c->gdn_lanes && W == GDN_MAX_WARPS && rpt * W == dk && rpt <= 16 && dv % 4 == 0 && stride % 4 == 0 &&
           ((uintptr_t)qkv & 15) == 0;
    const size_t ks = (size_t)gdn_lg_stride(dk, rpt, t.lg);
    const size_t shm_tiled = sizeof(float) * ((size_t)2 * GDN_TT * ks + (size_t)GDN_TT * (GDN_COLS + 4) +
                                              (size_t)4 * W * GDN_COLS);
    const size_t shm_pf = shm_tiled + sizeof(float) * ((size_t)2 * GDN_TT * dk + (size_t)GDN_TT * (GDN_COLS + 2));
    t.pf = c->gdn_tiled_pf && shm_pf <= 48 * 1024;
    t.shm = t.pf ? shm_pf : shm_tiled;
    return t;
}

/* Calls f(pf, lg) with the plan's two flags as std::true_type or
 * std::false_type, so that a launch site names its tiled kernel once (lg
 * only where R, the rows a thread, is at most 16: gdn_tiled_plan). */
template <int R, class F>
static void gdn_with_tiling(const gdn_tiling &t, F f)
{
    using Y = std::true_type;
    using N = std::false_type;
    using L = std::integral_constant<bool, (R <= 16)>;
    if (t.pf && t.lg) f(Y(), L());
    else if (t.pf) f(Y(), N());
    else if (t.lg) f(N(), L());
    else f(N(), N());
}

static void cu_gdn_scan(mr_backend *be, const float *qkv, int stride, const float *alpha,
                        const float *beta, const float *a, const float *dt_bias, float *state, int n,
                        int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    if (!gdn_shape_ok(stride, n_k_heads, n_v_heads, dk, dv)) {
        mr_cu_fail(c, "gdn_scan: bad shape (k heads %d, v heads %d, dk %d, dv %d, stride %d; dk at most %d)",
                   n_k_heads, n_v_heads, dk, dv, stride, 32 * GDN_MAX_WARPS);
        return;
    }
    if (n <= 0)
        return;
    const int rpt = gdn_rpt(c, dk);
    const int W = (dk + rpt - 1) / rpt;
    const dim3 grid((unsigned)n_v_heads, (unsigned)((dv + GDN_COLS - 1) / GDN_COLS));
    const unsigned threads = (unsigned)(32 * W);
    const gdn_tiling tp = gdn_tiled_plan(c, dk, dv, stride, qkv);
    /* one token (a decode step) stays on the token-by-token kernel: its
     * tile set-up does not pay for itself there (run 67: 4.7 against 6.0 us
     * on the 35B-A3B's heads; 16 tokens 1.37x and 512 1.41x faster tiled) */
    const bool tiled = c->gdn_tiled && n > 1 && tp.shm <= 48 * 1024;
    const size_t shm = tiled ? tp.shm : sizeof(float) * ((size_t)2 * dk + (size_t)2 * W * GDN_COLS + (size_t)3 * W);
#define GDN_ARGS qkv, stride, alpha, beta, a, dt_bias, state, n, n_k_heads, n_v_heads, dk, dv, eps, out
    gdn_with_rpt(rpt, [&](auto r) {
        constexpr int R = decltype(r)::value;
        if (tiled)
            gdn_with_tiling<R>(tp, [&](auto pf, auto lg) {
                mr_cu_launch(c, k_gdn_scan_tiled<R, decltype(pf)::value, decltype(lg)::value>, grid, threads, shm,
                             GDN_ARGS);
            });
        else
            mr_cu_launch(c, k_gdn_scan<R>, grid, threads, shm, GDN_ARGS);
    });
#undef GDN_ARGS
    MR_CU_LAUNCHED(c, "gdn_scan");
}

/* k_gdn_scan_segs over ns segments of stride channels (ns at most
 * MR_CU_SEGS; their states in ss). */
static void gdn_scan_segs(mr_cu_ctx *c, const float *qkv, int channels, const float *alpha, const float *beta,
                          const float *a, const float *dt_bias, const mr_cu_segs &ss, int ns, int n_k_heads,
                          int n_v_heads, int dk, int dv, float eps, float *out)
{
    const int rpt = gdn_rpt(c, dk), W = (dk + rpt - 1) / rpt;
    const unsigned threads = (unsigned)(32 * W);
    const size_t shm = sizeof(float) * ((size_t)2 * dk + (size_t)2 * W * GDN_COLS + (size_t)3 * W);
    const dim3 grid((unsigned)n_v_heads, (unsigned)((dv + GDN_COLS - 1) / GDN_COLS), (unsigned)ns);
    gdn_with_rpt(rpt, [&](auto r) {
        mr_cu_launch(c, k_gdn_scan_segs<decltype(r)::value>, grid, threads, shm, qkv, channels, alpha, beta, a,
                     dt_bias, ss, n_k_heads, n_v_heads, dk, dv, eps, out);
    });
}

bool mr_cu_gdn_segs(mr_backend *be, const float *x, const float *cw, float *const *conv_states, int k,
                    float *conv_y, const float *alpha, const float *beta, const float *a, const float *dt_bias,
                    float *const *states, int nseg, int n_k_heads, int n_v_heads, int dk, int dv, float eps,
                    float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    const int channels = 2 * n_k_heads * dk + n_v_heads * dv;
    if (nseg < 1 || k < 1 || k > MR_CU_CONV_TAPS || !gdn_shape_ok(channels, n_k_heads, n_v_heads, dk, dv))
        return false;
    for (int s0 = 0; s0 < nseg; s0 += MR_CU_SEGS) {
        const int ns = nseg - s0 < MR_CU_SEGS ? nseg - s0 : MR_CU_SEGS;
        const int64_t r0 = s0;
        mr_cu_segs cs = {}, ss = {};
        for (int s = 0; s < ns; s++) {
            cs.p[s] = conv_states[s0 + s];
            ss.p[s] = states[s0 + s];
        }
        mr_cu_launch(c, k_conv1d_silu_segs, dim3((unsigned)((channels + 127) / 128), (unsigned)ns), 128, 0,
                     x + r0 * channels, cw, cs, channels, k, conv_y + r0 * channels);
        MR_CU_LAUNCHED(c, "conv1d_silu segs");
        gdn_scan_segs(c, conv_y + r0 * channels, channels, alpha + r0 * n_v_heads, beta + r0 * n_v_heads, a,
                      dt_bias, ss, ns, n_k_heads, n_v_heads, dk, dv, eps, out + r0 * n_v_heads * dv);
        MR_CU_LAUNCHED(c, "gdn_scan segs");
    }
    return true;
}

bool mr_cu_gdn_scan_segs_ok(mr_backend *be, int n_k_heads, int n_v_heads, int dk, int dv, int stride)
{
    mr_cu_ctx *c = mr_cu(be);
    return c->gdn_tiled && gdn_shape_ok(stride, n_k_heads, n_v_heads, dk, dv) &&
           gdn_tiled_plan(c, dk, dv, stride, NULL).shm <= 48 * 1024;
}

void mr_cu_gdn_scan_segs(mr_backend *be, const float *qkv, int stride, const float *alpha, const float *beta,
                         const float *a, const float *dt_bias, float *const *states, const int *t0, const int *n,
                         int nseg, int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    const gdn_tiling tp = gdn_tiled_plan(c, dk, dv, stride, qkv);
    const int rpt = gdn_rpt(c, dk), W = (dk + rpt - 1) / rpt;
    const unsigned threads = (unsigned)(32 * W);
    for (int s0 = 0; s0 < nseg; s0 += MR_CU_SEGS) {
        const int ns = nseg - s0 < MR_CU_SEGS ? nseg - s0 : MR_CU_SEGS;
        mr_cu_segs_n st = {};
        for (int s = 0; s < ns; s++) {
            st.p[s] = states[s0 + s];
            st.t0[s] = t0[s0 + s];
            st.n[s] = n[s0 + s];
        }
        const dim3 grid((unsigned)n_v_heads, (unsigned)((dv + GDN_COLS - 1) / GDN_COLS), (unsigned)ns);
#define GDN_TS_ARGS qkv, stride, alpha, beta, a, dt_bias, st, n_k_heads, n_v_heads, dk, dv, eps, out
        gdn_with_rpt(rpt, [&](auto r) {
            constexpr int R = decltype(r)::value;
            gdn_with_tiling<R>(tp, [&](auto pf, auto lg) {
                mr_cu_launch(c, k_gdn_scan_tiled_segs<R, decltype(pf)::value, decltype(lg)::value>, grid, threads,
                             tp.shm, GDN_TS_ARGS);
            });
        });
#undef GDN_TS_ARGS
        MR_CU_LAUNCHED(c, "gdn_scan segs tiled");
    }
}

bool mr_cu_gdn_scan_early(mr_backend *be, const float *qkv, int stride, const float *alpha, const float *beta,
                          const float *a, const float *dt_bias, float *state, int n_k_heads, int n_v_heads, int dk,
                          int dv, float eps, float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    if (!gdn_shape_ok(stride, n_k_heads, n_v_heads, dk, dv))
        return false;
    mr_cu_segs ss = {};
    ss.p[0] = state;
    gdn_scan_segs(c, qkv, stride, alpha, beta, a, dt_bias, ss, 1, n_k_heads, n_v_heads, dk, dv, eps, out);
    MR_CU_LAUNCHED(c, "gdn_scan early");
    return true;
}

void mr_cu_install_gdn(mr_backend *be)
{
    const char *t = getenv("MEMRA_CUDA_GDN_TILED");
    mr_cu(be)->gdn_tiled = !(t && !strcmp(t, "0"));
    mr_cu(be)->gdn_tiled_pf = !(t && (!strcmp(t, "0") || !strcmp(t, "2")));
    const char *l = getenv("MEMRA_CUDA_GDN_LANES");
    mr_cu(be)->gdn_lanes = !(l && !strcmp(l, "0"));
    const char *w = getenv("MEMRA_CUDA_GDN_WARPS");
    mr_cu(be)->gdn_warps = w && !strcmp(w, "4") ? 4 : 8;
    be->copy_2d = cu_copy_2d;
    be->sigmoid_mul = cu_sigmoid_mul;
    be->conv1d_silu = cu_conv1d_silu;
    be->gdn_scan = cu_gdn_scan;
}

/* Matrix products on GGUF weights: matvec kernels for decode (a few tokens:
 * every weight byte read once for all of them), expert matvec driven by
 * device-side expert ids; prompts go to cu_gemm.cu.  All accumulate in
 * float32 with float32 activations. */
#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_quant.cuh"

#define MV_WARPS 4 /* rows per block in the generic kernels: one warp per row */

/* The row r of job blockIdx.y that this warp computes and the job's input
 * and output; NULL when r is past the end, or when the expert id is out of
 * range (then after writing NaN to the row's output). */
__device__ __forceinline__ const uint8_t *mv_row(const mr_cu_mvjob &a, int64_t r, int lane,
                                                 const float **x, float **y)
{
    const uint8_t *W;
    bool ok = mr_cu_mv_resolve(a, blockIdx.y, &W, x, y);
    if (r >= a.rows)
        return NULL;
    if (!ok) {
        if (lane == 0) (*y)[r] = __int_as_float(0x7fc00000);
        return NULL;
    }
    return W + r * a.row_bytes;
}

/* Generic: one warp per row, lanes over 32-element groups. NT tokens. */
template <int T, int NT>
__global__ void __launch_bounds__(MV_WARPS * 32) k_mv_generic(mr_cu_mvjob a)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const float *x;
    float *y;
    const uint8_t *row = mv_row(a, r, lane, &x, &y);
    if (!row)
        return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    const int64_t ng = a.cols / 32;
    for (int64_t g = lane; g < ng; g += 32) {
        float v[32];
        mr_dq32<T>(row, g, v);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float *xp = x + t * a.cols + g * 32;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i++) s = fmaf(v[i], xp[i], s);
            acc[t] += s;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = mr_warp_sum(acc[t]);
        if (lane == 0) y[t * a.rows + r] = s;
    }
}

/* Plain types with any column count: lanes stride over elements. */
template <int T, int NT>
__global__ void __launch_bounds__(MV_WARPS * 32) k_mv_plain(mr_cu_mvjob a)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const float *x;
    float *y;
    const uint8_t *row = mv_row(a, r, lane, &x, &y);
    if (!row)
        return;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t c = lane; c < a.cols; c += 32) {
        float w = mr_plain_at<T>(row, c);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = fmaf(w, x[t * a.cols + c], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = mr_warp_sum(acc[t]);
        if (lane == 0) y[t * a.rows + r] = s;
    }
}

/* out[t] = row ids[t] of the matrix, dequantized. Bad ids give NaN rows. */
template <int T>
__global__ void k_get_rows(const uint8_t *W, size_t row_bytes, int64_t cols, int64_t rows,
                           const int32_t *ids, float *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int t = blockIdx.y;
    const int32_t id = ids[t];
    float *o = out + (int64_t)t * cols;
    constexpr bool plain = mr_cu_plain_type(T);
    const int64_t units = plain ? cols : cols / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= units)
        return;
    if (id < 0 || id >= rows) {
        for (int q = 0; q < (plain ? 1 : 32); q++) o[i * (plain ? 1 : 32) + q] = __int_as_float(0x7fc00000);
        return;
    }
    const uint8_t *row = W + (int64_t)id * row_bytes;
    if constexpr (plain) {
        o[i] = mr_plain_at<T>(row, i);
    } else {
        float v[32];
        mr_dq32<T>(row, i, v);
#pragma unroll
        for (int q = 0; q < 32; q++) o[i * 32 + q] = v[q];
    }
}

bool mr_cu_type_supported(int type)
{
    switch (type) {
#define X(TT) case TT:
        MR_CU_TYPE_LIST(X)
#undef X
        return true;
    default: return false;
    }
}


/* ---- host launchers ---- */

template <int T, int NT>
static void launch_generic(mr_cu_ctx *c, const mr_cu_mvjob &a, int jobs)
{
    dim3 grid(mr_cu_blocks((size_t)a.rows, MV_WARPS), jobs);
    if (mr_cu_plain_type(T) && a.cols % 32)
        mr_cu_launch(c, k_mv_plain<T, NT>, grid, MV_WARPS * 32, 0, a);
    else
        mr_cu_launch(c, k_mv_generic<T, NT>, grid, MV_WARPS * 32, 0, a);
    MR_CU_LAUNCHED(c, "matvec");
}

template <int T>
static void launch_generic_nt(mr_cu_ctx *c, const mr_cu_mvjob &a, int nt, int jobs)
{
    switch (nt) {
    case 1: launch_generic<T, 1>(c, a, jobs); break;
    case 2: launch_generic<T, 2>(c, a, jobs); break;
    case 3: launch_generic<T, 3>(c, a, jobs); break;
    case 4: launch_generic<T, 4>(c, a, jobs); break;
    case 5: launch_generic<T, 5>(c, a, jobs); break;
    case 6: launch_generic<T, 6>(c, a, jobs); break;
    case 7: launch_generic<T, 7>(c, a, jobs); break;
    case 8: launch_generic<T, 8>(c, a, jobs); break;
    default: mr_cu_fail(c, "matvec: %d tokens per launch (max 8)", nt);
    }
}

static void matvec_dispatch(mr_cu_ctx *c, int type, const mr_cu_mvjob &a, int nt, int jobs)
{
    switch (type) {
#define X(TT) case TT: launch_generic_nt<TT>(c, a, nt, jobs); break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: mr_cu_fail(c, "matvec: unsupported type %d", type);
    }
}


static bool weight_ok(mr_cu_ctx *c, const mr_weight *w, const char *op)
{
    if (!w || !w->data) {
        mr_cu_fail(c, "%s: weight %s has no device data", op, w && w->name ? w->name : "?");
        return false;
    }
    if (!mr_cu_type_supported(w->type)) {
        mr_cu_fail(c, "%s: weight %s: type %d is not supported by the CUDA backend", op,
                   w->name ? w->name : "?", w->type);
        return false;
    }
    if (!mr_cu_plain_type(w->type) && w->cols % 32) {
        mr_cu_fail(c, "%s: weight %s: %lld columns is not a whole number of blocks", op,
                   w->name ? w->name : "?", (long long)w->cols);
        return false;
    }
    return true;
}

/* Whether the m weights are present, of types the backend takes, in whole
 * blocks: weight_ok's rule, quiet (a caller that joins calls leaves a bad
 * weight to the one-by-one call that reports it). */
static bool weights_usable(const mr_weight *const *w, int m)
{
    for (int s = 0; s < m; s++)
        if (!w[s] || !w[s]->data || !mr_cu_type_supported(w[s]->type) ||
            (!mr_cu_plain_type(w[s]->type) && w[s]->cols % 32))
            return false;
    return true;
}

void mr_cu_matmul(mr_backend *be, const mr_weight *w, const float *x, float *y, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || !weight_ok(c, w, "matmul"))
        return;
    if (n >= MR_CU_GEMM_MIN_TOKENS) {
        mr_cu_matmul_gemm(c, w, x, y, n);
        return;
    }
    if (mr_cu_xmd_matvec(c, &w, &y, 1, x, n))
        return; /* the int8 tensor cores take the matrix (at any decode size) */
    if (mr_cu_x24_matvec(c, &w, &y, 1, x, n))
        return; /* the 22-bit kernel takes the matrix (at any decode size) */
    /* the fast kernels take a decode batch whole (cu_fast.cu launch_fast_n
     * splits it into launches of as many tokens as each kernel takes);
     * with MEMRA_CUDA_MATVEC=q8 the int8 kernels come first */
    if (!c->matvec_q8 && mr_cu_fast_matvec(c, w, x, y, n))
        return;
    if (n > MR_CU_MATVEC_MAX) { /* the other kernels: 8 tokens a launch */
        for (int t0 = 0; t0 < n; t0 += MR_CU_MATVEC_MAX)
            mr_cu_matmul(be, w, x + (int64_t)t0 * w->cols, y + (int64_t)t0 * w->rows,
                         n - t0 < MR_CU_MATVEC_MAX ? n - t0 : MR_CU_MATVEC_MAX);
        return;
    }
    if (mr_cu_q8_matvec(c, w, x, y, n))
        return;
    if (c->matvec_q8 && mr_cu_fast_matvec(c, w, x, y, n))
        return;
    matvec_dispatch(c, w->type, mr_cu_mvjob_plain((const uint8_t *)w->data, w->row_bytes, w, x, y), n, 1);
}

/* The weights a fast-path decode kernel reads and their row stride: the
 * 22-bit kernels' source (the GGUF blocks, or the padded copy where the
 * type has one) where x24, else the fast kernels' copy where there is
 * one (make_job in cu_fast.cu), else the GGUF blocks. */
static const void *fast_source(const mr_weight *w, bool x24, size_t *rb)
{
    if (x24)
        return mr_cu_x24_source(w, rb);
    if (w->priv) {
        *rb = mr_cu_fast_row_bytes(w);
        return w->priv;
    }
    *rb = w->row_bytes;
    return w->data;
}

/* The bytes of w that a one-token mr_cu_matmul over x reads, in the layout
 * of the kernel that takes it (the order above); *bytes how many.  For the
 * weights' L2 prefetches of MEMRA_CUDA_L2PF (cu_autograph.cu); a change of
 * the order above changes this too. */
const void *mr_cu_matvec_source(const mr_cu_ctx *c, const mr_weight *w, const float *x, size_t *bytes)
{
    size_t rb = w->row_bytes;
    const void *p = mr_cu_xmd_takes(c, &w, 1) ? w->data /* the int8 tensor cores read the GGUF blocks */
                                              : fast_source(w, mr_cu_x24_takes(c, &w, 1, x) == 1, &rb);
    *bytes = rb * (size_t)w->rows;
    return p;
}

/* The same for a decode mr_cu_matmul_id: the stack of matrices the kernel
 * that takes it reads (the tensor-core and 22-bit expert kernels read the
 * 22-bit source), *mat_bytes apart. */
const void *mr_cu_matvec_id_source(const mr_cu_ctx *c, const mr_weight *w, const float *x, size_t *mat_bytes)
{
    size_t rb = 0;
    const void *p = fast_source(w, mr_cu_xmm_takes_id(c, &w, 1, x) || mr_cu_x24_takes_id(c, &w, 1, x), &rb);
    *mat_bytes = rb * (size_t)w->rows;
    return p;
}

/* Prompt rows (be->matmul_prompt): the GEMM path at any size, whose rows
 * do not depend on how many share the call (cu_hgemm.cu), so that a prompt
 * row meets the same sums in a chunk of 7 tokens as in a prompt of 512. */
void mr_cu_matmul_prompt(mr_backend *be, const mr_weight *w, const float *x, float *y, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || !weight_ok(c, w, "matmul"))
        return;
    mr_cu_matmul_gemm(c, w, x, y, n);
}

bool mr_cu_matmul_prompt_multi(mr_backend *be, const mr_weight *const *w, float *const *y, int m, const float *x,
                               int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || m < 2 || m > MR_CU_MV_SUBS || c->failed || !weights_usable(w, m))
        return false;
    return mr_cu_matmul_gemm_multi(c, w, y, m, x, n);
}

void mr_cu_matmul_id_prompt(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                            const int32_t *ids, int k, float *y, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || k <= 0 || !weight_ok(c, w, "matmul_id"))
        return;
    if ((x_slots == 1 || x_slots == k) && mr_cu_matmul_id_gemm(c, w, x, x_slots, ids, k, y, n))
        return;
    mr_cu_matmul_id(be, w, x, x_slots, ids, k, y, n); /* bad ids or slots: its checks and NaN rows */
}

/* A mixture layer's routed experts for the prompt rows
 * (be->moe_ffn_prompt): one grouping for gate, up and down where the
 * fused path takes the three, else gate and up, swiglu, down. */
void mr_cu_moe_ffn_prompt(mr_backend *be, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd,
                          const float *x, const int32_t *ids, int k, float *gate, float *up, float *y, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || k <= 0 || !weight_ok(c, wg, "matmul_id") || !weight_ok(c, wu, "matmul_id") ||
        !weight_ok(c, wd, "matmul_id"))
        return;
    if (mr_cu_moe_ffn_gemm(c, wg, wu, wd, x, ids, k, gate, up, y, n))
        return;
    mr_cu_matmul_id_prompt(be, wg, x, 1, ids, k, gate, n);
    mr_cu_matmul_id_prompt(be, wu, x, 1, ids, k, up, n);
    mr_cu_swiglu(be, gate, up, gate, (size_t)n * (size_t)k * (size_t)wg->rows);
    mr_cu_matmul_id_prompt(be, wd, gate, k, ids, k, y, n);
}

void mr_cu_matmul_id(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                     const int32_t *ids, int k, float *y, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || k <= 0 || !weight_ok(c, w, "matmul_id"))
        return;
    if (x_slots != 1 && x_slots != k) {
        mr_cu_fail(c, "matmul_id: x_slots %d (expected 1 or k=%d)", x_slots, k);
        return;
    }
    if (n >= MR_CU_GEMM_MIN_TOKENS && mr_cu_matmul_id_gemm(c, w, x, x_slots, ids, k, y, n))
        return;
    if ((int64_t)n * k > 65535) {
        mr_cu_fail(c, "matmul_id: %d token-expert pairs (max 65535)", n * k);
        return;
    }
    if (mr_cu_q8_matvec_id(c, w, x, x_slots, ids, k, y, n))
        return;
    if (mr_cu_fast_matvec_id(c, w, x, x_slots, ids, k, y, n))
        return;
    mr_cu_mvjob a = mr_cu_mvjob_plain((const uint8_t *)w->data, w->row_bytes, w, x, y);
    a.ids = ids;
    a.k = k;
    a.x_slots = x_slots;
    matvec_dispatch(c, w->type, a, 1, n * k);
}

/* Whether m weights can share a decode launch: present, of a type the
 * backend takes, no int8-activation path (that one quantizes per call),
 * and not split by the 22-bit kernel's shape rule (a matrix it takes alone and one it does
 * not would run different kernels in one launch, and a shared launch must
 * be bitwise the separate calls).  Quiet: a bad weight is reported by the
 * one-by-one call that follows. */
static bool multi_ok(mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x)
{
    if (c->matvec_q8 || c->failed || !weights_usable(w, m))
        return false;
    return mr_cu_xmd_takes(c, w, m) || mr_cu_x24_takes(c, w, m, x) >= 0;
}

bool mr_cu_matmul_multi(mr_backend *be, const mr_weight *const *w, float *const *y, int m,
                        const float *x, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n < 1 || n >= MR_CU_GEMM_MIN_TOKENS || m < 2 || m > MR_CU_MV_SUBS ||
        !multi_ok(c, w, m, x))
        return false;
    if (mr_cu_xmd_matvec(c, w, y, m, x, n))
        return true; /* the int8 tensor cores take all of them */
    if (mr_cu_x24_matvec(c, w, y, m, x, n))
        return true; /* the 22-bit kernel takes all of them (multi_ok: all or none) */
    /* a decode batch whole: the fast kernels split it into launches
     * (launch_fast_n), or take none of it */
    return mr_cu_fast_matvec_multi(c, w, y, m, x, n);
}

bool mr_cu_matmul_multi_conv(mr_backend *be, const mr_weight *const *w, float *const *y, int m, const float *x,
                             const float *conv, float *state, int k, float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    /* the products go where mr_cu_matmul (m = 1) or mr_cu_matmul_multi
     * would send them: the int8 tensor cores first */
    if (m < 1 || m > MR_CU_MV_SUBS || !multi_ok(c, w, m, x))
        return false;
    if (mr_cu_xmd_takes(c, w, m))
        return mr_cu_xmd_matvec_conv(c, w, y, m, x, conv, state, k, out);
    return mr_cu_x24_matvec_conv(c, w, y, m, x, conv, state, k, out);
}

bool mr_cu_matmul_id_multi(mr_backend *be, const mr_weight *const *w, float *const *y, int m,
                           const float *x, int x_slots, const int32_t *ids, int k, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n < 1 || n >= MR_CU_GEMM_MIN_TOKENS || k < 1 || (x_slots != 1 && x_slots != k) || !multi_ok(c, w, m, x))
        return false;
    return mr_cu_fast_matvec_id_multi(c, w, y, m, x, x_slots, ids, k, n);
}

/* Gate and up products and the SwiGLU after them in one launch a chunk of
 * tokens (plain) or for one token's experts (ids; a decode batch's too on
 * the tensor-core expert kernel), on the kernel the two
 * products would each take (the 22-bit one where it takes them, else the
 * fast float ones), so with their sums; false where that kernel has no
 * such form (22-bit plain products of 2+ tokens) or the pair is not
 * shareable. */
bool mr_cu_matmul_glu(mr_backend *be, const mr_weight *const *w, float *const *y, float *o, const float *x,
                      int x_slots, const int32_t *ids, int k, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n < 1 || n >= MR_CU_GEMM_MIN_TOKENS || !multi_ok(c, w, 2, x))
        return false;
    if (ids) {
        if (k < 1 || (x_slots != 1 && x_slots != k))
            return false;
        /* the tensor-core expert kernel writes the SwiGLU at any batch size
         * (its grouping the NaN rows of bad ids); the others at one token */
        if (mr_cu_xmm_takes_id(c, w, 2, x))
            return mr_cu_xmm_matvec_id(c, w, y, o, 2, x, x_slots, ids, k, n);
        if (n != 1)
            return false;
        if (mr_cu_x24_takes_id(c, w, 2, x))
            return mr_cu_x24_glu_id(c, w, y, o, x, x_slots, ids, k, 1);
        return mr_cu_fast_glu(c, w, y, o, x, x_slots, ids, k, 1);
    }
    if (mr_cu_xmd_takes(c, w, 2))
        return false; /* no SwiGLU form: the two as one matmul_multi, then swiglu */
    if (mr_cu_x24_takes(c, w, 2, x)) /* multi_ok: all of them */
        return mr_cu_x24_glu(c, w, y, o, x, n);
    float *yc[2];
    for (int t0 = 0; t0 < n; t0 += MR_CU_MATVEC_MAX) {
        const int nc = n - t0 < MR_CU_MATVEC_MAX ? n - t0 : MR_CU_MATVEC_MAX;
        for (int s = 0; s < 2; s++) yc[s] = y[s] + (int64_t)t0 * w[s]->rows;
        /* whether the kernels take the pair does not depend on the tokens:
         * the first chunk decides for all */
        if (!mr_cu_fast_glu(c, w, yc, o + (int64_t)t0 * w[0]->rows, x + (int64_t)t0 * w[0]->cols, 1, NULL, 1, nc))
            return false;
    }
    return true;
}

void mr_cu_get_rows(mr_backend *be, const mr_weight *w, const int32_t *ids, int n, float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || !weight_ok(c, w, "get_rows"))
        return;
    if (n > 65535) {
        mr_cu_fail(c, "get_rows: %d rows (max 65535)", n);
        return;
    }
    const unsigned th = 128;
    int64_t units = mr_cu_plain_type(w->type) ? w->cols : w->cols / 32;
    dim3 grid(mr_cu_blocks((size_t)units, th), n);
    const uint8_t *W = (const uint8_t *)w->data;
    switch (w->type) {
#define X(TT) case TT: mr_cu_launch(c, k_get_rows<TT>, grid, th, 0, W, w->row_bytes, w->cols, w->rows, ids, out); break;
        MR_CU_TYPE_LIST(X)
#undef X
    default: return;
    }
    MR_CU_LAUNCHED(c, "get_rows");
}

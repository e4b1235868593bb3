/* Bandwidth-tuned matvec kernels for the weight types that dominate decode
 * (cu_fast.cu).  Each returns false when it does not handle the case; the
 * caller then uses the generic kernels, which compute the same function. */
#ifndef MR_CU_FAST_CUH
#define MR_CU_FAST_CUH

#include "kernels/cuda/cu_common.cuh"

/* One matvec launch: where job `job` (blockIdx.y) reads its matrix and
 * input and writes its output.  The same description drives the generic
 * kernels (cu_matmul.cu, GGUF layout) and the fast ones (kernel layout). */
struct mr_cu_mvjob {
    const uint8_t *W;  /* first matrix */
    size_t mat_bytes;  /* bytes per matrix (stride between experts) */
    size_t row_bytes;
    int64_t cols, rows, n_mats;
    const float *x;
    float *y;
    const int32_t *ids; /* NULL: plain matmul (one job) */
    int k, x_slots;
    /* Plain products (ids NULL): tokens a job of grid.y, whose job j reads
     * the inputs and writes the outputs of tokens j * tok_chunk ..; 0: one
     * job.  A job's sums are those of a launch of its tokens alone. */
    int tok_chunk;
    /* Several matrices of one type and width over the same inputs in one
     * launch (q/k/v or gate/up of a decode step): with n_sub > 1, grid.x is
     * cut into n_sub runs of blocks, run s (from block sub_blk[s]) computing
     * sub_rows[s] rows of the matrices at sub_W[s] into sub_y[s]; W, y and
     * rows above are then unused.  n_sub <= 1: one matrix. */
    int n_sub;
    unsigned sub_blk[MR_CU_MV_SUBS];
    const uint8_t *sub_W[MR_CU_MV_SUBS];
    float *sub_y[MR_CU_MV_SUBS];
    int64_t sub_rows[MR_CU_MV_SUBS];
    /* Non-NULL: a gate/up pair with SwiGLU (n_sub == 2, equal rows): a
     * block computes rows of both, writes both as the two products would,
     * and silu(gate) * up here, laid out like the gate's output (which it
     * may be: the in-place swiglu of the forward pass). */
    float *glu_out;
    /* Non-NULL conv_w (the 22-bit kernel, one token, mr_cu_x24_matvec_conv):
     * the launch's first conv_ch rows are the channels of a causal
     * convolution of conv_k taps (conv1d_silu, cu_gdn.cu) run on the
     * product's outputs: silu of each channel's sum to conv_y, and
     * conv_state ([conv_k - 1][conv_ch]) moved on by the token.  Unused
     * otherwise. */
    const float *conv_w;
    float *conv_state, *conv_y;
    int64_t conv_ch;
    int conv_k;
};

/* A plain (one-job) matvec over w's rows stored row_bytes apart at W. */
static inline mr_cu_mvjob mr_cu_mvjob_plain(const uint8_t *W, size_t row_bytes, const mr_weight *w,
                                            const float *x, float *y)
{
    mr_cu_mvjob a;
    a.W = W;
    a.row_bytes = row_bytes;
    a.mat_bytes = row_bytes * (size_t)w->rows;
    a.cols = w->cols;
    a.rows = w->rows;
    a.n_mats = w->n_mats;
    a.x = x;
    a.y = y;
    a.ids = NULL;
    a.k = 1;
    a.x_slots = 1;
    a.tok_chunk = 0;
    a.n_sub = 0;
    a.glu_out = NULL;
    a.conv_w = NULL;
    a.conv_state = a.conv_y = NULL;
    a.conv_ch = 0;
    a.conv_k = 0;
    return a;
}

/* Sub-matrix s (0..3) of a multi-matrix job as a plain job, with constant
 * indices only: a dynamic index into the parameter arrays would copy them
 * to local memory. */
__device__ __forceinline__ mr_cu_mvjob mr_cu_mv_subjob(const mr_cu_mvjob &a, int s)
{
    static_assert(MR_CU_MV_SUBS == 4, "the branches below name every sub-matrix");
    mr_cu_mvjob j = a;
    if (s == 3) {
        j.W = a.sub_W[3];
        j.y = a.sub_y[3];
        j.rows = a.sub_rows[3];
    } else if (s == 2) {
        j.W = a.sub_W[2];
        j.y = a.sub_y[2];
        j.rows = a.sub_rows[2];
    } else if (s == 1) {
        j.W = a.sub_W[1];
        j.y = a.sub_y[1];
        j.rows = a.sub_rows[1];
    } else {
        j.W = a.sub_W[0];
        j.y = a.sub_y[0];
        j.rows = a.sub_rows[0];
    }
    j.mat_bytes = j.row_bytes * (size_t)j.rows;
    j.n_sub = 0;
    return j;
}

/* The plain job of the matrix block b (blockIdx.x, or a block of rows a
 * looping kernel takes) works on, and the block's first row (R rows a
 * block): for a multi-matrix launch, the run of blocks it falls in picks
 * the matrix. */
template <int R>
__device__ __forceinline__ mr_cu_mvjob mr_cu_mv_sub(const mr_cu_mvjob &a, unsigned b, int64_t *r0)
{
    if (a.n_sub <= 1) {
        *r0 = (int64_t)b * R;
        return a;
    }
    const int s = a.n_sub > 3 && b >= a.sub_blk[3] ? 3 : a.n_sub > 2 && b >= a.sub_blk[2] ? 2 : b >= a.sub_blk[1] ? 1 : 0;
    const unsigned first = s == 3 ? a.sub_blk[3] : s == 2 ? a.sub_blk[2] : s == 1 ? a.sub_blk[1] : 0;
    *r0 = (int64_t)(b - first) * R;
    return mr_cu_mv_subjob(a, s);
}

/* Resolves job j to its matrix, input and output pointers; false when the
 * expert id is out of range (the caller then writes NaN to its rows). */
__device__ __forceinline__ bool mr_cu_mv_resolve(const mr_cu_mvjob &a, int job, const uint8_t **W,
                                                 const float **x, float **y)
{
    if (!a.ids) {
        const int64_t t0 = (int64_t)job * a.tok_chunk;
        *W = a.W;
        *x = a.x + t0 * a.cols;
        *y = a.y + t0 * a.rows;
        return true;
    }
    int t = job / a.k, j = job % a.k;
    int e = a.ids[job];
    *x = a.x + ((int64_t)t * a.x_slots + (a.x_slots > 1 ? j : 0)) * a.cols;
    *y = a.y + (int64_t)job * a.rows;
    if (e < 0 || e >= a.n_mats)
        return false;
    *W = a.W + (size_t)e * a.mat_bytes;
    return true;
}

/* Job blockIdx.y for the R rows from r0 that a block computes: false after
 * writing NaN to those rows when the job's expert id is out of range. */
template <int R>
__device__ __forceinline__ bool mr_cu_mv_rows(const mr_cu_mvjob &a, int64_t r0, const uint8_t **W,
                                              const float **x, float **y)
{
    if (mr_cu_mv_resolve(a, blockIdx.y, W, x, y))
        return true;
    if (threadIdx.x < R && r0 + threadIdx.x < a.rows) (*y)[r0 + threadIdx.x] = __int_as_float(0x7fc00000);
    return false;
}

/* n tokens (1..MR_CU_GEMM_MIN_TOKENS - 1) of m matrices (1..MR_CU_MV_SUBS,
 * one type and width) over the same inputs through the 22-bit-activation
 * kernel (cu_mvx24.cu; Q4_K batches from c->x24_mma_min tokens on the
 * tensor cores, cu_mvx24mma.cu), when it is on and takes them; false
 * otherwise, nothing launched.  Plain products only; mr_cu_matmul and
 * mr_cu_matmul_multi try it first. */
bool mr_cu_x24_matvec(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x, int n);
/* Whether those m matrices go to that kernel: 1 all, 0 none, -1 some (then
 * they must not share a launch: each would not run what it runs alone).
 * Does not depend on the token count. */
int mr_cu_x24_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x);
/* The bytes that kernel reads of w (plain and expert products): the GGUF
 * blocks or the padded copy (cu_x24.cuh xs_padded); *row_bytes their row
 * stride. */
const void *mr_cu_x24_source(const mr_weight *w, size_t *row_bytes);

/* Expert products of decode through the 22-bit kernel (cu_moex24.cu): m
 * expert matrices (1..MR_CU_MV_SUBS, one type and width, chosen by the same
 * ids) over n tokens (1..MR_CU_GEMM_MIN_TOKENS - 1); false, nothing
 * launched, when it is off or does not take them.  Whether it takes them
 * does not depend on n, and a pair's sums are the same at any n. */
bool mr_cu_x24_matvec_id(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                         int x_slots, const int32_t *ids, int k, int n);

/* The gate/up pair and the swiglu after them in one launch on those two
 * kernels (mr_cu_fast_glu's contract): one token's plain pair where
 * mr_cu_x24_matvec takes it, one token's experts where
 * mr_cu_x24_matvec_id takes them (mr_cu_x24_takes_id); false, nothing
 * launched, otherwise. */
bool mr_cu_x24_glu(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, const float *x, int n);
/* One token's m matrices where mr_cu_x24_matvec takes them, with the
 * conv1d_silu of matrix 0's outputs in the same launch (conv: the channels'
 * taps [rows of w[0]][k], k at most MR_CU_CONV_TAPS; state [k - 1][rows];
 * out: rows): the outputs, the new state and out are what the product and
 * then conv1d_silu at one token write.  False, nothing launched, where that
 * kernel does not take them. */
bool mr_cu_x24_matvec_conv(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                           const float *conv, float *state, int k, float *out);
bool mr_cu_x24_takes_id(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x);
bool mr_cu_x24_glu_id(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, const float *x,
                      int x_slots, const int32_t *ids, int k, int n);

/* Expert products of decode on the int8 tensor cores (cu_moemma.cu; which
 * types: c->xmm): whether it takes the matrices (never depends on the token
 * count), and the products (o: the SwiGLU of a gate/up pair, or NULL);
 * false, nothing launched, where it does not take them. */
bool mr_cu_xmm_takes_id(const mr_cu_ctx *c, const mr_weight *const *w, int m, const float *x);
bool mr_cu_xmm_matvec_id(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, int m, const float *x,
                         int x_slots, const int32_t *ids, int k, int n);
/* at backend creation: the launches' shared memory opt-in */
bool mr_cu_xmm_optin(int bytes);

/* Decode expert products grouped by expert (cu_fast.cu, k_moe_group): the
 * list of used experts and each one's pairs, built on the device into
 * c->scratch_grp (layout there), NaN written to y's rows (rows a pair) of
 * pairs whose id is out of range, and to y2's where not NULL (a second
 * matrix of the same rows over the same ids), and to yo's (the SwiGLU of
 * the two, where not NULL) what the swiglu op makes of two NaNs; *S the
 * slots (min(P, n_mats)).  NULL,
 * nothing launched, outside the limits (mr_cu_moe_group_fits), when the
 * scratch would grow inside a capture, or on a failure (recorded). */
bool mr_cu_moe_group_fits(int P, int64_t n_mats);
/* Slot `slot` of a grouping (the layout: cu_fast.cu): false if unused,
 * else its expert *e and its pairs, *np of them from index *first of the
 * list.  Pairs with a bad id are not listed (the grouping kernel wrote
 * their NaN rows). */
__device__ __forceinline__ bool mr_cu_grp_slot(const int32_t *grp, int S, int slot, int *e, int *first, int *np)
{
    /* all four loads before the test (slot < S: every one is in the
     * grouping), so that they take one round trip, not two */
    const int used = grp[0], ee = grp[1 + slot], f = grp[1 + S + slot], end = grp[2 + S + slot];
    if (slot >= used)
        return false;
    *e = ee;
    *first = f;
    *np = end - f;
    return true;
}
/* items: also the chunks of at most two pairs of one expert, at
 * mr_cu_grp_items_at (the layout: cu_fast.cu) */
const int32_t *mr_cu_moe_group(mr_cu_ctx *c, const int32_t *ids, int P, int k, int64_t n_mats, int64_t rows,
                               float *y, float *y2, float *yo, int *S, bool items);
/* Where a grouping of P pairs in S slots keeps its chunks (int32 index, a
 * multiple of 4: int4 records). */
__host__ __device__ constexpr int mr_cu_grp_items_at(int S, int P) { return (2 + 2 * S + P + 3) / 4 * 4; }

/* Bytes of a row of w in the kernel layout (w->priv, or w->data where the
 * type keeps the GGUF layout). */
size_t mr_cu_fast_row_bytes(const mr_weight *w);
bool mr_cu_fast_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n);
bool mr_cu_fast_matvec_multi(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m,
                             const float *x, int n);
bool mr_cu_fast_matvec_id_multi(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m,
                                const float *x, int x_slots, const int32_t *ids, int k, int n);
bool mr_cu_fast_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n);
/* Gate and up products (w[0], w[1] into y[0], y[1]) and the SwiGLU after
 * them (silu(y[0]) * y[1] into o, which may be y[0]) in one launch a chunk
 * of tokens, with the floats of the three ops; plain products of 1..8
 * tokens (ids NULL) or the experts of one token (ids, k, x_slots).  False,
 * nothing launched, when the fast kernels do not take the pair. */
bool mr_cu_fast_glu(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, float *o, const float *x,
                    int x_slots, const int32_t *ids, int k, int n);

#endif

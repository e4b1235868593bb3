/* Elementwise and row ops: RMSNorm (plain and fused with the residual add),
 * RoPE, SwiGLU, add, MoE routing and combine, argmax. */
#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_xmp.cuh" /* xmd_il_block */

#define ROW_THREADS 256

__device__ __forceinline__ float block_sum(float v, float *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = mr_warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += sh[i];
    return s;
}

/* One block per row.  FUSED: y += x first (y is the residual stream),
 * then out = norm(y) * w.  Plain: out = norm(in) * w, out may be in. */
template <bool FUSED>
__global__ void k_rmsnorm(float *y, const float *x, const float *w, float *out, int dim, float eps)
{
    mr_pdl_wait(); /* cu_pdl.cuh: before any access */
    mr_pdl_trigger();
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    float *yr = y + row * dim;
    const float *xr = FUSED ? x + row * dim : NULL;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = yr[i];
        if (FUSED) {
            v += xr[i];
            yr[i] = v;
        }
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float *o = out + row * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = yr[i] * inv * w[i];
}

/* Rows whose length is a multiple of 4 and at most 4 x 4 x 1024: each
 * thread keeps up to 4 float4 of its row in registers (one read of the
 * row, 16-byte loads, enough threads that one row is not one slow SM).
 * GATE (mr_cu_rmsnorm_gate, with FUSED false): each output is then
 * mr_silu_mul(z, that output), what swiglu(z, out, out) would store after
 * the norm: the same floats in one launch. */
#define RN_K 4
template <bool FUSED, bool GATE>
__global__ void __launch_bounds__(1024) k_rmsnorm4(float *y, const float *x, const float *w,
                                                   float *out, int dim4, float eps, const float *z)
{
    const float4 *w4 = (const float4 *)w;
    float4 v[RN_K], g[RN_K];
    /* the weights (which no kernel of the step writes) are loaded before
     * the PDL wait, while the kernel before still runs, not after the sum:
     * no memory round trip of their own on the way out */
#pragma unroll
    for (int k = 0; k < RN_K; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < dim4) g[k] = w4[i];
    }
    mr_pdl_wait();
    mr_pdl_trigger();
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    float4 *yr = (float4 *)(y + row * dim4 * 4);
    const float4 *xr = FUSED ? (const float4 *)(x + row * dim4 * 4) : NULL;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RN_K; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < dim4) {
            float4 a = yr[i];
            if (FUSED) {
                const float4 b = xr[i];
                a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
                yr[i] = a;
            }
            v[k] = a;
            ss = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, ss))));
        }
    }
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)(dim4 * 4) + eps);
    float4 *o = (float4 *)(out + row * dim4 * 4);
    const float4 *zr = GATE ? (const float4 *)(z + row * dim4 * 4) : nullptr;
#pragma unroll
    for (int k = 0; k < RN_K; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < dim4) {
            float4 r = make_float4(v[k].x * inv * g[k].x, v[k].y * inv * g[k].y, v[k].z * inv * g[k].z,
                                   v[k].w * inv * g[k].w);
            if (GATE) {
                const float4 q = zr[i];
                r = make_float4(mr_silu_mul(q.x, r.x), mr_silu_mul(q.y, r.y), mr_silu_mul(q.z, r.z),
                                mr_silu_mul(q.w, r.w));
            }
            o[i] = r;
        }
    }
}

static bool rn_vec_ok(int dim, const void *a, const void *b, const void *c2, const void *d)
{
    return dim % 4 == 0 && dim <= 4 * RN_K * 1024 && !((uintptr_t)a & 15) && !((uintptr_t)b & 15) &&
           !((uintptr_t)c2 & 15) && !((uintptr_t)d & 15);
}

static unsigned rn_threads(int dim)
{
    int d4 = dim / 4, t = (d4 + RN_K - 1) / RN_K;
    t = (t + 31) / 32 * 32;
    if (t < 32) t = 32;
    if (t > 1024) t = 1024;
    return (unsigned)t;
}

static void cu_rmsnorm(mr_backend *be, const float *x, const float *w, float *y, int n_rows,
                       int dim, float eps)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n_rows <= 0 || dim <= 0)
        return;
    /* in == out is fine: each thread reads its elements before writing them,
     * and the sum is complete before any write. */
    if (rn_vec_ok(dim, x, w, y, x))
        mr_cu_launch(c, k_rmsnorm4<false, false>, n_rows, rn_threads(dim), 0, (float *)x, nullptr, w, y, dim / 4, eps,
                     nullptr);
    else
        mr_cu_launch(c, k_rmsnorm<false>, n_rows, ROW_THREADS, 0, (float *)x, nullptr, w, y, dim, eps);
    MR_CU_LAUNCHED(c, "rmsnorm");
}

/* out = swiglu(z, rmsnorm(x) * w) of n_rows rows in one launch: the
 * floats of rmsnorm(x, w, out) then swiglu(z, out, out) (the gated norm of
 * a delta-net layer), where k_rmsnorm4 takes the rows; false, with nothing
 * launched, where it does not (the two ops then run).  z may not overlap x
 * or out (a thread reads its z after other rows' outputs may be written);
 * out may be x. */
bool mr_cu_rmsnorm_gate(mr_backend *be, const float *x, const float *w, const float *z, float *out, int n_rows,
                        int dim, float eps)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n_rows <= 0 || dim <= 0 || !rn_vec_ok(dim, x, w, out, z))
        return false;
    mr_cu_launch(c, k_rmsnorm4<false, true>, n_rows, rn_threads(dim), 0, (float *)x, nullptr, w, out, dim / 4, eps,
                 z);
    MR_CU_LAUNCHED(c, "rmsnorm + gate");
    return true;
}

static void cu_add_rmsnorm(mr_backend *be, float *y, const float *x, const float *w, float *out,
                           int n_rows, int dim, float eps)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n_rows <= 0 || dim <= 0)
        return;
    if (rn_vec_ok(dim, y, x, w, out))
        mr_cu_launch(c, k_rmsnorm4<true, false>, n_rows, rn_threads(dim), 0, y, x, w, out, dim / 4, eps, nullptr);
    else
        mr_cu_launch(c, k_rmsnorm<true>, n_rows, ROW_THREADS, 0, y, x, w, out, dim, eps);
    MR_CU_LAUNCHED(c, "add_rmsnorm");
}

/* The rotation of pair j (< n_rot / 2) at position p, as the reference
 * computes it: inv_freq rounded to float32 (rope_inv_freq, which does not
 * depend on p), then p * inv_freq in float32; sin/cos of that angle in
 * double, rounded to float32 (rope_sincos). */
__device__ __forceinline__ float rope_inv_freq(int j, int n_rot, float theta_base)
{
    return (float)(1.0 / pow((double)theta_base, (double)(2 * j) / (double)n_rot));
}

/* The angle's sin and cos from inv = rope_inv_freq(j, ...). */
__device__ __forceinline__ void rope_sincos(int p, float inv, float *s, float *co)
{
    const float ang = (float)p * inv;
    double sd, cd;
    sincos((double)ang, &sd, &cd);
    *s = (float)sd;
    *co = (float)cd;
}

/* Rotates pair j of one head by (s, co): reads the pair from src, writes it
 * to dst (either may be the head itself). */
__device__ __forceinline__ void rope_rotate(const float *src, float *dst, int j, int n_rot, int mode, float s,
                                            float co)
{
    const int half = n_rot / 2;
    const int a = mode == MR_ROPE_NEOX ? j : 2 * j;
    const int b = mode == MR_ROPE_NEOX ? j + half : 2 * j + 1;
    const float x0 = src[a], x1 = src[b];
    dst[a] = x0 * co - x1 * s;
    dst[b] = x0 * s + x1 * co;
}

__device__ __forceinline__ void rope_pair(const float *src, float *dst, int p, int j, int n_rot,
                                          float theta_base, int mode)
{
    float s, co;
    rope_sincos(p, rope_inv_freq(j, n_rot, theta_base), &s, &co);
    rope_rotate(src, dst, j, n_rot, mode, s, co);
}

__global__ void k_rope(float *x, const int32_t *pos, int n_heads, int head_dim, int n_rot,
                       float theta_base, int mode)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    const int t = blockIdx.y;
    const int half = n_rot / 2;
    const int i = blockIdx.x * blockDim.x + threadIdx.x; /* over n_heads * half */
    if (i >= n_heads * half)
        return;
    float *xh = x + ((int64_t)t * n_heads + i / half) * head_dim;
    rope_pair(xh, xh, pos[t], i % half, n_rot, theta_base, mode);
}

static void cu_rope(mr_backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                    int n_rot, float theta_base, enum mr_rope_mode mode)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0)
        return;
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 || n > 65535) {
        mr_cu_fail(c, "rope: bad n_rot %d for head_dim %d (n %d)", n_rot, head_dim, n);
        return;
    }
    const unsigned th = 128;
    dim3 grid(mr_cu_blocks((size_t)n_heads * (n_rot / 2), th), n);
    mr_cu_launch(c, k_rope, grid, th, 0, x, pos, n_heads, head_dim, n_rot, theta_base, (int)mode);
    MR_CU_LAUNCHED(c, "rope");
}

/* qk_norm_rope: a block per (token, `rows` head rows), a warp per row,
 * queries first, then keys (then, with the K/V store, the value rows).  The
 * block first takes the token's sin/cos of every pair into shared memory,
 * in double as rope_pair does: that trigonometry was most of the kernel's
 * time when every (token, head) block did it for itself (39 us for a
 * 512-token prompt of the 30B-A3B, H200 run 87; 16 us with 8 rows a
 * block, run 88), and all heads of a token share it.  A few tokens (decode)
 * take 4 rows a block, one a warp: the step waits on the kernel's latency,
 * not its work.  A row's arithmetic does not depend on its block.  A row is
 * normalised (each lane's elements summed in order, then across the warp;
 * (v * inv) * w as k_rmsnorm), then rotated as k_rope does; four launches a
 * layer become one in decode. */
#define QKR_MAX_D 256
/* head rows a block: 4 warps, two rows each, or one for fewer than 64 tokens */
static inline int qkr_rows(int n) { return n < 64 ? 4 : 8; }

/* Where the fused K/V store writes (DT >= 0): the layer's caches, the block
 * table(s) and the values. */
struct qkr_kv {
    void *K, *V;
    const int32_t *table;
    const int32_t *const *tables;
    const float *v;
    int bt, n_blocks;
};

/* Offset of token t's row in the cache, or -1 where kv_store writes
 * nothing (no table for the token, a negative position, a block outside
 * the pool): the same rules as k_kv_store. */
__device__ __forceinline__ int64_t qkr_slot(const qkr_kv &c, int t, int p, int kvdim)
{
    const int32_t *tab = c.tables ? c.tables[t] : c.table;
    if (!tab || p < 0)
        return -1;
    const int blk = tab[p / c.bt];
    if (blk < 0 || blk >= c.n_blocks)
        return -1;
    return ((int64_t)blk * c.bt + p % c.bt) * kvdim;
}

/* Copies a head row into the warp's hv and returns its sum of squares
 * (each lane's elements in order, then across the warp). */
__device__ __forceinline__ float qkr_load(const float *x, float *hv, int head_dim, int lane)
{
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) {
        const float v = x[i];
        hv[i] = v;
        ss = fmaf(v, v, ss);
    }
    return mr_warp_sum(ss);
}

/* Blocks [0, n_heads) rotate query heads, the next n_kv_heads key heads;
 * with DT >= 0 the key blocks then store their rows into the cache and n_kv_heads more
 * blocks copy the value heads there. */
template <int DT>
__global__ void __launch_bounds__(128) k_qk_norm_rope(float *q, float *k, const float *qw, const float *kw,
                                                      const int32_t *pos, int n_heads, int n_kv_heads,
                                                      int head_dim, int n_rot, float theta_base, int mode,
                                                      float eps, int rows, qkr_kv kv)
{
    __shared__ float sn[QKR_MAX_D / 2], cs[QKR_MAX_D / 2];
    __shared__ float hvs[4][QKR_MAX_D];
    const int t = blockIdx.y, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int kvdim = n_kv_heads * head_dim, half = n_rot / 2;
    const int n_rows = n_heads + n_kv_heads + (DT >= 0 ? n_kv_heads : 0);
    const int hh0 = blockIdx.x * rows + wp, h_end = min((int)(blockIdx.x + 1) * rows, n_rows);
    /* Before the PDL wait, what no kernel of the step writes: the norm
     * weights of the warp's first row (in decode its only one) and this
     * thread's rotation frequency, so neither costs a memory round trip or
     * the double-precision pow after it.  The same values meet the same
     * operations below: the same bits. */
    float w0[QKR_MAX_D / 32];
    const bool has0 = hh0 < h_end && hh0 < n_heads + n_kv_heads;
    if (has0) {
        const float *w = hh0 < n_heads ? qw : kw;
#pragma unroll
        for (int m = 0; m < QKR_MAX_D / 32; m++)
            if (lane + 32 * m < head_dim) w0[m] = w[lane + 32 * m];
    }
    const float inv0 = (int)threadIdx.x < half ? rope_inv_freq(threadIdx.x, n_rot, theta_base) : 0.0f;
    mr_pdl_wait();
    mr_pdl_trigger();
    const int p = pos[t];
    float *hv = hvs[wp];
    /* The warp's first row is loaded and its sum of squares taken before
     * the block's barrier, so that in decode (one row a warp) the row's
     * memory round trip overlaps the sin/cos below instead of following
     * them.  The same loads and sums as in the loop: the same bits. */
    float ss0 = 0.0f;
    if (has0)
        ss0 = qkr_load(hh0 < n_heads ? q + ((int64_t)t * n_heads + hh0) * head_dim
                                     : k + ((int64_t)t * n_kv_heads + (hh0 - n_heads)) * head_dim,
                       hv, head_dim, lane);
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        rope_sincos(p, j == (int)threadIdx.x ? inv0 : rope_inv_freq(j, n_rot, theta_base), &sn[j], &cs[j]);
    __syncthreads();
    for (int hh = hh0; hh < h_end; hh += 4) {
        if constexpr (DT >= 0) {
            if (hh >= n_heads + n_kv_heads) { /* a value head: copied as it is */
                const int vh = hh - n_heads - n_kv_heads;
                const int64_t o = qkr_slot(kv, t, p, kvdim);
                if (o < 0)
                    continue;
                const float *src = kv.v + (int64_t)t * kvdim + (int64_t)vh * head_dim;
                for (int i = lane; i < head_dim; i += 32) mr_kv_put<DT>(kv.V, o + (int64_t)vh * head_dim + i, src[i]);
                continue;
            }
        }
        const bool isq = hh < n_heads;
        float *x = isq ? q + ((int64_t)t * n_heads + hh) * head_dim
                       : k + ((int64_t)t * n_kv_heads + (hh - n_heads)) * head_dim;
        const float *w = isq ? qw : kw;
        const float ss = hh == hh0 ? ss0 : qkr_load(x, hv, head_dim, lane);
        const float inv = 1.0f / sqrtf(ss / (float)head_dim + eps);
#pragma unroll
        for (int m = 0; m < QKR_MAX_D / 32; m++) {
            const int i = lane + 32 * m;
            if (i < head_dim) hv[i] = hv[i] * inv * (hh == hh0 ? w0[m] : w[i]);
        }
        __syncwarp();
        for (int j = lane; j < half; j += 32) rope_rotate(hv, x, j, n_rot, mode, sn[j], cs[j]);
        for (int i = n_rot + lane; i < head_dim; i += 32) x[i] = hv[i];
        __syncwarp(); /* hv is the next row's; x as written is read below */
        if constexpr (DT >= 0) {
            if (isq)
                continue;
            /* the row as written above (the warp's own global writes are
             * visible to it after the warp barrier), stored as kv_store would */
            const int64_t o = qkr_slot(kv, t, p, kvdim);
            if (o < 0)
                continue;
            const int kh = hh - n_heads;
            for (int i = lane; i < head_dim; i += 32) mr_kv_put<DT>(kv.K, o + (int64_t)kh * head_dim + i, x[i]);
        }
    }
}

static bool qkr_shape_ok(mr_cu_ctx *c, int n, int n_heads, int n_kv_heads, int head_dim, int n_rot, int extra)
{
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 || head_dim > QKR_MAX_D || n > 65535 ||
        n_heads + n_kv_heads + extra > 65535) {
        mr_cu_fail(c, "qk_norm_rope: n_rot %d, head_dim %d (max %d), %d tokens", n_rot, head_dim, QKR_MAX_D, n);
        return false;
    }
    return true;
}

static void cu_qk_norm_rope(mr_backend *be, float *q, float *k, const float *qw, const float *kw,
                            const int32_t *pos, int n, int n_heads, int n_kv_heads, int head_dim, int n_rot,
                            float theta_base, enum mr_rope_mode mode, float eps)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || !qkr_shape_ok(c, n, n_heads, n_kv_heads, head_dim, n_rot, 0))
        return;
    const int rows = qkr_rows(n);
    dim3 grid((unsigned)((n_heads + n_kv_heads + rows - 1) / rows), (unsigned)n);
    mr_cu_launch(c, k_qk_norm_rope<-1>, grid, 128, 0, q, k, qw, kw, pos, n_heads, n_kv_heads, head_dim, n_rot,
                 theta_base, (int)mode, eps, rows, qkr_kv{});
    MR_CU_LAUNCHED(c, "qk_norm_rope");
}

void mr_cu_qk_norm_rope_kv(mr_backend *be, float *q, float *k, const float *qw, const float *kw,
                           const int32_t *pos, int n, int n_heads, int n_kv_heads, int head_dim, int n_rot,
                           float theta_base, enum mr_rope_mode mode, float eps, mr_kv_cache *kv, int layer,
                           const int32_t *table, const int32_t *const *tables, const float *v)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || !qkr_shape_ok(c, n, n_heads, n_kv_heads, head_dim, n_rot, n_kv_heads))
        return;
    if (layer < 0 || layer >= kv->n_layers || kv->n_kv_heads != n_kv_heads || kv->head_dim != head_dim) {
        mr_cu_fail(c, "qk_norm_rope + kv_store: layer %d of %d, cache heads %d x %d for %d x %d", layer,
                   kv->n_layers, kv->n_kv_heads, kv->head_dim, n_kv_heads, head_dim);
        return;
    }
    const qkr_kv a = {kv->k[layer], kv->v[layer], table, tables, v, kv->block_tokens, kv->n_blocks};
    const int rows = qkr_rows(n);
    dim3 grid((unsigned)((n_heads + 2 * n_kv_heads + rows - 1) / rows), (unsigned)n);
#define L(DT)                                                                                              \
    mr_cu_launch(c, k_qk_norm_rope<DT>, grid, 128, 0, q, k, qw, kw, pos, n_heads, n_kv_heads, head_dim, n_rot, \
                 theta_base, (int)mode, eps, rows, a)
    if (kv->dtype == MR_KV_F32) L(MR_KV_F32);
    else if (kv->dtype == MR_KV_F16) L(MR_KV_F16);
    else L(MR_KV_BF16);
#undef L
    MR_CU_LAUNCHED(c, "qk_norm_rope + kv_store");
}

__global__ void k_swiglu(const float *g, const float *u, float *o, size_t n)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        o[i] = mr_silu_mul(g[i], u[i]);
    }
}

void mr_cu_swiglu(mr_backend *be, const float *gate, const float *up, float *out, size_t n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (!n)
        return;
    mr_cu_launch(c, k_swiglu, mr_cu_ew_blocks(c, n, 256), 256, 0, gate, up, out, n);
    MR_CU_LAUNCHED(c, "swiglu");
}

__global__ void k_add(float *y, const float *x, size_t n)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

static void cu_add(mr_backend *be, float *y, const float *x, size_t n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (!n)
        return;
    mr_cu_launch(c, k_add, mr_cu_ew_blocks(c, n, 256), 256, 0, y, x, n);
    MR_CU_LAUNCHED(c, "add");
}

/* One warp per token; experts e = lane + 32*i, i < PL (PL * 32 >= the
 * expert count: 4 for 128 experts, 8 for 256).  Ranking by logit (softmax
 * is monotonic), ties to the lower id; weights are the softmax
 * probabilities.  Lane j keeps round j's pick and writes it at the end, so
 * the renormalisation reads no global memory back (k <= 32). */
#define ROUTE_MAX_PER_LANE 16
/* One token's routing by one warp (l: its logits; ids, weights: its k
 * slots). */
template <int PL>
__device__ __forceinline__ void route_warp(const float *l, int lane, int n_expert, int k, bool norm, int32_t *ids,
                                           float *weights)
{
    float v[PL];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PL; i++) {
        int e = lane + 32 * i;
        v[i] = e < n_expert ? l[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = mr_warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; i++)
        if (lane + 32 * i < n_expert) s += expf(v[i] - mx);
    s = mr_warp_sum(s);
    uint32_t taken = 0;
    float wsum = 0.0f, my_p = 0.0f;
    int my_e = 0;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            int e = lane + 32 * i;
            if (e < n_expert && !(taken >> i & 1u) && (v[i] > bv || be == 0x7fffffff)) {
                bv = v[i];
                be = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe != 0x7fffffff && (be == 0x7fffffff || ov > bv || (ov == bv && oe < be))) {
                bv = ov;
                be = oe;
            }
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        float p = expf(bv - mx) / s;
        wsum += p;
        if (lane == j) {
            my_e = be;
            my_p = p;
        }
    }
    if (lane < k) {
        ids[lane] = my_e;
        weights[lane] = norm ? my_p / wsum : my_p;
    }
}

template <int PL>
__global__ void k_moe_route(const float *logits, int n, int n_expert, int k, bool norm,
                            int32_t *ids, float *weights)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n)
        return;
    route_warp<PL>(logits + (int64_t)t * n_expert, threadIdx.x & 31, n_expert, k, norm, ids + (int64_t)t * k,
                   weights + (int64_t)t * k);
}

/* The same routing by ranks (MEMRA_CUDA_ROUTE=rank): a block of 32 * PL
 * threads a token, thread e holding expert e.  route_warp takes k rounds of
 * a warp-wide argmax, each a chain of shuffles (the kernel's own time was
 * ~2.9 us of the 30B-A3B's decode step, ncu run 103); here every expert
 * counts the experts ahead of it at once, (a larger logit, or an equal one
 * with a lower id: the order route_warp picks in), and the one ranked j is
 * route_warp's pick of round j.  The sums are route_warp's: the max is exact
 * in any order, each expf(v - max) is the same expression, lane l of warp 0
 * adds experts l, l + 32, ... in that order and then across the warp, a
 * pick's probability is that term over the sum, the renormalisation adds
 * the picks in rank order.  So the ids and weights are route_warp's bit for
 * bit.  A row with a NaN logit (where the warp's comparisons are not an
 * order) goes to route_warp in warp 0. */
template <int PL>
__global__ void __launch_bounds__(32 * PL) k_moe_route_rank(const float *logits, int n_expert, int k, bool norm,
                                                            int32_t *ids, float *weights)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    __shared__ __align__(16) float sv[32 * PL];
    __shared__ float sx[32 * PL], sp[32], wmax[PL];
    __shared__ int se[32];
    __shared__ float sS, sW;
    __shared__ int has_nan;
    const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, w = e >> 5;
    const float *l = logits + (int64_t)t * n_expert;
    int32_t *it = ids + (int64_t)t * k;
    float *wt = weights + (int64_t)t * k;
    const float v = e < n_expert ? l[e] : -INFINITY;
    if (e == 0) has_nan = 0;
    sv[e] = v;
    __syncthreads();
    if (v != v) has_nan = 1;
    const float m = mr_warp_max(v);
    if (lane == 0) wmax[w] = m;
    __syncthreads();
    if (has_nan) {
        if (w == 0) route_warp<PL>(l, lane, n_expert, k, norm, it, wt);
        return;
    }
    float mx = wmax[0];
#pragma unroll
    for (int i = 1; i < PL; i++) mx = fmaxf(mx, wmax[i]);
    const float ex = e < n_expert ? expf(v - mx) : 0.0f; /* this expert's softmax term */
    sx[e] = ex;
    __syncthreads();
    if (w == 0) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < PL; i++)
            if (lane + 32 * i < n_expert) s += sx[lane + 32 * i];
        s = mr_warp_sum(s);
        if (lane == 0) sS = s;
    }
    /* rank: the experts ahead of e (the fillers past n_expert are -inf with
     * higher ids: never ahead of a real expert, and not ranked themselves) */
    int r = 0;
    if (e < n_expert) {
        const float4 *s4 = (const float4 *)sv;
#pragma unroll 4
        for (int j = 0; j < 8 * PL; j++) {
            const float4 o = s4[j];
            const int b = 4 * j;
            r += (o.x > v || (o.x == v && b < e)) + (o.y > v || (o.y == v && b + 1 < e)) +
                 (o.z > v || (o.z == v && b + 2 < e)) + (o.w > v || (o.w == v && b + 3 < e));
        }
    }
    __syncthreads();
    if (e < n_expert && r < k) {
        sp[r] = ex / sS;
        se[r] = e;
    }
    __syncthreads();
    if (e == 0) {
        float ws = 0.0f;
        for (int j = 0; j < k; j++) ws += sp[j];
        sW = ws;
    }
    __syncthreads();
    if (e < k) {
        it[e] = se[e];
        wt[e] = norm ? sp[e] / sW : sp[e];
    }
}

/* The rank kernel (a block of 32 * PL threads a token; the default since
 * run 109, docs/GPU-NOTES.md 57) or the warp kernel (4 tokens a block,
 * MEMRA_CUDA_ROUTE=warp): the same ids and weights. */
template <int PL>
static void route_launch(mr_cu_ctx *c, const float *logits, int n, int n_expert, int k, bool norm_topk, int32_t *ids,
                         float *weights)
{
    if (c->route_rank) {
        mr_cu_launch(c, k_moe_route_rank<PL>, dim3(n), 32 * PL, 0, logits, n_expert, k, norm_topk, ids, weights);
        return;
    }
    const int wpb = 4;
    mr_cu_launch(c, k_moe_route<PL>, mr_cu_blocks((size_t)n, wpb), wpb * 32, 0, logits, n, n_expert, k, norm_topk, ids,
                 weights);
}

static void cu_moe_route(mr_backend *be, const float *logits, int n, int n_expert, int k,
                         bool norm_topk, int32_t *ids, float *weights)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0)
        return;
    if (n_expert <= 0 || n_expert > 32 * ROUTE_MAX_PER_LANE || k <= 0 || k > n_expert || k > 32) {
        mr_cu_fail(c, "moe_route: %d experts, k %d (at most %d experts and 32 a token)", n_expert, k,
                   32 * ROUTE_MAX_PER_LANE);
        return;
    }
    /* experts a lane (PL): 4 up to 128, 8 up to 256, else 16 */
    const int pl = n_expert <= 32 * 4 ? 4 : n_expert <= 32 * 8 ? 8 : ROUTE_MAX_PER_LANE;
    if (pl == 4) route_launch<4>(c, logits, n, n_expert, k, norm_topk, ids, weights);
    else if (pl == 8) route_launch<8>(c, logits, n, n_expert, k, norm_topk, ids, weights);
    else route_launch<ROUTE_MAX_PER_LANE>(c, logits, n, n_expert, k, norm_topk, ids, weights);
    MR_CU_LAUNCHED(c, c->route_rank ? "moe_route (ranks)" : "moe_route");
}

__global__ void k_moe_combine(const float *y, const float *w, int k, int rows, float *out)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    const int t = blockIdx.y;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s = fmaf(w[t * k + j], y[((int64_t)t * k + j) * rows + r], s);
    out[(int64_t)t * rows + r] = s;
}

static void cu_moe_combine(mr_backend *be, const float *y, const float *weights, int n, int k,
                           int rows, float *out)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || rows <= 0)
        return;
    if (n > 65535) {
        mr_cu_fail(c, "moe_combine: %d tokens (max 65535)", n);
        return;
    }
    dim3 grid(mr_cu_blocks((size_t)rows, 256), n);
    mr_cu_launch(c, k_moe_combine, grid, 256, 0, y, weights, k, rows, out);
    MR_CU_LAUNCHED(c, "moe_combine");
}

/* The end of a mixture layer in one launch (mr_cu_moe_tail): a block a
 * token, a thread per float4 of the row (the combine's k loads of a thread
 * issued together, so the expert outputs are one round of loads).  Each
 * element goes through what k_moe_combine, k_sigmoid_mul, k_add and
 * k_rmsnorm4<true> do to it, in their order: the combine's fmaf chain over
 * the k experts from 0, times the sigmoid of the token's gate, the two
 * adds.  The new residual row is staged in shared memory, and the first
 * NT threads (k_rmsnorm4's block: NT = rn_threads(dim)) form the sum of
 * squares exactly as its threads do (thread t's chunks t, t + NT, ... in
 * one fmaf chain, the warp sums, then the NT / 32 partials in order).  So
 * every output has the bits of the four launches (kernel-check part tail).
 * XQ (MR_TYPE_Q4_K or MR_TYPE_IQ4_XS; 0: none): the output row is staged
 * in shared memory again and its 256-column blocks, a warp each, written to
 * xq as the interleaved operand of the dense decode products after the
 * layer's end (cu_xmp.cuh xmd_il_block, the bytes k_xmd_quant_il makes of
 * out), so that the product's own quantization launch drops out of the
 * step's chain. */
#define TAIL_J 8 /* expert loads a thread issues at once */
template <bool SH, int XQ>
__global__ void __launch_bounds__(1024) k_moe_tail(const float *y, const float *cw, int k, int dim4, int NT,
                                                   float *proj, float *sh, const float *g, int gs, float *xres,
                                                   const float *w, float *out, float eps, uint8_t *xq)
{
    __shared__ float4 av[1024];
    __shared__ float red[32];
    const int i = threadIdx.x;
    float4 gw = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < dim4) gw = ((const float4 *)w)[i]; /* a weight: before the PDL wait, as k_rmsnorm4 */
    mr_pdl_wait();
    mr_pdl_trigger();
    const int64_t t = blockIdx.x, dim = (int64_t)dim4 * 4;
    if (i < dim4) {
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j0 = 0; j0 < k; j0 += TAIL_J) {
            float4 e[TAIL_J];
            float wj[TAIL_J];
#pragma unroll
            for (int u = 0; u < TAIL_J; u++)
                if (j0 + u < k) {
                    wj[u] = cw[t * k + j0 + u];
                    e[u] = ((const float4 *)(y + (t * k + j0 + u) * dim))[i];
                }
#pragma unroll
            for (int u = 0; u < TAIL_J; u++)
                if (j0 + u < k) {
                    s.x = fmaf(wj[u], e[u].x, s.x);
                    s.y = fmaf(wj[u], e[u].y, s.y);
                    s.z = fmaf(wj[u], e[u].z, s.z);
                    s.w = fmaf(wj[u], e[u].w, s.w);
                }
        }
        if constexpr (SH) {
            const float sig = mr_sigmoidf(g[t * gs]);
            float4 h = ((float4 *)(sh + t * dim))[i];
            h.x *= sig; h.y *= sig; h.z *= sig; h.w *= sig;
            ((float4 *)(sh + t * dim))[i] = h;
            s.x += h.x; s.y += h.y; s.z += h.z; s.w += h.w;
        }
        ((float4 *)(proj + t * dim))[i] = s;
        float4 a = ((float4 *)(xres + t * dim))[i];
        a.x += s.x; a.y += s.y; a.z += s.z; a.w += s.w;
        ((float4 *)(xres + t * dim))[i] = a;
        av[i] = a;
    }
    __syncthreads();
    if (i < NT) { /* k_rmsnorm4's sum of squares, its threads' order */
        float ss = 0.0f;
        for (int c = i; c < dim4; c += NT) {
            const float4 a = av[c];
            ss = fmaf(a.x, a.x, fmaf(a.y, a.y, fmaf(a.z, a.z, fmaf(a.w, a.w, ss))));
        }
        ss = mr_warp_sum(ss);
        if ((i & 31) == 0) red[i >> 5] = ss;
    }
    __syncthreads();
    float ss = 0.0f;
    for (int q = 0; q < NT / 32; q++) ss += red[q];
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    if (i < dim4) {
        const float4 v = av[i];
        const float4 o = make_float4(v.x * inv * gw.x, v.y * inv * gw.y, v.z * inv * gw.z, v.w * inv * gw.w);
        ((float4 *)(out + t * dim))[i] = o;
        if constexpr (XQ != 0)
            av[i] = o; /* only this thread reads av[i] above */
    }
    if constexpr (XQ != 0) {
        __shared__ __align__(16) uint8_t stage[32][xmp_blk<XQ, XMD_PL>()];
        __syncthreads();
        const int lane = i & 31, warp = i >> 5, nsb = dim4 / 64;
        for (int b = warp; b < nsb; b += (int)(blockDim.x >> 5)) {
            const float4 p = av[64 * b + 2 * lane], q = av[64 * b + 2 * lane + 1];
            const float v8[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
            xmd_il_block<XQ>(v8, stage[warp], xq, nsb, (int)t, b, lane);
        }
    }
}

template <bool SH>
static void moe_tail_launch(mr_cu_ctx *c, int n, int th, const float *y, const float *cw, int k, int dim4, int nt,
                            float *proj, float *sh, const float *g, int gs, float *xres, const float *w, float *out,
                            float eps, uint8_t *xq, int xq_type)
{
    if (!xq)
        mr_cu_launch(c, k_moe_tail<SH, 0>, n, th, 0, y, cw, k, dim4, nt, proj, sh, g, gs, xres, w, out, eps, xq);
    else if (xq_type == MR_TYPE_IQ4_XS)
        mr_cu_launch(c, k_moe_tail<SH, MR_TYPE_IQ4_XS>, n, th, 0, y, cw, k, dim4, nt, proj, sh, g, gs, xres, w, out,
                     eps, xq);
    else
        mr_cu_launch(c, k_moe_tail<SH, MR_TYPE_Q4_K>, n, th, 0, y, cw, k, dim4, nt, proj, sh, g, gs, xres, w, out,
                     eps, xq);
}

bool mr_cu_moe_tail(mr_backend *be, const float *y, const float *cw, int n, int k, int dim, float *proj, float *sh,
                    const float *g, int gs, float *xres, const float *w, float *out, float eps, uint8_t *xq,
                    int xq_type)
{
    mr_cu_ctx *c = mr_cu(be);
    /* a thread a float4 (whole warps: never fewer than the norm's
     * rn_threads(dim), which takes RN_K of them a thread); the operand's
     * blocks are whole 256-column blocks of the row */
    if (c->failed || n <= 0 || n > 65535 || k <= 0 || dim % 4 || dim / 4 > 1024 ||
        !rn_vec_ok(dim, y, proj, xres, out) || !rn_vec_ok(dim, w, sh ? sh : proj, proj, proj) ||
        (xq && (dim % 256 || (xq_type != MR_TYPE_Q4_K && xq_type != MR_TYPE_IQ4_XS))))
        return false;
    const int nt = (int)rn_threads(dim), th = (dim / 4 + 31) / 32 * 32;
    if (sh)
        moe_tail_launch<true>(c, n, th, y, cw, k, dim / 4, nt, proj, sh, g, gs, xres, w, out, eps, xq, xq_type);
    else
        moe_tail_launch<false>(c, n, th, y, cw, k, dim / 4, nt, proj, sh, g, gs, xres, w, out, eps, xq, xq_type);
    MR_CU_LAUNCHED(c, xq ? "moe tail + add_rmsnorm + xmd input" : "moe tail + add_rmsnorm");
    return true;
}

/* argmax: one block of AM_THREADS per row.  The order is total, so the
 * winner does not depend on which thread saw what: the larger number wins,
 * a number beats NaN, and equal values (or two NaNs) go to the lower
 * index.  Each thread keeps AM_U loads of 16 bytes in flight (a row of
 * 151,936 logits is ~9 rounds): one thread a float at a time made the
 * 608 KB row a chain of dependent loads, ~240 us a call (run 68, ncu). */
#define AM_THREADS 1024
#define AM_U 4
#define AM_NONE 0x7fffffff

/* whether (v, i) beats (bv, bi) */
__device__ __forceinline__ bool am_beats(float v, int i, float bv, int bi)
{
    if (i == AM_NONE)
        return false;
    if (bi == AM_NONE)
        return true;
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn)
        return vn && bn ? i < bi : bn;
    return v > bv || (v == bv && i < bi);
}

/* (bv, bi) <- the best of the warp's lanes, in every lane */
__device__ __forceinline__ void am_warp_best(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_beats(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

__global__ void __launch_bounds__(AM_THREADS) k_argmax(const float *x, int dim, int32_t *ids)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    const float *r = x + (int64_t)blockIdx.x * dim;
    const int tid = threadIdx.x;
    float bv = -INFINITY;
    int bi = AM_NONE;
    if (dim % 4 == 0 && ((uintptr_t)x & 15) == 0) { /* every row 16-byte aligned */
        const float4 *r4 = (const float4 *)r;
        const int n4 = dim / 4;
        for (int j0 = tid; j0 < n4; j0 += AM_U * AM_THREADS) {
            float4 q[AM_U];
#pragma unroll
            for (int u = 0; u < AM_U; u++)
                if (j0 + u * AM_THREADS < n4) q[u] = r4[j0 + u * AM_THREADS];
#pragma unroll
            for (int u = 0; u < AM_U; u++) {
                const int j = j0 + u * AM_THREADS;
                if (j < n4) {
                    const float e[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        if (am_beats(e[c], 4 * j + c, bv, bi)) {
                            bv = e[c];
                            bi = 4 * j + c;
                        }
                }
            }
        }
    } else {
        for (int i0 = tid; i0 < dim; i0 += AM_U * AM_THREADS) {
            float q[AM_U];
#pragma unroll
            for (int u = 0; u < AM_U; u++)
                if (i0 + u * AM_THREADS < dim) q[u] = r[i0 + u * AM_THREADS];
#pragma unroll
            for (int u = 0; u < AM_U; u++) {
                const int i = i0 + u * AM_THREADS;
                if (i < dim && am_beats(q[u], i, bv, bi)) {
                    bv = q[u];
                    bi = i;
                }
            }
        }
    }
    am_warp_best(bv, bi);
    const int lane = tid & 31, w = tid >> 5;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        bv = sv[lane];
        bi = si[lane];
        am_warp_best(bv, bi);
        if (lane == 0)
            ids[blockIdx.x] = bi == AM_NONE ? 0 : bi;
    }
}

static void cu_argmax(mr_backend *be, const float *x, int n, int dim, int32_t *ids)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0 || dim <= 0)
        return;
    mr_cu_launch(c, k_argmax, n, AM_THREADS, 0, x, dim, ids);
    MR_CU_LAUNCHED(c, "argmax");
}

void mr_cu_install_ops(mr_backend *be)
{
    be->rmsnorm = cu_rmsnorm;
    be->add_rmsnorm = cu_add_rmsnorm;
    be->rope = cu_rope;
    be->qk_norm_rope = cu_qk_norm_rope;
    be->swiglu = mr_cu_swiglu;
    be->add = cu_add;
    be->moe_route = cu_moe_route;
    be->moe_combine = cu_moe_combine;
    be->argmax = cu_argmax;
}

/* CPU reference backend: internal helpers shared by its files.  The ops are
 * plain float32 C; each file holds one concern (memory, elementwise, matmul,
 * attention, MoE). */
#ifndef MR_KERNELS_CPU_H
#define MR_KERNELS_CPU_H

#include <math.h>

#include "kernels/ops.h"

typedef struct mr_cpu_ctx {
    int failed;        /* an op hit an error since the last sync */
    mr_err first;      /* that error */
    int gdn_chunk;     /* > 1: gdn_scan runs the chunked form (MEMRA_CPU_GDN_CHUNK) */
} mr_cpu_ctx;

/* Records an op failure; only the first one since the last sync is kept. */
void mr_cpu_fail(mr_backend *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* sum_i a[i] * b[i], accumulated in double so that the result does not
 * depend on how many tokens a call processes. */
static inline float mr_cpu_dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return (float)s;
}

/* Scalar helpers of the Gated DeltaNet ops (cpu_gdn.c, cpu_gdn_chunk.c);
 * both scan forms must use exactly these. */
static inline float mr_cpu_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
/* softplus as torch computes it: x above 20 is returned unchanged. */
static inline double mr_cpu_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
/* dst = src / sqrt(|src|^2 + eps) * mul */
static inline void mr_cpu_l2norm(const float *src, float *dst, int d, float eps, double mul)
{
    double ss = 0.0;
    for (int i = 0; i < d; i++)
        ss += (double)src[i] * src[i];
    double inv = 1.0 / sqrt(ss + (double)eps) * mul;
    for (int i = 0; i < d; i++)
        dst[i] = (float)(src[i] * inv);
}

/* Dequantizes row r of matrix m of w into dst (w->cols floats); on failure
 * records it, fills zeros and returns -1. */
int mr_cpu_weight_row(mr_backend *be, const mr_weight *w, int64_t m, int64_t r, float *dst);

/* Op entry points, installed by mr_backend_cpu_create. */
void mr_cpu_get_rows(mr_backend *be, const mr_weight *w, const int32_t *ids, int n, float *out);
void mr_cpu_matmul(mr_backend *be, const mr_weight *w, const float *x, float *y, int n);
void mr_cpu_matmul_id(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                      const int32_t *ids, int k, float *y, int n);
void mr_cpu_rmsnorm(mr_backend *be, const float *x, const float *w, float *y, int n_rows, int dim,
                    float eps);
void mr_cpu_rope(mr_backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                 int n_rot, float theta_base, enum mr_rope_mode mode);
void mr_cpu_kv_store(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *block_table,
                     const float *k, const float *v, const int32_t *pos, int n);
void mr_cpu_attention(mr_backend *be, const mr_kv_cache *kv, int layer, const int32_t *block_table,
                      const float *q, const int32_t *pos, int n, int n_heads, float scale,
                      float *out);
/* Multi-sequence forms (ops.h): token by token through the ops above, each
 * with its own table; a NULL table skips the token. */
void mr_cpu_kv_store_multi(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *const *tables,
                           const float *k, const float *v, const int32_t *pos, int n);
void mr_cpu_attention_multi(mr_backend *be, const mr_kv_cache *kv, int layer,
                            const int32_t *const *tables, const float *q, const int32_t *pos, int n,
                            int n_heads, float scale, float *out);
void mr_cpu_swiglu(mr_backend *be, const float *gate, const float *up, float *out, size_t n);
void mr_cpu_add(mr_backend *be, float *y, const float *x, size_t n);
void mr_cpu_moe_route(mr_backend *be, const float *logits, int n, int n_expert, int k,
                      bool norm_topk, int32_t *ids, float *weights);
void mr_cpu_moe_combine(mr_backend *be, const float *y, const float *weights, int n, int k,
                        int rows, float *out);
void mr_cpu_argmax(mr_backend *be, const float *x, int n, int dim, int32_t *ids);
/* hybrid (Gated DeltaNet) ops: cpu_gdn.c */
void mr_cpu_copy_2d(mr_backend *be, float *dst, int dst_stride, const float *src, int src_stride,
                    int n_rows, int dim);
void mr_cpu_sigmoid_mul(mr_backend *be, float *y, const float *g, int n_rows, int dim, int g_stride,
                        bool g_scalar);
void mr_cpu_conv1d_silu(mr_backend *be, const float *x, const float *w, float *state, int n,
                        int channels, int k, float *y);
void mr_cpu_gdn_scan(mr_backend *be, const float *qkv, int stride, const float *alpha,
                     const float *beta, const float *a, const float *dt_bias, float *state, int n,
                     int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out);
/* cpu_gdn_chunk.c: the same scan in chunks of `chunk` tokens (parallel form
 * within a chunk, recurrent form for the tail); same state layout.  Not
 * bit-identical to mr_cpu_gdn_scan (docs/NUMERICS.md), so off by default. */
void mr_cpu_gdn_scan_chunked(mr_backend *be, const float *qkv, int stride, const float *alpha,
                             const float *beta, const float *a, const float *dt_bias, float *state,
                             int n, int n_k_heads, int n_v_heads, int dk, int dv, float eps, int chunk,
                             float *out);
void mr_cpu_gdn_scan_opt(mr_backend *be, const float *qkv, int stride, const float *alpha,
                         const float *beta, const float *a, const float *dt_bias, float *state, int n,
                         int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out);

#endif

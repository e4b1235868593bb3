/* The op interface: everything a forward pass needs, implemented once as a
 * plain float32 CPU reference (kernels/cpu/) and once per GPU backend
 * (kernels/cuda/).  A forward pass is written against this table only.
 *
 * Conventions
 * - Every pointer an op takes lives in the backend's memory (host memory for
 *   the CPU backend, device memory for CUDA); allocate with be->alloc and
 *   move bytes with be->upload / be->download.
 * - Activations are float32, row-major, one row per token.
 * - Token positions, token ids and expert ids are int32 in backend memory,
 *   so a GPU decode step can be captured once and replayed (the host only
 *   writes the next id and position, and reads back sampled ids).
 * - Ops enqueue work and do not report errors one by one: a backend keeps
 *   the first failure and returns it from be->sync.
 * - Optional ops (fused variants) may be NULL; callers then use the unfused
 *   sequence, which must give the same result within the op's tolerance.
 */
#ifndef MR_OPS_H
#define MR_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"

typedef struct mr_backend mr_backend;

/* One row of the sample op (backend memory, written by the host before the
 * step): a request's sampling parameters as worker/sample.h defines them,
 * its uniform, and what its penalty table gains this step.
 *
 * A penalty table (mr_sample_table_ints(dim) int32 in backend memory, owned by
 * one request at a time) remembers the ids a request has seen, so that a
 * long prompt is sent once, not every step: entry[id] = 2 * (times id was
 * generated) + (1 if id is in the prompt), then a list of the ids whose entry
 * is not 0, then that list's length.  reset empties it (a request that just
 * took it); then add[add_off ..) gives n_add_prompt prompt ids and
 * n_add_gen generated ids, repeats allowed, in any number of steps. */
typedef struct mr_sample_row {
    double u;                   /* in (0, 1), the request's own draw (mr_rng_uniform): the inverse-CDF point */
    float temperature;          /* <= 0: greedy (after the penalties) */
    float top_p, min_p;
    float presence, frequency, repetition;
    int32_t top_k;
    int32_t skip;               /* 1: not sampled here (its logits go to the host untouched) */
    int32_t reset;              /* 1: empty the table first */
    int32_t add_off, n_add_prompt, n_add_gen;
    int32_t *table;             /* NULL: no penalties */
} mr_sample_row;

static inline size_t mr_sample_table_ints(int dim) { return 2 * (size_t)dim + 1; }

/* A weight matrix, or a stack of n_mats matrices (MoE experts), in the GGUF
 * block layout.  Shape as GGUF writes it: cols = ne[0] (input features, the
 * contiguous dimension), rows = ne[1] (output features), n_mats = ne[2]. */
typedef struct mr_weight {
    const char *name;
    int type;              /* enum mr_type */
    int64_t cols, rows, n_mats;
    size_t row_bytes;      /* mr_row_size(type, cols) */
    const void *data;      /* backend memory: the GGUF bytes */
    void *priv;            /* backend-owned extra layout (repacked copy), or NULL */
} mr_weight;

enum mr_rope_mode {
    MR_ROPE_NORM = 0, /* rotate pairs (2i, 2i+1) */
    MR_ROPE_NEOX = 2, /* rotate pairs (i, i + n_rot/2): Qwen, GPT-NeoX */
};

/* Paged KV cache, one pool for all sequences: per layer, K and V blocks of
 * block_tokens tokens, each token n_kv_heads * head_dim values.  A sequence
 * owns a block table (int32 block ids in backend memory); position p lives
 * in block table[p / block_tokens], slot p % block_tokens. */
typedef enum mr_kv_dtype {
    MR_KV_AUTO = 0, /* a request only (zeroed options): the backend's kv_default; never a cache's */
    MR_KV_F32 = 1,
    MR_KV_F16 = 2,
    MR_KV_BF16 = 3
} mr_kv_dtype;

typedef struct mr_kv_cache {
    int n_layers;
    int n_blocks;
    int block_tokens;
    int n_kv_heads;
    int head_dim;
    mr_kv_dtype dtype;
    void **k;              /* [n_layers] -> block storage in backend memory */
    void **v;
} mr_kv_cache;

struct mr_backend {
    const char *name;      /* "cpu", "cuda" */
    void *ctx;             /* backend state */
    /* the K/V element type a model gets when it asks for MR_KV_AUTO (its
     * options' zero): the CPU backend's only one (float32); float16 on CUDA
     * (half the bytes a position, twice the tokens in the pool) */
    mr_kv_dtype kv_default;
    /* matmul and matmul_id calls of this many rows or more may round
     * differently from smaller ones (CUDA: float16 tensor-core GEMMs from
     * MR_CU_GEMM_MIN_TOKENS rows); 0: a row's result never depends on how
     * many rows share the call.  The forward pass keeps a step's generated
     * rows in smaller products (and its prompt rows in matmul_prompt), so
     * that greedy decoding gives the same tokens alone or in any batch. */
    int batch_variant_rows;

    /* ---- memory ---- */
    void *(*alloc)(mr_backend *be, size_t bytes); /* NULL on failure */
    void (*free)(mr_backend *be, void *p);
    int (*upload)(mr_backend *be, void *dst, const void *src, size_t n, mr_err *err);
    int (*download)(mr_backend *be, void *dst, const void *src, size_t n, mr_err *err);
    /* Waits for queued work; returns the first error any op hit. */
    int (*sync)(mr_backend *be, mr_err *err);
    /* Makes w usable by this backend from host bytes (w->type/shape set by
     * the caller).  CPU: w->data = host (no copy).  GPU: copy, maybe repack. */
    int (*weight_load)(mr_backend *be, mr_weight *w, const void *host, mr_err *err);
    void (*weight_release)(mr_backend *be, mr_weight *w);
    int (*kv_create)(mr_backend *be, mr_kv_cache *kv, mr_err *err); /* fields set by caller */
    void (*kv_destroy)(mr_backend *be, mr_kv_cache *kv);
    void (*destroy)(mr_backend *be);

    /* ---- ops ---- */
    /* out[t][:] = dequantized row ids[t] of w (embedding lookup). */
    void (*get_rows)(mr_backend *be, const mr_weight *w, const int32_t *ids, int n, float *out);

    /* y[t][r] = sum_c W[r][c] * x[t][c] for t < n. */
    void (*matmul)(mr_backend *be, const mr_weight *w, const float *x, float *y, int n);

    /* Expert matmul: y[t][j][r] = sum_c W[ids[t][j]][r][c] * x[t][xs ? j : 0][c]
     * for t < n, j < k; x has x_slots (1 or k) rows per token. */
    void (*matmul_id)(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                      const int32_t *ids, int k, float *y, int n);

    /* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of dim; y may be x. */
    void (*rmsnorm)(mr_backend *be, const float *x, const float *w, float *y, int n_rows,
                    int dim, float eps);

    /* In place on x[t][h][head_dim] for the first n_rot dims of each head,
     * angle pos[t] * theta_base^(-2i/n_rot). */
    void (*rope)(mr_backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                 int n_rot, float theta_base, enum mr_rope_mode mode);

    /* Writes k[t], v[t] ([n_kv_heads * head_dim] each) at position pos[t] of
     * the sequence whose block table is given. */
    void (*kv_store)(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *block_table,
                     const float *k, const float *v, const int32_t *pos, int n);

    /* Causal GQA attention for n tokens of one sequence: token t (query
     * q[t][n_heads * head_dim]) attends to positions 0..pos[t] of the cache.
     * Query head h reads kv head h / (n_heads / n_kv_heads).  out like q. */
    void (*attention)(mr_backend *be, const mr_kv_cache *kv, int layer,
                      const int32_t *block_table, const float *q, const int32_t *pos, int n,
                      int n_heads, float scale, float *out);

    /* out[i] = silu(gate[i]) * up[i]. out may alias either input. */
    void (*swiglu)(mr_backend *be, const float *gate, const float *up, float *out, size_t n);

    /* y[i] += x[i]. */
    void (*add)(mr_backend *be, float *y, const float *x, size_t n);

    /* MoE routing from router logits [n][n_expert]: softmax over all experts,
     * the k largest (ties: lower id first), weights renormalised to sum 1 when
     * norm_topk.  ids [n][k] int32, weights [n][k] float32. */
    void (*moe_route)(mr_backend *be, const float *logits, int n, int n_expert, int k,
                      bool norm_topk, int32_t *ids, float *weights);

    /* out[t][r] = sum_j weights[t][j] * y[t][j][r]. */
    void (*moe_combine)(mr_backend *be, const float *y, const float *weights, int n, int k,
                        int rows, float *out);

    /* ids[t] = argmax of x[t][0..dim) (lowest index wins ties). */
    void (*argmax)(mr_backend *be, const float *x, int n, int dim, int32_t *ids);

    /* ---- optional (NULL where absent, e.g. on the CPU) ---- */
    /* CUDA graphs: between graph_begin and graph_end the ops are recorded,
     * not run; graph_launch replays them on the same buffers (whose contents,
     * e.g. the next token id and position, the host may change in between
     * with upload).  No upload/download/sync inside a capture; run the step
     * once before capturing so scratch buffers are already sized. */
    int (*graph_begin)(mr_backend *be, mr_err *err);
    int (*graph_end)(mr_backend *be, void **graph, mr_err *err);
    int (*graph_launch)(mr_backend *be, void *graph, mr_err *err);
    void (*graph_destroy)(mr_backend *be, void *graph);

    /* Sampling where the logits are: for each row r < n of logits [n][dim]
     * not marked skip, updates its penalty table, applies the penalties to
     * the row in place and writes the id worker/sample.h's mr_sample would
     * pick with rows[r] and the draw u to ids[r] (greedy: the largest
     * penalised logit, lowest id on ties; else temperature, top_k, min_p,
     * top_p, then the first survivor in id order whose cumulative weight
     * exceeds u * total).  rows and add (the ids rows name by add_off) are in
     * backend memory, so a captured step replays with new ones.  Weights
     * are float64 as on the host; only the order of their sums differs,
     * which can move a pick that lies within about 1e-10 * total of a
     * boundary.  NULL: the host samples (the CPU backend). */
    void (*sample)(mr_backend *be, float *logits, int n, int dim, const mr_sample_row *rows,
                   const int32_t *add, int32_t *ids);

    /* Fused residual add + RMSNorm: y[i] += x[i] for the n_rows x dim rows,
     * then out = rmsnorm(y) * w (as add then rmsnorm). */
    void (*add_rmsnorm)(mr_backend *be, float *y, const float *x, const float *w, float *out,
                        int n_rows, int dim, float eps);

    /* Qwen3's per-head normalisation of queries and keys, then RoPE, in one
     * call: as rmsnorm(q, qw) over n * n_heads rows of head_dim and
     * rmsnorm(k, kw) over n * n_kv_heads rows (in place), then rope on q and
     * on k with the same pos / n_rot / theta_base / mode. */
    void (*qk_norm_rope)(mr_backend *be, float *q, float *k, const float *qw, const float *kw,
                         const int32_t *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                         int n_rot, float theta_base, enum mr_rope_mode mode, float eps);

    /* Several sequences in one call (decode batches): as kv_store and
     * attention, but token t uses the block table tables[t] (tables: n
     * pointers in backend memory); a NULL entry skips that token (nothing
     * stored, its output rows left as they are). */
    void (*kv_store_multi)(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *const *tables,
                           const float *k, const float *v, const int32_t *pos, int n);
    void (*attention_multi)(mr_backend *be, const mr_kv_cache *kv, int layer,
                            const int32_t *const *tables, const float *q, const int32_t *pos, int n,
                            int n_heads, float scale, float *out);

    /* Prompt rows.  The forward pass sends a call's prompt tokens here and
     * its generated tokens (decode steps, speculative verify rows) to
     * matmul, matmul_id and attention / attention_multi, so that a backend
     * whose fastest kernels depend on the call's size can still give each
     * kind one numerics: a prompt row's result may not depend on how many
     * rows share its call or where its prompt was cut into chunks, nor may a
     * generated row's (docs/NUMERICS.md).  Same contracts as the ops they
     * stand for; NULL: those ops serve both kinds (the CPU backend, whose
     * rows never depend on the call).  attention_prompt's pos_first is pos[0]
     * as the host knows it (the rows' positions are pos_first, pos_first +
     * 1, ...): a backend may pick a row's kernel by its position. */
    void (*matmul_prompt)(mr_backend *be, const mr_weight *w, const float *x, float *y, int n);
    void (*matmul_id_prompt)(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                             const int32_t *ids, int k, float *y, int n);
    /* Optional.  A mixture layer's routed experts over prompt rows: for
     * each (token, chosen expert) pair, y = (silu(x Wg^T) * (x Wu^T)) Wd^T
     * (x_slots = 1 in, one row a pair out), as matmul_id_prompt(wg),
     * matmul_id_prompt(wu), swiglu and matmul_id_prompt(wd, x_slots = k)
     * write it, bit for bit.
     * gate and up (n k wg->rows floats each) are the op's scratch: left in
     * any state.  NULL: the caller makes those calls. */
    void (*moe_ffn_prompt)(mr_backend *be, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd,
                           const float *x, const int32_t *ids, int k, float *gate, float *up, float *y, int n);
    void (*attention_prompt)(mr_backend *be, const mr_kv_cache *kv, int layer,
                             const int32_t *block_table, const float *q, const int32_t *pos, int n,
                             int n_heads, float scale, float *out, int pos_first);

    /* Asks for float32 arithmetic on every path, for models whose accuracy
     * needs it (the recurrent hybrids carry rounding from one token to the
     * next); NULL where every path already is float32. */
    void (*prefer_float32)(mr_backend *be);

    /* ---- hybrid (Gated DeltaNet) models: Qwen3.5 / Qwen3.6 ----
     * Required by the qwen35 / qwen35moe forward pass; NULL in a backend
     * that does not run those models (loading one then fails). */

    /* dst[r * dst_stride + i] = src[r * src_stride + i] for r < n_rows,
     * i < dim (e.g. the query half of an interleaved query/gate projection). */
    void (*copy_2d)(mr_backend *be, float *dst, int dst_stride, const float *src, int src_stride,
                    int n_rows, int dim);

    /* y[r][i] *= sigmoid(g[r * g_stride + (g_scalar ? 0 : i)]) for r < n_rows,
     * i < dim; y rows are contiguous.  g_scalar: one gate per row (shared
     * expert gate), else one per element (attention output gate). */
    void (*sigmoid_mul)(mr_backend *be, float *y, const float *g, int n_rows, int dim, int g_stride,
                        bool g_scalar);

    /* Short causal depthwise convolution with carried state, then SiLU, for
     * n consecutive tokens of one sequence:
     *   y[t][c] = silu(sum_j w[c][j] * in(t - (k-1) + j, c)),  j < k
     * where in(p, c) = x[p][c] for p >= 0 and state[k-1+p][c] for p < 0.
     * x, y: [n][channels] (y may not alias x); w: [channels][k] (the GGUF
     * ssm_conv1d layout, tap k-1 multiplies the current token); state:
     * [k-1][channels], the previous k-1 inputs oldest first, owned by the
     * sequence and replaced by the last k-1 inputs (zeros for a new one). */
    void (*conv1d_silu)(mr_backend *be, const float *x, const float *w, float *state, int n,
                        int channels, int k, float *y);

    /* Gated delta rule (Gated DeltaNet core), recurrent form, n consecutive
     * tokens of one sequence.  Token t reads qkv + t * stride:
     *   q [n_k_heads][dk] | k [n_k_heads][dk] | v [n_v_heads][dv]
     * (the conv output); value head h pairs with key head h % n_k_heads (the
     * upstream converter stores value heads in that tiled order).  Per token
     * and value head, with a[h] = -exp(A_log), alpha/beta the raw [n][n_v_heads]
     * projections:
     *   qn = q / sqrt(|q|^2 + eps) / sqrt(dk),  kn = k / sqrt(|k|^2 + eps)
     *   decay = exp(a[h] * softplus(alpha[t][h] + dt_bias[h])),  b = sigmoid(beta[t][h])
     *   S = decay * S;  S += kn (x) (b * (v - S^T kn));  out[t][h] = S^T qn
     * state: [n_v_heads][dk][dv] float32 (S[h][i][j], i over key dims),
     * owned by the sequence, updated in place (zeros for a new one).
     * out: [n][n_v_heads * dv]. */
    void (*gdn_scan)(mr_backend *be, const float *qkv, int stride, const float *alpha,
                     const float *beta, const float *a, const float *dt_bias, float *state, int n,
                     int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out);
};

/* Backends.  name: "cpu", "cuda" or "auto" (cuda when built with it and a
 * device is present, else cpu). */
mr_backend *mr_backend_create(const char *name, mr_err *err);
void mr_backend_destroy(mr_backend *be);
mr_backend *mr_backend_cpu_create(mr_err *err);
/* Defined by kernels/cuda when built with nvcc; otherwise a stub that fails. */
mr_backend *mr_backend_cuda_create(int device, mr_err *err);
bool mr_backend_cuda_available(void);

#endif

/* A loaded model (GGUF -> weights on a backend) and its sequences.
 *
 * Hyperparameters come from the GGUF metadata only; weights are bound
 * through be->weight_load (zero copy on the CPU backend).  A sequence owns
 * a block table in the model's paged KV cache and a length; each forward
 * call appends n tokens at positions len..len+n-1 and returns logits. */
#ifndef MR_MODEL_H
#define MR_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/ops.h"
#include "worker/kv.h"

typedef enum mr_arch {
    MR_ARCH_QWEN3 = 0,
    MR_ARCH_QWEN3MOE = 1,
    MR_ARCH_QWEN35 = 2,    /* Qwen3.5/3.6 dense hybrid (Gated DeltaNet + gated attention) */
    MR_ARCH_QWEN35MOE = 3, /* the same hybrid with MoE and a shared expert */
} mr_arch;

typedef struct mr_hparams {
    mr_arch arch;
    char arch_name[32];    /* general.architecture */
    int n_layers;          /* block_count */
    int n_embd;            /* embedding_length */
    int n_heads, n_kv_heads;
    int head_dim;          /* attention.key_length (= value_length) */
    int n_rot;             /* rope.dimension_count, default head_dim */
    int n_ff;              /* feed_forward_length (dense FFN) */
    int n_expert, n_expert_used, n_ff_exp; /* 0 for dense models */
    bool norm_topk;        /* renormalise the top-k router weights */
    int n_vocab;           /* rows of token_embd */
    int n_ctx_train;       /* context_length */
    float rope_theta;      /* rope.freq_base */
    float rms_eps;         /* attention.layer_norm_rms_epsilon */
    int n_kv_layers;       /* layers with K/V in the paged cache (0: all n_layers) */
    /* Qwen3.5 hybrids only (zero otherwise).  n_layers counts the trunk;
     * the n_nextn MTP blocks stored after it are not run by the forward pass. */
    int n_nextn;           /* nextn_predict_layers */
    int full_attn_interval;/* layer il is full attention when (il + 1) % interval == 0 */
    int ssm_d_conv;        /* ssm.conv_kernel: taps of the short convolution */
    int ssm_d_state;       /* ssm.state_size: key (= value) head dim of the linear layers */
    int ssm_n_group;       /* ssm.group_count: key heads */
    int ssm_dt_rank;       /* ssm.time_step_rank: value heads */
    int ssm_d_inner;       /* ssm.inner_size: value heads * value head dim */
    int n_ff_shexp;        /* expert_shared_feed_forward_length (qwen35moe) */
    int rope_sections[4];  /* rope.dimension_sections (M-RoPE; text positions use one) */
} mr_hparams;

typedef struct mr_model_opts {
    int n_ctx;        /* most tokens one sequence may hold; 0: min(context_length, 4096) */
    int n_seqs;       /* sequences that may hold n_ctx tokens at once; 0: 1 */
    int block_tokens; /* KV block size in tokens; 0: 16 */
    mr_kv_dtype kv_dtype; /* KV element type; 0 (MR_KV_AUTO): the backend's (CPU float32, its only one; CUDA float16) */
    /* KV pool size.  kv_blocks > 0 sets the block count; else kv_bytes > 0
     * sizes the pool from a byte budget (on a GPU: a fraction of the free
     * memory minus a reserve, measured by the caller); else n_seqs * n_ctx. */
    int kv_blocks;
    size_t kv_bytes;
    /* When kv_blocks and kv_bytes are 0 and this is set: called once the
     * weights are bound, it returns the KV byte budget (on a GPU: a fraction
     * of the memory free now, less a reserve); 0 keeps n_seqs * n_ctx. */
    size_t (*kv_budget)(void *ctx, mr_backend *be);
    void *kv_budget_ctx;
} mr_model_opts;

typedef struct mr_model mr_model;
typedef struct mr_seq mr_seq;

typedef enum mr_logits_mode {
    MR_LOGITS_NONE = 0, /* no logits (e.g. a prefill chunk that is not the last) */
    MR_LOGITS_LAST = 1, /* logits of the last token: [vocab] */
    MR_LOGITS_ALL = 2,  /* logits of every token: [n][vocab] */
    /* only the id of the largest logit of the last token (lowest id on
     * ties), found by the backend: one int32 comes back instead of a row
     * (mr_model_forward_batch only, into mr_batch_item.argmax) */
    MR_LOGITS_ARGMAX = 3,
    /* only the id the backend's sample op draws for the last token under
     * mr_batch_item.sample (worker/sample.h's pipeline, on the device): one
     * int32 comes back into mr_batch_item.argmax (mr_model_forward_batch
     * only, where mr_model_can_sample) */
    MR_LOGITS_SAMPLE = 4,
    /* the id of the largest logit of every token, found by the backend:
     * [n] int32 come back into mr_batch_item.argmax instead of [n][vocab]
     * floats (mr_model_forward_batch only; every row's hidden state is left
     * in the scratch as with ALL: speculative verify rows) */
    MR_LOGITS_ARGMAX_ALL = 5,
} mr_logits_mode;

/* Opens path, reads the hyperparameters, binds every weight on be and
 * creates the KV cache.  be stays owned by the caller and must outlive the
 * model.  opts may be NULL. */
int mr_model_load(const char *path, mr_backend *be, const mr_model_opts *opts, mr_model **out,
                  mr_err *err);
void mr_model_free(mr_model *m);
const mr_hparams *mr_model_hparams(const mr_model *m);
/* Tokens a sequence may hold (opts.n_ctx after defaults). */
int mr_model_n_ctx(const mr_model *m);

/* One forward of n_tokens prompt tokens (at most the context) on a sequence
 * made and freed for it, after carving the activation buffers for out_rows
 * rows of logits: a server calls it at start with its largest step, so the
 * backend's buffers for that step are allocated then, and a card without
 * the memory for them fails at start instead of in a running request. */
int mr_model_warmup(mr_model *m, int n_tokens, int out_rows, mr_err *err);

/* A new empty sequence; fails when the KV cache cannot hold another one. */
int mr_seq_new(mr_model *m, mr_seq **out, mr_err *err);
/* Releases its KV blocks. */
void mr_seq_free(mr_seq *s);
int mr_seq_len(const mr_seq *s);

/* Recurrent state (hybrid models: per linear-attention layer, the
 * convolution history and the delta-rule state), which unlike the KV cache
 * is not addressable by position: a snapshot taken after position p is what
 * a prefix cache or a rejected speculation must restore.  0 bytes for
 * attention-only models.  save/load copy it to/from host memory. */
size_t mr_seq_state_bytes(const mr_model *m);
int mr_seq_state_save(const mr_seq *s, void *host, mr_err *err);
int mr_seq_state_load(mr_seq *s, const void *host, mr_err *err);
/* The same into / from backend memory (a state from mr_model_state_alloc,
 * below): queued on the backend in order with forward calls, no host round
 * trip (a speculative step's snapshot).  No-ops without recurrent state. */
void mr_seq_state_copy_out(const mr_seq *s, void *state);
void mr_seq_state_copy_in(mr_seq *s, const void *state);

/* Checkpoints for a prefix cache over a hybrid model (no-ops without
 * recurrent state).  With them on, each sequence created afterwards keeps a
 * copy of its state as it was at the last block boundary one of its forward
 * calls ended on (mr_seq_mark_len tokens; 0: none yet).  States live in
 * backend memory: mr_model_state_alloc gives room for one (NULL: none, or no
 * memory), mr_seq_mark_save copies the kept boundary state into it, and
 * mr_seq_attach_state attaches cached blocks to an empty sequence together
 * with the state after their tokens. */
void mr_model_set_checkpoints(mr_model *m, bool on);
int mr_seq_mark_len(const mr_seq *s);
void *mr_model_state_alloc(mr_model *m);
void mr_model_state_free(mr_model *m, void *state);
void mr_seq_mark_save(const mr_seq *s, void *state);
int mr_seq_attach_state(mr_seq *s, const int32_t *blocks, int n_blocks, const void *state, mr_err *err);

/* Router logits, for parity diagnosis (run-gen --router-out): while f is
 * set, each forward call appends to it, for every mixture layer in order,
 * that layer's router logits of the call's rows (float32, [rows][n_expert];
 * dense models write nothing).  Each is downloaded as the layer runs, so
 * this is slow and for checks only.  f NULL stops.  Returns -1 with the
 * first download or write error since the previous call (a failed dump
 * stops dumping; it never fails a forward call), else 0. */
int mr_model_router_dump(mr_model *m, FILE *f, mr_err *err);

/* Drops the tokens after the first len (speculation rejected, cached
 * prefix reused).  KV positions need nothing more; the recurrent state is
 * not rolled back: load a snapshot taken at len. */
int mr_seq_truncate(mr_seq *s, int len, mr_err *err);

/* Benchmarks of decode at depth only: grows s by n positions without
 * running any token there.  Their K/V are whatever the cache's blocks hold
 * (zeros in a fresh cache) and the recurrent state does not move, so what
 * follows continues no text; a decode step then reads exactly the K/V
 * bytes it would at that depth. */
int mr_seq_skip(mr_seq *s, int n, mr_err *err);

/* Runs tokens[0..n) (host memory) at positions len..len+n-1 of s, stores
 * their K/V and, per mode, writes logits to host memory.  On error the
 * sequence length is unchanged. */
int mr_model_forward(mr_model *m, mr_seq *s, const int32_t *tokens, int n, mr_logits_mode mode,
                     float *logits, mr_err *err);
/* The same for tokens the model generated (decode steps, speculative
 * verify rows; mr_batch_item.gen): mr_model_forward is for prompt tokens. */
int mr_model_forward_gen(mr_model *m, mr_seq *s, const int32_t *tokens, int n, mr_logits_mode mode,
                         float *logits, mr_err *err);

/* ---- paged KV and batching (used by the scheduler) ---- */

/* The model's KV block pool and its block size in tokens. */
mr_kv_pool *mr_model_kv_pool(mr_model *m);
int mr_model_block_tokens(const mr_model *m);

/* Promises s enough blocks to hold n_tokens tokens in all, counting the
 * blocks it has and the promise it already holds; fails without change when
 * the pool cannot.  Growth draws on the promise first; mr_seq_free returns
 * what is left of it. */
int mr_seq_reserve(mr_seq *s, int n_tokens, mr_err *err);
/* Blocks promised to s and not yet allocated. */
int mr_seq_reserved(const mr_seq *s);
/* Starts an empty sequence on n_blocks full blocks that hold the K/V of its
 * first n_blocks * block_tokens tokens (shared prefix blocks: s takes one
 * reference on each; nothing is ever written into them). */
int mr_seq_attach(mr_seq *s, const int32_t *blocks, int n_blocks, mr_err *err);
/* The block table of s (host memory, valid until s grows or is freed). */
int mr_seq_blocks(const mr_seq *s, const int32_t **blocks);

/* One sequence's part of a batched step. */
typedef struct mr_batch_item {
    mr_seq *seq;
    const int32_t *tokens; /* host memory, n tokens appended at seq's length */
    int n;
    mr_logits_mode mode;
    float *logits;         /* host memory: [vocab] (LAST) or [n][vocab] (ALL) */
    int32_t *argmax;       /* host memory: one id (ARGMAX, SAMPLE) or [n] (ARGMAX_ALL) */
    /* SAMPLE: the row's parameters and uniform (host memory; add_off is
     * the model's to set), and the ids it adds to its penalty table
     * (sample->n_add_prompt + sample->n_add_gen of them, host memory) */
    const mr_sample_row *sample;
    const int32_t *sample_add;
    /* The tokens are the model's own output (a decode step, speculative
     * verify rows), not prompt: they take the backend's decode numerics and
     * prompt tokens its prompt numerics (kernels/ops.h, matmul_prompt), so
     * that neither depends on what shares the step.  A batch's generated
     * items come before its prompt items. */
    bool gen;
} mr_batch_item;

/* One forward step over several distinct sequences: every matmul runs over
 * the tokens of all items at once (each weight is read once per step),
 * attention runs per item over its own blocks.  A sequence's logits do not
 * depend on its batchmates or on how its tokens are split into calls (on
 * the CPU backend bit for bit).  On error no sequence length changes. */
int mr_model_forward_batch(mr_model *m, const mr_batch_item *items, int n_items, mr_err *err);

/* Whether the backend samples rows itself (MR_LOGITS_SAMPLE). */
bool mr_model_can_sample(const mr_model *m);
/* A penalty table for SAMPLE rows (kernels/ops.h, mr_sample_row) in backend
 * memory, NULL when there is no room; and its release. */
int32_t *mr_model_sample_table_new(mr_model *m);
void mr_model_sample_table_free(mr_model *m, int32_t *table);

#endif

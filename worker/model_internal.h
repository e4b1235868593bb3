/* Model internals shared by worker/model.c (loading, sequences) and the
 * forward passes in worker/arch/. */
#ifndef MR_MODEL_INTERNAL_H
#define MR_MODEL_INTERNAL_H

#include "common/gguf.h"
#include "worker/model.h"

typedef struct mr_layer {
    float *attn_norm, *ffn_norm;  /* [n_embd], float32 in backend memory */
    float *q_norm, *k_norm;       /* [head_dim] */
    mr_weight wq, wk, wv, wo;
    /* dense FFN */
    mr_weight ffn_gate, ffn_up, ffn_down;
    /* MoE FFN */
    mr_weight ffn_gate_inp;       /* router: [n_embd] -> [n_expert] */
    mr_weight ffn_gate_exps, ffn_up_exps, ffn_down_exps;
} mr_layer;

/* Activations for one forward call of up to cap tokens, in backend memory. */
typedef struct mr_scratch {
    int cap;           /* tokens */
    int out_cap;       /* rows of logits */
    void *block;       /* one allocation, carved below */
    int32_t *tokens;   /* [2 * cap]: a call's ids, then its positions (one upload) */
    int32_t *pos;      /* tokens + n for the call in flight (mr_model_stage_upload) */
    float *x, *xn, *q, *k, *v, *att, *proj;
    float *gate, *up;  /* dense: [n][n_ff]; MoE: [n][k][n_ff_exp] */
    float *router;     /* [n][n_expert] */
    int32_t *exp_ids;  /* [n][k] */
    float *exp_w;      /* [n][k] */
    float *exp_out;    /* [n][k][n_embd] */
    float *logits;     /* [out_cap][n_vocab] */
    int32_t *ids;      /* [out_cap] argmax of logits rows */
    const int32_t **tables; /* in sc.tokens after the positions: the rows' block tables, for
                             * the multi-sequence ops (mr_model_stage_upload) */
} mr_scratch;

typedef struct mr_fwd_seg mr_fwd_seg;

#define MR_SPARE_MAX 64

struct mr_model {
    mr_hparams hp;
    mr_backend *be;
    mr_gguf *gguf;
    mr_weight tok_embd, output;
    bool output_tied;  /* output is token_embd (not loaded twice) */
    float *output_norm;
    mr_layer *layers;

    mr_kv_cache kv;
    int n_ctx;
    int max_blocks;    /* blocks per sequence: ceil(n_ctx / block_tokens) */
    mr_kv_pool *pool;

    mr_scratch sc;
    int32_t *stage;      /* host: ids, positions, block-table pointers of a call (stage_cap rows) */
    int stage_cap;
    mr_fwd_seg *segs;    /* host: [segs_cap] segments of a batched call */
    int segs_cap;
    /* The sample op's rows (one per output row) then the ids they add to
     * their penalty tables, staged on the host and copied in one upload. */
    char *samp_host, *samp_dev;
    size_t samp_host_cap, samp_dev_cap;
    const mr_sample_row *samp_rows; /* in samp_dev: the staged rows and ids */
    const int32_t *samp_add;
    /* The call in flight whose short segments share one attention call:
     * rows multi_r0..multi_r1-1 have their tables in sc.tables (NULL for
     * the rows of longer segments in that range); multi_segs NULL: none. */
    const mr_fwd_seg *multi_segs;
    int multi_nsegs, multi_r0, multi_r1;
    /* The call in flight's first gen_rows rows are generated tokens (its
     * generated items come first): the products give them the decode
     * kernels and the rest the prompt ones. */
    int gen_rows;

    struct mr_q35 *q35;  /* hybrid-model weights and buffers (worker/arch/qwen35.c), or NULL */
    size_t rstate_bytes; /* recurrent state per sequence (0: none) */
    bool checkpoints;    /* new sequences keep their state at their last block boundary */
    /* Backend buffers that sequences and the prefix cache gave back, for
     * the next ones to take: recurrent states (rstate_bytes) and block
     * tables (max_blocks ids), at most MR_SPARE_MAX of each kind.  A new
     * buffer a request (an allocation of a state's tens of MB, and a free
     * that waits for the device) held the whole batch up (run 288: ~12 ms
     * a request on the 35B-A3B).  rzero: a zero state, copied on the
     * device into each new sequence's. */
    void *spare_state[MR_SPARE_MAX], *spare_table[MR_SPARE_MAX];
    int n_spare_state, n_spare_table;
    void *rzero;
    /* mr_model_router_dump: the stream, a host row buffer, the first error */
    FILE *router_dump;
    float *router_host;
    size_t router_host_cap;
    bool router_failed;
    mr_err router_err;
};

struct mr_seq {
    mr_model *m;
    int len;
    int n_blocks;
    int32_t *blocks;     /* host copy of the block table [max_blocks] */
    int32_t *blocks_dev; /* the same in backend memory */
    int reserved;        /* blocks promised to this sequence, not yet allocated */
    void *rstate;        /* recurrent state in backend memory (m->rstate_bytes), or NULL */
    void *rmark;         /* with m->checkpoints: rstate as it was after rmark_len tokens, the */
    int rmark_len;       /* last block boundary a forward call ended on (0: none yet) */
};

/* A contiguous run of rows of one forward call that belongs to one sequence:
 * rows start..start+n-1 (tokens at sc.tokens/sc.pos + start, positions
 * pos0..pos0+n-1); logits of its rows from out_first (relative, == n for
 * none) go to sc.logits from row out_row on. */
struct mr_fwd_seg {
    mr_seq *s;
    int start, n;
    int pos0;
    int out_first;
    int out_row;
    bool gen; /* generated tokens (mr_batch_item.gen) */
};

/* Generated segments this short (decode steps, MTP verification) of
 * different sequences go through one multi-sequence K/V store and attention
 * call where the backend has those ops; the others get their own calls
 * (prompt segments through attention_prompt where the backend has it). */
#define MR_FWD_MULTI_MAX 8
static inline bool mr_fwd_seg_multi(const mr_fwd_seg *g) { return g->gen && g->n <= MR_FWD_MULTI_MAX; }

/* y = x W^T (matmul) and the expert form (matmul_id) over the n rows of a
 * forward call: its generated rows (the first gen_rows) go to matmul in
 * products below the backend's batch_variant_rows, the prompt rows to
 * matmul_prompt (where the backend has one; a backend without either
 * distinction gets one product).  mr_fwd_matmul_out: the output head over
 * the call's n output rows, every one on the decode products. */
void mr_fwd_matmul(mr_model *m, const mr_weight *w, const float *x, float *y, int n);
/* count products over one input, y[i] = x w[i]^T: what count mr_fwd_matmul
 * calls write, with the generated rows of all of them asked for first and
 * then the prompt rows of all, so that a backend that joins products over
 * one input sees each kind's products back to back (in a step that mixes
 * both as well). */
void mr_fwd_matmuls(mr_model *m, const mr_weight *const *w, float *const *y, int count, const float *x, int n);
/* The router logits of the call's n rows (sc.router) to the router dump;
 * the caller checks m->router_dump (mr_model_router_dump), so a forward
 * without one pays a pointer test a mixture layer. */
void mr_fwd_router_dump(mr_model *m, int n);
void mr_fwd_matmul_out(mr_model *m, const mr_weight *w, const float *x, float *y, int n);
void mr_fwd_matmul_id(mr_model *m, const mr_weight *w, const float *x, int x_slots, const int32_t *ids,
                      int k, float *y, int n);
/* A mixture layer's routed experts, y = down(silu(gate) * up) a pair (gate
 * and up are scratch): the prompt rows in one moe_ffn_prompt call where the
 * backend has it, the same bits as the products and swiglu apart; the
 * generated rows (and a backend without it) as those. */
void mr_fwd_moe_ffn(mr_model *m, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd, const float *x,
                    const int32_t *ids, int k, float *gate, float *up, float *y, int n);

/* One forward call over several sequences: n rows in sc.tokens / sc.pos in
 * all, split into segs; logits of each segment's rows from out_first on go
 * to sc.logits from its out_row. */
int mr_qwen3_forward_segs(mr_model *m, const mr_fwd_seg *segs, int n_segs, int n, mr_err *err);
/* Its pieces the hybrids reuse (worker/arch/qwen35.c), over n rows of the
 * scratch.  attend: q/k head norms and RoPE on sc.q / sc.k, then per
 * segment the K/V store into layer kv_layer of kv and attention into
 * sc.att.  dense_ffn / moe_ffn (routed experts only): sc.xn -> sc.proj;
 * moe_ffn is moe_router (sc.xn -> sc.router logits) then moe_experts
 * (routing, the chosen experts, their combine), so that a caller can put
 * ops of its own between them.
 * output_head: the output-normed rows with logits into xn rows out_row..
 * (where the MTP block finds them), their logits into sc.logits. */
void mr_qwen3_attend(mr_model *m, const mr_layer *L, mr_kv_cache *kv, int kv_layer, const mr_fwd_seg *segs,
                     int n_segs, int n);
void mr_qwen3_dense_ffn(mr_model *m, const mr_layer *L, int n);
void mr_qwen3_moe_ffn(mr_model *m, const mr_layer *L, int n);
void mr_qwen3_moe_router(mr_model *m, const mr_layer *L, int n);
void mr_qwen3_moe_experts(mr_model *m, const mr_layer *L, int n);
void mr_qwen3_output_head(mr_model *m, const mr_fwd_seg *segs, int n_segs);

/* Weight binding for the architecture files (worker/model.c): a matrix
 * ([cols, rows, mats] as GGUF writes it) through be->weight_load, and a
 * small [ne0, ne1] tensor converted to float32 in backend memory. */
int mr_model_load_matrix(mr_model *m, mr_weight *w, const char *name, int64_t cols, int64_t rows,
                         int64_t mats, mr_err *err);
int mr_model_load_floats(mr_model *m, float **out, const char *name, int64_t ne0, int64_t ne1,
                         mr_err *err);

/* One backend allocation carved into parts of 4-byte elements (float,
 * int32), each 256-byte aligned; NULL (err set, naming cap tokens) when
 * the backend is out of memory. */
typedef struct mr_carve {
    void **p;
    size_t elems;
} mr_carve;
void *mr_model_carve(mr_model *m, const mr_carve *parts, size_t n_parts, int cap, mr_err *err);

/* Releases what load_matrix / load_floats bound (NULL or unbound: no-op),
 * and every weight of a layer. */
void mr_model_release_weight(mr_model *m, mr_weight *w);
void mr_model_free_floats(mr_model *m, float *v);
void mr_model_release_layer(mr_model *m, mr_layer *L);

/* Metadata key "<arch>.<suffix>" as an int in [0, 2^30]; a missing key
 * is an error when required, else dflt. */
int mr_model_key_u32(const mr_gguf *g, const char *arch, const char *suffix, int *out, bool required,
                     int dflt, mr_err *err);

/* Qwen3.5 hybrids (worker/arch/qwen35.c): the architecture's metadata
 * (after the common keys), all per-layer weights (sets m->q35 and
 * m->rstate_bytes), release, and one forward call over sequence segments as
 * mr_qwen3_forward_segs. */
int mr_qwen35_read_hparams(const mr_gguf *g, const char *arch, mr_hparams *hp, mr_err *err);
int mr_qwen35_load_layers(mr_model *m, mr_err *err);
void mr_qwen35_free(mr_model *m);
int mr_qwen35_forward_segs(mr_model *m, const mr_fwd_seg *segs, int n_segs, int n, mr_err *err);

/* The MTP (nextn) draft block of the qwen35 hybrids.  Row t combines the
 * hidden row h[t] (backend memory [n][n_embd], output-normed: the trunk
 * leaves those of its logits rows in sc.xn after a forward call) with token
 * tokens[t] (host) at position pos0 + t of s, whose K/V go to the block's
 * own cache; the id of the last row's largest logit (the next draft,
 * picked by the backend) to *next, and the block's normed output rows to
 * mr_qwen35_mtp_hidden(m), the h of the next draft step.  Rows from position 0 (a whole prompt) take the prompt
 * numerics, the others (the draft chain, the rows after a verify) the
 * decode numerics.  n must fit the activations of the last forward call. */
bool mr_qwen35_has_mtp(const mr_model *m);
const float *mr_qwen35_mtp_hidden(const mr_model *m);
int mr_qwen35_mtp(mr_model *m, mr_seq *s, const float *h, const int32_t *tokens, int n, int pos0,
                  int32_t *next, mr_err *err);
/* The block over prompt rows that ran in a batched call without logits
 * (the scheduler's prompt chunks).  mr_qwen35_mtp_keep, right after that
 * forward call and before any MTP call: the output-normed hidden rows
 * row0..row0+n-1 of the call (the rows of an item: items in order), taken
 * from its residual stream, into a buffer the block does not write, so
 * that every chunk of the call can be kept before the first one is run.
 * mr_qwen35_mtp_prompt: those kept rows with tokens as mr_qwen35_mtp, at
 * positions pos0.. of s, always with the prompt numerics (a chunk gives
 * what the same rows give in one call over the whole prompt); the last
 * row's draft to *next. */
int mr_qwen35_mtp_keep(mr_model *m, int row0, int n, mr_err *err);
/* A speculative verify call without a trunk replay after a rejection.
 * mr_qwen35_rec_arm before a forward call of one sequence and at most rows
 * rows: every recurrent layer keeps its inputs of that call (the
 * projection before the convolution, alpha and beta; any other call in
 * between drops them).  mr_qwen35_rec_replay, with s's recurrent state set
 * back to what it was before that call: runs the convolution and the scan
 * of every recurrent layer over the first n kept rows, which leaves the
 * state the call had after them (the same ops on the same inputs), without
 * the rest of the trunk. */
int mr_qwen35_rec_arm(mr_model *m, int rows, mr_err *err);
int mr_qwen35_rec_replay(mr_model *m, mr_seq *s, int n, mr_err *err);
/* After a sequence's recurrent state was rebuilt outside a forward call:
 * the block-boundary copy a forward call ending at its length takes. */
void mr_seq_state_settled(mr_seq *s);
int mr_qwen35_mtp_prompt(mr_model *m, mr_seq *s, int row0, const int32_t *tokens, int n, int pos0,
                         int32_t *next, mr_err *err);

/* Host room for the ids and positions of n rows: ids in [0, n), positions
 * in [n, 2n), then (8-byte aligned) up to n block-table pointers; then
 * mr_model_stage_upload sends the ids, positions and n_tables pointers in
 * one copy to sc.tokens and points sc.pos and sc.tables at them.  n must
 * fit the scratch (sc.cap). */
int32_t *mr_model_stage(mr_model *m, int n, mr_err *err);
int mr_model_stage_upload(mr_model *m, int n, int n_tables, mr_err *err);

/* Grows s to hold len tokens now (KV blocks allocated, drawing on its
 * reservation first; block table uploaded).  mr_seq_reserve (model.h) only
 * promises blocks. */
int mr_seq_grow(mr_seq *s, int len, mr_err *err);

#endif

/* Synthetic full-size models: GGUF files with the exact tensor names,
 * shapes and quant types of a named model and random weights, for speed
 * work where the weight values do not matter.
 *
 * Recipe (the Q4_K_M-like mix our benchmark figures refer to): Q4_K
 * everywhere, except output.weight Q6_K and attn_v / ffn_down /
 * ffn_down_exps Q6_K on even layers; norms and the MoE router F32.
 * Quantized blocks carry random quants with scales chosen so that the
 * dequantized weights have a standard deviation near 0.02 and are finite. */
#ifndef MR_SYNTH_H
#define MR_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"

typedef struct mr_synth_model {
    const char *name;     /* preset name: "qwen3-8b-q4km", "tiny-qwen3", ... */
    const char *arch;     /* GGUF general.architecture: "qwen3", "qwen3moe" */
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t n_ff;        /* dense FFN width (qwen3moe files carry it too) */
    uint32_t n_vocab;
    uint32_t n_ctx;
    uint32_t n_expert;    /* 0: dense */
    uint32_t n_expert_used;
    uint32_t n_ff_exp;
    bool norm_topk_prob;
    float rope_theta;
    float rms_eps;
} mr_synth_model;

/* The presets, terminated by an entry with name NULL. */
extern const mr_synth_model mr_synth_presets[];
const mr_synth_model *mr_synth_find(const char *name);

/* The recipe's type for a tensor name ("blk.3.attn_v.weight", ...). */
enum mr_type mr_synth_tensor_type(const char *name);

typedef struct mr_synth_opts {
    const char *vocab_path; /* GGUF whose tokenizer.* keys are copied; NULL: minimal tokenizer */
    uint64_t seed;
    unsigned n_threads;     /* 0: one per online CPU */
} mr_synth_opts;

typedef struct mr_synth_stats {
    uint64_t bytes;         /* file size */
    uint64_t n_tensors;
    double seconds;
} mr_synth_stats;

int mr_synth_write(const mr_synth_model *m, const char *path, const mr_synth_opts *opts,
                   mr_synth_stats *stats, mr_err *err);

#endif

/* Synthetic full-size models: GGUF files with the exact tensor names,
 * shapes and quant types of a named model and random weights, for speed
 * work where the weight values do not matter.
 *
 * Recipes (mr_synth_recipe): the tensors upstream keeps in F32 (norms, the
 * MoE routers, the shared-expert gate, and the small Gated DeltaNet tensors
 * ssm_a, ssm_dt.bias, ssm_conv1d) are F32 in all of them; the rest is
 *   Q4_K_M-like: Q4_K, output.weight Q6_K and attn_v / ffn_down /
 *                ffn_down_exps Q6_K on even layers;
 *   IQ4_XS:      IQ4_XS, output.weight Q6_K;
 *   Q8_0:        Q8_0 (output and token_embd too).
 * Quantized blocks carry random quants with scales chosen so that the
 * dequantized weights have a standard deviation near 0.02 and are finite.
 *
 * Layout: a Q8_0 file is laid out as the upstream converter writes one
 * (it quantizes to Q8_0 itself): tensors in checkpoint order with
 * output_norm after the main layers, general.file_type among the
 * architecture keys.  The other recipes are laid out as upstream
 * llama-quantize writes its output: output, output_norm, token_embd, then
 * each layer's tensors sorted by name, trailing unit dimensions dropped,
 * general.file_type last. */
#ifndef MR_SYNTH_H
#define MR_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"

enum mr_synth_recipe {
    MR_SYNTH_Q4_K_M = 0,
    MR_SYNTH_IQ4_XS,
    MR_SYNTH_Q8_0,
};

typedef struct mr_synth_model {
    const char *name;     /* preset name: "qwen3-8b-q4km", "tiny-qwen3", ... */
    const char *arch;     /* GGUF general.architecture: qwen3, qwen3moe, qwen35, qwen35moe */
    enum mr_synth_recipe recipe;
    uint32_t n_layer;     /* main layers (MTP blocks not counted) */
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t n_ff;        /* dense FFN width (MoE files carry the key too) */
    uint32_t n_vocab;
    uint32_t n_ctx;
    uint32_t n_expert;    /* 0: dense */
    uint32_t n_expert_used;
    uint32_t n_ff_exp;
    uint32_t n_ff_shexp;  /* shared expert width; 0: none */
    float rope_theta;
    float rms_eps;
    /* Hybrids (qwen35, qwen35moe): Gated DeltaNet layers with a gated full
     * attention layer where il % full_attn_interval == full_attn_interval - 1,
     * then n_nextn MTP blocks (full attention) after the main layers. */
    uint32_t full_attn_interval; /* 0: every layer is full attention (qwen3) */
    uint32_t n_nextn;
    uint32_t n_rot;              /* rotary dimensions (partial rotary) */
    uint32_t rope_sections[4];   /* M-RoPE sections, in rotary pairs */
    uint32_t ssm_conv_kernel;
    uint32_t ssm_state;          /* key head dim (ssm.state_size) */
    uint32_t ssm_groups;         /* key heads (ssm.group_count) */
    uint32_t ssm_dt_rank;        /* value heads (ssm.time_step_rank) */
    uint32_t ssm_inner;          /* value heads * value head dim (ssm.inner_size) */
} mr_synth_model;

/* The presets, terminated by an entry with name NULL. */
extern const mr_synth_model mr_synth_presets[];
const mr_synth_model *mr_synth_find(const char *name);

/* The recipe's type for a tensor name ("blk.3.attn_v.weight", ...). */
enum mr_type mr_synth_tensor_type(const mr_synth_model *m, const char *name);

/* Sum of the tensors' data sizes and their count, without writing. */
uint64_t mr_synth_tensor_bytes(const mr_synth_model *m, uint64_t *n_tensors);

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

/* Greedy generation with self-speculative decoding: the model's own MTP
 * block drafts k tokens, one batched target pass verifies them, the longest
 * agreeing prefix plus the target's next token is kept.  Rejected tokens
 * leave nothing behind: the sequence is truncated and its recurrent state
 * restored from a snapshot, so the output equals plain greedy decoding. */
#ifndef MR_SPEC_H
#define MR_SPEC_H

#include <stdint.h>

#include "common/err.h"
#include "worker/model.h"

typedef struct mr_spec_stats {
    int drafted;   /* draft tokens proposed */
    int accepted;  /* of those, accepted */
    int verifies;  /* batched target passes */
    int replays;   /* passes re-run after a rejection to rebuild the recurrent state */
} mr_spec_stats;

/* Replaces the k drafts of a step (output indices first..first+k-1) after
 * the MTP block proposed them: lets tests exercise acceptance with drafts
 * of known quality (random-weight MTP blocks almost never agree). */
typedef struct mr_spec_drafter {
    void (*replace)(void *ctx, int first, int k, int32_t *draft);
    void *ctx;
} mr_spec_drafter;

/* True when m has an MTP block to draft with. */
bool mr_spec_supported(const mr_model *m);

/* Prefills prompt (host ids) in a new sequence of m and generates n_gen
 * greedy tokens into out, drafting k (1..8) tokens per step.  override and
 * stats may be NULL. */
int mr_spec_generate(mr_model *m, const int32_t *prompt, int n_prompt, int n_gen, int k,
                     const mr_spec_drafter *override, int32_t *out, mr_spec_stats *stats,
                     mr_err *err);

#endif

/* MTP self-speculation steps, split so that the caller decides how many of
 * a step's tokens a request keeps (the scheduler, worker/sched.c: stop ids,
 * max_tokens, cancellation; worker/spec.c keeps them all).
 *
 * A step of one sequence that holds L tokens and whose next token t
 * (position L) is known but not yet run:
 *   mr_sched_spec_verify  drafts up to k tokens (the first one left by the
 *                         previous step's MTP call, the rest chained through
 *                         the MTP block), runs [t, d1..dk] through the
 *                         trunk in one call and offers the agreeing drafts
 *                         plus the trunk's own next token;
 *   mr_sched_spec_commit  keeps the first `keep` of them.  When the request
 *                         goes on, a rejection restores the recurrent state
 *                         from the snapshot taken before the verify call and
 *                         re-runs the accepted tokens, and the MTP block runs
 *                         over the kept rows for the next step's first draft.
 *                         When it ends, the sequence is only cut back to
 *                         the kept tokens (their K/V are exact; the
 *                         recurrent state is not needed any more).
 * Greedy only: a draft is kept exactly when it equals the trunk's argmax,
 * so the output is that of plain greedy decoding.
 *
 * The first draft of a step comes from the MTP rows of the previous step
 * of the same sequence (or of its prompt's priming, below); any other
 * forward call in between (a batched step of the scheduler, another
 * sequence's speculation or priming) overwrites the hidden rows it chains
 * from, so it is valid only while nothing else ran: see
 * mr_sched_spec_invalidate.  Without it a step verifies no drafts (a plain
 * decode step after which the MTP block runs over its row).
 *
 * The MTP block's own K/V is written for the positions its calls cover:
 * those of speculative steps, and the prompt's, primed once its rows have
 * run (mr_sched_spec_prime over a whole prompt, mr_sched_spec_prime_chunk
 * chunk by chunk as the scheduler runs it, which also leaves the first
 * draft of the first step).  Positions run otherwise (batched decode
 * steps, a prompt no call primed) are not written, so the block attends
 * over stale entries there and drafts less well; outputs are unaffected
 * (every draft is verified).  A prompt's positions restored from the
 * prefix cache are not primed either: they hold what the request that
 * first ran them wrote there (sched.c). */
#ifndef MR_SCHED_SPEC_H
#define MR_SCHED_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "worker/model.h"
#include "worker/spec.h"

typedef struct mr_sched_spec mr_sched_spec;

/* A request's draft state; zero: no first draft yet. */
typedef struct mr_spec_state {
    bool valid;
    int len;          /* the sequence length the draft belongs to */
    uint64_t epoch;   /* mr_sched_spec's epoch when it was made */
    int32_t d1;       /* the first draft of the next step */
    int mtp_rows;     /* rows of the MTP call that made it: its last hidden row feeds the chain */
} mr_spec_state;

typedef struct mr_sched_spec_stats {
    uint64_t steps;     /* verify calls */
    uint64_t drafted;   /* draft tokens verified */
    uint64_t accepted;  /* of those, equal to the trunk's argmax */
    uint64_t replays;   /* re-runs after a rejection */
    uint64_t tokens;    /* trunk tokens run (verify and replay rows) */
    uint64_t primed;    /* prompt positions the MTP block ran over */
} mr_sched_spec_stats;

/* k drafts (1..8) per step on m, which must have an MTP block.  drafter
 * (may be NULL) replaces each step's drafts after the MTP block made them
 * (tests: drafts of known quality). */
int mr_sched_spec_new(mr_model *m, int k, const mr_spec_drafter *drafter, mr_sched_spec **out, mr_err *err);
void mr_sched_spec_free(mr_sched_spec *p);

/* Another forward call ran on the model: every request's first draft is
 * stale. */
void mr_sched_spec_invalidate(mr_sched_spec *p);

/* Verifies a step of seq (t: its next token; first: how many tokens the
 * request has generated, for the drafter; max_new >= 1: how many it may
 * still generate, so at most max_new - 1 drafts, which keeps every
 * position inside the request's KV reservation).  *cand gets the offered
 * ids (accepted drafts, then the trunk's token; valid until the next call),
 * *n_cand their count (1..k+1).  On error the request cannot go on. */
int mr_sched_spec_verify(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, int32_t t, int first, int max_new,
                         const int32_t **cand, int *n_cand, mr_err *err);

/* Keeps the first keep (1..n_cand) offered ids: the sequence then holds
 * the L + keep tokens before the last kept id.  more: the request goes on
 * (keep must be n_cand): state made exact and the next first draft made;
 * else the sequence is only cut back (fit to publish its K/V, not to run
 * further). */
int mr_sched_spec_commit(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, int keep, bool more, mr_err *err);

/* After seq's prompt (n_prompt tokens, run with every row's logits so that
 * sc.xn holds their hidden rows) whose next token is t: the MTP block over
 * the prompt, which writes its K/V there and gives the first draft. */
int mr_sched_spec_prime(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, const int32_t *prompt, int n_prompt,
                        int32_t t, mr_err *err);

/* Priming chunk by chunk, for a prompt run in batched calls without
 * logits (the scheduler's chunks, each with its own call): the MTP rows of
 * a chunk pair the hidden rows of its positions, which only that call has,
 * with the token after each.  After such a call, first keep the rows of
 * every chunk to prime (row0: where its item's rows start in the call, the
 * items' rows in order), before any MTP call (a prime is one)
 * overwrites the call's activations: */
int mr_sched_spec_keep_rows(mr_sched_spec *p, int row0, int n, mr_err *err);
/* then for each: chunk (n ids) ran at the last n positions of seq, whose
 * rows the call has from row0, and next is the token after it (the prompt's
 * next id, or after its last chunk the first generated one).  The MTP block
 * over those positions writes its K/V there; *st gets the draft for the
 * step after them (the first draft of the first step after the last chunk;
 * any other forward call, or another prime, makes it stale). */
int mr_sched_spec_prime_chunk(mr_sched_spec *p, mr_seq *seq, mr_spec_state *st, int row0, const int32_t *chunk,
                              int n, int32_t next, mr_err *err);

void mr_sched_spec_get_stats(const mr_sched_spec *p, mr_sched_spec_stats *out);

#endif

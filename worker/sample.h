/* Sampling the next token from one row of logits.
 *
 * Each request carries its own seeded generator, so what it draws depends
 * only on its own logits, parameters and seed, never on its batchmates.
 *
 * Order of the steps (as the usual OpenAI-compatible servers):
 *   1. penalties: repetition (prompt and generated tokens; a positive logit
 *      is divided by it, a negative one multiplied), then presence and
 *      frequency (generated tokens only: logit -= presence * [count > 0]
 *      + frequency * count);
 *   2. temperature <= 0: greedy, the largest logit, lowest id on ties;
 *   3. logits / temperature; ranking by logit (ties: lower id first);
 *      top_k keeps the k best (0: all);
 *   4. softmax over the candidates; min_p drops those below min_p times the
 *      largest probability; top_p keeps the shortest head of the ranking
 *      whose cumulative probability reaches top_p (at least one);
 *   5. one uniform u strictly inside (0, 1) picks by inverse CDF over the
 *      renormalised survivors, taken in token id order.
 * Nothing sorts the vocabulary: top_k and top_p are selections (expected
 * linear time), so a 152k vocabulary costs a few passes per token.  Tokens
 * whose weight exp((l - max) / T) underflows a double are left out. */
#ifndef MR_SAMPLE_H
#define MR_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* The sampling parameters as the sampler reads them (proto/msg.h's
 * mr_sampling is their wire form: the engines convert). */
typedef struct mr_sample_params {
    float temperature;        /* <= 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* <= 0 or >= 1: off */
    float min_p;              /* <= 0: off */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    float repetition_penalty; /* <= 0 or 1: off */
    uint64_t seed;
} mr_sample_params;

/* Rejects values outside the ranges the API accepts (NaN, negative top_k...). */
int mr_sampling_check(const mr_sample_params *p, mr_err *err);

/* A small counter-free generator (xoshiro256**), seeded through splitmix64. */
typedef struct mr_rng {
    uint64_t s[4];
} mr_rng;

void mr_rng_seed(mr_rng *r, uint64_t seed);

/* inline: weight synthesis (worker/synth.c) draws one per 8 bytes */
static inline uint64_t mr_rng_next(mr_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s[3] << 45 | s[3] >> 19;
    return out;
}

/* A double strictly inside (0, 1): (k + 0.5) / 2^53 for a 53-bit k. */
double mr_rng_uniform(mr_rng *r);

/* Sets r so that its next mr_rng_uniform returns u, a value mr_rng_uniform
 * returned (e.g. a draw handed to a backend's sample op, which a reference
 * mr_sample then replays). */
void mr_rng_rig(mr_rng *r, double u);

/* Reusable working memory for one vocabulary size. */
typedef struct mr_sampler mr_sampler;
int mr_sampler_new(int n_vocab, mr_sampler **out, mr_err *err);
void mr_sampler_free(mr_sampler *s);

/* Applies the penalties in place to logits[n_vocab]: prompt[0..n_prompt)
 * and gen[0..n_gen) are the tokens so far (ids outside the vocabulary are
 * ignored). */
void mr_sample_penalize(mr_sampler *s, const mr_sample_params *p, float *logits, const int32_t *prompt,
                        int n_prompt, const int32_t *gen, int n_gen);

/* Index of the largest value, lowest index on ties (NaN never wins). */
int32_t mr_sample_argmax(const float *x, int n);

/* Whether any penalty changes logits (mr_sample_penalize is a no-op
 * otherwise). */
bool mr_sample_penalized(const mr_sample_params *p);
/* Greedy without penalties: the largest raw logit is the choice, so a
 * backend's argmax can pick it without the logits reaching the host. */
bool mr_sample_plain_greedy(const mr_sample_params *p);

/* The final distribution after steps 3-4 over already penalised logits:
 * probs[n_vocab] (zero for dropped tokens, the rest sum to 1).  Needs
 * temperature > 0. */
int mr_sample_probs(mr_sampler *s, const mr_sample_params *p, const float *logits, float *probs);

/* The whole pipeline: penalises logits in place, then returns the chosen
 * id (greedy when temperature <= 0, else one draw from rng). */
int32_t mr_sample(mr_sampler *s, const mr_sample_params *p, mr_rng *rng, float *logits,
                  const int32_t *prompt, int n_prompt, const int32_t *gen, int n_gen);

#endif

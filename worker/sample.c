/* Sampling: penalties, greedy, temperature / top-k / min-p / top-p, and a
 * per-request seeded generator. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "worker/sample.h"

struct mr_sampler {
    int n_vocab;
    int32_t *count;    /* [n_vocab] occurrences in the generated tokens; kept zero between calls */
    uint8_t *seen;     /* [n_vocab] in prompt or generated; kept zero between calls */
    struct cand { float l; int32_t id; } *cand; /* [n_vocab] */
    double *w;         /* [n_vocab] candidate weights */
};

int mr_sampling_check(const mr_sampling *p, mr_err *err)
{
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return mr_errf(err, "temperature %g must be a finite value >= 0", (double)p->temperature);
    if (p->top_k < -1)
        return mr_errf(err, "top_k %d must be >= -1 (0 and -1: off)", p->top_k);
    if (!isfinite(p->top_p) || p->top_p < 0.0f || p->top_p > 1.0f)
        return mr_errf(err, "top_p %g must be in [0, 1]", (double)p->top_p);
    if (!isfinite(p->min_p) || p->min_p < 0.0f || p->min_p > 1.0f)
        return mr_errf(err, "min_p %g must be in [0, 1]", (double)p->min_p);
    if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 2.0f)
        return mr_errf(err, "presence_penalty %g must be in [-2, 2]", (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 2.0f)
        return mr_errf(err, "frequency_penalty %g must be in [-2, 2]", (double)p->frequency_penalty);
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty < 0.0f)
        return mr_errf(err, "repetition_penalty %g must be a finite value >= 0", (double)p->repetition_penalty);
    return 0;
}

/* ---- generator ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mr_rng_seed(mr_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mr_rng_next(mr_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double mr_rng_uniform(mr_rng *r)
{
    /* the midpoint of one of 2^53 equal cells: never 0, never 1 */
    return ((double)(mr_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* ---- sampler ---- */

int mr_sampler_new(int n_vocab, mr_sampler **out, mr_err *err)
{
    *out = NULL;
    if (n_vocab <= 0)
        return mr_errf(err, "sampler: vocabulary of %d ids", n_vocab);
    mr_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->n_vocab = n_vocab;
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        s->seen = calloc((size_t)n_vocab, 1);
        s->cand = malloc(sizeof *s->cand * (size_t)n_vocab);
        s->w = malloc(sizeof *s->w * (size_t)n_vocab);
    }
    if (!s || !s->count || !s->seen || !s->cand || !s->w) {
        mr_sampler_free(s);
        return mr_errf(err, "sampler: out of memory for %d ids", n_vocab);
    }
    *out = s;
    return 0;
}

void mr_sampler_free(mr_sampler *s)
{
    if (!s)
        return;
    free(s->count);
    free(s->seen);
    free(s->cand);
    free(s->w);
    free(s);
}

static bool in_vocab(const mr_sampler *s, int32_t id) { return id >= 0 && id < s->n_vocab; }

void mr_sample_penalize(mr_sampler *s, const mr_sampling *p, float *logits, const int32_t *prompt,
                        int n_prompt, const int32_t *gen, int n_gen)
{
    float rep = p->repetition_penalty;
    if (rep > 0.0f && rep != 1.0f) {
        /* each distinct token once, whether it occurs once or many times */
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? gen : prompt;
            int n = pass ? n_gen : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t id = ids[i];
                if (!in_vocab(s, id) || s->seen[id])
                    continue;
                s->seen[id] = 1;
                logits[id] = logits[id] > 0.0f ? logits[id] / rep : logits[id] * rep;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? gen : prompt;
            int n = pass ? n_gen : n_prompt;
            for (int i = 0; i < n; i++)
                if (in_vocab(s, ids[i]))
                    s->seen[ids[i]] = 0;
        }
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int i = 0; i < n_gen; i++)
            if (in_vocab(s, gen[i]))
                s->count[gen[i]]++;
        for (int i = 0; i < n_gen; i++) {
            int32_t id = gen[i];
            if (!in_vocab(s, id) || s->count[id] == 0)
                continue; /* already applied for this id */
            logits[id] -= p->presence_penalty + p->frequency_penalty * (float)s->count[id];
            s->count[id] = 0;
        }
    }
}

int32_t mr_sample_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i])))
            best = i;
    return best;
}

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Steps 3-4: fills s->cand[0..m) in sorted order and s->w[0..m) with their
 * probabilities (summing to 1); returns m >= 1, or 0 when no logit is finite. */
static int distribution(mr_sampler *s, const mr_sampling *p, const float *logits)
{
    double inv_t = 1.0 / (double)p->temperature;
    float mx = -INFINITY;
    for (int i = 0; i < s->n_vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    if (!isfinite(mx))
        return 0;
    /* tokens whose weight exp(z - z_max) is below e^-80 cannot change the
     * double sum (they are < 1e-34 of it) and are left out before sorting */
    int m = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        if (!((double)logits[i] - (double)mx > -80.0 * p->temperature))
            continue;
        s->cand[m++] = (struct cand){logits[i], i};
    }
    qsort(s->cand, (size_t)m, sizeof *s->cand, cand_cmp);
    if (p->top_k > 0 && p->top_k < m)
        m = p->top_k;
    double z0 = (double)s->cand[0].l * inv_t, sum = 0.0;
    for (int i = 0; i < m; i++) {
        s->w[i] = exp((double)s->cand[i].l * inv_t - z0);
        sum += s->w[i];
    }
    for (int i = 0; i < m; i++)
        s->w[i] /= sum;
    if (p->min_p > 0.0f) {
        double floor_p = (double)p->min_p * s->w[0];
        int keep = 1;
        while (keep < m && s->w[keep] >= floor_p)
            keep++; /* sorted, so the survivors are a head */
        m = keep;
        sum = 0.0;
        for (int i = 0; i < m; i++)
            sum += s->w[i];
        for (int i = 0; i < m; i++)
            s->w[i] /= sum;
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0.0;
        int keep = 0;
        while (keep < m) {
            cum += s->w[keep++];
            if (cum >= (double)p->top_p)
                break;
        }
        m = keep;
        for (int i = 0; i < m; i++)
            s->w[i] /= cum;
    }
    return m;
}

int mr_sample_probs(mr_sampler *s, const mr_sampling *p, const float *logits, float *probs)
{
    if (!(p->temperature > 0.0f))
        return -1;
    for (int i = 0; i < s->n_vocab; i++)
        probs[i] = 0.0f;
    int m = distribution(s, p, logits);
    if (m == 0)
        return -1;
    for (int i = 0; i < m; i++)
        probs[s->cand[i].id] = (float)s->w[i];
    return 0;
}

int32_t mr_sample(mr_sampler *s, const mr_sampling *p, mr_rng *rng, float *logits,
                  const int32_t *prompt, int n_prompt, const int32_t *gen, int n_gen)
{
    mr_sample_penalize(s, p, logits, prompt, n_prompt, gen, n_gen);
    if (!(p->temperature > 0.0f))
        return mr_sample_argmax(logits, s->n_vocab);
    int m = distribution(s, p, logits);
    if (m == 0)
        return mr_sample_argmax(logits, s->n_vocab);
    double u = mr_rng_uniform(rng), cum = 0.0;
    for (int i = 0; i < m; i++) {
        cum += s->w[i];
        if (u < cum)
            return s->cand[i].id;
    }
    return s->cand[m - 1].id; /* u beyond a sum that rounded below 1 */
}

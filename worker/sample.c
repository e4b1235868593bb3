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
    double *wid;       /* [n_vocab] weights by token id */
};

int mr_sampling_check(const mr_sample_params *p, mr_err *err)
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

double mr_rng_uniform(mr_rng *r)
{
    /* the midpoint of one of 2^53 equal cells: never 0; from 2^52 on the
     * + 0.5 rounds to even, which for the last cell gives 1 itself: that
     * one draw becomes the largest double below 1 */
    double u = ((double)(mr_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return u < 1.0 ? u : 1.0 - 1.0 / 9007199254740992.0;
}

/* The inverse of an odd a modulo 2^64 (Newton: each step doubles the
 * correct low bits, from 3). */
static uint64_t inv_odd(uint64_t a)
{
    uint64_t x = a;
    for (int i = 0; i < 6; i++)
        x *= 2 - a * x;
    return x;
}

void mr_rng_rig(mr_rng *r, double u)
{
    /* k: the 53 bits mr_rng_uniform scales (for k >= 2^52 the + 0.5 rounds
     * to even, so the floor of u * 2^53 is a k that gives u again) */
    double f = floor(u * 9007199254740992.0);
    uint64_t k = f >= 9007199254740991.0 ? (1ull << 53) - 1 : f > 0.0 ? (uint64_t)f : 0;
    uint64_t m = (k << 11) * inv_odd(9); /* mr_rng_next's output is rotl(s1 * 5, 7) * 9 */
    m = m >> 7 | m << 57;
    mr_rng_seed(r, k ^ 0x5851f42d4c957f2dull); /* the words after s1: any */
    r->s[1] = m * inv_odd(5);
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
        s->wid = malloc(sizeof *s->wid * (size_t)n_vocab);
    }
    if (!s || !s->count || !s->seen || !s->cand || !s->wid) {
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
    free(s->wid);
    free(s);
}

static bool in_vocab(const mr_sampler *s, int32_t id) { return id >= 0 && id < s->n_vocab; }

void mr_sample_penalize(mr_sampler *s, const mr_sample_params *p, float *logits, const int32_t *prompt,
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

bool mr_sample_penalized(const mr_sample_params *p)
{
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           (p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f);
}

bool mr_sample_plain_greedy(const mr_sample_params *p)
{
    return !(p->temperature > 0.0f) && !mr_sample_penalized(p);
}

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Puts the k first candidates of cand[0..n) in the cand_cmp order (a
 * strict total order, so the result does not depend on pivots) into
 * cand[0..k), in no particular order: quickselect. */
static void select_first(struct cand *c, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        struct cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp(&c[i], &pivot) < 0)
                i++;
            while (cand_cmp(&c[j], &pivot) > 0)
                j--;
            if (i <= j) {
                struct cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* The nucleus: rearranges cand[0..n) so that cand[0..k) are the shortest
 * head of the cand_cmp order whose weights (wid) reach goal, and returns k
 * (n when rounding keeps the goal out of reach).  A weighted quickselect:
 * expected linear time, no sort. */
static int nucleus(const double *wid, struct cand *c, int n, double goal)
{
    int lo = 0, hi = n; /* c[0..lo) are in; the answer lies in [lo, hi) */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        struct cand t = c[mid];
        c[mid] = c[hi - 1];
        c[hi - 1] = t; /* the pivot waits at the end */
        struct cand pivot = t;
        int a = lo;
        double better = 0.0;
        for (int i = lo; i < hi - 1; i++)
            if (cand_cmp(&c[i], &pivot) < 0) {
                better += wid[c[i].id];
                t = c[a];
                c[a++] = c[i];
                c[i] = t;
            }
        t = c[a];
        c[a] = c[hi - 1];
        c[hi - 1] = t; /* the pivot at its rank */
        if (better >= goal) {
            hi = a; /* the answer lies among the better ones */
            continue;
        }
        goal -= better + wid[pivot.id];
        if (goal <= 0.0)
            return a + 1;
        lo = a + 1;
    }
    return lo;
}

/* Steps 3-5.  Survivors end up as the positive entries of s->wid (by id);
 * u in (0, 1) then picks by inverse CDF in id order and returns the id;
 * u < 0 writes probs instead. */
static int32_t distribution(mr_sampler *s, const mr_sample_params *p, const float *logits, double u,
                            float *probs)
{
    int V = s->n_vocab;
    float mx = -INFINITY;
    int32_t best = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] > mx) {
            mx = logits[i];
            best = i;
        }
    if (!isfinite(mx)) {
        if (probs) {
            for (int i = 0; i < V; i++)
                probs[i] = 0.0f;
            probs[best] = 1.0f;
        }
        return best;
    }
    double inv_t = 1.0 / (double)p->temperature;
    bool top_k = p->top_k > 0 && p->top_k < V;
    int n = 0;
    if (top_k) {
        /* the k best by quickselect; only they get weights */
        for (int i = 0; i < V; i++) {
            s->wid[i] = 0.0;
            if (logits[i] == logits[i]) /* not NaN */
                s->cand[n++] = (struct cand){logits[i], i};
        }
        if (n > p->top_k) {
            select_first(s->cand, n, p->top_k);
            n = p->top_k;
        }
        for (int i = 0; i < n; i++)
            s->wid[s->cand[i].id] = exp(((double)s->cand[i].l - (double)mx) * inv_t);
    } else {
        for (int i = 0; i < V; i++)
            s->wid[i] = exp(((double)logits[i] - (double)mx) * inv_t); /* the largest is 1 */
    }
    /* min_p: weights are relative to the largest, so it is a threshold */
    double total = 0.0;
    n = 0;
    for (int i = 0; i < V; i++) {
        double w = s->wid[i];
        if (!(w > 0.0) || (p->min_p > 0.0f && w < (double)p->min_p))
            w = 0.0; /* not a candidate, NaN, underflow, or below min_p */
        s->wid[i] = w;
        total += w;
        if (w > 0.0)
            s->cand[n++] = (struct cand){logits[i], i};
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        int k = nucleus(s->wid, s->cand, n, (double)p->top_p * total);
        for (int i = k; i < n; i++)
            s->wid[s->cand[i].id] = 0.0;
        total = 0.0;
        for (int i = 0; i < V; i++)
            total += s->wid[i];
    }
    if (u < 0.0) {
        for (int i = 0; i < V; i++)
            probs[i] = (float)(s->wid[i] / total);
        return 0;
    }
    double target = u * total, cum = 0.0;
    int32_t last = best;
    for (int i = 0; i < V; i++) {
        if (s->wid[i] <= 0.0)
            continue;
        cum += s->wid[i];
        last = i;
        if (target < cum)
            return i;
    }
    return last; /* a sum that rounded below the target */
}

int mr_sample_probs(mr_sampler *s, const mr_sample_params *p, const float *logits, float *probs)
{
    if (!(p->temperature > 0.0f))
        return -1;
    distribution(s, p, logits, -1.0, probs);
    return 0;
}

int32_t mr_sample(mr_sampler *s, const mr_sample_params *p, mr_rng *rng, float *logits,
                  const int32_t *prompt, int n_prompt, const int32_t *gen, int n_gen)
{
    mr_sample_penalize(s, p, logits, prompt, n_prompt, gen, n_gen);
    if (!(p->temperature > 0.0f))
        return mr_sample_argmax(logits, s->n_vocab);
    return distribution(s, p, logits, mr_rng_uniform(rng), NULL);
}

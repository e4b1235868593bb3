/* The worker's real engine: a GGUF model on a backend (worker/model.h),
 * one KV sequence per request, and sampling on the host.
 *
 * Sampling, in order: repetition penalty (over prompt and output, dividing
 * positive logits and multiplying negative ones), presence and frequency
 * penalties (over the output), then temperature 0 -> argmax (lowest id on
 * ties), else top-k, softmax at the temperature, top-p, min-p, and a draw
 * from a per-request xoshiro256** stream seeded from the request's seed.
 * Log-probabilities are those of the model's distribution (log-softmax of
 * the raw logits), as OpenAI reports them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "common/log.h"
#include "worker/model.h"
#include "worker/server.h"

typedef struct model_engine {
    mr_engine super;
    mr_backend *be;
    mr_model *m;
    int n_vocab;
    int32_t eos[4];
    int n_eos;
    uint64_t seed_counter;
} model_engine;

typedef struct mseq {
    mr_seq *s;
    int32_t *prompt;
    int n_prompt;
    bool prefilled;
    int32_t last;       /* last sampled token, fed on the next step */
    float *logits;      /* [n_vocab] */
    float *work;        /* [n_vocab] */
    int32_t *idx;       /* [n_vocab] */
    uint32_t *counts;   /* output occurrences per token (penalties) */
    uint8_t *in_prompt; /* repetition penalty covers the prompt too */
    mr_sampling samp;
    uint64_t rng[4];
} mseq;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static double uniform(uint64_t *s) { return (xoshiro(s) >> 11) * (1.0 / 9007199254740992.0); }

static void mseq_free(mseq *q)
{
    if (q->s)
        mr_seq_free(q->s);
    free(q->prompt);
    free(q->logits);
    free(q->work);
    free(q->idx);
    free(q->counts);
    free(q->in_prompt);
    free(q);
}

static void *seq_new(mr_engine *e, const mr_msg *req, mr_err *err)
{
    model_engine *me = (model_engine *)e;
    int V = me->n_vocab;
    mseq *q = calloc(1, sizeof *q);
    if (!q) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    q->prompt = malloc(req->n_tokens * sizeof *q->prompt);
    q->logits = malloc((size_t)V * sizeof *q->logits);
    q->work = malloc((size_t)V * sizeof *q->work);
    q->idx = malloc((size_t)V * sizeof *q->idx);
    q->counts = calloc((size_t)V, sizeof *q->counts);
    q->in_prompt = calloc((size_t)V, 1);
    if (!q->prompt || !q->logits || !q->work || !q->idx || !q->counts || !q->in_prompt) {
        mseq_free(q);
        mr_errf(err, "out of memory");
        return NULL;
    }
    if (mr_seq_new(me->m, &q->s, err)) {
        mseq_free(q);
        return NULL;
    }
    for (uint32_t i = 0; i < req->n_tokens; i++) {
        q->prompt[i] = (int32_t)req->tokens[i];
        q->in_prompt[req->tokens[i]] = 1;
    }
    q->n_prompt = (int)req->n_tokens;
    q->samp = req->samp;
    uint64_t x = req->samp.has_seed ? req->samp.seed : (uint64_t)time(NULL) ^ (++me->seed_counter << 20) ^ req->id;
    for (int i = 0; i < 4; i++)
        q->rng[i] = splitmix(&x);
    return q;
}

static int cmp_desc(const void *a, const void *b, void *arg)
{
    const float *w = arg;
    float x = w[*(const int32_t *)a], y = w[*(const int32_t *)b];
    if (x != y)
        return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

static int sample(model_engine *me, mseq *q, mr_step *out)
{
    int V = me->n_vocab;
    const mr_sampling *sp = &q->samp;
    float *w = q->work;
    memcpy(w, q->logits, (size_t)V * sizeof *w);
    for (int i = 0; i < V; i++) {
        if (sp->repetition_penalty != 1.0f && (q->in_prompt[i] || q->counts[i]))
            w[i] = w[i] > 0 ? w[i] / sp->repetition_penalty : w[i] * sp->repetition_penalty;
        if (q->counts[i])
            w[i] -= sp->presence_penalty + sp->frequency_penalty * (float)q->counts[i];
    }
    int32_t tok = 0;
    if (sp->temperature <= 0.0f) {
        for (int i = 1; i < V; i++)
            if (w[i] > w[tok])
                tok = i;
    } else {
        int n = V;
        for (int i = 0; i < V; i++)
            q->idx[i] = i;
        qsort_r(q->idx, (size_t)V, sizeof *q->idx, cmp_desc, w);
        if (sp->top_k > 0 && (int)sp->top_k < n)
            n = (int)sp->top_k;
        double mx = w[q->idx[0]], sum = 0;
        for (int i = 0; i < n; i++)
            sum += exp((w[q->idx[i]] - mx) / sp->temperature);
        /* top-p: the smallest prefix whose mass reaches top_p */
        if (sp->top_p < 1.0f) {
            double acc = 0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                acc += exp((w[q->idx[i]] - mx) / sp->temperature) / sum;
                if (acc >= sp->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
        }
        /* min-p: drop tokens below min_p times the top probability */
        if (sp->min_p > 0.0f) {
            int keep = 1;
            for (int i = 1; i < n; i++)
                if (exp((w[q->idx[i]] - mx) / sp->temperature) >= sp->min_p)
                    keep = i + 1;
                else
                    break;
            n = keep;
        }
        double total = 0;
        for (int i = 0; i < n; i++)
            total += exp((w[q->idx[i]] - mx) / sp->temperature);
        double r = uniform(q->rng) * total, acc = 0;
        tok = q->idx[n - 1];
        for (int i = 0; i < n; i++) {
            acc += exp((w[q->idx[i]] - mx) / sp->temperature);
            if (r < acc) {
                tok = q->idx[i];
                break;
            }
        }
    }
    out->token = (uint32_t)tok;
    for (int i = 0; i < me->n_eos; i++)
        if (tok == me->eos[i])
            out->eos = true;
    if (sp->logprobs) {
        const float *l = q->logits;
        double mx = l[0], sum = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > mx)
                mx = l[i];
        for (int i = 0; i < V; i++)
            sum += exp(l[i] - mx);
        double lse = mx + log(sum);
        out->logprob = (float)(l[tok] - lse);
        uint32_t k = sp->top_logprobs;
        if (k > MR_MSG_MAX_TOP_LOGPROBS)
            k = MR_MSG_MAX_TOP_LOGPROBS;
        if ((int)k > V)
            k = (uint32_t)V;
        /* k largest by selection: k <= 20 passes over the vocabulary */
        for (uint32_t j = 0; j < k; j++) {
            int best = -1;
            for (int i = 0; i < V; i++) {
                bool taken = false;
                for (uint32_t t = 0; t < j; t++)
                    if (out->top_ids[t] == (uint32_t)i)
                        taken = true;
                if (!taken && (best < 0 || l[i] > l[best]))
                    best = i;
            }
            out->top_ids[j] = (uint32_t)best;
            out->top_lps[j] = (float)(l[best] - lse);
        }
        out->n_top = k;
    }
    q->counts[tok]++;
    q->last = tok;
    return 0;
}

static int seq_step(mr_engine *e, void *seq, mr_step *out, mr_err *err)
{
    model_engine *me = (model_engine *)e;
    mseq *q = seq;
    if (!q->prefilled) {
        if (mr_model_forward(me->m, q->s, q->prompt, q->n_prompt, MR_LOGITS_LAST, q->logits, err))
            return -1;
        q->prefilled = true;
    } else if (mr_model_forward(me->m, q->s, &q->last, 1, MR_LOGITS_LAST, q->logits, err)) {
        return -1;
    }
    return sample(me, q, out);
}

static void seq_free(mr_engine *e, void *seq) { mseq_free(seq); }

static void destroy(mr_engine *e)
{
    model_engine *me = (model_engine *)e;
    mr_model_free(me->m);
    mr_backend_destroy(me->be);
    free(me);
}

mr_engine *mr_engine_model(const char *path, const char *backend, int device, const char *name, int n_ctx,
                           int n_seqs, mr_err *err)
{
    model_engine *me = calloc(1, sizeof *me);
    if (!me) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    if (!strcmp(backend, "cuda") && device >= 0)
        me->be = mr_backend_cuda_create(device, err);
    else
        me->be = mr_backend_create(backend, err);
    if (!me->be) {
        free(me);
        return NULL;
    }
    mr_model_opts opts = {.n_ctx = n_ctx, .n_seqs = n_seqs};
    if (mr_model_load(path, me->be, &opts, &me->m, err)) {
        mr_backend_destroy(me->be);
        free(me);
        return NULL;
    }
    const mr_hparams *hp = mr_model_hparams(me->m);
    me->n_vocab = hp->n_vocab;
    /* end-of-generation ids the GGUF names (the gateway sends the
     * tokenizer's full list with each request as well) */
    mr_gguf *g = NULL;
    mr_err e2;
    if (!mr_gguf_open(path, &g, &e2)) {
        static const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                     "tokenizer.ggml.eom_token_id"};
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            uint32_t id;
            if (mr_gguf_find(g, keys[i]) && !mr_gguf_get_u32(g, keys[i], &id, &e2) && (int)id < me->n_vocab)
                me->eos[me->n_eos++] = (int32_t)id;
        }
        mr_gguf_close(g);
    }
    me->super.name = backend;
    snprintf(me->super.model_name, sizeof me->super.model_name, "%s", name ? name : path);
    me->super.n_ctx = (uint32_t)mr_model_n_ctx(me->m);
    me->super.n_vocab = (uint32_t)me->n_vocab;
    me->super.seq_new = seq_new;
    me->super.seq_step = seq_step;
    me->super.seq_free = seq_free;
    me->super.destroy = destroy;
    return &me->super;
}

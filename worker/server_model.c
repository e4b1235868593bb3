/* The worker's real engine: a GGUF model on a backend (worker/model.h),
 * one KV sequence per request, one batched forward step per pass over the
 * running requests (round: every weight is read once per step, and a
 * sequence's logits do not depend on its batchmates), and sampling on the
 * host by worker/sample.h
 * (penalties, temperature, top-k, min-p, top-p, a per-request seeded
 * stream; its header documents the order).  Plain greedy requests without
 * logprobs let the backend pick the argmax, so no logits row comes back.
 * Log-probabilities are those of the model's distribution (log-softmax of
 * the raw logits), as OpenAI reports them. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "common/log.h"
#include "worker/model.h"
#include "worker/sample.h"
#include "worker/server.h"

typedef struct mseq mseq;

typedef struct model_engine {
    mr_engine super;
    mr_backend *be;
    mr_model *m;
    mr_sampler *sampler; /* sequences are sampled one at a time: one sampler serves all */
    int n_slots;         /* sequences at once (the model's n_seqs) */
    mseq **slot;         /* [n_slots]: the sequence in each, or NULL */
    float *logits;       /* [n_slots][n_vocab]: a slot's row of the last step */
    int32_t *picked;     /* [n_slots]: a slot's backend argmax of the last step */
    mr_batch_item *items;/* [n_slots] */
    float *work;         /* [n_vocab] penalised copy when raw logits are needed after sampling */
    int n_vocab;
    int32_t eos[4];
    int n_eos;
    uint64_t seed_counter;
} model_engine;

struct mseq {
    int slot;
    mr_seq *s;
    int32_t *tokens;    /* prompt, then generated ids: [n_prompt + max_tokens] */
    int n_prompt, n_gen;
    mr_sample_params sp;
    mr_rng rng;
    bool argmax;        /* mr_sample_plain_greedy and no logprobs: the backend picks */
    bool logprobs;
    uint32_t top_logprobs;
    bool ready;         /* the last round ran it: its row (or err) waits */
    bool failed;
    mr_err err;
};

static void mseq_free(mseq *q)
{
    if (q->s)
        mr_seq_free(q->s);
    free(q->tokens);
    free(q);
}

static void *seq_new(mr_engine *e, const mr_msg *req, mr_err *err)
{
    model_engine *me = (model_engine *)e;
    int slot = 0;
    while (slot < me->n_slots && me->slot[slot])
        slot++;
    if (slot == me->n_slots) {
        mr_errf(err, "all %d sequence slots are busy", me->n_slots);
        return NULL;
    }
    mseq *q = calloc(1, sizeof *q);
    if (!q || !(q->tokens = malloc(((size_t)req->n_tokens + req->max_tokens) * sizeof *q->tokens))) {
        free(q);
        mr_errf(err, "out of memory");
        return NULL;
    }
    q->slot = slot;
    if (mr_seq_new(me->m, &q->s, err)) {
        mseq_free(q);
        return NULL;
    }
    for (uint32_t i = 0; i < req->n_tokens; i++)
        q->tokens[i] = (int32_t)req->tokens[i];
    q->n_prompt = (int)req->n_tokens;
    const mr_sampling *w = &req->samp; /* the wire form, validated by the decoder */
    q->sp = (mr_sample_params){
        .temperature = w->temperature,
        .top_k = w->top_k > INT_MAX ? 0 : (int)w->top_k, /* beyond any vocabulary: off */
        .top_p = w->top_p,
        .min_p = w->min_p,
        .presence_penalty = w->presence_penalty,
        .frequency_penalty = w->frequency_penalty,
        .repetition_penalty = w->repetition_penalty,
        .seed = w->has_seed ? w->seed : (uint64_t)time(NULL) ^ (++me->seed_counter << 20) ^ req->id,
    };
    mr_rng_seed(&q->rng, q->sp.seed);
    q->logprobs = w->logprobs;
    q->top_logprobs = w->top_logprobs < MR_MSG_MAX_TOP_LOGPROBS ? w->top_logprobs : MR_MSG_MAX_TOP_LOGPROBS;
    q->argmax = !q->logprobs && mr_sample_plain_greedy(&q->sp);
    me->slot[slot] = q;
    return q;
}

/* The log-softmax normaliser of l[0..V) and its k largest entries (ties:
 * lower id first) in one pass plus one for the sum: no sort. */
static void logprob_stats(const float *l, int V, uint32_t k, mr_step *out, double *lse)
{
    float mx = l[0];
    uint32_t n = 0;
    for (int i = 0; i < V; i++) {
        float v = l[i];
        if (v > mx)
            mx = v;
        if (k == 0 || v != v || (n == k && !(v > l[out->top_ids[k - 1]])))
            continue; /* not among the k best so far (NaN never is) */
        uint32_t j = n < k ? n++ : k - 1;
        for (; j > 0 && v > l[out->top_ids[j - 1]]; j--)
            out->top_ids[j] = out->top_ids[j - 1];
        out->top_ids[j] = (uint32_t)i;
    }
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)l[i] - mx);
    *lse = mx + log(sum);
    for (uint32_t j = 0; j < n; j++)
        out->top_lps[j] = (float)(l[out->top_ids[j]] - *lse);
    out->n_top = n;
}

/* q's part of a step: the prompt on its first step, then its last id. */
static mr_batch_item item_of(model_engine *me, mseq *q)
{
    int len = mr_seq_len(q->s);
    return (mr_batch_item){.seq = q->s,
                           .tokens = q->tokens + len,
                           .n = q->n_prompt + q->n_gen - len,
                           .mode = q->argmax ? MR_LOGITS_ARGMAX : MR_LOGITS_LAST,
                           .logits = me->logits + (size_t)q->slot * (size_t)me->n_vocab,
                           .argmax = me->picked + q->slot};
}

/* Runs one sequence alone; its outcome waits in q. */
static void run_alone(model_engine *me, mseq *q)
{
    mr_batch_item it = item_of(me, q);
    q->failed = mr_model_forward_batch(me->m, &it, 1, &q->err) != 0;
    q->ready = true;
}

/* One forward step over every sequence, in slot order (adjacent rows come
 * back in one copy). */
static void round_all(mr_engine *e)
{
    model_engine *me = (model_engine *)e;
    int n = 0;
    for (int i = 0; i < me->n_slots; i++)
        if (me->slot[i])
            me->items[n++] = item_of(me, me->slot[i]);
    if (n == 0)
        return;
    mr_err err;
    if (!mr_model_forward_batch(me->m, me->items, n, &err)) {
        for (int i = 0; i < me->n_slots; i++)
            if (me->slot[i]) {
                me->slot[i]->ready = true;
                me->slot[i]->failed = false;
            }
        return;
    }
    /* nothing ran: one request's failure (e.g. no KV block left) must not
     * fail its batchmates, so each runs alone and keeps its own outcome */
    for (int i = 0; i < me->n_slots; i++)
        if (me->slot[i])
            run_alone(me, me->slot[i]);
}

static int seq_step(mr_engine *e, void *seq, mr_step *out, mr_err *err)
{
    model_engine *me = (model_engine *)e;
    mseq *q = seq;
    if (!q->ready)
        run_alone(me, q); /* stepped without a round */
    q->ready = false;
    if (q->failed) {
        *err = q->err;
        return -1;
    }
    int32_t tok = me->picked[q->slot];
    if (!q->argmax) {
        double lse = 0;
        float *row = me->logits + (size_t)q->slot * (size_t)me->n_vocab, *l = row;
        if (q->logprobs) {
            logprob_stats(row, me->n_vocab, q->top_logprobs, out, &lse);
            if (mr_sample_penalized(&q->sp)) {
                /* penalties rewrite the row in place: keep the raw one */
                memcpy(me->work, row, (size_t)me->n_vocab * sizeof *row);
                l = me->work;
            }
        }
        tok = mr_sample(me->sampler, &q->sp, &q->rng, l, q->tokens, q->n_prompt, q->tokens + q->n_prompt,
                        q->n_gen);
        if (q->logprobs)
            out->logprob = (float)(row[tok] - lse);
    }
    out->token = (uint32_t)tok;
    for (int i = 0; i < me->n_eos; i++)
        if (tok == me->eos[i])
            out->eos = true;
    q->tokens[q->n_prompt + q->n_gen++] = tok;
    return 0;
}

static void seq_free(mr_engine *e, void *seq)
{
    model_engine *me = (model_engine *)e;
    mseq *q = seq;
    me->slot[q->slot] = NULL;
    mseq_free(q);
}

static void destroy(mr_engine *e)
{
    model_engine *me = (model_engine *)e;
    mr_sampler_free(me->sampler);
    free(me->slot);
    free(me->logits);
    free(me->picked);
    free(me->items);
    free(me->work);
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
    me->n_slots = n_seqs > 0 ? n_seqs : 1;
    me->slot = calloc((size_t)me->n_slots, sizeof *me->slot);
    me->logits = malloc((size_t)me->n_slots * (size_t)me->n_vocab * sizeof *me->logits);
    me->picked = calloc((size_t)me->n_slots, sizeof *me->picked);
    me->items = calloc((size_t)me->n_slots, sizeof *me->items);
    me->work = malloc((size_t)me->n_vocab * sizeof *me->work);
    if (mr_sampler_new(me->n_vocab, &me->sampler, err) || !me->slot || !me->logits || !me->picked ||
        !me->items || !me->work) {
        if (me->sampler)
            mr_errf(err, "out of memory");
        destroy(&me->super);
        return NULL;
    }
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
    me->super.round = round_all;
    me->super.destroy = destroy;
    return &me->super;
}

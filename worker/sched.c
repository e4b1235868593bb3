/* Continuous batching: admission with KV reservations, chunked prefill
 * interleaved with decode, sampling, events, prefix-cache publishing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/constrain.h"
#include "worker/sched.h"
#include "worker/sched_spec.h"

typedef struct req {
    uint64_t id;
    int32_t *tokens;       /* prompt, then generated ids: [n_prompt + max_tokens] */
    int n_prompt, n_gen, max_tokens;
    int32_t *stop;
    int n_stop;
    mr_sample_params sp;
    /* MR_LOGITS_ARGMAX (plain greedy: the backend picks), MR_LOGITS_SAMPLE
     * (the backend samples) or MR_LOGITS_LAST (the host samples the row) */
    mr_logits_mode pick;
    mr_rng rng;
    int32_t *pen;          /* SAMPLE with penalties: its penalty table (backend memory) */
    bool pen_reset;        /* the table held another request's ids: emptied at its next row */
    int pen_prompt, pen_gen; /* prompt and generated ids the table has been given */
    char *tenant, *salt;
    mr_seq *seq;           /* its length: tokens already through forward */
    int cached;            /* prompt tokens that came from the prefix cache */
    int state_offered;     /* hybrids: the boundary (tokens) whose state the cache already got */
    int checkpoint_at;     /* a prompt block boundary (tokens) to publish when reached (a hybrid's
                              with its state), 0: none */
    bool session;          /* publish as session entries */
    bool waits;            /* this step: its batchmate computes the prefix they share (settle_fresh) */
    uint64_t looked;       /* the cache's growth (cache_growth) when it last looked there */
    bool want_logits;      /* TOKEN events carry the raw row */
    bool spec_ok;          /* plain greedy on a model that speculates: may decode speculatively */
    mr_spec_state spec;    /* its first draft for the next speculative step */
    mr_grammar *grammar;   /* the output must follow it (NULL: free) */
    mr_gmatch *gm;         /* what of it the output has matched so far */
    bool cancelled;
    bool done;
    mr_finish_reason reason;
    int32_t stop_token;
} req;

struct mr_sched {
    mr_model *m;
    mr_sched_opts o;
    mr_sched_cb cb;
    void *user;
    int n_vocab, n_ctx, bt;
    mr_prefix *prefix;
    mr_sampler *sampler;
    req **live;            /* [max_seqs], admission order */
    int n_live;
    mr_batch_item *items;  /* [max_seqs] */
    req **item_req;        /* [max_seqs] */
    float *logits;         /* [max_seqs][n_vocab] */
    float *raw;            /* [n_vocab] a want_logits row before sampling rewrites it */
    int32_t *argmax;       /* [max_seqs] ids picked by the backend (ARGMAX, SAMPLE) */
    mr_sample_row *rows;   /* [max_seqs] the SAMPLE items' rows */
    uint32_t *mask;        /* [n_vocab / 32 rounded up] a grammar request's allowed tokens */
    int32_t **pen_free;    /* [max_seqs] penalty tables no request holds, kept for the next */
    int n_pen_free;
    uint64_t steps, step_tokens_total, admitted, refused, finished;
    bool stateful;         /* hybrid model: cached prefixes need state checkpoints */
    mr_sched_spec *spec;   /* MTP speculation (opts.spec_k > 0 and an MTP block), or NULL */
};

static void state_free(void *ctx, void *state) { mr_model_state_free(ctx, state); }

/* Grows whenever the cache takes a block or a checkpoint: a lookup can find
 * a longer run than before only then. */
static uint64_t cache_growth(const mr_sched *s)
{
    mr_prefix_stats ps;
    mr_prefix_get_stats(s->prefix, &ps);
    return ps.inserted_blocks + ps.attached_states;
}

/* A penalty table for q: a kept one, or a new one (NULL: none to be had). */
static int32_t *pen_take(mr_sched *s)
{
    return s->n_pen_free > 0 ? s->pen_free[--s->n_pen_free] : mr_model_sample_table_new(s->m);
}

static void req_free(mr_sched *s, req *r)
{
    if (!r)
        return;
    if (r->pen) /* at most max_seqs tables exist: there is room */
        s->pen_free[s->n_pen_free++] = r->pen;
    mr_seq_free(r->seq);
    mr_gmatch_free(r->gm);
    mr_grammar_free(r->grammar);
    free(r->tokens);
    free(r->stop);
    free(r->tenant);
    free(r->salt);
    free(r);
}

int mr_sched_new(mr_model *m, const mr_sched_opts *opts, mr_sched_cb cb, void *user, mr_sched **out,
                 mr_err *err)
{
    *out = NULL;
    if (!m || !cb)
        return mr_errf(err, "scheduler: needs a model and a callback");
    mr_sched_opts o = opts ? *opts : (mr_sched_opts){0};
    if (o.max_seqs <= 0)
        o.max_seqs = 64;
    if (o.chunk_tokens <= 0)
        o.chunk_tokens = MR_SCHED_CHUNK_DEFAULT;
    if (o.step_tokens <= 0)
        o.step_tokens = o.max_seqs + o.chunk_tokens;
    if (o.max_seqs > 65536 || o.step_tokens > (1 << 20))
        return mr_errf(err, "scheduler: max_seqs %d / step_tokens %d too large", o.max_seqs, o.step_tokens);
    if (o.step_tokens < o.max_seqs)
        return mr_errf(err, "scheduler: step_tokens %d must be at least max_seqs %d (one decode token each)",
                       o.step_tokens, o.max_seqs);
    if (o.default_max_tokens < 0)
        o.default_max_tokens = 0;
    if (o.spec_k < 0 || o.spec_k > 8)
        return mr_errf(err, "scheduler: spec_k %d, need 0 (off) .. 8", o.spec_k);
    mr_sched *s = calloc(1, sizeof *s);
    if (!s)
        return mr_errf(err, "out of memory");
    s->m = m;
    s->o = o;
    s->cb = cb;
    s->user = user;
    s->n_vocab = mr_model_hparams(m)->n_vocab;
    s->n_ctx = mr_model_n_ctx(m);
    s->bt = mr_model_block_tokens(m);
    if (o.vocab && mr_constrain_vocab_check(o.vocab, s->n_vocab, err))
        goto fail;
    mr_kv_pool *pool = mr_model_kv_pool(m);
    int cap = o.prefix_blocks < 0 ? 0 : o.prefix_blocks == 0 ? mr_kv_pool_size(pool) : o.prefix_blocks;
    if (mr_prefix_new(pool, s->bt, cap, &s->prefix, err) || mr_sampler_new(s->n_vocab, &s->sampler, err))
        goto fail;
    /* K/V blocks alone do not hold a recurrent model's state: a hybrid's
     * cached prefixes carry a checkpoint of it at their last block, one per
     * sequence slot (the room mr_model_load leaves for them) */
    s->stateful = cap > 0 && mr_seq_state_bytes(m) > 0;
    mr_model_set_checkpoints(m, s->stateful);
    if (s->stateful)
        mr_prefix_set_states(s->prefix, o.max_seqs, state_free, m);
    if (o.spec_k > 0 && mr_spec_supported(m) &&
        mr_sched_spec_new(m, o.spec_k, o.spec_drafter.replace ? &o.spec_drafter : NULL, &s->spec, err))
        goto fail;
    s->live = calloc((size_t)o.max_seqs, sizeof *s->live);
    s->items = calloc((size_t)o.max_seqs, sizeof *s->items);
    s->item_req = calloc((size_t)o.max_seqs, sizeof *s->item_req);
    s->logits = malloc(sizeof(float) * (size_t)o.max_seqs * (size_t)s->n_vocab);
    s->argmax = calloc((size_t)o.max_seqs, sizeof *s->argmax);
    s->raw = malloc(sizeof(float) * (size_t)s->n_vocab);
    s->rows = calloc((size_t)o.max_seqs, sizeof *s->rows);
    s->pen_free = calloc((size_t)o.max_seqs, sizeof *s->pen_free);
    s->mask = malloc(sizeof(uint32_t) * (((size_t)s->n_vocab + 31) / 32));
    if (!s->live || !s->items || !s->item_req || !s->logits || !s->argmax || !s->raw || !s->rows || !s->pen_free ||
        !s->mask) {
        mr_errf(err, "scheduler: out of memory for %d sequences", o.max_seqs);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    mr_sched_free(s);
    return -1;
}

void mr_sched_free(mr_sched *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_live; i++)
        req_free(s, s->live[i]);
    for (int i = 0; i < s->n_pen_free; i++)
        mr_model_sample_table_free(s->m, s->pen_free[i]);
    mr_prefix_free(s->prefix);
    mr_sampler_free(s->sampler);
    mr_sched_spec_free(s->spec);
    free(s->live);
    free(s->items);
    free(s->item_req);
    free(s->logits);
    free(s->argmax);
    free(s->raw);
    free(s->rows);
    free(s->pen_free);
    free(s->mask);
    free(s);
}

/* ---- admission ---- */

static int validate(const mr_sched *s, const mr_request *r, mr_err *err)
{
    if (!r->prompt || r->n_prompt <= 0)
        return mr_errf(err, "request %llu: empty prompt", (unsigned long long)r->id);
    if (r->n_prompt >= s->n_ctx)
        return mr_errf(err, "request %llu: prompt of %d tokens leaves no room in the context of %d",
                       (unsigned long long)r->id, r->n_prompt, s->n_ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->n_vocab)
            return mr_errf(err, "request %llu: token id %d (index %d) is out of range [0, %d)",
                           (unsigned long long)r->id, r->prompt[i], i, s->n_vocab);
    if (r->n_stop < 0 || r->n_stop > 1024 || (r->n_stop > 0 && !r->stop_ids))
        return mr_errf(err, "request %llu: %d stop ids (at most 1024)", (unsigned long long)r->id, r->n_stop);
    if (mr_sampling_check(&r->sampling, err))
        return mr_err_wrap(err, "request %llu", (unsigned long long)r->id);
    if (r->grammar && r->grammar[0] && !s->o.vocab)
        return mr_errf(err, "request %llu: grammars are not available: the worker has no vocabulary for this model",
                       (unsigned long long)r->id);
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->id == r->id)
            return mr_errf(err, "request %llu: id already in use", (unsigned long long)r->id);
    return 0;
}

static char *dup_or_empty(const char *x) { return strdup(x ? x : ""); }

/* Cached full blocks of q's prompt (at least its last token is always
 * computed, because its logits are needed), when the cache has a run longer
 * than more_than tokens: attached to *seq (made here with mr_seq_new when
 * NULL), with q->cached, state_offered and checkpoint_at set to match.
 * Returns 1 when attached, 0 when the cache has no longer run, -1 on error
 * (a sequence made here is freed).
 *
 * A hybrid can start only where a checkpoint is.  When more of the prompt
 * has cached K/V than has a checkpoint (another prompt went on past the part
 * they share: a common system prompt with different questions), the state
 * at the end of the shared part is taken when this prompt gets there, so the
 * next one that shares it starts from it. */
static int take_cached(mr_sched *s, req *q, mr_seq **seq, int more_than, mr_err *err)
{
    int max_hit = (q->n_prompt - 1) / s->bt;
    int32_t *hit = malloc(sizeof(int32_t) * (size_t)(max_hit > 0 ? max_hit : 1));
    if (!hit)
        return mr_errf(err, "request %llu: out of memory", (unsigned long long)q->id);
    int n_kv = 0;
    void *state = NULL;
    int n_hit = s->stateful ? mr_prefix_lookup_state(s->prefix, q->tenant, q->salt, q->tokens, q->n_prompt,
                                                     max_hit, hit, &state, &n_kv)
                            : mr_prefix_lookup(s->prefix, q->tenant, q->salt, q->tokens, q->n_prompt, max_hit, hit);
    int rc = n_hit * s->bt > more_than;
    mr_seq *made = NULL;
    if (rc && !*seq && mr_seq_new(s->m, &made, err))
        rc = -1;
    if (rc > 0 && (n_hit > 0 && state ? mr_seq_attach_state(made ? made : *seq, hit, n_hit, state, err)
                                      : mr_seq_attach(made ? made : *seq, hit, n_hit, err))) {
        mr_seq_free(made);
        rc = -1;
    }
    free(hit);
    if (rc <= 0)
        return rc;
    if (made)
        *seq = made;
    q->cached = n_hit * s->bt;
    if (state)
        q->state_offered = q->cached; /* it came from there */
    q->checkpoint_at = n_kv > n_hit ? n_kv * s->bt : 0;
    return 1;
}

int mr_sched_warmup(mr_sched *s, mr_err *err)
{
    /* the largest step: a decode row for every request and prompt chunks
     * up to the step's budget; every decode row may want logits */
    return mr_model_warmup(s->m, s->o.step_tokens, s->o.max_seqs, err);
}

int mr_sched_submit(mr_sched *s, const mr_request *r, mr_err *err)
{
    if (validate(s, r, err))
        return MR_SCHED_INVALID;
    if (s->n_live >= s->o.max_seqs) {
        s->refused++;
        mr_errf(err, "request %llu: all %d sequence slots are busy", (unsigned long long)r->id, s->o.max_seqs);
        return MR_SCHED_NO_CAPACITY;
    }
    int max_tokens = r->max_tokens > 0 ? r->max_tokens : s->o.default_max_tokens;
    if (max_tokens <= 0 || max_tokens > s->n_ctx - r->n_prompt)
        max_tokens = s->n_ctx - r->n_prompt;

    req *q = calloc(1, sizeof *q);
    if (!q)
        goto oom;
    q->id = r->id;
    q->n_prompt = r->n_prompt;
    q->max_tokens = max_tokens;
    q->sp = r->sampling;
    q->want_logits = r->want_logits;
    bool constrained = r->grammar && r->grammar[0];
    /* where the id is picked: log-probabilities need the row on the host;
     * else the backend picks a plain greedy id, and samples where it can
     * (and has room for the penalty table, if any) */
    q->pick = MR_LOGITS_LAST;
    if (constrained) {
        /* the grammar's mask is applied to the row on the host */
    } else if (!q->want_logits && mr_sample_plain_greedy(&q->sp)) {
        q->pick = MR_LOGITS_ARGMAX;
    } else if (!q->want_logits && mr_model_can_sample(s->m)) {
        q->pick = MR_LOGITS_SAMPLE;
        if (mr_sample_penalized(&q->sp)) {
            q->pen = pen_take(s);
            q->pen_reset = true;
            if (!q->pen)
                q->pick = MR_LOGITS_LAST;
        }
    }
    /* speculation verifies drafts against the argmax: exact for plain
     * greedy only */
    q->spec_ok = s->spec && q->pick == MR_LOGITS_ARGMAX;
    mr_rng_seed(&q->rng, r->sampling.seed);
    q->stop_token = -1;
    q->tokens = malloc(sizeof(int32_t) * ((size_t)r->n_prompt + (size_t)max_tokens));
    q->stop = malloc(sizeof(int32_t) * (size_t)(r->n_stop > 0 ? r->n_stop : 1));
    q->tenant = dup_or_empty(r->tenant);
    q->salt = dup_or_empty(r->cache_salt);
    if (!q->tokens || !q->stop || !q->tenant || !q->salt)
        goto oom;
    memcpy(q->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (r->n_stop > 0)
        memcpy(q->stop, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop);
    q->n_stop = r->n_stop;
    q->session = r->session && r->session[0];
    if (mr_seq_new(s->m, &q->seq, err))
        goto fail;

    if (take_cached(s, q, &q->seq, -1, err) < 0)
        goto fail;
    q->looked = cache_growth(s);

    /* Reserve the K/V of every position it may fill: the prompt and all but
     * the last generated token.  Unused cached blocks make way if needed. */
    int need_tokens = r->n_prompt + max_tokens - 1;
    int n_hit = q->cached / s->bt;
    int need = (need_tokens + s->bt - 1) / s->bt - n_hit;
    mr_kv_pool *pool = mr_model_kv_pool(s->m);
    mr_err tmp;
    bool fits = mr_seq_reserve(q->seq, need_tokens, &tmp) == 0;
    if (!fits) {
        /* cached blocks no sequence holds bound what eviction can free: when
         * even all of them would not do, refuse without evicting anything */
        mr_prefix_stats ps;
        mr_prefix_get_stats(s->prefix, &ps);
        fits = need <= mr_kv_pool_available(pool) + (ps.n_blocks - ps.n_in_use);
        while (fits && mr_seq_reserve(q->seq, need_tokens, &tmp))
            fits = mr_prefix_evict_one(s->prefix);
    }
    if (!fits) {
        /* more than the whole pool (less the cached blocks it would share):
         * waiting cannot help */
        bool never = need > mr_kv_pool_size(pool) - n_hit;
        mr_errf(err, "request %llu: needs %d KV blocks (%d prompt + %d max tokens), %d %s",
                (unsigned long long)r->id, need, r->n_prompt, max_tokens,
                never ? mr_kv_pool_size(pool) : mr_kv_pool_available(pool),
                never ? "in the whole pool" : "available");
        req_free(s, q);
        s->refused++;
        return never ? MR_SCHED_TOO_LARGE : MR_SCHED_NO_CAPACITY;
    }
    /* compiled once it is admitted: a request that waits for room is
     * offered again every step, and would otherwise compile each time */
    if (constrained && (mr_grammar_parse(r->grammar, strlen(r->grammar), &q->grammar, err) ||
                        mr_gmatch_new(q->grammar, &q->gm, err))) {
        mr_err_wrap(err, "request %llu: grammar", (unsigned long long)r->id);
        goto fail;
    }
    mr_prefix_count(s->prefix, r->n_prompt, q->cached);
    s->live[s->n_live++] = q;
    s->admitted++;
    return MR_SCHED_OK;
oom:
    mr_errf(err, "request %llu: out of memory", (unsigned long long)r->id);
fail:
    req_free(s, q);
    return MR_SCHED_INVALID;
}

int mr_sched_cancel(mr_sched *s, uint64_t id)
{
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->id == id && !s->live[i]->done) {
            s->live[i]->cancelled = true;
            return 0;
        }
    return -1;
}

/* ---- retiring ---- */

/* Offers the first `full` blocks of q (their K/V) to the cache; for a
 * hybrid, full * bt must be its last block-boundary state, which goes with
 * them. */
static void publish_blocks(mr_sched *s, req *q, int full)
{
    const int32_t *blocks;
    int nb = mr_seq_blocks(q->seq, &blocks);
    if (full > nb)
        full = nb;
    if (full > 0 && q->session)
        mr_prefix_insert_session(s->prefix, q->tenant, q->salt, q->tokens, full, blocks);
    else if (full > 0)
        mr_prefix_insert(s->prefix, q->tenant, q->salt, q->tokens, full, blocks);
    /* a finish right after the prompt's publish often has the same boundary:
     * the cache has that state already, no second copy */
    if (full > 0 && s->stateful && full * s->bt != q->state_offered) {
        q->state_offered = full * s->bt;
        void *st = mr_model_state_alloc(s->m);
        if (st) {
            mr_seq_mark_save(q->seq, st);
            if (!mr_prefix_attach_state(s->prefix, q->tenant, q->salt, q->tokens, full, st))
                mr_model_state_free(s->m, st);
        }
    }
}

/* All full blocks of tokens[0..len); a hybrid's up to its last block-boundary
 * state. */
static void publish(mr_sched *s, req *q)
{
    publish_blocks(s, q, (s->stateful ? mr_seq_mark_len(q->seq) : mr_seq_len(q->seq)) / s->bt);
}

static void finish(mr_sched *s, req *q, mr_finish_reason reason, const char *error)
{
    if (reason != MR_SCHED_FIN_ERROR)
        publish(s, q);
    mr_sched_event ev = {
        .type = MR_EV_FINISH,
        .id = q->id,
        .token = reason == MR_SCHED_FIN_STOP ? q->stop_token : -1,
        .reason = reason,
        .usage = {.prompt_tokens = q->n_prompt, .completion_tokens = q->n_gen, .cached_tokens = q->cached},
        .error = error,
    };
    q->done = true;
    s->finished++;
    s->cb(s->user, &ev);
}

/* Frees the requests that are done, keeping the others in order. */
static void sweep(mr_sched *s)
{
    int k = 0;
    for (int i = 0; i < s->n_live; i++) {
        if (s->live[i]->done)
            req_free(s, s->live[i]);
        else
            s->live[k++] = s->live[i];
    }
    s->n_live = k;
}

static void drop_cancelled(mr_sched *s)
{
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->cancelled && !s->live[i]->done)
            finish(s, s->live[i], MR_SCHED_FIN_CANCELLED, NULL);
    sweep(s);
}

/* ---- one step ---- */

static bool is_stop(const req *q, int32_t id)
{
    for (int i = 0; i < q->n_stop; i++)
        if (q->stop[i] == id)
            return true;
    return false;
}

/* Appends id to q's output and delivers it: FINISH/STOP for a stop id,
 * else its TOKEN event (raw: the row for want_logits), then FINISH/LENGTH
 * when it was the last one allowed. */
static void deliver(mr_sched *s, req *q, int32_t id, const float *raw)
{
    q->tokens[q->n_prompt + q->n_gen++] = id;
    if (is_stop(q, id)) {
        q->stop_token = id;
        finish(s, q, MR_SCHED_FIN_STOP, NULL);
        return;
    }
    size_t n_bytes = 0;
    const char *bytes = q->gm ? mr_constrain_piece(s->o.vocab, id, &n_bytes) : NULL;
    if (q->gm && !mr_gmatch_accept(q->gm, bytes, n_bytes)) {
        /* the mask allowed only ids it accepts: memory ran out */
        finish(s, q, MR_SCHED_FIN_ERROR, "grammar: out of memory matching the output");
        return;
    }
    mr_sched_event ev = {.type = MR_EV_TOKEN, .id = q->id, .token = id, .logits = raw};
    s->cb(s->user, &ev);
    if (q->done)
        return;
    if (q->gm && !mr_gmatch_can_continue(q->gm))
        finish(s, q, MR_SCHED_FIN_STOP, NULL); /* a whole sentence nothing can extend */
    else if (q->n_gen >= q->max_tokens)
        finish(s, q, MR_SCHED_FIN_LENGTH, NULL);
}

/* Bans from q's row every id its grammar does not allow next: the ids
 * whose bytes keep the output a prefix of a sentence, and the stop ids
 * exactly when the output is a whole sentence.  false: no id is allowed (q
 * is finished with an error). */
static bool constrain_row(mr_sched *s, req *q, float *logits)
{
    mr_err err;
    if (mr_constrain_mask(s->o.vocab, q->gm, s->mask, s->n_vocab, &err)) {
        finish(s, q, MR_SCHED_FIN_ERROR, err.msg);
        return false;
    }
    bool end = mr_gmatch_can_end(q->gm);
    for (int i = 0; i < q->n_stop; i++) {
        int32_t id = q->stop[i];
        if (id >= 0 && id < s->n_vocab)
            s->mask[id >> 5] = end ? s->mask[id >> 5] | 1u << (id & 31) : s->mask[id >> 5] & ~(1u << (id & 31));
    }
    bool any = false;
    for (int w = 0; w < (s->n_vocab + 31) / 32; w++) {
        uint32_t bits = s->mask[w];
        any |= bits != 0;
        if (bits == UINT32_MAX)
            continue;
        for (int i = w * 32, e = i + 32 < s->n_vocab ? i + 32 : s->n_vocab; i < e; i++)
            if (!(bits >> (i & 31) & 1))
                logits[i] = -INFINITY;
    }
    if (!any)
        finish(s, q, MR_SCHED_FIN_ERROR, "grammar: no token of the vocabulary can continue the output");
    return any;
}

/* Picks the next id of q (from the backend's argmax or by sampling its
 * logits row) and delivers it. */
static void advance(mr_sched *s, req *q, const mr_batch_item *it)
{
    const float *raw = NULL;
    if (q->want_logits && it->mode != MR_LOGITS_ARGMAX) {
        /* penalties rewrite the row in place: keep the model's own */
        memcpy(s->raw, it->logits, sizeof(float) * (size_t)s->n_vocab);
        raw = s->raw;
    }
    if (q->gm && !constrain_row(s, q, it->logits))
        return;
    int32_t id = it->mode == MR_LOGITS_ARGMAX || it->mode == MR_LOGITS_SAMPLE
                     ? *it->argmax
                     : mr_sample(s->sampler, &q->sp, &q->rng, it->logits, q->tokens, q->n_prompt,
                                 q->tokens + q->n_prompt, q->n_gen);
    deliver(s, q, id, raw);
}

/* One speculative step of q, the only live request (sched_spec.h): the
 * accepted drafts and the trunk's token after them, cut at the first stop
 * id and at max_tokens, each delivered as plain decoding would.  The
 * sequence must hold exactly the delivered tokens but the last before any
 * FINISH (which publishes its blocks), so a request that ends here is cut
 * back first; one that goes on gets its tokens first (they stream sooner)
 * and its state made exact after. */
static int spec_step(mr_sched *s, req *q, mr_err *err)
{
    int len = mr_seq_len(q->seq);
    const int32_t *cand;
    int n_cand;
    mr_sched_spec_stats before;
    mr_sched_spec_get_stats(s->spec, &before);
    if (mr_sched_spec_verify(s->spec, q->seq, &q->spec, q->tokens[len], q->n_gen, q->max_tokens - q->n_gen,
                             &cand, &n_cand, err))
        goto fail;
    int keep = 0;
    bool ends = false;
    while (keep < n_cand && !ends) {
        int32_t id = cand[keep++];
        ends = is_stop(q, id) || q->n_gen + keep >= q->max_tokens;
    }
    if (ends && mr_sched_spec_commit(s->spec, q->seq, &q->spec, keep, false, err))
        goto fail;
    int n = 0;
    while (n < keep && !q->done && !q->cancelled)
        deliver(s, q, cand[n++], NULL);
    if (!q->done && q->cancelled) {
        /* cancelled from a callback: the rest is not delivered */
        if (mr_seq_truncate(q->seq, q->n_prompt + q->n_gen - 1, err))
            goto fail;
    } else if (!ends && mr_sched_spec_commit(s->spec, q->seq, &q->spec, keep, true, err)) {
        goto fail;
    }
    mr_sched_spec_stats after;
    mr_sched_spec_get_stats(s->spec, &after);
    s->steps++;
    s->step_tokens_total += after.tokens - before.tokens;
    drop_cancelled(s);
    return s->n_live;
fail:
    if (!q->done)
        finish(s, q, MR_SCHED_FIN_ERROR, err->msg);
    drop_cancelled(s);
    return -1;
}

/* Whether item i of the step just run is a prompt chunk whose rows the MTP
 * block runs over: only for a request that may speculate (a plain greedy
 * one on a model with the block) and may still draft after its first token
 * (a step drafts at most max_tokens - n_gen - 1); other requests pay
 * nothing. */
static bool primes_chunk(const mr_sched *s, int i)
{
    const req *q = s->item_req[i];
    return !s->items[i].gen && q->spec_ok && !q->done && q->max_tokens > 2;
}

/* Keeps the hidden rows of every chunk to prime (items' rows are laid out
 * in item order) before the first MTP call overwrites the step's
 * activations. */
static int keep_chunk_rows(mr_sched *s, int n_items, mr_err *err)
{
    int rc = 0, row = 0;
    for (int i = 0; i < n_items; i++) {
        if (primes_chunk(s, i) && mr_sched_spec_keep_rows(s->spec, row, s->items[i].n, err)) {
            finish(s, s->item_req[i], MR_SCHED_FIN_ERROR, err->msg);
            rc = -1;
        }
        row += s->items[i].n;
    }
    return rc;
}

/* The MTP block over the prompt chunks of the step just run (sched_spec.h):
 * each chunk right after its own forward call, the only one that has its
 * hidden rows, so a prompt cut into chunks is primed over every position
 * it ran, and the last chunk (paired with the first generated id, which
 * the call picked: spec_ok requests are ARGMAX items) leaves the first
 * draft of the request's first speculative step.  Positions restored from
 * the prefix cache ran in no call of this request and are not primed:
 * their MTP K/V in the shared blocks are what the request that first ran
 * them wrote (its own priming when it could speculate, its last position
 * paired with the token that followed there; else stale entries); drafts
 * over them may be worse, the output is the same (every draft is
 * verified).  A request whose priming fails is finished with an error. */
static int prime_prompt_chunks(mr_sched *s, int n_items, mr_err *err)
{
    int rc = keep_chunk_rows(s, n_items, err), row = 0;
    for (int i = 0; i < n_items; i++) {
        const mr_batch_item *it = &s->items[i];
        req *q = s->item_req[i];
        if (primes_chunk(s, i)) {
            int end = mr_seq_len(q->seq);
            int32_t next = end < q->n_prompt ? q->tokens[end] : *it->argmax;
            if (mr_sched_spec_prime_chunk(s->spec, q->seq, &q->spec, row, it->tokens, it->n, next, err)) {
                finish(s, q, MR_SCHED_FIN_ERROR, err->msg);
                rc = -1;
            }
        }
        row += it->n;
    }
    return rc;
}

/* The sample op's row for q's next id: its parameters, the uniform its
 * host sampling would draw now (so a seeded request draws the same ids
 * wherever it is sampled), and the ids its penalty table has not had yet
 * (the whole prompt with the first row; then one generated id a step). */
static void stage_row(mr_sched *s, req *q, mr_batch_item *it, mr_sample_row *row)
{
    const mr_sample_params *p = &q->sp;
    *row = (mr_sample_row){
        .u = p->temperature > 0.0f ? mr_rng_uniform(&q->rng) : 0.5,
        .temperature = p->temperature,
        .top_p = p->top_p,
        .min_p = p->min_p,
        .presence = p->presence_penalty,
        .frequency = p->frequency_penalty,
        .repetition = p->repetition_penalty,
        .top_k = p->top_k,
        .table = q->pen,
    };
    it->sample = row;
    if (!q->pen)
        return;
    /* prompt then generated ids are adjacent in q->tokens, and the prompt
     * goes in whole before any generated id */
    row->reset = q->pen_reset;
    row->n_add_prompt = q->n_prompt - q->pen_prompt;
    row->n_add_gen = q->n_gen - q->pen_gen;
    it->sample_add = q->tokens + (row->n_add_prompt > 0 ? q->pen_prompt : q->n_prompt + q->pen_gen);
    q->pen_reset = false;
    q->pen_prompt = q->n_prompt;
    q->pen_gen = q->n_gen;
}

/* ---- prompts that share a prefix with a batchmate ----
 *
 * Requests admitted together (sixteen clients sending one long system
 * prompt) all miss the cache at admission: nothing of it is published yet.
 * Instead of each computing the shared part, a request that has computed
 * nothing of its own waits while an older one in the same scope is still
 * prefilling a longer part of its prompt; the older one publishes its blocks
 * (and, for a hybrid, the recurrent state) when it reaches the end of what
 * they share, and the waiting one then takes them from the cache.  The
 * blocks hold the same K/V either way: a prompt row's result does not
 * depend on its call (docs/NUMERICS.md). */

/* Full blocks at the start of a's prompt that b's prompt holds too, in the
 * same scope; at most what a may take from the cache (its last token is
 * always computed). */
static int shared_blocks(const mr_sched *s, const req *a, const req *b)
{
    if (strcmp(a->tenant, b->tenant) || strcmp(a->salt, b->salt))
        return 0;
    int n = a->n_prompt - 1 < b->n_prompt ? a->n_prompt - 1 : b->n_prompt, i = 0;
    while (i < n && a->tokens[i] == b->tokens[i])
        i++;
    return i / s->bt;
}

/* q has computed nothing of its own (only cached blocks): it takes a longer
 * cached run if the cache has one now, as at admission.  0: done or nothing
 * new; -1: q's sequence could not be rebuilt (err says why). */
static int adopt_cached(mr_sched *s, req *q, mr_err *err)
{
    const int before = q->cached;
    mr_seq *seq = NULL; /* the new sequence holds the blocks before the old one lets go */
    int rc = take_cached(s, q, &seq, before, err);
    if (rc <= 0)
        return rc;
    mr_seq_free(q->seq); /* its promise goes back first: the new one needs less */
    q->seq = seq;
    if (mr_seq_reserve(seq, q->n_prompt + q->max_tokens - 1, err))
        return -1;
    mr_prefix_count(s->prefix, 0, q->cached - before);
    return 0;
}

/* What q (nothing computed of its own) does about an older request in the
 * same scope that is still prefilling and holds more of q's prompt than q
 * has: BM_TAKE when that one has computed the shared part already (it
 * publishes it now, and q takes it from the cache), BM_WAIT while it has
 * not (it is asked to publish when it gets there: checkpoint_at), BM_GO when
 * there is none.  A hybrid's shared part is to be had only with its state,
 * at the boundary where it was computed: one that went past it without
 * keeping that state is no use to q. */
enum { BM_GO, BM_WAIT, BM_TAKE };

static int batchmate(mr_sched *s, int qi)
{
    req *q = s->live[qi];
    const int have = mr_seq_len(q->seq);
    for (int i = 0; i < qi; i++) {
        req *p = s->live[i];
        const int plen = mr_seq_len(p->seq);
        if (p->done || p->cancelled || plen >= p->n_prompt)
            continue;
        const int at = shared_blocks(s, q, p) * s->bt;
        if (at <= have)
            continue;
        if (plen >= at && (!s->stateful || mr_seq_mark_len(p->seq) == at)) {
            publish_blocks(s, p, at / s->bt);
            return BM_TAKE;
        }
        if (plen > at)
            continue;
        if (p->checkpoint_at == 0 || p->checkpoint_at > at)
            p->checkpoint_at = at;
        return BM_WAIT;
    }
    return BM_GO;
}

/* Before a step's chunks are cut: each request that has computed nothing
 * of its own takes what the cache gained since it last looked, then waits
 * (q->waits) while an older batchmate computes the prefix they share; done
 * in admission order before any chunk is cut, so that the batchmate's chunk
 * of this step already ends where it is to publish. */
static void settle_fresh(mr_sched *s)
{
    for (int i = 0; i < s->n_live; i++) {
        req *q = s->live[i];
        q->waits = false;
        const int len = mr_seq_len(q->seq);
        if (q->done || len >= q->n_prompt || len != q->cached)
            continue;
        mr_err err;
        int bm = BM_GO;
        if ((q->looked != cache_growth(s) && adopt_cached(s, q, &err)) ||
            ((bm = batchmate(s, i)) == BM_TAKE && adopt_cached(s, q, &err))) {
            finish(s, q, MR_SCHED_FIN_ERROR, err.msg);
            continue;
        }
        q->looked = cache_growth(s);
        q->waits = bm == BM_WAIT;
    }
}

int mr_sched_step(mr_sched *s, mr_err *err)
{
    mr_err local;
    if (!err)
        err = &local;
    drop_cancelled(s);
    if (s->n_live == 0)
        return 0;
    /* alone and decoding: speculation cannot cost another request its
     * place in a batch */
    if (s->spec && s->n_live == 1 && s->live[0]->spec_ok &&
        mr_seq_len(s->live[0]->seq) >= s->live[0]->n_prompt)
        return spec_step(s, s->live[0], err);
    int budget = s->o.step_tokens, n_items = 0;
    /* decoding requests first: one token each (the last id sampled) */
    for (int i = 0; i < s->n_live && budget > 0; i++) {
        req *q = s->live[i];
        int len = mr_seq_len(q->seq);
        if (len < q->n_prompt)
            continue;
        s->item_req[n_items] = q;
        s->items[n_items] = (mr_batch_item){.seq = q->seq, .tokens = q->tokens + len, .n = 1, .mode = q->pick,
                                            .logits = s->logits + (size_t)n_items * (size_t)s->n_vocab,
                                            .argmax = s->argmax + n_items, .gen = true};
        n_items++;
        budget--;
    }
    /* then prompt chunks, oldest admission first, but for requests that
     * wait for a batchmate's prefix */
    settle_fresh(s);
    for (int i = 0; i < s->n_live && budget > 0; i++) {
        req *q = s->live[i];
        int len = mr_seq_len(q->seq);
        if (q->done || q->waits || len >= q->n_prompt)
            continue;
        int n = q->n_prompt - len;
        if (n > s->o.chunk_tokens)
            n = s->o.chunk_tokens;
        if (n > budget)
            n = budget;
        /* a hybrid's chunk that would run past a block boundary ends on it
         * (the prompt's last one too, at the cost of a step), so the state
         * there can be checkpointed */
        if (s->stateful && (len + n) % s->bt && (len + n) / s->bt * s->bt > len)
            n = (len + n) / s->bt * s->bt - len;
        if (q->checkpoint_at > len && len + n > q->checkpoint_at)
            n = q->checkpoint_at - len; /* block-aligned: stops where the checkpoint is wanted */
        bool last = len + n == q->n_prompt;
        mr_logits_mode mode = last ? q->pick : MR_LOGITS_NONE;
        s->item_req[n_items] = q;
        s->items[n_items] = (mr_batch_item){.seq = q->seq, .tokens = q->tokens + len, .n = n, .mode = mode,
                                            .logits = s->logits + (size_t)n_items * (size_t)s->n_vocab,
                                            .argmax = s->argmax + n_items};
        n_items++;
        budget -= n;
    }
    if (n_items == 0) { /* the requests left finished in settle_fresh (an error taking cached blocks) */
        drop_cancelled(s);
        return s->n_live;
    }
    for (int i = 0; i < n_items; i++)
        if (s->items[i].mode == MR_LOGITS_SAMPLE)
            stage_row(s, s->item_req[i], &s->items[i], &s->rows[i]);
    int rc = 0;
    if (s->spec)
        mr_sched_spec_invalidate(s->spec); /* the MTP block's hidden rows are gone */
    if (mr_model_forward_batch(s->m, s->items, n_items, err)) {
        for (int i = 0; i < n_items; i++)
            finish(s, s->item_req[i], MR_SCHED_FIN_ERROR, err->msg);
        rc = -1;
    } else {
        s->steps++;
        s->step_tokens_total += (uint64_t)(s->o.step_tokens - budget);
        /* before the prompts are published: shared blocks get their MTP
         * K/V first */
        if (s->spec && prime_prompt_chunks(s, n_items, err))
            rc = -1;
        for (int i = 0; i < n_items; i++) {
            req *q = s->item_req[i];
            if (q->done)
                continue;
            if (q->checkpoint_at > 0 && mr_seq_len(q->seq) == q->checkpoint_at) {
                if (!s->stateful || mr_seq_mark_len(q->seq) == q->checkpoint_at)
                    publish_blocks(s, q, q->checkpoint_at / s->bt);
                q->checkpoint_at = 0;
            }
            if (s->items[i].mode == MR_LOGITS_NONE)
                continue;
            if (mr_seq_len(q->seq) == q->n_prompt)
                publish(s, q); /* the prompt is complete: let others share it now */
            advance(s, q, &s->items[i]);
        }
    }
    /* cancellations made from the callbacks take effect now */
    drop_cancelled(s);
    return rc ? -1 : s->n_live;
}

void mr_sched_get_stats(const mr_sched *s, mr_sched_stats *out)
{
    memset(out, 0, sizeof *out);
    out->live = s->n_live;
    for (int i = 0; i < s->n_live; i++) {
        if (mr_seq_len(s->live[i]->seq) < s->live[i]->n_prompt)
            out->prefilling++;
        else
            out->decoding++;
    }
    out->max_seqs = s->o.max_seqs;
    mr_kv_pool *pool = mr_model_kv_pool(s->m);
    out->kv_blocks = mr_kv_pool_size(pool);
    out->kv_free = mr_kv_pool_n_free(pool);
    out->kv_reserved = mr_kv_pool_n_reserved(pool);
    out->kv_available = mr_kv_pool_available(pool);
    out->block_tokens = s->bt;
    out->steps = s->steps;
    out->step_tokens_total = s->step_tokens_total;
    out->admitted = s->admitted;
    out->refused = s->refused;
    out->finished = s->finished;
    mr_sched_spec_stats sp;
    mr_sched_spec_get_stats(s->spec, &sp);
    out->spec_steps = sp.steps;
    out->spec_drafted = sp.drafted;
    out->spec_accepted = sp.accepted;
    out->spec_replays = sp.replays;
    out->spec_primed = sp.primed;
    mr_prefix_get_stats(s->prefix, &out->prefix);
    out->kv_admissible = out->kv_available + out->prefix.n_blocks - out->prefix.n_in_use;
}

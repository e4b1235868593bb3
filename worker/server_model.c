/* The worker's real engine: a GGUF model on a backend (worker/model.h)
 * served by the scheduler (worker/sched.h).  The scheduler owns admission
 * (a request is admitted only when every KV block it may need, prompt +
 * max_tokens, can be reserved from the paged pool), iteration-level
 * continuous batching with chunked prefill, the tenant + cache_salt scoped
 * prefix cache and session reuse, and sampling (worker/sample.h).  This
 * file sizes the pool, turns wire requests into scheduler requests and
 * scheduler events into the worker loop's events, and adds what only the
 * wire needs: log-probabilities of the model's distribution (log-softmax
 * of the raw logits, as OpenAI reports them) and the GGUF's end ids. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "common/log.h"
#include "common/tokenizer.h"
#include "worker/model.h"
#include "worker/sample.h"
#include "worker/sched.h"
#include "worker/server.h"

#ifdef MR_HAVE_CUDA
/* the CUDA runtime's C entry point (cuda_runtime_api.h is not on the host
 * compiler's include path); cudaSuccess is 0 */
extern int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
#endif

typedef struct model_engine {
    mr_engine super;
    mr_backend *be;
    mr_model *m;
    mr_sched *sched;
    mr_constrain_vocab *vocab; /* grammars' view of the tokens (NULL: no tokenizer in the GGUF) */
    bool cuda;
    int n_vocab;
    int32_t eos[4];
    int n_eos;
    uint64_t seed_counter;
    double kv_fraction;
    size_t kv_reserve;
    /* the step in flight: where its events go */
    mr_engine_emit emit;
    void *emit_ctx;
    /* submit's scratch: the prompt and stop ids as int32 */
    int32_t *prompt;
    size_t prompt_cap;
    int32_t stop[MR_MSG_MAX_STOP_IDS + 4];
} model_engine;

/* Free and total device memory (CUDA), or 0 and 0. */
static void vram_info(const model_engine *me, size_t *free_b, size_t *total_b)
{
    *free_b = *total_b = 0;
#ifdef MR_HAVE_CUDA
    if (me->cuda && cudaMemGetInfo(free_b, total_b) != 0)
        *free_b = *total_b = 0;
#endif
}

/* The KV budget once the weights are on the device: a fraction of the
 * free VRAM less a reserve for activations (CUDA only; 0 elsewhere). */
static size_t kv_budget(void *ctx, mr_backend *be)
{
    model_engine *me = ctx;
    size_t free_b, total_b;
    vram_info(me, &free_b, &total_b);
    if (!free_b)
        return 0;
    size_t b = mr_kv_budget_bytes(free_b, me->kv_fraction, me->kv_reserve);
    MR_INFO("worker: KV budget %.1f MiB (%.0f%% of %.1f MiB free, less %.1f MiB reserve)", (double)b / 1048576.0,
            me->kv_fraction * 100.0, (double)free_b / 1048576.0, (double)me->kv_reserve / 1048576.0);
    return b;
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

/* Scheduler events -> worker loop events. */
static void on_sched(void *user, const mr_sched_event *ev)
{
    model_engine *me = user;
    if (!me->emit)
        return;
    mr_engine_event out = {.id = ev->id};
    if (ev->type == MR_EV_TOKEN) {
        mr_step st;
        memset(&st, 0, sizeof st);
        st.token = (uint32_t)ev->token;
        if (ev->logits) {
            /* the loop sends as many alternatives as the request asked for */
            double lse = 0;
            logprob_stats(ev->logits, me->n_vocab, MR_MSG_MAX_TOP_LOGPROBS, &st, &lse);
            st.logprob = (float)(ev->logits[ev->token] - lse);
        }
        out.type = MR_ENGINE_TOKEN;
        out.step = &st;
        me->emit(me->emit_ctx, &out);
        return;
    }
    if (ev->reason == MR_SCHED_FIN_ERROR) {
        out.type = MR_ENGINE_ERROR;
        out.text = ev->error;
    } else {
        out.type = MR_ENGINE_FINAL;
        out.finish = ev->reason == MR_SCHED_FIN_STOP     ? MR_FINISH_STOP
                     : ev->reason == MR_SCHED_FIN_LENGTH ? MR_FINISH_LENGTH
                                                         : MR_FINISH_CANCELLED;
        out.prompt_tokens = (uint32_t)ev->usage.prompt_tokens;
        out.completion_tokens = (uint32_t)ev->usage.completion_tokens;
        out.cached_tokens = (uint32_t)ev->usage.cached_tokens;
    }
    me->emit(me->emit_ctx, &out);
}

static int submit(mr_engine *e, const mr_msg *req, mr_err *err)
{
    model_engine *me = (model_engine *)e;
    if (req->n_tokens > me->prompt_cap) {
        int32_t *p = realloc(me->prompt, sizeof *p * req->n_tokens);
        if (!p) {
            mr_errf(err, "out of memory for a prompt of %u tokens", req->n_tokens);
            return MR_ENGINE_REFUSED;
        }
        me->prompt = p;
        me->prompt_cap = req->n_tokens;
    }
    for (uint32_t i = 0; i < req->n_tokens; i++)
        me->prompt[i] = (int32_t)req->tokens[i];
    /* the request's end ids and the GGUF's (the gateway usually sends both) */
    int n_stop = 0;
    for (uint32_t i = 0; i < req->n_stop_ids && i < MR_MSG_MAX_STOP_IDS; i++)
        me->stop[n_stop++] = (int32_t)req->stop_ids[i];
    for (int i = 0; i < me->n_eos; i++)
        me->stop[n_stop++] = me->eos[i];
    const mr_sampling *w = &req->samp; /* the wire form, validated by the decoder */
    mr_request r = {
        .id = req->id,
        .prompt = me->prompt,
        .n_prompt = (int)req->n_tokens,
        .max_tokens = req->max_tokens > INT_MAX ? INT_MAX : (int)req->max_tokens,
        .sampling =
            {
                .temperature = w->temperature,
                .top_k = w->top_k > INT_MAX ? 0 : (int)w->top_k, /* beyond any vocabulary: off */
                .top_p = w->top_p,
                .min_p = w->min_p,
                .presence_penalty = w->presence_penalty,
                .frequency_penalty = w->frequency_penalty,
                .repetition_penalty = w->repetition_penalty,
                .seed = w->has_seed ? w->seed : (uint64_t)time(NULL) ^ (++me->seed_counter << 20) ^ req->id,
            },
        .stop_ids = me->stop,
        .n_stop = n_stop,
        .tenant = req->tenant,
        .cache_salt = req->cache_salt,
        .session = req->session,
        .want_logits = w->logprobs,
        .grammar = req->grammar,
    };
    switch (mr_sched_submit(me->sched, &r, err)) {
    case MR_SCHED_OK: return MR_ENGINE_ADMITTED;
    case MR_SCHED_NO_CAPACITY: return MR_ENGINE_WAIT;
    case MR_SCHED_TOO_LARGE: return MR_ENGINE_NEVER;
    default: return MR_ENGINE_REFUSED;
    }
}

static void cancel(mr_engine *e, uint64_t id)
{
    model_engine *me = (model_engine *)e;
    mr_sched_cancel(me->sched, id);
}

static int step(mr_engine *e, mr_engine_emit emit, void *ctx)
{
    model_engine *me = (model_engine *)e;
    me->emit = emit;
    me->emit_ctx = ctx;
    mr_err err;
    int live = mr_sched_step(me->sched, &err);
    me->emit = NULL;
    if (live < 0) {
        /* the requests of that step ended with an error event; the worker goes on */
        MR_WARN("worker: step failed: %s", err.msg);
        mr_sched_stats st;
        mr_sched_get_stats(me->sched, &st);
        live = st.live;
    }
    return live;
}

static void capacity(mr_engine *e, mr_engine_cap *out)
{
    model_engine *me = (model_engine *)e;
    mr_sched_stats st;
    mr_sched_get_stats(me->sched, &st);
    out->kv_total = (uint64_t)st.kv_blocks;
    out->kv_free = st.kv_admissible > 0 ? (uint64_t)st.kv_admissible : 0;
    out->block_tokens = (uint32_t)st.block_tokens;
    out->cache_blocks = (uint64_t)st.prefix.n_blocks;
    out->cache_capacity = (uint64_t)st.prefix.capacity;
    out->cache_prompt_tokens = st.prefix.prompt_tokens;
    out->cache_hit_tokens = st.prefix.hit_tokens;
    out->cache_evictions = st.prefix.evictions;
    size_t f, t;
    vram_info(me, &f, &t);
    out->vram_free = f;
    out->vram_total = t;
}

static void destroy(mr_engine *e)
{
    model_engine *me = (model_engine *)e;
    mr_sched_free(me->sched);
    mr_constrain_vocab_free(me->vocab);
    free(me->prompt);
    mr_model_free(me->m);
    mr_backend_destroy(me->be);
    free(me);
}

mr_engine *mr_engine_model(const char *path, const mr_engine_model_opts *o, mr_err *err)
{
    mr_engine_model_opts def = {0};
    if (!o)
        o = &def;
    const char *backend = o->backend ? o->backend : "auto";
    model_engine *me = calloc(1, sizeof *me);
    if (!me) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    if (!strcmp(backend, "cuda") && o->device >= 0)
        me->be = mr_backend_cuda_create(o->device, err);
    else
        me->be = mr_backend_create(backend, err);
    if (!me->be) {
        free(me);
        return NULL;
    }
    me->cuda = !strcmp(me->be->name, "cuda");
    me->kv_fraction = o->kv_fraction > 0 && o->kv_fraction <= 1 ? o->kv_fraction : 0.9;
    me->kv_reserve = o->kv_reserve_bytes > 0 ? o->kv_reserve_bytes : (size_t)1 << 30;
    int n_seqs = o->n_seqs > 0 ? o->n_seqs : 1;
    mr_model_opts mo = {
        .n_ctx = o->n_ctx, .n_seqs = n_seqs, .block_tokens = o->block_tokens, .kv_dtype = (mr_kv_dtype)o->kv_dtype};
    int bt = o->block_tokens > 0 ? o->block_tokens : 16;
    if (o->kv_tokens > 0) {
        long long blocks = (o->kv_tokens + bt - 1) / bt;
        mo.kv_blocks = blocks > (1 << 24) ? (1 << 24) : (int)blocks;
    } else if (o->kv_bytes > 0) {
        mo.kv_bytes = o->kv_bytes;
    } else if (me->cuda) {
        mo.kv_budget = kv_budget;
        mo.kv_budget_ctx = me;
    }
    if (mr_model_load(path, me->be, &mo, &me->m, err)) {
        mr_backend_destroy(me->be);
        free(me);
        return NULL;
    }
    const mr_hparams *hp = mr_model_hparams(me->m);
    me->n_vocab = hp->n_vocab;
    /* grammars (structured output) match the tokens' bytes: from the GGUF's
     * tokenizer, as the gateway detokenizes them */
    mr_tokenizer *tok = NULL;
    mr_err e1;
    if (mr_tok_load_file(path, &tok, &e1) || mr_constrain_vocab_new(tok, &me->vocab, &e1) ||
        mr_constrain_vocab_check(me->vocab, me->n_vocab, &e1)) {
        MR_WARN("worker: requests with a grammar will be refused: %s", e1.msg);
        mr_constrain_vocab_free(me->vocab);
        me->vocab = NULL;
    }
    mr_tok_free(tok);
    mr_sched_opts so = {.max_seqs = n_seqs, .chunk_tokens = o->chunk_tokens, .prefix_blocks = o->prefix_blocks,
                        .spec_k = o->spec_k, .vocab = me->vocab};
    if (mr_sched_new(me->m, &so, on_sched, me, &me->sched, err)) {
        destroy(&me->super);
        return NULL;
    }
    /* on a GPU the activations of the largest step come out of what the KV
     * pool left (--kv-reserve-mib): allocate them now, so a card short of it
     * fails here and not in the first long prompt */
    if (me->cuda && mr_sched_warmup(me->sched, err)) {
        mr_err_wrap(err, "worker: start-up step (lower --chunk or raise --kv-reserve-mib)");
        destroy(&me->super);
        return NULL;
    }
    mr_sched_stats st;
    mr_sched_get_stats(me->sched, &st);
    MR_INFO("worker: KV pool %d blocks of %d tokens; prefix cache %d blocks%s", st.kv_blocks, st.block_tokens,
            st.prefix.capacity,
            mr_seq_state_bytes(me->m) > 0 && st.prefix.capacity > 0 ? " (with recurrent-state checkpoints)" : "");
    if (o->spec_k > 0)
        MR_INFO("worker: MTP speculation %s (%d drafts a step for a lone greedy request)",
                mr_spec_supported(me->m) ? "on" : "off: the model has no MTP block", o->spec_k);
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
    me->super.name = me->be->name;
    snprintf(me->super.model_name, sizeof me->super.model_name, "%s", o->name ? o->name : path);
    me->super.n_ctx = (uint32_t)mr_model_n_ctx(me->m);
    me->super.n_vocab = (uint32_t)me->n_vocab;
    me->super.submit = submit;
    me->super.cancel = cancel;
    me->super.step = step;
    me->super.capacity = capacity;
    me->super.destroy = destroy;
    return &me->super;
}

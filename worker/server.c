#include "worker/server.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/chan.h"

typedef struct wseq {
    struct wseq *next;
    uint64_t id;
    void *seq;
    mr_msg req;        /* the request (tokens, limits, sampling) */
    uint32_t generated;
    bool started;
} wseq;

/* Test hook of the fake backend: a token equal to it is sent as a
 * malformed message (right id, "ids" of the wrong type) instead. */
static long g_corrupt_token = -1;

void mr_engine_fake_corrupt(long token) { g_corrupt_token = token; }

static volatile sig_atomic_t g_stop;
static atomic_int g_peer_gone;

static void on_signal(int sig) { g_stop = 1; }

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    if (ev == NNG_PIPE_EV_REM_POST)
        atomic_store(&g_peer_gone, 1);
}

typedef struct wstate {
    mr_engine *e;
    const mr_worker_opts *o;
    mr_chan chan;
    wseq *running, *queued;
    uint32_t n_running, n_queued;
    bool quiet; /* dropping everything: engine events send nothing */
} wstate;

static void reply(wstate *s, mr_msg *m)
{
    mr_err err;
    if (mr_chan_send(&s->chan, m, 1000, &err))
        MR_WARN("worker: send %s: %s", mr_msg_type_name(m->type), err.msg);
}

static void reply_error(wstate *s, uint64_t id, const char *code, const char *text)
{
    mr_msg m;
    mr_msg_make_error(&m, id, code, "%s", text);
    reply(s, &m);
}

static void seq_destroy(wstate *s, wseq *q)
{
    if (q->seq)
        s->e->seq_free(s->e, q->seq);
    mr_msg_free(&q->req);
    free(q);
}

static void send_final(wstate *s, wseq *q, enum mr_finish f)
{
    mr_msg m;
    mr_msg_init(&m, MR_MSG_FINAL, q->id);
    m.finish = f;
    m.prompt_tokens = q->req.n_tokens;
    m.completion_tokens = q->generated;
    reply(s, &m);
}

/* Removes the sequence with id from a list; returns it or NULL. */
static wseq *take(wseq **list, uint64_t id)
{
    for (wseq **p = list; *p; p = &(*p)->next)
        if ((*p)->id == id) {
            wseq *q = *p;
            *p = q->next;
            q->next = NULL;
            return q;
        }
    return NULL;
}

static bool known(wstate *s, uint64_t id)
{
    for (wseq *q = s->running; q; q = q->next)
        if (q->id == id)
            return true;
    for (wseq *q = s->queued; q; q = q->next)
        if (q->id == id)
            return true;
    return false;
}

static void append(wseq **list, wseq *q)
{
    while (*list)
        list = &(*list)->next;
    *list = q;
}

static void on_request(wstate *s, mr_msg *m)
{
    if (known(s, m->id)) {
        reply_error(s, m->id, "bad_request", "duplicate request id");
        return;
    }
    if ((uint64_t)m->n_tokens + m->max_tokens > s->e->n_ctx || m->n_tokens >= s->e->n_ctx) {
        char t[160];
        snprintf(t, sizeof t, "prompt of %u tokens plus max_tokens %u exceeds the context of %u", m->n_tokens,
                 m->max_tokens, s->e->n_ctx);
        reply_error(s, m->id, "context_length_exceeded", t);
        return;
    }
    for (uint32_t i = 0; i < m->n_tokens; i++)
        if (m->tokens[i] >= s->e->n_vocab) {
            reply_error(s, m->id, "bad_request", "prompt token id outside the vocabulary");
            return;
        }
    bool sched = s->e->submit != NULL;
    if (sched && !s->queued) {
        /* nothing waits ahead of it: admit now when it fits */
        mr_err err;
        int rc = s->e->submit(s->e, m, &err);
        if (rc == MR_ENGINE_NEVER || rc == MR_ENGINE_REFUSED) {
            reply_error(s, m->id, rc == MR_ENGINE_NEVER ? "capacity" : "bad_request", err.msg);
            return;
        }
        if (rc == MR_ENGINE_ADMITTED) {
            wseq *q = calloc(1, sizeof *q);
            if (!q) {
                s->e->cancel(s->e, m->id); /* its FINAL finds no sequence and is dropped */
                reply_error(s, m->id, "overloaded", "out of memory");
                return;
            }
            q->id = m->id;
            q->req = *m;
            mr_msg_init(m, MR_MSG_NONE, 0);
            append(&s->running, q);
            s->n_running++;
            return;
        }
    }
    if (s->n_queued >= s->o->max_queued && (sched || s->n_running >= s->o->max_running)) {
        if (sched)
            reply_error(s, m->id, "capacity", "no KV room for this request now and the worker queue is full");
        else
            reply_error(s, m->id, "overloaded", "the worker queue is full");
        return;
    }
    wseq *q = calloc(1, sizeof *q);
    if (!q) {
        reply_error(s, m->id, "overloaded", "out of memory");
        return;
    }
    q->id = m->id;
    q->req = *m;
    mr_msg_init(m, MR_MSG_NONE, 0); /* ownership of the arrays moved to q */
    append(&s->queued, q);
    s->n_queued++;
}

static void on_cancel(wstate *s, uint64_t id)
{
    if (s->e->submit) {
        for (wseq *r = s->running; r; r = r->next)
            if (r->id == id) {
                /* its FINAL (cancelled) comes from the next step */
                MR_INFO("worker: request %llu: cancel after %u tokens", (unsigned long long)id, r->generated);
                s->e->cancel(s->e, id);
                return;
            }
    }
    wseq *q = take(&s->running, id);
    if (q)
        s->n_running--;
    else if ((q = take(&s->queued, id)))
        s->n_queued--;
    if (!q)
        return; /* already finished: the final is on its way */
    send_final(s, q, MR_FINISH_CANCELLED);
    seq_destroy(s, q);
}

static void step_engine(wstate *s);

static void drop_all(wstate *s)
{
    if (s->e->submit && s->running) {
        /* the engine ends them at the start of its next step, silently */
        for (wseq *q = s->running; q; q = q->next)
            s->e->cancel(s->e, q->id);
        s->quiet = true;
        step_engine(s);
        s->quiet = false;
    }
    while (s->running) {
        wseq *q = s->running;
        s->running = q->next;
        seq_destroy(s, q);
    }
    while (s->queued) {
        wseq *q = s->queued;
        s->queued = q->next;
        seq_destroy(s, q);
    }
    s->n_running = s->n_queued = 0;
}

static void handle(wstate *s, mr_msg *m)
{
    switch (m->type) {
    case MR_MSG_HELLO: {
        mr_msg h;
        mr_msg_init(&h, MR_MSG_HELLO, 0);
        snprintf(h.model, sizeof h.model, "%s", s->e->model_name);
        h.n_ctx = s->e->n_ctx;
        h.n_vocab = s->e->n_vocab;
        h.pid = (uint32_t)getpid();
        h.device = s->o->device;
        reply(s, &h);
        break;
    }
    case MR_MSG_REQUEST: on_request(s, m); break;
    case MR_MSG_CANCEL: on_cancel(s, m->id); break;
    case MR_MSG_CAP_QUERY: {
        mr_msg c;
        mr_msg_init(&c, MR_MSG_CAPACITY, 0);
        c.running = s->n_running;
        c.queued = s->n_queued;
        if (s->e->capacity) {
            mr_engine_cap k = {0};
            s->e->capacity(s->e, &k);
            c.kv_total = k.kv_total;
            c.kv_free = k.kv_free;
            c.block_tokens = k.block_tokens;
            c.cache_blocks = k.cache_blocks;
            c.cache_capacity = k.cache_capacity;
            c.cache_prompt_tokens = k.cache_prompt_tokens;
            c.cache_hit_tokens = k.cache_hit_tokens;
            c.cache_evictions = k.cache_evictions;
            c.vram_free = k.vram_free;
            c.vram_total = k.vram_total;
        } else {
            /* no paged KV: one "block" per sequence slot (block_tokens 0) */
            c.kv_total = s->o->max_running;
            c.kv_free = s->n_running < s->o->max_running ? s->o->max_running - s->n_running : 0;
        }
        reply(s, &c);
        break;
    }
    default:
        reply_error(s, m->id, "bad_message", "unexpected message type for a worker");
        break;
    }
}

/* One TOKENS message for q's new token (with logprobs when asked). */
static void send_token(wstate *s, wseq *q, const mr_step *st)
{
    mr_msg t;
    mr_msg_init(&t, MR_MSG_TOKENS, q->id);
    uint32_t tok = st->token;
    float lp = st->logprob;
    t.tokens = &tok;
    t.n_tokens = 1;
    if (q->req.samp.logprobs) {
        t.logprobs = &lp;
        uint32_t k = q->req.samp.top_logprobs < st->n_top ? q->req.samp.top_logprobs : st->n_top;
        if (k) {
            t.n_top = k;
            t.top_ids = (uint32_t *)st->top_ids;
            t.top_lps = (float *)st->top_lps;
        }
    }
    if (g_corrupt_token >= 0 && st->token == (uint32_t)g_corrupt_token) {
        /* {"v":1,"type":"tokens","id":<id>,"ids":"x"} */
        uint8_t b[64];
        size_t n = 0;
        static const uint8_t head[] = {0x84, 0xa1, 'v', 0x01, 0xa4, 't', 'y', 'p', 'e', 0xa6, 't',
                                       'o', 'k', 'e', 'n', 's', 0xa2, 'i', 'd', 0xcf};
        memcpy(b, head, sizeof head);
        n = sizeof head;
        for (int k = 7; k >= 0; k--)
            b[n++] = (uint8_t)(q->id >> (8 * k));
        static const uint8_t tail[] = {0xa3, 'i', 'd', 's', 0xa1, 'x'};
        memcpy(b + n, tail, sizeof tail);
        n += sizeof tail;
        mr_err e2;
        mr_chan_send_raw(&s->chan, b, n, &e2);
    } else {
        reply(s, &t);
    }
}

/* An event of a scheduling engine's step. */
static void on_engine_event(void *ctx, const mr_engine_event *ev)
{
    wstate *s = ctx;
    wseq **p = &s->running;
    while (*p && (*p)->id != ev->id)
        p = &(*p)->next;
    wseq *q = *p;
    if (!q)
        return; /* dropped here already */
    if (ev->type == MR_ENGINE_TOKEN) {
        q->generated++;
        if (!s->quiet)
            send_token(s, q, ev->step);
        return;
    }
    if (!s->quiet) {
        if (ev->type == MR_ENGINE_FINAL) {
            mr_msg m;
            mr_msg_init(&m, MR_MSG_FINAL, q->id);
            m.finish = ev->finish;
            m.prompt_tokens = ev->prompt_tokens;
            m.completion_tokens = ev->completion_tokens;
            m.cached_tokens = ev->cached_tokens;
            reply(s, &m);
        } else {
            reply_error(s, q->id, "engine_error", ev->text ? ev->text : "engine error");
        }
    }
    *p = q->next;
    s->n_running--;
    seq_destroy(s, q);
}

/* A scheduling engine: admit what waits (in order, while it fits), then
 * one step of the running batch. */
static void step_engine(wstate *s)
{
    while (s->queued && !s->quiet) {
        wseq *q = s->queued;
        mr_err err;
        int rc = s->e->submit(s->e, &q->req, &err);
        if (rc == MR_ENGINE_WAIT)
            break; /* the head waits for room; those behind it wait their turn */
        s->queued = q->next;
        q->next = NULL;
        s->n_queued--;
        if (rc == MR_ENGINE_ADMITTED) {
            append(&s->running, q);
            s->n_running++;
            continue;
        }
        reply_error(s, q->id, rc == MR_ENGINE_NEVER ? "capacity" : "bad_request", err.msg);
        seq_destroy(s, q);
    }
    if (s->running)
        s->e->step(s->e, on_engine_event, s);
}

/* One decode step for every running sequence. */
static void step_all(wstate *s)
{
    if (s->e->submit) {
        step_engine(s);
        return;
    }
    while (s->queued && s->n_running < s->o->max_running) {
        wseq *q = s->queued;
        s->queued = q->next;
        q->next = NULL;
        s->n_queued--;
        mr_err err;
        q->seq = s->e->seq_new(s->e, &q->req, &err);
        if (!q->seq) {
            reply_error(s, q->id, "engine_error", err.msg);
            seq_destroy(s, q);
            continue;
        }
        append(&s->running, q);
        s->n_running++;
    }
    if (s->e->round && s->running)
        s->e->round(s->e);
    wseq **p = &s->running;
    while (*p) {
        wseq *q = *p;
        mr_step st;
        memset(&st, 0, sizeof st);
        mr_err err;
        int rc = s->e->seq_step(s->e, q->seq, &st, &err);
        bool done = false;
        if (rc) {
            reply_error(s, q->id, "engine_error", err.msg);
            done = true;
        } else {
            bool stop_id = st.eos;
            for (uint32_t i = 0; i < q->req.n_stop_ids && !stop_id; i++)
                stop_id = st.token == q->req.stop_ids[i];
            if (stop_id) {
                q->generated++;
                send_final(s, q, MR_FINISH_STOP);
                done = true;
            } else {
                q->generated++;
                send_token(s, q, &st);
                if (q->generated >= q->req.max_tokens) {
                    send_final(s, q, MR_FINISH_LENGTH);
                    done = true;
                }
            }
        }
        if (done) {
            *p = q->next;
            s->n_running--;
            seq_destroy(s, q);
        } else {
            p = &q->next;
        }
    }
}

int mr_worker_serve(mr_engine *e, const mr_worker_opts *o)
{
    wstate s = {0};
    s.e = e;
    s.o = o;
    mr_err err;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (mr_chan_listen(&s.chan, o->listen, &err)) {
        fprintf(stderr, "memra-worker: %s\n", err.msg);
        return 1;
    }
    nng_pipe_notify(s.chan.sock, NNG_PIPE_EV_REM_POST, on_pipe, NULL);
    MR_INFO("worker: %s (%s) listening on %s, ctx %u", e->model_name, e->name, o->listen, e->n_ctx);
    while (!g_stop) {
        if (atomic_exchange(&g_peer_gone, 0)) {
            /* the gateway went away: nobody can receive these results */
            if (s.n_running || s.n_queued)
                MR_WARN("worker: gateway disconnected; dropping %u running, %u queued", s.n_running, s.n_queued);
            drop_all(&s);
        }
        /* drain every waiting message first; block briefly only when idle */
        int timeout = s.n_running || s.n_queued ? 0 : 100;
        for (;;) {
            mr_msg m;
            uint64_t bad;
            int rc = mr_chan_recv(&s.chan, &m, timeout, &bad, &err);
            if (rc == MR_CHAN_TIMEOUT)
                break;
            if (rc == MR_CHAN_CLOSED) {
                g_stop = 1;
                break;
            }
            if (rc == MR_CHAN_BAD) {
                MR_WARN("worker: bad message: %s", err.msg);
                reply_error(&s, bad, "bad_message", err.msg);
            } else {
                handle(&s, &m);
                mr_msg_free(&m);
            }
            timeout = 0;
        }
        if (s.n_running || s.n_queued)
            step_all(&s);
    }
    drop_all(&s);
    mr_chan_close(&s.chan);
    MR_INFO("worker: stopped");
    return 0;
}

/* ---------- the fake engine ---------- */

typedef struct fake_engine {
    mr_engine super;
    int eos_id;
    int delay_ms;
} fake_engine;


typedef struct fake_seq {
    uint32_t *prompt;
    uint32_t n, i;
} fake_seq;

static void *fake_new(mr_engine *e, const mr_msg *req, mr_err *err)
{
    fake_seq *f = calloc(1, sizeof *f);
    if (!f) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    f->prompt = malloc(req->n_tokens * sizeof *f->prompt);
    if (!f->prompt) {
        free(f);
        mr_errf(err, "out of memory");
        return NULL;
    }
    memcpy(f->prompt, req->tokens, req->n_tokens * sizeof *f->prompt);
    f->n = req->n_tokens;
    return f;
}

static void fake_round(mr_engine *e)
{
    fake_engine *fe = (fake_engine *)e;
    if (fe->delay_ms > 0) {
        struct timespec ts = {fe->delay_ms / 1000, (long)(fe->delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int fake_step(mr_engine *e, void *seq, mr_step *out, mr_err *err)
{
    fake_engine *fe = (fake_engine *)e;
    fake_seq *f = seq;
    uint32_t i = f->i++;
    out->token = f->prompt[i % f->n];
    out->eos = fe->eos_id >= 0 && out->token == (uint32_t)fe->eos_id;
    out->logprob = i % 4 ? -(float)(i % 4) / 4.0f : 0.0f;
    out->n_top = MR_MSG_MAX_TOP_LOGPROBS;
    for (uint32_t k = 0; k < out->n_top; k++) {
        out->top_ids[k] = (out->token + k) % e->n_vocab;
        out->top_lps[k] = out->logprob - (float)k;
    }
    return 0;
}

static void fake_free(mr_engine *e, void *seq)
{
    fake_seq *f = seq;
    free(f->prompt);
    free(f);
}

static void fake_destroy(mr_engine *e) { free(e); }

mr_engine *mr_engine_fake(const char *model_name, uint32_t n_ctx, uint32_t n_vocab, int eos_id, int delay_ms)
{
    fake_engine *fe = calloc(1, sizeof *fe);
    if (!fe)
        return NULL;
    fe->super.name = "fake";
    snprintf(fe->super.model_name, sizeof fe->super.model_name, "%s", model_name);
    fe->super.n_ctx = n_ctx;
    fe->super.n_vocab = n_vocab;
    fe->super.seq_new = fake_new;
    fe->super.seq_step = fake_step;
    fe->super.seq_free = fake_free;
    fe->super.round = fake_round;
    fe->super.destroy = fake_destroy;
    fe->eos_id = eos_id;
    fe->delay_ms = delay_ms;
    return &fe->super;
}

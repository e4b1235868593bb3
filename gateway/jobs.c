/* The life of one completion request in the gateway: admission (tenant and
 * key caps, per-model bounded queue), dispatch to a worker, turning the
 * worker's token stream into OpenAI responses (blocking JSON or SSE), and
 * every way it can end: finish, stop string, worker error, worker death,
 * client disconnect, drain. */
#include <errno.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/log.h"
#include "gateway/gw.h"
#include "gateway/toolgram.h"

enum { J_QUEUED, J_RUNNING, J_DONE };

struct job_ref {
    mr_job *job;
};

struct job_gen {
    h2o_generator_t super;
    struct job_ref *ref;
};

struct mr_job {
    h2o_linklist_t all;
    h2o_linklist_t qlink;
    mr_gw *gw;
    mr_gw_model *model;
    mr_gw_worker *worker;
    uint64_t id;
    h2o_req_t *req;
    struct job_ref *ref;
    const char *route;
    bool chat, stream, include_usage;
    int wstate;
    bool http_done;
    mr_msg request;
    /* looked up once at admission (the tables never drop entries) */
    mr_tenant_state *ts;
    mr_key_state *ks;
    mr_textout tout;
    bool text_stopped;
    mr_chatout co;        /* chat: the text split into reasoning, content and tool calls */
    mr_co_events ev;      /* what co released from one worker message (scratch) */
    uint32_t n_calls;     /* tool calls returned so far (a stream's call index) */
    mr_buf text;          /* the whole text (blocking responses; chat: the content) */
    mr_buf reasoning;     /* chat, blocking: the whole reasoning */
    json_t *calls;        /* chat, blocking: the tool calls */
    size_t text_len;      /* bytes of text released so far (logprobs text_offset) */
    json_t *lp;           /* accumulated logprobs (blocking responses) */
    uint32_t completion_tokens;
    bool in_think;             /* chat: the next token is part of the reasoning */
    uint32_t reasoning_tokens; /* chat: tokens from the reasoning's opening marker to its end marker */
    uint64_t kv_need;     /* KV tokens it may fill on a worker: prompt + max_tokens */
    const char *finish;
    char idstr[48];
    long created;
    /* streaming */
    mr_buf out, wire;
    mr_buf chunk_head; /* {"id":...,"system_fingerprint":"memra" of every chunk */
    /* per-token scratch, reused across worker messages */
    mr_buf piece, released, tok_text, top_raw, top_text;
    bool sending, final_queued, headers_sent;
    double t_start, t_last;
    double t_sent; /* when bytes of the stream last went to the connection (stream_keepalive) */
    bool got_first;
};

/* ---------- helpers ---------- */

static size_t job_home(uint64_t id, size_t mask)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static mr_job *find_job(mr_gw *gw, uint64_t id)
{
    if (!gw->job_slots_cap)
        return NULL;
    size_t mask = gw->job_slots_cap - 1;
    for (size_t i = job_home(id, mask); gw->job_slots[i]; i = (i + 1) & mask)
        if (gw->job_slots[i]->id == id)
            return gw->job_slots[i];
    return NULL;
}

static void job_slot_put(mr_job **slots, size_t mask, mr_job *j)
{
    size_t i = job_home(j->id, mask);
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = j;
}

/* Adds j to the id table (kept at most half full); -1 when out of memory. */
static int job_index(mr_gw *gw, mr_job *j)
{
    if ((size_t)(gw->n_jobs + 1) * 2 > gw->job_slots_cap) {
        size_t cap = gw->job_slots_cap ? gw->job_slots_cap * 2 : 64;
        mr_job **slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        for (size_t i = 0; i < gw->job_slots_cap; i++)
            if (gw->job_slots[i])
                job_slot_put(slots, cap - 1, gw->job_slots[i]);
        free(gw->job_slots);
        gw->job_slots = slots;
        gw->job_slots_cap = cap;
    }
    job_slot_put(gw->job_slots, gw->job_slots_cap - 1, j);
    return 0;
}

/* Removes j, shifting later entries of its probe run back into the hole so
 * that no lookup stops early (no tombstones). */
static void job_unindex(mr_gw *gw, mr_job *j)
{
    if (!gw->job_slots_cap)
        return;
    mr_job **slots = gw->job_slots;
    size_t mask = gw->job_slots_cap - 1, hole = job_home(j->id, mask);
    while (slots[hole] && slots[hole] != j)
        hole = (hole + 1) & mask;
    if (!slots[hole])
        return;
    for (size_t k = (hole + 1) & mask; slots[k]; k = (k + 1) & mask) {
        /* slots[k] may move back unless its home lies after the hole */
        size_t home = job_home(slots[k]->id, mask);
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            slots[hole] = slots[k];
            hole = k;
        }
    }
    slots[hole] = NULL;
}

static void job_free(mr_job *j)
{
    mr_gw *gw = j->gw;
    if (h2o_linklist_is_linked(&j->qlink)) {
        h2o_linklist_unlink(&j->qlink);
        j->model->queued--;
    }
    h2o_linklist_unlink(&j->all);
    job_unindex(gw, j);
    gw->n_jobs--;
    if (j->ts)
        j->ts->running--;
    if (j->ks)
        j->ks->running--;
    if (j->ref)
        j->ref->job = NULL;
    mr_msg_free(&j->request);
    mr_textout_free(&j->tout);
    mr_chatout_free(&j->co);
    mr_co_events_free(&j->ev);
    mr_buf_free(&j->reasoning);
    json_decref(j->calls);
    mr_buf_free(&j->text);
    mr_buf_free(&j->out);
    mr_buf_free(&j->wire);
    mr_buf_free(&j->chunk_head);
    mr_buf_free(&j->piece);
    mr_buf_free(&j->released);
    mr_buf_free(&j->tok_text);
    mr_buf_free(&j->top_raw);
    mr_buf_free(&j->top_text);
    json_decref(j->lp);
    free(j);
}

/* A job is freed when the worker is done with it and the HTTP side is
 * finished (response sent, or the request is gone); true when it was. */
static bool maybe_free(mr_job *j)
{
    if (j->wstate == J_DONE && ((j->http_done && !j->sending) || !j->req)) {
        job_free(j);
        return true;
    }
    return false;
}

static void pump_queue(mr_gw_model *m);

/* The KV-token estimate of w gets need back (a job ended) or loses it (a
 * job was sent), within what the worker holds. */
static void kv_est_add(mr_gw_worker *w, int64_t need)
{
    if (!w->cap.block_tokens)
        return;
    int64_t total = (int64_t)(w->cap.kv_total * w->cap.block_tokens);
    w->kv_est += need;
    if (w->kv_est > total)
        w->kv_est = total;
}

static void worker_release(mr_job *j)
{
    if (j->wstate == J_RUNNING && j->worker) {
        j->worker->running--;
        j->model->running--;
        kv_est_add(j->worker, (int64_t)j->kv_need);
    }
    if (h2o_linklist_is_linked(&j->qlink)) {
        h2o_linklist_unlink(&j->qlink);
        j->model->queued--;
    }
    j->wstate = J_DONE;
    pump_queue(j->model);
}

static void send_cancel(mr_job *j)
{
    if (j->wstate != J_RUNNING || !j->worker || !j->worker->connected)
        return;
    mr_msg m;
    mr_msg_init(&m, MR_MSG_CANCEL, j->id);
    mr_err err;
    if (mr_chan_send(&j->worker->chan, &m, 100, &err))
        MR_WARN("gateway: cancel %llu: %s", (unsigned long long)j->id, err.msg);
}

/* ---------- SSE output ---------- */

static void stream_flush(mr_job *j);

static void on_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    struct job_gen *jg = (struct job_gen *)g;
    mr_job *j = jg->ref->job;
    if (!j)
        return;
    j->sending = false;
    if (j->http_done) {
        maybe_free(j);
        return;
    }
    stream_flush(j);
}

static void on_stop(h2o_generator_t *g, h2o_req_t *req)
{
    struct job_gen *jg = (struct job_gen *)g;
    mr_job *j = jg->ref->job;
    if (!j)
        return;
    /* the connection broke mid-response */
    j->sending = false;
    j->http_done = true;
    send_cancel(j);
}

static void stream_flush(mr_job *j)
{
    if (!j->req || j->sending || j->http_done)
        return;
    if (!j->out.len && !j->final_queued)
        return;
    mr_buf t = j->wire;
    j->wire = j->out;
    j->out = t;
    j->out.len = 0;
    h2o_iovec_t iov = h2o_iovec_init(j->wire.p ? j->wire.p : "", j->wire.len);
    bool fin = j->final_queued;
    j->sending = true;
    j->t_sent = mr_now();
    if (fin)
        j->http_done = true;
    h2o_send(j->req, &iov, 1, fin ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

/* Appends one SSE event: the chunk fields every event of this job shares
 * (serialized once, j->chunk_head), then the fields of rest, which it frees. */
static void sse_chunk(mr_job *j, json_t *rest)
{
    if (!j->chunk_head.len) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", j->idstr, "object",
                              j->chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)j->created, "model", j->model->conf->name, "system_fingerprint", "memra");
        char *h = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        if (!h)
            return;
        mr_buf_add(&j->chunk_head, h, strlen(h) - 1); /* open: without the closing brace */
        free(h);
    }
    char *s = json_dumps(rest, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(rest);
    if (!s)
        return;
    mr_buf_adds(&j->out, "data: ");
    mr_buf_add(&j->out, j->chunk_head.p, j->chunk_head.len);
    mr_buf_adds(&j->out, ",");
    mr_buf_adds(&j->out, s + 1); /* rest's members, with its closing brace */
    mr_buf_adds(&j->out, "\n\n");
    free(s);
}

/* One SSE event of one choice; delta (chat) or text (completions), lp
 * and the delta are taken over. */
static void stream_choice(mr_job *j, json_t *delta, const char *text, size_t len, const char *finish, json_t *lp)
{
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    if (j->chat) {
        json_object_set_new(choice, "delta", delta ? delta : json_object());
        json_object_set_new(choice, "logprobs", lp ? json_pack("{s:o}", "content", lp) : json_null());
    } else {
        json_object_set_new(choice, "text", json_stringn(text ? text : "", text ? len : 0));
        json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *rest = json_pack("{s:[o]}", "choices", choice);
    if (j->include_usage)
        json_object_set_new(rest, "usage", json_null());
    sse_chunk(j, rest);
}

static void stream_chunk(mr_job *j, const char *text, size_t len, bool role, const char *finish, json_t *lp)
{
    json_t *delta = NULL;
    if (j->chat) {
        delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (text && (len || role))
            json_object_set_new(delta, "content", json_stringn(text, len));
    }
    stream_choice(j, delta, text, len, finish, lp);
}

/* n random bytes as 2n hex digits and a NUL at dst (ids of responses and
 * tool calls). */
static void random_hex(char *dst, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    unsigned char rnd[32];
    RAND_bytes(rnd, (int)n);
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = hx[rnd[i] >> 4];
        dst[2 * i + 1] = hx[rnd[i] & 15];
    }
    dst[2 * n] = 0;
}

/* "call_" and 24 hex digits, as OpenAI's ids look. */
static json_t *call_id(void)
{
    char id[5 + 24 + 1] = "call_";
    random_hex(id + 5, 12);
    return json_string(id);
}

/* What the chat splitter released: streamed as deltas (reasoning_content,
 * content; a tool call as its header then its arguments, the way OpenAI
 * streams them), or kept for the blocking response.  lp (taken over) goes
 * with the first event; with none, an empty delta still carries the step. */
static void chat_events(mr_job *j, json_t *lp, bool step)
{
    for (size_t i = 0; i < j->ev.n; i++) {
        mr_co_event *e = &j->ev.v[i];
        const char *t = e->text.p ? e->text.p : "";
        if (!j->stream) {
            if (e->kind == MR_CO_TOOL) {
                if (!j->calls)
                    j->calls = json_array();
                json_array_append_new(j->calls, json_pack("{s:o, s:s, s:O}", "id", call_id(), "type", "function",
                                                          "function", e->call));
                j->n_calls++;
            } else {
                mr_buf_add(e->kind == MR_CO_CONTENT ? &j->text : &j->reasoning, t, e->text.len);
            }
            continue;
        }
        if (e->kind == MR_CO_TOOL) {
            json_t *head = json_pack("{s:[{s:i, s:o, s:s, s:{s:O, s:s}}]}", "tool_calls", "index", (int)j->n_calls,
                                     "id", call_id(), "type", "function", "function", "name",
                                     json_object_get(e->call, "name"), "arguments", "");
            stream_choice(j, head, NULL, 0, NULL, lp);
            stream_choice(j,
                          json_pack("{s:[{s:i, s:{s:O}}]}", "tool_calls", "index", (int)j->n_calls, "function",
                                    "arguments", json_object_get(e->call, "arguments")),
                          NULL, 0, NULL, NULL);
            j->n_calls++;
        } else {
            stream_choice(j,
                          json_pack("{s:s%}", e->kind == MR_CO_CONTENT ? "content" : "reasoning_content", t,
                                    e->text.len),
                          NULL, 0, NULL, lp);
        }
        lp = NULL;
    }
    if (j->stream && (lp || (step && !j->ev.n)))
        stream_choice(j, NULL, NULL, 0, NULL, lp);
    else
        json_decref(lp);
    mr_co_events_clear(&j->ev);
}

/* Text of the reply as released (stop strings applied): split into its
 * parts (chat), then streamed or kept for the blocking response.  lp (the
 * tokens' logprobs, borrowed) goes with a stream's chunk; step: a stream's
 * chunk goes out even when nothing is released (see on_tokens). */
static void reply_text(mr_job *j, const char *s, size_t n, json_t *lp, bool step)
{
    if (j->chat) {
        mr_chatout_push(&j->co, s, n, &j->ev);
        chat_events(j, j->stream && lp ? json_incref(lp) : NULL, step);
    } else if (!j->stream) {
        mr_buf_add(&j->text, s, n);
    } else if (step || n || lp) {
        stream_chunk(j, s, n, false, NULL, lp ? json_incref(lp) : NULL);
    }
}

static json_t *usage_json(mr_job *j, uint32_t prompt, uint32_t completion, uint32_t cached)
{
    json_t *u = json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)prompt, "completion_tokens",
                          (int)completion, "total_tokens", (int)(prompt + completion), "prompt_tokens_details",
                          "cached_tokens", (int)cached);
    if (u && j->chat) /* as OpenAI's chat usage: the reasoning's share of completion_tokens */
        json_object_set_new(u, "completion_tokens_details",
                            json_pack("{s:i}", "reasoning_tokens", (int)j->reasoning_tokens));
    return u;
}

/* Counts id among the reasoning tokens when it is one: from the opening
 * marker (or the start, when the prompt opened it) to the end marker, both
 * included.  Exact where the markers are single tokens (Qwen's <think> and
 * </think>); a model without them counts none. */
static void count_reasoning(mr_job *j, uint32_t id)
{
    const mr_codec *c = j->model->codec;
    if (!j->chat || !j->model->fmt.think || c->think_close_id < 0)
        return;
    if ((int64_t)id == c->think_open_id)
        j->in_think = true;
    if (j->in_think)
        j->reasoning_tokens++;
    if ((int64_t)id == c->think_close_id)
        j->in_think = false;
}

/* ---------- responses ---------- */

static void finish_ok(mr_job *j, const char *finish, uint32_t prompt, uint32_t completion, uint32_t cached)
{
    if (j->http_done || !j->req)
        return;
    mr_buf rest = {0};
    if (!j->text_stopped && mr_textout_finish(&j->tout, &rest))
        finish = "stop"; /* what was held back completed a stop string */
    reply_text(j, rest.p ? rest.p : "", rest.len, NULL, false);
    mr_buf_free(&rest);
    if (j->chat) {
        mr_chatout_finish(&j->co, &j->ev);
        chat_events(j, NULL, false);
    }
    /* a reply that called tools ends as OpenAI's do; one cut by max_tokens
     * stays "length" */
    if (j->n_calls && !strcmp(finish, "stop"))
        finish = "tool_calls";
    mr_gw *gw = j->gw;
    mr_gw_model *m = j->model;
    m->prompt_tokens += prompt;
    m->gen_tokens += completion;
    m->cached_tokens += cached;
    if (j->ts) {
        j->ts->prompt_tokens += prompt;
        j->ts->gen_tokens += completion;
    }
    if (j->stream) {
        stream_chunk(j, NULL, 0, false, finish, NULL);
        if (j->include_usage)
            sse_chunk(j, json_pack("{s:[], s:o}", "choices", "usage", usage_json(j, prompt, completion, cached)));
        mr_buf_adds(&j->out, "data: [DONE]\n\n");
        j->final_queued = true;
        mr_metrics_request(&gw->metrics, j->route, 200);
        stream_flush(j);
    } else {
        json_t *choice;
        if (j->chat) {
            /* content is null on a reply that only calls tools */
            json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                    j->calls && !j->text.len ? json_null()
                                                             : json_stringn(j->text.p ? j->text.p : "", j->text.len));
            if (j->reasoning.len)
                json_object_set_new(msg, "reasoning_content", json_stringn(j->reasoning.p, j->reasoning.len));
            if (j->calls)
                json_object_set(msg, "tool_calls", j->calls);
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "message", msg, "logprobs",
                               j->lp ? json_pack("{s:O}", "content", j->lp) : json_null(), "finish_reason", finish);
        } else {
            choice = json_pack("{s:i, s:s%, s:O?, s:s}", "index", 0, "text", j->text.p ? j->text.p : "", j->text.len,
                               "logprobs", j->lp, "finish_reason", finish);
            if (!j->lp)
                json_object_set_new(choice, "logprobs", json_null());
        }
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:o}", "id", j->idstr, "object",
                              j->chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created,
                              "model", m->conf->name, "system_fingerprint", "memra", "choices", choice, "usage",
                              usage_json(j, prompt, completion, cached));
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        mr_gw_send_json(j->req, 200, s, strlen(s), j->route);
        free(s);
        j->http_done = true;
    }
}

static void finish_error(mr_job *j, int status, const char *code, const char *msg)
{
    if (j->http_done || !j->req)
        return;
    mr_oai_error e;
    mr_oai_err(&e, status, NULL, code, "%s", msg);
    if (j->stream && j->headers_sent) {
        char *s = mr_oai_error_json(&e);
        mr_buf_adds(&j->out, "data: ");
        mr_buf_adds(&j->out, s);
        mr_buf_adds(&j->out, "\n\ndata: [DONE]\n\n");
        free(s);
        j->final_queued = true;
        mr_metrics_request(&j->gw->metrics, j->route, 200);
        stream_flush(j);
    } else {
        mr_gw_send_error(j->req, &e, j->route, status == 503 || status == 429 ? j->gw->conf.retry_after_s : 0);
        j->http_done = true;
    }
}

/* ---------- request ref / disconnect ---------- */

static void on_req_dispose(void *p)
{
    struct job_ref *ref = p;
    mr_job *j = ref->job;
    if (!j)
        return;
    j->req = NULL;
    j->ref = NULL;
    j->sending = false;
    if (j->wstate == J_QUEUED) {
        worker_release(j);
    } else if (j->wstate == J_RUNNING) {
        send_cancel(j);
    }
    maybe_free(j);
}

/* True when the client has closed its side (peeked without consuming). */
static bool client_gone(h2o_req_t *req)
{
    h2o_socket_t *sock = req->conn->callbacks->get_socket ? req->conn->callbacks->get_socket(req->conn) : NULL;
    if (!sock)
        return false;
    int fd = h2o_socket_get_fd(sock);
    if (fd < 0)
        return false;
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void check_disconnect(mr_job *j)
{
    if (!j->req || j->http_done || j->wstate == J_DONE)
        return;
    if (!client_gone(j->req))
        return;
    MR_DEBUG("gateway: client of %llu went away; cancelling", (unsigned long long)j->id);
    if (j->wstate == J_RUNNING)
        send_cancel(j);
    /* answer anyway so that h2o notices the dead socket and releases it */
    finish_error(j, 400, "client_closed", "client closed the connection");
    if (j->wstate == J_QUEUED)
        worker_release(j);
}

/* ---------- dispatch ---------- */

/* Whether w's KV (as last reported, less what was sent since) can take a
 * job of need tokens now; a worker that reports no paged KV always can. */
static bool kv_fits(const mr_gw_worker *w, uint64_t need)
{
    return !w->cap.block_tokens || w->kv_est >= (int64_t)need;
}

/* The ready worker to send a job of need KV tokens to: one with a free
 * running slot whose KV can take it; fewest running first, then the most
 * free KV.  NULL when none can now (the job waits in the model's queue). */
static mr_gw_worker *pick_worker(mr_gw_model *m, uint64_t need, bool *any_ready)
{
    mr_gw_worker *best = NULL;
    *any_ready = false;
    for (int i = 0; i < m->n_workers; i++) {
        mr_gw_worker *w = &m->workers[i];
        if (!w->connected || !w->ready)
            continue;
        *any_ready = true;
        if (w->running >= (int)m->conf->max_running || !kv_fits(w, need))
            continue;
        if (!best || w->running < best->running || (w->running == best->running && w->kv_est > best->kv_est))
            best = w;
    }
    return best;
}

/* True when every ready worker reported a KV pool too small for need
 * tokens even empty: waiting cannot help. */
static bool kv_never_fits(const mr_gw_model *m, uint64_t need, uint64_t *largest)
{
    bool any = false;
    *largest = 0;
    for (int i = 0; i < m->n_workers; i++) {
        const mr_gw_worker *w = &m->workers[i];
        if (!w->connected || !w->ready)
            continue;
        if (!w->cap.block_tokens)
            return false; /* no report yet, or no paged KV: the worker decides */
        uint64_t total = w->cap.kv_total * w->cap.block_tokens;
        if (total > *largest)
            *largest = total;
        any = true;
        if (total >= need)
            return false;
    }
    return any;
}

static int dispatch(mr_job *j, mr_gw_worker *w)
{
    mr_err err;
    if (mr_chan_send(&w->chan, &j->request, 200, &err)) {
        MR_WARN("gateway: send to %s worker %d: %s", j->model->conf->name, w->index, err.msg);
        return -1;
    }
    j->worker = w;
    j->wstate = J_RUNNING;
    w->running++;
    j->model->running++;
    kv_est_add(w, -(int64_t)j->kv_need);
    return 0;
}

static void pump_queue(mr_gw_model *m)
{
    while (!h2o_linklist_is_empty(&m->queue)) {
        bool any;
        mr_job *j = H2O_STRUCT_FROM_MEMBER(mr_job, qlink, m->queue.next);
        mr_gw_worker *w = pick_worker(m, j->kv_need, &any);
        if (!w)
            return; /* in order: the head waits for room, the rest behind it */
        h2o_linklist_unlink(&j->qlink);
        m->queued--;
        if (dispatch(j, w)) {
            j->wstate = J_DONE;
            finish_error(j, 503, "worker_unavailable", "the worker for this model is not reachable");
            maybe_free(j);
        }
    }
}

/* ---------- worker events ---------- */

/* Top candidate k of token i: raw bytes into j->top_raw, text (invalid
 * UTF-8 as U+FFFD) into j->top_text. */
static void top_piece(mr_job *j, const mr_msg *m, uint32_t i, uint32_t k)
{
    mr_err err;
    mr_buf_clear(&j->top_raw);
    mr_buf_clear(&j->top_text);
    j->model->codec->piece(j->model->codec, m->top_ids[(size_t)i * m->n_top + k], &j->top_raw, &err);
    mr_gw_utf8_sanitize(&j->top_text, j->top_raw.p ? j->top_raw.p : "", j->top_raw.len);
}

static json_t *byte_array(const char *p, size_t n)
{
    json_t *a = json_array();
    for (size_t b = 0; b < n; b++)
        json_array_append_new(a, json_integer((unsigned char)p[b]));
    return a;
}

static void add_logprobs(mr_job *j, const mr_msg *m, uint32_t i, const char *piece, size_t plen, size_t offset,
                         json_t *dst)
{
    mr_buf_clear(&j->tok_text);
    mr_gw_utf8_sanitize(&j->tok_text, piece, plen);
    const char *tok = j->tok_text.p ? j->tok_text.p : "";
    double lp = m->logprobs ? m->logprobs[i] : 0;
    if (j->chat) {
        json_t *tops = json_array();
        for (uint32_t k = 0; k < m->n_top; k++) {
            top_piece(j, m, i, k);
            json_array_append_new(tops, json_pack("{s:s%, s:f, s:o}", "token", j->top_text.p ? j->top_text.p : "",
                                                  j->top_text.len, "logprob",
                                                  (double)m->top_lps[(size_t)i * m->n_top + k], "bytes",
                                                  byte_array(j->top_raw.p, j->top_raw.len)));
        }
        json_array_append_new(dst, json_pack("{s:s%, s:f, s:o, s:o}", "token", tok, j->tok_text.len, "logprob", lp,
                                             "bytes", byte_array(piece, plen), "top_logprobs", tops));
    } else {
        json_array_append_new(json_object_get(dst, "tokens"), json_stringn(tok, j->tok_text.len));
        json_array_append_new(json_object_get(dst, "token_logprobs"), json_real(lp));
        json_t *top = json_object();
        for (uint32_t k = 0; k < m->n_top; k++) {
            top_piece(j, m, i, k);
            json_object_set_new(top, j->top_text.p ? j->top_text.p : "",
                                json_real(m->top_lps[(size_t)i * m->n_top + k]));
        }
        json_array_append_new(json_object_get(dst, "top_logprobs"), top);
        json_array_append_new(json_object_get(dst, "text_offset"), json_integer((json_int_t)offset));
    }
}

static json_t *new_lp_container(mr_job *j)
{
    if (j->chat)
        return json_array();
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static void on_tokens(mr_job *j, mr_msg *m)
{
    if (j->http_done || !j->req || j->text_stopped)
        return;
    double now = mr_now();
    mr_gw_model *model = j->model;
    mr_buf *released = &j->released;
    mr_buf_clear(released);
    json_t *lp = j->request.samp.logprobs ? new_lp_container(j) : NULL;
    /* tokens that arrive together share the gap since the previous message */
    double gap = j->got_first ? (now - j->t_last) / m->n_tokens : 0;
    for (uint32_t i = 0; i < m->n_tokens; i++) {
        mr_buf *piece = &j->piece;
        mr_err err;
        mr_buf_clear(piece);
        if (model->codec->piece(model->codec, m->tokens[i], piece, &err)) {
            json_decref(lp);
            send_cancel(j);
            finish_error(j, 500, "engine_error", err.msg);
            return;
        }
        j->completion_tokens++;
        count_reasoning(j, m->tokens[i]);
        if (!j->got_first) {
            mr_hist_observe(&model->ttft, now - j->t_start);
            j->got_first = true;
        } else {
            mr_hist_observe(&model->itl, gap);
        }
        size_t before = released->len;
        const char *pp = piece->p ? piece->p : "";
        bool stopped = mr_textout_push(&j->tout, pp, piece->len, released);
        if (lp)
            add_logprobs(j, m, i, pp, piece->len, j->text_len + before, lp);
        if (stopped) {
            j->text_stopped = true;
            break;
        }
    }
    j->text_len += released->len;
    /* a stream gets one chunk per batch of tokens, even when no text is
     * released yet (a held-back partial character, stop prefix or marker, a
     * control token): the client sees every step, and its time to first
     * token is the first token's, not the first printable character's */
    reply_text(j, released->p ? released->p : "", released->len, lp, !j->text_stopped);
    if (!j->stream && lp) {
        if (!j->lp)
            j->lp = new_lp_container(j);
        if (j->chat)
            json_array_extend(j->lp, lp);
        else {
            const char *k;
            json_t *v;
            json_object_foreach(lp, k, v) json_array_extend(json_object_get(j->lp, k), v);
        }
    }
    json_decref(lp);
    j->t_last = now;
    if (j->text_stopped) {
        /* a stop string ended it: the worker need not go on */
        send_cancel(j);
        finish_ok(j, "stop", j->request.n_tokens, j->completion_tokens, 0);
    } else if (j->stream) {
        stream_flush(j);
    }
    check_disconnect(j);
}

static int error_status(const char *code)
{
    if (!strcmp(code, "context_length_exceeded") || !strcmp(code, "bad_request"))
        return 400;
    if (!strcmp(code, "overloaded") || !strcmp(code, "unavailable"))
        return 503;
    if (!strcmp(code, "capacity"))
        return 429; /* the worker's KV cannot take it: retry later (Retry-After) */
    return 500;
}

void mr_gw_on_worker_event(mr_gw_worker *w, mr_wevent *ev)
{
    mr_gw_model *model = w->model;
    if (ev->kind == MR_WEV_UP) {
        w->connected = true;
        w->ready = false;
        mr_msg h;
        mr_msg_init(&h, MR_MSG_HELLO, 0);
        snprintf(h.model, sizeof h.model, "gateway");
        h.n_ctx = model->conf->context_length;
        mr_err err;
        if (mr_chan_send(&w->chan, &h, 200, &err))
            MR_WARN("gateway: hello to %s worker %d: %s", model->conf->name, w->index, err.msg);
        return;
    }
    if (ev->kind == MR_WEV_DOWN) {
        if (w->connected)
            MR_WARN("gateway: %s worker %d disconnected", model->conf->name, w->index);
        w->connected = false;
        w->ready = false;
        mr_gw_fail_worker_jobs(w, "the worker serving this request exited");
        return;
    }
    mr_msg *m = &ev->msg;
    switch (m->type) {
    case MR_MSG_HELLO:
        w->ready = true;
        w->n_ctx = m->n_ctx;
        MR_INFO("gateway: %s worker %d ready (model %s, ctx %u, pid %u)", model->conf->name, w->index, m->model,
                m->n_ctx, m->pid);
        pump_queue(model);
        return;
    case MR_MSG_CAPACITY:
        mr_msg_free(&w->cap);
        w->cap = *m;
        mr_msg_init(m, MR_MSG_NONE, 0);
        w->kv_est = (int64_t)(w->cap.kv_free * w->cap.block_tokens);
        pump_queue(model);
        return;
    default:
        break;
    }
    mr_job *j = m->id ? find_job(w->gw, m->id) : NULL;
    if (!j || j->worker != w) {
        if (m->type == MR_MSG_ERROR)
            MR_WARN("gateway: %s worker %d error: %s: %s", model->conf->name, w->index, m->code, m->text);
        return; /* a job that already ended (cancelled, failed over) */
    }
    switch (m->type) {
    case MR_MSG_TOKENS:
        on_tokens(j, m);
        break;
    case MR_MSG_FINAL: {
        worker_release(j);
        if (!j->text_stopped) {
            const char *fin = m->finish == MR_FINISH_LENGTH ? "length" : "stop";
            uint32_t completion = m->completion_tokens > j->completion_tokens ? m->completion_tokens : j->completion_tokens;
            finish_ok(j, fin, m->prompt_tokens ? m->prompt_tokens : j->request.n_tokens, completion,
                      m->cached_tokens);
        }
        maybe_free(j);
        break;
    }
    case MR_MSG_ERROR:
        /* an undecodable message about this request: the worker may still be
         * running it, so stop it there too */
        if (!strcmp(m->code, "bad_message"))
            send_cancel(j);
        worker_release(j);
        finish_error(j, error_status(m->code), m->code, m->text);
        maybe_free(j);
        break;
    default:
        break;
    }
}

void mr_gw_fail_worker_jobs(mr_gw_worker *w, const char *why)
{
    mr_gw *gw = w->gw;
    h2o_linklist_t *l = gw->jobs.next;
    while (l != &gw->jobs) {
        mr_job *j = H2O_STRUCT_FROM_MEMBER(mr_job, all, l);
        l = l->next;
        if (j->worker == w && j->wstate == J_RUNNING) {
            worker_release(j);
            finish_error(j, 503, "worker_lost", why);
            maybe_free(j);
        }
    }
    w->running = 0;
    /* a restarted worker reports afresh */
    mr_msg_free(&w->cap);
    mr_msg_init(&w->cap, MR_MSG_CAPACITY, 0);
    w->kv_est = 0;
    /* queued jobs of a model with no live worker left cannot be served */
    bool any;
    pick_worker(w->model, 0, &any);
    if (!any) {
        l = gw->jobs.next;
        while (l != &gw->jobs) {
            mr_job *j = H2O_STRUCT_FROM_MEMBER(mr_job, all, l);
            l = l->next;
            if (j->model == w->model && j->wstate == J_QUEUED) {
                worker_release(j);
                finish_error(j, 503, "worker_unavailable", "no live worker for this model");
                maybe_free(j);
            }
        }
    }
}

/* A stream that has sent nothing for stream_keepalive_ms (a long prompt's
 * prefill, a wait in the queue) gets an SSE comment line, which clients
 * ignore: without it, proxies and HTTP clients with an idle timeout (60 s in
 * nginx's default proxy_read_timeout, 300 s in Node's fetch) drop the
 * connection before the first token of a prompt that takes minutes. */
static void stream_keepalive(mr_job *j, double now)
{
    const int ms = j->gw->conf.stream_keepalive_ms;
    if (ms <= 0 || !j->stream || !j->headers_sent || !j->req || j->http_done || j->sending || j->final_queued ||
        j->out.len || now - j->t_sent < ms / 1000.0)
        return;
    mr_buf_adds(&j->out, ": keep-alive\n\n");
    stream_flush(j);
}

void mr_gw_jobs_tick(mr_gw *gw)
{
    const double now = mr_now();
    h2o_linklist_t *l = gw->jobs.next;
    while (l != &gw->jobs) {
        mr_job *j = H2O_STRUCT_FROM_MEMBER(mr_job, all, l);
        l = l->next;
        check_disconnect(j);
        if (!maybe_free(j))
            stream_keepalive(j, now);
    }
    if (gw->draining && (gw->n_jobs == 0 || now > gw->drain_deadline)) {
        /* past the deadline: end what is left */
        l = gw->jobs.next;
        while (l != &gw->jobs) {
            mr_job *j = H2O_STRUCT_FROM_MEMBER(mr_job, all, l);
            l = l->next;
            send_cancel(j);
            worker_release(j);
            finish_error(j, 503, "draining", "the server is shutting down");
            maybe_free(j);
        }
        gw->stop = true;
    }
}

/* ---------- admission ---------- */

/* A chat request whose output follows a grammar (response_format, grammar,
 * or tool_choice "required" / a named function, whose grammar is made here
 * for the model's tool-call format): thinking is turned off, because the
 * grammar applies from the first generated token, where the reasoning
 * would be. */
static int constrained_chat(mr_job *j, mr_oai_req *r, mr_oai_error *e)
{
    if (r->tool_choice != MR_TOOL_CHOICE_AUTO && r->tools) {
        mr_err err;
        size_t len;
        if (mr_tool_grammar(j->model->fmt.tools, r->tools,
                            r->tool_choice == MR_TOOL_CHOICE_NAMED ? r->tool_name : NULL,
                            r->parallel_tool_calls && r->tool_choice == MR_TOOL_CHOICE_REQUIRED, &r->grammar, &len,
                            &err))
            return mr_oai_err(e, 400, "tool_choice", NULL, "'tool_choice': %s", err.msg);
        r->grammar_param = "tool_choice";
    }
    if (!r->grammar)
        return 0;
    json_t *et = json_object_get(r->root, "enable_thinking");
    if (json_is_true(et))
        return mr_oai_err(e, 400, r->grammar_param, NULL,
                          "'%s' needs thinking off: the grammar applies from the first generated token",
                          r->grammar_param);
    if (json_object_set_new(r->root, "enable_thinking", json_false()))
        return mr_oai_err(e, 500, NULL, NULL, "out of memory");
    return 0;
}

static int build_prompt(mr_job *j, mr_oai_req *r, mr_oai_error *e)
{
    mr_codec *c = j->model->codec;
    mr_err err;
    uint32_t *ids = NULL, n = 0;
    if (r->prompt_ids) {
        for (uint32_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= c->n_vocab)
                return mr_oai_err(e, 400, "prompt", NULL, "token id %u is outside the vocabulary (%u)",
                                  r->prompt_ids[i], c->n_vocab);
        ids = r->prompt_ids;
        n = r->n_prompt_ids;
        r->prompt_ids = NULL;
    } else {
        mr_buf text = {0};
        const char *src = r->prompt;
        size_t len = r->prompt_len;
        if (r->chat) {
            if (constrained_chat(j, r, e))
                return -1;
            if (c->chat(c, r->root, &text, &err)) {
                mr_buf_free(&text);
                return mr_oai_err(e, 400, "messages", NULL, "chat template: %s", err.msg);
            }
            src = text.p;
            len = text.len;
            /* the reply is read in the model's format, from where the
             * prompt leaves it (inside an opened <think> or not) */
            mr_chat_format *f = &j->model->fmt;
            bool opens_think = mr_chat_prompt_opens_think(f, text.p, text.len);
            j->in_think = opens_think;
            if (opens_think && r->grammar) {
                mr_buf_free(&text);
                return mr_oai_err(e, 400, r->grammar_param ? r->grammar_param : "tool_choice", NULL,
                                  "this model's chat template opens its reasoning even with enable_thinking false, "
                                  "and the output must follow a grammar from its first token");
            }
            mr_chatout_init(&j->co, f, opens_think, r->tools, r->parallel_tool_calls, r->include_reasoning);
        }
        int rc = c->encode(c, src ? src : "", len, r->chat, &ids, &n, &err);
        mr_buf_free(&text);
        if (rc)
            return mr_oai_err(e, 400, r->chat ? "messages" : "prompt", NULL, "tokenizer: %s", err.msg);
        if (n == 0) {
            free(ids);
            return mr_oai_err(e, 400, r->chat ? "messages" : "prompt", NULL, "the prompt has no tokens");
        }
    }
    j->request.tokens = ids;
    j->request.n_tokens = n;
    return 0;
}

uint32_t mr_gw_model_ctx(const mr_gw_model *m)
{
    uint32_t ctx = m->conf->context_length;
    for (int i = 0; i < m->n_workers; i++)
        if (m->workers[i].ready && m->workers[i].n_ctx && m->workers[i].n_ctx < ctx)
            ctx = m->workers[i].n_ctx;
    return ctx;
}

/* A job refused before it was admitted (nothing else points to it yet). */
static void job_discard(mr_job *j)
{
    mr_msg_free(&j->request);
    mr_textout_free(&j->tout);
    mr_chatout_free(&j->co);
    free(j);
}

int mr_gw_admit(mr_gw *gw, h2o_req_t *req, mr_oai_req *r, const char *tenant, const mr_key *key, const char *route)
{
    mr_oai_error e;
    mr_gw_model *model = mr_gw_find_model(gw, r->model);
    if (!model) {
        mr_oai_err(&e, 404, "model", "model_not_found", "The model '%s' does not exist", r->model);
        mr_gw_send_error(req, &e, route, 0);
        return 0;
    }
    mr_tenant_state *ts = mr_gw_tenant(gw, tenant);
    mr_key_state *ks = key ? mr_gw_key_state(gw, key->id) : NULL;
    if (ts)
        ts->requests++;
    if (ts && ts->cap && ts->running >= ts->cap) {
        ts->rejected++;
        mr_oai_err(&e, 429, NULL, "rate_limit_exceeded", "tenant '%s' is at its concurrency limit (%d)", tenant,
                   ts->cap);
        mr_gw_send_error(req, &e, route, gw->conf.retry_after_s);
        return 0;
    }
    if (ks && key->max_concurrency && ks->running >= key->max_concurrency) {
        if (ts)
            ts->rejected++;
        mr_oai_err(&e, 429, NULL, "rate_limit_exceeded", "this API key is at its concurrency limit (%d)",
                   key->max_concurrency);
        mr_gw_send_error(req, &e, route, gw->conf.retry_after_s);
        return 0;
    }
    bool any_ready;
    pick_worker(model, 0, &any_ready);
    if (!any_ready) {
        mr_oai_err(&e, 503, NULL, "worker_unavailable", "no live worker for model '%s'", model->conf->name);
        mr_gw_send_error(req, &e, route, gw->conf.retry_after_s);
        return 0;
    }

    mr_job *j = calloc(1, sizeof *j);
    if (!j) {
        mr_oai_err(&e, 500, NULL, NULL, "out of memory");
        mr_gw_send_error(req, &e, route, 0);
        return 0;
    }
    j->gw = gw;
    j->model = model;
    j->route = route;
    j->chat = r->chat;
    j->stream = r->stream;
    j->include_usage = r->include_usage;
    j->id = ++gw->next_id;
    j->created = (long)time(NULL);
    j->t_start = mr_now();
    int off = snprintf(j->idstr, sizeof j->idstr, "%s", r->chat ? "chatcmpl-" : "cmpl-");
    random_hex(j->idstr + off, 16);
    mr_msg_init(&j->request, MR_MSG_REQUEST, j->id);
    mr_textout_init(&j->tout);
    j->ts = ts;
    j->ks = ks;
    if (build_prompt(j, r, &e)) {
        job_discard(j);
        mr_gw_send_error(req, &e, route, 0);
        return 0;
    }
    uint32_t ctx = mr_gw_model_ctx(model);
    uint32_t np = j->request.n_tokens;
    if (np >= ctx || (r->has_max_tokens && (uint64_t)np + r->max_tokens > ctx)) {
        mr_oai_err(&e, 400, r->has_max_tokens && np < ctx ? "max_tokens" : (r->chat ? "messages" : "prompt"),
                   "context_length_exceeded",
                   "This model's maximum context length is %u tokens; the prompt has %u tokens%s", ctx, np,
                   r->has_max_tokens ? " plus the requested max_tokens" : "");
        job_discard(j);
        mr_gw_send_error(req, &e, route, 0);
        return 0;
    }
    uint32_t room = ctx - np;
    uint32_t maxt = r->has_max_tokens ? r->max_tokens : model->conf->max_tokens_default;
    j->request.max_tokens = maxt < room ? maxt : room;
    j->request.samp = r->samp;
    j->request.grammar = r->grammar; /* the request message owns it now */
    r->grammar = NULL;
    if (model->codec->n_stop_ids) {
        j->request.stop_ids = malloc(model->codec->n_stop_ids * sizeof *j->request.stop_ids);
        if (j->request.stop_ids) {
            memcpy(j->request.stop_ids, model->codec->stop_ids, model->codec->n_stop_ids * sizeof *j->request.stop_ids);
            j->request.n_stop_ids = model->codec->n_stop_ids;
        }
    }
    snprintf(j->request.tenant, sizeof j->request.tenant, "%s", tenant);
    snprintf(j->request.cache_salt, sizeof j->request.cache_salt, "%s", r->cache_salt ? r->cache_salt : "");
    snprintf(j->request.session, sizeof j->request.session, "%s", r->user ? r->user : "");
    /* capacity: a job no worker's KV could ever hold is shed now; one that
     * does not fit yet waits in the bounded queue; past it, 429 */
    j->kv_need = (uint64_t)np + j->request.max_tokens;
    uint64_t largest;
    if (kv_never_fits(model, j->kv_need, &largest)) {
        if (ts)
            ts->rejected++;
        model->kv_refused++;
        mr_oai_err(&e, 429, NULL, "capacity",
                   "this request needs %llu KV tokens (prompt %u + max_tokens %u); the largest worker of model '%s' "
                   "holds %llu: lower max_tokens or retry later",
                   (unsigned long long)j->kv_need, np, j->request.max_tokens, model->conf->name,
                   (unsigned long long)largest);
        job_discard(j);
        mr_gw_send_error(req, &e, route, gw->conf.retry_after_s);
        return 0;
    }
    mr_gw_worker *w = pick_worker(model, j->kv_need, &any_ready);
    if (!w && (uint32_t)model->queued >= model->conf->queue_max) {
        if (ts)
            ts->rejected++;
        job_discard(j);
        mr_oai_err(&e, 429, NULL, "rate_limit_exceeded", "model '%s' is overloaded; retry later", model->conf->name);
        mr_gw_send_error(req, &e, route, gw->conf.retry_after_s);
        return 0;
    }
    for (int i = 0; i < r->n_stops; i++)
        mr_textout_add_stop(&j->tout, r->stops[i]);
    if (job_index(gw, j)) {
        job_discard(j);
        mr_oai_err(&e, 500, NULL, NULL, "out of memory");
        mr_gw_send_error(req, &e, route, 0);
        return 0;
    }

    h2o_linklist_insert(&gw->jobs, &j->all);
    gw->n_jobs++;
    if (ts)
        ts->running++;
    if (ks)
        ks->running++;
    j->req = req;
    j->ref = h2o_mem_alloc_shared(&req->pool, sizeof *j->ref, on_req_dispose);
    j->ref->job = j;

    if (j->stream) {
        struct job_gen *g = h2o_mem_alloc_pool(&req->pool, sizeof *g);
        g->super.proceed = on_proceed;
        g->super.stop = on_stop;
        g->ref = j->ref;
        req->res.status = 200;
        req->res.reason = "OK";
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, H2O_STRLIT("text/event-stream"));
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, H2O_STRLIT("no-cache"));
        h2o_iovec_t rid = h2o_strdup(&req->pool, j->idstr, strlen(j->idstr)); /* h2o keeps the pointer */
        h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0, NULL, rid.base, rid.len);
        h2o_start_response(req, &g->super);
        j->headers_sent = true;
        if (j->chat)
            stream_chunk(j, "", 0, true, NULL, NULL);
        else
            mr_buf_adds(&j->out, ": memra\n\n");
        stream_flush(j);
    }
    if (w) {
        if (dispatch(j, w)) {
            j->wstate = J_DONE;
            finish_error(j, 503, "worker_unavailable", "the worker for this model is not reachable");
            maybe_free(j);
        }
    } else {
        h2o_linklist_insert(&model->queue, &j->qlink);
        model->queued++;
    }
    return 0;
}

/* The worker process's request loop: one nng pair0 socket to the gateway,
 * many requests multiplexed by id.  Requests run interleaved: every pass of
 * the loop first drains incoming messages (so a cancel lands before the next
 * decode step), then advances each running sequence by one token.  An engine
 * does the actual computing; the loop owns ids, limits, queueing and replies. */
#ifndef MR_WORKER_SERVER_H
#define MR_WORKER_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/msg.h"

typedef struct mr_engine mr_engine;
typedef struct mr_step mr_step;

/* What a scheduling engine reports from inside its step (see submit). */
typedef enum mr_engine_ev {
    MR_ENGINE_TOKEN = 1, /* step: one generated token */
    MR_ENGINE_FINAL = 2, /* finish and usage: the request ended */
    MR_ENGINE_ERROR = 3, /* text: the request ended with an engine error */
} mr_engine_ev;
typedef struct mr_engine_event {
    mr_engine_ev type;
    uint64_t id;
    const mr_step *step;    /* TOKEN */
    enum mr_finish finish;  /* FINAL */
    uint32_t prompt_tokens, completion_tokens, cached_tokens; /* FINAL */
    const char *text;       /* ERROR */
} mr_engine_event;
typedef void (*mr_engine_emit)(void *ctx, const mr_engine_event *ev);

/* Answers of mr_engine.submit. */
enum {
    MR_ENGINE_ADMITTED = 0,
    MR_ENGINE_WAIT = 1,      /* no room now (slots or KV): stays queued, retried after a step */
    MR_ENGINE_NEVER = 2,     /* can never fit this worker's KV pool: refused with code "capacity" */
    MR_ENGINE_REFUSED = -1,  /* the request itself is wrong (err says why) */
};

/* Capacity as the worker reports it (the capacity message). */
typedef struct mr_engine_cap {
    uint64_t kv_total, kv_free;      /* blocks: all; what a new request may still reserve */
    uint32_t block_tokens;
    uint64_t cache_blocks, cache_capacity, cache_prompt_tokens, cache_hit_tokens, cache_evictions;
    uint64_t vram_free, vram_total;
} mr_engine_cap;

/* One generated token and, when asked, its log-probability and the top
 * alternatives (top_ids/top_lps hold n_top entries). */
struct mr_step {
    uint32_t token;
    bool eos;        /* the token ends generation and is not shown */
    float logprob;
    uint32_t n_top;
    uint32_t top_ids[MR_MSG_MAX_TOP_LOGPROBS];
    float top_lps[MR_MSG_MAX_TOP_LOGPROBS];
};

struct mr_engine {
    const char *name;
    char model_name[MR_MSG_MODEL_MAX + 1];
    uint32_t n_ctx, n_vocab;
    /* Starts a sequence from a validated request (prefill happens here or on
     * the first step).  Returns NULL with err set on failure. */
    void *(*seq_new)(mr_engine *e, const mr_msg *req, mr_err *err);
    /* Computes the next token of the sequence. */
    int (*seq_step)(mr_engine *e, void *seq, mr_step *out, mr_err *err);
    void (*seq_free)(mr_engine *e, void *seq);
    /* Called once per pass over the running sequences (may be NULL). */
    void (*round)(mr_engine *e);
    void (*destroy)(mr_engine *e);

    /* A scheduling engine sets submit, cancel and step instead of the
     * seq_* hooks: it admits requests itself (KV reservations), runs its
     * own continuous batch, and reports tokens and ends through emit from
     * inside step (and never elsewhere).  A cancelled request's FINAL comes
     * from the next step. */
    int (*submit)(mr_engine *e, const mr_msg *req, mr_err *err);
    void (*cancel)(mr_engine *e, uint64_t id);
    /* One iteration over the admitted requests; the number still live. */
    int (*step)(mr_engine *e, mr_engine_emit emit, void *ctx);
    void (*capacity)(mr_engine *e, mr_engine_cap *out);
};

typedef struct mr_worker_opts {
    const char *listen;
    int device;
    uint32_t max_running; /* sequences advanced together; more wait in FIFO */
    uint32_t max_queued;  /* beyond it requests get an "overloaded" error */
} mr_worker_opts;

/* Serves until SIGTERM/SIGINT.  Returns the process exit code. */
int mr_worker_serve(mr_engine *e, const mr_worker_opts *o);

/* A deterministic test engine that needs no model: token i of the output is
 * prompt[i mod n_prompt]; logprob of step i is -(i mod 4)/4 and the top
 * alternatives are token+k with logprob -(i mod 4)/4 - k.  With eos_id
 * (>= 0) a prompt token equal to it ends generation when it comes up.
 * delay_ms sleeps once per decode pass (as one batched step would take),
 * to give tests time to act mid-stream. */
mr_engine *mr_engine_fake(const char *model_name, uint32_t n_ctx, uint32_t n_vocab, int eos_id, int delay_ms);
/* Fake backend test hook: the token `token` goes out as a malformed
 * message, to test how the gateway copes with a broken worker. */
void mr_engine_fake_corrupt(long token);

/* How the real engine is set up (zero: the default of each). */
typedef struct mr_engine_model_opts {
    const char *backend;   /* "auto" (NULL), "cpu", "cuda" */
    int device;            /* CUDA device (< 0: 0) */
    const char *name;      /* served model name (NULL: the path) */
    int n_ctx;             /* tokens per sequence; 0: the model's default */
    int n_seqs;            /* requests in the running batch at once; 0: 1 */
    int chunk_tokens;      /* most prompt tokens of one request per step; 0: MR_SCHED_CHUNK_DEFAULT (2048) */
    int block_tokens;      /* KV block size; 0: 16 */
    /* KV pool.  kv_tokens > 0 or kv_bytes > 0 size it on any backend; else
     * on CUDA kv_fraction (0: 0.9) of the VRAM free after the weights, less
     * kv_reserve_bytes (0: 1 GiB) for activations; else (CPU) n_seqs * n_ctx. */
    long long kv_tokens;
    size_t kv_bytes;
    double kv_fraction;
    size_t kv_reserve_bytes;
    int prefix_blocks;     /* prefix cache capacity in blocks; 0: the pool; < 0: off */
    int spec_k;            /* MTP drafts per step for a lone greedy request (mr_sched_opts.spec_k); 0: off */
    int kv_dtype;          /* K/V element type (mr_kv_dtype); 0: the backend's, float16 on CUDA,
                              float32 on the CPU (its only one) */
} mr_engine_model_opts;

/* The real engine: the GGUF model at path, served by the scheduler
 * (worker/sched.h): continuous batching, chunked prefill, paged KV pool,
 * tenant-scoped prefix cache, KV-aware admission. */
mr_engine *mr_engine_model(const char *path, const mr_engine_model_opts *o, mr_err *err);

#endif

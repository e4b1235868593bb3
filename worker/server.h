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

/* One generated token and, when asked, its log-probability and the top
 * alternatives (top_ids/top_lps hold n_top entries). */
typedef struct mr_step {
    uint32_t token;
    bool eos;        /* the token ends generation and is not shown */
    float logprob;
    uint32_t n_top;
    uint32_t top_ids[MR_MSG_MAX_TOP_LOGPROBS];
    float top_lps[MR_MSG_MAX_TOP_LOGPROBS];
} mr_step;

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

/* The real engine: the GGUF model at path on backend ("auto", "cpu",
 * "cuda"), n_ctx tokens per sequence (0: the model's default), n_seqs
 * sequences at once. */
mr_engine *mr_engine_model(const char *path, const char *backend, int device, const char *name, int n_ctx,
                           int n_seqs, mr_err *err);

#endif

/* The worker scheduler: iteration-level continuous batching over one model.
 *
 * Requests join and leave the running batch at every step.  A step runs one
 * batched forward (mr_model_forward_batch): one token for every request
 * that is decoding, then prompt chunks of the requests still in prefill
 * (chunk_tokens each, admission order) up to step_tokens in all, so a long
 * prompt is spread over several steps instead of stalling running streams.
 * A request's tokens do not depend on its batchmates or on how its prompt
 * was chunked (DESIGN.md, numerics rules).
 *
 * Admission is where capacity is decided: mr_sched_submit reserves every KV
 * block the request may need (prompt + max_tokens, less the blocks the
 * prefix cache already holds, evicting unused cached blocks if that makes
 * room) or refuses with MR_SCHED_NO_CAPACITY, so an admitted request never
 * fails for lack of blocks.  The prefix cache is scoped by (tenant,
 * cache_salt); a finished request leaves its full blocks (prompt and
 * generated tokens) in it, so a follow-up turn that extends the
 * conversation reuses them (a request that names a session keeps them
 * there in preference to others).
 *
 * Results come back through one callback, called from inside mr_sched_step
 * (and never from anywhere else): a TOKEN event per generated id, then one
 * FINISH event with the reason and the usage.  The callback may call
 * mr_sched_cancel; it must not call submit, step or free.
 *
 * A lone greedy request may be decoded speculatively (mr_sched_opts.spec_k):
 * a step then runs its K drafts and delivers every accepted token, still
 * one TOKEN event each, in order.  The MTP block runs over the prompt of
 * every request that may speculate as its chunks run, so its first
 * speculative step has drafts.
 *
 * Not thread-safe: one thread (the worker's loop) owns a scheduler. */
#ifndef MR_SCHED_H
#define MR_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "worker/constrain.h"
#include "worker/model.h"
#include "worker/prefix.h"
#include "worker/sample.h"
#include "worker/spec.h"

typedef struct mr_sched mr_sched;

/* Prompt tokens of one request a step by default.  Larger chunks feed the
 * prompt GEMMs and expert tiles more rows a weight read: on an H200 the
 * 30B-A3B's 16 x 512-token burst runs 845 output tok/s at 256, 969 at 512,
 * 1,058 at 2,048 (means of two), and a 32k-token prompt's first token
 * comes 16-19% sooner at 2,048 than at 256 (docs/PERFORMANCE.md, runs
 * 192-195).  The price is the running streams' gap while such a step runs
 * (inter-token p99 37 -> 139 ms in that burst); --chunk 256 keeps streams
 * smoother. */
#define MR_SCHED_CHUNK_DEFAULT 2048

typedef struct mr_sched_opts {
    int max_seqs;           /* requests admitted at once; 0: 64 */
    int chunk_tokens;       /* most prompt tokens of one request per step; 0: MR_SCHED_CHUNK_DEFAULT */
    int step_tokens;        /* most tokens per step (>= max_seqs); 0: max_seqs + chunk_tokens */
    int prefix_blocks;      /* prefix cache capacity in blocks; 0: the whole pool; < 0: off */
    int default_max_tokens; /* for requests with max_tokens <= 0; 0: up to the context */
    /* MTP self-speculation (worker/sched_spec.h): a plain greedy request
     * (temperature 0, no penalties, no want_logits) of a model with an MTP
     * block verifies up to spec_k drafts (1..8) per step while it is the
     * only live request; with batchmates every request decodes one token a
     * step (batching beats speculation then).  The tokens are those of plain
     * greedy decoding.  0: off; ignored for models without an MTP block. */
    int spec_k;
    /* Tests: replaces the drafts of each speculative step (worker/spec.h;
     * first: how many tokens the request has generated).  replace NULL: none. */
    mr_spec_drafter spec_drafter;
    /* The model's tokens as bytes (worker/constrain.h), which requests with
     * a grammar are matched against; must outlive the scheduler.  NULL:
     * such requests are refused. */
    const mr_constrain_vocab *vocab;
} mr_sched_opts;

typedef struct mr_request {
    uint64_t id;              /* the caller's id, echoed in events; unique among live requests */
    const int32_t *prompt;    /* copied */
    int n_prompt;
    int max_tokens;           /* <= 0: opts.default_max_tokens; capped by the context */
    mr_sample_params sampling;
    const int32_t *stop_ids;  /* generating one of these finishes with MR_SCHED_FIN_STOP; copied */
    int n_stop;
    const char *tenant;       /* prefix-cache scope (NULL: ""); copied */
    const char *cache_salt;   /* further splits the scope (NULL: ""); copied */
    /* session_id or user of a conversation (NULL or "": none).  Lookups do
     * not depend on it (a follow-up turn hits by its tokens); a session's
     * blocks are kept in the cache in preference to one-off prompts. */
    const char *session;
    /* The TOKEN event carries the raw logits row the id was drawn from
     * (log-probabilities); the backend then never picks the argmax itself. */
    bool want_logits;
    /* A GBNF grammar (common/grammar.h) the output must follow, or NULL /
     * "": none.  Each step only tokens that keep the output a prefix of one
     * of its sentences may be drawn, and the stop ids only once it is a
     * whole sentence; when nothing can follow, the request finishes with
     * MR_SCHED_FIN_STOP.  Such a request samples on the host and never
     * speculates. */
    const char *grammar;
} mr_request;

typedef enum mr_finish_reason {
    MR_SCHED_FIN_STOP = 1,      /* a stop id was generated (reported, not emitted as a token) */
    MR_SCHED_FIN_LENGTH = 2,    /* max_tokens or the context reached */
    MR_SCHED_FIN_CANCELLED = 3,
    MR_SCHED_FIN_ERROR = 4,     /* the forward step failed; message in error */
} mr_finish_reason;

typedef struct mr_usage {
    int prompt_tokens;
    int completion_tokens;   /* generated ids, the stop id included */
    int cached_tokens;       /* prompt tokens served by the prefix cache */
} mr_usage;

typedef enum mr_sched_event_type { MR_EV_TOKEN = 1, MR_EV_FINISH = 2 } mr_sched_event_type;

typedef struct mr_sched_event {
    mr_sched_event_type type;
    uint64_t id;
    int32_t token;           /* TOKEN: the generated id; FINISH/STOP: the stop id; else -1 */
    mr_finish_reason reason; /* FINISH */
    mr_usage usage;          /* FINISH */
    const char *error;       /* FINISH/ERROR: one line; valid during the callback */
    const float *logits;     /* TOKEN of a want_logits request: [n_vocab] before sampling; else NULL */
} mr_sched_event;

typedef void (*mr_sched_cb)(void *user, const mr_sched_event *ev);

/* The model (and its backend) must outlive the scheduler.  opts may be NULL. */
int mr_sched_new(mr_model *m, const mr_sched_opts *opts, mr_sched_cb cb, void *user, mr_sched **out,
                 mr_err *err);
/* Runs the largest step the options allow once, on a throwaway sequence
 * (mr_model_warmup), so that its buffers are allocated at start: a server
 * calls it before taking requests. */
int mr_sched_warmup(mr_sched *s, mr_err *err);
/* Drops every live request without events and releases all KV blocks. */
void mr_sched_free(mr_sched *s);

enum {
    MR_SCHED_OK = 0,
    MR_SCHED_NO_CAPACITY = 1, /* no free slot or not enough KV now: retry later or shed (429) */
    MR_SCHED_TOO_LARGE = 2,   /* needs more KV blocks than the whole pool holds: it never fits */
    MR_SCHED_INVALID = -1,    /* the request itself is wrong (message in err) */
};
/* Admits r (copying what it points to) or says why not; err gets a
 * one-line reason for both refusals. */
int mr_sched_submit(mr_sched *s, const mr_request *r, mr_err *err);

/* Marks request id cancelled: at the start of the next step it is dropped
 * and its FINISH/CANCELLED event delivered.  -1 when no live request has id. */
int mr_sched_cancel(mr_sched *s, uint64_t id);

/* One iteration: drops cancelled requests, runs one batched forward, samples,
 * delivers events, retires finished requests.  Returns the number of live
 * requests afterwards, or -1 when the forward failed (err says why; the
 * requests of that step were finished with MR_SCHED_FIN_ERROR, the others go on). */
int mr_sched_step(mr_sched *s, mr_err *err);

typedef struct mr_sched_stats {
    int live;                /* admitted and not finished */
    int prefilling, decoding;
    int max_seqs;
    int kv_blocks, kv_free, kv_reserved, kv_available; /* pool: all, unreferenced, promised, free - promised */
    int kv_admissible;       /* what a new request may still reserve: available + cached blocks no sequence holds */
    int block_tokens;
    uint64_t steps, step_tokens_total; /* tokens run through forward */
    uint64_t admitted, refused, finished;
    /* speculative steps, drafts verified and accepted, re-runs after a rejection */
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_replays;
    uint64_t spec_primed; /* prompt positions the MTP block ran over (not those from the prefix cache) */
    mr_prefix_stats prefix;
} mr_sched_stats;

void mr_sched_get_stats(const mr_sched *s, mr_sched_stats *out);

#endif

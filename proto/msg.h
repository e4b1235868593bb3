/* Gateway <-> worker messages.  Each message is one msgpack map with
 * "v" (protocol version), "type" (a short string) and "id" (the request id
 * the gateway assigned; 0 for messages about the worker as a whole), plus
 * the fields of its type.  Many requests share one connection per worker, so
 * every per-request message carries its id.
 *
 *   hello     worker -> gateway on connect: model, context length, vocab, device, pid
 *   request   gateway -> worker: prompt token ids, limits, sampling, tenant, cache salt, grammar
 *   cancel    gateway -> worker: stop request `id` (client went away)
 *   tokens    worker -> gateway: one or more new token ids (+ logprobs when asked)
 *   final     worker -> gateway: finish reason and usage; ends request `id`
 *   error     either way: code + message; with id != 0 it ends that request
 *   cap_query gateway -> worker: ask for capacity
 *   capacity  worker -> gateway: free/total KV blocks, running, queued, VRAM, prefix cache
 *
 * Decoding validates every field's type and range; unknown fields are
 * skipped (newer peers may add some), unknown types and wrong versions are
 * errors. */
#ifndef MR_MSG_H
#define MR_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MR_PROTO_VERSION 1
#define MR_MSG_MAX_BYTES (64u << 20)  /* largest message either side accepts */
#define MR_MSG_MAX_TOKENS (1u << 22)  /* prompt or chunk token ids */
#define MR_MSG_MAX_TOP_LOGPROBS 20
#define MR_MSG_MAX_STOP_IDS 64
#define MR_MSG_MAX_GRAMMAR (1u << 20)
#define MR_MSG_TENANT_MAX 64
#define MR_MSG_SALT_MAX 256
#define MR_MSG_SESSION_MAX 256
#define MR_MSG_MODEL_MAX 128
#define MR_MSG_CODE_MAX 32
#define MR_MSG_TEXT_MAX 512

enum mr_msg_type {
    MR_MSG_NONE = 0,
    MR_MSG_HELLO,
    MR_MSG_REQUEST,
    MR_MSG_CANCEL,
    MR_MSG_TOKENS,
    MR_MSG_FINAL,
    MR_MSG_ERROR,
    MR_MSG_CAP_QUERY,
    MR_MSG_CAPACITY,
};

enum mr_finish { MR_FINISH_STOP = 0, MR_FINISH_LENGTH, MR_FINISH_CANCELLED };

typedef struct mr_sampling {
    float temperature;        /* 0 = greedy; [0, 2] */
    float top_p;              /* (0, 1] */
    float min_p;              /* [0, 1] */
    float presence_penalty;   /* [-2, 2] */
    float frequency_penalty;  /* [-2, 2] */
    float repetition_penalty; /* (0, 10] */
    uint32_t top_k;           /* 0 = off */
    bool has_seed;
    uint64_t seed;
    bool logprobs;
    uint32_t top_logprobs;    /* 0..MR_MSG_MAX_TOP_LOGPROBS */
} mr_sampling;

typedef struct mr_msg {
    enum mr_msg_type type;
    uint32_t version;
    uint64_t id;

    /* request: prompt; tokens: new ids */
    uint32_t *tokens;
    uint32_t n_tokens;

    /* request */
    uint32_t max_tokens;      /* >= 1 */
    mr_sampling samp;
    char tenant[MR_MSG_TENANT_MAX + 1];
    char cache_salt[MR_MSG_SALT_MAX + 1];
    char session[MR_MSG_SESSION_MAX + 1]; /* the client's `user`: a conversation whose KV to keep ("" none) */
    char *grammar;            /* NULL when absent */
    uint32_t *stop_ids;       /* extra end-of-generation ids */
    uint32_t n_stop_ids;

    /* tokens: logprobs[n_tokens] when logprobs were asked; top_ids/top_lps
     * [n_tokens * n_top] (row per token) when top_logprobs > 0 */
    float *logprobs;
    uint32_t n_top;
    uint32_t *top_ids;
    float *top_lps;

    /* final */
    enum mr_finish finish;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;

    /* error */
    char code[MR_MSG_CODE_MAX + 1];
    char text[MR_MSG_TEXT_MAX + 1];

    /* capacity: kv_free is what a new request may still reserve (blocks of
     * block_tokens tokens; block_tokens 0: a worker without paged KV, whose
     * "blocks" are sequence slots); the prefix cache's occupancy and its
     * counters since the worker started */
    uint64_t kv_free, kv_total, running, queued, vram_free, vram_total;
    uint64_t block_tokens, cache_blocks, cache_capacity, cache_prompt_tokens, cache_hit_tokens, cache_evictions;

    /* hello */
    char model[MR_MSG_MODEL_MAX + 1];
    uint32_t n_ctx, n_vocab, pid;
    int32_t device;
} mr_msg;

/* Sampling as requested when nothing is said: temperature 1, top_p 1,
 * repetition_penalty 1, everything else off. */
void mr_sampling_init(mr_sampling *s);

/* A zeroed message of a type with the version set and default sampling
 * (temperature 1, top_p 1, repetition_penalty 1). */
void mr_msg_init(mr_msg *m, enum mr_msg_type type, uint64_t id);
/* Frees the arrays a decode (or the caller) attached; the struct is reset. */
void mr_msg_free(mr_msg *m);

const char *mr_msg_type_name(enum mr_msg_type t);
const char *mr_finish_name(enum mr_finish f);

/* Checks the fields of m against the bounds above (also done by encode and
 * decode). */
int mr_msg_validate(const mr_msg *m, mr_err *err);

/* Encodes into a malloc'd buffer.  Validates first. */
int mr_msg_encode(const mr_msg *m, void **out, size_t *out_len, mr_err *err);
/* Encodes through write (0 = written, else out of memory), so that a
 * transport can fill its own message buffer.  Validates first. */
typedef int (*mr_msg_write_fn)(void *data, const char *buf, size_t len);
int mr_msg_pack(const mr_msg *m, mr_msg_write_fn write, void *data, mr_err *err);

/* Decodes one message that must span the whole buffer.  On failure *m is
 * freed, and *id_out (when not NULL) holds the request id if it could be read
 * (0 otherwise) so that the receiver can send an error for it. */
int mr_msg_decode(const void *buf, size_t len, mr_msg *m, uint64_t *id_out, mr_err *err);

/* Convenience: an error message for request id. */
void mr_msg_make_error(mr_msg *m, uint64_t id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif

/* Gateway configuration (JSON, see conf/memra.json and docs/SERVING.md).
 * Every field is validated; errors name the path of the bad field. */
#ifndef MR_CONFIG_H
#define MR_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

#define MR_MAX_MODELS 16
#define MR_MAX_WORKERS 16
#define MR_MAX_TENANTS 64
#define MR_MAX_WORKER_ARGS 16

typedef struct mr_worker_conf {
    int device;        /* -1 = CPU */
    char url[256];     /* nng address the worker listens on */
} mr_worker_conf;

typedef struct mr_model_conf {
    char name[128];
    char path[1024];      /* GGUF file */
    char tokenizer[16];   /* "gguf" or "bytes" */
    char backend[16];     /* passed to the worker */
    char reasoning_parser[16]; /* "auto", "think", "none" (gateway/chatout.h) */
    char tool_parser[16];      /* "auto", "hermes", "qwen3_xml", "none" */
    char *chat_template;  /* template text overriding the GGUF's, or NULL */
    uint32_t context_length;
    uint32_t max_tokens_default;
    uint32_t queue_max;           /* requests waiting beyond the running ones */
    uint32_t max_running;         /* per worker */
    mr_worker_conf workers[MR_MAX_WORKERS];
    int n_workers;
    char *worker_args[MR_MAX_WORKER_ARGS];
    int n_worker_args;
} mr_model_conf;

typedef struct mr_tenant_conf {
    char name[65];
    int max_concurrency;
} mr_tenant_conf;

typedef struct mr_config {
    char host[256];
    int port;
    uint64_t max_body_bytes;
    int request_timeout_ms;
    int drain_timeout_ms;
    int stream_keepalive_ms; /* an SSE comment on a stream that has sent nothing for this long; 0: off */
    char keyring[1024];   /* empty = no keys */
    bool supervise;
    char worker_bin[1024];
    int backoff_min_ms, backoff_max_ms;
    int retry_after_s;
    mr_tenant_conf tenants[MR_MAX_TENANTS];
    int n_tenants;
    int default_tenant_max; /* cap for tenants not listed; 0 = none */
    mr_model_conf models[MR_MAX_MODELS];
    int n_models;
} mr_config;

void mr_config_defaults(mr_config *c);
int mr_config_load(const char *path, mr_config *c, mr_err *err);
int mr_config_parse(const char *text, mr_config *c, mr_err *err);
void mr_config_free(mr_config *c);
/* Loopback means 127.0.0.0/8, ::1 or "localhost". */
bool mr_host_is_loopback(const char *host);

#endif

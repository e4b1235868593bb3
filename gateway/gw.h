/* The gateway's state, shared by its modules.  Everything here is owned by
 * the event-loop thread; the only other threads are one nng receiver per
 * worker connection, and they talk to the loop through an h2o multithread
 * queue (mr_wevent). */
#ifndef MR_GW_H
#define MR_GW_H

#define H2O_USE_LIBUV 0
#include <h2o.h>
#include <h2o/multithread.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include "gateway/auth.h"
#include "gateway/chatout.h"
#include "gateway/codec.h"
#include "gateway/config.h"
#include "gateway/metrics.h"
#include "gateway/openai.h"
#include "gateway/textout.h"
#include "proto/chan.h"

typedef struct mr_gw mr_gw;
typedef struct mr_gw_model mr_gw_model;
typedef struct mr_job mr_job;

typedef struct mr_gw_worker {
    mr_gw *gw;
    mr_gw_model *model;
    int index;
    const mr_worker_conf *conf;
    mr_chan chan;
    pthread_t thr;
    bool thr_started;
    h2o_multithread_receiver_t receiver;
    bool connected; /* an nng pipe is up */
    bool ready;     /* answered hello on this connection */
    uint32_t n_ctx;
    int running;    /* jobs assigned to it */
    mr_msg cap;     /* last capacity report */
    /* KV tokens free by the last report, less what was dispatched since,
     * plus what finished since (meaningful when cap.block_tokens > 0) */
    int64_t kv_est;
    /* supervision */
    pid_t pid;
    int restarts;
    int backoff_ms;
    double restart_at; /* when to start it again (0 = not pending) */
    double started_at;
} mr_gw_worker;

struct mr_gw_model {
    mr_gw *gw;
    const mr_model_conf *conf;
    mr_codec *codec;
    mr_chat_format fmt; /* how its replies write reasoning and tool calls */
    mr_gw_worker workers[MR_MAX_WORKERS];
    int n_workers;
    h2o_linklist_t queue; /* admitted jobs waiting for a worker slot */
    int queued;
    int running;
    uint64_t prompt_tokens, gen_tokens;
    uint64_t cached_tokens; /* prompt tokens the workers' prefix caches served */
    uint64_t kv_refused;    /* requests answered 429 because no worker's KV could ever hold them */
    mr_hist ttft, itl;
    long created;
};

typedef struct mr_tenant_state {
    char name[MR_TENANT_MAX + 1];
    int running;
    int cap;
    uint64_t requests, rejected, prompt_tokens, gen_tokens;
} mr_tenant_state;

typedef struct mr_key_state {
    char id[32];
    int running;
} mr_key_state;

struct mr_gw {
    mr_config conf;
    h2o_globalconf_t h2o;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept;
    h2o_socket_t *listener;
    h2o_multithread_queue_t *mq;
    mr_gw_model models[MR_MAX_MODELS];
    int n_models;
    mr_keyring keys;
    bool have_keys;
    double keys_checked;
    mr_tenant_state tenants[256];
    int n_tenants;
    mr_key_state key_states[1024];
    int n_key_states;
    mr_metrics metrics;
    uint64_t worker_restarts;
    bool draining;
    double drain_deadline;
    bool stop;
    uint64_t next_id;
    h2o_linklist_t jobs; /* every live job */
    int n_jobs;
    /* the same jobs by id (open addressing, linear probing; power-of-two
     * size): each worker message finds its job without walking them all */
    mr_job **job_slots;
    size_t job_slots_cap;
    h2o_timeout_t tick_timeout;
    h2o_timeout_entry_t tick;
};

/* Events from receiver / nng threads to the loop. */
enum { MR_WEV_MSG, MR_WEV_UP, MR_WEV_DOWN };
typedef struct mr_wevent {
    h2o_multithread_message_t super;
    int kind;
    mr_msg msg;
} mr_wevent;

/* gateway/jobs.c */
/* Admits a validated request (answers it when refused). */
int mr_gw_admit(mr_gw *gw, h2o_req_t *req, mr_oai_req *r, const char *tenant, const mr_key *key, const char *route);
/* The context a request may use: the configured length, or less when a
 * ready worker reported less. */
uint32_t mr_gw_model_ctx(const mr_gw_model *m);
void mr_gw_on_worker_event(mr_gw_worker *w, mr_wevent *ev);
void mr_gw_fail_worker_jobs(mr_gw_worker *w, const char *why);
void mr_gw_jobs_tick(mr_gw *gw);

/* gateway/http.c */
void mr_gw_send_json(h2o_req_t *req, int status, const char *body, size_t len, const char *route);
void mr_gw_send_error(h2o_req_t *req, const mr_oai_error *e, const char *route, int retry_after);
mr_gw_model *mr_gw_find_model(mr_gw *gw, const char *name);
mr_tenant_state *mr_gw_tenant(mr_gw *gw, const char *name);
mr_key_state *mr_gw_key_state(mr_gw *gw, const char *id);

/* gateway/supervisor.c */
void mr_sup_start_all(mr_gw *gw);
void mr_sup_tick(mr_gw *gw);
void mr_sup_stop_all(mr_gw *gw, int grace_ms);
bool mr_sup_all_exited(mr_gw *gw);

/* gateway/http.c: the listener and event loop */
int mr_gateway_main(const char *config_path);

#endif

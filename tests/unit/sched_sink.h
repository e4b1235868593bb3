/* What the scheduler suites collect of a run: each request's tokens,
 * finish and usage, as its events deliver them (an event after the finish
 * is counted, for the suites to assert there is none), with an optional
 * cancellation from inside the callback; and running a scheduler until it
 * has nothing live. */
#ifndef MR_SCHED_SINK_H
#define MR_SCHED_SINK_H

#include <string.h>

#include "tests/unit/testutil.h"
#include "worker/sched.h"

enum { MAXR = 16, MAXT = 256 };

typedef struct {
    uint64_t id;
    int32_t toks[MAXT];
    int n;
    int finished;
    mr_finish_reason reason;
    int32_t stop_token;
    mr_usage usage;
    int events_after_finish;
} out_t;

typedef struct {
    out_t r[MAXR];
    int n;
    uint64_t cancel_at_token_id; /* cancel this request from the callback ... */
    int cancel_after;            /* ... once it has this many tokens */
} sink_t;

static out_t *find(sink_t *k, uint64_t id)
{
    for (int i = 0; i < k->n; i++)
        if (k->r[i].id == id)
            return &k->r[i];
    ck_assert_int_lt(k->n, MAXR);
    out_t *o = &k->r[k->n++];
    memset(o, 0, sizeof *o);
    o->id = id;
    return o;
}

static mr_sched *cur_sched;

static void on_event(void *user, const mr_sched_event *ev)
{
    sink_t *k = user;
    out_t *o = find(k, ev->id);
    if (o->finished) {
        o->events_after_finish++;
        return;
    }
    if (ev->type == MR_EV_TOKEN) {
        ck_assert_int_lt(o->n, MAXT);
        o->toks[o->n++] = ev->token;
        if (k->cancel_at_token_id == ev->id && o->n == k->cancel_after)
            ck_assert_int_eq(mr_sched_cancel(cur_sched, ev->id), 0);
    } else {
        o->finished = 1;
        o->reason = ev->reason;
        o->stop_token = ev->token;
        o->usage = ev->usage;
    }
}

static void run_all(mr_sched *s)
{
    mr_err err;
    int live, guard = 0;
    while ((live = mr_sched_step(s, &err)) > 0)
        ck_assert_int_lt(++guard, 10000);
    ck_assert_msg(live == 0, "%s", err.msg);
}

#endif

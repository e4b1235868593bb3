/* nng transport for mr_msg.  One pair0 socket joins the gateway to each
 * worker: the worker listens, the gateway dials (and redials when the
 * worker restarts).  pair0 is bidirectional and asynchronous, so many
 * requests are multiplexed over the one connection by their request id;
 * each side may send at any time. */
#ifndef MR_CHAN_H
#define MR_CHAN_H

#include <nng/nng.h>

#include "proto/msg.h"

/* Pipe events (connect / disconnect), called on an nng thread. */
typedef void (*mr_chan_pipe_cb)(int connected, void *arg);

/* Must stay at one address while open (nng calls back with a pointer to it). */
typedef struct mr_chan {
    nng_socket sock;
    int open;
    mr_chan_pipe_cb cb;
    void *cb_arg;
    int send_timeout_ms, recv_timeout_ms; /* as last set on the socket */
} mr_chan;

int mr_chan_listen(mr_chan *c, const char *url, mr_err *err);
/* Dials in the background: returns at once and keeps reconnecting
 * (backoff between min_ms and max_ms). cb may be NULL. */
int mr_chan_dial(mr_chan *c, const char *url, mr_chan_pipe_cb cb, void *arg, mr_err *err);

/* Encodes and sends; timeout_ms < 0 blocks. */
int mr_chan_send(mr_chan *c, const mr_msg *m, int timeout_ms, mr_err *err);

enum { MR_CHAN_OK = 0, MR_CHAN_TIMEOUT = 1, MR_CHAN_BAD = 2, MR_CHAN_CLOSED = 3 };
/* Receives one message.  Returns MR_CHAN_OK, MR_CHAN_TIMEOUT,
 * MR_CHAN_BAD (undecodable message: err says why, *bad_id holds its id
 * when it could be read, the channel stays usable) or MR_CHAN_CLOSED. */
int mr_chan_recv(mr_chan *c, mr_msg *m, int timeout_ms, uint64_t *bad_id, mr_err *err);

/* Sends raw bytes (tests use it to inject malformed messages). */
int mr_chan_send_raw(mr_chan *c, const void *buf, size_t len, mr_err *err);

void mr_chan_close(mr_chan *c);

#endif

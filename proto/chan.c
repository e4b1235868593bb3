#include "proto/chan.h"

#include <nng/protocol/pair0/pair.h>
#include <limits.h>
#include <stdlib.h>

static int open_sock(mr_chan *c, mr_err *err)
{
    int rv = nng_pair0_open(&c->sock);
    if (rv)
        return mr_errf(err, "nng pair0 open: %s", nng_strerror(rv));
    nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, MR_MSG_MAX_BYTES);
    /* deep queues: a worker streams tokens of many requests at once */
    nng_socket_set_int(c->sock, NNG_OPT_RECVBUF, 1024);
    nng_socket_set_int(c->sock, NNG_OPT_SENDBUF, 1024);
    c->open = 1;
    c->send_timeout_ms = c->recv_timeout_ms = INT_MIN; /* none set yet */
    return 0;
}

int mr_chan_listen(mr_chan *c, const char *url, mr_err *err)
{
    if (open_sock(c, err))
        return -1;
    int rv = nng_listen(c->sock, url, NULL, 0);
    if (rv) {
        mr_chan_close(c);
        return mr_errf(err, "nng listen %s: %s", url, nng_strerror(rv));
    }
    return 0;
}

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    mr_chan *c = arg;
    c->cb(ev == NNG_PIPE_EV_ADD_POST, c->cb_arg);
}

int mr_chan_dial(mr_chan *c, const char *url, mr_chan_pipe_cb cb, void *arg, mr_err *err)
{
    if (open_sock(c, err))
        return -1;
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 1000);
    if (cb) {
        c->cb = cb;
        c->cb_arg = arg;
        nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, on_pipe, c);
        nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, on_pipe, c);
    }
    int rv = nng_dial(c->sock, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv) {
        mr_chan_close(c);
        return mr_errf(err, "nng dial %s: %s", url, nng_strerror(rv));
    }
    return 0;
}

int mr_chan_send_raw(mr_chan *c, const void *buf, size_t len, mr_err *err)
{
    int rv = nng_send(c->sock, (void *)buf, len, 0);
    if (rv)
        return mr_errf(err, "nng send: %s", nng_strerror(rv));
    return 0;
}

/* Socket timeouts are set only when they change: most calls (one per
 * generated token on a busy channel) reuse the previous one. */
static void set_timeout(mr_chan *c, const char *opt, int *cur, int timeout_ms)
{
    if (*cur == timeout_ms)
        return;
    nng_socket_set_ms(c->sock, opt, timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
    *cur = timeout_ms;
}

static int append_nng(void *data, const char *buf, size_t len) { return nng_msg_append(data, buf, len); }

int mr_chan_send(mr_chan *c, const mr_msg *m, int timeout_ms, mr_err *err)
{
    /* encoded straight into the nng message: no intermediate buffer or copy */
    nng_msg *msg;
    int rv = nng_msg_alloc(&msg, 0);
    if (rv)
        return mr_errf(err, "nng send %s: %s", mr_msg_type_name(m->type), nng_strerror(rv));
    if (mr_msg_pack(m, append_nng, msg, err)) {
        nng_msg_free(msg);
        return -1;
    }
    set_timeout(c, NNG_OPT_SENDTIMEO, &c->send_timeout_ms, timeout_ms);
    rv = nng_sendmsg(c->sock, msg, 0);
    if (rv) {
        nng_msg_free(msg); /* still ours when the send failed */
        return mr_errf(err, "nng send %s: %s", mr_msg_type_name(m->type), nng_strerror(rv));
    }
    return 0;
}

int mr_chan_recv(mr_chan *c, mr_msg *m, int timeout_ms, uint64_t *bad_id, mr_err *err)
{
    set_timeout(c, NNG_OPT_RECVTIMEO, &c->recv_timeout_ms, timeout_ms);
    void *buf = NULL;
    size_t len = 0;
    int rv = nng_recv(c->sock, &buf, &len, NNG_FLAG_ALLOC);
    if (rv == NNG_ETIMEDOUT)
        return MR_CHAN_TIMEOUT;
    if (rv) {
        mr_errf(err, "nng recv: %s", nng_strerror(rv));
        return MR_CHAN_CLOSED;
    }
    int bad = mr_msg_decode(buf, len, m, bad_id, err);
    nng_free(buf, len);
    return bad ? MR_CHAN_BAD : MR_CHAN_OK;
}

void mr_chan_close(mr_chan *c)
{
    if (c->open)
        nng_close(c->sock);
    c->open = 0;
}

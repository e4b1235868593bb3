#include "proto/chan.h"

#include <nng/protocol/pair0/pair.h>
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

int mr_chan_send(mr_chan *c, const mr_msg *m, int timeout_ms, mr_err *err)
{
    void *buf;
    size_t len;
    if (mr_msg_encode(m, &buf, &len, err))
        return -1;
    nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
    int rv = nng_send(c->sock, buf, len, 0);
    free(buf);
    if (rv)
        return mr_errf(err, "nng send %s: %s", mr_msg_type_name(m->type), nng_strerror(rv));
    return 0;
}

int mr_chan_recv(mr_chan *c, mr_msg *m, int timeout_ms, uint64_t *bad_id, mr_err *err)
{
    nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms);
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

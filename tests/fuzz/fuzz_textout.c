/* libFuzzer target: a differential check of the streamed text-out
 * (gateway/textout.h).  The same text goes through mr_textout_push in the
 * chunks the input gives and then mr_textout_finish, and separately in one
 * push and finish.  Streamed text must equal non-streamed text: both outputs
 * are the same bytes with the same stopped flag, valid UTF-8 (by jansson, a
 * validator independent of the gateway's), and never contain a stop string.
 *
 * Input: byte 0 % 4 stop strings, each a length byte and that many bytes
 * (kept when 1..MR_MAX_STOP_LEN bytes of valid UTF-8 without NUL); then a
 * byte n % 32 and n chunk lengths (none: one byte per push); the rest is
 * the text. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/textout.h"

typedef struct input {
    char stops[3][MR_MAX_STOP_LEN + 1];
    int n_stops;
    const uint8_t *lens;
    size_t n_lens;
    const char *text;
    size_t n_text;
} input;

static bool usable_stop(const uint8_t *p, size_t n)
{
    if (n < 1 || n > MR_MAX_STOP_LEN || memchr(p, 0, n))
        return false;
    json_t *s = json_stringn((const char *)p, n);
    json_decref(s);
    return s != NULL;
}

/* Splits the input; false when it is too short to hold its own layout. */
static bool split(const uint8_t *d, size_t size, input *in)
{
    memset(in, 0, sizeof *in);
    size_t at = 0;
    if (at >= size)
        return false;
    int want = d[at++] % 4;
    for (int i = 0; i < want; i++) {
        if (at >= size)
            return false;
        size_t n = d[at++];
        if (n > size - at)
            n = size - at;
        if (usable_stop(d + at, n)) {
            memcpy(in->stops[in->n_stops], d + at, n);
            in->stops[in->n_stops++][n] = 0;
        }
        at += n;
    }
    if (at >= size)
        return false;
    in->n_lens = d[at++] % 32;
    if (in->n_lens > size - at)
        in->n_lens = size - at;
    in->lens = d + at;
    at += in->n_lens;
    in->text = (const char *)d + at;
    in->n_text = size - at;
    return true;
}

static void start(const input *in, mr_textout *t)
{
    mr_textout_init(t);
    for (int i = 0; i < in->n_stops; i++)
        mr_textout_add_stop(t, in->stops[i]);
}

/* Pushes the text in the input's chunk lengths (a zero length is an empty
 * push, as a control token gives; the last length of a round is at least 1
 * so that every round moves on). */
static bool run_chunked(const input *in, mr_buf *out)
{
    mr_textout t;
    start(in, &t);
    bool stopped = false;
    size_t at = 0, k = 0;
    while (!stopped && at < in->n_text) {
        size_t n = 1;
        if (in->n_lens) {
            n = in->lens[k % in->n_lens];
            if (n == 0 && k % in->n_lens == in->n_lens - 1)
                n = 1;
            k++;
        }
        if (n > in->n_text - at)
            n = in->n_text - at;
        stopped = mr_textout_push(&t, in->text + at, n, out);
        at += n;
    }
    mr_textout_finish(&t, out);
    stopped = stopped || t.stopped;
    mr_textout_free(&t);
    return stopped;
}

static bool run_whole(const input *in, mr_buf *out)
{
    mr_textout t;
    start(in, &t);
    bool stopped = mr_textout_push(&t, in->text, in->n_text, out);
    mr_textout_finish(&t, out);
    stopped = stopped || t.stopped;
    mr_textout_free(&t);
    return stopped;
}

static void check_output(const input *in, const mr_buf *out)
{
    const char *p = out->p ? out->p : "";
    json_t *s = json_stringn(p, out->len);
    if (!s)
        abort(); /* not valid UTF-8 */
    json_decref(s);
    for (int i = 0; i < in->n_stops; i++)
        if (memmem(p, out->len, in->stops[i], strlen(in->stops[i])))
            abort(); /* a stop string was shown */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in;
    if (!split(data, size, &in))
        return 0;
    mr_buf a = {0}, b = {0};
    bool sa = run_chunked(&in, &a);
    bool sb = run_whole(&in, &b);
    if (sa != sb || a.len != b.len || (a.len && memcmp(a.p, b.p, a.len)))
        abort(); /* streamed text differs from non-streamed text */
    check_output(&in, &a);
    mr_buf_free(&a);
    mr_buf_free(&b);
    return 0;
}

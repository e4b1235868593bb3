#include "gateway/textout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void mr_textout_init(mr_textout *t) { memset(t, 0, sizeof *t); }

void mr_textout_add_stop(mr_textout *t, const char *s)
{
    size_t n = strlen(s);
    /* matched on the client's text, which is valid UTF-8: another stop could
     * only match inside a character */
    if (t->n_stops < MR_MAX_STOPS && n > 0 && n <= MR_MAX_STOP_LEN && mr_gw_utf8_valid(s, n) &&
        (t->stops[t->n_stops] = strdup(s)))
        t->stop_len[t->n_stops++] = n; /* every token's push looks at them */
}

void mr_textout_free(mr_textout *t)
{
    for (size_t i = 0; i < t->n_stops; i++)
        free(t->stops[i]);
    mr_buf_free(&t->raw);
    mr_buf_free(&t->pending);
    memset(t, 0, sizeof *t);
}

/* Longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t holdback(const mr_textout *t, const char *s, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < t->n_stops; i++) {
        size_t k = mr_partial_marker(s, n, t->stops[i], t->stop_len[i]);
        if (k > best)
            best = k;
    }
    return best;
}

/* Start of the stop match in s[0..n) that ends first (of those ending at
 * the same byte, the longest), or n + 1 when there is none.  Ending first,
 * not starting first: a stream learns of a match when its last byte arrives
 * and stops there, so choosing by start would make the text depend on how
 * the bytes were chunked (stops "STOP" and "TO" on "STOP" cut before "S" in
 * one push but after it when pushed byte by byte). */
static size_t first_stop(const mr_textout *t, const char *s, size_t n)
{
    size_t at = n + 1, end = SIZE_MAX;
    for (size_t i = 0; i < t->n_stops; i++) {
        size_t sl = t->stop_len[i];
        const char *hit = memmem(s, n, t->stops[i], sl);
        if (!hit)
            continue;
        size_t h = (size_t)(hit - s);
        if (h + sl < end || (h + sl == end && h < at)) {
            at = h;
            end = h + sl;
        }
    }
    return at;
}

/* Cuts the pending text at the first stop match, or releases what can no
 * longer become one.  Returns true when a stop matched. */
static bool release(mr_textout *t, mr_buf *out)
{
    const char *s = t->pending.p ? t->pending.p : "";
    size_t len = t->pending.len;
    size_t at = first_stop(t, s, len);
    if (at <= len) {
        mr_buf_add(out, s, at);
        t->stopped = true;
        mr_buf_consume(&t->pending, len);
        mr_buf_consume(&t->raw, t->raw.len);
        return true;
    }
    /* the held suffix starts as a stop does, so on a character boundary */
    size_t rel = len - holdback(t, s, len);
    mr_buf_add(out, s, rel);
    mr_buf_consume(&t->pending, rel);
    return false;
}

bool mr_textout_push(mr_textout *t, const char *bytes, size_t n, mr_buf *out)
{
    if (t->stopped)
        return true;
    /* stops are matched on the text the client sees: invalid bytes are
     * U+FFFD there, and a stop may hold U+FFFD */
    mr_buf_add(&t->raw, bytes, n);
    size_t took = mr_gw_utf8_sanitize_complete(&t->pending, t->raw.p, t->raw.len);
    mr_buf_consume(&t->raw, took);
    return release(t, out);
}

bool mr_textout_finish(mr_textout *t, mr_buf *out)
{
    if (t->stopped)
        return true;
    /* a sequence still cut off never completes: U+FFFD, which may complete a stop */
    mr_gw_utf8_sanitize(&t->pending, t->raw.p ? t->raw.p : "", t->raw.len);
    mr_buf_consume(&t->raw, t->raw.len);
    if (release(t, out))
        return true;
    mr_buf_add(out, t->pending.p ? t->pending.p : "", t->pending.len);
    mr_buf_consume(&t->pending, t->pending.len);
    return false;
}

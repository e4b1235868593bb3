#include "gateway/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void mr_buf_reserve(mr_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        abort(); /* out of memory in the gateway: nothing sensible to do */
    b->p = p;
    b->cap = cap;
}

void mr_buf_add(mr_buf *b, const void *p, size_t n)
{
    mr_buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
}

void mr_buf_adds(mr_buf *b, const char *s) { mr_buf_add(b, s, strlen(s)); }

void mr_buf_printf(mr_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    mr_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void mr_buf_free(mr_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void mr_buf_consume(mr_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    if (b->p)
        b->p[b->len] = 0;
}

void mr_buf_clear(mr_buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = 0;
}

/* Length of a valid sequence at s (1..4), 0 if invalid, -1 if valid so far
 * but cut off by the end of the buffer. */
static int seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        min = 0x10000;
    } else
        return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return -1;
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
        /* reject overlongs, surrogates and > U+10FFFF as early as possible */
        if (i == 1) {
            if (len == 3 && c == 0xe0 && s[1] < 0xa0)
                return 0;
            if (len == 3 && c == 0xed && s[1] >= 0xa0)
                return 0;
            if (len == 4 && c == 0xf0 && s[1] < 0x90)
                return 0;
            if (len == 4 && c == 0xf4 && s[1] >= 0x90)
                return 0;
        }
    }
    if (cp < min)
        return 0;
    return len;
}

/* Appends s[0..n) to out with U+FFFD for every invalid byte; with hold_cut,
 * stops before a last sequence that n cuts off.  Returns the bytes taken. */
static size_t sanitize(mr_buf *out, const char *s, size_t n, bool hold_cut)
{
    size_t i = 0;
    while (i < n) {
        int l = seq_len((const unsigned char *)s + i, n - i);
        if (l < 0 && hold_cut)
            return i; /* the next bytes decide what it is */
        if (l > 0) {
            mr_buf_add(out, s + i, (size_t)l);
            i += (size_t)l;
        } else {
            mr_buf_add(out, "\xef\xbf\xbd", 3);
            i++;
        }
    }
    return n;
}

void mr_gw_utf8_sanitize(mr_buf *out, const char *s, size_t n) { sanitize(out, s, n, false); }

size_t mr_gw_utf8_sanitize_complete(mr_buf *out, const char *s, size_t n) { return sanitize(out, s, n, true); }

size_t mr_partial_marker(const char *s, size_t n, const char *m, size_t ml)
{
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k))
            return k;
    return 0;
}

bool mr_gw_utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int l = seq_len((const unsigned char *)s + i, n - i);
        if (l <= 0)
            return false;
        i += (size_t)l;
    }
    return true;
}

double mr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

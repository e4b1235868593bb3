/* Small helpers of the gateway: a growable byte buffer, UTF-8 checks,
 * monotonic time. */
#ifndef MR_GW_UTIL_H
#define MR_GW_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mr_buf {
    char *p;
    size_t len, cap;
} mr_buf;

void mr_buf_reserve(mr_buf *b, size_t extra);
void mr_buf_add(mr_buf *b, const void *p, size_t n);
void mr_buf_adds(mr_buf *b, const char *s);
void mr_buf_printf(mr_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mr_buf_free(mr_buf *b);
void mr_buf_consume(mr_buf *b, size_t n); /* drops the first n bytes */
void mr_buf_clear(mr_buf *b);              /* empty (""), capacity kept for reuse */

/* Appends s to out, replacing every invalid UTF-8 sequence by U+FFFD.
 * Strict (no overlongs, surrogates or > U+10FFFF: the text goes into JSON),
 * unlike the lenient mr_utf8_decode of common/unicode.h. */
void mr_gw_utf8_sanitize(mr_buf *out, const char *s, size_t n);
/* mr_gw_utf8_sanitize of s[0..n) but for a last sequence that n cuts off
 * (more bytes may complete it); returns the number of bytes taken. */
size_t mr_gw_utf8_sanitize_complete(mr_buf *out, const char *s, size_t n);
bool mr_gw_utf8_valid(const char *s, size_t n);

/* Length of the longest suffix of s[0..n) that is a proper prefix of the
 * marker m (ml bytes): what a stream must hold back because the next bytes
 * could complete m (stop strings, <think>, <tool_call>). */
size_t mr_partial_marker(const char *s, size_t n, const char *m, size_t ml);

double mr_now(void); /* monotonic seconds */

#endif

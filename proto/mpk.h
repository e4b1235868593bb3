/* A bounds-checked msgpack reader over one buffer.  The decoder of every
 * message from the other process goes through it: lengths are checked
 * against the bytes actually left before anything is allocated, nesting is
 * bounded, and every failure is an mr_err naming the offset. */
#ifndef MR_MPK_H
#define MR_MPK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct mr_mpk {
    const uint8_t *p;
    size_t len;
    size_t off;
} mr_mpk;

void mr_mpk_init(mr_mpk *r, const void *data, size_t len);

/* Each reader consumes one value of the named kind or fails (and leaves the
 * cursor unspecified). */
int mr_mpk_map(mr_mpk *r, uint32_t *n, mr_err *err);
int mr_mpk_array(mr_mpk *r, uint32_t *n, mr_err *err);
/* String: points into the buffer (not NUL-terminated). */
int mr_mpk_str(mr_mpk *r, const char **s, uint32_t *n, mr_err *err);
int mr_mpk_uint(mr_mpk *r, uint64_t *v, mr_err *err);
int mr_mpk_int(mr_mpk *r, int64_t *v, mr_err *err);
/* Any number (int or float) as a double; NaN and infinities are refused. */
int mr_mpk_num(mr_mpk *r, double *v, mr_err *err);
int mr_mpk_bool(mr_mpk *r, bool *v, mr_err *err);
/* True (and consumed) when the next value is nil. */
bool mr_mpk_nil(mr_mpk *r);
/* Skips one value of any kind, nesting at most `depth` levels. */
int mr_mpk_skip(mr_mpk *r, int depth, mr_err *err);

#endif

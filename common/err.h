/* Error reporting: every fallible function returns 0 on success or -1 and
 * fills an mr_err with one line of context (what, where, what was expected). */
#ifndef MR_ERR_H
#define MR_ERR_H

#include <stddef.h>

typedef struct mr_err {
    char msg[512];
} mr_err;

/* Formats into err (err may be NULL) and returns -1, so callers can write
 * `return mr_errf(err, "...", ...);`. */
int mr_errf(mr_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends context to an existing message: "ctx: old message". Returns -1. */
int mr_err_wrap(mr_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int mr_errf(mr_err *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int mr_err_wrap(mr_err *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    char prefix[256];
    char old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    /* Truncation is fine here: the message is for people and stays one line. */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3)
        n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 2;
    size_t m = strlen(old);
    if (m > room - 1)
        m = room - 1;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
    return -1;
}

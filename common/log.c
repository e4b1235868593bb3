#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int threshold = -1;

static int level_from_env(void)
{
    const char *s = getenv("MEMRA_LOG");
    if (!s)
        return MR_LOG_INFO;
    if (!strcmp(s, "error"))
        return MR_LOG_ERROR;
    if (!strcmp(s, "warn"))
        return MR_LOG_WARN;
    if (!strcmp(s, "debug"))
        return MR_LOG_DEBUG;
    return MR_LOG_INFO;
}

void mr_log(enum mr_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (threshold < 0)
        threshold = level_from_env();
    if ((int)level > threshold)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "memra %s: %s\n", names[level], line);
}

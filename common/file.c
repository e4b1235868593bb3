#include "common/file.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *mr_file_read(const char *path, size_t *len, mr_err *err) { return mr_file_read_max(path, SIZE_MAX, len, err); }

char *mr_file_read_max(const char *path, size_t max, size_t *len, mr_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        mr_errf(err, "%s: unable to open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - 1 - n, f); /* one byte kept for the NUL */
        n += got;
        if (got == 0)
            break;
        if (n > max) {
            fclose(f);
            free(buf);
            mr_errf(err, "%s: larger than %zu bytes", path, max);
            return NULL;
        }
        if (n == cap - 1) {
            char *nb = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f), e = errno;
    fclose(f);
    if (!buf) {
        mr_errf(err, "%s: out of memory", path);
        return NULL;
    }
    if (bad) {
        free(buf);
        mr_errf(err, "%s: %s", path, strerror(e));
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

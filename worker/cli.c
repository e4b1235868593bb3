/* Shared pieces of the worker's command-line programs (see cli.h). */
#include "worker/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mr_cli_parse_tokens(const char *what, const char *s, int32_t **out, int *n_out, mr_err *err)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids)
        return mr_errf(err, "out of memory");
    const char *p = s;
    for (;;) {
        if (*p < '0' || *p > '9') {
            free(ids);
            return mr_errf(err, "%s: expected a decimal token id at offset %d of '%.40s'", what,
                           (int)(p - s), s);
        }
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX) {
            free(ids);
            return mr_errf(err, "%s: token id at offset %d is too large", what, (int)(p - s));
        }
        if (n == cap) {
            cap *= 2;
            int32_t *bigger = realloc(ids, sizeof(int32_t) * (size_t)cap);
            if (!bigger) {
                free(ids);
                return mr_errf(err, "out of memory");
            }
            ids = bigger;
        }
        ids[n++] = (int32_t)v;
        p = end;
        if (*p == '\0')
            break;
        if (*p != ',') {
            free(ids);
            return mr_errf(err, "%s: unexpected '%c' at offset %d (expected ',')", what, *p,
                           (int)(p - s));
        }
        p++;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

int mr_cli_parse_int(const char *s, long lo, long hi, int *out)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int mr_cli_parse_kv_dtype(const char *s, mr_kv_dtype *out)
{
    static const struct { const char *name; mr_kv_dtype t; } names[] = {
        {"f32", MR_KV_F32}, {"f16", MR_KV_F16}, {"bf16", MR_KV_BF16}, {"auto", MR_KV_AUTO}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].t;
            return 0;
        }
    return -1;
}

int mr_cli_load(const char *path, const char *backend, const mr_model_opts *opts, mr_backend **be,
                mr_model **m, mr_err *err)
{
    *m = NULL;
    if (!(*be = mr_backend_create(backend, err)))
        return -1;
    if (mr_model_load(path, *be, opts, m, err))
        goto fail;
    if (opts && opts->n_ctx > mr_model_n_ctx(*m)) {
        mr_errf(err, "%d tokens (prompt and generation) exceed the model context of %d", opts->n_ctx,
                mr_model_n_ctx(*m));
        goto fail;
    }
    return 0;
fail:
    mr_model_free(*m);
    mr_backend_destroy(*be);
    *m = NULL;
    *be = NULL;
    return -1;
}

/* run-spec: greedy generation with MTP self-speculation.
 *
 *   run-spec MODEL.gguf --tokens 1,2,3 -n 24 --k 3 [--backend cpu|cuda|auto]
 *
 * Prints one line of draft statistics, then the generated ids on the last
 * line (the same ids as run-gen -n prints: speculation never changes greedy
 * output).  Errors are one line on stderr and a non-zero exit. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "worker/model.h"
#include "worker/spec.h"

static void usage(void)
{
    printf("usage: run-spec MODEL.gguf --tokens ID,ID,... [-n N] [--k K (1..8)] "
           "[--backend cpu|cuda|auto]\n");
}

/* Parses "1,2,3" (decimal ids, no empty items). */
static int parse_tokens(const char *s, int32_t **out, int *n_out, mr_err *err)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids)
        return mr_errf(err, "out of memory");
    const char *p = s;
    for (;;) {
        if (*p < '0' || *p > '9') {
            free(ids);
            return mr_errf(err, "--tokens: expected a decimal token id at offset %d of '%.40s'",
                           (int)(p - s), s);
        }
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX) {
            free(ids);
            return mr_errf(err, "--tokens: token id at offset %d is too large", (int)(p - s));
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
            return mr_errf(err, "--tokens: unexpected '%c' at offset %d (expected ',')", *p, (int)(p - s));
        }
        p++;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static int parse_count(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 1000000)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_arg = NULL, *backend = "auto";
    int n_gen = 24, k = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--tokens") && has_val) {
            tokens_arg = argv[++i];
        } else if (!strcmp(a, "--backend") && has_val) {
            backend = argv[++i];
        } else if (!strcmp(a, "-n") && has_val) {
            if (parse_count(argv[++i], &n_gen) || n_gen < 1) {
                fprintf(stderr, "run-spec: -n: expected a count in [1, 1000000], got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--k") && has_val) {
            if (parse_count(argv[++i], &k) || k < 1 || k > 8) {
                fprintf(stderr, "run-spec: --k: expected 1..8, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "run-spec: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        } else if (!model_path) {
            model_path = a;
        } else {
            fprintf(stderr, "run-spec: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!model_path || !tokens_arg) {
        fprintf(stderr, "run-spec: a model path and --tokens are required (see --help)\n");
        return 2;
    }

    mr_err err = {{0}};
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (parse_tokens(tokens_arg, &prompt, &n_prompt, &err)) {
        fprintf(stderr, "run-spec: %s\n", err.msg);
        return 2;
    }

    int status = 1;
    mr_backend *be = NULL;
    mr_model *m = NULL;
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)n_gen);
    if (!gen) {
        mr_errf(&err, "out of memory");
        goto fail;
    }
    if (!(be = mr_backend_create(backend, &err)))
        goto fail;
    mr_model_opts opts = {.n_ctx = n_prompt + n_gen, .n_seqs = 1};
    if (mr_model_load(model_path, be, &opts, &m, &err))
        goto fail;
    if (n_prompt + n_gen > mr_model_n_ctx(m)) {
        mr_errf(&err, "%d prompt + %d generated tokens exceed the model context of %d", n_prompt, n_gen,
                mr_model_n_ctx(m));
        goto fail;
    }
    mr_spec_stats st;
    if (mr_spec_generate(m, prompt, n_prompt, n_gen, k, NULL, gen, &st, &err))
        goto fail;
    printf("k=%d drafted=%d accepted=%d (%.1f%%) verify_passes=%d replays=%d\n", k, st.drafted,
           st.accepted, st.drafted ? 100.0 * st.accepted / st.drafted : 0.0, st.verifies, st.replays);
    for (int i = 0; i < n_gen; i++)
        printf(i ? " %d" : "%d", gen[i]);
    printf("\n");
    status = 0;
fail:
    if (status)
        fprintf(stderr, "run-spec: %s\n", err.msg);
    free(gen);
    mr_model_free(m);
    mr_backend_destroy(be);
    free(prompt);
    return status;
}

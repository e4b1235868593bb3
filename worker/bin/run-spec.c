/* run-spec: greedy generation with MTP self-speculation.
 *
 *   run-spec MODEL.gguf --tokens 1,2,3 -n 24 --k 3 [--backend cpu|cuda|auto]
 *            [--kv-dtype auto|f32|f16|bf16]
 *
 * Prints one line of draft statistics, then the generated ids on the last
 * line (the same ids as run-gen -n prints: speculation never changes greedy
 * output).  Errors are one line on stderr and a non-zero exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cli.h"
#include "worker/spec.h"

static void usage(void)
{
    printf("usage: run-spec MODEL.gguf --tokens ID,ID,... [-n N] [--k K (1..8)] "
           "[--backend cpu|cuda|auto] [--kv-dtype auto|f32|f16|bf16]\n");
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_arg = NULL, *backend = "auto";
    int n_gen = 24, k = 3;
    mr_kv_dtype kv_dtype = MR_KV_AUTO;
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
        } else if (!strcmp(a, "--kv-dtype") && has_val) {
            if (mr_cli_parse_kv_dtype(argv[++i], &kv_dtype)) {
                fprintf(stderr, "run-spec: --kv-dtype: expected auto, f32, f16 or bf16, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "-n") && has_val) {
            if (mr_cli_parse_int(argv[++i], 1, 1000000, &n_gen)) {
                fprintf(stderr, "run-spec: -n: expected a count in [1, 1000000], got '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--k") && has_val) {
            if (mr_cli_parse_int(argv[++i], 1, 8, &k)) {
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
    if (mr_cli_parse_tokens("--tokens", tokens_arg, &prompt, &n_prompt, &err)) {
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
    mr_model_opts opts = {.n_ctx = n_prompt + n_gen, .n_seqs = 1, .kv_dtype = kv_dtype};
    if (mr_cli_load(model_path, backend, &opts, &be, &m, &err))
        goto fail;
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

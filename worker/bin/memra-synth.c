/* memra-synth PRESET OUT.gguf [--vocab VOCAB.gguf] [--seed N] [--threads N] [--layers N]
 * Writes a synthetic model (real tensor names, shapes and quant types,
 * random weights); `memra-synth --list` lists the presets.  --layers keeps
 * the preset's first N layers (and its MTP block): a small file whose
 * products have the full model's widths, so that they take the kernels the
 * full model's do (scripts/gpu-test.sh compares its backends on such files). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/synth.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: memra-synth PRESET OUT.gguf [--vocab VOCAB.gguf] [--seed N] [--threads N] [--layers N]\n"
               "       memra-synth --list\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || *s == '-')
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *preset = NULL, *out = NULL;
    mr_synth_opts o = {.seed = 1};
    uint64_t layers = 0; /* 0: the preset's */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--list") == 0) {
            static const char *const recipe[] = {"Q4_K_M-like", "IQ4_XS", "Q8_0"};
            for (const mr_synth_model *m = mr_synth_presets; m->name; m++) {
                uint64_t n, bytes = mr_synth_tensor_bytes(m, &n);
                char shape[128];
                snprintf(shape, sizeof shape, "%u layers%s, n_embd %u, vocab %u%s%s", m->n_layer,
                         m->n_nextn ? " + MTP" : "", m->n_embd, m->n_vocab,
                         m->full_attn_interval ? ", hybrid" : "", m->n_expert ? ", MoE" : "");
                printf("%-22s %-9s %-11s %6.2f GiB  %4" PRIu64 " tensors  %s\n", m->name, m->arch,
                       recipe[m->recipe], (double)bytes / (1024.0 * 1024 * 1024), n, shape);
            }
            return 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--vocab") == 0 || strcmp(a, "--seed") == 0 || strcmp(a, "--threads") == 0 ||
                   strcmp(a, "--layers") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "memra-synth: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            uint64_t n;
            if (strcmp(a, "--vocab") == 0) {
                o.vocab_path = v;
            } else if (parse_u64(v, &n) || (strcmp(a, "--threads") == 0 && n > 1024) ||
                       (strcmp(a, "--layers") == 0 && n == 0)) {
                fprintf(stderr, "memra-synth: bad value for %s: '%s'\n", a, v);
                return 2;
            } else if (strcmp(a, "--seed") == 0) {
                o.seed = n;
            } else if (strcmp(a, "--layers") == 0) {
                layers = n;
            } else {
                o.n_threads = (unsigned)n;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "memra-synth: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!preset) {
            preset = a;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "memra-synth: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!preset || !out) {
        usage(stderr);
        return 2;
    }
    const mr_synth_model *m = mr_synth_find(preset);
    if (!m) {
        fprintf(stderr, "memra-synth: unknown preset '%s' (memra-synth --list)\n", preset);
        return 2;
    }
    mr_synth_model cut;
    if (layers) {
        if (layers > m->n_layer) {
            fprintf(stderr, "memra-synth: --layers %" PRIu64 ": %s has %u layers\n", layers, m->name, m->n_layer);
            return 2;
        }
        /* a hybrid's layers come in groups that end in full attention (the
         * loader wants at least one) */
        if (m->full_attn_interval && layers % m->full_attn_interval) {
            fprintf(stderr, "memra-synth: --layers %" PRIu64 ": %s's layers come in groups of %u\n", layers,
                    m->name, m->full_attn_interval);
            return 2;
        }
        cut = *m;
        cut.n_layer = (uint32_t)layers;
        m = &cut;
    }
    mr_synth_stats st;
    mr_err err;
    if (mr_synth_write(m, out, &o, &st, &err)) {
        fprintf(stderr, "memra-synth: %s\n", err.msg);
        return 1;
    }
    printf("memra-synth: %s: %" PRIu64 " tensors, %.3f GB (%.2f GiB) in %.2f s, %.2f GB/s\n", out,
           st.n_tensors, (double)st.bytes / 1e9, (double)st.bytes / (1024.0 * 1024 * 1024),
           st.seconds, st.seconds > 0 ? (double)st.bytes / 1e9 / st.seconds : 0.0);
    return 0;
}

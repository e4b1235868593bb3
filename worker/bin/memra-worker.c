/* memra-worker: serves one model on one device to the gateway over nng.
 *   memra-worker --listen ipc:///run/memra/w0.sock --model M.gguf [--device N] [--backend auto|cpu|cuda]
 *   memra-worker --config /etc/memra/memra.json --instance N   (the Nth worker of the config)
 *   memra-worker --listen URL --backend fake [--ctx N] [--vocab N] [--fake-eos ID] [--fake-delay-ms MS]
 * Flags given on the command line override the config.  The fake backend is
 * the protocol test double: it echoes the prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/config.h"
#include "worker/cli.h"
#include "worker/server.h"

typedef struct args {
    const char *listen, *model, *backend, *name;
    mr_worker_opts o;
    mr_engine_model_opts eo;
    long ctx, vocab, eos, delay;
    bool ctx_set;
} args;

static int usage(void)
{
    fprintf(stderr, "usage: memra-worker --listen URL (--model FILE.gguf | --backend fake) [--device N]\n"
                    "       [--backend auto|cpu|cuda|fake] [--name NAME] [--max-running N] [--max-queued N]\n"
                    "       [--ctx N] [--chunk N] [--block-tokens N] [--prefix-blocks N|-1] [--spec-k 0..8]\n"
                    "       [--kv-tokens N | --kv-mib N | --kv-fraction PERCENT --kv-reserve-mib N]\n"
                    "       [--kv-dtype auto|f32|f16|bf16]\n"
                    "       [--vocab N] [--fake-eos ID] [--fake-delay-ms MS]\n"
                    "   or: memra-worker --config FILE --instance N [flags that override it]\n");
    return 2;
}

/* A number flag's value within [lo, hi], else -1. */
static int num(const char *x, long lo, long hi, long *out)
{
    int v;
    if (mr_cli_parse_int(x, lo, hi, &v))
        return -1;
    *out = v;
    return 0;
}

/* Applies flag/value pairs; --config and --instance are skipped here.
 * Returns -1 on an unknown flag or a number out of range. */
static int parse(args *a, int n, char **v)
{
    for (int i = 0; i < n; i += 2) {
        const char *k = v[i];
        if (i + 1 >= n)
            return -1;
        const char *x = v[i + 1];
        long t = 0;
        int bad = 0;
        if (!strcmp(k, "--config") || !strcmp(k, "--instance"))
            continue;
        else if (!strcmp(k, "--listen"))
            a->listen = x;
        else if (!strcmp(k, "--model"))
            a->model = x;
        else if (!strcmp(k, "--backend"))
            a->backend = x;
        else if (!strcmp(k, "--name"))
            a->name = x;
        else if (!strcmp(k, "--device")) {
            bad = num(x, -1, 1 << 16, &t);
            a->o.device = (int)t;
        } else if (!strcmp(k, "--max-running")) {
            bad = num(x, 1, 1 << 20, &t);
            a->o.max_running = (uint32_t)t;
        } else if (!strcmp(k, "--max-queued")) {
            bad = num(x, 0, 1 << 30, &t);
            a->o.max_queued = (uint32_t)t;
        } else if (!strcmp(k, "--ctx")) {
            bad = num(x, 2, 1 << 30, &a->ctx);
            a->ctx_set = true;
        } else if (!strcmp(k, "--chunk")) {
            bad = num(x, 1, 1 << 20, &t);
            a->eo.chunk_tokens = (int)t;
        } else if (!strcmp(k, "--spec-k")) {
            bad = num(x, 0, 8, &t);
            a->eo.spec_k = (int)t;
        } else if (!strcmp(k, "--block-tokens")) {
            bad = num(x, 1, 4096, &t);
            a->eo.block_tokens = (int)t;
        } else if (!strcmp(k, "--prefix-blocks")) {
            bad = num(x, -1, 1 << 24, &t);
            a->eo.prefix_blocks = (int)t;
        } else if (!strcmp(k, "--kv-tokens")) {
            bad = num(x, 1, 1 << 30, &t);
            a->eo.kv_tokens = t;
        } else if (!strcmp(k, "--kv-mib")) {
            bad = num(x, 1, 1 << 24, &t);
            a->eo.kv_bytes = (size_t)t << 20;
        } else if (!strcmp(k, "--kv-fraction")) {
            bad = num(x, 1, 100, &t);
            a->eo.kv_fraction = (double)t / 100.0;
        } else if (!strcmp(k, "--kv-reserve-mib")) {
            bad = num(x, 0, 1 << 24, &t);
            a->eo.kv_reserve_bytes = (size_t)t << 20;
        } else if (!strcmp(k, "--kv-dtype")) {
            mr_kv_dtype dt;
            bad = mr_cli_parse_kv_dtype(x, &dt);
            a->eo.kv_dtype = dt;
        } else if (!strcmp(k, "--vocab"))
            bad = num(x, 1, 1 << 30, &a->vocab);
        else if (!strcmp(k, "--fake-eos"))
            bad = num(x, -1, 1 << 30, &a->eos);
        else if (!strcmp(k, "--fake-delay-ms"))
            bad = num(x, 0, 1 << 20, &a->delay);
        else if (!strcmp(k, "--fake-corrupt-token")) {
            bad = num(x, 0, 1 << 30, &t);
            mr_engine_fake_corrupt(t);
        } else
            return -1;
        if (bad)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    args a = {0};
    a.backend = "auto";
    a.o.device = -1;
    a.o.max_running = 64;
    a.o.max_queued = 1024;
    a.ctx = 4096;
    a.vocab = 256;
    a.eos = -1;
    const char *config = NULL;
    int instance = -1;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--config"))
            config = argv[i + 1];
        else if (!strcmp(argv[i], "--instance") && mr_cli_parse_int(argv[i + 1], 0, 1 << 20, &instance))
            return usage();
    }
    static mr_config c;
    if (config) {
        mr_err err;
        if (instance < 0) {
            fprintf(stderr, "memra-worker: --config needs --instance N\n");
            return 2;
        }
        if (mr_config_load(config, &c, &err)) {
            fprintf(stderr, "memra-worker: %s\n", err.msg);
            return 1;
        }
        int k = 0;
        bool found = false;
        for (int m = 0; m < c.n_models && !found; m++)
            for (int w = 0; w < c.models[m].n_workers && !found; w++, k++)
                if (k == instance) {
                    mr_model_conf *mc = &c.models[m];
                    a.listen = mc->workers[w].url;
                    a.o.device = mc->workers[w].device;
                    a.model = mc->path[0] ? mc->path : NULL;
                    a.backend = mc->backend;
                    a.name = mc->name;
                    a.o.max_running = mc->max_running;
                    a.ctx = mc->context_length;
                    a.ctx_set = true;
                    if (parse(&a, mc->n_worker_args, mc->worker_args)) {
                        fprintf(stderr, "memra-worker: %s: bad worker_args for model %s\n", config, mc->name);
                        return 2;
                    }
                    found = true;
                }
        if (!found) {
            fprintf(stderr, "memra-worker: %s has no worker number %d (it has %d)\n", config, instance, k);
            return 2;
        }
    }
    if ((argc - 1) % 2 || parse(&a, argc - 1, argv + 1))
        return usage();
    if (!a.listen || a.o.max_running < 1 || a.ctx < 2 || a.vocab < 1)
        return usage();
    a.o.listen = a.listen;
    mr_engine *e = NULL;
    if (!strcmp(a.backend, "fake")) {
        e = mr_engine_fake(a.name ? a.name : "fake", (uint32_t)a.ctx, (uint32_t)a.vocab, (int)a.eos, (int)a.delay);
    } else {
        if (!a.model) {
            fprintf(stderr, "memra-worker: --model FILE.gguf is required (or --backend fake)\n");
            return 2;
        }
        mr_err err;
        a.eo.backend = a.backend;
        a.eo.device = a.o.device;
        a.eo.name = a.name;
        a.eo.n_ctx = a.ctx_set ? (int)a.ctx : 0;
        a.eo.n_seqs = (int)a.o.max_running;
        e = mr_engine_model(a.model, &a.eo, &err);
        if (!e) {
            fprintf(stderr, "memra-worker: %s\n", err.msg);
            return 1;
        }
    }
    if (!e)
        return 1;
    int rc = mr_worker_serve(e, &a.o);
    e->destroy(e);
    return rc;
}

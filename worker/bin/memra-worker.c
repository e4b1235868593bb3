/* memra-worker: serves one model on one device to the gateway over nng.
 *   memra-worker --listen ipc:///run/memra/w0.sock --model M.gguf [--device N] [--backend auto|cpu|cuda]
 *   memra-worker --listen URL --backend fake [--ctx N] [--vocab N] [--fake-eos ID] [--fake-delay-ms MS]
 * The fake backend is the protocol test double: it echoes the prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/server.h"

static int usage(void)
{
    fprintf(stderr, "usage: memra-worker --listen URL (--model FILE.gguf | --backend fake) [--device N]\n"
                    "       [--backend auto|cpu|cuda|fake] [--name NAME] [--max-running N] [--max-queued N]\n"
                    "       [--ctx N] [--vocab N] [--fake-eos ID] [--fake-delay-ms MS]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *model = NULL, *backend = "auto", *name = NULL;
    mr_worker_opts o = {0};
    o.device = -1;
    o.max_running = 64;
    o.max_queued = 1024;
    long ctx = 4096, vocab = 256, eos = -1, delay = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--listen"))
            listen = v;
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--device"))
            o.device = atoi(v);
        else if (!strcmp(a, "--max-running"))
            o.max_running = (uint32_t)atoi(v);
        else if (!strcmp(a, "--max-queued"))
            o.max_queued = (uint32_t)atoi(v);
        else if (!strcmp(a, "--ctx"))
            ctx = atol(v);
        else if (!strcmp(a, "--vocab"))
            vocab = atol(v);
        else if (!strcmp(a, "--fake-eos"))
            eos = atol(v);
        else if (!strcmp(a, "--fake-delay-ms"))
            delay = atol(v);
        else
            return usage();
    }
    if (!listen || o.max_running < 1 || ctx < 2 || vocab < 1)
        return usage();
    o.listen = listen;
    mr_engine *e = NULL;
    if (!strcmp(backend, "fake")) {
        e = mr_engine_fake(name ? name : "fake", (uint32_t)ctx, (uint32_t)vocab, (int)eos, (int)delay);
    } else {
        fprintf(stderr, "memra-worker: backend %s for %s: the model runtime is not part of this build yet\n", backend,
                model ? model : "(no --model)");
        return 1;
    }
    if (!e)
        return 1;
    int rc = mr_worker_serve(e, &o);
    e->destroy(e);
    return rc;
}

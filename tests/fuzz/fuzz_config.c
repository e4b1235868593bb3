/* libFuzzer target: gateway configuration text through mr_config_parse.  An
 * accepted config must hold what the gateway relies on without checking
 * again: 1..MR_MAX_MODELS models with unique non-empty names, each with
 * 1..MR_MAX_WORKERS workers listening on ipc:// or tcp://, an ordered restart
 * backoff, and at most MR_MAX_TENANTS tenants with valid names. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/auth.h"
#include "gateway/config.h"

static void check_model(const mr_model_conf *m)
{
    if (!m->name[0] || m->n_workers < 1 || m->n_workers > MR_MAX_WORKERS)
        abort();
    for (int w = 0; w < m->n_workers; w++)
        if (strncmp(m->workers[w].url, "ipc://", 6) && strncmp(m->workers[w].url, "tcp://", 6))
            abort();
}

static void check_accepted(const mr_config *c)
{
    if (c->n_models < 1 || c->n_models > MR_MAX_MODELS)
        abort();
    for (int m = 0; m < c->n_models; m++) {
        check_model(&c->models[m]);
        for (int j = 0; j < m; j++)
            if (!strcmp(c->models[j].name, c->models[m].name))
                abort();
    }
    if (c->backoff_min_ms > c->backoff_max_ms)
        abort();
    if (c->n_tenants < 0 || c->n_tenants > MR_MAX_TENANTS)
        abort();
    for (int t = 0; t < c->n_tenants; t++)
        if (!mr_tenant_valid(c->tenants[t].name))
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static mr_config c; /* large: kept off the stack */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    mr_err err;
    if (mr_config_parse(text, &c, &err) == 0)
        check_accepted(&c);
    mr_config_free(&c);
    free(text);
    return 0;
}

/* libFuzzer target: keyring text through mr_keyring_parse.  A ring it
 * accepts must survive what `memra-gateway keys` does to it: dumped and
 * parsed again it gives the same entries (id, hash, tenant, enabled,
 * max_concurrency, created), and dumping that gives the same text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/auth.h"

static bool same_key(const mr_key *a, const mr_key *b)
{
    return !strcmp(a->id, b->id) && !memcmp(a->hash, b->hash, sizeof a->hash) && !strcmp(a->tenant, b->tenant) &&
           a->enabled == b->enabled && a->max_concurrency == b->max_concurrency && a->created == b->created;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mr_keyring a, b;
    mr_err err;
    if (mr_keyring_parse((const char *)data, size, "input", &a, &err) != 0)
        return 0;
    char *text = mr_keyring_dumps(&a);
    if (!text)
        abort();
    if (mr_keyring_parse(text, strlen(text), "dump", &b, &err) != 0 || a.n != b.n)
        abort(); /* parse validated it, so its own dump must be accepted */
    for (size_t i = 0; i < a.n; i++)
        if (!same_key(&a.keys[i], &b.keys[i]))
            abort();
    char *again = mr_keyring_dumps(&b);
    if (!again || strcmp(text, again))
        abort();
    free(text);
    free(again);
    mr_keyring_free(&a);
    mr_keyring_free(&b);
    return 0;
}

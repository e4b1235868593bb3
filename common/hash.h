/* FNV-1a over bytes: the hash of the small open-addressing tables (GGUF
 * keys and tensor names, grammar rule names, schema values).  Not for
 * anything an attacker could flood: the tables it serves are bounded. */
#ifndef MR_HASH_H
#define MR_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t mr_fnv1a(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#endif

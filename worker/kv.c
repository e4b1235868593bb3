/* Paged KV block pool: a free stack, reference counts, reservations. */
#include <stdlib.h>

#include "worker/kv.h"

struct mr_kv_pool {
    int n_blocks;
    int n_free;
    int n_reserved;
    int32_t *free_stack; /* [n_blocks]; the top is handed out first */
    int32_t *refs;       /* [n_blocks] */
};

size_t mr_kv_block_bytes(int n_layers, int block_tokens, int n_kv_heads, int head_dim,
                         mr_kv_dtype dtype)
{
    size_t elem = dtype == MR_KV_F32 ? 4 : 2;
    if (n_layers <= 0 || block_tokens <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return 0;
    return 2 * (size_t)n_layers * (size_t)block_tokens * (size_t)n_kv_heads * (size_t)head_dim * elem;
}

size_t mr_kv_budget_bytes(size_t free_bytes, double fraction, size_t reserve_bytes)
{
    if (!(fraction > 0.0))
        return 0;
    if (fraction > 1.0)
        fraction = 1.0;
    double usable = (double)free_bytes * fraction;
    if (usable <= (double)reserve_bytes)
        return 0;
    return (size_t)(usable - (double)reserve_bytes);
}

int mr_kv_blocks_for_budget(size_t budget_bytes, size_t block_bytes, int max_blocks)
{
    if (block_bytes == 0)
        return 0;
    size_t n = budget_bytes / block_bytes;
    size_t cap = max_blocks > 0 ? (size_t)max_blocks : (size_t)INT32_MAX;
    return (int)(n < cap ? n : cap);
}

int mr_kv_pool_new(int n_blocks, mr_kv_pool **out, mr_err *err)
{
    *out = NULL;
    if (n_blocks <= 0)
        return mr_errf(err, "kv pool: %d blocks (need at least one)", n_blocks);
    mr_kv_pool *p = calloc(1, sizeof *p);
    if (p) {
        p->free_stack = malloc(sizeof(int32_t) * (size_t)n_blocks);
        p->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    }
    if (!p || !p->free_stack || !p->refs) {
        mr_kv_pool_free(p);
        return mr_errf(err, "kv pool: out of memory for %d blocks", n_blocks);
    }
    /* pushed in reverse so that blocks are handed out in increasing order */
    for (int i = 0; i < n_blocks; i++)
        p->free_stack[i] = n_blocks - 1 - i;
    p->n_blocks = p->n_free = n_blocks;
    *out = p;
    return 0;
}

void mr_kv_pool_free(mr_kv_pool *p)
{
    if (!p)
        return;
    free(p->free_stack);
    free(p->refs);
    free(p);
}

int mr_kv_pool_size(const mr_kv_pool *p) { return p->n_blocks; }
int mr_kv_pool_n_free(const mr_kv_pool *p) { return p->n_free; }
int mr_kv_pool_n_reserved(const mr_kv_pool *p) { return p->n_reserved; }
int mr_kv_pool_available(const mr_kv_pool *p) { return p->n_free - p->n_reserved; }

int mr_kv_reserve(mr_kv_pool *p, int n)
{
    if (n < 0 || n > mr_kv_pool_available(p))
        return -1;
    p->n_reserved += n;
    return 0;
}

void mr_kv_unreserve(mr_kv_pool *p, int n)
{
    if (n > p->n_reserved)
        n = p->n_reserved; /* a caller bug; never let the count go negative */
    if (n > 0)
        p->n_reserved -= n;
}

int32_t mr_kv_alloc(mr_kv_pool *p, int from_reserved)
{
    if (from_reserved) {
        if (p->n_reserved <= 0)
            return -1;
    } else if (mr_kv_pool_available(p) <= 0) {
        return -1;
    }
    if (p->n_free <= 0)
        return -1;
    if (from_reserved)
        p->n_reserved--;
    int32_t b = p->free_stack[--p->n_free];
    p->refs[b] = 1;
    return b;
}

void mr_kv_ref(mr_kv_pool *p, int32_t block)
{
    if (block >= 0 && block < p->n_blocks && p->refs[block] > 0)
        p->refs[block]++;
}

void mr_kv_unref(mr_kv_pool *p, int32_t block)
{
    if (block < 0 || block >= p->n_blocks || p->refs[block] <= 0)
        return;
    if (--p->refs[block] == 0)
        p->free_stack[p->n_free++] = block;
}

int mr_kv_refcount(const mr_kv_pool *p, int32_t block)
{
    if (block < 0 || block >= p->n_blocks)
        return 0;
    return p->refs[block];
}

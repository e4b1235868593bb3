/* The paged KV block pool: which blocks of the model's KV cache are free,
 * who holds the others, and how many are promised to admitted requests.
 *
 * One pool per model, sized once (on a GPU from a byte budget the caller
 * measures: a fraction of free VRAM minus a reserve).  Blocks carry a
 * reference count: a sequence holds one reference on each block of its
 * block table, the prefix cache one on each block it keeps; a block returns
 * to the free list when its count drops to zero.  Only full blocks are ever
 * shared, and nobody writes into a full block, so no copy-on-write.
 *
 * Reservations make admission safe: a request reserves every block it may
 * still need when it is admitted, and its growth then draws on that
 * reservation, so it never runs out of blocks mid-generation.  Unreserved
 * allocations only take blocks that nobody has been promised. */
#ifndef MR_KV_H
#define MR_KV_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/ops.h"

typedef struct mr_kv_pool mr_kv_pool;

/* Bytes of one block over all layers (K and V), for the budget arithmetic. */
size_t mr_kv_block_bytes(int n_layers, int block_tokens, int n_kv_heads, int head_dim,
                         mr_kv_dtype dtype);
/* The KV byte budget on a device: fraction (0..1] of the free bytes the
 * caller measured after loading the weights, less reserve_bytes kept for
 * activations and the runtime; 0 when nothing is left. */
size_t mr_kv_budget_bytes(size_t free_bytes, double fraction, size_t reserve_bytes);
/* Blocks that fit in budget_bytes (0 when none or when block_bytes is 0),
 * capped at max_blocks when max_blocks > 0. */
int mr_kv_blocks_for_budget(size_t budget_bytes, size_t block_bytes, int max_blocks);

int mr_kv_pool_new(int n_blocks, mr_kv_pool **out, mr_err *err);
void mr_kv_pool_free(mr_kv_pool *p);

int mr_kv_pool_size(const mr_kv_pool *p);
int mr_kv_pool_n_free(const mr_kv_pool *p);     /* blocks with no reference */
int mr_kv_pool_n_reserved(const mr_kv_pool *p); /* promised, not yet allocated */
/* Free blocks nobody has been promised: what a new reservation can take. */
int mr_kv_pool_available(const mr_kv_pool *p);

/* Promises n blocks; fails (returns -1, nothing changed) when fewer are
 * available.  mr_kv_unreserve gives back promises that were not used. */
int mr_kv_reserve(mr_kv_pool *p, int n);
void mr_kv_unreserve(mr_kv_pool *p, int n);

/* A free block with a reference count of 1, or -1.  With from_reserved the
 * block comes out of an earlier reservation (always succeeds while one is
 * outstanding); without, only an available (unpromised) block is taken. */
int32_t mr_kv_alloc(mr_kv_pool *p, int from_reserved);
void mr_kv_ref(mr_kv_pool *p, int32_t block);
/* Drops one reference; the block is free again when none is left. */
void mr_kv_unref(mr_kv_pool *p, int32_t block);
int mr_kv_refcount(const mr_kv_pool *p, int32_t block);

#endif

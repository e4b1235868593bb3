/* The prefix cache: full KV blocks shared between requests through a trie
 * keyed by token ids (a radix tree at block granularity: each node is one
 * full block of block_tokens ids, its path from the root the tokens before
 * it).
 *
 * Every entry lives under a scope, the pair (tenant, cache_salt): a lookup
 * only ever walks its own scope's tree, so one tenant can never hit another
 * tenant's entries, and a salt splits one tenant further.
 *
 * The cache holds one reference (mr_kv_ref) on each block it keeps; a block
 * is in use while some sequence also holds it.  Eviction takes the least
 * recently used leaf that no sequence holds, so an entry in use and the
 * path to it always stay.  Session reuse falls out of the keying: the
 * scheduler inserts a finished request's prompt and generated blocks, so a
 * follow-up turn whose prompt extends that conversation finds them.
 *
 * Single-threaded, like the scheduler that owns it. */
#ifndef MR_PREFIX_H
#define MR_PREFIX_H

#include <stdint.h>

#include "common/err.h"
#include "worker/kv.h"

typedef struct mr_prefix mr_prefix;

typedef struct mr_prefix_stats {
    int capacity;             /* most blocks the cache may hold */
    int n_blocks;             /* blocks it holds (occupancy) */
    int n_in_use;             /* of those, held by a sequence too */
    uint64_t prompt_tokens;   /* counted by mr_prefix_count */
    uint64_t hit_tokens;      /* prompt tokens served from the cache */
    uint64_t inserted_blocks;
    uint64_t attached_states; /* checkpoints taken (with inserted_blocks: a lookup can find more
                                 only after one of them grew) */
    uint64_t evictions;
    int n_states;             /* recurrent-state checkpoints held */
} mr_prefix_stats;

/* capacity_blocks: most blocks to keep (0 disables the cache: lookups miss,
 * inserts keep nothing).  The pool must outlive the cache. */
int mr_prefix_new(mr_kv_pool *pool, int block_tokens, int capacity_blocks, mr_prefix **out,
                  mr_err *err);
/* Drops every reference the cache holds. */
void mr_prefix_free(mr_prefix *pc);

/* The longest run of cached full blocks that begins tokens[0..n_tokens) in
 * scope (tenant, salt; NULL reads as ""), at most max_blocks: writes their
 * ids to blocks and returns how many.  Marks them recently used.  Takes no
 * reference: attach them to a sequence before anything can evict. */
int mr_prefix_lookup(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                     int n_tokens, int max_blocks, int32_t *blocks);

/* Recurrent-state checkpoints (hybrid models, whose K/V blocks alone do not
 * hold the state a continuation needs).  A checkpoint is an opaque state
 * owned by the cache once attached, freed with state_free(ctx, state) when
 * its entry goes or when more than max_states are held (the least recently
 * used one goes; its blocks stay).  max_states 0: none are kept. */
void mr_prefix_set_states(mr_prefix *pc, int max_states, void (*state_free)(void *ctx, void *state), void *ctx);
/* Attaches state (the recurrent state after tokens[0 .. n_blocks *
 * block_tokens)) to that cached entry, replacing an older one.  Returns 1
 * when the cache took it, 0 when not (entry not cached, no room): the caller
 * still owns it then. */
int mr_prefix_attach_state(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                           int n_blocks, void *state);
/* As mr_prefix_lookup, but only a run that ends at an entry with a
 * checkpoint counts: returns the deepest such run's length (its blocks in
 * blocks[0..]) and its checkpoint in *state (NULL and 0: none); the whole
 * cached run, checkpoint or not, in *kv_blocks (when not NULL). */
int mr_prefix_lookup_state(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                           int n_tokens, int max_blocks, int32_t *blocks, void **state, int *kv_blocks);

/* Caches the first n_blocks full blocks of a sequence: blocks[i] holds the
 * K/V of tokens[i * block_tokens .. (i + 1) * block_tokens).  Blocks already
 * cached under the same tokens stay as they are (marked used); new entries
 * take a reference, evicting older unused ones beyond the capacity, and
 * stop where nothing can be evicted.  Returns the number of new entries. */
int mr_prefix_insert(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                     int n_blocks, const int32_t *blocks);

/* The same, marking the entries as a session's (a conversation expected to
 * come back): eviction takes unused non-session entries first, least
 * recently used first, and session entries only when no other is left.
 * Entries already cached become session entries too. */
int mr_prefix_insert_session(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                             int n_blocks, const int32_t *blocks);

/* Evicts the least recently used leaf that no sequence holds (non-session
 * entries first), returning its block to the pool: 1 when one was evicted,
 * 0 when none can be. */
int mr_prefix_evict_one(mr_prefix *pc);

/* Adds one admitted prompt to the hit-rate counters. */
void mr_prefix_count(mr_prefix *pc, int prompt_tokens, int hit_tokens);
void mr_prefix_get_stats(const mr_prefix *pc, mr_prefix_stats *out);

#endif

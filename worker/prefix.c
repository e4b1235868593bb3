/* Prefix cache: per-scope tries of full blocks, one hash table for child
 * lookup, one LRU list for eviction. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "worker/prefix.h"

typedef struct node {
    struct node *parent;      /* NULL for a scope root */
    struct node *hnext;       /* hash chain */
    struct node *prev, *next; /* LRU list (roots are not on it) */
    struct node *rnext;       /* list of roots (roots only) */
    uint64_t serial;          /* identity for hashing */
    uint64_t hash;
    int n_children;
    bool session;             /* evicted only after every non-session entry */
    void *state;              /* a recurrent-state checkpoint at the end of this block, or NULL */
    int32_t block;            /* -1 for a root */
    char *tenant, *salt;      /* roots only */
    int32_t tokens[];         /* block_tokens ids (non-roots) */
} node;

struct mr_prefix {
    mr_kv_pool *pool;
    int bt;
    int capacity;
    int n_blocks;
    node **buckets;
    size_t mask;
    node *roots;
    node *lru_head, *lru_tail; /* head: most recently used */
    uint64_t next_serial;
    int max_states, n_states;
    void (*state_free)(void *ctx, void *state);
    void *state_ctx;
    mr_prefix_stats st;
};

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static uint64_t child_hash(uint64_t parent_serial, const int32_t *tokens, int bt)
{
    uint64_t h = mix(0x51ed270b27e1ull, parent_serial);
    for (int i = 0; i < bt; i++)
        h = mix(h, (uint32_t)tokens[i]);
    return h;
}

int mr_prefix_new(mr_kv_pool *pool, int block_tokens, int capacity_blocks, mr_prefix **out,
                  mr_err *err)
{
    *out = NULL;
    if (!pool || block_tokens <= 0 || capacity_blocks < 0)
        return mr_errf(err, "prefix cache: block size %d, capacity %d", block_tokens, capacity_blocks);
    mr_prefix *pc = calloc(1, sizeof *pc);
    if (!pc)
        return mr_errf(err, "out of memory");
    pc->pool = pool;
    pc->bt = block_tokens;
    pc->capacity = capacity_blocks;
    size_t nb = 64;
    while (nb < (size_t)capacity_blocks * 2)
        nb *= 2;
    pc->buckets = calloc(nb, sizeof *pc->buckets);
    if (!pc->buckets) {
        free(pc);
        return mr_errf(err, "prefix cache: out of memory for %zu buckets", nb);
    }
    pc->mask = nb - 1;
    pc->next_serial = 1;
    pc->st.capacity = capacity_blocks;
    *out = pc;
    return 0;
}

static void lru_unlink(mr_prefix *pc, node *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        pc->lru_head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        pc->lru_tail = n->prev;
    n->prev = n->next = NULL;
}

static void lru_push_head(mr_prefix *pc, node *n)
{
    n->prev = NULL;
    n->next = pc->lru_head;
    if (pc->lru_head)
        pc->lru_head->prev = n;
    pc->lru_head = n;
    if (!pc->lru_tail)
        pc->lru_tail = n;
}

static void touch(mr_prefix *pc, node *n)
{
    lru_unlink(pc, n);
    lru_push_head(pc, n);
}

static void free_root(mr_prefix *pc, node *r)
{
    for (node **pp = &pc->roots; *pp; pp = &(*pp)->rnext)
        if (*pp == r) {
            *pp = r->rnext;
            break;
        }
    free(r->tenant);
    free(r->salt);
    free(r);
}

static void drop_state(mr_prefix *pc, node *n)
{
    if (!n->state)
        return;
    pc->state_free(pc->state_ctx, n->state);
    n->state = NULL;
    pc->n_states--;
}

/* Removes leaf n (no children) and drops the cache's reference; a scope
 * root left without children goes too unless it is `keep`. */
static void remove_leaf(mr_prefix *pc, node *n, const node *keep)
{
    node **pp = &pc->buckets[n->hash & pc->mask];
    while (*pp != n)
        pp = &(*pp)->hnext;
    *pp = n->hnext;
    lru_unlink(pc, n);
    node *parent = n->parent;
    parent->n_children--;
    drop_state(pc, n);
    mr_kv_unref(pc->pool, n->block);
    pc->n_blocks--;
    free(n);
    if (!parent->parent && parent->n_children == 0 && parent != keep)
        free_root(pc, parent);
}

void mr_prefix_free(mr_prefix *pc)
{
    if (!pc)
        return;
    /* every non-root node is on the LRU list exactly once */
    for (node *n = pc->lru_head, *next; n; n = next) {
        next = n->next;
        drop_state(pc, n);
        mr_kv_unref(pc->pool, n->block);
        free(n);
    }
    while (pc->roots)
        free_root(pc, pc->roots);
    free(pc->buckets);
    free(pc);
}

static node *find_root(mr_prefix *pc, const char *tenant, const char *salt)
{
    for (node *r = pc->roots; r; r = r->rnext)
        if (!strcmp(r->tenant, tenant) && !strcmp(r->salt, salt))
            return r;
    return NULL;
}

static node *find_child(mr_prefix *pc, const node *parent, const int32_t *tokens)
{
    uint64_t h = child_hash(parent->serial, tokens, pc->bt);
    for (node *n = pc->buckets[h & pc->mask]; n; n = n->hnext)
        if (n->hash == h && n->parent == parent && !memcmp(n->tokens, tokens, sizeof(int32_t) * (size_t)pc->bt))
            return n;
    return NULL;
}

/* The walk of both lookups: the matched path's blocks; *deepest_state
 * (when asked) the depth of the deepest matched node holding a state. */
static int walk(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens, int n_tokens,
                int max_blocks, int32_t *blocks, int *deepest_state, void **state)
{
    node *r = find_root(pc, tenant ? tenant : "", salt ? salt : "");
    if (!r)
        return 0;
    int n = 0;
    node *cur = r;
    while (n < max_blocks && (n + 1) * pc->bt <= n_tokens) {
        node *c = find_child(pc, cur, tokens + (size_t)n * (size_t)pc->bt);
        if (!c)
            break;
        touch(pc, c);
        blocks[n++] = c->block;
        cur = c;
        if (deepest_state && c->state) {
            *deepest_state = n;
            *state = c->state;
        }
    }
    return n;
}

int mr_prefix_lookup(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                     int n_tokens, int max_blocks, int32_t *blocks)
{
    return walk(pc, tenant, salt, tokens, n_tokens, max_blocks, blocks, NULL, NULL);
}

int mr_prefix_lookup_state(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                           int n_tokens, int max_blocks, int32_t *blocks, void **state, int *kv_blocks)
{
    int depth = 0;
    *state = NULL;
    int n = walk(pc, tenant, salt, tokens, n_tokens, max_blocks, blocks, &depth, state);
    if (kv_blocks)
        *kv_blocks = n;
    return depth;
}

void mr_prefix_set_states(mr_prefix *pc, int max_states, void (*state_free)(void *ctx, void *state), void *ctx)
{
    pc->max_states = max_states > 0 ? max_states : 0;
    pc->state_free = state_free;
    pc->state_ctx = ctx;
}

int mr_prefix_attach_state(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                           int n_blocks, void *state)
{
    if (pc->max_states <= 0 || !pc->state_free || n_blocks <= 0)
        return 0;
    node *cur = find_root(pc, tenant ? tenant : "", salt ? salt : "");
    for (int i = 0; cur && i < n_blocks; i++)
        cur = find_child(pc, cur, tokens + (size_t)i * (size_t)pc->bt);
    if (!cur)
        return 0; /* the blocks did not make it into the cache */
    if (cur->state) {
        drop_state(pc, cur);
    } else {
        /* room: the least recently used node's checkpoint goes (its blocks stay) */
        for (node *n = pc->lru_tail; n && pc->n_states >= pc->max_states; n = n->prev)
            if (n != cur)
                drop_state(pc, n);
        if (pc->n_states >= pc->max_states)
            return 0;
    }
    cur->state = state;
    pc->n_states++;
    pc->st.attached_states++;
    touch(pc, cur);
    return 1;
}

static int evictable(const mr_prefix *pc, const node *n)
{
    return n->n_children == 0 && mr_kv_refcount(pc->pool, n->block) == 1;
}

/* The next entry to evict, never `keep`: the least recently used unused
 * leaf, non-session entries first.  NULL when there is none. */
static node *victim(const mr_prefix *pc, const node *keep)
{
    node *fallback = NULL;
    for (node *n = pc->lru_tail; n; n = n->prev) {
        if (n == keep || !evictable(pc, n))
            continue;
        if (!n->session)
            return n;
        if (!fallback)
            fallback = n;
    }
    return fallback;
}

int mr_prefix_evict_one(mr_prefix *pc)
{
    node *n = victim(pc, NULL);
    if (!n)
        return 0;
    remove_leaf(pc, n, NULL);
    pc->st.evictions++;
    return 1;
}

/* Evicts unused entries (never `keep` or its ancestors, which have children
 * or are in use) until one more fits; 0 when that is impossible. */
static int make_room(mr_prefix *pc, const node *keep)
{
    while (pc->n_blocks >= pc->capacity) {
        node *n = victim(pc, keep);
        if (!n)
            return 0;
        remove_leaf(pc, n, keep);
        pc->st.evictions++;
    }
    return 1;
}

static int insert(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens, int n_blocks,
                  const int32_t *blocks, bool session)
{
    if (pc->capacity == 0 || n_blocks <= 0)
        return 0;
    tenant = tenant ? tenant : "";
    salt = salt ? salt : "";
    node *cur = find_root(pc, tenant, salt);
    if (!cur) {
        cur = calloc(1, sizeof *cur);
        if (!cur || !(cur->tenant = strdup(tenant)) || !(cur->salt = strdup(salt))) {
            if (cur) {
                free(cur->tenant);
                free(cur);
            }
            return 0; /* out of memory: caching is best effort */
        }
        cur->block = -1;
        cur->serial = pc->next_serial++;
        cur->rnext = pc->roots;
        pc->roots = cur;
    }
    int added = 0;
    for (int i = 0; i < n_blocks; i++) {
        const int32_t *tk = tokens + (size_t)i * (size_t)pc->bt;
        node *c = find_child(pc, cur, tk);
        if (c) {
            touch(pc, c);
            c->session |= session;
            cur = c;
            continue;
        }
        if (mr_kv_refcount(pc->pool, blocks[i]) <= 0 || !make_room(pc, cur))
            break;
        c = malloc(sizeof *c + sizeof(int32_t) * (size_t)pc->bt);
        if (!c)
            break;
        memcpy(c->tokens, tk, sizeof(int32_t) * (size_t)pc->bt);
        c->parent = cur;
        c->n_children = 0;
        c->session = session;
        c->state = NULL;
        c->block = blocks[i];
        c->tenant = c->salt = NULL;
        c->rnext = NULL;
        c->serial = pc->next_serial++;
        c->hash = child_hash(cur->serial, tk, pc->bt);
        c->hnext = pc->buckets[c->hash & pc->mask];
        pc->buckets[c->hash & pc->mask] = c;
        c->prev = c->next = NULL;
        lru_push_head(pc, c);
        cur->n_children++;
        mr_kv_ref(pc->pool, c->block);
        pc->n_blocks++;
        pc->st.inserted_blocks++;
        added++;
        cur = c;
    }
    /* a root that got no child (nothing fit) is not kept */
    if (!cur->parent && cur->n_children == 0)
        free_root(pc, cur);
    return added;
}

int mr_prefix_insert(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                     int n_blocks, const int32_t *blocks)
{
    return insert(pc, tenant, salt, tokens, n_blocks, blocks, false);
}

int mr_prefix_insert_session(mr_prefix *pc, const char *tenant, const char *salt, const int32_t *tokens,
                             int n_blocks, const int32_t *blocks)
{
    return insert(pc, tenant, salt, tokens, n_blocks, blocks, true);
}

void mr_prefix_count(mr_prefix *pc, int prompt_tokens, int hit_tokens)
{
    pc->st.prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    pc->st.hit_tokens += (uint64_t)(hit_tokens > 0 ? hit_tokens : 0);
}

void mr_prefix_get_stats(const mr_prefix *pc, mr_prefix_stats *out)
{
    *out = pc->st;
    out->n_blocks = pc->n_blocks;
    out->n_states = pc->n_states;
    out->n_in_use = 0;
    for (const node *n = pc->lru_head; n; n = n->next)
        out->n_in_use += mr_kv_refcount(pc->pool, n->block) > 1;
}

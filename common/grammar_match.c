/* The matcher: every parse still alive, as a set of stacks.
 *
 * A stack is a chain of nodes (pos, parent): the top node's pos is the
 * BYTES symbol that must match next, each node below it the place to
 * resume when the rule above returns.  Nodes are interned, so equal stacks
 * are the same node id, a set of stacks is a sorted id list, and sets are
 * interned in turn as states.  Each state remembers where each byte takes
 * it (built on first use), which makes the matcher a lazily built automaton
 * over parse configurations: inside a JSON string almost every byte leads
 * back to the state it came from, and a mask is a walk of the vocabulary
 * trie that mostly follows remembered transitions.
 *
 * What is remembered is bounded: past a budget the matcher starts afresh
 * from its current stacks (between calls), and one call may neither take
 * more than a set number of parse steps nor grow past a hard cap; giving
 * up is reported like an allocation failure. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar_int.h"

#define NONE UINT32_MAX
/* Transition codes in a state's table: not yet known, no parse survives,
 * or 2 + the state it leads to. */
#define T_UNKNOWN 0u
#define T_DEAD 1u

/* A JSON grammar over a 150k-token vocabulary remembers about 1 MiB over a
 * 20 kB document; the bounds are for grammars built to be expensive (one
 * parse step costs some tens of nanoseconds). */
static const mr_gmatch_limits default_limits = {
    .work = 1u << 22,        /* parse steps per call */
    .memo = 16u << 20,       /* start afresh above this between calls */
    .memo_hard = 64u << 20,  /* never above this */
    .mask_cache = 4u << 20,  /* ~200 masks of a 150k-token vocabulary */
};

typedef struct gstate {
    uint32_t off, n;  /* its top nodes: pool[off .. off + n), sorted */
    uint32_t hash;
    uint32_t can_end; /* an empty stack: the text so far is a sentence */
    uint32_t *trans;  /* 256 transition codes, NULL until first needed */
    uint32_t *mask;   /* cached mask, NULL when none */
    uint32_t lru_prev, lru_next;
} gstate;

struct mr_gmatch {
    const mr_grammar *g;
    mr_gmatch_limits lim;
    uint32_t cur; /* the state of what was accepted */

    /* nodes, interned through ntab (open addressing, id + 1) */
    uint32_t *npos, *npar;
    uint32_t n_nodes, cap_nodes;
    uint32_t *ntab;
    uint32_t ntab_cap;

    /* states, interned through stab; their node lists live in pool */
    gstate *st;
    uint32_t n_st, cap_st;
    uint32_t *stab;
    uint32_t stab_cap;
    uint32_t *pool;
    size_t pool_n, pool_cap;
    size_t n_trans; /* transition tables allocated */

    /* scratch of one step: the items to expand, the (pos, parent) pairs
     * already expanded (marked with the step's generation), the tops */
    uint32_t *work;
    size_t work_n, work_cap;
    uint64_t *vkey;
    uint32_t *vgen;
    uint32_t vcap, vn, gen;
    uint32_t *out;
    size_t out_n, out_cap;
    size_t work_left;

    /* mask cache: masks of one vocabulary, least recently used dropped */
    uint64_t mask_serial;
    size_t mask_size; /* bytes of one mask of that vocabulary */
    size_t mask_bytes;
    uint32_t lru_head, lru_tail;
    uint32_t *walk; /* state per trie depth during a mask */
    const uint32_t **walk_trans; /* and its transition table */
    size_t walk_cap;

    mr_gmatch_stats stats;
    char why[200];
};

static int fail(mr_gmatch *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(mr_gmatch *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- memory accounting ---- */

static size_t memo_bytes(const mr_gmatch *m)
{
    return (size_t)m->cap_nodes * 8 + (size_t)m->ntab_cap * 4 + (size_t)m->cap_st * sizeof(gstate) +
           (size_t)m->stab_cap * 4 + m->pool_cap * 4 + m->n_trans * 256 * 4 + m->work_cap * 4 + (size_t)m->vcap * 12 +
           m->out_cap * 4;
}

/* Whether extra more bytes stay under the hard cap (says why not). */
static bool room_for(mr_gmatch *m, size_t extra)
{
    if (memo_bytes(m) + extra <= m->lim.memo_hard)
        return true;
    fail(m, "the parse states of this grammar need more than %zu MiB", m->lim.memo_hard >> 20);
    return false;
}

static int grow_u32(mr_gmatch *m, uint32_t **v, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    if (!room_for(m, (c - *cap) * 4))
        return -1;
    uint32_t *n = realloc(*v, c * sizeof *n);
    if (!n)
        return fail(m, "out of memory");
    *v = n;
    *cap = c;
    return 0;
}

/* ---- nodes ---- */

static inline uint32_t mix2(uint32_t a, uint32_t b)
{
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 29) ^ (uint32_t)(x >> 7);
}

static int ntab_grow(mr_gmatch *m)
{
    uint32_t cap = m->ntab_cap ? m->ntab_cap * 2 : 1024;
    if (!room_for(m, (size_t)(cap - m->ntab_cap) * 4))
        return -1;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t)
        return fail(m, "out of memory");
    for (uint32_t id = 0; id < m->n_nodes; id++) {
        uint32_t h = mix2(m->npos[id], m->npar[id]) & (cap - 1);
        while (t[h])
            h = (h + 1) & (cap - 1);
        t[h] = id + 1;
    }
    free(m->ntab);
    m->ntab = t;
    m->ntab_cap = cap;
    return 0;
}

static int nodes_grow(mr_gmatch *m)
{
    size_t cap = m->cap_nodes, cap2 = m->cap_nodes;
    if (grow_u32(m, &m->npos, &cap, (size_t)m->n_nodes + 1) || grow_u32(m, &m->npar, &cap2, (size_t)m->n_nodes + 1))
        return -1;
    m->cap_nodes = (uint32_t)cap;
    return 0;
}

/* The id of node (pos, par), made when new; NONE on failure. */
static uint32_t node_get(mr_gmatch *m, uint32_t pos, uint32_t par)
{
    if ((m->n_nodes + 1) * 2 > m->ntab_cap && ntab_grow(m))
        return NONE;
    uint32_t mask = m->ntab_cap - 1, h = mix2(pos, par) & mask, e;
    while ((e = m->ntab[h])) {
        if (m->npos[e - 1] == pos && m->npar[e - 1] == par)
            return e - 1;
        h = (h + 1) & mask;
    }
    if (m->n_nodes == m->cap_nodes && nodes_grow(m))
        return NONE;
    uint32_t id = m->n_nodes++;
    m->npos[id] = pos;
    m->npar[id] = par;
    m->ntab[h] = id + 1;
    return id;
}

/* ---- states ---- */

static uint32_t hash_ids(const uint32_t *ids, uint32_t n, bool can_end)
{
    uint32_t h = 0x2545F491u ^ (can_end ? 0x9E3779B9u : 0) ^ n;
    for (uint32_t i = 0; i < n; i++) {
        h = (h ^ ids[i]) * 0x01000193u;
        h ^= h >> 15;
    }
    return h;
}

static int stab_grow(mr_gmatch *m)
{
    uint32_t cap = m->stab_cap ? m->stab_cap * 2 : 256;
    if (!room_for(m, (size_t)(cap - m->stab_cap) * 4))
        return -1;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t)
        return fail(m, "out of memory");
    for (uint32_t id = 0; id < m->n_st; id++) {
        uint32_t h = m->st[id].hash & (cap - 1);
        while (t[h])
            h = (h + 1) & (cap - 1);
        t[h] = id + 1;
    }
    free(m->stab);
    m->stab = t;
    m->stab_cap = cap;
    return 0;
}

static int states_grow(mr_gmatch *m)
{
    uint32_t cap = m->cap_st ? m->cap_st * 2 : 256;
    if (!room_for(m, (size_t)(cap - m->cap_st) * sizeof(gstate)))
        return -1;
    gstate *s = realloc(m->st, cap * sizeof *s);
    if (!s)
        return fail(m, "out of memory");
    m->st = s;
    m->cap_st = cap;
    return 0;
}

static bool state_is(const mr_gmatch *m, uint32_t id, const uint32_t *ids, uint32_t n, bool can_end, uint32_t h)
{
    const gstate *s = &m->st[id];
    return s->hash == h && s->n == n && s->can_end == can_end &&
           (!n || !memcmp(m->pool + s->off, ids, n * sizeof *ids));
}

/* The state of the sorted node list ids (not inside pool), made when new;
 * NONE on failure. */
static uint32_t state_get(mr_gmatch *m, const uint32_t *ids, uint32_t n, bool can_end)
{
    if ((m->n_st + 1) * 2 > m->stab_cap && stab_grow(m))
        return NONE;
    uint32_t h = hash_ids(ids, n, can_end), mask = m->stab_cap - 1, slot = h & mask, e;
    while ((e = m->stab[slot])) {
        if (state_is(m, e - 1, ids, n, can_end, h))
            return e - 1;
        slot = (slot + 1) & mask;
    }
    if ((m->n_st == m->cap_st && states_grow(m)) || grow_u32(m, &m->pool, &m->pool_cap, m->pool_n + n))
        return NONE;
    uint32_t id = m->n_st++;
    if (n)
        memcpy(m->pool + m->pool_n, ids, n * sizeof *ids);
    m->st[id] = (gstate){.off = (uint32_t)m->pool_n, .n = n, .hash = h, .can_end = can_end, .lru_prev = NONE,
                         .lru_next = NONE};
    m->pool_n += n;
    m->stab[slot] = id + 1;
    return id;
}

/* ---- one step: expanding items into top nodes ---- */

static int push_item(mr_gmatch *m, uint32_t pos, uint32_t par)
{
    if (m->work_n + 2 > m->work_cap && grow_u32(m, &m->work, &m->work_cap, m->work_n + 2))
        return -1;
    m->work[m->work_n++] = pos;
    m->work[m->work_n++] = par;
    return 0;
}

static int visited_grow(mr_gmatch *m)
{
    uint32_t cap = m->vcap ? m->vcap * 2 : 256;
    if (!room_for(m, (size_t)(cap - m->vcap) * 12))
        return -1;
    uint64_t *k = malloc(cap * sizeof *k);
    uint32_t *g = calloc(cap, sizeof *g);
    if (!k || !g) {
        free(k);
        free(g);
        return fail(m, "out of memory");
    }
    for (uint32_t i = 0; i < m->vcap; i++) {
        if (m->vgen[i] != m->gen)
            continue;
        uint32_t h = mix2((uint32_t)(m->vkey[i] >> 32), (uint32_t)m->vkey[i]) & (cap - 1);
        while (g[h] == m->gen)
            h = (h + 1) & (cap - 1);
        k[h] = m->vkey[i];
        g[h] = m->gen;
    }
    free(m->vkey);
    free(m->vgen);
    m->vkey = k;
    m->vgen = g;
    m->vcap = cap;
    return 0;
}

/* 1 when (pos, par) is new in this step, 0 when seen, -1 on failure.  An
 * item met twice is expanded once: that is what ends the expansion of a
 * rule that calls itself in tail position, and it keeps ambiguous grammars
 * from expanding the same thing over and over. */
static int visit(mr_gmatch *m, uint32_t pos, uint32_t par)
{
    if ((m->vn + 1) * 2 > m->vcap && visited_grow(m))
        return -1;
    uint64_t key = (uint64_t)pos << 32 | par;
    uint32_t mask = m->vcap - 1, h = mix2(pos, par) & mask;
    while (m->vgen[h] == m->gen) {
        if (m->vkey[h] == key)
            return 0;
        h = (h + 1) & mask;
    }
    m->vkey[h] = key;
    m->vgen[h] = m->gen;
    m->vn++;
    return 1;
}

static void step_begin(mr_gmatch *m)
{
    if (++m->gen == 0) { /* generations wrapped: forget all marks */
        if (m->vgen)
            memset(m->vgen, 0, m->vcap * sizeof *m->vgen);
        m->gen = 1;
    }
    m->vn = 0;
    m->work_n = 0;
    m->out_n = 0;
}

static int expand_ref(mr_gmatch *m, uint32_t pos, uint32_t par, uint32_t s)
{
    const mr_grammar *g = m->g;
    /* a call in tail position returns straight to the caller's caller */
    uint32_t cont = g->sym[pos + 1] == GSYM_END ? par : node_get(m, pos + 1, par);
    if (cont == NONE && g->sym[pos + 1] != GSYM_END)
        return -1;
    uint32_t r = gsym_rule(s);
    for (uint32_t k = g->rule_first[r]; k < g->rule_first[r] + g->rule_n[r]; k++)
        if (push_item(m, g->alt[k], cont))
            return -1;
    return 0;
}

/* Expands the pending items until every one is a top node (into out) or an
 * empty stack (can_end). */
static int closure(mr_gmatch *m, bool *can_end)
{
    const uint32_t *sym = m->g->sym;
    while (m->work_n) {
        if (!m->work_left)
            return fail(m, "more than %zu parse steps in one call: the grammar is too ambiguous", m->lim.work);
        m->work_left--;
        uint32_t par = m->work[--m->work_n], pos = m->work[--m->work_n];
        int v = visit(m, pos, par);
        if (v <= 0) {
            if (v < 0)
                return -1;
            continue;
        }
        uint32_t s = sym[pos];
        if (gsym_kind(s) == GK_BYTES) {
            uint32_t id = node_get(m, pos, par);
            if (id == NONE || grow_u32(m, &m->out, &m->out_cap, m->out_n + 1))
                return -1;
            m->out[m->out_n++] = id;
        } else if (s == GSYM_END) {
            if (par == NONE)
                *can_end = true;
            else if (push_item(m, m->npos[par], m->npar[par]))
                return -1;
        } else if (expand_ref(m, pos, par, s)) {
            return -1;
        }
    }
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void sort_ids(uint32_t *v, size_t n)
{
    if (n > 24) {
        qsort(v, n, sizeof *v, cmp_u32);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        uint32_t x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1] > x; j--)
            v[j] = v[j - 1];
        v[j] = x;
    }
}

/* The state the closed items make (T_DEAD code when none survives), as a
 * transition code; T_UNKNOWN on failure. */
static uint32_t step_finish(mr_gmatch *m)
{
    bool can_end = false;
    if (closure(m, &can_end))
        return T_UNKNOWN;
    if (!m->out_n && !can_end)
        return T_DEAD;
    sort_ids(m->out, m->out_n);
    uint32_t id = state_get(m, m->out, (uint32_t)m->out_n, can_end);
    return id == NONE ? T_UNKNOWN : id + 2;
}

/* Where byte b takes state s. */
static uint32_t step(mr_gmatch *m, uint32_t s, unsigned b)
{
    step_begin(m);
    const uint32_t *sym = m->g->sym;
    uint32_t off = m->st[s].off, n = m->st[s].n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t x = m->pool[off + i], t = sym[m->npos[x]];
        if (b >= gsym_lo(t) && b <= gsym_hi(t) && push_item(m, m->npos[x] + 1, m->npar[x]))
            return T_UNKNOWN;
    }
    return step_finish(m);
}

static uint32_t trans_slow(mr_gmatch *m, uint32_t s, unsigned b)
{
    if (m->st[s].n == 0)
        return T_DEAD; /* only the finished sentence: nothing may follow */
    if (!m->st[s].trans) {
        if (!room_for(m, 256 * 4))
            return T_UNKNOWN;
        if (!(m->st[s].trans = calloc(256, 4))) {
            fail(m, "out of memory");
            return T_UNKNOWN;
        }
        m->n_trans++;
    } else if (m->st[s].trans[b] != T_UNKNOWN) {
        return m->st[s].trans[b];
    }
    uint32_t r = step(m, s, b);
    if (r != T_UNKNOWN)
        m->st[s].trans[b] = r;
    return r;
}

static inline uint32_t trans(mr_gmatch *m, uint32_t s, unsigned b)
{
    const uint32_t *t = m->st[s].trans;
    uint32_t r;
    if (t && (r = t[b]) != T_UNKNOWN)
        return r;
    return trans_slow(m, s, b);
}

/* The state of the root's start. */
static uint32_t start_state(mr_gmatch *m)
{
    const mr_grammar *g = m->g;
    step_begin(m);
    for (uint32_t k = g->rule_first[g->root]; k < g->rule_first[g->root] + g->rule_n[g->root]; k++)
        if (push_item(m, g->alt[k], NONE))
            return NONE;
    uint32_t r = step_finish(m);
    return r < 2 ? NONE : r - 2; /* the root is productive: never dead */
}

/* ---- starting afresh ---- */

static void forget_all(mr_gmatch *m)
{
    for (uint32_t i = 0; i < m->n_st; i++) {
        free(m->st[i].trans);
        free(m->st[i].mask);
    }
    free(m->npos);
    free(m->npar);
    free(m->ntab);
    free(m->st);
    free(m->stab);
    free(m->pool);
    free(m->work);
    free(m->vkey);
    free(m->vgen);
    free(m->out);
    m->npos = m->npar = m->ntab = m->stab = m->pool = m->work = m->vgen = m->out = NULL;
    m->vkey = NULL;
    m->st = NULL;
    m->n_nodes = m->cap_nodes = m->ntab_cap = m->n_st = m->cap_st = m->stab_cap = m->vcap = m->vn = 0;
    m->pool_n = m->pool_cap = m->n_trans = m->work_n = m->work_cap = m->out_n = m->out_cap = 0;
    m->mask_bytes = 0;
    m->lru_head = m->lru_tail = NONE;
}

/* Interns in n the stack of m whose top is node x (positions gathered top
 * first into *tmp, then interned bottom up); NONE on failure. */
static uint32_t copy_stack(mr_gmatch *n, const mr_gmatch *m, uint32_t x, uint32_t **tmp, size_t *cap)
{
    size_t len = 0;
    for (uint32_t y = x; y != NONE; y = m->npar[y]) {
        if (len == *cap && grow_u32(n, tmp, cap, len + 1))
            return NONE;
        (*tmp)[len++] = m->npos[y];
    }
    uint32_t par = NONE;
    while (len) {
        par = node_get(n, (*tmp)[--len], par);
        if (par == NONE)
            return NONE;
    }
    return par;
}

/* Lets go of everything remembered but the current state: its stacks are
 * interned into new tables, which replace the old ones only once complete
 * (on failure m stays as it was, over budget but whole). */
static int restart(mr_gmatch *m)
{
    mr_gmatch *n = calloc(1, sizeof *n);
    if (!n)
        return fail(m, "out of memory");
    n->g = m->g;
    n->lim = m->lim;
    n->lru_head = n->lru_tail = NONE;
    const gstate *c = &m->st[m->cur];
    uint32_t *tmp = NULL;
    size_t cap = 0;
    int rc = 0;
    for (uint32_t i = 0; !rc && i < c->n; i++) {
        uint32_t top = copy_stack(n, m, m->pool[c->off + i], &tmp, &cap);
        if (top == NONE || grow_u32(n, &n->out, &n->out_cap, n->out_n + 1))
            rc = -1;
        else
            n->out[n->out_n++] = top;
    }
    free(tmp);
    if (!rc) {
        sort_ids(n->out, n->out_n);
        n->cur = state_get(n, n->out, (uint32_t)n->out_n, c->can_end);
        rc = n->cur == NONE ? -1 : 0;
    }
    if (rc) {
        memcpy(m->why, n->why, sizeof m->why);
        forget_all(n);
        free(n);
        return -1;
    }
    mr_gmatch keep = *m;
    forget_all(m);
    *m = *n;
    free(n);
    m->walk = keep.walk;
    m->walk_trans = keep.walk_trans;
    m->walk_cap = keep.walk_cap;
    m->stats = keep.stats;
    m->stats.flushes++;
    m->mask_serial = keep.mask_serial;
    m->mask_size = keep.mask_size;
    return 0;
}

static int maybe_restart(mr_gmatch *m)
{
    return memo_bytes(m) > m->lim.memo ? restart(m) : 0;
}

/* ---- public: matcher ---- */

int mr_gmatch_new_limited(const mr_grammar *g, const mr_gmatch_limits *l, mr_gmatch **out, mr_err *err)
{
    *out = NULL;
    mr_gmatch *m = calloc(1, sizeof *m);
    if (!m)
        return mr_errf(err, "grammar matcher: out of memory");
    m->g = g;
    m->lim = l ? *l : default_limits;
    m->lru_head = m->lru_tail = NONE;
    m->work_left = m->lim.work;
    m->cur = start_state(m);
    if (m->cur == NONE) {
        mr_errf(err, "grammar matcher: %s", m->why);
        mr_gmatch_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int mr_gmatch_new(const mr_grammar *g, mr_gmatch **out, mr_err *err)
{
    return mr_gmatch_new_limited(g, NULL, out, err);
}

void mr_gmatch_free(mr_gmatch *m)
{
    if (!m)
        return;
    forget_all(m);
    free(m->walk);
    free(m->walk_trans);
    free(m);
}

/* The state after bytes[0..n) from the current one, or false. */
static bool run(mr_gmatch *m, const void *bytes, size_t n, uint32_t *end)
{
    m->why[0] = 0;
    if (n && !bytes)
        return false;
    if (maybe_restart(m))
        return false;
    m->work_left = m->lim.work;
    const unsigned char *b = bytes;
    uint32_t s = m->cur;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = trans(m, s, b[i]);
        if (r < 2)
            return false;
        s = r - 2;
    }
    *end = s;
    return true;
}

bool mr_gmatch_accept(mr_gmatch *m, const void *bytes, size_t n)
{
    uint32_t s;
    if (!run(m, bytes, n, &s))
        return false;
    m->cur = s;
    return true;
}

bool mr_gmatch_allows(mr_gmatch *m, const void *bytes, size_t n)
{
    uint32_t s;
    return run(m, bytes, n, &s);
}

bool mr_gmatch_can_end(const mr_gmatch *m)
{
    return m->st[m->cur].can_end;
}

bool mr_gmatch_can_continue(const mr_gmatch *m)
{
    return m->st[m->cur].n > 0;
}

/* ---- masks ---- */

static void lru_unlink(mr_gmatch *m, uint32_t s)
{
    gstate *x = &m->st[s];
    if (x->lru_prev != NONE)
        m->st[x->lru_prev].lru_next = x->lru_next;
    else
        m->lru_head = x->lru_next;
    if (x->lru_next != NONE)
        m->st[x->lru_next].lru_prev = x->lru_prev;
    else
        m->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = NONE;
}

static void lru_push_front(mr_gmatch *m, uint32_t s)
{
    gstate *x = &m->st[s];
    x->lru_prev = NONE;
    x->lru_next = m->lru_head;
    if (m->lru_head != NONE)
        m->st[m->lru_head].lru_prev = s;
    m->lru_head = s;
    if (m->lru_tail == NONE)
        m->lru_tail = s;
}

static void mask_drop(mr_gmatch *m, uint32_t s)
{
    lru_unlink(m, s);
    free(m->st[s].mask);
    m->st[s].mask = NULL;
    m->mask_bytes -= m->mask_size;
}

/* Drops masks, least recently used first, until at most keep bytes stay. */
static void masks_trim(mr_gmatch *m, size_t keep)
{
    while (m->mask_bytes > keep && m->lru_tail != NONE)
        mask_drop(m, m->lru_tail);
}

/* Keeps a copy of mask for state s, dropping the least recently used to
 * stay in budget (the cache is optional: no memory, no copy). */
static void mask_store(mr_gmatch *m, uint32_t s, const uint32_t *mask, size_t bytes)
{
    if (bytes > m->lim.mask_cache)
        return;
    masks_trim(m, m->lim.mask_cache - bytes);
    uint32_t *c = malloc(bytes);
    if (!c)
        return;
    memcpy(c, mask, bytes);
    m->st[s].mask = c;
    m->mask_bytes += bytes;
    lru_push_front(m, s);
}

static void mark(const mr_gvocab *v, const gtrie_node *x, uint32_t *mask)
{
    int32_t k = x->tok;
    mask[k >> 5] |= 1u << (k & 31);
    if (x->dup)
        for (k = v->same_next[k]; k >= 0; k = v->same_next[k])
            mask[k >> 5] |= 1u << (k & 31);
}

/* One pass over the trie in preorder: a node's state is its parent's state
 * after its byte; where no parse survives, the whole subtree is skipped.
 * Each depth keeps its state's transition table at hand (NULL until the
 * state has one), the one lookup most nodes need. */
static int walk(mr_gmatch *m, const mr_gvocab *v, uint32_t *mask)
{
    size_t need = (size_t)v->max_depth + 1;
    if (m->walk_cap < need) {
        uint32_t *w = realloc(m->walk, need * sizeof *w);
        const uint32_t **t = realloc(m->walk_trans, need * sizeof *t);
        if (w)
            m->walk = w;
        if (t)
            m->walk_trans = t;
        if (!w || !t)
            return fail(m, "out of memory");
        m->walk_cap = need;
    }
    uint32_t *ws = m->walk;
    const uint32_t **wt = m->walk_trans;
    const gtrie_node *node = v->node;
    ws[0] = m->cur;
    wt[0] = m->st[m->cur].trans;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const gtrie_node *x = &node[i];
        unsigned d = x->depth;
        uint32_t r;
        if (!wt[d - 1] || (r = wt[d - 1][x->byte]) == T_UNKNOWN) {
            r = trans_slow(m, ws[d - 1], x->byte);
            wt[d - 1] = m->st[ws[d - 1]].trans;
        }
        if (r == T_DEAD) {
            i = x->skip;
            continue;
        }
        if (r == T_UNKNOWN)
            return -1;
        ws[d] = r - 2;
        wt[d] = m->st[r - 2].trans;
        if (x->tok >= 0)
            mark(v, x, mask);
        i++;
    }
    return 0;
}

int mr_gmatch_mask(mr_gmatch *m, const mr_gvocab *v, uint32_t *mask, mr_err *err)
{
    size_t bytes = ((size_t)v->n_vocab + 31) / 32 * sizeof *mask;
    m->why[0] = 0;
    if (maybe_restart(m))
        return mr_errf(err, "grammar: %s", m->why);
    if (m->mask_serial != v->serial) { /* masks of another vocabulary */
        masks_trim(m, 0);
        m->mask_serial = v->serial;
        m->mask_size = bytes;
    }
    uint32_t s = m->cur;
    if (m->st[s].mask) {
        memcpy(mask, m->st[s].mask, bytes);
        lru_unlink(m, s);
        lru_push_front(m, s);
        m->stats.mask_hits++;
        return 0;
    }
    m->stats.mask_misses++;
    memset(mask, 0, bytes);
    m->work_left = m->lim.work;
    if (walk(m, v, mask))
        return mr_errf(err, "grammar: %s", m->why);
    mask_store(m, s, mask, bytes);
    return 0;
}

/* ---- knobs and counters ---- */

void mr_gmatch_get_limits(const mr_gmatch *m, mr_gmatch_limits *l)
{
    *l = m->lim;
}

void mr_gmatch_set_limits(mr_gmatch *m, const mr_gmatch_limits *l)
{
    m->lim = *l;
    masks_trim(m, m->lim.mask_cache);
}

void mr_gmatch_get_stats(const mr_gmatch *m, mr_gmatch_stats *s)
{
    *s = m->stats;
    s->n_states = m->n_st;
    s->n_nodes = m->n_nodes;
    s->memo_bytes = memo_bytes(m);
    s->mask_bytes = m->mask_bytes;
}

const char *mr_gmatch_last_error(const mr_gmatch *m)
{
    return m->why;
}

/* Inside the grammar engine (common/grammar.h): the compiled form the parser
 * writes and the matcher reads, and the knobs the tests and the benchmark
 * turn.  Not for other modules. */
#ifndef MR_GRAMMAR_INT_H
#define MR_GRAMMAR_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/grammar.h"

/* A symbol is one uint32: the top two bits say what it is.
 *   END    ends an alternative;
 *   BYTES  one byte in [lo, hi] (bits 0-7 lo, 8-15 hi);
 *   REF    a rule (bits 0-29 its index).
 * Every alternative is a run of BYTES and REF symbols closed by END; a class
 * of code points is a rule whose alternatives are the UTF-8 byte-range
 * sequences of its members, so the matcher only ever sees bytes. */
enum { GK_END = 0, GK_BYTES = 1, GK_REF = 2 };
#define GSYM_END 0u
static inline uint32_t gsym_kind(uint32_t s)
{
    return s >> 30;
}
static inline uint32_t gsym_bytes(unsigned lo, unsigned hi)
{
    return (1u << 30) | ((uint32_t)hi << 8) | (uint32_t)lo;
}
static inline uint32_t gsym_ref(uint32_t rule)
{
    return (2u << 30) | rule;
}
static inline unsigned gsym_lo(uint32_t s)
{
    return s & 0xFF;
}
static inline unsigned gsym_hi(uint32_t s)
{
    return (s >> 8) & 0xFF;
}
static inline uint32_t gsym_rule(uint32_t s)
{
    return s & 0x3FFFFFFFu;
}

struct mr_grammar {
    uint32_t *sym; /* alternatives, each closed by GSYM_END */
    uint32_t n_sym;
    /* Rule r's alternatives start at sym[alt[rule_first[r] .. + rule_n[r])].
     * Only alternatives that derive some finite text are kept, so every parse
     * the matcher holds can still be completed. */
    uint32_t *alt;
    uint32_t *rule_first, *rule_n;
    uint32_t n_rules, n_alt;
    uint32_t root;
};

/* Trie of a vocabulary's byte strings, in preorder: node i's subtree is
 * nodes i .. skip-1.  The root is implicit (depth 0); nodes have depth >= 1. */
typedef struct gtrie_node {
    uint32_t skip;  /* first node after this one's subtree */
    int32_t tok;    /* first token whose bytes end here, -1 none */
    uint16_t depth; /* bytes from the root (the token length limit) */
    uint8_t byte;
    uint8_t dup; /* more tokens with these bytes: follow same_next from tok */
} gtrie_node;

#define MR_GVOCAB_MAX_TOKEN 65535u

struct mr_gvocab {
    int n_vocab;
    uint64_t serial; /* tells masks cached for one vocabulary from another's */
    gtrie_node *node;
    uint32_t n_nodes;
    uint32_t max_depth;
    int32_t *same_next; /* next token with exactly the same bytes, -1 none */
};

/* Knobs of one matcher (defaults in grammar_match.c):
 *   work       parse steps one call may take before it gives up (a grammar
 *              ambiguous enough to keep very many parses alive);
 *   memo       bytes of remembered parse states above which the matcher
 *              starts afresh from its current state between calls;
 *   memo_hard  bytes it may never exceed, even within one call;
 *   mask_cache bytes of cached masks (0: no mask cache). */
typedef struct mr_gmatch_limits {
    size_t work, memo, memo_hard, mask_cache;
} mr_gmatch_limits;
void mr_gmatch_get_limits(const mr_gmatch *m, mr_gmatch_limits *l);
void mr_gmatch_set_limits(mr_gmatch *m, const mr_gmatch_limits *l);
/* mr_gmatch_new with limits of its own from the start (l NULL: defaults). */
int mr_gmatch_new_limited(const mr_grammar *g, const mr_gmatch_limits *l, mr_gmatch **out, mr_err *err);

/* Counters for the tests and the benchmark. */
typedef struct mr_gmatch_stats {
    size_t n_states, n_nodes, memo_bytes, mask_bytes;
    size_t mask_hits, mask_misses, flushes;
} mr_gmatch_stats;
void mr_gmatch_get_stats(const mr_gmatch *m, mr_gmatch_stats *s);

/* Why the last call gave up (allocation, work or memory bound); "" when it
 * did not. */
const char *mr_gmatch_last_error(const mr_gmatch *m);

#endif

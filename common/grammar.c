/* The vocabulary side of the grammar engine: a trie of every token's bytes,
 * laid out in preorder so that a mask is one forward pass that jumps over
 * the subtrees no parse can enter (grammar_match.c walks it). */
#include <stdlib.h>
#include <string.h>

#include "common/grammar_int.h"

typedef struct tok_order {
    const char *const *pieces;
    const size_t *lens;
} tok_order;

/* Bytewise order, a prefix before its extensions; equal strings by id. */
static int cmp_tok(const void *a, const void *b, void *ctx)
{
    const tok_order *o = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    size_t nx = o->lens[x], ny = o->lens[y];
    int c = memcmp(o->pieces[x], o->pieces[y], nx < ny ? nx : ny);
    if (c)
        return c;
    if (nx != ny)
        return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int check_pieces(int n_vocab, const char *const *pieces, const size_t *lens, size_t *n_with, mr_err *err)
{
    if (n_vocab < 0)
        return mr_errf(err, "grammar vocabulary: %d tokens", n_vocab);
    if (n_vocab > 0 && (!pieces || !lens))
        return mr_errf(err, "grammar vocabulary: no token bytes given");
    size_t n = 0;
    uint64_t total = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (!pieces[i] || !lens[i])
            continue;
        if (lens[i] > MR_GVOCAB_MAX_TOKEN)
            return mr_errf(err, "grammar vocabulary: token %d is %zu bytes long, more than %u", i, lens[i],
                           MR_GVOCAB_MAX_TOKEN);
        total += lens[i];
        n++;
    }
    if (total >= INT32_MAX)
        return mr_errf(err, "grammar vocabulary: %llu bytes of tokens in all, too many", (unsigned long long)total);
    *n_with = n;
    return 0;
}

static int push_node(mr_gvocab *v, size_t *cap, unsigned byte, unsigned depth)
{
    if (v->n_nodes == *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        gtrie_node *n = realloc(v->node, c * sizeof *n);
        if (!n)
            return -1;
        v->node = n;
        *cap = c;
    }
    v->node[v->n_nodes++] = (gtrie_node){.tok = -1, .depth = (uint16_t)depth, .byte = (uint8_t)byte};
    return 0;
}

/* Builds the preorder trie from the tokens sorted by their bytes: each
 * token shares its longest common prefix with the one before it, so the
 * nodes past that prefix are complete (their subtree ends here) and the
 * new token's remaining bytes become new nodes. */
static int build_trie(mr_gvocab *v, const int *ids, size_t n, const char *const *pieces, const size_t *lens)
{
    uint32_t *path = malloc(((size_t)MR_GVOCAB_MAX_TOKEN + 1) * sizeof *path);
    if (!path)
        return -1;
    size_t cap = 0, depth = 0;
    const char *prev = NULL;
    for (size_t t = 0; t < n; t++) {
        int id = ids[t];
        const char *s = pieces[id];
        size_t len = lens[id], lcp = 0;
        while (prev && lcp < depth && lcp < len && s[lcp] == prev[lcp])
            lcp++;
        for (; depth > lcp; depth--)
            v->node[path[depth]].skip = v->n_nodes;
        for (; depth < len; depth++) {
            if (push_node(v, &cap, (unsigned char)s[depth], (unsigned)depth + 1)) {
                free(path);
                return -1;
            }
            path[depth + 1] = v->n_nodes - 1;
        }
        gtrie_node *at = &v->node[path[len]];
        if (at->tok < 0)
            at->tok = id;
        else { /* the same bytes as an earlier token: chain it behind */
            v->same_next[id] = v->same_next[at->tok];
            v->same_next[at->tok] = id;
            at->dup = 1;
        }
        if (len > v->max_depth)
            v->max_depth = (uint32_t)len;
        prev = s;
    }
    for (; depth > 0; depth--)
        v->node[path[depth]].skip = v->n_nodes;
    free(path);
    return 0;
}

int mr_gvocab_new(int n_vocab, const char *const *pieces, const size_t *lens, mr_gvocab **out, mr_err *err)
{
    static uint64_t serial;
    *out = NULL;
    size_t n_with = 0;
    if (check_pieces(n_vocab, pieces, lens, &n_with, err))
        return -1;
    mr_gvocab *v = calloc(1, sizeof *v);
    int *ids = malloc((n_with ? n_with : 1) * sizeof *ids);
    if (!v || !ids)
        goto oom;
    v->n_vocab = n_vocab;
    v->serial = __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED);
    v->same_next = malloc((n_vocab ? (size_t)n_vocab : 1) * sizeof *v->same_next);
    if (!v->same_next)
        goto oom;
    size_t k = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->same_next[i] = -1;
        if (pieces[i] && lens[i])
            ids[k++] = i;
    }
    tok_order o = {pieces, lens};
    qsort_r(ids, n_with, sizeof *ids, cmp_tok, &o);
    if (build_trie(v, ids, n_with, pieces, lens))
        goto oom;
    free(ids);
    *out = v;
    return 0;
oom:
    free(ids);
    mr_gvocab_free(v);
    return mr_errf(err, "grammar vocabulary: out of memory for %d tokens", n_vocab);
}

int mr_gvocab_new_bytes(mr_gvocab **out, mr_err *err)
{
    char bytes[256];
    const char *pieces[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    return mr_gvocab_new(256, pieces, lens, out, err); /* the trie copies the bytes */
}

void mr_gvocab_free(mr_gvocab *v)
{
    if (!v)
        return;
    free(v->node);
    free(v->same_next);
    free(v);
}

int mr_gvocab_size(const mr_gvocab *v)
{
    return v->n_vocab;
}

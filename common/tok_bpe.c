/* Byte-level BPE: each pre-tokenized word starts as one symbol per byte
 * and the adjacent pair with the lowest merge rank is merged until none is
 * left (leftmost first on equal ranks).  Pairs live in the shared merge
 * heap (tok_internal.h) with the rank as priority. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"
#include "common/unicode.h"

typedef struct sym {
    mr_token id;        /* MR_TOKEN_NULL: a character that is not a token */
    int32_t prev, next; /* -1: none */
    uint32_t off, len;  /* bytes of the initial symbol in the word */
} sym;

/* Words repeat a lot in long texts; a per-call cache of recent short words
 * (exact byte comparison, so a hit gives exactly what BPE would) skips the
 * merge loop for them.  It lives only for one encode call: nothing is
 * shared between calls or threads. */
#define WC_SLOTS 4096
#define WC_MAXW 32 /* bytes of a cached word */
#define WC_MAXT 16 /* tokens of a cached word */
#define WC_MIN_TEXT 8192 /* below this, the cache would not pay for itself */
typedef struct wc_entry {
    uint8_t wlen, nt; /* wlen 0: empty */
    char w[WC_MAXW];
    mr_token ids[WC_MAXT];
} wc_entry;

typedef struct bpe_ctx {
    const mr_tokenizer *t;
    wc_entry *cache;
    mr_tokens *out;
    sym *sy;
    size_t sy_cap;
    mr_tok_heap heap;
    char *word;
    size_t word_cap;
} bpe_ctx;

static inline bool merge_find(const mr_tokenizer *t, mr_token a, mr_token b, uint32_t *rank,
                              mr_token *res)
{
    if (a < 0 || b < 0)
        return false;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 20 & t->mmask;
    for (;;) {
        uint64_t k = t->merge[h].key;
        if (k == key) {
            *rank = t->merge[h].rank;
            *res = t->merge[h].res;
            return true;
        }
        if (k == 0)
            return false;
        h = (h + 1) & t->mmask;
    }
}

static int try_pair(bpe_ctx *c, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    mr_token a = c->sy[l].id, b = c->sy[r].id, res;
    uint32_t rank;
    if (!merge_find(c->t, a, b, &rank, &res))
        return 0;
    return mr_tok_heap_push(&c->heap, (mr_tok_pair){rank, l, r, (uint32_t)a, (uint32_t)b, res});
}

static int emit(bpe_ctx *c, mr_token id)
{
    if (id == MR_TOKEN_NULL) /* a byte the vocabulary has no character for */
        return 0;
    return mr_tokens_push(c->out, id);
}

static int bpe_merge(bpe_ctx *c, const char *w, size_t n);

static int bpe_word(const char *w, size_t n, void *vctx)
{
    bpe_ctx *c = vctx;
    const mr_tokenizer *t = c->t;
    const uint8_t *b = (const uint8_t *)w;
    if (n == 1 && !t->bpe_raw)
        return emit(c, t->byte_tok[b[0]]);
    wc_entry *ce = NULL;
    size_t first = c->out->n;
    if (c->cache && n <= WC_MAXW) {
        ce = &c->cache[mr_tok_hash(w, n) & (WC_SLOTS - 1)];
        if (ce->wlen == n && memcmp(ce->w, w, n) == 0) {
            for (unsigned i = 0; i < ce->nt; i++)
                if (mr_tokens_push(c->out, ce->ids[i]))
                    return -1;
            return 0;
        }
    }
    int rc = bpe_merge(c, w, n);
    if (rc == 0 && ce && c->out->n - first <= WC_MAXT) {
        ce->wlen = (uint8_t)n;
        ce->nt = (uint8_t)(c->out->n - first);
        memcpy(ce->w, w, n);
        memcpy(ce->ids, c->out->ids + first, ce->nt * sizeof *ce->ids);
    }
    return rc;
}

static int bpe_merge(bpe_ctx *c, const char *w, size_t n)
{
    const mr_tokenizer *t = c->t;
    const uint8_t *b = (const uint8_t *)w;
    if (t->ignore_merges) {
        /* a word that is a token as a whole is emitted as is */
        if (n * 2 > c->word_cap) {
            char *nw = realloc(c->word, n * 2);
            if (!nw)
                return -1;
            c->word = nw;
            c->word_cap = n * 2;
        }
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(c->word + o, t->bchar[b[i]], t->bchar_len[b[i]]);
            o += t->bchar_len[b[i]];
        }
        mr_token id = mr_tok_find(t, c->word, o);
        if (id != MR_TOKEN_NULL)
            return emit(c, id);
    }
    if (n > INT32_MAX)
        return -1;
    if (n > c->sy_cap) {
        sym *s = realloc(c->sy, n * sizeof *s);
        if (!s)
            return -1;
        c->sy = s;
        c->sy_cap = n;
    }
    size_t ns = 0;
    if (t->bpe_raw) {
        /* a word of newlines only that is a token stays whole (upstream's rule) */
        size_t k = 0;
        while (k < n && w[k] == '\n')
            k++;
        if (k == n) {
            mr_token id = mr_tok_find(t, w, n);
            if (id != MR_TOKEN_NULL)
                return emit(c, id);
        }
        /* one symbol per UTF-8 character */
        for (size_t i = 0; i < n;) {
            size_t l;
            mr_utf8_decode(b + i, n - i, &l);
            c->sy[ns] = (sym){mr_tok_find(t, w + i, l), (int32_t)ns - 1, (int32_t)ns + 1,
                              (uint32_t)i, (uint32_t)l};
            ns++;
            i += l;
        }
    } else {
        for (size_t i = 0; i < n; i++)
            c->sy[i] = (sym){t->byte_tok[b[i]], (int32_t)i - 1, (int32_t)i + 1, (uint32_t)i, 1};
        ns = n;
    }
    c->sy[ns - 1].next = -1;
    c->heap.n = 0;
    for (size_t i = 1; i < ns; i++)
        if (try_pair(c, (int32_t)i - 1, (int32_t)i))
            return -1;
    while (c->heap.n > 0) {
        mr_tok_pair p = mr_tok_heap_pop(&c->heap);
        sym *l = &c->sy[p.left], *r = &c->sy[p.right];
        if ((uint32_t)l->id != p.a || l->next != p.right || (uint32_t)r->id != p.b)
            continue; /* stale: one side has merged since */
        l->id = p.res;
        l->next = r->next;
        if (r->next >= 0)
            c->sy[r->next].prev = p.left;
        r->id = MR_TOKEN_NULL;
        r->prev = r->next = -1;
        if (try_pair(c, l->prev, p.left) || try_pair(c, p.left, l->next))
            return -1;
    }
    for (int32_t i = 0; i >= 0; i = c->sy[i].next) {
        if (c->sy[i].id == MR_TOKEN_NULL && t->bpe_raw) {
            /* a character that is not a token: its bytes as <0xNN> tokens */
            for (uint32_t j = 0; j < c->sy[i].len; j++)
                if (emit(c, t->byte_tok[b[c->sy[i].off + j]]))
                    return -1;
        } else if (emit(c, c->sy[i].id)) {
            return -1;
        }
    }
    return 0;
}

int mr_bpe_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err)
{
    bpe_ctx c = {.t = t, .out = out};
    if (len >= WC_MIN_TEXT)
        c.cache = calloc(WC_SLOTS, sizeof *c.cache); /* without it: just slower */
    mr_err perr;
    perr.msg[0] = '\0';
    int rc = mr_pretok_split(t->pre, text, len, bpe_word, &c, &perr);
    if (rc)
        mr_errf(err, "%s", perr.msg[0] ? perr.msg : "tokenize: out of memory");
    free(c.cache);
    free(c.sy);
    free(c.heap.v);
    free(c.word);
    return rc ? -1 : 0;
}

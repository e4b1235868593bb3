/* SentencePiece-style encoding (tokenizer.ggml.model = llama): start from
 * one symbol per UTF-8 character and repeatedly merge the adjacent pair
 * whose concatenation is the vocabulary token with the highest score
 * (leftmost first on equal scores).  A final symbol that is not a token is
 * written as <0xNN> byte tokens. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"
#include "common/unicode.h"

typedef struct ssym {
    uint32_t off, len;  /* bytes of the symbol in the text; len 0: merged away */
    int32_t prev, next;
} ssym;

typedef struct spair {
    float score;
    int32_t left, right;
    uint32_t size; /* byte length of the pair when queued */
} spair;

typedef struct spm_ctx {
    const mr_tokenizer *t;
    const char *text;
    ssym *sy;
    spair *heap;
    size_t heap_n, heap_cap;
} spm_ctx;

static inline bool spair_before(const spair *a, const spair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int sheap_push(spm_ctx *c, spair p)
{
    if (c->heap_n == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 64;
        spair *h = realloc(c->heap, cap * sizeof *h);
        if (!h)
            return -1;
        c->heap = h;
        c->heap_cap = cap;
    }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!spair_before(&p, &c->heap[parent]))
            break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = p;
    return 0;
}

static spair sheap_pop(spm_ctx *c)
{
    spair top = c->heap[0];
    spair last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        size_t m = (l + 1 < n && spair_before(&c->heap[l + 1], &c->heap[l])) ? l + 1 : l;
        if (!spair_before(&c->heap[m], &last))
            break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n)
        c->heap[i] = last;
    return top;
}

static int try_pair(spm_ctx *c, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    uint32_t size = c->sy[l].len + c->sy[r].len;
    mr_token id = mr_tok_find(c->t, c->text + c->sy[l].off, size);
    if (id == MR_TOKEN_NULL)
        return 0;
    return sheap_push(c, (spair){c->t->score[id], l, r, size});
}

int mr_spm_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err)
{
    if (len == 0)
        return 0;
    if (len > UINT32_MAX / 2)
        return mr_errf(err, "tokenize: text fragment of %zu bytes is too long", len);
    spm_ctx c = {.t = t, .text = text};
    c.sy = malloc(len * sizeof *c.sy);
    if (!c.sy)
        return mr_errf(err, "tokenize: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t l;
        mr_utf8_decode((const uint8_t *)text + i, len - i, &l);
        c.sy[n] = (ssym){(uint32_t)i, (uint32_t)l, (int32_t)n - 1, -1};
        if (n > 0)
            c.sy[n - 1].next = (int32_t)n;
        n++;
        i += l;
    }
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        rc = try_pair(&c, (int32_t)i - 1, (int32_t)i);
    while (rc == 0 && c.heap_n > 0) {
        spair p = sheap_pop(&c);
        ssym *l = &c.sy[p.left], *r = &c.sy[p.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != p.size || l->next != p.right)
            continue; /* stale */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            c.sy[r->next].prev = p.left;
        rc = try_pair(&c, l->prev, p.left);
        if (rc == 0)
            rc = try_pair(&c, p.left, l->next);
    }
    for (int32_t i = 0; rc == 0 && i >= 0; i = c.sy[i].next) {
        mr_token id = mr_tok_find(t, text + c.sy[i].off, c.sy[i].len);
        if (id != MR_TOKEN_NULL) {
            rc = mr_tokens_push(out, id);
            continue;
        }
        /* not a token (merged symbols always are): byte fallback */
        for (uint32_t j = 0; j < c.sy[i].len && rc == 0; j++) {
            mr_token b = t->byte_tok[(uint8_t)text[c.sy[i].off + j]];
            if (b == MR_TOKEN_NULL)
                b = t->unk;
            if (b != MR_TOKEN_NULL)
                rc = mr_tokens_push(out, b);
        }
    }
    free(c.sy);
    free(c.heap);
    return rc ? mr_errf(err, "tokenize: out of memory") : 0;
}

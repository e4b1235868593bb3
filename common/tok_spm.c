/* SentencePiece-style encoding (tokenizer.ggml.model = llama): start from
 * one symbol per UTF-8 character and repeatedly merge the adjacent pair
 * whose concatenation is the vocabulary token with the highest score
 * (leftmost first on equal scores), through the merge heap of
 * tok_internal.h.  A final symbol that is not a token is written as <0xNN>
 * byte tokens. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"
#include "common/unicode.h"

typedef struct ssym {
    uint32_t off, len;  /* bytes of the symbol in the text; len 0: merged away */
    int32_t prev, next;
} ssym;

typedef struct spm_ctx {
    const mr_tokenizer *t;
    const char *text;
    ssym *sy;
    mr_tok_heap heap;
} spm_ctx;

/* Heap priority of a score: higher scores pop first, so the order of the
 * float is mapped onto the unsigned order and reversed.  -0 counts as +0
 * (equal scores stay ties, broken leftmost first). */
static uint32_t score_prio(float score)
{
    uint32_t u;
    score += 0.0f;
    memcpy(&u, &score, sizeof u);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u; /* ascending with the float */
    return ~u;
}

static int try_pair(spm_ctx *c, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    uint32_t size = c->sy[l].len + c->sy[r].len;
    mr_token id = mr_tok_find(c->t, c->text + c->sy[l].off, size);
    if (id == MR_TOKEN_NULL)
        return 0;
    mr_tok_pair p = {score_prio(c->t->score[id]), l, r, c->sy[l].len, c->sy[r].len, id};
    return mr_tok_heap_push(&c->heap, p);
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
    while (rc == 0 && c.heap.n > 0) {
        mr_tok_pair p = mr_tok_heap_pop(&c.heap);
        ssym *l = &c.sy[p.left], *r = &c.sy[p.right];
        if (l->len != p.a || r->len != p.b || l->next != p.right)
            continue; /* stale: one side has merged since (a merged-away symbol has len 0) */
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
    free(c.heap.v);
    return rc ? mr_errf(err, "tokenize: out of memory") : 0;
}

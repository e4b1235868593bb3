/* Internals shared by the tokenizer sources (not a public header). */
#ifndef MR_TOK_INTERNAL_H
#define MR_TOK_INTERNAL_H

#include <stdlib.h>

#include "common/tokenizer.h"

/* Pre-tokenizers: each is a list of passes (one regex of upstream's list
 * each), every pass refining the previous split. */
enum mr_pre {
    MR_PRE_NONE = 0,   /* SPM: no pre-tokenizer */
    MR_PRE_DEFAULT,
    MR_PRE_GPT2,
    MR_PRE_LLAMA3,
    MR_PRE_QWEN2,
    MR_PRE_QWEN35,
    MR_PRE_DEEPSEEK_LLM,
    MR_PRE_DEEPSEEK_CODER,
    MR_PRE_FALCON,
    MR_PRE_STARCODER,  /* also refact, command-r, smollm, codeshell, exaone */
    MR_PRE_GEMMA4,     /* lines and runs of newlines only (SentencePiece-style BPE) */
};

/* Maps a tokenizer.ggml.pre name; -1 when unknown.  *ignore_merges is set
 * for pre-tokenizers whose BPE emits a word that is itself a token whole. */
int mr_pre_from_name(const char *name, bool *ignore_merges);

/* Splits text[0..len) into words; calls fn(word_start, word_len, ctx) in order. */
typedef int (*mr_word_fn)(const char *word, size_t len, void *ctx);
int mr_pretok_split(enum mr_pre pre, const char *text, size_t len, mr_word_fn fn, void *ctx,
                    mr_err *err);

/* open-addressing hash of byte strings */
uint64_t mr_tok_hash(const void *p, size_t n);

struct mr_tokenizer {
    enum mr_tok_model model;
    enum mr_pre pre;
    char pre_name[64];
    bool ignore_merges;
    bool nfc;               /* the text is put in Unicode NFC first (Qwen2 family) */
    bool bpe_raw;           /* BPE over raw UTF-8 with U+2581 for spaces and <0xNN>
                             * byte fallback (gemma4), not GPT-2 byte characters */
    bool add_bos, add_eos, add_space_prefix;
    uint32_t n;             /* vocabulary size */
    uint32_t max_len;       /* longest token string, bytes */
    char *text;             /* all token strings, each followed by a NUL */
    uint32_t *off, *len;    /* string of token i: text + off[i], len[i] bytes */
    float *score;
    uint8_t *type;          /* enum mr_tok_type */
    uint8_t *strip;         /* 1: lstrip, 2: rstrip around a special match */
    /* text -> id: slot holds id + 1, 0 = empty */
    uint32_t *slot;
    uint64_t slot_mask;
    /* BPE merges: (left id, right id) -> rank, merged id */
    struct mr_merge {
        uint64_t key;       /* (left << 32 | right) + 1, 0 = empty */
        uint32_t rank;
        mr_token res;
    } *merge;               /* one probe touches one cache line */
    uint64_t mmask;
    /* BPE: token of the byte-level character of byte b; SPM: <0xNN> token */
    mr_token byte_tok[256];
    /* BPE: UTF-8 form of the byte-level character of each byte */
    char bchar[256][2];
    uint8_t bchar_len[256];
    /* decoded piece of each token (normal decoding) */
    char *piece;
    uint32_t *poff, *plen;
    mr_token bos, eos, eot, eom, pad, unk;
    mr_token *special;      /* tokens matched in text, longest first */
    size_t n_special;
    mr_token *eog;
    size_t n_eog;
};

/* Candidate merges of BPE and SPM, kept in a binary min-heap so that a word
 * of n symbols costs O(n log n) rather than one rescan per merge.  A popped
 * pair whose two symbols have changed since it was queued is stale: the
 * encoder checks that with a and b (what each side was) and skips it. */
typedef struct mr_tok_pair {
    uint32_t prio;         /* lower pops first; on ties the leftmost pair */
    int32_t left, right;   /* symbol indices */
    uint32_t a, b;         /* the encoder's record of the left and right symbol */
    mr_token res;          /* the merged token, where the encoder knows it */
} mr_tok_pair;

typedef struct mr_tok_heap {
    mr_tok_pair *v;
    size_t n, cap;
} mr_tok_heap;

static inline bool mr_tok_pair_before(const mr_tok_pair *x, const mr_tok_pair *y)
{
    return x->prio < y->prio || (x->prio == y->prio && x->left < y->left);
}

/* -1 when out of memory */
static inline int mr_tok_heap_push(mr_tok_heap *h, mr_tok_pair p)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        mr_tok_pair *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!mr_tok_pair_before(&p, &h->v[parent]))
            break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = p;
    return 0;
}

/* h->n > 0 */
static inline mr_tok_pair mr_tok_heap_pop(mr_tok_heap *h)
{
    mr_tok_pair top = h->v[0];
    mr_tok_pair last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        size_t m = (l + 1 < n && mr_tok_pair_before(&h->v[l + 1], &h->v[l])) ? l + 1 : l;
        if (!mr_tok_pair_before(&h->v[m], &last))
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (n)
        h->v[i] = last;
    return top;
}

/* model encoders (one raw-text fragment, no specials) */
int mr_bpe_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err);
int mr_wpm_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err);
int mr_spm_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err);


#endif

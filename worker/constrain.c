/* The vocabulary a grammar matches against: each id's bytes, kept in one
 * block (the scheduler needs them to advance a match over a drawn id) and
 * handed to the grammar's trie (common/grammar.h). */
#include <stdlib.h>
#include <string.h>

#include "worker/constrain.h"

struct mr_constrain_vocab {
    int n;
    size_t *off;  /* [n + 1]: id i's bytes are bytes[off[i] .. off[i + 1]) */
    char *bytes;
    mr_gvocab *gv;
};

void mr_constrain_vocab_free(mr_constrain_vocab *v)
{
    if (!v)
        return;
    mr_gvocab_free(v->gv);
    free(v->off);
    free(v->bytes);
    free(v);
}

/* The bytes a client receives for id: none for control and unused ids. */
static const char *piece_of(const mr_tokenizer *t, int32_t id, size_t *len)
{
    *len = 0;
    enum mr_tok_type ty = mr_tok_type(t, id);
    if (ty == MR_TOKTYPE_CONTROL || ty == MR_TOKTYPE_UNUSED || ty == MR_TOKTYPE_UNDEFINED)
        return NULL;
    const char *p = mr_tok_piece_view(t, id, 0, len);
    if (!p)
        *len = 0;
    return p;
}

int mr_constrain_vocab_new(const mr_tokenizer *t, mr_constrain_vocab **out, mr_err *err)
{
    *out = NULL;
    uint32_t n = mr_tok_n_vocab(t);
    if (n == 0 || n > (1u << 24))
        return mr_errf(err, "grammar vocabulary: %u tokens", n);
    mr_constrain_vocab *v = calloc(1, sizeof *v);
    const char **pieces = calloc(n, sizeof *pieces);
    size_t *lens = calloc(n, sizeof *lens);
    if (!v || !pieces || !lens || !(v->off = calloc((size_t)n + 1, sizeof *v->off)))
        goto oom;
    v->n = (int)n;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        pieces[i] = piece_of(t, (int32_t)i, &lens[i]);
        total += lens[i];
    }
    if (!(v->bytes = malloc(total ? total : 1)))
        goto oom;
    for (uint32_t i = 0; i < n; i++) {
        v->off[i + 1] = v->off[i] + lens[i];
        if (lens[i])
            memcpy(v->bytes + v->off[i], pieces[i], lens[i]);
    }
    if (mr_gvocab_new((int)n, pieces, lens, &v->gv, err)) {
        mr_err_wrap(err, "grammar vocabulary");
        goto fail;
    }
    free(pieces);
    free(lens);
    *out = v;
    return 0;
oom:
    mr_errf(err, "grammar vocabulary: out of memory for %u tokens", n);
fail:
    free(pieces);
    free(lens);
    mr_constrain_vocab_free(v);
    return -1;
}

const char *mr_constrain_piece(const mr_constrain_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n) {
        *len = 0;
        return v->bytes;
    }
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

int mr_constrain_vocab_check(const mr_constrain_vocab *v, int n_vocab, mr_err *err)
{
    if (v->n > n_vocab)
        return mr_errf(err, "grammar vocabulary: the tokenizer has %d tokens, the model %d", v->n, n_vocab);
    return 0;
}

int mr_constrain_mask(const mr_constrain_vocab *v, mr_gmatch *m, uint32_t *mask, int n_vocab, mr_err *err)
{
    int words = (n_vocab + 31) / 32, own = (v->n + 31) / 32;
    if (mr_gmatch_mask(m, v->gv, mask, err))
        return -1;
    /* ids past the tokenizer's (a padded embedding) never match */
    if (v->n % 32)
        mask[own - 1] &= (1u << (v->n % 32)) - 1;
    memset(mask + own, 0, sizeof *mask * (size_t)(words - own));
    return 0;
}

/* Constrained decoding: the model's tokens as the bytes a grammar
 * (common/grammar.h) matches, and the mask of the ids that may come next.
 *
 * The bytes of a token are what the gateway's detokenizer writes for it
 * (mr_tok_piece_view without flags), so the text a client receives is
 * exactly what the grammar matched.  Control tokens write nothing and never
 * match; end of generation is the scheduler's business (its stop ids are
 * allowed exactly where the output is a whole sentence). */
#ifndef MR_CONSTRAIN_H
#define MR_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/grammar.h"
#include "common/tokenizer.h"

typedef struct mr_constrain_vocab mr_constrain_vocab;

/* From a tokenizer (which may be freed afterwards). */
int mr_constrain_vocab_new(const mr_tokenizer *t, mr_constrain_vocab **out, mr_err *err);
void mr_constrain_vocab_free(mr_constrain_vocab *v);

/* Whether a model of n_vocab ids can use v (its tokenizer has no more ids). */
int mr_constrain_vocab_check(const mr_constrain_vocab *v, int n_vocab, mr_err *err);

/* Token id's bytes (*len 0 and a non-NULL pointer for ids without any or
 * out of range). */
const char *mr_constrain_piece(const mr_constrain_vocab *v, int32_t id, size_t *len);

/* Sets bit i of mask[(n_vocab + 31) / 32] when id i may follow what m has
 * matched, clears the others (ids the tokenizer does not have: a model's
 * padded vocabulary).  v must have passed mr_constrain_vocab_check for
 * n_vocab (once, where the scheduler is made: this runs every step).  -1
 * on allocation failure (err says so). */
int mr_constrain_mask(const mr_constrain_vocab *v, mr_gmatch *m, uint32_t *mask, int n_vocab, mr_err *err);

#endif

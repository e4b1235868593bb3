/* Tokenizer built from GGUF `tokenizer.ggml.*` metadata: text -> token ids
 * exactly as the model's own tokenizer does it, and ids -> text, including a
 * streaming detokenizer that never emits a broken UTF-8 sequence.
 *
 * Models: `gpt2` (byte-level BPE, merge ranks) with the upstream
 * pre-tokenizers named by `tokenizer.ggml.pre`, `llama` (SentencePiece:
 * scores, <0xNN> byte fallback, leading-space prefix) and `bert`
 * (WordPiece: BERT normalization, greedy longest match); `gemma4` (BPE over
 * raw UTF-8 with U+2581 spaces and <0xNN> byte fallback) follows upstream's
 * rules but has no test vectors here.
 * A loaded mr_tokenizer is immutable: any number of threads may encode and
 * decode with it at once (each call uses its own scratch memory). */
#ifndef MR_TOKENIZER_H
#define MR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/gguf.h"

typedef int32_t mr_token;
#define MR_TOKEN_NULL ((mr_token)-1)

enum mr_tok_model {
    MR_TOK_MODEL_BPE = 1, /* tokenizer.ggml.model = gpt2 (or gemma4) */
    MR_TOK_MODEL_SPM = 2, /* tokenizer.ggml.model = llama */
    MR_TOK_MODEL_WPM = 3, /* tokenizer.ggml.model = bert (WordPiece) */
};

/* Token types as stored in tokenizer.ggml.token_type. */
enum mr_tok_type {
    MR_TOKTYPE_UNDEFINED = 0,
    MR_TOKTYPE_NORMAL = 1,
    MR_TOKTYPE_UNKNOWN = 2,
    MR_TOKTYPE_CONTROL = 3,
    MR_TOKTYPE_USER_DEFINED = 4,
    MR_TOKTYPE_UNUSED = 5,
    MR_TOKTYPE_BYTE = 6,
};

/* A growable byte buffer (not NUL-terminated unless said). */
typedef struct mr_bytes {
    char *data;
    size_t len, cap;
} mr_bytes;
void mr_bytes_free(mr_bytes *b);
/* Appends n bytes (keeps a NUL after the end, not counted in len); -1 when out of memory. */
int mr_bytes_append(mr_bytes *b, const void *p, size_t n);

/* A growable list of token ids. */
typedef struct mr_tokens {
    mr_token *ids;
    size_t n, cap;
} mr_tokens;
void mr_tokens_free(mr_tokens *t);
int mr_tokens_push(mr_tokens *t, mr_token id); /* -1 when out of memory */

typedef struct mr_tokenizer mr_tokenizer;

/* Builds a tokenizer from an opened GGUF (the tokenizer copies what it
 * needs: the gguf may be closed afterwards).  Validates every array length,
 * id and type; an unknown model or pre-tokenizer is an error. */
int mr_tok_load(const mr_gguf *g, mr_tokenizer **out, mr_err *err);
int mr_tok_load_file(const char *path, mr_tokenizer **out, mr_err *err);
void mr_tok_free(mr_tokenizer *t);

/* ---- vocabulary facts ---- */
uint32_t mr_tok_n_vocab(const mr_tokenizer *t);
enum mr_tok_model mr_tok_model(const mr_tokenizer *t);
const char *mr_tok_pre_name(const mr_tokenizer *t); /* "" when absent */
mr_token mr_tok_bos(const mr_tokenizer *t); /* MR_TOKEN_NULL when none */
mr_token mr_tok_eos(const mr_tokenizer *t);
mr_token mr_tok_eot(const mr_tokenizer *t); /* end of turn (e.g. <|im_end|>) */
mr_token mr_tok_pad(const mr_tokenizer *t);
mr_token mr_tok_unk(const mr_tokenizer *t);
bool mr_tok_add_bos(const mr_tokenizer *t);
bool mr_tok_add_eos(const mr_tokenizer *t);
/* End of generation: eos, eot, eom and the other end markers the vocabulary has. */
bool mr_tok_is_eog(const mr_tokenizer *t, mr_token id);
/* Token type (MR_TOKTYPE_*); MR_TOKTYPE_UNDEFINED for an id out of range. */
enum mr_tok_type mr_tok_type(const mr_tokenizer *t, mr_token id);
/* The vocabulary string of a token (not NUL-terminated); NULL when out of range. */
const char *mr_tok_text(const mr_tokenizer *t, mr_token id, size_t *len);
/* Id of the token whose vocabulary string is exactly text[0..len); MR_TOKEN_NULL if none. */
mr_token mr_tok_find(const mr_tokenizer *t, const char *text, size_t len);

/* ---- encoding ---- */
enum {
    /* Add BOS/EOS as the model's add_bos/add_eos flags say. */
    MR_TOK_ADD_SPECIAL = 1u << 0,
    /* Recognise control tokens (e.g. <|im_start|>) written in the text, as
     * for rendered chat prompts.  User-defined tokens are always recognised;
     * the longest special token is matched first. */
    MR_TOK_PARSE_SPECIAL = 1u << 1,
};
/* Appends the ids of text[0..len) to out.  Any bytes are accepted (invalid
 * UTF-8 is classified as U+FFFD but kept byte for byte where the
 * vocabulary can represent it). */
int mr_tok_encode(const mr_tokenizer *t, const char *text, size_t len, unsigned flags,
                  mr_tokens *out, mr_err *err);

/* ---- decoding ---- */
enum {
    /* Render control/unknown tokens as their text (otherwise they decode to nothing). */
    MR_DETOK_SPECIAL = 1u << 0,
    /* Drop one leading space of the first piece (SentencePiece prefix space). */
    MR_DETOK_STRIP_LEADING_SPACE = 1u << 1,
};
/* Appends the bytes of one token (may be part of a UTF-8 sequence). */
int mr_tok_piece(const mr_tokenizer *t, mr_token id, unsigned flags, mr_bytes *out, mr_err *err);
/* The same bytes without a copy: *len bytes inside the tokenizer (valid as
 * long as it is; not NUL-terminated); NULL when id is out of range.  For the
 * per-token path of a caller that has its own output buffer. */
const char *mr_tok_piece_view(const mr_tokenizer *t, mr_token id, unsigned flags, size_t *len);
/* Appends the bytes of ids[0..n), exactly (no UTF-8 repair). */
int mr_tok_decode(const mr_tokenizer *t, const mr_token *ids, size_t n, unsigned flags,
                  mr_bytes *out, mr_err *err);

/* Streaming detokenizer: push one generated id at a time; what is appended
 * to out is always valid UTF-8.  A sequence cut between tokens is held back
 * until the next token completes it; bytes that can never form valid UTF-8
 * become U+FFFD.  flush() ends the stream: an unfinished tail becomes U+FFFD. */
typedef struct mr_detok_stream mr_detok_stream;
mr_detok_stream *mr_detok_stream_new(const mr_tokenizer *t, unsigned flags);
int mr_detok_stream_push(mr_detok_stream *s, mr_token id, mr_bytes *out, mr_err *err);
int mr_detok_stream_flush(mr_detok_stream *s, mr_bytes *out, mr_err *err);
void mr_detok_stream_free(mr_detok_stream *s);

#endif

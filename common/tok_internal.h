/* Internals shared by the tokenizer sources (not a public header). */
#ifndef MR_TOK_INTERNAL_H
#define MR_TOK_INTERNAL_H

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

/* model encoders (one raw-text fragment, no specials) */
int mr_bpe_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err);
int mr_wpm_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err);
int mr_spm_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err);


#endif

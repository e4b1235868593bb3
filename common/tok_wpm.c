/* WordPiece (tokenizer.ggml.model = bert), as Hugging Face's BERT tokenizer:
 * the text is cleaned (control characters dropped), accents stripped (NFD,
 * nonspacing marks removed) and lowercased; words are split at whitespace,
 * and every punctuation character (Unicode P, and the ASCII symbols) and
 * CJK ideograph is a word by itself.  Each word is then cut greedily into the
 * longest vocabulary tokens; the GGUF vocabulary marks word starts with
 * U+2581 (where BERT marks continuations with ##).  A word that cannot be cut
 * entirely becomes [UNK]. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_internal.h"
#include "common/unicode.h"

static bool is_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* word (with its U+2581 prefix) -> longest-match tokens, or [UNK] */
static int emit_word(const mr_tokenizer *t, const mr_bytes *w, mr_tokens *out)
{
    if (w->len <= 3)
        return 0; /* just the prefix: no word */
    size_t start = out->n;
    size_t n = w->len;
    for (size_t i = 0; i < n;) {
        size_t j = i + t->max_len < n ? i + t->max_len : n;
        mr_token id = MR_TOKEN_NULL;
        for (; j > i; j--) {
            id = mr_tok_find(t, w->data + i, j - i);
            if (id != MR_TOKEN_NULL)
                break;
        }
        if (id == MR_TOKEN_NULL) {
            out->n = start; /* the whole word is unknown */
            break;
        }
        if (mr_tokens_push(out, id))
            return -1;
        i = j;
    }
    if (out->n == start && t->unk != MR_TOKEN_NULL && mr_tokens_push(out, t->unk))
        return -1;
    return 0;
}

int mr_wpm_encode(const mr_tokenizer *t, const char *text, size_t len, mr_tokens *out,
                  mr_err *err)
{
    static const char mark[] = "\xe2\x96\x81";
    mr_bytes w = {0};
    int rc = mr_bytes_append(&w, mark, 3);
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len && rc == 0;) {
        size_t l;
        uint32_t c = mr_utf8_decode(s + i, len - i, &l);
        i += l;
        unsigned f = mr_unicode_flags(c);
        if (f & MR_UFLAG_WS) {
            rc = emit_word(t, &w, out);
            w.len = 3;
            continue;
        }
        if (c == 0 || c == MR_UNICODE_REPLACEMENT || (f & MR_UFLAG_CAT) == MR_UCAT_C)
            continue;
        uint32_t d[32];
        size_t nd = mr_unicode_decompose(c, d, 32);
        for (size_t k = 0; k < nd && rc == 0; k++) {
            unsigned fk = mr_unicode_flags(d[k]);
            if (fk & MR_UFLAG_MN)
                continue; /* accents are stripped */
            char u[4];
            size_t ul = mr_utf8_encode(mr_unicode_tolower(d[k]), u);
            enum mr_ucat cat = (enum mr_ucat)(fk & MR_UFLAG_CAT);
            if (cat == MR_UCAT_P || (d[k] < 0x7F && cat == MR_UCAT_S) || is_cjk(d[k])) {
                rc = emit_word(t, &w, out);
                w.len = 3;
                if (rc == 0)
                    rc = mr_bytes_append(&w, u, ul);
                if (rc == 0)
                    rc = emit_word(t, &w, out);
                w.len = 3;
            } else {
                rc = mr_bytes_append(&w, u, ul);
            }
        }
    }
    if (rc == 0)
        rc = emit_word(t, &w, out);
    mr_bytes_free(&w);
    return rc ? mr_errf(err, "tokenize: out of memory") : 0;
}

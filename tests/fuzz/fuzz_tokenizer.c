/* libFuzzer target: arbitrary bytes through encode, decode and the streaming
 * detokenizer of three real vocabularies (byte-level BPE with NFC and special
 * tokens, SentencePiece, WordPiece).  Checks: no crash or sanitizer report,
 * byte-level BPE round-trips text that is already NFC, and the stream only
 * ever emits valid UTF-8. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "common/unicode.h"

static mr_tokenizer *toks[3];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char *const rel[3] = {"vocab/qwen3-vocab.gguf", "vocab/ggml-vocab-llama-spm.gguf",
                                       "vocab/ggml-vocab-bert-bge.gguf"};
    const char *root = getenv("MEMRA_FIXTURES");
    if (!root || !*root)
        root = "../shared/fixtures";
    for (int i = 0; i < 3; i++) {
        char path[4096];
        mr_err err;
        snprintf(path, sizeof path, "%s/%s", root, rel[i]);
        if (mr_tok_load_file(path, &toks[i], &err)) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
            abort();
        }
    }
    return 0;
}

static int utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], k, cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3, cp = c & 0x07;
        else
            return 0;
        for (unsigned j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const mr_tokenizer *t = toks[data[0] % 3];
    unsigned flags = (data[0] & 4) ? MR_TOK_PARSE_SPECIAL : 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    mr_err err;
    mr_tokens ids = {0};
    if (mr_tok_encode(t, text, len, flags | MR_TOK_ADD_SPECIAL, &ids, &err))
        abort();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0 || (uint32_t)ids.ids[i] >= mr_tok_n_vocab(t))
            abort();
    mr_bytes dec = {0};
    if (mr_tok_decode(t, ids.ids, ids.n, 0, &dec, &err))
        abort();
    if (t == toks[0] && !(flags & MR_TOK_PARSE_SPECIAL)) {
        /* byte-level BPE keeps every byte of NFC text */
        char *norm = NULL;
        size_t nl = 0;
        int r = mr_utf8_nfc(text, len, &norm, &nl);
        if (r == 0 && !(dec.len == len && (len == 0 || memcmp(dec.data, text, len) == 0)))
            abort();
        free(norm);
    }
    mr_detok_stream *s = mr_detok_stream_new(t, MR_DETOK_SPECIAL);
    if (!s)
        abort();
    mr_bytes out = {0};
    for (size_t i = 0; i < ids.n; i++) {
        size_t before = out.len;
        if (mr_detok_stream_push(s, ids.ids[i], &out, &err))
            abort();
        if (!utf8_ok((const unsigned char *)out.data + before, out.len - before))
            abort();
    }
    if (mr_detok_stream_flush(s, &out, &err) || !utf8_ok((const unsigned char *)out.data, out.len))
        abort();
    mr_detok_stream_free(s);
    mr_bytes_free(&out);
    mr_bytes_free(&dec);
    mr_tokens_free(&ids);
    return 0;
}

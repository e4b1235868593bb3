/* Tokenizer: round trips and streaming over the upstream tokenizer test
 * strings, special tokens, model flags, NFC against Unicode's own
 * NormalizationTest.txt, and malformed metadata.  (Exact ids against the
 * upstream vectors are checked by tests/e2e/tokenize.sh.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "common/unicode.h"
#include "tests/unit/testutil.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert(b != NULL);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

static mr_tokenizer *load(const char *rel)
{
    mr_tokenizer *t;
    mr_err err;
    int rc = mr_tok_load_file(fixture_path(rel), &t, &err);
    ck_assert_msg(rc == 0, "%s: %s", rel, err.msg);
    return t;
}

/* Strict UTF-8 check, written here independently of the library. */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1, cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2, cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3, cp = c & 0x07;
        } else {
            return false;
        }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

/* The test strings of an upstream .inp file. */
typedef struct strs {
    char *buf;
    const char *s[128];
    size_t len[128];
    size_t n;
} strs;

static void read_inp(const char *rel, strs *o)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t len;
    o->buf = slurp(fixture_path(rel), &len);
    o->n = 0;
    size_t pos = 0;
    while (pos < len && o->n < 128) {
        char *m = memmem(o->buf + pos, len - pos, sep, sizeof sep - 1);
        size_t end = m ? (size_t)(m - o->buf) : len;
        o->s[o->n] = o->buf + pos;
        o->len[o->n++] = end - pos;
        if (!m)
            break;
        pos = end + sizeof sep - 1;
    }
    ck_assert_uint_gt(o->n, 20);
}

static const char *const vocabs[] = {
    "vocab/ggml-vocab-gpt-2.gguf",       "vocab/ggml-vocab-deepseek-coder.gguf",
    "vocab/ggml-vocab-deepseek-llm.gguf", "vocab/ggml-vocab-falcon.gguf",
    "vocab/ggml-vocab-mpt.gguf",         "vocab/ggml-vocab-refact.gguf",
    "vocab/ggml-vocab-starcoder.gguf",   "vocab/ggml-vocab-llama-spm.gguf",
    "vocab/ggml-vocab-phi-3.gguf",       "vocab/qwen3-vocab.gguf",
};

/* decode(encode(s)) == s (NFC(s) where the tokenizer normalizes), and the
 * streaming detokenizer gives the same text in valid UTF-8 pieces. */
START_TEST(roundtrip_and_stream)
{
    const char *rel = vocabs[_i];
    char inp[256];
    snprintf(inp, sizeof inp, "%s.inp", rel);
    mr_tokenizer *t = load(rel);
    strs in;
    read_inp(inp, &in);
    mr_err err;
    unsigned dflags = MR_DETOK_SPECIAL;
    if (mr_tok_model(t) == MR_TOK_MODEL_SPM)
        dflags |= MR_DETOK_STRIP_LEADING_SPACE;
    bool nfc = strcmp(mr_tok_pre_name(t), "qwen2") == 0;
    for (size_t i = 0; i < in.n; i++) {
        mr_tokens ids = {0};
        ck_assert_msg(mr_tok_encode(t, in.s[i], in.len[i], MR_TOK_PARSE_SPECIAL, &ids, &err) == 0,
                      "%s", err.msg);
        mr_bytes dec = {0};
        ck_assert(mr_tok_decode(t, ids.ids, ids.n, dflags, &dec, &err) == 0);
        char *want = (char *)in.s[i];
        size_t wlen = in.len[i];
        char *norm = NULL;
        if (nfc && mr_utf8_nfc(in.s[i], in.len[i], &norm, &wlen) == 1)
            want = norm;
        else
            wlen = in.len[i];
        ck_assert_msg(dec.len == wlen && memcmp(dec.data ? dec.data : "", want, wlen) == 0,
                      "%s: string %zu does not round-trip: got '%.*s'", rel, i, (int)dec.len,
                      dec.data ? dec.data : "");
        /* streaming */
        mr_detok_stream *s = mr_detok_stream_new(t, dflags);
        ck_assert(s != NULL);
        mr_bytes all = {0};
        for (size_t k = 0; k < ids.n; k++) {
            mr_bytes piece = {0};
            ck_assert(mr_detok_stream_push(s, ids.ids[k], &piece, &err) == 0);
            ck_assert_msg(valid_utf8((const unsigned char *)piece.data, piece.len),
                          "%s: string %zu token %zu: invalid UTF-8 emitted", rel, i, k);
            ck_assert(mr_bytes_append(&all, piece.data, piece.len) == 0);
            mr_bytes_free(&piece);
        }
        ck_assert(mr_detok_stream_flush(s, &all, &err) == 0);
        ck_assert(valid_utf8((const unsigned char *)all.data, all.len));
        if (valid_utf8((const unsigned char *)dec.data, dec.len))
            ck_assert_msg(all.len == dec.len && memcmp(all.data ? all.data : "", dec.data ? dec.data : "", dec.len) == 0,
                          "%s: string %zu: stream differs from decode", rel, i);
        mr_detok_stream_free(s);
        mr_bytes_free(&all);
        free(norm);
        mr_bytes_free(&dec);
        mr_tokens_free(&ids);
    }
    free(in.buf);
    mr_tok_free(t);
}
END_TEST

static mr_token byte_token(const mr_tokenizer *t, unsigned char b)
{
    /* GPT-2 byte-level character of b, computed here from its definition */
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
        unsigned k = 0;
        for (unsigned c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)))
                k++;
        cp = 0x100 + k;
    }
    char s[4];
    size_t n;
    if (cp < 0x80) {
        s[0] = (char)cp, n = 1;
    } else {
        s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    }
    mr_token id = mr_tok_find(t, s, n);
    ck_assert_int_ge(id, 0);
    return id;
}

START_TEST(stream_holds_incomplete_utf8)
{
    mr_tokenizer *t = load("vocab/qwen3-vocab.gguf");
    mr_err err;
    mr_detok_stream *s = mr_detok_stream_new(t, 0);
    mr_bytes out = {0};
    /* "é" = c3 a9 sent as two byte tokens: nothing, then the character */
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xC3), &out, &err) == 0);
    ck_assert_uint_eq(out.len, 0);
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xA9), &out, &err) == 0);
    ck_assert_uint_eq(out.len, 2);
    ck_assert(memcmp(out.data, "\xc3\xa9", 2) == 0);
    /* a 4-byte emoji split 1 + 2 + 1 */
    out.len = 0;
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xF0), &out, &err) == 0);
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0x9F), &out, &err) == 0);
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0x98), &out, &err) == 0);
    ck_assert_uint_eq(out.len, 0);
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0x80), &out, &err) == 0);
    ck_assert(out.len == 4 && memcmp(out.data, "\xf0\x9f\x98\x80", 4) == 0);
    /* a byte that starts nothing valid becomes U+FFFD at once */
    out.len = 0;
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xFF), &out, &err) == 0);
    ck_assert(out.len == 3 && memcmp(out.data, "\xef\xbf\xbd", 3) == 0);
    /* an unfinished sequence followed by ASCII: U+FFFD then the ASCII */
    out.len = 0;
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xE4), &out, &err) == 0);
    ck_assert_uint_eq(out.len, 0);
    ck_assert(mr_detok_stream_push(s, mr_tok_find(t, "a", 1), &out, &err) == 0);
    ck_assert(out.len == 4 && memcmp(out.data, "\xef\xbf\xbd" "a", 4) == 0);
    /* flush turns a held-back tail into U+FFFD */
    out.len = 0;
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xE4), &out, &err) == 0);
    ck_assert(mr_detok_stream_push(s, byte_token(t, 0xBD), &out, &err) == 0);
    ck_assert_uint_eq(out.len, 0);
    ck_assert(mr_detok_stream_flush(s, &out, &err) == 0);
    ck_assert(out.len == 3 && memcmp(out.data, "\xef\xbf\xbd", 3) == 0);
    /* an id out of range is an error, not a crash */
    ck_assert(mr_detok_stream_push(s, (mr_token)mr_tok_n_vocab(t), &out, &err) == -1);
    ck_assert(mr_detok_stream_push(s, -5, &out, &err) == -1);
    mr_bytes_free(&out);
    mr_detok_stream_free(s);
    mr_tok_free(t);
}
END_TEST

START_TEST(special_tokens_and_flags)
{
    mr_tokenizer *t = load("vocab/qwen3-vocab.gguf");
    mr_err err;
    const char *chat = "<|im_start|>user\nHi<think>x</think><|im_end|>";
    mr_token im_start = mr_tok_find(t, "<|im_start|>", 12);
    mr_token im_end = mr_tok_find(t, "<|im_end|>", 10);
    mr_token think = mr_tok_find(t, "<think>", 7);
    ck_assert_int_ge(im_start, 0);
    ck_assert_int_eq(mr_tok_type(t, im_start), MR_TOKTYPE_CONTROL);
    ck_assert_int_eq(mr_tok_type(t, think), MR_TOKTYPE_USER_DEFINED);
    mr_tokens a = {0}, b = {0};
    ck_assert(mr_tok_encode(t, chat, strlen(chat), MR_TOK_PARSE_SPECIAL, &a, &err) == 0);
    ck_assert_int_eq(a.ids[0], im_start);
    ck_assert_int_eq(a.ids[a.n - 1], im_end);
    bool has_think = false;
    for (size_t i = 0; i < a.n; i++)
        has_think |= a.ids[i] == think;
    ck_assert(has_think);
    /* without parsing, control tokens are text; user-defined ones still match */
    ck_assert(mr_tok_encode(t, chat, strlen(chat), 0, &b, &err) == 0);
    has_think = false;
    for (size_t i = 0; i < b.n; i++) {
        ck_assert_int_ne(b.ids[i], im_start);
        ck_assert_int_ne(b.ids[i], im_end);
        has_think |= b.ids[i] == think;
    }
    ck_assert(has_think);
    mr_bytes d = {0};
    ck_assert(mr_tok_decode(t, b.ids, b.n, 0, &d, &err) == 0);
    ck_assert_str_eq(d.data, chat);
    /* control tokens decode to nothing unless asked */
    d.len = 0;
    ck_assert(mr_tok_decode(t, a.ids, a.n, 0, &d, &err) == 0);
    ck_assert_str_eq(d.data, "user\nHi<think>x</think>");
    ck_assert_int_eq(mr_tok_eos(t), im_end);
    ck_assert_int_eq(mr_tok_eot(t), im_end);
    ck_assert(mr_tok_is_eog(t, mr_tok_find(t, "<|endoftext|>", 13)));
    ck_assert(!mr_tok_is_eog(t, think));
    ck_assert(!mr_tok_add_bos(t));
    mr_tokens_free(&a);
    mr_tokens_free(&b);
    mr_bytes_free(&d);
    mr_tok_free(t);

    /* SentencePiece: BOS added when asked, leading space, byte fallback */
    t = load("vocab/ggml-vocab-llama-spm.gguf");
    ck_assert(mr_tok_add_bos(t));
    ck_assert_int_eq(mr_tok_bos(t), 1);
    ck_assert(mr_tok_encode(t, "Hello", 5, MR_TOK_ADD_SPECIAL, &a, &err) == 0);
    ck_assert_int_eq(a.ids[0], 1);
    ck_assert_uint_eq(a.n, 2);
    a.n = 0;
    ck_assert(mr_tok_encode(t, "", 0, 0, &a, &err) == 0);
    ck_assert_uint_eq(a.n, 0);
    const char *rare = "\xf0\x9f\xa6\x99"; /* 🦙: not in the vocabulary, 4 byte tokens */
    ck_assert(mr_tok_encode(t, rare, 4, 0, &a, &err) == 0);
    ck_assert_uint_ge(a.n, 4);
    for (size_t i = a.n - 4; i < a.n; i++)
        ck_assert_int_eq(mr_tok_type(t, a.ids[i]), MR_TOKTYPE_BYTE);
    mr_tokens_free(&a);
    mr_tok_free(t);

    /* WordPiece: [CLS] ... [SEP], lowercased, accents stripped */
    t = load("vocab/ggml-vocab-bert-bge.gguf");
    ck_assert(mr_tok_encode(t, "H\xc3\xa9llo", 6, MR_TOK_ADD_SPECIAL, &a, &err) == 0);
    ck_assert_uint_eq(a.n, 3);
    ck_assert_int_eq(a.ids[0], 101);
    ck_assert_int_eq(a.ids[1], mr_tok_find(t, "\xe2\x96\x81hello", 8));
    ck_assert_int_eq(a.ids[2], 102);
    mr_tokens_free(&a);
    mr_tok_free(t);
}
END_TEST

/* NFC of our tables against Unicode's NormalizationTest.txt (same version of
 * the data: Debian's unicode-data): c2 == NFC(c1) == NFC(c2) == NFC(c3),
 * c4 == NFC(c4) == NFC(c5). */
static size_t parse_cps(const char *f, char *out)
{
    size_t n = 0;
    while (*f) {
        char *end;
        unsigned long cp = strtoul(f, &end, 16);
        if (end == f)
            break;
        n += mr_utf8_encode((uint32_t)cp, out + n);
        f = end;
        while (*f == ' ')
            f++;
    }
    return n;
}

START_TEST(nfc_normalization_test)
{
    FILE *p = popen("bzcat /usr/share/unicode/NormalizationTest.txt.bz2", "r");
    ck_assert(p != NULL);
    char line[1024];
    size_t lines = 0;
    while (fgets(line, sizeof line, p)) {
        if (line[0] == '#' || line[0] == '@' || line[0] == '\n')
            continue;
        char *col[5];
        char *q = line;
        for (int k = 0; k < 5; k++) {
            col[k] = q;
            q = strchr(q, ';');
            ck_assert(q != NULL);
            *q++ = '\0';
        }
        char c[5][256];
        size_t cl[5];
        for (int k = 0; k < 5; k++)
            cl[k] = parse_cps(col[k], c[k]);
        const int src[5] = {0, 1, 2, 3, 4}, want[5] = {1, 1, 1, 3, 3};
        for (int k = 0; k < 5; k++) {
            char *o = NULL;
            size_t ol = 0;
            int r = mr_utf8_nfc(c[src[k]], cl[src[k]], &o, &ol);
            ck_assert_int_ge(r, 0);
            const char *got = r ? o : c[src[k]];
            size_t gl = r ? ol : cl[src[k]];
            ck_assert_msg(gl == cl[want[k]] && memcmp(got, c[want[k]], gl) == 0,
                          "NFC of column %d of line '%s' is wrong", k + 1, col[0]);
            free(o);
        }
        lines++;
    }
    pclose(p);
    ck_assert_uint_gt(lines, 15000);
}
END_TEST

/* ---- malformed metadata ---- */

typedef struct gbuf {
    unsigned char b[65536];
    size_t n;
    uint64_t nkv;
} gbuf;

static void put(gbuf *g, const void *p, size_t n)
{
    ck_assert(g->n + n <= sizeof g->b);
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void put_u32(gbuf *g, uint32_t v) { put(g, &v, 4); }
static void put_u64(gbuf *g, uint64_t v) { put(g, &v, 8); }
static void put_str(gbuf *g, const char *s) { put_u64(g, strlen(s)), put(g, s, strlen(s)); }
static void kv_str(gbuf *g, const char *k, const char *v)
{
    put_str(g, k), put_u32(g, 8), put_str(g, v), g->nkv++;
}
static void kv_strs(gbuf *g, const char *k, const char *const *v, size_t n)
{
    put_str(g, k), put_u32(g, 9), put_u32(g, 8), put_u64(g, n);
    for (size_t i = 0; i < n; i++)
        put_str(g, v[i]);
    g->nkv++;
}
static void kv_i32s(gbuf *g, const char *k, const int32_t *v, size_t n)
{
    put_str(g, k), put_u32(g, 9), put_u32(g, 5), put_u64(g, n), put(g, v, 4 * n), g->nkv++;
}
static void begin(gbuf *g)
{
    g->n = 0, g->nkv = 0;
    put_u32(g, 0x46554747u), put_u32(g, 3), put_u64(g, 0), put_u64(g, 0);
}
static int try_load(gbuf *g, mr_err *err)
{
    memcpy(g->b + 16, &g->nkv, 8);
    mr_gguf *gg;
    if (mr_gguf_open_mem(g->b, g->n, &gg, err))
        return -2;
    mr_tokenizer *t = NULL;
    int rc = mr_tok_load(gg, &t, err);
    if (rc == 0) {
        mr_tokens ids = {0};
        ck_assert(mr_tok_encode(t, "ab ab", 5, MR_TOK_PARSE_SPECIAL, &ids, err) == 0);
        mr_tokens_free(&ids);
    }
    mr_tok_free(t);
    mr_gguf_close(gg);
    return rc;
}

START_TEST(malformed_metadata)
{
    static gbuf g;
    mr_err err;
    const char *toks[] = {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab"};
    const char *merges[] = {"a b", "\xc4\xa0 ab"};
    const int32_t types[] = {1, 1, 1, 1, 1};

    begin(&g); /* a valid minimal vocabulary */
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "qwen2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 2);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 5);
    ck_assert_msg(try_load(&g, &err) == 0, "%s", err.msg);

    begin(&g); /* no tokens */
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.merges", merges, 2);
    ck_assert_int_eq(try_load(&g, &err), -1);
    ck_assert(strstr(err.msg, "tokenizer.ggml.tokens") != NULL);

    begin(&g); /* token types shorter than the vocabulary */
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 2);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 3);
    ck_assert_int_eq(try_load(&g, &err), -1);
    ck_assert(strstr(err.msg, "token_type") != NULL);

    begin(&g); /* a merge without a separator */
    const char *bad_merges[] = {"ab"};
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&g, "tokenizer.ggml.merges", bad_merges, 1);
    ck_assert_int_eq(try_load(&g, &err), -1);
    ck_assert(strstr(err.msg, "merges[0]") != NULL);

    begin(&g); /* unknown pre-tokenizer and model */
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "no-such-pre");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 5);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 2);
    ck_assert_int_eq(try_load(&g, &err), -1);
    ck_assert(strstr(err.msg, "no-such-pre") != NULL);
    begin(&g);
    kv_str(&g, "tokenizer.ggml.model", "t5");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 5);
    ck_assert_int_eq(try_load(&g, &err), -1);
    ck_assert(strstr(err.msg, "t5") != NULL);

    begin(&g); /* tokens of the wrong element type */
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_i32s(&g, "tokenizer.ggml.tokens", types, 5);
    ck_assert_int_eq(try_load(&g, &err), -1);
}
END_TEST

/* BPE result independent of how merges are found: "ab ab" with the toy
 * vocabulary above is "ab" + "Ġab" (rank order), checked by hand. */
START_TEST(toy_bpe)
{
    static gbuf g;
    mr_err err;
    const char *toks[] = {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "ab", "\xc4\xa0" "a"};
    const char *merges[] = {"a b", "\xc4\xa0 ab", "\xc4\xa0 a"};
    begin(&g);
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "gpt-2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 6);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 3);
    memcpy(g.b + 16, &g.nkv, 8);
    mr_gguf *gg;
    ck_assert(mr_gguf_open_mem(g.b, g.n, &gg, &err) == 0);
    mr_tokenizer *t;
    ck_assert_msg(mr_tok_load(gg, &t, &err) == 0, "%s", err.msg);
    mr_tokens ids = {0};
    ck_assert(mr_tok_encode(t, "ab ab a", 7, 0, &ids, &err) == 0);
    /* words "ab", " ab", " a": "a b" (rank 0) first, then "Ġ ab" (rank 1);
     * " a" becomes "Ġa" (rank 2) */
    ck_assert_uint_eq(ids.n, 3);
    ck_assert_int_eq(ids.ids[0], 2);
    ck_assert_int_eq(ids.ids[1], 4);
    ck_assert_int_eq(ids.ids[2], 5);
    mr_tokens_free(&ids);
    mr_tok_free(t);
    mr_gguf_close(gg);
}
END_TEST

/* Pre-tokenizer word boundaries seen through a toy BPE whose merges give
 * different ids depending on how "12345" is split into words:
 *   one word (gpt-2: \p{N}+)            -> "3 4" first: 12 34 5
 *   digits by three (llama-bpe)          -> "123" "45"
 *   single digits (qwen2)                -> 1 2 3 4 5
 *   digits by three, then \p{N}+ (default: [0-9]{3} cuts "123" off last) */
static void toy_split(const char *pre, const char *text, const char *const *want_text, size_t nwant)
{
    static gbuf g;
    mr_err err;
    const char *toks[] = {"1", "2", "3", "4", "5", "12", "123", "34", "45", "a", "S", "'", "'S", "aa"};
    const char *merges[] = {"3 4", "1 2", "12 3", "4 5", "' S", "a a"};
    begin(&g);
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", pre);
    kv_strs(&g, "tokenizer.ggml.tokens", toks, sizeof toks / sizeof *toks);
    kv_strs(&g, "tokenizer.ggml.merges", merges, sizeof merges / sizeof *merges);
    memcpy(g.b + 16, &g.nkv, 8);
    mr_gguf *gg;
    ck_assert(mr_gguf_open_mem(g.b, g.n, &gg, &err) == 0);
    mr_tokenizer *t;
    ck_assert_msg(mr_tok_load(gg, &t, &err) == 0, "%s", err.msg);
    mr_tokens ids = {0};
    ck_assert(mr_tok_encode(t, text, strlen(text), 0, &ids, &err) == 0);
    ck_assert_msg(ids.n == nwant, "%s on '%s': %zu tokens, expected %zu", pre, text, ids.n, nwant);
    for (size_t i = 0; i < nwant; i++) {
        size_t l;
        const char *s = mr_tok_text(t, ids.ids[i], &l);
        ck_assert_msg(l == strlen(want_text[i]) && memcmp(s, want_text[i], l) == 0,
                      "%s on '%s': token %zu is '%.*s', expected '%s'", pre, text, i, (int)l, s,
                      want_text[i]);
    }
    mr_tokens_free(&ids);
    mr_tok_free(t);
    mr_gguf_close(gg);
}

START_TEST(pre_tokenizer_boundaries)
{
    toy_split("gpt-2", "12345", (const char *const[]){"12", "34", "5"}, 3);
    toy_split("llama-bpe", "12345", (const char *const[]){"123", "45"}, 2);
    toy_split("qwen2", "12345", (const char *const[]){"1", "2", "3", "4", "5"}, 5);
    toy_split("default", "12345", (const char *const[]){"123", "45"}, 2);
    toy_split("starcoder", "12345", (const char *const[]){"1", "2", "3", "4", "5"}, 5);
    /* contractions: case-insensitive in llama3/qwen2, not in gpt-2 */
    toy_split("qwen2", "a'S", (const char *const[]){"a", "'S"}, 2);
    toy_split("llama-bpe", "aa'S", (const char *const[]){"aa", "'S"}, 2);
    toy_split("gpt-2", "a'S", (const char *const[]){"a", "'", "S"}, 3);
}
END_TEST

/* Gemma 4 style BPE (model gemma4): raw UTF-8 symbols, U+2581 for spaces,
 * lines split from newline runs, <0xNN> byte fallback, BOS forced. */
START_TEST(gemma4_style_bpe)
{
    static gbuf g;
    mr_err err;
    const char *toks[] = {"<pad>", "<eos>", "<bos>", "<0x78>", "\xe2\x96\x81", "H", "i", "Hi",
                          "\xe2\x96\x81Hi", "\n", "\n\n"};
    const int32_t types[] = {3, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1};
    const char *merges[] = {"H i", "\xe2\x96\x81 Hi"};
    begin(&g);
    kv_str(&g, "tokenizer.ggml.model", "gemma4");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 11);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 11);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 2);
    put_str(&g, "tokenizer.ggml.bos_token_id"), put_u32(&g, 4), put_u32(&g, 2), g.nkv++;
    memcpy(g.b + 16, &g.nkv, 8);
    mr_gguf *gg;
    ck_assert(mr_gguf_open_mem(g.b, g.n, &gg, &err) == 0);
    mr_tokenizer *t;
    ck_assert_msg(mr_tok_load(gg, &t, &err) == 0, "%s", err.msg);
    mr_tokens ids = {0};
    ck_assert(mr_tok_encode(t, "Hi Hi\n\nx", 8, MR_TOK_ADD_SPECIAL, &ids, &err) == 0);
    const mr_token want[] = {2, 7, 8, 10, 3};
    ck_assert_uint_eq(ids.n, 5);
    for (size_t i = 0; i < 5; i++)
        ck_assert_int_eq(ids.ids[i], want[i]);
    mr_bytes d = {0};
    ck_assert(mr_tok_decode(t, ids.ids, ids.n, 0, &d, &err) == 0);
    ck_assert_str_eq(d.data, "Hi Hi\n\nx");
    mr_bytes_free(&d);
    mr_tokens_free(&ids);
    mr_tok_free(t);
    mr_gguf_close(gg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tokenizer");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, roundtrip_and_stream, 0, (int)(sizeof vocabs / sizeof *vocabs));
    tcase_add_test(tc, stream_holds_incomplete_utf8);
    tcase_add_test(tc, special_tokens_and_flags);
    tcase_add_test(tc, nfc_normalization_test);
    tcase_add_test(tc, malformed_metadata);
    tcase_add_test(tc, toy_bpe);
    tcase_add_test(tc, pre_tokenizer_boundaries);
    tcase_add_test(tc, gemma4_style_bpe);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

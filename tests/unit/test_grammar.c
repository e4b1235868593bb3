/* The grammar engine (common/grammar.h) against references that are not
 * itself: jansson decides which documents a JSON grammar must accept, a
 * code point by code point membership check decides what a class accepts,
 * and brute force (one try per token) decides what a mask must say, over
 * 256 single bytes and over the real Qwen3 vocabulary. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "common/grammar_int.h"
#include "common/tokenizer.h"
#include "tests/unit/testutil.h"

/* JSON as RFC 8259 writes it, with jansson's reading of \u escapes (RFC
 * 8259 section 8.2 leaves lone surrogates' meaning open; jansson refuses
 * them): a high surrogate must be followed by an escaped low one, a low one
 * never stands alone.  The `ws` before "," and before the closing bracket
 * overlap on purpose: the matcher must follow both parses. */
static const char json_gbnf[] =
    "# JSON, RFC 8259\n"
    "root   ::= ws value ws\n"
    "value  ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array  ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char   ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" escape\n"
    "escape ::= [\"\\\\/bfnrt] | \"u\" ( plain | high \"\\\\u\" low )\n"
    "plain  ::= [0-9a-cA-CeEfF] hex{3} | [dD] [0-7] hex{2}\n"
    "high   ::= [dD] [89abAB] hex{2}\n"
    "low    ::= [dD] [c-fC-F] hex{2}\n"
    "hex    ::= [0-9a-fA-F]\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws     ::= [ \\t\\n\\r]*\n";

/* ---- helpers ---- */

/* An assertion for hot loops: Check's own marks every passing assertion
 * (a write to its log pipe each time), which millions of them feel. */
#define CHECKM(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            ck_abort_msg(__VA_ARGS__);                                                                                 \
    } while (0)
#define CHECK(cond) CHECKM(cond, "%s", #cond)

static mr_grammar *parse_ok(const char *text)
{
    mr_grammar *g;
    mr_err err;
    int rc = mr_grammar_parse(text, strlen(text), &g, &err);
    ck_assert_msg(rc == 0, "%s\n---\n%.300s", err.msg, text);
    return g;
}

static mr_gmatch *matcher(const mr_grammar *g)
{
    mr_gmatch *m;
    mr_err err;
    ck_assert_msg(mr_gmatch_new(g, &m, &err) == 0, "%s", err.msg);
    return m;
}

/* Whether the whole of s[0..n) is a sentence of g. */
static bool matches(const mr_grammar *g, const void *s, size_t n)
{
    mr_gmatch *m = matcher(g);
    bool ok = mr_gmatch_accept(m, s, n) && mr_gmatch_can_end(m);
    mr_gmatch_free(m);
    return ok;
}

static bool matches_str(const mr_grammar *g, const char *s)
{
    return matches(g, s, strlen(s));
}

/* A printable rendering of bytes for failure messages (two buffers in
 * turn: one message may show two things). */
static const char *show(const void *p, size_t n)
{
    static char bufs[2][2048];
    static int turn;
    char *out = bufs[turn ^= 1];
    const size_t cap = sizeof bufs[0];
    const unsigned char *s = p;
    size_t w = 0;
    if (!s)
        return "(null)";
    for (size_t i = 0; i < n && w + 8 < cap; i++) {
        if (s[i] >= 0x20 && s[i] < 0x7F && s[i] != '\\')
            out[w++] = (char)s[i];
        else
            w += (size_t)snprintf(out + w, cap - w, "\\x%02X", s[i]);
    }
    out[w] = 0;
    return out;
}

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(buf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void putc_(buf *b, char c)
{
    put(b, &c, 1);
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static unsigned below(uint64_t *s, unsigned n)
{
    return (unsigned)(rnd(s) % n);
}

/* UTF-8 of cp, surrogates included (their three-byte form is what a
 * grammar must refuse). */
static size_t enc(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80)
        return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800)
        return o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | (cp >> 6 & 63)),
               o[2] = (unsigned char)(0x80 | (cp & 63)), 3;
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* A vocabulary of the 256 single bytes: token i is byte i. */
static char byte_tok[256];
static const char *byte_pieces[256];
static size_t byte_lens[256];

static mr_gvocab *byte_vocab(void)
{
    for (int i = 0; i < 256; i++) {
        byte_tok[i] = (char)i;
        byte_pieces[i] = &byte_tok[i];
        byte_lens[i] = 1;
    }
    mr_gvocab *v;
    mr_err err;
    ck_assert_msg(mr_gvocab_new(256, byte_pieces, byte_lens, &v, &err) == 0, "%s", err.msg);
    return v;
}

static bool bit(const uint32_t *mask, int i)
{
    return mask[i / 32] >> (i % 32) & 1;
}

/* The mask of m over v, and that each bit is what trying the token says. */
static void check_mask(mr_gmatch *m, const mr_gvocab *v, const char *const *pieces, const size_t *lens,
                       uint32_t *mask, const char *where, size_t where_n)
{
    mr_err err;
    int n = mr_gvocab_size(v);
    CHECKM(mr_gmatch_mask(m, v, mask, &err) == 0, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        bool want = pieces[i] && lens[i] && mr_gmatch_allows(m, pieces[i], lens[i]);
        CHECKM(bit(mask, i) == want, "token %d (%s): mask %d, accept %d after %s", i,
               pieces[i] ? show(pieces[i], lens[i]) : "-", bit(mask, i), want, show(where, where_n));
    }
    for (int i = n; i % 32; i++)
        CHECKM(!bit(mask, i), "bit %d past the vocabulary is set", i);
}

/* ---- random JSON ---- */

static void gen_ws(uint64_t *s, buf *b)
{
    static const char ws[] = " \t\n\r";
    if (below(s, 3))
        return;
    for (unsigned n = 1 + below(s, 3); n; n--)
        putc_(b, ws[below(s, 4)]);
}

/* A code point that is not a surrogate, of an encoded length of k bytes. */
static uint32_t gen_cp(uint64_t *s, int k)
{
    for (;;) {
        uint32_t cp = k == 2   ? 0x80 + below(s, 0x780)
                      : k == 3 ? 0x800 + below(s, 0xF800)
                               : 0x10000 + below(s, 0x100000);
        if (cp < 0xD800 || cp > 0xDFFF)
            return cp;
    }
}

static void gen_char(uint64_t *s, buf *b)
{
    static const char *const esc[] = {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"};
    char tmp[16];
    unsigned char u[4];
    switch (below(s, 11)) {
    case 0:
        puts_(b, esc[below(s, 8)]);
        return;
    case 1: { /* \u of anything but a surrogate */
        uint32_t v;
        do
            v = below(s, 0x10000);
        while (v >= 0xD800 && v <= 0xDFFF);
        snprintf(tmp, sizeof tmp, below(s, 2) ? "\\u%04X" : "\\u%04x", v);
        puts_(b, tmp);
        return;
    }
    case 2: /* a surrogate pair */
        snprintf(tmp, sizeof tmp, "\\u%04X\\u%04x", 0xD800 + below(s, 0x400), 0xDC00 + below(s, 0x400));
        puts_(b, tmp);
        return;
    case 3:
    case 4:
    case 5:
        put(b, u, enc(gen_cp(s, 2 + (int)below(s, 3)), u));
        return;
    case 6:
        putc_(b, 0x7F);
        return;
    default: {
        char c;
        do
            c = (char)(0x20 + below(s, 0x5F));
        while (c == '"' || c == '\\');
        putc_(b, c);
    }
    }
}

static void gen_string(uint64_t *s, buf *b)
{
    putc_(b, '"');
    for (unsigned n = below(s, 10); n; n--)
        gen_char(s, b);
    putc_(b, '"');
}

/* Numbers that jansson can hold: at most 15 integer digits (json_int_t is
 * 64-bit; jansson refuses larger integers) and at most 2 exponent digits
 * (no double overflow, which jansson refuses too). */
static void gen_number(uint64_t *s, buf *b)
{
    if (below(s, 3) == 0)
        putc_(b, '-');
    if (below(s, 4) == 0)
        putc_(b, '0');
    else {
        putc_(b, (char)('1' + below(s, 9)));
        for (unsigned n = below(s, 15); n; n--)
            putc_(b, (char)('0' + below(s, 10)));
    }
    if (below(s, 3) == 0) {
        putc_(b, '.');
        for (unsigned n = 1 + below(s, 6); n; n--)
            putc_(b, (char)('0' + below(s, 10)));
    }
    if (below(s, 4) == 0) {
        putc_(b, below(s, 2) ? 'e' : 'E');
        unsigned sign = below(s, 3);
        if (sign)
            putc_(b, sign == 1 ? '+' : '-');
        for (unsigned n = 1 + below(s, 2); n; n--)
            putc_(b, (char)('0' + below(s, 10)));
    }
}

static void gen_value(uint64_t *s, buf *b, int depth)
{
    static const char *const lits[] = {"true", "false", "null"};
    unsigned k = below(s, depth >= 4 ? 5 : 7);
    if (k == 0)
        gen_string(s, b);
    else if (k == 1)
        gen_number(s, b);
    else if (k <= 4)
        puts_(b, lits[k - 2]);
    else {
        bool obj = k == 6;
        putc_(b, obj ? '{' : '[');
        gen_ws(s, b);
        for (unsigned i = 0, n = below(s, 4); i < n; i++) {
            if (i) {
                gen_ws(s, b);
                putc_(b, ',');
                gen_ws(s, b);
            }
            if (obj) {
                gen_string(s, b);
                gen_ws(s, b);
                putc_(b, ':');
                gen_ws(s, b);
            }
            gen_value(s, b, depth + 1);
        }
        gen_ws(s, b);
        putc_(b, obj ? '}' : ']');
    }
}

static void gen_doc(uint64_t *s, buf *b)
{
    b->n = 0;
    gen_ws(s, b);
    gen_value(s, b, 0);
    gen_ws(s, b);
}

/* A byte that is likely to matter somewhere in JSON, or any byte. */
static unsigned char gen_byte(uint64_t *s)
{
    static const char interesting[] = "{}[],:\"\\ \t\n0123456789-+.eEtrufalsn/bu";
    switch (below(s, 6)) {
    case 0:
        return (unsigned char)below(s, 0x20); /* control */
    case 1:
        return (unsigned char)(0x80 + below(s, 0x80)); /* continuation, lead or never UTF-8 */
    case 2:
        return (unsigned char)below(s, 256);
    default:
        return (unsigned char)interesting[below(s, sizeof interesting - 1)];
    }
}

/* One to three byte-level edits: delete, insert, swap, replace, duplicate
 * a slice, truncate. */
static void mutate(uint64_t *s, buf *b)
{
    for (unsigned k = 1 + below(s, 3); k; k--) {
        size_t n = b->n, at = n ? below(s, (unsigned)n) : 0;
        switch (below(s, 6)) {
        case 0:
            if (n) {
                memmove(b->p + at, b->p + at + 1, n - at - 1);
                b->n--;
            }
            break;
        case 1: {
            unsigned char c = gen_byte(s);
            putc_(b, 0);
            memmove(b->p + at + 1, b->p + at, n - at);
            b->p[at] = (char)c;
            break;
        }
        case 2:
            if (at + 1 < n) {
                char t = b->p[at];
                b->p[at] = b->p[at + 1];
                b->p[at + 1] = t;
            }
            break;
        case 3:
            if (n)
                b->p[at] = (char)gen_byte(s);
            break;
        case 4: {
            size_t len = n - at < 6 ? n - at : 1 + below(s, 6);
            char tmp[8];
            memcpy(tmp, b->p + at, len);
            put(b, tmp, len);
            break;
        }
        default:
            b->n = at;
            break;
        }
    }
}

/* 1 valid, 0 invalid, -1 when jansson stops at a number it cannot hold
 * (then it has not read the rest: no verdict on the syntax). */
static int jansson_says(const char *d, size_t n)
{
    json_error_t e;
    json_t *j = json_loadb(d, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (j) {
        json_decref(j);
        return 1;
    }
    return json_error_code(&e) == json_error_numeric_overflow ? -1 : 0;
}

/* The grammar's verdict, fed byte by byte, checked against feeding it all
 * at once (all or nothing). */
static bool grammar_says(const mr_grammar *g, const char *d, size_t n)
{
    mr_gmatch *m = matcher(g);
    size_t i = 0;
    while (i < n && mr_gmatch_accept(m, d + i, 1))
        i++;
    bool whole = i == n && mr_gmatch_can_end(m);
    mr_gmatch_free(m);
    m = matcher(g);
    bool once = mr_gmatch_accept(m, d, n);
    CHECKM(once == (i == n), "accept at once %d, byte by byte stopped at %zu of %zu: %s", once, i, n, show(d, n));
    CHECK(!once || mr_gmatch_can_end(m) == whole);
    if (!once)
        CHECK(!mr_gmatch_can_end(m)); /* still at the start, where JSON cannot end */
    mr_gmatch_free(m);
    return whole;
}

START_TEST(json_agrees_with_jansson)
{
    mr_grammar *g = parse_ok(json_gbnf);
    uint64_t seed = 0x5EED0001;
    buf doc = {0}, mut = {0};
    int valid = 0, mut_ok = 0, mut_bad = 0, skipped = 0;
    for (int d = 0; d < 2500; d++) {
        gen_doc(&seed, &doc);
        CHECKM(jansson_says(doc.p, doc.n) == 1, "generator wrote invalid JSON: %s", show(doc.p, doc.n));
        CHECKM(grammar_says(g, doc.p, doc.n), "grammar refuses %s", show(doc.p, doc.n));
        valid++;
        for (int k = 0; k < 3; k++) {
            mut.n = 0;
            put(&mut, doc.p, doc.n);
            mutate(&seed, &mut);
            int want = jansson_says(mut.p, mut.n);
            if (want < 0) {
                skipped++;
                continue;
            }
            bool got = grammar_says(g, mut.p, mut.n);
            CHECKM(got == (want == 1), "grammar %d, jansson %d: %s", got, want, show(mut.p, mut.n));
            if (got)
                mut_ok++;
            else
                mut_bad++;
        }
    }
    /* the edits must reach both verdicts often for this to mean anything */
    CHECKM(mut_ok > 700 && mut_bad > 3000 && skipped < 50, "%d valid, %d %d %d", valid, mut_ok, mut_bad, skipped);
    free(doc.p);
    free(mut.p);
    mr_grammar_free(g);
}
END_TEST

/* jansson's refusals that the generator steers around, pinned so that the
 * steering stays needed and right. */
START_TEST(json_known_divergences)
{
    mr_grammar *g = parse_ok(json_gbnf);
    ck_assert_int_eq(jansson_says("12345678901234567890", 20), -1); /* too big for json_int_t */
    ck_assert(matches_str(g, "12345678901234567890"));
    ck_assert_int_eq(jansson_says("1e999", 5), -1); /* double overflow */
    ck_assert(matches_str(g, "1e999"));
    /* lone surrogates: jansson refuses, and so does this grammar */
    ck_assert_int_eq(jansson_says("\"\\uD800\"", 8), 0);
    ck_assert(!matches_str(g, "\"\\uD800\""));
    ck_assert(!matches_str(g, "\"\\uDC00\""));
    ck_assert(!matches_str(g, "\"\\uD800\\u0041\""));
    ck_assert(matches_str(g, "\"\\uD83D\\uDE00\""));
    ck_assert_int_eq(jansson_says("\"\\u0000\"", 8), 1); /* with JSON_ALLOW_NUL */
    ck_assert(matches_str(g, "\"\\u0000\""));
    mr_grammar_free(g);
}
END_TEST

/* ---- incremental accept and all-or-nothing ---- */

static void byte_mask_of(mr_gmatch *m, const mr_gvocab *bv, uint32_t mask[8])
{
    mr_err err;
    ck_assert_msg(mr_gmatch_mask(m, bv, mask, &err) == 0, "%s", err.msg);
}

START_TEST(accept_is_incremental_and_all_or_nothing)
{
    mr_grammar *g = parse_ok(json_gbnf);
    mr_gvocab *bv = byte_vocab();
    uint64_t seed = 0x5EED0002;
    buf doc = {0};
    for (int d = 0; d < 300; d++) {
        gen_doc(&seed, &doc);
        mr_gmatch *m = matcher(g);
        for (size_t i = 0; i < doc.n; i++) {
            uint32_t before[8], after[8];
            byte_mask_of(m, bv, before);
            bool end = mr_gmatch_can_end(m);
            /* a byte the grammar refuses here, alone or behind an allowed one */
            int bad = -1;
            for (int b = (int)below(&seed, 256), k = 0; k < 256; k++, b = (b + 1) % 256)
                if (!bit(before, b)) {
                    bad = b;
                    break;
                }
            if (bad >= 0) {
                char one = (char)bad, two[2] = {doc.p[i], (char)bad};
                CHECK(!mr_gmatch_accept(m, &one, 1));
                bool pair_ok = mr_gmatch_allows(m, two, 2);
                if (!pair_ok)
                    CHECK(!mr_gmatch_accept(m, two, 2));
                byte_mask_of(m, bv, after);
                CHECKM(!memcmp(before, after, sizeof before), "state changed by a refused byte at %zu of %s", i,
                       show(doc.p, doc.n));
                CHECK(mr_gmatch_can_end(m) == end);
            }
            CHECKM(mr_gmatch_accept(m, doc.p + i, 1), "prefix refused at %zu of %s", i, show(doc.p, doc.n));
        }
        CHECK(mr_gmatch_can_end(m));
        CHECK(mr_gmatch_accept(m, "", 0));
        mr_gmatch_free(m);
    }
    free(doc.p);
    mr_gvocab_free(bv);
    mr_grammar_free(g);
}
END_TEST

/* ---- masks against brute force ---- */

START_TEST(mask_over_bytes_matches_brute_force)
{
    mr_grammar *g = parse_ok(json_gbnf);
    mr_gvocab *bv = byte_vocab();
    uint64_t seed = 0x5EED0003;
    buf doc = {0};
    uint32_t mask[8], again[8];
    for (int d = 0; d < 200; d++) {
        gen_doc(&seed, &doc);
        if (d % 2)
            mutate(&seed, &doc); /* also states reached along broken documents */
        mr_gmatch *m = matcher(g);
        for (size_t i = 0; i <= doc.n; i++) {
            check_mask(m, bv, byte_pieces, byte_lens, mask, doc.p, i);
            byte_mask_of(m, bv, again); /* from the cache */
            CHECK(!memcmp(mask, again, sizeof mask));
            if (i == doc.n || !mr_gmatch_accept(m, doc.p + i, 1))
                break;
        }
        mr_gmatch_free(m);
    }
    free(doc.p);
    mr_gvocab_free(bv);
    mr_grammar_free(g);
}
END_TEST

/* The mask cache, a matcher without one, one that starts afresh at every
 * call (memo budget 0) and a new matcher at each state agree. */
START_TEST(mask_cache_and_restarts_agree)
{
    mr_grammar *g = parse_ok(json_gbnf);
    mr_gvocab *bv = byte_vocab();
    uint64_t seed = 0x5EED0004;
    buf doc = {0};
    for (int d = 0; d < 40; d++) {
        gen_doc(&seed, &doc);
        mr_gmatch *cached = matcher(g), *nocache = matcher(g), *fresh = matcher(g);
        mr_gmatch_limits lim;
        mr_gmatch_get_limits(nocache, &lim);
        lim.mask_cache = 0;
        mr_gmatch_set_limits(nocache, &lim);
        lim.memo = 0;
        mr_gmatch_set_limits(fresh, &lim);
        for (size_t i = 0; i <= doc.n; i++) {
            uint32_t a[8], b[8], c[8], e[8];
            byte_mask_of(cached, bv, a);
            byte_mask_of(cached, bv, e);
            byte_mask_of(nocache, bv, b);
            byte_mask_of(fresh, bv, c);
            CHECK(!memcmp(a, b, sizeof a) && !memcmp(a, c, sizeof a) && !memcmp(a, e, sizeof a));
            mr_gmatch *cold = matcher(g);
            CHECK(mr_gmatch_accept(cold, doc.p, i));
            byte_mask_of(cold, bv, c);
            CHECK(!memcmp(a, c, sizeof a));
            CHECK(mr_gmatch_can_end(cold) == mr_gmatch_can_end(fresh));
            mr_gmatch_free(cold);
            if (i < doc.n) {
                CHECK(mr_gmatch_accept(cached, doc.p + i, 1));
                CHECK(mr_gmatch_accept(nocache, doc.p + i, 1));
                CHECK(mr_gmatch_accept(fresh, doc.p + i, 1));
            }
        }
        mr_gmatch_stats st;
        mr_gmatch_get_stats(cached, &st);
        CHECK(st.mask_hits >= doc.n); /* the second mask of each state */
        mr_gmatch_get_stats(nocache, &st);
        ck_assert_uint_eq(st.mask_hits, 0);
        mr_gmatch_get_stats(fresh, &st);
        CHECK(st.flushes >= doc.n);
        mr_gmatch_free(cached);
        mr_gmatch_free(nocache);
        mr_gmatch_free(fresh);
    }
    free(doc.p);
    mr_gvocab_free(bv);
    mr_grammar_free(g);
}
END_TEST

typedef struct real_vocab {
    mr_gvocab *v;
    const char **pieces;
    size_t *lens;
    int n;
    mr_tokenizer *tok;
} real_vocab;

/* The Qwen3 vocabulary as a server sees it: ordinary tokens' bytes (most
 * byte-level BPE tokens are pieces of UTF-8 characters), nothing for
 * control tokens. */
static void load_qwen(real_vocab *r)
{
    mr_err err;
    ck_assert_msg(mr_tok_load_file(fixture_path("vocab/qwen3-vocab.gguf"), &r->tok, &err) == 0, "%s", err.msg);
    r->n = (int)mr_tok_n_vocab(r->tok);
    r->pieces = calloc((size_t)r->n, sizeof *r->pieces);
    r->lens = calloc((size_t)r->n, sizeof *r->lens);
    ck_assert(r->pieces && r->lens);
    int control = 0;
    for (int i = 0; i < r->n; i++) {
        if (mr_tok_type(r->tok, i) == MR_TOKTYPE_CONTROL) {
            control++;
            continue;
        }
        r->pieces[i] = mr_tok_piece_view(r->tok, i, 0, &r->lens[i]);
    }
    ck_assert(r->n > 150000 && control > 0);
    ck_assert_msg(mr_gvocab_new(r->n, r->pieces, r->lens, &r->v, &err) == 0, "%s", err.msg);
}

static void free_qwen(real_vocab *r)
{
    mr_gvocab_free(r->v);
    free(r->pieces);
    free(r->lens);
    mr_tok_free(r->tok);
}

/* Masks at every step-th byte of doc against brute force, a second
 * (cached) mask, and now and then a new matcher's cold mask. */
static void qwen_states(const real_vocab *q, const mr_grammar *g, const char *doc, size_t n, size_t step,
                        uint32_t *const bufs[3])
{
    size_t words = ((size_t)q->n + 31) / 32;
    mr_gmatch *m = matcher(g);
    mr_err err;
    for (size_t i = 0; i <= n; i++) {
        if (i % step == 0 || i == n) {
            check_mask(m, q->v, q->pieces, q->lens, bufs[0], doc, i);
            CHECK(mr_gmatch_mask(m, q->v, bufs[1], &err) == 0);
            CHECK(!memcmp(bufs[0], bufs[1], words * 4));
            if (i % (4 * step) == 0) {
                mr_gmatch *c = matcher(g);
                CHECK(mr_gmatch_accept(c, doc, i));
                CHECK(mr_gmatch_mask(c, q->v, bufs[2], &err) == 0);
                CHECK(!memcmp(bufs[0], bufs[2], words * 4));
                mr_gmatch_free(c);
            }
        }
        if (i < n)
            CHECKM(mr_gmatch_accept(m, doc + i, 1), "%s at %zu", show(doc, n), i);
    }
    CHECK(mr_gmatch_can_end(m));
    mr_gmatch_free(m);
}

START_TEST(mask_over_qwen3_matches_brute_force)
{
    real_vocab q;
    load_qwen(&q);
    mr_grammar *g = parse_ok(json_gbnf);
    static const char *const docs[] = {
        "{\"name\": \"Zoë — 東京 🙂\", \"tags\": [\"a\\n\", \"\\u00e9\\uD83D\\uDE00\"], "
        "\"n\": -12.5e+3, \"ok\": true}",
        " [ 0 , 1.25 , null , false , { } , [ ] , \"x\" ] ",
        "{\"nested\": {\"deep\": [[{\"k\": \"v\"}]]}, \"empty\": \"\"}",
    };
    size_t words = ((size_t)q.n + 31) / 32;
    uint32_t *const bufs[3] = {malloc(words * 4), malloc(words * 4), malloc(words * 4)};
    ck_assert(bufs[0] && bufs[1] && bufs[2]);
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++)
        qwen_states(&q, g, docs[d], strlen(docs[d]), 3, bufs);
    uint64_t seed = 0x5EED0005;
    buf doc = {0};
    for (int d = 0; d < 6; d++) {
        do
            gen_doc(&seed, &doc);
        while (doc.n > 200);
        qwen_states(&q, g, doc.p, doc.n, 5, bufs);
    }
    free(doc.p);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
    mr_grammar_free(g);
    free_qwen(&q);
}
END_TEST

START_TEST(vocab_edge_cases)
{
    mr_grammar *g = parse_ok("root ::= \"ab\" | \"abc\" | \"x\"*");
    /* duplicates, empty and absent tokens, a vocabulary not a multiple of 32 */
    const char *pieces[37] = {"ab", "ab", "", NULL, "abc", "abcd", "a", "x", "xx", "b"};
    size_t lens[37] = {2, 2, 0, 0, 3, 4, 1, 1, 2, 1};
    for (int i = 10; i < 37; i++) {
        pieces[i] = "xxx";
        lens[i] = 3;
    }
    mr_gvocab *v;
    mr_err err;
    ck_assert(mr_gvocab_new(37, pieces, lens, &v, &err) == 0);
    ck_assert_int_eq(mr_gvocab_size(v), 37);
    mr_gmatch *m = matcher(g);
    uint32_t mask[2] = {~0u, ~0u};
    check_mask(m, v, pieces, lens, mask, "", 0);
    ck_assert(bit(mask, 0) && bit(mask, 1) && !bit(mask, 2) && !bit(mask, 3) && bit(mask, 4) && !bit(mask, 5));
    ck_assert(bit(mask, 6) && bit(mask, 7) && bit(mask, 36) && !bit(mask, 9));
    ck_assert(mr_gmatch_accept(m, "a", 1));
    check_mask(m, v, pieces, lens, mask, "a", 1);
    ck_assert(bit(mask, 9) && !bit(mask, 0) && !bit(mask, 7));
    mr_gmatch_free(m);

    mr_gvocab *empty;
    ck_assert(mr_gvocab_new(0, NULL, NULL, &empty, &err) == 0);
    m = matcher(g);
    ck_assert(mr_gmatch_mask(m, empty, mask, &err) == 0);
    mr_gmatch_free(m);
    mr_gvocab_free(empty);

    ck_assert(mr_gvocab_new(-1, pieces, lens, &empty, &err) == -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "-1 tokens"));
    ck_assert(mr_gvocab_new(3, NULL, lens, &empty, &err) == -1);
    char *big = calloc(MR_GVOCAB_MAX_TOKEN + 1, 1);
    const char *bp[1] = {big};
    size_t bl[1] = {MR_GVOCAB_MAX_TOKEN + 1};
    ck_assert(mr_gvocab_new(1, bp, bl, &empty, &err) == -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "bytes long"));
    free(big);
    mr_gvocab_free(v);
    mr_grammar_free(g);
}
END_TEST

/* ---- UTF-8 ---- */

typedef struct cpset {
    const uint32_t (*r)[2];
    size_t n;
    bool negate;
} cpset;

static bool in_set(const cpset *s, uint32_t cp)
{
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return false;
    bool in = false;
    for (size_t i = 0; i < s->n; i++)
        in |= cp >= s->r[i][0] && cp <= s->r[i][1];
    return in != s->negate;
}

/* Every code point (and every surrogate's three-byte form) against the
 * class's members. */
static void check_class(const char *text, const cpset *want)
{
    mr_grammar *g = parse_ok(text);
    mr_gmatch *m = matcher(g);
    unsigned char u[4];
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        size_t k = enc(cp, u);
        bool got = mr_gmatch_allows(m, u, k);
        CHECKM(got == in_set(want, cp), "%s: U+%04X: %d", text, cp, got);
        if (cp % 4099 == 0) { /* a whole sentence, not only a prefix of one */
            mr_gmatch *t = matcher(g);
            CHECK(mr_gmatch_accept(t, u, k) == got);
            CHECK(!got || (mr_gmatch_can_end(t) && !mr_gmatch_can_continue(t)));
            mr_gmatch_free(t);
        }
    }
    mr_gmatch_free(m);
    mr_grammar_free(g);
}

START_TEST(classes_match_their_code_points)
{
    static const uint32_t greek[][2] = {{'a', 'z'}, {0x3B1, 0x3C9}, {0x4E00, 0x9FFF}};
    static const uint32_t latin[][2] = {{'a', 'z'}, {0x100, 0x17F}};
    static const uint32_t edges[][2] = {{0x780, 0x810}, {0xFFF0, 0x10010}, {0xD7F0, 0xE010}, {0x10FFF0, 0x10FFFF}};
    static const uint32_t ascii[][2] = {{0, 0x7F}};
    static const uint32_t latin1[][2] = {{0x80, 0xFF}};
    static const uint32_t none[][2] = {{0, 0}};
    check_class("root ::= [a-z\\u03b1-\\u03c9\\u4e00-\\u9fff]", &(cpset){greek, 3, false});
    check_class("root ::= [a-zα-ω一-\\U00009FFF]", &(cpset){greek, 3, false});
    check_class("root ::= [^a-z\\u0100-\\u017F]", &(cpset){latin, 2, true});
    check_class("root ::= [\\u0780-\\u0810\\uFFF0-\\U00010010\\uD7F0-\\uE010\\U0010FFF0-\\U0010FFFF]",
                &(cpset){edges, 4, false});
    check_class("root ::= [^\\x00-\\x7f]", &(cpset){ascii, 1, true});
    check_class("root ::= [\\x80-\\xff]", &(cpset){latin1, 1, false}); /* code points, not bytes */
    check_class("root ::= .", &(cpset){none, 0, true});
    check_class("root ::= [^]", &(cpset){none, 0, true});
}
END_TEST

/* The prefixes of valid UTF-8 characters of 1, 2 and 3 bytes, from every
 * code point: the reference for which cut-off sequences have a completion. */
static uint8_t *pfx2, *pfx3;
static bool pfx1[256];

static void build_prefixes(void)
{
    pfx2 = calloc(1 << 16, 1);
    pfx3 = calloc(1 << 24, 1);
    ck_assert(pfx2 && pfx3);
    unsigned char u[4];
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF)
            continue;
        size_t k = enc(cp, u);
        pfx1[u[0]] = true;
        if (k >= 2)
            pfx2[u[0] << 8 | u[1]] = 1;
        if (k >= 3)
            pfx3[u[0] << 16 | u[1] << 8 | u[2]] = 1;
    }
}

/* Length of the valid character (all of it) at s[0..n), 0 if none. */
static size_t whole_char(const unsigned char *s, size_t n)
{
    size_t k = s[0] < 0x80 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
    if (k > n)
        return 0;
    if (k >= 2 && !pfx2[s[0] << 8 | s[1]])
        return 0;
    if (k >= 3 && !pfx3[s[0] << 16 | s[1] << 8 | s[2]])
        return 0;
    if (k == 4 && (s[3] & 0xC0) != 0x80)
        return 0;
    return pfx1[s[0]] ? k : 0;
}

/* Whether s[0..n) is whole characters and then the start of one. */
static bool utf8_text_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    for (size_t k; i < n && (k = whole_char(s + i, n - i)); i += k)
        ;
    size_t r = n - i;
    if (r == 0)
        return true;
    if (r == 1)
        return pfx1[s[i]];
    if (r == 2)
        return pfx2[s[i] << 8 | s[i + 1]];
    return r == 3 && pfx3[s[i] << 16 | s[i + 1] << 8 | s[i + 2]];
}

START_TEST(only_valid_utf8_and_its_prefixes)
{
    build_prefixes();
    mr_grammar *one = parse_ok("root ::= .");
    mr_grammar *many = parse_ok("root ::= .*");
    mr_gmatch *m1 = matcher(one), *mm = matcher(many);
    unsigned char s[3];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        CHECK(mr_gmatch_allows(m1, s, 1) == pfx1[a]);
        CHECK(mr_gmatch_allows(mm, s, 1) == pfx1[a]);
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            bool one_char = a < 0x80 ? false : pfx2[a << 8 | b];
            CHECKM(mr_gmatch_allows(m1, s, 2) == one_char, "%02X %02X", a, b);
            CHECKM(mr_gmatch_allows(mm, s, 2) == utf8_text_prefix(s, 2), "%02X %02X", a, b);
            if (a < 0xC0 && a >= 0x80)
                continue; /* never a start: every longer sequence too */
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                CHECKM(mr_gmatch_allows(mm, s, 3) == utf8_text_prefix(s, 3), "%02X %02X %02X", a, b, c);
            }
        }
    }
    /* tokens that end inside a character */
    mr_grammar *g = parse_ok("root ::= \"中\" [一-龥]+");
    mr_gmatch *m = matcher(g);
    CHECK(mr_gmatch_allows(m, "\xE4", 1) && mr_gmatch_allows(m, "\xE4\xB8", 2));
    CHECK(!mr_gmatch_allows(m, "\xE4\xB8\xAE", 3) && !mr_gmatch_allows(m, "\xE5", 1));
    CHECK(mr_gmatch_accept(m, "\xE4\xB8", 2) && !mr_gmatch_can_end(m));
    CHECK(mr_gmatch_accept(m, "\xAD\xE6", 2) && !mr_gmatch_can_end(m));
    CHECK(mr_gmatch_allows(m, "\x80", 1) && !mr_gmatch_allows(m, "\xC0", 1) && !mr_gmatch_allows(m, "a", 1));
    mr_gmatch_free(m);
    mr_gmatch_free(m1);
    mr_gmatch_free(mm);
    mr_grammar_free(g);
    mr_grammar_free(one);
    mr_grammar_free(many);
    free(pfx2);
    free(pfx3);
}
END_TEST

/* ---- notation ---- */

/* Which of "", "a", ..., "a"x9 the grammar matches, as a bit set. */
static unsigned a_counts(const char *text)
{
    mr_grammar *g = parse_ok(text);
    unsigned set = 0;
    char s[10];
    memset(s, 'a', sizeof s);
    for (unsigned n = 0; n < 10; n++)
        if (matches(g, s, n))
            set |= 1u << n;
    mr_grammar_free(g);
    return set;
}

START_TEST(repetitions)
{
    ck_assert_uint_eq(a_counts("root ::= \"a\"{3}"), 1u << 3);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{2,}"), 0x3FCu);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{2,4}"), 0x1Cu);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{0,2}"), 0x7u);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{0}"), 1u);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{0,0}"), 1u);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{1}"), 2u);
    ck_assert_uint_eq(a_counts("root ::= \"a\"{ 1 , 3 }"), 0xEu);
    ck_assert_uint_eq(a_counts("root ::= \"a\"*"), 0x3FFu);
    ck_assert_uint_eq(a_counts("root ::= \"a\"+"), 0x3FEu);
    ck_assert_uint_eq(a_counts("root ::= \"a\"?"), 0x3u);
    ck_assert_uint_eq(a_counts("root ::= \"aa\"{2}"), 1u << 4);
    ck_assert_uint_eq(a_counts("root ::= (\"a\" \"a\")+ \"a\""), 0x2A8u);
    ck_assert_uint_eq(a_counts("root ::= \"a\" * \"a\"?"), 0x3FFu); /* blanks before the operator */
    /* repeating something that may be empty is not left recursion */
    ck_assert_uint_eq(a_counts("root ::= (\"a\"?)*"), 0x3FFu);
    ck_assert_uint_eq(a_counts("root ::= (\"a\"*)*"), 0x3FFu);
    ck_assert_uint_eq(a_counts("root ::= (\"a\"?){2,3}"), 0xFu);
    ck_assert_uint_eq(a_counts("root ::= \"a\"*?"), 0x3FFu);
    ck_assert_uint_eq(a_counts("root ::= (\"\")*"), 1u);
    mr_grammar *g = parse_ok("root ::= (\"ab\" | \"c\"){2,3} \"!\"");
    ck_assert(matches_str(g, "abc!") && matches_str(g, "cab!") && matches_str(g, "ccc!") && matches_str(g, "abab!"));
    ck_assert(!matches_str(g, "c!") && !matches_str(g, "cabcab!") && !matches_str(g, "cccc!"));
    mr_grammar_free(g);
    g = parse_ok("root ::= [0-9]{10000}"); /* the limit itself is allowed */
    char digits[10001];
    memset(digits, '7', sizeof digits);
    ck_assert(matches(g, digits, 10000) && !matches(g, digits, 9999) && !matches(g, digits, 10001));
    mr_grammar_free(g);
}
END_TEST

START_TEST(notation)
{
    /* forward references, comments, the empty alternative, continuation lines */
    mr_grammar *g = parse_ok("# leading comment\n"
                             "root ::= greeting ( \" \" name | ) # trailing\n"
                             "  # a comment line in between\n"
                             "greeting ::= \"hi\" |\n"
                             "    \"hello\"\n"
                             "    | \"hey\"\n"
                             "name ::= (\n"
                             "   [A-Z] [a-z]*   # inside a group newlines are blanks\n"
                             "   | \"you\"\n"
                             ")\n");
    ck_assert(matches_str(g, "hi") && matches_str(g, "hello Ann") && matches_str(g, "hey you"));
    ck_assert(!matches_str(g, "hello ") && !matches_str(g, "yo") && !matches_str(g, "hi ann"));
    mr_grammar_free(g);

    g = parse_ok("root ::= \"a\" |\nx ::= \"b\"\n"); /* '|' then the next rule: the empty alternative */
    ck_assert(matches_str(g, "") && matches_str(g, "a") && !matches_str(g, "b"));
    mr_grammar_free(g);
    g = parse_ok("root ::=\n  \"a\"\n  | \"b\"\n");
    ck_assert(matches_str(g, "a") && matches_str(g, "b"));
    mr_grammar_free(g);
    g = parse_ok("root ::= ()");
    ck_assert(matches_str(g, "") && !matches_str(g, "a"));
    mr_grammar_free(g);
    g = parse_ok("root::=\"x\"\r\nother ::= root root\r\n");
    ck_assert(matches_str(g, "x"));
    mr_grammar_free(g);

    /* escapes in literals and classes */
    g = parse_ok("root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\r\\\\\\\"\\'\\[\\]\" [\\]\\[^a-] [-x]");
    ck_assert(matches_str(g, "A\xC3\xA9\xF0\x9F\x98\x80\n\t\r\\\"'[]]-"));
    ck_assert(matches_str(g, "A\xC3\xA9\xF0\x9F\x98\x80\n\t\r\\\"'[]^x"));
    ck_assert(matches_str(g, "A\xC3\xA9\xF0\x9F\x98\x80\n\t\r\\\"'[]a-"));
    ck_assert(!matches_str(g, "A\xC3\xA9\xF0\x9F\x98\x80\n\t\r\\\"'[]b-"));
    mr_grammar_free(g);

    /* an empty class matches nothing: the alternative with it is dropped */
    g = parse_ok("root ::= \"a\" | [] \"b\" | [^\\x00-\\U0010FFFF]");
    ck_assert(matches_str(g, "a") && !matches_str(g, "b"));
    mr_grammar_free(g);

    /* the layout of hand-written grammar files: bodies that start on the
     * next line, groups over several lines with comments inside, an empty
     * first alternative, ambiguous digits */
    g = parse_ok("root   ::= entry+\n"
                 "entry  ::=\n"
                 "  key ws \"=\" ws (\n"
                 "      number\n"
                 "    | text          # quoted\n"
                 "    | list\n"
                 "  ) ws \"\\n\"\n"
                 "\n"
                 "key    ::= [a-z] [a-z0-9_]*\n"
                 "list   ::=\n"
                 "  \"[\" ws (\n"
                 "        item\n"
                 "    ( \",\" ws item )*\n"
                 "  )? \"]\"\n"
                 "item   ::= number | text\n"
                 "text   ::=\n"
                 "  \"\\\"\" (\n"
                 "    [^\"\\\\\\x00-\\x1F] |\n"
                 "    \"\\\\\" [\"\\\\nt]\n"
                 "  )* \"\\\"\"\n"
                 "number ::= \"-\"? ([0-9] | [1-9] [0-9]{0,9})\n"
                 "\n"
                 "# optional blanks\n"
                 "ws     ::= | \" \" | \"\\t\" [ \\t]{0,8}\n");
    ck_assert(matches_str(g, "a = 1\nb_2=[1, \"x\\n\"]\n") && matches_str(g, "k\t = -42\n"));
    ck_assert(matches_str(g, "t = \"\"\nl = [ ]\n"));
    ck_assert(!matches_str(g, "a = 01\n") && !matches_str(g, "A = 1\n") && !matches_str(g, "a = [1,]\n"));
    mr_grammar_free(g);

    /* the header's example */
    g = parse_ok("root   ::= object              # rules: name ::= alternatives\n"
                 "object ::= \"{\" ws ( pair ( \",\" ws pair )* )? \"}\"\n"
                 "pair   ::= string \":\" ws value\n"
                 "value  ::= string | object\n"
                 "string ::= \"\\\"\" [^\"\\\\\\x00-\\x1f]* \"\\\"\"\n"
                 "ws     ::= [ \\t\\n]{0,20}\n");
    ck_assert(matches_str(g, "{\"a\": \"b\",  \"c\":{}}"));
    ck_assert(!matches_str(g, "{\"a\" : \"b\"}"));
    mr_grammar_free(g);
}
END_TEST

START_TEST(end_and_continue)
{
    mr_grammar *g = parse_ok("root ::= \"a\" \"b\"?");
    mr_gmatch *m = matcher(g);
    ck_assert(!mr_gmatch_can_end(m) && mr_gmatch_can_continue(m));
    ck_assert(mr_gmatch_accept(m, "a", 1));
    ck_assert(mr_gmatch_can_end(m) && mr_gmatch_can_continue(m));
    ck_assert(mr_gmatch_accept(m, "b", 1));
    ck_assert(mr_gmatch_can_end(m) && !mr_gmatch_can_continue(m));
    uint32_t mask[8];
    mr_gvocab *bv = byte_vocab();
    byte_mask_of(m, bv, mask);
    for (int i = 0; i < 8; i++)
        ck_assert_uint_eq(mask[i], 0);
    ck_assert(!mr_gmatch_accept(m, "b", 1));
    ck_assert(mr_gmatch_accept(m, NULL, 0));
    ck_assert(!mr_gmatch_accept(m, NULL, 1));
    mr_gmatch_free(m);
    mr_grammar_free(g);
    g = parse_ok("root ::= \"\"");
    m = matcher(g);
    ck_assert(mr_gmatch_can_end(m) && !mr_gmatch_can_continue(m));
    mr_gmatch_free(m);
    mr_grammar_free(g);
    mr_gvocab_free(bv);
}
END_TEST

/* ---- errors ---- */

static void parse_fails(const char *text, size_t len, const char *where, const char *what)
{
    mr_grammar *g = (mr_grammar *)1;
    mr_err err = {{0}};
    ck_assert_msg(mr_grammar_parse(text, len, &g, &err) == -1, "accepted: %s", show(text, len));
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err.msg, what), "'%s' lacks '%s'", err.msg, what);
    if (where)
        ck_assert_msg(strstr(err.msg, where), "'%s' lacks '%s'", err.msg, where);
}

static void fails(const char *text, const char *where, const char *what)
{
    parse_fails(text, strlen(text), where, what);
}

START_TEST(every_error)
{
    fails("root ::= \"\xFF\"", "line 1, column 11", "invalid UTF-8 (byte 0xFF)");
    fails("root ::= \"\xED\xA0\x80\"", "column 11", "invalid UTF-8"); /* an encoded surrogate */
    fails("::= \"a\"", "line 1, column 1", "expected a rule name, found ':'");
    fails("root ::= \"a\"\n\"b\"", "line 2, column 1", "expected a rule name");
    fails("root \"a\"", "line 1, column 6", "expected '::=' after the rule name 'root'");
    fails("root", "column 5", "found the end of the text");
    fails("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1", "rule 'root' is defined twice (first at line 1)");
    fails("root ::= \"a\" @", "line 1, column 14", "unexpected '@'");
    fails("root ::= \"é\" ×", "line 1, column 14", "unexpected '×'");
    fails("root ::= \"a\" )", "line 1, column 14", "unexpected ')'");
    fails("root ::= \"a\" \x01", "column 14", "unexpected character U+0001");
    fails("root ::= \"abc", "line 1, column 10", "unterminated literal");
    fails("root ::= [abc", "line 1, column 10", "unterminated class");
    fails("root ::= \"\\", "line 1, column 11", "'\\' at the end of the text");
    fails("root ::= \"\\q\"", "line 1, column 11", "unknown escape '\\' before 'q'");
    fails("root ::= [\\-]", "column 11", "unknown escape");
    fails("root ::= \"\\x4\"", "column 11", "'\\x' needs 2 hex digits");
    fails("root ::= \"\\u12G4\"", "column 11", "'\\u' needs 4 hex digits");
    fails("root ::= \"\\U0001F60\"", "column 11", "'\\U' needs 8 hex digits");
    fails("root ::= \"\\U00110000\"", "column 11", "U+110000 is beyond U+10FFFF");
    fails("root ::= \"\\uD800\"", "column 11", "U+D800 is a surrogate half");
    fails("root ::= [z-a]", "column 11", "range U+007A-U+0061 ends before it starts");
    fails("root ::= \"a\"{x}", "column 14", "expected a number in '{...}', found 'x'");
    fails("root ::= \"a\"{,3}", "column 14", "expected a number");
    fails("root ::= \"a\"{10001}", "column 14", "repetition count 10001 is above the limit 10000");
    fails("root ::= \"a\"{2,99999999999999999999999}", "column 16", "is above the limit");
    fails("root ::= \"a\"{1,2", "column 17", "expected '}' to close the repetition");
    fails("root ::= \"a\"{3,2}", "column 13", "repetition {3,2}: the most is less than the least");
    fails("root ::= (\"a\"", "line 1, column 14", "expected ')' to close the '(' of line 1, column 10");
    fails("root ::= (\"a\"\nx ::= \"b\")", "line 2, column 1", "expected ')'");
    fails("root ::= x\nx ::= y", "line 2, column 7", "undefined rule 'y'");
    fails("x ::= \"a\"", NULL, "no rule named 'root'");
    fails("root ::= root \"a\" | \"b\"", "line 1, column 1", "rule 'root' can reach itself without consuming any text");
    fails("root ::= x \"a\"\nx ::= y | \"c\"\ny ::= e root\ne ::= \"\" | \"d\"", NULL, "left recursion");
    fails("root ::= x\nx ::= \"a\"? x", "line 2, column 1", "rule 'x' can reach itself");
    fails("root ::= (root)*", NULL, "left recursion");
    fails("root ::= \"a\" root", "line 1, column 1", "rule 'root' matches no text");
    fails("root ::= []", NULL, "matches no text");
    parse_fails(NULL, 5, NULL, "no text");
}
END_TEST

START_TEST(limits)
{
    /* text */
    size_t n = MR_GRAMMAR_MAX_TEXT + 1;
    char *big = malloc(n);
    memset(big, ' ', n);
    memcpy(big, "root ::= \"a\"", 12);
    parse_fails(big, n, NULL, "more than the limit");
    mr_grammar *g;
    mr_err err;
    ck_assert(mr_grammar_parse(big, n - 1, &g, &err) == 0); /* the limit itself is allowed */
    mr_grammar_free(g);
    free(big);
    /* rules, repetitions expanded */
    fails("root ::= \"a\"{0,10000} \"b\"{0,10000} \"c\"{0,10000} \"d\"{0,10000} \"e\"{0,10000} \"f\"{0,10000} "
          "\"g\"{0,10000}",
          "line 1, column", "more than 65536 rules");
    /* nesting */
    buf t = {0};
    puts_(&t, "root ::= ");
    for (int i = 0; i < MR_GRAMMAR_MAX_NESTING; i++)
        putc_(&t, '(');
    putc_(&t, 'x');
    for (int i = 0; i < MR_GRAMMAR_MAX_NESTING; i++)
        putc_(&t, ')');
    puts_(&t, "\nx ::= \"x\"");
    g = parse_ok(t.p);
    ck_assert(matches_str(g, "x"));
    mr_grammar_free(g);
    t.n = 0;
    puts_(&t, "root ::= ");
    for (int i = 0; i <= MR_GRAMMAR_MAX_NESTING; i++)
        putc_(&t, '(');
    fails(t.p, NULL, "groups nested more than 128 deep");
    /* a long chain of rules: the checks must not recurse per rule */
    t.n = 0;
    puts_(&t, "root ::= r0\n");
    for (int i = 0; i < 40000; i++) {
        char line[64];
        snprintf(line, sizeof line, "r%d ::= r%d\n", i, i + 1);
        puts_(&t, line);
    }
    puts_(&t, "r40000 ::= \"z\"\n");
    g = parse_ok(t.p);
    ck_assert(matches_str(g, "z"));
    mr_grammar_free(g);
    free(t.p);
}
END_TEST

/* A grammar that keeps very many parses alive: a call that would take
 * more steps than allowed fails and leaves the matcher as it was. */
START_TEST(work_and_memory_bounds)
{
    mr_grammar *g = parse_ok("root ::= (\"a\"?){0,3000} \"b\"");
    mr_gmatch *m = matcher(g);
    mr_gmatch_limits lim, small;
    mr_gmatch_get_limits(m, &lim);
    small = lim;
    small.work = 500;
    mr_gmatch_set_limits(m, &small);
    ck_assert(!mr_gmatch_accept(m, "a", 1));
    ck_assert_ptr_nonnull(strstr(mr_gmatch_last_error(m), "too ambiguous"));
    mr_gvocab *bv = byte_vocab();
    uint32_t mask[8];
    mr_err err;
    ck_assert_int_eq(mr_gmatch_mask(m, bv, mask, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "too ambiguous"));
    mr_gmatch_set_limits(m, &lim);
    ck_assert(mr_gmatch_accept(m, "aaab", 4) && mr_gmatch_can_end(m));
    mr_gmatch_free(m);

    m = matcher(g);
    small = lim;
    small.memo = 0;
    small.memo_hard = 64 << 10;
    mr_gmatch_set_limits(m, &small);
    ck_assert(!mr_gmatch_accept(m, "a", 1));
    ck_assert_ptr_nonnull(strstr(mr_gmatch_last_error(m), "MiB"));
    mr_gmatch_set_limits(m, &lim);
    ck_assert(mr_gmatch_accept(m, "ab", 2));
    mr_gmatch_free(m);
    mr_gvocab_free(bv);
    mr_grammar_free(g);
}
END_TEST

static TCase *tcase(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return tc;
}

int main(void)
{
    Suite *s = suite_create("grammar");
    TCase *json = tcase(s, "json"), *mask = tcase(s, "mask"), *utf8 = tcase(s, "utf8"), *text = tcase(s, "notation");
    tcase_add_test(json, json_agrees_with_jansson);
    tcase_add_test(json, json_known_divergences);
    tcase_add_test(json, accept_is_incremental_and_all_or_nothing);
    tcase_add_test(mask, mask_over_bytes_matches_brute_force);
    tcase_add_test(mask, mask_cache_and_restarts_agree);
    tcase_add_test(mask, mask_over_qwen3_matches_brute_force);
    tcase_add_test(mask, vocab_edge_cases);
    tcase_add_test(utf8, classes_match_their_code_points);
    tcase_add_test(utf8, only_valid_utf8_and_its_prefixes);
    tcase_add_test(text, repetitions);
    tcase_add_test(text, notation);
    tcase_add_test(text, end_and_continue);
    tcase_add_test(text, every_error);
    tcase_add_test(text, limits);
    tcase_add_test(text, work_and_memory_bounds);
    return run_suite(s);
}

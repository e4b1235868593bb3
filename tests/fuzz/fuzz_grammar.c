/* libFuzzer target: grammar text through mr_grammar_parse, and when it
 * parses, a matcher driven by the rest of the input.  The input is the
 * grammar text up to its first NUL byte, then the bytes to feed.  Checks,
 * besides no crash or sanitizer report:
 *   - the mask over a small vocabulary (every single byte, plus pieces of
 *     the fed bytes and a few multi-byte UTF-8 fragments) says exactly what
 *     trying each token says, and a cached mask equals the first;
 *   - can_continue holds exactly when some single byte may follow;
 *   - accept agrees with allows, and a refused piece leaves the state as it
 *     was (same mask, same can_end);
 *   - only valid UTF-8 is ever accepted.
 * Sizes and the matcher's work per call are capped so that each input runs
 * in bounded time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "common/grammar_int.h"

#define MAX_TEXT 2048
#define MAX_FEED 96
#define N_BYTES 256
#define MAX_TOKENS (N_BYTES + 64)

typedef struct vocab {
    const char *pieces[MAX_TOKENS];
    size_t lens[MAX_TOKENS];
    char bytes[N_BYTES];
    int n;
    mr_gvocab *v;
} vocab;

static void add(vocab *vb, const char *p, size_t n)
{
    if (vb->n < MAX_TOKENS) {
        vb->pieces[vb->n] = p;
        vb->lens[vb->n++] = n;
    }
}

/* Every byte, fragments of characters, and pieces of what will be fed (so
 * that multi-byte tokens which do match are common). */
static int build_vocab(vocab *vb, const uint8_t *feed, size_t n)
{
    static const char *const frags[] = {"\xE4\xB8", "\xB8\xAD", "\xF0\x9F", "\x98\x80", "\xC3", "\xA9\"", "\"\xC3\xA9",
                                        "ab", "\": ", "{\"", "\xED\xA0\x80"};
    vb->n = 0;
    for (int i = 0; i < N_BYTES; i++) {
        vb->bytes[i] = (char)i;
        add(vb, &vb->bytes[i], 1);
    }
    for (size_t i = 0; i < sizeof frags / sizeof frags[0]; i++)
        add(vb, frags[i], strlen(frags[i]));
    add(vb, NULL, 0); /* a token with no bytes */
    for (size_t i = 0; i + 1 < n; i += 2)
        add(vb, (const char *)feed + i, n - i < 4 ? n - i : 2 + i % 3);
    mr_err err;
    return mr_gvocab_new(vb->n, vb->pieces, vb->lens, &vb->v, &err);
}

static bool utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], k, lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            k = 1;
        else if (c >= 0xE0 && c <= 0xEF)
            k = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            k = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else
            return false;
        if (i + k >= n || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (unsigned j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
        i += k + 1;
    }
    return true;
}

/* The mask, checked token by token; returns false when the matcher gave up
 * (its work bound), which is allowed. */
static bool check_mask(mr_gmatch *m, const vocab *vb, uint32_t *mask)
{
    mr_err err;
    if (mr_gmatch_mask(m, vb->v, mask, &err))
        return false;
    bool any_byte = false;
    for (int i = 0; i < vb->n; i++) {
        bool bit = mask[i / 32] >> (i % 32) & 1;
        bool want = vb->lens[i] && mr_gmatch_allows(m, vb->pieces[i], vb->lens[i]);
        if (bit != want && !(!want && *mr_gmatch_last_error(m))) /* a try may give up (bounds) */
            abort();
        if (i < N_BYTES)
            any_byte |= bit;
    }
    if (any_byte != mr_gmatch_can_continue(m))
        abort();
    uint32_t again[(MAX_TOKENS + 31) / 32];
    if (mr_gmatch_mask(m, vb->v, again, &err) == 0 && memcmp(mask, again, (size_t)(vb->n + 31) / 32 * 4))
        abort();
    return true;
}

static void drive(const mr_grammar *g, const uint8_t *feed, size_t n)
{
    vocab vb;
    if (build_vocab(&vb, feed, n))
        return;
    mr_gmatch_limits lim = {.work = 50000, .memo = 32u << 20, .memo_hard = 64u << 20, .mask_cache = 1u << 16};
    mr_gmatch *m;
    mr_err err;
    if (mr_gmatch_new_limited(g, &lim, &m, &err)) {
        mr_gvocab_free(vb.v);
        return;
    }
    uint8_t done[MAX_FEED];
    size_t n_done = 0;
    uint32_t mask[(MAX_TOKENS + 31) / 32], after[(MAX_TOKENS + 31) / 32];
    for (size_t at = 0; at < n;) {
        /* once the matcher gives up or forgets (its bounds), every try may
         * cost a whole call's work again: stop there */
        mr_gmatch_stats st;
        mr_gmatch_get_stats(m, &st);
        if (st.flushes || !check_mask(m, &vb, mask) || *mr_gmatch_last_error(m))
            break;
        size_t k = 1 + feed[at] % 3;
        if (k > n - at)
            k = n - at;
        bool end = mr_gmatch_can_end(m);
        bool allowed = mr_gmatch_allows(m, feed + at, k);
        bool took = mr_gmatch_accept(m, feed + at, k);
        if (allowed != took && !*mr_gmatch_last_error(m))
            abort();
        if (took) {
            memcpy(done + n_done, feed + at, k);
            n_done += k;
            at += k;
            continue;
        }
        if (mr_gmatch_can_end(m) != end)
            abort();
        if (mr_gmatch_mask(m, vb.v, after, &err) == 0 && memcmp(mask, after, (size_t)(vb.n + 31) / 32 * 4))
            abort();
        at++; /* skip a byte and go on from the same state */
    }
    /* what was accepted, completed by nothing, must be valid UTF-8 when the
     * grammar says it is a whole sentence */
    if (mr_gmatch_can_end(m) && !utf8_valid(done, n_done))
        abort();
    mr_gmatch_free(m);
    mr_gvocab_free(vb.v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t text_len = nul ? (size_t)(nul - data) : size;
    if (text_len > MAX_TEXT)
        return 0;
    const uint8_t *feed = nul ? nul + 1 : data + size;
    size_t feed_len = nul ? size - text_len - 1 : 0;
    if (feed_len > MAX_FEED)
        feed_len = MAX_FEED;
    mr_grammar *g;
    mr_err err;
    if (mr_grammar_parse((const char *)data, text_len, &g, &err)) {
        if (!strstr(err.msg, "grammar"))
            abort();
        return 0;
    }
    drive(g, feed, feed_len);
    mr_grammar_free(g);
    return 0;
}

/* UTF-8 helpers and the lowercase lookup; the class table is generated. */
#include "common/unicode.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Row of a generated table (rows of `width` words, sorted by the code point
 * in word 0) whose code point is cp; NULL when none. */
static const uint32_t *find_row(const uint32_t *tab, size_t n, size_t width, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tab[mid * width] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < n && tab[lo * width] == cp) ? tab + lo * width : NULL;
}

uint32_t mr_unicode_tolower(uint32_t cp)
{
    const uint32_t *r = find_row(mr_ucd_lower[0], mr_ucd_lower_n, 2, cp);
    return r ? r[1] : cp;
}

uint32_t mr_utf8_decode(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t c = s[0];
    size_t need;
    uint32_t cp;
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if ((c & 0xE0) == 0xC0) {
        need = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4;
        cp = c & 0x07;
    } else {
        *len = 1;
        return MR_UNICODE_REPLACEMENT;
    }
    if (n < need) {
        *len = 1;
        return MR_UNICODE_REPLACEMENT;
    }
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return MR_UNICODE_REPLACEMENT;
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = need;
    return cp;
}

size_t mr_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- NFC ---- */

unsigned mr_unicode_ccc(uint32_t cp)
{
    if (cp < 0x300)
        return 0;
    const uint32_t *r = find_row(mr_ucd_ccc[0], mr_ucd_ccc_n, 2, cp);
    return r ? r[1] : 0;
}

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
       L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT,
       S_COUNT = L_COUNT * N_COUNT };

typedef struct cpbuf {
    uint32_t *v;
    size_t n, cap;
    bool fixed; /* v is the caller's array: once it is full, the rest is dropped */
} cpbuf;

static int cp_push(cpbuf *b, uint32_t c)
{
    if (b->n == b->cap) {
        if (b->fixed)
            return 0;
        size_t cap = b->cap ? b->cap * 2 : 64;
        uint32_t *v = realloc(b->v, cap * sizeof *v);
        if (!v)
            return -1;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = c;
    return 0;
}

static int decompose(cpbuf *b, uint32_t cp, int depth)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE;
        if (cp_push(b, L_BASE + s / N_COUNT) || cp_push(b, V_BASE + (s % N_COUNT) / T_COUNT))
            return -1;
        if (s % T_COUNT && cp_push(b, T_BASE + s % T_COUNT))
            return -1;
        return 0;
    }
    const uint32_t *d = depth < 8 ? find_row(mr_ucd_decomp[0], mr_ucd_decomp_n, 3, cp) : NULL;
    if (!d)
        return cp_push(b, cp);
    if (decompose(b, d[1], depth + 1))
        return -1;
    return d[2] ? decompose(b, d[2], depth + 1) : 0;
}

size_t mr_unicode_decompose(uint32_t cp, uint32_t *out, size_t cap)
{
    if (cp < 0xC0 && cap > 0) { /* nothing below U+00C0 decomposes */
        out[0] = cp;
        return 1;
    }
    /* straight into out: no allocation per character (WordPiece calls this
     * for every character it encodes) */
    cpbuf b = {out, 0, cap, true};
    decompose(&b, cp, 0); /* cannot fail: nothing is allocated */
    return b.n;
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
        b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = mr_ucd_compose_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = mr_ucd_compose[mid];
        if (e[0] < a || (e[0] == a && e[1] < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < mr_ucd_compose_n && mr_ucd_compose[lo][0] == a && mr_ucd_compose[lo][1] == b)
        return mr_ucd_compose[lo][2];
    return 0;
}

typedef struct obuf {
    char *p;
    size_t n, cap;
} obuf;

static int out_put(obuf *o, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (o->cap - o->n < n) {
        size_t cap = o->cap ? o->cap : 64;
        while (cap - o->n < n)
            cap *= 2;
        char *q = realloc(o->p, cap);
        if (!q)
            return -1;
        o->p = q;
        o->cap = cap;
    }
    memcpy(o->p + o->n, p, n);
    o->n += n;
    return 0;
}

/* Full NFC of one segment (decompose, reorder, compose), appended to o. */
static int nfc_segment(const uint8_t *u, size_t n, cpbuf *d, obuf *o)
{
    d->n = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = mr_utf8_decode(u + i, n - i, &l);
        if (decompose(d, c, 0))
            return -1;
        i += l;
    }
    /* canonical ordering: stable sort of each run of non-starters */
    for (size_t i = 1; i < d->n; i++) {
        unsigned cc = mr_unicode_ccc(d->v[i]);
        if (cc == 0)
            continue;
        size_t j = i;
        uint32_t c = d->v[i];
        while (j > 0) {
            unsigned pc = mr_unicode_ccc(d->v[j - 1]);
            if (pc == 0 || pc <= cc)
                break;
            d->v[j] = d->v[j - 1];
            j--;
        }
        d->v[j] = c;
    }
    /* canonical composition */
    size_t w = 0;
    if (d->n > 0) {
        size_t starter = 0;
        unsigned last = mr_unicode_ccc(d->v[0]);
        bool have_starter = last == 0;
        if (last != 0)
            last = 256;
        w = 1;
        for (size_t i = 1; i < d->n; i++) {
            uint32_t c = d->v[i];
            unsigned cc = mr_unicode_ccc(c);
            if (have_starter && (last < cc || last == 0)) {
                uint32_t comp = compose_pair(d->v[starter], c);
                if (comp) {
                    d->v[starter] = comp;
                    continue;
                }
            }
            if (cc == 0) {
                starter = w;
                have_starter = true;
            }
            last = cc;
            d->v[w++] = c;
        }
    }
    for (size_t i = 0; i < w; i++) {
        char e[4];
        size_t l = mr_utf8_encode(d->v[i], e);
        if (out_put(o, e, l))
            return -1;
    }
    return 0;
}

/* NFC works on independent segments: a code point that NFC leaves alone
 * (quick check Yes, combining class 0) is a boundary that nothing composes
 * or reorders across, except that it may start a composition with what
 * follows.  So only the stretch from the last such code point before a
 * flagged one to the next such code point after it is normalized; the rest
 * is copied. */
int mr_utf8_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    for (; i < n; i++) {
        if (u[i] >= 0x80) {
            size_t l;
            uint32_t c = mr_utf8_decode(u + i, n - i, &l);
            if (mr_unicode_flags(c) & MR_UFLAG_NFC)
                break;
            i += l - 1;
        }
    }
    if (i == n)
        return 0;
    obuf o = {0};
    cpbuf d = {0};
    size_t pos = 0, safe = (size_t)-1;
    i = 0;
    while (i < n) {
        size_t l;
        uint32_t c = mr_utf8_decode(u + i, n - i, &l);
        if (!(mr_unicode_flags(c) & MR_UFLAG_NFC)) {
            safe = i;
            i += l;
            continue;
        }
        size_t seg = (safe != (size_t)-1 && safe >= pos) ? safe : pos;
        size_t end = i + l;
        while (end < n) {
            uint32_t c2 = mr_utf8_decode(u + end, n - end, &l);
            if (!(mr_unicode_flags(c2) & MR_UFLAG_NFC))
                break;
            end += l;
        }
        if (out_put(&o, u + pos, seg - pos) || nfc_segment(u + seg, end - seg, &d, &o))
            goto oom;
        pos = i = end;
        safe = (size_t)-1;
    }
    if (out_put(&o, u + pos, n - pos))
        goto oom;
    free(d.v);
    if (!o.p && !(o.p = malloc(1)))
        return -1;
    *out = o.p;
    *out_len = o.n;
    return 1;
oom:
    free(d.v);
    free(o.p);
    return -1;
}

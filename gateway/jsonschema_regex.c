/* The string side of JSON Schema -> GBNF (gateway/jsonschema.h): counted
 * repetitions that stay small after the engine expands them, and the
 * ECMAScript patterns of "pattern" compiled to the JSON string contents
 * they match.
 *
 * A pattern is read into a small tree (sets of code points, sequences,
 * alternatives, repetitions) so that its length range is known before
 * anything is written: minLength/maxLength beside a pattern are kept only
 * where that range shows them implied, or where they can be pushed into
 * the pattern's one repeated class.  Each set of code points is written as
 * the JSON text that stands for one of its members: the character itself
 * where JSON allows it raw, else its canonical escape. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/unicode.h"
#include "gateway/jsonschema.h"

/* ---- counted repetition ---- */

/* Counts up to this are written as one {m,n}: the engine makes about n
 * rules of it, which is cheap below this. */
#define REP_PLAIN 1000

static size_t isqrt_size(size_t n)
{
    size_t r = 1;
    while ((r + 1) * (r + 1) <= n)
        r++;
    return r;
}

static void rep_plain(mr_buf *out, const char *elem, size_t lo, size_t hi)
{
    if (hi == 0) {
        mr_buf_adds(out, "()");
    } else if (lo == 1 && hi == 1) {
        mr_buf_adds(out, elem);
    } else if (hi == MR_JSG_INF) {
        if (lo <= 1)
            mr_buf_printf(out, "%s%s", elem, lo ? "+" : "*");
        else
            mr_buf_printf(out, "%s{%zu,}", elem, lo);
    } else if (lo == 0 && hi == 1) {
        mr_buf_printf(out, "%s?", elem);
    } else if (lo == hi) {
        mr_buf_printf(out, "%s{%zu}", elem, lo);
    } else {
        mr_buf_printf(out, "%s{%zu,%zu}", elem, lo, hi);
    }
}

/* elem{k} as (elem{B}){k/B} elem{k%B}: about 2*sqrt(k) rules instead of k. */
static void rep_exact(mr_buf *out, const char *elem, size_t k)
{
    if (k <= REP_PLAIN) {
        rep_plain(out, elem, k, k);
        return;
    }
    size_t b = isqrt_size(k);
    mr_buf_printf(out, "( %s{%zu} ){%zu} ", elem, b, k / b);
    rep_plain(out, elem, k % b, k % b);
}

/* elem{0,n} with n = qB + r: either fewer than q whole blocks and then up
 * to B-1 more, or exactly q blocks and up to r more. */
static void rep_upto(mr_buf *out, const char *elem, size_t n)
{
    if (n == MR_JSG_INF || n <= REP_PLAIN) {
        rep_plain(out, elem, 0, n);
        return;
    }
    size_t b = isqrt_size(n), q = n / b, r = n % b;
    mr_buf_printf(out, "( ( %s{%zu} ){0,%zu} %s{0,%zu} | ( %s{%zu} ){%zu} ", elem, b, q - 1, elem, b - 1, elem, b, q);
    rep_plain(out, elem, 0, r);
    mr_buf_adds(out, " )");
}

void mr_jsg_repeat(mr_buf *out, const char *elem, size_t lo, size_t hi)
{
    if (hi != MR_JSG_INF && hi > MR_JSG_MAX_COUNT)
        hi = MR_JSG_MAX_COUNT; /* fewer items than allowed is still valid */
    if (lo > hi)
        lo = hi;
    if (lo <= REP_PLAIN && (hi == MR_JSG_INF || hi <= REP_PLAIN)) {
        rep_plain(out, elem, lo, hi);
        return;
    }
    mr_buf_adds(out, "( ");
    if (lo)
        rep_exact(out, elem, lo);
    if (hi != lo) {
        if (lo)
            mr_buf_adds(out, " ");
        rep_upto(out, elem, hi == MR_JSG_INF ? hi : hi - lo);
    }
    mr_buf_adds(out, " )");
}

/* ---- sets of code points ---- */

#define CP_MAX 0x10FFFFu

typedef struct cset {
    uint32_t (*r)[2]; /* sorted, disjoint, not adjacent; no surrogates */
    size_t n, cap;
} cset;

static void cset_free(cset *s)
{
    free(s->r);
    *s = (cset){0};
}

static void cset_push(cset *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->r = realloc(s->r, s->cap * sizeof *s->r);
        if (!s->r)
            abort(); /* as mr_buf: out of memory in the gateway */
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

static int range_cmp(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and joins overlapping or adjacent ranges. */
static void cset_norm(cset *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, s->n, sizeof *s->r, range_cmp);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[k][1] + 1) {
            if (s->r[i][1] > s->r[k][1])
                s->r[k][1] = s->r[i][1];
        } else {
            k++;
            s->r[k][0] = s->r[i][0];
            s->r[k][1] = s->r[i][1];
        }
    }
    s->n = k + 1;
}

/* Adds lo..hi less the surrogates, which no valid string holds. */
static void cset_add(cset *s, uint32_t lo, uint32_t hi)
{
    if (hi > CP_MAX)
        hi = CP_MAX;
    if (lo > hi)
        return;
    if (lo < 0xD800 && hi >= 0xD800) {
        cset_push(s, lo, 0xD7FF);
        lo = 0xE000;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
        lo = 0xE000;
    }
    if (hi >= 0xD800 && hi <= 0xDFFF)
        hi = 0xD7FF;
    if (lo <= hi)
        cset_push(s, lo, hi);
}

static void cset_add_set(cset *s, const cset *t)
{
    for (size_t i = 0; i < t->n; i++)
        cset_push(s, t->r[i][0], t->r[i][1]);
}

/* The code points (surrogates left out) not in s, s normalized. */
static void cset_complement(const cset *s, cset *out)
{
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next)
            cset_add(out, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= CP_MAX)
        cset_add(out, next, CP_MAX);
    cset_norm(out);
}

static bool cset_has(const cset *s, uint32_t c)
{
    for (size_t i = 0; i < s->n; i++)
        if (c >= s->r[i][0] && c <= s->r[i][1])
            return true;
    return false;
}

/* One code point inside a GBNF class. */
static void class_cp(mr_buf *out, uint32_t c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        mr_buf_printf(out, "%c", (char)c);
    else if (c < 0x80)
        mr_buf_printf(out, "\\x%02X", c);
    else if (c <= 0xFFFF)
        mr_buf_printf(out, "\\u%04X", c);
    else
        mr_buf_printf(out, "\\U%08X", c);
}

static void class_ranges(mr_buf *out, const cset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        class_cp(out, s->r[i][0]);
        if (s->r[i][1] != s->r[i][0]) {
            mr_buf_adds(out, "-");
            class_cp(out, s->r[i][1]);
        }
    }
}

/* The canonical escape of a character JSON does not allow raw. */
static void escape_literal(mr_buf *out, uint32_t c)
{
    static const char shortesc[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    if (c == '"')
        mr_buf_adds(out, "\"\\\\\\\"\"");
    else if (c == '\\')
        mr_buf_adds(out, "\"\\\\\\\\\"");
    else if (c < sizeof shortesc && shortesc[c])
        mr_buf_printf(out, "\"\\\\%c\"", shortesc[c]);
    else
        mr_buf_printf(out, "\"\\\\u%04x\"", c);
}

/* One element: the JSON string text of any one member of s (s normalized,
 * not empty). */
static void emit_set(mr_buf *out, const cset *s)
{
    cset raw = {0}, comp = {0};
    for (size_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0] < 0x20 ? 0x20 : s->r[i][0], hi = s->r[i][1];
        for (uint32_t c = lo; c <= hi && c < 0x5D; c++) /* cut '"' and '\' out */
            if (c == '"' || c == '\\') {
                cset_add(&raw, lo, c - 1);
                lo = c + 1;
            }
        cset_add(&raw, lo, hi);
    }
    cset_norm(&raw);
    cset_complement(&raw, &comp);
    mr_buf alts = {0};
    size_t n = 0;
    if (raw.n) {
        bool neg = comp.n < raw.n;
        mr_buf_adds(&alts, neg ? "[^" : "[");
        class_ranges(&alts, neg ? &comp : &raw);
        mr_buf_adds(&alts, "]");
        n++;
    }
    for (uint32_t c = 0; c < 0x5D; c++)
        if ((c < 0x20 || c == '"' || c == '\\') && cset_has(s, c)) {
            if (n++)
                mr_buf_adds(&alts, " | ");
            escape_literal(&alts, c);
        }
    if (n > 1)
        mr_buf_printf(out, "( %s )", alts.p);
    else
        mr_buf_adds(out, alts.p);
    mr_buf_free(&alts);
    cset_free(&raw);
    cset_free(&comp);
}

/* ---- patterns ---- */

#define RX_INF UINT32_MAX
#define RX_MAX_DEPTH 20 /* groups inside one another */
#define NIL SIZE_MAX

enum { RX_SET, RX_CAT, RX_ALT, RX_REP };

typedef struct rnode {
    int kind;
    uint32_t lo, hi; /* RX_REP: counts (hi RX_INF: no bound) */
    size_t set;      /* RX_SET: index into rx.sets */
    size_t kid;      /* RX_CAT, RX_ALT: first child; RX_REP: what repeats */
    size_t next;     /* next sibling */
    /* from analyze(): */
    bool empty;            /* matches no string */
    size_t minlen, maxlen; /* code points (maxlen MR_JSG_INF: no bound) */
} rnode;

typedef struct rx {
    const char *s;
    size_t pos, len;
    int depth;
    rnode *nodes;
    size_t n_nodes, cap_nodes;
    cset *sets;
    size_t n_sets, cap_sets;
    mr_err *err;
} rx;

static size_t rx_node(rx *p, int kind)
{
    if (p->n_nodes == p->cap_nodes) {
        p->cap_nodes = p->cap_nodes ? p->cap_nodes * 2 : 32;
        p->nodes = realloc(p->nodes, p->cap_nodes * sizeof *p->nodes);
        if (!p->nodes)
            abort();
    }
    p->nodes[p->n_nodes] = (rnode){.kind = kind, .kid = NIL, .next = NIL};
    return p->n_nodes++;
}

/* A new RX_SET node; its set is p->sets[p->nodes[i].set]. */
static size_t rx_set_node(rx *p)
{
    if (p->n_sets == p->cap_sets) {
        p->cap_sets = p->cap_sets ? p->cap_sets * 2 : 16;
        p->sets = realloc(p->sets, p->cap_sets * sizeof *p->sets);
        if (!p->sets)
            abort();
    }
    p->sets[p->n_sets] = (cset){0};
    size_t i = rx_node(p, RX_SET);
    p->nodes[i].set = p->n_sets++;
    return i;
}

static cset *node_set(rx *p, size_t i)
{
    return &p->sets[p->nodes[i].set];
}

static int rx_fail(rx *p, const char *what)
{
    return mr_errf(p->err, "pattern: %s at offset %zu", what, p->pos);
}

/* The code point at p->pos (the pattern is a JSON string: valid UTF-8;
 * anything else is refused). */
static int rx_next_cp(rx *p, uint32_t *c)
{
    const uint8_t *u = (const uint8_t *)p->s + p->pos;
    size_t n;
    *c = mr_utf8_decode(u, p->len - p->pos, &n);
    if (*c == MR_UNICODE_REPLACEMENT && n == 1 && u[0] >= 0x80)
        return rx_fail(p, "invalid UTF-8");
    p->pos += n;
    return 0;
}

static bool rx_at(const rx *p, char c)
{
    return p->pos < p->len && p->s[p->pos] == c;
}

/* n hex digits at p->pos. */
static int rx_hex(rx *p, int n, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        int h = p->pos < p->len ? mr_hex_digit(p->s[p->pos]) : -1;
        if (h < 0)
            return rx_fail(p, "bad hexadecimal escape");
        *v = *v * 16 + (uint32_t)h;
        p->pos++;
    }
    return 0;
}

/* \uHHHH, a surrogate pair of two of them, or \u{H...}, after the "u". */
static int rx_unicode_escape(rx *p, uint32_t *c)
{
    if (rx_at(p, '{')) {
        p->pos++;
        uint32_t v = 0;
        size_t start = p->pos;
        while (p->pos < p->len && mr_hex_digit(p->s[p->pos]) >= 0 && v <= CP_MAX)
            v = v * 16 + (uint32_t)mr_hex_digit(p->s[p->pos++]);
        if (p->pos == start || v > CP_MAX || !rx_at(p, '}'))
            return rx_fail(p, "bad \\u{...} escape");
        p->pos++;
        *c = v;
        return 0;
    }
    if (rx_hex(p, 4, c))
        return -1;
    if (*c >= 0xD800 && *c <= 0xDBFF && p->pos + 6 <= p->len && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u') {
        size_t save = p->pos;
        uint32_t lo;
        p->pos += 2;
        if (!rx_hex(p, 4, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
            *c = 0x10000 + ((*c - 0xD800) << 10) + (lo - 0xDC00);
            return 0;
        }
        p->pos = save;
    }
    return 0;
}

/* \d \w \s and their negations into s; false for another letter. */
static bool class_escape(char e, cset *s)
{
    cset t = {0};
    switch (e | 0x20) {
    case 'd':
        cset_add(&t, '0', '9');
        break;
    case 'w':
        cset_add(&t, '0', '9');
        cset_add(&t, 'A', 'Z');
        cset_add(&t, '_', '_');
        cset_add(&t, 'a', 'z');
        break;
    case 's': {
        static const uint32_t ws[][2] = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                         {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                         {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            cset_add(&t, ws[i][0], ws[i][1]);
        break;
    }
    default:
        return false;
    }
    cset_norm(&t);
    if (e >= 'A' && e <= 'Z') {
        cset c = {0};
        cset_complement(&t, &c);
        cset_add_set(s, &c);
        cset_free(&c);
    } else {
        cset_add_set(s, &t);
    }
    cset_free(&t);
    return true;
}

/* The escape after a backslash that stands for one code point (class:
 * inside [...], where \b is backspace and \- a hyphen). */
static int rx_char_escape(rx *p, bool class, uint32_t *c)
{
    if (p->pos >= p->len)
        return rx_fail(p, "pattern ends with a backslash");
    char e = p->s[p->pos++];
    static const char syntax[] = "^$\\.*+?()[]{}|/-", controls[] = "f\fn\nr\rt\tv\v";
    for (size_t i = 0; i < sizeof controls - 1; i += 2)
        if (e == controls[i]) {
            *c = (uint32_t)controls[i + 1];
            return 0;
        }
    if (e && strchr(syntax, e)) {
        *c = (uint32_t)(unsigned char)e;
        return 0;
    }
    switch (e) {
    case 'x':
        return rx_hex(p, 2, c);
    case 'u':
        return rx_unicode_escape(p, c);
    case 'c':
        if (p->pos < p->len && ((p->s[p->pos] | 0x20) >= 'a' && (p->s[p->pos] | 0x20) <= 'z')) {
            *c = (uint32_t)(p->s[p->pos++] % 32);
            return 0;
        }
        return rx_fail(p, "bad \\c escape");
    case '0':
        if (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
            return rx_fail(p, "octal escapes are not supported");
        *c = 0;
        return 0;
    case 'b':
        if (class) {
            *c = '\b';
            return 0;
        }
        return rx_fail(p, "\\b (word boundary) is not supported");
    default:
        break;
    }
    if (e >= '1' && e <= '9')
        return rx_fail(p, "backreferences are not supported");
    if (e == 'p' || e == 'P')
        return rx_fail(p, "\\p{...} (Unicode properties) is not supported");
    if (e == 'B' || e == 'k')
        return rx_fail(p, "\\B and \\k are not supported");
    return rx_fail(p, "invalid escape");
}

/* One member of a class: a code point (*c) or a class escape added to s
 * (*is_set). */
static int class_atom(rx *p, cset *s, uint32_t *c, bool *is_set)
{
    *is_set = false;
    if (rx_at(p, '\\') && p->pos + 1 < p->len && class_escape(p->s[p->pos + 1], s)) {
        p->pos += 2;
        *is_set = true;
        return 0;
    }
    if (rx_at(p, '\\')) {
        p->pos++;
        return rx_char_escape(p, true, c);
    }
    return rx_next_cp(p, c);
}

/* [...] after the "[". */
static int rx_class(rx *p, size_t *out)
{
    bool neg = rx_at(p, '^');
    if (neg)
        p->pos++;
    cset s = {0};
    int rc = -1;
    while (!rx_at(p, ']')) {
        if (p->pos >= p->len) {
            rx_fail(p, "unterminated [...]");
            goto out;
        }
        uint32_t lo, hi;
        bool lo_set, hi_set;
        if (class_atom(p, &s, &lo, &lo_set))
            goto out;
        if (!rx_at(p, '-') || p->pos + 1 >= p->len || p->s[p->pos + 1] == ']') {
            if (!lo_set)
                cset_add(&s, lo, lo);
            continue;
        }
        p->pos++; /* '-' */
        if (class_atom(p, &s, &hi, &hi_set))
            goto out;
        if (lo_set || hi_set) {
            rx_fail(p, "a class escape cannot bound a range");
            goto out;
        }
        if (lo > hi) {
            rx_fail(p, "range out of order in [...]");
            goto out;
        }
        cset_add(&s, lo, hi);
    }
    p->pos++; /* ']' */
    cset_norm(&s);
    *out = rx_set_node(p);
    if (neg)
        cset_complement(&s, node_set(p, *out));
    else
        cset_add_set(node_set(p, *out), &s);
    cset_norm(node_set(p, *out));
    rc = 0;
out:
    cset_free(&s);
    return rc;
}

static int rx_disj(rx *p, size_t *out);

/* ( ... ), (?: ... ), (?<name> ... ) after the "(". */
static int rx_group(rx *p, size_t *out)
{
    if (rx_at(p, '?')) {
        p->pos++;
        if (rx_at(p, ':')) {
            p->pos++;
        } else if (rx_at(p, '<') && p->pos + 1 < p->len && p->s[p->pos + 1] != '=' && p->s[p->pos + 1] != '!') {
            while (p->pos < p->len && p->s[p->pos] != '>')
                p->pos++;
            if (p->pos++ >= p->len)
                return rx_fail(p, "unterminated group name");
        } else {
            return rx_fail(p, "lookahead and lookbehind are not supported");
        }
    }
    if (++p->depth > RX_MAX_DEPTH)
        return rx_fail(p, "groups nested too deeply");
    if (rx_disj(p, out))
        return -1;
    p->depth--;
    if (!rx_at(p, ')'))
        return rx_fail(p, "missing )");
    p->pos++;
    return 0;
}

static int rx_atom(rx *p, size_t *out)
{
    uint32_t c;
    char ch = p->s[p->pos];
    if (ch == '(') {
        p->pos++;
        return rx_group(p, out);
    }
    if (ch == '[') {
        p->pos++;
        return rx_class(p, out);
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{')
        return rx_fail(p, "nothing to repeat");
    if (ch == ']' || ch == '}')
        return rx_fail(p, "lone bracket");
    *out = rx_set_node(p);
    cset *s = node_set(p, *out);
    if (ch == '.') {
        p->pos++;
        cset t = {0};
        cset_add(&t, '\n', '\n');
        cset_add(&t, '\r', '\r');
        cset_add(&t, 0x2028, 0x2029);
        cset_norm(&t);
        cset_complement(&t, s);
        cset_free(&t);
        return 0;
    }
    if (ch == '\\') {
        if (p->pos + 1 < p->len && class_escape(p->s[p->pos + 1], s)) {
            p->pos += 2;
            cset_norm(s);
            return 0;
        }
        p->pos++;
        if (rx_char_escape(p, false, &c))
            return -1;
    } else if (rx_next_cp(p, &c)) {
        return -1;
    }
    cset_add(s, c, c);
    return 0;
}

/* A decimal count of {m,n}; large ones are kept large (checked later). */
static int rx_count(rx *p, uint32_t *v)
{
    size_t start = p->pos;
    uint64_t x = 0;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->pos++] - '0');
        if (x > RX_INF - 1)
            x = RX_INF - 1;
    }
    if (p->pos == start)
        return rx_fail(p, "bad {m,n}");
    *v = (uint32_t)x;
    return 0;
}

/* A quantifier after an atom, if any: *, +, ?, {m}, {m,}, {m,n}, each
 * maybe followed by ? (lazy: the same strings). */
static int rx_quant(rx *p, size_t *node)
{
    uint32_t lo, hi;
    char ch = p->pos < p->len ? p->s[p->pos] : 0;
    if (ch == '*' || ch == '+' || ch == '?') {
        p->pos++;
        lo = ch == '+';
        hi = ch == '?' ? 1 : RX_INF;
    } else if (ch == '{') {
        p->pos++;
        if (rx_count(p, &lo))
            return -1;
        hi = lo;
        if (rx_at(p, ',')) {
            p->pos++;
            hi = RX_INF;
            if (!rx_at(p, '}') && rx_count(p, &hi))
                return -1;
        }
        if (!rx_at(p, '}'))
            return rx_fail(p, "bad {m,n}");
        p->pos++;
        if (hi < lo)
            return rx_fail(p, "{m,n} with n < m");
        if (lo > MR_JSG_MAX_COUNT)
            return rx_fail(p, "a count above 100000");
    } else {
        return 0;
    }
    if (rx_at(p, '?'))
        p->pos++;
    size_t r = rx_node(p, RX_REP);
    p->nodes[r].lo = lo;
    p->nodes[r].hi = hi;
    p->nodes[r].kid = *node;
    *node = r;
    if (p->pos < p->len && strchr("*+?{", p->s[p->pos]))
        return rx_fail(p, "nothing to repeat");
    return 0;
}

/* One alternative: a sequence of terms up to '|' or ')' or the end.  ^ and
 * $ only at the ends of a top-level one (*anch_start, *anch_end). */
static int rx_alt(rx *p, bool top, bool *anch_start, bool *anch_end, size_t *out)
{
    size_t cat = rx_node(p, RX_CAT), last = NIL;
    *anch_start = *anch_end = false;
    if (top && rx_at(p, '^')) {
        p->pos++;
        *anch_start = true;
    }
    while (p->pos < p->len && p->s[p->pos] != '|' && p->s[p->pos] != ')') {
        char ch = p->s[p->pos];
        if (ch == '$' && top && (p->pos + 1 == p->len || p->s[p->pos + 1] == '|')) {
            p->pos++;
            *anch_end = true;
            break;
        }
        if (ch == '^' || ch == '$')
            return rx_fail(p, "^ and $ are supported only at the ends of the pattern and its top-level alternatives");
        size_t t = NIL;
        if (rx_atom(p, &t) || rx_quant(p, &t))
            return -1;
        if (last == NIL)
            p->nodes[cat].kid = t;
        else
            p->nodes[last].next = t;
        last = t;
    }
    *out = cat;
    return 0;
}

/* Alternatives inside a group. */
static int rx_disj(rx *p, size_t *out)
{
    size_t alt = rx_node(p, RX_ALT), last = NIL;
    for (;;) {
        bool s, e;
        size_t a;
        if (rx_alt(p, false, &s, &e, &a))
            return -1;
        if (last == NIL)
            p->nodes[alt].kid = a;
        else
            p->nodes[last].next = a;
        last = a;
        if (!rx_at(p, '|'))
            break;
        p->pos++;
    }
    *out = alt;
    return 0;
}

static size_t sat_add(size_t a, size_t b)
{
    return a == MR_JSG_INF || b == MR_JSG_INF || a + b < a ? MR_JSG_INF : a + b;
}

static size_t sat_mul(size_t a, uint32_t k)
{
    if (k == RX_INF)
        return a ? MR_JSG_INF : 0;
    if (a == MR_JSG_INF)
        return k ? MR_JSG_INF : 0;
    return k && a > MR_JSG_INF / k ? MR_JSG_INF : a * k;
}

/* Fills empty, minlen and maxlen of node i and everything under it. */
static void analyze(rx *p, size_t i)
{
    rnode *n = &p->nodes[i];
    switch (n->kind) {
    case RX_SET:
        n->empty = node_set(p, i)->n == 0;
        n->minlen = n->maxlen = 1;
        return;
    case RX_CAT:
        n->empty = false;
        n->minlen = n->maxlen = 0;
        for (size_t k = n->kid; k != NIL; k = p->nodes[k].next) {
            analyze(p, k);
            n = &p->nodes[i];
            n->empty |= p->nodes[k].empty;
            n->minlen = sat_add(n->minlen, p->nodes[k].minlen);
            n->maxlen = sat_add(n->maxlen, p->nodes[k].maxlen);
        }
        return;
    case RX_ALT:
        n->empty = true;
        for (size_t k = n->kid; k != NIL; k = p->nodes[k].next) {
            analyze(p, k);
            n = &p->nodes[i];
            const rnode *c = &p->nodes[k];
            if (c->empty)
                continue;
            n->minlen = n->empty || c->minlen < n->minlen ? c->minlen : n->minlen;
            n->maxlen = n->empty || c->maxlen > n->maxlen ? c->maxlen : n->maxlen;
            n->empty = false;
        }
        return;
    default: {
        analyze(p, n->kid);
        n = &p->nodes[i];
        const rnode *c = &p->nodes[n->kid];
        if (c->empty) { /* only the empty string, if zero times is allowed */
            n->empty = n->lo > 0;
            n->minlen = n->maxlen = 0;
            return;
        }
        n->empty = false;
        n->minlen = sat_mul(c->minlen, n->lo);
        n->maxlen = sat_mul(c->maxlen, n->hi);
        return;
    }
    }
}

/* Writes node i (not empty) as one element. */
static void emit_node(rx *p, size_t i, mr_buf *out)
{
    const rnode *n = &p->nodes[i];
    if (n->kind == RX_SET) {
        emit_set(out, node_set(p, i));
        return;
    }
    if (n->kind == RX_REP) {
        if (p->nodes[n->kid].empty || n->hi == 0) {
            mr_buf_adds(out, "()");
            return;
        }
        mr_buf elem = {0};
        emit_node(p, n->kid, &elem);
        mr_jsg_repeat(out, elem.p, n->lo, n->hi == RX_INF ? MR_JSG_INF : n->hi);
        mr_buf_free(&elem);
        return;
    }
    bool alt = n->kind == RX_ALT;
    size_t count = 0;
    mr_buf body = {0};
    for (size_t k = n->kid; k != NIL; k = p->nodes[k].next) {
        if (alt && p->nodes[k].empty)
            continue;
        if (count++)
            mr_buf_adds(&body, alt ? " | " : " ");
        emit_node(p, k, &body);
    }
    if (count == 0)
        mr_buf_adds(out, "()");
    else if (count == 1)
        mr_buf_adds(out, body.p);
    else
        mr_buf_printf(out, "( %s )", body.p);
    mr_buf_free(&body);
}

/* Where [min_len, max_len] is not implied: a top-level sequence with one
 * repeated class takes the bounds into that class's count, the other
 * parts counted at their shortest for the lower bound and at their
 * longest for the upper one (so every string kept fits; some that would
 * fit may be lost).  1: done (*empty when no count fits), 0: not that
 * shape. */
static int push_lengths(rx *p, size_t cat, size_t min_len, size_t max_len, bool *empty)
{
    size_t var = NIL;
    for (size_t k = p->nodes[cat].kid; k != NIL; k = p->nodes[k].next) {
        const rnode *n = &p->nodes[k];
        bool cand = n->kind == RX_REP && p->nodes[n->kid].kind == RX_SET && n->lo != n->hi;
        if (cand && (var == NIL || (n->hi == RX_INF && p->nodes[var].hi != RX_INF)))
            var = k;
    }
    if (var == NIL) {
        const rnode *a = &p->nodes[cat];
        *empty = a->minlen > max_len || a->maxlen < min_len; /* no length fits */
        return *empty;
    }
    size_t omin = 0, omax = 0;
    for (size_t k = p->nodes[cat].kid; k != NIL; k = p->nodes[k].next)
        if (k != var) {
            omin = sat_add(omin, p->nodes[k].minlen);
            omax = sat_add(omax, p->nodes[k].maxlen);
        }
    if (omax == MR_JSG_INF || (max_len != MR_JSG_INF && max_len < omax))
        return 0;
    rnode *v = &p->nodes[var];
    uint64_t lo = v->lo, hi = v->hi == RX_INF ? UINT64_MAX : v->hi;
    if (min_len > omin && min_len - omin > lo)
        lo = min_len - omin;
    if (max_len != MR_JSG_INF && max_len - omax < hi)
        hi = max_len - omax;
    if (lo > hi) {
        *empty = true;
        return 1;
    }
    if (lo > MR_JSG_MAX_COUNT)
        return 0;
    v->lo = (uint32_t)lo;
    v->hi = hi >= RX_INF ? RX_INF : (uint32_t)hi;
    analyze(p, cat);
    return 1;
}

typedef struct top_alt {
    size_t node;
    bool anch_start, anch_end;
} top_alt;

/* The whole pattern: top-level alternatives with their anchors. */
static int rx_top(rx *p, top_alt **alts, size_t *n)
{
    size_t cap = 0;
    *alts = NULL;
    *n = 0;
    for (;;) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 4;
            *alts = realloc(*alts, cap * sizeof **alts);
            if (!*alts)
                abort();
        }
        top_alt *a = &(*alts)[*n];
        if (rx_alt(p, true, &a->anch_start, &a->anch_end, &a->node))
            return -1;
        analyze(p, a->node);
        (*n)++;
        if (rx_at(p, ')'))
            return rx_fail(p, "unmatched )");
        if (!rx_at(p, '|'))
            return 0;
        p->pos++;
    }
}

/* Length range of the strings the pattern matches (a search unless
 * anchored at both ends: anything may come before or after); false when
 * it matches none. */
static bool top_lengths(const rx *p, const top_alt *alts, size_t n, size_t *lo, size_t *hi)
{
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        const rnode *a = &p->nodes[alts[i].node];
        if (a->empty)
            continue;
        size_t amax = alts[i].anch_start && alts[i].anch_end ? a->maxlen : MR_JSG_INF;
        *lo = !any || a->minlen < *lo ? a->minlen : *lo;
        *hi = !any || amax > *hi ? amax : *hi;
        any = true;
    }
    return any;
}

static void emit_top(rx *p, const top_alt *alts, size_t n, mr_buf *out)
{
    mr_buf body = {0};
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (p->nodes[alts[i].node].empty)
            continue;
        if (count++)
            mr_buf_adds(&body, " | ");
        if (!alts[i].anch_start)
            mr_buf_adds(&body, "json-cchar* ");
        emit_node(p, alts[i].node, &body);
        if (!alts[i].anch_end)
            mr_buf_adds(&body, " json-cchar*");
    }
    if (count > 1 || memchr(body.p, ' ', body.len))
        mr_buf_printf(out, "( %s )", body.p);
    else
        mr_buf_adds(out, body.p);
    mr_buf_free(&body);
}

/* A search for x made a match of strings that start with x: x then any
 * characters unless anchored at the end.  They all contain x, so the
 * strings kept still match; the lengths can then go into the tail. */
static void anchor(rx *p, top_alt *a)
{
    a->anch_start = true;
    if (a->anch_end)
        return;
    a->anch_end = true;
    size_t any = rx_set_node(p), rep = rx_node(p, RX_REP), last = p->nodes[a->node].kid;
    cset none = {0};
    cset_complement(&none, node_set(p, any));
    p->nodes[rep].lo = 0;
    p->nodes[rep].hi = RX_INF;
    p->nodes[rep].kid = any;
    if (last == NIL) {
        p->nodes[a->node].kid = rep;
    } else {
        while (p->nodes[last].next != NIL)
            last = p->nodes[last].next;
        p->nodes[last].next = rep;
    }
    analyze(p, a->node);
}

int mr_jsg_pattern(mr_buf *out, const char *pattern, size_t min_len, size_t max_len, bool *empty, mr_err *err)
{
    rx p = {.s = pattern, .len = strlen(pattern), .err = err};
    top_alt *alts = NULL;
    size_t n = 0, lo = 0, hi = 0;
    int rc = -1;
    *empty = false;
    if (rx_top(&p, &alts, &n))
        goto out;
    if (!top_lengths(&p, alts, n, &lo, &hi)) {
        *empty = true;
        rc = 0;
        goto out;
    }
    if (lo < min_len || hi > max_len) {
        int pushed = 0;
        if (n == 1) {
            anchor(&p, &alts[0]);
            const rnode *a = &p.nodes[alts[0].node];
            pushed = a->minlen >= min_len && a->maxlen <= max_len
                         ? 1
                         : push_lengths(&p, alts[0].node, min_len, max_len, empty);
        }
        if (!pushed) {
            mr_errf(err, "pattern: minLength/maxLength beside this pattern are not supported (only where the pattern "
                         "implies them, or it has one alternative with a repeated class at its top level)");
            goto out;
        }
        if (*empty || p.nodes[alts[0].node].empty) {
            *empty = true;
            rc = 0;
            goto out;
        }
    }
    emit_top(&p, alts, n, out);
    rc = 0;
out:
    free(alts);
    free(p.nodes);
    for (size_t i = 0; i < p.n_sets; i++)
        cset_free(&p.sets[i]);
    free(p.sets);
    return rc;
}

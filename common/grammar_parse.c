/* GBNF text -> the compiled grammar of grammar_int.h.
 *
 * One pass reads the text into rules (groups, classes and repetitions
 * become helper rules as they are met), then the rules are checked as a
 * whole: every name defined, a root, no left recursion, and only the
 * alternatives that can derive some finite text are kept. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar_int.h"
#include "common/hash.h"
#include "common/unicode.h"

#define NONE UINT32_MAX
#define REP_INF UINT32_MAX

typedef struct u32v {
    uint32_t *v;
    size_t n, cap;
} u32v;

static int u32v_reserve(u32v *a, size_t need)
{
    if (need <= a->cap)
        return 0;
    size_t cap = a->cap ? a->cap : 16;
    while (cap < need)
        cap *= 2;
    uint32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v)
        return -1;
    a->v = v;
    a->cap = cap;
    return 0;
}

static int u32v_push(u32v *a, uint32_t x)
{
    if (a->n == a->cap && u32v_reserve(a, a->n + 1))
        return -1;
    a->v[a->n++] = x;
    return 0;
}

static void u32v_free(u32v *a)
{
    free(a->v);
    *a = (u32v){0};
}

/* A rule while parsing.  Named rules come from the text; helpers (name_len
 * 0) from groups, classes and repetitions. */
typedef struct prule {
    uint32_t name_off, name_len; /* into gp.names */
    uint32_t first, n;           /* its alternatives: gp.alts[first .. +n) */
    uint32_t where;              /* text offset: definition, else first use */
    uint8_t defined;
    uint8_t star; /* x* helper: its own tail call is not left recursion */
} prule;

typedef struct gp {
    const char *s;
    size_t len, pos;
    mr_err *err;
    u32v sym;  /* every alternative's symbols, each closed by GSYM_END */
    u32v alts; /* start of each alternative in sym, grouped by rule */
    prule *rules;
    size_t n_rules, cap_rules;
    char *names;
    size_t names_n, names_cap;
    uint32_t *ntab; /* named rules: open addressing, rule index + 1 */
    size_t ntab_cap;
    int depth;         /* groups open around the current position */
    uint32_t any_rule; /* the rule of `.`, made on first use */
} gp;

/* ---- errors ---- */

static void line_col(const gp *p, size_t off, unsigned *line, unsigned *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off && i < p->len; i++) {
        if (p->s[i] == '\n') {
            ++*line;
            *col = 1;
        } else if (((unsigned char)p->s[i] & 0xC0) != 0x80) {
            ++*col; /* columns count characters, not UTF-8 bytes */
        }
    }
}

static int perr(gp *p, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(gp *p, size_t off, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    line_col(p, off, &line, &col);
    return mr_errf(p->err, "grammar: line %u, column %u: %s", line, col, msg);
}

static int oom(gp *p)
{
    return perr(p, p->pos, "out of memory");
}

/* What is at off, for a message: 'c', a character's UTF-8, or its code. */
static const char *describe(const gp *p, size_t off, char *buf, size_t cap)
{
    if (off >= p->len)
        return "the end of the text";
    unsigned char c = (unsigned char)p->s[off];
    if (c == '\n')
        return "the end of the line";
    if (c >= 0x21 && c < 0x7F)
        snprintf(buf, cap, "'%c'", c);
    else if (c < 0x80)
        snprintf(buf, cap, "character U+%04X", c);
    else {
        size_t n = 1;
        while (off + n < p->len && n < 4 && ((unsigned char)p->s[off + n] & 0xC0) == 0x80)
            n++;
        snprintf(buf, cap, "'%.*s'", (int)n, p->s + off);
    }
    return buf;
}

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 character at s[0..n), 0 when invalid (overlong
 * forms, surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_valid_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF; /* bounds of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < k || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return k;
}

/* The whole text is checked first, so the parser may decode without care. */
static int check_utf8(gp *p)
{
    const unsigned char *s = (const unsigned char *)p->s;
    for (size_t i = 0; i < p->len;) {
        size_t k = utf8_valid_len(s + i, p->len - i);
        if (!k)
            return perr(p, i, "invalid UTF-8 (byte 0x%02X)", s[i]);
        i += k;
    }
    return 0;
}

/* ---- rules and names ---- */

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t name_len_at(const gp *p, size_t off)
{
    size_t n = 0;
    while (off + n < p->len && is_name_char(p->s[off + n]))
        n++;
    return n;
}

static int new_rule(gp *p, size_t where, uint32_t *out)
{
    if (p->n_rules >= MR_GRAMMAR_MAX_RULES)
        return perr(p, where, "more than %u rules (repetitions, groups and classes count too)",
                    (unsigned)MR_GRAMMAR_MAX_RULES);
    if (p->n_rules == p->cap_rules) {
        size_t cap = p->cap_rules ? p->cap_rules * 2 : 64;
        prule *r = realloc(p->rules, cap * sizeof *r);
        if (!r)
            return oom(p);
        p->rules = r;
        p->cap_rules = cap;
    }
    p->rules[p->n_rules] = (prule){.where = (uint32_t)where};
    *out = (uint32_t)p->n_rules++;
    return 0;
}

static bool name_eq(const gp *p, uint32_t r, const char *s, size_t n)
{
    return p->rules[r].name_len == n && !memcmp(p->names + p->rules[r].name_off, s, n);
}

/* Slot of name in ntab: where it is, or the empty slot it would go to. */
static size_t name_slot(const gp *p, const char *s, size_t n)
{
    size_t mask = p->ntab_cap - 1;
    size_t i = (uint32_t)mr_fnv1a(s, n) & mask;
    while (p->ntab[i] && !name_eq(p, p->ntab[i] - 1, s, n))
        i = (i + 1) & mask;
    return i;
}

static int ntab_grow(gp *p)
{
    size_t cap = p->ntab_cap ? p->ntab_cap * 2 : 64;
    uint32_t *old = p->ntab;
    size_t old_cap = p->ntab_cap;
    p->ntab = calloc(cap, sizeof *p->ntab);
    if (!p->ntab) {
        p->ntab = old;
        return -1;
    }
    p->ntab_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i])
            continue;
        const prule *r = &p->rules[old[i] - 1];
        p->ntab[name_slot(p, p->names + r->name_off, r->name_len)] = old[i];
    }
    free(old);
    return 0;
}

static int names_add(gp *p, const char *s, size_t n, uint32_t *off)
{
    if (p->names_n + n > p->names_cap) {
        size_t cap = p->names_cap ? p->names_cap : 256;
        while (cap < p->names_n + n)
            cap *= 2;
        char *v = realloc(p->names, cap);
        if (!v)
            return -1;
        p->names = v;
        p->names_cap = cap;
    }
    memcpy(p->names + p->names_n, s, n);
    *off = (uint32_t)p->names_n;
    p->names_n += n;
    return 0;
}

/* The rule named s[0..n), made (undefined yet) on first mention. */
static int named_rule(gp *p, const char *s, size_t n, size_t where, uint32_t *out)
{
    if ((p->n_rules + 1) * 2 > p->ntab_cap && ntab_grow(p))
        return oom(p);
    size_t slot = name_slot(p, s, n);
    if (p->ntab[slot]) {
        *out = p->ntab[slot] - 1;
        return 0;
    }
    uint32_t r, off;
    if (new_rule(p, where, &r))
        return -1;
    if (names_add(p, s, n, &off))
        return oom(p);
    p->rules[r].name_off = off;
    p->rules[r].name_len = (uint32_t)n;
    p->ntab[slot] = r + 1;
    *out = r;
    return 0;
}

static bool find_named(const gp *p, const char *name, uint32_t *out)
{
    if (!p->ntab_cap)
        return false;
    size_t slot = name_slot(p, name, strlen(name));
    if (!p->ntab[slot])
        return false;
    *out = p->ntab[slot] - 1;
    return true;
}

/* Appends syms[0..n) + END as a new alternative; its start goes to starts.
 * Symbols stay proportional to the text without a limit of their own: a
 * literal or a class item writes at most a few per byte of text, and each
 * helper rule (at most MR_GRAMMAR_MAX_RULES of them) at most a few dozen
 * more (a negated class's byte-range sequences). */
static int add_alt(gp *p, const uint32_t *syms, size_t n, u32v *starts)
{
    if (u32v_reserve(&p->sym, p->sym.n + n + 1) || u32v_push(starts, (uint32_t)p->sym.n))
        return oom(p);
    if (n)
        memcpy(p->sym.v + p->sym.n, syms, n * sizeof *syms);
    p->sym.n += n;
    p->sym.v[p->sym.n++] = GSYM_END;
    return 0;
}

/* Rule r's alternatives are the ones whose starts were gathered in starts
 * (kept apart while parsing, since nested groups add theirs meanwhile). */
static int set_alts(gp *p, uint32_t r, const u32v *starts)
{
    if (u32v_reserve(&p->alts, p->alts.n + starts->n))
        return oom(p);
    p->rules[r].first = (uint32_t)p->alts.n;
    p->rules[r].n = (uint32_t)starts->n;
    if (starts->n)
        memcpy(p->alts.v + p->alts.n, starts->v, starts->n * sizeof *starts->v);
    p->alts.n += starts->n;
    p->rules[r].defined = 1;
    return 0;
}

/* A helper rule `syms`, or `syms | (empty)` when or_empty. */
static int helper_rule(gp *p, size_t where, const uint32_t *syms, size_t n, bool or_empty, uint32_t *out)
{
    u32v starts = {0};
    int rc = new_rule(p, where, out);
    if (!rc)
        rc = add_alt(p, syms, n, &starts);
    if (!rc && or_empty)
        rc = add_alt(p, NULL, 0, &starts);
    if (!rc)
        rc = set_alts(p, *out, &starts);
    u32v_free(&starts);
    return rc;
}

/* ---- spaces and lookahead ---- */

/* Skips blanks and comments; newlines too when nl (inside a group, after
 * `::=` or `|`).  A comment runs to the end of its line. */
static void skip_space(gp *p, bool nl)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\r' || (c == '\n' && nl))
            p->pos++;
        else if (c == '#')
            while (p->pos < p->len && p->s[p->pos] != '\n')
                p->pos++;
        else
            break;
    }
}

/* Whether only blanks stand between off and the start of its line. */
static bool at_line_start(const gp *p, size_t off)
{
    while (off > 0 && (p->s[off - 1] == ' ' || p->s[off - 1] == '\t' || p->s[off - 1] == '\r'))
        off--;
    return off == 0 || p->s[off - 1] == '\n';
}

/* Whether a rule definition `name ::=` starts at off. */
static bool rule_starts_at(const gp *p, size_t off)
{
    size_t i = off + name_len_at(p, off);
    if (i == off)
        return false;
    while (i < p->len && (p->s[i] == ' ' || p->s[i] == '\t' || p->s[i] == '\r'))
        i++;
    return i + 3 <= p->len && !memcmp(p->s + i, "::=", 3);
}

/* ---- characters ---- */

static int parse_hex(gp *p, size_t at, int digits, uint32_t *cp)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int d = p->pos < p->len ? mr_hex_digit(p->s[p->pos]) : -1;
        if (d < 0)
            return perr(p, at, "'\\%c' needs %d hex digits", p->s[at + 1], digits);
        v = v * 16 + (uint32_t)d;
        p->pos++;
    }
    if (v > 0x10FFFF)
        return perr(p, at, "U+%X is beyond U+10FFFF, the last code point", v);
    *cp = v;
    return 0;
}

/* One character of a literal or class, escapes resolved. */
static int parse_char(gp *p, uint32_t *cp)
{
    size_t at = p->pos;
    if (p->s[at] != '\\') {
        size_t k;
        *cp = mr_utf8_decode((const uint8_t *)p->s + at, p->len - at, &k); /* checked valid already */
        p->pos += k;
        return 0;
    }
    if (at + 1 >= p->len)
        return perr(p, at, "'\\' at the end of the text");
    char e = p->s[at + 1];
    p->pos += 2;
    switch (e) {
    case 'n':
        *cp = '\n';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 't':
        *cp = '\t';
        return 0;
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
        *cp = (unsigned char)e;
        return 0;
    case 'x':
        return parse_hex(p, at, 2, cp);
    case 'u':
        return parse_hex(p, at, 4, cp);
    case 'U':
        return parse_hex(p, at, 8, cp);
    default: {
        char buf[32];
        return perr(p, at, "unknown escape '\\' before %s (known: \\n \\r \\t \\\\ \\\" \\' \\[ \\] \\x \\u \\U)",
                    describe(p, at + 1, buf, sizeof buf));
    }
    }
}

static bool is_surrogate(uint32_t cp)
{
    return cp >= 0xD800 && cp <= 0xDFFF;
}

/* ---- literals ---- */

static int parse_literal(gp *p, u32v *ev)
{
    size_t open = p->pos++;
    for (;;) {
        if (p->pos >= p->len)
            return perr(p, open, "unterminated literal (no closing '\"')");
        if (p->s[p->pos] == '"') {
            p->pos++;
            return 0;
        }
        size_t at = p->pos;
        uint32_t cp;
        if (parse_char(p, &cp))
            return -1;
        if (is_surrogate(cp))
            return perr(p, at, "U+%04X is a surrogate half, not a character", cp);
        char b[4];
        size_t k = mr_utf8_encode(cp, b);
        for (size_t i = 0; i < k; i++)
            if (u32v_push(ev, gsym_bytes((unsigned char)b[i], (unsigned char)b[i])))
                return oom(p);
    }
}

/* ---- classes ---- */

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

typedef struct rangev {
    cprange *v;
    size_t n, cap;
} rangev;

static int rangev_push(rangev *a, uint32_t lo, uint32_t hi)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        cprange *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (cprange){lo, hi};
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges in place (overlapping or adjacent ranges become one). */
static void ranges_normalise(rangev *r)
{
    if (!r->n)
        return;
    qsort(r->v, r->n, sizeof *r->v, cmp_range);
    size_t w = 0;
    for (size_t i = 1; i < r->n; i++) {
        if (r->v[i].lo <= r->v[w].hi + 1) {
            if (r->v[i].hi > r->v[w].hi)
                r->v[w].hi = r->v[i].hi;
        } else
            r->v[++w] = r->v[i];
    }
    r->n = w + 1;
}

/* The code points of [0, U+10FFFF] without surrogates that in (normalised)
 * holds, or does not hold when negate: what the class finally means. */
static int ranges_final(const rangev *in, bool negate, rangev *out)
{
    rangev tmp = {0};
    const rangev *src = in;
    if (negate) {
        uint32_t next = 0;
        for (size_t i = 0; i < in->n; i++) {
            if (in->v[i].lo > next && rangev_push(&tmp, next, in->v[i].lo - 1))
                goto fail;
            next = in->v[i].hi + 1;
        }
        if (next <= 0x10FFFF && rangev_push(&tmp, next, 0x10FFFF))
            goto fail;
        src = &tmp;
    }
    for (size_t i = 0; i < src->n; i++) {
        cprange r = src->v[i];
        /* surrogates have no UTF-8 form: cut them out */
        if (r.lo < 0xD800 && rangev_push(out, r.lo, r.hi < 0xD800 ? r.hi : 0xD7FF))
            goto fail;
        if (r.hi > 0xDFFF && rangev_push(out, r.lo > 0xDFFF ? r.lo : 0xE000, r.hi))
            goto fail;
    }
    free(tmp.v);
    return 0;
fail:
    free(tmp.v);
    return -1;
}

/* Adds the UTF-8 byte-range sequences of [lo, hi] (code points whose
 * encodings have the same length) as alternatives.  The range is cut until
 * each piece is a cross product of byte ranges: where lo and hi differ above
 * the last i continuation bytes, lo must start and hi end a full block of
 * those bytes. */
static int utf8_split(gp *p, uint32_t lo, uint32_t hi, size_t len, u32v *starts)
{
    for (size_t i = 1; i < len; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m))
            continue;
        if (lo & m)
            return utf8_split(p, lo, lo | m, len, starts) || utf8_split(p, (lo | m) + 1, hi, len, starts);
        if ((hi & m) != m)
            return utf8_split(p, lo, (hi & ~m) - 1, len, starts) || utf8_split(p, hi & ~m, hi, len, starts);
    }
    char a[4], b[4];
    mr_utf8_encode(lo, a);
    mr_utf8_encode(hi, b);
    uint32_t seq[4];
    for (size_t i = 0; i < len; i++)
        seq[i] = gsym_bytes((unsigned char)a[i], (unsigned char)b[i]);
    return add_alt(p, seq, len, starts);
}

static int add_cp_range(gp *p, uint32_t lo, uint32_t hi, u32v *starts)
{
    static const uint32_t last[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (size_t k = 0; k < 4; k++) {
        uint32_t first = k ? last[k - 1] + 1 : 0;
        if (lo > last[k] || hi < first)
            continue;
        if (utf8_split(p, lo > first ? lo : first, hi < last[k] ? hi : last[k], k + 1, starts))
            return -1;
    }
    return 0;
}

/* A rule matching the UTF-8 of exactly the code points of r. */
static int class_rule(gp *p, size_t where, const rangev *r, uint32_t *out)
{
    u32v starts = {0};
    int rc = new_rule(p, where, out);
    for (size_t i = 0; !rc && i < r->n; i++)
        rc = add_cp_range(p, r->v[i].lo, r->v[i].hi, &starts);
    if (!rc)
        rc = set_alts(p, *out, &starts);
    u32v_free(&starts);
    return rc;
}

static int parse_class_items(gp *p, size_t open, rangev *items)
{
    for (;;) {
        if (p->pos >= p->len)
            return perr(p, open, "unterminated class (no closing ']')");
        if (p->s[p->pos] == ']') {
            p->pos++;
            return 0;
        }
        size_t at = p->pos;
        uint32_t lo, hi;
        if (parse_char(p, &lo))
            return -1;
        hi = lo;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            if (parse_char(p, &hi))
                return -1;
            if (hi < lo)
                return perr(p, at, "range U+%04X-U+%04X ends before it starts", lo, hi);
        }
        if (rangev_push(items, lo, hi))
            return oom(p);
    }
}

static int parse_class(gp *p, u32v *ev)
{
    size_t open = p->pos++;
    bool negate = p->pos < p->len && p->s[p->pos] == '^';
    if (negate)
        p->pos++;
    rangev items = {0}, final = {0};
    uint32_t r;
    int rc = parse_class_items(p, open, &items);
    if (!rc) {
        ranges_normalise(&items);
        rc = ranges_final(&items, negate, &final) ? oom(p) : 0;
    }
    if (!rc)
        rc = class_rule(p, open, &final, &r);
    if (!rc && u32v_push(ev, gsym_ref(r)))
        rc = oom(p);
    free(items.v);
    free(final.v);
    return rc;
}

static int parse_any(gp *p, u32v *ev)
{
    if (p->any_rule == NONE) {
        rangev all = {0};
        int rc = rangev_push(&all, 0, 0xD7FF) || rangev_push(&all, 0xE000, 0x10FFFF) ? oom(p) : 0;
        if (!rc)
            rc = class_rule(p, p->pos, &all, &p->any_rule);
        free(all.v);
        if (rc)
            return -1;
    }
    p->pos++;
    return u32v_push(ev, gsym_ref(p->any_rule)) ? oom(p) : 0;
}

/* ---- repetition ---- */

/* Count of {m,n}: saturates above the limit so that any length of digits is
 * read without overflow. */
static int parse_count(gp *p, uint32_t *v)
{
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') {
        char buf[32];
        return perr(p, p->pos, "expected a number in '{...}', found %s", describe(p, p->pos, buf, sizeof buf));
    }
    size_t at = p->pos;
    uint32_t x = 0;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        x = x * 10 + (uint32_t)(p->s[p->pos++] - '0');
        if (x > MR_GRAMMAR_MAX_REPEAT)
            x = MR_GRAMMAR_MAX_REPEAT + 1;
    }
    if (x > MR_GRAMMAR_MAX_REPEAT)
        return perr(p, at, "repetition count %.*s is above the limit %u", (int)(p->pos - at > 20 ? 20 : p->pos - at),
                    p->s + at, (unsigned)MR_GRAMMAR_MAX_REPEAT);
    *v = x;
    return 0;
}

/* {m}, {m,} or {m,n}; p->pos is at '{'. */
static int parse_braces(gp *p, bool nested, uint32_t *lo, uint32_t *hi)
{
    size_t open = p->pos++;
    skip_space(p, nested);
    if (parse_count(p, lo))
        return -1;
    skip_space(p, nested);
    *hi = *lo;
    if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        skip_space(p, nested);
        *hi = REP_INF;
        if (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            if (parse_count(p, hi))
                return -1;
            skip_space(p, nested);
        }
    }
    if (p->pos >= p->len || p->s[p->pos] != '}') {
        char buf[32];
        return perr(p, p->pos, "expected '}' to close the repetition, found %s", describe(p, p->pos, buf, sizeof buf));
    }
    p->pos++;
    if (*hi < *lo)
        return perr(p, open, "repetition {%u,%u}: the most is less than the least", *lo, *hi);
    return 0;
}

/* The element ev as one symbol: itself, or a helper rule around it. */
static int as_one_symbol(gp *p, size_t at, const u32v *ev, uint32_t *x)
{
    if (ev->n == 1) {
        *x = ev->v[0];
        return 0;
    }
    uint32_t w;
    if (helper_rule(p, at, ev->v, ev->n, false, &w))
        return -1;
    *x = gsym_ref(w);
    return 0;
}

/* S ::= x S | (empty) */
static int star_rule(gp *p, size_t at, uint32_t x, uint32_t *out)
{
    if (new_rule(p, at, out))
        return -1;
    uint32_t body[2] = {x, gsym_ref(*out)};
    u32v starts = {0};
    int rc = add_alt(p, body, 2, &starts) || add_alt(p, NULL, 0, &starts) || set_alts(p, *out, &starts);
    u32v_free(&starts);
    p->rules[*out].star = 1;
    return rc ? -1 : 0;
}

/* R ::= x tail, or x tail | (empty) when optional; tail NONE: nothing. */
static int chain_rule(gp *p, size_t at, uint32_t x, uint32_t tail, bool optional, uint32_t *out)
{
    uint32_t body[2] = {x, tail == NONE ? 0 : gsym_ref(tail)};
    return helper_rule(p, at, body, tail == NONE ? 1 : 2, optional, out);
}

/* Replaces the element ev by `ev{lo,hi}` (hi REP_INF: no upper bound):
 *   x{lo,hi} = x R(lo-1),  R(k) ::= x R(k-1) down to R(0) = the optional part,
 *   optional part O(j) ::= x O(j-1) | (empty), O(0) = nothing, or for no
 *   upper bound S ::= x S | (empty).
 * Every recursion is a tail call, so the matcher's stacks do not grow with
 * the count, and the number of rules grows only linearly with it. */
static int repeat(gp *p, size_t at, uint32_t lo, uint32_t hi, u32v *ev)
{
    if (lo == 1 && hi == 1)
        return 0;
    if (hi == 0) {
        ev->n = 0; /* x{0}: the empty sequence */
        return 0;
    }
    uint32_t x, tail = NONE;
    if (as_one_symbol(p, at, ev, &x))
        return -1;
    if (hi == REP_INF && star_rule(p, at, x, &tail))
        return -1;
    for (uint32_t j = 1; hi != REP_INF && j <= hi - lo; j++)
        if (chain_rule(p, at, x, tail, true, &tail))
            return -1;
    for (uint32_t k = 1; k < lo; k++)
        if (chain_rule(p, at, x, tail, false, &tail))
            return -1;
    ev->n = 0;
    if (lo >= 1 && u32v_push(ev, x))
        return oom(p);
    if (tail != NONE && u32v_push(ev, gsym_ref(tail)))
        return oom(p);
    return 0;
}

static int parse_postfix(gp *p, bool nested, size_t at, u32v *ev)
{
    for (;;) {
        skip_space(p, nested);
        if (p->pos >= p->len)
            return 0;
        uint32_t lo, hi;
        switch (p->s[p->pos]) {
        case '*':
            lo = 0, hi = REP_INF, p->pos++;
            break;
        case '+':
            lo = 1, hi = REP_INF, p->pos++;
            break;
        case '?':
            lo = 0, hi = 1, p->pos++;
            break;
        case '{':
            if (parse_braces(p, nested, &lo, &hi))
                return -1;
            break;
        default:
            return 0;
        }
        if (repeat(p, at, lo, hi, ev))
            return -1;
    }
}

/* ---- sequences, alternatives, rules ---- */

static int parse_alts(gp *p, uint32_t rule, bool nested);

static int parse_group(gp *p, u32v *ev)
{
    size_t open = p->pos;
    if (p->depth >= MR_GRAMMAR_MAX_NESTING)
        return perr(p, open, "groups nested more than %d deep", MR_GRAMMAR_MAX_NESTING);
    uint32_t r;
    if (new_rule(p, open, &r))
        return -1;
    p->pos++;
    p->depth++;
    skip_space(p, true);
    int rc = parse_alts(p, r, true);
    p->depth--;
    if (rc)
        return -1;
    skip_space(p, true);
    if (p->pos >= p->len || p->s[p->pos] != ')') {
        char buf[32];
        unsigned line, col;
        line_col(p, open, &line, &col);
        return perr(p, p->pos, "expected ')' to close the '(' of line %u, column %u, found %s", line, col,
                    describe(p, p->pos, buf, sizeof buf));
    }
    p->pos++;
    return u32v_push(ev, gsym_ref(r)) ? oom(p) : 0;
}

static int parse_ref(gp *p, u32v *ev)
{
    size_t at = p->pos, n = name_len_at(p, at);
    uint32_t r;
    if (named_rule(p, p->s + at, n, at, &r))
        return -1;
    p->pos += n;
    return u32v_push(ev, gsym_ref(r)) ? oom(p) : 0;
}

static int parse_elem(gp *p, u32v *ev)
{
    char c = p->s[p->pos];
    if (c == '"')
        return parse_literal(p, ev);
    if (c == '[')
        return parse_class(p, ev);
    if (c == '.')
        return parse_any(p, ev);
    if (c == '(')
        return parse_group(p, ev);
    if (is_name_char(c))
        return parse_ref(p, ev);
    char buf[32];
    return perr(p, p->pos, "unexpected %s", describe(p, p->pos, buf, sizeof buf));
}

/* Elements up to the end of the alternative: '|', ')', the end of the line
 * outside groups, or the next rule's `name ::=` at the start of a line. */
static int parse_seq(gp *p, bool nested, u32v *out)
{
    u32v ev = {0};
    int rc = 0;
    for (;;) {
        skip_space(p, nested);
        if (p->pos >= p->len)
            break;
        char c = p->s[p->pos];
        if (c == '\n' || c == '|' || c == ')')
            break;
        if (is_name_char(c) && at_line_start(p, p->pos) && rule_starts_at(p, p->pos))
            break;
        size_t at = p->pos;
        ev.n = 0;
        if (parse_elem(p, &ev) || parse_postfix(p, nested, at, &ev)) {
            rc = -1;
            break;
        }
        if (u32v_reserve(out, out->n + ev.n)) {
            rc = oom(p);
            break;
        }
        if (ev.n)
            memcpy(out->v + out->n, ev.v, ev.n * sizeof *ev.v);
        out->n += ev.n;
    }
    u32v_free(&ev);
    return rc;
}

/* Alternatives `a | b | ...` of rule.  Outside groups an alternative ends at
 * the end of its line, but a line that starts with '|' continues the rule,
 * and a '|' at the end of a line may be followed by the next alternative on
 * the next line (or by nothing: the empty alternative). */
static int parse_alts(gp *p, uint32_t rule, bool nested)
{
    u32v starts = {0}, seq = {0};
    int rc = 0;
    for (;;) {
        seq.n = 0;
        if (parse_seq(p, nested, &seq) || add_alt(p, seq.v, seq.n, &starts)) {
            rc = -1;
            break;
        }
        size_t save = p->pos;
        skip_space(p, nested);
        if (!nested && (p->pos >= p->len || p->s[p->pos] != '|'))
            skip_space(p, true);
        if (p->pos < p->len && p->s[p->pos] == '|') {
            p->pos++;
            skip_space(p, true);
            continue;
        }
        if (!nested)
            p->pos = save;
        break;
    }
    if (!rc)
        rc = set_alts(p, rule, &starts);
    u32v_free(&starts);
    u32v_free(&seq);
    return rc;
}

static int parse_rule(gp *p)
{
    char buf[32];
    size_t at = p->pos, n = name_len_at(p, at);
    if (!n)
        return perr(p, at, "expected a rule name, found %s", describe(p, at, buf, sizeof buf));
    p->pos += n;
    skip_space(p, false);
    if (p->pos + 3 > p->len || memcmp(p->s + p->pos, "::=", 3))
        return perr(p, p->pos, "expected '::=' after the rule name '%.*s', found %s", (int)(n > 64 ? 64 : n),
                    p->s + at, describe(p, p->pos, buf, sizeof buf));
    p->pos += 3;
    uint32_t r;
    if (named_rule(p, p->s + at, n, at, &r))
        return -1;
    if (p->rules[r].defined) {
        unsigned line, col;
        line_col(p, p->rules[r].where, &line, &col);
        return perr(p, at, "rule '%.*s' is defined twice (first at line %u)", (int)(n > 64 ? 64 : n), p->s + at, line);
    }
    p->rules[r].where = (uint32_t)at;
    skip_space(p, true);
    if (parse_alts(p, r, false))
        return -1;
    skip_space(p, false);
    if (p->pos < p->len && p->s[p->pos] != '\n' && !(at_line_start(p, p->pos) && rule_starts_at(p, p->pos)))
        return perr(p, p->pos, "unexpected %s", describe(p, p->pos, buf, sizeof buf));
    return 0;
}

static int parse_rules(gp *p)
{
    for (;;) {
        skip_space(p, true);
        if (p->pos >= p->len)
            return 0;
        if (parse_rule(p))
            return -1;
    }
}

/* ---- checks over the whole grammar ---- */

static int rule_err(gp *p, uint32_t r, const char *what)
{
    const prule *q = &p->rules[r];
    if (q->name_len)
        return perr(p, q->where, "rule '%.*s' %s", (int)(q->name_len > 64 ? 64 : q->name_len), p->names + q->name_off,
                    what);
    return perr(p, q->where, "this part %s", what);
}

static int check_defined(gp *p)
{
    for (size_t r = 0; r < p->n_rules; r++)
        if (!p->rules[r].defined) {
            const prule *q = &p->rules[r];
            return perr(p, q->where, "undefined rule '%.*s'", (int)(q->name_len > 64 ? 64 : q->name_len),
                        p->names + q->name_off);
        }
    return 0;
}

/* Rule-level facts found by propagation: a rule has the property once one
 * of its alternatives has it, and an alternative once each of its symbols
 * has it (bytes: `bytes_ok`; a rule reference: that rule).  Each reference
 * is visited once, so this is linear in the size of the grammar. */
typedef struct gindex {
    uint32_t *owner;     /* alternative -> rule */
    uint32_t *occ_first; /* rule -> its references, occ[occ_first[r] .. occ_first[r + 1]) */
    uint32_t *occ;       /* alternatives, once per reference */
} gindex;

static int index_build(gp *p, gindex *ix)
{
    size_t nr = p->n_rules, na = p->alts.n;
    ix->owner = malloc((na ? na : 1) * sizeof *ix->owner);
    ix->occ_first = calloc(nr + 1, sizeof *ix->occ_first);
    if (!ix->owner || !ix->occ_first)
        return oom(p);
    size_t n_refs = 0;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t k = p->rules[r].first; k < p->rules[r].first + p->rules[r].n; k++) {
            ix->owner[k] = r;
            for (uint32_t i = p->alts.v[k]; p->sym.v[i] != GSYM_END; i++)
                if (gsym_kind(p->sym.v[i]) == GK_REF) {
                    ix->occ_first[gsym_rule(p->sym.v[i]) + 1]++;
                    n_refs++;
                }
        }
    for (size_t r = 0; r < nr; r++)
        ix->occ_first[r + 1] += ix->occ_first[r];
    ix->occ = malloc((n_refs ? n_refs : 1) * sizeof *ix->occ);
    uint32_t *fill = malloc((nr ? nr : 1) * sizeof *fill);
    if (!ix->occ || !fill) {
        free(fill);
        return oom(p);
    }
    memcpy(fill, ix->occ_first, nr * sizeof *fill);
    for (uint32_t k = 0; k < na; k++)
        for (uint32_t i = p->alts.v[k]; p->sym.v[i] != GSYM_END; i++)
            if (gsym_kind(p->sym.v[i]) == GK_REF)
                ix->occ[fill[gsym_rule(p->sym.v[i])]++] = k;
    free(fill);
    return 0;
}

static void index_free(gindex *ix)
{
    free(ix->owner);
    free(ix->occ_first);
    free(ix->occ);
}

static int propagate(gp *p, const gindex *ix, bool bytes_ok, uint8_t *has)
{
    size_t na = p->alts.n;
    uint32_t *pending = malloc((na ? na : 1) * sizeof *pending);
    uint32_t *queue = malloc((p->n_rules ? p->n_rules : 1) * sizeof *queue);
    if (!pending || !queue) {
        free(pending);
        free(queue);
        return oom(p);
    }
    size_t qn = 0;
    memset(has, 0, p->n_rules);
    for (uint32_t k = 0; k < na; k++) {
        pending[k] = 0;
        for (uint32_t i = p->alts.v[k]; p->sym.v[i] != GSYM_END; i++) {
            if (gsym_kind(p->sym.v[i]) == GK_REF)
                pending[k]++;
            else if (!bytes_ok) {
                pending[k] = UINT32_MAX; /* can never have it */
                break;
            }
        }
        if (pending[k] == 0 && !has[ix->owner[k]]) {
            has[ix->owner[k]] = 1;
            queue[qn++] = ix->owner[k];
        }
    }
    while (qn) {
        uint32_t r = queue[--qn];
        for (uint32_t j = ix->occ_first[r]; j < ix->occ_first[r + 1]; j++) {
            uint32_t k = ix->occ[j];
            if (pending[k] == UINT32_MAX || --pending[k])
                continue;
            if (!has[ix->owner[k]]) {
                has[ix->owner[k]] = 1;
                queue[qn++] = ix->owner[k];
            }
        }
    }
    free(pending);
    free(queue);
    return 0;
}

/* Edges r -> s where rule r may start with s without consuming a byte
 * first; the tail call of an x* helper to itself is left out (it returns
 * to the same place, so the matcher's stacks do not grow). */
typedef struct gedges {
    uint32_t *first; /* rule -> to[first[r] .. first[r + 1]) */
    uint32_t *to;
} gedges;

static size_t left_edges(const gp *p, const uint8_t *nullable, uint32_t r, uint32_t *to)
{
    size_t n = 0;
    const prule *q = &p->rules[r];
    for (uint32_t k = q->first; k < q->first + q->n; k++)
        for (uint32_t i = p->alts.v[k]; p->sym.v[i] != GSYM_END; i++) {
            uint32_t s = p->sym.v[i];
            if (gsym_kind(s) != GK_REF)
                break;
            uint32_t t = gsym_rule(s);
            if (!(q->star && t == r && p->sym.v[i + 1] == GSYM_END)) {
                if (to)
                    to[n] = t;
                n++;
            }
            if (!nullable[t])
                break;
        }
    return n;
}

static int edges_build(gp *p, const uint8_t *nullable, gedges *e)
{
    size_t nr = p->n_rules;
    e->first = malloc((nr + 1) * sizeof *e->first);
    if (!e->first)
        return oom(p);
    e->first[0] = 0;
    for (uint32_t r = 0; r < nr; r++)
        e->first[r + 1] = e->first[r] + (uint32_t)left_edges(p, nullable, r, NULL);
    e->to = malloc((e->first[nr] ? e->first[nr] : 1) * sizeof *e->to);
    if (!e->to)
        return oom(p);
    for (uint32_t r = 0; r < nr; r++)
        left_edges(p, nullable, r, e->to + e->first[r]);
    return 0;
}

/* A cycle was found: names a rule of it (helpers come from some named rule,
 * but say where they are when the cycle has none). */
static int report_cycle(gp *p, const uint32_t *stack, size_t top, uint32_t target)
{
    size_t from = top;
    while (from > 0 && stack[2 * from] != target)
        from--;
    for (size_t i = from; i <= top; i++)
        if (p->rules[stack[2 * i]].name_len)
            return rule_err(p, stack[2 * i], "can reach itself without consuming any text (left recursion)");
    return rule_err(p, target, "can reach itself without consuming any text (left recursion)");
}

/* Depth-first search for a cycle of left edges, with its own stack (a chain
 * of thousands of rules must not exhaust the thread's). */
static int check_left_recursion(gp *p, const uint8_t *nullable)
{
    gedges e = {0};
    size_t nr = p->n_rules;
    uint8_t *color = calloc(nr ? nr : 1, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *stack = malloc((nr ? nr : 1) * 2 * sizeof *stack); /* (rule, next edge) pairs */
    int rc = (!color || !stack) ? oom(p) : edges_build(p, nullable, &e);
    for (uint32_t s = 0; !rc && s < nr; s++) {
        if (color[s])
            continue;
        size_t top = 0;
        stack[0] = s;
        stack[1] = e.first[s];
        color[s] = 1;
        for (;;) {
            uint32_t r = stack[2 * top], i = stack[2 * top + 1];
            if (i == e.first[r + 1]) {
                color[r] = 2;
                if (top-- == 0)
                    break;
                continue;
            }
            stack[2 * top + 1]++;
            uint32_t t = e.to[i];
            if (color[t] == 1) {
                rc = report_cycle(p, stack, top, t);
                break;
            }
            if (color[t] == 0) {
                color[t] = 1;
                top++;
                stack[2 * top] = t;
                stack[2 * top + 1] = e.first[t];
            }
        }
    }
    free(color);
    free(stack);
    free(e.first);
    free(e.to);
    return rc;
}

/* ---- the compiled grammar ---- */

static bool alt_productive(const gp *p, const uint8_t *productive, uint32_t k)
{
    for (uint32_t i = p->alts.v[k]; p->sym.v[i] != GSYM_END; i++)
        if (gsym_kind(p->sym.v[i]) == GK_REF && !productive[gsym_rule(p->sym.v[i])])
            return false;
    return true;
}

static int build(gp *p, const uint8_t *productive, uint32_t root, mr_grammar **out)
{
    mr_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return oom(p);
    size_t nr = p->n_rules;
    g->alt = malloc((p->alts.n ? p->alts.n : 1) * sizeof *g->alt);
    g->rule_first = malloc(nr * sizeof *g->rule_first);
    g->rule_n = malloc(nr * sizeof *g->rule_n);
    if (!g->alt || !g->rule_first || !g->rule_n) {
        mr_grammar_free(g);
        return oom(p);
    }
    uint32_t n = 0;
    for (uint32_t r = 0; r < nr; r++) {
        g->rule_first[r] = n;
        for (uint32_t k = p->rules[r].first; k < p->rules[r].first + p->rules[r].n; k++)
            if (alt_productive(p, productive, k))
                g->alt[n++] = p->alts.v[k];
        g->rule_n[r] = n - g->rule_first[r];
    }
    g->n_alt = n;
    g->n_rules = (uint32_t)nr;
    g->root = root;
    g->sym = p->sym.v; /* handed over */
    g->n_sym = (uint32_t)p->sym.n;
    p->sym = (u32v){0};
    *out = g;
    return 0;
}

static int analyse_and_build(gp *p, mr_grammar **out)
{
    uint32_t root;
    if (check_defined(p))
        return -1;
    if (!find_named(p, "root", &root))
        return mr_errf(p->err, "grammar: no rule named 'root' (the text must start there)");
    gindex ix = {0};
    uint8_t *nullable = malloc(p->n_rules), *productive = malloc(p->n_rules);
    int rc = (!nullable || !productive) ? oom(p) : index_build(p, &ix);
    if (!rc)
        rc = propagate(p, &ix, false, nullable);
    if (!rc)
        rc = check_left_recursion(p, nullable);
    if (!rc)
        rc = propagate(p, &ix, true, productive);
    if (!rc && !productive[root])
        rc = rule_err(p, root, "matches no text: every way through it is endless or meets an empty class");
    if (!rc)
        rc = build(p, productive, root, out);
    index_free(&ix);
    free(nullable);
    free(productive);
    return rc;
}

int mr_grammar_parse(const char *text, size_t len, mr_grammar **out, mr_err *err)
{
    *out = NULL;
    if (!text && len)
        return mr_errf(err, "grammar: no text");
    if (len > MR_GRAMMAR_MAX_TEXT)
        return mr_errf(err, "grammar: %zu bytes of text, more than the limit %u", len, (unsigned)MR_GRAMMAR_MAX_TEXT);
    gp p = {.s = text, .len = len, .err = err, .any_rule = NONE};
    int rc = check_utf8(&p);
    if (!rc)
        rc = parse_rules(&p);
    if (!rc)
        rc = analyse_and_build(&p, out);
    u32v_free(&p.sym);
    u32v_free(&p.alts);
    free(p.rules);
    free(p.names);
    free(p.ntab);
    return rc;
}

void mr_grammar_free(mr_grammar *g)
{
    if (!g)
        return;
    free(g->sym);
    free(g->alt);
    free(g->rule_first);
    free(g->rule_n);
    free(g);
}

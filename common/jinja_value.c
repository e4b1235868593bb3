/* Jinja engine: arena, strings, runtime values and their text forms
 * (output text, JSON), as the reference renderer @huggingface/jinja prints
 * them. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"
#include "common/unicode.h"

/* ---------------- arena ---------------- */

struct jz_chunk {
    jz_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

#define JZ_CHUNK (64 * 1024)

void *jz_alloc(jz_ctx *c, size_t n)
{
    jz_arena *a = &c->arena;
    if (n > SIZE_MAX / 4)
        jz_fail(c, SIZE_MAX, "memory limit exceeded");
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    jz_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > JZ_CHUNK / 4 ? n : JZ_CHUNK;
        if (a->limit && (a->total + cap + sizeof(jz_chunk) > a->limit || cap > a->limit))
            jz_fail(c, SIZE_MAX, "memory limit of %zu bytes exceeded", a->limit);
        jz_chunk *nc = malloc(sizeof(jz_chunk) + cap);
        if (!nc)
            jz_fail(c, SIZE_MAX, "out of memory");
        a->total += sizeof(jz_chunk) + cap;
        nc->used = 0;
        nc->cap = cap;
        if (cap == n && h) {
            /* a big block: keep filling the current chunk after it */
            nc->next = h->next;
            h->next = nc;
            nc->used = n;
            return (char *)nc->data;
        }
        nc->next = h;
        a->head = nc;
        h = nc;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    return p;
}

void jz_arena_free(jz_arena *a)
{
    jz_chunk *h = a->head;
    while (h) {
        jz_chunk *n = h->next;
        free(h);
        h = n;
    }
    a->head = NULL;
    a->total = 0;
}

void jz_linecol(const char *src, size_t len, size_t pos, size_t *line, size_t *col)
{
    size_t l = 1, cl = 1;
    if (pos > len)
        pos = len;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') {
            l++;
            cl = 1;
        } else if (((unsigned char)src[i] & 0xc0) != 0x80) {
            cl++;
        }
    }
    *line = l;
    *col = cl;
}

void jz_fail(jz_ctx *c, size_t pos, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos != SIZE_MAX && c->src) {
        size_t line, col;
        jz_linecol(c->src, c->src_len, pos, &line, &col);
        mr_errf(c->err, "line %zu, col %zu: %s", line, col, msg);
    } else {
        mr_errf(c->err, "%s", msg);
    }
    longjmp(c->jb, 1);
}

/* ---------------- strings ---------------- */

jstr *jz_str(jz_ctx *c, const char *s, size_t n)
{
    jstr *r = jz_alloc(c, sizeof(jstr) + n + 1);
    r->len = n;
    if (n)
        memcpy(r->s, s, n);
    r->s[n] = '\0';
    return r;
}

jstr *jz_cstr(jz_ctx *c, const char *s) { return jz_str(c, s, strlen(s)); }

jval jv_str(jz_ctx *c, const char *s, size_t n) { return jv_strv(jz_str(c, s, n)); }

void jsb_init(jz_ctx *c, jsb *b, size_t max)
{
    (void)c;
    b->p = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void jsb_add(jz_ctx *c, jsb *b, const char *s, size_t n)
{
    if (n == 0)
        return;
    if (b->max && (n > b->max || b->len > b->max - n))
        jz_fail(c, SIZE_MAX, "output limit of %zu bytes exceeded", b->max);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = jz_alloc(c, cap);
        if (b->len)
            memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

jstr *jsb_str(jz_ctx *c, jsb *b) { return jz_str(c, b->p ? b->p : "", b->len); }

/* ---------------- UTF-8 ---------------- */

/* mr_utf8_decode, except that an invalid byte decodes as itself (one byte,
 * code point = the byte's value) rather than as U+FFFD, and n may be 0. */
size_t jz_utf8_dec(const char *s, size_t n, uint32_t *cp)
{
    if (n == 0) {
        *cp = 0;
        return 0;
    }
    size_t len;
    *cp = mr_utf8_decode((const uint8_t *)s, n, &len);
    if (len == 1 && *cp == MR_UNICODE_REPLACEMENT) /* a real U+FFFD is 3 bytes */
        *cp = (unsigned char)s[0];
    return len;
}

/* JavaScript's \s: WhiteSpace and LineTerminator code points. */
static bool js_space(uint32_t c)
{
    switch (c) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x20:
    case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f:
    case 0x205f: case 0x3000: case 0xfeff:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200a;
    }
}

size_t jz_ws_at(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    uint32_t cp;
    size_t l = jz_utf8_dec(s, n, &cp);
    if (l == 1 && (unsigned char)s[0] >= 0x80)
        return 0;
    return js_space(cp) ? l : 0;
}

size_t jz_ws_before(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    size_t start = n - 1;
    while (start > 0 && n - start < 4 && ((unsigned char)s[start] & 0xc0) == 0x80)
        start--;
    size_t l = jz_ws_at(s + start, n - start);
    return l == n - start ? l : 0;
}

size_t jz_utf16_len(const char *s, size_t n)
{
    size_t i = 0, units = 0;
    while (i < n) {
        uint32_t cp;
        i += jz_utf8_dec(s + i, n - i, &cp);
        units += cp >= 0x10000 ? 2 : 1;
    }
    return units;
}

/* ---------------- arrays and objects ---------------- */

jval jv_arr(jz_ctx *c, size_t cap)
{
    jval v = {.t = V_ARR};
    v.u.a = jz_alloc(c, sizeof(jarr));
    v.u.a->n = 0;
    v.u.a->cap = cap;
    v.u.a->v = cap ? jz_alloc(c, cap * sizeof(jval)) : NULL;
    return v;
}

void jarr_push(jz_ctx *c, jarr *a, jval v)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        jval *nv = jz_alloc(c, cap * sizeof(jval));
        if (a->n)
            memcpy(nv, a->v, a->n * sizeof(jval));
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = v;
}

jval jv_obj(jz_ctx *c, size_t cap)
{
    jval v = {.t = V_OBJ};
    v.u.o = jz_alloc(c, sizeof(jobj));
    v.u.o->n = 0;
    v.u.o->cap = cap;
    v.u.o->k = cap ? jz_alloc(c, cap * sizeof(jstr *)) : NULL;
    v.u.o->v = cap ? jz_alloc(c, cap * sizeof(jval)) : NULL;
    return v;
}

jval *jobj_get(const jobj *o, const char *k, size_t klen)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->k[i]->len == klen && memcmp(o->k[i]->s, k, klen) == 0)
            return &o->v[i];
    return NULL;
}

/* Like a JavaScript Map: a new key goes last, an existing key keeps its place. */
void jobj_set(jz_ctx *c, jobj *o, jstr *k, jval v)
{
    jval *slot = jobj_get(o, k->s, k->len);
    if (slot) {
        *slot = v;
        return;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 4;
        jstr **nk = jz_alloc(c, cap * sizeof(jstr *));
        jval *nv = jz_alloc(c, cap * sizeof(jval));
        if (o->n) {
            memcpy(nk, o->k, o->n * sizeof(jstr *));
            memcpy(nv, o->v, o->n * sizeof(jval));
        }
        o->k = nk;
        o->v = nv;
        o->cap = cap;
    }
    o->k[o->n] = k;
    o->v[o->n] = v;
    o->n++;
}

const char *jv_type_name(jval v)
{
    switch (v.t) {
    case V_UNDEF: return "UndefinedValue";
    case V_NULL: return "NullValue";
    case V_BOOL: return "BooleanValue";
    case V_INT: return "IntegerValue";
    case V_FLOAT: return "FloatValue";
    case V_STR: return "StringValue";
    case V_ARR: return "ArrayValue";
    case V_TUPLE: return "TupleValue";
    case V_OBJ: return "ObjectValue";
    case V_KWARGS: return "KeywordArgumentsValue";
    case V_NS: return "NamespaceValue";
    case V_FN: return "FunctionValue";
    }
    return "?";
}

/* Python-like truthiness as the reference defines it: empty containers are
 * false, a namespace or a function is true. */
bool jv_truthy(jval v)
{
    switch (v.t) {
    case V_UNDEF:
    case V_NULL: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0 && !isnan(v.u.f);
    case V_STR: return v.u.s->len > 0;
    case V_ARR:
    case V_TUPLE: return v.u.a->n > 0;
    case V_OBJ:
    case V_KWARGS: return v.u.o->n > 0;
    case V_NS:
    case V_FN: return true;
    }
    return false;
}

/* ---------------- numbers as JavaScript prints them ---------------- */

void jz_fmt_number(double d, char *buf, size_t cap)
{
    if (isnan(d)) {
        snprintf(buf, cap, "NaN");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, cap, d < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (d == 0) {
        snprintf(buf, cap, "0");
        return;
    }
    /* shortest digits that read back as d */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    if (prec > 17)
        prec = 17;
    /* tmp: [-]d[.ddd]e[+-]xx */
    bool neg = tmp[0] == '-';
    const char *p = tmp + neg;
    char digits[24];
    int k = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    digits[k] = '\0';
    int e10 = atoi(p + 1);
    int n = e10 + 1; /* d = 0.digits * 10^n */
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (k <= n && n <= 21) {
        memcpy(out + o, digits, (size_t)k);
        o += (size_t)k;
        for (int i = 0; i < n - k; i++)
            out[o++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(out + o, digits, (size_t)n);
        o += (size_t)n;
        out[o++] = '.';
        memcpy(out + o, digits + n, (size_t)(k - n));
        o += (size_t)(k - n);
    } else if (-6 < n && n <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -n; i++)
            out[o++] = '0';
        memcpy(out + o, digits, (size_t)k);
        o += (size_t)k;
    } else {
        out[o++] = digits[0];
        if (k > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, (size_t)(k - 1));
            o += (size_t)(k - 1);
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%d", n - 1 >= 0 ? '+' : '-',
                              abs(n - 1));
    }
    out[o] = '\0';
    snprintf(buf, cap, "%s", out);
}

static void add_int(jz_ctx *c, jsb *out, int64_t i)
{
    char b[32];
    int n = snprintf(b, sizeof b, "%lld", (long long)i);
    jsb_add(c, out, b, (size_t)n);
}

static void add_num(jz_ctx *c, jsb *out, double d)
{
    char b[64];
    jz_fmt_number(d, b, sizeof b);
    jsb_adds(c, out, b);
}

static void to_json_plain(jz_ctx *c, jval v, jsb *out, bool undef_null, int depth);

/* String(value) in JavaScript, where value is the reference's raw payload. */
void jv_raw_string(jz_ctx *c, jval v, jsb *out)
{
    switch (v.t) {
    case V_UNDEF: jsb_adds(c, out, "undefined"); break;
    case V_NULL: jsb_adds(c, out, "null"); break;
    case V_BOOL: jsb_adds(c, out, v.u.b ? "true" : "false"); break;
    case V_INT: add_int(c, out, v.u.i); break;
    case V_FLOAT: add_num(c, out, v.u.f); break;
    case V_STR: jsb_add(c, out, v.u.s->s, v.u.s->len); break;
    case V_ARR:
    case V_TUPLE:
        /* a JS array of runtime values joins their toString() with "," */
        for (size_t i = 0; i < v.u.a->n; i++) {
            if (i)
                jsb_add(c, out, ",", 1);
            jv_to_string(c, v.u.a->v[i], out);
        }
        break;
    case V_OBJ:
    case V_KWARGS:
    case V_NS: jsb_adds(c, out, "[object Map]"); break;
    case V_FN: jsb_adds(c, out, "[function]"); break;
    }
}

void jv_to_string(jz_ctx *c, jval v, jsb *out)
{
    switch (v.t) {
    case V_FLOAT:
        if (v.u.f == 0 && signbit(v.u.f)) {
            jsb_adds(c, out, "-0.0");
        } else if (isfinite(v.u.f) && v.u.f == floor(v.u.f) && fabs(v.u.f) < 1e21) {
            /* toFixed(1) */
            char b[64];
            snprintf(b, sizeof b, "%.1f", v.u.f);
            jsb_adds(c, out, b);
        } else {
            add_num(c, out, v.u.f);
        }
        break;
    case V_ARR:
    case V_TUPLE:
    case V_OBJ:
    case V_KWARGS:
    case V_NS: to_json_plain(c, v, out, false, 0); break;
    default: jv_raw_string(c, v, out); break;
    }
}

/* ---------------- JSON ---------------- */

static void json_str_out(jz_ctx *c, const char *s, size_t n, bool ascii, jsb *out)
{
    static const char hex[] = "0123456789abcdef";
    jsb_add(c, out, "\"", 1);
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n) {
            unsigned char u = (unsigned char)s[run];
            if (u < 0x20 || u == '"' || u == '\\' || (ascii && u >= 0x7f))
                break;
            run++;
        }
        jsb_add(c, out, s + i, run - i);
        i = run;
        if (i >= n)
            break;
        unsigned char u = (unsigned char)s[i];
        char e[16];
        if (u == '"' || u == '\\') {
            e[0] = '\\';
            e[1] = (char)u;
            jsb_add(c, out, e, 2);
            i++;
        } else if (u < 0x20) {
            const char *m = NULL;
            switch (u) {
            case '\b': m = "\\b"; break;
            case '\f': m = "\\f"; break;
            case '\n': m = "\\n"; break;
            case '\r': m = "\\r"; break;
            case '\t': m = "\\t"; break;
            }
            if (m) {
                jsb_add(c, out, m, 2);
            } else {
                memcpy(e, "\\u00", 4);
                e[4] = hex[u >> 4];
                e[5] = hex[u & 15];
                jsb_add(c, out, e, 6);
            }
            i++;
        } else {
            /* ensure_ascii: UTF-16 units as \uXXXX (the reference escapes 0x7f too) */
            uint32_t cp;
            i += jz_utf8_dec(s + i, n - i, &cp);
            uint32_t units[2];
            int nu = 0;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                units[nu++] = 0xd800 + (cp >> 10);
                units[nu++] = 0xdc00 + (cp & 0x3ff);
            } else {
                units[nu++] = cp;
            }
            for (int k = 0; k < nu; k++) {
                e[0] = '\\';
                e[1] = 'u';
                e[2] = hex[(units[k] >> 12) & 15];
                e[3] = hex[(units[k] >> 8) & 15];
                e[4] = hex[(units[k] >> 4) & 15];
                e[5] = hex[units[k] & 15];
                jsb_add(c, out, e, 6);
            }
        }
    }
    jsb_add(c, out, "\"", 1);
}

/* An approximation of String.prototype.localeCompare (ICU root collation)
 * for sort_keys: punctuation < digits < letters, letters compared without
 * case first, then lower case before upper case.  Divergence: exact only
 * for ASCII keys. */
static int coll_class(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return 1;
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))
        return 2;
    if (ch >= 0x80)
        return 3;
    return 0;
}

static int locale_cmp(const jstr *a, const jstr *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = (unsigned char)a->s[i], y = (unsigned char)b->s[i];
        int cx = coll_class(x), cy = coll_class(y);
        if (cx != cy)
            return cx < cy ? -1 : 1;
        unsigned char lx = (unsigned char)((x >= 'A' && x <= 'Z') ? x + 32 : x);
        unsigned char ly = (unsigned char)((y >= 'A' && y <= 'Z') ? y + 32 : y);
        if (lx != ly)
            return lx < ly ? -1 : 1;
    }
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = (unsigned char)a->s[i], y = (unsigned char)b->s[i];
        if (x != y)
            return x > y ? -1 : 1; /* lower case (bigger byte) first */
    }
    return 0;
}

static void json_value(jrt *r, jz_ctx *c, const jnode *at, jval v, const jz_json_opts *o,
                       int depth, jsb *out)
{
    if (depth > 512) {
        if (r)
            jz_rt_fail(r, at, "tojson: nesting too deep");
        jz_fail(c, SIZE_MAX, "tojson: nesting too deep");
    }
    switch (v.t) {
    case V_NULL: jsb_adds(c, out, "null"); return;
    case V_UNDEF: jsb_adds(c, out, o->undefined_as_null ? "null" : "undefined"); return;
    case V_BOOL: jsb_adds(c, out, v.u.b ? "true" : "false"); return;
    case V_INT: add_int(c, out, v.u.i); return;
    case V_FLOAT:
        if (!isfinite(v.u.f))
            jsb_adds(c, out, "null");
        else
            add_num(c, out, v.u.f);
        return;
    case V_STR: json_str_out(c, v.u.s->s, v.u.s->len, o->ensure_ascii, out); return;
    case V_FN:
        if (r)
            jz_rt_fail(r, at, "Cannot convert to JSON: FunctionValue");
        jz_fail(c, SIZE_MAX, "Cannot convert to JSON: FunctionValue");
    default: break;
    }
    const char *isep = o->item_sep ? o->item_sep->s : (o->indent > 0 ? "," : ", ");
    size_t isep_len = o->item_sep ? o->item_sep->len : strlen(isep);
    const char *ksep = o->key_sep ? o->key_sep->s : ": ";
    size_t ksep_len = o->key_sep ? o->key_sep->len : 2;
    bool ind = o->indent > 0;
    /* "\n" + indent * (depth [+1]) */
#define PAD(d)                                                    \
    do {                                                          \
        jsb_add(c, out, "\n", 1);                                 \
        for (int _i = 0; _i < (d) * o->indent; _i++)              \
            jsb_add(c, out, " ", 1);                              \
    } while (0)
    if (jv_is_arr(v)) {
        jarr *a = v.u.a;
        jsb_add(c, out, "[", 1);
        for (size_t i = 0; i < a->n; i++) {
            if (i)
                jsb_add(c, out, isep, isep_len);
            if (ind)
                PAD(depth + 1);
            json_value(r, c, at, a->v[i], o, depth + 1, out);
        }
        if (ind && a->n)
            PAD(depth);
        jsb_add(c, out, "]", 1);
        return;
    }
    jobj *ob = v.u.o;
    size_t *order = jz_alloc(c, (ob->n ? ob->n : 1) * sizeof(size_t));
    for (size_t i = 0; i < ob->n; i++)
        order[i] = i;
    if (o->sort_keys) {
        /* stable insertion sort: key counts are small */
        for (size_t i = 1; i < ob->n; i++) {
            size_t x = order[i], j = i;
            while (j > 0 && locale_cmp(ob->k[order[j - 1]], ob->k[x]) > 0) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    jsb_add(c, out, "{", 1);
    for (size_t i = 0; i < ob->n; i++) {
        size_t x = order[i];
        if (i)
            jsb_add(c, out, isep, isep_len);
        if (ind)
            PAD(depth + 1);
        json_str_out(c, ob->k[x]->s, ob->k[x]->len, o->ensure_ascii, out);
        jsb_add(c, out, ksep, ksep_len);
        json_value(r, c, at, ob->v[x], o, depth + 1, out);
    }
    if (ind && ob->n)
        PAD(depth);
    jsb_add(c, out, "}", 1);
#undef PAD
}

void jv_to_json(jrt *r, const jnode *at, jval v, const jz_json_opts *o, int depth, jsb *out)
{
    json_value(r, &r->c, at, v, o, depth, out);
}

static void to_json_plain(jz_ctx *c, jval v, jsb *out, bool undef_null, int depth)
{
    jz_json_opts o = {.indent = -1, .undefined_as_null = undef_null};
    json_value(NULL, c, NULL, v, &o, depth, out);
}

/* ---------------- from jansson ---------------- */

/* JavaScript orders "array index" keys (canonical integers below 2^32-1)
 * first, ascending, before the other keys in insertion order; the reference
 * sees objects in that order after JSON.parse. */
static bool index_key(const char *k, size_t n, uint64_t *v)
{
    if (n == 0 || n > 10)
        return false;
    if (n > 1 && k[0] == '0')
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9')
            return false;
        x = x * 10 + (uint64_t)(k[i] - '0');
    }
    if (x >= 4294967295ull)
        return false;
    *v = x;
    return true;
}

jval jv_from_json(jz_ctx *c, const json_t *j, unsigned depth)
{
    if (depth > 1000)
        jz_fail(c, SIZE_MAX, "context JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: return jv_null();
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: {
        /* JSON.parse cannot tell 1.0 from 1: an integral real is an integer */
        double d = json_real_value(j);
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            return jv_int((int64_t)d);
        return jv_float(d);
    }
    case JSON_STRING: return jv_str(c, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jval a = jv_arr(c, n);
        for (size_t i = 0; i < n; i++)
            a.u.a->v[a.u.a->n++] = jv_from_json(c, json_array_get(j, i), depth + 1);
        return a;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        jval o = jv_obj(c, n);
        const char *k;
        size_t klen;
        json_t *v;
        void *tmp;
        /* index-like keys first, ascending */
        size_t nidx = 0;
        json_object_keylen_foreach_safe((json_t *)j, tmp, k, klen, v)
        {
            uint64_t x;
            if (index_key(k, klen, &x))
                nidx++;
        }
        if (nidx) {
            uint64_t *keys = jz_alloc(c, nidx * sizeof(uint64_t));
            const char **names = jz_alloc(c, nidx * sizeof(char *));
            size_t *lens = jz_alloc(c, nidx * sizeof(size_t));
            size_t m = 0;
            json_object_keylen_foreach_safe((json_t *)j, tmp, k, klen, v)
            {
                uint64_t x;
                if (!index_key(k, klen, &x))
                    continue;
                size_t p = m++;
                while (p > 0 && keys[p - 1] > x) {
                    keys[p] = keys[p - 1];
                    names[p] = names[p - 1];
                    lens[p] = lens[p - 1];
                    p--;
                }
                keys[p] = x;
                names[p] = k;
                lens[p] = klen;
            }
            for (size_t i = 0; i < m; i++) {
                o.u.o->k[o.u.o->n] = jz_str(c, names[i], lens[i]);
                o.u.o->v[o.u.o->n++] =
                    jv_from_json(c, json_object_getn(j, names[i], lens[i]), depth + 1);
            }
        }
        json_object_keylen_foreach_safe((json_t *)j, tmp, k, klen, v)
        {
            uint64_t x;
            if (nidx && index_key(k, klen, &x))
                continue;
            /* jansson keys are unique: append without searching */
            o.u.o->k[o.u.o->n] = jz_str(c, k, klen);
            o.u.o->v[o.u.o->n++] = jv_from_json(c, v, depth + 1);
        }
        return o;
    }
    }
    return jv_null();
}

/* Jinja engine: filters, tests, methods of strings/dicts/lists, and the
 * globals (namespace, range, raise_exception, strftime_now).  The dispatch
 * mirrors @huggingface/jinja: which filters exist depends on the operand's
 * type, and `x|f` and `x|f()` are looked up in separate tables.  Filters the
 * reference lacks (it raises "Unknown ... filter") do what jinja2 does; they
 * are marked "divergence". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jinja_int.h"
#include "common/unicode.h"

/* ---------------- helpers ---------------- */

static jval mkfn(jrt *r, const char *name, jbuiltin f, jval self)
{
    jfn *fn = jz_alloc(&r->c, sizeof(jfn));
    memset(fn, 0, sizeof *fn);
    fn->name = name;
    fn->fn = f;
    fn->self = self;
    jval v = {.t = V_FN};
    v.u.fn = fn;
    return v;
}

/* splits args into positional ones and the trailing keyword mapping */
static jobj *split_kw(jval *args, size_t *nargs)
{
    if (*nargs && args[*nargs - 1].t == V_KWARGS) {
        (*nargs)--;
        return args[*nargs].u.o;
    }
    return NULL;
}

static jval *kwget(jobj *kw, const char *name)
{
    return kw ? jobj_get(kw, name, strlen(name)) : NULL;
}

/* positional i, else keyword name, else NULL */
static jval *arg_or_kw(jval *pos, size_t npos, jobj *kw, size_t i, const char *name)
{
    if (i < npos)
        return &pos[i];
    return kwget(kw, name);
}

static jval mkstr(jrt *r, const char *s, size_t n) { return jv_str(&r->c, s, n); }

static size_t trim_start(const char *s, size_t n)
{
    size_t b = 0, w;
    while (b < n && (w = jz_ws_at(s + b, n - b)) > 0)
        b += w;
    return b;
}

static size_t trim_end(const char *s, size_t n)
{
    size_t w;
    while (n > 0 && (w = jz_ws_before(s, n)) > 0)
        n -= w;
    return n;
}

/* toUpperCase / toLowerCase: Unicode mappings, including the unconditional
 * one-to-many ones (ß -> SS).  Divergence: the context-dependent final sigma
 * of toLowerCase is not applied. */
jval jz_map_case(jrt *r, jval s, bool upper)
{
    jz_ctx *c = &r->c;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, i = 0;
    /* fast path: ASCII needs no table */
    bool ascii = true;
    for (size_t k = 0; k < n && ascii; k++)
        ascii = (unsigned char)p[k] < 0x80;
    if (ascii) {
        jstr *o = jz_str(c, p, n);
        for (size_t k = 0; k < n; k++) {
            char ch = o->s[k];
            if (upper && ch >= 'a' && ch <= 'z')
                o->s[k] = (char)(ch - 32);
            else if (!upper && ch >= 'A' && ch <= 'Z')
                o->s[k] = (char)(ch + 32);
        }
        return jv_strv(o);
    }
    jsb b;
    jsb_init(c, &b, r->opts->max_output);
    while (i < n) {
        uint32_t cp;
        size_t l = jz_utf8_dec(p + i, n - i, &cp);
        uint32_t to[3];
        size_t nt = (l == 1 && cp >= 0x80) ? 0 : jz_case_map_cp(cp, upper, to);
        if (nt == 0)
            jsb_add(c, &b, p + i, l);
        for (size_t k = 0; k < nt; k++) {
            char e[4];
            jsb_add(c, &b, e, mr_utf8_encode(to[k], e));
        }
        i += l;
    }
    return jv_strv(jsb_str(c, &b));
}

static bool word_ch(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

static jval str_title(jrt *r, jval s)
{
    /* the reference: replace(/\b\w/g, toUpperCase) -- the rest is unchanged */
    jstr *o = jz_str(&r->c, s.u.s->s, s.u.s->len);
    for (size_t i = 0; i < o->len; i++)
        if (word_ch(o->s[i]) && (i == 0 || !word_ch(o->s[i - 1])) && o->s[i] >= 'a' &&
            o->s[i] <= 'z')
            o->s[i] = (char)(o->s[i] - 32);
    return jv_strv(o);
}

/* charAt(0).toUpperCase() + rest: only the first character changes */
static jval str_capitalize(jrt *r, jval s)
{
    if (s.u.s->len == 0)
        return s;
    uint32_t cp;
    size_t l = jz_utf8_dec(s.u.s->s, s.u.s->len, &cp);
    jval first = jz_map_case(r, jv_str(&r->c, s.u.s->s, l), true);
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    jsb_add(&r->c, &b, first.u.s->s, first.u.s->len);
    jsb_add(&r->c, &b, s.u.s->s + l, s.u.s->len - l);
    return jv_strv(jsb_str(&r->c, &b));
}

static jval str_trim(jrt *r, jval s, bool start, bool end)
{
    size_t b = start ? trim_start(s.u.s->s, s.u.s->len) : 0;
    size_t e = end ? trim_end(s.u.s->s, s.u.s->len) : s.u.s->len;
    if (e < b)
        e = b;
    return mkstr(r, s.u.s->s + b, e - b);
}

static jval str_length(jval s) { return jv_int((int64_t)jz_utf16_len(s.u.s->s, s.u.s->len)); }

static bool has_prefix(const jstr *s, const jstr *p)
{
    return p->len <= s->len && memcmp(s->s, p->s, p->len) == 0;
}

static bool has_suffix(const jstr *s, const jstr *p)
{
    return p->len <= s->len && memcmp(s->s + s->len - p->len, p->s, p->len) == 0;
}

/* str.replace(old, new[, count]) with the reference's rules (an empty old
 * string matches between every code point) */
static jval str_replace(jrt *r, const jnode *at, jval s, const jstr *old, const jstr *new,
                        int64_t count)
{
    jz_ctx *c = &r->c;
    jsb b;
    jsb_init(c, &b, r->opts->max_output);
    if (count == 0)
        return s;
    int64_t left = count < 0 ? INT64_MAX : count;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    if (old->len == 0) {
        size_t i = 0;
        for (;;) {
            jz_step(r, at);
            if (left > 0) {
                jsb_add(c, &b, new->s, new->len);
                left--;
            }
            if (i >= n)
                break;
            uint32_t cp;
            size_t l = jz_utf8_dec(p + i, n - i, &cp);
            jsb_add(c, &b, p + i, l);
            i += l;
        }
        return jv_strv(jsb_str(c, &b));
    }
    size_t i = 0;
    while (i < n) {
        const char *hit = left > 0 ? memmem(p + i, n - i, old->s, old->len) : NULL;
        if (!hit) {
            jsb_add(c, &b, p + i, n - i);
            break;
        }
        jz_step(r, at);
        jsb_add(c, &b, p + i, (size_t)(hit - (p + i)));
        jsb_add(c, &b, new->s, new->len);
        left--;
        i = (size_t)(hit - p) + old->len;
    }
    return jv_strv(jsb_str(c, &b));
}

/* ---------------- string methods ---------------- */

#define METHOD(name) static void name(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out)

METHOD(m_upper) { (void)at; (void)args; (void)nargs; *out = jz_map_case(r, self, true); }
METHOD(m_lower) { (void)at; (void)args; (void)nargs; *out = jz_map_case(r, self, false); }
/* divergence from jinja2: like the reference, strip/lstrip/rstrip ignore a
 * chars argument and remove whitespace */
METHOD(m_strip) { (void)at; (void)args; (void)nargs; *out = str_trim(r, self, true, true); }
METHOD(m_lstrip) { (void)at; (void)args; (void)nargs; *out = str_trim(r, self, true, false); }
METHOD(m_rstrip) { (void)at; (void)args; (void)nargs; *out = str_trim(r, self, false, true); }
METHOD(m_title) { (void)at; (void)args; (void)nargs; *out = str_title(r, self); }
METHOD(m_capitalize) { (void)at; (void)args; (void)nargs; *out = str_capitalize(r, self); }

static void starts_ends(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out,
                        bool start, const char *name)
{
    if (nargs == 0)
        jz_rt_fail(r, at, "%s() requires at least one argument", name);
    jval p = args[0];
    bool (*f)(const jstr *, const jstr *) = start ? has_prefix : has_suffix;
    if (p.t == V_STR) {
        *out = jv_bool(f(self.u.s, p.u.s));
        return;
    }
    if (jv_is_arr(p)) {
        for (size_t i = 0; i < p.u.a->n; i++) {
            if (p.u.a->v[i].t != V_STR)
                jz_rt_fail(r, at, "%s() tuple elements must be strings", name);
            if (f(self.u.s, p.u.a->v[i].u.s)) {
                *out = jv_bool(1);
                return;
            }
        }
        *out = jv_bool(0);
        return;
    }
    jz_rt_fail(r, at, "%s() argument must be a string or tuple of strings", name);
}

METHOD(m_startswith) { starts_ends(r, at, self, args, nargs, out, true, "startswith"); }
METHOD(m_endswith) { starts_ends(r, at, self, args, nargs, out, false, "endswith"); }

METHOD(m_split)
{
    jz_ctx *c = &r->c;
    jval sep = nargs > 0 ? args[0] : jv_null();
    if (sep.t != V_STR && sep.t != V_NULL)
        jz_rt_fail(r, at, "sep argument must be a string or null");
    jval ms = nargs > 1 ? args[1] : jv_int(-1);
    if (ms.t != V_INT)
        jz_rt_fail(r, at, "maxsplit argument must be a number");
    int64_t maxsplit = ms.u.i;
    jval res = jv_arr(c, 0);
    const char *s = self.u.s->s;
    size_t n = self.u.s->len;
    if (sep.t == V_NULL) {
        size_t i = trim_start(s, n);
        while (i < n) {
            jz_step(r, at);
            size_t j = i, w;
            while (j < n && jz_ws_at(s + j, n - j) == 0) {
                uint32_t cp;
                j += jz_utf8_dec(s + j, n - j, &cp);
            }
            if (maxsplit != -1 && (int64_t)res.u.a->n >= maxsplit) {
                jarr_push(c, res.u.a, mkstr(r, s + i, n - i));
                break;
            }
            jarr_push(c, res.u.a, mkstr(r, s + i, j - i));
            i = j;
            while (i < n && (w = jz_ws_at(s + i, n - i)) > 0)
                i += w;
        }
        *out = res;
        return;
    }
    const jstr *sp = sep.u.s;
    if (sp->len == 0)
        jz_rt_fail(r, at, "empty separator");
    size_t i = 0;
    for (;;) {
        jz_step(r, at);
        const char *hit = memmem(s + i, n - i, sp->s, sp->len);
        if (!hit || (maxsplit != -1 && (int64_t)res.u.a->n >= maxsplit)) {
            jarr_push(c, res.u.a, mkstr(r, s + i, n - i));
            break;
        }
        jarr_push(c, res.u.a, mkstr(r, s + i, (size_t)(hit - (s + i))));
        i = (size_t)(hit - s) + sp->len;
    }
    *out = res;
}

METHOD(m_replace)
{
    if (nargs < 2)
        jz_rt_fail(r, at, "replace() requires at least two arguments");
    if (args[0].t != V_STR || args[1].t != V_STR)
        jz_rt_fail(r, at, "replace() arguments must be strings");
    jval count = jv_null();
    if (nargs > 2) {
        if (args[2].t == V_KWARGS) {
            jval *cv = kwget(args[2].u.o, "count");
            count = cv ? *cv : jv_null();
        } else {
            count = args[2];
        }
    }
    if (count.t != V_INT && count.t != V_NULL)
        jz_rt_fail(r, at, "replace() count argument must be a number or null");
    *out = str_replace(r, at, self, args[0].u.s, args[1].u.s, count.t == V_INT ? count.u.i : -1);
}

static void join_values(jrt *r, jarr *a, const jstr *sep, jsb *b)
{
    for (size_t i = 0; i < a->n; i++) {
        if (i && sep)
            jsb_add(&r->c, b, sep->s, sep->len);
        if (a->v[i].t != V_NULL && a->v[i].t != V_UNDEF)
            jv_raw_string(&r->c, a->v[i], b);
    }
}

/* divergence: str.join, str.find and str.count exist in jinja2, not in the reference */
METHOD(m_join)
{
    if (nargs < 1 || !jv_is_arr(args[0]))
        jz_rt_fail(r, at, "join() argument must be a list");
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    join_values(r, args[0].u.a, self.u.s, &b);
    *out = jv_strv(jsb_str(&r->c, &b));
}

METHOD(m_find)
{
    if (nargs < 1 || args[0].t != V_STR)
        jz_rt_fail(r, at, "find() argument must be a string");
    const char *hit = memmem(self.u.s->s, self.u.s->len, args[0].u.s->s, args[0].u.s->len);
    *out = jv_int(hit ? (int64_t)jz_utf16_len(self.u.s->s, (size_t)(hit - self.u.s->s)) : -1);
}

METHOD(m_count)
{
    if (nargs < 1 || args[0].t != V_STR)
        jz_rt_fail(r, at, "count() argument must be a string");
    const jstr *p = args[0].u.s;
    int64_t k = 0;
    if (p->len == 0) {
        *out = jv_int((int64_t)jz_utf16_len(self.u.s->s, self.u.s->len) + 1);
        return;
    }
    const char *s = self.u.s->s;
    size_t n = self.u.s->len, i = 0;
    const char *hit;
    while (i < n && (hit = memmem(s + i, n - i, p->s, p->len)) != NULL) {
        k++;
        i = (size_t)(hit - s) + p->len;
    }
    *out = jv_int(k);
}

/* ---------------- dict methods ---------------- */

static jval obj_items(jrt *r, jobj *o)
{
    jval a = jv_arr(&r->c, o->n);
    for (size_t i = 0; i < o->n; i++) {
        jval p = jv_arr(&r->c, 2);
        p.u.a->v[0] = jv_strv(o->k[i]);
        p.u.a->v[1] = o->v[i];
        p.u.a->n = 2;
        a.u.a->v[a.u.a->n++] = p;
    }
    return a;
}

METHOD(m_get)
{
    jval key = nargs > 0 ? args[0] : jv_undef();
    if (key.t != V_STR)
        jz_rt_fail(r, at, "Object key must be a string: got %s", jv_type_name(key));
    jval *v = jobj_get(self.u.o, key.u.s->s, key.u.s->len);
    *out = v ? *v : nargs > 1 ? args[1] : jv_null();
}

METHOD(m_items) { (void)at; (void)args; (void)nargs; *out = obj_items(r, self.u.o); }

METHOD(m_keys)
{
    (void)at; (void)args; (void)nargs;
    jval a = jv_arr(&r->c, self.u.o->n);
    for (size_t i = 0; i < self.u.o->n; i++)
        a.u.a->v[a.u.a->n++] = jv_strv(self.u.o->k[i]);
    *out = a;
}

METHOD(m_values)
{
    (void)at; (void)args; (void)nargs;
    jval a = jv_arr(&r->c, self.u.o->n);
    for (size_t i = 0; i < self.u.o->n; i++)
        a.u.a->v[a.u.a->n++] = self.u.o->v[i];
    *out = a;
}

/* stable merge sort with a comparator that may fail (longjmp) */
typedef struct sort_ctx {
    jrt *r;
    const jnode *at;
    bool cs, reverse;
    int by;             /* dictsort: 0 key, 1 value; -1: whole item */
    const jstr *attr;   /* sort(attribute=...) */
} sort_ctx;

static jval attr_path(jval item, const char *path, size_t plen);

static jval sort_key(sort_ctx *s, jval v)
{
    if (s->by >= 0)
        return v.u.a->v[s->by];
    if (s->attr)
        return attr_path(v, s->attr->s, s->attr->len);
    return v;
}

static int sort_cmp(sort_ctx *s, jval a, jval b)
{
    jz_step(s->r, s->at);
    int c = jz_compare(s->r, s->at, sort_key(s, a), sort_key(s, b), s->cs);
    return s->reverse ? -c : c;
}

static void merge_sort(sort_ctx *s, jval *v, jval *tmp, size_t n)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(s, v, tmp, h);
    merge_sort(s, v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = sort_cmp(s, v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(jval));
}

static jval sorted(jrt *r, jarr *a, sort_ctx *s)
{
    jval o = jv_arr(&r->c, a->n);
    if (a->n)
        memcpy(o.u.a->v, a->v, a->n * sizeof(jval));
    o.u.a->n = a->n;
    jval *tmp = jz_alloc(&r->c, (a->n ? a->n : 1) * sizeof(jval));
    merge_sort(s, o.u.a->v, tmp, a->n);
    return o;
}

METHOD(m_dictsort)
{
    jobj *kw = split_kw(args, &nargs);
    jval *cs = arg_or_kw(args, nargs, kw, 0, "case_sensitive");
    jval *by = arg_or_kw(args, nargs, kw, 1, "by");
    jval *rev = arg_or_kw(args, nargs, kw, 2, "reverse");
    if (cs && cs->t != V_BOOL)
        jz_rt_fail(r, at, "case_sensitive must be a boolean");
    if (by && by->t != V_STR)
        jz_rt_fail(r, at, "by must be a string");
    if (by && strcmp(by->u.s->s, "key") && strcmp(by->u.s->s, "value"))
        jz_rt_fail(r, at, "by must be either 'key' or 'value'");
    if (rev && rev->t != V_BOOL)
        jz_rt_fail(r, at, "reverse must be a boolean");
    sort_ctx s = {.r = r, .at = at, .cs = cs && cs->u.b, .reverse = rev && rev->u.b,
                  .by = by && !strcmp(by->u.s->s, "value") ? 1 : 0};
    jval items = obj_items(r, self.u.o);
    *out = sorted(r, items.u.a, &s);
}

/* divergence: list.append exists in jinja2 (templates mutate lists with it) */
METHOD(m_append)
{
    if (nargs != 1)
        jz_rt_fail(r, at, "append() takes exactly one argument");
    jarr_push(&r->c, self.u.a, args[0]);
    *out = jv_null();
}

bool jz_builtin_member(jrt *r, const jnode *at, jval obj, const char *name, jval *out)
{
    (void)at;
    static const struct {
        const char *name;
        jbuiltin fn;
    } str_m[] = {{"upper", m_upper},         {"lower", m_lower},     {"strip", m_strip},
                 {"title", m_title},         {"capitalize", m_capitalize},
                 {"rstrip", m_rstrip},       {"lstrip", m_lstrip},   {"startswith", m_startswith},
                 {"endswith", m_endswith},   {"split", m_split},     {"replace", m_replace},
                 {"join", m_join},           {"find", m_find},       {"count", m_count}},
      obj_m[] = {{"get", m_get},
                 {"items", m_items},
                 {"keys", m_keys},
                 {"values", m_values},
                 {"dictsort", m_dictsort}};
    if (obj.t == V_STR) {
        if (!strcmp(name, "length")) {
            *out = str_length(obj);
            return true;
        }
        for (size_t i = 0; i < sizeof str_m / sizeof str_m[0]; i++)
            if (!strcmp(name, str_m[i].name)) {
                *out = mkfn(r, str_m[i].name, str_m[i].fn, obj);
                return true;
            }
        return false;
    }
    if (jv_is_obj(obj)) {
        for (size_t i = 0; i < sizeof obj_m / sizeof obj_m[0]; i++)
            if (!strcmp(name, obj_m[i].name)) {
                *out = mkfn(r, obj_m[i].name, obj_m[i].fn, obj);
                return true;
            }
        return false;
    }
    if (jv_is_arr(obj)) {
        if (!strcmp(name, "length")) {
            *out = jv_int((int64_t)obj.u.a->n);
            return true;
        }
        if (!strcmp(name, "append")) {
            *out = mkfn(r, "append", m_append, obj);
            return true;
        }
    }
    return false;
}

/* ---------------- tests ---------------- */

static bool is_int_val(jval v) { return v.t == V_INT; }

bool jz_run_test(jrt *r, const jnode *at, const char *name, jval v, jval *args, size_t nargs)
{
    jval b = nargs ? args[0] : jv_undef();
    if (!strcmp(name, "boolean"))
        return v.t == V_BOOL;
    if (!strcmp(name, "callable"))
        return v.t == V_FN;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (!is_int_val(v))
            jz_rt_fail(r, at, "cannot %s on %s", name, jv_type_name(v));
        return (v.u.i % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "false"))
        return v.t == V_BOOL && !v.u.b;
    if (!strcmp(name, "true"))
        return v.t == V_BOOL && v.u.b;
    if (!strcmp(name, "none"))
        return v.t == V_NULL;
    if (!strcmp(name, "string"))
        return v.t == V_STR;
    if (!strcmp(name, "number"))
        return jv_is_num(v);
    if (!strcmp(name, "integer"))
        return v.t == V_INT;
    if (!strcmp(name, "iterable"))
        return v.t == V_ARR || v.t == V_STR; /* as the reference: not tuples or dicts */
    if (!strcmp(name, "mapping"))
        return jv_is_obj(v);
    if (!strcmp(name, "sequence"))
        return jv_is_arr(v) || jv_is_obj(v) || v.t == V_STR;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.t != V_STR)
            return false;
        jval m = jz_map_case(r, v, name[0] == 'u');
        return m.u.s->len == v.u.s->len && !memcmp(m.u.s->s, v.u.s->s, v.u.s->len);
    }
    if (!strcmp(name, "defined"))
        return v.t != V_UNDEF;
    if (!strcmp(name, "undefined"))
        return v.t == V_UNDEF;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "sameas"))
        return jz_strict_eq(v, b);
    /* divergence: jinja2 tests with arguments (the reference cannot parse them) */
    if (!strcmp(name, "ne"))
        return !jz_strict_eq(v, b);
    if (!strcmp(name, "float"))
        return v.t == V_FLOAT;
    if (!strcmp(name, "divisibleby")) {
        if (v.t != V_INT || b.t != V_INT || b.u.i == 0)
            jz_rt_fail(r, at, "divisibleby needs integers");
        return b.u.i == -1 || v.u.i % b.u.i == 0;
    }
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan"))
        return jz_compare(r, at, v, b, true) < 0;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan"))
        return jz_compare(r, at, v, b, true) > 0;
    if (!strcmp(name, "le"))
        return jz_compare(r, at, v, b, true) <= 0;
    if (!strcmp(name, "ge"))
        return jz_compare(r, at, v, b, true) >= 0;
    if (!strcmp(name, "in")) {
        if (jv_is_arr(b)) {
            for (size_t i = 0; i < b.u.a->n; i++)
                if (jz_strict_eq(b.u.a->v[i], v))
                    return true;
            return false;
        }
        if (b.t == V_STR && v.t == V_STR)
            return memmem(b.u.s->s, b.u.s->len, v.u.s->s, v.u.s->len) != NULL || !v.u.s->len;
        if (jv_is_obj(b) && v.t == V_STR)
            return jobj_get(b.u.o, v.u.s->s, v.u.s->len) != NULL;
        return false;
    }
    jz_rt_fail(r, at, "Unknown test: %s", name);
}

/* ---------------- filters ---------------- */

static bool container(jval v) { return jv_is_obj(v) || v.t == V_NS; }

/* getAttributeValue of the reference: dotted path, integer parts index lists */
static jval attr_path(jval item, const char *path, size_t plen)
{
    size_t i = 0;
    jval v = item;
    while (i <= plen) {
        size_t j = i;
        while (j < plen && path[j] != '.')
            j++;
        if (container(v)) {
            jval *p = jobj_get(v.u.o, path + i, j - i);
            v = p ? *p : jv_undef();
        } else if (jv_is_arr(v)) {
            /* parseInt: leading digits */
            size_t k = i;
            int64_t idx = 0;
            bool any = false;
            if (k < j && path[k] == '-')
                return jv_undef();
            while (k < j && path[k] >= '0' && path[k] <= '9' && idx < (int64_t)1e15) {
                idx = idx * 10 + (path[k] - '0');
                k++;
                any = true;
            }
            if (!any || idx >= (int64_t)v.u.a->n)
                return jv_undef();
            v = v.u.a->v[idx];
        } else {
            return jv_undef();
        }
        i = j + 1;
    }
    return v;
}

static jval tojson(jrt *r, const jnode *at, jval v, int indent, bool ascii, bool sort,
                   const jstr *isep, const jstr *ksep)
{
    jz_json_opts o = {.indent = indent, .ensure_ascii = ascii, .sort_keys = sort,
                      .undefined_as_null = true, .item_sep = isep, .key_sep = ksep};
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    jv_to_json(r, at, v, &o, 0, &b);
    return jv_strv(jsb_str(&r->c, &b));
}

static jval to_string_val(jrt *r, jval v)
{
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    jv_to_string(&r->c, v, &b);
    return jv_strv(jsb_str(&r->c, &b));
}

/* parseInt(s, 10) / parseFloat(s); false when NaN */
static bool parse_int_prefix(const jstr *s, int64_t *out)
{
    size_t i = trim_start(s->s, s->len);
    int sign = 1;
    if (i < s->len && (s->s[i] == '+' || s->s[i] == '-')) {
        sign = s->s[i] == '-' ? -1 : 1;
        i++;
    }
    int64_t v = 0;
    bool any = false;
    while (i < s->len && s->s[i] >= '0' && s->s[i] <= '9') {
        if (v < INT64_MAX / 10 - 10)
            v = v * 10 + (s->s[i] - '0');
        i++;
        any = true;
    }
    *out = sign * v;
    return any;
}

static bool parse_float_prefix(const jstr *s, double *out)
{
    size_t i = trim_start(s->s, s->len);
    const char *p = s->s + i;
    size_t n = s->len - i;
    /* JavaScript accepts [+-]Infinity, not inf/nan/hex */
    size_t k = 0;
    if (k < n && (p[k] == '+' || p[k] == '-'))
        k++;
    if (n - k >= 8 && !memcmp(p + k, "Infinity", 8)) {
        *out = p[0] == '-' ? -INFINITY : INFINITY;
        return true;
    }
    size_t start = k;
    bool digits = false;
    while (k < n && p[k] >= '0' && p[k] <= '9') {
        k++;
        digits = true;
    }
    if (k < n && p[k] == '.') {
        k++;
        while (k < n && p[k] >= '0' && p[k] <= '9') {
            k++;
            digits = true;
        }
    }
    if (!digits)
        return false;
    if (k < n && (p[k] == 'e' || p[k] == 'E')) {
        size_t e = k + 1;
        if (e < n && (p[e] == '+' || p[e] == '-'))
            e++;
        if (e < n && p[e] >= '0' && p[e] <= '9') {
            while (e < n && p[e] >= '0' && p[e] <= '9')
                e++;
            k = e;
        }
    }
    (void)start;
    char buf[128];
    if (k >= sizeof buf)
        k = sizeof buf - 1;
    memcpy(buf, p, k);
    buf[k] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

static jval indent_str(jrt *r, jval s, int64_t width, bool first, bool blank)
{
    jz_ctx *c = &r->c;
    jsb b;
    jsb_init(c, &b, r->opts->max_output);
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, i = 0;
    size_t line = 0;
    for (;;) {
        const char *nl = memchr(p + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - p) : n;
        if (line > 0)
            jsb_add(c, &b, "\n", 1);
        bool skip = (!first && line == 0) || (!blank && e == i);
        if (!skip)
            for (int64_t k = 0; k < width; k++)
                jsb_add(c, &b, " ", 1);
        jsb_add(c, &b, p + i, e - i);
        line++;
        if (!nl)
            break;
        i = e + 1;
    }
    return jv_strv(jsb_str(c, &b));
}

static jval unique(jrt *r, jarr *a)
{
    jval o = jv_arr(&r->c, 0);
    for (size_t i = 0; i < a->n; i++) {
        bool seen = false;
        for (size_t k = 0; k < o.u.a->n && !seen; k++) {
            jz_step(r, NULL);
            seen = jz_strict_eq(o.u.a->v[k], a->v[i]);
        }
        if (!seen)
            jarr_push(&r->c, o.u.a, a->v[i]);
    }
    return o;
}

static jval wordcount(jval s)
{
    int64_t k = 0;
    bool in = false;
    for (size_t i = 0; i < s.u.s->len; i++) {
        bool w = word_ch(s.u.s->s[i]) || ((unsigned char)s.u.s->s[i] >= 0x80);
        if (w && !in)
            k++;
        in = w;
    }
    return jv_int(k);
}

static jval html_escape(jrt *r, jval s)
{
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    for (size_t i = 0; i < s.u.s->len; i++) {
        char ch = s.u.s->s[i];
        const char *e = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;"
                        : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        if (e)
            jsb_adds(&r->c, &b, e);
        else
            jsb_add(&r->c, &b, &ch, 1);
    }
    return jv_strv(jsb_str(&r->c, &b));
}

static jval first_last_str(jrt *r, jval s, bool first)
{
    if (s.u.s->len == 0)
        return jv_undef();
    if (first) {
        uint32_t cp;
        size_t l = jz_utf8_dec(s.u.s->s, s.u.s->len, &cp);
        return mkstr(r, s.u.s->s, l);
    }
    size_t i = s.u.s->len - 1;
    while (i > 0 && ((unsigned char)s.u.s->s[i] & 0xc0) == 0x80)
        i--;
    return mkstr(r, s.u.s->s + i, s.u.s->len - i);
}

static jval str_chars(jrt *r, jval s)
{
    jval a = jv_arr(&r->c, 0);
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t cp;
        size_t l = jz_utf8_dec(s.u.s->s + i, s.u.s->len - i, &cp);
        jarr_push(&r->c, a.u.a, mkstr(r, s.u.s->s + i, l));
        i += l;
    }
    return a;
}

static _Noreturn void unknown_filter(jrt *r, const jnode *at, const char *name, jval v)
{
    if (v.t == V_ARR || v.t == V_TUPLE)
        jz_rt_fail(r, at, "Unknown ArrayValue filter: %s", name);
    if (v.t == V_STR)
        jz_rt_fail(r, at, "Unknown StringValue filter: %s", name);
    if (jv_is_num(v))
        jz_rt_fail(r, at, "Unknown NumericValue filter: %s", name);
    if (jv_is_obj(v))
        jz_rt_fail(r, at, "Unknown ObjectValue filter: %s", name);
    if (v.t == V_BOOL)
        jz_rt_fail(r, at, "Unknown BooleanValue filter: %s", name);
    jz_rt_fail(r, at, "Cannot apply filter \"%s\" to type: %s", name, jv_type_name(v));
}

/* `x | name` */
static jval filter_plain(jrt *r, const jnode *at, const char *f, jval v, jenv *env)
{
    (void)env;
    jz_ctx *c = &r->c;
    if (!strcmp(f, "safe"))
        return v;
    if (!strcmp(f, "tojson"))
        return tojson(r, at, v, -1, false, false, NULL, NULL);
    if (jv_is_arr(v)) {
        jarr *a = v.u.a;
        if (!strcmp(f, "list"))
            return v;
        if (!strcmp(f, "first"))
            return a->n ? a->v[0] : jv_undef();
        if (!strcmp(f, "last"))
            return a->n ? a->v[a->n - 1] : jv_undef();
        if (!strcmp(f, "length") || !strcmp(f, "count"))
            return jv_int((int64_t)a->n);
        if (!strcmp(f, "reverse")) {
            jval o = jv_arr(c, a->n);
            for (size_t i = 0; i < a->n; i++)
                o.u.a->v[o.u.a->n++] = a->v[a->n - 1 - i];
            return o;
        }
        if (!strcmp(f, "sort")) {
            sort_ctx s = {.r = r, .at = at, .by = -1};
            return sorted(r, a, &s);
        }
        if (!strcmp(f, "join")) {
            jsb b;
            jsb_init(c, &b, r->opts->max_output);
            join_values(r, a, NULL, &b);
            return jv_strv(jsb_str(c, &b));
        }
        if (!strcmp(f, "string"))
            return to_string_val(r, v);
        if (!strcmp(f, "unique"))
            return unique(r, a);
        /* divergence: select/reject without a test keep the truthy items */
        if (!strcmp(f, "select") || !strcmp(f, "reject")) {
            jval o = jv_arr(c, 0);
            for (size_t i = 0; i < a->n; i++)
                if (jv_truthy(a->v[i]) == (f[0] == 's'))
                    jarr_push(c, o.u.a, a->v[i]);
            return o;
        }
        unknown_filter(r, at, f, v);
    }
    if (v.t == V_STR) {
        if (!strcmp(f, "length"))
            return str_length(v);
        if (!strcmp(f, "upper"))
            return jz_map_case(r, v, true);
        if (!strcmp(f, "lower"))
            return jz_map_case(r, v, false);
        if (!strcmp(f, "title"))
            return str_title(r, v);
        if (!strcmp(f, "capitalize"))
            return str_capitalize(r, v);
        if (!strcmp(f, "trim"))
            return str_trim(r, v, true, true);
        if (!strcmp(f, "indent"))
            return indent_str(r, v, 4, false, false);
        if (!strcmp(f, "join") || !strcmp(f, "string"))
            return v;
        if (!strcmp(f, "int")) {
            int64_t i;
            return jv_int(parse_int_prefix(v.u.s, &i) ? i : 0);
        }
        if (!strcmp(f, "float")) {
            double d;
            return jv_float(parse_float_prefix(v.u.s, &d) ? d : 0);
        }
        /* divergence: jinja2 filters the reference lacks */
        if (!strcmp(f, "count"))
            return str_length(v);
        if (!strcmp(f, "wordcount"))
            return wordcount(v);
        if (!strcmp(f, "e") || !strcmp(f, "escape"))
            return html_escape(r, v);
        if (!strcmp(f, "first") || !strcmp(f, "last"))
            return first_last_str(r, v, f[0] == 'f');
        if (!strcmp(f, "list"))
            return str_chars(r, v);
        unknown_filter(r, at, f, v);
    }
    if (jv_is_num(v)) {
        if (!strcmp(f, "abs"))
            return v.t == V_INT ? jv_int(v.u.i < 0 ? -v.u.i : v.u.i) : jv_float(fabs(v.u.f));
        if (!strcmp(f, "int")) {
            if (v.t == V_INT)
                return v;
            double fl = floor(v.u.f);
            if (!(fabs(fl) < 9.2e18))
                jz_rt_fail(r, at, "int(): value out of range");
            return jv_int((int64_t)fl);
        }
        if (!strcmp(f, "float"))
            return jv_float(v.t == V_INT ? (double)v.u.i : v.u.f);
        if (!strcmp(f, "string"))
            return to_string_val(r, v);
        if (!strcmp(f, "round")) /* divergence */
            return v.t == V_INT ? jv_float((double)v.u.i) : jv_float(nearbyint(v.u.f));
        unknown_filter(r, at, f, v);
    }
    if (jv_is_obj(v)) {
        if (!strcmp(f, "items"))
            return obj_items(r, v.u.o);
        if (!strcmp(f, "length") || !strcmp(f, "count"))
            return jv_int((int64_t)v.u.o->n);
        jval m;
        if (jz_builtin_member(r, at, v, f, &m))
            return jz_call(r, at, m, NULL, 0, env);
        if (!strcmp(f, "list")) { /* divergence */
            jval out;
            m_keys(r, at, v, NULL, 0, &out);
            return out;
        }
        unknown_filter(r, at, f, v);
    }
    if (v.t == V_BOOL) {
        if (!strcmp(f, "bool"))
            return v;
        if (!strcmp(f, "int"))
            return jv_int(v.u.b);
        if (!strcmp(f, "float"))
            return jv_float(v.u.b);
        if (!strcmp(f, "string"))
            return mkstr(r, v.u.b ? "true" : "false", v.u.b ? 4 : 5);
        unknown_filter(r, at, f, v);
    }
    jz_rt_fail(r, at, "Cannot apply filter \"%s\" to type: %s", f, jv_type_name(v));
}

/* applies filter or test name to one item (map('upper'), select('odd')) */
static jval map_filter(jrt *r, const jnode *at, const char *name, jval item, jval *extra,
                       size_t nextra, jenv *env)
{
    if (nextra == 0)
        return filter_plain(r, at, name, item, env);
    /* a few filters with arguments, enough for map('replace', a, b) and friends */
    if (!strcmp(name, "replace") && item.t == V_STR) {
        jval out;
        m_replace(r, at, item, extra, nextra, &out);
        return out;
    }
    if (!strcmp(name, "default"))
        return item.t == V_UNDEF ? extra[0] : item;
    if (!strcmp(name, "join") && jv_is_arr(item) && extra[0].t == V_STR) {
        jsb b;
        jsb_init(&r->c, &b, r->opts->max_output);
        join_values(r, item.u.a, extra[0].u.s, &b);
        return jv_strv(jsb_str(&r->c, &b));
    }
    jz_rt_fail(r, at, "map: filter %s with arguments is not supported", name);
}

/* `x | name(args)` */
static jval filter_call(jrt *r, const jnode *fnode, jval v, jenv *env)
{
    jz_ctx *c = &r->c;
    const char *f = fnode->a->s->s;
    const jnode *at = fnode;
    jval *pos;
    size_t npos;
    if (!strcmp(f, "tojson")) {
        jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
        jobj *kw = kwv.u.o;
        jval *ind = kwget(kw, "indent"), *asc = kwget(kw, "ensure_ascii"),
             *sk = kwget(kw, "sort_keys"), *sep = kwget(kw, "separators");
        if (ind && ind->t != V_INT && ind->t != V_NULL)
            jz_rt_fail(r, at, "If set, indent must be a number");
        if (asc && asc->t != V_BOOL)
            jz_rt_fail(r, at, "If set, ensure_ascii must be a boolean");
        if (sk && sk->t != V_BOOL)
            jz_rt_fail(r, at, "If set, sort_keys must be a boolean");
        const jstr *is = NULL, *ks = NULL;
        if (sep && jv_is_arr(*sep)) {
            if (sep->u.a->n != 2 || sep->u.a->v[0].t != V_STR || sep->u.a->v[1].t != V_STR)
                jz_rt_fail(r, at, "separators must be a tuple of two strings");
            is = sep->u.a->v[0].u.s;
            ks = sep->u.a->v[1].u.s;
        } else if (sep && sep->t != V_NULL) {
            jz_rt_fail(r, at, "If set, separators must be a tuple of two strings");
        }
        int indent = -1;
        if (ind && ind->t == V_INT) {
            if (ind->u.i > 64)
                jz_rt_fail(r, at, "indent too large");
            indent = (int)ind->u.i;
        }
        return tojson(r, at, v, indent, asc && asc->u.b, sk && sk->u.b, is, ks);
    }
    if (!strcmp(f, "join")) {
        jval src;
        if (v.t == V_STR)
            src = str_chars(r, v);
        else if (jv_is_arr(v))
            src = v;
        else
            jz_rt_fail(r, at, "Cannot apply filter \"join\" to type: %s", jv_type_name(v));
        jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
        jval *sep = arg_or_kw(pos, npos, kwv.u.o, 0, "separator");
        if (sep && sep->t != V_STR)
            jz_rt_fail(r, at, "separator must be a string");
        jsb b;
        jsb_init(c, &b, r->opts->max_output);
        join_values(r, src.u.a, sep ? sep->u.s : NULL, &b);
        return jv_strv(jsb_str(c, &b));
    }
    if (!strcmp(f, "int") || !strcmp(f, "float")) {
        bool is_int = f[0] == 'i';
        jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
        jval *d = arg_or_kw(pos, npos, kwv.u.o, 0, "default");
        jval def = d ? *d : is_int ? jv_int(0) : jv_float(0);
        if (v.t == V_STR) {
            if (is_int) {
                int64_t i;
                return parse_int_prefix(v.u.s, &i) ? jv_int(i) : def;
            }
            double x;
            return parse_float_prefix(v.u.s, &x) ? jv_float(x) : def;
        }
        if (jv_is_num(v))
            return v;
        if (v.t == V_BOOL)
            return is_int ? jv_int(v.u.b) : jv_float(v.u.b);
        jz_rt_fail(r, at, "Cannot apply filter \"%s\" to type: %s", f, jv_type_name(v));
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
        jval def = npos > 0 ? pos[0] : mkstr(r, "", 0);
        jval *bp = npos > 1 ? &pos[1] : kwget(kwv.u.o, "boolean");
        if (bp && bp->t != V_BOOL)
            jz_rt_fail(r, at, "`default` filter flag must be a boolean");
        if (v.t == V_UNDEF || (bp && bp->u.b && !jv_truthy(v)))
            return def;
        return v;
    }
    if (jv_is_arr(v)) {
        jarr *a = v.u.a;
        if (!strcmp(f, "sort")) {
            jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            jval *rev = arg_or_kw(pos, npos, kwv.u.o, 0, "reverse");
            jval *cs = arg_or_kw(pos, npos, kwv.u.o, 1, "case_sensitive");
            jval *attr = arg_or_kw(pos, npos, kwv.u.o, 2, "attribute");
            if (rev && rev->t != V_BOOL)
                jz_rt_fail(r, at, "reverse must be a boolean");
            if (cs && cs->t != V_BOOL)
                jz_rt_fail(r, at, "case_sensitive must be a boolean");
            if (attr && attr->t != V_STR && attr->t != V_INT && attr->t != V_NULL)
                jz_rt_fail(r, at, "attribute must be a string, integer, or null");
            sort_ctx s = {.r = r, .at = at, .cs = cs && cs->u.b, .reverse = rev && rev->u.b,
                          .by = -1};
            if (attr && attr->t == V_STR)
                s.attr = attr->u.s;
            else if (attr && attr->t == V_INT)
                s.attr = to_string_val(r, *attr).u.s;
            return sorted(r, a, &s);
        }
        if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
            bool sel = f[0] == 's';
            for (size_t i = 0; i < a->n; i++)
                if (!container(a->v[i]))
                    jz_rt_fail(r, at, "`%s` can only be applied to array of objects", f);
            for (size_t i = 0; i < fnode->l1.n; i++)
                if (fnode->l1.v[i]->type != N_STR)
                    jz_rt_fail(r, at, "arguments of `%s` must be strings", f);
            jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            if (npos < 1)
                jz_rt_fail(r, at, "`%s` needs an attribute name", f);
            const char *test = npos > 1 ? pos[1].u.s->s : NULL;
            if (test && !jz_has_test(test))
                jz_rt_fail(r, at, "Unknown test: %s", test);
            jval o = jv_arr(c, 0);
            for (size_t i = 0; i < a->n; i++) {
                jz_step(r, at);
                jval *av = jobj_get(a->v[i].u.o, pos[0].u.s->s, pos[0].u.s->len);
                bool res = false;
                if (av)
                    res = test ? jz_run_test(r, at, test, *av, npos > 2 ? &pos[2] : NULL,
                                             npos > 2 ? 1 : 0)
                               : jv_truthy(*av);
                if (res == sel)
                    jarr_push(c, o.u.a, a->v[i]);
            }
            return o;
        }
        if (!strcmp(f, "map")) {
            jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            jval *attr = kwget(kwv.u.o, "attribute");
            jval o = jv_arr(c, a->n);
            if (attr) {
                if (attr->t != V_STR)
                    jz_rt_fail(r, at, "attribute must be a string");
                jval *def = kwget(kwv.u.o, "default");
                for (size_t i = 0; i < a->n; i++) {
                    if (!container(a->v[i]))
                        jz_rt_fail(r, at, "items in map must be an object");
                    jval x = attr_path(a->v[i], attr->u.s->s, attr->u.s->len);
                    o.u.a->v[o.u.a->n++] = x.t == V_UNDEF && def ? *def : x;
                }
                return o;
            }
            /* divergence: map('filter', ...) is jinja2's; the reference raises */
            if (npos < 1 || pos[0].t != V_STR)
                jz_rt_fail(r, at, "map needs attribute= or a filter name");
            for (size_t i = 0; i < a->n; i++) {
                jz_step(r, at);
                o.u.a->v[o.u.a->n++] =
                    map_filter(r, at, pos[0].u.s->s, a->v[i], pos + 1, npos - 1, env);
            }
            return o;
        }
        /* divergence: select/reject with a test are jinja2's */
        if (!strcmp(f, "select") || !strcmp(f, "reject")) {
            jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            if (npos < 1 || pos[0].t != V_STR)
                jz_rt_fail(r, at, "%s needs a test name", f);
            jval o = jv_arr(c, 0);
            for (size_t i = 0; i < a->n; i++) {
                jz_step(r, at);
                bool res = jz_run_test(r, at, pos[0].u.s->s, a->v[i], pos + 1, npos - 1);
                if (res == (f[0] == 's'))
                    jarr_push(c, o.u.a, a->v[i]);
            }
            return o;
        }
        if (fnode->l1.n == 0)
            return filter_plain(r, at, f, v, env);
        unknown_filter(r, at, f, v);
    }
    if (v.t == V_STR) {
        if (!strcmp(f, "indent")) {
            jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            jval *w = arg_or_kw(pos, npos, kwv.u.o, 0, "width");
            jval *first = arg_or_kw(pos, npos, kwv.u.o, 1, "first");
            jval *blank = arg_or_kw(pos, npos, kwv.u.o, 2, "blank");
            if (w && w->t != V_INT)
                jz_rt_fail(r, at, "width must be a number");
            int64_t width = w ? w->u.i : 4;
            if (width > 1024)
                jz_rt_fail(r, at, "indent width too large");
            return indent_str(r, v, width, first && jv_truthy(*first),
                              blank && jv_truthy(*blank));
        }
        if (!strcmp(f, "replace")) {
            jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            jval *all = jz_alloc(c, (npos + 1) * sizeof(jval));
            if (npos)
                memcpy(all, pos, npos * sizeof(jval));
            all[npos] = kwv;
            jval out;
            m_replace(r, at, v, all, npos + 1, &out);
            return out;
        }
        if (fnode->l1.n == 0)
            return filter_plain(r, at, f, v, env);
        unknown_filter(r, at, f, v);
    }
    if (jv_is_obj(v)) {
        jval m;
        if (jz_builtin_member(r, at, v, f, &m)) {
            jval kwv = jz_eval_args(r, &fnode->l1, env, &pos, &npos);
            jval *all = jz_alloc(c, (npos + 1) * sizeof(jval));
            if (npos)
                memcpy(all, pos, npos * sizeof(jval));
            if (kwv.u.o->n)
                all[npos++] = kwv;
            return jz_call(r, at, m, all, npos, env);
        }
        unknown_filter(r, at, f, v);
    }
    if (fnode->l1.n == 0 && (jv_is_num(v) || v.t == V_BOOL))
        return filter_plain(r, at, f, v, env); /* divergence: `x|int()` on numbers */
    jz_rt_fail(r, at, "Cannot apply filter \"%s\" to type: %s", f, jv_type_name(v));
}

jval jz_apply_filter(jrt *r, const jnode *filter, jval operand, jenv *env)
{
    jz_step(r, filter);
    if (filter->type == N_IDENT)
        return filter_plain(r, filter, filter->s->s, operand, env);
    if (filter->type == N_CALL && filter->a->type == N_IDENT)
        return filter_call(r, filter, operand, env);
    jz_rt_fail(r, filter, "Unknown filter");
}

bool jz_has_test(const char *name)
{
    static const char *const names[] = {
        "boolean", "callable", "odd", "even", "false", "true", "none", "string", "number",
        "integer", "iterable", "mapping", "sequence", "lower", "upper", "defined", "undefined",
        "equalto", "eq", "sameas", "ne", "float", "divisibleby", "lt", "lessthan", "gt",
        "greaterthan", "le", "ge", "in", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name))
            return true;
    return false;
}

/* ---------------- globals ---------------- */

static void g_namespace(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out)
{
    (void)self;
    jobj *kw = split_kw(args, &nargs);
    if (nargs > 1)
        jz_rt_fail(r, at, "namespace expected at most 1 argument, got %zu", nargs);
    jval ns = jv_obj(&r->c, 0);
    ns.t = V_NS;
    if (nargs == 1) {
        jval src = args[0];
        if (jv_is_obj(src)) {
            for (size_t i = 0; i < src.u.o->n; i++)
                jobj_set(&r->c, ns.u.o, src.u.o->k[i], src.u.o->v[i]);
        } else if (jv_is_arr(src)) {
            for (size_t i = 0; i < src.u.a->n; i++) {
                jval p = src.u.a->v[i];
                if (p.t == V_STR)
                    p = str_chars(r, p);
                if (!jv_is_arr(p) || p.u.a->n != 2)
                    jz_rt_fail(r, at,
                               "namespace expected an object or an iterable of [key, value] pairs");
                if (p.u.a->v[0].t != V_STR)
                    jz_rt_fail(r, at, "namespace keys must be strings");
                jobj_set(&r->c, ns.u.o, p.u.a->v[0].u.s, p.u.a->v[1]);
            }
        } else {
            jz_rt_fail(r, at, "'%s' object is not iterable", jv_type_name(src));
        }
    }
    for (size_t i = 0; kw && i < kw->n; i++)
        jobj_set(&r->c, ns.u.o, kw->k[i], kw->v[i]);
    *out = ns;
}

static void g_raise(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out)
{
    (void)self;
    (void)out;
    /* the reference throws new Error(args): the arguments joined with "," */
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    for (size_t i = 0; i < nargs; i++) {
        if (i)
            jsb_add(&r->c, &b, ",", 1);
        jv_to_string(&r->c, args[i], &b);
    }
    jz_rt_fail(r, at, "%s", b.p ? b.p : "");
}

static void g_range(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out)
{
    (void)self;
    split_kw(args, &nargs);
    if (nargs < 1 || nargs > 3)
        jz_rt_fail(r, at, "range expected 1 to 3 arguments");
    for (size_t i = 0; i < nargs; i++)
        if (args[i].t != V_INT)
            jz_rt_fail(r, at, "range arguments must be integers");
    int64_t start = 0, stop, step = 1;
    if (nargs == 1) {
        stop = args[0].u.i;
    } else {
        start = args[0].u.i;
        stop = args[1].u.i;
        if (nargs == 3)
            step = args[2].u.i;
    }
    if (step == 0)
        jz_rt_fail(r, at, "range() step must not be zero");
    uint64_t count = 0;
    if (step > 0 && start < stop)
        count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    else if (step < 0 && start > stop)
        count = ((uint64_t)start - (uint64_t)stop - 1) / ((uint64_t)0 - (uint64_t)step) + 1;
    if (count > r->opts->max_memory / sizeof(jval))
        jz_rt_fail(r, at, "range too large");
    jval a = jv_arr(&r->c, (size_t)count);
    for (uint64_t i = 0; i < count; i++)
        a.u.a->v[a.u.a->n++] = jv_int((int64_t)((uint64_t)start + i * (uint64_t)step));
    *out = a;
}

static void g_strftime(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out)
{
    (void)self;
    if (nargs < 1 || args[0].t != V_STR)
        jz_rt_fail(r, at, "strftime_now expects a format string");
    static const char *const mon[] = {"January", "February", "March", "April", "May", "June",
                                      "July", "August", "September", "October", "November",
                                      "December"};
    time_t now = r->opts->now >= 0 ? (time_t)r->opts->now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    /* the reference supports %Y %m %d %b %B %H %M %% and leaves others as they are */
    jsb b;
    jsb_init(&r->c, &b, r->opts->max_output);
    const jstr *f = args[0].u.s;
    for (size_t i = 0; i < f->len; i++) {
        char buf[32];
        if (f->s[i] == '%' && i + 1 < f->len) {
            char k = f->s[i + 1];
            const char *s = NULL;
            switch (k) {
            case 'Y': snprintf(buf, sizeof buf, "%d", tm.tm_year + 1900); s = buf; break;
            case 'm': snprintf(buf, sizeof buf, "%02d", tm.tm_mon + 1); s = buf; break;
            case 'd': snprintf(buf, sizeof buf, "%02d", tm.tm_mday); s = buf; break;
            case 'H': snprintf(buf, sizeof buf, "%02d", tm.tm_hour); s = buf; break;
            case 'M': snprintf(buf, sizeof buf, "%02d", tm.tm_min); s = buf; break;
            case 'b': snprintf(buf, sizeof buf, "%.3s", mon[tm.tm_mon]); s = buf; break;
            case 'B': s = mon[tm.tm_mon]; break;
            case '%': s = "%"; break;
            }
            if (s) {
                jsb_adds(&r->c, &b, s);
                i++;
                continue;
            }
        }
        jsb_add(&r->c, &b, &f->s[i], 1);
    }
    *out = jv_strv(jsb_str(&r->c, &b));
}

void jz_add_globals(jrt *r, jenv *g)
{
    /* the scope API is in jinja_eval.c; globals go straight into the first frame */
    struct {
        const char *name;
        jval v;
    } vals[] = {
        {"namespace", mkfn(r, "namespace", g_namespace, jv_undef())},
        {"false", jv_bool(0)},
        {"true", jv_bool(1)},
        {"none", jv_null()},
        {"raise_exception", mkfn(r, "raise_exception", g_raise, jv_undef())},
        {"range", mkfn(r, "range", g_range, jv_undef())},
        {"strftime_now", mkfn(r, "strftime_now", g_strftime, jv_undef())},
        {"True", jv_bool(1)},
        {"False", jv_bool(0)},
        {"None", jv_null()},
    };
    size_t n = sizeof vals / sizeof vals[0];
    g->names = jz_alloc(&r->c, n * 2 * sizeof(char *));
    g->vals = jz_alloc(&r->c, n * 2 * sizeof(jval));
    g->cap = n * 2;
    g->n = 0;
    for (size_t i = 0; i < n; i++) {
        g->names[g->n] = vals[i].name;
        g->vals[g->n] = vals[i].v;
        g->n++;
    }
}

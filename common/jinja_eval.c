/* Jinja engine: the interpreter.  It follows the evaluation rules of
 * @huggingface/jinja: scopes (a for loop has its own scope; `set` writes the
 * innermost scope; a macro runs in a scope whose parent is the caller's),
 * operators (JavaScript-like + and ==, errors on none/undefined operands),
 * and output (none and undefined print nothing). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jinja_int.h"

struct mr_jinja_tmpl {
    jz_ctx c;
    jlist body;
    char *src;
    size_t len;
};

enum { RC_OK = 0, RC_BREAK = 1, RC_CONTINUE = 2 };

void mr_jinja_opts_default(mr_jinja_opts *o)
{
    o->max_output = 64u << 20;
    o->max_memory = 256u << 20;
    o->max_depth = 1024;
    o->max_steps = 20000000;
    o->now = -1;
}

void jz_rt_fail(jrt *r, const jnode *at, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jz_fail(&r->c, at ? at->pos : SIZE_MAX, "%s", msg);
}

void jz_step(jrt *r, const jnode *at)
{
    if (++r->steps > r->opts->max_steps)
        jz_rt_fail(r, at, "step limit of %llu exceeded", (unsigned long long)r->opts->max_steps);
}

/* ---------------- environments ---------------- */

static jenv *env_new(jrt *r, jenv *parent)
{
    jenv *e = jz_alloc(&r->c, sizeof(jenv));
    memset(e, 0, sizeof *e);
    e->parent = parent;
    return e;
}

static void env_set(jrt *r, jenv *e, const char *name, jval v)
{
    for (size_t i = 0; i < e->n; i++) {
        if (!strcmp(e->names[i], name)) {
            e->vals[i] = v;
            return;
        }
    }
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 4;
        const char **nn = jz_alloc(&r->c, cap * sizeof(char *));
        jval *nv = jz_alloc(&r->c, cap * sizeof(jval));
        if (e->n) {
            memcpy(nn, e->names, e->n * sizeof(char *));
            memcpy(nv, e->vals, e->n * sizeof(jval));
        }
        e->names = nn;
        e->vals = nv;
        e->cap = cap;
    }
    e->names[e->n] = name;
    e->vals[e->n] = v;
    e->n++;
}

static jval *env_get(jenv *e, const char *name)
{
    for (; e; e = e->parent)
        for (size_t i = 0; i < e->n; i++)
            if (!strcmp(e->names[i], name))
                return &e->vals[i];
    return NULL;
}

/* ---------------- comparisons ---------------- */

/* Number(string) in JavaScript; NaN when it is not a number. */
static double js_to_number(const jstr *s)
{
    size_t b = 0, e = s->len, w;
    while (b < e && (w = jz_ws_at(s->s + b, e - b)) > 0)
        b += w;
    while (e > b && (w = jz_ws_before(s->s, e)) > 0)
        e -= w;
    if (b == e)
        return 0;
    char buf[128];
    size_t n = e - b;
    if (n >= sizeof buf)
        return NAN;
    memcpy(buf, s->s + b, n);
    buf[n] = '\0';
    const char *p = buf;
    int sign = 1;
    if (*p == '+' || *p == '-') {
        sign = *p == '-' ? -1 : 1;
        p++;
    }
    if (!strcmp(p, "Infinity"))
        return sign * INFINITY;
    for (const char *q = p; *q; q++)
        if (!((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' ||
              *q == '-' || *q == 'x' || *q == 'X' || (*q >= 'a' && *q <= 'f') ||
              (*q >= 'A' && *q <= 'F')))
            return NAN;
    if ((p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) && sign == -1 && buf[0] == '-')
        return NAN; /* "-0x10" is NaN in JavaScript */
    char *end;
    double d = strtod(buf, &end);
    if (*end)
        return NAN;
    return d;
}

static double num_of(jval v)
{
    return v.t == V_INT ? (double)v.u.i : v.t == V_FLOAT ? v.u.f : v.u.b ? 1 : 0;
}

/* JavaScript's === on the reference's raw payloads. */
bool jz_strict_eq(jval a, jval b)
{
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == V_INT && b.t == V_INT)
            return a.u.i == b.u.i;
        return num_of(a) == num_of(b);
    }
    if (a.t != b.t) {
        /* array and tuple values share a payload kind */
        if (!(jv_is_arr(a) && jv_is_arr(b)) && !(jv_is_obj(a) && jv_is_obj(b)))
            return false;
    }
    switch (a.t) {
    case V_UNDEF:
    case V_NULL: return true;
    case V_BOOL: return a.u.b == b.u.b;
    case V_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case V_ARR:
    case V_TUPLE: return a.u.a == b.u.a;
    case V_OBJ:
    case V_KWARGS:
    case V_NS: return a.u.o == b.u.o;
    case V_FN: return a.u.fn == b.u.fn;
    default: return false;
    }
}

static bool is_primitive(jval v) { return v.t <= V_STR; }

/* JavaScript's == on the raw payloads (the reference compares .value). */
bool jz_loose_eq(jz_ctx *c, jval a, jval b)
{
    bool an = a.t == V_UNDEF || a.t == V_NULL, bn = b.t == V_UNDEF || b.t == V_NULL;
    if (an || bn)
        return an && bn;
    if (a.t == b.t || (jv_is_num(a) && jv_is_num(b)) || (!is_primitive(a) && !is_primitive(b)))
        return jz_strict_eq(a, b);
    /* objects turn into their string form first */
    if (!is_primitive(a) || !is_primitive(b)) {
        jval o = !is_primitive(a) ? a : b, p = !is_primitive(a) ? b : a;
        jsb sb;
        jsb_init(c, &sb, 0);
        jv_raw_string(c, o, &sb);
        return jz_loose_eq(c, jv_strv(jsb_str(c, &sb)), p);
    }
    if (a.t == V_BOOL)
        return jz_loose_eq(c, jv_float(a.u.b), b);
    if (b.t == V_BOOL)
        return jz_loose_eq(c, a, jv_float(b.u.b));
    /* number vs string */
    double x = a.t == V_STR ? js_to_number(a.u.s) : num_of(a);
    double y = b.t == V_STR ? js_to_number(b.u.s) : num_of(b);
    return x == y;
}

/* JavaScript's < on (lower-cased unless cs) strings.  UTF-8 byte order is
 * code point order, which differs from UTF-16 order only between U+E000..FFFF
 * and the astral planes. */
static int str_cmp(jrt *r, jval a, jval b, bool cs)
{
    if (!cs) {
        a = jz_map_case(r, a, false);
        b = jz_map_case(r, b, false);
    }
    size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
    int c = memcmp(a.u.s->s, b.u.s->s, n);
    if (c)
        return c < 0 ? -1 : 1;
    return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len ? 1 : 0;
}

int jz_compare(jrt *r, const jnode *at, jval a, jval b, bool cs)
{
    if (a.t == V_NULL && b.t == V_NULL)
        return 0;
    if (a.t == V_NULL || b.t == V_NULL)
        jz_rt_fail(r, at, "Cannot compare %s with %s", jv_type_name(a), jv_type_name(b));
    if (a.t == V_UNDEF && b.t == V_UNDEF)
        return 0;
    if (a.t == V_UNDEF || b.t == V_UNDEF)
        jz_rt_fail(r, at, "Cannot compare %s with %s", jv_type_name(a), jv_type_name(b));
    bool na = jv_is_num(a) || a.t == V_BOOL, nb = jv_is_num(b) || b.t == V_BOOL;
    if (na && nb) {
        double x = num_of(a), y = num_of(b);
        if (a.t == V_INT && b.t == V_INT)
            return a.u.i < b.u.i ? -1 : a.u.i > b.u.i ? 1 : 0;
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.t != b.t)
        jz_rt_fail(r, at, "Cannot compare different types: %s and %s", jv_type_name(a),
                   jv_type_name(b));
    if (a.t == V_STR)
        return str_cmp(r, a, b, cs);
    jz_rt_fail(r, at, "Cannot compare type: %s", jv_type_name(a));
}

/* ---------------- evaluation ---------------- */

static jval eval(jrt *r, const jnode *x, jenv *env);
static int exec(jrt *r, const jlist *body, jenv *env, jsb *out);

static void enter(jrt *r, const jnode *at)
{
    if (++r->depth > r->opts->max_depth)
        jz_rt_fail(r, at, "nesting depth limit of %u exceeded", r->opts->max_depth);
}

static jstr *render_block(jrt *r, const jlist *body, jenv *env, const jnode *at)
{
    jsb sb;
    jsb_init(&r->c, &sb, r->opts->max_output);
    int rc = exec(r, body, env, &sb);
    if (rc != RC_OK)
        jz_rt_fail(r, at, "%s outside of a loop", rc == RC_BREAK ? "break" : "continue");
    return jsb_str(&r->c, &sb);
}

jval jz_eval_args(jrt *r, const jlist *args, jenv *env, jval **argv, size_t *argc)
{
    jval pos = jv_arr(&r->c, args->n);
    for (size_t i = 0; i < args->n; i++) {
        const jnode *a = args->v[i];
        if (a->type == N_SPREAD) {
            jval v = eval(r, a->a, env);
            if (!jv_is_arr(v))
                jz_rt_fail(r, a, "Cannot unpack non-iterable type: %s", jv_type_name(v));
            for (size_t k = 0; k < v.u.a->n; k++)
                jarr_push(&r->c, pos.u.a, v.u.a->v[k]);
        } else if (a->type != N_KWARG && a->type != N_KWSPREAD) {
            jarr_push(&r->c, pos.u.a, eval(r, a, env));
        }
    }
    jval kw = jv_obj(&r->c, 0);
    kw.t = V_KWARGS;
    for (size_t i = 0; i < args->n; i++) {
        const jnode *a = args->v[i];
        if (a->type == N_KWARG) {
            if (jobj_get(kw.u.o, a->s->s, a->s->len))
                jz_rt_fail(r, a, "Got multiple values for keyword argument '%s'", a->s->s);
            jobj_set(&r->c, kw.u.o, a->s, eval(r, a->a, env));
        } else if (a->type == N_KWSPREAD) {
            jval v = eval(r, a->a, env);
            if (!jv_is_obj(v))
                jz_rt_fail(r, a, "Argument after ** must be a mapping, not %s", jv_type_name(v));
            for (size_t k = 0; k < v.u.o->n; k++) {
                if (jobj_get(kw.u.o, v.u.o->k[k]->s, v.u.o->k[k]->len))
                    jz_rt_fail(r, a, "Got multiple values for keyword argument '%s'",
                               v.u.o->k[k]->s);
                jobj_set(&r->c, kw.u.o, v.u.o->k[k], v.u.o->v[k]);
            }
        }
    }
    *argv = pos.u.a->v;
    *argc = pos.u.a->n;
    return kw;
}

/* Binds a macro's (or a call block's) parameters in scope. */
static void bind_params(jrt *r, const jnode *at, const char *name, const jlist *params,
                        int specials, jval *args, size_t nargs, jenv *scope)
{
    jobj *kw = NULL;
    if (nargs && args[nargs - 1].t == V_KWARGS) {
        kw = args[nargs - 1].u.o;
        nargs--;
    }
    bool *used = kw && kw->n ? jz_alloc(&r->c, kw->n * sizeof(bool)) : NULL;
    if (used)
        memset(used, 0, kw->n * sizeof(bool));
    const jnode **pending = jz_alloc(&r->c, (params->n ? params->n : 1) * sizeof(jnode *));
    size_t npend = 0;
    for (size_t i = 0; i < params->n; i++) {
        const jnode *p = params->v[i];
        const char *pname = p->s->s;
        jval v = jv_undef();
        bool have = false;
        if (i < nargs) {
            v = args[i];
            have = true;
        }
        if (!have && kw) {
            for (size_t k = 0; k < kw->n; k++) {
                if (!used[k] && !strcmp(kw->k[k]->s, pname)) {
                    v = kw->v[k];
                    used[k] = true;
                    have = true;
                    break;
                }
            }
        }
        if (!have && p->type == N_KWARG)
            pending[npend++] = p;
        env_set(r, scope, pname, v);
    }
    size_t left = 0;
    for (size_t k = 0; kw && k < kw->n; k++)
        left += !used[k];
    if (specials & 1) {
        jval o = jv_obj(&r->c, left);
        for (size_t k = 0; kw && k < kw->n; k++)
            if (!used[k])
                jobj_set(&r->c, o.u.o, kw->k[k], kw->v[k]);
        env_set(r, scope, "kwargs", o);
    } else if (left) {
        for (size_t k = 0; k < kw->n; k++)
            if (!used[k])
                jz_rt_fail(r, at, "macro %s takes no keyword argument '%s'", name, kw->k[k]->s);
    }
    if (specials & 2) {
        jval a = jv_arr(&r->c, 0);
        for (size_t i = params->n; i < nargs; i++)
            jarr_push(&r->c, a.u.a, args[i]);
        env_set(r, scope, "varargs", a);
    } else if (nargs > params->n) {
        jz_rt_fail(r, at, "macro %s takes not more than %zu argument(s)", name, params->n);
    }
    for (size_t i = 0; i < npend; i++)
        env_set(r, scope, pending[i]->s->s, eval(r, pending[i]->a, scope));
}

jval jz_call(jrt *r, const jnode *at, jval fv, jval *args, size_t nargs, jenv *env)
{
    if (fv.t != V_FN)
        jz_rt_fail(r, at, "Cannot call something that is not a function: got %s",
                   jv_type_name(fv));
    jfn *fn = fv.u.fn;
    jz_step(r, at);
    enter(r, at);
    jval out = jv_undef();
    if (fn->fn) {
        fn->fn(r, at, fn->self, args, nargs, &out);
    } else if (fn->macro->type == N_MACRO) {
        jenv *scope = env_new(r, env);
        char name[80];
        snprintf(name, sizeof name, "'%.64s'", fn->macro->s->s);
        bind_params(r, at, name, &fn->macro->l2, (int)fn->macro->i, args, nargs, scope);
        out = jv_strv(render_block(r, &fn->macro->l1, scope, at));
    } else {
        /* caller() of a call block: runs where the call block stands */
        jenv *scope = env_new(r, fn->closure);
        bind_params(r, at, "None", &fn->macro->l2, (int)fn->macro->i, args, nargs, scope);
        out = jv_strv(render_block(r, &fn->macro->l1, scope, at));
    }
    r->depth--;
    return out;
}

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}

static jval eval_binary(jrt *r, const jnode *x, jenv *env)
{
    jval l = eval(r, x->a, env);
    if (x->op == OP_AND)
        return jv_truthy(l) ? eval(r, x->b, env) : l;
    if (x->op == OP_OR)
        return jv_truthy(l) ? l : eval(r, x->b, env);
    jval rv = eval(r, x->b, env);
    jz_ctx *c = &r->c;
    if (x->op == OP_EQ)
        return jv_bool(jz_loose_eq(c, l, rv));
    if (x->op == OP_NE)
        return jv_bool(!jz_loose_eq(c, l, rv));
    if (l.t == V_UNDEF || rv.t == V_UNDEF) {
        if (rv.t == V_UNDEF && (x->op == OP_IN || x->op == OP_NOTIN))
            return jv_bool(x->op == OP_NOTIN);
        jz_rt_fail(r, x, "Cannot perform operation on undefined values");
    }
    if (l.t == V_NULL || rv.t == V_NULL)
        jz_rt_fail(r, x, "Cannot perform operation on null values");
    if (x->op == OP_CONCAT) {
        jsb sb;
        jsb_init(c, &sb, r->opts->max_output);
        jv_raw_string(c, l, &sb);
        jv_raw_string(c, rv, &sb);
        return jv_strv(jsb_str(c, &sb));
    }
    bool ln = jv_is_num(l) || l.t == V_BOOL, rn = jv_is_num(rv) || rv.t == V_BOOL;
    if (x->op == OP_POW && ln && rn) {
        double a = num_of(l), b = num_of(rv);
        if (a == 0 && b < 0)
            jz_rt_fail(r, x, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (!isfinite(res))
            jz_rt_fail(r, x, "Exponentiation result is not a finite real number");
        if (l.t == V_FLOAT || rv.t == V_FLOAT || b < 0 || fabs(res) >= 9.2e18)
            return jv_float(res);
        return jv_int((int64_t)res);
    }
    if (jv_is_num(l) && jv_is_num(rv)) {
        bool fl = l.t == V_FLOAT || rv.t == V_FLOAT;
        double a = num_of(l), b = num_of(rv);
        int64_t ia = l.u.i, ib = rv.u.i, ir;
        switch (x->op) {
        case OP_ADD:
        case OP_SUB:
        case OP_MUL:
            if (!fl) {
                bool ovf = x->op == OP_ADD   ? __builtin_add_overflow(ia, ib, &ir)
                           : x->op == OP_SUB ? __builtin_sub_overflow(ia, ib, &ir)
                                             : __builtin_mul_overflow(ia, ib, &ir);
                if (ovf)
                    jz_rt_fail(r, x, "integer overflow");
                return jv_int(ir);
            }
            return jv_float(x->op == OP_ADD ? a + b : x->op == OP_SUB ? a - b : a * b);
        case OP_DIV:
            /* divergence: the reference yields Infinity/NaN; we report the error */
            if (b == 0)
                jz_rt_fail(r, x, "division by zero");
            return jv_float(a / b);
        case OP_FLOORDIV:
            if (b == 0)
                jz_rt_fail(r, x, "division by zero");
            if (!fl) {
                if (ia == INT64_MIN && ib == -1)
                    jz_rt_fail(r, x, "integer overflow");
                return jv_int(floor_div(ia, ib));
            }
            return jv_float(floor(a / b));
        case OP_MOD:
            if (b == 0)
                jz_rt_fail(r, x, "modulo by zero");
            /* JavaScript's %: the sign follows the dividend */
            if (!fl)
                return jv_int(ib == -1 ? 0 : ia % ib);
            return jv_float(fmod(a, b));
        case OP_LT: return jv_bool(a < b);
        case OP_GT: return jv_bool(a > b);
        case OP_LE: return jv_bool(a <= b);
        case OP_GE: return jv_bool(a >= b);
        default: break;
        }
    } else if (jv_is_arr(l) && jv_is_arr(rv)) {
        if (x->op == OP_ADD) {
            jval a = jv_arr(c, l.u.a->n + rv.u.a->n);
            for (size_t i = 0; i < l.u.a->n; i++)
                a.u.a->v[a.u.a->n++] = l.u.a->v[i];
            for (size_t i = 0; i < rv.u.a->n; i++)
                a.u.a->v[a.u.a->n++] = rv.u.a->v[i];
            return a;
        }
    } else if (jv_is_arr(rv)) {
        if (x->op == OP_IN || x->op == OP_NOTIN) {
            bool found = false;
            for (size_t i = 0; i < rv.u.a->n && !found; i++)
                found = jz_strict_eq(rv.u.a->v[i], l);
            return jv_bool(found == (x->op == OP_IN));
        }
    }
    if ((l.t == V_STR || rv.t == V_STR) && x->op == OP_ADD) {
        jsb sb;
        jsb_init(c, &sb, r->opts->max_output);
        jv_raw_string(c, l, &sb);
        jv_raw_string(c, rv, &sb);
        return jv_strv(jsb_str(c, &sb));
    }
    if (l.t == V_STR && rv.t == V_STR && (x->op == OP_IN || x->op == OP_NOTIN)) {
        bool found = memmem(rv.u.s->s, rv.u.s->len, l.u.s->s, l.u.s->len) != NULL ||
                     l.u.s->len == 0;
        return jv_bool(found == (x->op == OP_IN));
    }
    if (l.t == V_STR && jv_is_obj(rv) && (x->op == OP_IN || x->op == OP_NOTIN)) {
        bool found = jobj_get(rv.u.o, l.u.s->s, l.u.s->len) != NULL;
        return jv_bool(found == (x->op == OP_IN));
    }
    static const char *const names[] = {"", "+", "-", "~", "*", "/", "//", "%", "**", "==", "!=",
                                        "<", ">", "<=", ">=", "and", "or", "in", "not in"};
    jz_rt_fail(r, x, "Unknown operator \"%s\" between %s and %s",
               x->op < sizeof names / sizeof names[0] ? names[x->op] : "?", jv_type_name(l),
               jv_type_name(rv));
}

/* Python-style slice with the reference's clamping rules. */
static void slice_bounds(int64_t len, const jval *st, const jval *sp, int64_t step,
                         int64_t *start, int64_t *stop)
{
    if (step >= 0) {
        int64_t s = st->t == V_INT ? st->u.i : 0;
        int64_t e = sp->t == V_INT ? sp->u.i : len;
        *start = s < 0 ? (len + s > 0 ? len + s : 0) : (s < len ? s : len);
        *stop = e < 0 ? (len + e > 0 ? len + e : 0) : (e < len ? e : len);
    } else {
        int64_t s = st->t == V_INT ? st->u.i : len - 1;
        int64_t e = sp->t == V_INT ? sp->u.i : -1;
        *start = s < 0 ? (len + s > -1 ? len + s : -1) : (s < len - 1 ? s : len - 1);
        *stop = e < -1 ? (len + e > -1 ? len + e : -1) : (e < len - 1 ? e : len - 1);
    }
}

static jval eval_slice(jrt *r, const jnode *x, jval obj, jenv *env)
{
    if (!jv_is_arr(obj) && obj.t != V_STR)
        jz_rt_fail(r, x, "Slice object must be an array or string");
    jval st = x->a ? eval(r, x->a, env) : jv_undef();
    jval sp = x->b ? eval(r, x->b, env) : jv_undef();
    jval se = x->c ? eval(r, x->c, env) : jv_undef();
    if ((st.t != V_INT && st.t != V_UNDEF) || (sp.t != V_INT && sp.t != V_UNDEF) ||
        (se.t != V_INT && se.t != V_UNDEF))
        jz_rt_fail(r, x, "Slice indices must be integers or undefined");
    int64_t step = se.t == V_INT ? se.u.i : 1;
    jz_ctx *c = &r->c;
    /* strings slice by code point */
    size_t n;
    size_t *offs = NULL;
    if (obj.t == V_STR) {
        n = 0;
        offs = jz_alloc(c, (obj.u.s->len + 1) * sizeof(size_t));
        for (size_t i = 0; i < obj.u.s->len;) {
            uint32_t cp;
            offs[n++] = i;
            i += jz_utf8_dec(obj.u.s->s + i, obj.u.s->len - i, &cp);
        }
        offs[n] = obj.u.s->len;
    } else {
        n = obj.u.a->n;
    }
    int64_t start, stop;
    slice_bounds((int64_t)n, &st, &sp, step, &start, &stop);
    int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
    if (obj.t == V_STR) {
        jsb sb;
        jsb_init(c, &sb, r->opts->max_output);
        for (int64_t i = start; step != 0 && dir * i < dir * stop; i += step) {
            if (i < 0 || (size_t)i >= n)
                continue;
            jsb_add(c, &sb, obj.u.s->s + offs[i], offs[i + 1] - offs[i]);
        }
        return jv_strv(jsb_str(c, &sb));
    }
    jval a = jv_arr(c, 0);
    for (int64_t i = start; step != 0 && dir * i < dir * stop; i += step) {
        /* the clamping keeps i in range */
        if (i >= 0 && (size_t)i < n)
            jarr_push(c, a.u.a, obj.u.a->v[i]);
    }
    return a;
}

static jval eval_member(jrt *r, const jnode *x, jenv *env)
{
    jval obj = eval(r, x->a, env);
    jval prop;
    if (x->flag) {
        if (x->b->type == N_SLICE)
            return eval_slice(r, x->b, obj, env);
        prop = eval(r, x->b, env);
    } else if (x->b->type == N_INT) {
        prop = jv_int(x->b->i);
    } else {
        prop = jv_strv(x->b->s);
    }
    jval out;
    if (jv_is_obj(obj) || obj.t == V_NS) {
        if (prop.t != V_STR)
            jz_rt_fail(r, x, "Cannot access property with non-string: got %s", jv_type_name(prop));
        jval *v = jobj_get(obj.u.o, prop.u.s->s, prop.u.s->len);
        if (v)
            return *v;
        if (obj.t != V_NS && jz_builtin_member(r, x, obj, prop.u.s->s, &out))
            return out;
        return jv_undef();
    }
    if (jv_is_arr(obj) || obj.t == V_STR) {
        if (prop.t == V_INT) {
            if (obj.t == V_STR) {
                /* divergence: indexes code points, the reference UTF-16 units */
                size_t cps = 0, i = 0;
                size_t *offs = jz_alloc(&r->c, (obj.u.s->len + 1) * sizeof(size_t));
                while (i < obj.u.s->len) {
                    uint32_t cp;
                    offs[cps++] = i;
                    i += jz_utf8_dec(obj.u.s->s + i, obj.u.s->len - i, &cp);
                }
                offs[cps] = obj.u.s->len;
                int64_t k = prop.u.i < 0 ? (int64_t)cps + prop.u.i : prop.u.i;
                if (k < 0 || k >= (int64_t)cps)
                    return jv_undef();
                return jv_str(&r->c, obj.u.s->s + offs[k], offs[k + 1] - offs[k]);
            }
            int64_t n = (int64_t)obj.u.a->n;
            int64_t k = prop.u.i < 0 ? n + prop.u.i : prop.u.i;
            if (k < 0 || k >= n)
                return jv_undef();
            return obj.u.a->v[k];
        }
        if (prop.t == V_STR) {
            if (jz_builtin_member(r, x, obj, prop.u.s->s, &out))
                return out;
            return jv_undef();
        }
        jz_rt_fail(r, x, "Cannot access property with non-string/non-number: got %s",
                   jv_type_name(prop));
    }
    if (prop.t != V_STR)
        jz_rt_fail(r, x, "Cannot access property with non-string: got %s", jv_type_name(prop));
    if (jz_builtin_member(r, x, obj, prop.u.s->s, &out))
        return out;
    return jv_undef();
}

static jval eval(jrt *r, const jnode *x, jenv *env)
{
    jz_step(r, x);
    enter(r, x);
    jval v;
    jz_ctx *c = &r->c;
    switch (x->type) {
    case N_INT: v = jv_int(x->i); break;
    case N_FLOAT: v = jv_float(x->f); break;
    case N_STR:
    case N_TEXT: v = jv_strv(x->s); break;
    case N_ARRAY:
    case N_TUPLE:
        v = jv_arr(c, x->l1.n);
        if (x->type == N_TUPLE)
            v.t = V_TUPLE;
        for (size_t i = 0; i < x->l1.n; i++)
            v.u.a->v[v.u.a->n++] = eval(r, x->l1.v[i], env);
        break;
    case N_OBJECT:
        v = jv_obj(c, x->l1.n);
        for (size_t i = 0; i < x->l1.n; i++) {
            jval k = eval(r, x->l1.v[i], env);
            if (k.t != V_STR)
                jz_rt_fail(r, x->l1.v[i], "Object keys must be strings: got %s", jv_type_name(k));
            jobj_set(c, v.u.o, k.u.s, eval(r, x->l2.v[i], env));
        }
        break;
    case N_IDENT: {
        jval *p = env_get(env, x->s->s);
        v = p ? *p : jv_undef();
        break;
    }
    case N_MEMBER: v = eval_member(r, x, env); break;
    case N_CALL: {
        jval *argv;
        size_t argc;
        jval kw = jz_eval_args(r, &x->l1, env, &argv, &argc);
        jval *all = jz_alloc(c, (argc + 1) * sizeof(jval));
        if (argc)
            memcpy(all, argv, argc * sizeof(jval));
        if (kw.u.o->n)
            all[argc++] = kw;
        jval fn = eval(r, x->a, env);
        v = jz_call(r, x, fn, all, argc, env);
        break;
    }
    case N_UNARY: {
        jval a = eval(r, x->a, env);
        if (x->op == OP_NOT) {
            v = jv_bool(!jv_truthy(a));
        } else if (jv_is_num(a) || a.t == V_BOOL) {
            int sign = x->op == OP_NEG ? -1 : 1;
            if (a.t == V_FLOAT) {
                v = jv_float(sign * a.u.f);
            } else {
                int64_t i = a.t == V_BOOL ? a.u.b : a.u.i;
                if (sign < 0 && i == INT64_MIN)
                    jz_rt_fail(r, x, "integer overflow");
                v = jv_int(sign * i);
            }
        } else {
            jz_rt_fail(r, x, "Unknown operator \"%c\" for %s", x->op == OP_NEG ? '-' : '+',
                       jv_type_name(a));
        }
        break;
    }
    case N_BINARY: v = eval_binary(r, x, env); break;
    case N_FILTER: {
        jval operand = eval(r, x->a, env);
        v = jz_apply_filter(r, x->b, operand, env);
        break;
    }
    case N_TEST: {
        jval operand = eval(r, x->a, env);
        jval *argv = NULL;
        size_t argc = 0;
        if (x->l1.n)
            jz_eval_args(r, &x->l1, env, &argv, &argc);
        bool res = jz_run_test(r, x, x->s->s, operand, argv, argc);
        v = jv_bool(x->flag ? !res : res);
        break;
    }
    case N_SELECT:
        v = jv_truthy(eval(r, x->b, env)) ? eval(r, x->a, env) : jv_undef();
        break;
    case N_TERNARY:
        v = jv_truthy(eval(r, x->a, env)) ? eval(r, x->b, env) : eval(r, x->c, env);
        break;
    case N_SLICE: jz_rt_fail(r, x, "slice outside of a subscript");
    case N_KWARG:
    case N_SPREAD:
    case N_KWSPREAD: jz_rt_fail(r, x, "argument syntax outside of a call");
    default: jz_rt_fail(r, x, "statement used as an expression");
    }
    r->depth--;
    return v;
}

/* ---------------- statements ---------------- */

static void assign(jrt *r, const jnode *target, jval v, jenv *env, const char *what)
{
    if (target->type == N_IDENT) {
        env_set(r, env, target->s->s, v);
        return;
    }
    if (target->type == N_TUPLE) {
        if (!jv_is_arr(v))
            jz_rt_fail(r, target, "Cannot unpack non-iterable type in %s: %s", what,
                       jv_type_name(v));
        if (v.u.a->n != target->l1.n)
            jz_rt_fail(r, target, "Too %s items to unpack in %s",
                       target->l1.n > v.u.a->n ? "few" : "many", what);
        for (size_t i = 0; i < target->l1.n; i++) {
            if (target->l1.v[i]->type != N_IDENT)
                jz_rt_fail(r, target->l1.v[i], "Cannot unpack to non-identifier in %s", what);
            env_set(r, env, target->l1.v[i]->s->s, v.u.a->v[i]);
        }
        return;
    }
    jz_rt_fail(r, target, "Invalid assignment target in %s", what);
}

static void exec_set(jrt *r, const jnode *x, jenv *env)
{
    jval rhs = x->b ? eval(r, x->b, env) : jv_strv(render_block(r, &x->l1, env, x));
    const jnode *t = x->a;
    if (t->type == N_MEMBER) {
        jval obj = eval(r, t->a, env);
        if (obj.t != V_NS)
            jz_rt_fail(r, t, "cannot assign attribute on non-namespace object");
        if (t->b->type != N_IDENT)
            jz_rt_fail(r, t, "Cannot assign to member with non-identifier property");
        jobj_set(&r->c, obj.u.o, t->b->s, rhs);
        return;
    }
    assign(r, t, rhs, env, "set");
}

static int exec_for(jrt *r, const jnode *x, jenv *env, jsb *out)
{
    jz_ctx *c = &r->c;
    jenv *scope = env_new(r, env);
    const jnode *test = NULL;
    jval it;
    if (x->b->type == N_SELECT) {
        it = eval(r, x->b->a, scope);
        test = x->b->b;
    } else {
        it = eval(r, x->b, scope);
    }
    if (!jv_is_arr(it) && !jv_is_obj(it))
        jz_rt_fail(r, x->b, "Expected iterable or object type in for loop: got %s",
                   jv_type_name(it));
    if (jv_is_obj(it)) {
        jval keys = jv_arr(c, it.u.o->n);
        for (size_t i = 0; i < it.u.o->n; i++)
            keys.u.a->v[keys.u.a->n++] = jv_strv(it.u.o->k[i]);
        it = keys;
    }
    jarr *src = it.u.a;
    jval items = jv_arr(c, src->n);
    for (size_t i = 0; i < src->n; i++) {
        jval cur = src->v[i];
        if (x->a->type == N_TUPLE) {
            if (!jv_is_arr(cur))
                jz_rt_fail(r, x->a, "Cannot unpack non-iterable type: %s", jv_type_name(cur));
            if (cur.u.a->n != x->a->l1.n)
                jz_rt_fail(r, x->a, "Too %s items to unpack",
                           x->a->l1.n > cur.u.a->n ? "few" : "many");
        }
        if (test) {
            jz_step(r, x);
            jenv *ls = env_new(r, scope);
            assign(r, x->a, cur, ls, "for");
            if (!jv_truthy(eval(r, test, ls)))
                continue;
        }
        items.u.a->v[items.u.a->n++] = cur;
    }
    size_t n = items.u.a->n;
    bool none = true;
    for (size_t i = 0; i < n; i++) {
        jz_step(r, x);
        /* one allocation per iteration; the key array is shared by every loop
         * object (nothing can add keys to it: only namespaces are assignable) */
        jobj *lo = jz_alloc(c, sizeof(jobj) + 9 * sizeof(jval));
        lo->v = (jval *)(lo + 1);
        lo->k = r->loop_keys;
        lo->n = lo->cap = 9;
        lo->v[0] = jv_int((int64_t)i + 1);
        lo->v[1] = jv_int((int64_t)i);
        lo->v[2] = jv_int((int64_t)(n - i));
        lo->v[3] = jv_int((int64_t)(n - i - 1));
        lo->v[4] = jv_bool(i == 0);
        lo->v[5] = jv_bool(i == n - 1);
        lo->v[6] = jv_int((int64_t)n);
        lo->v[7] = i > 0 ? items.u.a->v[i - 1] : jv_undef();
        lo->v[8] = i + 1 < n ? items.u.a->v[i + 1] : jv_undef();
        jval loop = {.t = V_OBJ};
        loop.u.o = lo;
        env_set(r, scope, "loop", loop);
        assign(r, x->a, items.u.a->v[i], scope, "for");
        size_t mark = out->len;
        int rc = exec(r, &x->l1, scope, out);
        if (rc != RC_OK) {
            /* the reference drops what the interrupted iteration printed */
            out->len = mark;
            if (out->p)
                out->p[mark] = '\0';
            if (rc == RC_CONTINUE)
                continue;
            break;
        }
        none = false;
    }
    if (none)
        return exec(r, &x->l2, scope, out);
    return RC_OK;
}

static void emit(jrt *r, jval v, jsb *out)
{
    if (v.t == V_NULL || v.t == V_UNDEF)
        return;
    jv_to_string(&r->c, v, out);
}

static int exec(jrt *r, const jlist *body, jenv *env, jsb *out)
{
    enter(r, NULL);
    for (size_t i = 0; i < body->n; i++) {
        const jnode *x = body->v[i];
        int rc = RC_OK;
        switch (x->type) {
        case N_TEXT: jsb_add(&r->c, out, x->s->s, x->s->len); break;
        case N_COMMENT: break;
        case N_IF:
            jz_step(r, x);
            rc = exec(r, jv_truthy(eval(r, x->a, env)) ? &x->l1 : &x->l2, env, out);
            break;
        case N_FOR: rc = exec_for(r, x, env, out); break;
        case N_BREAK: rc = RC_BREAK; break;
        case N_CONTINUE: rc = RC_CONTINUE; break;
        case N_SET: exec_set(r, x, env); break;
        case N_MACRO: {
            jfn *fn = jz_alloc(&r->c, sizeof(jfn));
            memset(fn, 0, sizeof *fn);
            fn->name = x->s->s;
            fn->macro = x;
            jval v = {.t = V_FN};
            v.u.fn = fn;
            env_set(r, env, x->s->s, v);
            break;
        }
        case N_CALLSTMT: {
            jfn *cf = jz_alloc(&r->c, sizeof(jfn));
            memset(cf, 0, sizeof *cf);
            cf->name = "caller";
            cf->macro = x;
            cf->closure = env;
            jval cv = {.t = V_FN};
            cv.u.fn = cf;
            jval *argv;
            size_t argc;
            jval kw = jz_eval_args(r, &x->a->l1, env, &argv, &argc);
            jval *all = jz_alloc(&r->c, (argc + 1) * sizeof(jval));
            if (argc)
                memcpy(all, argv, argc * sizeof(jval));
            all[argc++] = kw;
            jval fn = eval(r, x->a->a, env);
            if (fn.t != V_FN)
                jz_rt_fail(r, x, "Cannot call something that is not a function: got %s",
                           jv_type_name(fn));
            jenv *ne = env_new(r, env);
            env_set(r, ne, "caller", cv);
            emit(r, jz_call(r, x, fn, all, argc, ne), out);
            break;
        }
        case N_FILTERSTMT: {
            jval body_str = jv_strv(render_block(r, &x->l1, env, x));
            emit(r, jz_apply_filter(r, x->a, body_str, env), out);
            break;
        }
        default: emit(r, eval(r, x, env), out); break;
        }
        if (rc != RC_OK) {
            r->depth--;
            return rc;
        }
    }
    r->depth--;
    return RC_OK;
}

/* ---------------- public API ---------------- */

/* setjmp lives in these two helpers so that no local of the public entry
 * points changes between setjmp and longjmp */
static int parse_into(mr_jinja_tmpl *t)
{
    if (setjmp(t->c.jb))
        return -1;
    jtok *toks;
    size_t n;
    jz_tokenize(&t->c, t->src, t->len, &toks, &n);
    t->body = jz_parse(&t->c, toks, n, 1024);
    return 0;
}

mr_jinja_tmpl *mr_jinja_parse(const char *src, size_t len, mr_err *err)
{
    mr_jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) {
        mr_errf(err, "out of memory");
        return NULL;
    }
    t->src = malloc(len + 1);
    if (!t->src) {
        free(t);
        mr_errf(err, "out of memory");
        return NULL;
    }
    if (len)
        memcpy(t->src, src, len);
    t->src[len] = '\0';
    t->len = len;
    t->c.err = err;
    t->c.src = t->src;
    t->c.src_len = len;
    /* parsing needs a bounded multiple of the template size */
    t->c.arena.limit = 64 * (len + 1024) + (1u << 20);
    if (parse_into(t) != 0) {
        mr_jinja_free(t);
        return NULL;
    }
    t->c.err = NULL;
    return t;
}

void mr_jinja_free(mr_jinja_tmpl *t)
{
    if (!t)
        return;
    jz_arena_free(&t->c.arena);
    free(t->src);
    free(t);
}

static int render_into(jrt *r, const mr_jinja_tmpl *t, const json_t *vars, jsb *sb)
{
    if (setjmp(r->c.jb))
        return -1;
    jz_ctx *c = &r->c;
    static const char *const loop_keys[9] = {"index", "index0", "revindex", "revindex0", "first",
                                             "last", "length", "previtem", "nextitem"};
    for (int i = 0; i < 9; i++)
        r->loop_keys[i] = jz_cstr(c, loop_keys[i]);
    jenv *g = env_new(r, NULL);
    jz_add_globals(r, g);
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v)
        {
            if (env_get(g, k))
                jz_fail(c, SIZE_MAX, "Variable already declared: %s", k);
            jstr *name = jz_cstr(c, k);
            env_set(r, g, name->s, jv_from_json(c, v, 0));
        }
    }
    jsb_init(c, sb, r->opts->max_output);
    int rc = exec(r, &t->body, g, sb);
    if (rc != RC_OK)
        jz_fail(c, SIZE_MAX, "%s outside of a loop", rc == RC_BREAK ? "break" : "continue");
    return 0;
}

int mr_jinja_render(const mr_jinja_tmpl *t, const json_t *vars, const mr_jinja_opts *opts,
                    char **out, size_t *out_len, mr_err *err)
{
    mr_jinja_opts def;
    if (!opts) {
        mr_jinja_opts_default(&def);
        opts = &def;
    }
    *out = NULL;
    *out_len = 0;
    if (vars && !json_is_object(vars))
        return mr_errf(err, "template variables must be a JSON object");
    jrt *r = calloc(1, sizeof *r);
    if (!r)
        return mr_errf(err, "out of memory");
    r->opts = opts;
    r->c.err = err;
    r->c.src = t->src;
    r->c.src_len = t->len;
    r->c.arena.limit = opts->max_memory;
    jsb sb = {0};
    int rc = render_into(r, t, vars, &sb);
    if (rc == 0) {
        *out = malloc(sb.len + 1);
        if (*out) {
            if (sb.len)
                memcpy(*out, sb.p, sb.len);
            (*out)[sb.len] = '\0';
            *out_len = sb.len;
        } else {
            rc = mr_errf(err, "out of memory");
        }
    }
    jz_arena_free(&r->c.arena);
    free(r);
    return rc;
}

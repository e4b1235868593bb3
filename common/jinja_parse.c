/* Jinja engine: recursive-descent parser.  The grammar and its precedence
 * follow @huggingface/jinja (filters bind tighter than tests, tests tighter
 * than arithmetic; `not` sits above comparisons; `a if c` without else is a
 * select expression, used by `for x in xs if c`). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"

typedef struct parser {
    jz_ctx *c;
    jtok *t;
    size_t n, cur;
    unsigned depth, max_depth;
} parser;

typedef struct vec {
    size_t n, cap;
    jnode **v;
} vec;

static void vpush(parser *P, vec *v, jnode *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = jz_alloc(P->c, cap * sizeof(jnode *));
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof(jnode *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static jlist vlist(vec *v)
{
    jlist l = {v->n, v->v};
    return l;
}

static size_t here(parser *P)
{
    if (P->cur < P->n)
        return P->t[P->cur].pos;
    return P->n ? P->t[P->n - 1].pos : 0;
}

static _Noreturn void perr(parser *P, const char *msg)
{
    jz_fail(P->c, here(P), "syntax error: %s", msg);
}

static jnode *mk(parser *P, jnode_type t, size_t pos)
{
    jnode *x = jz_alloc(P->c, sizeof(jnode));
    memset(x, 0, sizeof *x);
    x->type = t;
    x->pos = pos;
    return x;
}

static bool is(parser *P, jtok_type t) { return P->cur < P->n && P->t[P->cur].type == t; }

static bool is_ident(parser *P, const char *name)
{
    return P->cur < P->n && P->t[P->cur].type == T_IDENT && strcmp(P->t[P->cur].val->s, name) == 0;
}

static bool is_ident_at(parser *P, size_t k, const char *name)
{
    return P->cur + k < P->n && P->t[P->cur + k].type == T_IDENT &&
           strcmp(P->t[P->cur + k].val->s, name) == 0;
}

static bool is_stmt(parser *P, const char *a, const char *b, const char *c)
{
    if (!(P->cur + 1 < P->n && P->t[P->cur].type == T_OPEN_STMT &&
          P->t[P->cur + 1].type == T_IDENT))
        return false;
    const char *v = P->t[P->cur + 1].val->s;
    return (a && !strcmp(v, a)) || (b && !strcmp(v, b)) || (c && !strcmp(v, c));
}

static jtok *expect(parser *P, jtok_type t, const char *msg)
{
    if (!is(P, t))
        perr(P, msg);
    return &P->t[P->cur++];
}

static void expect_ident(parser *P, const char *name)
{
    if (!is_ident(P, name)) {
        char m[64];
        snprintf(m, sizeof m, "expected %s", name);
        perr(P, m);
    }
    P->cur++;
}

static void enter(parser *P)
{
    if (++P->depth > P->max_depth)
        perr(P, "template nested too deeply");
}

static jnode *parse_any(parser *P);
static jnode *parse_expression(parser *P);
static jnode *parse_primary(parser *P);
static jnode *parse_call(parser *P, jnode *callee);
static jnode *parse_member(parser *P, jnode *obj);
static jnode *parse_expr_seq(parser *P, bool primary);

static jlist parse_until(parser *P, const char *a, const char *b, const char *c)
{
    vec v = {0};
    while (!is_stmt(P, a, b, c)) {
        if (P->cur >= P->n) {
            const char *end = a;
            if (b && !strncmp(b, "end", 3))
                end = b;
            if (c && !strncmp(c, "end", 3))
                end = c;
            char m[96];
            snprintf(m, sizeof m, "unexpected end of template, expected {%% %s %%}", end);
            perr(P, m);
        }
        vpush(P, &v, parse_any(P));
    }
    return vlist(&v);
}

/* argument lists; mode 'p' = macro parameters, 'c' = call arguments */
static jlist parse_args(parser *P, char mode)
{
    expect(P, T_LPAREN, "expected ( for arguments list");
    vec v = {0};
    bool saw_kw = false, saw_spread = false;
    while (!is(P, T_RPAREN)) {
        if (P->cur >= P->n)
            perr(P, "expected )");
        size_t pos = here(P);
        bool kw_spread = is(P, T_POW);
        bool pos_spread = is(P, T_MUL) && !strcmp(P->t[P->cur].val->s, "*");
        if (mode == 'p' && (kw_spread || pos_spread))
            perr(P, "argument unpacking is not allowed in parameter declarations");
        if (kw_spread) {
            P->cur++;
            jnode *x = mk(P, N_KWSPREAD, pos);
            x->a = parse_expression(P);
            vpush(P, &v, x);
            if (is(P, T_COMMA))
                P->cur++;
            if (!is(P, T_RPAREN))
                perr(P, "`**` must be applied to the final argument");
            break;
        }
        jnode *arg;
        if (pos_spread) {
            if (saw_spread)
                perr(P, "only one `*` argument unpacking is allowed");
            saw_spread = true;
            P->cur++;
            arg = mk(P, N_SPREAD, pos);
            arg->a = parse_expression(P);
        } else {
            arg = parse_expression(P);
            if (is(P, T_EQUALS)) {
                P->cur++;
                if (arg->type != N_IDENT)
                    perr(P, "expected identifier for keyword argument");
                jnode *kw = mk(P, N_KWARG, arg->pos);
                kw->s = arg->s;
                kw->a = parse_expression(P);
                arg = kw;
            }
            if (mode == 'p') {
                if (arg->type != N_IDENT && arg->type != N_KWARG)
                    perr(P, "expected identifier for parameter declaration");
                for (size_t i = 0; i < v.n; i++)
                    if (!strcmp(v.v[i]->s->s, arg->s->s))
                        perr(P, "duplicate parameter name");
            }
            if (arg->type == N_KWARG)
                saw_kw = true;
            else if (saw_kw)
                perr(P, mode == 'c' ? "positional arguments must come before keyword arguments"
                                    : "non-default argument follows default argument");
            else if (saw_spread)
                perr(P, "positional arguments must not follow `*` argument unpacking");
        }
        vpush(P, &v, arg);
        if (is(P, T_COMMA))
            P->cur++;
    }
    expect(P, T_RPAREN, "expected ) closing the arguments list");
    return vlist(&v);
}

static jnode *parse_call(parser *P, jnode *callee)
{
    enter(P);
    jnode *x = mk(P, N_CALL, callee->pos);
    x->a = callee;
    x->l1 = parse_args(P, 'c');
    x = parse_member(P, x);
    if (is(P, T_LPAREN))
        x = parse_call(P, x);
    P->depth--;
    return x;
}

static jnode *parse_member_args(parser *P)
{
    size_t pos = here(P);
    jnode *sl[4] = {0};
    int k = 0;
    bool slice = false;
    while (!is(P, T_RBRACKET)) {
        if (P->cur >= P->n)
            perr(P, "expected ]");
        if (k >= 3)
            perr(P, "expected 0-3 arguments for slice expression");
        if (is(P, T_COLON)) {
            sl[k++] = NULL;
            P->cur++;
            slice = true;
        } else {
            sl[k++] = parse_expression(P);
            if (is(P, T_COLON)) {
                P->cur++;
                slice = true;
            }
        }
    }
    if (k == 0)
        perr(P, "expected at least one argument for member/slice expression");
    if (slice) {
        jnode *x = mk(P, N_SLICE, pos);
        x->a = sl[0];
        x->b = sl[1];
        x->c = sl[2];
        return x;
    }
    return sl[0];
}

static jnode *parse_member(parser *P, jnode *obj)
{
    while (is(P, T_DOT) || is(P, T_LBRACKET)) {
        bool computed = is(P, T_LBRACKET);
        size_t pos = here(P);
        P->cur++;
        jnode *prop;
        if (computed) {
            prop = parse_member_args(P);
            expect(P, T_RBRACKET, "expected ]");
        } else {
            prop = parse_primary(P);
            if (prop->type != N_IDENT && prop->type != N_INT)
                perr(P, "expected identifier or integer following dot operator");
        }
        jnode *x = mk(P, N_MEMBER, obj->pos);
        (void)pos;
        x->a = obj;
        x->b = prop;
        x->flag = computed;
        obj = x;
    }
    return obj;
}

static jnode *parse_call_member(parser *P)
{
    jnode *m = parse_member(P, parse_primary(P));
    if (is(P, T_LPAREN))
        return parse_call(P, m);
    return m;
}

static jnode *parse_unary_sign(parser *P)
{
    enter(P);
    jnode *r;
    if ((is(P, T_UNARY) || is(P, T_ADD)) &&
        (!strcmp(P->t[P->cur].val->s, "-") || !strcmp(P->t[P->cur].val->s, "+"))) {
        jnode *x = mk(P, N_UNARY, here(P));
        x->op = P->t[P->cur].val->s[0] == '-' ? OP_NEG : OP_POS;
        P->cur++;
        x->a = parse_unary_sign(P);
        r = x;
    } else {
        r = parse_call_member(P);
    }
    P->depth--;
    return r;
}

static jnode *parse_filter(parser *P)
{
    jnode *operand = parse_unary_sign(P);
    while (is(P, T_PIPE)) {
        size_t pos = here(P);
        P->cur++;
        jnode *f = parse_primary(P);
        if (f->type != N_IDENT)
            perr(P, "expected identifier for the filter");
        if (is(P, T_LPAREN))
            f = parse_call(P, f);
        jnode *x = mk(P, N_FILTER, pos);
        x->a = operand;
        x->b = f;
        operand = x;
    }
    return operand;
}

/* Tests that take one argument may be written `x is sameas y` in jinja2. */
static bool test_takes_arg(const char *name)
{
    static const char *const names[] = {"equalto", "eq", "ne", "sameas", "divisibleby",
                                        "lt", "gt", "le", "ge", "in", "lessthan",
                                        "greaterthan", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name))
            return true;
    return false;
}

static jnode *parse_test(parser *P)
{
    jnode *operand = parse_filter(P);
    while (is_ident(P, "is")) {
        size_t pos = here(P);
        P->cur++;
        bool neg = is_ident(P, "not");
        if (neg)
            P->cur++;
        jnode *name = parse_primary(P);
        if (name->type != N_IDENT)
            perr(P, "expected identifier for the test");
        jnode *x = mk(P, N_TEST, pos);
        x->a = operand;
        x->s = name->s;
        x->flag = neg;
        /* divergence: jinja2 test arguments (`is divisibleby(3)`, `is sameas x`);
         * the reference has no test arguments and fails on these templates */
        if (is(P, T_LPAREN)) {
            x->l1 = parse_args(P, 'c');
        } else if (test_takes_arg(name->s->s) &&
                   (is(P, T_NUM) || is(P, T_STR) || is(P, T_IDENT) || is(P, T_LBRACKET))) {
            vec v = {0};
            vpush(P, &v, parse_member(P, parse_primary(P)));
            x->l1 = vlist(&v);
        }
        operand = x;
    }
    return operand;
}

static jnode *binary(parser *P, size_t pos, jop op, jnode *l, jnode *r)
{
    jnode *x = mk(P, N_BINARY, pos);
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static jnode *parse_power(parser *P)
{
    jnode *l = parse_test(P);
    while (is(P, T_POW)) {
        size_t pos = here(P);
        P->cur++;
        l = binary(P, pos, OP_POW, l, parse_test(P));
    }
    return l;
}

static jnode *parse_mul(parser *P)
{
    jnode *l = parse_power(P);
    while (is(P, T_MUL)) {
        const char *v = P->t[P->cur].val->s;
        jop op = !strcmp(v, "*") ? OP_MUL : !strcmp(v, "/") ? OP_DIV : !strcmp(v, "//") ? OP_FLOORDIV : OP_MOD;
        size_t pos = here(P);
        P->cur++;
        l = binary(P, pos, op, l, parse_power(P));
    }
    return l;
}

static jnode *parse_add(parser *P)
{
    jnode *l = parse_mul(P);
    while (is(P, T_ADD)) {
        char v = P->t[P->cur].val->s[0];
        jop op = v == '+' ? OP_ADD : v == '-' ? OP_SUB : OP_CONCAT;
        size_t pos = here(P);
        P->cur++;
        l = binary(P, pos, op, l, parse_mul(P));
    }
    return l;
}

static jnode *parse_cmp(parser *P)
{
    jnode *l = parse_add(P);
    for (;;) {
        jop op;
        size_t pos = here(P);
        if (is_ident(P, "not") && is_ident_at(P, 1, "in")) {
            op = OP_NOTIN;
            P->cur += 2;
        } else if (is_ident(P, "in")) {
            op = OP_IN;
            P->cur++;
        } else if (is(P, T_CMP)) {
            const char *v = P->t[P->cur].val->s;
            op = !strcmp(v, "==") ? OP_EQ : !strcmp(v, "!=") ? OP_NE : !strcmp(v, "<") ? OP_LT
                 : !strcmp(v, ">") ? OP_GT : !strcmp(v, "<=") ? OP_LE : OP_GE;
            P->cur++;
        } else {
            break;
        }
        l = binary(P, pos, op, l, parse_add(P));
    }
    return l;
}

static jnode *parse_not(parser *P)
{
    enter(P);
    jnode *r = NULL;
    /* the reference's loop: `not not x` keeps only the last `not` node it built,
     * which itself wraps the rest, so it is a plain right recursion */
    while (is_ident(P, "not")) {
        size_t pos = here(P);
        P->cur++;
        jnode *arg = parse_not(P);
        r = mk(P, N_UNARY, pos);
        r->op = OP_NOT;
        r->a = arg;
    }
    if (!r)
        r = parse_cmp(P);
    P->depth--;
    return r;
}

static jnode *parse_and(parser *P)
{
    jnode *l = parse_not(P);
    while (is_ident(P, "and")) {
        size_t pos = here(P);
        P->cur++;
        l = binary(P, pos, OP_AND, l, parse_not(P));
    }
    return l;
}

static jnode *parse_or(parser *P)
{
    jnode *l = parse_and(P);
    while (is_ident(P, "or")) {
        size_t pos = here(P);
        P->cur++;
        l = binary(P, pos, OP_OR, l, parse_and(P));
    }
    return l;
}

static jnode *parse_if_expr(parser *P)
{
    jnode *a = parse_or(P);
    if (is_ident(P, "if")) {
        size_t pos = here(P);
        P->cur++;
        jnode *test = parse_or(P);
        if (is_ident(P, "else")) {
            P->cur++;
            jnode *x = mk(P, N_TERNARY, pos);
            x->a = test;
            x->b = a;
            x->c = parse_if_expr(P);
            return x;
        }
        jnode *x = mk(P, N_SELECT, pos);
        x->a = a;
        x->b = test;
        return x;
    }
    return a;
}

static jnode *parse_expression(parser *P)
{
    enter(P);
    jnode *r = parse_if_expr(P);
    P->depth--;
    return r;
}

static jnode *parse_expr_seq(parser *P, bool primary)
{
    size_t pos = here(P);
    jnode *first = primary ? parse_primary(P) : parse_expression(P);
    if (!is(P, T_COMMA))
        return first;
    vec v = {0};
    vpush(P, &v, first);
    while (is(P, T_COMMA)) {
        P->cur++;
        vpush(P, &v, primary ? parse_primary(P) : parse_expression(P));
    }
    jnode *x = mk(P, N_TUPLE, pos);
    x->l1 = vlist(&v);
    return x;
}

static jnode *parse_primary(parser *P)
{
    enter(P);
    if (P->cur >= P->n)
        perr(P, "unexpected end of template");
    jtok *t = &P->t[P->cur++];
    jnode *x;
    switch (t->type) {
    case T_NUM: {
        bool is_float = strchr(t->val->s, '.') != NULL;
        errno = 0;
        char *end;
        if (is_float) {
            x = mk(P, N_FLOAT, t->pos);
            x->f = strtod(t->val->s, &end);
        } else {
            x = mk(P, N_INT, t->pos);
            x->i = strtoll(t->val->s, &end, 10);
            if (errno == ERANGE) {
                P->cur--;
                perr(P, "integer literal out of range");
            }
        }
        break;
    }
    case T_STR: {
        x = mk(P, N_STR, t->pos);
        if (is(P, T_STR)) {
            /* adjacent string literals concatenate */
            jsb b;
            jsb_init(P->c, &b, 0);
            jsb_add(P->c, &b, t->val->s, t->val->len);
            while (is(P, T_STR)) {
                jsb_add(P->c, &b, P->t[P->cur].val->s, P->t[P->cur].val->len);
                P->cur++;
            }
            x->s = jsb_str(P->c, &b);
        } else {
            x->s = t->val;
        }
        break;
    }
    case T_IDENT:
        x = mk(P, N_IDENT, t->pos);
        x->s = t->val;
        break;
    case T_LPAREN:
        x = parse_expr_seq(P, false);
        expect(P, T_RPAREN, "expected closing parenthesis");
        break;
    case T_LBRACKET: {
        x = mk(P, N_ARRAY, t->pos);
        vec v = {0};
        while (!is(P, T_RBRACKET)) {
            if (P->cur >= P->n)
                perr(P, "expected ]");
            vpush(P, &v, parse_expression(P));
            if (is(P, T_COMMA))
                P->cur++;
        }
        P->cur++;
        x->l1 = vlist(&v);
        break;
    }
    case T_LBRACE: {
        x = mk(P, N_OBJECT, t->pos);
        vec k = {0}, v = {0};
        while (!is(P, T_RBRACE)) {
            if (P->cur >= P->n)
                perr(P, "expected }");
            vpush(P, &k, parse_expression(P));
            expect(P, T_COLON, "expected colon between key and value in object literal");
            vpush(P, &v, parse_expression(P));
            if (is(P, T_COMMA))
                P->cur++;
        }
        P->cur++;
        x->l1 = vlist(&k);
        x->l2 = vlist(&v);
        break;
    }
    default:
        P->cur--;
        perr(P, "unexpected token");
    }
    P->depth--;
    return x;
}

/* Does a macro body read `kwargs` or `varargs`? (bit 0 / bit 1) */
static int specials(const jnode *x, unsigned depth)
{
    if (!x || depth > 10000)
        return 0;
    int r = 0;
    if (x->type == N_IDENT) {
        if (!strcmp(x->s->s, "kwargs"))
            r |= 1;
        if (!strcmp(x->s->s, "varargs"))
            r |= 2;
    }
    r |= specials(x->a, depth + 1) | specials(x->b, depth + 1) | specials(x->c, depth + 1);
    for (size_t i = 0; i < x->l1.n; i++)
        r |= specials(x->l1.v[i], depth + 1);
    for (size_t i = 0; i < x->l2.n; i++)
        r |= specials(x->l2.v[i], depth + 1);
    return r;
}

static int body_specials(jlist body, jlist params)
{
    int r = 0;
    for (size_t i = 0; i < body.n; i++)
        r |= specials(body.v[i], 0);
    for (size_t i = 0; i < params.n; i++)
        if (params.v[i]->type == N_KWARG)
            r |= specials(params.v[i]->a, 0);
    return r;
}

static jnode *parse_if(parser *P, size_t pos)
{
    jnode *x = mk(P, N_IF, pos);
    x->a = parse_expression(P);
    expect(P, T_CLOSE_STMT, "expected %} after if condition");
    x->l1 = parse_until(P, "elif", "else", "endif");
    if (is_stmt(P, "elif", NULL, NULL)) {
        size_t p2 = here(P);
        P->cur += 2;
        vec v = {0};
        enter(P);
        vpush(P, &v, parse_if(P, p2));
        P->depth--;
        x->l2 = vlist(&v);
    } else if (is_stmt(P, "else", NULL, NULL)) {
        P->cur += 2;
        expect(P, T_CLOSE_STMT, "expected %} after else");
        x->l2 = parse_until(P, "endif", NULL, NULL);
    }
    return x;
}

static jnode *parse_stmt(parser *P)
{
    size_t pos = here(P);
    expect(P, T_OPEN_STMT, "expected {%");
    if (!is(P, T_IDENT))
        perr(P, "unknown statement");
    const char *name = P->t[P->cur].val->s;
    jnode *x;
    if (!strcmp(name, "set")) {
        P->cur++;
        x = mk(P, N_SET, pos);
        x->a = parse_expr_seq(P, false);
        if (is(P, T_EQUALS)) {
            P->cur++;
            x->b = parse_expr_seq(P, false);
        } else {
            expect(P, T_CLOSE_STMT, "expected %}");
            x->l1 = parse_until(P, "endset", NULL, NULL);
            expect(P, T_OPEN_STMT, "expected {%");
            expect_ident(P, "endset");
        }
        expect(P, T_CLOSE_STMT, "expected %} closing set");
    } else if (!strcmp(name, "if")) {
        P->cur++;
        x = parse_if(P, pos);
        expect(P, T_OPEN_STMT, "expected {%");
        expect_ident(P, "endif");
        expect(P, T_CLOSE_STMT, "expected %}");
    } else if (!strcmp(name, "macro")) {
        P->cur++;
        x = mk(P, N_MACRO, pos);
        jnode *nm = parse_primary(P);
        if (nm->type != N_IDENT)
            perr(P, "expected identifier following macro statement");
        x->s = nm->s;
        x->l2 = parse_args(P, 'p');
        expect(P, T_CLOSE_STMT, "expected %} after macro signature");
        x->l1 = parse_until(P, "endmacro", NULL, NULL);
        x->i = body_specials(x->l1, x->l2);
        expect(P, T_OPEN_STMT, "expected {%");
        expect_ident(P, "endmacro");
        expect(P, T_CLOSE_STMT, "expected %}");
    } else if (!strcmp(name, "for")) {
        P->cur++;
        x = mk(P, N_FOR, pos);
        x->a = parse_expr_seq(P, true);
        if (x->a->type != N_IDENT && x->a->type != N_TUPLE)
            perr(P, "expected identifier/tuple for the loop variable");
        if (!is_ident(P, "in"))
            perr(P, "expected `in` keyword following loop variable");
        P->cur++;
        x->b = parse_expression(P);
        expect(P, T_CLOSE_STMT, "expected %} after for");
        x->l1 = parse_until(P, "endfor", "else", NULL);
        if (is_stmt(P, "else", NULL, NULL)) {
            P->cur += 2;
            expect(P, T_CLOSE_STMT, "expected %} after else");
            x->l2 = parse_until(P, "endfor", NULL, NULL);
        }
        expect(P, T_OPEN_STMT, "expected {%");
        expect_ident(P, "endfor");
        expect(P, T_CLOSE_STMT, "expected %}");
    } else if (!strcmp(name, "call")) {
        P->cur++;
        x = mk(P, N_CALLSTMT, pos);
        if (is(P, T_LPAREN))
            x->l2 = parse_args(P, 'p');
        jnode *callee = parse_primary(P);
        if (callee->type != N_IDENT)
            perr(P, "expected identifier following call statement");
        jnode *call = mk(P, N_CALL, callee->pos);
        call->a = callee;
        call->l1 = parse_args(P, 'c');
        x->a = call;
        expect(P, T_CLOSE_STMT, "expected %} after call");
        x->l1 = parse_until(P, "endcall", NULL, NULL);
        x->i = body_specials(x->l1, x->l2);
        expect(P, T_OPEN_STMT, "expected {%");
        expect_ident(P, "endcall");
        expect(P, T_CLOSE_STMT, "expected %}");
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        P->cur++;
        x = mk(P, name[0] == 'b' ? N_BREAK : N_CONTINUE, pos);
        expect(P, T_CLOSE_STMT, "expected %}");
    } else if (!strcmp(name, "filter")) {
        P->cur++;
        x = mk(P, N_FILTERSTMT, pos);
        jnode *f = parse_primary(P);
        if (f->type == N_IDENT && is(P, T_LPAREN))
            f = parse_call(P, f);
        x->a = f;
        expect(P, T_CLOSE_STMT, "expected %} after filter");
        x->l1 = parse_until(P, "endfilter", NULL, NULL);
        expect(P, T_OPEN_STMT, "expected {%");
        expect_ident(P, "endfilter");
        expect(P, T_CLOSE_STMT, "expected %}");
    } else {
        char m[96];
        snprintf(m, sizeof m, "unknown statement type: %.60s", name);
        perr(P, m);
    }
    return x;
}

static jnode *parse_any(parser *P)
{
    enter(P);
    jnode *x;
    jtok *t = &P->t[P->cur];
    switch (t->type) {
    case T_COMMENT:
        x = mk(P, N_COMMENT, t->pos);
        P->cur++;
        break;
    case T_TEXT:
        x = mk(P, N_TEXT, t->pos);
        x->s = t->val;
        P->cur++;
        break;
    case T_OPEN_STMT:
        x = parse_stmt(P);
        break;
    case T_OPEN_EXPR:
        P->cur++;
        x = parse_expression(P);
        expect(P, T_CLOSE_EXPR, "expected }} closing the expression");
        break;
    default:
        perr(P, "unexpected token");
    }
    P->depth--;
    return x;
}

jlist jz_parse(jz_ctx *c, jtok *toks, size_t ntoks, unsigned max_depth)
{
    parser P = {.c = c, .t = toks, .n = ntoks, .max_depth = max_depth};
    vec v = {0};
    while (P.cur < P.n)
        vpush(&P, &v, parse_any(&P));
    return vlist(&v);
}

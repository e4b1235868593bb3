/* Internals shared by the Jinja engine's files (lexer, parser, values,
 * evaluator, filters).  Not a public API: include common/jinja.h instead.
 *
 * Memory: everything a parse or a render allocates comes from one arena
 * (jz_arena) that is freed as a whole, so the evaluator never frees single
 * values.  The arena has a byte limit; going over it is an error, which is
 * what bounds memory (and, since every copy costs arena bytes, time too).
 *
 * Errors: the parser and the evaluator report errors by longjmp to the
 * entry point (jz_fail), which frees the arena.  Nothing outside the arena
 * is allocated between setjmp and the end of a parse or render. */
#ifndef MR_JINJA_INT_H
#define MR_JINJA_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/jinja.h"

/* ---- arena ---- */
typedef struct jz_chunk jz_chunk;
typedef struct jz_arena {
    jz_chunk *head;
    size_t total;  /* bytes obtained from malloc so far */
    size_t limit;  /* 0 = unlimited */
} jz_arena;

/* Where errors go: the arena's owner sets jb with setjmp and fills msg. */
typedef struct jz_ctx {
    jz_arena arena;
    jmp_buf jb;
    mr_err *err;
    const char *src; /* original template text, for line:col */
    size_t src_len;
} jz_ctx;

void *jz_alloc(jz_ctx *c, size_t n);
void jz_arena_free(jz_arena *a);
/* Reports "line L, col C: message" for byte offset pos of the original
 * template (pos == SIZE_MAX: no position) and longjmps out. */
_Noreturn void jz_fail(jz_ctx *c, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void jz_linecol(const char *src, size_t len, size_t pos, size_t *line, size_t *col);

/* ---- strings and values ---- */
typedef struct jstr {
    size_t len;
    char s[]; /* NUL-terminated as well, but may contain NUL bytes */
} jstr;

typedef enum {
    V_UNDEF,
    V_NULL,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_ARR,
    V_TUPLE,
    V_OBJ,
    V_KWARGS, /* keyword arguments passed to a function: a mapping */
    V_NS,     /* namespace(): a mapping whose attributes can be set */
    V_FN,
} jkind;

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfn jfn;

typedef struct jval {
    uint8_t t;
    union {
        int b;
        int64_t i;
        double f;
        jstr *s;
        jarr *a;
        jobj *o;
        jfn *fn;
    } u;
} jval;

struct jarr {
    size_t n, cap;
    jval *v;
};
struct jobj {
    size_t n, cap;
    jstr **k;
    jval *v;
};

/* string builder in the arena; max bounds its length */
typedef struct jsb {
    char *p;
    size_t len, cap, max;
} jsb;

/* ---- tokens ---- */
typedef enum {
    T_TEXT,
    T_NUM,
    T_STR,
    T_IDENT,
    T_EQUALS,
    T_LPAREN,
    T_RPAREN,
    T_OPEN_STMT,
    T_CLOSE_STMT,
    T_OPEN_EXPR,
    T_CLOSE_EXPR,
    T_LBRACKET,
    T_RBRACKET,
    T_LBRACE,
    T_RBRACE,
    T_COMMA,
    T_DOT,
    T_COLON,
    T_PIPE,
    T_ADD,  /* + - ~ */
    T_MUL,  /* * / // % */
    T_POW,  /* ** */
    T_CMP,  /* < > <= >= == != */
    T_UNARY, /* - + with no operand value before them and no digits after */
    T_COMMENT,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    size_t pos; /* byte offset in the original template */
    jstr *val;
} jtok;

/* Tokenizes src (after the preprocessing that @huggingface/jinja applies:
 * lstrip_blocks, trim_blocks, generation tags removed). */
void jz_tokenize(jz_ctx *c, const char *src, size_t len, jtok **toks, size_t *ntoks);

/* ---- syntax tree ---- */
typedef enum {
    N_TEXT,
    N_COMMENT,
    N_IF,
    N_FOR,
    N_BREAK,
    N_CONTINUE,
    N_SET,
    N_MACRO,
    N_CALLSTMT,
    N_FILTERSTMT,
    /* expressions */
    N_INT,
    N_FLOAT,
    N_STR,
    N_ARRAY,
    N_TUPLE,
    N_OBJECT,
    N_IDENT,
    N_MEMBER,
    N_SLICE,
    N_CALL,
    N_UNARY,
    N_BINARY,
    N_FILTER,
    N_TEST,
    N_SELECT,
    N_TERNARY,
    N_KWARG,
    N_SPREAD,
    N_KWSPREAD,
} jnode_type;

typedef enum {
    OP_NONE,
    OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE,
    OP_AND, OP_OR, OP_IN, OP_NOTIN, OP_NOT, OP_NEG, OP_POS,
} jop;

typedef struct jnode jnode;
typedef struct jlist {
    size_t n;
    jnode **v;
} jlist;

struct jnode {
    jnode_type type;
    jop op;
    bool flag;        /* MEMBER: computed; TEST: negated; MACRO/CALLSTMT: uses kwargs */
    bool flag2;       /* MACRO/CALLSTMT: uses varargs; CALLSTMT: has caller args */
    size_t pos;       /* byte offset in the original template */
    jnode *a, *b, *c; /* operands, see parser */
    jlist l1, l2;     /* bodies and argument lists */
    jstr *s;          /* identifiers, literals, names */
    int64_t i;
    double f;
};

/* Parses the token list into a program body. */
jlist jz_parse(jz_ctx *c, jtok *toks, size_t ntoks, unsigned max_depth);

/* ---- evaluation ---- */
typedef struct jenv jenv;
typedef struct jrt jrt;
typedef void (*jbuiltin)(jrt *r, const jnode *at, jval self, jval *args, size_t nargs, jval *out);

struct jfn {
    const char *name;
    jbuiltin fn;         /* builtin function or bound method */
    jval self;           /* bound receiver of a method */
    const jnode *macro;  /* N_MACRO or N_CALLSTMT (caller) */
    jenv *closure;       /* caller(): the environment of the call block */
};

struct jenv {
    jenv *parent;
    size_t n, cap;
    const char **names;
    jval *vals;
};

struct jrt {
    jz_ctx c;
    const mr_jinja_opts *opts;
    unsigned depth;
    uint64_t steps;
    jstr *loop_keys[9]; /* index, index0, ... : the keys of every loop object */
};

/* values */
static inline jval jv_undef(void) { jval v = {.t = V_UNDEF}; return v; }
static inline jval jv_null(void) { jval v = {.t = V_NULL}; return v; }
static inline jval jv_bool(int b) { jval v = {.t = V_BOOL}; v.u.b = !!b; return v; }
static inline jval jv_int(int64_t i) { jval v = {.t = V_INT}; v.u.i = i; return v; }
static inline jval jv_float(double f) { jval v = {.t = V_FLOAT}; v.u.f = f; return v; }
static inline jval jv_strv(jstr *s) { jval v = {.t = V_STR}; v.u.s = s; return v; }
static inline bool jv_is_arr(jval v) { return v.t == V_ARR || v.t == V_TUPLE; }
static inline bool jv_is_obj(jval v) { return v.t == V_OBJ || v.t == V_KWARGS; }
static inline bool jv_is_num(jval v) { return v.t == V_INT || v.t == V_FLOAT; }

jstr *jz_str(jz_ctx *c, const char *s, size_t n);
jstr *jz_cstr(jz_ctx *c, const char *s);
jval jv_str(jz_ctx *c, const char *s, size_t n);
jval jv_arr(jz_ctx *c, size_t cap);
jval jv_obj(jz_ctx *c, size_t cap);
void jarr_push(jz_ctx *c, jarr *a, jval v);
jval *jobj_get(const jobj *o, const char *k, size_t klen);
void jobj_set(jz_ctx *c, jobj *o, jstr *k, jval v);
const char *jv_type_name(jval v);
bool jv_truthy(jval v);

void jsb_init(jz_ctx *c, jsb *b, size_t max);
void jsb_add(jz_ctx *c, jsb *b, const char *s, size_t n);
static inline void jsb_adds(jz_ctx *c, jsb *b, const char *s);
jstr *jsb_str(jz_ctx *c, jsb *b);

/* Formats a double as JavaScript's Number.prototype.toString does. */
void jz_fmt_number(double d, char *buf, size_t cap);
/* RuntimeValue.toString() of the reference renderer (what {{ v }} prints). */
void jv_to_string(jz_ctx *c, jval v, jsb *out);
/* The JavaScript String(v.value) of the reference (used by ~ and +). */
void jv_raw_string(jz_ctx *c, jval v, jsb *out);
/* JSON.dumps as the reference's tojson: indent < 0 means none. */
typedef struct jz_json_opts {
    int indent;
    bool ensure_ascii, sort_keys, undefined_as_null;
    const jstr *item_sep, *key_sep;
} jz_json_opts;
void jv_to_json(jrt *r, const jnode *at, jval v, const jz_json_opts *o, int depth, jsb *out);
/* JSON (jansson) to runtime values, in the key order JavaScript gives. */
struct json_t;
jval jv_from_json(jz_ctx *c, const struct json_t *j, unsigned depth);

/* UTF-8 helpers (encoding: mr_utf8_encode of common/unicode.h) */
size_t jz_utf8_dec(const char *s, size_t n, uint32_t *cp);
/* length of the JavaScript whitespace (\s) character at s, 0 if none */
size_t jz_ws_at(const char *s, size_t n);
/* length of the whitespace character ending at s+n, 0 if none */
size_t jz_ws_before(const char *s, size_t n);
size_t jz_utf16_len(const char *s, size_t n);
/* Unicode case mapping of one code point (JavaScript's toUpperCase /
 * toLowerCase; common/jinja_case.c, generated): writes up to three code
 * points to `to` and returns how many; 0 when cp maps to itself. */
size_t jz_case_map_cp(uint32_t cp, bool upper, uint32_t to[3]);
/* toUpperCase / toLowerCase of a string value */
jval jz_map_case(jrt *r, jval s, bool upper);

/* evaluator entry points used by filters */
_Noreturn void jz_rt_fail(jrt *r, const jnode *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void jz_step(jrt *r, const jnode *at);
jval jz_call(jrt *r, const jnode *at, jval fn, jval *args, size_t nargs, jenv *env);
bool jz_loose_eq(jz_ctx *c, jval a, jval b);
bool jz_strict_eq(jval a, jval b);
int jz_compare(jrt *r, const jnode *at, jval a, jval b, bool case_sensitive);

/* filters, tests, methods, globals (jinja_filters.c) */
jval jz_apply_filter(jrt *r, const jnode *filter, jval operand, jenv *env);
bool jz_run_test(jrt *r, const jnode *at, const char *name, jval v, jval *args, size_t nargs);
bool jz_has_test(const char *name);
/* attribute/method lookup on non-mapping values: NULL result = undefined */
bool jz_builtin_member(jrt *r, const jnode *at, jval obj, const char *name, jval *out);
void jz_add_globals(jrt *r, jenv *g);
jval jz_eval_args(jrt *r, const jlist *args, jenv *env, jval **argv, size_t *argc);

static inline void jsb_adds(jz_ctx *c, jsb *b, const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    jsb_add(c, b, s, n);
}

#endif

/* JSON Schema -> GBNF (gateway/jsonschema.h).
 *
 * A place in a schema is compiled from the set of schemas that all apply
 * there (a conjunction): the schema itself, what its allOf and $ref bring
 * in, and the chosen branch of each anyOf/oneOf.  flatten() gathers that
 * set; merge() reduces it to one constraint per JSON type (types
 * intersected, bounds tightened, enums intersected); the emit_*() write
 * the grammar of what is left, gathering for each property and each array
 * position the schemas that apply there and compiling those in turn.
 * anyOf/oneOf are distributed over the rest (A and (B or C) = (A and B) or
 * (A and C)), so merging never needs a union.
 *
 * A set that came through a $ref becomes a rule of its own, remembered by
 * the set, so that a recursive schema becomes a recursive rule and a
 * definition used in many places is written once.  Rules that refer to
 * one another without a byte in between (left recursion, which the
 * engine refuses) are found after the fact and reported by pointer. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "common/hash.h"
#include "common/unicode.h"
#include "gateway/jsonschema.h"

#define MAX_DEPTH 64       /* schema places inside one another */
#define MAX_WORK 50000     /* compile and validate steps for one schema */
#define MAX_COMBOS 256     /* combinations of branches of several anyOf/oneOf at one place */
#define MAX_VALUE_DEPTH 64 /* enum/const values inside one another */
#define MAX_NAME 100       /* bytes of a rule name given by a caller */

/* ================================================================
 * The builder: rule text, the names defined, the shared json-... rules.
 * ================================================================ */

struct mr_jsgram {
    mr_buf text; /* "name ::= body\n" for every rule added */
    char **names;
    size_t n_names, cap_names;
    uint32_t *tab;  /* open addressing over names: index + 1, 0 empty */
    size_t tab_cap; /* a power of two, more than twice n_names */
};

/* The shared rules a composed rule may use.  Only those used end up in
 * the grammar. */
static const struct shared_rule {
    const char *name, *body;
} shared_rules[] = {
    {"json-ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?"},
    {"json-value", "json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\""},
    {"json-object", "\"{\" json-ws ( json-member ( \",\" json-ws json-member )* json-ws )? \"}\""},
    {"json-member", "json-string json-ws \":\" json-ws json-value"},
    {"json-array", "\"[\" json-ws ( json-value ( \",\" json-ws json-value )* json-ws )? \"]\""},
    {"json-string", "\"\\\"\" json-char* \"\\\"\""},
    {"json-char", "json-rchar | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" json-hex4 )"},
    {"json-rchar", "[^\"\\\\\\x00-\\x1f]"},
    {"json-hex4", "[0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}"},
    {"json-number", "json-integer ( \".\" [0-9]{1,16} )? ( [eE] ( \"+\" | \"-\" )? [0-9]{1,2} )?"},
    {"json-integer", "\"-\"? json-digits"},
    {"json-digits", "\"0\" | [1-9] [0-9]{0,15}"},
    {"json-cchar", "json-rchar | \"\\\\\" ( [\"\\\\bfnrt] | \"u00\" ( \"0\" [0-7bef] | \"1\" [0-9a-f] ) )"},
    {"json-date", "\"\\\"\" json-date-c \"\\\"\""},
    {"json-date-c",
     "[0-9]{4} \"-\" ( ( \"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\" ) \"-\" ( \"0\" [1-9] | [12] "
     "[0-9] | \"3\" [01] ) | ( \"04\" | \"06\" | \"09\" | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | "
     "\"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | json-leap-year \"-02-29\""},
    {"json-leap-year",
     "[0-9]{2} ( [02468] [48] | [13579] [26] | [2468] \"0\" ) | ( [02468] [048] | [13579] [26] ) \"00\""},
    {"json-time", "\"\\\"\" json-time-c \"\\\"\""},
    {"json-time-c", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | "
                    "( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
    {"json-date-time", "\"\\\"\" json-date-c \"T\" json-time-c \"\\\"\""},
    {"json-uuid", "\"\\\"\" json-hex{8} \"-\" ( json-hex{4} \"-\" ){3} json-hex{12} \"\\\"\""},
    {"json-hex", "[0-9a-fA-F]"},
    {"json-ipv4", "\"\\\"\" json-ipv4-octet ( \".\" json-ipv4-octet ){3} \"\\\"\""},
    {"json-ipv4-octet", "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]"},
    {"json-ipv6", "\"\\\"\" json-hex{1,4} ( \":\" json-hex{1,4} ){7} \"\\\"\""},
    {"json-hostname", "\"\\\"\" json-dns-label ( \".\" json-dns-label ){0,2} \"\\\"\""},
    {"json-dns-label", "[a-zA-Z0-9] ( [a-zA-Z0-9-]{0,61} [a-zA-Z0-9] )?"},
    {"json-email",
     "\"\\\"\" json-email-atom ( \".\" json-email-atom )* \"@\" ( json-dns-label \".\" )+ json-dns-label \"\\\"\""},
    {"json-email-atom", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+"},
    {"json-duration",
     "\"\\\"P\" ( json-dur-date ( \"T\" json-dur-time )? | \"T\" json-dur-time | [0-9]{1,9} \"W\" ) \"\\\"\""},
    {"json-dur-date", "[0-9]{1,9} \"Y\" ( [0-9]{1,9} \"M\" )? ( [0-9]{1,9} \"D\" )? | [0-9]{1,9} \"M\" ( [0-9]{1,9} "
                      "\"D\" )? | [0-9]{1,9} \"D\""},
    {"json-dur-time", "[0-9]{1,9} \"H\" ( [0-9]{1,9} \"M\" )? ( [0-9]{1,9} \"S\" )? | [0-9]{1,9} \"M\" ( [0-9]{1,9} "
                      "\"S\" )? | [0-9]{1,9} \"S\""},
    {"json-uri",
     "\"\\\"http\" \"s\"? \"://\" json-dns-label ( \".\" json-dns-label )* ( \":\" [0-9]{1,5} )? ( \"/\" "
     "json-uri-char* )* ( \"?\" ( json-uri-char | [/?] )* )? ( \"#\" ( json-uri-char | [/?] )* )? \"\\\"\""},
    {"json-uri-char", "[a-zA-Z0-9._~!$&'()*+,;=:@-]"},
};

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        abort(); /* as mr_buf: out of memory in the gateway */
    return d;
}

static size_t name_slot(const mr_jsgram *g, const char *s)
{
    size_t mask = g->tab_cap - 1, i = (size_t)mr_fnv1a(s, strlen(s)) & mask;
    while (g->tab[i] && strcmp(g->names[g->tab[i] - 1], s))
        i = (i + 1) & mask;
    return i;
}

static bool names_has(const mr_jsgram *g, const char *s)
{
    return g->tab_cap && g->tab[name_slot(g, s)];
}

static void names_rehash(mr_jsgram *g, size_t cap)
{
    free(g->tab);
    g->tab = calloc(cap, sizeof *g->tab);
    if (!g->tab)
        abort(); /* as mr_buf: out of memory in the gateway */
    g->tab_cap = cap;
    for (size_t k = 0; k < g->n_names; k++)
        g->tab[name_slot(g, g->names[k])] = (uint32_t)k + 1;
}

static void names_add(mr_jsgram *g, const char *s)
{
    if (g->n_names == g->cap_names) {
        g->cap_names = g->cap_names ? g->cap_names * 2 : 64;
        g->names = realloc(g->names, g->cap_names * sizeof *g->names);
        if (!g->names)
            abort();
    }
    g->names[g->n_names] = xstrdup(s);
    g->n_names++;
    if (g->n_names * 2 >= g->tab_cap)
        names_rehash(g, g->tab_cap ? g->tab_cap * 2 : 128);
    else
        g->tab[name_slot(g, s)] = (uint32_t)g->n_names;
}

/* Forgets the names defined after the first n (a failed add). */
static void names_truncate(mr_jsgram *g, size_t n)
{
    if (n == g->n_names)
        return;
    while (g->n_names > n)
        free(g->names[--g->n_names]);
    names_rehash(g, g->tab_cap);
}

mr_jsgram *mr_jsgram_new(void)
{
    return calloc(1, sizeof(mr_jsgram));
}

void mr_jsgram_free(mr_jsgram *g)
{
    if (!g)
        return;
    names_truncate(g, 0);
    free(g->names);
    free(g->tab);
    mr_buf_free(&g->text);
    free(g);
}

static bool name_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_';
}

/* A name a caller may define: GBNF's [a-zA-Z0-9-_]+, not one of the
 * shared json-... names, not defined yet. */
static int check_new_name(const mr_jsgram *g, const char *name, mr_err *err)
{
    size_t n = name ? strlen(name) : 0;
    if (!n || n > MAX_NAME)
        return mr_errf(err, "grammar rule name must be 1 to %d characters", MAX_NAME);
    for (size_t i = 0; i < n; i++)
        if (!name_char(name[i]))
            return mr_errf(err, "grammar rule name \"%s\" may hold only letters, digits, - and _", name);
    if (!strncmp(name, "json-", 5))
        return mr_errf(err, "grammar rule names beginning with json- are reserved");
    if (names_has(g, name))
        return mr_errf(err, "grammar rule \"%s\" is defined twice", name);
    return 0;
}

/* Appends `name ::= body`, keeping the whole text under the engine's
 * limit (helper names are made unique by the caller, but a caller's own
 * rule may still clash with one). */
static int rule_put(mr_jsgram *g, const char *name, const char *body, mr_err *err)
{
    size_t add = strlen(name) + strlen(body) + 6;
    if (g->text.len + add >= MR_GRAMMAR_MAX_TEXT)
        return mr_errf(err, "the grammar would be larger than %u bytes", MR_GRAMMAR_MAX_TEXT);
    if (names_has(g, name))
        return mr_errf(err, "grammar rule \"%s\" is defined twice", name);
    names_add(g, name);
    mr_buf_printf(&g->text, "%s ::= %s\n", name, body);
    return 0;
}

int mr_jsgram_add_rule(mr_jsgram *g, const char *name, const char *body, mr_err *err)
{
    if (check_new_name(g, name, err))
        return -1;
    if (!body || strchr(body, '\n'))
        return mr_errf(err, "grammar rule \"%s\": the body must be one line", name);
    return rule_put(g, name, body, err);
}

int mr_jsgram_add_object(mr_jsgram *g, const char *name, mr_err *err)
{
    return mr_jsgram_add_rule(g, name, "json-object", err);
}

int mr_jsgram_add_value(mr_jsgram *g, const char *name, mr_err *err)
{
    return mr_jsgram_add_rule(g, name, "json-value", err);
}

static int shared_index(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof shared_rules / sizeof shared_rules[0]; i++)
        if (strlen(shared_rules[i].name) == n && !memcmp(shared_rules[i].name, name, n))
            return (int)i;
    return -1;
}

/* Marks in used[] the shared rules that GBNF text s names (outside
 * literals, classes and comments). */
static void mark_shared(const char *s, bool *used)
{
    for (size_t i = 0; s[i];) {
        char ch = s[i];
        if (ch == '"' || ch == '[') {
            char close = ch == '"' ? '"' : ']';
            for (i++; s[i] && s[i] != close; i++)
                if (s[i] == '\\' && s[i + 1])
                    i++;
            if (s[i])
                i++;
        } else if (ch == '#') {
            while (s[i] && s[i] != '\n')
                i++;
        } else if (name_char(ch)) {
            size_t start = i;
            while (name_char(s[i]))
                i++;
            int k = i - start > 5 && !strncmp(s + start, "json-", 5) ? shared_index(s + start, i - start) : -1;
            if (k >= 0)
                used[k] = true;
        } else {
            i++;
        }
    }
}

/* Appends the definitions of the shared rules that text uses, directly
 * or through one another. */
static void add_shared(mr_buf *out, const char *text)
{
    enum { N = sizeof shared_rules / sizeof shared_rules[0] };
    bool used[N] = {0}, done[N] = {0};
    mark_shared(text, used);
    for (bool more = true; more;) {
        more = false;
        for (size_t i = 0; i < N; i++)
            if (used[i] && !done[i]) {
                done[i] = true;
                mark_shared(shared_rules[i].body, used);
                more = true;
            }
    }
    for (size_t i = 0; i < N; i++)
        if (used[i])
            mr_buf_printf(out, "%s ::= %s\n", shared_rules[i].name, shared_rules[i].body);
}

/* The engine compiles it once here, so that a grammar it would refuse is
 * an error of the request, not of the worker that gets it. */
static int check_compiles(const char *text, size_t len, mr_err *err)
{
    mr_grammar *gr;
    if (mr_grammar_parse(text, len, &gr, err))
        return mr_err_wrap(err, "the grammar made of the schema is not usable");
    mr_grammar_free(gr);
    return 0;
}

int mr_jsgram_finish(mr_jsgram *g, char **text, size_t *len, mr_err *err)
{
    *text = NULL;
    *len = 0;
    if (!names_has(g, "root"))
        return mr_errf(err, "the grammar has no rule named root");
    mr_buf out = {0};
    mr_buf_add(&out, g->text.p, g->text.len);
    add_shared(&out, g->text.p);
    if (out.len >= MR_GRAMMAR_MAX_TEXT) {
        mr_buf_free(&out);
        return mr_errf(err, "the grammar would be larger than %u bytes", MR_GRAMMAR_MAX_TEXT);
    }
    if (check_compiles(out.p, out.len, err)) {
        mr_buf_free(&out);
        return -1;
    }
    *text = out.p;
    *len = out.len;
    return 0;
}

int mr_gbnf_literal(mr_buf *out, const void *s, size_t n, mr_err *err)
{
    const unsigned char *p = s;
    if (!mr_gw_utf8_valid(s, n))
        return mr_errf(err, "grammar literal is not valid UTF-8");
    mr_buf_reserve(out, n + 2);
    mr_buf_add(out, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\')
            mr_buf_printf(out, "\\%c", c);
        else if (c == '\n')
            mr_buf_adds(out, "\\n");
        else if (c == '\r')
            mr_buf_adds(out, "\\r");
        else if (c == '\t')
            mr_buf_adds(out, "\\t");
        else if (c < 0x20 || c == 0x7F)
            mr_buf_printf(out, "\\x%02X", c);
        else
            mr_buf_add(out, &c, 1);
    }
    mr_buf_add(out, "\"", 1);
    return 0;
}

/* ================================================================
 * JSON values as JSON.stringify writes them (enum/const literals, and
 * strings checked against a pattern's grammar).
 * ================================================================ */

static void put_string(mr_buf *b, const char *s, size_t n)
{
    static const char shortesc[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    mr_buf_reserve(b, n + 2);
    mr_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            mr_buf_printf(b, "\\%c", c);
        else if (c < sizeof shortesc && shortesc[c])
            mr_buf_printf(b, "\\%c", shortesc[c]);
        else if (c < 0x20)
            mr_buf_printf(b, "\\u%04x", c);
        else
            mr_buf_add(b, &c, 1);
    }
    mr_buf_add(b, "\"", 1);
}

/* As JSON.stringify writes numbers: whole ones below 1e21 in digits,
 * others in the shortest %g form that reads back as the same double. */
static void put_real(mr_buf *b, double d)
{
    char s[40];
    if (d == floor(d) && fabs(d) < 1e21) {
        snprintf(s, sizeof s, "%.0f", d);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(s, sizeof s, "%.*g", prec, d);
            if (strtod(s, NULL) == d)
                break;
        }
    }
    mr_buf_adds(b, s);
}

static void put_value(mr_buf *b, const json_t *v)
{
    size_t i;
    const char *k;
    const json_t *x;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        mr_buf_adds(b, "{");
        i = 0;
        json_object_foreach((json_t *)v, k, x)
        {
            if (i++)
                mr_buf_adds(b, ",");
            put_string(b, k, strlen(k));
            mr_buf_adds(b, ":");
            put_value(b, x);
        }
        mr_buf_adds(b, "}");
        return;
    case JSON_ARRAY:
        mr_buf_adds(b, "[");
        json_array_foreach(v, i, x)
        {
            if (i)
                mr_buf_adds(b, ",");
            put_value(b, x);
        }
        mr_buf_adds(b, "]");
        return;
    case JSON_STRING:
        put_string(b, json_string_value(v), json_string_length(v));
        return;
    case JSON_INTEGER:
        mr_buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return;
    case JSON_REAL:
        put_real(b, json_real_value(v));
        return;
    case JSON_TRUE:
        mr_buf_adds(b, "true");
        return;
    case JSON_FALSE:
        mr_buf_adds(b, "false");
        return;
    default:
        mr_buf_adds(b, "null");
        return;
    }
}

/* A sequence for value v: its JSON text as JSON.stringify writes it,
 * with json-ws where whitespace may go inside arrays and objects. */
static void value_seq(mr_buf *out, const json_t *v)
{
    size_t i = 0;
    const char *k;
    const json_t *x;
    mr_buf text = {0};
    if (json_is_array(v)) {
        mr_buf_adds(out, "\"[\" json-ws");
        json_array_foreach(v, i, x)
        {
            mr_buf_adds(out, i ? " \",\" json-ws " : " ");
            value_seq(out, x);
        }
        mr_buf_adds(out, json_array_size(v) ? " json-ws \"]\"" : " \"]\"");
    } else if (json_is_object(v)) {
        mr_buf_adds(out, "\"{\" json-ws");
        json_object_foreach((json_t *)v, k, x)
        {
            mr_buf_adds(out, i++ ? " \",\" json-ws " : " ");
            mr_buf_clear(&text);
            put_string(&text, k, strlen(k));
            mr_gbnf_literal(out, text.p, text.len, NULL);
            mr_buf_adds(out, " json-ws \":\" json-ws ");
            value_seq(out, x);
        }
        mr_buf_adds(out, json_object_size(v) ? " json-ws \"}\"" : " \"}\"");
    } else {
        put_value(&text, v);
        mr_gbnf_literal(out, text.p, text.len, NULL);
    }
    mr_buf_free(&text);
}

/* ================================================================
 * Compiling one schema: the context, messages, keywords, $ref.
 * ================================================================ */

/* JSON types as bits; integers and other numbers apart, since "integer"
 * allows only the first. */
enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_FRAC = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ALL = 127 };

/* One schema of a conjunction. */
typedef struct ent {
    const json_t *s;
    const char *ptr; /* its JSON pointer in the schema, for messages */
    int parent;      /* the entry whose allOf, $ref or anyOf/oneOf brought it in; -1 none */
} ent;

typedef struct ents {
    ent *v;
    size_t n, cap;
} ents;

/* The branches chosen for anyOf/oneOf keywords: branch idx of array arr. */
typedef struct pick {
    const json_t *arr;
    size_t idx;
} pick;

typedef struct picks {
    pick *v;
    size_t n;
} picks;

/* A set of schemas compiled to a rule of its own. */
typedef struct memo {
    uintptr_t *key; /* sorted: schema pointers, picked branches | 1 */
    size_t n_key;
    uint64_t hash;
    char *name;
    int state;     /* M_BUSY while its body is written, then M_DONE or M_EMPTY */
    bool hit_busy; /* named while M_BUSY (its body refers to it) */
    const char *ptr;
} memo;

enum { M_BUSY, M_DONE, M_EMPTY };

/* Where a compiled element goes: at the start of memo rule `owner`'s body
 * (start: no byte before it in that rule), or further in. */
typedef struct pos {
    int owner;
    bool start;
} pos;

typedef struct jsc {
    mr_jsgram *g;
    const char *name;  /* the rule being defined; helpers are name-N */
    const char *where; /* prefix of messages */
    const json_t *root;
    const char *root_id; /* the root's $id, which a $ref may spell out */
    bool draft7;         /* "$schema" says draft-07 or before: no prefixItems, no unevaluated* */
    mr_err *err;
    unsigned serial;
    int depth;
    long work;
    memo *memo;
    size_t n_memo, cap_memo;
    int (*edge)[2]; /* memo rule [0] starts with memo rule [1] */
    size_t n_edge, cap_edge;
    char **strs; /* JSON pointers, freed at the end */
    size_t n_strs, cap_strs;
} jsc;

static void *grow(void *p, size_t *cap, size_t elem)
{
    *cap = *cap ? *cap * 2 : 16;
    p = realloc(p, *cap * elem);
    if (!p)
        abort(); /* as mr_buf: out of memory in the gateway */
    return p;
}

static void ents_push(ents *a, const json_t *s, const char *ptr, int parent)
{
    if (a->n == a->cap)
        a->v = grow(a->v, &a->cap, sizeof *a->v);
    a->v[a->n++] = (ent){s, ptr, parent};
}

static void ents_free(ents *a)
{
    free(a->v);
    *a = (ents){0};
}

static int ents_find(const ents *a, const json_t *s)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].s == s)
            return (int)i;
    return -1;
}

static const char *keep_str(jsc *c, char *s)
{
    if (c->n_strs == c->cap_strs)
        c->strs = grow(c->strs, &c->cap_strs, sizeof *c->strs);
    c->strs[c->n_strs++] = s;
    return s;
}

/* base + "/" + seg, seg escaped as a JSON pointer token (~0 ~1). */
static const char *ptr_join(jsc *c, const char *base, const char *seg)
{
    mr_buf b = {0};
    mr_buf_adds(&b, base);
    mr_buf_adds(&b, "/");
    for (const char *s = seg; *s; s++)
        if (*s == '~')
            mr_buf_adds(&b, "~0");
        else if (*s == '/')
            mr_buf_adds(&b, "~1");
        else
            mr_buf_add(&b, s, 1);
    return keep_str(c, b.p);
}

static const char *ptr_num(jsc *c, const char *base, size_t i)
{
    char num[24];
    snprintf(num, sizeof num, "%zu", i);
    return ptr_join(c, base, num);
}

static const char *ptr_index(jsc *c, const char *base, const char *kw, size_t i)
{
    return ptr_num(c, ptr_join(c, base, kw), i);
}

/* "WHERE: /pointer: message" (no pointer at the root). */
static int fail(jsc *c, const char *ptr, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(jsc *c, const char *ptr, const char *fmt, ...)
{
    char msg[sizeof c->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ptr && *ptr)
        return mr_errf(c->err, "%s: %s: %s", c->where, ptr, msg);
    return mr_errf(c->err, "%s: %s", c->where, msg);
}

static int unsupported(jsc *c, const char *ptr, const char *kw, const char *why)
{
    return fail(c, ptr, "keyword \"%s\" is not supported%s%s%s", kw, why ? " (" : "", why ? why : "", why ? ")" : "");
}

static int too_complex(jsc *c, const char *ptr)
{
    return fail(c, ptr, "the schema is too complex to compile (more than %d steps)", MAX_WORK);
}

/* Keywords that constrain a value (the rest are annotations, or no
 * keyword of any draft: validators ignore both). */
/* clang-format off */
static const char *const constraining[] = {
    "type", "nullable", "enum", "const", "properties", "required", "additionalProperties",
    "unevaluatedProperties", "items", "prefixItems", "additionalItems", "unevaluatedItems", "minItems", "maxItems",
    "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties", "anyOf", "oneOf", "allOf", "$ref"};

/* Keywords that constrain in ways a grammar here does not follow. */
static const char *const refused[] = {"not", "if", "then", "else", "dependentSchemas", "dependentRequired",
                                      "dependencies", "patternProperties", "propertyNames", "contains",
                                      "minContains", "maxContains", "$dynamicRef", "$recursiveRef"};
/* clang-format on */

static bool in_list(const char *const *list, size_t n, const char *k)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], k))
            return true;
    return false;
}

static bool is_constraining(const char *k)
{
    return in_list(constraining, sizeof constraining / sizeof constraining[0], k);
}

static bool is_refused(const char *k)
{
    return in_list(refused, sizeof refused / sizeof refused[0], k);
}

static bool is_number(const json_t *v)
{
    return json_is_integer(v) || json_is_real(v);
}

static long double num_of(const json_t *v)
{
    return json_is_integer(v) ? (long double)json_integer_value(v) : (long double)json_real_value(v);
}

/* A count keyword's value: a non-negative whole number (saturated). */
static bool count_of(const json_t *v, size_t *out)
{
    if (!is_number(v))
        return false;
    long double x = num_of(v);
    if (x < 0 || x != floorl(x))
        return false;
    *out = x >= (long double)(SIZE_MAX / 2) ? SIZE_MAX / 2 : (size_t)x;
    return true;
}

static const char *const type_names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
static const unsigned type_bits[] = {T_NULL, T_BOOL, T_INT, T_INT | T_FRAC, T_STR, T_ARR, T_OBJ};

static unsigned type_bit(const json_t *v)
{
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < sizeof type_names / sizeof type_names[0]; i++)
        if (!strcmp(s, type_names[i]))
            return type_bits[i];
    return 0;
}

/* The types a "type" value allows; 0 when it is not a valid one. */
static unsigned types_of(const json_t *t)
{
    if (json_is_string(t))
        return type_bit(t);
    if (!json_is_array(t) || !json_array_size(t))
        return 0;
    unsigned m = 0;
    size_t i;
    const json_t *x;
    json_array_foreach(t, i, x)
    {
        unsigned b = type_bit(x);
        if (!b)
            return 0;
        m |= b;
    }
    return m;
}

static bool is_schema(const json_t *v)
{
    return json_is_object(v) || json_is_boolean(v);
}

static bool all_strings(const json_t *a)
{
    size_t i;
    const json_t *x;
    json_array_foreach(a, i, x) if (!json_is_string(x)) return false;
    return true;
}

/* Whether keyword k's value v has the form the drafts give it; what it
 * should be in *want otherwise. */
static bool keyword_value_ok(const char *k, const json_t *v, const char **want)
{
    size_t n;
    static const char *const schema_kw[] = {"additionalProperties", "unevaluatedProperties", "additionalItems",
                                            "unevaluatedItems"};
    static const char *const count_kw[] = {"minItems",  "maxItems",      "minLength",
                                           "maxLength", "minProperties", "maxProperties"};
    static const char *const num_kw[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    static const char *const list_kw[] = {"anyOf", "oneOf", "allOf", "prefixItems"};
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(k, schema_kw[i]))
            return *want = "a schema", is_schema(v);
    for (size_t i = 0; i < 6; i++)
        if (!strcmp(k, count_kw[i]))
            return *want = "a non-negative integer", count_of(v, &n);
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(k, num_kw[i]))
            return *want = "a number", is_number(v);
    for (size_t i = 0; i < 4; i++)
        if (!strcmp(k, list_kw[i]))
            return *want = "a non-empty array of schemas", json_is_array(v) && json_array_size(v);
    if (!strcmp(k, "type"))
        return *want = "a type name or a non-empty array of them", types_of(v) != 0;
    if (!strcmp(k, "nullable") || !strcmp(k, "uniqueItems"))
        return *want = "a boolean", json_is_boolean(v);
    if (!strcmp(k, "enum"))
        return *want = "an array", json_is_array(v);
    if (!strcmp(k, "properties"))
        return *want = "an object of schemas", json_is_object(v);
    if (!strcmp(k, "required"))
        return *want = "an array of strings", json_is_array(v) && all_strings(v);
    if (!strcmp(k, "items"))
        return *want = "a schema or an array of schemas", is_schema(v) || json_is_array(v);
    if (!strcmp(k, "multipleOf"))
        return *want = "a number above 0", is_number(v) && num_of(v) > 0;
    if (!strcmp(k, "pattern") || !strcmp(k, "format") || !strcmp(k, "$ref"))
        return *want = "a string", json_is_string(v);
    return true;
}

/* Refuses what cannot be enforced and values of the wrong form. */
static int check_schema(jsc *c, const ent *e)
{
    if (json_is_boolean(e->s))
        return 0;
    if (!json_is_object(e->s))
        return fail(c, e->ptr, "a schema must be an object or a boolean");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)e->s, k, v)
    {
        const char *want;
        if (is_refused(k))
            return unsupported(c, e->ptr, k, NULL);
        if (is_constraining(k) && !keyword_value_ok(k, v, &want)) {
            if (!strncmp(k, "exclusiveM", 10) && json_is_boolean(v))
                return unsupported(c, e->ptr, k, "as a boolean: that is draft-04, use a number");
            return fail(c, e->ptr, "\"%s\" must be %s", k, want);
        }
    }
    if (json_object_get(e->s, "$id") && e->s != c->root)
        return unsupported(c, e->ptr, "$id", "only at the root");
    if (!c->draft7 && json_object_get(e->s, "prefixItems") && json_is_array(json_object_get(e->s, "items")))
        return unsupported(c, e->ptr, "items", "as an array beside prefixItems");
    return 0;
}

/* A schema that is a $ref and nothing else that constrains. */
static bool pure_ref(const json_t *s)
{
    if (!json_is_object(s) || !json_is_string(json_object_get(s, "$ref")))
        return false;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) if ((is_constraining(k) || is_refused(k)) && strcmp(k, "$ref")) return false;
    return true;
}

static bool ptr_token_eq(const char *tok, size_t n, const char *key)
{
    size_t j = 0;
    for (size_t i = 0; i < n; i++, j++) {
        char ch = tok[i];
        if (ch == '~' && i + 1 < n && (tok[i + 1] == '0' || tok[i + 1] == '1'))
            ch = tok[++i] == '0' ? '~' : '/';
        if (key[j] != ch)
            return false;
    }
    return key[j] == 0;
}

/* The member of object o whose name the pointer token tok[0..n) spells. */
static const json_t *ptr_member(const json_t *o, const char *tok, size_t n)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) if (ptr_token_eq(tok, n, k)) return v;
    return NULL;
}

/* The schema a JSON pointer (percent-decoded fragment) names, NULL none. */
static const json_t *walk_pointer(const json_t *root, const char *p)
{
    const json_t *cur = root;
    while (*p == '/') {
        p++;
        size_t n = strcspn(p, "/");
        if (json_is_object(cur)) {
            cur = ptr_member(cur, p, n);
        } else if (json_is_array(cur)) {
            size_t idx = 0;
            if (n == 0 || n > 9 || (n > 1 && p[0] == '0'))
                return NULL;
            for (size_t i = 0; i < n; i++) {
                if (p[i] < '0' || p[i] > '9')
                    return NULL;
                idx = idx * 10 + (size_t)(p[i] - '0');
            }
            cur = json_array_get(cur, idx);
        } else {
            return NULL;
        }
        if (!cur)
            return NULL;
        p += n;
    }
    return *p ? NULL : cur;
}

static int percent_decode(const char *s, mr_buf *out)
{
    for (; *s; s++) {
        if (*s != '%') {
            mr_buf_add(out, s, 1);
            continue;
        }
        int hi = -1, lo = -1;
        if (s[1] && s[2]) {
            char h[3] = {s[1], s[2], 0};
            char *end;
            long v = strtol(h, &end, 16);
            if (!*end)
                hi = (int)(v >> 4), lo = (int)(v & 15);
        }
        if (hi < 0)
            return -1;
        char ch = (char)(hi << 4 | lo);
        if (!ch)
            return -1;
        mr_buf_add(out, &ch, 1);
        s += 2;
    }
    if (!out->p)
        mr_buf_adds(out, "");
    return 0;
}

/* Resolves the $ref of entry e: *target and its pointer. */
static int resolve_ref(jsc *c, const ent *e, const json_t **target, const char **tptr)
{
    const char *ref = json_string_value(json_object_get(e->s, "$ref"));
    size_t idn = c->root_id ? strlen(c->root_id) : 0;
    if (idn && !strncmp(ref, c->root_id, idn) && (ref[idn] == '#' || !ref[idn]))
        ref += idn;
    if (!*ref)
        ref = "#";
    if (ref[0] != '#')
        return unsupported(c, e->ptr, "$ref", "only \"#\" and JSON pointers \"#/...\" inside the schema");
    mr_buf frag = {0};
    if (percent_decode(ref + 1, &frag)) {
        mr_buf_free(&frag);
        return fail(c, e->ptr, "\"$ref\" \"%s\" is not a valid URI fragment", ref);
    }
    if (frag.len && frag.p[0] != '/') {
        mr_buf_free(&frag);
        return unsupported(c, e->ptr, "$ref", "to an anchor: only \"#\" and JSON pointers \"#/...\"");
    }
    *target = walk_pointer(c->root, frag.p);
    if (!*target || !is_schema(*target)) {
        mr_buf_free(&frag);
        return fail(c, e->ptr, "\"$ref\" \"%s\" names no schema in this one", ref);
    }
    *tptr = keep_str(c, frag.p);
    return 0;
}

/* in with every pure $ref replaced by what it names (so that the set, and
 * the rule remembered by it, is the same wherever the $ref is written). */
static int canon(jsc *c, const ents *in, ents *out, bool *has_ref)
{
    for (size_t i = 0; i < in->n; i++) {
        ent e = in->v[i];
        for (int hops = 0; pure_ref(e.s); hops++) {
            if (hops == MAX_DEPTH)
                return fail(c, e.ptr, "\"$ref\" chain longer than %d (a cycle?)", MAX_DEPTH);
            if (check_schema(c, &e) || resolve_ref(c, &e, &e.s, &e.ptr))
                return -1;
            *has_ref = true;
        }
        if (ents_find(out, e.s) < 0)
            ents_push(out, e.s, e.ptr, -1);
    }
    return 0;
}

/* ---- flattening ---- */

typedef struct flat {
    ents e;
    bool is_false; /* some schema is false: no value */
    bool has_ref;
    /* the first anyOf/oneOf that no pick decides */
    const json_t *disj;
    const char *disj_ptr;
    bool disj_one;
    size_t combos; /* product of the branch counts of all undecided ones */
    int n_disj;    /* how many are undecided */
} flat;

/* The index of the branch of arr that pk chose, -1 none. */
static long picked_branch(const json_t *arr, const picks *pk)
{
    for (size_t k = 0; pk && k < pk->n; k++)
        if (pk->v[k].arr == arr)
            return (long)pk->v[k].idx;
    return -1;
}

static void flat_add(flat *f, const json_t *s, const char *ptr, int parent)
{
    if (json_is_true(s) || ents_find(&f->e, s) >= 0)
        return;
    if (json_is_false(s))
        f->is_false = true;
    else
        ents_push(&f->e, s, ptr, parent);
}

/* anyOf / oneOf of entry i: the picked branch joins the set; else it is a
 * choice still to make. */
static void flat_disj(jsc *c, flat *f, size_t i, const char *kw, const picks *pk)
{
    const json_t *arr = json_object_get(f->e.v[i].s, kw);
    if (!arr)
        return;
    size_t n = json_array_size(arr);
    long k = n == 1 ? 0 : picked_branch(arr, pk);
    if (k >= 0) {
        flat_add(f, json_array_get(arr, (size_t)k), ptr_index(c, f->e.v[i].ptr, kw, (size_t)k), (int)i);
        return;
    }
    if (!f->disj) {
        f->disj = arr;
        f->disj_ptr = ptr_join(c, f->e.v[i].ptr, kw);
        f->disj_one = kw[0] == 'o';
    }
    f->combos = f->combos > MAX_COMBOS ? f->combos : f->combos * n;
    f->n_disj++;
}

/* Whether entry d was brought in, directly or not, by entry a. */
static bool descends(const ents *e, size_t d, size_t a)
{
    int p = e->v[d].parent;
    for (size_t steps = 0; p >= 0 && steps <= e->n; steps++) {
        if ((size_t)p == a)
            return true;
        p = e->v[p].parent;
    }
    return false;
}

/* The set in (with the branches pk) closed under allOf, $ref and the
 * decided anyOf/oneOf; every schema in it checked. */
static int flatten(jsc *c, const ents *in, const picks *pk, flat *f)
{
    *f = (flat){.combos = 1};
    for (size_t i = 0; i < in->n; i++)
        flat_add(f, in->v[i].s, in->v[i].ptr, -1);
    for (size_t i = 0; i < f->e.n; i++) {
        ent e = f->e.v[i];
        if (check_schema(c, &e))
            return -1;
        const json_t *all = json_object_get(e.s, "allOf"), *t;
        size_t k;
        json_array_foreach(all, k, t) flat_add(f, t, ptr_index(c, e.ptr, "allOf", k), (int)i);
        if (json_object_get(e.s, "$ref")) {
            const char *tptr;
            if (resolve_ref(c, &e, &t, &tptr))
                return -1;
            int j = ents_find(&f->e, t);
            if (j >= 0 && ((size_t)j == i || descends(&f->e, i, (size_t)j)))
                return fail(c, e.ptr, "\"$ref\" cycle: the schema is itself again before any object or array begins");
            flat_add(f, t, tptr, (int)i);
            f->has_ref = true;
        }
        flat_disj(c, f, i, "anyOf", pk);
        flat_disj(c, f, i, "oneOf", pk);
    }
    return 0;
}

/* ================================================================
 * What a set of schemas allows, per JSON type.
 * ================================================================ */

typedef struct bound {
    bool set, excl;
    long double v;
    const char *ptr, *kw;
} bound;

typedef struct shape {
    unsigned types;
    struct valset *vals; /* enum/const: the values all of them allow; NULL: no such keyword */
    bound lo, hi;
    bool whole;               /* multipleOf 1 */
    const char *multiple_ptr; /* multipleOf other than 1 */
    size_t min_len, max_len;
    const char *pattern, *pattern_ptr;
    int format;               /* index into formats[], -1 none */
    const char *str_conflict; /* a second pattern, or a pattern beside a format */
    bool str_none;            /* formats that no string meets together */
    size_t min_items, max_items;
    const char *unique_ptr;
    size_t min_props, max_props;
    const char *min_props_ptr, *max_props_ptr;
} shape;

/* The formats enforced: the shared rule of the string (quotes included),
 * which writes strings that ajv-formats (full mode) accepts, and its
 * length range in code points. */
static const struct format {
    const char *name, *rule;
    size_t min_len, max_len;
} formats[] = {
    {"date", "json-date", 10, 10},
    {"time", "json-time", 9, 24},
    {"date-time", "json-date-time", 20, 35},
    {"uuid", "json-uuid", 36, 36},
    {"ipv4", "json-ipv4", 7, 15},
    {"ipv6", "json-ipv6", 15, 39},
    {"hostname", "json-hostname", 1, 191},
    {"email", "json-email", 5, MR_JSG_INF},
    {"duration", "json-duration", 3, MR_JSG_INF},
    {"uri", "json-uri", 8, MR_JSG_INF},
};

static int format_index(const char *name)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(formats[i].name, name))
            return (int)i;
    return -1;
}

static bool value_eq(const json_t *a, const json_t *b)
{
    if (is_number(a) && is_number(b))
        return num_of(a) == num_of(b);
    if (json_typeof(a) != json_typeof(b))
        return false;
    size_t i;
    const char *k;
    const json_t *x;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        json_array_foreach(a, i, x) if (!value_eq(x, json_array_get(b, i))) return false;
        return true;
    case JSON_OBJECT:
        if (json_object_size(a) != json_object_size(b))
            return false;
        json_object_foreach((json_t *)a, k, x)
        {
            const json_t *y = json_object_get(b, k);
            if (!y || !value_eq(x, y))
                return false;
        }
        return true;
    default:
        return true;
    }
}

/* A hash that equal values (value_eq) share: numbers by value, object
 * members in any order. */
static uint64_t value_hash(const json_t *v)
{
    size_t i;
    const char *k;
    const json_t *x;
    uint64_t h = 0;
    switch (json_typeof(v)) {
    case JSON_INTEGER:
    case JSON_REAL: {
        long double n = num_of(v);
        if (n == floorl(n) && fabsl(n) < 9e18L) {
            int64_t w = (int64_t)n;
            return mr_fnv1a(&w, sizeof w);
        }
        double d = (double)n;
        return mr_fnv1a(&d, sizeof d) ^ 1;
    }
    case JSON_STRING:
        return mr_fnv1a(json_string_value(v), json_string_length(v)) ^ 2;
    case JSON_ARRAY:
        h = 3;
        json_array_foreach(v, i, x) h = (h ^ value_hash(x)) * 1099511628211ull;
        return h;
    case JSON_OBJECT:
        h = 4;
        json_object_foreach((json_t *)v, k, x) h += mr_fnv1a(k, strlen(k)) * 31 + value_hash(x);
        return h;
    default:
        return (uint64_t)json_typeof(v) + 5;
    }
}

/* A set of JSON values (enum/const) in the order first added, found by
 * hash: an enum may hold many thousands. */
typedef struct valset {
    json_t *arr;   /* the values (references) */
    uint64_t *h;   /* their hashes */
    uint32_t *tab; /* open addressing: index + 1, 0 empty */
    size_t cap;    /* of tab: a power of two, more than twice the values */
} valset;

static valset *valset_new(void)
{
    valset *s = calloc(1, sizeof *s);
    if (!s || !(s->arr = json_array()))
        abort(); /* as mr_buf: out of memory in the gateway */
    return s;
}

static void valset_free(valset *s)
{
    if (!s)
        return;
    json_decref(s->arr);
    free(s->h);
    free(s->tab);
    free(s);
}

static size_t valset_size(const valset *s)
{
    return json_array_size(s->arr);
}

/* The slot of v (hash h) in s->tab: where it is, or the empty one where it
 * would go. */
static size_t valset_slot(const valset *s, const json_t *v, uint64_t h)
{
    size_t mask = s->cap - 1, i = (size_t)h & mask;
    while (s->tab[i] && !(s->h[s->tab[i] - 1] == h && value_eq(json_array_get(s->arr, s->tab[i] - 1), v)))
        i = (i + 1) & mask;
    return i;
}

static bool valset_has(const valset *s, const json_t *v)
{
    return s->cap && s->tab[valset_slot(s, v, value_hash(v))];
}

static void valset_add(valset *s, json_t *v)
{
    uint64_t h = value_hash(v);
    if (s->cap && s->tab[valset_slot(s, v, h)])
        return;
    size_t n = valset_size(s);
    if ((n + 1) * 2 >= s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        uint32_t *tab = calloc(cap, sizeof *tab);
        uint64_t *hs = realloc(s->h, cap * sizeof *hs);
        if (!tab || !hs)
            abort();
        free(s->tab);
        s->tab = tab;
        s->h = hs;
        s->cap = cap;
        for (size_t k = 0; k < n; k++)
            s->tab[valset_slot(s, json_array_get(s->arr, k), s->h[k])] = (uint32_t)k + 1;
    }
    s->h[n] = h;
    json_array_append(s->arr, v);
    s->tab[valset_slot(s, v, h)] = (uint32_t)n + 1;
}

static unsigned value_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL:
        return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE:
        return T_BOOL;
    case JSON_INTEGER:
        return T_INT;
    case JSON_REAL:
        return json_real_value(v) == floor(json_real_value(v)) ? T_INT : T_FRAC;
    case JSON_STRING:
        return T_STR;
    case JSON_ARRAY:
        return T_ARR;
    default:
        return T_OBJ;
    }
}

/* sh->vals becomes its values that are also in list (all of list when it
 * was unset), each once. */
static void intersect_vals(shape *sh, const json_t *list)
{
    valset *out = valset_new();
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) if (!sh->vals || valset_has(sh->vals, x)) valset_add(out, x);
    valset_free(sh->vals);
    sh->vals = out;
}

static void tighten(bound *b, const json_t *v, bool excl, bool lower, const char *ptr, const char *kw)
{
    long double x = num_of(v);
    bool better = !b->set || (lower ? x > b->v : x < b->v) || (x == b->v && excl);
    if (better)
        *b = (bound){true, excl, x, ptr, kw};
}

static void merge_numbers(shape *sh, const ent *e)
{
    const json_t *v;
    if ((v = json_object_get(e->s, "minimum")))
        tighten(&sh->lo, v, false, true, e->ptr, "minimum");
    if ((v = json_object_get(e->s, "exclusiveMinimum")))
        tighten(&sh->lo, v, true, true, e->ptr, "exclusiveMinimum");
    if ((v = json_object_get(e->s, "maximum")))
        tighten(&sh->hi, v, false, false, e->ptr, "maximum");
    if ((v = json_object_get(e->s, "exclusiveMaximum")))
        tighten(&sh->hi, v, true, false, e->ptr, "exclusiveMaximum");
    if ((v = json_object_get(e->s, "multipleOf"))) {
        if (num_of(v) == 1)
            sh->whole = true;
        else
            sh->multiple_ptr = e->ptr;
    }
}

static void merge_count(const json_t *s, const char *kw, size_t *x, bool lower)
{
    size_t n;
    if (count_of(json_object_get(s, kw), &n) && (lower ? n > *x : n < *x))
        *x = n;
}

static void merge_strings(shape *sh, const ent *e)
{
    merge_count(e->s, "minLength", &sh->min_len, true);
    merge_count(e->s, "maxLength", &sh->max_len, false);
    const char *p = json_string_value(json_object_get(e->s, "pattern"));
    if (p && !sh->pattern) {
        sh->pattern = p;
        sh->pattern_ptr = e->ptr;
    } else if (p && strcmp(p, sh->pattern)) {
        sh->str_conflict = e->ptr;
    }
    const char *f = json_string_value(json_object_get(e->s, "format"));
    int fi = f ? format_index(f) : -1;
    if (fi >= 0 && sh->format < 0)
        sh->format = fi;
    else if (fi >= 0 && fi != sh->format)
        sh->str_none = true; /* two formats: none written (they rarely share a string) */
}

static void merge_one(shape *sh, const ent *e)
{
    const json_t *t = json_object_get(e->s, "type"), *v;
    if (t)
        sh->types &= types_of(t) | (json_is_true(json_object_get(e->s, "nullable")) ? T_NULL : 0);
    if ((v = json_object_get(e->s, "enum")))
        intersect_vals(sh, v);
    if ((v = json_object_get(e->s, "const"))) {
        json_t *one = json_pack("[O]", v);
        intersect_vals(sh, one);
        json_decref(one);
    }
    merge_numbers(sh, e);
    merge_strings(sh, e);
    merge_count(e->s, "minItems", &sh->min_items, true);
    merge_count(e->s, "maxItems", &sh->max_items, false);
    if (json_is_true(json_object_get(e->s, "uniqueItems")))
        sh->unique_ptr = e->ptr;
    size_t before = sh->min_props;
    merge_count(e->s, "minProperties", &sh->min_props, true);
    if (sh->min_props != before)
        sh->min_props_ptr = e->ptr;
    before = sh->max_props;
    merge_count(e->s, "maxProperties", &sh->max_props, false);
    if (sh->max_props != before)
        sh->max_props_ptr = e->ptr;
}

static void merge(const ents *fl, shape *sh)
{
    *sh =
        (shape){.types = T_ALL, .max_len = MR_JSG_INF, .format = -1, .max_items = MR_JSG_INF, .max_props = MR_JSG_INF};
    for (size_t i = 0; i < fl->n; i++)
        merge_one(sh, &fl->v[i]);
    if (sh->whole)
        sh->types &= ~(unsigned)T_FRAC;
}

static void shape_free(shape *sh)
{
    valset_free(sh->vals);
    sh->vals = NULL;
}

/* ---- what applies to one property, one array item ---- */

static const json_t *props_of(const json_t *s)
{
    const json_t *p = json_object_get(s, "properties");
    return json_is_object(p) ? p : NULL;
}

/* Whether some entry that e brought in evaluates property name (NULL:
 * every name), so that e's unevaluatedProperties leaves it alone. */
static bool desc_evaluates(const ents *fl, size_t e, const char *name)
{
    for (size_t d = 0; d < fl->n; d++) {
        if (d == e || !descends(fl, d, e))
            continue;
        const json_t *s = fl->v[d].s;
        if (json_object_get(s, "additionalProperties") || json_object_get(s, "unevaluatedProperties") ||
            (name && json_object_get(props_of(s), name)))
            return true;
    }
    return false;
}

/* The schemas that apply to the value of property name. */
static void object_at(jsc *c, const ents *fl, const char *name, ents *out)
{
    for (size_t i = 0; i < fl->n; i++) {
        const ent *e = &fl->v[i];
        const json_t *p = json_object_get(props_of(e->s), name), *x;
        if (p)
            ents_push(out, p, ptr_join(c, ptr_join(c, e->ptr, "properties"), name), -1);
        else if ((x = json_object_get(e->s, "additionalProperties")))
            ents_push(out, x, ptr_join(c, e->ptr, "additionalProperties"), -1);
        else if (!c->draft7 && (x = json_object_get(e->s, "unevaluatedProperties")) && !desc_evaluates(fl, i, name))
            ents_push(out, x, ptr_join(c, e->ptr, "unevaluatedProperties"), -1);
    }
}

/* The schemas that apply to a property that no "properties" names;
 * *said: some schema says anything about such properties. */
static void object_extra(jsc *c, const ents *fl, ents *out, bool *said)
{
    *said = false;
    for (size_t i = 0; i < fl->n; i++) {
        const ent *e = &fl->v[i];
        const json_t *x;
        if ((x = json_object_get(e->s, "additionalProperties"))) {
            ents_push(out, x, ptr_join(c, e->ptr, "additionalProperties"), -1);
            *said = true;
        } else if (!c->draft7 && (x = json_object_get(e->s, "unevaluatedProperties")) && !desc_evaluates(fl, i, NULL)) {
            ents_push(out, x, ptr_join(c, e->ptr, "unevaluatedProperties"), -1);
            *said = true;
        }
    }
}

typedef struct pname {
    const char *name;
    bool required;
} pname;

static bool required_by(const json_t *s, const char *name)
{
    size_t i;
    const json_t *x;
    json_array_foreach(json_object_get(s, "required"), i, x) if (!strcmp(json_string_value(x), name)) return true;
    return false;
}

static bool is_required(const ents *fl, const char *name)
{
    for (size_t i = 0; i < fl->n; i++)
        if (required_by(fl->v[i].s, name))
            return true;
    return false;
}

static void pname_add(pname **v, size_t *n, size_t *cap, const char *name, const ents *fl)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*v)[i].name, name))
            return;
    if (*n == *cap)
        *v = grow(*v, cap, sizeof **v);
    (*v)[(*n)++] = (pname){name, is_required(fl, name)};
}

static size_t ancestors(const ents *fl, size_t e)
{
    size_t n = 0;
    for (int p = fl->v[e].parent; p >= 0 && n <= fl->n; p = fl->v[p].parent)
        n++;
    return n;
}

/* The properties an object may have by name: those of "properties" in
 * the order written, the schemas that others bring in (allOf, $ref: a
 * base, as generators write inheritance) first; then required ones that
 * no "properties" names. */
static void object_names(const ents *fl, pname **v, size_t *n)
{
    size_t cap = 0, deepest = 0;
    *v = NULL;
    *n = 0;
    const char *k;
    const json_t *x;
    size_t i;
    for (size_t e = 0; e < fl->n; e++)
        if (ancestors(fl, e) > deepest)
            deepest = ancestors(fl, e);
    for (size_t d = deepest + 1; d-- > 0;)
        for (size_t e = 0; e < fl->n; e++)
            if (ancestors(fl, e) == d)
                json_object_foreach((json_t *)props_of(fl->v[e].s), k, x) pname_add(v, n, &cap, k, fl);
    for (size_t e = 0; e < fl->n; e++)
        json_array_foreach(json_object_get(fl->v[e].s, "required"), i, x)
            pname_add(v, n, &cap, json_string_value(x), fl);
}

/* The tuple part of an array schema: prefixItems, or items as an array
 * (draft-07). */
static const json_t *prefix_of(const jsc *c, const json_t *s, const char **kw)
{
    const json_t *p = json_object_get(s, "prefixItems"), *it = json_object_get(s, "items");
    if (json_is_array(p) && !c->draft7)
        return *kw = "prefixItems", p;
    if (json_is_array(it))
        return *kw = "items", it;
    return NULL;
}

/* What applies to the items after the tuple: items (a schema), or
 * additionalItems after an items array. */
static const json_t *rest_of(const json_t *s, const char **kw)
{
    const json_t *it = json_object_get(s, "items");
    if (json_is_array(it))
        return *kw = "additionalItems", json_object_get(s, "additionalItems");
    return *kw = "items", it;
}

/* Whether some entry that e brought in evaluates array item i, so that
 * e's unevaluatedItems leaves it alone. */
static bool desc_covers(const jsc *c, const ents *fl, size_t e, size_t i)
{
    for (size_t d = 0; d < fl->n; d++) {
        if (d == e || !descends(fl, d, e))
            continue;
        const char *kw;
        const json_t *s = fl->v[d].s, *p = prefix_of(c, s, &kw);
        if ((p && json_array_size(p) > i) || rest_of(s, &kw) || json_object_get(s, "unevaluatedItems"))
            return true;
    }
    return false;
}

/* The schemas that apply to array item i. */
static void array_at(jsc *c, const ents *fl, size_t i, ents *out)
{
    for (size_t k = 0; k < fl->n; k++) {
        const ent *e = &fl->v[k];
        const char *kw;
        const json_t *p = prefix_of(c, e->s, &kw), *x;
        if (p && i < json_array_size(p))
            ents_push(out, json_array_get(p, i), ptr_index(c, e->ptr, kw, i), -1);
        else if ((x = rest_of(e->s, &kw)))
            ents_push(out, x, ptr_join(c, e->ptr, kw), -1);
        else if (!c->draft7 && (x = json_object_get(e->s, "unevaluatedItems")) && !desc_covers(c, fl, k, i))
            ents_push(out, x, ptr_join(c, e->ptr, "unevaluatedItems"), -1);
    }
}

/* Items from this index on all take the same schemas. */
static size_t prefix_max(const jsc *c, const ents *fl)
{
    size_t m = 0;
    for (size_t k = 0; k < fl->n; k++) {
        const char *kw;
        const json_t *p = prefix_of(c, fl->v[k].s, &kw);
        if (p && json_array_size(p) > m)
            m = json_array_size(p);
    }
    return m;
}

static bool any_keyword(const ents *fl, const char *const *kws, size_t n)
{
    for (size_t i = 0; i < fl->n; i++)
        for (size_t k = 0; k < n; k++)
            if (json_object_get(fl->v[i].s, kws[k]))
                return true;
    return false;
}

static const char *const object_kws[] = {
    "properties", "required", "additionalProperties", "unevaluatedProperties", "minProperties", "maxProperties"};
static const char *const array_kws[] = {"items",    "prefixItems", "additionalItems", "unevaluatedItems",
                                        "minItems", "maxItems",    "uniqueItems"};

/* ================================================================
 * Checking a value against a set of schemas (which enum/const values a
 * grammar may write: those every other keyword allows too).
 * ================================================================ */

static int compile(jsc *c, const ents *in, const picks *pk, pos at, const char *force, mr_buf *out, bool *empty);
static int validate(jsc *c, const ents *in, const picks *pk, const json_t *v, int depth);

static void picks_with(const picks *pk, const json_t *arr, size_t idx, picks *out)
{
    size_t n = pk ? pk->n : 0;
    out->v = malloc((n + 1) * sizeof *out->v);
    if (!out->v)
        abort();
    if (n)
        memcpy(out->v, pk->v, n * sizeof *out->v);
    out->v[n] = (pick){arr, idx};
    out->n = n + 1;
}

static size_t utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* The sequence (quotes included) of the JSON strings the shape allows;
 * *empty when none. */
static int string_seq(jsc *c, const shape *sh, mr_buf *out, bool *empty)
{
    *empty = sh->str_none || sh->min_len > sh->max_len;
    if (*empty)
        return 0;
    if (sh->str_conflict || (sh->pattern && sh->format >= 0))
        return unsupported(c, sh->str_conflict ? sh->str_conflict : sh->pattern_ptr, "pattern",
                           "only one pattern, and not beside an enforced format");
    if (sh->format >= 0) {
        const struct format *f = &formats[sh->format];
        if (sh->min_len > f->max_len || sh->max_len < f->min_len) {
            *empty = true;
            return 0;
        }
        if (sh->min_len > f->min_len || sh->max_len < f->max_len)
            return fail(c, NULL, "minLength/maxLength beside format \"%s\" are not supported", f->name);
        mr_buf_adds(out, f->rule);
        return 0;
    }
    if (sh->pattern) {
        mr_buf body = {0};
        mr_err perr;
        if (mr_jsg_pattern(&body, sh->pattern, sh->min_len, sh->max_len, empty, &perr)) {
            mr_buf_free(&body);
            return fail(c, sh->pattern_ptr, "keyword \"pattern\": %s", perr.msg);
        }
        if (!*empty)
            mr_buf_printf(out, "\"\\\"\" %s \"\\\"\"", body.p);
        mr_buf_free(&body);
        return 0;
    }
    if (sh->min_len > MR_JSG_MAX_COUNT)
        return unsupported(c, NULL, "minLength", "above 100000");
    if (sh->min_len == 0 && sh->max_len == MR_JSG_INF) {
        mr_buf_adds(out, "json-string");
        return 0;
    }
    mr_buf_adds(out, "\"\\\"\" ");
    mr_jsg_repeat(out, "json-char", sh->min_len, sh->max_len);
    mr_buf_adds(out, " \"\\\"\"");
    return 0;
}

/* Whether the grammar `root ::= seq` (with the shared rules) matches the
 * JSON text of string value v. */
static int string_matches(jsc *c, const char *seq, const json_t *v)
{
    mr_buf g = {0}, text = {0};
    mr_buf_printf(&g, "root ::= %s\n", seq);
    add_shared(&text, g.p);
    mr_buf_add(&g, text.p, text.len);
    mr_buf_clear(&text);
    put_string(&text, json_string_value(v), json_string_length(v));
    mr_grammar *gr = NULL;
    mr_gmatch *m = NULL;
    int r = -1;
    if (--c->work < 0)
        too_complex(c, NULL);
    else if (mr_grammar_parse(g.p, g.len, &gr, c->err) || mr_gmatch_new(gr, &m, c->err))
        fail(c, NULL, "checking an enum/const string: %s", c->err->msg);
    else
        r = mr_gmatch_accept(m, text.p, text.len) && mr_gmatch_can_end(m);
    mr_gmatch_free(m);
    mr_grammar_free(gr);
    mr_buf_free(&g);
    mr_buf_free(&text);
    return r;
}

static int validate_number(jsc *c, const shape *sh, const json_t *v)
{
    if (sh->multiple_ptr)
        return unsupported(c, sh->multiple_ptr, "multipleOf", "only 1");
    long double x = num_of(v);
    if (sh->lo.set && (x < sh->lo.v || (sh->lo.excl && x == sh->lo.v)))
        return 0;
    if (sh->hi.set && (x > sh->hi.v || (sh->hi.excl && x == sh->hi.v)))
        return 0;
    return 1;
}

static int validate_string(jsc *c, const shape *sh, const json_t *v)
{
    size_t n = utf8_count(json_string_value(v), json_string_length(v));
    if (n < sh->min_len || n > sh->max_len)
        return 0;
    if (sh->format < 0 && !sh->pattern)
        return 1;
    mr_buf seq = {0};
    bool empty;
    int r = string_seq(c, sh, &seq, &empty);
    if (!r)
        r = empty ? 0 : string_matches(c, seq.p, v);
    mr_buf_free(&seq);
    return r;
}

static int validate_array(jsc *c, const shape *sh, const ents *fl, const json_t *v, int depth)
{
    size_t n = json_array_size(v), i;
    const json_t *x;
    if (n < sh->min_items || n > sh->max_items)
        return 0;
    for (i = 0; sh->unique_ptr && i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (value_eq(json_array_get(v, i), json_array_get(v, j)))
                return 0;
    json_array_foreach(v, i, x)
    {
        ents at = {0};
        array_at(c, fl, i, &at);
        int r = validate(c, &at, NULL, x, depth + 1);
        ents_free(&at);
        if (r != 1)
            return r;
    }
    return 1;
}

static int validate_object(jsc *c, const shape *sh, const ents *fl, const json_t *v, int depth)
{
    size_t n = json_object_size(v), i;
    const char *k;
    const json_t *x;
    if (n < sh->min_props || n > sh->max_props)
        return 0;
    for (size_t e = 0; e < fl->n; e++)
        json_array_foreach(json_object_get(fl->v[e].s, "required"), i,
                           x) if (!json_object_get(v, json_string_value(x))) return 0;
    json_object_foreach((json_t *)v, k, x)
    {
        ents at = {0};
        object_at(c, fl, k, &at);
        int r = validate(c, &at, NULL, x, depth + 1);
        ents_free(&at);
        if (r != 1)
            return r;
    }
    return 1;
}

/* 1: v meets every constraint of the shape (and of the schemas fl), 0:
 * not, -1: a keyword that cannot be checked (err set). */
static int validate_shape(jsc *c, const shape *sh, const ents *fl, const json_t *v, int depth)
{
    unsigned t = value_type(v);
    if (!(t & sh->types) || (sh->vals && !valset_has(sh->vals, v)))
        return 0;
    switch (t) {
    case T_INT:
    case T_FRAC:
        return validate_number(c, sh, v);
    case T_STR:
        return validate_string(c, sh, v);
    case T_ARR:
        return validate_array(c, sh, fl, v, depth);
    case T_OBJ:
        return validate_object(c, sh, fl, v, depth);
    default:
        return 1;
    }
}

/* ---- oneOf: allowed where no value can meet two branches ---- */

typedef struct disc {
    const char *name;
    valset *vals;
} disc;

typedef struct summary {
    unsigned types; /* a superset of the types the branch allows */
    valset *vals;   /* a superset of its values, NULL: not a finite set */
    disc *disc;     /* required properties with a finite set of values */
    size_t n_disc, cap_disc;
} summary;

/* Types and values of the set in, anyOf/oneOf inside left aside (the
 * result is a superset); the flattened set in *fl if wanted. */
static int conj_summary(jsc *c, const ents *in, unsigned *types, valset **vals, flat *fl)
{
    ents cin = {0};
    flat f = {0};
    bool has_ref = false;
    int rc = canon(c, in, &cin, &has_ref) || flatten(c, &cin, NULL, &f) ? -1 : 0;
    ents_free(&cin);
    *types = 0;
    *vals = NULL;
    if (!rc && !f.is_false) {
        shape sh;
        merge(&f.e, &sh);
        *types = sh.types;
        *vals = sh.vals;
    }
    if (fl && !rc)
        *fl = f;
    else
        ents_free(&f.e);
    return rc;
}

static int summarize(jsc *c, const json_t *branch, const char *ptr, summary *s)
{
    ents in = {0};
    flat f = {0};
    ents_push(&in, branch, ptr, -1);
    int rc = conj_summary(c, &in, &s->types, &s->vals, &f);
    ents_free(&in);
    size_t i;
    const json_t *x;
    for (size_t e = 0; !rc && e < f.e.n; e++)
        json_array_foreach(json_object_get(f.e.v[e].s, "required"), i, x)
        {
            ents at = {0};
            unsigned t;
            valset *vals;
            object_at(c, &f.e, json_string_value(x), &at);
            rc = conj_summary(c, &at, &t, &vals, NULL);
            ents_free(&at);
            if (rc)
                break;
            if (!vals)
                continue;
            if (s->n_disc == s->cap_disc)
                s->disc = grow(s->disc, &s->cap_disc, sizeof *s->disc);
            s->disc[s->n_disc++] = (disc){json_string_value(x), vals};
        }
    ents_free(&f.e);
    return rc;
}

static bool vals_disjoint(const valset *a, const valset *b)
{
    if (valset_size(a) > valset_size(b))
        return vals_disjoint(b, a);
    size_t i;
    const json_t *x;
    json_array_foreach(a->arr, i, x) if (valset_has(b, x)) return false;
    return true;
}

static bool vals_outside(const valset *vals, unsigned types)
{
    size_t i;
    const json_t *x;
    json_array_foreach(vals->arr, i, x) if (value_type(x) & types) return false;
    return true;
}

static bool disjoint(const summary *a, const summary *b)
{
    if (a->vals && b->vals)
        return vals_disjoint(a->vals, b->vals);
    if (a->vals || b->vals)
        return a->vals ? vals_outside(a->vals, b->types) : vals_outside(b->vals, a->types);
    unsigned common = a->types & b->types;
    if (!common)
        return true;
    if (common != T_OBJ)
        return false;
    for (size_t i = 0; i < a->n_disc; i++)
        for (size_t j = 0; j < b->n_disc; j++)
            if (!strcmp(a->disc[i].name, b->disc[j].name) && vals_disjoint(a->disc[i].vals, b->disc[j].vals))
                return true;
    return false;
}

static int check_disjoint(jsc *c, const json_t *arr, const char *ptr)
{
    size_t n = json_array_size(arr);
    summary *s = calloc(n, sizeof *s);
    if (!s)
        abort();
    int rc = 0;
    c->work -= (long)(n + n * n / 32); /* the summaries, and the pairs compared */
    if (c->work < 0)
        rc = too_complex(c, ptr);
    for (size_t i = 0; i < n && !rc; i++)
        rc = summarize(c, json_array_get(arr, i), ptr_num(c, ptr, i), &s[i]);
    for (size_t i = 0; i < n && !rc; i++)
        for (size_t j = i + 1; j < n && !rc; j++)
            if (!disjoint(&s[i], &s[j]))
                rc = unsupported(c, ptr, "oneOf",
                                 "only where no value can match two branches: they must differ in type, in "
                                 "const/enum values or in a required property's const/enum values");
    for (size_t i = 0; i < n; i++) {
        valset_free(s[i].vals);
        for (size_t j = 0; j < s[i].n_disc; j++)
            valset_free(s[i].disc[j].vals);
        free(s[i].disc);
    }
    free(s);
    return rc;
}

static int validate_disj(jsc *c, const ents *cin, const picks *pk, const flat *f, const json_t *v, int depth)
{
    if (f->n_disj > 1 && f->combos > MAX_COMBOS)
        return fail(c, f->disj_ptr, "more than %d combinations of anyOf/oneOf branches", MAX_COMBOS);
    if (f->disj_one && check_disjoint(c, f->disj, f->disj_ptr))
        return -1;
    size_t i;
    const json_t *b;
    json_array_foreach(f->disj, i, b)
    {
        picks p2;
        picks_with(pk, f->disj, i, &p2);
        int r = validate(c, cin, &p2, v, depth);
        free(p2.v);
        if (r)
            return r;
    }
    return 0;
}

static int validate(jsc *c, const ents *in, const picks *pk, const json_t *v, int depth)
{
    if (!in->n)
        return 1; /* nothing applies (say, items of a const array) */
    if (--c->work < 0)
        return too_complex(c, NULL);
    if (depth > MAX_VALUE_DEPTH || c->depth >= MAX_DEPTH)
        return fail(c, in->n ? in->v[0].ptr : NULL, "enum/const values nested too deeply to check");
    c->depth++;
    ents cin = {0};
    flat f = {0};
    bool has_ref = false;
    int r = -1;
    if (canon(c, in, &cin, &has_ref) || flatten(c, &cin, pk, &f))
        goto out;
    if (f.is_false) {
        r = 0;
    } else if (f.disj) {
        r = validate_disj(c, &cin, pk, &f, v, depth);
    } else {
        shape sh;
        merge(&f.e, &sh);
        r = validate_shape(c, &sh, &f.e, v, depth);
        shape_free(&sh);
    }
out:
    c->depth--;
    ents_free(&cin);
    ents_free(&f.e);
    return r;
}

/* ================================================================
 * Writing the grammar.
 * ================================================================ */

typedef struct alts {
    mr_buf b;
    size_t n;
} alts;

static void alts_add(alts *a, const char *s)
{
    if (a->n++)
        mr_buf_adds(&a->b, " | ");
    mr_buf_adds(&a->b, s);
}

/* A rule name or one literal: usable in a sequence as it is. */
static bool is_primary(const char *s)
{
    size_t i = 0;
    if (s[0] == '"') {
        for (i = 1; s[i] && s[i] != '"'; i++)
            if (s[i] == '\\' && s[i + 1])
                i++;
        return s[i] == '"' && !s[i + 1];
    }
    while (name_char(s[i]))
        i++;
    return i && !s[i];
}

/* The alternatives as one element (a.n >= 1). */
static void alts_put(const alts *a, mr_buf *out)
{
    if (a->n == 1 && is_primary(a->b.p))
        mr_buf_adds(out, a->b.p);
    else
        mr_buf_printf(out, "( %s )", a->b.p);
}

/* Defines name-N ::= body; the name goes to name[cap]. */
static int helper_rule(jsc *c, const char *body, char *name, size_t cap)
{
    snprintf(name, cap, "%s-%u", c->name, ++c->serial);
    if (rule_put(c->g, name, body, c->err))
        return mr_err_wrap(c->err, "%s", c->where);
    return 0;
}

#define RULE_NAME (MAX_NAME + 16)

/* ---- numbers ---- */

#define MAX_INT_PART 9999999999999999.0L /* integer parts have at most 16 digits */

/* The integer parts I of |x| = I + f allowed, for f = 0 (fz) and for
 * 0 < f < 1 (fnz). */
typedef struct irange {
    long double lo, hi;
} irange;

/* |x| >= a (> a when excl), a whole: I + f >= a holds for I >= a whatever
 * f is; I + f > a needs I > a when f = 0 but only I >= a when f > 0. */
static void lower_on(irange *fz, irange *fnz, long double a, bool excl)
{
    long double z = excl ? a + 1 : a;
    if (fz->lo < z)
        fz->lo = z;
    if (fnz->lo < a)
        fnz->lo = a;
}

/* |x| <= b (< b when excl), b whole: a fraction needs I <= b - 1. */
static void upper_on(irange *fz, irange *fnz, long double b, bool excl)
{
    long double z = excl ? b - 1 : b;
    if (fz->hi > z)
        fz->hi = z;
    if (fnz->hi > b - 1)
        fnz->hi = b - 1;
}

/* Integer parts for x >= 0 (neg false) or x < 0 written "-I.F" (neg):
 * there x >= L is |x| <= -L, and x <= H is |x| >= -H. */
static void side_ranges(const bound *lo, const bound *hi, bool neg, irange *fz, irange *fnz)
{
    *fz = *fnz = (irange){0, MAX_INT_PART};
    if (!neg) {
        if (lo->set)
            lower_on(fz, fnz, lo->v, lo->excl);
        if (hi->set)
            upper_on(fz, fnz, hi->v, hi->excl);
        return;
    }
    if (hi->set)
        lower_on(fz, fnz, -hi->v, hi->excl);
    if (lo->set)
        upper_on(fz, fnz, -lo->v, lo->excl);
    if (fz->lo < 1)
        fz->lo = 1; /* no "-0": 0 is written on the other side */
}

static void digit_class(mr_buf *b, char lo, char hi)
{
    if (lo == hi)
        mr_buf_printf(b, "\"%c\"", lo);
    else
        mr_buf_printf(b, "[%c-%c]", lo, hi);
}

/* Appends a sequence: the digit strings of length n from a to z (a <= z):
 * a common first digit, then the rest; else a's first digit with what
 * may follow it, the whole first digits in between, z's first digit with
 * what may follow it. */
static void digits_range(mr_buf *b, const char *a, const char *z, size_t n)
{
    if (a[0] == z[0]) {
        mr_buf_printf(b, "\"%c\"", a[0]);
        if (n > 1) {
            mr_buf_adds(b, " ");
            digits_range(b, a + 1, z + 1, n - 1);
        }
        return;
    }
    static const char nines[] = "9999999999999999", zeros[] = "0000000000000000";
    bool a_low = strspn(a + 1, "0") == n - 1, z_high = strspn(z + 1, "9") == n - 1;
    char from = a_low ? a[0] : (char)(a[0] + 1), to = z_high ? z[0] : (char)(z[0] - 1);
    alts parts = {0};
    mr_buf seq = {0};
    if (!a_low) {
        mr_buf_printf(&seq, "\"%c\" ", a[0]);
        digits_range(&seq, a + 1, nines + 16 - (n - 1), n - 1);
        alts_add(&parts, seq.p);
    }
    if (from <= to) {
        mr_buf_clear(&seq);
        digit_class(&seq, from, to);
        if (n > 1)
            mr_buf_printf(&seq, n > 2 ? " [0-9]{%zu}" : " [0-9]", n - 1);
        alts_add(&parts, seq.p);
    }
    if (!z_high) {
        mr_buf_clear(&seq);
        mr_buf_printf(&seq, "\"%c\" ", z[0]);
        digits_range(&seq, zeros + 16 - (n - 1), z + 1, n - 1);
        alts_add(&parts, seq.p);
    }
    if (parts.n == 1)
        mr_buf_adds(b, parts.b.p);
    else
        alts_put(&parts, b);
    mr_buf_free(&parts.b);
    mr_buf_free(&seq);
}

/* Appends one element: the decimal forms (no leading zeros) of the whole
 * numbers lo..hi, 0 <= lo <= hi <= MAX_INT_PART. */
static void uint_range(mr_buf *b, long double lo, long double hi)
{
    alts a = {0};
    long double dlo = 0, dhi = 9;
    for (int d = 1; d <= 16; d++, dlo = dhi + 1, dhi = dhi * 10 + 9) {
        long double x = lo > dlo ? lo : dlo, y = hi < dhi ? hi : dhi;
        if (x > y)
            continue;
        char sa[24], sz[24];
        mr_buf seq = {0};
        snprintf(sa, sizeof sa, "%0*lld", d, (long long)x);
        snprintf(sz, sizeof sz, "%0*lld", d, (long long)y);
        digits_range(&seq, sa, sz, (size_t)d);
        alts_add(&a, seq.p);
        mr_buf_free(&seq);
    }
    alts_put(&a, b);
    mr_buf_free(&a.b);
}

static void number_alt(alts *out, bool neg, const irange *r, bool fraction)
{
    if (r->lo > r->hi)
        return;
    mr_buf seq = {0};
    if (neg)
        mr_buf_adds(&seq, "\"-\" ");
    uint_range(&seq, r->lo, r->hi);
    if (fraction)
        mr_buf_adds(&seq, " \".\" [0-9]{0,15} [1-9]");
    alts_add(out, seq.p);
    mr_buf_free(&seq);
}

/* A whole bound for integers: x >= 2.5 is x >= 3, x > 2 is x >= 3. */
static bound int_bound(bound b, bool lower)
{
    if (b.set) {
        if (lower)
            b.v = b.excl ? floorl(b.v) + 1 : ceill(b.v);
        else
            b.v = b.excl ? ceill(b.v) - 1 : floorl(b.v);
        b.excl = false;
    }
    return b;
}

static int emit_numbers(jsc *c, const shape *sh, alts *out)
{
    bool intg = sh->types & T_INT, frac = sh->types & T_FRAC;
    if (!intg && !frac)
        return 0;
    if (sh->multiple_ptr)
        return unsupported(c, sh->multiple_ptr, "multipleOf", "only 1");
    if (!sh->lo.set && !sh->hi.set) {
        alts_add(out, frac ? "json-number" : "json-integer");
        return 0;
    }
    bound lo = sh->lo, hi = sh->hi;
    if (frac) {
        const bound *bs[2] = {&lo, &hi};
        for (int i = 0; i < 2; i++)
            if (bs[i]->set && bs[i]->v != floorl(bs[i]->v))
                return unsupported(c, bs[i]->ptr, bs[i]->kw,
                                   "with a fraction, on numbers: only integers take any bound");
    } else {
        lo = int_bound(lo, true);
        hi = int_bound(hi, false);
    }
    for (int neg = 0; neg < 2; neg++) {
        irange fz, fnz;
        side_ranges(&lo, &hi, neg, &fz, &fnz);
        if (intg)
            number_alt(out, neg, &fz, false);
        if (frac)
            number_alt(out, neg, &fnz, true);
    }
    return 0;
}

/* ---- strings ---- */

static int emit_string(jsc *c, const shape *sh, alts *out)
{
    mr_buf seq = {0};
    bool empty;
    int rc = string_seq(c, sh, &seq, &empty);
    if (!rc && !empty) {
        char name[RULE_NAME];
        if (sh->pattern) /* a rule of its own: its groups do not nest into ours */
            rc = helper_rule(c, seq.p, name, sizeof name);
        if (!rc)
            alts_add(out, sh->pattern ? name : seq.p);
    }
    mr_buf_free(&seq);
    return rc;
}

/* ---- arrays ---- */

static size_t sub_inf(size_t a, size_t b)
{
    return a == MR_JSG_INF ? a : a - b;
}

/* The array rule: item[0..n_pre) the tuple's items, item[n_pre] the rest
 * (rest: items may follow the tuple), lo..hi items (hi >= lo). */
static int array_rule(jsc *c, const mr_buf *item, size_t n_pre, bool rest, size_t lo, size_t hi, alts *out)
{
    mr_buf next = {0}, body = {0}, elem = {0};
    char name[RULE_NAME];
    int rc = 0;
    if (rest && hi > n_pre) {
        mr_buf_printf(&elem, "( \",\" json-ws %s )", item[n_pre].p);
        if (n_pre == 0) {
            mr_buf_printf(&next, "%s ", item[0].p);
            mr_jsg_repeat(&next, elem.p, lo > 1 ? lo - 1 : 0, sub_inf(hi, 1));
        } else {
            mr_jsg_repeat(&next, elem.p, lo > n_pre ? lo - n_pre : 0, sub_inf(hi, n_pre));
        }
    }
    for (size_t i = n_pre; i-- > 1 && !rc;) {
        mr_buf_clear(&body);
        mr_buf_printf(&body, "%s\",\" json-ws %s%s%s%s", i >= lo ? "( " : "", item[i].p, next.len ? " " : "",
                      next.len ? next.p : "", i >= lo ? " )?" : "");
        rc = helper_rule(c, body.p, name, sizeof name);
        mr_buf_clear(&next);
        mr_buf_adds(&next, name);
    }
    if (!rc) {
        alts a = {0};
        if (lo == 0)
            alts_add(&a, "\"[\" json-ws \"]\"");
        if (hi >= 1) {
            mr_buf_clear(&body);
            if (n_pre)
                mr_buf_printf(&body, "\"[\" json-ws %s%s%s json-ws \"]\"", item[0].p, next.len ? " " : "",
                              next.len ? next.p : "");
            else
                mr_buf_printf(&body, "\"[\" json-ws %s json-ws \"]\"", next.p);
            alts_add(&a, body.p);
        }
        rc = helper_rule(c, a.b.p, name, sizeof name);
        if (!rc)
            alts_add(out, name);
        mr_buf_free(&a.b);
    }
    mr_buf_free(&next);
    mr_buf_free(&body);
    mr_buf_free(&elem);
    return rc;
}

#define MAX_UNIQUE 32 /* values of items whose distinct subsets are written out */

/* uniqueItems over items that allow a few values (k of them) only: each
 * value at most once, in the order listed.  T(i, n): what may follow n
 * items when the values from i on are left, named base + i * (hi + 1) + n;
 * viable when n <= hi and enough values are left to reach lo. */
typedef struct uniq {
    const valset *vals;
    size_t k, lo, hi;
    unsigned base;
} uniq;

static bool uniq_viable(const uniq *u, size_t i, size_t n)
{
    return n <= u->hi && n + (u->k - i) >= u->lo;
}

static unsigned uniq_name(const uniq *u, size_t i, size_t n)
{
    return u->base + (unsigned)(i * (u->hi + 1) + n);
}

/* The T rules: the next item is value i (and then T(i + 1, n + 1)), or
 * value i is left out (T(i + 1, n)); T(k, n) ends the array. */
static int uniq_tails(jsc *c, const uniq *u)
{
    mr_buf body = {0}, lit = {0};
    char name[RULE_NAME];
    int rc = 0;
    for (size_t i = u->k + 1; i-- > 0 && !rc;)
        for (size_t n = 1; n <= u->hi && !rc; n++) {
            if (!uniq_viable(u, i, n))
                continue;
            mr_buf_clear(&body);
            if (i == u->k) {
                mr_buf_adds(&body, "()");
            } else {
                mr_buf_clear(&lit);
                value_seq(&lit, json_array_get(u->vals->arr, i));
                if (n < u->hi && uniq_viable(u, i + 1, n + 1))
                    mr_buf_printf(&body, "\",\" json-ws %s %s-%u", lit.p, c->name, uniq_name(u, i + 1, n + 1));
                if (uniq_viable(u, i + 1, n))
                    mr_buf_printf(&body, "%s%s-%u", body.len ? " | " : "", c->name, uniq_name(u, i + 1, n));
            }
            snprintf(name, sizeof name, "%s-%u", c->name, uniq_name(u, i, n));
            if (rule_put(c->g, name, body.p, c->err))
                rc = mr_err_wrap(c->err, "%s", c->where);
        }
    mr_buf_free(&body);
    mr_buf_free(&lit);
    return rc;
}

static int unique_rule(jsc *c, const valset *vals, size_t lo, size_t hi, alts *out)
{
    uniq u = {vals, valset_size(vals), lo, hi, c->serial + 1};
    c->serial += (unsigned)((u.k + 1) * (hi + 1) + 1);
    int rc = uniq_tails(c, &u);
    mr_buf body = {0}, lit = {0};
    alts first = {0}, arr = {0};
    char name[RULE_NAME];
    for (size_t i = 0; i < u.k && !rc; i++)
        if (uniq_viable(&u, i + 1, 1)) {
            mr_buf_clear(&lit);
            value_seq(&lit, json_array_get(vals->arr, i));
            mr_buf_clear(&body);
            mr_buf_printf(&body, "%s %s-%u", lit.p, c->name, uniq_name(&u, i + 1, 1));
            alts_add(&first, body.p);
        }
    if (!rc && lo == 0)
        alts_add(&arr, "\"[\" json-ws \"]\"");
    if (!rc && first.n) {
        rc = helper_rule(c, first.b.p, name, sizeof name);
        mr_buf_clear(&body);
        mr_buf_printf(&body, "\"[\" json-ws %s json-ws \"]\"", name);
        alts_add(&arr, body.p);
    }
    if (!rc && arr.n) {
        rc = helper_rule(c, arr.b.p, name, sizeof name);
        if (!rc)
            alts_add(out, name);
    }
    mr_buf_free(&body);
    mr_buf_free(&lit);
    mr_buf_free(&first.b);
    mr_buf_free(&arr.b);
    return rc;
}

/* uniqueItems without a tuple: 1 when written (or no array fits), 0 when
 * the items allow more than MAX_UNIQUE values, -1 on error. */
static int emit_unique(jsc *c, const ents *fl, size_t lo, size_t hi, alts *out)
{
    ents at = {0};
    unsigned types;
    valset *cand = NULL, *ok = NULL;
    array_at(c, fl, 0, &at);
    int rc = conj_summary(c, &at, &types, &cand, NULL);
    if (!rc && cand && valset_size(cand) <= MAX_UNIQUE) {
        ok = valset_new();
        size_t i;
        json_t *v;
        json_array_foreach(cand->arr, i, v)
        {
            int r = validate(c, &at, NULL, v, 0);
            if (r < 0) {
                rc = -1;
                break;
            }
            if (r)
                valset_add(ok, v);
        }
        if (!rc && hi > valset_size(ok))
            hi = valset_size(ok);
        if (!rc && lo <= hi)
            rc = unique_rule(c, ok, lo, hi, out);
    }
    int done = rc ? -1 : ok != NULL;
    valset_free(cand);
    valset_free(ok);
    ents_free(&at);
    return done;
}

/* The elements of the tuple's items, item[i] for i < *n_pre, and of the
 * rest, item[*n_pre] (*rest: items may follow the tuple).  An item no
 * value fits ends the arrays before it (*n_pre, *hi lowered). */
static int array_items(jsc *c, const ents *fl, size_t m, mr_buf *item, size_t *n_pre, size_t *hi, bool *rest)
{
    int rc = 0;
    bool empty = false;
    *rest = false;
    for (size_t i = 0; i < *n_pre && !rc; i++) {
        ents at = {0};
        array_at(c, fl, i, &at);
        rc = compile(c, &at, NULL, (pos){-1, false}, NULL, &item[i], &empty);
        ents_free(&at);
        if (!rc && empty)
            *n_pre = *hi = i;
    }
    if (!rc && *hi > m) {
        ents at = {0};
        array_at(c, fl, m, &at);
        rc = compile(c, &at, NULL, (pos){-1, false}, NULL, &item[*n_pre], &empty);
        ents_free(&at);
        if (!rc && empty)
            *hi = m;
        *rest = !rc && !empty;
    }
    return rc;
}

static int emit_array(jsc *c, const shape *sh, const ents *fl, alts *out)
{
    if (!any_keyword(fl, array_kws, sizeof array_kws / sizeof array_kws[0])) {
        alts_add(out, "json-array");
        return 0;
    }
    size_t m = prefix_max(c, fl), lo = sh->min_items, hi = sh->max_items;
    if (lo > hi)
        return 0;
    if (lo > MR_JSG_MAX_COUNT)
        return unsupported(c, NULL, "minItems", "above 100000");
    if (hi != MR_JSG_INF && hi > MR_JSG_MAX_COUNT)
        hi = MR_JSG_MAX_COUNT; /* fewer items than allowed are still valid */
    if (sh->unique_ptr && hi > 1) {
        int r = m ? 0 : emit_unique(c, fl, lo, hi, out);
        if (r)
            return r < 0 ? -1 : 0;
        if (lo > 1)
            return unsupported(c, sh->unique_ptr, "uniqueItems",
                               "beside minItems above 1, only where the items allow at most 32 values");
        hi = 1; /* one item is always unique */
    }
    size_t n_pre = m < hi ? m : hi, n_alloc = n_pre + 1;
    mr_buf *item = calloc(n_alloc, sizeof *item);
    if (!item)
        abort();
    bool rest;
    int rc = array_items(c, fl, m, item, &n_pre, &hi, &rest);
    if (!rc && lo <= hi)
        rc = array_rule(c, item, n_pre, rest, lo, hi, out);
    for (size_t i = 0; i < n_alloc; i++)
        mr_buf_free(&item[i]);
    free(item);
    return rc;
}

/* ---- objects ---- */

/* A trie of property names by code point: node 0 is the root; kid and
 * next are node indexes, 0 none. */
typedef struct tnode {
    uint32_t cp;
    size_t kid, next;
    bool end;
} tnode;

/* The code point at s[*i] of s[0..n) (a name from the schema: valid
 * UTF-8), *i past it. */
static uint32_t next_cp(const char *s, size_t n, size_t *i)
{
    size_t k;
    uint32_t cp = mr_utf8_decode((const uint8_t *)s + *i, n - *i, &k);
    *i += k;
    return cp;
}

static size_t trie_child(tnode **t, size_t *n, size_t *cap, size_t at, uint32_t cp)
{
    size_t k;
    for (k = (*t)[at].kid; k; k = (*t)[k].next)
        if ((*t)[k].cp == cp)
            return k;
    if (*n == *cap)
        *t = grow(*t, cap, sizeof **t);
    (*t)[*n] = (tnode){cp, 0, (*t)[at].kid, false};
    (*t)[at].kid = *n;
    return (*n)++;
}

/* Names holding '"', '\' or a control character need escapes, which the
 * keys written here never use: no such key can clash with them. */
static bool raw_name(const char *s)
{
    for (; *s; s++)
        if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20)
            return false;
    return true;
}

/* The trie of the names that keys written without escapes could spell;
 * *n its nodes. */
static tnode *name_trie(const pname *names, size_t n_names, size_t *n)
{
    size_t cap = 16;
    tnode *t = calloc(cap, sizeof *t);
    if (!t)
        abort();
    *n = 1;
    for (size_t i = 0; i < n_names; i++) {
        if (!raw_name(names[i].name))
            continue;
        size_t at = 0, len = strlen(names[i].name);
        for (size_t j = 0; j < len;)
            at = trie_child(&t, n, &cap, at, next_cp(names[i].name, len, &j));
        t[at].end = true;
    }
    return t;
}

/* Appends code point cp as a GBNF literal. */
static void cp_literal(mr_buf *out, uint32_t cp)
{
    char u[4];
    mr_gbnf_literal(out, u, mr_utf8_encode(cp, u), NULL);
}

/* One element: a JSON string (no escapes) that is none of the names.
 * Rule K of a trie node: stop here (unless a name ends here), go on with
 * a character that starts no name from here (then anything), or with one
 * that does (then that child's K). */
static int extra_key(jsc *c, const pname *names, size_t n, mr_buf *out)
{
    size_t nn;
    tnode *t = name_trie(names, n, &nn);
    unsigned base = c->serial + 1;
    c->serial += (unsigned)nn;
    mr_buf body = {0};
    int rc = 0;
    for (size_t i = 0; i < nn && !rc; i++) {
        mr_buf_clear(&body);
        mr_buf_adds(&body, "[^\"\\\\\\x00-\\x1f");
        for (size_t k = t[i].kid; k; k = t[k].next)
            mr_buf_printf(&body, "\\U%08X", t[k].cp);
        mr_buf_adds(&body, "] json-rchar*");
        for (size_t k = t[i].kid; k; k = t[k].next) {
            mr_buf_adds(&body, " | ");
            cp_literal(&body, t[k].cp);
            mr_buf_printf(&body, " %s-%zu", c->name, base + k);
        }
        if (!t[i].end)
            mr_buf_adds(&body, " | ()");
        char name[RULE_NAME];
        snprintf(name, sizeof name, "%s-%zu", c->name, base + i);
        if (rule_put(c->g, name, body.p, c->err))
            rc = mr_err_wrap(c->err, "%s", c->where);
    }
    mr_buf_printf(out, "\"\\\"\" %s-%u \"\\\"\"", c->name, base);
    mr_buf_free(&body);
    free(t);
    return rc;
}

/* One property (or extra member) of an object being written. */
typedef struct member {
    mr_buf pair; /* KEY json-ws ":" json-ws VALUE */
    bool required;
} member;

/* after[j] for j = k down to 1: what may follow once something was
 * written before member j; after[k] is the extra members ("" none). */
static int after_chain(jsc *c, const member *mb, size_t k, const char *extra, char **after)
{
    mr_buf body = {0};
    char name[RULE_NAME] = "";
    int rc = 0;
    if (extra) {
        mr_buf_printf(&body, "( \",\" json-ws %s )*", extra);
        rc = helper_rule(c, body.p, name, sizeof name);
    }
    after[k] = xstrdup(name);
    for (size_t j = k; j-- > 1 && !rc;) {
        mr_buf_clear(&body);
        mr_buf_printf(&body, mb[j].required ? "\",\" json-ws %s%s%s" : "( \",\" json-ws %s )?%s%s", mb[j].pair.p,
                      *after[j + 1] ? " " : "", after[j + 1]);
        rc = helper_rule(c, body.p, name, sizeof name);
        after[j] = xstrdup(name);
    }
    mr_buf_free(&body);
    return rc;
}

/* The object rule: the members in order (each at most once, required
 * ones always), then extra members when extra is set.  The first member
 * written is one up to and including the first required one; with none
 * required, an extra member may come first too, or nothing at all. */
static int object_rule(jsc *c, const member *mb, size_t k, const char *extra, alts *out)
{
    mr_buf body = {0};
    alts first = {0}, obj = {0};
    char name[RULE_NAME];
    size_t n_req = 0;
    for (size_t j = 0; j < k; j++)
        n_req += mb[j].required;
    char **after = calloc(k + 1, sizeof *after);
    if (!after)
        abort();
    int rc = after_chain(c, mb, k, extra, after);
    for (size_t j = 0; j < k && !rc; j++) {
        mr_buf_clear(&body);
        mr_buf_printf(&body, "%s%s%s", mb[j].pair.p, *after[j + 1] ? " " : "", after[j + 1]);
        alts_add(&first, body.p);
        if (mb[j].required)
            break;
    }
    if (!rc && !n_req && extra) {
        mr_buf_clear(&body);
        mr_buf_printf(&body, "%s %s", extra, after[k]);
        alts_add(&first, body.p);
    }
    if (!rc && first.n) {
        rc = helper_rule(c, first.b.p, name, sizeof name);
        mr_buf_clear(&body);
        mr_buf_printf(&body, "\"{\" json-ws %s json-ws \"}\"", name);
        alts_add(&obj, body.p);
    }
    if (!rc && !n_req)
        alts_add(&obj, "\"{\" json-ws \"}\"");
    if (!rc) {
        rc = helper_rule(c, obj.b.p, name, sizeof name);
        if (!rc)
            alts_add(out, name);
    }
    for (size_t j = 0; j <= k; j++)
        free(after[j]);
    free(after);
    mr_buf_free(&body);
    mr_buf_free(&first.b);
    mr_buf_free(&obj.b);
    return rc;
}

/* Members by name: the value each may take (*k of them kept: optional
 * ones that no value fits are left out); *impossible when a required one
 * has no value. */
static int object_members(jsc *c, const ents *fl, const pname *names, size_t n, member *mb, size_t *k, bool *impossible)
{
    *k = 0;
    *impossible = false;
    for (size_t i = 0; i < n; i++) {
        ents at = {0};
        mr_buf val = {0}, key = {0};
        bool empty;
        object_at(c, fl, names[i].name, &at);
        int rc = compile(c, &at, NULL, (pos){-1, false}, NULL, &val, &empty);
        ents_free(&at);
        if (!rc && !empty) {
            mb[*k].required = names[i].required;
            put_string(&key, names[i].name, strlen(names[i].name));
            mr_gbnf_literal(&mb[*k].pair, key.p, key.len, NULL);
            mr_buf_printf(&mb[*k].pair, " json-ws \":\" json-ws %s", val.p);
            (*k)++;
        }
        mr_buf_free(&val);
        mr_buf_free(&key);
        if (rc)
            return rc;
        if (empty && names[i].required) {
            *impossible = true;
            return 0;
        }
    }
    return 0;
}

/* Members beyond the named ones: with the values additionalProperties /
 * unevaluatedProperties allow; where neither is said, any members when
 * no property is named, else none (validators accept their absence). */
static int object_extra_pair(jsc *c, const ents *fl, const pname *names, size_t n, mr_buf *pair, bool *have)
{
    ents xs = {0};
    mr_buf val = {0};
    bool said, empty = false;
    int rc = 0;
    object_extra(c, fl, &xs, &said);
    if (said)
        rc = compile(c, &xs, NULL, (pos){-1, false}, NULL, &val, &empty);
    else if (n == 0)
        mr_buf_adds(&val, "json-value");
    ents_free(&xs);
    *have = !rc && !empty && val.len;
    if (*have) {
        if (n == 0)
            mr_buf_adds(pair, "json-string");
        else
            rc = extra_key(c, names, n, pair);
        mr_buf_printf(pair, " json-ws \":\" json-ws %s", val.p);
    }
    mr_buf_free(&val);
    return rc;
}

static int emit_object(jsc *c, const shape *sh, const ents *fl, alts *out)
{
    if (!any_keyword(fl, object_kws, sizeof object_kws / sizeof object_kws[0])) {
        alts_add(out, "json-object");
        return 0;
    }
    pname *names;
    size_t n, k = 0, n_req = 0;
    object_names(fl, &names, &n);
    member *mb = calloc(n + 1, sizeof *mb);
    if (!mb)
        abort();
    mr_buf extra = {0};
    bool impossible, have_extra = false;
    int rc = object_members(c, fl, names, n, mb, &k, &impossible);
    for (size_t j = 0; j < k; j++)
        n_req += mb[j].required;
    if (!rc && !impossible)
        rc = object_extra_pair(c, fl, names, n, &extra, &have_extra);
    if (!rc && !impossible) {
        if (sh->min_props > n_req)
            rc = unsupported(c, sh->min_props_ptr, "minProperties", "only where the required properties imply it");
        else if (sh->max_props < n_req)
            impossible = true;
        else if (sh->max_props != MR_JSG_INF && (have_extra || sh->max_props < k))
            rc = unsupported(c, sh->max_props_ptr, "maxProperties", "only where the properties allowed imply it");
    }
    if (!rc && !impossible)
        rc = object_rule(c, mb, k, have_extra ? extra.p : NULL, out);
    for (size_t j = 0; j < n; j++)
        mr_buf_free(&mb[j].pair);
    free(mb);
    free(names);
    mr_buf_free(&extra);
    return rc;
}

/* ---- one place ---- */

static bool all_trivial(const ents *fl)
{
    for (size_t i = 0; i < fl->n; i++) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)fl->v[i].s, k, v) if (is_constraining(k)) return false;
    }
    return true;
}

/* enum/const: the values that every other keyword allows too. */
static int emit_values(jsc *c, const shape *sh, const ents *fl, alts *out)
{
    size_t i;
    const json_t *v;
    mr_buf lit = {0};
    int rc = 0;
    json_array_foreach(sh->vals->arr, i, v)
    {
        int r = validate_shape(c, sh, fl, v, 0);
        if (r < 0) {
            rc = -1;
            break;
        }
        if (!r)
            continue;
        mr_buf_clear(&lit);
        value_seq(&lit, v);
        alts_add(out, lit.p);
    }
    mr_buf_free(&lit);
    return rc;
}

/* The grammar of what the merged set fl allows, as one element. */
static int emit_shape(jsc *c, const shape *sh, const ents *fl, mr_buf *out, bool *empty)
{
    if (all_trivial(fl)) {
        mr_buf_adds(out, "json-value");
        *empty = false;
        return 0;
    }
    alts a = {0};
    int rc = 0;
    if (sh->vals) {
        rc = emit_values(c, sh, fl, &a);
    } else {
        if (sh->types & T_NULL)
            alts_add(&a, "\"null\"");
        if (sh->types & T_BOOL) {
            alts_add(&a, "\"true\"");
            alts_add(&a, "\"false\"");
        }
        rc = emit_numbers(c, sh, &a);
        if (!rc && (sh->types & T_STR))
            rc = emit_string(c, sh, &a);
        if (!rc && (sh->types & T_ARR))
            rc = emit_array(c, sh, fl, &a);
        if (!rc && (sh->types & T_OBJ))
            rc = emit_object(c, sh, fl, &a);
    }
    *empty = a.n == 0;
    if (!rc && a.n)
        alts_put(&a, out);
    mr_buf_free(&a.b);
    return rc;
}

/* ---- rules remembered by their set of schemas ---- */

static int cmp_uptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* The set's identity: its schemas, and its picked branches marked apart
 * (json_t pointers are aligned, so the low bit is free). */
static void make_key(const ents *cin, const picks *pk, memo *m)
{
    size_t n = cin->n + (pk ? pk->n : 0);
    m->key = malloc((n ? n : 1) * sizeof *m->key);
    if (!m->key)
        abort();
    for (size_t i = 0; i < cin->n; i++)
        m->key[i] = (uintptr_t)cin->v[i].s;
    for (size_t i = 0; pk && i < pk->n; i++)
        m->key[cin->n + i] = (uintptr_t)json_array_get(pk->v[i].arr, pk->v[i].idx) | 1;
    qsort(m->key, n, sizeof *m->key, cmp_uptr);
    m->n_key = n;
    m->hash = mr_fnv1a(m->key, n * sizeof *m->key);
}

static int memo_find(const jsc *c, const memo *k)
{
    for (size_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].hash == k->hash && c->memo[i].n_key == k->n_key &&
            !memcmp(c->memo[i].key, k->key, k->n_key * sizeof *k->key))
            return (int)i;
    return -1;
}

static void add_edge(jsc *c, pos at, int to)
{
    if (!at.start || at.owner < 0)
        return;
    if (c->n_edge == c->cap_edge)
        c->edge = grow(c->edge, &c->cap_edge, sizeof *c->edge);
    c->edge[c->n_edge][0] = at.owner;
    c->edge[c->n_edge][1] = to;
    c->n_edge++;
}

static int compile_body(jsc *c, const ents *cin, const picks *pk, const flat *f, pos at, mr_buf *out, bool *empty);

/* The set as a rule of its own (named force, or name-N), written once. */
static int compile_memo(jsc *c, const ents *cin, const picks *pk, const flat *f, pos at, const char *force, mr_buf *out,
                        bool *empty)
{
    memo key = {0};
    make_key(cin, pk, &key);
    int i = memo_find(c, &key);
    if (i >= 0) {
        free(key.key);
        *empty = c->memo[i].state == M_EMPTY;
        c->memo[i].hit_busy |= c->memo[i].state == M_BUSY;
        if (!*empty)
            mr_buf_adds(out, c->memo[i].name);
        add_edge(c, at, i);
        return 0;
    }
    char name[RULE_NAME];
    if (force)
        snprintf(name, sizeof name, "%s", force);
    else
        snprintf(name, sizeof name, "%s-%u", c->name, ++c->serial);
    if (c->n_memo == c->cap_memo)
        c->memo = grow(c->memo, &c->cap_memo, sizeof *c->memo);
    i = (int)c->n_memo++;
    key.name = xstrdup(name);
    key.state = M_BUSY;
    key.ptr = cin->n ? cin->v[0].ptr : "";
    c->memo[i] = key;
    add_edge(c, at, i);
    mr_buf body = {0};
    int rc = compile_body(c, cin, pk, f, (pos){i, true}, &body, empty);
    if (!rc && *empty && c->memo[i].hit_busy)
        rc = fail(c, c->memo[i].ptr, "a schema that refers to itself allows no value");
    if (!rc && !*empty && rule_put(c->g, name, body.p, c->err))
        rc = mr_err_wrap(c->err, "%s", c->where);
    c->memo[i].state = *empty ? M_EMPTY : M_DONE;
    if (!rc && !*empty)
        mr_buf_adds(out, name);
    mr_buf_free(&body);
    return rc;
}

/* anyOf/oneOf still open: one alternative per branch, each compiled with
 * the rest of the set. */
static int compile_disj(jsc *c, const ents *cin, const picks *pk, const flat *f, pos at, mr_buf *out, bool *empty)
{
    if (f->n_disj > 1 && f->combos > MAX_COMBOS)
        return fail(c, f->disj_ptr, "more than %d combinations of anyOf/oneOf branches", MAX_COMBOS);
    if (f->disj_one && check_disjoint(c, f->disj, f->disj_ptr))
        return -1;
    alts a = {0};
    mr_buf elem = {0};
    int rc = 0;
    size_t i;
    const json_t *b;
    json_array_foreach(f->disj, i, b)
    {
        picks p2;
        bool e;
        picks_with(pk, f->disj, i, &p2);
        mr_buf_clear(&elem);
        rc = compile(c, cin, &p2, at, NULL, &elem, &e);
        free(p2.v);
        if (rc)
            break;
        if (!e)
            alts_add(&a, elem.p);
    }
    *empty = a.n == 0;
    if (!rc && a.n)
        alts_put(&a, out);
    mr_buf_free(&a.b);
    mr_buf_free(&elem);
    return rc;
}

static int compile_body(jsc *c, const ents *cin, const picks *pk, const flat *f, pos at, mr_buf *out, bool *empty)
{
    if (f->disj)
        return compile_disj(c, cin, pk, f, at, out, empty);
    shape sh;
    merge(&f->e, &sh);
    int rc = emit_shape(c, &sh, &f->e, out, empty);
    shape_free(&sh);
    return rc;
}

/* Appends to out one element for the values that every schema of in
 * allows (with the anyOf/oneOf branches pk chosen); *empty when there are
 * none.  force: the set becomes the rule of that name. */
static int compile(jsc *c, const ents *in, const picks *pk, pos at, const char *force, mr_buf *out, bool *empty)
{
    const char *ptr = in->n ? in->v[0].ptr : NULL;
    if (--c->work < 0)
        return too_complex(c, ptr);
    if (c->depth >= MAX_DEPTH)
        return fail(c, ptr, "schemas nested more than %d deep", MAX_DEPTH);
    c->depth++;
    ents cin = {0};
    flat f = {0};
    bool has_ref = false;
    *empty = false;
    int rc = canon(c, in, &cin, &has_ref);
    if (!rc)
        rc = flatten(c, &cin, pk, &f);
    if (!rc && f.is_false)
        *empty = true;
    else if (!rc && (has_ref || f.has_ref || force))
        rc = compile_memo(c, &cin, pk, &f, at, force, out, empty);
    else if (!rc)
        rc = compile_body(c, &cin, pk, &f, at, out, empty);
    c->depth--;
    ents_free(&cin);
    ents_free(&f.e);
    return rc;
}

/* A memo rule that reaches itself through rules that each start with the
 * next (no byte between): left recursion.  Kahn's order finds whether
 * there is one; walking back from what it leaves lands on the cycle. */
static int check_cycles(jsc *c)
{
    size_t n = c->n_memo;
    size_t *indeg = calloc(n + 1, sizeof *indeg), *queue = calloc(n + 1, sizeof *queue);
    if (!indeg || !queue)
        abort();
    for (size_t e = 0; e < c->n_edge; e++)
        indeg[c->edge[e][1]]++;
    size_t head = 0, tail = 0;
    for (size_t i = 0; i < n; i++)
        if (!indeg[i])
            queue[tail++] = i;
    while (head < tail) {
        size_t v = queue[head++];
        for (size_t e = 0; e < c->n_edge; e++)
            if ((size_t)c->edge[e][0] == v && !--indeg[c->edge[e][1]])
                queue[tail++] = (size_t)c->edge[e][1];
    }
    int rc = 0;
    if (tail < n) {
        size_t v = 0;
        while (!indeg[v])
            v++;
        for (size_t step = 0; step < n; step++)
            for (size_t e = 0; e < c->n_edge; e++)
                if ((size_t)c->edge[e][1] == v && indeg[c->edge[e][0]]) {
                    v = (size_t)c->edge[e][0];
                    break;
                }
        rc = fail(c, c->memo[v].ptr,
                  "\"$ref\" cycle: this schema can be itself again before any object or array begins");
    }
    free(indeg);
    free(queue);
    return rc;
}

static void jsc_free(jsc *c)
{
    for (size_t i = 0; i < c->n_memo; i++) {
        free(c->memo[i].key);
        free(c->memo[i].name);
    }
    free(c->memo);
    free(c->edge);
    for (size_t i = 0; i < c->n_strs; i++)
        free(c->strs[i]);
    free(c->strs);
}

int mr_jsgram_add_schema(mr_jsgram *g, const char *name, const json_t *schema, const char *where, mr_err *err)
{
    if (check_new_name(g, name, err))
        return -1;
    size_t text_len = g->text.len, n_names = g->n_names;
    jsc c = {.g = g, .name = name, .where = where ? where : "schema", .root = schema, .err = err, .work = MAX_WORK};
    c.root_id = json_string_value(json_object_get(schema, "$id"));
    const char *draft = json_string_value(json_object_get(schema, "$schema"));
    c.draft7 = draft && strstr(draft, "draft-0");
    ents in = {0};
    mr_buf out = {0};
    bool empty = false;
    ents_push(&in, schema, "", -1);
    int rc = compile(&c, &in, NULL, (pos){-1, false}, name, &out, &empty);
    if (!rc && empty)
        rc = fail(&c, NULL, "the schema allows no value");
    if (!rc)
        rc = check_cycles(&c);
    ents_free(&in);
    mr_buf_free(&out);
    jsc_free(&c);
    if (rc) {
        g->text.len = text_len;
        if (g->text.p)
            g->text.p[text_len] = 0;
        names_truncate(g, n_names);
    }
    return rc;
}

/* A whole grammar whose root is one rule added by add(). */
static int whole_grammar(int (*add)(mr_jsgram *, const void *, mr_err *), const void *arg, char **text, size_t *len,
                         mr_err *err)
{
    *text = NULL;
    *len = 0;
    mr_jsgram *g = mr_jsgram_new();
    if (!g)
        return mr_errf(err, "out of memory");
    int rc = add(g, arg, err);
    if (!rc)
        rc = mr_jsgram_finish(g, text, len, err);
    mr_jsgram_free(g);
    return rc;
}

typedef struct schema_arg {
    const json_t *schema;
    const char *where;
} schema_arg;

static int add_schema_root(mr_jsgram *g, const void *arg, mr_err *err)
{
    const schema_arg *a = arg;
    return mr_jsgram_add_schema(g, "root", a->schema, a->where, err);
}

static int add_object_root(mr_jsgram *g, const void *arg, mr_err *err)
{
    return mr_jsgram_add_object(g, "root", err);
}

static int add_value_root(mr_jsgram *g, const void *arg, mr_err *err)
{
    return mr_jsgram_add_value(g, "root", err);
}

int mr_json_schema_grammar(const json_t *schema, const char *where, char **text, size_t *len, mr_err *err)
{
    schema_arg a = {schema, where};
    return whole_grammar(add_schema_root, &a, text, len, err);
}

int mr_json_object_grammar(char **text, size_t *len, mr_err *err)
{
    return whole_grammar(add_object_root, NULL, text, len, err);
}

int mr_json_value_grammar(char **text, size_t *len, mr_err *err)
{
    return whole_grammar(add_value_root, NULL, text, len, err);
}

/* schema-grammar: the grammar of a JSON Schema (gateway/jsonschema.h),
 * random sentences of it, and which texts it accepts.  The tests drive it
 * to compare the grammar with a real validator.
 *
 *   schema-grammar SCHEMA.json           print the grammar
 *   schema-grammar --json-object         the grammar of any JSON object
 *   schema-grammar --json-value          the grammar of any JSON value
 *   ... --sample N [--seed S]            N random sentences, one per line
 *   ... --check                          reads texts, one per line, and
 *                                        prints accept or reject for each
 *   ... -z                               texts end with a NUL byte instead
 *                                        of a newline (texts with newlines)
 *   schema-grammar --tools TOOLS.json --format hermes|qwen3_xml [--only NAME] [--parallel]
 *                                        the grammar of tool_choice "required"
 *                                        (or NAME) for a request's "tools"
 *
 * A sentence is a random walk over bytes: each step picks one of the
 * bytes the grammar allows next, weighted towards closing strings,
 * arrays and objects as the text grows, and the walk may stop wherever
 * the text is a whole sentence.  Walks that grow too long are dropped.
 * Without -z a walk never picks a newline (it would split the line). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "gateway/jsonschema.h"
#include "gateway/toolgram.h"

#define MAX_SENTENCE 4000 /* bytes of one walk before it is dropped */

typedef struct opts {
    const char *schema;
    int mode; /* 0 schema, 1 any object, 2 any value, 3 tool calls (schema: the tools) */
    mr_tool_format format;
    const char *only;
    bool parallel;
    long sample;
    uint64_t seed;
    bool check, nul;
} opts;

static int usage(void)
{
    fprintf(stderr, "usage: schema-grammar (SCHEMA.json | --json-object | --json-value | --tools TOOLS.json "
                    "--format hermes|qwen3_xml [--only NAME] [--parallel]) [--sample N [--seed S] | --check] [-z]\n");
    return 2;
}

static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json-object"))
            o->mode = 1;
        else if (!strcmp(a, "--json-value"))
            o->mode = 2;
        else if (!strcmp(a, "--sample") && i + 1 < argc)
            o->sample = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--seed") && i + 1 < argc)
            o->seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--check"))
            o->check = true;
        else if (!strcmp(a, "-z"))
            o->nul = true;
        else if (!strcmp(a, "--tools") && i + 1 < argc)
            o->mode = 3, o->schema = argv[++i];
        else if (!strcmp(a, "--format") && i + 1 < argc) {
            const char *f = argv[++i];
            if (strcmp(f, "hermes") && strcmp(f, "qwen3_xml"))
                return -1;
            o->format = !strcmp(f, "hermes") ? MR_TOOLS_HERMES : MR_TOOLS_QWEN_XML;
        } else if (!strcmp(a, "--only") && i + 1 < argc)
            o->only = argv[++i];
        else if (!strcmp(a, "--parallel"))
            o->parallel = true;
        else if (a[0] != '-' && !o->schema)
            o->schema = a;
        else
            return -1;
    }
    if ((o->mode == 0 || o->mode == 3) == !o->schema || o->sample < 0 || (o->sample && o->check) ||
        (o->mode == 3) != (o->format != MR_TOOLS_NONE))
        return -1;
    return 0;
}

static int make_grammar(const opts *o, char **text, size_t *len, mr_err *err)
{
    if (o->mode == 1)
        return mr_json_object_grammar(text, len, err);
    if (o->mode == 2)
        return mr_json_value_grammar(text, len, err);
    json_error_t jerr;
    json_t *schema = json_load_file(o->schema, JSON_DECODE_ANY, &jerr);
    if (!schema)
        return mr_errf(err, "%s:%d: %s", o->schema, jerr.line, jerr.text);
    int rc = o->mode == 3 ? mr_tool_grammar(o->format, schema, o->only, o->parallel, text, len, err)
                          : mr_json_schema_grammar(schema, "schema", text, len, err);
    json_decref(schema);
    return rc;
}

/* ---- sampling ---- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / (double)(1ull << 53);
}

/* Where the walk is in the JSON text, so as to weigh the next byte. */
typedef struct lexstate {
    bool in_str, esc;
    int depth;
} lexstate;

static void lex_step(lexstate *l, unsigned char b)
{
    if (l->in_str) {
        if (l->esc)
            l->esc = false;
        else if (b == '\\')
            l->esc = true;
        else if (b == '"')
            l->in_str = false;
        return;
    }
    if (b == '"')
        l->in_str = true;
    else if (b == '{' || b == '[')
        l->depth++;
    else if (b == '}' || b == ']')
        l->depth--;
}

/* How much the walk prefers byte b among n allowed ones after len bytes:
 * strings end after a few characters, containers close more eagerly the
 * deeper and longer the text, whitespace is rare. */
static double weight(const lexstate *l, unsigned char b, int n, size_t len)
{
    if (l->in_str)
        return !l->esc && b == '"' ? 1.0 + n / 6.0 + len / 64.0 : 1.0;
    switch (b) {
    case '}':
    case ']':
        return 0.5 + 0.5 * l->depth + len / 40.0;
    case '{':
    case '[':
        return 1.0 / (1.0 + 2.0 * l->depth + len / 32.0);
    case ',':
        return 2.0 / (1.0 + len / 100.0);
    case ' ':
    case '\t':
    case '\n':
        return 0.3;
    default:
        return 1.0;
    }
}

/* Tool calls in the XML form: raw text ends at a newline and a closing
 * tag, which grow likelier as the text does. */
static double markup_weight(unsigned char b, int n, size_t len)
{
    return b == '\n' || b == '<' || b == '/' ? 1.0 + n / 6.0 + len / 64.0 : 1.0;
}

/* One random sentence into out; false when the walk was dropped. */
static bool walk(const mr_grammar *g, const mr_gvocab *v, bool nul, bool markup, uint64_t *rng, mr_buf *out)
{
    mr_gmatch *m;
    mr_err err;
    uint32_t mask[8];
    bool done = false;
    lexstate l = {0};
    mr_buf_clear(out);
    if (mr_gmatch_new(g, &m, &err))
        return false;
    while (out->len < MAX_SENTENCE) {
        bool can_end = mr_gmatch_can_end(m);
        if (can_end && (!mr_gmatch_can_continue(m) || rng_unit(rng) < 0.5)) {
            done = true;
            break;
        }
        if (mr_gmatch_mask(m, v, mask, &err))
            break;
        double w[256], total = 0;
        int n = 0;
        for (int b = 0; b < 256; b++)
            n += (mask[b / 32] >> (b % 32)) & 1;
        for (int b = 0; b < 256; b++) {
            bool ok = (mask[b / 32] >> (b % 32)) & 1 && (nul || b != '\n');
            w[b] = !ok ? 0 : markup ? markup_weight((unsigned char)b, n, out->len) : weight(&l, (unsigned char)b, n, out->len);
            total += w[b];
        }
        if (total <= 0) {
            done = can_end;
            break;
        }
        double r = rng_unit(rng) * total;
        int pick = 0;
        while (pick < 255 && (r >= w[pick] || w[pick] == 0)) {
            r -= w[pick];
            pick++;
        }
        while (w[pick] == 0) /* rounding at the very end */
            pick--;
        unsigned char byte = (unsigned char)pick;
        if (!mr_gmatch_accept(m, &byte, 1))
            break;
        mr_buf_add(out, &byte, 1);
        lex_step(&l, byte);
    }
    mr_gmatch_free(m);
    return done;
}

static int sample(const mr_grammar *g, const opts *o)
{
    mr_gvocab *v;
    mr_err err;
    if (mr_gvocab_new_bytes(&v, &err)) {
        fprintf(stderr, "schema-grammar: %s\n", err.msg);
        return 1;
    }
    uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    mr_buf s = {0};
    long printed = 0;
    for (long tries = 0; printed < o->sample && tries < 50 * o->sample; tries++) {
        if (!walk(g, v, o->nul, o->mode == 3 && o->format == MR_TOOLS_QWEN_XML, &rng, &s))
            continue;
        fwrite(s.p ? s.p : "", 1, s.len, stdout);
        fputc(o->nul ? 0 : '\n', stdout);
        printed++;
    }
    mr_buf_free(&s);
    mr_gvocab_free(v);
    if (printed < o->sample) {
        fprintf(stderr, "schema-grammar: only %ld of %ld walks ended\n", printed, o->sample);
        return 1;
    }
    return 0;
}

/* ---- checking ---- */

static bool accepts(const mr_grammar *g, const char *s, size_t n)
{
    mr_gmatch *m;
    mr_err err;
    if (mr_gmatch_new(g, &m, &err))
        return false;
    bool ok = mr_gmatch_accept(m, s, n) && mr_gmatch_can_end(m);
    mr_gmatch_free(m);
    return ok;
}

static int check(const mr_grammar *g, const opts *o)
{
    mr_buf rec = {0};
    int ch;
    bool any = false;
    while ((ch = getchar()) != EOF || any) {
        if (ch != EOF && ch != (o->nul ? 0 : '\n')) {
            char c8 = (char)ch;
            mr_buf_add(&rec, &c8, 1);
            any = true;
            continue;
        }
        puts(accepts(g, rec.p ? rec.p : "", rec.len) ? "accept" : "reject");
        mr_buf_clear(&rec);
        any = false;
        if (ch == EOF)
            break;
    }
    mr_buf_free(&rec);
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse_args(argc, argv, &o))
        return usage();
    char *text;
    size_t len;
    mr_err err;
    if (make_grammar(&o, &text, &len, &err)) {
        fprintf(stderr, "schema-grammar: %s\n", err.msg);
        return 1;
    }
    if (!o.sample && !o.check) {
        fwrite(text, 1, len, stdout);
        free(text);
        return 0;
    }
    mr_grammar *g;
    int rc = 1;
    if (mr_grammar_parse(text, len, &g, &err)) {
        fprintf(stderr, "schema-grammar: %s\n", err.msg);
    } else {
        rc = o.sample ? sample(g, &o) : check(g, &o);
        mr_grammar_free(g);
    }
    free(text);
    return rc;
}

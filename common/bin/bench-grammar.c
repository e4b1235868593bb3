/* bench-grammar [--model MODEL.gguf] [--iters N]
 *
 * Times the grammar matcher's token masks over a real vocabulary (default:
 * the full Qwen3 vocabulary of the fixtures, under $MEMRA_FIXTURES or
 * ../shared/fixtures) with a JSON grammar, in a few states of a document:
 *   cold   a new matcher: nothing remembered (what the first mask of a
 *          request in that state costs);
 *   memo   parse states remembered, the mask cache off (a state met before
 *          whose mask was evicted);
 *   warm   the mask cache hit.
 * Also the vocabulary trie's build time and size, accept() per piece, and a
 * whole generation: a 20 kB document tokenized by the model's tokenizer,
 * with a mask and an accept for each of its tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/grammar.h"
#include "common/grammar_int.h"
#include "common/tokenizer.h"

static const char json_gbnf[] =
    "root    ::= ws value ws\n"
    "value   ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object  ::= \"{\" ws ( member ws ( \",\" ws member ws )* )? \"}\"\n"
    "member  ::= string ws \":\" ws value\n"
    "array   ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string  ::= \"\\\"\" char* \"\\\"\"\n"
    "char    ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number  ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws      ::= [ \\t\\n\\r]*\n";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* The tokenizer's ids as the grammar sees them: ordinary tokens' bytes,
 * nothing for control tokens. */
static mr_gvocab *load_vocab(const mr_tokenizer *t, double *build_us)
{
    mr_err err;
    int n = (int)mr_tok_n_vocab(t);
    const char **pieces = calloc((size_t)n, sizeof *pieces);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    for (int i = 0; pieces && lens && i < n; i++) {
        enum mr_tok_type ty = mr_tok_type(t, i);
        if (ty == MR_TOKTYPE_CONTROL || ty == MR_TOKTYPE_UNUSED || ty == MR_TOKTYPE_UNDEFINED)
            continue;
        pieces[i] = mr_tok_piece_view(t, i, 0, &lens[i]);
    }
    mr_gvocab *v = NULL;
    double t0 = now_us();
    if (!pieces || !lens || mr_gvocab_new(n, pieces, lens, &v, &err))
        fprintf(stderr, "bench-grammar: %s\n", pieces && lens ? err.msg : "out of memory");
    *build_us = now_us() - t0;
    free(pieces);
    free(lens);
    return v;
}

static mr_gmatch *matcher_at(const mr_grammar *g, const char *prefix)
{
    mr_gmatch *m;
    mr_err err;
    if (mr_gmatch_new(g, &m, &err)) {
        fprintf(stderr, "bench-grammar: %s\n", err.msg);
        exit(1);
    }
    if (!mr_gmatch_accept(m, prefix, strlen(prefix))) {
        fprintf(stderr, "bench-grammar: the grammar refuses %s\n", prefix);
        exit(1);
    }
    return m;
}

static int popcount_mask(const uint32_t *mask, size_t words)
{
    int n = 0;
    for (size_t i = 0; i < words; i++)
        n += __builtin_popcount(mask[i]);
    return n;
}

static void mask_or_die(mr_gmatch *m, const mr_gvocab *v, uint32_t *mask)
{
    mr_err err;
    if (mr_gmatch_mask(m, v, mask, &err)) {
        fprintf(stderr, "bench-grammar: %s\n", err.msg);
        exit(1);
    }
}

static void bench_state(const mr_grammar *g, const mr_gvocab *v, const char *name, const char *prefix, int iters)
{
    size_t words = ((size_t)mr_gvocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    double *t = malloc((size_t)iters * sizeof *t);
    if (!mask || !t)
        exit(1);
    size_t states = 0;
    for (int i = 0; i < iters; i++) {
        mr_gmatch *m = matcher_at(g, prefix);
        double t0 = now_us();
        mask_or_die(m, v, mask);
        t[i] = now_us() - t0;
        mr_gmatch_stats st;
        mr_gmatch_get_stats(m, &st);
        states = st.n_states;
        mr_gmatch_free(m);
    }
    double cold = median(t, iters);

    mr_gmatch *m = matcher_at(g, prefix);
    mr_gmatch_limits lim;
    mr_gmatch_get_limits(m, &lim);
    lim.mask_cache = 0;
    mr_gmatch_set_limits(m, &lim);
    mask_or_die(m, v, mask);
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        mask_or_die(m, v, mask);
        t[i] = now_us() - t0;
    }
    double memo = median(t, iters);
    mr_gmatch_stats st;
    mr_gmatch_get_stats(m, &st);
    mr_gmatch_free(m);

    m = matcher_at(g, prefix);
    mask_or_die(m, v, mask);
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        mask_or_die(m, v, mask);
        t[i] = now_us() - t0;
    }
    double warm = median(t, iters);
    mr_gmatch_free(m);
    printf("%-10s %8.1f %8.1f %8.2f %8d %8zu %8zu KiB  %s\n", name, cold, memo, warm, popcount_mask(mask, words),
           states, st.memo_bytes >> 10, prefix);
    free(mask);
    free(t);
}

/* A generation as the server runs it: the document tokenized by the
 * model's own tokenizer, and for each token a mask, then accept.  Reports
 * the mean and worst mask, and what the matcher remembered at the end. */
static void bench_generation(const mr_grammar *g, const mr_gvocab *v, const mr_tokenizer *t, const char *doc)
{
    mr_tokens ids = {0};
    mr_err err;
    if (mr_tok_encode(t, doc, strlen(doc), 0, &ids, &err)) {
        fprintf(stderr, "bench-grammar: %s\n", err.msg);
        exit(1);
    }
    size_t words = ((size_t)mr_gvocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    mr_gmatch *m = matcher_at(g, "");
    double total = 0, worst = 0;
    for (size_t i = 0; i < ids.n; i++) {
        double t0 = now_us();
        mask_or_die(m, v, mask);
        double dt = now_us() - t0;
        total += dt;
        worst = dt > worst ? dt : worst;
        if (!(mask[ids.ids[i] / 32] >> (ids.ids[i] % 32) & 1)) {
            fprintf(stderr, "bench-grammar: token %zu (id %d) not in the mask\n", i, ids.ids[i]);
            exit(1);
        }
        size_t len;
        const char *p = mr_tok_piece_view(t, ids.ids[i], 0, &len);
        if (!mr_gmatch_accept(m, p, len)) {
            fprintf(stderr, "bench-grammar: token %zu refused\n", i);
            exit(1);
        }
    }
    mr_gmatch_stats st;
    mr_gmatch_get_stats(m, &st);
    printf("generation: %zu tokens (%zu bytes), mask mean %.1f us, worst %.1f us; cache %zu hits %zu misses; "
           "%zu states, memo %zu KiB, masks %zu KiB, %zu restarts\n",
           ids.n, strlen(doc), total / (double)ids.n, worst, st.mask_hits, st.mask_misses, st.n_states,
           st.memo_bytes >> 10, st.mask_bytes >> 10, st.flushes);
    mr_gmatch_free(m);
    free(mask);
    mr_tokens_free(&ids);
}

/* A document of records with strings, numbers and nesting, about n bytes. */
static char *make_doc(size_t n)
{
    static const char *const words[] = {"alpha", "beta", "gamma", "delta", "Zoë", "東京", "naïve café", "🙂 ok"};
    size_t cap = n + 512, len = 0;
    char *d = malloc(cap);
    len += (size_t)snprintf(d + len, cap - len, "{\"items\": [");
    for (int i = 0; len + 300 < n; i++)
        len += (size_t)snprintf(d + len, cap - len,
                                "%s{\"id\": %d, \"name\": \"%s %s\", \"score\": %d.%02d, \"tags\": [\"%s\", \"%s\"], "
                                "\"meta\": {\"ok\": %s, \"note\": \"line\\nwith \\\"quotes\\\" and \\u00e9\"}}",
                                i ? ", " : "", i, words[i % 8], words[(i * 3 + 1) % 8], i * 7 % 100, i % 100,
                                words[(i + 2) % 8], words[(i + 5) % 8], i % 2 ? "true" : "false");
    snprintf(d + len, cap - len, "], \"count\": 42}");
    return d;
}

/* accept() over a document cut into the vocabulary's longest tokens that
 * the grammar allows: the per-token cost of following a generation. */
static void bench_accept(const mr_grammar *g, const char *doc, int iters)
{
    double total = 0;
    size_t n = strlen(doc);
    for (int i = 0; i < iters; i++) {
        mr_gmatch *m = matcher_at(g, "");
        double t0 = now_us();
        for (size_t at = 0; at < n; at += 4) {
            size_t k = n - at < 4 ? n - at : 4;
            if (!mr_gmatch_accept(m, doc + at, k)) {
                fprintf(stderr, "bench-grammar: accept failed at %zu\n", at);
                exit(1);
            }
        }
        total += now_us() - t0;
        mr_gmatch_free(m);
    }
    printf("accept: %.2f us per 4-byte piece (new matcher each pass, %zu bytes)\n", total / iters / ((n + 3) / 4.0), n);
}

int main(int argc, char **argv)
{
    char path[4096];
    const char *root = getenv("MEMRA_FIXTURES");
    snprintf(path, sizeof path, "%s/vocab/qwen3-vocab.gguf", root && *root ? root : "../shared/fixtures");
    const char *model = path;
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench-grammar [--model MODEL.gguf] [--iters N]\n");
            return 2;
        }
    }
    if (iters < 1)
        iters = 1;
    mr_tokenizer *tok;
    mr_err err;
    if (mr_tok_load_file(model, &tok, &err)) {
        fprintf(stderr, "bench-grammar: %s\n", err.msg);
        return 1;
    }
    double build_us;
    mr_gvocab *v = load_vocab(tok, &build_us);
    if (!v)
        return 1;
    printf("vocabulary: %d tokens, trie of %u nodes, built in %.1f ms\n", mr_gvocab_size(v), v->n_nodes,
           build_us / 1e3);
    mr_grammar *g;
    if (mr_grammar_parse(json_gbnf, strlen(json_gbnf), &g, &err)) {
        fprintf(stderr, "bench-grammar: %s\n", err.msg);
        return 1;
    }
    printf("microseconds per mask (median of %d)\n", iters);
    printf("%-10s %8s %8s %8s %8s %8s %12s\n", "state", "cold", "memo", "warm", "allowed", "states", "memo");
    bench_state(g, v, "start", "", iters);
    bench_state(g, v, "string", "{\"name\": \"The quick brown fox", iters);
    bench_state(g, v, "number", "{\"count\": 12", iters);
    bench_state(g, v, "after-key", "{\"count\"", iters);
    bench_state(g, v, "value", "{\"count\": ", iters);
    bench_state(g, v, "in-array", "{\"a\": [1, {\"b\": [true, ", iters);
    bench_accept(g,
                 "{\"name\": \"The quick brown fox jumps over the lazy dog\", \"tags\": [\"a\", \"b\"], "
                 "\"count\": 12345, \"ratio\": -0.25e3, \"ok\": true, \"nested\": {\"x\": null, \"y\": [1, 2, 3]}}",
                 iters);
    char *doc = make_doc(20000);
    bench_generation(g, v, tok, doc);
    free(doc);
    mr_grammar_free(g);
    mr_gvocab_free(v);
    mr_tok_free(tok);
    return 0;
}

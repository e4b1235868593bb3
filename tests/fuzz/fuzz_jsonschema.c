/* libFuzzer target: JSON Schemas (outside input: response_format and tool
 * parameters from HTTP clients) through mr_json_schema_grammar.  A schema
 * is refused with a message, or becomes a grammar under
 * MR_GRAMMAR_MAX_TEXT that the engine compiles; a walk through that
 * grammar that ends is a JSON text (jansson parses it). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "gateway/jsonschema.h"

#define WALK_MAX 4096

static mr_gvocab *bytes_vocab(void)
{
    static mr_gvocab *v;
    mr_err err;
    if (!v && mr_gvocab_new_bytes(&v, &err))
        abort();
    return v;
}

/* The next byte of a walk that heads for an end: closers and string ends
 * first, then digits and letters of literals, else the lowest allowed. */
static int pick(const uint32_t *mask)
{
    static const char pref[] = "}]\"0123456789nulltruefalse";
    for (const char *p = pref; *p; p++)
        if ((mask[(unsigned char)*p / 32] >> ((unsigned char)*p % 32)) & 1)
            return (unsigned char)*p;
    for (int b = 0; b < 256; b++)
        if ((mask[b / 32] >> (b % 32)) & 1)
            return b;
    return -1;
}

static void walk(const char *text, size_t len)
{
    mr_grammar *g;
    mr_gmatch *m;
    mr_err err;
    if (mr_grammar_parse(text, len, &g, &err))
        abort(); /* finish compiled it already */
    if (mr_gmatch_new(g, &m, &err)) {
        mr_grammar_free(g);
        return;
    }
    char out[WALK_MAX];
    size_t n = 0;
    bool ended = false;
    uint32_t mask[8];
    while (n < WALK_MAX) {
        if (mr_gmatch_can_end(m)) {
            ended = true;
            break;
        }
        if (mr_gmatch_mask(m, bytes_vocab(), mask, &err))
            break;
        int b = pick(mask);
        if (b < 0)
            break;
        out[n] = (char)b;
        if (!mr_gmatch_accept(m, &out[n], 1))
            break;
        n++;
    }
    if (ended) {
        json_error_t jerr;
        json_t *v = json_loadb(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!v)
            abort();
        json_decref(v);
    }
    mr_gmatch_free(m);
    mr_grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    if (!schema)
        return 0;
    char *text;
    size_t len;
    mr_err err = {{0}};
    if (mr_json_schema_grammar(schema, "schema", &text, &len, &err) == 0) {
        if (len >= MR_GRAMMAR_MAX_TEXT || strlen(text) != len)
            abort();
        walk(text, len);
        free(text);
    } else if (!err.msg[0]) {
        abort(); /* a refusal says why */
    }
    json_decref(schema);
    return 0;
}

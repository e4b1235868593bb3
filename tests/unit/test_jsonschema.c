/* JSON Schema -> grammar (gateway/jsonschema.h): per keyword, the grammar
 * of a schema accepts instances the spec calls valid and rejects invalid
 * ones (written by hand here; tests/node/schema_check.mjs compares with
 * ajv); what cannot be enforced is refused with a message naming it;
 * recursion, nesting and expansions stay bounded; literals round-trip. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/grammar.h"
#include "gateway/jsonschema.h"
#include "tests/unit/testutil.h"

/* JSON written bare in the source: J({"type":"string"}). */
#define J(...) #__VA_ARGS__

static json_t *parse_json(const char *text)
{
    json_error_t jerr;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &jerr);
    ck_assert_msg(v != NULL, "bad JSON in the test: %s: %s", jerr.text, text);
    return v;
}

static mr_grammar *compile_text(const char *text, size_t len)
{
    mr_grammar *g;
    mr_err err;
    ck_assert_msg(mr_grammar_parse(text, len, &g, &err) == 0, "%s\n%s", err.msg, text);
    return g;
}

/* The grammar of a schema given as JSON text; the test fails if refused. */
static mr_grammar *schema_grammar(const char *schema)
{
    json_t *s = parse_json(schema);
    char *text;
    size_t len;
    mr_err err;
    int rc = mr_json_schema_grammar(s, "schema", &text, &len, &err);
    json_decref(s);
    ck_assert_msg(rc == 0, "refused %s: %s", schema, err.msg);
    ck_assert_uint_eq(strlen(text), len);
    mr_grammar *g = compile_text(text, len);
    free(text);
    return g;
}

static bool matches_n(const mr_grammar *g, const char *text, size_t n)
{
    mr_gmatch *m;
    mr_err err;
    ck_assert_int_eq(mr_gmatch_new(g, &m, &err), 0);
    bool ok = mr_gmatch_accept(m, text, n) && mr_gmatch_can_end(m);
    mr_gmatch_free(m);
    return ok;
}

static bool matches(const mr_grammar *g, const char *text)
{
    return matches_n(g, text, strlen(text));
}

/* Every text of valid[] is a sentence of the schema's grammar, no text of
 * invalid[] is (both NULL-terminated). */
static void expect(const char *schema, const char *const *valid, const char *const *invalid)
{
    mr_grammar *g = schema_grammar(schema);
    for (size_t i = 0; valid && valid[i]; i++)
        ck_assert_msg(matches(g, valid[i]), "%s rejects %s", schema, valid[i]);
    for (size_t i = 0; invalid && invalid[i]; i++)
        ck_assert_msg(!matches(g, invalid[i]), "%s accepts %s", schema, invalid[i]);
    mr_grammar_free(g);
}

#define OK(...) ((const char *const[]){__VA_ARGS__, NULL})
#define BAD(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The schema is refused with a message that holds part. */
static void refused(const char *schema, const char *part)
{
    json_t *s = parse_json(schema);
    char *text = NULL;
    size_t len;
    mr_err err = {{0}};
    int rc = mr_json_schema_grammar(s, "schema", &text, &len, &err);
    json_decref(s);
    ck_assert_msg(rc == -1 && !text, "%s was not refused", schema);
    ck_assert_msg(strstr(err.msg, part) != NULL, "%s: message \"%s\" lacks \"%s\"", schema, err.msg, part);
}

START_TEST(types_and_nullable)
{
    expect(J({"type" : "null"}), OK("null"), BAD("0", "\"null\"", "nul"));
    expect(J({"type" : "boolean"}), OK("true", "false"), BAD("null", "1", "True"));
    expect(J({"type" : "integer"}), OK("0", "-7", "1234567890123456"), BAD("1.5", "1e3", "01", "\"1\""));
    expect(J({"type" : "number"}), OK("0", "-7.25", "1e10", "-0.5E-3", "6.02e+23"), BAD("01", ".5", "1.", "+1", "1e"));
    expect(J({"type" : "string"}), OK("\"\"", "\"a b\""), BAD("a", "1"));
    expect(J({"type" : "array"}), OK("[]", "[1,\"a\",[null],{}]"), BAD("{}", "[1,]"));
    expect(J({"type" : "object"}), OK("{}", "{\"a\":[1,{\"b\":null}]}"), BAD("[]", "{\"a\"}", "{1:2}"));
    expect(J({"type" : [ "string", "null" ]}), OK("null", "\"x\""), BAD("1", "[]"));
    expect(J({"type" : "integer", "nullable" : true}), OK("null", "5"), BAD("\"5\""));
    /* no type: any value, and every annotation is ignored */
    expect(J({"title" : "t", "description" : "d", "default" : 1, "examples" : [2], "x-extra" : {}}),
           OK("1", "\"s\"", "null", "[{}]"), BAD("", "nul"));
    expect("true", OK("1", "{\"a\":[]}"), NULL);
}
END_TEST

START_TEST(enum_and_const)
{
    expect(J({"enum" : [ "a", 1, null, true, {"k" : [ 1, "x" ]}, [], "q\"\\\n" ]}),
           OK("\"a\"", "1", "null", "true", "{\"k\":[1,\"x\"]}", "{ \"k\": [1, \"x\"] }",
              "{\n  \"k\": [\n    1,\n    \"x\"\n  ]\n}", "[]", "[ ]", "\"q\\\"\\\\\\n\""),
           BAD("\"b\"", "2", "false", "{\"k\":[1]}", "\"q\\\"\\\\\\u000a\"", "{\"k\":[\"x\",1]}"));
    /* other keywords filter the values */
    expect(J({"type" : "string", "enum" : [ "a", 1, "bb", null ], "maxLength" : 1}), OK("\"a\""),
           BAD("1", "\"bb\"", "null"));
    expect(J({"enum" : [ 1, 2.5, 3 ], "type" : "integer", "minimum" : 2}), OK("3"), BAD("1", "2.5"));
    expect(J({"const" : {"a" : [ 1, {"b" : null} ]}}), OK("{\"a\":[1,{\"b\":null}]}"), BAD("{\"a\":[1,{}]}"));
    expect(J({"enum" : [ 1.0, 1e2 ]}), OK("1", "100"), BAD("1.0e0"));
    expect(J({"allOf" : [ {"enum" : [ "a", "b", "c" ]}, {"enum" : [ "c", "b" ]} ]}), OK("\"b\"", "\"c\""),
           BAD("\"a\""));
    expect(J({"enum" : [ "x", "y" ], "pattern" : "^y"}), OK("\"y\""), BAD("\"x\""));
    expect(J({"enum" : [ "2024-02-29", "2023-02-29" ], "format" : "date"}), OK("\"2024-02-29\""),
           BAD("\"2023-02-29\""));
    refused(J({"enum" : [ 2, 3 ], "multipleOf" : 2}), "\"multipleOf\"");
    refused(J({"enum" : ["z"], "type" : "integer"}), "allows no value");
    refused(J({"enum" : []}), "allows no value");
}
END_TEST

START_TEST(object_properties)
{
    const char *s = J({
        "type" : "object",
        "properties" : {"a" : {"type" : "integer"}, "b" : {"type" : "string"}, "c" : {"type" : "boolean"}},
        "required" : ["b"]
    });
    expect(
        s,
        OK("{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\",\"c\":true}", "{\"b\":\"x\",\"c\":false}"),
        /* required missing, wrong types, out of order, twice, unnamed (no additionalProperties: none written) */
        BAD("{}", "{\"a\":1}", "{\"a\":\"1\",\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",\"b\":\"y\"}",
            "{\"b\":\"x\",\"d\":1}", "{\"b\":\"x\",}", "{,\"b\":\"x\"}"));
    /* a property no value fits is left out, a required one makes objects impossible */
    expect(J({"properties" : {"a" : false, "b" : {"type" : "integer"}}, "type" : "object"}), OK("{}", "{\"b\":2}"),
           BAD("{\"a\":1}"));
    expect(J({"anyOf" : [ {"type" : "object", "properties" : {"a" : false}, "required" : ["a"]}, {"type" : "null"} ]}),
           OK("null"), BAD("{}", "{\"a\":1}"));
    /* required names that "properties" does not list: any value */
    expect(J({"type" : "object", "required" : [ "x", "y" ]}), OK("{\"x\":1,\"y\":{}}"), BAD("{\"x\":1}", "{}"));
    /* names with characters that need escapes */
    expect(J({"properties" : {"q\"t" : {"const" : 1}, "é😀/" : {"const" : 2}}, "additionalProperties" : false}),
           OK("{\"q\\\"t\":1,\"é😀/\":2}", "{}"), BAD("{\"q\\u0022t\":1}", "{\"x\":1}"));
    /* min/maxProperties where what is allowed implies them */
    expect(J({
               "properties" : {"a" : {}, "b" : {}},
               "required" : ["a"],
               "minProperties" : 1,
               "maxProperties" : 2,
               "additionalProperties" : false
           }),
           OK("{\"a\":1}", "{\"a\":1,\"b\":2}"), BAD("{}"));
    refused(J({"type" : "object", "properties" : {"a" : {}}, "minProperties" : 1}), "\"minProperties\"");
    refused(J({"type" : "object", "maxProperties" : 3}), "\"maxProperties\"");
}
END_TEST

START_TEST(additional_properties)
{
    /* a map beside named properties: other keys never spell a named one */
    const char *s = J({
        "type" : "object",
        "properties" : {"t" : {"type" : "string"}, "total" : {"type" : "integer"}},
        "additionalProperties" : {"type" : "number"}
    });
    expect(s,
           OK("{}", "{\"t\":\"x\",\"total\":3}", "{\"ta\":1}", "{\"to\":1,\"tot\":2,\"totals\":3.5,\"\":0,\"T\":1}",
              "{\"total\":1,\"x\":2,\"y\":3}"),
           BAD("{\"t\":5}", "{\"total\":\"x\"}", "{\"x\":\"s\"}", "{\"total\":1,\"total\":2}", "{\"x\":1,\"t\":\"s\"}",
               "{\"t\\u0061\":1}", "{\"x\":1,\"t\":2}"));
    expect(J({"type" : "object", "properties" : {"k" : {"type" : "boolean"}}, "additionalProperties" : true}),
           OK("{\"k\":true,\"o\":[1,{}]}", "{\"z\":null}"), BAD("{\"k\":1}", "{\"z\":1,\"k\":2}"));
    expect(J({"type" : "object", "additionalProperties" : {"type" : "string"}}), OK("{}", "{\"a\":\"b\",\"c\":\"d\"}"),
           BAD("{\"a\":1}"));
    expect(J({"type" : "object", "additionalProperties" : false}), OK("{}", "{ }"), BAD("{\"a\":1}"));
    /* additionalProperties of one allOf branch applies to another's names */
    expect(J({"allOf" : [ {"properties" : {"a" : {}}, "additionalProperties" : false}, {"properties" : {"b" : {}}} ]}),
           OK("{\"a\":1}"), BAD("{\"b\":1}", "{\"a\":1,\"b\":1}"));
}
END_TEST

START_TEST(arrays)
{
    expect(J({"type" : "array", "items" : {"type" : "integer"}}), OK("[]", "[1]", "[1,2,3]"),
           BAD("[1.5]", "[\"a\"]", "[1 2]"));
    expect(J({"type" : "array", "minItems" : 2, "maxItems" : 3}), OK("[1,2]", "[1,null,{}]"),
           BAD("[]", "[1]", "[1,2,3,4]"));
    expect(J({"prefixItems" : [ {"type" : "string"}, {"type" : "integer"} ], "items" : false, "type" : "array"}),
           OK("[]", "[\"a\"]", "[\"a\",1]"), BAD("[1]", "[\"a\",1,2]", "[\"a\",\"b\"]"));
    expect(J({"prefixItems" : [ {"const" : 0} ], "items" : {"type" : "string"}, "minItems" : 2, "type" : "array"}),
           OK("[0,\"a\"]", "[0,\"a\",\"b\"]"), BAD("[0]", "[0,1]", "[\"a\",\"b\"]"));
    /* items as an array: a tuple, with additionalItems after it */
    expect(J({"type" : "array", "items" : [ {"type" : "integer"} ], "additionalItems" : {"type" : "null"}}),
           OK("[]", "[1]", "[1,null,null]"), BAD("[null]", "[1,2]"));
    /* a tuple position no value fits ends the arrays before it */
    expect(J({"type" : "array", "prefixItems" : [ {}, false ]}), OK("[]", "[1]"), BAD("[1,2]"));
    expect(J({"type" : "array", "uniqueItems" : true, "maxItems" : 1}), OK("[]", "[5]"), BAD("[5,6]"));
    /* uniqueItems: distinct values in the order listed where the items allow
     * a few, else at most one item */
    expect(J({"type" : "array", "items" : {"enum" : [ "a", "b", "c", 1 ], "type" : "string"}, "uniqueItems" : true}),
           OK("[]", "[\"a\"]", "[\"a\",\"c\"]", "[\"a\", \"b\", \"c\"]", "[\"c\"]"),
           BAD("[\"a\",\"a\"]", "[\"b\",\"a\"]", "[1]", "[\"a\",\"b\",\"c\",\"a\"]"));
    expect(J({
               "type" : "array",
               "items" : {"enum" : [ "a", "b", "c" ]},
               "uniqueItems" : true,
               "minItems" : 2,
               "maxItems" : 2
           }),
           OK("[\"a\",\"b\"]", "[\"a\",\"c\"]", "[\"b\",\"c\"]"), BAD("[]", "[\"a\"]", "[\"a\",\"b\",\"c\"]"));
    expect(J({"type" : "array", "items" : {"enum" : [ {"x" : 1}, {"x" : 1.0}, [] ]}, "uniqueItems" : true}),
           OK("[{\"x\":1},[]]"), BAD("[{\"x\":1},{\"x\":1.0}]"));
    expect(J({"type" : "array", "uniqueItems" : true}), OK("[]", "[{\"a\":[]}]"), BAD("[1,2]"));
    refused(J({"type" : "array", "uniqueItems" : true, "minItems" : 2}), "\"uniqueItems\"");
    refused(J({"type" : "array", "minItems" : 3, "maxItems" : 2}), "allows no value");
    /* large counts: exact, without the engine's expansion of them blowing up */
    mr_grammar *g =
        schema_grammar(J({"type" : "array", "items" : {"const" : 1}, "minItems" : 1500, "maxItems" : 3001}));
    static const int counts[] = {1, 2, 1000, 1498, 1499, 1500, 1501, 1977, 2999, 3000, 3001, 3002, 3100};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        mr_buf b = {0};
        mr_buf_adds(&b, "[1");
        for (int i = 1; i < counts[k]; i++)
            mr_buf_adds(&b, i % 7 ? ",1" : ", 1");
        mr_buf_adds(&b, "]");
        ck_assert_msg(matches_n(g, b.p, b.len) == (counts[k] >= 1500 && counts[k] <= 3001), "%d items", counts[k]);
        mr_buf_free(&b);
    }
    mr_grammar_free(g);
    g = schema_grammar(J({"type" : "array", "maxItems" : 1000000000}));
    mr_grammar_free(g);
    refused(J({"type" : "array", "minItems" : 100001}), "\"minItems\"");
}
END_TEST

START_TEST(strings)
{
    expect(
        J({"type" : "string"}),
        OK("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\"\\u00e9\\uD7FF\\ue000\"", "\"é😀\x7f\"", "\"\\u0000\""),
        BAD("\"\t\"", "\"\n\"", "\"\\a\"", "\"\\ud800\"", "\"\\uDC00\"", "\"\\u12\"", "\"\xff\"", "\"\xed\xa0\x80\""));
    /* lengths are code points, an escape is one */
    const char *s = J({"type" : "string", "minLength" : 2, "maxLength" : 3});
    expect(s, OK("\"ab\"", "\"abc\"", "\"é😀\"", "\"\\u0041\\n\"", "\"😀😀😀\""),
           BAD("\"a\"", "\"abcd\"", "\"😀\"", "\"\\u0041\"", "\"😀😀😀😀\""));
    expect(J({"type" : "string", "maxLength" : 0}), OK("\"\""), BAD("\"a\""));
    mr_grammar *g = schema_grammar(J({"type" : "string", "minLength" : 1200, "maxLength" : 2500}));
    static const int counts[] = {0, 1, 1000, 1199, 1200, 1201, 1717, 2499, 2500, 2501, 2600};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        mr_buf b = {0};
        mr_buf_adds(&b, "\"");
        for (int i = 0; i < counts[k]; i++)
            mr_buf_adds(&b, i % 2 ? "é" : "\\n");
        mr_buf_adds(&b, "\"");
        ck_assert_msg(matches_n(g, b.p, b.len) == (counts[k] >= 1200 && counts[k] <= 2500), "%d characters", counts[k]);
        mr_buf_free(&b);
    }
    mr_grammar_free(g);
    refused(J({"type" : "string", "minLength" : 200000}), "\"minLength\"");
}
END_TEST

START_TEST(numbers)
{
    /* at most 16 integer digits, 16 fraction digits, a 2-digit exponent */
    expect(J({"type" : "number"}), OK("9999999999999999", "0.1234567890123456", "1e99", "-1E-07"),
           BAD("12345678901234567", "0.12345678901234567", "1e100", "-", "--1", "0x1", "NaN", "Infinity"));
    expect(J({"type" : "number", "multipleOf" : 1}), OK("3", "-4"), BAD("3.5"));
    /* bounded numbers: whole bounds, no exponent */
    const char *s = J({"type" : "number", "minimum" : -2, "exclusiveMaximum" : 3});
    expect(s, OK("-2", "-1.999", "0", "-0.5", "2.999", "2"), BAD("-2.001", "-3", "3", "3.5", "1e0", "100"));
    s = J({"type" : "number", "exclusiveMinimum" : 0, "maximum" : 1});
    expect(s, OK("0.001", "1", "0.5"), BAD("0", "-0.5", "1.5", "-0"));
    refused(J({"type" : "number", "minimum" : 0.5}), "\"minimum\"");
    refused(J({"type" : "number", "exclusiveMinimum" : true}), "draft-04");
    refused(J({"type" : "integer", "multipleOf" : 3}), "\"multipleOf\" is not supported (only 1)");
    /* integers take any bound, rounded inwards */
    expect(J({"type" : "integer", "minimum" : 2.5, "maximum" : 7.5}), OK("3", "7"), BAD("2", "8"));
    refused(J({"type" : "integer", "minimum" : 1e300}), "allows no value");
}
END_TEST

/* The integers around each bound and some between are accepted exactly
 * when inside [lo, hi]. */
static void int_range_case(const char *schema, long long lo, long long hi)
{
    mr_grammar *g = schema_grammar(schema);
    long long probes[] = {lo, hi, 0, 1, -1, 9, 10, 99, 100, 101, 999, 1000, 1001, -9, -10, -100, -101, lo / 2 + hi / 2};
    for (size_t p = 0; p < sizeof probes / sizeof probes[0]; p++)
        for (long long d = -12; d <= 12; d++) {
            long long x = probes[p] + d;
            if (x > 9999999999999999LL || x < -9999999999999999LL)
                continue;
            char t[32];
            snprintf(t, sizeof t, "%lld", x);
            ck_assert_msg(matches(g, t) == (x >= lo && x <= hi), "%s: %s", schema, t);
        }
    mr_grammar_free(g);
}

START_TEST(integer_ranges)
{
    int_range_case(J({"type" : "integer", "minimum" : 0, "maximum" : 150}), 0, 150);
    int_range_case(J({"type" : "integer", "exclusiveMinimum" : -10, "exclusiveMaximum" : 10}), -9, 9);
    int_range_case(J({"type" : "integer", "minimum" : 17}), 17, 9999999999999999LL);
    int_range_case(J({"type" : "integer", "maximum" : -5}), -9999999999999999LL, -5);
    int_range_case(J({"type" : "integer", "minimum" : 123, "maximum" : 4567}), 123, 4567);
    int_range_case(J({"type" : "integer", "minimum" : -9999, "maximum" : -100}), -9999, -100);
    int_range_case(J({"type" : "integer", "minimum" : 999, "maximum" : 1000}), 999, 1000);
    int_range_case(J({"type" : "integer", "minimum" : 1000000000000, "maximum" : 1000000000123}), 1000000000000LL,
                   1000000000123LL);
    int_range_case(J({"type" : "integer", "minimum" : -20, "maximum" : 2090}), -20, 2090);
    int_range_case(J({"type" : "integer", "minimum" : 5, "maximum" : 5}), 5, 5);
}
END_TEST

START_TEST(patterns)
{
    expect(J({"type" : "string", "pattern" : "^[A-Z]{3}-\\d{4}$"}), OK("\"ABC-1234\""),
           BAD("\"AB-1234\"", "\"ABC-12345\"", "\"abc-1234\"", "\"xABC-1234\""));
    /* unanchored: a search, anything may come around */
    expect(J({"type" : "string", "pattern" : "a+b"}), OK("\"ab\"", "\"xxaaab!\"", "\"\\nab\""), BAD("\"a\"", "\"ba\""));
    expect(J({"type" : "string", "pattern" : "^a|b$"}), OK("\"a\"", "\"ax\"", "\"xb\""), BAD("\"xa\"", "\"bx\""));
    expect(J({"type" : "string", "pattern" : "^(en|fr)(-[A-Z]{2})?$"}), OK("\"en\"", "\"fr-CA\""),
           BAD("\"de\"", "\"en-\""));
    expect(J({"type" : "string", "pattern" : "^(?:ab)+?c*$"}), OK("\"ab\"", "\"ababccc\""), BAD("\"\"", "\"abc a\""));
    expect(J({"type" : "string", "pattern" : "^(?<year>\\d{4})$"}), OK("\"2024\""), BAD("\"24\""));
    /* classes and escapes, written with JSON's canonical escapes */
    expect(J({"type" : "string", "pattern" : "^[^a]$"}),
           OK("\"b\"", "\"\\\"\"", "\"\\\\\"", "\"\\n\"", "\"\\u0001\"", "\"😀\""),
           BAD("\"a\"", "\"\\u000a\"", "\"\\u0062\"", "\"bb\""));
    expect(J({"type" : "string", "pattern" : "^\\w\\W\\s\\S\\d\\D.$"}), OK("\"a- x1b.\"", "\"_\\t\\u000bé9x\\\"\""),
           BAD("\"a- x1b\\n\""));
    expect(J({"type" : "string", "pattern" : "^\\x41\\u00e9\\u{1F600}\\ud83d\\ude00\\.\\/\\-\\cJ\\0$"}),
           OK("\"Aé😀😀./-\\n\\u0000\""), NULL);
    expect(J({"type" : "string", "pattern" : "^[a-c\\d_-]+$"}), OK("\"a-_9\""), BAD("\"d\""));
    refused(J({"type" : "string", "pattern" : "^[]$"}), "allows no value");
    /* lengths: implied, or pushed into the one repeated class */
    expect(J({"type" : "string", "pattern" : "^[a-z]+$", "maxLength" : 3}), OK("\"a\"", "\"abc\""),
           BAD("\"abcd\"", "\"\""));
    expect(J({"type" : "string", "pattern" : "^(0x|#)[0-9a-f]+$", "maxLength" : 5}), OK("\"0xab\"", "\"#abc\""),
           BAD("\"0xabcd\""));
    expect(J({"type" : "string", "pattern" : "^\\d{3}$", "minLength" : 2, "maxLength" : 3}), OK("\"123\""), NULL);
    /* a search with lengths: written as a match at the start, the tail taking the bounds */
    expect(J({"type" : "string", "pattern" : "[0-9]", "minLength" : 2, "maxLength" : 3}), OK("\"1a\"", "\"12é\""),
           BAD("\"1\"", "\"1abc\"", "\"a\""));
    expect(J({"type" : "string", "pattern" : "b$", "maxLength" : 2}), OK("\"b\""), BAD("\"bb\"", "\"abb\""));
    expect(J({"type" : [ "string", "null" ], "pattern" : "^abc$", "maxLength" : 2}), OK("null"), BAD("\"abc\""));
    refused(J({"type" : "string", "pattern" : "a|b", "maxLength" : 3}), "minLength/maxLength beside this pattern");
    const char *bad[][2] = {
        {J({"pattern" : "^(a)\\1$"}), "backreferences"},
        {J({"pattern" : "(?=a)"}), "lookahead"},
        {J({"pattern" : "a\\b"}), "\\b (word"},
        {J({"pattern" : "\\p{L}"}), "\\p{...}"},
        {J({"pattern" : "(a"}), "missing )"},
        {J({"pattern" : "a)"}), "unmatched )"},
        {J({"pattern" : "*a"}), "nothing to repeat"},
        {J({"pattern" : "a**"}), "nothing to repeat"},
        {J({"pattern" : "[z-a]"}), "out of order"},
        {J({"pattern" : "a{2,1}"}), "n < m"},
        {J({"pattern" : "a(^b)"}), "^ and $"},
        {J({"pattern" : "\\q"}), "invalid escape"},
        {J({"pattern" : "a{200001}"}), "above 100000"},
        {J({"pattern" : "((((((((((((((((((((((a))))))))))))))))))))))"}), "too deeply"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(bad[i][0], bad[i][1]);
    refused(J({"allOf" : [ {"pattern" : "a"}, {"pattern" : "b"} ]}), "only one pattern");
    refused(J({"pattern" : "a", "format" : "date"}), "\"pattern\"");
}
END_TEST

START_TEST(formats)
{
    expect(J({"type" : "string", "format" : "date"}),
           OK("\"2024-02-29\"", "\"2000-02-29\"", "\"0000-02-29\"", "\"2023-12-31\"", "\"1999-04-30\""),
           BAD("\"2023-02-29\"", "\"1900-02-29\"", "\"2100-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"",
               "\"2023-00-10\"", "\"2023-01-00\"", "\"23-01-01\"", "\"2023-1-1\""));
    expect(J({"type" : "string", "format" : "time"}),
           OK("\"23:59:59Z\"", "\"00:00:00.123+05:30\"", "\"12:00:00-23:59\""),
           BAD("\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00:60Z\"", "\"12:00:00\"", "\"12:00Z\"", "\"12:00:00+24:00\""));
    expect(J({"type" : "string", "format" : "date-time"}),
           OK("\"2024-06-30T12:34:56Z\"", "\"2024-02-29T00:00:00.5+01:00\""),
           BAD("\"2024-06-30 12:34:56Z\"", "\"2024-06-30T12:34:56\"", "\"2023-02-29T00:00:00Z\""));
    expect(J({"type" : "string", "format" : "uuid"}),
           OK("\"123e4567-e89b-12d3-a456-426614174000\"", "\"ABCDEF01-2345-6789-abcd-ef0123456789\""),
           BAD("\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""));
    expect(J({"type" : "string", "format" : "ipv4"}), OK("\"1.2.3.4\"", "\"255.255.255.255\"", "\"0.10.100.199\""),
           BAD("\"256.0.0.1\"", "\"01.2.3.4\"", "\"1.2.3\"", "\"1.2.3.4.5\""));
    expect(J({"type" : "string", "format" : "ipv6"}), OK("\"2001:db8:0:0:0:ff00:42:8329\"", "\"0:0:0:0:0:0:0:1\""),
           BAD("\"1:2:3:4:5:6:7\"", "\"12345:0:0:0:0:0:0:1\"", "\"g:0:0:0:0:0:0:1\""));
    expect(J({"type" : "string", "format" : "hostname"}), OK("\"a\"", "\"a-b.example.com\"", "\"x1.Y2\""),
           BAD("\"-a\"", "\"a-\"", "\"a..b\"", "\"a_b\"", "\"\""));
    expect(J({"type" : "string", "format" : "email"}), OK("\"a.b+c@d.e\"", "\"x@y.z.w\""),
           BAD("\"a@b\"", "\".a@b.c\"", "\"a@-b.c\"", "\"a b@c.d\""));
    expect(J({"type" : "string", "format" : "duration"}), OK("\"P1D\"", "\"PT1H2M\"", "\"P1Y2M3DT4H5M6S\"", "\"P2W\""),
           BAD("\"P\"", "\"PT\"", "\"P1H\"", "\"P1W2D\"", "\"PT1D\""));
    expect(J({"type" : "string", "format" : "uri"}), OK("\"https://a.b/c?d=e#f\"", "\"http://x:80\""),
           BAD("\"ftp://a\"", "\"https://\"", "\"http://a b\"", "\"a.b\""));
    /* other formats are annotations; formats do not touch other types */
    expect(J({"format" : "regex"}), OK("\"not checked\"", "1"), NULL);
    expect(J({"format" : "date"}), OK("1", "null", "\"2024-01-01\""), BAD("\"x\""));
    expect(J({"type" : "string", "format" : "uuid", "maxLength" : 36}), OK("\"123e4567-e89b-12d3-a456-426614174000\""),
           NULL);
    refused(J({"type" : "string", "format" : "time", "maxLength" : 10}), "format \"time\"");
    refused(J({"type" : "string", "allOf" : [ {"format" : "date"}, {"format" : "time"} ]}), "allows no value");
}
END_TEST

START_TEST(combinations)
{
    expect(J({"anyOf" : [ {"type" : "string", "maxLength" : 1}, {"type" : "integer", "minimum" : 0} ]}),
           OK("\"a\"", "\"\"", "0", "7"), BAD("\"ab\"", "-1", "null"));
    /* anyOf distributed over the rest of the schema */
    expect(J({
               "type" : "object",
               "properties" : {"k" : {"type" : "string"}},
               "required" : ["k"],
               "anyOf" : [ {"properties" : {"k" : {"const" : "a"}}}, {"properties" : {"k" : {"const" : "b"}}} ]
           }),
           OK("{\"k\":\"a\"}", "{\"k\":\"b\"}"), BAD("{\"k\":\"c\"}", "{}"));
    expect(J({"oneOf" : [ {"type" : "string"}, {"type" : "array"} ]}), OK("\"s\"", "[1]"), BAD("1"));
    /* a discriminated union */
    expect(J({
               "oneOf" : [
                   {
                       "type" : "object",
                       "properties" : {"t" : {"const" : "a"}, "x" : {"type" : "integer"}},
                       "required" : [ "t", "x" ]
                   },
                   {
                       "type" : "object",
                       "properties" : {"t" : {"const" : "b"}, "y" : {"type" : "string"}},
                       "required" : [ "t", "y" ]
                   }
               ]
           }),
           OK("{\"t\":\"a\",\"x\":1}", "{\"t\":\"b\",\"y\":\"s\"}"),
           BAD("{\"t\":\"a\",\"y\":\"s\"}", "{\"t\":\"c\",\"x\":1}"));
    expect(J({"oneOf" : [ {"enum" : [ 1, 2 ]}, {"enum" : [ "1", 3 ]} ]}), OK("1", "\"1\"", "3"), BAD("\"2\""));
    refused(J({"oneOf" : [ {"type" : "integer"}, {"type" : "number"} ]}), "\"oneOf\"");
    refused(J({"oneOf" : [ {"type" : "object", "properties" : {"t" : {"const" : 1}}}, {"type" : "object"} ]}),
            "\"oneOf\"");
    /* allOf merged */
    expect(
        J({
            "allOf" :
                [ {"type" : [ "integer", "string" ], "minimum" : 3}, {"type" : [ "integer", "null" ], "maximum" : 5} ]
        }),
        OK("3", "5"), BAD("2", "6", "\"a\"", "null"));
    expect(J({
               "allOf" : [ {"properties" : {"a" : {"type" : "integer"}}}, {"properties" : {"a" : {"minimum" : 5}}} ],
               "type" : "object"
           }),
           OK("{\"a\":5}", "{}"), BAD("{\"a\":4}", "{\"a\":\"x\"}"));
    expect(J({"anyOf" : [ false, {"type" : "null"}, {"type" : "string", "enum" : [1]} ]}), OK("null"),
           BAD("1", "\"1\""));
    /* bounded combinations */
    mr_buf s = {0};
    mr_buf_adds(&s, "{\"allOf\":[");
    for (int i = 0; i < 9; i++)
        mr_buf_printf(&s, "%s{\"anyOf\":[{\"type\":\"string\"},{\"minLength\":%d}]}", i ? "," : "", i);
    mr_buf_adds(&s, "]}");
    refused(s.p, "combinations of anyOf/oneOf");
    mr_buf_free(&s);
}
END_TEST

START_TEST(refs_and_recursion)
{
    const char *tree = J({
        "$defs" : {
            "node" : {
                "type" : "object",
                "properties" :
                    {"v" : {"type" : "integer"}, "kids" : {"type" : "array", "items" : {"$ref" : "#/$defs/node"}}},
                "required" : ["v"],
                "additionalProperties" : false
            }
        },
        "$ref" : "#/$defs/node"
    });
    expect(tree, OK("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4,\"kids\":[]}]}"),
           BAD("{\"v\":1,\"kids\":[{}]}", "{\"v\":1,\"kids\":[{\"v\":2,\"x\":0}]}"));
    expect(J({
               "type" : "object",
               "properties" : {"next" : {"anyOf" : [ {"$ref" : "#"}, {"type" : "null"} ]}},
               "required" : ["next"]
           }),
           OK("{\"next\":null}", "{\"next\":{\"next\":{\"next\":null}}}"), BAD("{\"next\":{}}", "{}"));
    /* pointers: escapes, percent-encoding, draft-07 definitions, the root's $id */
    expect(J({
               "$defs" : {"a/b" : {"const" : 1}, "c d" : {"const" : 2}},
               "anyOf" : [ {"$ref" : "#/$defs/a~1b"}, {"$ref" : "#/$defs/c%20d"} ]
           }),
           OK("1", "2"), BAD("3"));
    expect(J({"definitions" : {"x" : {"type" : "boolean"}}, "items" : {"$ref" : "#/definitions/x"}, "type" : "array"}),
           OK("[true]"), BAD("[1]"));
    expect(J({
               "$id" : "https://example.com/s.json",
               "$defs" : {"x" : {"const" : 7}},
               "$ref" : "https://example.com/s.json#/$defs/x"
           }),
           OK("7"), BAD("8"));
    /* keywords beside a $ref apply too */
    expect(J({"$defs" : {"b" : {"type" : "integer"}}, "$ref" : "#/$defs/b", "maximum" : 3}), OK("3"),
           BAD("4", "\"x\""));
    /* a definition used in many places is one rule */
    mr_buf s = {0};
    mr_buf_adds(&s, "{\"$defs\":{\"big\":{\"enum\":[");
    for (int i = 0; i < 2000; i++)
        mr_buf_printf(&s, "%s\"value number %d\"", i ? "," : "", i);
    mr_buf_adds(&s, "]}},\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 200; i++)
        mr_buf_printf(&s, "%s\"p%d\":{\"$ref\":\"#/$defs/big\"}", i ? "," : "", i);
    mr_buf_adds(&s, "}}");
    json_t *js = parse_json(s.p);
    char *text;
    size_t len;
    mr_err err;
    ck_assert_int_eq(mr_json_schema_grammar(js, "schema", &text, &len, &err), 0);
    ck_assert_uint_lt(len, 100000);
    free(text);
    json_decref(js);
    mr_buf_free(&s);
    /* cycles that never enter an object or array */
    refused(J({"anyOf" : [ {"$ref" : "#"}, {"type" : "null"} ]}), "\"$ref\" cycle");
    refused(J({"$defs" : {"a" : {"allOf" : [ {"$ref" : "#/$defs/a"} ]}}, "$ref" : "#/$defs/a"}), "\"$ref\" cycle");
    refused(J({"$defs" : {"a" : {"$ref" : "#/$defs/b"}, "b" : {"$ref" : "#/$defs/a"}}, "$ref" : "#/$defs/a"}),
            "a cycle?");
    refused(J({
                "$defs" : {
                    "a" : {"anyOf" : [ {"$ref" : "#/$defs/b"}, {"type" : "null"} ]},
                    "b" : {"anyOf" : [ {"$ref" : "#/$defs/a"}, {"type" : "string"} ]}
                },
                "$ref" : "#/$defs/a"
            }),
            "\"$ref\" cycle");
    /* recursion that allows no finite value */
    refused(J({"type" : "object", "properties" : {"x" : {"$ref" : "#"}}, "required" : ["x"]}), "grammar");
    refused(J({"$ref" : "#/$defs/missing"}), "names no schema");
    refused(J({"$ref" : "other.json#/a"}), "\"$ref\" is not supported");
    refused(J({"$ref" : "#anchor"}), "anchor");
    refused(J({"$ref" : "#/%zz"}), "not a valid URI fragment");
}
END_TEST

START_TEST(unevaluated_and_drafts)
{
    expect(J({
               "type" : "object",
               "allOf" : [ {"properties" : {"a" : {"type" : "string"}}} ],
               "properties" : {"b" : {"type" : "integer"}},
               "unevaluatedProperties" : false
           }),
           OK("{\"a\":\"x\",\"b\":1}", "{}"), BAD("{\"c\":1}", "{\"a\":1}"));
    expect(J({"type" : "object", "properties" : {"a" : {}}, "unevaluatedProperties" : {"type" : "integer"}}),
           OK("{\"a\":\"x\",\"z\":1}"), BAD("{\"z\":\"x\"}"));
    expect(J({"type" : "array", "prefixItems" : [ {"type" : "string"} ], "unevaluatedItems" : {"type" : "integer"}}),
           OK("[\"a\",1,2]"), BAD("[\"a\",\"b\"]"));
    /* draft-07: items applies to every item; prefixItems, unevaluated* are no keywords there */
    expect(J({
               "$schema" : "http://json-schema.org/draft-07/schema#",
               "type" : "array",
               "prefixItems" : [ {"type" : "string"} ],
               "items" : {"type" : "integer"},
               "unevaluatedItems" : false
           }),
           OK("[1,2]", "[]"), BAD("[\"a\"]"));
    expect(
        J({"$schema" : "http://json-schema.org/draft-07/schema#", "type" : "object", "unevaluatedProperties" : false}),
        OK("{\"a\":1}"), NULL);
}
END_TEST

START_TEST(whitespace)
{
    const char *s = J({"type" : "object", "properties" : {"a" : {"type" : "array"}}});
    expect(s,
           OK("{}", "{ }", "{\"a\":[]}", "{ \"a\" : [ 1, 2 ] }", "{\n  \"a\": [\n    1,\n    2\n  ]\n}",
              "{\n\t\"a\": [\n\t\t1\n\t]\n}", "{\n                    \"a\":[]}"),
           BAD(" {}", "{} ", "{  }", "{\n\n}", "{\n                     \"a\":[]}", "{\r\n}", "{\"a\":[1 ,2]}"));
}
END_TEST

START_TEST(refusals_name_place_and_keyword)
{
    static const char *const cases[][2] = {
        {J({"not" : {}}), "schema: keyword \"not\" is not supported"},
        {J({"if" : {}, "then" : {}}), "keyword \"if\""},
        {J({"then" : {}}), "keyword \"then\""},
        {J({"dependentSchemas" : {}}), "\"dependentSchemas\""},
        {J({"dependentRequired" : {}}), "\"dependentRequired\""},
        {J({"dependencies" : {}}), "\"dependencies\""},
        {J({"patternProperties" : {}}), "\"patternProperties\""},
        {J({"propertyNames" : {}}), "\"propertyNames\""},
        {J({"contains" : {}}), "\"contains\""},
        {J({"minContains" : 1}), "\"minContains\""},
        {J({"maxContains" : 1}), "\"maxContains\""},
        {J({"$dynamicRef" : "#a"}), "\"$dynamicRef\""},
        {J({"$recursiveRef" : "#"}), "\"$recursiveRef\""},
        {J({"properties" : {"x" : {"$id" : "y"}}}), "/properties/x: keyword \"$id\""},
        {J({"properties" : {"a/b~" : {"not" : {}}}}), "schema: /properties/a~1b~0: keyword \"not\""},
        {J({"items" : [ {}, {"anyOf" : [ {}, {"if" : {}} ]} ]}), "/items/1/anyOf/1: keyword \"if\""},
        {J({"$defs" : {"d" : {"not" : {}}}, "$ref" : "#/$defs/d"}), "/$defs/d: keyword \"not\""},
        {J({"type" : 5}), "\"type\" must be"},
        {J({"type" : []}), "\"type\" must be"},
        {J({"type" : "float"}), "\"type\" must be"},
        {J({"required" : [1]}), "\"required\" must be"},
        {J({"minLength" : -1}), "\"minLength\" must be"},
        {J({"maxItems" : 1.5}), "\"maxItems\" must be"},
        {J({"anyOf" : []}), "\"anyOf\" must be"},
        {J({"properties" : []}), "\"properties\" must be"},
        {J({"enum" : {}}), "\"enum\" must be"},
        {J({"multipleOf" : 0}), "\"multipleOf\" must be"},
        {J({"pattern" : 1}), "\"pattern\" must be"},
        {J({"properties" : {"a" : 1}}), "/properties/a: a schema must be an object or a boolean"},
        {J(1), "a schema must be"},
        {J(false), "allows no value"},
        {J({"prefixItems" : [ {} ], "items" : [ {} ]}),
         "keyword \"items\" is not supported (as an array beside prefixItems)"},
        {J({"prefixItems" : []}), "\"prefixItems\" must be"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(cases[i][0], cases[i][1]);
}
END_TEST

/* Nesting, cycles and expansions stay bounded: refused, never a crash or
 * a runaway. */
START_TEST(bounded)
{
    mr_buf s = {0};
    for (int depth = 0; depth < 100; depth++)
        mr_buf_adds(&s, "{\"type\":\"array\",\"items\":");
    mr_buf_adds(&s, "{}");
    for (int depth = 0; depth < 100; depth++)
        mr_buf_adds(&s, "}");
    refused(s.p, "nested more than 64");
    mr_buf_clear(&s);
    for (int depth = 0; depth < 40; depth++)
        mr_buf_adds(&s, "{\"type\":\"object\",\"properties\":{\"a\":");
    mr_buf_adds(&s, "{\"type\":\"integer\"}");
    for (int depth = 0; depth < 40; depth++)
        mr_buf_adds(&s, "},\"required\":[\"a\"]}");
    mr_grammar *g = schema_grammar(s.p);
    mr_grammar_free(g);
    /* too many steps: hundreds of wide anyOf */
    mr_buf_clear(&s);
    mr_buf_adds(&s, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 100; i++) {
        mr_buf_printf(&s, "%s\"p%d\":{\"anyOf\":[", i ? "," : "", i);
        for (int k = 0; k < 600; k++)
            mr_buf_printf(&s, "%s{\"const\":%d}", k ? "," : "", k);
        mr_buf_adds(&s, "]}");
    }
    mr_buf_adds(&s, "}}");
    refused(s.p, "too complex");
    /* a grammar too large */
    mr_buf_clear(&s);
    mr_buf_adds(&s, "{\"enum\":[");
    for (int i = 0; i < 40000; i++)
        mr_buf_printf(&s, "%s\"a fairly long enum value to make the text large %d\"", i ? "," : "", i);
    mr_buf_adds(&s, "]}");
    refused(s.p, "larger than");
    /* many anyOf branches are fine one level deep */
    mr_buf_clear(&s);
    mr_buf_adds(&s, "{\"anyOf\":[");
    for (int i = 0; i < 500; i++)
        mr_buf_printf(&s, "%s{\"const\":%d}", i ? "," : "", i);
    mr_buf_adds(&s, "]}");
    expect(s.p, OK("0", "499"), BAD("500"));
    mr_buf_free(&s);
}
END_TEST

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80)
        return out[0] = (char)cp, 1;
    if (cp < 0x800)
        return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
               out[2] = (char)(0x80 | (cp & 0x3F)), 3;
    return out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
           out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F)), 4;
}

/* A literal of any UTF-8 bytes matches exactly those bytes. */
START_TEST(gbnf_literal_round_trip)
{
    uint64_t rng = 0x1234567;
    static const uint32_t special[] = {0,     1,     '\t',   '\n',   '\r',   0x1F,   ' ',     '"',
                                       '\\',  '[',   ']',    '#',    '|',    0x7F,   0x80,    0xFF,
                                       0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x10FFFF};
    for (int round = 0; round < 300; round++) {
        char bytes[256];
        size_t n = 0, k = rng_next(&rng) % 24;
        for (size_t i = 0; i < k; i++) {
            uint32_t cp = rng_next(&rng) % 3 ? special[rng_next(&rng) % (sizeof special / sizeof special[0])]
                                             : (uint32_t)(rng_next(&rng) % 0x110000);
            if (cp >= 0xD800 && cp <= 0xDFFF)
                cp = 'x';
            n += put_utf8(bytes + n, cp);
        }
        mr_buf lit = {0}, text = {0};
        mr_err err;
        ck_assert_int_eq(mr_gbnf_literal(&lit, bytes, n, &err), 0);
        mr_buf_printf(&text, "root ::= %s\n", lit.p);
        mr_grammar *g = compile_text(text.p, text.len);
        ck_assert_msg(matches_n(g, bytes, n), "round %d: %s", round, lit.p);
        if (n)
            ck_assert(!matches_n(g, bytes, n - 1));
        bytes[n] = 'x';
        ck_assert(!matches_n(g, bytes, n + 1));
        mr_grammar_free(g);
        mr_buf_free(&lit);
        mr_buf_free(&text);
    }
    static const char *const invalid[] = {"\x80", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "a\xE2\x82"};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        mr_buf lit = {0};
        mr_err err;
        ck_assert_int_eq(mr_gbnf_literal(&lit, invalid[i], strlen(invalid[i]), &err), -1);
        ck_assert_ptr_nonnull(strstr(err.msg, "UTF-8"));
        mr_buf_free(&lit);
    }
}
END_TEST

START_TEST(builder)
{
    mr_err err;
    char *text;
    size_t len;
    mr_jsgram *g = mr_jsgram_new();
    json_t *schema =
        parse_json(J({"type" : "object", "properties" : {"n" : {"type" : "integer"}}, "required" : ["n"]}));
    json_t *bad = parse_json(J({"type" : "object", "properties" : {"n" : {"not" : {}}}}));
    ck_assert_int_eq(mr_jsgram_add_rule(g, "json-mine", "\"x\"", &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "reserved"));
    ck_assert_int_eq(mr_jsgram_add_rule(g, "bad name", "\"x\"", &err), -1);
    ck_assert_int_eq(mr_jsgram_add_rule(g, "", "\"x\"", &err), -1);
    ck_assert_int_eq(mr_jsgram_add_rule(g, "two-lines", "\"x\"\n\"y\"", &err), -1);
    ck_assert_int_eq(mr_jsgram_finish(g, &text, &len, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "root"));
    /* a refused schema adds nothing: its name may be used again */
    ck_assert_int_eq(mr_jsgram_add_schema(g, "args", bad, "tools[0].function.parameters", &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "tools[0].function.parameters: /properties/n: keyword \"not\""));
    ck_assert_int_eq(mr_jsgram_add_schema(g, "args", schema, "tools[0].function.parameters", &err), 0);
    ck_assert_int_eq(mr_jsgram_add_schema(g, "args", schema, "again", &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "twice"));
    ck_assert_int_eq(mr_jsgram_add_object(g, "obj", &err), 0);
    ck_assert_int_eq(mr_jsgram_add_value(g, "val", &err), 0);
    mr_buf body = {0};
    ck_assert_int_eq(mr_gbnf_literal(&body, "<call>", 6, &err), 0);
    mr_buf_adds(&body, " args " MR_JSG_WS " obj ");
    ck_assert_int_eq(mr_gbnf_literal(&body, "</call>", 7, &err), 0);
    mr_buf_adds(&body, " val");
    ck_assert_int_eq(mr_jsgram_add_rule(g, "root", body.p, &err), 0);
    ck_assert_int_eq(mr_jsgram_finish(g, &text, &len, &err), 0);
    mr_grammar *gr = compile_text(text, len);
    ck_assert(matches(gr, "<call>{\"n\":1} {\"x\":[]}</call>null"));
    ck_assert(matches(gr, "<call>{\"n\":-3}{}</call>\"s\""));
    ck_assert(!matches(gr, "<call>{\"n\":\"1\"}{}</call>1"));
    ck_assert(!matches(gr, "<call>{\"n\":1}[]</call>1"));
    mr_grammar_free(gr);
    free(text);
    mr_buf_free(&body);
    mr_jsgram_free(g);
    /* a rule used and not defined: the engine's word, at finish */
    g = mr_jsgram_new();
    ck_assert_int_eq(mr_jsgram_add_rule(g, "root", "missing", &err), 0);
    ck_assert_int_eq(mr_jsgram_finish(g, &text, &len, &err), -1);
    mr_jsgram_free(g);
    json_decref(schema);
    json_decref(bad);
    /* the whole grammars */
    ck_assert_int_eq(mr_json_object_grammar(&text, &len, &err), 0);
    gr = compile_text(text, len);
    ck_assert(matches(gr, "{\"a\":[1,2,{\"b\":null}],\"c\":\"\\u00e9\"}") && matches(gr, "{}"));
    ck_assert(!matches(gr, "[]") && !matches(gr, "{\"a\":}") && !matches(gr, " {}"));
    mr_grammar_free(gr);
    free(text);
    ck_assert_int_eq(mr_json_value_grammar(&text, &len, &err), 0);
    gr = compile_text(text, len);
    ck_assert(matches(gr, "1") && matches(gr, "[true,false,null]") && !matches(gr, "tru"));
    mr_grammar_free(gr);
    free(text);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("jsonschema");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, types_and_nullable);
    tcase_add_test(t, enum_and_const);
    tcase_add_test(t, object_properties);
    tcase_add_test(t, additional_properties);
    tcase_add_test(t, arrays);
    tcase_add_test(t, strings);
    tcase_add_test(t, numbers);
    tcase_add_test(t, integer_ranges);
    tcase_add_test(t, patterns);
    tcase_add_test(t, formats);
    tcase_add_test(t, combinations);
    tcase_add_test(t, refs_and_recursion);
    tcase_add_test(t, unevaluated_and_drafts);
    tcase_add_test(t, whitespace);
    tcase_add_test(t, refusals_name_place_and_keyword);
    tcase_add_test(t, bounded);
    tcase_add_test(t, gbnf_literal_round_trip);
    tcase_add_test(t, builder);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return run_suite(suite());
}

/* Jinja engine and chat prompts.
 *
 * The expression / filter / statement / error cases live in
 * tests/unit/jinja-cases.json; tests/e2e/templates.sh checks that the
 * reference renderer (@huggingface/jinja) gives the same expected text for
 * every case not marked "extension" (jinja2 features the reference lacks). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/chat.h"
#include "common/jinja.h"
#include "tests/unit/testutil.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

/* Renders src with vars; returns the text (malloc'd) or NULL with err set. */
static char *render(const char *src, const json_t *vars, const mr_jinja_opts *opts, mr_err *err)
{
    mr_jinja_tmpl *t = mr_jinja_parse(src, strlen(src), err);
    if (!t)
        return NULL;
    char *out;
    size_t len;
    int rc = mr_jinja_render(t, vars, opts, &out, &len, err);
    mr_jinja_free(t);
    return rc == 0 ? out : NULL;
}

START_TEST(cases_file)
{
    json_error_t jerr;
    json_t *doc = json_load_file("tests/unit/jinja-cases.json", 0, &jerr);
    ck_assert_msg(doc != NULL, "jinja-cases.json: %s", jerr.text);
    setenv("TZ", "UTC", 1);
    tzset();
    mr_jinja_opts opts;
    mr_jinja_opts_default(&opts);
    opts.now = 1796029500; /* 2026-11-30 09:05 UTC */
    json_t *cases = json_object_get(doc, "cases");
    size_t i;
    json_t *c;
    int failed = 0;
    json_array_foreach(cases, i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *tpl = json_string_value(json_object_get(c, "template"));
        json_t *vars = json_object_get(c, "vars");
        const char *expect = json_string_value(json_object_get(c, "expect"));
        const char *error = json_string_value(json_object_get(c, "error"));
        mr_err err = {{0}};
        char *out = render(tpl, vars, &opts, &err);
        if (expect) {
            if (!out || strcmp(out, expect) != 0) {
                fprintf(stderr, "case %s: got [%s] (%s), want [%s]\n", name, out ? out : "",
                        out ? "ok" : err.msg, expect);
                failed++;
            }
        } else {
            if (out || !strstr(err.msg, error)) {
                fprintf(stderr, "case %s: got %s [%s], want an error containing [%s]\n", name,
                        out ? "output" : "error", out ? out : err.msg, error);
                failed++;
            }
        }
        free(out);
    }
    json_decref(doc);
    ck_assert_int_eq(failed, 0);
}
END_TEST

START_TEST(error_positions)
{
    mr_err err = {{0}};
    /* the `+` with nothing after it: line 2, the closing braces at col 8 */
    ck_assert_ptr_null(render("ok\n{{ 1 + }}", NULL, NULL, &err));
    ck_assert_str_eq(err.msg, "line 2, col 8: syntax error: unexpected token");
    /* positions count code points, not bytes, and survive whitespace control */
    ck_assert_ptr_null(render("é\n  {%- if true -%}\n\t{{ y.z() }}{% endif %}", NULL, NULL, &err));
    ck_assert_str_eq(err.msg, "line 3, col 5: Cannot call something that is not a function: "
                              "got UndefinedValue");
}
END_TEST

START_TEST(limits)
{
    mr_jinja_opts o;
    mr_err err = {{0}};
    mr_jinja_opts_default(&o);
    o.max_output = 1000;
    ck_assert_ptr_null(render("{% for i in range(100) %}0123456789xx{% endfor %}", NULL, &o, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "output limit"));

    mr_jinja_opts_default(&o);
    o.max_memory = 4 << 20;
    ck_assert_ptr_null(render("{% set ns = namespace(s='x') %}{% for i in range(100000) %}"
                              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                              NULL, &o, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "limit"));

    mr_jinja_opts_default(&o);
    o.max_steps = 100000;
    ck_assert_ptr_null(render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}"
                              "{% endfor %}",
                              NULL, &o, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "step limit"));

    mr_jinja_opts_default(&o);
    ck_assert_ptr_null(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &o,
                              &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "depth"));

    /* a long chain of operators is fine at the default depth */
    char chain[4000];
    size_t m = (size_t)snprintf(chain, sizeof chain, "{{ 'a'");
    for (int i = 0; i < 600; i++)
        m += (size_t)snprintf(chain + m, sizeof chain - m, " ~ 1");
    snprintf(chain + m, sizeof chain - m, " }}");
    char *ok = render(chain, NULL, NULL, &err);
    ck_assert_msg(ok != NULL, "%s", err.msg);
    ck_assert_uint_eq(strlen(ok), 601);
    free(ok);

    ck_assert_ptr_null(render("{{ range(100000000000) }}", NULL, NULL, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "range too large"));

    /* deep nesting in the source is a syntax error, not a stack overflow */
    char deep[12000];
    size_t n = 0;
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{{ ");
    for (int i = 0; i < 5000; i++)
        deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 5000; i++)
        deep[n++] = ')';
    snprintf(deep + n, sizeof deep - n, " }}");
    ck_assert_ptr_null(render(deep, NULL, NULL, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "nested too deeply"));
}
END_TEST

/* xorshift: deterministic mutations */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const char *const PIECES[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-", "(", ")", "[", "]",
                                     "{", "}", "'", "\"", "\\", "|", ".", ",", ":", "if", "for",
                                     "endfor", "endif", "macro", "set", " is ", " in ", "not",
                                     "loop", "messages", "caller()", "~", "**", "//", "%", "\n",
                                     "\xff", "\xe2\x80", "0", "-1", "1.5", "namespace(", "=",
                                     "call", "endcall", "filter", "raise_exception("};

START_TEST(malformed_templates_never_crash)
{
    /* mutate the fixture templates (cut, duplicate, insert syntax pieces) and
     * render each result: any outcome but a crash or a leak is fine, and an
     * error always has a message */
    const char *names[] = {"Qwen-Qwen3-0.6B", "Qwen3-Coder", "Qwen3.5-4B", "StepFun3.5-Flash",
                           "google-gemma-2-2b-it", "google-gemma-3", "google-gemma-4-31B-it"};
    json_t *ctx = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
        "\"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\", \"tool_calls\": "
        "[{\"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}, {\"role\": \"tool\", "
        "\"content\": \"r\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
        "\"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": "
        "\"integer\"}}}}}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\"}",
        0, NULL);
    ck_assert_ptr_nonnull(ctx);
    mr_jinja_opts o;
    mr_jinja_opts_default(&o);
    o.max_steps = 200000;
    o.max_memory = 32 << 20;
    int rendered = 0, failed = 0;
    for (size_t t = 0; t < sizeof names / sizeof names[0]; t++) {
        char path[256];
        snprintf(path, sizeof path, "templates/%s.jinja", names[t]);
        size_t len;
        char *src = slurp(fixture_path(path), &len);
        ck_assert_msg(src != NULL, "cannot read %s", fixture_path(path));
        for (int iter = 0; iter < 60; iter++) {
            char *m = malloc(len * 2 + 256);
            size_t n = len;
            memcpy(m, src, len);
            int edits = 1 + (int)(next() % 4);
            for (int e = 0; e < edits && n > 0; e++) {
                size_t at = next() % n;
                switch (next() % 3) {
                case 0: { /* cut */
                    size_t k = next() % 16;
                    if (k > n - at)
                        k = n - at;
                    memmove(m + at, m + at + k, n - at - k);
                    n -= k;
                    break;
                }
                case 1: { /* insert a piece */
                    const char *p = PIECES[next() % (sizeof PIECES / sizeof PIECES[0])];
                    size_t k = strlen(p);
                    if (n + k > len * 2 + 200)
                        break;
                    memmove(m + at + k, m + at, n - at);
                    memcpy(m + at, p, k);
                    n += k;
                    break;
                }
                default: /* flip a byte */
                    m[at] = (char)(next() & 0xff);
                    break;
                }
            }
            mr_err err = {{0}};
            mr_jinja_tmpl *tp = mr_jinja_parse(m, n, &err);
            if (tp) {
                char *out;
                size_t olen;
                if (mr_jinja_render(tp, ctx, &o, &out, &olen, &err) == 0) {
                    rendered++;
                    free(out);
                } else {
                    ck_assert(err.msg[0] != '\0');
                    failed++;
                }
                mr_jinja_free(tp);
            } else {
                ck_assert(err.msg[0] != '\0');
                failed++;
            }
            free(m);
        }
        free(src);
    }
    json_decref(ctx);
    ck_assert_int_gt(rendered, 0);
    ck_assert_int_gt(failed, 0);

    /* random piece soup */
    for (int iter = 0; iter < 500; iter++) {
        char buf[512];
        size_t n = 0;
        int k = 1 + (int)(next() % 30);
        for (int i = 0; i < k; i++) {
            const char *p = PIECES[next() % (sizeof PIECES / sizeof PIECES[0])];
            size_t l = strlen(p);
            if (n + l + 1 >= sizeof buf)
                break;
            memcpy(buf + n, p, l);
            n += l;
        }
        mr_err err = {{0}};
        mr_jinja_tmpl *tp = mr_jinja_parse(buf, n, &err);
        if (tp) {
            char *out;
            size_t olen;
            if (mr_jinja_render(tp, NULL, &o, &out, &olen, &err) == 0)
                free(out);
            mr_jinja_free(tp);
        }
    }
}
END_TEST

START_TEST(chat_render)
{
    size_t len;
    char *src = slurp(fixture_path("templates/Qwen-Qwen3-0.6B.jinja"), &len);
    ck_assert_ptr_nonnull(src);
    mr_err err = {{0}};
    mr_chat_tmpl *ct = mr_chat_tmpl_new(src, len, "", "<|im_end|>", &err);
    free(src);
    ck_assert_msg(ct != NULL, "%s", err.msg);

    /* an OpenAI-style body: null content, arguments as a JSON string */
    json_t *body = json_loads(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}], "
        "\"chat_template_kwargs\": {\"enable_thinking\": false}}",
        0, NULL);
    ck_assert_ptr_nonnull(body);
    mr_chat_req req;
    ck_assert_int_eq(mr_chat_req_from_json(body, &req, &err), 0);
    ck_assert_int_eq(req.add_generation_prompt, 1);
    char *out;
    size_t olen;
    ck_assert_msg(mr_chat_render(ct, &req, NULL, &out, &olen, &err) == 0, "%s", err.msg);
    const char *want =
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    ck_assert_str_eq(out, want);
    ck_assert_uint_eq(olen, strlen(want));
    free(out);

    /* reasoning_effort "none" turns thinking off as enable_thinking false does */
    json_t *body2 = json_deep_copy(body);
    json_object_del(body2, "chat_template_kwargs");
    json_object_set_new(body2, "reasoning_effort", json_string("none"));
    mr_chat_req req2;
    ck_assert_int_eq(mr_chat_req_from_json(body2, &req2, &err), 0);
    ck_assert_msg(mr_chat_render(ct, &req2, NULL, &out, &olen, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(out, want);
    free(out);
    json_t *ctx2 = mr_chat_context(ct, &req2, &err);
    ck_assert_str_eq(json_string_value(json_object_get(ctx2, "reasoning_effort")), "none");
    json_decref(ctx2);
    json_object_set_new(body2, "reasoning_effort", json_integer(1));
    ck_assert_int_ne(mr_chat_req_from_json(body2, &req2, &err), 0);
    json_decref(body2);

    /* the context: tools absent, enable_thinking from the kwargs */
    json_t *ctx = mr_chat_context(ct, &req, &err);
    ck_assert_ptr_nonnull(ctx);
    ck_assert_ptr_null(json_object_get(ctx, "tools"));
    ck_assert(json_is_false(json_object_get(ctx, "enable_thinking")));
    ck_assert_str_eq(json_string_value(json_object_get(ctx, "eos_token")), "<|im_end|>");
    json_decref(ctx);

    /* bad requests are errors, not crashes */
    json_t *bad = json_loads("{\"messages\": [{\"content\": \"no role\"}]}", 0, NULL);
    ck_assert_int_eq(mr_chat_req_from_json(bad, &req, &err), 0);
    ck_assert_int_ne(mr_chat_render(ct, &req, NULL, &out, &olen, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "role"));
    json_decref(bad);
    bad = json_loads("{\"messages\": \"x\"}", 0, NULL);
    ck_assert_int_ne(mr_chat_req_from_json(bad, &req, &err), 0);
    json_decref(bad);

    /* a raising template reports the template's message */
    mr_chat_tmpl *ct2 = mr_chat_tmpl_new("{{ raise_exception('nope') }}", 29, NULL, NULL, &err);
    ck_assert_ptr_nonnull(ct2);
    ck_assert_int_eq(mr_chat_req_from_json(body, &req, &err), 0);
    ck_assert_int_ne(mr_chat_render(ct2, &req, NULL, &out, &olen, &err), 0);
    ck_assert_str_eq(err.msg, "chat template: line 1, col 4: nope");
    mr_chat_tmpl_free(ct2);

    json_decref(body);
    mr_chat_tmpl_free(ct);
}
END_TEST

START_TEST(chat_from_gguf)
{
    mr_gguf *g;
    mr_err err = {{0}};
    ck_assert_msg(mr_gguf_open(fixture_path("models/qwen3/model-BF16.gguf"), &g, &err) == 0, "%s",
                  err.msg);
    /* the model's own template is the Qwen3 one of the templates fixture */
    mr_chat_tmpl *ct = mr_chat_tmpl_from_gguf(g, NULL, 0, &err);
    ck_assert_msg(ct != NULL, "%s", err.msg);
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    mr_chat_req req = {.messages = msgs, .add_generation_prompt = 1, .enable_thinking = -1};
    char *out;
    size_t len;
    ck_assert_msg(mr_chat_render(ct, &req, NULL, &out, &len, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    mr_chat_tmpl_free(ct);

    /* an override template sees the model's special token texts */
    uint32_t eos_id;
    const mr_gguf_kv *toks;
    ck_assert_int_eq(mr_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos_id, &err), 0);
    ck_assert_int_eq(mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, &err), 0);
    char want[256];
    snprintf(want, sizeof want, "[%.*s]", (int)toks->v.arr.strs[eos_id].len,
             toks->v.arr.strs[eos_id].ptr);
    ct = mr_chat_tmpl_from_gguf(g, "[{{ eos_token }}]", 17, &err);
    ck_assert_msg(ct != NULL, "%s", err.msg);
    ck_assert_msg(mr_chat_render(ct, &req, NULL, &out, &len, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(out, want);
    ck_assert_uint_gt(len, 2);
    free(out);
    mr_chat_tmpl_free(ct);
    json_decref(msgs);
    mr_gguf_close(g);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("jinja");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cases_file);
    tcase_add_test(tc, error_positions);
    tcase_add_test(tc, limits);
    tcase_add_test(tc, malformed_templates_never_crash);
    tcase_add_test(tc, chat_render);
    tcase_add_test(tc, chat_from_gguf);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

/* Gateway pieces without the network: stop strings and UTF-8 holdback,
 * OpenAI request validation, config validation, the keyring. */
#include <jansson.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gateway/auth.h"
#include "gateway/config.h"
#include "gateway/metrics.h"
#include "gateway/openai.h"
#include "gateway/textout.h"
#include "tests/unit/testutil.h"

/* Feeds text in pieces of `step` bytes (0: one piece); returns everything
 * released (and finished). */
static char *feed(const char *text, size_t step, const char **stops, int n_stops, bool *stopped)
{
    mr_textout t;
    mr_textout_init(&t);
    for (int i = 0; i < n_stops; i++)
        mr_textout_add_stop(&t, stops[i]);
    mr_buf out = {0};
    *stopped = false;
    size_t n = strlen(text);
    for (size_t i = 0; i < n && !*stopped;) {
        size_t k = step && n - i > step ? step : n - i;
        *stopped = mr_textout_push(&t, text + i, k, &out);
        /* what has been released never splits a UTF-8 character */
        ck_assert(mr_gw_utf8_valid(out.p ? out.p : "", out.len));
        i += k;
    }
    mr_textout_finish(&t, &out);
    mr_textout_free(&t);
    char *s = strdup(out.p ? out.p : "");
    mr_buf_free(&out);
    return s;
}

static char *feed_bytewise(const char *text, const char **stops, int n_stops, bool *stopped)
{
    return feed(text, 1, stops, n_stops, stopped);
}

START_TEST(stop_strings)
{
    bool stopped;
    const char *st1[] = {"STOP"};
    char *s = feed_bytewise("hello STOP world", st1, 1, &stopped);
    ck_assert(stopped);
    ck_assert_str_eq(s, "hello ");
    free(s);
    /* a partial stop at the end is released when generation ends */
    s = feed_bytewise("hello ST", st1, 1, &stopped);
    ck_assert(!stopped);
    ck_assert_str_eq(s, "hello ST");
    free(s);
    /* the stop that completes first wins; overlapping prefixes */
    const char *st2[] = {"cd", "abcx", "b"};
    s = feed_bytewise("aabcd", st2, 3, &stopped);
    ck_assert(stopped);
    ck_assert_str_eq(s, "aa");
    free(s);
    /* multi-byte stop string and text */
    const char *st3[] = {"\xc3\xa9t\xc3\xa9"};
    s = feed_bytewise("caf\xc3\xa9 \xc3\xa9t\xc3\xa9 x", st3, 1, &stopped);
    ck_assert(stopped);
    ck_assert_str_eq(s, "caf\xc3\xa9 ");
    free(s);
}
END_TEST

static char *feed_whole(const char *text, const char **stops, int n_stops, bool *stopped)
{
    return feed(text, 0, stops, n_stops, stopped);
}

START_TEST(stop_that_ends_first_wins_in_any_chunking)
{
    /* "TO" completes before "STOP" does, so a stream stops there; one push
     * of the whole text must give the same (it cut before the "S") */
    const char *st[] = {"STOP", "TO"};
    bool s1, s2;
    char *a = feed_bytewise("xSTOPy", st, 2, &s1);
    char *b = feed_whole("xSTOPy", st, 2, &s2);
    ck_assert(s1 && s2);
    ck_assert_str_eq(a, "xS");
    ck_assert_str_eq(b, "xS");
    free(a);
    free(b);
    /* ending at the same byte, the longer stop wins */
    const char *st2[] = {"OP", "STOP"};
    a = feed_bytewise("xSTOPy", st2, 2, &s1);
    b = feed_whole("xSTOPy", st2, 2, &s2);
    ck_assert_str_eq(a, "x");
    ck_assert_str_eq(b, "x");
    free(a);
    free(b);
}
END_TEST

START_TEST(stop_matches_the_text_the_client_sees)
{
    /* an invalid byte is shown as U+FFFD, so a stop holding U+FFFD matches
     * it (the raw bytes never did, and the client saw the stop string) */
    const char *st[] = {"\xef\xbf\xbd"};
    bool s1, s2;
    char *a = feed_bytewise("a\xff" "b", st, 1, &s1);
    char *b = feed_whole("a\xff" "b", st, 1, &s2);
    ck_assert(s1 && s2);
    ck_assert_str_eq(a, "a");
    ck_assert_str_eq(b, "a");
    free(a);
    free(b);
    /* a character cut off at the end becomes U+FFFD at finish, which may
     * complete a stop only then */
    mr_textout t;
    mr_textout_init(&t);
    mr_textout_add_stop(&t, "x\xef\xbf\xbd");
    mr_textout_add_stop(&t, "\xbd"); /* not UTF-8: ignored */
    ck_assert_uint_eq(t.n_stops, 1);
    mr_buf out = {0};
    ck_assert(!mr_textout_push(&t, "ax\xe2\x82", 4, &out));
    ck_assert_str_eq(out.p, "a");
    ck_assert(mr_textout_finish(&t, &out));
    ck_assert_str_eq(out.p, "a");
    mr_buf_free(&out);
    mr_textout_free(&t);
}
END_TEST

START_TEST(streamed_text_never_shows_partial_stop)
{
    mr_textout t;
    mr_textout_init(&t);
    mr_textout_add_stop(&t, "</end>");
    mr_buf out = {0};
    ck_assert(!mr_textout_push(&t, "abc</e", 6, &out));
    ck_assert_str_eq(out.p, "abc");
    ck_assert(!mr_textout_push(&t, "nx", 2, &out)); /* "</enx" cannot become the stop any more */
    ck_assert_str_eq(out.p, "abc</enx");
    ck_assert(mr_textout_push(&t, "</end>tail", 10, &out));
    ck_assert_str_eq(out.p, "abc</enx");
    mr_buf_free(&out);
    mr_textout_free(&t);
}
END_TEST

START_TEST(utf8_boundaries)
{
    /* "€" = e2 82 ac arrives split; nothing is released until complete */
    mr_textout t;
    mr_textout_init(&t);
    mr_buf out = {0};
    mr_textout_push(&t, "a\xe2", 2, &out);
    ck_assert_uint_eq(out.len, 1);
    mr_textout_push(&t, "\x82", 1, &out);
    ck_assert_uint_eq(out.len, 1);
    mr_textout_push(&t, "\xac", 1, &out);
    ck_assert_str_eq(out.p, "a\xe2\x82\xac");
    /* invalid bytes become U+FFFD; a dangling lead byte at the end too */
    mr_textout_push(&t, "\xff", 1, &out);
    mr_textout_push(&t, "\xe2\x82", 2, &out);
    mr_textout_finish(&t, &out);
    ck_assert_str_eq(out.p, "a\xe2\x82\xac\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    mr_buf_free(&out);
    mr_textout_free(&t);
    ck_assert(!mr_gw_utf8_valid("\xc0\x80", 2));      /* overlong */
    ck_assert(!mr_gw_utf8_valid("\xed\xa0\x80", 3));  /* surrogate */
    ck_assert(!mr_gw_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    ck_assert(mr_gw_utf8_valid("\xf0\x9f\x98\x80", 4));
}
END_TEST

static int parse(const char *body, bool chat, mr_oai_req *r, mr_oai_error *e)
{
    int rc = mr_oai_parse(body, strlen(body), chat, r, e);
    return rc;
}

START_TEST(openai_validation)
{
    mr_oai_req r;
    mr_oai_error e;
    static const struct {
        const char *body;
        bool chat;
        const char *param; /* NULL = accepted */
    } cases[] = {
        {"{\"model\":\"m\",\"prompt\":\"hi\"}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":[1,2,3]}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":[[1,2]]}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":[\"a\"]}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", false, "prompt"},
        {"{\"model\":\"m\",\"prompt\":[-1]}", false, "prompt"},
        {"{\"model\":\"m\",\"prompt\":\"\"}", false, "prompt"},
        {"{\"model\":\"m\"}", false, "prompt"},
        {"{\"prompt\":\"x\"}", false, "model"},
        {"{\"model\":5,\"prompt\":\"x\"}", false, "model"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"n\":2}", false, "n"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"n\":\"1\"}", false, "n"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"n\":1}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":2.5}", false, "temperature"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":\"hot\"}", false, "temperature"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":true}", false, "temperature"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":0}", false, "top_p"},
        /* positive, but 0 as the float the sampler gets */
        {"{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":1e-50}", false, "top_p"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"repetition_penalty\":1e-46}", false, "repetition_penalty"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":1e-30}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"top_k\":-2}", false, "top_k"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"top_k\":-1}", false, NULL},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"min_p\":1.5}", false, "min_p"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}", false, "max_tokens"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1.5}", false, "max_tokens"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"presence_penalty\":-3}", false, "presence_penalty"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"frequency_penalty\":2.01}", false, "frequency_penalty"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"repetition_penalty\":0}", false, "repetition_penalty"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stop\":5}", false, "stop"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\",\"\"]}", false, "stop"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"seed\":\"1\"}", false, "seed"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":6}", false, "logprobs"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"yes\"}", false, "stream"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", false, "stream_options"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"user\":7}", false, "user"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"unknown_field\":{\"x\":1}}", false, NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", true, NULL},
        {"{\"model\":\"m\",\"messages\":[]}", true, "messages"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", true, "messages"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", true, "messages"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", true, "messages"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}]}", true, NULL},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", true, "logprobs"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", true, "top_logprobs"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", true, "top_logprobs"},
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", true, "max_completion_tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = parse(cases[i].body, cases[i].chat, &r, &e);
        if (!cases[i].param)
            ck_assert_msg(rc == 0, "case %zu rejected: %s", i, e.message);
        else {
            ck_assert_msg(rc == -1, "case %zu accepted: %s", i, cases[i].body);
            ck_assert_int_eq(e.status, 400);
            ck_assert_msg(!strcmp(e.param, cases[i].param), "case %zu: param %s, expected %s", i, e.param,
                          cases[i].param);
        }
        mr_oai_req_free(&r);
    }
    /* not JSON, not an object, invalid UTF-8 */
    ck_assert_int_eq(parse("{", false, &r, &e), -1);
    mr_oai_req_free(&r);
    ck_assert_int_eq(parse("[1]", false, &r, &e), -1);
    mr_oai_req_free(&r);
    ck_assert_int_eq(parse("{\"model\":\"\xff\",\"prompt\":\"x\"}", false, &r, &e), -1);
    ck_assert_int_eq(e.status, 400);
    mr_oai_req_free(&r);

    /* values land where they belong */
    ck_assert_int_eq(parse("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":9,\"temperature\":0,\"top_p\":0.5,"
                           "\"top_k\":7,\"seed\":-1,\"stop\":[\"a\",\"b\"],\"stream\":true,"
                           "\"stream_options\":{\"include_usage\":true},\"cache_salt\":\"s\",\"logprobs\":2}",
                           false, &r, &e),
                     0);
    ck_assert_uint_eq(r.max_tokens, 9);
    ck_assert(r.has_max_tokens);
    ck_assert_float_eq(r.samp.temperature, 0);
    ck_assert_float_eq(r.samp.top_p, 0.5f);
    ck_assert_uint_eq(r.samp.top_k, 7);
    ck_assert(r.samp.has_seed);
    ck_assert_uint_eq(r.samp.seed, UINT64_MAX);
    ck_assert_int_eq(r.n_stops, 2);
    ck_assert(r.stream && r.include_usage);
    ck_assert_str_eq(r.cache_salt, "s");
    ck_assert(r.samp.logprobs);
    ck_assert_uint_eq(r.samp.top_logprobs, 2);
    mr_oai_req_free(&r);

    /* the error body is exactly the OpenAI shape */
    mr_oai_err(&e, 429, NULL, "rate_limit_exceeded", "slow down");
    char *s = mr_oai_error_json(&e);
    json_t *o = json_loads(s, 0, NULL);
    json_t *er = json_object_get(o, "error");
    ck_assert_uint_eq(json_object_size(o), 1);
    ck_assert_uint_eq(json_object_size(er), 4);
    ck_assert_str_eq(json_string_value(json_object_get(er, "message")), "slow down");
    ck_assert_str_eq(json_string_value(json_object_get(er, "type")), "rate_limit_error");
    ck_assert(json_is_null(json_object_get(er, "param")));
    ck_assert_str_eq(json_string_value(json_object_get(er, "code")), "rate_limit_exceeded");
    json_decref(o);
    free(s);
}
END_TEST

START_TEST(config_validation)
{
    mr_config c;
    mr_err err;
    const char *ok = "{\"listen\":\"0.0.0.0:9000\",\"keyring\":\"k.json\",\"tenants\":{\"acme\":{\"max_concurrency\":3},"
                     "\"*\":{\"max_concurrency\":9}},\"models\":[{\"name\":\"a\",\"path\":\"a.gguf\","
                     "\"workers\":[{\"listen\":\"ipc:///tmp/a\",\"device\":1}]}]}";
    ck_assert_msg(mr_config_parse(ok, &c, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(c.host, "0.0.0.0");
    ck_assert_int_eq(c.port, 9000);
    ck_assert_int_eq(c.n_tenants, 1);
    ck_assert_int_eq(c.tenants[0].max_concurrency, 3);
    ck_assert_int_eq(c.default_tenant_max, 9);
    ck_assert_int_eq(c.models[0].workers[0].device, 1);
    ck_assert_int_eq(c.stream_keepalive_ms, 15000);
    mr_config_free(&c);
    static const struct {
        const char *text;
        const char *want;
    } bad[] = {
        {"{", "line 1"},
        {"{\"models\":[]}", "models"},
        {"{\"listen\":\"nohost\",\"models\":[]}", "listen"},
        {"{\"listen\":\"h:99999\",\"models\":[]}", "port"},
        {"{\"max_body_bytes\":\"big\",\"models\":[]}", "max_body_bytes: expected an integer"},
        {"{\"models\":[{\"name\":\"a\",\"path\":\"p\",\"workers\":[{\"listen\":\"http://x\"}]}]}",
         "models[0].workers[0].listen"},
        {"{\"models\":[{\"name\":\"a\",\"path\":\"p\",\"workers\":[]}]}", "models[0].workers"},
        {"{\"models\":[{\"path\":\"p\",\"workers\":[{\"listen\":\"ipc:///a\"}]}]}", "models[0].name"},
        {"{\"models\":[{\"name\":\"a\",\"workers\":[{\"listen\":\"ipc:///a\"}]}]}", "models[0].path"},
        {"{\"models\":[{\"name\":\"a\",\"tokenizer\":\"bytes\",\"workers\":[{\"listen\":\"ipc:///a\"}]},"
         "{\"name\":\"a\",\"tokenizer\":\"bytes\",\"workers\":[{\"listen\":\"ipc:///b\"}]}]}",
         "already used"},
        {"{\"tenants\":{\"bad name\":{}},\"models\":[]}", "tenants"},
        {"{\"supervise\":1,\"models\":[]}", "supervise"},
        {"{\"stream_keepalive_ms\":50,\"models\":[]}", "stream_keepalive_ms: 0 (off) or 100"},
        {"{\"stream_keepalive_ms\":-1,\"models\":[]}", "stream_keepalive_ms"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_msg(mr_config_parse(bad[i].text, &c, &err) == -1, "case %zu accepted", i);
        ck_assert_msg(strstr(err.msg, bad[i].want), "case %zu: \"%s\" lacks \"%s\"", i, err.msg, bad[i].want);
        mr_config_free(&c);
    }
    ck_assert(mr_host_is_loopback("127.0.0.1"));
    ck_assert(mr_host_is_loopback("::1"));
    ck_assert(!mr_host_is_loopback("0.0.0.0"));
    ck_assert(!mr_host_is_loopback("10.0.0.1"));
}
END_TEST

START_TEST(keyring)
{
    char dir[] = "/tmp/memra-keyring-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/keys.json", dir);
    mr_keyring kr = {0};
    mr_err err;
    char key1[64], id1[32], key2[64], id2[32];
    ck_assert_int_eq(mr_keyring_add(&kr, "acme", 2, key1, id1, &err), 0);
    ck_assert_int_eq(mr_keyring_add(&kr, "beta", 0, key2, id2, &err), 0);
    ck_assert_int_eq(mr_keyring_add(&kr, "bad tenant", 0, key2, id2, &err), -1);
    ck_assert_int_eq(mr_keyring_save(path, &kr, &err), 0);
    mr_keyring_free(&kr);

    /* the file holds hashes, never the keys */
    FILE *f = fopen(path, "r");
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    ck_assert_ptr_null(strstr(text, key1 + 3));
    unsigned char h[32];
    SHA256((const unsigned char *)key1, strlen(key1), h);
    char hx[65];
    for (int i = 0; i < 32; i++)
        sprintf(hx + 2 * i, "%02x", h[i]);
    ck_assert_ptr_nonnull(strstr(text, hx)); /* SHA-256 computed independently of the keyring code */
    struct stat st;
    stat(path, &st);
    ck_assert_int_eq(st.st_mode & 077, 0);

    ck_assert_int_eq(mr_keyring_load(path, &kr, &err), 0);
    /* the file is mr_keyring_dumps' text, and that text parses from memory */
    char *dump = mr_keyring_dumps(&kr);
    ck_assert_str_eq(dump, text);
    free(dump);
    mr_keyring mem;
    ck_assert_int_eq(mr_keyring_parse(text, n, "mem", &mem, &err), 0);
    ck_assert_uint_eq(mem.n, 2);
    ck_assert_str_eq(mem.keys[0].id, id1);
    mr_keyring_free(&mem);
    ck_assert_int_eq(mr_keyring_parse("{\"keys\":{}}", 11, "mem", &mem, &err), -1);
    ck_assert_str_eq(err.msg, "keyring mem: expected {\"keys\": [...]}");
    const mr_key *k = mr_keyring_find(&kr, key1, strlen(key1));
    ck_assert_ptr_nonnull(k);
    ck_assert_str_eq(k->tenant, "acme");
    ck_assert_int_eq(k->max_concurrency, 2);
    ck_assert(k->enabled);
    ck_assert_ptr_null(mr_keyring_find(&kr, "mk-wrong", 8));
    ck_assert_ptr_null(mr_keyring_find(&kr, key1, strlen(key1) - 1));
    ck_assert_int_eq(mr_keyring_disable(&kr, id2, &err), 0);
    ck_assert_int_eq(mr_keyring_disable(&kr, "k-nope", &err), -1);
    ck_assert_int_eq(mr_keyring_save(path, &kr, &err), 0);
    mr_keyring_free(&kr);
    ck_assert_int_eq(mr_keyring_load(path, &kr, &err), 0);
    ck_assert(!mr_keyring_find(&kr, key2, strlen(key2))->enabled);
    mr_keyring_free(&kr);

    /* broken rings are refused as a whole */
    static const char *bad[] = {
        "{\"keys\":[{\"id\":\"a\",\"sha256\":\"zz\",\"tenant\":\"t\"}]}",
        "{\"keys\":[{\"id\":\"a\",\"sha256\":\"" "0000000000000000000000000000000000000000000000000000000000000000"
        "\",\"tenant\":\"t t\"}]}",
        "{\"keys\":[{\"id\":\"a\",\"sha256\":\"" "0000000000000000000000000000000000000000000000000000000000000000"
        "\",\"tenant\":\"t\"},{\"id\":\"b\",\"sha256\":\""
        "0000000000000000000000000000000000000000000000000000000000000000\",\"tenant\":\"t\"}]}",
        "{\"keys\":[{\"id\":\"a\",\"sha256\":\"" "0000000000000000000000000000000000000000000000000000000000000000"
        "\",\"tenant\":\"t\",\"enabled\":\"yes\"}]}",
        "{\"keys\":{}}",
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        ck_assert_msg(mr_keyring_load(path, &kr, &err) == -1, "bad ring %zu accepted", i);
        ck_assert_msg(!strncmp(err.msg, "keyring ", 8) && strstr(err.msg, path), "ring %zu: %s", i, err.msg);
    }
    ck_assert_int_eq(mr_keyring_load(path, &kr, &err), -1); /* "not json" */
    ck_assert_ptr_nonnull(strstr(err.msg, ": line 1: "));
    unlink(path);
    ck_assert_int_eq(mr_keyring_load(path, &kr, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "unable to open"));
    rmdir(dir);
}
END_TEST

START_TEST(histogram)
{
    mr_hist h = {0};
    mr_hist_observe(&h, 0.0005);
    mr_hist_observe(&h, 0.02);
    mr_hist_observe(&h, 100);
    mr_buf b = {0};
    mr_hist_render(&b, "x", "m=\"a\"", &h);
    ck_assert_ptr_nonnull(strstr(b.p, "x_bucket{m=\"a\",le=\"0.001\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(b.p, "x_bucket{m=\"a\",le=\"0.025\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(b.p, "x_bucket{m=\"a\",le=\"30\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(b.p, "x_bucket{m=\"a\",le=\"+Inf\"} 3\n"));
    ck_assert_ptr_nonnull(strstr(b.p, "x_count{m=\"a\"} 3\n"));
    mr_buf_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gateway_core");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, stop_strings);
    tcase_add_test(tc, stop_that_ends_first_wins_in_any_chunking);
    tcase_add_test(tc, stop_matches_the_text_the_client_sees);
    tcase_add_test(tc, streamed_text_never_shows_partial_stop);
    tcase_add_test(tc, utf8_boundaries);
    tcase_add_test(tc, openai_validation);
    tcase_add_test(tc, config_validation);
    tcase_add_test(tc, keyring);
    tcase_add_test(tc, histogram);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

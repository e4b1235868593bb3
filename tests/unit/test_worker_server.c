/* memra-worker as a process, driven over the protocol: greedy output on the
 * qwen3 BF16 fixture equals the transformers greedy continuation, the
 * reported logprob equals the log-softmax of the transformers logits,
 * interleaved requests do not change each other's tokens, cancel lands
 * within a step, a malformed message gets an error reply, seeds repeat;
 * on a small KV pool a request that can never fit is refused with
 * "capacity", one that does not fit yet waits, and a full queue refuses;
 * --kv-dtype f32 serves the same tokens, and the CPU backend refuses a
 * float16 cache at start with a message that says so. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/chan.h"
#include "tests/unit/fixture_ref.h"

static pid_t g_pid;
static mr_chan g_chan;
static char g_url[128];
static uint32_t g_prompt[8], g_n_prompt;
static uint32_t g_ref[24];
static float *g_ref_logits; /* last row of ref-logits-0 */
static int g_vocab = 1024;
static const char *g_extra[8]; /* more worker flags (NULL-terminated) */
static char g_log[128];       /* the worker's stderr */

static void load_reference(void)
{
    reference r;
    ref_load("qwen3", &r, 1);
    g_n_prompt = (uint32_t)r.prompt_len[0];
    ck_assert_uint_le(g_n_prompt, 8);
    for (uint32_t i = 0; i < g_n_prompt; i++)
        g_prompt[i] = (uint32_t)r.prompt[0][i];
    json_t *c = ref_greedy(&r);
    for (int i = 0; i < 24; i++)
        g_ref[i] = (uint32_t)json_integer_value(json_array_get(c, i));
    ref_free(&r);
    FILE *f = fopen(fixture_path("models/qwen3/ref-logits-0.f32"), "rb");
    ck_assert_ptr_nonnull(f);
    g_ref_logits = malloc(g_vocab * sizeof *g_ref_logits);
    fseek(f, (long)((g_n_prompt - 1) * g_vocab * sizeof(float)), SEEK_SET);
    ck_assert_int_eq(fread(g_ref_logits, sizeof(float), g_vocab, f), g_vocab);
    fclose(f);
}

static void setup(void)
{
    load_reference();
    const char *bin = getenv("MEMRA_BIN");
    char exe[512], model_path[4096];
    snprintf(exe, sizeof exe, "%s/memra-worker", bin && *bin ? bin : "build/bin");
    snprintf(model_path, sizeof model_path, "%s", fixture_path("models/qwen3/model-BF16.gguf"));
    snprintf(g_url, sizeof g_url, "ipc:///tmp/memra-test-worker-%d.sock", (int)getpid());
    snprintf(g_log, sizeof g_log, "/tmp/memra-test-worker-%d.log", (int)getpid());
    int log_fd = open(g_log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(log_fd, 0);
    g_pid = fork();
    if (g_pid == 0) {
        dup2(log_fd, 2);
        const char *argv[32] = {exe,    "--listen", g_url, "--model", model_path,     "--backend", "cpu",
                                "--name", "qwen3",   "--ctx", "2048",    "--max-running", "8"};
        int n = 13;
        for (int i = 0; g_extra[i]; i++)
            argv[n++] = g_extra[i];
        argv[n] = NULL;
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(log_fd);
    mr_err err;
    ck_assert_msg(mr_chan_dial(&g_chan, g_url, NULL, NULL, &err) == 0, "%s", err.msg);
    /* the worker answers hello once it is up */
    mr_msg h, r;
    uint64_t bad;
    for (int i = 0; i < 200; i++) {
        mr_msg_init(&h, MR_MSG_HELLO, 0);
        strcpy(h.model, "test");
        mr_chan_send(&g_chan, &h, 100, &err);
        if (mr_chan_recv(&g_chan, &r, 100, &bad, &err) == MR_CHAN_OK && r.type == MR_MSG_HELLO) {
            ck_assert_str_eq(r.model, "qwen3");
            ck_assert_uint_eq(r.n_ctx, 2048);
            ck_assert_uint_eq(r.n_vocab, 1024);
            mr_msg_free(&r);
            /* drop further hello replies of the retries */
            while (mr_chan_recv(&g_chan, &r, 100, &bad, &err) == MR_CHAN_OK)
                mr_msg_free(&r);
            return;
        }
    }
    ck_abort_msg("worker did not answer hello");
}

static void teardown(void)
{
    mr_chan_close(&g_chan);
    kill(g_pid, SIGTERM);
    int st;
    waitpid(g_pid, &st, 0);
    free(g_ref_logits);
    unlink(g_log);
}

/* The count in the worker's log line "request ID: cancel after N tokens"
 * (-1: no such line). */
static long cancel_count(uint64_t id)
{
    FILE *f = fopen(g_log, "r");
    ck_assert_ptr_nonnull(f);
    char line[512], key[64];
    snprintf(key, sizeof key, "request %llu: cancel after ", (unsigned long long)id);
    long n = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, key);
        if (p)
            n = strtol(p + strlen(key), NULL, 10);
    }
    fclose(f);
    return n;
}

static void send_req(uint64_t id, const uint32_t *p, uint32_t n, uint32_t max_tokens, float temp, bool seed,
                     uint64_t s, uint32_t top)
{
    mr_msg m;
    mr_msg_init(&m, MR_MSG_REQUEST, id);
    m.tokens = malloc(n * sizeof *m.tokens);
    memcpy(m.tokens, p, n * sizeof *m.tokens);
    m.n_tokens = n;
    m.max_tokens = max_tokens;
    m.samp.temperature = temp;
    m.samp.has_seed = seed;
    m.samp.seed = s;
    m.samp.logprobs = top > 0;
    m.samp.top_logprobs = top;
    strcpy(m.tenant, "t");
    mr_err err;
    ck_assert_msg(mr_chan_send(&g_chan, &m, 1000, &err) == 0, "%s", err.msg);
    mr_msg_free(&m);
}

typedef struct result {
    uint32_t toks[4096];
    uint32_t n;
    bool done;
    mr_msg final;
    float lp0, top_lp0[4];
    uint32_t top_id0[4];
} result;

/* Receives until every id in [1..n] has its final (or error). */
static void collect(result *res, int n)
{
    int done = 0;
    mr_err err;
    uint64_t bad;
    while (done < n) {
        mr_msg m;
        int rc = mr_chan_recv(&g_chan, &m, 20000, &bad, &err);
        ck_assert_msg(rc == MR_CHAN_OK, "recv: %d %s", rc, err.msg);
        ck_assert_msg(m.id >= 1 && m.id <= (uint64_t)n, "unexpected id %llu type %s", (unsigned long long)m.id,
                      mr_msg_type_name(m.type));
        result *r = &res[m.id - 1];
        if (m.type == MR_MSG_TOKENS) {
            for (uint32_t i = 0; i < m.n_tokens; i++) {
                if (r->n == 0 && m.logprobs) {
                    r->lp0 = m.logprobs[0];
                    for (uint32_t k = 0; k < m.n_top && k < 4; k++) {
                        r->top_id0[k] = m.top_ids[k];
                        r->top_lp0[k] = m.top_lps[k];
                    }
                }
                r->toks[r->n++] = m.tokens[i];
            }
            mr_msg_free(&m);
        } else {
            ck_assert_msg(m.type == MR_MSG_FINAL, "id %llu: %s %s %s", (unsigned long long)m.id,
                          mr_msg_type_name(m.type), m.code, m.text);
            r->final = m;
            r->done = true;
            done++;
        }
    }
}

START_TEST(greedy_matches_transformers)
{
    static result res[1];
    memset(res, 0, sizeof res);
    send_req(1, g_prompt, g_n_prompt, 24, 0.0f, false, 0, 3);
    collect(res, 1);
    ck_assert_uint_eq(res[0].n, 24);
    for (int i = 0; i < 24; i++)
        ck_assert_msg(res[0].toks[i] == g_ref[i], "token %d: %u, reference %u", i, res[0].toks[i], g_ref[i]);
    ck_assert_int_eq(res[0].final.finish, MR_FINISH_LENGTH);
    ck_assert_uint_eq(res[0].final.prompt_tokens, g_n_prompt);
    ck_assert_uint_eq(res[0].final.completion_tokens, 24);
    /* logprob of the first token against log-softmax of the transformers logits */
    double mx = g_ref_logits[0], sum = 0;
    for (int i = 1; i < g_vocab; i++)
        mx = fmax(mx, g_ref_logits[i]);
    for (int i = 0; i < g_vocab; i++)
        sum += exp(g_ref_logits[i] - mx);
    double want = g_ref_logits[g_ref[0]] - mx - log(sum);
    ck_assert_msg(fabs(res[0].lp0 - want) < 1e-3, "logprob %g, reference %g", res[0].lp0, want);
    ck_assert_uint_eq(res[0].top_id0[0], g_ref[0]);
    ck_assert_float_eq_tol(res[0].top_lp0[0], res[0].lp0, 1e-6);
    ck_assert(res[0].top_lp0[1] <= res[0].top_lp0[0] && res[0].top_lp0[2] <= res[0].top_lp0[1]);
}
END_TEST

START_TEST(interleaved_requests_keep_their_tokens)
{
    static result res[8];
    memset(res, 0, sizeof res);
    send_req(1, g_prompt, g_n_prompt, 24, 0.0f, false, 0, 0);
    for (uint64_t id = 2; id <= 8; id++) {
        uint32_t p[3] = {(uint32_t)(id * 37), (uint32_t)(id * 91 % 1000), 5};
        send_req(id, p, 3, 10 + (uint32_t)id, id % 2 ? 0.9f : 0.0f, true, id, 0);
    }
    collect(res, 8);
    for (int i = 0; i < 24; i++)
        ck_assert_msg(res[0].toks[i] == g_ref[i], "token %d: %u among others, %u alone", i, res[0].toks[i], g_ref[i]);
    for (int id = 2; id <= 8; id++) {
        /* sampled ones may meet an end-of-generation token first */
        result *r = &res[id - 1];
        ck_assert(r->n == 10 + (uint32_t)id ? r->final.finish == MR_FINISH_LENGTH
                                             : r->n < 10 + (uint32_t)id && r->final.finish == MR_FINISH_STOP);
    }
}
END_TEST

START_TEST(seeded_sampling_repeats)
{
    static result a[1], b[1];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    send_req(1, g_prompt, g_n_prompt, 16, 0.9f, true, 1234, 0);
    collect(a, 1);
    send_req(1, g_prompt, g_n_prompt, 16, 0.9f, true, 1234, 0);
    collect(b, 1);
    ck_assert_uint_gt(a[0].n, 0);
    ck_assert_uint_eq(a[0].n, b[0].n);
    ck_assert_int_eq(memcmp(a[0].toks, b[0].toks, a[0].n * sizeof(uint32_t)), 0);
}
END_TEST

START_TEST(cancel_within_a_step)
{
    send_req(1, g_prompt, g_n_prompt, 2000, 0.0f, false, 0, 0);
    mr_err err;
    uint64_t bad;
    mr_msg m;
    ck_assert_int_eq(mr_chan_recv(&g_chan, &m, 20000, &bad, &err), MR_CHAN_OK);
    ck_assert_int_eq(m.type, MR_MSG_TOKENS);
    uint32_t first = m.n_tokens;
    mr_msg_free(&m);
    mr_msg c;
    mr_msg_init(&c, MR_MSG_CANCEL, 1);
    ck_assert_int_eq(mr_chan_send(&g_chan, &c, 1000, &err), 0);
    uint32_t after = 0;
    for (;;) {
        ck_assert_int_eq(mr_chan_recv(&g_chan, &m, 20000, &bad, &err), MR_CHAN_OK);
        if (m.type == MR_MSG_FINAL)
            break;
        ck_assert_int_eq(m.type, MR_MSG_TOKENS);
        after += m.n_tokens;
        mr_msg_free(&m);
    }
    ck_assert_int_eq(m.finish, MR_FINISH_CANCELLED);
    /* every token made reached the client, and the cancel took effect at
     * the next step: counted from when the worker read it (its log line),
     * not from when the client sent it (the tokens between are ones the
     * worker had made already, however the processes were scheduled, and
     * ones still in its send queue) */
    ck_assert_uint_eq(m.completion_tokens, first + after);
    long at = cancel_count(1);
    ck_assert_msg(at >= 0, "no cancel line in the worker's log");
    ck_assert_msg(m.completion_tokens - (uint32_t)at <= 1, "%u tokens made after the worker read the cancel (%ld before)",
                  m.completion_tokens - (uint32_t)at, at);
}
END_TEST

START_TEST(bad_messages_get_errors)
{
    mr_err err;
    uint64_t bad;
    mr_msg m;
    ck_assert_int_eq(mr_chan_send_raw(&g_chan, "\x93\x01\x02", 3, &err), 0);
    ck_assert_int_eq(mr_chan_recv(&g_chan, &m, 5000, &bad, &err), MR_CHAN_OK);
    ck_assert_int_eq(m.type, MR_MSG_ERROR);
    ck_assert_str_eq(m.code, "bad_message");
    mr_msg_free(&m);
    /* a token id outside the vocabulary and a context overflow */
    uint32_t p[2] = {1, 5000};
    send_req(7, p, 2, 4, 0, false, 0, 0);
    ck_assert_int_eq(mr_chan_recv(&g_chan, &m, 5000, &bad, &err), MR_CHAN_OK);
    ck_assert_int_eq(m.type, MR_MSG_ERROR);
    ck_assert_uint_eq(m.id, 7);
    mr_msg_free(&m);
    send_req(8, g_prompt, g_n_prompt, 4000, 0, false, 0, 0);
    ck_assert_int_eq(mr_chan_recv(&g_chan, &m, 5000, &bad, &err), MR_CHAN_OK);
    ck_assert_str_eq(m.code, "context_length_exceeded");
    mr_msg_free(&m);
    /* and the worker still serves */
    static result res[1];
    memset(res, 0, sizeof res);
    send_req(1, g_prompt, g_n_prompt, 3, 0, false, 0, 0);
    collect(res, 1);
    ck_assert_uint_eq(res[0].toks[2], g_ref[2]);
}
END_TEST

/* A worker whose KV pool holds 48 tokens (3 blocks of 16) and whose
 * queue holds one request. */
static void setup_small(void)
{
    static const char *extra[] = {"--kv-tokens", "48", "--max-queued", "1", NULL};
    memcpy(g_extra, extra, sizeof extra);
    setup();
}

static void setup_kv_f32(void)
{
    static const char *extra[] = {"--kv-dtype", "f32", NULL};
    memcpy(g_extra, extra, sizeof extra);
    setup();
}

/* Runs memra-worker with args (NULL-terminated, after the program name) to
 * its exit; its stderr into err_out.  Returns the exit status (-1: killed). */
static int worker_exit(const char *const *args, char *err_out, size_t cap)
{
    const char *bin = getenv("MEMRA_BIN");
    char exe[512];
    snprintf(exe, sizeof exe, "%s/memra-worker", bin && *bin ? bin : "build/bin");
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        const char *argv[32] = {exe};
        int n = 1;
        for (int i = 0; args[i] && n < 31; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        dup2(fd[1], 2);
        close(fd[0]);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = read(fd[0], err_out + got, cap - 1 - got)) > 0)
        got += (size_t)r;
    err_out[got] = 0;
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(kv_dtype_checked_at_start)
{
    char url[128], gguf[4096], msg[4096];
    snprintf(url, sizeof url, "ipc:///tmp/memra-test-kvdt-%d.sock", (int)getpid());
    snprintf(gguf, sizeof gguf, "%s", fixture_path("models/qwen3/model-BF16.gguf"));
    const char *f16[] = {"--listen", url, "--model", gguf, "--backend", "cpu", "--kv-dtype", "f16", NULL};
    ck_assert_int_eq(worker_exit(f16, msg, sizeof msg), 1);
    ck_assert_msg(strstr(msg, "KV cache") && strstr(msg, "float32 only"), "stderr: %s", msg);
    const char *bad[] = {"--listen", url, "--model", gguf, "--backend", "cpu", "--kv-dtype", "f64", NULL};
    ck_assert_int_eq(worker_exit(bad, msg, sizeof msg), 2);
    ck_assert_msg(strstr(msg, "--kv-dtype"), "the usage names the flag: %s", msg);
}
END_TEST

static mr_msg recv_one(void)
{
    mr_msg m;
    mr_err err;
    uint64_t bad;
    ck_assert_int_eq(mr_chan_recv(&g_chan, &m, 20000, &bad, &err), MR_CHAN_OK);
    return m;
}

START_TEST(kv_admission)
{
    mr_msg m;
    mr_err err;
    /* the pool as reported */
    mr_msg q;
    mr_msg_init(&q, MR_MSG_CAP_QUERY, 0);
    ck_assert_int_eq(mr_chan_send(&g_chan, &q, 1000, &err), 0);
    m = recv_one();
    ck_assert_int_eq(m.type, MR_MSG_CAPACITY);
    ck_assert_uint_eq(m.kv_total, 3);
    ck_assert_uint_eq(m.kv_free, 3);
    ck_assert_uint_eq(m.block_tokens, 16);
    mr_msg_free(&m);
    /* 7 + 60 tokens need ceil(66 / 16) = 5 blocks of the 3 there are: never fits */
    send_req(9, g_prompt, g_n_prompt, 60, 0, false, 0, 0);
    m = recv_one();
    ck_assert_int_eq(m.type, MR_MSG_ERROR);
    ck_assert_uint_eq(m.id, 9);
    ck_assert_str_eq(m.code, "capacity");
    mr_msg_free(&m);
    /* 7 + 24 tokens need 2 blocks: 1 runs, 2 waits in the queue for its KV,
     * 3 finds the queue full */
    send_req(1, g_prompt, g_n_prompt, 24, 0, false, 0, 0);
    send_req(2, g_prompt, g_n_prompt, 24, 0, false, 0, 0);
    send_req(3, g_prompt, g_n_prompt, 24, 0, false, 0, 0);
    static result res[3];
    memset(res, 0, sizeof res);
    int done = 0;
    bool refused3 = false, seen2_before_1_done = false;
    while (done < 2 || !refused3) {
        m = recv_one();
        ck_assert_msg(m.id >= 1 && m.id <= 3, "id %llu", (unsigned long long)m.id);
        result *r = &res[m.id - 1];
        if (m.id == 3) {
            ck_assert_int_eq(m.type, MR_MSG_ERROR);
            ck_assert_str_eq(m.code, "capacity");
            refused3 = true;
        } else if (m.type == MR_MSG_TOKENS) {
            if (m.id == 2 && !res[0].done)
                seen2_before_1_done = true;
            for (uint32_t i = 0; i < m.n_tokens; i++)
                r->toks[r->n++] = m.tokens[i];
        } else {
            ck_assert_int_eq(m.type, MR_MSG_FINAL);
            r->done = true;
            done++;
        }
        mr_msg_free(&m);
    }
    ck_assert_msg(!seen2_before_1_done, "request 2 ran while 1 held the KV it needed");
    for (int k = 0; k < 2; k++) {
        ck_assert_uint_eq(res[k].n, 24);
        for (int i = 0; i < 24; i++)
            ck_assert_uint_eq(res[k].toks[i], g_ref[i]);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("worker_server");
    TCase *tc = tcase_create("worker");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, greedy_matches_transformers);
    tcase_add_test(tc, interleaved_requests_keep_their_tokens);
    tcase_add_test(tc, seeded_sampling_repeats);
    tcase_add_test(tc, cancel_within_a_step);
    tcase_add_test(tc, bad_messages_get_errors);
    suite_add_tcase(s, tc);
    TCase *tk = tcase_create("kv");
    tcase_set_timeout(tk, 60);
    tcase_add_checked_fixture(tk, setup_small, teardown);
    tcase_add_test(tk, kv_admission);
    suite_add_tcase(s, tk);
    TCase *td = tcase_create("kv_dtype");
    tcase_set_timeout(td, 60);
    tcase_add_checked_fixture(td, setup_kv_f32, teardown);
    tcase_add_test(td, greedy_matches_transformers);
    suite_add_tcase(s, td);
    TCase *tz = tcase_create("kv_dtype_start");
    tcase_set_timeout(tz, 60);
    tcase_add_test(tz, kv_dtype_checked_at_start);
    suite_add_tcase(s, tz);
    return run_suite(s);
}

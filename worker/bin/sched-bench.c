/* sched-bench: drives the scheduler directly (no gateway, no sockets) with
 * synthetic requests and reports throughput and latency, to measure
 * continuous batching and the prefix cache on a backend.
 *
 *   sched-bench MODEL.gguf [-c CONC] [-r REQUESTS] [-p PROMPT] [-n GEN]
 *               [--shared-prefix N] [--chunk N] [--kv-mib N] [--temperature PERCENT]
 *               [--check] [--spec-k K] [--grammar FILE] [--backend cpu|cuda|auto]
 *               [--kv-dtype auto|f32|f16|bf16]
 *
 * CONC requests are kept in flight (a refused one is retried after the next
 * step); prompts are random ids, the first N of them shared by all requests
 * (one tenant), so the prefix cache can serve them.  Prints one summary.
 * On CUDA the timed run starts after the worker's start-up step
 * (mr_sched_warmup), as a served run does.  MEMRA_CUDA_BUSY=1 adds the
 * device's busy share of the wall time and the host's time a step.
 *
 * --check (greedy only): first generates every request alone with
 * mr_model_forward, then fails unless the scheduled run produced the same
 * ids: the exactness rule (batchmates, chunking and prefix hits change
 * nothing) on whatever backend runs it.
 *
 * --spec-k K: MTP speculation with K drafts a step for a greedy request
 * while it runs alone (mr_sched_opts.spec_k; -c 1 keeps every request alone);
 * the summary then gives the draft acceptance.
 *
 * --grammar FILE: every request's output follows the GBNF grammar in FILE
 * (constrained decoding, worker/constrain.h; the vocabulary from the
 * model's tokenizer): the cost of the masks beside the same run without. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/file.h"
#include "common/tokenizer.h"
#include "worker/cli.h"
#include "worker/constrain.h"
#include "worker/sample.h"
#include "worker/sched.h"
#ifdef MR_HAVE_CUDA
#include "kernels/cuda/cu_bench.h"
#endif

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    double submitted, first, last, done;
    int n_tok;
    int32_t *ids; /* --check: what the scheduler generated */
} rq;

typedef struct {
    rq *r;
    double *itl;  /* inter-token gaps */
    size_t n_itl, cap_itl;
    long out_tokens;
    int finished, errors;
} bench;

static void on_event(void *user, const mr_sched_event *ev)
{
    bench *b = user;
    rq *q = &b->r[ev->id];
    double t = now_s();
    if (ev->type == MR_EV_TOKEN) {
        if (q->n_tok == 0)
            q->first = t;
        else if (b->n_itl < b->cap_itl)
            b->itl[b->n_itl++] = t - q->last;
        q->last = t;
        if (q->ids)
            q->ids[q->n_tok] = ev->token;
        q->n_tok++;
        b->out_tokens++;
    } else {
        q->done = t;
        b->finished++;
        if (ev->reason == MR_SCHED_FIN_ERROR) {
            b->errors++;
            fprintf(stderr, "sched-bench: request %llu failed: %s\n", (unsigned long long)ev->id,
                    ev->error ? ev->error : "?");
        }
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* Prompt of request `idx`: the shared head, then ids unique to it. */
static void make_prompt(int32_t *prompt, int n_prompt, int shared, int idx, int V)
{
    uint32_t seed = 12345;
    for (int i = 0; i < shared; i++) {
        seed = seed * 1664525u + 1013904223u;
        prompt[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    }
    for (int i = shared; i < n_prompt; i++) {
        uint32_t x = (uint32_t)idx * 2654435761u + (uint32_t)i * 40503u + 7u;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        prompt[i] = (int32_t)((x ^ (x >> 15)) % (uint32_t)V);
    }
}

/* Greedy ids of one request alone (no scheduler); 0 or -1. */
static int solo(mr_model *m, const int32_t *prompt, int n_prompt, int n_gen, int32_t *out, mr_err *err)
{
    int V = mr_model_hparams(m)->n_vocab;
    mr_seq *s;
    float *lg = malloc(sizeof(float) * (size_t)V);
    if (!lg || mr_seq_new(m, &s, err)) {
        free(lg);
        return lg ? -1 : mr_errf(err, "out of memory");
    }
    int rc = mr_model_forward(m, s, prompt, n_prompt, MR_LOGITS_LAST, lg, err);
    for (int i = 0; !rc && i < n_gen; i++) {
        out[i] = mr_sample_argmax(lg, V);
        if (i + 1 < n_gen)
            rc = mr_model_forward_gen(m, s, &out[i], 1, MR_LOGITS_LAST, lg, err);
    }
    mr_seq_free(s);
    free(lg);
    return rc;
}

static int arg_int(const char *name, const char *v, int lo, int hi)
{
    int x;
    if (mr_cli_parse_int(v, lo, hi, &x)) {
        fprintf(stderr, "sched-bench: %s: expected an integer in [%d, %d], got '%s'\n", name, lo, hi,
                v ? v : "");
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *backend = "auto";
    int conc = 16, n_req = -1, n_prompt = 512, n_gen = 128, shared = 0, chunk = 512, kv_mib = 0;
    float temperature = 0.0f;
    int check = 0, spec_k = 0;
    const char *grammar_file = NULL;
    mr_kv_dtype kv_dtype = MR_KV_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: sched-bench MODEL.gguf [-c CONC] [-r REQUESTS] [-p PROMPT] [-n GEN] "
                   "[--shared-prefix N] [--chunk N] [--kv-mib N] [--temperature PERCENT] [--check] [--spec-k K] "
                   "[--grammar FILE] [--backend B] [--kv-dtype auto|f32|f16|bf16]\n");
            return 0;
        } else if (!strcmp(a, "-c"))
            conc = arg_int(a, v, 1, 4096), i++;
        else if (!strcmp(a, "-r"))
            n_req = arg_int(a, v, 1, 1 << 20), i++;
        else if (!strcmp(a, "-p"))
            n_prompt = arg_int(a, v, 1, 1 << 20), i++;
        else if (!strcmp(a, "-n"))
            n_gen = arg_int(a, v, 1, 1 << 20), i++;
        else if (!strcmp(a, "--shared-prefix"))
            shared = arg_int(a, v, 0, 1 << 20), i++;
        else if (!strcmp(a, "--chunk"))
            chunk = arg_int(a, v, 1, 1 << 20), i++;
        else if (!strcmp(a, "--kv-mib"))
            kv_mib = arg_int(a, v, 1, 1 << 30), i++;
        else if (!strcmp(a, "--check"))
            check = 1;
        else if (!strcmp(a, "--spec-k"))
            spec_k = arg_int(a, v, 0, 8), i++;
        else if (!strcmp(a, "--grammar") && v)
            grammar_file = v, i++;
        else if (!strcmp(a, "--temperature"))
            temperature = (float)arg_int(a, v, 0, 100) / 100.0f, i++;
        else if (!strcmp(a, "--backend")) {
            if (!v) {
                fprintf(stderr, "sched-bench: --backend needs a value\n");
                return 2;
            }
            backend = v, i++;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (mr_cli_parse_kv_dtype(v, &kv_dtype)) {
                fprintf(stderr, "sched-bench: --kv-dtype: expected auto, f32, f16 or bf16\n");
                return 2;
            }
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "sched-bench: unknown option '%s' (see --help)\n", a);
            return 2;
        } else
            path = a;
    }
    if (!path) {
        fprintf(stderr, "sched-bench: a model path is required (see --help)\n");
        return 2;
    }
    if (n_req < 0)
        n_req = conc;
    if (shared > n_prompt - 1)
        shared = n_prompt - 1;
    if (check && temperature > 0.0f) {
        fprintf(stderr, "sched-bench: --check compares greedy ids (no --temperature)\n");
        return 2;
    }

    mr_err err;
    mr_backend *be;
    mr_model *m;
    mr_model_opts mo = {.n_ctx = n_prompt + n_gen, .n_seqs = conc, .kv_bytes = (size_t)kv_mib << 20, .kv_dtype = kv_dtype};
    double t0 = now_s();
    if (mr_cli_load(path, backend, &mo, &be, &m, &err)) {
        fprintf(stderr, "sched-bench: %s\n", err.msg);
        return 1;
    }
    double t_load = now_s() - t0;
    int V = mr_model_hparams(m)->n_vocab;

    bench b = {0};
    b.r = calloc((size_t)n_req, sizeof *b.r);
    b.cap_itl = (size_t)n_req * (size_t)n_gen;
    b.itl = malloc(sizeof(double) * (b.cap_itl ? b.cap_itl : 1));
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    char *grammar = NULL;
    mr_constrain_vocab *vocab = NULL;
    if (grammar_file) {
        size_t glen;
        mr_tokenizer *tok = NULL;
        if (!(grammar = mr_file_read(grammar_file, &glen, &err)) || mr_tok_load_file(path, &tok, &err) ||
            mr_constrain_vocab_new(tok, &vocab, &err)) {
            fprintf(stderr, "sched-bench: --grammar: %s\n", err.msg);
            return 1;
        }
        mr_tok_free(tok);
    }
    if (check && grammar) {
        fprintf(stderr, "sched-bench: --check compares free greedy ids (no --grammar)\n");
        return 2;
    }
    mr_sched_opts so = {.max_seqs = conc, .chunk_tokens = chunk, .spec_k = spec_k, .vocab = vocab};
    mr_sched *s;
    if (!b.r || !b.itl || !prompt || mr_sched_new(m, &so, on_event, &b, &s, &err)) {
        fprintf(stderr, "sched-bench: %s\n", b.r && b.itl && prompt ? err.msg : "out of memory");
        return 1;
    }
    /* the worker's start-up step (server_model.c): the first use of each
     * kernel and the step's buffers are not the run's */
    double t_warm = now_s();
    if (!strcmp(be->name, "cuda") && mr_sched_warmup(s, &err)) {
        fprintf(stderr, "sched-bench: warm-up: %s\n", err.msg);
        return 1;
    }
    t_warm = now_s() - t_warm;
    int32_t *want = NULL;
    if (check) {
        want = malloc(sizeof(int32_t) * (size_t)n_req * (size_t)n_gen);
        for (int i = 0; want && i < n_req; i++) {
            b.r[i].ids = malloc(sizeof(int32_t) * (size_t)n_gen);
            make_prompt(prompt, n_prompt, shared, i, V);
            if (!b.r[i].ids || solo(m, prompt, n_prompt, n_gen, want + (size_t)i * (size_t)n_gen, &err)) {
                fprintf(stderr, "sched-bench: solo run %d: %s\n", i, b.r[i].ids ? err.msg : "out of memory");
                return 1;
            }
        }
        if (!want) {
            fprintf(stderr, "sched-bench: out of memory\n");
            return 1;
        }
    }

    int next = 0, refused = 0, rc = 0;
#ifdef MR_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) { /* the solo runs' and the load's flushes are not the run's */
        mr_cu_busy_stats bs;
        mr_cu_busy(be, 1, &bs);
    }
#endif
    double start = now_s();
    while (b.finished < n_req) {
        while (next < n_req) {
            make_prompt(prompt, n_prompt, shared, next, V);
            mr_request r = {.id = (uint64_t)next, .prompt = prompt, .n_prompt = n_prompt, .max_tokens = n_gen,
                            .sampling = {.temperature = temperature, .seed = (uint64_t)next},
                            .tenant = "bench", .grammar = grammar};
            b.r[next].submitted = now_s();
            int st = mr_sched_submit(s, &r, &err);
            if (st == MR_SCHED_NO_CAPACITY) {
                refused++;
                break;
            }
            if (st != MR_SCHED_OK) {
                fprintf(stderr, "sched-bench: %s\n", err.msg);
                return 1;
            }
            next++;
        }
        if (mr_sched_step(s, &err) < 0) {
            fprintf(stderr, "sched-bench: step: %s\n", err.msg);
            rc = 1;
        }
    }
    double wall = now_s() - start;

    double *ttft = malloc(sizeof(double) * (size_t)n_req), *lat = malloc(sizeof(double) * (size_t)n_req);
    for (int i = 0; i < n_req; i++) {
        ttft[i] = b.r[i].n_tok ? b.r[i].first - b.r[i].submitted : 0.0;
        lat[i] = b.r[i].done - b.r[i].submitted;
    }
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    printf("backend %s, load %.2f s, warm-up %.2f s, %d requests, concurrency %d, prompt %d (shared %d), gen %d, "
           "chunk %d\n", be->name, t_load, t_warm, n_req, conc, n_prompt, shared, n_gen, chunk);
    printf("wall %.3f s: %.1f output tok/s, %.2f req/s, %llu steps (%.1f tokens/step)\n", wall,
           (double)b.out_tokens / wall, (double)n_req / wall, (unsigned long long)st.steps,
           st.steps ? (double)st.step_tokens_total / (double)st.steps : 0.0);
    printf("latency p50 %.3f s p99 %.3f s; TTFT p50 %.3f s p99 %.3f s; inter-token p50 %.2f ms p99 %.2f ms\n",
           pct(lat, (size_t)n_req, 0.5), pct(lat, (size_t)n_req, 0.99), pct(ttft, (size_t)n_req, 0.5),
           pct(ttft, (size_t)n_req, 0.99), 1e3 * pct(b.itl, b.n_itl, 0.5), 1e3 * pct(b.itl, b.n_itl, 0.99));
    printf("prefix cache: %llu of %llu prompt tokens hit (%.1f%%), %d blocks held, %llu evictions; "
           "KV pool %d blocks of %d tokens; %d submissions deferred (no capacity); %d errors\n",
           (unsigned long long)st.prefix.hit_tokens, (unsigned long long)st.prefix.prompt_tokens,
           st.prefix.prompt_tokens ? 100.0 * (double)st.prefix.hit_tokens / (double)st.prefix.prompt_tokens : 0.0,
           st.prefix.n_blocks, (unsigned long long)st.prefix.evictions, st.kv_blocks, st.block_tokens, refused,
           b.errors);
#ifdef MR_HAVE_CUDA
    if (!strcmp(be->name, "cuda")) {
        /* a step not replayed from a graph is launched op by op */
        long caps, reps;
        mr_cu_autograph_stats(be, &caps, &reps);
        printf("automatic CUDA graphs: %ld captured, %ld replays of %llu steps\n", caps, reps,
               (unsigned long long)st.steps);
        mr_cu_busy_stats bs;
        if (mr_cu_busy(be, 0, &bs) && bs.flushes > 0) {
            const double steps = st.steps ? (double)st.steps : 1.0;
            printf("device busy (MEMRA_CUDA_BUSY): %.1f of %.1f ms of wall (%.1f%%) in %ld flushes; %.1f us of "
                   "wall a step outside them; host a step: %.1f us recording ops, %.1f us flushing them\n",
                   bs.device_ms, 1e3 * wall, 100.0 * bs.device_ms / (1e3 * wall), bs.flushes,
                   (1e3 * wall - bs.device_ms) * 1e3 / steps, bs.record_ms * 1e3 / steps, bs.flush_ms * 1e3 / steps);
        }
    }
#endif
    if (spec_k > 0)
        printf("speculation (k %d): %llu steps, %llu of %llu drafts accepted (%.1f%%), %llu replays\n", spec_k,
               (unsigned long long)st.spec_steps, (unsigned long long)st.spec_accepted,
               (unsigned long long)st.spec_drafted,
               st.spec_drafted ? 100.0 * (double)st.spec_accepted / (double)st.spec_drafted : 0.0,
               (unsigned long long)st.spec_replays);
    if (check) {
        int bad = 0;
        for (int i = 0; i < n_req; i++) {
            const int32_t *w = want + (size_t)i * (size_t)n_gen;
            int same = b.r[i].n_tok == n_gen && !memcmp(b.r[i].ids, w, sizeof(int32_t) * (size_t)n_gen);
            if (!same && bad++ < 5) {
                int at = 0;
                while (at < b.r[i].n_tok && at < n_gen && b.r[i].ids[at] == w[at])
                    at++;
                fprintf(stderr, "sched-bench: request %d differs from its solo run at token %d of %d\n", i, at,
                        b.r[i].n_tok);
            }
        }
        printf("check: %d of %d requests identical to their solo runs\n", n_req - bad, n_req);
        rc |= bad != 0;
        for (int i = 0; i < n_req; i++)
            free(b.r[i].ids);
        free(want);
    }
    free(ttft);
    free(lat);
    free(prompt);
    free(b.itl);
    free(b.r);
    mr_sched_free(s);
    mr_constrain_vocab_free(vocab);
    free(grammar);
    mr_model_free(m);
    mr_backend_destroy(be);
    return rc || b.errors ? 1 : 0;
}

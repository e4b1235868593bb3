/* bench-model: prompt and decode throughput of a GGUF model on a backend.
 *
 *   bench-model MODEL.gguf [--backend cuda|cpu|auto] [--runs N] [--pp 512] [--tg 128]
 *               [--tg-pick device|host] [--depth D [--depth-fill prompt|skip]] [--spec-k LIST]
 *               [--accept LIST] [--kv-dtype auto|f32|f16|bf16]
 *
 * pp: one prompt of --pp random tokens into an empty sequence (logits of the
 * last token only).  tg: --tg tokens decoded one at a time from an empty
 * sequence, greedy: by default picked by the backend in the step, one id
 * downloaded (MR_LOGITS_ARGMAX, as the scheduler serves a greedy request);
 * --tg-pick host downloads each token's row of logits and picks on the host
 * (as run-gen does), which adds the row's copy and a scan of the vocabulary
 * to every token; with --depth D the sequence first takes a D-token prompt (512 tokens a
 * call, not timed), so tg measures decode at that depth; --depth-fill skip
 * only grows the sequence to D positions instead (mr_seq_skip: their K/V
 * are the fresh cache's zeros), which times the same decode steps without
 * the minutes a prompt of 262,144 tokens takes.
 * Each is run --runs times (fresh sequence each time); prints every run and
 * the median.
 *
 * --spec-k LIST (models with an MTP block, depth 0; e.g. 1,2,3,4): tg again
 * with MTP self-speculation, K drafts a step for each K of the list
 * (worker/spec.c), the same first token and the same count of output
 * tokens, once for each entry of --accept
 * (default "mtp,0,50,80,100"): "mtp" keeps the MTP block's own drafts; a
 * percentage P replaces each draft after the block made it with the plain
 * run's token at that position with probability P (else with another id),
 * so that the speed at an assumed acceptance rate is measured rather than
 * computed (random weights make the block's own drafts meaningless).  The
 * block, the verify passes and the replays run as in serving; only the
 * draft ids are planted.  Also says whether the output equals the plain
 * run's, token for token (it must: greedy exactness).  With CUDA it also measures device copy bandwidth and prints
 * the decode roofline: copy bandwidth / weight bytes read per token (expert
 * tensors counted at n_expert_used / n_expert, the embedding table at one row). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "kernels/ops.h"
#include "worker/cli.h"
#include "worker/model.h"
#include "worker/spec.h"
#ifdef MR_HAVE_CUDA
#include "kernels/cuda/cu_bench.h"
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Weight bytes one decode step reads. */
/* Planted drafts for --accept: the plain run's tokens with probability
 * pct / 100 each, another id otherwise (an LCG, fixed seed: every run the
 * same pattern). */
typedef struct {
    const int32_t *ref;
    int n_ref, n_vocab, pct;
    uint64_t rng;
} oracle;

static void oracle_replace(void *ctx, int first, int k, int32_t *draft)
{
    oracle *o = ctx;
    for (int j = 0; j < k; j++) {
        const int i = first + j;
        if (i >= o->n_ref)
            break;
        o->rng = o->rng * 6364136223846793005ull + 1442695040888963407ull;
        const int hit = (int)((o->rng >> 33) % 100) < o->pct;
        draft[j] = hit ? o->ref[i] : (o->ref[i] + 1) % o->n_vocab;
    }
}

static double bytes_per_token(const char *path, const mr_hparams *hp, mr_err *err)
{
    mr_gguf *g;
    if (mr_gguf_open(path, &g, err))
        return -1;
    double sum = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const mr_gguf_tensor *t = &g->tensors[i];
        double b = (double)t->nbytes;
        if (!strcmp(t->name, "token_embd.weight"))
            b /= (double)t->ne[1];
        else if (strstr(t->name, "_exps") && hp->n_expert > 0)
            b *= (double)hp->n_expert_used / hp->n_expert;
        sum += b;
    }
    mr_gguf_close(g);
    return sum;
}

/* Plain greedy generation of n tokens after the one-token prompt [first]
 * in the rows' kinds speculation uses: the prompt row as a prompt, then
 * generated rows (the timed tg loop runs its first token as a generated
 * row, whose bits may differ). */
static int plain_greedy(mr_model *m, int32_t first, int n, int32_t *out, mr_err *err)
{
    const int V = mr_model_hparams(m)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    mr_seq *s = NULL;
    int rc = -1;
    if (!logits) {
        mr_errf(err, "out of memory");
        goto done;
    }
    if (mr_seq_new(m, &s, err) || mr_model_forward(m, s, &first, 1, MR_LOGITS_LAST, logits, err))
        goto done;
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int v = 1; v < V; v++) if (logits[v] > logits[best]) best = v;
        out[i] = best;
        if (i + 1 < n && mr_model_forward_gen(m, s, &out[i], 1, MR_LOGITS_LAST, logits, err))
            goto done;
    }
    rc = 0;
done:
    mr_seq_free(s);
    free(logits);
    return rc;
}

/* --spec-k: the tg shape again with speculation, once per --accept entry
 * (first: the plain run's first input token; mt: its median seconds). */
static int spec_bench_k(mr_model *m, int32_t first, int tg, int k, const char *accept, int runs, double mt,
                        mr_err *err)
{
    if (!mr_spec_supported(m))
        return mr_errf(err, "the model has no MTP block");
    int32_t *out = malloc(sizeof(int32_t) * (size_t)tg), *plain = malloc(sizeof(int32_t) * (size_t)tg);
    double *t = calloc((size_t)runs, sizeof *t);
    char *list = strdup(accept);
    int rc = -1;
    if (!out || !plain || !t || !list) {
        mr_errf(err, "out of memory");
        goto done;
    }
    if (plain_greedy(m, first, tg, plain, err))
        goto done;
    for (char *save = NULL, *e = strtok_r(list, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        const int own = !strcmp(e, "mtp");
        char *end;
        const long pct = own ? 0 : strtol(e, &end, 10);
        if (!own && (end == e || *end || pct < 0 || pct > 100)) {
            mr_errf(err, "--accept: expected mtp or a percentage 0..100, got '%s'", e);
            goto done;
        }
        oracle o = {plain, tg, mr_model_hparams(m)->n_vocab, (int)pct, 0};
        const mr_spec_drafter d = {oracle_replace, &o};
        mr_spec_stats st = {0};
        int same = 1;
        for (int r = 0; r < runs; r++) {
            o.rng = 42;
            const double a = now();
            if (mr_spec_generate(m, &first, 1, tg, k, own ? NULL : &d, out, &st, err))
                goto done;
            t[r] = now() - a;
            same &= !memcmp(out, plain, sizeof(int32_t) * (size_t)tg);
        }
        const double med = median(t, runs);
        printf("spec k=%d drafts %-4s: tg%d %.1f tok/s (plain %.1f: %.2fx); %d drafted, %d accepted (%.1f%%), "
               "%d verify passes, %d replays, %.2f tokens a pass; output %s the plain run's\n",
               k, e, tg, tg / med, tg / mt, mt / med, st.drafted, st.accepted,
               st.drafted ? 100.0 * st.accepted / st.drafted : 0.0, st.verifies, st.replays,
               st.verifies ? (double)(tg - 1) / st.verifies : 0.0, same ? "equals" : "DIFFERS FROM");
        fflush(stdout);
    }
    rc = 0;
done:
    free(out);
    free(plain);
    free(t);
    free(list);
    return rc;
}

static int spec_bench(mr_model *m, int32_t first, int tg, const char *ks, const char *accept, int runs,
                      double mt, mr_err *err)
{
    char *list = strdup(ks);
    if (!list)
        return mr_errf(err, "out of memory");
    int rc = 0;
    for (char *save = NULL, *e = strtok_r(list, ",", &save); e && !rc; e = strtok_r(NULL, ",", &save)) {
        char *end;
        const long k = strtol(e, &end, 10);
        if (end == e || *end || k < 1 || k > 8)
            rc = mr_errf(err, "--spec-k: expected drafts 1..8, got '%s'", e);
        else
            rc = spec_bench_k(m, first, tg, (int)k, accept, runs, mt, err);
    }
    free(list);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *backend = "auto";
    int runs = 3, pp = 512, tg = 128, depth = 0;
    const char *accept = "mtp,0,50,80,100", *spec_ks = NULL;
    mr_kv_dtype kv_dtype = MR_KV_AUTO;
    bool skip_fill = false, pick_host = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pp") && i + 1 < argc) pp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tg") && i + 1 < argc) tg = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--spec-k") && i + 1 < argc) spec_ks = argv[++i];
        else if (!strcmp(argv[i], "--accept") && i + 1 < argc) accept = argv[++i];
        else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc && !mr_cli_parse_kv_dtype(argv[i + 1], &kv_dtype)) i++;
        else if (!strcmp(argv[i], "--tg-pick") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "device") || !strcmp(argv[i + 1], "host")))
            pick_host = !strcmp(argv[++i], "host");
        else if (!strcmp(argv[i], "--depth-fill") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "prompt") || !strcmp(argv[i + 1], "skip")))
            skip_fill = !strcmp(argv[++i], "skip");
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "usage: bench-model MODEL.gguf [--backend B] [--runs N] [--pp N] [--tg N] "
                    "[--tg-pick device|host] [--depth D] [--depth-fill prompt|skip] [--spec-k K] [--accept LIST] "
                    "[--kv-dtype auto|f32|f16|bf16]\n");
            return 2;
        }
    }
    if (!path || runs < 1 || runs > 50 || pp < 0 || tg < 0 || depth < 0 || depth > (1 << 22) ||
        (spec_ks && (depth || tg < 2))) {
        fprintf(stderr, "usage: bench-model MODEL.gguf [--backend B] [--runs N] [--pp N] [--tg N] [--depth D] "
                "[--spec-k LIST (of 1..8; depth 0, tg >= 2)] [--accept LIST] [--kv-dtype auto|f32|f16|bf16]\n");
        return 2;
    }
    mr_err err = {{0}};
    mr_backend *be = mr_backend_create(backend, &err);
    if (!be) {
        fprintf(stderr, "bench-model: %s\n", err.msg);
        return 1;
    }
    mr_model *m = NULL;
    int ctx = (pp > depth + tg ? pp : depth + tg) + 16;
    mr_model_opts opts = {.n_ctx = ctx, .n_seqs = 1, .kv_dtype = kv_dtype};
    double t0 = now();
    if (mr_model_load(path, be, &opts, &m, &err)) {
        fprintf(stderr, "bench-model: %s\n", err.msg);
        return 1;
    }
    const mr_hparams *hp = mr_model_hparams(m);
    double load_s = now() - t0;
    double bpt = bytes_per_token(path, hp, &err);
    printf("model %s (%s, %d layers, n_embd %d, vocab %d%s), backend %s, load %.1f s\n", path,
           hp->arch_name, hp->n_layers, hp->n_embd, hp->n_vocab, hp->n_expert ? ", MoE" : "",
           be->name, load_s);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    int nt = pp > 8 ? pp : 8; /* the warm-up uses up to 8 */
    if (depth > nt)
        nt = depth;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)nt);
    uint64_t r = 12345;
    for (int i = 0; i < nt; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((r >> 33) % (uint64_t)hp->n_vocab);
    }
    double *tp = calloc((size_t)runs, sizeof *tp), *tt = calloc((size_t)runs, sizeof *tt);
    int status = 0;
    /* warm-up: the measured prompt length (or 8 tokens) and a few decode
     * steps, so that module loading, the first call of every kernel and the
     * scratch sizing fall outside the runs (and outside an op profile) */
    {
        mr_seq *s;
        int wp = pp > 8 ? pp : 8;
        if (mr_seq_new(m, &s, &err) || mr_model_forward(m, s, toks, wp, MR_LOGITS_LAST, logits, &err)) {
            fprintf(stderr, "bench-model: warm-up: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < 3 && tg > 0; i++) {
            int32_t id = toks[i];
            if (mr_model_forward_gen(m, s, &id, 1, MR_LOGITS_LAST, logits, &err)) {
                fprintf(stderr, "bench-model: warm-up: %s\n", err.msg);
                return 1;
            }
        }
        mr_seq_free(s);
    }
#ifdef MR_HAVE_CUDA
    if (!strcmp(be->name, "cuda"))
        mr_cu_profile_reset(be);
#endif
    for (int k = 0; k < runs && !status; k++) {
        mr_seq *s;
        if (pp > 0) {
            if (mr_seq_new(m, &s, &err)) { status = 1; break; }
            double a = now();
            if (mr_model_forward(m, s, toks, pp, MR_LOGITS_LAST, logits, &err)) { status = 1; mr_seq_free(s); break; }
            tp[k] = now() - a;
            mr_seq_free(s);
        }
        if (tg > 0) {
            if (mr_seq_new(m, &s, &err)) { status = 1; break; }
            if (skip_fill)
                status = mr_seq_skip(s, depth, &err) != 0;
            for (int d = 0; d < depth && !status && !skip_fill; d += 512)
                status = mr_model_forward(m, s, toks + d, depth - d < 512 ? depth - d : 512, MR_LOGITS_LAST,
                                          logits, &err) != 0;
            if (status) { mr_seq_free(s); break; }
            int32_t next = toks[0] % hp->n_vocab;
            double a = now();
            for (int i = 0; i < tg; i++) {
                if (!pick_host) {
                    int32_t id = next;
                    mr_batch_item it = {.seq = s, .tokens = &id, .n = 1, .mode = MR_LOGITS_ARGMAX,
                                        .argmax = &next, .gen = true};
                    if (mr_model_forward_batch(m, &it, 1, &err)) { status = 1; break; }
                    continue;
                }
                if (mr_model_forward_gen(m, s, &next, 1, MR_LOGITS_LAST, logits, &err)) { status = 1; break; }
                int best = 0;
                for (int v = 1; v < hp->n_vocab; v++) if (logits[v] > logits[best]) best = v;
                next = best;
            }
            tt[k] = now() - a;
            mr_seq_free(s);
        }
        printf("run %d: pp%d %.1f tok/s, tg%d%s%s %.1f tok/s\n", k + 1, pp, pp ? pp / tp[k] : 0.0, tg,
               !depth ? "" : skip_fill ? " (at depth, positions skipped, K/V not computed)" : " (at depth)",
               pick_host ? " (logits to the host)" : "", tg ? tg / tt[k] : 0.0);
        fflush(stdout);
    }
    if (status) {
        fprintf(stderr, "bench-model: %s\n", err.msg);
        return 1;
    }
    double mp = pp ? median(tp, runs) : 0, mt = tg ? median(tt, runs) : 0;
    printf("median of %d: pp%d %.1f tok/s, tg%d %.1f tok/s (%.3f ms/token) at depth %d\n", runs, pp,
           pp ? pp / mp : 0.0, tg, tg ? tg / mt : 0.0, tg ? mt / tg * 1e3 : 0.0, depth);
    if (spec_ks && !status && spec_bench(m, toks[0] % hp->n_vocab, tg, spec_ks, accept, runs, mt, &err)) {
        fprintf(stderr, "bench-model: speculation: %s\n", err.msg);
        return 1;
    }
#ifdef MR_HAVE_CUDA
    if (!strcmp(be->name, "cuda") && bpt > 0) {
        double bw = mr_cuda_copy_bandwidth((size_t)2 << 30, 10) * 1e9;
        double roof = bw / bpt;
        printf("weights read per token %.3f GB; copy bandwidth %.0f GB/s; decode roofline %.0f tok/s; "
               "tg reached %.1f%% of it\n", bpt / 1e9, bw / 1e9, roof, tg ? 100.0 * (tg / mt) / roof : 0.0);
        long caps, reps;
        mr_cu_autograph_stats(be, &caps, &reps);
        printf("automatic CUDA graphs: %ld captured, %ld replays\n", caps, reps);
    }
#else
    (void)bpt;
#endif
    free(tp); free(tt); free(logits); free(toks);
    mr_model_free(m);
    mr_backend_destroy(be);
    return 0;
}

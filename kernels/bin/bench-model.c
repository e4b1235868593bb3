/* bench-model: prompt and decode throughput of a GGUF model on a backend.
 *
 *   bench-model MODEL.gguf [--backend cuda|cpu|auto] [--runs N] [--pp 512] [--tg 128]
 *               [--depth D]
 *
 * pp: one prompt of --pp random tokens into an empty sequence (logits of the
 * last token only).  tg: --tg tokens decoded one at a time from an empty
 * sequence, greedy on the host from the downloaded logits (as run-gen does);
 * with --depth D the sequence first takes a D-token prompt (512 tokens a
 * call, not timed), so tg measures decode at that depth.
 * Each is run --runs times (fresh sequence each time); prints every run and
 * the median.  With CUDA it also measures device copy bandwidth and prints
 * the decode roofline: copy bandwidth / weight bytes read per token (expert
 * tensors counted at n_expert_used / n_expert, the embedding table at one row). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "kernels/ops.h"
#include "worker/model.h"
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

int main(int argc, char **argv)
{
    const char *path = NULL, *backend = "auto";
    int runs = 3, pp = 512, tg = 128, depth = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pp") && i + 1 < argc) pp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tg") && i + 1 < argc) tg = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) depth = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "usage: bench-model MODEL.gguf [--backend B] [--runs N] [--pp N] [--tg N] [--depth D]\n");
            return 2;
        }
    }
    if (!path || runs < 1 || runs > 50 || pp < 0 || tg < 0 || depth < 0 || depth > (1 << 22)) {
        fprintf(stderr, "usage: bench-model MODEL.gguf [--backend B] [--runs N] [--pp N] [--tg N] [--depth D]\n");
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
    mr_model_opts opts = {.n_ctx = ctx, .n_seqs = 1};
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
            for (int d = 0; d < depth && !status; d += 512)
                status = mr_model_forward(m, s, toks + d, depth - d < 512 ? depth - d : 512, MR_LOGITS_LAST,
                                          logits, &err) != 0;
            if (status) { mr_seq_free(s); break; }
            int32_t next = toks[0] % hp->n_vocab;
            double a = now();
            for (int i = 0; i < tg; i++) {
                if (mr_model_forward_gen(m, s, &next, 1, MR_LOGITS_LAST, logits, &err)) { status = 1; break; }
                int best = 0;
                for (int v = 1; v < hp->n_vocab; v++) if (logits[v] > logits[best]) best = v;
                next = best;
            }
            tt[k] = now() - a;
            mr_seq_free(s);
        }
        printf("run %d: pp%d %.1f tok/s, tg%d%s %.1f tok/s\n", k + 1, pp, pp ? pp / tp[k] : 0.0, tg,
               depth ? " (at depth)" : "", tg ? tg / tt[k] : 0.0);
        fflush(stdout);
    }
    if (status) {
        fprintf(stderr, "bench-model: %s\n", err.msg);
        return 1;
    }
    double mp = pp ? median(tp, runs) : 0, mt = tg ? median(tt, runs) : 0;
    printf("median of %d: pp%d %.1f tok/s, tg%d %.1f tok/s (%.3f ms/token) at depth %d\n", runs, pp,
           pp ? pp / mp : 0.0, tg, tg ? tg / mt : 0.0, tg ? mt / tg * 1e3 : 0.0, depth);
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

/* Sampling: generator, greedy ties, penalties and the filtered distribution
 * against straightforward references written independently of sample.c. */
#include <math.h>
#include <string.h>

#include "tests/unit/testutil.h"
#include "worker/sample.h"

START_TEST(rng_uniform_inside_unit_interval_and_reproducible)
{
    mr_rng a, b, c;
    mr_rng_seed(&a, 42);
    mr_rng_seed(&b, 42);
    mr_rng_seed(&c, 43);
    int differ = 0;
    double mean = 0.0;
    const int n = 20000;
    for (int i = 0; i < n; i++) {
        double u = mr_rng_uniform(&a);
        ck_assert(u > 0.0 && u < 1.0);
        ck_assert(u == mr_rng_uniform(&b));
        differ += u != mr_rng_uniform(&c);
        mean += u;
    }
    ck_assert_int_gt(differ, n - 10);
    mean /= n;
    /* the mean of n uniforms has sd sqrt(1/12/n) ~ 2.05e-3; 5 sd */
    ck_assert_msg(fabs(mean - 0.5) < 5 * 2.05e-3, "mean %g", mean);
}
END_TEST

START_TEST(argmax_lowest_id_on_ties)
{
    float x[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 3.0f};
    ck_assert_int_eq(mr_sample_argmax(x, 6), 1);
    float y[3] = {NAN, 0.5f, 0.5f};
    ck_assert_int_eq(mr_sample_argmax(y, 3), 1);
    float z[4] = {-INFINITY, -INFINITY, -2.0f, -2.0f};
    ck_assert_int_eq(mr_sample_argmax(z, 4), 2);
}
END_TEST

/* Reference penalties: one pass over the vocabulary, counting by scanning. */
static void ref_penalize(const mr_sample_params *p, float *l, int V, const int32_t *prompt, int np,
                         const int32_t *gen, int ng)
{
    for (int v = 0; v < V; v++) {
        int in_prompt = 0, c = 0;
        for (int i = 0; i < np; i++)
            in_prompt |= prompt[i] == v;
        for (int i = 0; i < ng; i++)
            c += gen[i] == v;
        double x = l[v];
        if (p->repetition_penalty > 0 && p->repetition_penalty != 1 && (in_prompt || c > 0))
            x = x > 0 ? x / p->repetition_penalty : x * p->repetition_penalty;
        if (c > 0)
            x = x - p->presence_penalty - (double)p->frequency_penalty * c;
        l[v] = (float)x;
    }
}

START_TEST(penalties_match_reference)
{
    enum { V = 50 };
    mr_sampler *s;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &s, &err), 0);
    const int32_t prompt[] = {3, 3, 7, 11, 49, -5, 60};
    const int32_t gen[] = {7, 7, 7, 12, 3, 0, 12, 1000};
    mr_sample_params cases[] = {
        {.repetition_penalty = 1.3f},
        {.presence_penalty = 0.7f},
        {.frequency_penalty = -0.4f},
        {.repetition_penalty = 0.8f, .presence_penalty = -1.1f, .frequency_penalty = 1.9f},
    };
    mr_rng r;
    mr_rng_seed(&r, 7);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float a[V], b[V];
        for (int v = 0; v < V; v++)
            a[v] = b[v] = (float)(mr_rng_uniform(&r) * 8.0 - 4.0);
        mr_sample_penalize(s, &cases[c], a, prompt, 7, gen, 8);
        ref_penalize(&cases[c], b, V, prompt, 7, gen, 8);
        for (int v = 0; v < V; v++)
            ck_assert_msg(fabsf(a[v] - b[v]) <= 1e-6f * (1.0f + fabsf(b[v])), "case %zu id %d: %g vs %g",
                          c, v, (double)a[v], (double)b[v]);
        /* a second call with the same history gives the same result: the
         * working memory was left clean */
        float a2[V];
        for (int v = 0; v < V; v++)
            a2[v] = (float)v * 0.1f;
        float b2[V];
        memcpy(b2, a2, sizeof b2);
        mr_sample_penalize(s, &cases[c], a2, prompt, 7, gen, 8);
        ref_penalize(&cases[c], b2, V, prompt, 7, gen, 8);
        for (int v = 0; v < V; v++)
            ck_assert(fabsf(a2[v] - b2[v]) <= 1e-6f * (1.0f + fabsf(b2[v])));
    }
    mr_sampler_free(s);
}
END_TEST

/* Reference distribution: ranks by counting, O(V^2), all in double. */
static void ref_probs(const mr_sample_params *p, const float *l, int V, double *out)
{
    int rank[64];
    for (int i = 0; i < V; i++) {
        rank[i] = 0;
        for (int j = 0; j < V; j++)
            rank[i] += l[j] > l[i] || (l[j] == l[i] && j < i);
    }
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (rank[i] < k && l[i] > mx)
            mx = l[i];
    for (int i = 0; i < V; i++) {
        out[i] = rank[i] < k ? exp(((double)l[i] - mx) / p->temperature) : 0.0;
        sum += out[i];
    }
    double top = 0;
    for (int i = 0; i < V; i++) {
        out[i] /= sum;
        if (out[i] > top)
            top = out[i];
    }
    if (p->min_p > 0) {
        sum = 0;
        for (int i = 0; i < V; i++) {
            if (out[i] < p->min_p * top)
                out[i] = 0;
            sum += out[i];
        }
        for (int i = 0; i < V; i++)
            out[i] /= sum;
    }
    if (p->top_p > 0 && p->top_p < 1) {
        double keep[64];
        sum = 0;
        for (int i = 0; i < V; i++) {
            double before = 0; /* mass of the tokens ranked ahead of i */
            for (int j = 0; j < V; j++)
                if (out[j] > 0 && rank[j] < rank[i])
                    before += out[j];
            keep[i] = out[i] > 0 && before < p->top_p ? out[i] : 0;
            sum += keep[i];
        }
        for (int i = 0; i < V; i++)
            out[i] = keep[i] / sum;
    }
}

START_TEST(distribution_matches_reference)
{
    enum { V = 40 };
    mr_sampler *s;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &s, &err), 0);
    mr_sample_params cases[] = {
        {.temperature = 1.0f},
        {.temperature = 0.7f, .top_k = 5},
        {.temperature = 1.3f, .top_p = 0.8f},
        {.temperature = 1.0f, .min_p = 0.2f},
        {.temperature = 0.5f, .top_k = 12, .top_p = 0.9f, .min_p = 0.05f},
        {.temperature = 2.0f, .top_k = 1},
    };
    mr_rng r;
    mr_rng_seed(&r, 99);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float l[V], probs[V];
        double ref[V];
        for (int v = 0; v < V; v++)
            l[v] = (float)(mr_rng_uniform(&r) * 6.0 - 3.0);
        l[17] = l[3]; /* a tie: id 3 ranks first */
        ck_assert_int_eq(mr_sample_probs(s, &cases[c], l, probs), 0);
        ref_probs(&cases[c], l, V, ref);
        for (int v = 0; v < V; v++)
            ck_assert_msg(fabs(probs[v] - ref[v]) <= 1e-6, "case %zu id %d: %g vs %g", c, v,
                          (double)probs[v], ref[v]);
    }
    mr_sampler_free(s);
}
END_TEST

START_TEST(draws_follow_the_distribution_and_seed)
{
    enum { V = 8, N = 20000 };
    mr_sampler *s;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &s, &err), 0);
    const float base[V] = {0.5f, 1.5f, -0.3f, 1.0f, 0.0f, 2.0f, -1.0f, 0.7f};
    /* the top-k path, and the untruncated one with and without a nucleus */
    mr_sample_params cases[] = {
        {.temperature = 0.9f, .top_k = 6, .seed = 1234},
        {.temperature = 1.1f, .top_p = 0.85f, .seed = 99},
        {.temperature = 0.8f, .min_p = 0.1f, .seed = 5},
        {.temperature = 1.0f, .seed = 77},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mr_sample_params p = cases[c];
        float probs[V];
        ck_assert_int_eq(mr_sample_probs(s, &p, base, probs), 0);
        int hist[V] = {0};
        int32_t first[32];
        mr_rng r;
        mr_rng_seed(&r, p.seed);
        for (int i = 0; i < N; i++) {
            float l[V];
            memcpy(l, base, sizeof l);
            int32_t id = mr_sample(s, &p, &r, l, NULL, 0, NULL, 0);
            ck_assert(id >= 0 && id < V);
            hist[id]++;
            if (i < 32)
                first[i] = id;
        }
        for (int v = 0; v < V; v++) {
            double e = probs[v] * N, sd = sqrt(N * probs[v] * (1 - probs[v]));
            ck_assert_msg(fabs(hist[v] - e) <= 5 * sd + 1e-9, "case %zu id %d: %d draws, expected %g", c, v,
                          hist[v], e);
        }
        /* the same seed draws the same ids */
        mr_rng_seed(&r, p.seed);
        for (int i = 0; i < 32; i++) {
            float l[V];
            memcpy(l, base, sizeof l);
            ck_assert_int_eq(mr_sample(s, &p, &r, l, NULL, 0, NULL, 0), first[i]);
        }
    }
    mr_sampler_free(s);
}
END_TEST

/* A large vocabulary with a long flat tail: the nucleus and the draw only
 * sort a head of it, which must still be the head of the full order. */
START_TEST(large_vocabulary_matches_reference_head)
{
    enum { V = 5000 };
    mr_sampler *s;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &s, &err), 0);
    float *l = malloc(sizeof(float) * V), *probs = malloc(sizeof(float) * V);
    mr_rng r;
    mr_rng_seed(&r, 3);
    for (int v = 0; v < V; v++)
        l[v] = (float)(mr_rng_uniform(&r) * 4.0 - 20.0); /* tail */
    for (int v = 0; v < 30; v++)
        l[(v * 157) % V] = (float)(mr_rng_uniform(&r) * 6.0); /* head */
    mr_sample_params p = {.temperature = 1.0f, .top_p = 0.9f};
    ck_assert_int_eq(mr_sample_probs(s, &p, l, probs), 0);
    /* reference: the nucleus by rank counting over the head tokens */
    double total = 0;
    for (int v = 0; v < V; v++)
        total += exp((double)l[v] - 6.0);
    int kept = 0;
    double kept_mass = 0;
    for (int v = 0; v < V; v++) {
        double before = 0;
        for (int j = 0; j < 30; j++) {
            int id = (j * 157) % V;
            if (l[id] > l[v] || (l[id] == l[v] && id < v))
                before += exp((double)l[id] - 6.0) / total;
        }
        int in = before < 0.9 && l[v] > 0.0f; /* the tail holds < 1e-6 of the mass */
        ck_assert_msg(in == (probs[v] > 0), "id %d: kept %d, reference %d", v, probs[v] > 0, in);
        kept += in;
        kept_mass += in ? exp((double)l[v] - 6.0) : 0;
    }
    ck_assert_int_gt(kept, 1);
    for (int v = 0; v < V; v++)
        if (probs[v] > 0)
            ck_assert(fabs(probs[v] - exp((double)l[v] - 6.0) / kept_mass) <= 1e-6);
    free(l);
    free(probs);
    mr_sampler_free(s);
}
END_TEST

START_TEST(greedy_applies_penalties_first)
{
    enum { V = 5 };
    mr_sampler *s;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &s, &err), 0);
    mr_rng r;
    mr_rng_seed(&r, 1);
    float l[V] = {0.0f, 2.0f, 1.9f, 1.0f, 2.0f};
    mr_sample_params g = {0};
    ck_assert_int_eq(mr_sample(s, &g, &r, l, NULL, 0, NULL, 0), 1);
    float l2[V] = {0.0f, 2.0f, 1.9f, 1.0f, 2.0f};
    const int32_t gen[] = {1, 4};
    mr_sample_params pen = {.presence_penalty = 0.2f};
    ck_assert_int_eq(mr_sample(s, &pen, &r, l2, NULL, 0, gen, 2), 2);
    mr_sampler_free(s);
}
END_TEST

START_TEST(parameter_checks)
{
    mr_err err;
    mr_sample_params ok = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                      .presence_penalty = 0.5f, .frequency_penalty = -0.5f, .repetition_penalty = 1.1f};
    ck_assert_int_eq(mr_sampling_check(&ok, &err), 0);
    mr_sample_params bad[] = {
        {.temperature = -1.0f}, {.temperature = NAN}, {.top_k = -2}, {.top_p = 1.5f},
        {.min_p = -0.1f}, {.presence_penalty = 3.0f}, {.frequency_penalty = INFINITY},
        {.repetition_penalty = -1.0f},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_int_ne(mr_sampling_check(&bad[i], &err), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("sample");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, rng_uniform_inside_unit_interval_and_reproducible);
    tcase_add_test(tc, argmax_lowest_id_on_ties);
    tcase_add_test(tc, penalties_match_reference);
    tcase_add_test(tc, distribution_matches_reference);
    tcase_add_test(tc, draws_follow_the_distribution_and_seed);
    tcase_add_test(tc, large_vocabulary_matches_reference_head);
    tcase_add_test(tc, greedy_applies_penalties_first);
    tcase_add_test(tc, parameter_checks);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

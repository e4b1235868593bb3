/* Sampling by the backend (MR_LOGITS_SAMPLE), checked on the host: a
 * replayed uniform (mr_rng_rig) is the draw it replays; the sample op's
 * contract (kernels/ops.h: penalty tables fed a few ids a step, then
 * mr_sample's pick with the row's uniform), written here on host memory,
 * picks what mr_sample picks from the whole prompt and generated ids; and
 * the scheduler on a CPU backend given that op packs parameters, uniforms,
 * table updates and modes so that every request gets the ids of the host
 * path (seeded sampling and penalties included, in mixed prompt and decode
 * steps, with tables passed from one request to the next). */
#include <stdlib.h>
#include <string.h>

#include "tests/unit/fixture_ref.h"
#include "worker/sample.h"
#include "worker/sched.h"

/* ---- the op's contract on host memory ---- */

static mr_sampler *op_sampler;
static int op_calls, op_rows, op_skips, op_resets;

static void table_add(const mr_sample_row *q, int dim, const int32_t *add)
{
    int32_t *ent = q->table, *list = q->table + dim, *len = q->table + 2 * (size_t)dim;
    if (q->reset) {
        memset(ent, 0, sizeof(int32_t) * (size_t)dim);
        *len = 0;
        op_resets++;
    }
    for (int j = 0; j < q->n_add_prompt + q->n_add_gen; j++) {
        int32_t id = add[q->add_off + j];
        if (id < 0 || id >= dim)
            continue;
        int32_t old = ent[id];
        ent[id] = j < q->n_add_prompt ? old | 1 : old + 2;
        if (old == 0)
            list[(*len)++] = id;
    }
}

static void table_penalize(const mr_sample_row *q, int dim, float *l)
{
    const int32_t *ent = q->table, *list = q->table + dim;
    bool rep = q->repetition > 0.0f && q->repetition != 1.0f, pf = q->presence != 0.0f || q->frequency != 0.0f;
    for (int j = 0; j < q->table[2 * (size_t)dim]; j++) {
        int32_t id = list[j], cnt = ent[id] >> 1;
        if (rep)
            l[id] = l[id] > 0.0f ? l[id] / q->repetition : l[id] * q->repetition;
        if (pf && cnt > 0)
            l[id] -= q->presence + q->frequency * (float)cnt;
    }
}

static void host_sample_op(mr_backend *b, float *logits, int n, int dim, const mr_sample_row *rows,
                           const int32_t *add, int32_t *ids)
{
    op_calls++;
    for (int r = 0; r < n; r++) {
        const mr_sample_row *q = &rows[r];
        if (q->skip) {
            op_skips++;
            continue;
        }
        op_rows++;
        float *l = logits + (size_t)r * dim;
        if (q->table) {
            table_add(q, dim, add);
            table_penalize(q, dim, l);
        }
        mr_sample_params p = {.temperature = q->temperature, .top_k = q->top_k, .top_p = q->top_p,
                              .min_p = q->min_p};
        mr_rng g;
        mr_rng_rig(&g, q->u);
        ids[r] = mr_sample(op_sampler, &p, &g, l, NULL, 0, NULL, 0);
    }
}

static uint64_t xs = 0x243f6a8885a308d3ull;
static uint64_t next(void)
{
    xs ^= xs << 13;
    xs ^= xs >> 7;
    xs ^= xs << 17;
    return xs;
}

START_TEST(rig_replays_the_draw)
{
    mr_rng r, c;
    mr_rng_seed(&r, 42);
    for (int i = 0; i < 20000; i++) {
        c = r;
        double u = mr_rng_uniform(&c);
        mr_rng g;
        mr_rng_rig(&g, u);
        ck_assert(mr_rng_uniform(&g) == u);
        mr_rng_next(&r);
    }
    /* the ends of the 53-bit range, and the top half where + 0.5 rounds */
    const uint64_t ks[] = {0, 1, 2, (1ull << 52) - 1, 1ull << 52, (1ull << 52) + 1, (1ull << 53) - 2,
                           (1ull << 53) - 1};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        double u = ((double)ks[i] + 0.5) * (1.0 / 9007199254740992.0);
        if (u >= 1.0) /* the last cell: strictly inside (0, 1) all the same */
            u = 1.0 - 1.0 / 9007199254740992.0;
        ck_assert(u > 0.0 && u < 1.0);
        mr_rng g;
        mr_rng_rig(&g, u);
        c = g;
        uint64_t k = mr_rng_next(&c) >> 11; /* ks[i] or, where + 0.5 rounded, its even neighbour */
        ck_assert(k == ks[i] || k == ks[i] + 1);
        ck_assert(mr_rng_uniform(&g) == u);
    }
}
END_TEST

/* Penalty tables fed over several steps (after a reset over stale
 * contents) against mr_sample given every id at once. */
START_TEST(op_contract_matches_mr_sample)
{
    const int dims[] = {33, 1000};
    for (int d = 0; d < 2; d++) {
        const int V = dims[d];
        mr_err err;
        mr_sampler *ref;
        ck_assert_int_eq(mr_sampler_new(V, &ref, &err), 0);
        ck_assert_int_eq(mr_sampler_new(V, &op_sampler, &err), 0);
        int32_t *table = malloc(sizeof(int32_t) * mr_sample_table_ints(V));
        for (size_t i = 0; i < mr_sample_table_ints(V); i++)
            table[i] = (int32_t)(next() % 7); /* another request's leftovers */
        float *logits = malloc(sizeof(float) * V), *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
        int32_t prompt[300], gen[40], ids = -1;
        for (int c = 0; c < 60; c++) {
            mr_sample_params p = {
                .temperature = c % 5 == 0 ? 0.0f : 0.2f + (float)(next() % 100) / 50.0f,
                .top_k = c % 3 == 0 ? 0 : 1 + (int)(next() % 60),
                .top_p = c % 4 == 0 ? 1.0f : 0.5f + (float)(next() % 50) / 100.0f,
                .min_p = c % 2 ? 0.0f : (float)(next() % 20) / 100.0f,
                .presence_penalty = (float)((int)(next() % 41) - 20) / 10.0f,
                .frequency_penalty = c % 6 == 1 ? 0.0f : (float)((int)(next() % 41) - 20) / 10.0f,
                .repetition_penalty = c % 7 == 2 ? 1.0f : 0.5f + (float)(next() % 20) / 10.0f,
            };
            int np = 1 + (int)(next() % 300);
            for (int i = 0; i < np; i++)
                prompt[i] = (int32_t)(next() % (uint64_t)(V < 50 ? V : 50)); /* repeats */
            for (int i = 0; i < 40; i++)
                gen[i] = (int32_t)(next() % (uint64_t)V);
            mr_rng rng;
            mr_rng_seed(&rng, (uint64_t)c);
            bool fed = false;
            int given = 0;
            for (int step = 0; step < 40; step += 1 + (int)(next() % 8)) {
                for (int i = 0; i < V; i++)
                    logits[i] = (float)((int)(next() % 2001) - 1000) / 100.0f;
                memcpy(a, logits, sizeof(float) * V);
                memcpy(b, logits, sizeof(float) * V);
                mr_rng keep = rng;
                double u = mr_rng_uniform(&keep);
                int32_t want = mr_sample(ref, &p, &rng, a, prompt, np, gen, step);
                /* this step's row: the prompt with the first one, then the
                 * generated ids it has not had */
                int32_t add[340];
                int na = 0;
                if (!fed)
                    for (int i = 0; i < np; i++) add[na++] = prompt[i];
                int nprompt = na;
                for (int i = given; i < step; i++) add[na++] = gen[i];
                mr_sample_row row = {.u = u, .temperature = p.temperature, .top_p = p.top_p, .min_p = p.min_p,
                                     .presence = p.presence_penalty, .frequency = p.frequency_penalty,
                                     .repetition = p.repetition_penalty, .top_k = p.top_k,
                                     .reset = !fed, .n_add_prompt = nprompt, .n_add_gen = na - nprompt,
                                     .table = table};
                fed = true;
                given = step;
                host_sample_op(NULL, b, 1, V, &row, add, &ids);
                ck_assert_msg(ids == want, "V=%d case %d step %d: %d, mr_sample %d", V, c, step, ids, want);
                if (p.temperature > 0.0f)
                    ck_assert(memcmp(&keep, &rng, sizeof rng) == 0); /* one draw, the same */
            }
        }
        free(logits);
        free(a);
        free(b);
        free(table);
        mr_sampler_free(ref);
        mr_sampler_free(op_sampler);
        op_sampler = NULL;
    }
}
END_TEST

/* ---- the scheduler over a backend that samples ---- */

enum { NREQ = 6, MAXT = 24 };

typedef struct {
    int32_t toks[NREQ + 4][MAXT];
    int n[NREQ + 4];
    int with_logits[NREQ + 4]; /* TOKEN events that carried the row */
    int finished;
} sink_t;

static void on_event(void *user, const mr_sched_event *ev)
{
    sink_t *k = user;
    ck_assert_uint_lt(ev->id, NREQ + 4);
    if (ev->type == MR_EV_TOKEN) {
        ck_assert_int_lt(k->n[ev->id], MAXT);
        k->toks[ev->id][k->n[ev->id]++] = ev->token;
        k->with_logits[ev->id] += ev->logits != NULL;
    } else {
        ck_assert_int_ne(ev->reason, MR_SCHED_FIN_ERROR);
        k->finished++;
    }
}

static int V;
static int table_allocs;
static void *(*real_alloc)(mr_backend *, size_t);
static void *counting_alloc(mr_backend *b, size_t n)
{
    if (n == sizeof(int32_t) * mr_sample_table_ints(V))
        table_allocs++;
    return real_alloc(b, n);
}

static void run_all(mr_sched *s)
{
    mr_err err;
    int live, guard = 0;
    while ((live = mr_sched_step(s, &err)) > 0)
        ck_assert_int_lt(++guard, 10000);
    ck_assert_msg(live == 0, "%s", err.msg);
}

static const mr_sample_params mix[NREQ] = {
    {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .min_p = 0.01f, .presence_penalty = 0.3f,
     .frequency_penalty = 0.2f, .repetition_penalty = 1.1f, .seed = 12345},
    {.repetition_penalty = 1.3f, .presence_penalty = 0.5f},            /* greedy with penalties */
    {.temperature = 0.0f},                                             /* plain greedy */
    {.temperature = 1.0f, .seed = 7},                                  /* temperature alone */
    {.temperature = 0.8f, .top_p = 0.9f, .frequency_penalty = 1.0f, .seed = 3}, /* log-probabilities too */
    {.temperature = 0.7f, .top_p = 0.8f, .min_p = 0.05f, .seed = 99},
};

/* The mix, prompts chunked by 3 (so steps mix prompt chunks and decode
 * rows); request 4 asks for the logits rows. */
static void run_mix(sink_t *k, int32_t prompts[NREQ][12])
{
    mr_err err;
    memset(k, 0, sizeof *k);
    mr_sched_opts so = {.max_seqs = NREQ, .chunk_tokens = 3};
    mr_sched *s;
    ck_assert_msg(mr_sched_new(model, &so, on_event, k, &s, &err) == 0, "%s", err.msg);
    for (int i = 0; i < NREQ; i++) {
        mr_request r = {.id = (uint64_t)i, .prompt = prompts[i], .n_prompt = 7 + i, .max_tokens = 10 + i,
                        .sampling = mix[i], .want_logits = i == 4};
        ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
    }
    run_all(s);
    ck_assert_int_eq(k->finished, NREQ);
    mr_sched_free(s);
}

START_TEST(sched_device_sampling_matches_host)
{
    mr_model_opts mo = {.n_ctx = 64, .n_seqs = NREQ, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &op_sampler, &err), 0);
    int32_t prompts[NREQ][12];
    for (int i = 0; i < NREQ; i++)
        lcg_prompt(prompts[i], 12, 71u + (uint32_t)i, V);
    /* prompt ids repeated, so that the penalties bite */
    prompts[0][5] = prompts[0][1];
    prompts[1][3] = prompts[1][0];

    static sink_t host, dev;
    ck_assert(!mr_model_can_sample(model));
    run_mix(&host, prompts);
    be->sample = host_sample_op;
    ck_assert(mr_model_can_sample(model));
    op_calls = op_rows = op_skips = op_resets = 0;
    run_mix(&dev, prompts);
    for (int i = 0; i < NREQ; i++) {
        ck_assert_int_eq(dev.n[i], host.n[i]);
        for (int t = 0; t < host.n[i]; t++)
            ck_assert_msg(dev.toks[i][t] == host.toks[i][t], "request %d token %d: %d, host path %d", i, t,
                          dev.toks[i][t], host.toks[i][t]);
        /* only the request that asked for them gets rows back */
        ck_assert_int_eq(dev.with_logits[i], i == 4 ? dev.n[i] : 0);
    }
    /* every id but request 4's was the op's (the plain greedy one inside
     * steps that sampled others); request 4's rows were left alone */
    int ids = 0;
    for (int i = 0; i < NREQ; i++)
        if (i != 4)
            ids += dev.n[i];
    ck_assert_int_le(op_rows, ids);
    ck_assert_int_ge(op_rows, ids - dev.n[2]);
    ck_assert_int_eq(op_skips, dev.n[4]);
    ck_assert_int_eq(op_resets, 2); /* the two penalised requests the op samples */
    be->sample = NULL;
    mr_sampler_free(op_sampler);
    op_sampler = NULL;
    close_model();
}
END_TEST

/* Two slots, four penalised requests one pair after the other: the second
 * pair takes the first pair's tables (emptied first), no more are made, and
 * the ids are the host path's. */
START_TEST(sched_reuses_penalty_tables)
{
    mr_model_opts mo = {.n_ctx = 64, .n_seqs = 2, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    mr_err err;
    ck_assert_int_eq(mr_sampler_new(V, &op_sampler, &err), 0);
    int32_t prompts[4][12];
    for (int i = 0; i < 4; i++) {
        lcg_prompt(prompts[i], 12, 91u + (uint32_t)i, V);
        prompts[i][7] = prompts[i][2];
    }
    mr_sample_params sp[4] = {
        {.temperature = 0.8f, .top_k = 20, .repetition_penalty = 1.5f, .seed = 1},
        {.repetition_penalty = 2.0f, .frequency_penalty = 0.7f},
        {.temperature = 1.2f, .presence_penalty = 1.5f, .seed = 2},
        {.temperature = 0.6f, .top_p = 0.7f, .repetition_penalty = 0.8f, .seed = 3},
    };
    static sink_t out[2];
    real_alloc = be->alloc;
    be->alloc = counting_alloc;
    for (int run = 0; run < 2; run++) {
        be->sample = run ? host_sample_op : NULL;
        table_allocs = op_resets = 0;
        memset(&out[run], 0, sizeof out[run]);
        mr_sched_opts so = {.max_seqs = 2};
        mr_sched *s;
        ck_assert_msg(mr_sched_new(model, &so, on_event, &out[run], &s, &err) == 0, "%s", err.msg);
        for (int pair = 0; pair < 2; pair++) {
            for (int j = 0; j < 2; j++) {
                int i = pair * 2 + j;
                mr_request r = {.id = (uint64_t)i, .prompt = prompts[i], .n_prompt = 12, .max_tokens = 12,
                                .sampling = sp[i]};
                ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
            }
            run_all(s);
        }
        mr_sched_free(s);
        if (run) {
            ck_assert_int_eq(table_allocs, 2);
            ck_assert_int_eq(op_resets, 4);
        }
    }
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(out[1].n[i], 12);
        ck_assert_int_eq(out[0].n[i], 12);
        for (int t = 0; t < 12; t++)
            ck_assert_int_eq(out[1].toks[i][t], out[0].toks[i][t]);
    }
    be->alloc = real_alloc;
    be->sample = NULL;
    mr_sampler_free(op_sampler);
    op_sampler = NULL;
    close_model();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gsample");
    TCase *tc = tcase_create("gsample");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rig_replays_the_draw);
    tcase_add_test(tc, op_contract_matches_mr_sample);
    tcase_add_test(tc, sched_device_sampling_matches_host);
    tcase_add_test(tc, sched_reuses_penalty_tables);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

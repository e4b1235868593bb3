/* Scheduler: greedy outputs identical alone, joined mid-generation, started
 * batched, for prefill chunks 1, 7 and 64, against an independent solo loop
 * (and the transformers greedy continuation); prefix hits, tenant isolation,
 * session reuse, eviction, admission refusal and recovery, cancellation,
 * stop ids, seeded sampling independent of batchmates, batchmates that share
 * a prefix computing it once; MTP speculation of a
 * lone greedy request (hybrids) equal to plain decoding, and its fallback to
 * batching when another request arrives; the MTP block primed over a
 * prompt run in chunks, beside another prompt or after a prefix hit, with
 * the drafts of the standalone path (worker/spec.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/unit/fixture_ref.h"
#include "tests/unit/sched_sink.h"
#include "worker/sched.h"

static int V;

static void open_qwen3(const mr_model_opts *o)
{
    open_model("qwen3", "model-BF16.gguf", o);
    V = mr_model_hparams(model)->n_vocab;
}

static mr_sched *new_sched(const mr_sched_opts *o, sink_t *k)
{
    mr_err err;
    mr_sched *s;
    memset(k, 0, sizeof *k);
    ck_assert_msg(mr_sched_new(model, o, on_event, k, &s, &err) == 0, "%s", err.msg);
    cur_sched = s;
    return s;
}

static int submit(mr_sched *s, uint64_t id, const int32_t *p, int n, int max_tokens, const char *tenant,
                  const char *salt)
{
    mr_err err;
    mr_request r = {.id = id, .prompt = p, .n_prompt = n, .max_tokens = max_tokens, .tenant = tenant,
                    .cache_salt = salt};
    return mr_sched_submit(s, &r, &err);
}

static void expect_tokens(sink_t *k, uint64_t id, const int32_t *want, int n)
{
    out_t *o = find(k, id);
    ck_assert_msg(o->finished, "request %llu did not finish", (unsigned long long)id);
    ck_assert_int_eq(o->events_after_finish, 0);
    ck_assert_int_eq(o->n, n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(o->toks[i] == want[i], "request %llu token %d: %d, want %d", (unsigned long long)id, i,
                      o->toks[i], want[i]);
}

/* ---- greedy exactness ---- */

START_TEST(alone_matches_transformers_greedy)
{
    reference ref;
    ref_load("qwen3", &ref, 1);
    json_t *cont = ref_greedy(&ref);
    int np = ref.prompt_len[0], nc = (int)json_array_size(cont);
    ck_assert(np > 0 && np < 64 && nc > 0 && nc <= 24);
    int32_t prompt[64], want[24];
    memcpy(prompt, ref.prompt[0], sizeof(int32_t) * (size_t)np);
    for (int i = 0; i < nc; i++)
        want[i] = (int32_t)json_integer_value(json_array_get(cont, (size_t)i));
    ref_free(&ref);

    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 2, .block_tokens = 4};
    open_qwen3(&mo);
    static const int chunks[] = {3, 64};
    for (int c = 0; c < 2; c++) {
        sink_t k;
        mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = chunks[c]};
        mr_sched *s = new_sched(&so, &k);
        ck_assert_int_eq(submit(s, 1, prompt, np, nc, "t", NULL), MR_SCHED_OK);
        run_all(s);
        expect_tokens(&k, 1, want, nc);
        ck_assert_int_eq(find(&k, 1)->reason, MR_SCHED_FIN_LENGTH);
        ck_assert_int_eq(find(&k, 1)->usage.prompt_tokens, np);
        ck_assert_int_eq(find(&k, 1)->usage.completion_tokens, nc);
        mr_sched_free(s);
    }
    close_model();
}
END_TEST

enum { NREQ = 6, GEN = 8 };
static const int plen[NREQ] = {9, 24, 3, 15, 12, 20};

START_TEST(batched_joined_and_chunked_match_solo)
{
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 8, .block_tokens = 8};
    open_qwen3(&mo);
    int32_t prompt[NREQ][80], want[NREQ][GEN];
    for (int r = 0; r < NREQ; r++) {
        lcg_prompt(prompt[r], plen[r], 100u + (uint32_t)r, V);
        greedy_decode(prompt[r], plen[r], GEN, want[r]);
    }
    static const int chunks[] = {1, 7, 64};
    for (int c = 0; c < 3; c++) {
        /* the prefix cache is off so that every run computes everything */
        mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = chunks[c], .prefix_blocks = -1};
        sink_t k;

        /* started batched: four at once */
        mr_sched *s = new_sched(&so, &k);
        for (int r = 0; r < 4; r++)
            ck_assert_int_eq(submit(s, (uint64_t)r, prompt[r], plen[r], GEN, "t", NULL), MR_SCHED_OK);
        run_all(s);
        for (int r = 0; r < 4; r++)
            expect_tokens(&k, (uint64_t)r, want[r], GEN);
        mr_sched_free(s);

        /* joining a full batch mid-generation: a slot frees when request 2
         * (short max_tokens) ends, and 4 and 5 join while the rest decode */
        s = new_sched(&so, &k);
        ck_assert_int_eq(submit(s, 0, prompt[0], plen[0], GEN, "t", NULL), MR_SCHED_OK);
        ck_assert_int_eq(submit(s, 1, prompt[1], plen[1], GEN, "t", NULL), MR_SCHED_OK);
        ck_assert_int_eq(submit(s, 2, prompt[2], plen[2], 3, "t", NULL), MR_SCHED_OK);
        ck_assert_int_eq(submit(s, 3, prompt[3], plen[3], GEN, "t", NULL), MR_SCHED_OK);
        ck_assert_int_eq(submit(s, 4, prompt[4], plen[4], GEN, "t", NULL), MR_SCHED_NO_CAPACITY);
        mr_err err;
        int joined4 = 0, joined5 = 0, guard = 0;
        int live;
        while ((live = mr_sched_step(s, &err)) > 0 || !joined4 || !joined5) {
            ck_assert_int_ge(live, 0);
            ck_assert_int_lt(++guard, 10000);
            /* join only while some batchmate is in mid-generation */
            int mid = 0;
            for (int r = 0; r < NREQ; r++) {
                out_t *o = find(&k, (uint64_t)r);
                mid += !o->finished && o->n > 0;
            }
            if (!mid)
                continue;
            if (!joined4 && submit(s, 4, prompt[4], plen[4], GEN, "t", NULL) == MR_SCHED_OK)
                joined4 = 1;
            else if (joined4 && !joined5 && submit(s, 5, prompt[5], plen[5], GEN, "t", NULL) == MR_SCHED_OK)
                joined5 = 1;
        }
        expect_tokens(&k, 2, want[2], 3);
        for (int r = 0; r < NREQ; r++)
            if (r != 2)
                expect_tokens(&k, (uint64_t)r, want[r], GEN);
        mr_sched_stats st;
        mr_sched_get_stats(s, &st);
        ck_assert_int_eq(st.kv_free, st.kv_blocks); /* every block returned */
        ck_assert_int_eq(st.kv_reserved, 0);
        mr_sched_free(s);
    }
    close_model();
}
END_TEST

START_TEST(long_prompt_does_not_stall_decoding)
{
    mr_model_opts mo = {.n_ctx = 256, .n_seqs = 4, .block_tokens = 8};
    open_qwen3(&mo);
    int32_t a[8], b[200];
    lcg_prompt(a, 8, 1, V);
    lcg_prompt(b, 200, 2, V);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = 16};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;
    ck_assert_int_eq(submit(s, 1, a, 8, 16, "t", NULL), MR_SCHED_OK);
    ck_assert_int_eq(mr_sched_step(s, &err), 1);
    ck_assert_int_eq(find(&k, 1)->n, 1);
    ck_assert_int_eq(submit(s, 2, b, 200, 4, "t", NULL), MR_SCHED_OK);
    /* while b's 200 tokens are prefilled in chunks of 16, a gains one token a step */
    for (int step = 0; step < 12; step++) {
        ck_assert_int_eq(mr_sched_step(s, &err), 2);
        ck_assert_int_eq(find(&k, 1)->n, 2 + step);
        ck_assert_int_eq(find(&k, 2)->n, 0);
    }
    ck_assert_int_eq(mr_sched_step(s, &err), 2);
    ck_assert_int_eq(find(&k, 2)->n, 1); /* 13 chunks: 200 tokens */
    run_all(s);
    int32_t want[16];
    greedy_decode(a, 8, 16, want);
    expect_tokens(&k, 1, want, 16);
    greedy_decode(b, 200, 4, want);
    expect_tokens(&k, 2, want, 4);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* ---- prefix cache ---- */

/* A follow-up turn in scope (acme, x) after a 41-token prompt p answered
 * with want: the conversation, its reply and 9 new tokens, as request id.
 * It must give what the model gives without a cache, and take the reply's
 * blocks from it: 41 + GEN - 1 = 48 tokens had K/V, 6 full blocks.  Returns
 * the prompt's length. */
static int follow_up_turn(mr_sched *s, sink_t *k, uint64_t id, int32_t *p, const int32_t *want)
{
    int n2 = 41 + GEN;
    memcpy(p + 41, want, sizeof(int32_t) * GEN);
    lcg_prompt(p + n2, 9, 99, V);
    n2 += 9;
    int32_t want2[GEN];
    greedy_decode(p, n2, GEN, want2);
    ck_assert_int_eq(submit(s, id, p, n2, GEN, "acme", "x"), MR_SCHED_OK);
    run_all(s);
    expect_tokens(k, id, want2, GEN);
    ck_assert_int_eq(find(k, id)->usage.cached_tokens, 48);
    return n2;
}

/* A scheduler with options so, and on it a session's cold first turn in
 * scope (acme, x): a 41-token prompt p, answered with want (GEN tokens, what
 * the model gives without a scheduler), nothing from the cache. */
static mr_sched *first_turn(const mr_sched_opts *so, sink_t *k, int32_t *p, int32_t *want)
{
    lcg_prompt(p, 41, 7, V);
    greedy_decode(p, 41, GEN, want);
    mr_sched *s = new_sched(so, k);
    mr_err err;
    mr_request r1 = {.id = 1, .prompt = p, .n_prompt = 41, .max_tokens = GEN, .tenant = "acme",
                     .cache_salt = "x", .session = "conversation-1"};
    ck_assert_int_eq(mr_sched_submit(s, &r1, &err), MR_SCHED_OK);
    run_all(s);
    expect_tokens(k, 1, want, GEN);
    ck_assert_int_eq(find(k, 1)->usage.cached_tokens, 0);
    return s;
}

START_TEST(prefix_hits_isolation_and_sessions)
{
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 6, .block_tokens = 8};
    open_qwen3(&mo);
    int32_t p[100], want[GEN];
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = 7};
    mr_sched *s = first_turn(&so, &k, p, want);

    ck_assert_int_eq(submit(s, 2, p, 41, GEN, "acme", "x"), MR_SCHED_OK); /* warm: 5 full blocks */
    ck_assert_int_eq(submit(s, 3, p, 41, GEN, "other", "x"), MR_SCHED_OK); /* other tenant */
    ck_assert_int_eq(submit(s, 4, p, 41, GEN, "acme", "y"), MR_SCHED_OK);  /* other salt */
    ck_assert_int_eq(submit(s, 5, p, 40, GEN, "acme", "x"), MR_SCHED_OK);  /* 40 tokens: 4 blocks, last token computed */
    run_all(s);
    for (uint64_t id = 2; id <= 4; id++)
        expect_tokens(&k, id, want, GEN);
    ck_assert_int_eq(find(&k, 2)->usage.cached_tokens, 40);
    ck_assert_int_eq(find(&k, 3)->usage.cached_tokens, 0);
    ck_assert_int_eq(find(&k, 4)->usage.cached_tokens, 0);
    ck_assert_int_eq(find(&k, 5)->usage.cached_tokens, 32);
    int32_t want40[GEN];
    greedy_decode(p, 40, GEN, want40);
    expect_tokens(&k, 5, want40, GEN);

    int n2 = follow_up_turn(s, &k, 6, p, want);

    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.prefix.prompt_tokens, 41 * 4 + 40 + (uint64_t)n2);
    ck_assert_int_eq(st.prefix.hit_tokens, 40 + 32 + 48);
    ck_assert_int_gt(st.prefix.n_blocks, 0);
    ck_assert_int_eq(st.prefix.n_in_use, 0);
    ck_assert_int_eq(st.kv_free + st.prefix.n_blocks, st.kv_blocks);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* A hybrid model's cached prefix carries its recurrent state: hits at the
 * prompt's last block boundary and, for a follow-up turn, at the reply's,
 * give what the uncached model gives; prompt chunks of 7 tokens are cut to
 * end on 8-token boundaries so the state there can be kept. */
START_TEST(hybrid_prefix_hits_restore_state)
{
    static const char *const name[] = {"qwen35", "qwen35moe"};
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 6, .block_tokens = 8};
    open_model(name[_i], "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    int32_t p[100], want[GEN];
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = 7};
    mr_sched *s = first_turn(&so, &k, p, want);

    ck_assert_int_eq(submit(s, 2, p, 41, GEN, "acme", "x"), MR_SCHED_OK);  /* 5 blocks and their state */
    ck_assert_int_eq(submit(s, 3, p, 41, GEN, "other", "x"), MR_SCHED_OK); /* other tenant: cold */
    run_all(s);
    expect_tokens(&k, 2, want, GEN);
    expect_tokens(&k, 3, want, GEN);
    ck_assert_int_eq(find(&k, 2)->usage.cached_tokens, 40);
    ck_assert_int_eq(find(&k, 3)->usage.cached_tokens, 0);

    /* the follow-up turn: for a hybrid, the state after the reply's last full block */
    follow_up_turn(s, &k, 4, p, want);

    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_gt(st.prefix.n_states, 0);
    ck_assert_int_le(st.prefix.n_states, so.max_seqs);
    ck_assert_int_eq(st.prefix.n_in_use, 0);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* Prompts that share a prefix and then differ (one system prompt, several
 * questions): the first leaves a checkpoint only at its own last boundary,
 * past the shared part; the second finds the shared part's K/V without a
 * checkpoint, so it takes one when its prefill reaches that boundary; the
 * third starts there.  Every reply is what the uncached model gives. */
START_TEST(hybrid_shared_prefix_checkpoint_at_divergence)
{
    static const char *const name[] = {"qwen35", "qwen35moe"};
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 6, .block_tokens = 8};
    open_model(name[_i], "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    enum { SHARED = 40, LEN = 49 }; /* 5 shared blocks, then 9 tokens of a question */
    int32_t p[3][LEN], want[3][GEN];
    lcg_prompt(p[0], LEN, 31, V);
    for (int r = 1; r < 3; r++) {
        memcpy(p[r], p[0], sizeof(int32_t) * SHARED);
        lcg_prompt(p[r] + SHARED, LEN - SHARED, 40u + (uint32_t)r, V);
    }
    for (int r = 0; r < 3; r++)
        greedy_decode(p[r], LEN, GEN, want[r]);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = 7};
    mr_sched *s = new_sched(&so, &k);
    static const int cached[3] = {0, 0, SHARED};
    for (int r = 0; r < 3; r++) { /* one after the other: each sees what the previous left */
        ck_assert_int_eq(submit(s, (uint64_t)r + 1, p[r], LEN, GEN, "acme", "x"), MR_SCHED_OK);
        run_all(s);
        expect_tokens(&k, (uint64_t)r + 1, want[r], GEN);
        ck_assert_int_eq(find(&k, (uint64_t)r + 1)->usage.cached_tokens, cached[r]);
    }
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_ge(st.prefix.n_states, 2);
    ck_assert_int_eq(st.prefix.n_in_use, 0);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* Prompts that share a prefix, submitted together (one system prompt, four
 * clients): none finds it cached at admission.  The oldest computes the
 * shared part and publishes it when it gets there; the others wait for it
 * instead of computing it too, then take it from the cache (40 cached
 * tokens each).  On a hybrid the shared part comes with its state.  With
 * chunks of 64 the oldest's first chunk would run past the shared part:
 * it ends there instead.  Every reply is what the uncached model gives. */
START_TEST(batchmates_wait_for_a_shared_prefix)
{
    static const char *const name[] = {"qwen3", "qwen35", "qwen35moe"};
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 6, .block_tokens = 8};
    open_model(name[_i % 3], "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    enum { SHARED = 44, LEN = 53, R = 4 }; /* 5 full shared blocks and 4 tokens, then the question */
    int32_t p[R][LEN], want[R][GEN];
    lcg_prompt(p[0], LEN, 51, V);
    for (int r = 1; r < R; r++) {
        memcpy(p[r], p[0], sizeof(int32_t) * SHARED);
        lcg_prompt(p[r] + SHARED, LEN - SHARED, 60u + (uint32_t)r, V);
    }
    for (int r = 0; r < R; r++)
        greedy_decode(p[r], LEN, GEN, want[r]);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = _i < 3 ? 7 : 64};
    mr_sched *s = new_sched(&so, &k);
    for (int r = 0; r < R; r++)
        ck_assert_int_eq(submit(s, (uint64_t)r + 1, p[r], LEN, GEN, "acme", "x"), MR_SCHED_OK);
    run_all(s);
    for (int r = 0; r < R; r++) {
        expect_tokens(&k, (uint64_t)r + 1, want[r], GEN);
        ck_assert_int_eq(find(&k, (uint64_t)r + 1)->usage.cached_tokens, (r == 0 ? 0 : 40));
    }
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.prefix.hit_tokens, 40 * (R - 1));
    ck_assert_int_eq(st.prefix.prompt_tokens, LEN * R);
    ck_assert_int_eq(st.prefix.n_in_use, 0);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* A request that arrives while an older one is still prefilling past the
 * prefix they share: the older one publishes that part at once and the new
 * one takes it (qwen3: K/V only; a hybrid would need the state at that
 * boundary).  A request in another scope shares nothing. */
START_TEST(late_batchmate_takes_a_computed_prefix)
{
    mr_model_opts mo = {.n_ctx = 256, .n_seqs = 6, .block_tokens = 8};
    open_qwen3(&mo);
    enum { SHARED = 40, LONG = 200, LEN = 49 };
    int32_t a[LONG], b[LEN], wa[GEN], wb[GEN];
    lcg_prompt(a, LONG, 71, V);
    memcpy(b, a, sizeof(int32_t) * SHARED);
    lcg_prompt(b + SHARED, LEN - SHARED, 72, V);
    greedy_decode(a, LONG, GEN, wa);
    greedy_decode(b, LEN, GEN, wb);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = 16};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;
    ck_assert_int_eq(submit(s, 1, a, LONG, GEN, "acme", "x"), MR_SCHED_OK);
    for (int i = 0; i < 4; i++) /* 64 of its 200 prompt tokens */
        ck_assert_int_eq(mr_sched_step(s, &err), 1);
    ck_assert_int_eq(submit(s, 2, b, LEN, GEN, "acme", "x"), MR_SCHED_OK);
    ck_assert_int_eq(submit(s, 3, b, LEN, GEN, "other", "x"), MR_SCHED_OK);
    run_all(s);
    expect_tokens(&k, 1, wa, GEN);
    expect_tokens(&k, 2, wb, GEN);
    expect_tokens(&k, 3, wb, GEN);
    ck_assert_int_eq(find(&k, 2)->usage.cached_tokens, SHARED);
    ck_assert_int_eq(find(&k, 3)->usage.cached_tokens, 0);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* ---- admission ---- */

START_TEST(admission_refusal_recovery_and_eviction)
{
    /* 12 blocks of 8 tokens */
    mr_model_opts mo = {.n_ctx = 128, .block_tokens = 8, .kv_blocks = 12};
    open_qwen3(&mo);
    int32_t a[40], b[40], c[100];
    lcg_prompt(a, 40, 11, V);
    lcg_prompt(b, 40, 12, V);
    lcg_prompt(c, 100, 13, V);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4, .chunk_tokens = 16};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;
    mr_request big = {.id = 9, .prompt = c, .n_prompt = 100, .max_tokens = 8};
    ck_assert_int_eq(mr_sched_submit(s, &big, &err), MR_SCHED_TOO_LARGE); /* 14 blocks > the pool of 12: never fits */
    ck_assert_msg(strstr(err.msg, "KV blocks") != NULL, "%s", err.msg);

    /* a needs ceil((40 + 24 - 1) / 8) = 8 blocks; b the same: only one fits */
    ck_assert_int_eq(submit(s, 1, a, 40, 24, "t", NULL), MR_SCHED_OK);
    ck_assert_int_eq(submit(s, 2, b, 40, 24, "t", NULL), MR_SCHED_NO_CAPACITY);
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.kv_available, 4);
    ck_assert_int_eq(st.refused, 2);
    run_all(s);
    /* a left its 7 full blocks (62 tokens of K/V) in the cache: only 5 are
     * free, so b is admitted by evicting a's least recently used entries */
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.prefix.n_blocks, 7);
    /* the 14-block request does not fit even with the whole cache evicted:
     * refused, and the cache is left alone */
    ck_assert_int_eq(mr_sched_submit(s, &big, &err), MR_SCHED_TOO_LARGE);
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.prefix.n_blocks, 7);
    ck_assert_int_eq(st.prefix.evictions, 0);
    ck_assert_int_eq(submit(s, 2, b, 40, 24, "t", NULL), MR_SCHED_OK);
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.prefix.evictions, 3);
    run_all(s);
    mr_sched_free(s); /* its cached blocks go back to the pool for the solo run */
    int32_t want24[24];
    greedy_decode(b, 40, 24, want24);
    expect_tokens(&k, 2, want24, 24);
    greedy_decode(a, 40, 24, want24);
    expect_tokens(&k, 1, want24, 24);
    close_model();
}
END_TEST

START_TEST(slots_cancellation_stop_and_errors)
{
    mr_model_opts mo = {.n_ctx = 64, .n_seqs = 4, .block_tokens = 8};
    open_qwen3(&mo);
    int32_t a[10], b[12], want[GEN];
    lcg_prompt(a, 10, 21, V);
    lcg_prompt(b, 12, 22, V);
    greedy_decode(b, 12, GEN, want);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = 8};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;

    /* bad requests */
    int32_t bad[2] = {1, 4096};
    ck_assert_int_eq(submit(s, 7, bad, 2, 4, "t", NULL), MR_SCHED_INVALID);
    int32_t longp[64] = {0};
    ck_assert_int_eq(submit(s, 7, longp, 64, 4, "t", NULL), MR_SCHED_INVALID);
    ck_assert_int_eq(submit(s, 7, a, 0, 4, "t", NULL), MR_SCHED_INVALID);
    mr_request badp = {.id = 7, .prompt = a, .n_prompt = 10, .sampling = {.top_p = 2.0f}};
    ck_assert_int_eq(mr_sched_submit(s, &badp, &err), MR_SCHED_INVALID);

    /* a is cancelled by the step after its 3rd token; b goes on unchanged */
    ck_assert_int_eq(submit(s, 1, a, 10, 40, "t", NULL), MR_SCHED_OK);
    ck_assert_int_eq(submit(s, 1, b, 12, GEN, "t", NULL), MR_SCHED_INVALID); /* id in use */
    ck_assert_int_eq(submit(s, 2, b, 12, GEN, "t", NULL), MR_SCHED_OK);
    ck_assert_int_eq(submit(s, 3, b, 12, GEN, "t", NULL), MR_SCHED_NO_CAPACITY); /* 2 slots */
    ck_assert_int_eq(mr_sched_cancel(s, 99), -1);
    for (int i = 0; i < 3; i++)
        mr_sched_step(s, &err);
    ck_assert_int_eq(find(&k, 1)->n, 2); /* prompt over two steps (chunk 8), then decode */
    ck_assert_int_eq(mr_sched_cancel(s, 1), 0);
    ck_assert(!find(&k, 1)->finished);
    ck_assert_int_eq(mr_sched_step(s, &err), 1);
    ck_assert(find(&k, 1)->finished);
    ck_assert_int_eq(find(&k, 1)->reason, MR_SCHED_FIN_CANCELLED);
    ck_assert_int_eq(find(&k, 1)->n, 2);
    ck_assert_int_eq(submit(s, 3, a, 10, 40, "t", NULL), MR_SCHED_OK); /* the slot is free again */
    /* 3 is cancelled from inside the callback at its 2nd token */
    k.cancel_at_token_id = 3;
    k.cancel_after = 2;
    run_all(s);
    expect_tokens(&k, 2, want, GEN);
    ck_assert_int_eq(find(&k, 3)->reason, MR_SCHED_FIN_CANCELLED);
    ck_assert_int_eq(find(&k, 3)->n, 2);
    ck_assert_int_eq(find(&k, 3)->usage.completion_tokens, 2);

    /* a stop id: the solo run's 4th token ends the request after 3 */
    int32_t stop[2] = {V - 1, want[3]};
    int first = 0;
    while (want[first] != want[3])
        first++; /* the stop id may occur earlier */
    mr_request r = {.id = 4, .prompt = b, .n_prompt = 12, .max_tokens = GEN, .stop_ids = stop, .n_stop = 2};
    ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
    run_all(s);
    expect_tokens(&k, 4, want, first);
    ck_assert_int_eq(find(&k, 4)->reason, MR_SCHED_FIN_STOP);
    ck_assert_int_eq(find(&k, 4)->stop_token, want[3]);
    ck_assert_int_eq(find(&k, 4)->usage.completion_tokens, first + 1);

    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.live, 0);
    ck_assert_int_eq(st.kv_reserved, 0);
    ck_assert_int_eq(st.kv_free + st.prefix.n_blocks, st.kv_blocks);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* ---- sampling ---- */

START_TEST(seeded_sampling_is_independent_of_batchmates)
{
    mr_model_opts mo = {.n_ctx = 96, .n_seqs = 4, .block_tokens = 8};
    open_qwen3(&mo);
    int32_t p[3][20];
    for (int i = 0; i < 3; i++)
        lcg_prompt(p[i], 20, 31u + (uint32_t)i, V);
    mr_sample_params sp = {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .min_p = 0.01f,
                      .presence_penalty = 0.3f, .frequency_penalty = 0.2f, .repetition_penalty = 1.1f,
                      .seed = 12345};
    mr_err err;
    out_t alone;
    for (int run = 0; run < 2; run++) {
        sink_t k;
        mr_sched_opts so = {.max_seqs = 3, .chunk_tokens = run ? 3 : 64};
        mr_sched *s = new_sched(&so, &k);
        mr_request r = {.id = 1, .prompt = p[0], .n_prompt = 20, .max_tokens = 16, .sampling = sp};
        ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
        if (run) {
            /* batchmates with other seeds and prompts */
            for (int j = 1; j < 3; j++) {
                mr_request o = {.id = (uint64_t)(10 + j), .prompt = p[j], .n_prompt = 20, .max_tokens = 16,
                                .sampling = sp};
                o.sampling.seed = (uint64_t)j;
                ck_assert_int_eq(mr_sched_submit(s, &o, &err), MR_SCHED_OK);
            }
        }
        run_all(s);
        out_t *o = find(&k, 1);
        ck_assert_int_eq(o->n, 16);
        if (!run)
            alone = *o;
        else
            for (int i = 0; i < 16; i++)
                ck_assert_int_eq(o->toks[i], alone.toks[i]);
        mr_sched_free(s);
    }
    close_model();
}
END_TEST

/* ---- a failing step ---- */

static int fail_steps;
static void failing_add(mr_backend *b, float *y, const float *x, size_t n)
{
    if (fail_steps > 0)
        mr_cpu_fail(b, "injected failure");
    mr_cpu_add(b, y, x, n);
}

START_TEST(failed_step_finishes_its_requests_cleanly)
{
    mr_model_opts mo = {.n_ctx = 64, .n_seqs = 4, .block_tokens = 8};
    open_qwen3(&mo);
    int32_t a[10], b[12], want[GEN];
    lcg_prompt(a, 10, 51, V);
    lcg_prompt(b, 12, 52, V);
    greedy_decode(b, 12, GEN, want);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 4};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;
    ck_assert_int_eq(submit(s, 1, a, 10, GEN, "t", NULL), MR_SCHED_OK);
    ck_assert_int_eq(mr_sched_step(s, &err), 1);
    ck_assert_int_eq(mr_sched_step(s, &err), 1);
    /* the backend fails during the next step: its requests end with ERROR */
    be->add = failing_add;
    fail_steps = 1;
    ck_assert_int_eq(mr_sched_step(s, &err), -1);
    ck_assert_msg(strstr(err.msg, "injected failure") != NULL, "%s", err.msg);
    ck_assert(find(&k, 1)->finished);
    ck_assert_int_eq(find(&k, 1)->reason, MR_SCHED_FIN_ERROR);
    ck_assert_int_eq(find(&k, 1)->n, 2);
    /* the scheduler goes on: a new request runs as if nothing happened */
    fail_steps = 0;
    ck_assert_int_eq(submit(s, 2, b, 12, GEN, "t", NULL), MR_SCHED_OK);
    run_all(s);
    expect_tokens(&k, 2, want, GEN);
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.kv_reserved, 0);
    ck_assert_int_eq(st.kv_free + st.prefix.n_blocks, st.kv_blocks);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* ---- MTP speculation (opts.spec_k) ---- */

enum { SGEN = 28, SPROMPT = 20 };
static int32_t spec_want[SGEN]; /* the plain scheduler's greedy continuation */
static int spec_salt;            /* planted drafts: wrong where (index * 7 + salt) % 5 == 0; < 0: never */

/* Drafts from the true continuation, some wrong (the fixtures' random MTP
 * weights almost never agree with the trunk: accepted runs need these). */
static void planted_drafts(void *ctx, int first, int k, int32_t *draft)
{
    (void)ctx;
    for (int i = 0; i < k; i++) {
        int idx = first + i;
        int32_t good = idx < SGEN ? spec_want[idx] : 0;
        draft[i] = spec_salt >= 0 && (idx * 7 + spec_salt) % 5 == 0 ? (good + 1) % V : good;
    }
}

/* One greedy request alone on a scheduler with spec_k (planted drafts or
 * the model's own); returns its output in *o and the stats in *st. */
static void spec_run(int spec_k, bool planted, const int32_t *p, int max_tokens, const int32_t *stop, int n_stop,
                     out_t *o, mr_sched_stats *st)
{
    sink_t k;
    mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = 7, .spec_k = spec_k};
    if (planted)
        so.spec_drafter = (mr_spec_drafter){planted_drafts, NULL};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;
    mr_request r = {.id = 1, .prompt = p, .n_prompt = SPROMPT, .max_tokens = max_tokens, .stop_ids = stop,
                    .n_stop = n_stop};
    ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
    run_all(s);
    *o = *find(&k, 1);
    ck_assert(o->finished);
    ck_assert_int_eq(o->events_after_finish, 0);
    mr_sched_get_stats(s, st);
    /* every block back: nothing reserved, the rest free or cached */
    ck_assert_int_eq(st->kv_reserved, 0);
    ck_assert_int_eq(st->kv_free + st->prefix.n_blocks, st->kv_blocks);
    mr_sched_free(s);
}

static void expect_out(const out_t *o, const out_t *want, const char *what, int spec_k)
{
    ck_assert_msg(o->n == want->n, "%s spec_k=%d: %d tokens, want %d", what, spec_k, o->n, want->n);
    for (int i = 0; i < o->n; i++)
        ck_assert_msg(o->toks[i] == want->toks[i], "%s spec_k=%d: token %d is %d, want %d", what, spec_k, i,
                      o->toks[i], want->toks[i]);
    ck_assert_int_eq(o->reason, want->reason);
    ck_assert_int_eq(o->stop_token, want->stop_token);
    ck_assert_int_eq(o->usage.completion_tokens, want->usage.completion_tokens);
}

/* A lone greedy request decoded speculatively gives the plain scheduler's
 * tokens for spec_k 1, 3 and 8: with the model's own drafts (all rejected,
 * the reject-and-replay path), with planted drafts (runs of accepted ones,
 * partial rejections), ending by max_tokens inside accepted runs and by a
 * stop id inside one; a follow-up turn served from the blocks and state it
 * left in the prefix cache is exact too. */
START_TEST(spec_lone_greedy_matches_plain)
{
    static const char *const name[] = {"qwen35", "qwen35moe"};
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 4, .block_tokens = 8};
    open_model(name[_i], "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    int32_t p[SPROMPT];
    lcg_prompt(p, SPROMPT, 77, V);
    out_t plain, o;
    mr_sched_stats st;
    spec_run(0, false, p, SGEN, NULL, 0, &plain, &st);
    ck_assert_int_eq(plain.n, SGEN);
    ck_assert_int_eq((int)st.spec_steps, 0);
    memcpy(spec_want, plain.toks, sizeof spec_want);
    int32_t solo[SGEN];
    greedy_decode(p, SPROMPT, SGEN, solo);
    for (int i = 0; i < SGEN; i++)
        ck_assert_int_eq(solo[i], spec_want[i]);

    static const int ks[] = {1, 3, 8};
    for (int ki = 0; ki < 3; ki++) {
        int kk = ks[ki];
        spec_run(kk, false, p, SGEN, NULL, 0, &o, &st);
        expect_out(&o, &plain, "MTP drafts", kk);
        ck_assert_int_gt((int)st.spec_steps, 0);
        printf("%s spec_k=%d MTP drafts: %llu/%llu accepted, %llu steps\n", name[_i], kk,
               (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted,
               (unsigned long long)st.spec_steps);

        spec_salt = kk;
        spec_run(kk, true, p, SGEN, NULL, 0, &o, &st);
        expect_out(&o, &plain, "planted drafts", kk);
        ck_assert_int_gt((int)st.spec_accepted, 0);
        ck_assert_int_lt((int)st.spec_accepted, (int)st.spec_drafted);
        ck_assert_int_gt((int)st.spec_replays, 0);
        if (kk > 1)
            ck_assert_int_lt((int)st.spec_steps, SGEN - 2); /* fewer steps than one token each */
        printf("%s spec_k=%d planted drafts: %llu/%llu accepted, %llu steps, %llu replays\n", name[_i], kk,
               (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted,
               (unsigned long long)st.spec_steps, (unsigned long long)st.spec_replays);

        /* max_tokens inside runs of accepted drafts (none wrong, and a few
         * wrong) */
        static const int maxes[] = {5, 13};
        for (int mi = 0; mi < 2; mi++)
            for (int salt = -1; salt <= 1; salt += 2) {
                spec_salt = salt;
                spec_run(kk, true, p, maxes[mi], NULL, 0, &o, &st);
                ck_assert_int_eq(o.reason, MR_SCHED_FIN_LENGTH);
                ck_assert_int_eq(o.n, maxes[mi]);
                ck_assert_int_eq(o.usage.completion_tokens, maxes[mi]);
                for (int i = 0; i < o.n; i++)
                    ck_assert_int_eq(o.toks[i], spec_want[i]);
            }
    }

    /* a stop id inside a run of accepted drafts: the first token from 9 on
     * that did not come before */
    int at = 9;
    for (bool seen = true; seen && at < SGEN - 2; at += seen) {
        seen = false;
        for (int i = 0; i < at; i++)
            seen |= spec_want[i] == spec_want[at];
    }
    ck_assert_int_lt(at, SGEN - 2);
    int32_t stop[2] = {V - 1 == spec_want[at] ? V - 2 : V - 1, spec_want[at]};
    out_t stop_plain;
    spec_run(0, false, p, SGEN, stop, 2, &stop_plain, &st);
    ck_assert_int_eq(stop_plain.reason, MR_SCHED_FIN_STOP);
    ck_assert_int_eq(stop_plain.n, at);
    ck_assert_int_eq(stop_plain.stop_token, spec_want[at]);
    for (int ki = 0; ki < 3; ki++) {
        for (int salt = -1; salt <= 1; salt += 2) {
            spec_salt = salt;
            spec_run(ks[ki], true, p, SGEN, stop, 2, &o, &st);
            expect_out(&o, &stop_plain, "stop id", ks[ki]);
        }
        spec_run(ks[ki], false, p, SGEN, stop, 2, &o, &st);
        expect_out(&o, &stop_plain, "stop id, MTP drafts", ks[ki]);
    }

    /* what a speculative request leaves in the prefix cache (K/V of its
     * reply, the recurrent state at its last block boundary) serves the
     * follow-up turn exactly */
    {
        sink_t k;
        mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = 7, .spec_k = 3,
                            .spec_drafter = {planted_drafts, NULL}};
        spec_salt = 2;
        mr_sched *s = new_sched(&so, &k);
        ck_assert_int_eq(submit(s, 1, p, SPROMPT, SGEN, "acme", "x"), MR_SCHED_OK);
        run_all(s);
        expect_tokens(&k, 1, spec_want, SGEN);
        int32_t p2[SPROMPT + SGEN + 5], want2[8];
        memcpy(p2, p, sizeof p);
        memcpy(p2 + SPROMPT, spec_want, sizeof spec_want);
        lcg_prompt(p2 + SPROMPT + SGEN, 5, 78, V);
        int n2 = SPROMPT + SGEN + 5;
        greedy_decode(p2, n2, 8, want2);
        /* the drafter plants the first reply's tokens: wrong for this one */
        ck_assert_int_eq(submit(s, 2, p2, n2, 8, "acme", "x"), MR_SCHED_OK);
        run_all(s);
        expect_tokens(&k, 2, want2, 8);
        ck_assert_int_gt(find(&k, 2)->usage.cached_tokens, 0);
        mr_sched_free(s);
    }
    close_model();
}
END_TEST

/* Speculation only while a greedy request is alone: a second request
 * arriving mid-generation puts both back on one-token batched steps (no
 * speculative step while two are live), and the first speculates again
 * once the other has finished; every output equals its solo run.  Sampled
 * requests never speculate; spec_k outside 0..8 is refused. */
START_TEST(spec_falls_back_to_batching)
{
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 4, .block_tokens = 8};
    open_model("qwen35", "model-BF16.gguf", &mo);
    V = mr_model_hparams(model)->n_vocab;
    int32_t a[SPROMPT], b[12], want_b[6];
    lcg_prompt(a, SPROMPT, 77, V);
    lcg_prompt(b, 12, 78, V);
    greedy_decode(a, SPROMPT, SGEN, spec_want);
    greedy_decode(b, 12, 6, want_b);

    sink_t k;
    mr_err err;
    mr_sched *s;
    mr_sched_opts bad = {.spec_k = 9};
    ck_assert_int_eq(mr_sched_new(model, &bad, on_event, &k, &s, &err), -1);
    ck_assert_msg(strstr(err.msg, "spec_k") != NULL, "%s", err.msg);

    mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = 7, .spec_k = 3, .spec_drafter = {planted_drafts, NULL}};
    spec_salt = 4;
    s = new_sched(&so, &k);
    ck_assert_int_eq(submit(s, 1, a, SPROMPT, SGEN, NULL, NULL), MR_SCHED_OK);
    mr_sched_stats st;
    int guard = 0;
    while (find(&k, 1)->n < 6) {
        ck_assert_int_eq(mr_sched_step(s, &err), 1);
        ck_assert_int_lt(++guard, 100);
    }
    mr_sched_get_stats(s, &st);
    ck_assert_int_gt((int)st.spec_steps, 0);
    ck_assert_int_eq(submit(s, 2, b, 12, 6, NULL, NULL), MR_SCHED_OK);
    int live;
    do {
        mr_sched_stats before, after;
        mr_sched_get_stats(s, &before);
        live = mr_sched_step(s, &err);
        ck_assert_msg(live >= 0, "%s", err.msg);
        mr_sched_get_stats(s, &after);
        if (before.live == 2)
            ck_assert_int_eq((int)after.spec_steps, (int)before.spec_steps);
        ck_assert_int_lt(++guard, 1000);
    } while (live == 2);
    ck_assert(find(&k, 2)->finished);
    ck_assert(!find(&k, 1)->finished);
    mr_sched_get_stats(s, &st);
    uint64_t steps_when_alone = st.spec_steps;
    run_all(s);
    expect_tokens(&k, 1, spec_want, SGEN);
    expect_tokens(&k, 2, want_b, 6);
    mr_sched_get_stats(s, &st);
    ck_assert_int_gt((int)st.spec_steps, (int)steps_when_alone);

    /* a sampled request alone: plain steps */
    mr_request r = {.id = 3, .prompt = b, .n_prompt = 12, .max_tokens = 6,
                    .sampling = {.temperature = 0.8f, .seed = 5}};
    ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
    mr_sched_get_stats(s, &st);
    uint64_t before_sampled = st.spec_steps;
    run_all(s);
    ck_assert_int_eq(find(&k, 3)->n, 6);
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq((int)st.spec_steps, (int)before_sampled);

    /* cancelled from the callback in the middle of a step's accepted run:
     * nothing more is delivered, every block comes back */
    spec_salt = -1;
    k.cancel_at_token_id = 4;
    k.cancel_after = 5;
    ck_assert_int_eq(submit(s, 4, a, SPROMPT, SGEN, NULL, NULL), MR_SCHED_OK);
    run_all(s);
    ck_assert_int_eq(find(&k, 4)->reason, MR_SCHED_FIN_CANCELLED);
    ck_assert_int_eq(find(&k, 4)->n, 5);
    ck_assert_int_eq(find(&k, 4)->events_after_finish, 0);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(find(&k, 4)->toks[i], spec_want[i]);
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq(st.kv_reserved, 0);
    ck_assert_int_eq(st.kv_free + st.prefix.n_blocks, st.kv_blocks);
    mr_sched_free(s);
    close_model();
}
END_TEST

/* ---- MTP priming over the prompt ---- */

enum { PGEN = 12 }; /* tokens a priming test's request generates */

/* The drafts the MTP block made at each speculative step, recorded by a
 * drafter that keeps them. */
typedef struct {
    int n;
    int first[MAXT];
    int k[MAXT];
    int32_t d[MAXT][8];
    bool plant; /* then replaces them with planted_drafts' */
} draft_log;

static void log_drafts(void *ctx, int first, int k, int32_t *draft)
{
    draft_log *l = ctx;
    ck_assert_int_lt(l->n, MAXT);
    ck_assert_int_le(k, 8);
    l->first[l->n] = first;
    l->k[l->n] = k;
    memcpy(l->d[l->n], draft, sizeof(int32_t) * (size_t)k);
    l->n++;
    if (l->plant)
        planted_drafts(NULL, first, k, draft);
}

static bool same_drafts(const draft_log *a, const draft_log *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->first[i] != b->first[i] || a->k[i] != b->k[i] ||
            memcmp(a->d[i], b->d[i], sizeof(int32_t) * (size_t)a->k[i]))
            return false;
    return true;
}

static void expect_same_drafts(const draft_log *got, const draft_log *want, const char *what, int spec_k)
{
    ck_assert_msg(got->n == want->n, "%s spec_k=%d: %d drafting steps, want %d", what, spec_k, got->n, want->n);
    for (int i = 0; i < got->n; i++) {
        ck_assert_msg(got->first[i] == want->first[i] && got->k[i] == want->k[i],
                      "%s spec_k=%d step %d: %d drafts after %d tokens, want %d after %d", what, spec_k, i,
                      got->k[i], got->first[i], want->k[i], want->first[i]);
        for (int j = 0; j < got->k[i]; j++)
            ck_assert_msg(got->d[i][j] == want->d[i][j], "%s spec_k=%d step %d draft %d: %d, want %d", what,
                          spec_k, i, j, got->d[i][j], want->d[i][j]);
    }
}

/* The standalone path (worker/spec.c: the prompt in one call with every
 * row's logits, the MTP block over all of it in one call): its drafts, and
 * its output, which must be the plain one. */
static void standalone_drafts(const int32_t *p, int n, int spec_k, const int32_t *want, draft_log *log)
{
    mr_err err;
    int32_t out[PGEN];
    mr_spec_stats st;
    memset(log, 0, sizeof *log);
    mr_spec_drafter d = {log_drafts, log};
    ck_assert_msg(mr_spec_generate(model, p, n, PGEN, spec_k, &d, out, &st, &err) == 0, "%s", err.msg);
    for (int i = 0; i < PGEN; i++)
        ck_assert_int_eq(out[i], want[i]);
    ck_assert_int_eq(log->first[0], 1); /* its first step drafts */
}

/* Steps s until nothing is live; returns the drafts verified by the first
 * speculative step of this run (-1: none ran). */
static int run_first_spec_drafts(mr_sched *s)
{
    mr_err err;
    int live, guard = 0, first = -1;
    do {
        mr_sched_stats before, after;
        mr_sched_get_stats(s, &before);
        live = mr_sched_step(s, &err);
        ck_assert_msg(live >= 0, "%s", err.msg);
        mr_sched_get_stats(s, &after);
        if (first < 0 && after.spec_steps > before.spec_steps)
            first = (int)(after.spec_drafted - before.spec_drafted);
        ck_assert_int_lt(++guard, 10000);
    } while (live > 0);
    return first;
}

static const char *const hybrid_name[] = {"qwen35", "qwen35moe"};
static const char *const hybrid_file[] = {"model-BF16.gguf", "model-Q4_K_M.gguf"};

/* Loop index i: both hybrids, each as BF16 and quantized; the prompt and
 * its plain greedy continuation (the one-sequence API) in spec_want. */
static void open_hybrid(int i, int32_t *p)
{
    mr_model_opts mo = {.n_ctx = 128, .n_seqs = 4, .block_tokens = 8};
    open_model(hybrid_name[i / 2], hybrid_file[i % 2], &mo);
    V = mr_model_hparams(model)->n_vocab;
    lcg_prompt(p, SPROMPT, 77, V);
    greedy_decode(p, SPROMPT, PGEN, spec_want);
}

/* A lone greedy request whose prompt runs in chunks of 3 and 7 tokens (cut
 * at 8-token block boundaries): the MTP block is primed over every prompt
 * position, its first speculative step verifies spec_k drafts, and its
 * drafts at every step are those of the standalone path, which primes over
 * the whole prompt in one call; the output is plain greedy decoding's,
 * with the model's drafts and with planted ones, for spec_k 1, 3 and 8. */
START_TEST(spec_primed_in_chunks_as_standalone)
{
    int32_t p[SPROMPT];
    open_hybrid(_i, p);
    const char *what = hybrid_file[_i % 2];
    static const int ks[] = {1, 3, 8}, chunks[] = {3, 7};
    for (int ki = 0; ki < 3; ki++) {
        int kk = ks[ki];
        draft_log ref;
        standalone_drafts(p, SPROMPT, kk, spec_want, &ref);
        for (int c = 0; c < 2; c++) {
            draft_log got = {0};
            sink_t k;
            mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = chunks[c], .spec_k = kk,
                                .spec_drafter = {log_drafts, &got}};
            mr_sched *s = new_sched(&so, &k);
            ck_assert_int_eq(submit(s, 1, p, SPROMPT, PGEN, NULL, NULL), MR_SCHED_OK);
            ck_assert_int_eq(run_first_spec_drafts(s), kk);
            expect_tokens(&k, 1, spec_want, PGEN);
            expect_same_drafts(&got, &ref, what, kk);
            mr_sched_stats st;
            mr_sched_get_stats(s, &st);
            ck_assert_int_eq((int)st.spec_primed, SPROMPT);
            printf("%s %s spec_k=%d chunk %d: first step %d drafts, %llu/%llu accepted in %llu steps, "
                   "drafts as standalone (%d steps)\n",
                   hybrid_name[_i / 2], what, kk, chunks[c], kk, (unsigned long long)st.spec_accepted,
                   (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_steps, got.n);
            mr_sched_free(s);

            /* planted drafts: runs of accepted ones from the first step on */
            spec_salt = kk;
            so.spec_drafter = (mr_spec_drafter){planted_drafts, NULL};
            s = new_sched(&so, &k);
            ck_assert_int_eq(submit(s, 1, p, SPROMPT, PGEN, NULL, NULL), MR_SCHED_OK);
            ck_assert_int_eq(run_first_spec_drafts(s), kk);
            expect_tokens(&k, 1, spec_want, PGEN);
            mr_sched_get_stats(s, &st);
            ck_assert_int_gt((int)st.spec_accepted, 0);
            printf("%s %s spec_k=%d chunk %d planted drafts: %llu/%llu accepted in %llu steps, %llu replays\n",
                   hybrid_name[_i / 2], what, kk, chunks[c], (unsigned long long)st.spec_accepted,
                   (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_steps,
                   (unsigned long long)st.spec_replays);
            mr_sched_free(s);
        }
    }
    close_model();
}
END_TEST

/* Runs request id (prompt p of n tokens, PGEN to generate, scope
 * acme/x) alone on s and checks it gives want; returns how many prompt
 * positions were primed for it, and in *first the drafts its first
 * speculative step verified. */
static int primed_request(mr_sched *s, sink_t *k, uint64_t id, const int32_t *p, int n, const int32_t *want,
                          int *first)
{
    mr_sched_stats before, after;
    mr_sched_get_stats(s, &before);
    ck_assert_int_eq(submit(s, id, p, n, PGEN, "acme", "x"), MR_SCHED_OK);
    *first = run_first_spec_drafts(s);
    expect_tokens(k, id, want, PGEN);
    mr_sched_get_stats(s, &after);
    return (int)(after.spec_primed - before.spec_primed);
}

/* A prompt whose first 16 tokens come from the prefix cache: only its
 * last 4 positions are primed (the cached ones have no hidden rows).  When
 * the request that left them primed them over the same prompt, the drafts
 * are the standalone path's at every step; when the prompt goes on
 * differently, or the cached blocks come from a request that did not
 * speculate (sampled), the cached positions hold other MTP K/V: the
 * output is still plain greedy decoding's and the first step still
 * drafts (the last chunk is primed).  spec_k 1, 3 and 8; model drafts and
 * planted ones. */
START_TEST(spec_primed_after_prefix_hit)
{
    int32_t p[SPROMPT], q[SPROMPT], want_q[PGEN];
    open_hybrid(_i, p);
    memcpy(q, p, sizeof(int32_t) * 16);
    lcg_prompt(q + 16, SPROMPT - 16, 81, V);
    greedy_decode(q, SPROMPT, PGEN, want_q);
    const char *what = hybrid_file[_i % 2];
    static const int ks[] = {1, 3, 8}, chunks[] = {3, 7, 3};
    for (int ki = 0; ki < 3; ki++) {
        int kk = ks[ki], first;
        draft_log ref, got = {0};
        standalone_drafts(p, SPROMPT, kk, spec_want, &ref);
        sink_t k;
        mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = chunks[ki], .spec_k = kk,
                            .spec_drafter = {log_drafts, &got}};
        mr_sched *s = new_sched(&so, &k);
        ck_assert_int_eq(primed_request(s, &k, 1, p, SPROMPT, spec_want, &first), SPROMPT);
        ck_assert_int_eq(find(&k, 1)->usage.cached_tokens, 0);
        expect_same_drafts(&got, &ref, what, kk);

        got.n = 0; /* the same prompt again: 16 cached positions its predecessor primed */
        ck_assert_int_eq(primed_request(s, &k, 2, p, SPROMPT, spec_want, &first), SPROMPT - 16);
        ck_assert_int_eq(find(&k, 2)->usage.cached_tokens, 16);
        ck_assert_int_eq(first, kk);
        expect_same_drafts(&got, &ref, "prefix hit", kk);

        got.n = 0; /* a prompt that goes on differently after the cached part */
        ck_assert_int_eq(primed_request(s, &k, 3, q, SPROMPT, want_q, &first), SPROMPT - 16);
        ck_assert_int_eq(find(&k, 3)->usage.cached_tokens, 16);
        ck_assert_int_eq(first, kk);

        got.n = 0; /* planted drafts, accepted runs from the first step */
        got.plant = true;
        spec_salt = kk;
        ck_assert_int_eq(primed_request(s, &k, 4, p, SPROMPT, spec_want, &first), SPROMPT - 16);
        ck_assert_int_eq(find(&k, 4)->usage.cached_tokens, 16);
        ck_assert_int_eq(first, kk);
        got.plant = false;
        mr_sched_stats st;
        mr_sched_get_stats(s, &st);
        ck_assert_int_gt((int)st.spec_accepted, 0);
        ck_assert_int_eq(st.prefix.n_in_use, 0);
        mr_sched_free(s);

        /* cached blocks of a sampled request: none of its positions primed */
        s = new_sched(&so, &k);
        mr_err err;
        mr_request r = {.id = 5, .prompt = p, .n_prompt = SPROMPT, .max_tokens = 4, .tenant = "acme",
                        .cache_salt = "x", .sampling = {.temperature = 0.8f, .seed = 5}};
        ck_assert_int_eq(mr_sched_submit(s, &r, &err), MR_SCHED_OK);
        run_all(s);
        mr_sched_get_stats(s, &st);
        ck_assert_int_eq((int)st.spec_primed, 0);
        got.n = 0;
        ck_assert_int_eq(primed_request(s, &k, 6, p, SPROMPT, spec_want, &first), SPROMPT - 16);
        ck_assert_int_eq(find(&k, 6)->usage.cached_tokens, 16);
        ck_assert_int_eq(first, kk);
        /* stale entries: whatever those blocks of the MTP cache last held */
        printf("%s %s spec_k=%d chunk %d: after a sampled request's blocks, drafts %s the standalone path's\n",
               hybrid_name[_i / 2], what, kk, so.chunk_tokens, same_drafts(&got, &ref) ? "equal" : "differ from");
        mr_sched_free(s);
    }
    close_model();
}
END_TEST

/* Two greedy prompts that run in the same steps, both primed (the other
 * one admitted first, so its chunks come first in each call and its
 * priming runs first): the other one ends with its first token (a stop
 * id), and the request left alone starts speculating with the drafts of
 * the standalone path, so its priming took its own rows of the shared
 * calls, after the other's MTP calls had run. */
START_TEST(spec_primed_beside_another_prompt)
{
    int32_t p[SPROMPT], b[SPROMPT], b_first;
    open_hybrid(_i, p);
    lcg_prompt(b, SPROMPT, 79, V);
    greedy_decode(b, SPROMPT, 1, &b_first);
    draft_log ref, got = {0};
    standalone_drafts(p, SPROMPT, 3, spec_want, &ref);
    sink_t k;
    mr_sched_opts so = {.max_seqs = 2, .chunk_tokens = 64, .spec_k = 3, .spec_drafter = {log_drafts, &got}};
    mr_sched *s = new_sched(&so, &k);
    mr_err err;
    mr_request rb = {.id = 2, .prompt = b, .n_prompt = SPROMPT, .max_tokens = PGEN, .stop_ids = &b_first,
                     .n_stop = 1};
    ck_assert_int_eq(mr_sched_submit(s, &rb, &err), MR_SCHED_OK);
    ck_assert_int_eq(submit(s, 1, p, SPROMPT, PGEN, NULL, NULL), MR_SCHED_OK);
    /* chunks end on a block boundary: 16 then 4 tokens of each prompt */
    ck_assert_int_eq(mr_sched_step(s, &err), 2);
    ck_assert_int_eq(mr_sched_step(s, &err), 1);
    ck_assert_int_eq(find(&k, 2)->reason, MR_SCHED_FIN_STOP);
    ck_assert_int_eq(find(&k, 1)->n, 1);
    mr_sched_stats st;
    mr_sched_get_stats(s, &st);
    ck_assert_int_eq((int)st.spec_primed, 2 * SPROMPT);
    ck_assert_int_eq((int)st.spec_steps, 0);
    ck_assert_int_eq(run_first_spec_drafts(s), 3);
    expect_tokens(&k, 1, spec_want, PGEN);
    expect_same_drafts(&got, &ref, "beside another prompt", 3);
    mr_sched_free(s);
    close_model();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("sched");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, alone_matches_transformers_greedy);
    tcase_add_test(tc, batched_joined_and_chunked_match_solo);
    tcase_add_test(tc, long_prompt_does_not_stall_decoding);
    tcase_add_test(tc, prefix_hits_isolation_and_sessions);
    tcase_add_loop_test(tc, hybrid_prefix_hits_restore_state, 0, 2);
    tcase_add_loop_test(tc, hybrid_shared_prefix_checkpoint_at_divergence, 0, 2);
    tcase_add_loop_test(tc, batchmates_wait_for_a_shared_prefix, 0, 6);
    tcase_add_test(tc, late_batchmate_takes_a_computed_prefix);
    tcase_add_test(tc, admission_refusal_recovery_and_eviction);
    tcase_add_test(tc, slots_cancellation_stop_and_errors);
    tcase_add_test(tc, seeded_sampling_is_independent_of_batchmates);
    tcase_add_test(tc, failed_step_finishes_its_requests_cleanly);
    suite_add_tcase(s, tc);
    /* many short scheduler runs per hybrid: their own, longer timeout */
    TCase *sp = tcase_create("spec");
    tcase_set_timeout(sp, 300);
    tcase_add_loop_test(sp, spec_lone_greedy_matches_plain, 0, 2);
    tcase_add_test(sp, spec_falls_back_to_batching);
    suite_add_tcase(s, sp);
    /* priming over the prompt: each hybrid as BF16 and quantized */
    TCase *pr = tcase_create("prime");
    tcase_set_timeout(pr, 300);
    tcase_add_loop_test(pr, spec_primed_in_chunks_as_standalone, 0, 4);
    tcase_add_loop_test(pr, spec_primed_after_prefix_hit, 0, 4);
    tcase_add_loop_test(pr, spec_primed_beside_another_prompt, 0, 4);
    suite_add_tcase(s, pr);
    return run_suite(s);
}

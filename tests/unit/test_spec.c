/* MTP self-speculative decoding on the CPU backend (qwen35, qwen35moe
 * fixtures): for every k in 1..8 the output equals plain greedy decoding
 * token for token — with drafts of known quality (the greedy continuation with planted
 * errors) so that full, partial and zero acceptance all occur, and for
 * k = 1 and 8 with the model's own (random-weight) MTP drafts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/fixture_ref.h"
#include "worker/spec.h"

static const char *const MODELS[] = {"qwen35", "qwen35moe"};
#define N_GEN 16

static int32_t prompt[64];
static int n_prompt;
static int32_t greedy[N_GEN];

/* Loads the model and computes the plain greedy continuation of prompt 0. */
static void open_spec_model(const char *name)
{
    reference r;
    ref_load(name, &r, 1);
    n_prompt = r.prompt_len[0];
    ck_assert(n_prompt > 0 && n_prompt <= 64);
    memcpy(prompt, r.prompt[0], sizeof(int32_t) * (size_t)n_prompt);

    static const mr_model_opts opts = {.n_ctx = 128, .n_seqs = 2};
    open_model(name, "model-BF16.gguf", &opts);
    ck_assert(mr_spec_supported(model));
    greedy_decode(prompt, n_prompt, N_GEN, greedy);
    /* the plain path itself is checked against transformers in test_qwen35 */
    json_t *want = ref_greedy(&r);
    for (int i = 0; i < N_GEN; i++)
        ck_assert_int_eq(greedy[i], json_integer_value(json_array_get(want, (size_t)i)));
    ref_free(&r);
}

/* Drafts from the true continuation, wrong where (index * 7 + salt) % 5 == 0. */
static void oracle(void *ctx, int first, int k, int32_t *draft)
{
    int salt = *(int *)ctx;
    for (int i = 0; i < k; i++) {
        int idx = first + i;
        int32_t good = idx < N_GEN ? greedy[idx] : 0;
        draft[i] = (idx * 7 + salt) % 5 == 0 ? (good + 1) % 1024 : good;
    }
}

START_TEST(spec_equals_greedy_every_k)
{
    open_spec_model(MODELS[_i]);
    mr_err err;
    int32_t out[N_GEN];
    for (int k = 1; k <= 8; k++) {
        mr_spec_stats st;
        /* the model's own drafts (nearly all rejected with random weights):
         * the shortest and the longest chain, to keep the suite fast */
        if (k == 1 || k == 8) {
            memset(out, 0xff, sizeof out);
            ck_assert_msg(mr_spec_generate(model, prompt, n_prompt, N_GEN, k, NULL, out, &st, &err) == 0,
                          "%s", err.msg);
            for (int i = 0; i < N_GEN; i++)
                ck_assert_msg(out[i] == greedy[i], "%s k=%d (MTP drafts): token %d is %d, greedy %d",
                              MODELS[_i], k, i, out[i], greedy[i]);
            ck_assert_int_gt(st.verifies, 0);
            printf("%s k=%d MTP drafts: %d/%d accepted\n", MODELS[_i], k, st.accepted, st.drafted);
        }

        int salt = k;
        mr_spec_drafter d = {oracle, &salt};
        memset(out, 0xff, sizeof out);
        ck_assert_msg(mr_spec_generate(model, prompt, n_prompt, N_GEN, k, &d, out, &st, &err) == 0,
                      "%s", err.msg);
        for (int i = 0; i < N_GEN; i++)
            ck_assert_msg(out[i] == greedy[i], "%s k=%d (planted drafts): token %d is %d, greedy %d",
                          MODELS[_i], k, i, out[i], greedy[i]);
        /* 4 of 5 drafts are right: accepted ones must show up, rejections too */
        ck_assert_int_gt(st.accepted, 0);
        ck_assert_int_lt(st.accepted, st.drafted);
        ck_assert_int_le(st.verifies, N_GEN);
        if (k > 1)
            ck_assert_int_lt(st.verifies, N_GEN - 1); /* fewer passes than plain decoding */
        printf("%s k=%d planted drafts: %d/%d accepted, %d verify passes, %d replays\n", MODELS[_i], k,
               st.accepted, st.drafted, st.verifies, st.replays);
    }
    close_model();
}
END_TEST

START_TEST(bad_arguments_are_errors)
{
    open_spec_model("qwen35");
    mr_err err;
    int32_t out[4];
    ck_assert_int_eq(mr_spec_generate(model, prompt, n_prompt, 4, 0, NULL, out, NULL, &err), -1);
    ck_assert_int_eq(mr_spec_generate(model, prompt, n_prompt, 4, 9, NULL, out, NULL, &err), -1);
    ck_assert_int_eq(mr_spec_generate(model, prompt, 0, 4, 2, NULL, out, NULL, &err), -1);
    int32_t bad = 5000;
    ck_assert_int_eq(mr_spec_generate(model, &bad, 1, 4, 2, NULL, out, NULL, &err), -1);
    ck_assert_msg(strstr(err.msg, "out of range") != NULL, "%s", err.msg);
    close_model();

    /* a model without an MTP block */
    be = mr_backend_cpu_create(&err);
    ck_assert_int_eq(mr_model_load(fixture_path("models/qwen3/model-BF16.gguf"), be, NULL, &model, &err), 0);
    ck_assert(!mr_spec_supported(model));
    ck_assert_int_eq(mr_spec_generate(model, prompt, n_prompt, 4, 2, NULL, out, NULL, &err), -1);
    ck_assert_msg(strstr(err.msg, "MTP") != NULL, "%s", err.msg);
    close_model();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("spec");
    TCase *tc = tcase_create("mtp");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, spec_equals_greedy_every_k, 0, 2);
    tcase_add_test(tc, bad_arguments_are_errors);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

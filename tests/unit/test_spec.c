/* MTP self-speculative decoding on the CPU backend (qwen35, qwen35moe
 * fixtures): for every k in 1..8 the output equals plain greedy decoding
 * token for token — with drafts of known quality (the greedy continuation with planted
 * errors) so that full, partial and zero acceptance all occur, and for
 * k = 1 and 8 with the model's own (random-weight) MTP drafts. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "tests/unit/testutil.h"
#include "worker/model.h"
#include "worker/spec.h"

static const char *const MODELS[] = {"qwen35", "qwen35moe"};
#define N_GEN 16

static mr_backend *be;
static mr_model *model;
static int32_t prompt[64];
static int n_prompt;
static int32_t greedy[N_GEN];

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Loads the model and computes the plain greedy continuation of prompt 0. */
static void open_model(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/reference.json", name);
    json_error_t jerr;
    json_t *root = json_load_file(fixture_path(rel), 0, &jerr);
    ck_assert_msg(root != NULL, "%s: %s", fixture_path(rel), jerr.text);
    json_t *ids = json_array_get(json_object_get(root, "prompts"), 0);
    n_prompt = (int)json_array_size(ids);
    ck_assert(n_prompt > 0 && n_prompt <= 64);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));

    snprintf(rel, sizeof rel, "models/%s/model-BF16.gguf", name);
    mr_err err;
    be = mr_backend_cpu_create(&err);
    ck_assert_ptr_nonnull(be);
    mr_model_opts opts = {.n_ctx = 128, .n_seqs = 2};
    ck_assert_msg(mr_model_load(fixture_path(rel), be, &opts, &model, &err) == 0, "%s", err.msg);
    ck_assert(mr_spec_supported(model));

    int V = mr_model_hparams(model)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    mr_seq *s;
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, prompt, n_prompt, MR_LOGITS_LAST, logits, &err), 0);
    for (int i = 0; i < N_GEN; i++) {
        greedy[i] = argmax(logits, V);
        if (i + 1 < N_GEN)
            ck_assert_int_eq(mr_model_forward(model, s, &greedy[i], 1, MR_LOGITS_LAST, logits, &err), 0);
    }
    /* the plain path itself is checked against transformers in test_qwen35 */
    json_t *want = json_object_get(root, "greedy_continuation_of_prompt0");
    for (int i = 0; i < N_GEN; i++)
        ck_assert_int_eq(greedy[i], json_integer_value(json_array_get(want, (size_t)i)));
    mr_seq_free(s);
    free(logits);
    json_decref(root);
}

static void close_model(void)
{
    mr_model_free(model);
    mr_backend_destroy(be);
    model = NULL;
    be = NULL;
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
    open_model(MODELS[_i]);
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
    open_model("qwen35");
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

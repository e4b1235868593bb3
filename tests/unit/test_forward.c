/* Qwen3 / Qwen3-MoE forward pass on the CPU backend against the fixtures:
 * transformers float32 logits and greedy continuation (reference.json), the
 * config transformers used, and self-consistency of prefill, chunked
 * prefill and token-by-token decode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/fixture_ref.h"

static const char *const MODELS[] = {"qwen3", "qwen3moe"};
#define N_MODELS 2

static const mr_model_opts OPTS = {.n_ctx = 256, .n_seqs = 3, .block_tokens = 16};

START_TEST(hparams_match_config)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 0);
    open_model(name, "model-BF16.gguf", &OPTS);
    const mr_hparams *hp = mr_model_hparams(model);
    json_t *c = json_object_get(r.root, "config");
#define CFG_INT(key) ((int)json_integer_value(json_object_get(c, key)))
    ck_assert_int_eq(hp->n_layers, CFG_INT("num_hidden_layers"));
    ck_assert_int_eq(hp->n_embd, CFG_INT("hidden_size"));
    ck_assert_int_eq(hp->n_heads, CFG_INT("num_attention_heads"));
    ck_assert_int_eq(hp->n_kv_heads, CFG_INT("num_key_value_heads"));
    ck_assert_int_eq(hp->head_dim, CFG_INT("head_dim"));
    ck_assert_int_eq(hp->n_vocab, CFG_INT("vocab_size"));
    ck_assert_int_eq(hp->n_ctx_train, CFG_INT("max_position_embeddings"));
    json_t *rope = json_object_get(json_object_get(c, "rope_parameters"), "rope_theta");
    ck_assert_float_eq(hp->rope_theta, (float)json_number_value(rope));
    ck_assert_float_eq(hp->rms_eps, (float)json_number_value(json_object_get(c, "rms_norm_eps")));
    if (_i == 0) {
        ck_assert_int_eq(hp->arch, MR_ARCH_QWEN3);
        ck_assert_int_eq(hp->n_ff, CFG_INT("intermediate_size"));
        ck_assert_int_eq(hp->n_expert, 0);
    } else {
        ck_assert_int_eq(hp->arch, MR_ARCH_QWEN3MOE);
        ck_assert_int_eq(hp->n_expert, CFG_INT("num_local_experts"));
        ck_assert_int_eq(hp->n_expert_used, CFG_INT("num_experts_per_tok"));
        ck_assert_int_eq(hp->n_ff_exp, CFG_INT("moe_intermediate_size"));
        ck_assert_int_eq(hp->norm_topk, json_is_true(json_object_get(c, "norm_topk_prob")));
    }
#undef CFG_INT
    close_model();
    ref_free(&r);
}
END_TEST

START_TEST(bf16_logits_match_transformers)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 0);
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    for (int p = 0; p < r.n_prompts; p++) {
        const char *file = ref_logits_file(&r, p);
        int n = r.prompt_len[p];
        float *ref = ref_read_f32(name, file, (size_t)n * (size_t)V);
        float *got = forward_all(r.prompt[p], n);
        double worst = 0;
        int worst_row = 0;
        for (int t = 0; t < n; t++) {
            double e = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
            if (e > worst) {
                worst = e;
                worst_row = t;
            }
        }
        printf("%s prompt %d (%d tokens): worst row relative L2 error %.3g (row %d)\n", name, p, n,
               worst, worst_row);
        ck_assert_msg(worst < 1e-3, "%s prompt %d row %d: relative L2 error %g", name, p, worst_row, worst);
        free(ref);
        free(got);
    }
    close_model();
    ref_free(&r);
}
END_TEST

START_TEST(greedy_continuation_matches)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 0);
    open_model(name, "model-BF16.gguf", &OPTS);
    check_greedy_continuation(name, &r);
    close_model();
    ref_free(&r);
}
END_TEST

/* One-pass prefill, three uneven chunks, and token-by-token decode of the
 * same prompt agree on every row. */
START_TEST(prefill_chunked_and_decode_agree)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 0);
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    const int32_t *tok = r.prompt[1];
    int n = r.prompt_len[1];
    float *one = forward_all(tok, n);

    int cuts[4] = {0, 5, 5 + 17, n}; /* chunks cross KV block boundaries */
    check_decode_and_chunks_agree(name, tok, n, cuts, 3, one);

    /* NONE for the first chunks and LAST at the end give the last row */
    mr_err err;
    mr_seq *s;
    float *last = malloc(sizeof(float) * (size_t)V);
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, tok, 20, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, tok + 20, n - 20, MR_LOGITS_LAST, last, &err), 0);
    ck_assert_double_lt(rel_l2(last, one + (size_t)(n - 1) * V, V), 1e-5);
    mr_seq_free(s);

    free(last);
    free(one);
    close_model();
    ref_free(&r);
}
END_TEST

/* A server's start-up step (mr_model_warmup: the largest step on a
 * throwaway sequence) leaves nothing behind: the same logits after it, bit
 * for bit, and every block back in the pool (the model's sequences can
 * still fill their whole context). */
START_TEST(warmup_leaves_no_trace)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 0);
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    const int32_t *tok = r.prompt[1];
    int n = r.prompt_len[1];
    float *before = forward_all(tok, n);
    close_model();

    open_model(name, "model-BF16.gguf", &OPTS);
    mr_err err;
    /* more than the context: capped to it; 5 rows of logits carved */
    ck_assert_msg(mr_model_warmup(model, 1000, 5, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(mr_model_warmup(model, 0, 1, &err), 0); /* nothing to do */
    float *after = forward_all(tok, n);
    ck_assert_int_eq(memcmp(before, after, sizeof(float) * (size_t)n * (size_t)V), 0);
    mr_seq *s[3];
    for (int i = 0; i < OPTS.n_seqs; i++) {
        ck_assert_int_eq(mr_seq_new(model, &s[i], &err), 0);
        ck_assert_msg(mr_seq_reserve(s[i], OPTS.n_ctx, &err) == 0, "sequence %d: %s", i, err.msg);
    }
    for (int i = 0; i < OPTS.n_seqs; i++)
        mr_seq_free(s[i]);
    free(before);
    free(after);
    close_model();
    ref_free(&r);
}
END_TEST

/* Every quantized fixture loads and gives finite logits near the reference
 * (the bound only rules out a broken path: random weights amplify
 * quantization noise, see the fixtures' README). */
START_TEST(quantized_files_run)
{
    static const char *const files[] = {"model-Q8_0.gguf", "model-Q4_K_M.gguf", "model-IQ4_XS.gguf",
                                        "model-Q4_0.gguf"};
    const char *name = MODELS[_i / 4];
    const char *file = files[_i % 4];
    reference r;
    ref_load(name, &r, 0);
    open_model(name, file, &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    int n = r.prompt_len[0];
    float *got = forward_all(r.prompt[0], n);
    float *ref = ref_read_f32(name, "ref-logits-0.f32", (size_t)n * V);
    for (size_t i = 0; i < (size_t)n * V; i++)
        ck_assert_msg(isfinite(got[i]), "%s %s: logit %zu is not finite", name, file, i);
    double err_row[64];
    ck_assert_int_le(n, 64);
    for (int t = 0; t < n; t++)
        err_row[t] = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
    qsort(err_row, (size_t)n, sizeof *err_row, cmp_double);
    printf("%s %s prompt 0: row relative L2 error median %.3g, worst %.3g\n", name, file,
           err_row[n / 2], err_row[n - 1]);
    /* unrelated logits of similar scale give ~1.4; a wrong block layout lands there */
    ck_assert_msg(err_row[n / 2] < 0.9, "%s %s: median relative error %g", name, file, err_row[n / 2]);
    free(got);
    free(ref);
    close_model();
    ref_free(&r);
}
END_TEST

START_TEST(bad_inputs_are_errors)
{
    open_model("qwen3", "model-BF16.gguf", &OPTS);
    mr_err err;
    mr_seq *s;
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    float logits[1024];
    int32_t bad[2] = {5, 1024};
    ck_assert_int_eq(mr_model_forward(model, s, bad, 2, MR_LOGITS_LAST, logits, &err), -1);
    ck_assert_msg(strstr(err.msg, "out of range") != NULL, "%s", err.msg);
    int32_t neg = -1;
    ck_assert_int_eq(mr_model_forward(model, s, &neg, 1, MR_LOGITS_LAST, logits, &err), -1);
    ck_assert_int_eq(mr_seq_len(s), 0);
    ck_assert_int_eq(mr_model_forward(model, s, bad, 0, MR_LOGITS_LAST, logits, &err), -1);
    /* past the context of the sequence */
    int32_t *many = calloc(300, sizeof(int32_t));
    ck_assert_int_eq(mr_model_forward(model, s, many, 300, MR_LOGITS_NONE, NULL, &err), -1);
    ck_assert_msg(strstr(err.msg, "context") != NULL, "%s", err.msg);
    free(many);
    /* the KV cache holds n_seqs sequences of n_ctx tokens, no more */
    mr_seq *more[3] = {0};
    int32_t fill[256] = {0};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(mr_seq_new(model, &more[i], &err), 0);
        ck_assert_int_eq(mr_model_forward(model, more[i], fill, 256, MR_LOGITS_NONE, NULL, &err), 0);
    }
    ck_assert_int_eq(mr_model_forward(model, s, fill, 256, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &more[2], &err), 0);
    ck_assert_int_eq(mr_model_forward(model, more[2], fill, 1, MR_LOGITS_NONE, NULL, &err), -1);
    ck_assert_msg(strstr(err.msg, "KV cache full") != NULL, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        mr_seq_free(more[i]);
    mr_seq_free(s);
    close_model();

    /* a missing file */
    be = mr_backend_cpu_create(&err);
    ck_assert_int_eq(mr_model_load(fixture_path("models/qwen3/no-such-file.gguf"), be, NULL, &model, &err), -1);
    ck_assert_ptr_null(model);
    ck_assert(strlen(err.msg) > 0);
    /* a GGUF that is not a qwen3 model */
    ck_assert_int_eq(mr_model_load(fixture_path("models/gemma3/model-BF16.gguf"), be, NULL, &model, &err), -1);
    ck_assert_msg(strstr(err.msg, "unknown architecture 'gemma3'") != NULL, "%s", err.msg);
    mr_backend_destroy(be);
    be = NULL;
}
END_TEST

int main(void)
{
    Suite *s = suite_create("forward");
    TCase *tc = tcase_create("qwen3");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, hparams_match_config, 0, N_MODELS);
    tcase_add_loop_test(tc, bf16_logits_match_transformers, 0, N_MODELS);
    tcase_add_loop_test(tc, greedy_continuation_matches, 0, N_MODELS);
    tcase_add_loop_test(tc, prefill_chunked_and_decode_agree, 0, N_MODELS);
    tcase_add_loop_test(tc, warmup_leaves_no_trace, 0, N_MODELS);
    tcase_add_loop_test(tc, quantized_files_run, 0, N_MODELS * 4);
    tcase_add_test(tc, bad_inputs_are_errors);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

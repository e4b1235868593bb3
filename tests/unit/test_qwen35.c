/* Qwen3.5 / Qwen3.6 hybrids (qwen35 dense, qwen35moe) on the CPU backend
 * against the fixtures: the transformers config (hf/config.json), float32
 * logits and greedy continuation (reference.json); self-consistency of
 * prefill, chunked prefill and token-by-token decode through the recurrent
 * state; state snapshots; every quantized file runs; malformed variants of
 * the file (written with the GGUF writer) are clear errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gguf.h"
#include "tests/unit/fixture_ref.h"
#include "worker/spec.h"

static const char *const MODELS[] = {"qwen35", "qwen35moe"};
#define N_MODELS 2

static const mr_model_opts OPTS = {.n_ctx = 256, .n_seqs = 4, .block_tokens = 16};

START_TEST(hparams_match_config)
{
    const char *name = MODELS[_i];
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/hf/config.json", name);
    json_error_t jerr;
    json_t *c = json_load_file(fixture_path(rel), 0, &jerr);
    ck_assert_msg(c != NULL, "%s: %s", fixture_path(rel), jerr.text);
    open_model(name, "model-BF16.gguf", &OPTS);
    const mr_hparams *hp = mr_model_hparams(model);
#define CFG_INT(key) ((int)json_integer_value(json_object_get(c, key)))
    ck_assert_int_eq(hp->arch, _i == 0 ? MR_ARCH_QWEN35 : MR_ARCH_QWEN35MOE);
    ck_assert_int_eq(hp->n_layers, CFG_INT("num_hidden_layers"));
    ck_assert_int_eq(hp->n_nextn, CFG_INT("mtp_num_hidden_layers"));
    ck_assert_int_eq(hp->n_embd, CFG_INT("hidden_size"));
    ck_assert_int_eq(hp->n_heads, CFG_INT("num_attention_heads"));
    ck_assert_int_eq(hp->n_kv_heads, CFG_INT("num_key_value_heads"));
    ck_assert_int_eq(hp->head_dim, CFG_INT("head_dim"));
    ck_assert_int_eq(hp->n_vocab, CFG_INT("vocab_size"));
    ck_assert_int_eq(hp->n_ctx_train, CFG_INT("max_position_embeddings"));
    json_t *rope = json_object_get(c, "rope_parameters");
    ck_assert_float_eq(hp->rope_theta, (float)json_number_value(json_object_get(rope, "rope_theta")));
    double prf = json_number_value(json_object_get(rope, "partial_rotary_factor"));
    ck_assert_int_eq(hp->n_rot, (int)(hp->head_dim * prf));
    ck_assert_float_eq(hp->rms_eps, (float)json_number_value(json_object_get(c, "rms_norm_eps")));
    ck_assert_int_eq(hp->ssm_d_conv, CFG_INT("linear_conv_kernel_dim"));
    ck_assert_int_eq(hp->ssm_d_state, CFG_INT("linear_key_head_dim"));
    ck_assert_int_eq(hp->ssm_n_group, CFG_INT("linear_num_key_heads"));
    ck_assert_int_eq(hp->ssm_dt_rank, CFG_INT("linear_num_value_heads"));
    ck_assert_int_eq(hp->ssm_d_inner, CFG_INT("linear_num_value_heads") * CFG_INT("linear_value_head_dim"));
    /* the layer pattern: full attention exactly where config.layer_types says */
    json_t *types = json_object_get(c, "layer_types");
    ck_assert_int_eq((int)json_array_size(types), hp->n_layers);
    int n_full = 0;
    for (int il = 0; il < hp->n_layers; il++) {
        bool full = !strcmp(json_string_value(json_array_get(types, (size_t)il)), "full_attention");
        ck_assert_int_eq(full, (il + 1) % hp->full_attn_interval == 0);
        n_full += full;
    }
    ck_assert_int_eq(hp->n_kv_layers, n_full); /* only those keep K/V */
    if (_i == 0) {
        ck_assert_int_eq(hp->n_ff, CFG_INT("intermediate_size"));
        ck_assert_int_eq(hp->n_expert, 0);
    } else {
        ck_assert_int_eq(hp->n_expert, CFG_INT("num_experts"));
        ck_assert_int_eq(hp->n_expert_used, CFG_INT("num_experts_per_tok"));
        ck_assert_int_eq(hp->n_ff_exp, CFG_INT("moe_intermediate_size"));
        ck_assert_int_eq(hp->n_ff_shexp, CFG_INT("shared_expert_intermediate_size"));
        ck_assert_int_eq(hp->norm_topk, json_is_true(json_object_get(c, "norm_topk_prob")));
    }
#undef CFG_INT
    /* conv history + delta-rule state per linear layer, float32 */
    int n_linear = hp->n_layers - hp->n_layers / hp->full_attn_interval;
    size_t conv_dim = 2 * (size_t)hp->ssm_n_group * hp->ssm_d_state + (size_t)hp->ssm_d_inner;
    size_t per = (hp->ssm_d_conv - 1) * conv_dim + (size_t)hp->ssm_d_inner * hp->ssm_d_state;
    ck_assert_uint_eq(mr_seq_state_bytes(model), n_linear * per * sizeof(float));
    close_model();
    json_decref(c);
}
END_TEST

/* Every row of every prompt within 1e-3 relative L2 of transformers. */
START_TEST(bf16_logits_match_transformers)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 3);
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    for (int p = 0; p < r.n_prompts; p++) {
        const char *file = ref_logits_file(&r, p);
        int n = r.prompt_len[p];
        float *ref = ref_read_f32(name, file, (size_t)n * (size_t)V);
        float *got = forward_all(r.prompt[p], n);
        double *e = malloc(sizeof(double) * (size_t)n);
        int worst_row = 0;
        for (int t = 0; t < n; t++) {
            e[t] = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
            if (e[t] > e[worst_row])
                worst_row = t;
            ck_assert_int_eq(argmax_f32(got + (size_t)t * V, V), argmax_f32(ref + (size_t)t * V, V));
        }
        double worst = e[worst_row];
        qsort(e, (size_t)n, sizeof *e, cmp_double);
        printf("%s prompt %d (%d tokens): row relative L2 error median %.3g, worst %.3g (row %d)\n",
               name, p, n, e[n / 2], worst, worst_row);
        ck_assert_msg(worst < 1e-3, "%s prompt %d row %d: relative L2 error %g", name, p, worst_row, worst);
        free(e);
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
    ref_load(name, &r, 3);
    open_model(name, "model-BF16.gguf", &OPTS);
    check_greedy_continuation(name, &r);
    close_model();
    ref_free(&r);
}
END_TEST

/* With the chunked form of the delta-rule scan (MEMRA_CPU_GDN_CHUNK=64, the
 * 130-token prompt 2 runs two chunks and a 2-token recurrent tail per
 * layer): every row still within 1e-3 of transformers with the same argmax,
 * and within 1e-5 relative L2 of the recurrent form's logits (measured
 * 6e-7 and 1.5e-6: the scans differ by float rounding only, docs/NUMERICS.md). */
START_TEST(chunked_scan_prefill_matches_transformers)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 3);
    const char *file = ref_logits_file(&r, 2);
    int n = r.prompt_len[2];
    ck_assert_int_ge(n, 128);
    unsetenv("MEMRA_CPU_GDN_CHUNK");
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    float *rec = forward_all(r.prompt[2], n);
    close_model();
    setenv("MEMRA_CPU_GDN_CHUNK", "64", 1);
    open_model(name, "model-BF16.gguf", &OPTS);
    float *got = forward_all(r.prompt[2], n);
    close_model();
    unsetenv("MEMRA_CPU_GDN_CHUNK");
    float *ref = ref_read_f32(name, file, (size_t)n * (size_t)V);
    double worst = 0, worst_rec = 0;
    for (int t = 0; t < n; t++) {
        double e = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
        double d = rel_l2(got + (size_t)t * V, rec + (size_t)t * V, V);
        worst = e > worst ? e : worst;
        worst_rec = d > worst_rec ? d : worst_rec;
        ck_assert_int_eq(argmax_f32(got + (size_t)t * V, V), argmax_f32(ref + (size_t)t * V, V));
    }
    printf("%s prompt 2 chunked scan: worst row error vs transformers %.3g, vs recurrent %.3g\n", name,
           worst, worst_rec);
    ck_assert_msg(worst < 1e-3, "%s: chunked scan row error %g", name, worst);
    ck_assert_msg(worst_rec < 1e-5, "%s: chunked vs recurrent row error %g", name, worst_rec);
    free(rec);
    free(got);
    free(ref);
    ref_free(&r);
}
END_TEST

/* One-pass prefill, uneven chunks (one shorter than the conv kernel) and
 * token-by-token decode agree on every row: the recurrent state carries
 * exactly what the next call needs. */
START_TEST(prefill_chunked_and_decode_agree)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 3);
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    const int32_t *tok = r.prompt[1];
    int n = r.prompt_len[1];
    float *one = forward_all(tok, n);

    int cuts[5] = {0, 5, 7, 7 + 17, n};
    check_decode_and_chunks_agree(name, tok, n, cuts, 4, one);

    /* two sequences interleaved do not share recurrent state */
    mr_err err;
    mr_seq *a, *b;
    float *la = malloc(sizeof(float) * (size_t)V);
    ck_assert_int_eq(mr_seq_new(model, &a, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, a, tok, 10, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, b, r.prompt[2], 10, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, a, tok + 10, n - 10, MR_LOGITS_LAST, la, &err), 0);
    ck_assert_double_lt(rel_l2(la, one + (size_t)(n - 1) * V, V), 1e-5);
    mr_seq_free(a);
    mr_seq_free(b);

    /* one batched step over two sequences (a's continuation with all its
     * logits, a fresh one's prompt with the argmax of its last row) gives
     * what each gives alone; the argmax is that of its own last row */
    int32_t ref_id = -1, got_id = -1;
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, b, r.prompt[2], 10, MR_LOGITS_LAST, la, &err), 0);
    ref_id = argmax_f32(la, V);
    mr_seq_free(b);
    ck_assert_int_eq(mr_seq_new(model, &a, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, a, tok, 10, MR_LOGITS_NONE, NULL, &err), 0);
    float *rest = malloc(sizeof(float) * (size_t)(n - 10) * (size_t)V);
    mr_batch_item items[2] = {
        {.seq = a, .tokens = tok + 10, .n = n - 10, .mode = MR_LOGITS_ALL, .logits = rest},
        {.seq = b, .tokens = r.prompt[2], .n = 10, .mode = MR_LOGITS_ARGMAX, .argmax = &got_id},
    };
    ck_assert_msg(mr_model_forward_batch(model, items, 2, &err) == 0, "%s", err.msg);
    for (int t = 10; t < n; t++)
        ck_assert_msg(rel_l2(rest + (size_t)(t - 10) * V, one + (size_t)t * V, V) < 1e-5, "%s batched row %d",
                      name, t);
    ck_assert_int_eq(got_id, ref_id);
    ck_assert_int_eq(mr_seq_len(a), n);
    ck_assert_int_eq(mr_seq_len(b), 10);
    mr_seq_free(a);
    mr_seq_free(b);
    free(rest);
    free(la);
    free(one);
    close_model();
    ref_free(&r);
}
END_TEST

/* A state snapshot taken after 20 tokens, restored over a clobbered state,
 * gives back the row the uninterrupted sequence gives. */
START_TEST(state_snapshot_restores)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 3);
    open_model(name, "model-BF16.gguf", &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    const int32_t *tok = r.prompt[1];
    float *one = forward_all(tok, 21);
    size_t bytes = mr_seq_state_bytes(model);
    ck_assert_uint_gt(bytes, 0);
    void *snap = malloc(bytes), *zeros = calloc(1, bytes);
    float *row = malloc(sizeof(float) * (size_t)V);
    mr_err err;
    mr_seq *s;

    /* clobbered: the next row is wrong */
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, tok, 20, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_seq_state_save(s, snap, &err), 0);
    ck_assert_int_eq(mr_seq_state_load(s, zeros, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, tok + 20, 1, MR_LOGITS_LAST, row, &err), 0);
    ck_assert_double_gt(rel_l2(row, one + (size_t)20 * V, V), 1e-3);
    mr_seq_free(s);

    /* restored: the row is back */
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, tok, 20, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_seq_state_load(s, zeros, &err), 0);
    ck_assert_int_eq(mr_seq_state_load(s, snap, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, s, tok + 20, 1, MR_LOGITS_LAST, row, &err), 0);
    ck_assert_double_lt(rel_l2(row, one + (size_t)20 * V, V), 1e-6);
    mr_seq_free(s);

    free(snap);
    free(zeros);
    free(row);
    free(one);
    close_model();
    ref_free(&r);
}
END_TEST

/* A sequence's state buffer goes back to the model when it is freed and
 * the next sequence takes it (worker/model.c spare_take): the next one must
 * still start from a zero state, and its logits must be transformers' as
 * from a fresh model.  The same for a checkpoint state a prefix cache gave
 * back (mr_model_state_free) and a new sequence then takes. */
START_TEST(reused_state_starts_at_zero)
{
    const char *name = MODELS[_i];
    reference r;
    ref_load(name, &r, 3);
    open_model(name, "model-BF16.gguf", &OPTS);
    const int V = mr_model_hparams(model)->n_vocab, n = r.prompt_len[0];
    const size_t bytes = mr_seq_state_bytes(model);
    unsigned char *got = malloc(bytes), *zeros = calloc(1, bytes);
    mr_err err;
    for (int round = 0; round < 2; round++) {
        /* round 0: a sequence's buffers; round 1: a cache state's too */
        mr_seq *s;
        ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
        ck_assert_int_eq(mr_model_forward(model, s, r.prompt[1], 20, MR_LOGITS_NONE, NULL, &err), 0);
        ck_assert_int_eq(mr_seq_state_save(s, got, &err), 0);
        ck_assert_msg(memcmp(got, zeros, bytes) != 0, "20 tokens left the state zero");
        void *cached = NULL;
        if (round == 1) {
            cached = mr_model_state_alloc(model);
            ck_assert_ptr_nonnull(cached);
            mr_seq_state_copy_out(s, cached);
        }
        mr_seq_free(s);
        mr_model_state_free(model, cached);
        ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
        ck_assert_int_eq(mr_seq_state_save(s, got, &err), 0);
        ck_assert_msg(memcmp(got, zeros, bytes) == 0, "round %d: a new sequence's state is not zero", round);
        float *logits = malloc(sizeof(float) * (size_t)n * (size_t)V);
        float *ref = ref_read_f32(name, ref_logits_file(&r, 0), (size_t)n * (size_t)V);
        ck_assert_int_eq(mr_model_forward(model, s, r.prompt[0], n, MR_LOGITS_ALL, logits, &err), 0);
        for (int t = 0; t < n; t++) {
            const double e = rel_l2(logits + (size_t)t * V, ref + (size_t)t * V, V);
            ck_assert_msg(e < 1e-3, "%s round %d row %d: relative L2 error %g", name, round, t, e);
        }
        free(logits);
        free(ref);
        mr_seq_free(s);
    }
    free(got);
    free(zeros);
    close_model();
    ref_free(&r);
}
END_TEST

/* Every quantized file loads and gives finite logits; the bound only rules
 * out a broken path (random weights amplify quantization noise through the
 * recurrent layers: the fixtures README lists upstream's errors). */
START_TEST(quantized_files_run)
{
    static const char *const files[] = {"model-Q8_0.gguf", "model-Q4_K_M.gguf", "model-IQ4_XS.gguf",
                                        "model-Q4_0.gguf"};
    const char *name = MODELS[_i / 4];
    const char *file = files[_i % 4];
    reference r;
    ref_load(name, &r, 3);
    open_model(name, file, &OPTS);
    int V = mr_model_hparams(model)->n_vocab;
    int n = r.prompt_len[0];
    float *got = forward_all(r.prompt[0], n);
    float *ref = ref_read_f32(name, "ref-logits-0.f32", (size_t)n * V);
    for (size_t i = 0; i < (size_t)n * V; i++)
        ck_assert_msg(isfinite(got[i]), "%s %s: logit %zu is not finite", name, file, i);
    double *e = malloc(sizeof(double) * (size_t)n);
    for (int t = 0; t < n; t++)
        e[t] = rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V);
    qsort(e, (size_t)n, sizeof *e, cmp_double);
    printf("%s %s prompt 0: row relative L2 error median %.3g, worst %.3g\n", name, file, e[n / 2],
           e[n - 1]);
    /* unrelated logits of similar scale give ~1.4; a wrong block layout lands there */
    ck_assert_msg(e[n / 2] < 1.0, "%s %s: median relative error %g", name, file, e[n / 2]);
    free(e);
    free(got);
    free(ref);
    close_model();
    ref_free(&r);
}
END_TEST

START_TEST(backend_without_gdn_ops_is_refused)
{
    mr_err err;
    be = mr_backend_cpu_create(&err);
    ck_assert_ptr_nonnull(be);
    be->gdn_scan = NULL;
    ck_assert_int_eq(mr_model_load(fixture_path("models/qwen35/model-BF16.gguf"), be, NULL, &model, &err), -1);
    ck_assert_ptr_null(model);
    ck_assert_msg(strstr(err.msg, "Gated DeltaNet") != NULL, "%s", err.msg);
    mr_backend_destroy(be);
    be = NULL;
}
END_TEST

/* One change to the qwen35 BF16 file. */
typedef struct {
    const char *drop_key;      /* metadata key left out */
    const char *set_key;       /* u32 metadata key given set_val */
    uint32_t set_val;
    const char *drop_tensors;  /* tensors whose name contains this are left out */
    const char *reshape;       /* tensor whose ne[0], ne[1] become (ne[0] * 2, ne[1] / 2) */
} variant;

static const char *write_variant(const variant *v)
{
    static char path[64];
    strcpy(path, "/tmp/memra-q35-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mr_err err;
    mr_gguf *src;
    ck_assert_msg(mr_gguf_open(fixture_path("models/qwen35/model-BF16.gguf"), &src, &err) == 0, "%s", err.msg);
    mr_gguf_writer *w = mr_gguf_writer_new();
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const mr_gguf_kv *kv = &src->kv[i];
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (v->drop_key && !strcmp(key, v->drop_key))
            continue;
        if (v->set_key && !strcmp(key, v->set_key))
            ck_assert_int_eq(mr_gguf_writer_set_u32(w, key, v->set_val), 0);
        else
            ck_assert_int_eq(mr_gguf_writer_copy_kv(w, kv), 0);
    }
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const mr_gguf_tensor *t = &src->tensors[i];
        if (v->drop_tensors && strstr(t->name, v->drop_tensors))
            continue;
        int64_t ne[MR_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        if (v->reshape && !strcmp(t->name, v->reshape)) {
            ne[0] *= 2;
            ne[1] /= 2;
        }
        ck_assert_int_eq(mr_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne,
                                                   t->data), 0);
    }
    ck_assert_msg(mr_gguf_writer_write(w, path, &err) == 0, "%s", err.msg);
    mr_gguf_writer_free(w);
    mr_gguf_close(src);
    return path;
}

static void expect_load_error(const variant *v, const char *want)
{
    const char *path = write_variant(v);
    mr_err err = {{0}};
    be = mr_backend_cpu_create(&err);
    ck_assert_int_eq(mr_model_load(path, be, NULL, &model, &err), -1);
    ck_assert_ptr_null(model);
    ck_assert_msg(strstr(err.msg, want) != NULL, "got '%s', want '%s'", err.msg, want);
    mr_backend_destroy(be);
    be = NULL;
    unlink(path);
}

START_TEST(malformed_files_are_errors)
{
    expect_load_error(&(variant){.drop_key = "qwen35.ssm.state_size"},
                      "missing metadata key 'qwen35.ssm.state_size'");
    /* 4 value heads cannot pair with 3 key heads */
    expect_load_error(&(variant){.set_key = "qwen35.ssm.group_count", .set_val = 3},
                      "need value heads a multiple of groups");
    expect_load_error(&(variant){.set_key = "qwen35.nextn_predict_layers", .set_val = 5},
                      "nextn_predict_layers 5 leaves no trunk");
    expect_load_error(&(variant){.set_key = "qwen35.full_attention_interval", .set_val = 0},
                      "unsupported linear-attention shape");
    expect_load_error(&(variant){.drop_tensors = "blk.1.ssm_norm"}, "missing tensor 'blk.1.ssm_norm.weight'");
    expect_load_error(&(variant){.drop_tensors = "blk.2.ssm_dt.bias"}, "missing tensor 'blk.2.ssm_dt.bias'");
    expect_load_error(&(variant){.reshape = "blk.0.ssm_conv1d.weight"}, "'blk.0.ssm_conv1d.weight' has shape");
    expect_load_error(&(variant){.reshape = "blk.3.attn_q.weight"}, "'blk.3.attn_q.weight' has shape");
    expect_load_error(&(variant){.drop_tensors = "blk.4.nextn.enorm"}, "missing tensor 'blk.4.nextn.enorm.weight'");
}
END_TEST

/* A file converted without the MTP tensors still runs; it just has no drafts. */
START_TEST(file_without_mtp_tensors_runs)
{
    const char *path = write_variant(&(variant){.drop_tensors = "blk.4."});
    mr_err err;
    be = mr_backend_cpu_create(&err);
    ck_assert_msg(mr_model_load(path, be, NULL, &model, &err) == 0, "%s", err.msg);
    ck_assert(!mr_spec_supported(model));
    reference r;
    ref_load("qwen35", &r, 3);
    int V = mr_model_hparams(model)->n_vocab;
    float *got = forward_all(r.prompt[0], r.prompt_len[0]);
    float *ref = ref_read_f32("qwen35", "ref-logits-0.f32", (size_t)r.prompt_len[0] * V);
    for (int t = 0; t < r.prompt_len[0]; t++)
        ck_assert_double_lt(rel_l2(got + (size_t)t * V, ref + (size_t)t * V, V), 1e-3);
    free(got);
    free(ref);
    ref_free(&r);
    close_model();
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("qwen35");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, hparams_match_config, 0, N_MODELS);
    tcase_add_loop_test(tc, bf16_logits_match_transformers, 0, N_MODELS);
    tcase_add_loop_test(tc, greedy_continuation_matches, 0, N_MODELS);
    tcase_add_loop_test(tc, prefill_chunked_and_decode_agree, 0, N_MODELS);
    tcase_add_loop_test(tc, chunked_scan_prefill_matches_transformers, 0, N_MODELS);
    tcase_add_loop_test(tc, state_snapshot_restores, 0, N_MODELS);
    tcase_add_loop_test(tc, reused_state_starts_at_zero, 0, N_MODELS);
    tcase_add_loop_test(tc, quantized_files_run, 0, N_MODELS * 4);
    tcase_add_test(tc, backend_without_gdn_ops_is_refused);
    tcase_add_test(tc, malformed_files_are_errors);
    tcase_add_test(tc, file_without_mtp_tensors_runs);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

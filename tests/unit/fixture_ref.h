/* Shared pieces of the suites that run the fixture models on the CPU
 * backend: reading a model's reference.json (prompts, logits files, greedy
 * continuation) and its float32 reference logits, one model held open,
 * logits of a whole prompt, and greedy decoding through the plain
 * one-sequence API. */
#ifndef MR_FIXTURE_REF_H
#define MR_FIXTURE_REF_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/ops.h"
#include "tests/unit/testutil.h"
#include "worker/model.h"

#define REF_MAX_PROMPTS 3

typedef struct {
    json_t *root;
    int n_prompts;
    int32_t *prompt[REF_MAX_PROMPTS];
    int prompt_len[REF_MAX_PROMPTS];
} reference;

/* Loads models/NAME/reference.json; it must hold between min_prompts and
 * REF_MAX_PROMPTS prompts. */
static inline void ref_load(const char *name, reference *r, int min_prompts)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/reference.json", name);
    json_error_t jerr;
    r->root = json_load_file(fixture_path(rel), 0, &jerr);
    ck_assert_msg(r->root != NULL, "%s: %s", fixture_path(rel), jerr.text);
    json_t *prompts = json_object_get(r->root, "prompts");
    ck_assert(json_is_array(prompts) && json_array_size(prompts) <= REF_MAX_PROMPTS &&
              json_array_size(prompts) >= (size_t)min_prompts);
    r->n_prompts = (int)json_array_size(prompts);
    for (int p = 0; p < r->n_prompts; p++) {
        json_t *ids = json_array_get(prompts, (size_t)p);
        r->prompt_len[p] = (int)json_array_size(ids);
        r->prompt[p] = malloc(sizeof(int32_t) * (size_t)r->prompt_len[p]);
        for (int i = 0; i < r->prompt_len[p]; i++)
            r->prompt[p][i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    }
}

static inline void ref_free(reference *r)
{
    for (int p = 0; p < r->n_prompts; p++)
        free(r->prompt[p]);
    json_decref(r->root);
}

/* The reference logits file of prompt P (logits_files[P].file). */
static inline const char *ref_logits_file(const reference *r, int p)
{
    json_t *files = json_object_get(r->root, "logits_files");
    return json_string_value(json_object_get(json_array_get(files, (size_t)p), "file"));
}

/* greedy_continuation_of_prompt0 */
static inline json_t *ref_greedy(const reference *r)
{
    return json_object_get(r->root, "greedy_continuation_of_prompt0");
}

/* models/NAME/FILE: exactly COUNT float32 values ([n_tokens, vocab]). */
static inline float *ref_read_f32(const char *name, const char *file, size_t count)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/%s", name, file);
    FILE *f = fopen(fixture_path(rel), "rb");
    ck_assert_msg(f != NULL, "cannot open %s", fixture_path(rel));
    float *v = malloc(sizeof(float) * count);
    ck_assert_uint_eq(fread(v, sizeof(float), count, f), count);
    ck_assert_int_eq(fgetc(f), EOF);
    fclose(f);
    return v;
}

/* qsort comparator for ascending doubles. */
static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The one model a test works on, and its backend. */
static mr_backend *be;
static mr_model *model;

/* Opens models/NAME/FILE on a new CPU backend (opts may be NULL). */
static inline void open_model(const char *name, const char *file, const mr_model_opts *opts)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/%s", name, file);
    mr_err err;
    be = mr_backend_cpu_create(&err);
    ck_assert_msg(be != NULL, "%s", err.msg);
    ck_assert_msg(mr_model_load(fixture_path(rel), be, opts, &model, &err) == 0, "%s", err.msg);
}

static inline void close_model(void)
{
    mr_model_free(model);
    mr_backend_destroy(be);
    model = NULL;
    be = NULL;
}

/* Runs tokens through a new sequence and returns [n][vocab] logits. */
static inline float *forward_all(const int32_t *tokens, int n)
{
    mr_err err;
    mr_seq *s;
    ck_assert_msg(mr_seq_new(model, &s, &err) == 0, "%s", err.msg);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)mr_model_hparams(model)->n_vocab);
    ck_assert_msg(mr_model_forward(model, s, tokens, n, MR_LOGITS_ALL, logits, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(mr_seq_len(s), n);
    mr_seq_free(s);
    return logits;
}

/* N pseudo-random ids below vocab from SEED (a fixed LCG: the same prompt on
 * every run). */
static inline void lcg_prompt(int32_t *t, int n, uint32_t seed, int vocab)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
    }
}

/* Greedy generation of n_gen ids with the plain one-sequence API: the
 * prompt in one call, then one token a call. */
static inline void greedy_decode(const int32_t *prompt, int n_prompt, int n_gen, int32_t *out)
{
    int V = mr_model_hparams(model)->n_vocab;
    mr_err err;
    mr_seq *s;
    ck_assert_msg(mr_seq_new(model, &s, &err) == 0, "%s", err.msg);
    float *lg = malloc(sizeof(float) * (size_t)V);
    ck_assert_msg(mr_model_forward(model, s, prompt, n_prompt, MR_LOGITS_LAST, lg, &err) == 0, "%s", err.msg);
    for (int i = 0; i < n_gen; i++) {
        out[i] = argmax_f32(lg, V);
        if (i + 1 < n_gen)
            ck_assert_msg(mr_model_forward(model, s, &out[i], 1, MR_LOGITS_LAST, lg, &err) == 0, "%s",
                          err.msg);
    }
    free(lg);
    mr_seq_free(s);
}

/* Token-by-token decode of tok[0..n) and its prefill in the chunks
 * cuts[c]..cuts[c+1] (c < n_chunks) give the rows of ONE, the logits of a
 * one-pass prefill: every row within relative L2 1e-5, with the same argmax. */
static inline void check_decode_and_chunks_agree(const char *name, const int32_t *tok, int n, const int *cuts,
                                                 int n_chunks, const float *one)
{
    int V = mr_model_hparams(model)->n_vocab;
    mr_err err;
    mr_seq *s;
    float *step = malloc(sizeof(float) * (size_t)n * V);
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    for (int t = 0; t < n; t++)
        ck_assert_msg(mr_model_forward(model, s, tok + t, 1, MR_LOGITS_LAST, step + (size_t)t * V, &err) == 0,
                      "%s", err.msg);
    mr_seq_free(s);

    float *chunked = malloc(sizeof(float) * (size_t)n * V);
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    for (int c = 0; c < n_chunks; c++)
        ck_assert_msg(mr_model_forward(model, s, tok + cuts[c], cuts[c + 1] - cuts[c], MR_LOGITS_ALL,
                                       chunked + (size_t)cuts[c] * V, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(mr_seq_len(s), n);
    mr_seq_free(s);

    for (int t = 0; t < n; t++) {
        double e1 = rel_l2(step + (size_t)t * V, one + (size_t)t * V, V);
        double e2 = rel_l2(chunked + (size_t)t * V, one + (size_t)t * V, V);
        ck_assert_msg(e1 < 1e-5 && e2 < 1e-5, "%s row %d: decode %g, chunked %g", name, t, e1, e2);
        ck_assert_int_eq(argmax_f32(step + (size_t)t * V, V), argmax_f32(one + (size_t)t * V, V));
        ck_assert_int_eq(argmax_f32(chunked + (size_t)t * V, V), argmax_f32(one + (size_t)t * V, V));
    }
    free(chunked);
    free(step);
}

/* Greedy decoding of prompt 0 gives transformers' continuation, id for id
 * (each generated id is fed back, the last one included). */
static inline void check_greedy_continuation(const char *name, const reference *r)
{
    int V = mr_model_hparams(model)->n_vocab;
    json_t *want = ref_greedy(r);
    int n_gen = (int)json_array_size(want);
    ck_assert_int_gt(n_gen, 0);
    mr_err err;
    mr_seq *s;
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    float *logits = malloc(sizeof(float) * (size_t)V);
    ck_assert_msg(mr_model_forward(model, s, r->prompt[0], r->prompt_len[0], MR_LOGITS_LAST, logits, &err) == 0,
                  "%s", err.msg);
    for (int i = 0; i < n_gen; i++) {
        int32_t next = argmax_f32(logits, V);
        ck_assert_msg(next == json_integer_value(json_array_get(want, (size_t)i)),
                      "%s: generated token %d is %d, transformers gave %lld", name, i, next,
                      (long long)json_integer_value(json_array_get(want, (size_t)i)));
        ck_assert_int_eq(mr_model_forward(model, s, &next, 1, MR_LOGITS_LAST, logits, &err), 0);
    }
    free(logits);
    mr_seq_free(s);
}

#endif

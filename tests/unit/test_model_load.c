/* Model loading from GGUF variants of the qwen3 fixture written with the
 * GGUF writer: every missing key, missing tensor, wrong shape or unknown
 * architecture is a clear error, and a file without output.weight uses the
 * token embeddings as the output head (tied embeddings). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/gguf.h"
#include "kernels/ops.h"
#include "tests/unit/testutil.h"
#include "worker/model.h"

static char dir[64];
static mr_gguf *src;
static mr_backend *be;

static void setup(void)
{
    mr_err err;
    strcpy(dir, "/tmp/memra-model-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_msg(mr_gguf_open(fixture_path("models/qwen3/model-BF16.gguf"), &src, &err) == 0, "%s", err.msg);
    be = mr_backend_cpu_create(&err);
    ck_assert_ptr_nonnull(be);
}

static void teardown(void)
{
    mr_backend_destroy(be);
    mr_gguf_close(src);
    rmdir(dir);
}

/* One change to the source file. */
typedef struct {
    const char *drop_key;       /* metadata key left out */
    const char *arch;           /* general.architecture replaced */
    const char *drop_tensor;    /* tensor left out */
    const char *reshape_tensor; /* tensor whose ne[0], ne[1] are swapped to (ne[0]/2, ne[1]*2) */
    const char *data_from[2];   /* tensor [0] gets the bytes of tensor [1] */
} variant;

static const char *write_variant(const variant *v, const char *name)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    mr_gguf_writer *w = mr_gguf_writer_new();
    ck_assert_ptr_nonnull(w);
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const mr_gguf_kv *kv = &src->kv[i];
        if (v->drop_key && kv->key.len == strlen(v->drop_key) && !memcmp(kv->key.ptr, v->drop_key, kv->key.len))
            continue;
        if (v->arch && kv->key.len == 20 && !memcmp(kv->key.ptr, "general.architecture", 20)) {
            ck_assert_int_eq(mr_gguf_writer_set_str(w, "general.architecture", v->arch), 0);
            continue;
        }
        ck_assert_int_eq(mr_gguf_writer_copy_kv(w, kv), 0);
    }
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const mr_gguf_tensor *t = &src->tensors[i];
        if (v->drop_tensor && !strcmp(t->name, v->drop_tensor))
            continue;
        int64_t ne[MR_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        uint32_t n_dims = t->n_dims;
        if (v->reshape_tensor && !strcmp(t->name, v->reshape_tensor)) {
            ne[0] /= 2;
            ne[1] *= 2;
            n_dims = n_dims < 2 ? 2 : n_dims;
        }
        const void *data = t->data;
        if (v->data_from[0] && !strcmp(t->name, v->data_from[0])) {
            const mr_gguf_tensor *o = mr_gguf_find_tensor(src, v->data_from[1]);
            ck_assert(o && o->nbytes == t->nbytes && o->type == t->type);
            data = o->data;
        }
        ck_assert_int_eq(mr_gguf_writer_add_tensor(w, t->name, t->type, n_dims, ne, data), 0);
    }
    mr_err err;
    ck_assert_msg(mr_gguf_writer_write(w, path, &err) == 0, "%s", err.msg);
    mr_gguf_writer_free(w);
    return path;
}

static void expect_load_error(const variant *v, const char *name, const char *want)
{
    const char *path = write_variant(v, name);
    mr_model *m = NULL;
    mr_err err = {{0}};
    ck_assert_int_eq(mr_model_load(path, be, NULL, &m, &err), -1);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s: got '%s', want '%s'", name, err.msg, want);
    ck_assert_ptr_null(strchr(err.msg, '\n'));
    unlink(path);
}

START_TEST(missing_key)
{
    variant v = {.drop_key = "qwen3.attention.head_count"};
    expect_load_error(&v, "nokey", "missing metadata key 'qwen3.attention.head_count'");
    variant v2 = {.drop_key = "general.architecture"};
    expect_load_error(&v2, "noarch", "missing metadata key 'general.architecture'");
    variant v3 = {.drop_key = "qwen3.rope.freq_base"};
    expect_load_error(&v3, "norope", "'qwen3.rope.freq_base'");
}
END_TEST

START_TEST(unknown_architecture)
{
    variant v = {.arch = "llama"};
    expect_load_error(&v, "llama", "unknown architecture 'llama' (supported: qwen3, qwen3moe, qwen35, qwen35moe)");
}
END_TEST

START_TEST(missing_tensor)
{
    variant v = {.drop_tensor = "blk.1.attn_v.weight"};
    expect_load_error(&v, "nov", "missing tensor 'blk.1.attn_v.weight'");
    variant v2 = {.drop_tensor = "output_norm.weight"};
    expect_load_error(&v2, "nonorm", "missing tensor 'output_norm.weight'");
}
END_TEST

START_TEST(wrong_shape)
{
    variant v = {.reshape_tensor = "blk.0.ffn_up.weight"};
    expect_load_error(&v, "shape", "tensor 'blk.0.ffn_up.weight' has shape [128, 1024, 1, 1], expected [256, 512, 1]");
    variant v2 = {.reshape_tensor = "blk.0.attn_q_norm.weight"};
    expect_load_error(&v2, "normshape", "tensor 'blk.0.attn_q_norm.weight' has shape");
}
END_TEST

/* A: token_embd holds output's bytes and output.weight is absent (tied).
 * B: the same bytes in both tensors.  Both must give identical logits. */
START_TEST(tied_embeddings)
{
    variant tied = {.drop_tensor = "output.weight", .data_from = {"token_embd.weight", "output.weight"}};
    variant both = {.data_from = {"token_embd.weight", "output.weight"}};
    char path_a[128], path_b[128];
    snprintf(path_a, sizeof path_a, "%s", write_variant(&tied, "tied"));
    snprintf(path_b, sizeof path_b, "%s", write_variant(&both, "both"));
    int32_t tok[5] = {949, 631, 690, 901, 584};
    float *logits[2];
    const char *paths[2] = {path_a, path_b};
    for (int i = 0; i < 2; i++) {
        mr_model *m;
        mr_seq *s;
        mr_err err;
        ck_assert_msg(mr_model_load(paths[i], be, NULL, &m, &err) == 0, "%s", err.msg);
        int V = mr_model_hparams(m)->n_vocab;
        ck_assert_int_eq(V, 1024);
        logits[i] = malloc(sizeof(float) * 5 * (size_t)V);
        ck_assert_int_eq(mr_seq_new(m, &s, &err), 0);
        ck_assert_msg(mr_model_forward(m, s, tok, 5, MR_LOGITS_ALL, logits[i], &err) == 0, "%s", err.msg);
        mr_seq_free(s);
        mr_model_free(m);
    }
    ck_assert(memcmp(logits[0], logits[1], sizeof(float) * 5 * 1024) == 0);
    free(logits[0]);
    free(logits[1]);
    unlink(path_a);
    unlink(path_b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_load");
    TCase *tc = tcase_create("variants");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, missing_key);
    tcase_add_test(tc, unknown_architecture);
    tcase_add_test(tc, missing_tensor);
    tcase_add_test(tc, wrong_shape);
    tcase_add_test(tc, tied_embeddings);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

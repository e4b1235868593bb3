/* Dequantization against upstream-made files: every quantized tensor of
 * every fixture model (quantized by upstream llama-quantize) must decode to
 * the same tensor of that model's BF16 file within quantization error.  A
 * wrong layout gives a relative L2 error of ~1 or more. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/gguf.h"
#include "common/quant.h"
#include "tests/unit/testutil.h"

static const char *const models[] = {"qwen3", "qwen3moe", "qwen35", "qwen35moe", "gemma3"};
static const char *const variants[] = {"Q8_0", "Q4_K_M", "IQ4_XS", "Q4_0"};

/* Relative L2 bound per tensor type: 8-bit < 0.01 and 4-5 bit < 0.15 (the
 * fixtures measure ~0.006 and ~0.09); float types only round. */
static double bound_for(int type)
{
    switch (type) {
    case MR_TYPE_F32:
    case MR_TYPE_BF16:
    case MR_TYPE_F16:
        return 1e-3;
    case MR_TYPE_Q8_0:
        return 0.01;
    case MR_TYPE_Q6_K:
        return 0.05;
    case MR_TYPE_Q4_0:
    case MR_TYPE_Q4_1:
    case MR_TYPE_Q5_0:
    case MR_TYPE_Q5_1:
    case MR_TYPE_Q4_K:
    case MR_TYPE_Q5_K:
    case MR_TYPE_IQ4_NL:
    case MR_TYPE_IQ4_XS:
    case MR_TYPE_MXFP4:
    case MR_TYPE_NVFP4:
        return 0.15;
    case MR_TYPE_Q3_K:
        return 0.3;
    case MR_TYPE_Q2_K:
        return 0.5;
    default:
        return -1; /* no bound: a type we do not expect in these files */
    }
}

typedef struct type_stats {
    int n;
    double worst;
    char where[600];
    double worst_ratio; /* our quantizer's error over upstream's, worst tensor */
} type_stats;

static int64_t n_elems(const mr_gguf_tensor *t)
{
    int64_t n = 1;
    for (uint32_t d = 0; d < MR_GGUF_MAX_DIMS; d++)
        n *= t->ne[d];
    return n;
}

/* Dequantizes a whole tensor row by row into a new buffer. */
static float *dequantize_tensor(const mr_gguf_tensor *t)
{
    const int64_t n = n_elems(t), row = t->ne[0];
    const size_t rb = mr_row_size(t->type, row);
    ck_assert_msg(rb > 0, "%s: type %s, row of %lld has no size", t->name, mr_type_name(t->type),
                  (long long)row);
    ck_assert_msg(rb * (size_t)(n / row) == t->nbytes, "%s: %zu bytes, want %zu", t->name,
                  t->nbytes, rb * (size_t)(n / row));
    float *out = malloc(sizeof(float) * (size_t)n);
    ck_assert_ptr_nonnull(out);
    for (int64_t r = 0; r < n / row; r++)
        ck_assert_msg(mr_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb,
                                        out + r * row, row) == 0,
                      "%s: cannot dequantize type %s", t->name, mr_type_name(t->type));
    return out;
}

/* Round trip of the reference values through our own quantizer. */
static double our_error(int type, const float *ref, int64_t n, int64_t row)
{
    const size_t rb = mr_row_size(type, row);
    uint8_t *q = malloc(rb * (size_t)(n / row));
    float *y = malloc(sizeof(float) * (size_t)n);
    ck_assert(q && y);
    for (int64_t r = 0; r < n / row; r++) {
        ck_assert_uint_eq(mr_quantize_row(type, ref + r * row, q + (size_t)r * rb, row), rb);
        ck_assert_int_eq(mr_dequantize_row(type, q + (size_t)r * rb, y + r * row, row), 0);
    }
    double e = rel_l2(y, ref, n);
    free(q);
    free(y);
    return e;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

START_TEST(fixtures_match_bf16)
{
    type_stats st[MR_TYPE_COUNT];
    memset(st, 0, sizeof st);
    int files = 0;
    char rel[256];
    mr_err err;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        snprintf(rel, sizeof rel, "models/%s/model-BF16.gguf", models[m]);
        mr_gguf *ref = NULL;
        ck_assert_msg(mr_gguf_open(fixture_path(rel), &ref, &err) == 0, "%s: %s", rel, err.msg);
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            snprintf(rel, sizeof rel, "models/%s/model-%s.gguf", models[m], variants[v]);
            if (!file_exists(fixture_path(rel)))
                continue; /* gemma3 has Q8_0 and Q4_0 only */
            mr_gguf *g = NULL;
            ck_assert_msg(mr_gguf_open(fixture_path(rel), &g, &err) == 0, "%s: %s", rel, err.msg);
            files++;
            for (uint64_t i = 0; i < g->n_tensors; i++) {
                const mr_gguf_tensor *t = &g->tensors[i];
                const mr_gguf_tensor *r = mr_gguf_find_tensor(ref, t->name);
                ck_assert_msg(r != NULL, "%s: tensor %s not in the BF16 file", rel, t->name);
                for (int d = 0; d < MR_GGUF_MAX_DIMS; d++)
                    ck_assert_msg(t->ne[d] == r->ne[d], "%s: %s shape differs in dim %d", rel,
                                  t->name, d);
                const double bound = bound_for(t->type);
                ck_assert_msg(bound >= 0, "%s: %s has unexpected type %s", rel, t->name,
                              mr_type_name(t->type));
                float *a = dequantize_tensor(t), *b = dequantize_tensor(r);
                const double e = rel_l2(a, b, n_elems(t));
                ck_assert_msg(e < bound, "%s: %s (%s) relative L2 error %.4g >= %.3g", rel,
                              t->name, mr_type_name(t->type), e, bound);
                type_stats *s = &st[t->type];
                s->n++;
                if (e >= s->worst) {
                    s->worst = e;
                    snprintf(s->where, sizeof s->where, "%s %s", rel, t->name);
                }
                /* our reference quantizer on the same values (the first rows,
                 * to keep the test fast): no worse than upstream's by more
                 * than a quarter */
                if (bound < 1e-3 || e == 0)
                    goto next;
                int64_t nq = n_elems(t) < 16 * t->ne[0] ? n_elems(t) : 16 * t->ne[0];
                const double up = rel_l2(a, b, nq);
                const double ours = our_error(t->type, b, nq, t->ne[0]);
                ck_assert_msg(ours < 1.25 * up, "%s: %s (%s) our quantizer %.4g, upstream %.4g", rel,
                              t->name, mr_type_name(t->type), ours, up);
                if (ours / up > s->worst_ratio)
                    s->worst_ratio = ours / up;
            next:
                free(a);
                free(b);
            }
            mr_gguf_close(g);
        }
        mr_gguf_close(ref);
    }
    ck_assert_int_ge(files, 18);
    printf("fixture dequantization vs BF16 (%d files): type, tensors, worst relative L2, "
           "worst ratio of our quantizer's error to upstream's\n", files);
    for (int t = 0; t < MR_TYPE_COUNT; t++)
        if (st[t].n)
            printf("  %-7s %4d  %.5f  %.3f  (%s)\n", mr_type_name(t), st[t].n, st[t].worst,
                   st[t].worst_ratio, st[t].where);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("quant_fixtures");
    TCase *tc = tcase_create("fixtures");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fixtures_match_bf16);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

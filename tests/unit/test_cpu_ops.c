/* CPU backend ops against straightforward float64 computations written here
 * from the op definitions in kernels/ops.h, on random inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/ops.h"
#define CPU_REF_SEED 0x9e3779b97f4a7c15ull
#include "tests/unit/cpu_ref.h"

/* A weight of type F32 or BF16 from float values (BF16: values rounded
 * first, and the reference uses the rounded values). */
typedef struct {
    mr_weight w;
    void *bytes;
    float *vals; /* [mats][rows][cols] as the op sees them */
} test_weight;

static void make_weight(test_weight *tw, int type, int64_t cols, int64_t rows, int64_t mats)
{
    size_t n = (size_t)(cols * rows * mats);
    tw->vals = rand_vec(n, 1.0);
    if (type == MR_TYPE_BF16) {
        uint16_t *b = malloc(n * 2);
        for (size_t i = 0; i < n; i++) {
            b[i] = mr_f32_to_bf16(tw->vals[i]);
            tw->vals[i] = mr_bf16_to_f32(b[i]);
        }
        tw->bytes = b;
    } else {
        tw->bytes = malloc(n * 4);
        memcpy(tw->bytes, tw->vals, n * 4);
    }
    memset(&tw->w, 0, sizeof tw->w);
    tw->w.name = "test";
    tw->w.type = type;
    tw->w.cols = cols;
    tw->w.rows = rows;
    tw->w.n_mats = mats;
    mr_err err;
    ck_assert_msg(be->weight_load(be, &tw->w, tw->bytes, &err) == 0, "%s", err.msg);
}

static void free_weight(test_weight *tw)
{
    be->weight_release(be, &tw->w);
    free(tw->bytes);
    free(tw->vals);
}

START_TEST(matmul_matches_f64)
{
    int types[] = {MR_TYPE_F32, MR_TYPE_BF16};
    for (int ti = 0; ti < 2; ti++) {
        for (int n = 1; n <= 5; n += 4) {
            int64_t cols = 96, rows = 37;
            test_weight tw;
            make_weight(&tw, types[ti], cols, rows, 1);
            float *x = rand_vec((size_t)(n * cols), 1.0);
            float *y = malloc(sizeof(float) * (size_t)(n * rows));
            double *ref = malloc(sizeof(double) * (size_t)(n * rows));
            be->matmul(be, &tw.w, x, y, n);
            assert_sync_ok();
            for (int t = 0; t < n; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double s = 0;
                    for (int64_t c = 0; c < cols; c++)
                        s += (double)tw.vals[r * cols + c] * x[t * cols + c];
                    ref[t * rows + r] = s;
                }
            assert_close(y, ref, (size_t)(n * rows), 1e-5, 1e-3, "matmul");
            /* one token at a time gives the very same values */
            for (int t = 0; t < n; t++) {
                float one[37];
                be->matmul(be, &tw.w, x + t * cols, one, 1);
                ck_assert(memcmp(one, y + t * rows, sizeof one) == 0);
            }
            free(x);
            free(y);
            free(ref);
            free_weight(&tw);
        }
    }
}
END_TEST

START_TEST(get_rows_matches)
{
    test_weight tw;
    make_weight(&tw, MR_TYPE_BF16, 64, 10, 1);
    int32_t ids[4] = {3, 0, 9, 3};
    float out[4 * 64];
    double ref[4 * 64];
    be->get_rows(be, &tw.w, ids, 4, out);
    assert_sync_ok();
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < 64; c++)
            ref[t * 64 + c] = tw.vals[ids[t] * 64 + c];
    assert_close(out, ref, 4 * 64, 0, 0, "get_rows");
    /* an id out of range is reported by sync, then cleared */
    int32_t bad = 10;
    be->get_rows(be, &tw.w, &bad, 1, out);
    mr_err err;
    ck_assert_int_eq(be->sync(be, &err), -1);
    ck_assert_msg(strstr(err.msg, "out of range") != NULL, "%s", err.msg);
    assert_sync_ok();
    free_weight(&tw);
}
END_TEST

static void check_matmul_id(int x_slots)
{
    int64_t cols = 64, rows = 24, mats = 5;
    int n = 3, k = 2;
    test_weight tw;
    make_weight(&tw, MR_TYPE_F32, cols, rows, mats);
    int32_t ids[6] = {4, 1, 0, 4, 2, 2 /* the same expert twice is allowed */};
    float *x = rand_vec((size_t)(n * x_slots * cols), 1.0);
    float *y = malloc(sizeof(float) * (size_t)(n * k * rows));
    double *ref = malloc(sizeof(double) * (size_t)(n * k * rows));
    be->matmul_id(be, &tw.w, x, x_slots, ids, k, y, n);
    assert_sync_ok();
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++)
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = x + (t * x_slots + (x_slots == 1 ? 0 : j)) * cols;
                const float *wr = tw.vals + (ids[t * k + j] * rows + r) * cols;
                double s = 0;
                for (int64_t c = 0; c < cols; c++)
                    s += (double)wr[c] * xr[c];
                ref[(t * k + j) * rows + r] = s;
            }
    assert_close(y, ref, (size_t)(n * k * rows), 1e-5, 1e-3, "matmul_id");
    int32_t bad[6] = {0, 5, 0, 0, 0, 0};
    be->matmul_id(be, &tw.w, x, x_slots, bad, k, y, n);
    mr_err err;
    ck_assert_int_eq(be->sync(be, &err), -1);
    free(x);
    free(y);
    free(ref);
    free_weight(&tw);
}

START_TEST(matmul_id_one_slot) { check_matmul_id(1); }
END_TEST

START_TEST(matmul_id_k_slots) { check_matmul_id(2); }
END_TEST

START_TEST(rmsnorm_matches)
{
    int rows = 3, dim = 48;
    float *x = rand_vec((size_t)(rows * dim), 2.0);
    float *w = rand_vec((size_t)dim, 1.0);
    float y[3 * 48];
    double ref[3 * 48];
    for (int t = 0; t < rows; t++) {
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)x[t * dim + i] * x[t * dim + i];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++)
            ref[t * dim + i] = x[t * dim + i] * inv * w[i];
    }
    be->rmsnorm(be, x, w, y, rows, dim, 1e-6f);
    assert_close(y, ref, (size_t)(rows * dim), 1e-6, 1e-3, "rmsnorm");
    be->rmsnorm(be, x, w, x, rows, dim, 1e-6f); /* in place */
    assert_close(x, ref, (size_t)(rows * dim), 1e-6, 1e-3, "rmsnorm in place");
    assert_sync_ok();
    free(x);
    free(w);
}
END_TEST

static void check_rope(enum mr_rope_mode mode, int n_rot)
{
    int n = 4, heads = 3, hd = 16;
    int32_t pos[4] = {0, 1, 17, 4095};
    double base = 1e6;
    float *x = rand_vec((size_t)(n * heads * hd), 1.0);
    double *ref = malloc(sizeof(double) * (size_t)(n * heads * hd));
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            const float *xh = x + (t * heads + h) * hd;
            double *rh = ref + (t * heads + h) * hd;
            for (int i = 0; i < hd; i++)
                rh[i] = xh[i]; /* dims past n_rot pass through */
            for (int i = 0; i < n_rot / 2; i++) {
                double inv_freq = 1.0 / pow(base, (2.0 * i) / n_rot);
                double a = pos[t] * inv_freq;
                int p0 = mode == MR_ROPE_NEOX ? i : 2 * i;
                int p1 = mode == MR_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
                rh[p0] = xh[p0] * cos(a) - xh[p1] * sin(a);
                rh[p1] = xh[p0] * sin(a) + xh[p1] * cos(a);
            }
        }
    be->rope(be, x, pos, n, heads, hd, n_rot, (float)base, mode);
    assert_sync_ok();
    assert_close(x, ref, (size_t)(n * heads * hd), 1e-5, 1e-2, "rope");
    free(x);
    free(ref);
}

START_TEST(rope_neox) { check_rope(MR_ROPE_NEOX, 16); }
END_TEST

START_TEST(rope_neox_partial) { check_rope(MR_ROPE_NEOX, 8); }
END_TEST

START_TEST(rope_norm) { check_rope(MR_ROPE_NORM, 16); }
END_TEST

/* Fills the cache for positions 0..len-1 in chunks, then attends with the
 * last n tokens, through a shuffled block table. */
static void check_attention(int block_tokens, int len, int n, int n_heads, int n_kv_heads)
{
    int hd = 32, layers = 2, layer = 1;
    int n_tbl = (len + block_tokens - 1) / block_tokens;
    mr_kv_cache kv = {.n_layers = layers, .n_blocks = n_tbl + 3, .block_tokens = block_tokens,
                      .n_kv_heads = n_kv_heads, .head_dim = hd, .dtype = MR_KV_F32};
    mr_err err;
    ck_assert_msg(be->kv_create(be, &kv, &err) == 0, "%s", err.msg);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_tbl);
    for (int i = 0; i < n_tbl; i++)
        table[i] = (int32_t)((i * 7 + 2) % (n_tbl + 3)); /* scattered */
    for (int i = 0; i < n_tbl; i++)
        for (int j = 0; j < i; j++)
            ck_assert_int_ne(table[i], table[j]); /* distinct while 7 and n_tbl + 3 are coprime */
    size_t kvd = (size_t)n_kv_heads * hd, qd = (size_t)n_heads * hd;
    float *K = rand_vec((size_t)len * kvd, 1.0), *V = rand_vec((size_t)len * kvd, 1.0);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)len);
    for (int p = 0; p < len; p++)
        pos[p] = p;
    /* store in uneven chunks, as prefill chunks and decode steps do */
    for (int p = 0; p < len;) {
        int c = len - p < 5 ? len - p : 5;
        be->kv_store(be, &kv, layer, table, K + p * kvd, V + p * kvd, pos + p, c);
        p += c;
    }
    /* the layout of ops.h: position p at block table[p / bt], slot p % bt */
    for (int p = 0; p < len; p++) {
        size_t at = ((size_t)table[p / block_tokens] * block_tokens + (size_t)(p % block_tokens)) * kvd;
        ck_assert(memcmp((float *)kv.k[layer] + at, K + p * kvd, kvd * sizeof(float)) == 0);
        ck_assert(memcmp((float *)kv.v[layer] + at, V + p * kvd, kvd * sizeof(float)) == 0);
    }
    float *q = rand_vec((size_t)n * qd, 1.0);
    float *out = malloc(sizeof(float) * (size_t)n * qd);
    double *ref = malloc(sizeof(double) * (size_t)n * qd);
    float scale = 1.0f / sqrtf((float)hd);
    be->attention(be, &kv, layer, table, q, pos + (len - n), n, n_heads, scale, out);
    assert_sync_ok();
    int group = n_heads / n_kv_heads;
    double *s = malloc(sizeof(double) * (size_t)len);
    for (int t = 0; t < n; t++) {
        int p_last = len - n + t;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + t * qd + h * hd;
            int kh = h / group;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p <= p_last; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qh[i] * K[p * kvd + kh * hd + i];
                s[p] = d * scale;
                mx = fmax(mx, s[p]);
            }
            for (int p = 0; p <= p_last; p++)
                sum += (s[p] = exp(s[p] - mx));
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int p = 0; p <= p_last; p++)
                    acc += s[p] / sum * V[p * kvd + kh * hd + i];
                ref[t * qd + h * hd + i] = acc;
            }
        }
    }
    assert_close(out, ref, (size_t)n * qd, 1e-5, 1e-3, "attention");
    free(s);
    free(ref);
    free(out);
    free(q);
    free(pos);
    free(K);
    free(V);
    free(table);
    be->kv_destroy(be, &kv);
}

START_TEST(attention_block1) { check_attention(1, 9, 9, 4, 2); }
END_TEST

START_TEST(attention_block3_decode) { check_attention(3, 20, 1, 4, 4); }
END_TEST

START_TEST(attention_block16_gqa) { check_attention(16, 41, 7, 6, 2); }
END_TEST

START_TEST(attention_block16_mqa) { check_attention(16, 16, 16, 4, 1); }
END_TEST

/* Two sequences in one cache through the multi-sequence ops: rows of both
 * interleaved in one store (with a skipped row), each query the last
 * position of its sequence; the outputs equal the one-sequence ops', and a
 * skipped row is left untouched. */
START_TEST(attention_multi_sequences)
{
    enum { HD = 16, NKV = 2, NH = 4, LA = 9, LB = 5 };
    mr_kv_cache kv = {.n_layers = 1, .n_blocks = 6, .block_tokens = 4, .n_kv_heads = NKV,
                      .head_dim = HD, .dtype = MR_KV_F32};
    mr_err err;
    ck_assert_msg(be->kv_create(be, &kv, &err) == 0, "%s", err.msg);
    int32_t ta[3] = {4, 0, 2}, tb[2] = {5, 1};
    const size_t kvd = NKV * HD, qd = NH * HD;
    /* rows: A0 B0 A1 B1 ... then the rest of A; row 3 is skipped */
    const int rows = LA + LB + 1;
    const int32_t *tabs[LA + LB + 1];
    int32_t pos[LA + LB + 1];
    float *K = rand_vec((size_t)rows * kvd, 1.0), *V = rand_vec((size_t)rows * kvd, 1.0);
    int a = 0, b = 0;
    for (int r = 0; r < rows; r++) {
        if (r == 3) { tabs[r] = NULL; pos[r] = 0; continue; }
        if ((r % 2 == 0 && a < LA) || b == LB) { tabs[r] = ta; pos[r] = a++; }
        else { tabs[r] = tb; pos[r] = b++; }
    }
    be->kv_store_multi(be, &kv, 0, tabs, K, V, pos, rows);
    assert_sync_ok();
    for (int r = 0; r < rows; r++) {
        if (!tabs[r]) continue;
        size_t at = ((size_t)tabs[r][pos[r] / 4] * 4 + (size_t)(pos[r] % 4)) * kvd;
        ck_assert(memcmp((float *)kv.k[0] + at, K + r * kvd, kvd * sizeof(float)) == 0);
        ck_assert(memcmp((float *)kv.v[0] + at, V + r * kvd, kvd * sizeof(float)) == 0);
    }
    float *q = rand_vec(3 * qd, 1.0);
    const int32_t *qt[3] = {ta, NULL, tb};
    int32_t qp[3] = {LA - 1, 0, LB - 1};
    float out[3 * NH * HD], ref[NH * HD];
    for (size_t i = 0; i < 3 * qd; i++) out[i] = 12345.0f;
    const float scale = 1.0f / sqrtf((float)HD);
    be->attention_multi(be, &kv, 0, qt, q, qp, 3, NH, scale, out);
    assert_sync_ok();
    be->attention(be, &kv, 0, ta, q, &qp[0], 1, NH, scale, ref);
    assert_sync_ok();
    ck_assert(memcmp(out, ref, qd * sizeof(float)) == 0);
    be->attention(be, &kv, 0, tb, q + 2 * qd, &qp[2], 1, NH, scale, ref);
    assert_sync_ok();
    ck_assert(memcmp(out + 2 * qd, ref, qd * sizeof(float)) == 0);
    for (size_t i = 0; i < qd; i++) ck_assert(out[qd + i] == 12345.0f);
    free(q);
    free(K);
    free(V);
    be->kv_destroy(be, &kv);
}
END_TEST

START_TEST(attention_bad_block)
{
    mr_kv_cache kv = {.n_layers = 1, .n_blocks = 2, .block_tokens = 4, .n_kv_heads = 1,
                      .head_dim = 8, .dtype = MR_KV_F32};
    mr_err err;
    ck_assert_int_eq(be->kv_create(be, &kv, &err), 0);
    int32_t table[1] = {2}; /* not a block of this cache */
    float k[8] = {0}, q[8] = {0}, out[8];
    int32_t pos = 0;
    be->kv_store(be, &kv, 0, table, k, k, &pos, 1);
    ck_assert_int_eq(be->sync(be, &err), -1);
    be->attention(be, &kv, 0, table, q, &pos, 1, 1, 1.0f, out);
    ck_assert_int_eq(be->sync(be, &err), -1);
    be->kv_destroy(be, &kv);
    mr_kv_cache f16 = kv;
    f16.dtype = MR_KV_F16;
    ck_assert_int_eq(be->kv_create(be, &f16, &err), -1);
}
END_TEST

START_TEST(swiglu_add)
{
    size_t n = 100;
    float *g = rand_vec(n, 6.0), *u = rand_vec(n, 2.0), *o = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    be->swiglu(be, g, u, o, n);
    assert_close(o, ref, n, 1e-6, 1e-3, "swiglu");
    be->swiglu(be, g, u, g, n); /* aliasing the gate */
    assert_close(g, ref, n, 1e-6, 1e-3, "swiglu aliased");
    for (size_t i = 0; i < n; i++)
        ref[i] = (double)o[i] + u[i];
    be->add(be, o, u, n);
    assert_close(o, ref, n, 1e-7, 1e-3, "add");
    assert_sync_ok();
    free(g);
    free(u);
    free(o);
    free(ref);
}
END_TEST

START_TEST(moe_route_topk)
{
    int n = 3, ne = 6, k = 3;
    float logits[18] = {
        0.5f, 2.0f, -1.0f, 2.0f, 0.1f, 3.0f,  /* tie between experts 1 and 3 */
        1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,   /* all tied: 0, 1, 2 */
        -3.0f, 0.0f, 4.0f, -1.0f, 2.5f, 2.5f, /* tie for 2nd: 4 before 5 */
    };
    int32_t want_ids[9] = {5, 1, 3, 0, 1, 2, 2, 4, 5};
    for (int norm = 0; norm < 2; norm++) {
        int32_t ids[9];
        float w[9];
        be->moe_route(be, logits, n, ne, k, norm, ids, w);
        assert_sync_ok();
        for (int t = 0; t < n; t++) {
            double mx = -INFINITY, sum = 0, p[6], picked = 0;
            for (int e = 0; e < ne; e++)
                mx = fmax(mx, logits[t * ne + e]);
            for (int e = 0; e < ne; e++)
                sum += (p[e] = exp(logits[t * ne + e] - mx));
            for (int j = 0; j < k; j++) {
                ck_assert_int_eq(ids[t * k + j], want_ids[t * k + j]);
                picked += p[want_ids[t * k + j]] / sum;
            }
            double ref[3];
            for (int j = 0; j < k; j++)
                ref[j] = p[want_ids[t * k + j]] / sum / (norm ? picked : 1.0);
            assert_close(w + t * k, ref, 3, 1e-6, 0, "moe weights");
        }
    }
}
END_TEST

START_TEST(moe_route_random)
{
    int n = 20, ne = 8, k = 2;
    float *l = rand_vec((size_t)(n * ne), 4.0);
    int32_t ids[40];
    float w[40];
    be->moe_route(be, l, n, ne, k, true, ids, w);
    assert_sync_ok();
    for (int t = 0; t < n; t++) {
        /* the chosen two are the two largest logits, in order */
        ck_assert_int_ne(ids[t * 2], ids[t * 2 + 1]);
        for (int e = 0; e < ne; e++) {
            if (e == ids[t * 2] || e == ids[t * 2 + 1])
                continue;
            ck_assert(l[t * ne + e] <= l[t * ne + ids[t * 2 + 1]]);
        }
        ck_assert(l[t * ne + ids[t * 2]] >= l[t * ne + ids[t * 2 + 1]]);
        double ref = 1.0 / (1.0 + exp((double)l[t * ne + ids[t * 2 + 1]] - l[t * ne + ids[t * 2]]));
        assert_close(w + t * 2, &ref, 1, 1e-6, 0, "top-2 weight");
    }
    free(l);
}
END_TEST

START_TEST(moe_combine_matches)
{
    int n = 4, k = 3, rows = 10;
    float *y = rand_vec((size_t)(n * k * rows), 1.0), *w = rand_vec((size_t)(n * k), 1.0);
    float out[40];
    double ref[40];
    for (int t = 0; t < n; t++)
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int j = 0; j < k; j++)
                s += (double)w[t * k + j] * y[(t * k + j) * rows + r];
            ref[t * rows + r] = s;
        }
    be->moe_combine(be, y, w, n, k, rows, out);
    assert_sync_ok();
    assert_close(out, ref, 40, 1e-6, 1e-3, "moe_combine");
    free(y);
    free(w);
}
END_TEST

START_TEST(argmax_lowest_on_ties)
{
    float x[12] = {1, 3, 3, 2, /**/ -5, -4, -4, -9, /**/ 0, 0, 0, 0};
    int32_t ids[3];
    be->argmax(be, x, 3, 4, ids);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 1);
    ck_assert_int_eq(ids[2], 0);
}
END_TEST

START_TEST(memory_roundtrip)
{
    mr_err err;
    uint8_t src[100], back[100];
    for (int i = 0; i < 100; i++)
        src[i] = (uint8_t)(i * 3);
    void *d = be->alloc(be, sizeof src);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(be->upload(be, d, src, sizeof src, &err), 0);
    ck_assert_int_eq(be->download(be, back, d, sizeof back, &err), 0);
    ck_assert(memcmp(src, back, sizeof src) == 0);
    be->free(be, d);
    /* a weight whose column count does not fit the block size is refused */
    mr_weight w = {.name = "odd", .type = MR_TYPE_Q8_0, .cols = 33, .rows = 1, .n_mats = 1};
    ck_assert_int_eq(be->weight_load(be, &w, src, &err), -1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, matmul_matches_f64);
    tcase_add_test(tc, get_rows_matches);
    tcase_add_test(tc, matmul_id_one_slot);
    tcase_add_test(tc, matmul_id_k_slots);
    tcase_add_test(tc, rmsnorm_matches);
    tcase_add_test(tc, rope_neox);
    tcase_add_test(tc, rope_neox_partial);
    tcase_add_test(tc, rope_norm);
    tcase_add_test(tc, attention_block1);
    tcase_add_test(tc, attention_block3_decode);
    tcase_add_test(tc, attention_block16_gqa);
    tcase_add_test(tc, attention_block16_mqa);
    tcase_add_test(tc, attention_multi_sequences);
    tcase_add_test(tc, attention_bad_block);
    tcase_add_test(tc, swiglu_add);
    tcase_add_test(tc, moe_route_topk);
    tcase_add_test(tc, moe_route_random);
    tcase_add_test(tc, moe_combine_matches);
    tcase_add_test(tc, argmax_lowest_on_ties);
    tcase_add_test(tc, memory_roundtrip);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

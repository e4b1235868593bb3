/* Paged KV pool (reference counts, reservations, budget sizing), sequences
 * on shared blocks, and the batched forward: a sequence's logits are bit
 * for bit the same alone, batched with others, and for any chunking. */
#include <stdlib.h>
#include <string.h>

#include "tests/unit/fixture_ref.h"
#include "worker/kv.h"

START_TEST(pool_refcounts_and_reservations)
{
    mr_err err;
    mr_kv_pool *p;
    ck_assert_int_ne(mr_kv_pool_new(0, &p, &err), 0);
    ck_assert_int_eq(mr_kv_pool_new(6, &p, &err), 0);
    ck_assert_int_eq(mr_kv_pool_size(p), 6);
    int32_t a = mr_kv_alloc(p, 0), b = mr_kv_alloc(p, 0);
    ck_assert_int_eq(a, 0);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(mr_kv_refcount(p, a), 1);
    mr_kv_ref(p, a);
    ck_assert_int_eq(mr_kv_refcount(p, a), 2);
    mr_kv_unref(p, a);
    ck_assert_int_eq(mr_kv_pool_n_free(p), 4);
    mr_kv_unref(p, a);
    ck_assert_int_eq(mr_kv_refcount(p, a), 0);
    ck_assert_int_eq(mr_kv_pool_n_free(p), 5);
    /* references on a free block and ids out of range change nothing */
    mr_kv_unref(p, a);
    mr_kv_ref(p, a);
    mr_kv_unref(p, 99);
    mr_kv_ref(p, -1);
    ck_assert_int_eq(mr_kv_refcount(p, a), 0);
    ck_assert_int_eq(mr_kv_pool_n_free(p), 5);

    /* 5 free: promise 3, then only 2 are available to others */
    ck_assert_int_eq(mr_kv_reserve(p, 3), 0);
    ck_assert_int_eq(mr_kv_pool_available(p), 2);
    ck_assert_int_ne(mr_kv_reserve(p, 3), 0);
    ck_assert_int_eq(mr_kv_pool_n_reserved(p), 3);
    ck_assert_int_ge(mr_kv_alloc(p, 0), 0);
    ck_assert_int_ge(mr_kv_alloc(p, 0), 0);
    ck_assert_int_eq(mr_kv_alloc(p, 0), -1); /* the rest is promised */
    for (int i = 0; i < 3; i++)
        ck_assert_int_ge(mr_kv_alloc(p, 1), 0);
    ck_assert_int_eq(mr_kv_alloc(p, 1), -1); /* no promise left */
    ck_assert_int_eq(mr_kv_pool_n_free(p), 0);
    ck_assert_int_eq(mr_kv_pool_n_reserved(p), 0);
    mr_kv_unreserve(p, 5); /* more than held: clamps */
    ck_assert_int_eq(mr_kv_pool_n_reserved(p), 0);
    mr_kv_pool_free(p);
}
END_TEST

START_TEST(budget_sizing)
{
    /* 2 (K and V) x layers x tokens x heads x dim x element bytes */
    ck_assert_uint_eq(mr_kv_block_bytes(2, 16, 2, 64, MR_KV_F32), 2u * 2 * 16 * 2 * 64 * 4);
    ck_assert_uint_eq(mr_kv_block_bytes(48, 16, 4, 128, MR_KV_BF16), 2u * 48 * 16 * 4 * 128 * 2);
    ck_assert_uint_eq(mr_kv_block_bytes(0, 16, 4, 128, MR_KV_F16), 0);
    ck_assert_int_eq(mr_kv_blocks_for_budget(1000, 100, 0), 10);
    ck_assert_int_eq(mr_kv_blocks_for_budget(1099, 100, 0), 10);
    ck_assert_int_eq(mr_kv_blocks_for_budget(1000, 100, 4), 4);
    ck_assert_int_eq(mr_kv_blocks_for_budget(99, 100, 0), 0);
    ck_assert_int_eq(mr_kv_blocks_for_budget(1000, 0, 0), 0);
    /* 90% of 100 GiB free, less a 4 GiB reserve */
    ck_assert_uint_eq(mr_kv_budget_bytes(100ull << 30, 0.9, 4ull << 30), (size_t)(0.9 * (100ull << 30)) - (4ull << 30));
    ck_assert_uint_eq(mr_kv_budget_bytes(1000, 0.5, 600), 0);
    ck_assert_uint_eq(mr_kv_budget_bytes(1000, 0.0, 0), 0);
    ck_assert_uint_eq(mr_kv_budget_bytes(1000, 2.0, 100), 900);
    /* a 40 GB budget of 1.5 MB blocks */
    ck_assert_int_eq(mr_kv_blocks_for_budget(40ull << 30, 1536u << 10, 0), (int)((40ull << 30) / (1536u << 10)));
}
END_TEST

static size_t fixed_budget(void *ctx, mr_backend *b)
{
    (void)b;
    return *(const size_t *)ctx;
}

/* A budget from free memory (the VRAM path) leaves room for three recurrent
 * states a sequence slot on a hybrid model (its own, its block-boundary
 * copy, a prefix-cache checkpoint) and the zero state new ones start from,
 * at most half of it; a byte budget the caller fixed is taken as it is. */
START_TEST(hybrid_budget_leaves_room_for_states)
{
    mr_model_opts probe = {.n_ctx = 128, .block_tokens = 8};
    open_model("qwen35", "model-BF16.gguf", &probe);
    const mr_hparams *hp = mr_model_hparams(model);
    size_t st = mr_seq_state_bytes(model);
    size_t bb = mr_kv_block_bytes(hp->n_kv_layers, 8, hp->n_kv_heads, hp->head_dim, MR_KV_F32);
    close_model();
    ck_assert_uint_gt(st, 0);
    /* 2 slots: 7 states, less than half of the budget */
    int kb = (int)((7 * st + bb - 1) / bb) + 20;
    size_t budget = 7 * st + (size_t)kb * bb + bb / 2;
    mr_model_opts o = {.n_ctx = 128, .n_seqs = 2, .block_tokens = 8, .kv_budget = fixed_budget, .kv_budget_ctx = &budget};
    open_model("qwen35", "model-BF16.gguf", &o);
    ck_assert_int_eq(mr_kv_pool_size(mr_model_kv_pool(model)), kb);
    close_model();
    /* states worth more than the budget take half of it, no more */
    budget = 40 * bb;
    mr_model_opts oh = {.n_ctx = 128, .n_seqs = 1000, .block_tokens = 8, .kv_budget = fixed_budget, .kv_budget_ctx = &budget};
    open_model("qwen35", "model-BF16.gguf", &oh);
    ck_assert_int_eq(mr_kv_pool_size(mr_model_kv_pool(model)), 20);
    close_model();
    mr_model_opts ob = {.n_ctx = 128, .n_seqs = 4, .block_tokens = 8, .kv_bytes = 20 * bb + bb / 2};
    open_model("qwen35", "model-BF16.gguf", &ob);
    ck_assert_int_eq(mr_kv_pool_size(mr_model_kv_pool(model)), 20);
    close_model();
}
END_TEST

START_TEST(model_pool_from_budget_and_shared_blocks)
{
    mr_err err;
    const mr_hparams *hp;
    /* a byte budget of 10.5 blocks gives 10 blocks */
    mr_model_opts probe = {.n_ctx = 128, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &probe);
    hp = mr_model_hparams(model);
    size_t bb = mr_kv_block_bytes(hp->n_layers, 8, hp->n_kv_heads, hp->head_dim, MR_KV_F32);
    close_model();
    mr_model_opts o = {.n_ctx = 128, .block_tokens = 8, .kv_bytes = bb * 10 + bb / 2};
    open_model("qwen3", "model-BF16.gguf", &o);
    hp = mr_model_hparams(model);
    mr_kv_pool *pool = mr_model_kv_pool(model);
    ck_assert_int_eq(mr_kv_pool_size(pool), 10);
    ck_assert_int_eq(mr_model_block_tokens(model), 8);

    mr_seq *a, *b;
    ck_assert_int_eq(mr_seq_new(model, &a, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    ck_assert_int_eq(mr_seq_reserve(a, 20, &err), 0); /* 3 blocks promised */
    ck_assert_int_eq(mr_seq_reserved(a), 3);
    ck_assert_int_eq(mr_kv_pool_available(pool), 7);
    ck_assert_int_ne(mr_seq_reserve(b, 64, &err), 0); /* 8 > 7 */
    ck_assert_msg(strstr(err.msg, "KV cache full") != NULL, "%s", err.msg);
    int32_t toks[17];
    for (int i = 0; i < 17; i++)
        toks[i] = (int32_t)(i * 37 % 1000);
    ck_assert_int_eq(mr_model_forward(model, a, toks, 17, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_seq_reserved(a), 0); /* drew on its promise */
    ck_assert_int_eq(mr_kv_pool_available(pool), 7);

    /* b starts on a's two full blocks */
    const int32_t *blocks;
    ck_assert_int_eq(mr_seq_blocks(a, &blocks), 3);
    ck_assert_int_eq(mr_seq_attach(b, blocks, 2, &err), 0);
    ck_assert_int_eq(mr_seq_len(b), 16);
    ck_assert_int_eq(mr_kv_refcount(pool, blocks[0]), 2);
    ck_assert_int_ne(mr_seq_attach(b, blocks, 1, &err), 0); /* not empty any more */
    float *la = malloc(sizeof(float) * (size_t)hp->n_vocab * 2), *lb = la + hp->n_vocab;
    int32_t next = 5;
    /* a holds 17 tokens; b holds 16 shared + the 17th: the same next logits */
    ck_assert_int_eq(mr_model_forward(model, b, &toks[16], 1, MR_LOGITS_LAST, lb, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, a, &next, 1, MR_LOGITS_LAST, la, &err), 0);
    mr_seq *c;
    ck_assert_int_eq(mr_seq_new(model, &c, &err), 0);
    float *lc = malloc(sizeof(float) * (size_t)hp->n_vocab * 17);
    ck_assert_int_eq(mr_model_forward(model, c, toks, 17, MR_LOGITS_ALL, lc, &err), 0);
    ck_assert(memcmp(lb, lc + (size_t)16 * hp->n_vocab, sizeof(float) * (size_t)hp->n_vocab) == 0);
    mr_seq_free(c);
    int32_t first = blocks[0];
    mr_seq_free(a);
    ck_assert_int_eq(mr_kv_refcount(pool, first), 1); /* b still holds it */
    mr_seq_free(b);
    ck_assert_int_eq(mr_kv_pool_n_free(pool), 10);
    ck_assert_int_eq(mr_kv_pool_n_reserved(pool), 0);
    free(la);
    free(lc);
    close_model();
}
END_TEST

/* ---- batched forward exactness ---- */

START_TEST(batched_and_chunked_logits_are_bit_identical)
{
    static const char *const arch[] = {"qwen3", "qwen3moe"};
    mr_model_opts o = {.n_ctx = 128, .n_seqs = 8, .block_tokens = 8};
    open_model(arch[_i % 2], "model-BF16.gguf", &o);
    /* loops 2-3: as if products of 4+ (2+) rows rounded differently (the CUDA
     * backend's float16 GEMMs): the decode rows of a mixed step then go in
     * products of at most 3 (1) rows of their own; the CPU computes every row
     * the same either way, so only a wrong row offset can change a bit */
    if (_i >= 2)
        be->batch_variant_rows = _i == 2 ? 4 : 2;
    mr_err err;
    int V = mr_model_hparams(model)->n_vocab;
    enum { NA = 5, NB = 26, NC = 23, DEC = 3 };
    int32_t pa[NA + DEC], pb[NB + DEC], pc[NC + DEC];
    lcg_prompt(pa, NA + DEC, 1, V);
    lcg_prompt(pb, NB + DEC, 2, V);
    lcg_prompt(pc, NC + DEC, 3, V);
    int32_t *p[3] = {pa, pb, pc};
    int n[3] = {NA, NB, NC};
    size_t row = (size_t)V * sizeof(float);

    /* solo: every position of prompt + DEC teacher-forced tokens, one call each */
    float *solo[3];
    for (int s = 0; s < 3; s++) {
        mr_seq *q;
        ck_assert_int_eq(mr_seq_new(model, &q, &err), 0);
        solo[s] = malloc(row * (size_t)(n[s] + DEC));
        ck_assert_int_eq(mr_model_forward(model, q, p[s], n[s], MR_LOGITS_ALL, solo[s], &err), 0);
        for (int d = 0; d < DEC; d++)
            ck_assert_int_eq(mr_model_forward(model, q, &p[s][n[s] + d], 1, MR_LOGITS_LAST,
                                              solo[s] + (size_t)(n[s] + d) * V, &err), 0);
        mr_seq_free(q);
    }

    /* batched: all three prompts in one call, then decode steps together */
    mr_seq *q[3];
    float *out[3];
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(mr_seq_new(model, &q[s], &err), 0);
        out[s] = malloc(row * (size_t)(n[s] + DEC));
    }
    mr_batch_item it[3];
    for (int s = 0; s < 3; s++)
        it[s] = (mr_batch_item){.seq = q[s], .tokens = p[s], .n = n[s], .mode = MR_LOGITS_ALL, .logits = out[s]};
    ck_assert_msg(mr_model_forward_batch(model, it, 3, &err) == 0, "%s", err.msg);
    for (int d = 0; d < DEC; d++) {
        for (int s = 0; s < 3; s++)
            it[s] = (mr_batch_item){.seq = q[s], .tokens = &p[s][n[s] + d], .n = 1, .mode = MR_LOGITS_LAST,
                                    .logits = out[s] + (size_t)(n[s] + d) * V};
        ck_assert_int_eq(mr_model_forward_batch(model, it, 3, &err), 0);
    }
    for (int s = 0; s < 3; s++) {
        ck_assert_msg(memcmp(out[s], solo[s], row * (size_t)(n[s] + DEC)) == 0, "%s seq %d: batched differs",
                      arch[_i % 2], s);
        mr_seq_free(q[s]);
    }

    /* chunked: b's prompt in chunks of 1, 7 and 64 while a decodes and c
     * prefills in chunks of 5 in the same steps; every chunk's last row
     * must equal the solo row of that position */
    static const int chunks[] = {1, 7, 64};
    for (size_t ci = 0; ci < 3; ci++) {
        int chunk = chunks[ci];
        for (int s = 0; s < 3; s++)
            ck_assert_int_eq(mr_seq_new(model, &q[s], &err), 0);
        float *last = malloc(row * 3);
        /* a: prompt alone first, so it decodes alongside the others */
        ck_assert_int_eq(mr_model_forward(model, q[0], pa, NA, MR_LOGITS_NONE, NULL, &err), 0);
        int done_b = 0, done_c = 0, dec_a = 0;
        while (done_b < NB) {
            int k = 0;
            if (dec_a < DEC) {
                it[k++] = (mr_batch_item){.seq = q[0], .tokens = &pa[NA + dec_a], .n = 1, .mode = MR_LOGITS_LAST, .logits = last};
            }
            int nb = NB - done_b < chunk ? NB - done_b : chunk;
            it[k++] = (mr_batch_item){.seq = q[1], .tokens = &pb[done_b], .n = nb, .mode = MR_LOGITS_LAST, .logits = last + V};
            int nc = NC - done_c < 5 ? NC - done_c : 5;
            if (nc > 0)
                it[k++] = (mr_batch_item){.seq = q[2], .tokens = &pc[done_c], .n = nc, .mode = MR_LOGITS_LAST, .logits = last + 2 * V};
            ck_assert_int_eq(mr_model_forward_batch(model, it, k, &err), 0);
            if (dec_a < DEC) {
                ck_assert(memcmp(last, solo[0] + (size_t)(NA + dec_a) * V, row) == 0);
                dec_a++;
            }
            done_b += nb;
            ck_assert_msg(memcmp(last + V, solo[1] + (size_t)(done_b - 1) * V, row) == 0,
                          "%s chunk %d: row %d differs", arch[_i % 2], chunk, done_b - 1);
            if (nc > 0) {
                done_c += nc;
                ck_assert(memcmp(last + 2 * V, solo[2] + (size_t)(done_c - 1) * V, row) == 0);
            }
        }
        for (int s = 0; s < 3; s++)
            mr_seq_free(q[s]);
        free(last);
    }
    for (int s = 0; s < 3; s++) {
        free(solo[s]);
        free(out[s]);
    }
    close_model();
}
END_TEST

START_TEST(argmax_mode_matches_host_argmax)
{
    mr_model_opts o = {.n_ctx = 64, .n_seqs = 4, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &o);
    mr_err err;
    int V = mr_model_hparams(model)->n_vocab;
    int32_t pa[9], pb[7];
    lcg_prompt(pa, 9, 41, V);
    lcg_prompt(pb, 7, 42, V);
    /* solo references: last-row logits of a, all rows of b */
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V * 7);
    float *lb2 = malloc(sizeof(float) * (size_t)V * 7);
    mr_seq *q;
    ck_assert_int_eq(mr_seq_new(model, &q, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, q, pa, 9, MR_LOGITS_LAST, la, &err), 0);
    mr_seq_free(q);
    ck_assert_int_eq(mr_seq_new(model, &q, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, q, pb, 7, MR_LOGITS_ALL, lb, &err), 0);
    mr_seq_free(q);
    int want = argmax_f32(la, V);
    /* one batch: b's rows, a's argmax, and c with no output in between */
    mr_seq *a, *b, *c;
    ck_assert_int_eq(mr_seq_new(model, &a, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &c, &err), 0);
    int32_t id = -1;
    mr_batch_item it[3] = {
        {.seq = b, .tokens = pb, .n = 7, .mode = MR_LOGITS_ALL, .logits = lb2},
        {.seq = c, .tokens = pa, .n = 4, .mode = MR_LOGITS_NONE},
        {.seq = a, .tokens = pa, .n = 9, .mode = MR_LOGITS_ARGMAX, .argmax = &id},
    };
    ck_assert_msg(mr_model_forward_batch(model, it, 3, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(id, want);
    ck_assert(memcmp(lb, lb2, sizeof(float) * (size_t)V * 7) == 0);
    /* ARGMAX needs its output; the one-sequence call has none */
    ck_assert_int_ne(mr_model_forward(model, a, pa, 1, MR_LOGITS_ARGMAX, la, &err), 0);
    mr_seq_free(a);
    mr_seq_free(b);
    mr_seq_free(c);
    free(la);
    free(lb);
    free(lb2);
    close_model();
}
END_TEST

/* ARGMAX_ALL: every row's pick, as the host's argmax of the ALL rows, next
 * to another item in the same call; without an output buffer, refused. */
START_TEST(argmax_all_mode_picks_every_row)
{
    mr_model_opts o = {.n_ctx = 64, .n_seqs = 3, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &o);
    mr_err err;
    int V = mr_model_hparams(model)->n_vocab;
    int32_t pa[9], pb[5];
    lcg_prompt(pa, 9, 51, V);
    lcg_prompt(pb, 5, 52, V);
    float *la = malloc(sizeof(float) * (size_t)V * 9);
    mr_seq *q;
    ck_assert_int_eq(mr_seq_new(model, &q, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, q, pa, 9, MR_LOGITS_ALL, la, &err), 0);
    mr_seq_free(q);
    mr_seq *a, *b;
    ck_assert_int_eq(mr_seq_new(model, &a, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    int32_t ids[9], idb = -1;
    for (int i = 0; i < 9; i++) ids[i] = -1;
    mr_batch_item it[2] = {
        {.seq = b, .tokens = pb, .n = 5, .mode = MR_LOGITS_ARGMAX, .argmax = &idb},
        {.seq = a, .tokens = pa, .n = 9, .mode = MR_LOGITS_ARGMAX_ALL, .argmax = ids},
    };
    ck_assert_msg(mr_model_forward_batch(model, it, 2, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 9; i++)
        ck_assert_int_eq(ids[i], argmax_f32(la + (size_t)i * (size_t)V, V));
    ck_assert_int_ge(idb, 0);
    ck_assert_int_eq(mr_seq_len(a), 9);
    mr_batch_item bad = {.seq = a, .tokens = pa, .n = 2, .mode = MR_LOGITS_ARGMAX_ALL};
    ck_assert_int_ne(mr_model_forward_batch(model, &bad, 1, &err), 0);
    ck_assert_int_eq(mr_seq_len(a), 9);
    mr_seq_free(a);
    mr_seq_free(b);
    free(la);
    close_model();
}
END_TEST

/* mr_seq_skip: positions without tokens (decode benchmarks at depth): the
 * length and blocks grow, a step runs after them, and a skip past the
 * context or a negative one is refused without change. */
START_TEST(skip_grows_without_running)
{
    mr_model_opts o = {.n_ctx = 64, .n_seqs = 1, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &o);
    mr_err err;
    int V = mr_model_hparams(model)->n_vocab;
    mr_seq *s;
    ck_assert_int_eq(mr_seq_new(model, &s, &err), 0);
    ck_assert_int_eq(mr_seq_skip(s, 40, &err), 0);
    ck_assert_int_eq(mr_seq_len(s), 40);
    float *l = malloc(sizeof(float) * (size_t)V);
    int32_t t = 7;
    ck_assert_msg(mr_model_forward_gen(model, s, &t, 1, MR_LOGITS_LAST, l, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(mr_seq_len(s), 41);
    for (int i = 0; i < V; i++)
        ck_assert(isfinite(l[i]));
    ck_assert_int_ne(mr_seq_skip(s, 24, &err), 0); /* 41 + 24 > 64 */
    ck_assert_ptr_nonnull(strstr(err.msg, "context"));
    ck_assert_int_ne(mr_seq_skip(s, -1, &err), 0);
    ck_assert_int_eq(mr_seq_len(s), 41);
    ck_assert_int_eq(mr_seq_skip(s, 23, &err), 0);
    ck_assert_int_eq(mr_seq_len(s), 64);
    mr_seq_free(s);
    free(l);
    close_model();
}
END_TEST

START_TEST(batch_rejects_bad_items)
{
    mr_model_opts o = {.n_ctx = 32, .n_seqs = 2, .block_tokens = 8};
    open_model("qwen3", "model-BF16.gguf", &o);
    mr_err err;
    mr_seq *a, *b;
    ck_assert_int_eq(mr_seq_new(model, &a, &err), 0);
    ck_assert_int_eq(mr_seq_new(model, &b, &err), 0);
    int32_t t[4] = {1, 2, 3, 4}, bad[1] = {5000};
    float lg[1024 * 4];
    mr_batch_item same[2] = {{.seq = a, .tokens = t, .n = 2, .mode = MR_LOGITS_NONE},
                             {.seq = a, .tokens = t + 2, .n = 2, .mode = MR_LOGITS_NONE}};
    ck_assert_int_ne(mr_model_forward_batch(model, same, 2, &err), 0);
    ck_assert_msg(strstr(err.msg, "twice") != NULL, "%s", err.msg);
    mr_batch_item oob[2] = {{.seq = a, .tokens = t, .n = 2, .mode = MR_LOGITS_LAST, .logits = lg},
                            {.seq = b, .tokens = bad, .n = 1, .mode = MR_LOGITS_LAST, .logits = lg + 1024}};
    ck_assert_int_ne(mr_model_forward_batch(model, oob, 2, &err), 0);
    ck_assert_int_eq(mr_seq_len(a), 0); /* nothing changed */
    mr_batch_item nolog[1] = {{.seq = a, .tokens = t, .n = 2, .mode = MR_LOGITS_ALL}};
    ck_assert_int_ne(mr_model_forward_batch(model, nolog, 1, &err), 0);
    ck_assert_int_ne(mr_model_forward_batch(model, nolog, 0, &err), 0);
    mr_seq_free(a);
    mr_seq_free(b);
    close_model();
}
END_TEST

/* The forward pass's routing by row kind (kernels/ops.h, matmul_prompt): a
 * CPU backend whose ops count what they are given, with prompt ops and a
 * batch_variant_rows of 3.  In a step of three generated items and two
 * prompt items the generated rows go to matmul / matmul_id in products of
 * at most 2 rows and to the decode attention, the prompt rows to the prompt
 * ops in one product (12 rows) and one attention call per segment; the
 * output head takes all 10 output rows (3 generated, 7 of the prompt) on
 * matmul in products of at most 2 rows; a layer's q/k/v over the generated
 * rows all come before any of them over the prompt rows; every row's logits
 * equal its solo run's, and a generated item after a prompt item is
 * refused. */
static mr_backend real_ops;
static int mm_gen_max, mm_prompt_bad, mm_prompt_calls, att_gen_bad, att_prompt_calls, att_prompt_bad,
    att_prompt_deep, mm_head_rows, mm_ffn_calls, n_vocab_rows;
/* the order of the product calls: layer 0's v over the generated rows and
 * its q over the prompt rows (mr_fwd_matmuls asks for every generated part
 * of q/k/v before any prompt part, so a backend sees each kind back to back) */
static int mm_seq, mm_gen_v0_at, mm_prompt_q0_at;

static bool named(const mr_weight *w, const char *name) { return w->name && !strcmp(w->name, name); }

static void count_matmul(mr_backend *b, const mr_weight *w, const float *x, float *y, int n)
{
    mm_seq++;
    if (named(w, "blk.0.attn_v.weight") && !mm_gen_v0_at) mm_gen_v0_at = mm_seq;
    mm_gen_max = n > mm_gen_max ? n : mm_gen_max;
    mm_head_rows += w->rows == n_vocab_rows ? n : 0; /* the output head: the only product as tall as the vocabulary */
    real_ops.matmul(b, w, x, y, n);
}
static void count_matmul_prompt(mr_backend *b, const mr_weight *w, const float *x, float *y, int n)
{
    mm_seq++;
    if (named(w, "blk.0.attn_q.weight") && !mm_prompt_q0_at) mm_prompt_q0_at = mm_seq;
    mm_prompt_calls++;
    mm_prompt_bad += n != 12 || w->rows == n_vocab_rows;
    real_ops.matmul(b, w, x, y, n);
}
static void count_matmul_id(mr_backend *b, const mr_weight *w, const float *x, int xs, const int32_t *ids, int k,
                            float *y, int n)
{
    mm_gen_max = n > mm_gen_max ? n : mm_gen_max;
    real_ops.matmul_id(b, w, x, xs, ids, k, y, n);
}
static void count_matmul_id_prompt(mr_backend *b, const mr_weight *w, const float *x, int xs, const int32_t *ids,
                                   int k, float *y, int n)
{
    mm_prompt_calls++;
    mm_prompt_bad += n != 12;
    real_ops.matmul_id(b, w, x, xs, ids, k, y, n);
}
/* a mixture layer's routed experts over the prompt rows in one call (the
 * CPU backend has none: its products and swiglu stand for it) */
static void count_moe_ffn_prompt(mr_backend *b, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd,
                                 const float *x, const int32_t *ids, int k, float *g, float *u, float *y, int n)
{
    mm_ffn_calls++;
    mm_prompt_bad += n != 12;
    real_ops.matmul_id(b, wg, x, 1, ids, k, g, n);
    real_ops.matmul_id(b, wu, x, 1, ids, k, u, n);
    real_ops.swiglu(b, g, u, g, (size_t)n * (size_t)k * (size_t)wg->rows);
    real_ops.matmul_id(b, wd, g, k, ids, k, y, n);
}
static void count_attention(mr_backend *b, const mr_kv_cache *kv, int layer, const int32_t *table, const float *q,
                            const int32_t *pos, int n, int heads, float scale, float *out)
{
    att_gen_bad += n != 1;
    real_ops.attention(b, kv, layer, table, q, pos, n, heads, scale, out);
}
/* pos_first must be the call's first position (CPU backend memory is the
 * host's: pos[0] reads directly) */
static void count_attention_prompt(mr_backend *b, const mr_kv_cache *kv, int layer, const int32_t *table,
                                   const float *q, const int32_t *pos, int n, int heads, float scale, float *out,
                                   int pos_first)
{
    att_prompt_calls++;
    att_prompt_bad += (n != 7 && n != 5) || pos[0] != pos_first;
    att_prompt_deep += pos_first > 0;
    real_ops.attention(b, kv, layer, table, q, pos, n, heads, scale, out);
}

START_TEST(rows_routed_by_kind)
{
    mr_model_opts o = {.n_ctx = 64, .n_seqs = 5, .block_tokens = 8};
    mr_err err;
    be = mr_backend_cpu_create(&err);
    ck_assert_msg(be != NULL, "%s", err.msg);
    real_ops = *be;
    be->batch_variant_rows = 3;
    be->matmul = count_matmul;
    be->matmul_prompt = count_matmul_prompt;
    be->matmul_id = count_matmul_id;
    be->matmul_id_prompt = count_matmul_id_prompt;
    be->moe_ffn_prompt = count_moe_ffn_prompt;
    be->attention = count_attention;
    be->attention_prompt = count_attention_prompt;
    be->kv_store_multi = NULL; /* generated segments one attention call each */
    be->attention_multi = NULL;
    ck_assert_msg(mr_model_load(fixture_path("models/qwen3moe/model-BF16.gguf"), be, &o, &model, &err) == 0, "%s",
                  err.msg);
    int V = mr_model_hparams(model)->n_vocab;
    n_vocab_rows = V;
    int32_t p[5][8];
    for (int i = 0; i < 5; i++)
        lcg_prompt(p[i], 8, 60 + (uint32_t)i, V);
    /* solo: sequences 0-2 take a 6-token prompt and decode p[i][6]; 3 and 4
     * run prompts of 7 (all rows) and 5 tokens */
    float *solo = malloc(sizeof(float) * (size_t)V * 10), *got = malloc(sizeof(float) * (size_t)V * 10);
    mr_seq *sq[5];
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(mr_seq_new(model, &sq[i], &err), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(mr_model_forward(model, sq[i], p[i], 6, MR_LOGITS_NONE, NULL, &err), 0);
        ck_assert_int_eq(mr_model_forward_gen(model, sq[i], p[i] + 6, 1, MR_LOGITS_LAST, solo + (size_t)i * V, &err), 0);
    }
    ck_assert_int_eq(mr_model_forward(model, sq[3], p[3], 7, MR_LOGITS_ALL, solo + (size_t)3 * V, &err), 0);
    for (int i = 0; i < 5; i++)
        mr_seq_free(sq[i]);
    /* batched: the three decode steps, then both prompts (4's second chunk,
     * from position 2) */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(mr_seq_new(model, &sq[i], &err), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(mr_model_forward(model, sq[i], p[i], 6, MR_LOGITS_NONE, NULL, &err), 0);
    ck_assert_int_eq(mr_model_forward(model, sq[4], p[4], 2, MR_LOGITS_NONE, NULL, &err), 0);
    mr_batch_item it[5];
    for (int i = 0; i < 3; i++)
        it[i] = (mr_batch_item){.seq = sq[i], .tokens = p[i] + 6, .n = 1, .mode = MR_LOGITS_LAST,
                                .logits = got + (size_t)i * V, .gen = true};
    it[3] = (mr_batch_item){.seq = sq[3], .tokens = p[3], .n = 7, .mode = MR_LOGITS_ALL, .logits = got + (size_t)3 * V};
    it[4] = (mr_batch_item){.seq = sq[4], .tokens = p[4] + 2, .n = 5, .mode = MR_LOGITS_NONE};
    mm_gen_max = mm_prompt_bad = mm_prompt_calls = att_gen_bad = att_prompt_calls = att_prompt_bad = 0;
    att_prompt_deep = mm_head_rows = mm_ffn_calls = 0;
    mm_seq = mm_gen_v0_at = mm_prompt_q0_at = 0;
    ck_assert_msg(mr_model_forward_batch(model, it, 5, &err) == 0, "%s", err.msg);
    ck_assert_int_gt(mm_gen_v0_at, 0);
    ck_assert_int_gt(mm_prompt_q0_at, mm_gen_v0_at);
    ck_assert_int_le(mm_gen_max, 2);
    ck_assert_int_eq(mm_head_rows, 10);
    ck_assert_int_gt(mm_prompt_calls, 0);
    ck_assert_int_gt(mm_ffn_calls, 0); /* a mixture layer's experts in one call */
    ck_assert_int_eq(mm_prompt_bad, 0);
    ck_assert_int_eq(att_gen_bad, 0);
    ck_assert_int_eq(att_prompt_calls, 2 * (int)mr_model_hparams(model)->n_layers);
    ck_assert_int_eq(att_prompt_bad, 0);
    ck_assert_int_eq(att_prompt_deep, (int)mr_model_hparams(model)->n_layers);
    ck_assert(memcmp(solo, got, sizeof(float) * (size_t)V * 10) == 0);
    /* a generated item after a prompt item: refused, nothing changed */
    int len = mr_seq_len(sq[0]);
    mr_batch_item late[2] = {{.seq = sq[4], .tokens = p[4] + 7, .n = 1, .mode = MR_LOGITS_NONE},
                             {.seq = sq[0], .tokens = p[0], .n = 1, .mode = MR_LOGITS_LAST, .logits = got, .gen = true}};
    ck_assert_int_ne(mr_model_forward_batch(model, late, 2, &err), 0);
    ck_assert_msg(strstr(err.msg, "generated item") != NULL, "%s", err.msg);
    ck_assert_int_eq(mr_seq_len(sq[0]), len);
    for (int i = 0; i < 5; i++)
        mr_seq_free(sq[i]);
    free(solo);
    free(got);
    close_model();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("kv");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, pool_refcounts_and_reservations);
    tcase_add_test(tc, budget_sizing);
    tcase_add_test(tc, model_pool_from_budget_and_shared_blocks);
    tcase_add_test(tc, hybrid_budget_leaves_room_for_states);
    tcase_add_loop_test(tc, batched_and_chunked_logits_are_bit_identical, 0, 4);
    tcase_add_test(tc, argmax_mode_matches_host_argmax);
    tcase_add_test(tc, argmax_all_mode_picks_every_row);
    tcase_add_test(tc, skip_grows_without_running);
    tcase_add_test(tc, batch_rejects_bad_items);
    tcase_add_test(tc, rows_routed_by_kind);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

/* Prefix cache: lookups, scopes, reference counts, LRU eviction, stats. */
#include "tests/unit/testutil.h"
#include "worker/prefix.h"

enum { BT = 4 };

/* Allocates n blocks as a sequence would (one reference each). */
static void alloc_blocks(mr_kv_pool *p, int n, int32_t *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = mr_kv_alloc(p, 0);
        ck_assert_int_ge(out[i], 0);
    }
}

static void unref_blocks(mr_kv_pool *p, int n, const int32_t *b)
{
    for (int i = 0; i < n; i++)
        mr_kv_unref(p, b[i]);
}

static void fill(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

START_TEST(lookup_finds_the_longest_cached_run)
{
    mr_err err;
    mr_kv_pool *pool;
    mr_prefix *pc;
    ck_assert_int_eq(mr_kv_pool_new(32, &pool, &err), 0);
    ck_assert_int_eq(mr_prefix_new(pool, BT, 16, &pc, &err), 0);
    int32_t tok[3 * BT + 2], blk[3], got[8];
    fill(tok, 3 * BT + 2, 100);
    alloc_blocks(pool, 3, blk);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", tok, 3, blk), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(mr_kv_refcount(pool, blk[i]), 2);

    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", tok, 3 * BT + 2, 8, got), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(got[i], blk[i]);
    /* bounded by max_blocks and by the tokens given */
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", tok, 3 * BT + 2, 2, got), 2);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", tok, 2 * BT + 3, 8, got), 2);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", tok, BT - 1, 8, got), 0);
    /* a different token inside block 1 stops the match after block 0 */
    int32_t other[3 * BT];
    fill(other, 3 * BT, 100);
    other[BT + 2] = 7;
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", other, 3 * BT, 8, got), 1);
    /* the same block of tokens at another depth is another entry */
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", tok + BT, 2 * BT, 8, got), 0);

    /* inserting the same tokens with other blocks keeps the cached ones */
    int32_t blk2[3];
    alloc_blocks(pool, 3, blk2);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", tok, 3, blk2), 0);
    ck_assert_int_eq(mr_kv_refcount(pool, blk2[0]), 1);
    unref_blocks(pool, 3, blk2);

    /* the cache's references go with it */
    unref_blocks(pool, 3, blk);
    ck_assert_int_eq(mr_kv_pool_n_free(pool), 29);
    mr_prefix_free(pc);
    ck_assert_int_eq(mr_kv_pool_n_free(pool), 32);
    mr_kv_pool_free(pool);
}
END_TEST

START_TEST(scopes_are_isolated)
{
    mr_err err;
    mr_kv_pool *pool;
    mr_prefix *pc;
    ck_assert_int_eq(mr_kv_pool_new(32, &pool, &err), 0);
    ck_assert_int_eq(mr_prefix_new(pool, BT, 16, &pc, &err), 0);
    int32_t tok[2 * BT], blk[2], got[4];
    fill(tok, 2 * BT, 5);
    alloc_blocks(pool, 2, blk);
    ck_assert_int_eq(mr_prefix_insert(pc, "alice", "s1", tok, 2, blk), 2);
    ck_assert_int_eq(mr_prefix_lookup(pc, "alice", "s1", tok, 2 * BT, 4, got), 2);
    ck_assert_int_eq(mr_prefix_lookup(pc, "bob", "s1", tok, 2 * BT, 4, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "alice", "s2", tok, 2 * BT, 4, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "alice", "", tok, 2 * BT, 4, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "alices1", "", tok, 2 * BT, 4, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "", "alices1", tok, 2 * BT, 4, got), 0);
    /* NULL reads as the empty string */
    int32_t blk2[1];
    alloc_blocks(pool, 1, blk2);
    ck_assert_int_eq(mr_prefix_insert(pc, NULL, NULL, tok, 1, blk2), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "", "", tok, 2 * BT, 4, got), 1);
    ck_assert_int_eq(got[0], blk2[0]);
    unref_blocks(pool, 2, blk);
    unref_blocks(pool, 1, blk2);
    mr_prefix_free(pc);
    ck_assert_int_eq(mr_kv_pool_n_free(pool), 32);
    mr_kv_pool_free(pool);
}
END_TEST

START_TEST(lru_eviction_spares_recent_and_used_entries)
{
    mr_err err;
    mr_kv_pool *pool;
    mr_prefix *pc;
    ck_assert_int_eq(mr_kv_pool_new(32, &pool, &err), 0);
    ck_assert_int_eq(mr_prefix_new(pool, BT, 4, &pc, &err), 0);
    int32_t a[2 * BT], b[2 * BT], c[2 * BT], d[2 * BT], ba[2], bb[2], bc[2], bd[2], got[4];
    fill(a, 2 * BT, 10);
    fill(b, 2 * BT, 20);
    fill(c, 2 * BT, 30);
    fill(d, 2 * BT, 40);
    alloc_blocks(pool, 2, ba);
    alloc_blocks(pool, 2, bb);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", a, 2, ba), 2);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", b, 2, bb), 2);
    unref_blocks(pool, 2, ba);
    unref_blocks(pool, 2, bb);
    /* a is used again, so b is the least recently used */
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", a, 2 * BT, 4, got), 2);
    alloc_blocks(pool, 2, bc);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", c, 2, bc), 2);
    mr_prefix_stats st;
    mr_prefix_get_stats(pc, &st);
    ck_assert_int_eq(st.evictions, 2);
    ck_assert_int_eq(st.n_blocks, 4);
    ck_assert_int_eq(st.n_in_use, 2); /* c is still held by its sequence */
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", b, 2 * BT, 4, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", a, 2 * BT, 4, got), 2);
    ck_assert_int_eq(mr_kv_refcount(pool, bb[0]), 0);
    ck_assert_int_eq(mr_kv_refcount(pool, bb[1]), 0);

    /* now a is unused and c in use: d can only take a's blocks, leaf first */
    alloc_blocks(pool, 2, bd);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", d, 2, bd), 2);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", a, 2 * BT, 4, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", c, 2 * BT, 4, got), 2);
    /* all four entries are in use now: nothing more fits, nothing is evicted */
    int32_t e[BT], be_[1];
    fill(e, BT, 50);
    alloc_blocks(pool, 1, be_);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", e, 1, be_), 0);
    ck_assert_int_eq(mr_prefix_evict_one(pc), 0);
    mr_prefix_get_stats(pc, &st);
    ck_assert_int_eq(st.evictions, 4);
    ck_assert_int_eq(st.n_in_use, 4);

    /* released, they go one by one, the deeper block of a chain before its parent */
    unref_blocks(pool, 2, bc);
    ck_assert_int_eq(mr_prefix_evict_one(pc), 1);
    ck_assert_int_eq(mr_kv_refcount(pool, bc[1]), 0);
    ck_assert_int_eq(mr_kv_refcount(pool, bc[0]), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", c, 2 * BT, 4, got), 1);
    unref_blocks(pool, 2, bd);
    unref_blocks(pool, 1, be_);
    while (mr_prefix_evict_one(pc))
        ;
    mr_prefix_get_stats(pc, &st);
    ck_assert_int_eq(st.n_blocks, 0);
    ck_assert_int_eq(mr_kv_pool_n_free(pool), 32);
    mr_prefix_free(pc);
    mr_kv_pool_free(pool);
}
END_TEST

START_TEST(disabled_cache_and_counters)
{
    mr_err err;
    mr_kv_pool *pool;
    mr_prefix *pc;
    ck_assert_int_eq(mr_kv_pool_new(8, &pool, &err), 0);
    ck_assert_int_eq(mr_prefix_new(pool, BT, 0, &pc, &err), 0);
    int32_t tok[BT], blk[1], got[1];
    fill(tok, BT, 1);
    alloc_blocks(pool, 1, blk);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", tok, 1, blk), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", tok, BT, 1, got), 0);
    ck_assert_int_eq(mr_kv_refcount(pool, blk[0]), 1);
    mr_prefix_count(pc, 100, 64);
    mr_prefix_count(pc, 50, 0);
    mr_prefix_stats st;
    mr_prefix_get_stats(pc, &st);
    ck_assert_int_eq(st.prompt_tokens, 150);
    ck_assert_int_eq(st.hit_tokens, 64);
    ck_assert_int_eq(st.capacity, 0);
    unref_blocks(pool, 1, blk);
    mr_prefix_free(pc);
    ck_assert_int_ne(mr_prefix_new(pool, 0, 4, &pc, &err), 0);
    mr_kv_pool_free(pool);
}
END_TEST

START_TEST(session_entries_are_evicted_last)
{
    mr_err err;
    mr_kv_pool *pool;
    mr_prefix *pc;
    ck_assert_int_eq(mr_kv_pool_new(16, &pool, &err), 0);
    ck_assert_int_eq(mr_prefix_new(pool, BT, 4, &pc, &err), 0);
    int32_t s1[2 * BT], o1[BT], o2[BT], o3[BT], bs[2], b1[1], b2[1], b3[1], got[2];
    fill(s1, 2 * BT, 10);
    fill(o1, BT, 30);
    fill(o2, BT, 40);
    fill(o3, BT, 50);
    alloc_blocks(pool, 2, bs);
    alloc_blocks(pool, 1, b1);
    alloc_blocks(pool, 1, b2);
    alloc_blocks(pool, 1, b3);
    /* the session's chain is the oldest entry, the one-off prompts newer */
    ck_assert_int_eq(mr_prefix_insert_session(pc, "t", "", s1, 2, bs), 2);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", o1, 1, b1), 1);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", o2, 1, b2), 1);
    unref_blocks(pool, 2, bs);
    unref_blocks(pool, 1, b1);
    unref_blocks(pool, 1, b2);
    /* full: o3 takes o1's place (oldest non-session), not the session's */
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", o3, 1, b3), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", o1, BT, 1, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", s1, 2 * BT, 2, got), 2);
    unref_blocks(pool, 1, b3);
    /* explicit evictions: o2, o3, then the session chain leaf first */
    ck_assert_int_eq(mr_prefix_evict_one(pc), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", o2, BT, 1, got), 0);
    ck_assert_int_eq(mr_prefix_evict_one(pc), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", o3, BT, 1, got), 0);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", s1, 2 * BT, 2, got), 2);
    ck_assert_int_eq(mr_prefix_evict_one(pc), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", s1, 2 * BT, 2, got), 1);
    /* a plain insert over a session entry keeps it a session entry; a
     * session insert over a plain entry makes it one */
    int32_t o4[BT], b4[1];
    fill(o4, BT, 60);
    alloc_blocks(pool, 1, b4);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", o4, 1, b4), 1);
    ck_assert_int_eq(mr_prefix_insert_session(pc, "t", "", o4, 1, b4), 0);
    unref_blocks(pool, 1, b4);
    ck_assert_int_eq(mr_prefix_insert(pc, "t", "", s1, 1, bs), 0);
    /* both are session entries now: the least recently used goes first */
    ck_assert_int_eq(mr_prefix_evict_one(pc), 1);
    ck_assert_int_eq(mr_prefix_lookup(pc, "t", "", o4, BT, 1, got), 0);
    mr_prefix_free(pc);
    ck_assert_int_eq(mr_kv_pool_n_free(pool), 16);
    mr_kv_pool_free(pool);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("prefix");
    TCase *tc = tcase_create("prefix");
    tcase_add_test(tc, lookup_finds_the_longest_cached_run);
    tcase_add_test(tc, scopes_are_isolated);
    tcase_add_test(tc, lru_eviction_spares_recent_and_used_entries);
    tcase_add_test(tc, session_entries_are_evicted_last);
    tcase_add_test(tc, disabled_cache_and_counters);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

/* proto/: message round trips, checked against msgpack-c's own unpacker as
 * the independent reader, and every kind of malformed input. */
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/chan.h"
#include "proto/mpk.h"
#include "proto/msg.h"
#include "tests/unit/testutil.h"

static int roundtrip(const mr_msg *in, mr_msg *out)
{
    void *buf;
    size_t len;
    mr_err err;
    ck_assert_msg(mr_msg_encode(in, &buf, &len, &err) == 0, "%s", err.msg);
    int rc = mr_msg_decode(buf, len, out, NULL, &err);
    ck_assert_msg(rc == 0, "%s", err.msg);
    free(buf);
    return rc;
}

/* Looks a key up in a map decoded by msgpack-c. */
static const msgpack_object *ref_get(const msgpack_object *map, const char *k)
{
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(k) &&
            memcmp(kv->key.via.str.ptr, k, kv->key.via.str.size) == 0)
            return &kv->val;
    }
    return NULL;
}

static mr_msg make_request(void)
{
    mr_msg m;
    mr_msg_init(&m, MR_MSG_REQUEST, 42);
    m.n_tokens = 5;
    m.tokens = malloc(5 * sizeof *m.tokens);
    for (uint32_t i = 0; i < 5; i++)
        m.tokens[i] = 1000 * i + 7;
    m.tokens[4] = UINT32_MAX;
    m.max_tokens = 17;
    m.samp.temperature = 0.5f;
    m.samp.top_p = 0.75f;
    m.samp.min_p = 0.125f;
    m.samp.top_k = 40;
    m.samp.presence_penalty = -1.5f;
    m.samp.frequency_penalty = 2.0f;
    m.samp.repetition_penalty = 1.25f;
    m.samp.has_seed = true;
    m.samp.seed = 0xfedcba9876543210ull;
    m.samp.logprobs = true;
    m.samp.top_logprobs = 3;
    strcpy(m.tenant, "acme");
    strcpy(m.cache_salt, "salt-\xc3\xa9");
    strcpy(m.session, "user-7");
    m.grammar = strdup("root ::= \"a\"");
    m.n_stop_ids = 2;
    m.stop_ids = malloc(2 * sizeof *m.stop_ids);
    m.stop_ids[0] = 151645;
    m.stop_ids[1] = 0;
    return m;
}

START_TEST(request_roundtrip)
{
    mr_msg m = make_request(), d;
    roundtrip(&m, &d);
    ck_assert_int_eq(d.type, MR_MSG_REQUEST);
    ck_assert_uint_eq(d.id, 42);
    ck_assert_uint_eq(d.n_tokens, 5);
    for (uint32_t i = 0; i < 5; i++)
        ck_assert_uint_eq(d.tokens[i], m.tokens[i]);
    ck_assert_uint_eq(d.max_tokens, 17);
    ck_assert_float_eq(d.samp.temperature, 0.5f);
    ck_assert_float_eq(d.samp.top_p, 0.75f);
    ck_assert_float_eq(d.samp.min_p, 0.125f);
    ck_assert_uint_eq(d.samp.top_k, 40);
    ck_assert_float_eq(d.samp.presence_penalty, -1.5f);
    ck_assert_float_eq(d.samp.frequency_penalty, 2.0f);
    ck_assert_float_eq(d.samp.repetition_penalty, 1.25f);
    ck_assert(d.samp.has_seed);
    ck_assert_uint_eq(d.samp.seed, 0xfedcba9876543210ull);
    ck_assert(d.samp.logprobs);
    ck_assert_uint_eq(d.samp.top_logprobs, 3);
    ck_assert_str_eq(d.tenant, "acme");
    ck_assert_str_eq(d.cache_salt, "salt-\xc3\xa9");
    ck_assert_str_eq(d.session, "user-7");
    ck_assert_str_eq(d.grammar, "root ::= \"a\"");
    ck_assert_uint_eq(d.n_stop_ids, 2);
    ck_assert_uint_eq(d.stop_ids[0], 151645);
    mr_msg_free(&d);

    /* without seed / grammar / session: absent stays absent */
    m.samp.has_seed = false;
    m.session[0] = 0;
    free(m.grammar);
    m.grammar = NULL;
    roundtrip(&m, &d);
    ck_assert(!d.samp.has_seed);
    ck_assert_ptr_null(d.grammar);
    ck_assert_str_eq(d.session, "");
    mr_msg_free(&d);
    mr_msg_free(&m);
}
END_TEST

/* The bytes we produce are plain msgpack: msgpack-c reads them back as one
 * map with the documented keys and values. */
START_TEST(encoding_read_by_msgpack_c)
{
    mr_msg m = make_request();
    void *buf;
    size_t len;
    mr_err err;
    ck_assert(mr_msg_encode(&m, &buf, &len, &err) == 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    ck_assert_int_eq(msgpack_unpack_next(&u, buf, len, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, len);
    ck_assert_int_eq(u.data.type, MSGPACK_OBJECT_MAP);
    const msgpack_object *o = ref_get(&u.data, "type");
    ck_assert_ptr_nonnull(o);
    ck_assert_int_eq(o->type, MSGPACK_OBJECT_STR);
    ck_assert_int_eq(memcmp(o->via.str.ptr, "request", 7), 0);
    o = ref_get(&u.data, "v");
    ck_assert_uint_eq(o->via.u64, MR_PROTO_VERSION);
    o = ref_get(&u.data, "tokens");
    ck_assert_int_eq(o->type, MSGPACK_OBJECT_ARRAY);
    ck_assert_uint_eq(o->via.array.size, 5);
    ck_assert_uint_eq(o->via.array.ptr[4].via.u64, UINT32_MAX);
    o = ref_get(&u.data, "seed");
    ck_assert_uint_eq(o->via.u64, 0xfedcba9876543210ull);
    o = ref_get(&u.data, "temperature");
    ck_assert(o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64);
    ck_assert(o->via.f64 == 0.5);
    msgpack_unpacked_destroy(&u);
    free(buf);
    mr_msg_free(&m);
}
END_TEST

START_TEST(other_types_roundtrip)
{
    mr_msg m, d;
    /* tokens with logprobs and top logprobs */
    mr_msg_init(&m, MR_MSG_TOKENS, 7);
    m.n_tokens = 2;
    m.tokens = calloc(2, sizeof *m.tokens);
    m.tokens[0] = 3;
    m.tokens[1] = 9;
    m.logprobs = calloc(2, sizeof *m.logprobs);
    m.logprobs[0] = -0.25f;
    m.logprobs[1] = -3.5f;
    m.n_top = 2;
    m.top_ids = calloc(4, sizeof *m.top_ids);
    m.top_lps = calloc(4, sizeof *m.top_lps);
    for (int i = 0; i < 4; i++) {
        m.top_ids[i] = (uint32_t)(10 + i);
        m.top_lps[i] = -(float)i;
    }
    roundtrip(&m, &d);
    ck_assert_uint_eq(d.n_tokens, 2);
    ck_assert_uint_eq(d.tokens[1], 9);
    ck_assert_float_eq(d.logprobs[1], -3.5f);
    ck_assert_uint_eq(d.n_top, 2);
    ck_assert_uint_eq(d.top_ids[3], 13);
    ck_assert_float_eq(d.top_lps[3], -3.0f);
    mr_msg_free(&d);
    mr_msg_free(&m);

    mr_msg_init(&m, MR_MSG_FINAL, 7);
    m.finish = MR_FINISH_LENGTH;
    m.prompt_tokens = 11;
    m.completion_tokens = 5;
    m.cached_tokens = 4;
    roundtrip(&m, &d);
    ck_assert_int_eq(d.finish, MR_FINISH_LENGTH);
    ck_assert_uint_eq(d.prompt_tokens, 11);
    ck_assert_uint_eq(d.completion_tokens, 5);
    ck_assert_uint_eq(d.cached_tokens, 4);
    mr_msg_free(&d);

    mr_msg_make_error(&m, 9, "overloaded", "queue full (%d)", 3);
    roundtrip(&m, &d);
    ck_assert_int_eq(d.type, MR_MSG_ERROR);
    ck_assert_uint_eq(d.id, 9);
    ck_assert_str_eq(d.code, "overloaded");
    ck_assert_str_eq(d.text, "queue full (3)");
    mr_msg_free(&d);

    mr_msg_init(&m, MR_MSG_CAPACITY, 0);
    m.kv_free = 100;
    m.kv_total = 200;
    m.running = 3;
    m.queued = 4;
    m.vram_free = 1ull << 40;
    m.vram_total = (1ull << 40) + 5;
    m.block_tokens = 16;
    m.cache_blocks = 7;
    m.cache_capacity = 190;
    m.cache_prompt_tokens = 1ull << 35;
    m.cache_hit_tokens = 12345;
    m.cache_evictions = 9;
    roundtrip(&m, &d);
    ck_assert_uint_eq(d.block_tokens, 16);
    ck_assert_uint_eq(d.cache_blocks, 7);
    ck_assert_uint_eq(d.cache_capacity, 190);
    ck_assert_uint_eq(d.cache_prompt_tokens, 1ull << 35);
    ck_assert_uint_eq(d.cache_hit_tokens, 12345);
    ck_assert_uint_eq(d.cache_evictions, 9);
    ck_assert_uint_eq(d.kv_free, 100);
    ck_assert_uint_eq(d.kv_total, 200);
    ck_assert_uint_eq(d.running, 3);
    ck_assert_uint_eq(d.queued, 4);
    ck_assert_uint_eq(d.vram_total, (1ull << 40) + 5);
    mr_msg_free(&d);

    mr_msg_init(&m, MR_MSG_HELLO, 0);
    strcpy(m.model, "qwen3");
    m.n_ctx = 4096;
    m.n_vocab = 151936;
    m.pid = 1234;
    m.device = -1;
    roundtrip(&m, &d);
    ck_assert_str_eq(d.model, "qwen3");
    ck_assert_uint_eq(d.n_ctx, 4096);
    ck_assert_uint_eq(d.n_vocab, 151936);
    ck_assert_int_eq(d.device, -1);
    mr_msg_free(&d);

    mr_msg_init(&m, MR_MSG_CANCEL, 5);
    roundtrip(&m, &d);
    ck_assert_int_eq(d.type, MR_MSG_CANCEL);
    ck_assert_uint_eq(d.id, 5);
    mr_msg_free(&d);

    mr_msg_init(&m, MR_MSG_CAP_QUERY, 0);
    roundtrip(&m, &d);
    ck_assert_int_eq(d.type, MR_MSG_CAP_QUERY);
    mr_msg_free(&d);
}
END_TEST

/* Hand-built messages through msgpack-c's packer. */
typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} pb;

static void pb_init(pb *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void pstr(pb *b, const char *s)
{
    msgpack_pack_str(&b->pk, strlen(s));
    msgpack_pack_str_body(&b->pk, s, strlen(s));
}

/* Starts a fresh message: a map of n entries whose first three are the
 * version v, the type and the id (the caller packs the other n - 3). */
static void pb_head(pb *b, uint32_t n, uint8_t v, const char *type, uint8_t id)
{
    pb_init(b);
    msgpack_pack_map(&b->pk, n);
    pstr(b, "v");
    msgpack_pack_uint8(&b->pk, v);
    pstr(b, "type");
    pstr(b, type);
    pstr(b, "id");
    msgpack_pack_uint8(&b->pk, id);
}

static int decode_pb(pb *b, mr_msg *m, uint64_t *id, mr_err *err)
{
    int rc = mr_msg_decode(b->sb.data, b->sb.size, m, id, err);
    msgpack_sbuffer_destroy(&b->sb);
    return rc;
}

START_TEST(rejects_bad_messages)
{
    mr_msg m;
    mr_err err;
    uint64_t id;
    pb b;

    /* not a map */
    pb_init(&b);
    msgpack_pack_array(&b.pk, 0);
    ck_assert_int_eq(decode_pb(&b, &m, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "map"));

    /* unknown type: error, but the id is reported for the reply */
    pb_init(&b);
    msgpack_pack_map(&b.pk, 3);
    pstr(&b, "v");
    msgpack_pack_uint8(&b.pk, 1);
    pstr(&b, "id");
    msgpack_pack_uint8(&b.pk, 77);
    pstr(&b, "type");
    pstr(&b, "launch_missiles");
    ck_assert_int_eq(decode_pb(&b, &m, &id, &err), -1);
    ck_assert_uint_eq(id, 77);
    ck_assert_ptr_nonnull(strstr(err.msg, "unknown message type"));

    /* wrong version */
    pb_head(&b, 3, 99, "cancel", 1);
    ck_assert_int_eq(decode_pb(&b, &m, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "version"));

    /* missing required field */
    pb_head(&b, 3, 1, "request", 1);
    ck_assert_int_eq(decode_pb(&b, &m, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "missing field"));

    /* wrong field type: tokens as a string */
    pb_head(&b, 5, 1, "request", 1);
    pstr(&b, "max_tokens");
    msgpack_pack_uint8(&b.pk, 1);
    pstr(&b, "tokens");
    pstr(&b, "1,2,3");
    ck_assert_int_eq(decode_pb(&b, &m, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "tokens"));

    /* out-of-range: negative token id, token > uint32, temperature 3, NaN */
    const char *bad[] = {"neg", "big", "temp", "nan", "dup", "top", "salt"};
    for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
        pb_init(&b);
        int extra = !strcmp(bad[t], "temp") || !strcmp(bad[t], "nan") || !strcmp(bad[t], "dup") ||
                    !strcmp(bad[t], "top") || !strcmp(bad[t], "salt");
        msgpack_pack_map(&b.pk, 5 + extra);
        pstr(&b, "v");
        msgpack_pack_uint8(&b.pk, 1);
        pstr(&b, "type");
        pstr(&b, "request");
        pstr(&b, "id");
        msgpack_pack_uint8(&b.pk, 1);
        pstr(&b, "max_tokens");
        msgpack_pack_uint8(&b.pk, 1);
        pstr(&b, "tokens");
        msgpack_pack_array(&b.pk, 1);
        if (!strcmp(bad[t], "neg"))
            msgpack_pack_int8(&b.pk, -1);
        else if (!strcmp(bad[t], "big"))
            msgpack_pack_uint64(&b.pk, 1ull << 32);
        else
            msgpack_pack_uint8(&b.pk, 1);
        if (!strcmp(bad[t], "temp")) {
            pstr(&b, "temperature");
            msgpack_pack_double(&b.pk, 3.0);
        } else if (!strcmp(bad[t], "nan")) {
            pstr(&b, "top_p");
            msgpack_pack_double(&b.pk, 0.0 / 0.0);
        } else if (!strcmp(bad[t], "dup")) {
            pstr(&b, "id");
            msgpack_pack_uint8(&b.pk, 2);
        } else if (!strcmp(bad[t], "top")) {
            pstr(&b, "top_logprobs");
            msgpack_pack_uint8(&b.pk, 21);
        } else if (!strcmp(bad[t], "salt")) {
            char big[400];
            memset(big, 'x', sizeof big - 1);
            big[sizeof big - 1] = 0;
            pstr(&b, "cache_salt");
            pstr(&b, big);
        }
        ck_assert_msg(decode_pb(&b, &m, NULL, &err) == -1, "case %s accepted", bad[t]);
    }

    /* a 5-byte message that claims a 4-billion-entry array: refused before any allocation */
    static const uint8_t liar[] = {0x81, 0xa6, 't', 'o', 'k', 'e', 'n', 's', 0xdd, 0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(mr_msg_decode(liar, sizeof liar, &m, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "exceeds"));

    /* unknown fields are skipped, even nested ones */
    pb_init(&b);
    msgpack_pack_map(&b.pk, 4);
    pstr(&b, "v");
    msgpack_pack_uint8(&b.pk, 1);
    pstr(&b, "future");
    msgpack_pack_map(&b.pk, 1);
    pstr(&b, "x");
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_nil(&b.pk);
    msgpack_pack_bin(&b.pk, 3);
    msgpack_pack_bin_body(&b.pk, "abc", 3);
    pstr(&b, "type");
    pstr(&b, "cancel");
    pstr(&b, "id");
    msgpack_pack_uint8(&b.pk, 3);
    ck_assert_msg(decode_pb(&b, &m, NULL, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(m.id, 3);
    mr_msg_free(&m);

    /* tokens: logprobs count must match ids */
    pb_head(&b, 5, 1, "tokens", 3);
    pstr(&b, "ids");
    msgpack_pack_array(&b.pk, 2);
    msgpack_pack_uint8(&b.pk, 1);
    msgpack_pack_uint8(&b.pk, 2);
    pstr(&b, "logprobs");
    msgpack_pack_array(&b.pk, 1);
    msgpack_pack_float(&b.pk, -1.0f);
    ck_assert_int_eq(decode_pb(&b, &m, NULL, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "logprobs"));
}
END_TEST

/* Every proper prefix of a valid message, and every single-byte corruption,
 * is handled without a crash (ASan/UBSan watch); prefixes are all refused. */
START_TEST(truncations_and_flips)
{
    mr_msg m = make_request(), d;
    void *buf;
    size_t len;
    mr_err err;
    ck_assert(mr_msg_encode(&m, &buf, &len, &err) == 0);
    for (size_t i = 0; i < len; i++)
        ck_assert_msg(mr_msg_decode(buf, i, &d, NULL, &err) == -1, "prefix %zu accepted", i);
    uint8_t *c = malloc(len);
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(c, buf, len);
            c[i] ^= (uint8_t)(1u << bit);
            if (mr_msg_decode(c, len, &d, NULL, &err) == 0)
                mr_msg_free(&d);
        }
    free(c);
    free(buf);
    mr_msg_free(&m);
}
END_TEST

START_TEST(encode_validates)
{
    mr_msg m;
    mr_err err;
    void *buf;
    size_t len;
    mr_msg_init(&m, MR_MSG_REQUEST, 1); /* no tokens */
    ck_assert_int_eq(mr_msg_encode(&m, &buf, &len, &err), -1);
    mr_msg_init(&m, MR_MSG_REQUEST, 0);
    ck_assert_int_eq(mr_msg_encode(&m, &buf, &len, &err), -1);
    mr_msg_init(&m, MR_MSG_ERROR, 1); /* empty code */
    ck_assert_int_eq(mr_msg_encode(&m, &buf, &len, &err), -1);
}
END_TEST

START_TEST(mpk_reader)
{
    mr_mpk r;
    mr_err err;
    uint64_t u;
    int64_t i;
    double d;
    /* int16 -300, uint64 max, float64 1.5, fixneg -3 */
    static const uint8_t b[] = {0xd1, 0xfe, 0xd4, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xcb,
                                0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xfd};
    mr_mpk_init(&r, b, sizeof b);
    ck_assert_int_eq(mr_mpk_int(&r, &i, &err), 0);
    ck_assert_int_eq(i, -300);
    ck_assert_int_eq(mr_mpk_uint(&r, &u, &err), 0);
    ck_assert_uint_eq(u, UINT64_MAX);
    ck_assert_int_eq(mr_mpk_num(&r, &d, &err), 0);
    ck_assert(d == 1.5);
    ck_assert_int_eq(mr_mpk_uint(&r, &u, &err), -1); /* -3 is not unsigned */
    /* nesting bomb: 100 nested arrays */
    uint8_t deep[100];
    memset(deep, 0x91, sizeof deep);
    deep[99] = 0xc0;
    mr_mpk_init(&r, deep, sizeof deep);
    ck_assert_int_eq(mr_mpk_skip(&r, 16, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "deep"));
}
END_TEST

START_TEST(chan_ipc)
{
    char url[128];
    snprintf(url, sizeof url, "ipc:///tmp/memra-test-proto-%d.sock", (int)getpid());
    mr_chan w = {0}, g = {0};
    mr_err err;
    ck_assert_msg(mr_chan_listen(&w, url, &err) == 0, "%s", err.msg);
    ck_assert_msg(mr_chan_dial(&g, url, NULL, NULL, &err) == 0, "%s", err.msg);
    mr_msg m = make_request(), d;
    ck_assert_msg(mr_chan_send(&g, &m, 2000, &err) == 0, "%s", err.msg);
    uint64_t bad;
    ck_assert_int_eq(mr_chan_recv(&w, &d, 5000, &bad, &err), MR_CHAN_OK);
    ck_assert_uint_eq(d.id, 42);
    ck_assert_uint_eq(d.n_tokens, 5);
    mr_msg_free(&d);
    /* garbage is reported as bad, and the channel keeps working */
    ck_assert_int_eq(mr_chan_send_raw(&g, "\xc1\xc1", 2, &err), 0);
    ck_assert_int_eq(mr_chan_recv(&w, &d, 5000, &bad, &err), MR_CHAN_BAD);
    mr_msg_init(&d, MR_MSG_CANCEL, 42);
    ck_assert_int_eq(mr_chan_send(&w, &d, 2000, &err), 0);
    mr_msg e;
    ck_assert_int_eq(mr_chan_recv(&g, &e, 5000, &bad, &err), MR_CHAN_OK);
    ck_assert_int_eq(e.type, MR_MSG_CANCEL);
    mr_msg_free(&e);
    ck_assert_int_eq(mr_chan_recv(&g, &e, 50, &bad, &err), MR_CHAN_TIMEOUT);
    mr_msg_free(&m);
    mr_chan_close(&g);
    mr_chan_close(&w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("msg");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, request_roundtrip);
    tcase_add_test(tc, encoding_read_by_msgpack_c);
    tcase_add_test(tc, other_types_roundtrip);
    tcase_add_test(tc, rejects_bad_messages);
    tcase_add_test(tc, truncations_and_flips);
    tcase_add_test(tc, encode_validates);
    tcase_add_test(tc, mpk_reader);
    tcase_add_test(tc, chan_ipc);
    suite_add_tcase(s, tc);
    return run_suite(s);
}

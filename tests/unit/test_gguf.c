/* GGUF reader and writer.
 *
 * References: the upstream-written fixture files, checked against the
 * transformers config and tokenizer.json next to them and against the
 * safetensors checkpoint; upstream's own byte layout (a fixture rewritten by
 * our writer must be the same file, byte for byte); and hand-built
 * corruptions whose expected errors follow from the format. */
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/gguf.h"
#include "common/half.h"
#include "tests/unit/testutil.h"

/* ---- small helpers ---- */

static void *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(sz ? (size_t)sz : 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

static mr_gguf *open_ok(const char *path)
{
    mr_gguf *g = NULL;
    mr_err err = {{0}};
    int rc = mr_gguf_open(path, &g, &err);
    ck_assert_msg(rc == 0, "open %s: %s", path, err.msg);
    ck_assert_ptr_nonnull(g);
    return g;
}

static uint64_t get_u64(const mr_gguf *g, const char *key)
{
    uint64_t v = 0;
    mr_err err;
    ck_assert_msg(mr_gguf_get_u64(g, key, &v, &err) == 0, "%s", err.msg);
    return v;
}

static bool str_is(mr_str s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static char tmpdir[256];

static void make_tmpdir(void) { tmpdir_make(tmpdir, sizeof tmpdir, "gguf"); }

static void rm_tmpdir(void) { tmpdir_remove(tmpdir); }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- fixtures: every file opens and agrees with its references ---- */

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    ck_assert_msg(j != NULL, "%s: %s", path, je.text);
    return j;
}

static int64_t cfg_int(json_t *cfg, const char *k, int64_t dflt)
{
    json_t *v = json_object_get(cfg, k);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

/* The tensors tile the data section in file order: each starts at the
 * aligned end of the previous, and the last ends (aligned) at the end of the
 * file.  This ties every tensor's type and shape to the actual data size. */
static void check_data_tiling(const mr_gguf *g, const char *path)
{
    uint64_t expect = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const mr_gguf_tensor *t = &g->tensors[i];
        ck_assert_msg(t->offset == expect, "%s: tensor %s at %llu, expected %llu", path, t->name,
                      (unsigned long long)t->offset, (unsigned long long)expect);
        ck_assert_ptr_eq(t->data, g->base + g->data_offset + t->offset);
        expect = (t->offset + t->nbytes + g->alignment - 1) / g->alignment * g->alignment;
        ck_assert_uint_eq(t->nbytes, mr_row_size(t->type, t->ne[0]) *
                                         (size_t)(t->ne[1] * t->ne[2] * t->ne[3]));
    }
    ck_assert_msg(g->data_offset + expect == g->size, "%s: data ends at %llu, file size %zu", path,
                  (unsigned long long)(g->data_offset + expect), g->size);
}

/* tokens and merges against the tokenizer.json the converter read */
static void check_tokenizer(const mr_gguf *g, json_t *tok, int64_t vocab)
{
    const mr_gguf_kv *toks, *types, *merges;
    mr_err err;
    ck_assert_msg(mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, &err) == 0,
                  "%s", err.msg);
    ck_assert_int_eq((int64_t)toks->v.arr.n, vocab);
    ck_assert_int_eq(mr_gguf_get_arr(g, "tokenizer.ggml.token_type", MR_GGUF_INT32, &types, &err), 0);
    ck_assert_uint_eq(types->v.arr.n, toks->v.arr.n);
    /* the wrong element type is refused with the key named */
    ck_assert_int_eq(mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_INT32, &types, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "tokenizer.ggml.tokens"));

    json_t *model = json_object_get(tok, "model");
    json_t *jv = json_object_get(model, "vocab");
    const char *k;
    json_t *v;
    size_t seen = 0;
    json_object_foreach(jv, k, v)
    {
        int64_t id = json_integer_value(v);
        if (id < 0 || id >= vocab || !str_is(toks->v.arr.strs[id], k))
            ck_abort_msg("token %lld ('%s') differs", (long long)id, k);
        seen++;
    }
    size_t i;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, v)
    {
        int64_t id = json_integer_value(json_object_get(v, "id"));
        ck_assert(id >= 0 && id < vocab);
        ck_assert(str_is(toks->v.arr.strs[id], json_string_value(json_object_get(v, "content"))));
        seen++;
    }
    ck_assert_uint_gt(seen, 1000);

    json_t *jm = json_object_get(model, "merges");
    ck_assert_int_eq(mr_gguf_get_arr(g, "tokenizer.ggml.merges", MR_GGUF_STRING, &merges, &err), 0);
    ck_assert_uint_eq(merges->v.arr.n, json_array_size(jm));
    json_array_foreach(jm, i, v)
    {
        char buf[1024];
        if (json_is_array(v))
            snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(v, 0)),
                     json_string_value(json_array_get(v, 1)));
        else
            snprintf(buf, sizeof buf, "%s", json_string_value(v));
        if (!str_is(merges->v.arr.strs[i], buf))
            ck_abort_msg("merge %zu differs", i);
    }
}

static void check_model_file(const char *path)
{
    /* .../models/<arch>/model-<TYPE>.gguf */
    char dir[1024], arch[64], ftype[32], key[160];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    snprintf(arch, sizeof arch, "%s", strrchr(dir, '/') + 1);
    const char *fn = strrchr(path, '/') + strlen("/model-");
    snprintf(ftype, sizeof ftype, "%.*s", (int)(strlen(fn) - strlen(".gguf")), fn);
    if (strcmp(ftype, "Q4_K_M") == 0)
        ftype[4] = '\0'; /* the mix's main type is Q4_K */

    char jpath[1100];
    snprintf(jpath, sizeof jpath, "%s/reference.json", dir);
    json_t *ref = load_json(jpath);
    json_t *cfg = json_object_get(ref, "config");
    snprintf(jpath, sizeof jpath, "%s/hf/tokenizer.json", dir);
    json_t *tok = load_json(jpath);

    mr_gguf *g = open_ok(path);
    mr_err err;
    char *s = NULL;
    ck_assert_int_eq(mr_gguf_get_str(g, "general.architecture", &s, &err), 0);
    ck_assert_str_eq(s, arch);
    free(s);
    ck_assert(g->version == 3);

    int64_t nextn = 0;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    if (mr_gguf_find(g, key))
        nextn = (int64_t)get_u64(g, key);
    snprintf(key, sizeof key, "%s.block_count", arch);
    int64_t n_layer = (int64_t)get_u64(g, key);
    ck_assert_int_eq(n_layer, cfg_int(cfg, "num_hidden_layers", -1) + nextn);
    int64_t n_embd = cfg_int(cfg, "hidden_size", -1);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    ck_assert_int_eq((int64_t)get_u64(g, key), n_embd);
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "num_attention_heads", -1));
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "num_key_value_heads", -1));
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "head_dim", -1));
    snprintf(key, sizeof key, "%s.context_length", arch);
    ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "max_position_embeddings", -1));
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "intermediate_size", -1));
    float eps;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    ck_assert_int_eq(mr_gguf_get_f32(g, key, &eps, &err), 0);
    ck_assert_float_eq_tol(eps, json_real_value(json_object_get(cfg, "rms_norm_eps")), 1e-12);
    int64_t n_exp = cfg_int(cfg, "num_local_experts", cfg_int(cfg, "num_experts", 0));
    if (n_exp) {
        snprintf(key, sizeof key, "%s.expert_count", arch);
        ck_assert_int_eq((int64_t)get_u64(g, key), n_exp);
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "num_experts_per_tok", -1));
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
        ck_assert_int_eq((int64_t)get_u64(g, key), cfg_int(cfg, "moe_intermediate_size", -1));
    }
    int64_t vocab = cfg_int(cfg, "vocab_size", -1);
    const mr_gguf_tensor *emb = mr_gguf_find_tensor(g, "token_embd.weight");
    ck_assert_ptr_nonnull(emb);
    ck_assert_uint_eq(emb->n_dims, 2);
    ck_assert_int_eq(emb->ne[0], n_embd);
    ck_assert_int_eq(emb->ne[1], vocab);
    ck_assert_ptr_null(mr_gguf_find_tensor(g, "no.such.tensor"));

    /* every layer has tensors, none is out of range, 1-D tensors are F32,
     * and the file's named type is the most used one among the rest */
    int per_layer[64] = {0};
    int of_type[MR_TYPE_COUNT] = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const mr_gguf_tensor *t = &g->tensors[i];
        ck_assert_ptr_eq(mr_gguf_find_tensor(g, t->name), t);
        int il;
        if (sscanf(t->name, "blk.%d.", &il) == 1) {
            ck_assert(il >= 0 && il < n_layer && il < 64);
            per_layer[il]++;
        }
        if (t->n_dims == 1)
            ck_assert_msg(t->type == MR_TYPE_F32, "%s: %s is %s", path, t->name,
                          mr_type_name(t->type));
        else if (strcmp(t->name, "token_embd.weight") && strcmp(t->name, "output.weight"))
            of_type[t->type]++;
    }
    for (int64_t il = 0; il < n_layer; il++)
        ck_assert_msg(per_layer[il] > 0, "%s: layer %lld has no tensors", path, (long long)il);
    int best = 0;
    for (int t = 0; t < MR_TYPE_COUNT; t++)
        if (of_type[t] > of_type[best])
            best = t;
    ck_assert_msg(best == mr_type_from_name(ftype), "%s: most tensors are %s", path,
                  mr_type_name(best));
    check_data_tiling(g, path);
    check_tokenizer(g, tok, vocab);
    mr_gguf_close(g);
    json_decref(ref);
    json_decref(tok);
}

START_TEST(fixture_models)
{
    glob_t gl;
    char pat[4096];
    snprintf(pat, sizeof pat, "%s", fixture_path("models/*/model-*.gguf"));
    ck_assert_int_eq(glob(pat, 0, NULL, &gl), 0);
    ck_assert_uint_ge(gl.gl_pathc, 20);
    for (size_t i = 0; i < gl.gl_pathc; i++)
        check_model_file(gl.gl_pathv[i]);
    globfree(&gl);
}
END_TEST

START_TEST(fixture_vocabs)
{
    glob_t gl;
    char pat[4096];
    snprintf(pat, sizeof pat, "%s", fixture_path("vocab/*.gguf"));
    ck_assert_int_eq(glob(pat, 0, NULL, &gl), 0);
    ck_assert_uint_ge(gl.gl_pathc, 10);
    for (size_t f = 0; f < gl.gl_pathc; f++) {
        const char *path = gl.gl_pathv[f];
        mr_gguf *g = open_ok(path);
        mr_err err;
        ck_assert_uint_eq(g->n_tensors, 0);
        ck_assert_uint_le(g->data_offset, g->size); /* no padding after the last value */
        const mr_gguf_kv *toks, *kv;
        ck_assert_msg(mr_gguf_get_arr(g, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, &err) == 0,
                      "%s: %s", path, err.msg);
        ck_assert_uint_gt(toks->v.arr.n, 1000);
        if ((kv = mr_gguf_find(g, "tokenizer.ggml.token_type")))
            ck_assert_uint_eq(kv->v.arr.n, toks->v.arr.n);
        if ((kv = mr_gguf_find(g, "tokenizer.ggml.scores"))) {
            ck_assert_int_eq(kv->v.arr.type, MR_GGUF_FLOAT32);
            ck_assert_uint_eq(kv->v.arr.n, toks->v.arr.n);
            uint64_t nans = 0;
            for (uint64_t i = 0; i < kv->v.arr.n; i++)
                nans += isnan(mr_gguf_arr_f64(kv, i));
            ck_assert_uint_eq(nans, 0);
        }
        /* every id in the upstream expected outputs is a token of this vocabulary */
        char out[4200];
        snprintf(out, sizeof out, "%s.out", path);
        FILE *fo = fopen(out, "r");
        if (fo) {
            long id, max_id = -1;
            while (fscanf(fo, "%ld", &id) == 1)
                if (id > max_id)
                    max_id = id;
            fclose(fo);
            ck_assert_int_ge(max_id, 0);
            ck_assert_int_lt(max_id, (long)toks->v.arr.n);
        }
        mr_gguf_close(g);
    }
    globfree(&gl);
}
END_TEST

/* Tensor bytes are where the header says: compare with the checkpoint the
 * converter read (float32 values that are bf16-exact). */
START_TEST(fixture_data_matches_checkpoint)
{
    size_t n;
    uint8_t *st = read_all(fixture_path("models/qwen3/hf/model.safetensors"), &n);
    uint64_t hl;
    memcpy(&hl, st, 8);
    ck_assert_uint_lt(hl + 8, n);
    json_error_t je;
    json_t *h = json_loadb((const char *)st + 8, hl, 0, &je);
    ck_assert_ptr_nonnull(h);
    mr_gguf *g = open_ok(fixture_path("models/qwen3/model-BF16.gguf"));
    static const char *const pairs[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"lm_head.weight", "output.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"},
        {"model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"},
    };
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        json_t *e = json_object_get(h, pairs[p][0]);
        ck_assert_ptr_nonnull(e);
        ck_assert_str_eq(json_string_value(json_object_get(e, "dtype")), "F32");
        size_t a = (size_t)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
        size_t b = (size_t)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1));
        const float *src = (const float *)(st + 8 + hl + a);
        const mr_gguf_tensor *t = mr_gguf_find_tensor(g, pairs[p][1]);
        ck_assert_ptr_nonnull(t);
        size_t nel = (b - a) / 4;
        ck_assert_int_eq((int64_t)nel, t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        size_t bad = 0;
        for (size_t i = 0; i < nel; i++) {
            float v;
            if (t->type == MR_TYPE_BF16) {
                uint16_t x;
                memcpy(&x, (const uint8_t *)t->data + 2 * i, 2);
                v = mr_bf16_to_f32(x);
            } else {
                ck_assert_int_eq(t->type, MR_TYPE_F32);
                memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
            }
            float ref;
            memcpy(&ref, &src[i], 4);
            bad += v != ref;
        }
        ck_assert_msg(bad == 0, "%s: %zu of %zu values differ", pairs[p][1], bad, nel);
    }
    mr_gguf_close(g);
    json_decref(h);
    free(st);
}
END_TEST

/* ---- damaged input ---- */

/* Plain checks, not ck_assert: these run tens of thousands of times and
 * every ck_assert records a mark point. */
static void expect_error(const void *buf, size_t n, const char *what, const char *needle)
{
    mr_gguf *g = (mr_gguf *)1;
    mr_err err = {{0}};
    int rc = mr_gguf_open_mem(buf, n, &g, &err);
    if (rc != -1 || g != NULL)
        ck_abort_msg("%s (%zu bytes): accepted", what, n);
    if (strncmp(err.msg, "gguf: ", 6) != 0)
        ck_abort_msg("%s (%zu bytes): message '%s'", what, n, err.msg);
    if (needle && !strstr(err.msg, needle))
        ck_abort_msg("%s: '%s' lacks '%s'", what, err.msg, needle);
}

START_TEST(every_prefix_fails)
{
    size_t n;
    uint8_t *file = read_all(fixture_path("models/qwen3moe/model-Q4_K_M.gguf"), &n);
    mr_gguf *g;
    mr_err err;
    ck_assert_int_eq(mr_gguf_open_mem(file, n, &g, &err), 0);
    size_t hdr = g->data_offset;
    mr_gguf_close(g);
    /* each prefix is copied to the end of one allocation, so that ASan
     * sees any read past the prefix (fresh allocations per prefix cost
     * more in page faults than the parsing) */
    size_t cap = hdr + 64;
    uint8_t *tail = malloc(cap);
    for (size_t len = 0; len <= cap && len < n; len++) {
        memcpy(tail + cap - len, file, len);
        expect_error(tail + cap - len, len, "prefix", NULL);
    }
    free(tail);
    for (int k = 0; k < 200; k++) {
        size_t len = k == 0 ? n - 1 : hdr + (size_t)(rnd() % (n - hdr));
        uint8_t *p = malloc(len);
        memcpy(p, file, len);
        expect_error(p, len, "data prefix", "runs past end of file");
        free(p);
    }
    free(file);
}
END_TEST

START_TEST(vocab_prefixes_fail)
{
    /* a file without tensors ends with its last value: every shorter prefix fails */
    size_t n;
    uint8_t *file = read_all(fixture_path("vocab/ggml-vocab-bert-bge.gguf"), &n);
    for (int k = 0; k < 2200; k++) {
        size_t len = k < 2000 ? (size_t)k : (size_t)(rnd() % n);
        uint8_t *p = malloc(len ? len : 1);
        memcpy(p, file, len);
        expect_error(p, len, "vocab prefix", NULL);
        free(p);
    }
    free(file);
}
END_TEST

START_TEST(random_header_flips)
{
    static const char *const files[] = {"models/qwen3/model-Q4_K_M.gguf",
                                        "models/qwen35moe/model-IQ4_XS.gguf",
                                        "models/gemma3/model-Q8_0.gguf"};
    int ok = 0, bad = 0;
    for (size_t f = 0; f < 3; f++) {
        size_t n;
        uint8_t *file = read_all(fixture_path(files[f]), &n);
        mr_gguf *g;
        mr_err err;
        ck_assert_int_eq(mr_gguf_open_mem(file, n, &g, &err), 0);
        size_t hdr = g->data_offset;
        mr_gguf_close(g);
        for (int it = 0; it < 1500; it++) {
            size_t pos[4];
            uint8_t old[4];
            int k = 1 + (int)(rnd() % 4);
            for (int j = 0; j < k; j++) {
                /* bias toward the first kilobytes, where counts and types live */
                size_t lim = (rnd() & 1) ? (hdr < 1024 ? hdr : 1024) : hdr;
                pos[j] = (size_t)(rnd() % lim);
                old[j] = file[pos[j]];
                file[pos[j]] ^= (uint8_t)(1u << (rnd() % 8)) | (uint8_t)((rnd() & 7) == 0 ? 0xff : 0);
            }
            g = NULL;
            if (mr_gguf_open_mem(file, n, &g, &err) == 0) {
                /* whatever was accepted is self-consistent */
                for (uint64_t i = 0; i < g->n_tensors; i++) {
                    const mr_gguf_tensor *t = &g->tensors[i];
                    if ((const uint8_t *)t->data + t->nbytes > g->base + g->size ||
                        mr_gguf_find_tensor(g, t->name) != t)
                        ck_abort_msg("accepted tensor %s is inconsistent", t->name);
                }
                for (uint64_t i = 0; i < g->n_kv; i++) {
                    char key[256];
                    snprintf(key, sizeof key, "%.*s", (int)g->kv[i].key.len, g->kv[i].key.ptr);
                    if (strlen(key) == g->kv[i].key.len && mr_gguf_find(g, key) != &g->kv[i])
                        ck_abort_msg("accepted key %s is not found", key);
                }
                mr_gguf_close(g);
                ok++;
            } else {
                if (g || strncmp(err.msg, "gguf: ", 6) != 0)
                    ck_abort_msg("bad failure: '%s'", err.msg);
                bad++;
            }
            for (int j = k - 1; j >= 0; j--)
                file[pos[j]] = old[j];
        }
        free(file);
    }
    ck_assert_int_gt(bad, 1000);
    ck_assert_int_gt(ok, 10); /* flips inside string bytes are harmless */
}
END_TEST

/* Builds a small file in memory through the writer, for targeted damage. */
static uint8_t *small_file(size_t *n, uint32_t alignment)
{
    mr_gguf_writer *w = mr_gguf_writer_new();
    ck_assert_int_eq(mr_gguf_writer_set_str(w, "general.architecture", "test"), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "general.alignment", alignment), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "keyA", 1), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "keyB", 2), 0);
    static uint8_t q8[2 * 34];
    static float f[64];
    int64_t ne_q[2] = {32, 2}, ne_f[1] = {64};
    ck_assert_int_eq(mr_gguf_writer_add_tensor(w, "tensorA", MR_TYPE_Q8_0, 2, ne_q, q8), 0);
    ck_assert_int_eq(mr_gguf_writer_add_tensor(w, "tensorB", MR_TYPE_F32, 1, ne_f, f), 0);
    char path[400];
    snprintf(path, sizeof path, "%s/small.gguf", tmpdir);
    mr_err err;
    ck_assert_msg(mr_gguf_writer_write(w, path, &err) == 0, "%s", err.msg);
    mr_gguf_writer_free(w);
    return read_all(path, n);
}

static size_t find_bytes(const uint8_t *buf, size_t n, const char *s)
{
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(buf + i, s, k) == 0)
            return i;
    ck_abort_msg("'%s' not found", s);
    return 0;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

START_TEST(targeted_damage)
{
    make_tmpdir();
    size_t n;
    uint8_t *base = small_file(&n, 64);
    uint8_t *b = malloc(n);
    mr_gguf *g;
    mr_err err;
    ck_assert_int_eq(mr_gguf_open_mem(base, n, &g, &err), 0);
    ck_assert_uint_eq(g->alignment, 64);
    ck_assert_uint_eq(g->data_offset % 64, 0);
    mr_gguf_close(g);

#define RESET() memcpy(b, base, n)
    RESET();
    memcpy(b, "GGUG", 4);
    expect_error(b, n, "magic", "bad magic");
    RESET();
    put32(b + 4, 1);
    expect_error(b, n, "v1", "unsupported version 1");
    RESET();
    put64(b + 8, 1ull << 60);
    expect_error(b, n, "n_tensors", "tensor infos cannot fit");
    RESET();
    put64(b + 16, UINT64_MAX);
    expect_error(b, n, "n_kv", "keys cannot fit");

    size_t ka = find_bytes(base, n, "keyB");
    RESET();
    b[ka + 3] = 'A';
    expect_error(b, n, "dup key", "key 'keyA'");
    expect_error(b, n, "dup key", "duplicate key");
    RESET();
    put64(b + ka - 8, 1ull << 40); /* key length */
    expect_error(b, n, "key length", "runs past end of file");
    RESET();
    put32(b + ka + 4, 13); /* value type */
    expect_error(b, n, "value type", "value type 13");

    size_t al = find_bytes(base, n, "general.alignment") + strlen("general.alignment") + 4;
    RESET();
    put32(b + al, 48);
    expect_error(b, n, "alignment 48", "power of two");
    RESET();
    put32(b + al, 0);
    expect_error(b, n, "alignment 0", "power of two");
    RESET();
    put32(b + al - 4, MR_GGUF_STRING); /* alignment as a string: not an integer */
    expect_error(b, n, "alignment type", NULL);

    size_t ta = find_bytes(base, n, "tensorB") + 7; /* n_dims of tensorB */
    RESET();
    memcpy(b + ta - 1, "A", 1);
    expect_error(b, n, "dup tensor", "duplicate tensor name");
    RESET();
    put32(b + ta, 5);
    expect_error(b, n, "n_dims", "n_dims 5");
    RESET();
    put64(b + ta + 4, 0);
    expect_error(b, n, "ne 0", "ne[0] = 0");
    RESET();
    put32(b + ta + 12, 99);
    expect_error(b, n, "type", "tensor 'tensorB' info");
    expect_error(b, n, "type", "unknown tensor type 99");
    size_t tq = find_bytes(base, n, "tensorA") + 7;
    RESET();
    put64(b + tq + 4, 48); /* Q8_0 row of 48: not a multiple of 32 */
    expect_error(b, n, "block", "not a multiple of the Q8_0 block size 32");
    RESET();
    put64(b + tq + 4, 1ull << 62);
    put64(b + tq + 12, 1ull << 62);
    expect_error(b, n, "overflow", "overflows");
    RESET();
    put64(b + ta + 16, 32); /* data offset not aligned to 64 */
    expect_error(b, n, "offset align", "not a multiple of the alignment 64");
    RESET();
    put64(b + ta + 16, 1ull << 20);
    expect_error(b, n, "offset", "runs past end of file");
    RESET();
    put64(b + ta + 16, UINT64_MAX - 63);
    expect_error(b, n, "offset overflow", "overflows");
    expect_error(base, n - 1, "short data", "tensor 'tensorB' info");
    free(b);
    free(base);
    rm_tmpdir();
}
END_TEST

START_TEST(getters)
{
    make_tmpdir();
    mr_gguf_writer *w = mr_gguf_writer_new();
    mr_gguf_writer_set_i32(w, "neg", -5);
    mr_gguf_writer_set_u64(w, "big", 1ull << 40);
    mr_gguf_writer_set_u64(w, "huge", UINT64_MAX);
    mr_gguf_writer_set_str(w, "s", "hello");
    mr_gguf_writer_set_f64(w, "d", 0.25);
    mr_gguf_writer_set_bool(w, "b", true);
    char path[400];
    snprintf(path, sizeof path, "%s/g.gguf", tmpdir);
    mr_err err;
    ck_assert_int_eq(mr_gguf_writer_write(w, path, &err), 0);
    mr_gguf_writer_free(w);
    mr_gguf *g = open_ok(path);
    uint64_t u;
    uint32_t u32;
    int64_t i;
    float f;
    bool bv;
    char *s;
    ck_assert_int_eq(mr_gguf_get_u64(g, "neg", &u, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "'neg'"));
    ck_assert_int_eq(mr_gguf_get_i64(g, "neg", &i, &err), 0);
    ck_assert_int_eq(i, -5);
    ck_assert_int_eq(mr_gguf_get_u32(g, "big", &u32, &err), -1);
    ck_assert_int_eq(mr_gguf_get_u64(g, "big", &u, &err), 0);
    ck_assert_uint_eq(u, 1ull << 40);
    ck_assert_int_eq(mr_gguf_get_i64(g, "huge", &i, &err), -1);
    ck_assert_int_eq(mr_gguf_get_f32(g, "d", &f, &err), 0);
    ck_assert_float_eq(f, 0.25f);
    ck_assert_int_eq(mr_gguf_get_f32(g, "s", &f, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "key 's' has type string"));
    ck_assert_int_eq(mr_gguf_get_bool(g, "b", &bv, &err), 0);
    ck_assert(bv);
    ck_assert_int_eq(mr_gguf_get_str(g, "s", &s, &err), 0);
    ck_assert_str_eq(s, "hello");
    free(s);
    ck_assert_int_eq(mr_gguf_get_str(g, "missing", &s, &err), -1);
    ck_assert_str_eq(err.msg, "gguf: key 'missing' is missing");
    mr_gguf_close(g);

    /* writer misuse is reported, and again at write time */
    w = mr_gguf_writer_new();
    int64_t ne[2] = {33, 2};
    ck_assert_int_eq(mr_gguf_writer_add_tensor(w, "x", MR_TYPE_Q4_0, 2, ne, NULL), -1);
    ck_assert_ptr_nonnull(strstr(mr_gguf_writer_error(w), "'x'"));
    ck_assert_int_eq(mr_gguf_writer_write(w, path, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "not a multiple"));
    mr_gguf_writer_free(w);
    w = mr_gguf_writer_new();
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "general.alignment", 24), -1);
    mr_gguf_writer_free(w);
    w = mr_gguf_writer_new();
    ne[0] = 32;
    ck_assert_int_eq(mr_gguf_writer_add_tensor(w, "x", MR_TYPE_Q4_0, 2, ne, NULL), 0);
    ck_assert_int_eq(mr_gguf_writer_add_tensor(w, "x", MR_TYPE_Q4_0, 2, ne, NULL), -1);
    mr_gguf_writer_free(w);
    w = mr_gguf_writer_new();
    ck_assert_int_eq(mr_gguf_writer_add_tensor(w, "x", MR_TYPE_Q4_0, 2, ne, NULL), 0);
    ck_assert_int_eq(mr_gguf_writer_write(w, path, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "no data"));
    mr_gguf_writer_free(w);

    ck_assert_int_eq(mr_gguf_open("/nonexistent/x.gguf", &g, &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/x.gguf"));
    ck_assert_int_eq(mr_gguf_open(tmpdir, &g, &err), -1);
    rm_tmpdir();
}
END_TEST

/* ---- writer round trips ---- */

static const enum mr_gguf_vtype scalar_types[] = {
    MR_GGUF_UINT8, MR_GGUF_INT8, MR_GGUF_UINT16, MR_GGUF_INT16, MR_GGUF_UINT32, MR_GGUF_INT32,
    MR_GGUF_FLOAT32, MR_GGUF_BOOL, MR_GGUF_UINT64, MR_GGUF_INT64, MR_GGUF_FLOAT64,
};
static const size_t scalar_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};

/* fill callback: a function of (tensor index, byte position) */
static int fill_pattern(void *ctx, const mr_gguf_tensor *t, uint64_t index, size_t off, void *dst,
                        size_t len, mr_err *err)
{
    (void)ctx;
    const mr_type_info *ti = mr_type_get(t->type);
    if (off % ti->block_bytes || len % ti->block_bytes || off + len > t->nbytes)
        return mr_errf(err, "bad range [%zu, %zu) for %s", off, off + len, t->name);
    uint8_t *d = dst;
    for (size_t i = 0; i < len; i++)
        d[i] = (uint8_t)((off + i) * 31u + index * 7u + ((off + i) >> 9));
    return 0;
}

START_TEST(writer_roundtrip)
{
    make_tmpdir();
    mr_gguf_writer *w = mr_gguf_writer_new();
    ck_assert_int_eq(mr_gguf_writer_set_u8(w, "u8", 200), 0);
    ck_assert_int_eq(mr_gguf_writer_set_i8(w, "i8", -100), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u16(w, "u16", 60000), 0);
    ck_assert_int_eq(mr_gguf_writer_set_i16(w, "i16", -30000), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "u32", 4000000000u), 0);
    ck_assert_int_eq(mr_gguf_writer_set_i32(w, "i32", -2000000000), 0);
    ck_assert_int_eq(mr_gguf_writer_set_f32(w, "f32", 1.5f), 0);
    ck_assert_int_eq(mr_gguf_writer_set_bool(w, "bool", true), 0);
    ck_assert_int_eq(mr_gguf_writer_set_str(w, "str", "a string"), 0);
    ck_assert_int_eq(mr_gguf_writer_set_strn(w, "bytes", "a\0b", 3), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u64(w, "u64", UINT64_MAX - 1), 0);
    ck_assert_int_eq(mr_gguf_writer_set_i64(w, "i64", INT64_MIN + 1), 0);
    ck_assert_int_eq(mr_gguf_writer_set_f64(w, "f64", -1e300), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "general.alignment", 64), 0);
    ck_assert_int_eq(mr_gguf_writer_set_u32(w, "replaced", 1), 0);
    ck_assert_int_eq(mr_gguf_writer_set_str(w, "replaced", "second"), 0);
    uint8_t raw[11][5 * 8];
    for (size_t t = 0; t < 11; t++) {
        for (size_t i = 0; i < sizeof raw[t]; i++)
            raw[t][i] = (uint8_t)rnd();
        if (scalar_types[t] == MR_GGUF_BOOL)
            for (size_t i = 0; i < 5; i++)
                raw[t][i] &= 1;
        char key[32];
        snprintf(key, sizeof key, "arr.%s", mr_gguf_vtype_name(scalar_types[t]));
        ck_assert_int_eq(mr_gguf_writer_set_arr(w, key, scalar_types[t], raw[t], 5), 0);
    }
    ck_assert_int_eq(mr_gguf_writer_set_arr(w, "arr.empty", MR_GGUF_INT32, NULL, 0), 0);
    const char *strs[] = {"", "one", "two words", "\xc4\xa0unicode"};
    ck_assert_int_eq(mr_gguf_writer_set_arr_str(w, "arr.string", strs, 4), 0);
    ck_assert_int_eq(mr_gguf_writer_set_arr(w, "arr.nested", MR_GGUF_ARRAY, raw[0], 1), -1);
    mr_gguf_writer_free(w); /* the failed setter poisons the writer: start again without it */

    w = mr_gguf_writer_new();
    mr_gguf_writer_set_u8(w, "u8", 200);
    mr_gguf_writer_set_i8(w, "i8", -100);
    mr_gguf_writer_set_u16(w, "u16", 60000);
    mr_gguf_writer_set_i16(w, "i16", -30000);
    mr_gguf_writer_set_u32(w, "u32", 4000000000u);
    mr_gguf_writer_set_i32(w, "i32", -2000000000);
    mr_gguf_writer_set_f32(w, "f32", 1.5f);
    mr_gguf_writer_set_bool(w, "bool", true);
    mr_gguf_writer_set_str(w, "str", "a string");
    mr_gguf_writer_set_strn(w, "bytes", "a\0b", 3);
    mr_gguf_writer_set_u64(w, "u64", UINT64_MAX - 1);
    mr_gguf_writer_set_i64(w, "i64", INT64_MIN + 1);
    mr_gguf_writer_set_f64(w, "f64", -1e300);
    mr_gguf_writer_set_u32(w, "general.alignment", 64);
    mr_gguf_writer_set_u32(w, "replaced", 1);
    mr_gguf_writer_set_str(w, "replaced", "second");
    for (size_t t = 0; t < 11; t++) {
        char key[32];
        snprintf(key, sizeof key, "arr.%s", mr_gguf_vtype_name(scalar_types[t]));
        mr_gguf_writer_set_arr(w, key, scalar_types[t], raw[t], 5);
    }
    mr_gguf_writer_set_arr(w, "arr.empty", MR_GGUF_INT32, NULL, 0);
    mr_gguf_writer_set_arr_str(w, "arr.string", strs, 4);

    /* tensors of several types and ranks, random bytes */
    static const struct {
        const char *name;
        enum mr_type type;
        uint32_t nd;
        int64_t ne[4];
    } ts[] = {
        {"t.f32", MR_TYPE_F32, 1, {7, 1, 1, 1}},
        {"t.f16", MR_TYPE_F16, 2, {5, 3, 1, 1}},
        {"t.bf16", MR_TYPE_BF16, 3, {4, 3, 2, 1}},
        {"t.q8_0", MR_TYPE_Q8_0, 2, {64, 3, 1, 1}},
        {"t.q4_k", MR_TYPE_Q4_K, 3, {256, 2, 2, 1}},
        {"t.q6_k", MR_TYPE_Q6_K, 4, {512, 1, 2, 2}},
        {"t.iq4_xs", MR_TYPE_IQ4_XS, 2, {256, 1, 1, 1}},
    };
    enum { NT = sizeof ts / sizeof ts[0] };
    uint8_t *data[NT];
    size_t nb[NT];
    for (int i = 0; i < NT; i++) {
        nb[i] = mr_row_size(ts[i].type, ts[i].ne[0]) * (size_t)(ts[i].ne[1] * ts[i].ne[2] * ts[i].ne[3]);
        ck_assert_uint_gt(nb[i], 0);
        data[i] = malloc(nb[i]);
        for (size_t j = 0; j < nb[i]; j++)
            data[i][j] = (uint8_t)rnd();
        ck_assert_int_eq(mr_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].nd, ts[i].ne, data[i]), 0);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/rt.gguf", tmpdir);
    mr_err err;
    ck_assert_msg(mr_gguf_writer_write(w, path, &err) == 0, "%s", err.msg);
    mr_gguf_writer_free(w);

    mr_gguf *g = open_ok(path);
    ck_assert_uint_eq(g->alignment, 64);
    ck_assert_uint_eq(g->data_offset % 64, 0);
    ck_assert_uint_eq(g->n_kv, 14 + 1 + 11 + 2);
    ck_assert_uint_eq(g->kv[0].v.u, 200);
    ck_assert_int_eq(g->kv[1].v.i, -100);
    ck_assert_uint_eq(mr_gguf_find(g, "u16")->v.u, 60000);
    ck_assert_int_eq(mr_gguf_find(g, "i16")->v.i, -30000);
    ck_assert_uint_eq(mr_gguf_find(g, "u32")->v.u, 4000000000u);
    ck_assert_int_eq(mr_gguf_find(g, "i32")->v.i, -2000000000);
    ck_assert(mr_gguf_find(g, "f32")->v.f == 1.5);
    ck_assert(mr_gguf_find(g, "bool")->v.b);
    ck_assert(str_is(mr_gguf_find(g, "str")->v.s, "a string"));
    ck_assert_uint_eq(mr_gguf_find(g, "bytes")->v.s.len, 3);
    ck_assert_mem_eq(mr_gguf_find(g, "bytes")->v.s.ptr, "a\0b", 3);
    ck_assert_uint_eq(mr_gguf_find(g, "u64")->v.u, UINT64_MAX - 1);
    ck_assert_int_eq(mr_gguf_find(g, "i64")->v.i, INT64_MIN + 1);
    ck_assert(mr_gguf_find(g, "f64")->v.f == -1e300);
    const mr_gguf_kv *rep = mr_gguf_find(g, "replaced");
    ck_assert_int_eq(rep->type, MR_GGUF_STRING);
    ck_assert(str_is(rep->v.s, "second"));
    ck_assert_ptr_eq(rep, &g->kv[14]); /* kept its first position */
    for (size_t t = 0; t < 11; t++) {
        char key[32];
        snprintf(key, sizeof key, "arr.%s", mr_gguf_vtype_name(scalar_types[t]));
        const mr_gguf_kv *kv;
        ck_assert_int_eq(mr_gguf_get_arr(g, key, scalar_types[t], &kv, &err), 0);
        ck_assert_uint_eq(kv->v.arr.n, 5);
        ck_assert_mem_eq(kv->v.arr.data, raw[t], 5 * scalar_size[t]);
        /* element conversions agree with a direct little-endian read */
        for (uint64_t i = 0; i < 5; i++) {
            const uint8_t *p = raw[t] + i * scalar_size[t];
            double want;
            switch (scalar_types[t]) {
            case MR_GGUF_UINT8: case MR_GGUF_BOOL: want = p[0]; break;
            case MR_GGUF_INT8: want = (int8_t)p[0]; break;
            case MR_GGUF_UINT16: want = (uint16_t)(p[0] | p[1] << 8); break;
            case MR_GGUF_INT16: want = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
            case MR_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); want = x; break; }
            case MR_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); want = x; break; }
            case MR_GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); want = (double)x; break; }
            case MR_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); want = (double)x; ck_assert_int_eq(mr_gguf_arr_i64(kv, i), x); break; }
            case MR_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); want = x; break; }
            default: { double x; memcpy(&x, p, 8); want = x; break; }
            }
            double got = mr_gguf_arr_f64(kv, i);
            ck_assert(got == want || (isnan(got) && isnan(want)));
        }
        ck_assert_int_eq(mr_gguf_arr_i64(kv, 5), 0); /* out of range */
    }
    const mr_gguf_kv *kv;
    ck_assert_int_eq(mr_gguf_get_arr(g, "arr.empty", MR_GGUF_VTYPE_COUNT, &kv, &err), 0);
    ck_assert_uint_eq(kv->v.arr.n, 0);
    ck_assert_int_eq(mr_gguf_get_arr(g, "arr.string", MR_GGUF_STRING, &kv, &err), 0);
    ck_assert_uint_eq(kv->v.arr.n, 4);
    for (int i = 0; i < 4; i++)
        ck_assert(str_is(kv->v.arr.strs[i], strs[i]));
    ck_assert_uint_eq(g->n_tensors, NT);
    for (int i = 0; i < NT; i++) {
        const mr_gguf_tensor *t = mr_gguf_find_tensor(g, ts[i].name);
        ck_assert_ptr_eq(t, &g->tensors[i]);
        ck_assert_int_eq(t->type, ts[i].type);
        ck_assert_uint_eq(t->n_dims, ts[i].nd);
        for (int d = 0; d < 4; d++)
            ck_assert_int_eq(t->ne[d], ts[i].ne[d]);
        ck_assert_uint_eq(t->offset % 64, 0);
        ck_assert_uint_eq(t->nbytes, nb[i]);
        ck_assert_mem_eq(t->data, data[i], nb[i]);
    }
    check_data_tiling(g, path);

    /* the same file again, its data streamed from a fill callback on 3
     * threads, against a copy whose data comes from buffers */
    mr_gguf_writer *ws = mr_gguf_writer_new(), *wb = mr_gguf_writer_new();
    for (uint64_t i = 0; i < g->n_kv; i++) {
        ck_assert_int_eq(mr_gguf_writer_copy_kv(ws, &g->kv[i]), 0);
        ck_assert_int_eq(mr_gguf_writer_copy_kv(wb, &g->kv[i]), 0);
    }
    int64_t big_ne[2] = {256, 40000}; /* 5.8 MB of Q4_K: several chunks */
    size_t big_nb = mr_row_size(MR_TYPE_Q4_K, 256) * 40000;
    uint8_t *big = malloc(big_nb);
    mr_gguf_tensor desc = {.name = "big", .type = MR_TYPE_Q4_K, .nbytes = big_nb};
    ck_assert_int_eq(fill_pattern(NULL, &desc, NT, 0, big, big_nb, &err), 0);
    uint8_t *pat[NT];
    for (int i = 0; i < NT; i++) {
        mr_gguf_tensor d2 = {.name = (char *)ts[i].name, .type = ts[i].type, .nbytes = nb[i]};
        pat[i] = malloc(nb[i]);
        ck_assert_int_eq(fill_pattern(NULL, &d2, (uint64_t)i, 0, pat[i], nb[i], &err), 0);
        mr_gguf_writer_add_tensor(ws, ts[i].name, ts[i].type, ts[i].nd, ts[i].ne, NULL);
        mr_gguf_writer_add_tensor(wb, ts[i].name, ts[i].type, ts[i].nd, ts[i].ne, pat[i]);
    }
    mr_gguf_writer_add_tensor(ws, "big", MR_TYPE_Q4_K, 2, big_ne, NULL);
    mr_gguf_writer_add_tensor(wb, "big", MR_TYPE_Q4_K, 2, big_ne, big);
    char p1[420], p2[420];
    snprintf(p1, sizeof p1, "%s/stream.gguf", tmpdir);
    snprintf(p2, sizeof p2, "%s/buffers.gguf", tmpdir);
    ck_assert_msg(mr_gguf_writer_write_file(ws, p1, fill_pattern, NULL, 3, &err) == 0, "%s", err.msg);
    ck_assert_msg(mr_gguf_writer_write(wb, p2, &err) == 0, "%s", err.msg);
    mr_gguf_writer_free(ws);
    mr_gguf_writer_free(wb);
    size_t n1, n2;
    uint8_t *f1 = read_all(p1, &n1), *f2 = read_all(p2, &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(f1, f2, n1) == 0);
    mr_gguf *g2;
    ck_assert_int_eq(mr_gguf_open_mem(f1, n1, &g2, &err), 0);
    ck_assert_mem_eq(mr_gguf_find_tensor(g2, "big")->data, big, big_nb);
    mr_gguf_close(g2);
    free(f1);
    free(f2);
    free(big);
    for (int i = 0; i < NT; i++) {
        free(data[i]);
        free(pat[i]);
    }
    mr_gguf_close(g);
    /* no temporary files are left behind */
    glob_t gl;
    char pat2[420];
    snprintf(pat2, sizeof pat2, "%s/*.tmp.*", tmpdir);
    ck_assert_int_eq(glob(pat2, 0, NULL, &gl), GLOB_NOMATCH);
    rm_tmpdir();
}
END_TEST

/* Rewriting an upstream file through our writer gives the same bytes:
 * same key/value encoding, tensor info layout, alignment and padding. */
START_TEST(rewrite_fixture_identical)
{
    make_tmpdir();
    static const char *const files[] = {"models/qwen3moe/model-Q4_K_M.gguf",
                                        "models/qwen35/model-IQ4_XS.gguf"};
    for (int f = 0; f < 2; f++) {
        mr_gguf *g = open_ok(fixture_path(files[f]));
        mr_gguf_writer *w = mr_gguf_writer_new();
        for (uint64_t i = 0; i < g->n_kv; i++)
            ck_assert_int_eq(mr_gguf_writer_copy_kv(w, &g->kv[i]), 0);
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const mr_gguf_tensor *t = &g->tensors[i];
            ck_assert_int_eq(mr_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), 0);
        }
        char path[400];
        snprintf(path, sizeof path, "%s/copy.gguf", tmpdir);
        mr_err err;
        ck_assert_msg(mr_gguf_writer_write_file(w, path, NULL, NULL, 2, &err) == 0, "%s", err.msg);
        mr_gguf_writer_free(w);
        size_t n;
        uint8_t *copy = read_all(path, &n);
        ck_assert_uint_eq(n, g->size);
        for (size_t i = 0; i < n; i++)
            if (copy[i] != g->base[i])
                ck_abort_msg("%s: rewritten file differs at byte %zu", files[f], i);
        free(copy);
        mr_gguf_close(g);
    }
    rm_tmpdir();
}
END_TEST

#define ADD(t)                                   \
    do {                                         \
        TCase *tc = tcase_create(#t);            \
        tcase_set_timeout(tc, 120);              \
        tcase_add_test(tc, t);                   \
        suite_add_tcase(s, tc);                  \
    } while (0)

int main(void)
{
    Suite *s = suite_create("gguf");
    ADD(fixture_models);
    ADD(fixture_vocabs);
    ADD(fixture_data_matches_checkpoint);
    ADD(every_prefix_fails);
    ADD(vocab_prefixes_fail);
    ADD(random_header_flips);
    ADD(targeted_damage);
    ADD(getters);
    ADD(writer_roundtrip);
    ADD(rewrite_fixture_identical);
    return run_suite(s);
}

/* memra-pack-tiny DIR VOCAB.gguf OUT.gguf [--type q8_0|bf16|f16|f32] [--name NAME]
 *
 * Turns the weights written by scripts/train-memra-tiny.py (DIR/index.json
 * and the float16 shards it lists) into a qwen3 GGUF: the hyper-parameters
 * become qwen3.* metadata, every tokenizer.* key (vocabulary, merges,
 * special ids, chat template) is copied from VOCAB.gguf, 1-D tensors (norm
 * weights) are stored as F32 and matrices as --type (default q8_0).
 *
 * index.json:
 *   {"dtype": "f16", "total_bytes": N, "shards": ["shard-00.bin", ...],
 *    "config": {"n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv",
 *               "head_dim", "n_ff", "n_ctx", "rope_theta", "rms_eps"},
 *    "tensors": [{"name", "shape": [rows, cols] or [n], "offset", "nbytes"}]}
 * Shapes are in PyTorch order; the concatenated shards hold the tensors at
 * their offsets as little-endian IEEE half floats.  Everything read is
 * checked (sizes, offsets, shapes, names, vocabulary size) and a mismatch is
 * one line on stderr and exit status 1. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/half.h"
#include "common/quant.h"

#define MAX_TENSORS 4096

typedef struct cfg {
    uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
    float rope_theta, rms_eps;
} cfg;

static void usage(FILE *f)
{
    fprintf(f, "usage: memra-pack-tiny DIR VOCAB.gguf OUT.gguf [--type q8_0|bf16|f16|f32] "
               "[--name NAME]\n");
}

static int get_u32(json_t *o, const char *key, uint32_t *out, mr_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 24)
        return mr_errf(err, "index.json: config.%s must be an integer in 1..%d", key, 1 << 24);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int get_f32(json_t *o, const char *key, float *out, mr_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return mr_errf(err, "index.json: config.%s must be a positive number", key);
    *out = (float)json_number_value(v);
    return 0;
}

static int read_config(json_t *root, cfg *c, mr_err *err)
{
    json_t *o = json_object_get(root, "config");
    if (!json_is_object(o))
        return mr_errf(err, "index.json: missing object 'config'");
    if (get_u32(o, "n_vocab", &c->n_vocab, err) || get_u32(o, "n_embd", &c->n_embd, err) ||
        get_u32(o, "n_layer", &c->n_layer, err) || get_u32(o, "n_head", &c->n_head, err) ||
        get_u32(o, "n_head_kv", &c->n_head_kv, err) || get_u32(o, "head_dim", &c->head_dim, err) ||
        get_u32(o, "n_ff", &c->n_ff, err) || get_u32(o, "n_ctx", &c->n_ctx, err) ||
        get_f32(o, "rope_theta", &c->rope_theta, err) || get_f32(o, "rms_eps", &c->rms_eps, err))
        return -1;
    if (c->n_head % c->n_head_kv)
        return mr_errf(err, "index.json: n_head %u is not a multiple of n_head_kv %u", c->n_head,
                       c->n_head_kv);
    if (c->n_layer > 256)
        return mr_errf(err, "index.json: n_layer %u is more than 256", c->n_layer);
    return 0;
}

/* The shape ([rows, cols] in PyTorch order) that tensor `name` must have. */
static int expected_shape(const cfg *c, const char *name, int64_t *rows, int64_t *cols)
{
    int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
    *rows = 0;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight")) {
        *rows = c->n_vocab;
        *cols = c->n_embd;
        return 0;
    }
    if (!strcmp(name, "output_norm.weight")) {
        *cols = c->n_embd;
        return 0;
    }
    unsigned il;
    int used = 0;
    if (sscanf(name, "blk.%u.%n", &il, &used) != 1 || used == 0 || il >= c->n_layer)
        return -1;
    const char *s = name + used;
    static const struct {
        const char *suffix;
        int rows, cols; /* 0 vector, 1 n_embd, 2 q, 3 kv, 4 n_ff, 5 head_dim */
    } tab[] = {
        {"attn_norm.weight", 0, 1},   {"ffn_norm.weight", 0, 1},   {"attn_q_norm.weight", 0, 5},
        {"attn_k_norm.weight", 0, 5}, {"attn_q.weight", 2, 1},     {"attn_k.weight", 3, 1},
        {"attn_v.weight", 3, 1},      {"attn_output.weight", 1, 2}, {"ffn_gate.weight", 4, 1},
        {"ffn_up.weight", 4, 1},      {"ffn_down.weight", 1, 4},
    };
    int64_t dims[] = {0, c->n_embd, q, kv, c->n_ff, c->head_dim};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].suffix)) {
            *rows = dims[tab[i].rows];
            *cols = dims[tab[i].cols];
            return 0;
        }
    return -1;
}

/* Reads the shards, in order, into one buffer of exactly `total` bytes. */
static uint8_t *read_shards(const char *dir, json_t *shards, size_t total, mr_err *err)
{
    if (!json_is_array(shards) || json_array_size(shards) == 0 || json_array_size(shards) > 64) {
        mr_errf(err, "index.json: 'shards' must be a list of 1..64 file names");
        return NULL;
    }
    uint8_t *buf = malloc(total ? total : 1);
    if (!buf) {
        mr_errf(err, "out of memory for %zu bytes of weights", total);
        return NULL;
    }
    size_t got = 0;
    for (size_t i = 0; i < json_array_size(shards); i++) {
        const char *nm = json_string_value(json_array_get(shards, i));
        if (!nm || strchr(nm, '/') || !strcmp(nm, "..")) {
            mr_errf(err, "index.json: shard %zu is not a plain file name", i);
            goto fail;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        FILE *f = fopen(path, "rb");
        if (!f) {
            mr_errf(err, "cannot open shard '%s'", path);
            goto fail;
        }
        size_t n = fread(buf + got, 1, total - got, f);
        int extra = fgetc(f);
        fclose(f);
        got += n;
        if (extra != EOF) {
            mr_errf(err, "shard '%s' goes past total_bytes %zu", path, total);
            goto fail;
        }
    }
    if (got != total) {
        mr_errf(err, "the shards hold %zu bytes, index.json says total_bytes %zu", got, total);
        goto fail;
    }
    return buf;
fail:
    free(buf);
    return NULL;
}

/* One tensor converted: half floats at src -> `type` rows (F32 for vectors). */
static void *convert(const uint8_t *src, int64_t rows, int64_t cols, int type, size_t *nbytes,
                     const char *name, mr_err *err)
{
    size_t row_out = mr_row_size(type, cols);
    if (row_out == 0) {
        mr_errf(err, "tensor '%s': %s rows need a multiple of %lld columns, have %lld", name,
                mr_type_name(type), (long long)mr_type_get(type)->block_elems, (long long)cols);
        return NULL;
    }
    float *tmp = malloc(sizeof(float) * (size_t)cols);
    uint8_t *out = malloc(row_out * (size_t)rows);
    if (!tmp || !out) {
        free(tmp);
        free(out);
        mr_errf(err, "out of memory converting '%s'", name);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < cols; j++) {
            const uint8_t *p = src + 2 * (size_t)(r * cols + j);
            tmp[j] = mr_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        }
        if (mr_quantize_row(type, tmp, out + (size_t)r * row_out, cols) != row_out) {
            free(tmp);
            free(out);
            mr_errf(err, "tensor '%s': cannot store as %s", name, mr_type_name(type));
            return NULL;
        }
    }
    free(tmp);
    *nbytes = row_out * (size_t)rows;
    return out;
}

static int copy_tokenizer(mr_gguf_writer *w, const char *vocab_path, uint32_t n_vocab, mr_err *err)
{
    mr_gguf *v = NULL;
    if (mr_gguf_open(vocab_path, &v, err))
        return -1;
    const mr_gguf_kv *toks;
    int rc = -1;
    if (mr_gguf_get_arr(v, "tokenizer.ggml.tokens", MR_GGUF_STRING, &toks, err))
        goto out;
    if (toks->v.arr.n != n_vocab) {
        mr_errf(err, "%s has %llu tokens, the model's vocabulary is %u", vocab_path,
                (unsigned long long)toks->v.arr.n, n_vocab);
        goto out;
    }
    for (uint64_t i = 0; i < v->n_kv; i++) {
        const mr_gguf_kv *kv = &v->kv[i];
        if (kv->key.len > 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0) {
            if (mr_gguf_writer_copy_kv(w, kv)) {
                mr_errf(err, "copying %.*s: %s", (int)kv->key.len, kv->key.ptr,
                        mr_gguf_writer_error(w));
                goto out;
            }
        }
    }
    rc = 0;
out:
    mr_gguf_close(v);
    return rc;
}

static int pack(const char *dir, const char *vocab, const char *out_path, int type,
                const char *name, mr_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/index.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return mr_errf(err, "%s:%d: %s", path, je.line, je.text);
    int rc = -1;
    uint8_t *blob = NULL;
    void *bufs[MAX_TENSORS] = {0};
    size_t n_bufs = 0;
    mr_gguf_writer *w = mr_gguf_writer_new();
    cfg c;
    if (!w) {
        mr_errf(err, "out of memory");
        goto out;
    }
    if (read_config(root, &c, err))
        goto out;
    const char *dtype = json_string_value(json_object_get(root, "dtype"));
    json_t *total_j = json_object_get(root, "total_bytes");
    json_t *tensors = json_object_get(root, "tensors");
    if (!dtype || strcmp(dtype, "f16")) {
        mr_errf(err, "index.json: dtype must be \"f16\"");
        goto out;
    }
    if (!json_is_integer(total_j) || json_integer_value(total_j) < 0 ||
        json_integer_value(total_j) > ((json_int_t)1 << 34)) {
        mr_errf(err, "index.json: total_bytes must be an integer in 0..16 GiB");
        goto out;
    }
    size_t total = (size_t)json_integer_value(total_j);
    size_t n_t = json_array_size(tensors);
    size_t want_t = 3 + 11 * (size_t)c.n_layer;
    if (!json_is_array(tensors) || n_t != want_t) {
        mr_errf(err, "index.json: %zu tensors listed, a %u-layer model has %zu", n_t, c.n_layer,
                want_t);
        goto out;
    }
    if (!(blob = read_shards(dir, json_object_get(root, "shards"), total, err)))
        goto out;

    char key[96];
#define ARCH(k) (snprintf(key, sizeof key, "qwen3.%s", k), key)
    mr_gguf_writer_set_str(w, "general.architecture", "qwen3");
    mr_gguf_writer_set_str(w, "general.name", name);
    /* the weights derive from the training text (docs/MEMRA-TINY.md) */
    mr_gguf_writer_set_str(w, "general.license", "CC-BY-SA-3.0");
    mr_gguf_writer_set_str(w, "general.source.url", "Debian package debian-handbook "
                           "(The Debian Administrator's Handbook, GPL-2+ or CC-BY-SA-3.0)");
    mr_gguf_writer_set_u32(w, ARCH("context_length"), c.n_ctx);
    mr_gguf_writer_set_u32(w, ARCH("embedding_length"), c.n_embd);
    mr_gguf_writer_set_u32(w, ARCH("block_count"), c.n_layer);
    mr_gguf_writer_set_u32(w, ARCH("feed_forward_length"), c.n_ff);
    mr_gguf_writer_set_u32(w, ARCH("attention.head_count"), c.n_head);
    mr_gguf_writer_set_u32(w, ARCH("attention.head_count_kv"), c.n_head_kv);
    mr_gguf_writer_set_u32(w, ARCH("attention.key_length"), c.head_dim);
    mr_gguf_writer_set_u32(w, ARCH("attention.value_length"), c.head_dim);
    mr_gguf_writer_set_f32(w, ARCH("rope.freq_base"), c.rope_theta);
    mr_gguf_writer_set_f32(w, ARCH("attention.layer_norm_rms_epsilon"), c.rms_eps);
#undef ARCH
    if (copy_tokenizer(w, vocab, c.n_vocab, err))
        goto out;

    for (size_t i = 0; i < n_t; i++) {
        json_t *t = json_array_get(tensors, i);
        const char *tn = json_string_value(json_object_get(t, "name"));
        json_t *shape = json_object_get(t, "shape");
        json_t *off_j = json_object_get(t, "offset"), *nb_j = json_object_get(t, "nbytes");
        int64_t rows, cols;
        if (!tn || expected_shape(&c, tn, &rows, &cols)) {
            mr_errf(err, "index.json: tensor %zu: '%s' is not a qwen3 tensor name", i,
                    tn ? tn : "(no name)");
            goto out;
        }
        size_t dims = json_array_size(shape);
        int64_t got_r = dims == 2 ? json_integer_value(json_array_get(shape, 0)) : 0;
        int64_t got_c = json_integer_value(json_array_get(shape, dims - 1));
        if (!json_is_array(shape) || dims != (rows ? 2u : 1u) || got_r != rows || got_c != cols) {
            if (rows)
                mr_errf(err, "tensor '%s': shape must be [%lld, %lld]", tn, (long long)rows,
                        (long long)cols);
            else
                mr_errf(err, "tensor '%s': shape must be [%lld]", tn, (long long)cols);
            goto out;
        }
        int64_t n_el = (rows ? rows : 1) * cols;
        if (!json_is_integer(off_j) || !json_is_integer(nb_j) ||
            json_integer_value(nb_j) != 2 * n_el || json_integer_value(off_j) < 0 ||
            total < (size_t)(2 * n_el) ||
            (uint64_t)json_integer_value(off_j) > total - (size_t)(2 * n_el)) {
            mr_errf(err, "tensor '%s': offset/nbytes do not give %lld halves inside %zu bytes", tn,
                    (long long)n_el, total);
            goto out;
        }
        const uint8_t *src = blob + json_integer_value(off_j);
        int ttype = rows ? type : MR_TYPE_F32;
        size_t nbytes;
        void *data = convert(src, rows ? rows : 1, cols, ttype, &nbytes, tn, err);
        if (!data)
            goto out;
        bufs[n_bufs++] = data;
        int64_t ne[2] = {cols, rows ? rows : 1};
        if (mr_gguf_writer_add_tensor(w, tn, (enum mr_type)ttype, rows ? 2 : 1, ne, data)) {
            mr_errf(err, "tensor '%s': %s", tn, mr_gguf_writer_error(w));
            goto out;
        }
    }
    if (mr_gguf_writer_error(w)) {
        mr_errf(err, "%s", mr_gguf_writer_error(w));
        goto out;
    }
    rc = mr_gguf_writer_write(w, out_path, err);
out:
    for (size_t i = 0; i < n_bufs; i++)
        free(bufs[i]);
    free(blob);
    mr_gguf_writer_free(w);
    json_decref(root);
    return rc;
}

int main(int argc, char **argv)
{
    const char *pos[3] = {0}, *name = "memra-tiny";
    int n_pos = 0, type = MR_TYPE_Q8_0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            const char *t = argv[++i];
            type = !strcmp(t, "q8_0") ? MR_TYPE_Q8_0 : !strcmp(t, "bf16") ? MR_TYPE_BF16
                 : !strcmp(t, "f16") ? MR_TYPE_F16 : !strcmp(t, "f32") ? MR_TYPE_F32 : -1;
            if (type < 0) {
                fprintf(stderr, "memra-pack-tiny: --type must be q8_0, bf16, f16 or f32\n");
                return 1;
            }
        } else if (!strcmp(argv[i], "--name") && i + 1 < argc) {
            name = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && n_pos < 3) {
            pos[n_pos++] = argv[i];
        } else {
            usage(stderr);
            return 1;
        }
    }
    if (n_pos != 3) {
        usage(stderr);
        return 1;
    }
    mr_err err = {{0}};
    if (pack(pos[0], pos[1], pos[2], type, name, &err)) {
        fprintf(stderr, "memra-pack-tiny: %s\n", err.msg);
        return 1;
    }
    return 0;
}

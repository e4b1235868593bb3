/* GGUF -> hyperparameters, weights on a backend, KV cache; sequences and
 * the forward entry point that dispatches to the architecture. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/model_internal.h"

/* ---- metadata ---- */

int mr_model_key_u32(const mr_gguf *g, const char *arch, const char *suffix, int *out, bool required,
                     int dflt, mr_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!mr_gguf_find(g, key)) {
        if (required)
            return mr_errf(err, "missing metadata key '%s'", key);
        *out = dflt;
        return 0;
    }
    uint32_t v;
    if (mr_gguf_get_u32(g, key, &v, err))
        return -1;
    if (v > (1u << 30))
        return mr_errf(err, "metadata key '%s' = %u is out of range", key, v);
    *out = (int)v;
    return 0;
}

static int key_f32(const mr_gguf *g, const char *arch, const char *suffix, float *out, mr_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!mr_gguf_find(g, key))
        return mr_errf(err, "missing metadata key '%s'", key);
    return mr_gguf_get_f32(g, key, out, err);
}

static int read_hparams(const mr_gguf *g, mr_hparams *hp, mr_err *err)
{
    char *arch = NULL;
    if (!mr_gguf_find(g, "general.architecture"))
        return mr_errf(err, "missing metadata key 'general.architecture'");
    if (mr_gguf_get_str(g, "general.architecture", &arch, err))
        return -1;
    int rc = -1;
    if (!strcmp(arch, "qwen3"))
        hp->arch = MR_ARCH_QWEN3;
    else if (!strcmp(arch, "qwen3moe"))
        hp->arch = MR_ARCH_QWEN3MOE;
    else if (!strcmp(arch, "qwen35"))
        hp->arch = MR_ARCH_QWEN35;
    else if (!strcmp(arch, "qwen35moe"))
        hp->arch = MR_ARCH_QWEN35MOE;
    else {
        mr_errf(err, "unknown architecture '%.64s' (supported: qwen3, qwen3moe, qwen35, qwen35moe)", arch);
        goto out;
    }
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch);

    if (mr_model_key_u32(g, arch, "block_count", &hp->n_layers, true, 0, err) ||
        mr_model_key_u32(g, arch, "embedding_length", &hp->n_embd, true, 0, err) ||
        mr_model_key_u32(g, arch, "attention.head_count", &hp->n_heads, true, 0, err) ||
        mr_model_key_u32(g, arch, "context_length", &hp->n_ctx_train, true, 0, err) ||
        key_f32(g, arch, "rope.freq_base", &hp->rope_theta, err) ||
        key_f32(g, arch, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err))
        goto out;
    if (hp->n_layers <= 0 || hp->n_embd <= 0 || hp->n_heads <= 0) {
        mr_errf(err, "%s: block_count %d, embedding_length %d, head_count %d must be positive", arch,
                hp->n_layers, hp->n_embd, hp->n_heads);
        goto out;
    }
    int head_v;
    if (mr_model_key_u32(g, arch, "attention.head_count_kv", &hp->n_kv_heads, false, hp->n_heads, err) ||
        mr_model_key_u32(g, arch, "attention.key_length", &hp->head_dim, false, hp->n_embd / hp->n_heads, err) ||
        mr_model_key_u32(g, arch, "attention.value_length", &head_v, false, hp->head_dim, err) ||
        mr_model_key_u32(g, arch, "rope.dimension_count", &hp->n_rot, false, hp->head_dim, err))
        goto out;
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads) {
        mr_errf(err, "%s: head_count %d is not a multiple of head_count_kv %d", arch, hp->n_heads,
                hp->n_kv_heads);
        goto out;
    }
    if (hp->head_dim <= 0 || head_v != hp->head_dim || hp->n_rot <= 0 || hp->n_rot > hp->head_dim ||
        hp->n_rot % 2) {
        mr_errf(err, "%s: key_length %d, value_length %d, rope.dimension_count %d are not supported "
                "(equal key/value length, even n_rot <= head_dim)", arch, hp->head_dim, head_v, hp->n_rot);
        goto out;
    }
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_theta > 0.0f)) {
        mr_errf(err, "%s: rms epsilon %g and rope.freq_base %g must be positive", arch,
                (double)hp->rms_eps, (double)hp->rope_theta);
        goto out;
    }

    if (hp->arch == MR_ARCH_QWEN3 || hp->arch == MR_ARCH_QWEN35) {
        if (mr_model_key_u32(g, arch, "feed_forward_length", &hp->n_ff, true, 0, err))
            goto out;
        if (hp->n_ff <= 0) {
            mr_errf(err, "%s: feed_forward_length must be positive", arch);
            goto out;
        }
    } else {
        if (mr_model_key_u32(g, arch, "feed_forward_length", &hp->n_ff, false, 0, err) ||
            mr_model_key_u32(g, arch, "expert_count", &hp->n_expert, true, 0, err) ||
            mr_model_key_u32(g, arch, "expert_used_count", &hp->n_expert_used, true, 0, err))
            goto out;
        if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert) {
            mr_errf(err, "%s: expert_count %d / expert_used_count %d: need 1 <= used <= count", arch,
                    hp->n_expert, hp->n_expert_used);
            goto out;
        }
        /* As upstream: the expert width defaults to feed_forward_length / used. */
        if (mr_model_key_u32(g, arch, "expert_feed_forward_length", &hp->n_ff_exp, false,
                    hp->n_ff / hp->n_expert_used, err))
            goto out;
        if (hp->n_ff_exp <= 0) {
            mr_errf(err, "%s: expert_feed_forward_length is missing or zero", arch);
            goto out;
        }
        /* Qwen3-MoE renormalises the top-k weights (transformers norm_topk_prob,
         * upstream llama.cpp hard-codes it for this architecture); a file may
         * still say otherwise with expert_weights_norm. */
        hp->norm_topk = true;
        char key[128];
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        if (mr_gguf_find(g, key) && mr_gguf_get_bool(g, key, &hp->norm_topk, err))
            goto out;
    }
    if ((hp->arch == MR_ARCH_QWEN35 || hp->arch == MR_ARCH_QWEN35MOE) &&
        mr_qwen35_read_hparams(g, arch, hp, err))
        goto out;
    rc = 0;
out:
    free(arch);
    return rc;
}

/* ---- weights ---- */

static const mr_gguf_tensor *find_tensor(const mr_model *m, const char *name, int64_t ne0, int64_t ne1,
                                         int64_t ne2, mr_err *err)
{
    const mr_gguf_tensor *t = mr_gguf_find_tensor(m->gguf, name);
    if (!t) {
        mr_errf(err, "missing tensor '%s'", name);
        return NULL;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1) {
        mr_errf(err, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                (long long)ne0, (long long)ne1, (long long)ne2);
        return NULL;
    }
    size_t rb = mr_row_size(t->type, ne0);
    if (rb == 0 || t->nbytes < rb * (size_t)ne1 * (size_t)ne2) {
        mr_errf(err, "tensor '%s': type %s with %lld columns does not fit its %zu bytes", name,
                mr_type_name(t->type), (long long)ne0, t->nbytes);
        return NULL;
    }
    return t;
}

/* Binds matrix `name` ([cols, rows, mats] as GGUF writes it) on the backend. */
static int load_matrix(mr_model *m, mr_weight *w, const char *name, int64_t cols, int64_t rows,
                       int64_t mats, mr_err *err)
{
    const mr_gguf_tensor *t = find_tensor(m, name, cols, rows, mats, err);
    if (!t)
        return -1;
    memset(w, 0, sizeof *w);
    w->name = t->name;
    w->type = (int)t->type;
    w->cols = cols;
    w->rows = rows;
    w->n_mats = mats;
    w->row_bytes = mr_row_size(t->type, cols);
    if (m->be->weight_load(m->be, w, t->data, err)) {
        w->data = NULL; /* the backend's message names the weight */
        return -1;
    }
    return 0;
}

/* Norm weights: small vectors, converted to float32 and uploaded. */
static int load_vector(mr_model *m, float **out, const char *name, int64_t n, mr_err *err)
{
    const mr_gguf_tensor *t = find_tensor(m, name, n, 1, 1, err);
    if (!t)
        return -1;
    float *host = malloc(sizeof(float) * (size_t)n);
    if (!host)
        return mr_errf(err, "out of memory for '%s'", name);
    if (mr_dequantize_row(t->type, t->data, host, n)) {
        free(host);
        return mr_errf(err, "tensor '%s': type %s is not supported", name, mr_type_name(t->type));
    }
    *out = m->be->alloc(m->be, sizeof(float) * (size_t)n);
    int rc = *out ? m->be->upload(m->be, *out, host, sizeof(float) * (size_t)n, err)
                  : mr_errf(err, "out of backend memory for '%s'", name);
    free(host);
    return rc;
}

int mr_model_load_matrix(mr_model *m, mr_weight *w, const char *name, int64_t cols, int64_t rows,
                         int64_t mats, mr_err *err)
{
    return load_matrix(m, w, name, cols, rows, mats, err);
}

int mr_model_load_floats(mr_model *m, float **out, const char *name, int64_t ne0, int64_t ne1,
                         mr_err *err)
{
    const mr_gguf_tensor *t = find_tensor(m, name, ne0, ne1, 1, err);
    if (!t)
        return -1;
    size_t n = (size_t)ne0 * (size_t)ne1, rb = mr_row_size(t->type, ne0);
    float *host = malloc(sizeof(float) * n);
    if (!host)
        return mr_errf(err, "out of memory for '%s'", name);
    for (int64_t r = 0; r < ne1; r++) {
        if (mr_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, host + (size_t)r * (size_t)ne0,
                              ne0)) {
            free(host);
            return mr_errf(err, "tensor '%s': type %s is not supported", name, mr_type_name(t->type));
        }
    }
    *out = m->be->alloc(m->be, sizeof(float) * n);
    int rc = *out ? m->be->upload(m->be, *out, host, sizeof(float) * n, err)
                  : mr_errf(err, "out of backend memory for '%s'", name);
    free(host);
    return rc;
}

static int load_layer(mr_model *m, int il, mr_err *err)
{
    const mr_hparams *hp = &m->hp;
    mr_layer *L = &m->layers[il];
    int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    if (load_vector(m, &L->attn_norm, NAME("attn_norm.weight"), hp->n_embd, err) ||
        load_vector(m, &L->q_norm, NAME("attn_q_norm.weight"), hp->head_dim, err) ||
        load_vector(m, &L->k_norm, NAME("attn_k_norm.weight"), hp->head_dim, err) ||
        load_vector(m, &L->ffn_norm, NAME("ffn_norm.weight"), hp->n_embd, err) ||
        load_matrix(m, &L->wq, NAME("attn_q.weight"), hp->n_embd, q_dim, 1, err) ||
        load_matrix(m, &L->wk, NAME("attn_k.weight"), hp->n_embd, kv_dim, 1, err) ||
        load_matrix(m, &L->wv, NAME("attn_v.weight"), hp->n_embd, kv_dim, 1, err) ||
        load_matrix(m, &L->wo, NAME("attn_output.weight"), q_dim, hp->n_embd, 1, err))
        return -1;
    if (hp->arch == MR_ARCH_QWEN3) {
        if (load_matrix(m, &L->ffn_gate, NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff, 1, err) ||
            load_matrix(m, &L->ffn_up, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff, 1, err) ||
            load_matrix(m, &L->ffn_down, NAME("ffn_down.weight"), hp->n_ff, hp->n_embd, 1, err))
            return -1;
    } else {
        if (load_matrix(m, &L->ffn_gate_inp, NAME("ffn_gate_inp.weight"), hp->n_embd, hp->n_expert, 1, err) ||
            load_matrix(m, &L->ffn_gate_exps, NAME("ffn_gate_exps.weight"), hp->n_embd, hp->n_ff_exp,
                        hp->n_expert, err) ||
            load_matrix(m, &L->ffn_up_exps, NAME("ffn_up_exps.weight"), hp->n_embd, hp->n_ff_exp,
                        hp->n_expert, err) ||
            load_matrix(m, &L->ffn_down_exps, NAME("ffn_down_exps.weight"), hp->n_ff_exp, hp->n_embd,
                        hp->n_expert, err))
            return -1;
    }
#undef NAME
    return 0;
}

static int load_weights(mr_model *m, mr_err *err)
{
    const mr_gguf_tensor *emb = mr_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb)
        return mr_errf(err, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] <= 0 || emb->ne[1] > (1 << 30))
        return mr_errf(err, "tensor 'token_embd.weight': bad vocabulary size %lld", (long long)emb->ne[1]);
    m->hp.n_vocab = (int)emb->ne[1];
    if (load_matrix(m, &m->tok_embd, "token_embd.weight", m->hp.n_embd, m->hp.n_vocab, 1, err))
        return -1;
    if (mr_gguf_find_tensor(m->gguf, "output.weight")) {
        if (load_matrix(m, &m->output, "output.weight", m->hp.n_embd, m->hp.n_vocab, 1, err))
            return -1;
    } else {
        m->output = m->tok_embd; /* tied embeddings */
        m->output_tied = true;
    }
    if (load_vector(m, &m->output_norm, "output_norm.weight", m->hp.n_embd, err))
        return -1;
    m->layers = calloc((size_t)m->hp.n_layers, sizeof *m->layers);
    if (!m->layers)
        return mr_errf(err, "out of memory");
    if (m->hp.arch == MR_ARCH_QWEN35 || m->hp.arch == MR_ARCH_QWEN35MOE)
        return mr_qwen35_load_layers(m, err);
    for (int il = 0; il < m->hp.n_layers; il++)
        if (load_layer(m, il, err))
            return -1;
    return 0;
}

/* ---- KV cache ---- */

static int create_kv(mr_model *m, const mr_model_opts *opts, mr_err *err)
{
    int n_ctx = opts && opts->n_ctx > 0 ? opts->n_ctx : 4096;
    if (n_ctx > m->hp.n_ctx_train && m->hp.n_ctx_train > 0)
        n_ctx = m->hp.n_ctx_train;
    int n_seqs = opts && opts->n_seqs > 0 ? opts->n_seqs : 1;
    int bt = opts && opts->block_tokens > 0 ? opts->block_tokens : 16;
    m->n_ctx = n_ctx;
    m->max_blocks = (n_ctx + bt - 1) / bt;
    int kv_layers = m->hp.n_kv_layers > 0 ? m->hp.n_kv_layers : m->hp.n_layers; /* hybrids: full-attention layers only */
    mr_kv_dtype dtype = opts ? opts->kv_dtype : MR_KV_AUTO;
    if (dtype == MR_KV_AUTO)
        dtype = m->be->kv_default;
    int64_t n_blocks = (int64_t)m->max_blocks * n_seqs;
    if (opts && opts->kv_blocks > 0)
        n_blocks = opts->kv_blocks;
    else if (opts && (opts->kv_bytes > 0 || opts->kv_budget)) {
        size_t budget = opts->kv_bytes > 0 ? opts->kv_bytes : opts->kv_budget(opts->kv_budget_ctx, m->be);
        /* a budget from free memory leaves room for the recurrent states:
         * each sequence's own, its block-boundary copy and one prefix-cache
         * checkpoint (mr_model_set_checkpoints), and the zero state new
         * ones are copied from (zero_state_make), at most half of it (many
         * slots on a small card: the K/V keeps half, and a sequence whose
         * state finds no memory later fails alone) */
        size_t states = (3 * (size_t)n_seqs + 1) * m->rstate_bytes;
        if (opts->kv_bytes <= 0 && m->rstate_bytes)
            budget -= states < budget / 2 ? states : budget / 2;
        size_t bb = mr_kv_block_bytes(kv_layers, bt, m->hp.n_kv_heads, m->hp.head_dim, dtype);
        if (budget > 0 || opts->kv_bytes > 0) {
            n_blocks = mr_kv_blocks_for_budget(budget, bb, 1 << 24);
            if (n_blocks <= 0)
                return mr_errf(err, "a KV budget of %zu bytes holds no block of %zu bytes", budget, bb);
        }
    }
    if (n_blocks > (1 << 24))
        return mr_errf(err, "KV cache of %lld blocks of %d tokens is too large", (long long)n_blocks, bt);
    m->kv.n_layers = kv_layers;
    m->kv.n_blocks = (int)n_blocks;
    m->kv.block_tokens = bt;
    m->kv.n_kv_heads = m->hp.n_kv_heads;
    m->kv.head_dim = m->hp.head_dim;
    m->kv.dtype = dtype;
    if (m->be->kv_create(m->be, &m->kv, err)) {
        memset(&m->kv, 0, sizeof m->kv);
        return mr_err_wrap(err, "creating the KV cache");
    }
    return mr_kv_pool_new(m->kv.n_blocks, &m->pool, err);
}

/* ---- model ---- */

int mr_model_load(const char *path, mr_backend *be, const mr_model_opts *opts, mr_model **out,
                  mr_err *err)
{
    *out = NULL;
    if (!be)
        return mr_errf(err, "%s: no backend to load the model on", path);
    mr_model *m = calloc(1, sizeof *m);
    if (!m)
        return mr_errf(err, "out of memory");
    m->be = be;
    if (mr_gguf_open(path, &m->gguf, err))
        goto fail;
    if (read_hparams(m->gguf, &m->hp, err) || load_weights(m, err) || create_kv(m, opts, err)) {
        mr_err_wrap(err, "%s", path);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    mr_model_free(m);
    return -1;
}

void mr_model_release_weight(mr_model *m, mr_weight *w)
{
    if (w->data)
        m->be->weight_release(m->be, w);
}

void mr_model_free_floats(mr_model *m, float *v)
{
    if (v)
        m->be->free(m->be, v);
}

void mr_model_release_layer(mr_model *m, mr_layer *L)
{
    float *vecs[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        mr_model_free_floats(m, vecs[i]);
    mr_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                       &L->ffn_gate_inp, &L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        mr_model_release_weight(m, ws[i]);
}

static void spares_free(mr_model *m)
{
    while (m->n_spare_state > 0)
        m->be->free(m->be, m->spare_state[--m->n_spare_state]);
    while (m->n_spare_table > 0)
        m->be->free(m->be, m->spare_table[--m->n_spare_table]);
    if (m->rzero)
        m->be->free(m->be, m->rzero);
    m->rzero = NULL;
}

static void free_scratch(mr_model *m)
{
    if (m->sc.block)
        m->be->free(m->be, m->sc.block);
    memset(&m->sc, 0, sizeof m->sc);
}

int mr_model_router_dump(mr_model *m, FILE *f, mr_err *err)
{
    const bool failed = m->router_failed;
    if (failed && err)
        *err = m->router_err;
    m->router_failed = false;
    m->router_dump = f;
    if (!f) {
        free(m->router_host);
        m->router_host = NULL;
        m->router_host_cap = 0;
    }
    return failed ? -1 : 0;
}

void mr_fwd_router_dump(mr_model *m, int n)
{
    if (m->router_failed)
        return;
    const size_t count = (size_t)n * (size_t)m->hp.n_expert;
    if (count > m->router_host_cap) {
        float *p = realloc(m->router_host, count * sizeof(float));
        if (!p) {
            mr_errf(&m->router_err, "router dump: out of memory for %zu logits", count);
            m->router_failed = true;
            return;
        }
        m->router_host = p;
        m->router_host_cap = count;
    }
    if (m->be->download(m->be, m->router_host, m->sc.router, count * sizeof(float), &m->router_err)) {
        mr_err_wrap(&m->router_err, "router dump");
        m->router_failed = true;
        return;
    }
    if (fwrite(m->router_host, sizeof(float), count, m->router_dump) != count) {
        mr_errf(&m->router_err, "router dump: write of %zu logits failed", count);
        m->router_failed = true;
    }
}

void mr_model_free(mr_model *m)
{
    if (!m)
        return;
    free(m->router_host);
    mr_backend *be = m->be;
    free_scratch(m);
    spares_free(m);
    if (m->samp_dev)
        m->be->free(m->be, m->samp_dev);
    free(m->samp_host);
    mr_qwen35_free(m);
    if (m->layers) {
        for (int il = 0; il < m->hp.n_layers; il++)
            mr_model_release_layer(m, &m->layers[il]);
        free(m->layers);
    }
    mr_model_free_floats(m, m->output_norm);
    if (!m->output_tied)
        mr_model_release_weight(m, &m->output);
    mr_model_release_weight(m, &m->tok_embd);
    if (m->kv.k || m->kv.v)
        be->kv_destroy(be, &m->kv);
    mr_kv_pool_free(m->pool);
    mr_gguf_close(m->gguf);
    free(m->stage);
    free(m->segs);
    free(m);
}

const mr_hparams *mr_model_hparams(const mr_model *m) { return &m->hp; }

int mr_model_n_ctx(const mr_model *m) { return m->n_ctx; }

mr_kv_pool *mr_model_kv_pool(mr_model *m) { return m->pool; }

int mr_model_block_tokens(const mr_model *m) { return m->kv.block_tokens; }

/* ---- sequences ---- */

/* A buffer of `bytes` from the spares of its kind (list, *n of them), or a
 * new one; NULL when the backend has no memory left.  A buffer given back
 * may still be read or written by work queued on the backend: whatever the
 * next holder queues runs after that work (one queue, in order). */
static void *spare_take(mr_model *m, void **list, int *n, size_t bytes)
{
    if (*n > 0)
        return list[--*n];
    return m->be->alloc(m->be, bytes);
}

static void spare_give(mr_model *m, void **list, int *n, void *p)
{
    if (!p)
        return;
    if (*n < MR_SPARE_MAX)
        list[(*n)++] = p;
    else
        m->be->free(m->be, p);
}

static void state_copy(mr_model *m, void *dst, const void *src);

/* m->rzero, once: the zero state every new sequence's starts as */
static int zero_state_make(mr_model *m, mr_err *err)
{
    if (m->rzero)
        return 0;
    void *zeros = calloc(1, m->rstate_bytes), *dev = m->be->alloc(m->be, m->rstate_bytes);
    int rc = zeros && dev ? m->be->upload(m->be, dev, zeros, m->rstate_bytes, err)
                          : mr_errf(err, "out of memory for %zu bytes of recurrent state", m->rstate_bytes);
    free(zeros);
    if (rc) {
        if (dev)
            m->be->free(m->be, dev);
        return -1;
    }
    m->rzero = dev;
    return 0;
}

int mr_seq_new(mr_model *m, mr_seq **out, mr_err *err)
{
    *out = NULL;
    mr_seq *s = calloc(1, sizeof *s);
    if (!s)
        return mr_errf(err, "out of memory");
    s->m = m;
    s->blocks = calloc((size_t)m->max_blocks, sizeof(int32_t));
    s->blocks_dev = spare_take(m, m->spare_table, &m->n_spare_table, sizeof(int32_t) * (size_t)m->max_blocks);
    if (!s->blocks || !s->blocks_dev) {
        mr_seq_free(s);
        return mr_errf(err, "out of memory for a block table of %d blocks", m->max_blocks);
    }
    if (m->rstate_bytes) {
        /* a new sequence starts from a zero recurrent state */
        int rc = zero_state_make(m, err);
        if (!rc && !(s->rstate = spare_take(m, m->spare_state, &m->n_spare_state, m->rstate_bytes)))
            rc = mr_errf(err, "out of memory for %zu bytes of recurrent state", m->rstate_bytes);
        if (!rc && m->checkpoints && !(s->rmark = spare_take(m, m->spare_state, &m->n_spare_state, m->rstate_bytes)))
            rc = mr_errf(err, "out of memory for a %zu-byte state checkpoint", m->rstate_bytes);
        if (rc) {
            mr_seq_free(s);
            return -1;
        }
        state_copy(m, s->rstate, m->rzero);
    }
    *out = s;
    return 0;
}

void mr_seq_free(mr_seq *s)
{
    if (!s)
        return;
    mr_model *m = s->m;
    for (int i = s->n_blocks - 1; i >= 0; i--)
        mr_kv_unref(m->pool, s->blocks[i]);
    mr_kv_unreserve(m->pool, s->reserved);
    spare_give(m, m->spare_table, &m->n_spare_table, s->blocks_dev);
    spare_give(m, m->spare_state, &m->n_spare_state, s->rstate);
    spare_give(m, m->spare_state, &m->n_spare_state, s->rmark);
    free(s->blocks);
    free(s);
}

int mr_seq_len(const mr_seq *s) { return s->len; }

size_t mr_seq_state_bytes(const mr_model *m) { return m->rstate_bytes; }

int mr_seq_state_save(const mr_seq *s, void *host, mr_err *err)
{
    if (!s->rstate)
        return 0;
    return s->m->be->download(s->m->be, host, s->rstate, s->m->rstate_bytes, err);
}

int mr_seq_state_load(mr_seq *s, const void *host, mr_err *err)
{
    if (!s->rstate)
        return 0;
    return s->m->be->upload(s->m->be, s->rstate, host, s->m->rstate_bytes, err);
}

/* ---- recurrent-state checkpoints (prefix cache over a hybrid model) ---- */

/* One state's bytes, backend to backend (the state is float32 throughout). */
static void state_copy(mr_model *m, void *dst, const void *src)
{
    m->be->copy_2d(m->be, dst, 0, src, 0, 1, (int)(m->rstate_bytes / sizeof(float)));
}

void mr_model_set_checkpoints(mr_model *m, bool on) { m->checkpoints = on && m->rstate_bytes > 0; }

int mr_seq_mark_len(const mr_seq *s) { return s->rmark ? s->rmark_len : 0; }

void *mr_model_state_alloc(mr_model *m)
{
    return m->rstate_bytes ? spare_take(m, m->spare_state, &m->n_spare_state, m->rstate_bytes) : NULL;
}

void mr_model_state_free(mr_model *m, void *state) { spare_give(m, m->spare_state, &m->n_spare_state, state); }

void mr_seq_mark_save(const mr_seq *s, void *state)
{
    if (s->rmark && state)
        state_copy(s->m, state, s->rmark);
}

void mr_seq_state_copy_out(const mr_seq *s, void *state)
{
    if (s->rstate && state)
        state_copy(s->m, state, s->rstate);
}

void mr_seq_state_copy_in(mr_seq *s, const void *state)
{
    if (s->rstate && state)
        state_copy(s->m, s->rstate, state);
}

static void mr_seq_state_restore(mr_seq *s, const void *state, int len)
{
    if (!s->rstate || !state)
        return;
    state_copy(s->m, s->rstate, state);
    if (s->rmark) {
        state_copy(s->m, s->rmark, state);
        s->rmark_len = len;
    }
}

static int blocks_for(const mr_model *m, int tokens)
{
    return (tokens + m->kv.block_tokens - 1) / m->kv.block_tokens;
}

/* Grows s to hold `len` tokens, drawing on its reservation first, and
 * uploads its block table. */
static int seq_grow(mr_seq *s, int len, mr_err *err)
{
    mr_model *m = s->m;
    int need = blocks_for(m, len);
    if (need <= s->n_blocks)
        return 0;
    int avail = s->reserved + mr_kv_pool_available(m->pool);
    if (need - s->n_blocks > avail)
        return mr_errf(err, "KV cache full: %d more blocks needed, %d free", need - s->n_blocks, avail);
    while (s->n_blocks < need) {
        int from_res = s->reserved > 0;
        int32_t b = mr_kv_alloc(m->pool, from_res);
        if (b < 0)
            return mr_errf(err, "KV cache full: no free block");
        if (from_res)
            s->reserved--;
        s->blocks[s->n_blocks++] = b;
    }
    return m->be->upload(m->be, s->blocks_dev, s->blocks, sizeof(int32_t) * (size_t)s->n_blocks, err);
}

int mr_seq_grow(mr_seq *s, int len, mr_err *err) { return seq_grow(s, len, err); }

int mr_seq_skip(mr_seq *s, int n, mr_err *err)
{
    if (n < 0 || n > s->m->n_ctx - s->len)
        return mr_errf(err, "skip: %d positions after %d in a context of %d", n, s->len, s->m->n_ctx);
    if (seq_grow(s, s->len + n, err))
        return -1;
    s->len += n;
    return 0;
}

void mr_seq_state_settled(mr_seq *s)
{
    if (s->rmark && s->len > 0 && s->len % s->m->kv.block_tokens == 0) {
        state_copy(s->m, s->rmark, s->rstate);
        s->rmark_len = s->len;
    }
}

int mr_seq_truncate(mr_seq *s, int len, mr_err *err)
{
    if (len < 0 || len > s->len)
        return mr_errf(err, "truncate: length %d outside [0, %d]", len, s->len);
    /* the entries past len get overwritten: not allowed in blocks another
     * holder (a sequence, the prefix cache) shares */
    for (int i = len / s->m->kv.block_tokens; i < s->n_blocks; i++)
        if (mr_kv_refcount(s->m->pool, s->blocks[i]) > 1)
            return mr_errf(err, "truncate: block %d (index %d) is shared", s->blocks[i], i);
    s->len = len; /* later K/V entries are overwritten before anything reads them */
    if (s->rmark_len > len)
        s->rmark_len = 0; /* that boundary state is past the new end */
    return 0;
}

int mr_seq_reserve(mr_seq *s, int n_tokens, mr_err *err)
{
    mr_model *m = s->m;
    if (n_tokens > m->n_ctx)
        return mr_errf(err, "reserve: %d tokens exceed the context of %d tokens", n_tokens, m->n_ctx);
    int more = blocks_for(m, n_tokens) - s->n_blocks - s->reserved;
    if (more <= 0)
        return 0;
    if (mr_kv_reserve(m->pool, more))
        return mr_errf(err, "KV cache full: %d more blocks needed, %d available", more,
                       mr_kv_pool_available(m->pool));
    s->reserved += more;
    return 0;
}

int mr_seq_reserved(const mr_seq *s) { return s->reserved; }

static int attach_blocks(mr_seq *s, const int32_t *blocks, int n_blocks, mr_err *err);

int mr_seq_attach(mr_seq *s, const int32_t *blocks, int n_blocks, mr_err *err)
{
    if (n_blocks > 0 && s->rstate)
        return mr_errf(err, "attach: shared K/V blocks carry no recurrent state (%s)", s->m->hp.arch_name);
    return attach_blocks(s, blocks, n_blocks, err);
}

int mr_seq_attach_state(mr_seq *s, const int32_t *blocks, int n_blocks, const void *state, mr_err *err)
{
    if (!s->rmark || !state)
        return mr_errf(err, "attach: a state checkpoint needs a hybrid model with checkpoints on");
    if (attach_blocks(s, blocks, n_blocks, err))
        return -1;
    mr_seq_state_restore(s, state, s->len);
    return 0;
}

static int attach_blocks(mr_seq *s, const int32_t *blocks, int n_blocks, mr_err *err)
{
    mr_model *m = s->m;
    if (s->len != 0 || s->n_blocks != 0)
        return mr_errf(err, "attach: the sequence is not empty (%d tokens)", s->len);
    if (n_blocks < 0 || n_blocks > m->max_blocks)
        return mr_errf(err, "attach: %d blocks (a sequence holds at most %d)", n_blocks, m->max_blocks);
    for (int i = 0; i < n_blocks; i++)
        if (mr_kv_refcount(m->pool, blocks[i]) <= 0)
            return mr_errf(err, "attach: block %d (index %d) is not in use", blocks[i], i);
    if (n_blocks == 0)
        return 0;
    if (m->be->upload(m->be, s->blocks_dev, blocks, sizeof(int32_t) * (size_t)n_blocks, err))
        return -1;
    for (int i = 0; i < n_blocks; i++) {
        mr_kv_ref(m->pool, blocks[i]);
        s->blocks[i] = blocks[i];
    }
    s->n_blocks = n_blocks;
    s->len = n_blocks * m->kv.block_tokens;
    return 0;
}

int mr_seq_blocks(const mr_seq *s, const int32_t **blocks)
{
    *blocks = s->blocks;
    return s->n_blocks;
}

void *mr_model_carve(mr_model *m, const mr_carve *parts, size_t n_parts, int cap, mr_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n_parts; i++)
        total += (parts[i].elems * 4 + 255) & ~(size_t)255; /* int32 and float are 4 bytes */
    uint8_t *base = m->be->alloc(m->be, total);
    if (!base) {
        mr_errf(err, "out of backend memory for activations of %d tokens (%zu bytes)", cap, total);
        return NULL;
    }
    size_t off = 0;
    for (size_t i = 0; i < n_parts; i++) {
        *parts[i].p = base + off;
        off += (parts[i].elems * 4 + 255) & ~(size_t)255;
    }
    return base;
}

/* Carves the activation buffers for up to cap tokens, out_cap of them with
 * logits, out of one allocation. */
static int scratch_reserve(mr_model *m, int cap, int out_cap, mr_err *err)
{
    if (out_cap < 1)
        out_cap = 1;
    if (cap <= m->sc.cap && out_cap <= m->sc.out_cap)
        return 0;
    /* grow both to at least what they were, so alternating shapes settle */
    if (cap < m->sc.cap)
        cap = m->sc.cap;
    if (out_cap < m->sc.out_cap)
        out_cap = m->sc.out_cap;
    free_scratch(m);
    const mr_hparams *hp = &m->hp;
    size_t n = (size_t)cap, k = (size_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 1);
    size_t ff = hp->n_expert > 0 ? k * (size_t)hp->n_ff_exp : (size_t)hp->n_ff;
    size_t qd = (size_t)hp->n_heads * (size_t)hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t e = (size_t)hp->n_embd;
    mr_carve parts[] = {
        /* ids, positions, then (8-byte aligned) the rows' block tables: one upload a call */
        {(void **)&m->sc.tokens, 4 * n + 2},
        {(void **)&m->sc.x, n * e},
        {(void **)&m->sc.xn, n * e},
        {(void **)&m->sc.q, n * qd},
        {(void **)&m->sc.k, n * kvd},
        {(void **)&m->sc.v, n * kvd},
        {(void **)&m->sc.att, n * qd},
        {(void **)&m->sc.proj, n * e},
        {(void **)&m->sc.gate, n * ff},
        {(void **)&m->sc.up, n * ff},
        {(void **)&m->sc.router, n * (size_t)(hp->n_expert > 0 ? hp->n_expert : 1)},
        {(void **)&m->sc.exp_ids, n * k},
        {(void **)&m->sc.exp_w, n * k},
        {(void **)&m->sc.exp_out, n * k * e},
        {(void **)&m->sc.logits, (size_t)out_cap * (size_t)hp->n_vocab}, /* only rows with logits wanted */
        {(void **)&m->sc.ids, (size_t)out_cap},
    };
    void *base = mr_model_carve(m, parts, sizeof parts / sizeof parts[0], cap, err);
    if (!base)
        return -1;
    m->sc.block = base;
    m->sc.cap = cap;
    m->sc.out_cap = out_cap;
    return 0;
}

int mr_model_forward(mr_model *m, mr_seq *s, const int32_t *tokens, int n, mr_logits_mode mode,
                     float *logits, mr_err *err)
{
    mr_batch_item it = {.seq = s, .tokens = tokens, .n = n, .mode = mode, .logits = logits};
    return mr_model_forward_batch(m, &it, 1, err);
}

int mr_model_forward_gen(mr_model *m, mr_seq *s, const int32_t *tokens, int n, mr_logits_mode mode,
                         float *logits, mr_err *err)
{
    mr_batch_item it = {.seq = s, .tokens = tokens, .n = n, .mode = mode, .logits = logits, .gen = true};
    return mr_model_forward_batch(m, &it, 1, err);
}

int mr_model_warmup(mr_model *m, int n_tokens, int out_rows, mr_err *err)
{
    if (n_tokens > m->n_ctx)
        n_tokens = m->n_ctx;
    if (n_tokens < 1)
        return 0;
    /* the activation buffers of the whole step first: its rows of logits
     * are the decoding requests', which this prompt does not have */
    if (scratch_reserve(m, n_tokens, out_rows, err))
        return mr_err_wrap(err, "warm-up step of %d tokens", n_tokens);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_tokens);
    if (!ids)
        return mr_errf(err, "out of memory");
    /* ids spread over the vocabulary, so a mixture layer's tokens go to
     * many experts as a real prompt's do */
    for (int i = 0; i < n_tokens; i++)
        ids[i] = (int32_t)(((int64_t)i * 7919 + 1) % m->hp.n_vocab);
    mr_seq *s = NULL;
    int rc = mr_seq_new(m, &s, err);
    if (!rc) /* the forward syncs with the backend: an allocation that failed shows here */
        rc = mr_model_forward(m, s, ids, n_tokens, MR_LOGITS_NONE, NULL, err);
    mr_seq_free(s);
    free(ids);
    if (rc)
        return mr_err_wrap(err, "warm-up step of %d tokens", n_tokens);
    return 0;
}

static int check_item(const mr_model *m, const mr_batch_item *it, int idx, mr_err *err)
{
    if (!it->seq || it->seq->m != m)
        return mr_errf(err, "forward: item %d has no sequence of this model", idx);
    if (it->n <= 0)
        return mr_errf(err, "forward: %d tokens (need at least one)", it->n);
    if (it->n > m->n_ctx - it->seq->len)
        return mr_errf(err, "forward: %d tokens at position %d exceed the context of %d tokens", it->n,
                       it->seq->len, m->n_ctx);
    for (int t = 0; t < it->n; t++)
        if (it->tokens[t] < 0 || it->tokens[t] >= m->hp.n_vocab)
            return mr_errf(err, "forward: token id %d (index %d) is out of range [0, %d)", it->tokens[t], t,
                           m->hp.n_vocab);
    if (it->mode != MR_LOGITS_NONE && it->mode != MR_LOGITS_LAST && it->mode != MR_LOGITS_ALL &&
        it->mode != MR_LOGITS_ARGMAX && it->mode != MR_LOGITS_SAMPLE && it->mode != MR_LOGITS_ARGMAX_ALL)
        return mr_errf(err, "forward: unknown logits mode %d", (int)it->mode);
    if ((it->mode == MR_LOGITS_LAST || it->mode == MR_LOGITS_ALL) && !it->logits)
        return mr_errf(err, "forward: logits requested without an output buffer");
    if ((it->mode == MR_LOGITS_ARGMAX || it->mode == MR_LOGITS_ARGMAX_ALL) && !it->argmax)
        return mr_errf(err, "forward: argmax requested without an output buffer");
    if (it->mode == MR_LOGITS_SAMPLE) {
        if (!m->be->sample)
            return mr_errf(err, "forward: the %s backend does not sample", m->be->name);
        const mr_sample_row *r = it->sample;
        if (!it->argmax || !r)
            return mr_errf(err, "forward: sampling requested without its row or an output buffer");
        if (r->n_add_prompt < 0 || r->n_add_gen < 0 || r->n_add_prompt > (1 << 26) - r->n_add_gen ||
            (r->n_add_prompt + r->n_add_gen > 0 && (!it->sample_add || !r->table)))
            return mr_errf(err, "forward: sampling row adds %d + %d ids to %s", r->n_add_prompt, r->n_add_gen,
                           r->table ? "its table" : "no table");
    }
    return 0;
}

/* Byte offset of the block-table pointers after the ids and positions of
 * a call of n rows (8-byte aligned), in the host stage and in sc.tokens. */
static size_t tables_offset(int n) { return ((size_t)n * 2 * sizeof(int32_t) + 7) & ~(size_t)7; }

int32_t *mr_model_stage(mr_model *m, int n, mr_err *err)
{
    if (n > m->stage_cap) {
        /* ids, positions, then room for n table pointers  */
        int32_t *p = realloc(m->stage, sizeof(int32_t) * (4 * (size_t)n + 2));
        if (!p) {
            mr_errf(err, "out of memory for %d staged tokens", n);
            return NULL;
        }
        m->stage = p;
        m->stage_cap = n;
    }
    return m->stage;
}

int mr_model_stage_upload(mr_model *m, int n, int n_tables, mr_err *err)
{
    m->sc.pos = m->sc.tokens + n;
    m->sc.tables = (const int32_t **)(void *)((char *)m->sc.tokens + tables_offset(n));
    size_t bytes = n_tables > 0 ? tables_offset(n) + sizeof(void *) * (size_t)n_tables
                                : sizeof(int32_t) * 2 * (size_t)n;
    return m->be->upload(m->be, m->sc.tokens, m->stage, bytes, err);
}

/* When two or more short segments can share the backend's multi-sequence
 * ops: their rows' block tables into the stage after the ids and positions
 * (rows of other segments in that range NULL), the range into the model.
 * Returns how many table pointers were staged (0: none). */
static int stage_multi(mr_model *m, const mr_fwd_seg *segs, int n_segs, int n)
{
    m->multi_segs = NULL;
    mr_backend *be = m->be;
    if (!be->kv_store_multi || !be->attention_multi || n_segs < 2)
        return 0;
    int r0 = -1, r1 = -1, n_short = 0;
    for (int i = 0; i < n_segs; i++) {
        if (!mr_fwd_seg_multi(&segs[i]))
            continue;
        n_short++;
        if (r0 < 0 || segs[i].start < r0) r0 = segs[i].start;
        if (segs[i].start + segs[i].n > r1) r1 = segs[i].start + segs[i].n;
    }
    if (n_short < 2)
        return 0;
    const int32_t **tab = (const int32_t **)(void *)((char *)m->stage + tables_offset(n));
    for (int r = r0; r < r1; r++) tab[r - r0] = NULL;
    for (int i = 0; i < n_segs; i++)
        if (mr_fwd_seg_multi(&segs[i]))
            for (int t = 0; t < segs[i].n; t++) tab[segs[i].start + t - r0] = segs[i].s->blocks_dev;
    m->multi_segs = segs;
    m->multi_nsegs = n_segs;
    m->multi_r0 = r0;
    m->multi_r1 = r1;
    return r1 - r0;
}

/* Whether the backend rounds every row the same whatever the call (no
 * batch_variant_rows, no matmul_prompt): a product is then one call. */
static bool products_whole(const mr_backend *be)
{
    return be->batch_variant_rows <= 1 && !be->matmul_prompt;
}

/* Generated rows [0, g) of an n-row product (g <= n), in calls below the
 * backend's batch_variant_rows. */
static void products_gen(mr_model *m, const mr_weight *w, const float *x, float *y, int g)
{
    mr_backend *be = m->be;
    const int v = be->batch_variant_rows, step = v > 1 ? v - 1 : g;
    const size_t xr = (size_t)w->cols, yr = (size_t)w->rows;
    for (int r = 0; r < g; r += step)
        be->matmul(be, w, x + (size_t)r * xr, y + (size_t)r * yr, g - r < step ? g - r : step);
}

/* Prompt rows [g, n) of an n-row product. */
static void products_prompt(mr_model *m, const mr_weight *w, const float *x, float *y, int n, int g)
{
    mr_backend *be = m->be;
    const size_t xr = (size_t)w->cols, yr = (size_t)w->rows;
    if (n > g)
        (be->matmul_prompt ? be->matmul_prompt : be->matmul)(be, w, x + (size_t)g * xr, y + (size_t)g * yr, n - g);
}

/* Generated rows [0, g) of an n-row product, then prompt rows [g, n). */
static void products(mr_model *m, const mr_weight *w, const float *x, float *y, int n, int g)
{
    if (products_whole(m->be)) {
        m->be->matmul(m->be, w, x, y, n);
        return;
    }
    g = g < n ? g : n;
    products_gen(m, w, x, y, g);
    products_prompt(m, w, x, y, n, g);
}

void mr_fwd_matmuls(mr_model *m, const mr_weight *const *w, float *const *y, int count, const float *x, int n)
{
    if (products_whole(m->be)) {
        for (int i = 0; i < count; i++) m->be->matmul(m->be, w[i], x, y[i], n);
        return;
    }
    const int g = m->gen_rows < n ? m->gen_rows : n;
    for (int i = 0; i < count; i++) products_gen(m, w[i], x, y[i], g);
    for (int i = 0; i < count; i++) products_prompt(m, w[i], x, y[i], n, g);
}

void mr_fwd_matmul(mr_model *m, const mr_weight *w, const float *x, float *y, int n)
{
    products(m, w, x, y, n, m->gen_rows);
}

/* Every output row takes the decode products, a prompt's last row too: a
 * step has few output rows, and on the GEMM path the one row of a prompt
 * would dequantize the whole output matrix (2.6 ms of a 512-token prompt's
 * 136 on the 35B-A3B shape, H200).  The decode products give a row the same
 * bits in any call of fewer than batch_variant_rows rows, so the row's
 * logits still do not depend on the call. */
void mr_fwd_matmul_out(mr_model *m, const mr_weight *w, const float *x, float *y, int n)
{
    products(m, w, x, y, n, n);
}

void mr_fwd_matmul_id(mr_model *m, const mr_weight *w, const float *x, int x_slots, const int32_t *ids,
                      int k, float *y, int n)
{
    mr_backend *be = m->be;
    const int v = be->batch_variant_rows;
    if (v <= 1 && !be->matmul_id_prompt) {
        be->matmul_id(be, w, x, x_slots, ids, k, y, n);
        return;
    }
    const int g = m->gen_rows < n ? m->gen_rows : n, step = v > 1 ? v - 1 : g;
    const size_t xr = (size_t)x_slots * (size_t)w->cols, yr = (size_t)k * (size_t)w->rows;
    for (int r = 0; r < g; r += step)
        be->matmul_id(be, w, x + (size_t)r * xr, x_slots, ids + (size_t)r * (size_t)k, k, y + (size_t)r * yr,
                      g - r < step ? g - r : step);
    if (n > g)
        (be->matmul_id_prompt ? be->matmul_id_prompt : be->matmul_id)(
            be, w, x + (size_t)g * xr, x_slots, ids + (size_t)g * (size_t)k, k, y + (size_t)g * yr, n - g);
}

/* The routed experts of the call's first n rows as products and swiglu
 * apart. */
static void moe_ffn_apart(mr_model *m, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd, const float *x,
                          const int32_t *ids, int k, float *gate, float *up, float *y, int n)
{
    mr_fwd_matmul_id(m, wg, x, 1, ids, k, gate, n);
    mr_fwd_matmul_id(m, wu, x, 1, ids, k, up, n);
    m->be->swiglu(m->be, gate, up, gate, (size_t)n * (size_t)k * (size_t)wg->rows);
    mr_fwd_matmul_id(m, wd, gate, k, ids, k, y, n);
}

void mr_fwd_moe_ffn(mr_model *m, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd, const float *x,
                    const int32_t *ids, int k, float *gate, float *up, float *y, int n)
{
    mr_backend *be = m->be;
    const int g = m->gen_rows < n ? m->gen_rows : n;
    const size_t nff = (size_t)wg->rows;
    if (!be->moe_ffn_prompt || n <= g) {
        /* a decode step keeps its ops (the op recorder fuses gate, up and
         * swiglu there) */
        moe_ffn_apart(m, wg, wu, wd, x, ids, k, gate, up, y, n);
        return;
    }
    if (g > 0)
        moe_ffn_apart(m, wg, wu, wd, x, ids, k, gate, up, y, g);
    const size_t pk = (size_t)g * (size_t)k;
    be->moe_ffn_prompt(be, wg, wu, wd, x + (size_t)g * (size_t)wg->cols, ids + pk, k, gate + pk * nff, up + pk * nff,
                       y + pk * (size_t)wd->rows, n - g);
}

/* Copies the output rows of the items back: argmax ids, then logits rows;
 * a run of items whose rows are adjacent both in the scratch and in host
 * memory (the scheduler lays its buffers out so) goes in one download. */
static int download_outputs(mr_model *m, const mr_batch_item *items, const mr_fwd_seg *segs, int n_items,
                            mr_err *err)
{
    size_t vocab = (size_t)m->hp.n_vocab;
    for (int pass = 0; pass < 2; pass++) {
        bool ids = pass == 0;
        char *dst = NULL;
        const char *src = NULL;
        size_t bytes = 0;
        for (int i = 0; i < n_items; i++) {
            const mr_fwd_seg *g = &segs[i];
            bool id_mode = items[i].mode == MR_LOGITS_ARGMAX || items[i].mode == MR_LOGITS_SAMPLE ||
                           items[i].mode == MR_LOGITS_ARGMAX_ALL;
            if (id_mode != ids || g->n == g->out_first)
                continue;
            char *d = ids ? (char *)items[i].argmax : (char *)items[i].logits;
            const char *sr = ids ? (const char *)(m->sc.ids + g->out_row)
                                 : (const char *)(m->sc.logits + (size_t)g->out_row * vocab);
            size_t b = (ids ? sizeof(int32_t) : sizeof(float) * vocab) * (size_t)(g->n - g->out_first);
            if (bytes && d == dst + bytes && sr == src + bytes) {
                bytes += b;
                continue;
            }
            if (bytes && m->be->download(m->be, dst, src, bytes, err))
                return -1;
            dst = d;
            src = sr;
            bytes = b;
        }
        if (bytes && m->be->download(m->be, dst, src, bytes, err))
            return -1;
    }
    return 0;
}

bool mr_model_can_sample(const mr_model *m) { return m->be->sample != NULL; }

int32_t *mr_model_sample_table_new(mr_model *m)
{
    return m->be->alloc(m->be, sizeof(int32_t) * mr_sample_table_ints(m->hp.n_vocab));
}

void mr_model_sample_table_free(mr_model *m, int32_t *table)
{
    if (table)
        m->be->free(m->be, table);
}

/* The sample op's input for the n_out output rows of a call: a row per
 * output row (SAMPLE items' own, a greedy one for ARGMAX items, skip for
 * rows whose logits go to the host), then the ids the rows add to their
 * tables, in one upload to m->samp_dev. */
static int stage_samples(mr_model *m, const mr_batch_item *items, const mr_fwd_seg *segs, int n_items, int n_out,
                         mr_err *err)
{
    size_t n_add = 0;
    for (int i = 0; i < n_items; i++)
        if (items[i].mode == MR_LOGITS_SAMPLE)
            n_add += (size_t)items[i].sample->n_add_prompt + (size_t)items[i].sample->n_add_gen;
    if (n_add > INT32_MAX)
        return mr_errf(err, "forward: %zu ids for the penalty tables in one step", n_add);
    size_t rows_bytes = (sizeof(mr_sample_row) * (size_t)n_out + 255) & ~(size_t)255;
    size_t bytes = rows_bytes + sizeof(int32_t) * n_add;
    if (bytes > m->samp_host_cap) {
        char *p = realloc(m->samp_host, bytes + bytes / 2);
        if (!p)
            return mr_errf(err, "out of memory staging %d sample rows", n_out);
        m->samp_host = p;
        m->samp_host_cap = bytes + bytes / 2;
    }
    if (bytes > m->samp_dev_cap) {
        if (m->samp_dev)
            m->be->free(m->be, m->samp_dev);
        m->samp_dev_cap = 0;
        m->samp_dev = m->be->alloc(m->be, m->samp_host_cap);
        if (!m->samp_dev)
            return mr_errf(err, "out of backend memory for %d sample rows", n_out);
        m->samp_dev_cap = m->samp_host_cap;
    }
    mr_sample_row *rows = (mr_sample_row *)(void *)m->samp_host;
    int32_t *add = (int32_t *)(void *)(m->samp_host + rows_bytes);
    int32_t off = 0;
    for (int i = 0; i < n_items; i++) {
        const mr_batch_item *it = &items[i];
        for (int r = segs[i].out_row; r < segs[i].out_row + segs[i].n - segs[i].out_first; r++) {
            if (it->mode == MR_LOGITS_SAMPLE) {
                rows[r] = *it->sample;
                rows[r].skip = 0;
                rows[r].add_off = off;
                int na = it->sample->n_add_prompt + it->sample->n_add_gen;
                if (na > 0)
                    memcpy(add + off, it->sample_add, sizeof(int32_t) * (size_t)na);
                off += na;
            } else {
                /* ARGMAX(_ALL): greedy without penalties; LAST / ALL: left alone */
                rows[r] = (mr_sample_row){.skip = it->mode != MR_LOGITS_ARGMAX && it->mode != MR_LOGITS_ARGMAX_ALL};
            }
        }
    }
    m->samp_rows = (const mr_sample_row *)(void *)m->samp_dev;
    m->samp_add = (const int32_t *)(void *)(m->samp_dev + rows_bytes);
    return m->be->upload(m->be, m->samp_dev, m->samp_host, bytes, err);
}

/* Modes with an output for every token, not only the last. */
static bool every_row(mr_logits_mode mode) { return mode == MR_LOGITS_ALL || mode == MR_LOGITS_ARGMAX_ALL; }

int mr_model_forward_batch(mr_model *m, const mr_batch_item *items, int n_items, mr_err *err)
{
    if (n_items <= 0 || !items)
        return mr_errf(err, "forward: %d sequences (need at least one)", n_items);
    int64_t total = 0;
    for (int i = 0; i < n_items; i++) {
        if (check_item(m, &items[i], i, err))
            return mr_err_wrap(err, "batch item %d", i);
        for (int j = 0; j < i; j++)
            if (items[j].seq == items[i].seq)
                return mr_errf(err, "forward: sequence appears twice in one batch (items %d and %d)", j, i);
        if (i > 0 && items[i].gen && !items[i - 1].gen)
            return mr_errf(err, "forward: generated item %d after a prompt item (generated items come first)", i);
        total += items[i].n;
    }
    if (total > (1 << 24))
        return mr_errf(err, "forward: %lld tokens in one step are too many", (long long)total);
    int n = (int)total, n_out = 0;
    for (int i = 0; i < n_items; i++)
        n_out += every_row(items[i].mode) ? items[i].n : items[i].mode == MR_LOGITS_NONE ? 0 : 1;
    for (int i = 0; i < n_items; i++)
        if (seq_grow(items[i].seq, items[i].seq->len + items[i].n, err))
            return -1;
    if (scratch_reserve(m, n, n_out, err))
        return -1;
    if (n_items > m->segs_cap) {
        mr_fwd_seg *p = realloc(m->segs, sizeof *p * (size_t)n_items);
        if (!p)
            return mr_errf(err, "out of memory");
        m->segs = p;
        m->segs_cap = n_items;
    }
    int32_t *host = mr_model_stage(m, n, err);
    if (!host)
        return -1;
    mr_fwd_seg *segs = m->segs;
    int32_t *pos = host + n;
    int row = 0, out_row = 0;
    bool any_argmax = false, any_sample = false;
    for (int i = 0; i < n_items; i++) {
        const mr_batch_item *it = &items[i];
        memcpy(host + row, it->tokens, sizeof(int32_t) * (size_t)it->n);
        for (int t = 0; t < it->n; t++)
            pos[row + t] = it->seq->len + t;
        int of = every_row(it->mode) ? 0 : it->mode == MR_LOGITS_NONE ? it->n : it->n - 1;
        any_argmax |= it->mode == MR_LOGITS_ARGMAX || it->mode == MR_LOGITS_ARGMAX_ALL;
        any_sample |= it->mode == MR_LOGITS_SAMPLE;
        segs[i] = (mr_fwd_seg){.s = it->seq, .start = row, .n = it->n, .pos0 = it->seq->len,
                               .out_first = of, .out_row = out_row, .gen = it->gen};
        row += it->n;
        out_row += it->n - of;
    }
    if (mr_model_stage_upload(m, n, stage_multi(m, segs, n_items, n), err))
        return -1;
    if (any_sample && stage_samples(m, items, segs, n_items, out_row, err))
        return -1;
    /* generated rows: the leading generated items' (checked above) */
    m->gen_rows = 0;
    for (int i = 0; i < n_items && items[i].gen; i++)
        m->gen_rows += segs[i].n;
    int frc = (m->q35 ? mr_qwen35_forward_segs : mr_qwen3_forward_segs)(m, segs, n_items, n, err);
    m->gen_rows = 0;
    if (frc)
        return -1;
    /* a step with sampled rows picks its greedy ones in the same launch */
    if (any_sample)
        m->be->sample(m->be, m->sc.logits, out_row, m->hp.n_vocab, m->samp_rows, m->samp_add, m->sc.ids);
    else if (any_argmax && out_row > 0)
        m->be->argmax(m->be, m->sc.logits, out_row, m->hp.n_vocab, m->sc.ids);
    if (m->be->sync(m->be, err))
        return mr_err_wrap(err, "forward");
    if (download_outputs(m, items, segs, n_items, err))
        return -1;
    for (int i = 0; i < n_items; i++) {
        mr_seq *s = items[i].seq;
        s->len += items[i].n;
        /* the state at a block boundary, for the prefix cache (queued after
         * this call's work, before the next call's) */
        mr_seq_state_settled(s);
    }
    return 0;
}

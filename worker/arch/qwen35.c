/* Qwen3.5 / Qwen3.6 hybrids (GGUF arch qwen35, qwen35moe): loading and the
 * forward pass, written against kernels/ops.h only.
 *
 * Per trunk layer (n1 = rmsnorm(x), n2 = rmsnorm(h)):
 *   h = x + mixer(n1)       x = h + ffn(n2)
 * The mixer is full attention on every full_attn_interval-th layer and a
 * Gated DeltaNet on the others:
 *   full:   [q | gate] per head = Wq n1, k = Wk n1, v = Wv n1;
 *           q, k: per-head RMSNorm, RoPE on the first n_rot dims (M-RoPE
 *           with text positions: every section sees the same position, so
 *           it is plain NeoX RoPE); out = Wo (attn(q, k, v) * sigmoid(gate))
 *   linear: qkv = conv_silu(Wqkv n1) (short causal conv, state carried),
 *           o = gated delta rule over (q, k, v, alpha = Wa n1, beta = Wb n1)
 *           out = Wout (rmsnorm(o per head) * silu(Wz n1))
 * ffn: SwiGLU (qwen35) or softmax top-k experts + sigmoid-gated shared
 * expert (qwen35moe).
 *
 * The GGUF already holds the converter's transformations: norm weights with
 * the +1 of the zero-centred RMSNorm folded in (not ssm_norm), ssm_a =
 * -exp(A_log), value heads in tiled order (value head h uses key head
 * h % n_k_heads).  The nextn (MTP) blocks after the trunk are not run here.
 *
 * Recurrent state of a sequence (s->rstate, m->rstate_bytes), per linear
 * layer: conv history [d_conv-1][conv_dim] then delta-rule state
 * [n_v_heads][dk][dv], all float32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/model_internal.h"

typedef struct mr_q35_layer {
    bool recurrent;
    int kv_layer;             /* full attention: its layer in the paged KV cache */
    size_t conv_off, ssm_off; /* float offsets of this layer's state in s->rstate */
    mr_weight wqkv, wz, walpha, wbeta, wout;
    float *conv_w;            /* [conv_dim][d_conv] */
    float *ssm_a, *dt_bias;   /* [n_v_heads] */
    float *ssm_norm;          /* [dv] */
    mr_weight sh_gate, sh_up, sh_down, sh_gate_inp; /* shared expert (qwen35moe) */
} mr_q35_layer;

struct mr_q35 {
    mr_q35_layer *layers;
    int conv_dim, dk, dv;
    /* MTP (nextn) block: a full-attention layer fed by eh_proj([enorm(embed) | hnorm(h)]),
     * with its own one-layer KV cache addressed by the sequence's block table */
    bool has_mtp;
    mr_layer mtp;
    mr_q35_layer mtp_q;
    mr_weight eh_proj;
    float *enorm, *hnorm, *head_norm;
    mr_kv_cache mtp_kv;
    /* activations beyond the common scratch, for up to cap tokens */
    int cap;
    void *block;
    float *qf;       /* [n][n_heads][2 * head_dim]: query | gate */
    float *qkv;      /* [n][conv_dim] projection, then */
    float *conv;     /* [n][conv_dim] convolved */
    float *z;        /* [n][d_inner] */
    float *alpha, *beta; /* [n][n_v_heads] */
    float *o;        /* [n][d_inner] */
    float *sh_gate, *sh_up; /* [n][n_ff_shexp] */
    float *sh_g;     /* [n] */
    float *sh_out;   /* [n][n_embd] */
    float *mtp_h;    /* [n][n_embd]: hidden rows fed to the MTP block */
    float *mtp_cat;  /* [n][2 * n_embd] */
    /* [n][n_embd]: output-normed prompt rows of the last forward call kept
     * for the MTP block (mr_qwen35_mtp_keep); no MTP call writes here */
    float *mtp_kept;
    /* the recurrent layers' inputs of an armed forward call, for
     * mr_qwen35_rec_replay: layer il's part at il * rec_stride holds
     * rec_rows rows of its pre-convolution projection, then as many of
     * alpha and of beta */
    float *rec;
    int rec_rows;      /* rows a part holds (0: nothing allocated) */
    size_t rec_stride; /* floats a part */
    bool rec_armed;    /* the next forward call keeps its rows */
    int rec_n;         /* rows the last forward call kept (0: none) */
};

/* ---- metadata ---- */

int mr_qwen35_read_hparams(const mr_gguf *g, const char *arch, mr_hparams *hp, mr_err *err)
{
    if (mr_model_key_u32(g, arch, "nextn_predict_layers", &hp->n_nextn, false, 0, err) ||
        mr_model_key_u32(g, arch, "full_attention_interval", &hp->full_attn_interval, false, 4, err) ||
        mr_model_key_u32(g, arch, "ssm.conv_kernel", &hp->ssm_d_conv, true, 0, err) ||
        mr_model_key_u32(g, arch, "ssm.state_size", &hp->ssm_d_state, true, 0, err) ||
        mr_model_key_u32(g, arch, "ssm.group_count", &hp->ssm_n_group, true, 0, err) ||
        mr_model_key_u32(g, arch, "ssm.time_step_rank", &hp->ssm_dt_rank, true, 0, err) ||
        mr_model_key_u32(g, arch, "ssm.inner_size", &hp->ssm_d_inner, true, 0, err) ||
        mr_model_key_u32(g, arch, "expert_shared_feed_forward_length", &hp->n_ff_shexp, false, hp->n_ff, err))
        return -1;
    if (hp->n_nextn >= hp->n_layers)
        return mr_errf(err, "%s: nextn_predict_layers %d leaves no trunk of block_count %d", arch,
                       hp->n_nextn, hp->n_layers);
    hp->n_layers -= hp->n_nextn;
    if (hp->full_attn_interval <= 0 || hp->ssm_d_conv <= 0 || hp->ssm_d_conv > 64 ||
        hp->ssm_d_state <= 0 || hp->ssm_n_group <= 0 || hp->ssm_dt_rank <= 0 ||
        hp->ssm_dt_rank % hp->ssm_n_group || hp->ssm_d_inner % hp->ssm_dt_rank ||
        hp->ssm_d_inner <= 0)
        return mr_errf(err, "%s: unsupported linear-attention shape (interval %d, conv %d, state %d, "
                       "groups %d, value heads %d, inner %d): need value heads a multiple of groups "
                       "and inner a multiple of value heads", arch, hp->full_attn_interval,
                       hp->ssm_d_conv, hp->ssm_d_state, hp->ssm_n_group, hp->ssm_dt_rank,
                       hp->ssm_d_inner);
    /* sizes that the tensors will be checked against must not overflow first */
    int64_t key_dim = (int64_t)hp->ssm_n_group * hp->ssm_d_state;
    int64_t state = (int64_t)hp->ssm_d_inner * hp->ssm_d_state;
    if (key_dim > (1 << 24) || hp->ssm_d_inner > (1 << 24) || state > ((int64_t)1 << 32))
        return mr_errf(err, "%s: linear-attention sizes (groups %d x state %d, inner %d) are too large",
                       arch, hp->ssm_n_group, hp->ssm_d_state, hp->ssm_d_inner);
    /* only the full-attention layers keep K/V in the paged cache */
    hp->n_kv_layers = hp->n_layers / hp->full_attn_interval;
    if (hp->n_kv_layers == 0)
        return mr_errf(err, "%s: %d layers with full_attention_interval %d have no attention layer", arch,
                       hp->n_layers, hp->full_attn_interval);
    if (hp->arch == MR_ARCH_QWEN35MOE && hp->n_ff_shexp <= 0)
        return mr_errf(err, "%s: expert_shared_feed_forward_length is missing or zero", arch);
    /* M-RoPE sections: kept for reference; text-only positions make them moot */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    if (mr_gguf_find(g, key)) {
        const mr_gguf_kv *kv;
        if (mr_gguf_get_arr(g, key, MR_GGUF_VTYPE_COUNT, &kv, err))
            return -1;
        if (kv->v.arr.type == MR_GGUF_STRING || kv->v.arr.type == MR_GGUF_FLOAT32 ||
            kv->v.arr.type == MR_GGUF_FLOAT64 || kv->v.arr.n > 4)
            return mr_errf(err, "%s: '%s' must be up to 4 integers", arch, key);
        for (uint64_t i = 0; i < kv->v.arr.n; i++) {
            int64_t v = mr_gguf_arr_i64(kv, i);
            if (v < 0 || v > (1 << 20))
                return mr_errf(err, "%s: '%s'[%llu] = %lld is out of range", arch, key,
                               (unsigned long long)i, (long long)v);
            hp->rope_sections[i] = (int)v;
        }
    }
    return 0;
}

/* ---- weights ---- */

static bool is_recurrent(const mr_hparams *hp, int il) { return (il + 1) % hp->full_attn_interval != 0; }

#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)

/* Gated full attention: the query projection holds [q | gate] per head. */
static int load_attention(mr_model *m, int il, mr_layer *L, mr_err *err)
{
    const mr_hparams *hp = &m->hp;
    int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    int64_t E = hp->n_embd;
    char nm[96];
    return mr_model_load_matrix(m, &L->wq, NAME("attn_q.weight"), E, 2 * qd, 1, err) ||
           mr_model_load_matrix(m, &L->wk, NAME("attn_k.weight"), E, kvd, 1, err) ||
           mr_model_load_matrix(m, &L->wv, NAME("attn_v.weight"), E, kvd, 1, err) ||
           mr_model_load_matrix(m, &L->wo, NAME("attn_output.weight"), qd, E, 1, err) ||
           mr_model_load_floats(m, &L->q_norm, NAME("attn_q_norm.weight"), hp->head_dim, 1, err) ||
           mr_model_load_floats(m, &L->k_norm, NAME("attn_k_norm.weight"), hp->head_dim, 1, err)
               ? -1 : 0;
}

static int load_ffn(mr_model *m, int il, mr_layer *L, mr_q35_layer *Q, mr_err *err)
{
    const mr_hparams *hp = &m->hp;
    int64_t E = hp->n_embd;
    char nm[96];
    if (hp->arch == MR_ARCH_QWEN35)
        return mr_model_load_matrix(m, &L->ffn_gate, NAME("ffn_gate.weight"), E, hp->n_ff, 1, err) ||
               mr_model_load_matrix(m, &L->ffn_up, NAME("ffn_up.weight"), E, hp->n_ff, 1, err) ||
               mr_model_load_matrix(m, &L->ffn_down, NAME("ffn_down.weight"), hp->n_ff, E, 1, err)
                   ? -1 : 0;
    int64_t ne = hp->n_expert, fe = hp->n_ff_exp, fs = hp->n_ff_shexp;
    return mr_model_load_matrix(m, &L->ffn_gate_inp, NAME("ffn_gate_inp.weight"), E, ne, 1, err) ||
           mr_model_load_matrix(m, &L->ffn_gate_exps, NAME("ffn_gate_exps.weight"), E, fe, ne, err) ||
           mr_model_load_matrix(m, &L->ffn_up_exps, NAME("ffn_up_exps.weight"), E, fe, ne, err) ||
           mr_model_load_matrix(m, &L->ffn_down_exps, NAME("ffn_down_exps.weight"), fe, E, ne, err) ||
           mr_model_load_matrix(m, &Q->sh_gate_inp, NAME("ffn_gate_inp_shexp.weight"), E, 1, 1, err) ||
           mr_model_load_matrix(m, &Q->sh_gate, NAME("ffn_gate_shexp.weight"), E, fs, 1, err) ||
           mr_model_load_matrix(m, &Q->sh_up, NAME("ffn_up_shexp.weight"), E, fs, 1, err) ||
           mr_model_load_matrix(m, &Q->sh_down, NAME("ffn_down_shexp.weight"), fs, E, 1, err)
               ? -1 : 0;
}

#undef NAME

int mr_qwen35_load_layers(mr_model *m, mr_err *err)
{
    /* the recurrent layers carry rounding from token to token: float32-grade
     * products (float16 prompt GEMMs everywhere put the fixtures' worst rows
     * at 5.6e-3 / 1.3e-2 against transformers, over the 5e-3 bound; the
     * CUDA backend keeps the expert products float16, cu_gemm.cu says why) */
    if (m->be->prefer_float32)
        m->be->prefer_float32(m->be);
    const mr_hparams *hp = &m->hp;
    mr_backend *be = m->be;
    if (!be->copy_2d || !be->sigmoid_mul || !be->conv1d_silu || !be->gdn_scan)
        return mr_errf(err, "backend '%s' has no Gated DeltaNet ops: cannot run %s", be->name, hp->arch_name);
    struct mr_q35 *q = calloc(1, sizeof *q);
    if (!q)
        return mr_errf(err, "out of memory");
    m->q35 = q;
    q->layers = calloc((size_t)hp->n_layers, sizeof *q->layers);
    if (!q->layers)
        return mr_errf(err, "out of memory");
    q->dk = hp->ssm_d_state;
    q->dv = hp->ssm_d_inner / hp->ssm_dt_rank;
    int64_t key_dim = (int64_t)hp->ssm_n_group * q->dk;
    q->conv_dim = (int)(2 * key_dim + hp->ssm_d_inner);
    int64_t E = hp->n_embd, nv = hp->ssm_dt_rank;
    size_t conv_floats = (size_t)(hp->ssm_d_conv - 1) * (size_t)q->conv_dim;
    size_t ssm_floats = (size_t)nv * (size_t)q->dk * (size_t)q->dv;
    size_t state = 0; /* floats */

    char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", il, suffix), nm)
    for (int il = 0; il < hp->n_layers; il++) {
        mr_layer *L = &m->layers[il];
        mr_q35_layer *Q = &q->layers[il];
        Q->recurrent = is_recurrent(hp, il);
        Q->kv_layer = Q->recurrent ? -1 : (il + 1) / hp->full_attn_interval - 1;
        if (mr_model_load_floats(m, &L->attn_norm, NAME("attn_norm.weight"), E, 1, err) ||
            mr_model_load_floats(m, &L->ffn_norm, NAME("post_attention_norm.weight"), E, 1, err))
            return -1;
        if (Q->recurrent) {
            Q->conv_off = state;
            Q->ssm_off = state + conv_floats;
            state += conv_floats + ssm_floats;
            if (mr_model_load_matrix(m, &Q->wqkv, NAME("attn_qkv.weight"), E, q->conv_dim, 1, err) ||
                mr_model_load_matrix(m, &Q->wz, NAME("attn_gate.weight"), E, hp->ssm_d_inner, 1, err) ||
                mr_model_load_matrix(m, &Q->walpha, NAME("ssm_alpha.weight"), E, nv, 1, err) ||
                mr_model_load_matrix(m, &Q->wbeta, NAME("ssm_beta.weight"), E, nv, 1, err) ||
                mr_model_load_matrix(m, &Q->wout, NAME("ssm_out.weight"), hp->ssm_d_inner, E, 1, err) ||
                mr_model_load_floats(m, &Q->conv_w, NAME("ssm_conv1d.weight"), hp->ssm_d_conv, q->conv_dim,
                                     err) ||
                mr_model_load_floats(m, &Q->ssm_a, NAME("ssm_a"), nv, 1, err) ||
                mr_model_load_floats(m, &Q->dt_bias, NAME("ssm_dt.bias"), nv, 1, err) ||
                mr_model_load_floats(m, &Q->ssm_norm, NAME("ssm_norm.weight"), q->dv, 1, err))
                return -1;
        } else if (load_attention(m, il, L, err)) {
            return -1;
        }
        if (load_ffn(m, il, L, Q, err))
            return -1;
    }
    int il = hp->n_layers;
    if (hp->n_nextn > 0 && mr_gguf_find_tensor(m->gguf, NAME("nextn.eh_proj.weight"))) {
        /* the first nextn block (upstream runs one); the others are not used.
         * A file converted without the block's tensors simply has no drafts. */
        mr_layer *L = &q->mtp;
        q->has_mtp = true;
        if (mr_model_load_floats(m, &L->attn_norm, NAME("attn_norm.weight"), E, 1, err) ||
            mr_model_load_floats(m, &L->ffn_norm, NAME("post_attention_norm.weight"), E, 1, err) ||
            load_attention(m, il, L, err) || load_ffn(m, il, L, &q->mtp_q, err) ||
            mr_model_load_matrix(m, &q->eh_proj, NAME("nextn.eh_proj.weight"), 2 * E, E, 1, err) ||
            mr_model_load_floats(m, &q->enorm, NAME("nextn.enorm.weight"), E, 1, err) ||
            mr_model_load_floats(m, &q->hnorm, NAME("nextn.hnorm.weight"), E, 1, err))
            return -1;
        /* its own head norm when the file has one, else the trunk's */
        if (mr_gguf_find_tensor(m->gguf, NAME("nextn.shared_head_norm.weight"))) {
            if (mr_model_load_floats(m, &q->head_norm, nm, E, 1, err))
                return -1;
        }
        if (mr_gguf_find_tensor(m->gguf, NAME("nextn.embed_tokens.weight")) ||
            mr_gguf_find_tensor(m->gguf, NAME("nextn.shared_head_head.weight")))
            return mr_errf(err, "%s: MTP block with its own embedding or head is not supported", hp->arch_name);
    }
#undef NAME
    m->rstate_bytes = state * sizeof(float);
    return 0;
}

static void free_scratch(mr_backend *be, struct mr_q35 *q)
{
    if (q->block)
        be->free(be, q->block);
    q->block = NULL;
    q->cap = 0;
}

static void free_q35_layer(mr_model *m, mr_q35_layer *Q)
{
    float *vecs[] = {Q->conv_w, Q->ssm_a, Q->dt_bias, Q->ssm_norm};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        mr_model_free_floats(m, vecs[i]);
    mr_weight *ws[] = {&Q->wqkv, &Q->wz, &Q->walpha, &Q->wbeta, &Q->wout,
                       &Q->sh_gate, &Q->sh_up, &Q->sh_down, &Q->sh_gate_inp};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        mr_model_release_weight(m, ws[i]);
}

void mr_qwen35_free(mr_model *m)
{
    struct mr_q35 *q = m->q35;
    if (!q)
        return;
    mr_backend *be = m->be;
    free_scratch(be, q);
    if (q->rec)
        be->free(be, q->rec);
    if (q->layers) {
        for (int il = 0; il < m->hp.n_layers; il++)
            free_q35_layer(m, &q->layers[il]);
        free(q->layers);
    }
    /* the MTP block (the trunk's mr_layer array is released by model.c) */
    mr_model_release_layer(m, &q->mtp);
    free_q35_layer(m, &q->mtp_q);
    float *vecs[] = {q->enorm, q->hnorm, q->head_norm};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        mr_model_free_floats(m, vecs[i]);
    mr_model_release_weight(m, &q->eh_proj);
    if (q->mtp_kv.k || q->mtp_kv.v)
        be->kv_destroy(be, &q->mtp_kv);
    free(q);
    m->q35 = NULL;
}

/* ---- forward ---- */

static int scratch_reserve(mr_model *m, int cap, mr_err *err)
{
    struct mr_q35 *q = m->q35;
    if (cap <= q->cap)
        return 0;
    free_scratch(m->be, q);
    const mr_hparams *hp = &m->hp;
    size_t n = (size_t)cap;
    size_t fs = (size_t)(hp->n_ff_shexp > 0 ? hp->n_ff_shexp : 1);
    mr_carve parts[] = {
        {(void **)&q->qf, n * 2 * (size_t)hp->n_heads * (size_t)hp->head_dim},
        {(void **)&q->qkv, n * (size_t)q->conv_dim},
        {(void **)&q->conv, n * (size_t)q->conv_dim},
        {(void **)&q->z, n * (size_t)hp->ssm_d_inner},
        {(void **)&q->alpha, n * (size_t)hp->ssm_dt_rank},
        {(void **)&q->beta, n * (size_t)hp->ssm_dt_rank},
        {(void **)&q->o, n * (size_t)hp->ssm_d_inner},
        {(void **)&q->sh_gate, n * fs},
        {(void **)&q->sh_up, n * fs},
        {(void **)&q->sh_g, n},
        {(void **)&q->sh_out, n * (size_t)hp->n_embd},
        {(void **)&q->mtp_h, n * (size_t)hp->n_embd},
        {(void **)&q->mtp_cat, n * 2 * (size_t)hp->n_embd},
        {(void **)&q->mtp_kept, n * (size_t)hp->n_embd},
    };
    void *base = mr_model_carve(m, parts, sizeof parts / sizeof parts[0], cap, err);
    if (!base)
        return -1;
    q->block = base;
    q->cap = cap;
    return 0;
}

/* Forward segments are the scheduler's mr_fwd_seg (worker/model_internal.h):
 * row-wise ops run over all rows at once, the K/V and recurrent-state ops
 * per segment. */

static void full_attention(mr_model *m, const mr_layer *L, mr_kv_cache *kv, int kv_layer,
                           const mr_fwd_seg *segs, int n_segs, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;
    struct mr_q35 *q = m->q35;
    int hd = hp->head_dim, rows = n * hp->n_heads;

    /* the three products back to back (one launch where the backend shares
     * them), then the query halves of the [q | gate] rows */
    const mr_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_out[3] = {q->qf, sc->k, sc->v};
    mr_fwd_matmuls(m, qkv, qkv_out, 3, sc->xn, n);
    be->copy_2d(be, sc->q, hd, q->qf, 2 * hd, rows, hd);
    mr_qwen3_attend(m, L, kv, kv_layer, segs, n_segs, n);
    /* output gate: the second half of each head's [q | gate] row */
    be->sigmoid_mul(be, sc->att, q->qf + hd, rows, hd, 2 * hd, false);
    mr_fwd_matmul(m, &L->wo, sc->att, sc->proj, n);
}

/* Layer Q's convolution and delta-rule scan over n rows of one sequence:
 * qkv [n][conv_dim] projected rows, alpha/beta [n][n_v_heads]; the
 * sequence's state moves on by n tokens, conv [n][conv_dim] and
 * o [n][d_inner] get the outputs. */
static void recurrent_rows(mr_model *m, const mr_q35_layer *Q, mr_seq *s, const float *qkv, const float *alpha,
                           const float *beta, int n, float *conv, float *o)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    struct mr_q35 *q = m->q35;
    float *conv_state = (float *)s->rstate + Q->conv_off;
    float *ssm_state = (float *)s->rstate + Q->ssm_off;
    be->conv1d_silu(be, qkv, Q->conv_w, conv_state, n, q->conv_dim, hp->ssm_d_conv, conv);
    /* l2norm eps as transformers' l2norm (1e-6) */
    be->gdn_scan(be, conv, q->conv_dim, alpha, beta, Q->ssm_a, Q->dt_bias, ssm_state, n, hp->ssm_n_group,
                 hp->ssm_dt_rank, q->dk, q->dv, 1e-6f, o);
}

static void linear_attention(mr_model *m, int il, const mr_fwd_seg *segs, int n_segs, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;
    struct mr_q35 *q = m->q35;
    const mr_q35_layer *Q = &q->layers[il];

    size_t cd = (size_t)q->conv_dim, nv = (size_t)hp->ssm_dt_rank, di = (size_t)hp->ssm_d_inner;
    /* the recurrent inputs go to scratch, or, in an armed call
     * (mr_qwen35_forward_segs checked its shape), straight to the layer's
     * part of the replay buffer, which mr_qwen35_rec_replay reads */
    float *qkv = q->qkv, *alpha = q->alpha, *beta = q->beta;
    if (q->rec_n) {
        float *part = q->rec + (size_t)il * q->rec_stride;
        size_t rr = (size_t)q->rec_rows;
        qkv = part;
        alpha = part + rr * cd;
        beta = part + rr * (cd + nv);
    }
    mr_fwd_matmul(m, &Q->wqkv, sc->xn, qkv, n);
    mr_fwd_matmul(m, &Q->wz, sc->xn, q->z, n);
    mr_fwd_matmul(m, &Q->walpha, sc->xn, alpha, n);
    mr_fwd_matmul(m, &Q->wbeta, sc->xn, beta, n);
    for (int i = 0; i < n_segs; i++) {
        const mr_fwd_seg *g = &segs[i];
        size_t r = (size_t)g->start;
        recurrent_rows(m, Q, g->s, qkv + r * cd, alpha + r * nv, beta + r * nv, g->n, q->conv + r * cd,
                       q->o + r * di);
    }
    /* gated RMSNorm per value head: rmsnorm(o) * w * silu(z) */
    be->rmsnorm(be, q->o, Q->ssm_norm, q->o, n * hp->ssm_dt_rank, q->dv, hp->rms_eps);
    be->swiglu(be, q->z, q->o, q->o, (size_t)n * (size_t)hp->ssm_d_inner);
    mr_fwd_matmul(m, &Q->wout, q->o, sc->proj, n);
}

/* routed experts as qwen3moe, plus a shared expert scaled by sigmoid of
 * its one-logit gate.  The order lets a backend join ops (the values are
 * those of any order: every op reads xn or its own outputs): the shared
 * expert first, its gate's logit straight after the router's (one input,
 * one type), and the routed experts' combine, the gate's sigmoid and the
 * adds back to back with the next norm (the CUDA recorder's tail rule). */
static void moe_ffn(mr_model *m, const mr_layer *L, const mr_q35_layer *Q, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    struct mr_q35 *q = m->q35;
    mr_scratch *sc = &m->sc;

    const mr_weight *gu[2] = {&Q->sh_gate, &Q->sh_up};
    float *const gu_out[2] = {q->sh_gate, q->sh_up};
    mr_fwd_matmuls(m, gu, gu_out, 2, sc->xn, n);
    be->swiglu(be, q->sh_gate, q->sh_up, q->sh_gate, (size_t)n * (size_t)hp->n_ff_shexp);
    mr_fwd_matmul(m, &Q->sh_down, q->sh_gate, q->sh_out, n);
    mr_qwen3_moe_router(m, L, n);
    mr_fwd_matmul(m, &Q->sh_gate_inp, sc->xn, q->sh_g, n);
    mr_qwen3_moe_experts(m, L, n);
    be->sigmoid_mul(be, q->sh_out, q->sh_g, n, hp->n_embd, 1, true);
    be->add(be, sc->proj, q->sh_out, (size_t)n * (size_t)hp->n_embd);
}

/* x += ffn(rmsnorm(x)) */
static void ffn_block(mr_model *m, const mr_layer *L, const mr_q35_layer *Q, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;
    be->rmsnorm(be, sc->x, L->ffn_norm, sc->xn, n, hp->n_embd, hp->rms_eps);
    if (hp->arch == MR_ARCH_QWEN35MOE)
        moe_ffn(m, L, Q, n);
    else
        mr_qwen3_dense_ffn(m, L, n);
    be->add(be, sc->x, sc->proj, (size_t)n * (size_t)hp->n_embd);
}

int mr_qwen35_forward_segs(mr_model *m, const mr_fwd_seg *segs, int n_segs, int n, mr_err *err)
{
    if (scratch_reserve(m, n, err))
        return -1;
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;

    /* an armed call of one sequence keeps its recurrent inputs; any other
     * call leaves none to replay */
    struct mr_q35 *q = m->q35;
    q->rec_n = q->rec_armed && n_segs == 1 && n <= q->rec_rows ? n : 0;
    q->rec_armed = false;
    be->get_rows(be, &m->tok_embd, sc->tokens, n, sc->x);
    for (int il = 0; il < hp->n_layers; il++) {
        const mr_layer *L = &m->layers[il];
        be->rmsnorm(be, sc->x, L->attn_norm, sc->xn, n, hp->n_embd, hp->rms_eps);
        if (m->q35->layers[il].recurrent)
            linear_attention(m, il, segs, n_segs, n);
        else
            full_attention(m, L, &m->kv, m->q35->layers[il].kv_layer, segs, n_segs, n);
        be->add(be, sc->x, sc->proj, (size_t)n * (size_t)hp->n_embd);
        ffn_block(m, L, &m->q35->layers[il], n);
    }
    /* rows with logits: output-normed into xn rows out_row.. (where the
     * MTP block finds its hidden input), then through the output head */
    mr_qwen3_output_head(m, segs, n_segs);
    return 0;
}

/* ---- MTP draft head ---- */

bool mr_qwen35_has_mtp(const mr_model *m) { return m->q35 && m->q35->has_mtp; }

const float *mr_qwen35_mtp_hidden(const mr_model *m) { return m->q35->mtp_h; }

/* The block over n rows: hidden rows h with tokens at positions
 * pos0.., its K/V into the block's cache; the argmax of the last row's
 * logits (found by the backend: one id comes back, not a row of the
 * vocabulary) to *next.  gen: generated rows (the draft chain, the rows
 * after a verify) take the decode numerics, prompt rows the prompt
 * numerics. */
static int mtp_block(mr_model *m, mr_seq *s, const float *h, const int32_t *tokens, int n, int pos0, bool gen,
                     int32_t *next, mr_err *err)
{
    struct mr_q35 *q = m->q35;
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;
    if (!q || !q->has_mtp)
        return mr_errf(err, "%s: the model has no MTP block", hp->arch_name);
    /* within the last forward call's activations: the block's own buffers
     * (and the rows kept there) are not reallocated under it */
    if (n <= 0 || n > sc->cap || sc->out_cap < 1 || pos0 < 0 || pos0 + n > m->n_ctx)
        return mr_errf(err, "mtp: %d rows at position %d (activations for %d, logits rows %d, context %d)", n,
                       pos0, sc->cap, sc->out_cap, m->n_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return mr_errf(err, "mtp: token id %d is out of range [0, %d)", tokens[t], hp->n_vocab);
    if (!q->mtp_kv.k) {
        q->mtp_kv = m->kv; /* same blocks and shape, one layer */
        q->mtp_kv.n_layers = 1;
        q->mtp_kv.k = q->mtp_kv.v = NULL;
        if (be->kv_create(be, &q->mtp_kv, err)) {
            memset(&q->mtp_kv, 0, sizeof q->mtp_kv);
            return mr_err_wrap(err, "creating the MTP KV cache");
        }
    }
    if (mr_seq_grow(s, pos0 + n, err) || scratch_reserve(m, n, err))
        return -1;
    int32_t *stage = mr_model_stage(m, n, err);
    if (!stage)
        return -1;
    memcpy(stage, tokens, sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++)
        stage[n + t] = pos0 + t;
    if (mr_model_stage_upload(m, n, 0, err))
        return -1;

    int E = hp->n_embd;
    /* the products of generated rows take the decode kernels, the rest the
     * prompt ones (a prompt row's result then does not depend on how the
     * prompt was cut into calls) */
    m->gen_rows = gen ? n : 0;
    /* h may live in sc.xn, which the block overwrites: take it first */
    if (h != q->mtp_h)
        be->copy_2d(be, q->mtp_h, E, h, E, n, E);
    be->get_rows(be, &m->tok_embd, sc->tokens, n, sc->x);
    /* [enorm(embedding) | hnorm(h)] per row */
    be->rmsnorm(be, sc->x, q->enorm, sc->xn, n, E, hp->rms_eps);
    be->copy_2d(be, q->mtp_cat, 2 * E, sc->xn, E, n, E);
    be->rmsnorm(be, q->mtp_h, q->hnorm, sc->xn, n, E, hp->rms_eps);
    be->copy_2d(be, q->mtp_cat + E, 2 * E, sc->xn, E, n, E);
    mr_fwd_matmul(m, &q->eh_proj, q->mtp_cat, sc->x, n);

    be->rmsnorm(be, sc->x, q->mtp.attn_norm, sc->xn, n, E, hp->rms_eps);
    mr_fwd_seg seg = {.s = s, .start = 0, .n = n, .pos0 = pos0, .out_first = 0, .out_row = 0, .gen = gen};
    full_attention(m, &q->mtp, &q->mtp_kv, 0, &seg, 1, n);
    be->add(be, sc->x, sc->proj, (size_t)n * (size_t)E);
    ffn_block(m, &q->mtp, &q->mtp_q, n);
    be->rmsnorm(be, sc->x, q->head_norm ? q->head_norm : m->output_norm, q->mtp_h, n, E, hp->rms_eps);
    mr_fwd_matmul_out(m, &m->output, q->mtp_h + (size_t)(n - 1) * (size_t)E, sc->logits, 1); /* last row only */
    m->gen_rows = 0;
    be->argmax(be, sc->logits, 1, hp->n_vocab, sc->ids);
    if (be->sync(be, err))
        return mr_err_wrap(err, "mtp");
    return be->download(be, next, sc->ids, sizeof(int32_t), err);
}

int mr_qwen35_mtp(mr_model *m, mr_seq *s, const float *h, const int32_t *tokens, int n, int pos0,
                  int32_t *next, mr_err *err)
{
    /* the rows over a prompt (from position 0) are prompt work, the draft
     * chain and the rows after a verify generated ones */
    return mtp_block(m, s, h, tokens, n, pos0, pos0 > 0, next, err);
}

int mr_qwen35_mtp_keep(mr_model *m, int row0, int n, mr_err *err)
{
    struct mr_q35 *q = m->q35;
    const mr_hparams *hp = &m->hp;
    if (!q || !q->has_mtp)
        return mr_errf(err, "%s: the model has no MTP block", hp->arch_name);
    if (row0 < 0 || n <= 0 || row0 + n > q->cap || row0 + n > m->sc.cap)
        return mr_errf(err, "mtp: keeping rows %d..%d of a forward call (activations for %d)", row0, row0 + n - 1,
                       q->cap < m->sc.cap ? q->cap : m->sc.cap);
    /* the normalisation output_head gives a row with logits: the same
     * hidden row a call with every row's logits leaves in sc.xn */
    size_t E = (size_t)hp->n_embd;
    m->be->rmsnorm(m->be, m->sc.x + (size_t)row0 * E, m->output_norm, q->mtp_kept + (size_t)row0 * E, n,
                   hp->n_embd, hp->rms_eps);
    return 0;
}

int mr_qwen35_mtp_prompt(mr_model *m, mr_seq *s, int row0, const int32_t *tokens, int n, int pos0,
                         int32_t *next, mr_err *err)
{
    struct mr_q35 *q = m->q35;
    if (!q || !q->has_mtp)
        return mr_errf(err, "%s: the model has no MTP block", m->hp.arch_name);
    if (row0 < 0 || n <= 0 || row0 + n > q->cap)
        return mr_errf(err, "mtp: kept rows %d..%d (activations for %d)", row0, row0 + n - 1, q->cap);
    return mtp_block(m, s, q->mtp_kept + (size_t)row0 * (size_t)m->hp.n_embd, tokens, n, pos0, false, next, err);
}

int mr_qwen35_rec_arm(mr_model *m, int rows, mr_err *err)
{
    struct mr_q35 *q = m->q35;
    if (!q)
        return mr_errf(err, "%s: no recurrent layers", m->hp.arch_name);
    if (rows < 1)
        return mr_errf(err, "recurrent replay: %d rows", rows);
    if (rows > q->rec_rows) {
        const mr_hparams *hp = &m->hp;
        size_t stride = (size_t)rows * ((size_t)q->conv_dim + 2 * (size_t)hp->ssm_dt_rank);
        float *p = m->be->alloc(m->be, sizeof(float) * stride * (size_t)hp->n_layers);
        if (!p)
            return mr_errf(err, "recurrent replay: no backend memory for %d rows of %d layers", rows, hp->n_layers);
        if (q->rec)
            m->be->free(m->be, q->rec);
        q->rec = p;
        q->rec_rows = rows;
        q->rec_stride = stride;
    }
    q->rec_armed = true;
    q->rec_n = 0;
    return 0;
}

int mr_qwen35_rec_replay(mr_model *m, mr_seq *s, int n, mr_err *err)
{
    struct mr_q35 *q = m->q35;
    if (!q || n < 1 || n > q->rec_n)
        return mr_errf(err, "recurrent replay: %d rows, the last call kept %d", n, q ? q->rec_n : 0);
    size_t cd = (size_t)q->conv_dim, nv = (size_t)m->hp.ssm_dt_rank, rr = (size_t)q->rec_rows;
    for (int il = 0; il < m->hp.n_layers; il++) {
        const mr_q35_layer *Q = &q->layers[il];
        if (!Q->recurrent)
            continue;
        const float *part = q->rec + (size_t)il * q->rec_stride;
        /* linear_attention's step on the same rows, so the state after it
         * is the one the call had after its first n rows (the outputs land
         * in scratch nobody reads) */
        recurrent_rows(m, Q, s, part, part + rr * cd, part + rr * (cd + nv), n, q->conv, q->o);
    }
    q->rec_n = 0; /* the rows are used up: the state moved on */
    return 0;
}

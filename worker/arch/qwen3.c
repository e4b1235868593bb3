/* Forward pass of Qwen3 (dense) and Qwen3-MoE, written against kernels/ops.h
 * only, so it runs unchanged on every backend.
 *
 * Per layer:  h = x + Wo·attn(rope(qnorm(Wq·n1)), rope(knorm(Wk·n1)), Wv·n1)
 *             x = h + ffn(rmsnorm(h))      n1 = rmsnorm(x)
 * ffn is a SwiGLU MLP (dense) or a softmax-top-k mixture of SwiGLU experts. */
#include <math.h>

#include "worker/model_internal.h"

void mr_qwen3_attend(mr_model *m, const mr_layer *L, mr_kv_cache *kv, int kv_layer, const mr_fwd_seg *segs,
                     int n_segs, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;

    /* Qwen3 normalises every query and key head before RoPE (one call where
     * the backend fuses the four). */
    if (be->qk_norm_rope) {
        be->qk_norm_rope(be, sc->q, sc->k, L->q_norm, L->k_norm, sc->pos, n, hp->n_heads, hp->n_kv_heads,
                         hp->head_dim, hp->n_rot, hp->rope_theta, MR_ROPE_NEOX, hp->rms_eps);
    } else {
        be->rmsnorm(be, sc->q, L->q_norm, sc->q, n * hp->n_heads, hp->head_dim, hp->rms_eps);
        be->rmsnorm(be, sc->k, L->k_norm, sc->k, n * hp->n_kv_heads, hp->head_dim, hp->rms_eps);
        be->rope(be, sc->q, sc->pos, n, hp->n_heads, hp->head_dim, hp->n_rot, hp->rope_theta, MR_ROPE_NEOX);
        be->rope(be, sc->k, sc->pos, n, hp->n_kv_heads, hp->head_dim, hp->n_rot, hp->rope_theta, MR_ROPE_NEOX);
    }

    /* K/V stores and attention read each sequence's own blocks: the short
     * segments of a batch (decode steps) in one multi-sequence call when
     * the forward call staged their tables, the others one call each */
    size_t qd = (size_t)hp->n_heads * (size_t)hp->head_dim;
    size_t kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    bool multi = m->multi_segs == segs && m->multi_nsegs == n_segs;
    if (multi) {
        size_t r = (size_t)m->multi_r0;
        int nr = m->multi_r1 - m->multi_r0;
        be->kv_store_multi(be, kv, kv_layer, m->sc.tables, sc->k + r * kvd, sc->v + r * kvd, sc->pos + r, nr);
        be->attention_multi(be, kv, kv_layer, m->sc.tables, sc->q + r * qd, sc->pos + r, nr, hp->n_heads, scale,
                            sc->att + r * qd);
    }
    for (int i = 0; i < n_segs; i++) {
        const mr_fwd_seg *g = &segs[i];
        if (multi && mr_fwd_seg_multi(g))
            continue;
        size_t r = (size_t)g->start;
        be->kv_store(be, kv, kv_layer, g->s->blocks_dev, sc->k + r * kvd, sc->v + r * kvd, sc->pos + r, g->n);
        if (g->gen || !be->attention_prompt)
            be->attention(be, kv, kv_layer, g->s->blocks_dev, sc->q + r * qd, sc->pos + r, g->n, hp->n_heads,
                          scale, sc->att + r * qd);
        else
            be->attention_prompt(be, kv, kv_layer, g->s->blocks_dev, sc->q + r * qd, sc->pos + r, g->n,
                                 hp->n_heads, scale, sc->att + r * qd, g->pos0);
    }
}

static void attention_block(mr_model *m, const mr_fwd_seg *segs, int n_segs, int il, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    const mr_layer *L = &m->layers[il];
    mr_scratch *sc = &m->sc;

    be->rmsnorm(be, sc->x, L->attn_norm, sc->xn, n, hp->n_embd, hp->rms_eps);
    const mr_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_out[3] = {sc->q, sc->k, sc->v};
    mr_fwd_matmuls(m, qkv, qkv_out, 3, sc->xn, n);
    mr_qwen3_attend(m, L, &m->kv, il, segs, n_segs, n);
    mr_fwd_matmul(m, &L->wo, sc->att, sc->proj, n);
    be->add(be, sc->x, sc->proj, (size_t)n * (size_t)hp->n_embd);
}

void mr_qwen3_dense_ffn(mr_model *m, const mr_layer *L, int n)
{
    mr_backend *be = m->be;
    mr_scratch *sc = &m->sc;
    const mr_weight *gu[2] = {&L->ffn_gate, &L->ffn_up};
    float *const gu_out[2] = {sc->gate, sc->up};
    mr_fwd_matmuls(m, gu, gu_out, 2, sc->xn, n);
    be->swiglu(be, sc->gate, sc->up, sc->gate, (size_t)n * (size_t)m->hp.n_ff);
    mr_fwd_matmul(m, &L->ffn_down, sc->gate, sc->proj, n);
}

void mr_qwen3_moe_router(mr_model *m, const mr_layer *L, int n)
{
    mr_fwd_matmul(m, &L->ffn_gate_inp, m->sc.xn, m->sc.router, n);
    if (m->router_dump)
        mr_fwd_router_dump(m, n);
}

void mr_qwen3_moe_experts(mr_model *m, const mr_layer *L, int n)
{
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;
    int k = hp->n_expert_used;

    be->moe_route(be, sc->router, n, hp->n_expert, k, hp->norm_topk, sc->exp_ids, sc->exp_w);
    /* gate and up of every chosen expert read the same normalised token, its
     * down projection its own slot */
    mr_fwd_moe_ffn(m, &L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps, sc->xn, sc->exp_ids, k, sc->gate,
                   sc->up, sc->exp_out, n);
    be->moe_combine(be, sc->exp_out, sc->exp_w, n, k, hp->n_embd, sc->proj);
}

void mr_qwen3_moe_ffn(mr_model *m, const mr_layer *L, int n)
{
    mr_qwen3_moe_router(m, L, n);
    mr_qwen3_moe_experts(m, L, n);
}

int mr_qwen3_forward_segs(mr_model *m, const mr_fwd_seg *segs, int n_segs, int n, mr_err *err)
{
    (void)err;
    mr_backend *be = m->be;
    const mr_hparams *hp = &m->hp;
    mr_scratch *sc = &m->sc;

    be->get_rows(be, &m->tok_embd, sc->tokens, n, sc->x);
    for (int il = 0; il < hp->n_layers; il++) {
        const mr_layer *L = &m->layers[il];
        attention_block(m, segs, n_segs, il, n);
        be->rmsnorm(be, sc->x, L->ffn_norm, sc->xn, n, hp->n_embd, hp->rms_eps);
        if (hp->arch == MR_ARCH_QWEN3MOE)
            mr_qwen3_moe_ffn(m, L, n);
        else
            mr_qwen3_dense_ffn(m, L, n);
        be->add(be, sc->x, sc->proj, (size_t)n * (size_t)hp->n_embd);
    }
    mr_qwen3_output_head(m, segs, n_segs);
    return 0;
}

/* rmsnorm of n rows of x from row src into xn from row dst (the output
 * norm); nothing for n = 0 */
static void output_norm_rows(mr_model *m, int src, int dst, int n)
{
    const size_t e = (size_t)m->hp.n_embd;
    if (n > 0)
        m->be->rmsnorm(m->be, m->sc.x + (size_t)src * e, m->output_norm, m->sc.xn + (size_t)dst * e, n,
                       m->hp.n_embd, m->hp.rms_eps);
}

void mr_qwen3_output_head(mr_model *m, const mr_fwd_seg *segs, int n_segs)
{
    mr_scratch *sc = &m->sc;
    /* only the rows whose logits are wanted go through the output head: each
     * segment's rows are normalised into consecutive rows of xn, then one
     * matmul reads the output matrix once for all of them.  Segments whose
     * rows follow on from the previous one's in both x and xn (a decode
     * batch: one row each) share one rmsnorm call: a row's norm is its own */
    int rows = 0, run_src = 0, run_dst = 0, run_n = 0;
    for (int i = 0; i < n_segs; i++) {
        const mr_fwd_seg *g = &segs[i];
        const int r = g->n - g->out_first, src = g->start + g->out_first, dst = g->out_row;
        if (r <= 0)
            continue;
        if (run_n > 0 && src == run_src + run_n && dst == run_dst + run_n) {
            run_n += r;
        } else {
            output_norm_rows(m, run_src, run_dst, run_n);
            run_src = src;
            run_dst = dst;
            run_n = r;
        }
        if (dst + r > rows)
            rows = dst + r;
    }
    output_norm_rows(m, run_src, run_dst, run_n);
    if (rows > 0)
        mr_fwd_matmul_out(m, &m->output, sc->xn, sc->logits, rows);
}

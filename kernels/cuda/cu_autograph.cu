/* Automatic CUDA graphs for repeated op sequences (decode steps).
 *
 * The ops of the table are recorded instead of launched, together with a
 * signature (op ids, every argument, and the shape and device pointers of
 * each weight and KV cache they touch).  At the next point where the host
 * can observe the device (upload, download, sync, free, load, destroy) the
 * recorded sequence is flushed:
 *   - a sequence whose signature has a cached graph is replayed as one
 *     cudaGraphLaunch;
 *   - a sequence identical to the previous flush (the second decode step)
 *     is captured into a graph, cached and launched;
 *   - anything else (prompts, first steps, tests) is launched op by op.
 * Device memory holds the token ids, positions and block tables, so the
 * same sequence is the same computation on new inputs: replay needs no
 * cooperation from the forward pass.  Sequences with prompt products
 * (GEMMs, cuBLAS or host-read expert ids) are never captured.  MEMRA_CUDA_AUTOGRAPH=0 turns this off. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/cu_common.cuh"

/* One recorded op: its id and its arguments.  A plain record (no closure)
 * so that recording a step allocates nothing once the vectors have grown:
 * a replayed step only compares signatures. */
struct rec_op {
    int op;
    union {
        struct { const mr_weight *w; const int32_t *ids; int n; float *out; } get_rows;
        struct { const mr_weight *w; const float *x; float *y; int n; } matmul;
        struct { const mr_weight *w; const float *x; int x_slots; const int32_t *ids; int k; float *y; int n; } matmul_id;
        struct { const mr_weight *wg, *wu, *wd; const float *x; const int32_t *ids; int k; float *g, *u, *y; int n; } moe_ffn;
        struct { const float *x, *w; float *y; int n_rows, dim; float eps; } rmsnorm;
        struct { float *y; const float *x, *w; float *out; int n_rows, dim; float eps; } add_rmsnorm;
        struct { float *x; const int32_t *pos; int n, n_heads, head_dim, n_rot; float theta_base; enum mr_rope_mode mode; } rope;
        struct { float *q, *k; const float *qw, *kw; const int32_t *pos; int n, nh, nkv, hd, n_rot; float theta_base; enum mr_rope_mode mode; float eps;
                 /* OP_QK_NORM_ROPE_KV: the K/V store that followed */
                 mr_kv_cache *kv; int layer; const int32_t *table; const int32_t *const *tables; const float *v; } qk_norm_rope;
        struct { mr_kv_cache *kv; int layer; const int32_t *table; const int32_t *const *tables; const float *k, *v; const int32_t *pos; int n; } kv_store;
        struct { const mr_kv_cache *kv; int layer; const int32_t *table; const int32_t *const *tables; const float *q; const int32_t *pos; int n, n_heads; float scale; float *out; int pos_first; } attention;
        struct { const float *g, *u; float *o; size_t n; } swiglu;
        struct { float *y; const float *x; size_t n; } add;
        struct { const float *l; int n, ne, k; bool norm; int32_t *ids; float *w; } moe_route;
        struct { const float *y, *w; int n, k, rows; float *out; } moe_combine;
        struct { const float *x; int n, dim; int32_t *ids; } argmax;
        struct { float *dst; int ds; const float *src; int ss, n_rows, dim; } copy_2d;
        struct { float *y; const float *g; int n_rows, dim, gs; bool scalar; } sigmoid_mul;
        struct { const float *x, *w; float *state; int n, channels, k; float *y; } conv1d_silu;
        struct { const float *qkv; int stride; const float *alpha, *beta, *a, *dt_bias; float *state; int n, nk, nv, dk, dv; float eps; float *out; } gdn_scan;
        struct { float *l; int n, dim; const mr_sample_row *rows; const int32_t *add; int32_t *ids; } sample;
    } u;
};

/* A stream of a captured graph beside the main one: work given to it after
 * fork() runs once what the main stream had been given before it has
 * completed, and the main stream's work after join() waits for it. */
struct side_stream {
    cudaStream_t s = NULL;
    cudaEvent_t fork_ev = NULL, join_ev = NULL;

    bool open()
    {
        return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
               cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming) == cudaSuccess &&
               cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming) == cudaSuccess;
    }
    cudaError_t fork(cudaStream_t main)
    {
        const cudaError_t e = cudaEventRecord(fork_ev, main);
        return e == cudaSuccess ? cudaStreamWaitEvent(s, fork_ev, 0) : e;
    }
    void join(cudaStream_t main)
    {
        cudaEventRecord(join_ev, s);
        cudaStreamWaitEvent(main, join_ev, 0);
    }
    void close()
    {
        if (join_ev) cudaEventDestroy(join_ev);
        if (fork_ev) cudaEventDestroy(fork_ev);
        if (s) cudaStreamDestroy(s);
    }
};

struct mr_cu_auto {
    std::vector<rec_op> ops;
    std::vector<uint64_t> sig, last_sig;
    bool capturable = true;
    struct entry {
        std::vector<uint64_t> sig;
        cudaGraphExec_t ex;
    };
    std::vector<entry> cache;
    mr_backend real; /* the op table that launches */
    long replays = 0, captures = 0;
    long nodes = 0; /* nodes of the last graph captured */
    /* MEMRA_CUDA_PROFILE=1: no graphs; every op timed with events and
     * summed per label (op, type, shape), printed at destroy */
    bool prof = false;
    std::vector<std::string> labels;
    std::map<std::string, std::pair<double, long>> totals;
    /* and each kernel of a launch noted as [blocks x threads, waves]: waves
     * = blocks over the blocks the card holds at once (SMs x the kernel's
     * occupancy), the count that says whether a one-token grid is one
     * latency chain or several (run 128) */
    std::string noted;
    /* the last recorded op, when it was an add (for the add+RMSNorm fusion) */
    int last_op = 0;
    size_t add_sig_at = 0;
    float *add_y = NULL;
    const float *add_x = NULL;
    size_t add_n = 0;
    long fused = 0;
    /* consecutive matmuls over one input share a launch (q/k/v, gate/up),
     * up to fuse_mv of them: 4 by default (a gated delta net layer's four
     * products: run 116, 35B-A3B tg128 +1.6-5.0% over three), 3 or 0 (off)
     * with MEMRA_CUDA_FUSE_MV; launches saved so far */
    int fuse_mv = 4;
    long mv_fused = 0;
    /* consecutive prompt products over one input as one float16 GEMM
     * (mr_cu_matmul_prompt_multi; MEMRA_CUDA_FUSE_PROMPT=0 turns it off);
     * products that ran inside another's GEMM so far */
    bool fuse_prompt = true;
    long prompt_fused = 0;
    /* a K/V store of the keys qk_norm_rope just rotated joins its launch
     * (MEMRA_CUDA_FUSE_KV=0 turns it off) */
    bool fuse_kv = true;
    long kv_fused = 0;
    /* gate and up products and the swiglu after them in one launch
     * (MEMRA_CUDA_FUSE_GLU=0 turns it off; =1: not for a decode batch's
     * experts, the rule before run 287) */
    int fuse_glu = 2;
    long glu_fused = 0;
    /* a mixture layer's combine, a shared expert's gate and add, and the
     * add_rmsnorm after them in one launch (MEMRA_CUDA_FUSE_TAIL): 1 where
     * a shared expert ends the layer (qwen35moe: three launches saved), 2
     * also the plain combine + add_rmsnorm (qwen3moe: one saved, which
     * ties or loses at one token, run 113, and wins +0.9-1.1% at 16, run
     * 287), 3 (default) the first everywhere and the second for 2+ rows,
     * 0 off; ops saved so far */
    int fuse_tail = 3;
    long tail_fused = 0;
    /* the op whose launch may take the operand the last tail wrote
     * (mr_cu_xmd_il_made): before any other launch the note is forgotten */
    size_t xq_at = 0;
    /* an RMSNorm and the swiglu gating its output by z after it (a delta-net
     * layer's gated norm) in one launch, the same floats (H100, GPU-NOTES
     * 112: 35B-A3B tg128 +1.8 / +2.1% over the two launches;
     * MEMRA_CUDA_FUSE_GNORM=0 turns it off); launches saved so far */
    bool fuse_gnorm = true;
    long gnorm_fused = 0;
    /* one token's in-projection products and the causal convolution of
     * the first one's outputs after them (a delta-net layer) in one launch,
     * the same floats (MEMRA_CUDA_FUSE_CONV=0 turns it off); launches saved
     * so far */
    bool fuse_conv = true;
    long conv_fused = 0;
    /* a batch's delta-net convolutions and scans, one pair a sequence, as
     * one launch of each for a decode batch (mr_cu_gdn_segs), or the
     * convolutions and then one launch of the scans side by side
     * (mr_cu_gdn_scan_segs), the same floats (MEMRA_CUDA_FUSE_SEGS=0 turns
     * it off); sequences so taken so far */
    bool fuse_segs = true;
    long segs_fused = 0;
    /* the one-token scan after an in-projection that ran the convolution
     * loads its state before the PDL wait (mr_cu_gdn_scan_early; the same
     * floats; MEMRA_CUDA_SCAN_EARLY=0 turns it off); scans so launched */
    bool scan_early = true;
    long scans_early = 0;
    /* MEMRA_CUDA_BUSY=1: each flush's work between two events, their
     * times summed (mr_cu_busy): against a run's wall time, the share the
     * device had work, so what the host's side of a step (recording,
     * scheduling, copies, sampling) costs where nothing overlaps it */
    bool busy = false;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> busy_wait, busy_spare;
    double busy_ms = 0, record_ms = 0, flush_ms = 0;
    double rec_t0 = 0; /* host clock at the first op recorded since the last flush */
    long busy_flushes = 0;
    /* MEMRA_CUDA_TWICE (timing only, the results are wrong): launches
     * whose first op matches are made twice, so a step's time with and
     * without says what that launch costs inside the graph, its overlap
     * with its neighbours included (see twice_parse) */
    struct twice_pat {
        int op;
        int64_t rows, cols; /* 0: any */
        int used;           /* ops in the launch, 0: any */
    };
    std::vector<twice_pat> twice;
    /* MEMRA_CUDA_L2PF (an experiment, GPU-NOTES 107-110: +2% on an H100's 30B-A3B, a loss on its 8B,
     * within the rounds' spread on the H200;
     * captured graphs only): 0 off (the default); 1 a dense product's
     * weights asked of L2 on a side stream (cu_l2pf.cu) once the product
     * before it has completed, so during the small ops between the two; 2
     * once the op before the product before it has completed, so beside
     * that product too.  MEMRA_CUDA_L2PF_MB: runs of products whose
     * weights are more than this many MiB are not asked for (32);
     * MEMRA_CUDA_L2PF_HINT=1: the lines kept over others (evict_last). */
    int l2pf = 0;
    size_t l2pf_cap = (size_t)32 << 20;
    int l2pf_hint = 0;
    /* MEMRA_CUDA_L2PF_ID=1 (with L2PF 1 or 2): a mixture layer's down
     * experts too, beside its gate/up (l2pf_fork_ids) */
    int l2pf_id = 0;
    side_stream pf;
    long pf_launches = 0; /* prefetch kernels captured */
    /* captured graphs only: a shared expert's products (gate and up over
     * the layer's normed rows, SwiGLU, down) on a side stream of the graph,
     * forked where its input is ready and joined before the first op that
     * uses what it writes, so that they run beside the router, the routing
     * and the routed experts instead of ahead of them (side_mlp).  On by
     * default (H100, GPU-NOTES 112: 35B-A3B tg128 +1.6 / +3.3% in two
     * calls, decode-only C = 16 +4.4%); MEMRA_CUDA_BRANCH=0 turns it off */
    int branch = 1;
    side_stream br;
    long br_forks = 0; /* branches in the graphs captured so far */
    long br_last = 0;  /* branches launched by the last run_direct */
    long twice_done = 0;     /* launches made twice */
    long twice_captured = 0; /* of them, into a graph capture: over captures, launches a step */
};

enum { OP_GET_ROWS = 1, OP_MATMUL, OP_MATMUL_ID, OP_RMSNORM, OP_ROPE, OP_KV_STORE, OP_ATTENTION,
       OP_KV_STORE_MULTI, OP_ATTENTION_MULTI,
       OP_SWIGLU, OP_ADD, OP_MOE_ROUTE, OP_MOE_COMBINE, OP_ARGMAX, OP_ADD_RMSNORM, OP_COPY_2D,
       OP_SIGMOID_MUL, OP_CONV1D_SILU, OP_GDN_SCAN, OP_QK_NORM_ROPE, OP_SAMPLE, OP_QK_NORM_ROPE_KV,
       OP_MATMUL_PROMPT, OP_MATMUL_ID_PROMPT, OP_ATTENTION_PROMPT, OP_MOE_FFN_PROMPT };

/* The ops' names (MEMRA_CUDA_TWICE), indexed by id. */
static const char *const op_names[] = {
    "", "get_rows", "matmul", "matmul_id", "rmsnorm", "rope", "kv_store", "attention", "kv_store_multi",
    "attention_multi", "swiglu", "add", "moe_route", "moe_combine", "argmax", "add_rmsnorm", "copy_2d",
    "sigmoid_mul", "conv1d_silu", "gdn_scan", "qk_norm_rope", "sample", "qk_norm_rope_kv", "matmul_prompt",
    "matmul_id_prompt", "attention_prompt", "moe_ffn_prompt"};
static_assert(sizeof op_names / sizeof op_names[0] == OP_MOE_FFN_PROMPT + 1, "a name for every op");

#define MAX_GRAPHS 8

static inline void sp(std::vector<uint64_t> &s, const void *p) { s.push_back((uint64_t)(uintptr_t)p); }
static inline void sp(std::vector<uint64_t> &s, int v) { s.push_back((uint64_t)(int64_t)v); }
static inline void sp(std::vector<uint64_t> &s, size_t v) { s.push_back((uint64_t)v); }
static inline void sp(std::vector<uint64_t> &s, bool v) { s.push_back(v); }
static inline void sp(std::vector<uint64_t> &s, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    s.push_back(u);
}
static inline void sp(std::vector<uint64_t> &s, const mr_weight *w)
{
    sp(s, (const void *)w);
    s.push_back((uint64_t)w->type);
    s.push_back((uint64_t)w->cols);
    s.push_back((uint64_t)w->rows);
    s.push_back((uint64_t)w->n_mats);
    sp(s, w->data);
    sp(s, (const void *)w->priv);
}
static inline void sp_kv(std::vector<uint64_t> &s, const mr_kv_cache *kv, int layer)
{
    sp(s, (const void *)kv);
    s.push_back(((uint64_t)kv->n_blocks << 32) | (uint32_t)kv->block_tokens);
    s.push_back(((uint64_t)kv->n_kv_heads << 32) | (uint32_t)kv->head_dim);
    s.push_back((uint64_t)kv->dtype);
    if (layer >= 0 && layer < kv->n_layers) {
        sp(s, (const void *)kv->k[layer]);
        sp(s, (const void *)kv->v[layer]);
    }
}

/* Launches one recorded op through the real op table. */
static void run_op(mr_cu_auto *a, mr_backend *be, const rec_op &o)
{
    const mr_backend &r = a->real;
    switch (o.op) {
    case OP_GET_ROWS: { auto &p = o.u.get_rows; r.get_rows(be, p.w, p.ids, p.n, p.out); break; }
    case OP_MATMUL: { auto &p = o.u.matmul; r.matmul(be, p.w, p.x, p.y, p.n); break; }
    case OP_MATMUL_ID: {
        auto &p = o.u.matmul_id;
        r.matmul_id(be, p.w, p.x, p.x_slots, p.ids, p.k, p.y, p.n);
        break;
    }
    case OP_MATMUL_PROMPT: { auto &p = o.u.matmul; r.matmul_prompt(be, p.w, p.x, p.y, p.n); break; }
    case OP_MATMUL_ID_PROMPT: {
        auto &p = o.u.matmul_id;
        r.matmul_id_prompt(be, p.w, p.x, p.x_slots, p.ids, p.k, p.y, p.n);
        break;
    }
    case OP_MOE_FFN_PROMPT: {
        auto &p = o.u.moe_ffn;
        r.moe_ffn_prompt(be, p.wg, p.wu, p.wd, p.x, p.ids, p.k, p.g, p.u, p.y, p.n);
        break;
    }
    case OP_RMSNORM: { auto &p = o.u.rmsnorm; r.rmsnorm(be, p.x, p.w, p.y, p.n_rows, p.dim, p.eps); break; }
    case OP_ADD_RMSNORM: {
        auto &p = o.u.add_rmsnorm;
        r.add_rmsnorm(be, p.y, p.x, p.w, p.out, p.n_rows, p.dim, p.eps);
        break;
    }
    case OP_ROPE: {
        auto &p = o.u.rope;
        r.rope(be, p.x, p.pos, p.n, p.n_heads, p.head_dim, p.n_rot, p.theta_base, p.mode);
        break;
    }
    case OP_QK_NORM_ROPE: {
        auto &p = o.u.qk_norm_rope;
        r.qk_norm_rope(be, p.q, p.k, p.qw, p.kw, p.pos, p.n, p.nh, p.nkv, p.hd, p.n_rot, p.theta_base, p.mode,
                       p.eps);
        break;
    }
    case OP_QK_NORM_ROPE_KV: {
        auto &p = o.u.qk_norm_rope;
        mr_cu_qk_norm_rope_kv(be, p.q, p.k, p.qw, p.kw, p.pos, p.n, p.nh, p.nkv, p.hd, p.n_rot, p.theta_base,
                              p.mode, p.eps, p.kv, p.layer, p.table, p.tables, p.v);
        break;
    }
    case OP_KV_STORE: {
        auto &p = o.u.kv_store;
        r.kv_store(be, p.kv, p.layer, p.table, p.k, p.v, p.pos, p.n);
        break;
    }
    case OP_KV_STORE_MULTI: {
        auto &p = o.u.kv_store;
        r.kv_store_multi(be, p.kv, p.layer, p.tables, p.k, p.v, p.pos, p.n);
        break;
    }
    case OP_ATTENTION_MULTI: {
        auto &p = o.u.attention;
        r.attention_multi(be, p.kv, p.layer, p.tables, p.q, p.pos, p.n, p.n_heads, p.scale, p.out);
        break;
    }
    case OP_ATTENTION: {
        auto &p = o.u.attention;
        r.attention(be, p.kv, p.layer, p.table, p.q, p.pos, p.n, p.n_heads, p.scale, p.out);
        break;
    }
    case OP_ATTENTION_PROMPT: {
        auto &p = o.u.attention;
        r.attention_prompt(be, p.kv, p.layer, p.table, p.q, p.pos, p.n, p.n_heads, p.scale, p.out, p.pos_first);
        break;
    }
    case OP_SWIGLU: { auto &p = o.u.swiglu; r.swiglu(be, p.g, p.u, p.o, p.n); break; }
    case OP_ADD: { auto &p = o.u.add; r.add(be, p.y, p.x, p.n); break; }
    case OP_MOE_ROUTE: {
        auto &p = o.u.moe_route;
        r.moe_route(be, p.l, p.n, p.ne, p.k, p.norm, p.ids, p.w);
        break;
    }
    case OP_MOE_COMBINE: {
        auto &p = o.u.moe_combine;
        r.moe_combine(be, p.y, p.w, p.n, p.k, p.rows, p.out);
        break;
    }
    case OP_ARGMAX: { auto &p = o.u.argmax; r.argmax(be, p.x, p.n, p.dim, p.ids); break; }
    case OP_COPY_2D: {
        auto &p = o.u.copy_2d;
        r.copy_2d(be, p.dst, p.ds, p.src, p.ss, p.n_rows, p.dim);
        break;
    }
    case OP_SIGMOID_MUL: {
        auto &p = o.u.sigmoid_mul;
        r.sigmoid_mul(be, p.y, p.g, p.n_rows, p.dim, p.gs, p.scalar);
        break;
    }
    case OP_CONV1D_SILU: {
        auto &p = o.u.conv1d_silu;
        r.conv1d_silu(be, p.x, p.w, p.state, p.n, p.channels, p.k, p.y);
        break;
    }
    case OP_GDN_SCAN: {
        auto &p = o.u.gdn_scan;
        r.gdn_scan(be, p.qkv, p.stride, p.alpha, p.beta, p.a, p.dt_bias, p.state, p.n, p.nk, p.nv, p.dk,
                   p.dv, p.eps, p.out);
        break;
    }
    case OP_SAMPLE: { auto &p = o.u.sample; r.sample(be, p.l, p.n, p.dim, p.rows, p.add, p.ids); break; }
    }
}

static bool overlap(const void *p, size_t pn, const void *q, size_t qn)
{
    const char *a = (const char *)p, *b = (const char *)q;
    return a < b + qn && b < a + pn;
}

/* Whether op j, after m one-token matmuls over x (weights w, outputs y of
 * yn floats), is a conv1d_silu of the first one's outputs that their launch
 * can take (mr_cu_matmul_multi_conv): each of its channels is a row of
 * w[0], and what it writes (its outputs, the state) is no place the
 * products read or write. */
static bool conv_after(const mr_cu_auto *a, size_t j, const mr_weight *const *w, float *const *y, const size_t *yn,
                       size_t m, const float *x)
{
    if (!a->fuse_conv || j >= a->ops.size() || a->ops[j].op != OP_CONV1D_SILU)
        return false;
    const auto &cv = a->ops[j].u.conv1d_silu;
    if (cv.n != 1 || cv.x != y[0] || cv.channels != w[0]->rows || cv.k < 1 || cv.k > MR_CU_CONV_TAPS ||
        yn[0] != (size_t)cv.channels)
        return false;
    const size_t ch = (size_t)cv.channels, ob = ch * sizeof(float), sb = (size_t)(cv.k - 1) * ob;
    bool clash = overlap(cv.y, ob, x, (size_t)w[0]->cols * sizeof(float)) || overlap(cv.y, ob, cv.state, sb) ||
                 overlap(cv.state, sb, x, (size_t)w[0]->cols * sizeof(float)) ||
                 overlap(cv.w, ob * (size_t)cv.k, cv.y, ob) || overlap(cv.w, ob * (size_t)cv.k, cv.state, sb);
    for (size_t s = 0; s < m && !clash; s++)
        clash = overlap(cv.y, ob, y[s], yn[s] * sizeof(float)) || overlap(cv.state, sb, y[s], yn[s] * sizeof(float));
    return !clash;
}

/* Op j, after a launch of m one-token products (outputs y of yn floats)
 * and the convolution of the first (outputs cy, its state cs of k - 1 rows
 * of ch channels): a gdn_scan of cy whose state that launch does not write
 * is launched with its state loaded before the PDL wait (returns 1), else
 * nothing is (0). */
static size_t scan_after_conv(mr_cu_auto *a, mr_backend *be, size_t j, float *const *y, const size_t *yn,
                              size_t m, const float *cy, const float *cs, int ch, int k)
{
    if (!a->scan_early || j >= a->ops.size() || a->ops[j].op != OP_GDN_SCAN)
        return 0;
    const auto &g = a->ops[j].u.gdn_scan;
    if (g.n != 1 || g.qkv != cy || g.stride != ch)
        return 0;
    const size_t sb = (size_t)g.nv * (size_t)g.dk * (size_t)g.dv * sizeof(float);
    bool clash = overlap(g.state, sb, cy, (size_t)ch * sizeof(float)) ||
                 overlap(g.state, sb, cs, (size_t)(k > 1 ? k - 1 : 0) * (size_t)ch * sizeof(float));
    for (size_t s = 0; s < m && !clash; s++) clash = overlap(g.state, sb, y[s], yn[s] * sizeof(float));
    if (clash || !mr_cu_gdn_scan_early(be, g.qkv, g.stride, g.alpha, g.beta, g.a, g.dt_bias, g.state, g.nk, g.nv,
                                       g.dk, g.dv, g.eps, g.out))
        return 0;
    a->scans_early++;
    return 1;
}

/* Ops i, i+1, ... that are matmuls (or matmul_ids) over the same input,
 * with the same tokens (and ids), of one weight type and width, writing
 * places that no other of them reads or writes: up to MR_CU_MV_SUBS of
 * them run as one launch (q/k/v and gate/up of a decode step), with the
 * results of separate calls bit for bit; one token's matmuls and a
 * conv1d_silu of the first one's outputs right after them (a delta-net
 * layer's in-projection and convolution), where conv_after allows, with
 * the convolution too.  Returns how many ops it ran (0: none, op i runs
 * alone). */
static size_t run_multi(mr_cu_auto *a, mr_backend *be, size_t i)
{
    const rec_op &o = a->ops[i];
    const bool prompt = o.op == OP_MATMUL_PROMPT;
    if (prompt ? !a->fuse_prompt : (!a->fuse_mv && !a->fuse_conv) || (o.op != OP_MATMUL && o.op != OP_MATMUL_ID))
        return 0;
    const mr_weight *w[MR_CU_MV_SUBS];
    float *y[MR_CU_MV_SUBS];
    size_t yn[MR_CU_MV_SUBS];
    size_t m = 0;
    const size_t cap = prompt ? MR_CU_MV_SUBS : a->fuse_mv > 1 ? (size_t)a->fuse_mv : 1;
    for (size_t j = i; j < a->ops.size() && m < cap && a->ops[j].op == o.op; j++) {
        const rec_op &p = a->ops[j];
        const mr_weight *pw;
        float *py;
        size_t ny, nx;
        if (o.op == OP_MATMUL || prompt) {
            auto &q = p.u.matmul, &f = o.u.matmul;
            if (q.x != f.x || q.n != f.n)
                break;
            pw = q.w;
            py = q.y;
            ny = (size_t)q.n * (size_t)q.w->rows;
            nx = (size_t)q.n * (size_t)q.w->cols;
        } else {
            auto &q = p.u.matmul_id, &f = o.u.matmul_id;
            if (q.x != f.x || q.n != f.n || q.ids != f.ids || q.k != f.k || q.x_slots != f.x_slots)
                break;
            pw = q.w;
            py = q.y;
            ny = (size_t)q.n * (size_t)q.k * (size_t)q.w->rows;
            nx = (size_t)q.n * (size_t)q.x_slots * (size_t)q.w->cols;
        }
        /* a prompt GEMM dequantizes each matrix on its own: types may differ */
        if (!pw || (m && ((!prompt && pw->type != w[0]->type) || pw->cols != w[0]->cols || pw->n_mats != w[0]->n_mats)))
            break;
        const void *x = o.op == OP_MATMUL || prompt ? (const void *)o.u.matmul.x : (const void *)o.u.matmul_id.x;
        bool clash = overlap(py, ny * sizeof(float), x, nx * sizeof(float));
        if (o.op == OP_MATMUL_ID)
            clash |= overlap(py, ny * sizeof(float), o.u.matmul_id.ids, sizeof(int32_t));
        for (size_t t = 0; t < m && !clash; t++) clash = overlap(py, ny * sizeof(float), y[t], yn[t] * sizeof(float));
        if (clash)
            break;
        w[m] = pw;
        y[m] = py;
        yn[m] = ny;
        m++;
    }
    if (m >= 1 && o.op == OP_MATMUL && o.u.matmul.n == 1 && conv_after(a, i + m, w, y, yn, m, o.u.matmul.x)) {
        const auto &cv = a->ops[i + m].u.conv1d_silu;
        if (mr_cu_matmul_multi_conv(be, w, y, (int)m, o.u.matmul.x, cv.w, cv.state, cv.k, cv.y)) {
            a->mv_fused += (long)m - 1;
            a->conv_fused++;
            return m + 1 + scan_after_conv(a, be, i + m + 1, y, yn, m, cv.y, cv.state, cv.channels, cv.k);
        }
    }
    if (prompt) {
        if (m < 2 || !mr_cu_matmul_prompt_multi(be, w, y, (int)m, o.u.matmul.x, o.u.matmul.n))
            return 0;
        a->prompt_fused += (long)m - 1;
        return m;
    }
    if (m < 2 || !a->fuse_mv)
        return 0;
    bool ran;
    if (o.op == OP_MATMUL) {
        auto &f = o.u.matmul;
        ran = mr_cu_matmul_multi(be, w, y, (int)m, f.x, f.n);
    } else {
        auto &f = o.u.matmul_id;
        ran = mr_cu_matmul_id_multi(be, w, y, (int)m, f.x, f.x_slots, f.ids, f.k, f.n);
    }
    if (!ran)
        return 0;
    a->mv_fused += (long)m - 1;
    return m;
}

/* Ops i, i+1, i+2: two products over one input (a SwiGLU MLP's gate and
 * up, or one token's gate and up experts) and the swiglu of their outputs:
 * one launch that writes what the three would (mr_cu_matmul_glu).  Returns
 * 3, or 0 when they are not that or the kernels do not take them. */
static size_t run_glu(mr_cu_auto *a, mr_backend *be, size_t i)
{
    if (!a->fuse_glu || i + 2 >= a->ops.size() || a->ops[i + 2].op != OP_SWIGLU)
        return 0;
    const rec_op &g = a->ops[i], &u = a->ops[i + 1];
    const auto &sw = a->ops[i + 2].u.swiglu;
    if (g.op != u.op || (g.op != OP_MATMUL && g.op != OP_MATMUL_ID))
        return 0;
    const mr_weight *w[2];
    float *y[2];
    const float *x;
    const int32_t *ids = NULL;
    int n, k = 1, xs = 1;
    size_t ny, nx;
    if (g.op == OP_MATMUL) {
        auto &p = g.u.matmul, &q = u.u.matmul;
        if (p.x != q.x || p.n != q.n)
            return 0;
        w[0] = p.w, w[1] = q.w, y[0] = p.y, y[1] = q.y, x = p.x, n = p.n;
        ny = (size_t)n * (size_t)p.w->rows;
        nx = (size_t)n * (size_t)p.w->cols;
    } else {
        auto &p = g.u.matmul_id, &q = u.u.matmul_id;
        if (p.x != q.x || p.n != q.n || p.ids != q.ids || p.k != q.k || p.x_slots != q.x_slots)
            return 0;
        w[0] = p.w, w[1] = q.w, y[0] = p.y, y[1] = q.y, x = p.x, n = p.n;
        ids = p.ids, k = p.k, xs = p.x_slots;
        ny = (size_t)n * (size_t)k * (size_t)p.w->rows;
        nx = (size_t)n * (size_t)xs * (size_t)p.w->cols;
    }
    if (!w[0] || !w[1] || w[0]->rows != w[1]->rows || sw.g != y[0] || sw.u != y[1] || sw.n != ny ||
        (ids && n > 1 && a->fuse_glu < 2))
        return 0;
    const size_t yb = ny * sizeof(float), xb = nx * sizeof(float);
    bool clash = overlap(y[0], yb, y[1], yb) || overlap(y[0], yb, x, xb) || overlap(y[1], yb, x, xb);
    if (ids)
        clash |= overlap(y[0], yb, ids, (size_t)n * k * sizeof(int32_t)) ||
                 overlap(y[1], yb, ids, (size_t)n * k * sizeof(int32_t));
    if (sw.o != y[0])
        clash |= overlap(sw.o, yb, y[0], yb) || overlap(sw.o, yb, y[1], yb) || overlap(sw.o, yb, x, xb);
    if (clash || !mr_cu_matmul_glu(be, w, y, sw.o, x, xs, ids, k, n))
        return 0;
    a->glu_fused++;
    return 3;
}

/* The operand a launch taking ops up to j may write for op j + 1: where
 * that op is a dense product over exactly the n rows of x (cols wide)
 * that would read one (mr_cu_xmd_il_prepare, for writer `from`), its
 * place and *type; else NULL. */
static uint8_t *next_operand(const mr_cu_auto *a, mr_cu_ctx *c, size_t j, const float *x, int n, int64_t cols,
                             int from, int *type)
{
    if (j + 1 >= a->ops.size() || a->ops[j + 1].op != OP_MATMUL)
        return NULL;
    const auto &mm = a->ops[j + 1].u.matmul;
    if (mm.x != x || mm.n != n || !mm.w || mm.w->cols != cols)
        return NULL;
    return mr_cu_xmd_il_prepare(c, mm.w, n, from, type);
}

/* That launch wrote it: op j + 1's launch may take it (run_direct forgets
 * the note before any other launch). */
static void operand_made(mr_cu_auto *a, mr_cu_ctx *c, size_t j, const float *x, int n, int64_t cols, int type)
{
    mr_cu_xmd_il_made(c, x, n, (int)cols, type);
    a->xq_at = j + 1;
}

/* Ops i, i+1, ...: moe_combine into proj, sigmoid_mul of a shared
 * expert's output sh by its scalar gate and add(proj, sh) (without them
 * only in fuse_tail mode 2, or mode 3 with 2+ rows), then add_rmsnorm(x,
 * proj) (the end of a qwen35moe / qwen3moe layer and the next layer's
 * first norm): one launch that writes what they would (mr_cu_moe_tail).
 * Run 113 (H200, tg128, three medians of 5 alternating with the rule
 * off): 35B-A3B +0.7 / +2.0 / +0.8% (three launches fewer a layer),
 * 30B-A3B -0.9 / -0.1 / -1.4% (one fewer); run 287 (H100, 16 rows): the
 * 30B-A3B's one fewer +1.1% decode only, +0.9% with 512-token prompts.  So
 * by default the first always, the second for batches.  Returns how many
 * ops it ran, or 0. */
static size_t run_tail(mr_cu_auto *a, mr_backend *be, size_t i)
{
    const size_t n_ops = a->ops.size();
    if (!a->fuse_tail || a->ops[i].op != OP_MOE_COMBINE || i + 1 >= n_ops)
        return 0;
    const auto &cb = a->ops[i].u.moe_combine;
    const size_t rows = (size_t)cb.n * (size_t)cb.rows, rb = rows * sizeof(float);
    size_t j = i + 1;
    float *sh = NULL;
    const float *g = NULL;
    int gs = 0;
    if (a->ops[j].op == OP_SIGMOID_MUL) {
        const auto &sm = a->ops[j].u.sigmoid_mul;
        if (j + 2 >= n_ops || a->ops[j + 1].op != OP_ADD || !sm.scalar || sm.n_rows != cb.n || sm.dim != cb.rows)
            return 0;
        const auto &ad = a->ops[j + 1].u.add;
        if (ad.y != cb.out || ad.x != sm.y || ad.n != rows)
            return 0;
        sh = sm.y, g = sm.g, gs = sm.gs;
        j += 2;
    }
    if (!sh && (a->fuse_tail == 1 || (a->fuse_tail == 3 && cb.n < 2)))
        return 0;
    if (a->ops[j].op != OP_ADD_RMSNORM)
        return 0;
    const auto &ar = a->ops[j].u.add_rmsnorm;
    if (ar.x != cb.out || ar.n_rows != cb.n || ar.dim != cb.rows)
        return 0;
    /* the fused kernel reads every input before writing the element it
     * belongs to, but a write of one output may not land on another
     * input or output */
    const size_t yb = rb * (size_t)cb.k, wb = (size_t)cb.n * (size_t)cb.k * sizeof(float);
    bool clash = overlap(cb.out, rb, cb.y, yb) || overlap(cb.out, rb, cb.w, wb) || overlap(ar.y, rb, cb.y, yb) ||
                 overlap(ar.y, rb, cb.out, rb) || overlap(ar.y, rb, cb.w, wb) || overlap(ar.out, rb, cb.y, yb) ||
                 overlap(ar.out, rb, cb.out, rb) || overlap(ar.out, rb, ar.y, rb) || overlap(ar.out, rb, cb.w, wb);
    if (sh)
        clash |= overlap(sh, rb, cb.y, yb) || overlap(sh, rb, cb.out, rb) || overlap(sh, rb, ar.y, rb) ||
                 overlap(sh, rb, ar.out, rb) || overlap(sh, rb, cb.w, wb) ||
                 overlap(g, (size_t)cb.n * (size_t)(gs > 0 ? gs : 1) * sizeof(float), sh, rb);
    if (clash)
        return 0;
    /* the product right after it over the normed rows (q/k/v, a delta-net
     * in-projection) gets its operand from this launch */
    mr_cu_ctx *c = mr_cu(be);
    int xq_type = 0;
    uint8_t *xq = next_operand(a, c, j, ar.out, cb.n, cb.rows, 1, &xq_type);
    if (!mr_cu_moe_tail(be, cb.y, cb.w, cb.n, cb.k, cb.rows, cb.out, sh, g, gs, ar.y, ar.w, ar.out, ar.eps, xq,
                        xq_type))
        return 0;
    if (xq)
        operand_made(a, c, j, ar.out, cb.n, cb.rows, xq_type);
    a->tail_fused += (long)(j - i);
    return j - i + 1;
}

/* Op i, a decode batch's attention over all the rows of the dense product
 * right after it (o; the attention of every segment in this one call):
 * its merge also writes that product's interleaved operand where the
 * product would read one (cu_attn.cu k_attn_merge_xq; MEMRA_CUDA_FUSE_XQ
 * 3, the default, or 2), noted as the tail's is.  Returns 1 where it ran
 * op i, else 0.  (The 35B-A3B's gated attention multiplies its rows by the
 * gate before o: no rule there.) */
static size_t run_attn_xq(mr_cu_auto *a, mr_backend *be, size_t i)
{
    if (a->ops[i].op != OP_ATTENTION_MULTI)
        return 0;
    const auto &at = a->ops[i].u.attention;
    const int64_t cols = (int64_t)at.n_heads * at.kv->head_dim;
    mr_cu_ctx *c = mr_cu(be);
    int type = 0;
    uint8_t *xq = next_operand(a, c, i, at.out, at.n, cols, 2, &type);
    if (!xq)
        return 0;
    if (mr_cu_attention_multi_xq(be, at.kv, at.layer, at.tables, at.q, at.pos, at.n, at.n_heads, at.scale, at.out,
                                 xq, type))
        operand_made(a, c, i, at.out, at.n, cols, type);
    return 1;
}

/* Ops i, i+1: rmsnorm(x, w, y) and swiglu(z, y, y) over its rows, a
 * delta-net layer's gated norm: one launch (mr_cu_rmsnorm_gate).  Returns
 * 2, or 0 when they are not that or the kernel does not take them. */
static size_t run_gnorm(mr_cu_auto *a, mr_backend *be, size_t i)
{
    if (!a->fuse_gnorm || i + 1 >= a->ops.size() || a->ops[i].op != OP_RMSNORM || a->ops[i + 1].op != OP_SWIGLU)
        return 0;
    const auto &rn = a->ops[i].u.rmsnorm;
    const auto &sw = a->ops[i + 1].u.swiglu;
    const size_t n = (size_t)rn.n_rows * (size_t)rn.dim, nb = n * sizeof(float);
    if (sw.u != rn.y || sw.o != rn.y || sw.n != n || overlap(sw.g, nb, rn.y, nb) || overlap(sw.g, nb, rn.x, nb) ||
        (rn.x != rn.y && overlap(rn.x, nb, rn.y, nb)))
        return 0;
    if (!mr_cu_rmsnorm_gate(be, rn.x, rn.w, sw.g, rn.y, rn.n_rows, rn.dim, rn.eps))
        return 0;
    a->gnorm_fused++;
    return 2;
}

/* Ops i, i+1, ...: pairs of conv1d_silu and the gdn_scan of its outputs over
 * consecutive rows (the sequences of a batch, each with its own states:
 * qwen35.c recurrent_rows a segment), up to MR_CU_SEGS pairs.  One token
 * each (a decode batch): one launch of the convolutions and one of the
 * scans (mr_cu_gdn_segs).  Otherwise (prompt chunks, or prompts beside
 * decode tokens): each convolution as recorded, then one launch of all
 * the scans side by side (mr_cu_gdn_scan_segs) instead of one after
 * another.  Either way every convolution runs before the first scan, so
 * pairs join only where nothing a scan writes (its outputs, its state) is
 * read or written by a convolution or read by another scan, and no two
 * pairs share a state.  Returns the ops it ran (0: none, op i runs alone). */
static size_t run_segs(mr_cu_auto *a, mr_backend *be, size_t i)
{
    const size_t n_ops = a->ops.size();
    if (!a->fuse_segs || i + 3 >= n_ops || a->ops[i].op != OP_CONV1D_SILU || a->ops[i + 1].op != OP_GDN_SCAN)
        return 0;
    const auto &c0 = a->ops[i].u.conv1d_silu;
    const auto &g0 = a->ops[i + 1].u.gdn_scan;
    const size_t ch = (size_t)c0.channels, nv = (size_t)g0.nv, on = nv * (size_t)g0.dv;
    if (g0.qkv != c0.y || g0.stride != c0.channels || c0.k < 1 || c0.channels != 2 * g0.nk * g0.dk + g0.nv * g0.dv)
        return 0;
    const size_t fb = sizeof(float), csb = (size_t)(c0.k > 1 ? c0.k - 1 : 0) * ch * fb;
    const size_t ssb = nv * (size_t)g0.dk * (size_t)g0.dv * fb;
    float *cst[MR_CU_SEGS], *sst[MR_CU_SEGS];
    int t0[MR_CU_SEGS], nt[MR_CU_SEGS];
    size_t m = 0, rows = 0; /* pairs, and their rows so far */
    bool ones = true;
    for (size_t j = i; j + 1 < n_ops && m < MR_CU_SEGS; j += 2, m++) {
        if (a->ops[j].op != OP_CONV1D_SILU || a->ops[j + 1].op != OP_GDN_SCAN)
            break;
        const auto &cv = a->ops[j].u.conv1d_silu;
        const auto &g = a->ops[j + 1].u.gdn_scan;
        if (cv.n < 1 || g.n != cv.n || rows + (size_t)cv.n > (size_t)INT_MAX || cv.w != c0.w || cv.k != c0.k ||
            cv.channels != c0.channels || cv.x != c0.x + rows * ch || cv.y != c0.y + rows * ch || g.qkv != cv.y ||
            g.stride != g0.stride || g.alpha != g0.alpha + rows * nv || g.beta != g0.beta + rows * nv ||
            g.a != g0.a || g.dt_bias != g0.dt_bias || g.nk != g0.nk || g.nv != g0.nv || g.dk != g0.dk ||
            g.dv != g0.dv || g.eps != g0.eps || g.out != g0.out + rows * on)
            break;
        bool clash = overlap(cv.state, csb, g.state, ssb);
        for (size_t t = 0; t < m && !clash; t++)
            clash = overlap(cv.state, csb, cst[t], csb) || overlap(g.state, ssb, sst[t], ssb) ||
                    overlap(cv.state, csb, sst[t], ssb) || overlap(g.state, ssb, cst[t], csb);
        if (clash)
            break;
        cst[m] = cv.state;
        sst[m] = g.state;
        t0[m] = (int)rows;
        nt[m] = cv.n;
        ones = ones && cv.n == 1;
        rows += (size_t)cv.n;
    }
    if (m < 2)
        return 0;
    /* the regions of all m pairs: the convolutions' outputs are no input,
     * and what the scans write is nothing else's */
    const size_t xb = rows * ch * fb, ob = rows * on * fb, gb = rows * nv * fb, wb = ch * (size_t)c0.k * fb;
    const size_t hb = nv * fb;
    const void *r[] = {c0.x, c0.y, c0.w, g0.alpha, g0.beta, g0.a, g0.dt_bias};
    const size_t rn[] = {xb, xb, wb, gb, gb, hb, hb};
    bool clash = overlap(c0.y, xb, c0.x, xb) || overlap(c0.y, xb, c0.w, wb);
    for (size_t q = 0; q < 7 && !clash; q++) {
        clash = overlap(g0.out, ob, r[q], rn[q]);
        for (size_t t = 0; t < m && !clash; t++)
            clash = overlap(sst[t], ssb, r[q], rn[q]) || overlap(sst[t], ssb, g0.out, ob) ||
                    overlap(cst[t], csb, g0.out, ob) || overlap(cst[t], csb, r[q], rn[q]);
    }
    if (clash)
        return 0;
    if (ones) {
        if (!mr_cu_gdn_segs(be, c0.x, c0.w, cst, c0.k, c0.y, g0.alpha, g0.beta, g0.a, g0.dt_bias, sst, (int)m, g0.nk,
                            g0.nv, g0.dk, g0.dv, g0.eps, g0.out))
            return 0;
    } else {
        if (!mr_cu_gdn_scan_segs_ok(be, g0.nk, g0.nv, g0.dk, g0.dv, g0.stride))
            return 0;
        for (size_t t = 0; t < m; t++) run_op(a, be, a->ops[i + 2 * t]);
        mr_cu_gdn_scan_segs(be, g0.qkv, g0.stride, g0.alpha, g0.beta, g0.a, g0.dt_bias, sst, t0, nt, (int)m, g0.nk,
                            g0.nv, g0.dk, g0.dv, g0.eps, g0.out);
    }
    a->segs_fused += (long)m;
    return 2 * m;
}

/* Launches the ops from i on: a shared launch where a rule takes them, else
 * op i alone; returns how many ops it took. */
static size_t launch_at(mr_cu_auto *a, mr_backend *be, size_t i)
{
    size_t used = run_glu(a, be, i);
    if (!used)
        used = run_multi(a, be, i);
    if (!used)
        used = run_tail(a, be, i);
    if (!used)
        used = run_gnorm(a, be, i);
    if (!used)
        used = run_segs(a, be, i);
    if (!used)
        used = run_attn_xq(a, be, i);
    if (!used) {
        run_op(a, be, a->ops[i]);
        used = 1;
    }
    return used;
}

/* The weight of a matmul-like op (NULL for the others). */
static const mr_weight *op_weight(const rec_op &o)
{
    switch (o.op) {
    case OP_MATMUL: case OP_MATMUL_PROMPT: return o.u.matmul.w;
    case OP_MATMUL_ID: case OP_MATMUL_ID_PROMPT: return o.u.matmul_id.w;
    default: return NULL;
    }
}

static bool twice_match(const mr_cu_auto *a, const rec_op &o, size_t used)
{
    const mr_weight *w = op_weight(o);
    for (const auto &t : a->twice)
        if (t.op == o.op && (!t.used || (size_t)t.used == used) &&
            (!t.rows || (w && w->rows == t.rows)) && (!t.cols || (w && w->cols == t.cols)))
            return true;
    return false;
}

/* MEMRA_CUDA_TWICE=ITEM[,ITEM...], ITEM = NAME[@ROWS[xCOLS]][/OPS]: NAME an
 * op name (op_names), ROWS and COLS a matmul's weight shape, OPS how many
 * ops the launch takes (e.g. matmul@4096/3 the q/k/v launch of the 8B,
 * matmul@4096x4096/1 its o).  A bad item is reported and ignored. */
static void twice_parse(mr_cu_auto *a, const char *spec)
{
    std::string all(spec);
    size_t at = 0;
    while (at <= all.size()) {
        size_t end = all.find(',', at);
        if (end == std::string::npos) end = all.size();
        std::string item = all.substr(at, end - at);
        at = end + 1;
        if (item.empty()) continue;
        mr_cu_auto::twice_pat t = {0, 0, 0, 0};
        std::string name = item.substr(0, item.find_first_of("@/"));
        for (int k = 1; k < (int)(sizeof op_names / sizeof op_names[0]); k++)
            if (name == op_names[k]) t.op = k;
        long long r = 0, c = 0;
        int u = 0;
        const size_t pa = item.find('@'), ps = item.find('/');
        bool ok = t.op != 0;
        if (ok && pa != std::string::npos) {
            const std::string sh = item.substr(pa + 1, ps == std::string::npos ? std::string::npos : ps - pa - 1);
            ok = sscanf(sh.c_str(), "%lldx%lld", &r, &c) >= 1 && r > 0 && c >= 0;
        }
        if (ok && ps != std::string::npos)
            ok = sscanf(item.c_str() + ps + 1, "%d", &u) == 1 && u > 0;
        if (!ok) {
            fprintf(stderr, "MEMRA_CUDA_TWICE: '%s' is not NAME[@ROWS[xCOLS]][/OPS]: ignored\n", item.c_str());
            continue;
        }
        t.rows = r, t.cols = c, t.used = u;
        a->twice.push_back(t);
    }
    if (!a->twice.empty())
        fprintf(stderr, "MEMRA_CUDA_TWICE: %zu pattern(s), timing only: the results are wrong\n", a->twice.size());
}

void mr_cu_note_launch(mr_cu_ctx *c, const void *kernel, dim3 grid, dim3 block, size_t smem)
{
    mr_cu_auto *a = c->ag;
    if (!a)
        return;
    const int threads = (int)(block.x * block.y * block.z);
    const int fit = mr_cu_fit(c, kernel, threads, smem);
    const unsigned long blocks = (unsigned long)grid.x * grid.y * grid.z;
    char buf[96];
    if (fit > 0)
        snprintf(buf, sizeof buf, " [%lu x %d, %.2f waves]", blocks, threads, (double)blocks / ((double)fit * c->n_sm));
    else
        snprintf(buf, sizeof buf, " [%lu x %d]", blocks, threads);
    a->noted += buf;
}

/* A fork or prefetch launch that failed turns the switch off (the context
 * stays good; the capture fails as a whole). */
static void l2pf_check(mr_cu_auto *a, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return;
    fprintf(stderr, "%s: %s: off\n", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    a->l2pf = 0;
}

/* Whether op i is a dense product over the input of the product before it:
 * the rest of a run whose launches the recorder may share (q/k/v,
 * gate/up). */
static bool l2pf_same_run(const mr_cu_auto *a, size_t i)
{
    return i > 0 && a->ops[i].op == OP_MATMUL && a->ops[i - 1].op == OP_MATMUL &&
           a->ops[i - 1].u.matmul.x == a->ops[i].u.matmul.x;
}

/* The weights of run r (consecutive dense products over one input, op
 * indices runs[r] ..) asked of L2 on the side stream, after what st has
 * been given so far, where they are at most l2pf_cap bytes (a product
 * partly in L2 is no faster: run 250).  Returns whether it forked.  Should
 * the fork or a launch fail, the switch goes off for the rest of the
 * backend's life and the context stays good: the capture then fails as a
 * whole and mr_cu_flush runs the ops themselves, as for any capture it
 * could not make. */
static bool l2pf_fork(mr_cu_auto *a, mr_backend *be, cudaStream_t st, const std::vector<size_t> &runs, size_t r)
{
    if (r >= runs.size())
        return false;
    const mr_cu_ctx *c = mr_cu(be);
    std::vector<std::pair<const void *, size_t>> ask;
    size_t total = 0;
    for (size_t i = runs[r]; i < a->ops.size() && (i == runs[r] || l2pf_same_run(a, i)); i++) {
        const auto &mm = a->ops[i].u.matmul;
        size_t bytes = 0;
        const void *p = mr_cu_matvec_source(c, mm.w, mm.x, &bytes);
        ask.push_back({p, bytes});
        total += bytes;
    }
    if (total > a->l2pf_cap)
        return false;
    cudaError_t e = a->pf.fork(st);
    for (const auto &q : ask) {
        if (e == cudaSuccess)
            e = mr_cu_l2_prefetch(c, a->pf.s, q.first, q.second, a->l2pf_hint, &a->pf_launches);
    }
    l2pf_check(a, e, "MEMRA_CUDA_L2PF");
    return true;
}

/* Op i begins a run of expert products (a mixture layer's gate/up): the
 * expert products after it over the same ids and another input (its down)
 * are asked of L2 on the side stream beside it, once the op before it (the
 * routing, which wrote the ids) has completed.  At most l2pf_cap bytes
 * for the ids' matrices, else nothing.  Returns whether it forked; a
 * failure turns the switch off, as l2pf_fork's. */
static bool l2pf_fork_ids(mr_cu_auto *a, mr_backend *be, cudaStream_t st, size_t i)
{
    const auto &g = a->ops[i].u.matmul_id;
    if (i > 0 && a->ops[i - 1].op == OP_MATMUL_ID && a->ops[i - 1].u.matmul_id.ids == g.ids)
        return false; /* not the run's first */
    const mr_cu_ctx *c = mr_cu(be);
    struct ask_ids {
        const void *p;
        size_t mat;
        size_t j;
    };
    std::vector<ask_ids> later;
    size_t total = 0;
    for (size_t j = i + 1; j < a->ops.size() && a->ops[j].op != OP_MOE_ROUTE; j++) {
        const rec_op &o = a->ops[j];
        if (o.op != OP_MATMUL_ID || o.u.matmul_id.ids != g.ids || o.u.matmul_id.x == g.x)
            continue;
        size_t mat = 0;
        const void *p = mr_cu_matvec_id_source(c, o.u.matmul_id.w, o.u.matmul_id.x, &mat);
        total += mat * (size_t)o.u.matmul_id.n * (size_t)o.u.matmul_id.k;
        later.push_back({p, mat, j});
    }
    if (later.empty() || total > a->l2pf_cap)
        return false;
    cudaError_t e = a->pf.fork(st);
    for (const auto &q : later) {
        const auto &d = a->ops[q.j].u.matmul_id;
        if (e == cudaSuccess)
            e = mr_cu_l2_prefetch_ids(c, a->pf.s, q.p, q.mat, d.ids, d.n * d.k, (int)d.w->n_mats, a->l2pf_hint,
                                      &a->pf_launches);
    }
    l2pf_check(a, e, "MEMRA_CUDA_L2PF_ID");
    return true;
}

/* An activation range an op reads or writes. */
struct span {
    const void *p;
    size_t bytes;
    bool write;
};

/* The activation ranges op o reads and writes (its weights and K/V caches
 * aside, which no branch writes), for the ops a mixture layer has between
 * its shared expert and the end of the layer; false for any other op,
 * which a branch then treats as touching everything. */
static bool op_spans(const rec_op &o, std::vector<span> &v)
{
    const size_t F = sizeof(float), I = sizeof(int32_t);
    v.clear();
    switch (o.op) {
    case OP_MATMUL: {
        auto &p = o.u.matmul;
        if (!p.w)
            return false; /* its own call reports it */
        v.push_back({p.x, (size_t)p.n * (size_t)p.w->cols * F, false});
        v.push_back({p.y, (size_t)p.n * (size_t)p.w->rows * F, true});
        return true;
    }
    case OP_MATMUL_ID: {
        auto &p = o.u.matmul_id;
        if (!p.w)
            return false;
        v.push_back({p.x, (size_t)p.n * (size_t)p.x_slots * (size_t)p.w->cols * F, false});
        v.push_back({p.ids, (size_t)p.n * (size_t)p.k * I, false});
        v.push_back({p.y, (size_t)p.n * (size_t)p.k * (size_t)p.w->rows * F, true});
        return true;
    }
    case OP_MOE_ROUTE: {
        auto &p = o.u.moe_route;
        v.push_back({p.l, (size_t)p.n * (size_t)p.ne * F, false});
        v.push_back({p.ids, (size_t)p.n * (size_t)p.k * I, true});
        v.push_back({p.w, (size_t)p.n * (size_t)p.k * F, true});
        return true;
    }
    case OP_SWIGLU: {
        auto &p = o.u.swiglu;
        v.push_back({p.g, p.n * F, false});
        v.push_back({p.u, p.n * F, false});
        v.push_back({p.o, p.n * F, true});
        return true;
    }
    case OP_MOE_COMBINE: {
        auto &p = o.u.moe_combine;
        v.push_back({p.y, (size_t)p.n * (size_t)p.k * (size_t)p.rows * F, false});
        v.push_back({p.w, (size_t)p.n * (size_t)p.k * F, false});
        v.push_back({p.out, (size_t)p.n * (size_t)p.rows * F, true});
        return true;
    }
    default:
        return false;
    }
}

/* Ops i .. i+3 are a shared expert over the rows x: gate and up products
 * of x, the SwiGLU of their outputs, the down product of that (qwen35moe's
 * moe_ffn).  Returns 4 and, in *join, the first op after them that reads
 * or writes what they write or writes x (the ops between may then run
 * beside them); 0 when they are not that, or when no launch comes between
 * (nothing to run beside). */
static size_t side_mlp(const mr_cu_auto *a, size_t i, size_t *join)
{
    const size_t n_ops = a->ops.size();
    if (i + 4 >= n_ops)
        return 0;
    const rec_op &g = a->ops[i], &u = a->ops[i + 1], &sw = a->ops[i + 2], &d = a->ops[i + 3];
    if (g.op != OP_MATMUL || u.op != OP_MATMUL || sw.op != OP_SWIGLU || d.op != OP_MATMUL)
        return 0;
    const auto &pg = g.u.matmul, &pu = u.u.matmul, &pd = d.u.matmul;
    const auto &ps = sw.u.swiglu;
    if (!pg.w || !pu.w || !pd.w)
        return 0;
    if (pg.x != pu.x || pg.n != pu.n || pd.n != pg.n || ps.g != pg.y || ps.u != pu.y || pd.x != ps.o ||
        ps.n != (size_t)pg.n * (size_t)pg.w->rows || pu.w->rows != pg.w->rows || pd.w->cols != pg.w->rows)
        return 0;
    /* and a launch from op i + 3 takes no op past it: op i + 4 is no
     * product over the down product's input (run_multi, run_glu) */
    if (a->ops[i + 4].op == OP_MATMUL && a->ops[i + 4].u.matmul.x == pd.x)
        return 0;
    const size_t F = sizeof(float), hb = ps.n * F;
    const span out[4] = {{pg.y, hb, true}, {pu.y, hb, true}, {ps.o, hb, true},
                         {pd.y, (size_t)pd.n * (size_t)pd.w->rows * F, true}};
    const span in = {pg.x, (size_t)pg.n * (size_t)pg.w->cols * F, false};
    /* the branch's own outputs may not land on its input */
    for (const span &o : out)
        if (overlap(o.p, o.bytes, in.p, in.bytes))
            return 0;
    std::vector<span> v;
    size_t j = i + 4;
    for (; j < n_ops; j++) {
        if (!op_spans(a->ops[j], v))
            break;
        bool meets = false;
        for (const span &s : v) {
            for (const span &o : out) meets |= overlap(s.p, s.bytes, o.p, o.bytes);
            meets |= s.write && overlap(s.p, s.bytes, in.p, in.bytes);
        }
        if (meets)
            break;
    }
    if (j == i + 4)
        return 0;
    *join = j;
    return 4;
}

/* The most ops a launch from op i can take (launch_at's rules: run_glu,
 * run_multi with its convolution and the scan after it, run_tail,
 * run_gnorm, run_segs), so that a branch joins before the launch that
 * takes its join op. */
static size_t launch_span_max(const mr_cu_auto *a, size_t i)
{
    const rec_op &o = a->ops[i];
    const size_t n = a->ops.size();
    if (o.op == OP_MOE_COMBINE)
        return 4;
    if (o.op == OP_RMSNORM)
        return 2;
    if (o.op == OP_CONV1D_SILU) { /* run_segs: pairs of convolution and scan */
        size_t m = 0;
        while (m < 2 * MR_CU_SEGS && i + m + 1 < n && a->ops[i + m].op == OP_CONV1D_SILU &&
               a->ops[i + m + 1].op == OP_GDN_SCAN)
            m += 2;
        return m > 0 ? m : 1;
    }
    if (o.op != OP_MATMUL && o.op != OP_MATMUL_ID)
        return 1;
    size_t m = 1;
    while (i + m < n && a->ops[i + m].op == o.op) m++;
    if (i + m < n && a->ops[i + m].op == OP_CONV1D_SILU) {
        m++; /* run_multi's convolution */
        if (i + m < n && a->ops[i + m].op == OP_GDN_SCAN)
            m++; /* and the scan after it (scan_after_conv) */
    }
    if (i + 2 < n && a->ops[i + 2].op == OP_SWIGLU && m < 3)
        m = 3;
    return m;
}

/* Launches ops i .. i+len on the side stream, forked from st after what
 * st has been given so far.  They may use no scratch buffer of the
 * context (the ops beside them might use the same one): one that does
 * turns the branches off and returns false, and the capture is dropped
 * (the ops then run in order; the next capture makes no branch). */
static bool branch_launch(mr_cu_auto *a, mr_backend *be, cudaStream_t st, size_t i, size_t len)
{
    mr_cu_ctx *c = mr_cu(be);
    const cudaError_t e = a->br.fork(st);
    if (e != cudaSuccess) {
        fprintf(stderr, "MEMRA_CUDA_BRANCH: fork: %s: off\n", cudaGetErrorString(e));
        (void)cudaGetLastError();
        a->branch = 0;
        return false;
    }
    const unsigned long asks = c->scratch_asks;
    const cudaStream_t main_stream = c->stream;
    c->stream = a->br.s;
    for (size_t j = i; j < i + len;) j += launch_at(a, be, j);
    c->stream = main_stream;
    if (c->scratch_asks != asks) {
        fprintf(stderr, "MEMRA_CUDA_BRANCH: a shared expert's products use a scratch buffer: off\n");
        a->branch = 0;
        a->br.join(st); /* so that the capture ends whole */
        return false;
    }
    return true;
}

/* Runs the recorded ops on the stream (or into a capture); with the
 * profile on, times each with events (a shared launch is timed as its first
 * op, whose label says so, and its other ops as nothing). */
static bool run_direct(mr_cu_auto *a, mr_backend *be, cudaStream_t st)
{
    const size_t n = a->ops.size();
    const bool timed = a->prof && a->labels.size() == n;
    std::vector<cudaEvent_t> ev(timed ? n + 1 : 0);
    for (auto &e : ev) cudaEventCreate(&e);
    if (timed)
        cudaEventRecord(ev[0], st);
    const bool pf = a->l2pf && a->pf.s && mr_cu(be)->capturing;
    std::vector<size_t> runs; /* where each run of dense products over one input starts */
    if (pf)
        for (size_t i = 0; i < n; i++)
            if (a->ops[i].op == OP_MATMUL && !l2pf_same_run(a, i))
                runs.push_back(i);
    size_t next_run = 0; /* the first of runs not yet reached */
    bool forked = false;
    /* a side branch (MEMRA_CUDA_BRANCH) in flight joins before the launch
     * that could take op br_join; never in the timed profile, whose events
     * time the ops in order */
    const bool br = a->branch && a->br.s && mr_cu(be)->capturing && !timed;
    bool br_open = false, dropped = false;
    size_t br_join = 0;
    a->br_last = 0;
    mr_cu_ctx *c = mr_cu(be);
    c->xmd_pre_x = NULL;
    for (size_t i = 0; i < n;) {
        a->noted.clear();
        if (c->xmd_pre_x && i != a->xq_at)
            c->xmd_pre_x = NULL;
        if (br_open && br_join < i + launch_span_max(a, i)) {
            a->br.join(st);
            br_open = false;
        }
        size_t len = 0, join = 0;
        if (br && !br_open && (len = side_mlp(a, i, &join)) > 0) {
            c->xmd_pre_x = NULL; /* the branch's stream is not the main one's */
            if (!branch_launch(a, be, st, i, len)) {
                dropped = true;
                break;
            }
            br_open = true;
            br_join = join;
            a->br_last++;
            i += len;
            while (pf && next_run < runs.size() && runs[next_run] < i) next_run++;
            continue;
        }
        /* op i starts run r: the run after it goes into L2 beside it (2),
         * or after it (1); a->l2pf is read again each time, since a failed
         * fork turns it off for the rest */
        const bool at_run = pf && next_run < runs.size() && runs[next_run] == i;
        if (at_run && a->l2pf == 2)
            forked |= l2pf_fork(a, be, st, runs, next_run + 1);
        if (pf && a->l2pf && a->l2pf_id && a->ops[i].op == OP_MATMUL_ID)
            forked |= l2pf_fork_ids(a, be, st, i);
        const size_t used = launch_at(a, be, i);
        if (at_run && a->l2pf == 1)
            forked |= l2pf_fork(a, be, st, runs, next_run + 1);
        while (pf && next_run < runs.size() && runs[next_run] < i + used) next_run++;
        if (used > 1 && timed)
            a->labels[i] += " (+" + std::to_string(used - 1) + " in one launch)";
        if (timed)
            a->labels[i] += a->noted;
        if (!a->twice.empty() && twice_match(a, a->ops[i], used)) {
            launch_at(a, be, i);
            a->twice_done++;
            if (mr_cu(be)->capturing)
                a->twice_captured++;
        }
        if (timed)
            for (size_t j = i; j < i + used; j++) cudaEventRecord(ev[j + 1], st);
        i += used;
    }
    c->xmd_pre_x = NULL;
    if (forked) /* the side streams join the capture again before it ends */
        a->pf.join(st);
    if (br_open)
        a->br.join(st);
    if (dropped)
        return false;
    if (!timed)
        return true;
    cudaEventSynchronize(ev[n]);
    for (size_t i = 0; i < n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
        auto &t = a->totals[a->labels[i]];
        t.first += ms;
        t.second++;
    }
    for (auto &e : ev) cudaEventDestroy(e);
    return true;
}

static void label(mr_cu_auto *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void label(mr_cu_auto *a, const char *fmt, ...)
{
    if (!a->prof)
        return;
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    a->labels.push_back(buf);
}

static double host_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Sums the flushes' times whose end has passed (all of them, waiting, if
 * wait) and keeps their events for the next flushes. */
static void busy_collect(mr_cu_auto *a, bool wait)
{
    size_t i = 0;
    for (; i < a->busy_wait.size(); i++) {
        auto &p = a->busy_wait[i];
        if (wait ? cudaEventSynchronize(p.second) != cudaSuccess : cudaEventQuery(p.second) != cudaSuccess)
            break;
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p.first, p.second) == cudaSuccess) {
            a->busy_ms += ms;
            a->busy_flushes++;
        }
        a->busy_spare.push_back(p);
    }
    a->busy_wait.erase(a->busy_wait.begin(), a->busy_wait.begin() + (long)i);
    (void)cudaGetLastError(); /* a query's "not ready" is no error of the backend's */
}

/* The events to put around a flush's work (false: none, busy is off or
 * they could not be made). */
static bool busy_begin(mr_cu_auto *a, cudaStream_t st, std::pair<cudaEvent_t, cudaEvent_t> *p)
{
    if (!a->busy || a->prof)
        return false;
    busy_collect(a, false);
    if (!a->busy_spare.empty()) {
        *p = a->busy_spare.back();
        a->busy_spare.pop_back();
    } else if (cudaEventCreate(&p->first) != cudaSuccess) {
        return false;
    } else if (cudaEventCreate(&p->second) != cudaSuccess) {
        cudaEventDestroy(p->first);
        return false;
    }
    cudaEventRecord(p->first, st);
    return true;
}

void mr_cu_flush(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_auto *a = c->ag;
    if (!a || a->ops.empty())
        return;
    const double ft0 = a->busy ? host_ms() : 0;
    if (a->busy && a->rec_t0 > 0)
        a->record_ms += ft0 - a->rec_t0;
    a->rec_t0 = 0;
    std::pair<cudaEvent_t, cudaEvent_t> bev;
    const bool timed_busy = busy_begin(a, c->stream, &bev);
    bool done = false;
    for (auto &e : a->cache)
        if (e.sig == a->sig) {
            cudaError_t err = cudaGraphLaunch(e.ex, c->stream);
            if (err != cudaSuccess)
                mr_cu_fail(c, "graph replay: %s", cudaGetErrorString(err));
            a->replays++;
            done = true;
            break;
        }
    if (!done && !a->prof && a->capturable && !c->failed && a->sig == a->last_sig) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ex = NULL;
        cudaError_t err = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
        if (err == cudaSuccess) {
            c->capturing = true;
            const bool whole = run_direct(a, be, c->stream);
            c->capturing = false;
            err = cudaStreamEndCapture(c->stream, &g);
            if (err == cudaSuccess && whole && !c->failed) /* !whole: a branch it could not make */
                err = cudaGraphInstantiate(&ex, g, 0);
            size_t nn = 0;
            if (g && cudaGraphGetNodes(g, NULL, &nn) == cudaSuccess)
                a->nodes = (long)nn;
            if (g)
                cudaGraphDestroy(g);
        }
        if (err == cudaSuccess && ex && !c->failed) {
            err = cudaGraphLaunch(ex, c->stream);
            if (err != cudaSuccess)
                mr_cu_fail(c, "graph launch: %s", cudaGetErrorString(err));
            if (a->cache.size() >= MAX_GRAPHS) {
                cudaGraphExecDestroy(a->cache.front().ex);
                a->cache.erase(a->cache.begin());
            }
            a->cache.push_back({a->sig, ex});
            a->captures++;
            a->br_forks += a->br_last;
            done = true;
        } else {
            (void)cudaGetLastError();
            if (ex)
                cudaGraphExecDestroy(ex);
            /* a capture that could not be made: run the ops themselves
             * (unless an op itself failed; that error is kept) */
            if (c->failed)
                done = true;
        }
    }
    if (!done)
        run_direct(a, be, c->stream);
    if (timed_busy) {
        cudaEventRecord(bev.second, c->stream);
        a->busy_wait.push_back(bev);
    }
    if (a->busy)
        a->flush_ms += host_ms() - ft0;
    a->last_sig.swap(a->sig);
    a->sig.clear();
    a->ops.clear();
    a->labels.clear();
    a->last_op = 0;
    a->capturable = true;
}

/* Starts recording op `op`: its id goes into the signature, and the caller
 * fills the returned record's arguments. */
static inline rec_op &rec(mr_backend *be, int op)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (a->busy && a->ops.empty())
        a->rec_t0 = host_ms();
    a->last_op = op;
    a->sig.push_back((uint64_t)op);
    a->ops.push_back(rec_op());
    a->ops.back().op = op;
    return a->ops.back();
}

/* An op that joined the recorded one before it: its id goes into the
 * signature as rec() would put it (the caller adds its arguments), but no
 * record of its own. */
static inline void sig_only(mr_cu_auto *a, int op)
{
    a->last_op = op;
    a->sig.push_back((uint64_t)op);
}

/* While an explicit capture (graph_begin..graph_end) runs, ops go straight
 * to the stream: recording is for the implicit graphs only. */
#define DIRECT(be) (mr_cu(be)->capturing)

static void w_get_rows(mr_backend *be, const mr_weight *w, const int32_t *ids, int n, float *out)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.get_rows(be, w, ids, n, out);
    rec(be, OP_GET_ROWS).u.get_rows = {w, ids, n, out};
    sp(a->sig, w); sp(a->sig, ids); sp(a->sig, n); sp(a->sig, out);
    label(a, "get_rows t%d %lldx%lld n=%d", w->type, (long long)w->rows, (long long)w->cols, n);
}

/* A matmul or matmul_id record of op id `op` (the decode or the prompt
 * form: the same arguments). */
static void rec_matmul(mr_backend *be, int op, const char *name, const mr_weight *w, const float *x, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    rec(be, op).u.matmul = {w, x, y, n};
    sp(a->sig, w); sp(a->sig, x); sp(a->sig, y); sp(a->sig, n);
    label(a, "%s t%d %lldx%lld n=%d", name, w->type, (long long)w->rows, (long long)w->cols, n);
}

static void rec_matmul_id(mr_backend *be, int op, const char *name, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    rec(be, op).u.matmul_id = {w, x, x_slots, ids, k, y, n};
    sp(a->sig, w); sp(a->sig, x); sp(a->sig, x_slots); sp(a->sig, ids); sp(a->sig, k);
    sp(a->sig, y); sp(a->sig, n);
    label(a, "%s t%d %lldx%lldx%lld k=%d n=%d", name, w->type, (long long)w->n_mats, (long long)w->rows,
          (long long)w->cols, k, n);
}

static void w_matmul(mr_backend *be, const mr_weight *w, const float *x, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.matmul(be, w, x, y, n);
    rec_matmul(be, OP_MATMUL, "matmul", w, x, y, n);
    if (n >= MR_CU_GEMM_MIN_TOKENS) a->capturable = false; /* the GEMM path */
}

static void w_matmul_id(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                        const int32_t *ids, int k, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.matmul_id(be, w, x, x_slots, ids, k, y, n);
    rec_matmul_id(be, OP_MATMUL_ID, "matmul_id", w, x, x_slots, ids, k, y, n);
    if (n >= MR_CU_GEMM_MIN_TOKENS) a->capturable = false; /* reads the ids on the host */
}

/* Prompt products: the GEMM path, which reads expert ids on the host and
 * whose calls vary with the prompt: never captured. */
static void w_matmul_prompt(mr_backend *be, const mr_weight *w, const float *x, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.matmul_prompt(be, w, x, y, n);
    rec_matmul(be, OP_MATMUL_PROMPT, "matmul_prompt", w, x, y, n);
    a->capturable = false;
}

static void w_matmul_id_prompt(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                               const int32_t *ids, int k, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.matmul_id_prompt(be, w, x, x_slots, ids, k, y, n);
    rec_matmul_id(be, OP_MATMUL_ID_PROMPT, "matmul_id_prompt", w, x, x_slots, ids, k, y, n);
    a->capturable = false;
}

static void w_moe_ffn_prompt(mr_backend *be, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd,
                             const float *x, const int32_t *ids, int k, float *g, float *u, float *y, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.moe_ffn_prompt(be, wg, wu, wd, x, ids, k, g, u, y, n);
    rec(be, OP_MOE_FFN_PROMPT).u.moe_ffn = {wg, wu, wd, x, ids, k, g, u, y, n};
    sp(a->sig, wg); sp(a->sig, wu); sp(a->sig, wd); sp(a->sig, x); sp(a->sig, ids); sp(a->sig, k);
    sp(a->sig, g); sp(a->sig, u); sp(a->sig, y); sp(a->sig, n);
    label(a, "moe_ffn_prompt t%d/t%d %lldx%lldx%lld k=%d n=%d", wg->type, wd->type, (long long)wg->n_mats,
          (long long)wg->rows, (long long)wg->cols, k, n);
    a->capturable = false;
}

static void w_add_rmsnorm(mr_backend *be, float *y, const float *x, const float *w, float *out,
                          int n_rows, int dim, float eps);

static void w_rmsnorm(mr_backend *be, const float *x, const float *w, float *y, int n_rows,
                      int dim, float eps)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.rmsnorm(be, x, w, y, n_rows, dim, eps);
    /* add(r, d) straight before rmsnorm(r): one fused kernel (add_rmsnorm is
     * specified as exactly that sequence, and computes the same floats) */
    if (a->last_op == OP_ADD && a->add_y == x && a->add_n == (size_t)n_rows * (size_t)dim &&
        !a->ops.empty() && a->add_sig_at < a->sig.size()) {
        float *ry = a->add_y;
        const float *rx = a->add_x;
        a->ops.pop_back();
        if (a->prof && !a->labels.empty()) a->labels.pop_back();
        a->sig.resize(a->add_sig_at);
        a->last_op = 0;
        a->fused++;
        return w_add_rmsnorm(be, ry, rx, w, y, n_rows, dim, eps);
    }
    rec(be, OP_RMSNORM).u.rmsnorm = {x, w, y, n_rows, dim, eps};
    sp(a->sig, x); sp(a->sig, w); sp(a->sig, y); sp(a->sig, n_rows); sp(a->sig, dim); sp(a->sig, eps);
    label(a, "rmsnorm %dx%d", n_rows, dim);
}

static void w_add_rmsnorm(mr_backend *be, float *y, const float *x, const float *w, float *out,
                          int n_rows, int dim, float eps)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.add_rmsnorm(be, y, x, w, out, n_rows, dim, eps);
    rec(be, OP_ADD_RMSNORM).u.add_rmsnorm = {y, x, w, out, n_rows, dim, eps};
    sp(a->sig, y); sp(a->sig, x); sp(a->sig, w); sp(a->sig, out); sp(a->sig, n_rows);
    sp(a->sig, dim); sp(a->sig, eps);
    label(a, "add_rmsnorm %dx%d", n_rows, dim);
}

static void w_rope(mr_backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                   int n_rot, float theta_base, enum mr_rope_mode mode)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.rope(be, x, pos, n, n_heads, head_dim, n_rot, theta_base, mode);
    rec(be, OP_ROPE).u.rope = {x, pos, n, n_heads, head_dim, n_rot, theta_base, mode};
    sp(a->sig, x); sp(a->sig, pos); sp(a->sig, n); sp(a->sig, n_heads); sp(a->sig, head_dim);
    sp(a->sig, n_rot); sp(a->sig, theta_base); sp(a->sig, (int)mode);
    label(a, "rope n=%d h=%d", n, n_heads);
}

static void w_qk_norm_rope(mr_backend *be, float *q, float *k, const float *qw, const float *kw,
                           const int32_t *pos, int n, int nh, int nkv, int hd, int n_rot, float theta_base,
                           enum mr_rope_mode mode, float eps)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.qk_norm_rope(be, q, k, qw, kw, pos, n, nh, nkv, hd, n_rot, theta_base, mode, eps);
    rec(be, OP_QK_NORM_ROPE).u.qk_norm_rope = {q, k, qw, kw, pos, n, nh, nkv, hd, n_rot, theta_base, mode, eps,
                                               NULL, 0, NULL, NULL, NULL};
    sp(a->sig, q); sp(a->sig, k); sp(a->sig, qw); sp(a->sig, kw); sp(a->sig, pos); sp(a->sig, n);
    sp(a->sig, nh); sp(a->sig, nkv); sp(a->sig, hd); sp(a->sig, n_rot); sp(a->sig, theta_base);
    sp(a->sig, (int)mode); sp(a->sig, eps);
    label(a, "qk_norm_rope n=%d h=%d/%d", n, nh, nkv);
}

/* A K/V store straight after qk_norm_rope of the same keys, positions and
 * tokens joins its launch: the recorded qk_norm_rope becomes
 * OP_QK_NORM_ROPE_KV (the signature keeps both ops, so a sequence and its
 * graph stay one-to-one).  False: record the store on its own. */
static bool fuse_kv_store(mr_cu_auto *a, mr_kv_cache *kv, int layer, const int32_t *table,
                          const int32_t *const *tables, const float *k, const float *v, const int32_t *pos,
                          int n)
{
    if (!a->fuse_kv || a->last_op != OP_QK_NORM_ROPE || a->ops.empty() || a->ops.back().op != OP_QK_NORM_ROPE)
        return false;
    auto &p = a->ops.back().u.qk_norm_rope;
    if (p.k != k || p.pos != pos || p.n != n || kv->n_kv_heads != p.nkv || kv->head_dim != p.hd ||
        layer < 0 || layer >= kv->n_layers)
        return false;
    /* v must not be what the rotation writes */
    const size_t kvb = (size_t)n * p.nkv * p.hd * sizeof(float), qb = (size_t)n * p.nh * p.hd * sizeof(float);
    if (overlap(v, kvb, p.q, qb) || overlap(v, kvb, p.k, kvb))
        return false;
    a->ops.back().op = OP_QK_NORM_ROPE_KV;
    p.kv = kv;
    p.layer = layer;
    p.table = table;
    p.tables = tables;
    p.v = v;
    if (a->prof && !a->labels.empty()) a->labels.back() += " + kv_store";
    a->kv_fused++;
    return true;
}

static void w_kv_store(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *table,
                       const float *k, const float *v, const int32_t *pos, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.kv_store(be, kv, layer, table, k, v, pos, n);
    const bool joined = fuse_kv_store(a, kv, layer, table, NULL, k, v, pos, n);
    if (joined)
        sig_only(a, OP_KV_STORE);
    else
        rec(be, OP_KV_STORE).u.kv_store = {kv, layer, table, NULL, k, v, pos, n};
    sp_kv(a->sig, kv, layer); sp(a->sig, layer); sp(a->sig, table); sp(a->sig, k); sp(a->sig, v);
    sp(a->sig, pos); sp(a->sig, n);
    if (!joined) /* the joined op's label says so */
        label(a, "kv_store n=%d", n);
}

/* An attention record of one sequence (op: the decode or the prompt form). */
/* pos_first (prompt rows) is signed through what it decides, the rows that
 * take the float32 kernel, so that a graph replays the same kernels a row. */
static void rec_attention(mr_backend *be, int op, const char *name, const mr_kv_cache *kv, int layer,
                          const int32_t *table, const float *q, const int32_t *pos, int n, int n_heads, float scale,
                          float *out, int pos_first)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    rec(be, op).u.attention = {kv, layer, table, NULL, q, pos, n, n_heads, scale, out, pos_first};
    sp_kv(a->sig, kv, layer); sp(a->sig, layer); sp(a->sig, table); sp(a->sig, q); sp(a->sig, pos);
    sp(a->sig, n); sp(a->sig, n_heads); sp(a->sig, scale); sp(a->sig, out);
    if (op == OP_ATTENTION_PROMPT)
        sp(a->sig, mr_cu_attn_f32_rows(mr_cu(be), kv->head_dim, pos_first, n));
    label(a, "%s n=%d h=%d", name, n, n_heads);
}

static void w_attention(mr_backend *be, const mr_kv_cache *kv, int layer, const int32_t *table,
                        const float *q, const int32_t *pos, int n, int n_heads, float scale,
                        float *out)
{
    if (DIRECT(be)) return mr_cu(be)->ag->real.attention(be, kv, layer, table, q, pos, n, n_heads, scale, out);
    rec_attention(be, OP_ATTENTION, "attention", kv, layer, table, q, pos, n, n_heads, scale, out, -1);
}

static void w_attention_prompt(mr_backend *be, const mr_kv_cache *kv, int layer, const int32_t *table,
                               const float *q, const int32_t *pos, int n, int n_heads, float scale, float *out,
                               int pos_first)
{
    if (DIRECT(be))
        return mr_cu(be)->ag->real.attention_prompt(be, kv, layer, table, q, pos, n, n_heads, scale, out,
                                                    pos_first);
    rec_attention(be, OP_ATTENTION_PROMPT, "attention_prompt", kv, layer, table, q, pos, n, n_heads, scale, out,
                  pos_first);
}

/* The multi-sequence forms: the tables array is device memory the host
 * rewrites before each step, so a replayed graph reads the step's tables. */
static void w_kv_store_multi(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *const *tables,
                             const float *k, const float *v, const int32_t *pos, int n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.kv_store_multi(be, kv, layer, tables, k, v, pos, n);
    const bool joined = fuse_kv_store(a, kv, layer, NULL, tables, k, v, pos, n);
    if (joined)
        sig_only(a, OP_KV_STORE_MULTI);
    else
        rec(be, OP_KV_STORE_MULTI).u.kv_store = {kv, layer, NULL, tables, k, v, pos, n};
    sp_kv(a->sig, kv, layer); sp(a->sig, layer); sp(a->sig, (const void *)tables); sp(a->sig, k);
    sp(a->sig, v); sp(a->sig, pos); sp(a->sig, n);
    if (!joined) /* the joined op's label says so */
        label(a, "kv_store_multi n=%d", n);
}

static void w_attention_multi(mr_backend *be, const mr_kv_cache *kv, int layer,
                              const int32_t *const *tables, const float *q, const int32_t *pos,
                              int n, int n_heads, float scale, float *out)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be))
        return a->real.attention_multi(be, kv, layer, tables, q, pos, n, n_heads, scale, out);
    rec(be, OP_ATTENTION_MULTI).u.attention = {kv, layer, NULL, tables, q, pos, n, n_heads, scale, out, -1};
    sp_kv(a->sig, kv, layer); sp(a->sig, layer); sp(a->sig, (const void *)tables); sp(a->sig, q);
    sp(a->sig, pos); sp(a->sig, n); sp(a->sig, n_heads); sp(a->sig, scale); sp(a->sig, out);
    label(a, "attention_multi n=%d h=%d", n, n_heads);
}

static void w_swiglu(mr_backend *be, const float *g, const float *u, float *o, size_t n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.swiglu(be, g, u, o, n);
    rec(be, OP_SWIGLU).u.swiglu = {g, u, o, n};
    sp(a->sig, g); sp(a->sig, u); sp(a->sig, o); sp(a->sig, n);
    label(a, "swiglu %zu", n);
}

static void w_add(mr_backend *be, float *y, const float *x, size_t n)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.add(be, y, x, n);
    a->add_sig_at = a->sig.size();
    a->add_y = y;
    a->add_x = x;
    a->add_n = n;
    rec(be, OP_ADD).u.add = {y, x, n};
    sp(a->sig, y); sp(a->sig, x); sp(a->sig, n);
    label(a, "add %zu", n);
}

static void w_moe_route(mr_backend *be, const float *l, int n, int ne, int k, bool norm, int32_t *ids,
                        float *w)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.moe_route(be, l, n, ne, k, norm, ids, w);
    rec(be, OP_MOE_ROUTE).u.moe_route = {l, n, ne, k, norm, ids, w};
    sp(a->sig, l); sp(a->sig, n); sp(a->sig, ne); sp(a->sig, k); sp(a->sig, norm); sp(a->sig, ids);
    sp(a->sig, w);
    label(a, "moe_route n=%d E=%d k=%d", n, ne, k);
}

static void w_moe_combine(mr_backend *be, const float *y, const float *w, int n, int k, int rows,
                          float *out)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.moe_combine(be, y, w, n, k, rows, out);
    rec(be, OP_MOE_COMBINE).u.moe_combine = {y, w, n, k, rows, out};
    sp(a->sig, y); sp(a->sig, w); sp(a->sig, n); sp(a->sig, k); sp(a->sig, rows); sp(a->sig, out);
    label(a, "moe_combine n=%d k=%d", n, k);
}

static void w_argmax(mr_backend *be, const float *x, int n, int dim, int32_t *ids)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.argmax(be, x, n, dim, ids);
    rec(be, OP_ARGMAX).u.argmax = {x, n, dim, ids};
    sp(a->sig, x); sp(a->sig, n); sp(a->sig, dim); sp(a->sig, ids);
    label(a, "argmax n=%d dim=%d", n, dim);
}

static void w_copy_2d(mr_backend *be, float *dst, int ds, const float *src, int ss, int n_rows, int dim)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.copy_2d(be, dst, ds, src, ss, n_rows, dim);
    rec(be, OP_COPY_2D).u.copy_2d = {dst, ds, src, ss, n_rows, dim};
    sp(a->sig, dst); sp(a->sig, ds); sp(a->sig, src); sp(a->sig, ss); sp(a->sig, n_rows); sp(a->sig, dim);
    label(a, "copy_2d %dx%d", n_rows, dim);
}

static void w_sigmoid_mul(mr_backend *be, float *y, const float *g, int n_rows, int dim, int gs,
                          bool scalar)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.sigmoid_mul(be, y, g, n_rows, dim, gs, scalar);
    rec(be, OP_SIGMOID_MUL).u.sigmoid_mul = {y, g, n_rows, dim, gs, scalar};
    sp(a->sig, y); sp(a->sig, g); sp(a->sig, n_rows); sp(a->sig, dim); sp(a->sig, gs); sp(a->sig, scalar);
    label(a, "sigmoid_mul %dx%d%s", n_rows, dim, scalar ? " scalar" : "");
}

static void w_conv1d_silu(mr_backend *be, const float *x, const float *w, float *state, int n,
                          int channels, int k, float *y)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.conv1d_silu(be, x, w, state, n, channels, k, y);
    rec(be, OP_CONV1D_SILU).u.conv1d_silu = {x, w, state, n, channels, k, y};
    sp(a->sig, x); sp(a->sig, w); sp(a->sig, state); sp(a->sig, n); sp(a->sig, channels); sp(a->sig, k);
    sp(a->sig, y);
    label(a, "conv1d_silu n=%d c=%d k=%d", n, channels, k);
}

static void w_gdn_scan(mr_backend *be, const float *qkv, int stride, const float *alpha,
                       const float *beta, const float *sa, const float *dt_bias, float *state, int n,
                       int nk, int nv, int dk, int dv, float eps, float *out)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be))
        return a->real.gdn_scan(be, qkv, stride, alpha, beta, sa, dt_bias, state, n, nk, nv, dk, dv, eps, out);
    rec(be, OP_GDN_SCAN).u.gdn_scan = {qkv, stride, alpha, beta, sa, dt_bias, state, n, nk, nv, dk, dv, eps, out};
    sp(a->sig, qkv); sp(a->sig, stride); sp(a->sig, alpha); sp(a->sig, beta); sp(a->sig, sa);
    sp(a->sig, dt_bias); sp(a->sig, state); sp(a->sig, n); sp(a->sig, nk); sp(a->sig, nv); sp(a->sig, dk);
    sp(a->sig, dv); sp(a->sig, eps); sp(a->sig, out);
    label(a, "gdn_scan n=%d h=%d/%d d=%d/%d", n, nk, nv, dk, dv);
}

/* The rows (parameters, uniforms, penalty tables) and the ids they add are
 * device memory the host rewrites before each step, like the token ids: a
 * replayed graph samples with the step's own. */
static void w_sample(mr_backend *be, float *l, int n, int dim, const mr_sample_row *rows,
                     const int32_t *add, int32_t *ids)
{
    mr_cu_auto *a = mr_cu(be)->ag;
    if (DIRECT(be)) return a->real.sample(be, l, n, dim, rows, add, ids);
    rec(be, OP_SAMPLE).u.sample = {l, n, dim, rows, add, ids};
    sp(a->sig, l); sp(a->sig, n); sp(a->sig, dim); sp(a->sig, rows); sp(a->sig, add); sp(a->sig, ids);
    label(a, "sample n=%d dim=%d", n, dim);
}

void mr_cu_autograph_install(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    const char *e = getenv("MEMRA_CUDA_AUTOGRAPH");
    if (e && !strcmp(e, "0"))
        return;
    c->ag = new mr_cu_auto();
    c->ag->real = *be;
    const char *pe = getenv("MEMRA_CUDA_PROFILE");
    c->ag->prof = pe && *pe && strcmp(pe, "0");
    c->note_launches = c->ag->prof;
    const char *fm = getenv("MEMRA_CUDA_FUSE_MV");
    c->ag->fuse_mv = fm && (!strcmp(fm, "0") || !strcmp(fm, "3")) ? atoi(fm) : 4;
    static_assert(MR_CU_MV_SUBS >= 4, "the kernels take the recorder's four products a launch");
    const char *fp = getenv("MEMRA_CUDA_FUSE_PROMPT");
    c->ag->fuse_prompt = !(fp && !strcmp(fp, "0"));
    const char *fk = getenv("MEMRA_CUDA_FUSE_KV");
    c->ag->fuse_kv = !(fk && !strcmp(fk, "0"));
    const char *fg = getenv("MEMRA_CUDA_FUSE_GLU");
    c->ag->fuse_glu = fg && (!strcmp(fg, "0") || !strcmp(fg, "1")) ? atoi(fg) : 2;
    const char *ft = getenv("MEMRA_CUDA_FUSE_TAIL");
    c->ag->fuse_tail = ft && (!strcmp(ft, "0") || !strcmp(ft, "1") || !strcmp(ft, "2")) ? atoi(ft) : 3;
    const char *fn = getenv("MEMRA_CUDA_FUSE_GNORM");
    c->ag->fuse_gnorm = !(fn && !strcmp(fn, "0"));
    const char *fc = getenv("MEMRA_CUDA_FUSE_CONV");
    c->ag->fuse_conv = !(fc && !strcmp(fc, "0"));
    const char *fs = getenv("MEMRA_CUDA_FUSE_SEGS");
    c->ag->fuse_segs = !(fs && !strcmp(fs, "0"));
    const char *bu = getenv("MEMRA_CUDA_BUSY");
    c->ag->busy = bu && !strcmp(bu, "1");
    const char *se = getenv("MEMRA_CUDA_SCAN_EARLY");
    c->ag->scan_early = !(se && !strcmp(se, "0"));
    const char *tw = getenv("MEMRA_CUDA_TWICE");
    if (tw && *tw)
        twice_parse(c->ag, tw);
    long long v = 0;
    if (mr_cu_env_int(c, "MEMRA_CUDA_L2PF", 0, 2, "0, 1 or 2", &v) > 0)
        c->ag->l2pf = (int)v;
    if (mr_cu_env_int(c, "MEMRA_CUDA_L2PF_MB", 1, 1 << 20, "MiB from 1", &v) > 0)
        c->ag->l2pf_cap = (size_t)v << 20;
    if (mr_cu_env_int(c, "MEMRA_CUDA_L2PF_HINT", 0, 1, "0 or 1", &v) > 0)
        c->ag->l2pf_hint = (int)v;
    if (mr_cu_env_int(c, "MEMRA_CUDA_L2PF_ID", 0, 1, "0 or 1", &v) > 0)
        c->ag->l2pf_id = (int)v;
    if (c->ag->l2pf && !c->ag->pf.open())
        mr_cu_fail(c, "MEMRA_CUDA_L2PF: side stream: %s", cudaGetErrorString(cudaGetLastError()));
    if (mr_cu_env_int(c, "MEMRA_CUDA_BRANCH", 0, 1, "0 or 1", &v) > 0)
        c->ag->branch = (int)v;
    if (c->ag->branch && !c->ag->br.open())
        mr_cu_fail(c, "MEMRA_CUDA_BRANCH: side stream: %s", cudaGetErrorString(cudaGetLastError()));
    be->get_rows = w_get_rows;
    be->matmul = w_matmul;
    be->matmul_id = w_matmul_id;
    if (be->matmul_prompt) be->matmul_prompt = w_matmul_prompt;
    if (be->matmul_id_prompt) be->matmul_id_prompt = w_matmul_id_prompt;
    if (be->moe_ffn_prompt) be->moe_ffn_prompt = w_moe_ffn_prompt;
    if (be->attention_prompt) be->attention_prompt = w_attention_prompt;
    be->rmsnorm = w_rmsnorm;
    be->add_rmsnorm = w_add_rmsnorm;
    be->rope = w_rope;
    if (be->qk_norm_rope)
        be->qk_norm_rope = w_qk_norm_rope;
    be->kv_store = w_kv_store;
    be->attention = w_attention;
    be->kv_store_multi = w_kv_store_multi;
    be->attention_multi = w_attention_multi;
    be->swiglu = w_swiglu;
    be->add = w_add;
    be->moe_route = w_moe_route;
    be->moe_combine = w_moe_combine;
    be->argmax = w_argmax;
    be->copy_2d = w_copy_2d;
    be->sigmoid_mul = w_sigmoid_mul;
    be->conv1d_silu = w_conv1d_silu;
    be->gdn_scan = w_gdn_scan;
    if (be->sample) be->sample = w_sample;
}

void mr_cu_autograph_free(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    if (!c->ag)
        return;
    mr_cu_autograph_forget(c);
    busy_collect(c->ag, true);
    for (auto *v : {&c->ag->busy_wait, &c->ag->busy_spare})
        for (auto &p : *v) {
            cudaEventDestroy(p.first);
            cudaEventDestroy(p.second);
        }
    c->ag->pf.close();
    c->ag->br.close();
    if (c->ag->l2pf)
        fprintf(stderr, "MEMRA_CUDA_L2PF=%d: %ld prefetch launches in %ld graph captures (at most %zu MiB each, hint %d)\n",
                c->ag->l2pf, c->ag->pf_launches, c->ag->captures, c->ag->l2pf_cap >> 20, c->ag->l2pf_hint);
    if (!c->ag->twice.empty())
        fprintf(stderr, "MEMRA_CUDA_TWICE: %ld launches made twice, %ld of them in %ld graph captures\n",
                c->ag->twice_done, c->ag->twice_captured, c->ag->captures);
    if (c->ag->prof) {
        double all = 0;
        for (auto &t : c->ag->totals) all += t.second.first;
        fprintf(stderr,
                "cuda op profile (event-timed, no graphs): %.3f ms in all; %ld add+rmsnorm fused; "
                "%ld matvec launches saved by sharing; %ld K/V stores in qk_norm_rope; %ld swiglus in their "
                "products; %ld ops in mixture-layer tails; %ld gated norms in one launch; %ld convolutions in "
                "their products; %ld sequences' convolutions and scans in shared launches; %ld scans with "
                "their state loaded early; %ld prompt products inside another's GEMM; %ld products on the "
                "operand a tail wrote\n",
                all, c->ag->fused, c->ag->mv_fused, c->ag->kv_fused, c->ag->glu_fused, c->ag->tail_fused,
                c->ag->gnorm_fused, c->ag->conv_fused, c->ag->segs_fused, c->ag->scans_early, c->ag->prompt_fused,
                c->xmd_pre_used);
        std::vector<std::pair<double, std::string>> v;
        for (auto &t : c->ag->totals) v.push_back({t.second.first, t.first});
        std::sort(v.rbegin(), v.rend());
        for (auto &e : v) {
            auto &t = c->ag->totals[e.second];
            fprintf(stderr, "  %9.3f ms %5.1f%% %7ld calls %8.2f us/call  %s\n", t.first,
                    100.0 * t.first / all, t.second, 1e3 * t.first / t.second, e.second.c_str());
        }
    }
    c->note_launches = false;
    delete c->ag;
    c->ag = NULL;
}

void mr_cu_autograph_forget(mr_cu_ctx *c)
{
    if (!c->ag)
        return;
    for (auto &en : c->ag->cache) cudaGraphExecDestroy(en.ex);
    c->ag->cache.clear();
    c->ag->last_sig.clear();
}

extern "C" void mr_cu_autograph_stats(mr_backend *be, long *captures, long *replays)
{
    mr_cu_ctx *c = mr_cu(be);
    *captures = c->ag ? c->ag->captures : 0;
    *replays = c->ag ? c->ag->replays : 0;
}

extern "C" int mr_cu_busy(mr_backend *be, int reset, mr_cu_busy_stats *out)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_auto *a = c->ag;
    if (!a || !a->busy)
        return 0;
    busy_collect(a, true);
    *out = (mr_cu_busy_stats){a->busy_ms, a->record_ms, a->flush_ms, a->busy_flushes};
    if (reset) {
        a->busy_ms = a->record_ms = a->flush_ms = 0;
        a->busy_flushes = 0;
    }
    return 1;
}

extern "C" void mr_cu_autograph_fusions(mr_backend *be, mr_cu_fusions *f)
{
    mr_cu_ctx *c = mr_cu(be);
    memset(f, 0, sizeof *f);
    if (!c->ag)
        return;
    f->mv = c->ag->mv_fused;
    f->prompt = c->ag->prompt_fused;
    f->kv = c->ag->kv_fused;
    f->glu = c->ag->glu_fused;
    f->tail = c->ag->tail_fused;
    f->gnorm = c->ag->gnorm_fused;
    f->conv = c->ag->conv_fused;
    f->segs = c->ag->segs_fused;
    f->scan_early = c->ag->scans_early;
    f->xq = c->xmd_pre_used;
}

extern "C" long mr_cu_autograph_nodes(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    return c->ag ? c->ag->nodes : 0;
}

extern "C" long mr_cu_l2pf_launches(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    return c->ag ? c->ag->pf_launches : 0;
}

extern "C" long mr_cu_branch_forks(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    return c->ag ? c->ag->br_forks : 0;
}

extern "C" void mr_cu_profile_reset(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    if (c->ag && c->ag->prof) {
        mr_cu_flush(be);
        c->ag->totals.clear();
    }
}

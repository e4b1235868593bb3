/* The sample op: worker/sample.c's pipeline on rows of logits in device
 * memory, one block per row, no sort of the vocabulary.
 *
 * Per row: the penalty table takes the step's new ids and the penalties
 * are applied in place (float32, the host's operations in the host's
 * order); one pass finds the largest logit (lowest id), the non-NaN count
 * and, when a selection follows, the first radix histogram.  Then:
 *   - greedy: that id;
 *   - top_k <= CAP candidates (or a nucleus that fits in CAP): a radix
 *     selection by count finds the k-th of the ranking (logit descending,
 *     id ascending: 11+11+10 key bits, then the ids among equal keys), the
 *     k candidates go to shared memory, where weights, min_p, top_p (a sort
 *     of <= CAP candidates by rank and a prefix sum) and the draw (sorted by
 *     id, a prefix sum) are exact up to the order of float64 additions;
 *   - otherwise the whole row: top_k by count selection, top_p by a radix
 *     selection weighted by float64 weights, and the draw in three levels
 *     (per-warp segment sums, per-warp sub-segment sums, one warp walking
 *     rows of 128 in id order).
 * Weights are exp((l - max) / T) in float64 as on the host (exp may differ
 * from glibc's in the last bit); sums are float64 in another order, so a
 * pick can differ from the host's only where u * total lies within a few
 * ulp-sized relative errors (about 1e-10 of the total at worst) of a CDF
 * boundary or the top_p goal of a cumulative head sum. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_common.cuh"

#define ST 512            /* threads per row */
#define NWARP (ST / 32)
#define CAP 2048          /* candidates held in shared memory (4 a thread) */
#define NB 2048           /* radix bins (11 bits) */
#define MAX_DIM (1 << 22) /* ids fit two 11-bit digits */

struct cut_t {
    uint32_t key; /* elements ranked above: key greater, or key equal and id <= idcut */
    int idcut;
};

struct smem_t {
    union {
        struct { int cnt[NB]; double wsum[NB]; } h;
        struct { uint32_t key[CAP]; int32_t id[CAP]; double w[CAP]; } c;
    } u;
    double incl[ST];     /* block scans: inclusive sum up to each thread */
    double dred[NWARP];
    float fred[NWARP];
    int ired[NWARP], ired2[NWARP];
    int first;           /* the first thread whose cumulative reaches a target */
    int ncand;
    /* a search's result */
    int r_found, r_bin, r_idx;
    double r_rem;
    int r_cnt;
};

/* Ranking key: larger logit, larger key; -0 and +0 equal (as the host's
 * float comparisons have them).  Not for NaN. */
__device__ __forceinline__ uint32_t fkey(float l)
{
    uint32_t b = __float_as_uint(l == 0.0f ? 0.0f : l);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float unkey(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ bool in_cut(const cut_t &c, uint32_t key, int id)
{
    return key > c.key || (key == c.key && id <= c.idcut);
}
/* Every non-NaN element (no key is 0). */
__device__ __forceinline__ cut_t cut_all() { return {0u, 0x7fffffff}; }

/* Elements i..i+3 of a row (i a multiple of 4); past dim: NaN, never used. */
__device__ __forceinline__ float4 ld4(const float *row, int dim, bool vec, int i)
{
    if (vec && i + 3 < dim)
        return *(const float4 *)(row + i);
    float4 v;
    v.x = i < dim ? row[i] : NAN;
    v.y = i + 1 < dim ? row[i + 1] : NAN;
    v.z = i + 2 < dim ? row[i + 2] : NAN;
    v.w = i + 3 < dim ? row[i + 3] : NAN;
    return v;
}

/* Loads in flight per thread in a pass: one block reads a whole row, so
 * its speed is what it keeps in flight (the passes wait on memory). */
#define UNROLL 8

/* f(i, l) for every element of the row, in no particular order. */
template <class F>
__device__ __forceinline__ void pass(const float *row, int dim, bool vec, F f)
{
    const int nch = (dim + 3) >> 2;
    for (int c0 = threadIdx.x; c0 < nch; c0 += UNROLL * ST) {
        float4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            int c = c0 + k * ST;
            v[k] = c < nch ? ld4(row, dim, vec, c * 4) : make_float4(NAN, NAN, NAN, NAN);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            int c = c0 + k * ST, i = c * 4;
            if (c >= nch) break;
            f(i, v[k].x);
            if (i + 1 < dim) f(i + 1, v[k].y);
            if (i + 2 < dim) f(i + 2, v[k].z);
            if (i + 3 < dim) f(i + 3, v[k].w);
        }
    }
}

/* f(i, l) for the elements [a, b) by one warp, rows of 128 in id order
 * (a a multiple of 4): lane l holds a + 128 j + 4 l .. +3; UNROLL rows
 * loaded at a time. */
template <class F>
__device__ __forceinline__ void warp_rows(const float *row, int dim, bool vec, int a, int b, F f)
{
    const int lane = threadIdx.x & 31, end = b < dim ? b : dim;
    for (int base = a; base < b; base += 128 * UNROLL) {
        float4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            int i = base + 128 * k + lane * 4;
            v[k] = i < b ? ld4(row, end, vec, i) : make_float4(NAN, NAN, NAN, NAN);
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++)
            if (base + 128 * k < b) f(base + 128 * k, base + 128 * k + lane * 4, v[k]);
    }
}

__device__ __forceinline__ double warp_dsum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int warp_imax(int v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int warp_isum(int v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* Inclusive prefix sum over the lanes. */
__device__ __forceinline__ double warp_dscan(double v)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    return v;
}

__device__ double block_dsum(smem_t &sh, double v)
{
    v = warp_dsum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.dred[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < NWARP; i++) s += sh.dred[i];
    return s;
}

/* Inclusive scan of one value per thread in thread order into sh.incl;
 * returns the total (every thread). */
__device__ double block_scan(smem_t &sh, double v)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    double x = warp_dscan(v);
    __syncthreads();
    if (lane == 31) sh.dred[w] = x;
    __syncthreads();
    double pre = 0.0, tot = 0.0;
    for (int i = 0; i < NWARP; i++) {
        if (i == w) pre = tot;
        tot += sh.dred[i];
    }
    sh.incl[threadIdx.x] = pre + x;
    __syncthreads();
    return tot;
}

/* After block_scan of own: the first thread with something of its own
 * whose inclusive sum reaches target (target <= incl when !strict, target
 * < incl when strict), or ST when none does.  Every thread gets it.  (Sums
 * in another order may round a thread with nothing past the target.) */
__device__ int first_reaching(smem_t &sh, double own, double target, bool strict)
{
    if (threadIdx.x == 0) sh.first = ST;
    __syncthreads();
    double x = sh.incl[threadIdx.x];
    if (own > 0.0 && (strict ? target < x : target <= x)) atomicMin(&sh.first, (int)threadIdx.x);
    __syncthreads();
    return sh.first;
}

/* ---- radix selection ---- */

/* Histogram of the digit (key >> shift) & (nb - 1) over the non-NaN
 * elements whose key matches prefix under mask and pred(i, l, key, w)
 * (which sets w, the weight, when W).  With IDS the digit and prefix are
 * taken from the id instead of the key. */
template <bool W, bool IDS, class P>
__device__ void hist_round(smem_t &sh, const float *row, int dim, bool vec, uint32_t prefix, uint32_t mask,
                           int shift, int nb, P pred)
{
    for (int b = threadIdx.x; b < nb; b += ST) {
        sh.u.h.cnt[b] = 0;
        if (W) sh.u.h.wsum[b] = 0.0;
    }
    __syncthreads();
    pass(row, dim, vec, [&](int i, float l) {
        if (l != l) return;
        uint32_t k = fkey(l), d = IDS ? (uint32_t)i : k;
        if ((d & mask) != prefix) return;
        double w = 0.0;
        if (!pred(i, l, k, w)) return;
        int b = (int)((d >> shift) & (uint32_t)(nb - 1));
        atomicAdd(&sh.u.h.cnt[b], 1);
        if (W) atomicAdd(&sh.u.h.wsum[b], w);
    });
    __syncthreads();
}

/* The bin where the cumulative count (or weight, W) over the bins taken in
 * order (descending when desc) first reaches target: r_bin, r_rem (target
 * less what the bins before it hold), r_cnt (its count).  r_found = 0 when
 * the bins hold less than target (weights that rounded short). */
template <bool W>
__device__ void find_bin(smem_t &sh, int nb, bool desc, double target)
{
    const int per = nb / ST;
    double s = 0.0;
    for (int j = 0; j < per; j++) {
        int b = desc ? nb - 1 - (threadIdx.x * per + j) : threadIdx.x * per + j;
        s += W ? sh.u.h.wsum[b] : (double)sh.u.h.cnt[b];
    }
    block_scan(sh, s);
    int t = first_reaching(sh, s, target, false);
    if (threadIdx.x == 0 && t == ST) sh.r_found = 0;
    if ((int)threadIdx.x == t) {
        double acc = t > 0 ? sh.incl[t - 1] : 0.0;
        int last = -1;
        double last_acc = acc;
        bool found = false;
        for (int j = 0; j < per && !found; j++) {
            int b = desc ? nb - 1 - (t * per + j) : t * per + j;
            double v = W ? sh.u.h.wsum[b] : (double)sh.u.h.cnt[b];
            if (v > 0.0) {
                if (target <= acc + v) {
                    sh.r_bin = b;
                    sh.r_rem = target - acc;
                    sh.r_cnt = sh.u.h.cnt[b];
                    found = true;
                }
                last = b;
                last_acc = acc;
            }
            acc += v;
        }
        if (!found) { /* the thread's own sum rounded otherwise: its last bin */
            sh.r_bin = last;
            sh.r_rem = target - last_acc;
            sh.r_cnt = sh.u.h.cnt[last];
        }
        sh.r_found = 1;
    }
    __syncthreads();
}

/* The id of the rank-th (1-based) smallest id among the elements with key
 * key that pass pred. */
template <class P>
__device__ int select_id(smem_t &sh, const float *row, int dim, bool vec, uint32_t key, int rank, P pred)
{
    uint32_t prefix = 0, mask = 0;
    double r = rank;
    for (int shift = 11; shift >= 0; shift -= 11) {
        hist_round<false, true>(sh, row, dim, vec, prefix, mask, shift, NB, [&](int i, float l, uint32_t k, double &w) {
            return k == key && pred(i, l, k, w);
        });
        find_bin<false>(sh, NB, false, r);
        prefix |= (uint32_t)sh.r_bin << shift;
        mask |= (uint32_t)(NB - 1) << shift;
        r = sh.r_rem;
        __syncthreads();
    }
    return (int)prefix;
}

/* The head of the ranking among the non-NaN elements that pass pred whose
 * size is rank (count selection; hist0: the first round's histogram is
 * already in shared memory). */
template <class P>
__device__ cut_t select_count(smem_t &sh, const float *row, int dim, bool vec, int rank, bool hist0, P pred)
{
    uint32_t prefix = 0, mask = 0;
    double r = rank;
    const int shifts[3] = {21, 10, 0}, bins[3] = {NB, NB, NB / 2};
    int eq = 0;
    for (int k = 0; k < 3; k++) {
        if (k > 0 || !hist0)
            hist_round<false, false>(sh, row, dim, vec, prefix, mask, shifts[k], bins[k], pred);
        find_bin<false>(sh, bins[k], true, r);
        prefix |= (uint32_t)sh.r_bin << shifts[k];
        mask |= (uint32_t)(bins[k] - 1) << shifts[k];
        r = sh.r_rem;
        eq = sh.r_cnt;
        __syncthreads();
    }
    cut_t c = {prefix, 0x7fffffff};
    if ((int)r < eq) /* only some of the equal keys: the lowest ids */
        c.idcut = select_id(sh, row, dim, vec, prefix, (int)r, pred);
    return c;
}

/* The shortest head of the ranking among the elements that pass pred
 * (which gives their weights) whose weights reach goal (top_p). */
template <class P>
__device__ cut_t select_weight(smem_t &sh, const float *row, int dim, bool vec, double goal, P pred)
{
    uint32_t prefix = 0, mask = 0;
    double g = goal;
    const int shifts[3] = {21, 10, 0}, bins[3] = {NB, NB, NB / 2};
    int eq = 0;
    for (int k = 0; k < 3; k++) {
        hist_round<true, false>(sh, row, dim, vec, prefix, mask, shifts[k], bins[k], pred);
        find_bin<true>(sh, bins[k], true, g);
        if (!sh.r_found) { /* the goal is beyond what the sums reach: everything */
            __syncthreads();
            return cut_all();
        }
        prefix |= (uint32_t)sh.r_bin << shifts[k];
        mask |= (uint32_t)(bins[k] - 1) << shifts[k];
        g = sh.r_rem;
        eq = sh.r_cnt;
        __syncthreads();
    }
    /* equal keys have equal weights: how many of them (lowest ids first) */
    double w = 0.0;
    pred(0, unkey(prefix), prefix, w);
    int m = w > 0.0 ? (int)fmin(ceil(g / w), (double)eq) : eq;
    if (m < 1) m = 1;
    while (m > 1 && (double)(m - 1) * w >= g) m--;
    while (m < eq && (double)m * w < g) m++;
    cut_t c = {prefix, 0x7fffffff};
    if (m < eq)
        c.idcut = select_id(sh, row, dim, vec, prefix, m, pred);
    return c;
}

/* ---- shared-memory candidates ---- */

/* Bitonic sort of c.key/id/w [0, P) (P a power of two): by rank (key
 * descending, id ascending) or by id. */
__device__ void sort_cands(smem_t &sh, int P, bool by_rank)
{
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += ST) {
                int x = i ^ j;
                if (x <= i) continue;
                uint32_t ki = sh.u.c.key[i], kx = sh.u.c.key[x];
                int ii = sh.u.c.id[i], ix = sh.u.c.id[x];
                bool x_first = by_rank ? (kx > ki || (kx == ki && ix < ii)) : ix < ii;
                bool up = (i & k) == 0;
                if (x_first == up) {
                    sh.u.c.key[i] = kx;
                    sh.u.c.key[x] = ki;
                    sh.u.c.id[i] = ix;
                    sh.u.c.id[x] = ii;
                    double t = sh.u.c.w[i];
                    sh.u.c.w[i] = sh.u.c.w[x];
                    sh.u.c.w[x] = t;
                }
            }
            __syncthreads();
        }
}

/* The first candidate (in array order) with a positive weight at which the
 * cumulative weight reaches target(total) (target < cum when strict, else
 * target <= cum); the last positive one when rounding leaves it short; -1
 * when none is positive.  *total: the sum of the weights. */
template <class T>
__device__ int cand_search(smem_t &sh, int P, bool strict, T target_of, double *total)
{
    const int j0 = threadIdx.x * 4;
    double s = 0.0;
    for (int j = j0; j < j0 + 4 && j < P; j++) s += sh.u.c.w[j];
    double tot = block_scan(sh, s);
    *total = tot;
    double target = target_of(tot);
    int t = first_reaching(sh, s, target, strict);
    if (threadIdx.x == 0) sh.r_idx = -1;
    __syncthreads();
    if (t == ST) { /* short: the last positive weight */
        for (int j = j0; j < j0 + 4 && j < P; j++)
            if (sh.u.c.w[j] > 0.0) atomicMax(&sh.r_idx, j);
    } else if ((int)threadIdx.x == t) {
        double acc = t > 0 ? sh.incl[t - 1] : 0.0;
        int last = -1;
        for (int j = j0; j < j0 + 4 && j < P; j++) {
            double w = sh.u.c.w[j];
            if (!(w > 0.0)) continue;
            acc += w;
            last = j;
            if (strict ? target < acc : target <= acc) break;
        }
        sh.r_idx = last;
    }
    __syncthreads();
    return sh.r_idx;
}

/* ---- the kernel ---- */

struct rowp {
    float *L;
    int dim;
    bool vec;
    double mx, inv_t, min_p, lmin;
    bool min_p_on;
};

/* The host's weight of a candidate logit: exp((l - max) / T) in float64,
 * 0 when it underflows or falls below min_p. */
__device__ __forceinline__ double weight(const rowp &p, float l)
{
    double d = __dmul_rn(__dsub_rn((double)l, p.mx), p.inv_t);
    if (!(d > -746.0)) return 0.0; /* underflows to 0 (and NaN) */
    if (p.min_p_on && d < p.lmin) return 0.0; /* below min_p with room to spare */
    double w = exp(d);
    if (!(w > 0.0) || (p.min_p_on && w < p.min_p)) return 0.0;
    return w;
}

/* Penalty table update and the penalties (as mr_sample_penalize). */
__device__ void penalize(const mr_sample_row &q, float *L, int dim, const int32_t *add)
{
    int32_t *ent = q.table, *list = q.table + dim, *len = q.table + 2 * (size_t)dim;
    if (q.reset) {
        for (int i = threadIdx.x; i < dim; i += ST) ent[i] = 0;
        if (threadIdx.x == 0) *len = 0;
        __syncthreads();
    }
    const int np = q.n_add_prompt, na = q.n_add_prompt + q.n_add_gen;
    for (int j = threadIdx.x; j < na; j += ST) {
        int id = add[q.add_off + j];
        if (id < 0 || id >= dim) continue;
        int old = j < np ? atomicOr(&ent[id], 1) : atomicAdd(&ent[id], 2);
        if (old == 0) list[atomicAdd(len, 1)] = id;
    }
    __syncthreads();
    const int n = __ldcg(len);
    const float rep = q.repetition, pres = q.presence, freq = q.frequency;
    const bool rep_on = rep > 0.0f && rep != 1.0f, pf_on = pres != 0.0f || freq != 0.0f;
    for (int j = threadIdx.x; j < n; j += ST) {
        int id = __ldcg(&list[j]);
        int e = __ldcg(&ent[id]), cnt = e >> 1;
        float l = L[id];
        if (rep_on) l = l > 0.0f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
        if (pf_on && cnt > 0) l = __fsub_rn(l, __fadd_rn(pres, __fmul_rn(freq, __int2float_rn(cnt))));
        L[id] = l;
    }
    __syncthreads();
}

/* The draw over every element that pass pred (which gives its weight), in
 * id order, without candidates in shared memory: per-warp segment sums,
 * then per-warp sums within the chosen segment, then one warp walks the
 * chosen part by rows of 128. */
template <class P>
__device__ int draw_full(smem_t &sh, const rowp &p, double u, int fallback, P pred)
{
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    auto part_sums = [&](int a, int span, int end) {
        int lo = a + wp * span, hi = min(lo + span, end);
        double s = 0.0;
        int last = -1;
        warp_rows(p.L, p.dim, p.vec, lo, hi, [&](int base, int i, float4 v) {
            float e[4] = {v.x, v.y, v.z, v.w};
            for (int j = 0; j < 4; j++) {
                double w = 0.0;
                if (i + j < hi && pred(i + j, e[j], w)) {
                    s += w;
                    last = i + j;
                }
            }
        });
        s = warp_dsum(s);
        last = warp_imax(last);
        __syncthreads();
        if (lane == 0) {
            sh.dred[wp] = s;
            sh.ired[wp] = last;
        }
        __syncthreads();
    };
    auto span_of = [](int n) { return ((n + NWARP - 1) / NWARP + 127) / 128 * 128; };
    /* the first of the NWARP sums part_sums left whose running total passes
     * target (-1: none does), the total before it in *cum, the last one
     * with any weight in *last (-1: none) */
    auto crossing = [&](double target, double *cum, int *last) {
        *cum = 0.0;
        *last = -1;
        for (int i = 0; i < NWARP; i++) {
            const double s = sh.dred[i];
            if (!(s > 0.0)) continue;
            *last = i;
            if (target < *cum + s) return i;
            *cum += s;
        }
        return -1;
    };
    /* level 1: the row in NWARP segments */
    const int span1 = span_of(p.dim);
    part_sums(0, span1, p.dim);
    double total = 0.0;
    for (int i = 0; i < NWARP; i++) total += sh.dred[i];
    double target = u * total, cum;
    int last_seg;
    const int seg = crossing(target, &cum, &last_seg);
    if (last_seg < 0) return fallback;
    if (seg < 0) { /* the sums rounded below the target: the last survivor */
        int last = -1;
        for (int i = 0; i < NWARP; i++) last = max(last, sh.ired[i]);
        return last;
    }
    target -= cum;
    /* level 2: that segment in NWARP parts */
    const int a1 = seg * span1, e1 = min(a1 + span1, p.dim), span2 = span_of(e1 - a1);
    part_sums(a1, span2, e1);
    int last_part;
    int part = crossing(target, &cum, &last_part);
    if (last_part < 0) return sh.ired[0] >= 0 ? sh.ired[0] : fallback; /* cannot happen: level 1 saw weight here */
    if (part < 0) {
        part = last_part;
        target = INFINITY; /* the last survivor of that part */
    } else {
        target -= cum;
    }
    /* level 3: warp 0 walks that part by rows of 128 */
    const int a2 = a1 + part * span2, e2 = min(a2 + span2, e1);
    __syncthreads();
    if (wp == 0) {
        int pick = -1, last = -1;
        double rem = target;
        for (int base = a2; base < e2 && pick < 0; base += 128) {
            int i = base + lane * 4;
            float4 v = i < e2 ? ld4(p.L, e2, p.vec, i) : make_float4(NAN, NAN, NAN, NAN);
            float e[4] = {v.x, v.y, v.z, v.w};
            double w[4];
            double ls = 0.0;
            int llast = -1;
            for (int j = 0; j < 4; j++) {
                w[j] = 0.0;
                if (i + j < e2 && pred(i + j, e[j], w[j])) {
                    ls += w[j];
                    llast = i + j;
                } else {
                    w[j] = 0.0;
                }
            }
            double inc = warp_dscan(ls);
            double before = __shfl_up_sync(0xffffffffu, inc, 1);
            if (lane == 0) before = 0.0;
            double row_total = __shfl_sync(0xffffffffu, inc, 31);
            last = max(last, warp_imax(llast));
            unsigned hit = __ballot_sync(0xffffffffu, rem < inc && ls > 0.0);
            if (hit) {
                int hl = __ffs(hit) - 1;
                if (lane == hl) {
                    double acc = before;
                    int got = llast;
                    for (int j = 0; j < 4; j++) {
                        if (!(w[j] > 0.0)) continue;
                        acc += w[j];
                        if (rem < acc) {
                            got = i + j;
                            break;
                        }
                    }
                    sh.r_idx = got;
                }
                pick = 1;
            } else {
                rem -= row_total;
            }
        }
        if (lane == 0 && pick < 0) sh.r_idx = last;
    }
    __syncthreads();
    int r = sh.r_idx;
    return r >= 0 ? r : fallback;
}

__global__ void __launch_bounds__(ST) k_sample(float *logits, int dim, const mr_sample_row *rows,
                                               const int32_t *add, int32_t *ids)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    __shared__ smem_t sh;
    const mr_sample_row q = rows[blockIdx.x];
    if (q.skip) return;
    float *L = logits + (size_t)blockIdx.x * (size_t)dim;
    if (q.table) penalize(q, L, dim, add);
    const bool vec = (dim & 3) == 0 && ((uintptr_t)L & 15) == 0;
    const bool greedy = !(q.temperature > 0.0f);
    const bool top_p_on = q.top_p > 0.0f && q.top_p < 1.0f;
    const bool hist0 = !greedy && ((q.top_k > 0 && q.top_k < dim) || top_p_on);

    /* the largest logit (lowest id), the non-NaN count, the first histogram */
    if (hist0) {
        for (int b = threadIdx.x; b < NB; b += ST) sh.u.h.cnt[b] = 0;
        __syncthreads();
    }
    float mx = -INFINITY;
    int idx = 0x7fffffff, nn = 0;
    pass(L, dim, vec, [&](int i, float l) {
        if (l != l) return;
        nn++;
        if (l > mx || (l == mx && i < idx)) {
            mx = l;
            idx = i;
        }
        if (hist0) atomicAdd(&sh.u.h.cnt[fkey(l) >> 21], 1);
    });
    {
        const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, mx, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (om > mx || (om == mx && oi < idx)) {
                mx = om;
                idx = oi;
            }
        }
        nn = warp_isum(nn);
        if (lane == 0) {
            sh.fred[wp] = mx;
            sh.ired[wp] = idx;
            sh.ired2[wp] = nn;
        }
        __syncthreads();
        mx = sh.fred[0];
        idx = sh.ired[0];
        nn = 0;
        for (int i = 0; i < NWARP; i++) {
            float om = sh.fred[i];
            int oi = sh.ired[i];
            if (om > mx || (om == mx && oi < idx)) {
                mx = om;
                idx = oi;
            }
            nn += sh.ired2[i];
        }
        __syncthreads();
    }
    int32_t *out = ids + blockIdx.x;
    if (greedy) { /* as mr_sample_argmax: 0 when every logit is NaN */
        if (threadIdx.x == 0) *out = nn ? idx : 0;
        return;
    }
    if (nn == 0 || mx == -INFINITY) { /* as the host: nothing finite to weigh */
        if (threadIdx.x == 0) *out = 0;
        return;
    }
    if (mx == INFINITY) {
        if (threadIdx.x == 0) *out = idx;
        return;
    }
    rowp p;
    p.L = L;
    p.dim = dim;
    p.vec = vec;
    p.mx = (double)mx;
    p.inv_t = 1.0 / (double)q.temperature;
    p.min_p_on = q.min_p > 0.0f;
    p.min_p = (double)q.min_p;
    p.lmin = p.min_p_on ? log(p.min_p) - 1e-6 : -INFINITY;
    const int K = q.top_k > 0 && q.top_k < nn ? q.top_k : nn;
    const bool topk_cut = K < nn;
    auto any = [](int, float, uint32_t, double &) { return true; };

    int pick = -1;
    double known_total = -1.0;
    if (K <= CAP || (!topk_cut && top_p_on)) {
        /* the K candidates (or the CAP best, whose head may hold the nucleus)
         * in shared memory */
        const int C = K <= CAP ? K : CAP;
        const cut_t cc = C < nn ? select_count(sh, L, dim, vec, C, hist0, any) : cut_all();
        __syncthreads();
        if (threadIdx.x == 0) sh.ncand = 0;
        __syncthreads();
        pass(L, dim, vec, [&](int i, float l) {
            if (l != l) return;
            uint32_t k = fkey(l);
            if (!in_cut(cc, k, i)) return;
            int s = atomicAdd(&sh.ncand, 1);
            if (s < CAP) {
                sh.u.c.key[s] = k;
                sh.u.c.id[s] = i;
            }
        });
        __syncthreads();
        const int n = min(sh.ncand, CAP);
        int P = 1;
        while (P < n) P <<= 1;
        for (int j = threadIdx.x; j < P; j += ST) {
            if (j < n) {
                sh.u.c.w[j] = weight(p, unkey(sh.u.c.key[j]));
            } else {
                sh.u.c.key[j] = 0u;
                sh.u.c.id[j] = 0x7fffffff;
                sh.u.c.w[j] = 0.0;
            }
        }
        __syncthreads();
        bool ok = true;
        if (top_p_on) {
            double total = 0.0;
            if (C < K) { /* the goal needs the weight of every candidate */
                double s = 0.0;
                pass(L, dim, vec, [&](int i, float l) {
                    if (l == l) s += weight(p, l);
                });
                total = block_dsum(sh, s);
                known_total = total;
            }
            sort_cands(sh, P, true);
            double tot_c;
            const double tp = (double)q.top_p;
            int cut = cand_search(sh, P, false, [&](double t) { return tp * (C < K ? total : t); }, &tot_c);
            if (C == K) total = tot_c;
            const double goal = tp * total;
            /* the head reached the goal when the cut is within it (a short
             * sum gives the last positive candidate) */
            if (C < K && !(goal <= tot_c)) ok = false;
            if (ok)
                for (int j = threadIdx.x; j < P; j += ST)
                    if (j > cut) sh.u.c.w[j] = 0.0;
            __syncthreads();
        }
        if (ok) {
            sort_cands(sh, P, false);
            double tot;
            const double u = q.u;
            int j = cand_search(sh, P, true, [&](double t) { return u * t; }, &tot);
            pick = j >= 0 ? sh.u.c.id[j] : idx;
        }
        __syncthreads();
    }
    if (pick < 0) {
        /* the whole row */
        /* (with top_k, the compact branch did not run: the first histogram
         * is still there) */
        const cut_t ck = topk_cut ? select_count(sh, L, dim, vec, K, hist0, any) : cut_all();
        auto base = [&](int i, float l, uint32_t k, double &w) {
            if (!in_cut(ck, k, i)) return false;
            w = weight(p, l);
            return w > 0.0;
        };
        cut_t cp = cut_all();
        if (top_p_on) {
            double total = known_total;
            if (total < 0.0) {
                double s = 0.0;
                pass(L, dim, vec, [&](int i, float l) {
                    double w;
                    if (l == l && base(i, l, fkey(l), w)) s += w;
                });
                total = block_dsum(sh, s);
            }
            cp = select_weight(sh, L, dim, vec, (double)q.top_p * total, base);
        }
        pick = draw_full(sh, p, q.u, idx, [&](int i, float l, double &w) {
            if (l != l) return false;
            uint32_t k = fkey(l);
            return in_cut(cp, k, i) && base(i, l, k, w);
        });
    }
    if (threadIdx.x == 0) *out = pick;
}

static void cu_sample(mr_backend *be, float *logits, int n, int dim, const mr_sample_row *rows,
                      const int32_t *add, int32_t *ids)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0)
        return;
    if (dim <= 0 || dim > MAX_DIM) {
        mr_cu_fail(c, "sample: vocabulary of %d ids (at most %d)", dim, MAX_DIM);
        return;
    }
    mr_cu_launch(c, k_sample, n, ST, 0, logits, dim, rows, add, ids);
    MR_CU_LAUNCHED(c, "sample");
}

/* MEMRA_CUDA_SAMPLE=0 leaves sampling to the host (to compare the two). */
void mr_cu_install_sample(mr_backend *be)
{
    const char *e = getenv("MEMRA_CUDA_SAMPLE");
    if (!(e && !strcmp(e, "0")))
        be->sample = cu_sample;
}

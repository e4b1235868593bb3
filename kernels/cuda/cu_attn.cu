/* Paged KV cache store and causal GQA attention over it.
 *
 * Attention is split-K ("flash decoding"): grid (head, token, split); each
 * block walks its slice of the token's positions with an online softmax,
 * writes an unnormalised partial (max, sum, acc[head_dim]), and a second
 * kernel merges the splits.  The slice bounds come from pos[] on the device,
 * so the launch shape does not depend on the position (graph replay).
 *
 * Prompt rows (be->attention_prompt, and other calls of ATT_PREFILL_MIN
 * tokens or more) take a tiled kernel instead: a
 * block holds 32 queries of one head and streams the key/value positions
 * through shared memory in tiles, so each cached K/V row is read once per
 * 32 queries rather than once per query.  By default prompts run on the
 * tensor cores instead (cu_fattn.cu); this kernel is MEMRA_CUDA_ATTN=f32,
 * the float32 reference mode and the hybrids'. */
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_xmp.cuh" /* xmd_il_block_at */
#include "kernels/cuda/cu_mma.cuh"

template <int DT>
__device__ __forceinline__ float kv_ld(const void *base, int64_t i)
{
    if constexpr (DT == MR_KV_F32) return ((const float *)base)[i];
    else if constexpr (DT == MR_KV_F16) return __half2float(((const __half *)base)[i]);
    else return mr_bf2f(((const uint16_t *)base)[i]);
}

/* The block table of token t: the call's one table, or tables[t] in a
 * multi-sequence call (NULL there: skip the token). */
__device__ __forceinline__ const int32_t *tab_of(const int32_t *table, const int32_t *const *tables,
                                                 int t)
{
    return tables ? tables[t] : table;
}

template <int DT>
__global__ void k_kv_store(void *K, void *V, const int32_t *table, const int32_t *const *tables,
                           const float *k, const float *v, const int32_t *pos, int bt, int n_blocks,
                           int kvdim)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    table = tab_of(table, tables, t);
    if (i >= kvdim || !table)
        return;
    const int p = pos[t];
    if (p < 0)
        return;
    const int blk = table[p / bt];
    if (blk < 0 || blk >= n_blocks)
        return;
    const int64_t o = ((int64_t)blk * bt + p % bt) * kvdim + i;
    mr_kv_put<DT>(K, o, k[(int64_t)t * kvdim + i]);
    mr_kv_put<DT>(V, o, v[(int64_t)t * kvdim + i]);
}

static void kv_store_launch(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *block_table,
                            const int32_t *const *tables, const float *k, const float *v,
                            const int32_t *pos, int n)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0)
        return;
    if (layer < 0 || layer >= kv->n_layers || n > 65535) {
        mr_cu_fail(c, "kv_store: layer %d of %d, %d tokens", layer, kv->n_layers, n);
        return;
    }
    const int kvdim = kv->n_kv_heads * kv->head_dim;
    dim3 grid(mr_cu_blocks((size_t)kvdim, 256), n);
#define L(DT) mr_cu_launch(c, k_kv_store<DT>, grid, 256, 0, kv->k[layer], kv->v[layer], block_table, tables, k, v, pos, kv->block_tokens, kv->n_blocks, kvdim)
    if (kv->dtype == MR_KV_F32) L(MR_KV_F32);
    else if (kv->dtype == MR_KV_F16) L(MR_KV_F16);
    else L(MR_KV_BF16);
#undef L
    MR_CU_LAUNCHED(c, "kv_store");
}

static void cu_kv_store(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *block_table,
                        const float *k, const float *v, const int32_t *pos, int n)
{
    kv_store_launch(be, kv, layer, block_table, NULL, k, v, pos, n);
}

static void cu_kv_store_multi(mr_backend *be, mr_kv_cache *kv, int layer,
                              const int32_t *const *tables, const float *k, const float *v,
                              const int32_t *pos, int n)
{
    kv_store_launch(be, kv, layer, NULL, tables, k, v, pos, n);
}

#define ATT_WARPS 4
#define ATT_U 4 /* positions a warp has in flight at once */

/* Partial record per (token, head, split): m, l, then acc[D].
 *
 * A warp walks a contiguous run of its block's slice ATT_U positions at a
 * time: the K and V rows of all ATT_U are loaded before any is used and the
 * ATT_U dot products reduce side by side, so a warp waits for memory once
 * per ATT_U positions instead of twice per position (a position at a time,
 * a 600-position slice cost ~150 us per decode step of 16 sequences). */
/* Positions a split of a P-position context takes: the context cut into at
 * most n_split slices, each of at least cut.lo positions and, while the
 * context has room for AG_SLICES of them, growing up to cut.hi
 * (k_attn_split: 64 and 64).  It depends on P, n_split and the cut only,
 * and those on the model and the card only (not on how many sequences
 * share the step), so a sequence's sums do not depend on its batchmates
 * (DESIGN.md, numerics rules).  Splits past the last slice return at once
 * and write nothing: the merge reads only the attn_used splits of each
 * row, from the same P (an empty slice would add exact zeros, so skipping
 * it changes no bit). */
#define ATT_MIN_CHUNK 64 /* k_attn_split */
#define AG_SLICES 8      /* slices a context keeps before they grow past cut.lo */
struct attn_cut {
    int lo, hi; /* lo <= hi (the launchers') */
    int gran;   /* slices a whole number of gran positions, a power of two (1: any; attention_launch) */
};
__device__ __forceinline__ int attn_chunk(int P, int n_split, attn_cut cut)
{
    const int c = (P + n_split - 1) / n_split;
    const int m = min(max((P + AG_SLICES - 1) / AG_SLICES, cut.lo), cut.hi);
    const int k = c > m ? c : m;
    return (k + cut.gran - 1) & -cut.gran;
}
__device__ __forceinline__ int attn_used(int P, int n_split, attn_cut cut)
{
    const int chunk = attn_chunk(P, n_split, cut);
    return P > 0 ? (P + chunk - 1) / chunk : 0;
}

/* The positions [*w0, *w1) warp w of `warps` takes in split s of a
 * P-position context (its slice cut into contiguous runs); false past the
 * last slice (the merge does not read that record: write none). */
__device__ __forceinline__ bool attn_warp_run(int P, int s, int n_split, attn_cut cut, int warps, int w, int *w0,
                                              int *w1)
{
    const int chunk = attn_chunk(P, n_split, cut);
    const int p0 = s * chunk, p1 = min(P, p0 + chunk);
    if (p0 >= P)
        return false;
    const int per = (p1 - p0 + warps - 1) / warps;
    *w0 = p0 + w * per;
    *w1 = min(p1, *w0 + per);
    return true;
}

template <int DT, int EPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
k_attn_split(const void *K, const void *V, const int32_t *table, const int32_t *const *tables,
             const float *q, const int32_t *pos, int n_heads, int n_kv_heads, int bt, int n_blocks,
             float scale, int n_split, float *part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    constexpr int D = EPL * 32;
    const int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    table = tab_of(table, tables, t);
    if (!table)
        return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kvdim = n_kv_heads * D;
    int w0, w1; /* this warp's run */
    if (!attn_warp_run(pos[t] + 1, s, n_split, attn_cut{ATT_MIN_CHUNK, ATT_MIN_CHUNK, 1}, ATT_WARPS, w, &w0, &w1))
        return;

    float qv[EPL], acc[EPL];
    const float *qp = q + ((int64_t)t * n_heads + h) * D + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        qv[e] = qp[e] * scale;
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    bool bad = false;
    for (int p = w0; p < w1 && !bad; p += ATT_U) {
        float kr[ATT_U][EPL], vr[ATT_U][EPL], sc[ATT_U];
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            const int pp = p + u < w1 ? p + u : p; /* past the run: a repeat, masked below */
            const int blk = table[pp / bt];
            if (blk < 0 || blk >= n_blocks) {
                bad = true;
                continue;
            }
            const int64_t base = ((int64_t)blk * bt + pp % bt) * kvdim + (int64_t)kvh * D + lane * EPL;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                kr[u][e] = kv_ld<DT>(K, base + e);
                vr[u][e] = kv_ld<DT>(V, base + e);
            }
        }
        if (bad)
            break;
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) d = fmaf(qv[e], kr[u][e], d);
            sc[u] = d;
        }
#pragma unroll
        for (int u = 0; u < ATT_U; u++) sc[u] = mr_warp_sum(sc[u]);
        float mn = m;
#pragma unroll
        for (int u = 0; u < ATT_U; u++)
            if (p + u < w1) mn = fmaxf(mn, sc[u]);
        const float corr = expf(m - mn); /* exp(-inf) = 0 on the first position */
        l *= corr;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[e] *= corr;
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            if (p + u >= w1)
                continue;
            const float pe = expf(sc[u] - mn);
            l += pe;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[e] = fmaf(pe, vr[u][e], acc[e]);
        }
        m = mn;
    }

    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][D];
    __shared__ int sbad;
    if (threadIdx.x == 0) sbad = 0;
    __syncthreads();
    if (bad) sbad = 1;
    if (lane == 0) {
        sm[w] = m;
        sl[w] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) sacc[w][lane * EPL + e] = acc[e];
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < ATT_WARPS; i++) M = fmaxf(M, sm[i]);
    float *out = part + (((int64_t)t * n_heads + h) * n_split + s) * (D + 2);
    const float nan = __int_as_float(0x7fc00000);
    if (threadIdx.x == 0) {
        float L = 0.0f;
        if (M != -INFINITY)
            for (int i = 0; i < ATT_WARPS; i++) L += sl[i] * expf(sm[i] - M);
        out[0] = sbad ? nan : M;
        out[1] = L;
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.0f;
        if (M != -INFINITY)
            for (int i = 0; i < ATT_WARPS; i++) a += sacc[i][d] * expf(sm[i] - M);
        out[2 + d] = a;
    }
}

/* The decode kernel for grouped queries (GQA): a block takes GB query heads
 * that share one K/V head, so each cached K/V row is read once for all GB
 * of them (k_attn_split reads it once per query head), and rows come in
 * whole: a lane loads 8 consecutive elements (16 bytes of a 2-byte cache,
 * 32 of a float32 one), LPR = D / 8 lanes a row, so a warp takes 32 / LPR
 * positions at a time (one per lane group) and AG_U such rounds before it
 * uses any of them.  A lane holds its 8 dimensions of q and of the running
 * output for each of the GB heads; the GB dot products of a position are
 * reduced over the row's lanes by halving (each step sends half of the
 * values still held, so GB - 1 shuffles leave one head's sum a lane), then
 * summed over the lanes left and broadcast.  Each lane group keeps its own
 * online softmax over the positions it took; at the end the groups of a
 * warp, then the warps, are merged in a fixed order.  Splits and partial
 * records as k_attn_split's (attn_chunk, k_attn_merge), with slices of at
 * least one round of the block's warps (ag_cut), so a sequence's sums
 * still depend on its own positions only. */
#define AG_WARPS 4
#define AG_U 2
#define AG_BLOCKS_PER_SM 3 /* held by __launch_bounds__ (<= 170 registers); splits are sized to one wave */

#define AG_AHEAD 2 /* rounds a warp prefetches ahead */

/* The slices' sizes (attn_chunk): at least one round of the block's
 * warps, each lane group one row of each of its U slots (a shorter slice
 * leaves lanes idle in the one round it takes), growing with the context
 * up to c->attn_wide while it keeps AG_SLICES slices.  A token alone
 * loses nothing by that once it has that many slices (run 188: tg128 at
 * depth 512 287.5 against 287.4 with slices of at least 16), while a
 * decode batch takes fewer blocks and records (run 188, the 30B-A3B at
 * C = 16 and ~550 positions, float32 rows: 882 -> 960 output tok/s).  Up
 * to 256 rather than 64 since run 285: each item's set-up and join, not its
 * copies, is what a decode batch's attention spends (an item is a slice and
 * a head group), so fewer, longer items win at depth and in batches, and a
 * context keeps its 8 slices for a lone token (H100: 16 streams at 4,900
 * positions 100.0 -> 92.1 us, one token of the 35B-A3B's heads at 8,192
 * 28.3 -> 23.5, at 1,024 unchanged; MEMRA_CUDA_ATTN_WIDE=N: up to N).  A
 * function of the context, the head size and the cache type alone
 * (MEMRA_CUDA_ATTN_CHUNK=N: at least N positions, 16 the rule before). */
static attn_cut ag_cut(const mr_cu_ctx *c, int D, mr_kv_dtype dt)
{
    if (c->attn_chunk > 0)
        return attn_cut{c->attn_chunk, c->attn_chunk, 1};
    const int ppw = 32 / (D / 8), u = dt == MR_KV_F32 ? AG_U : 2 * AG_U, lo = AG_WARPS * ppw * u;
    return attn_cut{lo, lo > c->attn_wide ? lo : c->attn_wide, 1};
}

/* The 8 elements kv_load8 reads, into L2 (no registers, no wait). */
template <int DT>
__device__ __forceinline__ void kv_prefetch(const void *base, int64_t i)
{
    const char *p = (const char *)base + i * (DT == MR_KV_F32 ? 4 : 2);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* A lane group's rows of one round into L2: positions p, p + PPW, ..
 * (U of them) before w1, this lane's 8 elements at offset col of each
 * K and V row. */
template <int DT, int D, int U>
__device__ __forceinline__ void ag_prefetch(const void *K, const void *V, const int32_t *table, int p, int w1, int bt,
                                            int n_blocks, int64_t col, int kvdim)
{
    constexpr int PPW = 32 / (D / 8);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int pn = p + u * PPW;
        if (pn < w1) {
            const int blk = table[pn / bt];
            if (blk >= 0 && blk < n_blocks) {
                const int64_t base = ((int64_t)blk * bt + pn % bt) * kvdim + col;
                kv_prefetch<DT>(K, base);
                kv_prefetch<DT>(V, base);
            }
        }
    }
}

/* A lane's 8 elements of a K or V row as loaded: float32 as floats, 16-bit
 * types as their 16 raw bytes, converted when used (half the registers, so
 * the 16-bit kernels keep twice the rows in flight in the same room). */
template <int DT> struct kv_row8 {
    uint4 u;
};
template <> struct kv_row8<MR_KV_F32> {
    float v[8];
};

/* Row elements i .. i + 7 (a 16-byte aligned spot of the cache). */
template <int DT>
__device__ __forceinline__ void kv_load8(const void *base, int64_t i, kv_row8<DT> &r)
{
    if constexpr (DT == MR_KV_F32) {
        const float4 a = ((const float4 *)base)[i / 4], b = ((const float4 *)base)[i / 4 + 1];
        r.v[0] = a.x; r.v[1] = a.y; r.v[2] = a.z; r.v[3] = a.w;
        r.v[4] = b.x; r.v[5] = b.y; r.v[6] = b.z; r.v[7] = b.w;
    } else {
        r.u = ((const uint4 *)base)[i / 8];
    }
}

template <int DT>
__device__ __forceinline__ void kv_get8(const kv_row8<DT> &r, float v[8])
{
    if constexpr (DT == MR_KV_F32) {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = r.v[e];
    } else {
        const uint32_t w[4] = {r.u.x, r.u.y, r.u.z, r.u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if constexpr (DT == MR_KV_F16) {
                const float2 f = __half22float2(*(const __half2 *)&w[j]);
                v[2 * j] = f.x;
                v[2 * j + 1] = f.y;
            } else {
                v[2 * j] = __uint_as_float(w[j] << 16);
                v[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
            }
        }
    }
}

/* d[0..GB) of each lane -> out[g] = the sum of d[g] over the LPR lanes of
 * the lane's row group, in every lane of the group (fixed order: the same
 * bits for every position and call). */
template <int GB, int LPR>
__device__ __forceinline__ void ag_row_sums(float (&d)[GB], float (&out)[GB], int lane)
{
    static_assert(GB <= LPR, "a head a lane at least");
    /* halving: at the step with lane bit o, the lanes with it set keep the
     * upper half of their values (plus their partner's upper half), the
     * others the lower half, so the head a lane ends with has bit
     * GB >> (j + 1) set where the lane has bit LPR >> (j + 1) */
    int o = LPR / 2;
#pragma unroll
    for (int c = GB; c > 1; c /= 2, o /= 2) {
        const int half = c / 2;
        const bool up = lane & o;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = up ? d[i] : d[i + half], keep = up ? d[i + half] : d[i];
            d[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (; o >= 1; o /= 2) d[0] += __shfl_xor_sync(0xffffffffu, d[0], o);
    const int base = lane & ~(LPR - 1);
#pragma unroll
    for (int g = 0; g < GB; g++) {
        int off = 0; /* the lane of the group that holds head g */
#pragma unroll
        for (int j = 0; (GB >> (j + 1)) > 0; j++)
            if (g & (GB >> (j + 1))) off += LPR >> (j + 1);
        out[g] = __shfl_sync(0xffffffffu, d[0], base + off);
    }
}

/* A block's per-warp softmax states for its GB heads (running max and sum,
 * and a bad-id flag; the unnormalised outputs, D floats a warp and head,
 * sit in an array beside them): filled by ag_split or ag_split_tc, joined
 * into the split's records by ag_records.  One instance a block whichever
 * of the two a kernel runs.  ag_split keeps its outputs in a static array
 * (ag_shared_acc); ag_split_tc in its K/V tiles, free by then, so that a
 * block of 8 heads at D = 256 stays under the 48 KiB of static shared
 * memory sm_89 allows. */
template <int GB> struct ag_state {
    float sm[AG_WARPS][GB], sl[AG_WARPS][GB];
    int sbad;
};
template <int GB>
__device__ __forceinline__ ag_state<GB> &ag_shared()
{
    __shared__ ag_state<GB> r;
    return r;
}
template <int D, int GB>
__device__ __forceinline__ float *ag_shared_acc()
{
    __shared__ float acc[AG_WARPS * GB * D];
    return acc;
}

/* The warps' states (acc: [AG_WARPS][W][D], W columns of R) joined in
 * warp order into the records of split s of token t, heads h0 .. h0 + GB
 * - 1, from columns c0 .. c0 + GB - 1 (all threads, after the barrier that
 * follows the warps' writes).  A column's sums read that column alone, so
 * a token's records do not depend on what the other columns hold. */
template <int D, int W>
__device__ __forceinline__ void ag_records(const ag_state<W> &R, const float *acc, int GB, int c0, int t, int h0,
                                           int s, int n_heads, int n_split, float *part)
{
    const float nan = __int_as_float(0x7fc00000);
    for (int g = 0; g < GB; g++) {
        const int col = c0 + g;
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < AG_WARPS; i++) M = fmaxf(M, R.sm[i][col]);
        float *out = part + (((int64_t)t * n_heads + h0 + g) * n_split + s) * (D + 2);
        if (threadIdx.x == 0) {
            float L = 0.0f;
            if (M != -INFINITY)
                for (int i = 0; i < AG_WARPS; i++) L += R.sl[i][col] * expf(R.sm[i][col] - M);
            out[0] = R.sbad ? nan : M;
            out[1] = L;
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float a = 0.0f;
            if (M != -INFINITY)
                for (int i = 0; i < AG_WARPS; i++) a += acc[(i * W + col) * D + d] * expf(R.sm[i][col] - M);
            out[2 + d] = a;
        }
    }
}

/* The record of split s of token t (context P) for query heads h0 ..
 * h0 + GB - 1: the work of one block of k_attn_gqa, and of one item of
 * k_attn_gqa_loop (the same code, so the same bits).  All threads of the
 * block call it with the same arguments; a split past the context's last
 * slice writes nothing.  Its shared memory is reused by the next call: the
 * first barrier below comes after every thread's reads of the last one. */
template <int DT, int D, int GB>
__device__ __forceinline__ void ag_split(const void *K, const void *V, const int32_t *table, const float *q,
                                         int t, int h0, int s, int P, int n_heads, int n_kv_heads, int bt,
                                         int n_blocks, float scale, int n_split, attn_cut cut, float *part)
{
    constexpr int LPR = D / 8, PPW = 32 / LPR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, sub = lane % LPR, slot = lane / LPR;
    const int kvh = h0 / (n_heads / n_kv_heads), kvdim = n_kv_heads * D;
    int w0, w1; /* this warp's run */
    if (!attn_warp_run(P, s, n_split, cut, AG_WARPS, w, &w0, &w1))
        return;

    float qv[GB][8], acc[GB][8], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        const float *qp = q + ((int64_t)t * n_heads + h0 + g) * D + sub * 8;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            qv[g][e] = qp[e] * scale;
            acc[g][e] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    bool bad = false;
    /* rounds of U rows a lane group: 16-bit caches hold rows in half the
     * registers, so they take twice the rows a round (a round's bytes in
     * flight as float32's) */
    constexpr int U = DT == MR_KV_F32 ? AG_U : 2 * AG_U;
    /* the rounds before the first one the loop prefetches (AG_AHEAD on),
     * into L2 now, so that no round after the first waits for memory */
#pragma unroll
    for (int a = 1; a < AG_AHEAD; a++)
        ag_prefetch<DT, D, U>(K, V, table, w0 + a * PPW * U + slot, w1, bt, n_blocks, (int64_t)kvh * D + sub * 8, kvdim);
    for (int p = w0; p < w1 && !bad; p += PPW * U) {
        kv_row8<DT> kr[U], vr[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int pp = p + u * PPW + slot;
            ok[u] = pp < w1;
            const int pc = ok[u] ? pp : w0; /* past the run: a repeat, masked below */
            const int blk = table[pc / bt];
            if (blk < 0 || blk >= n_blocks) {
                bad = true;
                ok[u] = false;
                continue;
            }
            const int64_t base = ((int64_t)blk * bt + pc % bt) * kvdim + (int64_t)kvh * D + sub * 8;
            kv_load8<DT>(K, base, kr[u]);
            kv_load8<DT>(V, base, vr[u]);
        }
        bad = __any_sync(0xffffffffu, bad);
        if (bad)
            break;
        /* the rows AG_AHEAD rounds on, into L2 while this round's math runs:
         * a round's loads then wait for L2, not for memory */
        ag_prefetch<DT, D, U>(K, V, table, p + AG_AHEAD * PPW * U + slot, w1, bt, n_blocks, (int64_t)kvh * D + sub * 8,
                              kvdim);
        float sc[U][GB];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float d[GB], k8[8];
            kv_get8<DT>(kr[u], k8);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                float a = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) a = fmaf(qv[g][e], k8[e], a);
                d[g] = a;
            }
            ag_row_sums<GB, LPR>(d, sc[u], lane);
        }
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float mn = m[g];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (ok[u]) mn = fmaxf(mn, sc[u][g]);
            if (mn == -INFINITY) /* no position of this round in this lane group */
                continue;
            const float corr = expf(m[g] - mn); /* exp(-inf) = 0 on the first position */
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] *= corr;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (!ok[u])
                    continue;
                const float pe = expf(sc[u][g] - mn);
                l[g] += pe;
                float v8[8]; /* converted a head at a time: registers over instructions */
                kv_get8<DT>(vr[u], v8);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g][e] = fmaf(pe, v8[e], acc[g][e]);
            }
            m[g] = mn;
        }
    }
    /* the warp's lane groups merged into group 0, in a fixed order */
#pragma unroll
    for (int o = LPR; o < 32; o *= 2) {
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mn = fmaxf(m[g], mo);
            const float a = mn == -INFINITY ? 0.0f : expf(m[g] - mn), b = mn == -INFINITY ? 0.0f : expf(mo - mn);
            l[g] = l[g] * a + lo * b;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                acc[g][e] = acc[g][e] * a + ao * b;
            }
            m[g] = mn;
        }
    }

    ag_state<GB> &R = ag_shared<GB>();
    float *sacc = ag_shared_acc<D, GB>();
    if (threadIdx.x == 0) R.sbad = 0;
    __syncthreads();
    if (bad) R.sbad = 1;
    if (slot == 0) {
#pragma unroll
        for (int g = 0; g < GB; g++) {
            if (sub == 0) {
                R.sm[w][g] = m[g];
                R.sl[w][g] = l[g];
            }
#pragma unroll
            for (int e = 0; e < 8; e++) sacc[(w * GB + g) * D + sub * 8 + e] = acc[g][e];
        }
    }
    __syncthreads();
    ag_records<D, GB>(R, sacc, GB, 0, t, h0, s, n_heads, n_split, part);
}

/* The same records on the tensor cores, for a float16 cache (decode rows
 * at position c->attn_dec_tc or later: attention_launch).  Each warp walks
 * its run of the split (attn_warp_run, as ag_split) in tiles of AGT_BK = 16
 * positions: K and V rows copied into the warp's own shared tiles by
 * cp.async (16 bytes a lane, zero rows past the run), the next tile's rows
 * prefetched into L2 during this one.  Per tile
 *   S^T (16 positions x 8 heads) = K (16 x D) Q^T (D x 8): m16n8k16 MMAs
 *     with K as A (ldmatrix) and q * scale rounded to float16 as B (held in
 *     registers for the whole split; the columns past GB zero);
 *   the online softmax per head (column): a lane holds heads 2c and 2c + 1
 *     at positions g and g + 8; maxima and sums over the 8 lanes of a
 *     column by xor shuffles; P = exp(S - max) rounded to float16, and the
 *     sum taken over the rounded P, so O / l normalises what was multiplied;
 *   O^T (D x 8) += V^T (D x 16) P^T (16 x 8): V^T as A by ldmatrix.trans of
 *     the V rows, P^T as B by transposing P's packed C fragments in
 *     registers (movmatrix), O^T in C fragments (D / 16 x 4 floats a lane).
 * A position is the M row of the MMA and a head its N column, so one tile's
 * S takes D / 16 MMAs for 16 positions of all GB heads (ag_split: 8 float
 * FMAs a lane, a lane group's sums by shuffles and a softmax step per
 * position and head).  The warps' states are joined by ag_records, as
 * ag_split's (the outputs staged in the tiles): the record is the same
 * function of its positions and the cache whatever the batch (an MMA's
 * result for an element depends on its row and column only), rounded as
 * the tensor-core prompt kernel rounds
 * (cu_fattn.cu), with the exponentials in natural units as the merge reads
 * them.  D = 256 walks K and V through one tile (NB 1: a tile pair would
 * leave two blocks an SM); smaller heads keep V's copy in flight during
 * S.
 *
 * A block of GB <= 4 heads leaves columns GB .. 7 of its MMAs zero.  With
 * t2 >= 0 they take the same heads of token t2, whose split s covers the
 * same positions in the same cache blocks (ag_pairable: the tokens of one
 * prefix), so each K/V tile serves both tokens for the MMAs of one: the
 * records of t2 come from columns GB .. 2 GB - 1, each column's sums the
 * ones it has alone (the same bits, kernel-check dectc's streams lines). */
#define AGT_BK 16
template <int D> struct agt_shape {
    static constexpr int LDH = D + 8;           /* float16 row stride: ldmatrix rows in 8 bank groups */
    static constexpr int TILE = AGT_BK * LDH * 2; /* bytes of a K or V tile */
    static constexpr int NB = D >= 256 ? 1 : 2;   /* tiles a warp */
    static constexpr size_t bytes = (size_t)AG_WARPS * NB * TILE;
};

template <int D, int GB>
__device__ __forceinline__ void ag_split_tc(const void *K, const void *V, const int32_t *table, const float *q,
                                            int t, int h0, int s, int P, int n_heads, int n_kv_heads, int bt,
                                            int n_blocks, float scale, int n_split, attn_cut cut, float *part,
                                            unsigned char *smem, int t2 = -1)
{
    typedef agt_shape<D> S;
    constexpr int BK = AGT_BK, LDH = S::LDH, KS = D / 16, CPR = D / 8, NCH = BK * CPR / 32;
    constexpr int LPR = D * 2 / 128, NL = (BK * LPR + 31) / 32; /* 128-byte lines a row; prefetch rounds */
    static_assert(GB <= 8 && D % 64 == 0, "heads are the MMA's 8 columns; rows of whole lines");
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int kvh = h0 / (n_heads / n_kv_heads), kvdim = n_kv_heads * D;
    int w0, w1; /* this warp's run */
    if (!attn_warp_run(P, s, n_split, cut, AG_WARPS, w, &w0, &w1))
        return;
    const uint32_t sK = (uint32_t)__cvta_generic_to_shared(smem) + w * S::NB * S::TILE;
    const uint32_t sV = S::NB == 2 ? sK + S::TILE : sK;
    const char *Kb = (const char *)K + (int64_t)kvh * D * 2, *Vb = (const char *)V + (int64_t)kvh * D * 2;

    /* columns in use: GB heads of token t, then (t2 >= 0) the same heads
     * of token t2 */
    const int NC = t2 >= 0 ? 2 * GB : GB;
    /* B fragments of Q^T: column g (zero from NC), dims 16 ks + 2c, + 1 and
     * 16 ks + 8 + 2c, + 1 */
    uint32_t qb[KS][2];
    {
        const int tq = g < GB ? t : t2 >= 0 && g < NC ? t2 : t, hq = g < GB ? g : g < NC ? g - GB : 0;
        const float *qp = q + ((int64_t)tq * n_heads + h0 + hq) * D + 2 * c;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const float2 x = *(const float2 *)(qp + 16 * ks), y = *(const float2 *)(qp + 16 * ks + 8);
            qb[ks][0] = g < NC ? mr_h2_pack(x.x * scale, x.y * scale) : 0u;
            qb[ks][1] = g < NC ? mr_h2_pack(y.x * scale, y.y * scale) : 0u;
        }
    }
    bool bad = false;
    /* lane r < BK: the cache row of position p0 + r (-1: past the run, or a
     * block id out of range, which bad flags) */
    auto rows = [&](int p0) {
        long long row = -1;
        int b = 0;
        if (lane < BK)
            mr_kv_slot(table, p0 + lane, w1, bt, n_blocks, 0, 1, &row, &b);
        bad |= b != 0;
        return (int)row;
    };
    /* a tile's K or V rows (lane r's row for tile row r) into dst; zeros
     * where there is none */
    auto copy = [&](uint32_t dst, const char *base, int row) {
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int i = lane + 32 * j, r = i / CPR, ch = i % CPR;
            const int rr = __shfl_sync(0xffffffffu, row, r);
            mr_cp16(dst + (r * LDH + ch * 8) * 2, rr < 0 ? base : base + ((int64_t)rr * kvdim + ch * 8) * 2,
                    rr >= 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    /* a tile's K and V rows into L2 */
    auto prefetch = [&](int row) {
#pragma unroll
        for (int j = 0; j < NL; j++) {
            const int i = lane + 32 * j;
            const int rr = __shfl_sync(0xffffffffu, row, (i / LPR) & 31);
            if (i < BK * LPR && rr >= 0) {
                const int64_t o = ((int64_t)rr * kvdim) * 2 + (i % LPR) * 128;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(Kb + o));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(Vb + o));
            }
        }
    };
    /* A fragments of K (ldmatrix): lane l gives position l % 16, dims
     * 8 (l / 16) of a k-step's 16 */
    const uint32_t kaddr = sK + ((lane & 15) * LDH + (lane >> 4) * 8) * 2;
    /* A fragments of V^T (ldmatrix.trans): lane l gives position l % 8 +
     * 8 (l / 16), dims 8 ((l / 8) % 2) of a 16-dim tile */
    const uint32_t vaddr = sV + (((lane & 7) + ((lane >> 4) << 3)) * LDH + ((lane >> 3) & 1) * 8) * 2;

    float o[D / 16][4]; /* O^T: dims 16 mt + g (0, 1) and + 8 (2, 3), heads 2c (even) and 2c + 1 (odd) */
#pragma unroll
    for (int mt = 0; mt < D / 16; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* heads 2c, 2c + 1 */
    int row = w0 < w1 ? rows(w0) : -1;
    if (w0 < w1)
        copy(sK, Kb, row);
    for (int p0 = w0; p0 < w1; p0 += BK) {
        const int pn = p0 + BK;
        const int rown = pn < w1 ? rows(pn) : -1;
        if constexpr (S::NB == 2) {
            copy(sV, Vb, row);
            asm volatile("cp.async.wait_group 1;" ::: "memory"); /* K landed */
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncwarp();
        float st[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* S^T: positions g (0, 1), g + 8 (2, 3); heads 2c, 2c + 1 */
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[4];
            mr_ldsm4(kaddr + ks * 32, a[0], a[1], a[2], a[3]);
            mr_mma16816(st, a, qb[ks][0], qb[ks][1]);
        }
        if constexpr (S::NB == 1) {
            __syncwarp(); /* every lane has read K */
            copy(sV, Vb, row);
        }
        if (pn < w1)
            prefetch(rown);
        if (p0 + g >= w1) st[0] = st[1] = -INFINITY;
        if (p0 + g + 8 >= w1) st[2] = st[3] = -INFINITY;
        float x0 = fmaxf(st[0], st[2]), x1 = fmaxf(st[1], st[3]);
#pragma unroll
        for (int k = 4; k < 32; k *= 2) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, k));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, k));
        }
        const float mn0 = fmaxf(m0, x0), mn1 = fmaxf(m1, x1);
        /* nothing visible yet: p = exp(-inf - 0) = 0 and corr = 0 on a zero O and l */
        const float z0 = mn0 == -INFINITY ? 0.0f : mn0, z1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float c0 = expf(m0 - z0), c1 = expf(m1 - z1); /* 1 exactly when the max stays */
        m0 = mn0;
        m1 = mn1;
        const uint32_t pa = mr_h2_pack(expf(st[0] - z0), expf(st[1] - z1)); /* positions g */
        const uint32_t pb = mr_h2_pack(expf(st[2] - z0), expf(st[3] - z1)); /* positions g + 8 */
        const float2 fa = mr_h2_unpack(pa), fb = mr_h2_unpack(pb);     /* the sum of what is multiplied */
        float s0 = fa.x + fb.x, s1 = fa.y + fb.y;
#pragma unroll
        for (int k = 4; k < 32; k *= 2) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, k);
            s1 += __shfl_xor_sync(0xffffffffu, s1, k);
        }
        l0 = l0 * c0 + s0;
        l1 = l1 * c1 + s1;
        const uint32_t b0 = mr_movt(pa), b1 = mr_movt(pb); /* P^T: positions 2c, 2c + 1 (+ 8) of head g */
        asm volatile("cp.async.wait_group 0;" ::: "memory"); /* V landed */
        __syncwarp();
        if (S::NB == 2 && pn < w1)
            copy(sK, Kb, rown);
        if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) /* a product by 1 changes no bit */
#pragma unroll
            for (int mt = 0; mt < D / 16; mt++) {
                o[mt][0] *= c0;
                o[mt][1] *= c1;
                o[mt][2] *= c0;
                o[mt][3] *= c1;
            }
#pragma unroll
        for (int mt = 0; mt < D / 16; mt++) {
            uint32_t a[4];
            mr_ldsm4t(vaddr + mt * 32, a[0], a[1], a[2], a[3]);
            mr_mma16816(o[mt], a, b0, b1);
        }
        __syncwarp(); /* every lane has read V (and, NB 1, the tile is free for K) */
        if (S::NB == 1 && pn < w1)
            copy(sK, Kb, rown);
        row = rown;
    }
    bad = __any_sync(0xffffffffu, bad);

    /* the outputs into the K/V tiles: every warp is past its walk after the
     * barrier (agt_shape's bytes hold AG_WARPS x W x D floats) */
    constexpr int W = GB <= 4 ? 2 * GB : GB; /* the columns a block may hold */
    ag_state<W> &R = ag_shared<W>();
    float *sacc = (float *)smem;
    static_assert(AG_WARPS * W * D * 4 <= S::bytes, "the join's outputs fit the tiles");
    if (threadIdx.x == 0) R.sbad = 0;
    __syncthreads();
    if (bad) R.sbad = 1;
    const int j0 = 2 * c, j1 = 2 * c + 1;
    if (g == 0) {
        if (j0 < NC) {
            R.sm[w][j0] = m0;
            R.sl[w][j0] = l0;
        }
        if (j1 < NC) {
            R.sm[w][j1] = m1;
            R.sl[w][j1] = l1;
        }
    }
#pragma unroll
    for (int mt = 0; mt < D / 16; mt++) {
        if (j0 < NC) {
            sacc[(w * W + j0) * D + 16 * mt + g] = o[mt][0];
            sacc[(w * W + j0) * D + 16 * mt + g + 8] = o[mt][2];
        }
        if (j1 < NC) {
            sacc[(w * W + j1) * D + 16 * mt + g] = o[mt][1];
            sacc[(w * W + j1) * D + 16 * mt + g + 8] = o[mt][3];
        }
    }
    __syncthreads();
    ag_records<D, W>(R, sacc, GB, 0, t, h0, s, n_heads, n_split, part);
    if (t2 >= 0)
        ag_records<D, W>(R, sacc, GB, GB, t2, h0, s, n_heads, n_split, part);
}

/* A split's records by ag_split, or (TC 1: a float16 cache, the instances
 * launched with agt_shape's dynamic shared memory) by ag_split_tc when its
 * token's position is tc_from or later: which one depends on the position
 * alone, so a token's records do not depend on its batchmates.  TC 2: every
 * row on the tensor cores (tc_from 0), the same records without the float
 * path's registers (113 against 163 at D = 128, four heads), and the
 * instances where a block takes a whole group of 8 heads, which ag_split
 * has no registers for. */
template <int DT, int D, int GB, int TC>
__device__ __forceinline__ void ag_split_at(const void *K, const void *V, const int32_t *table, const float *q,
                                            int t, int h0, int s, int P, int n_heads, int n_kv_heads, int bt,
                                            int n_blocks, float scale, int n_split, attn_cut cut, float *part,
                                            int tc_from, unsigned char *smem)
{
    if constexpr (TC == 2) {
        static_assert(DT == MR_KV_F16, "the tensor-core split reads float16 rows");
        ag_split_tc<D, GB>(K, V, table, q, t, h0, s, P, n_heads, n_kv_heads, bt, n_blocks, scale, n_split, cut, part,
                           smem);
        return;
    } else if constexpr (TC == 1) {
        static_assert(DT == MR_KV_F16, "the tensor-core split reads float16 rows");
        if (P > tc_from) {
            ag_split_tc<D, GB>(K, V, table, q, t, h0, s, P, n_heads, n_kv_heads, bt, n_blocks, scale, n_split, cut,
                               part, smem);
            return;
        }
    }
    ag_split<DT, D, GB>(K, V, table, q, t, h0, s, P, n_heads, n_kv_heads, bt, n_blocks, scale, n_split, cut, part);
}

/* Grid (head group, token, split): a block a split (the one-token step's
 * grid, one wave for one token). */
template <int DT, int D, int GB, int TC>
__global__ void __launch_bounds__(AG_WARPS * 32, AG_BLOCKS_PER_SM)
k_attn_gqa(const void *K, const void *V, const int32_t *table, const int32_t *const *tables,
           const float *q, const int32_t *pos, int n_heads, int n_kv_heads, int bt, int n_blocks,
           float scale, int n_split, attn_cut cut, float *part, int tc_from)
{
    extern __shared__ __align__(16) unsigned char ag_smem[];
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int t = blockIdx.y;
    table = tab_of(table, tables, t);
    if (!table)
        return;
    ag_split_at<DT, D, GB, TC>(K, V, table, q, t, blockIdx.x * GB, blockIdx.z, pos[t] + 1, n_heads, n_kv_heads,
                               bt, n_blocks, scale, n_split, cut, part, tc_from, ag_smem);
}

/* The same records from one wave of blocks (decode batches).  The grid
 * above has a block for every split a context could have (n_split, sized
 * so that one token fills a wave), so a batch of n tokens is n waves of
 * blocks, nearly all of them past their token's last slice at short
 * contexts: each still waits for its token's position before it can
 * leave, ~1 us a wave (16 tokens at ~100 positions: 22.6 us a call, run
 * 185).  Here the splits that hold positions are numbered densely, token
 * by token ((split, head group) within a token), and the blocks of one
 * wave take them in turn; each split is ag_split as there, so each record
 * has the bits the grid writes.  A token's position and block table are
 * read once a block, with the numbering, not again for each of its
 * splits.  At most AGL_MAX_TOK tokens a call. */
#define AGL_MAX_TOK 1024

/* Whether split s of tokens a and b covers the same positions in the same
 * cache blocks (ag_split_tc's pairs): both have tables, the same slice
 * size and the same end of slice s (so the same warp runs), and equal
 * block ids over it.  All threads of the block call it and get the same
 * answer (a barrier: block-uniform calls only). */
__device__ __forceinline__ bool ag_pairable(const int32_t *ta, const int32_t *tb, int Pa, int Pb, int s, int n_split,
                                           attn_cut cut, int bt)
{
    if (!ta || !tb)
        return false;
    const int chunk = attn_chunk(Pa, n_split, cut);
    if (chunk != attn_chunk(Pb, n_split, cut))
        return false;
    const int p0 = s * chunk, p1 = min(Pa, p0 + chunk);
    if (p0 >= p1 || p1 != min(Pb, p0 + chunk))
        return false;
    /* streams of other prefixes part at the slice's first block mostly:
     * every thread reads the same two ids, so no barrier is needed there */
    if (ta[p0 / bt] != tb[p0 / bt])
        return false;
    int differ = 0;
    for (int b = p0 / bt + (int)threadIdx.x; b <= (p1 - 1) / bt; b += blockDim.x) differ |= ta[b] != tb[b];
    return !__syncthreads_or(differ);
}

template <int DT, int D, int GB, int TC>
__global__ void __launch_bounds__(AG_WARPS * 32, AG_BLOCKS_PER_SM)
k_attn_gqa_loop(const void *K, const void *V, const int32_t *table, const int32_t *const *tables,
                const float *q, const int32_t *pos, int n, int n_heads, int n_kv_heads, int bt, int n_blocks,
                float scale, int n_split, attn_cut cut, float *part, int tc_from, int pair)
{
    extern __shared__ __align__(16) unsigned char ag_smem[];
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    __shared__ int first[AGL_MAX_TOK + 1]; /* token t's items are first[t] .. first[t + 1] - 1 */
    __shared__ int ctx[AGL_MAX_TOK];        /* its context (pos[t] + 1) and block table, read once */
    __shared__ const int32_t *tab[AGL_MAX_TOK];
    __shared__ int wsum[AG_WARPS];
    const int HG = n_heads / GB, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (threadIdx.x == 0) first[0] = 0;
    int carry = 0;
    for (int b = 0; b < n; b += AG_WARPS * 32) { /* a block-wide inclusive scan of the items a token */
        const int t = b + threadIdx.x;
        int v = 0;
        if (t < n) {
            tab[t] = tab_of(table, tables, t);
            ctx[t] = pos[t] + 1;
            if (tab[t])
                v = attn_used(ctx[t], n_split, cut) * HG;
        }
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const int u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += u;
        }
        if (lane == 31) wsum[w] = v;
        __syncthreads();
        for (int i = 0; i < w; i++) v += wsum[i];
        if (t < n) first[t + 1] = carry + v;
        for (int i = 0; i < AG_WARPS; i++) carry += wsum[i];
        __syncthreads(); /* wsum is rewritten by the next round */
    }
    const int total = first[n];
    for (int j = blockIdx.x; j < total; j += gridDim.x) {
        int lo = 0, hi = n - 1; /* the token t with first[t] <= j < first[t + 1] */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (first[mid] <= j) lo = mid;
            else hi = mid - 1;
        }
        const int t = lo, r = j - first[t], s = r / HG, hg = r - s * HG;
        if constexpr (TC == 2 && GB <= 4) {
            /* tokens 2i and 2i + 1 whose split s is the same run of the
             * same blocks: the item of 2i writes both records, that of
             * 2i + 1 nothing */
            if (pair) {
                const int a = t & ~1, b = a + 1;
                if (b < n && ag_pairable(tab[a], tab[b], ctx[a], ctx[b], s, n_split, cut, bt)) {
                    if (t == a)
                        ag_split_tc<D, GB>(K, V, tab[a], q, a, hg * GB, s, ctx[a], n_heads, n_kv_heads, bt,
                                           n_blocks, scale, n_split, cut, part, ag_smem, b);
                    __syncthreads();
                    continue;
                }
            }
        }
        ag_split_at<DT, D, GB, TC>(K, V, tab[t], q, t, hg * GB, s, ctx[t], n_heads, n_kv_heads, bt, n_blocks,
                                   scale, n_split, cut, part, tc_from, ag_smem);
        /* ag_split_tc's join read its outputs from the K/V tiles, which the
         * next item's copies overwrite at once (the grid's blocks take one
         * split each and need no barrier there) */
        if constexpr (TC != 0)
            __syncthreads();
    }
}

/* cut: the split kernel's (64 and 64, or ag_cut), so that
 * the records read are exactly those written (attn_used).  At most
 * ATT_MERGE_MAX splits (the launcher's caps; more would give NaN rows). */
#define ATT_MERGE_MAX 128

/* A merge block's rows: up to MERGE_PARTS of them side by side (the
 * operand form below), each merged by its own group of threads exactly as
 * a block of that many threads would merge it alone.  g: this thread's
 * index in its group (tid), the group's threads (nthr) and its row (p). */
#define MERGE_PARTS 4
struct merge_grp {
    int tid, nthr, p;
};
__device__ __forceinline__ merge_grp merge_whole() { return merge_grp{(int)threadIdx.x, (int)blockDim.x, 0}; }

/* The merge of the n_split records at pr into the row o (D values), all
 * threads of the group: each split's weight exp(m_s - M) once, in shared
 * memory (the loop over dimensions used to take n_split exponentials a
 * dimension), then the sums in split order.  Every group of the block
 * takes the same path (its barriers are the block's). */
__device__ __forceinline__ void merge_loop(const float *pr, int n_split, int D, float *o, merge_grp g)
{
    __shared__ float sw_[MERGE_PARTS][ATT_MERGE_MAX];
    __shared__ bool skip_[MERGE_PARTS][ATT_MERGE_MAX];
    __shared__ float sM[MERGE_PARTS], sL[MERGE_PARTS];
    __shared__ int sbad[MERGE_PARTS];
    float *sw = sw_[g.p];
    bool *skip = skip_[g.p];
    if (g.tid == 0) {
        float M = -INFINITY;
        bool bad = n_split > ATT_MERGE_MAX;
        for (int s = 0; s < n_split && s < ATT_MERGE_MAX; s++) {
            float ms = pr[s * (D + 2)];
            bad |= ms != ms;
            M = fmaxf(M, ms);
        }
        sM[g.p] = M;
        sbad[g.p] = bad;
    }
    __syncthreads();
    const float M = sM[g.p];
    for (int s = g.tid; s < n_split && s < ATT_MERGE_MAX; s += g.nthr) {
        const float ms = pr[s * (D + 2)];
        skip[s] = ms == -INFINITY;
        sw[s] = skip[s] ? 0.0f : expf(ms - M);
    }
    __syncthreads();
    if (g.tid == 0) {
        float L = 0.0f;
        for (int s = 0; s < n_split && s < ATT_MERGE_MAX; s++)
            if (!skip[s]) L += pr[s * (D + 2) + 1] * sw[s];
        sL[g.p] = L;
    }
    __syncthreads();
    const float L = sL[g.p];
    const bool bad = sbad[g.p];
    for (int d = g.tid; d < D; d += g.nthr) {
        float a = 0.0f;
        for (int s = 0; s < n_split && s < ATT_MERGE_MAX; s++)
            if (!skip[s]) a += pr[s * (D + 2) + 2 + d] * sw[s];
        /* no visible position (or a bad block id) gives NaN, never a silent zero */
        o[d] = (bad || L == 0.0f) ? __int_as_float(0x7fc00000) : a / L;
    }
}

/* The same merge with every record a thread reads loaded at once: one
 * round trip to L2 instead of merge_loop's four (the maximum, the weights,
 * their sum, the dimensions), each thread forming M, the weights, L and its
 * dimensions' sums itself with merge_loop's operations in its order, so
 * the same bits (kernel-check attn-merge-reg).  At most ATT_MERGE_REG
 * records and two dimensions a thread. */
#define ATT_MERGE_REG 16
__device__ __forceinline__ void merge_reg(const float *pr, int ns, int D, float *o, merge_grp g)
{
    const int d0 = g.tid, d1 = g.tid + g.nthr;
    float mv[ATT_MERGE_REG], lv[ATT_MERGE_REG], av[2][ATT_MERGE_REG];
#pragma unroll
    for (int s = 0; s < ATT_MERGE_REG; s++)
        if (s < ns) {
            const float *r = pr + s * (D + 2);
            mv[s] = r[0];
            lv[s] = r[1];
            av[0][s] = d0 < D ? r[2 + d0] : 0.0f;
            av[1][s] = d1 < D ? r[2 + d1] : 0.0f;
        }
    float M = -INFINITY;
    bool bad = false;
#pragma unroll
    for (int s = 0; s < ATT_MERGE_REG; s++)
        if (s < ns) {
            bad |= mv[s] != mv[s];
            M = fmaxf(M, mv[s]);
        }
    float L = 0.0f, a[2] = {0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < ATT_MERGE_REG; s++)
        if (s < ns && mv[s] != -INFINITY) {
            const float w = expf(mv[s] - M);
            L += lv[s] * w;
            a[0] += av[0][s] * w;
            a[1] += av[1][s] * w;
        }
    if (d0 < D) o[d0] = (bad || L == 0.0f) ? __int_as_float(0x7fc00000) : a[0] / L;
    if (d1 < D) o[d1] = (bad || L == 0.0f) ? __int_as_float(0x7fc00000) : a[1] / L;
}

/* Rows of more records (a context past 16 slices; run 186: ~550 positions
 * at C = 16 took merge_loop) and at most one dimension a thread: the
 * maximum and the NaN flag over the group (thread s reads record s's m;
 * a maximum is exact in any order), then each thread its dimension's sums
 * in split order, ATT_MERGE_REG records a round trip (m, l and its
 * dimension; m read again, the same value), merge_loop's operations in
 * its order: the same bits.  At most as many records as the group has
 * threads. */
__device__ __forceinline__ void merge_wide(const float *pr, int ns, int D, float *o, merge_grp g)
{
    __shared__ float wm_[MERGE_PARTS][32];
    __shared__ int wb_[MERGE_PARTS][32];
    float *wm = wm_[g.p];
    int *wb = wb_[g.p];
    const int lane = g.tid & 31, w = g.tid >> 5, nw = (g.nthr + 31) >> 5;
    float m = -INFINITY;
    int bad = 0;
    if (g.tid < ns) {
        const float ms = pr[g.tid * (D + 2)];
        bad = ms != ms;
        m = fmaxf(m, ms);
    }
#pragma unroll
    for (int k = 16; k >= 1; k /= 2) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
        bad |= __shfl_xor_sync(0xffffffffu, bad, k);
    }
    if (lane == 0) {
        wm[w] = m;
        wb[w] = bad;
    }
    __syncthreads();
    float M = -INFINITY;
    bad = 0;
    for (int i = 0; i < nw; i++) {
        M = fmaxf(M, wm[i]);
        bad |= wb[i];
    }
    const int d = g.tid;
    float L = 0.0f, a = 0.0f;
    for (int s0 = 0; s0 < ns; s0 += ATT_MERGE_REG) {
        float mv[ATT_MERGE_REG], lv[ATT_MERGE_REG], av[ATT_MERGE_REG];
#pragma unroll
        for (int i = 0; i < ATT_MERGE_REG; i++)
            if (s0 + i < ns) {
                const float *r = pr + (s0 + i) * (D + 2);
                mv[i] = r[0];
                lv[i] = r[1];
                av[i] = d < D ? r[2 + d] : 0.0f;
            }
#pragma unroll
        for (int i = 0; i < ATT_MERGE_REG; i++)
            if (s0 + i < ns && mv[i] != -INFINITY) {
                const float wt = expf(mv[i] - M);
                L += lv[i] * wt;
                a += av[i] * wt;
            }
    }
    if (d < D) o[d] = (bad || L == 0.0f) ? __int_as_float(0x7fc00000) : a / L;
}

/* A row's merge by its group.  REG: merge_reg where the row's records fit
 * it, merge_wide where they fit that (the default), else merge_loop. */
template <bool REG> __device__ __forceinline__ void merge_row(const float *pr, int ns, int D, float *o, merge_grp g)
{
    /* the same for the whole block (its rows are one token's) */
    if (REG && ns <= ATT_MERGE_REG && D <= 2 * g.nthr)
        merge_reg(pr, ns, D, o, g);
    else if (REG && ns <= g.nthr && D <= g.nthr)
        merge_wide(pr, ns, D, o, g);
    else
        merge_loop(pr, ns, D, o, g);
}

/* Grid (head, token), 128 threads. */
template <bool REG>
__global__ void __launch_bounds__(128) k_attn_merge(const float *part, const int32_t *const *tables,
                                                    const int32_t *pos, int n_heads, int n_split, attn_cut cut,
                                                    int D, float *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int h = blockIdx.x, t = blockIdx.y;
    if (tables && !tables[t])
        return;
    const float *pr = part + ((int64_t)t * n_heads + h) * n_split * (D + 2);
    float *o = out + ((int64_t)t * n_heads + h) * D;
    merge_row<REG>(pr, attn_used(pos[t] + 1, n_split, cut), D, o, merge_whole());
}

/* The same merges with the o product's operand written after them (the
 * interleaved operand of cu_xmp.cuh, of type T): grid (head group, token),
 * a block the 256 / D heads of one 256-column block of the row, 128
 * threads a head, each head merged by its group as k_attn_merge's block
 * merges it (the same bits), then warp 0 quantizes the block's 256 outputs
 * (xmd_il_block: the bytes k_xmd_quant_il makes of them).  D 64, 128 or
 * 256, heads a whole number of groups (merge_xq_ok). */
template <bool REG, int T>
__global__ void __launch_bounds__(512) k_attn_merge_xq(const float *part, const int32_t *const *tables,
                                                       const int32_t *pos, int n_heads, int n_split, attn_cut cut,
                                                       int D, float *out, uint8_t *xq)
{
    __shared__ __align__(16) uint8_t stage[xmp_blk<T, XMD_PL>()];
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int hb = 256 / D, t = blockIdx.y;
    const merge_grp g{(int)threadIdx.x & 127, 128, (int)threadIdx.x >> 7};
    if (tables && !tables[t])
        return;
    const int h = blockIdx.x * hb + g.p;
    const float *pr = part + ((int64_t)t * n_heads + h) * n_split * (D + 2);
    merge_row<REG>(pr, attn_used(pos[t] + 1, n_split, cut), D, out + ((int64_t)t * n_heads + h) * D, g);
    __syncthreads(); /* the block's outputs are written (and visible to it) */
    if (threadIdx.x < 32)
        xmd_il_block_at<T>(out + ((int64_t)t * n_heads + (int64_t)blockIdx.x * hb) * D, stage, xq, n_heads * D / 256,
                           t, (int)blockIdx.x, (int)threadIdx.x);
}

/* Whether k_attn_merge_xq takes a row of n_heads heads of D. */
static bool merge_xq_ok(int n_heads, int D)
{
    return (D == 64 || D == 128 || D == 256) && n_heads % (256 / D) == 0;
}

/* The o product's operand a decode attention call is asked to write
 * (mr_cu_attention_multi_xq): where, for which type, and whether its merge
 * wrote it. */
struct attn_xq {
    uint8_t *p;
    int type;
    bool done;
};

/* The merge after a split kernel (MEMRA_CUDA_ATTN_MERGE=loop: merge_loop
 * for every row); with an operand asked for (xq not NULL) where
 * k_attn_merge_xq takes the row, that form, and xq->done says so. */
static void merge_launch(mr_cu_ctx *c, const float *part, const int32_t *const *tables, const int32_t *pos,
                         int n_heads, int n, int n_split, attn_cut cut, int D, float *out, attn_xq *xq)
{
    if (xq && merge_xq_ok(n_heads, D)) {
        const dim3 grid((unsigned)(n_heads * D / 256), (unsigned)n);
        const unsigned th = 128u * (unsigned)(256 / D);
#define L(REG, T) mr_cu_launch(c, k_attn_merge_xq<REG, T>, grid, th, 0, part, tables, pos, n_heads, n_split, cut, D, out, xq->p)
        if (xq->type == MR_TYPE_IQ4_XS) {
            if (c->attn_merge_reg) L(true, MR_TYPE_IQ4_XS);
            else L(false, MR_TYPE_IQ4_XS);
        } else {
            if (c->attn_merge_reg) L(true, MR_TYPE_Q4_K);
            else L(false, MR_TYPE_Q4_K);
        }
#undef L
        MR_CU_LAUNCHED(c, "attention merge + xmd input");
        xq->done = true;
        return;
    }
    if (c->attn_merge_reg)
        mr_cu_launch(c, k_attn_merge<true>, dim3(n_heads, n), 128, 0, part, tables, pos, n_heads, n_split, cut,
                     D, out);
    else
        mr_cu_launch(c, k_attn_merge<false>, dim3(n_heads, n), 128, 0, part, tables, pos, n_heads, n_split,
                     cut, D, out);
    MR_CU_LAUNCHED(c, "attention merge");
}

#define PF_Q 32             /* queries per prefill block, 4 lanes each */
#define ATT_PREFILL_MIN 64  /* tokens from which a call takes the prefill kernel */

/* Keys deep in a context (a prompt cut into calls at depth): a call's blocks
 * each walked every key before their queries, so a 512-token call at 64k
 * positions was 256 blocks of 4,096 key tiles (runs 78-79, H200: prefill at
 * 64k in 512-token calls 89 s on the 35B-A3B shape, ~20 minutes for 262k).
 * The keys are cut into slices of PF_SLICE positions at fixed places
 * (multiples of PF_SLICE from position 0); worker z of PF_WORKERS blocks of
 * a (query tile, head) walks slices z, z + PF_WORKERS, ... with its own
 * online softmax and writes a record (max, sum, acc[D]) a query; a second
 * kernel (k_attn_prefill_merge) joins a query's records in worker order.
 * A query's sums depend on its position and the keys only (the slices and
 * the workers are constants), so a prompt cut into calls anywhere still
 * meets the same sums; a query before position PF_SLICE has one record and
 * gets the bits of the one-block walk: worker 0 writes its out directly,
 * dividing as that walk did, and the merge leaves it alone.
 * MEMRA_CUDA_PF_SPLIT=0: one block walks all keys (the old launch).  The
 * tensor-core kernel (cu_fattn.cu) cuts its keys the same way.  A launch has
 * gridDim.z = RW workers, the ones that can see keys of its rows (the
 * records a row has room for; a worker past them would find none), and at
 * most PF_ROWS x PF_WORKERS / RW queries: the records of 512 queries x 16
 * heads x 8 workers x 258 floats are 68 MB.  PF_SLICE, PF_WORKERS, PF_ROWS,
 * the launch loop: cu_common.cuh. */

/* Lane `sub` of a query's 4 holds dims sub, sub+4, sub+8, ...: the 4 lanes
 * read 4 adjacent words of a shared K/V row (distinct banks) and the 8
 * queries of a warp read the same row (broadcast). */
template <int DT, int D>
__global__ void __launch_bounds__(PF_Q * 4)
k_attn_prefill(const void *K, const void *V, const int32_t *table, const float *q,
               const int32_t *pos, int n, int n_heads, int n_kv_heads, int bt, int n_blocks,
               float scale, float *out, float *part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    constexpr int DL = D / 4;        /* dims per lane */
    constexpr int KT = 4096 / D;     /* positions per tile: 32 KiB of K and V */
    __shared__ float Ks[KT][D], Vs[KT][D];
    __shared__ int kbad[KT];
    __shared__ int pmax;
    const int h = blockIdx.y, tid = threadIdx.x, qi = tid >> 2, sub = tid & 3;
    const int t = blockIdx.x * PF_Q + qi;
    const int kvh = h / (n_heads / n_kv_heads), kvdim = n_kv_heads * D;
    const int pt = t < n ? pos[t] : -1; /* last visible position; -1: none */
    if (tid == 0) pmax = -1;
    __syncthreads();
    if (sub == 0 && pt >= 0) atomicMax(&pmax, pt);
    float qv[DL], acc[DL];
    if (t < n) {
        const float *qp = q + ((int64_t)t * n_heads + h) * D;
#pragma unroll
        for (int e = 0; e < DL; e++) qv[e] = qp[e * 4 + sub] * scale;
    } else {
#pragma unroll
        for (int e = 0; e < DL; e++) qv[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < DL; e++) acc[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    bool bad = false;
    __syncthreads();
    const int P = pmax + 1;
    /* part NULL: one block (gridDim.z 1) walks every key and writes out;
     * else worker z walks slices z, z + PF_WORKERS, ... (tiles never
     * straddle a slice: PF_SLICE is a multiple of KT) */
    const int z = (int)blockIdx.z, RW = (int)gridDim.z, SL = part ? PF_SLICE : P;
    if (part && z * SL >= P)
        return; /* no key of this worker is visible to the block's queries: no record is read */
    for (int p0 = z * SL; p0 < P; p0 += (p0 + KT) % SL ? KT : (PF_WORKERS - 1) * SL + KT) {
        for (int i = tid; i < KT * D; i += PF_Q * 4) {
            const int j = i / D, d = i % D, p = p0 + j;
            int blk = p < P ? table[p / bt] : 0;
            const bool ok = p < P && blk >= 0 && blk < n_blocks;
            if (d == 0) kbad[j] = p < P && !ok;
            float kx = 0.0f, vx = 0.0f;
            if (ok) {
                const int64_t o = ((int64_t)blk * bt + p % bt) * kvdim + (int64_t)kvh * D + d;
                kx = kv_ld<DT>(K, o);
                vx = kv_ld<DT>(V, o);
            }
            Ks[j][d] = kx;
            Vs[j][d] = vx;
        }
        __syncthreads();
        float sc[KT];
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < KT; j++) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < DL; e++) s = fmaf(qv[e], Ks[j][e * 4 + sub], s);
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            const bool vis = p0 + j <= pt;
            bad |= vis && kbad[j];
            sc[j] = vis ? s : -INFINITY;
            mt = fmaxf(mt, sc[j]);
        }
        const float mn = fmaxf(m, mt);
        if (mn != -INFINITY) {
            const float corr = expf(m - mn); /* 0 while m is still -inf */
            l *= corr;
#pragma unroll
            for (int e = 0; e < DL; e++) acc[e] *= corr;
#pragma unroll
            for (int j = 0; j < KT; j++) {
                const float pj = expf(sc[j] - mn);
                l += pj;
#pragma unroll
                for (int e = 0; e < DL; e++) acc[e] = fmaf(pj, Vs[j][e * 4 + sub], acc[e]);
            }
            m = mn;
        }
        __syncthreads();
    }
    /* a row before PF_SLICE has worker 0's record only: worker 0 writes its
     * out as the merge of that record would, the others nothing */
    if (t < n && part && pt < PF_SLICE) {
        if (z > 0)
            return;
    } else if (t < n && part) { /* the record: max, sum (NaN for a bad block id), acc */
        float *r = part + (((int64_t)t * n_heads + h) * RW + z) * (D + 2);
        if (sub == 0) {
            r[0] = m;
            r[1] = bad ? __int_as_float(0x7fc00000) : l;
        }
#pragma unroll
        for (int e = 0; e < DL; e++) r[2 + e * 4 + sub] = acc[e];
        return;
    }
    if (t < n) {
        float *o = out + ((int64_t)t * n_heads + h) * D;
        /* no visible position (or a bad block id) gives NaN, never a silent zero */
        const bool none = bad || l == 0.0f;
#pragma unroll
        for (int e = 0; e < DL; e++) o[e * 4 + sub] = none ? __int_as_float(0x7fc00000) : acc[e] / l;
    }
}

/* Query t, head blockIdx.y, at or past PF_SLICE: its records of the
 * workers that saw its keys (worker z saw some iff z * PF_SLICE <= pos[t];
 * RW records a row) joined in worker order into out (BASE2: the tensor-core
 * kernel's records, maxima in log2 units, out = acc * (1 / sum); else out =
 * acc / sum).  A row before PF_SLICE is left alone: the prompt kernel wrote
 * it. */
template <bool BASE2>
__global__ void k_attn_prefill_merge(const float *part, const int32_t *pos, int n, int n_heads, int RW, int D,
                                     float *out)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int t = (int)blockIdx.x, h = (int)blockIdx.y;
    if (t >= n || pos[t] < PF_SLICE)
        return;
    const int p = pos[t], used = p / PF_SLICE + 1 < RW ? p / PF_SLICE + 1 : RW;
    const float *r = part + ((int64_t)t * n_heads + h) * RW * (D + 2);
    float *o = out + ((int64_t)t * n_heads + h) * D;
    const float nan = __int_as_float(0x7fc00000);
    auto ex = [](float x) { return BASE2 ? exp2f(x) : expf(x); };
    auto norm = [](float a, float l) { return BASE2 ? a * (1.0f / l) : a / l; };
    float M = -INFINITY;
    for (int z = 0; z < used; z++) M = fmaxf(M, r[z * (D + 2)]);
    float L = 0.0f;
    for (int z = 0; z < used; z++) L = fmaf(r[z * (D + 2) + 1], ex(r[z * (D + 2)] - M), L);
    const bool none = isnan(L) || L == 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.0f;
        for (int z = 0; z < used; z++) a = fmaf(r[z * (D + 2) + 2 + d], ex(r[z * (D + 2)] - M), a);
        o[d] = none ? nan : norm(a, L);
    }
}

float *mr_cu_pf_records(mr_cu_ctx *c, int rows, int rw, int n_heads, int D)
{
    if (!mr_cu_reserve(c, &c->scratch_pfa, (size_t)rows * n_heads * rw * (D + 2) * sizeof(float),
                       "prompt attention records"))
        return NULL;
    return (float *)c->scratch_pfa.p;
}

void mr_cu_pf_merge(mr_cu_ctx *c, const float *part, const int32_t *pos, int n, int rw, int n_heads, int D,
                    bool base2, float *out)
{
    const dim3 grid((unsigned)n, n_heads);
    if (base2) mr_cu_launch(c, k_attn_prefill_merge<true>, grid, 128, 0, part, pos, n, n_heads, rw, D, out);
    else mr_cu_launch(c, k_attn_prefill_merge<false>, grid, 128, 0, part, pos, n, n_heads, rw, D, out);
    MR_CU_LAUNCHED(c, "attention prefill merge");
}

/* The float32 prompt kernel over n queries (mr_cu_pf_launches). */
static void attn_prefill_f32(mr_cu_ctx *c, const mr_kv_cache *kv, int layer, const int32_t *block_table,
                             const float *q, const int32_t *pos, int n, int n_heads, float scale, float *out,
                             int pos_max)
{
    const int D = kv->head_dim;
    mr_cu_pf_launches(c, pos, n, n_heads, D, false, out, pos_max, [&](int r0, int nr, int RW, float *part) {
        const size_t qo = (size_t)r0 * n_heads * D;
        const dim3 grid((unsigned)((nr + PF_Q - 1) / PF_Q), n_heads, RW);
#define L(DT, DD) mr_cu_launch(c, k_attn_prefill<DT, DD>, grid, PF_Q * 4, 0, kv->k[layer], kv->v[layer], block_table, q + qo, pos + r0, nr, n_heads, kv->n_kv_heads, kv->block_tokens, kv->n_blocks, scale, out + qo, part)
#define BY_D(DT)                                           \
    switch (D) {                                           \
    case 32: L(DT, 32); break;                             \
    case 64: L(DT, 64); break;                             \
    case 128: L(DT, 128); break;                           \
    default: L(DT, 256); break;                            \
    }
        if (kv->dtype == MR_KV_F32) { BY_D(MR_KV_F32) }
        else if (kv->dtype == MR_KV_F16) { BY_D(MR_KV_F16) }
        else { BY_D(MR_KV_BF16) }
#undef BY_D
#undef L
        MR_CU_LAUNCHED(c, "attention prefill");
    });
}

int mr_cu_attn_f32_rows(const mr_cu_ctx *c, int D, int pos_first, int n)
{
    if (!mr_cu_attn_tc_fits(D) || c->attn_tc_from == INT_MAX)
        return n;
    if (c->attn_tc_from == 0)
        return 0;
    if (pos_first < 0) /* positions not known to the host: the precise kernel */
        return n;
    const int64_t f = (int64_t)c->attn_tc_from - pos_first;
    return f <= 0 ? 0 : f >= n ? n : (int)f;
}

/* The first position whose decode rows take the tensor-core split
 * (ag_split_tc): c->attn_dec_tc (MEMRA_CUDA_ATTN_DEC_TC), and not before
 * the prompt rows do (c->attn_tc_from: MEMRA_CUDA_ATTN_TC_FROM, the float32
 * reference mode none); INT_MAX: none (a cache other than float16, a head
 * size the kernel has no tiles for). */
static int dec_tc_from(const mr_cu_ctx *c, const mr_kv_cache *kv)
{
    if (c->attn_dec_tc == INT_MAX || c->attn_tc_from == INT_MAX || kv->dtype != MR_KV_F16 ||
        !mr_cu_attn_tc_fits(kv->head_dim))
        return INT_MAX;
    return c->attn_dec_tc > c->attn_tc_from ? c->attn_dec_tc : c->attn_tc_from;
}

/* The tensor-core instances' tiles come on top of their static shared
 * memory (the join's records, and the batch kernel's numbering: past 48
 * KiB in all from D = 128), so each asks for its dynamic size explicitly,
 * once at backend creation (outside any graph capture). */
template <int D, int GB, int TC> static bool agt_allow(void)
{
    const int b = (int)agt_shape<D>::bytes;
    return cudaFuncSetAttribute(k_attn_gqa<MR_KV_F16, D, GB, TC>, cudaFuncAttributeMaxDynamicSharedMemorySize, b) ==
               cudaSuccess &&
           cudaFuncSetAttribute(k_attn_gqa_loop<MR_KV_F16, D, GB, TC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                b) == cudaSuccess;
}

bool mr_cu_attn_dec_init(mr_cu_ctx *c)
{
    if (c->attn_dec_tc == INT_MAX)
        return true;
    bool ok = agt_allow<64, 8, 2>() && agt_allow<128, 8, 2>() && agt_allow<256, 8, 2>();
#define X(TC) \
    ok = ok && agt_allow<64, 1, TC>() && agt_allow<64, 2, TC>() && agt_allow<64, 4, TC>() && \
         agt_allow<128, 1, TC>() && agt_allow<128, 2, TC>() && agt_allow<128, 4, TC>() && \
         agt_allow<256, 1, TC>() && agt_allow<256, 2, TC>() && agt_allow<256, 4, TC>();
    X(1)
    X(2)
#undef X
    if (!ok) {
        cudaGetLastError();
        c->attn_dec_tc = INT_MAX;
        fprintf(stderr, "cuda: the tensor-core decode attention's shared memory opt-in failed: decode attention "
                        "stays on the float kernel\n");
    }
    return ok;
}

/* prompt: the prompt kernels whatever n (be->attention_prompt; pos_first is
 * pos[0] as the host knows it, the rows' positions being pos_first,
 * pos_first + 1, ...; -1 where unknown), else they take calls of one
 * sequence from ATT_PREFILL_MIN queries on.  Which of the two prompt
 * kernels a query gets depends on its position only (c->attn_tc_from), so a
 * call that straddles that position is cut in two there. */
static void attention_launch(mr_backend *be, const mr_kv_cache *kv, int layer,
                             const int32_t *block_table, const int32_t *const *tables,
                             const float *q, const int32_t *pos, int n, int n_heads, float scale,
                             float *out, bool prompt, int pos_first, attn_xq *xq)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n <= 0)
        return;
    const int D = kv->head_dim;
    if (layer < 0 || layer >= kv->n_layers || n_heads <= 0 || n_heads % kv->n_kv_heads ||
        n > 65535 || n_heads > 65535) {
        mr_cu_fail(c, "attention: layer %d of %d, %d heads over %d kv heads, %d tokens", layer,
                   kv->n_layers, n_heads, kv->n_kv_heads, n);
        return;
    }
    if ((prompt || n >= ATT_PREFILL_MIN) && !tables) { /* one sequence's prompt */
        if (D != 32 && D != 64 && D != 128 && D != 256) {
            mr_cu_fail(c, "attention: head_dim %d (supported: 32, 64, 128, 256)", D);
            return;
        }
        const int nf = mr_cu_attn_f32_rows(c, D, prompt ? pos_first : -1, n);
        const bool known = prompt && pos_first >= 0; /* rows at pos_first, pos_first + 1, ... */
        if (nf > 0)
            attn_prefill_f32(c, kv, layer, block_table, q, pos, nf, n_heads, scale, out,
                             known ? pos_first + nf - 1 : -1);
        if (nf < n) { /* the tensor-core kernel (cu_fattn.cu) */
            const size_t o = (size_t)nf * n_heads * D;
            mr_cu_attn_prefill_tc(c, kv, layer, block_table, q + o, pos + nf, n - nf, n_heads, scale, out + o,
                                  known ? pos_first + n - 1 : -1);
        }
        return;
    }
    /* Heads a block of the grouped kernel (k_attn_gqa) takes: up to 4 that
     * share a K/V head (more would cost registers an SM needs to keep
     * enough loads in flight); 0: the per-head kernel (MEMRA_CUDA_ATTN_GQA=0,
     * or a head size it has no lanes for). */
    const int G = n_heads / kv->n_kv_heads;
    int gb = G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    if (!c->attn_gqa || (D != 32 && D != 64 && D != 128 && D != 256) || gb > D / 8)
        gb = 0;
    /* Splits: per-head kernel, enough for one token's heads to cover the
     * SMs four times; grouped kernel, one wave of resident blocks for a
     * token (a second, partial wave would double a deep context's time).
     * The host does not know the positions (they are on the device), and
     * the count is not a function of n: see attn_chunk.  Capped so scratch
     * stays small. */
    int n_split = gb ? AG_BLOCKS_PER_SM * c->n_sm / (n_heads / gb) : (4 * c->n_sm + n_heads - 1) / n_heads;
    /* every row on the tensor cores (ag_split_tc alone): with
     * MEMRA_CUDA_ATTN_DEC_TC_G8 a block takes a whole group of 8 heads,
     * all the columns of its MMAs, so each K/V tile serves 8 heads.  A
     * column's sums read that column alone (as the pairs' do), and the
     * splits stay gb 4's (n_split above), so a row gets the bits of gb 4:
     * by default (=batch) calls of 2+ rows only take it (a lone token near
     * the start of a context is faster in blocks of 4, a decode batch in
     * blocks of 8: GPU-NOTES 142), without a row's result depending on its
     * call. */
    const int tcf = gb ? dec_tc_from(c, kv) : INT_MAX;
    const bool g8 = tcf == 0 && G % 8 == 0 && (c->attn_dec_tc_g8 == 1 || (c->attn_dec_tc_g8 == 2 && n >= 2));
    if (g8)
        gb = 8;
    if (n_split < 1) n_split = 1;
    if (n_split > (gb ? 128 : 32)) n_split = gb ? 128 : 32;
    /* sized for at least 64 tokens, so that decode batches growing step by
     * step do not reallocate it (a reallocation drops the cached graphs) */
    size_t need = (size_t)(n > 64 ? n : 64) * n_heads * n_split * (D + 2) * sizeof(float);
    if (!mr_cu_reserve(c, &c->scratch_attn, need, "attention scratch"))
        return;
    float *part = (float *)c->scratch_attn.p;
    if (gb) {
        attn_cut mc = ag_cut(c, D, kv->dtype);
        /* every row on the tensor cores: slices of whole multiples of a
         * round of the block's warps' tiles (64 positions).  A warp walks
         * the tiles it would anyway (ceil(ceil(chunk / 4) / 16)), so a
         * slice costs the same while there are fewer of them: fewer items,
         * records and merges, and tokens of one prefix whose contexts
         * differ by less than ~64 x the slice count cut theirs in the same
         * places.  Still a function of the context alone; other sums than
         * the rule before (MEMRA_CUDA_ATTN_GRAN=0; an explicit
         * MEMRA_CUDA_ATTN_CHUNK is taken as it is). */
        static_assert(((AG_WARPS * AGT_BK) & (AG_WARPS * AGT_BK - 1)) == 0, "attn_chunk rounds by a mask");
        if (c->attn_gran && c->attn_chunk == 0 && tcf == 0 && D >= 64)
            mc.gran = AG_WARPS * AGT_BK;
        /* a decode batch of attn_loop tokens or more: one wave of blocks
         * taking the splits that hold positions (k_attn_gqa_loop) */
        const bool loop = c->attn_loop > 0 && n >= c->attn_loop && n <= AGL_MAX_TOK;
        const int lblocks = AG_BLOCKS_PER_SM * c->n_sm;
        dim3 ggrid(n_heads / gb, n, n_split);
#define L(DT, DD, GG, TC)                                                                                          \
    do {                                                                                                           \
        const size_t sm = TC ? agt_shape<DD>::bytes : 0;                                                           \
        if (loop)                                                                                                  \
            mr_cu_launch(c, k_attn_gqa_loop<DT, DD, GG, TC>, lblocks, AG_WARPS * 32, sm, kv->k[layer],             \
                         kv->v[layer], block_table, tables, q, pos, n, n_heads, kv->n_kv_heads, kv->block_tokens,  \
                         kv->n_blocks, scale, n_split, mc, part, tcf, (int)c->attn_pair);                          \
        else                                                                                                       \
            mr_cu_launch(c, k_attn_gqa<DT, DD, GG, TC>, ggrid, AG_WARPS * 32, sm, kv->k[layer], kv->v[layer],      \
                         block_table, tables, q, pos, n_heads, kv->n_kv_heads, kv->block_tokens, kv->n_blocks,     \
                         scale, n_split, mc, part, tcf);                                                           \
    } while (0)
#define BY_G(DT, DD, TC)                                   \
    switch (gb) {                                          \
    case 1: L(DT, DD, 1, TC); break;                       \
    case 2: L(DT, DD, 2, TC); break;                       \
    default: L(DT, DD, 4, TC); break;                      \
    }
#define BY_D(DT, TC)                                       \
    switch (D) {                                           \
    case 32: BY_G(DT, 32, 0); break;                       \
    case 64: BY_G(DT, 64, TC); break;                      \
    case 128: BY_G(DT, 128, TC); break;                    \
    default: BY_G(DT, 256, TC); break;                     \
    }
        if (g8) {
            switch (D) {
            case 64: L(MR_KV_F16, 64, 8, 2); break;
            case 128: L(MR_KV_F16, 128, 8, 2); break;
            default: L(MR_KV_F16, 256, 8, 2); break;
            }
        }
        else if (kv->dtype == MR_KV_F32) { BY_D(MR_KV_F32, 0) }
        else if (kv->dtype == MR_KV_F16 && tcf == 0) { BY_D(MR_KV_F16, 2) }
        else if (kv->dtype == MR_KV_F16 && tcf != INT_MAX) { BY_D(MR_KV_F16, 1) }
        else if (kv->dtype == MR_KV_F16) { BY_D(MR_KV_F16, 0) }
        else { BY_D(MR_KV_BF16, 0) }
#undef BY_D
#undef BY_G
#undef L
        MR_CU_LAUNCHED(c, "attention (grouped)");
        merge_launch(c, part, tables, pos, n_heads, n, n_split, mc, D, out, xq);
        return;
    }
    dim3 grid(n_heads, n, n_split);
#define L(DT, EPL) mr_cu_launch(c, k_attn_split<DT, EPL>, grid, ATT_WARPS * 32, 0, kv->k[layer], kv->v[layer], block_table, tables, q, pos, n_heads, kv->n_kv_heads, kv->block_tokens, kv->n_blocks, scale, n_split, part)
#define BY_EPL(DT)                                         \
    switch (D) {                                           \
    case 32: L(DT, 1); break;                              \
    case 64: L(DT, 2); break;                              \
    case 128: L(DT, 4); break;                             \
    case 256: L(DT, 8); break;                             \
    default: mr_cu_fail(c, "attention: head_dim %d (supported: 32, 64, 128, 256)", D); return; \
    }
    if (kv->dtype == MR_KV_F32) { BY_EPL(MR_KV_F32) }
    else if (kv->dtype == MR_KV_F16) { BY_EPL(MR_KV_F16) }
    else { BY_EPL(MR_KV_BF16) }
#undef BY_EPL
#undef L
    MR_CU_LAUNCHED(c, "attention");
    merge_launch(c, part, tables, pos, n_heads, n, n_split, attn_cut{ATT_MIN_CHUNK, ATT_MIN_CHUNK, 1}, D, out, xq);
}

static void cu_attention(mr_backend *be, const mr_kv_cache *kv, int layer,
                         const int32_t *block_table, const float *q, const int32_t *pos, int n,
                         int n_heads, float scale, float *out)
{
    attention_launch(be, kv, layer, block_table, NULL, q, pos, n, n_heads, scale, out, false, -1, NULL);
}

/* Prompt rows: a query's result from the prompt kernels depends on its
 * position and the keys only, not on the other queries of its call (a fully
 * masked key tile leaves the running max, rescales by exactly 1 and adds
 * exact zeros), so a prompt cut into chunks of any size meets the same sums
 * as the whole prompt in one call. */
static void cu_attention_prompt(mr_backend *be, const mr_kv_cache *kv, int layer,
                                const int32_t *block_table, const float *q, const int32_t *pos, int n,
                                int n_heads, float scale, float *out, int pos_first)
{
    attention_launch(be, kv, layer, block_table, NULL, q, pos, n, n_heads, scale, out, true, pos_first, NULL);
}

static void cu_attention_multi(mr_backend *be, const mr_kv_cache *kv, int layer,
                               const int32_t *const *tables, const float *q, const int32_t *pos,
                               int n, int n_heads, float scale, float *out)
{
    attention_launch(be, kv, layer, NULL, tables, q, pos, n, n_heads, scale, out, false, -1, NULL);
}

bool mr_cu_attention_multi_xq(mr_backend *be, const mr_kv_cache *kv, int layer, const int32_t *const *tables,
                              const float *q, const int32_t *pos, int n, int n_heads, float scale, float *out,
                              uint8_t *xq, int xq_type)
{
    attn_xq w = {xq, xq_type, false};
    attention_launch(be, kv, layer, NULL, tables, q, pos, n, n_heads, scale, out, false, -1, &w);
    return w.done;
}

void mr_cu_install_attn(mr_backend *be)
{
    be->kv_store = cu_kv_store;
    be->attention = cu_attention;
    be->kv_store_multi = cu_kv_store_multi;
    be->attention_multi = cu_attention_multi;
    be->attention_prompt = cu_attention_prompt;
}

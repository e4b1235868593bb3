/* Prompt attention on the tensor cores (the default; MEMRA_CUDA_ATTN=f32
 * keeps the float32 kernel of cu_attn.cu).
 *
 * The same function as k_attn_prefill in cu_attn.cu (one sequence's chunk
 * of n queries at positions pos[], causal, GQA, over the paged K/V cache),
 * rounded differently: a block holds FA_Q = 64 queries of one head (4
 * warps, 16 query rows each) and streams tiles of FA_BK key positions
 * through shared memory.  Q (pre-scaled) and each K/V tile are rounded to
 * float16 there; S = Q K^T and O += P V run as 16x16x16 WMMA products with
 * float32 accumulation; the online softmax (running max and sum per row)
 * is float32; P is rounded to float16 for the P V product and the row sum
 * is taken over the rounded P, so O / l normalises exactly what was
 * multiplied.
 *
 * Why float16 cannot overflow here:
 *  - P = exp2(s - running max) lies in [0, 1].
 *  - Q is multiplied by scale * log2(e) (<= 0.18 for head_dim >= 64) before
 *    rounding, and the products are accumulated in float32, so only the
 *    inputs must fit float16 (|x| < 65504): the models that take this path
 *    (Qwen3, Qwen3-MoE) RMS-normalise q and k per head (q_norm / k_norm), so
 *    |q|, |k| are bounded by sqrt(head_dim) times the norm weight (tens at
 *    most), and V is a projection of an RMS-normalised hidden state
 *    (hundreds at most in practice).  A float16 KV cache already holds K/V
 *    in float16.  The hybrids' gated attention normalises q and k the same
 *    way; they ask for float32 products (be->prefer_float32) for accuracy,
 *    and keep the float32 kernel for the first ATTN_TC_FROM_PRECISE
 *    positions of a sequence only (cu_common.cuh says why).
 *    MEMRA_CUDA_GEMM=f32 (the float32 reference mode) turns this kernel off
 *    unless MEMRA_CUDA_ATTN=tc.
 *
 * The output accumulators stay in WMMA fragments across tiles.  Their
 * element-to-(row, column) layout is not specified by the API, so each
 * warp learns it once: it loads a 16x16 matrix holding row*16+col into an
 * accumulator fragment and reads back which element landed where; the
 * per-row rescale (exp2(m_old - m_new)) and the final 1/l then apply per
 * element.  Accumulator fragments of one shape and type share one layout.
 *
 * Deep in a context the keys are cut into slices over several blocks a
 * (query tile, head), as the float32 kernel's (cu_attn.cu, PF_SLICE): each
 * writes a record (max in log2 units, sum, unnormalised acc) a query and
 * mr_cu_pf_merge joins them; a query before position PF_SLICE keeps the
 * one-block bits (acc * (1 / sum)). */
#include <limits.h>
#include <math.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_common.cuh"

using namespace nvcuda;

#define FA_Q 64      /* queries per block: 4 warps of 16 rows */
#define FA_WARPS 4

/* Key positions per tile: 64, or 32 for head_dim 256 (shared memory stays
 * under the 99 KiB a block may have on sm_89 and sm_120). */
template <int D> struct fa_shape {
    static constexpr int BK = D >= 256 ? 32 : 64;
    static constexpr int LDH = D + 8;  /* float16 row stride of Q, K, V (padding spreads banks) */
    static constexpr int LDS = BK + 4; /* float32 row stride of S */
    static constexpr int LDP = BK + 8; /* float16 row stride of P */
    static constexpr size_t bytes = (size_t)(FA_Q + 2 * BK) * LDH * 2 + (size_t)FA_Q * LDS * 4 +
                                    (size_t)FA_Q * LDP * 2 + FA_Q * 4 + BK * 8 + BK * 4 + 16;
};

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fa_acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fa_bt; /* K^T */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fa_b;  /* V */

/* Converts 4 (float32) or 8 (float16 / bfloat16) stored elements at src to
 * float16 at dst; zeros when src is NULL. */
template <int DT>
__device__ __forceinline__ void fa_cvt(__half *dst, const void *src)
{
    if constexpr (DT == MR_KV_F32) {
        float4 v = src ? *(const float4 *)src : make_float4(0.f, 0.f, 0.f, 0.f);
        *(__half2 *)dst = __floats2half2_rn(v.x, v.y);
        *(__half2 *)(dst + 2) = __floats2half2_rn(v.z, v.w);
    } else if constexpr (DT == MR_KV_F16) {
        *(uint4 *)dst = src ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    } else {
        uint4 u = src ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            *(__half2 *)(dst + 2 * i) =
                __floats2half2_rn(__uint_as_float(w[i] << 16), __uint_as_float(w[i] & 0xffff0000u));
    }
}

template <int DT, int D>
__global__ void __launch_bounds__(FA_WARPS * 32)
k_attn_prefill_tc(const void *K, const void *V, const int32_t *table, const float *q,
                  const int32_t *pos, int n, int n_heads, int n_kv_heads, int bt, int n_blocks,
                  float qscale, float *out, float *part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    typedef fa_shape<D> S;
    constexpr int BK = S::BK, LDH = S::LDH, LDS = S::LDS, LDP = S::LDP;
    constexpr int DT16 = D / 16, KT16 = BK / 16;
    constexpr int EPC = DT == MR_KV_F32 ? 4 : 8; /* elements per load chunk */
    constexpr int NE = fa_acc::num_elements;
    extern __shared__ __align__(128) unsigned char fa_smem[]; /* all of it: WMMA wants 32-byte alignment */
    __half *Qs = (__half *)fa_smem;            /* [FA_Q][LDH] */
    __half *Ks = Qs + FA_Q * LDH;              /* [BK][LDH] */
    __half *Vs = Ks + BK * LDH;                /* [BK][LDH] */
    float *Ss = (float *)(Vs + BK * LDH);      /* [FA_Q][LDS] */
    __half *Ps = (__half *)(Ss + FA_Q * LDS);  /* [FA_Q][LDP] */
    float *rowf = (float *)(Ps + FA_Q * LDP);  /* [FA_Q]: rescale factor, then 1/l */
    long long *kofs = (long long *)(rowf + FA_Q); /* [BK] element offset of a key row; -1: none */
    int *kbad = (int *)(kofs + BK);            /* [BK] its block id is out of range */
    int &pmax = kbad[BK];                      /* the block's last visible position */

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * FA_Q; /* the longest rows start first */
    const int h = blockIdx.y;
    const int kvh = h / (n_heads / n_kv_heads), kvdim = n_kv_heads * D;
    const char *Kb = (const char *)K, *Vb = (const char *)V;
    constexpr int ESZ = DT == MR_KV_F32 ? 4 : 2;

    if (tid == 0) pmax = -1;
    for (int i = tid; i < FA_Q * D; i += FA_WARPS * 32) {
        const int r = i / D, d = i % D, t = t0 + r;
        const float x = t < n ? q[((int64_t)t * n_heads + h) * D + d] * qscale : 0.0f;
        Qs[r * LDH + d] = __float2half_rn(x);
    }
    __syncthreads();
    if (tid < FA_Q && t0 + tid < n) atomicMax(&pmax, pos[t0 + tid]);

    /* the row (high bits) and column of each accumulator element */
    float *wS = Ss + w * 16 * LDS;
    for (int i = lane; i < 256; i += 32) wS[(i >> 4) * LDS + (i & 15)] = (float)i;
    __syncwarp();
    int eat[NE]; /* row * 16 + column */
    {
        fa_acc map;
        wmma::load_matrix_sync(map, wS, LDS, wmma::mem_row_major);
#pragma unroll
        for (int e = 0; e < NE; e++) eat[e] = (int)map.x[e];
    }
    __syncwarp();

    /* softmax state: lanes 2r and 2r+1 of warp w own row w*16 + r */
    const int rr = lane >> 1, hf = lane & 1, row = w * 16 + rr;
    const int pt = t0 + row < n ? pos[t0 + row] : -1; /* last visible position; -1: none */
    float m = -INFINITY, l = 0.0f;
    bool bad = false;

    fa_acc o[DT16];
#pragma unroll
    for (int dt = 0; dt < DT16; dt++) wmma::fill_fragment(o[dt], 0.0f);

    __syncthreads();
    const int P = pmax + 1;
    /* part NULL: one block (gridDim.z 1) walks every key and writes out;
     * else worker z walks slices z, z + W, ... of PF_SLICE positions (a
     * multiple of BK) and writes records (cu_attn.cu's k_attn_prefill) */
    const int z = (int)blockIdx.z, W = (int)gridDim.z, SL = part ? PF_SLICE : P;
    if (part && z * SL >= P)
        return; /* no key of this worker is visible to the block's queries: no record is read */
    for (int p0 = z * SL; p0 < P; p0 += (p0 + BK) % SL ? BK : (W - 1) * SL + BK) {
        if (tid < BK) {
            const int p = p0 + tid;
            long long ofs = -1;
            int isbad = 0;
            if (p < P) {
                const int blk = table[p / bt];
                if (blk >= 0 && blk < n_blocks)
                    ofs = ((long long)blk * bt + p % bt) * kvdim + (long long)kvh * D;
                else
                    isbad = 1;
            }
            kofs[tid] = ofs;
            kbad[tid] = isbad;
        }
        __syncthreads();
        for (int i = tid; i < BK * (D / EPC); i += FA_WARPS * 32) {
            const int j = i / (D / EPC), c = (i % (D / EPC)) * EPC;
            const long long ofs = kofs[j];
            fa_cvt<DT>(Ks + j * LDH + c, ofs < 0 ? NULL : Kb + (ofs + c) * ESZ);
            fa_cvt<DT>(Vs + j * LDH + c, ofs < 0 ? NULL : Vb + (ofs + c) * ESZ);
        }
        __syncthreads();

        /* S = Q K^T for this warp's 16 rows */
        {
            fa_acc s[KT16];
#pragma unroll
            for (int j = 0; j < KT16; j++) wmma::fill_fragment(s[j], 0.0f);
#pragma unroll
            for (int k = 0; k < DT16; k++) {
                fa_a a;
                wmma::load_matrix_sync(a, Qs + w * 16 * LDH + k * 16, LDH);
#pragma unroll
                for (int j = 0; j < KT16; j++) {
                    fa_bt b;
                    wmma::load_matrix_sync(b, Ks + j * 16 * LDH + k * 16, LDH);
                    wmma::mma_sync(s[j], a, b, s[j]);
                }
            }
#pragma unroll
            for (int j = 0; j < KT16; j++)
                wmma::store_matrix_sync(wS + j * 16, s[j], LDS, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax of row `row`: this lane takes columns hf, hf+2, ... */
        {
            const float *sr = Ss + row * LDS;
            float sv[BK / 2];
            float mt = -INFINITY;
#pragma unroll
            for (int i = 0; i < BK / 2; i++) {
                const int c = 2 * i + hf;
                const bool vis = p0 + c <= pt;
                bad |= vis && kbad[c];
                sv[i] = vis ? sr[c] : -INFINITY;
                mt = fmaxf(mt, sv[i]);
            }
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
            const float mn = fmaxf(m, mt);
            float corr = 1.0f, ls = 0.0f;
            __half *prow = Ps + row * LDP;
            if (mn == -INFINITY) { /* nothing visible yet */
#pragma unroll
                for (int i = 0; i < BK / 2; i++) prow[2 * i + hf] = __float2half_rn(0.0f);
            } else {
                corr = exp2f(m - mn); /* 0 while m is still -inf */
#pragma unroll
                for (int i = 0; i < BK / 2; i++) {
                    const __half ph = __float2half_rn(exp2f(sv[i] - mn));
                    ls += __half2float(ph);
                    prow[2 * i + hf] = ph;
                }
                m = mn;
            }
            ls += __shfl_xor_sync(0xffffffffu, ls, 1);
            l = l * corr + ls;
            if (hf == 0) rowf[row] = corr;
        }
        __syncwarp();

        /* O = O * corr + P V */
        {
            float cr[NE];
#pragma unroll
            for (int e = 0; e < NE; e++) cr[e] = rowf[w * 16 + (eat[e] >> 4)];
#pragma unroll
            for (int dt = 0; dt < DT16; dt++)
#pragma unroll
                for (int e = 0; e < NE; e++) o[dt].x[e] *= cr[e];
#pragma unroll
            for (int kk = 0; kk < KT16; kk++) {
                fa_a a;
                wmma::load_matrix_sync(a, Ps + w * 16 * LDP + kk * 16, LDP);
#pragma unroll
                for (int dt = 0; dt < DT16; dt++) {
                    fa_b b;
                    wmma::load_matrix_sync(b, Vs + kk * 16 * LDH + dt * 16, LDH);
                    wmma::mma_sync(o[dt], a, b, o[dt]);
                }
            }
        }
        __syncthreads(); /* the next tile overwrites K, V and the offsets */
    }

    /* no visible position (or a bad block id) gives NaN, never a silent zero */
    bad |= __shfl_xor_sync(0xffffffffu, (int)bad, 1) != 0; /* either lane may have seen it */
    if (part) { /* the records: max (log2 units), sum (NaN for a bad block id), acc */
        const size_t RS = (size_t)W * (D + 2);
        if (hf == 0 && t0 + row < n) {
            float *rec = part + ((int64_t)(t0 + row) * n_heads + h) * RS + (size_t)z * (D + 2);
            rec[0] = m;
            rec[1] = bad ? __int_as_float(0x7fc00000) : l;
        }
#pragma unroll
        for (int e = 0; e < NE; e++) {
            const int t = t0 + w * 16 + (eat[e] >> 4);
            if (t >= n) continue;
            float *rec = part + ((int64_t)t * n_heads + h) * RS + (size_t)z * (D + 2) + 2 + (eat[e] & 15);
#pragma unroll
            for (int dt = 0; dt < DT16; dt++) rec[dt * 16] = o[dt].x[e];
        }
        return;
    }
    if (hf == 0) rowf[row] = (bad || l == 0.0f) ? __int_as_float(0x7fc00000) : 1.0f / l;
    __syncwarp();
#pragma unroll
    for (int e = 0; e < NE; e++) {
        const int r = w * 16 + (eat[e] >> 4), t = t0 + r;
        if (t >= n) continue;
        const float f = rowf[r];
        float *orow = out + ((int64_t)t * n_heads + h) * D + (eat[e] & 15);
#pragma unroll
        for (int dt = 0; dt < DT16; dt++) orow[dt * 16] = o[dt].x[e] * f;
    }
}

/* ---- host side ---- */

#define FA_EACH(X)                                                               \
    X(MR_KV_F32, 64) X(MR_KV_F32, 128) X(MR_KV_F32, 256)                         \
    X(MR_KV_F16, 64) X(MR_KV_F16, 128) X(MR_KV_F16, 256)                         \
    X(MR_KV_BF16, 64) X(MR_KV_BF16, 128) X(MR_KV_BF16, 256)

/* At backend creation: MEMRA_CUDA_ATTN "tc" (the default, measured 5.7-6.8x
 * the float32 kernel on an H200, docs/PERFORMANCE.md) or "f32"; unset, the
 * float32 reference mode MEMRA_CUDA_GEMM=f32 gets f32 as well.
 * MEMRA_CUDA_ATTN_TC_FROM=N: queries at position N or later on the tensor
 * cores, earlier ones float32, whatever the model asks.  The kernels need
 * more than the default 48 KiB of dynamic shared memory; the limit is raised
 * here once, outside any graph capture, and only when they may run. */
void mr_cu_attn_init(mr_cu_ctx *c)
{
    const char *m = getenv("MEMRA_CUDA_ATTN");
    const char *g = getenv("MEMRA_CUDA_GEMM");
    const char *q = getenv("MEMRA_CUDA_ATTN_GQA");
    const char *from = getenv("MEMRA_CUDA_ATTN_TC_FROM");
    c->attn_gqa = !(q && !strcmp(q, "0")); /* decode kernel (cu_attn.cu) */
    const char *ps = getenv("MEMRA_CUDA_PF_SPLIT");
    c->pf_split = !(ps && !strcmp(ps, "0")); /* float32 prompt kernel (cu_attn.cu) */
    char *end = NULL;
    const long f = from ? strtol(from, &end, 10) : -1;
    if (from && (end == from || *end || f < 0 || f > INT_MAX)) {
        mr_cu_fail(c, "MEMRA_CUDA_ATTN_TC_FROM '%s': not a position", from);
        return;
    }
    const bool tc = m && !strcmp(m, "tc"), f32 = m && !strcmp(m, "f32");
    c->attn_tc_forced = tc || f32 || from;
    c->attn_tc_from = from ? (int)f : tc ? 0 : f32 || (g && !strcmp(g, "f32")) ? INT_MAX : 0;
    if (c->attn_tc_from == INT_MAX)
        return;
#define X(DT, DD)                                                                                   \
    MR_CU_TRY(c, cudaFuncSetAttribute(k_attn_prefill_tc<DT, DD>,                                    \
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,                  \
                                      (int)fa_shape<DD>::bytes));
    FA_EACH(X)
#undef X
}

void mr_cu_attn_prefill_tc(mr_cu_ctx *c, const mr_kv_cache *kv, int layer,
                           const int32_t *block_table, const float *q, const int32_t *pos, int n,
                           int n_heads, float scale, float *out)
{
    const int D = kv->head_dim;
    const float qscale = scale * 1.4426950408889634f; /* exp(x) = exp2(x log2 e) */
    mr_cu_pf_launches(c, pos, n, n_heads, D, true, out, [&](int r0, int nr, int W, float *part) {
        const size_t qo = (size_t)r0 * n_heads * D;
        const dim3 grid((unsigned)((nr + FA_Q - 1) / FA_Q), n_heads, W);
#define X(DT, DD)                                                                                   \
    if (kv->dtype == DT && D == DD)                                                                 \
        mr_cu_launch(c, k_attn_prefill_tc<DT, DD>, grid, FA_WARPS * 32, fa_shape<DD>::bytes,          \
                     kv->k[layer], kv->v[layer], block_table, q + qo, pos + r0, nr, n_heads,          \
                     kv->n_kv_heads, kv->block_tokens, kv->n_blocks, qscale, out + qo, part);
        FA_EACH(X)
#undef X
        MR_CU_LAUNCHED(c, "attention prefill (tensor cores)");
    });
}

/* Prompt attention on the tensor cores (the default; MEMRA_CUDA_ATTN=f32
 * keeps the float32 kernel of cu_attn.cu).
 *
 * The same function as k_attn_prefill in cu_attn.cu (one sequence's chunk
 * of n queries at positions pos[], causal, GQA, over the paged K/V cache),
 * rounded differently: Q (pre-multiplied by scale * log2(e) in float32)
 * and K/V are rounded to float16; S = Q K^T and O += P V run on the tensor
 * cores with float32 accumulation; the online softmax (running max and sum
 * per row, exp2) is float32; P is rounded to float16 for the P V product
 * and the row sum is taken over the rounded P, so O / l normalises exactly
 * what was multiplied.
 *
 * k_attn_prefill_tc, FlashAttention-2 style on mma.sync m16n8k16 (PTX): a
 * block holds FA_Q = 64 queries of one head, 4 warps of 16 rows (128-query
 * blocks would halve the K/V traffic a query but need 128 x D float16 of Q:
 * 66 KiB at D = 256 leaves no room for the tiles under 99 KiB, and a
 * 512-query launch would fill half as many SMs).  Key tiles of BK = 64
 * positions (32 at D = 256) stream through shared memory as float16 rows
 * of D + 8 halves (the 16 bytes of padding put the 8 rows an ldmatrix
 * reads in 8 bank groups).  Per tile a warp computes its 16 x BK block of
 * S in registers (C fragments), does the softmax there (a row lives in the
 * 4 lanes of a quad: max and sum with two __shfl_xor_sync), packs P into
 * float16 pairs that are already the A fragments of the P V product (the C
 * fragments of two adjacent n8 tiles are one k16 A fragment), reads V with
 * ldmatrix.trans and keeps O (16 x D) in registers: S and P never touch
 * shared memory.  Q is kept as A fragments in registers for D <= 128 (32
 * registers; its shared copy only stages them, in the V tile) and
 * ldmatrix'd from shared memory each k-step at D = 256, where O alone is
 * 128 registers.  The loads overlap the math: V of a tile is copied while
 * its S and softmax run, K of the next tile while P V runs (cp.async, one
 * K and one V buffer).  A float16 cache is copied straight into the tiles;
 * float32 and bfloat16 rows go raw into a staging buffer and are converted
 * to float16 tiles by the block in one pass (register prefetch of a float32
 * tile would cost 128 registers a thread).
 *
 * A row's result depends on its position and the cache only: its tiles
 * start at fixed positions (0, or the slice start, in steps of BK), masked
 * keys get s = -inf, so p = exp2(-inf) = 0 and a tile with nothing visible
 * for the row rescales by exp2(m - m) = 1 exactly, its sums go in a fixed
 * order (S and O in k order through the MMAs, whose result for an element
 * depends on its row and column only; l lane by lane in key order, then
 * the quad), so neither the other queries of the block nor how a prompt was
 * cut into calls can change a bit of it.
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
 *    not float32 attention (cu_gemm.cu mr_cu_prefer_float32 says why).
 *    MEMRA_CUDA_GEMM=f32 (the float32 reference mode) turns this kernel off
 *    unless MEMRA_CUDA_ATTN=tc.
 *
 * Deep in a context the keys are cut into slices over several blocks a
 * (query tile, head), as the float32 kernel's (cu_attn.cu, PF_SLICE): each
 * writes a record (max in log2 units, sum, unnormalised acc) a query and
 * mr_cu_pf_merge joins them; a query before position PF_SLICE keeps the
 * one-block bits (acc * (1 / sum)), written by worker 0 directly.  The grid
 * is (head, worker, query tile from the last): the blocks with the most
 * keys (the last tiles, each of their workers) start first and the short
 * ones fill in behind them.
 *
 * MEMRA_CUDA_FATTN=wmma: the previous kernel (k_attn_prefill_wmma, WMMA
 * with S and P through shared memory), same rounding model, for A/B
 * timing. */
#include <limits.h>
#include <math.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_mma.cuh"

using namespace nvcuda;

#define FA_Q 64      /* queries per block: 4 warps of 16 rows */
#define FA_WARPS 4
/* blocks an SM k_attn_prefill_tc is compiled for at D <= 128: 3 keeps it
 * at <= 170 registers, 12 warps an SM (without the bound ptxas takes
 * 180-190 for these forms, two blocks an SM) */
#define FA_BLOCKS_SM 3

/* k_attn_prefill_tc's shared memory: the float16 K and V tiles, Q (D =
 * 256), the raw staging tile (float32 and bfloat16 caches), the key
 * offsets and bad flags of this tile and the next. */
template <int DT, int D> struct fa2_shape {
    static constexpr int BK = D >= 256 ? 32 : 64; /* key positions a tile */
    static constexpr int LDH = D + 8;             /* float16 row stride of Q, K, V */
    static constexpr bool QREG = D <= 128;        /* Q fragments in registers */
    static constexpr int ESZ = DT == MR_KV_F32 ? 4 : 2;
    static constexpr int TILE = BK * LDH * 2;     /* bytes of a float16 K or V tile */
    static constexpr int QB = QREG ? 0 : FA_Q * LDH * 2;
    static constexpr int STAGE = DT == MR_KV_F16 ? 0 : BK * D * ESZ;
    static constexpr size_t bytes = (size_t)2 * TILE + QB + STAGE + 2 * BK * 8 + 2 * BK * 4 + 16;
    static_assert(!QREG || BK >= FA_Q, "Q is staged in the V tile");
    static_assert(bytes <= 99 * 1024, "sm_89 and sm_120 give a block 99 KiB");
};

/* Fragments (m16n8k16, g = lane / 4, c = lane % 4): A (16 x 16, row-major)
 * a0 = row g, columns 2c, 2c+1; a1 = row g+8; a2, a3 = the same at columns
 * 8 + 2c; B (16 x 8) b0 = rows 2c, 2c+1 of column g, b1 = rows 8 + 2c;
 * C (16 x 8) c0, c1 = row g, columns 2c, 2c+1; c2, c3 = row g+8.  A lane
 * owns query rows g and g+8 of its warp's 16 (the "a" and "b" rows). */
template <int DT, int D>
__global__ void __launch_bounds__(FA_WARPS * 32, D >= 256 ? 1 : FA_BLOCKS_SM)
k_attn_prefill_tc(const void *K, const void *V, const int32_t *table, const float *q,
                  const int32_t *pos, int n, int n_heads, int n_kv_heads, int bt, int n_blocks,
                  float qscale, float *out, float *part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    typedef fa2_shape<DT, D> S;
    constexpr int BK = S::BK, LDH = S::LDH, ESZ = S::ESZ, NT = BK / 8, KS = D / 16;
    constexpr int CPR = D * ESZ / 16; /* 16-byte chunks a stored K/V row */
    constexpr bool F16 = DT == MR_KV_F16;
    constexpr int NTH = FA_WARPS * 32;
    /* unrolling that keeps D = 256 free of spills (sm_90a, sm_120a): the
     * loads' loop, Q K^T's k-steps */
    constexpr int LUL = D >= 256 ? 1 : 2, KSU = D >= 256 ? 8 : KS;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    const uint32_t sK = (uint32_t)__cvta_generic_to_shared(fa_smem), sV = sK + S::TILE;
    const uint32_t sQ = S::QREG ? sV : sV + S::TILE, sStage = sV + S::TILE + S::QB;
    __half *Kh = (__half *)fa_smem, *Vh = (__half *)(fa_smem + S::TILE);
    __half *Qs = (__half *)(fa_smem + (sQ - sK));
    const unsigned char *stage = fa_smem + (sStage - sK);
    long long *kofs = (long long *)(fa_smem + 2 * S::TILE + S::QB + S::STAGE); /* [2][BK]; -1: none */
    int *kbad = (int *)(kofs + 2 * BK);                                       /* [2][BK] */
    int &pmax = kbad[2 * BK];                                                 /* the block's last visible position */

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, qd = lane & 3;
    /* grid (head, worker, tile from the last): blocks start in that order,
     * so the longest rows of every worker start first; RW workers (records
     * a row), 1 without records */
    const int t0 = (int)(gridDim.z - 1 - blockIdx.z) * FA_Q, z = (int)blockIdx.y, RW = (int)gridDim.y;
    const int h = blockIdx.x;
    const int kvh = h / (n_heads / n_kv_heads), kvdim = n_kv_heads * D;
    const char *Kb = (const char *)K, *Vb = (const char *)V;

    if (tid == 0) pmax = -1;
    __syncthreads();
    if (tid < FA_Q && t0 + tid < n) atomicMax(&pmax, pos[t0 + tid]);
    for (int i = tid; i < FA_Q * D; i += NTH) {
        const int r = i / D, d = i % D, t = t0 + r;
        const float x = t < n ? q[((int64_t)t * n_heads + h) * D + d] * qscale : 0.0f;
        Qs[r * LDH + d] = __float2half_rn(x);
    }
    __syncthreads();
    const int P = pmax + 1;
    /* A fragment of k-step ks: lane l gives row l % 16, columns ks * 16 + 8 (l / 16) */
    const uint32_t qaddr = sQ + ((w * 16 + (lane & 15)) * LDH + (lane >> 4) * 8) * 2;
    uint32_t qf[S::QREG ? KS : 1][4];
    if constexpr (S::QREG) {
#pragma unroll
        for (int ks = 0; ks < KS; ks++) mr_ldsm4(qaddr + ks * 32, qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3]);
    }
    /* part NULL: one block (RW 1) walks every key and writes out; else
     * worker z walks slices z, z + PF_WORKERS, ... of PF_SLICE positions (a
     * multiple of BK) and writes records (cu_attn.cu's k_attn_prefill) */
    const int SL = part ? PF_SLICE : P;
    if (part && z * SL >= P)
        return; /* no key of this worker is visible to the block's queries: no record is read */

    const int ra = w * 16 + g, rb = ra + 8; /* this lane's rows */
    const int pta = t0 + ra < n ? pos[t0 + ra] : -1, ptb = t0 + rb < n ? pos[t0 + rb] : -1; /* -1: none */
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
    bool bada = false, badb = false;
    float o[D / 8][4]; /* C fragments of O, n8 tile dt: columns dt * 8 .. */
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    /* offsets and bad flags of the tile at p0 into buffer bf */
    auto offsets = [&](int bf, int p0) {
        if (tid < BK)
            mr_kv_slot(table, p0 + tid, P, bt, n_blocks, (long long)kvh * D, kvdim, &kofs[bf * BK + tid],
                        &kbad[bf * BK + tid]);
    };
    /* the rows of K or V (base) of buffer bf's tile: a float16 cache into its
     * tile at dst, others raw into the stage; missing rows are zeros */
    auto load = [&](uint32_t dst, const char *base, int bf) {
#pragma unroll LUL
        for (int i = tid; i < BK * CPR; i += NTH) {
            const int j = i / CPR, c = i % CPR;
            const long long ofs = kofs[bf * BK + j];
            mr_cp16(dst + (F16 ? j * LDH * 2 : j * D * ESZ) + c * 16, ofs < 0 ? base : base + ofs * ESZ + c * 16,
                    ofs >= 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    /* the stage into a float16 tile (rolled, as the loads' loop is at most
     * twice unrolled: unrolled further, ptxas spills at D = 256) */
    auto convert = [&](__half *dst) {
        if constexpr (DT == MR_KV_F32) {
#pragma unroll 1
            for (int i = tid; i < BK * D / 4; i += NTH) {
                const int j = i / (D / 4), c = (i % (D / 4)) * 4;
                const float4 v = *(const float4 *)(stage + (size_t)i * 16);
                *(uint2 *)(dst + j * LDH + c) = make_uint2(mr_h2_pack(v.x, v.y), mr_h2_pack(v.z, v.w));
            }
        } else if constexpr (DT == MR_KV_BF16) {
#pragma unroll 1
            for (int i = tid; i < BK * D / 8; i += NTH) {
                const int j = i / (D / 8), c = (i % (D / 8)) * 8;
                const uint4 u = *(const uint4 *)(stage + (size_t)i * 16);
                const uint32_t x[4] = {u.x, u.y, u.z, u.w};
                uint32_t y[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    y[e] = mr_h2_pack(__uint_as_float(x[e] << 16), __uint_as_float(x[e] & 0xffff0000u));
                *(uint4 *)(dst + j * LDH + c) = make_uint4(y[0], y[1], y[2], y[3]);
            }
        }
    };

    /* B fragments of K (ldmatrix): lane l gives key l % 8 + 8 (l / 16),
     * columns 8 ((l / 8) % 2): b0, b1 of key tiles 2np and 2np + 1 */
    const uint32_t kaddr = sK + (((lane & 7) + ((lane >> 4) << 3)) * LDH + ((lane >> 3) & 1) * 8) * 2;
    /* B fragments of V (ldmatrix.trans): lane l gives key l % 8 + 8 ((l / 8)
     * % 2), columns 8 (l / 16): b0, b1 of column tiles 2dp and 2dp + 1 */
    const uint32_t vaddr = sV + (((lane & 7) + (((lane >> 3) & 1) << 3)) * LDH + (lane >> 4) * 8) * 2;
    /* the tile after the one at p (this worker's next slice past a slice's end) */
    auto next = [&](int p) { return p + ((p + BK) % SL ? BK : (PF_WORKERS - 1) * SL + BK); };
    int p0 = z * SL;
    /* K and V take one buffer each: V of a tile loads during its S, K of
     * the next during its P V */
    if (p0 < P) {
        offsets(0, p0);
        __syncthreads();
        load(F16 ? sK : sStage, Kb, 0);
    }
    for (int it = 0; p0 < P; it++) {
        const int b = it & 1;
        const int pn = next(p0);
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); /* K landed; the previous P V is done with V (and Q's staging copy) */
        if constexpr (!F16) {
            convert(Kh);
            __syncthreads();
        }
        load(F16 ? sV : sStage, Vb, b);
        if (pn < P) offsets(b ^ 1, pn);

        /* S = Q K^T, this warp's 16 rows x BK keys */
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll KSU
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[4];
            if constexpr (S::QREG) {
                a[0] = qf[ks][0], a[1] = qf[ks][1], a[2] = qf[ks][2], a[3] = qf[ks][3];
            } else {
                mr_ldsm4(qaddr + ks * 32, a[0], a[1], a[2], a[3]);
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b0, b1, b2, b3;
                mr_ldsm4(kaddr + (np * 16 * LDH + ks * 16) * 2, b0, b1, b2, b3);
                mr_mma16816(s[2 * np], a, b0, b1);
                mr_mma16816(s[2 * np + 1], a, b2, b3);
            }
        }

        /* online softmax: s[nt][e] is key nt * 8 + 2 qd + (e & 1) of row a (e < 2) or b */
        const int *kb = kbad + b * BK;
        float mta = -INFINITY, mtb = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int c = nt * 8 + 2 * qd + e;
                const bool va = p0 + c <= pta, vb = p0 + c <= ptb, kbd = kb[c] != 0;
                bada |= va && kbd;
                badb |= vb && kbd;
                s[nt][e] = va ? s[nt][e] : -INFINITY;
                s[nt][2 + e] = vb ? s[nt][2 + e] : -INFINITY;
                mta = fmaxf(mta, s[nt][e]);
                mtb = fmaxf(mtb, s[nt][2 + e]);
            }
        mta = fmaxf(mta, __shfl_xor_sync(0xffffffffu, mta, 1));
        mtb = fmaxf(mtb, __shfl_xor_sync(0xffffffffu, mtb, 1));
        mta = fmaxf(mta, __shfl_xor_sync(0xffffffffu, mta, 2));
        mtb = fmaxf(mtb, __shfl_xor_sync(0xffffffffu, mtb, 2));
        const float mna = fmaxf(ma, mta), mnb = fmaxf(mb, mtb);
        /* nothing visible yet: p = exp2(-inf - 0) = 0 and corr = 0 on a zero O and l */
        const float xa = mna == -INFINITY ? 0.0f : mna, xb = mnb == -INFINITY ? 0.0f : mnb;
        const float ca = exp2f(ma - xa), cb = exp2f(mb - xb); /* 1 exactly when the max stays */
        ma = mna;
        mb = mnb;
        uint32_t pf[NT / 2][4]; /* P as the A fragments of P V, 16 keys each */
        float lsa = 0.0f, lsb = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint32_t ua = mr_h2_pack(exp2f(s[nt][0] - xa), exp2f(s[nt][1] - xa));
            const uint32_t ub = mr_h2_pack(exp2f(s[nt][2] - xb), exp2f(s[nt][3] - xb));
            const float2 fa = mr_h2_unpack(ua), fb = mr_h2_unpack(ub); /* the sum of what is multiplied */
            lsa += fa.x;
            lsa += fa.y;
            lsb += fb.x;
            lsb += fb.y;
            pf[nt / 2][(nt & 1) * 2] = ua;
            pf[nt / 2][(nt & 1) * 2 + 1] = ub;
        }
        lsa += __shfl_xor_sync(0xffffffffu, lsa, 1);
        lsb += __shfl_xor_sync(0xffffffffu, lsb, 1);
        lsa += __shfl_xor_sync(0xffffffffu, lsa, 2);
        lsb += __shfl_xor_sync(0xffffffffu, lsb, 2);
        la = la * ca + lsa;
        lb = lb * cb + lsb;

        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads(); /* V landed; every warp is done with K; the next offsets are written */
        if constexpr (!F16) {
            convert(Vh);
            __syncthreads();
        }
        if (pn < P) load(F16 ? sK : sStage, Kb, b ^ 1);

        /* O = O * corr + P V */
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] *= ca;
            o[dt][1] *= ca;
            o[dt][2] *= cb;
            o[dt][3] *= cb;
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b0, b1, b2, b3;
                mr_ldsm4t(vaddr + (kk * 16 * LDH + dp * 16) * 2, b0, b1, b2, b3);
                mr_mma16816(o[2 * dp], pf[kk], b0, b1);
                mr_mma16816(o[2 * dp + 1], pf[kk], b2, b3);
            }
        p0 = pn;
    }

    /* no visible position (or a bad block id) gives NaN, never a silent zero;
     * any lane of the quad may have seen the bad id */
    bada |= __shfl_xor_sync(0xffffffffu, (int)bada, 1) != 0;
    badb |= __shfl_xor_sync(0xffffffffu, (int)badb, 1) != 0;
    bada |= __shfl_xor_sync(0xffffffffu, (int)bada, 2) != 0;
    badb |= __shfl_xor_sync(0xffffffffu, (int)badb, 2) != 0;
    const float nan = __int_as_float(0x7fc00000);
    /* a row at or past PF_SLICE (with records) gets this worker's record:
     * max (log2 units), sum (NaN for a bad block id), acc; a row before it
     * has worker 0's record only, so worker 0 writes its out as the merge of
     * that record would (and without records every row is written out) */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int t = t0 + (half ? rb : ra);
        if (t >= n) continue;
        const float l = half ? lb : la;
        const bool bad = half ? badb : bada;
        if (part && (half ? ptb : pta) >= PF_SLICE) {
            float *rec = part + ((int64_t)t * n_heads + h) * ((size_t)RW * (D + 2)) + (size_t)z * (D + 2);
            if (qd == 0) {
                rec[0] = half ? mb : ma;
                rec[1] = bad ? nan : l;
            }
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++)
                *(float2 *)(rec + 2 + dt * 8 + 2 * qd) = make_float2(o[dt][2 * half], o[dt][2 * half + 1]);
        } else if (z == 0) {
            const float f = (bad || l == 0.0f) ? nan : 1.0f / l;
            float *orow = out + ((int64_t)t * n_heads + h) * D + 2 * qd;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++)
                *(float2 *)(orow + dt * 8) = make_float2(o[dt][2 * half] * f, o[dt][2 * half + 1] * f);
        }
    }
}

/* ---- the previous kernel (MEMRA_CUDA_FATTN=wmma) ----
 *
 * WMMA 16x16x16 products, S and P through shared memory.  The output
 * accumulators stay in WMMA fragments across tiles.  Their
 * element-to-(row, column) layout is not specified by the API, so each
 * warp learns it once: it loads a 16x16 matrix holding row*16+col into an
 * accumulator fragment and reads back which element landed where; the
 * per-row rescale (exp2(m_old - m_new)) and the final 1/l then apply per
 * element.  Accumulator fragments of one shape and type share one layout. */

/* Key positions per tile: 64, or 32 for head_dim 256 (shared memory stays
 * under the 99 KiB a block may have on sm_89 and sm_120). */
template <int D> struct fa_wshape {
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
k_attn_prefill_wmma(const void *K, const void *V, const int32_t *table, const float *q,
                  const int32_t *pos, int n, int n_heads, int n_kv_heads, int bt, int n_blocks,
                  float qscale, float *out, float *part)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    typedef fa_wshape<D> S;
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
     * else worker z of RW walks slices z, z + PF_WORKERS, ... of PF_SLICE
     * positions (a multiple of BK) and writes records (cu_attn.cu's
     * k_attn_prefill) */
    const int z = (int)blockIdx.z, RW = (int)gridDim.z, SL = part ? PF_SLICE : P;
    if (part && z * SL >= P)
        return; /* no key of this worker is visible to the block's queries: no record is read */
    for (int p0 = z * SL; p0 < P; p0 += (p0 + BK) % SL ? BK : (PF_WORKERS - 1) * SL + BK) {
        if (tid < BK)
            mr_kv_slot(table, p0 + tid, P, bt, n_blocks, (long long)kvh * D, kvdim, &kofs[tid], &kbad[tid]);
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
    /* records for the rows at or past PF_SLICE: max (log2 units), sum (NaN
     * for a bad block id), acc; a row before it has worker 0's record only,
     * so worker 0 writes its out as the merge of that record would */
    if (part) {
        const size_t RS = (size_t)RW * (D + 2);
        if (hf == 0 && t0 + row < n && pt >= PF_SLICE) {
            float *rec = part + ((int64_t)(t0 + row) * n_heads + h) * RS + (size_t)z * (D + 2);
            rec[0] = m;
            rec[1] = bad ? __int_as_float(0x7fc00000) : l;
        }
#pragma unroll
        for (int e = 0; e < NE; e++) {
            const int t = t0 + w * 16 + (eat[e] >> 4);
            if (t >= n || pos[t] < PF_SLICE) continue;
            float *rec = part + ((int64_t)t * n_heads + h) * RS + (size_t)z * (D + 2) + 2 + (eat[e] & 15);
#pragma unroll
            for (int dt = 0; dt < DT16; dt++) rec[dt * 16] = o[dt].x[e];
        }
        if (z > 0)
            return;
    }
    if (hf == 0) rowf[row] = (bad || l == 0.0f) ? __int_as_float(0x7fc00000) : 1.0f / l;
    __syncwarp();
#pragma unroll
    for (int e = 0; e < NE; e++) {
        const int r = w * 16 + (eat[e] >> 4), t = t0 + r;
        if (t >= n || (part && pos[t] >= PF_SLICE)) continue;
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
 * cores, earlier ones float32, whatever the model asks.
 * MEMRA_CUDA_FATTN=wmma: the tensor-core rows on the previous kernel (the
 * 5.7-6.8x above was measured on it).  MEMRA_CUDA_ATTN_DEC_TC=N: decode
 * rows of a float16 cache at position N or later take the tensor cores too
 * (cu_attn.cu ag_split_tc); unset: N = 0, every row; =off: the float kernel;
 * where every row takes them, a block takes 8 query heads of a K/V head in
 * calls of 2+ rows (the default, =batch), in every call
 * (MEMRA_CUDA_ATTN_DEC_TC_G8=1) or never (=0): the same splits, so the same
 * bits as blocks of 4 (GPU-NOTES 142; run 303, H100: C = 16 with 512-token
 * prompts +1.4%, the shared prefix +1.9%, decode only -0.3%; a lone token
 * at the start of a context is faster in blocks of 4, run 302).  MEMRA_CUDA_ATTN_PAIR=0: a
 * decode batch's tokens of one prefix no longer share a block's K/V tiles
 * where a block holds 4 heads or fewer (the 8B's groups; the 30B-A3B's and
 * 35B-A3B's batches take blocks of 8 by default, whose columns are full);
 * cu_attn.cu ag_split_tc; the same bits either way; run 296, H100, blocks
 * of 4 on the 30B-A3B: 16 streams sharing 4,096 positions 91.1 -> 69.1 us,
 * the shared-prefix shape +4.4% req/s, decode without shared blocks the
 * same.  The kernels need more than the default 48
 * KiB of dynamic shared memory; the limit is raised here once, outside any
 * graph capture, and only when they may run. */
void mr_cu_attn_init(mr_cu_ctx *c)
{
    const char *m = getenv("MEMRA_CUDA_ATTN");
    const char *g = getenv("MEMRA_CUDA_GEMM");
    const char *q = getenv("MEMRA_CUDA_ATTN_GQA");
    c->attn_gqa = !(q && !strcmp(q, "0")); /* decode kernel (cu_attn.cu) */
    c->attn_dec_tc = INT_MAX;
    /* ch 0: cu_attn.cu ag_cut's rule; wd: how far its slices grow (run 285) */
    long long lp = 2, ch = 0, gr = 1, wd = 256, pr = 1;
    if (mr_cu_env_int(c, "MEMRA_CUDA_ATTN_LOOP", 0, INT_MAX, "a token count", &lp) < 0 ||
        mr_cu_env_int(c, "MEMRA_CUDA_ATTN_PAIR", 0, 1, "0 or 1", &pr) < 0 ||
        mr_cu_env_int(c, "MEMRA_CUDA_ATTN_WIDE", 64, 4096, "a position count of 64 to 4096", &wd) < 0 ||
        mr_cu_env_int(c, "MEMRA_CUDA_ATTN_CHUNK", 1, 65536, "a position count of 1 to 65536", &ch) < 0 ||
        mr_cu_env_int(c, "MEMRA_CUDA_ATTN_GRAN", 0, 1, "0 or 1", &gr) < 0)
        return;
    c->attn_loop = (int)lp;
    c->attn_wide = (int)wd;
    c->attn_chunk = (int)ch;
    c->attn_gran = gr == 1;
    c->attn_pair = pr == 1;
    /* every float16 decode row by default: faster at every depth measured
     * (runs 210-211); kernel-check part dectc's float64 lines on it, run 212 */
    long long dt = 0;
    const char *dts = getenv("MEMRA_CUDA_ATTN_DEC_TC");
    if (dts && !strcmp(dts, "off"))
        dt = INT_MAX;
    else if (mr_cu_env_int(c, "MEMRA_CUDA_ATTN_DEC_TC", 0, INT_MAX - 1, "a position or off", &dt) < 0)
        return;
    c->attn_dec_tc = (int)dt;
    const char *g8 = getenv("MEMRA_CUDA_ATTN_DEC_TC_G8");
    c->attn_dec_tc_g8 = g8 && !strcmp(g8, "0") ? 0 : g8 && !strcmp(g8, "1") ? 1 : 2;
    mr_cu_attn_dec_init(c);
    const char *ps = getenv("MEMRA_CUDA_PF_SPLIT");
    c->pf_split = !(ps && !strcmp(ps, "0")); /* float32 prompt kernel (cu_attn.cu) */
    long long f = -1;
    const int from = mr_cu_env_int(c, "MEMRA_CUDA_ATTN_TC_FROM", 0, INT_MAX, "a position", &f);
    if (from < 0)
        return;
    const bool tc = m && !strcmp(m, "tc"), f32 = m && !strcmp(m, "f32");
    c->attn_tc_from = from ? (int)f : tc ? 0 : f32 || (g && !strcmp(g, "f32")) ? INT_MAX : 0;
    const char *fa = getenv("MEMRA_CUDA_FATTN");
    c->attn_wmma = fa && !strcmp(fa, "wmma");
    if (c->attn_tc_from == INT_MAX)
        return;
#define X(DT, DD)                                                                                   \
    if (c->attn_wmma)                                                                               \
        MR_CU_TRY(c, cudaFuncSetAttribute(k_attn_prefill_wmma<DT, DD>,                              \
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,              \
                                          (int)fa_wshape<DD>::bytes));                              \
    else                                                                                            \
        MR_CU_TRY(c, cudaFuncSetAttribute(k_attn_prefill_tc<DT, DD>,                                \
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,              \
                                          (int)fa2_shape<DT, DD>::bytes));
    FA_EACH(X)
#undef X
}

void mr_cu_attn_prefill_tc(mr_cu_ctx *c, const mr_kv_cache *kv, int layer,
                           const int32_t *block_table, const float *q, const int32_t *pos, int n,
                           int n_heads, float scale, float *out, int pos_max)
{
    const int D = kv->head_dim;
    const float qscale = scale * 1.4426950408889634f; /* exp(x) = exp2(x log2 e) */
    mr_cu_pf_launches(c, pos, n, n_heads, D, true, out, pos_max, [&](int r0, int nr, int RW, float *part) {
        const size_t qo = (size_t)r0 * n_heads * D;
        const unsigned tiles = (unsigned)((nr + FA_Q - 1) / FA_Q);
        /* k_attn_prefill_tc: (head, worker, tile); the WMMA kernel: (tile, head, worker) */
        const dim3 grid = c->attn_wmma ? dim3(tiles, n_heads, RW) : dim3(n_heads, RW, tiles);
#define X(DT, DD)                                                                                   \
    if (kv->dtype == DT && D == DD && c->attn_wmma)                                                 \
        mr_cu_launch(c, k_attn_prefill_wmma<DT, DD>, grid, FA_WARPS * 32, fa_wshape<DD>::bytes,       \
                     kv->k[layer], kv->v[layer], block_table, q + qo, pos + r0, nr, n_heads,          \
                     kv->n_kv_heads, kv->block_tokens, kv->n_blocks, qscale, out + qo, part);         \
    else if (kv->dtype == DT && D == DD)                                                            \
        mr_cu_launch(c, k_attn_prefill_tc<DT, DD>, grid, FA_WARPS * 32, fa2_shape<DT, DD>::bytes,     \
                     kv->k[layer], kv->v[layer], block_table, q + qo, pos + r0, nr, n_heads,          \
                     kv->n_kv_heads, kv->block_tokens, kv->n_blocks, qscale, out + qo, part);
        FA_EACH(X)
#undef X
        MR_CU_LAUNCHED(c, "attention prefill (tensor cores)");
    });
}

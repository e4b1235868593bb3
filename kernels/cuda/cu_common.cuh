/* Shared state and helpers of the CUDA backend: the context (stream,
 * cuBLAS handle, scratch buffers, sticky first error), the checked-call
 * macros, and small device helpers. */
#ifndef MR_CU_COMMON_CUH
#define MR_CU_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stdint.h>

extern "C" {
#include "common/err.h"
#include "kernels/ops.h"
}

/* A growable device buffer; grown only outside graph capture. */
struct mr_cu_buf {
    void *p;
    size_t cap;
};

struct mr_cu_auto; /* cu_autograph.cu */

#include "kernels/cuda/cu_bench.h" /* MR_CU_GEMM_MIN_TOKENS */

/* Tokens per matvec launch (the kernels keep one accumulator per token). */
#define MR_CU_MATVEC_MAX 8
/* The logistic function as every kernel computes it (sigmoid_mul, the
 * gated delta net's beta, the fused end of a mixture layer). */
__device__ __forceinline__ float mr_sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

#define MR_CU_MV_SUBS 4 /* matrices one matvec launch may cover (mr_cu_matmul_multi: q/k/v; a gated
                           delta net layer's qkv, z, alpha and beta) */
/* Sequences one launch of mr_cu_gdn_segs takes: their states' addresses
 * travel as a kernel argument (512 bytes) */
#define MR_CU_SEGS 64
struct mr_cu_segs {
    float *p[MR_CU_SEGS];
};
/* The same with each sequence's first row and rows (mr_cu_gdn_scan_segs) */
struct mr_cu_segs_n {
    float *p[MR_CU_SEGS];
    int t0[MR_CU_SEGS], n[MR_CU_SEGS];
};
#define MR_CU_CONV_TAPS 4 /* taps a causal convolution that a product's launch takes may have (mr_cu_matmul_multi_conv) */

/* Blocks an SM holds of one kernel at one block size and shared memory,
 * as the runtime answered (mr_cu_fit keeps the answers here). */
#define MR_CU_FITS 64
struct mr_cu_fit_entry {
    const void *kernel;
    int threads;
    size_t smem;
    int blocks;
};

struct mr_cu_ctx {
    int device;
    int n_sm;
    cudaStream_t stream;
    cublasHandle_t cublas;
    bool failed;            /* sticky: first error kept in err */
    mr_err err;
    bool capturing;         /* inside graph_begin/graph_end */
    bool no_fast;           /* MEMRA_CUDA_GENERIC=1: generic kernels only (for checks) */
    int fast_r;             /* MEMRA_CUDA_FAST_R: force rows per block (1, 2, 4; 0 = auto) */
    bool q4k_wide;          /* 16-weight lanes for Q4_K (MEMRA_CUDA_Q4K_WIDE=0: off) */
    bool route_rank;        /* moe_route by ranks, a block a token (cu_ops.cu k_moe_route_rank; the
                               default; MEMRA_CUDA_ROUTE=warp: the warp kernel, same ids and weights) */
    int wide_r;             /* rows a block of the one-token Q4_K wide kernel (MEMRA_CUDA_WIDE_R: 1, 2,
                               4 or 8; -1 the rule before run 105; else by the shape, cu_fast.cu
                               launch_fast; a row's sums do not depend on it) */
    bool early_w;           /* one token's plain Q4_K products load their first weights before the
                               PDL wait (cu_fast.cu k_q4k_wide; MEMRA_CUDA_EARLY=0: after it; the
                               same bits) */
    bool early_iq4;         /* one token's plain IQ4_XS products on the float kernel, rows of more
                               than 2,048 columns, load a warp's first 4 steps of weights before the
                               PDL wait (cu_fast.cu k_fast EARLY; MEMRA_CUDA_EARLY_IQ4XS=0: after it;
                               the same bits) */
    int wide_loop;          /* and run in one wave of at most this many blocks an SM, each block
                               looping over blocks of rows (cu_fast.cu k_q4k_loop; MEMRA_CUDA_WIDE_LOOP,
                               0: never; default INT_MAX, the kernel's occupancy; the same bits) */
    bool xm_quant_block;    /* one token's expert products quantize their input rows in each block
                               instead of a k_x24_quant launch before them (cu_moex24.cu; the same
                               planes, so the same bits; MEMRA_CUDA_XM_QUANT=launch: the launch) */
    bool xm_early;          /* and (Q4_K, IQ4_XS) ask for their first weights before that quantization
                               (cu_moex24.cu k_moex24 EARLY; the same bits; MEMRA_CUDA_XM_EARLY=0: after) */
    bool xm_half;           /* and their plain products of at most 512 columns in half warps (k_moex24
                               LW 16; the same bits; MEMRA_CUDA_XM_HALF=0: whole warps) */
    bool moe_grouped;       /* decode expert products grouped by expert (MEMRA_CUDA_MOE_GROUPED=0: off) */
    int xmm;                /* expert products of decode on the int8 tensor cores, the input's planes
                               as the MMA's columns (cu_moemma.cu): 3 Q4_K, Q6_K and IQ4_XS rows of at
                               most 512 columns (default; =iq4d), 2 Q4_K and Q6_K (MEMRA_CUDA_XMM=2), 1
                               Q4_K only (=q4k), 0 none (=0), 4 and every IQ4_XS matrix (=iq4); other
                               bits than the x24 kernel, at every token count alike */
    int xmp;                /* prompt products of IQ4_XS on the int8 tensor cores (cu_moemmp.cu):
                               3 blocks an SM (default; MEMRA_CUDA_XMP=4: 4, fewer registers; =0 off:
                               the float16 and f16x3 kernels; run 173: 35B-A3B pp512 5,213 -> 6,698) */
    bool xmp_q4k;           /* and Q4_K's (default; MEMRA_CUDA_XMP_Q4K=0: the float16 kernels for
                               Q4_K; run 177: 30B-A3B pp512 12,339 / 12,486 -> 13,473 / 13,454) */
    bool xmh;               /* prompt expert products of Q4_K on the float16 tensor cores, weights
                               decoded in registers (cu_moemmh.cu; default; MEMRA_CUDA_XMH=0: the int8
                               kernel; run 201: 30B-A3B pp2048 15,389 -> 19,422 tok/s) */
    bool xmh6;              /* and Q6_K's, from the padded copy (default; MEMRA_CUDA_XMH=q4k: Q6_K on the
                               float16 kernel of cu_gemm.cu) */
    bool xmh_iq4;           /* and IQ4_XS's (default; MEMRA_CUDA_XMH_IQ4=0: the int8 kernel; run 204:
                               35B-A3B pp2048 6,854 -> 7,189 / 7,198, pp512 and C = 16 the same) */
    bool xmm_items;         /* its decode batches a block a chunk of two pairs, not a block an expert
                               (default; MEMRA_CUDA_XMM_ITEMS=0: a block an expert; the same bits;
                               run 171: 16-token gate/up -15%, 30B-A3B decode only C = 16 +2.6%) */
    int xmm_tpw;            /* and their row tiles a warp: 0 auto from the launch's waves (default;
                               cu_moemma.cu xmm_tpw), else MEMRA_CUDA_XMM_TPW=1..8 (the same bits) */
    long xmm_mt_launches;   /* launches with several tiles a warp so far (kernel-check) */
    int xm_quarter;         /* and those of rows of at most 512 columns a row a quarter warp
                               (cu_moex24.cu xm_row_q; the same bits; MEMRA_CUDA_XM_QUARTER=0: whole
                               warps, 2: every row under 1,024 columns) */
    bool attn_merge_reg;    /* decode attention's merge with a row's records loaded at once
                               (cu_attn.cu merge_reg; MEMRA_CUDA_ATTN_MERGE=loop: merge_loop; same bits) */
    int moe_nt;             /* their pairs per chunk (MEMRA_CUDA_MOE_GROUPED=2 or 4; 0 = auto) */
    int gemm_mode;          /* prompt GEMM precision (cu_gemm.cu) */
    bool gemm_mode_forced;  /* set by MEMRA_CUDA_GEMM: models may not change it */
    bool moe_fused;         /* float16 expert GEMMs from the quantized blocks
                               (MEMRA_CUDA_MOE_FUSED=0: dequantize + cuBLAS) */
    bool moe_x3;            /* in f16x3 mode the fused expert GEMMs are f16x3 too (MEMRA_CUDA_MOE_X3=1;
                               default float16: cu_gemm.cu says why) */
    bool hgemm_cublas;      /* float16 GEMMs through cuBLAS instead of k_hgemm (cu_hgemm.cu;
                               MEMRA_CUDA_HGEMM=cublas: faster, a row's bits then depend on the call) */
    bool gdn_tiled;         /* gdn_scan in tiles of tokens (cu_gdn.cu k_gdn_scan_tiled;
                               MEMRA_CUDA_GDN_TILED=0: the token-by-token kernel, same bits) */
    bool gdn_tiled_pf;      /* and each tile's inputs fetched during the tile before (k_gdn_scan_tiled
                               PF; MEMRA_CUDA_GDN_TILED=2: without; the same bits) */
    bool gdn_lanes;         /* the tiled scan's tokens without a barrier each: a column's partials in
                               neighbouring lanes (k_gdn_scan_tiled LG; MEMRA_CUDA_GDN_LANES=0:
                               without; the same bits) */
    int gdn_warps;          /* the most warps a scan block may take before rows a thread double
                               (8; MEMRA_CUDA_GDN_WARPS=4: the rows of run 135 and before, other
                               sums; run 171: 512 tokens 631 -> 564 us at dk 128) */
    bool attn_gqa;          /* decode attention a block per group of query heads sharing a K/V head
                               (cu_attn.cu k_attn_gqa; MEMRA_CUDA_ATTN_GQA=0: a block per head) */
    int attn_loop;          /* and from this many tokens a call one wave of blocks taking the splits
                               that hold positions (k_attn_gqa_loop; the same bits; 2 by default,
                               MEMRA_CUDA_ATTN_LOOP=0: never) */
    int attn_wide;          /* decode slices grow up to this many positions while a context keeps
                               AG_SLICES of them (cu_attn.cu ag_cut; 256, MEMRA_CUDA_ATTN_WIDE=N;
                               other sums, a function of the context still) */
    bool attn_gran;         /* where every decode row takes the tensor cores, slices of whole multiples
                               of 64 positions (cu_attn.cu attention_launch; MEMRA_CUDA_ATTN_GRAN=0:
                               the cut before, other sums) */
    int attn_dec_tc;        /* decode rows at this position or later on the tensor cores (cu_attn.cu
                               ag_split_tc; float16 caches, and not before attn_tc_from):
                               MEMRA_CUDA_ATTN_DEC_TC=N, 0 when unset; INT_MAX none (=off) */
    bool attn_pair;         /* a decode batch's tokens 2i and 2i + 1 whose slice covers the same cache
                               blocks share its block's K/V tiles, in MMA columns a group of 4 or
                               fewer heads leaves zero (cu_attn.cu ag_split_tc; the same bits;
                               MEMRA_CUDA_ATTN_PAIR=0 off) */
    int attn_dec_tc_g8;     /* where every decode row takes it (attn_dec_tc 0, attn_tc_from 0) and a K/V
                               head serves a multiple of 8 query heads, a block takes 8 of them: 2
                               in calls of 2+ rows (decode batches; the default, =batch), 1 in every
                               call, 0 never (MEMRA_CUDA_ATTN_DEC_TC_G8=1 / 0); the splits are gb
                               4's, so a row's sums are the same either way (cu_attn.cu
                               attention_launch) */
    int attn_chunk;         /* the positions of that kernel's slices (0: from one round of its warps
                               up to 64 with the context, cu_attn.cu ag_cut; MEMRA_CUDA_ATTN_CHUNK=N:
                               at least N, the rule before run 187 at 16; other sums) */
    mr_cu_buf scratch_w;    /* dequantized weight chunk for the GEMM path */
    mr_cu_buf scratch_attn; /* split-K attention partials */
    mr_cu_buf scratch_act;  /* activation scratch (quantized x, GEMM operands) */
    mr_cu_buf scratch_moe;  /* expert GEMM: row map and padded outputs */
    mr_cu_buf scratch_grp;  /* decode expert products: pairs grouped by expert (cu_fast.cu) */
    bool matvec_q8;         /* int8-activation matvec (cu_mvq8.cu), MEMRA_CUDA_MATVEC=q8 */
    int matvec_x24;         /* 22-bit-activation matvec (cu_mvx24.cu): 0 off (MEMRA_CUDA_MATVEC=f32
                               or q8), 1 where it wins (default, =x24), 2 wherever it can (=x24all) */
    mr_cu_fit_entry fits[MR_CU_FITS]; /* mr_cu_fit's answers so far (a ring once full) */
    int n_fits;
    size_t x24_smem;        /* shared memory an x24 launch may ask for */
    bool x24_pre;           /* MEMRA_CUDA_X24_PRE=1: x24 inputs quantized by their own kernel */
    mr_cu_buf scratch_x24;  /* x24 input planes quantized by their own kernel (mr_cu_x24_planes) */
    bool xmd;               /* decode batches of dense Q4_K products on the int8 tensor cores
                               (cu_mvxmd.cu; default; MEMRA_CUDA_XMD=0: the float kernels) */
    mr_cu_buf scratch_xmd;  /* their input planes (k_xmp_quant's operand) */
    int xmd_iq4;            /* and IQ4_XS matrices: 2 all of them (default), 1 those of the
                               22-bit kernel's shapes (MEMRA_CUDA_XMD_IQ4XS=x24), 0 none (=0:
                               they keep the 22-bit and float kernels) */
    int xmd_one;            /* their one-token calls' kernel (the same bits): -1 by the launch
                               (MEMRA_CUDA_XMD_ONE=auto, the default: xmd_pick_one), 2 or 3 k_xmd1
                               at 2 (=1) or 3 (=3) blocks an SM, 0 k_xmd2 (=0) */
    bool xmd_ng2;           /* MEMRA_CUDA_XMD_NG=2: calls of 9+ tokens in chunks of 16 (k_xmd<2>, 226
                               registers) instead of 8 (k_xmd<1>, 128; run 184: C = 16 +2.4%); the
                               same bits */
    bool xmd_il;            /* calls of 3+ tokens in chunks of 8 read their input interleaved by
                               token (cu_mvxmd.cu xmd_tok; MEMRA_CUDA_XMD_IL=0: k_xmp_quant's
                               rows; run 307: C = 16 decode only +4.5%); the same bits */
    int xmd_pre_on;         /* the launch before a product writes that operand for it, the same
                               bytes: bit 0 the end of a mixture layer (k_moe_tail) before q/k/v,
                               bit 1 a decode batch's attention merge before o (MEMRA_CUDA_FUSE_XQ:
                               3 both, the default; 1 or 2 one; 0 the product's own launch) */
    const float *xmd_pre_x; /* the operand the last launch wrote for the next product: of n rows of
                               x, cols, the products' type (NULL: none; mr_cu_xmd_il_made) */
    int xmd_pre_n, xmd_pre_cols, xmd_pre_type;
    long xmd_pre_used;      /* products that took such an operand so far */
    int x24_nt_max;         /* tokens an x24 launch at most (2; MEMRA_CUDA_X24_NT) */
    int xm_bps;             /* x24 expert products: blocks an SM the rows a block aim at, were
                               every slot used (64; MEMRA_CUDA_XM_BPS, for timing: same bits) */
    int xm_bps1;            /* the same for one token (XM_MIN_BLOCKS: one wave; MEMRA_CUDA_XM_BPS1) */
    int x24_mma_min;        /* Q4_K / Q6_K x24 products of this many tokens or more on the tensor
                               cores (MEMRA_CUDA_X24_MMA; 0: never) */
    bool x24_moe;           /* expert products of decode through the x24 kernel (cu_moex24.cu;
                               MEMRA_CUDA_X24_MOE=0: off) */
    bool x24_iq4xs;         /* IQ4_XS products of 4,096+ rows at <= 2,048 columns (and of < 128
                               rows) on the x24 kernel (cu_mvx24.cu x24_one; MEMRA_CUDA_X24_IQ4XS=0:
                               the Q4_K rule, for timing) */
    mr_cu_buf scratch_q8;   /* the q8 matvec's quantized activations */
    int attn_tc_from;       /* prompt queries at this position or later take the tensor-core
                               kernel (cu_fattn.cu), earlier ones the float32 one: 0 (the
                               default) all, INT_MAX none (MEMRA_CUDA_ATTN=f32, the float32
                               reference mode); MEMRA_CUDA_ATTN_TC_FROM=N: N */
    bool attn_wmma;         /* the tensor-core rows on the WMMA kernel (cu_fattn.cu
                               k_attn_prefill_wmma; MEMRA_CUDA_FATTN=wmma, for A/B timing) */
    mr_cu_auto *ag;         /* recorded ops and cached graphs, or NULL */
    bool pdl;               /* kernels launched with programmatic dependent launch (cu_pdl.cuh;
                               compute capability 9+, MEMRA_CUDA_PDL=0: off) */
    cudaError_t launch_err; /* the first error of an mr_cu_launch not yet taken by MR_CU_LAUNCHED */
    bool wide8;             /* Q4_K wide matvec: 8 tokens a launch (cu_fast.cu launch_fast_n;
                               MEMRA_CUDA_WIDE8=0: 4, same bits) */
    int wide8_rows;         /* those launches this many rows a block, each input load shared by them
                               (4; MEMRA_CUDA_WIDE8=2: two, =1: one; same bits) */
    int wide16;             /* Q4_K wide matvec: 16 tokens a launch at this many rows a block (2;
                               MEMRA_CUDA_WIDE16=1: one, =0: 8 a launch; same bits) */
    int fast8;              /* float32 / bfloat16 decode batches 8 tokens a launch, and (2, the
                               default) Q6_K ones of at most 2,048 columns (MEMRA_CUDA_FAST8=0: 4,
                               =1: floats only; same bits) */
    bool fast8_jobs;        /* a plain product's 8-token chunks of those as the grid's jobs of one
                               launch (MEMRA_CUDA_FAST8_JOBS=0: a launch a chunk; same bits) */
    bool pf_split;          /* float32 prompt attention: keys in slices over several blocks
                               (cu_attn.cu PF_SLICE; MEMRA_CUDA_PF_SPLIT=0: one block a tile) */
    mr_cu_buf scratch_pfa;  /* its records */
    mr_cu_buf scratch_split; /* partial sums of a float16 GEMM with k in chunks (cu_gemm.cu split_cols) */
    bool note_launches;     /* the op profile is on: mr_cu_launch notes each launch's shape for it */
    unsigned long scratch_asks; /* calls of mr_cu_reserve: an op that made none used no scratch buffer
                                   of the context (the recorder's side branches may not) */
    long long small_gemm;   /* prompt products of matrices of at most this many rows in float32
                               (cu_sgemm.cu; MEMRA_CUDA_SMALL_GEMM, -1: the mode's default) */
};

static inline mr_cu_ctx *mr_cu(mr_backend *be) { return (mr_cu_ctx *)be->ctx; }

/* Blocks of kernel an SM holds at once with `threads` threads and smem
 * bytes of dynamic shared memory a block; asked of the runtime once per
 * (kernel, threads, smem) and kept in c.  0 where the runtime cannot say. */
int mr_cu_fit(mr_cu_ctx *c, const void *kernel, int threads, size_t smem);

/* Notes a launch's shape for the op profile (cu_autograph.cu), which
 * prints it as waves: blocks over what the card holds at once. */
void mr_cu_note_launch(mr_cu_ctx *c, const void *kernel, dim3 grid, dim3 block, size_t smem);

/* Records the first failure; later ones are dropped (the first is the cause). */
void mr_cu_fail(mr_cu_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The environment variable name as a whole number from lo to hi: 1 with
 * *v set, 0 when it is unset, -1 when it holds anything else (the context
 * has failed: "NAME 'value': not WHAT"). */
int mr_cu_env_int(mr_cu_ctx *c, const char *name, long long lo, long long hi, const char *what, long long *v);

/* After each launch (<<<>>> or mr_cu_launch): a bad configuration shows up
 * here, not at sync. */
#define MR_CU_LAUNCHED(c, what)                                                        \
    do {                                                                               \
        cudaError_t e_ = cudaGetLastError();                                           \
        if (e_ == cudaSuccess)                                                         \
            e_ = (c)->launch_err;                                                      \
        (c)->launch_err = cudaSuccess;                                                 \
        if (e_ != cudaSuccess)                                                         \
            mr_cu_fail((c), "%s: launch failed: %s", (what), cudaGetErrorString(e_)); \
    } while (0)

#define MR_CU_TRY(c, call)                                                                   \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            mr_cu_fail((c), "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

/* mr_pdl_wait / mr_pdl_trigger and the launch helper mr_cu_launch. */
#include "kernels/cuda/cu_pdl.cuh"

/* Makes buf at least n bytes; false (and a sticky error) when it cannot. */
bool mr_cu_reserve(mr_cu_ctx *c, mr_cu_buf *buf, size_t n, const char *what);

static inline unsigned mr_cu_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* Blocks for a grid-stride elementwise kernel: enough to cover n, at most
 * 8 an SM (the kernels loop over the rest). */
static inline unsigned mr_cu_ew_blocks(const mr_cu_ctx *c, size_t n, unsigned threads)
{
    size_t b = mr_cu_blocks(n, threads), cap = (size_t)c->n_sm * 8;
    return (unsigned)(b < cap ? b : cap);
}

/* ---- device helpers ---- */
/* Inclusive scans of two counts over a warp's lanes at once (lane i gets
 * the sums over lanes 0..i). */
__device__ __forceinline__ void mr_warp_scan2(int *a, int *b)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, *a, o), y = __shfl_up_sync(0xffffffffu, *b, o);
        if (lane >= o) {
            *a += x;
            *b += y;
        }
    }
}

/* silu(x) = x / (1 + e^-x) as the convolutions write it (conv1d_silu and
 * the products that run it, mr_conv1_token). */
__device__ __forceinline__ float mr_siluf(float x) { return x / (1.0f + expf(-x)); }

/* silu(g) * u: the swiglu op's expression, shared by every kernel that
 * writes it (k_swiglu and the gate/up products that fuse it), so all of
 * them give the same floats. */
__device__ __forceinline__ float mr_silu_mul(float g, float u) { return mr_siluf(g) * u; }

/* One token of channel ch of a causal convolution of k taps (at most
 * MR_CU_CONV_TAPS) over `channels` channels, for a kernel that computes the
 * channel's new input itself (a delta-net in-projection's product with the
 * convolution in its launch): mr_conv1_fetch loads the channel's taps cw
 * (w[ch][k]) and old state cs (state[k - 1][channels], oldest first), which
 * no kernel of the step writes before the product, so they can be in flight
 * with its weights; mr_conv1_token then writes silu of conv1d_silu's sum (the
 * taps in order over the old state and v: k_conv1d_silu_seq's fmaf chain at
 * one token, so the same float) to y[ch] and moves the state on by v. */
__device__ __forceinline__ void mr_conv1_fetch(const float *w, const float *state, int64_t channels, int64_t ch,
                                               int k, float (&cw)[MR_CU_CONV_TAPS],
                                               float (&cs)[MR_CU_CONV_TAPS - 1])
{
#pragma unroll
    for (int j = 0; j < MR_CU_CONV_TAPS; j++) cw[j] = j < k ? w[ch * k + j] : 0.0f;
#pragma unroll
    for (int j = 0; j < MR_CU_CONV_TAPS - 1; j++) cs[j] = j < k - 1 ? state[(int64_t)j * channels + ch] : 0.0f;
}

__device__ __forceinline__ void mr_conv1_token(float v, const float (&cw)[MR_CU_CONV_TAPS],
                                               const float (&cs)[MR_CU_CONV_TAPS - 1], int k, int64_t channels,
                                               int64_t ch, float *state, float *y)
{
    const int hist = k - 1;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < MR_CU_CONV_TAPS; j++)
        if (j < k) s = fmaf(cw[j], j < hist ? cs[j] : v, s);
    y[ch] = mr_siluf(s);
#pragma unroll
    for (int i = 0; i < MR_CU_CONV_TAPS - 1; i++)
        if (i < hist) state[(int64_t)i * channels + ch] = i + 1 < hist ? cs[i + 1] : v;
}

__device__ __forceinline__ float mr_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float mr_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float mr_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float mr_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Little-endian loads at any alignment (GGUF blocks are packed). */
__device__ __forceinline__ uint16_t mr_ld_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
__device__ __forceinline__ uint32_t mr_ld_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Element o of a KV cache of dtype DT (mr_kv_dtype) gets v, rounded to
 * nearest (every writer of the cache converts the same way). */
template <int DT>
__device__ __forceinline__ void mr_kv_put(void *base, int64_t o, float v)
{
    if constexpr (DT == MR_KV_F32) ((float *)base)[o] = v;
    else if constexpr (DT == MR_KV_F16) ((__half *)base)[o] = __float2half_rn(v);
    else ((__nv_bfloat16 *)base)[o] = __float2bfloat16_rn(v);
}

/* Where position p of a sequence lies in a paged K/V cache (block table
 * table, bt positions a block): *ofs the element offset of its row's head
 * (kv_off, that head's offset inside a row of kvdim; kvdim 1 and kv_off 0
 * give the row), -1 when p is at or past P (not to be read) or its block
 * id is out of range, which *bad flags (the rows that see it become NaN). */
__device__ __forceinline__ void mr_kv_slot(const int32_t *table, int p, int P, int bt, int n_blocks,
                                           long long kv_off, int kvdim, long long *ofs, int *bad)
{
    long long o = -1;
    int b = 0;
    if (p < P) {
        const int blk = table[p / bt];
        if (blk >= 0 && blk < n_blocks)
            o = ((long long)blk * bt + p % bt) * kvdim + kv_off;
        else
            b = 1;
    }
    *ofs = o;
    *bad = b;
}

/* Kernel entry points shared between files (host side launchers). */
void mr_cu_matmul(mr_backend *be, const mr_weight *w, const float *x, float *y, int n);
const void *mr_cu_matvec_source(const mr_cu_ctx *c, const mr_weight *w, const float *x, size_t *bytes);
const void *mr_cu_matvec_id_source(const mr_cu_ctx *c, const mr_weight *w, const float *x, size_t *mat_bytes);
void mr_cu_matmul_id(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                     const int32_t *ids, int k, float *y, int n);
/* Prompt rows: the GEMM path at any size (cu_matmul.cu). */
void mr_cu_matmul_prompt(mr_backend *be, const mr_weight *w, const float *x, float *y, int n);
void mr_cu_matmul_id_prompt(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                            const int32_t *ids, int k, float *y, int n);
void mr_cu_moe_ffn_prompt(mr_backend *be, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd,
                          const float *x, const int32_t *ids, int k, float *gate, float *up, float *y, int n);
void mr_cu_swiglu(mr_backend *be, const float *gate, const float *up, float *out, size_t n);
/* m (2..3) matmuls, or one-token matmul_ids, over the same input in one
 * launch, bitwise equal to the m calls; false (nothing launched) when they
 * cannot share one (cu_matmul.cu; the op recorder fuses q/k/v and gate/up). */
bool mr_cu_matmul_multi(mr_backend *be, const mr_weight *const *w, float *const *y, int m,
                        const float *x, int n);
/* The same for m prompt products (matmul_prompt calls, 2..MR_CU_MV_SUBS):
 * one GEMM over the joined rows (mr_cu_matmul_gemm_multi); a row's result
 * is a function of the joined shape, not of the tokens (the op recorder
 * joins q/k/v and gate/up of a prompt chunk; MEMRA_CUDA_FUSE_PROMPT=0 off). */
bool mr_cu_matmul_prompt_multi(mr_backend *be, const mr_weight *const *w, float *const *y, int m, const float *x,
                               int n);
/* One token's m (1..4) matmuls over x, then conv1d_silu(y[0], conv, state,
 * 1, rows of w[0], k, out), in one launch where the kernel those products
 * would run has that form (the 22-bit one, cu_fast.cuh
 * mr_cu_x24_matvec_conv): bitwise what the calls write; false, nothing
 * launched, otherwise (the op recorder's rule for a delta-net layer's
 * in-projection and convolution). */
bool mr_cu_matmul_multi_conv(mr_backend *be, const mr_weight *const *w, float *const *y, int m, const float *x,
                             const float *conv, float *state, int k, float *out);
/* The end of a mixture layer as one launch (cu_ops.cu; the op recorder's
 * rule): moe_combine(y, cw, n, k, dim) -> proj; with sh, sigmoid_mul(sh,
 * g, n, dim, gs, scalar) and add(proj, sh); then add_rmsnorm(xres, proj,
 * w, out, n, dim, eps).  Every value those ops write is written, with the
 * same floats (each element's operations in the same order); false,
 * nothing launched, where the shapes or alignment do not allow it.  xq
 * (from mr_cu_xmd_il_prepare, of xq_type; NULL: none): out's rows are also
 * written there as the interleaved operand of the decode products. */
bool mr_cu_moe_tail(mr_backend *be, const float *y, const float *cw, int n, int k, int dim, float *proj, float *sh,
                    const float *g, int gs, float *xres, const float *w, float *out, float eps, uint8_t *xq,
                    int xq_type);
bool mr_cu_matmul_id_multi(mr_backend *be, const mr_weight *const *w, float *const *y, int m,
                           const float *x, int x_slots, const int32_t *ids, int k, int n);
/* attention_multi (ops.h) whose merge also writes the o product's
 * interleaved operand of its rows at xq (from mr_cu_xmd_il_prepare, of
 * xq_type; cu_attn.cu k_attn_merge_xq): the attention runs either way;
 * true where the operand was written (false: a row shape that form does
 * not take). */
bool mr_cu_attention_multi_xq(mr_backend *be, const mr_kv_cache *kv, int layer, const int32_t *const *tables,
                              const float *q, const int32_t *pos, int n, int n_heads, float scale, float *out,
                              uint8_t *xq, int xq_type);
/* rmsnorm(x, w, out) then swiglu(z, out, out) (a delta-net layer's gated
 * norm) as one launch with the floats of the two (cu_ops.cu; the op
 * recorder's rule); false, nothing launched, where the shapes or alignment
 * do not allow it.  z may not overlap x or out; out may be x. */
bool mr_cu_rmsnorm_gate(mr_backend *be, const float *x, const float *w, const float *z, float *out, int n_rows,
                        int dim, float eps);
/* A decode batch's delta-net layer, one token of each of nseg sequences:
 * for each segment s in order, conv1d_silu(x + s C, cw, conv_states[s], 1,
 * C, k, conv_y + s C) and gdn_scan(conv_y + s C, C, alpha + s nv, beta + s
 * nv, a, dt_bias, states[s], 1, nk, nv, dk, dv, eps, out + s nv dv) with C =
 * 2 nk dk + nv dv, as two launches (a segments' convolution, then their
 * scan) a MR_CU_SEGS of segments, with the floats of those calls (cu_gdn.cu;
 * the op recorder's rule, which checks that nothing one segment writes is
 * read or written by another); false, nothing launched, where the shape is
 * not taken (k above MR_CU_CONV_TAPS, a shape gdn_scan refuses). */
bool mr_cu_gdn_segs(mr_backend *be, const float *x, const float *cw, float *const *conv_states, int k,
                    float *conv_y, const float *alpha, const float *beta, const float *a, const float *dt_bias,
                    float *const *states, int nseg, int n_k_heads, int n_v_heads, int dk, int dv, float eps,
                    float *out);
/* A batch's scans side by side in one launch: for each segment s,
 * gdn_scan(qkv + t0[s] stride, stride, alpha + t0[s] nv, beta + t0[s] nv,
 * a, dt_bias, states[s], n[s], ...) -> out + t0[s] nv dv, on the tiled
 * kernel, whose bits are those of every scan kernel (cu_gdn.cu; the op
 * recorder's rule for prompt chunks of several sequences).  The caller
 * asks mr_cu_gdn_scan_segs_ok first (the tiled kernel on and fitting). */
bool mr_cu_gdn_scan_segs_ok(mr_backend *be, int n_k_heads, int n_v_heads, int dk, int dv, int stride);
void mr_cu_gdn_scan_segs(mr_backend *be, const float *qkv, int stride, const float *alpha, const float *beta,
                         const float *a, const float *dt_bias, float *const *states, const int *t0, const int *n,
                         int nseg, int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out);
/* gdn_scan(qkv, stride, alpha, beta, a, dt_bias, state, 1, ...) with the
 * state loaded before the PDL wait, for a caller that knows the launch
 * before it does not write the state (the op recorder, after a delta-net
 * in-projection whose launch ran the convolution): the same floats; false,
 * nothing launched, where gdn_scan would refuse the shape. */
bool mr_cu_gdn_scan_early(mr_backend *be, const float *qkv, int stride, const float *alpha, const float *beta,
                          const float *a, const float *dt_bias, float *state, int n_k_heads, int n_v_heads, int dk,
                          int dv, float eps, float *out);
/* matmul (or one token's matmul_id) of a gate and an up matrix over the same
 * input, then swiglu(y[0], y[1]) into o (o may be y[0]), as one launch with
 * the floats of the three ops (cu_matmul.cu; the op recorder fuses a
 * SwiGLU MLP's first half); false, nothing launched, when it cannot. */
bool mr_cu_matmul_glu(mr_backend *be, const mr_weight *const *w, float *const *y, float *o, const float *x,
                      int x_slots, const int32_t *ids, int k, int n);
void mr_cu_get_rows(mr_backend *be, const mr_weight *w, const int32_t *ids, int n, float *out);
/* qk_norm_rope followed by the K/V store of the same keys (cu_ops.cu): the
 * key blocks also write their rotated rows into the cache and extra blocks
 * copy v, the same values kv_store writes; table for one sequence or
 * tables[t] a token (multi-sequence). */
void mr_cu_qk_norm_rope_kv(mr_backend *be, float *q, float *k, const float *qw, const float *kw,
                           const int32_t *pos, int n, int n_heads, int n_kv_heads, int head_dim, int n_rot,
                           float theta_base, enum mr_rope_mode mode, float eps, mr_kv_cache *kv, int layer,
                           const int32_t *table, const int32_t *const *tables, const float *v);
int mr_cu_weight_prepare(mr_backend *be, mr_weight *w, mr_err *err);
void mr_cu_weight_free_priv(mr_backend *be, mr_weight *w);
/* Asks L2 for bytes at p on stream st (cu_l2pf.cu; hint 1: evict_last);
 * nothing is read into registers or written.  Returns the launch's error
 * (the caller decides: a hint's failure need not fail the context) and
 * counts a launch made in *launches (none where there is nothing to ask). */
cudaError_t mr_cu_l2_prefetch(const mr_cu_ctx *c, cudaStream_t st, const void *p, size_t bytes, int hint,
                              long *launches);
/* The same for the matrices ids[0 .. pairs - 1] pick of a stack of n_mats
 * at base, mat_bytes each (read on the device when the launch runs). */
cudaError_t mr_cu_l2_prefetch_ids(const mr_cu_ctx *c, cudaStream_t st, const void *base, size_t mat_bytes,
                                  const int32_t *ids, int pairs, int n_mats, int hint, long *launches);
void mr_cu_install_ops(mr_backend *be);
void mr_cu_install_attn(mr_backend *be);
void mr_cu_install_gdn(mr_backend *be); /* cu_gdn.cu: the hybrid-model ops */
void mr_cu_install_sample(mr_backend *be); /* cu_sample.cu: sampling on the device */
/* Decode matvec settings read once at backend creation (cu_fast.cu). */
void mr_cu_fast_init(mr_cu_ctx *c);
bool mr_cu_type_supported(int type);
/* Prompt products of IQ4_XS (and Q4_K) on the int8 tensor cores
 * (cu_moemmp.cu): whether they take w; then y (and y2 for w2, of w's
 * shape) = w times n_rows input rows (row i is row src[i] of x, src NULL:
 * row i, negative: zeros; silu(x) * u where u is not NULL) quantized into
 * pl planes (2, or 3 for float32-grade sums), on the grouping's tiles of at
 * most mr_cu_xmp_tile_tokens rows (cu_gemm.cu; dst[i] the output row of
 * row i) or with tiles NULL densely (output row i). */
bool mr_cu_xmp_init(mr_cu_ctx *c);
bool mr_cu_xmp_takes(const mr_cu_ctx *c, const mr_weight *w);
void mr_cu_xmp_product(mr_cu_ctx *c, const mr_weight *w, const mr_weight *w2, const float *x, const int32_t *src,
                       const float *u, int n_rows, int pl, const int32_t *dst, const void *tiles, const int *n_tiles,
                       int64_t max_tiles, float *y, float *y2);
int mr_cu_xmp_tile_tokens(void);
/* Prompt expert products of Q4_K, Q6_K and IQ4_XS on the float16 tensor cores (cu_moemmh.cu):
 * whether they take w; then y (and y2 for w2) = w times the float16
 * operand rows X (cu_gemm.cu prepare_x: row i scaled by 1 / scale[i]) on
 * the grouping's tiles of at most MR_CU_XMH_TOKENS rows (the float16
 * expert kernel's, whose launcher calls these), operand row i into output
 * row dst[i]. */
#define MR_CU_XMH_TOKENS 64
bool mr_cu_xmh_init(mr_cu_ctx *c);
bool mr_cu_xmh_takes(const mr_cu_ctx *c, const mr_weight *w);
void mr_cu_xmh_product(mr_cu_ctx *c, const mr_weight *w, const mr_weight *w2, const __half *X, const float *scale,
                       const int32_t *dst, const void *tiles, const int *n_tiles, int64_t max_tiles, float *y,
                       float *y2);
/* The operand of k_xmp and k_xmd for Q4_K at 3 planes (22 bits): n_rows
 * rows of x quantized into buf; NULL when the reserve fails. */
const uint8_t *mr_cu_xmp_operand_q4k3(mr_cu_ctx *c, mr_cu_buf *buf, const float *x, int n_rows, int cols);
const uint8_t *mr_cu_xmp_operand_iq4x3(mr_cu_ctx *c, mr_cu_buf *buf, const float *x, int n_rows, int cols);
/* Decode batches of dense Q4_K products on the int8 tensor cores
 * (cu_mvxmd.cu): whether they take the m matrices w (one launch for all,
 * over one input); then y[s] = w[s] times the n rows of x, every token's
 * rows the same bits at any n. */
void mr_cu_xmd_init(mr_cu_ctx *c);
bool mr_cu_xmd_takes(const mr_cu_ctx *c, const mr_weight *const *w, int m);
bool mr_cu_xmd_matvec(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x, int n);
/* Where a product of w over n rows (alone or with matrices like it) would
 * read the interleaved operand (cu_xmp.cuh xmd_il_at) that a launch before
 * it may write: the operand's place, reserved in the context's scratch,
 * and *type, the type it is quantized for; NULL otherwise, or where
 * MEMRA_CUDA_FUSE_XQ leaves the writer `from` out (1 the end of a mixture
 * layer, 2 an attention merge).  Forgets any operand noted before. */
uint8_t *mr_cu_xmd_il_prepare(mr_cu_ctx *c, const mr_weight *w, int n, int from, int *type);
/* Notes that the launch just made wrote that operand of the n rows of x
 * (cols wide): the next product over exactly them takes it instead of
 * quantizing x again.  The op recorder forgets the note after the launch
 * that follows (cu_autograph.cu run_direct). */
void mr_cu_xmd_il_made(mr_cu_ctx *c, const float *x, int n, int cols, int type);
/* One token's m matrices where mr_cu_xmd_matvec takes them on k_xmd1 at 2
 * blocks an SM, with conv1d_silu of matrix 0's outputs in the launch (as
 * mr_cu_x24_matvec_conv); false, nothing launched, otherwise. */
bool mr_cu_xmd_matvec_conv(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x,
                           const float *conv, float *state, int k, float *out);
/* Prompt products (cu_gemm.cu). */
void mr_cu_gemm_init(mr_cu_ctx *c);
void mr_cu_prefer_float32(mr_backend *be);
/* Drops the cached graphs (a scratch buffer they use was reallocated). */
void mr_cu_autograph_forget(mr_cu_ctx *c);
void mr_cu_matmul_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n);
/* m (2..MR_CU_MV_SUBS) prompt products over one input as one float16 GEMM
 * (cu_gemm.cu): false, nothing launched, where the shapes or the mode do not
 * allow it (the caller then makes the m calls). */
bool mr_cu_matmul_gemm_multi(mr_cu_ctx *c, const mr_weight *const *w, float *const *y, int m, const float *x, int n);
/* Small prompt products in float32 (cu_sgemm.cu): whether mr_cu_matmul_gemm
 * sends w there (x3: in f16x3 mode). */
void mr_cu_small_gemm_init(mr_cu_ctx *c);
bool mr_cu_small_gemm_takes(const mr_cu_ctx *c, const mr_weight *w, bool x3);
void mr_cu_small_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n);
/* y[e] = part[0][e] + part[1][e] + ... + part[nc - 1][e] (parts of total
 * floats), added in that order (cu_sgemm.cu). */
void mr_cu_join_partials(mr_cu_ctx *c, const float *part, int nc, size_t total, float *y);
/* The float16 GEMM whose rows do not depend on the call (cu_hgemm.cu):
 * C = alpha A^T B + beta C as cublasGemmStridedBatchedEx with CUBLAS_OP_T,
 * CUBLAS_OP_N and float32 C; false, nothing done, for operands it cannot
 * load (k, lda, ldb, strides not multiples of 8, or A, B not 16-byte aligned). */
void mr_cu_hgemm_init(mr_cu_ctx *c);
bool mr_cu_hgemm(mr_cu_ctx *c, int m, int n, int k, float alpha, const __half *A, int lda, long long sa,
                 const __half *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch);
bool mr_cu_matmul_id_gemm(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                          const int32_t *ids, int k, float *y, int n);
bool mr_cu_moe_ffn_gemm(mr_cu_ctx *c, const mr_weight *wg, const mr_weight *wu, const mr_weight *wd, const float *x,
                        const int32_t *ids, int k, float *gate, float *up, float *y, int n);
/* Decode products with int8 activations (cu_mvq8.cu): false when not
 * selected or not applicable (the caller then runs the float32 kernels). */
bool mr_cu_q8_init(mr_cu_ctx *c, mr_err *err);
/* The matvec with 22-bit integer activations (cu_mvx24.cu): the shared
 * memory its launches may ask for, read at backend creation. */
void mr_cu_x24_init(mr_cu_ctx *c);
bool mr_cu_q8_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n);
bool mr_cu_q8_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                        const int32_t *ids, int k, float *y, int n);
/* Prompt attention on the tensor cores (cu_fattn.cu), for head sizes where
 * mr_cu_attn_tc_fits, from position c->attn_tc_from on. */
void mr_cu_attn_init(mr_cu_ctx *c);
/* The tensor-core decode split's shared memory opt-in (cu_attn.cu), at
 * backend creation; false (said on stderr, attn_dec_tc then INT_MAX) where
 * the device refuses it. */
bool mr_cu_attn_dec_init(mr_cu_ctx *c);
static inline bool mr_cu_attn_tc_fits(int D) { return D == 64 || D == 128 || D == 256; }
/* pos_max: the last row's position where the host knows it (a prompt call's
 * pos_first + n - 1), else -1 (mr_cu_pf_launches). */
void mr_cu_attn_prefill_tc(mr_cu_ctx *c, const mr_kv_cache *kv, int layer,
                           const int32_t *block_table, const float *q, const int32_t *pos, int n,
                           int n_heads, float scale, float *out, int pos_max);
/* How many leading rows of a prompt call whose first position is pos_first
 * (-1: unknown to the host) take the float32 kernel; the rest take the
 * tensor-core one (cu_attn.cu). */
int mr_cu_attn_f32_rows(const mr_cu_ctx *c, int D, int pos_first, int n);
/* Prompt attention's keys in slices over several blocks (cu_attn.cu, where
 * the why is written): slices of PF_SLICE positions at fixed places, worker
 * z of PF_WORKERS a (query tile, head) walking slices z, z + PF_WORKERS,
 * ...  A launch holds only the workers that can see keys of its rows (RW of
 * them, the records a row has room for) and as many rows as PF_ROWS x
 * PF_WORKERS records fill. */
#define PF_SLICE 1024
#define PF_WORKERS 8
#define PF_ROWS 512
/* The records of both prompt kernels (c->scratch_pfa, sized for rows
 * queries of rw records) or NULL (recorded failure). */
float *mr_cu_pf_records(mr_cu_ctx *c, int rows, int rw, int n_heads, int D);
/* Joins the records (rw a row) of n queries (positions pos) into out, in
 * worker order; rows before PF_SLICE are left alone (the prompt kernels
 * write those rows' out themselves: one record, whose merge was the
 * one-block walk's division).  base2: the tensor-core kernel's records
 * (maxima in log2 units, normalisation a multiplication by 1 / sum), else
 * the float32 kernel's. */
void mr_cu_pf_merge(mr_cu_ctx *c, const float *part, const int32_t *pos, int n, int rw, int n_heads, int D,
                    bool base2, float *out);
/* Both prompt kernels' launch loop.  pos_max: where the host knows the
 * rows' positions (a prompt call: consecutive, the last pos_max), else -1.
 *   - One block a tile, no records (RW 1, part NULL, all n rows in one
 *     launch) with MEMRA_CUDA_PF_SPLIT=0 or when every row sits before
 *     PF_SLICE: such a row has one record, whose merge gives the one-block
 *     walk's bits (run 199: the merge was 22.5 us a 512-row launch of the
 *     30B-A3B, 48 a 512-token prompt).
 *   - Else RW workers: PF_WORKERS where the positions are unknown, else the
 *     slices the last row sees (a 2,048-token prompt from 0: 2; workers past
 *     them would find no key and leave); PF_ROWS x PF_WORKERS / RW rows a
 *     launch (the records' memory of PF_ROWS rows of PF_WORKERS); the merge
 *     only over the rows at or past PF_SLICE.
 * launch(r0, nr, RW, part) launches the kernel over rows r0 .. r0 + nr - 1
 * with RW workers a tile writing records to part (NULL: out directly). */
template <typename F>
static inline void mr_cu_pf_launches(mr_cu_ctx *c, const int32_t *pos, int n, int n_heads, int D, bool base2,
                                     float *out, int pos_max, F launch)
{
    const bool known = pos_max >= 0, one = !c->pf_split || (known && pos_max < PF_SLICE);
    const int RW = one ? 1 : known && pos_max / PF_SLICE < PF_WORKERS ? pos_max / PF_SLICE + 1 : PF_WORKERS;
    const int cap = PF_ROWS * PF_WORKERS / RW, rows = !one && n > cap ? cap : n;
    float *part = NULL;
    if (!one && !(part = mr_cu_pf_records(c, rows, RW, n_heads, D)))
        return; /* the recorded failure */
    for (int r0 = 0; r0 < n; r0 += rows) {
        const int nr = n - r0 < rows ? n - r0 : rows;
        launch(r0, nr, RW, part);
        if (one)
            continue;
        /* rows before PF_SLICE have their out already (known positions:
         * pos_max - n + 1 + r for row r) */
        const int skip = known ? PF_SLICE - (pos_max - n + 1 + r0) : 0;
        if (skip >= nr)
            continue;
        const int m0 = skip > 0 ? skip : 0;
        mr_cu_pf_merge(c, part + (size_t)m0 * n_heads * RW * (D + 2), pos + r0 + m0, nr - m0, RW, n_heads, D, base2,
                       out + (size_t)(r0 + m0) * n_heads * D);
    }
}
/* Automatic graphs (cu_autograph.cu): launches what the ops recorded. */
void mr_cu_flush(mr_backend *be);
void mr_cu_autograph_install(mr_backend *be);
void mr_cu_autograph_free(mr_backend *be);
extern "C" void mr_cu_autograph_stats(mr_backend *be, long *captures, long *replays);

#endif

/* Measurement helpers for the GPU benchmark and check programs (C-callable),
 * and the facts about the CUDA backend's dispatch that they need. */
#ifndef MR_CU_BENCH_H
#define MR_CU_BENCH_H

#include <stddef.h>

/* Matrix products of this many tokens or more take the dequantize + GEMM
 * path (cu_gemm.cu); fewer run the matvec kernels, 8 tokens a launch (a
 * decode batch reads the quantized weights a few times instead of writing
 * and reading a float16 copy; a prompt amortises the copy). */
#define MR_CU_GEMM_MIN_TOKENS 65

#ifdef __cplusplus
extern "C" {
#endif

/* Device-to-device copy of `bytes` repeated `iters` times; returns GB/s
 * counting bytes read plus bytes written, or a negative value on error. */
double mr_cuda_copy_bandwidth(size_t bytes, int iters);
/* Seconds per call of fn(arg) (already enqueued on the backend's stream),
 * timed with device events over iters calls after warm warm-up calls. */
struct mr_backend;
double mr_cuda_time(struct mr_backend *be, void (*fn)(void *), void *arg, int warm, int iters);
/* Whether a one-token product of w goes to the int8 tensor-core decode
 * kernels (cu_mvxmd.cu mr_cu_xmd_takes): that a check reaches them. */
struct mr_weight;
int mr_cu_xmd_takes_one(struct mr_backend *be, const struct mr_weight *w);
/* Graphs captured and replayed by the automatic graph layer so far. */
void mr_cu_autograph_stats(struct mr_backend *be, long *captures, long *replays);
/* MEMRA_CUDA_BUSY=1: the work the graph layer flushed so far: its device
 * time (each flush between two events), the host's time recording it
 * (from a flush's first op to the flush) and flushing it (signatures,
 * graph launches), in ms, and the flushes; zeroed after if reset.  Waits
 * for the flushed work.  0 when the layer does not time them. */
typedef struct mr_cu_busy_stats {
    double device_ms, record_ms, flush_ms;
    long flushes;
} mr_cu_busy_stats;
int mr_cu_busy(struct mr_backend *be, int reset, mr_cu_busy_stats *out);
/* Ops so far that ran inside another op's launch: matmuls sharing a launch
 * over one input (q/k/v, gate/up), K/V stores inside the qk_norm_rope
 * before them, swiglus inside their gate/up launch, a mixture layer's
 * last ops inside the add_rmsnorm after them (mr_cu_moe_tail), swiglus
 * gating an RMSNorm's rows inside its launch (mr_cu_rmsnorm_gate); xq:
 * dense decode products whose interleaved operand a mixture layer's end
 * wrote (mr_cu_xmd_il_made), so without a quantization launch. */
typedef struct mr_cu_fusions {
    long mv, kv, glu, tail, gnorm, conv, segs, scan_early, prompt, xq;
} mr_cu_fusions;
void mr_cu_autograph_fusions(struct mr_backend *be, mr_cu_fusions *f);
/* Nodes (kernels, copies) of the last graph it captured; 0 before any. */
long mr_cu_autograph_nodes(struct mr_backend *be);
/* MEMRA_CUDA_L2PF: the prefetch kernels its graph captures took so far
 * (cu_autograph.cu l2pf_fork): that a check reached them. */
long mr_cu_l2pf_launches(struct mr_backend *be);
/* MEMRA_CUDA_BRANCH: the shared-expert branches launched into its graph
 * captures so far (cu_autograph.cu side_mlp). */
long mr_cu_branch_forks(struct mr_backend *be);
/* MEMRA_CUDA_PROFILE: forgets the op times summed so far (e.g. a warm-up's
 * first calls, which load modules); no-op without a profile. */
void mr_cu_profile_reset(struct mr_backend *be);
/* How the backend launches its kernels (cu_pdl.cuh): 0 plain, 1 with
 * programmatic dependent launch (the default on sm_90+; every kernel waits
 * first). */
int mr_cuda_pdl_mode(struct mr_backend *be);
/* Launches so far of the decode batches' expert products with several row
 * tiles a warp (cu_moemma.cu, MEMRA_CUDA_XMM_TPW): that a check reached
 * them. */
long mr_cu_xmm_tiles_launches(struct mr_backend *be);
/* One op of a decode step as a phase of a persistent kernel against a
 * launch of a PDL chain (cu_persist.cu): per phase of `bytes` of weights,
 * bps blocks an SM, best of iters runs of `phases` phases, microseconds:
 * out_us[0] the grid barrier alone, [1] load after the barrier, [2] the
 * weights prefetched into shared memory before it, [3] an empty kernel of
 * the chain, [4] the load body as a chain kernel, [5] the same with its
 * first weight loads issued before the wait.  Returns the grid size,
 * or a negative value when the device or the shape does not allow it. */
int mr_cuda_phase_bench(size_t bytes, int bps, int phases, int iters, double out_us[6]);
/* Device name and multiprocessor count, for reports. */
void mr_cuda_device_info(char *name, size_t n, int *sm);

#ifdef __cplusplus
}
#endif
#endif

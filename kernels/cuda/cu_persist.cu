/* A measurement for the bench program, not a kernel the backend runs: what
 * one op of a decode step costs as a phase of a persistent kernel (its
 * blocks stay resident; phases are separated by a grid barrier) against the
 * same op as a launch in a graph-replayed chain with programmatic dependent
 * launch, which is how a decode step runs today (docs/GPU-NOTES.md 56).
 *
 * Every phase is a stand-in for a one-token product: each block sums its
 * slice of the phase's own weight bytes (phases never share bytes, so the
 * weights come from memory as a step's do) against an input it first reads
 * from another block's output of the phase before (a real dependence, an L2
 * round trip), and writes one partial.  Three persistent forms:
 *   PB_EMPTY     the barrier alone;
 *   PB_LOAD      after the barrier: input, then the weight slice from memory;
 *   PB_PREFETCH  the next phase's slice copied into shared memory (cp.async)
 *                before the barrier, which the weights do not depend on.
 * The chain runs the PB_LOAD phase body as one kernel a phase (and an empty
 * kernel for the barrier's counterpart), launched as the backend launches
 * (mr_cu_launch: with programmatic dependent launch from sm_90).  A fourth
 * chain form, PB_EARLY, loads the first PB_EARLY_LOADS x PB_THREADS uint4
 * of its slice into registers before griddepcontrol.wait (the weights are
 * not written by the kernel before it, so cu_pdl.cuh's rule allows it):
 * what a one-token product gains by issuing its weight loads while the
 * previous op still runs. */
#include <cuda_pipeline_primitives.h>
#include <stdio.h>

#include "kernels/cuda/cu_bench.h"
#include "kernels/cuda/cu_common.cuh"

#define PB_THREADS 256
#define PB_EARLY_LOADS 8 /* uint4 a thread the early chain form holds in registers */
enum { PB_EMPTY = 0, PB_LOAD = 1, PB_PREFETCH = 2, PB_EARLY = 3 };

/* All blocks of the grid meet: a monotonic counter, each block adds one a
 * phase and waits for gridDim.x * (phase + 1). */
__device__ __forceinline__ void pb_barrier(unsigned *bar, unsigned target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

/* One uint4 of weights against x, added to acc (a stand-in for a product's
 * work on 16 bytes). */
__device__ __forceinline__ float pb_term(uint4 v, float x, float acc)
{
    return fmaf((float)(v.x & 0xffu) + (float)(v.y >> 24) + (float)(v.z & 0xffu) + (float)(v.w >> 24), x, acc);
}

/* The block's threads' acc added into one float (red: a float a warp). */
__device__ __forceinline__ float pb_block_sum(float acc, float *red)
{
    acc = mr_warp_sum(acc);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < PB_THREADS / 32; i++) s += red[i];
    __syncthreads();
    return s;
}

/* The block's sum of its slice (n16 uint4) against x, reduced to one float. */
__device__ __forceinline__ float pb_slice_sum(const uint4 *w, size_t n16, float x, float *red)
{
    float acc = 0.0f;
    for (size_t i = threadIdx.x; i < n16; i += PB_THREADS) acc = pb_term(w[i], x, acc);
    return pb_block_sum(acc, red);
}

/* W: phases x gridDim.x slices of n16 uint4; part: [2][gridDim.x]. */
template <int MODE>
__global__ void __launch_bounds__(PB_THREADS) k_pb_persist(const uint4 *W, size_t n16, float *part, unsigned *bar,
                                                           int phases)
{
    extern __shared__ uint4 pb_sh[]; /* PB_PREFETCH: two slices */
    __shared__ float red[PB_THREADS / 32];
    const unsigned G = gridDim.x, b = blockIdx.x;
    const uint4 *mine = W + (size_t)b * n16;
    const size_t phase_stride = (size_t)G * n16;
    if (MODE == PB_PREFETCH) {
        for (size_t i = threadIdx.x; i < n16; i += PB_THREADS) __pipeline_memcpy_async(pb_sh + i, mine + i, 16);
        __pipeline_commit();
    }
    for (int p = 0; p < phases; p++) {
        if (MODE != PB_EMPTY) {
            const float x = p ? __ldcg(part + ((p - 1) & 1) * G + (b + 1) % G) : 1.0f;
            float s;
            if (MODE == PB_PREFETCH) {
                __pipeline_wait_prior(0);
                __syncthreads();
                const uint4 *cur = pb_sh + (size_t)(p & 1) * n16;
                if (p + 1 < phases) { /* the next phase's slice, into the other half */
                    const uint4 *nx = mine + (size_t)(p + 1) * phase_stride;
                    uint4 *dst = pb_sh + (size_t)((p + 1) & 1) * n16;
                    for (size_t i = threadIdx.x; i < n16; i += PB_THREADS) __pipeline_memcpy_async(dst + i, nx + i, 16);
                    __pipeline_commit();
                }
                s = pb_slice_sum(cur, n16, x, red);
            } else {
                s = pb_slice_sum(mine + (size_t)p * phase_stride, n16, x, red);
            }
            if (threadIdx.x == 0) part[(p & 1) * G + b] = s * 1e-9f + 1.0f;
        }
        pb_barrier(bar, G * (unsigned)(p + 1));
    }
}

/* One phase of the chain (PB_LOAD's body, or nothing). */
template <int MODE>
__global__ void __launch_bounds__(PB_THREADS) k_pb_phase(const uint4 *W, size_t n16, float *part, int p)
{
    mr_pdl_wait();
    mr_pdl_trigger();
    if (MODE == PB_EMPTY)
        return;
    __shared__ float red[PB_THREADS / 32];
    const unsigned G = gridDim.x, b = blockIdx.x;
    const float x = p ? __ldcg(part + ((p - 1) & 1) * G + (b + 1) % G) : 1.0f;
    const float s = pb_slice_sum(W + (size_t)p * G * n16 + (size_t)b * n16, n16, x, red);
    if (threadIdx.x == 0) part[(p & 1) * G + b] = s * 1e-9f + 1.0f;
}

/* PB_EARLY: the slice's first loads issued before the wait, the input read
 * after it, the rest of the slice (beyond what the registers hold) after
 * that; the same sum as PB_LOAD up to the order of its terms. */
__global__ void __launch_bounds__(PB_THREADS) k_pb_phase_early(const uint4 *W, size_t n16, float *part, int p)
{
    const unsigned G = gridDim.x, b = blockIdx.x;
    const uint4 *w = W + (size_t)p * G * n16 + (size_t)b * n16;
    uint4 pre[PB_EARLY_LOADS];
#pragma unroll
    for (int k = 0; k < PB_EARLY_LOADS; k++) {
        const size_t i = threadIdx.x + (size_t)k * PB_THREADS;
        pre[k] = i < n16 ? w[i] : make_uint4(0, 0, 0, 0);
    }
    mr_pdl_wait();
    mr_pdl_trigger();
    __shared__ float red[PB_THREADS / 32];
    const float x = p ? __ldcg(part + ((p - 1) & 1) * G + (b + 1) % G) : 1.0f;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < PB_EARLY_LOADS; k++) acc = pb_term(pre[k], x, acc);
    for (size_t i = threadIdx.x + (size_t)PB_EARLY_LOADS * PB_THREADS; i < n16; i += PB_THREADS)
        acc = pb_term(w[i], x, acc);
    const float s = pb_block_sum(acc, red);
    if (threadIdx.x == 0) part[(p & 1) * G + b] = s * 1e-9f + 1.0f;
}

static float pb_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = -1.0f;
    if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess)
        return -1.0f;
    return ms;
}

extern "C" int mr_cuda_phase_bench(size_t bytes, int bps, int phases, int iters, double out_us[6])
{
    int dev = 0, nsm = 0, coop = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (!coop || bps < 1 || phases < 2 || iters < 1)
        return -1;
    const int G = nsm * bps;
    const size_t n16 = (bytes / 16 + G - 1) / G; /* uint4 a block a phase */
    const size_t smem = 2 * n16 * 16;
    if (smem > 200 * 1024 / (size_t)bps)
        return -2;
    uint4 *W = NULL;
    float *part = NULL;
    unsigned *bar = NULL;
    cudaStream_t st = NULL;
    cudaGraph_t g[3] = {NULL, NULL, NULL};
    cudaGraphExec_t ge[3] = {NULL, NULL, NULL};
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -3;
    /* the chain's launches go through the backend's launch helper (cu_pdl.cuh):
     * a context of its own with just the stream and the PDL switch */
    mr_cu_ctx cx{};
    if (cudaMalloc(&W, (size_t)phases * G * n16 * 16) != cudaSuccess || cudaMalloc(&part, 2 * G * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&bar, sizeof(unsigned)) != cudaSuccess || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
        goto out;
    cx.stream = st;
    cx.pdl = major >= 9;
    if (cudaMemset(W, 0x5a, (size_t)phases * G * n16 * 16) != cudaSuccess ||
        cudaMemset(part, 0, 2 * G * sizeof(float)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        goto out;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    if (cudaFuncSetAttribute(k_pb_persist<PB_PREFETCH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        goto out;
    {
        /* the persistent forms: one cooperative launch of `phases` phases */
        void (*kp[3])(const uint4 *, size_t, float *, unsigned *, int) = {k_pb_persist<PB_EMPTY>, k_pb_persist<PB_LOAD>,
                                                                         k_pb_persist<PB_PREFETCH>};
        for (int m = 0; m < 3; m++) {
            int fit = 0;
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kp[m], PB_THREADS, m == PB_PREFETCH ? smem : 0);
            if (fit < bps) {
                rc = -4;
                goto out;
            }
            double best = 1e30;
            for (int it = 0; it < iters; it++) {
                cudaMemsetAsync(bar, 0, sizeof(unsigned), st);
                const uint4 *Wc = W;
                size_t n = n16;
                float *pc = part;
                unsigned *bc = bar;
                int ph = phases;
                void *args[] = {(void *)&Wc, (void *)&n, (void *)&pc, (void *)&bc, (void *)&ph};
                cudaEventRecord(e0, st);
                if (cudaLaunchCooperativeKernel((const void *)kp[m], G, PB_THREADS, args, m == PB_PREFETCH ? smem : 0, st) !=
                    cudaSuccess)
                    goto out;
                cudaEventRecord(e1, st);
                const float ms = pb_ms(e0, e1);
                if (ms > 0 && ms < best) best = ms;
            }
            out_us[m] = best * 1e3 / phases;
        }
        /* the chains: `phases` launches with programmatic dependent launch,
         * captured once and replayed */
        for (int m = 0; m < 3; m++) { /* PB_EMPTY, PB_LOAD, then PB_EARLY */
            if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
                goto out;
            for (int p = 0; p < phases; p++) {
                if (m == PB_EMPTY)
                    mr_cu_launch(&cx, k_pb_phase<PB_EMPTY>, dim3(G), dim3(PB_THREADS), 0, (const uint4 *)W, n16, part, p);
                else if (m == PB_LOAD)
                    mr_cu_launch(&cx, k_pb_phase<PB_LOAD>, dim3(G), dim3(PB_THREADS), 0, (const uint4 *)W, n16, part, p);
                else
                    mr_cu_launch(&cx, k_pb_phase_early, dim3(G), dim3(PB_THREADS), 0, (const uint4 *)W, n16, part, p);
            }
            if (cudaStreamEndCapture(st, &g[m]) != cudaSuccess || cudaGraphInstantiate(&ge[m], g[m], 0) != cudaSuccess)
                goto out;
            double best = 1e30;
            for (int it = 0; it < iters; it++) {
                cudaEventRecord(e0, st);
                cudaGraphLaunch(ge[m], st);
                cudaEventRecord(e1, st);
                const float ms = pb_ms(e0, e1);
                if (ms > 0 && ms < best) best = ms;
            }
            out_us[3 + m] = best * 1e3 / phases;
        }
    }
    rc = cudaStreamSynchronize(st) == cudaSuccess ? G : -5;
out:
    for (int m = 0; m < 3; m++) {
        if (ge[m]) cudaGraphExecDestroy(ge[m]);
        if (g[m]) cudaGraphDestroy(g[m]);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (st) cudaStreamDestroy(st);
    cudaFree(W);
    cudaFree(part);
    cudaFree(bar);
    (void)cudaGetLastError();
    return rc;
}

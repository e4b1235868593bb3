/* Programmatic dependent launch (PDL; compute capability 9.0 and later).
 *
 * A decode step is ~430 small dependent kernels replayed as one graph.
 * Between two of them the GPU otherwise pays the launch of the second
 * grid, its ramp and the tail of the first.  A kernel launched with the
 * attribute cudaLaunchAttributeProgrammaticStreamSerialization may start
 * while the kernel before it in the stream still runs: once every block of
 * that kernel has executed griddepcontrol.launch_dependents (mr_pdl_trigger)
 * or exited.  Stream capture records such a launch as a programmatic edge
 * of the graph.
 *
 * What makes that safe is griddepcontrol.wait (mr_pdl_wait): the PTX ISA
 * says it "causes the executing thread to wait until all prerequisite grids
 * in flight have completed and all the memory operations from the
 * prerequisite grids are performed and made visible to the current grid".
 * Before it, a kernel launched with the attribute may run alongside its
 * predecessor and must not touch memory that kernel writes, nor write
 * memory it reads.
 *
 * THE RULE (tests/e2e/cuda_pdl_rule.sh checks it in every `make test`):
 *   - only mr_cu_launch below launches with the attribute
 *     (cudaLaunchKernelEx appears nowhere else);
 *   - every kernel launched through mr_cu_launch calls mr_pdl_wait() on every
 *     path, in every thread, before its first global read of data an earlier
 *     kernel wrote, before its first global write, and before any return;
 *     then mr_pdl_trigger().  Every kernel does both as its first
 *     statements, except where it loads model weights first (the one-token
 *     products, RMSNorm, q/k norm + RoPE): weights are written by the
 *     uploads and load-time repacks only, which are plain launches or
 *     copies, never the kernel just before;
 *   - kernels launched with plain <<<...>>> (the load-time repacks) need
 *     neither: they start after their predecessor completes, as always.
 * Waiting on every path keeps completion transitive: a kernel cannot
 * complete before the kernel it overlapped, so the wait of the next one
 * covers every earlier grid too.  Triggering after the wait keeps at most
 * one grid waiting ahead of a running one.
 *
 * Non-kernel work in the stream: the header of cudaLaunchAttribute says the
 * attribute lets the grid overlap "with the previous kernel in the stream,
 * if that kernel requests the overlap", and cudaGraphDependencyTypeProgrammatic
 * "may only be used between kernel nodes" (driver_types.h, CUDA 13.0): after
 * a memcpy or memset the launch is ordered as any launch is.  After a
 * cuBLAS kernel (the prompt GEMMs, never inside a decode graph) a kernel
 * launched here may start early only if that kernel triggers; either way
 * its wait returns only once the cuBLAS kernel has completed with its
 * memory visible, which is what the next kernel (k_dequant rewriting the
 * scratch a GEMM read, k_scatter_rows reading its output) needs.
 *
 * MEMRA_CUDA_PDL (read at backend creation, cu_backend.cu): unset or 1:
 * on where the device and the code allow; 0: off (plain launches, as
 * before).  Launching a kernel earlier still, once every block of the one
 * before has started (the graph edge from its launch-completion port), was
 * measured and lost: 8B tg128 -6%, 30B-A3B -20% (H200, GPU-NOTES 106). */
#ifndef MR_CU_PDL_CUH
#define MR_CU_PDL_CUH

#include <cuda_runtime.h>
#include <utility>

/* Waits until the grid(s) this one depends on have completed and their
 * writes are visible.  Nothing before sm_90 (there PDL is never on). */
__device__ __forceinline__ void mr_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel of the stream be launched (once every block of this
 * grid has called it or exited).  The memory clobber keeps the compiler
 * from moving accesses above it (above the wait, that is). */
__device__ __forceinline__ void mr_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launches kernel on c's stream with the PDL attribute when c->pdl is on,
 * else as <<<grid, block, smem, stream>>> would.  Arguments are converted
 * to the kernel's parameter types (cudaLaunchKernelEx's C++ form).  A
 * launch error is left for MR_CU_LAUNCHED, which the caller runs after the
 * launch as for <<<>>>: it is kept in c->launch_err as well as in the
 * runtime's last error. */
template <typename... KArgs, typename... Args>
static inline void mr_cu_launch(mr_cu_ctx *c, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    if (c->pdl) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    if (c->note_launches)
        mr_cu_note_launch(c, (const void *)kernel, grid, block, smem);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    if (e != cudaSuccess && c->launch_err == cudaSuccess)
        c->launch_err = e;
}

#endif

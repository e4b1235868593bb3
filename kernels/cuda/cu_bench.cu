/* Timing helpers for bench programs: copy bandwidth and event timing. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cu_bench.h"
#include "kernels/cuda/cu_common.cuh"

extern "C" double mr_cuda_copy_bandwidth(size_t bytes, int iters)
{
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    float ms = 0.0f;
    double r = -1.0;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess)
        goto out;
    cudaMemset(a, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); /* warm-up */
    cudaEventRecord(e0, 0);
    for (int i = 0; i < iters; i++)
        cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
        r = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
out:
    cudaFree(a);
    cudaFree(b);
    (void)cudaGetLastError();
    return r;
}

extern "C" double mr_cuda_time(struct mr_backend *be, void (*fn)(void *), void *arg, int warm,
                               int iters)
{
    mr_cu_ctx *c = mr_cu(be);
    for (int i = 0; i < warm; i++) {
        fn(arg);
        mr_cu_flush(be);
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, c->stream);
    for (int i = 0; i < iters; i++) {
        fn(arg);
        mr_cu_flush(be);
    }
    cudaEventRecord(e1, c->stream);
    float ms = -1.0f;
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
        ms = -1.0f;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms < 0 ? -1.0 : ms * 1e-3 / iters;
}

extern "C" void mr_cuda_device_info(char *name, size_t n, int *sm)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(name, n, "none");
        *sm = 0;
        return;
    }
    snprintf(name, n, "%s", p.name);
    *sm = p.multiProcessorCount;
}

extern "C" int mr_cuda_pdl_mode(struct mr_backend *be)
{
    const mr_cu_ctx *c = mr_cu(be);
    return c->pdl ? 1 : 0;
}

extern "C" long mr_cu_xmm_tiles_launches(struct mr_backend *be)
{
    return mr_cu(be)->xmm_mt_launches;
}

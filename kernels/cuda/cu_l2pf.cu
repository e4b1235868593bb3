/* Weights into L2 ahead of the product that reads them (MEMRA_CUDA_L2PF, an
 * experiment: cu_autograph.cu run_direct says when, GPU-NOTES 107 why).
 *
 * A one-token product streams its weights at about half the copy rate (a
 * launch's ramp and drain, its warps' latency chains), and the small ops
 * between products (norms, RoPE, attention) leave the memory idle.  A
 * kernel on a side stream of the decode graph asks L2 for the next
 * product's bytes while those run, so that the product finds them there.
 * It reads nothing another kernel writes and writes nothing, so it needs no
 * ordering beyond its stream's and no PDL wait (cu_pdl.cuh): a plain
 * launch. */
#include "kernels/cuda/cu_common.cuh"

#define L2PF_PIECE 4096 /* bytes a prefetch instruction asks for (sm_90: one bulk prefetch) */
#define L2PF_THREADS 32

/* Pieces of bytes from p (16-byte aligned; bytes a multiple of 16), a
 * thread of the grid's x a piece in turn.  hint 1: the lines are kept over
 * others (evict_last), so that a product streaming meanwhile does not push
 * them out before they are read. */
static __device__ __forceinline__ void l2_ask(const char *p, size_t bytes, int hint)
{
    const size_t pieces = (bytes + L2PF_PIECE - 1) / L2PF_PIECE;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < pieces; i += (size_t)gridDim.x * blockDim.x) {
        const char *a = p + i * L2PF_PIECE;
        const size_t left = bytes - i * L2PF_PIECE;
        const unsigned len = (unsigned)(left < L2PF_PIECE ? left : L2PF_PIECE);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (hint) {
            asm volatile("{\n\t.reg .b64 pol;\n\t"
                         "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
                         "cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, pol;\n\t}" ::"l"(a),
                         "r"(len)
                         : "memory");
        } else {
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(len) : "memory");
        }
#else
        (void)hint;
        for (unsigned o = 0; o < len; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(a + o));
#endif
    }
}

__global__ void __launch_bounds__(L2PF_THREADS) k_l2_prefetch(const char *p, size_t bytes, int hint)
{
    l2_ask(p, bytes, hint);
}

/* The matrices a list of expert ids picks (a mixture layer's down experts,
 * asked for once the routing has written the ids): the grid's y is the
 * pair, whose matrix is base + ids[y] * mat_bytes; an id outside [0,
 * n_mats) asks for nothing (the product reports it). */
__global__ void __launch_bounds__(L2PF_THREADS) k_l2_prefetch_ids(const char *base, size_t mat_bytes,
                                                                  const int32_t *ids, int n_mats, int hint)
{
    const int id = ids[blockIdx.y];
    if (id >= 0 && id < n_mats)
        l2_ask(base + (size_t)id * mat_bytes, mat_bytes, hint);
}

/* Blocks of L2PF_THREADS for bytes: a piece a thread, at most cap. */
static unsigned l2pf_blocks(size_t bytes, size_t cap)
{
    const size_t pieces = (bytes + L2PF_PIECE - 1) / L2PF_PIECE;
    const size_t want = (pieces + L2PF_THREADS - 1) / L2PF_THREADS;
    return (unsigned)(want < cap ? want : cap > 0 ? cap : 1);
}

/* The launch's error, and a launch counted where it was made. */
static cudaError_t l2pf_launched(long *launches)
{
    const cudaError_t e = cudaGetLastError();
    *launches += e == cudaSuccess;
    return e;
}

cudaError_t mr_cu_l2_prefetch(const mr_cu_ctx *c, cudaStream_t st, const void *p, size_t bytes, int hint,
                              long *launches)
{
    /* whole 16-byte units inside [p, p + bytes) */
    const uintptr_t lo = ((uintptr_t)p + 15) & ~(uintptr_t)15, hi = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
    if (!p || hi <= lo)
        return cudaSuccess;
    k_l2_prefetch<<<l2pf_blocks(hi - lo, (size_t)c->n_sm), L2PF_THREADS, 0, st>>>((const char *)lo, hi - lo, hint);
    return l2pf_launched(launches);
}

cudaError_t mr_cu_l2_prefetch_ids(const mr_cu_ctx *c, cudaStream_t st, const void *base, size_t mat_bytes,
                                  const int32_t *ids, int pairs, int n_mats, int hint, long *launches)
{
    /* whole 16-byte units: the pieces' addresses stay aligned when the
     * matrices' stride is a multiple of 16 (else nothing is asked for) */
    if (!base || !ids || pairs < 1 || pairs > 65535 || n_mats < 1 || mat_bytes < 16 || ((uintptr_t)base & 15) ||
        (mat_bytes & 15))
        return cudaSuccess;
    /* about a block an SM in all */
    const unsigned bx = l2pf_blocks(mat_bytes, ((size_t)c->n_sm + (size_t)pairs - 1) / (size_t)pairs);
    k_l2_prefetch_ids<<<dim3(bx, (unsigned)pairs), L2PF_THREADS, 0, st>>>((const char *)base, mat_bytes, ids, n_mats,
                                                                         hint);
    return l2pf_launched(launches);
}

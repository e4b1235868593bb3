/* The float16 GEMM of the prompt products, with a row's result independent
 * of the call: C = alpha A^T B + beta C (column-major C, m x n), A's m rows
 * and B's n rows each k halves long (the dequantized weight rows and the
 * token rows of cu_gemm.cu), fp32 accumulation on the tensor cores.
 *
 * Why not cuBLAS: cuBLAS picks its kernel by shape, and for few tokens it
 * splits k over blocks (split-K, stream-K) and adds the parts in another
 * order, so a token's row comes out with other roundings when the call has
 * 7 tokens than when it has 512.  A greedy request must not depend on how
 * the scheduler cut its prompt into chunks or what else shared the step
 * (docs/NUMERICS.md), so every element here is summed the same way
 * whatever m, n and the tile it falls in: one float32 accumulator that
 * starts at zero and takes the m16n8k16 MMAs of k = 0, 16, 32, ... in
 * order, then alpha * acc, then + beta * C with one fused multiply-add.  An
 * MMA's result for an element depends only on that element's row of A, its
 * column of B and the accumulator, so neither the tile shape nor the other
 * rows and columns of the call (zero padding included) can change it.
 *
 * Shape: a block computes 128 rows x 128 tokens with 8 warps (2 x 4, 64 x
 * 32 each: 4 x 4 MMAs of m16n8 per 16 columns of k), or 128 x 64 (4 x 2
 * warps of 32 x 32) where 128-token tiles would leave SMs idle, k in steps
 * of 64 through a 3-stage cp.async pipeline (48 or 36 KiB; two blocks an
 * SM).  A stage's rows are 128 bytes (eight 16-byte chunks); chunk c of row
 * r is stored at c ^ (r & 7), so the 8 rows an ldmatrix reads fall in 8
 * different 16-byte bank groups.  Rows past m or n and columns past k are filled with zeros (their
 * products add nothing, and their outputs are not stored).
 * Needs k, lda and ldb multiples of 8 halves and 16-byte aligned A and B
 * (16-byte loads); the caller checks (mr_cu_hgemm returns false). */
#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_mma.cuh"

#define HG_BM 128
#define HG_BK 64 /* k a stage: rows of 128 bytes, eight 16-byte chunks */
#define HG_STAGES 3
#define HG_THREADS 256

/* Shared memory of a block with BN tokens a tile. */
template <int BN> constexpr int hg_smem() { return HG_STAGES * (HG_BM + BN) * HG_BK * (int)sizeof(__half); }

/* Byte offset of 16-byte chunk c (0..7) of row r in a tile. */
__device__ __forceinline__ int hg_off(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

/* A thread's share of a stage: rows r0, r0 + 32, ... (A's HG_BM rows, then
 * B's BN rows) at one chunk c, so one pointer per operand, advanced by
 * HG_BK halves a step, and one shared-memory offset serve all of them. */
template <int BN> struct hg_loader {
    static constexpr int NA = HG_BM / 32, NB = BN / 32; /* rows a thread loads a stage */
    const __half *a, *b;
    int lda32, ldb32;   /* 32 rows of each operand, in halves */
    uint32_t s_off;     /* offset of the thread's first chunk in a stage */
    uint32_t a_ok, b_ok; /* bit i: row r0 + 32 i exists */
    int col;            /* the chunk's first column at step 0 */

    __device__ __forceinline__ hg_loader(const __half *A, int lda, const __half *B, int ldb, int m0, int n0, int m,
                                         int n, int tid)
    {
        const int r0 = tid >> 3, c = tid & 7;
        col = c * 8;
        s_off = (uint32_t)hg_off(r0, c);
        a_ok = b_ok = 0;
#pragma unroll
        for (int i = 0; i < NA; i++) a_ok |= (uint32_t)(m0 + r0 + 32 * i < m) << i;
#pragma unroll
        for (int i = 0; i < NB; i++) b_ok |= (uint32_t)(n0 + r0 + 32 * i < n) << i;
        /* rows past the end read row 0 of the operand, with a zero fill */
        a = A + (size_t)(m0 + r0 < m ? m0 + r0 : 0) * lda + col;
        b = B + (size_t)(n0 + r0 < n ? n0 + r0 : 0) * ldb + col;
        lda32 = 32 * lda;
        ldb32 = 32 * ldb;
    }

    /* k-step ks into the stage at st (shared address) */
    __device__ __forceinline__ void load(uint32_t st, int ks, int k) const
    {
        const bool kin = col + ks * HG_BK < k;
        const size_t o = (size_t)ks * HG_BK;
#pragma unroll
        for (int i = 0; i < NA; i++) {
            const bool ok = kin && (a_ok >> i & 1);
            mr_cp16(st + s_off + i * 32 * 128, ok ? a + (size_t)i * lda32 + o : a, ok);
        }
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const bool ok = kin && (b_ok >> i & 1);
            mr_cp16(st + HG_BM * 128 + s_off + i * 32 * 128, ok ? b + (size_t)i * ldb32 + o : b, ok);
        }
    }
};

/* BN tokens a tile; the 8 warps as WM x (8 / WM), each (HG_BM / WM) rows x
 * (BN / (8 / WM)) tokens. */
template <int BN, int WM>
__global__ void __launch_bounds__(HG_THREADS, 2) k_hgemm(int m, int n, int k, float alpha, const __half *A, int lda,
                                                        long long sa, const __half *B, int ldb, long long sb,
                                                        float beta, float *C, int ldc, long long sc)
{
    constexpr int WN = 8 / WM, MI = HG_BM / WM / 16, NJ = BN / WN / 8;
    static_assert(NJ % 2 == 0, "B fragments come in pairs (ldmatrix x4)");
    constexpr int STAGE = (HG_BM + BN) * HG_BK * 2; /* bytes */
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    extern __shared__ __align__(128) unsigned char hg_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int m0 = blockIdx.x * HG_BM, n0 = blockIdx.y * BN;
    A += (size_t)blockIdx.z * sa;
    B += (size_t)blockIdx.z * sb;
    C += (size_t)blockIdx.z * sc;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(hg_smem);
    const int nk = (k + HG_BK - 1) / HG_BK;

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    const hg_loader<BN> ld(A, lda, B, ldb, m0, n0, m, n, tid);
#pragma unroll
    for (int s = 0; s < HG_STAGES - 1; s++) {
        if (s < nk)
            ld.load(base + s * STAGE, s, k);
        asm volatile("cp.async.commit_group;");
    }
    /* ldmatrix addresses: lane l gives row l % 16 (A) of the 16-row
     * fragment and chunk l / 16 of the 16-column step; for B, rows l % 8 +
     * 8 (l / 16) and chunk (l / 8) % 2 give two n8 fragments */
    const int a_row = wm * (HG_BM / WM) + (lane & 15), a_chk = lane >> 4;
    const int b_row = wn * (BN / WN) + (lane & 7) + ((lane >> 4) << 3), b_chk = (lane >> 3) & 1;
    uint32_t af[2][MI][4], bf[2][NJ][2]; /* fragments of this 16-column step and the next */
    for (int ks = 0; ks < nk; ks++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(HG_STAGES - 2));
        __syncthreads();
        /* the stage freed at the previous step is refilled while this one runs */
        const int nx = ks + HG_STAGES - 1;
        if (nx < nk)
            ld.load(base + (nx % HG_STAGES) * STAGE, nx, k);
        asm volatile("cp.async.commit_group;");
        const uint32_t sA = base + (ks % HG_STAGES) * STAGE, sB = sA + HG_BM * 128;
        /* step h's fragments are loaded while step h - 1's MMAs run; the
         * MMAs still go in k order */
#pragma unroll
        for (int h = 0; h <= HG_BK / 16; h++) {
            if (h < HG_BK / 16) {
                const int f = h & 1;
#pragma unroll
                for (int i = 0; i < MI; i++)
                    mr_ldsm4(sA + hg_off(a_row + i * 16, 2 * h + a_chk), af[f][i][0], af[f][i][1], af[f][i][2],
                             af[f][i][3]);
#pragma unroll
                for (int j = 0; j < NJ / 2; j++)
                    mr_ldsm4(sB + hg_off(b_row + j * 16, 2 * h + b_chk), bf[f][2 * j][0], bf[f][2 * j][1],
                             bf[f][2 * j + 1][0], bf[f][2 * j + 1][1]);
            }
            if (h > 0) {
                const int f = (h - 1) & 1;
#pragma unroll
                for (int i = 0; i < MI; i++)
#pragma unroll
                    for (int j = 0; j < NJ; j++) mr_mma16816(acc[i][j], af[f][i], bf[f][j][0], bf[f][j][1]);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;");
    /* C fragment of m16n8: rows g, g + 8 (of A: C's rows), tokens 2q, 2q + 1 */
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = m0 + wm * (HG_BM / WM) + i * 16 + g + 8 * (e >> 1);
                const int tok = n0 + wn * (BN / WN) + j * 8 + 2 * q + (e & 1);
                if (row < m && tok < n) {
                    float *cp = C + (size_t)tok * ldc + row;
                    const float v = alpha * acc[i][j][e];
                    *cp = beta != 0.0f ? fmaf(beta, *cp, v) : v;
                }
            }
}

/* Opt-in to the dynamic shared memory, once at backend creation. */
void mr_cu_hgemm_init(mr_cu_ctx *c)
{
    MR_CU_TRY(c, cudaFuncSetAttribute(k_hgemm<128, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, hg_smem<128>()));
    MR_CU_TRY(c, cudaFuncSetAttribute(k_hgemm<64, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, hg_smem<64>()));
}

bool mr_cu_hgemm(mr_cu_ctx *c, int m, int n, int k, float alpha, const __half *A, int lda, long long sa,
                 const __half *B, int ldb, long long sb, float beta, float *C, int ldc, long long sc, int batch)
{
    if (k % 8 || lda % 8 || ldb % 8 || sa % 8 || sb % 8 || ((uintptr_t)A & 15) || ((uintptr_t)B & 15))
        return false;
    if (m <= 0 || n <= 0 || batch <= 0)
        return true;
    /* 128 tokens a tile where that gives two blocks an SM or more, else 64
     * (twice the blocks); either sums every element the same way */
    const long long mt = (m + HG_BM - 1) / HG_BM, wide = mt * ((n + 127) / 128) * batch;
    const bool narrow = wide < 2LL * c->n_sm;
    const int bn = narrow ? 64 : 128;
    const unsigned gy = (unsigned)((n + bn - 1) / bn);
    if (gy > 65535 || batch > 65535) {
        mr_cu_fail(c, "GEMM: %d tokens x %d matrices is past the grid", n, batch);
        return true;
    }
    const dim3 grid((unsigned)mt, gy, (unsigned)batch);
    if (narrow)
        mr_cu_launch(c, k_hgemm<64, 4>, grid, HG_THREADS, hg_smem<64>(), m, n, k, alpha, A, lda, sa, B, ldb, sb, beta,
                     C, ldc, sc);
    else
        mr_cu_launch(c, k_hgemm<128, 2>, grid, HG_THREADS, hg_smem<128>(), m, n, k, alpha, A, lda, sa, B, ldb, sb,
                     beta, C, ldc, sc);
    MR_CU_LAUNCHED(c, "GEMM (float16)");
    return true;
}

/* Decode matvec with int8 activations (MEMRA_CUDA_MATVEC=q8).
 *
 * The float32 kernels (cu_fast.cu) turn every weight into a float and pay a
 * byte permute, an FMA and a share of the scale work per weight: ~4-5
 * instructions a weight, issue-bound at 27-41% of copy bandwidth on the 8B
 * shapes (docs/GPU-NOTES.md 4-8).  Here the activation rows are quantized
 * once per call to int8 in blocks of 32 (k_q8_quant), and the weights stay
 * packed: four 4-bit or 6-bit or 8-bit quants meet four int8 activations in
 * one dp4a, so a lane spends ~1-2 instructions a weight; the per-group
 * integer sums are exact and only their scaling is float (cu_mvq8.cuh has
 * the lane layouts and the numbers).
 *
 * Work split: a block of up to 4 warps owns R rows (R = 4, 2, 1 by the
 * shape, like k_fast); warp w takes steps w, w+4, ... of those rows (split-K
 * inside the block) and the partial sums meet in shared memory.  A step is
 * 1024 columns for the K-quants and IQ4_XS (8 lanes a 256-block, 32 weights
 * a lane), 512 for Q4_0, 256 for Q8_0; all R rows of a step share the
 * lane's activation loads.  Tokens: up to 8 in one launch (NT = 1, 2, 4 or 8
 * accumulators, the count itself a kernel argument), so each weight byte is
 * read once for all of them.  Expert products (matmul_id): one job per
 * token-expert pair, through the same mr_cu_mvjob as the other kernels, so
 * an out-of-range expert id gives NaN rows (mr_cu_mv_rows).
 *
 * Numerical cost: the products are those of W with x-hat, x rounded to 8
 * bits per 32-block: relative error ~ (absmax/127)/sqrt(12) per activation,
 * about 5e-3 of a product for Gaussian activations (kernel-check measures
 * it); the f32 kernels remain the default until the model-level error is
 * measured.
 *
 * Why the same x is quantized again for each product that reads it (q, k, v
 * share one input, gate and up another): the quantized copy lives in one
 * scratch buffer, and what runs between two such products (ops replayed
 * from CUDA graphs by the recorder in cu_autograph.cu, uploads, graph
 * launches, cuBLAS) writes device memory without passing through this
 * file.  A cache keyed by the input pointer would need every one of those
 * writers to invalidate it, and a missed one gives silently wrong products.
 * The price is one small launch per repeated quantization (a 4096-wide
 * token: 16 KB read, 5 KB written, ~1 us inside a graph), 3 a layer on the
 * Qwen3 shapes.  The safe place to share is the recorder, which sees the
 * whole sequence it replays (consecutive products of one x with nothing in
 * between), as it does for add+rmsnorm. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/cuda/cu_fast.cuh"
#include "kernels/cuda/cu_mvq8.cuh"
#include "kernels/cuda/cu_mvq8.h"

#define Q8_WARPS 4       /* warps per block at most */
#define Q8_QUANT_THREADS 128

/* ---- quantize ---- */

/* Thread i quantizes values 8i..8i+7 of the flattened rows; the 4 threads of
 * a 32-block are 4 consecutive lanes and meet through shuffles.  Rounding:
 * q = rint(x * (127 / absmax)), half to even (the float product rounded
 * once, then __float2int_rn); d = absmax / 127; both divisions IEEE (nvcc's
 * default -prec-div).  A block holding a NaN or an infinity gets d = s = NaN,
 * so its products are NaN as the float kernels' would be. */
__global__ void __launch_bounds__(Q8_QUANT_THREADS)
k_q8_quant(const float *__restrict__ x, int64_t groups, int8_t *__restrict__ q, float *__restrict__ d,
           float *__restrict__ s)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool in = i < groups;
    float v[8];
    if (in) {
        const float4 a = __ldg((const float4 *)x + 2 * i), b = __ldg((const float4 *)x + 2 * i + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = 0.0f;
    }
    float amax = 0.0f;
    int bad = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = fabsf(v[k]);
        amax = fmaxf(amax, a);
        bad |= !(a <= 3.402823466e38f); /* NaN or infinity */
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    bad |= __shfl_xor_sync(0xffffffffu, bad, 1);
    bad |= __shfl_xor_sync(0xffffffffu, bad, 2);
    const float dd = amax / 127.0f;
    const float iv = amax > 0.0f ? 127.0f / amax : 0.0f;
    uint32_t w[2] = {0, 0};
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int qk = __float2int_rn(v[k] * iv);
        qk = qk > 127 ? 127 : qk < -127 ? -127 : qk;
        sum += qk;
        w[k >> 2] |= (uint32_t)(qk & 0xff) << (8 * (k & 3));
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!in)
        return;
    *(uint2 *)(q + 8 * i) = make_uint2(w[0], w[1]);
    if ((threadIdx.x & 3) == 0) {
        const float nan = __int_as_float(0x7fc00000);
        d[i >> 2] = bad ? nan : dd;
        s[i >> 2] = bad ? nan : dd * (float)sum;
    }
}

/* Quantizes `rows` rows of `cols` values (cols % 256 == 0, x 16-byte
 * aligned) into the scratch buffer; false after a sticky error. */
static bool q8_quantize(mr_cu_ctx *c, const float *x, int64_t rows, int64_t cols, mr_q8act *xa)
{
    const size_t nq = (size_t)(rows * cols), nb = (size_t)(rows * (cols / 32));
    if (!mr_cu_reserve(c, &c->scratch_q8, nq + 2 * nb * sizeof(float), "q8 matvec activations"))
        return false;
    int8_t *q = (int8_t *)c->scratch_q8.p;
    float *d = (float *)(q + nq); /* nq is a multiple of 256: aligned */
    float *s = d + nb;
    const int64_t groups = rows * cols / 8;
    mr_cu_launch(c, k_q8_quant, mr_cu_blocks((size_t)groups, Q8_QUANT_THREADS), Q8_QUANT_THREADS, 0, x, groups, q,
                 d, s);
    MR_CU_LAUNCHED(c, "q8 quantize");
    *xa = {q, d, s, x, cols};
    return true;
}

/* ---- matvec ---- */

template <int T, int R, int NT>
__global__ void __launch_bounds__(Q8_WARPS * 32) k_mvq8(mr_cu_mvjob a, mr_q8act xa, int nt)
{
    mr_pdl_wait(); /* cu_pdl.cuh */
    mr_pdl_trigger();
    using K = q8k<T>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * R;
    const uint8_t *W;
    const float *x;
    float *y;
    if (!mr_cu_mv_rows<R>(a, r0, &W, &x, &y))
        return;
    const int64_t xrow = (x - xa.x0) / a.cols; /* the job's first quantized row */
    const int64_t nblk = a.cols / K::BELEMS;
    const int nsteps = (int)((a.cols + K::STEP - 1) / K::STEP);
    constexpr int SB = K::STRIDE * (K::STEP / K::BELEMS); /* bytes of a row per step */
    typename K::P wp[R]; /* the lane's pointers into each row */
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int64_t r = r0 + i < a.rows ? r0 + i : a.rows - 1; /* clamp; not stored */
        K::wptr(W + r * a.row_bytes, lane, wp[i]);
    }
    q8xp xp;
    K::xptr(xa, xrow, lane, xp);
    q8_pin(xp.q);
    q8_pin(xp.d);
    q8_pin(xp.s);
    float acc[NT][R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[t][i] = 0.0f;
    /* the step's byte offset in a row and column offset in an activation
     * row, advanced with s */
    size_t so = (size_t)warp * SB;
    int64_t xo = (int64_t)warp * K::STEP;
#pragma unroll 2
    for (int s = warp; s < nsteps; s += nw, so += (size_t)nw * SB, xo += (int64_t)nw * K::STEP) {
        if (!K::active(s, lane, nblk)) /* the tail of a row that is not a whole step */
            continue;
        typename K::W wv[R];
#pragma unroll
        for (int i = 0; i < R; i++) K::load_w(wp[i], so, wv[i]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt)
                break;
            typename K::X xv;
            K::load_x(xp, t * a.cols + xo, xv);
#pragma unroll
            for (int i = 0; i < R; i++) acc[t][i] = K::dot(wv[i], xv, acc[t][i]);
        }
    }
    __shared__ float part[Q8_WARPS][NT * R];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float v = mr_warp_sum(acc[t][i]);
            if (lane == 0) part[warp][t * R + i] = v;
        }
    __syncthreads();
    if (threadIdx.x < NT * R) {
        const int t = threadIdx.x / R, i = threadIdx.x % R;
        float v = 0.0f;
        for (int w = 0; w < nw; w++) v += part[w][threadIdx.x];
        if (t < nt && r0 + i < a.rows) y[(int64_t)t * a.rows + r0 + i] = v;
    }
}

template <int T, int R, int NT>
static void q8_launch_r(mr_cu_ctx *c, const mr_cu_mvjob &a, const mr_q8act &xa, int nt, int jobs)
{
    const int64_t nsteps = (a.cols + q8k<T>::STEP - 1) / q8k<T>::STEP;
    const int nw = nsteps < Q8_WARPS ? (int)nsteps : Q8_WARPS;
    dim3 grid((unsigned)((a.rows + R - 1) / R), (unsigned)jobs);
    mr_cu_launch(c, k_mvq8<T, R, NT>, grid, nw * 32, 0, a, xa, nt);
    MR_CU_LAUNCHED(c, "q8 matvec");
}

/* Rows per block as for the float kernels: more rows share each activation
 * load, fewer give more blocks; keep at least ~8 blocks per SM.  Several
 * tokens take one row a block (their accumulators multiply). */
template <int T>
static void q8_launch(mr_cu_ctx *c, const mr_cu_mvjob &a, const mr_q8act &xa, int n, int jobs)
{
    const int64_t want = (int64_t)c->n_sm * 8, units = a.rows * jobs;
    const int fr = c->fast_r;
    if (n == 1) {
        if (fr == 4 || (fr != 1 && fr != 2 && units / 4 >= want))
            q8_launch_r<T, 4, 1>(c, a, xa, 1, jobs);
        else if (fr == 2 || (fr != 1 && units / 2 >= want))
            q8_launch_r<T, 2, 1>(c, a, xa, 1, jobs);
        else
            q8_launch_r<T, 1, 1>(c, a, xa, 1, jobs);
    } else if (n == 2) {
        if (fr == 2 || fr == 4 || (fr != 1 && units / 2 >= want))
            q8_launch_r<T, 2, 2>(c, a, xa, 2, jobs);
        else
            q8_launch_r<T, 1, 2>(c, a, xa, 2, jobs);
    } else if (n <= 4) {
        q8_launch_r<T, 1, 4>(c, a, xa, n, jobs);
    } else {
        q8_launch_r<T, 1, 8>(c, a, xa, n, jobs);
    }
}

/* The types with an int8 path, and whether they read the repacked copy. */
static bool q8_type(int t)
{
    return t == MR_TYPE_Q4_K || t == MR_TYPE_Q5_K || t == MR_TYPE_Q6_K || t == MR_TYPE_Q8_0 ||
           t == MR_TYPE_Q4_0 || t == MR_TYPE_IQ4_XS;
}
static bool q8_repacked(int t) { return t != MR_TYPE_IQ4_XS; }

static int q8_stride(int t)
{
    switch (t) {
    case MR_TYPE_Q4_K: return q8k<MR_TYPE_Q4_K>::STRIDE;
    case MR_TYPE_Q5_K: return q8k<MR_TYPE_Q5_K>::STRIDE;
    case MR_TYPE_Q6_K: return q8k<MR_TYPE_Q6_K>::STRIDE;
    case MR_TYPE_Q8_0: return q8k<MR_TYPE_Q8_0>::STRIDE;
    case MR_TYPE_Q4_0: return q8k<MR_TYPE_Q4_0>::STRIDE;
    default: return q8k<MR_TYPE_IQ4_XS>::STRIDE;
    }
}

static bool q8_ok(mr_cu_ctx *c, const mr_weight *w, const float *x)
{
    if (!c->matvec_q8 || c->no_fast || !q8_type(w->type) || w->cols % 256 || ((uintptr_t)x & 15))
        return false;
    return q8_repacked(w->type) ? w->priv != NULL : true;
}

static mr_cu_mvjob q8_job(const mr_weight *w, const float *x, float *y)
{
    const mr_type_info *ti = mr_type_get(w->type);
    const size_t rb = (size_t)(w->cols / ti->block_elems) * (size_t)q8_stride(w->type);
    return mr_cu_mvjob_plain((const uint8_t *)(q8_repacked(w->type) ? w->priv : w->data), rb, w, x, y);
}

static void q8_run(mr_cu_ctx *c, int type, const mr_cu_mvjob &a, const mr_q8act &xa, int n, int jobs)
{
    switch (type) {
    case MR_TYPE_Q4_K: q8_launch<MR_TYPE_Q4_K>(c, a, xa, n, jobs); break;
    case MR_TYPE_Q5_K: q8_launch<MR_TYPE_Q5_K>(c, a, xa, n, jobs); break;
    case MR_TYPE_Q6_K: q8_launch<MR_TYPE_Q6_K>(c, a, xa, n, jobs); break;
    case MR_TYPE_Q8_0: q8_launch<MR_TYPE_Q8_0>(c, a, xa, n, jobs); break;
    case MR_TYPE_Q4_0: q8_launch<MR_TYPE_Q4_0>(c, a, xa, n, jobs); break;
    case MR_TYPE_IQ4_XS: q8_launch<MR_TYPE_IQ4_XS>(c, a, xa, n, jobs); break;
    }
}

bool mr_cu_q8_matvec(mr_cu_ctx *c, const mr_weight *w, const float *x, float *y, int n)
{
    if (n < 1 || n > MR_CU_MATVEC_MAX || !q8_ok(c, w, x))
        return false;
    mr_q8act xa;
    if (q8_quantize(c, x, n, w->cols, &xa))
        q8_run(c, w->type, q8_job(w, x, y), xa, n, 1);
    return true; /* a failure is the sticky error */
}

bool mr_cu_q8_matvec_id(mr_cu_ctx *c, const mr_weight *w, const float *x, int x_slots,
                        const int32_t *ids, int k, float *y, int n)
{
    if (!q8_ok(c, w, x))
        return false;
    mr_q8act xa;
    if (q8_quantize(c, x, (int64_t)n * x_slots, w->cols, &xa)) {
        mr_cu_mvjob a = q8_job(w, x, y);
        a.ids = ids;
        a.k = k;
        a.x_slots = x_slots;
        /* one token-expert pair per job (grid.y); each resolves its own row */
        q8_run(c, w->type, a, xa, 1, n * k);
    }
    return true;
}

/* ---- selection ---- */

bool mr_cu_q8_init(mr_cu_ctx *c, mr_err *err)
{
    /* float32 activations unless asked (int8 costs ~5e-3 of a product),
     * with the 22-bit integer kernel (cu_mvx24.cu, float-grade) on the
     * large plain products, where it is faster; it takes 1-8 tokens with
     * the same per-token sums, so a request's tokens do not depend on its
     * batchmates (DESIGN.md, numerics rules) */
    const char *m = getenv("MEMRA_CUDA_MATVEC");
    c->matvec_q8 = false;
    c->matvec_x24 = 1;
    if (!m || !*m)
        return true;
    if (!strcasecmp(m, "q8")) {
        c->matvec_q8 = true;
        c->matvec_x24 = 0;
    } else if (!strcasecmp(m, "x24")) {
        c->matvec_x24 = 1;
    } else if (!strcasecmp(m, "x24all")) {
        c->matvec_x24 = 2;
    } else if (!strcasecmp(m, "f32")) {
        c->matvec_x24 = 0;
    } else {
        mr_errf(err, "cuda: MEMRA_CUDA_MATVEC=%s (expected q8, x24, x24all or f32)", m);
        return false;
    }
    return true;
}

extern "C" int mr_cuda_q8_quantize(struct mr_backend *be, const float *x, int64_t rows, int64_t cols)
{
    mr_cu_ctx *c = mr_cu(be);
    if (cols % 256 || ((uintptr_t)x & 15))
        return -1;
    mr_cu_flush(be); /* after what was recorded before */
    mr_q8act xa;
    return q8_quantize(c, x, rows, cols, &xa) ? 0 : -1;
}

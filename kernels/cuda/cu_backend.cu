/* The CUDA backend: device memory, weights, paged KV cache, one stream,
 * a sticky first error, CUDA graph capture/replay, and the op table. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_common.cuh"
#include "kernels/cuda/cu_quant.cuh"

void mr_cu_fail(mr_cu_ctx *c, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
    va_end(ap);
}

int mr_cu_env_int(mr_cu_ctx *c, const char *name, long long lo, long long hi, const char *what, long long *v)
{
    const char *s = getenv(name);
    if (!s)
        return 0;
    char *end = NULL;
    errno = 0;
    const long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) {
        mr_cu_fail(c, "%s '%s': not %s", name, s, what);
        return -1;
    }
    *v = x;
    return 1;
}

bool mr_cu_reserve(mr_cu_ctx *c, mr_cu_buf *buf, size_t n, const char *what)
{
    c->scratch_asks++;
    if (buf->cap >= n)
        return true;
    if (c->capturing) {
        mr_cu_fail(c, "%s: needs %zu bytes of scratch during graph capture (run the step once "
                   "before capturing it)", what, n);
        return false;
    }
    /* queued kernels may still read the old buffer */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess && buf->p) {
        /* a cached graph holds the old address: it must not replay */
        mr_cu_autograph_forget(c);
        e = cudaFree(buf->p);
    }
    buf->p = NULL;
    buf->cap = 0;
    size_t want = n + n / 4;
    if (e == cudaSuccess)
        e = cudaMalloc(&buf->p, want);
    if (e != cudaSuccess) {
        buf->p = NULL;
        mr_cu_fail(c, "%s: cudaMalloc(%zu): %s", what, want, cudaGetErrorString(e));
        return false;
    }
    buf->cap = want;
    return true;
}

static int take_error(mr_cu_ctx *c, mr_err *err)
{
    if (!c->failed)
        return 0;
    return mr_errf(err, "cuda: %s", c->err.msg);
}

/* ---- memory ---- */

static void *cu_alloc(mr_backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_free(mr_backend *be, void *p)
{
    if (!p)
        return;
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be); /* recorded ops may still use p */
    /* cudaFree synchronizes with the device, so queued work has finished. */
    MR_CU_TRY(c, cudaFree(p));
}

static int cu_copy(mr_backend *be, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                   mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    if (n == 0)
        return 0;
    mr_cu_flush(be);
    if (c->capturing)
        return mr_errf(err, "cuda: upload/download inside graph capture");
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        mr_cu_fail(c, "copy of %zu bytes: %s", n, cudaGetErrorString(e));
    return take_error(c, err);
}

static int cu_upload(mr_backend *be, void *dst, const void *src, size_t n, mr_err *err)
{
    return cu_copy(be, dst, src, n, cudaMemcpyHostToDevice, err);
}

static int cu_download(mr_backend *be, void *dst, const void *src, size_t n, mr_err *err)
{
    return cu_copy(be, dst, src, n, cudaMemcpyDeviceToHost, err);
}

static int cu_sync(mr_backend *be, mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess)
        mr_cu_fail(c, "sync: %s", cudaGetErrorString(e));
    return take_error(c, err);
}

/* ---- weights ---- */

static int cu_weight_load(mr_backend *be, mr_weight *w, const void *host, mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be);
    const char *name = w->name ? w->name : "?";
    const mr_type_info *ti = mr_cu_type_supported(w->type) ? mr_type_get(w->type) : NULL;
    if (!ti)
        return mr_errf(err, "cuda: weight %s: type %d is not supported", name, w->type);
    if (w->cols <= 0 || w->rows <= 0 || w->n_mats <= 0 || w->cols % ti->block_elems)
        return mr_errf(err, "cuda: weight %s: bad shape %lld x %lld x %lld for block size %d", name,
                       (long long)w->cols, (long long)w->rows, (long long)w->n_mats,
                       (int)ti->block_elems);
    size_t rb = (size_t)(w->cols / ti->block_elems) * ti->block_bytes;
    if (w->row_bytes != rb)
        return mr_errf(err, "cuda: weight %s: row_bytes %zu, expected %zu", name, w->row_bytes, rb);
    size_t n = rb * (size_t)w->rows * (size_t)w->n_mats;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, n);
    if (e != cudaSuccess)
        return mr_errf(err, "cuda: weight %s: cudaMalloc(%zu): %s", name, n, cudaGetErrorString(e));
    /* On the context's stream, then a sync: the stream is non-blocking, so
     * it is not ordered after the legacy stream that cudaMemcpy uses, and a
     * cudaMemcpy from pageable memory may return before its DMA has landed.
     * The repack kernels of mr_cu_weight_prepare then read bytes that were
     * not there yet (seen on an H200 as rare, unrepeatable wrong results of
     * one backend among identical ones under load). */
    e = cudaMemcpyAsync(d, host, n, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaFree(d);
        return mr_errf(err, "cuda: weight %s: copy of %zu bytes: %s", name, n, cudaGetErrorString(e));
    }
    w->data = d;
    w->priv = NULL;
    if (mr_cu_weight_prepare(be, w, err)) {
        cudaFree(d);
        w->data = NULL;
        return -1;
    }
    return 0;
}

static void cu_weight_release(mr_backend *be, mr_weight *w)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be);
    mr_cu_weight_free_priv(be, w);
    if (w->data)
        MR_CU_TRY(c, cudaFree((void *)w->data));
    w->data = NULL;
}

/* ---- KV cache ---- */

static size_t kv_elem_size(mr_kv_dtype t) { return t == MR_KV_F32 ? 4 : 2; }

static void cu_kv_destroy(mr_backend *be, mr_kv_cache *kv)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be);
    for (int l = 0; kv->k && l < kv->n_layers; l++) {
        if (kv->k[l]) MR_CU_TRY(c, cudaFree(kv->k[l]));
        if (kv->v && kv->v[l]) MR_CU_TRY(c, cudaFree(kv->v[l]));
    }
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

static int cu_kv_create(mr_backend *be, mr_kv_cache *kv, mr_err *err)
{
    mr_cu_flush(be);
    if (kv->n_layers <= 0 || kv->n_blocks <= 0 || kv->block_tokens <= 0 || kv->n_kv_heads <= 0 ||
        kv->head_dim <= 0 || kv->head_dim > 512 || kv->head_dim % 32)
        return mr_errf(err, "cuda: kv cache: bad shape (layers %d, blocks %d, block_tokens %d, "
                       "kv heads %d, head_dim %d; head_dim must be a multiple of 32 up to 512)",
                       kv->n_layers, kv->n_blocks, kv->block_tokens, kv->n_kv_heads, kv->head_dim);
    if (kv->dtype != MR_KV_F32 && kv->dtype != MR_KV_F16 && kv->dtype != MR_KV_BF16)
        return mr_errf(err, "cuda: kv cache: unknown dtype %d", (int)kv->dtype);
    size_t per = (size_t)kv->n_blocks * kv->block_tokens * kv->n_kv_heads * kv->head_dim *
                 kv_elem_size(kv->dtype);
    kv->k = (void **)calloc((size_t)kv->n_layers, sizeof(void *));
    kv->v = (void **)calloc((size_t)kv->n_layers, sizeof(void *));
    if (!kv->k || !kv->v) {
        free(kv->k);
        free(kv->v);
        kv->k = kv->v = NULL;
        return mr_errf(err, "cuda: kv cache: out of host memory");
    }
    /* The zeroing goes on the context's stream and is waited for: a plain
     * cudaMemset runs on the legacy stream, which the non-blocking stream is
     * not ordered after, and returns before it is done, so it could land on
     * top of the first K/V stores (seen on an H200 as a cache zeroed after
     * kernel-check had filled it). */
    mr_cu_ctx *c = mr_cu(be);
    for (int l = 0; l < kv->n_layers; l++) {
        cudaError_t e = cudaMalloc(&kv->k[l], per);
        if (e == cudaSuccess) e = cudaMalloc(&kv->v[l], per);
        if (e == cudaSuccess) e = cudaMemsetAsync(kv->k[l], 0, per, c->stream);
        if (e == cudaSuccess) e = cudaMemsetAsync(kv->v[l], 0, per, c->stream);
        if (e == cudaSuccess && l == kv->n_layers - 1) e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            cu_kv_destroy(be, kv);
            return mr_errf(err, "cuda: kv cache layer %d: %zu bytes: %s", l, per,
                           cudaGetErrorString(e));
        }
    }
    return 0;
}

/* ---- CUDA graphs ---- */

static int cu_graph_begin(mr_backend *be, mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    if (c->capturing)
        return mr_errf(err, "cuda: graph_begin: already capturing");
    mr_cu_flush(be);
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess)
        return mr_errf(err, "cuda: graph_begin: %s", cudaGetErrorString(e));
    c->capturing = true;
    return 0;
}

static int cu_graph_end(mr_backend *be, void **graph, mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    *graph = NULL;
    if (!c->capturing)
        return mr_errf(err, "cuda: graph_end without graph_begin");
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = false;
    if (e != cudaSuccess)
        return mr_errf(err, "cuda: graph_end: %s", cudaGetErrorString(e));
    if (c->failed) {
        cudaGraphDestroy(g);
        return take_error(c, err);
    }
    cudaGraphExec_t ex = NULL;
    e = cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess)
        return mr_errf(err, "cuda: graph instantiate: %s", cudaGetErrorString(e));
    *graph = (void *)ex;
    return 0;
}

static int cu_graph_launch(mr_backend *be, void *graph, mr_err *err)
{
    mr_cu_ctx *c = mr_cu(be);
    mr_cu_flush(be);
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, c->stream);
    if (e != cudaSuccess) {
        mr_cu_fail(c, "graph launch: %s", cudaGetErrorString(e));
        return take_error(c, err);
    }
    return 0;
}

static void cu_graph_destroy(mr_backend *be, void *graph)
{
    if (graph)
        cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* ---- programmatic dependent launch (cu_pdl.cuh) ---- */

/* Compiled with the same architectures as every kernel of the backend: its
 * binary version is the one the device runs. */
__global__ void k_pdl_probe(void) {}

/* On where the device has it (compute capability 9+) and the code the
 * device runs was built for sm_90 or later (there mr_pdl_wait is a real
 * wait: code for an older architecture, run through the driver's JIT,
 * would have none), unless MEMRA_CUDA_PDL=0. */
static void pdl_init(mr_cu_ctx *c, const cudaDeviceProp *prop)
{
    const char *e = getenv("MEMRA_CUDA_PDL");
    cudaFuncAttributes fa;
    bool built = false;
    if (cudaFuncGetAttributes(&fa, k_pdl_probe) == cudaSuccess)
        built = fa.binaryVersion >= 90;
    else
        (void)cudaGetLastError();
    c->pdl = prop->major >= 9 && built && !(e && !strcmp(e, "0"));
}

/* ---- lifetime ---- */

int mr_cu_fit(mr_cu_ctx *c, const void *kernel, int threads, size_t smem)
{
    const int n = c->n_fits < MR_CU_FITS ? c->n_fits : MR_CU_FITS;
    for (int i = 0; i < n; i++) {
        const mr_cu_fit_entry &f = c->fits[i];
        if (f.kernel == kernel && f.threads == threads && f.smem == smem)
            return f.blocks;
    }
    int nb = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, threads, smem) != cudaSuccess) {
        (void)cudaGetLastError(); /* a launch of that shape reports it */
        nb = 0;
    }
    c->fits[c->n_fits++ % MR_CU_FITS] = {kernel, threads, smem, nb > 0 ? nb : 0};
    return nb > 0 ? nb : 0;
}

static void cu_destroy(mr_backend *be)
{
    mr_cu_ctx *c = mr_cu(be);
    if (c) {
        if (c->stream) {
            mr_cu_flush(be);
            mr_cu_autograph_free(be);
        }
        cudaStreamSynchronize(c->stream);
        if (c->scratch_w.p) cudaFree(c->scratch_w.p);
        if (c->scratch_attn.p) cudaFree(c->scratch_attn.p);
        if (c->scratch_pfa.p) cudaFree(c->scratch_pfa.p);
        if (c->scratch_act.p) cudaFree(c->scratch_act.p);
        if (c->scratch_moe.p) cudaFree(c->scratch_moe.p);
        if (c->scratch_grp.p) cudaFree(c->scratch_grp.p);
        if (c->scratch_q8.p) cudaFree(c->scratch_q8.p);
        if (c->scratch_x24.p) cudaFree(c->scratch_x24.p);
        if (c->scratch_xmd.p) cudaFree(c->scratch_xmd.p);
        if (c->scratch_split.p) cudaFree(c->scratch_split.p);
        if (c->cublas) cublasDestroy(c->cublas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

extern "C" bool mr_backend_cuda_available(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

extern "C" mr_backend *mr_backend_cuda_create(int device, mr_err *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        mr_errf(err, "cuda: no device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        return NULL;
    }
    if (device < 0 || device >= n) {
        mr_errf(err, "cuda: device %d does not exist (%d present)", device, n);
        return NULL;
    }
    mr_backend *be = (mr_backend *)calloc(1, sizeof *be);
    mr_cu_ctx *c = (mr_cu_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        mr_errf(err, "cuda: out of host memory");
        return NULL;
    }
    be->ctx = c;
    be->destroy = cu_destroy;
    c->device = device;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        mr_errf(err, "cuda: device %d setup: %s", device, cudaGetErrorString(e));
        cu_destroy(be);
        return NULL;
    }
    c->n_sm = prop.multiProcessorCount;
    const char *gen = getenv("MEMRA_CUDA_GENERIC");
    c->no_fast = gen && *gen && strcmp(gen, "0");
    const char *fr = getenv("MEMRA_CUDA_FAST_R");
    c->fast_r = fr ? atoi(fr) : 0;
    const char *qw = getenv("MEMRA_CUDA_Q4K_WIDE");
    c->q4k_wide = !(qw && !strcmp(qw, "0"));
    const char *ro = getenv("MEMRA_CUDA_ROUTE");
    c->route_rank = !(ro && !strcmp(ro, "warp")); /* run 109: +2.5-3.3% tg128 on the 30B-A3B */
    const char *wr = getenv("MEMRA_CUDA_WIDE_R");
    c->wide_r = wr ? atoi(wr) : 0;
    const char *wl = getenv("MEMRA_CUDA_WIDE_LOOP");
    c->wide_loop = wl && *wl ? (atoi(wl) > 0 ? atoi(wl) : 0) : INT_MAX;
    const char *am = getenv("MEMRA_CUDA_ATTN_MERGE");
    c->attn_merge_reg = !(am && !strcmp(am, "loop"));
    const char *xq = getenv("MEMRA_CUDA_XM_QUANT");
    c->xm_quant_block = !(xq && !strcmp(xq, "launch")); /* run 116: +1.9-2.2% tg128 30B-A3B, +1.0-2.4% 35B-A3B */
    const char *xe = getenv("MEMRA_CUDA_XM_EARLY");
    c->xm_early = !(xe && !strcmp(xe, "0"));
    const char *xqr = getenv("MEMRA_CUDA_XM_QUARTER");
    c->xm_quarter = xqr && (!strcmp(xqr, "0") || !strcmp(xqr, "2")) ? atoi(xqr) : 1;
    const char *xmm = getenv("MEMRA_CUDA_XMM");
    /* runs 155-156: Q4_K and Q6_K, 30B-A3B decode only C = 16 +24%, tg128
     * -1..-3%; run 163: and IQ4_XS rows of at most 512 columns (=iq4d), 35B-A3B
     * C = 16 +5.9%, tg128 -0.3% against =2; every IQ4_XS matrix (=iq4): +7.8%,
     * -2.2% */
    c->xmm = !xmm                   ? 3
             : !strcmp(xmm, "0")    ? 0
             : !strcmp(xmm, "q4k")  ? 1
             : !strcmp(xmm, "2")    ? 2
             : !strcmp(xmm, "iq4")  ? 4
                                    : 3; /* iq4d, or a value it does not know: the default */
    const char *xi = getenv("MEMRA_CUDA_XMM_ITEMS");
    c->xmm_items = !(xi && !strcmp(xi, "0"));
    /* row tiles a warp for those batches: auto (0) unless a count is set */
    long long tpw = 0;
    const char *xt = getenv("MEMRA_CUDA_XMM_TPW");
    if (!(xt && !strcmp(xt, "auto")) &&
        mr_cu_env_int(c, "MEMRA_CUDA_XMM_TPW", 1, 8, "auto or a tile count of 1 to 8", &tpw) >= 0)
        c->xmm_tpw = (int)tpw;
    const char *xh = getenv("MEMRA_CUDA_XM_HALF");
    c->xm_half = !(xh && !strcmp(xh, "0"));
    const char *ew = getenv("MEMRA_CUDA_EARLY");
    c->early_w = !(ew && !strcmp(ew, "0")); /* run 109: +3.3% tg128, 30B-A3B */
    const char *ei = getenv("MEMRA_CUDA_EARLY_IQ4XS");
    c->early_iq4 = !(ei && !strcmp(ei, "0"));
    const char *w8 = getenv("MEMRA_CUDA_WIDE8");
    c->wide8 = !(w8 && !strcmp(w8, "0"));
    /* four rows a block (2: two, 1: one; same bits).  Run 147, 16 tokens,
     * two rows / four: Q4_K 4096 x 4096 54.2 / 43.3 us, 4096 x 12288 144.0 /
     * 105.4; decode only C = 16, 8B 956 / 1,048 output tok/s */
    c->wide8_rows = w8 && (!strcmp(w8, "1") || !strcmp(w8, "2")) ? atoi(w8) : 4;
    const char *w16 = getenv("MEMRA_CUDA_WIDE16");
    /* run 139 (16 tokens, us, 8 a launch / 16 at one row / 16 at two):
     * Q4_K 5120 x 2048 40.1 / 51.7 / 32.6, 2048 x 4096 30.5 / 44.1 / 29.6 */
    c->wide16 = w16 && (!strcmp(w16, "0") || !strcmp(w16, "1")) ? atoi(w16) : 2;
    const char *f8 = getenv("MEMRA_CUDA_FAST8");
    c->fast8 = f8 && (!strcmp(f8, "0") || !strcmp(f8, "1")) ? atoi(f8) : 2;
    const char *f8j = getenv("MEMRA_CUDA_FAST8_JOBS");
    c->fast8_jobs = !(f8j && !strcmp(f8j, "0"));
    pdl_init(c, &prop);
    mr_cu_x24_init(c);
    mr_cu_fast_init(c);
    mr_cu_xmd_init(c);
    if (cublasCreate(&c->cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(c->cublas, c->stream) != CUBLAS_STATUS_SUCCESS) {
        mr_errf(err, "cuda: cuBLAS init failed on device %d", device);
        c->cublas = NULL;
        cu_destroy(be);
        return NULL;
    }
    /* the precision of each GEMM is its compute type (cu_gemm.cu) */
    mr_cu_gemm_init(c);
    mr_cu_attn_init(c); /* prompt attention kernel (cu_fattn.cu), decode kernel choice */
    if (!mr_cu_q8_init(c, err)) {
        cu_destroy(be);
        return NULL;
    }

    be->name = "cuda";
    be->kv_default = MR_KV_F16;
    be->batch_variant_rows = MR_CU_GEMM_MIN_TOKENS; /* float16 GEMMs from there on */
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_upload;
    be->download = cu_download;
    be->sync = cu_sync;
    be->weight_load = cu_weight_load;
    be->weight_release = cu_weight_release;
    be->kv_create = cu_kv_create;
    be->kv_destroy = cu_kv_destroy;
    be->get_rows = mr_cu_get_rows;
    be->matmul = mr_cu_matmul;
    be->matmul_id = mr_cu_matmul_id;
    be->matmul_prompt = mr_cu_matmul_prompt;
    be->matmul_id_prompt = mr_cu_matmul_id_prompt;
    be->moe_ffn_prompt = mr_cu_moe_ffn_prompt;
    be->graph_begin = cu_graph_begin;
    be->graph_end = cu_graph_end;
    be->graph_launch = cu_graph_launch;
    be->graph_destroy = cu_graph_destroy;
    /* float32 prompt GEMMs and prompt attention; decode activations are
     * float32 already unless MEMRA_CUDA_MATVEC asks */
    be->prefer_float32 = mr_cu_prefer_float32;
    mr_cu_install_ops(be);
    mr_cu_install_attn(be);
    mr_cu_install_gdn(be);
    mr_cu_install_sample(be);
    /* last: it wraps the table above.  Ops are recorded and launched at the
     * next flush, so any op added to this table later must be wrapped in
     * cu_autograph.cu too (or call mr_cu_flush(be) before launching), or it
     * would run ahead of ops recorded before it. */
    mr_cu_autograph_install(be);
    return be;
}

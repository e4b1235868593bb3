/* CPU backend: memory is host memory, weights point into the GGUF mapping
 * (no copy), the KV cache is float32 blocks.  Ops run synchronously and
 * record their first failure, which be->sync returns. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void mr_cpu_fail(mr_backend *be, const char *fmt, ...)
{
    mr_cpu_ctx *c = be->ctx;
    if (c->failed)
        return;
    c->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->first.msg, sizeof c->first.msg, fmt, ap);
    va_end(ap);
}

int mr_cpu_weight_row(mr_backend *be, const mr_weight *w, int64_t m, int64_t r, float *dst)
{
    const uint8_t *row = (const uint8_t *)w->data + ((size_t)m * (size_t)w->rows + (size_t)r) * w->row_bytes;
    if (mr_dequantize_row(w->type, row, dst, w->cols) != 0) {
        mr_cpu_fail(be, "cpu: cannot dequantize weight '%s' of type %s",
                    w->name ? w->name : "?", mr_type_name(w->type));
        memset(dst, 0, sizeof(float) * (size_t)w->cols);
        return -1;
    }
    return 0;
}

static void *cpu_alloc(mr_backend *be, size_t bytes)
{
    (void)be;
    /* 64-byte alignment so that any element type and vector load is aligned. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0)
        rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (p)
        memset(p, 0, rounded);
    return p;
}

static void cpu_free(mr_backend *be, void *p)
{
    (void)be;
    free(p);
}

static int cpu_copy(mr_backend *be, void *dst, const void *src, size_t n, mr_err *err)
{
    (void)be;
    if (n && (!dst || !src))
        return mr_errf(err, "cpu: copy of %zu bytes with a NULL pointer", n);
    if (n)
        memmove(dst, src, n);
    return 0;
}

static int cpu_sync(mr_backend *be, mr_err *err)
{
    mr_cpu_ctx *c = be->ctx;
    if (!c->failed)
        return 0;
    c->failed = 0;
    return mr_errf(err, "%s", c->first.msg);
}

static int cpu_weight_load(mr_backend *be, mr_weight *w, const void *host, mr_err *err)
{
    (void)be;
    const mr_type_info *ti = mr_type_get(w->type);
    if (!ti || !ti->known)
        return mr_errf(err, "weight '%s': unknown type id %d", w->name ? w->name : "?", w->type);
    if (!ti->supported)
        return mr_errf(err, "weight '%s': type %s is not supported by the cpu backend",
                       w->name ? w->name : "?", ti->name);
    if (w->cols <= 0 || w->rows <= 0 || w->n_mats <= 0)
        return mr_errf(err, "weight '%s': bad shape %lld x %lld x %lld", w->name ? w->name : "?",
                       (long long)w->cols, (long long)w->rows, (long long)w->n_mats);
    size_t rb = mr_row_size(w->type, w->cols);
    if (rb == 0)
        return mr_errf(err, "weight '%s': %lld columns is not a multiple of the %s block size",
                       w->name ? w->name : "?", (long long)w->cols, ti->name);
    w->row_bytes = rb;
    w->data = host;
    w->priv = NULL;
    return 0;
}

static void cpu_weight_release(mr_backend *be, mr_weight *w)
{
    (void)be;
    w->data = NULL; /* points into the caller's mapping: nothing to free */
}

static int cpu_kv_create(mr_backend *be, mr_kv_cache *kv, mr_err *err)
{
    if (kv->dtype != MR_KV_F32)
        return mr_errf(err, "cpu: a %s KV cache is not supported (float32 only)",
                       kv->dtype == MR_KV_F16 ? "float16" : kv->dtype == MR_KV_BF16 ? "bfloat16" : "non-float32");
    if (kv->n_layers <= 0 || kv->n_blocks <= 0 || kv->block_tokens <= 0 || kv->n_kv_heads <= 0 ||
        kv->head_dim <= 0)
        return mr_errf(err, "cpu: bad KV cache shape (layers %d, blocks %d, block tokens %d, kv heads %d, head dim %d)",
                       kv->n_layers, kv->n_blocks, kv->block_tokens, kv->n_kv_heads, kv->head_dim);
    size_t per_layer = (size_t)kv->n_blocks * (size_t)kv->block_tokens * (size_t)kv->n_kv_heads *
                       (size_t)kv->head_dim * sizeof(float);
    kv->k = calloc((size_t)kv->n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)kv->n_layers, sizeof *kv->v);
    if (!kv->k || !kv->v)
        goto oom;
    for (int l = 0; l < kv->n_layers; l++) {
        kv->k[l] = cpu_alloc(be, per_layer);
        kv->v[l] = cpu_alloc(be, per_layer);
        if (!kv->k[l] || !kv->v[l])
            goto oom;
    }
    return 0;
oom:
    be->kv_destroy(be, kv);
    return mr_errf(err, "cpu: out of memory for a KV cache of %d layers x %zu bytes", kv->n_layers,
                   2 * per_layer);
}

static void cpu_kv_destroy(mr_backend *be, mr_kv_cache *kv)
{
    (void)be;
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->k)
            free(kv->k[l]);
        if (kv->v)
            free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}

static void cpu_destroy(mr_backend *be)
{
    free(be->ctx);
    free(be);
}

mr_backend *mr_backend_cpu_create(mr_err *err)
{
    mr_backend *be = calloc(1, sizeof *be);
    mr_cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        mr_errf(err, "cpu: out of memory creating the backend");
        return NULL;
    }
    be->name = "cpu";
    be->kv_default = MR_KV_F32;
    be->ctx = c;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->sync = cpu_sync;
    be->weight_load = cpu_weight_load;
    be->weight_release = cpu_weight_release;
    be->kv_create = cpu_kv_create;
    be->kv_destroy = cpu_kv_destroy;
    be->destroy = cpu_destroy;

    be->get_rows = mr_cpu_get_rows;
    be->matmul = mr_cpu_matmul;
    be->matmul_id = mr_cpu_matmul_id;
    be->rmsnorm = mr_cpu_rmsnorm;
    be->rope = mr_cpu_rope;
    be->kv_store = mr_cpu_kv_store;
    be->attention = mr_cpu_attention;
    be->kv_store_multi = mr_cpu_kv_store_multi;
    be->attention_multi = mr_cpu_attention_multi;
    be->swiglu = mr_cpu_swiglu;
    be->add = mr_cpu_add;
    be->moe_route = mr_cpu_moe_route;
    be->moe_combine = mr_cpu_moe_combine;
    be->argmax = mr_cpu_argmax;
    be->copy_2d = mr_cpu_copy_2d;
    be->sigmoid_mul = mr_cpu_sigmoid_mul;
    be->conv1d_silu = mr_cpu_conv1d_silu;
    be->gdn_scan = mr_cpu_gdn_scan;
    /* The chunked prefill form of the scan is an option: its results differ
     * from the recurrent form's in the last float bits, and a request's
     * tokens must not depend on how its prompt was chunked. */
    const char *gc = getenv("MEMRA_CPU_GDN_CHUNK");
    if (gc && atoi(gc) > 1) {
        c->gdn_chunk = atoi(gc);
        be->gdn_scan = mr_cpu_gdn_scan_opt;
    }
    return be;
}

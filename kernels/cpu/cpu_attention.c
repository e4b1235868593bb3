/* CPU paged KV cache (float32 blocks) and causal GQA attention over it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* Start of the n_kv_heads * head_dim values of position p, or NULL (and a
 * recorded error) when the position or its block id is out of range. */
static float *kv_slot(mr_backend *be, const mr_kv_cache *kv, void *store, const int32_t *block_table,
                      int32_t p)
{
    if (p < 0) {
        mr_cpu_fail(be, "cpu kv: negative position %d", p);
        return NULL;
    }
    int32_t blk = block_table[p / kv->block_tokens];
    if (blk < 0 || blk >= kv->n_blocks) {
        mr_cpu_fail(be, "cpu kv: block id %d for position %d out of range [0, %d)", blk, p, kv->n_blocks);
        return NULL;
    }
    size_t row = (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
    size_t tok = (size_t)blk * (size_t)kv->block_tokens + (size_t)(p % kv->block_tokens);
    return (float *)store + tok * row;
}

void mr_cpu_kv_store(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *block_table,
                     const float *k, const float *v, const int32_t *pos, int n)
{
    if (layer < 0 || layer >= kv->n_layers) {
        mr_cpu_fail(be, "cpu kv_store: layer %d out of range [0, %d)", layer, kv->n_layers);
        return;
    }
    size_t row = (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
    for (int t = 0; t < n; t++) {
        float *kd = kv_slot(be, kv, kv->k[layer], block_table, pos[t]);
        float *vd = kv_slot(be, kv, kv->v[layer], block_table, pos[t]);
        if (!kd || !vd)
            return;
        memcpy(kd, k + (size_t)t * row, row * sizeof(float));
        memcpy(vd, v + (size_t)t * row, row * sizeof(float));
    }
}

void mr_cpu_attention(mr_backend *be, const mr_kv_cache *kv, int layer, const int32_t *block_table,
                      const float *q, const int32_t *pos, int n, int n_heads, float scale,
                      float *out)
{
    int hd = kv->head_dim, nkv = kv->n_kv_heads;
    if (layer < 0 || layer >= kv->n_layers || nkv <= 0 || n_heads % nkv) {
        mr_cpu_fail(be, "cpu attention: layer %d of %d, %d heads not a multiple of %d kv heads",
                    layer, kv->n_layers, n_heads, nkv);
        return;
    }
    int group = n_heads / nkv;
    int32_t max_pos = 0;
    for (int t = 0; t < n; t++) {
        if (pos[t] < 0) {
            mr_cpu_fail(be, "cpu attention: negative position %d", pos[t]);
            return;
        }
        if (pos[t] > max_pos)
            max_pos = pos[t];
    }
    float *score = malloc(sizeof(float) * ((size_t)max_pos + 1));
    double *acc = malloc(sizeof(double) * (size_t)hd);
    if (!score || !acc) {
        mr_cpu_fail(be, "cpu attention: out of memory for %d positions", max_pos + 1);
        goto done;
    }
    for (int t = 0; t < n; t++) {
        int32_t len = pos[t] + 1;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)hd;
            size_t koff = (size_t)(h / group) * (size_t)hd;
            float mx = -INFINITY;
            for (int32_t p = 0; p < len; p++) {
                const float *kp = kv_slot(be, kv, kv->k[layer], block_table, p);
                if (!kp)
                    goto done;
                score[p] = mr_cpu_dot(qh, kp + koff, hd) * scale;
                if (score[p] > mx)
                    mx = score[p];
            }
            /* softmax in float with the maximum subtracted; the sum in double */
            double sum = 0.0;
            for (int32_t p = 0; p < len; p++) {
                score[p] = expf(score[p] - mx);
                sum += score[p];
            }
            for (int i = 0; i < hd; i++)
                acc[i] = 0.0;
            for (int32_t p = 0; p < len; p++) {
                const float *vp = kv_slot(be, kv, kv->v[layer], block_table, p);
                if (!vp)
                    goto done;
                double wgt = score[p] / sum;
                for (int i = 0; i < hd; i++)
                    acc[i] += wgt * vp[koff + (size_t)i];
            }
            float *oh = out + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)hd;
            for (int i = 0; i < hd; i++)
                oh[i] = (float)acc[i];
        }
    }
done:
    free(score);
    free(acc);
}

void mr_cpu_kv_store_multi(mr_backend *be, mr_kv_cache *kv, int layer, const int32_t *const *tables,
                           const float *k, const float *v, const int32_t *pos, int n)
{
    size_t row = (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
    for (int t = 0; t < n; t++)
        if (tables[t])
            mr_cpu_kv_store(be, kv, layer, tables[t], k + (size_t)t * row, v + (size_t)t * row, pos + t, 1);
}

void mr_cpu_attention_multi(mr_backend *be, const mr_kv_cache *kv, int layer,
                            const int32_t *const *tables, const float *q, const int32_t *pos, int n,
                            int n_heads, float scale, float *out)
{
    size_t qd = (size_t)n_heads * (size_t)kv->head_dim;
    for (int t = 0; t < n; t++)
        if (tables[t])
            mr_cpu_attention(be, kv, layer, tables[t], q + (size_t)t * qd, pos + t, 1, n_heads, scale,
                             out + (size_t)t * qd);
}

/* CPU matmuls over GGUF weights: each weight row is dequantized once and
 * used for every token, and each output element is one double-accumulated
 * dot product, so results do not depend on the number of tokens. */
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

static float *row_buffer(mr_backend *be, const mr_weight *w)
{
    float *buf = malloc(sizeof(float) * (size_t)w->cols);
    if (!buf)
        mr_cpu_fail(be, "cpu: out of memory for a row of '%s'", w->name ? w->name : "?");
    return buf;
}

void mr_cpu_get_rows(mr_backend *be, const mr_weight *w, const int32_t *ids, int n, float *out)
{
    for (int t = 0; t < n; t++) {
        float *dst = out + (size_t)t * (size_t)w->cols;
        if (ids[t] < 0 || ids[t] >= w->rows) {
            mr_cpu_fail(be, "cpu get_rows: id %d out of range [0, %lld) for '%s'", ids[t],
                        (long long)w->rows, w->name ? w->name : "?");
            for (int64_t i = 0; i < w->cols; i++)
                dst[i] = 0.0f;
            continue;
        }
        mr_cpu_weight_row(be, w, 0, ids[t], dst);
    }
}

void mr_cpu_matmul(mr_backend *be, const mr_weight *w, const float *x, float *y, int n)
{
    float *row = row_buffer(be, w);
    if (!row)
        return;
    for (int64_t r = 0; r < w->rows; r++) {
        mr_cpu_weight_row(be, w, 0, r, row);
        for (int t = 0; t < n; t++)
            y[(size_t)t * (size_t)w->rows + (size_t)r] = mr_cpu_dot(row, x + (size_t)t * (size_t)w->cols, w->cols);
    }
    free(row);
}

void mr_cpu_matmul_id(mr_backend *be, const mr_weight *w, const float *x, int x_slots,
                      const int32_t *ids, int k, float *y, int n)
{
    if (x_slots != 1 && x_slots != k) {
        mr_cpu_fail(be, "cpu matmul_id: x_slots %d must be 1 or k=%d", x_slots, k);
        return;
    }
    for (int i = 0; i < n * k; i++) {
        if (ids[i] < 0 || ids[i] >= w->n_mats) {
            mr_cpu_fail(be, "cpu matmul_id: expert id %d out of range [0, %lld) for '%s'", ids[i],
                        (long long)w->n_mats, w->name ? w->name : "?");
            return;
        }
    }
    float *row = row_buffer(be, w);
    if (!row)
        return;
    /* Expert by expert, so that each expert row is dequantized once. */
    for (int64_t e = 0; e < w->n_mats; e++) {
        int used = 0;
        for (int i = 0; i < n * k && !used; i++)
            used = ids[i] == e;
        if (!used)
            continue;
        for (int64_t r = 0; r < w->rows; r++) {
            mr_cpu_weight_row(be, w, e, r, row);
            for (int t = 0; t < n; t++) {
                for (int j = 0; j < k; j++) {
                    if (ids[t * k + j] != e)
                        continue;
                    const float *xr = x + ((size_t)t * (size_t)x_slots + (size_t)(x_slots == 1 ? 0 : j)) * (size_t)w->cols;
                    y[((size_t)t * (size_t)k + (size_t)j) * (size_t)w->rows + (size_t)r] = mr_cpu_dot(row, xr, w->cols);
                }
            }
        }
    }
    free(row);
}

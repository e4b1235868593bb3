/* CPU elementwise ops: RMSNorm, RoPE, SwiGLU, residual add, argmax. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void mr_cpu_rmsnorm(mr_backend *be, const float *x, const float *w, float *y, int n_rows, int dim,
                    float eps)
{
    (void)be;
    for (int t = 0; t < n_rows; t++) {
        const float *xr = x + (size_t)t * (size_t)dim;
        float *yr = y + (size_t)t * (size_t)dim;
        double ss = 0.0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * (double)xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int i = 0; i < dim; i++)
            yr[i] = xr[i] * inv * w[i];
    }
}

/* Rotates one head in place.  The angle for pair i is pos * base^(-2i/n_rot),
 * computed in double and rounded once, as transformers' inv_freq does. */
static void rope_head(float *x, int pos, int n_rot, double base, enum mr_rope_mode mode)
{
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        double angle = (double)pos * pow(base, -2.0 * i / n_rot);
        float c = (float)cos(angle), s = (float)sin(angle);
        int a = mode == MR_ROPE_NEOX ? i : 2 * i;
        int b = mode == MR_ROPE_NEOX ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void mr_cpu_rope(mr_backend *be, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                 int n_rot, float theta_base, enum mr_rope_mode mode)
{
    if (n_rot > head_dim || n_rot % 2 || (mode != MR_ROPE_NEOX && mode != MR_ROPE_NORM)) {
        mr_cpu_fail(be, "cpu rope: bad n_rot %d (head_dim %d) or mode %d", n_rot, head_dim, (int)mode);
        return;
    }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++)
            rope_head(x + ((size_t)t * (size_t)n_heads + (size_t)h) * (size_t)head_dim, pos[t], n_rot,
                      (double)theta_base, mode);
}

void mr_cpu_swiglu(mr_backend *be, const float *gate, const float *up, float *out, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void mr_cpu_add(mr_backend *be, float *y, const float *x, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

void mr_cpu_argmax(mr_backend *be, const float *x, int n, int dim, int32_t *ids)
{
    (void)be;
    for (int t = 0; t < n; t++) {
        const float *r = x + (size_t)t * (size_t)dim;
        int best = 0;
        /* NaN never compares greater, so a NaN row yields the first index. */
        for (int i = 1; i < dim; i++)
            if (r[i] > r[best])
                best = i;
        ids[t] = best;
    }
}

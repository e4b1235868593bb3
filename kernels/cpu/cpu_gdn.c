/* CPU ops of the hybrid (Gated DeltaNet) models: strided row copy, sigmoid
 * gating, the short causal convolution with carried state and the gated
 * delta-rule scan.  Reductions accumulate in double, as the other CPU ops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void mr_cpu_copy_2d(mr_backend *be, float *dst, int dst_stride, const float *src, int src_stride,
                    int n_rows, int dim)
{
    (void)be;
    for (int r = 0; r < n_rows; r++)
        memmove(dst + (size_t)r * (size_t)dst_stride, src + (size_t)r * (size_t)src_stride,
                sizeof(float) * (size_t)dim);
}

void mr_cpu_sigmoid_mul(mr_backend *be, float *y, const float *g, int n_rows, int dim, int g_stride,
                        bool g_scalar)
{
    (void)be;
    for (int r = 0; r < n_rows; r++) {
        float *yr = y + (size_t)r * (size_t)dim;
        const float *gr = g + (size_t)r * (size_t)g_stride;
        for (int i = 0; i < dim; i++)
            yr[i] *= mr_cpu_sigmoidf(gr[g_scalar ? 0 : i]);
    }
}

void mr_cpu_conv1d_silu(mr_backend *be, const float *x, const float *w, float *state, int n,
                        int channels, int k, float *y)
{
    if (k < 1 || channels < 1 || n < 0) {
        mr_cpu_fail(be, "cpu conv1d_silu: bad shape (k %d, channels %d, n %d)", k, channels, n);
        return;
    }
    int hist = k - 1;
    /* the new state (last k-1 inputs) is gathered before the old one is overwritten */
    float *next = hist ? malloc(sizeof(float) * (size_t)hist * (size_t)channels) : NULL;
    if (hist && !next) {
        mr_cpu_fail(be, "cpu conv1d_silu: out of memory");
        return;
    }
    for (int c = 0; c < channels; c++) {
        const float *wc = w + (size_t)c * (size_t)k;
        for (int t = 0; t < n; t++) {
            double s = 0.0;
            for (int j = 0; j < k; j++) {
                int p = t - hist + j;
                float in = p >= 0 ? x[(size_t)p * (size_t)channels + (size_t)c]
                                  : state[(size_t)(hist + p) * (size_t)channels + (size_t)c];
                s += (double)wc[j] * in;
            }
            float v = (float)s;
            y[(size_t)t * (size_t)channels + (size_t)c] = v / (1.0f + expf(-v));
        }
        for (int i = 0; i < hist; i++) {
            int p = n - hist + i;
            next[(size_t)i * (size_t)channels + (size_t)c] =
                p >= 0 ? x[(size_t)p * (size_t)channels + (size_t)c]
                       : state[(size_t)(hist + p) * (size_t)channels + (size_t)c];
        }
    }
    if (hist)
        memcpy(state, next, sizeof(float) * (size_t)hist * (size_t)channels);
    free(next);
}

void mr_cpu_gdn_scan(mr_backend *be, const float *qkv, int stride, const float *alpha,
                     const float *beta, const float *a, const float *dt_bias, float *state, int n,
                     int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out)
{
    if (n_k_heads < 1 || n_v_heads < 1 || n_v_heads % n_k_heads || dk < 1 || dv < 1 ||
        stride < 2 * n_k_heads * dk + n_v_heads * dv) {
        mr_cpu_fail(be, "cpu gdn_scan: bad shape (k heads %d, v heads %d, dk %d, dv %d, stride %d)",
                    n_k_heads, n_v_heads, dk, dv, stride);
        return;
    }
    float *qn = malloc(sizeof(float) * (size_t)dk);
    float *kn = malloc(sizeof(float) * (size_t)dk);
    double *acc = malloc(sizeof(double) * (size_t)dv);
    if (!qn || !kn || !acc) {
        mr_cpu_fail(be, "cpu gdn_scan: out of memory");
        goto done;
    }
    size_t kdim = (size_t)n_k_heads * (size_t)dk;
    double scale = 1.0 / sqrt((double)dk);
    for (int t = 0; t < n; t++) {
        const float *row = qkv + (size_t)t * (size_t)stride;
        for (int h = 0; h < n_v_heads; h++) {
            int kh = h % n_k_heads;
            mr_cpu_l2norm(row + (size_t)kh * (size_t)dk, qn, dk, eps, scale);
            mr_cpu_l2norm(row + kdim + (size_t)kh * (size_t)dk, kn, dk, eps, 1.0);
            const float *v = row + 2 * kdim + (size_t)h * (size_t)dv;
            size_t th = (size_t)t * (size_t)n_v_heads + (size_t)h;
            float decay = (float)exp((double)a[h] * mr_cpu_softplus((double)alpha[th] + (double)dt_bias[h]));
            float b = mr_cpu_sigmoidf(beta[th]);
            float *S = state + (size_t)h * (size_t)dk * (size_t)dv;

            /* decay, then the memory read S^T kn */
            for (int j = 0; j < dv; j++)
                acc[j] = 0.0;
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * (size_t)dv;
                for (int j = 0; j < dv; j++) {
                    Si[j] *= decay;
                    acc[j] += (double)Si[j] * kn[i];
                }
            }
            /* delta = b * (v - S^T kn), stored in acc */
            for (int j = 0; j < dv; j++)
                acc[j] = (double)b * ((double)v[j] - acc[j]);
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * (size_t)dv;
                for (int j = 0; j < dv; j++)
                    Si[j] += (float)((double)kn[i] * acc[j]);
            }
            /* read out with the query */
            float *o = out + th * (size_t)dv;
            for (int j = 0; j < dv; j++)
                acc[j] = 0.0;
            for (int i = 0; i < dk; i++) {
                const float *Si = S + (size_t)i * (size_t)dv;
                for (int j = 0; j < dv; j++)
                    acc[j] += (double)Si[j] * qn[i];
            }
            for (int j = 0; j < dv; j++)
                o[j] = (float)acc[j];
        }
    }
done:
    free(qn);
    free(kn);
    free(acc);
}

/* The chunked (parallel) form of the gated delta-rule scan, for prefill.
 *
 * Per value head, with M = S^T (dv x dk) and within one chunk of C tokens
 * t = 1..C starting from M_0, the recurrence of mr_cpu_gdn_scan is
 *   M_t = g_t M_{t-1} + u_t k_t^T,   u_t = b_t (v_t - g_t M_{t-1} k_t).
 * With G_t = g_1 ... g_t (G_0 = 1) it unrolls to
 *   M_t = G_t M_0 + sum_{s<=t} (G_t/G_s) u_s k_s^T,
 * so the new values u solve a unit lower-triangular system
 *   u_t + b_t sum_{s<t} (G_t/G_s) (k_t.k_s) u_s = b_t (v_t - G_t M_0 k_t)
 * (the UT transform; solved here by forward substitution on the right-hand
 * side, which is the same as applying (I + A)^-1), and then
 *   o_t = G_t M_0 q_t + sum_{s<=t} (G_t/G_s) (q_t.k_s) u_s,
 *   M_C = G_C M_0 + sum_s (G_C/G_s) u_s k_s^T.
 * The state is read and written once per chunk instead of once per token.
 * The gate ratios are taken as exp of differences of cumulative log gates:
 * G_t itself underflows under strong gating, a ratio with t >= s is <= 1.
 * A tail shorter than the chunk runs through the recurrent form. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static double dotf(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

void mr_cpu_gdn_scan_chunked(mr_backend *be, const float *qkv, int stride, const float *alpha,
                             const float *beta, const float *a, const float *dt_bias, float *state,
                             int n, int n_k_heads, int n_v_heads, int dk, int dv, float eps, int chunk,
                             float *out)
{
    if (n_k_heads < 1 || n_v_heads < 1 || n_v_heads % n_k_heads || dk < 1 || dv < 1 ||
        stride < 2 * n_k_heads * dk + n_v_heads * dv || chunk < 1) {
        mr_cpu_fail(be,
                    "cpu gdn_scan_chunked: bad shape (k heads %d, v heads %d, dk %d, dv %d, stride %d, "
                    "chunk %d)",
                    n_k_heads, n_v_heads, dk, dv, stride, chunk);
        return;
    }
    int full = chunk > 1 ? n / chunk * chunk : 0;
    size_t C = (size_t)chunk;
    float *qn = NULL, *kn = NULL;
    double *lg = NULL, *b = NULL, *u = NULL, *acc = NULL;
    if (full) {
        qn = malloc(sizeof(float) * C * (size_t)dk);
        kn = malloc(sizeof(float) * C * (size_t)dk);
        lg = malloc(sizeof(double) * C);
        b = malloc(sizeof(double) * C);
        u = malloc(sizeof(double) * C * (size_t)dv);
        acc = malloc(sizeof(double) * (size_t)dv);
        if (!qn || !kn || !lg || !b || !u || !acc) {
            mr_cpu_fail(be, "cpu gdn_scan_chunked: out of memory");
            goto done;
        }
    }
    size_t kdim = (size_t)n_k_heads * (size_t)dk;
    double scale = 1.0 / sqrt((double)dk);
    for (int t0 = 0; t0 < full; t0 += chunk) {
        for (int h = 0; h < n_v_heads; h++) {
            int kh = h % n_k_heads;
            float *S = state + (size_t)h * (size_t)dk * (size_t)dv;
            double cum = 0.0;
            for (size_t t = 0; t < C; t++) {
                const float *row = qkv + ((size_t)t0 + t) * (size_t)stride;
                size_t th = ((size_t)t0 + t) * (size_t)n_v_heads + (size_t)h;
                mr_cpu_l2norm(row + (size_t)kh * (size_t)dk, qn + t * (size_t)dk, dk, eps, scale);
                mr_cpu_l2norm(row + kdim + (size_t)kh * (size_t)dk, kn + t * (size_t)dk, dk, eps, 1.0);
                /* the same float gate as the recurrent form; a gate that
                 * rounds to 0 clears the state there, as exp(-800) does */
                float g = (float)exp((double)a[h] * mr_cpu_softplus((double)alpha[th] + (double)dt_bias[h]));
                cum += g > 0.0f ? log((double)g) : -800.0;
                lg[t] = cum;
                b[t] = (double)mr_cpu_sigmoidf(beta[th]);
            }
            /* right-hand side b_t (v_t - G_t M_0 k_t), then forward substitution */
            for (size_t t = 0; t < C; t++) {
                const float *kt = kn + t * (size_t)dk;
                const float *v = qkv + ((size_t)t0 + t) * (size_t)stride + 2 * kdim + (size_t)h * (size_t)dv;
                double *ut = u + t * (size_t)dv;
                for (int j = 0; j < dv; j++)
                    acc[j] = 0.0;
                for (int i = 0; i < dk; i++) {
                    const float *Si = S + (size_t)i * (size_t)dv;
                    for (int j = 0; j < dv; j++)
                        acc[j] += (double)Si[j] * kt[i];
                }
                double G = exp(lg[t]);
                for (int j = 0; j < dv; j++)
                    ut[j] = b[t] * ((double)v[j] - G * acc[j]);
                for (size_t s = 0; s < t; s++) {
                    double c = b[t] * exp(lg[t] - lg[s]) * dotf(kt, kn + s * (size_t)dk, dk);
                    const double *us = u + s * (size_t)dv;
                    for (int j = 0; j < dv; j++)
                        ut[j] -= c * us[j];
                }
            }
            /* outputs, from M_0 and the solved u */
            for (size_t t = 0; t < C; t++) {
                const float *qt = qn + t * (size_t)dk;
                for (int j = 0; j < dv; j++)
                    acc[j] = 0.0;
                for (int i = 0; i < dk; i++) {
                    const float *Si = S + (size_t)i * (size_t)dv;
                    for (int j = 0; j < dv; j++)
                        acc[j] += (double)Si[j] * qt[i];
                }
                double G = exp(lg[t]);
                for (int j = 0; j < dv; j++)
                    acc[j] *= G;
                for (size_t s = 0; s <= t; s++) {
                    double c = exp(lg[t] - lg[s]) * dotf(qt, kn + s * (size_t)dk, dk);
                    const double *us = u + s * (size_t)dv;
                    for (int j = 0; j < dv; j++)
                        acc[j] += c * us[j];
                }
                float *o = out + (((size_t)t0 + t) * (size_t)n_v_heads + (size_t)h) * (size_t)dv;
                for (int j = 0; j < dv; j++)
                    o[j] = (float)acc[j];
            }
            /* the state at the end of the chunk: S[i][j] = G_C S0[i][j] + sum_s (G_C/G_s) k_s[i] u_s[j] */
            double GC = exp(lg[C - 1]);
            for (int i = 0; i < dk; i++) {
                float *Si = S + (size_t)i * (size_t)dv;
                for (int j = 0; j < dv; j++)
                    acc[j] = GC * (double)Si[j];
                for (size_t s = 0; s < C; s++) {
                    double c = exp(lg[C - 1] - lg[s]) * kn[s * (size_t)dk + (size_t)i];
                    const double *us = u + s * (size_t)dv;
                    for (int j = 0; j < dv; j++)
                        acc[j] += c * us[j];
                }
                for (int j = 0; j < dv; j++)
                    Si[j] = (float)acc[j];
            }
        }
    }
    if (n > full) {
        size_t r = (size_t)full;
        mr_cpu_gdn_scan(be, qkv + r * (size_t)stride, stride, alpha + r * (size_t)n_v_heads,
                        beta + r * (size_t)n_v_heads, a, dt_bias, state, n - full, n_k_heads, n_v_heads,
                        dk, dv, eps, out + r * (size_t)n_v_heads * (size_t)dv);
    }
done:
    free(qn);
    free(kn);
    free(lg);
    free(b);
    free(u);
    free(acc);
}

/* The op-interface entry when the backend was created with a chunk size. */
void mr_cpu_gdn_scan_opt(mr_backend *be, const float *qkv, int stride, const float *alpha,
                         const float *beta, const float *a, const float *dt_bias, float *state, int n,
                         int n_k_heads, int n_v_heads, int dk, int dv, float eps, float *out)
{
    const mr_cpu_ctx *c = be->ctx;
    mr_cpu_gdn_scan_chunked(be, qkv, stride, alpha, beta, a, dt_bias, state, n, n_k_heads, n_v_heads,
                            dk, dv, eps, c->gdn_chunk, out);
}

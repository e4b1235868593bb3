/* CPU mixture-of-experts routing and combination. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

void mr_cpu_moe_route(mr_backend *be, const float *logits, int n, int n_expert, int k,
                      bool norm_topk, int32_t *ids, float *weights)
{
    if (k <= 0 || k > n_expert) {
        mr_cpu_fail(be, "cpu moe_route: k=%d must be in [1, %d]", k, n_expert);
        return;
    }
    float *prob = malloc(sizeof(float) * (size_t)n_expert);
    if (!prob) {
        mr_cpu_fail(be, "cpu moe_route: out of memory");
        return;
    }
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * (size_t)n_expert;
        float mx = -INFINITY;
        for (int e = 0; e < n_expert; e++)
            if (l[e] > mx)
                mx = l[e];
        double sum = 0.0;
        for (int e = 0; e < n_expert; e++) {
            prob[e] = expf(l[e] - mx);
            sum += prob[e];
        }
        for (int e = 0; e < n_expert; e++)
            prob[e] = (float)(prob[e] / sum);
        /* top-k by repeated selection: strict '>' keeps the lower id on ties */
        int32_t *tid = ids + (size_t)t * (size_t)k;
        float *tw = weights + (size_t)t * (size_t)k;
        double picked = 0.0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_expert; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken = taken || tid[i] == e;
                if (!taken && (best < 0 || prob[e] > prob[best]))
                    best = e;
            }
            tid[j] = best;
            tw[j] = prob[best];
            picked += prob[best];
        }
        if (norm_topk)
            for (int j = 0; j < k; j++)
                tw[j] = (float)(tw[j] / picked);
    }
    free(prob);
}

void mr_cpu_moe_combine(mr_backend *be, const float *y, const float *weights, int n, int k,
                        int rows, float *out)
{
    (void)be;
    for (int t = 0; t < n; t++) {
        for (int r = 0; r < rows; r++) {
            double s = 0.0;
            for (int j = 0; j < k; j++)
                s += (double)weights[t * k + j] * y[((size_t)t * (size_t)k + (size_t)j) * (size_t)rows + (size_t)r];
            out[(size_t)t * (size_t)rows + (size_t)r] = (float)s;
        }
    }
}

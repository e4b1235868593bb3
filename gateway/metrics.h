/* Prometheus text-format metrics of the gateway (single-threaded: updated
 * and rendered on the event loop). */
#ifndef MR_METRICS_H
#define MR_METRICS_H

#include <stdint.h>

#include "gateway/util.h"

#define MR_HIST_BUCKETS 14

typedef struct mr_hist {
    uint64_t counts[MR_HIST_BUCKETS + 1]; /* last = +Inf */
    double sum;
    uint64_t n;
} mr_hist;

extern const double mr_hist_bounds[MR_HIST_BUCKETS];

void mr_hist_observe(mr_hist *h, double v);
/* Appends one histogram in text format with the given name and labels
 * (labels like `model="x"` or ""). */
void mr_hist_render(mr_buf *out, const char *name, const char *labels, const mr_hist *h);

typedef struct mr_route_count {
    char route[32];
    int status;
    uint64_t n;
} mr_route_count;

typedef struct mr_metrics {
    mr_route_count routes[128];
    int n_routes;
} mr_metrics;

void mr_metrics_request(mr_metrics *m, const char *route, int status);
void mr_metrics_render_routes(const mr_metrics *m, mr_buf *out);

#endif

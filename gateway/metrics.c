#include "gateway/metrics.h"

#include <stdio.h>
#include <string.h>

const double mr_hist_bounds[MR_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,    1,     2.5,  5,     10,   30};

void mr_hist_observe(mr_hist *h, double v)
{
    int i = 0;
    while (i < MR_HIST_BUCKETS && v > mr_hist_bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

void mr_hist_render(mr_buf *out, const char *name, const char *labels, const mr_hist *h)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < MR_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        mr_buf_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, mr_hist_bounds[i],
                      (unsigned long long)cum);
    }
    cum += h->counts[MR_HIST_BUCKETS];
    mr_buf_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    mr_buf_printf(out, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
                  (unsigned long long)h->n);
}

void mr_metrics_request(mr_metrics *m, const char *route, int status)
{
    for (int i = 0; i < m->n_routes; i++)
        if (m->routes[i].status == status && !strcmp(m->routes[i].route, route)) {
            m->routes[i].n++;
            return;
        }
    if (m->n_routes == (int)(sizeof m->routes / sizeof *m->routes))
        return;
    mr_route_count *r = &m->routes[m->n_routes++];
    snprintf(r->route, sizeof r->route, "%s", route);
    r->status = status;
    r->n = 1;
}

void mr_metrics_render_routes(const mr_metrics *m, mr_buf *out)
{
    mr_buf_adds(out, "# HELP memra_http_requests_total HTTP requests by route and status.\n"
                     "# TYPE memra_http_requests_total counter\n");
    for (int i = 0; i < m->n_routes; i++)
        mr_buf_printf(out, "memra_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n", m->routes[i].route,
                      m->routes[i].status, (unsigned long long)m->routes[i].n);
}

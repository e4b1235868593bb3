/* Shared pieces of the CPU-op suites (test_cpu_ops, test_cpu_gdn): a CPU
 * backend per test, seeded random inputs, and element-wise comparison of
 * the op's float output with a float64 reference.
 *
 * The including file defines CPU_REF_SEED (its xorshift64 seed) first, so
 * that each suite keeps its own fixed inputs. */
#ifndef MR_CPU_REF_H
#define MR_CPU_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/ops.h"
#include "tests/unit/testutil.h"

#ifndef CPU_REF_SEED
#error "define CPU_REF_SEED before including cpu_ref.h"
#endif

static mr_backend *be;

/* Checked fixture: a fresh CPU backend for each test. */
static void setup(void)
{
    mr_err err;
    be = mr_backend_cpu_create(&err);
    ck_assert_msg(be != NULL, "%s", err.msg);
}

static void teardown(void) { mr_backend_destroy(be); }

static uint64_t rng = CPU_REF_SEED;
static inline double urand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* n values uniform in [-scale, scale) (malloc'd). */
static inline float *rand_vec(size_t n, double scale)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(urand() * scale);
    return v;
}

/* |a - b| <= tol * (|b| + floor), element by element */
static inline void assert_close(const float *a, const double *b, size_t n, double tol, double floor_,
                                const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        ck_assert_msg(d <= tol * (fabs(b[i]) + floor_), "%s[%zu]: got %.9g want %.9g", what, i,
                      (double)a[i], b[i]);
    }
}

/* The queued ops ran without error. */
static inline void assert_sync_ok(void)
{
    mr_err err;
    ck_assert_msg(be->sync(be, &err) == 0, "%s", err.msg);
}

#endif

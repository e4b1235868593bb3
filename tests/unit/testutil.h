/* Shared helpers for the Check unit suites. */
#ifndef MR_TESTUTIL_H
#define MR_TESTUTIL_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Path of a file under the shared fixtures folder (MEMRA_FIXTURES, set by
 * scripts/run-tests.sh; default ../shared/fixtures).  Returns a static buffer. */
static inline const char *fixture_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("MEMRA_FIXTURES");
    if (!root || !*root)
        root = "../shared/fixtures";
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

/* A new folder $TMPDIR/memra-TAG-XXXXXX (TMPDIR unset: /tmp), its path in dir. */
static inline void tmpdir_make(char *dir, size_t cap, const char *tag)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, cap, "%s/memra-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

/* Removes dir and everything in it. */
static inline void tmpdir_remove(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Relative L2 error |a - ref| / |ref| in double (the absolute error where
 * ref is all zeros). */
static inline double rel_l2(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Index of the largest value, the first one on ties. */
static inline int argmax_f32(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Runs one suite and returns the process exit status. */
static inline int run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif

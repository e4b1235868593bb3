/* Shared helpers for the Check unit suites. */
#ifndef MR_TESTUTIL_H
#define MR_TESTUTIL_H

#include <check.h>
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

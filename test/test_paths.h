/* test_paths.h: where a test binary finds the files built beside it (stand-in libraries, the
 * CUDA library one level up in a build or bundle directory). */
#ifndef CT_TEST_PATHS_H
#define CT_TEST_PATHS_H

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* out = "<this executable's directory>/<name>". */
static inline void beside_me(const char *name, char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(len > 0);
    exe[len] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(out, n, "%s/%s", exe, name);
}

#endif

/* limits.c: resource limits (limits.h). */
#include "core/util/limits.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

size_t ct_address_space_limit(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
    return (size_t)r.rlim_cur;
}

size_t ct_address_space_in_use(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f) return 0;
    int ok = fscanf(f, "%lu", &pages) == 1;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (size_t)pages * (size_t)page : 0;
}

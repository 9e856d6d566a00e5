/* limits.c: resource limits (limits.h). */
#include "core/util/limits.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <strings.h>
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

int ct_parse_bytes(const char *s, size_t *out, char *why, size_t why_n) {
    static const struct { const char *name; double scale; } units[] = {
        {"B", 1},          {"KB", 1e3},         {"MB", 1e6},         {"GB", 1e9},         {"TB", 1e12},
        {"KiB", 1024.0},   {"MiB", 1048576.0},  {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    *out = 0;
    const char *hint = "expected a size such as 24GiB, 512MiB or 80GB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)";
    if (!s || !*s) {
        snprintf(why, why_n, "empty; %s", hint);
        return -1;
    }
    /* digits and at most one point, parsed by hand: strtod would take "inf", "nan", hex and a
     * leading sign or space, none of which is a size */
    const char *p = s;
    double v = 0, frac = 0.1;
    bool digits = false, point = false;
    for (; (*p >= '0' && *p <= '9') || (*p == '.' && !point); p++) {
        if (*p == '.') {
            point = true;
            continue;
        }
        digits = true;
        if (point) v += (*p - '0') * frac, frac /= 10;
        else v = v * 10 + (*p - '0');
    }
    if (!digits) {
        snprintf(why, why_n, "\"%.64s\" is not a size: %s", s, hint);
        return -1;
    }
    if (!*p) {
        snprintf(why, why_n, "\"%.64s\" has no unit: %s", s, hint);
        return -1;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].name) != 0) continue;
        double bytes = v * units[i].scale;
        if (bytes < 1) {
            snprintf(why, why_n, "\"%.64s\" is less than one byte: %s", s, hint);
            return -1;
        }
        if (bytes > 4611686018427387904.0) {   /* 2^62: no machine has that much */
            snprintf(why, why_n, "\"%.64s\" is too large (at most 4 EiB)", s);
            return -1;
        }
        *out = (size_t)bytes;
        return 0;
    }
    snprintf(why, why_n, "\"%.64s\": unknown unit \"%.16s\"; %s", s, p, hint);
    return -1;
}

size_t ct_host_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    return found ? (size_t)kb * 1024 : 0;
}

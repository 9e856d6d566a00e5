/* bench_common.h: what the C benchmarks share (each is one file built by hand; see its header). */
#ifndef CT_BENCH_COMMON_H
#define CT_BENCH_COMMON_H

#include <stdlib.h>

#include "core/util/rng.h"

/* n uniform floats in [-0.5, 0.5) from stream `stream`, 64-byte aligned (free with free()). */
static inline float *rnd(int64_t n, uint64_t stream) {
    float *x = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
    ct_rng r;
    ct_rng_init(&r, 1, CT_RNG_INIT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = ct_rng_uniform(&r) - 0.5f;
    return x;
}

/* qsort's comparison of doubles (medians of timings). */
static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif

/* cpu_reduce.c: deterministic reductions.
 *
 * A sum is cut into fixed chunks (CT_CPU_CHUNK elements, or a fixed number of rows for losses);
 * each chunk is summed in double on whichever thread gets it, and the chunk results are added in
 * chunk order on the calling thread. The chunking never depends on the thread count, so neither
 * do the bits of the result. */
#include <math.h>
#include <stdlib.h>

#include "core/cpu/cpu_internal.h"

/* Chunks per parallel work item: one chunk is too little work to wake a thread for. */
#define CHUNKS_PER_ITEM 8

typedef struct {
    ct_cpu_chunk_fn fn;
    void *ctx;
    int k;
    double *partial; /* [n_chunks, k] */
} reduce_ctx;

static void reduce_range(void *c, int64_t c0, int64_t c1) {
    reduce_ctx *r = c;
    for (int64_t ch = c0; ch < c1; ch++) r->fn(r->ctx, ch, r->partial + ch * r->k);
}

void ct_cpu_reduce_chunks(ct_cpu_pool *p, int64_t n_chunks, int k, ct_cpu_chunk_fn fn, void *ctx,
                          double *total) {
    for (int j = 0; j < k; j++) total[j] = 0.0;
    if (n_chunks <= 0) return;
    double stack[64];
    size_t need = (size_t)n_chunks * (size_t)k;
    double *partial = need <= 64 ? stack : ct_xmalloc(need * sizeof(double));
    reduce_ctx r = {fn, ctx, k, partial};
    ct_cpu_parallel(p, n_chunks, CHUNKS_PER_ITEM, reduce_range, &r);
    for (int64_t ch = 0; ch < n_chunks; ch++)
        for (int j = 0; j < k; j++) total[j] += partial[ch * k + j];
    if (partial != stack) free(partial);
}

typedef struct {
    const float *x;
    int64_t n;
} vec_ctx;

/* Sums in double over 8 interleaved lanes (lane l takes elements i with i % 8 == l, in order),
 * the lanes added in a fixed order at the end: the same bits on every machine and for any vector
 * width. The lanes are eight scalar locals rather than an array: gcc keeps an accumulator array in
 * memory (a load, add and store per element, ~5 GB/s), while eight independent scalars stay in
 * registers and its SLP vectoriser packs them into SSE2/AVX adds without reordering anything. */
#define LANES 8

/* What each element contributes; constant at every call, so the switch folds away. */
typedef enum { TERM_VALUE, TERM_SQUARE, TERM_SQ_DEV } lane_term;

static inline double term_of(lane_term t, float x, double mean) {
    switch (t) {
    case TERM_VALUE: return x;
    case TERM_SQUARE: return (double)x * x;
    default: return (x - mean) * (x - mean);
    }
}

__attribute__((always_inline)) static inline double lanes_sum(const float *restrict x, int64_t n,
                                                              lane_term t, double mean) {
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const float *p = x + i;
        a0 += term_of(t, p[0], mean);
        a1 += term_of(t, p[1], mean);
        a2 += term_of(t, p[2], mean);
        a3 += term_of(t, p[3], mean);
        a4 += term_of(t, p[4], mean);
        a5 += term_of(t, p[5], mean);
        a6 += term_of(t, p[6], mean);
        a7 += term_of(t, p[7], mean);
    }
    double acc[LANES] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int l = 0; i < n; i++, l++) acc[l] += term_of(t, x[i], mean);
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double ct_cpu_sum(const float *x, int64_t n) { return lanes_sum(x, n, TERM_VALUE, 0.0); }

double ct_cpu_sum_squares(const float *x, int64_t n) { return lanes_sum(x, n, TERM_SQUARE, 0.0); }

double ct_cpu_sum_sq_dev(const float *x, int64_t n, double mean) { return lanes_sum(x, n, TERM_SQ_DEV, mean); }

/* Whether x[0, n) holds only finite values. x * 0 is 0 for finite x and NaN for Inf/NaN, and a
 * NaN survives every later add: a branch-free test, with 8 independent float lanes (as above) so
 * it vectorises. The order of the adds cannot change the verdict. */
static bool all_finite_range(const float *restrict x, int64_t n) {
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const float *p = x + i;
        a0 += p[0] * 0.0f;
        a1 += p[1] * 0.0f;
        a2 += p[2] * 0.0f;
        a3 += p[3] * 0.0f;
        a4 += p[4] * 0.0f;
        a5 += p[5] * 0.0f;
        a6 += p[6] * 0.0f;
        a7 += p[7] * 0.0f;
    }
    for (; i < n; i++) a0 += x[i] * 0.0f;
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) == 0.0f;
}

static void sumsq_chunk(void *c, int64_t chunk, double *out) {
    vec_ctx *v = c;
    int64_t i0, i1;
    ct_cpu_chunk_bounds(chunk, v->n, &i0, &i1);
    out[0] = ct_cpu_sum_squares(v->x + i0, i1 - i0);
}

static void finite_chunk(void *c, int64_t chunk, double *out) {
    vec_ctx *v = c;
    int64_t i0, i1;
    ct_cpu_chunk_bounds(chunk, v->n, &i0, &i1);
    out[0] = all_finite_range(v->x + i0, i1 - i0) ? 0.0 : 1.0;
}

static double cpu_sum_squares(ct_backend *be, const float *x, int64_t n) {
    vec_ctx v = {x, n};
    double total;
    ct_cpu_reduce_chunks(ct_cpu_pool_of(be), ct_cpu_ceil_div(n, CT_CPU_CHUNK), 1, sumsq_chunk, &v, &total);
    return total;
}

static bool cpu_all_finite(ct_backend *be, const float *x, int64_t n) {
    vec_ctx v = {x, n};
    double bad;
    ct_cpu_reduce_chunks(ct_cpu_pool_of(be), ct_cpu_ceil_div(n, CT_CPU_CHUNK), 1, finite_chunk, &v, &bad);
    return bad == 0.0;
}

void ct_cpu_reduce_install(ct_backend *be) {
    be->optim.sum_squares = cpu_sum_squares;
    be->optim.all_finite = cpu_all_finite;
}

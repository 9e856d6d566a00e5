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

/* Sums in double over 8 interleaved lanes, lanes added in a fixed order at the end: the same bits
 * on every machine, and the compiler turns the lane loop into vector adds (one accumulator would
 * be a serial chain it may not reorder). */
#define LANES 8
static double lanes_total(const double *acc) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double ct_cpu_sum(const float *x, int64_t n) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += x[i];
    return lanes_total(acc);
}

double ct_cpu_sum_squares(const float *x, int64_t n) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += (double)x[i + l] * x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i] * x[i];
    return lanes_total(acc);
}

double ct_cpu_sum_sq_dev(const float *x, int64_t n, double mean) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += (x[i + l] - mean) * (x[i + l] - mean);
    for (int l = 0; i < n; i++, l++) acc[l] += (x[i] - mean) * (x[i] - mean);
    return lanes_total(acc);
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
    /* x * 0 is 0 for finite x and NaN for Inf/NaN: a branch-free test the compiler can vectorise */
    float acc = 0.0f;
    for (int64_t i = i0; i < i1; i++) acc += v->x[i] * 0.0f;
    out[0] = acc == 0.0f ? 0.0 : 1.0;
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

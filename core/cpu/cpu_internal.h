/* cpu_internal.h: what the CPU backend's files share (not part of the public op table).
 *
 * Threading: one pool of persistent workers runs every op, GEMM included: OpenBLAS stays at one
 * thread and a large GEMM is cut into fixed tiles computed by pool workers (cpu_gemm.c says why),
 * so there is exactly one set of threads. Work is split into ranges whose boundaries may depend
 * on the thread count, so every op is written so that its result does not: element-wise ops are
 * independent per element, GEMM tiles depend on the shape only, and reductions sum fixed-size
 * chunks (CT_CPU_CHUNK elements, in double) and then the chunk results in chunk order. */
#ifndef CT_CPU_INTERNAL_H
#define CT_CPU_INTERNAL_H

#include <stdint.h>

#include "core/backend.h"

/* The build is -O2, where gcc 12 runs its vectoriser with the "very cheap" cost model: a loop
 * whose trip count is not a known multiple of the vector width stays scalar, which is every loop
 * here. The kernels are written as simple restrict-pointer loops for the vectoriser, so the CPU
 * backend's files ask for the ordinary cost model (measured: docs/BENCHMARKS.md). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

/* Elements per reduction chunk: fixed, so sums have the same bits for any thread count. */
#define CT_CPU_CHUNK 4096
/* Below this many elements an element-wise op is not worth handing to the workers. */
#define CT_CPU_GRAIN 16384

typedef struct ct_cpu_pool ct_cpu_pool;
ct_cpu_pool *ct_cpu_pool_create(int threads); /* NULL when a thread cannot be started */
void ct_cpu_pool_destroy(ct_cpu_pool *p);

/* fn(ctx, begin, end) over a partition of [0, n) into contiguous pieces of at least `grain` items
 * (at most 4 per thread; the whole range on the calling thread when n <= grain), claimed by
 * whichever thread is free. Returns when all pieces are done. Safe to call from several
 * threads and from inside fn: a call that finds the pool busy runs serially. */
typedef void (*ct_cpu_range_fn)(void *ctx, int64_t begin, int64_t end);
void ct_cpu_parallel(ct_cpu_pool *p, int64_t n, int64_t grain, ct_cpu_range_fn fn, void *ctx);

/* Deterministic chunked reduction: fn(ctx, chunk, out) writes k partial values (double) for chunk
 * `chunk` of [0, n_chunks); total[k] = sum over chunks in chunk order. */
typedef void (*ct_cpu_chunk_fn)(void *ctx, int64_t chunk, double *out);
void ct_cpu_reduce_chunks(ct_cpu_pool *p, int64_t n_chunks, int k, ct_cpu_chunk_fn fn, void *ctx,
                          double *total);

/* Sum (of squares) of n floats in double with a fixed summation order (cpu_reduce.c). */
double ct_cpu_sum(const float *x, int64_t n);
double ct_cpu_sum_squares(const float *x, int64_t n);
double ct_cpu_sum_sq_dev(const float *x, int64_t n, double mean); /* sum of (x - mean)^2 */

/* Backend-private state behind ct_backend.impl. */
typedef struct ct_cpu {
    ct_cpu_pool *pool;
    int threads;
} ct_cpu;

static inline ct_cpu_pool *ct_cpu_pool_of(ct_backend *be) { return ((ct_cpu *)be->impl)->pool; }

static inline int64_t ct_cpu_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Elements [*i0, *i1) of reduction chunk `chunk` over n elements. */
static inline void ct_cpu_chunk_bounds(int64_t chunk, int64_t n, int64_t *i0, int64_t *i1) {
    *i0 = chunk * CT_CPU_CHUNK;
    *i1 = *i0 + CT_CPU_CHUNK < n ? *i0 + CT_CPU_CHUNK : n;
}

/* Each file fills its part of the op table. */
void ct_cpu_gemm_install(ct_backend *be);
void ct_cpu_eltwise_install(ct_backend *be);
void ct_cpu_conv_install(ct_backend *be);
void ct_cpu_pool2d_install(ct_backend *be);
void ct_cpu_norm_install(ct_backend *be);
void ct_cpu_loss_install(ct_backend *be);
void ct_cpu_optim_install(ct_backend *be);
void ct_cpu_reduce_install(ct_backend *be);

/* Keeps OpenBLAS at one thread (cpu_gemm.c); called at backend creation. */
void ct_cpu_gemm_init(void);

#endif

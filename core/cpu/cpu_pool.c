/* cpu_pool.c: persistent worker threads for the CPU backend's element-wise and reduction ops.
 *
 * A job is [0, n) cut into pieces; the caller publishes it (generation++ under the mutex, one
 * broadcast) and then claims pieces itself from an atomic counter, as do the workers that wake
 * in time. So the caller never waits for a thread that the OS has not scheduled yet (a shared
 * 2-core machine with loader threads is often oversubscribed): late workers find nothing left.
 * Which thread runs a piece does not matter, because every op writes each output from exactly
 * one piece in a fixed order (see cpu_internal.h). Idle workers sleep on a condition variable,
 * so they never compete with OpenBLAS's threads while a GEMM runs. */
#include "core/cpu/cpu_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/common.h"

/* Pieces per thread: a few more pieces than threads lets the fastest thread take up the slack. */
#define PIECES_PER_THREAD 4

typedef struct {
    ct_cpu_range_fn fn;
    void *ctx;
    int64_t n;
    int64_t pieces;
} job;

struct ct_cpu_pool {
    int nthreads;               /* including the calling thread */
    pthread_t *workers;         /* [nthreads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pthread_mutex_t job_mu;     /* held by the thread that owns the current job */
    uint64_t generation;        /* bumped for every job */
    int active;                 /* workers inside the current job */
    bool stop;
    job cur;                    /* written under mu while active == 0 */
    atomic_llong next_piece;
};

/* Claim and run pieces until none are left. */
static void run_pieces(ct_cpu_pool *p, const job *j) {
    for (;;) {
        long long i = atomic_fetch_add_explicit(&p->next_piece, 1, memory_order_relaxed);
        if (i >= j->pieces) return;
        int64_t begin = j->n * i / j->pieces, end = j->n * (i + 1) / j->pieces;
        if (begin < end) j->fn(j->ctx, begin, end);
    }
}

static void *worker_main(void *arg) {
    ct_cpu_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        job j = p->cur;          /* consistent: the caller cannot publish again while active > 0 */
        p->active++;
        pthread_mutex_unlock(&p->mu);
        run_pieces(p, &j);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ct_cpu_pool *ct_cpu_pool_create(int threads) {
    if (threads < 1) threads = 1;
    ct_cpu_pool *p = ct_xcalloc(1, sizeof *p);
    p->nthreads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->job_mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->next_piece, 0);
    p->workers = ct_xcalloc((size_t)threads, sizeof *p->workers);
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&p->workers[i - 1], NULL, worker_main, p) != 0) {
            p->nthreads = i; /* destroy joins only the workers that started */
            ct_cpu_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void ct_cpu_pool_destroy(ct_cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++) pthread_join(p->workers[i - 1], NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->job_mu);
    free(p->workers);
    free(p);
}

void ct_cpu_parallel(ct_cpu_pool *p, int64_t n, int64_t grain, ct_cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t pieces = ct_cpu_ceil_div(n, grain);
    /* small jobs, a 1-thread pool, or a pool already busy with another caller's job: run here */
    if (!p || pieces <= 1 || p->nthreads <= 1 || pthread_mutex_trylock(&p->job_mu) != 0) {
        fn(ctx, 0, n);
        return;
    }
    if (pieces > (int64_t)p->nthreads * PIECES_PER_THREAD) pieces = (int64_t)p->nthreads * PIECES_PER_THREAD;
    job j = {fn, ctx, n, pieces};
    pthread_mutex_lock(&p->mu);
    /* a worker that woke too late for the previous job may still be inside it (finding nothing
     * to claim); it must leave before the job it copied is replaced */
    while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    p->cur = j;
    atomic_store_explicit(&p->next_piece, 0, memory_order_relaxed);
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    run_pieces(p, &j);

    /* every piece is claimed; wait for the workers still running theirs */
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->job_mu);
}

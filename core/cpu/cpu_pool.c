/* cpu_pool.c: persistent worker threads for the CPU backend's element-wise and reduction ops.
 *
 * The caller runs range 0 itself and workers 1..parts-1 run the others; a job is published by
 * bumping `generation` under the mutex. Workers sleep on a condition variable between jobs so
 * that they never compete with OpenBLAS's threads for the cores while a GEMM runs. */
#include "core/cpu/cpu_internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/common.h"

struct ct_cpu_pool {
    int nthreads;               /* including the calling thread */
    pthread_t *workers;         /* [nthreads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pthread_mutex_t job_mu;     /* held by the thread that owns the current job */
    uint64_t generation;
    int pending;                /* workers still running the current job */
    bool stop;
    /* the current job */
    ct_cpu_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
};

typedef struct {
    ct_cpu_pool *pool;
    int index;
} worker_arg;

static void run_part(ct_cpu_pool *p, int part) {
    int64_t begin = p->n * part / p->parts, end = p->n * (part + 1) / p->parts;
    if (begin < end) p->fn(p->ctx, begin, end);
}

static void *worker_main(void *argp) {
    worker_arg *arg = argp;
    ct_cpu_pool *p = arg->pool;
    int index = arg->index;
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        bool mine = index < p->parts;
        pthread_mutex_unlock(&p->mu);
        if (mine) run_part(p, index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
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
    p->workers = ct_xcalloc((size_t)threads, sizeof *p->workers);
    for (int i = 1; i < threads; i++) {
        worker_arg *arg = ct_xmalloc(sizeof *arg);
        arg->pool = p;
        arg->index = i;
        if (pthread_create(&p->workers[i - 1], NULL, worker_main, arg) != 0) {
            free(arg);
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
    int64_t parts = ct_cpu_ceil_div(n, grain);
    if (!p || parts <= 1 || p->nthreads <= 1 || pthread_mutex_trylock(&p->job_mu) != 0) {
        fn(ctx, 0, n);
        return;
    }
    if (parts > p->nthreads) parts = p->nthreads;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->parts = (int)parts;
    p->pending = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    run_part(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->job_mu);
}

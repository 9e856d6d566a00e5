/* cpu_threads.c: persistent worker threads for the CPU backend's ops.
 *
 * A job is [0, n) cut into pieces; the caller publishes it (generation++) and then claims pieces
 * itself from an atomic counter, as do the workers that wake in time. So the caller never waits
 * for a thread that the OS has not scheduled yet (a shared 2-core machine with loader threads is
 * often oversubscribed): late workers find nothing left. Which thread runs a piece does not
 * matter, because every op writes each output from exactly one piece in a fixed order (see
 * cpu_internal.h).
 *
 * Between jobs a worker spins for SPIN_NS, then sleeps on a condition variable; the caller
 * likewise spins briefly before sleeping while it waits for the last pieces. A training step is a
 * chain of short ops: waking a sleeping thread costs tens of microseconds on a VM, as much as a
 * small GEMM tile. The spin is short, so an idle backend burns no CPU (OpenBLAS's workers spin
 * ~150 ms after each call, see docs/BENCHMARKS.md). */
#include "core/cpu/cpu_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "core/util/common.h"

/* Pieces per thread: a few more pieces than threads lets the fastest thread take up the slack. */
#define PIECES_PER_THREAD 4
/* How long an idle worker (and a waiting caller) polls before sleeping: ops within a training
 * step follow each other within microseconds; longer gaps are serial work that polling wastes. */
#define SPIN_NS 50000

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
    atomic_ullong generation;   /* bumped (under mu) for every job */
    atomic_int active;          /* workers inside the current job; enter under mu */
    int sleepers;               /* workers blocked on work_cv (under mu) */
    atomic_bool stop;
    job cur;                    /* written under mu while active == 0 */
    atomic_llong next_piece;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Poll until cond(p, arg) holds or SPIN_NS pass; true when it holds. */
static bool spin_until(bool (*cond)(ct_cpu_pool *, uint64_t), ct_cpu_pool *p, uint64_t arg) {
    int64_t deadline = 0;
    for (int i = 0;; i++) {
        if (cond(p, arg)) return true;
        if ((i & 63) == 0) {
            int64_t t = now_ns();
            if (deadline == 0)
                deadline = t + SPIN_NS;
            else if (t > deadline)
                return false;
        }
        cpu_relax();
    }
}

static bool has_new_job(ct_cpu_pool *p, uint64_t seen) {
    return atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
           atomic_load_explicit(&p->stop, memory_order_relaxed);
}

static bool all_idle(ct_cpu_pool *p, uint64_t unused) {
    (void)unused;
    return atomic_load_explicit(&p->active, memory_order_acquire) == 0;
}

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
    for (;;) {
        spin_until(has_new_job, p, seen);
        pthread_mutex_lock(&p->mu);
        while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen) {
            p->sleepers++;
            pthread_cond_wait(&p->work_cv, &p->mu);
            p->sleepers--;
        }
        if (atomic_load(&p->stop)) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = atomic_load(&p->generation);
        job j = p->cur;          /* consistent: the caller cannot publish again while active > 0 */
        atomic_fetch_add(&p->active, 1);
        pthread_mutex_unlock(&p->mu);

        run_pieces(p, &j);

        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); /* the caller checks active under mu before it sleeps */
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

ct_cpu_pool *ct_cpu_pool_create(int threads) {
    if (threads < 1) threads = 1;
    ct_cpu_pool *p = ct_xcalloc(1, sizeof *p);
    p->nthreads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->job_mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->next_piece, 0);
    p->workers = ct_xcalloc((size_t)threads, sizeof *p->workers);
    for (int i = 1; i < threads; i++) {
        int e = pthread_create(&p->workers[i - 1], NULL, worker_main, p);
        if (e != 0) {
            p->nthreads = i; /* destroy joins only the workers that started */
            ct_cpu_pool_destroy(p);
            errno = e;       /* pthread_create returns its reason instead of setting errno */
            return NULL;
        }
    }
    return p;
}

void ct_cpu_pool_destroy(ct_cpu_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
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

/* Wait (spin, then sleep) until no worker is inside the current job. */
static void wait_idle(ct_cpu_pool *p) {
    if (spin_until(all_idle, p, 0)) return;
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->active) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
    /* a worker that came too late for the previous job may still be inside it (finding nothing
     * to claim); it must leave before the job it copied is replaced */
    wait_idle(p);
    pthread_mutex_lock(&p->mu);
    /* workers enter under mu, so this check and the publication below cannot be split by one */
    while (atomic_load(&p->active) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    p->cur = j;
    atomic_store_explicit(&p->next_piece, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (p->sleepers > 0) pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    run_pieces(p, &j);

    /* every piece is claimed; wait for the workers still running theirs */
    wait_idle(p);
    pthread_mutex_unlock(&p->job_mu);
}

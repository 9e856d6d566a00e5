/* watchdog.h: what the communicators' watchdog threads share (comm_mpi.c, cuda/cuda_comm_nccl.cu):
 * a nap between looks, and the end of a rank whose collective waited past CTRAIN_COMM_TIMEOUT.
 * Inline: both libraries compile it in, neither calls into ctrain for it. */
#ifndef CT_DIST_WATCHDOG_H
#define CT_DIST_WATCHDOG_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "core/util/common.h"

/* A watchdog's thread: the lock its state is under, the condition that wakes it early (to stop),
 * and whether it runs. */
typedef struct ct_watchdog_thread {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    bool stop;                   /* asked to end */
    bool running;                /* started (a failed pthread_create leaves the rank unwatched) */
} ct_watchdog_thread;

static inline void ct_watchdog_start(ct_watchdog_thread *t, void *(*fn)(void *), void *arg) {
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    t->running = pthread_create(&t->thread, NULL, fn, arg) == 0;
}

static inline void ct_watchdog_stop(ct_watchdog_thread *t) {
    if (!t->running) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    t->running = false;
}

/* Half a second on t's condition (its lock held; ct_watchdog_stop ends it early). */
static inline void ct_watchdog_nap(ct_watchdog_thread *t) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 500000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&t->wake, &t->mu, &until);
}

/* Ends this rank: `lib` ("MPI", "NCCL") `what` has waited `waited` seconds, past timeout_s. A
 * blocking call cannot be interrupted, so the process exits itself, without finalising (the
 * launcher ends the others, or their own watchdogs do). */
static inline void ct_watchdog_expire(const char *lib, const char *what, int rank, int world, double waited,
                                      int timeout_s) {
    fprintf(stderr, "ctrain: error: rank %d of %d: %s %s has waited %.0f s for the other ranks "
            "(CTRAIN_COMM_TIMEOUT=%d): a rank stopped answering or fell that far behind; ending the job.\n"
            "  Raise CTRAIN_COMM_TIMEOUT (seconds; 0: no limit) if a rank legitimately takes longer between "
            "collectives (a large checkpoint save on rank 0)\n", rank, world, lib, what, waited, timeout_s);
    fflush(stderr);
    _exit(CT_ERR_RUNTIME);
}

#endif

/* watchdog.h: what the communicators' watchdog threads share (comm_mpi.c, cuda/cuda_comm_nccl.cu):
 * a nap between looks, and the end of a rank whose collective waited past CTRAIN_COMM_TIMEOUT.
 * Inline: both libraries compile it in, neither calls into ctrain for it. */
#ifndef CT_DIST_WATCHDOG_H
#define CT_DIST_WATCHDOG_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "core/util/common.h"

/* Seconds a stop signal waits to be acted on when CTRAIN_COMM_TIMEOUT is 0 (waits unbounded): the
 * default timeout. */
#define CT_WATCHDOG_STOP_GRACE 60

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

/* The CLI's stop flag as a watchdog follows it (ct_launch.stop_signal): which signal, and when the
 * watchdog first saw it (ct_now seconds). */
typedef struct ct_stop_follow {
    volatile int *flag;          /* NULL: nobody stops this process by signal (a test, a library caller) */
    int sig;                     /* 0 until seen */
    double seen;
} ct_stop_follow;

/* One look at the flag (with the watchdog's lock held): the stop's age for ct_watchdog_due, given
 * when the call in progress began (call_since, ct_now seconds): -1 when there is no stop or the call
 * began after it was seen. */
static inline double ct_watchdog_stop_age(ct_stop_follow *s, double now, double call_since) {
    if (!s->sig && s->flag && *s->flag > 0) {
        s->sig = *s->flag;
        s->seen = now;
    }
    return s->sig && call_since <= s->seen ? now - s->seen : -1;
}

/* What a watchdog decides on one look. waited: seconds the call in progress has waited (< 0: no
 * call in progress). stop_age: seconds since this rank was asked to stop (SIGINT, SIGTERM, SIGHUP:
 * the CLI's stop flag), counted only when the call in progress began before that (< 0: no stop, or
 * the call began after it: the loop is moving, and the stop will be agreed at the end of the step).
 *  - a call past the timeout ends the rank (timeout 0: never);
 *  - a stop that came while the rank was already waiting, and is still not acted on after the
 *    timeout (60 s when the timeout is 0, which bounds waits only), ends the rank too: a rank stuck
 *    in a wait can neither stop after the step nor save, and must not ignore the signal. */
static inline bool ct_watchdog_due(int timeout_s, double waited, double stop_age) {
    if (waited < 0) return false;
    if (timeout_s > 0 && waited >= timeout_s) return true;
    int grace = timeout_s > 0 ? timeout_s : CT_WATCHDOG_STOP_GRACE;
    return stop_age >= 0 && stop_age >= grace;
}

/* Ends this rank: `lib` ("MPI", "NCCL") `what` has waited `waited` seconds, past timeout_s, or a
 * stop signal stop_sig (0: none) that came stop_ago seconds ago could not be acted on. A blocking
 * call cannot be interrupted, so the process exits itself, without finalising (the launcher ends the
 * others, or their own watchdogs do): exit 1, or 128 + the signal when one asked the rank to stop.
 * stuck: the call was already waiting when the stop came (the loop never got to act on it); else
 * the stop was acted on and this is a call on the way out (a save on rank 0 longer than the
 * timeout, say), which only the exit status tells. */
static inline void ct_watchdog_expire(const char *lib, const char *what, int rank, int world, double waited,
                                      int timeout_s, int stop_sig, double stop_ago, bool stuck) {
    const char *name = stop_sig == SIGINT    ? "SIGINT"
                       : stop_sig == SIGTERM ? "SIGTERM"
                       : stop_sig == SIGHUP  ? "SIGHUP"
                                             : "a stop signal";
    if (stop_sig > 0 && stuck) {
        fprintf(stderr, "ctrain: error: rank %d of %d: %s came %.0f s ago, and %s %s has waited %.0f s for the "
                "other ranks (CTRAIN_COMM_TIMEOUT=%d): the ranks cannot agree on a step to stop after, so this rank "
                "ends now without saving (exit %d)\n", rank, world, name, stop_ago, lib, what, waited, timeout_s,
                128 + stop_sig);
        fflush(stderr);
        _exit(128 + stop_sig);
    }
    fprintf(stderr, "ctrain: error: rank %d of %d: %s %s has waited %.0f s for the other ranks "
            "(CTRAIN_COMM_TIMEOUT=%d): a rank stopped answering or fell that far behind; ending the job.\n"
            "  Raise CTRAIN_COMM_TIMEOUT (seconds; 0: no limit) if a rank legitimately takes longer between "
            "collectives (a large checkpoint save on rank 0)\n", rank, world, lib, what, waited, timeout_s);
    if (stop_sig > 0) fprintf(stderr, "  (%s came %.0f s ago: exit %d)\n", name, stop_ago, 128 + stop_sig);
    fflush(stderr);
    _exit(stop_sig > 0 ? 128 + stop_sig : CT_ERR_RUNTIME);
}

#endif

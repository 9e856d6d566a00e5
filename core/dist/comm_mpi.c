/* comm_mpi.c: the communicator over MPI on host buffers (comm.h), for the CPU backend.
 *
 * Built into build/libctrain_mpi.so with mpicc (the Makefile), not into libctrain.a: ctrain loads
 * it with dlopen only when mpirun started the process (comm_open.c), so a plain run never maps
 * libmpi. It calls ct_errf and ct_xcalloc of the executable (exported with -rdynamic).
 *
 * Errors return instead of aborting (MPI_ERRORS_RETURN), so the message names the collective;
 * counts above INT_MAX are sent in pieces where the collective allows it (all-reduce, broadcast)
 * and refused where it does not (the scatter and gather of one rank's part).
 *
 * A rank that stops answering (stopped, deadlocked, far behind) would leave the others in a
 * collective forever: a watchdog thread ends this rank when one collective has waited longer than
 * the timeout (CTRAIN_COMM_TIMEOUT, launch.h), and mpirun then ends the job. MPI cannot interrupt a
 * blocking call, so the watchdog exits the process itself, without MPI_Finalize. */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/dist/comm.h"
#include "core/dist/launch.h"
#include "core/dist/rendezvous.h"
#include "core/dist/watchdog.h"

/* The MPI type of a dtype; 16-bit floats only move (gather, broadcast), MPI cannot add them. */
static MPI_Datatype mpi_type(ct_dtype dt, bool reduce) {
    switch (dt) {
    case CT_F32: return MPI_FLOAT;
    case CT_I32: return MPI_INT32_T;
    case CT_F16:
    case CT_BF16: return reduce ? MPI_DATATYPE_NULL : MPI_UINT16_T;
    default: return ct_dtype_size(dt) == 1 && !reduce ? MPI_UINT8_T : MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(ct_reduce_op op) { return op == CT_REDUCE_MAX ? MPI_MAX : MPI_SUM; }

static int failed(ct_comm *c, const char *what, int code, ct_err *err) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, text, &len);
    return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: MPI %s failed: %s", c->rank, c->world, what, text);
}

/* Named here, not with ct_dtype_name: the library uses only the few symbols of the executable that
 * every program linking libctrain.a's communicator has (ct_errf, the allocation helpers). */
static int no_type(ct_comm *c, const char *what, ct_dtype dt, ct_err *err) {
    const char *name = dt == CT_F16 ? "fp16" : dt == CT_BF16 ? "bf16" : "these";
    return ct_errf(err, CT_ERR_RUNTIME, "rank %d: MPI %s of %s values is not supported (reductions are "
                   "over fp32 and int32)", c->rank, what, name);
}

static int too_many(ct_comm *c, const char *what, int64_t n, ct_err *err) {
    return ct_errf(err, CT_ERR_RUNTIME, "rank %d: MPI %s of %lld elements per rank: more than MPI's "
                   "int count holds", c->rank, what, (long long)n);
}

/* ---- the watchdog ---- */

typedef struct watchdog {
    ct_watchdog_thread t;
    int timeout_s;               /* 0: calls are not bounded (a stop signal still is) */
    int rank, world;
    const char *what;            /* the call in progress, NULL between calls */
    double since;                /* ct_now(): when it began */
    double slack;                /* seconds past the timeout before the watchdog acts: a polled wait
                                    (req_wait) reports its own timeout first, as an error */
    ct_stop_follow stop;         /* the CLI's stop flag */
} watchdog;

/* Wakes twice a second; a call past the timeout, or a stop signal the rank cannot act on, ends the
 * process (mpirun ends the rest). */
static void *watch(void *arg) {
    watchdog *w = arg;
    pthread_mutex_lock(&w->t.mu);
    while (!w->t.stop) {
        ct_watchdog_nap(&w->t);
        if (w->t.stop) break;
        double now = ct_now(), waited = w->what ? now - w->since - w->slack : -1;
        double stop_age = ct_watchdog_stop_age(&w->stop, now, w->since);
        if (ct_watchdog_due(w->timeout_s, waited, stop_age))
            ct_watchdog_expire("MPI", w->what, w->rank, w->world, now - w->since, w->timeout_s, w->stop.sig,
                               now - w->stop.seen, stop_age >= 0);
    }
    pthread_mutex_unlock(&w->t.mu);
    return NULL;
}

typedef struct mpi_impl {
    MPI_Comm comm;               /* the ranks: MPI_COMM_WORLD under mpirun; joined singletons under a
                                    torchrun-style launch (join_ranks) */
    void *scratch;               /* reduce_scatter_shards: this rank's part before it is copied in */
    size_t scratch_bytes;
    watchdog dog;
    ct_rdzv rdzv;                /* torchrun-style launch: the bootstrap sockets and ompi-server */
} mpi_impl;

/* The communicator every collective runs on, and its watchdog. */
#define COMM(c) (((mpi_impl *)(c)->impl)->comm)
#define DOG(c) (&((mpi_impl *)(c)->impl)->dog)

/* Around every MPI call that can wait for another rank: what is in progress (NULL once it
 * returned), with `slack` seconds of grace past the timeout. */
static void watch_mark_slack(watchdog *w, const char *what, double slack) {
    if (!w->t.running) return;
    pthread_mutex_lock(&w->t.mu);
    w->what = what;
    w->slack = slack;
    if (what) w->since = ct_now();
    pthread_mutex_unlock(&w->t.mu);
}

static int watched_rc(watchdog *w, int rc) {
    watch_mark_slack(w, NULL, 0);
    return rc;
}

/* The status of an MPI call made under watchdog w (the comma orders the mark before the call). */
#define WATCHED(w, what, call) (watch_mark_slack((w), (what), 0), watched_rc((w), (call)))

static int all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err) {
    MPI_Datatype t = mpi_type(dt, true);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "all-reduce", dt, err);
    for (int64_t at = 0; at < n; at += INT_MAX) {
        int k = (int)(n - at < INT_MAX ? n - at : INT_MAX);
        int rc = WATCHED(DOG(c), "all-reduce",
                         MPI_Allreduce(MPI_IN_PLACE, ct_elem(buf, at, dt), k, t, mpi_op(op), COMM(c)));
        if (rc != MPI_SUCCESS) return failed(c, "all-reduce", rc, err);
    }
    return CT_OK;
}

static int reduce_scatter(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                          ct_reduce_op op, ct_err *err) {
    MPI_Datatype t = mpi_type(dt, true);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "reduce-scatter", dt, err);
    if (n_per_rank > INT_MAX) return too_many(c, "reduce-scatter", n_per_rank, err);
    /* MPI's in-place form takes the whole buffer and leaves the result in the rank's first part,
     * which is not this table's layout: a source that is dst goes through MPI's own copy. */
    int rc = WATCHED(DOG(c), "reduce-scatter",
                     MPI_Reduce_scatter_block(src, dst, (int)n_per_rank, t, mpi_op(op), COMM(c)));
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "reduce-scatter", rc, err);
}

static int all_gather(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                      ct_err *err) {
    MPI_Datatype t = mpi_type(dt, false);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "all-gather", dt, err);
    if (n_per_rank > INT_MAX) return too_many(c, "all-gather", n_per_rank, err);
    bool in_place = src == ct_elem(dst, (int64_t)c->rank * n_per_rank, dt);
    int rc = WATCHED(DOG(c), "all-gather", MPI_Allgather(in_place ? MPI_IN_PLACE : src, (int)n_per_rank, t, dst,
                                                    (int)n_per_rank, t, COMM(c)));
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "all-gather", rc, err);
}

static int broadcast(ct_comm *c, void *buf, int64_t n, ct_dtype dt, int root, ct_err *err) {
    if (root < 0 || root >= c->world)
        return ct_errf(err, CT_ERR_RUNTIME, "broadcast from rank %d of a %d-rank communicator", root, c->world);
    MPI_Datatype t = mpi_type(dt, false);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "broadcast", dt, err);
    for (int64_t at = 0; at < n; at += INT_MAX) {
        int k = (int)(n - at < INT_MAX ? n - at : INT_MAX);
        int rc = WATCHED(DOG(c), "broadcast", MPI_Bcast(ct_elem(buf, at, dt), k, t, root, COMM(c)));
        if (rc != MPI_SUCCESS) return failed(c, "broadcast", rc, err);
    }
    return CT_OK;
}

/* The partition's counts and offsets as MPI takes them; false when a part is past INT_MAX. */
static bool shard_counts(ct_comm *c, int64_t n, int *counts, int *displs) {
    for (int r = 0; r < c->world; r++) {
        int64_t lo, hi;
        ct_comm_shard(n, c->world, r, &lo, &hi);
        if (hi > INT_MAX) return false;
        counts[r] = (int)(hi - lo);
        displs[r] = (int)lo;
    }
    return true;
}

static int reduce_scatter_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op,
                                 ct_err *err) {
    MPI_Datatype t = mpi_type(dt, true);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "reduce-scatter", dt, err);
    int *counts = ct_xcalloc((size_t)c->world * 2, sizeof *counts), *displs = counts + c->world;
    int rc = MPI_SUCCESS;
    if (!shard_counts(c, n, counts, displs)) {
        free(counts);
        return too_many(c, "reduce-scatter", n, err);
    }
    mpi_impl *m = c->impl;
    size_t mine = ct_nbytes(counts[c->rank], dt);
    if (mine > m->scratch_bytes) {
        free(m->scratch);
        m->scratch = ct_xmalloc(mine);
        m->scratch_bytes = mine;
    }
    /* MPI's in-place form leaves the result at the buffer's start, not at the rank's offset */
    rc = WATCHED(DOG(c), "reduce-scatter",
                 MPI_Reduce_scatter(buf, m->scratch, counts, t, mpi_op(op), COMM(c)));
    if (rc == MPI_SUCCESS && mine) memcpy(ct_elem(buf, displs[c->rank], dt), m->scratch, mine);
    free(counts);
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "reduce-scatter", rc, err);
}

static int all_gather_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_err *err) {
    MPI_Datatype t = mpi_type(dt, false);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "all-gather", dt, err);
    int *counts = ct_xcalloc((size_t)c->world * 2, sizeof *counts), *displs = counts + c->world;
    if (!shard_counts(c, n, counts, displs)) {
        free(counts);
        return too_many(c, "all-gather", n, err);
    }
    int rc = WATCHED(DOG(c), "all-gather",
                     MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, t, COMM(c)));
    free(counts);
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "all-gather", rc, err);
}

/* Each rank's share of [a, b) as counts and offsets from a; false when one is past INT_MAX. */
static bool range_counts(ct_comm *c, int64_t n, int64_t a, int64_t b, int *counts, int *displs) {
    if (b - a > INT_MAX) return false;
    for (int r = 0; r < c->world; r++) {
        int64_t lo, hi;
        ct_comm_shard_range(n, c->world, r, a, b, &lo, &hi);
        counts[r] = (int)(hi - lo);
        displs[r] = (int)(lo - a);
    }
    return true;
}

static int all_gather_range(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b,
                            ct_dtype dt, ct_err *err) {
    MPI_Datatype t = mpi_type(dt, false);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "all-gather", dt, err);
    int *counts = ct_xcalloc((size_t)c->world * 2, sizeof *counts), *displs = counts + c->world;
    if (!range_counts(c, n, a, b, counts, displs)) {
        free(counts);
        return too_many(c, "all-gather", b - a, err);
    }
    int64_t plo, phi, lo, hi;
    ct_comm_shard(n, c->world, c->rank, &plo, &phi);
    ct_comm_shard_range(n, c->world, c->rank, a, b, &lo, &hi);
    /* a part that is already in dst's place (the whole compute copy gathered in buckets) is sent
     * from there: MPI wants that said, not two aliased buffers */
    const void *mine = ct_celem(part, lo - plo, dt);
    if (mine == ct_elem(dst, lo - a, dt)) mine = MPI_IN_PLACE;
    int rc = WATCHED(DOG(c), "all-gather", MPI_Allgatherv(mine, counts[c->rank], t, dst, counts, displs, t,
                                                     COMM(c)));
    free(counts);
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "all-gather", rc, err);
}

static int reduce_scatter_range(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                ct_dtype dt, ct_err *err) {
    MPI_Datatype t = mpi_type(dt, true);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "reduce-scatter", dt, err);
    int *counts = ct_xcalloc((size_t)c->world * 2, sizeof *counts), *displs = counts + c->world;
    if (!range_counts(c, n, a, b, counts, displs)) {
        free(counts);
        return too_many(c, "reduce-scatter", b - a, err);
    }
    /* the parts are in rank order, so [a, b) is the ranks' shares back to back, as MPI wants */
    int rc = WATCHED(DOG(c), "reduce-scatter", MPI_Reduce_scatter(src, dst, counts, t, MPI_SUM, COMM(c)));
    free(counts);
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "reduce-scatter", rc, err);
}

static int all_reduce_host(ct_comm *c, double *vals, int n, ct_reduce_op op, ct_err *err) {
    int rc = WATCHED(DOG(c), "all-reduce of host values",
                     MPI_Allreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, mpi_op(op), COMM(c)));
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "all-reduce of host values", rc, err);
}

static int barrier(ct_comm *c, ct_err *err) {
    int rc = WATCHED(DOG(c), "barrier", MPI_Barrier(COMM(c)));
    return rc == MPI_SUCCESS ? CT_OK : failed(c, "barrier", rc, err);
}

/* ---- the non-blocking forms ---- */

/* A collective in flight: its MPI requests (an all-reduce past INT_MAX elements is several) and the
 * counts and offsets MPI reads until it completes. */
struct ct_comm_req {
    const char *what;
    int n;
    MPI_Request *reqs;           /* [n] */
    int *counts;                 /* [2 * world] or NULL: counts, then offsets */
};

static ct_comm_req *req_new(const char *what, int n, int world) {
    ct_comm_req *q = ct_xcalloc(1, sizeof *q);
    q->what = what;
    q->n = n;
    q->reqs = ct_xcalloc((size_t)(n > 0 ? n : 1), sizeof *q->reqs);
    for (int i = 0; i < n; i++) q->reqs[i] = MPI_REQUEST_NULL;
    if (world > 0) q->counts = ct_xcalloc((size_t)world * 2, sizeof *q->counts);
    return q;
}

static void req_free(ct_comm_req *q) {
    if (!q) return;
    free(q->reqs);
    free(q->counts);
    free(q);
}

/* A start that failed: the parts already started are waited for (MPI wants every request
 * completed), then the error. */
static int start_failed(ct_comm *c, ct_comm_req *q, int code, ct_err *err) {
    (void)WATCHED(DOG(c), q->what, MPI_Waitall(q->n, q->reqs, MPI_STATUSES_IGNORE));
    int rc = failed(c, q->what, code, err);
    req_free(q);
    return rc;
}

static int start_all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_comm_req **req,
                            ct_err *err) {
    *req = NULL;
    MPI_Datatype t = mpi_type(dt, true);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "all-reduce", dt, err);
    int pieces = (int)((n + INT_MAX - 1) / INT_MAX);
    ct_comm_req *q = req_new("all-reduce (non-blocking)", pieces, 0);
    for (int i = 0; i < pieces; i++) {
        int64_t at = (int64_t)i * INT_MAX;
        int k = (int)(n - at < INT_MAX ? n - at : INT_MAX);
        int rc = WATCHED(DOG(c), q->what, MPI_Iallreduce(MPI_IN_PLACE, ct_elem(buf, at, dt), k, t, mpi_op(op),
                                                         COMM(c), &q->reqs[i]));
        if (rc != MPI_SUCCESS) return start_failed(c, q, rc, err);
    }
    *req = q;
    return CT_OK;
}

static int start_reduce_scatter_range(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                      ct_dtype dt, ct_comm_req **req, ct_err *err) {
    *req = NULL;
    MPI_Datatype t = mpi_type(dt, true);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "reduce-scatter", dt, err);
    ct_comm_req *q = req_new("reduce-scatter (non-blocking)", 1, c->world);
    int *counts = q->counts, *displs = counts + c->world;
    if (!range_counts(c, n, a, b, counts, displs)) {
        req_free(q);
        return too_many(c, "reduce-scatter", b - a, err);
    }
    int rc = WATCHED(DOG(c), q->what, MPI_Ireduce_scatter(src, dst, counts, t, MPI_SUM, COMM(c), &q->reqs[0]));
    if (rc != MPI_SUCCESS) return start_failed(c, q, rc, err);
    *req = q;
    return CT_OK;
}

static int start_all_gather_range(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b,
                                  ct_dtype dt, ct_comm_req **req, ct_err *err) {
    *req = NULL;
    MPI_Datatype t = mpi_type(dt, false);
    if (t == MPI_DATATYPE_NULL) return no_type(c, "all-gather", dt, err);
    ct_comm_req *q = req_new("all-gather (non-blocking)", 1, c->world);
    int *counts = q->counts, *displs = counts + c->world;
    if (!range_counts(c, n, a, b, counts, displs)) {
        req_free(q);
        return too_many(c, "all-gather", b - a, err);
    }
    int64_t plo, phi, lo, hi;
    ct_comm_shard(n, c->world, c->rank, &plo, &phi);
    ct_comm_shard_range(n, c->world, c->rank, a, b, &lo, &hi);
    int rc = WATCHED(DOG(c), q->what, MPI_Iallgatherv(ct_celem(part, lo - plo, dt), counts[c->rank], t, dst, counts,
                                                      displs, t, COMM(c), &q->reqs[0]));
    if (rc != MPI_SUCCESS) return start_failed(c, q, rc, err);
    *req = q;
    return CT_OK;
}

static int req_test(ct_comm *c, ct_comm_req *q, bool *done, ct_err *err) {
    *done = true;
    if (!q) return CT_OK;
    int flag = 0, rc = WATCHED(DOG(c), q->what, MPI_Testall(q->n, q->reqs, &flag, MPI_STATUSES_IGNORE));
    if (rc != MPI_SUCCESS) return failed(c, q->what, rc, err);
    *done = flag != 0;
    return CT_OK;
}

/* Seconds past the timeout the watchdog gives a polled wait, which reports the timeout itself. */
#define WAIT_SLACK_S 2.0
/* ... and MPI_Init, whose wait includes the ranks' start-up skew (ct_comm_mpi_create). */
#define INIT_SLACK_S 30.0

/* Polls the request instead of MPI_Wait, so that this wait, not the watchdog, sees the timeout and
 * the error names the collective (the rank then ends as on any error: without MPI_Finalize, and
 * mpirun ends the others). The watchdog still watches the whole wait, a little longer: one
 * MPI_Testall can itself hang inside OpenMPI once a peer has died (seen under a torchrun-style
 * launch), and then only the watchdog ends the rank. A request abandoned on a timeout is not freed:
 * MPI may still write. */
static int req_wait(ct_comm *c, ct_comm_req *q, ct_err *err) {
    if (!q) return CT_OK;
    watchdog *w = DOG(c);
    double since = ct_now();
    watch_mark_slack(w, q->what, WAIT_SLACK_S);
    for (;;) {
        int flag = 0, rc = MPI_Testall(q->n, q->reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            watch_mark_slack(w, NULL, 0);
            rc = failed(c, q->what, rc, err);
            req_free(q);
            return rc;
        }
        if (flag) break;
        double waited = ct_now() - since;
        if (w->timeout_s > 0 && waited >= w->timeout_s) {
            watch_mark_slack(w, NULL, 0);
            return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: MPI %s has waited %.0f s for the other ranks "
                           "(CTRAIN_COMM_TIMEOUT=%d): a rank stopped answering or fell that far behind; ending "
                           "the job.\n  Raise CTRAIN_COMM_TIMEOUT (seconds; 0: no limit) if a rank legitimately "
                           "takes longer between collectives (a large checkpoint save on rank 0)", c->rank,
                           c->world, q->what, waited, w->timeout_s);
        }
        sched_yield();   /* oversubscribed ranks (more than cores) get the core while this one waits */
    }
    watch_mark_slack(w, NULL, 0);
    req_free(q);
    return CT_OK;
}

/* A rank that failed leaves without MPI_Finalize: the others may be waiting in a collective it
 * will never join, and MPI_Finalize would wait for them; mpirun ends the job when a rank exits
 * without it (under a torchrun-style launch, torchrun does, or the others' watchdogs). */
static void destroy(ct_comm *c) {
    mpi_impl *m = c->impl;
    watchdog *w = &m->dog;
    /* still under the watchdog: a rank that ended on an error never comes to the barrier, and no
     * mpirun ends the others of a torchrun-style launch */
    if (!c->failed) {
        if (m->comm != MPI_COMM_WORLD && m->comm != MPI_COMM_NULL) {
            /* every rank is done with the joined communicator before rank 0 stops the server */
            (void)WATCHED(w, "barrier at the end", MPI_Barrier(m->comm));
            (void)WATCHED(w, "freeing the joined communicator", MPI_Comm_free(&m->comm));
        }
        (void)WATCHED(w, "finalize", MPI_Finalize());
    }
    ct_watchdog_stop(&w->t);
    ct_rdzv_close(&m->rdzv);
    free(m->scratch);
    free(m);
    free(c);
}

__attribute__((visibility("default"))) int ct_comm_mpi_abi(size_t *table_bytes) {
    *table_bytes = sizeof(ct_comm);
    return CT_COMM_ABI;
}

/* The watchdog of launch l's rank, from before MPI_Init to after MPI_Finalize: it runs when calls are
 * bounded (CTRAIN_COMM_TIMEOUT > 0) or a stop signal must be able to end a rank stuck in one. */
static void start_watchdog(watchdog *w, const ct_launch *l) {
    *w = (watchdog){.timeout_s = l->comm_timeout_s, .rank = l->rank, .world = l->world,
                    .stop = {.flag = l->stop_signal}};
    if (w->timeout_s > 0 || w->stop.flag) ct_watchdog_start(&w->t, watch, w);
}

/* Under a torchrun-style launch: the singletons' rendezvous. Before MPI_Init, rank 0 starts
 * ompi-server and tells every rank its address over the bootstrap sockets (rendezvous.h). */
static int meet_before_init(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    int rc = ct_rdzv_open(r, l, err);
    char uri[CT_RDZV_LINE_MAX];
    if (!rc && l->rank == 0) rc = ct_rdzv_start_server(r, uri, err);
    if (!rc) rc = ct_rdzv_share(r, uri, err);
    /* read by the MPI_Init that follows: connect and accept go through this server */
    if (!rc && setenv("OMPI_MCA_pmix_server_uri", uri, 1) != 0)
        rc = ct_errf(err, CT_ERR_RUNTIME, "rank %d: setenv: out of memory", l->rank);
    return rc;
}

/* One join of the ranks: connect to the port (the joining rank) or accept on it (the ranks joined so
 * far), then merge the two sides, the joined ones first; *joined becomes the merged communicator.
 * Every call in it waits for the other side, so the caller runs it under the watchdog. */
static int join_one(const char *port, bool accept, MPI_Comm *joined) {
    MPI_Comm inter, merged;
    int rc = accept ? MPI_Comm_accept(port, MPI_INFO_NULL, 0, *joined, &inter)
                    : MPI_Comm_connect(port, MPI_INFO_NULL, 0, *joined, &inter);
    if (rc == MPI_SUCCESS) rc = MPI_Intercomm_merge(inter, accept ? 0 : 1, &merged);
    if (rc != MPI_SUCCESS) return rc;
    MPI_Comm_free(&inter);
    MPI_Comm_free(joined);
    *joined = merged;
    return MPI_SUCCESS;
}

/* Builds one communicator of the launch's ranks, in RANK order, out of singletons: rank 0 opens
 * an MPI port; ranks join one at a time, in rank order, each connecting to the port while every
 * rank already joined accepts (MPI_Comm_accept is collective over them), and the two sides merge
 * with the joined ones first. Rank 0 tells each rank over its socket when its turn has come (a
 * connect needs the accept posted). Under the watchdog: a rank that died after the rendezvous ends
 * the others within the timeout. */
static int join_ranks(ct_comm *c, mpi_impl *m, ct_err *err) {
    char port[MPI_MAX_PORT_NAME] = "", line[CT_RDZV_LINE_MAX];
    MPI_Comm joined = MPI_COMM_NULL;
    int rc = WATCHED(DOG(c), "joining the ranks", MPI_Comm_dup(MPI_COMM_SELF, &joined));
    /* a singleton's port comes from the runtime (rank 0's ompi-server): watched as well */
    if (rc == MPI_SUCCESS && c->rank == 0)
        rc = WATCHED(DOG(c), "opening an MPI port", MPI_Open_port(MPI_INFO_NULL, port));
    if (rc != MPI_SUCCESS) return failed(c, "open port", rc, err);
    if (c->rank > 0) {
        if ((rc = ct_rdzv_recv(&m->rdzv, line, err))) return rc;
        size_t len = strlen(line);
        if (len >= sizeof port)
            return ct_errf(err, CT_ERR_RUNTIME, "rank %d: rank 0 sent an MPI port name of %zu bytes (MPI allows %d)",
                           c->rank, len, MPI_MAX_PORT_NAME - 1);
        memcpy(port, line, len + 1);
        rc = WATCHED(DOG(c), "connect (joining the ranks)", join_one(port, false, &joined));
        if (rc != MPI_SUCCESS) return failed(c, "connect (joining the ranks)", rc, err);
    }
    for (int next = c->rank + 1; next < c->world; next++) {
        if (c->rank == 0 && (rc = ct_rdzv_send(&m->rdzv, next, port, err))) return rc;
        rc = WATCHED(DOG(c), "accept (joining the ranks)", join_one(port, true, &joined));
        if (rc != MPI_SUCCESS) return failed(c, "accept (joining the ranks)", rc, err);
    }
    if (c->rank == 0) (void)WATCHED(DOG(c), "closing the MPI port", MPI_Close_port(port));
    ct_rdzv_close_sockets(&m->rdzv);
    m->comm = joined;
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    int rank = -1, world = 0;
    MPI_Comm_rank(m->comm, &rank);
    MPI_Comm_size(m->comm, &world);
    if (rank != c->rank || world != c->world)
        return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: the joined MPI communicator says rank %d of %d", c->rank,
                       c->world, rank, world);
    return CT_OK;
}

/* The communicator of launch l (mpirun's, or a torchrun-style one joined here); the watchdog
 * bounds each collective by l->comm_timeout_s (0: none). */
__attribute__((visibility("default"))) int ct_comm_mpi_create(ct_backend *be, const ct_launch *l, ct_comm **out,
                                                              ct_err *err) {
    bool joining = l->launcher == CT_LAUNCH_ENV;
    mpi_impl *m = ct_xcalloc(1, sizeof *m);
    m->comm = MPI_COMM_WORLD;
    m->rdzv = (ct_rdzv){.to_root = -1};
    int rc = joining ? meet_before_init(&m->rdzv, l, err) : CT_OK;
    int inited = 0, provided = 0, rank = l->rank, world = l->world;
    /* watched from MPI_Init on: a singleton's init reaches rank 0's ompi-server, which ends with rank
     * 0. With INIT_SLACK_S more than a collective: mpirun's init waits for every rank to get there,
     * and rank 0 comes later than the others by its run directory's checks (mpirun itself ends the
     * job when a rank dies before). */
    start_watchdog(&m->dog, l);
    MPI_Initialized(&inited);
    /* only the main thread calls MPI (the loader's threads never do) */
    if (!rc && !inited) {
        watch_mark_slack(&m->dog, "initialisation (MPI_Init)", INIT_SLACK_S);
        if (watched_rc(&m->dog, MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
            rc = ct_errf(err, CT_ERR_RUNTIME, "MPI_Init failed");
    }
    if (rc) {
        ct_watchdog_stop(&m->dog.t);
        ct_rdzv_close(&m->rdzv);
        free(m);
        return rc;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (!joining) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    }
    ct_comm *c = ct_xcalloc(1, sizeof *c);
    *c = (ct_comm){.name = "mpi", .rank = rank, .world = world, .be = be, .impl = m,
                   .all_reduce = all_reduce, .reduce_scatter = reduce_scatter, .all_gather = all_gather,
                   .broadcast = broadcast, .reduce_scatter_shards = reduce_scatter_shards,
                   .all_gather_shards = all_gather_shards, .all_gather_range = all_gather_range,
                   .reduce_scatter_range = reduce_scatter_range, .all_reduce_host = all_reduce_host,
                   .barrier = barrier, .start_all_reduce = start_all_reduce,
                   .start_reduce_scatter_range = start_reduce_scatter_range,
                   .start_all_gather_range = start_all_gather_range, .test = req_test, .wait = req_wait,
                   .destroy = destroy};
    if (m->dog.t.running) pthread_mutex_lock(&m->dog.t.mu);
    m->dog.rank = rank, m->dog.world = world;   /* MPI's (check_mpi_rank compares them with the launcher's) */
    if (m->dog.t.running) pthread_mutex_unlock(&m->dog.t.mu);
    if (joining && (rc = join_ranks(c, m, err))) {
        c->failed = true;
        destroy(c);
        return rc;
    }
    *out = c;
    return CT_OK;
}

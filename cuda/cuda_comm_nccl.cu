/* cuda_comm_nccl.cu: the communicator over NCCL on device buffers (core/dist/comm.h), for the
 * CUDA backend's ranks.
 *
 * libnccl is opened with dlopen when a run of several GPU ranks (or CTRAIN_COMM=nccl) asks for it,
 * never linked: a one-GPU run does not need it, and PyTorch's wheels carry their own copy, which
 * CTRAIN_NCCL_LIBRARY can name. Every collective is queued on the backend's compute stream, in
 * order with the kernels that produce and consume its buffers, so the host never waits for one
 * (except all_reduce_host and barrier, whose results are host values).
 *
 * The ZeRO partition's collectives, whose parts are uneven (ct_comm_shard: ceil(n / world) per
 * rank, the last ones shorter), are NCCL groups of one reduce or broadcast per rank; the even
 * ones (all-reduce, reduce-scatter, all-gather, broadcast) are NCCL's own calls.
 *
 * A rank that dies, or stops answering, leaves NCCL's kernels spinning and the stream stalled: a
 * watchdog thread keeps the collectives queued but not finished (an event after each) and ends the
 * process when the oldest has been pending longer than the timeout (CTRAIN_COMM_TIMEOUT), counted
 * from when it was queued or the one before it finished, whichever is later, as the MPI
 * communicator's watchdog does for a blocking call; and every host call that can wait for the other
 * ranks: the communicator's creation, which waits for every rank to come, each enqueue (NCCL
 * connects to a peer lazily, inside the first call that needs it), and the end (the stream's last
 * collectives, ncclCommDestroy). A stop signal the rank cannot act on because it is stuck in one
 * of these ends it too (watchdog.h).
 *
 * Host values (all_reduce_host, barrier) go through the host communicator given at creation (MPI
 * under mpirun), or, without one (the torchrun-style launch), through NCCL on a small device
 * buffer. */
#include "cuda/cuda_internal.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "core/dist/comm.h"
#include "core/dist/watchdog.h"
}

/* The NCCL entry points this file calls, from the library dlopen found. */
typedef struct nccl_api {
    void *lib;
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*abort)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
} nccl_api;

static int nccl_load(nccl_api *a, ct_err *err) {
    memset(a, 0, sizeof *a);
    const char *env = getenv("CTRAIN_NCCL_LIBRARY");
    const char *path = env && *env ? env : "libnccl.so.2";
    a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib)
        return ct_errf(err, CT_ERR_RUNTIME, "GPU ranks need NCCL, and %s did not load: %s.\n  Install NCCL "
                       "(libnccl2), or set CTRAIN_NCCL_LIBRARY to a libnccl.so.2 (PyTorch's wheels carry one "
                       "under site-packages/nvidia/nccl/lib)", path, dlerror());
    struct {
        void **slot;
        const char *name;
    } want[] = {
        {(void **)&a->get_unique_id, "ncclGetUniqueId"},     {(void **)&a->init_rank, "ncclCommInitRank"},
        {(void **)&a->all_reduce, "ncclAllReduce"},          {(void **)&a->reduce_scatter, "ncclReduceScatter"},
        {(void **)&a->all_gather, "ncclAllGather"},          {(void **)&a->broadcast, "ncclBroadcast"},
        {(void **)&a->reduce, "ncclReduce"},                 {(void **)&a->group_start, "ncclGroupStart"},
        {(void **)&a->group_end, "ncclGroupEnd"},            {(void **)&a->destroy, "ncclCommDestroy"},
        {(void **)&a->abort, "ncclCommAbort"},               {(void **)&a->error_string, "ncclGetErrorString"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].slot = dlsym(a->lib, want[i].name);
        if (!*want[i].slot) {
            dlclose(a->lib);
            a->lib = NULL;
            return ct_errf(err, CT_ERR_RUNTIME, "%s has no %s: not an NCCL 2 library", path, want[i].name);
        }
    }
    return CT_OK;
}

/* ---- the unique id, as text for the rendezvous ---- */

extern "C" __attribute__((visibility("default"))) int ct_cuda_nccl_unique_id(char *hex, size_t hex_n, ct_err *err) {
    if (hex_n < 2 * sizeof(ncclUniqueId) + 1)
        return ct_errf(err, CT_ERR_RUNTIME, "NCCL unique id: a buffer of %zu bytes (%zu needed)", hex_n,
                       2 * sizeof(ncclUniqueId) + 1);
    nccl_api a;
    int rc = nccl_load(&a, err);
    if (rc) return rc;
    ncclUniqueId id;
    ncclResult_t r = a.get_unique_id(&id);
    if (r != ncclSuccess) rc = ct_errf(err, CT_ERR_RUNTIME, "ncclGetUniqueId failed: %s", a.error_string(r));
    for (size_t i = 0; !rc && i < sizeof id.internal; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
    dlclose(a.lib);
    return rc;
}

static bool id_from_hex(const char *hex, ncclUniqueId *id) {
    if (strlen(hex) != 2 * sizeof id->internal) return false;
    for (size_t i = 0; i < sizeof id->internal; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return false;
        id->internal[i] = (char)v;
    }
    return true;
}

/* ---- the watchdog of queued collectives ---- */

enum { PENDING_MAX = 64 };

typedef struct pending {
    cudaEvent_t done;            /* recorded after the collective */
    const char *what;
    double queued;               /* ct_now() seconds */
} pending;

typedef struct nccl_watch {
    ct_watchdog_thread t;
    int timeout_s, rank, world, device;
    pending ring[PENDING_MAX];   /* in queue order: ring[head], ... (count of them) */
    int head, count;
    cudaEvent_t spare[PENDING_MAX]; /* events no collective uses now */
    int spare_n;
    const char *blocking;        /* a host call in progress that can wait for the other ranks (the
                                    communicator's creation, an enqueue, the end), NULL when none */
    double blocking_since;
    ct_stop_follow stop;         /* the CLI's stop flag */
} nccl_watch;

/* Drops the finished collectives at the front; called with mu held. */
static void retire_done(nccl_watch *w) {
    while (w->count && cudaEventQuery(w->ring[w->head].done) == cudaSuccess) {
        w->spare[w->spare_n++] = w->ring[w->head].done;
        w->head = (w->head + 1) % PENDING_MAX;
        w->count--;
        /* the next one's wait starts when the one before it finished (seen now, at most half a
         * second late), not when it was queued behind it */
        if (w->count) w->ring[w->head].queued = ct_now();
    }
}

static void *watch_nccl(void *arg) {
    nccl_watch *w = (nccl_watch *)arg;
    cudaSetDevice(w->device);
    pthread_mutex_lock(&w->t.mu);
    while (!w->t.stop) {
        ct_watchdog_nap(&w->t);
        if (w->t.stop) break;
        retire_done(w);
        double now = ct_now();
        const char *what = w->blocking ? w->blocking : w->count ? w->ring[w->head].what : NULL;
        double since = w->blocking ? w->blocking_since : w->count ? w->ring[w->head].queued : now;
        double waited = what ? now - since : -1, stop_age = ct_watchdog_stop_age(&w->stop, now, since);
        if (ct_watchdog_due(w->timeout_s, waited, stop_age))
            ct_watchdog_expire("NCCL", what, w->rank, w->world, waited, w->timeout_s, w->stop.sig, now - w->stop.seen,
                               stop_age >= 0);
    }
    pthread_mutex_unlock(&w->t.mu);
    return NULL;
}

/* A blocking call the watchdog bounds (what), or none (NULL). */
static void mark_blocking(nccl_watch *w, const char *what) {
    if (!w->t.running) return;
    pthread_mutex_lock(&w->t.mu);
    w->blocking = what;
    w->blocking_since = ct_now();
    pthread_mutex_unlock(&w->t.mu);
}

/* The result of a host call made under mark_blocking, once it returned. */
static ncclResult_t blocking_done(nccl_watch *w, ncclResult_t r) {
    mark_blocking(w, NULL);
    return r;
}

/* ---- the communicator ---- */

typedef struct nccl_impl {
    nccl_api api;
    ncclComm_t comm;
    ct_comm *host;               /* host values go here when given (owned); else NCCL */
    double *dev_values;          /* [HOST_VALUES_MAX] device doubles for host values without `host` */
    nccl_watch watch;
} nccl_impl;

enum { HOST_VALUES_MAX = 64 };

static nccl_impl *impl_of(ct_comm *c) { return (nccl_impl *)c->impl; }

static int nccl_failed(ct_comm *c, const char *what, ncclResult_t r, ct_err *err) {
    return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: NCCL %s failed: %s", c->rank, c->world, what,
                   impl_of(c)->api.error_string(r));
}

/* After a collective is queued: an event the watchdog follows until it has finished. */
static void watch_queued(ct_comm *c, const char *what) {
    nccl_watch *w = &impl_of(c)->watch;
    if (!w->t.running) return;
    pthread_mutex_lock(&w->t.mu);
    retire_done(w);
    if (w->count == PENDING_MAX) {
        /* a full ring: wait for the oldest (the watchdog bounds that wait) */
        cudaEvent_t oldest = w->ring[w->head].done;
        pthread_mutex_unlock(&w->t.mu);
        cudaEventSynchronize(oldest);
        pthread_mutex_lock(&w->t.mu);
        retire_done(w);
    }
    cudaEvent_t ev;
    if (w->spare_n) ev = w->spare[--w->spare_n];
    else CT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CT_CUDA_CHECK(cudaEventRecord(ev, ct_cuda_stream(c->be)));
    pending *p = &w->ring[(w->head + w->count) % PENDING_MAX];
    p->done = ev;
    p->what = what;
    p->queued = ct_now();
    w->count++;
    pthread_mutex_unlock(&w->t.mu);
}

static ncclDataType_t nccl_type(ct_dtype dt) {
    switch (dt) {
    case CT_F32: return ncclFloat32;
    case CT_F16: return ncclFloat16;
    case CT_BF16: return ncclBfloat16;
    case CT_I32: return ncclInt32;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(ct_reduce_op op) { return op == CT_REDUCE_MAX ? ncclMax : ncclSum; }

/* The status of one queued NCCL call: watched when it was queued, an error naming it if not. */
static int queued(ct_comm *c, const char *what, ncclResult_t r, ct_err *err) {
    if (r != ncclSuccess) return nccl_failed(c, what, r, err);
    watch_queued(c, what);
    return CT_OK;
}

/* Queue one NCCL call under the watchdog (the enqueue itself may wait for a peer) and watch it
 * until it has run on the stream. The comma orders the mark before the call. */
#define ENQUEUE(c, what, call, err)                                                                \
    (mark_blocking(&impl_of(c)->watch, (what)), queued((c), (what), blocking_done(&impl_of(c)->watch, (call)), (err)))

static int all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err) {
    nccl_impl *m = impl_of(c);
    return ENQUEUE(c, "all-reduce", m->api.all_reduce(buf, buf, (size_t)n, nccl_type(dt), nccl_op(op), m->comm,
                                                     ct_cuda_stream(c->be)), err);
}

static int reduce_scatter(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                          ct_reduce_op op, ct_err *err) {
    nccl_impl *m = impl_of(c);
    return ENQUEUE(c, "reduce-scatter", m->api.reduce_scatter(src, dst, (size_t)n_per_rank, nccl_type(dt), nccl_op(op),
                                                             m->comm, ct_cuda_stream(c->be)), err);
}

static int all_gather(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt, ct_err *err) {
    nccl_impl *m = impl_of(c);
    return ENQUEUE(c, "all-gather", m->api.all_gather(src, dst, (size_t)n_per_rank, nccl_type(dt), m->comm,
                                                     ct_cuda_stream(c->be)), err);
}

static int broadcast(ct_comm *c, void *buf, int64_t n, ct_dtype dt, int root, ct_err *err) {
    if (root < 0 || root >= c->world)
        return ct_errf(err, CT_ERR_RUNTIME, "broadcast from rank %d of a %d-rank communicator", root, c->world);
    nccl_impl *m = impl_of(c);
    return ENQUEUE(c, "broadcast", m->api.broadcast(buf, buf, (size_t)n, nccl_type(dt), root, m->comm,
                                                   ct_cuda_stream(c->be)), err);
}

/* One NCCL group over the ranks of a partition: for each rank `root` with a share [lo, hi) of the
 * elements [a, b) of an n-element partition, a reduce to root (reduce) or a broadcast from root
 * (gather) of that share. send_at_a / recv_at_a: where element a is in the send and receive
 * buffers; a broadcasting root sends from its own part instead (own_part: element lo_self of the
 * partition at own_part[0]); with recv_at_start, each root receives its share at recv_at_a[0]
 * rather than at its place in the range (reduce_scatter_range's dst). */
typedef struct share_call {
    bool reduce;
    bool recv_at_start;
    const char *what;
    ct_reduce_op op;
} share_call;

static int grouped_shares(ct_comm *c, const share_call *k, void *recv_at_a, const void *send_at_a,
                          const void *own_part, int64_t n, int64_t a, int64_t b, ct_dtype dt, ct_err *err) {
    nccl_impl *m = impl_of(c);
    cudaStream_t s = ct_cuda_stream(c->be);
    mark_blocking(&m->watch, k->what);   /* the group's calls, and its end, may wait for peers */
    ncclResult_t r = m->api.group_start();
    int64_t plo, phi;
    ct_comm_shard(n, c->world, c->rank, &plo, &phi);
    for (int root = 0; r == ncclSuccess && root < c->world; root++) {
        int64_t lo, hi;
        ct_comm_shard_range(n, c->world, root, a, b, &lo, &hi);
        if (hi <= lo) continue;
        void *recv = k->recv_at_start ? recv_at_a : ct_elem(recv_at_a, lo - a, dt);
        if (k->reduce) {
            r = m->api.reduce(ct_celem(send_at_a, lo - a, dt), recv, (size_t)(hi - lo), nccl_type(dt), nccl_op(k->op),
                              root, m->comm, s);
        } else {
            const void *send = root == c->rank ? ct_celem(own_part, lo - plo, dt) : recv;
            r = m->api.broadcast(send, recv, (size_t)(hi - lo), nccl_type(dt), root, m->comm, s);
        }
    }
    ncclResult_t end = blocking_done(&m->watch, m->api.group_end());
    return queued(c, k->what, r != ncclSuccess ? r : end, err);
}

static int reduce_scatter_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err) {
    share_call k = {true, false, "reduce-scatter", op};
    /* in place: each root's reduce lands on its own part of buf */
    return grouped_shares(c, &k, buf, buf, NULL, n, 0, n, dt, err);
}

static int all_gather_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_err *err) {
    int64_t plo, phi;
    ct_comm_shard(n, c->world, c->rank, &plo, &phi);
    share_call k = {false, false, "all-gather", CT_REDUCE_SUM};
    return grouped_shares(c, &k, buf, buf, ct_elem(buf, plo, dt), n, 0, n, dt, err);
}

static int all_gather_range(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b, ct_dtype dt,
                            ct_err *err) {
    share_call k = {false, false, "all-gather", CT_REDUCE_SUM};
    return grouped_shares(c, &k, dst, dst, part, n, a, b, dt, err);
}

static int reduce_scatter_range(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                ct_dtype dt, ct_err *err) {
    share_call k = {true, true, "reduce-scatter", CT_REDUCE_SUM};
    return grouped_shares(c, &k, dst, src, NULL, n, a, b, dt, err);
}

static int all_reduce_host(ct_comm *c, double *vals, int n, ct_reduce_op op, ct_err *err) {
    nccl_impl *m = impl_of(c);
    if (m->host) return m->host->all_reduce_host(m->host, vals, n, op, err);
    for (int at = 0; at < n; at += HOST_VALUES_MAX) {
        int k = n - at < HOST_VALUES_MAX ? n - at : HOST_VALUES_MAX;
        cudaStream_t s = ct_cuda_stream(c->be);
        CT_CUDA_CHECK(cudaMemcpyAsync(m->dev_values, vals + at, (size_t)k * sizeof(double), cudaMemcpyHostToDevice, s));
        int rc = ENQUEUE(c, "all-reduce of host values",
                         m->api.all_reduce(m->dev_values, m->dev_values, (size_t)k, ncclFloat64, nccl_op(op),
                                           m->comm, s),
                         err);
        if (rc) return rc;
        CT_CUDA_CHECK(cudaMemcpyAsync(vals + at, m->dev_values, (size_t)k * sizeof(double), cudaMemcpyDeviceToHost, s));
        CT_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return CT_OK;
}

static int barrier(ct_comm *c, ct_err *err) {
    double one = 1;
    /* the device work queued so far is done on every rank once this host value comes back */
    return all_reduce_host(c, &one, 1, CT_REDUCE_SUM, err);
}

static void destroy(ct_comm *c) {
    nccl_impl *m = impl_of(c);
    nccl_watch *w = &m->watch;
    if (m->comm) {
        /* still under the watchdog: the stream's last collectives and ncclCommDestroy wait for the
         * peers; a failed rank does not (ncclCommAbort) */
        mark_blocking(w, c->failed ? "abort (ncclCommAbort)" : "end (the last collectives, ncclCommDestroy)");
        if (c->failed) m->api.abort(m->comm);
        else {
            (void)cudaStreamSynchronize(ct_cuda_stream(c->be));
            m->api.destroy(m->comm);
        }
        mark_blocking(w, NULL);
    }
    ct_watchdog_stop(&w->t);
    for (int i = 0; i < w->count; i++) (void)cudaEventDestroy(w->ring[(w->head + i) % PENDING_MAX].done);
    for (int i = 0; i < w->spare_n; i++) (void)cudaEventDestroy(w->spare[i]);
    if (m->dev_values) (void)cudaFree(m->dev_values);
    if (m->host) {
        m->host->failed = c->failed;
        m->host->destroy(m->host);
    }
    if (m->api.lib) dlclose(m->api.lib);
    free(m);
    free(c);
}

/* Rank `rank` of `world` GPU ranks that share the unique id id_hex (ct_cuda_nccl_unique_id of
 * rank 0, sent over the launch's rendezvous or MPI). host: a communicator for host values (taken
 * over: destroyed with this one), or NULL. timeout_s: the watchdog's bound (0: none); stop_signal:
 * the CLI's stop flag (NULL: none), which ends a rank stuck in a wait (watchdog.h). (Named _open:
 * the _create of before had no stop flag, and a library that still has only that one is refused by
 * name, not called with the wrong arguments.) */
extern "C" __attribute__((visibility("default"))) int ct_cuda_comm_nccl_open(ct_backend *be, int rank, int world,
                                                                             const char *id_hex, ct_comm *host,
                                                                             int timeout_s, volatile int *stop_signal,
                                                                             ct_comm **out, ct_err *err) {
    *out = NULL;
    ncclUniqueId id;
    if (!id_from_hex(id_hex, &id)) {
        if (host) { /* taken over: ended here, as a failed rank's */
            host->failed = true;
            host->destroy(host);
        }
        return ct_errf(err, CT_ERR_RUNTIME, "rank %d: the NCCL unique id from rank 0 is not %zu hex digits (did rank "
                       "0 fail? its output says why)", rank, 2 * sizeof id.internal);
    }
    nccl_impl *m = (nccl_impl *)ct_xcalloc(1, sizeof *m);
    ct_comm *c = (ct_comm *)ct_xcalloc(1, sizeof *c);
    c->name = "nccl";
    c->rank = rank;
    c->world = world;
    c->be = be;
    c->impl = m;
    c->all_reduce = all_reduce;
    c->reduce_scatter = reduce_scatter;
    c->all_gather = all_gather;
    c->broadcast = broadcast;
    c->reduce_scatter_shards = reduce_scatter_shards;
    c->all_gather_shards = all_gather_shards;
    c->all_gather_range = all_gather_range;
    c->reduce_scatter_range = reduce_scatter_range;
    c->all_reduce_host = all_reduce_host;
    c->barrier = barrier;
    /* NCCL's calls are non-blocking already (queued on the compute stream, before whatever reads
     * their buffers): the non-blocking forms are the same calls, with nothing to wait for. Overlap
     * with compute on the device needs a communication stream and events: not written yet. */
    c->start_all_reduce = ct_comm_start_all_reduce_now;
    c->start_reduce_scatter_range = ct_comm_start_reduce_scatter_range_now;
    c->start_all_gather_range = ct_comm_start_all_gather_range_now;
    c->test = ct_comm_test_now;
    c->wait = ct_comm_wait_now;
    c->destroy = destroy;
    m->host = host;
    int rc = nccl_load(&m->api, err);
    CT_CUDA_CHECK(cudaSetDevice(ct_cuda_of(be)->device));
    if (!rc && !host) CT_CUDA_CHECK(cudaMalloc((void **)&m->dev_values, HOST_VALUES_MAX * sizeof(double)));
    /* the watchdog first: the creation waits for every rank, and is bounded like a collective */
    nccl_watch *w = &m->watch;
    w->timeout_s = timeout_s;
    w->rank = rank;
    w->world = world;
    w->device = ct_cuda_of(be)->device;
    w->stop.flag = stop_signal;
    if (!rc && (timeout_s > 0 || stop_signal)) ct_watchdog_start(&w->t, watch_nccl, w);
    if (!rc) {
        mark_blocking(w, "communicator creation (ncclCommInitRank)");
        ncclResult_t r = m->api.init_rank(&m->comm, world, id, rank);
        mark_blocking(w, NULL);
        if (r != ncclSuccess) {
            m->comm = NULL;
            rc = nccl_failed(c, "communicator creation (ncclCommInitRank)", r, err);
        }
    }
    if (rc) {
        c->failed = true;
        destroy(c);
        return rc;
    }
    *out = c;
    return CT_OK;
}

/* comm.h: the communicator, the seam data parallelism plugs into.
 *
 * The trainer calls these where ranks meet: the gradient reduction at the accumulation boundary,
 * the global gradient norm and overflow flag (one sum of squares), the all-gather of parameters
 * a shard update wrote, and the loss average. Three implementations fill the table: one process
 * (ct_comm_single: every collective over one rank, a copy or nothing); MPI (comm_mpi.c, on
 * host-addressable buffers: the CPU backend, the capped device), built into
 * build/libctrain_mpi.so, which ct_comm_open loads only for a world above 1, so a run of one
 * process never maps libmpi; NCCL (cuda/cuda_comm_nccl.cu, on device buffers, inside
 * libctrain_cuda.so, found through ct_backend_symbol). Tests run several ranks as threads of one
 * process (test/thread_comm.h).
 *
 * Buffers are in the memory of the backend the communicator was created for; element counts are
 * per rank where said. Every call returns CT_OK or an error (CT_ERR_RUNTIME naming the collective)
 * and is collective: every rank calls it, in the same order.
 *
 * The start_* entries are the non-blocking forms of three collectives (overlap_comm, ZeRO-3's
 * prefetch): they begin the collective and return a request at once; the buffers belong to the
 * collective until wait returns (neither read nor written by the caller). Every rank starts the
 * same non-blocking collectives in the same order (they pair up by order, as the blocking ones do).
 * OpenMPI moves a non-blocking collective on only inside MPI calls, so a caller that wants it to
 * progress while it computes calls test now and then (after each layer). A non-blocking reduction
 * may add in another order than its blocking form (OpenMPI runs other algorithms for them): code
 * that must give the same bits with and without overlap uses the start_* forms in both cases. */
#ifndef CT_DIST_COMM_H
#define CT_DIST_COMM_H

#include "core/backend/backend.h"
#include "core/util/common.h"
#include "core/util/tensor.h"

typedef enum { CT_REDUCE_SUM = 0, CT_REDUCE_MAX } ct_reduce_op;

typedef struct ct_comm ct_comm;
/* A non-blocking collective in flight; NULL is one that completed when it started (one rank). */
typedef struct ct_comm_req ct_comm_req;
struct ct_comm {
    const char *name;            /* "single", "mpi", "nccl" */
    int rank, world;
    ct_backend *be;              /* where the buffers live */
    void *impl;
    bool failed;                 /* set before destroy when this rank ends on an error: the MPI
                                    communicator then leaves without MPI_Finalize (which would wait
                                    for ranks still in a collective), and mpirun ends the others */

    /* buf[n] = op over ranks of buf[n] (in place). */
    int (*all_reduce)(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err);
    /* dst[n_per_rank] = op over ranks of the rank's slice src[rank * n_per_rank, +n_per_rank). */
    int (*reduce_scatter)(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                          ct_reduce_op op, ct_err *err);
    /* dst[world * n_per_rank] = every rank's src[n_per_rank], in rank order; src may be dst's
     * own slice (dst + rank * n_per_rank): in place. */
    int (*all_gather)(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                      ct_err *err);
    /* buf[n] = root's buf[n]. */
    int (*broadcast)(ct_comm *c, void *buf, int64_t n, ct_dtype dt, int root, ct_err *err);
    /* Over the ZeRO partition of n elements (ct_comm_shard: rank r owns [lo_r, hi_r), the last
     * ranks' parts shorter or empty when n does not divide): */
    /* in place, buf[lo_r, hi_r) = op over ranks of their buf[lo_r, hi_r), for this rank's r; the
     * rest of buf is left as it was or overwritten (its sums are not kept). */
    int (*reduce_scatter_shards)(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op,
                                 ct_err *err);
    /* in place, buf[0, n) = every rank's own part of buf. */
    int (*all_gather_shards)(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_err *err);
    /* ZeRO-3's gather of one layer's parameters: every rank holds only its part of the n elements
     * (`part`: element lo_r at part[0]); dst[0, b - a) = the elements [a, b), each rank sending
     * what of its part falls in that range (some send nothing). `part` may be inside dst, at its
     * place there (part + (lo_r - a) == dst + ...: in place; stage 1-2's bucketed all-gather). */
    int (*all_gather_range)(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b,
                            ct_dtype dt, ct_err *err);
    /* ZeRO-3's gradient reduction of one layer: every rank holds src[0, b - a) for the elements
     * [a, b); dst[0, k) = the sum over ranks of the k of them in this rank's part (k = the size
     * of [a, b) ∩ [lo_r, hi_r), maybe 0; element max(a, lo_r) at dst[0]). */
    int (*reduce_scatter_range)(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                ct_dtype dt, ct_err *err);
    /* Small host values (norms, flags, loss sums): vals[n] = op over ranks, in double. */
    int (*all_reduce_host)(ct_comm *c, double *vals, int n, ct_reduce_op op, ct_err *err);
    int (*barrier)(ct_comm *c, ct_err *err);
    /* Non-blocking all_reduce, reduce_scatter_range and all_gather_range (same arguments and
     * results once waited for); *req receives the request. */
    int (*start_all_reduce)(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_comm_req **req,
                            ct_err *err);
    int (*start_reduce_scatter_range)(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                      ct_dtype dt, ct_comm_req **req, ct_err *err);
    int (*start_all_gather_range)(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b,
                                  ct_dtype dt, ct_comm_req **req, ct_err *err);
    /* *done = whether req has completed; moves it (and the others in flight) on. req stays valid
     * until wait. Not collective. */
    int (*test)(ct_comm *c, ct_comm_req *req, bool *done, ct_err *err);
    /* Waits for req and frees it (whatever it returns). Bounded as a blocking collective is
     * (CTRAIN_COMM_TIMEOUT): past it, an error naming the collective and how long it waited. */
    int (*wait)(ct_comm *c, ct_comm_req *req, ct_err *err);
    void (*destroy)(ct_comm *c);
};

/* Rank `rank`'s part of a ZeRO partition of n elements over `world` ranks: [*lo, *hi), parts of
 * ceil(n / world) in rank order (a pure function of n and world, so a checkpoint's layout does not
 * depend on who saved it). Inline: the communicators in libctrain_mpi.so and libctrain_cuda.so
 * compute the same partition without calling into ctrain. */
static inline void ct_comm_shard(int64_t n, int world, int rank, int64_t *lo, int64_t *hi) {
    int64_t part = world > 0 ? (n + world - 1) / world : n;
    int64_t a = (int64_t)rank * part, b = a + part;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}
/* The part of [a, b) that rank `rank` owns in that partition: [*lo, *hi), empty (lo == hi) when
 * none. */
static inline void ct_comm_shard_range(int64_t n, int world, int rank, int64_t a, int64_t b, int64_t *lo,
                                       int64_t *hi) {
    int64_t plo, phi;
    ct_comm_shard(n, world, rank, &plo, &phi);
    *lo = a > plo ? a : plo;
    *hi = b < phi ? b : phi;
    if (*hi < *lo) *hi = *lo;
}

/* The non-blocking entries of a communicator whose collectives need no waiting for (one process;
 * NCCL, whose calls are queued on the device stream in order with whatever reads their buffers):
 * each runs the blocking form and hands back the NULL request of a collective already complete.
 * Inline, for the tables of libctrain_cuda.so as well as ctrain's. */
static inline int ct_comm_start_all_reduce_now(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op,
                                               ct_comm_req **req, ct_err *err) {
    *req = NULL;
    return c->all_reduce(c, buf, n, dt, op, err);
}
static inline int ct_comm_start_reduce_scatter_range_now(ct_comm *c, void *dst, const void *src, int64_t n,
                                                         int64_t a, int64_t b, ct_dtype dt, ct_comm_req **req,
                                                         ct_err *err) {
    *req = NULL;
    return c->reduce_scatter_range(c, dst, src, n, a, b, dt, err);
}
static inline int ct_comm_start_all_gather_range_now(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a,
                                                     int64_t b, ct_dtype dt, ct_comm_req **req, ct_err *err) {
    *req = NULL;
    return c->all_gather_range(c, dst, part, n, a, b, dt, err);
}
static inline int ct_comm_test_now(ct_comm *c, ct_comm_req *req, bool *done, ct_err *err) {
    (void)c, (void)req, (void)err;
    *done = true;
    return CT_OK;
}
static inline int ct_comm_wait_now(ct_comm *c, ct_comm_req *req, ct_err *err) {
    (void)c, (void)req, (void)err;
    return CT_OK;
}

/* One process, rank 0 of 1, over backend be. */
ct_comm *ct_comm_single(ct_backend *be);
void ct_comm_destroy(ct_comm *c);

struct ct_launch;
/* The communicator of a launch (core/dist/launch.h): the single-process one for a world of 1;
 * for more, MPI from libctrain_mpi.so on host buffers (be must be the CPU backend): mpirun's
 * MPI_COMM_WORLD, or, under a torchrun-style launch (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT),
 * the ranks joined over a TCP rendezvous (rendezvous.h). --world-size alone, two processes of one
 * rank, or an MPI that disagrees with the launcher about rank or size, is CT_ERR_CONFIG naming the
 * fix; a library that cannot be loaded, or a rendezvous that fails otherwise, is CT_ERR_RUNTIME; a
 * stop signal during the rendezvous is 128 + the signal. */
int ct_comm_open(ct_backend *be, const struct ct_launch *launch, ct_comm **out, ct_err *err);

/* The version of the table above (and of ct_comm_mpi_create's arguments, ct_launch among them)
 * that libctrain_mpi.so must have been built with. */
#define CT_COMM_ABI 6

#endif

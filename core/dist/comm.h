/* comm.h: the communicator, the seam data parallelism plugs into.
 *
 * The trainer calls these where ranks meet: the gradient reduction at the accumulation boundary,
 * the global gradient norm and overflow flag (one sum of squares), the all-gather of parameters
 * a shard update wrote, and the loss average. Today the only implementation is the single-process
 * one (every collective over one rank: a copy or nothing); MPI (host buffers) and NCCL (device
 * buffers, inside libctrain_cuda.so) implementations fill the same table.
 *
 * Buffers are in the memory of the backend the communicator was created for; element counts are
 * per rank where said. Every call returns CT_OK or an error (CT_ERR_RUNTIME naming the collective)
 * and is collective: every rank calls it, in the same order. */
#ifndef CT_DIST_COMM_H
#define CT_DIST_COMM_H

#include "core/backend/backend.h"
#include "core/util/common.h"
#include "core/util/tensor.h"

typedef enum { CT_REDUCE_SUM = 0, CT_REDUCE_MAX } ct_reduce_op;

typedef struct ct_comm ct_comm;
struct ct_comm {
    const char *name;            /* "single", "mpi", "nccl" */
    int rank, world;
    ct_backend *be;              /* where the buffers live */
    void *impl;

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
    /* Small host values (norms, flags, loss sums): vals[n] = op over ranks, in double. */
    int (*all_reduce_host)(ct_comm *c, double *vals, int n, ct_reduce_op op, ct_err *err);
    int (*barrier)(ct_comm *c, ct_err *err);
    void (*destroy)(ct_comm *c);
};

/* One process, rank 0 of 1, over backend be. */
ct_comm *ct_comm_single(ct_backend *be);
void ct_comm_destroy(ct_comm *c);

#endif

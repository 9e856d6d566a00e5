/* comm_single.c: the communicator of one process (comm.h). A reduction over one rank is the
 * identity; a scatter or gather is a copy unless source and destination are the same memory. */
#include <stdlib.h>

#include "core/dist/comm.h"

static void copy(ct_comm *c, void *dst, const void *src, int64_t n, ct_dtype dt) {
    if (dst != src && n > 0) c->be->mem.copy_d2d(c->be, dst, src, ct_nbytes(n, dt));
}

static int all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err) {
    return CT_OK;
}

static int reduce_scatter(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                          ct_reduce_op op, ct_err *err) {
    copy(c, dst, src, n_per_rank, dt);
    return CT_OK;
}

static int all_gather(ct_comm *c, void *dst, const void *src, int64_t n_per_rank, ct_dtype dt,
                      ct_err *err) {
    copy(c, dst, src, n_per_rank, dt);
    return CT_OK;
}

static int broadcast(ct_comm *c, void *buf, int64_t n, ct_dtype dt, int root, ct_err *err) {
    if (root != 0) return ct_errf(err, CT_ERR_RUNTIME, "broadcast from rank %d of a 1-rank communicator", root);
    return CT_OK;
}

static int reduce_scatter_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op,
                                 ct_err *err) {
    return CT_OK;
}

static int all_gather_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_err *err) { return CT_OK; }

static int all_gather_range(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b,
                            ct_dtype dt, ct_err *err) {
    copy(c, dst, ct_celem(part, a, dt), b - a, dt);   /* the one part is the whole space */
    return CT_OK;
}

static int reduce_scatter_range(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                ct_dtype dt, ct_err *err) {
    copy(c, dst, src, b - a, dt);
    return CT_OK;
}

static int all_reduce_host(ct_comm *c, double *vals, int n, ct_reduce_op op, ct_err *err) { return CT_OK; }

static int barrier(ct_comm *c, ct_err *err) { return CT_OK; }

static void destroy(ct_comm *c) { free(c); }

ct_comm *ct_comm_single(ct_backend *be) {
    ct_comm *c = ct_xcalloc(1, sizeof *c);
    *c = (ct_comm){.name = "single", .rank = 0, .world = 1, .be = be, .all_reduce = all_reduce,
                   .reduce_scatter = reduce_scatter, .all_gather = all_gather, .broadcast = broadcast,
                   .reduce_scatter_shards = reduce_scatter_shards, .all_gather_shards = all_gather_shards,
                   .all_gather_range = all_gather_range, .reduce_scatter_range = reduce_scatter_range,
                   .all_reduce_host = all_reduce_host, .barrier = barrier,
                   /* one rank: the non-blocking forms complete at once */
                   .start_all_reduce = ct_comm_start_all_reduce_now,
                   .start_reduce_scatter_range = ct_comm_start_reduce_scatter_range_now,
                   .start_all_gather_range = ct_comm_start_all_gather_range_now, .test = ct_comm_test_now,
                   .wait = ct_comm_wait_now,
                   .destroy = destroy};
    return c;
}

void ct_comm_destroy(ct_comm *c) {
    if (c) c->destroy(c);
}

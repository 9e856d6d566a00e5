/* thread_comm.h: a communicator of W ranks in one process, one thread per rank, for the unit tests
 * of what ZeRO does across ranks (test_partition.c, test_comm.c) without mpirun.
 *
 * Every collective of comm.h, with its documented results, computed here the plain way: each rank
 * posts its arguments, waits for the others (a barrier), checks that every rank called the same
 * collective with the same sizes (MPI pairs collectives by order: a rank that starts another
 * collective, or another range, is a bug the test reports naming both ranks), computes its own
 * result from the other ranks' buffers into a private copy, waits again, and only then writes its
 * destination. Sums run in rank order, in the buffer's dtype (F32; host values in double).
 *
 * The non-blocking forms are strict about comm.h's rule that a request's buffers belong to the
 * collective until wait: at start the destination is filled with 0xff bytes (a NaN in every float
 * format) and the source is copied aside; wait checks that the caller wrote neither, then writes
 * the result. So a caller that reads a result before waiting reads NaN, and one that writes a
 * buffer in flight is reported.
 *
 * Each rank's communicator also records what the tests look at: the buffers its all-reduces
 * started with (in order), the gathers started, the gathered elements in flight and their most,
 * and the requests not yet waited for (tcomm_close checks there are none).
 *
 * Usage: tcomm_world *w = tcomm_world_create(W); then tcomm_run(W, fn, ctx) runs fn(rank, ctx) on
 * W threads, each opening its rank's communicator with tcomm_open(w, rank, be). Header-only (static
 * functions) for the test programs that include it. */
#ifndef CT_TEST_THREAD_COMM_H
#define CT_TEST_THREAD_COMM_H

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/dist/comm.h"

enum { TCOMM_MAX_RANKS = 8, TCOMM_LOG = 256 };

typedef enum {
    TC_ALL_REDUCE, TC_REDUCE_SCATTER, TC_ALL_GATHER, TC_BROADCAST, TC_RS_SHARDS, TC_AG_SHARDS, TC_AG_RANGE,
    TC_RS_RANGE, TC_HOST, TC_BARRIER
} tc_kind;

static const char *const tc_kind_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                            "reduce_scatter_shards", "all_gather_shards", "all_gather_range",
                                            "reduce_scatter_range", "all_reduce_host", "barrier"};

/* One rank's arguments to the collective in progress. */
typedef struct tc_post {
    tc_kind kind;
    const void *src;             /* what the others read: its buffer, part or source */
    int64_t n, a, b;
    ct_dtype dt;
    int op, root;
} tc_post;

typedef struct tcomm_world {
    int world;
    pthread_barrier_t bar;
    tc_post post[TCOMM_MAX_RANKS];
} tcomm_world;

/* A request in flight: the result waiting to be written, and what the caller must leave alone. */
struct ct_comm_req {
    void *dst;
    void *result;
    size_t bytes;
    const void *src;             /* the source (NULL: in place, or none) and its bytes at start */
    void *src_copy;
    size_t src_bytes;
    bool gather;
    int64_t elems;
};

typedef struct tc_rank {
    tcomm_world *w;
    int rank;
    ct_comm c;
    const void *log[TCOMM_LOG];  /* the all-reduces' buffers, in start order */
    int n_log;
    long gathers;                /* range gathers started (blocking or not) */
    int64_t gather_in_flight, gather_in_flight_max;
    int in_flight;               /* requests not waited for */
} tc_rank;

static inline tc_rank *tc_of(ct_comm *c) { return c->impl; }

static inline tcomm_world *tcomm_world_create(int world) {
    ck_assert(world >= 1 && world <= TCOMM_MAX_RANKS);
    tcomm_world *w = calloc(1, sizeof *w);
    w->world = world;
    pthread_barrier_init(&w->bar, NULL, (unsigned)world);
    return w;
}

static inline void tcomm_world_free(tcomm_world *w) {
    pthread_barrier_destroy(&w->bar);
    free(w);
}

/* Post this rank's arguments and wait for every rank's; the collectives must match. */
static inline void tc_meet(tc_rank *r, const tc_post *mine) {
    tcomm_world *w = r->w;
    w->post[r->rank] = *mine;
    pthread_barrier_wait(&w->bar);
    for (int q = 0; q < w->world; q++) {
        const tc_post *p = &w->post[q];
        ck_assert_msg(p->kind == mine->kind && p->n == mine->n && p->a == mine->a && p->b == mine->b &&
                          p->dt == mine->dt && p->op == mine->op && p->root == mine->root,
                      "rank %d called %s(n %lld, [%lld, %lld)) while rank %d called %s(n %lld, [%lld, %lld))",
                      r->rank, tc_kind_names[mine->kind], (long long)mine->n, (long long)mine->a, (long long)mine->b,
                      q, tc_kind_names[p->kind], (long long)p->n, (long long)p->a, (long long)p->b);
    }
}

/* Every rank has read what it needs of the others' buffers. */
static inline void tc_leave(tc_rank *r) { pthread_barrier_wait(&r->w->bar); }

static inline float tc_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }

static inline float tc_op(int op, float acc, float x) { return op == CT_REDUCE_MAX ? fmaxf(acc, x) : acc + x; }

/* out[i] = op over ranks q of post[q].src[at_q + i], i < k (F32), at_q = at(q). */
static inline void tc_reduce(const tcomm_world *w, float *out, int64_t k, int op, const int64_t *at) {
    for (int64_t i = 0; i < k; i++) {
        float acc = tc_f32(w->post[0].src, at[0] + i);
        for (int q = 1; q < w->world; q++) acc = tc_op(op, acc, tc_f32(w->post[q].src, at[q] + i));
        out[i] = acc;
    }
}

/* The result of this rank's collective `p` (the others' posted too), malloc'd; *bytes its size. */
static inline void *tc_result(tc_rank *r, const tc_post *p, size_t *bytes) {
    const tcomm_world *w = r->w;
    int W = w->world, me = r->rank;
    size_t es = ct_dtype_size(p->dt);
    int64_t at[TCOMM_MAX_RANKS] = {0}, lo, hi;
    void *out = NULL;
    switch (p->kind) {
    case TC_ALL_REDUCE:
        *bytes = (size_t)p->n * es;
        out = malloc(*bytes + 1);
        tc_reduce(w, out, p->n, p->op, at);
        break;
    case TC_REDUCE_SCATTER:
        *bytes = (size_t)p->n * es;
        out = malloc(*bytes + 1);
        for (int q = 0; q < W; q++) at[q] = (int64_t)me * p->n;
        tc_reduce(w, out, p->n, p->op, at);
        break;
    case TC_ALL_GATHER:
        *bytes = (size_t)(W * p->n) * es;
        out = malloc(*bytes + 1);
        for (int q = 0; q < W; q++) memcpy((char *)out + (size_t)(q * p->n) * es, w->post[q].src, (size_t)p->n * es);
        break;
    case TC_BROADCAST:
        *bytes = (size_t)p->n * es;
        out = malloc(*bytes + 1);
        memcpy(out, w->post[p->root].src, *bytes);
        break;
    case TC_RS_SHARDS:
        ct_comm_shard(p->n, W, me, &lo, &hi);
        *bytes = (size_t)(hi - lo) * es;
        out = malloc(*bytes + 1);
        for (int q = 0; q < W; q++) at[q] = lo;
        tc_reduce(w, out, hi - lo, p->op, at);
        break;
    case TC_AG_SHARDS:
        *bytes = (size_t)p->n * es;
        out = malloc(*bytes + 1);
        for (int q = 0; q < W; q++) {
            ct_comm_shard(p->n, W, q, &lo, &hi);
            memcpy((char *)out + (size_t)lo * es, (const char *)w->post[q].src + (size_t)lo * es,
                   (size_t)(hi - lo) * es);
        }
        break;
    case TC_AG_RANGE:   /* rank q's part holds its first owned element at part[0] */
        *bytes = (size_t)(p->b - p->a) * es;
        out = malloc(*bytes + 1);
        for (int q = 0; q < W; q++) {
            int64_t plo, phi;
            ct_comm_shard(p->n, W, q, &plo, &phi);
            ct_comm_shard_range(p->n, W, q, p->a, p->b, &lo, &hi);
            if (hi > lo)
                memcpy((char *)out + (size_t)(lo - p->a) * es, (const char *)w->post[q].src + (size_t)(lo - plo) * es,
                       (size_t)(hi - lo) * es);
        }
        break;
    case TC_RS_RANGE:
        ct_comm_shard_range(p->n, W, me, p->a, p->b, &lo, &hi);
        *bytes = (size_t)(hi - lo) * es;
        out = malloc(*bytes + 1);
        for (int q = 0; q < W; q++) at[q] = lo - p->a;
        tc_reduce(w, out, hi - lo, p->op, at);
        break;
    case TC_HOST: {
        *bytes = (size_t)p->n * sizeof(double);
        double *o = malloc(*bytes + 1);
        for (int64_t i = 0; i < p->n; i++) {
            double acc = ((const double *)w->post[0].src)[i];
            for (int q = 1; q < W; q++) {
                double x = ((const double *)w->post[q].src)[i];
                acc = p->op == CT_REDUCE_MAX ? fmax(acc, x) : acc + x;
            }
            o[i] = acc;
        }
        out = o;
        break;
    }
    case TC_BARRIER:
        *bytes = 0;
        break;
    }
    return out;
}

/* A blocking collective: meet, compute, leave, then write dst. */
static inline int tc_blocking(ct_comm *c, const tc_post *p, void *dst) {
    tc_rank *r = tc_of(c);
    if ((p->kind == TC_ALL_REDUCE || p->kind == TC_REDUCE_SCATTER || p->kind == TC_RS_SHARDS ||
         p->kind == TC_RS_RANGE) && p->dt != CT_F32)
        ck_abort_msg("thread_comm: %s of dtype %d (reductions are F32 here)", tc_kind_names[p->kind], p->dt);
    tc_meet(r, p);
    size_t bytes = 0;
    void *out = tc_result(r, p, &bytes);
    tc_leave(r);
    if (bytes && dst) memcpy(dst, out, bytes);
    free(out);
    return CT_OK;
}

/* A non-blocking collective: computed now, delivered at wait; dst poisoned meanwhile, the source
 * kept to check it is left alone (in place: dst is the source, and only dst is checked). */
static inline int tc_start(ct_comm *c, const tc_post *p, void *dst, ct_comm_req **req) {
    tc_rank *r = tc_of(c);
    if (p->kind != TC_AG_RANGE && p->dt != CT_F32)
        ck_abort_msg("thread_comm: %s of dtype %d (reductions are F32 here)", tc_kind_names[p->kind], p->dt);
    tc_meet(r, p);
    ct_comm_req *q = calloc(1, sizeof *q);
    q->result = tc_result(r, p, &q->bytes);
    tc_leave(r);
    q->dst = dst;
    /* what the others read of this rank's source: a reduction's whole source, a gather's owned
     * elements of the range (an all-reduce is in place) */
    size_t es = ct_dtype_size(p->dt), src_bytes = 0;
    const char *s = p->src, *d = dst;
    if (p->kind == TC_RS_RANGE) src_bytes = (size_t)(p->b - p->a) * es;
    if (p->kind == TC_AG_RANGE) {
        int64_t plo, phi, lo, hi;
        ct_comm_shard(p->n, c->world, c->rank, &plo, &phi);
        ct_comm_shard_range(p->n, c->world, c->rank, p->a, p->b, &lo, &hi);
        s += (size_t)(lo - plo) * es;
        src_bytes = (size_t)(hi - lo) * es;
    }
    bool overlap = src_bytes && s < d + q->bytes && d < s + src_bytes;
    if (src_bytes && !overlap) {
        q->src = s;
        q->src_bytes = src_bytes;
        q->src_copy = malloc(src_bytes);
        memcpy(q->src_copy, s, src_bytes);
    }
    memset(dst, 0xff, q->bytes);
    q->gather = p->kind == TC_AG_RANGE;
    q->elems = p->b - p->a;
    r->in_flight++;
    if (q->gather) {
        r->gather_in_flight += q->elems;
        if (r->gather_in_flight > r->gather_in_flight_max) r->gather_in_flight_max = r->gather_in_flight;
    }
    *req = q;
    return CT_OK;
}

static inline int tc_all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err) {
    tc_post p = {.kind = TC_ALL_REDUCE, .src = buf, .n = n, .dt = dt, .op = op};
    return tc_blocking(c, &p, buf);
}
static inline int tc_reduce_scatter(ct_comm *c, void *dst, const void *src, int64_t npr, ct_dtype dt, ct_reduce_op op,
                             ct_err *err) {
    tc_post p = {.kind = TC_REDUCE_SCATTER, .src = src, .n = npr, .dt = dt, .op = op};
    return tc_blocking(c, &p, dst);
}
static inline int tc_all_gather(ct_comm *c, void *dst, const void *src, int64_t npr, ct_dtype dt, ct_err *err) {
    tc_post p = {.kind = TC_ALL_GATHER, .src = src, .n = npr, .dt = dt};
    return tc_blocking(c, &p, dst);
}
static inline int tc_broadcast(ct_comm *c, void *buf, int64_t n, ct_dtype dt, int root, ct_err *err) {
    if (root < 0 || root >= c->world)
        return ct_errf(err, CT_ERR_RUNTIME, "broadcast from rank %d of a %d-rank communicator", root, c->world);
    tc_post p = {.kind = TC_BROADCAST, .src = buf, .n = n, .dt = dt, .root = root};
    return tc_blocking(c, &p, buf);
}
static inline int tc_rs_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_err *err) {
    int64_t lo, hi;
    ct_comm_shard(n, c->world, c->rank, &lo, &hi);
    tc_post p = {.kind = TC_RS_SHARDS, .src = buf, .n = n, .dt = dt, .op = op};
    return tc_blocking(c, &p, ct_elem(buf, lo, dt));
}
static inline int tc_ag_shards(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_err *err) {
    tc_post p = {.kind = TC_AG_SHARDS, .src = buf, .n = n, .dt = dt};
    return tc_blocking(c, &p, buf);
}
static inline int tc_ag_range(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b, ct_dtype dt,
                       ct_err *err) {
    tc_of(c)->gathers++;
    tc_post p = {.kind = TC_AG_RANGE, .src = part, .n = n, .a = a, .b = b, .dt = dt};
    return tc_blocking(c, &p, dst);
}
static inline int tc_rs_range(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b, ct_dtype dt,
                       ct_err *err) {
    tc_post p = {.kind = TC_RS_RANGE, .src = src, .n = n, .a = a, .b = b, .dt = dt};
    return tc_blocking(c, &p, dst);
}
static inline int tc_host(ct_comm *c, double *vals, int n, ct_reduce_op op, ct_err *err) {
    tc_post p = {.kind = TC_HOST, .src = vals, .n = n, .dt = CT_F32, .op = op};
    return tc_blocking(c, &p, vals);
}
static inline int tc_barrier(ct_comm *c, ct_err *err) {
    tc_post p = {.kind = TC_BARRIER, .dt = CT_F32};
    return tc_blocking(c, &p, NULL);
}

static inline int tc_start_all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_comm_req **req,
                               ct_err *err) {
    tc_rank *r = tc_of(c);
    if (r->n_log < TCOMM_LOG) r->log[r->n_log++] = buf;
    tc_post p = {.kind = TC_ALL_REDUCE, .src = buf, .n = n, .dt = dt, .op = op};
    return tc_start(c, &p, buf, req);
}
static inline int tc_start_rs_range(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b,
                                    ct_dtype dt, ct_comm_req **req, ct_err *err) {
    tc_post p = {.kind = TC_RS_RANGE, .src = src, .n = n, .a = a, .b = b, .dt = dt};
    return tc_start(c, &p, dst, req);
}
static inline int tc_start_ag_range(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b,
                                    ct_dtype dt, ct_comm_req **req, ct_err *err) {
    tc_of(c)->gathers++;
    tc_post p = {.kind = TC_AG_RANGE, .src = part, .n = n, .a = a, .b = b, .dt = dt};
    return tc_start(c, &p, dst, req);
}

static inline int tc_test(ct_comm *c, ct_comm_req *q, bool *done, ct_err *err) {
    ck_assert_msg(q != NULL, "thread_comm: test of a NULL request (this communicator never completes at start)");
    *done = true;
    return CT_OK;
}

static inline int tc_wait(ct_comm *c, ct_comm_req *q, ct_err *err) {
    tc_rank *r = tc_of(c);
    if (!q) return CT_OK;
    for (size_t i = 0; i < q->bytes; i++)
        ck_assert_msg(((const unsigned char *)q->dst)[i] == 0xff,
                      "rank %d wrote byte %zu of a collective's destination before waiting for it", r->rank, i);
    if (q->src_copy)
        ck_assert_msg(memcmp(q->src_copy, q->src, q->src_bytes) == 0,
                      "rank %d changed a collective's source before waiting for it", r->rank);
    if (q->bytes) memcpy(q->dst, q->result, q->bytes);
    r->in_flight--;
    if (q->gather) r->gather_in_flight -= q->elems;
    free(q->result);
    free(q->src_copy);
    free(q);
    return CT_OK;
}

static inline void tc_destroy(ct_comm *c) { (void)c; }

/* Rank `rank`'s communicator of world w, over backend be (the CPU backend: host memory). */
static inline ct_comm *tcomm_open(tcomm_world *w, int rank, ct_backend *be) {
    tc_rank *r = calloc(1, sizeof *r);
    r->w = w;
    r->rank = rank;
    r->c = (ct_comm){.name = "threads", .rank = rank, .world = w->world, .be = be, .impl = r,
                     .all_reduce = tc_all_reduce, .reduce_scatter = tc_reduce_scatter, .all_gather = tc_all_gather,
                     .broadcast = tc_broadcast, .reduce_scatter_shards = tc_rs_shards,
                     .all_gather_shards = tc_ag_shards, .all_gather_range = tc_ag_range,
                     .reduce_scatter_range = tc_rs_range, .all_reduce_host = tc_host, .barrier = tc_barrier,
                     .start_all_reduce = tc_start_all_reduce, .start_reduce_scatter_range = tc_start_rs_range,
                     .start_all_gather_range = tc_start_ag_range, .test = tc_test, .wait = tc_wait,
                     .destroy = tc_destroy};
    return &r->c;
}

/* Everything this rank started was waited for. */
static inline void tcomm_close(ct_comm *c) {
    tc_rank *r = tc_of(c);
    ck_assert_msg(r->in_flight == 0, "rank %d: %d requests never waited for", r->rank, r->in_flight);
    free(r);
}

typedef struct tc_thread {
    int rank;
    void (*fn)(int rank, void *ctx);
    void *ctx;
} tc_thread;

static inline void *tc_thread_main(void *arg) {
    tc_thread *t = arg;
    t->fn(t->rank, t->ctx);
    return NULL;
}

/* fn(rank, ctx) for every rank of `world`, each on its own thread; returns when all have. */
static inline void tcomm_run(int world, void (*fn)(int rank, void *ctx), void *ctx) {
    pthread_t th[TCOMM_MAX_RANKS];
    tc_thread args[TCOMM_MAX_RANKS];
    for (int q = 0; q < world; q++) {
        args[q] = (tc_thread){q, fn, ctx};
        ck_assert_int_eq(pthread_create(&th[q], NULL, tc_thread_main, &args[q]), 0);
    }
    for (int q = 0; q < world; q++) pthread_join(th[q], NULL);
}

#endif

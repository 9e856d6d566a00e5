/* test_partition.c: the gradient buckets of ZeRO stages 0-1 (core/train/grad_buckets.h) and the
 * overlap and prefetch of stages 2-3 (core/train/partition.h), driven hook by hook over a
 * recording communicator: the single-process one whose non-blocking forms do their work at start
 * but hand out real requests, so the test sees what is in flight, in which order it started, and
 * when each request is waited for.
 *
 * Checked: every bucket's last writer is the lowest layer with a trainable element in it (from
 * the layout, element by element); in an armed backward a bucket starts exactly after its last
 * writer's backward, in the fixed order, and finish starts the rest in that order (the same order
 * unarmed); stage 3 with prefetch learns the walk from the first micro-batch and then prefetches
 * every gather it later uses, never holding more gathered elements in flight than
 * stage3_max_live_parameters, each layer pointed at its own parameters; no prefetch with a bucket
 * of 0 or a live limit of one layer; with stage3_max_reuse_distance, the last layer's backward
 * keeps its forward's parameters (one gather fewer); the part's gradients after overlap equal those without it,
 * bit for bit (random gradients from every layer's backward over 3 micro-batches). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/layer.h"
#include "core/params/store.h"
#include "core/train/grad_buckets.h"
#include "core/train/partition.h"
#include "core/util/json.h"
#include "core/util/rng.h"
#include "test/model_text.h"

/* ---- the recording communicator ---- */

typedef enum { OP_REDUCE, OP_SCATTER, OP_GATHER } op_kind;

struct ct_comm_req {
    op_kind kind;
    int64_t elems;
    const void *buf;             /* the all-reduce's buffer, the gather's destination */
};

typedef struct recorder {
    ct_comm *inner;              /* the single-process communicator that does the work */
    const void *log[256];        /* the all-reduces' buffers, in start order */
    int n_log;
    int64_t gather_in_flight, gather_in_flight_max;
    int in_flight;
    long gathers;                /* gathers started */
} recorder;

static recorder *rec_of(ct_comm *c) { return c->impl; }

static ct_comm_req *req_new(recorder *r, op_kind kind, int64_t elems, const void *buf) {
    ct_comm_req *q = malloc(sizeof *q);
    *q = (ct_comm_req){kind, elems, buf};
    r->in_flight++;
    if (kind == OP_GATHER) {
        r->gathers++;
        r->gather_in_flight += elems;
        if (r->gather_in_flight > r->gather_in_flight_max) r->gather_in_flight_max = r->gather_in_flight;
    }
    return q;
}

static int rec_all_reduce(ct_comm *c, void *buf, int64_t n, ct_dtype dt, ct_reduce_op op, ct_comm_req **req,
                          ct_err *err) {
    recorder *r = rec_of(c);
    if (r->n_log < 256) r->log[r->n_log++] = buf;
    *req = req_new(r, OP_REDUCE, n, buf);
    return CT_OK;   /* a sum over one rank */
}

static int rec_reduce_scatter(ct_comm *c, void *dst, const void *src, int64_t n, int64_t a, int64_t b, ct_dtype dt,
                              ct_comm_req **req, ct_err *err) {
    *req = req_new(rec_of(c), OP_SCATTER, b - a, dst);
    return rec_of(c)->inner->reduce_scatter_range(rec_of(c)->inner, dst, src, n, a, b, dt, err);
}

static int rec_gather(ct_comm *c, void *dst, const void *part, int64_t n, int64_t a, int64_t b, ct_dtype dt,
                      ct_comm_req **req, ct_err *err) {
    *req = req_new(rec_of(c), OP_GATHER, b - a, dst);
    return rec_of(c)->inner->all_gather_range(rec_of(c)->inner, dst, part, n, a, b, dt, err);
}

static int rec_test(ct_comm *c, ct_comm_req *q, bool *done, ct_err *err) {
    ck_assert_ptr_nonnull(q);
    *done = true;
    return CT_OK;
}

static int rec_wait(ct_comm *c, ct_comm_req *q, ct_err *err) {
    recorder *r = rec_of(c);
    if (!q) return CT_OK;
    r->in_flight--;
    if (q->kind == OP_GATHER) r->gather_in_flight -= q->elems;
    free(q);
    return CT_OK;
}

static ct_comm *rec_open(ct_backend *be) {
    recorder *r = calloc(1, sizeof *r);
    r->inner = ct_comm_single(be);
    ct_comm *c = malloc(sizeof *c);
    *c = *r->inner;
    c->impl = r;
    c->start_all_reduce = rec_all_reduce;
    c->start_reduce_scatter_range = rec_reduce_scatter;
    c->start_all_gather_range = rec_gather;
    c->test = rec_test;
    c->wait = rec_wait;
    return c;
}

static void rec_close(ct_comm *c) {
    recorder *r = rec_of(c);
    ck_assert_int_eq(r->in_flight, 0);   /* everything started was waited for */
    ct_comm_destroy(r->inner);
    free(r);
    free(c);
}

/* ---- a model ---- */

typedef struct model {
    ct_config cfg;
    ct_json_doc *doc;
    ct_graph *g;
    const ct_param_layout *L;
} model;

/* Five layers, three with parameters of 13*7+7, 7*9+9 (padded) and 9*4+4 elements. */
static void model_open(model *m) {
    static const char text[] = "{\"input\": [13], \"layers\": [{\"type\": \"linear\", \"out\": 7}, {\"type\": \"tanh\"}, "
                               "{\"type\": \"linear\", \"out\": 9}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 4}], "
                               "\"loss\": {\"type\": \"cross_entropy\"}}";
    memset(m, 0, sizeof *m);
    ct_err err = {0};
    model_text(text, &m->cfg, &m->doc);
    ck_assert_msg(ct_graph_build(&m->cfg, 2, CT_F32, &m->g, &err) == CT_OK, "%s", err.msg);
    m->L = ct_graph_layout(m->g);
}

static void model_close(model *m) {
    ct_graph_free(m->g);
    ct_json_free(m->doc);
}

/* The lowest layer with a trainable view holding element e; -1: none (padding). */
static int writer_of(const ct_param_layout *L, int64_t e) {
    for (int j = 0; j < L->n_layers; j++)
        for (int s = 0; s < ct_param_layout_layer_specs(L, j); s++) {
            int v = ct_param_layout_layer_view(L, j, s);
            if (v >= 0 && L->views[v].trainable && e >= L->views[v].offset && e < L->views[v].offset + L->views[v].numel)
                return j;
        }
    return -1;
}

START_TEST(buckets_start_after_their_last_writer) {
    model m;
    model_open(&m);
    const ct_param_layout *L = m.L;
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = rec_open(be);
    float *grads = calloc((size_t)L->n_params, sizeof *grads);
    ct_grad_buckets *g = ct_grad_buckets_create(L, grads, 37, c, true);
    int nb = ct_grad_buckets_count(g);
    ck_assert_int_eq(nb, (int)((L->n_params + 36) / 37));
    /* the buckets tile [0, n); each one's last writer from the layout; the order goes down */
    int64_t covered = 0;
    int prev = L->n_layers;
    for (int i = 0; i < nb; i++) {
        int64_t at, len;
        int w, want = -1;
        ct_grad_buckets_at(g, i, &at, &len, &w);
        covered += len;
        ck_assert_int_eq(at % 37, 0);
        for (int64_t e = at; e < at + len; e++) {
            int we = writer_of(L, e);
            if (we >= 0 && (want < 0 || we < want)) want = we;
        }
        ck_assert_int_eq(w, want);
        ck_assert_int_le(w < 0 ? -1 : w, prev);
        if (w >= 0) prev = w;
    }
    ck_assert_int_eq(covered, L->n_params);
    ct_exec_hooks h = ct_grad_buckets_hooks(g);
    ct_err err = {0};
    recorder *r = rec_of(c);
    for (int armed = 1; armed >= 0; armed--) {
        r->n_log = 0;
        ct_grad_buckets_arm(g, armed);
        for (int j = L->n_layers - 1; j >= 0; j--) {
            ck_assert_int_eq(h.after(h.ctx, j, CT_PASS_FORWARD, NULL, &err), CT_OK);   /* forward starts nothing */
            int before = r->n_log;
            ck_assert_int_eq(h.after(h.ctx, j, CT_PASS_BACKWARD, NULL, &err), CT_OK);
            int started = 0;
            for (int i = 0; i < nb; i++) {
                int64_t at, len;
                int w;
                ct_grad_buckets_at(g, i, &at, &len, &w);
                bool ready = w >= j;
                if (ready && armed) {
                    ck_assert_ptr_eq(r->log[started], grads + at);   /* in the fixed order */
                    started++;
                }
            }
            ck_assert_int_eq(r->n_log, armed ? started : 0);
            ck_assert_int_ge(r->n_log, before);
        }
        ck_assert_int_eq(ct_grad_buckets_finish(g, &err), CT_OK);
        ck_assert_int_eq(r->n_log, nb);
        for (int i = 0; i < nb; i++) {
            int64_t at, len;
            int w;
            ct_grad_buckets_at(g, i, &at, &len, &w);
            ck_assert_ptr_eq(r->log[i], grads + at);
        }
    }
    ct_grad_buckets_free(g);
    free(grads);
    rec_close(c);
    ct_backend_destroy(be);
    model_close(&m);
}
END_TEST

/* ---- stage 2-3 ---- */

typedef struct walk_result {
    float *grads;                /* [n_params]: the part's gradients after the walks */
    long prefetched, used, reused;
    long gathers;                /* gathers started, the persistent views' included */
    int64_t max_in_flight;       /* the most gathered elements in flight at once */
} walk_result;

/* `micro` micro-batches of forward and backward over every layer, through the partition's hooks;
 * each layer checks it reads its own parameters and adds random gradients (the same for every
 * run), then the flush. */
static void walk(const model *m, unsigned parts, const ct_partition_opts *o, int micro, walk_result *out) {
    const ct_param_layout *L = m->L;
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = rec_open(be);
    ct_param_store *p = NULL;
    ct_partition *z = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_param_store_create(L, be, CT_F32, 0, L->n_params, parts, &p, &err), CT_OK);
    ct_param_store_init(p, 11);
    ck_assert_msg(ct_partition_create(p, c, o, &z, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ct_partition_refresh(z, &err), CT_OK);
    ct_exec_hooks h = ct_partition_hooks(z);
    const float *whole = ct_param_store_part_params(p);   /* one rank: its part is everything */
    ct_rng rng;
    ct_rng_init(&rng, 3, CT_RNG_AUGMENT, 0);
    for (int mb = 0; mb < micro; mb++)
        for (int dir = 0; dir < 2; dir++)
            for (int i = 0; i < L->n_layers; i++) {
                int j = dir == 0 ? i : L->n_layers - 1 - i;
                ct_pass pass = dir == 0 ? CT_PASS_FORWARD : CT_PASS_BACKWARD;
                ct_layer_io io;
                memset(&io, 0, sizeof io);
                ck_assert_int_eq(h.prepare(h.ctx, j, pass, &io, &err), CT_OK);
                for (int s = 0; s < ct_param_layout_layer_specs(L, j); s++) {
                    int v = ct_param_layout_layer_view(L, j, s);
                    if (v < 0 || !L->views[v].trainable) continue;
                    const ct_param_view *pv = &L->views[v];
                    if (parts & CT_STORE_PART_PARAMS) {
                        ck_assert_ptr_nonnull(io.p[s]);
                        ck_assert_mem_eq(io.p[s], whole + pv->offset, (size_t)pv->numel * sizeof(float));
                    }
                    if (pass != CT_PASS_BACKWARD) continue;
                    for (int64_t e = 0; e < pv->numel; e++) io.dp[s][e] += (float)ct_rng_normal(&rng);
                }
                ck_assert_int_eq(h.after(h.ctx, j, pass, &io, &err), CT_OK);
                if (rec_of(c)->gather_in_flight_max > out->max_in_flight)
                    out->max_in_flight = rec_of(c)->gather_in_flight_max;
            }
    ck_assert_int_eq(ct_partition_flush(z, &err), CT_OK);
    out->grads = malloc((size_t)L->n_params * sizeof(float));
    memcpy(out->grads, ct_param_store_part_grads(p), (size_t)L->n_params * sizeof(float));
    ct_partition_prefetch_counts(z, &out->prefetched, &out->used, &out->reused);
    out->gathers = rec_of(c)->gathers;
    ct_partition_free(z);
    ct_param_store_free(p);
    rec_close(c);
    ct_backend_destroy(be);
}

START_TEST(overlap_and_prefetch) {
    model m;
    model_open(&m);
    const int64_t n = m.L->n_params, big = 1000000;
    const unsigned z3 = CT_STORE_PART_GRADS | CT_STORE_PART_PARAMS;
    walk_result plain = {0}, over = {0}, pre = {0}, tight = {0}, none = {0}, one = {0}, z2 = {0}, z2o = {0};
    walk_result reuse = {0}, reuse_pre = {0};
    /* a micro-batch gathers 6 times (3 layers with parameters, forward and backward), each layer
     * in one span (weight and bias adjacent); ct_partition_refresh gathers nothing (threshold 0) */
    ct_partition_opts o = {.persistence_threshold = 0, .overlap = false, .prefetch_elems = 0, .max_live_elems = big};
    walk(&m, z3, &o, 3, &plain);
    ck_assert_int_eq(plain.gathers, 3 * 6);
    o.overlap = true;
    walk(&m, z3, &o, 3, &over);
    ck_assert_mem_eq(over.grads, plain.grads, (size_t)n * sizeof(float));
    ck_assert_int_eq(plain.prefetched + over.prefetched, 0);
    /* prefetch: the first micro-batch learns the order (nothing prefetched); from the second on,
     * every gather but the micro-batch's first (nothing crosses the boundary) is prefetched and
     * used: 5 of the 6 */
    o.prefetch_elems = big;
    walk(&m, z3, &o, 3, &pre);
    ck_assert_int_eq(pre.prefetched, 2 * 5);
    ck_assert_int_eq(pre.used, pre.prefetched);
    ck_assert_int_eq(pre.gathers, 3 * 6);
    ck_assert_mem_eq(pre.grads, plain.grads, (size_t)n * sizeof(float));
    /* a live limit of the two largest layers' elements: prefetched, never more in flight */
    int64_t largest = 13 * 7 + 8, second = 7 * 9 + 9;   /* (weight + bias, each view padded to 8) */
    o.max_live_elems = largest + second;
    walk(&m, z3, &o, 3, &tight);
    ck_assert_int_gt(tight.prefetched, 0);
    ck_assert_int_le(tight.max_in_flight, o.max_live_elems);
    ck_assert_int_eq(tight.used, tight.prefetched);
    ck_assert_mem_eq(tight.grads, plain.grads, (size_t)n * sizeof(float));
    /* no prefetch: a bucket of 0, or a live limit below any second layer */
    o.prefetch_elems = 0;
    o.max_live_elems = big;
    walk(&m, z3, &o, 3, &none);
    o.prefetch_elems = big;
    o.max_live_elems = 1;
    walk(&m, z3, &o, 3, &one);
    ck_assert_int_eq(none.prefetched + one.prefetched, 0);
    ck_assert_mem_eq(one.grads, plain.grads, (size_t)n * sizeof(float));
    /* reuse: the last layer's backward keeps its forward's parameters, and the next micro-batch's
     * first forward the parameters of the last backward (the same layer 0; nothing changed them
     * within the step): 5 gathers in the first micro-batch, 4 in the others; with prefetch too
     * (which skips the kept uses: 4 prefetched a micro-batch after the first) */
    o = (ct_partition_opts){.overlap = true, .max_live_elems = big, .max_reuse_elems = big};
    walk(&m, z3, &o, 3, &reuse);
    ck_assert_int_eq(reuse.reused, 3 + 2);
    ck_assert_int_eq(reuse.gathers, 5 + 4 + 4);
    ck_assert_mem_eq(reuse.grads, plain.grads, (size_t)n * sizeof(float));
    o.prefetch_elems = big;
    walk(&m, z3, &o, 3, &reuse_pre);
    ck_assert_int_eq(reuse_pre.reused, 3 + 2);
    ck_assert_int_eq(reuse_pre.gathers, 5 + 4 + 4);
    ck_assert_int_eq(reuse_pre.prefetched, 2 * 4);
    ck_assert_int_eq(reuse_pre.used, reuse_pre.prefetched);
    ck_assert_mem_eq(reuse_pre.grads, plain.grads, (size_t)n * sizeof(float));
    /* stage 2: gradients only, the same with and without overlap */
    o = (ct_partition_opts){.overlap = false, .max_live_elems = big};
    walk(&m, CT_STORE_PART_GRADS, &o, 3, &z2);
    o.overlap = true;
    walk(&m, CT_STORE_PART_GRADS, &o, 3, &z2o);
    ck_assert_mem_eq(z2o.grads, z2.grads, (size_t)n * sizeof(float));
    ck_assert_mem_eq(z2.grads, plain.grads, (size_t)n * sizeof(float));
    walk_result *all[] = {&plain, &over, &pre, &tight, &none, &one, &reuse, &reuse_pre, &z2, &z2o};
    for (int i = 0; i < 10; i++) free(all[i]->grads);
    model_close(&m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("partition");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, buckets_start_after_their_last_writer);
    tcase_add_test(tc, overlap_and_prefetch);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

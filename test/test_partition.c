/* test_partition.c: the gradient buckets of ZeRO stages 0-1 (core/zero/grad_buckets.h) and the
 * overlap and prefetch of stages 2-3 (core/zero/partition.h), driven hook by hook over the
 * communicator of test/thread_comm.h: on one rank, a recording communicator whose non-blocking
 * forms hand out real requests (the result only at wait), so the test sees what is in flight, in
 * which order it started, and when each request is waited for; on several, ranks on threads that
 * meet in every collective, so what ZeRO does across ranks is tested without mpirun.
 *
 * Checked: every bucket's last writer is the lowest layer with a trainable element in it (from
 * the layout, element by element); in an armed backward a bucket starts exactly after its last
 * writer's backward, in the fixed order, and finish starts the rest in that order (the same order
 * unarmed); stage 3 with prefetch learns the walk from the first micro-batch and then prefetches
 * every gather it later uses, never holding more gathered elements in flight than
 * stage3_max_live_parameters, each layer pointed at its own parameters; no prefetch with a bucket
 * of 0 or a live limit of one layer; with stage3_max_reuse_distance, the last layer's backward
 * keeps its forward's parameters (one gather fewer); the part's gradients after overlap equal those
 * without it, bit for bit (random gradients from every layer's backward over 3 micro-batches).
 * On 2, 3 and 4 ranks (ZeRO parts that do not divide the space, a tied head, ranks short of
 * micro-batches that walk with hooks only): every rank's part of the gradients is the sum over
 * ranks of every rank's gradients, bit for bit, at stages 2 and 3 with and without overlap,
 * prefetch, reuse and persistent small views, every layer reading its whole parameters at stage 3;
 * stages 0-1's buckets leave the whole sum on every rank. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/graph/layer.h"
#include "core/params/store.h"
#include "core/zero/grad_buckets.h"
#include "core/zero/partition.h"
#include "core/util/json.h"
#include "core/util/rng.h"
#include "test/model_text.h"
#include "test/thread_comm.h"

/* ---- the recording communicator: one rank of test/thread_comm.h ---- */

static ct_comm *rec_open(ct_backend *be) { return tcomm_open(tcomm_world_create(1), 0, be); }

static tc_rank *rec_of(ct_comm *c) { return tc_of(c); }

static void rec_close(ct_comm *c) {
    tcomm_world *w = tc_of(c)->w;
    tcomm_close(c);   /* everything started was waited for */
    tcomm_world_free(w);
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
    tc_rank *r = rec_of(c);
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

/* ---- several ranks (threads meeting over test/thread_comm.h) ---- */

/* Rank q's gradient of element e of view v (layer j's spec s) in micro-batch mb: a pure function,
 * so the test can sum every rank's itself. */
static float rank_grad(int q, int mb, int j, int v, int64_t e) {
    uint32_t h = (uint32_t)(q * 7919 + mb * 104729 + j * 1299709 + v * 15485863) ^ (uint32_t)e * 2654435761u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    return (float)(int)(h % 2001u - 1000u) / 256.0f;
}

/* Layer j's trainable views (spec order), as the walks write them. */
static int spec_views(const ct_param_layout *L, int j, int out[CT_LAYER_MAX_PARAMS]) {
    int k = 0;
    for (int s = 0; s < ct_param_layout_layer_specs(L, j); s++) {
        int v = ct_param_layout_layer_view(L, j, s);
        out[s] = v >= 0 && L->views[v].trainable ? v : -1;
        k = s + 1;
    }
    return k;
}

typedef struct ranks_run {
    const model *m;
    tcomm_world *w;
    unsigned parts;              /* 0: stages 0-1 (whole gradients, buckets of `bucket`) */
    ct_partition_opts o;
    int64_t bucket;
    int micro[TCOMM_MAX_RANKS];  /* micro-batches each rank runs (the others walk hooks only) */
    const float *whole;          /* [n_params] the parameters every layer must see */
    float *grads[TCOMM_MAX_RANKS];   /* each rank's part of the summed gradients after the step */
    long gathers[TCOMM_MAX_RANKS];
} ranks_run;

/* One rank's step: micro[0] walks of forward and backward through its hooks (ZeRO-2/3), each
 * layer checking that it reads the whole parameters and adding its gradients; a walk past the
 * rank's own micro-batches joins with hooks only. Stages 0-1: its micro-batches' gradients added
 * into whole gradients, the buckets armed on its last and finished. */
static void rank_step(int rank, void *ctx) {
    ranks_run *k = ctx;
    const ct_param_layout *L = k->m->L;
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = tcomm_open(k->w, rank, be);
    int64_t lo = 0, hi = L->n_params;
    if (k->parts) ct_comm_shard(L->n_params, c->world, rank, &lo, &hi);
    ct_param_store *p = NULL;
    ct_partition *z = NULL;
    ct_grad_buckets *gb = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_param_store_create(L, be, CT_F32, lo, hi, k->parts, &p, &err), CT_OK);
    ct_param_store_init(p, 11);
    ct_exec_hooks h = {0};
    if (k->parts) {
        ck_assert_msg(ct_partition_create(p, c, &k->o, &z, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ct_partition_refresh(z, &err), CT_OK);
        h = ct_partition_hooks(z);
    } else {
        gb = ct_grad_buckets_create(L, p->grads, k->bucket, c, k->o.overlap);
        h = ct_grad_buckets_hooks(gb);
    }
    int walks = k->parts ? k->micro[0] : k->micro[rank];
    for (int mb = 0; mb < walks; mb++) {
        bool own = mb < k->micro[rank];
        if (gb) ct_grad_buckets_arm(gb, mb == walks - 1);
        for (int dir = 0; dir < 2; dir++)
            for (int i = 0; i < L->n_layers; i++) {
                int j = dir == 0 ? i : L->n_layers - 1 - i;
                ct_pass pass = dir == 0 ? CT_PASS_FORWARD : CT_PASS_BACKWARD;
                ct_layer_io io;
                memset(&io, 0, sizeof io);
                if (h.prepare) ck_assert_int_eq(h.prepare(h.ctx, j, pass, &io, &err), CT_OK);
                int views[CT_LAYER_MAX_PARAMS], ns = spec_views(L, j, views);
                for (int s = 0; s < ns; s++) {
                    if (views[s] < 0) continue;
                    const ct_param_view *pv = &L->views[views[s]];
                    if (k->parts & CT_STORE_PART_PARAMS)
                        ck_assert_msg(memcmp(io.p[s], k->whole + pv->offset, (size_t)pv->numel * sizeof(float)) == 0,
                                      "rank %d, layer %d pass %d: %s is not the whole parameter", rank, j, pass,
                                      pv->name);
                    if (pass != CT_PASS_BACKWARD || !own) continue;
                    float *dp = k->parts ? io.dp[s] : p->grads + pv->offset;
                    for (int64_t e = 0; e < pv->numel; e++) dp[e] += rank_grad(rank, mb, j, views[s], e);
                }
                if (h.after) ck_assert_int_eq(h.after(h.ctx, j, pass, &io, &err), CT_OK);
            }
    }
    if (z) ck_assert_int_eq(ct_partition_flush(z, &err), CT_OK);
    else ck_assert_int_eq(ct_grad_buckets_finish(gb, &err), CT_OK);
    k->grads[rank] = malloc(sizeof(float) * (size_t)(hi - lo + 1));
    memcpy(k->grads[rank], ct_param_store_part_grads(p), sizeof(float) * (size_t)(hi - lo));
    k->gathers[rank] = tc_of(c)->gathers;
    ct_partition_free(z);
    ct_grad_buckets_free(gb);
    ct_param_store_free(p);
    tcomm_close(c);
    ct_backend_destroy(be);
}

/* The summed gradients, added in the order the ranks' step adds them: ZeRO-2/3 per micro-batch,
 * layer by layer from the top, each a sum over ranks in rank order (a rank past its micro-batches
 * adds zeros); stages 0-1 each rank's own sum over its micro-batches, then the sum over ranks. */
static float *expected_grads(const ranks_run *k, int world) {
    const ct_param_layout *L = k->m->L;
    float *want = calloc((size_t)L->n_params + 1, sizeof(float));
    int most = 0;
    for (int q = 0; q < world; q++) most = k->micro[q] > most ? k->micro[q] : most;
    float *own = calloc((size_t)(world * L->n_params) + 1, sizeof(float));
    for (int mb = 0; mb < most; mb++)
        for (int j = L->n_layers - 1; j >= 0; j--) {
            int views[CT_LAYER_MAX_PARAMS], ns = spec_views(L, j, views);
            for (int s = 0; s < ns; s++) {
                if (views[s] < 0) continue;
                const ct_param_view *pv = &L->views[views[s]];
                for (int64_t e = 0; e < pv->numel; e++) {
                    float sum = 0;
                    for (int q = 0; q < world; q++) {
                        float g = mb < k->micro[q] ? rank_grad(q, mb, j, views[s], e) : 0.0f;
                        sum = q == 0 ? g : sum + g;
                        own[q * L->n_params + pv->offset + e] += g;
                    }
                    if (k->parts) want[pv->offset + e] += sum;
                }
            }
        }
    if (!k->parts)
        for (int64_t e = 0; e < L->n_params; e++) {
            float sum = own[e];
            for (int q = 1; q < world; q++) sum += own[q * L->n_params + e];
            want[e] = sum;
        }
    free(own);
    return want;
}

/* A step over `world` ranks: every rank's part of the gradients is the sum over ranks, bit for
 * bit, and (ZeRO-3) every layer saw its whole parameters. Returns the gathers rank 0 started. */
static long step_on_ranks(const model *m, int world, unsigned parts, const ct_partition_opts *o, int64_t bucket,
                          const int *micro, const char *what) {
    const ct_param_layout *L = m->L;
    ranks_run k = {.m = m, .w = tcomm_world_create(world), .parts = parts, .o = *o, .bucket = bucket};
    memcpy(k.micro, micro, sizeof(int) * (size_t)world);
    /* the whole parameters, as one process initialises them (a part draws only its elements) */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_param_store *whole = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_param_store_create(L, be, CT_F32, 0, L->n_params, CT_STORE_WHOLE, &whole, &err), CT_OK);
    ct_param_store_init(whole, 11);
    k.whole = whole->master;
    tcomm_run(world, rank_step, &k);
    float *want = expected_grads(&k, world);
    for (int q = 0; q < world; q++) {
        int64_t lo = 0, hi = L->n_params;
        if (parts) ct_comm_shard(L->n_params, world, q, &lo, &hi);
        for (int64_t e = lo; e < hi; e++)
            ck_assert_msg(k.grads[q][e - lo] == want[e], "%s, %d ranks: rank %d's gradient %lld is %g, the sum %g", what,
                          world, q, (long long)e, (double)k.grads[q][e - lo], (double)want[e]);
        free(k.grads[q]);
    }
    free(want);
    ct_param_store_free(whole);
    ct_backend_destroy(be);
    tcomm_world_free(k.w);
    return k.gathers[0];
}

/* A model with a tied head (its weight is the embedding's: gathered and reduced by both layers). */
static void tied_model_open(model *m) {
    static const char text[] = "{\"input\": [5], \"layers\": [{\"type\": \"embedding\", \"name\": \"emb\", \"vocab\": 11, "
                               "\"dim\": 6}, {\"type\": \"linear\", \"out\": 6}, {\"type\": \"gelu\"}, "
                               "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 11, \"bias\": false, "
                               "\"tie\": \"emb.weight\"}], \"loss\": {\"type\": \"cross_entropy\"}}";
    memset(m, 0, sizeof *m);
    ct_err err = {0};
    model_text(text, &m->cfg, &m->doc);
    ck_assert_msg(ct_graph_build(&m->cfg, 2, CT_F32, &m->g, &err) == CT_OK, "%s", err.msg);
    m->L = ct_graph_layout(m->g);
}

/* ZeRO-2 and -3 on 2, 3 and 4 ranks (parts that do not divide the space; a span that crosses a
 * part boundary), overlap or not, prefetch and reuse or not, small views persistent or not, and
 * ranks short of micro-batches (the last one runs none in the 3-rank step): each rank's part of
 * the gradients is the sum over ranks of what every rank's layers wrote, and every layer read its
 * whole parameters. Stages 0-1's buckets: every rank ends with the whole sum. */
START_TEST(ranks_sum_their_gradients) {
    model ms[2];
    model_open(&ms[0]);
    tied_model_open(&ms[1]);
    const int64_t big = 1000000;
    const int micro[][4] = {{2, 2, 2, 2}, {3, 2, 0, 1}};
    const ct_partition_opts opts[] = {
        {.persistence_threshold = 0, .overlap = false, .max_live_elems = big},
        {.persistence_threshold = 0, .overlap = true, .prefetch_elems = big, .max_live_elems = big},
        {.persistence_threshold = 20, .overlap = true, .prefetch_elems = 100, .max_live_elems = 200,
         .max_reuse_elems = big}};
    for (int mi = 0; mi < 2; mi++)
        for (int world = 2; world <= 4; world++)
            for (int u = 0; u < 2; u++) {
                const int *mic = micro[u];
                if (u == 1 && world != 3) continue;
                for (int oi = 0; oi < 3; oi++) {
                    char what[96];
                    snprintf(what, sizeof what, "model %d, opts %d, micro-batches %d %d %d %d", mi, oi, mic[0], mic[1],
                             mic[2], mic[3]);
                    step_on_ranks(&ms[mi], world, CT_STORE_PART_GRADS, &opts[oi], 0, mic, what);
                    long g3 = step_on_ranks(&ms[mi], world, CT_STORE_PART_GRADS | CT_STORE_PART_PARAMS, &opts[oi], 0,
                                            mic, what);
                    ck_assert_int_gt(g3, 0);
                }
                for (int overlap = 0; overlap < 2; overlap++) {
                    ct_partition_opts o = {.overlap = overlap};
                    step_on_ranks(&ms[mi], world, 0, &o, 37, mic, "stages 0-1, buckets of 37");
                    step_on_ranks(&ms[mi], world, 0, &o, 0, mic, "stages 0-1, one bucket");
                }
            }
    model_close(&ms[0]);
    model_close(&ms[1]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("partition");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, buckets_start_after_their_last_writer);
    tcase_add_test(tc, overlap_and_prefetch);
    tcase_add_test(tc, ranks_sum_their_gradients);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* grad_buckets.c: stage 0-1's gradient buckets, reduced during or after backward (grad_buckets.h). */
#include "core/zero/grad_buckets.h"

#include <stdlib.h>

#include "core/graph/layer.h"

typedef struct bucket {
    int64_t at, len;
    int last_writer;             /* the lowest layer writing into it; -1: none (padding only) */
    ct_comm_req *req;
    bool started, done;
} bucket;

struct ct_grad_buckets {
    ct_comm *c;
    float *grads;
    bool overlap, armed;
    int n;                       /* buckets, in the fixed order of their starts */
    bucket *b;
    int next;                    /* the first bucket of that order not started yet */
};

/* The fixed order: later last writer first (backward reaches it first); padding-only buckets last;
 * ties by offset. */
static int by_start_order(const void *x, const void *y) {
    const bucket *a = x, *b = y;
    if (a->last_writer != b->last_writer) return a->last_writer > b->last_writer ? -1 : 1;
    return (a->at > b->at) - (a->at < b->at);
}

ct_grad_buckets *ct_grad_buckets_create(const ct_param_layout *L, float *grads, int64_t bucket_elems, ct_comm *c,
                                        bool overlap) {
    int64_t n = L->n_params;
    if (bucket_elems <= 0 || bucket_elems > n) bucket_elems = n > 0 ? n : 1;
    ct_grad_buckets *g = ct_xcalloc(1, sizeof *g);
    g->c = c;
    g->grads = grads;
    g->overlap = overlap;
    g->n = (int)((n + bucket_elems - 1) / bucket_elems);
    g->b = ct_xcalloc((size_t)(g->n > 0 ? g->n : 1), sizeof *g->b);
    for (int i = 0; i < g->n; i++) {
        int64_t at = (int64_t)i * bucket_elems;
        g->b[i] = (bucket){.at = at, .len = n - at < bucket_elems ? n - at : bucket_elems, .last_writer = -1};
    }
    /* a layer's trainable views (its tied ones included) mark the buckets they overlap */
    for (int j = L->n_layers - 1; j >= 0; j--)
        for (int s = 0; s < ct_param_layout_layer_specs(L, j); s++) {
            int v = ct_param_layout_layer_view(L, j, s);
            if (v < 0 || !L->views[v].trainable || L->views[v].numel == 0) continue;
            int64_t first = L->views[v].offset / bucket_elems;
            int64_t last = (L->views[v].offset + L->views[v].numel - 1) / bucket_elems;
            for (int64_t i = first; i <= last && i < g->n; i++) g->b[i].last_writer = j;
        }
    qsort(g->b, (size_t)g->n, sizeof *g->b, by_start_order);
    return g;
}

void ct_grad_buckets_free(ct_grad_buckets *g) {
    if (!g) return;
    free(g->b);
    free(g);
}

static int start(ct_grad_buckets *g, bucket *b, ct_err *err) {
    b->started = true;
    b->done = false;
    return g->c->start_all_reduce(g->c, g->grads + b->at, b->len, CT_F32, CT_REDUCE_SUM, &b->req, err);
}

/* After a layer: in the armed backward, start the buckets whose last writer is done (a layer that
 * runs no backward calls no hook: its buckets start with the next layer's); then move every
 * bucket in flight on (OpenMPI advances them only inside MPI calls). */
static int after_layer(void *ctx, int j, ct_pass pass, const ct_layer_io *io, ct_err *err) {
    ct_grad_buckets *g = ctx;
    if (pass != CT_PASS_BACKWARD || !g->armed) return CT_OK;
    for (; g->next < g->n && g->b[g->next].last_writer >= j; g->next++) {
        int rc = start(g, &g->b[g->next], err);
        if (rc) return rc;
    }
    for (int i = 0; i < g->next; i++) {
        if (g->b[i].done) continue;
        int rc = g->c->test(g->c, g->b[i].req, &g->b[i].done, err);
        if (rc) return rc;
    }
    return CT_OK;
}

ct_exec_hooks ct_grad_buckets_hooks(ct_grad_buckets *g) {
    return (ct_exec_hooks){.ctx = g, .after = after_layer, .host_work = true};
}

void ct_grad_buckets_arm(ct_grad_buckets *g, bool last_micro_batch) { g->armed = g->overlap && last_micro_batch; }

int ct_grad_buckets_finish(ct_grad_buckets *g, ct_err *err) {
    int rc = CT_OK;
    for (; g->next < g->n && !rc; g->next++) rc = start(g, &g->b[g->next], err);
    /* in start order; after an error the rank ends (the others then end too), so what is still in
     * flight is left to it */
    for (int i = 0; i < g->n && !rc; i++) {
        if (!g->b[i].started) continue;
        rc = g->c->wait(g->c, g->b[i].req, err);
        g->b[i].started = false;
        g->b[i].req = NULL;
    }
    g->next = 0;
    g->armed = false;
    return rc;
}

int ct_grad_buckets_count(const ct_grad_buckets *g) { return g->n; }

void ct_grad_buckets_at(const ct_grad_buckets *g, int order, int64_t *at, int64_t *len, int *last_writer) {
    *at = g->b[order].at;
    *len = g->b[order].len;
    *last_writer = g->b[order].last_writer;
}

/* lifetime.c: when the step uses each buffer, and placing buffers by lifetime.
 *
 * The step is one time axis: forward of layer j at time j, the loss at n (n layers), then
 * backward as exec.c walks it (entering a checkpointed segment from above recomputes the layers
 * of it that backward needs, each at a time of its own, then each layer's backward). A buffer is
 * busy over one or two closed intervals of that axis, from its first use to its last: a backward
 * counts as a use only when its type reads that buffer (ct_layer_type.backward_reads_input and
 * backward_reads_output), so an output read in backward by nobody (a residual branch's, read only
 * by the add) is free once forward is done with it. Buffers whose intervals never overlap may
 * share bytes. plan.c places the
 * layers' outputs, saved state and output gradients this way in one region (ct_lifetime_pack),
 * offload.c the device slots of offloaded outputs. */
#include <limits.h>
#include <stdlib.h>

#include "core/graph/internal.h"

void ct_graph_schedule(ct_graph *g) {
    int n = g->n_nodes, t = n + 1;
    for (int j = 0; j < n; j++) g->nodes[j].t_recompute = -1;
    for (int j = n - 1; j >= 0; j--) {
        ct_gnode *gn = &g->nodes[j];
        if (gn->seg >= 0 && j == g->segs[gn->seg].hi - 1)
            for (int r = g->segs[gn->seg].lo; r <= j; r++)
                if (g->nodes[r].recomputed) g->nodes[r].t_recompute = t++;
        gn->t_backward = t++;
    }
}

int ct_graph_schedule_end(const ct_graph *g) { return g->n_nodes ? g->nodes[0].t_backward + 1 : 1; }

int ct_segment_entry(const ct_graph *g, int s) {
    for (int j = g->segs[s].lo; j < g->segs[s].hi; j++)
        if (g->nodes[j].t_recompute >= 0) return g->nodes[j].t_recompute;
    return g->nodes[g->segs[s].hi - 1].t_backward;
}

void ct_span_touch(ct_span *s, int t) {
    if (t < 0) return;
    if (t < s->lo) s->lo = t;
    if (t > s->hi) s->hi = t;
}

bool ct_span_overlap(ct_span a, ct_span b) { return a.lo <= b.hi && b.lo <= a.hi; }

/* Whether layer j's backward reads the buffer it writes (member) or reads as an input (reads).
 * A producer that may apply the in-place activation over it (fuse_act) reads it too: fuse.c
 * decides at bind, after the plan, and the fused backward masks with that output. The last
 * layer's backward reads the loss's gradient, which the loss may write over its output (plan.c). */
static bool backward_reads(const ct_graph *g, int j, bool member, bool reads) {
    const ct_gnode *gn = &g->nodes[j];
    const ct_layer_type *t = gn->l.type;
    if (!gn->runs_backward) return false;
    if (member && (t->backward_reads_output || t->fuse_act || j == g->n_nodes - 1)) return true;
    return reads && ct_layer_backward_reads_input(&gn->l);
}

void ct_buffer_uses(const ct_graph *g, const int *root, int o, ct_span *fw, ct_span *bw, int *written) {
    int n = g->n_nodes;
    *fw = *bw = (ct_span){INT_MAX, -1};
    *written = o;
    for (int j = o; j < n; j++) {
        const ct_gnode *gn = &g->nodes[j];
        bool member = root[j] == o, reads = false;
        for (int i = 0; i < gn->l.n_in; i++) reads |= gn->l.in_from[i] >= 0 && root[gn->l.in_from[i]] == o;
        if (!member && !reads) continue;
        if (member) *written = j;
        ct_span_touch(fw, j);
        ct_span_touch(bw, gn->t_recompute);   /* -1 (no change) unless it is recomputed */
        if (backward_reads(g, j, member, reads)) ct_span_touch(bw, gn->t_backward);
        if (member && j == n - 1) ct_span_touch(bw, n);   /* the loss reads the last output */
    }
}

static bool busy_together(const ct_lifetime_item *a, const ct_lifetime_item *b) {
    for (int i = 0; i < a->n_when; i++)
        for (int k = 0; k < b->n_when; k++)
            if (ct_span_overlap(a->when[i], b->when[k])) return true;
    return false;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Placement orders to try: greedy placement is a heuristic, and which order packs best depends
 * on the graph, so each is tried and the smallest region kept. By size: big buffers take the low
 * offsets and small ones fill the gaps. By start: the step's own order, as a stack would grow.
 * By size x duration: the buffers that constrain the most first. Ties keep index order. */
enum { BY_SIZE, BY_START, BY_AREA, N_ORDERS };

static double order_key(const ct_lifetime_item *it, int how) {
    int start = it->when[0].lo, busy = 0;
    for (int w = 0; w < it->n_when; w++) busy += it->when[w].hi - it->when[w].lo + 1;
    switch (how) {
    case BY_SIZE: return (double)it->size;
    case BY_START: return -(double)start;
    default: return (double)it->size * busy;
    }
}

/* Insertion sort, larger key first: a graph has a few hundred buffers, and the order must not
 * depend on the C library's sort. */
static void order_items(const ct_lifetime_item *items, int n, int how, int *order) {
    for (int i = 0; i < n; i++) {
        double key = order_key(&items[i], how);
        int at = i;
        while (at > 0 && order_key(&items[order[at - 1]], how) < key) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = i;
    }
}

/* A placed neighbour's byte range. */
typedef struct range {
    size_t lo, hi;
} range;

static int by_lo(const void *pa, const void *pb) {
    const range *a = pa, *b = pb;
    return (a->lo > b->lo) - (a->lo < b->lo);
}

/* Place the items in `order`, each at the lowest offset clear of every item placed before it
 * that is busy at the same time; offsets go to off[]. Returns the region's size. */
static size_t place_in_order(const ct_lifetime_item *items, int n, const int *order, size_t *off, range *taken) {
    size_t end = 0;
    for (int k = 0; k < n; k++) {
        const ct_lifetime_item *it = &items[order[k]];
        size_t need = align64(it->size);
        int m = 0;
        for (int p = 0; p < k; p++) {
            const ct_lifetime_item *q = &items[order[p]];
            if (busy_together(it, q)) taken[m++] = (range){off[order[p]], off[order[p]] + align64(q->size)};
        }
        qsort(taken, (size_t)m, sizeof(range), by_lo);
        size_t at = 0;
        for (int p = 0; p < m && taken[p].lo < at + need; p++)
            if (taken[p].hi > at) at = taken[p].hi;
        off[order[k]] = at;
        if (at + need > end) end = at + need;
    }
    return end;
}

size_t ct_lifetime_pack(ct_lifetime_item *items, int n) {
    size_t cap = (size_t)(n ? n : 1);
    int *order = ct_xmalloc(sizeof(int) * cap);
    range *taken = ct_xmalloc(sizeof(range) * cap);
    size_t *off = ct_xmalloc(sizeof(size_t) * cap), best = 0;
    for (int how = 0; how < N_ORDERS; how++) {
        order_items(items, n, how, order);
        size_t end = place_in_order(items, n, order, off, taken);
        if (how > 0 && end >= best) continue;
        best = end;
        for (int i = 0; i < n; i++) items[i].off = off[i];
    }
    free(order), free(taken), free(off);
    return best;
}

/* plan.c: the activation plan, a pure function of the graph, micro-batch and dtype: byte offsets
 * in one arena for the layers' outputs (relu-like layers overwrite their input in place), their
 * gradients (slots shared by lifetime; the loss's written over the logits), forward-to-backward
 * state, the shared workspace and fan-out scratch, all in the graph's dtype (2 bytes per element
 * under mixed precision). Binding (ct_graph_bind) turns the offsets into pointers on a backend.
 *
 * Activation checkpointing (segments.c): a checkpointed segment's inner outputs and every saved
 * state of its layers live only from its forward to the next segment's, and again from its
 * recompute to its backward, so all segments share one recompute buffer as large as the largest
 * segment's. What leaves a segment (its last output, an output read by a later layer: a residual
 * crossing the boundary) is kept in a buffer of its own, as without checkpointing. */
#include <stdlib.h>

#include "core/graph/internal.h"

/* Decide, once, where each input gradient goes during backward. Walking layers in reverse, the
 * first consumer of an activation to run writes its gradient straight into the producer's dy; any
 * later one writes to scratch that the executor then adds in. A layer whose output no gradient
 * reaches (a dead end that is not the last layer) is skipped. Returns the scratch floats needed. */
static int64_t plan_backward(ct_graph *g, int64_t batch) {
    bool *ready = ct_xcalloc((size_t)g->n_nodes, sizeof(bool));
    int64_t need = 0;
    ready[g->n_nodes - 1] = true;
    g->nodes[g->n_nodes - 1].grad_start = -1;   /* written from the loss before the walk */
    for (int j = g->n_nodes - 1; j >= 0; j--) {
        ct_gnode *gn = &g->nodes[j];
        gn->runs_backward = ready[j];
        int64_t off = 0;
        for (int i = 0; i < gn->l.n_in; i++) {
            int src = gn->l.in_from[i];
            gn->tmp_off[i] = -1;
            if (src < 0 || !ready[j]) continue;
            if (ready[src]) {
                gn->tmp_off[i] = off;
                off += batch * ct_layer_in_numel(&gn->l, i);
            } else {
                g->nodes[src].grad_start = g->n_nodes - 1 - j;
            }
            ready[src] = true;
        }
        if (off > need) need = off;
    }
    free(ready);
    return need;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* A layer that ran in place over its producer (alias[j] = src) also runs its backward in place:
 * in-place layers are element-wise (relu-like), and their backward (act_backward) reads dy[i]
 * before it writes dx[i], so the producer's dy can be the layer's own dy. True when node k's dy
 * is its in-place consumer's. */
static bool grad_in_place(const ct_graph *g, const int *alias, int k, int *consumer) {
    for (int j = k + 1; j < g->n_nodes; j++)
        if (alias[j] == k) {
            *consumer = j;
            return g->nodes[j].runs_backward && g->nodes[k].runs_backward && g->nodes[j].tmp_off[0] < 0;
        }
    return false;
}

/* The loss writes its gradient over the logits (backend.h: every loss may): the last layer's dy is
 * its y, so a 50k-vocabulary head costs one logits buffer, not two. Allowed when the last layer
 * owns its output (it did not run in place over its producer, whose y would be lost) and its
 * backward reads only its input. After a train-mode loss the last activation holds the gradient:
 * nothing reads the logits after the loss (accuracy is counted inside it), and a recompute of the
 * last layer would have to come before the loss. */
static bool loss_grad_in_place(const ct_graph *g, const int *alias) {
    int last = g->n_nodes - 1;
    return alias[last] < 0 && !g->nodes[last].l.type->backward_reads_output;
}

/* Output gradients live only from the backward step that first writes them to the step of their
 * own layer, so they share memory: each gets a slot free by then (best fit, else the largest free
 * slot grown to fit, else a new one). A chain needs two slots instead of one per layer, and a
 * layer that runs in place shares its producer's slot (relu after conv: one conv-sized slot, not
 * two). Writes each node's slot into slot_of[] and slot sizes into size[]; returns the number of
 * slots. */
static int plan_grad_slots(const ct_graph *g, const int *alias, int64_t batch, int *slot_of, size_t *size) {
    int n = g->n_nodes, n_slots = 0;
    int *order = ct_xmalloc(sizeof(int) * (size_t)n), *busy_until = ct_xmalloc(sizeof(int) * (size_t)n);
    int m = 0;
    for (int k = 0; k < n; k++) {
        slot_of[k] = -1;
        if (!g->nodes[k].runs_backward || (k == n - 1 && loss_grad_in_place(g, alias))) continue;
        int at = m++;   /* insertion sort by grad_start */
        while (at > 0 && g->nodes[order[at - 1]].grad_start > g->nodes[k].grad_start) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = k;
    }
    for (int i = 0; i < m; i++) {
        int k = order[i], best = -1, consumer, last = k;
        if (grad_in_place(g, alias, k, &consumer)) {   /* the consumer's slot, reserved below */
            slot_of[k] = slot_of[consumer];
            continue;
        }
        /* the slot stays busy until the last producer sharing it has run its backward */
        while (alias[last] >= 0 && grad_in_place(g, alias, alias[last], &consumer)) last = alias[last];
        size_t need = align64((size_t)(batch * ct_layer_out_numel(&g->nodes[k].l)) * ct_dtype_size(g->dt));
        for (int s = 0; s < n_slots; s++) {
            if (busy_until[s] >= g->nodes[k].grad_start) continue;
            bool fits = size[s] >= need, best_fits = best >= 0 && size[best] >= need;
            if (best < 0 || (fits && (!best_fits || size[s] < size[best])) || (!fits && !best_fits && size[s] > size[best]))
                best = s;
        }
        if (best < 0) size[best = n_slots++] = 0;
        if (size[best] < need) size[best] = need;
        busy_until[best] = n - 1 - last;
        slot_of[k] = best;
    }
    free(order);
    free(busy_until);
    return n_slots;
}

/* A layer runs in place (its output replaces its input) when its type allows it, its input is an
 * earlier layer's output that nothing else reads (one consumer) and whose own backward does not
 * read it. Returns the producer whose buffer layer j reuses, or -1. */
static int in_place_source(const ct_graph *g, int j) {
    const ct_layer *l = &g->nodes[j].l;
    if (!l->type->in_place || l->n_in != 1 || l->in_from[0] < 0 || !l->type->in_place(l)) return -1;
    int src = l->in_from[0];
    if (g->nodes[src].l.type->backward_reads_output) return -1;
    /* a segment's recompute reads what enters it again: no layer of it may overwrite that */
    if (g->nodes[j].seg >= 0 && g->nodes[src].seg != g->nodes[j].seg) return -1;
    for (int k = src + 1; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].l.n_in; i++)
            if (g->nodes[k].l.in_from[i] == src && k != j) return -1;
    return src;
}

/* Which outputs of checkpointed layers are kept through backward (gn->kept): a segment's last
 * one, any read by a layer after its segment, and the producer whose buffer a kept in-place
 * output is (alias[] chains point backwards, so one reverse walk follows them). */
static void mark_kept(ct_graph *g, const int *alias) {
    for (int j = 0; j < g->n_nodes; j++) {
        ct_gnode *gn = &g->nodes[j];
        gn->kept = gn->seg >= 0 && j == g->segs[gn->seg].hi - 1;
    }
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].l.n_in; i++) {
            int src = g->nodes[k].l.in_from[i];
            if (src >= 0 && g->nodes[src].seg >= 0 && g->nodes[src].seg != g->nodes[k].seg) g->nodes[src].kept = true;
        }
    for (int j = g->n_nodes - 1; j >= 0; j--)
        if (g->nodes[j].kept && alias[j] >= 0) g->nodes[alias[j]].kept = true;
}

/* Bytes of part p appended at *end (64-byte aligned): returns its offset. */
static size_t take(size_t *end, size_t bytes) {
    size_t off = *end;
    *end += align64(bytes);
    return off;
}

void ct_graph_plan_memory(ct_graph *g) {
    int64_t batch = g->batch;
    size_t esz = ct_dtype_size(g->dt), ws = 0, end = 0;
    ct_act_plan *p = &g->plan;
    p->device_scratch = 0;
    int *alias = ct_xmalloc(sizeof(int) * (size_t)g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const ct_layer *l = &g->nodes[i].l;
        alias[i] = in_place_source(g, i);
        size_t w = l->type->workspace_bytes ? l->type->workspace_bytes(l, batch, g->dt) : 0;
        if (w > ws) ws = w;
        size_t d = l->type->device_scratch_bytes ? l->type->device_scratch_bytes(l, batch, g->dt) : 0;
        if (d > p->device_scratch) p->device_scratch = d;
        g->info.flops_per_sample += l->type->flops ? l->type->flops(l) : 0.0;
    }
    size_t tmp = (size_t)plan_backward(g, batch) * esz;
    int *slot_of = ct_xmalloc(sizeof(int) * (size_t)g->n_nodes);
    size_t *slot_size = ct_xmalloc(sizeof(size_t) * (size_t)g->n_nodes), *slot_off = NULL;
    int n_slots = plan_grad_slots(g, alias, batch, slot_of, slot_size);

    mark_kept(g, alias);
    /* Activation offload: checkpointed segments' kept outputs share slots by lifetime, with a
     * pinned host copy each (offload.c); none without it. */
    size_t offload_slots = ct_offload_plan(g, alias, &p->host);
    p->offloaded = 0;
    for (int i = 0; i < g->n_off; i++) p->offloaded += g->off[i].moved;

    /* Arena order: gradient slots, then the offload slots, then per layer its output and aux,
     * then the recompute buffer (checkpointed segments' inner outputs and aux, at offsets from its
     * start: seg_end[s] is segment s's use of it so far), then the shared parts. */
    slot_off = ct_xmalloc(sizeof(size_t) * (size_t)(n_slots ? n_slots : 1));
    for (int s = 0; s < n_slots; s++) slot_off[s] = take(&end, slot_size[s]);
    p->grads = end;
    size_t offload_off = take(&end, offload_slots);
    p->outputs += end - offload_off;
    bool *in_slot = ct_xcalloc((size_t)g->n_nodes, sizeof(bool));
    for (int i = 0; i < g->n_off; i++) in_slot[g->off[i].owner] = true;
    size_t *seg_end = ct_xcalloc((size_t)(g->n_segs ? g->n_segs : 1), sizeof(size_t)), region = 0;
    bool *y_in_region = ct_xcalloc((size_t)g->n_nodes, sizeof(bool));
    for (int i = 0; i < g->n_nodes; i++) {
        ct_gnode *gn = &g->nodes[i];
        size_t y_bytes = (size_t)(batch * ct_layer_out_numel(&gn->l)) * esz;
        size_t aux_bytes = gn->l.type->aux_bytes ? gn->l.type->aux_bytes(&gn->l, batch, g->dt) : 0;
        size_t *at_end = gn->seg >= 0 ? &seg_end[gn->seg] : &end, before = end;
        gn->y_from = alias[i];
        y_in_region[i] = alias[i] < 0 && gn->seg >= 0 && !gn->kept;
        gn->y_off = alias[i] >= 0 || in_slot[i] ? CT_NO_OFFSET : take(y_in_region[i] ? at_end : &end, y_bytes);
        p->outputs += end - before;
        before = end;
        gn->aux_off = gn->l.type->aux_bytes ? take(at_end, aux_bytes) : CT_NO_OFFSET;
        p->aux += end - before;
        gn->dy_off = slot_of[i] >= 0 ? slot_off[slot_of[i]] : CT_NO_OFFSET;
        if (gn->seg >= 0 && seg_end[gn->seg] > region) region = seg_end[gn->seg];
    }
    size_t region_off = take(&end, region);
    p->recompute = region;
    p->segments = g->n_segs;
    for (int i = 0; i < g->n_nodes; i++) {   /* the recompute buffer's offsets are from its start */
        ct_gnode *gn = &g->nodes[i];
        if (y_in_region[i]) gn->y_off += region_off;
        if (gn->seg >= 0 && gn->aux_off != CT_NO_OFFSET) gn->aux_off += region_off;
    }
    for (int i = 0; i < g->n_off; i++) g->nodes[g->off[i].owner].y_off = offload_off + g->off[i].slot;
    free(seg_end), free(y_in_region), free(in_slot);
    ct_gnode *last = &g->nodes[g->n_nodes - 1];
    if (last->runs_backward && loss_grad_in_place(g, alias)) last->dy_off = last->y_off;
    /* A float model input is converted to a 16-bit copy the first layers read. */
    bool converts_input = g->dt != CT_F32 && g->info.input_dtype != CT_I32;
    size_t at = end;
    g->ws_off = take(&end, ws);
    p->workspace = end - at;
    at = end;
    g->dtmp_off = take(&end, tmp);
    p->scratch = end - at;
    at = end;
    g->input_off = converts_input ? take(&end, (size_t)(batch * ct_shape_numel(&g->info.input_shape)) * esz)
                                  : CT_NO_OFFSET;
    p->input = end - at;
    at = end;
    g->loss_off = take(&end, 2 * sizeof(float));   /* loss_result[2] */
    p->loss = end - at;
    p->total = end;
    free(slot_of), free(slot_size), free(slot_off), free(alias);
}

static void *at_offset(void *arena, size_t off) { return off == CT_NO_OFFSET ? NULL : (char *)arena + off; }

int ct_graph_bind(ct_graph *g, ct_backend *be, void *arena, ct_err *err) {
    bool owns = arena == NULL;
    /* the offloaded activations' host copies: pinned memory of the backend that copies them */
    if (g->plan.host && g->host_be != be) {
        void *host = be->mem.alloc_host_pinned(be, g->plan.host);
        if (!host)
            return ct_errf(err, CT_ERR_RUNTIME, "out of pinned host memory allocating the offloaded "
                           "activations (%.1f MiB for micro-batch %lld; activation_checkpointing."
                           "cpu_checkpointing: set it false to keep them on the device)",
                           (double)g->plan.host / 1048576.0, (long long)g->batch);
        if (g->host) g->host_be->mem.free_host_pinned(g->host_be, g->host);
        g->host = host;
        g->host_be = be;
    }
    if (owns) {
        arena = be->mem.alloc(be, g->plan.total, CT_MEM_ACTIVATIONS);
        if (!arena)
            return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating activations (%.1f MiB for "
                           "micro-batch %lld on %s)", (double)g->plan.total / 1048576.0,
                           (long long)g->batch, be->name);
    }
    if (g->owns_arena) g->be->mem.free(g->be, g->arena);
    g->be = be;
    g->arena = arena;
    g->owns_arena = owns;
    for (int i = 0; i < g->n_nodes; i++) {
        ct_gnode *gn = &g->nodes[i];
        gn->aux = at_offset(arena, gn->aux_off);
        gn->dy = at_offset(arena, gn->dy_off);
    }
    for (int i = 0; i < g->n_nodes; i++) {   /* in order: a producer's y is set before its alias */
        ct_gnode *gn = &g->nodes[i];
        gn->y = gn->y_from >= 0 ? g->nodes[gn->y_from].y : at_offset(arena, gn->y_off);
    }
    g->ws = at_offset(arena, g->ws_off);
    g->dtmp = at_offset(arena, g->dtmp_off);
    g->input = at_offset(arena, g->input_off);
    g->loss_result = at_offset(arena, g->loss_off);
    return CT_OK;
}

void *ct_graph_arena(const ct_graph *g) { return g->arena; }

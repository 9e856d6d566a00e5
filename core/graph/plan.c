/* plan.c: the activation plan, a pure function of the graph, micro-batch and dtype: byte offsets
 * in one arena for the layers' outputs (relu-like layers overwrite their input in place), their
 * gradients (the loss's written over the logits), forward-to-backward state, the shared workspace
 * and fan-out scratch, all in the graph's dtype (2 bytes per element under mixed precision).
 * Binding (ct_graph_bind) turns the offsets into pointers on a backend.
 *
 * Outputs, saved state and gradients are placed together by lifetime (lifetime.c): each is busy
 * over one or two intervals of the step's schedule, and buffers never busy at once share bytes.
 * Activation checkpointing (segments.c): a checkpointed segment's inner outputs and its layers'
 * saved state are busy during its forward and again from its recompute to its backward, so in
 * between their bytes serve other segments' recomputes and the gradients; an inner output that
 * no backward reads is not recomputed, and busy during forward only. What leaves a segment
 * (its last output, an output read by a later layer: a residual crossing the boundary) is busy
 * from its forward to its last backward use, as without checkpointing; with offload (offload.c)
 * only before its download and after its upload. A chunked LM head's output is one chunk of
 * logits, busy during the head's forward only (it runs its loss and backward there, exec.c), and
 * its input's gradient is busy from then on. */
#include <stdlib.h>

#include "core/graph/internal.h"

/* Whether layer j has trainable parameters (its own, or ones tied to an earlier layer's). */
static bool has_trainable(const ct_graph *g, int j) {
    for (int s = 0; s < ct_param_layout_layer_specs(&g->layout, j); s++) {
        int v = ct_param_layout_layer_view(&g->layout, j, s);
        if (v >= 0 && g->layout.views[v].trainable) return true;
    }
    return false;
}

/* wanted[j]: the gradient of layer j's output leads to a parameter gradient, because layer j or a
 * layer it reads from (directly or further up) has trainable parameters. An output computed from
 * the model input alone (a flatten before the first weights) is not: its gradient would be
 * computed and dropped, and for the MLP's first linear layer that is a GEMM as large as its
 * weight gradient (batch x 784 x 512, 15% of the step at batch 512, docs/BENCHMARKS.md).
 * Returns an array of n_nodes flags (free it). */
static bool *gradient_wanted(const ct_graph *g) {
    bool *wanted = ct_xcalloc((size_t)g->n_nodes, sizeof(bool));
    for (int j = 0; j < g->n_nodes; j++) {   /* inputs come from earlier layers only */
        const ct_layer *l = &g->nodes[j].l;
        wanted[j] = has_trainable(g, j);
        for (int i = 0; i < l->n_in && !wanted[j]; i++) wanted[j] = l->in_from[i] >= 0 && wanted[l->in_from[i]];
    }
    return wanted;
}

/* Decide, once, where each input gradient goes during backward. Walking layers in reverse, the
 * first consumer of an activation to run writes its gradient straight into the producer's dy; any
 * later one writes to scratch that the executor then adds in. A layer whose output no gradient
 * reaches (a dead end that is not the last layer) is skipped, and so is one whose output's
 * gradient is not wanted (gradient_wanted): its consumers get no dx for it. Returns the scratch
 * floats needed. */
static int64_t plan_backward(ct_graph *g, int64_t batch) {
    bool *ready = ct_xcalloc((size_t)g->n_nodes, sizeof(bool));
    bool *wanted = gradient_wanted(g);
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
            if (src < 0 || !ready[j] || !wanted[src]) continue;
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
    free(wanted);
    free(ready);
    return need;
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

bool ct_graph_head_chunkable(const ct_graph *g) {
    const ct_layer *l = &g->nodes[g->n_nodes - 1].l;
    return g->info.loss == CT_LOSS_CROSS_ENTROPY && l->type->forward_rows && l->type->backward_rows &&
           l->n_in == 1 && l->in_dtype != CT_I32;
}

/* The chunked LM head: the whole logits [rows, padded_classes] of a language model's micro-batch
 * are the largest activation by far (GPT-2 small at 16 x 1024 tokens: 1.5 GiB in bf16, more than
 * its twelve checkpointed blocks), and the loss needs only one row at a time. So the last layer and
 * the loss run together in forward, a chunk of rows at a time (exec.c), and only one chunk's logits
 * exist. "auto" chunks when the whole logits would pass CT_HEAD_CHUNK_AUTO_BYTES, in chunks of
 * the most rows (a multiple of 64, which GEMMs tile well) that fit in it; a number is the rows per
 * chunk. Sets g->head_chunk (0: not chunked). */
static void decide_head_chunk(ct_graph *g) {
    g->head_chunk = 0;
    if (g->head_chunk_req == 0 || !ct_graph_head_chunkable(g)) return;
    const ct_layer *last = &g->nodes[g->n_nodes - 1].l;
    int64_t ld = g->info.padded_classes, rows = g->batch * ct_layer_out_numel(last) / ld;
    size_t row_bytes = (size_t)ld * ct_dtype_size(g->dt);
    int64_t chunk = g->head_chunk_req;
    if (chunk == CT_HEAD_CHUNK_AUTO) {
        if ((size_t)rows * row_bytes <= CT_HEAD_CHUNK_AUTO_BYTES) return;
        chunk = (int64_t)(CT_HEAD_CHUNK_AUTO_BYTES / row_bytes) / 64 * 64;
        if (chunk < 64) chunk = 64;
    }
    g->head_chunk = chunk < rows ? chunk : rows;
}

/* An element-wise layer writes its input's gradient over its own (act_backward reads dy[i] before
 * it writes dx[i]): a layer that ran in place over its producer (alias[j] = k; in-place layers are
 * relu-like), or any type declaring backward_in_place (gelu, whose forward cannot run in place).
 * Then the producer's dy can be the layer's dy, when the layer is the first to write it (its
 * backward runs first: later consumers add theirs into the same buffer afterwards) and writes it
 * straight (no fan-out scratch). True when node k's dy is that consumer's. */
static bool grad_in_place(const ct_graph *g, const int *alias, int k, int *consumer) {
    const ct_gnode *p = &g->nodes[k];
    int last = g->n_nodes - 1;
    if (!p->runs_backward || p->grad_start < 0) return false;
    int j = last - p->grad_start;   /* the first writer of k's dy */
    const ct_gnode *c = &g->nodes[j];
    bool elementwise = alias[j] == k || c->l.type->backward_in_place;
    *consumer = j;
    return elementwise && j != last && c->runs_backward && c->l.n_in == 1 && c->l.in_from[0] == k &&
           c->tmp_off[0] < 0;
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

/* Bytes appended at *end (64-byte aligned): returns their offset. */
static size_t take(size_t *end, size_t bytes) {
    size_t off = *end;
    *end += align64(bytes);
    return off;
}

/* What a lifetime item is, for the plan's breakdown. */
enum { KIND_OUTPUT, KIND_AUX, KIND_GRAD, KIND_RECOMPUTE };

/* The buffers placed by lifetime (lifetime.c) and which node field gets each one's offset. */
typedef struct placed {
    ct_lifetime_item *items;
    size_t **field;
    int n;
} placed;

static void add_item(placed *P, size_t *field, size_t bytes, int kind, ct_span a, ct_span b) {
    ct_lifetime_item *it = &P->items[P->n];
    *it = (ct_lifetime_item){.size = bytes, .when = {a, b}, .n_when = b.hi >= b.lo ? 2 : 1, .kind = kind};
    P->field[P->n++] = field;
}

static ct_span span_of(int lo, int hi) { return (ct_span){lo, hi}; }
static const ct_span no_span = {0, -1};

/* Layer outputs: an owner's buffer (its in-place layers write it too) is busy from its forward
 * to its last use in backward; a checkpointed segment's inner output only while forward uses it
 * and again from its recompute to its last backward use, so in between the other segments'
 * recomputes, gradients and everything else reuse it; an offloaded output likewise, before its
 * download and from its upload (offload.c). */
static void add_outputs(ct_graph *g, const int *alias, placed *P) {
    int n = g->n_nodes;
    int *root = ct_xmalloc(sizeof(int) * (size_t)n);
    for (int j = 0; j < n; j++) root[j] = alias[j] < 0 ? j : root[alias[j]];
    for (int o = 0; o < n; o++) {
        ct_gnode *gn = &g->nodes[o];
        gn->y_from = alias[o];
        gn->y_off = CT_NO_OFFSET;
        if (alias[o] >= 0) continue;
        const ct_offload_item *moved = NULL;
        for (int i = 0; i < g->n_off; i++)
            if (g->off[i].owner == o) moved = &g->off[i];
        if (moved) {
            add_item(P, &gn->y_off, moved->bytes, KIND_OUTPUT, moved->busy[0], moved->busy[1]);
            continue;
        }
        if (o == n - 1 && g->head_chunk) {   /* one chunk's logits, then their gradient */
            size_t chunk = (size_t)(g->head_chunk * g->info.padded_classes) * ct_dtype_size(g->dt);
            add_item(P, &gn->y_off, chunk, KIND_OUTPUT, span_of(o, o), no_span);
            continue;
        }
        ct_span fw, bw;
        int written;
        ct_buffer_uses(g, root, o, &fw, &bw, &written);
        size_t bytes = (size_t)(g->batch * ct_layer_out_numel(&gn->l)) * ct_dtype_size(g->dt);
        if (gn->seg >= 0 && !gn->kept)
            add_item(P, &gn->y_off, bytes, KIND_RECOMPUTE, fw, bw);
        else
            add_item(P, &gn->y_off, bytes, KIND_OUTPUT, span_of(o, fw.hi > bw.hi ? fw.hi : bw.hi), no_span);
    }
    free(root);
}

/* Saved state (aux) lives from its layer's forward to its backward; in a segment, forward's
 * copy is written and never read, and the recompute's lives to the backward (a layer with aux is
 * always recomputed: segments.c). */
static void add_aux(ct_graph *g, placed *P) {
    for (int j = 0; j < g->n_nodes; j++) {
        ct_gnode *gn = &g->nodes[j];
        gn->aux_off = CT_NO_OFFSET;
        if (!gn->l.type->aux_bytes) continue;
        size_t bytes = gn->l.type->aux_bytes(&gn->l, g->batch, g->dt);
        if (gn->seg >= 0)
            add_item(P, &gn->aux_off, bytes, KIND_RECOMPUTE, span_of(j, j), span_of(gn->t_recompute, gn->t_backward));
        else
            add_item(P, &gn->aux_off, bytes, KIND_AUX, span_of(j, gn->t_backward), no_span);
    }
}

/* Output gradients live from the backward step that first writes them (the loss, for the last
 * layer's) to their own layer's backward. A layer running in place shares its producer's
 * gradient (grad_in_place): one buffer, busy until the last of them has run backward, and
 * shares[k] names the consumer whose gradient node k takes (-1: its own or none). The last
 * layer's gradient is its output when the loss writes over the logits. */
static void add_grads(ct_graph *g, const int *alias, placed *P, int *shares) {
    int n = g->n_nodes;
    int *item_of = ct_xmalloc(sizeof(int) * (size_t)n);
    for (int k = n - 1; k >= 0; k--) {   /* consumers before their producers */
        ct_gnode *gn = &g->nodes[k];
        item_of[k] = shares[k] = -1;
        gn->dy_off = CT_NO_OFFSET;
        if (!gn->runs_backward || (k == n - 1 && loss_grad_in_place(g, alias))) continue;
        size_t bytes = (size_t)(g->batch * ct_layer_out_numel(&gn->l)) * ct_dtype_size(g->dt);
        int consumer;
        if (grad_in_place(g, alias, k, &consumer) && item_of[consumer] >= 0) {
            ct_lifetime_item *it = &P->items[item_of[consumer]];
            item_of[k] = item_of[consumer];
            shares[k] = consumer;
            it->when[0].hi = gn->t_backward;   /* the producer's backward comes later */
            if (it->size < bytes) it->size = bytes;
            continue;
        }
        int first = gn->grad_start < 0 ? n : g->nodes[n - 1 - gn->grad_start].t_backward;
        /* the chunked head writes its input's gradient in forward, chunk by chunk */
        if (g->head_chunk && gn->grad_start == 0) first = n - 1;
        item_of[k] = P->n;
        add_item(P, &gn->dy_off, bytes, KIND_GRAD, span_of(first, gn->t_backward), no_span);
    }
    free(item_of);
}

/* A max-pool that a conv + relu may compute (fuse.c, decided at bind by the backend) is written
 * in the conv's forward and read in its backward: its output, saved argmax and output gradient
 * are kept busy from the one to the other whether fused or not, so the plan does not depend on
 * the backend. (A pool's gradient item may be a consumer's: shares[] leads to its owner.) */
static void keep_fusable_pools(ct_graph *g, placed *P, const int *shares) {
    for (int q = 0; q < g->n_nodes; q++) {
        int src = ct_graph_pool_producer(g, q);
        if (src < 0) continue;
        int grad_owner = q;
        while (shares[grad_owner] >= 0) grad_owner = shares[grad_owner];
        const ct_gnode *pool = &g->nodes[q];
        for (int i = 0; i < P->n; i++) {
            const size_t *f = P->field[i];
            if (f != &pool->y_off && f != &pool->aux_off && f != &g->nodes[grad_owner].dy_off) continue;
            ct_span_touch(&P->items[i].when[0], src);
            ct_span_touch(&P->items[i].when[0], g->nodes[src].t_backward);
        }
    }
}

/* The breakdown at the step's busiest moment: the bytes of each kind busy then. */
static void peak_breakdown(const ct_graph *g, const placed *P, ct_act_plan *p) {
    int end = ct_graph_schedule_end(g);
    size_t best = 0, kinds[4] = {0};
    for (int t = 0; t < end; t++) {
        size_t by[4] = {0}, sum = 0;
        for (int i = 0; i < P->n; i++) {
            const ct_lifetime_item *it = &P->items[i];
            for (int w = 0; w < it->n_when; w++)
                if (it->when[w].lo <= t && t <= it->when[w].hi) {
                    by[it->kind] += align64(it->size);
                    sum += align64(it->size);
                    break;
                }
        }
        if (sum > best) {
            best = sum;
            for (int k = 0; k < 4; k++) kinds[k] = by[k];
        }
    }
    p->outputs = kinds[KIND_OUTPUT];
    p->aux = kinds[KIND_AUX];
    p->grads = kinds[KIND_GRAD];
    p->recompute = kinds[KIND_RECOMPUTE];
}

void ct_graph_plan_memory(ct_graph *g) {
    int64_t batch = g->batch;
    int n = g->n_nodes;
    size_t esz = ct_dtype_size(g->dt), ws = 0, end = 0;
    ct_act_plan *p = &g->plan;
    *p = (ct_act_plan){0};
    int *alias = ct_xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        const ct_layer *l = &g->nodes[i].l;
        alias[i] = in_place_source(g, i);
        size_t w = l->type->workspace_bytes ? l->type->workspace_bytes(l, batch, g->dt) : 0;
        if (w > ws) ws = w;
        size_t d = l->type->device_scratch_bytes ? l->type->device_scratch_bytes(l, batch, g->dt) : 0;
        if (d > p->device_scratch) p->device_scratch = d;
        g->info.flops_per_sample += l->type->flops ? l->type->flops(l) : 0.0;
    }
    size_t tmp = (size_t)plan_backward(g, batch) * esz;
    /* A chunked head runs its backward inside its forward (exec.c): nothing of it is left for the
     * backward walk, which starts at the head's input gradient, written by then. */
    decide_head_chunk(g);
    if (g->head_chunk) g->nodes[n - 1].runs_backward = false;
    mark_kept(g, alias);
    ct_graph_mark_recompute(g, alias);
    ct_graph_schedule(g);
    /* Activation offload: which kept outputs wait in pinned host memory (offload.c) */
    ct_offload_plan(g, alias, &p->host);
    p->offloaded = g->n_off;

    /* Outputs, saved state and output gradients: one region placed by lifetime over the step's
     * schedule, recompute included (up to three buffers a layer). */
    placed P = {.items = ct_xcalloc((size_t)(3 * n), sizeof(ct_lifetime_item)),
                .field = ct_xcalloc((size_t)(3 * n), sizeof(size_t *))};
    add_outputs(g, alias, &P);
    add_aux(g, &P);
    int *shares = ct_xmalloc(sizeof(int) * (size_t)n);
    add_grads(g, alias, &P, shares);
    keep_fusable_pools(g, &P, shares);
    size_t packed = ct_lifetime_pack(P.items, P.n);
    take(&end, packed);
    free(g->placed.items);
    g->placed = (ct_lifetime_region){.items = P.items, .n = P.n, .bytes = packed};
    for (int i = 0; i < P.n; i++) *P.field[i] = P.items[i].off;
    for (int k = n - 1; k >= 0; k--)   /* consumers first: a chain of in-place layers */
        if (shares[k] >= 0) g->nodes[k].dy_off = g->nodes[shares[k]].dy_off;
    peak_breakdown(g, &P, p);
    p->gaps = packed - (p->outputs + p->aux + p->grads + p->recompute);
    ct_gnode *last = &g->nodes[n - 1];
    if (last->runs_backward && loss_grad_in_place(g, alias)) last->dy_off = last->y_off;
    p->segments = g->n_segs;
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
    /* loss_result[2], and a chunked head's result of one chunk [2] */
    g->loss_off = take(&end, 4 * sizeof(float));
    p->loss = end - at;
    p->total = end;
    const ct_layer *head = &last->l;
    p->head_chunk = g->head_chunk;
    p->head_rows = g->info.padded_classes ? batch * ct_layer_out_numel(head) / g->info.padded_classes : 0;
    p->head_logits = (size_t)((g->head_chunk ? g->head_chunk : p->head_rows) * g->info.padded_classes) * esz;
    free(P.field), free(shares), free(alias);
}

static void *at_offset(void *arena, size_t off) { return off == CT_NO_OFFSET ? NULL : (char *)arena + off; }

int ct_graph_bind(ct_graph *g, ct_backend *be, void *arena, ct_err *err) {
    bool owns = arena == NULL;
    /* the offloaded activations' host copies: pinned memory of the backend that copies them */
    if (g->plan.host && g->host_be != be) {
        void *host = be->mem.alloc_host_pinned(be, g->plan.host, CT_MEM_ACTIVATIONS);
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
    ct_graph_fuse(g);
    return CT_OK;
}

void *ct_graph_arena(const ct_graph *g) { return g->arena; }

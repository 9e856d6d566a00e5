/* exec.c: the executor. Forward walks a range of layers in order, the loss is its own call, and
 * backward walks a range in reverse from the output gradients in place, running a checkpointed
 * segment's forward again (the recompute pass) before its backward; hooks run around every layer
 * (graph.h). Nothing here allocates: every buffer was placed by ct_graph_bind. */
#include "core/graph/internal.h"

/* Pointers for layer j. Buffers (running statistics) are visible only in forward. `input` is the
 * model input as the layers read it (in g->dt, or token ids). */
static void layer_io(const ct_graph *g, int j, ct_pass pass, const ct_exec_bufs *b, const void *input,
                     const ct_step_io *step, ct_layer_io *io) {
    const ct_gnode *gn = &g->nodes[j];
    *io = (ct_layer_io){.be = g->be, .n = step->n, .dt = g->dt, .y = gn->y, .dy = gn->dy,
                        .aux = gn->aux, .ws = g->ws, .train = step->train,
                        .recompute = pass == CT_PASS_RECOMPUTE, .seed = step->seed, .decode = step->decode,
                        .stream = step->step * (uint64_t)g->n_nodes + (uint64_t)j};
    for (int i = 0; i < gn->l.n_in; i++) {
        int src = gn->l.in_from[i];
        if (src >= 0) io->x[i] = g->nodes[src].y;
        else if (g->info.input_dtype == CT_I32) io->ids = input;
        else io->x[i] = input;
    }
    bool backward = pass == CT_PASS_BACKWARD;
    if (gn->fused_with >= 0) {   /* fuse.c: this layer applies the activation after it */
        io->act = gn->fused_act;
        if (backward) io->dy = g->nodes[gn->fused_with].dy;
    }
    if (gn->fused_pool >= 0) {   /* and the max-pool after that: the pool's buffers */
        const ct_gnode *pool = &g->nodes[gn->fused_pool];
        io->pool = true;
        io->y = pool->y;
        io->aux = pool->aux;
        if (backward) io->dy = pool->dy;
    }
    for (int s = 0; s < ct_param_layout_layer_specs(&g->layout, j); s++) {
        const ct_param_view *v = &g->layout.views[ct_param_layout_layer_view(&g->layout, j, s)];
        if (v->trainable) {
            /* layers never write trainable params; without whole ones (ZeRO-3) the prepare hook
             * points the layer at gathered ones */
            io->p[s] = b->params ? (void *)ct_celem(b->params, v->offset, g->dt) : NULL;
            io->dp[s] = backward && b->grads ? b->grads + v->offset : NULL;
        } else {
            io->p[s] = !backward && b->buffers ? b->buffers + v->offset : NULL;
        }
    }
    if (backward)
        for (int i = 0; i < gn->l.n_in; i++) {
            int src = gn->l.in_from[i];
            if (src < 0) continue;   /* the model input needs no gradient */
            io->dx[i] = gn->tmp_off[i] < 0 ? g->nodes[src].dy : ct_elem(g->dtmp, gn->tmp_off[i], g->dt);
        }
}

/* The model input as the layers read it: token ids, or floats in the graph's dtype (the caller's
 * buffer, or g->input, the 16-bit copy forward makes of an fp32 input). */
static const void *model_input(const ct_graph *g, const ct_step_io *io) {
    return g->info.input_dtype == CT_I32 || io->input_dt == g->dt ? io->input : g->input;
}

static int check_n(const ct_graph *g, const ct_step_io *io, ct_err *err) {
    if (!g->be) return ct_errf(err, CT_ERR_RUNTIME, "the graph is not bound to a backend (ct_graph_bind)");
    if (io->n < 1 || io->n > g->batch)
        return ct_errf(err, CT_ERR_RUNTIME, "micro-batch of %lld samples, graph built for 1..%lld",
                       (long long)io->n, (long long)g->batch);
    return CT_OK;
}

static int check_range(const ct_graph *g, int lo, int hi, ct_err *err) {
    if (lo < 0 || hi > g->n_nodes || lo > hi)
        return ct_errf(err, CT_ERR_RUNTIME, "layer range [%d, %d) outside the graph's %d layers", lo, hi,
                       g->n_nodes);
    return CT_OK;
}

static int check_input_dt(const ct_graph *g, const ct_step_io *io, ct_err *err) {
    if (g->info.input_dtype == CT_I32 || io->input_dt == CT_F32 || io->input_dt == g->dt) return CT_OK;
    return ct_errf(err, CT_ERR_RUNTIME, "input in %s, the graph reads f32 or %s",
                   ct_dtype_name(io->input_dt), ct_dtype_name(g->dt));
}

/* A decode (graph.h, ct_decode) runs in eval mode on a graph that takes one: the whole window
 * from position 0 (fill), or new positions that fit the cache. */
static int check_decode(const ct_graph *g, const ct_step_io *io, ct_err *err) {
    const ct_decode *d = io->decode;
    if (!d) return CT_OK;
    char why[200];
    if (io->train || !ct_graph_decodes(g, why, sizeof why))
        return ct_errf(err, CT_ERR_RUNTIME, "a decode forward %s", io->train ? "in train mode" : why);
    int64_t T = g->info.input_shape.d[0];
    if (d->fill ? T > d->cap : d->pos0 < 0 || d->pos0 + T > d->cap)
        return ct_errf(err, CT_ERR_RUNTIME, "a decode of %lld positions from %lld%s, with a cache of %lld", (long long)T,
                       (long long)d->pos0, d->fill ? " (fill)" : "", (long long)d->cap);
    return CT_OK;
}

/* A hook's status; a failure without a message gets one naming the layer. */
static int hook_status(const ct_graph *g, int j, int rc, ct_err *err) {
    if (rc && err && !err->msg[0])
        ct_errf(err, rc, "a hook failed at layer \"%s\" without a message", g->nodes[j].l.name);
    return rc;
}

static int prepare(const ct_graph *g, const ct_exec_hooks *h, int j, ct_pass pass, ct_layer_io *io,
                   ct_err *err) {
    return h && h->prepare ? hook_status(g, j, h->prepare(h->ctx, j, pass, io, err), err) : CT_OK;
}

static int after(const ct_graph *g, const ct_exec_hooks *h, int j, ct_pass pass, const ct_layer_io *io,
                 ct_err *err) {
    return h && h->after ? hook_status(g, j, h->after(h->ctx, j, pass, io, err), err) : CT_OK;
}

/* activation_checkpointing.synchronize_checkpoint_boundary and .profile (DeepSpeed's): at each
 * edge of a checkpointed segment's forward, recompute or backward (train mode), wait for the
 * device; with profile, add the time between the pass's two edges to the segment's sums. */
static void segment_edge(ct_graph *g, int s, ct_pass pass, bool opens) {
    if (!g->sync_segments && !g->seg_times) return;
    g->be->queue.sync(g->be);
    if (!g->seg_times) return;
    double now = ct_now();
    if (opens) {
        g->seg_started = now;
        return;
    }
    ct_segment_times *t = &g->seg_times[s];
    double took = now - g->seg_started;
    if (pass == CT_PASS_FORWARD) {
        t->forward_s += took;
        t->micro_batches++;
    } else if (pass == CT_PASS_RECOMPUTE) {
        t->recompute_s += took;
    } else {
        t->backward_s += took;
    }
}

/* The segment layer j opens (first layer) or closes (last), for segment_edge; -1: neither. In
 * backward the last layer opens and the first closes. */
static int segment_opened(const ct_graph *g, int j) {
    int s = g->nodes[j].seg;
    return s >= 0 && j == g->segs[s].lo ? s : -1;
}
static int segment_closed(const ct_graph *g, int j) {
    int s = g->nodes[j].seg;
    return s >= 0 && j == g->segs[s].hi - 1 ? s : -1;
}

static void close_backward(ct_graph *g, int j, int *open) {
    if (*open < 0 || segment_opened(g, j) != *open) return;
    segment_edge(g, *open, CT_PASS_BACKWARD, false);
    *open = -1;
}

/* ---- the chunked LM head (model.loss.chunk_rows; plan.c decides) ----
 * The last layer and the cross-entropy loss run together in forward, head_chunk rows of the
 * micro-batch at a time, in the last layer's y (one chunk's logits): the logits of the chunk, its
 * loss, and in train mode at once its gradient (written over the logits) and the layer's backward
 * of the chunk: dX of the chunk's rows into the input's gradient, dW accumulated. So the whole
 * logits [rows, padded_classes] never exist, and the backward walk starts below the head.
 *
 * The loss is the mean over the micro-batch's rows: chunk c of r_c of its R rows counts with
 * weight r_c / R, in its loss and its gradient (grad_scale * r_c / R, which the loss op divides by
 * the chunk's labelled rows). With every label in [0, classes), as a language model's next tokens
 * are, that is the unchunked mean; a chunk's ignored labels (ignore_index) are left out of its own
 * mean only, as gradient accumulation leaves a micro-batch's out of its own (docs/model.md). */

static int64_t head_rows(const ct_graph *g, int64_t n) {
    const ct_layer *l = &g->nodes[g->n_nodes - 1].l;
    return n * ct_layer_out_numel(l) / g->info.padded_classes;
}

/* The head's layer io moved to its chunk of `rows` rows from row r0. */
static ct_layer_io head_chunk_io(const ct_graph *g, const ct_layer_io *io, int64_t r0) {
    const ct_layer *l = &g->nodes[g->n_nodes - 1].l;
    int64_t in = l->in[0].d[l->in[0].ndim - 1];
    ct_layer_io c = *io;
    c.x[0] = ct_celem(io->x[0], r0 * in, g->dt);
    c.dx[0] = io->dx[0] ? ct_elem(io->dx[0], r0 * in, g->dt) : NULL;
    c.y = g->nodes[g->n_nodes - 1].y;   /* the chunk buffer */
    c.dy = c.y;                         /* the loss writes the gradient over the logits */
    return c;
}

/* Every chunk of the micro-batch: logits, loss (weighted into g->loss_result) and, in train mode,
 * the gradient and the layer's backward of the chunk. */
static void head_chunks(ct_graph *g, const ct_layer_io *io, const ct_step_io *step) {
    ct_backend *be = g->be;
    const ct_layer *l = &g->nodes[g->n_nodes - 1].l;
    int64_t rows = head_rows(g, step->n), ld = g->info.padded_classes;
    float *part = g->loss_result + 2;   /* one chunk's [mean loss, correct] */
    be->mem.memset0(be, g->loss_result, 2 * sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += g->head_chunk) {
        int64_t r = rows - r0 < g->head_chunk ? rows - r0 : g->head_chunk;
        float weight = (float)((double)r / (double)rows);
        ct_layer_io c = head_chunk_io(g, io, r0);
        l->type->forward_rows(l, &c, r);
        be->loss.softmax_xent(be, step->train ? c.y : NULL, part, c.y, (const int32_t *)step->target + r0, r,
                              g->info.classes, ld, (float)g->label_smoothing, step->loss_grad_scale * weight, g->dt);
        be->elt.axpy(be, g->loss_result, weight, part, 1, CT_F32);
        be->elt.axpy(be, g->loss_result + 1, 1.0f, part + 1, 1, CT_F32);
        if (step->train) l->type->backward_rows(l, &c, r);
    }
}

/* The head's step of a forward walk. In train mode its whole work runs between the hooks of its
 * backward pass (which give the parameter gradients: a ZeRO gradient bucket); the backward walk
 * then skips it (plan.c: it does not run backward). A forward without a target (generation)
 * stops before it: ct_graph_logits computes the rows wanted. */
static int head_forward(ct_graph *g, const ct_exec_bufs *b, const void *input, const ct_step_io *io,
                        const ct_exec_hooks *hooks, ct_err *err) {
    int j = g->n_nodes - 1;
    bool run = !io->hooks_only;
    if (run && !io->target) {
        if (io->train) return ct_errf(err, CT_ERR_RUNTIME, "a train-mode forward of a chunked head needs the target");
        return CT_OK;
    }
    ct_pass pass = io->train ? CT_PASS_BACKWARD : CT_PASS_FORWARD;
    ct_layer_io lio;
    layer_io(g, j, pass, b, input, io, &lio);
    int rc = prepare(g, hooks, j, pass, &lio, err);
    if (rc) return rc;
    if (run && io->train && !lio.dp[0])
        return ct_errf(err, CT_ERR_RUNTIME, "a train-mode forward of a chunked head needs the gradients (b->grads)");
    if (run) {
        head_chunks(g, &lio, io);
        g->loss_grad_scale = io->loss_grad_scale;
        g->loss_train = io->train;
    }
    return after(g, hooks, j, pass, &lio, err);
}

const void *ct_graph_logits(ct_graph *g, const ct_exec_bufs *b, int64_t r0, int64_t rows, ct_err *err) {
    int j = g->n_nodes - 1;
    int64_t all = g->info.padded_classes ? head_rows(g, g->batch) : 0;
    int64_t most = g->head_chunk ? g->head_chunk : all;
    if (!g->be || r0 < 0 || rows < 1 || r0 + rows > all || rows > most) {
        ct_errf(err, CT_ERR_RUNTIME, "logits of rows [%lld, %lld): the graph has %lld rows of logits, %lld at a time",
                (long long)r0, (long long)(r0 + rows), (long long)all, (long long)most);
        return NULL;
    }
    if (!g->head_chunk) return ct_celem(g->nodes[j].y, r0 * g->info.padded_classes, g->dt);
    if (g->nodes[j].l.in_from[0] < 0) {   /* a head over the model input: that input is the caller's */
        ct_errf(err, CT_ERR_RUNTIME, "logits of a chunked head that reads the model input: run a forward with the target");
        return NULL;
    }
    ct_step_io one = {.n = 1};
    ct_layer_io lio;
    layer_io(g, j, CT_PASS_FORWARD, b, NULL, &one, &lio);
    ct_layer_io c = head_chunk_io(g, &lio, r0);
    g->nodes[j].l.type->forward_rows(&g->nodes[j].l, &c, rows);
    return c.y;
}

/* Layer j's step of a forward walk, between its hooks (the chunked head: its whole work). */
static int forward_layer(ct_graph *g, int j, ct_pass pass, const ct_exec_bufs *b, const void *input,
                         const ct_step_io *io, const ct_exec_hooks *hooks, ct_err *err) {
    bool run = !io->hooks_only;
    bool head = j == g->n_nodes - 1 && g->head_chunk;   /* never recomputed: in no segment */
    ct_layer_io lio;
    int rc;
    /* activation offload: a recompute may read a kept output that is coming back */
    if (run && pass == CT_PASS_RECOMPUTE && g->n_off) ct_offload_before(g, g->nodes[j].t_recompute, io->n);
    if (head) {
        rc = head_forward(g, b, input, io, hooks, err);
    } else {
        layer_io(g, j, pass, b, input, io, &lio);
        if ((rc = prepare(g, hooks, j, pass, &lio, err))) return rc;
        /* a layer fused into its producer (fuse.c) was computed by it */
        if (run && g->nodes[j].fused_into < 0) g->nodes[j].l.type->forward(&g->nodes[j].l, &lio);
    }
    /* ... and forward sends kept outputs away once their readers have run */
    if (!rc && run && pass == CT_PASS_FORWARD && io->train && g->n_off) ct_offload_after_forward(g, j, io->n);
    if (!head) rc = after(g, hooks, j, pass, &lio, err);
    return rc;
}

int ct_graph_forward_range(ct_graph *g, int lo, int hi, ct_pass pass, const ct_exec_bufs *b,
                           const ct_step_io *io, const ct_exec_hooks *hooks, ct_err *err) {
    int rc = check_n(g, io, err);
    if (!rc) rc = check_range(g, lo, hi, err);
    if (!rc) rc = check_input_dt(g, io, err);
    if (!rc) rc = check_decode(g, io, err);
    if (!rc && pass == CT_PASS_BACKWARD) rc = ct_errf(err, CT_ERR_RUNTIME, "forward with the backward pass");
    if (!rc && pass == CT_PASS_RECOMPUTE && !io->train)
        rc = ct_errf(err, CT_ERR_RUNTIME, "recompute of an eval-mode forward (nothing to recompute for)");
    if (rc) return rc;
    /* The 16-bit copy of a float input is made when the first layer runs (a recompute finds it
     * still in place). */
    const void *input = model_input(g, io);
    if (lo == 0 && pass == CT_PASS_FORWARD && input == g->input && !io->hooks_only)
        g->be->elt.cast(g->be, g->input, g->dt, io->input, io->input_dt,
                        io->n * ct_shape_numel(&g->info.input_shape));
    int open = -1;   /* the segment whose pass this call opened (a range may start inside one) */
    for (int j = lo; j < hi && !rc; j++) {
        if (io->train && segment_opened(g, j) >= 0) {
            open = segment_opened(g, j);
            segment_edge(g, open, pass, true);
        }
        /* A checkpointed layer whose output and saved state no backward reads (segments.c) is
         * not run again, hooks included (ZeRO-3 gathers nothing for it). */
        bool skipped = pass == CT_PASS_RECOMPUTE && g->nodes[j].seg >= 0 && !g->nodes[j].recomputed;
        if (!skipped && (rc = forward_layer(g, j, pass, b, input, io, hooks, err))) break;
        if (open >= 0 && segment_closed(g, j) == open) {
            segment_edge(g, open, pass, false);
            open = -1;
        }
    }
    return rc;
}

/* The loss of the last layer's output. Its gradient, d(mean loss)/d(out) * loss_grad_scale (the
 * loss scale folded in before the 16-bit store, so small gradients survive it), goes straight
 * into the last layer's dy: a train-mode loss is followed by its backward, and an eval loss
 * writes no gradient at all. */
int ct_graph_loss(ct_graph *g, const ct_step_io *io, ct_err *err) {
    int rc = check_n(g, io, err);
    if (rc) return rc;
    if (g->head_chunk) return CT_OK;   /* the chunked head computed it in forward */
    ct_backend *be = g->be;
    ct_gnode *last = &g->nodes[g->n_nodes - 1];
    const void *out = last->y;
    void *dout = io->train ? last->dy : NULL;
    float scale = io->loss_grad_scale;
    g->loss_grad_scale = scale;
    g->loss_train = io->train;
    int64_t per_sample = ct_shape_numel(&g->info.output_shape);
    switch (g->info.loss) {
    case CT_LOSS_CROSS_ENTROPY: {
        int64_t rows = io->n * per_sample / g->info.padded_classes;
        be->loss.softmax_xent(be, dout, g->loss_result, out, io->target, rows, g->info.classes,
                              g->info.padded_classes, (float)g->label_smoothing, scale, g->dt);
        break;
    }
    case CT_LOSS_MSE:
        be->loss.mse_loss(be, dout, g->loss_result, out, io->target, io->n, per_sample, scale, g->dt);
        break;
    case CT_LOSS_BCE_WITH_LOGITS:
        be->loss.bce_logits_loss(be, dout, g->loss_result, out, io->target, io->n, per_sample, scale,
                                 g->dt);
        break;
    }
    return CT_OK;
}

const float *ct_graph_loss_result(const ct_graph *g) { return g->loss_result; }

void ct_graph_read_loss(ct_graph *g, ct_step_io *io) {
    float r[2];
    g->be->mem.copy_d2h(g->be, r, g->loss_result, sizeof r);
    io->loss = r[0];
    io->correct = g->info.loss == CT_LOSS_CROSS_ENTROPY ? (int64_t)r[1] : 0;
}

ct_dtype ct_graph_compute_dtype(const ct_graph *g) { return g->dt; }

bool ct_graph_offloads(const ct_graph *g) { return g->plan.offloaded > 0; }

bool ct_graph_syncs_segments(const ct_graph *g) { return g->n_segs > 0 && (g->sync_segments || g->seg_times); }

const ct_segment_times *ct_graph_segment_times(const ct_graph *g, int *n) {
    *n = g->seg_times ? g->n_segs : 0;
    return g->seg_times;
}

void ct_graph_segment_times_reset(ct_graph *g) {
    for (int s = 0; g->seg_times && s < g->n_segs; s++) g->seg_times[s] = (ct_segment_times){0};
}

int ct_graph_backward_range(ct_graph *g, int lo, int hi, const ct_exec_bufs *b, const ct_step_io *io,
                            const ct_exec_hooks *hooks, ct_err *err) {
    int rc = check_n(g, io, err);
    if (!rc) rc = check_range(g, lo, hi, err);
    if (rc) return rc;
    /* Layers save batch statistics and masks in train mode only (batchnorm's backward is that of
     * batch statistics), and the train-mode loss wrote d(loss) into the last layer's dy. */
    if (!io->train || (!g->loss_train && !io->hooks_only))
        return ct_errf(err, CT_ERR_RUNTIME, "backward needs a forward and loss in train mode (io.train)");
    if (io->loss_grad_scale != g->loss_grad_scale && !io->hooks_only)
        return ct_errf(err, CT_ERR_RUNTIME, "backward with loss_grad_scale %g after a loss with %g",
                       (double)io->loss_grad_scale, (double)g->loss_grad_scale);
    ct_backend *be = g->be;
    const void *input = model_input(g, io);   /* as forward converted it */
    int open = -1;   /* the segment whose backward this call entered from above */
    for (int j = hi - 1; j >= lo && !rc; j--) {
        ct_gnode *gn = &g->nodes[j];
        /* Entering a checkpointed segment from above: its inner outputs and saved state were
         * overwritten since its forward (plan.c lends their bytes to other buffers in between),
         * so run its forward again first. A range that starts inside a segment finds it recomputed by the
         * call that entered it from above. */
        if (gn->seg >= 0 && j == g->segs[gn->seg].hi - 1 &&
            (rc = ct_graph_forward_range(g, g->segs[gn->seg].lo, j + 1, CT_PASS_RECOMPUTE, b, io, hooks, err)))
            break;
        if (segment_closed(g, j) >= 0) {
            open = gn->seg;
            segment_edge(g, open, CT_PASS_BACKWARD, true);
        }
        bool run = !io->hooks_only;
        if (run && g->n_off) ct_offload_before(g, gn->t_backward, io->n);
        if (!gn->runs_backward) {
            close_backward(g, j, &open);
            continue;
        }
        ct_layer_io lio;
        layer_io(g, j, CT_PASS_BACKWARD, b, input, io, &lio);
        if ((rc = prepare(g, hooks, j, CT_PASS_BACKWARD, &lio, err))) break;
        if (run && gn->fused_into < 0) gn->l.type->backward(&gn->l, &lio);
        /* A second consumer of an activation adds its gradient to the first one's (in 16 bits
         * under mixed precision: one rounding of the sum, as a GPU add would). */
        for (int i = 0; i < gn->l.n_in && run; i++) {
            if (gn->l.in_from[i] < 0 || gn->tmp_off[i] < 0) continue;
            int64_t numel = io->n * ct_layer_in_numel(&gn->l, i);
            be->elt.axpy(be, g->nodes[gn->l.in_from[i]].dy, 1.0f, lio.dx[i], numel, g->dt);
        }
        rc = after(g, hooks, j, CT_PASS_BACKWARD, &lio, err);
        close_backward(g, j, &open);
    }
    return rc;
}

int ct_graph_forward(ct_graph *g, const ct_exec_bufs *b, ct_step_io *io, const ct_exec_hooks *hooks,
                     ct_err *err) {
    int rc = ct_graph_forward_range(g, 0, g->n_nodes, CT_PASS_FORWARD, b, io, hooks, err);
    if (!rc) rc = ct_graph_loss(g, io, err);
    if (!rc && !io->defer_loss) ct_graph_read_loss(g, io);
    return rc;
}

int ct_graph_backward(ct_graph *g, const ct_exec_bufs *b, ct_step_io *io, const ct_exec_hooks *hooks,
                      ct_err *err) {
    return ct_graph_backward_range(g, 0, g->n_nodes, b, io, hooks, err);
}

const char *ct_graph_layer_name(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].l.name : NULL;
}
const char *ct_graph_layer_type(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].l.type->name : NULL;
}
unsigned ct_graph_layer_flags(const ct_graph *g, int j) {
    if (j < 0 || j >= g->n_nodes) return 0;
    const ct_layer *l = &g->nodes[j].l;
    unsigned f = l->type->flags;
    if (l->type->draws_random) f = l->type->draws_random(l) ? f | CT_LAYER_RANDOM : f & ~(unsigned)CT_LAYER_RANDOM;
    return f;
}
bool ct_graph_decodes(const ct_graph *g, char *why, size_t n) {
    const ct_graph_info *in = &g->info;
    if (in->input_dtype != CT_I32 || in->input_shape.ndim != 1) {
        snprintf(why, n, "needs token ids [T] in");
        return false;
    }
    for (int j = 0; j < g->n_nodes; j++) {
        const ct_layer *l = &g->nodes[j].l;
        bool kind = l->type->flags & (CT_LAYER_PER_POSITION | CT_LAYER_DECODES);
        if (!kind || l->out.ndim < 1 || l->out.d[0] != in->input_shape.d[0]) {
            snprintf(why, n, "cannot run layer \"%s\" (%s) one position at a time", l->name, l->type->name);
            return false;
        }
    }
    return true;
}
size_t ct_graph_layer_kv_bytes(const ct_graph *g, int j, int64_t cap) {
    if (j < 0 || j >= g->n_nodes) return 0;
    const ct_layer *l = &g->nodes[j].l;
    return l->type->kv_bytes ? l->type->kv_bytes(l, g->batch, cap, g->dt) : 0;
}
double ct_graph_layer_flops(const ct_graph *g, int j) {
    if (j < 0 || j >= g->n_nodes) return 0.0;
    const ct_layer *l = &g->nodes[j].l;
    return l->type->flops ? l->type->flops(l) : 0.0;
}
int64_t ct_graph_layer_params(const ct_graph *g, int j) {
    int64_t n = 0;
    for (int v = 0; v < g->layout.n_views; v++)
        if (g->layout.views[v].layer == j && g->layout.views[v].trainable) n += g->layout.views[v].numel;
    return n;
}
void *ct_graph_activation(const ct_graph *g, int j) { return j >= 0 && j < g->n_nodes ? g->nodes[j].y : NULL; }
void *ct_graph_activation_grad(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].dy : NULL;
}

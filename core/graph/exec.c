/* graph_exec.c: the executor. Forward walks the layers in order and ends with the loss; backward
 * walks them in reverse from d(loss), calling the hooks around every layer. Nothing here
 * allocates: every buffer was carved out at build. */
#include "core/graph/internal.h"

/* Pointers for layer j. Buffers (running statistics) are visible only in forward. `input` is the
 * model input as the layers read it (in g->dt, or token ids). */
static void layer_io(const ct_graph *g, int j, const void *params, float *buffers, float *grads,
                     const void *input, const ct_step_io *step, ct_layer_io *io) {
    const ct_gnode *gn = &g->nodes[j];
    *io = (ct_layer_io){.be = g->be, .n = step->n, .dt = g->dt, .y = gn->y, .dy = gn->dy,
                        .aux = gn->aux, .ws = g->ws, .train = step->train, .seed = step->seed,
                        .stream = step->step * (uint64_t)g->n_nodes + (uint64_t)j};
    for (int i = 0; i < gn->l.n_in; i++) {
        int src = gn->l.in_from[i];
        if (src >= 0) io->x[i] = g->nodes[src].y;
        else if (g->info.input_dtype == CT_I32) io->ids = input;
        else io->x[i] = input;
    }
    for (int s = 0; s < gn->n_specs; s++) {
        const ct_param_view *v = &g->views[gn->view[s]];
        if (v->trainable) {
            /* layers never write trainable params */
            io->p[s] = (void *)ct_celem(params, v->offset, g->dt);
            io->dp[s] = grads ? grads + v->offset : NULL;
        } else {
            io->p[s] = buffers ? buffers + v->offset : NULL;
        }
    }
}

/* The model input as the layers read it: token ids, or floats in the graph's dtype (the caller's
 * buffer, or g->input, the 16-bit copy forward makes of an fp32 input). */
static const void *model_input(const ct_graph *g, const ct_step_io *io) {
    return g->info.input_dtype == CT_I32 || io->input_dt == g->dt ? io->input : g->input;
}

static const void *convert_input(ct_graph *g, const ct_step_io *io) {
    const void *in = model_input(g, io);
    if (in == g->input)
        g->be->elt.cast(g->be, g->input, g->dt, io->input, io->input_dt,
                    io->n * ct_shape_numel(&g->info.input_shape));
    return in;
}

/* The loss of the last layer's output. Its gradient, d(mean loss)/d(out) * loss_grad_scale (the
 * loss scale folded in before the 16-bit store, so small gradients survive it), goes straight
 * into the last layer's dy: a train-mode forward is always followed by its backward, and an eval
 * forward writes no gradient at all. */
static void compute_loss(ct_graph *g, ct_step_io *io) {
    ct_backend *be = g->be;
    ct_gnode *last = &g->nodes[g->n_nodes - 1];
    const void *out = last->y;
    void *dout = io->train ? last->dy : NULL;
    float scale = io->loss_grad_scale;
    g->loss_grad_scale = scale;
    int64_t per_sample = ct_shape_numel(&g->info.output_shape);
    switch (g->info.loss) {
    case CT_LOSS_CROSS_ENTROPY: {
        int64_t rows = io->n * per_sample / g->info.classes;
        be->loss.softmax_xent(be, dout, g->loss_result, out, io->target, rows, g->info.classes,
                         (float)g->label_smoothing, scale, g->dt);
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
}

void ct_graph_read_loss(ct_graph *g, ct_step_io *io) {
    float r[2];
    g->be->mem.copy_d2h(g->be, r, g->loss_result, sizeof r);
    io->loss = r[0];
    io->correct = g->info.loss == CT_LOSS_CROSS_ENTROPY ? (int64_t)r[1] : 0;
}

ct_dtype ct_graph_compute_dtype(const ct_graph *g) { return g->dt; }

static int check_n(const ct_graph *g, const ct_step_io *io, ct_err *err) {
    if (io->n < 1 || io->n > g->batch)
        return ct_errf(err, CT_ERR_RUNTIME, "micro-batch of %lld samples, graph built for 1..%lld",
                       (long long)io->n, (long long)g->batch);
    return CT_OK;
}

static int check_input_dt(const ct_graph *g, const ct_step_io *io, ct_err *err) {
    if (g->info.input_dtype == CT_I32 || io->input_dt == CT_F32 || io->input_dt == g->dt) return CT_OK;
    return ct_errf(err, CT_ERR_RUNTIME, "input in %s, the graph reads f32 or %s",
                   ct_dtype_name(io->input_dt), ct_dtype_name(g->dt));
}

int ct_graph_forward(ct_graph *g, const void *params, float *buffers, ct_step_io *io,
                     const ct_exec_hooks *hooks, ct_err *err) {
    int rc = check_n(g, io, err);
    if (!rc) rc = check_input_dt(g, io, err);
    if (rc) return rc;
    const void *input = convert_input(g, io);
    for (int j = 0; j < g->n_nodes; j++) {
        ct_layer_io lio;
        layer_io(g, j, params, buffers, NULL, input, io, &lio);
        if (hooks && hooks->before_forward) hooks->before_forward(hooks->ctx, j);
        g->nodes[j].l.type->forward(&g->nodes[j].l, &lio);
        if (hooks && hooks->after_forward) hooks->after_forward(hooks->ctx, j);
    }
    compute_loss(g, io);
    if (!io->defer_loss) ct_graph_read_loss(g, io);
    return CT_OK;
}

int ct_graph_backward(ct_graph *g, const void *params, float *grads, ct_step_io *io,
                      const ct_exec_hooks *hooks, ct_err *err) {
    int rc = check_n(g, io, err);
    if (rc) return rc;
    /* Layers save batch statistics and masks in train mode only (batchnorm's backward is that of
     * batch statistics), and the train-mode forward wrote d(loss) into the last layer's dy. */
    if (!io->train)
        return ct_errf(err, CT_ERR_RUNTIME, "backward needs a forward in train mode (io.train)");
    if (io->loss_grad_scale != g->loss_grad_scale)
        return ct_errf(err, CT_ERR_RUNTIME, "backward with loss_grad_scale %g after a forward with %g",
                       (double)io->loss_grad_scale, (double)g->loss_grad_scale);
    ct_backend *be = g->be;
    const void *input = model_input(g, io);   /* as forward converted it */
    for (int j = g->n_nodes - 1; j >= 0; j--) {
        ct_gnode *gn = &g->nodes[j];
        if (!gn->runs_backward) continue;
        ct_layer_io lio;
        layer_io(g, j, params, NULL, grads, input, io, &lio);
        for (int i = 0; i < gn->l.n_in; i++) {
            int src = gn->l.in_from[i];
            if (src < 0) continue;   /* the model input needs no gradient */
            lio.dx[i] = gn->tmp_off[i] < 0 ? g->nodes[src].dy : ct_elem(g->dtmp, gn->tmp_off[i], g->dt);
        }
        if (hooks && hooks->before_backward) hooks->before_backward(hooks->ctx, j);
        gn->l.type->backward(&gn->l, &lio);
        /* A second consumer of an activation adds its gradient to the first one's (in 16 bits
         * under mixed precision: one rounding of the sum, as a GPU add would). */
        for (int i = 0; i < gn->l.n_in; i++) {
            if (gn->l.in_from[i] < 0 || gn->tmp_off[i] < 0) continue;
            int64_t numel = io->n * ct_layer_in_numel(&gn->l, i);
            be->elt.axpy(be, g->nodes[gn->l.in_from[i]].dy, 1.0f, lio.dx[i], numel, g->dt);
        }
        if (hooks && hooks->after_backward) hooks->after_backward(hooks->ctx, j);
    }
    return CT_OK;
}

const char *ct_graph_layer_name(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].l.name : NULL;
}
const char *ct_graph_layer_type(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].l.type->name : NULL;
}
void *ct_graph_activation(const ct_graph *g, int j) { return j >= 0 && j < g->n_nodes ? g->nodes[j].y : NULL; }
void *ct_graph_activation_grad(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].dy : NULL;
}

/* graph_exec.c: the executor. Forward walks the layers in order and ends with the loss; backward
 * walks them in reverse from d(loss), calling the hooks around every layer. Nothing here
 * allocates: every buffer was carved out at build. */
#include "core/graph_impl.h"

/* Pointers for layer j. Buffers (running statistics) are visible only in forward. */
static void layer_io(const ct_graph *g, int j, const float *params, float *buffers, float *grads,
                     const ct_step_io *step, ct_layer_io *io) {
    const ct_gnode *gn = &g->nodes[j];
    *io = (ct_layer_io){.be = g->be, .n = step->n, .y = gn->y, .dy = gn->dy, .aux = gn->aux,
                        .ws = g->ws, .train = step->train, .seed = step->seed,
                        .stream = step->step * (uint64_t)g->n_nodes + (uint64_t)j};
    for (int i = 0; i < gn->l.n_in; i++) {
        int src = gn->l.in_from[i];
        if (src >= 0) io->x[i] = g->nodes[src].y;
        else if (g->info.input_dtype == CT_I32) io->ids = step->input;
        else io->x[i] = step->input;
    }
    for (int s = 0; s < gn->n_specs; s++) {
        const ct_param_view *v = &g->views[gn->view[s]];
        if (v->trainable) {
            io->p[s] = (float *)params + v->offset;   /* layers never write trainable params */
            io->dp[s] = grads ? grads + v->offset : NULL;
        } else {
            io->p[s] = buffers ? buffers + v->offset : NULL;
        }
    }
}

static void compute_loss(ct_graph *g, ct_step_io *io) {
    ct_backend *be = g->be;
    const float *out = g->nodes[g->n_nodes - 1].y;
    int64_t per_sample = ct_shape_numel(&g->info.output_shape);
    io->correct = 0;
    switch (g->info.loss) {
    case CT_LOSS_CROSS_ENTROPY: {
        int64_t rows = io->n * per_sample / g->info.classes;
        be->softmax_xent(be, g->dloss, &io->loss, &io->correct, out, io->target, rows, g->info.classes,
                         (float)g->label_smoothing, 1.0f);
        break;
    }
    case CT_LOSS_MSE:
        be->mse_loss(be, g->dloss, &io->loss, out, io->target, io->n, per_sample, 1.0f);
        break;
    case CT_LOSS_BCE_WITH_LOGITS:
        be->bce_logits_loss(be, g->dloss, &io->loss, out, io->target, io->n, per_sample, 1.0f);
        break;
    }
}

void ct_graph_set_compute_dtype(ct_graph *g, ct_dtype dt) {
    g->compute_dtype = dt == CT_F16 || dt == CT_BF16 ? dt : CT_F32;
}
ct_dtype ct_graph_compute_dtype(const ct_graph *g) { return g->compute_dtype; }

/* Mixed precision: x[n] now holds exactly the values a 16-bit tensor would (graph.h). */
static void round_values(const ct_graph *g, float *x, int64_t n) {
    if (g->compute_dtype != CT_F32) g->be->round_to(g->be, x, n, g->compute_dtype);
}

static int check_n(const ct_graph *g, const ct_step_io *io, ct_err *err) {
    if (io->n < 1 || io->n > g->batch)
        return ct_errf(err, CT_ERR_RUNTIME, "micro-batch of %lld samples, graph built for 1..%lld",
                       (long long)io->n, (long long)g->batch);
    return CT_OK;
}

int ct_graph_forward(ct_graph *g, const float *params, float *buffers, ct_step_io *io,
                     const ct_exec_hooks *hooks, ct_err *err) {
    int rc = check_n(g, io, err);
    if (rc) return rc;
    for (int j = 0; j < g->n_nodes; j++) {
        ct_layer_io lio;
        layer_io(g, j, params, buffers, NULL, io, &lio);
        if (hooks && hooks->before_forward) hooks->before_forward(hooks->ctx, j);
        g->nodes[j].l.type->forward(&g->nodes[j].l, &lio);
        round_values(g, g->nodes[j].y, io->n * ct_layer_out_numel(&g->nodes[j].l));
        if (hooks && hooks->after_forward) hooks->after_forward(hooks->ctx, j);
    }
    compute_loss(g, io);
    return CT_OK;
}

int ct_graph_backward(ct_graph *g, const float *params, float *grads, ct_step_io *io,
                      const ct_exec_hooks *hooks, ct_err *err) {
    int rc = check_n(g, io, err);
    if (rc) return rc;
    /* Layers save batch statistics and masks in train mode only (batchnorm's backward is that of
     * batch statistics), so a gradient is defined only after a train-mode forward. */
    if (!io->train)
        return ct_errf(err, CT_ERR_RUNTIME, "backward needs a forward in train mode (io.train)");
    ct_backend *be = g->be;
    ct_gnode *last = &g->nodes[g->n_nodes - 1];
    int64_t n_out = io->n * ct_layer_out_numel(&last->l);
    /* dy_last = loss_grad_scale * d(mean loss)/d(out); forward left the unscaled gradient. */
    be->memset0(be, last->dy, (size_t)n_out * sizeof(float));
    be->axpy(be, last->dy, io->loss_grad_scale, g->dloss, n_out);
    round_values(g, last->dy, n_out);  /* the loss is fp32; the gradient it hands back is not */
    for (int j = g->n_nodes - 1; j >= 0; j--) {
        ct_gnode *gn = &g->nodes[j];
        if (!gn->runs_backward) continue;
        ct_layer_io lio;
        layer_io(g, j, params, NULL, grads, io, &lio);
        for (int i = 0; i < gn->l.n_in; i++) {
            int src = gn->l.in_from[i];
            if (src < 0) continue;   /* the model input needs no gradient */
            lio.dx[i] = gn->tmp_off[i] < 0 ? g->nodes[src].dy : g->dtmp + gn->tmp_off[i];
        }
        if (hooks && hooks->before_backward) hooks->before_backward(hooks->ctx, j);
        gn->l.type->backward(&gn->l, &lio);
        /* A second consumer of an activation adds its gradient to the first one's (a 16-bit add:
         * both terms and the sum are rounded). */
        for (int i = 0; i < gn->l.n_in; i++) {
            if (gn->l.in_from[i] < 0) continue;
            int64_t numel = io->n * ct_layer_in_numel(&gn->l, i);
            round_values(g, lio.dx[i], numel);
            if (gn->tmp_off[i] < 0) continue;
            float *dst = g->nodes[gn->l.in_from[i]].dy;
            be->axpy(be, dst, 1.0f, lio.dx[i], numel);
            round_values(g, dst, numel);
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
float *ct_graph_activation(const ct_graph *g, int j) { return j >= 0 && j < g->n_nodes ? g->nodes[j].y : NULL; }
float *ct_graph_activation_grad(const ct_graph *g, int j) {
    return j >= 0 && j < g->n_nodes ? g->nodes[j].dy : NULL;
}

/* dropout: in train mode zero each element with probability p and scale the rest by 1/(1-p);
 * identity in eval mode. The mask (uint8, in aux) comes from ct_rng keyed by (seed, step, layer),
 * so it is the same on every backend and thread count. */
#include "core/graph/layer.h"

typedef struct {
    double p;
} dropout_cfg;

static const char *const fields[] = {"p", NULL};

static int parse(ct_layer *l, ct_err *err) {
    dropout_cfg *c = l->cfg_data;
    return ct_layer_num(l, "p", 0.5, 0.0, 1.0, true, &c->p, err);
}

static int infer(ct_layer *l, ct_err *err) {
    l->out = l->in[0];
    return CT_OK;
}

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return (size_t)(batch * ct_layer_out_numel(l));
}

static bool active(const ct_layer *l, const ct_layer_io *io) {
    return io->train && ((const dropout_cfg *)l->cfg_data)->p > 0;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    int64_t n = io->n * ct_layer_out_numel(l);
    if (active(l, io))
        io->be->elt.dropout_forward(io->be, io->y, io->aux, io->x[0], n,
                                (float)((const dropout_cfg *)l->cfg_data)->p, io->seed, io->stream,
                                io->dt);
    else
        io->be->mem.copy_d2d(io->be, io->y, io->x[0], ct_nbytes(n, io->dt));
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    int64_t n = io->n * ct_layer_out_numel(l);
    if (!io->dx[0]) return;
    if (active(l, io))
        io->be->elt.dropout_backward(io->be, io->dx[0], io->dy, io->aux, n,
                                 (float)((const dropout_cfg *)l->cfg_data)->p, io->dt);
    else
        io->be->mem.copy_d2d(io->be, io->dx[0], io->dy, ct_nbytes(n, io->dt));
}

static double flops(const ct_layer *l) { return (double)ct_layer_out_numel(l); }

const ct_layer_type ct_layer_dropout = {
    .name = "dropout", .flags = CT_LAYER_RANDOM | CT_LAYER_PER_POSITION, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(dropout_cfg), .parse = parse, .infer = infer, .aux_bytes = aux_bytes,
    .forward = forward, .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dx = dy * mask (aux) */
};

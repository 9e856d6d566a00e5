/* add: element-wise sum of two or more inputs of the same shape (residual connections).
 *   x_i [n, ...] -> y [n, ...];  dx_i = dy */
#include "core/graph/layer.h"

static const char *const fields[] = {NULL};

static int parse(ct_layer *l, ct_err *err) { return CT_OK; }

static int infer(ct_layer *l, ct_err *err) {
    char a[96], b[96];
    for (int i = 1; i < l->n_in; i++)
        if (!ct_shape_eq(&l->in[i], &l->in[0]))
            return ct_layer_errf(l, err, NULL, "input %d is %s (from %s), expected %s like input 0 (from %s)",
                                 i, ct_shape_str(&l->in[i], a, sizeof a), l->in_name[i],
                                 ct_shape_str(&l->in[0], b, sizeof b), l->in_name[0]);
    l->out = l->in[0];
    return CT_OK;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    int64_t n = io->n * ct_layer_out_numel(l);
    io->be->elt.add(io->be, io->y, io->x[0], io->x[1], n, io->dt);
    for (int i = 2; i < l->n_in; i++) io->be->elt.axpy(io->be, io->y, 1.0f, io->x[i], n, io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    size_t bytes = ct_nbytes(io->n * ct_layer_out_numel(l), io->dt);
    for (int i = 0; i < l->n_in; i++)
        if (io->dx[i]) io->be->mem.copy_d2d(io->be, io->dx[i], io->dy, bytes);
}

static double flops(const ct_layer *l) { return (double)(l->n_in - 1) * (double)ct_layer_out_numel(l); }

const ct_layer_type ct_layer_add = {
    .name = "add", .flags = CT_LAYER_PER_POSITION, .fields = fields, .min_inputs = 2, .max_inputs = CT_LAYER_MAX_IN,
    .cfg_size = 0, .parse = parse, .infer = infer, .forward = forward, .backward = backward,
    .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dx_i = dy */
};

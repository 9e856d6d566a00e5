/* rmsnorm: Llama's normalisation over the last dimension, a weight and no bias:
 *   x [n, ..., d]   weight [d]   y = x / sqrt(mean(x^2) + eps) * weight
 * aux keeps 1/rms of every row [n * rows_per_sample] (fp32) for backward, which reads x. */
#include "core/graph/layers/norm.h"

static int parse(ct_layer *l, ct_err *err) { return ct_norm_parse(l, 1e-6, err); }

static int params(const ct_layer *l, ct_param_spec *s) {
    s[0] = (ct_param_spec){.suffix = "weight", .shape = {1, {ct_norm_dim(l)}}, .trainable = true,
                           .init = {CT_INIT_ONES}};
    return 1;
}

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return (size_t)ct_norm_rows(l, batch) * sizeof(float);
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const ct_norm_cfg *c = l->cfg_data;
    io->be->norm.rmsnorm_forward(io->be, io->y, io->aux, io->x[0], io->p[0], ct_norm_rows(l, io->n),
                                 ct_norm_dim(l), (float)c->eps, io->dt);
}

/* dx may be NULL (the model input): the op then computes the weight's gradient alone. */
static void backward(const ct_layer *l, const ct_layer_io *io) {
    io->be->norm.rmsnorm_backward(io->be, io->dx[0], io->dp[0], io->dy, io->x[0], io->p[0], io->aux,
                                  ct_norm_rows(l, io->n), ct_norm_dim(l), io->dt);
}

/* per element: a square and its sum, then two products */
static double flops(const ct_layer *l) { return 4.0 * (double)ct_layer_in_numel(l, 0); }

const ct_layer_type ct_layer_rmsnorm = {
    .name = "rmsnorm", .flags = CT_LAYER_PER_POSITION, .fields = ct_norm_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(ct_norm_cfg), .parse = parse, .infer = ct_norm_infer, .params = params,
    .aux_bytes = aux_bytes, .forward = forward, .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* x, with the saved 1/rms */
};

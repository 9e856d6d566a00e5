/* layernorm: normalization over the last dimension, with affine gamma/beta.
 *   x [n, ..., d]   gamma, beta [d]   y like x
 * aux keeps the mean and 1/std of every row [n * rows_per_sample] for backward. */
#include "core/graph/layers/norm.h"

static int parse(ct_layer *l, ct_err *err) { return ct_norm_parse(l, 1e-5, err); }

static int params(const ct_layer *l, ct_param_spec *s) {
    ct_shape sh = {1, {ct_norm_dim(l)}};
    s[0] = (ct_param_spec){.suffix = "weight", .shape = sh, .trainable = true, .init = {CT_INIT_ONES}};
    s[1] = (ct_param_spec){.suffix = "bias", .shape = sh, .trainable = true, .is_bias = true,
                           .init = {CT_INIT_ZEROS}};
    return 2;
}

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return 2 * (size_t)ct_norm_rows(l, batch) * sizeof(float);
}

static size_t workspace_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return l->in_from[0] < 0 ? ct_nbytes(batch * ct_layer_in_numel(l, 0), dt) : 0;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const ct_norm_cfg *c = l->cfg_data;
    int64_t r = ct_norm_rows(l, io->n);
    float *save = io->aux;   /* mean [r], rstd [r] */
    io->be->norm.layernorm_forward(io->be, io->y, save, save + r, io->x[0], io->p[0], io->p[1], r, ct_norm_dim(l),
                              (float)c->eps, io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    int64_t r = ct_norm_rows(l, io->n);
    const float *save = io->aux;
    void *dx = io->dx[0] ? io->dx[0] : io->ws;
    io->be->norm.layernorm_backward(io->be, dx, io->dp[0], io->dp[1], io->dy, io->x[0], io->p[0], save,
                               save + r, r, ct_norm_dim(l), io->dt);
}

static double flops(const ct_layer *l) { return 8.0 * (double)ct_layer_in_numel(l, 0); }

const ct_layer_type ct_layer_layernorm = {
    .name = "layernorm", .flags = CT_LAYER_PER_POSITION, .fields = ct_norm_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(ct_norm_cfg), .parse = parse, .infer = ct_norm_infer, .params = params,
    .aux_bytes = aux_bytes, .workspace_bytes = workspace_bytes, .forward = forward,
    .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* x, with the saved mean and 1/std */
};

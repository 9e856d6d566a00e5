/* layernorm: normalization over the last dimension, with affine gamma/beta.
 *   x [n, ..., d]   gamma, beta [d]   y like x
 * aux keeps the mean and 1/std of every row [n * rows_per_sample] for backward. */
#include "core/graph/layer.h"

typedef struct {
    int64_t d_check;
    double eps;
} ln_cfg;

static const char *const fields[] = {"dim", "eps", NULL};

static int parse(ct_layer *l, ct_err *err) {
    ln_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "dim", false, 0, 1, &c->d_check, err);
    if (!rc) rc = ct_layer_num(l, "eps", 1e-5, 0.0, 1.0, false, &c->eps, err);
    if (!rc && c->eps <= 0) rc = ct_layer_errf(l, err, NULL, "eps: expected a number > 0");
    return rc;
}

static int64_t dim(const ct_layer *l) { return l->in[0].d[l->in[0].ndim - 1]; }
static int64_t rows(const ct_layer *l, int64_t n) { return n * ct_layer_in_numel(l, 0) / dim(l); }

static int infer(ct_layer *l, ct_err *err) {
    const ln_cfg *c = l->cfg_data;
    if (l->in[0].ndim < 1)
        return ct_layer_errf(l, err, NULL, "input is a scalar per sample (from %s)", l->in_name[0]);
    if (c->d_check && dim(l) != c->d_check)
        return ct_layer_errf(l, err, NULL, "input has %lld features, expected %lld (from %s)",
                             (long long)dim(l), (long long)c->d_check, l->in_name[0]);
    l->out = l->in[0];
    return CT_OK;
}

static int params(const ct_layer *l, ct_param_spec *s) {
    ct_shape sh = {1, {dim(l)}};
    s[0] = (ct_param_spec){.suffix = "weight", .shape = sh, .trainable = true, .init = {CT_INIT_ONES}};
    s[1] = (ct_param_spec){.suffix = "bias", .shape = sh, .trainable = true, .is_bias = true,
                           .init = {CT_INIT_ZEROS}};
    return 2;
}

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return 2 * (size_t)rows(l, batch) * sizeof(float);
}

static size_t workspace_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return l->in_from[0] < 0 ? ct_nbytes(batch * ct_layer_in_numel(l, 0), dt) : 0;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const ln_cfg *c = l->cfg_data;
    int64_t r = rows(l, io->n);
    float *save = io->aux;   /* mean [r], rstd [r] */
    io->be->norm.layernorm_forward(io->be, io->y, save, save + r, io->x[0], io->p[0], io->p[1], r, dim(l),
                              (float)c->eps, io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    int64_t r = rows(l, io->n);
    const float *save = io->aux;
    void *dx = io->dx[0] ? io->dx[0] : io->ws;
    io->be->norm.layernorm_backward(io->be, dx, io->dp[0], io->dp[1], io->dy, io->x[0], io->p[0], save,
                               save + r, r, dim(l), io->dt);
}

static double flops(const ct_layer *l) { return 8.0 * (double)ct_layer_in_numel(l, 0); }

const ct_layer_type ct_layer_layernorm = {
    .name = "layernorm", .flags = CT_LAYER_PER_POSITION, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(ln_cfg), .parse = parse, .infer = infer, .params = params,
    .aux_bytes = aux_bytes, .workspace_bytes = workspace_bytes, .forward = forward,
    .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* x, with the saved mean and 1/std */
};

/* batchnorm2d: per-channel normalization over (n, h, w), with affine gamma/beta and running
 * statistics (buffers: not trained, updated in train mode with `momentum`, used in eval mode).
 *   x [n, c, h, w] (or [n, c])   gamma, beta, running_mean, running_var [c]   y like x
 * aux keeps the batch mean and 1/std [c] for backward. */
#include "core/graph/layer.h"

typedef struct {
    int64_t c_check;
    double eps, momentum;
} bn_cfg;

static const char *const fields[] = {"num_features", "eps", "momentum", NULL};

static int parse(ct_layer *l, ct_err *err) {
    bn_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "num_features", false, 0, 1, &c->c_check, err);
    if (!rc) rc = ct_layer_num(l, "eps", 1e-5, 0.0, 1.0, false, &c->eps, err);
    if (!rc) rc = ct_layer_num(l, "momentum", 0.1, 0.0, 1.0, false, &c->momentum, err);
    if (!rc && c->eps <= 0) rc = ct_layer_errf(l, err, NULL, "eps: expected a number > 0");
    return rc;
}

static int infer(ct_layer *l, ct_err *err) {
    const bn_cfg *c = l->cfg_data;
    char s[96];
    if (l->in[0].ndim != 3 && l->in[0].ndim != 1)
        return ct_layer_errf(l, err, NULL, "input is %s per sample, expected [C, H, W] or [C] (from %s)",
                             ct_shape_str(&l->in[0], s, sizeof s), l->in_name[0]);
    if (c->c_check && l->in[0].d[0] != c->c_check)
        return ct_layer_errf(l, err, NULL, "input has %lld channels, expected %lld (from %s)",
                             (long long)l->in[0].d[0], (long long)c->c_check, l->in_name[0]);
    l->out = l->in[0];
    return CT_OK;
}

static int params(const ct_layer *l, ct_param_spec *s) {
    ct_shape sh = {1, {l->in[0].d[0]}};
    s[0] = (ct_param_spec){.suffix = "weight", .shape = sh, .trainable = true, .init = {CT_INIT_ONES}};
    s[1] = (ct_param_spec){.suffix = "bias", .shape = sh, .trainable = true, .is_bias = true,
                           .init = {CT_INIT_ZEROS}};
    s[2] = (ct_param_spec){.suffix = "running_mean", .shape = sh, .init = {CT_INIT_ZEROS}};
    s[3] = (ct_param_spec){.suffix = "running_var", .shape = sh, .init = {CT_INIT_ONES}};
    return 4;
}

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return 2 * (size_t)l->in[0].d[0] * sizeof(float);
}

/* Backward needs somewhere to write dx even when the model input needs no gradient. */
static size_t workspace_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return l->in_from[0] < 0 ? ct_nbytes(batch * ct_layer_in_numel(l, 0), dt) : 0;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const bn_cfg *c = l->cfg_data;
    int64_t ch = l->in[0].d[0], hw = ct_layer_in_numel(l, 0) / ch;
    float *save = io->aux;
    /* A recomputed forward normalises with the same batch statistics; the running statistics
     * were updated by the first forward and must not move twice. */
    float *run_mean = io->recompute ? NULL : io->p[2], *run_var = io->recompute ? NULL : io->p[3];
    io->be->norm.batchnorm_forward(io->be, io->y, io->x[0], io->p[0], io->p[1], run_mean, run_var,
                                   save, save + ch, io->n, ch, hw, (float)c->eps,
                                   (float)c->momentum, io->train, io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    int64_t ch = l->in[0].d[0], hw = ct_layer_in_numel(l, 0) / ch;
    const float *save = io->aux;
    void *dx = io->dx[0] ? io->dx[0] : io->ws;
    io->be->norm.batchnorm_backward(io->be, dx, io->dp[0], io->dp[1], io->dy, io->x[0], io->p[0], save,
                               save + ch, io->n, ch, hw, io->dt);
}

static double flops(const ct_layer *l) { return 8.0 * (double)ct_layer_in_numel(l, 0); }

const ct_layer_type ct_layer_batchnorm2d = {
    .name = "batchnorm2d", .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(bn_cfg), .parse = parse, .infer = infer, .params = params,
    .aux_bytes = aux_bytes, .workspace_bytes = workspace_bytes, .forward = forward,
    .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* x, with the saved batch statistics */
};

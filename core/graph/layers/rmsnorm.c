/* rmsnorm: Llama's normalisation over the last dimension, a weight and no bias:
 *   x [n, ..., d]   weight [d]   y = x / sqrt(mean(x^2) + eps) * weight
 * aux keeps 1/rms of every row [n * rows_per_sample] (fp32) for backward, which reads x. */
#include "core/graph/layer.h"

typedef struct {
    int64_t d_check;
    double eps;
} rms_cfg;

static const char *const fields[] = {"dim", "eps", NULL};

static int parse(ct_layer *l, ct_err *err) {
    rms_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "dim", false, 0, 1, &c->d_check, err);
    if (!rc) rc = ct_layer_num(l, "eps", 1e-6, 0.0, 1.0, false, &c->eps, err);
    if (!rc && c->eps <= 0) rc = ct_layer_errf(l, err, NULL, "eps: expected a number > 0");
    return rc;
}

static int64_t dim(const ct_layer *l) { return l->in[0].d[l->in[0].ndim - 1]; }
static int64_t rows(const ct_layer *l, int64_t n) { return n * ct_layer_in_numel(l, 0) / dim(l); }

static int infer(ct_layer *l, ct_err *err) {
    const rms_cfg *c = l->cfg_data;
    if (l->in[0].ndim < 1)
        return ct_layer_errf(l, err, NULL, "input is a scalar per sample (from %s)", l->in_name[0]);
    if (c->d_check && dim(l) != c->d_check)
        return ct_layer_errf(l, err, NULL, "input has %lld features, expected %lld (from %s)",
                             (long long)dim(l), (long long)c->d_check, l->in_name[0]);
    l->out = l->in[0];
    return CT_OK;
}

static int params(const ct_layer *l, ct_param_spec *s) {
    s[0] = (ct_param_spec){.suffix = "weight", .shape = {1, {dim(l)}}, .trainable = true, .init = {CT_INIT_ONES}};
    return 1;
}

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return (size_t)rows(l, batch) * sizeof(float);
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const rms_cfg *c = l->cfg_data;
    io->be->norm.rmsnorm_forward(io->be, io->y, io->aux, io->x[0], io->p[0], rows(l, io->n), dim(l),
                                 (float)c->eps, io->dt);
}

/* dx may be NULL (the model input): the op then computes the weight's gradient alone. */
static void backward(const ct_layer *l, const ct_layer_io *io) {
    io->be->norm.rmsnorm_backward(io->be, io->dx[0], io->dp[0], io->dy, io->x[0], io->p[0], io->aux,
                                  rows(l, io->n), dim(l), io->dt);
}

/* per element: a square and its sum, then two products */
static double flops(const ct_layer *l) { return 4.0 * (double)ct_layer_in_numel(l, 0); }

const ct_layer_type ct_layer_rmsnorm = {
    .name = "rmsnorm", .flags = CT_LAYER_PER_POSITION, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(rms_cfg), .parse = parse, .infer = infer, .params = params,
    .aux_bytes = aux_bytes, .forward = forward, .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* x, with the saved 1/rms */
};

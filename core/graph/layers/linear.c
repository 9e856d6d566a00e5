/* linear: y = x W^T + b over the last dimension of any-rank input.
 *   x [n, ..., in]   W [out, in]   b [out]   y [n, ..., out] */
#include <math.h>

#include "core/graph/layer.h"

typedef struct {
    int64_t out, in_check;     /* in_check: optional "in" field, 0 when absent */
    bool bias;
} linear_cfg;

static const char *const fields[] = {"out", "in", "bias", NULL};

static int parse(ct_layer *l, ct_err *err) {
    linear_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "out", true, 0, 1, &c->out, err);
    if (!rc) rc = ct_layer_int(l, "in", false, 0, 1, &c->in_check, err);
    if (!rc) rc = ct_layer_bool(l, "bias", true, &c->bias, err);
    return rc;
}

static int64_t in_features(const ct_layer *l) { return l->in[0].d[l->in[0].ndim - 1]; }
static int64_t rows_per_sample(const ct_layer *l) { return ct_layer_in_numel(l, 0) / in_features(l); }

static int infer(ct_layer *l, ct_err *err) {
    const linear_cfg *c = l->cfg_data;
    if (l->in[0].ndim < 1)
        return ct_layer_errf(l, err, NULL, "input is a scalar per sample (from %s)", l->in_name[0]);
    if (c->in_check && in_features(l) != c->in_check)
        return ct_layer_errf(l, err, NULL, "input has %lld features, expected %lld (from %s)",
                             (long long)in_features(l), (long long)c->in_check, l->in_name[0]);
    l->out = l->in[0];
    l->out.d[l->out.ndim - 1] = c->out;
    return CT_OK;
}

static int params(const ct_layer *l, ct_param_spec *s) {
    const linear_cfg *c = l->cfg_data;
    int64_t in = in_features(l);
    double bound = 1.0 / sqrt((double)in);
    s[0] = (ct_param_spec){.suffix = "weight", .shape = {2, {c->out, in}}, .weight_decay = true,
                           .trainable = true,
                           .init = {CT_INIT_KAIMING_UNIFORM, sqrt(5.0), 0, in, c->out}};
    if (!c->bias) return 1;
    s[1] = (ct_param_spec){.suffix = "bias", .shape = {1, {c->out}}, .trainable = true, .is_bias = true,
                           .init = {CT_INIT_UNIFORM, -bound, bound, in, c->out}};
    return 2;
}

/* A backend with a fused linear op (bias in the GEMM epilogue) gets one call; otherwise
 * y [rows, out] = x [rows, in] W^T [in, out], then the bias. */
static void forward_rows(const ct_layer *l, const ct_layer_io *io, int64_t rows) {
    const linear_cfg *c = l->cfg_data;
    ct_backend *be = io->be;
    int64_t in = in_features(l);
    const void *bias = c->bias ? io->p[1] : NULL;
    if (be->blas.linear_forward) {
        be->blas.linear_forward(be, io->y, io->x[0], io->p[0], bias, rows, in, c->out, CT_ACT_NONE, 0.0f,
                           io->dt);
        return;
    }
    be->blas.gemm(be, false, true, rows, c->out, in, 1.0f, io->x[0], io->dt, in, io->p[0], io->dt, in,
             0.0f, io->y, io->dt, c->out);
    if (bias) be->elt.bias_act_forward(be, io->y, bias, rows, c->out, 1, CT_ACT_NONE, 0.0f, io->dt);
}

static void backward_rows(const ct_layer *l, const ct_layer_io *io, int64_t rows) {
    const linear_cfg *c = l->cfg_data;
    ct_backend *be = io->be;
    int64_t in = in_features(l);
    /* dW[out, in] += dy^T [out, rows] x [rows, in] */
    be->blas.gemm(be, true, false, c->out, in, rows, 1.0f, io->dy, io->dt, c->out, io->x[0], io->dt, in,
             1.0f, io->dp[0], CT_F32, in);
    if (c->bias) be->elt.bias_backward(be, io->dp[1], io->dy, rows, c->out, 1, io->dt);
    /* dx[rows, in] = dy [rows, out] W [out, in] */
    if (io->dx[0])
        be->blas.gemm(be, false, false, rows, in, c->out, 1.0f, io->dy, io->dt, c->out, io->p[0], io->dt,
                 in, 0.0f, io->dx[0], io->dt, in);
}

static void forward(const ct_layer *l, const ct_layer_io *io) { forward_rows(l, io, io->n * rows_per_sample(l)); }
static void backward(const ct_layer *l, const ct_layer_io *io) { backward_rows(l, io, io->n * rows_per_sample(l)); }

static double flops(const ct_layer *l) {
    const linear_cfg *c = l->cfg_data;
    return 2.0 * (double)rows_per_sample(l) * (double)in_features(l) * (double)c->out;
}

const ct_layer_type ct_layer_linear = {
    .name = "linear", .flags = CT_LAYER_PER_POSITION, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(linear_cfg), .parse = parse, .infer = infer, .params = params,
    .forward = forward, .backward = backward, .flops = flops,
    .forward_rows = forward_rows, .backward_rows = backward_rows,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* dW = dy^T x */
};

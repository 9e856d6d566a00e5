/* conv2d: 2-D convolution, NCHW. A backend with whole-batch conv2d ops (the CPU's) gets the batch
 * in one call; otherwise per image and group: im2col then one GEMM.
 *   x [n, c, h, w]   W [oc, c/groups, kh, kw]   b [oc]   y [n, oc, oh, ow]
 * The column matrix col [c/groups * kh * kw, oh * ow] lives in the shared workspace; backward
 * rebuilds it instead of keeping one per image, which keeps activation memory at one copy of x.
 * Measured against the alternative (im2col of the whole batch side by side [kg, n * oh * ow] via
 * copy_rows, one GEMM per group, scatter back) on the fmnist CNN at batch 128, 2-core box:
 * per image took 66-81 ms per forward+backward step against 93-109 (2 threads) and 84-105 ms
 * CPU against 121-165 (1 thread), with a 0.4 MiB instead of a 34 MiB workspace: the copies cost
 * more than the bigger GEMMs gain. */
#include <math.h>

#include "core/graph/layer.h"

typedef struct {
    int64_t out, in_check, k[2], stride[2], pad[2], dil[2], groups;
    bool bias;
} conv_cfg;

static const char *const fields[] = {"out", "in_channels", "kernel", "stride", "padding",
                                     "dilation", "groups", "bias", NULL};

static int parse(ct_layer *l, ct_err *err) {
    conv_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "out", true, 0, 1, &c->out, err);
    if (!rc) rc = ct_layer_int(l, "in_channels", false, 0, 1, &c->in_check, err);
    if (!rc) rc = ct_layer_int2(l, "kernel", true, 0, 1, c->k, err);
    if (!rc) rc = ct_layer_int2(l, "stride", false, 1, 1, c->stride, err);
    if (!rc) rc = ct_layer_int2(l, "padding", false, 0, 0, c->pad, err);
    if (!rc) rc = ct_layer_int2(l, "dilation", false, 1, 1, c->dil, err);
    if (!rc) rc = ct_layer_int(l, "groups", false, 1, 1, &c->groups, err);
    if (!rc) rc = ct_layer_bool(l, "bias", true, &c->bias, err);
    if (!rc && c->out % c->groups)
        rc = ct_layer_errf(l, err, NULL, "out (%lld) must be divisible by groups (%lld)",
                           (long long)c->out, (long long)c->groups);
    return rc;
}

static ct_conv2d_geom geom(const ct_layer *l, int64_t n) {
    const conv_cfg *c = l->cfg_data;
    return (ct_conv2d_geom){.n = n, .c = l->in[0].d[0], .h = l->in[0].d[1], .w = l->in[0].d[2],
                            .oc = c->out, .kh = c->k[0], .kw = c->k[1], .stride_h = c->stride[0],
                            .stride_w = c->stride[1], .pad_h = c->pad[0], .pad_w = c->pad[1],
                            .dil_h = c->dil[0], .dil_w = c->dil[1], .groups = c->groups,
                            .oh = l->out.d[1], .ow = l->out.d[2]};
}

static int infer(ct_layer *l, ct_err *err) {
    const conv_cfg *c = l->cfg_data;
    char s[96];
    if (l->in[0].ndim != 3)
        return ct_layer_errf(l, err, NULL, "input is %s per sample, expected [C, H, W] (from %s)",
                             ct_shape_str(&l->in[0], s, sizeof s), l->in_name[0]);
    int64_t ch = l->in[0].d[0];
    if (c->in_check && ch != c->in_check)
        return ct_layer_errf(l, err, NULL, "input has %lld channels, expected %lld (from %s)",
                             (long long)ch, (long long)c->in_check, l->in_name[0]);
    if (ch % c->groups)
        return ct_layer_errf(l, err, NULL, "input has %lld channels, not divisible by groups %lld (from %s)",
                             (long long)ch, (long long)c->groups, l->in_name[0]);
    int64_t oh = ct_conv_out_size(l->in[0].d[1], c->k[0], c->stride[0], c->pad[0], c->dil[0]);
    int64_t ow = ct_conv_out_size(l->in[0].d[2], c->k[1], c->stride[1], c->pad[1], c->dil[1]);
    if (oh < 1 || ow < 1)
        return ct_layer_errf(l, err, NULL, "kernel %lldx%lld does not fit the %s input (output would be %lldx%lld)",
                             (long long)c->k[0], (long long)c->k[1],
                             ct_shape_str(&l->in[0], s, sizeof s), (long long)oh, (long long)ow);
    l->out = (ct_shape){3, {c->out, oh, ow}};
    return CT_OK;
}

static int64_t col_rows(const ct_layer *l) {   /* c/groups * kh * kw */
    const conv_cfg *c = l->cfg_data;
    return l->in[0].d[0] / c->groups * c->k[0] * c->k[1];
}

static int params(const ct_layer *l, ct_param_spec *s) {
    const conv_cfg *c = l->cfg_data;
    int64_t fan_in = col_rows(l), fan_out = c->out / c->groups * c->k[0] * c->k[1];
    double bound = 1.0 / sqrt((double)fan_in);
    s[0] = (ct_param_spec){.suffix = "weight", .trainable = true, .weight_decay = true,
                           .shape = {4, {c->out, l->in[0].d[0] / c->groups, c->k[0], c->k[1]}},
                           .init = {CT_INIT_KAIMING_UNIFORM, sqrt(5.0), 0, fan_in, fan_out}};
    if (!c->bias) return 1;
    s[1] = (ct_param_spec){.suffix = "bias", .shape = {1, {c->out}}, .trainable = true, .is_bias = true,
                           .init = {CT_INIT_UNIFORM, -bound, bound, fan_in, fan_out}};
    return 2;
}

static size_t workspace_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    int64_t p = l->out.d[1] * l->out.d[2];
    return 2 * ct_nbytes(col_rows(l) * p, dt);   /* col and dcol, in the activation dtype */
}

static size_t device_scratch_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    ct_conv2d_geom g = geom(l, batch);
    return ct_conv2d_scratch_bytes(&g, ct_dtype_size(dt));
}

/* The sizes both passes use: per group, W_grp is [ocg, kg], a column buffer [kg, p], y [ocg, p];
 * in_sz and out_sz are one sample's input and output elements. */
typedef struct conv_dims {
    ct_conv2d_geom g;
    int64_t kg, p, ocg, in_sz, out_sz;
} conv_dims;

static conv_dims dims_of(const ct_layer *l, int64_t n) {
    const conv_cfg *c = l->cfg_data;
    conv_dims d = {.g = geom(l, n), .kg = col_rows(l), .ocg = c->out / c->groups,
                   .in_sz = ct_layer_in_numel(l, 0), .out_sz = ct_layer_out_numel(l)};
    d.p = d.g.oh * d.g.ow;
    return d;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const conv_cfg *c = l->cfg_data;
    ct_backend *be = io->be;
    conv_dims d = dims_of(l, io->n);
    ct_conv2d_geom g = d.g;
    int64_t kg = d.kg, p = d.p, ocg = d.ocg, in_sz = d.in_sz, out_sz = d.out_sz;
    ct_dtype dt = io->dt;
    void *col = io->ws;                                    /* [kg, p] */
    if (io->pool) {   /* fuse_pool said the backend has the op */
        be->conv.conv2d_act_pool_forward(be, io->y, io->aux, io->x[0], io->p[0], c->bias ? io->p[1] : NULL, &g,
                                         io->act, dt);
        return;
    }
    if (io->act != CT_ACT_NONE) {   /* fuse_act said the backend has the op */
        be->conv.conv2d_act_forward(be, io->y, io->x[0], io->p[0], c->bias ? io->p[1] : NULL, &g, io->act, dt);
        return;
    }
    if (be->conv.conv2d_forward) {
        be->conv.conv2d_forward(be, io->y, io->x[0], io->p[0], c->bias ? io->p[1] : NULL, &g, dt);
        return;
    }
    for (int64_t i = 0; i < io->n; i++)
        for (int64_t grp = 0; grp < c->groups; grp++) {
            be->conv.im2col(be, col, ct_celem(io->x[0], i * in_sz, dt), &g, grp, dt);
            /* y_i,grp [ocg, p] = W_grp [ocg, kg] col [kg, p] */
            be->blas.gemm(be, false, false, ocg, p, kg, 1.0f, ct_celem(io->p[0], grp * ocg * kg, dt), dt, kg,
                     col, dt, p, 0.0f, ct_elem(io->y, i * out_sz + grp * ocg * p, dt), dt, p);
        }
    if (c->bias) be->elt.bias_act_forward(be, io->y, io->p[1], io->n, c->out, p, CT_ACT_NONE, 0.0f, dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    const conv_cfg *c = l->cfg_data;
    ct_backend *be = io->be;
    conv_dims d = dims_of(l, io->n);
    ct_conv2d_geom g = d.g;
    int64_t kg = d.kg, p = d.p, ocg = d.ocg, in_sz = d.in_sz, out_sz = d.out_sz;
    ct_dtype dt = io->dt;
    void *col = io->ws, *dcol = ct_elem(col, kg * p, dt);  /* [kg, p] each */
    if (io->pool) {
        be->conv.conv2d_act_pool_backward(be, io->dx[0], io->dp[0], c->bias ? io->dp[1] : NULL, io->dy, io->y,
                                          io->aux, io->x[0], io->p[0], &g, io->act, dt);
        return;
    }
    if (io->act != CT_ACT_NONE) {
        be->conv.conv2d_act_backward(be, io->dx[0], io->dp[0], c->bias ? io->dp[1] : NULL, io->dy, io->y,
                                     io->x[0], io->p[0], &g, io->act, dt);
        return;
    }
    if (be->conv.conv2d_backward) {
        be->conv.conv2d_backward(be, io->dx[0], io->dp[0], c->bias ? io->dp[1] : NULL, io->dy, io->x[0],
                            io->p[0], &g, dt);
        return;
    }
    if (c->bias) be->elt.bias_backward(be, io->dp[1], io->dy, io->n, c->out, p, dt);
    if (io->dx[0]) be->mem.memset0(be, io->dx[0], ct_nbytes(io->n * in_sz, dt));
    for (int64_t i = 0; i < io->n; i++)
        for (int64_t grp = 0; grp < c->groups; grp++) {
            const void *dy = ct_celem(io->dy, i * out_sz + grp * ocg * p, dt);   /* [ocg, p] */
            const void *w = ct_celem(io->p[0], grp * ocg * kg, dt);              /* [ocg, kg] */
            be->conv.im2col(be, col, ct_celem(io->x[0], i * in_sz, dt), &g, grp, dt);
            /* dW_grp [ocg, kg] += dy [ocg, p] col^T [p, kg] (fp32 gradient) */
            be->blas.gemm(be, false, true, ocg, kg, p, 1.0f, dy, dt, p, col, dt, p, 1.0f,
                     io->dp[0] + grp * ocg * kg, CT_F32, kg);
            if (!io->dx[0]) continue;
            /* dcol [kg, p] = W_grp^T [kg, ocg] dy [ocg, p] */
            be->blas.gemm(be, true, false, kg, p, ocg, 1.0f, w, dt, kg, dy, dt, p, 0.0f, dcol, dt, p);
            be->conv.col2im(be, ct_elem(io->dx[0], i * in_sz, dt), dcol, &g, grp, dt);
        }
}

/* A following relu runs inside the conv where the backend has the fused op (the CPU's). */
static bool fuse_act(const ct_layer *l, const ct_backend *be, ct_act act) {
    return act == CT_ACT_RELU && be->conv.conv2d_act_forward && be->conv.conv2d_act_backward;
}

/* And the 2x2 max-pool after that relu, where the backend has that op too (the CPU's). */
static bool fuse_pool(const ct_layer *l, const ct_backend *be) {
    return be->conv.conv2d_act_pool_forward && be->conv.conv2d_act_pool_backward;
}

static double flops(const ct_layer *l) {
    return 2.0 * (double)col_rows(l) * (double)ct_layer_out_numel(l);
}

const ct_layer_type ct_layer_conv2d = {
    .name = "conv2d", .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(conv_cfg), .parse = parse, .infer = infer, .params = params,
    .workspace_bytes = workspace_bytes, .device_scratch_bytes = device_scratch_bytes, .forward = forward, .backward = backward, .flops = flops,
    .fuse_act = fuse_act, .fuse_pool = fuse_pool,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* x (im2col) for dW */
};

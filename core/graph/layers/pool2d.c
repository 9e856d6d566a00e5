/* maxpool2d, avgpool2d, global_avgpool: 2-D pooling over NCHW.
 *   x [n, c, h, w] -> y [n, c, oh, ow];  global_avgpool: y [n, c] (the mean over h, w).
 * maxpool saves the argmax of every output (int32, in aux) for backward. */
#include "core/graph/layer.h"

typedef struct {
    int64_t k[2], stride[2], pad[2];
    bool count_include_pad;
    bool global;
} pool_cfg;

static const char *const max_fields[] = {"kernel", "stride", "padding", NULL};
static const char *const avg_fields[] = {"kernel", "stride", "padding", "count_include_pad", NULL};
static const char *const global_fields[] = {NULL};

static int parse(ct_layer *l, ct_err *err) {
    pool_cfg *c = l->cfg_data;
    int rc = ct_layer_int2(l, "kernel", true, 0, 1, c->k, err);
    if (!rc) rc = ct_layer_int2(l, "stride", false, 0, 1, c->stride, err);
    if (!rc && !cJSON_GetObjectItemCaseSensitive(l->node, "stride")) {
        c->stride[0] = c->k[0];   /* PyTorch: stride defaults to the kernel size */
        c->stride[1] = c->k[1];
    }
    if (!rc) rc = ct_layer_int2(l, "padding", false, 0, 0, c->pad, err);
    if (!rc) rc = ct_layer_bool(l, "count_include_pad", true, &c->count_include_pad, err);
    if (!rc && (2 * c->pad[0] > c->k[0] || 2 * c->pad[1] > c->k[1]))
        rc = ct_layer_errf(l, err, NULL, "padding %lldx%lld is more than half the kernel %lldx%lld",
                           (long long)c->pad[0], (long long)c->pad[1], (long long)c->k[0],
                           (long long)c->k[1]);
    return rc;
}

static int parse_global(ct_layer *l, ct_err *err) {
    ((pool_cfg *)l->cfg_data)->global = true;
    return CT_OK;
}

static int infer(ct_layer *l, ct_err *err) {
    pool_cfg *c = l->cfg_data;
    char s[96];
    if (l->in[0].ndim != 3)
        return ct_layer_errf(l, err, NULL, "input is %s per sample, expected [C, H, W] (from %s)",
                             ct_shape_str(&l->in[0], s, sizeof s), l->in_name[0]);
    if (c->global) {
        c->k[0] = c->stride[0] = l->in[0].d[1];
        c->k[1] = c->stride[1] = l->in[0].d[2];
        l->out = (ct_shape){1, {l->in[0].d[0]}};
        return CT_OK;
    }
    int64_t oh = ct_conv_out_size(l->in[0].d[1], c->k[0], c->stride[0], c->pad[0], 1);
    int64_t ow = ct_conv_out_size(l->in[0].d[2], c->k[1], c->stride[1], c->pad[1], 1);
    if (oh < 1 || ow < 1)
        return ct_layer_errf(l, err, NULL, "kernel %lldx%lld does not fit the %s input (from %s)",
                             (long long)c->k[0], (long long)c->k[1],
                             ct_shape_str(&l->in[0], s, sizeof s), l->in_name[0]);
    l->out = (ct_shape){3, {l->in[0].d[0], oh, ow}};
    return CT_OK;
}

static ct_pool2d_geom geom(const ct_layer *l, int64_t n) {
    const pool_cfg *c = l->cfg_data;
    ct_pool2d_geom g = {.n = n, .c = l->in[0].d[0], .h = l->in[0].d[1], .w = l->in[0].d[2],
                        .kh = c->k[0], .kw = c->k[1], .stride_h = c->stride[0],
                        .stride_w = c->stride[1], .pad_h = c->pad[0], .pad_w = c->pad[1],
                        .oh = 1, .ow = 1, .count_include_pad = c->count_include_pad || c->global};
    if (!c->global) {
        g.oh = l->out.d[1];
        g.ow = l->out.d[2];
    }
    return g;
}

static size_t max_aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return (size_t)(batch * ct_layer_out_numel(l)) * sizeof(int32_t);
}

static void max_forward(const ct_layer *l, const ct_layer_io *io) {
    ct_pool2d_geom g = geom(l, io->n);
    io->be->conv.maxpool2d_forward(io->be, io->y, io->aux, io->x[0], &g, io->dt);
}
static void max_backward(const ct_layer *l, const ct_layer_io *io) {
    ct_pool2d_geom g = geom(l, io->n);
    if (io->dx[0]) io->be->conv.maxpool2d_backward(io->be, io->dx[0], io->dy, io->aux, &g, io->dt);
}
static void avg_forward(const ct_layer *l, const ct_layer_io *io) {
    ct_pool2d_geom g = geom(l, io->n);
    io->be->conv.avgpool2d_forward(io->be, io->y, io->x[0], &g, io->dt);
}
static void avg_backward(const ct_layer *l, const ct_layer_io *io) {
    ct_pool2d_geom g = geom(l, io->n);
    if (io->dx[0]) io->be->conv.avgpool2d_backward(io->be, io->dx[0], io->dy, &g, io->dt);
}

/* 2x2 windows, stride 2, no padding: a conv2d + relu before it may compute it (core/graph/fuse.c). */
static bool fusable_pool(const ct_layer *l) {
    const pool_cfg *c = l->cfg_data;
    return c->k[0] == 2 && c->k[1] == 2 && c->stride[0] == 2 && c->stride[1] == 2 && c->pad[0] == 0 &&
           c->pad[1] == 0;
}

static double flops(const ct_layer *l) {
    const pool_cfg *c = l->cfg_data;
    return (double)ct_layer_out_numel(l) * (double)(c->k[0] * c->k[1]);
}

const ct_layer_type ct_layer_maxpool2d = {
    .name = "maxpool2d", .fields = max_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(pool_cfg), .parse = parse, .infer = infer, .aux_bytes = max_aux_bytes,
    .forward = max_forward, .backward = max_backward, .flops = flops,
    .fusable_pool = fusable_pool,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dy to the argmax in aux */
};
const ct_layer_type ct_layer_avgpool2d = {
    .name = "avgpool2d", .fields = avg_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(pool_cfg), .parse = parse, .infer = infer,
    .forward = avg_forward, .backward = avg_backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dy spread over the window */
};
const ct_layer_type ct_layer_global_avgpool = {
    .name = "global_avgpool", .fields = global_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(pool_cfg), .parse = parse_global, .infer = infer,
    .forward = avg_forward, .backward = avg_backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dy spread over the window */
};

/* concat: join two or more inputs along one axis (default 1: channels of [C,H,W], features of
 * [F]); the other dims must match. Axis counts the batch dim as 0, as in torch.cat.
 * Each input is a block of `inner` contiguous elements repeated `outer` times, so forward and
 * backward are strided row copies:
 *   x_i [outer, inner_i] -> y [outer, sum inner_i] at column offset sum_{j<i} inner_j */
#include "core/graph/layer.h"

typedef struct {
    int64_t axis;       /* 1..ndim, per-sample dim axis-1 */
} concat_cfg;

static const char *const fields[] = {"axis", NULL};

static int parse(ct_layer *l, ct_err *err) {
    concat_cfg *c = l->cfg_data;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, "axis");
    if (v && cJSON_IsNumber(v) && v->valuedouble < 0) {   /* -1: the last axis, resolved in infer */
        c->axis = (int64_t)v->valuedouble;
        return c->axis >= -CT_MAX_DIMS ? CT_OK : ct_layer_errf(l, err, v, "axis: out of range");
    }
    return ct_layer_int(l, "axis", false, 1, 1, &c->axis, err);
}

static int infer(ct_layer *l, ct_err *err) {
    concat_cfg *c = l->cfg_data;
    int nd = l->in[0].ndim;
    char a[96], b[96];
    const cJSON *where = cJSON_GetObjectItemCaseSensitive(l->node, "axis");
    if (c->axis < 0) c->axis += nd + 1;
    if (c->axis < 1 || c->axis > nd)
        return ct_layer_errf(l, err, where, "axis %lld out of range for %s inputs (1..%d; 0 is the batch)",
                             (long long)c->axis, ct_shape_str(&l->in[0], a, sizeof a), nd);
    l->out = l->in[0];
    for (int i = 1; i < l->n_in; i++) {
        bool ok = l->in[i].ndim == nd;
        for (int d = 0; ok && d < nd; d++) ok = d == c->axis - 1 || l->in[i].d[d] == l->in[0].d[d];
        if (!ok)
            return ct_layer_errf(l, err, NULL, "input %d is %s (from %s), expected to match %s (from %s) "
                                 "except on axis %lld", i, ct_shape_str(&l->in[i], a, sizeof a),
                                 l->in_name[i], ct_shape_str(&l->in[0], b, sizeof b), l->in_name[0],
                                 (long long)c->axis);
        l->out.d[c->axis - 1] += l->in[i].d[c->axis - 1];
    }
    return CT_OK;
}

/* Rows per sample before the axis, and elements per row of input i / of the output. */
static int64_t outer(const ct_layer *l) {
    int64_t o = 1;
    for (int d = 0; d < ((const concat_cfg *)l->cfg_data)->axis - 1; d++) o *= l->out.d[d];
    return o;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    int64_t rows = io->n * outer(l), ldy = ct_layer_out_numel(l) / outer(l), off = 0;
    for (int i = 0; i < l->n_in; i++) {
        int64_t cols = ct_layer_in_numel(l, i) / outer(l);
        io->be->elt.copy_rows(io->be, ct_elem(io->y, off, io->dt), ldy, io->x[i], cols, rows, cols, false,
                          io->dt);
        off += cols;
    }
}

/* dx_i [rows, cols_i] = dy[:, off_i : off_i + cols_i]: the same strided copy, read the other way. */
static void backward(const ct_layer *l, const ct_layer_io *io) {
    int64_t rows = io->n * outer(l), ldy = ct_layer_out_numel(l) / outer(l), off = 0;
    for (int i = 0; i < l->n_in; i++) {
        int64_t cols = ct_layer_in_numel(l, i) / outer(l);
        if (io->dx[i])
            io->be->elt.copy_rows(io->be, io->dx[i], cols, ct_celem(io->dy, off, io->dt), ldy, rows, cols,
                              false, io->dt);
        off += cols;
    }
}

static double flops(const ct_layer *l) { return 0.0; }

const ct_layer_type ct_layer_concat = {
    .name = "concat", .fields = fields, .min_inputs = 2, .max_inputs = CT_LAYER_MAX_IN,
    .cfg_size = sizeof(concat_cfg), .parse = parse, .infer = infer, .forward = forward,
    .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dx_i: columns of dy */
};

/* flatten, reshape: change the per-sample shape, keep the data (row-major order).
 *   flatten: [n, ...] -> [n, prod(...)]
 *   reshape: [n, ...] -> [n, shape...], "shape" per sample, one entry may be -1 (inferred).
 * Both copy x to y (and dy to dx): a copy is cheap next to any layer with parameters and keeps
 * every activation a separate buffer. */
#include "core/graph/layer.h"

typedef struct {
    ct_shape shape;     /* reshape target; ndim 0 for flatten */
    int infer_dim;      /* index of the -1 entry, or -1 */
} reshape_cfg;

static const char *const flatten_fields[] = {NULL};
static const char *const reshape_fields[] = {"shape", NULL};

static int parse_flatten(ct_layer *l, ct_err *err) {
    reshape_cfg *c = l->cfg_data;
    c->shape = (ct_shape){1, {-1}};
    c->infer_dim = 0;
    return CT_OK;
}

static int parse_reshape(ct_layer *l, ct_err *err) {
    reshape_cfg *c = l->cfg_data;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, "shape");
    if (!v) return ct_layer_errf(l, err, NULL, "missing field \"shape\" (per-sample dims, e.g. [64, 7, 7])");
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > CT_MAX_DIMS - 1)
        return ct_layer_errf(l, err, v, "shape: expected an array of 1 to %d integers", CT_MAX_DIMS - 1);
    c->shape.ndim = n;
    c->infer_dim = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        double d = cJSON_IsNumber(e) ? e->valuedouble : 0;
        if (!cJSON_IsNumber(e) || d != (double)(int64_t)d || d == 0 || d < -1 || d > (double)INT32_MAX)
            return ct_layer_errf(l, err, e, "shape[%d]: expected a positive integer or -1", i);
        if (d == -1 && c->infer_dim >= 0)
            return ct_layer_errf(l, err, e, "shape[%d]: only one entry may be -1 (shape[%d] is too)",
                                 i, c->infer_dim);
        if (d == -1) c->infer_dim = i;
        c->shape.d[i] = (int64_t)d;
    }
    return CT_OK;
}

static int infer(ct_layer *l, ct_err *err) {
    const reshape_cfg *c = l->cfg_data;
    int64_t numel = ct_layer_in_numel(l, 0), known = 1;
    char s[96], t[96];
    for (int i = 0; i < c->shape.ndim; i++)
        if (i != c->infer_dim) known *= c->shape.d[i];
    l->out = c->shape;
    if (c->infer_dim >= 0) {
        if (numel % known)
            return ct_layer_errf(l, err, NULL, "cannot reshape %s (%lld elements) to %s (from %s)",
                                 ct_shape_str(&l->in[0], s, sizeof s), (long long)numel,
                                 ct_shape_str(&c->shape, t, sizeof t), l->in_name[0]);
        l->out.d[c->infer_dim] = numel / known;
    } else if (known != numel) {
        return ct_layer_errf(l, err, NULL, "cannot reshape %s (%lld elements) to %s (%lld elements) (from %s)",
                             ct_shape_str(&l->in[0], s, sizeof s), (long long)numel,
                             ct_shape_str(&c->shape, t, sizeof t), (long long)known, l->in_name[0]);
    }
    return CT_OK;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    io->be->mem.copy_d2d(io->be, io->y, io->x[0], ct_nbytes(io->n * ct_layer_out_numel(l), io->dt));
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    if (io->dx[0])
        io->be->mem.copy_d2d(io->be, io->dx[0], io->dy, ct_nbytes(io->n * ct_layer_out_numel(l), io->dt));
}

static double flops(const ct_layer *l) { return 0.0; }

const ct_layer_type ct_layer_flatten = {
    .name = "flatten", .fields = flatten_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(reshape_cfg), .parse = parse_flatten, .infer = infer,
    .forward = forward, .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dx = dy */
};
const ct_layer_type ct_layer_reshape = {
    .name = "reshape", .fields = reshape_fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(reshape_cfg), .parse = parse_reshape, .infer = infer,
    .forward = forward, .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dx = dy */
};

/* relu, leaky_relu, gelu, silu, tanh, sigmoid: element-wise activations, y = act(x), same shape.
 * One file because they differ only in the backend's ct_act code and two optional fields. */
#include <string.h>

#include "core/graph/layer.h"

typedef struct {
    ct_act act;
    double alpha;    /* leaky_relu negative slope */
} act_cfg;

static const char *const no_fields[] = {NULL};
static const char *const leaky_fields[] = {"negative_slope", NULL};
static const char *const gelu_fields[] = {"approximate", NULL};

static int parse(ct_layer *l, ct_err *err) {
    act_cfg *c = l->cfg_data;
    static const struct { const char *name; ct_act act; } codes[] = {
        {"relu", CT_ACT_RELU}, {"leaky_relu", CT_ACT_LEAKY_RELU}, {"gelu", CT_ACT_GELU},
        {"silu", CT_ACT_SILU}, {"tanh", CT_ACT_TANH},             {"sigmoid", CT_ACT_SIGMOID},
    };
    for (int i = 0; i < CT_ARRAY_LEN(codes); i++)
        if (strcmp(l->type->name, codes[i].name) == 0) c->act = codes[i].act;
    if (c->act == CT_ACT_LEAKY_RELU)
        return ct_layer_num(l, "negative_slope", 0.01, -1e6, 1e6, false, &c->alpha, err);
    if (c->act == CT_ACT_GELU) {
        static const char *const approx[] = {"none", "tanh"};
        int k = 0, rc = ct_layer_choice(l, "approximate", approx, 2, 0, &k, err);
        if (k == 1) c->act = CT_ACT_GELU_TANH;
        return rc;
    }
    return CT_OK;
}

static int infer(ct_layer *l, ct_err *err) {
    l->out = l->in[0];
    return CT_OK;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const act_cfg *c = l->cfg_data;
    io->be->elt.act_forward(io->be, io->y, io->x[0], io->n * ct_layer_out_numel(l), c->act, (float)c->alpha,
                         io->dt);
}

/* The derivative comes from x or from y, as the type's table row says (relu, tanh and sigmoid
 * from y; gelu and silu from x; leaky_relu from either, by the sign of its slope): the op gets only
 * that one, so the planner may free the other as the row says (act_backward reads what it is given). */
static void backward(const ct_layer *l, const ct_layer_io *io) {
    const act_cfg *c = l->cfg_data;
    const void *x = ct_layer_backward_reads_input(l) ? io->x[0] : NULL;
    const void *y = l->type->backward_reads_output ? io->y : NULL;
    if (io->dx[0])
        io->be->elt.act_backward(io->be, io->dx[0], io->dy, x, y, io->n * ct_layer_out_numel(l), c->act,
                                 (float)c->alpha, io->dt);
}

static double flops(const ct_layer *l) { return (double)ct_layer_out_numel(l); }

/* relu and leaky_relu with a slope >= 0: y > 0 exactly where x > 0, so backward can read the sign
 * from y after y has replaced x. */
static bool in_place(const ct_layer *l) {
    const act_cfg *c = l->cfg_data;
    return c->act == CT_ACT_RELU || (c->act == CT_ACT_LEAKY_RELU && c->alpha >= 0);
}

/* relu alone for now: the one activation a backend's fused conv applies (backend.h). */
static ct_act fusable_act(const ct_layer *l) {
    const act_cfg *c = l->cfg_data;
    return c->act == CT_ACT_RELU ? CT_ACT_RELU : CT_ACT_NONE;
}

/* reads_x, reads_y: what the type's backward derives from (see backward). */
#define CT_ACT_LAYER(sym, type_name, field_list, reads_x, reads_y)                                  \
    const ct_layer_type sym = {.name = type_name, .flags = CT_LAYER_PER_POSITION, .fields = field_list, .min_inputs = 1,             \
                               .max_inputs = 1, .cfg_size = sizeof(act_cfg), .parse = parse,       \
                               .infer = infer, .forward = forward, .backward = backward,           \
                               .flops = flops, .in_place = in_place, .backward_reads_output = reads_y, \
                               .backward_reads_input = reads_x, .backward_in_place = true,         \
                               .fusable_act = fusable_act}
CT_ACT_LAYER(ct_layer_relu, "relu", no_fields, CT_BWD_INPUT_UNREAD, true);
CT_ACT_LAYER(ct_layer_leaky_relu, "leaky_relu", leaky_fields, CT_BWD_INPUT_READ, true);
CT_ACT_LAYER(ct_layer_gelu, "gelu", gelu_fields, CT_BWD_INPUT_READ, false);
CT_ACT_LAYER(ct_layer_silu, "silu", no_fields, CT_BWD_INPUT_READ, false);
CT_ACT_LAYER(ct_layer_tanh, "tanh", no_fields, CT_BWD_INPUT_UNREAD, true);
CT_ACT_LAYER(ct_layer_sigmoid, "sigmoid", no_fields, CT_BWD_INPUT_UNREAD, true);

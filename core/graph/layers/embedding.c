/* embedding: token ids -> rows of a table. The model input must be token ids ([T], int32).
 *   ids [n, T]   W [vocab, dim]   y [n, T, dim]
 * Default init normal(0, 0.02) (GPT-style; torch's own default is normal(0, 1)). */
#include "core/graph/layer.h"

typedef struct {
    int64_t vocab, dim;
} emb_cfg;

static const char *const fields[] = {"vocab", "dim", NULL};

static int parse(ct_layer *l, ct_err *err) {
    emb_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "vocab", true, 0, 1, &c->vocab, err);
    if (!rc) rc = ct_layer_int(l, "dim", true, 0, 1, &c->dim, err);
    if (!rc && c->vocab > INT32_MAX) rc = ct_layer_errf(l, err, NULL, "vocab: at most %d", INT32_MAX);
    return rc;
}

static int infer(ct_layer *l, ct_err *err) {
    const emb_cfg *c = l->cfg_data;
    if (l->in_dtype != CT_I32)
        return ct_layer_errf(l, err, NULL, "input must be the model's token ids (model.input [T] with "
                             "embedding as the first layer), got floats from %s", l->in_name[0]);
    if (l->in[0].ndim + 1 > CT_MAX_DIMS - 1)
        return ct_layer_errf(l, err, NULL, "input has too many dims");
    l->out = l->in[0];
    l->out.d[l->out.ndim++] = c->dim;
    return CT_OK;
}

static int params(const ct_layer *l, ct_param_spec *s) {
    const emb_cfg *c = l->cfg_data;
    s[0] = (ct_param_spec){.suffix = "weight", .shape = {2, {c->vocab, c->dim}}, .trainable = true,
                           .weight_decay = true, .init = {CT_INIT_NORMAL, 0.0, 0.02, c->dim, c->vocab}};
    return 1;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const emb_cfg *c = l->cfg_data;
    io->be->embed.embedding_forward(io->be, io->y, io->ids, io->p[0], io->n * ct_layer_in_numel(l, 0), c->dim,
                              io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    const emb_cfg *c = l->cfg_data;
    io->be->embed.embedding_backward(io->be, io->dp[0], io->dy, io->ids, io->n * ct_layer_in_numel(l, 0),
                               c->vocab, c->dim, io->dt);
}

static double flops(const ct_layer *l) { return 0.0; }

static int64_t id_limit(const ct_layer *l) { return ((const emb_cfg *)l->cfg_data)->vocab; }

const ct_layer_type ct_layer_embedding = {
    .name = "embedding", .flags = CT_LAYER_TAKES_IDS | CT_LAYER_PER_POSITION, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(emb_cfg), .parse = parse, .infer = infer, .params = params,
    .forward = forward, .backward = backward, .flops = flops, .id_limit = id_limit,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* the ids, to scatter dy into dW */
};

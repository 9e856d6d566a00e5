/* position_embedding: learned absolute positions (GPT-2's wpe) added to token embeddings.
 *   x [n, T, C]   W [max_len, C]   y [n, T, C] = x + W[0:T]
 * The table is sized by max_len, not by the input's T, so a model built for shorter sequences
 * holds the same table (same checkpoint tensor) and reads only its first T rows.
 * Row t of every sample gets row t of the table, and W[0:T] is contiguous, so the sum is one
 * broadcast bias over rows = n, cols = T*C, and its gradient one bias reduction over the batch.
 * Default init normal(0, 0.02) (GPT-2; torch's nn.Embedding default is normal(0, 1)).
 * Generation with a key/value cache (io->decode, graph.h): a graph built for new positions from
 * pos0 adds rows pos0 .. pos0 + T - 1 of the table. */
#include "core/graph/layer.h"

typedef struct {
    int64_t max_len;
} pos_cfg;

static const char *const fields[] = {"max_len", NULL};

static int parse(ct_layer *l, ct_err *err) {
    pos_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "max_len", true, 0, 1, &c->max_len, err);
    if (!rc && c->max_len > INT32_MAX) rc = ct_layer_errf(l, err, NULL, "max_len: at most %d", INT32_MAX);
    return rc;
}

static int infer(ct_layer *l, ct_err *err) {
    const pos_cfg *c = l->cfg_data;
    char s[96];
    if (l->in[0].ndim != 2)
        return ct_layer_errf(l, err, NULL, "expected [T, C] (a sequence of vectors, e.g. from an "
                             "embedding), got %s from %s", ct_shape_str(&l->in[0], s, sizeof s),
                             l->in_name[0]);
    if (l->in[0].d[0] > c->max_len)
        return ct_layer_errf(l, err, NULL, "sequence length T = %lld (from %s) is longer than max_len = "
                             "%lld; raise max_len or shorten model.input",
                             (long long)l->in[0].d[0], l->in_name[0], (long long)c->max_len);
    l->out = l->in[0];
    return CT_OK;
}

/* Weight decay on, as for embedding: ctrain decays every 2-D weight, as nanoGPT does. */
static int params(const ct_layer *l, ct_param_spec *s) {
    const pos_cfg *c = l->cfg_data;
    int64_t dim = l->in[0].d[1];
    s[0] = (ct_param_spec){.suffix = "weight", .shape = {2, {c->max_len, dim}}, .trainable = true,
                           .weight_decay = true, .init = {CT_INIT_NORMAL, 0.0, 0.02, dim, c->max_len}};
    return 1;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    int64_t tc = ct_layer_out_numel(l);
    int64_t row0 = io->decode && !io->decode->fill ? io->decode->pos0 : 0;
    const void *rows = ct_celem(io->p[0], row0 * l->in[0].d[1], io->dt);
    if (io->y != io->x[0]) io->be->mem.copy_d2d(io->be, io->y, io->x[0], ct_nbytes(io->n * tc, io->dt));
    io->be->elt.bias_act_forward(io->be, io->y, rows, io->n, tc, 1, CT_ACT_NONE, 0.0f, io->dt);
}

/* dx = dy; when the planner ran this layer in place its dx is its dy (plan.c grad_in_place), so
 * there is nothing to copy. Rows T..max_len-1 of the table get no gradient. */
static void backward(const ct_layer *l, const ct_layer_io *io) {
    int64_t tc = ct_layer_out_numel(l);
    io->be->elt.bias_backward(io->be, io->dp[0], io->dy, io->n, tc, 1, io->dt);
    if (io->dx[0] && io->dx[0] != io->dy)
        io->be->mem.copy_d2d(io->be, io->dx[0], io->dy, ct_nbytes(io->n * tc, io->dt));
}

static double flops(const ct_layer *l) { return (double)ct_layer_out_numel(l); }

/* y = x + W needs neither x nor y in backward, so y may replace x. */
static bool in_place(const ct_layer *l) { return true; }

const ct_layer_type ct_layer_position_embedding = {
    .name = "position_embedding", .flags = CT_LAYER_DECODES, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(pos_cfg), .parse = parse, .infer = infer, .params = params,
    .forward = forward, .backward = backward, .flops = flops, .in_place = in_place,
    .backward_reads_input = CT_BWD_INPUT_UNREAD,   /* dx = dy, dW = sum of dy */
};

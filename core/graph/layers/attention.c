/* causal_self_attention: multi-head scaled-dot-product attention with a causal mask (GPT-2's
 * attention between its c_attn and c_proj linears).
 *
 * Input per sample [T, 3C]: the fused q, k, v projection (a linear with out = 3C: per token q of
 * every head, then k, then v; head h's columns are h D .. h D + D - 1 of each, D = C / heads).
 * Output [T, C]: the heads' outputs side by side, ready for the output projection. No parameters.
 * "dropout" drops attention probabilities in train mode, drawn from the (step, layer) stream, so
 * a recomputed forward and the backward see the same drops. aux keeps the rows' log-sum-exp
 * [heads, T] (fp32) only: backward recomputes the scores from q, k and it (ct_backend_attn), so no
 * T x T matrix is kept, on any backend. */
#include "core/graph/layer.h"

typedef struct {
    int64_t heads;
    double p;
} attn_cfg;

static const char *const fields[] = {"heads", "dropout", NULL};

/* The largest head dim the backends' kernels take (backend.h, ct_backend_attn). */
#define ATTN_MAX_HEAD_DIM 128

static int parse(ct_layer *l, ct_err *err) {
    attn_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "heads", true, 0, 1, &c->heads, err);
    return rc ? rc : ct_layer_num(l, "dropout", 0.0, 0.0, 1.0, true, &c->p, err);
}

static int infer(ct_layer *l, ct_err *err) {
    const attn_cfg *c = l->cfg_data;
    char shape[64];
    if (l->in[0].ndim != 2 || l->in[0].d[1] % 3)
        return ct_layer_errf(l, err, NULL, "input is %s (from %s), expected [T, 3C]: the fused q, k, v of "
                             "each token, from a linear layer with out = 3 x the width",
                             ct_shape_str(&l->in[0], shape, sizeof shape), l->in_name[0]);
    int64_t C = l->in[0].d[1] / 3;
    if (C % c->heads)
        return ct_layer_errf(l, err, NULL, "width C = %lld (input %lld / 3) is not divisible by heads = %lld",
                             (long long)C, (long long)l->in[0].d[1], (long long)c->heads);
    if (C / c->heads > ATTN_MAX_HEAD_DIM)
        return ct_layer_errf(l, err, NULL, "head dim C / heads = %lld is above %d: use more heads",
                             (long long)(C / c->heads), ATTN_MAX_HEAD_DIM);
    l->out = l->in[0];
    l->out.d[1] = C;
    return CT_OK;
}

static int64_t seq_len(const ct_layer *l) { return l->in[0].d[0]; }
static int64_t head_dim(const ct_layer *l) { return l->out.d[1] / ((const attn_cfg *)l->cfg_data)->heads; }

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return (size_t)(batch * ((const attn_cfg *)l->cfg_data)->heads * seq_len(l)) * sizeof(float);
}

/* The dropout probability of this call: none in eval mode. */
static float drop_p(const ct_layer *l, const ct_layer_io *io) {
    return io->train ? (float)((const attn_cfg *)l->cfg_data)->p : 0.0f;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const attn_cfg *c = l->cfg_data;
    io->be->attn.causal_attention_forward(io->be, io->y, io->aux, io->x[0], io->n, seq_len(l), c->heads,
                                          head_dim(l), drop_p(l, io), io->seed, io->stream, io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    const attn_cfg *c = l->cfg_data;
    if (!io->dx[0]) return;
    io->be->attn.causal_attention_backward(io->be, io->dx[0], io->dy, io->x[0], io->y, io->aux, io->n,
                                           seq_len(l), c->heads, head_dim(l), drop_p(l, io), io->seed,
                                           io->stream, io->dt);
}

/* q k^T and P v over the causal half: T (T + 1) / 2 pairs, D multiply-adds each, for each of
 * the heads, twice. */
static double flops(const ct_layer *l) {
    double T = (double)seq_len(l);
    return 2.0 * 2.0 * T * (T + 1.0) / 2.0 * (double)l->out.d[1];
}

static bool draws_random(const ct_layer *l) { return ((const attn_cfg *)l->cfg_data)->p > 0; }

const ct_layer_type ct_layer_causal_self_attention = {
    .name = "causal_self_attention", .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(attn_cfg), .parse = parse, .infer = infer, .aux_bytes = aux_bytes,
    .forward = forward, .backward = backward, .flops = flops, .backward_reads_output = true,
    .draws_random = draws_random,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* q, k, v to recompute the scores */
};

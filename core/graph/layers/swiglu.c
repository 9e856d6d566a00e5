/* swiglu: Llama's gated MLP activation over a fused gate-and-up projection:
 *   x [n, ..., 2f] (gate: the first f features, up: the last f)   y [n, ..., f] = silu(gate) * up
 * It follows a linear with out = 2f (gate_proj's rows, then up_proj's) and feeds down_proj.
 * No parameters and no saved state: backward reads x. */
#include "core/graph/layer.h"

static int parse(ct_layer *l, ct_err *err) { return CT_OK; }

static int64_t width(const ct_layer *l) { return l->in[0].d[l->in[0].ndim - 1]; }
static int64_t rows(const ct_layer *l, int64_t n) { return n * ct_layer_in_numel(l, 0) / width(l); }

static int infer(ct_layer *l, ct_err *err) {
    char shape[64];
    if (l->in[0].ndim < 1 || width(l) % 2)
        return ct_layer_errf(l, err, NULL, "input is %s (from %s), expected [..., 2f]: the gate and the up "
                             "projection side by side, from a linear with an even out",
                             ct_shape_str(&l->in[0], shape, sizeof shape), l->in_name[0]);
    l->out = l->in[0];
    l->out.d[l->out.ndim - 1] = width(l) / 2;
    return CT_OK;
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    io->be->elt.swiglu_forward(io->be, io->y, io->x[0], rows(l, io->n), width(l) / 2, io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    if (!io->dx[0]) return;
    io->be->elt.swiglu_backward(io->be, io->dx[0], io->dy, io->x[0], rows(l, io->n), width(l) / 2, io->dt);
}

/* per output element: silu (one, as ctrain counts activations) and the product */
static double flops(const ct_layer *l) { return 2.0 * (double)ct_layer_out_numel(l); }

const ct_layer_type ct_layer_swiglu = {
    .name = "swiglu", .flags = CT_LAYER_PER_POSITION, .min_inputs = 1, .max_inputs = 1, .parse = parse, .infer = infer,
    .forward = forward, .backward = backward, .flops = flops,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* gate and up */
};

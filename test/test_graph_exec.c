/* test_graph_exec.c: the executor (core/graph/exec.c): gradients through residuals and
 * concatenation against finite differences, in-place relu, unwanted gradients skipped, 16-bit
 * graphs against fp32, hooks around every layer and accumulation, ranges and recompute equal to one
 * pass, a prepare hook that redirects parameters (ZeRO-3's seam) or fails, and fused conv + relu (+
 * max-pool) bit for bit as the layers run apart (fuse.c). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

START_TEST(residual_add_and_concat) {
    built b;
    expect_ok(residual, &b);
    const ct_graph_info *in = ct_graph_info_get(b.g);
    ck_assert_int_eq(in->n_layers, 6);
    ck_assert_int_eq(in->n_param_elems, 6 * 8 + 8 + 8 * 8 + 8 + 24 * 5 + 5);
    unbuild(&b);
    /* "a" feeds tanh and add, "sum" feeds concat twice: the executor must add both gradients */
    check_graph_grads(residual, 3, 1e-2, 2e-2);
    /* no attention: three times the forward FLOPs */
    expect_ok(residual, &b);
    ck_assert_double_eq(ct_graph_train_flops_per_sample(b.g), 3 * ct_graph_info_get(b.g)->flops_per_sample);
    ck_assert_double_gt(ct_graph_info_get(b.g)->flops_per_sample, 0);
    unbuild(&b);
}
END_TEST

/* relu overwrites its input when nothing else reads it; gradients stay right either way. */
START_TEST(in_place_relu) {
    const char *text =
        "{\"input\": [2, 6, 6], \"layers\": [{\"type\": \"conv2d\", \"name\": \"c\", \"out\": 3, \"kernel\": 3},"
        " {\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2}, {\"type\": \"flatten\", \"name\": \"f\"},"
        " {\"type\": \"linear\", \"out\": 8, \"name\": \"l\"}, {\"type\": \"leaky_relu\", \"negative_slope\": 0.2},"
        " {\"type\": \"add\", \"inputs\": [\"prev\", \"l\"]}, {\"type\": \"tanh\"}, {\"type\": \"relu\"},"
        " {\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"cross_entropy\"}}";
    built b;
    expect_ok(text, &b);
    ck_assert_ptr_eq(ct_graph_activation(b.g, 1), ct_graph_activation(b.g, 0));   /* relu on conv */
    ck_assert_ptr_ne(ct_graph_activation(b.g, 5), ct_graph_activation(b.g, 4));   /* "l" feeds add too */
    ck_assert_ptr_ne(ct_graph_activation(b.g, 8), ct_graph_activation(b.g, 7));   /* tanh needs its y */
    unbuild(&b);
    /* small steps: relu after tanh puts kinks near zero, where a 1e-2 step would cross them */
    check_graph_grads(text, 3, 1e-3, 2e-2);
}
END_TEST

/* The executor with 16-bit storage: the same model, weights and input (rounded to dt for both
 * runs; the 16-bit graph converts the fp32 input itself) give the fp32 graph's loss, gradients
 * and running statistics to 16-bit accuracy. */
static const char *small_cnn =
    "{\"input\": [2, 8, 8], \"layers\": ["
    " {\"type\": \"conv2d\", \"out\": 6, \"kernel\": 3, \"padding\": 1}, {\"type\": \"batchnorm2d\"},"
    " {\"type\": \"silu\"}, {\"type\": \"avgpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"},"
    " {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 10}],"
    " \"loss\": {\"type\": \"cross_entropy\"}}";

/* Smooth activations and pooling in both models: a relu whose input sits within 16-bit rounding
 * of zero switches its whole gradient on or off, and a max pool whose two largest inputs round
 * to the same value moves its gradient to the other one; at a batch of 4 either moves the first
 * layer's gradient by several percent in bf16 even with exact arithmetic (fp32 fed bf16-rounded
 * inputs moves it 6%; with relu and max pooling, 10 of 30 seeds of the CNN went past 2%). The
 * kinks themselves are covered in fp32 by the finite-difference tests above. */
static const char *smooth_mlp =
    "{\"input\": [1, 12, 12], \"layers\": [{\"type\": \"flatten\"},"
    " {\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"},"
    " {\"type\": \"linear\", \"out\": 64}, {\"type\": \"tanh\"}, {\"type\": \"dropout\", \"p\": 0.2},"
    " {\"type\": \"linear\", \"out\": 10}], \"loss\": {\"type\": \"cross_entropy\"}}";

static double rel_err(const float *got, const float *want, int64_t k) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < k; i++) {
        ck_assert_msg(isfinite(got[i]), "element %lld is %g", (long long)i, got[i]);
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void expect_half_like_f32(const char *text, ct_dtype dt) {
    runner r;
    runner_start(&r, text, 4, 7);
    const ct_graph_info *in = ct_graph_info_get(r.b.g);
    int64_t np = in->n_params, nb = in->n_buffers;
    uint16_t *p16 = malloc(sizeof(uint16_t) * (size_t)(np + 1));
    for (int64_t i = 0; i < np; i++) {
        p16[i] = dt == CT_F16 ? ct_f32_to_f16(r.params[i]) : ct_f32_to_bf16(r.params[i]);
        r.params[i] = dt == CT_F16 ? ct_f16_to_f32(p16[i]) : ct_bf16_to_f32(p16[i]);
    }
    for (int64_t i = 0; i < r.io.n * ct_shape_numel(&in->input_shape); i++)
        r.input[i] = dt == CT_F16 ? ct_f16_to_f32(ct_f32_to_f16(r.input[i])) : ct_bf16_to_f32(ct_f32_to_bf16(r.input[i]));
    float *buf16 = malloc(sizeof(float) * (size_t)(nb + 1)), *g16 = calloc((size_t)np + 1, sizeof(float));
    memcpy(buf16, r.buffers, sizeof(float) * (size_t)nb);
    built b16;
    build_dt(&b16, text, 4, dt);
    ck_assert_msg(b16.rc == CT_OK, "build failed: %s", b16.err.msg);
    ct_step_io io16 = r.io;
    ct_err err;
    runner_loss(&r);
    runner_backward(&r, NULL);
    ct_exec_bufs b16s = {.params = p16, .grads = g16, .buffers = buf16};
    ck_assert_int_eq(ct_graph_forward(b16.g, &b16s, &io16, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_graph_backward(b16.g, &b16s, &io16, NULL, &err), CT_OK);
    ck_assert_msg(isfinite(io16.loss) && fabs(io16.loss - r.io.loss) <= 1e-2 * fabs(r.io.loss),
                  "%s: loss %.6g, f32 %.6g", ct_dtype_name(dt), io16.loss, r.io.loss);
    ck_assert_int_eq(io16.correct >= 0 && io16.correct <= 4, 1);
    double eg = rel_err(g16, r.grads, np), eb = rel_err(buf16, r.buffers, nb);
    ck_assert_msg(eg <= 2e-2, "%s: gradient relative L2 error %.3g", ct_dtype_name(dt), eg);
    ck_assert_msg(eb <= 1e-2, "%s: running statistics relative L2 error %.3g", ct_dtype_name(dt), eb);
    free(p16), free(buf16), free(g16);
    unbuild(&b16);
    runner_stop(&r);
}

START_TEST(half_graph_matches_f32) {
    expect_half_like_f32(smooth_mlp, _i ? CT_BF16 : CT_F16);
    expect_half_like_f32(small_cnn, _i ? CT_BF16 : CT_F16);
}
END_TEST

/* No gradient is computed for an output that only the model input fed: flatten before the MLP's
 * first linear layer runs no backward, so that layer computes no dx (its GEMM would be as large
 * as the weight gradient's). A parameter-free layer downstream of weights still runs backward,
 * and a two-input layer with one such input gets dx only for the other; gradients stay right. */
START_TEST(unwanted_gradients_skipped) {
    built b;
    expect_ok(mlp, &b);
    ck_assert(!b.g->nodes[0].runs_backward);
    ck_assert_ptr_null(b.g->nodes[0].dy);
    for (int j = 1; j < 6; j++) ck_assert_msg(b.g->nodes[j].runs_backward, "layer %d", j);
    unbuild(&b);
    check_graph_grads("{\"input\": [1, 3, 3], \"layers\": [{\"type\": \"flatten\"},"
                      " {\"type\": \"linear\", \"out\": 8}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 4}],"
                      " \"loss\": {\"type\": \"cross_entropy\"}}", 3, 1e-2, 2e-2);
    const char *two_inputs =
        "{\"input\": [6], \"layers\": ["
        " {\"type\": \"tanh\", \"name\": \"t\"}, {\"type\": \"relu\", \"name\": \"r\"},"
        " {\"type\": \"linear\", \"name\": \"a\", \"out\": 6, \"inputs\": [\"t\"]}, {\"type\": \"tanh\", \"name\": \"u\"},"
        " {\"type\": \"add\", \"inputs\": [\"r\", \"u\"]},"
        " {\"type\": \"linear\", \"out\": 4}], \"loss\": {\"type\": \"cross_entropy\"}}";
    expect_ok(two_inputs, &b);
    bool runs[] = {false, false, true, true, true, true};
    for (int j = 0; j < 6; j++) ck_assert_msg(b.g->nodes[j].runs_backward == runs[j], "layer %d", j);
    unbuild(&b);
    check_graph_grads(two_inputs, 3, 1e-2, 2e-2);
}
END_TEST

/* Hooks fire around every layer, forward in order and backward in reverse (but for a layer that
 * runs no backward: the flatten before the first weights, see unwanted_gradients_skipped). */
typedef struct { int log[64]; int n; } hook_log;

static int hook_prepare(void *c, int l, ct_pass pass, ct_layer_io *io, ct_err *err) {
    hook_log *h = c;
    h->log[h->n++] = (pass == CT_PASS_BACKWARD ? 300 : 100) + l;
    return CT_OK;
}

static int hook_after(void *c, int l, ct_pass pass, const ct_layer_io *io, ct_err *err) {
    hook_log *h = c;
    h->log[h->n++] = (pass == CT_PASS_BACKWARD ? 400 : 200) + l;
    return CT_OK;
}

START_TEST(hooks_and_accumulation) {
    runner r;
    runner_start(&r, mlp, 2, 5);
    hook_log h = {.n = 0};
    ct_exec_hooks hooks = {.ctx = &h, .prepare = hook_prepare, .after = hook_after};
    ct_err err;
    ct_exec_bufs bufs = runner_bufs(&r);
    ck_assert_int_eq(ct_graph_forward(r.b.g, &bufs, &r.io, &hooks, &err), CT_OK);
    runner_backward(&r, &hooks);
    ck_assert_int_eq(h.n, 22);
    for (int j = 0; j < 6; j++) {
        ck_assert_int_eq(h.log[2 * j], 100 + j);
        ck_assert_int_eq(h.log[2 * j + 1], 200 + j);
        if (j == 5) break;   /* layer 0 (flatten) runs no backward */
        ck_assert_int_eq(h.log[12 + 2 * j], 300 + 5 - j);
        ck_assert_int_eq(h.log[13 + 2 * j], 400 + 5 - j);
    }
    /* backward accumulates, scaled by loss_grad_scale */
    int64_t np = ct_graph_info_get(r.b.g)->n_params;
    float *g1 = malloc(sizeof(float) * (size_t)np);
    memcpy(g1, r.grads, sizeof(float) * (size_t)np);
    r.io.loss_grad_scale = 2.0f;   /* the loss writes d(loss * scale) into the last layer */
    runner_loss(&r);
    runner_backward(&r, NULL);
    for (int64_t i = 0; i < np; i += 97) ck_assert_float_eq_tol(r.grads[i], 3.0f * g1[i], 1e-6f + 1e-5f * fabsf(g1[i]));
    /* more samples than the build batch: a runtime error, not a crash */
    r.io.n = 3;
    ck_assert_int_eq(ct_graph_forward(r.b.g, &bufs, &r.io, NULL, &err), CT_ERR_RUNTIME);
    free(g1);
    runner_stop(&r);
}
END_TEST

enum { SEAM_LAYERS = 8, SEAM_N = 4 };

START_TEST(ranges_equal_one_pass) {
    runner r;
    runner_start(&r, seam_model, SEAM_N, 5);
    snapshot want = one_pass(&r);
    ct_exec_bufs b = runner_bufs(&r);
    ct_err err = {0};
    for (int k = 1; k < SEAM_LAYERS; k++) {   /* every split point */
        ct_param_store_init(r.store, 5);
        ct_param_store_zero_grads(r.store);
        ck_assert(ct_graph_forward_range(r.b.g, 0, k, CT_PASS_FORWARD, &b, &r.io, NULL, &err) == CT_OK);
        ck_assert(ct_graph_forward_range(r.b.g, k, SEAM_LAYERS, CT_PASS_FORWARD, &b, &r.io, NULL, &err) == CT_OK);
        ck_assert(ct_graph_loss(r.b.g, &r.io, &err) == CT_OK);
        ct_graph_read_loss(r.b.g, &r.io);
        ck_assert(ct_graph_backward_range(r.b.g, k, SEAM_LAYERS, &b, &r.io, NULL, &err) == CT_OK);
        ck_assert(ct_graph_backward_range(r.b.g, 0, k, &b, &r.io, NULL, &err) == CT_OK);
        expect_same(&r, &want, "two ranges");
    }
    /* a range outside the graph is an error, not a walk off its end */
    ck_assert_int_eq(ct_graph_forward_range(r.b.g, 3, SEAM_LAYERS + 1, CT_PASS_FORWARD, &b, &r.io, NULL, &err),
                     CT_ERR_RUNTIME);
    snap_free(&want);
    runner_stop(&r);
}
END_TEST

/* Whether a backward reads layer j's output (its own, or a reader's that reads its input): the
 * plan keeps only those through backward (lifetime.c), so only those may be recomputed outside a
 * checkpointed segment (the others' bytes serve other buffers once forward is done). */
static bool output_read_in_backward(const ct_graph *g, int j) {
    if (g->nodes[j].l.type->backward_reads_output) return true;
    for (int k = j + 1; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].l.n_in; i++)
            if (g->nodes[k].l.in_from[i] == j && ct_layer_backward_reads_input(&g->nodes[k].l)) return true;
    return false;
}

/* Whether layer j may be recomputed in a range from lo after the loss: its output and what it
 * reads from before the range are still there. */
static bool recomputable(const ct_graph *g, int lo, int j) {
    for (int i = 0; i < g->nodes[j].l.n_in; i++) {
        int src = g->nodes[j].l.in_from[i];
        if (src >= 0 && src < lo && !output_read_in_backward(g, src)) return false;
    }
    return output_read_in_backward(g, j);
}

/* Activation checkpointing's core: drop a range's activations and saved state, run the range
 * again with the recompute pass, and backward gives the same bits (dropout draws the same masks,
 * batchnorm's running statistics move once). Ranges of layers whose outputs backward reads (the
 * seam model's "b" is read only by the residual add, which reads no input in backward). */
START_TEST(recompute_restores_a_range) {
    runner r;
    runner_start(&r, seam_model, SEAM_N, 5);
    snapshot want = one_pass(&r);
    ct_exec_bufs b = runner_bufs(&r);
    ct_err err = {0};
    int ranges = 0;
    for (int lo = 0; lo < SEAM_LAYERS - 1; lo++) {
        int hi = lo;   /* up to three layers; the last layer's dy is the loss's */
        while (hi < lo + 3 && hi < SEAM_LAYERS - 1 && recomputable(r.b.g, lo, hi)) hi++;
        if (hi == lo) continue;
        ranges++;
        ct_param_store_init(r.store, 5);
        ct_param_store_zero_grads(r.store);
        runner_loss(&r);
        /* drop the outputs of [lo, hi) (every layer but the head has 12 features) */
        for (int j = lo; j < hi; j++) {
            float *y = ct_graph_activation(r.b.g, j);
            for (int64_t i = 0; i < SEAM_N * 12; i++) y[i] = NAN;
        }
        ck_assert(ct_graph_forward_range(r.b.g, lo, hi, CT_PASS_RECOMPUTE, &b, &r.io, NULL, &err) == CT_OK);
        runner_backward(&r, NULL);
        expect_same(&r, &want, "recomputed range");
    }
    ck_assert_int_ge(ranges, 5);   /* [0, 3) .. [3, 4): batchnorm's and dropout's; [6, 7) */
    /* recompute is for a train-mode micro-batch only */
    r.io.train = false;
    ck_assert_int_eq(ct_graph_forward_range(r.b.g, 0, 2, CT_PASS_RECOMPUTE, &b, &r.io, NULL, &err), CT_ERR_RUNTIME);
    snap_free(&want);
    runner_stop(&r);
}
END_TEST

START_TEST(prepare_hook_redirects_parameters) {
    runner r;
    runner_start(&r, seam_model, SEAM_N, 5);
    snapshot want = one_pass(&r);
    const ct_graph_info *in = ct_graph_info_get(r.b.g);
    size_t np = (size_t)in->n_params;
    gather_ctx g = gather_start(&r, np);
    ct_exec_hooks hooks = {.ctx = &g, .prepare = gather_prepare, .after = gather_after};
    ct_exec_bufs b = runner_bufs(&r);
    ct_err err = {0};
    ck_assert(ct_graph_forward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK);
    ck_assert(ct_graph_backward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK);
    ck_assert_int_eq(g.prepared, 2 * SEAM_LAYERS);
    ck_assert_int_eq(g.finished, 2 * SEAM_LAYERS);
    memcpy(r.grads, g.owner_grads, sizeof(float) * np);   /* compare the owner's gradients */
    expect_same(&r, &want, "parameters gathered by a prepare hook");
    for (size_t i = 0; i < np; i++) ck_assert(isnan(r.params[i]));   /* untouched */
    gather_stop(&g);
    snap_free(&want);
    runner_stop(&r);
}
END_TEST

static int fail_at_3(void *c, int layer, ct_pass pass, ct_layer_io *io, ct_err *err) {
    ++*(int *)c;
    return layer == 3 ? ct_errf(err, CT_ERR_RUNTIME, "gather of layer %d failed", layer) : CT_OK;
}

START_TEST(failing_hook_stops_the_walk) {
    runner r;
    runner_start(&r, seam_model, SEAM_N, 5);
    int calls = 0;
    ct_exec_hooks hooks = {.ctx = &calls, .prepare = fail_at_3};
    ct_exec_bufs b = runner_bufs(&r);
    ct_err err = {0};
    ck_assert_int_eq(ct_graph_forward(r.b.g, &b, &r.io, &hooks, &err), CT_ERR_RUNTIME);
    ck_assert_str_eq(err.msg, "gather of layer 3 failed");
    ck_assert_int_eq(calls, 4);   /* layers 0..3: nothing ran after the failure */
    runner_stop(&r);
}
END_TEST

/* ---- fusion (fuse.c) ---- */

/* Two convolutions each followed by relu (the first with a bias, over the model input, so without
 * dx; the second without a bias, after a max-pool, so with dx), batch 19 (not a multiple of the
 * conv's 8-image gradient blocks). */
static const char *cnn_fuse =
    "{\"input\": [3, 9, 8], \"layers\": [{\"type\": \"conv2d\", \"out\": 5, \"kernel\": 3, \"padding\": 1},"
    " {\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
    " {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"bias\": false}, {\"type\": \"relu\"},"
    " {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 6}], \"loss\": {\"type\": \"cross_entropy\"}}";

/* Layer j's output is not written when its max-pool is fused in (the conv, and the relu over its
 * buffer): the activation stays in the conv's scratch (fuse.c). */
static bool pooled_away(const ct_graph *g, int j) {
    int head = g->nodes[j].fused_pool >= 0 ? j : g->nodes[j].fused_into;
    return head >= 0 && g->nodes[head].fused_pool >= 0 && g->nodes[head].fused_pool != j;
}

/* One forward and backward; *acts gets every layer's output after forward but those `fused`
 * keeps in scratch (the plan is the same with and without fusion, so the buffers are comparable
 * byte for byte), grads stay in r. */
static void fuse_step(runner *r, const ct_graph *fused, unsigned char **acts, size_t *act_bytes) {
    runner_loss(r);
    const ct_graph *g = r->b.g;
    size_t esz = ct_dtype_size(ct_graph_compute_dtype(g)), total = 0;
    for (int j = 0; j < g->n_nodes; j++) total += (size_t)(r->io.n * ct_layer_out_numel(&g->nodes[j].l)) * esz;
    *acts = malloc(total);
    *act_bytes = total;
    size_t at = 0;
    for (int j = 0; j < g->n_nodes; j++) {
        size_t b = (size_t)(r->io.n * ct_layer_out_numel(&g->nodes[j].l)) * esz;
        if (!pooled_away(fused, j)) memcpy(*acts + at, ct_graph_activation(g, j), b);
        else memset(*acts + at, 0, b);
        at += b;
    }
    runner_backward(r, NULL);
}

/* model run fused (the CPU's conv2d_act ops) on 1 and 2 threads against unfused on 1 (a backend
 * without the fused ops, as CUDA or CTRAIN_CPU_FUSE=0), in each of dts: the same loss, layer
 * outputs and parameter gradients, bit for bit. want_with[j] and want_pool[j] are the fusion
 * expected of layer j (fused_with, fused_pool; -1: none). */
static void expect_fusion_bitwise(const char *model, const ct_dtype *dts, int n_dts, const int *want_with,
                                  const int *want_pool) {
    for (int d = 0; d < n_dts; d++)
        for (int threads = 1; threads <= 2; threads++) {
            runner fused, plain;
            runner_start_on(&fused, model, 19, 11, 0, false, dts[d], threads);
            runner_start_on(&plain, model, 19, 11, 0, false, dts[d], 1);
            plain.b.be->conv.conv2d_act_forward = NULL;   /* as CUDA, or CTRAIN_CPU_FUSE=0 */
            plain.b.be->conv.conv2d_act_backward = NULL;
            plain.b.be->conv.conv2d_act_pool_forward = NULL;
            plain.b.be->conv.conv2d_act_pool_backward = NULL;
            ct_err err;
            ck_assert_int_eq(ct_graph_bind(plain.b.g, plain.b.be, NULL, &err), CT_OK);
            const ct_gnode *fn = fused.b.g->nodes, *pn = plain.b.g->nodes;
            for (int j = 0; j < fused.b.g->n_nodes; j++) {
                ck_assert_int_eq(fn[j].fused_with, want_with[j]);
                ck_assert_int_eq(fn[j].fused_pool, want_pool[j]);
                if (want_with[j] >= 0) ck_assert_int_eq(fn[want_with[j]].fused_into, j);
                if (want_pool[j] >= 0) ck_assert_int_eq(fn[want_pool[j]].fused_into, j);
            }
            for (int j = 0; j < plain.b.g->n_nodes; j++)
                ck_assert(pn[j].fused_with < 0 && pn[j].fused_into < 0 && pn[j].fused_pool < 0);
            unsigned char *fa, *pa;
            size_t fb, pb;
            fuse_step(&fused, fused.b.g, &fa, &fb);
            fuse_step(&plain, fused.b.g, &pa, &pb);
            ck_assert_int_eq(fb, pb);
            ck_assert_msg(memcmp(&fused.io.loss, &plain.io.loss, sizeof(float)) == 0, "loss %.9g vs %.9g (%s, %d threads)",
                          (double)fused.io.loss, (double)plain.io.loss, ct_dtype_name(dts[d]), threads);
            ck_assert_msg(memcmp(fa, pa, fb) == 0, "activations differ (%s, %d threads)", ct_dtype_name(dts[d]), threads);
            const ct_param_layout *L = ct_graph_layout(fused.b.g);
            for (int64_t i = 0; i < L->n_params; i++)
                ck_assert_msg(memcmp(&fused.grads[i], &plain.grads[i], sizeof(float)) == 0,
                              "gradient %lld: %.9g vs %.9g (%s, %d threads)", (long long)i, (double)fused.grads[i],
                              (double)plain.grads[i], ct_dtype_name(dts[d]), threads);
            int nonzero = 0;
            for (int64_t i = 0; i < L->n_params; i++) nonzero += fused.grads[i] != 0.0f;
            ck_assert_int_gt(nonzero, L->n_params / 2);
            free(fa), free(pa);
            runner_stop(&fused);
            runner_stop(&plain);
        }
}

/* conv2d + relu run as one pass (fuse.c, the CPU's conv2d_act ops) give the same bits as the two
 * layers run apart: the loss, every layer's output and every parameter gradient, fused on 1 and 2
 * threads against unfused on 1, in fp32 and bf16. A fused forward that lost the ReLU, or a
 * backward that lost its mask, fails here. (The first pair's max-pool is fused too.) */
START_TEST(fused_conv_relu_bitwise) {
    ct_dtype dts[] = {CT_F32, CT_BF16};
    int with[] = {1, -1, -1, 4, -1, -1, -1}, pool[] = {2, -1, -1, -1, -1, -1, -1};
    expect_fusion_bitwise(cnn_fuse, dts, 2, with, pool);
    /* checkpointed layers run one by one in their recompute: not fused */
    runner ck;
    runner_start_ckpt(&ck, cnn_fuse, 4, 11, 1, false);
    for (int j = 0; j < ck.b.g->n_nodes; j++) ck_assert(ck.b.g->nodes[j].seg < 0 || ck.b.g->nodes[j].fused_with < 0);
    runner_stop(&ck);
}
END_TEST

/* conv2d + relu + 2x2 max-pool as one pass: both convolutions with their pools, the first over
 * the model input (no dx) with groups and a bias, its 9x7 output leaving a row and a column the
 * pool drops; the second with dx and no bias. After a ReLU, windows with tied zeros are common,
 * so an argmax that broke ties in another order than the pool's scan moves gradients and fails,
 * as does a pooled output that compared values before rounding them to 16 bits, a backward that
 * lost the ReLU's mask or put the gradient at another element of the window. Then a 3x3 max-pool
 * and a 2x2 one over a relu that another layer reads too are left alone. */
START_TEST(fused_conv_relu_pool_bitwise) {
    static const char *model =
        "{\"input\": [2, 9, 7], \"layers\": [{\"type\": \"conv2d\", \"out\": 6, \"kernel\": 3, \"padding\": 1,"
        " \"groups\": 2}, {\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
        " {\"type\": \"conv2d\", \"out\": 8, \"kernel\": 2, \"padding\": 1, \"bias\": false}, {\"type\": \"relu\"},"
        " {\"type\": \"maxpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 5}],"
        " \"loss\": {\"type\": \"cross_entropy\"}}";
    ct_dtype dts[] = {CT_F32, CT_BF16, CT_F16};
    int with[] = {1, -1, -1, 4, -1, -1, -1, -1}, pool[] = {2, -1, -1, 5, -1, -1, -1, -1};
    expect_fusion_bitwise(model, dts, 3, with, pool);

    static const char *not_pooled =
        "{\"input\": [2, 8, 8], \"layers\": [{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1},"
        " {\"type\": \"relu\"}, {\"type\": \"maxpool2d\", \"kernel\": 3, \"stride\": 2},"
        " {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\", \"name\": \"r2\"},"
        " {\"type\": \"maxpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"name\": \"l1\", \"out\": 3},"
        " {\"type\": \"flatten\", \"inputs\": [\"r2\"]}, {\"type\": \"linear\", \"name\": \"l2\", \"out\": 3},"
        " {\"type\": \"add\", \"inputs\": [\"l1\", \"l2\"]}], \"loss\": {\"type\": \"cross_entropy\"}}";
    int with2[] = {1, -1, -1, 4, -1, -1, -1, -1, -1, -1, -1}, pool2[] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    expect_fusion_bitwise(not_pooled, dts, 1, with2, pool2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_exec");
    TCase *tc = tcase_create("graph_exec");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, residual_add_and_concat);
    tcase_add_test(tc, in_place_relu);
    tcase_add_test(tc, hooks_and_accumulation);
    tcase_add_test(tc, unwanted_gradients_skipped);
    tcase_add_loop_test(tc, half_graph_matches_f32, 0, 2);
    tcase_add_test(tc, ranges_equal_one_pass);
    tcase_add_test(tc, recompute_restores_a_range);
    tcase_add_test(tc, prepare_hook_redirects_parameters);
    tcase_add_test(tc, failing_hook_stops_the_walk);
    tcase_add_test(tc, fused_conv_relu_bitwise);
    tcase_add_test(tc, fused_conv_relu_pool_bitwise);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

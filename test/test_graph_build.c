/* test_graph_build.c: building graphs from config.model: parameter counts and views,
 * initialisation, repeat and its block_input, reshape -1, norms on the model input, ties and
 * alignment, embeddings, the block shorthands (transformer_block, llama_block) against the same
 * layers written out, and 16-bit storage halving the activation memory. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

START_TEST(mlp_param_count) {
    built b;
    expect_ok(mlp, &b);
    const ct_graph_info *in = ct_graph_info_get(b.g);
    ck_assert_int_eq(in->n_param_elems, 669706);
    ck_assert_int_eq(in->n_params, 669712);   /* the space, padded to 8 elements at its end */
    ck_assert_int_eq(in->n_buffers, 0);
    ck_assert_int_eq(in->n_layers, 6);
    ck_assert_int_eq(in->classes, 10);
    ck_assert_int_eq(in->target_dtype, CT_I32);
    ck_assert_int_eq(in->target_shape.ndim, 0);
    const ct_param_layout *L = ct_graph_layout(b.g);
    ck_assert_int_eq(L->n_views, 6);
    ck_assert_str_eq(L->views[0].name, "linear1.weight");
    ck_assert_int_eq(L->views[1].offset, 784 * 512);
    ck_assert(!L->views[1].weight_decay);
    ck_assert(L->views[0].weight_decay);
    /* forward FLOPs: 2 * (784*512 + 512*512 + 512*10) plus the element-wise layers */
    ck_assert(in->flops_per_sample >= 2.0 * 669706 - 2 * 1034 && in->flops_per_sample < 1.4e6);
    char desc[512];
    ct_graph_describe(b.g, desc, sizeof desc);
    ck_assert_msg(strstr(desc, "linear([784]->[512])"), "%s", desc);
    unbuild(&b);
}
END_TEST

START_TEST(cnn_param_count) {
    built b;
    expect_ok(cnn, &b);
    const ct_graph_info *in = ct_graph_info_get(b.g);
    ck_assert_int_eq(in->n_param_elems, 421642);
    ck_assert_int_eq(in->output_shape.d[0], 10);
    ck_assert_int_eq(in->input_dtype, CT_F32);
    /* output gradients share memory by lifetime: without sharing this would be 2.83 MiB */
    ck_assert_msg(activation_bytes(b.g) < (size_t)(2.4 * 1048576), "%zu bytes", activation_bytes(b.g));
    unbuild(&b);
}
END_TEST

/* 16-bit storage: activations and their gradients take two bytes an element, so the plan of
 * the same model is about half the fp32 one (fp32 forward-to-backward state such as maxpool
 * indices keeps it a little above one half). The 16-bit plan also holds the converted copy of the
 * fp32 model input (the plan's input part); that copy is not an activation
 * of the fp32 plan, so it is left out of the ratio. */
static void expect_half_activations(const char *text, ct_dtype dt) {
    built b32, b16;
    build_dt(&b32, text, 8, CT_F32);
    build_dt(&b16, text, 8, dt);
    ck_assert_msg(b32.rc == CT_OK && b16.rc == CT_OK, "build failed: %s %s", b32.err.msg, b16.err.msg);
    ck_assert_int_eq(ct_graph_compute_dtype(b16.g), dt);
    ck_assert_int_eq(ct_graph_info_get(b16.g)->n_params, ct_graph_info_get(b32.g)->n_params);
    double a32 = (double)activation_bytes(b32.g);
    double input_copy = (double)(8 * ct_shape_numel(&ct_graph_info_get(b16.g)->input_shape)) * 2.0;
    double ratio = ((double)activation_bytes(b16.g) - input_copy) / a32;
    ck_assert_msg(a32 > 0 && ratio >= 0.45 && ratio <= 0.6, "%s: activation bytes %s/f32 = %.3f",
                  text, ct_dtype_name(dt), ratio);
    unbuild(&b32);
    unbuild(&b16);
}

START_TEST(half_precision_halves_activations) {
    expect_half_activations(mlp, _i ? CT_BF16 : CT_F16);
    expect_half_activations(cnn, _i ? CT_BF16 : CT_F16);
}
END_TEST

START_TEST(init_defaults_and_override) {
    built b;
    expect_ok("{\"input\": [100], \"layers\": [{\"type\": \"linear\", \"out\": 50},"
              " {\"type\": \"linear\", \"out\": 40, \"init\": {\"type\": \"normal\", \"std\": 0.5},"
              "  \"bias_init\": {\"type\": \"constant\", \"value\": 0.25}},"
              " {\"type\": \"layernorm\"}], \"loss\": {\"type\": \"mse\"}}", &b);
    const ct_param_layout *L = ct_graph_layout(b.g);
    ct_param_store *st, *st2;
    ct_err err;
    ck_assert_int_eq(ct_param_store_create(L, b.be, CT_F32, 0, L->n_params, CT_STORE_WHOLE, &st, &err), CT_OK);
    ck_assert_int_eq(ct_param_store_create(L, b.be, CT_F32, 0, L->n_params, CT_STORE_WHOLE, &st2, &err), CT_OK);
    ct_param_store_init(st, 7);
    const float *p = st->master;
    float *q = st2->master;
    const ct_param_view *w0 = &L->views[0], *b0 = &L->views[1], *w1 = &L->views[2], *b1 = &L->views[3];
    const ct_param_view *g2 = &L->views[4], *be2 = &L->views[5];
    double bound = 1.0 / sqrt(100.0), mx = 0, ss = 0;
    for (int64_t i = 0; i < w0->numel; i++) mx = fmax(mx, fabs(p[w0->offset + i]));
    ck_assert_msg(mx <= bound && mx > 0.9 * bound, "kaiming(a=sqrt5) bound %g, max %g", bound, mx);
    mx = 0;
    for (int64_t i = 0; i < b0->numel; i++) mx = fmax(mx, fabs(p[b0->offset + i]));
    ck_assert(mx <= bound && mx > 0.5 * bound);
    for (int64_t i = 0; i < w1->numel; i++) ss += (double)p[w1->offset + i] * p[w1->offset + i];
    double sd = sqrt(ss / (double)w1->numel);
    ck_assert_msg(fabs(sd - 0.5) < 0.03, "normal std 0.5: got %g", sd);
    for (int64_t i = 0; i < b1->numel; i++) ck_assert_float_eq(p[b1->offset + i], 0.25f);
    for (int64_t i = 0; i < g2->numel; i++) ck_assert_float_eq(p[g2->offset + i], 1.0f);
    for (int64_t i = 0; i < be2->numel; i++) ck_assert_float_eq(p[be2->offset + i], 0.0f);
    /* same seed, same values; another seed, others */
    ct_param_store_init(st2, 7);
    ck_assert(memcmp(p, q, sizeof(float) * (size_t)L->n_params) == 0);
    ct_param_store_init(st2, 8);
    ck_assert(memcmp(p, q, sizeof(float) * (size_t)w0->numel) != 0);
    ct_param_store_free(st);
    ct_param_store_free(st2);
    unbuild(&b);
}
END_TEST

/* Max |w| of a view (a uniform draw's bound) and its root mean square (a zero-mean normal's std). */
static void view_stats(const float *p, const ct_param_view *v, double *mx, double *rms) {
    double m = 0, ss = 0;
    for (int64_t i = 0; i < v->numel; i++) {
        m = fmax(m, fabs(p[v->offset + i]));
        ss += (double)p[v->offset + i] * p[v->offset + i];
    }
    *mx = m;
    *rms = sqrt(ss / (double)v->numel);
}

/* Every fan-based scheme on shapes whose fan_in and fan_out differ by 4 to 16 times (a square
 * layer cannot tell fan_in from fan_out), conv fans counting the receptive field: a bound or std
 * computed from the wrong fan is off by a factor of 2 or more, far outside these bounds. */
START_TEST(init_fans_on_non_square_layers) {
    built b;
    expect_ok("{\"input\": [3, 8, 8], \"layers\": ["
              " {\"type\": \"conv2d\", \"out\": 48, \"kernel\": 3, \"bias\": false,"
              "  \"init\": {\"type\": \"xavier_uniform\"}},"
              " {\"type\": \"flatten\"},"
              " {\"type\": \"linear\", \"out\": 16, \"bias\": false, \"init\": {\"type\": \"xavier_normal\", \"gain\": 2}},"
              " {\"type\": \"linear\", \"out\": 256, \"bias\": false, \"init\": {\"type\": \"xavier_uniform\", \"gain\": 0.5}},"
              " {\"type\": \"linear\", \"out\": 32, \"bias\": false,"
              "  \"init\": {\"type\": \"kaiming_uniform\", \"mode\": \"fan_out\"}},"
              " {\"type\": \"linear\", \"out\": 512, \"bias\": false, \"init\": {\"type\": \"kaiming_normal\", \"a\": 1}},"
              " {\"type\": \"linear\", \"out\": 8, \"bias\": false, \"init\": {\"type\": \"kaiming_normal\", \"mode\": \"fan_out\"}}],"
              " \"loss\": {\"type\": \"mse\"}}", &b);
    const ct_param_layout *L = ct_graph_layout(b.g);
    ck_assert_int_eq(L->n_views, 6);
    ct_param_store *st;
    ct_err err;
    ck_assert_int_eq(ct_param_store_create(L, b.be, CT_F32, 0, L->n_params, CT_STORE_WHOLE, &st, &err), CT_OK);
    ct_param_store_init(st, 11);
    /* fan_in, fan_out of each weight ([out, in] or [out, c, kh, kw]); conv: 3·9 = 27 in, 48·9 out */
    const double fin[6] = {27, 48 * 36, 16, 256, 32, 512}, fout[6] = {48 * 9, 16, 256, 32, 512, 8};
    const double gain_relu = sqrt(2.0);
    const bool uniform[6] = {true, false, true, true, false, false};
    const double want[6] = {
        sqrt(6.0 / (fin[0] + fout[0])),             /* xavier_uniform bound */
        2.0 * sqrt(2.0 / (fin[1] + fout[1])),       /* xavier_normal std, gain 2 */
        0.5 * sqrt(6.0 / (fin[2] + fout[2])),       /* xavier_uniform bound, gain 0.5 */
        gain_relu * sqrt(3.0 / fout[3]),            /* kaiming_uniform bound, mode fan_out */
        1.0 / sqrt(fin[4]),                         /* kaiming_normal std, a = 1: gain 1 */
        gain_relu / sqrt(fout[5]),                  /* kaiming_normal std, mode fan_out */
    };
    for (int i = 0; i < 6; i++) {
        double mx, rms;
        view_stats(st->master, &L->views[i], &mx, &rms);
        if (uniform[i])   /* U(-k, k): max just under k, rms k/sqrt(3) */
            ck_assert_msg(mx <= want[i] && mx > 0.97 * want[i] && fabs(rms * sqrt(3.0) / want[i] - 1) < 0.05,
                          "weight %d: bound %g, max %g, rms·sqrt3 %g", i, want[i], mx, rms * sqrt(3.0));
        else
            ck_assert_msg(fabs(rms / want[i] - 1) < 0.05, "weight %d: std %g, got %g", i, want[i], rms);
    }
    ct_param_store_free(st);
    unbuild(&b);
}
END_TEST

START_TEST(repeat_expansion) {
    const char *text =
        "{\"input\": [16], \"layers\": [{\"type\": \"linear\", \"name\": \"stem\", \"out\": 16},"
        " {\"type\": \"repeat\", \"times\": 3, \"layers\": ["
        "   {\"type\": \"linear\", \"name\": \"h\", \"out\": 16}, {\"type\": \"silu\"},"
        "   {\"type\": \"add\", \"name\": \"res\", \"inputs\": [\"prev\", \"h\"]}]},"
        " {\"type\": \"add\", \"inputs\": [\"res.2\", \"stem\"]},"
        " {\"type\": \"linear\", \"out\": 4}], \"loss\": {\"type\": \"mse\"}}";
    built b;
    expect_ok(text, &b);
    const ct_graph_info *in = ct_graph_info_get(b.g);
    ck_assert_int_eq(in->n_layers, 1 + 9 + 2);
    ck_assert_int_eq(in->n_param_elems, 5 * (16 * 16 + 16) - 16 * 16 - 16 + 16 * 4 + 4);
    ck_assert_str_eq(ct_graph_layout(b.g)->views[2].name, "h.0.weight");
    ck_assert_str_eq(ct_graph_layout(b.g)->views[6].name, "h.2.weight");
    ck_assert_int_eq(in->target_dtype, CT_F32);
    char desc[512];
    ct_graph_describe(b.g, desc, sizeof desc);
    ck_assert_str_eq(desc, "12 layers: linear([16]->[16]) 3 × [ linear([16]->[16]) silu add ] add linear([16]->[4])");
    unbuild(&b);
    check_graph_grads(text, 3, 1e-2, 2e-2);
}
END_TEST

/* A pre-norm transformer-style block written once with "block_input", and the same model written
 * out by hand with each iteration's names: the same wiring, so the same loss and gradients bit for
 * bit (parameters draw by view index, not by name). */
static const char *pre_norm_block =
    "{\"type\": \"layernorm\", \"name\": \"ln1\"}, {\"type\": \"linear\", \"name\": \"fc\", \"out\": 12},"
    " {\"type\": \"gelu\"}, {\"type\": \"linear\", \"name\": \"proj\", \"out\": 6},"
    " {\"type\": \"add\", \"name\": \"res1\", \"inputs\": [\"block_input\", \"proj\"]},"
    " {\"type\": \"layernorm\", \"inputs\": [\"res1\"]}, {\"type\": \"linear\", \"name\": \"fc2\", \"out\": 6},"
    " {\"type\": \"add\", \"name\": \"res2\", \"inputs\": [\"res1\", \"fc2\"]}";

START_TEST(repeat_block_input) {
    char once[2048], written[8192];
    snprintf(once, sizeof once, "{\"input\": [4, 5], \"layers\": [{\"type\": \"linear\", \"name\": \"stem\","
             " \"out\": 6}, {\"type\": \"repeat\", \"times\": 3, \"layers\": [%s]},"
             " {\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"cross_entropy\"}}", pre_norm_block);
    int at = snprintf(written, sizeof written, "{\"input\": [4, 5], \"layers\": [{\"type\": \"linear\","
                      " \"name\": \"stem\", \"out\": 6}");
    for (int i = 0; i < 3; i++) {
        char from[16];
        if (i == 0) snprintf(from, sizeof from, "stem");
        else snprintf(from, sizeof from, "r2_%d", i - 1);
        at += snprintf(written + at, sizeof written - (size_t)at,
                       ", {\"type\": \"layernorm\", \"inputs\": [\"%s\"]}, {\"type\": \"linear\", \"out\": 12},"
                       " {\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 6},"
                       " {\"type\": \"add\", \"name\": \"r1_%d\", \"inputs\": [\"%s\", \"prev\"]},"
                       " {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 6},"
                       " {\"type\": \"add\", \"name\": \"r2_%d\", \"inputs\": [\"r1_%d\", \"prev\"]}",
                       from, i, from, i, i);
    }
    snprintf(written + at, sizeof written - (size_t)at,
             ", {\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"cross_entropy\"}}");

    runner a, b;
    runner_start(&a, once, 3, 7);
    runner_start(&b, written, 3, 7);
    ck_assert_int_eq(a.b.g->n_nodes, 1 + 3 * 8 + 1);
    ck_assert_int_eq(b.b.g->n_nodes, a.b.g->n_nodes);
    ck_assert_int_eq(a.b.g->nodes[5].l.in_from[0], 0);                 /* res1.0: the stem */
    ck_assert_int_eq(a.b.g->nodes[13].l.in_from[0], 8);                /* res1.1: res2.0 */
    for (int j = 0; j < a.b.g->n_nodes; j++) {
        const ct_layer *la = &a.b.g->nodes[j].l, *lb = &b.b.g->nodes[j].l;
        ck_assert_str_eq(la->type->name, lb->type->name);
        ck_assert_int_eq(la->n_in, lb->n_in);
        for (int i = 0; i < la->n_in; i++)
            ck_assert_msg(la->in_from[i] == lb->in_from[i], "layer %d (%s) input %d: %d vs %d", j, la->name, i,
                          la->in_from[i], lb->in_from[i]);
    }
    int64_t np = ct_graph_info_get(a.b.g)->n_params;
    ck_assert_int_eq(ct_graph_info_get(b.b.g)->n_params, np);
    ck_assert_int_eq(memcmp(a.params, b.params, sizeof(float) * (size_t)np), 0);
    double la = runner_loss(&a), lb = runner_loss(&b);
    runner_backward(&a, NULL);
    runner_backward(&b, NULL);
    ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0, "loss %.17g vs %.17g", la, lb);
    ck_assert_int_eq(memcmp(a.grads, b.grads, sizeof(float) * (size_t)np), 0);
    runner_stop(&a);
    runner_stop(&b);
    check_graph_grads(once, 3, 1e-2, 3e-2);

    /* a block that starts the model reads the model input in its first iteration; a nested block
       reads its own iteration's input, and the outer one's is back after it */
    built g;
    expect_ok("{\"input\": [6], \"layers\": [{\"type\": \"repeat\", \"times\": 2, \"layers\": ["
              " {\"type\": \"linear\", \"out\": 6},"
              " {\"type\": \"repeat\", \"times\": 2, \"layers\": [{\"type\": \"tanh\"},"
              "   {\"type\": \"add\", \"inputs\": [\"block_input\", \"prev\"]}]},"
              " {\"type\": \"add\", \"inputs\": [\"block_input\", \"prev\"]}]},"
              " {\"type\": \"linear\", \"out\": 3}]}", &g);
    /* layer: 0 linear, 1 tanh, 2 add, 3 tanh, 4 add, 5 add, 6 linear, 7 tanh, 8 add, 9 tanh, 10 add,
       11 add, 12 linear; each add's input 0 is its block's input */
    static const int add[] = {2, 4, 5, 8, 10, 11}, from[] = {0, 2, -1, 6, 8, 5};
    for (int k = 0; k < CT_ARRAY_LEN(add); k++)
        ck_assert_msg(g.g->nodes[add[k]].l.in_from[0] == from[k], "layer %d reads %d, expected %d", add[k],
                      g.g->nodes[add[k]].l.in_from[0], from[k]);
    unbuild(&g);
}
END_TEST

START_TEST(reshape_infers_minus_one) {
    const char *text =
        "{\"input\": [784], \"layers\": [{\"type\": \"reshape\", \"shape\": [1, 28, -1]},"
        " {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"stride\": 2},"
        " {\"type\": \"batchnorm2d\"}, {\"type\": \"global_avgpool\"}, {\"type\": \"linear\", \"out\": 3}],"
        " \"loss\": {\"type\": \"bce_with_logits\"}}";
    built b;
    expect_ok(text, &b);
    const ct_graph_info *in = ct_graph_info_get(b.g);
    ck_assert_int_eq(in->n_buffers, 16);   /* running mean and var [4] each, 8-aligned */
    ck_assert_int_eq(in->output_shape.d[0], 3);
    ck_assert_int_eq(ct_graph_plan(b.g)->workspace > 0, 1);
    unbuild(&b);
    check_graph_grads(text, 4, 1e-2, 3e-2);
}
END_TEST

/* Norm layers fed by the model input write their (unused) input gradient to scratch. */
START_TEST(norms_on_model_input) {
    check_graph_grads("{\"input\": [2, 3, 3], \"layers\": [{\"type\": \"batchnorm2d\"}, {\"type\": \"flatten\"},"
                      " {\"type\": \"linear\", \"out\": 4}], \"loss\": {\"type\": \"mse\"}}", 5, 1e-2, 3e-2);
    check_graph_grads("{\"input\": [3, 6], \"layers\": [{\"type\": \"layernorm\", \"name\": \"ln\"},"
                      " {\"type\": \"linear\", \"out\": 6}, {\"type\": \"add\", \"inputs\": [\"prev\", \"ln\"]},"
                      " {\"type\": \"dropout\", \"p\": 0.2}, {\"type\": \"linear\", \"out\": 3}],"
                      " \"loss\": {\"type\": \"cross_entropy\"}}", 2, 1e-2, 3e-2);
}
END_TEST

START_TEST(views_aligned_and_ties_checked) {
    built b;
    expect_ok("{\"input\": [3], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 5},"
              " {\"type\": \"layernorm\", \"name\": \"n\"}, {\"type\": \"batchnorm2d\", \"name\": \"bn\"},"
              " {\"type\": \"linear\", \"name\": \"c\", \"out\": 5}], \"loss\": {\"type\": \"mse\"}}", &b);
    const ct_param_layout *L = ct_graph_layout(b.g);
    for (int i = 0; i < L->n_views; i++)
        ck_assert_msg(L->views[i].offset % CT_VIEW_ALIGN == 0, "%s at %lld", L->views[i].name,
                      (long long)L->views[i].offset);
    ck_assert_int_eq(L->views[1].offset, 16);   /* a.weight [5, 3] = 15, padded to 16 */
    unbuild(&b);
    static const char *head = "{\"input\": [4], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 9,"
                              " \"dim\": 6}, {\"type\": \"linear\", \"name\": \"h\", \"out\": %s, \"bias\": false, \"tie\": %s}],"
                              " \"loss\": {\"type\": \"cross_entropy\"}}";
    char text[512];
    snprintf(text, sizeof text, head, "9", "\"wte.weght\"");
    EXPECT_ERROR(text, "m.json:1:", "\"h\" (linear)", "tie: no parameter named \"wte.weght\"", "did you mean \"wte.weight\"");
    snprintf(text, sizeof text, head, "8", "\"wte.weight\"");
    EXPECT_ERROR(text, "tie: weight is [8, 6] but \"wte.weight\" is [9, 6]");
    snprintf(text, sizeof text, head, "9", "{\"wieght\": \"wte.weight\"}");
    EXPECT_ERROR(text, "tie: this layer has no parameter \"wieght\"", "did you mean \"weight\"");
    snprintf(text, sizeof text, head, "9", "{\"weight\": 3}");
    EXPECT_ERROR(text, "tie.weight: expected the name of a view");
    snprintf(text, sizeof text, head, "9", "\"h.weight\"");
    EXPECT_ERROR(text, "tie: no parameter named \"h.weight\" in an earlier layer");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 4},"
                 " {\"type\": \"relu\", \"tie\": \"a.weight\"}], \"loss\": {\"type\": \"mse\"}}",
                 "tie: this layer has no weight to tie");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 4},"
                 " {\"type\": \"linear\", \"out\": 4, \"tie\": \"a.weight\", \"init\": {\"type\": \"zeros\"}}],"
                 " \"loss\": {\"type\": \"mse\"}}", "init: weight is tied to \"a.weight\"");
}
END_TEST

START_TEST(embedding_tokens) {
    built b;
    expect_ok("{\"input\": [5], \"layers\": [{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 6},"
              " {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 11}],"
              " \"loss\": {\"type\": \"cross_entropy\", \"label_smoothing\": 0.1}}", &b);
    const ct_graph_info *in = ct_graph_info_get(b.g);
    ck_assert_int_eq(in->input_dtype, CT_I32);
    ck_assert_int_eq(in->target_shape.ndim, 1);
    ck_assert_int_eq(in->target_shape.d[0], 5);
    ck_assert_int_eq(in->classes, 11);
    unbuild(&b);
}
END_TEST

/* position_embedding adds rows of one [max_len, C] table: over a layer's output it runs in place
 * (dx is dy), over an output another layer also reads it copies; both give the same gradients. */
START_TEST(position_embedding_graph) {
    const char *in_place =
        "{\"input\": [4, 5], \"layers\": [{\"type\": \"linear\", \"name\": \"tok\", \"out\": 6},"
        " {\"type\": \"position_embedding\", \"name\": \"pos\", \"max_len\": 7}, {\"type\": \"layernorm\"},"
        " {\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"cross_entropy\"}}";
    const char *copied =
        "{\"input\": [4, 5], \"layers\": [{\"type\": \"linear\", \"name\": \"tok\", \"out\": 6},"
        " {\"type\": \"position_embedding\", \"name\": \"pos\", \"max_len\": 7},"
        " {\"type\": \"add\", \"inputs\": [\"pos\", \"tok\"]}, {\"type\": \"linear\", \"out\": 3}],"
        " \"loss\": {\"type\": \"cross_entropy\"}}";
    built b;
    expect_ok(in_place, &b);
    ck_assert_ptr_eq(ct_graph_activation(b.g, 1), ct_graph_activation(b.g, 0));
    const ct_param_layout *L = ct_graph_layout(b.g);
    ck_assert_str_eq(L->views[2].name, "pos.weight");
    ck_assert_int_eq(L->views[2].shape.d[0], 7);   /* sized by max_len, not T = 4 */
    unbuild(&b);
    expect_ok(copied, &b);
    ck_assert_ptr_ne(ct_graph_activation(b.g, 1), ct_graph_activation(b.g, 0));
    unbuild(&b);
    check_graph_grads(in_place, 3, 1e-2, 2e-2);
    check_graph_grads(copied, 3, 1e-2, 2e-2);
}
END_TEST

START_TEST(transformer_block_expands) {
    const char *shorthand = GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2, \"attn_dropout\": 0.1}" GPT_TAIL;
    const char *written =
        GPT_HEAD "{\"type\": \"layernorm\", \"name\": \"ln1\"}, " LIN("qkv", 48, "0.02") ","
        " {\"type\": \"causal_self_attention\", \"name\": \"attn\", \"heads\": 2, \"dropout\": 0.1}, " LIN("proj", 16, "0.01") ","
        " {\"type\": \"add\", \"name\": \"res1\", \"inputs\": [\"block_input\", \"proj\"]},"
        " {\"type\": \"layernorm\", \"name\": \"ln2\"}, " LIN("fc1", 64, "0.02") ", {\"type\": \"gelu\", \"approximate\": \"tanh\"},"
        " " LIN("fc2", 16, "0.01") ", {\"type\": \"add\", \"name\": \"res2\", \"inputs\": [\"res1\", \"fc2\"]}" GPT_TAIL;
    runner a, b;
    runner_start(&a, shorthand, 3, 11);
    runner_start(&b, written, 3, 11);
    const ct_param_layout *La = ct_graph_layout(a.b.g), *Lb = ct_graph_layout(b.b.g);
    ck_assert_int_eq(ct_graph_info_get(a.b.g)->n_layers, ct_graph_info_get(b.b.g)->n_layers);
    ck_assert_int_eq(La->n_views, Lb->n_views);
    ck_assert_int_eq(La->n_params, Lb->n_params);
    for (int v = 0; v < La->n_views; v++) {
        ck_assert_str_eq(La->views[v].name, Lb->views[v].name);
        ck_assert(ct_shape_eq(&La->views[v].shape, &Lb->views[v].shape));
    }
    ck_assert_str_eq(La->views[4].name, "qkv.0.weight");
    /* MFU's FLOPs: 6 N + 6 L C T per token (2 blocks of width 16 over 8 positions), 8 tokens */
    double N = (double)ct_graph_info_get(a.b.g)->n_param_elems;
    ck_assert_double_eq(ct_graph_train_flops_per_sample(a.b.g), 8 * (6 * N + 6 * 2 * 16 * 8));
    ck_assert(memcmp(a.params, b.params, sizeof(float) * (size_t)La->n_params) == 0);
    double la = runner_loss(&a), lb = runner_loss(&b);
    ck_assert_msg(la == lb, "loss %.9g vs %.9g", la, lb);
    runner_backward(&a, NULL);
    runner_backward(&b, NULL);
    ck_assert(memcmp(a.grads, b.grads, sizeof(float) * (size_t)La->n_params) == 0);
    runner_stop(&a);
    runner_stop(&b);
    /* named: "h.ln1.0"; residual dropout adds drop1/drop2; the gradient still checks out */
    built g;
    expect_ok(GPT_HEAD "{\"type\": \"transformer_block\", \"name\": \"h\", \"heads\": 4, \"dropout\": 0.2,"
              " \"mlp_ratio\": 2, \"bias\": false}" GPT_TAIL, &g);
    ck_assert_str_eq(ct_graph_layout(g.g)->views[2].name, "h.ln1.0.weight");
    ck_assert_str_eq(ct_graph_layer_name(g.g, 6), "h.drop1.0");
    ck_assert_int_eq(ct_graph_info_get(g.g)->n_layers, 2 + 2 * 12 + 2);
    unbuild(&g);
    check_graph_grads(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2, \"mlp_ratio\": 2}" GPT_TAIL, 2, 1e-2, 3e-2);
    EXPECT_ERROR(GPT_HEAD "{\"type\": \"transformer_block\"}" GPT_TAIL, "(transformer_block)", "missing field \"heads\"");
    EXPECT_ERROR(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 3}" GPT_TAIL, "width C = 16 is not divisible by heads = 3");
    EXPECT_ERROR(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2, \"head\": 2}" GPT_TAIL, "\"head\"");
    EXPECT_ERROR(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2, \"dropout\": 1}" GPT_TAIL, "dropout: expected a number in [0, 1)");
    EXPECT_ERROR("{\"input\": [8], \"layers\": [{\"type\": \"transformer_block\", \"heads\": 2}]}",
                 "takes a sequence [T, C]", "put an embedding before it");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"transformer_blok\"}]}", "did you mean \"transformer_block\"");
}
END_TEST

START_TEST(llama_block_expands) {
    const char *shorthand = LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 2, \"intermediate\": 24,"
                            " \"rope_theta\": 500, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}" LLAMA_TAIL;
    const char *written =
        LLAMA_HEAD "{\"type\": \"rmsnorm\", \"name\": \"ln1\", \"eps\": 1e-6}, " LIN_NB("qkv", 32, "0.02") ","
        " {\"type\": \"causal_self_attention\", \"name\": \"attn\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 500,"
        " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}, " LIN_NB("proj", 16, "0.02") ","
        " {\"type\": \"add\", \"name\": \"res1\", \"inputs\": [\"block_input\", \"proj\"]},"
        " {\"type\": \"rmsnorm\", \"name\": \"ln2\"}, " LIN_NB("gate_up", 48, "0.02") ", {\"type\": \"swiglu\"},"
        " " LIN_NB("down", 16, "0.02") ", {\"type\": \"add\", \"name\": \"res2\", \"inputs\": [\"res1\", \"down\"]}" LLAMA_TAIL;
    runner a, b;
    runner_start(&a, shorthand, 3, 11);
    runner_start(&b, written, 3, 11);
    const ct_param_layout *La = ct_graph_layout(a.b.g), *Lb = ct_graph_layout(b.b.g);
    ck_assert_int_eq(ct_graph_info_get(a.b.g)->n_layers, ct_graph_info_get(b.b.g)->n_layers);
    ck_assert_int_eq(La->n_views, Lb->n_views);
    for (int v = 0; v < La->n_views; v++) {
        ck_assert_str_eq(La->views[v].name, Lb->views[v].name);
        ck_assert(ct_shape_eq(&La->views[v].shape, &Lb->views[v].shape));
    }
    ck_assert_str_eq(La->views[2].name, "qkv.0.weight");
    ck_assert_int_eq(La->views[2].shape.d[0], (4 + 2 * 2) * 4);
    ck_assert(memcmp(a.params, b.params, sizeof(float) * (size_t)La->n_params) == 0);
    double la = runner_loss(&a), lb = runner_loss(&b);
    ck_assert_msg(la == lb, "loss %.9g vs %.9g", la, lb);
    runner_backward(&a, NULL);
    runner_backward(&b, NULL);
    ck_assert(memcmp(a.grads, b.grads, sizeof(float) * (size_t)La->n_params) == 0);
    runner_stop(&a);
    runner_stop(&b);
    check_graph_grads(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 1, \"intermediate\": 20}" LLAMA_TAIL,
                      2, 1e-2, 3e-2);
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4}" LLAMA_TAIL, "(llama_block)",
                 "missing field \"intermediate\"");
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 3, \"intermediate\": 8}" LLAMA_TAIL,
                 "kv_heads = 3 must divide heads = 4");
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 16, \"intermediate\": 8}" LLAMA_TAIL,
                 "head dim C / heads = 1", "even head dim");
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"intermediate\": 8, \"kv_head\": 2}" LLAMA_TAIL,
                 "did you mean \"kv_heads\"");
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"intermediate\": 8, \"rope_scaling\":"
                 " {\"type\": \"yarn\", \"factor\": 4}}" LLAMA_TAIL,
                 "(causal_self_attention)", "rope_scaling.type \"yarn\" is not supported", "\"linear\" and \"dynamic\"");
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"intermediate\": 8, \"rope_scaling\":"
                 " {\"type\": \"dynamic\", \"factor\": 4}}" LLAMA_TAIL, "max_position_embeddings");
    EXPECT_ERROR(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"intermediate\": 8, \"rope_scaling\":"
                 " {\"type\": \"linear\", \"factr\": 4}}" LLAMA_TAIL, "unknown key \"factr\"", "did you mean \"factor\"");
    EXPECT_ERROR("{\"input\": [5, 20], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 4, \"kv_heads\": 2}]}",
                 "input is [5, 20]", "[T, 8 D]");
    EXPECT_ERROR("{\"input\": [5, 24], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 3, \"kv_heads\": 2}]}",
                 "heads = 3 is not divisible by kv_heads = 2");
    EXPECT_ERROR("{\"input\": [5, 15], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 1, \"rope_theta\": 10}]}",
                 "head dim 5 is odd");
    EXPECT_ERROR("{\"input\": [5, 6], \"layers\": [{\"type\": \"swiglu\"}, {\"type\": \"swiglu\"}]}",
                 "(swiglu)", "input is [5, 3]", "even out");
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_build");
    TCase *tc = tcase_create("graph_build");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, mlp_param_count);
    tcase_add_test(tc, cnn_param_count);
    tcase_add_loop_test(tc, half_precision_halves_activations, 0, 2);
    tcase_add_test(tc, init_defaults_and_override);
    tcase_add_test(tc, init_fans_on_non_square_layers);
    tcase_add_test(tc, repeat_expansion);
    tcase_add_test(tc, repeat_block_input);
    tcase_add_test(tc, reshape_infers_minus_one);
    tcase_add_test(tc, norms_on_model_input);
    tcase_add_test(tc, views_aligned_and_ties_checked);
    tcase_add_test(tc, embedding_tokens);
    tcase_add_test(tc, position_embedding_graph);
    tcase_add_test(tc, transformer_block_expands);
    tcase_add_test(tc, llama_block_expands);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

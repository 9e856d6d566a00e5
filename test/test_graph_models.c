/* test_graph_models.c: whole models against PyTorch (test/ref/gen_layer_refs.py): a tied LM head, a
 * GPT-2-shaped model, a transformer graph written layer by layer, and a padded vocabulary's loss
 * computed in place. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

/* A tied LM head (linear "tie": "wte.weight") against PyTorch (test/ref/gen_layer_refs.py,
 * case tied_lm): the tensor exists once, the head reads it and both layers' gradients add up. */
START_TEST(tied_head_matches_pytorch) {
    ref_file rf;
    ref_load(&rf, "test/ref/layers/tied_lm.bin");
    char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(rf.meta, "model"));
    const ref_array *ids = ref_get(&rf, "ids"), *tgt = ref_get(&rf, "target");
    int64_t n = ids->shape.d[0];
    runner r;
    runner_start(&r, text, n, 1);
    const ct_param_layout *L = ct_graph_layout(r.b.g);
    ck_assert_int_eq(L->n_views, 3);   /* wte.weight, ln.weight, ln.bias: the head has none */
    int head = ct_graph_info_get(r.b.g)->n_layers - 1;
    ck_assert(ct_param_layout_is_alias(L, head, 0));
    ck_assert_int_eq(ct_param_layout_layer_view(L, head, 0), ct_param_layout_find(L, "wte.weight"));
    static const char *const names[][2] = {{"wte.weight", "wte"}, {"ln.weight", "ln_w"}, {"ln.bias", "ln_b"}};
    for (int i = 0; i < 3; i++) {
        const ct_param_view *v = &L->views[ct_param_layout_find(L, names[i][0])];
        const ref_array *a = ref_get(&rf, names[i][1]);
        ck_assert_int_eq(ct_shape_numel(&a->shape), v->numel);
        memcpy(r.params + v->offset, a->data, sizeof(float) * (size_t)v->numel);
    }
    int32_t *tok = (int32_t *)r.input, *lab = r.target;   /* token ids: 4 bytes, like the floats */
    for (int64_t i = 0; i < ct_shape_numel(&ids->shape); i++) tok[i] = (int32_t)ids->data[i], lab[i] = (int32_t)tgt->data[i];
    runner_loss(&r);
    runner_backward(&r, NULL);
    ref_compare("tied_lm", "loss", &r.io.loss, ref_get(&rf, "loss"), 1e-5);
    for (int i = 0; i < 3; i++) {
        const ct_param_view *v = &L->views[ct_param_layout_find(L, names[i][0])];
        char key[16];
        snprintf(key, sizeof key, "d_%s", names[i][1]);
        ref_compare("tied_lm", key, r.grads + v->offset, ref_get(&rf, key), 5e-5);
    }
    free(text);
    ref_free(&rf);
    runner_stop(&r);
}
END_TEST

/* A whole GPT-2-shaped model against PyTorch (gen_layer_refs.py, case gpt_small: embeddings, two
 * pre-norm blocks written once with block_input, causal attention, GELU-tanh MLP, residuals, final
 * layernorm, tied head): every parameter loaded by its view name, the loss and every gradient. */
START_TEST(gpt_matches_pytorch) {
    ref_file rf;
    ref_load(&rf, "test/ref/layers/gpt_small.bin");
    char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(rf.meta, "model"));
    const ref_array *ids = ref_get(&rf, "ids"), *tgt = ref_get(&rf, "target");
    runner r;
    runner_start(&r, text, ids->shape.d[0], 1);
    const ct_param_layout *L = ct_graph_layout(r.b.g);
    ck_assert_int_eq(L->n_views, 2 + 2 * 12 + 2);   /* wte, wpe, 12 per block, ln_f */
    for (int i = 0; i < L->n_views; i++) {
        const ct_param_view *v = &L->views[i];
        const ref_array *a = ref_get(&rf, v->name);
        ck_assert_msg(a && ct_shape_numel(&a->shape) == v->numel, "gpt_small: no tensor %s", v->name);
        memcpy(r.params + v->offset, a->data, sizeof(float) * (size_t)v->numel);
    }
    int32_t *tok = (int32_t *)r.input, *lab = r.target;
    for (int64_t i = 0; i < ct_shape_numel(&ids->shape); i++) tok[i] = (int32_t)ids->data[i], lab[i] = (int32_t)tgt->data[i];
    runner_loss(&r);
    runner_backward(&r, NULL);
    ref_compare("gpt_small", "loss", &r.io.loss, ref_get(&rf, "loss"), 1e-5);
    for (int i = 0; i < L->n_views; i++) {
        const ct_param_view *v = &L->views[i];
        char key[sizeof v->name + 2];
        snprintf(key, sizeof key, "d:%s", v->name);
        ref_compare("gpt_small", key, r.grads + v->offset, ref_get(&rf, key), 1e-4);
    }
    free(text);
    ref_free(&rf);
    runner_stop(&r);
}
END_TEST

/* A GPT-2-shaped model: positions, two pre-norm blocks written once (block_input), causal
 * attention with dropout, a GELU MLP, residual adds, a final layernorm and a head over the
 * positions; finite differences of the whole graph, and the attention errors. */
START_TEST(transformer_graph) {
    const char *gpt =
        "{\"input\": [5, 8], \"layers\": ["
        " {\"type\": \"position_embedding\", \"name\": \"wpe\", \"max_len\": 8},"
        " {\"type\": \"repeat\", \"times\": 2, \"layers\": ["
        "  {\"type\": \"layernorm\", \"name\": \"ln1\"}, {\"type\": \"linear\", \"out\": 24},"
        "  {\"type\": \"causal_self_attention\", \"heads\": 2, \"dropout\": 0.2},"
        "  {\"type\": \"linear\", \"name\": \"proj\", \"out\": 8},"
        "  {\"type\": \"add\", \"name\": \"res1\", \"inputs\": [\"block_input\", \"proj\"]},"
        "  {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 32}, {\"type\": \"gelu\", \"approximate\": \"tanh\"},"
        "  {\"type\": \"linear\", \"name\": \"fc2\", \"out\": 8},"
        "  {\"type\": \"add\", \"inputs\": [\"res1\", \"fc2\"]}]},"
        " {\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 7}],"
        " \"loss\": {\"type\": \"cross_entropy\"}}";
    built b;
    expect_ok(gpt, &b);
    /* dropout > 0 makes the attention a random layer (no CUDA-graph capture); 0 does not */
    ck_assert(ct_graph_layer_flags(b.g, 3) & CT_LAYER_RANDOM);
    unbuild(&b);
    check_graph_grads(gpt, 3, 1e-2, 3e-2);
    expect_ok("{\"input\": [5, 12], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 2}],"
              " \"loss\": {\"type\": \"mse\"}}", &b);
    ck_assert(!(ct_graph_layer_flags(b.g, 0) & CT_LAYER_RANDOM));
    ck_assert_int_eq(ct_graph_info_get(b.g)->output_shape.d[1], 4);
    unbuild(&b);
    EXPECT_ERROR("{\"input\": [5, 13], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 2}]}",
                 "(causal_self_attention)", "input is [5, 13]", "expected [T, 3C]");
    EXPECT_ERROR("{\"input\": [5, 12], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 3}]}",
                 "width C = 4 (input 12 / 3) is not divisible by heads = 3");
    EXPECT_ERROR("{\"input\": [2, 774], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 2}]}",
                 "head dim C / heads = 129 is above 128: use more heads");
    EXPECT_ERROR("{\"input\": [5, 12], \"layers\": [{\"type\": \"causal_self_attention\"}]}",
                 "missing field \"heads\"");
    EXPECT_ERROR("{\"input\": [5, 12], \"layers\": [{\"type\": \"causal_self_attention\", \"heads\": 2,"
                 " \"dropout\": 1}]}", "dropout");
}
END_TEST

/* A padded vocabulary: "classes" predicts the first 10 of the head's 13 outputs, so the padded rows
 * get no probability and no gradient; and the loss writes its gradient over the logits (one
 * buffer, not two) unless the last layer's backward reads its output. */
START_TEST(padded_vocab_loss_in_place) {
    const char *text =
        "{\"input\": [4, 6], \"layers\": [{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"name\": \"head\","
        " \"out\": 13}], \"loss\": {\"type\": \"cross_entropy\", \"classes\": 10}}";
    built b;
    expect_ok(text, &b);
    ck_assert_int_eq(ct_graph_info_get(b.g)->classes, 10);
    ck_assert_int_eq(ct_graph_info_get(b.g)->padded_classes, 13);
    ck_assert_ptr_eq(ct_graph_activation_grad(b.g, 1), ct_graph_activation(b.g, 1));
    unbuild(&b);
    check_graph_grads(text, 3, 1e-2, 2e-2);
    runner r;
    runner_start(&r, text, 3, 7);
    runner_loss(&r);
    runner_backward(&r, NULL);
    const ct_param_layout *L = ct_graph_layout(r.b.g);
    int checked = 0;
    for (int v = 0; v < L->n_views; v++) {
        const ct_param_view *pv = &L->views[v];
        if (strncmp(pv->name, "head.", 5) != 0) continue;
        int64_t per_row = pv->numel / 13;   /* weight [13, 6], bias [13] */
        for (int64_t i = 0; i < pv->numel; i++) {
            float g = r.grads[pv->offset + i];
            if (i / per_row >= 10) ck_assert_msg(g == 0.0f, "%s[%lld]: padded row has gradient %g", pv->name, (long long)i, g);
            else checked += g != 0.0f;
        }
    }
    ck_assert_int_gt(checked, 60);
    runner_stop(&r);
    /* tanh's backward reads its output: the loss's gradient goes to a slot of its own */
    expect_ok("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}, {\"type\": \"tanh\"}],"
              " \"loss\": {\"type\": \"mse\"}}", &b);
    ck_assert_ptr_ne(ct_graph_activation_grad(b.g, 1), ct_graph_activation(b.g, 1));
    unbuild(&b);
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 13}],"
                 " \"loss\": {\"type\": \"cross_entropy\", \"classes\": 14}}", "model.loss.classes", "[2, 13]");
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 13}],"
                 " \"loss\": {\"type\": \"mse\", \"classes\": 10}}", "model.loss.classes", "with cross_entropy");
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_models");
    TCase *tc = tcase_create("graph_models");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, tied_head_matches_pytorch);
    tcase_add_test(tc, transformer_graph);
    tcase_add_test(tc, gpt_matches_pytorch);
    tcase_add_test(tc, padded_vocab_loss_in_place);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

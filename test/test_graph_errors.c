/* test_graph_errors.c: bad models: every bad layer type, field, shape, dimension and reference a
 * CT_ERR_CONFIG naming the layer and its place in the file, and malformed or randomly mutated
 * models an error, never a crash. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

/* ---- bad input ---- */

START_TEST(bad_layer_types_and_fields) {
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3},\n"
                 "  {\"type\": \"lnear\", \"name\": \"fc2\", \"out\": 2}]}",
                 "m.json:2:", "model.layers[1] \"fc2\"", "unknown layer type \"lnear\"",
                 "did you mean \"linear\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\"}]}",
                 "model.layers[0] \"linear0\" (linear)", "missing field \"out\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": \"512\"}]}",
                 "model.layers[0]", "out: expected an integer, got a string");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 2.5}]}",
                 "out: expected an integer");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"outt\": 3}]}",
                 "unknown field \"outt\"", "did you mean \"out\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"bias\": 1}]}",
                 "bias: expected true or false");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"out\": 3}]}", "model.layers[0]", "missing field \"type\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": 3}]}", "model.layers[0]", "\"type\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [3]}", "model.layers[0]", "expected an object");
    EXPECT_ERROR("{\"input\": [4], \"layers\": []}", "model.layers", "non-empty");
    EXPECT_ERROR("{\"input\": [4]}", "model.layers", "missing");
    EXPECT_ERROR("{\"input\": [4], \"layer\": []}", "unknown key \"layer\"", "did you mean \"layers\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"gelu\", \"approximate\": \"tan\"}]}",
                 "approximate", "did you mean \"tanh\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"dropout\", \"p\": 1.0}]}", "p: expected a number in [0, 1)");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"init\": {\"type\": \"normall\"}}]}",
                 "unknown init \"normall\"", "did you mean \"normal\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"mae\"}}",
                 "model.loss.type", "unknown loss \"mae\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"repeat\", \"times\": 0, \"layers\": [{\"type\": \"relu\"}]},"
                 " {\"type\": \"linear\", \"out\": 2}]}", "model.layers[0] (repeat): times");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"reshape\", \"shape\": [-1, -1]}]}",
                 "only one entry may be -1");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"relu\", \"init\": {\"type\": \"zeros\"}}]}",
                 "(relu)", "init: this layer has no weight");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"bias\": false,"
                 " \"bias_init\": {\"type\": \"zeros\"}}]}", "bias_init: this layer has no bias");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"checkpoint\": 1}]}",
                 "checkpoint: expected true or false");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"embedding\", \"vocab\": 5, \"dim\": 4},"
                 " {\"type\": \"concat\", \"inputs\": [\"prev\", \"input\"]}]}", "(concat)", "token ids");
}
END_TEST

START_TEST(bad_shapes_and_dims) {
    /* the UX example, with the position of the offending layer */
    EXPECT_ERROR("{\"input\": [640], \"layers\": [{\"type\": \"linear\", \"name\": \"fc1\", \"out\": 640},\n"
                 " {\"type\": \"relu\"}, {\"type\": \"dropout\", \"p\": 0.1, \"inputs\": [\"fc1\"]},\n"
                 "   {\"type\": \"linear\", \"name\": \"fc2\", \"in\": 512, \"out\": 10}]}",
                 "m.json:3:4: model.layers[3] \"fc2\" (linear): input has 640 features, expected 512 (from \"dropout2\")");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 3},"
                 " {\"type\": \"linear\", \"name\": \"b\", \"out\": 5, \"inputs\": [\"input\"]},"
                 " {\"type\": \"add\", \"inputs\": [\"a\", \"b\"]}]}",
                 "model.layers[2] \"add2\" (add)", "input 1 is [5] (from \"b\"), expected [3]");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"add\"}]}", "add", "takes 2 to 8 inputs");
    EXPECT_ERROR("{\"input\": [2, 3], \"layers\": [{\"type\": \"linear\", \"out\": 2, \"name\": \"a\"},"
                 " {\"type\": \"concat\", \"inputs\": [\"a\", \"input\"], \"axis\": 1}]}",
                 "concat", "except on axis 1");
    EXPECT_ERROR("{\"input\": [784], \"layers\": [{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 3}]}",
                 "(conv2d)", "expected [C, H, W]", "the model input");
    EXPECT_ERROR("{\"input\": [1, 4, 4], \"layers\": [{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 5}]}",
                 "does not fit");
    EXPECT_ERROR("{\"input\": [3, 4, 4], \"layers\": [{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 1, \"groups\": 2}]}",
                 "not divisible by groups");
    EXPECT_ERROR("{\"input\": [1, 4, 4], \"layers\": [{\"type\": \"maxpool2d\", \"kernel\": 2, \"padding\": 2}]}",
                 "more than half");
    EXPECT_ERROR("{\"input\": [12], \"layers\": [{\"type\": \"reshape\", \"shape\": [5, -1]}]}",
                 "cannot reshape [12]");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 0}]}", "out: expected an integer >= 1, got 0");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": -3}]}", "got -3");
    EXPECT_ERROR("{\"input\": [0, 28], \"layers\": [{\"type\": \"relu\"}]}", "model.input[0]", "positive integer");
    EXPECT_ERROR("{\"input\": [], \"layers\": [{\"type\": \"relu\"}]}", "model.input");
    EXPECT_ERROR("{\"layers\": [{\"type\": \"relu\"}]}", "model.input", "missing");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 1}]}", "at least 2 classes");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3}, {\"type\": \"embedding\","
                 " \"vocab\": 5, \"dim\": 2}]}", "(embedding)", "token ids");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"embedding\", \"vocab\": 5, \"dim\": 2},"
                 " {\"type\": \"linear\", \"out\": 3, \"inputs\": [\"input\"]}]}", "(linear)", "token ids");
    EXPECT_ERROR("{\"input\": [9, 4], \"layers\": [{\"type\": \"position_embedding\", \"name\": \"wpe\","
                 " \"max_len\": 8}, {\"type\": \"linear\", \"out\": 3}]}", "model.layers[0] \"wpe\" (position_embedding)",
                 "T = 9 (from the model input) is longer than max_len = 8", "raise max_len");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"position_embedding\", \"max_len\": 8},"
                 " {\"type\": \"linear\", \"out\": 3}]}", "(position_embedding)", "expected [T, C]", "got [4]");
    EXPECT_ERROR("{\"input\": [4, 2], \"layers\": [{\"type\": \"position_embedding\"},"
                 " {\"type\": \"linear\", \"out\": 3}]}", "(position_embedding)", "missing field \"max_len\"");
}
END_TEST

START_TEST(bad_graph_references) {
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 3, \"inputs\": [\"b\"]},"
                 " {\"type\": \"linear\", \"name\": \"b\", \"out\": 3}]}",
                 "model.layers[0] \"a\"", "\"b\" is defined after this layer", "cycle");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 3, \"inputs\": [\"a\"]}]}",
                 "\"a\" is this layer itself");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"fc1\", \"out\": 3},"
                 " {\"type\": \"linear\", \"out\": 3, \"inputs\": [\"fc2\"]}]}",
                 "model.layers[1] \"linear1\"", "no layer named \"fc2\"", "did you mean \"fc1\"");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"fc\", \"out\": 3},"
                 " {\"type\": \"linear\", \"name\": \"fc\", \"out\": 3}]}",
                 "model.layers[1] \"fc\"", "duplicate name", "model.layers[0]");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"inputs\": \"prev\"}]}",
                 "inputs: expected an array");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"inputs\": [7]}]}",
                 "inputs[0]: expected a layer name");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"relu\", \"name\": \"prev\"}]}", "reserved");
    /* a name inside a repeat refers to the same iteration; "h.1" from outside is fine, "h" is ambiguous
       only inside: outside the block, plain "h" does not exist */
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"repeat\", \"times\": 2, \"layers\": ["
                 " {\"type\": \"linear\", \"name\": \"h\", \"out\": 4}]}, {\"type\": \"add\", \"inputs\": [\"h\", \"prev\"]}]}",
                 "no layer named \"h\"");
    /* "block_input" only inside a repeat block, and never as a name (not even inside one, where it
       would be "block_input.0") */
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 4},"
                 " {\"type\": \"add\", \"inputs\": [\"block_input\", \"a\"]}, {\"type\": \"linear\", \"out\": 2}]}",
                 "model.layers[1] \"add1\" (add)", "\"block_input\" is the input of a repeat block's iteration",
                 "not inside a repeat block", "name the layer it means");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"relu\", \"name\": \"block_input\"},"
                 " {\"type\": \"linear\", \"out\": 2}]}", "model.layers[0]", "\"block_input\" is reserved");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"repeat\", \"times\": 2, \"layers\": ["
                 " {\"type\": \"relu\", \"name\": \"block_input\"}]}, {\"type\": \"linear\", \"out\": 2}]}",
                 "model.layers[0].layers[0]", "\"block_input\" is reserved");
    EXPECT_ERROR("{\"input\": [4], \"layers\": [{\"type\": \"repeat\", \"times\": 2, \"layers\": ["
                 " {\"type\": \"relu\"}, {\"type\": \"add\", \"inputs\": [\"prev\", \"block_inptu\"]}]},"
                 " {\"type\": \"linear\", \"out\": 2}]}", "no layer named \"block_inptu\"",
                 "did you mean \"block_input\"");
}
END_TEST

/* Malformed values anywhere: an error, never a crash. */
START_TEST(never_crashes) {
    const char *cases[] = {
        "[]", "{\"input\": 4, \"layers\": [{\"type\": \"relu\"}]}", "{\"input\": [4], \"layers\": {}}",
        "{\"input\": [4], \"layers\": [{\"type\": \"conv2d\", \"out\": 2, \"kernel\": [3]}]}",
        "{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 1e300}]}",
        "{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3, \"init\": 5}]}",
        "{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3}], \"loss\": \"mse\"}",
        "{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"mse\", \"label_smoothing\": 0.1}}",
        "{\"input\": [4], \"layers\": [{\"type\": \"concat\", \"inputs\": [\"input\", \"input\"], \"axis\": 9}]}",
        "{\"input\": [4], \"layers\": [{\"type\": \"repeat\", \"times\": 2}]}",
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        built b;
        build(&b, cases[i], 2);
        ck_assert_msg(b.rc == CT_ERR_CONFIG && b.err.msg[0], "case %d: rc %d", i, b.rc);
        unbuild(&b);
    }
}
END_TEST

/* Random mutations of a valid model: every build either succeeds or fails with a message; a
 * failure is a config error (or out of memory for absurd sizes), never a crash. */
START_TEST(mutations_never_crash) {
    static const char *const values[] = {"-1", "0", "1", "3", "2.5", "\"x\"", "\"prev\"", "[]", "{}", "true",
                                         "null", "[1, 2]", "[0]", "[\"a\", \"prev\"]", "100000"};
    static const char *const keys[] = {"type", "out", "kernel", "stride", "padding", "inputs", "name",
                                       "shape", "axis", "p", "groups", "dilation", "init", "bias"};
    ct_rng r;
    ct_rng_init(&r, 77, CT_RNG_AUGMENT, 0);
    int ok = 0;
    for (int it = 0; it < 400; it++) {
        cJSON *m = cJSON_Parse("{\"input\": [2, 8, 8], \"layers\": [{\"type\": \"conv2d\", \"name\": \"c\", \"out\": 4,"
                              " \"kernel\": 3, \"padding\": 1}, {\"type\": \"batchnorm2d\"}, {\"type\": \"maxpool2d\", \"kernel\": 2},"
                              " {\"type\": \"concat\", \"inputs\": [\"prev\", \"prev\"]}, {\"type\": \"reshape\", \"shape\": [8, -1]},"
                              " {\"type\": \"layernorm\"}, {\"type\": \"flatten\", \"name\": \"f\"}, {\"type\": \"dropout\", \"p\": 0.1},"
                              " {\"type\": \"linear\", \"out\": 5}]}");
        cJSON *layers = cJSON_GetObjectItem(m, "layers");
        for (int k = 0; k < 1 + (int)ct_rng_below(&r, 3); k++) {
            cJSON *l = cJSON_GetArrayItem(layers, (int)ct_rng_below(&r, 9));
            const char *key = keys[ct_rng_below(&r, CT_ARRAY_LEN(keys))];
            cJSON_DeleteItemFromObject(l, key);
            if (ct_rng_below(&r, 4)) cJSON_AddItemToObject(l, key, cJSON_Parse(values[ct_rng_below(&r, CT_ARRAY_LEN(values))]));
        }
        ct_config cfg = {0};
        cfg.model = m;
        ct_graph *g = NULL;
        ct_err err = {0};
        int rc = ct_graph_build(&cfg, 2, CT_F32, &g, &err);
        char *txt = cJSON_PrintUnformatted(m);
        ck_assert_msg(rc == CT_OK || ((rc == CT_ERR_CONFIG || rc == CT_ERR_RUNTIME) && err.msg[0] && !g),
                      "rc %d for %s", rc, txt);
        if (rc == CT_ERR_CONFIG) ck_assert_msg(strstr(err.msg, "model"), "%s", err.msg);
        ok += rc == CT_OK;
        free(txt);
        ct_graph_free(g);
        cJSON_Delete(m);
    }
    ck_assert_msg(ok > 10 && ok < 390, "%d of 400 mutated models built", ok);
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_errors");
    TCase *tc = tcase_create("graph_errors");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bad_layer_types_and_fields);
    tcase_add_test(tc, bad_shapes_and_dims);
    tcase_add_test(tc, bad_graph_references);
    tcase_add_test(tc, never_crashes);
    tcase_add_test(tc, mutations_never_crash);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* test_config.c: ct_config_load(): batch rule, overrides, "auto", typos, syntax, errors, defaults. */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config/config.h"
#include "core/util/json.h"

static char tmpdir[256];

/* Write `text` to tmpdir/name and return the path (static buffer per call site is fine here). */
static const char *write_file(const char *name, const char *text) {
    static char path[8][512];
    static int slot;
    char *p = path[slot++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return p;
}

typedef struct loaded {
    ct_config *cfg;
    ct_warnings warn;
    ct_err err;
    int rc;
} loaded;

static loaded load_opts(const char *text, int world, const char *const *ovs, int n, bool gpu, bool bf16) {
    loaded l = {0};
    ct_config_opts o = {.path = write_file("a.json", text), .overrides = ovs, .n_overrides = n,
                        .world_size = world, .has_gpu = gpu, .gpu_supports_bf16 = bf16};
    l.rc = ct_config_load(&o, &l.cfg, &l.warn, &l.err);
    return l;
}

static loaded load(const char *text, int world) { return load_opts(text, world, NULL, 0, false, false); }

static void unload(loaded *l) {
    ct_config_free(l->cfg);
    ct_warnings_free(&l->warn);
}

static bool has_warning(const loaded *l, const char *needle) {
    for (int i = 0; i < l->warn.n; i++)
        if (strstr(l->warn.items[i], needle)) return true;
    return false;
}

#define assert_ok(l) ck_assert_msg((l).rc == CT_OK, "load failed: %s", (l).err.msg)
#define assert_err_has(l, s)                                                                  \
    do {                                                                                      \
        ck_assert_msg((l).rc == CT_ERR_CONFIG, "expected a config error, got rc %d", (l).rc); \
        ck_assert_msg(strstr((l).err.msg, (s)) != NULL, "message lacks \"%s\": %s", (s), (l).err.msg); \
    } while (0)
#define assert_warn_has(l, s) ck_assert_msg(has_warning(&(l), (s)), "no warning containing \"%s\"", (s))

/* ---------------------------------------------------------------------------------------------- */
/* Batch rule                                                                                      */

static loaded load_batch(long tb, long mb, long ga, int w) {
    char text[256] = "{";
    if (tb) snprintf(text + strlen(text), 60, "\"train_batch_size\": %ld,", tb);
    if (mb) snprintf(text + strlen(text), 60, "\"train_micro_batch_size_per_gpu\": %ld,", mb);
    if (ga) snprintf(text + strlen(text), 60, "\"gradient_accumulation_steps\": %ld,", ga);
    snprintf(text + strlen(text), 60, "\"steps_per_print\": 10}");
    return load(text, w);
}

static void expect_triple(loaded *l, long tb, long mb, long ga) {
    assert_ok(*l);
    ck_assert_int_eq(l->cfg->train_batch_size, tb);
    ck_assert_int_eq(l->cfg->micro_batch, mb);
    ck_assert_int_eq(l->cfg->grad_accum, ga);
}

START_TEST(batch_derivations) {
    srand(7);
    for (int it = 0; it < 20; it++) {
        long m = 1 + rand() % 16, g = 1 + rand() % 8, w = 1 + rand() % 8, tb = m * g * w;
        loaded l = load_batch(tb, m, g, (int)w); /* all three */
        expect_triple(&l, tb, m, g);
        ck_assert_int_eq(l.cfg->train_batch_src, CT_SRC_FILE);
        unload(&l);
        l = load_batch(tb, m, 0, (int)w); /* GAS = tb // m // w */
        expect_triple(&l, tb, m, g);
        ck_assert_int_eq(l.cfg->grad_accum_src, CT_SRC_DERIVED);
        unload(&l);
        l = load_batch(tb, 0, g, (int)w); /* micro = tb // w // g */
        expect_triple(&l, tb, m, g);
        ck_assert_int_eq(l.cfg->micro_batch_src, CT_SRC_DERIVED);
        unload(&l);
        l = load_batch(0, m, g, (int)w); /* tb = m g w */
        expect_triple(&l, tb, m, g);
        ck_assert_int_eq(l.cfg->train_batch_src, CT_SRC_DERIVED);
        unload(&l);
        l = load_batch(m * w, 0, 0, (int)w); /* tb only: GAS 1, micro tb // w */
        expect_triple(&l, m * w, m, 1);
        unload(&l);
        l = load_batch(0, m, 0, (int)w); /* micro only: GAS 1, tb = micro w */
        expect_triple(&l, m * w, m, 1);
        ck_assert_int_eq(l.cfg->grad_accum_src, CT_SRC_DEFAULT);
        unload(&l);
    }
    /* floor division, as DeepSpeed: tb 100, micro 7, W 2 -> GAS (100 // 7) // 2 = 7 -> 98 != 100 */
    loaded l = load_batch(100, 7, 0, 2);
    assert_err_has(l, "100 != micro 7 × accumulation 7 × world 2 = 98");
    unload(&l);
}
END_TEST

START_TEST(batch_errors) {
    loaded l = load_batch(0, 0, 4, 1); /* GAS only */
    assert_err_has(l, "train_batch_size");
    assert_err_has(l, "train_micro_batch_size_per_gpu");
    unload(&l);
    l = load("{\"steps_per_print\": 1}", 1); /* none */
    assert_err_has(l, "train_batch_size: missing");
    unload(&l);
    l = load_batch(4, 0, 1, 8); /* micro 4 // 8 = 0 */
    assert_err_has(l, "train_micro_batch_size_per_gpu: derived (train_batch_size 4 // world 8) // accumulation 1 = 0");
    assert_err_has(l, "train_batch_size was set in the file (1:2)");
    assert_err_has(l, "onsistent choice");
    assert_err_has(l, "micro 1 and accumulation 1 with train_batch_size 8, or keep train_batch_size 4 and run on 4 ranks");
    unload(&l);
    l = load_batch(4, 2, 0, 8); /* GAS 0 */
    assert_err_has(l, "gradient_accumulation_steps: derived (train_batch_size 4 // micro 2) // world 8 = 0");
    unload(&l);
    l = load_batch(4, 0, 1, 3); /* product check */
    assert_err_has(l, "4 != micro 1 × accumulation 1 × world 3 = 3");
    unload(&l);
    l = load("{\"train_batch_size\": -8, \"train_micro_batch_size_per_gpu\": 2}", 1);
    assert_err_has(l, "train_batch_size: got -8");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": -2, \"gradient_accumulation_steps\": 1}", 1);
    assert_err_has(l, "train_micro_batch_size_per_gpu: got -2");
    unload(&l);
    l = load("{\"train_batch_size\": \"8\"}", 1);
    assert_err_has(l, "train_batch_size: expected a positive integer or \"auto\", got \"8\"");
    unload(&l);
    l = load("{\"train_micro_batch_size_per_gpu\": 900000000000, \"gradient_accumulation_steps\": 900000000000}", 64);
    assert_err_has(l, "more than ctrain supports");
    unload(&l);
    l = load("{\"train_batch_size\": 5.5}", 1);
    assert_err_has(l, "got 5.5");
    unload(&l);
    /* the UX example: sources from the file and from --set, and consistent alternatives */
    const char *ovs[] = {"gradient_accumulation_steps=4"};
    l = load_opts("{\"train_batch_size\": 100,\n \"train_micro_batch_size_per_gpu\": 12}", 2, ovs, 1, false, false);
    assert_err_has(l, "train_batch_size: 100 != micro 12 × accumulation 4 × world 2 = 96");
    assert_err_has(l, "train_batch_size was set in the file (1:2)");
    assert_err_has(l, "train_micro_batch_size_per_gpu was set in the file (2:2)");
    assert_err_has(l, "gradient_accumulation_steps was set with --set gradient_accumulation_steps");
    assert_err_has(l, "micro 12 and accumulation 4 with train_batch_size 96, or micro 10 and accumulation 5 with 100");
    unload(&l);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* Overrides                                                                                       */

START_TEST(override_forms) {
    const char *ovs[] = {"train.early_stopping.patience=7", "optimizer.params.lr=3e-4", "train.device=cpu",
                         "train.run_dir=\"out/x\"", "optimizer.params.betas=[0.8, 0.95]",
                         "zero_optimization.stage=2", "train.seed=1234"};
    loaded l = load_opts("{\"train_batch_size\": 16, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1}}}",
                         1, ovs, CT_ARRAY_LEN(ovs), false, false);
    assert_ok(l);
    ck_assert(l.cfg->train.early_stopping.enabled); /* created train and train.early_stopping */
    ck_assert_int_eq(l.cfg->train.early_stopping.patience, 7);
    ck_assert(fabs(l.cfg->optimizer.lr - 3e-4) < 1e-15); /* JSON number replaced the file's 1 */
    ck_assert_str_eq(l.cfg->train.device, "cpu");         /* not JSON: taken as a string */
    ck_assert_str_eq(l.cfg->train.run_dir, "out/x");
    ck_assert_str_eq(l.cfg->train.save_dir, "out/x/checkpoints");
    ck_assert(fabs(l.cfg->optimizer.beta1 - 0.8) < 1e-12 && fabs(l.cfg->optimizer.beta2 - 0.95) < 1e-12);
    ck_assert_int_eq(l.cfg->zero.stage, 2);
    ck_assert_uint_eq(l.cfg->train.seed, 1234);
    const cJSON *lr = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(l.cfg->resolved, "optimizer"), "params"), "lr");
    ck_assert(lr && fabs(lr->valuedouble - 3e-4) < 1e-15);
    unload(&l);
}
END_TEST

/* Replacing a member in the middle, first or last place keeps every other member (cJSON 1.7.15's
 * cJSON_InsertItemInArray drops a middle insert; the override code must not rely on it). */
START_TEST(override_replaces_in_place) {
    const char *text = "{\"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 2, "
                       "\"optimizer\": {\"type\": \"AdamW\"}}";
    const char *mid[] = {"gradient_accumulation_steps=4"};
    const char *first[] = {"train_micro_batch_size_per_gpu=3"};
    const char *last[] = {"optimizer={\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}"};
    loaded l = load_opts(text, 1, mid, 1, false, false);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->grad_accum, 4);
    ck_assert_int_eq(l.cfg->micro_batch, 8);
    ck_assert_int_eq(l.cfg->train_batch_size, 32);
    ck_assert_int_eq(l.cfg->optimizer.type, CT_OPT_ADAMW);
    unload(&l);
    l = load_opts(text, 1, first, 1, false, false);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->micro_batch, 3);
    ck_assert_int_eq(l.cfg->grad_accum, 2);
    unload(&l);
    l = load_opts(text, 1, last, 1, false, false);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->optimizer.type, CT_OPT_SGD);
    ck_assert_int_eq(l.cfg->train_batch_size, 16);
    unload(&l);
}
END_TEST

START_TEST(override_errors) {
    const char *through[] = {"train_batch_size.x=1"};
    loaded l = load_opts("{\"train_batch_size\": 16}", 1, through, 1, false, false);
    assert_err_has(l, "--set train_batch_size.x: train_batch_size is 16");
    assert_err_has(l, "not an object");
    unload(&l);
    const char *bad_value[] = {"train.epochs=abc"};
    l = load_opts("{\"train_batch_size\": 16}", 1, bad_value, 1, false, false);
    assert_err_has(l, "a.json: --set train.epochs: expected an integer >= 0, got \"abc\"");
    unload(&l);
    const char *nested[] = {"zero_optimization={\"stage\": 7}", "train.epohcs=3"};
    l = load_opts("{\"train_batch_size\": 16}", 1, nested, 1, false, false);
    assert_err_has(l, "a.json: --set zero_optimization: zero_optimization.stage: expected an integer 0..3, got 7");
    unload(&l);
    l = load_opts("{\"train_batch_size\": 16}", 1, nested + 1, 1, false, false);
    assert_err_has(l, "a.json: --set train.epohcs: unknown key; did you mean train.epochs?");
    unload(&l);
    const char *no_eq[] = {"train.epochs"};
    l = load_opts("{\"train_batch_size\": 16}", 1, no_eq, 1, false, false);
    assert_err_has(l, "expected KEY=VALUE");
    unload(&l);
    const char *empty[] = {"train..epochs=3"};
    l = load_opts("{\"train_batch_size\": 16}", 1, empty, 1, false, false);
    assert_err_has(l, "empty component");
    unload(&l);
    /* array index into model.layers */
    const char *idx[] = {"model.layers.1.out=77"};
    l = load_opts("{\"train_batch_size\": 16, \"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}, "
                  "{\"type\": \"linear\", \"out\": 3}]}}", 1, idx, 1, false, false);
    assert_ok(l);
    const cJSON *out = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(l.cfg->model, "layers"), 1), "out");
    ck_assert_int_eq(out->valueint, 77);
    char where[256];
    ct_config_where(l.cfg, out, where, sizeof where);
    ck_assert_msg(strstr(where, "--set model.layers.1.out"), "where: %s", where);
    unload(&l);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* "auto"                                                                                          */

static const char *auto_text =
    "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\",\n"
    " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\",\n"
    " \"fp16\": {\"enabled\": \"auto\"}, \"bf16\": {\"enabled\": \"auto\"},\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\", \"eps\": \"auto\",\n"
    "   \"weight_decay\": \"auto\"}},\n"
    " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\", \"warmup_max_lr\": "
    "\"auto\", \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}},\n"
    " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": "
    "\"auto\", \"stage3_param_persistence_threshold\": \"auto\", \"stage3_gather_16bit_weights_on_model_save\": "
    "\"auto\"}}";

START_TEST(auto_resolution) {
    loaded l = load(auto_text, 4);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->micro_batch, CT_CONFIG_DEFAULT_MICRO_BATCH);
    ck_assert_int_eq(l.cfg->micro_batch_src, CT_SRC_AUTO);
    ck_assert_int_eq(l.cfg->grad_accum, 1);
    ck_assert_int_eq(l.cfg->train_batch_size, 4 * CT_CONFIG_DEFAULT_MICRO_BATCH);
    ck_assert(l.cfg->gradient_clipping == 1.0);
    ck_assert(!l.cfg->fp16.enabled && !l.cfg->bf16); /* CPU: fp32 */
    ck_assert(l.cfg->optimizer.lr == 1e-3 && l.cfg->optimizer.beta1 == 0.9 && l.cfg->optimizer.beta2 == 0.999);
    ck_assert(l.cfg->optimizer.eps == 1e-8 && l.cfg->optimizer.weight_decay == 0);
    ck_assert(l.cfg->scheduler.warmup_min_lr == 0 && l.cfg->scheduler.warmup_max_lr == l.cfg->optimizer.lr);
    ck_assert_int_eq(l.cfg->scheduler.warmup_num_steps, 0);
    ck_assert_int_eq(l.cfg->scheduler.total_num_steps, -1);
    ck_assert(l.cfg->zero.reduce_bucket_size == 5e8 && l.cfg->zero.prefetch_bucket_size == 5e7);
    ck_assert(l.cfg->zero.param_persistence_threshold == 1e5 && !l.cfg->zero.gather_16bit_weights_on_model_save);
    ck_assert(l.cfg->zero.overlap_comm); /* stage 3 default */
    /* the resolved JSON shows what each became */
    const cJSON *r = l.cfg->resolved;
    ck_assert_int_eq(cJSON_GetObjectItem(r, "train_micro_batch_size_per_gpu")->valueint, CT_CONFIG_DEFAULT_MICRO_BATCH);
    ck_assert(cJSON_GetObjectItem(r, "gradient_clipping")->valuedouble == 1.0);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "fp16"), "enabled")));
    const cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "scheduler"), "params");
    ck_assert(cJSON_GetObjectItem(sp, "warmup_max_lr")->valuedouble == 1e-3);
    ck_assert(cJSON_GetObjectItem(sp, "total_num_steps")->valuedouble == -1);
    const char *const numeric[][3] = {{"train_batch_size", NULL, NULL}, {"optimizer", "params", "lr"},
                                      {"optimizer", "params", "eps"}, {"zero_optimization", "reduce_bucket_size", NULL},
                                      {"zero_optimization", "prefetch_bucket_size", NULL},
                                      {"scheduler", "params", "warmup_num_steps"}};
    for (int i = 0; i < CT_ARRAY_LEN(numeric); i++) {
        const cJSON *v = r;
        for (int k = 0; k < 3 && numeric[i][k]; k++) v = cJSON_GetObjectItem(v, numeric[i][k]);
        ck_assert_msg(cJSON_IsNumber(v), "resolved %s.%s is not a number", numeric[i][0], numeric[i][1]);
    }
    char *json = ct_config_to_json(l.cfg);
    ck_assert_ptr_nonnull(strstr(json, "\"gather_16bit_weights_on_model_save\":\tfalse"));
    free(json);
    unload(&l);
    /* precision "auto" by device */
    l = load_opts(auto_text, 1, NULL, 0, true, false);
    assert_ok(l);
    ck_assert(l.cfg->fp16.enabled && !l.cfg->bf16);
    unload(&l);
    l = load_opts(auto_text, 1, NULL, 0, true, true);
    assert_ok(l);
    ck_assert(!l.cfg->fp16.enabled && l.cfg->bf16);
    unload(&l);
    /* one section "auto": still the device's best, but never a section explicitly disabled */
    l = load_opts("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": \"auto\"}}", 1, NULL, 0, true, true);
    assert_ok(l);
    ck_assert(!l.cfg->fp16.enabled && l.cfg->bf16);
    unload(&l);
    l = load_opts("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": \"auto\"}}", 1,
                  NULL, 0, true, false);
    assert_ok(l);
    ck_assert(!l.cfg->fp16.enabled && !l.cfg->bf16);
    unload(&l);
    l = load_opts("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": \"auto\"}}", 1,
                  NULL, 0, true, true);
    assert_ok(l);
    ck_assert(l.cfg->fp16.enabled && !l.cfg->bf16);
    unload(&l);
    /* GAS given, batch auto: micro default, tb derived */
    l = load("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\", "
             "\"gradient_accumulation_steps\": 3}", 2);
    expect_triple(&l, CT_CONFIG_DEFAULT_MICRO_BATCH * 3 * 2, CT_CONFIG_DEFAULT_MICRO_BATCH, 3);
    unload(&l);
    /* micro given, the others auto: derived as DeepSpeed would */
    l = load("{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": 5, "
             "\"gradient_accumulation_steps\": \"auto\"}", 3);
    expect_triple(&l, 15, 5, 1);
    unload(&l);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* Unknown keys, syntax                                                                            */

START_TEST(typo_suggestions) {
    loaded l = load("{\"train_batch_size\": 8, \"gradient_clipp1ng\": 1.0}", 1);
    assert_ok(l); /* top level: a warning */
    assert_warn_has(l, "gradient_clipp1ng: unknown key (ignored); did you mean gradient_clipping?");
    assert_warn_has(l, "a.json:1:25:");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"loss_scale_windw\": 10}}", 1);
    assert_ok(l);
    assert_warn_has(l, "fp16.loss_scale_windw: unknown key (ignored); did you mean fp16.loss_scale_window?");
    unload(&l);
    l = load("{\"train_batch_size\": 8,\n \"zero_optimization\": {\"stage\": 3, \"stage3_max_live_paramters\": 1e9}}", 1);
    assert_err_has(l, "a.json:2:36: zero_optimization.stage3_max_live_paramters: unknown key; did you mean "
                      "zero_optimization.stage3_max_live_parameters?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", "
             "\"pin_memroy\": true}}}", 1);
    assert_err_has(l, "zero_optimization.offload_optimizer.pin_memroy: unknown key; did you mean "
                      "zero_optimization.offload_optimizer.pin_memory?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"train\": {\"epoch\": 3}}", 1);
    assert_err_has(l, "train.epoch: unknown key; did you mean train.epochs?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"tensorboard\": {\"enable\": true}}", 1);
    assert_err_has(l, "tensorboard.enable: unknown key; did you mean tensorboard.enabled?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"model\": {\"layer\": []}}", 1);
    assert_err_has(l, "model.layer: unknown key; did you mean model.layers?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"data\": {\"train\": {\"format\": \"idx\", \"image\": \"x\"}}}", 1);
    assert_err_has(l, "data.train.image: unknown key; did you mean data.train.images?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"data\": {\"train\": {\"format\": \"idk\"}}}", 1);
    assert_err_has(l, "data.train.format: expected one of idx, image_folder, shard, tokens, csv, got \"idk\"; did you "
                      "mean idx?");
    unload(&l);
}
END_TEST

START_TEST(unused_keys_listed_once) {
    loaded l = load("{\"train_batch_size\": 8, \"comms_logger\": {\"enabled\": false}, \"sparse_attention\": "
                    "{\"mode\": \"fixed\"}, \"aio\": {\"block_size\": 1048576}, \"zero_optimization\": "
                    "{\"round_robin_gradients\": true}}", 1);
    assert_ok(l);
    int n = 0;
    for (int i = 0; i < l.warn.n; i++)
        if (strstr(l.warn.items[i], "keys read but not used by ctrain: ")) {
            n++;
            ck_assert(strstr(l.warn.items[i], "comms_logger") && strstr(l.warn.items[i], "sparse_attention") &&
                      strstr(l.warn.items[i], "aio") &&
                      strstr(l.warn.items[i], "zero_optimization.round_robin_gradients"));
        }
    ck_assert_int_eq(n, 1);
    unload(&l);
}
END_TEST

START_TEST(hjson_forms_warn) {
    loaded l = load("{\n  // comment\n  \"train_batch_size\": 8, # another\n  \"steps_per_print\": 5\n"
                    "  \"wall_clock_breakdown\": false,\n}\n", 1);
    assert_ok(l);
    assert_warn_has(l, "a.json:5:32: trailing comma");
    assert_warn_has(l, "a.json:2:3: comment");
    assert_warn_has(l, "a.json:4:23: missing comma");
    ck_assert_int_eq(l.cfg->steps_per_print, 5);
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"enabled\": false}}", 1);
    assert_err_has(l, "duplicate key");
    assert_err_has(l, "enabled");
    unload(&l);
    l = load("{\"train_batch_size\": GBSIZE}", 1);
    assert_err_has(l, "GBSIZE");
    assert_err_has(l, "1:22");
    unload(&l);
    l = load("[1, 2]", 1);
    assert_err_has(l, "expected a JSON object at the top level");
    unload(&l);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* Errors on values                                                                                */

START_TEST(value_errors) {
    loaded l = load("{\"train_batch_size\": 8,\n \"zero_optimization\": {\n   \"stage\": 4}}", 1);
    assert_err_has(l, "a.json:3:4: zero_optimization.stage: expected an integer 0..3, got 4");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", 1);
    assert_err_has(l, "fp16.enabled and bf16.enabled are both true");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bfloat16\": {\"enabled\": true}}", 1);
    assert_err_has(l, "bfloat16.enabled");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1}}}", 1);
    assert_err_has(l, "optimizer.type: \"OneBitAdam\" is a DeepSpeed optimizer not supported by ctrain; supported: "
                      "Adam, AdamW, SGD, Lamb");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adma\"}}", 1);
    assert_err_has(l, "did you mean Adam?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"max_grad_norm\": 1.0}}}", 1);
    assert_err_has(l, "optimizer.params.max_grad_norm: not supported as an optimizer parameter");
    assert_err_has(l, "gradient_clipping");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
             "\"nvme\", \"nvme_path\": \"/x\"}}}", 1);
    assert_err_has(l, "zero_optimization.offload_param.device: NVMe offload is not implemented");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_param\": false}}", 1);
    assert_err_has(l, "zero_optimization.offload_param: expected an object");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"cpu_offload\": true, \"offload_optimizer\": "
             "{\"device\": \"cpu\"}}}", 1);
    assert_err_has(l, "zero_optimization.cpu_offload: deprecated, and cannot be given together");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"max_live_parameters\": 1, "
             "\"stage3_max_live_parameters\": 2}}", 1);
    assert_err_has(l, "given twice");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1500.5}}", 1);
    assert_err_has(l, "zero_optimization.reduce_bucket_size: expected an integer >= 0, got 1500.5");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": "
             "\"cpu\", \"ratio\": 0.3}}}", 1);
    assert_err_has(l, "partial offloading (ratio < 1) needs ZeRO stage 3");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": \"yes\"}}", 1); /* plain section: not lax */
    assert_err_has(l, "fp16.enabled: expected true or false, got \"yes\"");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {}}}", 1);
    assert_err_has(l, "scheduler.params.total_num_steps: required by WarmupDecayLR");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"warmuplr\"}}", 1);
    assert_err_has(l, "did you mean WarmupLR?");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0.1}}}", 1);
    assert_err_has(l, "scheduler.params.cycle_max_lr: required by OneCycle");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"train\": {\"device\": \"gpu\"}}", 1);
    assert_err_has(l, "train.device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got \"gpu\"");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"model\": {\"layers\": {\"type\": \"linear\"}}}", 1);
    assert_err_has(l, "model.layers: expected an array of layer objects");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"model\": {\"layers\": [{\"type\": \"relu\"}, 3]}}", 1);
    assert_err_has(l, "model.layers[1]: expected a layer object");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": "
             "\"seqlen\", \"min_difficulty\": 8, \"schedule_type\": \"fixed_linear\", \"schedule_config\": {}}}", 1);
    assert_err_has(l, "curriculum_learning.max_difficulty: required when curriculum learning is enabled");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": "
             "\"seqlen\", \"min_difficulty\": 8, \"max_difficulty\": 64, \"schedule_type\": \"fixed_root\", "
             "\"schedule_config\": {\"total_curriculum_step\": 10, \"difficulty_step\": 8}}}", 1);
    assert_err_has(l, "curriculum_learning.schedule_config.root_degree: required by schedule_type fixed_root");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"progressive_layer_drop\": {\"theta\": 0.5}}", 1);
    assert_err_has(l, "progressive_layer_drop.enabled: required");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"amp\": {\"enabled\": true, \"opt_level\": \"O1\"}}", 1);
    assert_err_has(l, "amp.enabled: NVIDIA Apex AMP is not implemented");
    unload(&l);
}
END_TEST

START_TEST(pydantic_coercion) {
    loaded l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": \"2\", \"reduce_bucket_size\": "
                    "\"500\", \"allgather_bucket_size\": 5e8, \"overlap_comm\": \"yes\", \"contiguous_gradients\": 0}, "
                    "\"fp16\": {\"enabled\": 1}}", 1);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->zero.stage, 2);
    ck_assert(l.cfg->zero.reduce_bucket_size == 500 && l.cfg->zero.allgather_bucket_size == 5e8);
    ck_assert(l.cfg->zero.overlap_comm && !l.cfg->zero.contiguous_gradients);
    ck_assert(l.cfg->fp16.enabled);
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"reduce_bucket_size\": \"5e8\"}}", 1);
    assert_err_has(l, "zero_optimization.reduce_bucket_size: expected an integer");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"overlap_comm\": 2}}", 1);
    assert_err_has(l, "zero_optimization.overlap_comm: expected true or false, got 2");
    unload(&l);
    /* deprecated forms move to their replacements */
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}, "
             "\"bfloat16\": {\"enabled\": true}}", 1);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->zero.offload_optimizer.device, CT_OFFLOAD_CPU);
    ck_assert(l.cfg->bf16);
    assert_warn_has(l, "zero_optimization.cpu_offload: deprecated");
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"max_live_parameters\": 0, "
             "\"stage3_max_reuse_distance\": 7}}", 1);
    assert_ok(l);
    ck_assert(l.cfg->zero.max_live_parameters == 0 && l.cfg->zero.max_reuse_distance == 7);
    unload(&l);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* Defaults, sections from files, helpers                                                          */

START_TEST(defaults_in_resolved) {
    loaded l = load("{\"train_batch_size\": 8}", 1);
    assert_ok(l);
    const ct_config *c = l.cfg;
    ck_assert(!c->fp16.enabled && c->fp16.initial_scale_power == 16 && c->fp16.loss_scale_window == 1000 &&
              c->fp16.hysteresis == 2 && !c->fp16.consecutive_hysteresis && c->fp16.min_loss_scale == 1 &&
              c->fp16.loss_scale == 0);
    ck_assert(c->optimizer.type == CT_OPT_ADAM && c->optimizer.adam_w_mode && c->optimizer.lr == 1e-3);
    ck_assert(c->scheduler.type == CT_SCHED_NONE && c->gradient_clipping == 0 && c->steps_per_print == 0);
    ck_assert(c->zero.stage == 0 && c->zero.reduce_bucket_size == 5e8 && !c->zero.overlap_comm &&
              c->zero.contiguous_gradients && c->zero.sub_group_size == 1e9);
    ck_assert(c->train.epochs == 5 && c->train.seed == 42 && c->train.keep_last == 3 && c->train.max_steps == 0);
    ck_assert_str_eq(c->train.device, "auto");
    ck_assert_str_eq(c->train.run_dir, "runs/a");
    ck_assert_str_eq(c->train.save_dir, "runs/a/checkpoints");
    ck_assert_ptr_null(c->model);
    ck_assert_ptr_null(c->data);
    assert_warn_has(l, "no \"optimizer\" section");
    const cJSON *fp16 = cJSON_GetObjectItem(c->resolved, "fp16");
    ck_assert_int_eq(cJSON_GetObjectItem(fp16, "initial_scale_power")->valueint, 16);
    ck_assert_int_eq(cJSON_GetObjectItem(fp16, "hysteresis")->valueint, 2);
    const cJSON *train = cJSON_GetObjectItem(c->resolved, "train");
    ck_assert_str_eq(cJSON_GetObjectItem(train, "run_dir")->valuestring, "runs/a");
    ck_assert(cJSON_GetObjectItem(cJSON_GetObjectItem(c->resolved, "zero_optimization"), "offload_optimizer"));
    unload(&l);
    /* Adam with adam_w_mode false is classic L2 Adam; AdamW is always decoupled */
    l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"adam\", \"params\": {\"adam_w_mode\": false}}}", 1);
    assert_ok(l);
    ck_assert(l.cfg->optimizer.type == CT_OPT_ADAM && !l.cfg->optimizer.adam_w_mode);
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"ADAMW\", \"params\": {\"adam_w_mode\": false}}}", 1);
    assert_ok(l);
    ck_assert(l.cfg->optimizer.type == CT_OPT_ADAMW && l.cfg->optimizer.adam_w_mode);
    unload(&l);
    l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"momentum\": 0.9, "
             "\"nesterov\": true}}, \"train\": {\"early_stopping\": {\"metric\": \"eval_accuracy\"}}}", 1);
    assert_ok(l);
    ck_assert(l.cfg->optimizer.type == CT_OPT_SGD && l.cfg->optimizer.lr == 1e-2 && l.cfg->optimizer.nesterov);
    ck_assert(l.cfg->train.early_stopping.enabled && l.cfg->train.early_stopping.mode_max);
    unload(&l);
}
END_TEST

START_TEST(sections_from_files) {
    write_file("m.json", "{\n  \"input\": [4],\n  \"layers\": [{\"type\": \"linear\", \"out\": 2}]\n}\n");
    write_file("full.json", "{\"train_batch_size\": 4, \"data\": {\"train\": {\"format\": \"csv\", \"path\": "
                            "\"t.csv\", \"label_column\": \"y\"}}}");
    loaded l = load("{\"train_batch_size\": 8, \"model\": \"m.json\"}", 1);
    assert_ok(l);
    ck_assert_ptr_nonnull(l.cfg->model);
    const cJSON *layers = cJSON_GetObjectItem(l.cfg->model, "layers");
    ck_assert_int_eq(cJSON_GetArraySize(layers), 1);
    char where[512];
    ct_config_where(l.cfg, layers, where, sizeof where);
    ck_assert_msg(strstr(where, "m.json:3:3"), "where: %s", where);
    char p[512];
    ct_config_resolve_path(l.cfg, "t.csv", p, sizeof p);
    ck_assert_str_eq(p, write_file("t.csv", ""));
    ct_config_resolve_path(l.cfg, "/abs/x", p, sizeof p);
    ck_assert_str_eq(p, "/abs/x");
    unload(&l);
    /* --data from a full config file takes its "data" member */
    char data_path[512];
    snprintf(data_path, sizeof data_path, "%s/full.json", tmpdir);
    ct_config_opts o = {.path = write_file("b.json", "{\"train_batch_size\": 8, \"data\": {\"workers\": 1}}"),
                        .data_path = data_path, .world_size = 1};
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err e = {0};
    ck_assert_int_eq(ct_config_load(&o, &cfg, &w, &e), CT_OK);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cfg->data, "train"), "format")->valuestring, "csv");
    ck_assert_ptr_null(cJSON_GetObjectItem(cfg->data, "workers")); /* replaced, not merged */
    ct_config_free(cfg);
    ct_warnings_free(&w);
    /* --set model=FILE takes the section from that file too */
    const char *ov[] = {"model=m.json"};
    l = load_opts("{\"train_batch_size\": 8}", 1, ov, 1, false, false);
    assert_ok(l);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(l.cfg->model, "layers")), 1);
    unload(&l);
    /* a missing model file names the file and the key */
    l = load("{\"train_batch_size\": 8, \"model\": \"nope.json\"}", 1);
    assert_err_has(l, "nope.json");
    unload(&l);
    /* errors inside a spliced section point into that file */
    write_file("bad.json", "{\n  \"input\": [4],\n  \"layrs\": []\n}\n");
    l = load("{\"train_batch_size\": 8, \"model\": \"bad.json\"}", 1);
    assert_err_has(l, "bad.json:3:3: model.layrs: unknown key; did you mean model.layers?");
    unload(&l);
}
END_TEST

START_TEST(config_check_summary) {
    const char *path = write_file("c.json", "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 2, "
                                            "\"fp16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}}");
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    ct_warnings w = {0};
    ct_err e = {0};
    ck_assert_int_eq(ct_config_check(path, 4, f, &w, &e), CT_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "64 = micro 8 × accumulation 2 × world 4"), "%s", buf);
    ck_assert_msg(strstr(buf, "micro: derived"), "%s", buf);
    ck_assert_msg(strstr(buf, "fp16, dynamic loss scale 2^16"), "%s", buf);
    ck_assert_msg(strstr(buf, "stage 2"), "%s", buf);
    ct_warnings_free(&w);
    ck_assert_int_eq(ct_config_check(path, 128, stdout, &w, &e), CT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "train_micro_batch_size_per_gpu"), "%s", e.msg);
    ct_warnings_free(&w);
}
END_TEST

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_config_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    Suite *su = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, batch_derivations);
    tcase_add_test(tc, batch_errors);
    tcase_add_test(tc, override_forms);
    tcase_add_test(tc, override_replaces_in_place);
    tcase_add_test(tc, override_errors);
    tcase_add_test(tc, auto_resolution);
    tcase_add_test(tc, typo_suggestions);
    tcase_add_test(tc, unused_keys_listed_once);
    tcase_add_test(tc, hjson_forms_warn);
    tcase_add_test(tc, value_errors);
    tcase_add_test(tc, pydantic_coercion);
    tcase_add_test(tc, defaults_in_resolved);
    tcase_add_test(tc, sections_from_files);
    tcase_add_test(tc, config_check_summary);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

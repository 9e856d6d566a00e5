/* test_config.c: ct_config_load(): batch rule, overrides, "auto", typos, syntax, defaults; every refused
 * config as a row of one table (err_cases); the accepted-but-not-yet-implemented settings (not_yet_cases). */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/dataset.h"
#include "core/util/fs.h"
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
    o.formats = ct_dataset_formats(&o.n_formats);
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

/* A number in a dotted path indexes an array; positions name the override. */
START_TEST(override_array_index) {
    const char *idx[] = {"model.layers.1.out=77"};
    loaded l = load_opts("{\"train_batch_size\": 16, \"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}, "
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

/* KEY=VALUE splits at the first '=': the value may hold more (paths, expressions). */
START_TEST(override_value_keeps_equals) {
    const char *ovs[] = {"data.train.path=a=b.bin", "train.run_dir=runs/lr=3e-4", "optimizer.params.lr==1"};
    loaded l = load_opts("{\"train_batch_size\": 16, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}, "
                         "\"data\": {\"train\": {\"format\": \"csv\", \"path\": \"x.csv\"}}}",
                         1, ovs, 2, false, false);
    assert_ok(l);
    const cJSON *path = cJSON_GetObjectItem(cJSON_GetObjectItem(l.cfg->data, "train"), "path");
    ck_assert_msg(cJSON_IsString(path) && strcmp(path->valuestring, "a=b.bin") == 0, "data.train.path: %s",
                  cJSON_IsString(path) ? path->valuestring : "(not a string)");
    ck_assert_ptr_null(cJSON_GetObjectItem(cJSON_GetObjectItem(l.cfg->data, "train"), "path=a"));
    ck_assert_str_eq(l.cfg->train.run_dir, "runs/lr=3e-4");
    unload(&l);
    /* "==1" is the value "=1", a string where lr needs a number: refused, naming lr */
    l = load_opts("{\"train_batch_size\": 16, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}", 1,
                  ovs + 2, 1, false, false);
    ck_assert_int_eq(l.rc, CT_ERR_CONFIG);
    ck_assert_msg(strstr(l.err.msg, "--set optimizer.params.lr") && strstr(l.err.msg, "\"=1\""), "%s", l.err.msg);
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
    ck_assert_str_eq(cJSON_GetObjectItem(sp, "total_num_steps")->valuestring, "auto");
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
    unload(&l);
    /* the resolved config (what a checkpoint saves as config.json) reads again, "auto" kept */
    l = load(json, 4);
    free(json);
    assert_ok(l);
    ck_assert_int_eq(l.cfg->scheduler.total_num_steps, -1);
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
}
END_TEST

/* A misspelt override is refused and names the key it meant; the same misspelling in the file only
 * warns (DeepSpeed ignores unknown keys there). Random one-letter substitutions in the last
 * component of keys of several sections. */
START_TEST(override_typos_refused) {
    static const char *const keys[] = {"optimizer.params.weight_decay", "fp16.initial_scale_power",
                                       "gradient_clipping", "scheduler.params.warmup_max_lr",
                                       "flops_profiler.profile_step", "steps_per_print"};
    const char *text = "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\"}, "
                       "\"scheduler\": {\"type\": \"WarmupLR\"}, \"fp16\": {\"enabled\": true}}";
    srand(12);
    for (int it = 0; it < 24; it++) {
        const char *key = keys[it % CT_ARRAY_LEN(keys)];
        char typo[96], ov[128], want[200];
        snprintf(typo, sizeof typo, "%s", key);
        char *leaf = strrchr(typo, '.') ? strrchr(typo, '.') + 1 : typo;
        size_t pos;
        do pos = (size_t)rand() % strlen(leaf);
        while (leaf[pos] == '_');
        char c;
        do c = (char)('a' + rand() % 26);
        while (c == leaf[pos]);
        leaf[pos] = c;
        snprintf(ov, sizeof ov, "%s=1", typo);
        const char *ovs[] = {ov};
        loaded l = load_opts(text, 1, ovs, 1, false, false);
        ck_assert_msg(l.rc == CT_ERR_CONFIG, "--set %s accepted", ov);
        snprintf(want, sizeof want, "--set %s: unknown key; did you mean %s?", typo, key);
        ck_assert_msg(strstr(l.err.msg, want), "--set %s: %s", ov, l.err.msg);
        unload(&l);
    }
    /* in the file: a warning, and the run goes on */
    loaded l = load("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lrr\": 1}}}", 1);
    assert_ok(l);
    assert_warn_has(l, "optimizer.params.lrr: unknown key (ignored); did you mean optimizer.params.lr?");
    unload(&l);
}
END_TEST

/* No object member under `node` is null (array elements may be: they are values, not keys). */
static void assert_no_null_member(const cJSON *node, const char *where) {
    for (const cJSON *c = node ? node->child : NULL; c; c = c->next) {
        ck_assert_msg(!(cJSON_IsObject(node) && cJSON_IsNull(c)), "%s.%s is still null", where, c->string);
        assert_no_null_member(c, where);
    }
}

/* null means "not set" in ctrain's own sections as in DeepSpeed's: the dataset openers and the
 * graph builder read model and data themselves, so the loader takes null members out of those
 * sections, whether the file or an override wrote them (--set data.train.size=null). Random
 * subsets of null overrides on a file that has nulls of its own. */
START_TEST(null_means_not_set) {
    const char *text =
        "{\"train_batch_size\": 8,\n"
        " \"model\": {\"input\": [4], \"init_from\": null, \"layers\": [{\"type\": \"linear\", \"out\": 3, "
        "\"name\": null}], \"loss\": {\"type\": \"cross_entropy\"}},\n"
        " \"data\": {\"workers\": null, \"eval\": null,\n"
        "          \"train\": {\"format\": \"image_folder\", \"root\": \"x\", \"size\": [8, 8], \"channels\": 3, "
        "\"limit\": null},\n"
        "          \"transform\": {\"hflip\": null, \"normalize\": {\"mean\": [0.5], \"std\": [0.2]}}}}";
    static const char *const nulls[] = {"data.train.size", "data.train.channels", "data.transform.normalize",
                                        "model.layers.0.out", "data.prefetch", "model.loss.type"};
    srand(3);
    for (int it = 0; it < 12; it++) {
        const char *ovs[CT_ARRAY_LEN(nulls)];
        char buf[CT_ARRAY_LEN(nulls)][64];
        bool on[CT_ARRAY_LEN(nulls)];
        int n = 0;
        for (int k = 0; k < CT_ARRAY_LEN(nulls); k++) {
            on[k] = it == 0 || rand() % 2;
            if (!on[k]) continue;
            snprintf(buf[n], sizeof buf[n], "%s=null", nulls[k]);
            ovs[n] = buf[n];
            n++;
        }
        loaded l = load_opts(text, 1, ovs, n, false, false);
        assert_ok(l);
        assert_no_null_member(l.cfg->model, "model");
        assert_no_null_member(l.cfg->data, "data");
        assert_no_null_member(l.cfg->resolved, "--print-config");
        const cJSON *train = cJSON_GetObjectItem(l.cfg->data, "train");
        ck_assert(!cJSON_GetObjectItem(train, "limit") && !cJSON_GetObjectItem(l.cfg->data, "eval"));
        ck_assert(cJSON_GetObjectItem(train, "root") != NULL); /* the rest is kept */
        ck_assert((cJSON_GetObjectItem(train, "size") == NULL) == on[0]);
        ck_assert((cJSON_GetObjectItem(train, "channels") == NULL) == on[1]);
        const cJSON *layer = cJSON_GetArrayItem(cJSON_GetObjectItem(l.cfg->model, "layers"), 0);
        ck_assert((cJSON_GetObjectItem(layer, "out") == NULL) == on[3]);
        unload(&l);
    }
    /* a null for a key the section does not have is still a typo */
    const char *typo[] = {"data.train.sise=null"};
    loaded l = load_opts(text, 1, typo, 1, false, false);
    ck_assert_int_eq(l.rc, CT_ERR_CONFIG);
    ck_assert_msg(strstr(l.err.msg, "data.train.sise: unknown key; did you mean data.train.size?"), "%s", l.err.msg);
    unload(&l);
}
END_TEST

START_TEST(unused_keys_listed_once) {
    loaded l = load("{\"train_batch_size\": 8, \"comms_logger\": {\"enabled\": false}, \"nebula\": "
                    "{\"enabled\": false}, \"aio\": {\"block_size\": 1048576}, \"zero_optimization\": "
                    "{\"round_robin_gradients\": true}}", 1);
    assert_ok(l);
    int n = 0;
    for (int i = 0; i < l.warn.n; i++)
        if (strstr(l.warn.items[i], "keys read but not used by ctrain: ")) {
            n++;
            ck_assert(strstr(l.warn.items[i], "comms_logger") && strstr(l.warn.items[i], "nebula") &&
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
    ck_assert(c->train.memory_limit_gb == 0 && c->train.host_memory_limit_gb == 0 && !c->micro_batch_auto);
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
    /* NVMe offload's keys (DeepSpeed's defaults) and the aio section */
    const ct_offload_cfg *oo = &c->zero.offload_optimizer, *op = &c->zero.offload_param;
    ck_assert(oo->device == CT_OFFLOAD_NONE && !oo->pin_memory && oo->nvme.buffer_count == 4 && !oo->nvme.path[0]);
    ck_assert(op->nvme.buffer_count == 5 && op->nvme.buffer_size == 100000000 && op->nvme.max_in_cpu == 1000000000);
    ck_assert(c->aio.block_size == 1048576 && c->aio.queue_depth == 8 && c->aio.intra_op_parallelism == 1 &&
              !c->aio.single_submit && c->aio.overlap_events && !c->aio.use_gds);
    const cJSON *aio = cJSON_GetObjectItem(c->resolved, "aio");
    ck_assert_int_eq(cJSON_GetObjectItem(aio, "block_size")->valueint, 1048576);
    ck_assert_int_eq(cJSON_GetObjectItem(aio, "intra_op_parallelism")->valueint, 1);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(aio, "overlap_events")));
    const cJSON *ro = cJSON_GetObjectItem(cJSON_GetObjectItem(c->resolved, "zero_optimization"), "offload_optimizer");
    ck_assert_int_eq(cJSON_GetObjectItem(ro, "buffer_count")->valueint, 4);
    ck_assert_str_eq(cJSON_GetObjectItem(ro, "nvme_path")->valuestring, "");
    unload(&l);
    /* given values; DeepSpeed's older name thread_count */
    l = load("{\"train_batch_size\": 8, \"aio\": {\"block_size\": 262144, \"queue_depth\": 32, \"thread_count\": 4, \"single_submit\": true, "
             "\"overlap_events\": false}, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
             "\"cpu\", \"nvme_path\": \"/local_nvme\", \"buffer_count\": 6}, \"offload_param\": {\"buffer_size\": 1e9, "
             "\"max_in_cpu\": 0}}}", 1);
    assert_ok(l);
    c = l.cfg;
    ck_assert(c->aio.block_size == 262144 && c->aio.queue_depth == 32 && c->aio.intra_op_parallelism == 4 &&
              c->aio.single_submit && !c->aio.overlap_events);
    ck_assert_str_eq(c->zero.offload_optimizer.nvme.path, "/local_nvme");
    ck_assert_int_eq(c->zero.offload_optimizer.nvme.buffer_count, 6);
    ck_assert(c->zero.offload_param.nvme.buffer_size == 1000000000 && c->zero.offload_param.nvme.max_in_cpu == 0);
    unload(&l);
    /* device "nvme" (NVMe offload of the optimizer): accepted, and the aio section is then used */
    l = load("{\"train_batch_size\": 8, \"aio\": {\"queue_depth\": 4}, \"zero_optimization\": {\"stage\": 2, "
             "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/local_nvme\", \"buffer_count\": 3}}}", 1);
    assert_ok(l);
    ck_assert(l.cfg->zero.offload_optimizer.device == CT_OFFLOAD_NVME && l.cfg->zero.offload_optimizer.nvme.buffer_count == 3);
    for (int i = 0; i < l.warn.n; i++) ck_assert_msg(!strstr(l.warn.items[i], "aio"), "%s", l.warn.items[i]);
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
    o.formats = ct_dataset_formats(&o.n_formats);
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
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* Errors: every refused config is a row of one table, checked by one runner                      */

/* A config ctrain must refuse: the file (a.json in the test folder, and a second file when a.json
 * names one), the command line, and what the refusal says. */
typedef struct err_case {
    const char *text;                /* a.json */
    int world;                       /* data-parallel ranks; 0 means 1 */
    const char *set[2];              /* overrides (--set KEY=VALUE), in order */
    const char *aux_name, *aux_text; /* a second file, written first (a model file a.json names) */
    bool check;                      /* through ct_config_check (`ctrain config check`) */
    int code;                        /* the status, which is ctrain's exit code */
    const char *at;                  /* "a.json:3:4": the message starts with that file and position */
    const char *has[6];              /* texts the message contains */
} err_case;

#define CFG CT_ERR_CONFIG
#define TB8 "{\"train_batch_size\": 8, "

static const err_case err_cases[] = {
    /* --- batch rule --- */
    /* floor division, as DeepSpeed: tb 100, micro 7, W 2 -> GAS (100 // 7) // 2 = 7 -> 98 != 100 */
    {.text = "{\"train_batch_size\": 100,\"train_micro_batch_size_per_gpu\": 7,\"steps_per_print\": 10}",
     .world = 2, .code = CFG, .at = "a.json:1:2", .has = {"100 != micro 7 × accumulation 7 × world 2 = 98"}},
    /* accumulation only */
    {.text = "{\"gradient_accumulation_steps\": 4,\"steps_per_print\": 10}", .code = CFG,
     .at = "a.json:1:2", .has = {"train_batch_size", "train_micro_batch_size_per_gpu"}},
    /* none */
    {.text = "{\"steps_per_print\": 1}", .code = CFG, .at = "a.json", .has = {"train_batch_size: missing"}},
    /* micro 4 // 8 = 0 */
    {.text = "{\"train_batch_size\": 4,\"gradient_accumulation_steps\": 1,\"steps_per_print\": 10}", .world = 8,
     .code = CFG, .at = "a.json:1:2",
     .has = {"train_micro_batch_size_per_gpu: derived (train_batch_size 4 // world 8) // accumulation 1 = 0",
             "train_batch_size was set in the file (1:2)", "onsistent choice",
             "micro 1 and accumulation 1 with train_batch_size 8, or keep train_batch_size 4 and run on 4 ranks"}},
    /* accumulation 0 */
    {.text = "{\"train_batch_size\": 4,\"train_micro_batch_size_per_gpu\": 2,\"steps_per_print\": 10}", .world = 8,
     .code = CFG, .at = "a.json:1:2",
     .has = {"gradient_accumulation_steps: derived (train_batch_size 4 // micro 2) // world 8 = 0"}},
    /* the product check */
    {.text = "{\"train_batch_size\": 4,\"gradient_accumulation_steps\": 1,\"steps_per_print\": 10}", .world = 3,
     .code = CFG, .at = "a.json:1:2", .has = {"4 != micro 1 × accumulation 1 × world 3 = 3"}},
    {.text = "{\"train_batch_size\": -8, \"train_micro_batch_size_per_gpu\": 2}", .code = CFG,
     .at = "a.json:1:2", .has = {"train_batch_size: got -8"}},
    {.text = TB8 "\"train_micro_batch_size_per_gpu\": -2, \"gradient_accumulation_steps\": 1}", .code = CFG,
     .at = "a.json:1:25", .has = {"train_micro_batch_size_per_gpu: got -2"}},
    {.text = "{\"train_batch_size\": \"8\"}", .code = CFG,
     .at = "a.json:1:2", .has = {"train_batch_size: expected a positive integer or \"auto\", got \"8\""}},
    {.text = "{\"train_micro_batch_size_per_gpu\": 900000000000, \"gradient_accumulation_steps\": 900000000000}",
     .world = 64, .code = CFG, .at = "a.json:1:2", .has = {"more than ctrain supports"}},
    {.text = "{\"train_batch_size\": 5.5}", .code = CFG, .at = "a.json:1:2", .has = {"got 5.5"}},
    /* the UX example: sources from the file and from --set, and consistent alternatives */
    {.text = "{\"train_batch_size\": 100,\n \"train_micro_batch_size_per_gpu\": 12}", .world = 2,
     .set = {"gradient_accumulation_steps=4"}, .code = CFG, .at = "a.json:1:2",
     .has = {"train_batch_size: 100 != micro 12 × accumulation 4 × world 2 = 96",
             "train_batch_size was set in the file (1:2)", "train_micro_batch_size_per_gpu was set in the file (2:2)",
             "gradient_accumulation_steps was set with --set gradient_accumulation_steps",
             "micro 12 and accumulation 4 with train_batch_size 96, or micro 10 and accumulation 5 with 100"}},
    /* `ctrain config check` reports the load error */
    {.text = "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 2, \"fp16\": {\"enabled\": true}, "
             "\"zero_optimization\": {\"stage\": 2}}",
     .world = 128, .check = true, .code = CFG, .at = "a.json:1:2", .has = {"train_micro_batch_size_per_gpu"}},

    /* --- overrides --- */
    {.text = "{\"train_batch_size\": 16}", .set = {"train_batch_size.x=1"}, .code = CFG,
     .has = {"--set train_batch_size.x: train_batch_size is 16", "not an object"}},
    {.text = "{\"train_batch_size\": 16}", .set = {"train.epochs=abc"}, .code = CFG,
     .at = "a.json", .has = {"a.json: --set train.epochs: expected an integer >= 0, got \"abc\""}},
    {.text = "{\"train_batch_size\": 16}", .set = {"zero_optimization={\"stage\": 7}"}, .code = CFG,
     .at = "a.json",
     .has = {"a.json: --set zero_optimization: zero_optimization.stage: expected an integer 0..3, got 7"}},
    {.text = "{\"train_batch_size\": 16}", .set = {"train.epohcs=3"}, .code = CFG,
     .at = "a.json", .has = {"a.json: --set train.epohcs: unknown key; did you mean train.epochs?"}},
    /* an override must name a key ctrain reads: a typo would train the defaults (unknown keys in the
     * file stay warnings, as DeepSpeed ignores them); the hint finds the key in any section */
    {.text = TB8 "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}}",
     .set = {"optimizer.params.lrr=0.1"}, .code = CFG, .at = "a.json",
     .has = {"a.json: --set optimizer.params.lrr: unknown key; did you mean optimizer.params.lr?"}},
    {.text = TB8 "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}}", .set = {"lr=0.1"},
     .code = CFG, .at = "a.json", .has = {"a.json: --set lr: unknown key; did you mean optimizer.params.lr?"}},
    {.text = TB8 "\"optimizer\": {\"type\": \"AdamW\"}}", .set = {"optim.lr=0.1"}, .code = CFG, .at = "a.json",
     .has = {"a.json: --set optim.lr: optim: unknown key; did you mean optimizer.params.lr?"}},
    {.text = TB8 "\"optimizer\": {\"type\": \"AdamW\"}}", .set = {"optimzer.params.eps=1e-6"}, .code = CFG,
     .at = "a.json", .has = {"--set optimzer.params.eps: optimzer: unknown key; did you mean optimizer.params.eps?"}},
    {.text = TB8 "\"fp16\": {\"enabled\": true}}", .set = {"fp16.loss_scale_windw=10"}, .code = CFG,
     .at = "a.json", .has = {"--set fp16.loss_scale_windw: unknown key; did you mean fp16.loss_scale_window?"}},
    {.text = TB8 "\"scheduler\": {\"type\": \"WarmupLR\"}}", .set = {"warmup_num_step=10"}, .code = CFG,
     .at = "a.json", .has = {"--set warmup_num_step: unknown key; did you mean scheduler.params.warmup_num_steps?"}},
    {.text = "{\"train_batch_size\": 16}", .set = {"zzz_qqq=1"}, .code = CFG, .at = "a.json",
     .has = {"a.json: --set zzz_qqq: unknown key", "an override must name a key ctrain reads"}},
    {.text = "{\"train_batch_size\": 16}", .set = {"activation_checkpointing.partition_activation=true"},
     .code = CFG, .at = "a.json",
     .has = {"did you mean activation_checkpointing.partition_activations?"}},
    {.text = "{\"train_batch_size\": 16}", .set = {"train.epochs"}, .code = CFG, .has = {"expected KEY=VALUE"}},
    /* an array index equal to the length is past the end (not an append), inside the path or last */
    {.text = TB8 "\"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}, {\"type\": \"relu\"}, "
             "{\"type\": \"linear\", \"out\": 3}]}}",
     .set = {"model.layers.3.out=5"}, .code = CFG, .has = {"--set model.layers.3.out", "\"3\""}},
    {.text = TB8 "\"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}]}}",
     .set = {"model.layers.1={\"type\": \"relu\"}"}, .code = CFG, .has = {"--set model.layers.1", "\"1\""}},
    {.text = TB8 "\"model\": {\"input\": [4], \"layers\": [{\"type\": \"relu\"}]}}",
     .set = {"model.input.1=4"}, .code = CFG, .has = {"--set model.input.1", "\"1\""}},
    {.text = "{\"train_batch_size\": 16}", .set = {"train..epochs=3"}, .code = CFG, .has = {"empty component"}},
    {.text = "{\"train_batch_size\": 16}", .set = {"train_batch_size=4", "zero_optimization.stage=\"x\""},
     .code = CFG, .at = "a.json",
     .has = {"a.json: --set zero_optimization.stage: expected an integer 0..3, got \"x\""}},

    /* --- unknown keys (errors where DeepSpeed's pydantic sections and ctrain's sections refuse them) --- */
    {.text = "{\"train_batch_size\": 8,\n \"zero_optimization\": {\"stage\": 3, \"stage3_max_live_paramters\": 1e9}}",
     .code = CFG, .at = "a.json:2:36",
     .has = {"a.json:2:36: zero_optimization.stage3_max_live_paramters: unknown key; did you mean "
             "zero_optimization.stage3_max_live_parameters?"}},
    {.text = TB8 "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memroy\": true}}}",
     .code = CFG, .at = "a.json:1:86",
     .has = {"zero_optimization.offload_optimizer.pin_memroy: unknown key; did you mean "
             "zero_optimization.offload_optimizer.pin_memory?"}},
    {.text = TB8 "\"train\": {\"epoch\": 3}}", .code = CFG, .at = "a.json:1:35",
     .has = {"train.epoch: unknown key; did you mean train.epochs?"}},
    {.text = TB8 "\"tensorboard\": {\"enable\": true}}", .code = CFG, .at = "a.json:1:41",
     .has = {"tensorboard.enable: unknown key; did you mean tensorboard.enabled?"}},
    {.text = TB8 "\"model\": {\"layer\": []}}", .code = CFG, .at = "a.json:1:35",
     .has = {"model.layer: unknown key; did you mean model.layers?"}},
    {.text = TB8 "\"data\": {\"train\": {\"format\": \"idx\", \"image\": \"x\"}}}", .code = CFG, .at = "a.json:1:61",
     .has = {"data.train.image: unknown key; did you mean data.train.images?"}},
    {.text = TB8 "\"data\": {\"train\": {\"format\": \"idk\"}}}", .code = CFG, .at = "a.json:1:44",
     .has = {"data.train.format: expected one of idx, image_folder, shard, tokens, csv, webdataset, tfrecord, hdf5, got \"idk\"; did you "
             "mean idx?"}},
    {.text = TB8 "\"comet\": {\"enabled\": false, \"projet\": \"x\"}}", .code = CFG, .at = "a.json:1:53",
     .has = {"comet.projet: unknown key; did you mean comet.project?"}},

    /* --- syntax --- */
    {.text = TB8 "\"fp16\": {\"enabled\": true, \"enabled\": false}}", .code = CFG,
     .at = "a.json:1:51", .has = {"duplicate key", "enabled"}},
    {.text = "{\"train_batch_size\": GBSIZE}", .code = CFG, .at = "a.json:1:22", .has = {"GBSIZE", "1:22"}},
    {.text = "[1, 2]", .code = CFG, .at = "a.json", .has = {"expected a JSON object at the top level"}},

    /* --- values: precision, optimizer, scheduler --- */
    {.text = TB8 "\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", .code = CFG,
     .at = "a.json:1:61", .has = {"fp16.enabled and bf16.enabled are both true"}},
    {.text = TB8 "\"fp16\": {\"enabled\": true}, \"bfloat16\": {\"enabled\": true}}", .code = CFG,
     .at = "a.json:1:65", .has = {"bfloat16.enabled"}},
    {.text = TB8 "\"fp16\": {\"enabled\": \"yes\"}}", .code = CFG, /* a plain section: not lax */
     .at = "a.json:1:34", .has = {"fp16.enabled: expected true or false, got \"yes\""}},
    {.text = TB8 "\"fp16\": {\"enabled\": true, \"fp16_master_weights_and_grads\": true}}", .code = CFG,
     .at = "a.json:1:51", .has = {"fp16.fp16_master_weights_and_grads: fp16 master weights are not implemented"}},
    {.text = TB8 "\"fp16\": {\"enabled\": true, \"loss_scale\": 128}, \"optimizer\": {\"type\": \"Lamb\"}}",
     .code = CFG, .at = "a.json:1:51", .has = {"fp16.loss_scale: Lamb requires dynamic loss scaling (loss_scale 0)"}},
    {.text = TB8 "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1}}}", .code = CFG,
     .at = "a.json:1:39",
     .has = {"optimizer.type: \"OneBitAdam\" is a DeepSpeed optimizer not supported by ctrain; supported: "
             "Adam, AdamW, SGD, Lamb"}},
    {.text = TB8 "\"optimizer\": {\"type\": \"Adma\"}}", .code = CFG, .at = "a.json:1:39",
     .has = {"did you mean Adam?"}},
    {.text = TB8 "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"max_grad_norm\": 1.0}}}", .code = CFG,
     .at = "a.json:1:66",
     .has = {"optimizer.params.max_grad_norm: not supported as an optimizer parameter", "gradient_clipping"}},
    {.text = TB8 "\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {}}}", .code = CFG,
     .at = "a.json:1:64", .has = {"scheduler.params.total_num_steps: required by WarmupDecayLR"}},
    {.text = TB8 "\"scheduler\": {\"type\": \"warmuplr\"}}", .code = CFG, .at = "a.json:1:39",
     .has = {"did you mean WarmupLR?"}},
    {.text = TB8 "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 0.1}}}", .code = CFG,
     .at = "a.json:1:59", .has = {"scheduler.params.cycle_max_lr: required by OneCycle"}},

    /* --- values: top-level keys --- */
    {.text = TB8 "\"gradient_clipping\": -1}", .code = CFG, .at = "a.json:1:25",
     .has = {"gradient_clipping: expected a number >= 0, got -1"}},
    {.text = TB8 "\"steps_per_print\": 2.5}", .code = CFG, .at = "a.json:1:25",
     .has = {"steps_per_print: expected an integer", "got 2.5 (a number with a fractional part)"}},
    {.text = TB8 "\"communication_data_type\": \"fp8\"}", .code = CFG, .at = "a.json:1:25",
     .has = {"communication_data_type: expected \"fp32\", \"fp16\" or \"bf16\", got \"fp8\""}},
    {.text = TB8 "\"prescale_gradients\": true, \"zero_optimization\": {\"stage\": 2}}", .code = CFG,
     .at = "a.json:1:25", .has = {"prescale_gradients: not supported with ZeRO stage 2 and reduce_scatter"}},
    {.text = TB8 "\"checkpoint\": {\"tag_validation\": \"Sometimes\"}}", .code = CFG, .at = "a.json:1:40",
     .has = {"checkpoint.tag_validation: expected \"Ignore\", \"Warn\" or \"Fail\", got \"Sometimes\""}},
    {.text = TB8 "\"amp\": {\"enabled\": true, \"opt_level\": \"O1\"}}", .code = CFG,
     .at = "a.json:1:33", .has = {"amp.enabled: NVIDIA Apex AMP is not implemented"}},
    {.text = TB8 "\"elasticity\": {\"enabled\": true}}", .code = CFG, .at = "a.json:1:40",
     .has = {"elasticity.enabled: elastic training is not implemented in ctrain"}},
    {.text = TB8 "\"progressive_layer_drop\": {\"theta\": 0.5}}", .code = CFG,
     .at = "a.json:1:25", .has = {"progressive_layer_drop.enabled: required"}},
    /* --- another kind of training than ctrain's: refused when on, naming the key and what ctrain
       does instead (off, they are accepted: other_kinds_off_accepted) --- */
    {.text = TB8 "\"progressive_layer_drop\": {\"enabled\": true, \"theta\": 0.5}}", .code = CFG,
     .has = {"progressive_layer_drop.enabled: progressive layer drop", "trains every layer at every step"}},
    {.text = TB8 "\"progressive_layer_drop\": {\"enabled\": false}}", .set = {"progressive_layer_drop.enabled=true"},
     .code = CFG, .has = {"progressive_layer_drop.enabled: progressive layer drop"}},
    {.text = TB8 "\"data_efficiency\": {\"enabled\": true, \"data_routing\": {\"enabled\": true, "
                 "\"random_ltd\": {\"enabled\": true, \"total_layer_num\": 12}}}}", .code = CFG,
     .has = {"data_efficiency.data_routing.random_ltd.enabled: random layer-token drop",
             "sends every token through every layer"}},
    {.text = TB8 "\"data_efficiency\": {\"data_routing\": 5}}", .code = CFG,
     .has = {"data_efficiency.data_routing: expected an object, got 5"}},
    {.text = TB8 "\"quantize_training\": {\"enabled\": true, \"quantize_bits\": {\"start_bits\": 12}}}",
     .code = CFG, .has = {"quantize_training.enabled: quantization-aware training (MoQ"}},
    {.text = TB8 "\"compression_training\": {\"sparse_pruning\": {\"shared_parameters\": {\"enabled\": true}}}}",
     .code = CFG, .has = {"compression_training.sparse_pruning.shared_parameters.enabled: model compression (sparse "
                          "pruning)", "trains the model uncompressed"}},
    {.text = TB8 "\"compression_training\": {\"layer_reduction\": {\"enabled\": true, \"keep_number_layer\": 5}}}",
     .code = CFG, .has = {"compression_training.layer_reduction.enabled: layer reduction"}},
    {.text = TB8 "\"autotuning\": {\"enabled\": true, \"start_step\": 5}}", .code = CFG, .at = "a.json:1:40",
     .has = {"autotuning.enabled: DeepSpeed then runs a short profiling experiment", "ctrain has no autotuner"}},
    {.text = TB8 "\"torch_autocast\": {\"enabled\": true, \"dtype\": \"bfloat16\"}}", .code = CFG,
     .has = {"torch_autocast.enabled: PyTorch autocast", "\"bf16\": {\"enabled\": true}"}},
    {.text = TB8 "\"torch_autocast\": {\"enabled\": \"yes\"}}", .code = CFG,
     .has = {"torch_autocast.enabled: expected true or false, got \"yes\""}},
    {.text = TB8 "\"pipeline\": {\"stages\": 4, \"partition\": \"best\"}}", .code = CFG, .at = "a.json:1:38",
     .has = {"pipeline.stages: pipeline parallelism over 4 stages is not implemented in ctrain",
             "the ranks split the batch"}},
    {.text = TB8 "\"tensor_parallel\": {\"autotp_size\": 2}}", .code = CFG,
     .has = {"tensor_parallel.autotp_size: tensor parallelism (AutoTP) over 2 ranks is not implemented"}},
    {.text = TB8 "\"tensor_parallel\": {\"tp\": {\"tp_size\": 8}}}", .code = CFG,
     .has = {"tensor_parallel.tp.tp_size: tensor parallelism over 8 ranks"}},
    {.text = TB8 "\"sequence_parallel_size\": 4}", .code = CFG, .at = "a.json:1:25",
     .has = {"sequence_parallel_size: sequence parallelism (DeepSpeed-Ulysses) over 4 ranks"}},
    {.text = TB8 "\"compile\": {\"deepcompile\": true, \"passes\": [\"z3\", \"autotp\"]}}", .code = CFG,
     .has = {"compile.passes: \"autotp\": tensor parallelism is not implemented in ctrain"}},
    {.text = TB8 "\"checkpoint\": {\"load_universal\": true}}", .code = CFG, .at = "a.json:1:40",
     .has = {"checkpoint.load_universal: loading a DeepSpeed universal checkpoint is not implemented",
             "resume on any number of ranks"}},

    /* --- values: zero_optimization --- */
    {.text = "{\"train_batch_size\": 8,\n \"zero_optimization\": {\n   \"stage\": 4}}", .code = CFG, .at = "a.json:3:4",
     .has = {"a.json:3:4: zero_optimization.stage: expected an integer 0..3, got 4"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": -1}}", .code = CFG,
     .at = "a.json:1:47", .has = {"zero_optimization.stage: expected an integer 0..3, got -1"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": \"2.5\"}}", .code = CFG, /* lax: integer strings only */
     .at = "a.json:1:47", .has = {"zero_optimization.stage: expected an integer 0..3, got \"2.5\""}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", "
                 "\"nvme_path\": \"/x\"}}}",
     .code = CFG, .at = "a.json:1:77",
     .has = {"zero_optimization.offload_param.device: \"nvme\" is not supported for parameters: stage 3 reads them "
             "layer by layer", "use \"cpu\""}},
    /* the NVMe keys of a block with device "nvme" */
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\"}}}", .code = CFG,
     .at = "a.json:1:81",
     .has = {"zero_optimization.offload_optimizer.nvme_path: required with device \"nvme\": the directory on the "
             "NVMe drive to swap to"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": null}}}",
     .code = CFG, .at = "a.json:1:77", .has = {"zero_optimization.offload_param.nvme_path: required"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": "
                 "\"/nvme\", \"buffer_count\": 0}}}", .code = CFG, .at = "a.json:1:121",
     .has = {"zero_optimization.offload_optimizer.buffer_count: the NVMe swap needs at least 1 host buffer (2 or more "
             "overlap its reads and writes with the optimizer step); got 0"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"buffer_count\": -1}}}", .code = CFG,
     .at = "a.json:1:81", .has = {"zero_optimization.offload_optimizer.buffer_count: expected an integer >= 0, got -1"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"buffer_size\": 1.5}}}", .code = CFG,
     .at = "a.json:1:77", .has = {"zero_optimization.offload_param.buffer_size: expected an integer >= 0, got 1.5"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"nvme_path\": 5}}}", .code = CFG,
     .at = "a.json:1:81", .has = {"zero_optimization.offload_optimizer.nvme_path: expected a string"}},
    /* --- values: aio --- */
    {.text = TB8 "\"aio\": {\"block_size\": 1000000}}", .code = CFG, .at = "a.json:1:33",
     .has = {"aio.block_size: expected a multiple of 4096 bytes (direct I/O moves whole blocks), got 1000000; e.g. "
             "999424"}},
    {.text = TB8 "\"aio\": {\"block_size\": 1024}}", .code = CFG, .at = "a.json:1:33",
     .has = {"aio.block_size: expected an integer 4096..1073741824, got 1024"}},
    {.text = TB8 "\"aio\": {\"queue_depth\": 0}}", .code = CFG, .at = "a.json:1:33",
     .has = {"aio.queue_depth: expected an integer 1..1024, got 0"}},
    {.text = TB8 "\"aio\": {\"thread_count\": 2, \"intra_op_parallelism\": 4}}", .code = CFG, .at = "a.json:1:33",
     .has = {"aio.thread_count: given twice, also as aio.intra_op_parallelism"}},
    {.text = TB8 "\"aio\": {\"use_gds\": true}}", .code = CFG, .at = "a.json:1:33",
     .has = {"aio.use_gds: GPUDirect Storage is not supported by ctrain: swap files are read into host memory; set "
             "it to false"}},
    {.text = TB8 "\"aio\": {\"single_submit\": \"yes\"}}", .code = CFG, .at = "a.json:1:33",
     .has = {"aio.single_submit: expected true or false, got \"yes\""}},
    {.text = TB8 "\"aio\": [1]}", .code = CFG, .at = "a.json:1:25", .has = {"aio: expected an object, got [1]"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"gpu\"}}}", .code = CFG,
     .at = "a.json:1:81",
     .has = {"zero_optimization.offload_optimizer.device: expected \"none\", \"cpu\" or \"nvme\", got \"gpu\""}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"offload_param\": false}}", .code = CFG,
     .at = "a.json:1:59", .has = {"zero_optimization.offload_param: expected an object"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": true}}", .code = CFG,
     .at = "a.json:1:59",
     .has = {"zero_optimization.offload_optimizer: expected an object such as {\"device\": \"cpu\"} (or null), "
             "got true"}},
    {.text = TB8 "\"zero_optimization\": {\"cpu_offload\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}}",
     .code = CFG, .at = "a.json:1:47",
     .has = {"zero_optimization.cpu_offload: deprecated, and cannot be given together"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": \"maybe\"}}", .code = CFG,
     .at = "a.json:1:59", .has = {"zero_optimization.cpu_offload: expected true or false, got \"maybe\""}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"stage3_gather_16bit_weights_on_model_save\": true, "
             "\"stage3_gather_fp16_weights_on_model_save\": true}}",
     .code = CFG, .at = "a.json:1:110",
     .has = {"zero_optimization.stage3_gather_fp16_weights_on_model_save: deprecated, and cannot be "
             "given together with stage3_gather_16bit_weights_on_model_save"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 1, \"legacy_stage1\": true}}", .code = CFG,
     .at = "a.json:1:59", .has = {"zero_optimization.legacy_stage1: the deprecated ZeRO stage 1 is not supported"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 3, \"max_live_parameters\": 1, "
                 "\"stage3_max_live_parameters\": 2}}",
     .code = CFG, .at = "a.json:1:59", .has = {"given twice"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1500.5}}", .code = CFG,
     .at = "a.json:1:59", .has = {"zero_optimization.reduce_bucket_size: expected an integer >= 0, got 1500.5"}},
    {.text = TB8 "\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.3}}}",
     .code = CFG, .at = "a.json:1:98", .has = {"partial offloading (ratio < 1) needs ZeRO stage 3"}},
    {.text = TB8 "\"zero_optimization\": {\"reduce_bucket_size\": \"5e8\"}}", .code = CFG,
     .at = "a.json:1:47", .has = {"zero_optimization.reduce_bucket_size: expected an integer"}},
    {.text = TB8 "\"zero_optimization\": {\"overlap_comm\": 2}}", .code = CFG,
     .at = "a.json:1:47", .has = {"zero_optimization.overlap_comm: expected true or false, got 2"}},

    /* --- values: activation checkpointing, curriculum, profiler (accepted, not used yet; still checked) --- */
    {.text = TB8 "\"activation_checkpointing\": {\"number_checkpoints\": -1}}", .code = CFG,
     .at = "a.json:1:54", .has = {"activation_checkpointing.number_checkpoints: expected an integer >= 0, got -1"}},
    {.text = TB8 "\"activation_checkpointing\": {\"number_checkpoints\": 2.5}}", .code = CFG,
     .at = "a.json:1:54",
     .has = {"activation_checkpointing.number_checkpoints: expected an integer >= 0, got 2.5 (a number with a "
             "fractional part)"}},
    {.text = TB8 "\"activation_checkpointing\": {\"partition_activations\": \"yes\"}}", .code = CFG,
     .at = "a.json:1:54",
     .has = {"activation_checkpointing.partition_activations: expected true or false, got \"yes\""}},
    {.text = TB8 "\"activation_checkpointing\": {\"cpu_checkpointing\": 2}}", .code = CFG,
     .at = "a.json:1:54", .has = {"activation_checkpointing.cpu_checkpointing: expected true or false, got 2"}},
    {.text = TB8 "\"activation_checkpointing\": true}", .code = CFG,
     .at = "a.json:1:25", .has = {"activation_checkpointing: expected an object, got true"}},
    {.text = TB8 "\"flops_profiler\": {\"enabled\": \"on\"}}", .code = CFG,
     .at = "a.json:1:44", .has = {"flops_profiler.enabled: expected true or false, got \"on\""}},
    {.text = TB8 "\"checkpoint\": {\"enabled\": \"no\"}}", .code = CFG,
     .at = "a.json:1:40", .has = {"checkpoint.enabled: expected true or false, got \"no\""}},
    {.text = TB8 "\"flops_profiler\": {\"profile_step\": 0}}", .code = CFG,
     .at = "a.json:1:44", .has = {"flops_profiler.profile_step: expected an integer >= 1, got 0"}},
    {.text = TB8 "\"wall_clock_breakdown\": \"true\"}", .code = CFG,
     .at = "a.json:1:25", .has = {"wall_clock_breakdown: expected true or false, got \"true\""}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": \"yes\"}}", .code = CFG,
     .at = "a.json:1:49", .has = {"curriculum_learning.enabled: expected true or false, got \"yes\""}},
    {.text = TB8 "\"curriculum_learning\": {\"curriculum_type\": \"seqlen\"}}", .code = CFG,
     .at = "a.json:1:25", .has = {"curriculum_learning.enabled: required when the section is present"}},
    {.text = TB8 "\"curriculum_learning\": true}", .code = CFG,
     .at = "a.json:1:25", .has = {"curriculum_learning: expected an object, got true"}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", \"min_difficulty\": 8, "
             "\"schedule_type\": \"fixed_linear\", \"schedule_config\": {}}}",
     .code = CFG, .at = "a.json:1:25",
     .has = {"curriculum_learning.max_difficulty: required when curriculum learning is enabled"}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", \"min_difficulty\": 8, "
             "\"max_difficulty\": 64, \"schedule_type\": \"fixed_root\", \"schedule_config\": "
             "{\"total_curriculum_step\": 10, \"difficulty_step\": 8}}}",
     .code = CFG, .at = "a.json:1:169",
     .has = {"curriculum_learning.schedule_config.root_degree: required by schedule_type fixed_root"}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", \"min_difficulty\": 8, "
             "\"max_difficulty\": 64, \"schedule_type\": \"cosine\", \"schedule_config\": {}}}",
     .code = CFG, .at = "a.json:1:138",
     .has = {"curriculum_learning.schedule_type: expected fixed_linear, fixed_root, fixed_discrete or "
             "custom, got \"cosine\""}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", \"min_difficulty\": 1, "
             "\"max_difficulty\": 3, \"schedule_type\": \"fixed_discrete\", \"schedule_config\": {\"difficulty\": "
             "[1, 2], \"max_step\": [5, 10]}}}",
     .code = CFG, .at = "a.json:1:192",
     .has = {"curriculum_learning.schedule_config.difficulty: expected a non-empty list one longer than "
             "max_step"}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": 5, \"min_difficulty\": 1, "
             "\"max_difficulty\": 3, \"schedule_type\": \"fixed_discrete\", \"schedule_config\": {}}}",
     .code = CFG, .at = "a.json:1:66",
     .has = {"curriculum_learning.curriculum_type: expected a name such as \"seqlen\", got 5"}},
    {.text = TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", \"min_difficulty\": 1, "
             "\"max_difficulty\": 3, \"schedule_type\": \"fixed_discrete\", \"schedule_config\": {\"difficulty\": "
             "[1, 2, 3], \"max_step\": [5, \"ten\"]}}}",
     .code = CFG,
     .has = {"curriculum_learning.schedule_config.max_step[1]: expected an integer"}},
    {.text = TB8 "\"data_efficiency\": {\"data_sampling\": {\"curriculum_learning\": {\"enabled\": 3}}}}", .code = CFG,
     .at = "a.json:1:87",
     .has = {"data_efficiency.data_sampling.curriculum_learning.enabled: expected true or false, got 3"}},
    {.text = TB8 "\"data_efficiency\": {\"data_sampling\": {\"curriculum_learning\": {\"enabled\": true}}}}",
     .code = CFG, .at = "a.json:1:63",
     .has = {"data_efficiency.data_sampling.curriculum_learning.curriculum_metrics: required when curriculum "
             "learning is enabled"}},
    {.text = TB8 "\"data_efficiency\": 5}", .code = CFG, .at = "a.json:1:25",
     .has = {"data_efficiency: expected an object, got 5"}},
    {.text = TB8 "\"data_efficiency\": {\"data_sampling\": []}}", .code = CFG,
     .at = "a.json:1:45", .has = {"data_efficiency.data_sampling: expected an object, got []"}},

    /* --- ctrain's sections --- */
    {.text = TB8 "\"train\": {\"device\": \"gpu\"}}", .code = CFG,
     .at = "a.json:1:35", .has = {"train.device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got \"gpu\""}},
    {.text = TB8 "\"train\": {\"epochs\": 0, \"max_steps\": 0}}", .code = CFG,
     .at = "a.json:1:35", .has = {"train.epochs: 0 with train.max_steps 0 leaves nothing to train"}},
    {.text = TB8 "\"train\": {\"best_metric\": \"eval_acurracy\"}}", .code = CFG,
     .at = "a.json:1:35",
     .has = {"train.best_metric: expected eval_loss, eval_accuracy or train_loss, got \"eval_acurracy\"; did you "
             "mean eval_accuracy?"}},
    {.text = TB8 "\"train\": {\"early_stopping\": {\"mode\": \"up\"}}}", .code = CFG,
     .at = "a.json:1:54", .has = {"train.early_stopping.mode: expected \"min\" or \"max\", got \"up\""}},
    {.text = TB8 "\"train\": {\"cuda_graph\": \"yes\"}}", .code = CFG,
     .at = "a.json:1:35", .has = {"train.cuda_graph: expected true, false or \"auto\""}},
    {.text = TB8 "\"train\": {\"memory_limit_gb\": -1}}", .code = CFG,
     .at = "a.json:1:35", .has = {"train.memory_limit_gb: expected a number in [0, 1000000000], got -1"}},
    {.text = TB8 "\"train\": {\"memory_limit_gb\": \"24GiB\"}}", .code = CFG,
     .at = "a.json:1:35", .has = {"train.memory_limit_gb: expected a number", "got \"24GiB\""}},
    {.text = TB8 "\"train\": {\"host_memory_limit_gb\": -0.5}}", .code = CFG,
     .at = "a.json:1:35", .has = {"train.host_memory_limit_gb: expected a number in [0, 1000000000], got -0.5"}},
    {.text = TB8 "\"model\": {\"layers\": {\"type\": \"linear\"}}}", .code = CFG,
     .at = "a.json:1:35", .has = {"model.layers: expected an array of layer objects"}},
    {.text = TB8 "\"model\": {\"layers\": [{\"type\": \"relu\"}, 3]}}", .code = CFG,
     .at = "a.json:1:64", .has = {"model.layers[1]: expected a layer object"}},
    {.text = TB8 "\"data\": {\"workers\": -1}}", .code = CFG, .at = "a.json:1:34",
     .has = {"data.workers: expected an integer >= 0, got -1"}},
    /* sections from other files: a missing file names it; errors inside point into that file */
    {.text = TB8 "\"model\": \"nope.json\"}", .code = CFG,
     .has = {"nope.json", "is named by model at ", "a.json:1:25)"}},
    {.text = TB8 "\"model\": \"bad.json\"}", .aux_name = "bad.json",
     .aux_text = "{\n  \"input\": [4],\n  \"layrs\": []\n}\n", .code = CFG, .at = "bad.json:3:3",
     .has = {"bad.json:3:3: model.layrs: unknown key; did you mean model.layers?"}},
};

START_TEST(config_errors) {
    const err_case *c = &err_cases[_i];
    if (c->aux_name) write_file(c->aux_name, c->aux_text);
    const char *path = write_file("a.json", c->text);
    int n = 0;
    while (n < CT_ARRAY_LEN(c->set) && c->set[n]) n++;
    ct_config_opts o = {.path = path, .overrides = c->set, .n_overrides = n, .world_size = c->world ? c->world : 1};
    o.formats = ct_dataset_formats(&o.n_formats);
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err e = {0};
    int rc;
    if (c->check) {
        char out[4096];
        FILE *f = fmemopen(out, sizeof out, "w");
        ck_assert_ptr_nonnull(f);
        rc = ct_config_check(&o, f, &w, &e);
        fclose(f);
    } else {
        rc = ct_config_load(&o, &cfg, &w, &e);
    }
    ck_assert_msg(rc == c->code, "row %d (%s): status %d, expected %d: %s", _i, c->text, rc, c->code, e.msg);
    if (c->at) {
        char want[600];
        snprintf(want, sizeof want, "%s/%s:", tmpdir, c->at);
        ck_assert_msg(strncmp(e.msg, want, strlen(want)) == 0, "row %d: message does not start with %s: %s", _i,
                      want, e.msg);
    }
    for (int k = 0; k < CT_ARRAY_LEN(c->has) && c->has[k]; k++)
        ck_assert_msg(strstr(e.msg, c->has[k]) != NULL, "row %d: message lacks \"%s\": %s", _i, c->has[k], e.msg);
    ct_config_free(cfg);
    ct_warnings_free(&w);
}
END_TEST

/* ---------------------------------------------------------------------------------------------- */
/* Accepted, not used yet                                                                          */

/* A config that switches on settings ctrain accepts but does not implement yet, one line of
 * ct_config_not_yet() it must give, and what the generic "read but not used" warning must then
 * no longer name (that line says it). */
/* The legacy curriculum section is kept as the schedule ct_curriculum_difficulty reads (a seqlen
 * curriculum is acted on: no "not used yet" line). */
START_TEST(curriculum_kept) {
    loaded l = load(TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", "
                    "\"min_difficulty\": 8, \"max_difficulty\": 1024, \"schedule_type\": \"fixed_root\", "
                    "\"schedule_config\": {\"total_curriculum_step\": 60000, \"difficulty_step\": 8, "
                    "\"root_degree\": 2}}}", 1);
    assert_ok(l);
    const ct_curriculum_cfg *c = &l.cfg->curriculum;
    ck_assert(c->enabled && c->schedule == CT_CURRICULUM_FIXED_ROOT);
    ck_assert_str_eq(c->type, "seqlen");
    ck_assert(c->min_difficulty == 8 && c->max_difficulty == 1024 && c->total_curriculum_step == 60000 &&
              c->difficulty_step == 8 && c->root_degree == 2);
    ck_assert(!l.cfg->pending.curriculum); /* acted on: every step's sequences are cut to it */
    unload(&l);
    l = load(TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", "
             "\"min_difficulty\": 1, \"max_difficulty\": 3, \"schedule_type\": \"fixed_discrete\", "
             "\"schedule_config\": {\"difficulty\": [1, 2, 3], \"max_step\": [5, 10]}}}", 1);
    assert_ok(l);
    c = &l.cfg->curriculum;
    ck_assert(c->schedule == CT_CURRICULUM_FIXED_DISCRETE && c->stages == 3 && c->difficulty[2] == 3 &&
              c->max_step[0] == 5 && c->max_step[1] == 10);
    unload(&l);
    l = load(TB8 "\"curriculum_learning\": {\"enabled\": false}}", 1);
    assert_ok(l);
    ck_assert(!l.cfg->curriculum.enabled && !l.cfg->pending.curriculum);
    unload(&l);
}
END_TEST

typedef struct not_yet_case {
    const char *text;
    int lines;          /* how many lines the config gives */
    const char *path;   /* the JSON path of the line checked */
    const char *says;   /* a text that line contains */
    const char *not_in_unused; /* not in "keys read but not used by ctrain: ..." (NULL: no check) */
} not_yet_case;

static const not_yet_case not_yet_cases[] = {
    {TB8 "\"zero_optimization\": {\"stage\": 1}}", 1, "zero_optimization.stage",
     "zero_optimization.stage 1: accepted, not used yet: one process has nothing to partition, so it trains as "
     "stage 0 (it holds all optimizer state, gradients and parameters)", NULL},
    {TB8 "\"zero_optimization\": {\"stage\": 2, \"round_robin_gradients\": true}}", 1, "zero_optimization.stage",
     "zero_optimization.stage 2: accepted, not used yet: one process has nothing to partition",
     "zero_optimization"},
    {TB8 "\"zero_optimization\": {\"stage\": \"3\"}}", 1, "zero_optimization.stage",
     "zero_optimization.stage 3: accepted, not used yet", NULL},
    {TB8 "\"zero_optimization\": true}", 1, "zero_optimization.stage", /* the legacy form is stage 1 */
     "zero_optimization.stage 1: accepted, not used yet", NULL},
    /* offload with nothing checkpointed: a line (nothing to offload) */
    {TB8 "\"activation_checkpointing\": {\"cpu_checkpointing\": true}}", 1,
     "activation_checkpointing.cpu_checkpointing",
     "activation_checkpointing.cpu_checkpointing true: does nothing here: no layer is checkpointed", NULL},

    /* another type than seqlen is DeepSpeed's user code: a line (seqlen cuts sequences: none) */
    {TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"vocab\", \"min_difficulty\": 8, "
         "\"max_difficulty\": 64, \"schedule_type\": \"fixed_linear\", \"schedule_config\": "
         "{\"total_curriculum_step\": 10, \"difficulty_step\": 8}}}",
     1, "curriculum_learning.curriculum_type",
     "curriculum_learning.curriculum_type \"vocab\": accepted, not used yet: this version trains without curriculum "
     "learning of this type", "curriculum_learning"},
    {TB8 "\"data_efficiency\": {\"enabled\": true, \"data_sampling\": {\"curriculum_learning\": {\"enabled\": true, "
         "\"curriculum_metrics\": {}}}}}",
     1, "data_efficiency.data_sampling.curriculum_learning.enabled",
     "data_efficiency.data_sampling.curriculum_learning.enabled true: accepted, not used yet: this version trains "
     "without curriculum data sampling", "data_efficiency.data_sampling"},
    /* switches that cannot change what is trained: a line each (MoQ, which eigenvalues serve, is
       refused; there is nothing to compile) */
    {TB8 "\"eigenvalue\": {\"enabled\": true, \"max_iter\": 50}}", 1, "eigenvalue.enabled",
     "eigenvalue.enabled true: accepted, not used yet: this version trains without Hessian eigenvalues, which "
     "DeepSpeed computes only to schedule quantize_training (MoQ)", "eigenvalue"},
    {TB8 "\"compile\": {\"deepcompile\": true, \"offload_opt_states\": true, \"passes\": [\"z3\"]}}", 1, "compile",
     "compile: accepted, not used yet: this version trains without compiling (ctrain runs its own kernels",
     "compile"},
    {TB8 "\"compile\": {\"enabled\": true, \"backend\": \"inductor\", \"kwargs\": {}}}", 1, "compile",
     "training is the same without it", "compile"},
    /* DeepSpeed's engine does not read it (the model's own layers do): a line, not the generic list */
    {TB8 "\"sparse_attention\": {\"mode\": \"fixed\", \"block\": 16}}", 1, "sparse_attention",
     "sparse_attention: accepted, not used yet: this version trains without block-sparse attention",
     "sparse_attention"},
};

/* The one "keys read but not used" warning, or "" when there is none. */
static const char *unused_warning(const loaded *l) {
    for (int i = 0; i < l->warn.n; i++)
        if (strstr(l->warn.items[i], "keys read but not used by ctrain: ")) return l->warn.items[i];
    return "";
}

/* ZeRO++ (stage 3's quantized and hierarchical communication): a line for each key switched on at
 * stage 3 with several ranks, in the file or by an override, pydantic's lax forms included; none
 * below stage 3 or in one process (the generic warning, or the stage line, speaks for them). */
START_TEST(not_yet_zeropp) {
    static const char *const on =
        "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true, "
        "\"zero_quantized_nontrainable_weights\": \"yes\", \"zero_quantized_gradients\": 1, "
        "\"zero_hpz_partition_size\": 8, \"round_robin_gradients\": true}}";
    loaded l = load(on, 2);
    assert_ok(l);
    static const char *const paths[] = {
        "zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_nontrainable_weights",
        "zero_optimization.zero_quantized_gradients", "zero_optimization.zero_hpz_partition_size"};
    ct_not_yet ny[CT_NOT_YET_MAX];
    int n = ct_config_not_yet(l.cfg, ny, CT_NOT_YET_MAX);
    ck_assert_int_eq(n, CT_ARRAY_LEN(paths));
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(ny[i].path, paths[i]);
        ck_assert_msg(strstr(ny[i].text, ": accepted, not used yet: this version trains without ZeRO++"), "%s",
                      ny[i].text);
        ck_assert_msg(strstr(unused_warning(&l), paths[i]) == NULL, "said twice: %s", unused_warning(&l));
    }
    ck_assert_msg(strstr(ny[3].text, "zero_hpz_partition_size 8: ") && strstr(ny[3].text, "among 8 ranks"), "%s",
                  ny[3].text);
    /* the key nothing speaks for stays in the generic warning */
    ck_assert_msg(strstr(unused_warning(&l), "zero_optimization.round_robin_gradients"), "%s", unused_warning(&l));
    unload(&l);

    /* switched on by an override only */
    const char *ov[] = {"zero_optimization.zero_quantized_gradients=true"};
    l = load_opts("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3}}", 2, ov, 1, false, false);
    assert_ok(l);
    n = ct_config_not_yet(l.cfg, ny, CT_NOT_YET_MAX);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(ny[0].path, "zero_optimization.zero_quantized_gradients");
    unload(&l);

    /* off, or an hpZ group of 1 (DeepSpeed's default), or below stage 3, or one process: no ZeRO++ line */
    static const struct {
        const char *text;
        int world;
    } quiet[] = {
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": false, "
         "\"zero_quantized_gradients\": \"off\", \"zero_hpz_partition_size\": 1}}", 2},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"zero_quantized_weights\": true}}", 2},
        {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true}}", 1},
    };
    for (int i = 0; i < CT_ARRAY_LEN(quiet); i++) {
        l = load(quiet[i].text, quiet[i].world);
        assert_ok(l);
        n = ct_config_not_yet(l.cfg, ny, CT_NOT_YET_MAX);
        for (int k = 0; k < n; k++)
            ck_assert_msg(strstr(ny[k].text, "ZeRO++") == NULL, "case %d: %s", i, ny[k].text);
        unload(&l);
    }
}
END_TEST


START_TEST(not_yet_lines) {
    const not_yet_case *c = &not_yet_cases[_i];
    loaded l = load(c->text, 1);
    assert_ok(l);
    ct_not_yet ny[CT_NOT_YET_MAX];
    int n = ct_config_not_yet(l.cfg, ny, CT_NOT_YET_MAX);
    ck_assert_msg(n == c->lines, "row %d: %d lines, expected %d", _i, n, c->lines);
    const ct_not_yet *hit = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(ny[i].path, c->path) == 0) hit = &ny[i];
    ck_assert_msg(hit != NULL, "row %d: no line for %s (first: %s)", _i, c->path, n ? ny[0].text : "none");
    ck_assert_msg(strstr(hit->text, c->says) != NULL, "row %d: line lacks \"%s\": %s", _i, c->says, hit->text);
    ck_assert_msg(strncmp(hit->text, c->path, strlen(c->path)) == 0, "row %d: line does not start with its key: %s",
                  _i, hit->text);
    ck_assert_msg(strchr(hit->text, '\n') == NULL, "row %d: not one line: %s", _i, hit->text);
    if (c->not_in_unused)
        ck_assert_msg(strstr(unused_warning(&l), c->not_in_unused) == NULL, "row %d: said twice: %s", _i,
                      unused_warning(&l));
    unload(&l);
}
END_TEST

/* Nothing switched on: no line, and the generic warning keeps the sections; offload that DeepSpeed
 * ignores at the given stage is no line either; a partly covered section keeps its other members. */
START_TEST(not_yet_only_when_on) {
    static const struct {
        const char *text;
        int lines;
        const char *unused; /* in the generic warning (NULL: no check) */
    } cases[] = {
        {"{\"train_batch_size\": 8}", 0, NULL},
        {"{\"train_batch_size\": 8, \"wall_clock_breakdown\": true}", 0, NULL}, /* acted on: phase timers */
        {TB8 "\"zero_optimization\": {\"stage\": 0, \"round_robin_gradients\": true}}", 0,
         "zero_optimization.round_robin_gradients"},
        {TB8 "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}", 0, NULL}, /* stage 0 */
        /* optimizer offload is done (core/zero/offload.c); one process then has something to offload,
           so no stage line either: the trainer says what happens once it knows the device */
        {TB8 "\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"nvme_path\": \"/x\"}}}",
         0, NULL},
        {TB8 "\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}", 0, NULL}, /* the deprecated form */
        /* parameter offload too: the trainer says what it does (one process: the stage line stays) */
        {TB8 "\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", \"max_in_cpu\": 5}}}", 1, NULL},
        {TB8 "\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}", 1, NULL},
        /* profile and synchronize_checkpoint_boundary are acted on (core/graph/exec.c): not listed */
        {TB8 "\"activation_checkpointing\": {\"profile\": true, \"number_checkpoints\": null, "
             "\"partition_activations\": false, \"synchronize_checkpoint_boundary\": true}}", 0, NULL},
        {TB8 "\"activation_checkpointing\": {\"number_checkpoints\": 0}}", 0, NULL},
        /* checkpointing is done, and partitioning is a no-op without model parallelism: no line, and
           only the keys still not acted on are listed as read but not used */
        {TB8 "\"activation_checkpointing\": {\"number_checkpoints\": 4, \"partition_activations\": true, "
             "\"contiguous_memory_optimization\": true}, \"model\": {\"layers\": [{\"type\": \"relu\", "
             "\"checkpoint\": true}]}}", 0, NULL},
        /* the profiler is acted on; only recompute_fwd_factor is read but not used */
        {TB8 "\"flops_profiler\": {\"enabled\": true, \"profile_step\": 3}}", 0, NULL},
        {TB8 "\"flops_profiler\": {\"enabled\": false, \"recompute_fwd_factor\": 1}}", 0,
         "flops_profiler.recompute_fwd_factor"},
        /* activation offload is done: no line with segments to offload (number_checkpoints, or a
           mark anywhere in the model), and the keys not acted on are still listed */
        {TB8 "\"activation_checkpointing\": {\"cpu_checkpointing\": true, \"number_checkpoints\": 2, "
             "\"profile\": true}}", 0, NULL},
        {TB8 "\"activation_checkpointing\": {\"cpu_checkpointing\": true}, \"model\": {\"layers\": [{\"type\": "
             "\"repeat\", \"times\": 2, \"layers\": [{\"type\": \"relu\", \"checkpoint\": true}]}]}}", 0, NULL},
        {TB8 "\"curriculum_learning\": {\"enabled\": false}}", 0, "curriculum_learning"},
        {TB8 "\"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"seqlen\", \"min_difficulty\": 8, "
             "\"max_difficulty\": 64, \"schedule_type\": \"fixed_linear\", \"schedule_config\": "
             "{\"total_curriculum_step\": 10, \"difficulty_step\": 8}}}", 0, NULL},
        {TB8 "\"data_efficiency\": {\"enabled\": true, \"data_routing\": {\"enabled\": true}}}", 0, "data_efficiency"},
        {TB8 "\"data_efficiency\": {\"data_routing\": {}, \"data_sampling\": {\"enabled\": true, "
             "\"curriculum_learning\": {\"enabled\": true, \"curriculum_metrics\": {}}}}}",
         1, "data_efficiency.data_routing"},
        {TB8 "\"wall_clock_breakdown\": false, \"model\": {\"layers\": [{\"type\": \"relu\", \"checkpoint\": false}]}}",
         0, NULL},
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++) {
        loaded l = load(cases[i].text, 1);
        assert_ok(l);
        int n = ct_config_not_yet(l.cfg, NULL, 0);
        ck_assert_msg(n == cases[i].lines, "case %d: %d lines, expected %d", i, n, cases[i].lines);
        if (cases[i].unused)
            ck_assert_msg(strstr(unused_warning(&l), cases[i].unused), "case %d: generic warning lacks %s: %s", i,
                          cases[i].unused, unused_warning(&l));
        unload(&l);
    }
    /* data_efficiency partly covered: its curriculum has a line, its other members stay listed */
    loaded l = load(cases[CT_ARRAY_LEN(cases) - 2].text, 1);   /* the data_sampling case */
    ck_assert_msg(strstr(unused_warning(&l), "data_efficiency.data_sampling") == NULL, "%s", unused_warning(&l));
    unload(&l);
}
END_TEST

/* Every setting at once: all the lines, in the documented order; `max` bounds what is written. */
START_TEST(not_yet_all_and_max) {
    static const char *const all =
        "{\"train_batch_size\": 8, \"wall_clock_breakdown\": true, \"flops_profiler\": {\"enabled\": true},\n"
        " \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"},\n"
        "   \"offload_param\": {\"device\": \"cpu\"}},\n"
        " \"activation_checkpointing\": {\"partition_activations\": true, \"cpu_checkpointing\": true,\n"
        "   \"number_checkpoints\": 2},\n"
        " \"curriculum_learning\": {\"enabled\": true, \"curriculum_type\": \"vocab\", \"min_difficulty\": 1,\n"
        "   \"max_difficulty\": 3, \"schedule_type\": \"fixed_discrete\",\n"
        "   \"schedule_config\": {\"difficulty\": [1, 2, 3], \"max_step\": [5, 10]}},\n"
        " \"data_efficiency\": {\"data_sampling\": {\"curriculum_learning\": {\"enabled\": true,\n"
        "   \"curriculum_metrics\": {}}}},\n"
        " \"eigenvalue\": {\"enabled\": true}, \"compile\": {\"deepcompile\": true},\n"
        " \"model\": {\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 2, \"checkpoint\": true}]}}";
    loaded l = load(all, 1);
    assert_ok(l);
    static const char *const order[] = {
        "curriculum_learning.curriculum_type", "data_efficiency.data_sampling.curriculum_learning.enabled",
        "eigenvalue.enabled", "compile"};
    ct_not_yet ny[CT_NOT_YET_MAX];
    int n = ct_config_not_yet(l.cfg, ny, CT_NOT_YET_MAX);
    ck_assert_int_eq(n, CT_ARRAY_LEN(order));
    ck_assert_int_le(n, CT_NOT_YET_MAX);
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(ny[i].path, order[i]);
        ck_assert_msg(strstr(ny[i].text, ": accepted, not used yet: "), "%s", ny[i].text);
    }
    ct_not_yet two[3];
    memset(two, 0, sizeof two);
    ck_assert_int_eq(ct_config_not_yet(l.cfg, two, 1), n); /* the count, even past max */
    ck_assert_str_eq(two[0].path, order[0]);
    ck_assert_str_eq(two[1].path, "");                        /* nothing past max written */
    ck_assert_int_eq(ct_config_not_yet(l.cfg, NULL, 0), n);
    ck_assert_int_eq(ct_config_not_yet(NULL, NULL, 0), 0);
    /* none of these sections is also in the generic warning */
    const char *u = unused_warning(&l);
    static const char *const said[] = {"zero_optimization", "activation_checkpointing", "flops_profiler",
                                       "curriculum_learning", "data_efficiency", "eigenvalue", "compile"};
    for (int i = 0; i < CT_ARRAY_LEN(said); i++) ck_assert_msg(strstr(u, said[i]) == NULL, "said twice: %s", u);
    unload(&l);
}
END_TEST

/* A feature that asks for another kind of training is refused only when on: present and off (enabled
 * false, one stage, one rank, a pass that does not split the model), every one of them is accepted,
 * known (no "unknown key"), gives no line of its own, and is listed as read but not used. */
START_TEST(other_kinds_off_accepted) {
    loaded l = load(TB8 "\"progressive_layer_drop\": {\"enabled\": false, \"theta\": 0.5},\n"
                    " \"data_efficiency\": {\"data_routing\": {\"random_ltd\": {\"enabled\": false}}},\n"
                    " \"quantize_training\": {\"quantize_bits\": {\"start_bits\": 12}},\n"
                    " \"compression_training\": {\"weight_quantization\": {\"shared_parameters\": {\"enabled\": false}},\n"
                    "   \"layer_reduction\": {\"enabled\": false}},\n"
                    " \"autotuning\": {\"enabled\": false}, \"torch_autocast\": {\"enabled\": false, \"dtype\": \"bf16\"},\n"
                    " \"pipeline\": {\"stages\": \"auto\", \"seed_layers\": false},\n"
                    " \"tensor_parallel\": {\"autotp_size\": 1, \"tp\": {\"tp_size\": 1}}, \"sequence_parallel_size\": 1,\n"
                    " \"compile\": {\"deepcompile\": false, \"passes\": [\"z1\"]}, \"eigenvalue\": {\"enabled\": false},\n"
                    " \"checkpoint\": {\"load_universal\": false}, \"amp\": {\"enabled\": false},\n"
                    " \"elasticity\": {\"enabled\": false}}", 8);
    assert_ok(l);
    ck_assert_int_eq(ct_config_not_yet(l.cfg, NULL, 0), 0);
    ck_assert_msg(!has_warning(&l, "unknown key"), "a known section warned as unknown");
    const char *u = unused_warning(&l);
    static const char *const listed[] = {"progressive_layer_drop", "data_efficiency", "quantize_training",
                                         "compression_training", "autotuning", "torch_autocast", "pipeline",
                                         "tensor_parallel", "compile", "eigenvalue", "amp", "elasticity"};
    for (int i = 0; i < CT_ARRAY_LEN(listed); i++)
        ck_assert_msg(strstr(u, listed[i]), "%s not listed as read but not used: %s", listed[i], u);
    unload(&l);
    /* a misspelt compile key warns with the right one (DeepSpeed's section grows: not an error) */
    l = load(TB8 "\"compile\": {\"deepcompil\": true}}", 1);
    assert_ok(l);
    assert_warn_has(l, "did you mean compile.deepcompile?");
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
    ck_assert_int_eq(ct_config_check(&(ct_config_opts){.path = path, .world_size = 4}, f, &w, &e), CT_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "64 = micro 8 × accumulation 2 × world 4"), "%s", buf);
    ck_assert_msg(strstr(buf, "micro: derived"), "%s", buf);
    ck_assert_msg(strstr(buf, "fp16, dynamic loss scale 2^16"), "%s", buf);
    /* ZeRO stage 2 over 4 ranks partitions: said as active, with no "not used yet" line */
    ck_assert_msg(strstr(buf, "zero       stage 2 over 4 ranks: fp32 master and optimizer state split 4 ways, "
                              "gradients reduce-scattered"), "%s", buf);
    ck_assert_msg(!strstr(buf, "accepted, not used yet"), "%s", buf);
    ct_warnings_free(&w);
    /* in one process: what the file asks for, said to be not used yet, and the line under the heading */
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf, "w");
    ck_assert_int_eq(ct_config_check(&(ct_config_opts){.path = path, .world_size = 1}, f, &w, &e), CT_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "zero       asks for stage 2, offload optimizer: none, offload params: none; not used "
                              "yet"), "%s", buf);
    ck_assert_msg(strstr(buf, "\naccepted, not used yet:\n  zero_optimization.stage 2: accepted, not used yet: one "
                              "process has nothing to partition"), "%s", buf);
    ck_assert_msg(!strstr(buf, "zero       stage 2 over"), "%s", buf); /* not printed as if active */
    ct_warnings_free(&w);
    /* stage 3 over ranks partitions too (it was printed as "not used yet" before it ran) */
    path = write_file("c3.json", "{\"train_batch_size\": 64, \"zero_optimization\": {\"stage\": 3}}");
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf, "w");
    ck_assert_int_eq(ct_config_check(&(ct_config_opts){.path = path, .world_size = 2}, f, &w, &e), CT_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "zero       stage 3 over 2 ranks: fp32 master and optimizer state split 2 ways, "
                              "gradients reduce-scattered, parameters gathered layer by layer"), "%s", buf);
    ck_assert_msg(!strstr(buf, "not used yet"), "%s", buf);
    ct_warnings_free(&w);
    /* nothing switched on: no heading */
    path = write_file("c.json", "{\"train_batch_size\": 64}");
    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf, "w");
    ck_assert_int_eq(ct_config_check(&(ct_config_opts){.path = path, .world_size = 1}, f, &w, &e), CT_OK);
    fclose(f);
    ck_assert_msg(strstr(buf, "zero       stage 0 (off)\n"), "%s", buf);
    ck_assert_msg(!strstr(buf, "not used yet"), "%s", buf);
    ct_warnings_free(&w);
}
END_TEST

/* The keys outside an experiment's identity come from the flags on the rows (a key's
 * CT_NOT_IDENTITY, a section's, the batch split's): each of them is in docs/checkpoints.md's
 * list, and what defines an experiment (optimizer, seed, batch size) is not among them. */
START_TEST(not_identity_is_documented) {
    loaded l = load_opts(
        "{\"train_batch_size\": 8, \"steps_per_print\": 5, \"optimizer\": {\"type\": \"SGD\", \"params\": "
        "{\"lr\": 0.1}}, \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}, "
        "\"offload_param\": {\"device\": \"none\"}}, \"aio\": {}, \"tensorboard\": {}, \"comet\": {}, "
        "\"train\": {\"epochs\": 1, \"seed\": 3, \"early_stopping\": {\"patience\": 2}}, \"data\": {\"workers\": 1}}",
        1, NULL, 0, false, false);
    ck_assert_msg(l.rc == CT_OK, "%s", l.err.msg);
    char *doc = ct_fs_read_small("docs/checkpoints.md", 1 << 20, NULL);
    ck_assert_msg(doc != NULL, "docs/checkpoints.md: cannot read it (run from the repository root)");
    const char *list = strstr(doc, "Two configs are the same experiment");
    ck_assert_ptr_nonnull(list);
    const char *end = strstr(list, "\n\n-");
    end = end ? strstr(end + 2, "\n\n") : NULL;
    ck_assert_ptr_nonnull(end);
    for (int i = 0; i < l.cfg->n_not_identity; i++) {
        char quoted[200];
        snprintf(quoted, sizeof quoted, "`%s`", l.cfg->not_identity[i]);
        const char *at = strstr(list, quoted);
        ck_assert_msg(at && at < end, "docs/checkpoints.md's list of keys outside the experiment lacks %s", quoted);
    }
    const char *in[] = {"train.run_dir", "train.epochs", "train.cuda_graph", "train_micro_batch_size_per_gpu",
                        "data.transform.on_device", "aio", "comet", "train.early_stopping",
                        "zero_optimization.offload_optimizer.nvme_path"};
    const char *out[] = {"optimizer", "optimizer.params.lr", "train.seed", "train_batch_size", "zero_optimization",
                         "zero_optimization.offload_optimizer.device", "data"};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < (k ? CT_ARRAY_LEN(out) : CT_ARRAY_LEN(in)); j++) {
            const char *path = k ? out[j] : in[j];
            bool found = false;
            for (int i = 0; i < l.cfg->n_not_identity; i++) found |= strcmp(l.cfg->not_identity[i], path) == 0;
            ck_assert_msg(found == !k, "%s: %s the experiment's identity", path, k ? "left out of" : "part of");
        }
    free(doc);
    unload(&l);
}
END_TEST

/* Every key of every section table a config with every section reads (cfg->rows, the reader's
 * rows) is in docs/config.md, in backquotes as its dotted path or its own name: a row added
 * without its doc row fails here, naming it. */
START_TEST(every_row_is_documented) {
    loaded l = load_opts(
        "{\"train_batch_size\": 8, \"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": false}, "
        "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, \"scheduler\": {\"type\": "
        "\"WarmupLR\", \"params\": {}}, \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": "
        "{\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"none\"}}, \"aio\": {}, \"tensorboard\": {}, "
        "\"csv_monitor\": {}, \"wandb\": {}, \"comet\": {}, \"flops_profiler\": {}, \"checkpoint\": {}, "
        "\"activation_checkpointing\": {}, \"train\": {\"epochs\": 1, \"early_stopping\": {\"patience\": 2}}, "
        "\"data\": {\"workers\": 1}}",
        1, NULL, 0, false, false);
    ck_assert_msg(l.rc == CT_OK, "%s", l.err.msg);
    ck_assert_int_gt(l.cfg->n_rows, 100);
    char *doc = ct_fs_read_small("docs/config.md", 1 << 20, NULL);
    ck_assert_msg(doc != NULL, "docs/config.md: cannot read it (run from the repository root)");
    for (int i = 0; i < l.cfg->n_rows; i++) {
        const char *path = l.cfg->rows[i], *dot = strrchr(path, '.');
        char full[200], own[100];
        snprintf(full, sizeof full, "`%s`", path);
        snprintf(own, sizeof own, "`%s`", dot ? dot + 1 : path);
        ck_assert_msg(strstr(doc, full) || strstr(doc, own), "docs/config.md does not name %s", full);
    }
    free(doc);
    unload(&l);
}
END_TEST

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_config_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    Suite *su = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, batch_derivations);
    tcase_add_test(tc, curriculum_kept);
    tcase_add_test(tc, override_forms);
    tcase_add_test(tc, override_replaces_in_place);
    tcase_add_test(tc, override_array_index);
    tcase_add_test(tc, override_value_keeps_equals);
    tcase_add_test(tc, auto_resolution);
    tcase_add_test(tc, typo_suggestions);
    tcase_add_test(tc, override_typos_refused);
    tcase_add_test(tc, null_means_not_set);
    tcase_add_test(tc, unused_keys_listed_once);
    tcase_add_test(tc, hjson_forms_warn);
    tcase_add_test(tc, pydantic_coercion);
    tcase_add_test(tc, defaults_in_resolved);
    tcase_add_test(tc, not_identity_is_documented);
    tcase_add_test(tc, every_row_is_documented);
    tcase_add_test(tc, sections_from_files);
    tcase_add_loop_test(tc, config_errors, 0, CT_ARRAY_LEN(err_cases));
    tcase_add_loop_test(tc, not_yet_lines, 0, CT_ARRAY_LEN(not_yet_cases));
    tcase_add_test(tc, not_yet_only_when_on);
    tcase_add_test(tc, not_yet_zeropp);
    tcase_add_test(tc, not_yet_all_and_max);
    tcase_add_test(tc, other_kinds_off_accepted);
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

/* test_amp.c: mixed precision.
 *
 *  - the loss scaler: scales, hysteresis budgets and skips over scripted overflow patterns,
 *    expected values written out from DeepSpeed's rule (core/optim/amp.h);
 *  - round_to and the 16-bit casts against the scalar conversions of core/util/tensor.h on random
 *    values, ties, subnormals, overflow, inf and NaN;
 *  - an overflowing update leaves parameters, optimizer state and the LR schedule bitwise as they
 *    were (optimizer alone, and a whole fp16 run under a huge static scale);
 *  - an overflow at the minimum scale ends the run with CT_ERR_DIVERGED and says what to do;
 *  - a model whose fp16 gradients underflow: with loss scale 1 nothing moves, with the dynamic
 *    scaler it learns;
 *  - an fp16 forward that overflows (inputs above 65504) skips steps like a gradient overflow
 *    instead of ending the run as diverged; bf16 trains on the same data.
 * The trainer and optimizer tests run on CT_TEST_DEVICE ("cpu" unless set; `make test-cuda` runs
 * this binary again with "cuda"). Run from the repository root. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/dataset.h"
#include "core/cpu/cpu.h"
#include "core/device/device.h"
#include "core/optim/amp.h"
#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/optim/optim.h"
#include "core/params/store.h"
#include "core/util/rng.h"
#include "core/train/train.h"
#include "test/test_device.h"

static char tmpdir[256];

/* The device of the trainer and optimizer tests. */

/* ---- the scaler ---- */

typedef struct scaler_row {
    bool overflow;
    double scale;                /* after the update */
    int budget;
    ct_scale_event ev;
} scaler_row;

static void run_script(ct_loss_scaler *s, const scaler_row *rows, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        ct_scale_event ev = ct_scaler_update(s, rows[i].overflow);
        ck_assert_msg(ev == rows[i].ev && s->scale == rows[i].scale && s->budget == rows[i].budget,
                      "%s, update %d (overflow %d): event %d scale %g budget %d, expected %d %g %d", what,
                      i, rows[i].overflow, ev, s->scale, s->budget, rows[i].ev, rows[i].scale,
                      rows[i].budget);
    }
}

/* Short names for the expected events in the tables below. */
#define K CT_SCALE_KEPT
#define D CT_SCALE_DOUBLED
#define H CT_SCALE_HYSTERESIS
#define X CT_SCALE_HALVED

START_TEST(scaler_hysteresis_not_consecutive) {
    /* init 16, window 4, min 1, hysteresis 2. Clean updates 0-3: the 4th since the start
     * doubles. An overflow only spends the budget (2 -> 1); without consecutive_hysteresis it is
     * refilled only by a doubling, so the next overflows halve, each of them. 4 clean updates
     * after the last overflow double again and refill. */
    static const scaler_row rows[] = {
        {false, 16, 2, K}, {false, 16, 2, K}, {false, 16, 2, K}, {false, 32, 2, D},
        {true, 32, 1, H},  {false, 32, 1, K}, {false, 32, 1, K}, {true, 16, 1, X},
        {true, 8, 1, X},   {false, 8, 1, K},  {false, 8, 1, K},  {false, 8, 1, K},
        {false, 16, 2, D}, {false, 16, 2, K}, {false, 16, 2, K}, {false, 16, 2, K},
        {false, 32, 2, D}, {true, 32, 1, H},  {false, 32, 1, K}, {false, 32, 1, K},
        {false, 32, 1, K}, {false, 64, 2, D},
    };
    ct_loss_scaler s;
    ct_scaler_init_dynamic(&s, 16, 4, 1, 2, false);
    run_script(&s, rows, (int)(sizeof rows / sizeof rows[0]), "hysteresis 2");
    ck_assert_int_eq(s.iter, 22);
}
END_TEST

START_TEST(scaler_hysteresis_consecutive) {
    /* consecutive_hysteresis: every clean update refills the budget, so only 2 overflows in a
     * row halve; the window counts from the last overflow. */
    static const scaler_row rows[] = {
        {true, 16, 1, H},  {false, 16, 2, K}, {true, 16, 1, H},  {true, 8, 1, X},
        {false, 8, 2, K},  {false, 8, 2, K},  {false, 8, 2, K},  {false, 16, 2, D},
        {true, 16, 1, H},  {true, 8, 1, X},   {true, 4, 1, X},   {false, 4, 2, K},
    };
    ct_loss_scaler s;
    ct_scaler_init_dynamic(&s, 16, 4, 1, 2, true);
    run_script(&s, rows, (int)(sizeof rows / sizeof rows[0]), "consecutive");
}
END_TEST

START_TEST(scaler_minimum_and_static) {
    /* hysteresis 1: every overflow halves, clamped at min; the next one at min is fatal. */
    static const scaler_row rows[] = {{true, 1.5, 1, X}, {true, 1, 1, X}};
    ct_loss_scaler s;
    ct_scaler_init_dynamic(&s, 3, 1000, 1, 1, false);
    run_script(&s, rows, 2, "min");
    ck_assert_int_eq(ct_scaler_update(&s, true), CT_SCALE_AT_MIN);
    ck_assert(s.scale == 1);

    /* An overflow that only spends budget at the minimum is not fatal. */
    ct_scaler_init_dynamic(&s, 1, 1000, 1, 2, false);
    ck_assert_int_eq(ct_scaler_update(&s, true), CT_SCALE_HYSTERESIS);
    ck_assert_int_eq(ct_scaler_update(&s, true), CT_SCALE_AT_MIN);

    /* window 1: every clean update doubles, without bound. */
    ct_scaler_init_dynamic(&s, 4, 1, 1, 2, false);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ct_scaler_update(&s, false), CT_SCALE_DOUBLED);
    ck_assert(s.scale == 128);

    /* Static: never changes, overflows are skips. */
    ct_scaler_init_static(&s, 8);
    ck_assert_int_eq(ct_scaler_update(&s, true), CT_SCALE_STATIC_SKIP);
    for (int i = 0; i < 3000; i++) ck_assert_int_eq(ct_scaler_update(&s, false), CT_SCALE_KEPT);
    ck_assert(s.scale == 8);

    /* From the config: documented defaults; loss_scale > 0 is static. */
    ct_fp16_cfg c = {.enabled = true, .loss_scale = 0, .initial_scale_power = 16, .loss_scale_window = 1000,
                     .hysteresis = 2, .consecutive_hysteresis = false, .min_loss_scale = 1};
    ct_scaler_init_config(&s, &c);
    ck_assert(s.dynamic && s.scale == 65536 && s.window == 1000 && s.budget == 2 && s.min_scale == 1);
    c.loss_scale = 128;
    ct_scaler_init_config(&s, &c);
    ck_assert(!s.dynamic && s.scale == 128);
}
END_TEST

START_TEST(scaler_checkpoint_round_trip) {
    /* Saving (scale, good steps, budget) and restoring gives the same future. */
    ct_rng r;
    ct_rng_init(&r, 11, CT_RNG_AUGMENT, 5);
    for (int trial = 0; trial < 50; trial++) {
        ct_loss_scaler a, b;
        ct_scaler_init_dynamic(&a, 1024, 3, 1, 2, trial & 1);
        int cut = (int)ct_rng_below(&r, 20);
        for (int i = 0; i < cut; i++) ct_scaler_update(&a, ct_rng_below(&r, 4) == 0);
        ct_scaler_init_dynamic(&b, 1024, 3, 1, 2, trial & 1);
        ct_scaler_restore(&b, a.scale, ct_scaler_good_steps(&a), a.budget);
        for (int i = 0; i < 30; i++) {
            bool o = ct_rng_below(&r, 4) == 0;
            ck_assert_int_eq(ct_scaler_update(&a, o), ct_scaler_update(&b, o));
            ck_assert(a.scale == b.scale && a.budget == b.budget);
        }
    }
}
END_TEST

/* ---- round_to and the casts ---- */

static bool same_value(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;   /* signed zeros must match too */
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n values covering fp16's and bf16's edges: random magnitudes from 2^-30 to 2^20, exact ties
 * between neighbouring fp16 and bf16 values (normal and subnormal), the overflow threshold, the
 * smallest subnormals, zeros, infinities and NaN. */
static float *edge_values(int64_t n, uint64_t seed) {
    float *x = malloc((size_t)n * sizeof *x);
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_AUGMENT, 1);
    static const float fixed[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e6f, 5.96e-8f,
                                  2.98e-8f, 2.9802322e-8f, 8.9406967e-8f, 6.1035156e-5f, 6.1e-5f};
    int nf = (int)(sizeof fixed / sizeof fixed[0]);
    for (int64_t i = 0; i < n; i++) {
        uint32_t kind = ct_rng_below(&r, 8);
        uint32_t sign = ct_rng_below(&r, 2) << 31;
        if (i < nf) {
            x[i] = fixed[i];
        } else if (kind == 0) {              /* fp16 tie: odd multiple of half an fp16 ulp */
            uint32_t e = 103 + ct_rng_below(&r, 40), m = ct_rng_u32(&r) & 0x7fe000u;
            x[i] = bits_f32(sign | e << 23 | m | 0x1000u);
        } else if (kind == 1) {              /* bf16 tie */
            uint32_t e = 1 + ct_rng_below(&r, 253), m = ct_rng_u32(&r) & 0x7f0000u;
            x[i] = bits_f32(sign | e << 23 | m | 0x8000u);
        } else if (kind == 2) {              /* fp16 subnormal range, random bits */
            x[i] = bits_f32(sign | (96 + ct_rng_below(&r, 17)) << 23 | (ct_rng_u32(&r) & 0x7fffffu));
        } else if (kind == 3) {
            static const float specials[] = {INFINITY, -INFINITY, NAN, 65520.0f, 65519.996f, 1e-9f};
            x[i] = specials[ct_rng_below(&r, 6)];
        } else {                             /* random magnitude 2^-30 .. 2^20 */
            x[i] = bits_f32(sign | (97 + ct_rng_below(&r, 51)) << 23 | (ct_rng_u32(&r) & 0x7fffffu));
        }
    }
    return x;
}

START_TEST(round_to_matches_scalar) {
    ct_backend *be = ct_cpu_backend_create(2);
    int64_t n = 300007;      /* several threads' chunks and a tail shorter than a vector */
    float *x = edge_values(n, 7), *y = malloc((size_t)n * sizeof *y);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    float *back = malloc((size_t)n * sizeof *back);
    ct_dtype dts[2] = {CT_F16, CT_BF16};
    for (int d = 0; d < 2; d++) {
        memcpy(y, x, (size_t)n * sizeof *y);
        be->elt.round_to(be, y, n, dts[d]);
        be->elt.cast(be, h, dts[d], x, CT_F32, n);
        be->elt.cast(be, back, CT_F32, h, dts[d], n);
        for (int64_t i = 0; i < n; i++) {
            float want = dts[d] == CT_F16 ? ct_f16_to_f32(ct_f32_to_f16(x[i]))
                                          : ct_bf16_to_f32(ct_f32_to_bf16(x[i]));
            uint16_t hw = dts[d] == CT_F16 ? ct_f32_to_f16(x[i]) : ct_f32_to_bf16(x[i]);
            ck_assert_msg(same_value(y[i], want), "%s round_to(%a) = %a, expected %a", ct_dtype_name(dts[d]),
                          (double)x[i], (double)y[i], (double)want);
            ck_assert_msg(isnan(x[i]) || h[i] == hw, "%s cast(%a) = 0x%04x, expected 0x%04x",
                          ct_dtype_name(dts[d]), (double)x[i], h[i], hw);
            ck_assert_msg(same_value(back[i], want), "%s cast back of %a", ct_dtype_name(dts[d]), (double)x[i]);
        }
    }
    /* Spot checks of the rule itself (not only agreement): ties to even, overflow, underflow. */
    float s[6] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65520.0f, 0x1p-25f, 0x1.8p-24f, -0x1p-26f};
    be->elt.round_to(be, s, 6, CT_F16);
    ck_assert(s[0] == 1.0f && s[1] == 1.0f + 0x1p-9f && isinf(s[2]) && s[3] == 0.0f &&
              s[4] == 0x1p-23f && s[5] == 0.0f && signbit(s[5]));
    /* CT_F32 leaves values alone. */
    memcpy(y, x, (size_t)n * sizeof *y);
    be->elt.round_to(be, y, n, CT_F32);
    ck_assert(memcmp(x, y, (size_t)n * sizeof *y) == 0);
    free(x);
    free(y);
    free(h);
    free(back);
    ct_backend_destroy(be);
}
END_TEST

/* ---- configs and runs ---- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static ct_config *load_config(const char *path, const char *const *sets, int n_sets) {
    ct_config_opts o = {.path = path, .overrides = sets, .n_overrides = n_sets, .world_size = 1};
    o.formats = ct_dataset_formats(&o.n_formats);
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err err = {0};
    int rc = ct_config_load(&o, &cfg, &w, &err);
    ct_warnings_free(&w);
    ck_assert_msg(rc == CT_OK, "config %s: %s", path, err.msg);
    return cfg;
}

/* A regression whose targets are tiny: t = a . x with |a| ~ 5e-7 and x in [-1, 1), so
 * d(mean loss)/d(prediction) = 2 (p - t) / 512 stays below 2^-25 and every element rounds to 0
 * in fp16 without loss scaling. 2048 samples of 4 features. */
static void write_tiny_regression(const char *path) {
    static const double a[4] = {5e-7, -3e-7, 2e-7, 4e-7};
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("x0,x1,x2,x3,y\n", f);
    ct_rng r;
    ct_rng_init(&r, 21, CT_RNG_AUGMENT, 2);
    for (int i = 0; i < 2048; i++) {
        double t = 0;
        for (int j = 0; j < 4; j++) {
            double x = ct_rng_uniform(&r) * 2 - 1;
            t += a[j] * x;
            fprintf(f, "%.9g,", x);
        }
        fprintf(f, "%.9g\n", t);
    }
    fclose(f);
}

/* Features around 7e4, beyond fp16's largest finite value (65504): the 16-bit copy of the input
 * is infinite. Targets are small. 512 samples. */
static void write_huge_inputs(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("x0,x1,x2,x3,y\n", f);
    ct_rng r;
    ct_rng_init(&r, 22, CT_RNG_AUGMENT, 3);
    for (int i = 0; i < 512; i++) {
        for (int j = 0; j < 4; j++) fprintf(f, "%.9g,", 7e4 * (1 + ct_rng_uniform(&r)));
        fprintf(f, "%.9g\n", ct_rng_uniform(&r));
    }
    fclose(f);
}

/* fp16: the "fp16" object ("bf16": ... too when it starts with "X"); steps: max_steps. */
static ct_config *regression_config_on(const char *csv_name, const char *fp16, double lr, int steps) {
    char csv[512], path[512], text[2048];
    snprintf(csv, sizeof csv, "%s/%s", tmpdir, csv_name);
    if (access(csv, R_OK) != 0) {
        if (strcmp(csv_name, "huge.csv") == 0) write_huge_inputs(csv);
        else write_tiny_regression(csv);
    }
    snprintf(path, sizeof path, "%s/reg.json", tmpdir);
    /* a run directory per config (ctrain refuses one holding another's run); tests run forked */
    static int runs;
    snprintf(text, sizeof text,
             "{\"train_batch_size\": 512, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": %g}},\n"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10, \"warmup_max_lr\": %g}},\n"
             " %s,\n"
             " \"model\": {\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"fc\", \"out\": 1, "
             "\"bias\": false}], \"loss\": {\"type\": \"mse\"}},\n"
             " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}},\n"
             " \"train\": {\"max_steps\": %d, \"seed\": 5, \"device\": \"%s\", \"threads\": 2, "
             "\"run_dir\": \"%s/run%ld-%d\"}}\n",
             lr, lr, fp16, csv, steps, test_device(), tmpdir, (long)getpid(), ++runs);
    write_text(path, text);
    return load_config(path, NULL, 0);
}

static ct_config *regression_config(const char *fp16, double lr, int steps) {
    char sec[256];
    snprintf(sec, sizeof sec, "\"fp16\": %s", fp16);
    return regression_config_on("tiny.csv", sec, lr, steps);
}

typedef struct run_out {
    double first_loss, last_loss;
    float *p0, *p1;              /* parameters before and after */
    float *m1, *v1;              /* Adam moments after */
    long applied, sched_t;
    double next_lr;
    int64_t n;
    ct_summary sum;
    int rc;
    char msg[sizeof(((ct_err *)0)->msg)];
} run_out;

static void on_step(void *ctx, long step, double loss) {
    run_out *o = ctx;
    if (step == 1) o->first_loss = loss;
    o->last_loss = loss;
}

/* A host copy of n floats of backend memory. */
static float *copy_of(ct_backend *be, const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof *y);
    be->mem.copy_d2h(be, y, x, (size_t)n * sizeof *y);
    return y;
}

/* zero_init: start from zero weights (else the default init). */
static run_out run_trainer(const ct_config *cfg, bool zero_init) {
    run_out o = {.first_loss = NAN, .last_loss = NAN};
    ct_run_opts opts = {.quiet = true};
    ct_trainer *t = NULL;
    ct_err err = {0};
    int rc = ct_trainer_open(cfg, &opts, &o.sum, &t, &err);
    ck_assert_msg(rc == CT_OK, "open: %s", err.msg);
    ct_optim *opt = ct_trainer_optim(t);
    ct_param_store *ps = ct_trainer_params(t);
    ct_backend *be = ct_trainer_backend(t);
    o.n = ps->hi - ps->lo;
    if (zero_init) be->mem.memset0(be, ps->master, (size_t)o.n * sizeof(float));
    o.p0 = copy_of(be, ps->master, o.n);
    ct_trainer_on_step(t, on_step, &o);
    o.rc = ct_trainer_fit(t, &err);
    snprintf(o.msg, sizeof o.msg, "%s", err.msg);
    o.p1 = copy_of(be, ps->master, o.n);
    o.m1 = opt->m ? copy_of(be, opt->m, o.n) : NULL;
    o.v1 = opt->v ? copy_of(be, opt->v, o.n) : NULL;
    o.applied = opt->applied;
    o.sched_t = opt->sched_t;
    o.next_lr = ct_optim_next_lr(opt);
    ct_trainer_close(t);
    return o;
}

static void run_free(run_out *o) {
    free(o->p0);
    free(o->p1);
    free(o->m1);
    free(o->v1);
}

START_TEST(underflow_needs_scaling) {
    /* Loss scale 1: every gradient of the prediction rounds to 0 in fp16, so Adam sees zero
     * gradients and the weights stay bitwise as they were. */
    ct_config *cfg = regression_config("{\"enabled\": true, \"loss_scale\": 1}", 2e-8, 40);
    run_out a = run_trainer(cfg, true);
    ck_assert_msg(a.rc == CT_OK, "%s", a.msg);
    ck_assert(memcmp(a.p0, a.p1, (size_t)a.n * sizeof(float)) == 0);
    ck_assert_msg(a.first_loss > 0 && a.last_loss > 0.5 * a.first_loss, "loss %g -> %g", a.first_loss,
                  a.last_loss);   /* other batches, the same weights */
    ct_config_free(cfg);

    /* Dynamic scaling (2^16): the same run learns. */
    cfg = regression_config("{\"enabled\": true}", 2e-8, 40);
    run_out b = run_trainer(cfg, true);
    ck_assert_msg(b.rc == CT_OK, "%s", b.msg);
    ck_assert_msg(b.last_loss < 0.2 * b.first_loss, "loss %g -> %g", b.first_loss, b.last_loss);
    ck_assert(b.sum.loss_scale == 65536 && b.sum.skipped_steps == 0);
    ct_config_free(cfg);

    /* fp32 as the yardstick: the same data learns there too (the model is fine; fp16 was not). */
    cfg = regression_config("{\"enabled\": false}", 2e-8, 40);
    run_out c = run_trainer(cfg, true);
    ck_assert_msg(c.last_loss < 0.2 * c.first_loss && isnan(c.sum.loss_scale), "fp32 loss %g -> %g",
                  c.first_loss, c.last_loss);
    ct_config_free(cfg);
    run_free(&a);
    run_free(&b);
    run_free(&c);
}
END_TEST

START_TEST(overflow_skips_whole_run) {
    /* A static scale of 1e30 overflows fp16 on every step: all skipped, nothing changes. */
    ct_config *cfg = regression_config("{\"enabled\": true, \"loss_scale\": 1e30}", 1e-3, 5);
    run_out o = run_trainer(cfg, false);
    ck_assert_msg(o.rc == CT_OK, "%s", o.msg);
    ck_assert(memcmp(o.p0, o.p1, (size_t)o.n * sizeof(float)) == 0);
    for (int64_t i = 0; i < o.n; i++) ck_assert(o.m1[i] == 0.0f && o.v1[i] == 0.0f);
    ck_assert_int_eq(o.applied, 0);
    ck_assert_int_eq(o.sched_t, -1);
    ck_assert_int_eq(o.sum.steps, 5);
    ck_assert_int_eq(o.sum.skipped_steps, 5);
    ck_assert(o.sum.loss_scale == 1e30);
    run_free(&o);
    ct_config_free(cfg);
}
END_TEST

START_TEST(overflow_at_minimum_exits) {
    /* 2^126 down to the minimum ~2^120 by halving (hysteresis 1): 6 skipped steps, then the 7th
     * overflow at the minimum ends the run (the fatal step is not counted). */
    ct_config *cfg = regression_config("{\"enabled\": true, \"initial_scale_power\": 126, \"hysteresis\": 1, "
                                       "\"min_loss_scale\": 1.329228e36}", 1e-3, 20);
    run_out o = run_trainer(cfg, false);
    ck_assert_int_eq(o.rc, CT_ERR_DIVERGED);
    ck_assert_msg(strstr(o.msg, "minimum") && strstr(o.msg, "step 7") && strstr(o.msg, "\"bf16\": {\"enabled\": true}") &&
                  strstr(o.msg, "No checkpoint was saved"), "message: %s", o.msg);
    ck_assert_str_eq(o.sum.status, "diverged");
    ck_assert_int_eq(o.sum.skipped_steps, 6);
    ck_assert_int_eq(o.sum.steps, 6);
    ck_assert(memcmp(o.p0, o.p1, (size_t)o.n * sizeof(float)) == 0);
    run_free(&o);
    ct_config_free(cfg);
}
END_TEST

START_TEST(forward_overflow_skips) {
    /* fp16, static scale: every micro-batch's input overflows, the loss is inf: every step is
     * skipped (the run ends "ok", nothing changed), not "diverged". */
    ct_config *cfg = regression_config_on("huge.csv", "\"fp16\": {\"enabled\": true, \"loss_scale\": 128}",
                                          1e-3, 4);
    run_out o = run_trainer(cfg, false);
    ck_assert_msg(o.rc == CT_OK, "%s", o.msg);
    ck_assert_str_eq(o.sum.status, "ok");
    ck_assert_int_eq(o.sum.skipped_steps, 4);
    ck_assert_int_eq(o.applied, 0);
    ck_assert(memcmp(o.p0, o.p1, (size_t)o.n * sizeof(float)) == 0);
    run_free(&o);
    ct_config_free(cfg);
    /* Dynamic scale: halving cannot help a forward overflow; at the minimum the run ends with
     * the bf16 hint, saying it was the forward pass. */
    cfg = regression_config_on("huge.csv", "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 2, "
                               "\"hysteresis\": 1}", 1e-3, 20);
    o = run_trainer(cfg, false);
    ck_assert_int_eq(o.rc, CT_ERR_DIVERGED);
    ck_assert_msg(strstr(o.msg, "forward pass") && strstr(o.msg, "bf16"), "message: %s", o.msg);
    ck_assert_int_eq(o.sum.skipped_steps, 2);   /* 4 -> 2 -> 1 (min), then fatal */
    run_free(&o);
    ct_config_free(cfg);
    /* bf16 has fp32's range: the same data trains. */
    cfg = regression_config_on("huge.csv", "\"bf16\": {\"enabled\": true}", 1e-3, 4);
    o = run_trainer(cfg, false);
    ck_assert_msg(o.rc == CT_OK, "%s", o.msg);
    ck_assert_int_eq(o.sum.skipped_steps, 0);
    ck_assert_int_eq(o.applied, 4);
    run_free(&o);
    ct_config_free(cfg);
}
END_TEST

/* ---- clipping under loss scaling ---- */

/* t = a . x with x = k / 256 for random integers k in [-256, 256) and a = (0.75, -0.5, 0.25,
 * 0.625): inputs and targets are exact in fp16, so an fp16 run differs from fp32 only by the
 * rounding of weights, outputs and gradients. 512 samples. */
enum { CLIP_N = 512 };
static const double CLIP_A[4] = {0.75, -0.5, 0.25, 0.625};
static double clip_x[CLIP_N][4], clip_t[CLIP_N];

static void write_clip_regression(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("x0,x1,x2,x3,y\n", f);
    ct_rng r;
    ct_rng_init(&r, 23, CT_RNG_AUGMENT, 4);
    for (int i = 0; i < CLIP_N; i++) {
        clip_t[i] = 0;
        for (int j = 0; j < 4; j++) {
            clip_x[i][j] = ((double)ct_rng_below(&r, 512) - 256) / 256;
            clip_t[i] += CLIP_A[j] * clip_x[i][j];
            fprintf(f, "%.9g,", clip_x[i][j]);
        }
        fprintf(f, "%.9g\n", clip_t[i]);
    }
    fclose(f);
}

/* SGD (no momentum, no decay) at lr 0.1 with gradient_clipping 0.05 on whole-data batches of
 * clip.csv (written by write_clip_regression); precision: the "fp16"/"bf16" member or "" for
 * fp32. */
static ct_config *clip_config(const char *precision, int steps) {
    static int runs; /* each run its own run_dir */
    char csv[512], path[512], text[2048];
    snprintf(csv, sizeof csv, "%s/clip.csv", tmpdir);
    snprintf(path, sizeof path, "%s/clip.json", tmpdir);
    snprintf(text, sizeof text,
             "{\"train_batch_size\": %d, \"gradient_clipping\": 0.05,\n"
             " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}%s%s,\n"
             " \"model\": {\"input\": [4], \"layers\": [{\"type\": \"linear\", \"name\": \"fc\", \"out\": 1, "
             "\"bias\": false}], \"loss\": {\"type\": \"mse\"}},\n"
             " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"%s\"}},\n"
             " \"train\": {\"max_steps\": %d, \"seed\": 5, \"device\": \"%s\", \"threads\": 2, "
             "\"run_dir\": \"%s/clip-run%d\"}}\n",
             CLIP_N, *precision ? ", " : "", precision, csv, steps, test_device(), tmpdir, ++runs);
    write_text(path, text);
    return load_config(path, NULL, 0);
}

START_TEST(fp16_clips_unscaled_gradients) {
    /* DeepSpeed unscales the gradients before it clips them: the coefficient is
     * clip / ||g / loss_scale||, the same as in fp32. Here every step's norm (~0.8) is above the
     * clip (0.05), so each step moves the weights by lr * 0.05 along the gradient; a coefficient
     * computed on the loss-scaled norm (2^16 times larger) would hardly move them. SGD, whose
     * update is proportional to the gradient: Adam would hide a wrong coefficient. */
    enum { STEPS = 6 };
    char csv[512];
    snprintf(csv, sizeof csv, "%s/clip.csv", tmpdir);
    write_clip_regression(csv);
    double w[4] = {0}, want_loss[STEPS], moved = 0;
    for (int s = 0; s < STEPS; s++) { /* the update in double, over the whole data each step */
        double g[4] = {0}, loss = 0, norm = 0;
        for (int i = 0; i < CLIP_N; i++) {
            double d = -clip_t[i];
            for (int j = 0; j < 4; j++) d += w[j] * clip_x[i][j];
            loss += d * d / CLIP_N;
            for (int j = 0; j < 4; j++) g[j] += 2 * d * clip_x[i][j] / CLIP_N;
        }
        for (int j = 0; j < 4; j++) norm += g[j] * g[j];
        norm = sqrt(norm);
        ck_assert_double_gt(norm, 0.5); /* clipping is active in every step */
        want_loss[s] = loss;
        for (int j = 0; j < 4; j++) w[j] -= 0.1 * (0.05 / (norm + 1e-6)) * g[j];
    }
    for (int j = 0; j < 4; j++) moved += fabs(w[j]);
    /* the last: 4 micro-batches, so the norm is that of the sum, unscaled and divided once */
    static const char *const precisions[] = {"", "\"fp16\": {\"enabled\": true}",
                                             "\"fp16\": {\"enabled\": true, \"loss_scale\": 1024}",
                                             "\"bf16\": {\"enabled\": true}",
                                             "\"fp16\": {\"enabled\": true}, \"train_micro_batch_size_per_gpu\": 128"};
    /* of the distance moved (seen: 4e-8, 1e-6, 1e-6, 1e-5, 1e-6) */
    static const double tol[] = {1e-5, 2e-4, 2e-4, 1e-3, 2e-4};
    for (int k = 0; k < 5; k++) {
        ct_config *cfg = clip_config(precisions[k], STEPS);
        run_out o = run_trainer(cfg, true);
        ck_assert_msg(o.rc == CT_OK, "%s: %s", precisions[k], o.msg);
        ck_assert_int_eq(o.sum.skipped_steps, 0);
        ck_assert_int_eq(o.applied, STEPS);
        for (int j = 0; j < 4; j++)
            ck_assert_msg(fabs(o.p1[j] - w[j]) <= tol[k] * moved, "{%s}: weight %d after %d steps: %.9g, reference %.9g",
                          precisions[k], j, STEPS, o.p1[j], w[j]);
        ck_assert_msg(fabs(o.last_loss - want_loss[STEPS - 1]) <= 10 * tol[k] * want_loss[STEPS - 1],
                      "{%s}: loss %.9g, reference %.9g", precisions[k], o.last_loss, want_loss[STEPS - 1]);
        run_free(&o);
        ct_config_free(cfg);
    }
}
END_TEST

/* n random normals times s into backend memory x (host scratch h). */
static void upload_normal(ct_backend *be, float *x, float *h, int64_t n, ct_rng *r, float s) {
    for (int64_t i = 0; i < n; i++) h[i] = (float)ct_rng_normal(r) * s;
    be->mem.copy_h2d(be, x, h, (size_t)n * sizeof *h);
}

START_TEST(optimizer_overflow_bitwise) {
    /* After two real updates (non-zero state, a schedule under way) an inf or a NaN gradient
     * makes the sum of squares non-finite and changes nothing; the next finite update uses the LR
     * the skipped one would have used. */
    ct_config *cfg = regression_config("{\"enabled\": true}", 1e-3, 5);
    ct_backend *be = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_backend_create(test_device(), 2, &be, &err) == CT_OK, "%s", err.msg);
    int64_t n = 5003;
    ct_optim_tensor ten = {0, n, true};
    ct_optim *o = NULL;
    ck_assert_int_eq(ct_optim_create(&cfg->optimizer, &cfg->scheduler, 1.0, be, &ten, 1, 0, n, &o, &err), CT_OK);
    float *master = be->mem.alloc(be, (size_t)n * sizeof(float), CT_MEM_MASTER);
    float *grads = be->mem.alloc(be, (size_t)n * sizeof(float), CT_MEM_GRADS);
    ct_optim_target tg = {.master = master, .grads = grads};
    float *h = malloc((size_t)n * sizeof *h);
    ct_rng r;
    ct_rng_init(&r, 9, CT_RNG_AUGMENT, 3);
    upload_normal(be, master, h, n, &r, 1.0f);
    for (int step = 0; step < 3; step++) {
        upload_normal(be, grads, h, n, &r, 1000.0f);
        if (step == 2) break;
        ct_optim_stats st;
        ck_assert(ct_optim_apply_finite(o, &tg, 1.0f / 1024, ct_optim_grad_sumsq(o, grads), &st));
    }
    float bad[2] = {INFINITY, NAN}, keep;
    be->mem.copy_d2h(be, &keep, grads + 1234, sizeof keep);
    for (int k = 0; k < 2; k++) {
        float *p = copy_of(be, master, n), *m = copy_of(be, o->m, n), *v = copy_of(be, o->v, n);
        long applied = o->applied, sched_t = o->sched_t;
        double lr = ct_optim_next_lr(o);
        be->mem.copy_h2d(be, grads + 1234, &bad[k], sizeof bad[k]);
        ct_optim_stats st;
        double ss = ct_optim_grad_sumsq(o, grads);
        ck_assert(!isfinite(ss));
        ck_assert(!ct_optim_apply_finite(o, &tg, 1.0f / 1024, ss, &st));
        ck_assert(isnan(st.grad_norm) && st.lr == lr);
        float *p2 = copy_of(be, master, n), *m2 = copy_of(be, o->m, n), *v2 = copy_of(be, o->v, n);
        ck_assert(memcmp(p, p2, (size_t)n * 4) == 0 && memcmp(m, m2, (size_t)n * 4) == 0 &&
                  memcmp(v, v2, (size_t)n * 4) == 0);
        ck_assert(o->applied == applied && o->sched_t == sched_t && ct_optim_next_lr(o) == lr);
        be->mem.copy_h2d(be, grads + 1234, &keep, sizeof keep);
        free(p), free(m), free(v), free(p2), free(m2), free(v2);
    }
    double lr = ct_optim_next_lr(o);
    ct_optim_stats st;
    ck_assert(ct_optim_apply_finite(o, &tg, 1.0f / 1024, ct_optim_grad_sumsq(o, grads), &st));
    ck_assert(st.lr == lr && isfinite(st.grad_norm) && st.grad_norm > 0);
    free(h);
    be->mem.free(be, master);
    be->mem.free(be, grads);
    ct_optim_free(o);
    ct_backend_destroy(be);
    ct_config_free(cfg);
}
END_TEST

static Suite *amp_suite(void) {
    Suite *s = suite_create("amp");
    TCase *tc = tcase_create("amp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, scaler_hysteresis_not_consecutive);
    tcase_add_test(tc, scaler_hysteresis_consecutive);
    tcase_add_test(tc, scaler_minimum_and_static);
    tcase_add_test(tc, scaler_checkpoint_round_trip);
    tcase_add_test(tc, round_to_matches_scalar);
    tcase_add_test(tc, forward_overflow_skips);
    tcase_add_test(tc, optimizer_overflow_bitwise);
    tcase_add_test(tc, overflow_skips_whole_run);
    tcase_add_test(tc, overflow_at_minimum_exits);
    tcase_add_test(tc, underflow_needs_scaling);
    tcase_add_test(tc, fp16_clips_unscaled_gradients);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    int unusable = test_device_unusable();
    if (unusable) return unusable;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_amp_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    SRunner *sr = srunner_create(amp_suite());
    test_device_runner(sr);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return failed ? 1 : 0;
}

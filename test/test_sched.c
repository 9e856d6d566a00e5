/* test_sched.c: the five DeepSpeed schedules against worked sequences produced by running
 * DeepSpeed's own deepspeed/runtime/lr_schedules.py, and against values computed by hand from its
 * formulas. Sequences start at t = -1 (the LR written at construction). */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "core/optim/sched.h"

#define TOL 1e-6

/* Compare ct_sched_lr(t) for t = -1, 0, 1, ... with want[]. */
static void check_seq(const ct_scheduler_cfg *s, double base_lr, const double *want, int n) {
    for (int i = 0; i < n; i++) {
        double got = ct_sched_lr(s, base_lr, i - 1);
        ck_assert_msg(fabs(got - want[i]) < TOL, "t=%d: got %.9g want %.9g", i - 1, got, want[i]);
    }
}

static void check_at(const ct_scheduler_cfg *s, double base_lr, long t, double want) {
    double got = ct_sched_lr(s, base_lr, t);
    ck_assert_msg(fabs(got - want) < TOL, "t=%ld: got %.9g want %.9g", t, got, want);
}

static ct_scheduler_cfg warmup(ct_sched_type type, double lo, double hi, long n, ct_warmup_type wt, long total) {
    ct_scheduler_cfg s = {0};
    s.type = type;
    s.warmup_min_lr = lo;
    s.warmup_max_lr = hi;
    s.warmup_num_steps = n;
    s.warmup_type = wt;
    s.total_num_steps = total;
    return s;
}

START_TEST(warmup_lr_worked) {
    ct_scheduler_cfg s = warmup(CT_SCHED_WARMUP_LR, 0, 1, 4, CT_WARMUP_LOG, 0);
    const double log_seq[] = {0, 0, 0.5, 0.792481, 1, 1, 1};
    check_seq(&s, 123.0, log_seq, 7); /* the optimizer's lr is ignored */
    s.warmup_type = CT_WARMUP_LINEAR;
    const double lin_seq[] = {0, 0, 0.25, 0.5, 0.75, 1, 1};
    check_seq(&s, 123.0, lin_seq, 7);
}
END_TEST

START_TEST(warmup_lr_by_hand) {
    ct_scheduler_cfg s = warmup(CT_SCHED_WARMUP_LR, 0.2, 0.6, 10, CT_WARMUP_LOG, 0);
    check_at(&s, 1, -1, 0.2);
    check_at(&s, 1, 4, 0.2 + 0.4 * log(5.0) / log(10.0)); /* 0.479588 */
    check_at(&s, 1, 9, 0.2 + 0.4 * log(10.0) / log(10.0));
    check_at(&s, 1, 10, 0.6);
    check_at(&s, 1, 1000, 0.6);
    /* warmup_num_steps below 2 counts as 2 */
    s.warmup_num_steps = 1;
    check_at(&s, 1, 0, 0.2);
    check_at(&s, 1, 1, 0.6);
}
END_TEST

START_TEST(warmup_decay_worked) {
    ct_scheduler_cfg s = warmup(CT_SCHED_WARMUP_DECAY_LR, 0, 1, 2, CT_WARMUP_LINEAR, 6);
    const double seq[] = {0, 0, 0.5, 1, 0.75, 0.5, 0.25, 0, 0};
    check_seq(&s, 9.0, seq, 9);
}
END_TEST

START_TEST(warmup_decay_after_total) {
    ct_scheduler_cfg s = warmup(CT_SCHED_WARMUP_DECAY_LR, 0.1, 1.1, 3, CT_WARMUP_LINEAR, 7);
    check_at(&s, 1, -1, 0.1);
    check_at(&s, 1, 1, 0.1 + 1.0 / 3.0);
    check_at(&s, 1, 2, 0.1 + 2.0 / 3.0);
    check_at(&s, 1, 3, 1.1);
    check_at(&s, 1, 5, 0.6);
    check_at(&s, 1, 7, 0.1);
    check_at(&s, 1, 9, 0.1);     /* clamped at min after total */
    check_at(&s, 1, 100000, 0.1);
    /* "auto" total (-1) holds at max until the trainer resolves it */
    s.total_num_steps = -1;
    check_at(&s, 1, 50, 1.1);
    char warn[512];
    ct_sched_resolve_total(&s, 7, warn, sizeof warn);
    ck_assert_int_eq(s.total_num_steps, 7);
    ck_assert_str_eq(warn, "");
    check_at(&s, 1, 5, 0.6);
    ct_sched_resolve_total(&s, 5, warn, sizeof warn); /* already set: unchanged */
    ck_assert_int_eq(s.total_num_steps, 7);
    ck_assert_str_eq(warn, "");
}
END_TEST

/* "auto" resolved to a random run length: after the warmup the LR falls every step (WarmupDecayLR
 * to warmup_min_lr at t = total, WarmupCosineLR to its minimum at t = total - 1); a fixed total
 * shorter than the run is said, with what happens after it: update k uses t = k - 2, so a run of
 * R updates spends R - 1 - total of them past the total. */
START_TEST(total_auto_and_short_total) {
    srand(5);
    char warn[512];
    for (int it = 0; it < 20; it++) {
        long n = 2 + rand() % 50, run = n + 2 + rand() % 500;
        ct_scheduler_cfg s = warmup(CT_SCHED_WARMUP_DECAY_LR, 0.01, 0.5, n, CT_WARMUP_LINEAR, -1);
        ct_sched_resolve_total(&s, run, warn, sizeof warn);
        ck_assert_int_eq(s.total_num_steps, run);
        ck_assert_str_eq(warn, "");
        for (long t = n + 1; t <= run; t++) ck_assert_double_lt(ct_sched_lr(&s, 1, t), ct_sched_lr(&s, 1, t - 1));
        check_at(&s, 1, run, 0.01);
        ct_scheduler_cfg c = {.type = CT_SCHED_WARMUP_COSINE_LR, .warmup_num_steps = n, .total_num_steps = -1,
                              .cos_min_ratio = 0.1, .warmup_type = CT_WARMUP_LINEAR};
        ct_sched_resolve_total(&c, run, warn, sizeof warn);
        ck_assert_int_eq(c.total_num_steps, run);
        ck_assert_str_eq(warn, "");
        for (long t = n + 1; t < run; t++) ck_assert_double_lt(ct_sched_lr(&c, 2, t), ct_sched_lr(&c, 2, t - 1));
        check_at(&c, 2, run - 1, 0.2);
        /* a fixed total: kept; a warning only when the run is longer */
        s.total_num_steps = c.total_num_steps = run;
        ct_sched_resolve_total(&s, run - 1 - rand() % run, warn, sizeof warn);
        ck_assert_str_eq(warn, "");
        ct_sched_resolve_total(&s, run + 7, warn, sizeof warn);
        ck_assert_int_eq(s.total_num_steps, run);
        char want[256];
        snprintf(want, sizeof want, "scheduler.params.total_num_steps: %ld is shorter than the run (%ld optimizer "
                 "steps): WarmupDecayLR holds the LR at warmup_min_lr (0.01) for the last 6 steps; set it to %ld "
                 "or \"auto\"", run, run + 7, run + 7);
        ck_assert_str_eq(warn, want);
        ct_sched_resolve_total(&c, run + 7, warn, sizeof warn);
        snprintf(want, sizeof want, "scheduler.params.total_num_steps: %ld is shorter than the run (%ld optimizer "
                 "steps): WarmupCosineLR passes its minimum and the LR rises again for the last 6 steps (DeepSpeed's "
                 "formula); set it to %ld or \"auto\"", run, run + 7, run + 7);
        ck_assert_str_eq(warn, want);
    }
    /* schedules without a total: nothing to resolve or say */
    ct_scheduler_cfg w = warmup(CT_SCHED_WARMUP_LR, 0, 1, 4, CT_WARMUP_LOG, 0);
    ct_sched_resolve_total(&w, 100, warn, sizeof warn);
    ck_assert_int_eq(w.total_num_steps, 0);
    ck_assert_str_eq(warn, "");
}
END_TEST

START_TEST(warmup_cosine_worked) {
    ct_scheduler_cfg s = {0};
    s.type = CT_SCHED_WARMUP_COSINE_LR;
    s.warmup_num_steps = 2;
    s.total_num_steps = 6;
    s.warmup_type = CT_WARMUP_LINEAR;
    s.cos_min_ratio = 0;
    const double seq[] = {0, 0, 0.5, 0.853553, 0.5, 0.146447, 0, 0.146447, 0.5, 0.853553};
    check_seq(&s, 1.0, seq, 10);
}
END_TEST

START_TEST(warmup_cosine_by_hand) {
    ct_scheduler_cfg s = {0};
    s.type = CT_SCHED_WARMUP_COSINE_LR;
    s.warmup_num_steps = 4;
    s.total_num_steps = 8;
    s.warmup_type = CT_WARMUP_LINEAR;
    s.cos_min_ratio = 0.1;
    s.warmup_min_ratio = 0.2;
    check_at(&s, 0.5, -1, 0.0);
    check_at(&s, 0.5, 1, 0.5 * 0.4);
    check_at(&s, 0.5, 4, 0.5 * (0.1 + 0.9 * 0.853553390593)); /* 0.434099 */
    check_at(&s, 0.5, 7, 0.05);                                /* minimum at total - 1 */
    check_at(&s, 0.5, 9, 0.5 * 0.55);                          /* rises again past total */
    check_at(&s, 0.5, 11, 0.5);
    /* log warmup */
    s.warmup_type = CT_WARMUP_LOG;
    check_at(&s, 0.5, 2, 0.5 * (0.2 + 0.8 * log(3.0) / log(4.0)));
}
END_TEST

static ct_scheduler_cfg one_cycle(double lo, double hi, long first, long second, double rate, long dstep) {
    ct_scheduler_cfg s = {0};
    s.type = CT_SCHED_ONE_CYCLE;
    s.cycle_min_lr = lo;
    s.cycle_max_lr = hi;
    s.cycle_first_step_size = first;
    s.cycle_second_step_size = second;
    s.decay_lr_rate = rate;
    s.decay_step_size = dstep;
    s.cycle_momentum = true;
    s.cycle_min_mom = 0.8;
    s.cycle_max_mom = 0.9;
    return s;
}

START_TEST(one_cycle_worked) {
    ct_scheduler_cfg s = one_cycle(0.1, 1, 2, 2, 0.5, 1);
    const double seq[] = {0.1, 0.55, 1, 0.55, 0.1, 0.0666667, 0.05, 0.04, 0.0333333};
    check_seq(&s, 7.0, seq, 9);
    const double mom[] = {0.8, 0.85, 0.8, 0.85, 0.9, 0.9};
    for (int i = 0; i < 6; i++) {
        double b1 = -1, b2 = -1;
        ck_assert(ct_sched_betas(&s, i - 1, &b1, &b2));
        ck_assert_msg(fabs(b1 - mom[i]) < TOL, "t=%d: beta1 %.9g want %.9g", i - 1, b1, mom[i]);
        ck_assert_msg(fabs(b2 - 0.99) < TOL, "beta2 %.9g", b2);
    }
}
END_TEST

START_TEST(one_cycle_decay_by_hand) {
    ct_scheduler_cfg s = one_cycle(0.01, 0.1, 3, 1, 0.2, 2);
    s.cycle_min_mom = 0.85;
    s.cycle_max_mom = 0.95;
    s.decay_mom_rate = 0.1;
    check_at(&s, 1, 0, 0.04);
    check_at(&s, 1, 2, 0.1);
    check_at(&s, 1, 3, 0.01);
    check_at(&s, 1, 4, 0.01 / 1.1);
    check_at(&s, 1, 7, 0.01 / 1.4);
    double b1, b2;
    ck_assert(ct_sched_betas(&s, 0, &b1, &b2));
    ck_assert(fabs(b1 - (0.95 - 0.1 / 3.0)) < TOL);
    ck_assert(ct_sched_betas(&s, 4, &b1, &b2));
    ck_assert(fabs(b1 - 0.95 * 1.05) < TOL);
    ck_assert(ct_sched_betas(&s, 7, &b1, &b2));
    ck_assert(fabs(b1 - 0.95 * 1.2) < TOL);
    /* no decay configured: lr stays at min after the cycle */
    s.decay_lr_rate = 0;
    check_at(&s, 1, 50, 0.01);
    /* momentum cycling off, or another schedule: betas untouched */
    s.cycle_momentum = false;
    ck_assert(!ct_sched_betas(&s, 3, &b1, &b2));
    ct_scheduler_cfg w = warmup(CT_SCHED_WARMUP_LR, 0, 1, 4, CT_WARMUP_LOG, 0);
    ck_assert(!ct_sched_betas(&w, 3, &b1, &b2));
}
END_TEST

START_TEST(range_test_worked) {
    ct_scheduler_cfg s = {0};
    s.type = CT_SCHED_LR_RANGE_TEST;
    s.lr_range_test_min_lr = 0.01;
    s.lr_range_test_step_size = 2;
    s.lr_range_test_step_rate = 1;
    const double seq[] = {0.01, 0.015, 0.02, 0.025, 0.03, 0.035};
    check_seq(&s, 5.0, seq, 6);
    s.lr_range_test_staircase = true;
    const double stair[] = {0.01, 0.01, 0.02, 0.02, 0.03, 0.03};
    check_seq(&s, 5.0, stair, 6);
}
END_TEST

START_TEST(range_test_by_hand) {
    ct_scheduler_cfg s = {0};
    s.type = CT_SCHED_LR_RANGE_TEST;
    s.lr_range_test_min_lr = 0.02;
    s.lr_range_test_step_size = 3;
    s.lr_range_test_step_rate = 0.5;
    s.lr_range_test_staircase = true;
    check_at(&s, 1, 1, 0.02);
    check_at(&s, 1, 2, 0.03);
    check_at(&s, 1, 7, 0.04);
    s.lr_range_test_staircase = false;
    check_at(&s, 1, 7, 0.02 * (1 + 0.5 * 8.0 / 3.0));
}
END_TEST

START_TEST(no_scheduler_is_constant) {
    ct_scheduler_cfg s = {0};
    double lr = 0.001 + (double)(rand() % 1000) * 1e-6;
    for (long t = -1; t < 50; t++) check_at(&s, lr, t, lr);
}
END_TEST

/* ---- curriculum_learning: worked values of DeepSpeed's CurriculumScheduler (run unmodified on
 * these configs; pairs are s = global_steps + 1 -> difficulty) ---- */

static ct_curriculum_cfg curriculum(ct_curriculum_schedule sch, long lo, long hi, long total, long step, double root) {
    ct_curriculum_cfg c = {.enabled = true, .schedule = sch, .min_difficulty = lo, .max_difficulty = hi,
                           .total_curriculum_step = total, .difficulty_step = step, .root_degree = root};
    return c;
}

/* Each pair evaluated from the start's difficulty (min) and, as a run would, from the previous. */
static void check_curriculum(const ct_curriculum_cfg *c, const long (*pairs)[2], int n) {
    for (int i = 0; i < n; i++) {
        long got = ct_curriculum_difficulty(c, pairs[i][0], c->min_difficulty);
        ck_assert_msg(got == pairs[i][1], "s=%ld: got %ld want %ld", pairs[i][0], got, pairs[i][1]);
        if (i > 0) {
            long prev = ct_curriculum_difficulty(c, pairs[i - 1][0], c->min_difficulty);
            ck_assert_int_eq(ct_curriculum_difficulty(c, pairs[i][0], prev),
                             prev >= c->max_difficulty ? prev : pairs[i][1]);
        }
    }
}

START_TEST(curriculum_worked) {
    ct_curriculum_cfg lin = curriculum(CT_CURRICULUM_FIXED_LINEAR, 8, 1024, 60000, 8, 1);
    const long lin_pairs[][2] = {{1, 8},       {100, 8},     {1000, 24},    {15000, 256}, {30000, 512},
                                 {45000, 768}, {59999, 1016}, {60000, 1024}, {70000, 1024}};
    check_curriculum(&lin, lin_pairs, 9);
    ct_curriculum_cfg root = curriculum(CT_CURRICULUM_FIXED_ROOT, 8, 1024, 60000, 8, 2);
    const long root_pairs[][2] = {{1, 8},      {100, 48},    {1000, 136},   {15000, 512},
                                  {30000, 720}, {45000, 880}, {59999, 1016}, {60000, 1024}};
    check_curriculum(&root, root_pairs, 8);
    /* bigscience's tests/ds_config_cl.json: the first value already exceeds min */
    ct_curriculum_cfg small = curriculum(CT_CURRICULUM_FIXED_LINEAR, 8, 128, 30, 4, 1);
    const long small_pairs[][2] = {{1, 12}, {2, 16}, {3, 20}, {10, 48}, {15, 68}, {29, 124}, {30, 128}};
    check_curriculum(&small, small_pairs, 7);
    ct_curriculum_cfg disc = {.enabled = true, .schedule = CT_CURRICULUM_FIXED_DISCRETE, .min_difficulty = 1,
                              .max_difficulty = 3, .stages = 3, .difficulty = {1, 2, 3}, .max_step = {5, 10}};
    const long disc_pairs[][2] = {{1, 1}, {5, 1}, {6, 2}, {10, 2}, {11, 3}, {100, 3}};
    check_curriculum(&disc, disc_pairs, 6);
}
END_TEST

START_TEST(curriculum_stops_at_max) {
    /* DeepSpeed updates the difficulty only while the one in force is below max_difficulty: a
     * discrete schedule that goes back down stays at its maximum once reached. */
    ct_curriculum_cfg c = {.enabled = true, .schedule = CT_CURRICULUM_FIXED_DISCRETE, .min_difficulty = 16,
                           .max_difficulty = 64, .stages = 3, .difficulty = {16, 64, 32}, .max_step = {3, 6}};
    long d = c.min_difficulty;
    const long want[] = {16, 16, 16, 64, 64, 64, 64, 64};
    for (long s = 1; s <= 8; s++) {
        d = ct_curriculum_difficulty(&c, s, d);
        ck_assert_msg(d == want[s - 1], "s=%ld: got %ld want %ld", s, d, want[s - 1]);
    }
    ck_assert_int_eq(ct_curriculum_difficulty(&c, 8, 16), 32); /* from below max it follows the list */
    c.schedule = CT_CURRICULUM_CUSTOM;                         /* a user function: nothing to run */
    ck_assert_int_eq(ct_curriculum_difficulty(&c, 5, 24), 24);
}
END_TEST

int main(void) {
    Suite *su = suite_create("sched");
    TCase *tc = tcase_create("sched");
    tcase_add_test(tc, warmup_lr_worked);
    tcase_add_test(tc, warmup_lr_by_hand);
    tcase_add_test(tc, warmup_decay_worked);
    tcase_add_test(tc, warmup_decay_after_total);
    tcase_add_test(tc, total_auto_and_short_total);
    tcase_add_test(tc, warmup_cosine_worked);
    tcase_add_test(tc, warmup_cosine_by_hand);
    tcase_add_test(tc, one_cycle_worked);
    tcase_add_test(tc, one_cycle_decay_by_hand);
    tcase_add_test(tc, range_test_worked);
    tcase_add_test(tc, range_test_by_hand);
    tcase_add_test(tc, no_scheduler_is_constant);
    tcase_add_test(tc, curriculum_worked);
    tcase_add_test(tc, curriculum_stops_at_max);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

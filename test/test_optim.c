/* test_optim.c: every optimizer's update on the CPU backend against a double-precision reference
 * written from the semantics in core/optim.h, over several steps; clipping; the LR schedule with
 * DeepSpeed's stepping convention; the flat-buffer layout. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/optim/optim.h"
#include "core/util/rng.h"
#include "core/optim/sched.h"

#define N_PARAMS 300
#define STEPS 4

/* Three tensors: weight (decayed), bias (not decayed), another weight. */
static const ct_optim_tensor tensors[] = {{0, 100, true}, {100, 10, false}, {110, 190, true}};
#define N_TENSORS 3

typedef struct ref_state {
    double p[N_PARAMS], m[N_PARAMS], v[N_PARAMS];
} ref_state;

static ct_optimizer_cfg base_cfg(ct_opt_type t) {
    ct_optimizer_cfg c;
    memset(&c, 0, sizeof c);
    c.type = t;
    c.lr = t == CT_OPT_SGD ? 0.05 : 0.01;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.weight_decay = 0.1;
    c.adam_w_mode = true;
    c.bias_correction = true;
    c.max_coeff = 10.0;
    c.min_coeff = 0.01;
    return c;
}

static void fill_random(float *x, int64_t n, uint64_t seed, uint64_t stream, float lo, float hi) {
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_AUGMENT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * ct_rng_uniform(&r);
}

static bool decayed(int64_t i) {
    for (int t = 0; t < N_TENSORS; t++)
        if (i >= tensors[t].offset && i < tensors[t].offset + tensors[t].numel) return tensors[t].weight_decay;
    return false;
}

/* ---- double references ---- */

static void ref_adam(const ct_optimizer_cfg *c, ref_state *s, const double *g, double lr, long t) {
    double bc1 = c->bias_correction ? 1 - pow(c->beta1, (double)t) : 1;
    double bc2 = c->bias_correction ? 1 - pow(c->beta2, (double)t) : 1;
    bool decoupled = c->type == CT_OPT_ADAMW || c->adam_w_mode;
    for (int i = 0; i < N_PARAMS; i++) {
        double wd = decayed(i) ? c->weight_decay : 0;
        double gi = g[i] + (decoupled ? 0 : wd * s->p[i]);
        s->m[i] = c->beta1 * s->m[i] + (1 - c->beta1) * gi;
        s->v[i] = c->beta2 * s->v[i] + (1 - c->beta2) * gi * gi;
        double u = (s->m[i] / bc1) / (sqrt(s->v[i] / bc2) + c->eps);
        if (decoupled) u += wd * s->p[i];
        s->p[i] -= lr * u;
    }
}

static void ref_sgd(const ct_optimizer_cfg *c, ref_state *s, const double *g, double lr, long t) {
    for (int i = 0; i < N_PARAMS; i++) {
        double d = g[i] + (decayed(i) ? c->weight_decay : 0) * s->p[i];
        if (c->momentum != 0) {
            s->m[i] = t == 1 ? d : c->momentum * s->m[i] + (1 - c->dampening) * d;
            d = c->nesterov ? d + c->momentum * s->m[i] : s->m[i];
        }
        s->p[i] -= lr * d;
    }
}

static void ref_lamb(const ct_optimizer_cfg *c, ref_state *s, const double *g, double lr, long t) {
    double step = lr;
    if (c->bias_correction) step = lr * sqrt(1 - pow(c->beta2, (double)t)) / (1 - pow(c->beta1, (double)t));
    for (int k = 0; k < N_TENSORS; k++) {
        int64_t o = tensors[k].offset, n = tensors[k].numel;
        double wd = tensors[k].weight_decay ? c->weight_decay : 0, wn = 0, un = 0, u[N_PARAMS];
        for (int64_t i = o; i < o + n; i++) {
            s->m[i] = c->beta1 * s->m[i] + (1 - c->beta1) * g[i];
            s->v[i] = c->beta2 * s->v[i] + (1 - c->beta2) * g[i] * g[i];
            double den = c->eps_inside_sqrt ? sqrt(s->v[i] + c->eps) : sqrt(s->v[i]) + c->eps;
            u[i] = s->m[i] / den + wd * s->p[i];
            wn += s->p[i] * s->p[i];
            un += u[i] * u[i];
        }
        wn = sqrt(wn);
        un = sqrt(un);
        double trust = 1;
        if (wn != 0 && un != 0) trust = fmin(fmax(wn / un, c->min_coeff), c->max_coeff);
        for (int64_t i = o; i < o + n; i++) s->p[i] -= step * trust * u[i];
    }
}

/* Run STEPS updates with ctrain and with the reference on the same random gradients; compare.
 * grad_scale and clip exercise the folding of 1/loss_scale and clipping into the kernels. */
static void run_case(const ct_optimizer_cfg *c, const ct_scheduler_cfg *sched, double clip,
                     float grad_scale, uint64_t seed, float zero_tensor) {
    ct_backend *be = ct_cpu_backend_create(2);
    ck_assert_ptr_nonnull(be);
    ct_optim *o = ct_optim_create(c, sched, clip, be, tensors, N_TENSORS, N_PARAMS);
    ck_assert_ptr_nonnull(o);
    ref_state s;
    memset(&s, 0, sizeof s);
    float p0[N_PARAMS], g[N_PARAMS];
    fill_random(p0, N_PARAMS, seed, 0, -1.0f, 1.0f);
    if (zero_tensor) memset(p0 + tensors[1].offset, 0, sizeof(float) * (size_t)tensors[1].numel);
    be->mem.copy_h2d(be, o->params, p0, sizeof p0);
    for (int i = 0; i < N_PARAMS; i++) s.p[i] = p0[i];

    double max_err = 0;
    for (long t = 1; t <= STEPS; t++) {
        fill_random(g, N_PARAMS, seed, (uint64_t)t, -2.0f, 2.0f);
        be->mem.copy_h2d(be, o->grads, g, sizeof g);
        double gd[N_PARAMS], ss = 0;
        for (int i = 0; i < N_PARAMS; i++) {
            gd[i] = (double)g[i] * grad_scale;
            ss += gd[i] * gd[i];
        }
        double norm = sqrt(ss), coef = 1;
        if (clip > 0 && clip / (norm + 1e-6) < 1) coef = clip / (norm + 1e-6);
        for (int i = 0; i < N_PARAMS; i++) gd[i] *= coef;
        double lr = ct_sched_lr(sched, c->lr, t - 2); /* DeepSpeed: update #t uses t - 2 */

        ct_optim_stats st;
        ct_optim_step(o, grad_scale, &st);
        ck_assert_double_eq_tol(st.grad_norm, norm, 1e-4 * norm);
        ck_assert_double_eq_tol(st.clip_coef, coef, 1e-6);
        ck_assert_double_eq_tol(st.lr, lr, 1e-12 + 1e-9 * lr);
        switch (c->type) {
        case CT_OPT_SGD: ref_sgd(c, &s, gd, lr, t); break;
        case CT_OPT_LAMB: ref_lamb(c, &s, gd, lr, t); break;
        default: ref_adam(c, &s, gd, lr, t); break;
        }
        float p[N_PARAMS];
        be->mem.copy_d2h(be, p, o->params, sizeof p);
        for (int i = 0; i < N_PARAMS; i++) {
            double e = fabs(p[i] - s.p[i]) / (1e-6 + fabs(s.p[i]));
            if (e > max_err) max_err = e;
            ck_assert_msg(fabs(p[i] - s.p[i]) <= 2e-6 + 2e-5 * fabs(s.p[i]),
                          "step %ld param %d: ctrain %.9g reference %.9g", t, i, p[i], s.p[i]);
        }
    }
    /* The parameters moved: a no-op optimizer must not pass. */
    double moved = 0;
    for (int i = 0; i < N_PARAMS; i++) moved += fabs(s.p[i] - p0[i]);
    ck_assert_double_gt(moved, 1e-3);
    ct_optim_free(o);
    ct_backend_destroy(be);
}

static const ct_scheduler_cfg no_sched = {.type = CT_SCHED_NONE};

START_TEST(adamw_mode_default) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAM);
    run_case(&c, &no_sched, 0, 1.0f, 11, 0);
}
END_TEST

START_TEST(adam_l2_mode) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAM);
    c.adam_w_mode = false;
    run_case(&c, &no_sched, 0, 1.0f, 12, 0);
}
END_TEST

START_TEST(adamw_always_decoupled) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAMW);
    c.adam_w_mode = false; /* ignored for type AdamW, as DeepSpeed does */
    run_case(&c, &no_sched, 0, 0.5f, 13, 0);
}
END_TEST

START_TEST(adam_no_bias_correction) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAM);
    c.bias_correction = false;
    run_case(&c, &no_sched, 0, 1.0f, 14, 0);
}
END_TEST

START_TEST(sgd_plain) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_SGD);
    run_case(&c, &no_sched, 0, 1.0f, 21, 0);
}
END_TEST

START_TEST(sgd_momentum_dampening) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_SGD);
    c.momentum = 0.9;
    c.dampening = 0.1;
    run_case(&c, &no_sched, 0, 1.0f, 22, 0);
}
END_TEST

START_TEST(sgd_nesterov) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_SGD);
    c.momentum = 0.9;
    c.nesterov = true;
    run_case(&c, &no_sched, 0, 0.25f, 23, 0);
}
END_TEST

START_TEST(lamb_default) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_LAMB);
    run_case(&c, &no_sched, 0, 1.0f, 31, 0);
}
END_TEST

START_TEST(lamb_clamped_and_zero_tensor) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_LAMB);
    c.max_coeff = 0.3;   /* ||p|| / ||u|| is about 0.5..1 here: the clamp is active */
    c.min_coeff = 0.2;
    c.eps_inside_sqrt = true;
    run_case(&c, &no_sched, 0, 1.0f, 32, 1.0f); /* a zero tensor: trust ratio 1 */
}
END_TEST

START_TEST(lamb_no_bias_correction) {
    ct_optimizer_cfg c = base_cfg(CT_OPT_LAMB);
    c.bias_correction = false;
    c.weight_decay = 0.01;
    run_case(&c, &no_sched, 0, 1.0f, 33, 0);
}
END_TEST

START_TEST(clipping_active) {
    /* Random gradients in [-2, 2) over 300 elements have norm ~20: clip at 1 scales them. */
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAM);
    run_case(&c, &no_sched, 1.0, 1.0f, 41, 0);
    c = base_cfg(CT_OPT_SGD);
    c.momentum = 0.5;
    run_case(&c, &no_sched, 1.0, 0.5f, 42, 0);
}
END_TEST

START_TEST(schedule_stepping) {
    ct_scheduler_cfg s;
    memset(&s, 0, sizeof s);
    /* LRRangeTest: LR(t) = min * (1 + rate * (t + 1) / step_size), a different LR every update. */
    s.type = CT_SCHED_LR_RANGE_TEST;
    s.lr_range_test_min_lr = 0.004;
    s.lr_range_test_step_rate = 1.0;
    s.lr_range_test_step_size = 1;
    /* The LRs of consecutive updates must differ, or the convention would not be tested. */
    ck_assert_double_ne(ct_sched_lr(&s, 0.01, -1), ct_sched_lr(&s, 0.01, 0));
    ck_assert_double_ne(ct_sched_lr(&s, 0.01, 0), ct_sched_lr(&s, 0.01, 1));
    ck_assert_double_eq_tol(ct_sched_lr(&s, 0.01, -1), 0.004, 1e-12);
    ct_optimizer_cfg c = base_cfg(CT_OPT_SGD);
    c.momentum = 0.9;
    run_case(&c, &s, 0, 1.0f, 51, 0);
    c = base_cfg(CT_OPT_ADAM);
    run_case(&c, &s, 0, 1.0f, 52, 0);
    /* next_lr agrees with what the first step will use. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optim *o = ct_optim_create(&c, &s, 0, be, tensors, N_TENSORS, N_PARAMS);
    ck_assert_double_eq(ct_optim_next_lr(o), ct_sched_lr(&s, c.lr, -1));
    ct_optim_free(o);
    ct_backend_destroy(be);
}
END_TEST

/* Mixed precision: every applied update of Adam, SGD and Lamb also writes the 16-bit copy of the
 * parameters, equal bit for bit to rounding the updated fp32 master; a skipped (overflowing)
 * update leaves the copy as it was. */
START_TEST(fused_16bit_copy) {
    static const ct_opt_type types[] = {CT_OPT_ADAMW, CT_OPT_SGD, CT_OPT_LAMB};
    static const ct_dtype dts[] = {CT_F16, CT_BF16};
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 2; di++) {
            ct_backend *be = ct_cpu_backend_create(2);
            ct_optimizer_cfg c = base_cfg(types[ti]);
            if (types[ti] == CT_OPT_SGD) c.momentum = 0.9;
            ct_optim *o = ct_optim_create(&c, &no_sched, 0, be, tensors, N_TENSORS, N_PARAMS);
            uint16_t *copy = be->mem.alloc(be, N_PARAMS * sizeof(uint16_t), CT_MEM_PARAMS);
            ct_optim_set_copy(o, copy, dts[di]);
            float p[N_PARAMS], g[N_PARAMS];
            fill_random(p, N_PARAMS, 40 + (uint64_t)ti, 0, -1.0f, 1.0f);
            be->mem.copy_h2d(be, o->params, p, sizeof p);
            for (long t = 1; t <= 3; t++) {
                fill_random(g, N_PARAMS, 50 + (uint64_t)ti, (uint64_t)t, -2.0f, 2.0f);
                if (t == 3) g[7] = INFINITY;     /* the third update overflows: skipped */
                be->mem.copy_h2d(be, o->grads, g, sizeof g);
                uint16_t before[N_PARAMS];
                memcpy(before, copy, sizeof before);
                ct_optim_stats st;
                bool applied = ct_optim_step_finite(o, 1.0f, &st);
                ck_assert(applied == (t < 3));
                be->mem.copy_d2h(be, p, o->params, sizeof p);
                for (int i = 0; i < N_PARAMS; i++) {
                    uint16_t want = !applied ? before[i]
                                    : dts[di] == CT_F16 ? ct_f32_to_f16(p[i]) : ct_f32_to_bf16(p[i]);
                    ck_assert_msg(copy[i] == want, "%s %s update %ld element %d: copy 0x%04x, expected "
                                  "0x%04x", ct_dtype_name(dts[di]), c.type == CT_OPT_SGD ? "sgd" : "adam/lamb",
                                  t, i, copy[i], want);
                }
            }
            be->mem.free(be, copy);
            ct_optim_free(o);
            ct_backend_destroy(be);
        }
}
END_TEST

START_TEST(layout) {
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAM);
    ct_optim *o = ct_optim_create(&c, &no_sched, 0, be, tensors, N_TENSORS, N_PARAMS);
    /* Adam: params, grads, m, v, each 64-byte aligned and disjoint. */
    float *bufs[] = {o->params, o->grads, o->m, o->v};
    for (int i = 0; i < 4; i++) {
        ck_assert_ptr_nonnull(bufs[i]);
        ck_assert_uint_eq((uintptr_t)bufs[i] % 64, 0);
        if (i) ck_assert(bufs[i] >= bufs[i - 1] + N_PARAMS);
    }
    ck_assert_int_eq(o->n_runs, 3); /* decay flags alternate: no merging */
    ck_assert_uint_eq(ct_optim_state_bytes(o), 2 * 304 * sizeof(float));
    ct_optim_free(o);
    c = base_cfg(CT_OPT_SGD);
    o = ct_optim_create(&c, &no_sched, 0, be, tensors, N_TENSORS, N_PARAMS);
    ck_assert_ptr_null(o->mom);
    ck_assert_uint_eq(ct_optim_state_bytes(o), 0);
    ct_optim_free(o);
    ct_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, adamw_mode_default);
    tcase_add_test(tc, adam_l2_mode);
    tcase_add_test(tc, adamw_always_decoupled);
    tcase_add_test(tc, adam_no_bias_correction);
    tcase_add_test(tc, sgd_plain);
    tcase_add_test(tc, sgd_momentum_dampening);
    tcase_add_test(tc, sgd_nesterov);
    tcase_add_test(tc, lamb_default);
    tcase_add_test(tc, lamb_clamped_and_zero_tensor);
    tcase_add_test(tc, lamb_no_bias_correction);
    tcase_add_test(tc, clipping_active);
    tcase_add_test(tc, schedule_stepping);
    tcase_add_test(tc, layout);
    tcase_add_test(tc, fused_16bit_copy);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* test_optim.c: every optimizer's update on the CPU backend against a double-precision reference
 * written from the semantics in core/optim/optim.h, over several steps; clipping; the LR schedule
 * with DeepSpeed's stepping convention; the state's layout; a shard optimizer over [lo, hi) with
 * the global norm given from outside equals the whole-space update on that range. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/optim/optim.h"
#include "core/util/rng.h"
#include "core/optim/sched.h"

#define N_PARAMS 300
#define STEPS 4

/* Three tensors: weight (decayed), bias (not decayed), another weight. */
static const ct_optim_tensor THREE[] = {{0, 100, true}, {100, 10, false}, {110, 190, true}};
/* The tensors the optimizers and references of a test use (THREE unless use_tensors says
 * otherwise), and a factor for each one's initial values (NULL: 1). */
static const ct_optim_tensor *tensors = THREE;
static int n_tensors = 3;
static const float *init_scale;

static void use_tensors(const ct_optim_tensor *t, int n, const float *scale) {
    tensors = t, n_tensors = n, init_scale = scale;
}

/* The flat buffers a parameter store would own: master and gradients over [0, N_PARAMS). */
typedef struct bufs {
    float *master, *grads;
} bufs;

static bufs bufs_new(ct_backend *be) {
    bufs b = {be->mem.alloc(be, N_PARAMS * sizeof(float), CT_MEM_MASTER),
              be->mem.alloc(be, N_PARAMS * sizeof(float), CT_MEM_GRADS)};
    ck_assert(b.master && b.grads);
    return b;
}

static void bufs_free(ct_backend *be, bufs *b) {
    be->mem.free(be, b->master);
    be->mem.free(be, b->grads);
}

static ct_optim *make(const ct_optimizer_cfg *c, const ct_scheduler_cfg *sched, double clip, ct_backend *be,
                      int64_t lo, int64_t hi) {
    ct_optim *o = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_optim_create(c, sched, clip, be, tensors, n_tensors, lo, hi, &o, &err) == CT_OK, "%s", err.msg);
    return o;
}

/* One update of o's range from b (copy: the compute copy of the whole space, or NULL), with the
 * norm of this range's gradients, as one rank sees it. */
static void step(ct_optim *o, const bufs *b, void *copy, ct_dtype dt, float grad_scale, ct_optim_stats *st) {
    double ss = ct_optim_grad_sumsq(o, b->grads + o->lo);
    ct_optim_target t = {.master = b->master + o->lo, .grads = b->grads + o->lo,
                         .copy = copy ? ct_elem(copy, o->lo, dt) : NULL, .copy_dt = dt};
    ct_optim_apply(o, &t, grad_scale, sqrt(ss) * grad_scale, st);
}

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
    for (int t = 0; t < n_tensors; t++)
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
    for (int k = 0; k < n_tensors; k++) {
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
    ct_optim *o = make(c, sched, clip, be, 0, N_PARAMS);
    bufs b = bufs_new(be);
    ref_state s;
    memset(&s, 0, sizeof s);
    float p0[N_PARAMS], g[N_PARAMS];
    fill_random(p0, N_PARAMS, seed, 0, -1.0f, 1.0f);
    for (int k = 0; init_scale && k < n_tensors; k++)
        for (int64_t i = tensors[k].offset; i < tensors[k].offset + tensors[k].numel; i++) p0[i] *= init_scale[k];
    if (zero_tensor) memset(p0 + tensors[1].offset, 0, sizeof(float) * (size_t)tensors[1].numel);
    be->mem.copy_h2d(be, b.master, p0, sizeof p0);
    for (int i = 0; i < N_PARAMS; i++) s.p[i] = p0[i];

    double max_err = 0;
    for (long t = 1; t <= STEPS; t++) {
        fill_random(g, N_PARAMS, seed, (uint64_t)t, -2.0f, 2.0f);
        be->mem.copy_h2d(be, b.grads, g, sizeof g);
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
        step(o, &b, NULL, CT_F32, grad_scale, &st);
        ck_assert_double_eq_tol(st.grad_norm, norm, 1e-4 * norm);
        ck_assert_double_eq_tol(st.clip_coef, coef, 1e-6);
        ck_assert_double_eq_tol(st.lr, lr, 1e-12 + 1e-9 * lr);
        switch (c->type) {
        case CT_OPT_SGD: ref_sgd(c, &s, gd, lr, t); break;
        case CT_OPT_LAMB: ref_lamb(c, &s, gd, lr, t); break;
        default: ref_adam(c, &s, gd, lr, t); break;
        }
        float p[N_PARAMS];
        be->mem.copy_d2h(be, p, b.master, sizeof p);
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
    bufs_free(be, &b);
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

START_TEST(lamb_trust_ratio_per_tensor) {
    /* Two weights side by side with the same decay flag (layers' weights laid out one after the
     * other): the element-wise optimizers fuse them into one run, but Lamb's trust ratio is per
     * tensor. Their initial values differ in scale by 32, so their trust ratios are far apart
     * (about 0.6 and 5) and one ratio over the pair fits neither. */
    static const ct_optim_tensor adjacent[] = {{0, 100, true}, {100, 60, true}, {160, 10, false}, {170, 130, true}};
    static const float scale[] = {0.25f, 8.0f, 1.0f, 1.0f};
    use_tensors(adjacent, 4, scale);
    ct_optimizer_cfg c = base_cfg(CT_OPT_LAMB);
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optim *o = make(&c, &no_sched, 0, be, 0, N_PARAMS);
    ck_assert_int_eq(o->n_tensors, 4);
    ck_assert_int_eq(o->n_runs, 3); /* the premise: the first two are one run */
    ct_optim_free(o);
    ct_backend_destroy(be);
    run_case(&c, &no_sched, 0, 1.0f, 34, 0);
    c.bias_correction = false;
    run_case(&c, &no_sched, 0.5, 1.0f, 35, 0);
    /* the fused optimizers on the same layout */
    c = base_cfg(CT_OPT_ADAMW);
    run_case(&c, &no_sched, 0, 1.0f, 36, 0);
    use_tensors(THREE, 3, NULL);
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

START_TEST(clipping_never_scales_up) {
    /* A norm below gradient_clipping leaves the gradients as they are (coefficient 1), also when
     * the gradients come loss-scaled (grad_scale 2^-10: the clip compares the unscaled norm, ~20
     * here, with 25, not the scaled one, ~0.02). SGD: its update is proportional to the
     * gradient, so a coefficient other than 1 shows in every parameter. */
    ct_optimizer_cfg c = base_cfg(CT_OPT_SGD);
    run_case(&c, &no_sched, 25.0, 1.0f, 43, 0);
    run_case(&c, &no_sched, 25.0, 1.0f / 1024, 44, 0);
    c.momentum = 0.9;
    run_case(&c, &no_sched, 1e6, 0.5f, 45, 0);
    c = base_cfg(CT_OPT_ADAM);
    run_case(&c, &no_sched, 25.0, 1.0f, 46, 0);
    /* and the stats say so, for the log */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optim *o = make(&c, &no_sched, 25.0, be, 0, N_PARAMS);
    bufs b = bufs_new(be);
    float g[N_PARAMS];
    fill_random(g, N_PARAMS, 47, 0, -2.0f, 2.0f);
    be->mem.copy_h2d(be, b.grads, g, sizeof g);
    be->mem.copy_h2d(be, b.master, g, sizeof g);
    ct_optim_stats st;
    step(o, &b, NULL, CT_F32, 1.0f, &st);
    ck_assert_double_lt(st.grad_norm, 25.0);
    ck_assert_double_eq(st.clip_coef, 1.0);
    bufs_free(be, &b);
    ct_optim_free(o);
    ct_backend_destroy(be);
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
    ct_optim *o = make(&c, &s, 0, be, 0, N_PARAMS);
    ck_assert_double_eq(ct_optim_next_lr(o), ct_sched_lr(&s, c.lr, -1));
    ct_optim_free(o);
    ct_backend_destroy(be);
}
END_TEST

/* Mixed precision: every update of Adam, SGD and Lamb also writes the 16-bit copy of the
 * parameters, equal bit for bit to rounding the updated fp32 master; an overflowing gradient
 * shows as a non-finite sum of squares, and the caller then skips the update. */
START_TEST(fused_16bit_copy) {
    static const ct_opt_type types[] = {CT_OPT_ADAMW, CT_OPT_SGD, CT_OPT_LAMB};
    static const ct_dtype dts[] = {CT_F16, CT_BF16};
    for (int ti = 0; ti < 3; ti++)
        for (int di = 0; di < 2; di++) {
            ct_backend *be = ct_cpu_backend_create(2);
            ct_optimizer_cfg c = base_cfg(types[ti]);
            if (types[ti] == CT_OPT_SGD) c.momentum = 0.9;
            ct_optim *o = make(&c, &no_sched, 0, be, 0, N_PARAMS);
            bufs b = bufs_new(be);
            uint16_t *copy = be->mem.alloc(be, N_PARAMS * sizeof(uint16_t), CT_MEM_PARAMS);
            float p[N_PARAMS], g[N_PARAMS];
            fill_random(p, N_PARAMS, 40 + (uint64_t)ti, 0, -1.0f, 1.0f);
            be->mem.copy_h2d(be, b.master, p, sizeof p);
            for (long t = 1; t <= 3; t++) {
                fill_random(g, N_PARAMS, 50 + (uint64_t)ti, (uint64_t)t, -2.0f, 2.0f);
                if (t == 3) g[7] = INFINITY;     /* the third update overflows */
                be->mem.copy_h2d(be, b.grads, g, sizeof g);
                bool finite = isfinite(ct_optim_grad_sumsq(o, b.grads));
                ck_assert(finite == (t < 3));
                if (!finite) continue;
                ct_optim_stats st;
                step(o, &b, copy, dts[di], 1.0f, &st);
                be->mem.copy_d2h(be, p, b.master, sizeof p);
                for (int i = 0; i < N_PARAMS; i++) {
                    uint16_t want = dts[di] == CT_F16 ? ct_f32_to_f16(p[i]) : ct_f32_to_bf16(p[i]);
                    ck_assert_msg(copy[i] == want, "%s %s update %ld element %d: copy 0x%04x, expected "
                                  "0x%04x", ct_dtype_name(dts[di]), c.type == CT_OPT_SGD ? "sgd" : "adam/lamb",
                                  t, i, copy[i], want);
                }
            }
            be->mem.free(be, copy);
            bufs_free(be, &b);
            ct_optim_free(o);
            ct_backend_destroy(be);
        }
}
END_TEST

START_TEST(layout) {
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAM);
    ct_optim *o = make(&c, &no_sched, 0, be, 0, N_PARAMS);
    /* Adam: m and v, each 64-byte aligned and disjoint. */
    ck_assert_ptr_nonnull(o->m);
    ck_assert_ptr_nonnull(o->v);
    ck_assert_uint_eq((uintptr_t)o->m % 64, 0);
    ck_assert_uint_eq((uintptr_t)o->v % 64, 0);
    ck_assert(o->v >= o->m + N_PARAMS);
    ck_assert_int_eq(o->n_runs, 3); /* decay flags alternate: no merging */
    ck_assert_uint_eq(ct_optim_state_bytes(o), 2 * 304 * sizeof(float));
    const char *names[CT_OPTIM_MAX_SLOTS];
    float *data[CT_OPTIM_MAX_SLOTS];
    ck_assert_int_eq(ct_optim_slots(o, names, data), 2);
    ck_assert_str_eq(names[0], "exp_avg");
    ck_assert(data[0] == o->m && data[1] == o->v);
    ct_optim_free(o);
    c = base_cfg(CT_OPT_SGD);
    o = make(&c, &no_sched, 0, be, 0, N_PARAMS);
    ck_assert_ptr_null(o->mom);
    ck_assert_uint_eq(ct_optim_state_bytes(o), 0);
    ck_assert_int_eq(ct_optim_slots(o, names, data), 0);
    ct_optim_free(o);
    /* a range cuts tensors: state for the range only, the cut tensors trimmed */
    c = base_cfg(CT_OPT_ADAM);
    o = make(&c, &no_sched, 0, be, 50, 150);
    ck_assert_int_eq(o->n_tensors, 3);
    ck_assert_int_eq(o->tensors[0].offset, 50);
    ck_assert_int_eq(o->tensors[0].numel, 50);
    ck_assert_int_eq(o->tensors[2].offset, 110);
    ck_assert_int_eq(o->tensors[2].numel, 40);
    ck_assert_uint_eq(ct_optim_state_bytes(o), 2 * 112 * sizeof(float));
    ct_optim_free(o);
    /* padding between views (fewer than 8 elements) is merged over: one fused pass */
    static const ct_optim_tensor padded[] = {{0, 13, true}, {16, 30, true}, {48, 5, false}};
    ct_err err = {0};
    ck_assert_int_eq(ct_optim_create(&c, &no_sched, 0, be, padded, 3, 0, 56, &o, &err), CT_OK);
    ck_assert_int_eq(o->n_runs, 2);
    ck_assert_int_eq(o->runs[0].numel, 46);
    ct_optim_free(o);
    ct_backend_destroy(be);
}
END_TEST

/* base_cfg, with momentum for SGD: every type then carries state from step to step. */
static ct_optimizer_cfg stateful_cfg(ct_opt_type t) {
    ct_optimizer_cfg c = base_cfg(t);
    if (t == CT_OPT_SGD) c.momentum = 0.9;
    return c;
}

/* Two buffer sets for comparing two optimizers: the same random master p (seed, stream 0) ... */
static void twin_masters(ct_backend *be, const bufs *a, const bufs *b, float p[N_PARAMS], uint64_t seed) {
    fill_random(p, N_PARAMS, seed, 0, -1.0f, 1.0f);
    be->mem.copy_h2d(be, a->master, p, N_PARAMS * sizeof(float));
    be->mem.copy_h2d(be, b->master, p, N_PARAMS * sizeof(float));
}

/* ... and, at each step t, the same random gradients (seed, stream t). */
static void twin_grads(ct_backend *be, const bufs *a, const bufs *b, uint64_t seed, long t) {
    float g[N_PARAMS];
    fill_random(g, N_PARAMS, seed, (uint64_t)t, -2.0f, 2.0f);
    be->mem.copy_h2d(be, a->grads, g, sizeof g);
    be->mem.copy_h2d(be, b->grads, g, sizeof g);
}

/* ZeRO's seam: an optimizer over [lo, hi) that is given the global norm updates its range
 * exactly as the whole-space optimizer does (bitwise: the update is element-wise), state
 * included; clipping makes the global norm matter. Lamb needs whole tensors. */
static void expect_shard_equals_whole(ct_opt_type type, int64_t lo, int64_t hi) {
    ct_backend *be = ct_cpu_backend_create(2);
    ct_optimizer_cfg c = stateful_cfg(type);
    const double clip = 0.5;   /* the random gradients' norm is ~20: clipping is active */
    ct_optim *whole = make(&c, &no_sched, clip, be, 0, N_PARAMS), *shard = make(&c, &no_sched, clip, be, lo, hi);
    bufs a = bufs_new(be), b = bufs_new(be);
    float p[N_PARAMS];
    twin_masters(be, &a, &b, p, 70);
    for (long t = 1; t <= STEPS; t++) {
        twin_grads(be, &a, &b, 71, t);
        ct_optim_stats sw, ss;
        step(whole, &a, NULL, CT_F32, 0.5f, &sw);
        /* the shard's norm is the global one: the sum of squares over every rank's range */
        double sumsq = ct_optim_grad_sumsq(whole, a.grads);
        ck_assert(ct_optim_grad_sumsq(shard, b.grads + lo) < sumsq);
        ct_optim_target tg = {.master = b.master + lo, .grads = b.grads + lo};
        ct_optim_apply(shard, &tg, 0.5f, sqrt(sumsq) * 0.5, &ss);
        ck_assert_double_eq(ss.clip_coef, sw.clip_coef);
        ck_assert_double_lt(ss.clip_coef, 1.0);
    }
    ck_assert_mem_eq(a.master + lo, b.master + lo, (size_t)(hi - lo) * sizeof(float));
    const char *names[CT_OPTIM_MAX_SLOTS];
    float *sw[CT_OPTIM_MAX_SLOTS], *ssl[CT_OPTIM_MAX_SLOTS];
    int n = ct_optim_slots(whole, names, sw);
    ck_assert_int_eq(ct_optim_slots(shard, names, ssl), n);
    for (int s = 0; s < n; s++) ck_assert_mem_eq(sw[s] + lo, ssl[s], (size_t)(hi - lo) * sizeof(float));
    /* outside the range the shard's buffers were not touched */
    ck_assert_mem_eq(b.master, p, (size_t)lo * sizeof(float));
    bufs_free(be, &a);
    bufs_free(be, &b);
    ct_optim_free(whole);
    ct_optim_free(shard);
    ct_backend_destroy(be);
}

/* Without clipping the norm does not enter the update, so the loop skips computing it on steps
 * that need it for nothing (core/train/loop.c, needs_grad_norm) and passes NAN: the update is the
 * same bit for bit, and the stats say the norm is unknown. With clipping it is needed. */
START_TEST(norm_not_computed_without_clipping) {
    const ct_opt_type types[] = {CT_OPT_ADAM, CT_OPT_ADAMW, CT_OPT_SGD, CT_OPT_LAMB};
    ct_backend *be = ct_cpu_backend_create(2);
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        ct_optimizer_cfg c = stateful_cfg(types[k]);
        ct_optim *known = make(&c, &no_sched, 0, be, 0, N_PARAMS), *unknown = make(&c, &no_sched, 0, be, 0, N_PARAMS);
        ck_assert(!ct_optim_needs_norm(known));
        bufs a = bufs_new(be), b = bufs_new(be);
        float p[N_PARAMS];
        twin_masters(be, &a, &b, p, 80);
        for (long t = 1; t <= STEPS; t++) {
            twin_grads(be, &a, &b, 81, t);
            ct_optim_stats sa, sb;
            step(known, &a, NULL, CT_F32, 0.25f, &sa);
            ct_optim_target tg = {.master = b.master, .grads = b.grads};
            ct_optim_apply(unknown, &tg, 0.25f, NAN, &sb);
            ck_assert(isfinite(sa.grad_norm) && sa.grad_norm > 0 && isnan(sb.grad_norm));
            ck_assert(sa.clip_coef == 1.0 && sb.clip_coef == 1.0 && sa.lr == sb.lr);
        }
        ck_assert_mem_eq(a.master, b.master, sizeof p);
        ck_assert(memcmp(a.master, p, sizeof p) != 0);
        bufs_free(be, &a);
        bufs_free(be, &b);
        ct_optim_free(known);
        ct_optim_free(unknown);
    }
    ct_optimizer_cfg c = base_cfg(CT_OPT_ADAMW);
    ct_optim *clipped = make(&c, &no_sched, 1.0, be, 0, N_PARAMS);
    ck_assert(ct_optim_needs_norm(clipped));
    ct_optim_free(clipped);
    ct_backend_destroy(be);
}
END_TEST

/* ZeRO-Offload's seam: an update in ranges (ct_optim_update_begin, _range over chunks in any
 * order, _end), with the state in host memory pinned by another backend (the capped device's) and
 * the 16-bit copy written range by range into a buffer of its own, equals ct_optim_apply over the
 * whole range bit for bit: master, state, copy, stats, and the next update's bias correction and
 * schedule step. Lamb refuses a range that cuts a tensor and takes one that does not. So does an
 * optimizer with no state of its own (state_at NULL: NVMe offload), given its state range by range
 * in the target: the caller's arrays hold the whole update's state bit for bit. */
static void expect_ranges_equal_whole(ct_opt_type type, const int64_t *cuts, int n_cuts) {
    ct_backend *be = ct_cpu_backend_create(2), *dev = ct_capped_backend_create(1, (size_t)1 << 20, 0);
    ct_optimizer_cfg c = stateful_cfg(type);
    ct_scheduler_cfg warm = no_sched;
    warm.type = CT_SCHED_WARMUP_LR;
    warm.warmup_min_lr = 0, warm.warmup_max_lr = 0.01, warm.warmup_num_steps = 3, warm.warmup_type = CT_WARMUP_LINEAR;
    ct_mem_place host = {dev, be, true};
    ct_optim *whole = make(&c, &warm, 0.5, be, 0, N_PARAMS), *ranged = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_optim_create_in(&c, &warm, 0.5, be, &host, tensors, n_tensors, 0, N_PARAMS, &ranged, &err), CT_OK);
    ct_mem_stats m;
    dev->mem.mem_stats(dev, &m);
    ck_assert_uint_eq(m.host_current[CT_MEM_OPTIM], ct_optim_state_bytes(ranged));   /* pinned by dev */
    ck_assert_uint_eq(m.current_total, 0);
    bool external = type != CT_OPT_LAMB;
    ct_optim *ext = NULL;
    if (external) ck_assert_int_eq(ct_optim_create_in(&c, &warm, 0.5, be, NULL, tensors, n_tensors, 0, N_PARAMS, &ext, &err),
                                   CT_OK);
    float ext_state[CT_OPTIM_MAX_SLOTS][N_PARAMS] = {{0}};
    bufs a = bufs_new(be), b = bufs_new(be), e = bufs_new(be);
    float p[N_PARAMS];
    uint16_t copy_a[N_PARAMS], copy_b[N_PARAMS], copy_e[N_PARAMS];
    twin_masters(be, &a, &b, p, 90);
    twin_masters(be, &a, &e, p, 90);
    for (long t = 1; t <= STEPS; t++) {
        twin_grads(be, &a, &b, 91, t);
        ct_optim_stats sa, sb;
        double sumsq = ct_optim_grad_sumsq(whole, a.grads);
        ct_optim_target ta = {.master = a.master, .grads = a.grads, .copy = copy_a, .copy_dt = CT_BF16};
        ct_optim_apply(whole, &ta, 0.5f, sqrt(sumsq) * 0.5, &sa);
        ct_optim_update u;
        ct_optim_update_begin(ranged, 0.5f, sqrt(sumsq) * 0.5, &u);
        for (int k = n_cuts - 2; k >= 0; k--) {   /* the last range first: any order */
            int64_t lo = cuts[k], hi = cuts[k + 1];
            ct_optim_target tb = {.master = b.master + lo, .grads = b.grads + lo, .copy = copy_b + lo, .copy_dt = CT_BF16};
            ck_assert(ct_optim_update_range(ranged, &u, &tb, lo, hi));
        }
        ct_optim_update_end(ranged, &u, &sb);
        if (external) {
            twin_grads(be, &a, &e, 91, t);
            ct_optim_update_begin(ext, 0.5f, sqrt(sumsq) * 0.5, &u);
            for (int k = 0; k < n_cuts - 1; k++) {
                int64_t lo = cuts[k], hi = cuts[k + 1];
                ct_optim_target te = {.master = e.master + lo, .grads = e.grads + lo, .copy = copy_e + lo,
                                      .copy_dt = CT_BF16, .state = {ext_state[0] + lo, ext_state[1] + lo}};
                ck_assert(ct_optim_update_range(ext, &u, &te, lo, hi));
            }
            ct_optim_update_end(ext, &u, NULL);
        }
        ck_assert(sa.lr == sb.lr && sa.clip_coef == sb.clip_coef && sa.grad_norm == sb.grad_norm);
        ck_assert_double_lt(sa.clip_coef, 1.0);
    }
    ck_assert_mem_eq(a.master, b.master, sizeof p);
    ck_assert_mem_eq(copy_a, copy_b, sizeof copy_a);
    ck_assert(memcmp(a.master, p, sizeof p) != 0);
    const char *names[CT_OPTIM_MAX_SLOTS];
    float *sw[CT_OPTIM_MAX_SLOTS], *sr[CT_OPTIM_MAX_SLOTS];
    int n = ct_optim_slots(whole, names, sw);
    ck_assert_int_eq(ct_optim_slots(ranged, names, sr), n);
    for (int s = 0; s < n; s++) ck_assert_mem_eq(sw[s], sr[s], N_PARAMS * sizeof(float));
    ck_assert_int_eq(ranged->applied, STEPS);
    if (external) {
        float *se[CT_OPTIM_MAX_SLOTS];
        ck_assert_int_eq(ct_optim_slots(ext, names, se), n);
        for (int s = 0; s < n; s++) {
            ck_assert_ptr_null(se[s]);   /* nothing of its own: the checkpoint reaches the caller's */
            ck_assert_mem_eq(sw[s], ext_state[s], N_PARAMS * sizeof(float));
        }
        ck_assert_mem_eq(a.master, e.master, sizeof p);
        ck_assert_mem_eq(copy_a, copy_e, sizeof copy_a);
        ct_optim_free(ext);
    }
    bufs_free(be, &a);
    bufs_free(be, &b);
    bufs_free(be, &e);
    ct_optim_free(whole);
    ct_optim_free(ranged);
    dev->mem.mem_stats(dev, &m);
    ck_assert_uint_eq(m.host_current_total, 0);
    ct_backend_destroy(dev);
    ct_backend_destroy(be);
}

START_TEST(update_in_ranges) {
    const int64_t cuts[] = {0, 37, 100, 101, 211, 300};   /* inside tensors, at their edges, 1 element */
    expect_ranges_equal_whole(CT_OPT_ADAMW, cuts, 6);
    expect_ranges_equal_whole(CT_OPT_ADAM, cuts, 6);
    expect_ranges_equal_whole(CT_OPT_SGD, cuts, 6);
    const int64_t whole_tensors[] = {0, 100, 110, 300};
    expect_ranges_equal_whole(CT_OPT_LAMB, whole_tensors, 4);
    /* Lamb: a range cutting a tensor is refused and changes nothing */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optimizer_cfg c = base_cfg(CT_OPT_LAMB);
    ct_optim *o = make(&c, &no_sched, 0, be, 0, N_PARAMS);
    bufs b = bufs_new(be);
    float p[N_PARAMS];
    twin_masters(be, &b, &b, p, 92);
    twin_grads(be, &b, &b, 93, 1);
    ct_optim_update u;
    ct_optim_update_begin(o, 1.0f, NAN, &u);
    ct_optim_target t = {.master = b.master, .grads = b.grads};
    ck_assert(!ct_optim_update_range(o, &u, &t, 0, 50));
    ck_assert_mem_eq(b.master, p, sizeof p);
    /* Lamb with no state of its own (NVMe offload) is refused: its trust ratio needs a scratch */
    ct_optim *ext = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_optim_create_in(&c, &no_sched, 0, be, NULL, tensors, n_tensors, 0, N_PARAMS, &ext, &err),
                     CT_ERR_CONFIG);
    ck_assert_ptr_null(ext);
    ck_assert_msg(strstr(err.msg, "Lamb"), "%s", err.msg);
    bufs_free(be, &b);
    ct_optim_free(o);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(shard_with_external_norm) {
    expect_shard_equals_whole(CT_OPT_ADAMW, 37, 211);   /* cuts two tensors */
    expect_shard_equals_whole(CT_OPT_ADAM, 150, 300);
    expect_shard_equals_whole(CT_OPT_SGD, 5, 105);
    expect_shard_equals_whole(CT_OPT_LAMB, 100, 300);   /* whole tensors */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_optimizer_cfg c = base_cfg(CT_OPT_LAMB);
    ct_optim *o = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_optim_create(&c, &no_sched, 0, be, tensors, n_tensors, 50, 300, &o, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "whole tensors") && strstr(err.msg, "[50, 300)"), "%s", err.msg);
    ck_assert_ptr_null(o);
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
    tcase_add_test(tc, lamb_trust_ratio_per_tensor);
    tcase_add_test(tc, clipping_active);
    tcase_add_test(tc, clipping_never_scales_up);
    tcase_add_test(tc, schedule_stepping);
    tcase_add_test(tc, layout);
    tcase_add_test(tc, fused_16bit_copy);
    tcase_add_test(tc, shard_with_external_norm);
    tcase_add_test(tc, update_in_ranges);
    tcase_add_test(tc, norm_not_computed_without_clipping);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

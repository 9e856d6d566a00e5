/* sched.c: DeepSpeed's five learning-rate schedules (deepspeed/runtime/lr_schedules.py), as pure
 * functions of t.
 *
 * t is DeepSpeed's last_batch_iteration: -1 before the first applied optimizer update, then +1 per
 * applied update. Each formula below is DeepSpeed's, including its quirks: warmup lengths below 2
 * count as 2, WarmupCosineLR keeps following the cosine past total_num_steps, and OneCycle's
 * stair counts have no effect. */
#include <math.h>
#include <stdio.h>

#include "core/optim/sched.h"

/* Warmup fraction in [0, 1): ln(t+1)/ln(N) ("log") or t/N ("linear"), for 0 <= t < N. */
static double warmup_gamma(ct_warmup_type type, long t, long n) {
    if (type == CT_WARMUP_LINEAR) return (double)t / (double)n;
    return log((double)t + 1.0) / log((double)n);
}

static long warmup_steps(const ct_scheduler_cfg *s) {
    return s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
}

static double warmup_lr(const ct_scheduler_cfg *s, long t) {
    long n = warmup_steps(s);
    double gamma = t < n ? warmup_gamma(s->warmup_type, t, n) : 1.0;
    return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
}

static double warmup_decay_lr(const ct_scheduler_cfg *s, long t) {
    long n = warmup_steps(s);
    if (t < n || s->total_num_steps < 0) return warmup_lr(s, t); /* total unresolved: hold at max */
    long span = s->total_num_steps - n > 1 ? s->total_num_steps - n : 1;
    double gamma = (double)(s->total_num_steps - t) / (double)span;
    if (gamma < 0) gamma = 0;
    return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
}

static double warmup_cosine_lr(const ct_scheduler_cfg *s, double base_lr, long t) {
    long n = warmup_steps(s);
    double ratio;
    if (t < n) {
        ratio = s->warmup_min_ratio + (1.0 - s->warmup_min_ratio) * warmup_gamma(s->warmup_type, t, n);
    } else if (s->total_num_steps <= n) {
        ratio = 1.0; /* total unresolved (or no room for a cosine): hold at base_lr */
    } else {
        double step = (double)(t - n + 1), span = (double)(s->total_num_steps - n);
        double c = 0.5 * (1.0 + cos(M_PI * step / span));
        ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c;
        if (ratio < 0) ratio = 0;
    }
    return base_lr * ratio;
}

/* OneCycle: position in the cycle as a 0..1..0 triangle ("scale"), or -1 in the decay phase. */
static double one_cycle_scale(const ct_scheduler_cfg *s, long t) {
    double total = (double)(s->cycle_first_step_size + s->cycle_second_step_size);
    if ((double)t >= total) return -1;
    double ratio = (double)s->cycle_first_step_size / total;
    double b = (double)t + 1.0;
    double x = b / total - floor(b / total);
    return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

static double one_cycle_lr(const ct_scheduler_cfg *s, long t) {
    double scale = one_cycle_scale(s, t);
    if (scale >= 0) return s->cycle_min_lr + (s->cycle_max_lr - s->cycle_min_lr) * scale;
    if (s->decay_step_size == 0 || s->decay_lr_rate == 0) return s->cycle_min_lr;
    double d = (double)(t - (s->cycle_first_step_size + s->cycle_second_step_size) + 1);
    return s->cycle_min_lr / (1.0 + s->decay_lr_rate * d / (double)s->decay_step_size);
}

static double range_test_lr(const ct_scheduler_cfg *s, long t) {
    double i = (double)(t + 1) / (double)s->lr_range_test_step_size;
    if (s->lr_range_test_staircase) i = floor(i);
    return s->lr_range_test_min_lr * (1.0 + s->lr_range_test_step_rate * i);
}

double ct_sched_lr(const ct_scheduler_cfg *s, double base_lr, long t) {
    switch (s->type) {
    case CT_SCHED_NONE: return base_lr;
    case CT_SCHED_WARMUP_LR: return t < 0 ? s->warmup_min_lr : warmup_lr(s, t);
    case CT_SCHED_WARMUP_DECAY_LR: return t < 0 ? s->warmup_min_lr : warmup_decay_lr(s, t);
    case CT_SCHED_WARMUP_COSINE_LR: return t < 0 ? 0.0 : warmup_cosine_lr(s, base_lr, t);
    case CT_SCHED_ONE_CYCLE: return t < 0 ? s->cycle_min_lr : one_cycle_lr(s, t);
    case CT_SCHED_LR_RANGE_TEST: return t < 0 ? s->lr_range_test_min_lr : range_test_lr(s, t);
    }
    return base_lr;
}

bool ct_sched_betas(const ct_scheduler_cfg *s, long t, double *beta1, double *beta2) {
    if (s->type != CT_SCHED_ONE_CYCLE || !s->cycle_momentum) return false;
    *beta2 = 0.99; /* DeepSpeed forces beta2 while it cycles momentum */
    if (t < 0) {
        *beta1 = s->cycle_min_mom;
        return true;
    }
    double scale = one_cycle_scale(s, t);
    if (scale >= 0) {
        *beta1 = s->cycle_max_mom - (s->cycle_max_mom - s->cycle_min_mom) * scale;
    } else if (s->decay_mom_rate != 0 && s->decay_step_size != 0) {
        double d = (double)(t - (s->cycle_first_step_size + s->cycle_second_step_size) + 1);
        *beta1 = s->cycle_max_mom * (1.0 + s->decay_mom_rate * d / (double)s->decay_step_size);
    } else {
        *beta1 = s->cycle_max_mom;
    }
    return true;
}

void ct_sched_resolve_total(ct_scheduler_cfg *s, long run_total_steps, char *warn, size_t n) {
    warn[0] = '\0';
    bool decay = s->type == CT_SCHED_WARMUP_DECAY_LR, cosine = s->type == CT_SCHED_WARMUP_COSINE_LR;
    if (!decay && !cosine) return;
    if (s->total_num_steps < 0) {
        s->total_num_steps = run_total_steps;
        return;
    }
    /* Updates with t >= total: WarmupDecayLR sits at its minimum, WarmupCosineLR climbs back. */
    long past = run_total_steps - 1 - s->total_num_steps;
    if (past <= 0) return;
    char what[160];
    if (decay)
        snprintf(what, sizeof what, "WarmupDecayLR holds the LR at warmup_min_lr (%g) for the last %ld steps",
                 s->warmup_min_lr, past);
    else
        snprintf(what, sizeof what, "WarmupCosineLR passes its minimum and the LR rises again for the last %ld "
                 "steps (DeepSpeed's formula)", past);
    snprintf(warn, n, "scheduler.params.total_num_steps: %ld is shorter than the run (%ld optimizer steps): %s; "
             "set it to %ld or \"auto\"", s->total_num_steps, run_total_steps, what, run_total_steps);
}

long ct_curriculum_difficulty(const ct_curriculum_cfg *c, long s, long current) {
    if (current >= c->max_difficulty) return current;
    switch (c->schedule) {
    case CT_CURRICULUM_FIXED_LINEAR:
    case CT_CURRICULUM_FIXED_ROOT: {
        double frac = pow((double)s / (double)c->total_curriculum_step, 1.0 / c->root_degree);
        long v = (long)floor(frac * (double)(c->max_difficulty - c->min_difficulty) + (double)c->min_difficulty);
        v -= v % c->difficulty_step;
        return v < c->max_difficulty ? v : c->max_difficulty;
    }
    case CT_CURRICULUM_FIXED_DISCRETE:
        for (int i = 0; i + 1 < c->stages; i++)
            if (s <= c->max_step[i]) return c->difficulty[i];
        return c->difficulty[c->stages - 1];
    case CT_CURRICULUM_CUSTOM: break;
    }
    return current;
}

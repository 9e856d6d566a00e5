/* optim.c: the optimizer step over a range of the flat parameter space (semantics in optim.h). */
#include "core/optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/params/layout.h"
#include "core/optim/sched.h"

/* Sub-buffers start on 64-byte boundaries: round element counts up to 16 floats. */
static int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

static bool uses_moments(ct_opt_type t) { return t != CT_OPT_SGD; }
static bool uses_momentum(ct_opt_type t, double momentum) { return t == CT_OPT_SGD && momentum != 0; }

size_t ct_optim_state_bytes_for(ct_opt_type type, double momentum, int64_t numel) {
    int64_t n = round16(numel);
    if (uses_moments(type)) return (size_t)(2 * n) * sizeof(float);
    return uses_momentum(type, momentum) ? (size_t)n * sizeof(float) : 0;
}

/* Merge neighbouring tensors with the same weight-decay flag, also across the alignment padding
 * between views (always zero: its update is zero): fewer, longer fused passes. */
static int merge_runs(const ct_optim_tensor *t, int n, ct_optim_tensor *runs) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        int64_t end = k > 0 ? runs[k - 1].offset + runs[k - 1].numel : 0;
        if (k > 0 && runs[k - 1].weight_decay == t[i].weight_decay && t[i].offset >= end &&
            t[i].offset - end < CT_VIEW_ALIGN) {
            runs[k - 1].numel = t[i].offset + t[i].numel - runs[k - 1].offset;
        } else {
            runs[k++] = t[i];
        }
    }
    return k;
}

/* The tensors inside [lo, hi), cut at the bounds; -1 when Lamb would have to cut one. */
static int clip_tensors(const ct_optim_tensor *t, int n, int64_t lo, int64_t hi, bool whole_only,
                        ct_optim_tensor *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        int64_t a = t[i].offset > lo ? t[i].offset : lo;
        int64_t b = t[i].offset + t[i].numel < hi ? t[i].offset + t[i].numel : hi;
        if (a >= b) continue;
        if (whole_only && (a != t[i].offset || b != t[i].offset + t[i].numel)) return -1;
        out[k++] = (ct_optim_tensor){a, b - a, t[i].weight_decay};
    }
    return k;
}

int ct_optim_create(const ct_optimizer_cfg *ocfg, const ct_scheduler_cfg *scfg, double clip,
                    ct_backend *be, const ct_optim_tensor *tensors, int n_tensors, int64_t lo,
                    int64_t hi, ct_optim **out, ct_err *err) {
    ct_mem_place dev = ct_mem_device(be);
    return ct_optim_create_in(ocfg, scfg, clip, be, &dev, tensors, n_tensors, lo, hi, out, err);
}

int ct_optim_create_in(const ct_optimizer_cfg *ocfg, const ct_scheduler_cfg *scfg, double clip,
                       ct_backend *be, const ct_mem_place *state_at, const ct_optim_tensor *tensors,
                       int n_tensors, int64_t lo, int64_t hi, ct_optim **out, ct_err *err) {
    *out = NULL;
    if (!state_at && ocfg->type == CT_OPT_LAMB)
        return ct_errf(err, CT_ERR_CONFIG, "optimizer Lamb cannot keep its state outside the optimizer (NVMe offload): "
                       "its trust ratio needs a scratch as large as a tensor; use Adam or AdamW");
    ct_optim *o = ct_xcalloc(1, sizeof *o);
    o->external = state_at == NULL;
    if (state_at) o->state_at = *state_at;
    o->cfg = *ocfg;
    if (scfg) o->sched = *scfg;
    else o->sched.type = CT_SCHED_NONE;
    o->clip = clip;
    o->be = be;
    o->lo = lo;
    o->hi = hi;
    o->sched_t = -1;

    o->tensors = ct_xmalloc((size_t)(n_tensors ? n_tensors : 1) * sizeof *o->tensors);
    o->n_tensors = clip_tensors(tensors, n_tensors, lo, hi, ocfg->type == CT_OPT_LAMB, o->tensors);
    if (o->n_tensors < 0) {
        ct_optim_free(o);
        return ct_errf(err, CT_ERR_CONFIG, "Lamb's trust ratio needs whole tensors, but the range "
                       "[%lld, %lld) cuts one", (long long)lo, (long long)hi);
    }
    o->runs = ct_xmalloc((size_t)(o->n_tensors ? o->n_tensors : 1) * sizeof *o->runs);
    o->n_runs = merge_runs(o->tensors, o->n_tensors, o->runs);

    /* One allocation: m | v (or mom) | Lamb scratch; none for external state. */
    size_t bytes = o->external ? 0 : ct_optim_state_bytes(o);
    o->block = bytes ? ct_place_alloc(state_at, bytes, CT_MEM_OPTIM) : NULL;
    if (bytes && !o->block) {
        ct_optim_free(o);
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %.1f MiB of optimizer state %s%s",
                       (double)bytes / 1048576.0, state_at->host ? "in host memory beside " : "on ",
                       state_at->be->name);
    }
    if (!bytes) {
        *out = o;
        return CT_OK;
    }
    ct_place_zero(state_at, o->block, bytes);
    int64_t n16 = round16(hi - lo);
    float *p = o->block;
    if (uses_moments(ocfg->type)) {
        o->m = p;
        o->v = p + n16;
        p += 2 * n16;
    } else if (uses_momentum(ocfg->type, ocfg->momentum)) {
        o->mom = p;
        p += n16;
    }
    if (ocfg->type == CT_OPT_LAMB) o->scratch = p;
    *out = o;
    return CT_OK;
}

void ct_optim_free(ct_optim *o) {
    if (!o) return;
    if (o->block) ct_place_free(&o->state_at, o->block);
    free(o->tensors);
    free(o->runs);
    free(o);
}

size_t ct_optim_state_bytes(const ct_optim *o) {
    int64_t max_numel = 0;
    for (int i = 0; i < o->n_tensors; i++)
        if (o->tensors[i].numel > max_numel) max_numel = o->tensors[i].numel;
    size_t scratch = o->cfg.type == CT_OPT_LAMB ? (size_t)round16(max_numel) * sizeof(float) : 0;
    return ct_optim_state_bytes_for(o->cfg.type, o->cfg.momentum, o->hi - o->lo) + scratch;
}

int ct_optim_slot_names(ct_opt_type type, double momentum, const char *names[CT_OPTIM_MAX_SLOTS]) {
    int k = 0;
    if (uses_moments(type)) names[k++] = "exp_avg", names[k++] = "exp_avg_sq";
    else if (uses_momentum(type, momentum)) names[k++] = "momentum_buffer";
    return k;
}

int ct_optim_slots(const ct_optim *o, const char *names[CT_OPTIM_MAX_SLOTS], float *data[CT_OPTIM_MAX_SLOTS]) {
    int k = ct_optim_slot_names(o->cfg.type, o->cfg.momentum, names);
    float *own[CT_OPTIM_MAX_SLOTS] = {o->m ? o->m : o->mom, o->v};   /* NULL for external state */
    for (int i = 0; i < k; i++) data[i] = own[i];
    return k;
}

const char *ct_optim_type_name(const ct_optim *o) {
    static const char *const names[] = {"Adam", "AdamW", "SGD", "Lamb"};
    return (unsigned)o->cfg.type < 4 ? names[o->cfg.type] : "?";
}

double ct_optim_next_lr(const ct_optim *o) { return ct_sched_lr(&o->sched, o->cfg.lr, o->sched_t); }

/* ---- the three update families; gscale already includes loss scale and clipping ---- */

/* The elements [a, b) of one update: the target's pointers are at element a (o->lo for a whole
 * update). */
typedef struct span {
    const ct_optim_target *t;
    int64_t a, b;
} span;

static float *master_at(const span *s, int64_t offset) { return s->t->master + (offset - s->a); }
static const float *grads_at(const span *s, int64_t offset) { return s->t->grads + (offset - s->a); }
/* Slot s of the state (ct_optim_slots' order) at `offset`: the optimizer's own, or the target's. */
static float *slot_at(const ct_optim *o, const span *sp, int s, int64_t offset) {
    if (o->external) return sp->t->state[s] ? sp->t->state[s] + (offset - sp->a) : NULL;
    float *own[CT_OPTIM_MAX_SLOTS] = {o->m ? o->m : o->mom, o->v};
    return own[s] ? own[s] + (offset - o->lo) : NULL;
}
static void *copy_at(const span *s, int64_t offset) {
    return s->t->copy ? ct_elem(s->t->copy, offset - s->a, s->t->copy_dt) : NULL;
}

/* Run r cut to the span: false when they do not meet. */
static bool run_in(const ct_optim_tensor *r, const span *s, int64_t *lo, int64_t *n) {
    int64_t a = r->offset > s->a ? r->offset : s->a, b = r->offset + r->numel < s->b ? r->offset + r->numel : s->b;
    *lo = a, *n = b - a;
    return b > a;
}

static void step_adam(ct_optim *o, const span *sp, const ct_optim_update *u) {
    const ct_optimizer_cfg *c = &o->cfg;
    double t = (double)(o->applied + 1);
    ct_adam_args a = {
        .lr = (float)u->lr,
        .beta1 = (float)u->beta1,
        .beta2 = (float)u->beta2,
        .eps = (float)c->eps,
        .bias_c1 = c->bias_correction ? (float)(1.0 - pow(u->beta1, t)) : 1.0f,
        .bias_c2 = c->bias_correction ? (float)(1.0 - pow(u->beta2, t)) : 1.0f,
        .grad_scale = u->gscale,
        .decoupled = c->type == CT_OPT_ADAMW || c->adam_w_mode,
        .copy_dt = sp->t->copy_dt,
    };
    for (int i = 0; i < o->n_runs; i++) {
        const ct_optim_tensor *r = &o->runs[i];
        int64_t at, n;
        if (!run_in(r, sp, &at, &n)) continue;
        a.weight_decay = r->weight_decay ? (float)c->weight_decay : 0.0f;
        a.copy = copy_at(sp, at);
        o->be->optim.adam_step(o->be, master_at(sp, at), grads_at(sp, at), slot_at(o, sp, 0, at),
                               slot_at(o, sp, 1, at), n, &a);
    }
}

static void step_sgd(ct_optim *o, const span *sp, const ct_optim_update *u) {
    const ct_optimizer_cfg *c = &o->cfg;
    ct_sgd_args a = {
        .lr = (float)u->lr,
        .momentum = (float)c->momentum,
        .dampening = (float)c->dampening,
        .grad_scale = u->gscale,
        .nesterov = c->nesterov,
        .first_step = o->applied == 0,
        .copy_dt = sp->t->copy_dt,
    };
    for (int i = 0; i < o->n_runs; i++) {
        const ct_optim_tensor *r = &o->runs[i];
        int64_t at, n;
        if (!run_in(r, sp, &at, &n)) continue;
        a.weight_decay = r->weight_decay ? (float)c->weight_decay : 0.0f;
        a.copy = copy_at(sp, at);
        o->be->optim.sgd_step(o->be, master_at(sp, at), grads_at(sp, at), slot_at(o, sp, 0, at), n, &a);
    }
}

/* DeepSpeed's FusedLamb: the direction uses raw moments; bias correction only scales the step.
 * Whole tensors only: ct_optim_update_range refuses a span that cuts one. */
static void step_lamb(ct_optim *o, const span *sp, const ct_optim_update *u) {
    const ct_optimizer_cfg *c = &o->cfg;
    double t = (double)(o->applied + 1);
    double step_size = u->lr;
    if (c->bias_correction) step_size = u->lr * sqrt(1.0 - pow(u->beta2, t)) / (1.0 - pow(u->beta1, t));
    ct_lamb_args a = {
        .beta1 = (float)u->beta1,
        .beta2 = (float)u->beta2,
        .eps = (float)c->eps,
        .bias_c1 = 1.0f,
        .bias_c2 = 1.0f,
        .grad_scale = u->gscale,
        .eps_inside_sqrt = c->eps_inside_sqrt,
    };
    for (int i = 0; i < o->n_tensors; i++) {
        const ct_optim_tensor *r = &o->tensors[i];
        int64_t at, n;
        if (!run_in(r, sp, &at, &n)) continue;
        a.weight_decay = r->weight_decay ? (float)c->weight_decay : 0.0f;
        double wn = 0, un = 0;
        float *p = master_at(sp, at);
        o->be->optim.lamb_direction(o->be, o->scratch, p, grads_at(sp, at), slot_at(o, sp, 0, at),
                                    slot_at(o, sp, 1, at), n, &a, &wn, &un);
        double trust = 1.0;
        if (wn != 0 && un != 0) {
            trust = wn / un;
            if (trust > c->max_coeff) trust = c->max_coeff;
            if (trust < c->min_coeff) trust = c->min_coeff;
        }
        o->be->elt.axpy(o->be, p, (float)(-step_size * trust), o->scratch, n, CT_F32);
        /* the trust ratio needs the whole direction first, so Lamb's copy is a pass of its own */
        if (sp->t->copy) o->be->elt.cast(o->be, copy_at(sp, at), sp->t->copy_dt, p, CT_F32, n);
    }
}

double ct_optim_grad_sumsq(const ct_optim *o, const float *grads_lo) {
    return o->be->optim.sum_squares(o->be, grads_lo, o->hi - o->lo);
}

bool ct_optim_needs_norm(const ct_optim *o) { return o->clip > 0; }

void ct_optim_update_begin(ct_optim *o, float grad_scale, double norm, ct_optim_update *u) {
    double coef = 1.0;
    /* torch.nn.utils.clip_grad_norm_ and DeepSpeed: max_norm / (norm + 1e-6), only when < 1. */
    if (o->clip > 0) {
        double c = o->clip / (norm + 1e-6);
        if (c < 1.0) coef = c;
    }
    *u = (ct_optim_update){.gscale = (float)(grad_scale * coef), .beta1 = o->cfg.beta1, .beta2 = o->cfg.beta2,
                           .lr = ct_sched_lr(&o->sched, o->cfg.lr, o->sched_t)};
    double b1, b2;
    /* OneCycle momentum cycling (DeepSpeed cycles only optimizers with betas, never SGD's). */
    if (ct_sched_betas(&o->sched, o->sched_t, &b1, &b2)) {
        u->beta1 = b1;
        u->beta2 = b2;
    }
    u->stats = (ct_optim_stats){.grad_norm = norm, .clip_coef = coef, .lr = u->lr};
}

bool ct_optim_update_range(ct_optim *o, const ct_optim_update *u, const ct_optim_target *t, int64_t a, int64_t b) {
    span sp = {t, a < o->lo ? o->lo : a, b > o->hi ? o->hi : b};
    if (sp.b <= sp.a) return true;
    if (o->cfg.type == CT_OPT_LAMB) {   /* its trust ratio needs every tensor whole */
        for (int i = 0; i < o->n_tensors; i++) {
            int64_t at, n;
            if (run_in(&o->tensors[i], &sp, &at, &n) && n != o->tensors[i].numel) return false;
        }
    }
    switch (o->cfg.type) {
    case CT_OPT_ADAM:
    case CT_OPT_ADAMW: step_adam(o, &sp, u); break;
    case CT_OPT_SGD: step_sgd(o, &sp, u); break;
    case CT_OPT_LAMB: step_lamb(o, &sp, u); break;
    }
    return true;
}

void ct_optim_update_end(ct_optim *o, const ct_optim_update *u, ct_optim_stats *stats) {
    o->applied++;
    o->sched_t++;
    if (stats) *stats = u->stats;
}

void ct_optim_apply(ct_optim *o, const ct_optim_target *t, float grad_scale, double norm,
                    ct_optim_stats *stats) {
    ct_optim_update u;
    ct_optim_update_begin(o, grad_scale, norm, &u);
    ct_optim_update_range(o, &u, t, o->lo, o->hi);
    ct_optim_update_end(o, &u, stats);
}

bool ct_optim_apply_finite(ct_optim *o, const ct_optim_target *t, float grad_scale, double sumsq,
                           ct_optim_stats *stats) {
    /* Squares summed in double cannot overflow from finite floats, so the sum is finite exactly
     * when every gradient is: the overflow check costs no pass of its own. */
    if (!isfinite(sumsq)) {
        if (stats) *stats = (ct_optim_stats){.grad_norm = NAN, .clip_coef = 1.0, .lr = ct_optim_next_lr(o)};
        return false;
    }
    ct_optim_apply(o, t, grad_scale, sqrt(sumsq) * grad_scale, stats);
    return true;
}

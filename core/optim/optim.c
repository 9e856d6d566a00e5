/* optim.c: the optimizer step over flat buffers (semantics in optim.h). */
#include "core/optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/graph.h"
#include "core/optim/sched.h"

/* Sub-buffers start on 64-byte boundaries: round element counts up to 16 floats. */
static int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

static bool uses_moments(ct_opt_type t) { return t != CT_OPT_SGD; }
static bool uses_momentum(ct_opt_type t, double momentum) { return t == CT_OPT_SGD && momentum != 0; }

size_t ct_optim_state_bytes_for(ct_opt_type type, double momentum, int64_t n_params) {
    int64_t n = round16(n_params);
    if (uses_moments(type)) return (size_t)(2 * n) * sizeof(float);
    return uses_momentum(type, momentum) ? (size_t)n * sizeof(float) : 0;
}

/* Merge neighbouring tensors with the same weight-decay flag: fewer, longer fused passes. */
static int merge_runs(const ct_optim_tensor *t, int n, ct_optim_tensor *runs) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k > 0 && runs[k - 1].weight_decay == t[i].weight_decay &&
            runs[k - 1].offset + runs[k - 1].numel == t[i].offset) {
            runs[k - 1].numel += t[i].numel;
        } else {
            runs[k++] = t[i];
        }
    }
    return k;
}

ct_optim *ct_optim_create(const ct_optimizer_cfg *ocfg, const ct_scheduler_cfg *scfg, double clip,
                          ct_backend *be, const ct_optim_tensor *tensors, int n_tensors,
                          int64_t n_params) {
    ct_optim *o = ct_xcalloc(1, sizeof *o);
    o->cfg = *ocfg;
    if (scfg) o->sched = *scfg;
    else o->sched.type = CT_SCHED_NONE;
    o->clip = clip;
    o->be = be;
    o->n = n_params;
    o->applied = 0;
    o->sched_t = -1;

    o->tensors = ct_xmalloc((size_t)(n_tensors ? n_tensors : 1) * sizeof *o->tensors);
    memcpy(o->tensors, tensors, (size_t)n_tensors * sizeof *tensors);
    o->n_tensors = n_tensors;
    o->runs = ct_xmalloc((size_t)(n_tensors ? n_tensors : 1) * sizeof *o->runs);
    o->n_runs = merge_runs(tensors, n_tensors, o->runs);

    int64_t max_numel = 0;
    for (int i = 0; i < n_tensors; i++)
        if (tensors[i].numel > max_numel) max_numel = tensors[i].numel;

    /* Three allocations so memory reports can tell them apart: master params, grads, and the
     * state: m | v (or mom) | Lamb scratch. */
    int64_t n16 = round16(n_params);
    int64_t state = (int64_t)(ct_optim_state_bytes_for(ocfg->type, ocfg->momentum, n_params) / sizeof(float));
    int64_t scratch = ocfg->type == CT_OPT_LAMB ? round16(max_numel) : 0;
    size_t pbytes = (size_t)n16 * sizeof(float), sbytes = (size_t)(state + scratch) * sizeof(float);
    o->params = be->mem.alloc(be, pbytes ? pbytes : 64, CT_MEM_MASTER);
    o->grads = be->mem.alloc(be, pbytes ? pbytes : 64, CT_MEM_GRADS);
    o->block = sbytes ? be->mem.alloc(be, sbytes, CT_MEM_OPTIM) : NULL;
    if (!o->params || !o->grads || (sbytes && !o->block)) {
        ct_optim_free(o);
        return NULL;
    }
    be->mem.memset0(be, o->params, pbytes);
    be->mem.memset0(be, o->grads, pbytes);
    if (sbytes) be->mem.memset0(be, o->block, sbytes);
    float *p = o->block;
    if (uses_moments(ocfg->type)) {
        o->m = p;
        o->v = p + n16;
        p += 2 * n16;
    } else if (uses_momentum(ocfg->type, ocfg->momentum)) {
        o->mom = p;
        p += n16;
    }
    if (scratch) o->scratch = p;
    return o;
}

static int cmp_offset(const void *a, const void *b) {
    int64_t x = ((const ct_optim_tensor *)a)->offset, y = ((const ct_optim_tensor *)b)->offset;
    return (x > y) - (x < y);
}

ct_optim *ct_optim_create_for_graph(const ct_config *cfg, ct_backend *be, const struct ct_graph *g) {
    int nv = ct_graph_num_views(g);
    ct_optim_tensor *t = ct_xmalloc((size_t)(nv ? nv : 1) * sizeof *t);
    int k = 0;
    for (int i = 0; i < nv; i++) {
        const ct_param_view *v = ct_graph_view(g, i);
        if (!v->trainable) continue;
        t[k++] = (ct_optim_tensor){v->offset, v->numel, v->weight_decay};
    }
    qsort(t, (size_t)k, sizeof *t, cmp_offset);
    ct_optim *o = ct_optim_create(&cfg->optimizer, &cfg->scheduler, cfg->gradient_clipping, be, t, k,
                                  ct_graph_info_get(g)->n_params);
    free(t);
    return o;
}

void ct_optim_free(ct_optim *o) {
    if (!o) return;
    if (o->params) o->be->mem.free(o->be, o->params);
    if (o->grads) o->be->mem.free(o->be, o->grads);
    if (o->block) o->be->mem.free(o->be, o->block);
    free(o->tensors);
    free(o->runs);
    free(o);
}

size_t ct_optim_param_bytes(const ct_optim *o) { return (size_t)o->n * sizeof(float); }

size_t ct_optim_state_bytes(const ct_optim *o) {
    return ct_optim_state_bytes_for(o->cfg.type, o->cfg.momentum, o->n);
}

void ct_optim_zero_grad(ct_optim *o) { o->be->mem.memset0(o->be, o->grads, (size_t)o->n * sizeof(float)); }

double ct_optim_next_lr(const ct_optim *o) { return ct_sched_lr(&o->sched, o->cfg.lr, o->sched_t); }

/* ---- the three update families; gscale already includes loss scale and clipping ---- */

void ct_optim_set_copy(ct_optim *o, void *copy, ct_dtype dt) {
    o->copy = copy;
    o->copy_dt = dt;
}

/* Where run r's elements start in the 16-bit copy (NULL without one). */
static void *copy_at(const ct_optim *o, int64_t offset) {
    return o->copy ? ct_elem(o->copy, offset, o->copy_dt) : NULL;
}

static void step_adam(ct_optim *o, double lr, double beta1, double beta2, float gscale) {
    const ct_optimizer_cfg *c = &o->cfg;
    double t = (double)(o->applied + 1);
    ct_adam_args a = {
        .lr = (float)lr,
        .beta1 = (float)beta1,
        .beta2 = (float)beta2,
        .eps = (float)c->eps,
        .bias_c1 = c->bias_correction ? (float)(1.0 - pow(beta1, t)) : 1.0f,
        .bias_c2 = c->bias_correction ? (float)(1.0 - pow(beta2, t)) : 1.0f,
        .grad_scale = gscale,
        .decoupled = c->type == CT_OPT_ADAMW || c->adam_w_mode,
        .copy_dt = o->copy_dt,
    };
    for (int i = 0; i < o->n_runs; i++) {
        const ct_optim_tensor *r = &o->runs[i];
        a.weight_decay = r->weight_decay ? (float)c->weight_decay : 0.0f;
        a.copy = copy_at(o, r->offset);
        o->be->optim.adam_step(o->be, o->params + r->offset, o->grads + r->offset, o->m + r->offset,
                         o->v + r->offset, r->numel, &a);
    }
}

static void step_sgd(ct_optim *o, double lr, float gscale) {
    const ct_optimizer_cfg *c = &o->cfg;
    ct_sgd_args a = {
        .lr = (float)lr,
        .momentum = (float)c->momentum,
        .dampening = (float)c->dampening,
        .grad_scale = gscale,
        .nesterov = c->nesterov,
        .first_step = o->applied == 0,
        .copy_dt = o->copy_dt,
    };
    for (int i = 0; i < o->n_runs; i++) {
        const ct_optim_tensor *r = &o->runs[i];
        a.weight_decay = r->weight_decay ? (float)c->weight_decay : 0.0f;
        a.copy = copy_at(o, r->offset);
        o->be->optim.sgd_step(o->be, o->params + r->offset, o->grads + r->offset,
                        o->mom ? o->mom + r->offset : NULL, r->numel, &a);
    }
}

/* DeepSpeed's FusedLamb: the direction uses raw moments; bias correction only scales the step. */
static void step_lamb(ct_optim *o, double lr, double beta1, double beta2, float gscale) {
    const ct_optimizer_cfg *c = &o->cfg;
    double t = (double)(o->applied + 1);
    double step_size = lr;
    if (c->bias_correction) step_size = lr * sqrt(1.0 - pow(beta2, t)) / (1.0 - pow(beta1, t));
    ct_lamb_args a = {
        .beta1 = (float)beta1,
        .beta2 = (float)beta2,
        .eps = (float)c->eps,
        .bias_c1 = 1.0f,
        .bias_c2 = 1.0f,
        .grad_scale = gscale,
        .eps_inside_sqrt = c->eps_inside_sqrt,
    };
    for (int i = 0; i < o->n_tensors; i++) {
        const ct_optim_tensor *r = &o->tensors[i];
        a.weight_decay = r->weight_decay ? (float)c->weight_decay : 0.0f;
        double wn = 0, un = 0;
        o->be->optim.lamb_direction(o->be, o->scratch, o->params + r->offset, o->grads + r->offset,
                              o->m + r->offset, o->v + r->offset, r->numel, &a, &wn, &un);
        double trust = 1.0;
        if (wn != 0 && un != 0) {
            trust = wn / un;
            if (trust > c->max_coeff) trust = c->max_coeff;
            if (trust < c->min_coeff) trust = c->min_coeff;
        }
        o->be->elt.axpy(o->be, o->params + r->offset, (float)(-step_size * trust), o->scratch, r->numel,
                    CT_F32);
        /* the trust ratio needs the whole direction first, so Lamb's copy is a pass of its own */
        if (o->copy)
            o->be->elt.cast(o->be, copy_at(o, r->offset), o->copy_dt, o->params + r->offset, CT_F32, r->numel);
    }
}

/* The update, given the global norm of the gradients times grad_scale. */
static void step_with_norm(ct_optim *o, float grad_scale, double norm, ct_optim_stats *stats) {
    double coef = 1.0;
    /* torch.nn.utils.clip_grad_norm_ and DeepSpeed: max_norm / (norm + 1e-6), only when < 1. */
    if (o->clip > 0) {
        double c = o->clip / (norm + 1e-6);
        if (c < 1.0) coef = c;
    }
    float gscale = (float)(grad_scale * coef);

    double lr = ct_sched_lr(&o->sched, o->cfg.lr, o->sched_t);
    double beta1 = o->cfg.beta1, beta2 = o->cfg.beta2, b1, b2;
    /* OneCycle momentum cycling (DeepSpeed cycles only optimizers with betas, never SGD's). */
    if (ct_sched_betas(&o->sched, o->sched_t, &b1, &b2)) {
        beta1 = b1;
        beta2 = b2;
    }

    switch (o->cfg.type) {
    case CT_OPT_ADAM:
    case CT_OPT_ADAMW: step_adam(o, lr, beta1, beta2, gscale); break;
    case CT_OPT_SGD: step_sgd(o, lr, gscale); break;
    case CT_OPT_LAMB: step_lamb(o, lr, beta1, beta2, gscale); break;
    }
    o->applied++;
    o->sched_t++;
    if (stats) *stats = (ct_optim_stats){.grad_norm = norm, .clip_coef = coef, .lr = lr};
}

void ct_optim_step(ct_optim *o, float grad_scale, ct_optim_stats *stats) {
    step_with_norm(o, grad_scale, sqrt(o->be->optim.sum_squares(o->be, o->grads, o->n)) * grad_scale, stats);
}

bool ct_optim_step_finite(ct_optim *o, float grad_scale, ct_optim_stats *stats) {
    /* Squares summed in double cannot overflow from finite floats, so the sum is finite exactly
     * when every gradient is: the overflow check costs no pass of its own. */
    double ss = o->be->optim.sum_squares(o->be, o->grads, o->n);
    if (!isfinite(ss)) {
        if (stats) *stats = (ct_optim_stats){.grad_norm = NAN, .clip_coef = 1.0,
                                             .lr = ct_optim_next_lr(o)};
        return false;
    }
    step_with_norm(o, grad_scale, sqrt(ss) * grad_scale, stats);
    return true;
}

/* optimizer.c: the "optimizer" and "scheduler" sections (DeepSpeed's deepspeed/runtime/config.py
 * and deepspeed/runtime/lr_schedules.py).
 *
 * Parameter tables per type; DeepSpeed's required keys and its "auto" meanings (HF tooling) are
 * the code around them. The schedules themselves are in sched.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config/internal.h"

/* ------------------------------------------------------------------------------------------ */
/* Optimizer                                                                                   */

static const ct_field adam_fields[] = {
    CT_F_NUM(ct_optimizer_cfg, lr, 1e-3, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, eps, 1e-8, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, weight_decay, 0.0, 0, CT_INF),
    CT_F_BOOL(ct_optimizer_cfg, bias_correction, true),
    CT_F_BOOL(ct_optimizer_cfg, adam_w_mode, true),
    CT_U_BOOL("amsgrad"), CT_U_BOOL("torch_adam"), CT_U_BOOL("fused"), CT_U_BOOL("foreach"),
};
static const ct_field lamb_fields[] = {
    CT_F_NUM(ct_optimizer_cfg, lr, 1e-3, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, eps, 1e-8, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, weight_decay, 0.0, 0, CT_INF),
    CT_F_BOOL(ct_optimizer_cfg, bias_correction, true),
    CT_F_NUM(ct_optimizer_cfg, max_coeff, 10.0, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, min_coeff, 0.01, 0, CT_INF),
    CT_F_BOOL(ct_optimizer_cfg, eps_inside_sqrt, false),
    CT_U_BOOL("amsgrad"),
};
static const ct_field sgd_fields[] = {
    CT_F_NUM(ct_optimizer_cfg, lr, 1e-2, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, momentum, 0.0, 0, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, dampening, 0.0, -CT_INF, CT_INF),
    CT_F_NUM(ct_optimizer_cfg, weight_decay, 0.0, 0, CT_INF),
    CT_F_BOOL(ct_optimizer_cfg, nesterov, false),
    CT_U_BOOL("maximize"), CT_U_BOOL("foreach"), CT_U_BOOL("differentiable"), CT_U_BOOL("fused"),
};
static const char *const opt_param_custom[] = {"betas", "max_grad_norm"};

static const ct_section opt_secs[] = {
    [CT_OPT_ADAM] = {"optimizer.params", adam_fields, CT_ARRAY_LEN(adam_fields), opt_param_custom, 2, false, false,
                     false, false},
    [CT_OPT_ADAMW] = {"optimizer.params", adam_fields, CT_ARRAY_LEN(adam_fields), opt_param_custom, 2, false,
                      false, false, false},
    [CT_OPT_SGD] = {"optimizer.params", sgd_fields, CT_ARRAY_LEN(sgd_fields), NULL, 0, false, false, false, false},
    [CT_OPT_LAMB] = {"optimizer.params", lamb_fields, CT_ARRAY_LEN(lamb_fields), opt_param_custom, 2, false, false,
                     false, false},
};
static const char *const opt_names[] = {[CT_OPT_ADAM] = "Adam", [CT_OPT_ADAMW] = "AdamW", [CT_OPT_SGD] = "SGD",
                                        [CT_OPT_LAMB] = "Lamb"};
/* DeepSpeed optimizers ctrain does not implement (lower case, as DeepSpeed matches them). */
static const char *const ds_only_opts[] = {"onebitadam", "zerooneadam", "onebitlamb", "adagrad", "lion",
                                           "muadam", "muadamw", "musgd"};

static int read_betas(ct_rd *r, const cJSON *params, ct_optimizer_cfg *o) {
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    const cJSON *b = params ? cJSON_GetObjectItemCaseSensitive(params, "betas") : NULL;
    if (!b || cJSON_IsNull(b) || ct_rd_is_auto(b)) return CT_OK;
    char shown[128];
    if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2)
        return ct_rd_fail(r, b, "optimizer.params.betas", "expected two numbers [beta1, beta2], got %s",
                          ct_rd_show(b, shown, sizeof shown));
    double v[2];
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "optimizer.params.betas[%d]", i);
        /* [0, 1): the largest double below 1 is the bound, which the message shows as "[0, 1)" */
        int rc = ct_rd_value(r, cJSON_GetArrayItem(b, i), path, CT_K_NUM, 0, nextafter(1.0, 0.0), false, &v[i]);
        if (rc) return rc;
    }
    o->beta1 = v[0];
    o->beta2 = v[1];
    return CT_OK;
}

int ct_rd_optimizer(ct_rd *r, const cJSON *root) {
    ct_optimizer_cfg *o = &r->cfg->optimizer;
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    char shown[128];
    memset(o, 0, sizeof *o);
    o->type = CT_OPT_ADAM;
    if (!sec || cJSON_IsNull(sec)) {
        ct_rd_section(r, NULL, "optimizer.params", &opt_secs[CT_OPT_ADAM], o);
        read_betas(r, NULL, o);
        snprintf(o->type_name, sizeof o->type_name, "Adam");
        ct_warnf(r->warn, "%s: no \"optimizer\" section: using Adam with lr %g (decoupled weight decay 0)",
                 r->cfg->path, o->lr);
        return CT_OK;
    }
    if (!cJSON_IsObject(sec))
        return ct_rd_fail(r, sec, "optimizer", "expected an object {\"type\": ..., \"params\": {...}}, got %s",
                          ct_rd_show(sec, shown, sizeof shown));
    static const char *const keys[] = {"type", "params", "legacy_fusion"};
    int rc = ct_rd_keys(r, sec, "optimizer", keys, CT_ARRAY_LEN(keys), false);
    if (rc) return rc;
    if (cJSON_GetObjectItemCaseSensitive(sec, "legacy_fusion")) ct_rd_add_unused(r, "optimizer.legacy_fusion");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sec, "type");
    if (!type || !cJSON_IsString(type))
        return ct_rd_fail(r, type ? type : sec, "optimizer.type", "expected one of Adam, AdamW, SGD, Lamb, got %s",
                          ct_rd_show(type, shown, sizeof shown));
    int t = -1;
    for (int i = 0; i < CT_ARRAY_LEN(opt_names); i++)
        if (strcasecmp(type->valuestring, opt_names[i]) == 0) t = i;
    if (t < 0) {
        bool ds = false;
        for (int i = 0; i < CT_ARRAY_LEN(ds_only_opts); i++)
            if (strcasecmp(type->valuestring, ds_only_opts[i]) == 0) ds = true;
        const char *best = ds ? NULL : ct_suggest(type->valuestring, opt_names, CT_ARRAY_LEN(opt_names));
        ct_rd_fail(r, type, "optimizer.type", "%s %s not supported by ctrain; supported: Adam, AdamW, SGD, Lamb "
                   "(case-insensitive)%s%s%s", ct_rd_show(type, shown, sizeof shown),
                   ds ? "is a DeepSpeed optimizer" : "is", best ? "; did you mean " : "", best ? best : "",
                   best ? "?" : "");
        return CT_ERR_CONFIG;
    }
    o->type = (ct_opt_type)t;
    snprintf(o->type_name, sizeof o->type_name, "%s", type->valuestring);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(sec, "params");
    const cJSON *mgn = cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, "max_grad_norm") : NULL;
    if (mgn) {
        const cJSON *gc = cJSON_GetObjectItemCaseSensitive(root, "gradient_clipping");
        return ct_rd_fail(r, mgn, "optimizer.params.max_grad_norm",
                          "not supported as an optimizer parameter (DeepSpeed rejects it too); use the top-level "
                          "\"gradient_clipping\": %s%s", ct_rd_show(mgn, shown, sizeof shown),
                          gc ? " (gradient_clipping is already set: remove max_grad_norm)" : "");
    }
    rc = ct_rd_section(r, params, "optimizer.params", &opt_secs[t], o);
    if (!rc && t != CT_OPT_SGD) rc = read_betas(r, params, o);
    if (rc) return rc;
    const cJSON *ams = cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, "amsgrad") : NULL;
    if (ams && cJSON_IsTrue(ams))
        return ct_rd_fail(r, ams, "optimizer.params.amsgrad", "AMSGrad is not implemented (DeepSpeed's fused "
                          "optimizers do not support it either); set it to false");
    if (t == CT_OPT_ADAMW) o->adam_w_mode = true; /* AdamW is always decoupled, as in DeepSpeed */
    if (t == CT_OPT_SGD) o->beta1 = o->beta2 = 0;
    if (t == CT_OPT_SGD && o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(params, "nesterov"), "optimizer.params.nesterov",
                          "Nesterov momentum requires momentum > 0 and dampening 0 (as in PyTorch)");
    return CT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Scheduler                                                                                   */

#define SCHED_WARMUP(d_steps)                                                                   \
    CT_F_NUM(ct_scheduler_cfg, warmup_min_lr, 0.0, 0, CT_INF),                                     \
        CT_F_NUM(ct_scheduler_cfg, warmup_max_lr, 1e-3, 0, CT_INF),                                \
        CT_F_LONG(ct_scheduler_cfg, warmup_num_steps, d_steps, 0, CT_BIG)
static const ct_field warmup_lr_fields[] = {SCHED_WARMUP(1000), CT_U_INT("last_batch_iteration", -1)};
static const ct_field warmup_decay_fields[] = {
    SCHED_WARMUP(1000),
    CT_F_LONG(ct_scheduler_cfg, total_num_steps, -1, 0, CT_BIG),
    CT_U_INT("last_batch_iteration", -1),
};
static const ct_field warmup_cosine_fields[] = {
    CT_F_LONG(ct_scheduler_cfg, total_num_steps, -1, 0, CT_BIG),
    CT_F_NUM(ct_scheduler_cfg, warmup_min_ratio, 0.0, 0, 1),
    CT_F_LONG(ct_scheduler_cfg, warmup_num_steps, 1000, 0, CT_BIG),
    CT_F_NUM(ct_scheduler_cfg, cos_min_ratio, 1e-4, 0, 1),
    CT_U_INT("last_batch_iteration", -1),
};
static const ct_field one_cycle_fields[] = {
    CT_F_NUM(ct_scheduler_cfg, cycle_min_lr, 0.0, 0, CT_INF),
    CT_F_NUM(ct_scheduler_cfg, cycle_max_lr, 0.0, 0, CT_INF),
    CT_F_NUM(ct_scheduler_cfg, decay_lr_rate, 0.0, 0, CT_INF),
    CT_F_LONG(ct_scheduler_cfg, cycle_first_step_size, 2000, 1, CT_BIG),
    CT_F_LONG(ct_scheduler_cfg, cycle_second_step_size, 0, 1, CT_BIG),
    CT_F_LONG(ct_scheduler_cfg, decay_step_size, 0, 0, CT_BIG),
    CT_F_BOOL(ct_scheduler_cfg, cycle_momentum, true),
    CT_F_NUM(ct_scheduler_cfg, cycle_min_mom, 0.8, 0, 1),
    CT_F_NUM(ct_scheduler_cfg, cycle_max_mom, 0.9, 0, 1),
    CT_F_NUM(ct_scheduler_cfg, decay_mom_rate, 0.0, 0, CT_INF),
    CT_U_INT("cycle_first_stair_count", 0), CT_U_INT("cycle_second_stair_count", 0),
    CT_U_INT("last_batch_iteration", -1),
};
static const ct_field range_test_fields[] = {
    CT_F_NUM(ct_scheduler_cfg, lr_range_test_min_lr, 1e-3, 0, CT_INF),
    CT_F_LONG(ct_scheduler_cfg, lr_range_test_step_size, 2000, 1, CT_BIG),
    CT_F_NUM(ct_scheduler_cfg, lr_range_test_step_rate, 1.0, 0, CT_INF),
    CT_F_BOOL(ct_scheduler_cfg, lr_range_test_staircase, false),
    CT_U_INT("last_batch_iteration", -1),
};
static const char *const warmup_custom[] = {"warmup_type"};

static const ct_section sched_secs[] = {
    [CT_SCHED_NONE] = {"scheduler.params", NULL, 0, NULL, 0, false, false, false, false},
    [CT_SCHED_WARMUP_LR] = {"scheduler.params", warmup_lr_fields, CT_ARRAY_LEN(warmup_lr_fields), warmup_custom, 1,
                            false, false, false, false},
    [CT_SCHED_WARMUP_DECAY_LR] = {"scheduler.params", warmup_decay_fields, CT_ARRAY_LEN(warmup_decay_fields),
                                  warmup_custom, 1, false, false, false, false},
    [CT_SCHED_WARMUP_COSINE_LR] = {"scheduler.params", warmup_cosine_fields, CT_ARRAY_LEN(warmup_cosine_fields),
                                   warmup_custom, 1, false, false, false, false},
    [CT_SCHED_ONE_CYCLE] = {"scheduler.params", one_cycle_fields, CT_ARRAY_LEN(one_cycle_fields), NULL, 0, false,
                            false, false, false},
    [CT_SCHED_LR_RANGE_TEST] = {"scheduler.params", range_test_fields, CT_ARRAY_LEN(range_test_fields), NULL, 0,
                                false, false, false, false},
};
static const char *const sched_names[] = {
    [CT_SCHED_NONE] = "none",          [CT_SCHED_WARMUP_LR] = "WarmupLR",  [CT_SCHED_WARMUP_DECAY_LR] = "WarmupDecayLR",
    [CT_SCHED_WARMUP_COSINE_LR] = "WarmupCosineLR", [CT_SCHED_ONE_CYCLE] = "OneCycle",
    [CT_SCHED_LR_RANGE_TEST] = "LRRangeTest",
};

static const cJSON *param(const cJSON *params, const char *key) {
    return cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, key) : NULL;
}

static int read_warmup_type(ct_rd *r, const cJSON *params, ct_scheduler_cfg *s) {
    s->warmup_type = CT_WARMUP_LOG;
    const cJSON *v = param(params, "warmup_type");
    if (!ct_rd_given(v) || ct_rd_is_auto(v)) return CT_OK;
    char shown[128];
    if (cJSON_IsString(v) && strcmp(v->valuestring, "linear") == 0) s->warmup_type = CT_WARMUP_LINEAR;
    else if (cJSON_IsString(v) && strcmp(v->valuestring, "log") == 0) s->warmup_type = CT_WARMUP_LOG;
    else if (s->type == CT_SCHED_WARMUP_COSINE_LR || !cJSON_IsString(v))
        return ct_rd_fail(r, v, "scheduler.params.warmup_type", "expected \"log\" or \"linear\", got %s",
                          ct_rd_show(v, shown, sizeof shown));
    else /* DeepSpeed's WarmupLR/WarmupDecayLR log this and use "log" */
        ct_rd_warn(r, v, "scheduler.params.warmup_type", "unknown warmup type %s; using \"log\" (as DeepSpeed does)",
                   ct_rd_show(v, shown, sizeof shown));
    return CT_OK;
}

/* DeepSpeed requires these; "auto" (HF) is accepted and resolved. */
static int require(ct_rd *r, const cJSON *sec, const cJSON *params, const char *key, const char *type,
                   const char *why) {
    if (ct_rd_given(param(params, key))) return CT_OK;
    char path[96];
    snprintf(path, sizeof path, "scheduler.params.%s", key);
    return ct_rd_fail(r, params ? params : sec, path, "required by %s (%s)", type, why);
}

int ct_rd_scheduler(ct_rd *r, const cJSON *root) {
    ct_scheduler_cfg *s = &r->cfg->scheduler;
    memset(s, 0, sizeof *s);
    s->type = CT_SCHED_NONE;
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "scheduler");
    char shown[128];
    if (!ct_rd_given(sec)) return CT_OK;
    if (!cJSON_IsObject(sec))
        return ct_rd_fail(r, sec, "scheduler", "expected an object {\"type\": ..., \"params\": {...}}, got %s",
                          ct_rd_show(sec, shown, sizeof shown));
    static const char *const keys[] = {"type", "params"};
    int rc = ct_rd_keys(r, sec, "scheduler", keys, 2, false);
    if (rc) return rc;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sec, "type");
    int t = -1;
    for (int i = 1; i < CT_ARRAY_LEN(sched_names) && type && cJSON_IsString(type); i++)
        if (strcmp(type->valuestring, sched_names[i]) == 0) t = i;
    if (t < 0) {
        const char *best = type && cJSON_IsString(type)
                               ? ct_suggest(type->valuestring, sched_names + 1, CT_ARRAY_LEN(sched_names) - 1)
                               : NULL;
        for (int i = 1; !best && type && cJSON_IsString(type) && i < CT_ARRAY_LEN(sched_names); i++)
            if (strcasecmp(type->valuestring, sched_names[i]) == 0) best = sched_names[i];
        return ct_rd_fail(r, type ? type : sec, "scheduler.type",
                          "%s is not a scheduler ctrain supports; supported: WarmupLR, WarmupDecayLR, "
                          "WarmupCosineLR, OneCycle, LRRangeTest (exact case, as DeepSpeed)%s%s%s",
                          ct_rd_show(type, shown, sizeof shown), best ? "; did you mean " : "", best ? best : "",
                          best ? "?" : "");
    }
    s->type = (ct_sched_type)t;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(sec, "params");
    rc = ct_rd_section(r, params, "scheduler.params", &sched_secs[t], s);
    if (rc) return rc;
    const char *tn = sched_names[t];
    switch (s->type) {
    case CT_SCHED_WARMUP_DECAY_LR:
    case CT_SCHED_WARMUP_COSINE_LR:
        rc = require(r, sec, params, "total_num_steps", tn, "optimizer steps; \"auto\" = the run's total");
        if (rc) return rc;
        /* fallthrough */
    case CT_SCHED_WARMUP_LR:
        rc = read_warmup_type(r, params, s);
        if (rc) return rc;
        if (ct_rd_is_auto(param(params, "warmup_num_steps"))) s->warmup_num_steps = 0;
        if (s->type != CT_SCHED_WARMUP_COSINE_LR && ct_rd_is_auto(param(params, "warmup_max_lr")))
            s->warmup_max_lr = r->cfg->optimizer.lr;
        break;
    case CT_SCHED_ONE_CYCLE:
        rc = require(r, sec, params, "cycle_min_lr", tn, "the lowest learning rate of the cycle");
        if (!rc) rc = require(r, sec, params, "cycle_max_lr", tn, "the highest learning rate of the cycle");
        if (rc) return rc;
        const cJSON *second = param(params, "cycle_second_step_size");
        if (!ct_rd_given(second) || ct_rd_is_auto(second))
            s->cycle_second_step_size = s->cycle_first_step_size;
        break;
    default: break;
    }
    if (s->type == CT_SCHED_WARMUP_COSINE_LR && s->total_num_steps >= 0) {
        long n = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
        if (s->total_num_steps <= n)
            return ct_rd_fail(r, param(params, "total_num_steps"), "scheduler.params.total_num_steps",
                              "%ld must exceed the warmup (%ld steps; DeepSpeed divides by zero at equality)",
                              s->total_num_steps, n);
    }
    if (s->type == CT_SCHED_WARMUP_DECAY_LR && s->total_num_steps >= 0) {
        long n = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
        if (s->total_num_steps < n)
            ct_rd_warn(r, param(params, "total_num_steps"), "scheduler.params.total_num_steps",
                       "%ld is less than the warmup (%ld steps)", s->total_num_steps, n);
    }
    return CT_OK;
}


cJSON *ct_rd_emit_optimizer(const ct_optimizer_cfg *o, const cJSON *in) {
    cJSON *sec = cJSON_CreateObject();
    cJSON_AddStringToObject(sec, "type", o->type_name);
    const cJSON *params = cJSON_IsObject(in) ? cJSON_GetObjectItemCaseSensitive(in, "params") : NULL;
    cJSON *p = ct_rd_emit(&opt_secs[o->type], o, params);
    if (o->type != CT_OPT_SGD) {
        double b[2] = {o->beta1, o->beta2};
        cJSON_AddItemToObject(p, "betas", cJSON_CreateDoubleArray(b, 2));
    }
    cJSON_AddItemToObject(sec, "params", p);
    return sec;
}

cJSON *ct_rd_emit_scheduler(const ct_scheduler_cfg *s, const cJSON *in) {
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "type", sched_names[s->type]);
    const cJSON *params = cJSON_IsObject(in) ? cJSON_GetObjectItemCaseSensitive(in, "params") : NULL;
    cJSON *p = ct_rd_emit(&sched_secs[s->type], s, params);
    if (s->type <= CT_SCHED_WARMUP_COSINE_LR)
        cJSON_AddStringToObject(p, "warmup_type", s->warmup_type == CT_WARMUP_LINEAR ? "linear" : "log");
    /* -1 is how "auto" (the run's total) is held; written back as "auto" so that the resolved
     * config (a checkpoint's config.json) reads again */
    if (s->total_num_steps < 0 && cJSON_GetObjectItemCaseSensitive(p, "total_num_steps"))
        cJSON_ReplaceItemInObjectCaseSensitive(p, "total_num_steps", cJSON_CreateString("auto"));
    cJSON_AddItemToObject(out, "params", p);
    return out;
}

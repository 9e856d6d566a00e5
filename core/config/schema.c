/* schema.c: the top level, fp16/bf16, the order in which sections are read, cross-section
 * checks, and the resolved config. The other sections: optimizer.c, zero.c, ds_sections.c,
 * ctrain_sections.c.
 *
 * Strictness follows DeepSpeed: sections it validates with pydantic (zero_optimization, its
 * offload blocks, the monitors, comms_logger) reject unknown keys; so do ctrain's own sections
 * (model, data, train). Everywhere else an unknown key is a warning (DeepSpeed ignores it
 * silently, which hides typos). Defaults are DeepSpeed's code defaults (deepspeed/runtime/config.py
 * and constants.py, which win where its documentation page differs) unless docs/config.md says
 * otherwise. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config/internal.h"


/* ------------------------------------------------------------------------------------------ */
/* Top level                                                                                   */

static const ct_field top_fields[] = {
    CT_F_NUM(ct_config, gradient_clipping, 0.0, 0, CT_INF),
    CT_F_BOOL(ct_config, prescale_gradients, false),
    CT_F_NUM(ct_config, gradient_predivide_factor, 1.0, DBL_MIN, CT_INF),
    CT_F_LONG(ct_config, steps_per_print, 0, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_F_BOOL(ct_config, wall_clock_breakdown, false, CT_NOT_IDENTITY),
    CT_F_BOOL(ct_config, memory_breakdown, false, CT_NOT_IDENTITY),
    /* DeepSpeed keys ctrain checks but does not act on */
    CT_U_BOOL("sparse_gradients"), CT_U_BOOL("disable_allgather"), CT_U_BOOL("dump_state"),
    CT_U_BOOL("dataloader_drop_last"), CT_U_INT("vocabulary_size", 0), CT_U_BOOL("graph_harvesting"),
    CT_U_BOOL("use_data_before_expert_parallelism"), CT_U_BOOL("zero_allow_untested_optimizer"),
    CT_U_BOOL("zero_force_ds_cpu_optimizer"), CT_U_STR("communication_data_type"),
    CT_U_STR("seq_parallel_comm_data_type"), CT_U_INT("allgather_size", 0), CT_U_BOOL("fp32_allreduce"),
    CT_U_INT("sequence_parallel_size", 1),
    /* DeepSpeed sections outside ctrain's scope: listed, not walked (ds_sections.c refuses what in
     * them asks for another kind of training: pipeline stages, tensor or sequence parallelism,
     * random-LTD, MoQ, compression, autotuning) */
    CT_U_ANY("sparse_attention"), CT_U_ANY("data_efficiency"), CT_U_ANY("data_types"),
    CT_U_ANY("pipeline"), CT_U_ANY("eigenvalue"), CT_U_ANY("quantize_training"),
    CT_U_ANY("compression_training"), CT_U_ANY("autotuning"), CT_U_ANY("hybrid_engine"),
    CT_U_ANY("tensor_parallel"), CT_U_ANY("nebula"), CT_U_ANY("weight_quantization"), CT_U_ANY("timers"),
};

/* Top-level keys read by code below (not by the table). */
static const char *const top_custom[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
    "scheduler", "fp16", "bf16", "bfloat16", "zero_optimization", "model", "data", "train",
    "tensorboard", "csv_monitor", "wandb", "comet", "comms_logger", "activation_checkpointing",
    "flops_profiler", "checkpoint", "amp", "elasticity", "curriculum_learning", "progressive_layer_drop", "aio",
    "compile", "torch_autocast",
};

static const ct_section top_sec = {"top level", top_fields, CT_ARRAY_LEN(top_fields), top_custom,
                                   CT_ARRAY_LEN(top_custom), false, false, false, false};


/* ------------------------------------------------------------------------------------------ */
/* Precision                                                                                   */

static const ct_field fp16_fields[] = {
    CT_F_BOOL(ct_fp16_cfg, enabled, false),
    CT_F_NUM(ct_fp16_cfg, loss_scale, 0.0, 0, CT_INF),
    CT_F_INT(ct_fp16_cfg, initial_scale_power, 16, 0, 126),
    CT_F_INT(ct_fp16_cfg, loss_scale_window, 1000, 1, 2147483647),
    CT_F_INT(ct_fp16_cfg, hysteresis, 2, 1, 2147483647),
    CT_F_BOOL(ct_fp16_cfg, consecutive_hysteresis, false),
    CT_F_NUM(ct_fp16_cfg, min_loss_scale, 1.0, DBL_MIN, CT_INF),
    CT_F_BOOL(ct_fp16_cfg, auto_cast, false),
    CT_U_BOOL("fp16_master_weights_and_grads"),
};
static const ct_section fp16_sec = {"fp16", fp16_fields, CT_ARRAY_LEN(fp16_fields), NULL, 0, false, false, false,
                                    false};

typedef struct bf16_cfg {
    bool enabled;
} bf16_cfg;
static const ct_field bf16_fields[] = {
    CT_F_BOOL(bf16_cfg, enabled, false),
    CT_U_BOOL("immediate_grad_update"),
};
static const ct_section bf16_sec = {"bf16", bf16_fields, CT_ARRAY_LEN(bf16_fields), NULL, 0, false, false, false,
                                    false};

/* "auto" precision: the best the device has (bf16, else fp16 on a GPU, else fp32), never a section
 * explicitly disabled; an explicit true elsewhere wins. */
static int read_precision(ct_rd *r, const cJSON *root) {
    ct_config *cfg = r->cfg;
    const cJSON *fp16 = cJSON_GetObjectItemCaseSensitive(root, "fp16");
    const cJSON *bf16 = cJSON_GetObjectItemCaseSensitive(root, "bf16");
    const char *bf16_name = "bf16";
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(root, "bfloat16");
    if (!bf16 && legacy) {
        bf16 = legacy;
        bf16_name = "bfloat16";
    } else if (bf16 && legacy) {
        ct_rd_warn(r, legacy, "bfloat16", "ignored because \"bf16\" is also given (as DeepSpeed does)");
    }
    int rc = ct_rd_section(r, fp16, "fp16", &fp16_sec, &cfg->fp16);
    if (rc) return rc;
    bf16_cfg b = {0};
    rc = ct_rd_section(r, bf16, bf16_name, &bf16_sec, &b);
    if (rc) return rc;
    const cJSON *fe = cJSON_IsObject(fp16) ? cJSON_GetObjectItemCaseSensitive(fp16, "enabled") : NULL;
    const cJSON *be = cJSON_IsObject(bf16) ? cJSON_GetObjectItemCaseSensitive(bf16, "enabled") : NULL;
    char path[64];
    snprintf(path, sizeof path, "%s.enabled", bf16_name);
    if (cfg->fp16.enabled && b.enabled)
        return ct_rd_fail(r, be, path, "fp16.enabled and %s are both true; enable one of them", path);
    if (!cfg->fp16.enabled && !b.enabled && (ct_rd_is_auto(fe) || ct_rd_is_auto(be))) {
        /* A section explicitly disabled (false) is never chosen. */
        bool fp16_off = ct_rd_given(fe) && !ct_rd_is_auto(fe), bf16_off = ct_rd_given(be) && !ct_rd_is_auto(be);
        if (r->opts->gpu_supports_bf16 && !bf16_off)
            b.enabled = true;
        else if (r->opts->has_gpu && !fp16_off)
            cfg->fp16.enabled = true;
    }
    cfg->bf16 = b.enabled;
    const cJSON *mw = cJSON_IsObject(fp16) ? cJSON_GetObjectItemCaseSensitive(fp16, "fp16_master_weights_and_grads")
                                           : NULL;
    if (cfg->fp16.enabled && mw && cJSON_IsTrue(mw))
        return ct_rd_fail(r, mw, "fp16.fp16_master_weights_and_grads",
                          "fp16 master weights are not implemented in ctrain (master weights are fp32); set it "
                          "to false");
    return CT_OK;
}


int ct_rd_top(ct_rd *r, const cJSON *root) {
    ct_config *cfg = r->cfg;
    int rc = ct_rd_section(r, root, "", &top_sec, cfg);
    if (rc) return rc;
    if (ct_rd_is_auto(cJSON_GetObjectItemCaseSensitive(root, "gradient_clipping")))
        cfg->gradient_clipping = 1.0; /* Hugging Face's default max_grad_norm */
    if (!rc) rc = read_precision(r, root);
    if (!rc) rc = ct_rd_optimizer(r, root);
    if (!rc) rc = ct_rd_scheduler(r, root);
    if (!rc) rc = ct_rd_zero(r, root);
    if (!rc) rc = ct_rd_aio(r, root);
    if (!rc) rc = ct_rd_ds_sections(r, root);
    if (!rc) rc = ct_rd_model(r, root);
    if (!rc) rc = ct_rd_data(r, root);
    if (!rc) rc = ct_rd_train(r, root);
    if (rc) return rc;
    if (cfg->optimizer.type == CT_OPT_LAMB && cfg->fp16.enabled && cfg->fp16.loss_scale > 0) {
        const cJSON *fp16 = cJSON_GetObjectItemCaseSensitive(root, "fp16");
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(fp16, "loss_scale"), "fp16.loss_scale",
                          "Lamb requires dynamic loss scaling (loss_scale 0), as in DeepSpeed; got %g",
                          cfg->fp16.loss_scale);
    }
    if (cfg->prescale_gradients && cfg->zero.stage >= 1 && cfg->zero.stage <= 2 && cfg->zero.reduce_scatter)
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(root, "prescale_gradients"), "prescale_gradients",
                          "not supported with ZeRO stage %d and reduce_scatter (as in DeepSpeed); set "
                          "zero_optimization.reduce_scatter to false or prescale_gradients to false",
                          cfg->zero.stage);
    return CT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The resolved config (--print-config)                                                        */

static bool top_known(const char *key) {
    for (int i = 0; i < top_sec.n_fields; i++)
        if (!strcmp(top_sec.fields[i].key, key)) return true;
    for (int i = 0; i < top_sec.n_custom; i++)
        if (!strcmp(top_sec.custom[i], key)) return true;
    return false;
}

cJSON *ct_rd_resolved(ct_rd *r, const cJSON *root) {
    const ct_config *cfg = r->cfg;
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "train_batch_size", (double)cfg->train_batch_size);
    cJSON_AddNumberToObject(out, "train_micro_batch_size_per_gpu", (double)cfg->micro_batch);
    cJSON_AddNumberToObject(out, "gradient_accumulation_steps", (double)cfg->grad_accum);
    cJSON_AddItemToObject(out, "optimizer",
                          ct_rd_emit_optimizer(&cfg->optimizer, cJSON_GetObjectItemCaseSensitive(root, "optimizer")));
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(root, "scheduler");
    if (cfg->scheduler.type != CT_SCHED_NONE)
        cJSON_AddItemToObject(out, "scheduler", ct_rd_emit_scheduler(&cfg->scheduler, sched));
    const cJSON *fp16 = cJSON_GetObjectItemCaseSensitive(root, "fp16");
    cJSON_AddItemToObject(out, "fp16", ct_rd_emit(&fp16_sec, &cfg->fp16, cJSON_IsObject(fp16) ? fp16 : NULL));
    cJSON *bf = cJSON_CreateObject();
    cJSON_AddBoolToObject(bf, "enabled", cfg->bf16);
    cJSON_AddItemToObject(out, "bf16", bf);
    cJSON *top = ct_rd_emit(&top_sec, cfg, root);
    while (top->child) cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(top, top->child)); /* keeps keys */
    cJSON_Delete(top);
    cJSON_AddItemToObject(out, "zero_optimization",
                          ct_rd_emit_zero(&cfg->zero, cJSON_GetObjectItemCaseSensitive(root, "zero_optimization")));
    cJSON_AddItemToObject(out, "aio", ct_rd_emit_aio(&cfg->aio, cJSON_GetObjectItemCaseSensitive(root, "aio")));
    cJSON_AddItemToObject(out, "train", ct_rd_emit_train(&cfg->train));
    if (cfg->model) cJSON_AddItemToObject(out, "model", cJSON_Duplicate(cfg->model, 1));
    if (cfg->data) cJSON_AddItemToObject(out, "data", cJSON_Duplicate(cfg->data, 1));
    /* DeepSpeed sections ctrain validated but does not act on, verbatim. */
    for (const cJSON *m = root->child; m; m = m->next)
        if (top_known(m->string) && !cJSON_GetObjectItemCaseSensitive(out, m->string) && strcmp(m->string, "bfloat16"))
            cJSON_AddItemToObject(out, m->string, cJSON_Duplicate(m, 1));
    return out;
}

/* zero.c: "zero_optimization" and its offload blocks (DeepSpeed's deepspeed/runtime/zero/config.py
 * and offload_config.py).
 *
 * DeepSpeed validates this section with pydantic, so ctrain does too: unknown keys are errors,
 * values take pydantic's lax coercion, "auto" means the default, stage3_ aliases and deprecated
 * keys are accepted as DeepSpeed accepts them. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config/internal.h"

/* ------------------------------------------------------------------------------------------ */
/* ZeRO                                                                                        */

static const ct_field zero_fields[] = {
    CT_F_INT(ct_zero_cfg, stage, 0, 0, 3),
    CT_F_BOOL(ct_zero_cfg, contiguous_gradients, true),
    CT_F_BOOL(ct_zero_cfg, reduce_scatter, true),
    CT_F_INTD(ct_zero_cfg, reduce_bucket_size, 5e8, NULL),
    CT_F_INTD(ct_zero_cfg, allgather_bucket_size, 5e8, NULL),
    CT_F_BOOL(ct_zero_cfg, overlap_comm, false), /* default depends on the stage, set below */
    CT_F_INTD(ct_zero_cfg, sub_group_size, 1e9, NULL),
    CT_F_INTD(ct_zero_cfg, prefetch_bucket_size, 5e7, "stage3_prefetch_bucket_size"),
    CT_F_INTD(ct_zero_cfg, param_persistence_threshold, 1e5, "stage3_param_persistence_threshold"),
    CT_F_INTD(ct_zero_cfg, max_live_parameters, 1e9, "stage3_max_live_parameters"),
    CT_F_INTD(ct_zero_cfg, max_reuse_distance, 1e9, "stage3_max_reuse_distance"),
    CT_ROW("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save", CT_K_BOOL, CT_S_BOOL,
           offsetof(ct_zero_cfg, gather_16bit_weights_on_model_save), 0, 0, 0, 1, NULL),
    CT_U_BOOL("use_multi_rank_bucket_allreduce"), CT_U_BOOL("allgather_partitions"),
    CT_U_BOOL("load_from_fp32_weights"), CT_U_BOOL("elastic_checkpoint"),
    CT_U_INT_A("model_persistence_threshold", "stage3_model_persistence_threshold"),
    CT_U_INT_A("module_granularity_threshold", "stage3_module_granularity_threshold"),
    CT_U_BOOL_A("use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"),
    CT_U_BOOL("ignore_unused_parameters"), CT_U_BOOL("legacy_stage1"), CT_U_BOOL("round_robin_gradients"),
    CT_U_INT("zero_hpz_partition_size", 0), CT_U_BOOL("zero_quantized_weights"),
    CT_U_BOOL("zero_quantized_nontrainable_weights"), CT_U_BOOL("zero_quantized_gradients"),
    CT_U_ANY("zeropp_loco_param"), CT_U_INT("mics_shard_size", -1), CT_U_BOOL("mics_hierarchical_params_gather"),
    CT_U_BOOL("memory_efficient_linear"), CT_U_BOOL("pipeline_loading_checkpoint"),
    CT_U_BOOL("override_module_apply"), CT_U_BOOL("log_trace_cache_warnings"),
    CT_U_BOOL("cpu_offload_use_pin_memory"),
};
static const char *const zero_custom[] = {"offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param",
                                          "stage3_gather_fp16_weights_on_model_save"};
static const ct_section zero_sec = {"zero_optimization", zero_fields, CT_ARRAY_LEN(zero_fields), zero_custom,
                                    CT_ARRAY_LEN(zero_custom), true, true, false, false};

static const ct_field offload_opt_fields[] = {
    CT_F_BOOL(ct_offload_cfg, pin_memory, false),
    CT_F_NUM(ct_offload_cfg, ratio, 1.0, 0, 1),
    CT_F_STR_K(ct_offload_cfg, "nvme_path", nvme.path, "", CT_NOT_IDENTITY),
    CT_F_LONG_K(ct_offload_cfg, "buffer_count", nvme.buffer_count, 4, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_U_BOOL("pipeline_read"), CT_U_BOOL("pipeline_write"), CT_U_BOOL("fast_init"),
};
static const ct_field offload_param_fields[] = {
    CT_F_BOOL(ct_offload_cfg, pin_memory, false),
    CT_F_STR_K(ct_offload_cfg, "nvme_path", nvme.path, "", CT_NOT_IDENTITY),
    CT_F_LONG_K(ct_offload_cfg, "buffer_count", nvme.buffer_count, 5, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_F_LONG_K(ct_offload_cfg, "buffer_size", nvme.buffer_size, 1e8, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_F_LONG_K(ct_offload_cfg, "max_in_cpu", nvme.max_in_cpu, 1e9, 0, CT_BIG, CT_NOT_IDENTITY),
};
static const char *const offload_custom[] = {"device"};
static const ct_section offload_opt_sec = {"offload_optimizer", offload_opt_fields, CT_ARRAY_LEN(offload_opt_fields),
                                           offload_custom, 1, true, true, false, false};
static const ct_section offload_param_sec = {"offload_param", offload_param_fields, CT_ARRAY_LEN(offload_param_fields),
                                             offload_custom, 1, true, true, false, false};
static const char *const device_names[] = {[CT_OFFLOAD_NONE] = "none", [CT_OFFLOAD_CPU] = "cpu",
                                           [CT_OFFLOAD_NVME] = "nvme"};

/* device "nvme": what the swap needs from the block's own keys. */
static int check_nvme(ct_rd *r, const cJSON *blk, const char *path, const ct_offload_cfg *o) {
    char full[128];
    if (!o->nvme.path[0])
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(blk, "device"),
                          ct_rd_join(full, sizeof full, path, "nvme_path"),
                          "required with device \"nvme\": the directory on the NVMe drive to swap to");
    if (o->nvme.buffer_count < 1)
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(blk, "buffer_count"),
                          ct_rd_join(full, sizeof full, path, "buffer_count"),
                          "the NVMe swap needs at least 1 host buffer (2 or more overlap its reads and writes "
                          "with the optimizer step); got 0");
    return CT_OK;
}

static int read_offload(ct_rd *r, const cJSON *blk, const char *path, const ct_section *sec, ct_offload_cfg *o) {
    char shown[128];
    if (ct_rd_given(blk) && !cJSON_IsObject(blk))
        return ct_rd_fail(r, blk, path, "expected an object such as {\"device\": \"cpu\"} (or null), got %s",
                          ct_rd_show(blk, shown, sizeof shown));
    int rc = ct_rd_section(r, blk, path, sec, o);
    if (rc) return rc;
    o->device = CT_OFFLOAD_NONE;
    const cJSON *d = ct_rd_given(blk) ? cJSON_GetObjectItemCaseSensitive(blk, "device") : NULL;
    if (!ct_rd_given(d) || ct_rd_is_auto(d)) return CT_OK;
    char full[128];
    snprintf(full, sizeof full, "%s.device", path);
    int found = -1;
    for (int i = 0; i < 3 && cJSON_IsString(d); i++)
        if (strcmp(d->valuestring, device_names[i]) == 0) found = i;
    if (found < 0)
        return ct_rd_fail(r, d, full, "expected \"none\", \"cpu\" or \"nvme\", got %s",
                          ct_rd_show(d, shown, sizeof shown));
    if (found == CT_OFFLOAD_NVME) {
        int rc = check_nvme(r, blk, path, o);
        if (rc) return rc;
    }
    o->device = (ct_offload_device)found;
    return CT_OK;
}

/* A deprecated key and its replacement: both is an error, as in DeepSpeed. */
static int deprecated(ct_rd *r, const cJSON *z, const char *old, const char *new_key, const char *advice) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(z, old);
    if (!o) return CT_OK;
    char p[128];
    snprintf(p, sizeof p, "zero_optimization.%s", old);
    if (cJSON_GetObjectItemCaseSensitive(z, new_key))
        return ct_rd_fail(r, o, p, "deprecated, and cannot be given together with its replacement %s", new_key);
    ct_rd_warn(r, o, p, "deprecated; use %s", advice);
    return CT_OK;
}

int ct_rd_zero(ct_rd *r, const cJSON *root) {
    ct_zero_cfg *z = &r->cfg->zero;
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
    if (sec && cJSON_IsBool(sec)) { /* legacy form: true = stage 1 */
        ct_rd_section(r, NULL, "zero_optimization", &zero_sec, z);
        read_offload(r, NULL, "", &offload_opt_sec, &z->offload_optimizer);
        read_offload(r, NULL, "", &offload_param_sec, &z->offload_param);
        z->stage = cJSON_IsTrue(sec) ? 1 : 0;
        z->overlap_comm_by_stage = true;   /* false: the stage-1 default */
        ct_rd_warn(r, sec, "zero_optimization", "the boolean form is deprecated; write {\"stage\": %d}", z->stage);
        return CT_OK;
    }
    int rc = ct_rd_section(r, sec, "zero_optimization", &zero_sec, z);
    if (rc) return rc;
    const cJSON *oc = ct_rd_given(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "overlap_comm") : NULL;
    z->overlap_comm_by_stage = !ct_rd_given(oc) || ct_rd_is_auto(oc);
    if (z->overlap_comm_by_stage) z->overlap_comm = z->stage == 3;
    const cJSON *oo = ct_rd_given(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "offload_optimizer") : NULL;
    const cJSON *op = ct_rd_given(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "offload_param") : NULL;
    rc = read_offload(r, oo, "zero_optimization.offload_optimizer", &offload_opt_sec, &z->offload_optimizer);
    if (!rc) rc = read_offload(r, op, "zero_optimization.offload_param", &offload_param_sec, &z->offload_param);
    if (rc || !ct_rd_given(sec)) return rc;

    rc = deprecated(r, sec, "cpu_offload", "offload_optimizer", "\"offload_optimizer\": {\"device\": \"cpu\"}");
    if (!rc) rc = deprecated(r, sec, "cpu_offload_param", "offload_param", "\"offload_param\": {\"device\": \"cpu\"}");
    if (!rc)
        rc = deprecated(r, sec, "stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save",
                        "gather_16bit_weights_on_model_save");
    if (!rc && cJSON_GetObjectItemCaseSensitive(sec, "stage3_gather_16bit_weights_on_model_save") &&
        cJSON_GetObjectItemCaseSensitive(sec, "stage3_gather_fp16_weights_on_model_save"))
        rc = ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(sec, "stage3_gather_fp16_weights_on_model_save"),
                        "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                        "deprecated, and cannot be given together with stage3_gather_16bit_weights_on_model_save");
    if (rc) return rc;
    const char *dep_keys[] = {"cpu_offload", "cpu_offload_param", "stage3_gather_fp16_weights_on_model_save"};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, dep_keys[i]);
        if (!ct_rd_given(v) || ct_rd_is_auto(v)) continue;
        char p[128];
        double x;
        snprintf(p, sizeof p, "zero_optimization.%s", dep_keys[i]);
        rc = ct_rd_value(r, v, p, CT_K_BOOL, 0, 1, true, &x);
        if (rc) return rc;
        if (i == 0 && x) z->offload_optimizer.device = CT_OFFLOAD_CPU;
        if (i == 1 && x) z->offload_param.device = CT_OFFLOAD_CPU;
        if (i == 2) z->gather_16bit_weights_on_model_save = x != 0;
    }
    const cJSON *ls1 = cJSON_GetObjectItemCaseSensitive(sec, "legacy_stage1");
    if (ls1 && cJSON_IsTrue(ls1))
        return ct_rd_fail(r, ls1, "zero_optimization.legacy_stage1",
                          "the deprecated ZeRO stage 1 is not supported (DeepSpeed >= 0.5.9 rejects it too)");
    if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(oo, "ratio"), "zero_optimization.offload_optimizer.ratio",
                          "partial offloading (ratio < 1) needs ZeRO stage 3; stage is %d", z->stage);
    if (z->offload_param.device != CT_OFFLOAD_NONE && z->stage != 3) {
        ct_rd_warn(r, op ? op : sec, "zero_optimization.offload_param",
                   "only used at ZeRO stage 3; ignored at stage %d (as DeepSpeed does)", z->stage);
        z->offload_param.device = CT_OFFLOAD_NONE;
    }
    if (z->offload_param.device == CT_OFFLOAD_NVME) {
        char full[64];
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(op, "device"), ct_rd_join(full, sizeof full,
                          "zero_optimization.offload_param", "device"), "\"nvme\" is not supported for parameters: "
                          "stage 3 reads them layer by layer in the order of the forward and backward walks, and "
                          "ctrain's swap streams its files front to back; use \"cpu\" (pinned host memory; "
                          "offload_optimizer can still be \"nvme\")");
    }
    if (z->offload_optimizer.device != CT_OFFLOAD_NONE && z->stage == 0) {
        ct_rd_warn(r, oo ? oo : sec, "zero_optimization.offload_optimizer",
                   "optimizer offload needs ZeRO stage 1-3; ignored at stage 0");
        z->offload_optimizer.device = CT_OFFLOAD_NONE;
    }
    return CT_OK;
}


static cJSON *emit_offload(const ct_section *sec, const ct_offload_cfg *o, const cJSON *in) {
    cJSON *out = ct_rd_emit(sec, o, cJSON_IsObject(in) ? in : NULL);
    cJSON_AddStringToObject(out, "device", device_names[o->device]);
    return out;
}

cJSON *ct_rd_emit_zero(const ct_zero_cfg *z, const cJSON *in) {
    if (!cJSON_IsObject(in)) in = NULL;
    cJSON *out = ct_rd_emit(&zero_sec, z, in);
    cJSON_AddItemToObject(out, "offload_optimizer",
                          emit_offload(&offload_opt_sec, &z->offload_optimizer,
                                       cJSON_GetObjectItemCaseSensitive(in, "offload_optimizer")));
    cJSON_AddItemToObject(out, "offload_param",
                          emit_offload(&offload_param_sec, &z->offload_param,
                                       cJSON_GetObjectItemCaseSensitive(in, "offload_param")));
    return out;
}

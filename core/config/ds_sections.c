/* ds_sections.c: DeepSpeed sections ctrain validates but does not act on (monitors, comms_logger,
 * activation_checkpointing, flops_profiler, checkpoint, legacy curriculum_learning, the curriculum
 * switch of data_efficiency, compile, eigenvalue) and the features it refuses when they are on,
 * because they ask for another kind of training than ctrain's: amp, elasticity, progressive layer
 * drop, random-LTD, quantize_training (MoQ), compression_training, autotuning, torch_autocast,
 * pipeline, tensor and sequence parallelism, a universal checkpoint load. A refused section that is
 * present but off (enabled false, one stage, one rank) is accepted. Present sections are listed in
 * the one "keys read but not used" warning, except where ct_config_not_yet() (not_yet.c) gives them
 * a line of their own. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config/internal.h"

/* ------------------------------------------------------------------------------------------ */
/* Monitors and other DeepSpeed sections ctrain validates but does not act on                  */

/* tensorboard and csv_monitor (DeepSpeed's pydantic defaults) are acted on; wandb gets a "not
 * supported yet" line when enabled (not_yet.c). */
static const ct_field monitor_fields[] = {CT_F_BOOL(ct_monitor_cfg, enabled, false),
                                          CT_F_STR(ct_monitor_cfg, output_path, ""),
                                          CT_F_STR(ct_monitor_cfg, job_name, "DeepSpeedJobName")};
static const ct_field wandb_fields[] = {CT_F_BOOL_K(ct_config, "enabled", wandb, false), CT_U_STR("group"),
                                        CT_U_STR("team"), CT_U_STR("project")};
static const ct_field comet_fields[] = {
    CT_U_BOOL("enabled"),        CT_U_INT("samples_log_interval", 0), CT_U_STR("project"),
    CT_U_STR("workspace"),       CT_U_STR("api_key"),                 CT_U_STR("experiment_name"),
    CT_U_STR("experiment_key"), CT_U_BOOL("online"),                  CT_U_STR("mode"),
};
static const ct_field comms_fields[] = {CT_U_BOOL("enabled"), CT_U_BOOL("verbose"), CT_U_BOOL("prof_all"),
                                        CT_U_BOOL("debug"), CT_U_ANY("prof_ops")};
/* activation_checkpointing: number_checkpoints is acted on (even segments, core/graph/segments.c)
 * and so is cpu_checkpointing (offload, core/graph/offload.c; a line when nothing is checkpointed);
 * synchronize_checkpoint_boundary and profile by the executor at the segments' edges
 * (core/graph/exec.c); partition_activations and contiguous_memory_optimization are stored because
 * they are done (no-ops without model parallelism: nothing to partition, and the checkpointed
 * segments' buffers are one arena already). */
static const ct_field ac_fields[] = {
    CT_F_BOOL(ct_pending_cfg, partition_activations, false), CT_F_BOOL(ct_pending_cfg, cpu_checkpointing, false),
    CT_F_BOOL(ct_pending_cfg, contiguous_memory_optimization, false),
    CT_F_LONG(ct_pending_cfg, number_checkpoints, 0, 0, CT_BIG),
    CT_F_BOOL(ct_pending_cfg, synchronize_checkpoint_boundary, false), CT_F_BOOL(ct_pending_cfg, profile, false),
};
/* flops_profiler is acted on (core/train/profiler.c) but for recompute_fwd_factor: ctrain times
 * the recompute pass itself instead of estimating it. */
static const ct_field flops_fields[] = {
    CT_F_BOOL(ct_flops_profiler_cfg, enabled, false),
    CT_U_NUM("recompute_fwd_factor"),
    CT_F_LONG(ct_flops_profiler_cfg, profile_step, 1, 1, CT_BIG),
    CT_F_LONG(ct_flops_profiler_cfg, module_depth, -1, -1, 64),
    CT_F_LONG(ct_flops_profiler_cfg, top_modules, 1, 0, CT_BIG),
    CT_F_BOOL(ct_flops_profiler_cfg, detailed, true),
    CT_F_STR(ct_flops_profiler_cfg, output_file, ""),
};
/* checkpoint.enabled is ctrain's (sweeps turn checkpoint writing off); DeepSpeed's keys are read,
 * not used. */
static const ct_field ckpt_fields[] = {CT_F_BOOL_K(ct_config, "enabled", checkpoint_enabled, true),
                                       CT_U_STR("tag_validation"), CT_U_BOOL("load_universal"),
                                       CT_U_BOOL("use_node_local_storage"), CT_U_ANY("parallel_write")};
/* compile (DeepSpeed's CompileConfig: torch.compile's enabled, backend, kwargs until 2025; since,
 * DeepCompile's switches and passes): ctrain runs its own kernels, with no PyTorch model for a
 * compiler, so training is the same without it (a line of its own when on, not_yet.c); passes that
 * make another kind of training (autotp, autosp) are refused below. Unknown keys warn: the section
 * grows with every DeepSpeed release, and none of it changes what ctrain trains. */
static const ct_field compile_fields[] = {
    CT_U_BOOL("enabled"),           CT_U_STR("backend"),          CT_U_ANY("kwargs"),
    CT_U_BOOL("deepcompile"),       CT_U_BOOL("free_activation"), CT_U_INT("free_activation_threshold", 0),
    CT_U_BOOL("offload_activation"), CT_U_BOOL("offload_activation_pin_memory"), CT_U_BOOL("offload_opt_states"),
    CT_U_BOOL("double_buffer"),     CT_U_BOOL("symmetric_memory"), CT_U_BOOL("debug_log"),
    CT_U_BOOL("offload_parameters"), CT_U_BOOL("sync_before_reduce"), CT_U_BOOL("sync_after_reduce"),
    CT_U_BOOL("sync_before_allgather"), CT_U_BOOL("sync_after_allgather"), CT_U_BOOL("keep_int_input_tensors"),
    CT_U_BOOL("keep_all_input_tensors"), CT_U_ANY("passes"),
};
/* torch_autocast (DeepSpeed reads enabled, dtype, lower_precision_safe_modules): refused when on. */
static const ct_field autocast_fields[] = {CT_U_BOOL("enabled"), CT_U_STR("dtype"),
                                           CT_U_ANY("lower_precision_safe_modules")};

#define WHOLE(name, f, strict) {name, f, CT_ARRAY_LEN(f), NULL, 0, strict, strict, true, false}
static const ct_section ds_sections[] = {
    {"comet", comet_fields, CT_ARRAY_LEN(comet_fields), NULL, 0, true, true, true, true},   /* a monitor */
    WHOLE("comms_logger", comms_fields, true),
    {"activation_checkpointing", ac_fields, CT_ARRAY_LEN(ac_fields), NULL, 0, false, false, false, false},   /* used */
    WHOLE("compile", compile_fields, false),
    WHOLE("torch_autocast", autocast_fields, false),
};

/* ------------------------------------------------------------------------------------------ */
/* Another kind of training: refused when on                                                    */

/* The section at a dotted path below root (NULL when a part is absent); CT_ERR_CONFIG when a part on
 * the way is not an object, as DeepSpeed fails on it. */
static int section_at(ct_rd *r, const cJSON *root, const char *path, const cJSON **out) {
    char part[64], sofar[256] = "", shown[128];
    const cJSON *node = root;
    *out = NULL;
    for (const char *p = path; *p;) {
        size_t k = strcspn(p, ".");
        snprintf(part, sizeof part, "%.*s", (int)k, p);
        size_t used = strlen(sofar);
        snprintf(sofar + used, sizeof sofar - used, "%s%s", used ? "." : "", part);
        node = cJSON_GetObjectItemCaseSensitive(node, part);
        if (!ct_rd_given(node)) return CT_OK;
        if (!cJSON_IsObject(node))
            return ct_rd_fail(r, node, sofar, "expected an object, got %s", ct_rd_show(node, shown, sizeof shown));
        p += k + (p[k] == '.');
    }
    *out = node;
    return CT_OK;
}

/* A feature DeepSpeed switches on with "<section>.enabled": true, which would make this another
 * kind of training than ctrain's: what it is, and what ctrain does instead. */
typedef struct refusal {
    const char *section;
    const char *what;
} refusal;

static const refusal refusals[] = {
    {"amp", "NVIDIA Apex AMP is not implemented in ctrain; use \"fp16\" or \"bf16\""},
    {"elasticity", "elastic training is not implemented in ctrain; set the batch keys instead"},
    {"progressive_layer_drop", "progressive layer drop (DeepSpeed skips transformer layers at random, more as "
     "training goes on) is not implemented in ctrain, which trains every layer at every step; set it to false"},
    {"data_efficiency.data_routing.random_ltd", "random layer-token drop (random-LTD: DeepSpeed sends only some "
     "tokens through the middle layers) is not implemented in ctrain, which sends every token through every "
     "layer; set it to false"},
    {"quantize_training", "quantization-aware training (MoQ: DeepSpeed quantizes the weights in the optimizer "
     "step, to fewer bits as training goes on) is not implemented in ctrain, which keeps them in the precision "
     "\"fp16\" or \"bf16\" says; set it to false"},
    {"compression_training.weight_quantization.shared_parameters", "model compression (weight quantization) is "
     "not implemented in ctrain, which trains the model uncompressed; set it to false"},
    {"compression_training.activation_quantization.shared_parameters", "model compression (activation "
     "quantization) is not implemented in ctrain, which trains the model uncompressed; set it to false"},
    {"compression_training.sparse_pruning.shared_parameters", "model compression (sparse pruning) is not "
     "implemented in ctrain, which trains the model uncompressed; set it to false"},
    {"compression_training.row_pruning.shared_parameters", "model compression (row pruning) is not implemented "
     "in ctrain, which trains the model uncompressed; set it to false"},
    {"compression_training.head_pruning.shared_parameters", "model compression (head pruning) is not "
     "implemented in ctrain, which trains the model uncompressed; set it to false"},
    {"compression_training.channel_pruning.shared_parameters", "model compression (channel pruning) is not "
     "implemented in ctrain, which trains the model uncompressed; set it to false"},
    {"compression_training.layer_reduction", "layer reduction (distilling into a model of fewer layers) is not "
     "implemented in ctrain, which trains the model as given; set it to false"},
    {"autotuning", "DeepSpeed then runs a short profiling experiment for its autotuner and exits at "
     "autotuning.end_profile_step; ctrain has no autotuner and trains the config as given (train_micro_batch_"
     "size_per_gpu \"auto\" takes the largest micro-batch that fits; --dry-run shows what fits); set it to false"},
    {"torch_autocast", "PyTorch autocast (fp32 weights, chosen layers computed in 16 bits) is not implemented in "
     "ctrain; its mixed precision is \"bf16\": {\"enabled\": true} or \"fp16\": {\"enabled\": true} (an fp32 "
     "master copy, every layer in 16 bits); set it to false"},
};

/* <section>.enabled true: refused; present and off (or without enabled: DeepSpeed's default is
 * off): listed as read but not used where nothing else lists it. */
static int refuse_enabled(ct_rd *r, const cJSON *root, const refusal *f) {
    const cJSON *sec;
    int rc = section_at(r, root, f->section, &sec);
    if (rc || !sec) return rc;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sec, "enabled");
    char path[160];
    snprintf(path, sizeof path, "%s.enabled", f->section);
    double x = 0;
    if (ct_rd_given(en) && (rc = ct_rd_value(r, en, path, CT_K_BOOL, 0, 1, false, &x))) return rc;
    if (x) return ct_rd_fail(r, en, path, "%s", f->what);
    if (!strchr(f->section, '.')) ct_rd_add_unused(r, f->section);
    return CT_OK;
}

/* A count of ranks or stages that asks for model parallelism: more than 1 is refused. */
typedef struct parallel_key {
    const char *section, *key, *what, *unit;
} parallel_key;

static const parallel_key parallel_keys[] = {
    {"pipeline", "stages", "pipeline parallelism", "stages"},
    {"tensor_parallel", "autotp_size", "tensor parallelism (AutoTP)", "ranks"},
    {"tensor_parallel.tp", "tp_size", "tensor parallelism", "ranks"},
    {"tensor_parallel.tensor_parallel", "tp_size", "tensor parallelism", "ranks"},
    {"", "sequence_parallel_size", "sequence parallelism (DeepSpeed-Ulysses)", "ranks"},
};

static int refuse_parallel(ct_rd *r, const cJSON *root, const parallel_key *k) {
    const cJSON *sec = root;
    int rc = k->section[0] ? section_at(r, root, k->section, &sec) : CT_OK;
    if (rc || !sec) return rc;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, k->key);
    if (!cJSON_IsNumber(v) || v->valuedouble <= 1) return CT_OK;   /* "auto", 0, 1: one rank's worth */
    char path[160];
    ct_rd_join(path, sizeof path, k->section, k->key);
    return ct_rd_fail(r, v, path, "%s over %g %s is not implemented in ctrain: every rank holds the whole model "
                      "and the ranks split the batch (data parallelism, with zero_optimization's stages for "
                      "memory); remove it or set it to 1", k->what, v->valuedouble, k->unit);
}

/* compile.passes that make DeepSpeed's compiler split the model across ranks. */
static int refuse_compile_passes(ct_rd *r, const cJSON *root) {
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "compile");
    const cJSON *passes = cJSON_IsObject(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "passes") : NULL;
    for (const cJSON *p = cJSON_IsArray(passes) ? passes->child : NULL; p; p = p->next) {
        bool tp = cJSON_IsString(p) && !strcmp(p->valuestring, "autotp");
        bool sp = cJSON_IsString(p) && !strcmp(p->valuestring, "autosp");
        if (tp || sp)
            return ct_rd_fail(r, p, "compile.passes", "\"%s\": %s parallelism is not implemented in ctrain: every "
                              "rank holds the whole model and the ranks split the batch; remove it", p->valuestring,
                              tp ? "tensor" : "sequence");
    }
    return CT_OK;
}

/* checkpoint.load_universal: loading DeepSpeed's universal checkpoints. */
static int refuse_universal(ct_rd *r, const cJSON *root) {
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(root, "checkpoint");
    const cJSON *u = cJSON_IsObject(ck) ? cJSON_GetObjectItemCaseSensitive(ck, "load_universal") : NULL;
    if (!cJSON_IsTrue(u)) return CT_OK;   /* its type was checked with the section */
    return ct_rd_fail(r, u, "checkpoint.load_universal", "loading a DeepSpeed universal checkpoint is not "
                      "implemented in ctrain; its own checkpoints resume on any number of ranks as they are "
                      "(--resume DIR); set it to false");
}

/* A section whose "enabled": true is stored for a line of its own (not_yet.c). */
static int read_switch(ct_rd *r, const cJSON *root, const char *name, const char *key, bool *out) {
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, name);
    const cJSON *en = cJSON_IsObject(sec) ? cJSON_GetObjectItemCaseSensitive(sec, key) : NULL;
    char path[64];
    snprintf(path, sizeof path, "%s.%s", name, key);
    double x = 0;
    int rc = ct_rd_given(en) ? ct_rd_value(r, en, path, CT_K_BOOL, 0, 1, false, &x) : CT_OK;
    *out = *out || x;
    return rc;
}

/* Everything above, after the sections' own reading. */
static int refuse_other_kinds(ct_rd *r, const cJSON *root) {
    int rc = CT_OK;
    for (int i = 0; i < CT_ARRAY_LEN(refusals) && !rc; i++) rc = refuse_enabled(r, root, &refusals[i]);
    for (int i = 0; i < CT_ARRAY_LEN(parallel_keys) && !rc; i++) rc = refuse_parallel(r, root, &parallel_keys[i]);
    if (!rc) rc = refuse_compile_passes(r, root);
    if (!rc) rc = refuse_universal(r, root);
    ct_pending_cfg *p = &r->cfg->pending;
    if (!rc) rc = read_switch(r, root, "eigenvalue", "enabled", &p->eigenvalue);
    if (!rc) rc = read_switch(r, root, "compile", "enabled", &p->compile);
    if (!rc) rc = read_switch(r, root, "compile", "deepcompile", &p->compile);
    return rc;
}

/* One integer of a fixed_discrete list: curriculum_learning.schedule_config.NAME[i]. */
static int read_stage(ct_rd *r, const cJSON *list, const char *name, int i, long *out) {
    char p[96];
    snprintf(p, sizeof p, "curriculum_learning.schedule_config.%s[%d]", name, i);
    double x;
    int rc = ct_rd_value(r, cJSON_GetArrayItem(list, i), p, CT_K_INT, 0, 9e15, false, &x);
    *out = (long)x;
    return rc;
}

/* Legacy top-level curriculum_learning (DeepSpeed's CurriculumScheduler,
 * deepspeed/runtime/data_pipeline/curriculum_scheduler.py): DeepSpeed's required keys, so a file
 * DeepSpeed rejects is rejected here too; the schedule is kept in cfg->curriculum
 * (ct_curriculum_difficulty) and a seqlen curriculum cuts every training step's sequences to
 * it (core/train/curriculum.c). */
static int read_curriculum(ct_rd *r, const cJSON *root) {
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(root, "curriculum_learning");
    if (!ct_rd_given(cl)) return CT_OK;
    char shown[128];
    if (!cJSON_IsObject(cl))
        return ct_rd_fail(r, cl, "curriculum_learning", "expected an object, got %s",
                          ct_rd_show(cl, shown, sizeof shown));
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(cl, "enabled");
    double x;
    if (!en) return ct_rd_fail(r, cl, "curriculum_learning.enabled", "required when the section is present");
    int rc = ct_rd_value(r, en, "curriculum_learning.enabled", CT_K_BOOL, 0, 1, false, &x);
    if (!rc && !x) ct_rd_add_unused(r, "curriculum_learning");   /* switched off: nothing of it is used */
    if (rc || !x) return rc;
    static const char *const req[] = {"curriculum_type", "min_difficulty", "max_difficulty", "schedule_type",
                                      "schedule_config"};
    for (int i = 0; i < CT_ARRAY_LEN(req); i++)
        if (!ct_rd_given(cJSON_GetObjectItemCaseSensitive(cl, req[i]))) {
            char p[64];
            snprintf(p, sizeof p, "curriculum_learning.%s", req[i]);
            return ct_rd_fail(r, cl, p, "required when curriculum learning is enabled");
        }
    ct_curriculum_cfg *c = &r->cfg->curriculum;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cl, "curriculum_type");
    if (!cJSON_IsString(ty) || strlen(ty->valuestring) >= sizeof c->type)
        return ct_rd_fail(r, ty, "curriculum_learning.curriculum_type", "expected a name such as \"seqlen\", got %s",
                          ct_rd_show(ty, shown, sizeof shown));
    snprintf(c->type, sizeof c->type, "%s", ty->valuestring);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cl, "min_difficulty");
    if ((rc = ct_rd_value(r, v, "curriculum_learning.min_difficulty", CT_K_INT, 0, 9e15, false, &x))) return rc;
    c->min_difficulty = (long)x;
    v = cJSON_GetObjectItemCaseSensitive(cl, "max_difficulty");
    if ((rc = ct_rd_value(r, v, "curriculum_learning.max_difficulty", CT_K_INT, 0, 9e15, false, &x))) return rc;
    c->max_difficulty = (long)x;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(cl, "schedule_type");
    static const char *const types[] = {"fixed_linear", "fixed_root", "fixed_discrete", "custom"};
    int t = -1;
    for (int i = 0; i < 4 && cJSON_IsString(st); i++)
        if (!strcmp(st->valuestring, types[i])) t = i;
    if (t < 0)
        return ct_rd_fail(r, st, "curriculum_learning.schedule_type",
                          "expected fixed_linear, fixed_root, fixed_discrete or custom, got %s",
                          ct_rd_show(st, shown, sizeof shown));
    c->schedule = (ct_curriculum_schedule)t;
    c->root_degree = 1;
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(cl, "schedule_config");
    if (!cJSON_IsObject(sc))
        return ct_rd_fail(r, sc, "curriculum_learning.schedule_config", "expected an object, got %s",
                          ct_rd_show(sc, shown, sizeof shown));
    const char *need[3] = {NULL, NULL, NULL};
    if (t <= 1) need[0] = "total_curriculum_step", need[1] = "difficulty_step";
    if (t == 1) need[2] = "root_degree";
    if (t == 2) need[0] = "difficulty", need[1] = "max_step";
    for (int i = 0; i < 3 && need[i]; i++) {
        char p[96];
        snprintf(p, sizeof p, "curriculum_learning.schedule_config.%s", need[i]);
        v = cJSON_GetObjectItemCaseSensitive(sc, need[i]);
        if (!ct_rd_given(v)) return ct_rd_fail(r, sc, p, "required by schedule_type %s", types[t]);
        if (t <= 1 && (rc = ct_rd_value(r, v, p, CT_K_INT, 1, 9e15, false, &x))) return rc;
        if (t <= 1 && i == 1 && (long)x % 8)
            ct_rd_warn(r, v, p, "%g is not a multiple of 8 (tensor-core alignment)", x);
        if (t <= 1 && i == 0) c->total_curriculum_step = (long)x;
        if (t <= 1 && i == 1) c->difficulty_step = (long)x;
        if (t == 1 && i == 2) c->root_degree = x;
    }
    if (t == 2) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(sc, "difficulty");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(sc, "max_step");
        if (!cJSON_IsArray(d) || !cJSON_IsArray(m) || cJSON_GetArraySize(d) == 0 ||
            cJSON_GetArraySize(d) != cJSON_GetArraySize(m) + 1)
            return ct_rd_fail(r, d, "curriculum_learning.schedule_config.difficulty",
                              "expected a non-empty list one longer than max_step");
        c->stages = cJSON_GetArraySize(d);
        if (c->stages > CT_CURRICULUM_MAX_STAGES)
            return ct_rd_fail(r, d, "curriculum_learning.schedule_config.difficulty",
                              "%d stages: ctrain takes at most %d", c->stages, CT_CURRICULUM_MAX_STAGES);
        for (int i = 0; i < c->stages; i++)
            if ((rc = read_stage(r, d, "difficulty", i, &c->difficulty[i])) ||
                (i + 1 < c->stages && (rc = read_stage(r, m, "max_step", i, &c->max_step[i]))))
                return rc;
    }
    c->enabled = true;
    /* DeepSpeed's engine acts on curriculum_type seqlen only (it passes curriculum_seqlen to the
     * model); other types and a custom schedule are the user's code to run: not acted on here */
    if (strcmp(c->type, "seqlen") != 0 || c->schedule == CT_CURRICULUM_CUSTOM) {
        ct_rd_add_unused(r, "curriculum_learning");
        r->cfg->pending.curriculum = true;
    }
    return CT_OK;
}

/* data_efficiency (DeepSpeed's deepspeed/runtime/data_pipeline/config.py) is listed as read but not
 * used, except its curriculum switch, data_sampling.curriculum_learning.enabled, which DeepSpeed
 * acts on whatever data_efficiency.enabled says. As in DeepSpeed, an enabled curriculum needs
 * curriculum_metrics and the objects on the way must be objects (DeepSpeed fails on anything
 * else). */
static int read_data_curriculum(ct_rd *r, const cJSON *root) {
    static const char *const steps[] = {"data_efficiency", "data_sampling", "curriculum_learning"};
    const cJSON *node = root;
    char path[128] = "", shown[128];
    for (int i = 0; i < CT_ARRAY_LEN(steps); i++) {
        node = cJSON_GetObjectItemCaseSensitive(node, steps[i]);
        size_t len = strlen(path);
        snprintf(path + len, sizeof path - len, "%s%s", i ? "." : "", steps[i]);
        if (!ct_rd_given(node)) return CT_OK;
        if (!cJSON_IsObject(node))
            return ct_rd_fail(r, node, path, "expected an object, got %s", ct_rd_show(node, shown, sizeof shown));
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(node, "enabled");
    double x = 0;
    if (ct_rd_given(en) && !ct_rd_is_auto(en)) {
        int rc = ct_rd_value(r, en, "data_efficiency.data_sampling.curriculum_learning.enabled", CT_K_BOOL, 0, 1,
                             false, &x);
        if (rc) return rc;
    }
    if (!x) return CT_OK;
    if (!cJSON_GetObjectItemCaseSensitive(node, "curriculum_metrics"))
        return ct_rd_fail(r, node, "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics",
                          "required when curriculum learning is enabled (as in DeepSpeed)");
    r->cfg->pending.data_curriculum = true;
    return CT_OK;
}

/* The monitors, each into its own part of the config. Pydantic sections: strict and lax. */
static int read_monitors(ct_rd *r, const cJSON *root) {
    static const ct_section tb = {"tensorboard", monitor_fields, CT_ARRAY_LEN(monitor_fields), NULL, 0, true, true,
                                  false, true};
    static const ct_section csv = {"csv_monitor", monitor_fields, CT_ARRAY_LEN(monitor_fields), NULL, 0, true, true,
                                   false, true};
    static const ct_section wandb = {"wandb", wandb_fields, CT_ARRAY_LEN(wandb_fields), NULL, 0, true, true, true,
                                     true};
    static const ct_section flops = {"flops_profiler", flops_fields, CT_ARRAY_LEN(flops_fields), NULL, 0, false,
                                     false, false, true};
    static const ct_section ckpt = {"checkpoint", ckpt_fields, CT_ARRAY_LEN(ckpt_fields), NULL, 0, false, false,
                                    false, true};
    const ct_section *secs[] = {&tb, &csv, &wandb, &flops, &ckpt};
    void *dst[] = {&r->cfg->tensorboard, &r->cfg->csv_monitor, r->cfg, &r->cfg->flops_profiler, r->cfg};
    for (int i = 0; i < CT_ARRAY_LEN(secs); i++) {
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, secs[i]->name);
        int rc = ct_rd_section(r, sec, secs[i]->name, secs[i], dst[i]);
        if (rc) return rc;
        if (sec && secs[i]->whole) ct_rd_add_unused(r, secs[i]->name);
    }
    return CT_OK;
}

int ct_rd_ds_sections(ct_rd *r, const cJSON *root) {
    int rc0 = read_monitors(r, root);
    if (rc0) return rc0;
    for (int i = 0; i < CT_ARRAY_LEN(ds_sections); i++) {
        const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, ds_sections[i].name);
        if (!sec) continue;
        int rc = ct_rd_section(r, sec, ds_sections[i].name, &ds_sections[i], &r->cfg->pending);
        if (rc) return rc;
        if (ds_sections[i].whole) ct_rd_add_unused(r, ds_sections[i].name);
    }
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(root, "checkpoint");
    const cJSON *tv = cJSON_IsObject(ck) ? cJSON_GetObjectItemCaseSensitive(ck, "tag_validation") : NULL;
    if (ct_rd_given(tv) && cJSON_IsString(tv) && strcasecmp(tv->valuestring, "ignore") &&
        strcasecmp(tv->valuestring, "warn") && strcasecmp(tv->valuestring, "fail"))
        return ct_rd_fail(r, tv, "checkpoint.tag_validation", "expected \"Ignore\", \"Warn\" or \"Fail\", got \"%s\"",
                          tv->valuestring);
    const cJSON *cdt = cJSON_GetObjectItemCaseSensitive(root, "communication_data_type");
    if (ct_rd_given(cdt) && cJSON_IsString(cdt) && strcasecmp(cdt->valuestring, "fp32") &&
        strcasecmp(cdt->valuestring, "fp16") && strcasecmp(cdt->valuestring, "bf16"))
        return ct_rd_fail(r, cdt, "communication_data_type", "expected \"fp32\", \"fp16\" or \"bf16\", got \"%s\"",
                          cdt->valuestring);
    int rc = read_curriculum(r, root);
    if (!rc) rc = read_data_curriculum(r, root);
    if (rc) return rc;
    const cJSON *pld = cJSON_GetObjectItemCaseSensitive(root, "progressive_layer_drop");
    if (ct_rd_given(pld) && (!cJSON_IsObject(pld) || !cJSON_GetObjectItemCaseSensitive(pld, "enabled")))
        return ct_rd_fail(r, pld, "progressive_layer_drop.enabled", "required when the section is present");
    return refuse_other_kinds(r, root);
}


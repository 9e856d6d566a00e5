/* config.c: the facade of the config module: ct_config_load(), ct_config_free(),
 * ct_config_to_json() and `ctrain config check`. It calls the section readers; they never call it
 * (ct_config_where and ct_config_resolve_path live in read.c, below them).
 *
 * Order of work (each step sees the result of the previous one):
 *   parse -> splice "model"/"data" files -> apply overrides -> read every section (schema.c)
 *   -> overrides that named unknown keys -> batch rule (batch.c) -> null members out of "model"
 *   and "data" -> one "read but not used" warning (less what the not_yet.c
 *   lines say) -> build cfg->resolved. */
#include <stdlib.h>
#include <string.h>

#include "core/config/internal.h"

const char *ct_source_name(ct_source s) {
    switch (s) {
    case CT_SRC_DEFAULT: return "default";
    case CT_SRC_FILE: return "file";
    case CT_SRC_OVERRIDE: return "--set";
    case CT_SRC_DERIVED: return "derived";
    case CT_SRC_AUTO: return "auto";
    }
    return "?";
}

static void set_names(ct_config *cfg, const char *path) {
    snprintf(cfg->path, sizeof cfg->path, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(cfg->dir, sizeof cfg->dir, "%.*s", (int)((slash - path) ? (slash - path) : 1), path);
    else
        snprintf(cfg->dir, sizeof cfg->dir, ".");
    const char *base = slash ? slash + 1 : path;
    snprintf(cfg->name, sizeof cfg->name, "%s", base);
    char *ext = strrchr(cfg->name, '.');
    if (ext && ext != cfg->name) *ext = 0;
    if (!cfg->name[0]) snprintf(cfg->name, sizeof cfg->name, "config");
}

/* One warning listing every valid DeepSpeed key that ctrain reads but does not act on. */
static void warn_unused(ct_rd *r) {
    if (r->n_unused == 0) return;
    char msg[1000];
    int k = snprintf(msg, sizeof msg, "keys read but not used by ctrain: ");
    for (int i = 0; i < r->n_unused && k < (int)sizeof msg - 40; i++)
        k += snprintf(msg + k, sizeof msg - (size_t)k, "%s%s", i ? ", " : "", r->unused[i]);
    if (k >= (int)sizeof msg - 40) snprintf(msg + sizeof msg - 40, 40, ", ... (%d keys)", r->n_unused);
    ct_warnf(r->warn, "%s", msg);
}

static int load(ct_rd *r, const ct_config_opts *opts) {
    ct_config *cfg = r->cfg;
    cfg->doc = ct_json_parse_file(opts->path, r->warn, r->err);
    if (!cfg->doc) return r->err && r->err->code ? r->err->code : CT_ERR_CONFIG;
    cJSON *root = ct_json_root(cfg->doc);
    if (!cJSON_IsObject(root)) {
        char shown[128];
        return ct_errf(r->err, CT_ERR_CONFIG, "%s: expected a JSON object at the top level, got %s", cfg->path,
                       ct_rd_show(root, shown, sizeof shown));
    }
    int rc = ct_cfg_splice_sections(r, root, true);
    if (!rc) rc = ct_cfg_apply_overrides(r, root);
    if (!rc) rc = ct_cfg_splice_sections(r, root, false);
    if (!rc) rc = ct_rd_top(r, root);
    if (!rc) rc = ct_rd_check_overrides(r); /* before the batch rule: a misspelt batch key explains it */
    if (!rc) rc = ct_rd_batch(r, root);
    if (rc) return rc;
    ct_cfg_drop_nulls(cfg, root);
    ct_rd_drop_explained(r);
    warn_unused(r);
    cfg->resolved = ct_rd_resolved(r, root);
    return CT_OK;
}

int ct_config_load(const ct_config_opts *opts, ct_config **out, ct_warnings *warn, ct_err *err) {
    *out = NULL;
    if (err) err->code = CT_OK;
    if (!opts || !opts->path || !opts->path[0])
        return ct_errf(err, CT_ERR_CONFIG, "no config file given (use --config FILE)");
    ct_config *cfg = ct_xcalloc(1, sizeof *cfg);
    set_names(cfg, opts->path);
    cfg->world_size = opts->world_size > 0 ? opts->world_size : 1;
    cfg->retired = cJSON_CreateArray();
    ct_err local = {0};
    ct_rd r = {.cfg = cfg, .opts = opts, .warn = warn, .err = err ? err : &local};
    int rc = load(&r, opts);
    for (int i = 0; i < r.n_unused; i++) free(r.unused[i]);
    free(r.unused);
    if (rc) {
        ct_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return CT_OK;
}

void ct_config_free(ct_config *cfg) {
    if (!cfg) return;
    cJSON_Delete(cfg->resolved);
    cJSON_Delete(cfg->retired);
    if (cfg->doc) ct_json_free(cfg->doc);
    if (cfg->model_doc) ct_json_free(cfg->model_doc);
    if (cfg->data_doc) ct_json_free(cfg->data_doc);
    for (int i = 0; i < cfg->n_not_identity; i++) free(cfg->not_identity[i]);
    free(cfg->not_identity);
    for (int i = 0; i < cfg->n_rows; i++) free(cfg->rows[i]);
    free(cfg->rows);
    free(cfg);
}

char *ct_config_to_json(const ct_config *cfg) {
    return cfg && cfg->resolved ? cJSON_Print(cfg->resolved) : NULL;
}

static const char *opt_summary(const ct_optimizer_cfg *o, char *buf, size_t n) {
    if (o->type == CT_OPT_SGD)
        snprintf(buf, n, "%s lr %g, momentum %g, weight_decay %g%s", o->type_name, o->lr, o->momentum,
                 o->weight_decay, o->nesterov ? ", nesterov" : "");
    else
        snprintf(buf, n, "%s lr %g, betas (%g, %g), eps %g, weight_decay %g%s", o->type_name, o->lr, o->beta1,
                 o->beta2, o->eps, o->weight_decay,
                 o->type == CT_OPT_LAMB ? "" : o->adam_w_mode ? " (decoupled)" : " (L2, adam_w_mode false)");
    return buf;
}

static const char *sched_summary(const ct_scheduler_cfg *s, double lr, char *buf, size_t n) {
    char total[48];
    if (s->total_num_steps < 0)
        snprintf(total, sizeof total, "the run's total");
    else
        snprintf(total, sizeof total, "%ld", s->total_num_steps);
    const char *wt = s->warmup_type == CT_WARMUP_LINEAR ? "linear" : "log";
    switch (s->type) {
    case CT_SCHED_NONE: snprintf(buf, n, "none (constant lr %g)", lr); break;
    case CT_SCHED_WARMUP_LR:
        snprintf(buf, n, "WarmupLR %g -> %g over %ld steps (%s)", s->warmup_min_lr, s->warmup_max_lr,
                 s->warmup_num_steps, wt);
        break;
    case CT_SCHED_WARMUP_DECAY_LR:
        snprintf(buf, n, "WarmupDecayLR %g -> %g over %ld steps (%s), decay to step %s", s->warmup_min_lr,
                 s->warmup_max_lr, s->warmup_num_steps, wt, total);
        break;
    case CT_SCHED_WARMUP_COSINE_LR:
        snprintf(buf, n, "WarmupCosineLR lr %g, warmup %ld steps (%s), cosine to %g x lr at step %s", lr,
                 s->warmup_num_steps, wt, s->cos_min_ratio, total);
        break;
    case CT_SCHED_ONE_CYCLE:
        snprintf(buf, n, "OneCycle %g -> %g -> %g (%ld + %ld steps)", s->cycle_min_lr, s->cycle_max_lr,
                 s->cycle_min_lr, s->cycle_first_step_size, s->cycle_second_step_size);
        break;
    case CT_SCHED_LR_RANGE_TEST:
        snprintf(buf, n, "LRRangeTest from %g, x(1 + %g i) every %ld steps%s", s->lr_range_test_min_lr,
                 s->lr_range_test_step_rate, s->lr_range_test_step_size,
                 s->lr_range_test_staircase ? " (staircase)" : "");
        break;
    }
    return buf;
}

int ct_config_check(const ct_config_opts *given, FILE *out, ct_warnings *warn, ct_err *err) {
    ct_config_opts opts = {.path = given->path, .world_size = given->world_size > 0 ? given->world_size : 1,
                           .formats = given->formats, .n_formats = given->n_formats};
    ct_config *cfg = NULL;
    int rc = ct_config_load(&opts, &cfg, warn, err);
    if (rc) return rc;
    char buf[512];
    fprintf(out, "%s: ok at world size %d\n", cfg->path, cfg->world_size);
    fprintf(out, "batch      %ld = micro %ld × accumulation %ld × world %d  (train_batch_size: %s, micro: %s, "
                 "accumulation: %s)\n",
            cfg->train_batch_size, cfg->micro_batch, cfg->grad_accum, cfg->world_size,
            ct_source_name(cfg->train_batch_src), ct_source_name(cfg->micro_batch_src),
            ct_source_name(cfg->grad_accum_src));
    if (cfg->fp16.enabled && cfg->fp16.loss_scale > 0)
        fprintf(out, "precision  fp16, static loss scale %g\n", cfg->fp16.loss_scale);
    else if (cfg->fp16.enabled)
        fprintf(out, "precision  fp16, dynamic loss scale 2^%d, window %d, hysteresis %d, min %g\n",
                cfg->fp16.initial_scale_power, cfg->fp16.loss_scale_window, cfg->fp16.hysteresis,
                cfg->fp16.min_loss_scale);
    else
        fprintf(out, "precision  %s\n", cfg->bf16 ? "bf16" : "fp32");
    fprintf(out, "optimizer  %s\n", opt_summary(&cfg->optimizer, buf, sizeof buf));
    fprintf(out, "scheduler  %s\n", sched_summary(&cfg->scheduler, cfg->optimizer.lr, buf, sizeof buf));
    if (cfg->gradient_clipping > 0) fprintf(out, "clipping   global norm %g\n", cfg->gradient_clipping);
    /* ZeRO partitions at stages 1-3 with several ranks (core/zero/stage.h); one process without
     * offload has nothing to split: say what the file asks for, not what training does. */
    static const char *const dev[] = {"none", "cpu", "nvme"};
    static const char *const split[] = {"", "", ", gradients reduce-scattered",
                                        ", gradients reduce-scattered, parameters gathered layer by layer"};
    bool partitions = cfg->world_size > 1 && cfg->zero.stage >= 1;
    if (cfg->zero.stage == 0)
        fprintf(out, "zero       stage 0 (off)\n");
    else if (cfg->zero.offload_optimizer.device == CT_OFFLOAD_CPU && cfg->world_size <= 1)
        fprintf(out, "zero       stage %d with optimizer offload (one process): on a device (a GPU, the capped device) "
                     "the fp32 master, gradients and optimizer state in host memory and the step on the CPU; on the "
                     "CPU backend nothing moves and it trains as stage 0\n", cfg->zero.stage);
    else if (cfg->zero.offload_optimizer.device == CT_OFFLOAD_NVME)
        fprintf(out, "zero       stage %d with optimizer offload to NVMe: the fp32 master and optimizer state in swap "
                     "files under %s (%ld host buffers), gradients in host memory, the step on the CPU\n",
                cfg->zero.stage, cfg->zero.offload_optimizer.nvme.path, cfg->zero.offload_optimizer.nvme.buffer_count);
    else if (partitions)
        fprintf(out, "zero       stage %d over %d ranks: fp32 master and optimizer state split %d ways%s; offload "
                     "optimizer: %s\n", cfg->zero.stage, cfg->world_size, cfg->world_size,
                split[cfg->zero.stage], dev[cfg->zero.offload_optimizer.device]);
    else
        fprintf(out, "zero       asks for stage %d, offload optimizer: %s, offload params: %s; not used yet, "
                     "trains without ZeRO (below)\n", cfg->zero.stage, dev[cfg->zero.offload_optimizer.device],
                dev[cfg->zero.offload_param.device]);
    fprintf(out, "model      %s\n", cfg->model ? "given" : "not given (training needs a \"model\" section)");
    fprintf(out, "data       %s\n", cfg->data ? "given" : "not given (training needs a \"data\" section)");
    ct_not_yet ny[CT_NOT_YET_MAX];
    int n = ct_config_not_yet(cfg, ny, CT_NOT_YET_MAX);
    if (n > 0) fprintf(out, "accepted, not used yet:\n");
    for (int i = 0; i < n && i < CT_NOT_YET_MAX; i++) fprintf(out, "  %s\n", ny[i].text);
    ct_config_free(cfg);
    return CT_OK;
}

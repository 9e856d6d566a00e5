/* observe.c: the run's metric files (core/report/metrics.h): where they go, who writes them. */
#include <stdio.h>

#include "core/report/nvml.h"
#include "core/train/internal.h"
#include "core/util/fs.h"

/* NVML for the GPU the run trains on (core/report/nvml.h): its utilisation and memory in the
 * step lines, metrics.jsonl and the summary. Without it the run says why, once, and goes on. */
static void open_nvml(ct_trainer *t) {
    if (!t->be->pci_bus_id[0]) return;   /* the CPU backend */
    char why[512];
    t->obs.nvml = ct_nvml_open(t->be->pci_bus_id, why, sizeof why);
    if (!t->obs.nvml) ct_report_line(&t->obs.rep, "no GPU utilisation figures: %s", why);
    t->obs.rep.gpu = t->obs.nvml;
}

int ct_trainer_observe_start(ct_trainer *t, ct_err *err) {
    ct_report_plan(&t->obs.rep, t->d.total_steps);
    if (!t->cfg->checkpoint_enabled)
        ct_report_line(&t->obs.rep, "checkpoint.enabled false: this run writes no checkpoint (nor best/)");
    if (t->comm && t->comm->rank != 0) return CT_OK; /* one copy of the history: rank 0's */
    open_nvml(t);
    const ct_config *cfg = t->cfg;
    char jsonl[1100], csv[1400], tb[1400];
    int rc = ct_fs_join(jsonl, sizeof jsonl, cfg->train.run_dir, "metrics.jsonl", err);
    const ct_monitor_cfg *cm = &cfg->csv_monitor, *tm = &cfg->tensorboard;
    /* DeepSpeed's <output_path>/<job_name>; an empty output_path keeps the files in the run
     * directory with the run's other outputs (DeepSpeed: the working directory) */
    if (!rc && cm->enabled)
        rc = ct_fs_join(csv, sizeof csv, cm->output_path[0] ? cm->output_path : cfg->train.run_dir, cm->job_name, err);
    if (!rc && tm->enabled)
        rc = ct_fs_join(tb, sizeof tb, tm->output_path[0] ? tm->output_path : cfg->train.run_dir, tm->job_name, err);
    if (!rc) rc = ct_fs_mkdirs(cfg->train.run_dir, err);
    if (rc) return rc;
    char notice[3200];
    ct_metrics_opts o = {.jsonl_path = jsonl, .csv_dir = cm->enabled ? csv : NULL, .tb_dir = tm->enabled ? tb : NULL,
                         .append = t->ck.resumed, .notice = notice, .notice_n = sizeof notice};
    rc = ct_metrics_open(&o, &t->obs.metrics, err);
    if (!rc && notice[0]) fprintf(stderr, "ctrain: warning: %s\n", notice);
    return rc ? rc : ct_trainer_profiler_open(t, err);
}

void ct_trainer_observe_end(ct_trainer *t) {
    ct_err err = {0};
    if (ct_metrics_close(t->obs.metrics, &err)) fprintf(stderr, "ctrain: warning: %s\n", err.msg);
    t->obs.metrics = NULL;
    ct_trainer_profiler_close(t);
    t->obs.rep.gpu = NULL;
    ct_nvml_close(t->obs.nvml);
    t->obs.nvml = NULL;
}

/* summary.c: the summary's status and the totals every run ends with (wall time, peak memory
 * by category); shared by the set-up (trainer.c) and the loop (loop.c). */
#include <string.h>

#include "core/train/internal.h"

void ct_trainer_set_status(ct_trainer *t, const char *status, const ct_err *err) {
    snprintf(t->sum->status, sizeof t->sum->status, "%s", status);
    if (!err) return;
    const char *nl = strchr(err->msg, '\n');
    size_t len = nl ? (size_t)(nl - err->msg) : strlen(err->msg);
    if (len >= sizeof t->sum->error) len = sizeof t->sum->error - 1;
    memcpy(t->sum->error, err->msg, len);
    t->sum->error[len] = '\0';
}

void ct_train_summary_hparams(ct_summary *s, const ct_config *cfg) {
    static const char *const sched[] = {[CT_SCHED_NONE] = "", [CT_SCHED_WARMUP_LR] = "WarmupLR",
                                        [CT_SCHED_WARMUP_DECAY_LR] = "WarmupDecayLR",
                                        [CT_SCHED_WARMUP_COSINE_LR] = "WarmupCosineLR",
                                        [CT_SCHED_ONE_CYCLE] = "OneCycle", [CT_SCHED_LR_RANGE_TEST] = "LRRangeTest"};
    ct_summary_hparams *h = &s->hparams;
    *h = (ct_summary_hparams){.set = true, .lr = cfg->optimizer.lr, .train_batch_size = cfg->train_batch_size,
                              .micro_batch = cfg->micro_batch, .grad_accum = cfg->grad_accum,
                              .world_size = cfg->world_size, .seed = (unsigned long long)cfg->train.seed};
    snprintf(h->precision, sizeof h->precision, "%s", cfg->bf16 ? "bf16" : cfg->fp16.enabled ? "fp16" : "fp32");
    snprintf(h->optimizer, sizeof h->optimizer, "%s", cfg->optimizer.type_name);
    unsigned st = (unsigned)cfg->scheduler.type;
    snprintf(h->scheduler, sizeof h->scheduler, "%s", st < CT_ARRAY_LEN(sched) && sched[st] ? sched[st] : "");
}

/* memory_breakdown: one line with the peak of every category. */
static void report_memory(ct_trainer *t, const ct_mem_stats *m) {
    char line[512];
    size_t used = (size_t)snprintf(line, sizeof line, "peak %s memory (MiB):",
                                   ct_backend_separate_memory(t->be) ? "device" : "host");
    for (int c = 0; c < CT_MEM_CAT_COUNT && used < sizeof line; c++)
        used += (size_t)snprintf(line + used, sizeof line - used, " %s %.1f", ct_mem_cat_name((ct_mem_cat)c),
                                 (double)m->peak[c] / 1048576.0);
    if (used < sizeof line)
        snprintf(line + used, sizeof line - used, "; all %.1f", (double)m->peak_total / 1048576.0);
    ct_report_line(&t->obs.rep, "%s", line);
}

/* On a device: the host memory beside it, by category: what the device backend pinned, and what
 * the CPU backend of ZeRO-Offload holds (the host state when it is not pinned). */
static void host_figures(ct_trainer *t, const ct_mem_stats *dev) {
    ct_summary *s = t->sum;
    ct_mem_stats h = {0};
    if (t->host_be) t->host_be->mem.mem_stats(t->host_be, &h);
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) s->peak_host_by_cat[c] = dev->host_peak[c] + h.peak[c];
    memcpy(s->planned_host_by_cat, t->plan.host, sizeof s->planned_host_by_cat);
    s->has_host_figures = true;
}

void ct_trainer_finish(ct_trainer *t) {
    ct_summary *s = t->sum;
    s->wall_s = ct_now() - t->t_open;
    s->skipped_records = (t->d.train_l ? ct_loader_skipped(t->d.train_l) : 0) +
                         (t->d.eval_l ? ct_loader_skipped(t->d.eval_l) : 0);
    s->peak_host_bytes = ct_peak_rss_bytes();
    if (t->be && t->be->mem.peak_bytes) s->peak_device_bytes = t->be->mem.peak_bytes(t->be);
    if (t->be && t->be->mem.mem_stats) {
        ct_mem_stats m;
        t->be->mem.mem_stats(t->be, &m);
        memcpy(s->peak_by_cat, m.peak, sizeof s->peak_by_cat);
        s->has_mem_stats = true;
        /* a device, or on the CPU backend NVMe offload's host side (its own CPU backend) */
        if (ct_backend_separate_memory(t->be) || t->plan.offload) host_figures(t, &m);
        if (t->cfg->memory_breakdown) report_memory(t, &m);
    }
    ct_trainer_diagnose(t);
}

/* diagnose.c: the trainer's side of the bottleneck report (core/report/bottleneck.h): the run's
 * measurements gathered, the rules applied, the findings printed at the end of the run. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "core/report/bottleneck.h"
#include "core/train/fit.h"
#include "core/train/internal.h"

/* ct_fit_largest_micro's question: the plan's total at micro-batch m (SIZE_MAX: cannot plan). */
static size_t plan_total(void *ctx, long micro) {
    ct_run_plan p;
    ct_err err = {0};
    return ct_fit_plan(ctx, true, micro, CT_SEGMENTS_CONFIG, &p, &err) ? SIZE_MAX : p.total;
}

static void gather(const ct_trainer *t, ct_run_measures *m) {
    const ct_config *cfg = t->cfg;
    const ct_summary *s = t->sum;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    *m = (ct_run_measures){.steps = s->steps, .data_wait_share = s->data_wait_share,
                           .cores = cores > 0 ? (int)cores : 0, .micro_batch = cfg->micro_batch,
                           .accum = cfg->grad_accum, .initial_scale = NAN, .final_scale = NAN,
                           .skipped_steps = s->skipped_steps};
    if (t->d.train_ds) {
        ct_loader_opts o;
        ct_err err = {0};
        if (ct_loader_opts_from_config(cfg, t->d.train_ds, true, 0, &o, &err) == CT_OK) {
            m->workers = o.workers > 0 ? o.workers : m->cores;   /* 0: one per core (loader.h) */
            m->cache = o.cache;
        }
        m->format = t->d.train_ds->format;
        m->source = t->d.train_ds->source;
    }
    m->precision = t->m.amp.compute == CT_BF16 ? "bf16" : t->m.amp.compute == CT_F16 ? "fp16" : "fp32";
    m->gpu = t->be && ct_backend_separate_memory(t->be);   /* a GPU, or the capped device */
    if (m->gpu) {
        m->sm = ct_device_sm(t->be->device_desc);
        m->device_bytes = t->be->memory_bytes;
        m->peak_bytes = s->peak_device_bytes;
    }
    if (m->device_bytes && m->peak_bytes) {
        long per_rank = cfg->train_batch_size / (cfg->world_size > 0 ? cfg->world_size : 1);
        m->fits_micro = ct_fit_largest_micro(per_rank, per_rank, (size_t)(CT_FIT_AUTO_MARGIN * (double)m->device_bytes),
                                             plan_total, (void *)cfg);
        m->fits_accum = m->fits_micro > 0 ? per_rank / m->fits_micro : 0;
    }
    if (t->m.amp.scaling) {
        m->initial_scale = ldexp(1.0, cfg->fp16.initial_scale_power);
        m->final_scale = t->m.amp.scaler.scale;
        m->min_scale = cfg->fp16.min_loss_scale;
    }
}

void ct_trainer_diagnose(ct_trainer *t) {
    /* samples_per_s is set by a fit that trained (not by eval, a dry run or a failed start) */
    if ((t->comm && t->comm->rank != 0) || !isfinite(t->sum->samples_per_s) || t->sum->steps <= 0 ||
        !strcmp(t->sum->status, "error"))
        return;
    ct_run_measures m;
    gather(t, &m);
    ct_finding f[8];
    int n = ct_bottleneck_find(&m, f, CT_ARRAY_LEN(f));
    ct_report *r = &t->obs.rep;
    if (n == 0 && !t->opts.profile_steps) return;   /* a plain run says nothing when nothing fired */
    ct_report_line(r, "bottleneck report (%ld steps, data wait %.1f%% of step time, %s on %s):", m.steps,
                   isfinite(m.data_wait_share) ? 100 * m.data_wait_share : 0.0, m.precision, t->be->name);
    if (n == 0) ct_report_line(r, "  no rule fired: data wait under %.0f%%, precision and memory as the device "
                               "suits, no loss-scale trouble", 100 * CT_BOTTLENECK_DATA_WAIT);
    for (int i = 0; i < n && i < CT_ARRAY_LEN(f); i++) {
        ct_report_line(r, "  %s", f[i].what);
        ct_report_line(r, "    -> %s", f[i].fix);
    }
}

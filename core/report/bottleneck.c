/* bottleneck.c: the rules of the bottleneck report (bottleneck.h). Each rule reads measured
 * numbers only and, when it fires, names the config keys to change and their new values. */
#include "core/report/bottleneck.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/report.h"

typedef struct findings {
    ct_finding *out;
    int max, n;
} findings;

static void add(findings *f, const char *rule, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add(findings *f, const char *rule, const char *what, const char *fmt, ...) {
    if (f->n < f->max) {
        ct_finding *x = &f->out[f->n];
        snprintf(x->rule, sizeof x->rule, "%s", rule);
        snprintf(x->what, sizeof x->what, "%s", what);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->fix, sizeof x->fix, fmt, ap);
        va_end(ap);
    }
    f->n++;
}

/* Formats `ctrain pack` turns into shards (raw samples, no decoding on the loader's threads). */
static bool packable(const char *format) {
    return format && (!strcmp(format, "idx") || !strcmp(format, "image_folder") || !strcmp(format, "webdataset"));
}

/* The loader could not keep up: more threads, the decoded samples kept in memory, or shards. */
static void data_wait_rule(const ct_run_measures *m, findings *f) {
    if (!(m->data_wait_share > CT_BOTTLENECK_DATA_WAIT)) return;
    char what[256], fix[768];
    snprintf(what, sizeof what, "the loader: training waited for data %.0f%% of the step time", 100 * m->data_wait_share);
    size_t k = 0;
    fix[0] = '\0';
    if (m->workers > 0 && m->cores > m->workers)
        k += (size_t)snprintf(fix + k, sizeof fix - k, "more loader threads: \"data\": {\"workers\": %d} (this run: %d, "
                              "%d cores)", m->cores, m->workers, m->cores);
    if (!m->cache && k < sizeof fix)
        k += (size_t)snprintf(fix + k, sizeof fix - k, "%sdecode once: \"data\": {\"cache\": true} (keeps the decoded "
                              "train set in memory from the first epoch on)", k ? "; or " : "");
    if (packable(m->format) && k < sizeof fix)
        k += (size_t)snprintf(fix + k, sizeof fix - k, "%spacked shards (no decoding at all): ctrain pack --from %s %s "
                              "--out SHARDS, then \"data\": {\"train\": {\"format\": \"shard\", \"path\": \"SHARDS\"}}",
                              k ? "; or " : "", m->format, m->source ? m->source : "SRC");
    if (!k) snprintf(fix, sizeof fix, "the loader already has every core and the cache: a faster disk, or a smaller "
                     "transform");
    add(f, "data_wait", what, "%s", fix);
}

/* fp32 on a GPU with 16-bit tensor cores: the matrix units idle. */
static void precision_rule(const ct_run_measures *m, findings *f) {
    if (!m->gpu || !m->precision || strcmp(m->precision, "fp32") != 0 || m->sm < 70) return;
    char what[256];
    snprintf(what, sizeof what, "fp32 on a tensor-core GPU (sm_%d): its 16-bit matrix units are not used", m->sm);
    if (m->sm >= 80)
        add(f, "precision", what, "\"bf16\": {\"enabled\": true} (the same range as fp32, no loss scaling; "
            "several times the matrix throughput)");
    else
        add(f, "precision", what, "\"fp16\": {\"enabled\": true} (this GPU has no bf16; the loss is scaled "
            "dynamically)");
}

/* Most of the GPU's memory unused while the planner says a larger micro-batch fits. */
static void memory_rule(const ct_run_measures *m, findings *f) {
    if (!m->device_bytes || !m->peak_bytes || m->fits_micro <= m->micro_batch) return;
    double used = (double)m->peak_bytes / (double)m->device_bytes;
    if (!(used < CT_BOTTLENECK_MEMORY_USED)) return;
    char what[256], a[32], b[32];
    snprintf(what, sizeof what, "device memory: the run's peak was %s of %s (%.0f%%)",
             ct_fmt_bytes((double)m->peak_bytes, a, sizeof a), ct_fmt_bytes((double)m->device_bytes, b, sizeof b),
             100 * used);
    add(f, "memory", what, "\"train_micro_batch_size_per_gpu\": %ld with \"gradient_accumulation_steps\": %ld (this "
        "run: %ld x %ld; the memory plan says it fits; the same train_batch_size, fewer and larger kernels)",
        m->fits_micro, m->fits_accum, m->micro_batch, m->accum);
}

/* fp16's loss scale fell to its floor: the gradients need more range than fp16 has. */
static bool scale_collapsed(const ct_run_measures *m) {
    double floor = m->min_scale > 0 ? m->min_scale : 1.0;
    return isfinite(m->final_scale) && m->final_scale <= CT_BOTTLENECK_SCALE_FLOOR * floor;
}

static void loss_scale_rule(const ct_run_measures *m, findings *f) {
    if (!isfinite(m->initial_scale) || !scale_collapsed(m)) return;
    char what[256];
    snprintf(what, sizeof what, "fp16 loss scale collapsed: %.10g at the end (started at %.10g, floor %.10g)",
             m->final_scale, m->initial_scale, m->min_scale > 0 ? m->min_scale : 1.0);
    add(f, "loss_scale", what, "\"bf16\": {\"enabled\": true} and \"fp16\": {\"enabled\": false} (bf16 has fp32's "
        "range: no loss scale to collapse)");
}

/* Many steps thrown away while the scale came down from a too-high start. */
static void skipped_rule(const ct_run_measures *m, findings *f) {
    if (!isfinite(m->initial_scale) || m->steps <= 0 || scale_collapsed(m)) return;
    double share = (double)m->skipped_steps / (double)m->steps;
    if (!(share > CT_BOTTLENECK_SKIPPED)) return;
    char what[256];
    snprintf(what, sizeof what, "fp16 overflow: %ld of %ld steps skipped (%.0f%%)", m->skipped_steps, m->steps,
             100 * share);
    /* start where the run settled, one doubling above it (the scaler grows it from there) */
    int power = (int)floor(log2(m->final_scale > 0 ? m->final_scale : 1.0)) + 1;
    if (power < 0) power = 0;
    add(f, "skipped_steps", what, "\"fp16\": {\"initial_scale_power\": %d} (the scale settled at %.10g; this run "
        "started at 2^%.0f)", power, m->final_scale, log2(m->initial_scale));
}

int ct_bottleneck_find(const ct_run_measures *m, ct_finding *out, int max) {
    findings f = {out, max, 0};
    data_wait_rule(m, &f);
    precision_rule(m, &f);
    memory_rule(m, &f);
    loss_scale_rule(m, &f);
    skipped_rule(m, &f);
    return f.n;
}

int ct_device_sm(const char *desc) {
    const char *p = desc ? strstr(desc, "sm_") : NULL;
    return p ? atoi(p + 3) : 0;
}

size_t ct_device_bytes(const char *desc) {
    const char *p = desc ? strstr(desc, " GiB") : NULL;
    if (!p) return 0;
    const char *q = p;
    while (q > desc && (q[-1] == '.' || (q[-1] >= '0' && q[-1] <= '9'))) q--;
    return q < p ? (size_t)(strtod(q, NULL) * 1073741824.0) : 0;
}

/* fit.c: what fits in a memory budget (fit.h), from ct_run_plan_make over graphs built for each
 * choice. */
#include "core/train/fit.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim/amp.h"
#include "core/report/report.h"

#define GIB 1073741824.0

static long per_rank_batch(const ct_config *cfg) {
    long w = cfg->world_size > 0 ? cfg->world_size : 1;
    return cfg->train_batch_size / w > 0 ? cfg->train_batch_size / w : 1;
}

/* ct_fit_plan with activation offload (cpu_checkpointing) on or off, whatever the config says. */
static int plan_offload(const ct_config *cfg, bool device, long micro, long segments, bool offload, ct_run_plan *out,
                        ct_err *err) {
    /* the run's config with this choice's batch: ct_run_plan_make reads the micro-batch from it
     * (the loader's batches) as the run would */
    ct_config *c = ct_xmalloc(sizeof *c);
    *c = *cfg;
    c->pending.cpu_checkpointing = offload;
    c->micro_batch = micro;
    c->grad_accum = per_rank_batch(cfg) / micro > 0 ? per_rank_batch(cfg) / micro : 1;
    ct_graph *g = NULL;
    int rc = ct_graph_build_with(c, micro, ct_amp_compute_dtype(cfg), 0, segments, &g, err);
    if (!rc) ct_run_plan_make(c, g, device, out);
    ct_graph_free(g);
    free(c);
    return rc;
}

int ct_fit_plan(const ct_config *cfg, bool device, long micro, long segments, ct_run_plan *out, ct_err *err) {
    return plan_offload(cfg, device, micro, segments, cfg->pending.cpu_checkpointing, out, err);
}

long ct_fit_every_block(const ct_config *cfg, ct_err *err) {
    ct_graph *g = NULL;
    if (ct_graph_build_with(cfg, 1, ct_amp_compute_dtype(cfg), 0, 0, &g, err)) return 0;
    long n = ct_graph_blocks(g);
    ct_graph_free(g);
    return n;
}

long ct_fit_largest_micro(long per_rank, long max_micro, size_t budget, size_t (*peak)(void *ctx, long micro),
                          void *ctx) {
    for (long m = max_micro < per_rank ? max_micro : per_rank; m >= 1; m--)
        if (per_rank % m == 0 && peak(ctx, m) <= budget) return m;
    return 0;
}

/* peak() for ct_fit_largest_micro: the plan of the config with one checkpointing choice. */
typedef struct plan_ctx {
    const ct_config *cfg;
    bool device;
    long segments;
} plan_ctx;

static size_t plan_peak(void *ctx, long micro) {
    plan_ctx *p = ctx;
    ct_run_plan plan;
    ct_err err = {0};
    if (ct_fit_plan(p->cfg, p->device, micro, p->segments, &plan, &err)) return SIZE_MAX;
    return plan.total;
}

static const char *fmt(size_t bytes, char *buf) { return ct_fmt_bytes((double)bytes, buf, 32); }

/* One more suggestion line into out: "  - " (and "or " after the first), the text. */
static void add_line(char *out, size_t n, size_t *used, const char *fmt_, ...) __attribute__((format(printf, 4, 5)));
static void add_line(char *out, size_t n, size_t *used, const char *fmt_, ...) {
    if (*used >= n) return;
    int w = snprintf(out + *used, n - *used, "%s  - %s", *used ? "\n" : "", *used ? "or " : "");
    if (w > 0) *used += (size_t)w;
    if (*used >= n) return;
    va_list ap;
    va_start(ap, fmt_);
    w = vsnprintf(out + *used, n - *used, fmt_, ap);
    va_end(ap);
    if (w > 0) *used += (size_t)w;
}

/* ZeRO-Offload as a suggestion: on a device, a run that does not offload the optimizer, planned
 * with offload_optimizer "cpu" (at the config's stage, stage 2 when it is 0); a line when that
 * fits `limit`. */
static void suggest_offload(const ct_config *cfg, bool device, size_t limit, char *out, size_t n, size_t *used) {
    if (!device || ct_run_plan_offload(cfg, device)) return;
    ct_config *c = ct_xmalloc(sizeof *c);
    *c = *cfg;
    c->zero.offload_optimizer.device = CT_OFFLOAD_CPU;
    if (c->zero.stage == 0) c->zero.stage = 2;
    ct_run_plan p;
    ct_err err = {0};
    int rc = ct_fit_plan(c, device, c->micro_batch, CT_SEGMENTS_CONFIG, &p, &err);
    int stage = c->zero.stage;
    free(c);
    char a[32], b[32];
    if (!rc && p.total <= limit)
        add_line(out, n, used, "ZeRO-Offload (the fp32 master, gradients and optimizer state in host memory): "
                 "\"zero_optimization\": {\"stage\": %d, \"offload_optimizer\": {\"device\": \"cpu\"}} plans %s of "
                 "device memory and %s of host memory", stage, fmt(p.total, a), fmt(p.host_total, b));
}

void ct_fit_suggest(const ct_config *cfg, bool device, size_t limit, char *out, size_t n) {
    long per_rank = per_rank_batch(cfg), micro = cfg->micro_batch;
    ct_err err = {0};
    long blocks = ct_fit_every_block(cfg, &err);
    plan_ctx as_is = {cfg, device, CT_SEGMENTS_CONFIG}, every = {cfg, device, blocks};
    char a[32], b[32], l[32];
    size_t used = 0;
    out[0] = '\0';
    suggest_offload(cfg, device, limit, out, n, &used);
    /* a smaller micro-batch, the config's checkpointing kept */
    long m = ct_fit_largest_micro(per_rank, micro, limit, plan_peak, &as_is);
    if (m > 0)
        add_line(out, n, &used, "micro-batch %ld with gradient accumulation %ld fits in %s (train_micro_batch_size_per_gpu "
                 "%ld)", m, per_rank / m, fmt(plan_peak(&as_is, m), a), m);
    /* every block checkpointed, at the largest micro-batch that then fits */
    long mb = blocks > 0 ? ct_fit_largest_micro(per_rank, micro, limit, plan_peak, &every) : 0;
    if (mb > 0) {
        char accum[64] = "";
        if (mb != micro) snprintf(accum, sizeof accum, " with gradient accumulation %ld", per_rank / mb);
        add_line(out, n, &used, "checkpoint every block (activation_checkpointing.number_checkpoints %ld): %s at "
                 "micro-batch %ld%s", blocks, fmt(plan_peak(&every, mb), a), mb, accum);
    }
    if (used > 0) return;
    /* nothing fits: say what the smallest choice needs, and how much of it is fixed */
    plan_ctx *least = blocks > 0 ? &every : &as_is;
    ct_run_plan p;
    if (ct_fit_plan(cfg, device, 1, least->segments, &p, &err)) {
        snprintf(out, n, "  nothing this planner can try fits in %s", fmt(limit, l));
        return;
    }
    size_t fixed = p.bytes[CT_MEM_PARAMS] + p.bytes[CT_MEM_MASTER] + p.bytes[CT_MEM_GRADS] + p.bytes[CT_MEM_OPTIM];
    snprintf(out, n, "  nothing fits in %s: micro-batch 1%s needs %s, of which %s are parameters, master weights, "
             "gradients and optimizer state; a device with more memory (or a smaller model) is needed",
             fmt(limit, l), blocks > 0 ? " with every block checkpointed" : "", fmt(p.total, a), fmt(fixed, b));
}

void ct_fit_describe(const ct_run_plan *p, char *out, size_t n) {
    size_t used = 0;
    char v[32];
    for (int c = 0; c < CT_MEM_CAT_COUNT && used < n; c++)
        used += (size_t)snprintf(out + used, n - used, "%s%s %s", c ? ", " : "", ct_mem_cat_name((ct_mem_cat)c),
                                 fmt(p->bytes[c], v));
    if (used < n) snprintf(out + used, n - used, " · all %s", fmt(p->total, v));
}

static void append_plan_and_suggestions(const ct_config *cfg, const ct_run_plan *p, size_t limit, ct_err *err) {
    char line[512], sug[1024];
    ct_fit_describe(p, line, sizeof line);
    ct_err_append(err, "  planned: %s", line);
    if (limit == 0) return;
    ct_fit_suggest(cfg, p->device, limit, sug, sizeof sug);
    ct_err_append(err, "%s", sug);
}

int ct_fit_over_limit(const ct_config *cfg, const ct_run_plan *p, size_t limit, const char *what, ct_err *err) {
    char a[32], l[32];
    ct_errf(err, CT_ERR_RUNTIME, "%s: the memory plan needs %s but %s allows %s; nothing was trained", cfg->path,
            fmt(p->total, a), what, fmt(limit, l));
    append_plan_and_suggestions(cfg, p, limit, err);
    return CT_ERR_RUNTIME;
}

int ct_fit_explain_oom(const ct_config *cfg, const ct_run_plan *p, size_t limit, ct_err *err) {
    append_plan_and_suggestions(cfg, p, limit ? limit : p->total, err);
    err->code = CT_ERR_RUNTIME;
    return CT_ERR_RUNTIME;
}

void ct_fit_oom_note(const ct_config *cfg, const ct_run_plan *p, size_t limit, char *out, size_t n) {
    char line[512], sug[1024], a[32], l[32];
    size_t budget = (size_t)((double)limit * CT_FIT_AUTO_MARGIN);
    if (budget >= p->total) budget = p->total - 1;   /* strictly less than what ran out */
    ct_fit_describe(p, line, sizeof line);
    ct_fit_suggest(cfg, p->device, budget, sug, sizeof sug);
    snprintf(out, n, "  planned: %s; the limit is %s: what the plan does not count (the CPU's fp32 copies of "
             "16-bit arguments, scratch) did not fit in the %s left. Choices that plan less:\n%s", line,
             fmt(limit, l), fmt(limit - p->total, a), sug);
}

size_t ct_fit_limit(const ct_config *cfg, size_t device_memory, const char **source) {
    size_t cap = cfg->train.memory_limit_gb > 0 ? (size_t)(cfg->train.memory_limit_gb * GIB) : 0;
    if (cap == 0 && cfg->train.memory_limit_gb > 0) cap = 1;
    *source = NULL;
    if (device_memory && (!cap || device_memory <= cap)) {
        *source = "--device-memory";
        return device_memory;
    }
    if (cap) *source = "train.memory_limit_gb";
    return cap;
}

/* ---- the --dry-run table ---- */

/* A row's checkpointing: segments as ct_fit_plan's, and whether its kept outputs are offloaded. */
typedef struct fit_mode {
    long segments;
    bool offload;
} fit_mode;

static void describe_segments(fit_mode m, long configured_segments, char *buf, size_t n) {
    const char *off = m.offload ? " + offload" : "";
    if (m.segments == CT_SEGMENTS_CONFIG) {
        if (configured_segments == 0) snprintf(buf, n, "as configured: off");
        else snprintf(buf, n, "as configured: %ld segment%s%s", configured_segments,
                      configured_segments == 1 ? "" : "s", off);
    } else if (m.segments == 0) {
        snprintf(buf, n, "off");
    } else {
        snprintf(buf, n, "every block (%ld segments)%s", m.segments, off);
    }
}

int ct_fit_table(const ct_config *cfg, bool device, size_t limit, void (*line)(void *ctx, const char *text),
                 void *ctx, ct_err *err) {
    long per_rank = per_rank_batch(cfg), micro = cfg->micro_batch;
    /* micro-batches: halving from the configured one to 1, doubling up to the per-rank batch,
     * those the batch rule allows (they divide the per-rank batch) */
    long micros[64];
    int nm = 0;
    for (long m = micro; m >= 1 && nm < 32; m /= 2)
        if (per_rank % m == 0) micros[nm++] = m;
    for (long m = micro * 2; m <= per_rank && nm < 64; m *= 2)
        if (per_rank % m == 0) micros[nm++] = m;
    /* ascending */
    for (int i = 1; i < nm; i++)
        for (int j = i; j > 0 && micros[j - 1] > micros[j]; j--) {
            long t = micros[j];
            micros[j] = micros[j - 1];
            micros[j - 1] = t;
        }
    ct_run_plan configured;
    int rc = ct_fit_plan(cfg, device, micro, CT_SEGMENTS_CONFIG, &configured, err);
    if (rc) return rc;
    long blocks = ct_fit_every_block(cfg, err);
    bool offload = cfg->pending.cpu_checkpointing;
    fit_mode modes[4];
    int n_modes = 0;
    modes[n_modes++] = (fit_mode){CT_SEGMENTS_CONFIG, offload};
    if (configured.act.segments > 0) modes[n_modes++] = (fit_mode){0, false};
    if (blocks > 0 && configured.act.segments != blocks) modes[n_modes++] = (fit_mode){blocks, offload};
    /* on a device, every block with its kept outputs in host memory (on the CPU backend host memory
     * is the training memory: nothing to gain); a config that offloads has that row above */
    if (device && blocks > 0 && !offload) modes[n_modes++] = (fit_mode){blocks, true};
    char text[256], seg[64], pk[32];
    snprintf(text, sizeof text, "  %6s %6s  %-36s %12s  %s", "micro", "accum", "checkpointing", "planned peak",
             limit ? "fits" : "");
    line(ctx, text);
    for (int k = 0; k < n_modes; k++)
        for (int i = 0; i < nm; i++) {
            ct_run_plan p;
            if ((rc = plan_offload(cfg, device, micros[i], modes[k].segments, modes[k].offload, &p, err))) return rc;
            describe_segments(modes[k], configured.act.segments, seg, sizeof seg);
            snprintf(text, sizeof text, "  %6ld %6ld  %-36s %12s  %s%s", micros[i], per_rank / micros[i], seg,
                     fmt(p.total, pk), limit ? (p.total <= limit ? "yes" : "no") : "",
                     modes[k].segments == CT_SEGMENTS_CONFIG && micros[i] == micro ? "   <- this config" : "");
            line(ctx, text);
        }
    if (blocks == 0 && configured.act.segments == 0)
        line(ctx, "  (the model has no blocks: no checkpointing rows; mark layers \"checkpoint\": true or set "
                  "activation_checkpointing.number_checkpoints to plan segments)");
    return CT_OK;
}

/* ---- the auto micro-batch ---- */

static void set_resolved(ct_config *cfg) {
    cJSON *r = cfg->resolved;
    if (!r) return;
    cJSON_ReplaceItemInObjectCaseSensitive(r, "train_micro_batch_size_per_gpu",
                                           cJSON_CreateNumber((double)cfg->micro_batch));
    cJSON_ReplaceItemInObjectCaseSensitive(r, "gradient_accumulation_steps",
                                           cJSON_CreateNumber((double)cfg->grad_accum));
}

int ct_fit_auto_micro_batch(ct_config *cfg, bool device, size_t device_memory, char *note, size_t note_n,
                            ct_err *err) {
    note[0] = '\0';
    if (!cfg->micro_batch_auto) return CT_OK;
    long per_rank = per_rank_batch(cfg);
    const char *source;
    size_t limit = ct_fit_limit(cfg, device_memory, &source);
    char a[32], l[32], bud[32];
    if (limit == 0) {
        snprintf(note, note_n, "micro-batch \"auto\": %ld, the batch rule's (train_batch_size %ld / world %d, "
                 "accumulation 1); no memory limit is known, so the plan did not choose (set "
                 "train.memory_limit_gb to pick the largest that fits)", cfg->micro_batch, cfg->train_batch_size,
                 cfg->world_size);
        return CT_OK;
    }
    size_t budget = (size_t)((double)limit * CT_FIT_AUTO_MARGIN);
    plan_ctx as_is = {cfg, device, CT_SEGMENTS_CONFIG};
    long m = ct_fit_largest_micro(per_rank, per_rank, budget, plan_peak, &as_is);
    if (m == 0) {
        char sug[1024];
        size_t one = plan_peak(&as_is, 1);
        ct_errf(err, CT_ERR_RUNTIME, "%s: train_micro_batch_size_per_gpu \"auto\": not even micro-batch 1 fits: its "
                "plan needs %s, over %.0f%% of %s (%s); nothing was trained", cfg->path,
                one == SIZE_MAX ? "?" : fmt(one, a), CT_FIT_AUTO_MARGIN * 100, fmt(limit, l), source);
        ct_fit_suggest(cfg, device, budget, sug, sizeof sug);
        ct_err_append(err, "%s", sug);
        return CT_ERR_RUNTIME;
    }
    cfg->micro_batch = m;
    cfg->grad_accum = per_rank / m;
    cfg->micro_batch_src = CT_SRC_AUTO;
    cfg->grad_accum_src = CT_SRC_DERIVED;
    set_resolved(cfg);
    snprintf(note, note_n, "micro-batch \"auto\": %ld × accumulation %ld, the largest micro-batch dividing %ld "
             "whose plan (%s) is within %.0f%% of %s (%s): %s", m, cfg->grad_accum, per_rank,
             fmt(plan_peak(&as_is, m), a), CT_FIT_AUTO_MARGIN * 100, fmt(limit, l), source, fmt(budget, bud));
    return CT_OK;
}

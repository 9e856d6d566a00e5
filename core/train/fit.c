/* fit.c: what fits in a memory budget (fit.h), from ct_run_plan_make over graphs built for each
 * choice. */
#include "core/train/fit.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim/amp.h"
#include "core/report/report.h"
#include "core/train/internal.h"

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
    if (!device || ct_zero_offload(cfg, device)) return;
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

/* ---- ZeRO stage and offload ---- */

static const struct {
    int stage;
    ct_fit_offload offload;
} zero_rows[CT_FIT_ZERO_ROWS] = {
    {0, CT_FIT_NO_OFFLOAD},   {1, CT_FIT_NO_OFFLOAD},         {1, CT_FIT_OFFLOAD_OPTIMIZER},
    {1, CT_FIT_OFFLOAD_NVME}, {2, CT_FIT_NO_OFFLOAD},         {2, CT_FIT_OFFLOAD_OPTIMIZER},
    {2, CT_FIT_OFFLOAD_NVME}, {3, CT_FIT_NO_OFFLOAD},         {3, CT_FIT_OFFLOAD_OPTIMIZER},
    {3, CT_FIT_OFFLOAD_BOTH}, {3, CT_FIT_OFFLOAD_NVME},       {3, CT_FIT_OFFLOAD_NVME_PARAMS},
};

ct_offload_device ct_fit_offload_optimizer(ct_fit_offload o) {
    return o == CT_FIT_NO_OFFLOAD ? CT_OFFLOAD_NONE : o >= CT_FIT_OFFLOAD_NVME ? CT_OFFLOAD_NVME : CT_OFFLOAD_CPU;
}

ct_offload_device ct_fit_offload_param(ct_fit_offload o) {
    return o == CT_FIT_OFFLOAD_BOTH || o == CT_FIT_OFFLOAD_NVME_PARAMS ? CT_OFFLOAD_CPU : CT_OFFLOAD_NONE;
}

/* The row's settings in c; an NVMe row keeps the config's swap settings (buffer_count, and
 * nvme_path, which a plan does not read). */
static void set_zero(ct_config *c, int stage, ct_fit_offload o) {
    c->zero.stage = stage;
    if (c->zero.overlap_comm_by_stage) c->zero.overlap_comm = stage == 3;   /* as the config reader sets it */
    c->zero.offload_optimizer.device = ct_fit_offload_optimizer(o);
    c->zero.offload_param.device = ct_fit_offload_param(o);
}

/* The row the config itself is; -1 when none is (offload_param "nvme", which a run refuses).
 * offload_param without offload_optimizer stays on the device: the row without it then. */
static int config_row(const ct_config *cfg) {
    const ct_zero_cfg *z = &cfg->zero;
    if (z->offload_param.device == CT_OFFLOAD_NVME) return -1;
    bool params = z->offload_param.device == CT_OFFLOAD_CPU && z->stage == 3;
    ct_fit_offload o = z->offload_optimizer.device == CT_OFFLOAD_NVME ? (params ? CT_FIT_OFFLOAD_NVME_PARAMS : CT_FIT_OFFLOAD_NVME)
                       : z->offload_optimizer.device == CT_OFFLOAD_CPU ? (params ? CT_FIT_OFFLOAD_BOTH : CT_FIT_OFFLOAD_OPTIMIZER)
                                                                       : CT_FIT_NO_OFFLOAD;
    int stage = z->stage >= 0 && z->stage <= 3 ? z->stage : 0;
    if (stage == 0) o = CT_FIT_NO_OFFLOAD;   /* offload needs a stage: the run does none */
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++)
        if (zero_rows[r].stage == stage && zero_rows[r].offload == o) return r;
    return -1;
}

/* The family's repeat layer in `model`: the one top-level layer of type "repeat"; NULL when there
 * is none or several (which one would grow is then a choice this rule does not make). */
static cJSON *family_repeat(const cJSON *model, int *index) {
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(model, "layers");
    cJSON *found = NULL, *l;
    int i = 0, n = 0;
    *index = -1;
    cJSON_ArrayForEach(l, layers) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(l, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "repeat") && n++ == 0) found = l, *index = i;
        i++;
    }
    if (n != 1) *index = -1;
    return n == 1 ? found : NULL;
}

/* Every row's plan on a device with the family's repeat at `blocks` (0: as configured), from one
 * graph (the graph does not depend on the ZeRO settings); params: the model's trainable elements. */
static int plan_rows(const ct_config *cfg, long blocks, ct_run_plan plans[CT_FIT_ZERO_ROWS], int64_t *params,
                     ct_err *err) {
    ct_config *c = ct_xmalloc(sizeof *c);
    *c = *cfg;
    cJSON *model = NULL;
    int index;
    if (blocks > 0) {
        model = cJSON_Duplicate(cfg->model, true);
        cJSON *rep = family_repeat(model, &index);
        if (rep) cJSON_ReplaceItemInObjectCaseSensitive(rep, "times", cJSON_CreateNumber((double)blocks));
        c->model = model;
    }
    ct_graph *g = NULL;
    int rc = ct_graph_build_with(c, c->micro_batch, ct_amp_compute_dtype(cfg), 0, CT_SEGMENTS_CONFIG, &g, err);
    if (!rc) {
        *params = ct_graph_info_get(g)->n_param_elems;
        for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) {
            set_zero(c, zero_rows[r].stage, zero_rows[r].offload);
            ct_run_plan_make(c, g, true, &plans[r]);
        }
    }
    ct_graph_free(g);
    cJSON_Delete(model);
    free(c);
    return rc;
}

/* The largest n with base + n × per <= cap (per > 0), as a double; HUGE_VAL when per is 0 or the
 * cap is not known (0): that memory sets no bound. */
static double blocks_within(double cap, double base, double per) {
    if (cap <= 0 || per <= 0) return HUGE_VAL;
    return floor((cap - base) / per);
}

/* The family's largest repeat count for one row, from its plans at n and n + 1 blocks. */
static void largest_model(ct_fit_zero_row *row, ct_fit_memory mem, int world, long n, const ct_run_plan *at_n,
                          const ct_run_plan *at_n1, int64_t params_n, int64_t params_n1) {
    double dd = (double)at_n1->total - (double)at_n->total, dh = (double)at_n1->host_total - (double)at_n->host_total;
    double host_cap = (double)mem.host / (world > 0 ? world : 1);
    double by_dev = blocks_within((double)mem.device, (double)at_n->total - (double)n * dd, dd);
    double by_host = blocks_within(mem.host ? host_cap : 0, (double)at_n->host_total - (double)n * dh, dh);
    double best = by_dev < by_host ? by_dev : by_host;
    row->bound = by_dev <= by_host ? "device" : "host";
    if (best >= CT_GRAPH_REPEAT_MAX) best = CT_GRAPH_REPEAT_MAX, row->bound = "repeat";   /* its own limit */
    row->max_blocks = best < 1 ? 0 : (long)best;
    row->max_params = params_n + (int64_t)(row->max_blocks - n) * (params_n1 - params_n);
}

int ct_fit_zero_rows(const ct_config *cfg, ct_fit_memory mem, ct_fit_zero_row rows[CT_FIT_ZERO_ROWS],
                     ct_fit_family *family, ct_err *err) {
    ct_run_plan plans[3][CT_FIT_ZERO_ROWS];
    int64_t params[3] = {0};
    int rc = plan_rows(cfg, 0, plans[0], &params[0], err);
    if (rc) return rc;
    *family = (ct_fit_family){0};
    cJSON *rep = family_repeat(cfg->model, &family->layer);
    const cJSON *times = rep ? cJSON_GetObjectItemCaseSensitive(rep, "times") : NULL;
    family->blocks = cJSON_IsNumber(times) ? (long)times->valuedouble : 0;
    if (family->blocks < 1) family->layer = -1;
    /* the plans at n + 1 and n + 2: an error there (a curriculum, a shape the count breaks) only
     * leaves the largest-model column unknown */
    ct_err quiet = {0};
    if (family->layer >= 0 && (plan_rows(cfg, family->blocks + 1, plans[1], &params[1], &quiet) ||
                               plan_rows(cfg, family->blocks + 2, plans[2], &params[2], &quiet)))
        family->layer = -1;
    family->affine = family->layer >= 0;
    ct_config *c = ct_xmalloc(sizeof *c);
    *c = *cfg;
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) {
        ct_fit_zero_row *row = &rows[r];
        *row = (ct_fit_zero_row){.stage = zero_rows[r].stage, .offload = zero_rows[r].offload, .max_blocks = -1};
        set_zero(c, row->stage, row->offload);
        row->runs_stage = ct_zero_stage(c, true);
        ct_err why = {0};
        if (ct_train_check_supported(c, true, &why)) {
            size_t cut = strcspn(why.msg, ":");   /* "optimizer Lamb with ...: the reason" */
            snprintf(row->refused, sizeof row->refused, "%.*s", (int)(cut < 150 ? cut : 150), why.msg);
        }
        const ct_run_plan *p = &plans[0][r];
        row->device = p->total;
        row->host = p->host_total;
        row->disk = p->nvme ? p->swap_disk : 0;
        row->fits = !mem.device ? -1
                    : !row->refused[0] && p->total <= mem.device &&
                      (!mem.host || (double)p->host_total * (cfg->world_size > 0 ? cfg->world_size : 1) <= (double)mem.host);
        if (family->layer < 0) continue;
        const ct_run_plan *p1 = &plans[1][r], *p2 = &plans[2][r];
        row->estimate = p2->total - p1->total != p1->total - p->total ||
                        p2->host_total - p1->host_total != p1->host_total - p->host_total;
        if (row->estimate) family->affine = false;
        if (mem.device && !row->refused[0])
            largest_model(row, mem, cfg->world_size, family->blocks, p, p1, params[0], params[1]);
    }
    free(c);
    return CT_OK;
}

int ct_fit_zero_cheapest(const ct_fit_zero_row rows[CT_FIT_ZERO_ROWS]) {
    int best = -1;
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++)
        if (rows[r].fits == 1 && (best < 0 || rows[r].offload < rows[best].offload ||
                                  (rows[r].offload == rows[best].offload && rows[r].stage < rows[best].stage)))
            best = r;
    return best;
}

static const char *offload_name(ct_fit_offload o) {
    static const char *const names[] = {[CT_FIT_NO_OFFLOAD] = "none", [CT_FIT_OFFLOAD_OPTIMIZER] = "optimizer",
                                        [CT_FIT_OFFLOAD_BOTH] = "optimizer + params", [CT_FIT_OFFLOAD_NVME] = "nvme",
                                        [CT_FIT_OFFLOAD_NVME_PARAMS] = "nvme + params"};
    return names[o];
}

/* The largest-model cell: "187 blocks, 1.4 G params (device)", "none: 1 block is too big", "-". */
static void describe_largest(const ct_fit_zero_row *row, char *buf, size_t n) {
    char p[32];
    if (row->max_blocks < 0) snprintf(buf, n, "-");
    else if (row->max_blocks == 0) snprintf(buf, n, "not even 1 block (%s)", row->bound);
    else snprintf(buf, n, "%s%ld block%s, %s params (%s%s)", row->estimate ? "~" : "", row->max_blocks,
                  row->max_blocks == 1 ? "" : "s",
                  ct_fmt_count((double)row->max_params, p, sizeof p), row->bound,
                  strcmp(row->bound, "repeat") ? "" : "'s limit: more would fit");
}

int ct_fit_zero_table(const ct_config *cfg, ct_fit_memory mem, void (*line)(void *ctx, const char *text), void *ctx,
                      ct_err *err) {
    ct_fit_zero_row rows[CT_FIT_ZERO_ROWS];
    ct_fit_family fam;
    int rc = ct_fit_zero_rows(cfg, mem, rows, &fam, err);
    if (rc) return rc;
    int own = config_row(cfg), cheapest = ct_fit_zero_cheapest(rows);
    char text[512], runs[32], dev[32], host[32], big[96];
    snprintf(text, sizeof text, "  %5s  %-18s %-8s %12s %12s  %-4s  %s", "stage", "offload", "runs as", "device",
             "host", mem.device ? "fits" : "", mem.device && fam.layer >= 0 ?
             "largest model that fits" : "");
    line(ctx, text);
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) {
        const ct_fit_zero_row *row = &rows[r];
        snprintf(runs, sizeof runs, "stage %d", row->runs_stage);
        describe_largest(row, big, sizeof big);
        const char *fits = row->refused[0] ? "no" : row->fits == 1 ? "yes" : row->fits == 0 ? "no" : "";
        int w = snprintf(text, sizeof text, "  %5d  %-18s %-8s %12s %12s  %-4s  %s", row->stage,
                         offload_name(row->offload), runs, fmt(row->device, dev), fmt(row->host, host), fits,
                         row->refused[0] ? row->refused : mem.device && fam.layer >= 0 ? big : "");
        if (r == own || r == cheapest)
            snprintf(text + w, sizeof text - (size_t)w, "   <- %s%s%s", r == own ? "this config" : "",
                     r == own && r == cheapest ? ", " : "", r == cheapest ? "cheapest that fits" : "");
        line(ctx, text);
    }
    if (cfg->world_size <= 1)
        line(ctx, "  (one process: stages 1-3 without offload have nothing to partition and train as stage 0; "
                  "with optimizer offload they take stage 2's gradient path, with parameter offload stage 3's)");
    int64_t disk = 0;
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) disk = rows[r].disk > disk ? rows[r].disk : disk;
    if (disk > 0) {
        char d[32];
        snprintf(text, sizeof text, "  (nvme: offload_optimizer \"nvme\", the fp32 master and optimizer state in swap "
                 "files of up to %s per rank under nvme_path, in neither column and not held against a disk here (a "
                 "run checks the free space at start); host: their buffers and the gradients; + params: "
                 "offload_param \"cpu\" beside it)", fmt((size_t)disk, d));
        line(ctx, text);
    }
    if (!mem.device) {
        line(ctx, "  (the device's memory is not known: --device-memory SIZE says what fits)");
        return CT_OK;
    }
    if (fam.layer < 0) {
        line(ctx, "  (largest model: the rule grows the model's one top-level \"repeat\"; this model has none, or "
                  "several)");
        return CT_OK;
    }
    snprintf(text, sizeof text, "  largest model: model.layers.%d's \"times\" (%ld here) grown at this width, "
             "micro-batch and checkpointing until the plan passes the device or the host memory; each block adds "
             "the same bytes%s", fam.layer, fam.blocks,
             fam.affine ? " (the plans at n, n + 1 and n + 2 blocks agree)"
                        : "; ~: the row's plans at n, n + 1 and n + 2 blocks do not grow evenly (a swap's buffers "
                          "growing with a small model): an estimate from n to n + 1");
    line(ctx, text);
    return CT_OK;
}

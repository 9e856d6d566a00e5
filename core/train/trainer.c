/* train.c: setting up a run (backend, datasets, graph, flat buffers), the plan printout, and
 * ct_train_run. The loop itself is in train_loop.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/train/internal.h"

/* ---- data options ---- */

/* Both datasets are opened on threads of their own (reading them is mostly decompression, the
 * longest part of start-up) while the main thread creates the backend, builds the graph and
 * initialises the parameters. */
typedef struct open_job {
    const ct_config *cfg;
    const char *which;
    ct_dataset *ds;
    ct_err err;
    int rc;
    pthread_t th;
    bool threaded;
} open_job;

static void *open_one(void *arg) {
    open_job *j = arg;
    j->rc = ct_dataset_open(j->cfg, j->which, &j->ds, &j->err);
    return NULL;
}

static void open_start(open_job *j, const ct_config *cfg, const char *which) {
    *j = (open_job){.cfg = cfg, .which = which};
    j->threaded = pthread_create(&j->th, NULL, open_one, j) == 0;
    if (!j->threaded) open_one(j);
}

/* Wait for both; the trainer owns whatever opened, so close() frees it on any error. err may be
 * NULL when an earlier error is already being reported. */
static int open_finish(ct_trainer *t, open_job jobs[2], ct_err *err) {
    for (int i = 0; i < 2; i++)
        if (jobs[i].threaded) pthread_join(jobs[i].th, NULL);
    t->train_ds = jobs[0].ds;
    t->eval_ds = jobs[1].ds;
    for (int i = 0; i < 2; i++)
        if (jobs[i].rc) {
            if (err) *err = jobs[i].err;
            return jobs[i].rc;
        }
    if (!t->train_ds)
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.train: missing (expected {\"format\": \"idx\", "
                       "\"images\": ..., \"labels\": ...})", t->cfg->path);
    return CT_OK;
}

/* The dataset must produce what the model consumes. */
static int check_dataset(const ct_trainer *t, const ct_dataset *ds, const char *which, ct_err *err) {
    const ct_graph_info *gi = t->info;
    char a[96], b[96];
    if (ds->sample_dtype != gi->input_dtype ||
        ct_shape_numel(&ds->sample_shape) != ct_shape_numel(&gi->input_shape))
        return ct_errf(err, CT_ERR_CONFIG,
                       "data.%s (%s): samples are %s %s (%lld values) but model.input is %s %s "
                       "(%lld values)", which, ds->source, ct_dtype_name(ds->sample_dtype),
                       ct_shape_str(&ds->sample_shape, a, sizeof a),
                       (long long)ct_shape_numel(&ds->sample_shape), ct_dtype_name(gi->input_dtype),
                       ct_shape_str(&gi->input_shape, b, sizeof b),
                       (long long)ct_shape_numel(&gi->input_shape));
    if (ds->target_dtype != gi->target_dtype ||
        ct_shape_numel(&ds->target_shape) != ct_shape_numel(&gi->target_shape))
        return ct_errf(err, CT_ERR_CONFIG,
                       "data.%s (%s): targets are %s %s but the loss needs %s %s", which, ds->source,
                       ct_dtype_name(ds->target_dtype), ct_shape_str(&ds->target_shape, a, sizeof a),
                       ct_dtype_name(gi->target_dtype), ct_shape_str(&gi->target_shape, b, sizeof b));
    if (gi->classes > 0 && ds->classes > gi->classes)
        return ct_errf(err, CT_ERR_DATA,
                       "data.%s (%s): labels go up to %lld but the model has %lld classes "
                       "(its last layer's output)", which, ds->source, (long long)ds->classes - 1,
                       (long long)gi->classes);
    return CT_OK;
}

/* Features this version does not have yet: refuse them rather than train something else. */
static int check_supported(const ct_config *cfg, ct_err *err) {
    if (cfg->world_size > 1)
        return ct_errf(err, CT_ERR_CONFIG, "world size %d: data-parallel training is not implemented "
                       "yet in this version; run one process", cfg->world_size);
    return CT_OK;
}

/* Called once the train loader knows the epoch (the loader rejects an epoch with no full step). */
static void plan_steps(ct_trainer *t) {
    const ct_config *cfg = t->cfg;
    int64_t gb = cfg->train_batch_size;
    int64_t micro_per_epoch = ct_loader_batches_per_epoch(t->train_l);
    t->epoch_samples = micro_per_epoch * cfg->micro_batch < t->train_ds->count
                           ? micro_per_epoch * cfg->micro_batch : t->train_ds->count;
    t->steps_per_epoch = (t->epoch_samples + gb - 1) / gb;
    /* max_steps, when set, decides the length (as in Hugging Face's Trainer); else epochs. */
    t->total_steps = cfg->train.max_steps > 0 ? cfg->train.max_steps
                                              : (long)cfg->train.epochs * t->steps_per_epoch;
    t->epochs_planned = (int)((t->total_steps + t->steps_per_epoch - 1) / t->steps_per_epoch);
}

/* ---- the start block and the plan ---- */

static const char *precision_name(ct_dtype dt) {
    return dt == CT_F16 ? "fp16" : dt == CT_BF16 ? "bf16" : "fp32";
}

static void print_start(ct_trainer *t) {
    const ct_config *cfg = t->cfg;
    const ct_graph_info *gi = t->info;
    ct_report *r = &t->rep;
    char a[48], b[48], c[48], d[48], e[48], desc[512];
    ct_report_line(r, "ctrain %s · %s (%s) · %s · %d rank%s", CT_VERSION, t->be->name,
                   t->be->device_desc, precision_name(ct_amp_compute_dtype(cfg)),
                   cfg->world_size, cfg->world_size == 1 ? "" : "s");
    ct_graph_describe(t->g, desc, sizeof desc);
    ct_report_line(r, "model  %s: %s params, %s", cfg->name, ct_fmt_count((double)gi->n_params, a, sizeof a),
                   desc);
    ct_report_line(r, "batch  %ld = micro %ld × accumulation %ld × world %d · %ld steps/epoch · %ld steps%s",
                   cfg->train_batch_size, cfg->micro_batch, cfg->grad_accum, cfg->world_size,
                   t->steps_per_epoch, t->total_steps, cfg->train.max_steps > 0 ? " (max_steps)" : "");
    size_t pbytes = ct_optim_param_bytes(t->opt) + (size_t)gi->n_buffers * sizeof(float);
    ct_dtype dt = ct_graph_compute_dtype(t->g);
    char copy[80] = "";
    if (dt != CT_F32)
        snprintf(copy, sizeof copy, " + %s %s copy",
                 ct_fmt_bytes((double)ct_amp_param_copy_bytes(dt, gi->n_params), e, sizeof e),
                 precision_name(dt));
    ct_report_line(r, "memory plan: params %s%s, grads %s, optimizer state %s, activations %s (%s)",
                   ct_fmt_bytes((double)pbytes, a, sizeof a), copy,
                   ct_fmt_bytes((double)ct_optim_param_bytes(t->opt), b, sizeof b),
                   ct_fmt_bytes((double)ct_optim_state_bytes(t->opt), c, sizeof c),
                   ct_fmt_bytes((double)(gi->activation_bytes + gi->workspace_bytes), d, sizeof d),
                   precision_name(dt));
    char ev[160] = "no eval set";
    if (t->eval_ds) snprintf(ev, sizeof ev, "%lld eval samples", (long long)t->eval_ds->count);
    ct_report_line(r, "data   %s: %lld train samples (%s), %s · shuffle %s", t->train_ds->format,
                   (long long)t->train_ds->count, t->train_ds->source, ev, t->shuffle ? "on" : "off");
}

/* ---- open / close ---- */

void ct_trainer_set_status(ct_trainer *t, const char *status, const ct_err *err) {
    snprintf(t->sum->status, sizeof t->sum->status, "%s", status);
    if (!err) return;
    const char *nl = strchr(err->msg, '\n');
    size_t len = nl ? (size_t)(nl - err->msg) : strlen(err->msg);
    if (len >= sizeof t->sum->error) len = sizeof t->sum->error - 1;
    memcpy(t->sum->error, err->msg, len);
    t->sum->error[len] = '\0';
}

/* memory_breakdown: one line with the peak of every category. */
static void report_memory(ct_trainer *t, const ct_mem_stats *m) {
    char line[512];
    size_t used = (size_t)snprintf(line, sizeof line, "peak %s memory (MiB):",
                                   strcmp(t->be->name, "cpu") == 0 ? "host" : "device");
    for (int c = 0; c < CT_MEM_CAT_COUNT && used < sizeof line; c++)
        used += (size_t)snprintf(line + used, sizeof line - used, " %s %.1f", ct_mem_cat_name((ct_mem_cat)c),
                                 (double)m->peak[c] / 1048576.0);
    if (used < sizeof line)
        snprintf(line + used, sizeof line - used, "; all %.1f", (double)m->peak_total / 1048576.0);
    ct_report_line(&t->rep, "%s", line);
}

void ct_trainer_finish(ct_trainer *t) {
    ct_summary *s = t->sum;
    s->wall_s = ct_now() - t->t_open;
    s->peak_host_bytes = ct_peak_rss_bytes();
    if (t->be && t->be->mem.peak_bytes) s->peak_device_bytes = t->be->mem.peak_bytes(t->be);
    if (t->be && t->be->mem.mem_stats) {
        ct_mem_stats m;
        t->be->mem.mem_stats(t->be, &m);
        memcpy(s->peak_by_cat, m.peak, sizeof s->peak_by_cat);
        s->has_mem_stats = true;
        if (t->cfg->memory_breakdown) report_memory(t, &m);
    }
}

/* Parameters, gradients, optimizer state and buffers, initialised from the seed. */
static int alloc_params(ct_trainer *t, ct_err *err) {
    t->info = ct_graph_info_get(t->g);
    t->opt = ct_optim_create_for_graph(t->cfg, t->be, t->g);
    size_t nb = (size_t)(t->info->n_buffers ? t->info->n_buffers : 1) * sizeof(float);
    t->buffers = t->be->mem.alloc(t->be, nb, CT_MEM_MASTER);
    t->amp = ct_amp_create(t->cfg, t->be, t->info->n_params);
    if (!t->opt || !t->buffers || !t->amp)
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %s parameters and optimizer state",
                       t->be->name);
    t->be->mem.memset0(t->be, t->buffers, nb);
    ct_graph_init_params(t->g, t->opt->params, t->buffers, t->cfg->train.seed);
    /* the fused update writes the 16-bit parameters forward reads (core/amp.h) */
    if (t->amp->half) ct_optim_set_copy(t->opt, t->amp->half, t->amp->compute);
    return CT_OK;
}

/* Capture and replay of micro-batches (train.cuda_graph). */
static int start_step_runner(ct_trainer *t, ct_err *err) {
    char notice[256];
    int rc = ct_step_runner_init(&t->runner, t->be, t->g, t->cfg->train.cuda_graph, notice,
                                 sizeof notice, err);
    if (!rc && notice[0]) ct_warnf(&t->warn, "%s", notice);
    return rc;
}

/* A loader for one dataset; train: shuffled (data.shuffle), drop_last, augmented. */
static int start_loader(ct_trainer *t, const ct_dataset *ds, bool train, ct_loader **out, ct_err *err) {
    ct_loader_opts o;
    int rc = ct_loader_opts_from_config(t->cfg, ds, train, t->info->classes, &o, err);
    o.device_dtype = ct_graph_compute_dtype(t->g);   /* data.transform.on_device writes this */
    if (!rc) rc = ct_loader_init(out, t->be, ds, &o, &t->warn, err);
    if (!rc && train) t->shuffle = o.shuffle;
    return rc;
}

/* Early stopping and best/ act on eval metrics: say so at start instead of never acting. */
static int check_eval_metrics(const ct_trainer *t, ct_err *err) {
    const ct_train_cfg *tc = &t->cfg->train;
    const char *es = tc->early_stopping.enabled ? tc->early_stopping.metric : NULL;
    if (es && strncmp(es, "eval_", 5) == 0 && !t->eval_ds)
        return ct_errf(err, CT_ERR_CONFIG, "%s: train.early_stopping.metric is %s but data.eval is not "
                       "set; add an eval set or use \"metric\": \"train_loss\"", t->cfg->path, es);
    const char *acc_user = es && strcmp(es, "eval_accuracy") == 0 ? "train.early_stopping.metric"
                           : strcmp(tc->best_metric, "eval_accuracy") == 0 ? "train.best_metric" : NULL;
    if (acc_user && t->info->classes == 0)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s is eval_accuracy but the model's loss is not a "
                       "classification loss (no accuracy); use eval_loss", t->cfg->path, acc_user);
    return CT_OK;
}

static int setup_data(ct_trainer *t, ct_err *err) {
    int rc = check_eval_metrics(t, err);
    if (!rc) rc = check_dataset(t, t->train_ds, "train", err);
    if (!rc && t->eval_ds) rc = check_dataset(t, t->eval_ds, "eval", err);
    if (!rc) rc = start_loader(t, t->train_ds, true, &t->train_l, err);
    if (!rc && t->eval_ds) rc = start_loader(t, t->eval_ds, false, &t->eval_l, err);
    if (!rc) plan_steps(t);
    return rc;
}

static int setup(ct_trainer *t, ct_err *err) {
    const ct_config *cfg = t->cfg;
    int rc = check_supported(cfg, err);
    if (rc) return rc;
    open_job jobs[2];
    open_start(&jobs[0], cfg, "train");
    open_start(&jobs[1], cfg, "eval");
    rc = ct_backend_create(cfg->train.device, cfg->train.threads, &t->be, err);
    if (!rc) rc = ct_graph_build(cfg, cfg->micro_batch, t->be, ct_amp_compute_dtype(cfg), &t->g, err);
    if (!rc) rc = alloc_params(t, err);
    if (!rc) rc = start_step_runner(t, err);
    int data_rc = open_finish(t, jobs, rc ? NULL : err);
    if (rc) return rc;
    return data_rc ? data_rc : setup_data(t, err);
}

/* with_ckpt: also run the checkpoint step (resume, init_from, run_dir/config.json). */
static int trainer_open(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                        bool with_ckpt, ct_trainer **out, ct_err *err) {
    ct_trainer *t = ct_xcalloc(1, sizeof *t);
    t->t_open = ct_now();
    t->cfg = cfg;
    if (opts) t->opts = *opts;
    t->sum = summary;
    ct_summary_init(summary);
    snprintf(summary->run_dir, sizeof summary->run_dir, "%s", cfg->train.run_dir);
    ct_report_init(&t->rep, stderr, t->opts.quiet, cfg->steps_per_print);
    *out = t;
    int rc = setup(t, err);
    for (int i = 0; i < t->warn.n; i++) fprintf(stderr, "ctrain: warning: %s\n", t->warn.items[i]);
    if (!rc) print_start(t);
    if (!rc && with_ckpt) rc = ct_trainer_ckpt_start(t, err);
    if (rc) {
        ct_trainer_set_status(t, "error", err);
        return rc;
    }
    return CT_OK;
}

int ct_trainer_open(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                    ct_trainer **out, ct_err *err) {
    return trainer_open(cfg, opts, summary, true, out, err);
}

int ct_trainer_open_bare(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                         ct_trainer **out, ct_err *err) {
    return trainer_open(cfg, opts, summary, false, out, err);
}

void ct_trainer_close(ct_trainer *t) {
    if (!t) return;
    ct_loader_free(t->train_l);
    ct_loader_free(t->eval_l);
    ct_warnings_free(&t->warn);
    ct_trainer_ckpt_close(t);
    if (t->be) ct_step_runner_reset(&t->runner);
    if (t->buffers) t->be->mem.free(t->be, t->buffers);
    ct_optim_free(t->opt);
    ct_amp_free(t->amp);
    ct_graph_free(t->g);
    ct_dataset_close(t->train_ds);
    ct_dataset_close(t->eval_ds);
    if (t->be) ct_backend_destroy(t->be);
    free(t);
}

struct ct_optim *ct_trainer_optim(ct_trainer *t) { return t->opt; }
const struct ct_graph *ct_trainer_graph(const ct_trainer *t) { return t->g; }
ct_backend *ct_trainer_backend(ct_trainer *t) { return t->be; }

void ct_trainer_on_step(ct_trainer *t, void (*fn)(void *ctx, long step, double loss), void *ctx) {
    t->on_step = fn;
    t->on_step_ctx = ctx;
}

int ct_train_run(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary, ct_err *err) {
    ct_trainer *t = NULL;
    int rc = ct_trainer_open(cfg, opts, summary, &t, err);
    if (!rc && !(opts && opts->dry_run)) {
        rc = ct_trainer_fit(t, err); /* fills the rest of the summary */
    } else {
        if (!rc) {
            ct_trainer_set_status(t, "ok", NULL);
            ct_report_line(&t->rep, "dry run: configuration, model and data are valid; nothing trained");
        }
        ct_trainer_finish(t);
    }
    ct_trainer_close(t);
    return rc;
}

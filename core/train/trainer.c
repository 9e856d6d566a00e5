/* trainer.c: setting up a run (backend, datasets, graph, parameter store, optimizer), the start
 * block with the memory plan, --dry-run, and ct_train_run. The loop itself is in loop.c. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/device/device.h"
#include "core/dist/agree.h"
#include "core/optim/sched.h"
#include "core/train/fit.h"
#include "core/train/generate.h"
#include "core/train/internal.h"
#include "core/train/nvme.h"
#include "core/util/fs.h"
#include "core/util/json.h"
#include "core/util/limits.h"

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
    t->d.train_ds = jobs[0].ds;
    t->d.eval_ds = jobs[1].ds;
    for (int i = 0; i < 2; i++)
        if (jobs[i].rc) {
            if (err) *err = jobs[i].err;
            return jobs[i].rc;
        }
    if (!t->d.train_ds)
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.train: missing (expected {\"format\": \"idx\", "
                       "\"images\": ..., \"labels\": ...})", t->cfg->path);
    return CT_OK;
}

/* The dataset must produce what the model consumes. */
static int check_dataset(const ct_trainer *t, const ct_dataset *ds, const char *which, ct_err *err) {
    const ct_graph_info *gi = t->m.info;
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
    int rc;
    if (ds->target_dtype != gi->target_dtype ||
        ct_shape_numel(&ds->target_shape) != ct_shape_numel(&gi->target_shape))
        rc = ct_errf(err, CT_ERR_CONFIG,
                     "data.%s (%s): targets are %s %s but the loss needs %s %s", which, ds->source,
                     ct_dtype_name(ds->target_dtype), ct_shape_str(&ds->target_shape, a, sizeof a),
                     ct_dtype_name(gi->target_dtype), ct_shape_str(&gi->target_shape, b, sizeof b));
    else if (gi->classes > 0 && ds->classes > gi->classes && ds->classes_key)   /* the config set them */
        return ct_errf(err, CT_ERR_CONFIG, "data.%s.%s: %lld (%s), but the model has %lld classes (0..%lld, its last "
                       "layer's output): set data.%s.%s to the vocabulary %s was tokenized with, at most %lld",
                       which, ds->classes_key, (long long)ds->classes, ds->label_note, (long long)gi->classes,
                       (long long)gi->classes - 1, which, ds->classes_key, ds->source, (long long)gi->classes);
    else if (gi->classes > 0 && ds->classes > gi->classes && ds->label_note[0])   /* the file and record too */
        return ct_errf(err, CT_ERR_DATA, "data.%s (%s): labels go up to %lld (%s), but the model has %lld classes "
                       "(0..%lld, its last layer's output)", which, ds->source, (long long)ds->classes - 1,
                       ds->label_note, (long long)gi->classes, (long long)gi->classes - 1);
    else if (gi->classes > 0 && ds->classes > gi->classes)
        rc = ct_errf(err, CT_ERR_DATA,
                     "data.%s (%s): labels go up to %lld but the model has %lld classes "
                     "(its last layer's output)", which, ds->source, (long long)ds->classes - 1,
                     (long long)gi->classes);
    else
        return CT_OK;
    if (ds->label_note[0]) ct_err_append(err, "%s", ds->label_note); /* which file and record */
    return rc;
}

/* Whether the run trains on a device where offload_optimizer acts: a GPU or the capped device, and
 * a run that trains (one that only evaluates has no optimizer to offload). */
static bool offload_device(const ct_trainer *t) { return !t->opts.forward_only && ct_backend_separate_memory(t->be); }
/* A run that only evaluates offloads nothing (NVMe offload acts on the CPU backend too). */
static int zero_stage(const ct_trainer *t) {
    return t->opts.forward_only ? ct_zero_partition_stage(t->cfg) : ct_zero_stage(t->cfg, offload_device(t));
}
static bool offloads(const ct_trainer *t) { return !t->opts.forward_only && ct_zero_offload(t->cfg, offload_device(t)); }

/* Features this version does not have yet: refuse them rather than train something else. A world
 * of several ranks is checked where the communicator opens (ct_comm_open: mpirun, the CPU).
 * device: the run trains on a device (a GPU, the capped device), where offload_optimizer acts. */
int ct_train_check_supported(const ct_config *cfg, bool device, ct_err *err) {
    int stage = ct_zero_stage(cfg, device);
    if (stage == 3 && cfg->train.sample_every > 0)
        return ct_errf(err, CT_ERR_CONFIG, "%s: train.sample_every with zero_optimization.stage 3 over %d "
                       "ranks: the sampler reads whole parameters, which stage 3 partitions; remove "
                       "train.sample_every or use stage 2", cfg->path, cfg->world_size);
    if (ct_zero_offload(cfg, device) && cfg->optimizer.type == CT_OPT_LAMB)
        return ct_errf(err, CT_ERR_CONFIG, "optimizer Lamb with zero_optimization.offload_optimizer: the offloaded "
                       "step goes up a chunk of the master at a time, and Lamb's trust ratio needs whole tensors; "
                       "use Adam or AdamW (DeepSpeed's CPU offload steps Adam too), or no offload");
    if (stage > 0 && cfg->optimizer.type == CT_OPT_LAMB)
        return ct_errf(err, CT_ERR_CONFIG, "optimizer Lamb with zero_optimization.stage %d over %d ranks: "
                       "Lamb's trust ratio needs whole tensors, and the ranks' parts cut them; use stage 0",
                       cfg->zero.stage, cfg->world_size);
    return CT_OK;
}

/* Offload where there is nothing to move (the CPU backend's memory is host memory, and its
 * optimizer step runs on the CPU already), and parameter offload without optimizer offload, which
 * is not done: warnings. */
static void warn_offload(ct_trainer *t, bool device) {
    const ct_config *cfg = t->cfg;
    const ct_zero_cfg *z = &cfg->zero;
    if (!device && z->offload_optimizer.device == CT_OFFLOAD_CPU)
        ct_warnf(&t->obs.warn, "zero_optimization.offload_optimizer.device cpu: the fp32 master, gradients and optimizer "
                 "state go to host memory, and on the CPU backend that is host memory already: nothing moves, and "
                 "training is the same with or without it%s (on a GPU, or the capped device of CTRAIN_CAPPED_DEVICE, "
                 "they move)", cfg->world_size > 1 ? "" : "; one process has nothing to partition and trains as stage 0");
    if (!device && z->offload_param.device == CT_OFFLOAD_CPU)
        ct_warnf(&t->obs.warn, "zero_optimization.offload_param.device cpu: the parameters go to host memory, and on the "
                 "CPU backend that is host memory already: nothing moves, and training is the same with or without it");
    else if (device && z->offload_param.device == CT_OFFLOAD_CPU && !ct_zero_offload_params(cfg, device))
        ct_warnf(&t->obs.warn, "zero_optimization.offload_param.device cpu: accepted, not used yet without "
                 "offload_optimizer: the parameters stay on the device (add \"offload_optimizer\": {\"device\": "
                 "\"cpu\"}: the optimizer step then writes them in host memory, and they go up layer by layer)");
}

/* The communicator of this run: the launcher's ranks, or rank 0 of cfg->world_size (a library
 * caller, --world-size), which ct_comm_open refuses past one process. */
static int open_comm(ct_trainer *t, ct_err *err) {
    ct_launch launch;
    const ct_launch *l = &launch;
    if (t->opts.launch && t->opts.launch->world == t->cfg->world_size) launch = *t->opts.launch;
    else ct_launch_given(&launch, t->cfg->world_size);
    launch.stop_signal = t->opts.stop_signal;   /* a rank stuck in a wait still ends on a stop signal */
    return ct_comm_open(t->be, l, &t->comm, err);
}

/* The ranks' data as an item of the ranks' check: files, bytes and sampled content of its
 * fingerprint, not the modification times (each host's copy of the same files is the same data).
 * The fingerprint is left in fp (CT_DATASET_FINGERPRINT bytes), where a checkpoint takes it from
 * instead of reading the files' heads again. */
static int add_data_item(ct_agree_list *l, const char *which, const ct_dataset *ds, char *fp, ct_err *err) {
    char key[64], value[CT_DATASET_FINGERPRINT];
    int rc = ct_dataset_fingerprint(ds, fp, err);
    if (rc) return rc;
    long long files = 0;
    unsigned long long bytes = 0;
    char content[17];
    if (sscanf(fp, "v1 files=%lld bytes=%llu content=%16[0-9a-f]", &files, &bytes, content) == 3)
        snprintf(value, sizeof value, "%lld file%s, %llu bytes, content %s", files, files == 1 ? "" : "s", bytes,
                 content);
    else
        snprintf(value, sizeof value, "%s", fp);
    snprintf(key, sizeof key, "data.%s (its files)", which);
    ct_agree_add(l, key, value);
    return CT_OK;
}

/* Ranks started with different configs or data would fail inside a collective (another ZeRO stage,
 * another width) or silently average different runs (another lr, seed, data limit). Before the
 * first collective that depends on them, every rank compares its resolved config and its data's
 * fingerprints with rank 0's, and all stop with CT_ERR_CONFIG naming the ranks and the first key
 * that differs (core/dist/agree.h). Left out: where a rank's outputs go (without train.run_dir the
 * ranks above 0 make no run directory and take rank 0's save_dir: share_save_dir). */
static int check_ranks_agree(ct_trainer *t, ct_err *err) {
    if (t->comm->world <= 1) return CT_OK;
    static const char *const per_rank[] = {"train.run_dir", "train.save_dir"};
    ct_agree_list l = {0};
    ct_agree_add_json(&l, t->cfg->resolved, per_rank, CT_ARRAY_LEN(per_rank));
    int rc = add_data_item(&l, "train", t->d.train_ds, t->ck.train_data, err);
    if (!rc && t->d.eval_ds) rc = add_data_item(&l, "eval", t->d.eval_ds, t->ck.eval_data, err);
    if (!rc) rc = ct_comm_agree(t->comm, &l, err);
    ct_agree_free(&l);
    return rc;
}

/* Every rank's checkpoints go where rank 0's do: its train.save_dir, sent to the others (which,
 * without train.run_dir, made no run directory of their own). Collective. */
static int share_save_dir(ct_trainer *t, ct_err *err) {
    if (t->comm->world <= 1) return CT_OK;
    char *dir = NULL;
    const char *mine = t->ck.save_dir;
    int rc = ct_agree_send_text(t->comm, 0, mine, strlen(mine) + 1, &dir, err);
    if (!rc && t->comm->rank != 0) snprintf(t->ck.save_dir, sizeof t->ck.save_dir, "%s", dir);
    free(dir);
    return rc;
}

/* Called once the train loader knows the epoch (the loader rejects an epoch with no full step). */
static void plan_steps(ct_trainer *t) {
    const ct_config *cfg = t->cfg;
    int64_t gb = cfg->train_batch_size;
    ct_trainer_data *d = &t->d;
    int64_t micro_per_epoch = ct_loader_batches_per_epoch(d->train_l);
    d->epoch_samples = micro_per_epoch * cfg->micro_batch < d->train_ds->count
                           ? micro_per_epoch * cfg->micro_batch : d->train_ds->count;
    d->steps_per_epoch = (d->epoch_samples + gb - 1) / gb;
    /* max_steps, when set, decides the length (as in Hugging Face's Trainer); else epochs. */
    d->total_steps = cfg->train.max_steps > 0 ? cfg->train.max_steps
                                              : (long)cfg->train.epochs * d->steps_per_epoch;
    d->epochs_planned = (int)((d->total_steps + d->steps_per_epoch - 1) / d->steps_per_epoch);
    /* The schedule's total_num_steps "auto" is this run's length (the optimizer is created with
     * this copy); a fixed one shorter than the run gets a warning. */
    char warn[512];
    t->m.sched = cfg->scheduler;
    ct_sched_resolve_total(&t->m.sched, d->total_steps, warn, sizeof warn);
    if (warn[0]) ct_warnf(&t->obs.warn, "%s: %s", cfg->path, warn);
}

/* ---- the start block and the plan ---- */

static const char *precision_name(ct_dtype dt) {
    return dt == CT_F16 ? "fp16" : dt == CT_BF16 ? "bf16" : "fp32";
}

/* Two lines: "memory plan: params 0 B, master 2.6 MiB, ... · all 11.7 MiB of host memory" and the
 * activations by lifetime. The CPU backend's fp32 copies of 16-bit arguments are not in the plan:
 * they grow to their size in the first step (core/cpu/cpu_dtype.c), and the line says so. */
static void print_plan(ct_report *r, const ct_run_plan *p, ct_dtype dt, int world) {
    char v[CT_MEM_CAT_COUNT][32], a[6][32], all[32];
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) ct_fmt_bytes((double)p->bytes[c], v[c], sizeof v[c]);
    bool cpu_scratch = !p->device && dt != CT_F32;
    ct_report_line(r, "memory plan: params %s, master %s, grads %s, optimizer %s, activations %s (%s), "
                   "workspace %s%s%s%s · all %s %s%s", v[CT_MEM_PARAMS], v[CT_MEM_MASTER], v[CT_MEM_GRADS],
                   v[CT_MEM_OPTIM], v[CT_MEM_ACTIVATIONS], precision_name(dt), v[CT_MEM_WORKSPACE],
                   cpu_scratch ? " + the CPU's fp32 copies of 16-bit arguments (sized in the first step)" : "",
                   p->device ? ", loader " : "", p->device ? v[CT_MEM_LOADER] : "",
                   ct_fmt_bytes((double)p->total, all, sizeof all), p->device ? "of device memory" : "of host memory",
                   world > 1 ? " per rank" : "");
    /* checkpointed segments: their inner outputs and saved state, busy again from the recompute */
    char ckpt[256] = "", rb[32], hb[32];
    /* what the lifetime placement leaves between buffers at the peak */
    if (p->act.gaps > 0)
        snprintf(ckpt, sizeof ckpt, ", gaps %s", ct_fmt_bytes((double)p->act.gaps, rb, sizeof rb));
    if (p->act.segments > 0)
        snprintf(ckpt + strlen(ckpt), sizeof ckpt - strlen(ckpt), ", recomputed %s (%d checkpointed segment%s)",
                 ct_fmt_bytes((double)p->act.recompute, rb, sizeof rb), p->act.segments, p->act.segments == 1 ? "" : "s");
    /* activation offload: kept outputs wait in pinned host memory, outside the arena */
    if (p->act.offloaded > 0)
        snprintf(ckpt + strlen(ckpt), sizeof ckpt - strlen(ckpt), "; offloaded %d kept output%s to %s of pinned host "
                 "memory", p->act.offloaded, p->act.offloaded == 1 ? "" : "s", ct_fmt_bytes((double)p->act.host, hb, sizeof hb));
    /* ZeRO-Offload: what sits in host memory beside the device (on the CPU backend, NVMe offload's
     * host side: host memory too, the line says so) */
    if (p->offload) {
        char h[CT_MEM_CAT_COUNT][32], ht[32], state[160];
        for (int c = 0; c < CT_MEM_CAT_COUNT; c++) ct_fmt_bytes((double)p->host[c], h[c], sizeof h[c]);
        char params[64] = "";
        if (p->host[CT_MEM_PARAMS]) snprintf(params, sizeof params, "params %s, ", h[CT_MEM_PARAMS]);
        if (p->nvme)   /* the master and the optimizer's state are in swap files: their buffers here */
            snprintf(state, sizeof state, "grads %s, NVMe swap buffers %s", h[CT_MEM_GRADS], h[CT_MEM_OPTIM]);
        else
            snprintf(state, sizeof state, "master %s, grads %s, optimizer %s", h[CT_MEM_MASTER], h[CT_MEM_GRADS],
                     h[CT_MEM_OPTIM]);
        char in_all[96] = "";   /* on the CPU backend both lines are host memory */
        if (!p->device) snprintf(in_all, sizeof in_all, "; %s of host memory in all",
                                 ct_fmt_bytes((double)(p->total + p->host_total), all, sizeof all));
        ct_report_line(r, "%s (%s offload%s): %s%s, staging and landing buffers %s%s%s · all %s%s%s",
                       p->device ? "host memory beside it" : "and for the optimizer", params[0] ? "optimizer and parameter" : "optimizer",
                       p->nvme ? " to NVMe" : "", params, state, h[CT_MEM_WORKSPACE],
                       p->host[CT_MEM_ACTIVATIONS] ? ", offloaded activations " : "",
                       p->host[CT_MEM_ACTIVATIONS] ? h[CT_MEM_ACTIVATIONS] : "",
                       ct_fmt_bytes((double)p->host_total, ht, sizeof ht), world > 1 ? " per rank" : "", in_all);
    }
    ct_report_line(r, "activations by lifetime, at the peak: outputs %s, saved for backward %s, gradients %s, fan-out "
                   "%s, input copy %s, layer workspace %s%s", ct_fmt_bytes((double)p->act.outputs, a[0], 32),
                   ct_fmt_bytes((double)p->act.aux, a[1], 32), ct_fmt_bytes((double)p->act.grads, a[2], 32),
                   ct_fmt_bytes((double)p->act.scratch, a[3], 32), ct_fmt_bytes((double)p->act.input, a[4], 32),
                   ct_fmt_bytes((double)p->act.workspace, a[5], 32), ckpt);
    /* the chunked LM head: one chunk's logits instead of the whole micro-batch's */
    if (p->act.head_chunk > 0) {
        int64_t chunks = (p->act.head_rows + p->act.head_chunk - 1) / p->act.head_chunk;
        double whole = (double)p->act.head_logits / (double)p->act.head_chunk * (double)p->act.head_rows;
        ct_report_line(r, "chunked LM head: on, %lld rows per chunk (%lld chunk%s of the %lld rows; logits %s "
                       "instead of %s; model.loss.chunk_rows)", (long long)p->act.head_chunk, (long long)chunks,
                       chunks == 1 ? "" : "s", (long long)p->act.head_rows,
                       ct_fmt_bytes((double)p->act.head_logits, a[0], 32), ct_fmt_bytes(whole, a[1], 32));
    }
}

/* NVMe offload: the swap's files and buffers (nvme.h), and once they are open how they are read
 * and written (direct I/O, or buffered where the file system refuses O_DIRECT: the warning says
 * what that costs). */
static void print_swap(ct_report *r, const ct_config *cfg, const ct_run_plan *p, ct_nvme *open) {
    if (!p->nvme) return;
    char line[4600];
    ct_nvme_describe(cfg, p, line, sizeof line);
    const char *io = !open ? "" : ct_swap_direct(ct_nvme_swap(open)) ? " · direct I/O (O_DIRECT)" : " · buffered I/O";
    ct_report_line(r, "%s%s", line, io);
}

/* The ZeRO part of the first line: " · ZeRO stage 2 (...)", or the offload's. */
static void describe_zero(const ct_config *cfg, bool on_device, char *out, size_t n) {
    int stage = ct_zero_stage(cfg, on_device);
    out[0] = '\0';
    char per_rank[48] = "", path[64] = "", state[4300];
    if (cfg->world_size > 1) snprintf(per_rank, sizeof per_rank, ", 1/%d per rank", cfg->world_size);
    if (cfg->zero.stage != stage) snprintf(path, sizeof path, "; stage %d's gradient path", stage);
    const char *mem = cfg->zero.offload_optimizer.pin_memory ? "pinned" : "pageable";
    if (ct_zero_nvme(cfg, on_device))
        snprintf(state, sizeof state, "fp32 master and optimizer state in NVMe swap files under %s, gradients in %s "
                 "host memory", cfg->zero.offload_optimizer.nvme.path, mem);
    else
        snprintf(state, sizeof state, "fp32 master, gradients and optimizer state in %s host memory", mem);
    if (ct_zero_offload_params(cfg, on_device))
        snprintf(out, n, " · ZeRO stage 3 with optimizer and parameter offload (%s, the parameters in pinned host "
                 "memory%s, uploaded layer by layer; the optimizer step on the CPU)", state, per_rank);
    else if (ct_zero_offload(cfg, on_device))
        snprintf(out, n, " · ZeRO stage %d with optimizer offload%s (%s%s; the optimizer step on the CPU%s%s)",
                 cfg->zero.stage, ct_zero_nvme(cfg, on_device) ? " to NVMe" : "", state, per_rank, path,
                 stage == 3 ? "; parameters gathered layer by layer" : "");
    else if (stage > 0)
        snprintf(out, n, " · ZeRO stage %d (%s partitioned: 1/%d per rank%s)", stage,
                 stage == 3   ? "fp32 master, optimizer state, gradients and parameters"
                 : stage == 2 ? "fp32 master, optimizer state and gradients"
                              : "fp32 master and optimizer state",
                 cfg->world_size, stage == 3 ? "; parameters gathered layer by layer" : "");
}

/* The first lines of a run: version and device, the model, the batch, the memory plan. on_device:
 * the run trains on a device (a GPU, the capped device). */
static void print_model(ct_trainer *t, const char *device, const char *device_desc, bool on_device) {
    const ct_config *cfg = t->cfg;
    const ct_graph_info *gi = t->m.info;
    ct_report *r = &t->obs.rep;
    char a[48], desc[512];
    char zero[4600];
    describe_zero(cfg, on_device, zero, sizeof zero);
    ct_report_line(r, "ctrain %s · %s (%s) · %s · %d rank%s%s", CT_VERSION, device, device_desc,
                   precision_name(ct_amp_compute_dtype(cfg)), cfg->world_size, cfg->world_size == 1 ? "" : "s", zero);
    ct_graph_describe(t->m.g, desc, sizeof desc);
    ct_report_line(r, "model  %s: %s params, %s", cfg->name,
                   ct_fmt_count((double)gi->n_param_elems, a, sizeof a), desc);
}

static void print_start(ct_trainer *t, const ct_run_plan *plan) {
    const ct_config *cfg = t->cfg;
    const ct_trainer_data *d = &t->d;
    ct_report *r = &t->obs.rep;
    print_model(t, t->be->name, t->be->device_desc, offload_device(t));
    ct_report_line(r, "batch  %ld = micro %ld × accumulation %ld × world %d · %ld steps/epoch · %ld steps%s",
                   cfg->train_batch_size, cfg->micro_batch, cfg->grad_accum, cfg->world_size,
                   d->steps_per_epoch, d->total_steps, cfg->train.max_steps > 0 ? " (max_steps)" : "");
    if (t->opts.batch_note && t->opts.batch_note[0]) ct_report_line(r, "       %s", t->opts.batch_note);
    ct_dtype dt = ct_graph_compute_dtype(t->m.g);
    const char *note = ct_backend_cpu_kernels(t->be) ? ct_cpu_backend_precision_note(dt) : NULL;
    if (note) ct_report_line(r, "note   %s", note);
    print_plan(r, plan, dt, cfg->world_size);
    print_swap(r, cfg, plan, t->m.nvme);
    char ev[160] = "no eval set";
    if (d->eval_ds) snprintf(ev, sizeof ev, "%lld eval samples", (long long)d->eval_ds->count);
    ct_report_line(r, "data   %s: %lld train samples (%s), %s · shuffle %s", d->train_ds->format,
                   (long long)d->train_ds->count, d->train_ds->source, ev, d->shuffle ? "on" : "off");
}

/* ---- open / close ---- */

/* The optimizer's tensors: every trainable view of the layout, in offset order. */
static ct_optim_tensor *optim_tensors(const ct_param_layout *L, int *n) {
    ct_optim_tensor *t = ct_xmalloc((size_t)(L->n_views ? L->n_views : 1) * sizeof *t);
    *n = 0;
    for (int i = 0; i < L->n_views; i++)
        if (L->views[i].trainable) t[(*n)++] = (ct_optim_tensor){L->views[i].offset, L->views[i].numel,
                                                                L->views[i].weight_decay};
    return t;
}

/* Whether this run only evaluates (ctrain eval, the smoke's reload) with nothing partitioned: then it
 * needs no gradients, optimizer state, partition or buckets (ct_run_opts.forward_only). */
static bool evaluates_only(const ct_trainer *t) {
    return t->opts.forward_only && zero_stage(t) == 0;
}

/* The parameter store (initialised from the seed), the optimizer over its range, the loss
 * accumulator; for a run that only evaluates, no gradients and no optimizer. */
/* What only training needs besides the store: at stage 2 the gradients are this rank's part,
 * reduced layer by layer, at stage 3 the parameters too, gathered layer by layer (the partition's
 * hooks); at stages 0 and 1 the gradients all-reduced in buckets, during backward with
 * overlap_comm; the optimizer over the store's range. */
static int make_training_state(ct_trainer *t, int stage, ct_err *err) {
    ct_trainer_model *m = &t->m;
    const ct_param_layout *L = ct_graph_layout(m->g);
    ct_partition_opts po = ct_partition_opts_from(&t->cfg->zero);
    int n = 0, rc = stage >= 2 ? ct_partition_create(m->params, t->comm, &po, &m->part, err) : CT_OK;
    if (!rc && m->part) m->hooks = ct_partition_hooks(m->part);
    if (rc) return rc;
    const ct_zero_cfg *z = &t->cfg->zero;
    if (stage <= 1) {
        m->buckets = ct_grad_buckets_create(L, m->params->grads, (int64_t)z->reduce_bucket_size, t->comm,
                                            z->overlap_comm);
        if (z->overlap_comm && t->comm->world > 1) m->hooks = ct_grad_buckets_hooks(m->buckets);
    }
    ct_optim_tensor *tensors = optim_tensors(L, &n);
    /* ZeRO-Offload: the state beside the master, in host memory, stepped by the CPU backend; NVMe
     * offload: in the swap's files, none of it the optimizer's own */
    rc = ct_optim_create_in(&t->cfg->optimizer, &m->sched, t->cfg->gradient_clipping, ct_place_ops(&m->params->state_at),
                            m->nvme ? NULL : &m->params->state_at, tensors, n, m->params->lo, m->params->hi, &m->opt,
                            err);
    free(tensors);
    return rc;
}

/* ZeRO-Offload's host side: a CPU backend with the run's threads, which initialises, accumulates
 * into and steps the state the store and the optimizer keep in host memory. */
static int start_host_backend(ct_trainer *t, ct_store_offload *off, ct_err *err) {
    const ct_config *cfg = t->cfg;
    t->host_be = ct_cpu_backend_create(cfg->train.threads);
    if (!t->host_be)
        return ct_errf(err, CT_ERR_RUNTIME, "zero_optimization.offload_optimizer: cannot start the CPU backend that "
                       "steps the optimizer in host memory (%d threads): %s", ct_cpu_threads_for(cfg->train.threads),
                       strerror(errno));
    *off = (ct_store_offload){.host = t->host_be, .pinned = cfg->zero.offload_optimizer.pin_memory,
                              .chunk = ct_zero_offload_chunk(cfg),
                              .params = ct_zero_offload_params(cfg, offload_device(t)),
                              .swapped = ct_zero_nvme(cfg, offload_device(t))};
    return CT_OK;
}

static int alloc_params(ct_trainer *t, ct_err *err) {
    ct_trainer_model *m = &t->m;
    const ct_param_layout *L = ct_graph_layout(m->g);
    int64_t lo = 0, hi = L->n_params;   /* ZeRO stage 1-3: this rank's part of master and state */
    int stage = zero_stage(t);
    if (stage > 0) ct_comm_shard(L->n_params, t->comm->world, t->comm->rank, &lo, &hi);
    bool forward_only = evaluates_only(t);
    unsigned parts = ct_zero_store_parts(stage) | (forward_only ? CT_STORE_NO_GRADS : 0);
    ct_store_offload off;
    int rc = offloads(t) ? start_host_backend(t, &off, err) : CT_OK;
    /* NVMe offload: the swap files of this rank's part, before anything else is allocated */
    if (!rc && offloads(t) && off.swapped)
        rc = ct_nvme_open(t->cfg, t->be, t->host_be, lo, hi, t->comm->rank, &m->nvme, &t->obs.warn, err);
    if (!rc) rc = ct_param_store_create_in(L, t->be, ct_graph_compute_dtype(m->g), lo, hi, parts,
                                           offloads(t) ? &off : NULL, &m->params, err);
    if (!rc && !forward_only) rc = make_training_state(t, stage, err);
    if (rc) return rc;
    m->loss_acc = t->be->mem.alloc(t->be, 4 * sizeof(float), CT_MEM_WORKSPACE);
    if (!m->loss_acc) return ct_errf(err, CT_ERR_RUNTIME, "out of memory (16 bytes on %s)", t->be->name);
    if (t->opts.weights_from_checkpoint) return CT_OK;
    ct_param_store_init(m->params, t->cfg->train.seed);   /* a swapped store: its buffers only */
    return m->nvme ? ct_nvme_init_master(m->nvme, m->params, t->cfg->train.seed, err) : CT_OK;
}

/* Capture and replay of micro-batches (train.cuda_graph). */
static int start_step_runner(ct_trainer *t, ct_err *err) {
    char notice[256];
    int rc = ct_step_runner_init(&t->m.runner, t->be, t->m.g, t->cfg->train.cuda_graph, notice,
                                 sizeof notice, err);
    if (!rc && notice[0]) ct_warnf(&t->obs.warn, "%s", notice);
    t->m.runner.timed = t->cfg->wall_clock_breakdown;
    return rc;
}

/* The loader's data.skip_corrupt lines arrive while steps run: through the reporter, which
 * clears a progress line first; --quiet silences progress, not warnings. */
static void loader_warning(void *ctx, const char *line) {
    ct_report *r = ctx;
    if (r->quiet) fprintf(stderr, "ctrain: warning: %s\n", line);
    else ct_report_line(r, "ctrain: warning: %s", line);
}

/* A loader for one dataset; train: shuffled (data.shuffle), drop_last, augmented. */
static int start_loader(ct_trainer *t, const ct_dataset *ds, bool train, ct_loader **out, ct_err *err) {
    ct_loader_opts o;
    int rc = ct_loader_opts_from_config(t->cfg, ds, train, t->m.info->classes, &o, err);
    o.ids_below = t->m.info->input_ids_below;      /* token ids must fit the embedding's table */
    o.device_dtype = ct_graph_compute_dtype(t->m.g);   /* data.transform.on_device writes this */
    o.warn_fn = loader_warning;
    o.warn_ctx = &t->obs.rep;
    if (train) {   /* each rank its slice of every step (eval: every rank the whole set) */
        o.rank = t->comm->rank;
        o.world = t->comm->world;
    }
    if (!rc) rc = ct_loader_init(out, t->be, ds, &o, &t->obs.warn, err);
    if (!rc && train) t->d.shuffle = o.shuffle;
    return rc;
}

/* Early stopping and best/ act on eval metrics: say so at start instead of never acting. */
static int check_eval_metrics(const ct_trainer *t, ct_err *err) {
    const ct_train_cfg *tc = &t->cfg->train;
    const char *es = tc->early_stopping.enabled ? tc->early_stopping.metric : NULL;
    if (es && strncmp(es, "eval_", 5) == 0 && !t->d.eval_ds)
        return ct_errf(err, CT_ERR_CONFIG, "%s: train.early_stopping.metric is %s but data.eval is not "
                       "set; add an eval set or use \"metric\": \"train_loss\"", t->cfg->path, es);
    const char *acc_user = es && strcmp(es, "eval_accuracy") == 0 ? "train.early_stopping.metric"
                           : strcmp(tc->best_metric, "eval_accuracy") == 0 ? "train.best_metric" : NULL;
    if (acc_user && t->m.info->classes == 0)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s is eval_accuracy but the model's loss is not a "
                       "classification loss (no accuracy); use eval_loss", t->cfg->path, acc_user);
    return CT_OK;
}

static int setup_data(ct_trainer *t, ct_err *err) {
    ct_trainer_data *d = &t->d;
    int rc = check_eval_metrics(t, err);
    /* Eval labels must mean what train labels mean: formats with class names match them. */
    if (!rc && d->eval_ds) rc = ct_dataset_match_classes(d->eval_ds, "eval", d->train_ds, "train", err);
    if (!rc) rc = check_dataset(t, d->train_ds, "train", err);
    if (!rc && d->eval_ds) rc = check_dataset(t, d->eval_ds, "eval", err);
    if (!rc) rc = start_loader(t, d->train_ds, true, &d->train_l, err);
    if (!rc && d->eval_ds) rc = start_loader(t, d->eval_ds, false, &d->eval_l, err);
    if (!rc) plan_steps(t);
    return rc;
}

/* The graph: built (pure) for the micro-batch in the compute dtype. */
static int build_graph(ct_trainer *t, ct_err *err) {
    int rc = ct_graph_build(t->cfg, t->cfg->micro_batch, ct_amp_compute_dtype(t->cfg), &t->m.g, err);
    if (!rc) t->m.info = ct_graph_info_get(t->m.g);
    if (!rc) t->obs.rep.train_flops_per_sample = ct_graph_train_flops_per_sample(t->m.g);
    if (!rc && t->m.info->input_dtype == CT_I32)   /* a language model: progress in tokens */
        t->obs.rep.tokens_per_sample = ct_shape_numel(&t->m.info->input_shape);
    return rc;
}

/* The run must fit the address-space limit (ulimit -v): checked before any tensor is allocated,
 * with the data and the loaders already mapped, because past the limit OpenBLAS retries its
 * buffer's mmap forever instead of failing. What is still to come: the plan, on the host when the
 * backend is the CPU, and the CPU backend's GEMM buffers. */
static int check_address_space(ct_trainer *t, ct_err *err) {
    size_t limit = ct_address_space_limit();
    if (limit == SIZE_MAX) return CT_OK;
    bool cpu = ct_backend_cpu_kernels(t->be);   /* the capped device's memory is host memory too */
    size_t used = ct_address_space_in_use(), plan = (cpu ? t->plan.total : 0) + t->plan.host_total;
    size_t blas = cpu ? ct_cpu_backend_reserved_bytes(t->be->threads) : 0;
    size_t slack = (size_t)64 << 20;   /* the first step's page tables, stdio, CPU 16-bit scratch */
    size_t need = used + plan + blas + slack;
    if (need <= limit) return CT_OK;
    char l[32], n[32], u[32], p[32], b[32], s[32];   /* every part of the sum is shown */
    return ct_errf(err, CT_ERR_RUNTIME,
                   "this run needs about %s of address space but the limit (ulimit -v) is %s:\n"
                   "  %s mapped at start (program, data, loaders, threads) + %s memory plan + %s for "
                   "OpenBLAS's GEMM buffers (128 MiB per thread) + %s headroom (the first step's page tables, "
                   "stdio, 16-bit scratch).\n"
                   "  Raise the limit (ulimit -v unlimited), use fewer threads (train.threads) or a "
                   "smaller micro-batch.", ct_fmt_bytes((double)need, n, sizeof n),
                   ct_fmt_bytes((double)limit, l, sizeof l), ct_fmt_bytes((double)used, u, sizeof u),
                   ct_fmt_bytes((double)plan, p, sizeof p), ct_fmt_bytes((double)blas, b, sizeof b),
                   ct_fmt_bytes((double)slack, s, sizeof s));
}

/* The memory the plan must fit: train.memory_limit_gb, and the device's own memory (a GPU's, the
 * capped device's cap), the smaller; 0 when neither is known. *what names it for a message. */
static size_t memory_limit(const ct_trainer *t, char *what, size_t what_n) {
    const char *source;
    size_t cfg_limit = ct_fit_limit(t->cfg, 0, &source), dev = t->be ? t->be->memory_bytes : 0;
    char b[32];
    if (dev && (!cfg_limit || dev < cfg_limit)) {
        if (what) snprintf(what, what_n, "the %s device's memory (%s%s)", t->be->name,
                           ct_fmt_bytes((double)dev, b, sizeof b),
                           strcmp(t->be->name, "capped") == 0 ? ", CTRAIN_CAPPED_DEVICE" : "");
        return dev;
    }
    if (what) snprintf(what, what_n, "train.memory_limit_gb %g", t->cfg->train.memory_limit_gb);
    return cfg_limit;
}

/* train.memory_limit_gb and the device's memory: a plan over either stops the run before anything
 * is allocated, with the breakdown and what would fit; under it, the CPU backend is capped at
 * train.memory_limit_gb too, so what the plan does not foresee fails as a device out of memory
 * would. */
static int check_memory_limit(ct_trainer *t, ct_err *err) {
    char what[128];
    size_t limit = memory_limit(t, what, sizeof what);
    if (!limit) return CT_OK;
    if (t->plan.total > limit) return ct_fit_over_limit(t->cfg, &t->plan, limit, what, err);
    if (ct_backend_cpu_kernels(t->be)) ct_cpu_backend_set_limit(t->be, memory_limit(t, NULL, 0));
    if (t->opts.oom_note && t->opts.oom_note_n)
        ct_fit_oom_note(t->cfg, &t->plan, limit, t->opts.oom_note, t->opts.oom_note_n);
    return CT_OK;
}

/* --summary must not name a file the run reads: its atomic write would replace a config or a
 * dataset file with one line of JSON. Checked once the datasets are open (their file lists are
 * known then) and before anything is trained. */
static int check_summary_not_input(ct_trainer *t, ct_err *err) {
    const char *out = t->opts.summary_path;
    if (!out) return CT_OK;
    const ct_config *cfg = t->cfg;
    const char *input = NULL;
    const char *configs[3] = {cfg->path, cfg->model_doc ? ct_json_filename(cfg->model_doc) : NULL,
                              cfg->data_doc ? ct_json_filename(cfg->data_doc) : NULL};
    for (int i = 0; i < 3 && !input; i++)
        if (configs[i] && ct_fs_same_file(out, configs[i])) input = configs[i];
    const ct_dataset *ds[2] = {t->d.train_ds, t->d.eval_ds};
    for (int i = 0; i < 2 && !input; i++)
        if (ds[i]) input = ct_dataset_reads_file(ds[i], out);
    if (!input) return CT_OK;
    t->sum->summary_file_refused = true;
    return ct_errf(err, CT_ERR_CONFIG, "--summary %s is %s, an input of this run; writing the "
                   "summary would replace it.\n  Nothing was trained. Give the summary another "
                   "path: --summary FILE", out, input);
}

/* The device of this rank: with several ranks, "cuda" (and "auto" on a machine with a GPU) is
 * GPU LOCAL_RANK, as DeepSpeed's and torch's launchers mean it (torch.cuda.set_device(local_rank));
 * "cuda:N" and "cpu" are taken as written. */
static const char *rank_device(const ct_trainer *t, char *buf, size_t n) {
    const char *device = t->cfg->train.device;
    const ct_launch *l = t->opts.launch;
    bool plain = !device || !strcmp(device, "cuda") || !strcmp(device, "auto");
    if (!l || l->world <= 1 || l->local_rank == 0 || !plain) return device;
    if (device && !strcmp(device, "auto") && !ct_cuda_available()) return device;
    snprintf(buf, n, "cuda:%d", l->local_rank);
    return buf;
}

/* Backend, graph (built pure), data and loaders, the memory plan and its check against the
 * limits, then the allocations: the arena, the parameter store and the optimizer. */
static int setup(ct_trainer *t, ct_err *err) {
    const ct_config *cfg = t->cfg;
    open_job jobs[2];
    open_start(&jobs[0], cfg, "train");
    open_start(&jobs[1], cfg, "eval");
    ct_amp_init(&t->m.amp, cfg);
    char notice[CT_ERR_MSG + 64];   /* why "auto" trains on the CPU on a machine with a GPU */
    char device[32];
    int rc = ct_backend_create_noting(rank_device(t, device, sizeof device), cfg->train.threads, &t->be, notice,
                                      sizeof notice, err);
    if (!rc && notice[0]) ct_warnf(&t->obs.warn, "%s", notice);
    if (!rc) rc = ct_train_check_supported(cfg, offload_device(t), err);
    if (!rc) warn_offload(t, ct_backend_separate_memory(t->be));
    if (!rc) rc = open_comm(t, err);
    if (!rc) t->obs.rep.peak_flops = ct_device_peak_flops(t->be->device_desc);
    if (!rc) rc = build_graph(t, err);
    int data_rc = open_finish(t, jobs, rc ? NULL : err);
    if (rc || data_rc) return rc ? rc : data_rc;
    if ((rc = setup_data(t, err))) return rc;
    if ((rc = check_summary_not_input(t, err))) return rc;
    if (t->opts.forward_only) {   /* nothing to offload: the plan of the run without it */
        ct_config c = *cfg;
        c.zero.offload_optimizer.device = CT_OFFLOAD_NONE;
        ct_run_plan_make(&c, t->m.g, ct_backend_separate_memory(t->be), &t->plan);
    } else {
        ct_run_plan_make(cfg, t->m.g, ct_backend_separate_memory(t->be), &t->plan);
    }
    if (evaluates_only(t)) ct_run_plan_forward_only(&t->plan);
    /* the host's memory first: on the CPU backend, a state over memory_limit_gb that NVMe offload
     * would take out of it is said so */
    if (!rc) rc = ct_nvme_check_host_limit(cfg, t->m.g, &t->plan, err);
    if (!rc) rc = check_memory_limit(t, err);
    if (!rc) rc = check_address_space(t, err);
    if (!rc) {
        rc = ct_graph_bind(t->m.g, t->be, NULL, err);
        if (!rc) rc = alloc_params(t, err);
        /* the device out of memory (or the CPU past train.memory_limit_gb) in the plan's
         * allocations: the message says what was being allocated; the plan and what fits follow */
        if (rc == CT_ERR_RUNTIME) rc = ct_fit_explain_oom(cfg, &t->plan, memory_limit(t, NULL, 0), err);
    }
    if (!rc) rc = start_step_runner(t, err);
    if (!rc) rc = ct_curriculum_setup(t, err);
    if (!rc && cfg->train.sample_every > 0) {
        t->m.sampler = ct_lm_borrow(t->be, t->m.g, t->m.params);
        if (!t->m.sampler || ct_lm_classes(t->m.sampler) != 256)
            rc = ct_errf(err, CT_ERR_CONFIG, "%s: train.sample_every: prints text from a byte-level language "
                         "model (token ids [T] in, 256 classes per position out); this model is not one: "
                         "remove train.sample_every (or use ctrain generate --prompt-ids)", cfg->path);
    }
    return rc;
}

/* Settings the config accepts that this version does not implement: one warning line each
 * (core/config/not_yet.c), so a run never pretends to do what it does not. */
static void warn_not_yet(ct_trainer *t) {
    ct_not_yet ny[CT_NOT_YET_MAX];
    int n = ct_config_not_yet(t->cfg, ny, CT_NOT_YET_MAX);
    for (int i = 0; i < n && i < CT_NOT_YET_MAX; i++) ct_warnf(&t->obs.warn, "%s", ny[i].text);
}

static void print_warnings(ct_trainer *t) {
    for (int i = 0; i < t->obs.warn.n; i++) fprintf(stderr, "ctrain: warning: %s\n", t->obs.warn.items[i]);
    ct_warnings_free(&t->obs.warn);
}

static ct_trainer *trainer_new(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary) {
    ct_trainer *t = ct_xcalloc(1, sizeof *t);
    t->t_open = ct_now();
    t->cfg = cfg;
    if (opts) t->opts = *opts;
    t->sum = summary;
    ct_summary_init(summary);
    snprintf(summary->run_dir, sizeof summary->run_dir, "%s", cfg->train.run_dir);
    snprintf(t->ck.save_dir, sizeof t->ck.save_dir, "%s", cfg->train.save_dir);
    ct_train_summary_hparams(summary, cfg);
    /* one rank speaks for the run: the others print only errors */
    ct_report_init(&t->obs.rep, stderr, t->opts.quiet || ct_trainer_rank(t) != 0, cfg->steps_per_print);
    if (t->opts.on_step) ct_trainer_on_step(t, t->opts.on_step, t->opts.on_step_ctx);
    return t;
}

/* with_ckpt: also run the checkpoint step (resume, init_from, run_dir/config.json). */
static int trainer_open(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                        bool with_ckpt, ct_trainer **out, ct_err *err) {
    ct_trainer *t = trainer_new(cfg, opts, summary);
    *out = t;
    warn_not_yet(t);
    /* output paths, the run_dir lock and whose run it holds: checked before the slow set-up */
    int rc = with_ckpt && ct_trainer_rank(t) == 0 ? ct_trainer_rundir_open(t, err) : CT_OK;
    if (!rc) rc = setup(t, err);
    if (!rc) rc = check_ranks_agree(t, err);
    if (!rc) rc = share_save_dir(t, err);
    if (ct_trainer_rank(t) == 0) print_warnings(t);   /* once per run */
    ct_warnings_free(&t->obs.warn);
    if (!rc) {
        memcpy(summary->planned_by_cat, t->plan.bytes, sizeof t->plan.bytes);
        summary->has_plan = true;
        print_start(t, &t->plan);
    }
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
    ct_trainer_observe_end(t); /* a fit that returned early */
    ct_loader_free(t->d.train_l);
    ct_loader_free(t->d.eval_l);
    ct_warnings_free(&t->obs.warn);
    ct_trainer_ckpt_close(t);
    if (t->be) ct_step_runner_reset(&t->m.runner);
    if (t->be) ct_curriculum_free(t);
    ct_lm_close(t->m.sampler);
    if (t->m.loss_acc) t->be->mem.free(t->be, t->m.loss_acc);
    ct_optim_free(t->m.opt);
    ct_err nvme_err = {0};   /* every rank removes its own swap files on every path; a failure is a warning */
    if (ct_nvme_close(t->m.nvme, &nvme_err)) ct_fputs_printable_line("ctrain: warning: ", nvme_err.msg, stderr);
    ct_partition_free(t->m.part);
    ct_grad_buckets_free(t->m.buckets);
    ct_param_store_free(t->m.params);
    ct_graph_free(t->m.g);
    ct_comm_destroy(t->comm);
    ct_dataset_close(t->d.train_ds);
    ct_dataset_close(t->d.eval_ds);
    if (t->host_be) ct_backend_destroy(t->host_be);
    if (t->be) ct_backend_destroy(t->be);
    free(t);
}

struct ct_optim *ct_trainer_optim(ct_trainer *t) { return t->m.opt; }
struct ct_param_store *ct_trainer_params(ct_trainer *t) { return t->m.params; }
const struct ct_graph *ct_trainer_graph(const ct_trainer *t) { return t->m.g; }
ct_backend *ct_trainer_backend(ct_trainer *t) { return t->be; }

void ct_trainer_on_step(ct_trainer *t, void (*fn)(void *ctx, long step, double loss), void *ctx) {
    t->obs.on_step = fn;
    t->obs.on_step_ctx = ctx;
}

static void report_row(void *ctx, const char *text) { ct_report_line(ctx, "%s", text); }

/* The device memory --dry-run plans for: --device-memory, else the capped device's size, else a
 * GPU's total as its backend reads it (the backend is opened for that alone: nothing of the model
 * is allocated on it); 0 when none is known. *source names it. */
static size_t dry_run_device_memory(const ct_trainer *t, const ct_plan_target *target, char *source, size_t n) {
    snprintf(source, n, "%s", "");
    if (t->opts.device_memory) {
        snprintf(source, n, "%s", "--device-memory");
        return t->opts.device_memory;
    }
    if (target->capacity) {
        snprintf(source, n, "%s", "the capped device, CTRAIN_CAPPED_DEVICE");
        return target->capacity;
    }
    if (!target->device || strcmp(target->name, "cuda") != 0 || !ct_cuda_available()) return 0;
    const char *d = t->cfg->train.device[0] && strcmp(t->cfg->train.device, "auto") ? t->cfg->train.device : "cuda";
    ct_backend *be = NULL;
    ct_err err = {0};
    if (ct_backend_create(d, 1, &be, &err)) return 0;
    size_t bytes = be->memory_bytes;
    snprintf(source, n, "%.16s: %.100s", d, be->device_desc);
    ct_backend_destroy(be);
    return bytes;
}

/* --dry-run's table of what fits: for the device memory (above) or train.memory_limit_gb, the
 * smaller, else (planning for the CPU) the host memory available now. */
static int print_fit_table(ct_trainer *t, size_t device_memory, const char *device_source, bool device,
                           ct_err *err) {
    const ct_config *cfg = t->cfg;
    const char *source;
    size_t limit = ct_fit_limit(cfg, device_memory, &source);
    if (source && !strcmp(source, "--device-memory")) source = device_source;
    char l[32], head[320];
    if (!limit && !device) {
        limit = ct_host_available_bytes();
        source = "host memory available now, MemAvailable";
    }
    if (limit)
        snprintf(head, sizeof head, "what fits in %s (%s):", ct_fmt_bytes((double)limit, l, sizeof l), source);
    else
        snprintf(head, sizeof head, "what the choices need (the GPU's memory is not known before it starts: "
                 "--device-memory SIZE or train.memory_limit_gb says what fits):");
    ct_report_line(&t->obs.rep, "%s", head);
    return ct_fit_table(cfg, device, limit, report_row, &t->obs.rep, err);
}

/* --dry-run's second table: ZeRO stages and offload on the device beside the host memory
 * (--host-memory, else MemAvailable now). */
static int print_zero_table(ct_trainer *t, size_t device_memory, const char *device_source, ct_err *err) {
    const ct_config *cfg = t->cfg;
    const char *source;
    ct_fit_memory mem = {.device = ct_fit_limit(cfg, device_memory, &source), .host = t->opts.host_memory};
    if (source && !strcmp(source, "--device-memory")) source = device_source;
    const char *host_source = mem.host ? "--host-memory" : "MemAvailable now";
    if (!mem.host) mem.host = ct_host_available_bytes();
    char d[32], h[32], ranks[64] = "";
    if (cfg->world_size > 1) snprintf(ranks, sizeof ranks, ", shared by the %d ranks", cfg->world_size);
    if (mem.device)
        ct_report_line(&t->obs.rep, "ZeRO stage and offload, per rank, at micro-batch %ld with the configured "
                       "checkpointing, on a device of %s (%s) beside %s of host memory (%s%s):", cfg->micro_batch,
                       ct_fmt_bytes((double)mem.device, d, sizeof d), source, ct_fmt_bytes((double)mem.host, h, sizeof h),
                       host_source, ranks);
    else
        ct_report_line(&t->obs.rep, "ZeRO stage and offload, per rank, at micro-batch %ld with the configured "
                       "checkpointing, on a device:", cfg->micro_batch);
    return ct_fit_zero_table(cfg, mem, report_row, &t->obs.rep, err);
}

/* --dry-run: the config, the model and its memory plan, from the planner alone: no backend is
 * created (on a GPU without --device-memory, only to read its memory), no tensor memory allocated,
 * no data file opened. --device-memory plans for a device, whatever the config's train.device. */
static int dry_run(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary, ct_err *err) {
    ct_trainer *t = trainer_new(cfg, opts, summary);
    warn_not_yet(t);
    ct_plan_target target;
    int rc = ct_run_plan_target(cfg, ct_cuda_available(), &target, err);
    bool device = target.device || t->opts.device_memory;
    if (!rc) warn_offload(t, device);
    print_warnings(t);
    if (!rc) rc = ct_train_check_supported(cfg, device, err);
    if (!rc) rc = build_graph(t, err);
    if (!rc) rc = ct_curriculum_check(cfg, t->m.g, err);
    if (!rc) {
        char source[160];
        size_t device_memory = dry_run_device_memory(t, &target, source, sizeof source);
        ct_run_plan plan;
        ct_run_plan_make(cfg, t->m.g, device, &plan);
        print_model(t, target.device || !device ? target.name : "a device", "planned, not started", device);
        ct_report_line(&t->obs.rep, "batch  %ld = micro %ld × accumulation %ld × world %d", cfg->train_batch_size,
                       cfg->micro_batch, cfg->grad_accum, cfg->world_size);
        if (t->opts.batch_note && t->opts.batch_note[0]) ct_report_line(&t->obs.rep, "       %s", t->opts.batch_note);
        print_plan(&t->obs.rep, &plan, ct_graph_compute_dtype(t->m.g), cfg->world_size);
        print_swap(&t->obs.rep, cfg, &plan, NULL);
        /* the swap's directory, as a run checks it (a probe file made and removed) */
        if (plan.nvme) rc = ct_swap_check_dir(cfg->zero.offload_optimizer.nvme.path, plan.swap_disk, CT_NVME_PATH_KEY, err);
        if (!rc) rc = print_fit_table(t, device_memory, source, device, err);
        if (!rc && device) rc = print_zero_table(t, device_memory, source, err);
        else if (!rc)
            ct_report_line(&t->obs.rep, "ZeRO stage and offload: planned for a device (--device-memory SIZE, a GPU, or "
                           "the capped device); on the CPU backend offload to host memory moves nothing (NVMe "
                           "offload does: the plan above is then the swap's)");
        if (!rc)
            ct_report_line(&t->obs.rep, "dry run: configuration and model are valid; data not opened, nothing "
                           "allocated or trained");
    }
    ct_trainer_set_status(t, rc ? "error" : "ok", rc ? err : NULL);
    ct_trainer_finish(t);
    ct_trainer_close(t);
    return rc;
}

int ct_train_run(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary, ct_err *err) {
    if (opts && opts->dry_run) return dry_run(cfg, opts, summary, err);
    ct_trainer *t = NULL;
    int rc = ct_trainer_open(cfg, opts, summary, &t, err);
    if (!rc) rc = ct_trainer_fit(t, err); /* fills the rest of the summary */
    else ct_trainer_finish(t);
    /* A stop signal ends every rank at the same step (loop.c); any other error may have left the
     * others in a collective: the communicator must not wait for them. */
    bool stopped = rc == CT_EXIT_SIGINT || rc == CT_EXIT_SIGTERM || rc == CT_EXIT_SIGHUP;
    if (rc && !stopped && t->comm) t->comm->failed = true;
    ct_trainer_close(t);
    return rc;
}

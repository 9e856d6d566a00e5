/* internal.h: the trainer's state, shared by the train module's files: trainer.c (open, the
 * start block, close), plan.c (the memory plan), loop.c (steps, eval, epochs), checkpoint.c
 * (resume, saves), summary.c (the summary's status and totals). */
#ifndef CT_TRAIN_INTERNAL_H
#define CT_TRAIN_INTERNAL_H

#include "core/backend/backend.h"
#include "core/ckpt/ckpt.h"
#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/dist/comm.h"
#include "core/dist/launch.h"
#include "core/graph/graph.h"
#include "core/optim/amp.h"
#include "core/optim/optim.h"
#include "core/params/store.h"
#include "core/report/metrics.h"
#include "core/report/report.h"
#include "core/zero/partition.h"
#include "core/zero/grad_buckets.h"
#include "core/train/plan.h"
#include "core/train/step_capture.h"
#include "core/train/train.h"

/* What a step computes with. */
typedef struct ct_trainer_model {
    ct_graph *g;
    const ct_graph_info *info;
    ct_param_store *params;      /* master, compute copy, gradients, buffers */
    ct_optim *opt;               /* optimizer state over the store's master range */
    ct_amp amp;                  /* precision policy and loss scaler */
    ct_scheduler_cfg sched;      /* the config's schedule with "auto" resolved for this run */
    ct_step_runner runner;       /* micro-batch forward + backward, captured when it can be */
    ct_exec_hooks hooks;         /* around every layer of a training step and of evaluation:
                                    ZeRO-2/3's gathers and reductions (core/zero/partition.h); else empty */
    ct_partition *part;          /* ZeRO stages 2 and 3: their buffers and hooks (else NULL) */
    struct ct_nvme *nvme;        /* offload_optimizer "nvme": the master and the optimizer's state
                                    in swap files (nvme.h); else NULL */
    ct_grad_buckets *buckets;    /* stages 0 and 1: the gradient all-reduce's buckets (else NULL) */
    float *loss_acc;             /* [4] backend memory: loss sum and correct count of the micro-
                                    batches so far (weighted by samples), then eval's */
    struct ct_lm *sampler;       /* train.sample_every: the model borrowed for generation */
} ct_trainer_model;

/* Where the batches come from. */
typedef struct ct_trainer_data {
    ct_dataset *train_ds, *eval_ds;
    ct_loader *train_l, *eval_l; /* threaded loaders: micro-batches in order (loader.h) */
    int64_t epoch_samples;       /* train samples used per epoch (drop_last cuts to whole steps) */
    bool shuffle;
    long steps_per_epoch, total_steps; /* total_steps: planned optimizer steps */
    int epochs_planned;          /* epochs the planned steps touch */
} ct_trainer_data;

/* Checkpoints (checkpoint.c). ck addresses the store's and the optimizer's own buffers of this
 * rank's range (the whole space, or its ZeRO part, saved as a shard), where they are: host memory
 * in place (the CPU backend's, or ZeRO-Offload's master and optimizer state), a device's through
 * `device`, its copies. */
typedef struct ct_trainer_ckpt {
    ct_ckpt_tensors ck;
    ct_ckpt_mem device;          /* the backend's memory, when it is not host memory */
    bool resumed;                /* resume_state holds the checkpoint this run continues */
    ct_ckpt_state resume_state;
    long position_step_samples;  /* > 0: its epoch_sample was derived as epoch_step x this (the
                                    train_batch_size of a checkpoint written before epoch_sample
                                    was recorded) */
    char config_hash[17];        /* of cfg->resolved, recorded in every checkpoint */
    /* where this run's checkpoints are: train.save_dir, on every rank rank 0's (share_save_dir in
     * trainer.c): without train.run_dir only rank 0 makes a run directory (cmd/run_dir.c), and
     * every rank writes its shard into rank 0's save_dir */
    char save_dir[4096];
    /* ct_dataset_fingerprint of data.train and data.eval as this run opened them ("": no eval
     * set), recorded in every checkpoint and compared with a resumed checkpoint's */
    char train_data[CT_CKPT_FINGERPRINT], eval_data[CT_CKPT_FINGERPRINT];
    char last[4096];             /* the newest checkpoint this run saved or resumed from ("": none) */
    bool locked;                 /* lock_fd holds run_dir/.lock for the whole run */
    int lock_fd;
} ct_trainer_ckpt;

/* Curriculum learning by sequence length (curriculum.c): the graphs of the shorter lengths. */
typedef struct ct_seq_graph {
    int64_t len;
    ct_graph *g;                 /* model.input [len]; bound to the full graph's arena when it fits */
    ct_step_runner runner;
} ct_seq_graph;
typedef struct ct_trainer_curriculum {
    int64_t len;                 /* the length in force (DeepSpeed's current difficulty) */
    long at_step;                /* the step len was computed for */
    ct_seq_graph *graphs;        /* built when a step first needs the length */
    int n;
    void *input, *target;        /* [micro, T] int32 backend memory: a micro-batch cut to len */
} ct_trainer_curriculum;

/* What the user sees. */
typedef struct ct_trainer_obs {
    ct_report rep;
    ct_warnings warn;            /* set-up and run-time warnings (the loader's), printed once */
    ct_metrics *metrics;         /* metrics.jsonl and csv_monitor (rank 0; NULL elsewhere) */
    struct ct_profiler *prof;    /* flops_profiler until its step is reported (profiler.c) */
    struct ct_nvml *nvml;        /* the GPU's utilisation and memory (rank 0 on a GPU; observe.c) */
    void (*on_step)(void *ctx, long step, double loss);
    void *on_step_ctx;
} ct_trainer_obs;

struct ct_trainer {
    const ct_config *cfg;
    ct_run_opts opts;
    ct_summary *sum;
    double t_open;               /* ct_now() when ct_trainer_open began */
    ct_backend *be;
    ct_backend *host_be;         /* ZeRO-Offload: the CPU backend that steps the optimizer on the host
                                    state beside the device (else NULL) */
    ct_comm *comm;               /* where ranks meet (ct_comm_open: one process, or MPI) */
    ct_run_plan plan;            /* the memory plan, made before anything is allocated */
    ct_trainer_model m;
    ct_trainer_data d;
    ct_trainer_ckpt ck;
    ct_trainer_obs obs;
    ct_trainer_curriculum cur;
};

/* This process's rank (opts.launch; 0 without one). Only rank 0 prints, takes the run directory
 * and writes config.json, checkpoints, metrics and the summary. */
static inline int ct_trainer_rank(const ct_trainer *t) { return t->opts.launch ? t->opts.launch->rank : 0; }

/* ---- curriculum learning (curriculum.c) ---- */

/* The config's curriculum_learning cuts sequences: enabled, curriculum_type "seqlen" and a schedule
 * ctrain can compute (not "custom"). */
bool ct_curriculum_acts(const ct_config *cfg);
/* The model can be cut by the schedule: token ids [T] in, a token per position out, every length in
 * [1, T], the same parameters at the shortest length (CT_ERR_CONFIG naming what is wrong). Pure: a
 * dry run calls it too. */
int ct_curriculum_check(const ct_config *cfg, const ct_graph *g, ct_err *err);
/* After the graph is bound: ct_curriculum_check, then allocate the cut batch. */
int ct_curriculum_setup(ct_trainer *t, ct_err *err);
/* The sequence length of optimizer step `step` (1-based): T without a curriculum. */
int64_t ct_curriculum_len(ct_trainer *t, long step);
/* The graph and step runner for that length (built and bound the first time). */
int ct_curriculum_graph(ct_trainer *t, int64_t len, ct_graph **g, ct_step_runner **runner, ct_err *err);
/* A micro-batch of n samples cut to len positions (into the curriculum's buffers; len = T: the
 * batch itself). */
void ct_curriculum_cut(ct_trainer *t, const void *input, const void *target, int64_t n, int64_t len,
                       const void **input_out, const void **target_out);
void ct_curriculum_free(ct_trainer *t);

/* ---- the summary (summary.c) ---- */

/* Set the summary's status and, when err is given, its error field (the message's first line). */
void ct_trainer_set_status(ct_trainer *t, const char *status, const ct_err *err);
/* Fill wall time and peak memory into the summary; then the bottleneck report. */
void ct_trainer_finish(ct_trainer *t);

/* ---- the bottleneck report (diagnose.c) ---- */

/* The rules of core/report/bottleneck.h over this run's measurements (rank 0, a run that made
 * steps and did not fail): what fired and the config change for it, as report lines; under
 * --profile a line even when nothing fired. */
void ct_trainer_diagnose(ct_trainer *t);

/* ---- the metric files (observe.c) ---- */

/* At the start of training: the print windows (ct_report_plan) and, on rank 0, the metric files
 * (run_dir/metrics.jsonl; csv_monitor's when enabled), continued when the run was resumed. */
int ct_trainer_observe_start(ct_trainer *t, ct_err *err);
/* Write out and close the metric files; a failed write or dropped records is a warning. */
void ct_trainer_observe_end(ct_trainer *t);

/* ---- the flops profiler (profiler.c) ---- */

typedef struct ct_profiler ct_profiler;
/* At the start of training, when flops_profiler.enabled (rank 0): CT_ERR_CONFIG when its
 * output_file cannot be written; a profile_step past the run's steps is a warning. */
int ct_trainer_profiler_open(ct_trainer *t, ct_err *err);
/* The executor hooks for a micro-batch of optimizer step `step` (1-based) run on graph g: the
 * trainer's own (t->m.hooks), or at the profiled step the profiler's, which time every layer
 * around them. */
const ct_exec_hooks *ct_trainer_profiler_hooks(ct_trainer *t, long step, const ct_graph *g);
/* Step `step` is the profiled one and its layers were timed. */
bool ct_trainer_profiler_step(const ct_trainer *t, long step);
/* After the profiled step (others: nothing): its table, to output_file or the run's lines. */
void ct_trainer_profiler_report(ct_trainer *t, long step, int64_t samples, double step_s);
void ct_trainer_profiler_close(ct_trainer *t);

/* ---- NVMe offload's glue (nvme.c) ---- */

/* The compute copy from the master, wherever it is (ct_param_store_refresh, or the swap's files
 * chunk by chunk): after the initialiser, a resume, init_from or a load. An I/O error names the file. */
int ct_trainer_refresh_params(ct_trainer *t, ct_err *err);

/* ---- the loop (loop.c) ---- */

/* Whole-eval-set loss and accuracy (accuracy NAN when not classification), with the parameters
 * as forward reads them (under mixed precision the 16-bit copy the last update or load wrote). */
int ct_trainer_evaluate(ct_trainer *t, double *loss, double *accuracy, ct_err *err);

/* ---- checkpoints (checkpoint.c) ---- */

/* Open without the checkpoint step below (ctrain eval loads its own weights). */
int ct_trainer_open_bare(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                         ct_trainer **out, ct_err *err);
/* Before set-up (a training run, not eval or --dry-run): check that run_dir, save_dir and
 * --summary can be written, take run_dir/.lock for the run, and refuse a run_dir that holds
 * checkpoints of another experiment unless --resume names a checkpoint (CT_ERR_CONFIG). */
int ct_trainer_rundir_open(ct_trainer *t, ct_err *err);
/* After set-up: address the tensors, write <run_dir>/config.json, then resume (opts.resume) or,
 * when nothing was resumed, load model.init_from; then keep_last over save_dir (a run killed
 * before pruning). Sets ck.resumed and ck.resume_state. */
int ct_trainer_ckpt_start(ct_trainer *t, ct_err *err);
/* Save <save_dir>/global_step<st->step> (keep_last applied) and remember it in ck.last. */
int ct_trainer_ckpt_save(ct_trainer *t, const ct_ckpt_state *st, ct_err *err);
/* Save <save_dir>/best. */
int ct_trainer_ckpt_save_best(ct_trainer *t, const ct_ckpt_state *st, ct_err *err);
/* Load a checkpoint's model weights only (ctrain eval); *st receives its state. */
int ct_trainer_ckpt_load_model(ct_trainer *t, const char *dir, ct_ckpt_state *st, ct_err *err);
void ct_trainer_ckpt_close(ct_trainer *t);

#endif

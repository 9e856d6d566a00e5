/* train.h: the training loop: micro-steps, accumulation, optimizer step, eval, summary.
 *
 * Flow of one step (docs/DESIGN.md): per micro-batch, loader -> forward -> loss on the device
 * (its gradient times loss_scale * n_i / n) -> backward (grads +=); then the loss read once ->
 * gradient all-reduce -> sum of squares -> overflow check and global norm -> optimizer over the
 * store's range at the schedule's LR (unscale and clip folded in, the compute copy written; the
 * schedule advances) -> all-gather -> loss scaler -> report.
 * The run ends with one JSON summary line on stdout (and --summary FILE). */
#ifndef CT_TRAIN_H
#define CT_TRAIN_H

#include <stdio.h>

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/report/report.h"
#include "core/util/common.h"

typedef struct ct_run_opts {
    const char *resume;          /* NULL, "auto" or a checkpoint directory */
    bool strict_resume;          /* --strict-resume: a resume on data that changed since the
                                    checkpoint (its fingerprint) is CT_ERR_DATA, not a warning */
    const char *summary_path;    /* --summary FILE, or NULL */
    bool quiet;                  /* --quiet: no progress, only errors and the summary */
    bool weights_from_checkpoint;/* the caller loads every weight from a checkpoint right after
                                    opening (ctrain eval, --smoke's reload): no initialisation
                                    from the seed, whose draws would be overwritten */
    bool forward_only;           /* the caller only evaluates (ctrain eval, --smoke's reload): no
                                    gradients, no optimizer state, and the plan counts none (one
                                    process; a world of several ranks allocates as for training) */
    bool dry_run;                /* --dry-run: build the model and print its memory plan; open
                                    no data, allocate nothing, do not train */
    size_t device_memory;        /* --device-memory: plan --dry-run's tables for a device of this
                                    many bytes (0: the device it would run on) */
    size_t host_memory;          /* --host-memory: the host memory beside it for --dry-run's ZeRO
                                    table (0: MemAvailable now) */
    const char *batch_note;      /* printed under the start block's batch line: how an "auto"
                                    micro-batch was chosen (ct_fit_auto_micro_batch); NULL: none */
    char *oom_note;              /* filled at start, when train.memory_limit_gb is set, with the
                                    lines to print after an out-of-memory that ends the process
                                    (ct_fatal: the CPU backend's scratch past the cap); may be NULL */
    size_t oom_note_n;
    volatile int *stop_signal;   /* set to SIGINT/SIGTERM/SIGHUP by the CLI; checked per step: the
                                    step finishes, a checkpoint is saved, the run returns 128 + it */
    /* Called after every optimizer step (as ct_trainer_on_step); NULL: none. The CLI copies the
     * summary there, for the line it prints when a second SIGINT ends the run at once. */
    void (*on_step)(void *ctx, long step, double loss);
    void *on_step_ctx;
    /* Called after every eval once the summary holds its numbers (with on_step_ctx); NULL: none. The
     * CLI copies the summary there too, so a second SIGINT after an eval reports its loss. */
    void (*on_eval)(void *ctx, long step);
    /* Which rank of how many this process is (core/dist/launch.h); NULL: rank 0 of
     * cfg->world_size. Only rank 0 prints, writes the run directory and checkpoints. */
    const struct ct_launch *launch;
    long profile_steps;          /* --profile N: a profiling run of N steps; its bottleneck report
                                    is printed even when no rule fires (core/train/diagnose.c) */
} ct_run_opts;

/* Train (or, with opts->dry_run, print the plan and return). Fills summary in every case. */
int ct_train_run(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary, ct_err *err);

/* The same run in three parts, for tests and tools that need the model between them:
 * open (backend, datasets, graph, parameter store initialised from the seed, optimizer; prints the
 * start block), fit (the loop; fills the summary), close. ct_train_run = open + fit + close
 * (with opts->dry_run: the plan alone, from the planner: no backend, no data, no allocation).
 * open sets *out even when it fails (the summary says why): close it in every case. */
typedef struct ct_trainer ct_trainer;
struct ct_optim;
struct ct_graph;
struct ct_param_store;
int ct_trainer_open(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                    ct_trainer **out, ct_err *err);
int ct_trainer_fit(ct_trainer *t, ct_err *err);
void ct_trainer_close(ct_trainer *t);
/* The parameter store holds the flat fp32 master, the compute copy, gradients and buffers
 * (core/params/store.h); the optimizer holds only its state. */
struct ct_param_store *ct_trainer_params(ct_trainer *t);
struct ct_optim *ct_trainer_optim(ct_trainer *t);
const struct ct_graph *ct_trainer_graph(const ct_trainer *t);
/* The backend the trainer's buffers live on (copy_d2h/copy_h2d to read or write them). */
ct_backend *ct_trainer_backend(ct_trainer *t);
/* A fresh trainer on cfg (nothing printed, no resume), the model weights of checkpoint dir
 * loaded (*step: its step), then one pass over data.eval: *loss and *accuracy (NAN without an eval
 * set, accuracy also when not a classifier). For --smoke: the checkpoint a run saved, read back. */
int ct_train_load_eval(const ct_config *cfg, const char *dir, long *step, double *loss, double *accuracy,
                       ct_err *err);
/* `ctrain eval`: a fresh trainer on cfg (opts: quiet, summary_path; no resume, no init_from), the
 * model weights of checkpoint dir, one pass over data.eval, reported as a run reports an eval.
 * Fills summary (the checkpoint's steps, epochs and train loss; the eval loss and accuracy; the
 * status). CT_ERR_CONFIG when the config has no data.eval. */
int ct_train_eval_checkpoint(const ct_config *cfg, const ct_run_opts *opts, const char *dir,
                             ct_summary *summary, ct_err *err);
/* The summary's "hparams" from the resolved config (after the auto micro-batch is chosen). */
void ct_train_summary_hparams(ct_summary *s, const ct_config *cfg);
/* Called after every optimizer step with its 1-based number and mean loss. */
void ct_trainer_on_step(ct_trainer *t, void (*fn)(void *ctx, long step, double loss), void *ctx);

#endif

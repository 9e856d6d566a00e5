/* train.h: the training loop: micro-steps, accumulation, optimizer step, eval, summary.
 *
 * Flow of one step (DESIGN.md): loader -> forward -> loss * scale / accum -> backward (grads +=)
 * ... accum times ... -> overflow check -> unscale + clip -> optimizer on fp32 master -> scheduler
 * -> report. The run ends with one JSON summary line on stdout (and --summary FILE). */
#ifndef CT_TRAIN_H
#define CT_TRAIN_H

#include <stdio.h>

#include "core/util/common.h"
#include "core/backend/backend.h"
#include "core/config/config.h"

typedef struct ct_run_opts {
    const char *resume;          /* NULL, "auto" or a checkpoint directory */
    const char *summary_path;    /* --summary FILE, or NULL */
    bool quiet;                  /* --quiet: no progress, only errors and the summary */
    bool dry_run;                /* --dry-run: build everything, print the plan, do not train */
    volatile int *stop_signal;   /* set to SIGINT/SIGTERM by the CLI's handler; checked per step */
} ct_run_opts;

/* The summary printed at the end of every run (DESIGN.md lists the keys; scripts rely on them). */
typedef struct ct_summary {
    char status[16];             /* ok, early_stopped, diverged, interrupted, error */
    long steps;                  /* optimizer steps (applied + skipped) */
    int epochs;                  /* epochs started */
    double train_loss;           /* mean loss over the last steps_per_print window / last epoch */
    double eval_loss;            /* NAN when no eval ran */
    double eval_accuracy;        /* NAN when not a classification task or no eval */
    double wall_s;
    double samples_per_s;
    double tokens_per_s;         /* NAN unless a language model */
    size_t peak_host_bytes;
    size_t peak_device_bytes;
    double loss_scale;           /* NAN when not fp16 */
    long skipped_steps;
    char run_dir[1024];
    char error[512];             /* first line of the error when status is "error" */
    double first_step_s;         /* process age when the first training step began; NAN if none */
    double data_wait_share;      /* fraction of training-step time spent waiting for the loader */
    /* Peak bytes per memory category (backend.h ct_mem_cat: device memory on a GPU, the
     * backend's host allocations on the CPU); written as "peak_bytes_by_category". */
    size_t peak_by_cat[CT_MEM_CAT_COUNT];
    bool has_mem_stats;
} ct_summary;

void ct_summary_init(ct_summary *s);
/* One line of JSON, no trailing newline in the buffer-less form: writes it plus "\n" to f. */
void ct_summary_write(const ct_summary *s, FILE *f);

/* Train (or, with opts->dry_run, print the plan and return). Fills summary in every case. */
int ct_train_run(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary, ct_err *err);

/* The same run in three parts, for tests and tools that need the model between them:
 * open (backend, datasets, graph, flat buffers, parameters initialised from the seed; prints the
 * start block), fit (the loop; fills the summary), close. ct_train_run = open + fit + close.
 * open sets *out even when it fails (the summary says why): close it in every case. */
typedef struct ct_trainer ct_trainer;
struct ct_optim;
struct ct_graph;
int ct_trainer_open(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                    ct_trainer **out, ct_err *err);
int ct_trainer_fit(ct_trainer *t, ct_err *err);
void ct_trainer_close(ct_trainer *t);
/* The optimizer owns the flat fp32 parameters (o->params), gradients and state. */
struct ct_optim *ct_trainer_optim(ct_trainer *t);
const struct ct_graph *ct_trainer_graph(const ct_trainer *t);
/* The backend the trainer's buffers live on (copy_d2h/copy_h2d to read or write them). */
ct_backend *ct_trainer_backend(ct_trainer *t);
/* Called after every optimizer step with its 1-based number and mean loss. */
void ct_trainer_on_step(ct_trainer *t, void (*fn)(void *ctx, long step, double loss), void *ctx);

#endif

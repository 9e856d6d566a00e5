/* train_impl.h: the trainer's state, shared by train.c (open, plan, close) and train_loop.c. */
#ifndef CT_TRAIN_IMPL_H
#define CT_TRAIN_IMPL_H

#include "core/optim/amp.h"
#include "core/backend/backend.h"
#include "core/ckpt/ckpt.h"
#include "core/data/loader.h"
#include "core/data/dataset.h"
#include "core/graph/graph.h"
#include "core/optim/optim.h"
#include "core/report/report.h"
#include "core/train/train.h"
#include "core/train/step_capture.h"

struct ct_trainer {
    const ct_config *cfg;
    ct_run_opts opts;
    ct_summary *sum;
    double t_open;               /* ct_now() when ct_trainer_open began */

    ct_backend *be;
    ct_graph *g;
    const ct_graph_info *info;
    ct_optim *opt;               /* params, grads, optimizer state */
    float *buffers;              /* [n_buffers] running statistics */
    ct_amp *amp;                 /* precision policy: 16-bit parameter copy, loss scaler */
    ct_step_runner runner;       /* micro-batch forward + backward, captured when it can be */

    ct_dataset *train_ds, *eval_ds;
    ct_loader *train_l, *eval_l; /* threaded loaders: micro-batches in order (loader.h) */
    ct_warnings warn;            /* run-time warnings (the loader's), printed after set-up */
    int64_t epoch_samples;       /* train samples used per epoch (drop_last cuts to whole steps) */
    bool shuffle;

    long steps_per_epoch, total_steps; /* total_steps: planned optimizer steps */
    int epochs_planned;          /* epochs the planned steps touch */
    ct_report rep;

    void (*on_step)(void *ctx, long step, double loss);
    void *on_step_ctx;

    /* Checkpoints (train_ckpt.c). ck addresses host memory: the optimizer's buffers on the CPU
     * backend, host staging copies of them on a device backend. */
    ct_ckpt_tensors ck;
    bool ck_staged;              /* ck points at staging buffers (device backend) */
    bool resumed;                /* resume_state holds the checkpoint this run continues */
    ct_ckpt_state resume_state;
    char config_hash[17];        /* of cfg->resolved, recorded in every checkpoint */
    char last_ckpt[4096];        /* the newest checkpoint this run saved or resumed from ("": none) */
};

/* Set the summary's status and, when err is given, its error field (the message's first line). */
void ct_trainer_set_status(ct_trainer *t, const char *status, const ct_err *err);
/* Fill wall time and peak memory into the summary. */
void ct_trainer_finish(ct_trainer *t);

/* Whole-eval-set loss and accuracy (accuracy NAN when not classification), with the parameters
 * as forward reads them (under mixed precision the 16-bit copy the last update or load wrote). */
int ct_trainer_evaluate(ct_trainer *t, double *loss, double *accuracy, ct_err *err);

/* ---- checkpoints (train_ckpt.c) ---- */

/* Open without the checkpoint step below (ctrain eval loads its own weights). */
int ct_trainer_open_bare(const ct_config *cfg, const ct_run_opts *opts, ct_summary *summary,
                         ct_trainer **out, ct_err *err);
/* After set-up: address the tensors, write <run_dir>/config.json, then resume (opts.resume) or,
 * when nothing was resumed, load model.init_from. Sets t->resumed and t->resume_state. */
int ct_trainer_ckpt_start(ct_trainer *t, ct_err *err);
/* Save <save_dir>/global_step<st->step> (keep_last applied) and remember it in last_ckpt. */
int ct_trainer_ckpt_save(ct_trainer *t, const ct_ckpt_state *st, ct_err *err);
/* Save <save_dir>/best. */
int ct_trainer_ckpt_save_best(ct_trainer *t, const ct_ckpt_state *st, ct_err *err);
/* Load a checkpoint's model weights only (ctrain eval); *st receives its state. */
int ct_trainer_ckpt_load_model(ct_trainer *t, const char *dir, ct_ckpt_state *st, ct_err *err);
void ct_trainer_ckpt_close(ct_trainer *t);

#endif

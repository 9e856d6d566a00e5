/* train_impl.h: the trainer's state, shared by train.c (open, plan, close) and train_loop.c. */
#ifndef CT_TRAIN_IMPL_H
#define CT_TRAIN_IMPL_H

#include "core/backend.h"
#include "core/data/loader.h"
#include "core/data/dataset.h"
#include "core/graph.h"
#include "core/optim.h"
#include "core/report.h"
#include "core/train.h"

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
};

/* Set the summary's status and, when err is given, its error field (the message's first line). */
void ct_trainer_set_status(ct_trainer *t, const char *status, const ct_err *err);
/* Fill wall time and peak memory into the summary. */
void ct_trainer_finish(ct_trainer *t);

/* Whole-eval-set loss and accuracy (accuracy NAN when not classification). */
int ct_trainer_evaluate(ct_trainer *t, double *loss, double *accuracy, ct_err *err);

#endif

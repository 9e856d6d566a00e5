/* train_graph.h: one micro-batch's forward + backward, run directly or replayed from a capture.
 *
 * train.cuda_graph on a backend with capture (CUDA): the first micro-batch with a given set of
 * pointers and scalars runs directly, the second is captured (forward, loss, backward) and every
 * later one with the same key replays it: one launch instead of one per op. The key is everything a capture bakes in: the
 * input, target and parameter pointers, the sample count and loss_grad_scale (it changes with
 * the fp16 loss scale and on a short last step). Per-step randomness would be baked in too, so
 * models with dropout are never captured. A failed capture runs the step directly; a key whose
 * capture failed CT_STEP_CAPTURE_TRIES times switches capture off for the run, with one notice. */
#ifndef CT_TRAIN_GRAPH_H
#define CT_TRAIN_GRAPH_H

#include "core/backend/backend.h"
#include "core/graph/graph.h"

#define CT_STEP_GRAPHS 4
#define CT_STEP_CAPTURE_TRIES 2   /* captures tried per key before capture is switched off */

typedef struct ct_step_graph {
    const void *input, *target, *params;
    int64_t n;
    float loss_grad_scale;
    void *graph;                 /* backend handle; NULL: seen once, not captured yet */
    bool used;                   /* the slot holds a key */
    int failures;                /* failed captures of this key */
    uint64_t last_use;
} ct_step_graph;

typedef struct ct_step_runner {
    ct_backend *be;
    ct_graph *g;
    bool capture;                /* capture and replay (else run directly) */
    ct_step_graph slot[CT_STEP_GRAPHS];
    uint64_t clock;
    long captures, replays;      /* for the report and tests */
} ct_step_runner;

/* Decide whether to capture: cuda_graph is CT_CUDA_GRAPH_{AUTO,OFF,ON}. Errors (CT_ERR_CONFIG):
 * ON with a dropout layer. ON on a backend without capture is a notice in *notice (may be "").
 * micro-batch shapes that differ only in n are captured separately. */
int ct_step_runner_init(ct_step_runner *r, ct_backend *be, ct_graph *g, int cuda_graph,
                        char *notice, size_t notice_n, ct_err *err);
/* Forward (train mode) + backward of io with params, accumulating into grads; fills io->loss and
 * io->correct. The caller must not change params or grads pointers between calls without
 * ct_step_runner_reset. */
int ct_step_run(ct_step_runner *r, const void *params, float *buffers, float *grads, ct_step_io *io,
                ct_err *err);
/* Drop every capture (pointers changed) and free them. */
void ct_step_runner_reset(ct_step_runner *r);

#endif

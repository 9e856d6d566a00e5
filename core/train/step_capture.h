/* step_capture.h: one micro-batch's forward + loss + backward, run directly or replayed from a
 * capture.
 *
 * train.cuda_graph on a backend with capture (CUDA): the first micro-batch with a given set of
 * pointers and scalars runs directly, the second is captured (forward, loss, backward) and every
 * later one with the same key replays it: one launch instead of one per op. The key is everything a capture bakes in: the
 * input, target and parameter pointers, the sample count and loss_grad_scale (it changes with
 * the fp16 loss scale and on a short last step). Per-step randomness would be baked in too, so
 * models with dropout are never captured. A failed capture runs the step directly; a key whose
 * capture failed CT_STEP_CAPTURE_TRIES times switches capture off for the run, with one notice.
 * Steps whose executor hooks do host work (ct_exec_hooks.host_work) always run directly, and so
 * do timed steps (wall_clock_breakdown): a replay has no place for a mark between forward and
 * backward. */
#ifndef CT_TRAIN_STEP_CAPTURE_H
#define CT_TRAIN_STEP_CAPTURE_H

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
    bool timed;                  /* wall_clock_breakdown: run directly, mark the forward's end */
    uint64_t fwd_end;            /* timed: the backend's timer mark (timer_mark) taken between
                                    the last micro-batch's forward and its backward */
} ct_step_runner;

/* Decide whether to capture: cuda_graph is CT_CUDA_GRAPH_{AUTO,OFF,ON}. Errors (CT_ERR_CONFIG):
 * ON with a layer that draws random numbers (dropout). ON on a backend without capture is a
 * notice in *notice (may be ""). Micro-batch shapes that differ only in n are captured
 * separately. */
int ct_step_runner_init(ct_step_runner *r, ct_backend *be, ct_graph *g, int cuda_graph,
                        char *notice, size_t notice_n, ct_err *err);
/* Forward (train mode) + loss + backward of io, accumulating into b->grads, with the executor
 * hooks (may be NULL). The loss stays on the device (ct_graph_loss_result; io->loss is not
 * filled). The caller must not change the buffers' pointers between calls without
 * ct_step_runner_reset. */
int ct_step_run(ct_step_runner *r, const ct_exec_bufs *b, ct_step_io *io, const ct_exec_hooks *hooks,
                ct_err *err);
/* Drop every capture (pointers changed) and free them. */
void ct_step_runner_reset(ct_step_runner *r);

#endif

/* step_capture.c: capture and replay of one micro-batch (step_capture.h). */
#include <stdio.h>
#include <string.h>

#include "core/graph/layer.h"
#include "core/train/step_capture.h"

/* The first layer that draws random numbers (dropout), or -1. */
static int random_layer(const ct_graph *g) {
    int n = ct_graph_info_get(g)->n_layers;
    for (int j = 0; j < n; j++)
        if (ct_graph_layer_flags(g, j) & CT_LAYER_RANDOM) return j;
    return -1;
}

int ct_step_runner_init(ct_step_runner *r, ct_backend *be, ct_graph *g, int cuda_graph,
                        char *notice, size_t notice_n, ct_err *err) {
    *r = (ct_step_runner){.be = be, .g = g};
    if (notice_n) notice[0] = '\0';
    if (cuda_graph == CT_CUDA_GRAPH_OFF) return CT_OK;
    bool can = be->capture.begin && be->capture.end && be->capture.replay && be->capture.free;
    int drop = random_layer(g);
    if (cuda_graph == CT_CUDA_GRAPH_ON && drop >= 0)
        return ct_errf(err, CT_ERR_CONFIG, "train.cuda_graph is true but layer \"%s\" is %s: a "
                       "captured step would replay the same random numbers (dropout mask) every "
                       "step; set train.cuda_graph to \"auto\" or false", ct_graph_layer_name(g, drop),
                       ct_graph_layer_type(g, drop));
    /* activation offload queues its copies from the host, step by step (core/graph/offload.c) */
    if (ct_graph_offloads(g)) {
        if (cuda_graph == CT_CUDA_GRAPH_ON)
            snprintf(notice, notice_n, "train.cuda_graph: activation_checkpointing.cpu_checkpointing queues its "
                     "copies to and from host memory from the host every step, which a captured step would not "
                     "repeat; running steps directly");
        return CT_OK;
    }
    /* synchronize_checkpoint_boundary and profile wait for the device inside the step */
    if (ct_graph_syncs_segments(g)) {
        if (cuda_graph == CT_CUDA_GRAPH_ON)
            snprintf(notice, notice_n, "train.cuda_graph: activation_checkpointing.%s waits for the device at "
                     "every checkpointed segment's edges, which a captured step would not repeat; running steps "
                     "directly", ct_graph_segment_times(g, &(int){0}) ? "profile" : "synchronize_checkpoint_boundary");
        return CT_OK;
    }
    if (cuda_graph == CT_CUDA_GRAPH_ON && !can)
        snprintf(notice, notice_n, "train.cuda_graph: the %s backend cannot capture steps; running "
                 "them directly", be->name);
    r->capture = can && drop < 0;
    return CT_OK;
}

void ct_step_runner_reset(ct_step_runner *r) {
    for (int i = 0; i < CT_STEP_GRAPHS; i++) {
        if (r->slot[i].graph) r->be->capture.free(r->be, r->slot[i].graph);
        r->slot[i] = (ct_step_graph){0};
    }
}

static int run_direct(ct_step_runner *r, const ct_exec_bufs *b, ct_step_io *io,
                      const ct_exec_hooks *hooks, ct_err *err) {
    int rc = ct_graph_forward(r->g, b, io, hooks, err);
    if (r->timed) r->fwd_end = r->be->queue.timer_mark(r->be);
    if (!rc) rc = ct_graph_backward(r->g, b, io, hooks, err);
    return rc;
}

static bool key_eq(const ct_step_graph *s, const void *params, const ct_step_io *io) {
    return s->used && s->input == io->input && s->target == io->target && s->params == params &&
           s->n == io->n && s->loss_grad_scale == io->loss_grad_scale;
}

/* A slot for a new key: an unused one, else the least recently used (its graph freed). */
static ct_step_graph *victim(ct_step_runner *r) {
    ct_step_graph *v = &r->slot[0];
    for (int i = 0; i < CT_STEP_GRAPHS; i++) {
        if (!r->slot[i].used) return &r->slot[i];
        if (r->slot[i].last_use < v->last_use) v = &r->slot[i];
    }
    if (v->graph) r->be->capture.free(r->be, v->graph);
    *v = (ct_step_graph){0};
    return v;
}

/* Record forward + backward into slot s. Returns the step's own error (err filled), or CT_OK with
 * s->graph set, or with s->graph NULL when the capture failed. A key gets CT_STEP_CAPTURE_TRIES
 * captures (a failure is an op a graph cannot hold, or the device out of memory: a cache miss
 * no longer fails, the allocator then calls cudaMalloc under a relaxed capture mode); after the
 * last try capture is off for the run. */
static int capture(ct_step_runner *r, ct_step_graph *s, const ct_exec_bufs *b, ct_step_io *io,
                   const ct_exec_hooks *hooks, ct_err *err) {
    ct_err cerr = {0};
    if (r->be->capture.begin(r->be, &cerr) == CT_OK) {
        int rc = run_direct(r, b, io, hooks, err);
        void *graph = r->be->capture.end(r->be, &cerr);
        if (rc) {
            if (graph) r->be->capture.free(r->be, graph);
            return rc;
        }
        if (graph) {
            s->graph = graph;
            r->captures++;
            return CT_OK;
        }
    }
    if (++s->failures < CT_STEP_CAPTURE_TRIES) return CT_OK;
    fprintf(stderr, "ctrain: notice: CUDA graph capture failed (%s); running steps without it\n",
            cerr.msg[0] ? cerr.msg : "no reason given");
    ct_step_runner_reset(r);
    r->capture = false;
    return CT_OK;
}

/* A key's first micro-batch runs directly (it also fills the allocator's cache with the scratch
 * blocks the ops use, so a capture rarely has to allocate), its second is captured and
 * replayed, and every later one is replayed. One-off keys, such as an epoch's short last step,
 * are never captured. */
int ct_step_run(ct_step_runner *r, const ct_exec_bufs *b, ct_step_io *io, const ct_exec_hooks *hooks,
                ct_err *err) {
    io->defer_loss = true;
    bool capture_on = r->capture && !r->timed && !(hooks && hooks->host_work);
    ct_step_graph *s = NULL;
    for (int i = 0; capture_on && i < CT_STEP_GRAPHS && !s; i++)
        if (key_eq(&r->slot[i], b->params, io)) s = &r->slot[i];
    if (capture_on && !s) {
        s = victim(r);
        *s = (ct_step_graph){.input = io->input, .target = io->target, .params = b->params, .n = io->n,
                             .loss_grad_scale = io->loss_grad_scale, .used = true};
        s->last_use = ++r->clock;
        s = NULL;                                   /* first sight: run directly */
    } else if (s && !s->graph) {
        int rc = capture(r, s, b, io, hooks, err);
        if (rc) return rc;
        if (!s->graph) s = NULL;                    /* capture failed: now off */
    }
    if (s) {
        s->last_use = ++r->clock;
        r->be->capture.replay(r->be, s->graph);
        r->replays++;
        return CT_OK;
    }
    return run_direct(r, b, io, hooks, err);
}

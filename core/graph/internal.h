/* internal.h: the graph's private layout, shared by the graph module's files: build.c (parse,
 * infer), param_specs.c (parameter views), plan.c (activation plan and binding), exec.c. */
#ifndef CT_GRAPH_INTERNAL_H
#define CT_GRAPH_INTERNAL_H

#include "core/graph/graph.h"
#include "core/graph/layer.h"

#define CT_NO_OFFSET ((size_t)-1)

typedef struct ct_gnode {
    ct_layer l;
    /* The activation plan (plan.c), as byte offsets in the arena; CT_NO_OFFSET: none. */
    int y_from;                         /* >= 0: runs in place, y is that producer's y */
    size_t y_off, aux_off, dy_off;
    /* Bound pointers (ct_graph_bind): y [batch, out] and dy in g->dt, aux. */
    void *y, *dy, *aux;
    /* Backward plan, fixed at build (see plan_backward): where input i's gradient goes. */
    int64_t tmp_off[CT_LAYER_MAX_IN];   /* -1: straight into the producer's dy; else offset in
                                           g->dtmp, then added to the producer's dy */
    bool runs_backward;                 /* false when no gradient reaches this layer's output */
    int grad_start;                     /* backward step (0 = last layer's) that first writes dy */
    /* Activation checkpointing (build.c marks, plan.c places, exec.c recomputes). */
    int group;                          /* block instance the layer was expanded in (a repeat
                                           iteration, a block type; the top level between them):
                                           marked layers form one segment per run in one group */
    bool in_block;                      /* expanded inside a repeat or a block type */
    int seg;                            /* checkpointed segment (index in g->segs), or -1 */
    bool kept;                          /* in a segment, but its output is kept through backward
                                           (the segment's last layer, or read after the segment) */
    bool recomputed;                    /* in a segment, and its recompute runs it: backward needs
                                           its output or saved state (ct_graph_mark_recompute) */
    /* The step's schedule (lifetime.c): when backward recomputes this layer (-1: never) and runs
     * its backward, on one time axis with forward (layer j at time j) and the loss (n_nodes). */
    int t_recompute, t_backward;
    /* Fusion (fuse.c, decided at bind): fused_with >= 0 is the in-place activation layer whose
     * work this layer does (fused_act, io->act); fused_into >= 0 is the producer that does this
     * layer's work, so this one runs only its hooks. -1: none. fused_pool >= 0: the max-pool
     * after the activation whose work this layer does too (io->pool); its fused_into is this one. */
    int fused_with, fused_into, fused_pool;
    ct_act fused_act;
} ct_gnode;

/* A closed interval of schedule times; empty while hi < lo. */
typedef struct ct_span {
    int lo, hi;
} ct_span;

/* A buffer to place by lifetime: `size` bytes busy over when[0..n_when). */
typedef struct ct_lifetime_item {
    size_t size;
    ct_span when[2];
    int n_when;
    int kind;                           /* the caller's category, for its report */
    size_t off;                         /* out: offset in the region (64-byte aligned) */
} ct_lifetime_item;

/* The plan's region placed by lifetime, kept as placed (outputs, saved state and output
 * gradients: the arena's first `bytes` bytes), so a check can tell which bytes are free at any
 * moment of the step (test_graph_memory poisons them). */
typedef struct ct_lifetime_region {
    ct_lifetime_item *items;
    int n;
    size_t bytes;
} ct_lifetime_region;

/* Activation offload (activation_checkpointing.cpu_checkpointing, offload.c): a kept output of a
 * checkpointed segment that goes to pinned host memory once forward is done with it and comes
 * back before backward needs it, so its device bytes serve other buffers in between (plan.c
 * places it by its two busy spans with everything else). */
typedef struct ct_offload_item {
    int owner;                          /* the layer whose y buffer it is (in-place layers over it
                                           share it) */
    size_t bytes;                       /* [batch, out] in g->dt */
    ct_span busy[2];                    /* on the device: forward to download, upload to last use */
    size_t host_off;                    /* offset in the pinned host copy */
    int written;                        /* forward layer after which its value is final */
    int download_at;                    /* forward layer after which the download is queued */
    int upload_mark;                    /* schedule time before which the upload may start */
    int upload_at;                      /* schedule time before which it must be back */
    uint64_t mark;                      /* run time: the compute mark the copy waits for */
} ct_offload_item;

/* A checkpointed segment: layers [lo, hi) whose inner outputs and saved state are busy only in
 * forward and again from the recompute (plan.c); backward runs its forward again
 * (CT_PASS_RECOMPUTE) before its backward. */
typedef struct ct_ckpt_seg {
    int lo, hi;
} ct_ckpt_seg;

struct ct_graph {
    ct_graph_info info;
    int64_t batch;                      /* build (maximum) micro-batch */
    ct_gnode *nodes;
    int n_nodes;
    ct_param_layout layout;             /* every layer's parameter views */
    double label_smoothing;
    ct_dtype dt;                        /* storage of activations, their gradients, parameters */
    ct_act_plan plan;                   /* offsets of the shared parts below */
    cJSON **expanded;                   /* the layer arrays block types expanded into: the layers'
                                           config nodes point into them */
    int n_expanded;
    ct_ckpt_seg *segs;                  /* checkpointed segments, in layer order (ct_graph_segments) */
    int n_segs;
    size_t ws_off, dtmp_off, input_off, loss_off;
    /* The chunked LM head (model.loss.chunk_rows; plan.c decides, exec.c runs it): the last
     * layer and the cross-entropy loss run together in forward, head_chunk rows at a time, the
     * last layer's y being one chunk's logits [head_chunk, padded_classes]. */
    int64_t head_chunk_req;             /* the config's: CT_HEAD_CHUNK_AUTO, 0 (off) or rows */
    int64_t head_chunk;                 /* rows per chunk; 0: the head is not chunked */
    bool offload;                       /* cpu_checkpointing asked for (ct_graph_build) */
    bool sync_segments;                 /* synchronize_checkpoint_boundary (ct_graph_build) */
    ct_segment_times *seg_times;        /* profile: [n_segs] (ct_graph_segments); else NULL */
    double seg_started;                 /* profile: ct_now() at the open segment pass's start */
    ct_offload_item *off;               /* kept outputs moved to host memory (offload on, segments) */
    int n_off;
    ct_lifetime_region placed;          /* the plan's lifetime region as placed (plan.c) */

    /* Bound by ct_graph_bind. */
    ct_backend *be;
    void *arena;                        /* plan.total bytes of be's memory */
    bool owns_arena;
    void *ws;                           /* shared workspace */
    void *dtmp;                         /* fan-out gradient scratch (dt) */
    void *input;                        /* [batch, input] model input converted to dt (NULL when
                                           dt is fp32 or the input is token ids) */
    float *loss_result;                 /* [2] mean loss, correct count: the loss ops' result */
    void *host;                         /* plan.host bytes of pinned host memory (offload) */
    ct_backend *host_be;                /* the backend that allocated it */
    float loss_grad_scale;              /* the scale the last train-mode loss used (see backward) */
    bool loss_train;                    /* the last loss wrote d(loss) (train mode) */
};

#define CT_HEAD_CHUNK_AUTO (-1)
/* "auto": chunk the head when its whole logits would exceed this, in chunks of at most this. */
#define CT_HEAD_CHUNK_AUTO_BYTES ((size_t)32 << 20)

/* True when the model can run a chunked head: the cross-entropy loss over a last layer that
 * computes rows one by one (ct_layer_type.forward_rows) from one activation input. */
bool ct_graph_head_chunkable(const ct_graph *g);

/* The build steps (build.c calls them in this order). */
int ct_graph_layout_params(ct_graph *g, ct_err *err);   /* param_specs.c */
int ct_graph_segments(ct_graph *g, const ct_config *cfg, long choice, ct_err *err);   /* segments.c */
/* segments.c, for plan.c once gn->kept and gn->runs_backward are known: which layers of the
 * segments their recompute runs (gn->recomputed). alias[j]: the producer layer j runs in place
 * over, or -1. */
void ct_graph_mark_recompute(ct_graph *g, const int *alias);
/* fuse.c: which adjacent layers run as one on g->be (ct_graph_bind calls it). */
void ct_graph_fuse(ct_graph *g);
/* fuse.c: for a max-pool q that a conv + relu before it could compute on some backend (the graph's
 * shape alone: y_from set, plan.c), that producer's index; else -1. */
int ct_graph_pool_producer(const ct_graph *g, int q);
void ct_graph_plan_memory(ct_graph *g);                 /* plan.c */

/* lifetime.c. The step's schedule: sets every node's t_recompute (recomputed layers only) and
 * t_backward (forward of layer j is at time j, the loss at n_nodes); times run below
 * ct_graph_schedule_end. ct_segment_entry: when backward enters segment s (its first recompute,
 * or its last layer's backward when it recomputes nothing). */
void ct_graph_schedule(ct_graph *g);
int ct_graph_schedule_end(const ct_graph *g);
int ct_segment_entry(const ct_graph *g, int s);

void ct_span_touch(ct_span *s, int t);   /* grow s to hold time t (t < 0: no change) */
bool ct_span_overlap(ct_span a, ct_span b);
/* When the buffer of owner o is used (every layer j with root[j] == o writes it: o and the layers
 * running in place over it): in forward (writes, reads) and from the loss on (recomputes that
 * write or read it, backwards that read it: a writer's that reads its output, a reader's that
 * reads its input; a type that does not say counts as reading). *written: the last forward
 * writer. */
void ct_buffer_uses(const ct_graph *g, const int *root, int o, ct_span *fw, ct_span *bw, int *written);

/* Give every item an offset such that items busy at the same time never share a byte; returns
 * the region's size (greedy by size, lowest offset that fits). */
size_t ct_lifetime_pack(ct_lifetime_item *items, int n);

/* offload.c. Plan (after ct_graph_schedule): fill g->off with the kept outputs of checkpointed
 * segments that wait in host memory (their device spans, host offsets, copy times) and set *host
 * to the pinned host bytes. alias[j]: the producer whose buffer layer j runs in place over. */
void ct_offload_plan(ct_graph *g, const int *alias, size_t *host);
/* Run: the copies due after layer j's forward, and before schedule time t in backward, of a
 * micro-batch of n samples. */
void ct_offload_after_forward(ct_graph *g, int j, int64_t n);
void ct_offload_before(ct_graph *g, int t, int64_t n);

#endif

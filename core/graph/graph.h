/* graph.h: the layer graph built from config.model, its activation plan, and the executor.
 *
 * ct_graph_build() parses model.layers (expanding "repeat" blocks), resolves "inputs" names,
 * infers every shape once for a given micro-batch size and dtype, lays out the parameter views
 * (core/params/layout.h) and plans the activation memory: offsets inside one arena, by lifetime.
 * Building touches no backend and allocates no tensor memory, so a model that would not fit can
 * still be built and planned (--dry-run). ct_graph_bind() then places the plan in an arena on a
 * backend. Errors name the layer ("model.layers[3] \"fc2\" (linear): ...") and are CT_ERR_CONFIG.
 *
 * The executor runs a range of layers forward or backward, and the loss as its own call. Before a
 * layer runs, an optional prepare hook sees the layer's pointers and may redirect its parameters
 * and parameter gradients (ZeRO-3 gathers into scratch, ZeRO-2 gradient buckets) or fail; an
 * after hook runs once the layer's work is queued (gradient buckets to the communicator, the
 * profiler). Re-running a range forward with the recompute pass gives the same activations
 * (dropout masks are keyed by step and layer) without touching running statistics again: that is
 * what activation checkpointing builds on. Layers know nothing of any of it. */
#ifndef CT_GRAPH_H
#define CT_GRAPH_H

#include <cjson/cJSON.h>

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/params/layout.h"
#include "core/util/common.h"
#include "core/util/tensor.h"

typedef struct ct_graph ct_graph;

typedef struct ct_graph_info {
    int64_t n_params;            /* extent of the trainable space (layout.h; padding included) */
    int64_t n_param_elems;       /* trainable elements, each tensor once */
    int64_t n_buffers;           /* extent of the buffer space (running statistics) */
    int n_layers;
    double flops_per_sample;     /* forward FLOPs; training step ~ 3x */
    ct_shape input_shape;        /* per sample, without N */
    ct_dtype input_dtype;        /* CT_F32 for images/features, CT_I32 for tokens */
    int64_t input_ids_below;     /* CT_I32 input: every id must be < this (the smallest vocabulary of
                                    the layers reading the ids); 0: not token ids */
    ct_shape output_shape;       /* per sample */
    ct_loss_kind loss;
    int64_t classes;             /* cross entropy: number of classes predicted; else 0 */
    int64_t padded_classes;      /* cross entropy: outputs per row (classes + vocabulary padding) */
    ct_dtype target_dtype;       /* CT_I32 labels or CT_F32 targets */
    ct_shape target_shape;       /* per sample */
} ct_graph_info;

/* The activation plan: one arena of `total` bytes, each part 64-byte aligned. Layer outputs,
 * saved state and output gradients are placed together by lifetime over the step's schedule
 * (forward, loss, backward with its recomputes), so memory one frees is reused by later ones;
 * outputs, aux, grads and recompute are what each of them holds at the step's busiest moment,
 * and gaps what the placement loses to fragmentation then (the four and gaps add up to the
 * placed region). */
typedef struct ct_act_plan {
    size_t outputs;              /* layer outputs kept through backward (a relu-like layer
                                    writes over its input), and the offload slots */
    size_t aux;                  /* forward-to-backward state (masks, saved statistics) */
    size_t grads;                /* output gradients */
    size_t recompute;            /* activation checkpointing: inner outputs and saved state of
                                    checkpointed segments (busy in forward, then again from the
                                    segment's recompute to its backward); 0 without it */
    size_t gaps;                 /* the placed region less the four above */
    size_t scratch;              /* fan-out gradient scratch (a second consumer's dx) */
    size_t input;                /* the 16-bit copy of a float model input */
    size_t workspace;            /* shared layer workspace: the largest any layer declares */
    size_t loss;                 /* the loss ops' result */
    int segments;                /* checkpointed segments (recomputed in backward) */
    int offloaded;               /* activation offload (cpu_checkpointing): kept outputs of
                                    checkpointed segments that wait in host memory between their
                                    forward and backward uses; their device slots are shared by
                                    lifetime and counted in `outputs` */
    size_t host;                 /* outside the arena: their pinned host copies */
    size_t total;                /* the arena: every field above but offloaded, host and
                                    device_scratch */
    size_t device_scratch;       /* outside the arena: the most a device backend's op takes as its
                                    own scratch (the layers' device_scratch_bytes) */
    int64_t head_chunk;          /* chunked LM head (model.loss.chunk_rows): rows per chunk, 0 when
                                    the head's logits exist whole */
    int64_t head_rows;           /* rows the head computes per micro-batch (build batch) */
    size_t head_logits;          /* bytes of the head's logits buffer: one chunk's when chunked,
                                    else the whole [head_rows, padded_classes] (in `outputs`) */
} ct_act_plan;

/* Build for a maximum micro-batch of `batch` samples, storing activations, their gradients and
 * the parameters forward/backward read in `dt` (CT_F32, or CT_F16/CT_BF16 under mixed precision;
 * core/optim/amp.h). Pure: no backend, no tensor memory. */
int ct_graph_build(const ct_config *cfg, int64_t batch, ct_dtype dt, ct_graph **out, ct_err *err);
/* The same model for sequences of seq_len positions (curriculum learning truncates samples): a
 * model.input [T] is built as [seq_len], 1 <= seq_len <= T; seq_len 0 is ct_graph_build. Whether
 * the parameters are the same as at T is the caller's to check (ct_param_layout_same): a
 * position_embedding's table is sized by its max_len, not by T. */
int ct_graph_build_seq(const ct_config *cfg, int64_t batch, ct_dtype dt, int64_t seq_len, ct_graph **out,
                       ct_err *err);
/* The same model with activation checkpointing other than the config's, for planning the
 * alternatives a run could take (core/train/fit.h): segments CT_SEGMENTS_CONFIG (-1) is the
 * config's (ct_graph_build_seq); 0 is none; N > 0 is N even segments, as
 * activation_checkpointing.number_checkpoints N, with any "checkpoint": true marks ignored. */
#define CT_SEGMENTS_CONFIG (-1L)
int ct_graph_build_with(const ct_config *cfg, int64_t batch, ct_dtype dt, int64_t seq_len, long segments,
                        ct_graph **out, ct_err *err);
void ct_graph_free(ct_graph *g);
/* Block instances of the model: iterations of a "repeat" and block types (a transformer_block),
 * each counted once; 0 for a model written as plain layers. */
int ct_graph_blocks(const ct_graph *g);
/* The largest "times" a "repeat" layer takes. */
#define CT_GRAPH_REPEAT_MAX 10000

const ct_graph_info *ct_graph_info_get(const ct_graph *g);
/* Training FLOPs (forward + backward) per sample, for MFU. A transformer (layers with a
 * sequence_mixing hook: causal attention) counts 6·N + 6·L·C·T per token, the convention of the
 * PaLM paper's appendix B as nanoGPT and llm.c use it (N parameters, L attention layers of width C
 * over T positions; causal attention's scores cost half of 12·L·C·T), so MFU compares with
 * theirs; any other model three times its layers' forward FLOPs. */
double ct_graph_train_flops_per_sample(const ct_graph *g);
const ct_param_layout *ct_graph_layout(const ct_graph *g);
const ct_act_plan *ct_graph_plan(const ct_graph *g);

/* Place the plan on backend be (and, with activation offload, plan->host bytes of be's pinned
 * host memory the graph owns): in `arena` (plan->total bytes of be's memory, kept by the
 * caller, which may share it between graphs that never run at the same time), or, when arena is
 * NULL, in an allocation the graph owns (CT_MEM_ACTIVATIONS; CT_ERR_RUNTIME when it fails).
 * Binding again moves the graph to the new arena. */
int ct_graph_bind(ct_graph *g, ct_backend *be, void *arena, ct_err *err);
/* The arena the graph is bound to (NULL before ct_graph_bind). */
void *ct_graph_arena(const ct_graph *g);

/* Short description: "3 layers: linear(784->512) relu ..." for the plan printout. */
void ct_graph_describe(const ct_graph *g, char *buf, size_t n);

/* ---- the executor ---- */

typedef enum {
    CT_PASS_FORWARD = 0,         /* forward of a micro-batch */
    CT_PASS_RECOMPUTE,           /* forward again over a range whose activations were dropped:
                                    same results, running statistics not updated again */
    CT_PASS_BACKWARD,
} ct_pass;

struct ct_layer_io;

/* Hooks around every layer the executor runs; any may be NULL. prepare runs after the executor
 * filled the layer's pointers and before they are used: it may replace io->p[s] and io->dp[s]
 * (parameters gathered into scratch, a gradient bucket) and may fail, which stops the walk with
 * its error. after runs once the layer's work is queued. host_work: the hooks do work on the host
 * that a captured step would not repeat (a collective, a wait), so steps that use them are never
 * captured (core/train/step_capture.h). */
typedef struct ct_exec_hooks {
    void *ctx;
    int (*prepare)(void *ctx, int layer, ct_pass pass, struct ct_layer_io *io, ct_err *err);
    int (*after)(void *ctx, int layer, ct_pass pass, const struct ct_layer_io *io, ct_err *err);
    bool host_work;
} ct_exec_hooks;

/* The flat buffers a pass reads and writes (core/params/store.h), in backend memory. */
typedef struct ct_exec_bufs {
    const void *params;          /* [n_params] in the graph's dtype */
    float *grads;                /* [n_params] fp32, accumulated by backward (NULL in forward) */
    float *buffers;              /* [n_buffers] fp32 running statistics */
} ct_exec_bufs;

/* Generation with a key/value cache (core/train/generate.c): a forward in eval mode whose
 * attention layers keep each position's keys and values, so that the next token runs the model
 * over that one position instead of the whole window.
 *   fill:  a forward from position 0 of the graph built for T <= cap positions (the window, or
 *          the first positions of a prompt: ct_graph_build_seq): every layer computes as in any
 *          forward, and each attention layer also stores its keys and values of positions
 *          0 .. T - 1 in its cache (those past the real tokens are overwritten before any query
 *          reads them); rotary positions take the base of the window of cap (dynamic scaling);
 *   else:  a forward of the graph built for S new positions (ct_graph_build_seq) at positions
 *          pos0 .. pos0 + S - 1 (pos0 + S <= cap): position tables read their rows pos0 ..;
 *          attention layers store the new keys and values and attend over the cache's rows
 *          0 .. pos0 + t.
 * kv[j] is layer j's cache (ct_graph_layer_kv_bytes(g, j, cap) bytes of backend memory; NULL for
 * the layers that need none), the same for both graphs. Only graphs for which ct_graph_decodes
 * holds take a decode. */
typedef struct ct_decode {
    bool fill;
    int64_t pos0;
    int64_t cap;
    void *const *kv;
} ct_decode;

/* One micro-batch. `input` and `target` are in backend memory, n <= build batch. */
typedef struct ct_step_io {
    const void *input;           /* [n, input_shape] of input_dtype; a float input may be fp32 or
                                    already in the graph's dtype (input_dt) */
    ct_dtype input_dt;           /* CT_F32 (0, the default) or the graph's compute dtype */
    const void *target;          /* [n, target_shape] of target_dtype */
    int64_t n;
    bool train;                  /* train mode: dropout on, batchnorm batch stats + running update */
    uint64_t seed;               /* for dropout */
    uint64_t step;               /* micro-step counter, keys the dropout stream */
    float loss_grad_scale;       /* backward of (loss * this): loss_scale / grad_accum */
    bool hooks_only;             /* walk the layers calling only the hooks: no layer, no loss
                                    (input and target unread). ZeRO-2/3: a rank with no samples
                                    left for a micro-batch still joins every layer's collectives */
    const ct_decode *decode;     /* generation with a key/value cache (eval mode only); NULL: none */
    bool defer_loss;             /* ct_graph_forward leaves loss/correct in backend memory (read
                                    them with ct_graph_read_loss, or accumulate them on the device
                                    from ct_graph_loss_result): a step can be queued or captured
                                    whole */
    /* outputs */
    float loss;                  /* mean loss of the micro-batch (unscaled) */
    int64_t correct;             /* classification: correct argmax predictions */
} ct_step_io;

/* Layers [lo, hi) forward in order (pass CT_PASS_FORWARD), or again with CT_PASS_RECOMPUTE. The
 * inputs a range reads (outputs of layers before lo, the model input) must be in place. The
 * recompute pass leaves out the layers of checkpointed segments that backward does not need again
 * (no saved state, an output no backward reads: core/graph/segments.c), hooks and all. Outside
 * the segments, recompute only layers whose outputs some backward reads: the plan keeps no other
 * output past its last forward reader (core/graph/lifetime.c), so its bytes may hold another
 * buffer by then.
 * A chunked LM head (the plan's head_chunk > 0; model.loss.chunk_rows) runs with the loss when the
 * walk reaches the last layer: the loss result, and in train mode also the head's backward (its
 * parameter gradients ACCUMULATED into b->grads, its input's gradient written), between the head's
 * CT_PASS_BACKWARD hooks; the backward walk then skips the head. Without io->target (generation,
 * eval mode only) the walk stops before the head (ct_graph_logits). */
int ct_graph_forward_range(ct_graph *g, int lo, int hi, ct_pass pass, const ct_exec_bufs *b,
                           const ct_step_io *io, const ct_exec_hooks *hooks, ct_err *err);
/* The loss of the last layer's output; in train mode it also writes d(loss) * loss_grad_scale
 * into the last layer's output gradient, where backward starts. Leaves the result on the device
 * (ct_graph_loss_result). Nothing to do after a chunked head's forward, which computed it. */
int ct_graph_loss(ct_graph *g, const ct_step_io *io, ct_err *err);
/* Layers [lo, hi) backward, from hi - 1 down to lo: ACCUMULATES parameter gradients into
 * b->grads. The output gradients of the range's top layers must be in place (from the loss or
 * from the layers above hi). */
int ct_graph_backward_range(ct_graph *g, int lo, int hi, const ct_exec_bufs *b,
                            const ct_step_io *io, const ct_exec_hooks *hooks, ct_err *err);

/* The whole model: forward of [0, n) and the loss (then io->loss and io->correct unless
 * io->defer_loss), and backward of [0, n). */
int ct_graph_forward(ct_graph *g, const ct_exec_bufs *b, ct_step_io *io, const ct_exec_hooks *hooks,
                     ct_err *err);
int ct_graph_backward(ct_graph *g, const ct_exec_bufs *b, ct_step_io *io, const ct_exec_hooks *hooks,
                      ct_err *err);

/* The logits of rows [r0, r0 + rows) of the last forward's micro-batch (rows of the last layer's
 * output, padded_classes apart, in the graph's dtype, in backend memory). Unchunked: read from
 * the last layer's output after an eval-mode forward. Chunked head (model.loss.chunk_rows): a
 * forward without a target stops before the head, and this computes the rows now from the head's
 * input into the chunk buffer (rows <= the plan's head_chunk). For generation; b->params must be
 * whole. NULL with CT_ERR_RUNTIME in *err for rows out of range. */
const void *ct_graph_logits(ct_graph *g, const ct_exec_bufs *b, int64_t r0, int64_t rows, ct_err *err);

/* The last loss's result in backend memory: [0] mean loss, [1] correct predictions (fp32). */
const float *ct_graph_loss_result(const ct_graph *g);
/* Fill io->loss and io->correct from the last loss (waits for it). */
void ct_graph_read_loss(ct_graph *g, ct_step_io *io);

/* Whether the graph can generate with a key/value cache (ct_decode): its input is token ids [T]
 * and every layer computes each position from that position alone (CT_LAYER_PER_POSITION) or
 * takes a decode (CT_LAYER_DECODES: attention, position tables), each with the sequence as its
 * first dimension. false with the reason, naming the first layer that cannot, in why. */
bool ct_graph_decodes(const ct_graph *g, char *why, size_t n);
/* Bytes of layer j's key/value cache for positions 0 .. cap - 1 of the graph's build batch, in
 * its dtype (0: the layer keeps none). */
size_t ct_graph_layer_kv_bytes(const ct_graph *g, int layer, int64_t cap);

/* True when a training step copies activations to and from host memory (activation offload):
 * such a step makes host calls (copies, marks) that a captured step would not repeat. */
bool ct_graph_offloads(const ct_graph *g);

/* activation_checkpointing.synchronize_checkpoint_boundary and .profile, as DeepSpeed's (read at
 * build): the executor waits for the device (queue.sync) at each edge of a checkpointed segment's
 * forward, recompute and backward, and with profile times each of them between two such waits.
 * Either makes host calls in the step, which a captured step would not repeat. */
bool ct_graph_syncs_segments(const ct_graph *g);
/* profile: seconds a checkpointed segment spent in each pass since the last reset, and how many
 * micro-batches its forward ran for. */
typedef struct ct_segment_times {
    double forward_s, recompute_s, backward_s;
    long micro_batches;
} ct_segment_times;
/* The times of the n checkpointed segments (n = the plan's segments); NULL without profile. */
const ct_segment_times *ct_graph_segment_times(const ct_graph *g, int *n);
void ct_graph_segment_times_reset(ct_graph *g);

/* The dtype activations and parameters are stored in (ct_graph_build's dt). */
ct_dtype ct_graph_compute_dtype(const ct_graph *g);

/* Inspection (tests, debugging, profilers, generation): layer j's name, its type's name and flags
 * (CT_LAYER_* in layer.h), and its output activation and gradient buffers [build batch, out] in
 * backend memory and the graph's dtype, valid after forward / backward (but for what a fused pass
 * keeps in its scratch: the outputs of a conv2d and its relu whose max-pool is fused in, and their
 * gradients; core/graph/fuse.c). The last layer's output is often the same buffer as its gradient
 * (plan.c: the loss writes over the logits), so read logits after an eval-mode forward (io->train
 * false), not after a training one. */
const char *ct_graph_layer_name(const ct_graph *g, int layer);
const char *ct_graph_layer_type(const ct_graph *g, int layer);
unsigned ct_graph_layer_flags(const ct_graph *g, int layer);
/* Layer j's forward FLOPs per sample (its type's count; 0 for a type without one) and the
 * trainable elements it declares (a tied tensor is counted at the layer that owns it, so the
 * layers' counts add up to n_param_elems). For profilers. */
double ct_graph_layer_flops(const ct_graph *g, int layer);
int64_t ct_graph_layer_params(const ct_graph *g, int layer);
void *ct_graph_activation(const ct_graph *g, int layer);
void *ct_graph_activation_grad(const ct_graph *g, int layer);

#endif

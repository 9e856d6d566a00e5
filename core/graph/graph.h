/* graph.h: the layer graph built from config.model, and the executor that runs it.
 *
 * ct_graph_build() parses model.layers (expanding "repeat" blocks), resolves "inputs" names,
 * infers every shape once for a given micro-batch size, and lays out:
 *   - parameters: one flat fp32 buffer; every layer gets named views (ct_param_view)
 *   - activations and their gradients, with lifetimes, in backend memory
 * Errors name the layer ("model.layers[3] \"fc2\" (linear): ...") and are CT_ERR_CONFIG.
 *
 * The executor walks the layers in order for forward and in reverse for backward, and calls the
 * hooks of ct_exec_hooks before and after each layer (ZeRO-3 gathers, activation checkpointing,
 * gradient buckets and the profiler plug in there; layers know nothing of them). */
#ifndef CT_GRAPH_H
#define CT_GRAPH_H

#include <cjson/cJSON.h>

#include "core/backend/backend.h"
#include "core/util/common.h"
#include "core/config/config.h"
#include "core/util/tensor.h"

typedef struct ct_graph ct_graph;

typedef enum { CT_INIT_DEFAULT = 0, CT_INIT_ZEROS, CT_INIT_ONES, CT_INIT_CONSTANT, CT_INIT_UNIFORM,
               CT_INIT_NORMAL, CT_INIT_KAIMING_UNIFORM, CT_INIT_KAIMING_NORMAL, CT_INIT_XAVIER_UNIFORM,
               CT_INIT_XAVIER_NORMAL } ct_init_kind;

typedef struct ct_init_spec {
    ct_init_kind kind;
    double a, b;         /* uniform [a, b); normal mean a std b; constant a; kaiming: a = neg slope */
    int64_t fan_in, fan_out;
} ct_init_spec;

/* A named parameter (or buffer, e.g. batchnorm running statistics) inside the flat buffers. */
typedef struct ct_param_view {
    char name[128];      /* "<layer name>.weight", "<layer>.bias", "<layer>.running_mean" */
    ct_shape shape;
    int64_t offset;      /* element offset in the flat parameter buffer (or buffer-of-buffers) */
    int64_t numel;
    bool weight_decay;   /* false for biases and norm parameters */
    bool trainable;      /* false for buffers (running stats): no grad, no optimizer state */
    ct_init_spec init;
} ct_param_view;

typedef struct ct_graph_info {
    int64_t n_params;            /* trainable elements */
    int64_t n_buffers;           /* non-trainable elements (running statistics) */
    int n_layers;
    size_t activation_bytes;     /* forward activations + their gradients at the build batch */
    size_t workspace_bytes;
    double flops_per_sample;     /* forward FLOPs; training step ~ 3x */
    ct_shape input_shape;        /* per sample, without N */
    ct_dtype input_dtype;        /* CT_F32 for images/features, CT_I32 for tokens */
    ct_shape output_shape;       /* per sample */
    ct_loss_kind loss;
    int64_t classes;             /* cross entropy: number of classes; else 0 */
    ct_dtype target_dtype;       /* CT_I32 labels or CT_F32 targets */
    ct_shape target_shape;       /* per sample */
} ct_graph_info;

/* Build for a maximum micro-batch of `batch` samples on backend `be` (activations allocated
 * there), storing activations, their gradients and the parameters forward/backward read in `dt`
 * (CT_F32, or CT_F16/CT_BF16 under mixed precision; core/amp.h). */
int ct_graph_build(const ct_config *cfg, int64_t batch, ct_backend *be, ct_dtype dt, ct_graph **out,
                   ct_err *err);
void ct_graph_free(ct_graph *g);

const ct_graph_info *ct_graph_info_get(const ct_graph *g);
int ct_graph_num_views(const ct_graph *g);
const ct_param_view *ct_graph_view(const ct_graph *g, int i); /* params then buffers */

/* Short description: "3 layers: linear(784->512) relu ..." for the plan printout. */
void ct_graph_describe(const ct_graph *g, char *buf, size_t n);

/* Initialise parameters and buffers (PyTorch default schemes unless a layer says "init"),
 * from Philox keyed by (seed, CT_RNG_INIT, view index). params: n_params floats;
 * buffers: n_buffers floats. Host or device memory of `be`. */
void ct_graph_init_params(ct_graph *g, float *params, float *buffers, uint64_t seed);

/* Hooks called by the executor around each layer. Any may be NULL. */
typedef struct ct_exec_hooks {
    void *ctx;
    void (*before_forward)(void *ctx, int layer);
    void (*after_forward)(void *ctx, int layer);
    void (*before_backward)(void *ctx, int layer);
    void (*after_backward)(void *ctx, int layer);
} ct_exec_hooks;

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
    bool defer_loss;             /* forward leaves loss/correct in backend memory: read them with
                                    ct_graph_read_loss (lets a step be queued or captured whole) */
    /* outputs */
    float loss;                  /* mean loss of the micro-batch (unscaled) */
    int64_t correct;             /* classification: correct argmax predictions */
} ct_step_io;

/* Forward (and the loss). params: the n_params parameters in the graph's dtype (the fp32 master,
 * or amp's 16-bit copy); buffers: n_buffers fp32 running statistics. */
int ct_graph_forward(ct_graph *g, const void *params, float *buffers, ct_step_io *io,
                     const ct_exec_hooks *hooks, ct_err *err);
/* Backward from the loss: ACCUMULATES parameter gradients into grads (n_params fp32). */
int ct_graph_backward(ct_graph *g, const void *params, float *grads, ct_step_io *io,
                      const ct_exec_hooks *hooks, ct_err *err);
/* Fill io->loss and io->correct from the last forward (waits for it); forward does this itself
 * unless io->defer_loss. */
void ct_graph_read_loss(ct_graph *g, ct_step_io *io);

/* The dtype activations and parameters are stored in (ct_graph_build's dt). */
ct_dtype ct_graph_compute_dtype(const ct_graph *g);

/* Inspection (tests, debugging, profilers): layer j's name and type, and its output activation and
 * gradient buffers [build batch, out] in backend memory and the graph's dtype, valid after
 * forward / backward. */
const char *ct_graph_layer_name(const ct_graph *g, int layer);
const char *ct_graph_layer_type(const ct_graph *g, int layer);
void *ct_graph_activation(const ct_graph *g, int layer);
void *ct_graph_activation_grad(const ct_graph *g, int layer);

#endif

/* layer.h: the Layer seam. One layer type = one file in core/graph/layers/ + its line in
 * core/graph/layers/registry.c (docs/ADDING.md).
 *
 * A layer type provides: its name, the config fields it accepts, a parser that validates them,
 * shape inference (per sample, without the batch dimension N), parameter specs, the bytes of
 * state it saves between forward and backward (aux) and of scratch it needs (workspace), forward,
 * backward and a FLOP count. Layers compute only through the ct_backend op table; they know
 * nothing of devices, precision policy, ZeRO or checkpointing (the executor and its hooks do).
 *
 * Gradient convention (as in backend.h): backward ACCUMULATES into parameter gradients and WRITES
 * input gradients. An input gradient pointer is NULL when nothing upstream needs it (the model
 * input): the layer then skips that work. */
#ifndef CT_LAYER_H
#define CT_LAYER_H

#include <cjson/cJSON.h>

#include "core/backend/backend.h"
#include "core/util/common.h"
#include "core/config/config.h"
#include "core/graph/graph.h"
#include "core/util/tensor.h"

#define CT_LAYER_MAX_IN 8      /* add / concat inputs (CT_LAYER_MAX_PARAMS: core/params/layout.h) */

typedef struct ct_layer ct_layer;

/* One parameter (trainable) or buffer (running statistics) a layer owns. */
typedef struct ct_param_spec {
    const char *suffix;        /* "weight" -> view name "<layer>.weight" */
    ct_shape shape;
    ct_init_spec init;         /* the layer's default; the graph applies "init"/"bias_init" over it */
    bool weight_decay;
    bool trainable;
    bool is_bias;              /* "bias_init" applies to it; "init" applies to the non-bias weight */
} ct_param_spec;

/* Pointers a layer computes with, for one micro-batch of n samples (all in backend memory).
 * Activations (x, y, dx, dy) and trainable parameters (p of a trainable spec) are stored in
 * io->dt, the compute dtype (fp32, or fp16/bf16 under mixed precision); parameter gradients
 * (dp), buffers (running statistics: p of a non-trainable spec), aux and ws are the layer's own
 * business and fp32 unless the layer says otherwise. Pass io->dt to every op (backend.h). */
typedef struct ct_layer_io {
    ct_backend *be;
    int64_t n;                          /* samples in this micro-batch (<= build batch) */
    ct_dtype dt;                        /* storage dtype of activations and parameters */
    const void *x[CT_LAYER_MAX_IN];     /* inputs [n, in[i]] */
    const int32_t *ids;                 /* token ids [n, in[0]] when the input is CT_I32 */
    void *y;                            /* output [n, out] */
    void *dx[CT_LAYER_MAX_IN];          /* input grads (written), NULL when not needed */
    const void *dy;                     /* output grad [n, out] */
    void *p[CT_LAYER_MAX_PARAMS];       /* parameters (dt) / buffers (fp32), in the order of the
                                           layer's specs; buffers are NULL in backward */
    float *dp[CT_LAYER_MAX_PARAMS];     /* parameter grads (fp32, accumulated); NULL for buffers */
    void *aux;                          /* aux_bytes saved from forward for backward */
    void *ws;                           /* shared workspace, workspace_bytes */
    bool train;
    bool recompute;                     /* a second forward of the same micro-batch (activation
                                           checkpointing): same outputs, but no side effects
                                           such as a running-statistics update */
    uint64_t seed, stream;              /* dropout: ct_rng stream for this (step, layer) */
    ct_act act;                         /* an activation fused into this layer (core/graph/fuse.c;
                                           only for a type with fuse_act): forward writes
                                           y = act(output); backward's dy is the gradient of
                                           act's output and y holds that output. CT_ACT_NONE: none */
    const ct_decode *decode;            /* generation with a key/value cache (graph.h), eval-mode
                                           forward only: read by CT_LAYER_DECODES types; NULL */
    bool pool;                          /* a 2x2 max-pool after act is fused too (only with act;
                                           for a type with fuse_pool): y [n, c, oh/2, ow/2] is the
                                           pool's output, aux its argmax (int32, as maxpool2d
                                           saves it) and backward's dy its output gradient */
} ct_layer_io;

/* Properties of a layer type that the graph and the trainer act on (ct_layer_type.flags). */
enum {
    CT_LAYER_TAKES_IDS = 1u << 0,       /* can read the model input as token ids (CT_I32) */
    CT_LAYER_RANDOM = 1u << 1,          /* draws random numbers in train mode (a captured step
                                           would replay the same draws) */
    /* Generation with a key/value cache (ct_decode, graph.h) needs one of these two of every layer:
     * PER_POSITION: in eval mode, output position t is a function of input position t alone
     *   (whatever the positions around it and its index), so the graph built for one position
     *   computes it as the graph for the whole window does: linear, norms, element-wise layers;
     * DECODES: the layer reads io->decode (attention: its key/value cache, kv_bytes; a table of
     *   positions: its rows from pos0). */
    CT_LAYER_PER_POSITION = 1u << 2,
    CT_LAYER_DECODES = 1u << 3,
};

/* What a type's backward reads of its inputs x[i] (ct_layer_type.backward_reads_input), so the
 * planner (core/graph/lifetime.c) knows how long an input must live and a checkpointed segment's
 * recompute (segments.c) whether it must bring the input back. Dy, aux and the parameters are
 * always read; the output y is backward_reads_output's business. */
typedef enum ct_bwd_input {
    CT_BWD_INPUT_UNSAID = 0,            /* the type does not say: taken as read (conservative) */
    CT_BWD_INPUT_READ,                  /* reads its inputs (linear's dW needs x) */
    CT_BWD_INPUT_UNREAD,                /* reads none (add, dropout: dy and aux are enough) */
} ct_bwd_input;

typedef struct ct_layer_type {
    const char *name;                   /* "linear" */
    unsigned flags;                     /* CT_LAYER_* above */
    const char *const *fields;          /* fields besides the common ones; NULL-terminated */
    int min_inputs, max_inputs;         /* usually 1, 1 */
    size_t cfg_size;                    /* bytes of the type's parsed config (l->cfg_data) */

    /* Read and validate the type's fields from l->node into l->cfg_data (zeroed, cfg_size bytes). */
    int (*parse)(ct_layer *l, ct_err *err);
    /* l->in[0..n_in) are known: check them and set l->out. */
    int (*infer)(ct_layer *l, ct_err *err);
    /* Fill specs (at most CT_LAYER_MAX_PARAMS); return how many. NULL: no parameters. */
    int (*params)(const ct_layer *l, ct_param_spec *specs);
    /* Bytes saved between forward and backward, and shared scratch, for `batch` samples with
     * activations in dtype dt. */
    size_t (*aux_bytes)(const ct_layer *l, int64_t batch, ct_dtype dt);
    size_t (*workspace_bytes)(const ct_layer *l, int64_t batch, ct_dtype dt);
    /* Optional: the most scratch a device backend takes inside one of this layer's ops beyond
     * workspace_bytes (freed before the op returns; e.g. the chunked whole-batch convolution).
     * The device plan counts the largest over the layers. */
    size_t (*device_scratch_bytes)(const ct_layer *l, int64_t batch, ct_dtype dt);
    void (*forward)(const ct_layer *l, const ct_layer_io *io);
    void (*backward)(const ct_layer *l, const ct_layer_io *io);
    /* Optional, for a row-wise layer (each row of the last dimension computed alone: linear):
     * forward and backward of `rows` rows, io's x, y, dx and dy pointing at the first of them
     * (io->n is not read). The chunked LM head (exec.c, model.loss.chunk_rows) runs the model's
     * last layer this way, a range of the micro-batch's rows at a time. */
    void (*forward_rows)(const ct_layer *l, const ct_layer_io *io, int64_t rows);
    void (*backward_rows)(const ct_layer *l, const ct_layer_io *io, int64_t rows);
    /* Forward FLOPs per sample (multiply-add = 2). */
    double (*flops)(const ct_layer *l);
    /* Optional, for a layer that mixes positions along a sequence (causal attention): C·T, its
     * width times the positions it attends over. A model with such a layer counts its training
     * FLOPs per token as 6·N + 6·ΣC·T (ct_graph_train_flops_per_sample), not 3 x forward. */
    double (*sequence_mixing)(const ct_layer *l);
    /* Memory planning hints (both optional):
     * in_place: this layer may write its output over its input (y == x) and still compute its
     *   backward, e.g. relu, whose derivative reads the same from y as from x.
     * backward_reads_output: backward reads this layer's own output y, so no later layer may
     *   overwrite it in place.
     * backward_reads_input: whether backward reads its inputs x (ct_bwd_input above); an input
     *   no backward reads is free once its last forward reader has run.
     * backward_in_place: backward may write dx[0] over dy (one input, element-wise, each dy[i]
     *   read before dx[i] is written), so the planner may give the input's gradient the output
     *   gradient's bytes. */
    bool (*in_place)(const ct_layer *l);
    bool backward_reads_output;
    ct_bwd_input backward_reads_input;
    bool backward_in_place;
    /* Optional: whether this layer draws random numbers in train mode, when that depends on its
     * config (attention dropout of 0 draws nothing); it then decides CT_LAYER_RANDOM for it. */
    bool (*draws_random)(const ct_layer *l);
    /* CT_LAYER_DECODES layers that keep keys and values for generation: the bytes of the cache
     * of positions 0 .. cap - 1 for `batch` sequences in dtype dt (io->decode->kv[l->index]).
     * NULL: none. */
    size_t (*kv_bytes)(const ct_layer *l, int64_t batch, int64_t cap, ct_dtype dt);
    /* CT_LAYER_TAKES_IDS layers: the ids it reads must be below this (an embedding's vocabulary;
     * a larger id reads past its table, which no kernel checks: the loader does, ct_graph_info). */
    int64_t (*id_limit)(const ct_layer *l);
    /* Fusion (core/graph/fuse.c), both optional:
     * fusable_act: the activation this element-wise layer applies, when a producer may apply it
     *   instead (relu: CT_ACT_RELU); CT_ACT_NONE: never fused.
     * fuse_act: whether this layer can apply act itself on backend be (io->act), in forward and
     *   the matching backward. */
    ct_act (*fusable_act)(const ct_layer *l);
    bool (*fuse_act)(const ct_layer *l, const ct_backend *be, ct_act act);
    /* And after the activation, both optional:
     * fusable_pool: this layer is a 2x2, stride-2, unpadded max-pool a producer may compute.
     * fuse_pool: whether this layer, with its fused activation, can also max-pool its output that
     *   way on backend be (io->pool). A type that has the hook may be asked (the memory plan
     *   keeps the pool's buffers busy over this layer's forward and backward, plan.c). */
    bool (*fusable_pool)(const ct_layer *l);
    bool (*fuse_pool)(const ct_layer *l, const ct_backend *be);
} ct_layer_type;

struct ct_layer {
    const ct_layer_type *type;
    char name[96];
    char path[96];                      /* "model.layers[3]" or "model.layers[2].layers[0]" */
    int index;                          /* position in the expanded layer list */
    const cJSON *node;                  /* the layer's JSON object */
    const ct_config *cfg;               /* for FILE:L:C in messages */
    void *cfg_data;                     /* the type's parsed fields (cfg_size bytes) */
    int n_in;
    int in_from[CT_LAYER_MAX_IN];       /* producing layer index, -1 for the model input */
    ct_shape in[CT_LAYER_MAX_IN];       /* per-sample input shapes */
    ct_dtype in_dtype;                  /* CT_I32 only for an embedding fed by token ids */
    ct_shape out;                       /* per-sample output shape */
    char in_name[CT_LAYER_MAX_IN][104]; /* for messages: "\"fc1\"" (quoted) or "the model input" */
    bool checkpoint;                    /* "checkpoint": true: recomputed in backward, in a
                                           segment with the marked layers around it (segments.c) */
};

/* Whether l's backward reads its inputs: all of them unless its type says it reads none. */
static inline bool ct_layer_backward_reads_input(const ct_layer *l) {
    return l->type->backward_reads_input != CT_BWD_INPUT_UNREAD;
}

/* ---- registry (core/graph/layers/registry.c) ---- */
const ct_layer_type *ct_layer_type_find(const char *name);

/* A block type: a config shorthand the builder expands into ordinary layers before anything else
 * sees them (so checkpointing, ZeRO-3 and the profiler see layers). expand returns a new cJSON
 * array of layer objects (the caller owns it) whose "block_input" names the block's input. */
typedef struct ct_block_ctx {
    const ct_config *cfg;
    const char *path;            /* "model.layers[2].layers[0]", for messages */
    int64_t width;               /* the last dimension of the block's input */
    int input_rank;              /* dimensions of the block's input per sample */
    int n_blocks;                /* blocks of this type in the whole model (repeats counted) */
} ct_block_ctx;
typedef struct ct_block_type {
    const char *name;
    int (*expand)(const ct_block_ctx *ctx, const cJSON *node, cJSON **layers, ct_err *err);
} ct_block_type;
const ct_block_type *ct_block_type_find(const char *name);
/* The names a "type" may take, derived from the registry's tables: the layer types, the block
 * types, then "repeat" (for "did you mean" and the tests). Fills at most max and returns how many
 * (test_layers' every_type_has_doc_section checks that all fit in CT_LAYER_NAMES_MAX). */
#define CT_LAYER_NAMES_MAX 64
int ct_layer_type_names(const char **names, int max);

/* ---- messages and field readers (core/graph/layers/fields.c) ----
 * Errors are CT_ERR_CONFIG and read `FILE:L:C: model.layers[3] "fc2" (linear): <text>`.
 * `node` is where to point (NULL: the layer itself). */
/* "FILE:L:C" of a node of cfg->model, or "" when the config has no document (built by hand). */
const char *ct_model_where(const ct_config *cfg, const cJSON *node, char *buf, size_t n);
int ct_layer_errf(const ct_layer *l, ct_err *err, const cJSON *node, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Unknown keys of obj (a layer: l set, messages name it; else a section such as "model.loss" at
 * `path`) are errors, with the closest allowed key suggested. */
int ct_model_check_keys(const ct_config *cfg, const ct_layer *l, const cJSON *obj, const char *path,
                        const char *const *allowed, int n_allowed, ct_err *err);

/* Integer field >= min. Missing: error when required, else *out = def. */
int ct_layer_int(const ct_layer *l, const char *key, bool required, int64_t def, int64_t min,
                 int64_t *out, ct_err *err);
/* An integer or a pair [h, w], each >= min (kernel, stride, padding, dilation). */
int ct_layer_int2(const ct_layer *l, const char *key, bool required, int64_t def, int64_t min,
                  int64_t out[2], ct_err *err);
/* Number in [lo, hi] (hi_open: hi excluded). */
int ct_layer_num(const ct_layer *l, const char *key, double def, double lo, double hi, bool hi_open,
                 double *out, ct_err *err);
int ct_layer_bool(const ct_layer *l, const char *key, bool def, bool *out, ct_err *err);
/* A string among choices[0..n); *out = its index; missing: def_index. */
int ct_layer_choice(const ct_layer *l, const char *key, const char *const *choices, int n,
                    int def_index, int *out, ct_err *err);

/* Sizes beyond 2^40 elements are refused at build, so no element count can overflow int64. */
#define CT_MAX_NUMEL ((int64_t)1 << 40)
static inline bool ct_shape_too_big(const ct_shape *s) {
    double n = 1;
    for (int i = 0; i < s->ndim; i++) n *= (double)s->d[i];
    return n > (double)CT_MAX_NUMEL;
}

/* Elements per sample of input i / of the output. */
static inline int64_t ct_layer_in_numel(const ct_layer *l, int i) { return ct_shape_numel(&l->in[i]); }
static inline int64_t ct_layer_out_numel(const ct_layer *l) { return ct_shape_numel(&l->out); }

/* Shared by conv/pool layers: output size of one spatial dim; <= 0 means the window does not fit. */
static inline int64_t ct_conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
    int64_t span = in + 2 * pad - dil * (k - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
}

#endif

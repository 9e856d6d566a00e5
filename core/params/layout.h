/* layout.h: where every parameter lives in the flat parameter space.
 *
 * All trainable parameters are views into one flat space of n_params elements, and all
 * non-trainable buffers (batchnorm running statistics) views into a second one of n_buffers. The
 * master weights, the compute-dtype copy, the gradients and the optimizer state are all indexed
 * by the same offsets (core/params/store.h), so the optimizer is one fused pass per run of views,
 * a ZeRO partition is a slice [lo, hi), a gradient bucket is a contiguous range and a checkpoint is
 * a list of named views.
 *
 * Views are laid out in layer order, trainable ones first; each starts at a multiple of
 * CT_VIEW_ALIGN elements (16 bytes of a 16-bit copy), so no GPU GEMM falls back to a slow path
 * because a weight is misaligned. The padding between views is never read by a layer and stays
 * zero in every buffer.
 *
 * Each layer has a list of the views it reads, in the order of its parameter specs. A spec may be
 * an alias of an existing view (a tied weight: the LM head reading the token embedding): the
 * layer's list then names that view, the view exists once, and the optimizer, the initialiser and
 * checkpoints see the tensor once, while forward reads and backward accumulates into the same
 * offsets from both layers. */
#ifndef CT_PARAMS_LAYOUT_H
#define CT_PARAMS_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/util/common.h"
#include "core/util/tensor.h"

#define CT_VIEW_ALIGN 8            /* elements */
#define CT_LAYER_MAX_PARAMS 4      /* parameter and buffer tensors per layer */

typedef enum { CT_INIT_DEFAULT = 0, CT_INIT_ZEROS, CT_INIT_ONES, CT_INIT_CONSTANT, CT_INIT_UNIFORM,
               CT_INIT_NORMAL, CT_INIT_KAIMING_UNIFORM, CT_INIT_KAIMING_NORMAL, CT_INIT_XAVIER_UNIFORM,
               CT_INIT_XAVIER_NORMAL } ct_init_kind;

typedef struct ct_init_spec {
    ct_init_kind kind;
    double a, b;         /* uniform [a, b); normal mean a std b; constant a; kaiming: a = neg slope */
    int64_t fan_in, fan_out;
} ct_init_spec;

/* A named parameter (or buffer) inside the flat space. */
typedef struct ct_param_view {
    char name[128];      /* "<layer name>.weight", "<layer>.bias", "<layer>.running_mean" */
    ct_shape shape;
    int64_t offset;      /* element offset in the flat space (params, or buffers when !trainable);
                            a multiple of CT_VIEW_ALIGN */
    int64_t numel;
    bool weight_decay;   /* false for biases and norm parameters */
    bool trainable;      /* false for buffers (running stats): no grad, no optimizer state */
    ct_init_spec init;
    int layer;           /* the layer that declared it */
} ct_param_view;

typedef struct ct_param_layout {
    ct_param_view *views;        /* [n_views] trainable views in layer order, then buffers */
    int n_views, cap;
    int64_t n_params;            /* extent of the trainable space, padding included */
    int64_t n_buffers;           /* extent of the buffer space, padding included */
    int64_t n_param_elems;       /* trainable elements, each tensor once (for "124.4 M params") */
    int n_layers;
    int (*layer_view)[CT_LAYER_MAX_PARAMS]; /* [n_layers][spec]: view index, -1 when unset */
    int *layer_n_specs;          /* [n_layers] */
} ct_param_layout;

/* An empty layout for n_layers layers. */
void ct_param_layout_init(ct_param_layout *L, int n_layers);
void ct_param_layout_free(ct_param_layout *L);

/* Append a view (name, shape, flags, init filled by the caller; offset assigned here: the next
 * aligned offset of its space) and bind it as spec `spec` of its layer (v->layer). Views of one
 * space must be added in order; all trainable views before the first buffer is bound is not
 * required, but the graph adds them in two passes so the trainable space is one block. Returns
 * the view's index. */
int ct_param_layout_add(ct_param_layout *L, const ct_param_view *v, int spec);
/* Bind spec `spec` of layer `layer` to the existing view `view` (a tie). */
void ct_param_layout_alias(ct_param_layout *L, int layer, int spec, int view);
/* Number of specs of a layer (set by add/alias: the highest bound spec + 1). */
void ct_param_layout_set_specs(ct_param_layout *L, int layer, int n_specs);

/* Lookups. find: index of the view called name, or -1. layer_view: view index of spec s of
 * layer j (-1 when out of range). */
int ct_param_layout_find(const ct_param_layout *L, const char *name);
int ct_param_layout_layer_view(const ct_param_layout *L, int layer, int spec);
int ct_param_layout_layer_specs(const ct_param_layout *L, int layer);
/* The same views (names, shapes, offsets, flags) in the same spaces: two builds of one model
 * that can share a parameter store. */
bool ct_param_layout_same(const ct_param_layout *a, const ct_param_layout *b);
/* True when spec s of layer j names a view another layer declared (a tie). */
bool ct_param_layout_is_alias(const ct_param_layout *L, int layer, int spec);

/* The contiguous ranges of the trainable space, one per view, merged where neighbours (across
 * alignment padding) share the weight-decay flag; in offset order. out may be NULL to count.
 * The optimizer's fused passes run over these. */
typedef struct ct_param_run {
    int64_t offset, numel;       /* numel includes the padding up to the next merged view */
    bool weight_decay;
} ct_param_run;
int ct_param_layout_runs(const ct_param_layout *L, bool merge, ct_param_run *out);

#endif

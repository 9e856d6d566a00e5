/* norm.h: what layernorm and rmsnorm share. Both normalise each row of the input's last dimension
 * d (x [n, ..., d], rows = n * numel / d), take "dim" (optional, checked against d) and "eps"
 * (> 0), and give an output shaped like the input; they differ in the default eps, their
 * parameters and their kernels. */
#ifndef CT_GRAPH_LAYERS_NORM_H
#define CT_GRAPH_LAYERS_NORM_H

#include "core/graph/layer.h"

/* The layer's cfg_data (.cfg_size = sizeof(ct_norm_cfg)). */
typedef struct ct_norm_cfg {
    int64_t d_check; /* "dim": 0, or the features the input must have */
    double eps;
} ct_norm_cfg;

extern const char *const ct_norm_fields[]; /* "dim", "eps" */

/* "dim" and "eps" (default default_eps) into l->cfg_data; an eps of 0 or less is an error. */
int ct_norm_parse(ct_layer *l, double default_eps, ct_err *err);
/* The output is the input's shape; a scalar input, or one whose last dimension is not "dim", is an
 * error naming the layer it came from. */
int ct_norm_infer(ct_layer *l, ct_err *err);

static inline int64_t ct_norm_dim(const ct_layer *l) { return l->in[0].d[l->in[0].ndim - 1]; }
static inline int64_t ct_norm_rows(const ct_layer *l, int64_t n) {
    return n * ct_layer_in_numel(l, 0) / ct_norm_dim(l);
}

#endif

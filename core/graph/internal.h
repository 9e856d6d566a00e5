/* graph_impl.h: the graph's private layout, shared by graph_build.c, graph_exec.c, graph_init.c. */
#ifndef CT_GRAPH_IMPL_H
#define CT_GRAPH_IMPL_H

#include "core/graph/graph.h"
#include "core/graph/layer.h"

typedef struct ct_gnode {
    ct_layer l;
    int n_specs;
    int view[CT_LAYER_MAX_PARAMS];      /* index into g->views of each spec */
    void *y, *dy;                       /* [batch, out] activation and its gradient (g->dt); y may
                                           be the producer's buffer when this layer runs in place */
    void *aux;                          /* forward -> backward state */
    /* Backward plan, fixed at build (see plan_backward): where input i's gradient goes. */
    int64_t tmp_off[CT_LAYER_MAX_IN];   /* -1: straight into the producer's dy; else offset in
                                           g->dtmp, then added to the producer's dy */
    bool runs_backward;                 /* false when no gradient reaches this layer's output */
    int grad_start;                     /* backward step (0 = last layer's) that first writes dy */
} ct_gnode;

struct ct_graph {
    ct_backend *be;
    ct_graph_info info;
    int64_t batch;                      /* build (maximum) micro-batch */
    ct_gnode *nodes;
    int n_nodes;
    ct_param_view *views;               /* trainable params (layer order), then buffers */
    int n_views;
    double label_smoothing;
    void *block;                        /* the one backend allocation carved below */
    void *ws;                           /* shared workspace */
    void *dtmp;                         /* fan-out gradient scratch (dt) */
    void *input;                        /* [batch, input] model input converted to dt (NULL when
                                           dt is fp32 or the input is token ids) */
    float *loss_result;                 /* [2] mean loss, correct count: the loss ops' result */
    ct_dtype dt;                        /* storage of activations, their gradients, parameters */
    float loss_grad_scale;              /* the scale the last backward used (see backward) */
};

/* Shared by the build steps (graph_build.c, graph_params.c, graph_memory.c). */
int ct_graph_check_keys(const ct_config *cfg, const ct_layer *l, const cJSON *obj, const char *path,
                        const char *const *allowed, int n_allowed, ct_err *err);
int ct_graph_layout_params(ct_graph *g, ct_err *err);
int ct_graph_plan_memory(ct_graph *g, int64_t batch, ct_err *err);

#endif

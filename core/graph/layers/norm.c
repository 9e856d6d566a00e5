/* norm.c: the configuration and shape of the layers that normalise the last dimension (norm.h). */
#include "core/graph/layers/norm.h"

const char *const ct_norm_fields[] = {"dim", "eps", NULL};

int ct_norm_parse(ct_layer *l, double default_eps, ct_err *err) {
    ct_norm_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "dim", false, 0, 1, &c->d_check, err);
    if (!rc) rc = ct_layer_num(l, "eps", default_eps, 0.0, 1.0, false, &c->eps, err);
    if (!rc && c->eps <= 0) rc = ct_layer_errf(l, err, NULL, "eps: expected a number > 0");
    return rc;
}

int ct_norm_infer(ct_layer *l, ct_err *err) {
    const ct_norm_cfg *c = l->cfg_data;
    if (l->in[0].ndim < 1)
        return ct_layer_errf(l, err, NULL, "input is a scalar per sample (from %s)", l->in_name[0]);
    if (c->d_check && ct_norm_dim(l) != c->d_check)
        return ct_layer_errf(l, err, NULL, "input has %lld features, expected %lld (from %s)",
                             (long long)ct_norm_dim(l), (long long)c->d_check, l->in_name[0]);
    l->out = l->in[0];
    return CT_OK;
}

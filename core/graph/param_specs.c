/* graph_params.c: parameter and buffer views of the flat buffers, and the "init" / "bias_init"
 * overrides of each layer's default initialiser. */
#include <stdio.h>
#include <string.h>

#include "core/graph/internal.h"

static const char *const init_names[] = {"default", "zeros", "ones", "constant", "uniform", "normal",
                                         "kaiming_uniform", "kaiming_normal", "xavier_uniform",
                                         "xavier_normal"};

static int init_num(const ct_layer *l, const cJSON *o, const char *key, double def, double *out,
                    ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) { *out = def; return CT_OK; }
    if (!cJSON_IsNumber(v)) return ct_layer_errf(l, err, v, "init.%s: expected a number", key);
    *out = v->valuedouble;
    return CT_OK;
}

/* "init": {"type": "normal", "mean": 0, "std": 0.02} etc. over the layer's default spec. */
static int parse_init(const ct_layer *l, const cJSON *o, ct_init_spec *s, ct_err *err) {
    static const char *const keys[] = {"type", "mean", "std", "a", "b", "value", "gain", "mode"};
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    int rc, k = -1;
    if (!cJSON_IsObject(o) || !cJSON_IsString(t))
        return ct_layer_errf(l, err, o, "%s: expected an object such as {\"type\": \"normal\", "
                             "\"std\": 0.02}", o->string);
    for (int i = 1; i < CT_ARRAY_LEN(init_names); i++)
        if (strcmp(t->valuestring, init_names[i]) == 0) k = i;
    if (k < 0) {
        const char *near = ct_suggest(t->valuestring, init_names + 1, CT_ARRAY_LEN(init_names) - 1);
        return ct_layer_errf(l, err, t, "%s.type: unknown init \"%s\"%s%s%s", o->string,
                             t->valuestring, near ? "; did you mean \"" : "", near ? near : "",
                             near ? "\"?" : "");
    }
    if ((rc = ct_graph_check_keys(l->cfg, l, o, NULL, keys, CT_ARRAY_LEN(keys), err))) return rc;
    s->kind = (ct_init_kind)k;
    switch (s->kind) {
    case CT_INIT_CONSTANT: return init_num(l, o, "value", 0.0, &s->a, err);
    case CT_INIT_UNIFORM:
        if ((rc = init_num(l, o, "a", 0.0, &s->a, err)) || (rc = init_num(l, o, "b", 1.0, &s->b, err))) return rc;
        return s->b > s->a ? CT_OK : ct_layer_errf(l, err, o, "%s: uniform needs a < b", o->string);
    case CT_INIT_NORMAL:
        if ((rc = init_num(l, o, "mean", 0.0, &s->a, err)) || (rc = init_num(l, o, "std", 1.0, &s->b, err)))
            return rc;
        return s->b >= 0 ? CT_OK : ct_layer_errf(l, err, o, "%s: std must be >= 0", o->string);
    case CT_INIT_KAIMING_UNIFORM:
    case CT_INIT_KAIMING_NORMAL: {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "mode");
        if (m && !(cJSON_IsString(m) && (!strcmp(m->valuestring, "fan_in") || !strcmp(m->valuestring, "fan_out"))))
            return ct_layer_errf(l, err, m, "%s.mode: expected \"fan_in\" or \"fan_out\"", o->string);
        if (m && !strcmp(m->valuestring, "fan_out")) s->fan_in = s->fan_out;
        return init_num(l, o, "a", 0.0, &s->a, err);
    }
    case CT_INIT_XAVIER_UNIFORM:
    case CT_INIT_XAVIER_NORMAL: return init_num(l, o, "gain", 1.0, &s->a, err);
    default: return CT_OK;
    }
}

/* "init" needs a weight and "bias_init" a bias to apply to; otherwise the user's intent is lost. */
static int check_init_targets(const ct_layer *l, const ct_param_spec *specs, int n, ct_err *err) {
    bool weight = n > 0 && specs[0].trainable && !specs[0].is_bias, bias = false;
    for (int s = 0; s < n; s++) bias = bias || (specs[s].trainable && specs[s].is_bias);
    const cJSON *wi = cJSON_GetObjectItemCaseSensitive(l->node, "init");
    const cJSON *bi = cJSON_GetObjectItemCaseSensitive(l->node, "bias_init");
    if (wi && !weight) return ct_layer_errf(l, err, wi, "init: this layer has no weight to initialise");
    if (bi && !bias) return ct_layer_errf(l, err, bi, "bias_init: this layer has no bias");
    return CT_OK;
}

int ct_graph_layout_params(ct_graph *g, ct_err *err) {
    ct_param_spec specs[CT_ARRAY_LEN(g->nodes[0].view)];
    int cap = 16;
    g->views = ct_xmalloc(sizeof(ct_param_view) * (size_t)cap);
    /* Two passes: trainable parameters first, then buffers, so params are one contiguous block. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n_nodes; i++) {
            ct_gnode *gn = &g->nodes[i];
            const ct_layer *l = &gn->l;
            gn->n_specs = l->type->params ? l->type->params(l, specs) : 0;
            if (pass == 0) {
                int rc = check_init_targets(l, specs, gn->n_specs, err);
                if (rc) return rc;
            }
            for (int s = 0; s < gn->n_specs; s++) {
                if (specs[s].trainable != (pass == 0)) continue;
                if (ct_shape_too_big(&specs[s].shape))
                    return ct_layer_errf(l, err, NULL, "%s is too large (over 2^40 elements)", specs[s].suffix);
                const char *key = specs[s].is_bias ? "bias_init" : "init";
                const cJSON *o = cJSON_GetObjectItemCaseSensitive(l->node, key);
                if (o && specs[s].trainable && (specs[s].is_bias || s == 0)) {
                    int rc = parse_init(l, o, &specs[s].init, err);
                    if (rc) return rc;
                }
                if (g->n_views == cap) g->views = ct_xrealloc(g->views, sizeof(ct_param_view) * (size_t)(cap *= 2));
                ct_param_view *v = &g->views[g->n_views];
                memset(v, 0, sizeof *v);
                snprintf(v->name, sizeof v->name, "%s.%s", l->name, specs[s].suffix);
                v->shape = specs[s].shape;
                v->numel = ct_shape_numel(&v->shape);
                v->trainable = specs[s].trainable;
                v->weight_decay = specs[s].weight_decay;
                v->init = specs[s].init;
                int64_t *total = v->trainable ? &g->info.n_params : &g->info.n_buffers;
                v->offset = *total;
                *total += v->numel;
                gn->view[s] = g->n_views++;
            }
        }
    return CT_OK;
}

/* param_specs.c: the layers' parameter specs as views of the flat spaces (core/params/layout.h),
 * the "init" / "bias_init" overrides of each layer's default initialiser, and "tie": a spec that
 * reads an earlier layer's view instead of declaring its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/internal.h"
#include "core/params/layout.h"

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
    if ((rc = ct_model_check_keys(l->cfg, l, o, NULL, keys, CT_ARRAY_LEN(keys), err))) return rc;
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

/* "tie": {"<spec suffix>": "<view name>"}, or a view name alone for the layer's weight (its
 * first, non-bias parameter). Checked once per layer: every key names a parameter of the layer. */
static int check_tie(const ct_layer *l, const ct_param_spec *specs, int n, ct_err *err) {
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(l->node, "tie");
    if (!tie) return CT_OK;
    bool weight = n > 0 && specs[0].trainable && !specs[0].is_bias;
    if (cJSON_IsString(tie))
        return weight ? CT_OK : ct_layer_errf(l, err, tie, "tie: this layer has no weight to tie");
    if (!cJSON_IsObject(tie) || !tie->child)
        return ct_layer_errf(l, err, tie, "tie: expected a view name such as \"wte.weight\" or an "
                             "object such as {\"weight\": \"wte.weight\"}");
    for (const cJSON *k = tie->child; k; k = k->next) {
        int found = -1;
        const char *names[CT_LAYER_MAX_PARAMS];
        for (int i = 0; i < n; i++) {
            names[i] = specs[i].suffix;
            if (strcmp(specs[i].suffix, k->string) == 0) found = i;
        }
        if (found < 0) {
            const char *near = ct_suggest(k->string, names, n);
            return ct_layer_errf(l, err, k, "tie: this layer has no parameter \"%s\"%s%s%s", k->string,
                                 near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
        }
        if (!cJSON_IsString(k))
            return ct_layer_errf(l, err, k, "tie.%s: expected the name of a view, e.g. \"wte.weight\"",
                                 k->string);
    }
    return CT_OK;
}

/* The view name spec s of layer l is tied to, or NULL (check_tie validated the field). */
static const char *tie_target(const ct_layer *l, const ct_param_spec *specs, int s) {
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(l->node, "tie");
    if (cJSON_IsString(tie)) return s == 0 ? tie->valuestring : NULL;
    const cJSON *k = tie ? cJSON_GetObjectItemCaseSensitive(tie, specs[s].suffix) : NULL;
    return cJSON_IsString(k) ? k->valuestring : NULL;
}

/* Bind spec s of layer l to the view `name` declared by an earlier layer: same shape, trainable,
 * no "init" of its own. */
static int tie_spec(ct_graph *g, const ct_layer *l, const ct_param_spec *spec, int s, const char *name,
                    ct_err *err) {
    ct_param_layout *L = &g->layout;
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(l->node, "tie");
    int v = ct_param_layout_find(L, name);
    char a[96], b[96];
    if (v < 0) {
        const char **names = ct_xmalloc(sizeof(char *) * (size_t)(L->n_views + 1));
        for (int i = 0; i < L->n_views; i++) names[i] = L->views[i].name;
        const char *near = ct_suggest(name, names, L->n_views);
        char hint[200] = "";
        if (near) snprintf(hint, sizeof hint, "; did you mean \"%s\"?", near);
        int rc = ct_layer_errf(l, err, at, "tie: no parameter named \"%s\" in an earlier layer%s", name,
                               hint);
        free(names);
        return rc;
    }
    const ct_param_view *t = &L->views[v];
    if (!spec->trainable || !t->trainable)
        return ct_layer_errf(l, err, at, "tie: \"%s\" and %s.%s must both be trainable parameters",
                             name, l->name, spec->suffix);
    if (!ct_shape_eq(&t->shape, &spec->shape))
        return ct_layer_errf(l, err, at, "tie: %s is %s but \"%s\" is %s", spec->suffix,
                             ct_shape_str(&spec->shape, a, sizeof a), name, ct_shape_str(&t->shape, b, sizeof b));
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(l->node, spec->is_bias ? "bias_init" : "init");
    if (init)
        return ct_layer_errf(l, err, init, "%s: %s is tied to \"%s\", which is initialised where it is "
                             "declared", init->string, spec->suffix, name);
    ct_param_layout_alias(L, l->index, s, v);
    return CT_OK;
}

/* One spec of layer l: a new view (in the pass of its kind), or a tie. */
static int add_spec(ct_graph *g, const ct_layer *l, ct_param_spec *specs, int s, int pass, ct_err *err) {
    const char *tie = tie_target(l, specs, s);
    int rc;
    if (specs[s].trainable != (pass == 0)) return CT_OK;
    if (tie) return tie_spec(g, l, &specs[s], s, tie, err);
    if (ct_shape_too_big(&specs[s].shape))
        return ct_layer_errf(l, err, NULL, "%s is too large (over 2^40 elements)", specs[s].suffix);
    const char *key = specs[s].is_bias ? "bias_init" : "init";
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(l->node, key);
    if (o && specs[s].trainable && (specs[s].is_bias || s == 0) && (rc = parse_init(l, o, &specs[s].init, err)))
        return rc;
    ct_param_view v = {.shape = specs[s].shape, .trainable = specs[s].trainable,
                       .weight_decay = specs[s].weight_decay, .init = specs[s].init, .layer = l->index};
    snprintf(v.name, sizeof v.name, "%s.%s", l->name, specs[s].suffix);
    ct_param_layout_add(&g->layout, &v, s);
    return CT_OK;
}

int ct_graph_layout_params(ct_graph *g, ct_err *err) {
    ct_param_spec specs[CT_LAYER_MAX_PARAMS];
    ct_param_layout_init(&g->layout, g->n_nodes);
    /* Two passes: trainable parameters first, then buffers, so params are one contiguous block.
     * A tie is resolved in the first pass, so it can name any trainable view of an earlier
     * layer. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n_nodes; i++) {
            const ct_layer *l = &g->nodes[i].l;
            int n = l->type->params ? l->type->params(l, specs) : 0;
            int rc = CT_OK;
            if (pass == 0 && !(rc = check_init_targets(l, specs, n, err))) rc = check_tie(l, specs, n, err);
            for (int s = 0; s < n && !rc; s++) rc = add_spec(g, l, specs, s, pass, err);
            if (rc) return rc;
            ct_param_layout_set_specs(&g->layout, i, n);
        }
    g->info.n_params = g->layout.n_params;
    g->info.n_param_elems = g->layout.n_param_elems;
    g->info.n_buffers = g->layout.n_buffers;
    return CT_OK;
}

/* layout.c: the flat parameter space's views, per-layer view lists and aliases (layout.h). */
#include "core/params/layout.h"

#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t x) { return (x + CT_VIEW_ALIGN - 1) / CT_VIEW_ALIGN * CT_VIEW_ALIGN; }

void ct_param_layout_init(ct_param_layout *L, int n_layers) {
    memset(L, 0, sizeof *L);
    L->n_layers = n_layers;
    size_t n = (size_t)(n_layers > 0 ? n_layers : 1);
    L->layer_view = ct_xmalloc(n * sizeof *L->layer_view);
    L->layer_n_specs = ct_xcalloc(n, sizeof *L->layer_n_specs);
    for (size_t j = 0; j < n; j++)
        for (int s = 0; s < CT_LAYER_MAX_PARAMS; s++) L->layer_view[j][s] = -1;
}

void ct_param_layout_free(ct_param_layout *L) {
    if (!L) return;
    free(L->views);
    free(L->layer_view);
    free(L->layer_n_specs);
    memset(L, 0, sizeof *L);
}

static void bind(ct_param_layout *L, int layer, int spec, int view) {
    L->layer_view[layer][spec] = view;
    if (L->layer_n_specs[layer] < spec + 1) L->layer_n_specs[layer] = spec + 1;
}

int ct_param_layout_add(ct_param_layout *L, const ct_param_view *v, int spec) {
    if (L->n_views == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 16;
        L->views = ct_xrealloc(L->views, (size_t)L->cap * sizeof *L->views);
    }
    ct_param_view *d = &L->views[L->n_views];
    *d = *v;
    d->numel = ct_shape_numel(&d->shape);
    int64_t *extent = d->trainable ? &L->n_params : &L->n_buffers;
    d->offset = align_up(*extent);
    *extent = align_up(d->offset + d->numel);
    if (d->trainable) L->n_param_elems += d->numel;
    bind(L, d->layer, spec, L->n_views);
    return L->n_views++;
}

void ct_param_layout_alias(ct_param_layout *L, int layer, int spec, int view) { bind(L, layer, spec, view); }

void ct_param_layout_set_specs(ct_param_layout *L, int layer, int n_specs) { L->layer_n_specs[layer] = n_specs; }

int ct_param_layout_find(const ct_param_layout *L, const char *name) {
    for (int i = 0; i < L->n_views; i++)
        if (strcmp(L->views[i].name, name) == 0) return i;
    return -1;
}

bool ct_param_layout_same(const ct_param_layout *a, const ct_param_layout *b) {
    if (a->n_views != b->n_views || a->n_params != b->n_params || a->n_buffers != b->n_buffers) return false;
    for (int i = 0; i < a->n_views; i++) {
        const ct_param_view *x = &a->views[i], *y = &b->views[i];
        if (strcmp(x->name, y->name) != 0 || !ct_shape_eq(&x->shape, &y->shape) || x->offset != y->offset ||
            x->trainable != y->trainable || x->weight_decay != y->weight_decay)
            return false;
    }
    return true;
}

int ct_param_layout_layer_view(const ct_param_layout *L, int layer, int spec) {
    if (layer < 0 || layer >= L->n_layers || spec < 0 || spec >= CT_LAYER_MAX_PARAMS) return -1;
    return L->layer_view[layer][spec];
}

int ct_param_layout_layer_specs(const ct_param_layout *L, int layer) {
    return layer >= 0 && layer < L->n_layers ? L->layer_n_specs[layer] : 0;
}

bool ct_param_layout_is_alias(const ct_param_layout *L, int layer, int spec) {
    int v = ct_param_layout_layer_view(L, layer, spec);
    return v >= 0 && L->views[v].layer != layer;
}

int ct_param_layout_runs(const ct_param_layout *L, bool merge, ct_param_run *out) {
    int k = 0;
    ct_param_run last = {0};
    for (int i = 0; i < L->n_views; i++) {
        const ct_param_view *v = &L->views[i];
        if (!v->trainable) continue;
        /* a merged run covers the padding before this view, which stays zero */
        if (merge && k > 0 && last.weight_decay == v->weight_decay &&
            align_up(last.offset + last.numel) == v->offset) {
            last.numel = v->offset + v->numel - last.offset;
            if (out) out[k - 1] = last;
            continue;
        }
        last = (ct_param_run){v->offset, v->numel, v->weight_decay};
        if (out) out[k] = last;
        k++;
    }
    return k;
}

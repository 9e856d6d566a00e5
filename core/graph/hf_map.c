/* hf_map.c: the table walk shared by the Hugging Face layouts (hf_map.h). */
#include "core/graph/hf_map.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/internal.h"

/* Parameter layers in each part's slots: the part's size is its highest slot + 1. */
static int slots_in(const ct_hf_layout *lay, ct_hf_part p) {
    int n = 0;
    for (int i = 0; i < lay->n_rows; i++)
        if (lay->rows[i].where == p && lay->rows[i].slot + 1 > n) n = lay->rows[i].slot + 1;
    return n;
}

/* The parameters of the layer at a slot: the highest spec of its rows + 1. */
static int specs_in(const ct_hf_layout *lay, ct_hf_part p, int slot) {
    int n = 0;
    for (int i = 0; i < lay->n_rows; i++)
        if (lay->rows[i].where == p && lay->rows[i].slot == slot && lay->rows[i].spec + 1 > n) n = lay->rows[i].spec + 1;
    return n;
}

static const char *type_of(const ct_hf_layout *lay, ct_hf_part p, int slot) {
    for (int i = 0; i < lay->n_rows; i++)
        if (lay->rows[i].where == p && lay->rows[i].slot == slot) return lay->rows[i].type;
    return "?";
}

int ct_hf_shape_errf(const ct_graph *g, const ct_hf_layout *lay, int layer, ct_err *err, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (layer < 0)
        return ct_errf(err, CT_ERR_CONFIG, "the model is not %s's shape for layout %s: %s.\n%s", lay->model, lay->name,
                       what, lay->hint);
    const ct_layer *l = &g->nodes[layer].l;
    return ct_errf(err, CT_ERR_CONFIG, "the model is not %s's shape for layout %s: %s \"%s\" (%s): %s.\n%s",
                   lay->model, lay->name, l->path, l->name, l->type->name, what, lay->hint);
}

int *ct_hf_param_layers(const ct_graph *g, int *n) {
    int *out = ct_xcalloc((size_t)g->n_nodes + 1, sizeof *out);
    *n = 0;
    for (int j = 0; j < g->n_nodes; j++)
        if (ct_param_layout_layer_specs(&g->layout, j) > 0) out[(*n)++] = j;
    return out;
}

int ct_hf_layer_between(const ct_graph *g, int lo, int hi, const char *type) {
    for (int j = lo + 1; j < hi; j++)
        if (strcmp(g->nodes[j].l.type->name, type) == 0) return j;
    return -1;
}

/* A layer of `type` (and gelu's approximation) strictly between layers lo and hi. */
static bool has_between(const ct_graph *g, int lo, int hi, const ct_hf_between *b) {
    for (int j = lo + 1; j < hi; j++) {
        const ct_layer *l = &g->nodes[j].l;
        if (strcmp(l->type->name, b->type) != 0) continue;
        const cJSON *a = b->approximate ? cJSON_GetObjectItemCaseSensitive(l->node, "approximate") : NULL;
        if (!b->approximate || (cJSON_IsString(a) && strcmp(a->valuestring, b->approximate) == 0)) return true;
    }
    return false;
}

/* Check the parameter layers against the table; *blocks receives L. */
static int check_shape(const ct_graph *g, const ct_hf_layout *lay, const int *pl, int n, int *blocks, ct_err *err) {
    int embed = slots_in(lay, CT_HF_EMBED), final = slots_in(lay, CT_HF_FINAL), per = slots_in(lay, CT_HF_BLOCK);
    if (n < embed + final + per || (n - embed - final) % per) {
        char parts[160];
        snprintf(parts, sizeof parts, lay->parts, per);
        return ct_hf_shape_errf(g, lay, -1, err, "layers holding parameters: %d, expected %d + %d per block (%s)", n,
                                embed + final, per, parts);
    }
    *blocks = (n - embed - final) / per;
    for (int k = 0; k < n; k++) {
        ct_hf_part p = k < embed ? CT_HF_EMBED : k >= n - final ? CT_HF_FINAL : CT_HF_BLOCK;
        int slot = p == CT_HF_EMBED ? k : p == CT_HF_FINAL ? k - (n - final) : (k - embed) % per;
        const ct_layer *l = &g->nodes[pl[k]].l;
        if (strcmp(l->type->name, type_of(lay, p, slot)) != 0)
            return ct_hf_shape_errf(g, lay, pl[k], err, "expected a %s here", type_of(lay, p, slot));
        int specs = ct_param_layout_layer_specs(&g->layout, pl[k]), want = specs_in(lay, p, slot);
        if (specs != want)
            return ct_hf_shape_errf(g, lay, pl[k], err, "%d parameter tensors, %s's %s has %d%s", specs, lay->model,
                                    type_of(lay, p, slot), want,
                                    specs < want ? " (a linear without bias?)"
                                    : strcmp(l->type->name, "linear") == 0 ? " (a linear with bias?)" : "");
        if (p != CT_HF_BLOCK) continue;
        for (int b = 0; b < lay->n_between; b++)
            if (lay->between[b].after == slot && !has_between(g, pl[k], pl[k + 1], &lay->between[b]))
                return ct_hf_shape_errf(g, lay, pl[k], err, "expected a %s%s%s after it", lay->between[b].type,
                                        lay->between[b].approximate ? " with approximate " : "",
                                        lay->between[b].approximate ? lay->between[b].approximate : "");
    }
    return CT_OK;
}

static void add_entry(ct_tensor_map *m, const char *name, int view, bool transpose, int64_t row0, int64_t rows,
                      bool dup) {
    ct_tmap_entry *e = &m->entries[m->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->view = view;
    e->transpose = transpose;
    e->row0 = row0;
    e->rows = rows;
    e->duplicate = dup;
}

int ct_hf_map_walk(const ct_graph *g, const ct_hf_layout *lay, int64_t classes, ct_tensor_map *out, int **pl_out,
                   int *n_pl, int *blocks_out, ct_err *err) {
    int n = 0, blocks = 0;
    int *pl = ct_hf_param_layers(g, &n);
    int rc = check_shape(g, lay, pl, n, &blocks, err);
    if (rc) {
        free(pl);
        return rc;
    }
    int per = slots_in(lay, CT_HF_BLOCK), embed = slots_in(lay, CT_HF_EMBED), final = slots_in(lay, CT_HF_FINAL);
    out->entries = ct_xcalloc((size_t)(lay->n_rows * (blocks + 1)), sizeof *out->entries);
    out->n = 0;
    for (int r = 0; r < lay->n_rows; r++) {
        const ct_hf_row *row = &lay->rows[r];
        for (int b = 0; b < (row->where == CT_HF_BLOCK ? blocks : 1); b++) {
            int layer = row->where == CT_HF_EMBED ? pl[row->slot]
                        : row->where == CT_HF_FINAL ? pl[n - final + row->slot]
                                                    : pl[embed + b * per + row->slot];
            int view = ct_param_layout_layer_view(&g->layout, layer, row->spec);
            int64_t rows = row->vocab ? classes : g->layout.views[view].shape.d[0], row0 = 0;
            if (row->block) lay->row_block(g, layer, row->block, g->layout.views[view].shape.d[0], &row0, &rows);
            char name[CT_TMAP_NAME], prefix[64] = "";
            if (row->where == CT_HF_BLOCK) snprintf(prefix, sizeof prefix, lay->block_name, b);
            snprintf(name, sizeof name, "%s%s", prefix, row->hf);
            /* a tied head reads the embedding's view: the file's copy is optional */
            bool dup = row->tied && ct_param_layout_is_alias(&g->layout, layer, row->spec);
            add_entry(out, name, view, row->transpose, row0, rows, dup);
        }
    }
    *pl_out = pl;
    *n_pl = n;
    *blocks_out = blocks;
    return CT_OK;
}

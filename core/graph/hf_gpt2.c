/* hf_gpt2.c: the map of a ctrain GPT's views to Hugging Face's GPT-2 tensors (hf_gpt2.h).
 *
 * The graph's layers that hold parameters are split into three parts: the embeddings, L blocks of
 * six, and the final two (ln_f and the head). The table below has one row per tensor kind: the
 * part, the position of its layer in the part (its slot), that layer's type, which of the
 * layer's parameters (0 weight, 1 bias), GPT-2's name (after "h.<i>." in a block) and how the
 * tensor is stored there. Everything else (the walk, the checks, the names) follows from it. */
#include "core/graph/hf_gpt2.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/internal.h"

typedef enum { PART_EMBED, PART_BLOCK, PART_FINAL, N_PARTS } part;

typedef struct hf_row {
    part where;
    int slot;                    /* the layer's position among the part's parameter layers */
    const char *type;            /* ctrain layer type of that layer */
    int spec;                    /* the layer's parameter: 0 weight, 1 bias */
    const char *hf;              /* GPT-2's name ("h.<i>." before it in a block) */
    bool transpose;              /* Conv1D: stored [in, out], a ctrain linear is [out, in] */
    bool vocab;                  /* rows: the predicted classes (GPT-2's vocabulary is unpadded) */
    bool tied;                   /* the head: reads wte's view; the file's copy is optional */
} hf_row;

static const hf_row rows[] = {
    {PART_EMBED, 0, "embedding", 0, "wte.weight", false, true, false},
    {PART_EMBED, 1, "position_embedding", 0, "wpe.weight", false, false, false},
    {PART_BLOCK, 0, "layernorm", 0, "ln_1.weight", false, false, false},
    {PART_BLOCK, 0, "layernorm", 1, "ln_1.bias", false, false, false},
    {PART_BLOCK, 1, "linear", 0, "attn.c_attn.weight", true, false, false},
    {PART_BLOCK, 1, "linear", 1, "attn.c_attn.bias", false, false, false},
    {PART_BLOCK, 2, "linear", 0, "attn.c_proj.weight", true, false, false},
    {PART_BLOCK, 2, "linear", 1, "attn.c_proj.bias", false, false, false},
    {PART_BLOCK, 3, "layernorm", 0, "ln_2.weight", false, false, false},
    {PART_BLOCK, 3, "layernorm", 1, "ln_2.bias", false, false, false},
    {PART_BLOCK, 4, "linear", 0, "mlp.c_fc.weight", true, false, false},
    {PART_BLOCK, 4, "linear", 1, "mlp.c_fc.bias", false, false, false},
    {PART_BLOCK, 5, "linear", 0, "mlp.c_proj.weight", true, false, false},
    {PART_BLOCK, 5, "linear", 1, "mlp.c_proj.bias", false, false, false},
    {PART_FINAL, 0, "layernorm", 0, "ln_f.weight", false, false, false},
    {PART_FINAL, 0, "layernorm", 1, "ln_f.bias", false, false, false},
    {PART_FINAL, 1, "linear", 0, "lm_head.weight", false, true, true},
};

/* Inside a block, the layer that must come between two slots (after slot `after`): attention
 * between c_attn and c_proj, GPT-2's tanh GELU (gelu_new) between c_fc and c_proj. */
static const struct { int after; const char *type; const char *approximate; } between[] = {
    {1, "causal_self_attention", NULL},
    {4, "gelu", "tanh"},
};

/* Buffers GPT-2's files carry in every block that hold no weights (the causal mask, -1e4). */
static const char *const block_buffers[] = {"attn.bias", "attn.masked_bias"};

/* The name every tensor of GPT2LMHeadModel's own files starts with; optional on load. */
#define HF_PREFIX "transformer."

#define HF_HINT "  (GPT-2's layout, as transformers' GPT2LMHeadModel saves it: wte [vocab, C], wpe " \
                "[n_positions, C], per block h.<i>.ln_1, attn.c_attn [C, 3C], attn.c_proj [C, C], ln_2, " \
                "mlp.c_fc [C, 4C], mlp.c_proj [4C, C], then ln_f; Conv1D weights are [in, out]. The model " \
                "must have GPT-2's sizes: its vocabulary may be padded past the file's when " \
                "model.loss.classes names the file's vocabulary, e.g. 50304 with classes 50257.)"

/* Parameter layers in each part's slots: the part's size is its highest slot + 1. */
static int slots_in(part p) {
    int n = 0;
    for (int i = 0; i < CT_ARRAY_LEN(rows); i++)
        if (rows[i].where == p && rows[i].slot + 1 > n) n = rows[i].slot + 1;
    return n;
}

static int specs_in(part p, int slot) {
    int n = 0;
    for (int i = 0; i < CT_ARRAY_LEN(rows); i++) n += rows[i].where == p && rows[i].slot == slot;
    return n;
}

static const char *type_of(part p, int slot) {
    for (int i = 0; i < CT_ARRAY_LEN(rows); i++)
        if (rows[i].where == p && rows[i].slot == slot) return rows[i].type;
    return "?";
}

bool ct_hf_gpt2_names(const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        const char *s = names[i];
        if (strncmp(s, HF_PREFIX, strlen(HF_PREFIX)) == 0) s += strlen(HF_PREFIX);
        if (s[0] != 'h' || s[1] != '.' || s[2] < '0' || s[2] > '9') continue;
        s += 2;
        while (*s >= '0' && *s <= '9') s++;
        if (*s == '.') return true;
    }
    return false;
}

static int shape_errf(const ct_graph *g, int layer, ct_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int shape_errf(const ct_graph *g, int layer, ct_err *err, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (layer < 0)
        return ct_errf(err, CT_ERR_CONFIG, "the model is not GPT-2's shape for layout %s: %s.\n%s",
                       CT_HF_GPT2_LAYOUT, what, HF_HINT);
    const ct_layer *l = &g->nodes[layer].l;
    return ct_errf(err, CT_ERR_CONFIG, "the model is not GPT-2's shape for layout %s: %s \"%s\" (%s): %s.\n%s",
                   CT_HF_GPT2_LAYOUT, l->path, l->name, l->type->name, what, HF_HINT);
}

/* The layers that hold parameters, in order; *n receives their count. */
static int *param_layers(const ct_graph *g, int *n) {
    int *out = ct_xcalloc((size_t)g->n_nodes + 1, sizeof *out);
    *n = 0;
    for (int j = 0; j < g->n_nodes; j++)
        if (ct_param_layout_layer_specs(&g->layout, j) > 0) out[(*n)++] = j;
    return out;
}

/* The layer between two slots of a block is there: a layer of `type` (and gelu's approximation)
 * among the layers strictly between layers lo and hi. */
static bool has_between(const ct_graph *g, int lo, int hi, const char *type, const char *approximate) {
    for (int j = lo + 1; j < hi; j++) {
        const ct_layer *l = &g->nodes[j].l;
        if (strcmp(l->type->name, type) != 0) continue;
        const cJSON *a = approximate ? cJSON_GetObjectItemCaseSensitive(l->node, "approximate") : NULL;
        if (!approximate || (cJSON_IsString(a) && strcmp(a->valuestring, approximate) == 0)) return true;
    }
    return false;
}

/* Check the parameter layers against the table; *blocks receives L. */
static int check_shape(const ct_graph *g, const int *pl, int n, int *blocks, ct_err *err) {
    int fixed = slots_in(PART_EMBED) + slots_in(PART_FINAL), per = slots_in(PART_BLOCK);
    if (n < fixed + per || (n - fixed) % per)
        return shape_errf(g, -1, err, "layers holding parameters: %d, expected %d + %d per block (wte, wpe, "
                          "%d per block, ln_f, the head)", n, fixed, per, per);
    *blocks = (n - fixed) / per;
    for (int k = 0; k < n; k++) {
        part p = k < slots_in(PART_EMBED) ? PART_EMBED : k >= n - slots_in(PART_FINAL) ? PART_FINAL : PART_BLOCK;
        int slot = p == PART_EMBED ? k : p == PART_FINAL ? k - (n - slots_in(PART_FINAL))
                                                          : (k - slots_in(PART_EMBED)) % per;
        const ct_layer *l = &g->nodes[pl[k]].l;
        if (strcmp(l->type->name, type_of(p, slot)) != 0)
            return shape_errf(g, pl[k], err, "expected a %s here", type_of(p, slot));
        int specs = ct_param_layout_layer_specs(&g->layout, pl[k]);
        if (specs != specs_in(p, slot))
            return shape_errf(g, pl[k], err, "%d parameter tensors, GPT-2's %s has %d%s", specs,
                              type_of(p, slot), specs_in(p, slot),
                              specs < specs_in(p, slot) ? " (a linear without bias?)" : " (a head with bias?)");
        if (p != PART_BLOCK) continue;
        for (int b = 0; b < CT_ARRAY_LEN(between); b++)
            if (between[b].after == slot && !has_between(g, pl[k], pl[k + 1], between[b].type, between[b].approximate))
                return shape_errf(g, pl[k], err, "expected a %s%s%s after it", between[b].type,
                                  between[b].approximate ? " with approximate " : "",
                                  between[b].approximate ? between[b].approximate : "");
    }
    return CT_OK;
}

static void add_entry(ct_tensor_map *m, const char *name, int view, bool transpose, int64_t rows_, bool dup) {
    ct_tmap_entry *e = &m->entries[m->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->view = view;
    e->transpose = transpose;
    e->rows = rows_;
    e->duplicate = dup;
}

int ct_hf_gpt2_map(const ct_graph *g, ct_tensor_map *out, ct_err *err) {
    *out = (ct_tensor_map){.layout = CT_HF_GPT2_LAYOUT, .prefix = HF_PREFIX, .write_prefix = HF_PREFIX,
                           .hint = HF_HINT};
    int n = 0, blocks = 0;
    int *pl = param_layers(g, &n);
    int rc = check_shape(g, pl, n, &blocks, err);
    int64_t classes = g->info.loss == CT_LOSS_CROSS_ENTROPY ? g->info.classes : 0;
    if (!rc && classes <= 0) rc = shape_errf(g, -1, err, "the loss is not cross_entropy over the vocabulary");
    int wte = rc ? -1 : ct_param_layout_layer_view(&g->layout, pl[0], 0);
    if (!rc && (!ct_param_layout_is_alias(&g->layout, pl[n - 1], 0) ||
                ct_param_layout_layer_view(&g->layout, pl[n - 1], 0) != wte))
        rc = shape_errf(g, pl[n - 1], err, "GPT-2's head is tied to wte: give it \"tie\": \"%s\"",
                        g->layout.views[wte].name);
    if (rc) {
        free(pl);
        return rc;
    }
    int per = slots_in(PART_BLOCK), first_block = slots_in(PART_EMBED);
    out->entries = ct_xcalloc((size_t)(CT_ARRAY_LEN(rows) * blocks), sizeof *out->entries);
    out->ignored = ct_xcalloc((size_t)(CT_ARRAY_LEN(block_buffers) * blocks), sizeof *out->ignored);
    for (int r = 0; r < CT_ARRAY_LEN(rows); r++) {
        const hf_row *row = &rows[r];
        for (int b = 0; b < (row->where == PART_BLOCK ? blocks : 1); b++) {
            int layer = row->where == PART_EMBED ? pl[row->slot]
                        : row->where == PART_FINAL ? pl[n - slots_in(PART_FINAL) + row->slot]
                                                   : pl[first_block + b * per + row->slot];
            int view = ct_param_layout_layer_view(&g->layout, layer, row->spec);
            char name[CT_TMAP_NAME];
            if (row->where == PART_BLOCK) snprintf(name, sizeof name, "h.%d.%s", b, row->hf);
            else snprintf(name, sizeof name, "%s", row->hf);
            add_entry(out, name, view, row->transpose,
                      row->vocab ? classes : g->layout.views[view].shape.d[0], row->tied);
        }
    }
    for (int b = 0; b < blocks; b++)
        for (int k = 0; k < CT_ARRAY_LEN(block_buffers); k++)
            snprintf(out->ignored[out->n_ignored++], CT_TMAP_NAME, "h.%d.%s", b, block_buffers[k]);
    free(pl);
    return CT_OK;
}

void ct_hf_gpt2_config(const ct_graph *g, char *buf, size_t n) {
    int np = 0, heads = 0, blocks = 0;
    int *pl = param_layers(g, &np);
    double eps = 1e-5;
    for (int j = 0; j < g->n_nodes; j++) {
        const ct_layer *l = &g->nodes[j].l;
        if (strcmp(l->type->name, "causal_self_attention") == 0) {
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(l->node, "heads");
            heads = cJSON_IsNumber(h) ? h->valueint : 0;
            blocks++;
        }
        const cJSON *e = strcmp(l->type->name, "layernorm") == 0 ? cJSON_GetObjectItemCaseSensitive(l->node, "eps")
                                                                   : NULL;
        if (cJSON_IsNumber(e)) eps = e->valuedouble;
    }
    const ct_shape *wpe = np > 1 ? &g->layout.views[ct_param_layout_layer_view(&g->layout, pl[1], 0)].shape : NULL;
    snprintf(buf, n, "vocab_size=%lld, n_positions=%lld, n_embd=%lld, n_layer=%d, n_head=%d, "
             "activation_function=\"gelu_new\", layer_norm_epsilon=%g, tie_word_embeddings=True",
             (long long)g->info.classes, wpe ? (long long)wpe->d[0] : 0LL, wpe ? (long long)wpe->d[1] : 0LL,
             blocks, heads, eps);
    free(pl);
}

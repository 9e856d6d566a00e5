/* hf_gpt2.c: the map of a ctrain GPT's views to Hugging Face's GPT-2 tensors (hf_gpt2.h).
 *
 * The graph's layers that hold parameters are split into three parts: the embeddings, L blocks of
 * six, and the final two (ln_f and the head). The table below has one row per tensor kind: the
 * part, the position of its layer in the part (its slot), that layer's type, which of the
 * layer's parameters (0 weight, 1 bias), GPT-2's name (after "h.<i>." in a block) and how the
 * tensor is stored there. Everything else (the walk, the checks, the names) follows from it. */
#include "core/graph/hf_gpt2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/hf_map.h"
#include "core/graph/internal.h"

static const ct_hf_row rows[] = {
    /* part, slot, type, spec, GPT-2's name, transpose, vocab, tied, row block */
    {CT_HF_EMBED, 0, "embedding", 0, "wte.weight", false, true, false, 0},
    {CT_HF_EMBED, 1, "position_embedding", 0, "wpe.weight", false, false, false, 0},
    {CT_HF_BLOCK, 0, "layernorm", 0, "ln_1.weight", false, false, false, 0},
    {CT_HF_BLOCK, 0, "layernorm", 1, "ln_1.bias", false, false, false, 0},
    {CT_HF_BLOCK, 1, "linear", 0, "attn.c_attn.weight", true, false, false, 0},
    {CT_HF_BLOCK, 1, "linear", 1, "attn.c_attn.bias", false, false, false, 0},
    {CT_HF_BLOCK, 2, "linear", 0, "attn.c_proj.weight", true, false, false, 0},
    {CT_HF_BLOCK, 2, "linear", 1, "attn.c_proj.bias", false, false, false, 0},
    {CT_HF_BLOCK, 3, "layernorm", 0, "ln_2.weight", false, false, false, 0},
    {CT_HF_BLOCK, 3, "layernorm", 1, "ln_2.bias", false, false, false, 0},
    {CT_HF_BLOCK, 4, "linear", 0, "mlp.c_fc.weight", true, false, false, 0},
    {CT_HF_BLOCK, 4, "linear", 1, "mlp.c_fc.bias", false, false, false, 0},
    {CT_HF_BLOCK, 5, "linear", 0, "mlp.c_proj.weight", true, false, false, 0},
    {CT_HF_BLOCK, 5, "linear", 1, "mlp.c_proj.bias", false, false, false, 0},
    {CT_HF_FINAL, 0, "layernorm", 0, "ln_f.weight", false, false, false, 0},
    {CT_HF_FINAL, 0, "layernorm", 1, "ln_f.bias", false, false, false, 0},
    {CT_HF_FINAL, 1, "linear", 0, "lm_head.weight", false, true, true, 0},
};

/* Inside a block, the layer that must come between two slots (after slot `after`): attention
 * between c_attn and c_proj, GPT-2's tanh GELU (gelu_new) between c_fc and c_proj. */
static const ct_hf_between between[] = {
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

static const ct_hf_layout layout = {
    .name = CT_HF_GPT2_LAYOUT, .model = "GPT-2", .parts = "wte, wpe, %d per block, ln_f, the head",
    .rows = rows, .n_rows = CT_ARRAY_LEN(rows), .between = between, .n_between = CT_ARRAY_LEN(between),
    .block_name = "h.%d.", .hint = HF_HINT,
};

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

int ct_hf_gpt2_map(const ct_graph *g, ct_tensor_map *out, ct_err *err) {
    *out = (ct_tensor_map){.layout = CT_HF_GPT2_LAYOUT, .prefix = HF_PREFIX, .write_prefix = HF_PREFIX,
                           .hint = HF_HINT};
    int n = 0, blocks = 0, *pl = NULL;
    int64_t classes = g->info.loss == CT_LOSS_CROSS_ENTROPY ? g->info.classes : 0;
    int rc = ct_hf_map_walk(g, &layout, classes, out, &pl, &n, &blocks, err);
    if (!rc && classes <= 0) rc = ct_hf_shape_errf(g, &layout, -1, err, "the loss is not cross_entropy over the vocabulary");
    int wte = rc ? -1 : ct_param_layout_layer_view(&g->layout, pl[0], 0);
    if (!rc && (!ct_param_layout_is_alias(&g->layout, pl[n - 1], 0) ||
                ct_param_layout_layer_view(&g->layout, pl[n - 1], 0) != wte))
        rc = ct_hf_shape_errf(g, &layout, pl[n - 1], err, "GPT-2's head is tied to wte: give it \"tie\": \"%s\"",
                              g->layout.views[wte].name);
    free(pl);
    if (rc) {
        ct_tensor_map_free(out);
        *out = (ct_tensor_map){0};
        return rc;
    }
    out->ignored = ct_xcalloc((size_t)(CT_ARRAY_LEN(block_buffers) * blocks) + 1, sizeof *out->ignored);
    for (int b = 0; b < blocks; b++)
        for (int k = 0; k < CT_ARRAY_LEN(block_buffers); k++)
            snprintf(out->ignored[out->n_ignored++], CT_TMAP_NAME, "h.%d.%s", b, block_buffers[k]);
    return CT_OK;
}

void ct_hf_gpt2_config(const ct_graph *g, char *buf, size_t n) {
    int np = 0, heads = 0, blocks = 0;
    int *pl = ct_hf_param_layers(g, &np);
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

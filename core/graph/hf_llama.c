/* hf_llama.c: the map of a ctrain Llama's views to Hugging Face's Llama tensors, the check of a
 * Hugging Face config.json against the model, and the config.json an export writes (hf_llama.h).
 * The table below has one row per tensor kind (core/graph/hf_map.h); q_proj, k_proj and v_proj are
 * row blocks of one fused linear, gate_proj and up_proj the halves of another. */
#include "core/graph/hf_llama.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/hf_map.h"
#include "core/graph/internal.h"

enum { BLOCK_Q = 1, BLOCK_K, BLOCK_V, BLOCK_GATE, BLOCK_UP };

static const ct_hf_row rows[] = {
    /* part, slot, type, spec, Llama's name, transpose, vocab, tied, row block */
    {CT_HF_EMBED, 0, "embedding", 0, "model.embed_tokens.weight", false, true, false, 0},
    {CT_HF_BLOCK, 0, "rmsnorm", 0, "input_layernorm.weight", false, false, false, 0},
    {CT_HF_BLOCK, 1, "linear", 0, "self_attn.q_proj.weight", false, false, false, BLOCK_Q},
    {CT_HF_BLOCK, 1, "linear", 0, "self_attn.k_proj.weight", false, false, false, BLOCK_K},
    {CT_HF_BLOCK, 1, "linear", 0, "self_attn.v_proj.weight", false, false, false, BLOCK_V},
    {CT_HF_BLOCK, 2, "linear", 0, "self_attn.o_proj.weight", false, false, false, 0},
    {CT_HF_BLOCK, 3, "rmsnorm", 0, "post_attention_layernorm.weight", false, false, false, 0},
    {CT_HF_BLOCK, 4, "linear", 0, "mlp.gate_proj.weight", false, false, false, BLOCK_GATE},
    {CT_HF_BLOCK, 4, "linear", 0, "mlp.up_proj.weight", false, false, false, BLOCK_UP},
    {CT_HF_BLOCK, 5, "linear", 0, "mlp.down_proj.weight", false, false, false, 0},
    {CT_HF_FINAL, 0, "rmsnorm", 0, "model.norm.weight", false, false, false, 0},
    {CT_HF_FINAL, 1, "linear", 0, "lm_head.weight", false, true, true, 0},
};

/* The attention between the fused q, k, v projection and o_proj; SwiGLU between gate_up and down. */
static const ct_hf_between between[] = {
    {1, "causal_self_attention", NULL},
    {4, "swiglu", NULL},
};

/* The rotary frequencies older files keep as a buffer in every block: no weights. */
#define INV_FREQ "self_attn.rotary_emb.inv_freq"

#define HF_HINT "  (Llama's layout, as transformers' LlamaForCausalLM saves it: model.embed_tokens [vocab, C], per " \
                "block model.layers.<i>.input_layernorm [C], self_attn.q_proj [H D, C], k_proj and v_proj [KV D, C], " \
                "o_proj [C, H D], post_attention_layernorm [C], mlp.gate_proj and up_proj [I, C], down_proj [C, I], " \
                "then model.norm [C] and lm_head [vocab, C] (left out when tied): what llama_block expands into, " \
                "with an rmsnorm and a bias-free head after the blocks.)"

static void row_block(const ct_graph *g, int layer, int k, int64_t rows_, int64_t *row0, int64_t *n);

static const ct_hf_layout layout = {
    .name = CT_HF_LLAMA_LAYOUT, .model = "Llama", .parts = "embed_tokens, %d per block, norm, lm_head",
    .rows = rows, .n_rows = CT_ARRAY_LEN(rows), .between = between, .n_between = CT_ARRAY_LEN(between),
    .block_name = "model.layers.%d.", .hint = HF_HINT, .row_block = row_block,
};

/* ---- the model's shape, read off the graph ---- */

typedef struct {
    int64_t vocab, hidden, inter, heads, kv, layers, seq;
    double eps, theta, factor;
    const char *scaling;          /* NULL, "linear" or "dynamic" */
    int64_t scaling_max_pos;      /* dynamic: max_position_embeddings */
    bool tied;
} llama_shape;

static int64_t node_int(const cJSON *node, const char *key, int64_t def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : def;
}
static double node_num(const cJSON *node, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* The attention after layer `qkv` (the fused projection): the walk has checked that there is one. */
static const ct_layer *attention_after(const ct_graph *g, int qkv) {
    int j = ct_hf_layer_between(g, qkv, g->n_nodes, "causal_self_attention");
    return j < 0 ? NULL : &g->nodes[j].l;
}

/* Rows of the fused projections: q [0, H D), k [H D, (H + KV) D), v [(H + KV) D, (H + 2 KV) D);
 * gate the first half of gate_up, up the second. */
static void row_block(const ct_graph *g, int layer, int k, int64_t rows_, int64_t *row0, int64_t *n) {
    if (k == BLOCK_GATE || k == BLOCK_UP) {
        *n = rows_ / 2;
        *row0 = k == BLOCK_UP ? rows_ / 2 : 0;
        return;
    }
    const ct_layer *a = attention_after(g, layer);
    int64_t H = a ? node_int(a->node, "heads", 1) : 1, KV = a ? node_int(a->node, "kv_heads", H) : 1;
    int64_t D = rows_ / (H + 2 * KV);
    *row0 = k == BLOCK_Q ? 0 : k == BLOCK_K ? H * D : (H + KV) * D;
    *n = (k == BLOCK_Q ? H : KV) * D;
}

/* The block's settings Hugging Face's config holds once: every block must have block 0's. */
static int read_attention(const ct_graph *g, const ct_layer *a, llama_shape *s, bool first, ct_err *err) {
    int64_t heads = node_int(a->node, "heads", 0), kv = node_int(a->node, "kv_heads", heads);
    double theta = node_num(a->node, "rope_theta", 0);
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(a->node, "rope_scaling");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sc, "type");
    const char *scaling = cJSON_IsString(type) && strcmp(type->valuestring, "default") ? type->valuestring : NULL;
    double factor = scaling ? node_num(sc, "factor", 1) : 1;
    int64_t max_pos = scaling ? node_int(sc, "max_position_embeddings", 0) : 0;
    if (theta == 0)
        return ct_errf(err, CT_ERR_CONFIG, "the model is not Llama's shape for layout %s: %s \"%s\": Llama's attention "
                       "turns q and k by their position: give it \"rope_theta\" (10000 in Llama 2, 500000 in Llama 3)",
                       CT_HF_LLAMA_LAYOUT, a->path, a->name);
    if (first) {
        s->heads = heads, s->kv = kv, s->theta = theta, s->scaling = scaling, s->factor = factor;
        s->scaling_max_pos = max_pos;
        return CT_OK;
    }
    if (heads != s->heads || kv != s->kv || theta != s->theta || factor != s->factor || max_pos != s->scaling_max_pos ||
        (scaling == NULL) != (s->scaling == NULL) || (scaling && strcmp(scaling, s->scaling)))
        return ct_errf(err, CT_ERR_CONFIG, "the model is not Llama's shape for layout %s: %s \"%s\": heads, kv_heads, "
                       "rope_theta or rope_scaling differ from the first block's; Hugging Face's config holds one "
                       "setting for every block", CT_HF_LLAMA_LAYOUT, a->path, a->name);
    return CT_OK;
}

/* The map and the shape; on failure *map is empty. */
static int read_model(const ct_graph *g, ct_tensor_map *map, llama_shape *s, ct_err *err) {
    *map = (ct_tensor_map){.layout = CT_HF_LLAMA_LAYOUT, .hint = HF_HINT};
    *s = (llama_shape){0};
    int n = 0, blocks = 0, *pl = NULL;
    int64_t classes = g->info.loss == CT_LOSS_CROSS_ENTROPY ? g->info.classes : 0;
    int rc = ct_hf_map_walk(g, &layout, classes, map, &pl, &n, &blocks, err);
    if (!rc && classes <= 0)
        rc = ct_hf_shape_errf(g, &layout, -1, err, "the loss is not cross_entropy over the vocabulary");
    if (!rc) {
        const ct_param_layout *L = &g->layout;
        s->vocab = classes, s->layers = blocks, s->seq = g->info.input_shape.d[0];
        s->hidden = L->views[ct_param_layout_layer_view(L, pl[0], 0)].shape.d[1];
        s->inter = L->views[ct_param_layout_layer_view(L, pl[1 + 4], 0)].shape.d[0] / 2;
        s->tied = ct_param_layout_is_alias(L, pl[n - 1], 0);
        s->eps = -1;
        for (int k = 0; k < n && !rc; k++) {
            const ct_layer *l = &g->nodes[pl[k]].l;
            if (strcmp(l->type->name, "rmsnorm") == 0) {
                double eps = node_num(l->node, "eps", 1e-6);
                if (s->eps >= 0 && eps != s->eps)
                    rc = ct_hf_shape_errf(g, &layout, pl[k], err, "eps %g, the first rmsnorm's is %g: Hugging Face's "
                                          "config holds one rms_norm_eps", eps, s->eps);
                s->eps = eps;
            }
        }
        for (int b = 0; b < blocks && !rc; b++) rc = read_attention(g, attention_after(g, pl[1 + b * 6 + 1]), s, b == 0, err);
        if (!rc && s->heads * (s->hidden / s->heads) != s->hidden)
            rc = ct_hf_shape_errf(g, &layout, -1, err, "width %lld is not heads %lld x the head dim",
                                  (long long)s->hidden, (long long)s->heads);
    }
    free(pl);
    if (rc) {
        ct_tensor_map_free(map);
        *map = (ct_tensor_map){0};
        return rc;
    }
    map->ignored = ct_xcalloc((size_t)blocks + 1, sizeof *map->ignored);
    for (int b = 0; b < blocks; b++) snprintf(map->ignored[map->n_ignored++], CT_TMAP_NAME, "model.layers.%d." INV_FREQ, b);
    return CT_OK;
}

int ct_hf_llama_map(const ct_graph *g, ct_tensor_map *out, ct_err *err) {
    llama_shape s;
    return read_model(g, out, &s, err);
}

/* ---- config.json ---- */

typedef struct {
    const ct_json_doc *doc;
    const cJSON *root;
    ct_err *err;
    int bad;
} checker;

/* One mismatch line "  FILE:L:C: text" (12 at most, then counted). */
static void mismatch(checker *c, const cJSON *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void mismatch(checker *c, const cJSON *at, const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int line = 0, col = 0;
    if (c->bad++ >= 12) return;
    if (at && ct_json_pos(c->doc, at, &line, &col))
        ct_err_append(c->err, "  %s:%d:%d: %s", ct_json_filename(c->doc), line, col, text);
    else
        ct_err_append(c->err, "  %s: %s", ct_json_filename(c->doc), text);
}

static const cJSON *key(const checker *c, const char *k) { return cJSON_GetObjectItemCaseSensitive(c->root, k); }

/* An integer key equal to the model's `want` (missing: def, or a mismatch when def < 0). */
static int64_t expect_int(checker *c, const char *k, int64_t def, int64_t want, const char *ours) {
    const cJSON *v = key(c, k);
    if (!v && def < 0) {
        mismatch(c, NULL, "%s missing (the model's %s is %lld)", k, ours, (long long)want);
        return want;
    }
    int64_t got = v ? (cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1) : def;
    if (got != want) mismatch(c, v, "%s is %lld, the model's %s is %lld", k, (long long)got, ours, (long long)want);
    return got;
}

static double expect_num(checker *c, const char *k, double def, double want, const char *ours) {
    const cJSON *v = key(c, k);
    double got = v ? (cJSON_IsNumber(v) ? v->valuedouble : NAN) : def;
    if (!(fabs(got - want) <= 1e-12 * fabs(want))) mismatch(c, v, "%s is %g, the model's %s is %g", k, got, ours, want);
    return got;
}

static bool flag(const checker *c, const char *k) { return cJSON_IsTrue(key(c, k)); }

/* model_type: Llama's own, or Mistral's (Llama's names and math, and a sliding window). */
static void check_model_type(checker *c, const llama_shape *s) {
    const cJSON *t = key(c, "model_type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "";
    if (key(c, "num_local_experts") || key(c, "num_experts") || strstr(type, "moe") || strcmp(type, "mixtral") == 0) {
        mismatch(c, t, "model_type \"%s\" is a mixture of experts: ctrain's llama_block has one MLP", type);
    } else if (strncmp(type, "qwen2", 5) == 0) {
        mismatch(c, t, "model_type \"%s\": Qwen2 has biases on q_proj, k_proj and v_proj, which llama_block does "
                 "not have", type);
    } else if (strcmp(type, "mistral") == 0) {
        const cJSON *w = key(c, "sliding_window");
        if (cJSON_IsNumber(w) && w->valuedouble < (double)s->seq)
            mismatch(c, w, "sliding_window %lld is shorter than the model's sequence of %lld: ctrain's attention sees "
                     "every earlier token (use sequences of at most %lld)", (long long)w->valuedouble, (long long)s->seq,
                     (long long)w->valuedouble);
    } else if (strcmp(type, "llama") != 0) {
        mismatch(c, t, "model_type \"%s\": ctrain reads Llama-family checkpoints (model_type llama, or mistral)", type);
    }
}

/* rope_scaling: none ("default"), or the attention's linear or dynamic scaling. */
static void check_scaling(checker *c, const llama_shape *s) {
    const cJSON *r = key(c, "rope_scaling");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(r, "type");
    const char *type = cJSON_IsString(t) && strcmp(t->valuestring, "default") ? t->valuestring : NULL;
    if (type && strcmp(type, "linear") && strcmp(type, "dynamic")) {
        mismatch(c, t, "rope_scaling type \"%s\" is not supported: ctrain does \"linear\" and \"dynamic\"", type);
        return;
    }
    if ((type == NULL) != (s->scaling == NULL) || (type && strcmp(type, s->scaling))) {
        mismatch(c, r, "rope_scaling is %s, the model's attention has %s", type ? type : "none",
                 s->scaling ? s->scaling : "none");
        return;
    }
    if (!type) return;
    double f = node_num(r, "factor", NAN);
    if (f != s->factor) mismatch(c, r, "rope_scaling.factor is %g, the model's is %g", f, s->factor);
    if (strcmp(type, "dynamic") == 0)
        expect_int(c, "max_position_embeddings", 2048, s->scaling_max_pos,
                   "dynamic rope_scaling.max_position_embeddings");
}

/* The model section that would match the file, for the hint. */
static void suggest(const checker *c, ct_err *err) {
    const cJSON *h = key(c, "num_attention_heads");
    if (!cJSON_IsNumber(h) || !cJSON_IsNumber(key(c, "hidden_size"))) return;
    const cJSON *kv = key(c, "num_key_value_heads");
    ct_err_append(err, "  A model of the file's shape: {\"type\": \"embedding\", \"vocab\": %.0f, \"dim\": %.0f}, "
                  "{\"type\": \"repeat\", \"times\": %.0f, \"layers\": [{\"type\": \"llama_block\", \"heads\": %.0f, "
                  "\"kv_heads\": %.0f, \"intermediate\": %.0f, \"rope_theta\": %g, \"eps\": %g}]}, {\"type\": "
                  "\"rmsnorm\", \"eps\": %g}, {\"type\": \"linear\", \"out\": %.0f, \"bias\": false%s}",
                  node_num(c->root, "vocab_size", 0), node_num(c->root, "hidden_size", 0),
                  node_num(c->root, "num_hidden_layers", 0), h->valuedouble,
                  cJSON_IsNumber(kv) ? kv->valuedouble : h->valuedouble, node_num(c->root, "intermediate_size", 0),
                  node_num(c->root, "rope_theta", 10000), node_num(c->root, "rms_norm_eps", 1e-6),
                  node_num(c->root, "rms_norm_eps", 1e-6), node_num(c->root, "vocab_size", 0),
                  flag(c, "tie_word_embeddings") ? ", \"tie\": \"<the embedding>.weight\"" : "");
}

int ct_hf_llama_check_config(const ct_graph *g, const ct_json_doc *doc, ct_warnings *warn, ct_err *err) {
    ct_tensor_map map;
    llama_shape s;
    int rc = read_model(g, &map, &s, err);
    ct_tensor_map_free(&map);
    if (rc) return rc;
    checker c = {.doc = doc, .root = ct_json_root(doc), .err = err};
    ct_errf(err, CT_ERR_CONFIG, "%s does not describe the model:", ct_json_filename(doc));
    check_model_type(&c, &s);
    expect_int(&c, "hidden_size", -1, s.hidden, "width (the embedding's dim)");
    expect_int(&c, "intermediate_size", -1, s.inter, "llama_block intermediate");
    expect_int(&c, "num_hidden_layers", -1, s.layers, "block count");
    int64_t heads = expect_int(&c, "num_attention_heads", -1, s.heads, "heads");
    expect_int(&c, "num_key_value_heads", heads, s.kv, "kv_heads");
    expect_int(&c, "vocab_size", -1, s.vocab, "vocabulary (the loss's classes)");
    if (key(&c, "head_dim") && !cJSON_IsNull(key(&c, "head_dim")))
        expect_int(&c, "head_dim", s.hidden / s.heads, s.hidden / s.heads, "head dim (width / heads)");
    expect_num(&c, "rms_norm_eps", 1e-6, s.eps, "rmsnorm eps");
    expect_num(&c, "rope_theta", 10000, s.theta, "rope_theta");
    check_scaling(&c, &s);
    bool tied = flag(&c, "tie_word_embeddings");
    if (tied != s.tied)
        mismatch(&c, key(&c, "tie_word_embeddings"), "tie_word_embeddings is %s, the model's head is %s", tied ? "true" : "false",
                 s.tied ? "tied to the embedding" : "its own weight (no \"tie\")");
    if (flag(&c, "attention_bias"))
        mismatch(&c, key(&c, "attention_bias"), "attention_bias is true: llama_block's projections have no biases");
    if (flag(&c, "mlp_bias")) mismatch(&c, key(&c, "mlp_bias"), "mlp_bias is true: llama_block's MLP has no biases");
    const cJSON *act = key(&c, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
        mismatch(&c, act, "hidden_act is %s: llama_block's MLP is SwiGLU (silu)",
                 cJSON_IsString(act) ? act->valuestring : "not a string");
    if (c.bad) {
        if (c.bad > 12) ct_err_append(err, "  ... and %d more", c.bad - 12);
        suggest(&c, err);
        return CT_ERR_CONFIG;
    }
    *err = (ct_err){0};
    int64_t mpe = node_int(c.root, "max_position_embeddings", 2048);
    if (!s.scaling && s.seq > mpe)
        ct_warnf(warn, "%s: max_position_embeddings is %lld, the model's sequences are %lld long: positions past "
                 "the ones the checkpoint was trained on", ct_json_filename(doc), (long long)mpe, (long long)s.seq);
    return CT_OK;
}

char *ct_hf_llama_config_json(const ct_graph *g, const char *torch_dtype) {
    ct_tensor_map map;
    llama_shape s;
    ct_err err = {0};
    if (read_model(g, &map, &s, &err)) return NULL;
    ct_tensor_map_free(&map);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "architectures"), cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", "llama");
    cJSON_AddNumberToObject(c, "vocab_size", (double)s.vocab);
    cJSON_AddNumberToObject(c, "hidden_size", (double)s.hidden);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)s.inter);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)s.layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)s.heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)s.kv);
    cJSON_AddNumberToObject(c, "head_dim", (double)(s.hidden / s.heads));
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    /* a rotary model has no position table: the positions it was trained on */
    cJSON_AddNumberToObject(c, "max_position_embeddings",
                            (double)(s.scaling && strcmp(s.scaling, "dynamic") == 0 ? s.scaling_max_pos : s.seq));
    cJSON_AddNumberToObject(c, "rms_norm_eps", s.eps);
    cJSON_AddNumberToObject(c, "rope_theta", s.theta);
    if (s.scaling) {
        cJSON *r = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", s.scaling);
        cJSON_AddStringToObject(r, "type", s.scaling);   /* the key transformers before 4.38 reads */
        /* transformers wants a float ("4.0"), and cJSON prints an integral double as "4" */
        char factor[64];
        snprintf(factor, sizeof factor, "%.17g", s.factor);
        if (!strpbrk(factor, ".eEn")) strcat(factor, ".0");
        cJSON_AddRawToObject(r, "factor", factor);
    } else {
        cJSON_AddNullToObject(c, "rope_scaling");
    }
    cJSON_AddBoolToObject(c, "tie_word_embeddings", s.tied);
    cJSON_AddFalseToObject(c, "attention_bias");
    cJSON_AddFalseToObject(c, "mlp_bias");
    cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    cJSON_AddStringToObject(c, "torch_dtype", torch_dtype);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    return text;
}

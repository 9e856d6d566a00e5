/* build.c: model config -> expanded layer list ("repeat" unrolled) with resolved inputs,
 * inferred shapes and the loss; then param_specs.c lays out the parameter views and plan.c the
 * activation arena. Every error names the layer and is CT_ERR_CONFIG. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph/internal.h"

#define MAX_REPEAT_DEPTH 8
#define MODEL_INPUT_NAME "input"
#define BLOCK_INPUT_NAME "block_input"
#define NO_BLOCK (-2)          /* builder.block_input outside every repeat block */

typedef struct builder {
    const ct_config *cfg;
    const cJSON *model;
    ct_err *err;
    ct_graph *g;
    int cap;
    ct_shape input;
    ct_dtype input_dtype;
    int64_t seq_len;           /* > 0: model.input [T] is built as [seq_len] (ct_graph_build_seq) */
    int group;                 /* block instance the next layer belongs to (ct_gnode.group) */
    int block_depth;           /* > 0: inside a repeat or a block type (ct_gnode.in_block) */
    long segments;             /* checkpointing: CT_SEGMENTS_CONFIG or a planned alternative */
    int block_input;           /* what "block_input" names: the node feeding the current iteration
                                  of the innermost repeat block or block type (-1: the model
                                  input), or NO_BLOCK */
} builder;

static int model_errf(const builder *b, const cJSON *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int model_errf(const builder *b, const cJSON *node, const char *fmt, ...) {
    char where[512], text[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ct_model_where(b->cfg, node, where, sizeof where);
    return ct_errf(b->err, CT_ERR_CONFIG, "%s%s%s", where, where[0] ? ": " : "", text);
}

static const char *const common_fields[] = {"type", "name", "inputs", "init", "bias_init", "checkpoint", "tie"};

static int check_layer_fields(const builder *b, const ct_layer *l) {
    const char *allowed[32];
    int n = 0;
    for (int i = 0; i < CT_ARRAY_LEN(common_fields); i++) allowed[n++] = common_fields[i];
    for (const char *const *f = l->type->fields; f && *f && n < 32; f++) allowed[n++] = *f;
    return ct_model_check_keys(b->cfg, l, l->node, NULL, allowed, n, b->err);
}

/* ---- names and inputs ---- */

/* Index of the layer called `name` among the first `limit` layers, or -1. */
static int find_node(const ct_graph *g, const char *name, int limit) {
    for (int i = limit - 1; i >= 0; i--)
        if (strcmp(g->nodes[i].l.name, name) == 0) return i;
    return -1;
}

/* A name inside a repeat block means the layer of the same iteration first ("name" + ".2"), then
 * the enclosing scopes outwards (".2.1" -> ".2" -> ""). */
static int resolve_scoped(const ct_graph *g, const char *name, const char *suffix, int limit) {
    char scope[96], full[256];
    snprintf(scope, sizeof scope, "%s", suffix);
    for (;;) {
        snprintf(full, sizeof full, "%s%s", name, scope);
        int i = find_node(g, full, limit);
        if (i >= 0 || !scope[0]) return i;
        *strrchr(scope, '.') = '\0';
    }
}

/* Does any layer object under `arr` (recursively) have this "name"? For "defined later" errors. */
static bool name_in_json(const cJSON *arr, const char *name) {
    for (const cJSON *it = arr ? arr->child : NULL; it; it = it->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0) return true;
        if (name_in_json(cJSON_GetObjectItemCaseSensitive(it, "layers"), name)) return true;
    }
    return false;
}

static int unknown_input(const builder *b, const ct_layer *l, const cJSON *at, const char *ref,
                         const char *suffix) {
    const ct_graph *g = b->g;
    char scoped[256];
    snprintf(scoped, sizeof scoped, "%s%s", ref, suffix);
    if (strcmp(ref, l->name) == 0 || strcmp(scoped, l->name) == 0)
        return ct_layer_errf(l, b->err, at, "inputs: \"%s\" is this layer itself (a cycle); name an "
                             "earlier layer", ref);
    size_t len = strlen(ref);
    for (int i = 0; i < l->index; i++)
        if (strncmp(g->nodes[i].l.name, ref, len) == 0 && g->nodes[i].l.name[len] == '.')
            return ct_layer_errf(l, b->err, at, "inputs: no layer named \"%s\" here: it is inside a "
                                 "repeat block; name one iteration, e.g. \"%s\"", ref, g->nodes[i].l.name);
    if (name_in_json(cJSON_GetObjectItemCaseSensitive(b->model, "layers"), ref))
        return ct_layer_errf(l, b->err, at, "inputs: \"%s\" is defined after this layer; layers run in "
                             "order, so an input must come earlier (a forward reference or cycle)", ref);
    const char **cands = ct_xmalloc(sizeof(char *) * (size_t)(g->n_nodes + 3));
    int n = 0;
    cands[n++] = "prev";
    cands[n++] = MODEL_INPUT_NAME;
    if (b->block_input != NO_BLOCK) cands[n++] = BLOCK_INPUT_NAME;
    for (int i = 0; i < l->index; i++) cands[n++] = g->nodes[i].l.name;
    const char *near = ct_suggest(ref, cands, n);
    char hint[200] = "";
    if (near) snprintf(hint, sizeof hint, "; did you mean \"%s\"?", near);
    int rc = ct_layer_errf(l, b->err, at, "inputs: no layer named \"%s\" before this one%s", ref, hint);
    free(cands);
    return rc;
}

static int resolve_inputs(builder *b, ct_layer *l, const char *suffix) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, "inputs");
    int n = v ? (cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1) : 1;
    if (n < 0) return ct_layer_errf(l, b->err, v, "inputs: expected an array of layer names, e.g. "
                                    "[\"prev\"] or [\"block1\", \"skip\"]");
    if (n < l->type->min_inputs || n > l->type->max_inputs) {
        if (l->type->min_inputs == l->type->max_inputs)
            return ct_layer_errf(l, b->err, v, "takes %d input, got %d", l->type->min_inputs, n);
        return ct_layer_errf(l, b->err, v, "takes %d to %d inputs (name them in \"inputs\"), got %d",
                             l->type->min_inputs, l->type->max_inputs, n);
    }
    l->n_in = n;
    for (int i = 0; i < n; i++) {
        const cJSON *e = v ? cJSON_GetArrayItem(v, i) : NULL;
        const char *ref = e ? (cJSON_IsString(e) ? e->valuestring : NULL) : "prev";
        if (!ref) return ct_layer_errf(l, b->err, e, "inputs[%d]: expected a layer name (string)", i);
        int src;
        if (strcmp(ref, "prev") == 0) src = l->index - 1;
        else if (strcmp(ref, MODEL_INPUT_NAME) == 0) src = -1;
        else if (strcmp(ref, BLOCK_INPUT_NAME) == 0) {
            if (b->block_input == NO_BLOCK)
                return ct_layer_errf(l, b->err, e, "inputs: \"%s\" is the input of a repeat block's "
                                     "iteration, and this layer is not inside a repeat block; name the "
                                     "layer it means (or \"prev\", \"%s\")", ref, MODEL_INPUT_NAME);
            src = b->block_input;
        }
        else if ((src = resolve_scoped(b->g, ref, suffix, l->index)) < 0) return unknown_input(b, l, e, ref, suffix);
        l->in_from[i] = src;
        if (src < 0) {
            l->in[i] = b->input;
            if (b->input_dtype == CT_I32) l->in_dtype = CT_I32;   /* any token input makes it so */
            snprintf(l->in_name[i], sizeof l->in_name[i], "the model input");
        } else {
            l->in[i] = b->g->nodes[src].l.out;
            snprintf(l->in_name[i], sizeof l->in_name[i], "\"%.96s\"", b->g->nodes[src].l.name);
        }
    }
    return CT_OK;
}

/* ---- one layer ---- */

static int check_output(builder *b, const ct_layer *l) {
    char s[96];
    for (int d = 0; d < l->out.ndim; d++)
        if (l->out.d[d] < 1)
            return ct_layer_errf(l, b->err, NULL, "output shape %s has a zero or negative dimension",
                                 ct_shape_str(&l->out, s, sizeof s));
    if (ct_shape_too_big(&l->out))
        return ct_layer_errf(l, b->err, NULL, "output shape %s is too large (over 2^40 elements per sample)",
                             ct_shape_str(&l->out, s, sizeof s));
    return CT_OK;
}

static int add_layer(builder *b, const cJSON *node, const char *path, const char *suffix) {
    ct_graph *g = b->g;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(node, "name");
    if (name && (!cJSON_IsString(name) || !name->valuestring[0]))
        return model_errf(b, name, "%s: name: expected a non-empty string", path);
    if (g->n_nodes == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 16;
        g->nodes = ct_xrealloc(g->nodes, sizeof(ct_gnode) * (size_t)b->cap);
    }
    ct_gnode *gn = &g->nodes[g->n_nodes];
    memset(gn, 0, sizeof *gn);
    ct_layer *l = &gn->l;
    gn->group = b->group;
    gn->in_block = b->block_depth > 0;
    l->index = g->n_nodes;
    l->node = node;
    l->cfg = b->cfg;
    snprintf(l->path, sizeof l->path, "%s", path);
    l->type = ct_layer_type_find(type->valuestring);
    if (name) snprintf(l->name, sizeof l->name, "%s%s", name->valuestring, suffix);
    else snprintf(l->name, sizeof l->name, "%s%d", type->valuestring, l->index);
    if (!l->type) {
        const char *names[CT_LAYER_NAMES_MAX];
        int n = ct_layer_type_names(names, CT_LAYER_NAMES_MAX);
        const char *near = ct_suggest(type->valuestring, names, n);
        char hint[160] = "";
        if (near) snprintf(hint, sizeof hint, "; did you mean \"%s\"?", near);
        return model_errf(b, type, "%s \"%s\": unknown layer type \"%s\"%s", path, l->name,
                          type->valuestring, hint);
    }
    g->n_nodes++;   /* from here on the node is owned by the graph (freed with it) */
    l->cfg_data = ct_xcalloc(1, l->type->cfg_size ? l->type->cfg_size : 1);
    /* the name as written: inside a repeat "prev" would become "prev.0" yet still read as "prev" */
    const char *given = name ? name->valuestring : "";
    if (strcmp(given, "prev") == 0 || strcmp(given, MODEL_INPUT_NAME) == 0 ||
        strcmp(given, BLOCK_INPUT_NAME) == 0)
        return ct_layer_errf(l, b->err, name, "name: \"%s\" is reserved for inputs; choose another",
                             given);
    int dup = find_node(g, l->name, l->index);
    if (dup >= 0)
        return ct_layer_errf(l, b->err, name, "duplicate name; %s already uses it",
                             g->nodes[dup].l.path);
    int rc = check_layer_fields(b, l);
    if (!rc) rc = ct_layer_bool(l, "checkpoint", false, &l->checkpoint, b->err);
    if (!rc) rc = l->type->parse(l, b->err);
    if (!rc) rc = resolve_inputs(b, l, suffix);
    if (!rc && l->in_dtype == CT_I32 && !(l->type->flags & CT_LAYER_TAKES_IDS))
        rc = ct_layer_errf(l, b->err, NULL, "the model input is token ids, which only an embedding "
                           "layer can take");
    if (!rc) rc = l->type->infer(l, b->err);
    if (!rc) rc = check_output(b, l);
    return rc;
}

static int expand(builder *b, const cJSON *arr, const char *path, const char *suffix, int depth);

/* How many layers of block type bt the array holds, repeats multiplied out (a transformer
 * block's residual initialisation scales with the model's depth). Malformed repeats count once:
 * expand reports them. */
static int count_blocks(const cJSON *arr, const ct_block_type *bt, int depth) {
    double n = 0;
    for (const cJSON *it = cJSON_IsArray(arr) && depth <= MAX_REPEAT_DEPTH ? arr->child : NULL; it; it = it->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (!cJSON_IsString(type)) continue;
        if (strcmp(type->valuestring, bt->name) == 0) n += 1;
        if (strcmp(type->valuestring, "repeat") != 0) continue;
        const cJSON *times = cJSON_GetObjectItemCaseSensitive(it, "times");
        double t = cJSON_IsNumber(times) && times->valuedouble >= 1 && times->valuedouble <= CT_GRAPH_REPEAT_MAX ? times->valuedouble : 1;
        n += t * count_blocks(cJSON_GetObjectItemCaseSensitive(it, "layers"), bt, depth + 1);
    }
    return n > 1e6 ? 1000000 : (int)n;
}

/* A block type at `it`: its expansion (kept by the graph: the layers point into it) unrolled like
 * a one-iteration repeat, so "block_input" inside it names the block's input. */
static int expand_block(builder *b, const cJSON *it, const ct_block_type *bt, const char *ipath,
                        const char *suffix, int depth) {
    ct_graph *g = b->g;
    const ct_shape *in = g->n_nodes ? &g->nodes[g->n_nodes - 1].l.out : &b->input;
    if (in->ndim < 1)
        return model_errf(b, it, "%s (%s): takes an input with at least one dimension per sample", ipath, bt->name);
    ct_block_ctx ctx = {.cfg = b->cfg, .path = ipath, .width = in->d[in->ndim - 1], .input_rank = in->ndim,
                        .n_blocks = count_blocks(cJSON_GetObjectItemCaseSensitive(b->model, "layers"), bt, 0)};
    cJSON *layers = NULL;
    int rc = bt->expand(&ctx, it, &layers, b->err);
    if (rc) return rc;
    g->expanded = ct_xrealloc(g->expanded, sizeof(cJSON *) * (size_t)(g->n_expanded + 1));
    g->expanded[g->n_expanded++] = layers;
    char sub_path[128];
    snprintf(sub_path, sizeof sub_path, "%s.%s", ipath, bt->name);
    int outer_block_input = b->block_input;
    b->block_input = g->n_nodes - 1;
    b->group++;   /* the block's layers, then what follows it, are block instances of their own */
    b->block_depth++;
    rc = expand(b, layers, sub_path, suffix, depth + 1);
    b->block_depth--;
    b->group++;
    b->block_input = outer_block_input;
    return rc;
}

/* Expand a "layers" array in order; "repeat" blocks unroll with ".<i>" appended to names, block
 * types (transformer_block) into the layers they stand for. */
static int expand(builder *b, const cJSON *arr, const char *path, const char *suffix, int depth) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return model_errf(b, arr, "%s: expected a non-empty array of layers", path);
    int i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        char ipath[96];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (!cJSON_IsObject(it))
            return model_errf(b, it, "%s: expected an object such as {\"type\": \"linear\", \"out\": 10}", ipath);
        if (!cJSON_IsString(type))
            return model_errf(b, type ? type : it, "%s: %s \"type\" (a string such as \"linear\")", ipath,
                              type ? "expected" : "missing field");
        int rc;
        const ct_block_type *bt = ct_block_type_find(type->valuestring);
        if (bt) {
            if (depth >= MAX_REPEAT_DEPTH)
                return model_errf(b, it, "%s (%s): nested deeper than %d", ipath, bt->name, MAX_REPEAT_DEPTH);
            if ((rc = expand_block(b, it, bt, ipath, suffix, depth))) return rc;
            continue;
        }
        if (strcmp(type->valuestring, "repeat") != 0) {
            if ((rc = add_layer(b, it, ipath, suffix))) return rc;
            continue;
        }
        static const char *const keys[] = {"type", "times", "layers"};
        if ((rc = ct_model_check_keys(b->cfg, NULL, it, ipath, keys, CT_ARRAY_LEN(keys), b->err))) return rc;
        const cJSON *times = cJSON_GetObjectItemCaseSensitive(it, "times");
        if (!cJSON_IsNumber(times) || times->valuedouble != (double)(int)times->valuedouble ||
            times->valuedouble < 1 || times->valuedouble > CT_GRAPH_REPEAT_MAX)
            return model_errf(b, times ? times : it, "%s (repeat): times: expected an integer 1..%d",
                              ipath, CT_GRAPH_REPEAT_MAX);
        if (depth >= MAX_REPEAT_DEPTH)
            return model_errf(b, it, "%s (repeat): nested deeper than %d", ipath, MAX_REPEAT_DEPTH);
        char sub_path[128];
        snprintf(sub_path, sizeof sub_path, "%s.layers", ipath);
        int outer_block_input = b->block_input;
        for (int r = 0; r < (int)times->valuedouble; r++) {
            char sub_suffix[96];
            snprintf(sub_suffix, sizeof sub_suffix, "%s.%d", suffix, r);
            /* layers are appended in order, so the last one so far feeds this iteration: the layer
               before the block for r = 0, the previous iteration's last layer after */
            b->block_input = b->g->n_nodes - 1;
            b->group++;   /* each iteration is a block instance (a checkpointed segment of its own) */
            b->block_depth++;
            rc = expand(b, cJSON_GetObjectItemCaseSensitive(it, "layers"), sub_path, sub_suffix, depth + 1);
            b->block_depth--;
            if (rc) return rc;
        }
        b->block_input = outer_block_input;
        b->group++;
    }
    return CT_OK;
}

/* ---- model input and loss ---- */

static int parse_input(builder *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->model, "input");
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (n < 1 || n > CT_MAX_DIMS - 2)
        return model_errf(b, v ? v : b->model, "model.input: %s per-sample shape such as [1, 28, 28], "
                          "[784] or [T] (1 to %d positive integers)", v ? "expected a" : "missing; give the",
                          CT_MAX_DIMS - 2);
    b->input.ndim = n;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int64_t)e->valuedouble ||
            e->valuedouble < 1 || e->valuedouble > 1e12)
            return model_errf(b, e, "model.input[%d]: expected a positive integer", i);
        b->input.d[i] = (int64_t)e->valuedouble;
    }
    if (ct_shape_too_big(&b->input))
        return model_errf(b, v, "model.input: too large (over 2^40 elements per sample)");
    if (b->seq_len > 0 && (n != 1 || b->seq_len > b->input.d[0]))
        return model_errf(b, v, "model.input: a sequence length of %lld needs a sequence input [T] with T >= "
                          "%lld (curriculum_learning seqlen truncates [T] token sequences)",
                          (long long)b->seq_len, (long long)b->seq_len);
    if (b->seq_len > 0) b->input.d[0] = b->seq_len;
    /* Token ids when the first layer takes them (an embedding). */
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b->model, "layers"), 0);
    const cJSON *t = first ? cJSON_GetObjectItemCaseSensitive(first, "type") : NULL;
    const ct_layer_type *type = cJSON_IsString(t) ? ct_layer_type_find(t->valuestring) : NULL;
    b->input_dtype = type && (type->flags & CT_LAYER_TAKES_IDS) ? CT_I32 : CT_F32;
    return CT_OK;
}

/* model.loss.chunk_rows: "auto" (the default), 0 (off) or the rows per chunk of the chunked LM
 * head (plan.c decides, exec.c runs it). A number asks for it, so a model that cannot chunk its
 * head is an error there; "auto" just leaves it off. */
static int parse_chunk_rows(builder *b, const cJSON *loss) {
    const cJSON *v = loss ? cJSON_GetObjectItemCaseSensitive(loss, "chunk_rows") : NULL;
    b->g->head_chunk_req = CT_HEAD_CHUNK_AUTO;
    if (!v || (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0)) return CT_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble || v->valuedouble < 0 ||
        v->valuedouble > 1e12)
        return model_errf(b, v, "model.loss.chunk_rows: expected \"auto\", 0 (off) or a number of rows per "
                          "chunk such as 256");
    b->g->head_chunk_req = (int64_t)v->valuedouble;
    if (b->g->head_chunk_req > 0 && !ct_graph_head_chunkable(b->g)) {
        const ct_layer *last = &b->g->nodes[b->g->n_nodes - 1].l;
        return model_errf(b, v, "model.loss.chunk_rows: the chunked head needs the cross_entropy loss "
                          "over a last layer of type linear, and the last layer is \"%s\" (%s) with loss "
                          "%s; set chunk_rows to \"auto\" or 0", last->name, last->type->name,
                          b->g->info.loss == CT_LOSS_CROSS_ENTROPY ? "cross_entropy" : "other than cross_entropy");
    }
    return CT_OK;
}

static int parse_loss(builder *b) {
    ct_graph_info *in = &b->g->info;
    const ct_layer *last = &b->g->nodes[b->g->n_nodes - 1].l;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->model, "loss");
    static const char *const kinds[] = {"cross_entropy", "mse", "bce_with_logits"};
    static const char *const keys[] = {"type", "label_smoothing", "classes", "chunk_rows"};
    const char *kind = "cross_entropy";   /* documented default: classification */
    int rc;
    if (v) {
        if (!cJSON_IsObject(v))
            return model_errf(b, v, "model.loss: expected an object such as {\"type\": \"cross_entropy\"}");
        if ((rc = ct_model_check_keys(b->cfg, NULL, v, "model.loss", keys, CT_ARRAY_LEN(keys), b->err))) return rc;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        if (!cJSON_IsString(t))
            return model_errf(b, t ? t : v, "model.loss.type: expected \"cross_entropy\", \"mse\" or "
                              "\"bce_with_logits\"");
        kind = t->valuestring;
    }
    int k = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(kind, kinds[i]) == 0) k = i;
    if (k < 0) {
        const char *near = ct_suggest(kind, kinds, 3);
        return model_errf(b, cJSON_GetObjectItemCaseSensitive(v, "type"), "model.loss.type: unknown "
                          "loss \"%s\"; expected cross_entropy, mse or bce_with_logits%s%s%s", kind,
                          near ? " (did you mean \"" : "", near ? near : "", near ? "\"?)" : "");
    }
    in->loss = (ct_loss_kind)k;
    const cJSON *ls = v ? cJSON_GetObjectItemCaseSensitive(v, "label_smoothing") : NULL;
    if (ls && (k != CT_LOSS_CROSS_ENTROPY || !cJSON_IsNumber(ls) || ls->valuedouble < 0 ||
               ls->valuedouble >= 1))
        return model_errf(b, ls, "model.loss.label_smoothing: expected a number in [0, 1) with "
                          "cross_entropy");
    b->g->label_smoothing = ls ? ls->valuedouble : 0.0;
    in->target_shape = last->out;
    in->target_dtype = CT_F32;
    /* "classes": the first N outputs of each row are predicted and the rest are vocabulary padding
     * (GPT-2's 50257 tokens in a 50304-row table, a multiple of 64 that tiles well): never
     * predicted, gradient 0. Default: every output. */
    const cJSON *cl = v ? cJSON_GetObjectItemCaseSensitive(v, "classes") : NULL;
    int64_t width = last->out.d[last->out.ndim - 1];
    if (cl && (k != CT_LOSS_CROSS_ENTROPY || !cJSON_IsNumber(cl) || cl->valuedouble != (double)(int64_t)cl->valuedouble ||
               cl->valuedouble < 2 || cl->valuedouble > (double)width))
        return model_errf(b, cl, "model.loss.classes: expected an integer in [2, %lld] (the last layer's "
                          "outputs) with cross_entropy; the outputs past it are padding, never predicted",
                          (long long)width);
    in->padded_classes = 0;
    if (k == CT_LOSS_CROSS_ENTROPY) {
        in->padded_classes = width;
        in->classes = cl ? (int64_t)cl->valuedouble : width;
        in->target_shape.ndim--;   /* one class index per row: [n, ...] without the class dim */
        in->target_dtype = CT_I32;
        if (in->classes < 2)
            return ct_layer_errf(last, b->err, NULL, "cross_entropy needs the last layer to output at "
                                 "least 2 classes, got %lld", (long long)in->classes);
    }
    return parse_chunk_rows(b, v);
}

/* ---- entry points ---- */

static int build(builder *b, int64_t batch) {
    static const char *const keys[] = {"input", "layers", "loss", "init_from", "init_strict"};
    int rc;
    if (!cJSON_IsObject(b->model))
        return model_errf(b, b->model, "model: expected an object with \"input\", \"layers\" and \"loss\"");
    if ((rc = ct_model_check_keys(b->cfg, NULL, b->model, "model", keys, CT_ARRAY_LEN(keys), b->err))) return rc;
    if ((rc = parse_input(b))) return rc;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(b->model, "layers");
    if (!layers) return model_errf(b, b->model, "model.layers: missing; list the layers in order");
    if ((rc = expand(b, layers, "model.layers", "", 0))) return rc;
    if ((rc = parse_loss(b))) return rc;
    ct_graph_info *in = &b->g->info;
    in->n_layers = b->g->n_nodes;
    in->input_shape = b->input;
    in->input_dtype = b->input_dtype;
    in->output_shape = b->g->nodes[b->g->n_nodes - 1].l.out;
    in->input_ids_below = 0;
    for (int i = 0; i < b->g->n_nodes; i++) {
        const ct_layer *l = &b->g->nodes[i].l;
        int64_t lim = l->in_dtype == CT_I32 && l->type->id_limit ? l->type->id_limit(l) : 0;
        if (lim > 0 && (!in->input_ids_below || lim < in->input_ids_below)) in->input_ids_below = lim;
    }
    if ((rc = ct_graph_layout_params(b->g, b->err))) return rc;
    if ((rc = ct_graph_segments(b->g, b->cfg, b->segments, b->err))) return rc;
    ct_graph_plan_memory(b->g);
    return CT_OK;
}

int ct_graph_build(const ct_config *cfg, int64_t batch, ct_dtype dt, ct_graph **out, ct_err *err) {
    return ct_graph_build_seq(cfg, batch, dt, 0, out, err);
}

int ct_graph_build_seq(const ct_config *cfg, int64_t batch, ct_dtype dt, int64_t seq_len, ct_graph **out,
                       ct_err *err) {
    return ct_graph_build_with(cfg, batch, dt, seq_len, CT_SEGMENTS_CONFIG, out, err);
}

int ct_graph_build_with(const ct_config *cfg, int64_t batch, ct_dtype dt, int64_t seq_len, long segments,
                        ct_graph **out, ct_err *err) {
    *out = NULL;
    if (!cfg || !cfg->model) return ct_errf(err, CT_ERR_CONFIG, "model: missing; the config needs a "
                                            "\"model\" section (input, layers, loss)");
    if (batch < 1) return ct_errf(err, CT_ERR_CONFIG, "micro-batch must be >= 1, got %lld", (long long)batch);
    ct_graph *g = ct_xcalloc(1, sizeof *g);
    g->batch = batch;
    g->dt = dt == CT_F16 || dt == CT_BF16 ? dt : CT_F32;
    g->offload = cfg->pending.cpu_checkpointing;
    g->sync_segments = cfg->pending.synchronize_checkpoint_boundary;
    builder b = {.cfg = cfg, .model = cfg->model, .err = err, .g = g, .block_input = NO_BLOCK, .seq_len = seq_len,
                 .segments = segments < 0 ? CT_SEGMENTS_CONFIG : segments};
    int rc = build(&b, batch);
    if (rc) {
        ct_graph_free(g);
        return rc;
    }
    *out = g;
    return CT_OK;
}

void ct_graph_free(ct_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++) free(g->nodes[i].l.cfg_data);
    free(g->nodes);
    for (int i = 0; i < g->n_expanded; i++) cJSON_Delete(g->expanded[i]);
    free(g->expanded);
    free(g->segs);
    free(g->seg_times);
    ct_param_layout_free(&g->layout);
    if (g->owns_arena) g->be->mem.free(g->be, g->arena);
    if (g->host) g->host_be->mem.free_host_pinned(g->host_be, g->host);
    free(g->off);
    free(g->placed.items);
    free(g);
}

const ct_graph_info *ct_graph_info_get(const ct_graph *g) { return &g->info; }
const ct_param_layout *ct_graph_layout(const ct_graph *g) { return &g->layout; }

double ct_graph_train_flops_per_sample(const ct_graph *g) {
    double lct = 0;   /* sum over the layers that mix positions (attention) of C·T */
    for (int i = 0; i < g->n_nodes; i++) {
        const ct_layer *l = &g->nodes[i].l;
        if (l->type->sequence_mixing) lct += l->type->sequence_mixing(l);
    }
    if (lct == 0) return 3.0 * g->info.flops_per_sample;
    double tokens = (double)ct_shape_numel(&g->info.input_shape);
    return tokens * (6.0 * (double)g->info.n_param_elems + 6.0 * lct);
}
const ct_act_plan *ct_graph_plan(const ct_graph *g) { return &g->plan; }

/* One layer for the description: its type, and its shapes when it has parameters. */
static size_t describe_layer(const ct_graph *g, int i, char *buf, size_t n) {
    const ct_layer *l = &g->nodes[i].l;
    char a[64], c[64];
    if (!ct_param_layout_layer_specs(&g->layout, i)) return (size_t)snprintf(buf, n, " %s", l->type->name);
    return (size_t)snprintf(buf, n, " %s(%s->%s)", l->type->name, ct_shape_str(&l->in[0], a, sizeof a),
                            ct_shape_str(&l->out, c, sizeof c));
}

/* A top-level "repeat" block starting at node i: its iterations (`times`) of `per` layers each.
 * Its layers share the path prefix "model.layers[k]." and each iteration starts again at the
 * block's first path. Returns false for an ordinary layer. */
static bool repeat_block(const ct_graph *g, int i, int *per, int *times) {
    const char *path = g->nodes[i].l.path, *close = strchr(path, ']');
    if (!close || close[1] != '.') return false;
    size_t prefix = (size_t)(close - path) + 2;   /* "model.layers[k]." */
    int end = i + 1, second = -1;
    while (end < g->n_nodes && strncmp(g->nodes[end].l.path, path, prefix) == 0) {
        if (second < 0 && strcmp(g->nodes[end].l.path, path) == 0) second = end;
        end++;
    }
    *per = second < 0 ? end - i : second - i;
    *times = (end - i) / *per;
    return true;
}

void ct_graph_describe(const ct_graph *g, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "%d layers:", g->n_nodes);
    for (int i = 0; i < g->n_nodes && used < n;) {
        int per, times;
        if (!repeat_block(g, i, &per, &times) || times < 2) {
            used += describe_layer(g, i++, buf + used, n - used);
            continue;
        }
        used += (size_t)snprintf(buf + used, n - used, " %d × [", times);
        for (int k = 0; k < per && used < n; k++) used += describe_layer(g, i + k, buf + used, n - used);
        if (used < n) used += (size_t)snprintf(buf + used, n - used, " ]");
        i += per * times;
    }
}

/* transformer_block: GPT-2's pre-norm block in one line of config, expanded at build into the
 * layers it stands for, so activation checkpointing, ZeRO-3 and the profiler see ordinary layers:
 *
 *   x [T, C] -> ln1 -> qkv (linear, 3C) -> attn (causal_self_attention) -> proj (linear, C)
 *            [-> drop1] -> res1 = x + proj -> ln2 -> fc1 (linear, ratio*C) -> gelu (tanh)
 *            -> fc2 (linear, C) [-> drop2] -> res2 = res1 + fc2
 *
 * Sub-layer names are the part names ("ln1", "qkv", ...), prefixed "<name>." when the block is
 * named; inside a `repeat` the iteration suffix follows as for any layer, so an unnamed block in
 * a repeat has the view names of the same block written out by hand (configs/tiny_lm.json's
 * ln1.0.weight, qkv.3.bias, ...) and loads the same checkpoints.
 *
 * Fields: heads (required); mlp_ratio (4); dropout (0: residual dropout after proj and fc2, as
 * GPT-2's resid_pdrop); attn_dropout (0); bias (true); init_std (0.02: weights normal(0, std),
 * biases zero); residual_init_std (default init_std / sqrt(2 * blocks in the model), GPT-2's
 * scaling of the projections into the residual stream); eps (layernorm, 1e-5); checkpoint
 * (copied to every sub-layer). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/graph/layer.h"

static const char *const fields[] = {"type", "name", "heads", "mlp_ratio", "dropout", "attn_dropout", "bias",
                                     "init_std", "residual_init_std", "eps", "checkpoint"};

typedef struct {
    const ct_block_ctx *ctx;
    const cJSON *node;
    ct_err *err;
    char prefix[96];              /* "" or "<name>." */
    bool checkpoint;              /* copied to every sub-layer */
} block;

static int block_errf(const block *b, const cJSON *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int block_errf(const block *b, const cJSON *at, const char *fmt, ...) {
    char where[512], text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ct_model_where(b->ctx->cfg, at ? at : b->node, where, sizeof where);
    return ct_errf(b->err, CT_ERR_CONFIG, "%s%s%s (transformer_block): %s", where, where[0] ? ": " : "",
                   b->ctx->path, text);
}

/* A number field in [lo, hi] (hi_open: below hi); missing: def. */
static int number(const block *b, const char *key, double def, double lo, double hi, bool hi_open, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->node, key);
    *out = def;
    if (!v) return CT_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        (hi_open ? v->valuedouble >= hi : v->valuedouble > hi))
        return block_errf(b, v, "%s: expected a number in [%g, %g%s", key, lo, hi, hi_open ? ")" : "]");
    *out = v->valuedouble;
    return CT_OK;
}

static int integer(const block *b, const char *key, bool required, int64_t def, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->node, key);
    *out = def;
    if (!v && required) return block_errf(b, NULL, "missing field \"%s\"", key);
    if (!v) return CT_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 1e6)
        return block_errf(b, v, "%s: expected an integer >= 1", key);
    *out = (int64_t)v->valuedouble;
    return CT_OK;
}

/* Append {"type": type, "name": prefix + part} to layers; returns it for more fields. */
static cJSON *sub(cJSON *layers, const block *b, const char *type, const char *part) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", b->prefix, part);
    cJSON *l = cJSON_CreateObject();
    cJSON_AddStringToObject(l, "type", type);
    cJSON_AddStringToObject(l, "name", name);
    if (b->checkpoint) cJSON_AddTrueToObject(l, "checkpoint");
    cJSON_AddItemToArray(layers, l);
    return l;
}

static void linear(cJSON *layers, const block *b, const char *part, int64_t out, double std, bool bias) {
    cJSON *l = sub(layers, b, "linear", part);
    cJSON_AddNumberToObject(l, "out", (double)out);
    cJSON *init = cJSON_AddObjectToObject(l, "init");
    cJSON_AddStringToObject(init, "type", "normal");
    cJSON_AddNumberToObject(init, "std", std);
    if (!bias) cJSON_AddFalseToObject(l, "bias");
    else cJSON_AddStringToObject(cJSON_AddObjectToObject(l, "bias_init"), "type", "zeros");
}

static void layernorm(cJSON *layers, const block *b, const char *part, double eps) {
    cJSON_AddNumberToObject(sub(layers, b, "layernorm", part), "eps", eps);
}

/* The residual branch's output: the projection, or its dropout. Returns the layer's full name. */
static const char *branch_out(cJSON *layers, const block *b, const char *proj, const char *drop, double p,
                              char *buf, size_t n) {
    if (p > 0) cJSON_AddNumberToObject(sub(layers, b, "dropout", drop), "p", p);
    snprintf(buf, n, "%s%s", b->prefix, p > 0 ? drop : proj);
    return buf;
}

static void residual(cJSON *layers, const block *b, const char *part, const char *a, const char *c) {
    cJSON *in = cJSON_AddArrayToObject(sub(layers, b, "add", part), "inputs");
    cJSON_AddItemToArray(in, cJSON_CreateString(a));
    cJSON_AddItemToArray(in, cJSON_CreateString(c));
}

int ct_transformer_block_expand(const ct_block_ctx *ctx, const cJSON *node, cJSON **out, ct_err *err) {
    block b = {.ctx = ctx, .node = node, .err = err};
    *out = NULL;
    int rc = ct_model_check_keys(ctx->cfg, NULL, node, ctx->path, fields, CT_ARRAY_LEN(fields), err);
    if (rc) return rc;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(node, "name");
    if (name && (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 80))
        return block_errf(&b, name, "name: expected a non-empty string of at most 80 characters");
    if (name) snprintf(b.prefix, sizeof b.prefix, "%s.", name->valuestring);
    int64_t heads, ratio, C = ctx->width;
    double drop, attn_drop, std, rstd, eps;
    if ((rc = integer(&b, "heads", true, 0, &heads)) || (rc = integer(&b, "mlp_ratio", false, 4, &ratio)) ||
        (rc = number(&b, "dropout", 0, 0, 1, true, &drop)) ||
        (rc = number(&b, "attn_dropout", 0, 0, 1, true, &attn_drop)) ||
        (rc = number(&b, "init_std", 0.02, 0, 10, false, &std)) ||
        (rc = number(&b, "residual_init_std", std / sqrt(2.0 * (double)ctx->n_blocks), 0, 10, false, &rstd)) ||
        (rc = number(&b, "eps", 1e-5, 1e-30, 1, false, &eps)))
        return rc;
    const cJSON *bias_v = cJSON_GetObjectItemCaseSensitive(node, "bias");
    if (bias_v && !cJSON_IsBool(bias_v)) return block_errf(&b, bias_v, "bias: expected true or false");
    bool bias = !cJSON_IsFalse(bias_v);
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(node, "checkpoint");
    if (ck && !cJSON_IsBool(ck)) return block_errf(&b, ck, "checkpoint: expected true or false");
    b.checkpoint = cJSON_IsTrue(ck);
    if (ctx->input_rank != 2)
        return block_errf(&b, NULL, "takes a sequence [T, C], got an input of %d dimensions per sample "
                          "(put an embedding before it)", ctx->input_rank);
    if (C % heads)
        return block_errf(&b, cJSON_GetObjectItemCaseSensitive(node, "heads"), "width C = %lld is not "
                          "divisible by heads = %lld", (long long)C, (long long)heads);
    if (C / heads > 128)
        return block_errf(&b, cJSON_GetObjectItemCaseSensitive(node, "heads"), "head dim C / heads = %lld "
                          "is above 128: use more heads", (long long)(C / heads));

    cJSON *layers = cJSON_CreateArray();
    char r1[200], r2[200], res1[200];
    layernorm(layers, &b, "ln1", eps);
    linear(layers, &b, "qkv", 3 * C, std, bias);
    cJSON *attn = sub(layers, &b, "causal_self_attention", "attn");
    cJSON_AddNumberToObject(attn, "heads", (double)heads);
    if (attn_drop > 0) cJSON_AddNumberToObject(attn, "dropout", attn_drop);
    linear(layers, &b, "proj", C, rstd, bias);
    residual(layers, &b, "res1", "block_input", branch_out(layers, &b, "proj", "drop1", drop, r1, sizeof r1));
    layernorm(layers, &b, "ln2", eps);
    linear(layers, &b, "fc1", ratio * C, std, bias);
    cJSON_AddStringToObject(sub(layers, &b, "gelu", "gelu"), "approximate", "tanh");
    linear(layers, &b, "fc2", C, rstd, bias);
    snprintf(res1, sizeof res1, "%sres1", b.prefix);
    residual(layers, &b, "res2", res1, branch_out(layers, &b, "fc2", "drop2", drop, r2, sizeof r2));
    *out = layers;
    return CT_OK;
}

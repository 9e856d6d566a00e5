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
#include <stdio.h>
#include <string.h>

#include "core/graph/layers/block.h"

static const char *const fields[] = {"type", "name", "heads", "mlp_ratio", "dropout", "attn_dropout", "bias",
                                     "init_std", "residual_init_std", "eps", "checkpoint"};

static void layernorm(cJSON *layers, const ct_block *b, const char *part, double eps) {
    cJSON_AddNumberToObject(ct_block_sub(layers, b, "layernorm", part), "eps", eps);
}

/* The residual branch's output: the projection, or its dropout. Returns the layer's full name. */
static const char *branch_out(cJSON *layers, const ct_block *b, const char *proj, const char *drop, double p,
                              char *buf, size_t n) {
    if (p > 0) cJSON_AddNumberToObject(ct_block_sub(layers, b, "dropout", drop), "p", p);
    snprintf(buf, n, "%s%s", b->prefix, p > 0 ? drop : proj);
    return buf;
}

int ct_transformer_block_expand(const ct_block_ctx *ctx, const cJSON *node, cJSON **out, ct_err *err) {
    ct_block b;
    *out = NULL;
    int rc = ct_block_open(&b, ctx, node, "transformer_block", fields, CT_ARRAY_LEN(fields), err);
    if (rc) return rc;
    int64_t heads, ratio, C = ctx->width;
    double drop, attn_drop, std, rstd, eps;
    if ((rc = ct_block_integer(&b, "heads", true, 0, &heads)) || (rc = ct_block_integer(&b, "mlp_ratio", false, 4, &ratio)) ||
        (rc = ct_block_number(&b, "dropout", 0, 0, 1, true, &drop)) ||
        (rc = ct_block_number(&b, "attn_dropout", 0, 0, 1, true, &attn_drop)) ||
        (rc = ct_block_number(&b, "init_std", 0.02, 0, 10, false, &std)) ||
        (rc = ct_block_number(&b, "residual_init_std", std / sqrt(2.0 * (double)ctx->n_blocks), 0, 10, false, &rstd)) ||
        (rc = ct_block_number(&b, "eps", 1e-5, 1e-30, 1, false, &eps)))
        return rc;
    const cJSON *bias_v = cJSON_GetObjectItemCaseSensitive(node, "bias");
    if (bias_v && !cJSON_IsBool(bias_v)) return ct_block_errf(&b, bias_v, "bias: expected true or false");
    bool bias = !cJSON_IsFalse(bias_v);
    if ((rc = ct_block_needs_sequence(&b))) return rc;
    if (C % heads)
        return ct_block_errf(&b, cJSON_GetObjectItemCaseSensitive(node, "heads"), "width C = %lld is not "
                             "divisible by heads = %lld", (long long)C, (long long)heads);
    if (C / heads > 128)
        return ct_block_errf(&b, cJSON_GetObjectItemCaseSensitive(node, "heads"), "head dim C / heads = %lld "
                             "is above 128: use more heads", (long long)(C / heads));

    cJSON *layers = cJSON_CreateArray();
    char r1[200], r2[200], res1[200];
    layernorm(layers, &b, "ln1", eps);
    ct_block_linear(layers, &b, "qkv", 3 * C, std, bias);
    cJSON *attn = ct_block_sub(layers, &b, "causal_self_attention", "attn");
    cJSON_AddNumberToObject(attn, "heads", (double)heads);
    if (attn_drop > 0) cJSON_AddNumberToObject(attn, "dropout", attn_drop);
    ct_block_linear(layers, &b, "proj", C, rstd, bias);
    ct_block_residual(layers, &b, "res1", "block_input", branch_out(layers, &b, "proj", "drop1", drop, r1, sizeof r1));
    layernorm(layers, &b, "ln2", eps);
    ct_block_linear(layers, &b, "fc1", ratio * C, std, bias);
    cJSON_AddStringToObject(ct_block_sub(layers, &b, "gelu", "gelu"), "approximate", "tanh");
    ct_block_linear(layers, &b, "fc2", C, rstd, bias);
    snprintf(res1, sizeof res1, "%sres1", b.prefix);
    ct_block_residual(layers, &b, "res2", res1, branch_out(layers, &b, "fc2", "drop2", drop, r2, sizeof r2));
    *out = layers;
    return CT_OK;
}

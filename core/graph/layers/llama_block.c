/* llama_block: the pre-norm block of Llama-family models (Llama, Mistral, SmolLM, TinyLlama) in one
 * line of config, expanded at build into the layers it stands for:
 *
 *   x [T, C] -> ln1 (rmsnorm) -> qkv (linear, (H + 2 KV) D, no bias)
 *            -> attn (causal_self_attention: heads H, kv_heads KV, rotary positions)
 *            -> proj (linear, C, no bias) -> res1 = x + proj
 *            -> ln2 (rmsnorm) -> gate_up (linear, 2 I, no bias) -> swiglu -> down (linear, C, no bias)
 *            -> res2 = res1 + down
 *
 * D = C / H. Sub-layer names are the part names, prefixed "<name>." when the block is named, with
 * the iteration suffix inside a `repeat` (qkv.3.weight), as transformer_block's. Hugging Face's
 * q_proj, k_proj and v_proj are row blocks of qkv's weight, gate_proj and up_proj of gate_up's
 * (core/graph/hf_llama.c).
 *
 * Fields: heads (required); kv_heads (heads; fewer: grouped-query, 1: multi-query); intermediate
 * (required: the MLP's width, Llama's intermediate_size); rope_theta (10000); rope_scaling (none;
 * the attention's field); eps (1e-6, the rmsnorms); init_std (0.02: every linear normal(0, std),
 * Llama's initializer_range); residual_init_std (init_std: Llama does not scale proj and down;
 * GPT-2's init_std / sqrt(2 blocks) is one setting away); checkpoint (copied to every part). */
#include <stdio.h>
#include <string.h>

#include "core/graph/layers/block.h"

static const char *const fields[] = {"type", "name", "heads", "kv_heads", "intermediate", "rope_theta",
                                     "rope_scaling", "eps", "init_std", "residual_init_std", "checkpoint"};

static void rmsnorm(cJSON *layers, const ct_block *b, const char *part, double eps) {
    cJSON_AddNumberToObject(ct_block_sub(layers, b, "rmsnorm", part), "eps", eps);
}

int ct_llama_block_expand(const ct_block_ctx *ctx, const cJSON *node, cJSON **out, ct_err *err) {
    ct_block b;
    *out = NULL;
    int rc = ct_block_open(&b, ctx, node, "llama_block", fields, CT_ARRAY_LEN(fields), err);
    if (rc) return rc;
    int64_t heads, kv, inter, C = ctx->width;
    double theta, eps, std, rstd;
    if ((rc = ct_block_integer(&b, "heads", true, 0, &heads)) ||
        (rc = ct_block_integer(&b, "kv_heads", false, heads, &kv)) ||
        (rc = ct_block_integer(&b, "intermediate", true, 0, &inter)) ||
        (rc = ct_block_number(&b, "rope_theta", 10000, 1, 1e12, false, &theta)) ||
        (rc = ct_block_number(&b, "eps", 1e-6, 1e-30, 1, false, &eps)) ||
        (rc = ct_block_number(&b, "init_std", 0.02, 0, 10, false, &std)) ||
        (rc = ct_block_number(&b, "residual_init_std", std, 0, 10, false, &rstd)) ||
        (rc = ct_block_needs_sequence(&b)))
        return rc;
    const cJSON *at_heads = cJSON_GetObjectItemCaseSensitive(node, "heads");
    if (C % heads)
        return ct_block_errf(&b, at_heads, "width C = %lld is not divisible by heads = %lld", (long long)C,
                             (long long)heads);
    int64_t D = C / heads;
    if (D > 128 || D % 2)
        return ct_block_errf(&b, at_heads, "head dim C / heads = %lld: rotary attention takes an even head dim "
                             "of at most 128", (long long)D);
    if (kv > heads || heads % kv)
        return ct_block_errf(&b, cJSON_GetObjectItemCaseSensitive(node, "kv_heads"), "kv_heads = %lld must divide "
                             "heads = %lld (each kv head serves a whole group of query heads)", (long long)kv,
                             (long long)heads);

    cJSON *layers = cJSON_CreateArray();
    char res1[200], proj[200], down[200];
    rmsnorm(layers, &b, "ln1", eps);
    ct_block_linear(layers, &b, "qkv", (heads + 2 * kv) * D, std, false);
    cJSON *attn = ct_block_sub(layers, &b, "causal_self_attention", "attn");
    cJSON_AddNumberToObject(attn, "heads", (double)heads);
    if (kv != heads) cJSON_AddNumberToObject(attn, "kv_heads", (double)kv);
    cJSON_AddNumberToObject(attn, "rope_theta", theta);
    const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(node, "rope_scaling");
    if (scaling) cJSON_AddItemToObject(attn, "rope_scaling", cJSON_Duplicate(scaling, true));
    ct_block_linear(layers, &b, "proj", C, rstd, false);
    snprintf(proj, sizeof proj, "%sproj", b.prefix);
    ct_block_residual(layers, &b, "res1", "block_input", proj);
    rmsnorm(layers, &b, "ln2", eps);
    ct_block_linear(layers, &b, "gate_up", 2 * inter, std, false);
    ct_block_sub(layers, &b, "swiglu", "swiglu");
    ct_block_linear(layers, &b, "down", C, rstd, false);
    snprintf(res1, sizeof res1, "%sres1", b.prefix);
    snprintf(down, sizeof down, "%sdown", b.prefix);
    ct_block_residual(layers, &b, "res2", res1, down);
    *out = layers;
    return CT_OK;
}

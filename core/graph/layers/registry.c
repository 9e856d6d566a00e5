/* registry.c: every layer type and block type, by name. A new layer type is its file plus two
 * lines here (its extern declaration and its pointer in types[]); a block type its file plus its
 * expand declaration and its row in blocks[]. Every list of names is derived from these tables. */
#include <string.h>

#include "core/graph/layer.h"

extern const ct_layer_type ct_layer_linear, ct_layer_conv2d, ct_layer_maxpool2d, ct_layer_avgpool2d,
    ct_layer_global_avgpool, ct_layer_batchnorm2d, ct_layer_layernorm, ct_layer_dropout,
    ct_layer_relu, ct_layer_leaky_relu, ct_layer_gelu, ct_layer_silu, ct_layer_tanh,
    ct_layer_sigmoid, ct_layer_flatten, ct_layer_reshape, ct_layer_add, ct_layer_concat,
    ct_layer_embedding;
extern const ct_layer_type ct_layer_position_embedding, ct_layer_causal_self_attention;
extern const ct_layer_type ct_layer_rmsnorm, ct_layer_swiglu;

static const ct_layer_type *const types[] = {
    &ct_layer_linear,      &ct_layer_conv2d,     &ct_layer_maxpool2d, &ct_layer_avgpool2d,
    &ct_layer_global_avgpool, &ct_layer_batchnorm2d, &ct_layer_layernorm, &ct_layer_dropout,
    &ct_layer_relu,        &ct_layer_leaky_relu, &ct_layer_gelu,      &ct_layer_silu,
    &ct_layer_tanh,        &ct_layer_sigmoid,    &ct_layer_flatten,   &ct_layer_reshape,
    &ct_layer_add,         &ct_layer_concat,     &ct_layer_embedding,
    &ct_layer_position_embedding, &ct_layer_causal_self_attention,
    &ct_layer_rmsnorm,     &ct_layer_swiglu,
};

int ct_transformer_block_expand(const ct_block_ctx *ctx, const cJSON *node, cJSON **layers, ct_err *err);
int ct_llama_block_expand(const ct_block_ctx *ctx, const cJSON *node, cJSON **layers, ct_err *err);

static const ct_block_type blocks[] = {
    {"transformer_block", ct_transformer_block_expand},
    {"llama_block", ct_llama_block_expand},
};


const ct_layer_type *ct_layer_type_find(const char *name) {
    for (int i = 0; i < CT_ARRAY_LEN(types); i++)
        if (strcmp(types[i]->name, name) == 0) return types[i];
    return NULL;
}

const ct_block_type *ct_block_type_find(const char *name) {
    for (int i = 0; i < CT_ARRAY_LEN(blocks); i++)
        if (strcmp(blocks[i].name, name) == 0) return &blocks[i];
    return NULL;
}

/* "repeat" is the graph builder's own (build.c), neither a layer nor a block type. */
int ct_layer_type_names(const char **names, int max) {
    int n = 0;
    for (int i = 0; i < CT_ARRAY_LEN(types) && n < max; i++) names[n++] = types[i]->name;
    for (int i = 0; i < CT_ARRAY_LEN(blocks) && n < max; i++) names[n++] = blocks[i].name;
    if (n < max) names[n++] = "repeat";
    return n;
}

/* registry.c: every layer type and block type, by name. A new type is one file plus one line
 * here. */
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

/* Names in registry order, then the block types and "repeat" (expanded by the graph builder, not
 * layers): the candidates of "did you mean". */
static const char *const names[] = {
    "linear", "conv2d", "maxpool2d", "avgpool2d", "global_avgpool", "batchnorm2d", "layernorm",
    "dropout", "relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid", "flatten", "reshape",
    "add", "concat", "embedding",
    "position_embedding", "causal_self_attention",
    "rmsnorm", "swiglu",
    "transformer_block", "llama_block", "repeat",
};
_Static_assert(sizeof names / sizeof names[0] == sizeof types / sizeof types[0] + sizeof blocks / sizeof blocks[0] + 1,
               "names[] lists every registered type, every block type and repeat");

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

int ct_layer_type_names(const char *const **out) {
    *out = names;
    return CT_ARRAY_LEN(names);
}

/* hf_gpt2.h: Hugging Face's GPT-2 names for a ctrain GPT (model.init_from of a GPT-2
 * model.safetensors, `ctrain export --layout hf-gpt2`).
 *
 * The map is read off the graph's structure, not off view names: the layers that hold parameters
 * must be, in order, an embedding (wte), a position_embedding (wpe), for each of L blocks a
 * layernorm, a linear (c_attn) followed by a causal_self_attention, a linear (attn.c_proj), a
 * layernorm, a linear (mlp.c_fc) followed by a tanh gelu, a linear (mlp.c_proj), then a layernorm
 * (ln_f) and a bias-free linear tied to the embedding (lm_head) -- what `transformer_block`
 * expands into (configs/gpt2_124m.json), or the same layers written out by hand, whatever their
 * names. One table in hf_gpt2.c has a row per tensor kind. */
#ifndef CT_GRAPH_HF_GPT2_H
#define CT_GRAPH_HF_GPT2_H

#include <stdbool.h>
#include <stddef.h>

#include "core/graph/graph.h"
#include "core/params/tensor_map.h"

#define CT_HF_GPT2_LAYOUT "hf-gpt2"

/* Whether a file's tensor names are GPT-2's in Hugging Face's naming: one of them, with or
 * without the "transformer." prefix, is a block tensor "h.<N>.<...>". (ctrain's own names never
 * are: a transformer_block's sub-layers are ln1, qkv, ... and numbered after the part.) */
bool ct_hf_gpt2_names(const char *const *names, int n);

/* The map of g's views to GPT-2's tensors (core/params/tensor_map.h): Conv1D weights transposed,
 * wte's rows cut to the classes the loss predicts (model.loss.classes: a padded vocabulary's
 * extra rows are not in GPT-2's file), the "transformer." prefix accepted on load and written on
 * export, lm_head.weight an optional copy of wte, the attention masks attn.bias and
 * attn.masked_bias ignored. A model of another shape is CT_ERR_CONFIG naming the first layer
 * that differs and what was expected there. Free with ct_tensor_map_free. */
int ct_hf_gpt2_map(const ct_graph *g, ct_tensor_map *out, ct_err *err);

/* transformers' GPT2Config for g (a model ct_hf_gpt2_map accepts), as Python keyword arguments:
 * "vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4, ...". */
void ct_hf_gpt2_config(const ct_graph *g, char *buf, size_t n);

#endif

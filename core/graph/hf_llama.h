/* hf_llama.h: Hugging Face's Llama names for a ctrain Llama (model.init_from of a Llama model
 * directory, `ctrain export --layout hf-llama`).
 *
 * The map is read off the graph's structure, not off view names: the layers that hold parameters
 * must be, in order, an embedding (model.embed_tokens), for each of L blocks an rmsnorm
 * (input_layernorm), a bias-free linear (q_proj, k_proj and v_proj as its row blocks) followed by a
 * causal_self_attention, a linear (o_proj), an rmsnorm (post_attention_layernorm), a linear
 * (gate_proj and up_proj as its two halves) followed by a swiglu, a linear (down_proj), then an
 * rmsnorm (model.norm) and a bias-free linear (lm_head, tied to the embedding or not) -- what
 * `llama_block` expands into (configs/llama_tiny.json), or the same layers written out by hand.
 *
 * No permutation of q_proj and k_proj: transformers' Llama turns element i of a head with element
 * i + D/2 (rotate_half), and so does ctrain's rotary op (backend.h, rope_gqa_forward), so the rows
 * load as they are (Meta's original checkpoints pair neighbours, which transformers' conversion
 * script permutes away before they reach a Hugging Face directory). */
#ifndef CT_GRAPH_HF_LLAMA_H
#define CT_GRAPH_HF_LLAMA_H

#include <stdbool.h>
#include <stddef.h>

#include "core/graph/graph.h"
#include "core/params/tensor_map.h"
#include "core/util/json.h"

#define CT_HF_LLAMA_LAYOUT "hf-llama"

/* The map of g's views to Llama's tensors (core/params/tensor_map.h): q_proj, k_proj, v_proj row
 * blocks of the fused qkv weight, gate_proj and up_proj halves of gate_up's, the embedding's rows
 * cut to the classes the loss predicts, lm_head an optional copy when the head is tied, the
 * rotary inv_freq buffers older files carry ignored. A model of another shape is CT_ERR_CONFIG
 * naming the first layer that differs and what was expected there. Free with ct_tensor_map_free. */
int ct_hf_llama_map(const ct_graph *g, ct_tensor_map *out, ct_err *err);

/* A Hugging Face config.json (doc) describes g: model_type llama (or mistral whose sliding window
 * the sequence does not reach); hidden_size, intermediate_size, num_attention_heads,
 * num_key_value_heads, num_hidden_layers, vocab_size, rms_norm_eps, rope_theta, rope_scaling,
 * tie_word_embeddings and head_dim as the model's; what ctrain does not do (biases on the
 * projections as Qwen2 has them, experts, another activation, rope_scaling kinds other than linear
 * and dynamic, a sliding window) refused by name. CT_ERR_CONFIG listing every mismatch at its
 * FILE:L:C. A sequence longer than max_position_embeddings is a warning. */
int ct_hf_llama_check_config(const ct_graph *g, const ct_json_doc *doc, ct_warnings *warn, ct_err *err);

/* transformers' config.json for g (a model ct_hf_llama_map accepts), weights stored as torch_dtype
 * ("float32", "bfloat16", "float16"): LlamaForCausalLM.from_pretrained loads the directory. The
 * caller frees it. */
char *ct_hf_llama_config_json(const ct_graph *g, const char *torch_dtype);

#endif

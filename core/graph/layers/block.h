/* block.h: what the block types (transformer_block.c, llama_block.c) share to expand into layers:
 * the block's own fields read with messages naming it, and the sub-layer objects they append. */
#ifndef CT_GRAPH_LAYERS_BLOCK_H
#define CT_GRAPH_LAYERS_BLOCK_H

#include "core/graph/layer.h"

typedef struct ct_block {
    const ct_block_ctx *ctx;
    const cJSON *node;
    ct_err *err;
    const char *type;             /* "transformer_block", for messages */
    char prefix[96];              /* "" or "<name>." */
    bool checkpoint;              /* copied to every sub-layer */
} ct_block;

/* Check the block's keys against fields[0..n) and read its "name" and "checkpoint". */
int ct_block_open(ct_block *b, const ct_block_ctx *ctx, const cJSON *node, const char *type,
                  const char *const *fields, int n_fields, ct_err *err);
/* CT_ERR_CONFIG "FILE:L:C: <path> (<type>): <text>", pointing at `at` (NULL: the block). */
int ct_block_errf(const ct_block *b, const cJSON *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A number field in [lo, hi] (hi_open: below hi); missing: def. */
int ct_block_number(const ct_block *b, const char *key, double def, double lo, double hi, bool hi_open, double *out);
/* An integer field in [1, 1e6]; missing: an error when required, else def. */
int ct_block_integer(const ct_block *b, const char *key, bool required, int64_t def, int64_t *out);
/* The block's input must be a sequence [T, C]. */
int ct_block_needs_sequence(const ct_block *b);

/* Append {"type": type, "name": prefix + part} (and "checkpoint") to layers; returns it for more
 * fields. */
cJSON *ct_block_sub(cJSON *layers, const ct_block *b, const char *type, const char *part);
/* A linear of `out` features, weights normal(0, std), zero biases or none. */
void ct_block_linear(cJSON *layers, const ct_block *b, const char *part, int64_t out, double std, bool bias);
/* An add of the layers a and c (full names, or "block_input"). */
void ct_block_residual(cJSON *layers, const ct_block *b, const char *part, const char *a, const char *c);

#endif

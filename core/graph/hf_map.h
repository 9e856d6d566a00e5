/* hf_map.h: the maps of Hugging Face layouts (GPT-2: hf_gpt2.c, Llama: hf_llama.c), read off the
 * graph's structure by one walk over a table with a row per tensor kind.
 *
 * A layout's layers that hold parameters are split into three parts: the embeddings, L blocks of
 * the same layers, and the final ones (norm and head). A row of the table names the part, the
 * position of its layer in the part (its slot), that layer's type, which of its parameters (0
 * weight, 1 bias), the file's name (after the block prefix in a block), how the tensor is stored
 * there (transposed, the vocabulary's rows only, a tied head's optional copy) and which row block
 * of the view it is (a fused projection that the file keeps as several tensors). Between two slots
 * of a block a layer without parameters may be required (the attention, the activation). */
#ifndef CT_GRAPH_HF_MAP_H
#define CT_GRAPH_HF_MAP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/graph/graph.h"
#include "core/params/tensor_map.h"

typedef enum { CT_HF_EMBED, CT_HF_BLOCK, CT_HF_FINAL } ct_hf_part;

typedef struct ct_hf_row {
    ct_hf_part where;
    int slot;                    /* the layer's position among the part's parameter layers */
    const char *type;            /* ctrain layer type of that layer */
    int spec;                    /* the layer's parameter: 0 weight, 1 bias */
    const char *hf;              /* the file's name (after the block prefix in a block) */
    bool transpose;              /* stored [in, out] (GPT-2's Conv1D) */
    bool vocab;                  /* rows: the predicted classes (an unpadded vocabulary) */
    bool tied;                   /* the head: when it reads the embedding's view ("tie"), the file's copy
                                    is optional (a duplicate entry) */
    int block;                   /* 0: the whole view; k >= 1: the view's k-th row block (layout.blocks) */
} ct_hf_row;

typedef struct ct_hf_between {
    int after;                   /* between this slot of a block and the next */
    const char *type;
    const char *approximate;     /* gelu's, or NULL: any */
} ct_hf_between;

typedef struct ct_hf_layout {
    const char *name;            /* "hf-gpt2", for messages */
    const char *model;           /* "GPT-2" */
    const char *parts;           /* "wte, wpe, %d per block, ln_f, the head" (%d: the block's slots) */
    const ct_hf_row *rows;
    int n_rows;
    const ct_hf_between *between;
    int n_between;
    const char *block_name;      /* the block prefix, printf'd with the block's index: "h.%d." */
    const char *hint;            /* appended to every mismatch: what the layout expects */
    /* Row block k (>= 1) of view `view` of layer `layer`: rows [*row0, *row0 + *n). */
    void (*row_block)(const ct_graph *g, int layer, int k, int64_t rows, int64_t *row0, int64_t *n);
} ct_hf_layout;

/* The layers holding parameters, in order (ct_xcalloc'd; *n receives their count). */
int *ct_hf_param_layers(const ct_graph *g, int *n);
/* CT_ERR_CONFIG "the model is not <model>'s shape for layout <name>: [<path> "<layer>" (<type>): ]
 * <what>.\n<hint>" (layer < 0: no layer named). */
int ct_hf_shape_errf(const ct_graph *g, const ct_hf_layout *lay, int layer, ct_err *err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Check g's parameter layers against the layout (types, parameter counts, the layers between) and
 * fill out->entries, out->n from the rows, `classes` the rows of vocab entries; *pl and *n_pl
 * receive the parameter layers (caller frees *pl), *blocks the block count. */
int ct_hf_map_walk(const ct_graph *g, const ct_hf_layout *lay, int64_t classes, ct_tensor_map *out, int **pl,
                   int *n_pl, int *blocks, ct_err *err);
/* The first layer of `type` between layers lo and hi (exclusive), or -1. */
int ct_hf_layer_between(const ct_graph *g, int lo, int hi, const char *type);

#endif

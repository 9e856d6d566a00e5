/* tensor_map.h: the layout's views under another program's tensor names and layouts.
 *
 * A weights file written by another program (Hugging Face's GPT-2: core/graph/hf_gpt2.h, Llama:
 * core/graph/hf_llama.h) holds the same tensors as a ctrain model under other names, some
 * transposed (a Conv1D weight is [in, out], a ctrain linear's [out, in]), some with fewer rows (an
 * unpadded vocabulary) and some as row blocks of one view (separate q, k and v projections).
 * A map says, once, for every tensor of the file which view it fills and how; the checkpoint
 * module reads and writes files through it (core/ckpt/mapped.h) without knowing whose names
 * they are. Only a description: nothing here allocates tensor memory. */
#ifndef CT_PARAMS_TENSOR_MAP_H
#define CT_PARAMS_TENSOR_MAP_H

#include <stdbool.h>
#include <stdint.h>

#define CT_TMAP_NAME 128

typedef struct ct_tmap_entry {
    char name[CT_TMAP_NAME];     /* the tensor's name in the file (without the optional prefix) */
    int view;                    /* index into the layout's views */
    bool transpose;              /* 2-D: the file holds the view's transpose */
    /* The rows of the view the file's tensor holds: [row0, row0 + rows). All of them, or the
     * first ones of a padded vocabulary (the view's rows past them are set to zero on load and
     * left out on export), or one row block of a fused projection that the file keeps as several
     * tensors (Llama's q_proj, k_proj and v_proj in ctrain's one qkv). */
    int64_t row0, rows;
    /* An optional second copy of another entry's tensor (a tied LM head the file may also hold):
     * when present it must equal that entry's tensor bit for bit; never written. */
    bool duplicate;
} ct_tmap_entry;

typedef struct ct_tensor_map {
    const char *layout;          /* the layout's name for messages: "hf-gpt2" */
    ct_tmap_entry *entries;
    int n;
    const char *prefix;          /* a prefix every name of a file may carry ("transformer."), or NULL */
    char (*ignored)[CT_TMAP_NAME]; /* names a file may hold that carry no weights (mask buffers) */
    int n_ignored;
    const char *write_prefix;    /* the prefix export writes before every name ("" or NULL: none) */
    const char *hint;            /* appended to every mismatch error: what the layout expects */
} ct_tensor_map;

void ct_tensor_map_free(ct_tensor_map *m);

#endif

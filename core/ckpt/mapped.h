/* mapped.h: weights files in another program's names and layouts, read and written through a
 * tensor map (core/params/tensor_map.h; GPT-2's: core/graph/hf_gpt2.h, Llama's: hf_llama.h). This module knows how to
 * move the values (transpose, leave out or zero the padded rows, check a duplicate); the map
 * knows whose names they are. */
#ifndef CT_CKPT_MAPPED_H
#define CT_CKPT_MAPPED_H

#include "core/ckpt/ckpt.h"
#include "core/ckpt/safetensors.h"
#include "core/ckpt/source.h"
#include "core/params/tensor_map.h"

/* model.init_from of `file`, written in map's layout, into t; all or nothing. Every entry's
 * tensor must be in the file (its name, or map->prefix + its name) with the entry's shape (the
 * view's with `rows` rows, transposed for a transposed entry) as F32, F16 or BF16; a duplicate
 * entry's tensor may be absent, and when present must equal its original bit for bit; every
 * tensor of the file must be an entry's or an ignored one. Any mismatch is CT_ERR_CONFIG naming
 * the file and the layout, one line per mismatch naming the tensor (12 at most, then a count),
 * and map->hint; nothing is loaded. A corrupt file: CT_ERR_DATA. A view's rows past an entry's
 * `rows` (a padded vocabulary) are set to zero. *n_loaded (may be NULL) receives the number of
 * the model's tensors (views) loaded (a view filled by several row blocks counts once). */
int ct_ckpt_init_from_map(const char *file, const ct_ckpt_tensors *t, const ct_tensor_map *map,
                          int *n_loaded, ct_err *err);
/* The same over several files (a Hugging Face model's shards), as if they were one: a tensor in
 * two of them is a mismatch. `what` names them in messages (the model's directory). */
int ct_ckpt_init_from_map_files(const char *const *files, int n_files, const char *what, const ct_ckpt_tensors *t,
                                const ct_tensor_map *map, int *n_loaded, ct_err *err);

/* The weight files of a Hugging Face model directory: those model.safetensors.index.json's
 * weight_map names (each once, in order), else model.safetensors. *files (paths joined to dir) is
 * the caller's to free with ct_ckpt_free_files. CT_ERR_CONFIG naming dir when it has neither, or a
 * file the index names is missing; CT_ERR_DATA for an index that is not JSON with a weight_map. */
int ct_ckpt_hf_weight_files(const char *dir, char ***files, int *n, ct_err *err);
/* Whether dir is a Hugging Face model directory: its config.json names a "model_type" (ctrain's
 * own config.json, in every checkpoint, has no such key) and it is no ctrain checkpoint (no
 * COMPLETE marker, no per-rank shards). */
bool ct_ckpt_is_hf_dir(const char *dir);
void ct_ckpt_free_files(char **files, int n);

/* The entries to write for an export in map's layout: every entry but the duplicates, named
 * map->write_prefix + its name, its values from src (a checkpoint of either kind, or a file in
 * ctrain's names, whose tensors have the views' shapes) moved into the file's layout, stored as
 * `dtype`. */
typedef struct ct_mapped_export {
    ct_st_entry *entries;        /* [n] for ct_st_write */
    int n;
    char **names;                /* [n] owned names */
    float **data;                /* [n] owned fp32 values in the file's layout */
} ct_mapped_export;

/* CT_ERR_DATA naming src and the tensor when one of the views is missing from src or has another
 * shape there (a checkpoint that does not fit its own config). */
int ct_ckpt_map_export(const ct_ckpt_source *src, const ct_param_view *views, const ct_tensor_map *map,
                       ct_dtype dtype, ct_mapped_export *out, ct_err *err);
void ct_mapped_export_free(ct_mapped_export *x);

#endif

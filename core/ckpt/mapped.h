/* mapped.h: weights files in another program's names and layouts, read and written through a
 * tensor map (core/params/tensor_map.h; GPT-2's: core/graph/hf_gpt2.h). This module knows how to
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
 * tensors loaded (duplicates not counted). */
int ct_ckpt_init_from_map(const char *file, const ct_ckpt_tensors *t, const ct_tensor_map *map,
                          int *n_loaded, ct_err *err);

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

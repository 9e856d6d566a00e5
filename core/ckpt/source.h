/* source.h: the tensors a load reads, whatever holds them: a checkpoint directory of one file set
 * (model.safetensors, optimizer.safetensors) or of per-rank shards (shards.h), or a single
 * safetensors file (model.init_from). They are read by name and element range, so a rank that
 * holds a part of the flat space reads that part and nothing else. */
#ifndef CT_CKPT_SOURCE_H
#define CT_CKPT_SOURCE_H

#include "core/ckpt/ckpt.h"
#include "core/ckpt/safetensors.h"
#include "core/ckpt/shards.h"
#include "core/ckpt/stage.h"

/* A model tensor of a source. */
typedef struct ct_ckpt_src_tensor {
    const char *name;
    ct_shape shape;
    const char *dtype;           /* its dtype's safetensors name ("F32", "BF16", ...) */
    int ct_dtype;                /* the matching ct_dtype, -1 when ctrain has none */
    const ct_st_tensor *st;      /* in a file (a file set's model, a file, the shards' buffers) */
    int64_t offset;              /* else a trainable view of shards: its flat offset */
} ct_ckpt_src_tensor;

typedef struct ct_ckpt_source {
    char path[4200];             /* what it was opened from, for messages */
    ct_st_file *model, *optim;   /* a file set (optim: when opened with the optimizer), or a file */
    ct_ckpt_shard_set *shards;        /* or per-rank shards */
    ct_ckpt_src_tensor *tensors; /* the model's tensors, sorted by name */
    int n_tensors;
} ct_ckpt_source;

/* Whether a checkpoint directory holds per-rank shards (its shards.json). */
bool ct_ckpt_dir_sharded(const char *dir);
/* A checkpoint directory's tensors (the caller checks its marker and checksums first); with
 * optim, its optimizer state too. CT_ERR_DATA naming the file that cannot be read. */
int ct_ckpt_source_open_dir(const char *dir, bool optim, ct_ckpt_source *out, ct_err *err);
/* One safetensors file's tensors. */
int ct_ckpt_source_open_file(const char *path, ct_ckpt_source *out, ct_err *err);
void ct_ckpt_source_close(ct_ckpt_source *s);

const ct_ckpt_src_tensor *ct_ckpt_source_find(const ct_ckpt_source *s, const char *name);
/* Elements [first, first + n) of model tensor x (flat, row-major) as fp32; false when x's dtype
 * is not F32, F16 or BF16 or the range is outside it. */
bool ct_ckpt_source_read(const ct_ckpt_source *s, const ct_ckpt_src_tensor *x, int64_t first, int64_t n, float *dst);
/* The same into dst (stage.h: straight into host memory, or through one staging buffer).
 * CT_ERR_DATA naming the tensor that cannot be read, or the memory's error. */
int ct_ckpt_source_load(const ct_ckpt_source *s, const ct_ckpt_src_tensor *x, int64_t first, int64_t n,
                        ct_ckpt_loc dst, ct_err *err);

/* The optimizer state (a source opened with it): the optimizer's name and its slots as
 * "exp_avg,exp_avg_sq" (NULL when not recorded). */
const char *ct_ckpt_source_optimizer(const ct_ckpt_source *s);
const char *ct_ckpt_source_slots(const ct_ckpt_source *s);
/* Whether slot `slot` of trainable tensor `view` is there, F32 of shape `shape`. */
bool ct_ckpt_source_has_slot(const ct_ckpt_source *s, const char *view, const char *slot, const ct_shape *shape);
/* Elements [first, first + n) of it into dst, as ct_ckpt_source_load. */
int ct_ckpt_source_load_slot(const ct_ckpt_source *s, const char *view, const char *slot, int64_t first,
                             int64_t n, ct_ckpt_loc dst, ct_err *err);

#endif

/* shards.h: a checkpoint of a partitioned run in per-rank shards (ZeRO stages 1-3 over several
 * ranks; DeepSpeed's zero_pp_rank_* files are the idea, the names and layout are ctrain's).
 *
 * In the checkpoint directory, beside state.json, config.json and COMPLETE (ckpt.h):
 *   zero_shard_<r>_of_<W>.safetensors   rank r's part [lo, hi) of the flat fp32 master ("master")
 *                                       and of each optimizer slot ("exp_avg", ...), each 1-D
 *                                       [hi - lo]; metadata "ctrain_shard" says which part:
 *                                       {"rank": r, "world": W, "lo": lo, "hi": hi, "n_params": N}
 *                                       (and "optimizer", "slots" as optimizer.safetensors)
 *   shards.json                         the index: the layout that saved them (every view's name,
 *                                       shape, flat offset, trainable), n_params, n_buffers, the
 *                                       optimizer and its slots, and the W shard files
 *   buffers.safetensors                 rank 0's non-trainable views (running statistics) by name
 * Every rank writes its own shard; rank 0 the rest. Nothing holds the whole state at any time.
 *
 * A reader opens the set and checks that the shards fit together before anything is read: each
 * file a valid safetensors file (a truncated one is refused), the same n_params, world and slots
 * as the index, "master" and every slot F32 [hi - lo], and the ranges, in order, covering
 * [0, n_params) exactly (no overlap, no gap). Then any range of the master or of a slot is read
 * from the shards that hold it: a rank of another world size reads the intersection of its new
 * part with the saved ones. Every refusal is CT_ERR_DATA naming the file. */
#ifndef CT_CKPT_SHARDS_H
#define CT_CKPT_SHARDS_H

#include "core/ckpt/ckpt.h"
#include "core/ckpt/safetensors.h"

#define CT_SHARDS_INDEX "shards.json"
#define CT_SHARDS_BUFFERS "buffers.safetensors"
#define CT_SHARDS_FORMAT "ctrain_zero_shards"
#define CT_SHARD_META "ctrain_shard"
#define CT_SHARDS_NAME 64

/* "zero_shard_<rank>_of_<world>.safetensors" */
void ct_ckpt_shard_file_name(int rank, int world, char out[CT_SHARDS_NAME]);

/* Rank `rank` of `world`: its shard of t ([t->lo, t->hi) of the master and of each slot) as
 * <dir>/<ct_ckpt_shard_file_name>, fsynced; *crc receives the CRC-32 of its bytes. */
int ct_ckpt_shard_write(const char *dir, const ct_ckpt_tensors *t, int rank, int world, uint32_t *crc, ct_err *err);
/* Rank 0: <dir>/shards.json (t's layout, slots and the shard files of `world` ranks) and
 * <dir>/buffers.safetensors (t's non-trainable views), fsynced; crc[0], crc[1] receive theirs. */
int ct_ckpt_shard_write_index(const char *dir, const ct_ckpt_tensors *t, int world, uint32_t crc[2], ct_err *err);

/* One shard of an open set. */
typedef struct ct_ckpt_shard {
    char file[CT_SHARDS_NAME];   /* its name in the directory */
    char path[4200];             /* for messages */
    ct_st_file *f;
    int64_t lo, hi;
    const ct_st_tensor *master, *slot[CT_CKPT_MAX_SLOTS];
} ct_ckpt_shard;

/* The shards of a checkpoint directory, checked to fit together. */
typedef struct ct_ckpt_shard_set {
    char index_path[4200];
    int world;                   /* shards, sorted by lo */
    ct_ckpt_shard *shards;
    int64_t n_params, n_buffers;
    char optimizer[32];
    int n_slots;
    char slot_name[CT_CKPT_MAX_SLOTS][32];
    char slots[128];             /* the slot names, comma-separated (optimizer.safetensors' "slots") */
    ct_param_view *views;        /* the saving run's layout */
    int n_views;
    ct_st_file *buffers;         /* buffers.safetensors */
} ct_ckpt_shard_set;

/* Open <dir>/shards.json, every shard it names and buffers.safetensors, and check them (above).
 * CT_ERR_DATA naming the file and what is wrong; CT_ERR_RUNTIME when a file cannot be opened. */
int ct_ckpt_shard_set_open(const char *dir, ct_ckpt_shard_set **out, ct_err *err);
void ct_ckpt_shard_set_close(ct_ckpt_shard_set *s);
/* Elements [a, b) of the flat master (slot -1) or of slot `slot` into dst[b - a], each piece from
 * the shard that holds it. False when [a, b) is not inside [0, n_params) or slot is not one. */
bool ct_ckpt_shard_set_read(const ct_ckpt_shard_set *s, int slot, int64_t a, int64_t b, float *dst);
/* Whether shard i holds any of [a, b). */
bool ct_ckpt_shard_overlaps(const ct_ckpt_shard *sh, int64_t a, int64_t b);
/* The view of the saving layout named `name`, or NULL. */
const ct_param_view *ct_ckpt_shard_set_view(const ct_ckpt_shard_set *s, const char *name);

#endif

/* dataset.h: the dataset seam. A format is one file implementing this interface; the loader
 * (threads, shuffling, prefetch, pinned slots) works on any dataset.
 *
 * A dataset is: a count, a per-sample shape and dtype for the input and the target, and
 * "decode sample i into these buffers". decode must be thread-safe (called from many workers).
 * Optional: class names, so an eval set's labels can follow the train set's by name; a note on
 * where the labels come from, for messages; the list of its files, for a fingerprint; where a
 * sample's value is stored, for messages. */
#ifndef CT_DATASET_H
#define CT_DATASET_H

#include <cjson/cJSON.h>

#include "core/util/common.h"
#include "core/config/config.h"
#include "core/util/tensor.h"

typedef struct ct_dataset ct_dataset;
struct ct_dataset {
    const char *format;          /* "idx", "image_folder", ... */
    char source[1024];           /* main file/dir, for messages */
    int64_t count;
    ct_shape sample_shape;       /* input, per sample */
    ct_dtype sample_dtype;       /* dtype written by decode (CT_F32 after normalisation) */
    ct_shape target_shape;       /* per sample; ndim 0 for a class index */
    ct_dtype target_dtype;       /* CT_I32 class index, or CT_F32 */
    int64_t classes;             /* classification: number of classes (0 if not) */
    const char *classes_key;     /* the entry's key that set classes when the config did, not the
                                    data (tokens of an llm.c shard: "vocab", or its default); NULL */
    /* [classes] class names in label order when the format has them (image_folder: the class
     * directories), else NULL. Formats that set it also set use_classes. */
    const char *const *class_names;
    /* Where the labels come from, for messages about targets that do not fit the model: the file
     * and record of the largest label ("FILE: record 5 has label 4, the largest"), or why the
     * targets are not class indices ("FILE:7: label \"-1\" is not a class index ..."). "" when
     * the format has nothing to add. */
    char label_note[1200];
    void *impl;
    /* Decode sample i into input (sample_shape, sample_dtype) and target. Returns CT_OK, or
     * CT_ERR_DATA with err naming the file and record. */
    int (*decode)(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err);
    /* data.transform.on_device: sample i's pixels as stored, uint8 in sample_shape ([C, H, W])
     * and not normalised (the backend's normalize_u8 does that with data.transform.normalize),
     * plus the target as decode writes it. NULL when the format does not hold 8-bit images. */
    int (*decode_u8)(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err);
    /* Relabel by the class list of another dataset: class k of this dataset becomes label
     * map[k] (0 <= map[k] < classes), and the dataset then has `classes` classes named names[0..
     * classes) (copied). Called by ct_dataset_match_classes only; NULL when class_names is. */
    void (*use_classes)(ct_dataset *ds, const int32_t *map, int64_t classes,
                        const char *const *names);
    /* The k-th file the dataset reads (k = 0, 1, ...; NULL after the last), for
     * ct_dataset_fingerprint. NULL when the dataset reads the file `source` alone. */
    const char *(*file)(const ct_dataset *ds, int64_t k);
    /* Formats stored as shards of consecutive samples (webdataset, tfrecord): the first sample of
     * shard k (k = 0, 1, ...; -1 after the last shard), for data.shuffle_buffer (order.h). NULL:
     * the samples are one stream. */
    int64_t (*shard_start)(const ct_dataset *ds, int64_t k);
    /* Where position pos of sample i's input is stored, for messages about a value the format
     * read but the model refuses ("shards/train_000002.bin, token 10, byte offset 1044"), when
     * ds->source alone does not say (tokens from several files). NULL: source says it. */
    void (*where)(const ct_dataset *ds, int64_t i, int64_t pos, char *out, size_t n);
    void (*close)(ct_dataset *ds);
};

/* Open data.train or data.eval (`which` = "train" | "eval"). Returns CT_OK and *out == NULL when
 * the section has no such entry. Errors: config (CT_ERR_CONFIG) or data (CT_ERR_DATA). */
int ct_dataset_open(const ct_config *cfg, const char *which, ct_dataset **out, ct_err *err);
/* The formats (formats.def), for ct_config_opts.formats: whoever loads a config whose data it
 * will open passes them, so that a bad entry is a config error before anything starts. */
const ct_data_format *ct_dataset_formats(int *n);
void ct_dataset_close(ct_dataset *ds);

/* Give ds (data.<which>) the labels of ref (data.<ref_which>) by class name, so that an eval set
 * with fewer class folders than the train set still scores each class against the train set's
 * label for it. Nothing to do (CT_OK) unless both datasets have class names. A class of ds that
 * ref lacks is CT_ERR_DATA naming ds's source, the class and ref's classes. */
int ct_dataset_match_classes(ct_dataset *ds, const char *which, const ct_dataset *ref,
                             const char *ref_which, ct_err *err);

/* A fingerprint of the files an open dataset reads, to notice a dataset replaced between two runs
 * (a checkpoint stores it; a resume compares it with the fingerprint of the data it opened):
 *
 *     "v1 files=N bytes=B content=XXXXXXXXXXXXXXXX mtime=XXXXXXXXXXXXXXXX"
 *
 * N files (ds->file, else `source`), B bytes in all; content: a 64-bit FNV-1a hash of, file by
 * file in order, its name relative to `source` (or its base name when outside it), its size, and
 * the first 4 KiB of up to 64 files (all of them when there are at most 64, else 64 spread evenly
 * over the list); mtime: the same hash of the files' modification times (ns). A difference in
 * files, bytes or content means the data changed; a difference in mtime alone means the files
 * were rewritten or copied (cp without -p, rsync without -t) and may hold other data past the
 * bytes hashed. The cost is one stat per file plus at most 64 reads of 4 KiB: call it once after
 * opening. out: CT_DATASET_FINGERPRINT bytes. CT_ERR_DATA naming the file when one cannot be
 * read. */
enum { CT_DATASET_FINGERPRINT = 96 };
int ct_dataset_fingerprint(const ct_dataset *ds, char *out, ct_err *err);

/* The file of ds that is `path` (the same device and inode: also through a link or another
 * spelling of the path), or NULL when ds does not read it or `path` does not exist. For outputs
 * that must not replace an input; one stat per file of ds when `path` exists. */
const char *ct_dataset_reads_file(const ct_dataset *ds, const char *path);

#endif

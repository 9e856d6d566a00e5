/* formats.h: the openers of the dataset formats, called by ct_dataset_open (dataset.c).
 * One format = one file in core/data/ + one line here and in dataset.c's table. The
 * data.transform parsing the openers share is in transform.h (a leaf below them). */
#ifndef CT_DATA_FORMATS_H
#define CT_DATA_FORMATS_H

#include <cjson/cJSON.h>

#include "core/config/config.h"
#include "core/data/dataset.h"

/* entry: the data.<which> object; path: "data.train" for messages. */
int ct_idx_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                ct_err *err);

/* image_folder.c, shard.c, tokens.c, csv.c: the data-pipeline formats (same contract). */
int ct_image_folder_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                         ct_err *err);
int ct_shard_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                  ct_err *err);
int ct_tokens_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                   ct_err *err);
int ct_csv_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                ct_err *err);
/* webdataset.c: WebDataset .tar shards (an index built by one sequential scan at open). */
int ct_webdataset_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                       ct_err *err);

/* tfrecord.c: TFRecord files of tf.Example records (located by a sequential scan or index files). */
int ct_tfrecord_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                     ct_err *err);

/* hdf5.c: two datasets of an HDF5 file, read through libhdf5 (loaded on first use, hdf5_lib.h). */
int ct_hdf5_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out, ct_err *err);

#endif

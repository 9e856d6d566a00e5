/* formats.h: the openers of the dataset formats, called by ct_dataset_open (dataset.c), one per
 * row of formats.def. The data.transform parsing the openers share is in transform.h (a leaf
 * below them). */
#ifndef CT_DATA_FORMATS_H
#define CT_DATA_FORMATS_H

#include <cjson/cJSON.h>

#include "core/config/config.h"
#include "core/data/dataset.h"

/* ct_<name>_open: open data.<which> of format <name>. entry: the data.<which> object; path:
 * "data.train" for messages. The contract is docs/ADDING.md's ("A dataset format"). */
#define CT_FORMAT(name, ...) \
    int ct_##name##_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out, ct_err *err);
#include "core/data/formats.def"
#undef CT_FORMAT

#endif

/* webdataset.h: what `ctrain info` shows of a WebDataset .tar shard (the format itself is opened
 * through the dataset seam: ct_webdataset_open in formats.h). */
#ifndef CT_DATA_WEBDATASET_H
#define CT_DATA_WEBDATASET_H

#include <stdbool.h>
#include <stdio.h>

#include "core/util/common.h"

/* Whether path names a tar file: its name ends in .tar and its first header's "ustar" magic or
 * checksum holds. */
bool ct_webdataset_is_tar(const char *path);

/* One shard's samples (keys) and its members per extension, the first sample's fields, to out.
 * CT_ERR_DATA naming the file and member for a corrupt shard. */
int ct_webdataset_info(const char *path, FILE *out, ct_err *err);

#endif

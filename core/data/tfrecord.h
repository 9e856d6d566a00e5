/* tfrecord.h: what `ctrain info` shows of a TFRecord file (the format itself is opened through the
 * dataset seam: ct_tfrecord_open in formats.h; the framing is core/util/tfrecord.h). */
#ifndef CT_DATA_TFRECORD_H
#define CT_DATA_TFRECORD_H

#include <stdbool.h>
#include <stdio.h>

#include "core/util/common.h"

/* Whether path is a TFRecord file: its first record header's length CRC holds (whatever its name;
 * an empty file is not one). */
bool ct_tfrecord_is_file(const char *path);

/* The file's records and bytes, and the features of its first tf.Example (name, list kind, values),
 * to out. CT_ERR_DATA naming the file and record for a corrupt file. */
int ct_tfrecord_info(const char *path, FILE *out, ct_err *err);

#endif

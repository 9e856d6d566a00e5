/* hdf5_info.h: what `ctrain info` shows of an HDF5 file (the format itself is opened through the
 * dataset seam: ct_hdf5_open in formats.h; libhdf5 is loaded as hdf5_lib.h says). */
#ifndef CT_DATA_HDF5_INFO_H
#define CT_DATA_HDF5_INFO_H

#include <stdbool.h>
#include <stdio.h>

#include "core/util/common.h"

/* Whether path starts with the HDF5 signature (whatever its name). */
bool ct_hdf5_is_file(const char *path);

/* The datasets of the file's root group (element type, shape, layout, chunks and filters) and the
 * entry that reads it, to out. CT_ERR_DATA naming the file when it is not a readable HDF5 file;
 * CT_ERR_RUNTIME when libhdf5 cannot be loaded. */
int ct_hdf5_info(const char *path, FILE *out, ct_err *err);

#endif

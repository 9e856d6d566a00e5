/* hdf5_rows.h: reading an HDF5 dataset's samples without libhdf5, from the layout the metadata
 * probe resolved and the reading process checked (hdf5_layout.h): pread of the contiguous range
 * or of each chunk, the chunk's filters undone in reverse order (hdf5_filters.h), chunks never
 * written given the fill value, edge chunks clipped to the dataset's shape. Thread-safe: it
 * keeps no state (the loader's workers call it in parallel on one descriptor). */
#ifndef CT_DATA_HDF5_ROWS_H
#define CT_DATA_HDF5_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/data/hdf5_layout.h"

/* Whether ctrain decodes filter `id` (deflate, shuffle, fletcher32). */
bool ct_h5_filter_known(uint32_t id);
/* "deflate", "szip", "lzf", ... or "filter 32001" for messages. */
void ct_h5_filter_name(uint32_t id, char *out, size_t n);

/* Rows [first, first + rows) of dataset l along its first dimension, every other dimension
 * whole: [rows, dims[1], ...] elements of l->elem bytes as stored (the file's byte order), into
 * dst. false with the reason in why (a chunk that does not decompress, a failed checksum, a file
 * cut short since it was opened). The caller checks first + rows <= dims[0]. */
bool ct_h5_read_rows(const ct_h5_layout *l, int fd, int64_t first, int64_t rows, uint8_t *dst, char *why, size_t n);

#endif

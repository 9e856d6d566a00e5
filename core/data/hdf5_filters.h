/* hdf5_filters.h: the HDF5 filters ctrain decodes itself (hdf5_rows.c runs a chunk's pipeline
 * through them in reverse): deflate (zlib), shuffle, fletcher32. Each takes untrusted bytes and
 * a capacity, and fails with a reason instead of reading or writing past either. */
#ifndef CT_DATA_HDF5_FILTERS_H
#define CT_DATA_HDF5_FILTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Inflate the zlib stream src[0..n) (HDF5's deflate filter: zlib's format, as compress2 writes)
 * into dst[0..cap): the bytes written to *out. false with the reason in why: a corrupt stream, or
 * one that decompresses to more than cap. */
bool ct_h5_inflate(const uint8_t *src, size_t n, uint8_t *dst, size_t cap, size_t *out, char *why, size_t why_n);

/* Undo the shuffle filter: src[0..n) holds byte 0 of every element of `elem` bytes, then byte 1,
 * ...; dst gets the elements back. Bytes past the last whole element stay where they are. */
void ct_h5_unshuffle(const uint8_t *src, size_t n, size_t elem, uint8_t *dst);

/* HDF5's Fletcher-32 of p[0..n): 16-bit big-endian words (an odd last byte as the high byte of a
 * word), sums folded to 16 bits as HDF5 folds them. */
uint32_t ct_h5_fletcher32(const uint8_t *p, size_t n);

/* The fletcher32 filter on read: p[0..n) ends with the checksum of the bytes before it (stored
 * little-endian; HDF5 before 1.6.3 wrote it byte-swapped, which is accepted too). true when it
 * matches; *n_out = n - 4. */
bool ct_h5_fletcher32_check(const uint8_t *p, size_t n, size_t *n_out);

#endif

/* tfrecord.h: TFRecord framing, the one implementation that TensorBoard event files
 * (core/report/tfevents.c) and TFRecord datasets (core/data/tfrecord.c) share.
 *
 * A file is a sequence of records, each:
 *     uint64 length            little-endian, the bytes of data
 *     uint32 masked_crc32c(length's 8 bytes)
 *     byte   data[length]
 *     uint32 masked_crc32c(data)
 * (masked: core/util/crc32c.h). Nothing else: no file header, no padding. */
#ifndef CT_TFRECORD_H
#define CT_TFRECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Bytes before a record's data, after it, and both together. */
enum { CT_TFRECORD_HEAD = 12, CT_TFRECORD_TAIL = 4, CT_TFRECORD_FRAMING = 16 };

/* The header of a record holding n bytes. */
void ct_tfrecord_head(uint8_t head[CT_TFRECORD_HEAD], uint64_t n);
/* The footer of data[0..n). */
void ct_tfrecord_tail(uint8_t tail[CT_TFRECORD_TAIL], const void *data, size_t n);
/* A header read back: *n = the data length; false when the length's CRC does not match (a torn
 * or corrupt header, or a file that is not TFRecord). */
bool ct_tfrecord_head_check(const uint8_t head[CT_TFRECORD_HEAD], uint64_t *n);
/* Whether tail holds the CRC of data[0..n). */
bool ct_tfrecord_tail_check(const uint8_t tail[CT_TFRECORD_TAIL], const void *data, size_t n);

/* Append one record holding data[0..n). 0, or -1 when the stream failed (errno says why). */
int ct_tfrecord_write(FILE *f, const void *data, size_t n);

#endif

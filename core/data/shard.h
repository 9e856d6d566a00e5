/* shard.h: ctrain's packed dataset format (byte layout in docs/formats.md).
 *
 * A shard dataset is a directory of shard-NNNNNN.cts files (or one such file). Each shard holds
 * pre-decoded records (u8 or f32 samples, optionally zlib-compressed one by one), an index of
 * (offset, sizes, CRC32, label) per record, and a header with magic, version, sample geometry
 * and CRC32s of itself and the index. Readers mmap the shards; a truncated or corrupted shard is
 * reported as CT_ERR_DATA naming the file and record, never misread. */
#ifndef CT_DATA_SHARD_H
#define CT_DATA_SHARD_H

#include <stdio.h>

#include "core/util/common.h"
#include "core/util/tensor.h"

#define CT_SHARD_MAGIC "\x89" "CTS\r\n\x1a\n"  /* 8 bytes */
#define CT_SHARD_VERSION 1u
#define CT_SHARD_HEADER 64u                     /* bytes */
#define CT_SHARD_ENTRY 32u                      /* index bytes per record */
enum { CT_SHARD_U8 = 1, CT_SHARD_F32 = 2 };     /* record encodings */
enum { CT_SHARD_ZLIB = 1 };                     /* index entry flags */

/* Writer: shards of about shard_bytes of record data in dir (created if missing). */
typedef struct ct_shard_writer {
    char dir[1024];
    uint32_t encoding, classes;
    ct_shape shape;              /* per-sample, at most 4 dims */
    size_t raw_bytes;            /* per record */
    size_t shard_bytes;
    bool compress;
    int shard_no;
    FILE *f;
    char tmp[1100], final[1100]; /* current shard: written under tmp, renamed when complete */
    uint64_t data_end;           /* bytes written to the current shard */
    uint8_t *index;              /* [n_in_shard, CT_SHARD_ENTRY] */
    uint64_t n_in_shard, cap;
    uint64_t total;
    uint8_t *zbuf;
    size_t zcap;
} ct_shard_writer;

int ct_shard_writer_open(ct_shard_writer *w, const char *dir, uint32_t encoding, const ct_shape *shape,
                         uint32_t classes, size_t shard_bytes, bool compress, ct_err *err);
/* Append one record: raw_bytes of samples in the encoding, and its label. */
int ct_shard_write(ct_shard_writer *w, const void *record, int32_t label, ct_err *err);
/* Give up: the shard being written is removed (completed ones stay). */
void ct_shard_writer_discard(ct_shard_writer *w);
/* Finish the last shard. Returns CT_OK or an I/O error; the writer is released either way. */
int ct_shard_writer_close(ct_shard_writer *w, ct_err *err);

/* `ctrain info` for a shard file or a directory of shards: checks headers and indexes, prints
 * files, records and sample geometry to out. CT_ERR_DATA naming the file when one is corrupt. */
int ct_shard_info(const char *path, FILE *out, ct_err *err);

#endif

/* crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord
 * framing (core/util/tfrecord.h: TensorBoard event files and TFRecord datasets) and of many storage formats. */
#ifndef CT_CRC32C_H
#define CT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of data[0..n), continuing from `crc` (0 for a fresh checksum): so
 * ct_crc32c(ct_crc32c(0, a, k), a + k, n - k) == ct_crc32c(0, a, n). */
uint32_t ct_crc32c(uint32_t crc, const void *data, size_t n);
/* The same by table lookups alone, whatever the CPU (what ct_crc32c does without SSE4.2): for the
 * test that both agree. */
uint32_t ct_crc32c_portable(uint32_t crc, const void *data, size_t n);

/* TFRecord's masked form of a CRC (rotate right by 15, add a constant): a record's CRC stored
 * inside data that is itself checksummed would otherwise weaken the outer check. */
uint32_t ct_crc32c_mask(uint32_t crc);

#endif

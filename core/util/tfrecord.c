/* tfrecord.c: TFRecord framing (format in tfrecord.h). */
#include "core/util/tfrecord.h"

#include "core/util/crc32c.h"

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t masked(const void *data, size_t n) { return ct_crc32c_mask(ct_crc32c(0, data, n)); }

void ct_tfrecord_head(uint8_t head[CT_TFRECORD_HEAD], uint64_t n) {
    put_le(head, n, 8);
    put_le(head + 8, masked(head, 8), 4);
}

void ct_tfrecord_tail(uint8_t tail[CT_TFRECORD_TAIL], const void *data, size_t n) {
    put_le(tail, masked(data, n), 4);
}

bool ct_tfrecord_head_check(const uint8_t head[CT_TFRECORD_HEAD], uint64_t *n) {
    *n = get_le(head, 8);
    return (uint32_t)get_le(head + 8, 4) == masked(head, 8);
}

bool ct_tfrecord_tail_check(const uint8_t tail[CT_TFRECORD_TAIL], const void *data, size_t n) {
    return (uint32_t)get_le(tail, 4) == masked(data, n);
}

int ct_tfrecord_write(FILE *f, const void *data, size_t n) {
    uint8_t head[CT_TFRECORD_HEAD], tail[CT_TFRECORD_TAIL];
    ct_tfrecord_head(head, n);
    ct_tfrecord_tail(tail, data, n);
    if (fwrite(head, 1, sizeof head, f) != sizeof head || fwrite(data, 1, n, f) != n ||
        fwrite(tail, 1, sizeof tail, f) != sizeof tail)
        return -1;
    return 0;
}

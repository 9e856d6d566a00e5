/* test_tfrecord.c: the TFRecord framing shared by the TensorBoard writer and the TFRecord reader
 * (core/util/tfrecord.c), and CRC-32C's two paths (the x86-64 crc32 instruction and the table)
 * against a bit-by-bit reference on random data of every length and alignment up to 300 bytes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/crc32c.h"
#include "core/util/tfrecord.h"

/* CRC-32C one bit at a time, straight from the definition (reflected polynomial 0x82F63B78). */
static uint32_t crc_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

START_TEST(crc32c_paths_agree) {
    uint8_t buf[320];
    srand(23);
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rand();
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= 300; n++) {
            uint32_t want = crc_bitwise(buf + off, n);
            ck_assert_uint_eq(ct_crc32c(0, buf + off, n), want);
            ck_assert_uint_eq(ct_crc32c_portable(0, buf + off, n), want);
            size_t k = n / 3; /* continuing from a partial CRC, across the two paths */
            ck_assert_uint_eq(ct_crc32c(ct_crc32c_portable(0, buf + off, k), buf + off + k, n - k), want);
        }
}
END_TEST

START_TEST(framing_roundtrip) {
    uint8_t data[100];
    for (int i = 0; i < 100; i++) data[i] = (uint8_t)(i * 7 + 3);
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    ck_assert_int_eq(ct_tfrecord_write(f, data, sizeof data), 0);
    ck_assert_int_eq(ct_tfrecord_write(f, data, 0), 0); /* an empty record */
    fclose(f);
    ck_assert_uint_eq(len, 2 * CT_TFRECORD_FRAMING + sizeof data);
    const uint8_t *p = (const uint8_t *)mem;
    uint64_t n;
    ck_assert(ct_tfrecord_head_check(p, &n));
    ck_assert_uint_eq(n, sizeof data);
    ck_assert(!memcmp(p + CT_TFRECORD_HEAD, data, sizeof data));
    ck_assert(ct_tfrecord_tail_check(p + CT_TFRECORD_HEAD + n, p + CT_TFRECORD_HEAD, n));
    const uint8_t *q = p + CT_TFRECORD_FRAMING + n;
    ck_assert(ct_tfrecord_head_check(q, &n));
    ck_assert_uint_eq(n, 0);
    ck_assert(ct_tfrecord_tail_check(q + CT_TFRECORD_HEAD, q + CT_TFRECORD_HEAD, 0));
    /* Every single-bit flip of the first record is caught by one of the two CRCs. */
    uint8_t rec[CT_TFRECORD_FRAMING + sizeof data];
    for (size_t bit = 0; bit < 8 * sizeof rec; bit++) {
        memcpy(rec, p, sizeof rec);
        rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        bool ok = ct_tfrecord_head_check(rec, &n) && n == sizeof data &&
                  ct_tfrecord_tail_check(rec + CT_TFRECORD_HEAD + n, rec + CT_TFRECORD_HEAD, n);
        ck_assert_msg(!ok, "bit %zu flipped unnoticed", bit);
    }
    /* The header ct_tfrecord_head writes is what ct_tfrecord_write wrote. */
    uint8_t head[CT_TFRECORD_HEAD];
    ct_tfrecord_head(head, sizeof data);
    ck_assert(!memcmp(head, p, sizeof head));
    free(mem);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tfrecord");
    TCase *tc = tcase_create("tfrecord");
    tcase_add_test(tc, crc32c_paths_agree);
    tcase_add_test(tc, framing_roundtrip);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

/* test_rng.c: Philox4x32-10 known answers (Random123 kat_vectors) and the streams built on it. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/rng.h"

static void check_kat(const uint32_t ctr[4], uint32_t k0, uint32_t k1, const uint32_t want[4]) {
    ct_philox_ctr c = {{ctr[0], ctr[1], ctr[2], ctr[3]}};
    ct_philox_ctr o = ct_philox4x32(((uint64_t)k1 << 32) | k0, c);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(o.v[i] == want[i], "word %d: got %08x want %08x", i, o.v[i], want[i]);
}

START_TEST(philox_known_answers) {
    /* Random123 kat_vectors: counter[4], key[2] -> output[4] */
    const uint32_t zero[4] = {0, 0, 0, 0}, zero_out[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    check_kat(zero, 0, 0, zero_out);
    const uint32_t ones[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
    const uint32_t ones_out[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    check_kat(ones, 0xffffffff, 0xffffffff, ones_out);
    const uint32_t pi[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t pi_out[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    check_kat(pi, 0xa4093822, 0x299f31d0, pi_out);
}
END_TEST

START_TEST(stream_matches_rng_at) {
    ct_rng r;
    ct_rng_init(&r, 1234, CT_RNG_DROPOUT, 77);
    for (uint64_t i = 0; i < 1000; i++) {
        uint32_t a = ct_rng_u32(&r), b = ct_rng_at(1234, CT_RNG_DROPOUT, 77, i);
        ck_assert_msg(a == b, "word %llu differs", (unsigned long long)i);
    }
    /* seek lands on block boundaries: block 5 starts at word 20 */
    ct_rng_seek(&r, 5);
    ck_assert_uint_eq(ct_rng_u32(&r), ct_rng_at(1234, CT_RNG_DROPOUT, 77, 20));
}
END_TEST

START_TEST(streams_differ) {
    /* seed, purpose and stream each change the numbers */
    uint32_t base = ct_rng_at(1, CT_RNG_INIT, 0, 0);
    ck_assert_uint_ne(base, ct_rng_at(2, CT_RNG_INIT, 0, 0));
    ck_assert_uint_ne(base, ct_rng_at(1, CT_RNG_DROPOUT, 0, 0));
    ck_assert_uint_ne(base, ct_rng_at(1, CT_RNG_INIT, 1, 0));
    ck_assert_uint_ne(base, ct_rng_at(1, CT_RNG_INIT, 0, 1));
    ck_assert_uint_ne(ct_rng_at(1, CT_RNG_INIT, 1ull << 40, 0), ct_rng_at(1, CT_RNG_INIT, 0, 0));
}
END_TEST

START_TEST(uniform_range_and_moments) {
    ct_rng r;
    ct_rng_init(&r, 42, CT_RNG_INIT, 3);
    const int n = 200000;
    double sum = 0, sum_d = 0, sum_n = 0, sum_n2 = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < n; i++) {
        float u = ct_rng_uniform(&r);
        double d = ct_rng_uniform_f64(&r);
        ck_assert(u >= 0.0f && u < 1.0f);
        ck_assert(d >= 0.0 && d < 1.0);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        sum += u;
        sum_d += d;
        float z = ct_rng_normal(&r);
        ck_assert(isfinite(z));
        sum_n += z;
        sum_n2 += (double)z * z;
    }
    ck_assert(lo < 1e-3f && hi > 0.999f);
    ck_assert_double_eq_tol(sum / n, 0.5, 0.005);
    ck_assert_double_eq_tol(sum_d / n, 0.5, 0.005);
    ck_assert_double_eq_tol(sum_n / n, 0.0, 0.01);
    ck_assert_double_eq_tol(sum_n2 / n, 1.0, 0.02);
}
END_TEST

START_TEST(below_is_unbiased_and_in_range) {
    ct_rng r;
    ct_rng_init(&r, 9, CT_RNG_AUGMENT, 0);
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        uint32_t v = ct_rng_below(&r, 7);
        ck_assert_uint_lt(v, 7);
        counts[v]++;
    }
    for (int i = 0; i < 7; i++) {
        ck_assert_int_gt(counts[i], 9500);
        ck_assert_int_lt(counts[i], 10500);
    }
    ck_assert_uint_eq(ct_rng_below(&r, 1), 0);
    /* a bound near 2^32 exercises the rejection path */
    for (int i = 0; i < 1000; i++) ck_assert_uint_lt(ct_rng_below(&r, 0xC0000001u), 0xC0000001u);
}
END_TEST

START_TEST(permutation_is_deterministic_permutation) {
    const uint32_t n = 1000;
    uint32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    char *seen = calloc(n, 1);
    ct_rng_permutation(7, 3, a, n);
    ct_rng_permutation(7, 3, b, n);
    ct_rng_permutation(7, 4, c, n);
    ck_assert(memcmp(a, b, n * sizeof *a) == 0);
    ck_assert(memcmp(a, c, n * sizeof *a) != 0);
    int fixed = 0;
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_uint_lt(a[i], n);
        ck_assert(!seen[a[i]]);
        seen[a[i]] = 1;
        fixed += a[i] == i;
    }
    ck_assert_int_lt(fixed, 10); /* a shuffle, not the identity */
    uint32_t one = 99;
    ct_rng_permutation(7, 0, &one, 1);
    ck_assert_uint_eq(one, 0);
    free(a);
    free(b);
    free(c);
    free(seen);
}
END_TEST

int main(void) {
    Suite *s = suite_create("rng");
    TCase *tc = tcase_create("philox");
    tcase_add_test(tc, philox_known_answers);
    tcase_add_test(tc, stream_matches_rng_at);
    tcase_add_test(tc, streams_differ);
    tcase_add_test(tc, uniform_range_and_moments);
    tcase_add_test(tc, below_is_unbiased_and_in_range);
    tcase_add_test(tc, permutation_is_deterministic_permutation);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* test_order.c: data.shuffle_buffer's order (core/data/order.c) on a dataset of shards of
 * different sizes: a permutation of every sample, the same for the same (seed, epoch) and another
 * for another epoch or seed; with a buffer of 1 each shard is read start to end, the shards in a
 * shuffled order; every sample comes out at most buffer - 1 places before its place in the stream;
 * a buffer as large as the data is a full shuffle of the stream; and the config key's errors. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/order.h"

/* 5 shards of 7, 0, 13, 1 and 9 samples (an empty one included). */
static const int64_t starts[] = {0, 7, 7, 20, 21};
enum { SHARDS = 5, N = 30 };

static int64_t shard_start(const ct_dataset *ds, int64_t k) { return k < SHARDS ? starts[k] : -1; }

static int64_t shard_of(int64_t i) {
    int64_t k = SHARDS - 1;
    while (starts[k] > i) k--;
    return k;
}

static ct_dataset fake(void) {
    ct_dataset ds;
    memset(&ds, 0, sizeof ds);
    ds.count = N;
    ds.shard_start = shard_start;
    return ds;
}

static void check_permutation(const uint32_t *o) {
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        ck_assert_uint_lt(o[i], N);
        seen[o[i]]++;
    }
    for (int i = 0; i < N; i++) ck_assert_int_eq(seen[i], 1);
}

START_TEST(order_is_a_seeded_permutation) {
    ct_dataset ds = fake();
    uint32_t a[N], b[N], c[N], d[N];
    ct_order_shuffle_buffer(&ds, 42, 3, 8, a);
    ct_order_shuffle_buffer(&ds, 42, 3, 8, b);
    ct_order_shuffle_buffer(&ds, 42, 4, 8, c);
    ct_order_shuffle_buffer(&ds, 43, 3, 8, d);
    check_permutation(a);
    check_permutation(c);
    check_permutation(d);
    ck_assert(!memcmp(a, b, sizeof a));
    ck_assert(memcmp(a, c, sizeof a) != 0);
    ck_assert(memcmp(a, d, sizeof a) != 0);
}
END_TEST

START_TEST(buffer_of_one_reads_shards_through) {
    ct_dataset ds = fake();
    uint32_t o[N];
    bool different_shard_order = false;
    for (uint64_t epoch = 0; epoch < 8; epoch++) {
        ct_order_shuffle_buffer(&ds, 7, epoch, 1, o);
        check_permutation(o);
        for (int i = 1; i < N; i++)
            if (shard_of(o[i]) == shard_of(o[i - 1])) ck_assert_uint_eq(o[i], o[i - 1] + 1);
            else ck_assert_uint_eq(o[i], starts[shard_of(o[i])]); /* a shard starts at its first sample */
        different_shard_order |= shard_of(o[0]) != 0 || shard_of(o[N - 1]) != SHARDS - 1;
    }
    ck_assert(different_shard_order);
}
END_TEST

/* Sample o[p] entered the buffer at most buffer - 1 places after p in the stream (the shards in
 * this epoch's order): the buffer bounds how far ahead of the output the reads run. */
START_TEST(buffer_bounds_the_lookahead) {
    ct_dataset ds = fake();
    uint32_t o[N], one[N];
    for (int64_t buffer = 1; buffer <= 12; buffer++) {
        ct_order_shuffle_buffer(&ds, 11, 2, buffer, o);
        ct_order_shuffle_buffer(&ds, 11, 2, 1, one); /* the stream itself: the same shard order */
        int pos[N];
        for (int p = 0; p < N; p++) pos[one[p]] = p;
        bool moved = false;
        for (int p = 0; p < N; p++) {
            ck_assert_int_le(pos[o[p]], p + buffer - 1);
            moved |= o[p] != one[p];
        }
        ck_assert(moved || buffer == 1);
    }
    /* A buffer as large as the data holds it all: no sample is bound to its shard's place. */
    ct_order_shuffle_buffer(&ds, 11, 2, N, o);
    check_permutation(o);
    /* One shard (no shard_start): the samples in file order through the buffer. */
    ds.shard_start = NULL;
    ct_order_shuffle_buffer(&ds, 11, 2, 1, o);
    for (int i = 0; i < N; i++) ck_assert_uint_eq(o[i], i);
}
END_TEST

START_TEST(shuffle_buffer_key) {
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.path, sizeof cfg.path, "c.json");
    ct_err err = {0};
    int64_t b = -1;
    ck_assert_int_eq(ct_order_buffer_parse(&cfg, &b, &err), CT_OK); /* no data section */
    ck_assert_int_eq(b, 0);
    const char *bad[] = {"{\"shuffle_buffer\": 0}", "{\"shuffle_buffer\": 2.5}", "{\"shuffle_buffer\": \"big\"}"};
    for (int i = 0; i < 3; i++) {
        cJSON *data = cJSON_Parse(bad[i]);
        cfg.data = data;
        ck_assert_int_eq(ct_order_buffer_parse(&cfg, &b, &err), CT_ERR_CONFIG);
        ck_assert_msg(strstr(err.msg, "data.shuffle_buffer: expected the samples the shuffle buffer holds"), "%s",
                      err.msg);
        cJSON_Delete(data);
    }
    cJSON *data = cJSON_Parse("{\"shuffle_buffer\": 10000}");
    cfg.data = data;
    ck_assert_int_eq(ct_order_buffer_parse(&cfg, &b, &err), CT_OK);
    ck_assert_int_eq(b, 10000);
    cJSON_Delete(data);
}
END_TEST

int main(void) {
    Suite *s = suite_create("order");
    TCase *tc = tcase_create("order");
    tcase_add_test(tc, order_is_a_seeded_permutation);
    tcase_add_test(tc, buffer_of_one_reads_shards_through);
    tcase_add_test(tc, buffer_bounds_the_lookahead);
    tcase_add_test(tc, shuffle_buffer_key);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

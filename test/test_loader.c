/* test_loader.c: the threaded loader. Every batch's bytes are identical with 1, 2 and 4 workers
 * (the synthetic dataset sleeps at random to scramble timing), seeking to a position gives the
 * batches an uninterrupted run gives, eval order is 0..n-1, drop_last, augmentation, the cache,
 * skip_corrupt counting and data errors. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/loader.h"

enum { N = 103, C = 2, H = 5, W = 6 };

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

typedef struct syn {
    int bad_record;              /* decode fails for this record (-1: none) */
    int bad_label;               /* this record's label is 99 (-1: none) */
    _Atomic int decodes;
} syn;

static int syn_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    syn *s = ds->impl;
    s->decodes++;
    if (mix((uint32_t)i * 31u + (uint32_t)rand()) % 8 == 0) usleep(200); /* scramble timing */
    if (i == s->bad_record) return ct_errf(err, CT_ERR_DATA, "syn.bin: record %lld: corrupt", (long long)i);
    float *x = input;
    for (int k = 0; k < C * H * W; k++) x[k] = (float)(mix((uint32_t)(i * 1000 + k)) % 1000) / 100.0f;
    *(int32_t *)target = i == s->bad_label ? 99 : (int32_t)(mix((uint32_t)i) % 7);
    return CT_OK;
}

static ct_dataset make_ds(syn *s) {
    s->bad_record = s->bad_label = -1;
    s->decodes = 0;
    ct_dataset ds = {.format = "syn", .count = N, .sample_shape = {.ndim = 3, .d = {C, H, W}},
                     .sample_dtype = CT_F32, .target_dtype = CT_I32, .classes = 7, .impl = s,
                     .decode = syn_decode};
    snprintf(ds.source, sizeof ds.source, "syn.bin");
    return ds;
}

static ct_loader_opts opts(int workers) {
    ct_loader_opts o = {.batch = 8, .workers = workers, .prefetch = 3, .shuffle = true,
                        .drop_last = false, .seed = 1234, .classes = 7};
    o.aug.crop_pad = 2;
    o.aug.hflip = true;
    o.pad_value[0] = -1.5f;
    o.pad_value[1] = 2.5f;
    return o;
}

/* Concatenated bytes (inputs, then targets, then n) of `nb` batches. */
static uint8_t *collect(ct_backend *be, const ct_dataset *ds, const ct_loader_opts *o, int64_t epoch,
                        int64_t batch, int nb, size_t *len) {
    ct_loader *l;
    ct_err err = {0};
    ck_assert_msg(ct_loader_init(&l, be, ds, o, NULL, &err) == CT_OK, "%s", err.msg);
    if (epoch || batch) ct_loader_seek(l, epoch, batch);
    size_t per = (size_t)o->batch * (C * H * W * 4 + 4) + 8;
    uint8_t *all = calloc((size_t)nb, per);
    for (int i = 0; i < nb; i++) {
        ct_loader_batch b;
        ck_assert_msg(ct_loader_next(l, &b, &err) == CT_OK, "%s", err.msg);
        uint8_t *p = all + (size_t)i * per;
        memcpy(p, b.input, (size_t)b.n * C * H * W * 4);
        memcpy(p + (size_t)o->batch * C * H * W * 4, b.target, (size_t)b.n * 4);
        memcpy(p + per - 8, &b.n, 8);
    }
    ct_loader_free(l);
    *len = (size_t)nb * per;
    return all;
}

START_TEST(test_workers_identical) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    size_t n1, n2, n4;
    ct_loader_opts o = opts(1);
    int nb = 3 * 13 + 2; /* 13 batches per epoch: crosses epoch boundaries */
    uint8_t *a = collect(be, &ds, &o, 0, 0, nb, &n1);
    o.workers = 2;
    uint8_t *b = collect(be, &ds, &o, 0, 0, nb, &n2);
    o.workers = 4;
    o.prefetch = 7;
    uint8_t *c = collect(be, &ds, &o, 0, 0, nb, &n4);
    ck_assert(n1 == n2 && n1 == n4);
    ck_assert_msg(memcmp(a, b, n1) == 0, "1 vs 2 workers differ");
    ck_assert_msg(memcmp(a, c, n1) == 0, "1 vs 4 workers differ");
    /* Resume: from (epoch 1, batch 5) the same bytes as the uninterrupted run. */
    size_t nr, per = n1 / (size_t)nb;
    uint8_t *r = collect(be, &ds, &o, 1, 5, nb - 18, &nr);
    ck_assert_msg(memcmp(a + 18 * per, r, nr) == 0, "resumed batches differ");
    /* Epochs differ (shuffle and augmentation change). */
    ck_assert(memcmp(a, a + 13 * per, per) != 0);
    free(a);
    free(b);
    free(c);
    free(r);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_eval_order_and_drop_last) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = {.batch = 10, .workers = 2, .seed = 5, .classes = 7};
    ct_loader *l;
    ct_err err = {0};
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_loader_batches_per_epoch(l), 11);
    float want[C * H * W];
    int32_t tgt;
    for (int64_t bi = 0, i = 0; bi < 11; bi++) {
        ct_loader_batch b;
        ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
        ck_assert_int_eq(b.n, bi == 10 ? 3 : 10);
        ck_assert(b.last_of_epoch == (bi == 10));
        for (int64_t j = 0; j < b.n; j++, i++) {
            syn_decode(&ds, i, want, &tgt, &err);
            ck_assert(memcmp((float *)b.input + j * C * H * W, want, sizeof want) == 0);
            ck_assert_int_eq(((int32_t *)b.target)[j], tgt);
        }
    }
    int64_t e, bi;
    ct_loader_position(l, &e, &bi);
    ck_assert(e == 1 && bi == 0);
    ct_loader_free(l);
    /* drop_last with a step of 20 samples: 100 of 103 samples, 10 batches of 10. */
    o.drop_last = true;
    o.step_samples = 20;
    o.shuffle = true;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_loader_batches_per_epoch(l), 10);
    for (int i = 0; i < 20; i++) {
        ct_loader_batch b;
        ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
        ck_assert_int_eq(b.n, 10);
    }
    ct_loader_free(l);
    /* Too few samples for one step. */
    o.step_samples = 200;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_ERR_CONFIG);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_augment_shape) {
    /* Padding only ever shows pad values; with padding 0 and no flip the sample is untouched. */
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = opts(2);
    o.shuffle = false;
    o.aug.hflip = false;
    o.aug.crop_pad = 0;
    size_t n0, n1;
    uint8_t *plain = collect(be, &ds, &o, 0, 0, 2, &n0);
    float want[C * H * W];
    int32_t t;
    ct_err err;
    syn_decode(&ds, 3, want, &t, &err);
    ck_assert(memcmp(plain + 3 * sizeof want, want, sizeof want) == 0);
    o.aug.hflip = true;
    uint8_t *flipped = collect(be, &ds, &o, 0, 0, 2, &n1);
    int same = 0, mirrored = 0;
    for (int i = 0; i < 8; i++) {
        const float *a = (const float *)(plain + i * sizeof want), *b = (const float *)(flipped + i * sizeof want);
        bool eq = true, mir = true;
        for (int k = 0; k < C * H; k++)
            for (int x = 0; x < W; x++) {
                eq &= a[k * W + x] == b[k * W + x];
                mir &= a[k * W + x] == b[k * W + W - 1 - x];
            }
        same += eq;
        mirrored += mir;
        ck_assert(eq || mir);
    }
    ck_assert_msg(same > 0 && mirrored > 0, "flips: %d same, %d mirrored of 8", same, mirrored);
    free(plain);
    free(flipped);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_cache) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = opts(2);
    size_t n0, n1;
    uint8_t *a = collect(be, &ds, &o, 0, 0, 39, &n0);
    int plain = s.decodes;
    o.cache = true;
    s.decodes = 0;
    uint8_t *b = collect(be, &ds, &o, 0, 0, 39, &n1);
    ck_assert(memcmp(a, b, n0) == 0);
    ck_assert_msg(s.decodes <= N + 8 && plain >= 3 * N, "cached: %d decodes, uncached %d", s.decodes, plain);
    free(a);
    free(b);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_errors_and_skip) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    s.bad_record = 17;
    s.bad_label = 40;
    ct_loader_opts o = {.batch = 10, .workers = 2, .seed = 5, .classes = 7};
    ct_loader *l;
    ct_err err = {0};
    ct_loader_batch b;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
    ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "syn.bin: record 17"), "%s", err.msg);
    ct_loader_seek(l, 0, 4);
    ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "syn.bin: record 40: label 99 is outside"), "%s", err.msg);
    ct_loader_free(l);
    o.skip_corrupt = true;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    int64_t total = 0;
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 11; i++) {
            ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
            total += b.n;
        }
    ck_assert_int_eq(total, 2 * (N - 2));
    ck_assert_int_eq(ct_loader_skipped(l), 2);
    ct_loader_free(l);
    ct_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("loader");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_workers_identical);
    tcase_add_test(tc, test_eval_order_and_drop_last);
    tcase_add_test(tc, test_augment_shape);
    tcase_add_test(tc, test_cache);
    tcase_add_test(tc, test_errors_and_skip);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

/* test_hdf5.c: the HDF5 reader (core/data/hdf5.c) on files written by h5py (test/make_hdf5.py):
 * the same random samples in every layout (contiguous, chunked, gzip, shuffle + gzip, fletcher32,
 * chunks tiling every dimension, compact, in a group, chunks never written: the fill value) and
 * element type (uint8, float32, float64, big-endian float64) decode to the same values, also after a
 * user block (h5py's userblock_size), labels
 * (int64, uint8, big-endian int16, uint32) and float targets read whole; every refusal (element
 * type, rank, label count, negative label, missing dataset, a filter ctrain does not decode, not
 * HDF5, truncated) exits CT_ERR_DATA naming the file and the dataset; a damaged gzip chunk fails
 * only its samples; data.transform.on_device's raw pixels match the normalised floats; `ctrain
 * info` lists the datasets; the probe run as an executable ($CTRAIN_HDF5_PROBE) answers as the
 * fork does. Exits 77 (skipped) when h5py is missing. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/hdf5_info.h"
#include "core/data/loader.h"
#include "core/data/transform.h"

enum { N = 20, U8_PER = 30, F32_PER = 24, F64_PER = 7 };

static char tmp[256], file[300];
/* expect.bin, as make_hdf5.py writes it */
static uint8_t want_u8[N][U8_PER];
static float want_f32[N][F32_PER];
static double want_f64[N][F64_PER];
static int64_t want_label[N];
static float want_target[N][2];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/ct_test_hdf5_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 test/make_hdf5.py %s small", tmp);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(file, sizeof file, "%s/layouts.h5", tmp);
    snprintf(cmd, sizeof cmd, "%s/expect.bin", tmp);
    FILE *f = fopen(cmd, "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fread(want_u8, sizeof want_u8, 1, f), 1);
    ck_assert_int_eq(fread(want_f32, sizeof want_f32, 1, f), 1);
    ck_assert_int_eq(fread(want_f64, sizeof want_f64, 1, f), 1);
    ck_assert_int_eq(fread(want_label, sizeof want_label, 1, f), 1);
    ck_assert_int_eq(fread(want_target, sizeof want_target, 1, f), 1);
    fclose(f);
}

static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    ck_assert_int_eq(system(cmd), 0);
}

/* Open {"format": "hdf5", "path": FILE, ...extra} through ct_dataset_open. */
static int open_h5(const char *path, const char *extra, ct_dataset **ds, ct_err *err) {
    char json[1200];
    snprintf(json, sizeof json, "{\"format\": \"hdf5\", \"path\": \"%s\"%s%s}", path, extra[0] ? ", " : "", extra);
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.path, sizeof cfg.path, "test.json");
    cJSON *data = cJSON_CreateObject();
    cJSON_AddItemToObject(data, "train", cJSON_Parse(json));
    cfg.data = data;
    memset(err, 0, sizeof *err);
    int rc = ct_dataset_open(&cfg, "train", ds, err);
    cJSON_Delete(data);
    return rc;
}

/* images = NAME (uint8 samples of want_u8) with labels = LABELS: every sample decodes to the shared
 * 8-bit table's value of its stored pixel, decode_u8 gives the pixels, the label is want_label. */
static void check_u8_in(const char *path, const char *images, const char *labels) {
    char extra[200];
    snprintf(extra, sizeof extra, "\"images\": \"%s\", \"labels\": \"%s\"", images, labels);
    ct_dataset *ds = NULL;
    ct_err err;
    ck_assert_msg(open_h5(path, extra, &ds, &err) == CT_OK, "%s: %s", images, err.msg);
    ck_assert_str_eq(ds->format, "hdf5");
    ck_assert_int_eq(ds->count, N);
    ck_assert_int_eq(ds->sample_shape.ndim, 3); /* [N, H, W]: one channel, as IDX */
    ck_assert_int_eq(ds->sample_shape.d[0], 1);
    ck_assert_int_eq(ds->sample_shape.d[1], 5);
    ck_assert_int_eq(ds->sample_shape.d[2], 6);
    ck_assert_int_eq(ds->target_dtype, CT_I32);
    ck_assert_int_eq(ds->classes, 5);
    ck_assert_msg(strstr(ds->label_note, "sample 7 has label 4, the largest"), "%s", ds->label_note);
    ck_assert_ptr_nonnull(ds->decode_u8);
    float mean = 0, std = 1;
    float *lut = ct_data_u8_lut(1, &mean, &std);
    for (int i = N - 1; i >= 0; i--) { /* backwards: random access, not a stream */
        float x[U8_PER];
        uint8_t px[U8_PER];
        int32_t y = -1, y8 = -1;
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_msg(ds->decode_u8(ds, i, px, &y8, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(y, want_label[i]);
        ck_assert_int_eq(y8, want_label[i]);
        for (int j = 0; j < U8_PER; j++) {
            ck_assert_msg(x[j] == lut[want_u8[i][j]], "%s sample %d value %d", images, i, j);
            ck_assert_int_eq(px[j], want_u8[i][j]);
        }
    }
    free(lut);
    float x[U8_PER];
    ck_assert_int_eq(ds->decode(ds, N, x, NULL, &err), CT_ERR_DATA);
    ct_dataset_close(ds);
}

static void check_u8(const char *images, const char *labels) { check_u8_in(file, images, labels); }

/* Files with a user block (h5py's userblock_size=512: the superblock at byte 512) read as the
 * others, with either superblock version, contiguous and chunked; they were refused as "truncated"
 * (the end-of-file check added the user block to an address that already counts it), and libhdf5
 * before 1.14.4 gives chunk addresses without it. One cut short is still refused. */
START_TEST(test_hdf5_userblock) {
    char path[400], cut[400], cmd[1300], want[600];
    for (int v = 0; v < 2; v++) {
        snprintf(path, sizeof path, "%s/%s", tmp, v ? "userblock_v3.h5" : "userblock.h5");
        ck_assert(ct_hdf5_is_file(path));   /* `ctrain info` takes it for HDF5 */
        check_u8_in(path, "u8_contig", "labels");
        check_u8_in(path, "u8_gzip", "labels");
        snprintf(cut, sizeof cut, "%s/cut%d.h5", tmp, v);
        snprintf(cmd, sizeof cmd, "head -c $(($(stat -c %%s %s) - 1)) %s > %s", path, path, cut);
        ck_assert_int_eq(system(cmd), 0);
        ct_dataset *ds = NULL;
        ct_err err;
        ck_assert_int_eq(open_h5(cut, "\"images\": \"u8_contig\"", &ds, &err), CT_ERR_DATA);
        snprintf(want, sizeof want, "%s: truncated: the HDF5 superblock says the file ends at byte", cut);
        ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    }
}
END_TEST

START_TEST(test_hdf5_layouts) {
    check_u8("u8_contig", "labels");
    check_u8("u8_chunked", "labels");
    check_u8("u8_gzip", "labels_u8");
    check_u8("u8_compact", "labels");
    check_u8("group/x", "labels");
    check_u8("u8_fletcher", "labels_be16");
    check_u8("u8_tiled", "labels_u32");
}
END_TEST

START_TEST(test_hdf5_floats) {
    const char *const names[] = {"f32_contig", "f32_gzip"};
    ct_dataset *ds = NULL;
    ct_err err;
    for (int k = 0; k < 2; k++) {
        char extra[200];
        snprintf(extra, sizeof extra, "\"images\": \"%s\", \"labels\": \"targets\"", names[k]);
        ck_assert_msg(open_h5(file, extra, &ds, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ds->sample_shape.ndim, 3);
        ck_assert_int_eq(ds->sample_shape.d[0], 2);
        ck_assert_int_eq(ds->sample_shape.d[2], 4);
        ck_assert_ptr_null(ds->decode_u8);
        ck_assert_int_eq(ds->target_dtype, CT_F32);
        ck_assert_int_eq(ds->target_shape.ndim, 1);
        ck_assert_int_eq(ds->target_shape.d[0], 2);
        ck_assert_int_eq(ds->classes, 0);
        ck_assert_msg(strstr(ds->label_note, "dataset \"targets\" holds float32 targets"), "%s", ds->label_note);
        for (int i = 0; i < N; i++) {
            float x[F32_PER], t[2];
            ck_assert_msg(ds->decode(ds, i, x, t, &err) == CT_OK, "%s", err.msg);
            ck_assert(memcmp(x, want_f32[i], sizeof x) == 0); /* no normalisation: the stored values */
            ck_assert(memcmp(t, want_target[i], sizeof t) == 0);
        }
        ct_dataset_close(ds);
    }
    const char *const f64[] = {"\"images\": \"f64_flat\", \"limit\": 6", "\"images\": \"f64_be\", \"limit\": 6"};
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(open_h5(file, f64[k], &ds, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ds->count, 6);
        ck_assert_int_eq(ds->sample_shape.ndim, 1);
        ck_assert_int_eq(ds->sample_shape.d[0], F64_PER);
        for (int i = 0; i < 6; i++) {
            float x[F64_PER];
            int32_t y;
            ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
            for (int j = 0; j < F64_PER; j++) ck_assert_msg(x[j] == (float)want_f64[i][j], "%s sample %d", f64[k], i);
            ck_assert_int_eq(y, want_label[i]);
        }
        ct_dataset_close(ds);
    }
}
END_TEST

/* Opening with `extra` fails with `code`, the message holding `has`. */
static void refused(const char *path, const char *extra, int code, const char *has) {
    ct_dataset *ds = NULL;
    ct_err err;
    int rc = open_h5(path, extra, &ds, &err);
    ck_assert_msg(rc == code && ds == NULL, "%s: rc %d: %s", extra, rc, err.msg);
    ck_assert_msg(strstr(err.msg, has), "%s: expected \"%s\" in: %s", extra, has, err.msg);
}

START_TEST(test_hdf5_errors) {
    char want[600];
    snprintf(want, sizeof want, "%s: dataset \"u8_be16\" (images) holds int16 big-endian elements: expected uint8", file);
    refused(file, "\"images\": \"u8_be16\"", CT_ERR_DATA, want);
    refused(file, "\"images\": \"vector\"", CT_ERR_DATA, "dataset \"vector\" (images) has shape [20]: expected [N, ...]");
    refused(file, "\"images\": \"u8_contig\", \"labels\": \"labels_2d\"", CT_ERR_DATA,
            "dataset \"labels_2d\" (labels) is int64 with shape [20, 2]: expected [N] integers");
    refused(file, "\"images\": \"u8_contig\", \"labels\": \"labels_short\"", CT_ERR_DATA,
            "dataset \"labels_short\" (labels) has 19 samples, dataset \"u8_contig\" (images) 20");
    refused(file, "\"images\": \"u8_contig\", \"labels\": \"labels_neg\"", CT_ERR_DATA,
            "dataset \"labels_neg\" (labels): sample 3 has label -1, not a class index");
    snprintf(want, sizeof want, "%s: no dataset \"images\" (images) in the file; its root group has: f32_contig, "
             "f32_gzip, f64_be, f64_flat, group, labels", file);
    refused(file, "", CT_ERR_DATA, want);
    refused(file, "\"images\": \"group\"", CT_ERR_DATA, "\"group\" (images) is not a dataset");
    refused(file, "\"images\": \"unwritten\"", CT_ERR_DATA,
            "dataset \"unwritten\" (images) declares 409600000 bytes but the file stores 0 for it");
    refused(file, "\"images\": \"group/nope\"", CT_ERR_DATA, "no dataset \"group/nope\" (images)");
    refused(file, "\"images\": \"u8_lzf\"", CT_ERR_DATA,
            "dataset \"u8_lzf\" (images) is stored with the lzf (filter 32000) filter, which ctrain does not decode");
    refused(file, "\"images\": \"u8_lzf\"", CT_ERR_DATA, "h5repack -f NONE");
    refused(file, "\"images\": 3", CT_ERR_CONFIG, "data.train.images: expected the name of a dataset");
    refused(file, "\"limit\": 0", CT_ERR_CONFIG, "data.train.limit: expected a positive integer");
    char other[400];
    snprintf(other, sizeof other, "%s/expect.bin", tmp);
    snprintf(want, sizeof want, "%s: not an HDF5 file", other);
    refused(other, "", CT_ERR_DATA, want);
    snprintf(other, sizeof other, "%s/none.h5", tmp);
    snprintf(want, sizeof want, "%s: cannot open: No such file", other);
    refused(other, "", CT_ERR_DATA, want);
    /* Cut short: the superblock's end-of-file address is past the end. */
    char cmd[900];
    snprintf(other, sizeof other, "%s/cut.h5", tmp);
    snprintf(cmd, sizeof cmd, "head -c 20000 %s > %s", file, other);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(want, sizeof want, "%s: truncated: the HDF5 superblock says the file ends at byte", other);
    refused(other, "\"images\": \"u8_contig\"", CT_ERR_DATA, want);
}
END_TEST

/* A chunk whose compressed bytes are damaged: open succeeds (the labels and shapes are fine), the
 * samples in it fail at decode naming the file, dataset and sample; the others still decode. */
START_TEST(test_hdf5_corrupt_chunk) {
    char cmd[900];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c \"import h5py,sys; f=h5py.File(sys.argv[1],'r'); "
             "d=f['u8_gzip']; print(d.id.get_chunk_info(1).byte_offset, d.id.get_chunk_info(1).size)\" %s > %s/chunk.txt",
             file, tmp);
    if (system(cmd) != 0) return; /* h5py without chunk queries (HDF5 < 1.10.5): nothing to aim at */
    snprintf(cmd, sizeof cmd, "%s/chunk.txt", tmp);
    FILE *f = fopen(cmd, "r");
    long long off = 0, size = 0;
    ck_assert_int_eq(fscanf(f, "%lld %lld", &off, &size), 2);
    fclose(f);
    f = fopen(file, "r+b");
    ck_assert_int_eq(fseek(f, (long)(off + size / 2), SEEK_SET), 0);
    for (int k = 0; k < 8; k++) fputc(0xA5 ^ k, f);
    fclose(f);
    ct_dataset *ds = NULL;
    ct_err err;
    ck_assert_msg(open_h5(file, "\"images\": \"u8_gzip\"", &ds, &err) == CT_OK, "%s", err.msg);
    float x[U8_PER];
    int32_t y;
    ck_assert_int_eq(ds->decode(ds, 5, x, &y, &err), CT_ERR_DATA); /* chunk 1: samples 4..7 */
    char want[600];
    snprintf(want, sizeof want, "%s: dataset \"u8_gzip\" (images): sample 5: chunk 1 (", file);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    ck_assert_msg(ds->decode(ds, 0, x, &y, &err) == CT_OK, "%s", err.msg);
    ck_assert_msg(ds->decode(ds, 12, x, &y, &err) == CT_OK, "%s", err.msg);
    ct_dataset_close(ds);
}
END_TEST

/* Chunks never written read as the dataset's fill value (7); the written ones as stored. */
START_TEST(test_hdf5_fill_value) {
    ct_dataset *ds = NULL;
    ct_err err;
    ck_assert_msg(open_h5(file, "\"images\": \"u8_fill\"", &ds, &err) == CT_OK, "%s", err.msg);
    for (int i = 0; i < N; i++) {
        uint8_t px[U8_PER];
        int32_t y;
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        for (int j = 0; j < U8_PER; j++) ck_assert_int_eq(px[j], i < 12 ? want_u8[i][j] : 7);
    }
    ct_dataset_close(ds);
}
END_TEST

/* The probe as an executable ($CTRAIN_HDF5_PROBE, what the fuzz target runs) gives what the fork
 * gives: the same samples, the same refusal, the same listing; a probe that cannot start is a
 * runtime error naming it. Skipped where the probe was not built beside the test (a bundle). */
START_TEST(test_hdf5_probe_executable) {
    if (access("build/test/hdf5_probe", X_OK) != 0) return;
    setenv("CTRAIN_HDF5_PROBE", "build/test/hdf5_probe", 1);
    check_u8("u8_gzip", "labels_u8");
    check_u8("u8_compact", "labels");
    refused(file, "\"images\": \"u8_be16\"", CT_ERR_DATA, "holds int16 big-endian elements");
    char other[400];
    snprintf(other, sizeof other, "%s/info.txt", tmp);
    FILE *f = fopen(other, "w");
    ct_err err = {0};
    ck_assert_msg(ct_hdf5_info(file, f, &err) == CT_OK, "%s", err.msg);
    ck_assert(ftell(f) > 100);
    fclose(f);
    setenv("CTRAIN_HDF5_PROBE", "/nonexistent/hdf5_probe", 1);
    refused(file, "\"images\": \"u8_gzip\"", CT_ERR_RUNTIME, "cannot start the HDF5 probe /nonexistent/hdf5_probe");
    unsetenv("CTRAIN_HDF5_PROBE");
}
END_TEST

/* data.transform.on_device with normalize: decode_u8's pixels, through the shared 8-bit table,
 * are decode's floats bit for bit, and the loader accepts the format (chunked, read in blocks). */
START_TEST(test_hdf5_on_device) {
    char json[600];
    snprintf(json, sizeof json, "{\"train\": {\"format\": \"hdf5\", \"path\": \"%s\", \"images\": \"u8_chunked\"}, "
             "\"transform\": {\"on_device\": true, \"normalize\": {\"mean\": [0.45], \"std\": [0.27]}}}", file);
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.path, sizeof cfg.path, "test.json");
    cJSON *data = cJSON_Parse(json);
    cfg.data = data;
    cfg.micro_batch = cfg.train_batch_size = 4;
    ct_dataset *ds = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_dataset_open(&cfg, "train", &ds, &err) == CT_OK, "%s", err.msg);
    const float mean = 0.45f, std = 0.27f;
    float *lut = ct_data_u8_lut(1, &mean, &std);
    for (int i = 0; i < N; i++) {
        float x[U8_PER];
        uint8_t px[U8_PER];
        int32_t y;
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        for (int j = 0; j < U8_PER; j++) {
            ck_assert_int_eq(px[j], want_u8[i][j]);
            ck_assert(x[j] == lut[px[j]]);
        }
    }
    free(lut);
    ct_loader_opts o;
    ck_assert_msg(ct_loader_opts_from_config(&cfg, ds, true, 5, &o, &err) == CT_OK, "%s", err.msg);
    ck_assert(o.on_device && o.mean[0] == mean && o.std[0] == std);
    ct_dataset_close(ds);
    cJSON_Delete(data);
}
END_TEST

START_TEST(test_hdf5_info) {
    ck_assert(ct_hdf5_is_file(file));
    char other[400];
    snprintf(other, sizeof other, "%s/expect.bin", tmp);
    ck_assert(!ct_hdf5_is_file(other));
    snprintf(other, sizeof other, "%s/info.txt", tmp);
    FILE *f = fopen(other, "w");
    ct_err err = {0};
    ck_assert_msg(ct_hdf5_info(file, f, &err) == CT_OK, "%s", err.msg);
    fclose(f);
    size_t n = 0;
    char text[4096] = "";
    f = fopen(other, "r");
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    ck_assert_msg(strstr(text, "u8_gzip: uint8 [20, 5, 6], chunked [4, 5, 6], filters: deflate"), "%s", text);
    ck_assert_msg(strstr(text, "f32_gzip: float32 [20, 2, 3, 4], chunked [5, 2, 3, 4], filters: shuffle, deflate"), "%s", text);
    ck_assert_msg(strstr(text, "labels: int64 [20], contiguous"), "%s", text);
    ck_assert_msg(strstr(text, "group: not a dataset"), "%s", text);
}
END_TEST

int main(void) {
    if (system("/usr/bin/python3 -c 'import h5py' 2>/dev/null") != 0) {
        printf("h5py is missing (apt-get install python3-h5py): skipped\n");
        return 77;
    }
    Suite *s = suite_create("hdf5");
    TCase *tc = tcase_create("hdf5");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hdf5_layouts);
    tcase_add_test(tc, test_hdf5_userblock);
    tcase_add_test(tc, test_hdf5_floats);
    tcase_add_test(tc, test_hdf5_errors);
    tcase_add_test(tc, test_hdf5_corrupt_chunk);
    tcase_add_test(tc, test_hdf5_fill_value);
    tcase_add_test(tc, test_hdf5_probe_executable);
    tcase_add_test(tc, test_hdf5_on_device);
    tcase_add_test(tc, test_hdf5_info);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

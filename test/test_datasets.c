/* test_datasets.c: image_folder, shard (via ctrain pack, plain and compressed), tokens and csv
 * on small random files in a temp directory; every corruption case (truncated, bad checksum,
 * wrong magic, label out of range, corrupt PNG, wrong size) with the file/record in the message;
 * skip_corrupt counting through the loader; data.transform.on_device (decode_u8 of each image
 * format, errors for the others). */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/config/config.h"
#include "core/cpu/cpu.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/loader.h"
#include "core/data/order.h"
#include "cmd/commands.h"
#include "core/data/shard.h"
#include "core/data/tokens.h"
#include "core/data/tfrecord.h"
#include "core/data/webdataset.h"
#include "core/util/fs.h"
#include "core/util/tfrecord.h"
#include "core/train/internal.h"
#include "core/train/train.h"

static char tmp[256];

static void setup(void) {
    snprintf(tmp, sizeof tmp, "/tmp/ct_test_datasets_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    ck_assert_int_eq(system(cmd), 0);
}

static ct_config empty_cfg(void) {
    ct_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.path, sizeof c.path, "test.json");
    return c;
}

/* Open `json` (a dataset entry) with the format's opener through ct_dataset_open. */
static int open_entry(const char *json, ct_dataset **ds, ct_err *err) {
    ct_config cfg = empty_cfg();
    cJSON *data = cJSON_CreateObject();
    cJSON_AddItemToObject(data, "train", cJSON_Parse(json));
    cfg.data = data;
    int rc = ct_dataset_open(&cfg, "train", ds, err);
    cJSON_Delete(data);
    return rc;
}

static void write_png(const char *path, int h, int w, int c, const uint8_t *px) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    ck_assert(png_image_write_to_file(&im, path, 0, px, 0, NULL));
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*n + 1);
    ck_assert_uint_eq(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

enum { IH = 6, IW = 8, PER_CLASS = 5 };

/* root/{cat,ant,bee}/NN.png, 6x8 gray; pixels[class][k] kept for comparison. */
static uint8_t pixels[3][PER_CLASS][IH * IW];
static const char *const class_names[3] = {"cat", "ant", "bee"}; /* sorted: ant=0, bee=1, cat=2 */

static void make_folder(const char *root) {
    char p[512];
    mkdir(root, 0777);
    srand(42);
    for (int c = 0; c < 3; c++) {
        snprintf(p, sizeof p, "%s/%s", root, class_names[c]);
        mkdir(p, 0777);
        for (int k = 0; k < PER_CLASS; k++) {
            for (int j = 0; j < IH * IW; j++) pixels[c][k][j] = (uint8_t)(rand() & 255);
            snprintf(p, sizeof p, "%s/%s/%02d.png", root, class_names[c], k);
            write_png(p, IH, IW, 1, pixels[c][k]);
        }
        snprintf(p, sizeof p, "%s/%s/notes.txt", root, class_names[c]);
        write_bytes(p, "ignored", 7);
    }
}

static int sorted_class(int c) { return c == 1 ? 0 : c == 2 ? 1 : 2; }

START_TEST(test_image_folder) {
    char root[300], json[600];
    snprintf(root, sizeof root, "%s/img", tmp);
    make_folder(root);
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 15);
    ck_assert_int_eq(ds->classes, 3);
    ck_assert(ds->sample_shape.ndim == 3 && ds->sample_shape.d[0] == 1 && ds->sample_shape.d[1] == IH &&
              ds->sample_shape.d[2] == IW);
    float x[IH * IW];
    int32_t y;
    for (int i = 0; i < 15; i++) {
        ck_assert_int_eq(ds->decode(ds, i, x, &y, &err), CT_OK);
        int c = i / PER_CLASS, k = i % PER_CLASS, orig = c == 0 ? 1 : c == 1 ? 2 : 0;
        ck_assert_int_eq(y, c);
        ck_assert_int_eq(sorted_class(orig), c);
        for (int j = 0; j < IH * IW; j++) ck_assert_float_eq_tol(x[j], pixels[orig][k][j] / 255.0f, 1e-6);
    }
    ct_dataset_close(ds);
    /* limit spreads over the classes: 5 of 15 files are 0, 3, 6, 9, 12. */
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\", \"limit\": 5}", root);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(ds->decode(ds, i, x, &y, &err), CT_OK);
        ck_assert_int_eq(y, 3 * i / PER_CLASS);
    }
    ct_dataset_close(ds);

    /* 3 channels from gray; crop to 4x4 (center); bilinear to 3x4 (exact 2x2 averages). */
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\", \"size\": [4, 4], "
             "\"channels\": 3, \"resize\": \"crop\"}", root);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    float x3[3 * 16];
    ck_assert_int_eq(ds->decode(ds, 0, x3, &y, &err), CT_OK);
    for (int ch = 0; ch < 3; ch++)
        for (int r = 0; r < 4; r++)
            for (int cc = 0; cc < 4; cc++)
                ck_assert_float_eq_tol(x3[ch * 16 + r * 4 + cc], pixels[1][0][(r + 1) * IW + cc + 2] / 255.0f, 1e-6);
    ct_dataset_close(ds);
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\", \"size\": [3, 4], "
             "\"resize\": \"bilinear\"}", root);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_OK);
    const uint8_t *s = pixels[1][0];
    for (int r = 0; r < 3; r++)
        for (int cc = 0; cc < 4; cc++) {
            float avg = (s[2 * r * IW + 2 * cc] + s[2 * r * IW + 2 * cc + 1] + s[(2 * r + 1) * IW + 2 * cc] +
                         s[(2 * r + 1) * IW + 2 * cc + 1]) / 4.0f / 255.0f;
            ck_assert_float_eq_tol(x[r * 4 + cc], avg, 1e-5);
        }
    ct_dataset_close(ds);
}
END_TEST

START_TEST(test_image_folder_errors) {
    char root[300], json[600], p[600];
    snprintf(root, sizeof root, "%s/img", tmp);
    make_folder(root);
    ct_dataset *ds;
    ct_err err = {0};
    float x[IH * IW];
    int32_t y;
    /* Wrong size without resizing: names the file. */
    uint8_t small[4 * 4] = {1, 2, 3};
    snprintf(p, sizeof p, "%s/bee/02.png", root);
    write_png(p, 4, 4, 1, small);
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 7, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "bee/02.png: image is 4x4 (HxW), expected 6x8"), "%s", err.msg);
    /* Corrupt PNG: truncated file. */
    snprintf(p, sizeof p, "%s/cat/03.png", root);
    size_t n;
    uint8_t *b = read_all(p, &n);
    write_bytes(p, b, n - 20);
    free(b);
    ck_assert_int_eq(ds->decode(ds, 13, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "cat/03.png: corrupt PNG"), "%s", err.msg);
    /* A file that vanished after the scan. */
    snprintf(p, sizeof p, "%s/ant/00.png", root);
    unlink(p);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "ant/00.png: cannot open"), "%s", err.msg);
    /* skip_corrupt through the loader: the three bad files are skipped and counted. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_loader_opts o = {.batch = 4, .workers = 2, .skip_corrupt = true, .classes = 3};
    ct_loader *l;
    ck_assert_int_eq(ct_loader_init(&l, be, ds, &o, NULL, &err), CT_OK);
    int64_t got = 0;
    for (int i = 0; i < 4; i++) {
        ct_loader_batch bt;
        ck_assert_int_eq(ct_loader_next(l, &bt, &err), CT_OK);
        got += bt.n;
    }
    ck_assert_int_eq(got, 12);
    ck_assert_int_eq(ct_loader_skipped(l), 3);
    ct_loader_free(l);
    ct_backend_destroy(be);
    ct_dataset_close(ds);
    /* Missing root. */
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s/nope\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "/nope: cannot read directory"), "%s", err.msg);
}
END_TEST

/* root/<name>/NN.png for each name of `names` (space-separated), `per_class` random 6x8 gray
 * images each. */
static void make_classes(const char *root, const char *names, int per_class) {
    char p[600], list[200];
    snprintf(list, sizeof list, "%s", names);
    mkdir(root, 0777);
    uint8_t px[IH * IW];
    for (char *save, *n = strtok_r(list, " ", &save); n; n = strtok_r(NULL, " ", &save)) {
        snprintf(p, sizeof p, "%s/%s", root, n);
        mkdir(p, 0777);
        for (int k = 0; k < per_class; k++) {
            for (int j = 0; j < IH * IW; j++) px[j] = (uint8_t)(rand() & 255);
            snprintf(p, sizeof p, "%s/%s/%02d.png", root, n, k);
            write_png(p, IH, IW, 1, px);
        }
    }
}

/* A config training a linear model (`input`, 3 classes) on data = `data_json` (the members of
 * "data"); loaded from a file in tmp. */
static ct_config *run_config(const char *input, const char *data_json) {
    char path[400], text[3000];
    snprintf(path, sizeof path, "%s/run.json", tmp);
    snprintf(text, sizeof text,
             "{\"train_batch_size\": 4, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.01}},\n"
             " \"model\": {\"input\": %s, \"layers\": [{\"type\": \"flatten\", \"name\": \"f\"}, "
             "{\"type\": \"linear\", \"name\": \"fc\", \"out\": 3}], \"loss\": {\"type\": \"cross_entropy\"}},\n"
             " \"data\": {%s},\n"
             " \"train\": {\"epochs\": 1, \"seed\": 7, \"device\": \"cpu\", \"run_dir\": \"%s/run\"}}\n",
             input, data_json, tmp);
    write_bytes(path, text, strlen(text));
    ct_config_opts co = {.path = path, .world_size = 1};
    co.formats = ct_dataset_formats(&co.n_formats);
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err err = {0};
    ck_assert_msg(ct_config_load(&co, &cfg, &w, &err) == CT_OK, "%s", err.msg);
    ct_warnings_free(&w);
    return cfg;
}

/* run_config for image_folder `train` and `eval` of 6x8 gray images (eval NULL: none). */
static ct_config *folder_run_config(const char *train, const char *eval) {
    char data[1000], input[40];
    int n = snprintf(data, sizeof data, "\"train\": {\"format\": \"image_folder\", \"root\": \"%s\"}", train);
    if (eval)
        snprintf(data + n, sizeof data - (size_t)n, ", \"eval\": {\"format\": \"image_folder\", \"root\": \"%s\"}",
                 eval);
    snprintf(input, sizeof input, "[1, %d, %d]", IH, IW);
    return run_config(input, data);
}

/* Open a trainer on cfg expecting failure `code`; returns its message in err. */
static void open_fails(ct_config *cfg, int code, ct_err *err) {
    ct_run_opts ro = {.quiet = true};
    ct_summary sum;
    ct_trainer *t = NULL;
    int rc = ct_trainer_open(cfg, &ro, &sum, &t, err);
    ck_assert_msg(rc == code, "rc %d, want %d: %s", rc, code, err->msg);
    ct_trainer_close(t);
    ct_config_free(cfg);
}

/* Eval classes are matched to the train classes by name: train {ant, bee, cat} and eval
 * {ant, cat} give eval's cat images label 2 (cat's train index), not 1 (its position among the
 * eval folders); an eval class the train set lacks is a data error naming the folder. */
START_TEST(test_eval_classes_by_name) {
    char train[300], eval[300], odd[300];
    snprintf(train, sizeof train, "%s/train", tmp);
    snprintf(eval, sizeof eval, "%s/eval", tmp);
    snprintf(odd, sizeof odd, "%s/odd", tmp);
    make_classes(train, "cat ant bee", 3);
    make_classes(eval, "cat ant", 2);
    make_classes(odd, "ant dog", 2);
    ct_config *cfg = folder_run_config(train, eval);
    ct_run_opts ro = {.quiet = true};
    ct_summary sum;
    ct_trainer *t = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_trainer_open(cfg, &ro, &sum, &t, &err) == CT_OK, "%s", err.msg);
    const ct_dataset *ev = t->d.eval_ds;
    ck_assert_int_eq(ev->count, 4);
    ck_assert_int_eq(ev->classes, 3);
    float x[IH * IW];
    const int32_t want[4] = {0, 0, 2, 2}; /* ant, ant, cat, cat */
    for (int i = 0; i < 4; i++) {
        int32_t y = -1;
        ck_assert_int_eq(ev->decode(ev, i, x, &y, &err), CT_OK);
        ck_assert_msg(y == want[i], "eval record %d: label %d, want %d", i, y, want[i]);
    }
    ct_trainer_close(t);
    ct_config_free(cfg);
    open_fails(folder_run_config(train, odd), CT_ERR_DATA, &err);
    ck_assert_msg(strstr(err.msg, odd) && strstr(err.msg, "\"dog\"") && strstr(err.msg, train),
                  "%s", err.msg);
}
END_TEST

/* Labels that do not fit the model are reported where they are: an empty class folder as such
 * (not as "labels go up to 3" when no image has label 3), an IDX label too large with the labels
 * file and its record in the message's first line (not the images file alone). */
START_TEST(test_labels_named_where_they_are) {
    char root[300], p[400], ip[300], lp[300], data[900];
    ct_err err = {0};
    ct_dataset *ds;
    snprintf(root, sizeof root, "%s/four", tmp);
    make_classes(root, "a b c", 2);
    snprintf(p, sizeof p, "%s/d", root);
    mkdir(p, 0777);
    snprintf(p, sizeof p, "%s/d/readme.txt", root); /* not an image: the folder has none */
    write_bytes(p, "x", 1);
    snprintf(data, sizeof data, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ck_assert_int_eq(open_entry(data, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "/four/d: class directory holds no .png files"), "%s", err.msg);

    /* 7 IDX images 6x8 with labels < 3 except record 5 (label 4): the model has 3 classes. */
    uint8_t img[16 + 7 * IH * IW] = {0, 0, 8, 3, 0, 0, 0, 7, 0, 0, 0, IH, 0, 0, 0, IW};
    uint8_t lab[8 + 7] = {0, 0, 8, 1, 0, 0, 0, 7};
    for (int i = 16; i < (int)sizeof img; i++) img[i] = (uint8_t)(rand() & 255);
    for (int i = 0; i < 7; i++) lab[8 + i] = (uint8_t)(i == 5 ? 4 : rand() % 3);
    snprintf(ip, sizeof ip, "%s/imgs-idx3-ubyte", tmp);
    snprintf(lp, sizeof lp, "%s/labs-idx1-ubyte", tmp);
    write_bytes(ip, img, sizeof img);
    write_bytes(lp, lab, sizeof lab);
    snprintf(data, sizeof data, "\"train\": {\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", ip,
             lp);
    char input[40];
    snprintf(input, sizeof input, "[1, %d, %d]", IH, IW);
    open_fails(run_config(input, data), CT_ERR_DATA, &err);
    /* in the first line, which the summary's "error" holds (it named the images file alone there) */
    char first[CT_ERR_MSG];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(err.msg, "\n"), err.msg);
    ck_assert_msg(strstr(first, "labs-idx1-ubyte: record 5 has label 4") && strstr(first, "the model has 3 classes"),
                  "%s", err.msg);
}
END_TEST

/* skip_corrupt says what it skipped: a warning naming the file, and skipped_records in the
 * summary line. 8 images (2 steps of 4), one of them truncated. */
START_TEST(test_skip_corrupt_reported) {
    char root[300], p[400], data[700], log[300];
    snprintf(root, sizeof root, "%s/skip", tmp);
    make_classes(root, "a b", 4);
    snprintf(p, sizeof p, "%s/b/01.png", root);
    size_t n;
    uint8_t *b = read_all(p, &n);
    write_bytes(p, b, n / 2);
    free(b);
    snprintf(data, sizeof data, "\"train\": {\"format\": \"image_folder\", \"root\": \"%s\"}, "
             "\"skip_corrupt\": true", root);
    char input[40];
    snprintf(input, sizeof input, "[1, %d, %d]", IH, IW);
    ct_config *cfg = run_config(input, data);
    /* stderr to a file while the run prints its warnings */
    snprintf(log, sizeof log, "%s/stderr.txt", tmp);
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(log, "w");
    ck_assert_ptr_nonnull(f);
    dup2(fileno(f), 2);
    ct_run_opts ro = {.quiet = true};
    ct_summary sum;
    ct_err err = {0};
    int rc = ct_train_run(cfg, &ro, &sum, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    ck_assert_msg(rc == CT_OK, "%s", err.msg);
    uint8_t *text = read_all(log, &n);
    text[n] = 0;
    ck_assert_msg(strstr((char *)text, "ctrain: warning: ") && strstr((char *)text, "skip/b/01.png: corrupt PNG"),
                  "stderr: %s", text);
    free(text);
    char *json = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&json, &len);
    ct_summary_write(&sum, m);
    fclose(m);
    ck_assert_msg(strstr(json, "\"skipped_records\":1,"), "%s", json);
    free(json);
    ct_config_free(cfg);
}
END_TEST

/* pack --from idx takes the labels from --labels, or from the images' name with MNIST's
 * "images-idx3" -> "labels-idx1"; it refuses to guess otherwise, a derived file that is not
 * there, and a labels file that is the images file (it used to read the images as labels). */
START_TEST(test_pack_idx_labels) {
    uint8_t img[16 + 3 * 20] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 4};
    uint8_t lab[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 1};
    for (int i = 16; i < (int)sizeof img; i++) img[i] = (uint8_t)(rand() & 255);
    char ip[300], mp[300], out[300], same[300];
    snprintf(ip, sizeof ip, "%s/pixels.idx", tmp);
    snprintf(mp, sizeof mp, "%s/t10k-images-idx3-ubyte", tmp);
    snprintf(out, sizeof out, "%s/packed", tmp);
    snprintf(same, sizeof same, "%s/./pixels.idx", tmp);
    write_bytes(ip, img, sizeof img);
    write_bytes(mp, img, sizeof img);
    ct_err err = {0};
    char *no_labels[] = {"pack", "--from", "idx", ip, "--out", out};
    ck_assert_int_eq(ct_pack_main(6, no_labels, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "pixels.idx") && strstr(err.msg, "--labels"), "%s", err.msg);
    char *missing[] = {"pack", "--from", "idx", mp, "--out", out};
    ck_assert_int_eq(ct_pack_main(6, missing, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "t10k-labels-idx1-ubyte") && strstr(err.msg, "--labels"), "%s", err.msg);
    char *itself[] = {"pack", "--from", "idx", ip, "--labels", same, "--out", out};
    ck_assert_int_eq(ct_pack_main(8, itself, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "is the images file"), "%s", err.msg);
    /* the derived name, once it exists */
    char lp[300];
    snprintf(lp, sizeof lp, "%s/t10k-labels-idx1-ubyte", tmp);
    write_bytes(lp, lab, sizeof lab);
    ck_assert_msg(ct_pack_main(6, missing, &err) == CT_OK, "%s", err.msg);
}
END_TEST

/* bench-data refuses worker counts and batch counts outside their ranges, naming the option. */
START_TEST(test_bench_data_args) {
    const char *bad[][2] = {{"--workers", "-1"}, {"--workers", "5000"}, {"--workers", "2x"},
                            {"--batches", "99999999999999999999"}, {"--batches", "0"}, {"--batches", "-3"}};
    for (int i = 0; i < CT_ARRAY_LEN(bad); i++) {
        char *argv[] = {"bench-data", "--config", "/nonexistent.json", (char *)bad[i][0], (char *)bad[i][1]};
        ct_err err = {0};
        int rc = ct_bench_data_main(5, argv, &err);
        ck_assert_msg(rc == CT_ERR_CONFIG, "%s %s: rc %d: %s", bad[i][0], bad[i][1], rc, err.msg);
        ck_assert_msg(strstr(err.msg, bad[i][0]) && strstr(err.msg, bad[i][1]), "%s", err.msg);
    }
}
END_TEST

/* info on something that is neither a regular file nor a directory (a FIFO would block the
 * open forever) is refused before it is opened. */
START_TEST(test_info_refuses_fifo) {
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/pipe", tmp);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    alarm(5); /* the unfixed command blocks in open() */
    char *argv[] = {"info", fifo};
    ct_err err = {0};
    ck_assert_int_eq(ct_info_main(2, argv, &err), CT_ERR_CONFIG);
    alarm(0);
    ck_assert_msg(strstr(err.msg, fifo) && strstr(err.msg, "not a regular file or directory"), "%s", err.msg);
}
END_TEST

/* A FIFO as a data file of any format is refused by name at open, at once (it used to block in
 * open() until a writer came: alarm() turns that into a failure instead of a hung suite). */
START_TEST(test_data_fifo_refused) {
    char fifo[300], json[700];
    snprintf(fifo, sizeof fifo, "%s/pipe", tmp);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    static const char *const entries[] = {
        "{\"format\": \"csv\", \"path\": \"%s\"}", "{\"format\": \"tfrecord\", \"path\": \"%s\"}",
        "{\"format\": \"webdataset\", \"urls\": \"%s\"}", "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 4}",
        "{\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", "{\"format\": \"shard\", \"path\": \"%s\"}"};
    for (int i = 0; i < CT_ARRAY_LEN(entries); i++) {
        snprintf(json, sizeof json, entries[i], fifo, fifo);
        ct_dataset *ds = NULL;
        ct_err err = {0};
        alarm(5);
        ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
        alarm(0);
        ck_assert_msg(strstr(err.msg, fifo) && strstr(err.msg, "a FIFO, not a regular file"), "%s: %s", json, err.msg);
    }
}
END_TEST

/* Names from data files reach a terminal escaped: control bytes (C0, DEL, C1) and invalid UTF-8 as
 * \xNN, valid UTF-8 kept; a name's newline escaped, a message's kept; a cut at a whole escape. */
START_TEST(test_printable) {
    char out[64];
    const char name[] = "a\x1b[31mb\n\t\x7f\xc2\x9b\xff\xc3\xa9\xe2\x82\xac";
    ck_assert_str_eq(ct_printable(out, sizeof out, name, sizeof name - 1, CT_PRINT_NAME),
                     "a\\x1b[31mb\\x0a\\x09\\x7f\\xc2\\x9b\\xff\xc3\xa9\xe2\x82\xac");
    ck_assert_str_eq(ct_printable(out, sizeof out, "x\ny\tz\x07", 6, CT_PRINT_LINES), "x\ny\tz\\x07");
    ck_assert_str_eq(ct_printable(out, sizeof out, "nul\0in", 6, CT_PRINT_NAME), "nul\\x00in");
    ck_assert_str_eq(ct_printable(out, sizeof out, "\xc0\xaf\xed\xa0\x80", 5, CT_PRINT_NAME),   /* overlong, surrogate */
                     "\\xc0\\xaf\\xed\\xa0\\x80");
    ck_assert_str_eq(ct_printable(out, 10, "\x1b\x1b\x1b", 3, CT_PRINT_NAME), "\\x1b...");   /* 9 bytes of room */
    ck_assert_str_eq(ct_printable(out, 13, "\x1b\x1b\x1b", 3, CT_PRINT_NAME), "\\x1b\\x1b\\x1b");
    ck_assert_str_eq(ct_printable(out, 6, "abcdefgh", 8, CT_PRINT_NAME), "ab...");
    ck_assert_str_eq(ct_printable(out, 9, "abcdefgh", 8, CT_PRINT_NAME), "abcdefgh");
}
END_TEST

/* The value of `key=` in a fingerprint ("" when absent). */
static const char *fp_field(const char *fp, const char *key, char *out, size_t n) {
    char k[32];
    snprintf(k, sizeof k, "%s=", key);
    const char *p = strstr(fp, k);
    snprintf(out, n, "%.*s", p ? (int)strcspn(p + strlen(k), " ") : 0, p ? p + strlen(k) : "");
    return out;
}

/* Fingerprint of the dataset entry `json`, opened afresh. */
static void fingerprint_of(const char *json, char *fp) {
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_msg(ct_dataset_fingerprint(ds, fp, &err) == CT_OK, "%s", err.msg);
    ct_dataset_close(ds);
}

static void set_mtime(const char *path, time_t sec) {
    struct timespec ts[2] = {{sec, 0}, {sec, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* ct_dataset_fingerprint tells a replaced file from the same files: same files (reopened, moved
 * elsewhere) give the same string; other labels of the same size change `content`; a file only
 * touched changes `mtime` alone; in a folder of 75 images, one image rewritten or removed shows. */
START_TEST(test_fingerprint) {
    char ip[300], lp[300], json[900], a[CT_DATASET_FINGERPRINT], b[CT_DATASET_FINGERPRINT], x[40], y[40];
    uint8_t img[16 + 9 * IH * IW] = {0, 0, 8, 3, 0, 0, 0, 9, 0, 0, 0, IH, 0, 0, 0, IW};
    uint8_t lab[8 + 9] = {0, 0, 8, 1, 0, 0, 0, 9};
    for (int i = 16; i < (int)sizeof img; i++) img[i] = (uint8_t)(rand() & 255);
    for (int i = 8; i < (int)sizeof lab; i++) lab[i] = (uint8_t)(rand() % 3);
    snprintf(ip, sizeof ip, "%s/fp-images", tmp);
    snprintf(lp, sizeof lp, "%s/fp-labels", tmp);
    write_bytes(ip, img, sizeof img);
    write_bytes(lp, lab, sizeof lab);
    set_mtime(ip, 1000000000);
    set_mtime(lp, 1000000000);
    snprintf(json, sizeof json, "{\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", ip, lp);
    fingerprint_of(json, a);
    ck_assert_msg(strncmp(a, "v1 files=2 bytes=", 17) == 0, "%s", a);
    fingerprint_of(json, b);
    ck_assert_str_eq(a, b);
    lab[8 + 4] = (uint8_t)((lab[8 + 4] + 1) % 3); /* other labels, same size and time */
    write_bytes(lp, lab, sizeof lab);
    set_mtime(lp, 1000000000);
    fingerprint_of(json, b);
    ck_assert_str_ne(fp_field(a, "content", x, sizeof x), fp_field(b, "content", y, sizeof y));
    ck_assert_str_eq(fp_field(a, "mtime", x, sizeof x), fp_field(b, "mtime", y, sizeof y));
    set_mtime(ip, 1000000001); /* touched only */
    fingerprint_of(json, a);
    ck_assert_str_eq(fp_field(a, "content", x, sizeof x), fp_field(b, "content", y, sizeof y));
    ck_assert_str_ne(fp_field(a, "mtime", x, sizeof x), fp_field(b, "mtime", y, sizeof y));

    /* image_folder of 75 files; the same folder under another name has the same content hash */
    char root[300], moved[300], p[400];
    snprintf(root, sizeof root, "%s/fpdir", tmp);
    snprintf(moved, sizeof moved, "%s/fpdir2", tmp);
    make_classes(root, "a b c", 25);
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    fingerprint_of(json, a);
    ck_assert_msg(strstr(a, "files=75 "), "%s", a);
    ck_assert_int_eq(rename(root, moved), 0);
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", moved);
    fingerprint_of(json, b);
    ck_assert_str_eq(a, b);
    snprintf(p, sizeof p, "%s/b/07.png", moved); /* another image in its place */
    uint8_t px[IH * IW];
    for (int j = 0; j < IH * IW; j++) px[j] = (uint8_t)(j & 1 ? 255 : 0);
    write_png(p, IH, IW, 1, px);
    fingerprint_of(json, a);
    ck_assert_str_ne(fp_field(a, "content", x, sizeof x), fp_field(b, "content", y, sizeof y));
    unlink(p);
    fingerprint_of(json, a);
    ck_assert_msg(strstr(a, "files=74 "), "%s", a);

    /* a csv (one file: the source) */
    snprintf(p, sizeof p, "%s/fp.csv", tmp);
    write_bytes(p, "1,2,0\n3,4,1\n", 12);
    snprintf(json, sizeof json, "{\"format\": \"csv\", \"path\": \"%s\"}", p);
    fingerprint_of(json, a);
    ck_assert_msg(strncmp(a, "v1 files=1 bytes=12 ", 20) == 0, "%s", a);
}
END_TEST

static int pack(const char *from, const char *src, const char *out, bool compress, const char *mb) {
    char *argv[] = {"pack", "--from", (char *)from, (char *)src, "--out", (char *)out, "--shard-size",
                    (char *)mb, compress ? "--compress" : NULL, NULL};
    ct_err err = {0};
    int rc = ct_pack_main(compress ? 9 : 8, argv, &err);
    ck_assert_msg(rc == CT_OK, "%s", err.msg);
    return rc;
}

/* Every sample of a and b decodes to the same bytes. */
static void same_samples(ct_dataset *a, ct_dataset *b) {
    ck_assert_int_eq(a->count, b->count);
    ck_assert(ct_shape_eq(&a->sample_shape, &b->sample_shape));
    size_t n = (size_t)ct_shape_numel(&a->sample_shape);
    float *x = malloc(n * 4), *z = malloc(n * 4);
    ct_err err;
    for (int64_t i = 0; i < a->count; i++) {
        int32_t ya, yb;
        ck_assert_int_eq(a->decode(a, i, x, &ya, &err), CT_OK);
        ck_assert_msg(b->decode(b, i, z, &yb, &err) == CT_OK, "%s", err.msg);
        ck_assert(memcmp(x, z, n * 4) == 0);
        ck_assert_int_eq(ya, yb);
    }
    free(x);
    free(z);
}

START_TEST(test_shard_roundtrip) {
    char root[300], out[300], json[700];
    snprintf(root, sizeof root, "%s/img", tmp);
    make_folder(root);
    ct_dataset *a, *b;
    ct_err err = {0};
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ck_assert_int_eq(open_entry(json, &a, &err), CT_OK);
    for (int comp = 0; comp < 2; comp++) {
        snprintf(out, sizeof out, "%s/packed%d", tmp, comp);
        pack("image_folder", root, out, comp, "0.0002"); /* ~200 bytes: several shards */
        snprintf(json, sizeof json, "{\"format\": \"shard\", \"path\": \"%s\"}", out);
        ck_assert_msg(open_entry(json, &b, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(b->classes, 3);
        same_samples(a, b);
        ct_dataset_close(b);
    }
    /* Packing into a directory that already holds shards is refused. */
    char *argv[] = {"pack", "--from", "image_folder", root, "--out", out};
    ck_assert_int_eq(ct_pack_main(6, argv, &err), CT_ERR_CONFIG);
    ct_dataset_close(a);

    /* IDX (u8 images 3x5x4, labels) -> shard. */
    uint8_t img[16 + 3 * 20] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 4};
    uint8_t lab[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 1};
    for (int i = 16; i < (int)sizeof img; i++) img[i] = (uint8_t)(rand() & 255);
    char ip[300], lp[300];
    snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte", tmp);
    snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte", tmp);
    write_bytes(ip, img, sizeof img);
    write_bytes(lp, lab, sizeof lab);
    snprintf(out, sizeof out, "%s/idxpack", tmp);
    pack("idx", ip, out, true, "1");
    snprintf(json, sizeof json, "{\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", ip, lp);
    ck_assert_int_eq(open_entry(json, &a, &err), CT_OK);
    snprintf(json, sizeof json, "{\"format\": \"shard\", \"path\": \"%s/shard-000000.cts\"}", out);
    ck_assert_msg(open_entry(json, &b, &err) == CT_OK, "%s", err.msg);
    same_samples(a, b);
    ct_dataset_close(a);
    ct_dataset_close(b);
}
END_TEST

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void set_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A one-shard file of 4 u8 records [1, 2, 3] ([1, 8, 8] of 7s when compressed) with labels 0..3 (classes 3: label 3 is bad). */
static void small_shard(const char *dir, bool compress) {
    ct_shard_writer w;
    ct_err err;
    ct_shape s = {.ndim = 3, .d = {1, compress ? 8 : 2, compress ? 8 : 3}}; /* 64 bytes compress */
    ck_assert_int_eq(ct_shard_writer_open(&w, dir, CT_SHARD_U8, &s, 3, 1 << 20, compress, &err), CT_OK);
    for (int r = 0; r < 4; r++) {
        uint8_t rec[64];
        for (int k = 0; k < 64; k++) rec[k] = compress ? 7 : (uint8_t)(rand() & 255);
        ck_assert_int_eq(ct_shard_write(&w, rec, r, &err), CT_OK);
    }
    ck_assert_int_eq(ct_shard_writer_close(&w, &err), CT_OK);
}

static int open_shard(const char *file, ct_dataset **ds, ct_err *err) {
    char json[600];
    snprintf(json, sizeof json, "{\"format\": \"shard\", \"path\": \"%s\"}", file);
    return open_entry(json, ds, err);
}

START_TEST(test_shard_corruption) {
    char dir[300], file[400];
    snprintf(dir, sizeof dir, "%s/s", tmp);
    small_shard(dir, false);
    snprintf(file, sizeof file, "%s/shard-000000.cts", dir);
    size_t n;
    uint8_t *good = read_all(file, &n), *bad = malloc(n);
    ck_assert_uint_eq(n, 64 + 4 * 6 + 4 * 32);
    ct_dataset *ds;
    ct_err err = {0};
    float x[64];
    int32_t y;
    /* Label out of range (record 3 has label 3 of 3 classes). */
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 2, x, &y, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 3, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000000.cts: record 3: label 3 is outside"), "%s", err.msg);
    ct_dataset_close(ds);
    /* Every truncation is detected at open. */
    for (size_t cut = 0; cut < n; cut += 5) {
        write_bytes(file, good, cut);
        ck_assert_int_eq(open_shard(file, &ds, &err), CT_ERR_DATA);
        ck_assert_msg(strstr(err.msg, "shard-000000.cts: "), "%s", err.msg);
    }
    write_bytes(file, good, n - 1);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "truncated"), "%s", err.msg);
    /* Wrong magic. */
    memcpy(bad, good, n);
    bad[1] = 'X';
    write_bytes(file, bad, n);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "wrong magic"), "%s", err.msg);
    /* A flipped bit in the header, in the index, in a record. */
    memcpy(bad, good, n);
    bad[20] ^= 1;
    write_bytes(file, bad, n);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "header checksum mismatch"), "%s", err.msg);
    memcpy(bad, good, n);
    bad[n - 40] ^= 4;
    write_bytes(file, bad, n);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "index checksum mismatch"), "%s", err.msg);
    memcpy(bad, good, n);
    bad[64 + 6 + 2] ^= 0x10; /* record 1 */
    write_bytes(file, bad, n);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 1, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000000.cts: record 1 at offset 70: checksum mismatch"), "%s", err.msg);
    /* skip_corrupt: records 1 (checksum) and 3 (label) skipped, counted once each. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_loader_opts o = {.batch = 2, .workers = 2, .skip_corrupt = true, .classes = 3};
    ct_loader *l;
    ck_assert_int_eq(ct_loader_init(&l, be, ds, &o, NULL, &err), CT_OK);
    int64_t got = 0;
    for (int i = 0; i < 6; i++) {
        ct_loader_batch bt;
        ck_assert_int_eq(ct_loader_next(l, &bt, &err), CT_OK);
        got += bt.n;
    }
    ck_assert_int_eq(got, 6);
    ck_assert_int_eq(ct_loader_skipped(l), 2);
    ct_loader_free(l);
    ct_backend_destroy(be);
    ct_dataset_close(ds);
    free(good);
    free(bad);
    /* Compressed record with a consistent CRC but bad zlib data is still caught. */
    snprintf(dir, sizeof dir, "%s/z", tmp);
    small_shard(dir, true);
    snprintf(file, sizeof file, "%s/shard-000000.cts", dir);
    good = read_all(file, &n);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_OK);
    ck_assert_float_eq_tol(x[5], 7 / 255.0f, 1e-6);
    ct_dataset_close(ds);
    uint32_t ioff = le32(good + 24), stored = le32(good + ioff + 8);
    ck_assert_uint_eq(le32(good + ioff + 24), CT_SHARD_ZLIB);
    good[64 + stored - 3] ^= 0x21; /* inside the deflate stream */
    set_le32(good + ioff + 16, (uint32_t)crc32(0, good + 64, stored));
    set_le32(good + 56, (uint32_t)crc32(0, good + ioff, 4 * 32));
    set_le32(good + 60, (uint32_t)crc32(0, good, 60));
    write_bytes(file, good, n);
    ck_assert_int_eq(open_shard(file, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "record 0: zlib data does not decompress"), "%s", err.msg);
    ct_dataset_close(ds);
    free(good);
}
END_TEST

/* Fuzzer finding (test/fuzz/regress/idx-oom-huge-header.bin): a 44-byte IDX file whose header
 * declares 4 x 2 x 589505315 bytes is rejected before any allocation, naming the file and both
 * sizes (it used to allocate 4.7 GB and then fail). */
START_TEST(test_idx_huge_header) {
    uint8_t img[12 + 20] = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 2};
    memset(img + 12, 0x23, 20);
    uint8_t lab[8 + 4] = {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 4};
    char ip[300], lp[300], json[700];
    snprintf(ip, sizeof ip, "%s/huge-images", tmp);
    snprintf(lp, sizeof lp, "%s/huge-labels", tmp);
    write_bytes(ip, img, sizeof img);
    write_bytes(lp, lab, sizeof lab);
    snprintf(json, sizeof json, "{\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", ip, lp);
    ct_dataset *ds;
    ct_err err = {0};
    int rc = open_entry(json, &ds, &err);
    ck_assert_msg(rc == CT_ERR_DATA, "%d %s", rc, err.msg);
    ck_assert_msg(strstr(err.msg, "huge-images: truncated at byte offset 32: the header declares 4716042520 bytes"),
                  "%s", err.msg);
}
END_TEST

START_TEST(test_tokens) {
    char src[300], out[300], json[600], file[400];
    snprintf(src, sizeof src, "%s/text.txt", tmp);
    const char *text = "The quick brown fox jumps over the lazy dog.";
    write_bytes(src, text, strlen(text));
    snprintf(out, sizeof out, "%s/tok", tmp);
    char *argv[] = {"pack", "--from", "text", src, "--out", out};
    ct_err err = {0};
    ck_assert_int_eq(ct_pack_main(6, argv, &err), CT_OK);
    snprintf(file, sizeof file, "%s/tokens.bin", out);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 5}", file);
    ct_dataset *ds;
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, (44 - 1) / 5);
    ck_assert_int_eq(ds->classes, 256);
    int32_t x[5], y[5];
    for (int64_t i = 0; i < ds->count; i++) {
        ck_assert_int_eq(ds->decode(ds, i, x, y, &err), CT_OK);
        for (int t = 0; t < 5; t++) {
            ck_assert_int_eq(x[t], (uint8_t)text[i * 5 + t]);
            ck_assert_int_eq(y[t], (uint8_t)text[i * 5 + t + 1]);
        }
    }
    ct_dataset_close(ds);
    size_t n;
    uint8_t *b = read_all(file, &n);
    write_bytes(file, b, n - 1);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "tokens.bin: ") && strstr(err.msg, "truncated"), "%s", err.msg);
    b[0] = 'X';
    write_bytes(file, b, n);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "tokens.bin: not a token file"), "%s", err.msg);
    /* A token outside the vocabulary (uint32 file, vocab 10). */
    uint32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (uint32_t)(i % 10);
    toks[7] = 10;
    ck_assert_int_eq(ct_tokens_write(file, toks, 12, 4, 10, &err), CT_OK);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 3}", file);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 0, x, y, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 2, x, y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "token 7 (byte offset 60) is 10"), "%s", err.msg);
    ct_dataset_close(ds);
    /* Window counts at the boundary: a window needs seq_len + 1 tokens (its targets run one
     * further), so 12 tokens make 2 windows of 4 + 1 (not 3) and 13 make 3, whose last target is
     * the last token. (44 tokens over 5 above cannot tell (n - 1) / T from n / T.) */
    for (int i = 0; i < 12; i++) toks[i] = (uint32_t)(i % 10);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 4}", file);
    for (int n_tok = 12; n_tok <= 13; n_tok++) {
        uint32_t more[13];
        memcpy(more, toks, sizeof toks);
        more[12] = 7;
        ck_assert_int_eq(ct_tokens_write(file, more, (uint64_t)n_tok, 2, 10, &err), CT_OK);
        ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ds->count, (n_tok - 1) / 4);
        int32_t x4[4], y4[4];
        ck_assert_int_eq(ds->decode(ds, ds->count - 1, x4, y4, &err), CT_OK);
        ck_assert_int_eq(x4[0], (int32_t)more[(ds->count - 1) * 4]);
        ck_assert_int_eq(y4[3], (int32_t)more[ds->count * 4]);
        ct_dataset_close(ds);
    }
    free(b);
}
END_TEST

/* An llm.c shard: 256 int32 header (magic, version, count) then uint16 tokens. `count` is what the
 * header claims, `n` how many tokens are written: they differ for the truncated/oversized cases. */
static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count, const uint16_t *tok,
                       size_t n) {
    uint8_t *b = calloc(1, 1024 + 2 * n);
    int32_t h[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
    for (size_t i = 0; i < n; i++) {
        b[1024 + 2 * i] = (uint8_t)tok[i];
        b[1024 + 2 * i + 1] = (uint8_t)(tok[i] >> 8);
    }
    write_bytes(path, b, 1024 + 2 * n);
    free(b);
}

START_TEST(test_tokens_llmc) {
    char file[300], json[700];
    snprintf(file, sizeof file, "%s/fineweb_train_000001.bin", tmp);
    enum { N = 1000, T = 16 };
    uint16_t tok[N + 1];
    srand(1234);
    for (int i = 0; i <= N; i++) tok[i] = (uint16_t)(rand() % 50257);
    write_llmc(file, 20240520, 1, N, tok, N);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d}", file, T);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, (N - 1) / T);
    ck_assert_int_eq(ds->classes, 50257); /* GPT-2's vocabulary when the entry gives none */
    int32_t x[T], y[T];
    for (int64_t i = 0; i < ds->count; i++) {
        ck_assert_int_eq(ds->decode(ds, i, x, y, &err), CT_OK);
        for (int t = 0; t < T; t++) {
            ck_assert_int_eq(x[t], tok[i * T + t]);
            ck_assert_int_eq(y[t], tok[i * T + t + 1]);
        }
    }
    ct_dataset_close(ds);
    /* "vocab": a smaller vocabulary; token 517 (window 32) is outside it. */
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(rand() % 1000);
    tok[517] = 1000;
    write_llmc(file, 20240520, 1, N, tok, N);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d, \"vocab\": 1000}",
             file, T);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->classes, 1000);
    ck_assert_int_eq(ds->decode(ds, 31, x, y, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 32, x, y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: token 517 (byte offset 2058) is 1000, outside the "
                         "vocabulary of 1000"), "%s", err.msg);
    ct_dataset_close(ds);
    /* Without "vocab" the same file is fine; 50257 is outside GPT-2's. */
    tok[517] = 50257;
    write_llmc(file, 20240520, 1, N, tok, N);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d}", file, T);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 32, x, y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "token 517 (byte offset 2058) is 50257, outside the vocabulary of 50257") &&
                  strstr(err.msg, "\"vocab\""), "%s", err.msg);
    ct_dataset_close(ds);
    /* A header count that disagrees with the file size, either way: both numbers named. */
    write_llmc(file, 20240520, 1, N, tok, N - 1);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: 3022 bytes") && strstr(err.msg, "1000 tokens") &&
                  strstr(err.msg, "3024 bytes"), "%s", err.msg);
    write_llmc(file, 20240520, 1, N, tok, N + 1);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "3026 bytes") && strstr(err.msg, "1000 tokens"), "%s", err.msg);
    write_llmc(file, 20240520, 1, -5, tok, N);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "a token count of -5, below 0") && !strstr(err.msg, "2 x -5"), "%s", err.msg);
    /* Version 2 (llm.c's uint32 tokens) is not read. */
    write_llmc(file, 20240520, 2, N, tok, N);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: llm.c version 2"), "%s", err.msg);
    /* Shorter than its header. */
    uint8_t head[100] = {0x88, 0xd8, 0x34, 0x01, 1}; /* 20240520, version 1 */
    write_bytes(file, head, sizeof head);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: truncated: 100 bytes") && strstr(err.msg, "1024"),
                  "%s", err.msg);
    /* A headerless file (nanoGPT's train.bin): not read, and the message says where to look. */
    write_bytes(file, tok, sizeof tok);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: not a token file") && strstr(err.msg, "nanoGPT"),
                  "%s", err.msg);
    /* "vocab" on a ctrain token file must agree with its header; a bad value is a config error. */
    uint32_t small[40];
    for (int i = 0; i < 40; i++) small[i] = (uint32_t)(rand() % 256);
    ck_assert_int_eq(ct_tokens_write(file, small, 40, 2, 256, &err), CT_OK);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 4, \"vocab\": 256}", file);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ct_dataset_close(ds);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 4, \"vocab\": 300}", file);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "vocab") && strstr(err.msg, "300") && strstr(err.msg, "256"), "%s", err.msg);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 4, \"vocab\": 0}", file);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.train.vocab"), "%s", err.msg);
}
END_TEST

/* An llm.c shard's vocabulary is the entry's "vocab" (default GPT-2's 50257): larger than the model's
 * classes it is a config error naming data.train.vocab (it was a data error about the file). */
START_TEST(test_tokens_llmc_vocab_vs_model) {
    char file[300], path[400], text[1500];
    snprintf(file, sizeof file, "%s/shard.bin", tmp);
    uint16_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = (uint16_t)(rand() % 100);
    write_llmc(file, 20240520, 1, 200, tok, 200);
    for (int with_vocab = 0; with_vocab < 2; with_vocab++) {
        snprintf(path, sizeof path, "%s/lm.json", tmp);
        snprintf(text, sizeof text,
                 "{\"train_batch_size\": 2, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.01}},\n"
                 " \"model\": {\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 100, "
                 "\"dim\": 8}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 100}], \"loss\": {\"type\": \"cross_entropy\"}},\n"
                 " \"data\": {\"train\": {\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 8%s}},\n"
                 " \"train\": {\"epochs\": 1, \"device\": \"cpu\", \"run_dir\": \"%s/run\"}}\n",
                 file, with_vocab ? ", \"vocab\": 500" : "", tmp);
        write_bytes(path, text, strlen(text));
        ct_config_opts co = {.path = path, .world_size = 1};
        co.formats = ct_dataset_formats(&co.n_formats);
        ct_config *cfg = NULL;
        ct_warnings w = {0};
        ct_err err = {0};
        ck_assert_msg(ct_config_load(&co, &cfg, &w, &err) == CT_OK, "%s", err.msg);
        ct_warnings_free(&w);
        open_fails(cfg, CT_ERR_CONFIG, &err);
        ck_assert_msg(strstr(err.msg, with_vocab ? "data.train.vocab: 500 (" : "data.train.vocab: 50257 (") &&
                      strstr(err.msg, "but the model has 100 classes"), "%s", err.msg);
    }
}
END_TEST

/* Three llm.c shards written out of order (token counts 37, 0 and 50, random tokens) and a file the
 * glob must not take; shard k's tokens into all[] at its place in name order. Returns the total. */
static int write_three_shards(const char *dir, uint16_t *all) {
    static const int counts[3] = {37, 0, 50};
    int total = 0;
    for (int k = 2; k >= 0; k--) {   /* newest first: the order on disk must not matter */
        char f[400];
        snprintf(f, sizeof f, "%s/fineweb_train_%06d.bin", dir, k);
        int at = k == 0 ? 0 : k == 1 ? counts[0] : counts[0] + counts[1];
        for (int i = 0; i < counts[k]; i++) all[at + i] = (uint16_t)(rand() % 1000);
        write_llmc(f, 20240520, 1, counts[k], all + at, (size_t)counts[k]);
        total += counts[k];
    }
    char val[400];
    snprintf(val, sizeof val, "%s/fineweb_val_000000.bin", dir);
    write_llmc(val, 20240520, 1, 5, all, 5);
    return total;
}

/* Every window of ds equals the stream `all` cut at i x T: across shard boundaries too. */
static void windows_are(ct_dataset *ds, const uint16_t *all, int total, int T) {
    ck_assert_int_eq(ds->count, (total - 1) / T);
    int32_t x[16], y[16];
    ct_err err = {0};
    for (int64_t i = 0; i < ds->count; i++) {
        ck_assert_msg(ds->decode(ds, i, x, y, &err) == CT_OK, "%s", err.msg);
        for (int t = 0; t < T; t++) {
            ck_assert_msg(x[t] == all[i * T + t] && y[t] == all[i * T + t + 1], "window %lld, position %d",
                          (long long)i, t);
        }
    }
}

/* llm.c shards as one dataset: a glob (its matches in name order, whatever order they were
 * written in), a list (in the list's order), a brace pattern; the windows run across shard
 * boundaries; the fingerprint covers every shard; a bad header names its shard and the byte; an
 * empty glob names the pattern; a token outside the vocabulary names its shard and its offset
 * there; shards of two kinds or two vocabularies are refused. */
START_TEST(test_tokens_shards) {
    enum { T = 8 };
    char dir[300], json[1500], f0[400], f2[400];
    snprintf(dir, sizeof dir, "%s/fineweb", tmp);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    uint16_t all[100];
    srand(4321);
    int total = write_three_shards(dir, all);
    snprintf(f0, sizeof f0, "%s/fineweb_train_000000.bin", dir);
    snprintf(f2, sizeof f2, "%s/fineweb_train_000002.bin", dir);
    ct_dataset *ds;
    ct_err err = {0};
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s/fineweb_train_*.bin\", \"seq_len\": %d, "
             "\"vocab\": 1000}", dir, T);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    windows_are(ds, all, total, T);
    ck_assert_msg(strstr(ds->source, "fineweb_train_*.bin (3 files)"), "%s", ds->source);
    char fp[CT_DATASET_FINGERPRINT], fp2[CT_DATASET_FINGERPRINT], c1[40], c2[40];
    ck_assert_msg(ct_dataset_fingerprint(ds, fp, &err) == CT_OK, "%s", err.msg);
    ck_assert_msg(strstr(fp, "files=3 bytes=") && strstr(fp, "bytes=3246 "), "%s", fp);   /* 3 x 1024 + 2 x 87 */
    ct_dataset_close(ds);
    /* the last shard's tokens changed, same size: the content hash changes */
    uint16_t other[50];
    for (int i = 0; i < 50; i++) other[i] = (uint16_t)((all[37 + i] + 1) % 1000);
    write_llmc(f2, 20240520, 1, 50, other, 50);
    fingerprint_of(json, fp2);
    ck_assert_str_ne(fp_field(fp, "content", c1, sizeof c1), fp_field(fp2, "content", c2, sizeof c2));
    write_llmc(f2, 20240520, 1, 50, all + 37, 50);
    /* a list in its own order: shard 2's tokens, then shard 0's */
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": [\"%s\", \"%s\"], \"seq_len\": %d, "
             "\"vocab\": 1000}", f2, f0, T);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    uint16_t swapped[87];
    memcpy(swapped, all + 37, 50 * sizeof *all);
    memcpy(swapped + 50, all, 37 * sizeof *all);
    windows_are(ds, swapped, total, T);
    ct_dataset_close(ds);
    /* a brace pattern */
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s/fineweb_train_{000000..000002}.bin\", "
             "\"seq_len\": %d, \"vocab\": 1000}", dir, T);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    windows_are(ds, all, total, T);
    ct_dataset_close(ds);
    /* a token outside the vocabulary in the last shard: named by its shard and its place there */
    all[37 + 20] = 1000;
    write_llmc(f2, 20240520, 1, 50, all + 37, 50);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s/fineweb_train_*.bin\", \"seq_len\": %d, "
             "\"vocab\": 1000}", dir, T);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    int64_t bad = (37 + 20) / T;
    ck_assert_int_eq(ds->decode(ds, bad - 1, (int32_t[T]){0}, (int32_t[T]){0}, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, bad, (int32_t[T]){0}, (int32_t[T]){0}, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000002.bin: token 20 (byte offset 1064) is 1000"), "%s", err.msg);
    ct_dataset_close(ds);
    /* a bad header in the middle shard: named, with the byte */
    write_llmc(f2, 20240520, 1, 50, all + 37, 50);
    char f1[400];
    snprintf(f1, sizeof f1, "%s/fineweb_train_000001.bin", dir);
    write_llmc(f1, 20240520, 2, 0, all, 0);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: llm.c version 2 (at byte 4)"), "%s", err.msg);
    write_llmc(f1, 20240520, 1, 3, all, 2);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: 1028 bytes, but its llm.c header gives 3 tokens (at "
                         "byte 8"), "%s", err.msg);
    /* a ctrain token file among llm.c shards */
    uint32_t few[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 0};
    ck_assert_int_eq(ct_tokens_write(f1, few, 10, 2, 1000, &err), CT_OK);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000001.bin: a ctrain token file, but ") &&
                  strstr(err.msg, "fineweb_train_000000.bin is an llm.c shard"), "%s", err.msg);
    /* ctrain token files of two vocabularies */
    ck_assert_int_eq(ct_tokens_write(f0, few, 10, 2, 1000, &err), CT_OK);
    ck_assert_int_eq(ct_tokens_write(f2, few, 10, 4, 999, &err), CT_OK);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s/fineweb_train_*.bin\", \"seq_len\": 4}", dir);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "fineweb_train_000002.bin: its header gives a vocabulary of 999, but ") &&
                  strstr(err.msg, "fineweb_train_000000.bin's gives 1000"), "%s", err.msg);
    /* ... and of one, widths 2 and 4: one stream */
    ck_assert_int_eq(ct_tokens_write(f2, few, 10, 4, 1000, &err), CT_OK);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, (30 - 1) / 4);
    int32_t x4[4], y4[4];
    ck_assert_int_eq(ds->decode(ds, 6, x4, y4, &err), CT_OK);   /* tokens 24 .. 28: shard 2's 4 .. 8 */
    ck_assert_int_eq(x4[0], 5);
    ck_assert_int_eq(y4[3], 9);
    ct_dataset_close(ds);
    /* a glob that matches nothing: the pattern named */
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s/fineweb_tarin_*.bin\", \"seq_len\": 4}", dir);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "data.train.path: \"") && strstr(err.msg, "fineweb_tarin_*.bin\" matches no file"),
                  "%s", err.msg);
    /* a list whose items are globs, and a bad item */
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": [\"%s/fineweb_train_00000[02].bin\", 3], "
             "\"seq_len\": 4}", dir);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.train.path: expected paths of token files"), "%s", err.msg);
    snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": [\"%s/fineweb_train_00000[02].bin\"], "
             "\"seq_len\": 4}", dir);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, (20 - 1) / 4);
    ct_dataset_close(ds);
}
END_TEST

/* pack --from text with several files and --eval-fraction: train.bin holds the bytes of the files
 * in the order given up to the split, eval.bin the last fraction. */
START_TEST(test_pack_text_split) {
    char src[3][300], out[300], json[700], file[400];
    size_t len[3] = {777, 1, 2500}, total = 0;
    uint8_t all[3278];
    srand(99);
    for (int f = 0; f < 3; f++) {
        snprintf(src[f], sizeof src[f], "%s/part%d.txt", tmp, f);
        uint8_t b[2500];
        for (size_t i = 0; i < len[f]; i++) b[i] = (uint8_t)rand();
        write_bytes(src[f], b, len[f]);
        memcpy(all + total, b, len[f]);
        total += len[f];
    }
    snprintf(out, sizeof out, "%s/txt/split", tmp);
    char *argv[] = {"pack", "--from", "text", src[0], src[1], src[2], "--out", out, "--eval-fraction", "0.1"};
    ct_err err = {0};
    ck_assert_msg(ct_pack_main(10, argv, &err) == CT_OK, "%s", err.msg);
    size_t n_eval = (size_t)(total * 0.1), n_train = total - n_eval; /* 327 and 2951 */
    const char *names[2] = {"train.bin", "eval.bin"};
    size_t counts[2] = {n_train, n_eval}, first[2] = {0, n_train};
    for (int s = 0; s < 2; s++) {
        snprintf(file, sizeof file, "%s/%s", out, names[s]);
        snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": 1}", file);
        ct_dataset *ds;
        ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ds->count, (int64_t)counts[s] - 1);
        ck_assert_int_eq(ds->classes, 256);
        for (int64_t i = 0; i < ds->count; i++) {
            int32_t x, y;
            ck_assert_int_eq(ds->decode(ds, i, &x, &y, &err), CT_OK);
            ck_assert_int_eq(x, all[first[s] + (size_t)i]);
            ck_assert_int_eq(y, all[first[s] + (size_t)i + 1]);
        }
        ct_dataset_close(ds);
    }
    snprintf(file, sizeof file, "%s/tokens.bin", out);
    ck_assert(access(file, F_OK) != 0);
    /* An input the pack would write over (OUT/train.bin given as a text): exit 2, the file intact
     * (it was replaced by its own tokens) */
    snprintf(file, sizeof file, "%s/train.bin", out);
    size_t before_n, after_n;
    uint8_t *before = read_all(file, &before_n);
    char *over[] = {"pack", "--from", "text", file, "--out", out, "--eval-fraction", "0.1"};
    ck_assert_int_eq(ct_pack_main(8, over, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "would write") && strstr(err.msg, "an input"), "%s", err.msg);
    uint8_t *after = read_all(file, &after_n);
    ck_assert(before_n == after_n && !memcmp(before, after, before_n));
    free(before);
    free(after);
    /* Bad fractions and a missing input: exit 2 with the value, exit 3 naming the file. */
    const char *bad[] = {"0", "1", "-0.1", "x", "0.5x"};
    for (int i = 0; i < 5; i++) {
        argv[9] = (char *)bad[i];
        ck_assert_int_eq(ct_pack_main(10, argv, &err), CT_ERR_CONFIG);
        ck_assert_msg(strstr(err.msg, "--eval-fraction") && strstr(err.msg, bad[i]), "%s", err.msg);
    }
    argv[9] = "0.0001"; /* 0.33 bytes: no eval byte */
    ck_assert_int_eq(ct_pack_main(10, argv, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "3278 bytes"), "%s", err.msg);
    argv[9] = "0.1";
    snprintf(src[1], sizeof src[1], "%s/missing.txt", tmp);
    ck_assert_int_eq(ct_pack_main(10, argv, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "missing.txt: cannot open"), "%s", err.msg);
}
END_TEST

START_TEST(test_csv) {
    char file[300], json[600];
    snprintf(file, sizeof file, "%s/t.csv", tmp);
    const char *csv = "a, species ,b\n1.5,2,-3\n\n4,0,5e-1\r\n7,1,8\n";
    write_bytes(file, csv, strlen(csv));
    snprintf(json, sizeof json, "{\"format\": \"csv\", \"path\": \"%s\", \"label_column\": \"species\"}", file);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 3);
    ck_assert_int_eq(ds->classes, 3);
    ck_assert_int_eq(ds->sample_shape.d[0], 2);
    float x[2];
    int32_t y;
    ck_assert_int_eq(ds->decode(ds, 1, x, &y, &err), CT_OK);
    ck_assert(x[0] == 4.0f && x[1] == 0.5f && y == 0);
    ct_dataset_close(ds);
    /* No header, label = last column, float labels -> regression targets. */
    write_bytes(file, "1,2,0.25\n3,4,1.5\n", 17);
    snprintf(json, sizeof json, "{\"format\": \"csv\", \"path\": \"%s\"}", file);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_OK);
    ck_assert_int_eq(ds->target_dtype, CT_F32);
    float fy;
    ck_assert_int_eq(ds->decode(ds, 1, x, &fy, &err), CT_OK);
    ck_assert(x[0] == 3 && fy == 1.5f);
    ct_dataset_close(ds);
    write_bytes(file, "1,2,0\n3,x4,1\n", 13);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "t.csv:2: column 2: \"x4\" is not a decimal number"), "%s", err.msg);
    write_bytes(file, "1,2,0\n3,1\n", 10);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "t.csv:2: 2 fields, the first row has 3"), "%s", err.msg);
    /* Decimal numbers only: C's hexadecimal forms are refused, not read as 16. */
    const char *hex[] = {"1,2,0\n3,0x10,1\n", "1,2,0\n3,4,0x1p0\n", "1,2,0\n3,0X1A,1\n"};
    const char *bad[] = {"t.csv:2: column 2: \"0x10\"", "t.csv:2: column 3: \"0x1p0\"",
                         "t.csv:2: column 2: \"0X1A\""};
    for (int i = 0; i < 3; i++) {
        write_bytes(file, hex[i], strlen(hex[i]));
        ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
        ck_assert_msg(strstr(err.msg, bad[i]) && strstr(err.msg, "not a decimal number"), "%s", err.msg);
    }
}
END_TEST

/* A label column of class indices with one -1 becomes regression targets; a classifier then
 * refuses it, and the message names the line of the -1. */
START_TEST(test_csv_label_named) {
    char file[300], data[700];
    snprintf(file, sizeof file, "%s/c.csv", tmp);
    char text[400];
    size_t n = 0;
    n += (size_t)snprintf(text + n, sizeof text - n, "x,y,label\n");
    for (int r = 0; r < 8; r++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%d.%d,%d,%d\n", rand() % 10, rand() % 10,
                              rand() % 100, r == 5 ? -1 : rand() % 3);
    write_bytes(file, text, n);
    snprintf(data, sizeof data, "\"train\": {\"format\": \"csv\", \"path\": \"%s\"}", file);
    ct_err err = {0};
    open_fails(run_config("[2]", data), CT_ERR_CONFIG, &err);
    ck_assert_msg(strstr(err.msg, "c.csv:7: label \"-1\" is not a class index"), "%s", err.msg);
}
END_TEST

/* Open data.train = entry with data.transform = transform; the config's data is `data`, which
 * the caller deletes (cJSON_Delete) when done with cfg. */
static cJSON *data;
static int open_with_transform(const char *entry, const char *transform, ct_config *cfg,
                               ct_dataset **ds, ct_err *err) {
    *cfg = empty_cfg();
    data = cJSON_CreateObject();
    cJSON_AddItemToObject(data, "train", cJSON_Parse(entry));
    cJSON_AddItemToObject(data, "transform", cJSON_Parse(transform));
    cfg->data = data;
    cfg->micro_batch = cfg->train_batch_size = 4;
    return ct_dataset_open(cfg, "train", ds, err);
}

/* decode_u8 gives the pixels that decode normalises: lut(u8) == decode, bit for bit. */
static void u8_matches_float(ct_dataset *ds, const float *mean, const float *std) {
    ck_assert_ptr_nonnull(ds->decode_u8);
    size_t n = (size_t)ct_shape_numel(&ds->sample_shape);
    int64_t c = ds->sample_shape.ndim == 3 ? ds->sample_shape.d[0] : 1;
    float *x = malloc(n * 4);
    uint8_t *u = malloc(n);
    ct_err err;
    int distinct = 0;
    for (int64_t i = 0; i < ds->count; i++) {
        int32_t ya, yb;
        ck_assert_int_eq(ds->decode(ds, i, x, &ya, &err), CT_OK);
        ck_assert_msg(ds->decode_u8(ds, i, u, &yb, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ya, yb);
        for (size_t j = 0; j < n; j++) {
            int64_t ch = (int64_t)(j / (n / (size_t)c));
            float want = ((float)u[j] / 255.0f - mean[ch]) / std[ch];
            ck_assert_msg(x[j] == want, "%s record %lld pixel %zu: %g vs %g", ds->format,
                          (long long)i, j, x[j], want);
            distinct += u[j] != u[0];
        }
    }
    ck_assert_int_gt(distinct, 0);
    free(x);
    free(u);
}

/* root/{x,y}/NN.png: 6x8 RGB images whose three channels are drawn independently, so a channel
 * read from the wrong plane (BGR for RGB) or normalised with another channel's mean/std shows.
 * rgb[class][k] keeps the interleaved pixels. */
static uint8_t rgb[2][PER_CLASS][IH * IW * 3];

static void make_rgb_folder(const char *root) {
    char p[512];
    mkdir(root, 0777);
    for (int c = 0; c < 2; c++) {
        snprintf(p, sizeof p, "%s/%c", root, "xy"[c]);
        mkdir(p, 0777);
        for (int k = 0; k < PER_CLASS; k++) {
            for (int j = 0; j < IH * IW * 3; j++) rgb[c][k][j] = (uint8_t)(rand() & 255);
            snprintf(p, sizeof p, "%s/%c/%02d.png", root, "xy"[c], k);
            write_png(p, IH, IW, 3, rgb[c][k]);
        }
    }
}

static const float rgb_mean[3] = {0.1f, 0.5f, 0.8f}, rgb_std[3] = {0.2f, 0.3f, 0.45f};
static const char *rgb_transform =
    "{\"normalize\": {\"mean\": [0.1, 0.5, 0.8], \"std\": [0.2, 0.3, 0.45]}}";

/* Pixel (y, x) of channel ch of an interleaved image, normalised with that channel's constants. */
static float rgb_norm(const uint8_t *px, int w, int y, int x, int ch) {
    return ((float)px[(y * w + x) * 3 + ch] / 255.0f - rgb_mean[ch]) / rgb_std[ch];
}

START_TEST(test_image_folder_rgb) {
    char root[300], out[300], json[700];
    snprintf(root, sizeof root, "%s/rgb", tmp);
    make_rgb_folder(root);
    ct_config cfg;
    ct_dataset *ds, *sh;
    ct_err err = {0};
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ck_assert_msg(open_with_transform(json, rgb_transform, &cfg, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert(ds->sample_shape.ndim == 3 && ds->sample_shape.d[0] == 3);
    float x[3 * IH * IW];
    uint8_t u[3 * IH * IW];
    int32_t t;
    for (int i = 0; i < 2 * PER_CLASS; i++) {
        const uint8_t *px = rgb[i / PER_CLASS][i % PER_CLASS];
        ck_assert_int_eq(ds->decode(ds, i, x, &t, &err), CT_OK);
        ck_assert_int_eq(ds->decode_u8(ds, i, u, &t, &err), CT_OK);
        for (int ch = 0; ch < 3; ch++)
            for (int y = 0; y < IH; y++)
                for (int xx = 0; xx < IW; xx++) {
                    int k = (ch * IH + y) * IW + xx;
                    ck_assert_msg(x[k] == rgb_norm(px, IW, y, xx, ch), "image %d channel %d (%d,%d): %g, want %g",
                                  i, ch, y, xx, x[k], rgb_norm(px, IW, y, xx, ch));
                    ck_assert_int_eq(u[k], px[(y * IW + xx) * 3 + ch]);
                }
    }
    u8_matches_float(ds, rgb_mean, rgb_std);
    ct_dataset_close(ds);
    cJSON_Delete(data);
    /* bilinear to 3x4: each channel the 2x2 average of its own plane, with its own constants */
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\", \"size\": [3, 4], "
             "\"resize\": \"bilinear\"}", root);
    ck_assert_msg(open_with_transform(json, rgb_transform, &cfg, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 6, x, &t, &err), CT_OK);
    const uint8_t *px = rgb[1][1];
    for (int ch = 0; ch < 3; ch++)
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 4; c++) {
                float avg = (rgb_norm(px, IW, 2 * r, 2 * c, ch) + rgb_norm(px, IW, 2 * r, 2 * c + 1, ch) +
                             rgb_norm(px, IW, 2 * r + 1, 2 * c, ch) + rgb_norm(px, IW, 2 * r + 1, 2 * c + 1, ch)) / 4;
                ck_assert_float_eq_tol(x[(ch * 3 + r) * 4 + c], avg, 2e-5);
            }
    ct_dataset_close(ds);
    cJSON_Delete(data);
    /* packed into shards, the same samples (channel planes and constants included) */
    snprintf(out, sizeof out, "%s/rgbpack", tmp);
    pack("image_folder", root, out, true, "1");
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ck_assert_int_eq(open_with_transform(json, rgb_transform, &cfg, &ds, &err), CT_OK);
    cJSON *keep = data;
    snprintf(json, sizeof json, "{\"format\": \"shard\", \"path\": \"%s\"}", out);
    ck_assert_msg(open_with_transform(json, rgb_transform, &cfg, &sh, &err) == CT_OK, "%s", err.msg);
    same_samples(ds, sh);
    u8_matches_float(sh, rgb_mean, rgb_std);
    ct_dataset_close(ds);
    ct_dataset_close(sh);
    cJSON_Delete(keep);
    cJSON_Delete(data);
}
END_TEST

START_TEST(test_on_device_formats) {
    char root[300], out[300], json[700], ip[300], lp[300];
    const char *tr = "{\"on_device\": true, \"normalize\": {\"mean\": [0.45], \"std\": [0.27]}}";
    const float mean[1] = {0.45f}, std[1] = {0.27f};
    ct_config cfg;
    ct_dataset *ds;
    ct_loader_opts o;
    ct_err err = {0};
    /* image_folder, and the same images packed into u8 shards (plain and compressed) */
    snprintf(root, sizeof root, "%s/img", tmp);
    make_folder(root);
    snprintf(json, sizeof json, "{\"format\": \"image_folder\", \"root\": \"%s\"}", root);
    ck_assert_msg(open_with_transform(json, tr, &cfg, &ds, &err) == CT_OK, "%s", err.msg);
    u8_matches_float(ds, mean, std);
    ck_assert_msg(ct_loader_opts_from_config(&cfg, ds, true, 3, &o, &err) == CT_OK, "%s", err.msg);
    ck_assert(o.on_device && o.mean[0] == mean[0] && o.std[0] == std[0] && o.device_dtype == CT_F32);
    ct_dataset_close(ds);
    cJSON_Delete(data);
    for (int comp = 0; comp < 2; comp++) {
        snprintf(out, sizeof out, "%s/packed%d", tmp, comp);
        pack("image_folder", root, out, comp, "0.0002");
        snprintf(json, sizeof json, "{\"format\": \"shard\", \"path\": \"%s\"}", out);
        ck_assert_msg(open_with_transform(json, tr, &cfg, &ds, &err) == CT_OK, "%s", err.msg);
        u8_matches_float(ds, mean, std);
        ct_dataset_close(ds);
        cJSON_Delete(data);
    }
    /* idx u8 images [3, 5, 4] */
    uint8_t img[16 + 3 * 20] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 4};
    uint8_t lab[8 + 3] = {0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 1};
    for (int i = 16; i < (int)sizeof img; i++) img[i] = (uint8_t)(rand() & 255);
    snprintf(ip, sizeof ip, "%s/i-idx3-ubyte", tmp);
    snprintf(lp, sizeof lp, "%s/l-idx1-ubyte", tmp);
    write_bytes(ip, img, sizeof img);
    write_bytes(lp, lab, sizeof lab);
    snprintf(json, sizeof json, "{\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", ip, lp);
    ck_assert_msg(open_with_transform(json, tr, &cfg, &ds, &err) == CT_OK, "%s", err.msg);
    u8_matches_float(ds, mean, std);
    ct_dataset_close(ds);
    cJSON_Delete(data);
    /* csv holds no 8-bit images: the error names the key */
    snprintf(out, sizeof out, "%s/t.csv", tmp);
    write_bytes(out, "1,2,0\n3,4,1\n", 12);
    snprintf(json, sizeof json, "{\"format\": \"csv\", \"path\": \"%s\"}", out);
    ck_assert_msg(open_with_transform(json, "{\"on_device\": true}", &cfg, &ds, &err) == CT_OK, "%s",
                  err.msg);
    ck_assert_ptr_null(ds->decode_u8);
    ck_assert_int_eq(ct_loader_opts_from_config(&cfg, ds, true, 2, &o, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.transform.on_device") && strstr(err.msg, "csv"), "%s", err.msg);
    ct_dataset_close(ds);
    cJSON_Delete(data);
    /* not a bool */
    snprintf(json, sizeof json, "{\"format\": \"idx\", \"images\": \"%s\", \"labels\": \"%s\"}", ip, lp);
    ck_assert_int_eq(open_with_transform(json, "{\"on_device\": 1}", &cfg, &ds, &err), CT_OK);
    ck_assert_int_eq(ct_loader_opts_from_config(&cfg, ds, false, 2, &o, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.transform.on_device: expected true or false"), "%s", err.msg);
    ct_dataset_close(ds);
    cJSON_Delete(data);
    /* a misspelt key suggests on_device */
    ck_assert_int_eq(open_with_transform(json, "{\"on_devices\": true}", &cfg, &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "did you mean \"on_device\"?"), "%s", err.msg);
    cJSON_Delete(data);
}
END_TEST


/* One epoch of ds through the loader with data.skip_corrupt (2 workers, batches of `batch`, labels
 * below `classes`): the samples delivered, and *skipped those skipped (a skipped sample leaves its
 * batch short). */
static int64_t skip_corrupt_epoch(ct_dataset *ds, int batch, int classes, int64_t *skipped) {
    ct_err err = {0};
    ct_backend *be = ct_cpu_backend_create(1);
    ct_loader_opts o = {.batch = batch, .workers = 2, .skip_corrupt = true, .classes = classes};
    ct_loader *l;
    ck_assert_int_eq(ct_loader_init(&l, be, ds, &o, NULL, &err), CT_OK);
    int64_t got = 0;
    for (int64_t i = 0; i < (ds->count + batch - 1) / batch; i++) {
        ct_loader_batch bt;
        ck_assert_msg(ct_loader_next(l, &bt, &err) == CT_OK, "%s", err.msg);
        got += bt.n;
    }
    *skipped = ct_loader_skipped(l);
    ct_loader_free(l);
    ct_backend_destroy(be);
    return got;
}

/* ---- webdataset: shards written by Python's tarfile (test/make_wds.py) ---- */

typedef struct wds_row { int shard; char key[200]; int label, id; } wds_row;

/* Run the generator into tmp and read its manifest (the samples in shard order). */
static int make_wds(const char *mode, wds_row *rows, int cap) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -f %s/*.tar && /usr/bin/python3 test/make_wds.py %s %s", tmp, tmp, mode);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/manifest.txt", tmp);
    FILE *f = fopen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    int n = 0;
    while (n < cap && fscanf(f, "%d %199s %d %d", &rows[n].shard, rows[n].key, &rows[n].label, &rows[n].id) == 4) n++;
    fclose(f);
    return n;
}

/* The id a PNG sample encodes in its first two pixels (normalised to [0, 1] without "normalize"). */
static int png_id(const float *x) { return (int)lrintf(x[0] * 255.0f) + 256 * (int)lrintf(x[1] * 255.0f); }

START_TEST(test_webdataset_png) {
    wds_row rows[32];
    int n = make_wds("png", rows, 32);
    ck_assert_int_eq(n, 15);
    char json[1200];
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{000000..000002}.tar\", "
             "\"image\": \"png\", \"label\": \"cls\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    ck_assert_int_eq(ds->sample_shape.ndim, 3);
    ck_assert_int_eq(ds->sample_shape.d[0], 1);
    ck_assert_int_eq(ds->sample_shape.d[1], 4);
    ck_assert_int_eq(ds->sample_shape.d[2], 4);
    ck_assert_ptr_nonnull(ds->decode_u8);
    ck_assert_str_eq(ds->file(ds, 2) + strlen(tmp), "/shard-000002.tar"); /* the brace range, padded */
    ck_assert_ptr_null(ds->file(ds, 3));
    float x[16];
    int32_t y;
    for (int i = 0; i < n; i++) { /* the index keeps the shards' order */
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(png_id(x), rows[i].id);
        ck_assert_int_eq(y, rows[i].label);
        uint8_t px[16]; /* data.transform.on_device: the stored pixels */
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(px[0] + 256 * px[1], rows[i].id);
        for (int k = 0; k < 16; k++) ck_assert_float_eq(x[k], px[k] / 255.0f);
    }
    /* One shuffled epoch through the loader (2 workers): every sample once, with its label. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_loader_opts o = {.batch = 4, .workers = 2, .shuffle = true, .seed = 7, .classes = 5};
    ct_loader *l;
    ck_assert_int_eq(ct_loader_init(&l, be, ds, &o, NULL, &err), CT_OK);
    int seen[32] = {0}, got = 0;
    bool in_order = true;
    while (got < n) {
        ct_loader_batch bt;
        ck_assert_int_eq(ct_loader_next(l, &bt, &err), CT_OK);
        for (int64_t k = 0; k < bt.n; k++) {
            int id = png_id((const float *)bt.input + 16 * k), label = ((const int32_t *)bt.target)[k], r = 0;
            while (r < n && rows[r].id != id) r++;
            ck_assert_int_lt(r, n);
            ck_assert_int_eq(label, rows[r].label);
            seen[r]++;
            in_order &= r == got;
            got++;
        }
    }
    for (int r = 0; r < n; r++) ck_assert_int_eq(seen[r], 1);
    ck_assert(!in_order); /* shuffled across shards */
    ct_loader_free(l);
    ct_backend_destroy(be);
    ct_dataset_close(ds);
    /* A brace list and a bad range. */
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-00000{0,2}.tar\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 5 + 6);
    ct_dataset_close(ds);
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{2..0}.tar\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "brace range \"{2..0}\""), "%s", err.msg);
    /* ctrain info on a shard: its samples and members per extension. */
    char p[400], text[2000] = {0};
    snprintf(p, sizeof p, "%s/shard-000002.tar", tmp);
    ck_assert(ct_webdataset_is_tar(p));
    FILE *f = tmpfile();
    ck_assert_msg(ct_webdataset_info(p, f, &err) == CT_OK, "%s", err.msg);
    rewind(f);
    ck_assert_uint_gt(fread(text, 1, sizeof text - 1, f), 0);
    fclose(f);
    ck_assert_msg(strstr(text, "samples: 6") && strstr(text, "png: 6, cls: 6, meta.json: 6"), "%s", text);
}
END_TEST

START_TEST(test_webdataset_npy) {
    wds_row rows[32];
    int n = make_wds("npy", rows, 32);
    char json[1200];
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": [\"%s/shard-000000.tar\", "
             "\"%s/shard-000001.tar\"], \"image\": \"npy\", \"label\": \"txt\"}", tmp, tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    ck_assert_int_eq(ds->sample_shape.ndim, 2);
    ck_assert_int_eq(ds->sample_shape.d[0], 2);
    ck_assert_int_eq(ds->sample_shape.d[1], 3);
    ck_assert_ptr_null(ds->decode_u8); /* float32 arrays are not 8-bit images */
    float x[6];
    int32_t y;
    for (int i = 0; i < n; i++) {
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_float_eq(x[0], (float)rows[i].id);
        ck_assert_int_eq(y, rows[i].label);
    }
    ct_dataset_close(ds);
    /* A float64 array: refused naming the shard, the member and the dtype. */
    make_wds("npy-f64", rows, 32);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 2, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000000.tar: member part.0/sample000003.npy (field \"image\")") &&
                  strstr(err.msg, "'<f8'"), "%s", err.msg);
    ct_dataset_close(ds);
}
END_TEST

START_TEST(test_webdataset_errors) {
    wds_row rows[32];
    make_wds("nolabel", rows, 32);
    char json[1200], p[400];
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{000000..000002}.tar\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    float x[16];
    int32_t y;
    /* A sample without its label: an error at decode, skipped and counted with skip_corrupt. */
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 3, x, &y, &err), CT_ERR_DATA);
    /* its key holds ESC [2J (clear the screen): escaped in the message, so no control byte reaches a terminal */
    ck_assert_msg(strstr(err.msg, "shard-000000.tar: sample \"part.0/\\x1b[2Jsample000004\" has no "
                         "part.0/\\x1b[2Jsample000004.cls member (field \"label\")"), "%s", err.msg);
    int64_t skipped, got = skip_corrupt_epoch(ds, 5, 5, &skipped);
    ck_assert_int_eq(got, 14);
    ck_assert_int_eq(skipped, 1);
    ct_dataset_close(ds);
    /* A member cut short by the end of the file (the first PNG's data is at 512..597). */
    make_wds("png", rows, 32);
    snprintf(p, sizeof p, "%s/shard-000002.tar", tmp);
    ck_assert_int_eq(truncate(p, 560), 0);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000002.tar: member \"part.2/sample000010.png\" truncated"), "%s", err.msg);
    /* A flipped byte in a header (shard 1's second member, at offset 1024). */
    make_wds("png", rows, 32);
    snprintf(p, sizeof p, "%s/shard-000001.tar", tmp);
    size_t len;
    uint8_t *b = read_all(p, &len);
    b[1024 + 3] ^= 0x20;
    write_bytes(p, b, len);
    free(b);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000001.tar: bad tar header checksum at offset 1024 (member \"parT.1/"),
                  "%s", err.msg);
    /* A shard that does not exist. */
    make_wds("png", rows, 32);
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{000000..000003}.tar\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000003.tar: cannot open"), "%s", err.msg);
}
END_TEST


/* A .npy whose shape multiplies out past what a sample may hold is refused for its size, naming
 * the shape (it said "1 to 4 dimensions" of a 3-dimensional array); URLs are refused as URLs (an
 * http:// shard was "No such file"). */
START_TEST(test_webdataset_npy_size_and_urls) {
    char cmd[900], json[600];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c \"import io, sys, tarfile\n"
             "h = b\\\"{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000, 100000), }\\\"\n"
             "npy = b'\\\\x93NUMPY\\\\x01\\\\x00' + len(h).to_bytes(2, 'little') + h\n"
             "with tarfile.open(sys.argv[1], 'w', format=tarfile.USTAR_FORMAT) as t:\n"
             "    for name, data in (('s0.npy', npy), ('s0.txt', b'1')):\n"
             "        i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))\" %s/huge.tar", tmp);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/huge.tar\", \"image\": \"npy\", "
             "\"label\": \"txt\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "huge.tar: member s0.npy (field \"image\"): .npy shape (100000, 100000, 100000) "
                         "holds 1e+15 values; a sample holds at most 2^30"), "%s", err.msg);
    ck_assert_int_eq(open_entry("{\"format\": \"webdataset\", \"urls\": \"http://example.com/s-{0..3}.tar\"}", &ds, &err),
                     CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.train.urls: \"http://example.com/s-{0..3}.tar\" is a URL; ctrain reads local "
                         "files only"), "%s", err.msg);
    ck_assert_int_eq(open_entry("{\"format\": \"tfrecord\", \"path\": [\"a.tfrecord\", \"s3://b/c.tfrecord\"]}",
                                &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "\"s3://b/c.tfrecord\" is a URL"), "%s", err.msg);
}
END_TEST

/* ---- tfrecord: tf.Example records written by test/make_tfrecord.py (framing and protobuf by hand) ---- */

typedef struct tfr_row { int file, record, label, id; } tfr_row;

static int make_tfr(const char *mode, tfr_row *rows, int cap) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -f %s/part-* && /usr/bin/python3 test/make_tfrecord.py %s %s", tmp, tmp, mode);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/manifest.txt", tmp);
    FILE *f = fopen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    int n = 0;
    while (n < cap && fscanf(f, "%d %d %d %d", &rows[n].file, &rows[n].record, &rows[n].label, &rows[n].id) == 4) n++;
    fclose(f);
    return n;
}

/* The offset of record r of a TFRecord file (walking the framing). */
static int64_t tfr_offset(const char *path, int r) {
    size_t len;
    uint8_t *b = read_all(path, &len);
    int64_t off = 0;
    for (int k = 0; k < r; k++) {
        uint64_t n;
        ck_assert(ct_tfrecord_head_check(b + off, &n));
        off += (int64_t)n + CT_TFRECORD_FRAMING;
    }
    free(b);
    return off;
}

/* File descriptors this process has open on .tfrecord files (a dataset keeps its files open until
 * it is closed). */
static int open_tfrecord_fds(void) {
    char cmd[96];
    snprintf(cmd, sizeof cmd, "ls -l /proc/%d/fd | grep -c '\\.tfrecord'", (int)getpid());
    FILE *p = popen(cmd, "r");
    int n = -1;
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

START_TEST(test_tfrecord_png) {
    tfr_row rows[16];
    int n = make_tfr("png", rows, 16);
    ck_assert_int_eq(n, 9);
    char json[1200];
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    ck_assert_int_eq(ds->sample_shape.ndim, 3);
    ck_assert_int_eq(ds->sample_shape.d[0], 1);
    ck_assert_int_eq(ds->sample_shape.d[1], 4);
    ck_assert_int_eq(ds->sample_shape.d[2], 4);
    ck_assert_int_eq(ds->target_dtype, CT_I32);
    int top = 0;
    for (int i = 0; i < n; i++) top = rows[i].label > top ? rows[i].label : top;
    ck_assert_int_eq(ds->classes, top + 1);
    ck_assert_msg(strstr(ds->label_note, "the largest"), "%s", ds->label_note);
    ck_assert_str_eq(ds->file(ds, 1) + strlen(tmp), "/part-1.tfrecord");
    ck_assert_ptr_null(ds->file(ds, 2));
    ck_assert_ptr_nonnull(ds->decode_u8);
    ck_assert_int_eq(open_tfrecord_fds(), 2); /* kept open for the reads */
    /* data.shuffle_buffer through the loader (2 workers): the samples in order.c's order, the
     * two files as its shards. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_loader_opts o = {.batch = 3, .workers = 2, .shuffle = true, .shuffle_buffer = 4, .seed = 9, .classes = 5};
    ct_loader *l;
    ck_assert_int_eq(ct_loader_init(&l, be, ds, &o, NULL, &err), CT_OK);
    uint32_t order[9];
    ct_order_shuffle_buffer(ds, 9, 0, 4, order);
    for (int b = 0, k = 0; b < 3; b++) {
        ct_loader_batch bt;
        ck_assert_int_eq(ct_loader_next(l, &bt, &err), CT_OK);
        for (int64_t j = 0; j < bt.n; j++, k++) ck_assert_int_eq(png_id((const float *)bt.input + 16 * j), rows[order[k]].id);
    }
    ct_loader_free(l);
    ct_backend_destroy(be);
    float x[16];
    uint8_t px[16];
    int32_t y;
    for (int i = 0; i < n; i++) {
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(png_id(x), rows[i].id);
        ck_assert_int_eq(y, rows[i].label);
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        for (int k = 0; k < 16; k++) ck_assert_float_eq(x[k], px[k] / 255.0f);
    }
    ct_dataset_close(ds);
    /* limit: the first records in file order. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": [\"%s/part-0.tfrecord\", \"%s/part-1.tfrecord\"], "
             "\"limit\": 6}", tmp, tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 6);
    ck_assert_msg(ds->decode(ds, 5, x, &y, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(png_id(x), rows[5].id);
    ct_dataset_close(ds);
    ck_assert_int_eq(open_tfrecord_fds(), 0); /* both datasets closed their two files */
    /* ctrain info: records and the first record's features. */
    char p[400], text[2000] = {0};
    snprintf(p, sizeof p, "%s/part-1.tfrecord", tmp);
    ck_assert(ct_tfrecord_is_file(p));
    snprintf(p, sizeof p, "%s/manifest.txt", tmp);
    ck_assert(!ct_tfrecord_is_file(p));
    snprintf(p, sizeof p, "%s/part-1.tfrecord", tmp);
    FILE *f = tmpfile();
    ck_assert_msg(ct_tfrecord_info(p, f, &err) == CT_OK, "%s", err.msg);
    rewind(f);
    ck_assert_uint_gt(fread(text, 1, sizeof text - 1, f), 0);
    fclose(f);
    ck_assert_msg(strstr(text, "records: 4,") && strstr(text, "image: bytes_list of 1 (") &&
                  strstr(text, "bytes, PNG)") && strstr(text, "label: int64_list of 1"), "%s", text);
}
END_TEST

START_TEST(test_tfrecord_raw_and_float) {
    tfr_row rows[16];
    int n = make_tfr("raw", rows, 16);
    char json[1200];
    ct_dataset *ds;
    ct_err err = {0};
    float x[16];
    uint8_t px[16];
    int32_t y;
    /* Raw bytes in the shape given: like pixels. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0,1}.tfrecord\", \"shape\": [1, 4, 4]}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    ck_assert_ptr_nonnull(ds->decode_u8);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(png_id(x), rows[i].id);
        ck_assert_int_eq(y, rows[i].label);
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(px[0] + 256 * px[1], rows[i].id);
    }
    ct_dataset_close(ds);
    /* Without a shape: [bytes], still 8-bit. A shape of another size: refused at open. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-0.tfrecord\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->sample_shape.ndim, 1);
    ck_assert_int_eq(ds->sample_shape.d[0], 16);
    ck_assert_ptr_nonnull(ds->decode_u8);
    ct_dataset_close(ds);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-0.tfrecord\", \"shape\": [1, 5, 5]}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 0 (offset 0): feature \"image\" (input) has 16 bytes") &&
                  strstr(err.msg, "shape [1, 5, 5] holds 25"), "%s", err.msg);
    /* float_list input and int64 labels, packed (file 0) and unpacked (file 1). */
    n = make_tfr("float", rows, 16);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", \"input\": \"x\", "
             "\"label\": \"y\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    ck_assert_int_eq(ds->sample_shape.ndim, 1);
    ck_assert_int_eq(ds->sample_shape.d[0], 6);
    ck_assert_ptr_null(ds->decode_u8);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_float_eq(x[0], (float)rows[i].id);
        ck_assert(x[1] >= -1 && x[1] <= 1 && x[1] != 0);
        ck_assert_int_eq(y, rows[i].label);
    }
    ct_dataset_close(ds);
    /* The label as input and the input as label: a float_list is no class index. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-0.tfrecord\", \"input\": \"y\", "
             "\"label\": \"x\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->target_dtype, CT_F32);
    ck_assert_int_eq(ds->target_shape.d[0], 6);
    ck_assert_int_eq(ds->classes, 0);
    float t[6];
    ck_assert_msg(ds->decode(ds, 0, x, t, &err) == CT_OK, "%s", err.msg);
    ck_assert_float_eq(x[0], (float)rows[0].label);
    ck_assert_float_eq(t[0], (float)rows[0].id);
    ct_dataset_close(ds);
}
END_TEST

START_TEST(test_tfrecord_index) {
    tfr_row rows[16];
    int n = make_tfr("index", rows, 16);
    char json[1200], p[400];
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", "
             "\"index\": \"%s/part-{0..1}.index\"}", tmp, tmp);
    ct_dataset *ds;
    ct_err err = {0};
    float x[16];
    int32_t y;
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    ck_assert_int_eq(ds->classes, 0); /* not read at open: the loader checks each label */
    ck_assert_str_eq(ds->file(ds, 3) + strlen(tmp), "/part-1.index"); /* in the fingerprint */
    for (int i = n - 1; i >= 0; i--) {
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(png_id(x), rows[i].id);
        ck_assert_int_eq(y, rows[i].label);
    }
    ct_dataset_close(ds);
    /* Another file's index: the lengths do not match (decode), or records run past the end (open). */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-1.tfrecord\", \"index\": \"%s/part-0.index\"}",
             tmp, tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.index:5: the record at offset") && strstr(err.msg, "runs past the end of"),
                  "%s", err.msg);
    snprintf(p, sizeof p, "%s/part-1.index", tmp);
    write_bytes(p, "0 170\nx y\n", 10);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", "
             "\"index\": \"%s/part-{0..1}.index\"}", tmp, tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-1.index:2: expected \"OFFSET BYTES\""), "%s", err.msg);
    /* One index per file. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", "
             "\"index\": \"%s/part-0.index\"}", tmp, tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.train.index: 1 index files for 2 TFRecord files"), "%s", err.msg);
}
END_TEST

START_TEST(test_tfrecord_errors) {
    tfr_row rows[16];
    make_tfr("bad", rows, 16);
    char json[1200], p[400];
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    float x[16];
    int32_t y;
    /* A label of another kind, an image of another size, a missing label: at decode, naming the
     * file, the record and the feature; skipped and counted with skip_corrupt. */
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/part-0.tfrecord", tmp);
    char want[600];
    snprintf(want, sizeof want, "part-0.tfrecord: record 2 (offset %lld): feature \"label\" (label) is a float_list "
             "of 1 values, expected an int64_list", (long long)tfr_offset(p, 2));
    ck_assert_int_eq(ds->decode(ds, 2, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 6, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-1.tfrecord: record 1 (offset") &&
                  strstr(err.msg, "feature \"image\" (input): image is 3x3 (HxW), expected 4x4"), "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 7, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-1.tfrecord: record 2 (offset") &&
                  strstr(err.msg, "feature \"label\" (label) is missing; the record has: id, image, name, "
                         "\\x1b[31mred\\x0a"), "%s", err.msg);   /* a name from the file, escaped */
    int64_t skipped, got = skip_corrupt_epoch(ds, 3, 5, &skipped);
    ck_assert_int_eq(got, 6);
    ck_assert_int_eq(skipped, 3);
    ct_dataset_close(ds);
    /* A feature missing from the first record: at open. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-0.tfrecord\", \"input\": \"pixels\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 0 (offset 0): feature \"pixels\" (input) is missing; the "
                         "record has: id, image, label, name"), "%s", err.msg);
    /* A flipped byte in record 3's data: a bad data CRC at decode (the open still locates every record). */
    make_tfr("png", rows, 16);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\"}", tmp);
    size_t len;
    uint8_t *b = read_all(p, &len);
    int64_t off3 = tfr_offset(p, 3), off1 = tfr_offset(p, 1);
    b[off3 + 20] ^= 0x10;
    write_bytes(p, b, len);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 9);
    ck_assert_int_eq(ds->decode(ds, 3, x, &y, &err), CT_ERR_DATA);
    snprintf(want, sizeof want, "part-0.tfrecord: record 3 (offset %lld): bad data CRC", (long long)off3);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    ct_dataset_close(ds);
    /* A flipped byte in record 1's length: the open stops there. */
    b[off3 + 20] ^= 0x10;
    b[off1 + 1] ^= 0x01;
    write_bytes(p, b, len);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    snprintf(want, sizeof want, "part-0.tfrecord: record 1 at offset %lld: bad length CRC", (long long)off1);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    /* A file cut inside its last record. */
    b[off1 + 1] ^= 0x01;
    write_bytes(p, b, len - 3);
    free(b);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 4 at offset") && strstr(err.msg, "truncated"), "%s", err.msg);
    ck_assert_int_eq(truncate(p, off1 + 5), 0);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    snprintf(want, sizeof want, "part-0.tfrecord: record 1 at offset %lld: truncated header (5 of 12 bytes)", (long long)off1);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    /* Not a TFRecord file; a file that does not exist; entry errors. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/manifest.txt\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "manifest.txt: record 0 at offset 0: bad length CRC"), "%s", err.msg);
    make_tfr("png", rows, 16);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..2}.tfrecord\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-2.tfrecord: cannot open"), "%s", err.msg);
    ck_assert_int_eq(open_entry("{\"format\": \"tfrecord\", \"path\": \"x\", \"shape\": [0]}", &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.train.shape: expected 1 to 4 positive integers"), "%s", err.msg);
    ck_assert_int_eq(open_entry("{\"format\": \"tfrecord\", \"input\": \"x\"}", &ds, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "data.train.path: missing"), "%s", err.msg);
}
END_TEST

/* A bad data CRC in record 0 is a record like any other: the open takes the geometry from the first
 * record that reads (it used to fail there), decode names record 0 and skip_corrupt skips it; when
 * every record has one, the open says so. */
START_TEST(test_tfrecord_bad_first_record) {
    tfr_row rows[16];
    make_tfr("png", rows, 16);
    char json[1200], p[400];
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\"}", tmp);
    snprintf(p, sizeof p, "%s/part-0.tfrecord", tmp);
    size_t len;
    uint8_t *b = read_all(p, &len);
    b[20] ^= 0x10;   /* record 0's data */
    write_bytes(p, b, len);
    ct_dataset *ds;
    ct_err err = {0};
    float x[16];
    int32_t y;
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 9);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 0 (offset 0): bad data CRC"), "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 1, x, &y, &err), CT_OK);
    ck_assert_int_eq(png_id(x), rows[1].id);
    int64_t skipped, got = skip_corrupt_epoch(ds, 3, 5, &skipped);
    ck_assert_int_eq(got, 8);
    ck_assert_int_eq(skipped, 1);
    ct_dataset_close(ds);
    /* every record of the only file bad */
    for (int r = 0; r < 5; r++) b[tfr_offset(p, r) + 20] ^= r ? 0x10 : 0;
    write_bytes(p, b, len);
    free(b);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-0.tfrecord\"}", tmp);
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 0 (offset 0): bad data CRC") &&
                  strstr(err.msg, "All 5 records have a bad data CRC"), "%s", err.msg);
}
END_TEST

/* A compressed file whose stream inflates to no TFRecord framing (gzip members of zeros: 64 MiB
 * from 300 KiB) stops at its first record header, naming the file, instead of being inflated whole
 * into memory first (an 8.5 GB buffer for a 4 MB file). */
START_TEST(test_tfrecord_gzip_bomb) {
    enum { MIB = 1 << 20 };
    uint8_t *zeros = calloc(MIB, 1), *gz = malloc(MIB);
    z_stream z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);   /* gzip */
    z.next_in = zeros;
    z.avail_in = MIB;
    z.next_out = gz;
    z.avail_out = MIB;
    ck_assert_int_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t n = MIB - z.avail_out;
    deflateEnd(&z);
    char p[400], json[600];
    snprintf(p, sizeof p, "%s/bomb.tfrecord.gz", tmp);
    FILE *f = fopen(p, "wb");
    for (int k = 0; k < 64; k++) ck_assert_uint_eq(fwrite(gz, 1, n, f), n);   /* 64 members */
    fclose(f);
    free(zeros);
    free(gz);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s\"}", p);
    ct_dataset *ds;
    ct_err err = {0};
    double t0 = ct_now();
    ck_assert_int_eq(open_entry(json, &ds, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "bomb.tfrecord.gz: compressed (gzip or zlib), but what it inflates to is not TFRecord "
                         "records: record 0 at inflated byte 0 has a bad length CRC (inflating stopped there)"), "%s", err.msg);
    ck_assert_msg(ct_now() - t0 < 2.0, "took %.2f s: inflated far past the first header", ct_now() - t0);
}
END_TEST

/* ---- JPEG inputs (libjpeg-turbo) of webdataset and tfrecord: Pillow's decode, byte for byte ---- */

/* Check every sample of ds (8x8 RGB) against the generator's pixels.txt (Pillow's decode). */
static void check_jpeg_pixels(ct_dataset *ds) {
    char path[400];
    snprintf(path, sizeof path, "%s/pixels.txt", tmp);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char hex[8 * 8 * 3 * 2 + 8];
    ct_err err = {0};
    int64_t i = 0;
    for (; fscanf(f, "%400s", hex) == 1; i++) {
        ck_assert_int_lt(i, ds->count);
        uint8_t px[3 * 64];
        float x[3 * 64];
        int32_t y;
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        for (int j = 0; j < 64; j++)
            for (int c = 0; c < 3; c++) {
                unsigned v;
                ck_assert_int_eq(sscanf(hex + 2 * (3 * j + c), "%2x", &v), 1);
                ck_assert_int_eq(px[c * 64 + j], v); /* planar [3, 8, 8] from interleaved [8, 8, 3] */
                ck_assert_float_eq(x[c * 64 + j], v / 255.0f);
            }
    }
    fclose(f);
    ck_assert_int_eq(i, ds->count);
}

START_TEST(test_jpeg_inputs) {
    char cmd[600], json[1200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 test/make_wds.py %s jpg", tmp);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{000000..000002}.tar\", "
             "\"image\": \"jpg\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 15);
    ck_assert_int_eq(ds->sample_shape.d[0], 3);
    ck_assert_int_eq(ds->sample_shape.d[1], 8);
    ck_assert_int_eq(ds->sample_shape.d[2], 8);
    check_jpeg_pixels(ds);
    ct_dataset_close(ds);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 test/make_tfrecord.py %s jpg", tmp);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, 9);
    ck_assert_int_eq(ds->sample_shape.d[0], 3);
    check_jpeg_pixels(ds);
    ct_dataset_close(ds);
    /* "shape" [1, 8, 8]: decoded to gray by libjpeg. */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-0.tfrecord\", \"shape\": [1, 8, 8]}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    float x[64];
    int32_t y;
    ck_assert_msg(ds->decode(ds, 0, x, &y, &err) == CT_OK, "%s", err.msg);
    ct_dataset_close(ds);
    /* A JPEG cut short inside a webdataset shard's member: exit 3 naming the member. */
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 test/make_wds.py %s jpg", tmp);
    ck_assert_int_eq(system(cmd), 0);
    char p[400];
    snprintf(p, sizeof p, "%s/shard-000000.tar", tmp);
    size_t len;
    uint8_t *b = read_all(p, &len);
    uint8_t *eoi = NULL; /* the first JPEG's end marker: damage the data before it */
    for (size_t k = 512; k + 1 < len && !eoi; k++)
        if (b[k] == 0xFF && b[k + 1] == 0xD9) eoi = b + k;
    ck_assert_ptr_nonnull(eoi);
    memset(eoi - 200, 0xFF, 200);
    write_bytes(p, b, len);
    free(b);
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{000000..000002}.tar\", "
             "\"image\": \"jpg\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK || strstr(err.msg, "corrupt JPEG"), "%s", err.msg);
    if (ds) {
        ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_ERR_DATA);
        ct_dataset_close(ds);
    }
    ck_assert_msg(strstr(err.msg, "shard-000000.tar: member part.0/sample000001.jpg (field \"image\"): corrupt JPEG"),
                  "%s", err.msg);
}
END_TEST

/* ---- every form of a container's header (a tcase of its own: test/plants runs it alone) ---- */

/* .npy members in every header version (1: a 2-byte header length; 2 and 3: 4 bytes), in a GNU
 * tar and in a POSIX ustar tar whose member names need the prefix field (each name field is just
 * "s.npy" / "s.txt": without the prefix the samples would share one key); every one of each
 * sample's values, not only the first. The suite's other .npy files are all version 1 in tars
 * without a prefix. */
START_TEST(test_webdataset_npy_forms) {
    wds_row rows[16];
    int n = make_wds("npy-forms", rows, 16);
    ck_assert_int_eq(n, 8);
    char json[1200], path[400];
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-{000000..000001}.tar\", "
             "\"image\": \"npy\", \"label\": \"txt\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->count, n);
    snprintf(path, sizeof path, "%s/values.txt", tmp);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        float want[6], x[6];
        for (int k = 0; k < 6; k++) ck_assert_int_eq(fscanf(f, "%f", &want[k]), 1);
        int32_t y;
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "sample %d (%s): %s", i, rows[i].key, err.msg);
        ck_assert_int_eq(y, rows[i].label);
        for (int k = 0; k < 6; k++)
            ck_assert_msg(x[k] == want[k], "sample %d (%s) value %d: %.9g, want %.9g", i, rows[i].key, k, (double)x[k],
                          (double)want[k]);
    }
    fclose(f);
    ct_dataset_close(ds);
    /* a sample of the ustar shard named in full in an error: its label member made unreadable */
    make_wds("npy-forms", rows, 16);
    snprintf(path, sizeof path, "%s/shard-000001.tar", tmp);
    size_t len;
    uint8_t *b = read_all(path, &len);
    ck_assert_int_eq(memcmp(b + 512 * 2 + 257, "ustar", 5), 0);   /* member 2: sample 5's .txt */
    ck_assert_int_eq(b[512 * 2 + 345], 'd');                       /* its prefix: "deep/5/ddd..." */
    b[512 * 3] = 'x';                                              /* its label "N\n" -> "x\n" */
    write_bytes(path, b, len);
    free(b);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    float x[6];
    int32_t y;
    ck_assert_int_eq(ds->decode(ds, 4, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "shard-000001.tar: member deep/5/dddd") && strstr(err.msg, "ddd/s.txt (field \"label\")"),
                  "%s", err.msg);
    ct_dataset_close(ds);
}
END_TEST

/* uint8 .npy images ('|u1' and '<u1' descr), [1, 4, 4]: normalised like pixels, and stored as
 * they are for data.transform.on_device. */
START_TEST(test_webdataset_npy_u8) {
    wds_row rows[8];
    int n = make_wds("npy-u8", rows, 8);
    ck_assert_int_eq(n, 5);
    char json[1200];
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-000000.tar\", \"image\": \"npy\", "
             "\"label\": \"cls\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->sample_shape.ndim, 3);
    ck_assert_ptr_nonnull(ds->decode_u8);
    for (int i = 0; i < n; i++) {
        float x[16];
        uint8_t px[16];
        int32_t y;
        ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(png_id(x), rows[i].id);
        ck_assert_int_eq(y, rows[i].label);
        ck_assert_msg(ds->decode_u8(ds, i, px, &y, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(px[0] + 256 * px[1], rows[i].id);
        for (int k = 0; k < 16; k++) ck_assert_float_eq_tol(x[k], px[k] / 255.0f, 1e-6f);
    }
    ct_dataset_close(ds);
}
END_TEST

/* A big-endian array and one in Fortran order: refused at decode, naming the member and why. */
START_TEST(test_webdataset_npy_refused) {
    wds_row rows[8];
    make_wds("npy-refused", rows, 8);
    char json[1200];
    snprintf(json, sizeof json, "{\"format\": \"webdataset\", \"urls\": \"%s/shard-000000.tar\", \"image\": \"npy\", "
             "\"label\": \"txt\"}", tmp);
    ct_dataset *ds;
    ct_err err = {0};
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    float x[6];
    int32_t y;
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 1, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "member part.0/sample000002.npy (field \"image\")") && strstr(err.msg, "'>f4'"),
                  "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 2, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "sample000003.npy") && strstr(err.msg, "Fortran order"), "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 3, x, &y, &err), CT_OK);
    ct_dataset_close(ds);
}
END_TEST

/* tf.Example features across every value range of their type, packed (file 0) and unpacked
 * (file 1): int64 inputs that are negative (10-byte varints), -2^63, 2^63 - 1 and 2^53, read as
 * the float of the signed value; float inputs NaN, +-inf, -0, a denormal and the largest float,
 * bit for bit; an int64 label of -1 or 2^31 refused naming the record; an empty bytes value as an
 * image or as raw bytes refused naming the record. The suite's other TFRecord values are small
 * non-negative integers and ordinary floats. */
START_TEST(test_tfrecord_value_ranges) {
    tfr_row rows[16];
    int n = make_tfr("values", rows, 16);
    ck_assert_int_eq(n, 8);
    char json[1200], path[400];
    ct_dataset *ds;
    ct_err err = {0};
    float x[16];
    int32_t y;
    long long v[8][6];
    float f[8][6];
    snprintf(path, sizeof path, "%s/values.txt", tmp);
    FILE *vf = fopen(path, "r");
    ck_assert_ptr_nonnull(vf);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 6; k++) ck_assert_int_eq(fscanf(vf, "%lld", &v[i][k]), 1);
        for (int k = 0; k < 6; k++) {
            char word[64];
            ck_assert_int_eq(fscanf(vf, "%63s", word), 1);
            f[i][k] = strtof(word, NULL);
        }
    }
    fclose(vf);
    const char *inputs[] = {"v", "f"};
    for (int in = 0; in < 2; in++) {
        snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", \"input\": \"%s\", "
                 "\"label\": \"y\"}", tmp, inputs[in]);
        ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ds->count, n);
        for (int i = 0; i < n; i++) {
            ck_assert_msg(ds->decode(ds, i, x, &y, &err) == CT_OK, "%s", err.msg);
            ck_assert_int_eq(y, rows[i].label);
            for (int k = 0; k < 6; k++) {
                float want = in == 0 ? (float)v[i][k] : f[i][k];
                ck_assert_msg(isnan(want) ? isnan(x[k]) : memcmp(&x[k], &want, 4) == 0,
                              "record %d feature %s value %d: %.9g, want %.9g", i, inputs[in], k, (double)x[k],
                              (double)want);
            }
        }
        ct_dataset_close(ds);
    }
    /* class labels out of range: refused at decode, naming the record and the value */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", \"input\": \"v\", "
             "\"label\": \"y2\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 0, x, &y, &err), CT_OK);
    ck_assert_int_eq(ds->decode(ds, 1, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 1") && strstr(err.msg, "-1 is not a class index"), "%s",
                  err.msg);
    ck_assert_int_eq(ds->decode(ds, 5, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-1.tfrecord: record 1") && strstr(err.msg, "2147483648 is not a class index"),
                  "%s", err.msg);
    ct_dataset_close(ds);
    /* empty bytes: as a PNG, and as raw bytes of a shape */
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", \"input\": \"img\", "
             "\"label\": \"y\"}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 5, x, &y, &err), CT_OK);
    ck_assert_int_eq(png_id(x), rows[5].id);
    ck_assert_int_eq(ds->decode(ds, 6, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-1.tfrecord: record 2") && strstr(err.msg, "\"img\""), "%s", err.msg);
    ct_dataset_close(ds);
    snprintf(json, sizeof json, "{\"format\": \"tfrecord\", \"path\": \"%s/part-{0..1}.tfrecord\", \"input\": \"raw\", "
             "\"label\": \"y\", \"shape\": [1, 4, 4]}", tmp);
    ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ds->decode(ds, 2, x, &y, &err), CT_OK);
    ck_assert_int_eq(png_id(x), rows[2].id);
    ck_assert_int_eq(ds->decode(ds, 3, x, &y, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "part-0.tfrecord: record 3") && strstr(err.msg, "has 0 bytes, expected 16"), "%s",
                  err.msg);
    ct_dataset_close(ds);
}
END_TEST

/* ctrain token files whose ids need every byte of their width: uint16 ids above 255, uint32 ids
 * above 65535 and 2^24, up to 2^31 - 1, written and read back window by window. The suite's
 * other ctrain token files hold ids below 256. */
START_TEST(test_tokens_every_byte) {
    char file[300], json[600];
    snprintf(file, sizeof file, "%s/wide.bin", tmp);
    static const uint32_t wide[] = {0, 255, 256, 65535, 65536, 70000, 16777215, 16777216, 305419896, 2147483647,
                                    1, 4096, 2147483646};
    static const uint32_t narrow[] = {0, 255, 256, 511, 4660, 32768, 65535, 65534, 1, 43981, 7, 65280, 300};
    enum { N = 13, T = 4 };
    for (int width = 2; width <= 4; width += 2) {
        const uint32_t *tok = width == 4 ? wide : narrow;
        uint32_t vocab = width == 4 ? 2147483648u : 65536u;
        ct_err err = {0};
        ck_assert_int_eq(ct_tokens_write(file, tok, N, width, vocab, &err), CT_OK);
        snprintf(json, sizeof json, "{\"format\": \"tokens\", \"path\": \"%s\", \"seq_len\": %d}", file, T);
        ct_dataset *ds;
        ck_assert_msg(open_entry(json, &ds, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ds->count, (N - 1) / T);
        ck_assert_int_eq(ds->classes, (int64_t)vocab);
        for (int64_t i = 0; i < ds->count; i++) {
            int32_t x[T], y[T];
            ck_assert_msg(ds->decode(ds, i, x, y, &err) == CT_OK, "%s", err.msg);
            for (int t = 0; t < T; t++) {
                ck_assert_msg(x[t] == (int32_t)tok[i * T + t], "width %d window %lld position %d: %d, want %u", width,
                              (long long)i, t, x[t], tok[i * T + t]);
                ck_assert_int_eq(y[t], (int32_t)tok[i * T + t + 1]);
            }
        }
        ct_dataset_close(ds);
    }
}
END_TEST

/* Every format row (core/data/formats.def) has its "## name" section in docs/formats.md and its
 * row "| `name` | ..." in the table there, naming each of its entry keys; and a config naming an
 * unknown format or a key the format does not take is refused with the registry's names. */
START_TEST(every_format_is_documented) {
    int n;
    const ct_data_format *formats = ct_dataset_formats(&n);
    char *doc = ct_fs_read_small("docs/formats.md", 1 << 20, NULL);
    ck_assert_msg(doc != NULL, "docs/formats.md: cannot read it (run from the repository root)");
    for (int i = 0; i < n; i++) {
        const char *name = formats[i].name;
        char heading[96], row[96];
        snprintf(heading, sizeof heading, "\n## %s", name);
        snprintf(row, sizeof row, "\n| `%s` |", name);
        const char *h = strstr(doc, heading);
        ck_assert_msg(h && (h[strlen(heading)] == ' ' || h[strlen(heading)] == '\n'),
                      "docs/formats.md has no section \"## %s\"", name);
        const char *r = strstr(doc, row);
        ck_assert_msg(r != NULL, "docs/formats.md's table has no row for %s", name);
        size_t len = strcspn(r + 1, "\n");
        for (int k = 0; k < CT_ARRAY_LEN(formats[i].keys) && formats[i].keys[k]; k++) {
            char key[64];
            snprintf(key, sizeof key, "`%s`", formats[i].keys[k]);
            const char *at = strstr(r + 1, key);
            ck_assert_msg(at && at < r + 1 + len, "docs/formats.md's row of %s lacks its key %s", name, key);
        }
    }
    free(doc);
}
END_TEST

int main(void) {
    Suite *s = suite_create("datasets");
    TCase *tc = tcase_create("datasets");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, every_format_is_documented);
    tcase_add_test(tc, test_image_folder);
    tcase_add_test(tc, test_image_folder_errors);
    tcase_add_test(tc, test_image_folder_rgb);
    tcase_add_test(tc, test_eval_classes_by_name);
    tcase_add_test(tc, test_labels_named_where_they_are);
    tcase_add_test(tc, test_skip_corrupt_reported);
    tcase_add_test(tc, test_fingerprint);
    tcase_add_test(tc, test_pack_idx_labels);
    tcase_add_test(tc, test_bench_data_args);
    tcase_add_test(tc, test_info_refuses_fifo);
    tcase_add_test(tc, test_data_fifo_refused);
    tcase_add_test(tc, test_printable);
    tcase_add_test(tc, test_shard_roundtrip);
    tcase_add_test(tc, test_shard_corruption);
    tcase_add_test(tc, test_idx_huge_header);
    tcase_add_test(tc, test_tokens);
    tcase_add_test(tc, test_tokens_llmc);
    tcase_add_test(tc, test_tokens_llmc_vocab_vs_model);
    tcase_add_test(tc, test_tokens_shards);
    tcase_add_test(tc, test_pack_text_split);
    tcase_add_test(tc, test_csv);
    tcase_add_test(tc, test_csv_label_named);
    tcase_add_test(tc, test_on_device_formats);
    tcase_add_test(tc, test_webdataset_png);
    tcase_add_test(tc, test_webdataset_npy);
    tcase_add_test(tc, test_webdataset_errors);
    tcase_add_test(tc, test_webdataset_npy_size_and_urls);
    tcase_add_test(tc, test_tfrecord_png);
    tcase_add_test(tc, test_tfrecord_raw_and_float);
    tcase_add_test(tc, test_tfrecord_index);
    tcase_add_test(tc, test_tfrecord_errors);
    tcase_add_test(tc, test_tfrecord_bad_first_record);
    tcase_add_test(tc, test_tfrecord_gzip_bomb);
    tcase_add_test(tc, test_jpeg_inputs);
    suite_add_tcase(s, tc);
    TCase *forms = tcase_create("forms");
    tcase_add_checked_fixture(forms, setup, teardown);
    tcase_set_timeout(forms, 30);
    tcase_add_test(forms, test_webdataset_npy_forms);
    tcase_add_test(forms, test_webdataset_npy_u8);
    tcase_add_test(forms, test_webdataset_npy_refused);
    tcase_add_test(forms, test_tfrecord_value_ranges);
    tcase_add_test(forms, test_tokens_every_byte);
    suite_add_tcase(s, forms);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

/* fuzz_tfrecord.c: libFuzzer harness for the TFRecord reader (core/data/tfrecord.c) and its
 * tf.Example protobuf reader (core/data/tfexample.c): the input is one TFRecord file, opened twice
 * ("input": "image", "label": "label", as the PNG and raw seeds have them, and "input": "x",
 * "label": "y", as the float seed has them). Opening, decoding every record (floats and, for 8-bit
 * inputs, raw bytes), `ctrain info`, and the Example reader on the whole input must succeed or fail
 * with CT_ERR_DATA, never crash or read outside a buffer. Seeds: test/fuzz/seeds-fuzz_tfrecord/
 * (files written by test/make_tfrecord.py: PNG, JPEG, raw bytes and packed float_list records; the raw
 * one gzip-compressed too, as TFRecordOptions("GZIP") writes it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test/fuzz/fuzz_decode.h"
#include "test/fuzz/fuzz_file.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/tfexample.h"
#include "core/data/tfrecord.h"
#include "core/util/tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The CRCs stop nearly every mutation; half of the runs (the last byte's low bit) rewrite both
 * CRCs of each record the reader will reach, so the Example bytes behind them get fuzzed. */
static void fix_crcs(uint8_t *p, size_t n) {
    size_t off = 0;
    while (off + CT_TFRECORD_FRAMING <= n) {
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--) len = len << 8 | p[off + (size_t)i];
        if (len > n - off - CT_TFRECORD_FRAMING) return;
        ct_tfrecord_head(p + off, len);
        ct_tfrecord_tail(p + off + CT_TFRECORD_HEAD + len, p + off + CT_TFRECORD_HEAD, (size_t)len);
        off += CT_TFRECORD_FRAMING + (size_t)len;
    }
}

static void visit(void *ctx, const char *name, size_t len, const ct_tfx_feature *f) {
    float v[64];
    if (f->kind != CT_TFX_BYTES && f->count <= 64) ct_tfx_floats(f, v);
}

static void open_and_decode(const char *path, const char *input, const char *label) {
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", "tfrecord");
    cJSON_AddStringToObject(e, "path", path);
    cJSON_AddStringToObject(e, "input", input);
    cJSON_AddStringToObject(e, "label", label);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    int rc = ct_tfrecord_open(&cfg, e, "data.train", &ds, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    if (ds) {
        fuzz_decode_samples(ds, 1 << 20, 256);
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = NULL;
    if (size > CT_TFRECORD_FRAMING && (data[size - 1] & 1)) {
        copy = malloc(size);
        memcpy(copy, data, size);
        fix_crcs(copy, size);
        data = copy;
    }
    char path[64];
    fuzz_write_file(path, sizeof path, "tfrecord", ".tfrecord", data, size);
    open_and_decode(path, "image", "label");
    open_and_decode(path, "x", "y");
    ct_err err = {0};
    FILE *devnull = fopen("/dev/null", "w");
    int rc = ct_tfrecord_info(path, devnull, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    fclose(devnull);
    const char *why;
    ct_tfx_each(data, size, visit, NULL, &why); /* the protobuf reader without the framing */
    free(copy);
    unlink(path);
    return 0;
}

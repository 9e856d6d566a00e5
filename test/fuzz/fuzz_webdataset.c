/* fuzz_webdataset.c: libFuzzer harness for the WebDataset tar reader (core/data/webdataset.c):
 * the input is one .tar shard, opened with "image": "npy" when it holds a .npy magic anywhere,
 * else "jpg" when it holds ".jpg", else "png" (labels from .cls). Opening, decoding every sample (floats and, for 8-bit images,
 * raw pixels) and `ctrain info`'s walk must succeed or fail with CT_ERR_DATA, never crash or read
 * outside a buffer. Seeds: test/fuzz/seeds-fuzz_webdataset/ (small shards made with Python's
 * tarfile through test/make_wds.py's helpers: pax with a long name, GNU with a long name, ustar
 * with .npy arrays, ustar with .jpg images; the end-of-archive blocks left off to stay under
 * -max_len). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test/fuzz/fuzz_decode.h"
#include "test/fuzz/fuzz_file.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/webdataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The header checksum stops nearly every mutation of a header; half of the runs (the last byte's
 * low bit) rewrite the checksum of each header the reader will visit, so the fields behind it get
 * fuzzed. */
static void fix_checksums(uint8_t *p, size_t n) {
    for (size_t off = 0; off + 512 <= n;) {
        uint8_t *h = p + off;
        unsigned sum = 0;
        for (int i = 0; i < 512; i++) sum += (i >= 148 && i < 156) ? ' ' : h[i];
        if (!sum || sum == 8 * ' ') return;
        snprintf((char *)h + 148, 8, "%06o", sum);
        h[155] = ' ';
        char field[13];
        memcpy(field, h + 124, 12);
        field[12] = '\0';
        char *end;
        unsigned long long size = strtoull(field, &end, 8);
        if (end == field || size > n) return;
        off += 512 + (size_t)((size + 511) / 512 * 512);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = NULL;
    if (size > 512 && (data[size - 1] & 1)) {
        copy = malloc(size);
        memcpy(copy, data, size);
        fix_checksums(copy, size);
        data = copy;
    }
    char path[64];
    fuzz_write_file(path, sizeof path, "webdataset", ".tar", data, size);
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", "webdataset");
    cJSON_AddStringToObject(e, "urls", path);
    cJSON_AddStringToObject(e, "image", memmem(data, size, "\x93NUMPY", 6) ? "npy" : memmem(data, size, ".jpg", 4) ? "jpg" : "png");
    ct_dataset *ds = NULL;
    ct_err err = {0};
    int rc = ct_webdataset_open(&cfg, e, "data.train", &ds, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    if (ds) {
        fuzz_decode_samples(ds, 1 << 20, 256);
        ct_dataset_close(ds);
    }
    FILE *devnull = fopen("/dev/null", "w");
    rc = ct_webdataset_info(path, devnull, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    fclose(devnull);
    cJSON_Delete(e);
    free(copy);
    unlink(path);
    return 0;
}

/* fuzz_idx.c: libFuzzer harness for the IDX reader (core/data/idx.c). Input: 2 bytes (big-endian
 * length L of the images file), L bytes of images file, the rest the labels file (either may be
 * gzip). Opening and decoding every sample must succeed or fail with CT_ERR_DATA; never crash.
 * Seeds: test/fuzz/seeds-fuzz_idx/ (valid small pairs, plain and gzip). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void dump(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t li = (size_t)data[0] << 8 | data[1];
    if (li > size - 2) li = size - 2;
    char ip[64], lp[64];
    snprintf(ip, sizeof ip, "/tmp/fuzz_idx_%d_images", (int)getpid());
    snprintf(lp, sizeof lp, "/tmp/fuzz_idx_%d_labels", (int)getpid());
    dump(ip, data + 2, li);
    dump(lp, data + 2 + li, size - 2 - li);
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", "idx");
    cJSON_AddStringToObject(e, "images", ip);
    cJSON_AddStringToObject(e, "labels", lp);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    int rc = ct_idx_open(&cfg, e, "data.train", &ds, &err);
    /* idx.c allocates what the header declares before reading (up to 2^38 elements), so a tiny
     * file can ask for terabytes: run with ASAN_OPTIONS=allocator_may_return_null=1 and
     * FUZZ_FLAGS="-rss_limit_mb=0 -malloc_limit_mb=0"; that failure is "out of memory". */
    if (rc != CT_OK && rc != CT_ERR_DATA && !(rc == CT_ERR_RUNTIME && strstr(err.msg, "out of memory")))
        abort();
    if (ds) {
        int64_t numel = ct_shape_numel(&ds->sample_shape);
        float *x = malloc((size_t)numel * sizeof *x);
        for (int64_t i = 0; i < ds->count && i < 256; i++) {
            int32_t y;
            if (ds->decode(ds, i, x, &y, &err) != CT_OK) abort();
        }
        free(x);
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
    return 0;
}

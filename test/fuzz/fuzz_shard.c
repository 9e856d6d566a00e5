/* fuzz_shard.c: libFuzzer harness for the shard reader (core/data/shard.c): the input is one
 * .cts file. Opening and decoding every record must succeed or fail with CT_ERR_DATA, never
 * crash or read outside the mapping. Seeds: test/fuzz/seeds-fuzz_shard/ (small valid shards,
 * plain and zlib-compressed, u8 and f32). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_shard_%d.cts", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", "shard");
    cJSON_AddStringToObject(e, "path", path);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    int rc = ct_shard_open(&cfg, e, "data.train", &ds, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    if (ds) {
        int64_t numel = ct_shape_numel(&ds->sample_shape);
        if (numel <= (1 << 20)) {
            float *x = malloc((size_t)numel * sizeof *x);
            for (int64_t i = 0; i < ds->count && i < 256; i++) {
                int32_t y;
                rc = ds->decode(ds, i, x, &y, &err);
                if (rc != CT_OK && rc != CT_ERR_DATA) abort();
            }
            free(x);
        }
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
    return 0;
}

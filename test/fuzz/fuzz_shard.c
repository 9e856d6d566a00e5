/* fuzz_shard.c: libFuzzer harness for the shard reader (core/data/shard.c): the input is one
 * .cts file. Opening and decoding every record must succeed or fail with CT_ERR_DATA, never
 * crash or read outside the mapping. Seeds: test/fuzz/seeds-fuzz_shard/ (small valid shards,
 * plain and zlib-compressed, u8 and f32). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "test/fuzz/fuzz_decode.h"
#include "test/fuzz/fuzz_file.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The checksums stop nearly every mutation at open; half of the runs repair them (records whose
 * index entry is in bounds, the index, the header) so the bounds checks and decoding get fuzzed. */
static void fix_crcs(uint8_t *p, size_t n) {
    if (n < 64) return;
    uint64_t count = rd32(p + 16) | (uint64_t)rd32(p + 20) << 32;
    uint64_t ioff = rd32(p + 24) | (uint64_t)rd32(p + 28) << 32;
    if (ioff <= n && count <= (n - ioff) / 32) {
        for (uint64_t r = 0; r < count; r++) {
            uint8_t *e = p + ioff + 32 * r;
            uint64_t off = rd32(e) | (uint64_t)rd32(e + 4) << 32, len = rd32(e + 8);
            if (off <= n && len <= n - off) wr32(e + 16, (uint32_t)crc32(0, p + off, (uInt)len));
        }
        wr32(p + 56, (uint32_t)crc32(0, p + ioff, (uInt)(32 * count)));
    }
    wr32(p + 60, (uint32_t)crc32(0, p, 60));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = NULL;
    if (size > 64 && (data[size - 1] & 1)) {
        copy = malloc(size);
        memcpy(copy, data, size);
        fix_crcs(copy, size);
        data = copy;
    }
    char path[64];
    fuzz_write_file(path, sizeof path, "shard", ".cts", data, size);
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
        fuzz_decode_samples(ds, 1 << 20, 256);
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
    free(copy);
    return 0;
}

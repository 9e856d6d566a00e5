/* fuzz_idx.c: libFuzzer harness for the IDX reader (core/data/idx.c). Input: 2 bytes (big-endian
 * length L of the images file), L bytes of images file, the rest the labels file (either may be
 * gzip). Opening and decoding every sample must succeed or fail with CT_ERR_DATA; never crash.
 * Seeds: test/fuzz/seeds-fuzz_idx/ (valid small pairs, plain and gzip). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void dump(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
}

/* Bytes the IDX header at p (plain or gzip) declares; 0 when it cannot tell. */
static uint64_t declared_bytes(const uint8_t *p, size_t n) {
    uint8_t h[4 + 4 * 255];
    size_t got = 0;
    if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        z_stream z;
        memset(&z, 0, sizeof z);
        if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return 0;
        z.next_in = (Bytef *)p;
        z.avail_in = (uInt)n;
        z.next_out = h;
        z.avail_out = sizeof h;
        inflate(&z, Z_SYNC_FLUSH);
        got = sizeof h - z.avail_out;
        inflateEnd(&z);
    } else {
        got = n < sizeof h ? n : sizeof h;
        memcpy(h, p, got);
    }
    if (got < 4) return 0;
    uint64_t total = h[2] == 0x08 || h[2] == 0x09 ? 1 : h[2] == 0x0B ? 2 : h[2] == 0x0E ? 8 : 4;
    for (int d = 0; d < h[3] && 4 + 4 * (size_t)d + 4 <= got; d++) {
        const uint8_t *q = h + 4 + 4 * d;
        total *= (uint64_t)q[0] << 24 | (uint64_t)q[1] << 16 | (uint64_t)q[2] << 8 | q[3];
        if (total > ((uint64_t)1 << 40)) return total;
    }
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t li = (size_t)data[0] << 8 | data[1];
    if (li > size - 2) li = size - 2;
    /* idx.c bounds what it allocates by the file size (a .gz file may still declare up to ~1000x
     * its size, test/fuzz/regress/idx-oom-huge-header.bin was the original finding). Skip inputs
     * declaring more than 16 MB so the fuzzer explores instead of filling ASan's shadow. */
    if (declared_bytes(data + 2, li) > (1u << 24) || declared_bytes(data + 2 + li, size - 2 - li) > (1u << 24))
        return 0;
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
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    if (ds) {
        int64_t numel = ct_shape_numel(&ds->sample_shape);
        float *x = malloc((size_t)numel * sizeof *x);
        uint8_t *px = malloc((size_t)numel);
        for (int64_t i = 0; i < ds->count && i < 256; i++) {
            int32_t y;
            if (ds->decode(ds, i, x, &y, &err) != CT_OK) abort();
            /* data.transform.on_device's raw pixels: same validation, never an error after open */
            if (ds->decode_u8 && ds->decode_u8(ds, i, px, &y, &err) != CT_OK) abort();
        }
        free(x);
        free(px);
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
    return 0;
}

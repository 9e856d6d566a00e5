/* fuzz_png.c: libFuzzer harness for the PNG decoder (core/data/png.c): any input must decode or
 * fail with CT_ERR_DATA, without crashes, leaks or reads outside the buffer. */
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "core/data/pngdec.h"

/* libpng is not instrumented, so coverage cannot guide mutations past its chunk CRC checks:
 * half of the runs repair every chunk's CRC first, so mutated chunk contents reach the parsers. */
static void fix_crcs(uint8_t *p, size_t n) {
    size_t off = 8;
    while (off + 12 <= n) {
        uint32_t len = (uint32_t)p[off] << 24 | (uint32_t)p[off + 1] << 16 | (uint32_t)p[off + 2] << 8 | p[off + 3];
        if (len > n - off - 12) break;
        uint32_t c = (uint32_t)crc32(0, p + off + 4, len + 4);
        for (int i = 0; i < 4; i++) p[off + 8 + len + i] = (uint8_t)(c >> (24 - 8 * i));
        off += 12 + (size_t)len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, so reads past the end hit ASan's redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    if (size > 8 && (data[size - 1] & 1)) fix_crcs(buf, size);
    ct_image8 im = {0};
    ct_err err = {0};
    int h, w, c;
    if (ct_png_info(buf, size, "fuzz.png", &h, &w, &c, &err) == CT_OK) {
        for (int ch = 0; ch <= 4; ch += 3) {
            int rc = ct_png_decode(buf, size, "fuzz.png", ch, 1 << 22, &im, &err);
            if (rc != CT_OK && rc != CT_ERR_DATA) abort();
            if (rc == CT_OK && (im.h != h || im.w != w)) abort();
        }
    }
    ct_image8_free(&im);
    free(buf);
    return 0;
}

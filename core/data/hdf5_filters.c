/* hdf5_filters.c: deflate, shuffle and fletcher32 on read (hdf5_filters.h). */
#include "core/data/hdf5_filters.h"

#include <stdio.h>
#include <zlib.h>

bool ct_h5_inflate(const uint8_t *src, size_t n, uint8_t *dst, size_t cap, size_t *out, char *why, size_t why_n) {
    z_stream z = {0};
    *out = 0;
    if (inflateInit(&z) != Z_OK) {
        snprintf(why, why_n, "zlib cannot start (out of memory?)");
        return false;
    }
    /* zlib counts in uInt: feed and drain in pieces below 4 GiB */
    const uint8_t *in = src;
    size_t in_left = n, out_left = cap;
    int rc = Z_OK;
    while (rc == Z_OK) {
        uInt give = in_left > (1u << 30) ? 1u << 30 : (uInt)in_left;
        uInt room = out_left > (1u << 30) ? 1u << 30 : (uInt)out_left;
        z.next_in = (Bytef *)in;
        z.avail_in = give;
        z.next_out = dst + (cap - out_left);
        z.avail_out = room;
        rc = inflate(&z, Z_NO_FLUSH);
        in += give - z.avail_in;
        in_left -= give - z.avail_in;
        out_left -= room - z.avail_out;
        if (rc == Z_OK && z.avail_out == 0 && out_left == 0) {
            /* full: more output means the chunk is larger than it can be */
            uint8_t probe;
            z.next_out = &probe;
            z.avail_out = 1;
            rc = inflate(&z, Z_NO_FLUSH);
            if (rc == Z_STREAM_END && z.avail_out == 1) break;
            snprintf(why, why_n, "deflate: it decompresses to more than the %zu bytes of a chunk", cap);
            inflateEnd(&z);
            return false;
        }
        if (rc == Z_OK && z.avail_in == 0 && in_left == 0) rc = Z_BUF_ERROR; /* input ended mid-stream */
    }
    inflateEnd(&z);
    if (rc != Z_STREAM_END) {
        snprintf(why, why_n, "deflate: %s", rc == Z_BUF_ERROR ? "the compressed stream ends early"
                                             : z.msg ? z.msg : "corrupt compressed data");
        return false;
    }
    *out = cap - out_left;
    return true;
}

void ct_h5_unshuffle(const uint8_t *src, size_t n, size_t elem, uint8_t *dst) {
    if (elem < 2 || n < elem) {
        for (size_t i = 0; i < n; i++) dst[i] = src[i];
        return;
    }
    size_t count = n / elem;
    for (size_t b = 0; b < elem; b++) {
        const uint8_t *plane = src + b * count; /* byte b of every element */
        for (size_t i = 0; i < count; i++) dst[i * elem + b] = plane[i];
    }
    for (size_t i = count * elem; i < n; i++) dst[i] = src[i];
}

uint32_t ct_h5_fletcher32(const uint8_t *p, size_t n) {
    uint32_t a = 0, b = 0;
    size_t words = n / 2;
    /* 360 words keep both sums below 2^32 before folding (HDF5 folds at the same points; the
     * fold, not a true mod 65535, is what the stored checksums hold) */
    while (words) {
        size_t run = words > 360 ? 360 : words;
        words -= run;
        for (size_t i = 0; i < run; i++, p += 2) {
            a += (uint32_t)p[0] << 8 | p[1];
            b += a;
        }
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    if (n & 1) {
        a += (uint32_t)p[0] << 8;
        b += a;
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    a = (a & 0xffff) + (a >> 16);
    b = (b & 0xffff) + (b >> 16);
    return b << 16 | a;
}

bool ct_h5_fletcher32_check(const uint8_t *p, size_t n, size_t *n_out) {
    *n_out = 0;
    if (n < 4) return false;
    size_t body = n - 4;
    uint32_t stored = (uint32_t)p[body] | (uint32_t)p[body + 1] << 8 | (uint32_t)p[body + 2] << 16 |
                      (uint32_t)p[body + 3] << 24;
    uint32_t sum = ct_h5_fletcher32(p, body);
    uint32_t swapped = __builtin_bswap32(sum);
    *n_out = body;
    return stored == sum || stored == swapped;
}

/* pngdec.h: PNG decoding from memory into 8-bit interleaved pixels (libpng).
 *
 * Every PNG colour type and bit depth (gray, gray+alpha, RGB, RGBA, palette with or without
 * tRNS; 1/2/4/8/16-bit; Adam7 interlaced) is converted by libpng's transforms to the requested
 * channel count: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA (0: the image's own). Corrupt or truncated
 * input returns CT_ERR_DATA naming the file; no input makes it crash or leak. */
#ifndef CT_DATA_PNGDEC_H
#define CT_DATA_PNGDEC_H

#include <stddef.h>
#include <stdint.h>

#include "core/util/common.h"

typedef struct ct_image8 {
    int h, w, c;
    uint8_t *px;                 /* [h, w, c] */
    size_t cap;                  /* bytes allocated at px: reused by the next decode */
} ct_image8;

/* Native geometry from the header: *channels is what decoding with channels 0 gives. */
int ct_png_info(const void *buf, size_t len, const char *name, int *h, int *w, int *channels,
                ct_err *err);
/* Decode into out (out->px is reused when large enough, else reallocated). Images whose decoded
 * size exceeds max_bytes are refused as CT_ERR_DATA. */
int ct_png_decode(const void *buf, size_t len, const char *name, int channels, size_t max_bytes,
                  ct_image8 *out, ct_err *err);
void ct_image8_free(ct_image8 *im);
/* img's interleaved pixels [h, w, c] as planes [c, h, w]: the bytes themselves into u8 when it is
 * not NULL, else lut[256 * ch + v] into f32 (lut: [c][256], the normalised value of each byte). */
void ct_image8_planar(const ct_image8 *img, const float *lut, uint8_t *u8, float *f32);

/* Read a whole file into *buf (reallocated when *cap is too small); *len = its size. */
int ct_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len, ct_err *err);

#endif

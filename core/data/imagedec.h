/* imagedec.h: encoded images in memory, told apart by their signature: PNG (png.c, libpng) and
 * JPEG (jpeg.c, Debian's libjpeg-turbo), decoded into the 8-bit interleaved pixels of pngdec.h.
 *
 * The same contract as ct_png_info / ct_png_decode: channels 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA
 * (0: the image's own; a JPEG's own is 1 for grayscale, else 3, and its alpha is 255); corrupt or
 * truncated input is CT_ERR_DATA naming `name`, never a crash or a leak. */
#ifndef CT_DATA_IMAGEDEC_H
#define CT_DATA_IMAGEDEC_H

#include <stdbool.h>
#include <stddef.h>

#include "core/data/pngdec.h"

typedef enum { CT_IMAGE_UNKNOWN, CT_IMAGE_PNG, CT_IMAGE_JPEG } ct_image_format;

/* The format by the first bytes (PNG's 8-byte signature, JPEG's SOI marker FF D8 FF). */
ct_image_format ct_image_sniff(const void *buf, size_t len);

int ct_jpeg_info(const void *buf, size_t len, const char *name, int *h, int *w, int *channels, ct_err *err);
int ct_jpeg_decode(const void *buf, size_t len, const char *name, int channels, size_t max_bytes,
                   ct_image8 *out, ct_err *err);

/* PNG or JPEG by ct_image_sniff; anything else is CT_ERR_DATA ("not a PNG or JPEG image"). */
int ct_image_info(const void *buf, size_t len, const char *name, int *h, int *w, int *channels, ct_err *err);
int ct_image_decode(const void *buf, size_t len, const char *name, int channels, size_t max_bytes,
                    ct_image8 *out, ct_err *err);

#endif

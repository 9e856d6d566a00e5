/* test_jpeg.c: JPEG decoding (core/data/jpeg.c, libjpeg-turbo) of gray and colour images to every
 * channel count, told apart from PNG by signature; corrupt and truncated files fail with
 * CT_ERR_DATA naming the file. The JPEGs are written here with libjpeg's compressor from random
 * smooth pixels (the decode is lossy: pixels are compared with a tolerance; the byte-exact check
 * against Pillow's decode is test_datasets' test_jpeg_inputs). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "core/data/imagedec.h"

/* A JPEG of an h x w image with c (1 or 3) channels, quality 95; *n its bytes (caller frees). */
static uint8_t *encode(const uint8_t *px, int h, int w, int c, unsigned long *n) {
    struct jpeg_compress_struct cinfo;
    struct jpeg_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&cinfo);
    unsigned char *out = NULL;
    *n = 0;
    jpeg_mem_dest(&cinfo, &out, n);
    cinfo.image_width = (JDIMENSION)w;
    cinfo.image_height = (JDIMENSION)h;
    cinfo.input_components = c;
    cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, 95, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)cinfo.next_scanline * (size_t)w * (size_t)c);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    return out;
}

/* Smooth random pixels (JPEG keeps them within a few levels). */
static uint8_t *smooth(int h, int w, int c, unsigned seed) {
    srand(seed);
    uint8_t *px = malloc((size_t)h * w * c);
    int base[3] = {rand() % 128, rand() % 128, rand() % 128};
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++) px[((size_t)y * w + x) * c + k] = (uint8_t)(base[k] + 2 * y + x + rand() % 4);
    return px;
}

static double mean_abs(const uint8_t *a, const uint8_t *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += abs((int)a[i] - (int)b[i]);
    return s / (double)n;
}

START_TEST(jpeg_gray_and_rgb) {
    for (int c = 1; c <= 3; c += 2) {
        int h = 19, w = 23; /* not multiples of the 8x8 blocks */
        uint8_t *px = smooth(h, w, c, 7u + (unsigned)c);
        unsigned long n;
        uint8_t *jpg = encode(px, h, w, c, &n);
        ck_assert_int_eq(ct_image_sniff(jpg, n), CT_IMAGE_JPEG);
        int ih, iw, ic;
        ct_err err = {0};
        ck_assert_msg(ct_image_info(jpg, n, "a.jpg", &ih, &iw, &ic, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(ih, h);
        ck_assert_int_eq(iw, w);
        ck_assert_int_eq(ic, c);
        ct_image8 img = {0}, other = {0};
        ck_assert_msg(ct_image_decode(jpg, n, "a.jpg", 0, 1 << 20, &img, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(img.c, c);
        ck_assert_double_lt(mean_abs(img.px, px, (size_t)h * w * c), 2.0);
        /* every other channel count: gray (+ alpha 255) or RGB (+ alpha 255), consistent with each other */
        ct_image8 gray = {0}, rgb = {0};
        ck_assert_int_eq(ct_image_decode(jpg, n, "a.jpg", 1, 1 << 20, &gray, &err), CT_OK);
        ck_assert_int_eq(ct_image_decode(jpg, n, "a.jpg", 3, 1 << 20, &rgb, &err), CT_OK);
        for (int want = 2; want <= 4; want += 2) {
            ck_assert_msg(ct_image_decode(jpg, n, "a.jpg", want, 1 << 20, &other, &err) == CT_OK, "%s", err.msg);
            ck_assert_int_eq(other.c, want);
            const ct_image8 *base = want == 2 ? &gray : &rgb;
            for (size_t j = 0; j < (size_t)h * w; j++) {
                for (int k = 0; k < want - 1; k++) ck_assert_int_eq(other.px[j * want + k], base->px[j * (want - 1) + k]);
                ck_assert_int_eq(other.px[j * want + want - 1], 255);
            }
        }
        if (c == 1) /* a gray JPEG decoded to RGB: three equal channels */
            for (size_t j = 0; j < (size_t)h * w; j++) ck_assert(rgb.px[3 * j] == rgb.px[3 * j + 1] && rgb.px[3 * j] == rgb.px[3 * j + 2]);
        /* the decode limit */
        ck_assert_int_eq(ct_image_decode(jpg, n, "a.jpg", 0, 100, &other, &err), CT_ERR_DATA);
        ck_assert_msg(strstr(err.msg, "a.jpg: an image larger than the decode limit"), "%s", err.msg);
        ct_image8_free(&img);
        ct_image8_free(&other);
        ct_image8_free(&gray);
        ct_image8_free(&rgb);
        free(jpg);
        free(px);
    }
}
END_TEST

/* Every truncation and many flipped bytes fail cleanly or decode (never crash); a cut before the
 * end of the data always fails (libjpeg's "premature end" warning is an error here). */
START_TEST(jpeg_corrupt) {
    uint8_t *px = smooth(32, 32, 3, 3);
    unsigned long n;
    uint8_t *jpg = encode(px, 32, 32, 3, &n);
    ct_image8 img = {0};
    ct_err err = {0};
    for (unsigned long cut = 0; cut < n - 2; cut += 7) {
        ck_assert_int_eq(ct_image_decode(jpg, cut, "cut.jpg", 3, 1 << 20, &img, &err), CT_ERR_DATA);
        ck_assert_msg(strstr(err.msg, "cut.jpg: "), "%s", err.msg);
    }
    uint8_t *bad = malloc(n);
    srand(5);
    for (int t = 0; t < 300; t++) {
        memcpy(bad, jpg, n);
        for (int k = 0; k < 3; k++) bad[rand() % n] ^= (uint8_t)(1 + rand() % 255);
        int rc = ct_image_decode(bad, n, "flip.jpg", 0, 1 << 20, &img, &err);
        ck_assert(rc == CT_OK || rc == CT_ERR_DATA);
    }
    ck_assert_int_eq(ct_image_decode("GIF89a....", 10, "x.gif", 0, 1 << 20, &img, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "x.gif: not a PNG or JPEG image"), "%s", err.msg);
    ct_image8_free(&img);
    free(bad);
    free(jpg);
    free(px);
}
END_TEST

int main(void) {
    Suite *s = suite_create("jpeg");
    TCase *tc = tcase_create("jpeg");
    tcase_add_test(tc, jpeg_gray_and_rgb);
    tcase_add_test(tc, jpeg_corrupt);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

/* test_png.c: PNG decoding of every colour type and bit depth, interlaced or not, to every
 * channel count; corrupt and truncated files fail with CT_ERR_DATA naming the file. The PNGs are
 * written here with libpng from random pixels. */
#include <check.h>
#include <math.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/pngdec.h"

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static void mem_write(png_structp png, png_bytep data, size_t n) {
    membuf *m = png_get_io_ptr(png);
    if (m->n + n > m->cap) {
        m->cap = (m->n + n) * 2;
        m->p = realloc(m->p, m->cap);
    }
    memcpy(m->p + m->n, data, n);
    m->n += n;
}
static void mem_flush(png_structp png) { (void)png; }

/* A random test image: samples at the stored depth, plus what each pixel is in 8-bit RGBA. */
typedef struct test_img {
    int w, h, color, depth, interlace;
    int filter;                  /* PNG_FILTER_* to force, 0: libpng's choice */
    bool trns;                   /* palette with a tRNS chunk */
    uint16_t *s;                 /* [h, w, stored channels] sample values */
    uint8_t rgba[256][4];        /* palette */
    int npal;
    membuf png;
} test_img;

static int stored_channels(int color) {
    switch (color) {
    case PNG_COLOR_TYPE_GRAY: case PNG_COLOR_TYPE_PALETTE: return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    default: return 4;
    }
}

static uint8_t to8(uint16_t v, int depth) {
    if (depth == 16) return (uint8_t)((v * 255L + 32895L) >> 16);
    return (uint8_t)(v * 255 / ((1 << depth) - 1));
}

/* Expected 8-bit RGBA of pixel (y, x). */
static void expect_rgba(const test_img *t, int y, int x, int out[4]) {
    int sc = stored_channels(t->color);
    const uint16_t *s = t->s + ((size_t)y * t->w + x) * sc;
    if (t->color == PNG_COLOR_TYPE_PALETTE) {
        for (int k = 0; k < 4; k++) out[k] = t->rgba[s[0]][k];
        if (!t->trns) out[3] = 255;
        return;
    }
    bool color = sc >= 3;
    int g0 = to8(s[0], t->depth);
    out[0] = g0;
    out[1] = color ? to8(s[1], t->depth) : g0;
    out[2] = color ? to8(s[2], t->depth) : g0;
    out[3] = (sc == 2 || sc == 4) ? to8(s[sc - 1], t->depth) : 255;
}

static void make_png(test_img *t, unsigned seed) {
    srand(seed);
    int sc = stored_channels(t->color), maxv = (1 << t->depth) - 1;
    t->npal = 1 << (t->depth < 8 ? t->depth : 8);
    t->s = malloc((size_t)t->w * t->h * sc * sizeof *t->s);
    for (int i = 0; i < t->w * t->h * sc; i++)
        t->s[i] = (uint16_t)(t->color == PNG_COLOR_TYPE_PALETTE ? rand() % t->npal : rand() % (maxv + 1));
    png_color pal[256];
    png_byte alpha[256];
    for (int i = 0; i < t->npal; i++) {
        for (int k = 0; k < 4; k++) t->rgba[i][k] = (uint8_t)(rand() & 255);
        pal[i] = (png_color){t->rgba[i][0], t->rgba[i][1], t->rgba[i][2]};
        alpha[i] = t->rgba[i][3];
    }
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    memset(&t->png, 0, sizeof t->png);
    png_set_write_fn(png, &t->png, mem_write, mem_flush);
    png_set_IHDR(png, info, (png_uint_32)t->w, (png_uint_32)t->h, t->depth, t->color,
                 t->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (t->color == PNG_COLOR_TYPE_PALETTE) {
        png_set_PLTE(png, info, pal, t->npal);
        if (t->trns) png_set_tRNS(png, info, alpha, t->npal, NULL);
    }
    if (t->filter) png_set_filter(png, 0, t->filter);
    png_write_info(png, info);
    if (t->depth < 8) png_set_packing(png);
    if (t->depth == 16) png_set_swap(png); /* rows below are little-endian uint16 */
    size_t rowb = (size_t)t->w * sc * (t->depth == 16 ? 2 : 1);
    png_bytep *rows = malloc(t->h * sizeof *rows);
    uint8_t *data = malloc(rowb * t->h);
    for (int y = 0; y < t->h; y++) {
        rows[y] = data + y * rowb;
        for (int i = 0; i < t->w * sc; i++) {
            uint16_t v = t->s[(size_t)y * t->w * sc + i];
            if (t->depth == 16) memcpy(rows[y] + 2 * i, &v, 2);
            else rows[y][i] = (uint8_t)v;
        }
    }
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    free(data);
}

static void check_decode(test_img *t, int channels) {
    ct_image8 im = {0};
    ct_err err = {0};
    int rc = ct_png_decode(t->png.p, t->png.n, "mem.png", channels, 1 << 24, &im, &err);
    ck_assert_msg(rc == CT_OK, "color %d depth %d interlace %d -> %d channels: %s", t->color, t->depth,
                  t->interlace, channels, err.msg);
    ck_assert_int_eq(im.w, t->w);
    ck_assert_int_eq(im.h, t->h);
    int c = im.c;
    if (channels) ck_assert_int_eq(c, channels);
    for (int y = 0; y < t->h; y++)
        for (int x = 0; x < t->w; x++) {
            int e[4];
            expect_rgba(t, y, x, e);
            const uint8_t *p = im.px + ((size_t)y * t->w + x) * c;
            int want[4], n = 0;
            bool src_color = (t->color & PNG_COLOR_MASK_COLOR) != 0;
            if (c <= 2) {
                want[n++] = src_color ? (int)lround(0.2126 * e[0] + 0.7152 * e[1] + 0.0722 * e[2]) : e[0];
            } else {
                want[n++] = e[0];
                want[n++] = e[1];
                want[n++] = e[2];
            }
            if (c == 2 || c == 4) want[n++] = e[3];
            int tol = src_color && c <= 2 ? 2 : (t->depth == 16 ? 1 : 0);
            for (int k = 0; k < c; k++)
                ck_assert_msg(abs(p[k] - want[k]) <= tol,
                              "color %d depth %d interlace %d ch %d: pixel (%d,%d)[%d] = %d, want %d",
                              t->color, t->depth, t->interlace, c, y, x, k, p[k], want[k]);
        }
    ct_image8_free(&im);
}

static const struct { int color, depth; bool trns; } kinds[] = {
    {PNG_COLOR_TYPE_GRAY, 1, 0}, {PNG_COLOR_TYPE_GRAY, 2, 0}, {PNG_COLOR_TYPE_GRAY, 4, 0},
    {PNG_COLOR_TYPE_GRAY, 8, 0}, {PNG_COLOR_TYPE_GRAY, 16, 0}, {PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0},
    {PNG_COLOR_TYPE_GRAY_ALPHA, 16, 0}, {PNG_COLOR_TYPE_RGB, 8, 0}, {PNG_COLOR_TYPE_RGB, 16, 0},
    {PNG_COLOR_TYPE_RGB_ALPHA, 8, 0}, {PNG_COLOR_TYPE_RGB_ALPHA, 16, 0},
    {PNG_COLOR_TYPE_PALETTE, 1, 0}, {PNG_COLOR_TYPE_PALETTE, 2, 0}, {PNG_COLOR_TYPE_PALETTE, 4, 0},
    {PNG_COLOR_TYPE_PALETTE, 8, 0}, {PNG_COLOR_TYPE_PALETTE, 8, 1}, {PNG_COLOR_TYPE_PALETTE, 4, 1},
};

START_TEST(test_every_kind) {
    int k = _i / 2;
    test_img t = {.w = 13, .h = 11, .color = kinds[k].color, .depth = kinds[k].depth,
                  .trns = kinds[k].trns, .interlace = _i % 2};
    make_png(&t, 1000u + (unsigned)_i);
    int h, w, c;
    ct_err err = {0};
    ck_assert_int_eq(ct_png_info(t.png.p, t.png.n, "mem.png", &h, &w, &c, &err), CT_OK);
    ck_assert_int_eq(h, 11);
    ck_assert_int_eq(w, 13);
    for (int ch = 0; ch <= 4; ch++) check_decode(&t, ch);
    free(t.s);
    free(t.png.p);
}
END_TEST

/* Each row filter alone (8-bit images take the one-inflate fast path in png.c). */
START_TEST(test_filters) {
    static const int filters[] = {PNG_FILTER_NONE, PNG_FILTER_SUB, PNG_FILTER_UP, PNG_FILTER_AVG,
                                  PNG_FILTER_PAETH};
    static const int colors[] = {PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                 PNG_COLOR_TYPE_RGB_ALPHA};
    for (int f = 0; f < 5; f++)
        for (int c = 0; c < 4; c++) {
            test_img t = {.w = 17, .h = 9, .color = colors[c], .depth = 8, .filter = filters[f]};
            make_png(&t, 50u + (unsigned)(f * 4 + c));
            check_decode(&t, 0);
            check_decode(&t, stored_channels(colors[c]));
            free(t.s);
            free(t.png.p);
        }
}
END_TEST

START_TEST(test_corrupt) {
    test_img t = {.w = 20, .h = 17, .color = PNG_COLOR_TYPE_RGB, .depth = 8};
    make_png(&t, 7);
    ct_image8 im = {0};
    ct_err err = {0};
    /* Every truncation fails cleanly (the decoder never reads past the buffer: ASan/valgrind). */
    for (size_t n = 0; n < t.png.n - 12; n += 7) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, t.png.p, n);
        int rc = ct_png_decode(cut, n, "cut.png", 3, 1 << 24, &im, &err);
        ck_assert_msg(rc == CT_ERR_DATA, "truncated to %zu bytes: rc %d", n, rc);
        ck_assert_msg(strstr(err.msg, "cut.png"), "%s", err.msg);
        free(cut);
    }
    /* A flipped byte inside the image data: the chunk CRC catches it. */
    uint8_t *bad = malloc(t.png.n);
    memcpy(bad, t.png.p, t.png.n);
    bad[t.png.n / 2] ^= 0x5a;
    ck_assert_int_eq(ct_png_decode(bad, t.png.n, "flip.png", 3, 1 << 24, &im, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "flip.png: corrupt PNG"), "%s", err.msg);
    /* Not a PNG at all. */
    memcpy(bad, "GIF89a..", 8);
    ck_assert_int_eq(ct_png_decode(bad, t.png.n, "x.gif", 3, 1 << 24, &im, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "x.gif: not a PNG"), "%s", err.msg);
    /* Too large for the caller's limit. */
    ck_assert_int_eq(ct_png_decode(t.png.p, t.png.n, "big.png", 3, 100, &im, &err), CT_ERR_DATA);
    ct_image8_free(&im);
    free(bad);
    free(t.s);
    free(t.png.p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("png");
    TCase *tc = tcase_create("decode");
    tcase_add_loop_test(tc, test_every_kind, 0, 2 * CT_ARRAY_LEN(kinds));
    tcase_add_test(tc, test_filters);
    tcase_add_test(tc, test_corrupt);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

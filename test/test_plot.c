/* test_plot.c: `ctrain plot`'s drawing (core/report/plot.h), read back with ctrain's own PNG decoder
 * (core/data/pngdec.h): the requested size, RGB; each series' colour drawn where its points are
 * (a rising curve's pixels bottom left and top right of its panel); a panel without data draws no
 * curve; sizes outside the limits and unwritable paths refused. Random data, never constant. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/pngdec.h"
#include "core/report/plot.h"

enum { TRAIN = 0x1F77B4, EVAL = 0xD62728, LR = 0xFF7F0E };

typedef struct decoded {
    int w, h;
    uint8_t *px;
    ct_image8 im;
} decoded;

static decoded read_png(const char *path) {
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    ct_err err = {0};
    ck_assert_int_eq(ct_read_file(path, &buf, &cap, &len, &err), CT_OK);
    decoded d = {0};
    int ch = 0;
    ck_assert_int_eq(ct_png_info(buf, len, path, &d.h, &d.w, &ch, &err), CT_OK);
    ck_assert_int_eq(ch, 3);
    ck_assert_int_eq(ct_png_decode(buf, len, path, 3, (size_t)1 << 30, &d.im, &err), CT_OK);
    d.px = d.im.px;
    free(buf);
    return d;
}

/* Pixels of colour rgb in [x0, x1) x [y0, y1). */
static long count(const decoded *d, uint32_t rgb, int x0, int y0, int x1, int y1) {
    long n = 0;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) {
            const uint8_t *p = d->px + ((size_t)y * (size_t)d->w + (size_t)x) * 3;
            n += p[0] == (uint8_t)(rgb >> 16) && p[1] == (uint8_t)(rgb >> 8) && p[2] == (uint8_t)rgb;
        }
    return n;
}

START_TEST(curves_where_their_points_are) {
    enum { N = 200 };
    double x[N], loss[N], lr[N], ex[5], ey[5];
    srand(3);
    for (int i = 0; i < N; i++) {
        x[i] = i + 1;
        loss[i] = 2.5 * exp(-i / 40.0) + 0.05 * rand() / RAND_MAX;        /* falling */
        lr[i] = 1e-3 * (i + 1) / N * (1 + 0.01 * rand() / RAND_MAX);      /* rising */
    }
    for (int i = 0; i < 5; i++) ex[i] = 40.0 * (i + 1), ey[i] = loss[(int)ex[i] - 1] + 0.1;
    ct_plot_panel panels[2] = {
        {.title = "loss", .n_series = 2, .series = {{.label = "train", .x = x, .y = loss, .n = N, .rgb = TRAIN},
                                                    {.label = "eval", .x = ex, .y = ey, .n = 5, .rgb = EVAL, .points = true}}},
        {.title = "learning rate", .n_series = 1, .series = {{.label = "lr", .x = x, .y = lr, .n = N, .rgb = LR}}},
    };
    char path[] = "/tmp/ct_test_plot_XXXXXX.png";
    int fd = mkstemps(path, 4);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ct_err err = {0};
    ck_assert_int_eq(ct_plot_png(panels, 2, "step", 640, 480, path, &err), CT_OK);
    decoded d = read_png(path);
    ck_assert_int_eq(d.w, 640);
    ck_assert_int_eq(d.h, 480);
    long white = count(&d, 0xFFFFFF, 0, 0, d.w, d.h);
    ck_assert_int_gt(white, (long)d.w * d.h / 2);   /* a white page with curves on it */
    /* the loss panel is the top half, the lr panel the bottom half */
    long train = count(&d, TRAIN, 0, 0, d.w, d.h / 2), eval = count(&d, EVAL, 0, 0, d.w, d.h / 2);
    long lrpx = count(&d, LR, 0, d.h / 2, d.w, d.h);
    ck_assert_int_gt(train, 600);   /* a 2-pixel line across the width, not just the legend box */
    ck_assert_int_gt(eval, 100);    /* five marked points and their lines */
    ck_assert_int_gt(lrpx, 600);
    ck_assert_int_eq(count(&d, LR, 0, 0, d.w, d.h / 2 - 20), 0);   /* each curve in its own panel */
    /* falling loss: its pixels at the left are high in the panel, at the right low; rising lr: the
     * other way round */
    int mid_top = d.h / 4, mid_bottom = 3 * d.h / 4, third = d.w / 3;
    ck_assert_int_gt(count(&d, TRAIN, 0, 20, third, mid_top), count(&d, TRAIN, 0, mid_top, third, d.h / 2));
    ck_assert_int_gt(count(&d, TRAIN, 2 * third, mid_top, d.w, d.h / 2), count(&d, TRAIN, 2 * third, 20, d.w, mid_top));
    ck_assert_int_gt(count(&d, LR, 2 * third, d.h / 2 + 20, d.w, mid_bottom), count(&d, LR, 2 * third, mid_bottom, d.w, d.h));
    ck_assert_int_gt(count(&d, LR, 0, mid_bottom, third, d.h), count(&d, LR, 0, d.h / 2 + 20, third, mid_bottom));
    ct_image8_free(&d.im);
    unlink(path);
}
END_TEST

/* A series whose values are all missing: its legend box, no curve. */
START_TEST(no_data_panel) {
    double x[3] = {1, 2, 3}, y[3] = {NAN, NAN, NAN}, y2[3] = {0.5, 0.4, 0.45};
    ct_plot_panel panels[2] = {
        {.title = "eval accuracy", .n_series = 1, .series = {{.label = "eval", .x = x, .y = y, .n = 3, .rgb = EVAL}}},
        {.title = "loss", .n_series = 1, .series = {{.label = "train", .x = x, .y = y2, .n = 3, .rgb = TRAIN}}},
    };
    char path[] = "/tmp/ct_test_plot_XXXXXX.png";
    int fd = mkstemps(path, 4);
    close(fd);
    ct_err err = {0};
    ck_assert_int_eq(ct_plot_png(panels, 2, "step", 320, 240, path, &err), CT_OK);
    decoded d = read_png(path);
    ck_assert_int_eq(d.w, 320);
    long eval = count(&d, EVAL, 0, 0, d.w, d.h);
    ck_assert_int_gt(eval, 0);
    ck_assert_int_le(eval, 12 * 7);   /* the legend box alone (scale 1: 12 x 7 pixels) */
    ck_assert_int_gt(count(&d, TRAIN, 0, d.h / 2, d.w, d.h), 12 * 7);
    ct_image8_free(&d.im);
    unlink(path);
}
END_TEST

START_TEST(refusals) {
    double x[2] = {1, 2}, y[2] = {1, 2};
    ct_plot_panel p = {.title = "loss", .n_series = 1, .series = {{.label = "train", .x = x, .y = y, .n = 2, .rgb = TRAIN}}};
    ct_err err = {0};
    ck_assert_int_eq(ct_plot_png(&p, 1, "step", 100, 480, "/tmp/x.png", &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "100x480"), "%s", err.msg);
    ck_assert_int_eq(ct_plot_png(&p, 1, "step", 640, 9000, "/tmp/x.png", &err), CT_ERR_CONFIG);
    ck_assert_int_eq(ct_plot_png(&p, 0, "step", 640, 480, "/tmp/x.png", &err), CT_ERR_CONFIG);
    ck_assert_int_eq(ct_plot_png(&p, 1, "step", 640, 480, "/nonexistent/dir/x.png", &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/nonexistent/dir/x.png"), "%s", err.msg);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plot");
    TCase *tc = tcase_create("plot");
    tcase_add_test(tc, curves_where_their_points_are);
    tcase_add_test(tc, no_data_panel);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

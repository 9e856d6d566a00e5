/* test_plot.c: `ctrain plot` and `compare` on synthetic run directories: the PNG decodes (with
 * ctrain's own decoder) to the requested size and holds each run's colour where its curves are
 * and nowhere else, a flat series and a single row still draw, a partial last line is skipped, a
 * corrupt line names its file and line, and compare sorts by eval loss and reads config.json. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/pngdec.h"
#include "core/report/canvas.h"
#include "core/report/plot.h"
#include "core/util/fs.h"

static char tmp[64];

/* A run directory `name` with `steps` train rows (a noisy decaying loss, a warm-up lr), an eval
 * row every 10 steps, a config.json, and `tail` appended verbatim to metrics.jsonl. */
static void make_run(const char *name, int steps, double lr, const char *tail, char *dir, size_t n) {
    snprintf(dir, n, "%s/%s", tmp, name);
    ck_assert_int_eq(ct_fs_mkdirs(dir, NULL), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int s = 1; s <= steps; s++) {
        double loss = 2.3 * exp(-s * lr * 20) + 0.3 + 0.05 * ((double)rand() / RAND_MAX - 0.5);
        fprintf(f, "{\"type\":\"train\",\"step\":%d,\"epoch\":1,\"loss\":%.6f,\"lr\":%.8f,\"wall_s\":%.3f}\n", s, loss,
                lr * (s < 20 ? s / 20.0 : 1.0), s * 0.01);
        if (s % 10 == 0)
            fprintf(f, "{\"type\":\"eval\",\"step\":%d,\"epoch\":1,\"eval_loss\":%.6f,\"eval_accuracy\":%.4f,"
                       "\"eval_perplexity\":null,\"wall_s\":1}\n", s, loss + 0.1, 1.0 - loss / 3.0);
    }
    fputs(tail, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"train_batch_size\": 64, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %g}},"
               " \"bf16\": {\"enabled\": true}, \"train\": {\"seed\": 7}}\n", lr);
    fclose(f);
}

static void decode(const char *path, ct_image8 *im) {
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    ct_err err = {0};
    ck_assert_msg(ct_read_file(path, &buf, &cap, &len, &err) == 0, "%s", err.msg);
    ck_assert_msg(ct_png_decode(buf, len, path, 3, (size_t)1 << 28, im, &err) == 0, "%s", err.msg);
    free(buf);
}

/* Pixels of exactly colour rgb. */
static long count_rgb(const ct_image8 *im, uint32_t rgb) {
    long n = 0;
    for (long i = 0; i < (long)im->h * im->w; i++) {
        const uint8_t *p = im->px + i * 3;
        n += p[0] == (rgb >> 16 & 0xff) && p[1] == (rgb >> 8 & 0xff) && p[2] == (rgb & 0xff);
    }
    return n;
}

START_TEST(plot_draws_each_run) {
    srand(3);
    char a[128], b[128], out[128];
    make_run("runA", 80, 0.001, "", a, sizeof a);
    make_run("runB", 80, 0.003, "{\"type\":\"train\",\"ste", b, sizeof b);   /* a run still writing */
    snprintf(out, sizeof out, "%s/two.png", tmp);
    const char *dirs[] = {a, b};
    ct_err err = {0};
    ck_assert_msg(ct_plot_runs(dirs, 2, out, 700, 500, NULL, &err) == 0, "%s", err.msg);
    ct_image8 im = {0};
    decode(out, &im);
    ck_assert_int_eq(im.w, 700);
    ck_assert_int_eq(im.h, 500);
    long blue = count_rgb(&im, 0x1f77b4), red = count_rgb(&im, 0xd62728), green = count_rgb(&im, 0x2ca02c);
    ck_assert_msg(blue > 300 && red > 300, "curves not drawn: %ld blue, %ld red pixels", blue, red);
    ck_assert_msg(green == 0, "a third colour for two runs: %ld pixels", green);
    ck_assert_msg(count_rgb(&im, 0xffffff) > 700L * 500 / 2, "the background is not mostly white");
    /* one run only: no red at all */
    const char *one[] = {a};
    ck_assert_msg(ct_plot_runs(one, 1, out, 300, 200, NULL, &err) == 0, "%s", err.msg);
    decode(out, &im);
    ck_assert_int_eq(im.w, 300);
    ck_assert_int_eq(count_rgb(&im, 0xd62728), 0);
    ck_assert_int_gt(count_rgb(&im, 0x1f77b4), 50);
    ct_image8_free(&im);
}
END_TEST

START_TEST(plot_edge_series) {
    char a[128], out[128];
    ct_err err = {0};
    snprintf(out, sizeof out, "%s/edge.png", tmp);
    make_run("single", 1, 0.001, "", a, sizeof a);   /* one row: no line, still a valid image */
    const char *dirs[] = {a};
    ck_assert_msg(ct_plot_runs(dirs, 1, out, 200, 150, NULL, &err) == 0, "%s", err.msg);
    char flat[128];
    snprintf(flat, sizeof flat, "%s/flat", tmp);
    ck_assert_int_eq(ct_fs_mkdirs(flat, NULL), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", flat);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= 5; s++) fprintf(f, "{\"type\":\"train\",\"step\":%d,\"loss\":1.5,\"lr\":0.1}\n", s);
    fclose(f);
    const char *fd[] = {flat};
    ck_assert_msg(ct_plot_runs(fd, 1, out, 200, 150, NULL, &err) == 0, "%s", err.msg);
    ct_image8 im = {0};
    decode(out, &im);
    ck_assert_int_gt(count_rgb(&im, 0x1f77b4), 20);
    ct_image8_free(&im);
}
END_TEST

START_TEST(plot_bad_input) {
    char a[128], out[128];
    ct_err err = {0};
    snprintf(out, sizeof out, "%s/bad.png", tmp);
    make_run("corrupt", 30, 0.001, "", a, sizeof a);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", a);
    FILE *f = fopen(path, "a");
    fputs("not json\n{\"type\":\"train\",\"step\":31,\"loss\":1}\n", f);
    fclose(f);
    const char *dirs[] = {a};
    /* a line that is not JSON (a record cut by a kill, a resume writing on after it) is skipped with a
     * warning naming it; the rows around it are plotted (it used to refuse the run) */
    ct_warnings warn = {0};
    ck_assert_msg(ct_plot_runs(dirs, 1, out, 200, 150, &warn, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(warn.n, 1);
    ck_assert_msg(strstr(warn.items[0], "metrics.jsonl:34: not a JSON object") && strstr(warn.items[0], "skipped"),
                  "%s", warn.items[0]);   /* 30 train + 3 eval rows, then it */
    ct_warnings_free(&warn);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/nowhere", tmp);
    const char *md[] = {missing};
    err = (ct_err){0};
    ck_assert_int_eq(ct_plot_runs(md, 1, out, 200, 150, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "run directory"), "%s", err.msg);
    char good[128];
    make_run("good", 10, 0.001, "", good, sizeof good);
    const char *gd[] = {good};
    err = (ct_err){0};
    ck_assert_int_eq(ct_plot_runs(gd, 1, "/nonexistent-dir/x.png", 200, 150, NULL, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/nonexistent-dir"), "%s", err.msg);
    err = (ct_err){0};
    ck_assert_int_eq(ct_plot_runs(gd, 1, out, 0, 150, NULL, &err), CT_ERR_CONFIG);
}
END_TEST

START_TEST(compare_sorts_and_reads_config) {
    srand(5);
    char a[128], b[128];
    make_run("slow", 60, 0.0005, "", a, sizeof a);
    make_run("fast", 60, 0.004, "", b, sizeof b);
    const char *dirs[] = {a, b};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ct_err err = {0};
    ck_assert_msg(ct_compare_runs(dirs, 2, f, NULL, &err) == 0, "%s", err.msg);
    fclose(f);
    const char *fast = strstr(text, "\nfast"), *slow = strstr(text, "\nslow");
    ck_assert_msg(fast && slow && fast < slow, "not sorted by eval loss:\n%s", text);
    ck_assert_msg(strstr(text, "0.004") && strstr(text, "AdamW") && strstr(text, "bf16") && strstr(text, " 60 "),
                  "hyperparameters missing:\n%s", text);
    ck_assert_msg(strstr(text, "eval_acc"), "%s", text);
    free(text);
}
END_TEST

START_TEST(font_and_canvas) {
    ct_canvas c;
    ck_assert_int_eq(ct_canvas_init(&c, 64, 16, NULL), 0);
    ck_assert_int_eq(ct_canvas_text_width("ab", 1), 11);
    ck_assert_int_eq(ct_canvas_text_width("", 2), 0);
    int w = ct_canvas_text(&c, 1, 1, "1", 1, 0x000000);
    ck_assert_int_eq(w, 6);
    long ink = 0;
    for (int i = 0; i < 64 * 16; i++) ink += c.rgb[i * 3] == 0;
    ck_assert_int_eq(ink, 10);   /* the "1" glyph has 10 pixels */
    ct_canvas_free(&c);
}
END_TEST

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/ct_plot_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    Suite *s = suite_create("plot");
    TCase *tc = tcase_create("plot");
    tcase_add_test(tc, font_and_canvas);
    tcase_add_test(tc, plot_draws_each_run);
    tcase_add_test(tc, plot_edge_series);
    tcase_add_test(tc, plot_bad_input);
    tcase_add_test(tc, compare_sorts_and_reads_config);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    ct_fs_remove_tree(tmp);
    return failed ? 1 : 0;
}

/* test_nvml.c: the GPU's utilisation and memory through NVML (core/report/nvml.h), with a
 * stand-in for the driver's library (test/fixtures/fake_nvml.c, built beside this test):
 *  - found by PCI bus id, sampled (42%, 3 of 80 GiB), closed with NVML shut down;
 *  - no library, an NVML whose init fails, a bus id NVML does not know: NULL with the reason
 *    (the path, NVML's own words, the bus id), and nothing left initialised;
 *  - a query that fails: no sample, the previous values untouched;
 *  - the reporter: a print window's line carries "gpu 42% 3.0/80.0 GiB", the window and the
 *    summary's figures the samples' mean and peak; without NVML the line has no gpu part. */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/report/nvml.h"
#include "core/report/report.h"
#include "test/test_paths.h"


static char g_fake[PATH_MAX + 64];

static void use_fake(void) {
    beside_me("libfake_nvml.so", g_fake, sizeof g_fake);
    ck_assert_msg(access(g_fake, R_OK) == 0, "%s missing (make tests builds it)", g_fake);
    setenv("CTRAIN_NVML_LIBRARY", g_fake, 1);
    unsetenv("FAKE_NVML_INIT");
    unsetenv("FAKE_NVML_QUERY");
}

/* Inits not shut down, from the stand-in (loaded by ct_nvml_open; RTLD_NOLOAD finds that copy). */
static int live_inits(void) {
    void *h = dlopen(g_fake, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;   /* unloaded: nothing of it is live */
    int (*live)(void) = (int (*)(void))dlsym(h, "fake_nvml_live");
    ck_assert(live);
    int n = live();
    dlclose(h);
    return n;
}

START_TEST(samples_the_device) {
    use_fake();
    char why[256] = "";
    ct_nvml *n = ct_nvml_open("0000:3B:00.0", why, sizeof why);
    ck_assert_msg(n, "%s", why);
    ck_assert_int_eq(live_inits(), 1);
    ct_gpu_sample g = {0};
    ck_assert(ct_nvml_sample(n, &g));
    ck_assert_double_eq(g.util, 42);
    ck_assert_double_eq(g.mem_used, (double)(3ull << 30));
    ck_assert_double_eq(g.mem_total, (double)(80ull << 30));
    /* a query that fails: false, and the last values stay */
    setenv("FAKE_NVML_QUERY", "fail", 1);
    ck_assert(!ct_nvml_sample(n, &g));
    ck_assert_double_eq(g.util, 42);
    ct_nvml_close(n);
    ck_assert_int_eq(live_inits(), 0);
}
END_TEST

START_TEST(no_library_says_which) {
    setenv("CTRAIN_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    char why[256] = "";
    ck_assert(!ct_nvml_open("0000:3B:00.0", why, sizeof why));
    ck_assert_msg(strstr(why, "/nonexistent/libnvidia-ml.so.1"), "%s", why);
}
END_TEST

START_TEST(init_failure_in_nvml_words) {
    use_fake();
    setenv("FAKE_NVML_INIT", "fail", 1);
    char why[256] = "";
    ck_assert(!ct_nvml_open("0000:3B:00.0", why, sizeof why));
    ck_assert_msg(strstr(why, "nvmlInit: Driver Not Loaded"), "%s", why);
}
END_TEST

START_TEST(unknown_bus_id_named_and_shut_down) {
    use_fake();
    char why[256] = "";
    ck_assert(!ct_nvml_open("0000:AF:00.0", why, sizeof why));
    ck_assert_msg(strstr(why, "0000:AF:00.0") && strstr(why, "Not Found"), "%s", why);
    ck_assert_int_eq(live_inits(), 0);
}
END_TEST

/* The step lines of a reporter writing into a temporary file, 4 steps in windows of 2. */
static void run_windows(ct_report *r, ct_nvml *gpu, FILE *f, ct_report_window *last) {
    ct_report_init(r, f, false, 2);
    r->gpu = gpu;
    ct_report_plan(r, 4);
    ct_report_train_start(r);
    for (long s = 1; s <= 4; s++) {
        ct_step_event e = {.step = s, .total_steps = 4, .epoch = 1, .epochs = 1, .loss = 1.0 / (double)s,
                           .lr = 1e-3, .grad_norm = 0.5, .samples = 8};
        ct_report_window w;
        if (ct_report_step(r, &e, &w)) *last = w;
    }
    fflush(f);
}

static void file_text(FILE *f, char *buf, size_t n) {
    rewind(f);
    size_t k = fread(buf, 1, n - 1, f);
    buf[k] = '\0';
}

START_TEST(step_lines_and_summary_carry_the_gpu) {
    use_fake();
    char why[256] = "";
    ct_nvml *n = ct_nvml_open("0000:3B:00.0", why, sizeof why);
    ck_assert_msg(n, "%s", why);
    FILE *f = tmpfile();
    ck_assert(f);
    ct_report r;
    ct_report_window w = {0};
    run_windows(&r, NULL, f, &w);   /* no gpu set: no gpu part */
    char text[4096];
    file_text(f, text, sizeof text);
    ck_assert_msg(strstr(text, "step 2/4") && !strstr(text, "gpu "), "%s", text);
    ck_assert(isnan(w.gpu_util));
    double util, peak;
    ct_report_gpu_summary(&r, &util, &peak);
    ck_assert(isnan(util) && isnan(peak));

    ck_assert(freopen(NULL, "w+", f));
    run_windows(&r, n, f, &w);
    file_text(f, text, sizeof text);
    ck_assert_msg(strstr(text, "step 2/4") && strstr(text, "step 4/4"), "%s", text);
    ck_assert_msg(strstr(text, "  gpu 42% 3.0/80.0 GiB  ETA"), "%s", text);
    ck_assert_double_eq(w.gpu_util, 42);
    ck_assert_double_eq(w.gpu_mem_used, (double)(3ull << 30));
    ct_report_gpu_summary(&r, &util, &peak);
    ck_assert_double_eq(util, 42);
    ck_assert_double_eq(peak, (double)(3ull << 30));
    fclose(f);
    ct_nvml_close(n);
}
END_TEST

int main(void) {
    Suite *s = suite_create("nvml");
    TCase *tc = tcase_create("nvml");
    tcase_add_test(tc, samples_the_device);
    tcase_add_test(tc, no_library_says_which);
    tcase_add_test(tc, init_failure_in_nvml_words);
    tcase_add_test(tc, unknown_bus_id_named_and_shut_down);
    tcase_add_test(tc, step_lines_and_summary_carry_the_gpu);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

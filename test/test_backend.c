/* test_backend.c: backend seams that do not need a GPU, and loading the CUDA backend library.
 *
 * CPU (every build): asynchronous downloads and their tickets, timing marks, and the fatal
 * handler. CUDA builds also check that a library built for another op table is
 * refused with a message naming both versions (the table crosses the dlopen boundary). */
#include <check.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "core/util/rng.h"

/* ---- helpers ---- */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* n floats from a stream of their own, never all zero. */
static void random_floats(float *x, int64_t n, uint64_t stream) {
    ct_rng r;
    ct_rng_init(&r, 20261123, CT_RNG_AUGMENT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = 4.0f * ct_rng_uniform(&r) - 2.0f;
}

/* ---- downloads ---- */

START_TEST(download_round_trip) {
    ct_backend *be = ct_cpu_backend_create(2);
    ck_assert_ptr_nonnull(be);
    ck_assert(be->queue.download && be->queue.download_done && be->queue.timer_mark &&
              be->queue.timer_elapsed);
    const int64_t n = 100003;
    size_t bytes = (size_t)n * sizeof(float);
    float *host = malloc(bytes);
    random_floats(host, n, 1);
    float *dev = be->mem.alloc(be, bytes, CT_MEM_ACTIVATIONS);
    float *pinned = be->mem.alloc_host_pinned(be, bytes);
    ck_assert(dev && pinned);
    be->mem.copy_h2d(be, dev, host, bytes);
    memset(pinned, 0xAB, bytes);

    uint64_t t1 = be->queue.download(be, pinned, dev, bytes, 0);
    ck_assert_uint_gt(t1, 0);
    ck_assert(be->queue.download_done(be, t1, false));
    ck_assert_int_eq(memcmp(pinned, host, bytes), 0);

    /* after a compute mark, a slice, and an empty copy: tickets keep increasing */
    uint64_t mark = be->queue.compute_mark(be);
    memset(pinned, 0, bytes);
    uint64_t t2 = be->queue.download(be, pinned, dev + 17, 1000 * sizeof(float), mark);
    uint64_t t3 = be->queue.download(be, pinned + 1000, dev, 0, 0);
    ck_assert_uint_gt(t2, t1);
    ck_assert_uint_gt(t3, t2);
    ck_assert(be->queue.download_done(be, t3, true));
    ck_assert(be->queue.download_done(be, t1, false) && be->queue.download_done(be, t2, false));
    ck_assert_int_eq(memcmp(pinned, host + 17, 1000 * sizeof(float)), 0);
    ck_assert_uint_eq(((uint32_t *)pinned)[1000], 0); /* the empty copy wrote nothing */

    /* uploads draw from the same sequence: an upload and the download of what it wrote */
    random_floats(host, n, 2);
    memcpy(pinned, host, bytes);
    float *dev2 = be->mem.alloc(be, bytes, CT_MEM_ACTIVATIONS);
    uint64_t t4 = be->queue.upload(be, dev2, pinned, bytes, 0);
    ck_assert_uint_gt(t4, t3);
    ck_assert(be->queue.upload_done(be, t4, true));
    memset(pinned, 0, bytes);
    uint64_t t5 = be->queue.download(be, pinned, dev2, bytes, 0);
    ck_assert_uint_gt(t5, t4);
    ck_assert(be->queue.download_done(be, t5, true));
    ck_assert_int_eq(memcmp(pinned, host, bytes), 0);

    be->mem.free(be, dev);
    be->mem.free(be, dev2);
    be->mem.free_host_pinned(be, pinned);
    free(host);
    ct_backend_destroy(be);
}
END_TEST

/* ---- timing marks ---- */

START_TEST(timer_marks) {
    ct_backend *be = ct_cpu_backend_create(1);
    uint64_t a = be->queue.timer_mark(be);
    sleep_ms(20);
    uint64_t b = be->queue.timer_mark(be);
    ck_assert_uint_gt(a, 0);
    ck_assert_uint_gt(b, a);
    double e = be->queue.timer_elapsed(be, a, b);
    ck_assert_msg(e >= 0.015 && e <= 1.0, "20 ms sleep measured as %g s", e);
    ck_assert(be->queue.timer_elapsed(be, b, a) == -e);
    ck_assert(be->queue.timer_elapsed(be, a, a) == 0.0);

    /* invalid: 0, and a mark not handed out yet */
    ck_assert(isnan(be->queue.timer_elapsed(be, 0, b)));
    ck_assert(isnan(be->queue.timer_elapsed(be, a, b + 1)));

    /* a mark lives until CT_TIMER_MARKS newer ones were taken */
    uint64_t last = b;
    for (int i = 0; i < CT_TIMER_MARKS - 2; i++) last = be->queue.timer_mark(be);
    ck_assert_uint_eq(last - a, CT_TIMER_MARKS - 1);
    ck_assert(!isnan(be->queue.timer_elapsed(be, a, last)));
    last = be->queue.timer_mark(be);
    ck_assert(isnan(be->queue.timer_elapsed(be, a, last)));
    ck_assert(isnan(be->queue.timer_elapsed(be, last, a)));
    ck_assert(!isnan(be->queue.timer_elapsed(be, b, last)));
    ct_backend_destroy(be);
}
END_TEST

/* ---- the fatal handler ---- */

static jmp_buf fatal_jump;
static char fatal_msg[CT_ERR_MSG];
static int fatal_ctx_seen;

static void jump_out(void *ctx, const char *msg) {
    fatal_ctx_seen = *(int *)ctx;
    snprintf(fatal_msg, sizeof fatal_msg, "%s", msg);
    longjmp(fatal_jump, 1);
}

START_TEST(fatal_reaches_handler) {
    int ctx = 4242;
    ct_set_fatal_handler(jump_out, &ctx);
    fatal_msg[0] = '\0';
    if (setjmp(fatal_jump) == 0) {
        ct_die_oom_at(123456789, "core/some/where.c", 321);
        ck_abort_msg("ct_die_oom_at returned");
    }
    ck_assert_int_eq(fatal_ctx_seen, 4242);
    ck_assert_msg(strstr(fatal_msg, "out of host memory allocating 123456789 bytes"), "%s",
                  fatal_msg);
    ck_assert_msg(strstr(fatal_msg, "core/some/where.c:321"), "%s", fatal_msg);

    fatal_msg[0] = '\0';
    if (setjmp(fatal_jump) == 0) {
        ct_fatal("%s failure at %s:%d", "CUDA", "cuda/x.cu", 9);
        ck_abort_msg("ct_fatal returned");
    }
    ck_assert_str_eq(fatal_msg, "CUDA failure at cuda/x.cu:9");

    /* the checked allocators end there too */
    fatal_msg[0] = '\0';
    if (setjmp(fatal_jump) == 0) {
        volatile size_t huge = SIZE_MAX / 2;
        void *p = ct_xmalloc(huge);
        free(p);
        ck_abort_msg("a %zu-byte allocation succeeded", (size_t)huge);
    }
    ck_assert_msg(strstr(fatal_msg, "out of host memory") && strstr(fatal_msg, "test_backend.c:"),
                  "%s", fatal_msg);
    ct_set_fatal_handler(NULL, NULL);
}
END_TEST

static void note_and_return(void *ctx, const char *msg) {
    fprintf(stderr, "handler saw: %s\n", msg);
}

/* Runs ct_fatal in a child with stderr captured: its output and how it ended. */
static int fatal_in_child(ct_fatal_fn handler, char *out, size_t cap) {
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0}; /* the abort is expected: no core file */
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGABRT, SIG_DFL);
        dup2(fd[1], 2);
        close(fd[0]);
        ct_set_fatal_handler(handler, NULL);
        ct_fatal("disk %s is gone (%s:%d)", "sdz", "core/util/fs.c", 12);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < cap && (got = read(fd[0], out + len, cap - 1 - len)) > 0) len += (size_t)got;
    out[len] = '\0';
    close(fd[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return status;
}

START_TEST(fatal_without_handler_aborts) {
    char out[4096];
    int status = fatal_in_child(NULL, out, sizeof out);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %#x", status);
    ck_assert_str_eq(out, "ctrain: fatal: disk sdz is gone (core/util/fs.c:12)\n");

    /* a handler that returns: it saw the message, and the process still aborts */
    status = fatal_in_child(note_and_return, out, sizeof out);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %#x", status);
    ck_assert_str_eq(out, "handler saw: disk sdz is gone (core/util/fs.c:12)\n"
                          "ctrain: fatal: disk sdz is gone (core/util/fs.c:12)\n");
}
END_TEST

/* ---- loading the CUDA library ---- */

#ifdef CT_HAVE_CUDA
/* build/test/<name>: the fixtures sit beside this binary, the real library one folder up. */
static void beside_me(const char *name, char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(len > 0);
    exe[len] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(out, n, "%s/%s", exe, name);
}

START_TEST(other_abi_refused) {
    char path[PATH_MAX + 64], want[64];
    beside_me("libfake_cuda_v1.so", path, sizeof path);
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open(path, &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "built for op table version 1 (123 bytes)"), "%s", err.msg);
    snprintf(want, sizeof want, "this ctrain has version %d", CT_BACKEND_ABI);
    ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, path), "%s", err.msg);
}
END_TEST

START_TEST(unversioned_refused) {
    char path[PATH_MAX + 64];
    beside_me("libfake_cuda_noabi.so", path, sizeof path);
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open(path, &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "built by an older ctrain"), "%s", err.msg);
}
END_TEST

START_TEST(own_library_accepted) {
    char path[PATH_MAX + 64];
    beside_me("../libctrain_cuda.so", path, sizeof path);
    if (access(path, F_OK) != 0) return; /* a bundle without the library: nothing to check */
    ct_err err = {0};
    ct_cuda_lib lib = {0};
    ck_assert_msg(ct_cuda_lib_open(path, &lib, &err) == CT_OK, "%s", err.msg);
    ck_assert(lib.probe && lib.create);
}
END_TEST

START_TEST(missing_library_named) {
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open("/nonexistent/libctrain_cuda.so", &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/nonexistent/libctrain_cuda.so"), "%s", err.msg);
}
END_TEST
#endif

int main(void) {
    Suite *s = suite_create("backend");
    TCase *q = tcase_create("cpu queue");
    tcase_add_test(q, download_round_trip);
    tcase_add_test(q, timer_marks);
    suite_add_tcase(s, q);
    TCase *fatal = tcase_create("fatal handler");
    tcase_add_test(fatal, fatal_reaches_handler);
    tcase_add_test(fatal, fatal_without_handler_aborts);
    suite_add_tcase(s, fatal);
#ifdef CT_HAVE_CUDA
    TCase *tc = tcase_create("cuda library");
    tcase_add_test(tc, other_abi_refused);
    tcase_add_test(tc, unversioned_refused);
    tcase_add_test(tc, own_library_accepted);
    tcase_add_test(tc, missing_library_named);
    suite_add_tcase(s, tc);
#endif
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

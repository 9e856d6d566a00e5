/* test_cuda_queue.c: the CUDA backend's queue seams against the CPU backend: asynchronous
 * downloads (against copy_d2h, ordering against compute work, tickets through the ring), timing
 * marks, and init_fill (constant and uniform bit for bit, normal within 2 ulp of float).
 *
 * Without a usable GPU (or in a build without CUDA) it prints "no CUDA device: skipped" and exits
 * 77, which the test runner reports as skipped. Check's fork mode is off: a CUDA context does not
 * survive fork(), and the probe has already created one in this process. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend/backend.h"
#include "core/util/rng.h"
#include "test/cuda_pair.h"

static ct_backend *cpu, *gpu;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* n floats in [-2, 2) from a stream of their own. */
static float *random_floats(int64_t n, uint64_t stream) {
    float *x = malloc((size_t)n * sizeof(float));
    ct_rng r;
    ct_rng_init(&r, 31337, CT_RNG_AUGMENT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = 4.0f * ct_rng_uniform(&r) - 2.0f;
    return x;
}

static float *gpu_upload(const float *h, int64_t n) {
    float *d = gpu->mem.alloc(gpu, (size_t)n * sizeof(float), CT_MEM_ACTIVATIONS);
    ck_assert_ptr_nonnull(d);
    gpu->mem.copy_h2d(gpu, d, h, (size_t)n * sizeof(float));
    return d;
}

/* ---- downloads ---- */

START_TEST(download_matches_copy_d2h) {
    const int64_t n = (1 << 20) + 3;
    size_t bytes = (size_t)n * sizeof(float);
    float *h = random_floats(n, 1);
    float *d = gpu_upload(h, n);
    gpu->elt.scale(gpu, d, 2.0f, n, CT_F32); /* a producer queued just before the download */
    float *pinned = gpu->mem.alloc_host_pinned(gpu, bytes, CT_MEM_WORKSPACE);
    ck_assert_ptr_nonnull(pinned);
    memset(pinned, 0xFF, bytes);
    uint64_t t = gpu->queue.download(gpu, pinned, d, bytes, 0);
    ck_assert_uint_gt(t, 0);
    ck_assert(gpu->queue.download_done(gpu, t, true));
    float *want = malloc(bytes);
    gpu->mem.copy_d2h(gpu, want, d, bytes);
    ck_assert_int_eq(memcmp(pinned, want, bytes), 0);
    for (int64_t i = 0; i < n; i += 4099) ck_assert_float_eq(pinned[i], 2.0f * h[i]);
    free(want);
    free(h);
    gpu->mem.free_host_pinned(gpu, pinned);
    gpu->mem.free(gpu, d);
}
END_TEST

/* after = a compute mark: the copy may start before work queued since (which does not write
 * src), and work queued after the download call (which does) waits for it. */
START_TEST(download_after_mark_and_later_writers) {
    const int64_t n = 1 << 22;
    size_t bytes = (size_t)n * sizeof(float);
    float *h = random_floats(n, 2);
    float *src = gpu_upload(h, n), *other = gpu_upload(h, n);
    uint64_t mark = gpu->queue.compute_mark(gpu);
    for (int i = 0; i < 20; i++) gpu->elt.scale(gpu, other, 1.0001f, n, CT_F32);
    float *pinned = gpu->mem.alloc_host_pinned(gpu, bytes, CT_MEM_WORKSPACE);
    uint64_t t = gpu->queue.download(gpu, pinned, src, bytes, mark);
    gpu->elt.fill(gpu, src, -7.0f, n, CT_F32); /* overwrites src: must run after the copy */
    ck_assert(gpu->queue.download_done(gpu, t, true));
    ck_assert_int_eq(memcmp(pinned, h, bytes), 0);
    float probe = 0.0f;
    gpu->mem.copy_d2h(gpu, &probe, src + 5, sizeof probe);
    ck_assert_float_eq(probe, -7.0f);
    free(h);
    gpu->mem.free_host_pinned(gpu, pinned);
    gpu->mem.free(gpu, src);
    gpu->mem.free(gpu, other);
}
END_TEST

/* More copies than the ring has events, uploads among them: one increasing ticket sequence, and
 * done(last) means done for every earlier ticket. */
START_TEST(download_tickets_through_the_ring) {
    const int copies = 50, chunk = 4096;
    size_t bytes = (size_t)copies * chunk * sizeof(float);
    float *h = random_floats((int64_t)copies * chunk, 3);
    float *d = gpu_upload(h, (int64_t)copies * chunk);
    float *pinned = gpu->mem.alloc_host_pinned(gpu, bytes, CT_MEM_WORKSPACE);
    float *up_src = gpu->mem.alloc_host_pinned(gpu, chunk * sizeof(float), CT_MEM_WORKSPACE);
    float *up_dst = gpu->mem.alloc(gpu, chunk * sizeof(float), CT_MEM_ACTIVATIONS);
    memcpy(up_src, h, chunk * sizeof(float));
    memset(pinned, 0, bytes);
    uint64_t tickets[50], prev = 0;
    for (int c = 0; c < copies; c++) {
        if (c % 7 == 3) {
            uint64_t u = gpu->queue.upload(gpu, up_dst, up_src, chunk * sizeof(float), 0);
            ck_assert_uint_gt(u, prev);
            prev = u;
        }
        tickets[c] = gpu->queue.download(gpu, pinned + (size_t)c * chunk, d + (size_t)c * chunk,
                                         chunk * sizeof(float), 0);
        ck_assert_uint_gt(tickets[c], prev);
        prev = tickets[c];
    }
    uint64_t empty = gpu->queue.download(gpu, pinned, d, 0, 0);
    ck_assert_uint_gt(empty, prev);
    ck_assert(gpu->queue.download_done(gpu, empty, true));
    for (int c = 0; c < copies; c++) ck_assert(gpu->queue.download_done(gpu, tickets[c], false));
    ck_assert_int_eq(memcmp(pinned, h, bytes), 0);
    free(h);
    gpu->mem.free_host_pinned(gpu, pinned);
    gpu->mem.free_host_pinned(gpu, up_src);
    gpu->mem.free(gpu, d);
    gpu->mem.free(gpu, up_dst);
}
END_TEST

/* ---- timing marks ---- */

START_TEST(timer_marks) {
    gpu->queue.sync(gpu);
    uint64_t a = gpu->queue.timer_mark(gpu);
    sleep_ms(20);
    uint64_t b = gpu->queue.timer_mark(gpu);
    double e = gpu->queue.timer_elapsed(gpu, a, b);
    ck_assert_msg(e >= 0.015 && e <= 1.0, "20 ms between two marks on an idle GPU: %g s", e);

    /* device work between marks takes time, and the marks come in queue order */
    const int64_t n = 1 << 24;
    float *d = gpu->mem.alloc(gpu, (size_t)n * sizeof(float), CT_MEM_ACTIVATIONS);
    uint64_t c = gpu->queue.timer_mark(gpu);
    for (int i = 0; i < 10; i++) gpu->elt.fill(gpu, d, (float)i, n, CT_F32);
    uint64_t f = gpu->queue.timer_mark(gpu);
    double work = gpu->queue.timer_elapsed(gpu, c, f);
    ck_assert_msg(work > 0.0 && work < 1.0, "10 fills of 64 MB: %g s", work);
    gpu->mem.free(gpu, d);

    ck_assert(isnan(gpu->queue.timer_elapsed(gpu, 0, b)));
    ck_assert(isnan(gpu->queue.timer_elapsed(gpu, a, f + 1)));
    uint64_t last = f;
    while (last - a < CT_TIMER_MARKS - 1) last = gpu->queue.timer_mark(gpu);
    ck_assert(!isnan(gpu->queue.timer_elapsed(gpu, a, last)));
    last = gpu->queue.timer_mark(gpu);
    ck_assert(isnan(gpu->queue.timer_elapsed(gpu, a, last)));
    ck_assert(!isnan(gpu->queue.timer_elapsed(gpu, b, last)));
}
END_TEST

/* ---- init_fill ---- */

/* Distance in units in the last place between two finite floats of any sign. */
static int64_t ulps(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return la > lb ? la - lb : lb - la;
}

START_TEST(init_fill_against_cpu) {
    const int64_t n = 1000003;
    size_t bytes = (size_t)n * sizeof(float);
    static const ct_init_dist dists[] = {
        {CT_DRAW_CONSTANT, 0.1, 0.0},    {CT_DRAW_UNIFORM, -0.05, 0.05},
        {CT_DRAW_UNIFORM, 0.0, 1.0},     {CT_DRAW_NORMAL, 0.0, 0.02},
        {CT_DRAW_NORMAL, 1.0, 3.0},
    };
    const uint64_t streams[] = {0, 17, ((uint64_t)3 << 32) | 5};
    float *want = malloc(bytes), *got = malloc(bytes);
    float *d = gpu->mem.alloc(gpu, bytes, CT_MEM_PARAMS);
    for (int k = 0; k < (int)(sizeof dists / sizeof dists[0]); k++) {
        for (int s = 0; s < 3; s++) {
            const ct_init_dist *dist = &dists[k];
            int64_t from = (int64_t)s * 4099;   /* slices of the stream too */
            cpu->elt.init_fill(cpu, want, from, n, dist, 2024, streams[s]);
            gpu->mem.memset0(gpu, d, bytes);
            gpu->elt.init_fill(gpu, d, from, n, dist, 2024, streams[s]);
            gpu->mem.copy_d2h(gpu, got, d, bytes);
            int64_t worst = 0, at = 0, unequal = 0, first = 0;
            for (int64_t i = 0; i < n; i++) {
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0 && unequal++ == 0) first = i;
                int64_t u = ulps(got[i], want[i]);
                if (u > worst) worst = u, at = i;
            }
            if (dist->kind == CT_DRAW_NORMAL) {
                ck_assert_msg(worst <= 2, "normal %d, stream %d: element %lld is %.9g on the GPU, "
                              "%.9g on the CPU (%lld ulp)", k, s, (long long)at, got[at], want[at],
                              (long long)worst);
                printf("normal (%g, %g), stream %llu: %lld of %lld draws differ (by 1-2 ulp)\n",
                       dist->a, dist->b, (unsigned long long)streams[s], (long long)unequal,
                       (long long)n);
            } else {
                ck_assert_msg(unequal == 0, "kind %d, stream %d: element %lld is %.9g on the GPU, "
                              "%.9g on the CPU (%lld differ)", k, s, (long long)first,
                              got[first], want[first], (long long)unequal);
            }
        }
    }
    gpu->mem.free(gpu, d);
    free(want);
    free(got);
}
END_TEST

START_TEST(op_table_members) {
    ck_assert(gpu->queue.download && gpu->queue.download_done && gpu->queue.timer_mark &&
              gpu->queue.timer_elapsed && gpu->elt.init_fill);
}
END_TEST

int main(void) {
    int rc = cuda_pair_open("cuda", &cpu, &gpu);
    if (rc) return rc;
    printf("device: %s\n", gpu->device_desc);

    Suite *s = suite_create("cuda_queue");
    TCase *tc = tcase_create("queue");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, op_table_members);
    tcase_add_test(tc, download_matches_copy_d2h);
    tcase_add_test(tc, download_after_mark_and_later_writers);
    tcase_add_test(tc, download_tickets_through_the_ring);
    tcase_add_test(tc, timer_marks);
    tcase_add_test(tc, init_fill_against_cpu);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    ct_backend_destroy(gpu);
    ct_backend_destroy(cpu);
    return failed ? 1 : 0;
}

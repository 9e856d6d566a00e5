/* test_backend.c: backend seams that do not need a GPU, and loading the CUDA backend library.
 *
 * CPU (every build): asynchronous downloads and their tickets, timing marks, init_fill (thread
 * count, every instruction-set kernel against an independent scalar reference, moments, streams),
 * and the fatal handler. CUDA builds also check that a library built for another op table is
 * refused with a message naming both versions (the table crosses the dlopen boundary), that a
 * library that cannot be loaded (a missing dependency, not an ELF file) is reported with the
 * loader's whole reason, and that device "auto" says in one line why a machine with the NVIDIA
 * driver trains on the CPU. */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
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
#include "core/cpu/cpu.h"
#include "core/cpu/cpu_internal.h"
#include "core/device/device.h"
#include "core/util/rng.h"
#include "test/test_paths.h"

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
              be->queue.timer_elapsed && be->elt.init_fill);
    const int64_t n = 100003;
    size_t bytes = (size_t)n * sizeof(float);
    float *host = malloc(bytes);
    random_floats(host, n, 1);
    float *dev = be->mem.alloc(be, bytes, CT_MEM_ACTIVATIONS);
    float *pinned = be->mem.alloc_host_pinned(be, bytes, CT_MEM_WORKSPACE);
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

/* ---- the capped device (core/cpu/cpu_capped.c) ---- */

/* Every op of the table goes through a wrapper that waits for the copies queued before it: an op
 * installed as the CPU's own function would run while an upload is still writing its input. The
 * kernel sub-tables are compared slot by slot (a new op without its row in cpu_capped_ops.h shows
 * up here), and so are the memory and queue entries that touch device memory. */
START_TEST(capped_wraps_every_op) {
    ct_backend *cpu = ct_cpu_backend_create(1), *cap = ct_capped_backend_create(1, (size_t)1 << 20, 0);
    ck_assert(cpu && cap);
    size_t first = offsetof(ct_backend, blas), n = (sizeof(ct_backend) - first) / sizeof(void *);
    int wrapped = 0;
    for (size_t i = 0; i < n; i++) {
        void *a = NULL, *b = NULL;
        memcpy(&a, (const char *)cpu + first + i * sizeof(void *), sizeof a);
        memcpy(&b, (const char *)cap + first + i * sizeof(void *), sizeof b);
        ck_assert_msg((a == NULL) == (b == NULL), "kernel table entry %zu: NULL on one backend only", i);
        ck_assert_msg(a == NULL || a != b, "kernel table entry %zu (after blas) runs without waiting for the "
                      "copies: add its row to core/cpu/cpu_capped_ops.h", i);
        wrapped += a != NULL;
    }
    ck_assert_int_ge(wrapped, 40);
    ck_assert(cap->mem.free != cpu->mem.free && cap->mem.free_host_pinned != cpu->mem.free_host_pinned);
    ck_assert(cap->mem.copy_h2d != cpu->mem.copy_h2d && cap->mem.copy_d2h != cpu->mem.copy_d2h &&
              cap->mem.copy_d2d != cpu->mem.copy_d2d && cap->mem.memset0 != cpu->mem.memset0);
    ck_assert(cap->queue.sync != cpu->queue.sync && cap->queue.upload != cpu->queue.upload &&
              cap->queue.download != cpu->queue.download);
    ck_assert_str_eq(cap->name, "capped");
    ck_assert_msg(strstr(cap->device_desc, "capped device of 1.0 MiB"), "%s", cap->device_desc);
    ck_assert(ct_backend_separate_memory(cap) && ct_backend_host_addressable(cap) && ct_backend_cpu_kernels(cap));
    ck_assert(!ct_backend_separate_memory(cpu) && ct_backend_host_addressable(cpu));
    ct_backend_destroy(cpu);
    ct_backend_destroy(cap);
}
END_TEST

/* Device memory is a pool of `cap` bytes that fails past it as cudaMalloc does; pinned memory is
 * host memory, counted apart and never against the cap; train.memory_limit_gb cannot raise it. */
START_TEST(capped_memory_is_capped) {
    size_t cap = (size_t)1 << 20;
    ct_backend *be = ct_capped_backend_create(2, cap, 0);
    ck_assert_uint_eq(be->memory_bytes, cap);
    void *a = be->mem.alloc(be, 600 << 10, CT_MEM_PARAMS);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_null(be->mem.alloc(be, 500 << 10, CT_MEM_ACTIVATIONS));   /* 1100 KiB > 1 MiB */
    void *b = be->mem.alloc(be, 400 << 10, CT_MEM_ACTIVATIONS);
    ck_assert_ptr_nonnull(b);
    void *pin = be->mem.alloc_host_pinned(be, 8u << 20, CT_MEM_OPTIM);   /* 8 MiB: host memory */
    ck_assert_ptr_nonnull(pin);
    memset(pin, 3, 8u << 20);
    ct_mem_stats m;
    be->mem.mem_stats(be, &m);
    ck_assert_uint_eq(m.current_total, 1000u << 10);
    ck_assert_uint_eq(m.current[CT_MEM_PARAMS], 600u << 10);
    ck_assert_uint_eq(m.host_current[CT_MEM_OPTIM], 8u << 20);
    ck_assert_uint_eq(be->mem.peak_bytes(be), 1000u << 10);
    ct_cpu_backend_set_limit(be, (size_t)1 << 30);   /* cannot lift the cap */
    ck_assert_ptr_null(be->mem.alloc(be, 100 << 10, CT_MEM_WORKSPACE));
    ct_cpu_backend_set_limit(be, 900u << 10);   /* can lower it */
    be->mem.free(be, b);
    ck_assert_ptr_null(be->mem.alloc(be, 400 << 10, CT_MEM_WORKSPACE));
    ck_assert_ptr_nonnull(b = be->mem.alloc(be, 300 << 10, CT_MEM_WORKSPACE));
    be->mem.free(be, a), be->mem.free(be, b);
    be->mem.free_host_pinned(be, pin);
    be->mem.mem_stats(be, &m);
    ck_assert_uint_eq(m.current_total, 0);
    ck_assert_uint_eq(m.host_current_total, 0);
    ck_assert_uint_eq(m.host_peak[CT_MEM_OPTIM], 8u << 20);
    ct_backend_destroy(be);
}
END_TEST

/* Copies are really in flight, in ticket order, at the bandwidth asked for: a download's
 * destination read before download_done holds the old bytes, and an upload's source changed before
 * upload_done changes what lands. Ops queued after a copy see it done: an upload's destination is
 * ready for the op that reads it, a download's source may be overwritten by the next op. 4 MiB at
 * 0.01 GB/s take 0.4 s, long enough that the checks made at once see the copy unfinished. */
START_TEST(capped_copies_are_in_flight) {
    const int64_t n = 1 << 20;
    size_t bytes = (size_t)n * sizeof(float);
    ct_backend *be = ct_capped_backend_create(2, (size_t)64 << 20, 0.01);
    float *host = malloc(bytes), *dev = be->mem.alloc(be, bytes, CT_MEM_ACTIVATIONS);
    float *pin = be->mem.alloc_host_pinned(be, bytes, CT_MEM_WORKSPACE);
    random_floats(host, n, 3);
    be->mem.copy_h2d(be, dev, host, bytes);
    memset(pin, 0xAB, bytes);

    /* a download read too early: its last element has not landed */
    double t0 = ct_now();
    uint64_t t = be->queue.download(be, pin, dev, bytes, 0);
    ck_assert(!be->queue.download_done(be, t, false));
    ck_assert_uint_eq(((uint32_t *)pin)[n - 1], 0xABABABABu);
    /* the next op may overwrite the source: it waits for the download first */
    be->mem.memset0(be, dev, bytes);
    ck_assert(be->queue.download_done(be, t, false));
    ck_assert_int_eq(memcmp(pin, host, bytes), 0);
    double secs = ct_now() - t0;
    ck_assert_msg(secs >= 0.35 && secs < 5, "4 MiB at 0.01 GB/s took %g s", secs);

    /* an upload whose source changes before upload_done: the new bytes land (a wrong result in
     * the caller that did not wait) */
    memcpy(pin, host, bytes);
    t = be->queue.upload(be, dev, pin, bytes, 0);
    ck_assert(!be->queue.upload_done(be, t, false));
    pin[n - 1] = 12345.0f;
    /* an op reading the destination waits: it scales what landed */
    be->elt.scale(be, dev, 2.0f, n, CT_F32);
    float got[2];
    be->mem.copy_d2h(be, got, dev, sizeof(float));
    be->mem.copy_d2h(be, got + 1, dev + n - 1, sizeof(float));
    ck_assert(got[0] == 2.0f * host[0]);
    ck_assert_msg(got[1] == 24690.0f, "the changed source landed: %g", got[1]);

    /* tickets finish in order; sync waits for every copy */
    uint64_t t1 = be->queue.upload(be, dev, pin, bytes / 4, 0);
    uint64_t t2 = be->queue.download(be, pin + n / 2, dev, bytes / 4, 0);
    ck_assert_uint_gt(t2, t1);
    be->queue.sync(be);
    ck_assert(be->queue.upload_done(be, t1, false) && be->queue.download_done(be, t2, false));
    ck_assert_int_eq(memcmp(pin + n / 2, pin, bytes / 4), 0);
    be->mem.free(be, dev);
    be->mem.free_host_pinned(be, pin);
    free(host);
    ct_backend_destroy(be);
}
END_TEST

/* CTRAIN_CAPPED_DEVICE: what it accepts, and a value it cannot read is a config error naming it. */
START_TEST(capped_env_values) {
    size_t cap;
    double gbps;
    ct_err err = {0};
    ck_assert_int_eq(ct_capped_parse("64MiB", &cap, &gbps, &err), CT_OK);
    ck_assert_uint_eq(cap, (size_t)64 << 20);
    ck_assert(gbps == 0);
    ck_assert_int_eq(ct_capped_parse("1.5GiB,gbps=12.5", &cap, &gbps, &err), CT_OK);
    ck_assert_uint_eq(cap, (size_t)3 << 29);
    ck_assert(gbps == 12.5);
    ck_assert_int_eq(ct_capped_parse("65536B", &cap, &gbps, &err), CT_OK);
    ck_assert_uint_eq(cap, 65536);
    const char *bad[] = {"", "64", "64MiBx", "-1MiB", "64MiB,", "64MiB,gbps=", "64MiB,gbps=0", "64MiB,gbps=-3",
                         "64MiB,gbps=2x", "64MiB,speed=2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (ct_err){0};
        ck_assert_msg(ct_capped_parse(bad[i], &cap, &gbps, &err) == CT_ERR_CONFIG, "accepted \"%s\"", bad[i]);
        ck_assert_msg(strstr(err.msg, "CTRAIN_CAPPED_DEVICE") && strstr(err.msg, "SIZE[,gbps=G]"), "%s", err.msg);
    }
    ct_backend *be = NULL;
    setenv("CTRAIN_CAPPED_DEVICE", "2MiB,gbps=3", 1);
    ck_assert_int_eq(ct_backend_create("cpu", 1, &be, &err), CT_OK);
    ck_assert_str_eq(be->name, "capped");
    ck_assert_uint_eq(be->memory_bytes, (size_t)2 << 20);
    ck_assert_msg(strstr(be->device_desc, "3 GB/s"), "%s", be->device_desc);
    ct_backend_destroy(be);
    setenv("CTRAIN_CAPPED_DEVICE", "lots", 1);
    ck_assert_int_eq(ct_backend_create("cpu", 1, &be, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "CTRAIN_CAPPED_DEVICE=\"lots\""), "%s", err.msg);
    unsetenv("CTRAIN_CAPPED_DEVICE");
    ck_assert_int_eq(ct_backend_create("cpu", 1, &be, &err), CT_OK);
    ck_assert_str_eq(be->name, "cpu");
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

/* ---- init_fill ---- */

#define INIT_N 1000003
static const ct_init_dist DISTS[] = {
    {CT_DRAW_CONSTANT, -0.3, 0.0},
    {CT_DRAW_UNIFORM, -0.05, 0.125},
    {CT_DRAW_NORMAL, 0.25, 0.02},
};

START_TEST(init_fill_thread_count) {
    ct_backend *one = ct_cpu_backend_create(1), *two = ct_cpu_backend_create(2);
    ct_backend *three = ct_cpu_backend_create(3);
    float *x1 = malloc(INIT_N * sizeof(float)), *x2 = malloc(INIT_N * sizeof(float));
    float *x3 = malloc(INIT_N * sizeof(float));
    for (int k = 0; k < CT_ARRAY_LEN(DISTS); k++) {
        memset(x1, 0xFF, INIT_N * sizeof(float));
        memset(x2, 0, INIT_N * sizeof(float));
        memset(x3, 0x7F, INIT_N * sizeof(float));
        one->elt.init_fill(one, x1, 0, INIT_N, &DISTS[k], 42, 3);
        two->elt.init_fill(two, x2, 0, INIT_N, &DISTS[k], 42, 3);
        three->elt.init_fill(three, x3, 0, INIT_N, &DISTS[k], 42, 3);
        ck_assert_msg(memcmp(x1, x2, INIT_N * sizeof(float)) == 0, "kind %d: 1 vs 2 threads", k);
        ck_assert_msg(memcmp(x1, x3, INIT_N * sizeof(float)) == 0, "kind %d: 1 vs 3 threads", k);
    }
    free(x1);
    free(x2);
    free(x3);
    ct_backend_destroy(one);
    ct_backend_destroy(two);
    ct_backend_destroy(three);
}
END_TEST

/* A slice [first, first + n) of a stream has the whole stream's values: what a ZeRO shard
 * initialising only its part relies on. */
START_TEST(init_fill_slice_of_the_whole) {
    ct_backend *be = ct_cpu_backend_create(2);
    float *whole = malloc(INIT_N * sizeof(float)), *part = malloc(INIT_N * sizeof(float));
    static const int64_t firsts[] = {1, 7, 4096, 333331};
    for (int k = 0; k < CT_ARRAY_LEN(DISTS); k++) {
        be->elt.init_fill(be, whole, 0, INIT_N, &DISTS[k], 42, 3);
        for (int f = 0; f < CT_ARRAY_LEN(firsts); f++) {
            int64_t first = firsts[f], n = INIT_N - first - 11;
            memset(part, 0xFF, INIT_N * sizeof(float));
            be->elt.init_fill(be, part, first, n, &DISTS[k], 42, 3);
            ck_assert_msg(memcmp(part, whole + first, (size_t)n * sizeof(float)) == 0, "kind %d from %lld", k,
                          (long long)first);
            ck_assert_msg(((uint32_t *)part)[n] == 0xFFFFFFFFu, "kind %d: wrote past n", k);
        }
    }
    free(whole);
    free(part);
    ct_backend_destroy(be);
}
END_TEST

/* Element i of the formula in backend.h, from rng.h's public pieces. The normal draw is computed
 * in long double with libm's logl/cosl, so it is an independent evaluation, not a copy of the
 * kernel's own ln and cos. */
static long double reference(const ct_init_dist *d, uint64_t seed, uint64_t stream, uint64_t i) {
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, stream);
    ct_philox_ctr c = {{(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)stream,
                        (uint32_t)(stream >> 32)}};
    ct_philox_ctr w = ct_philox4x32(r.key, c);
    switch (d->kind) {
    case CT_DRAW_CONSTANT: return d->a;
    case CT_DRAW_UNIFORM: return d->a + (d->b - d->a) * ((double)w.v[0] * 0x1p-32);
    default: {
        long double u1 = ((long double)w.v[0] + 1.0L) * 0x1p-32L;
        long double u2 = (long double)w.v[1] * 0x1p-32L;
        long double z = sqrtl(-2.0L * logl(u1)) * cosl(6.283185307179586476925286766559L * u2);
        return (long double)d->a + (long double)d->b * z;
    }
    }
}

/* The draws x[0, n) of elements i0 .. against the reference: constant and uniform exactly (the
 * reference rounds the same double once); normal within one float ulp of the exact value, and
 * equal to its rounding except where the exact value lies within double rounding noise of a tie
 * (a handful in a million at most; a wrong word or formula moves nearly every element). The
 * absolute slack, 2^-60 |b|, is the error of the reference's own angle near a zero of cos. */
static void check_reference(const char *what, const float *x, int64_t n, const ct_init_dist *d,
                            uint64_t seed, uint64_t stream, uint64_t i0) {
    /* counted here and asserted once: Check records every assertion it passes */
    int64_t unequal = 0, bad = -1;
    long double bad_ref = 0;
    for (int64_t j = 0; j < n && bad < 0; j++) {
        long double ref = reference(d, seed, stream, i0 + (uint64_t)j);
        if (d->kind != CT_DRAW_NORMAL) {
            if (x[j] != (float)(double)ref) bad = j, bad_ref = ref;
            continue;
        }
        float rf = (float)ref;
        if (x[j] == rf) continue;
        unequal++;
        long double ulp = nextafterf(fabsf(rf), INFINITY) - fabsf(rf);
        if (fabsl((long double)x[j] - ref) > ulp + 0x1p-60L * fabs(d->b)) bad = j, bad_ref = ref;
    }
    ck_assert_msg(bad < 0, "%s: element %llu is %.9g, want %.12Lg", what,
                  (unsigned long long)(i0 + bad), bad >= 0 ? x[bad] : 0.0f, bad_ref);
    ck_assert_msg(unequal <= 5, "%s: %lld of %lld normal draws differ from the rounded reference",
                  what, (long long)unequal, (long long)n);
}

START_TEST(init_fill_matches_reference) {
    ct_backend *be = ct_cpu_backend_create(2);
    float *x = malloc(INIT_N * sizeof(float));
    const uint64_t stream = ((uint64_t)7 << 32) | 11; /* both stream words non-zero */
    for (int k = 0; k < CT_ARRAY_LEN(DISTS); k++) {
        memset(x, 0xFF, INIT_N * sizeof(float));
        be->elt.init_fill(be, x, 0, INIT_N, &DISTS[k], 1234, stream);
        char what[64];
        snprintf(what, sizeof what, "op, kind %d", k);
        check_reference(what, x, INIT_N, &DISTS[k], 1234, stream, 0);
    }
    ct_backend_destroy(be);
    free(x);
}
END_TEST

/* Every kernel this CPU can run (baseline, AVX2, AVX-512), also for counters that cross 2^32,
 * where the counter's high word starts to count, and for odd lengths (vector tails). */
START_TEST(init_fill_every_kernel) {
    const int64_t n = 4099;
    float *x = malloc(n * sizeof(float));
    int ran = 0;
    for (int isa = 0; isa < 3; isa++) {
        for (int k = 1; k < CT_ARRAY_LEN(DISTS); k++) {
            uint64_t starts[] = {0, ((uint64_t)1 << 32) - 2000, (uint64_t)5 << 40};
            for (int s = 0; s < CT_ARRAY_LEN(starts); s++) {
                memset(x, 0xFF, n * sizeof(float));
                if (!ct_cpu_init_fill_isa(x, (int64_t)starts[s], n, &DISTS[k], 9, 77, isa))
                    continue;
                ran++;
                char what[80];
                snprintf(what, sizeof what, "kernel %d, kind %d, from %llu", isa, k,
                         (unsigned long long)starts[s]);
                check_reference(what, x, n, &DISTS[k], 9, 77, starts[s]);
            }
        }
    }
    ck_assert_int_ge(ran, 6); /* the baseline kernel at least */
    free(x);
}
END_TEST

/* ---- Adam kernels (cpu_adam.c) ---- */

enum { ADAM_N = 2 * 512 + 3 * 16 + 5 }; /* two blocks, whole vectors, a tail */

/* Random state with the awkward values among it: signed zeros, subnormal gradients, parameters
 * that overflow fp16, and (for the lr = 0 variant, which keeps the parameters) bf16 ties. */
static void adam_state(float *st[4], uint64_t seed) {
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, 5);
    for (int j = 0; j < ADAM_N; j++) {
        st[0][j] = 4.0f * ct_rng_uniform(&r) - 2.0f;
        st[1][j] = 0.02f * ct_rng_uniform(&r) - 0.01f;
        st[2][j] = 0.002f * ct_rng_uniform(&r) - 0.001f;
        st[3][j] = 1e-5f * ct_rng_uniform(&r);
    }
    const uint32_t p_bits[] = {0x00000000u, 0x80000000u, 0x477ff000u /* 65520: fp16 inf */,
                               0xc77fe000u, 0x3f808000u /* bf16 tie, even */, 0x3f818000u /* odd */,
                               0x387fc000u /* fp16 subnormal */};
    for (int j = 0; j < CT_ARRAY_LEN(p_bits); j++) memcpy(&st[0][37 * j + 3], &p_bits[j], 4);
    st[1][11] = 0.0f, st[1][12] = -0.0f, st[1][13] = 1e-42f; /* subnormal */
    st[3][11] = 0.0f, st[2][11] = 0.0f;
}

/* Every kernel this CPU runs gives the bits of the baseline kernel (which is the formula in
 * scalar code), for L2 decay, AdamW, and lr 0, with each 16-bit copy; the range is cut at an
 * unaligned element as the pool may cut it. The copy is also checked against the scalar
 * conversions of the final parameters. */
START_TEST(adam_every_kernel) {
    const ct_adam_args variants[] = {
        {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f,
         .bias_c1 = 0.19f, .bias_c2 = 0.001999f, .grad_scale = 0.5f, .decoupled = false},
        {.lr = 1e-3f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 0.1f,
         .bias_c1 = 0.2f, .bias_c2 = 0.0199f, .grad_scale = 2.0f, .decoupled = true},
        {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
         .bias_c1 = 1.0f, .bias_c2 = 1.0f, .grad_scale = 1.0f, .decoupled = true},
        /* a bias correction of exactly 1 (late in training, or none): the vector kernels skip
         * that division, the baseline divides */
        {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f,
         .bias_c1 = 1.0f, .bias_c2 = 0.0199f, .grad_scale = 0.5f, .decoupled = true},
        {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f,
         .bias_c1 = 1.0f, .bias_c2 = 1.0f, .grad_scale = 1.0f, .decoupled = false},
        {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f,
         .bias_c1 = 0.19f, .bias_c2 = 1.0f, .grad_scale = 1.0f, .decoupled = true},
    };
    const ct_dtype copies[] = {CT_F32 /* none */, CT_F16, CT_BF16};
    float *want[4], *got[4];
    for (int b = 0; b < 4; b++) want[b] = malloc(ADAM_N * 4), got[b] = malloc(ADAM_N * 4);
    uint16_t *want16 = malloc(ADAM_N * 2), *got16 = malloc(ADAM_N * 2);
    int ran = 0;
    for (int isa = 0; isa < 3; isa++) {
        if (ct_cpu_adam_isa(isa) < 0) continue;
        ran++;
        for (int var = 0; var < CT_ARRAY_LEN(variants); var++)
            for (int c = 0; c < CT_ARRAY_LEN(copies); c++) {
                ct_adam_args a = variants[var], a0 = variants[var];
                a.copy_dt = a0.copy_dt = copies[c];
                a.copy = copies[c] == CT_F32 ? NULL : got16;
                a0.copy = copies[c] == CT_F32 ? NULL : want16;
                adam_state(want, 100 + var);
                adam_state(got, 100 + var);
                for (int step = 0; step < 3; step++) {
                    ct_cpu_adam_range(want[0], want[1], want[2], want[3], 0, ADAM_N, &a0, 0);
                    ct_cpu_adam_range(got[0], got[1], got[2], got[3], 0, 333, &a, isa);
                    ct_cpu_adam_range(got[0], got[1], got[2], got[3], 333, ADAM_N, &a, isa);
                }
                for (int b = 0; b < 4; b++)
                    for (int j = 0; j < ADAM_N; j++)
                        ck_assert_msg(!memcmp(&want[b][j], &got[b][j], 4),
                                      "kernel %d, variant %d, copy %d: buffer %d element %d is "
                                      "%.9g, the baseline kernel's %.9g",
                                      isa, var, c, b, j, got[b][j], want[b][j]);
                if (copies[c] == CT_F32) continue;
                for (int j = 0; j < ADAM_N; j++) {
                    float pj = got[0][j];
                    uint16_t ref = copies[c] == CT_F16 ? ct_f32_to_f16(pj) : ct_f32_to_bf16(pj);
                    ck_assert_msg(got16[j] == ref && want16[j] == ref,
                                  "kernel %d, variant %d, copy %d: element %d (%a) copied as "
                                  "0x%04x (baseline 0x%04x), want 0x%04x",
                                  isa, var, c, j, got[0][j], got16[j], want16[j], ref);
                }
            }
    }
    ck_assert_int_ge(ran, 1);
    printf("test_backend: %d Adam kernel(s) checked (baseline, AVX2, AVX-512: those this CPU has)\n",
           ran);
    for (int b = 0; b < 4; b++) free(want[b]), free(got[b]);
    free(want16), free(got16);
}
END_TEST

/* Sample mean and variance within 3 standard errors of the distribution's. */
static void check_moments(const char *what, const float *x, int64_t n, double mean, double var,
                          double mu4) {
    double s = 0.0, s2 = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    double m = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += ((double)x[i] - m) * ((double)x[i] - m);
    double v = s2 / (double)(n - 1);
    double se_mean = sqrt(var / (double)n), se_var = sqrt((mu4 - var * var) / (double)n);
    ck_assert_msg(fabs(m - mean) <= 3.0 * se_mean, "%s: mean %g, want %g +- %g", what, m, mean,
                  3.0 * se_mean);
    ck_assert_msg(fabs(v - var) <= 3.0 * se_var, "%s: variance %g, want %g +- %g", what, v, var,
                  3.0 * se_var);
}

START_TEST(init_fill_moments) {
    ct_backend *be = ct_cpu_backend_create(2);
    const int64_t n = 1000000;
    float *x = malloc(n * sizeof(float));
    ct_init_dist u = {CT_DRAW_UNIFORM, -0.5, 1.5};
    be->elt.init_fill(be, x, 0, n, &u, 5, 1);
    double w = u.b - u.a;
    check_moments("uniform", x, n, (u.a + u.b) / 2, w * w / 12, w * w * w * w / 80);
    int64_t outside = 0;
    for (int64_t i = 0; i < n; i++) outside += !(x[i] >= u.a && x[i] < u.b);
    ck_assert_int_eq(outside, 0);
    ct_init_dist g = {CT_DRAW_NORMAL, 0.25, 2.0};
    be->elt.init_fill(be, x, 0, n, &g, 5, 2);
    check_moments("normal", x, n, g.a, g.b * g.b, 3 * pow(g.b, 4));
    ct_backend_destroy(be);
    free(x);
}
END_TEST

static int64_t count_equal(const float *a, const float *b, int64_t n) {
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += a[i] == b[i];
    return same;
}

START_TEST(init_fill_streams_differ) {
    ct_backend *be = ct_cpu_backend_create(2);
    const int64_t n = 100000;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int k = 1; k < CT_ARRAY_LEN(DISTS); k++) {
        const ct_init_dist *d = &DISTS[k];
        be->elt.init_fill(be, x, 0, n, d, 8, 1);
        be->elt.init_fill(be, y, 0, n, d, 8, 2);
        ck_assert_int_le(count_equal(x, y, n), n / 1000);
        be->elt.init_fill(be, y, 0, n, d, 8, 1 + ((uint64_t)1 << 32)); /* the stream's high word */
        ck_assert_int_le(count_equal(x, y, n), n / 1000);
        be->elt.init_fill(be, y, 0, n, d, 9, 1);                       /* another seed */
        ck_assert_int_le(count_equal(x, y, n), n / 1000);
        be->elt.init_fill(be, y, 0, n, d, 8, 1);                       /* and the same again */
        ck_assert_int_eq(count_equal(x, y, n), n);
    }
    ct_backend_destroy(be);
    free(x);
    free(y);
}
END_TEST

/* ---- starting the CPU backend ---- */

/* ct_backend_create("cpu", threads) in a child whose address space has room for a few thread
 * stacks only; returns its status and the error message. */
static int cpu_create_cramped(int threads, char *msg, size_t cap) {
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%ld", &pages) != 1) _exit(99);
        fclose(f);
        /* 48 MiB more than now: thread stacks are 8 MiB, so a few start and then one cannot */
        rlim_t room = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)48 << 20);
        struct rlimit as = {room, room};
        if (setrlimit(RLIMIT_AS, &as) != 0) _exit(98);
        ct_backend *be = NULL;
        ct_err err = {0};
        int rc = ct_backend_create("cpu", threads, &be, &err);
        if (write(fd[1], err.msg, strlen(err.msg)) < 0) _exit(97);
        _exit(rc);
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < cap && (got = read(fd[0], msg + len, cap - 1 - len)) > 0) len += (size_t)got;
    msg[len] = '\0';
    close(fd[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "status %#x", status);
    return WEXITSTATUS(status);
}

/* When the pool cannot start, the message says how many threads it tried (the resolved count,
 * not the setting) and why (errno's text). */
START_TEST(cpu_threads_error_says_count_and_reason) {
    srand(17);
    int n = 64 + rand() % 64;
    char msg[1024], want[128];
    int rc = cpu_create_cramped(n, msg, sizeof msg);
    ck_assert_msg(rc == CT_ERR_RUNTIME, "status %d: %s", rc, msg);
    snprintf(want, sizeof want, "cannot start %d CPU worker threads (train.threads %d)", n, n);
    ck_assert_msg(strstr(msg, want), "%s", msg);
    ck_assert_msg(strstr(msg, strerror(EAGAIN)), "no reason in: %s", msg);
    /* train.threads 0 means one per online core: that count is what it tries */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    ck_assert_int_eq(ct_cpu_threads_for(0), online > 0 ? (int)online : 1);
    ck_assert_int_eq(ct_cpu_threads_for(n), n);
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

/* Compute capabilities: the library built by the Makefile's default CUDA_ARCH (sm_80, sm_90 machine
 * code, compute_90 PTX) takes 8.0 and newer and refuses older GPUs, naming the device, its
 * capability and what the library holds. Needs no GPU: the check gets the properties as arguments. */
START_TEST(capability_below_sm80_refused) {
    char path[PATH_MAX + 64];
    beside_me("../libctrain_cuda.so", path, sizeof path);
    if (access(path, F_OK) != 0) return; /* a bundle without the library: nothing to check */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h, "%s", dlerror());
    int (*check)(int, const char *, int, int, ct_err *) =
        (int (*)(int, const char *, int, int, ct_err *))dlsym(h, "ct_cuda_check_capability");
    ck_assert(check);
    static const struct { int major, minor; bool ok; } cases[] = {
        {6, 1, false}, {7, 0, false}, {7, 5, false},             /* P100, V100, T4 */
        {8, 0, true}, {8, 6, true}, {8, 9, true}, {9, 0, true},  /* sm_80 code; sm_90 code */
        {10, 0, true}, {12, 0, true},                            /* compute_90 PTX, JIT-compiled */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_err err = {0};
        int rc = check(3, "Tesla Test", cases[i].major, cases[i].minor, &err);
        ck_assert_msg(rc == (cases[i].ok ? CT_OK : CT_ERR_RUNTIME), "%d.%d: rc %d %s", cases[i].major,
                      cases[i].minor, rc, err.msg);
        if (cases[i].ok) continue;
        char cap[32];
        snprintf(cap, sizeof cap, "compute capability %d.%d", cases[i].major, cases[i].minor);
        ck_assert_msg(strstr(err.msg, "CUDA device 3 (Tesla Test)") && strstr(err.msg, cap) &&
                      strstr(err.msg, "8.0 or newer") && strstr(err.msg, "holds code for sm_80") &&
                      strstr(err.msg, "--device cpu"), "%s", err.msg);
    }
    dlclose(h);
}
END_TEST

/* The dynamic loader's reason, word for word: what a user needs to fix a GPU machine. */
#define ABSENT_DEP_REASON "libctrain_absent_dep.so.13: cannot open shared object file"

START_TEST(unresolved_dependency_reason_whole) {
    char path[PATH_MAX + 64];
    beside_me("libfake_cuda_needs.so", path, sizeof path);
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open(path, &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, ABSENT_DEP_REASON), "%s", err.msg);
}
END_TEST

START_TEST(not_an_elf_file_reason_whole) {
    char dir[] = "/tmp/ct_backend_XXXXXX", path[64];
    ck_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/libctrain_cuda.so", dir);
    FILE *f = fopen(path, "w");
    ck_assert(f);
    for (int i = 0; i < 8; i++) fputs("not a shared library, a text file by that name\n", f);
    fclose(f);
    ct_err err = {0};
    ct_cuda_lib lib;
    int rc = ct_cuda_lib_open(path, &lib, &err);
    unlink(path);
    rmdir(dir);
    ck_assert_int_eq(rc, CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "invalid ELF header"), "%s", err.msg);
}
END_TEST

/* A GPU machine (the driver stand-in, soname libcuda.so.1, loaded first so that dlopen of that
 * name finds it) whose CUDA library fails to load: "cuda" is an error and "auto" trains on the CPU
 * with one notice line, both carrying the loader's reason. The stand-in stays loaded for the rest
 * of the process, so this runs only in a forked test. */
START_TEST(auto_says_why_it_uses_the_cpu) {
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode && strcmp(fork_mode, "no") == 0) return;
    char driver[PATH_MAX + 64], lib[PATH_MAX + 64];
    beside_me("libfake_driver.so", driver, sizeof driver);
    beside_me("libfake_cuda_needs.so", lib, sizeof lib);
    ck_assert_msg(dlopen(driver, RTLD_NOW | RTLD_LOCAL), "%s", dlerror());
    setenv("CTRAIN_CUDA_LIB", lib, 1);

    ct_err err = {0};
    ct_backend *be = NULL;
    ck_assert_int_eq(ct_backend_create("cuda", 1, &be, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, lib) && strstr(err.msg, ABSENT_DEP_REASON), "%s", err.msg);

    char notice[CT_ERR_MSG + 64];
    ck_assert_msg(ct_backend_create_noting("auto", 1, &be, notice, sizeof notice, &err) == CT_OK, "%s", err.msg);
    ck_assert_str_eq(be->name, "cpu");
    ct_backend_destroy(be);
    ck_assert_msg(strstr(notice, "training on the CPU") && strstr(notice, lib) &&
                  strstr(notice, ABSENT_DEP_REASON) && !strchr(notice, '\n'), "%s", notice);
}
END_TEST

/* No driver: "auto" says nothing (a CPU machine is not a fault), even with a broken library. */
START_TEST(auto_without_driver_is_quiet) {
    if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) return; /* a GPU machine: nothing to check */
    char lib[PATH_MAX + 64];
    beside_me("libfake_cuda_needs.so", lib, sizeof lib);
    setenv("CTRAIN_CUDA_LIB", lib, 1);
    char notice[CT_ERR_MSG + 64] = "unset";
    ct_err err = {0};
    ct_backend *be = NULL;
    ck_assert_msg(ct_backend_create_noting("auto", 1, &be, notice, sizeof notice, &err) == CT_OK, "%s", err.msg);
    ck_assert_str_eq(be->name, "cpu");
    ct_backend_destroy(be);
    ck_assert_str_eq(notice, "");
}
END_TEST
#endif

int main(void) {
    Suite *s = suite_create("backend");
    TCase *q = tcase_create("cpu queue");
    tcase_add_test(q, download_round_trip);
    tcase_add_test(q, timer_marks);
    suite_add_tcase(s, q);
    TCase *cap = tcase_create("capped device");
    tcase_set_timeout(cap, 30);
    tcase_add_test(cap, capped_wraps_every_op);
    tcase_add_test(cap, capped_memory_is_capped);
    tcase_add_test(cap, capped_copies_are_in_flight);
    tcase_add_test(cap, capped_env_values);
    suite_add_tcase(s, cap);
    TCase *init = tcase_create("cpu init_fill");
    tcase_set_timeout(init, 60);
    tcase_add_test(init, init_fill_thread_count);
    tcase_add_test(init, init_fill_slice_of_the_whole);
    tcase_add_test(init, init_fill_matches_reference);
    tcase_add_test(init, init_fill_every_kernel);
    tcase_add_test(init, init_fill_moments);
    tcase_add_test(init, init_fill_streams_differ);
    suite_add_tcase(s, init);
    TCase *adam = tcase_create("cpu adam kernels");
    tcase_add_test(adam, adam_every_kernel);
    suite_add_tcase(s, adam);
    TCase *fatal = tcase_create("fatal handler");
    tcase_add_test(fatal, fatal_reaches_handler);
    tcase_add_test(fatal, fatal_without_handler_aborts);
    suite_add_tcase(s, fatal);
    TCase *start = tcase_create("cpu start");
    tcase_add_test(start, cpu_threads_error_says_count_and_reason);
    suite_add_tcase(s, start);
#ifdef CT_HAVE_CUDA
    TCase *tc = tcase_create("cuda library");
    tcase_add_test(tc, other_abi_refused);
    tcase_add_test(tc, unversioned_refused);
    tcase_add_test(tc, own_library_accepted);
    tcase_add_test(tc, missing_library_named);
    tcase_add_test(tc, capability_below_sm80_refused);
    tcase_add_test(tc, unresolved_dependency_reason_whole);
    tcase_add_test(tc, not_an_elf_file_reason_whole);
    tcase_add_test(tc, auto_says_why_it_uses_the_cpu);
    tcase_add_test(tc, auto_without_driver_is_quiet);
    suite_add_tcase(s, tc);
#endif
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* test_cpu_ops.c: what the CPU backend promises beyond one call against a reference (every op
 * against fp64 references, 1 vs 2 threads and the 16-bit rule is in test_ops.c): fp16/bf16 scalar
 * conversions (overflow, subnormals, ties), the bf16 casts bit for bit against them, uint8 casts,
 * dropout's mask statistics, argument forms that must not change a bit (dx aliasing dy,
 * conv2d_backward without dx and db), the fused conv2d + relu + max-pool against the ops apart
 * (ties, NaN), the summation order of the reductions (pinned bit for bit),
 * each GEMM library against fp64 and oneDNN's under signals, native bf16 GEMMs where the CPU has
 * them (or the line saying it has not), the thread pool under stress,
 * backend creation and memory accounting, upload tickets. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/cpu/cpu_internal.h"
#include "core/device/device.h"
#include "core/util/rng.h"

static ct_backend *be1, *be2; /* 1 and 2 worker threads */

static void setup(void) {
    be1 = ct_cpu_backend_create(1);
    be2 = ct_cpu_backend_create(2);
    ck_assert_ptr_nonnull(be1);
    ck_assert_ptr_nonnull(be2);
}
static void teardown(void) {
    ct_backend_destroy(be1);
    ct_backend_destroy(be2);
}

static float *rnd(int64_t n, uint64_t stream, float lo, float hi) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ct_rng r;
    ct_rng_init(&r, 2024, CT_RNG_INIT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * ct_rng_uniform(&r);
    return x;
}

static float *copyf(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* ---- fp16 / bf16 scalar conversions (tensor.h) ---- */

START_TEST(f16_conversions) {
    ck_assert_uint_eq(ct_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(ct_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(ct_f32_to_f16(65504.0f), 0x7bff);
    /* ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> 1; 1 + 3*2^-11 -> up */
    ck_assert_uint_eq(ct_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    ck_assert_uint_eq(ct_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    ck_assert_uint_eq(ct_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    /* overflow: 65520 is the midpoint to the next (nonexistent) value -> inf */
    ck_assert_uint_eq(ct_f32_to_f16(65519.0f), 0x7bff);
    ck_assert_uint_eq(ct_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(ct_f32_to_f16(-1e9f), 0xfc00);
    ck_assert_uint_eq(ct_f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(ct_f32_to_f16(NAN) & 0x7c00, 0x7c00);
    ck_assert_uint_ne(ct_f32_to_f16(NAN) & 0x3ff, 0);
    ck_assert(isnan(ct_f16_to_f32(ct_f32_to_f16(NAN))));
    /* subnormals: smallest is 2^-24; half of it ties to 0 (even), 1.5 units ties to 2 */
    ck_assert_uint_eq(ct_f32_to_f16(0x1p-24f), 0x0001);
    ck_assert_uint_eq(ct_f32_to_f16(0x1p-25f), 0x0000);
    ck_assert_uint_eq(ct_f32_to_f16(3 * 0x1p-25f), 0x0002);
    ck_assert_uint_eq(ct_f32_to_f16(-0x1p-24f), 0x8001);
    ck_assert_uint_eq(ct_f32_to_f16(0x1p-14f), 0x0400); /* smallest normal */
    ck_assert(ct_f16_to_f32(0x0001) == 0x1p-24f);
    ck_assert(ct_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    ck_assert(ct_f16_to_f32(0x7c00) == INFINITY);
    ck_assert(ct_f16_to_f32(0xfc00) == -INFINITY);
    /* every finite f16 survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        ck_assert_uint_eq(ct_f32_to_f16(ct_f16_to_f32((uint16_t)h)), h);
    }
}
END_TEST

START_TEST(bf16_conversions) {
    ck_assert_uint_eq(ct_f32_to_bf16(1.0f), 0x3f80);
    /* ties to even on the low 16 bits */
    ck_assert_uint_eq(ct_f32_to_bf16(ct__bits_f32(0x3f808000u)), 0x3f80);
    ck_assert_uint_eq(ct_f32_to_bf16(ct__bits_f32(0x3f818000u)), 0x3f82);
    ck_assert_uint_eq(ct_f32_to_bf16(ct__bits_f32(0x3f808001u)), 0x3f81);
    ck_assert_uint_eq(ct_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(ct_f32_to_bf16(ct__bits_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to inf */
    ck_assert(isnan(ct_bf16_to_f32(ct_f32_to_bf16(NAN))));
    ck_assert_uint_eq(ct_f32_to_bf16(ct__bits_f32(0x00010000u)), 0x0001); /* subnormal kept */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80) continue;
        ck_assert_uint_eq(ct_f32_to_bf16(ct_bf16_to_f32((uint16_t)h)), h);
    }
}
END_TEST

/* The casts between f32, f16 and bf16 are rows of test_ops; uint8 pixels widen exactly. */
/* The bf16 casts and rounding of the backend (AVX2 where present, cpu_eltwise.c) against the
 * scalar conversions of tensor.h, bit for bit: every bf16 value (all 65536 top halves) with low
 * halves below, at and above the tie (even and odd), and the NaNs and infinities among them; at
 * offsets that are no multiple of 8, so vector body and scalar tail both run. */
START_TEST(bf16_casts_match_scalar) {
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
    enum { NLOW = sizeof lows / sizeof lows[0] };
    int64_t n = 65536 * NLOW + 5;
    uint32_t *bits = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) bits[i] = ((uint32_t)(i / NLOW % 65536) << 16) | lows[i % NLOW];
    float *x = (float *)bits, *rounded = malloc((size_t)n * 4), *widened = malloc((size_t)n * 4);
    uint16_t *h = malloc((size_t)n * 2);
    for (int off = 0; off < 3; off++) {
        int64_t m = n - off;
        be2->elt.cast(be2, h, CT_BF16, x + off, CT_F32, m);
        for (int64_t i = 0; i < m; i++)
            if (h[i] != ct_f32_to_bf16(x[off + i]))
                ck_abort_msg("f32 0x%08x -> bf16 0x%04x, scalar 0x%04x", bits[off + i], h[i], ct_f32_to_bf16(x[off + i]));
        be2->elt.cast(be2, widened, CT_F32, h, CT_BF16, m);
        for (int64_t i = 0; i < m; i++) {
            float want = ct_bf16_to_f32(h[i]);
            ck_assert(memcmp(&widened[i], &want, 4) == 0);
        }
        memcpy(rounded, x + off, (size_t)m * 4);
        be2->elt.round_to(be2, rounded, m, CT_BF16);
        for (int64_t i = 0; i < m; i++) {
            float want = ct_bf16_to_f32(ct_f32_to_bf16(x[off + i]));
            if (memcmp(&rounded[i], &want, 4) != 0)
                ck_abort_msg("round_to bf16 of 0x%08x: got %a, scalar %a", bits[off + i], rounded[i], want);
        }
    }
    free(bits), free(rounded), free(widened), free(h);
}
END_TEST

START_TEST(cast_from_u8) {
    uint8_t u8[5] = {0, 1, 7, 200, 255};
    float back[5];
    be1->elt.cast(be1, back, CT_F32, u8, CT_U8, 5);
    for (int i = 0; i < 5; i++) ck_assert(back[i] == (float)u8[i]);
}
END_TEST

/* ---- dropout: the mask is ct_rng_at's (test_ops); here its statistics ---- */

START_TEST(dropout_mask_statistics) {
    const int64_t sizes[] = {1000, 100003};
    for (size_t s = 0; s < CT_ARRAY_LEN(sizes); s++) {
        int64_t n = sizes[s], kept = 0;
        float *x = rnd(n, 90, -1, 1), *y = malloc((size_t)n * 4);
        uint8_t *m = malloc((size_t)n);
        be2->elt.dropout_forward(be2, y, m, x, n, 0.3f, 7, 11, CT_F32);
        for (int64_t i = 0; i < n; i++) kept += m[i];
        ck_assert_msg(fabs((double)kept / n - 0.7) < 0.05, "kept %lld of %lld at p = 0.3", (long long)kept, (long long)n);
        free(x), free(y), free(m);
    }
    /* another stream gives another mask */
    int64_t n = 1000;
    float *x = rnd(n, 92, 1, 2), *y = malloc((size_t)n * 4);
    uint8_t *a = malloc((size_t)n), *b = malloc((size_t)n);
    be2->elt.dropout_forward(be2, y, a, x, n, 0.5f, 7, 11, CT_F32);
    be2->elt.dropout_forward(be2, y, b, x, n, 0.5f, 7, 12, CT_F32);
    ck_assert(memcmp(a, b, (size_t)n) != 0);
    free(x), free(y), free(a), free(b);
}
END_TEST

/* ---- argument forms that must give the same bits ---- */

/* act_backward with dx aliasing dy (in place) equals the call with a separate dx. */
START_TEST(act_backward_in_place) {
    const int64_t n = 100003;
    const ct_dtype dts[] = {CT_F32, CT_F16, CT_BF16};
    float *x = rnd(n, 60, -6, 6), *dy = rnd(n, 70, -1, 1);
    for (size_t d = 0; d < CT_ARRAY_LEN(dts); d++)
        for (ct_act act = CT_ACT_NONE; act <= CT_ACT_SIGMOID; act++) {
            ct_dtype dt = dts[d];
            size_t bytes = (size_t)n * ct_dtype_size(dt);
            void *xs = malloc(bytes), *ys = malloc(bytes), *dys = malloc(bytes), *dx = malloc(bytes);
            be2->elt.cast(be2, xs, dt, x, CT_F32, n);
            be2->elt.cast(be2, dys, dt, dy, CT_F32, n);
            be2->elt.act_forward(be2, ys, xs, n, act, 0.1f, dt);
            be2->elt.act_backward(be2, dx, dys, xs, ys, n, act, 0.1f, dt);
            be2->elt.act_backward(be2, dys, dys, xs, ys, n, act, 0.1f, dt);
            ck_assert_msg(memcmp(dys, dx, bytes) == 0, "act %d [%s]: in place differs", (int)act, ct_dtype_name(dt));
            free(xs), free(ys), free(dys), free(dx);
        }
    free(x), free(dy);
}
END_TEST

/* conv2d_backward without dx and db (a first layer without bias) gives the same dw. 19 images:
 * dw's fixed blocks of 8 images end in a partial block. */
START_TEST(conv2d_backward_dw_only) {
    ct_conv2d_geom geoms[] = {
        {.n = 19, .c = 3, .h = 7, .w = 6, .oc = 4, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
         .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1},
        {.n = 19, .c = 4, .h = 9, .w = 8, .oc = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 1,
         .pad_h = 2, .pad_w = 1, .dil_h = 2, .dil_w = 1, .groups = 2},
    };
    for (size_t gi = 0; gi < CT_ARRAY_LEN(geoms); gi++) {
        ct_conv2d_geom *g = &geoms[gi];
        g->oh = (g->h + 2 * g->pad_h - g->dil_h * (g->kh - 1) - 1) / g->stride_h + 1;
        g->ow = (g->w + 2 * g->pad_w - g->dil_w * (g->kw - 1) - 1) / g->stride_w + 1;
        int64_t nx = g->n * g->c * g->h * g->w, ny = g->n * g->oc * g->oh * g->ow;
        int64_t nw = g->oc * (g->c / g->groups) * g->kh * g->kw;
        float *x = rnd(nx, 200 + gi, -1, 1), *w = rnd(nw, 210 + gi, -1, 1), *dy = rnd(ny, 230 + gi, -1, 1);
        float *dw = rnd(nw, 240 + gi, -1, 1), *dw_only = copyf(dw, nw), *db = rnd(g->oc, 220, -1, 1);
        float *dx = malloc((size_t)nx * 4);
        be2->conv.conv2d_backward(be2, dx, dw, db, dy, x, w, g, CT_F32);
        be2->conv.conv2d_backward(be2, NULL, dw_only, NULL, dy, x, w, g, CT_F32);
        ck_assert(memcmp(dw, dw_only, (size_t)nw * 4) == 0);
        free(x), free(w), free(dy), free(dw), free(dw_only), free(db), free(dx);
    }
}
END_TEST

/* conv2d_act_pool_forward/backward against the ops they fuse (conv2d_act_forward, maxpool2d_forward;
 * maxpool2d_backward, conv2d_act_backward), bit for bit, fp32 and bf16, 1 and 2 threads. Inputs
 * and weights are small integers, so the conv's outputs tie often (ties among positive values as
 * well as the ReLU's zeros); one input element is NaN (windows where NaN meets numbers) and one
 * channel's bias is NaN (windows of NaN only). 19 images of 9x7: the pool drops the last row and
 * column. */
static float *small_ints(int64_t n, uint64_t stream) {
    float *x = rnd(n, stream, -2.0f, 2.0f);
    for (int64_t i = 0; i < n; i++) x[i] = floorf(x[i] + 0.5f);
    return x;
}

/* A copy of x[n] (fp32) in dt (the same array for fp32). */
static void *in_dt(ct_backend *be, const float *x, int64_t n, ct_dtype dt) {
    void *y = malloc((size_t)n * ct_dtype_size(dt));
    be->elt.cast(be, y, dt, x, CT_F32, n);
    return y;
}

START_TEST(conv2d_act_pool_matches_the_ops_apart) {
    ct_conv2d_geom g = {.n = 19, .c = 3, .h = 9, .w = 7, .oc = 4, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
                        .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1, .oh = 9, .ow = 7};
    ct_pool2d_geom pg = {.n = 19, .c = 4, .h = 9, .w = 7, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2,
                         .oh = 4, .ow = 3};
    int64_t nx = g.n * g.c * g.h * g.w, nw = g.oc * g.c * g.kh * g.kw, ny = g.n * g.oc * g.oh * g.ow;
    int64_t np = pg.n * pg.c * pg.oh * pg.ow;
    float *x32 = small_ints(nx, 300), *w32 = small_ints(nw, 301), *b32 = small_ints(g.oc, 302);
    float *dy32 = rnd(np, 303, -1, 1);
    x32[5 * g.c * g.h * g.w + 2 * g.w + 3] = NAN;
    b32[2] = NAN;
    ct_dtype dts[] = {CT_F32, CT_BF16};
    ct_backend *bes[] = {be1, be2};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 2; t++) {
            ct_backend *be = bes[t];
            ct_dtype dt = dts[d];
            size_t es = ct_dtype_size(dt);
            void *x = in_dt(be, x32, nx, dt), *w = in_dt(be, w32, nw, dt), *b = in_dt(be, b32, g.oc, dt);
            void *dy = in_dt(be, dy32, np, dt);
            void *full = malloc((size_t)ny * es), *dfull = malloc((size_t)ny * es);
            void *y_apart = malloc((size_t)np * es), *y_fused = malloc((size_t)np * es);
            int32_t *am_apart = malloc((size_t)np * 4), *am_fused = malloc((size_t)np * 4);
            be->conv.conv2d_act_forward(be, full, x, w, b, &g, CT_ACT_RELU, dt);
            be->conv.maxpool2d_forward(be, y_apart, am_apart, full, &pg, dt);
            be->conv.conv2d_act_pool_forward(be, y_fused, am_fused, x, w, b, &g, CT_ACT_RELU, dt);
            ck_assert_msg(memcmp(y_apart, y_fused, (size_t)np * es) == 0, "y (%s, %d threads)", ct_dtype_name(dt), t + 1);
            ck_assert_msg(memcmp(am_apart, am_fused, (size_t)np * 4) == 0, "argmax (%s, %d threads)", ct_dtype_name(dt),
                          t + 1);
            float *dw_apart = calloc((size_t)nw, 4), *dw_fused = calloc((size_t)nw, 4);
            float *db_apart = calloc((size_t)g.oc, 4), *db_fused = calloc((size_t)g.oc, 4);
            void *dx_apart = malloc((size_t)nx * es), *dx_fused = malloc((size_t)nx * es);
            be->conv.maxpool2d_backward(be, dfull, dy, am_apart, &pg, dt);
            be->conv.conv2d_act_backward(be, dx_apart, dw_apart, db_apart, dfull, full, x, w, &g, CT_ACT_RELU, dt);
            be->conv.conv2d_act_pool_backward(be, dx_fused, dw_fused, db_fused, dy, y_fused, am_fused, x, w, &g,
                                              CT_ACT_RELU, dt);
            ck_assert_msg(memcmp(dx_apart, dx_fused, (size_t)nx * es) == 0, "dx (%s, %d threads)", ct_dtype_name(dt), t + 1);
            ck_assert_msg(memcmp(dw_apart, dw_fused, (size_t)nw * 4) == 0, "dw (%s, %d threads)", ct_dtype_name(dt), t + 1);
            ck_assert_msg(memcmp(db_apart, db_fused, (size_t)g.oc * 4) == 0, "db (%s, %d threads)", ct_dtype_name(dt), t + 1);
            free(x), free(w), free(b), free(dy), free(full), free(dfull), free(y_apart), free(y_fused);
            free(am_apart), free(am_fused), free(dw_apart), free(dw_fused), free(db_apart), free(db_fused);
            free(dx_apart), free(dx_fused);
        }
    free(x32), free(w32), free(b32), free(dy32);
}
END_TEST

/* ---- reductions: the summation order is part of the promise ---- */

/* The order cpu_reduce.c promises, written plainly: lane l sums the elements i with i % 8 == l in
 * index order (in double), then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). kind 0: x,
 * 1: x^2, 2: (x - mean)^2. Checkpoints and the determinism tests rest on these bits: a faster
 * kernel may not change them without saying so (docs/BENCHMARKS.md, "No wasted reductions"). */
static double lanes_ref(const float *x, int64_t n, int kind, double mean) {
    double lane[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        double v = kind == 0 ? x[i] : kind == 1 ? (double)x[i] * x[i] : (x[i] - mean) * (x[i] - mean);
        lane[i % 8] += v;
    }
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static bool same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

START_TEST(reduction_order_pinned) {
    /* magnitudes over 2^-20 .. 2^20 so that any other order of the adds changes the last bits */
    int64_t nmax = 3 * CT_CPU_CHUNK + 37;
    float *x = rnd(nmax, 270, -1, 1), *e = rnd(nmax, 271, -20, 20);
    for (int64_t i = 0; i < nmax; i++) x[i] = ldexpf(x[i], (int)e[i]);
    const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 63, 100, 1001, CT_CPU_CHUNK, nmax};
    int differs = 0; /* the test can fail: plain sequential sums give other bits */
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        int64_t n = lens[k];
        for (int off = 0; off < 3; off++) { /* unaligned starts too */
            const float *p = x + off;
            int64_t m = n + off <= nmax ? n : nmax - off;
            ck_assert_msg(same_bits(ct_cpu_sum(p, m), lanes_ref(p, m, 0, 0)), "sum n=%lld", (long long)m);
            ck_assert_msg(same_bits(ct_cpu_sum_squares(p, m), lanes_ref(p, m, 1, 0)), "sumsq n=%lld", (long long)m);
            ck_assert_msg(same_bits(ct_cpu_sum_sq_dev(p, m, 0.3), lanes_ref(p, m, 2, 0.3)), "sq_dev n=%lld",
                          (long long)m);
            double seq = 0;
            for (int64_t i = 0; i < m; i++) seq += p[i];
            differs += !same_bits(seq, lanes_ref(p, m, 0, 0));
        }
    }
    ck_assert_int_gt(differs, 10);
    /* the backend's sum of squares: CT_CPU_CHUNK chunks, their sums added in chunk order */
    double want = 0;
    for (int64_t c0 = 0; c0 < nmax; c0 += CT_CPU_CHUNK)
        want += lanes_ref(x + c0, nmax - c0 < CT_CPU_CHUNK ? nmax - c0 : CT_CPU_CHUNK, 1, 0);
    ck_assert(same_bits(be1->optim.sum_squares(be1, x, nmax), want));
    ck_assert(same_bits(be2->optim.sum_squares(be2, x, nmax), want));
    free(x), free(e);
}
END_TEST

/* all_finite finds one Inf or NaN in any lane and the tail; huge finite values and -0 pass. */
START_TEST(all_finite_every_position) {
    float x[41];
    for (int n = 1; n <= 41; n += 4) {
        for (int i = 0; i < n; i++) x[i] = i % 3 == 0 ? 3e38f : i % 3 == 1 ? -0.0f : -1.5f;
        ck_assert(be2->optim.all_finite(be2, x, n));
        for (int at = 0; at < n; at++) {
            float keep = x[at];
            x[at] = at % 2 ? -INFINITY : NAN;
            ck_assert_msg(!be2->optim.all_finite(be2, x, n), "n=%d at=%d", n, at);
            x[at] = keep;
        }
    }
}
END_TEST

/* ---- the pool, creation, memory ---- */

/* Many short jobs back to back on an oversubscribed pool (5 threads on a small machine): late
 * workers must never run a piece of the wrong job, and results never depend on who ran what. */
START_TEST(pool_stress) {
    ct_backend *be5 = ct_cpu_backend_create(5);
    int64_t n = 200000;
    float *x = rnd(n, 260, -1, 1), *y = malloc((size_t)n * 4);
    double want = be1->optim.sum_squares(be1, x, n);
    for (int it = 0; it < 300; it++) {
        int64_t len = 1 + (it * 7919) % n;
        double a = be5->optim.sum_squares(be5, x, len), b = be1->optim.sum_squares(be1, x, len);
        ck_assert(memcmp(&a, &b, sizeof a) == 0);
        be5->elt.fill(be5, y, (float)it, n, CT_F32);
        be5->elt.axpy(be5, y, 1.0f, x, n, CT_F32);
        ck_assert(y[0] == (float)it + x[0] && y[n - 1] == (float)it + x[n - 1]);
        ck_assert(y[n / 2] == (float)it + x[n / 2]);
    }
    double got = be5->optim.sum_squares(be5, x, n);
    ck_assert(memcmp(&got, &want, sizeof got) == 0);
    ct_backend_destroy(be5);
    free(x), free(y);
}
END_TEST

START_TEST(backend_create_and_memory) {
    ct_backend *be = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_backend_create("cpu", 1, &be, &err), CT_OK);
    ck_assert_str_eq(be->name, "cpu");
    ck_assert_int_eq(be->threads, 1);
    ck_assert(strstr(be->device_desc, "1 thread") != NULL);
    void *p = be->mem.alloc(be, 13, CT_MEM_WORKSPACE);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % 64, 0);
    be->mem.memset0(be, p, 13);
    ck_assert_uint_eq(be->mem.peak_bytes(be), 0);
    be->mem.free(be, p);
    ct_backend_destroy(be);
    be = NULL;
    ck_assert_int_eq(ct_backend_create("tpu", 1, &be, &err), CT_ERR_CONFIG);
    ck_assert_ptr_null(be);
    ck_assert(strstr(err.msg, "tpu") != NULL);
    ck_assert_int_eq(ct_backend_create("cuda:x", 1, &be, &err), CT_ERR_CONFIG);
#ifndef CT_HAVE_CUDA
    ck_assert(!ct_cuda_available());
    ck_assert_int_eq(ct_backend_create("cuda", 1, &be, &err), CT_ERR_RUNTIME);
    ck_assert(strstr(err.msg, "without CUDA") != NULL);
#endif
    if (!ct_cuda_available()) {
        ck_assert_int_eq(ct_backend_create("auto", 1, &be, &err), CT_OK);
        ck_assert_str_eq(be->name, "cpu");
        ct_backend_destroy(be);
    }
    /* 0 threads = every online core */
    ck_assert_int_eq(ct_backend_create("cpu", 0, &be, &err), CT_OK);
    ck_assert_int_ge(be->threads, 1);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(mem_stats_per_category) {
    ct_mem_stats m0, m;
    be2->mem.mem_stats(be2, &m0);
    void *a = be2->mem.alloc(be2, 1000, CT_MEM_ACTIVATIONS), *b = be2->mem.alloc(be2, 24, CT_MEM_OPTIM);
    void *c = be2->mem.alloc(be2, 5000, CT_MEM_ACTIVATIONS);
    ck_assert_uint_eq((uintptr_t)a % 64, 0);
    ck_assert_uint_eq((uintptr_t)b % 64, 0);
    memset(c, 1, 5000); /* the whole block is usable */
    be2->mem.mem_stats(be2, &m);
    ck_assert_uint_eq(m.current[CT_MEM_ACTIVATIONS] - m0.current[CT_MEM_ACTIVATIONS], 6000);
    ck_assert_uint_eq(m.current[CT_MEM_OPTIM] - m0.current[CT_MEM_OPTIM], 24);
    ck_assert_uint_eq(m.current[CT_MEM_PARAMS], m0.current[CT_MEM_PARAMS]);
    ck_assert_uint_eq(m.current_total - m0.current_total, 6024);
    be2->mem.free(be2, c);
    void *d = be2->mem.alloc(be2, 100, CT_MEM_PARAMS);
    be2->mem.mem_stats(be2, &m);
    ck_assert_uint_eq(m.current[CT_MEM_ACTIVATIONS] - m0.current[CT_MEM_ACTIVATIONS], 1000);
    ck_assert_uint_ge(m.peak[CT_MEM_ACTIVATIONS], m0.current[CT_MEM_ACTIVATIONS] + 6000);
    ck_assert_uint_ge(m.peak_total, m0.current_total + 6024);
    ck_assert_uint_eq(m.current_total - m0.current_total, 1124);
    /* pinned host memory is counted apart, in the host figures, by the category asked for */
    void *pin = be2->mem.alloc_host_pinned(be2, 4096, CT_MEM_LOADER);
    void *pin2 = be2->mem.alloc_host_pinned(be2, 1000, CT_MEM_OPTIM);
    ck_assert_uint_eq((uintptr_t)pin % 64, 0);
    ck_assert_uint_eq((uintptr_t)pin2 % 64, 0);
    memset(pin, 1, 4096), memset(pin2, 2, 1000);
    ct_mem_stats m2;
    be2->mem.mem_stats(be2, &m2);
    ck_assert_uint_eq(m2.current_total, m.current_total);
    ck_assert_uint_eq(m2.host_current[CT_MEM_LOADER] - m.host_current[CT_MEM_LOADER], 4096);
    ck_assert_uint_eq(m2.host_current[CT_MEM_OPTIM] - m.host_current[CT_MEM_OPTIM], 1000);
    ck_assert_uint_eq(m2.host_current_total - m.host_current_total, 5096);
    be2->mem.free_host_pinned(be2, pin);
    be2->mem.mem_stats(be2, &m2);
    ck_assert_uint_eq(m2.host_current_total - m.host_current_total, 1000);
    ck_assert_uint_ge(m2.host_peak_total, m.host_current_total + 5096);
    be2->mem.free_host_pinned(be2, pin2);
    be2->mem.free(be2, a), be2->mem.free(be2, b), be2->mem.free(be2, d);
    be2->mem.mem_stats(be2, &m);
    for (int k = 0; k < CT_MEM_CAT_COUNT; k++) ck_assert_uint_eq(m.current[k], m0.current[k]);
    ck_assert_uint_eq(be2->mem.peak_bytes(be2), 0);
    ck_assert_str_eq(ct_mem_cat_name(CT_MEM_PARAMS), "params");
    ck_assert_str_eq(ct_mem_cat_name(CT_MEM_LOADER), "loader");
}
END_TEST

/* ---- the GEMM libraries, each against an fp64 reference (cpu_gemm.c, cpu_onednn.c) ----
 * Every library that loaded, on the shape classes ct_cpu_gemm_lib_for tells apart (transposes,
 * long and short k, n and k >= 512) plus odd sizes, with padded leading dimensions (their padding
 * must stay untouched) and beta 0 over a NaN-poisoned C (C must not be read); and ct_cpu_sgemm
 * must give the bits of the library it picks. test/e2e_gemm_paths.sh runs this again with
 * oneDNN held to SSE4.1 (ONEDNN_MAX_CPU_ISA), as on a CPU without AVX2. */
static void sgemm_ref(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, const float *c0,
                      int64_t ldc, double *want, double *scale) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
                double t = (double)(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
                acc += t, mag += fabs(t);
            }
            want[i * n + j] = alpha * acc + (beta != 0 ? beta * (double)c0[i * ldc + j] : 0);
            scale[i * n + j] = fabs(alpha) * mag + fabs(beta * (beta != 0 ? c0[i * ldc + j] : 0));
        }
}

/* A copy of C0 [m, ldc] to run a GEMM into: where beta is 0 its m x n entries are NaN, since C
 * must not be read then (a NaN that survives shows it was). */
static float *gemm_c(const float *c0, int64_t m, int64_t n, int64_t ldc, float beta) {
    float *c = copyf(c0, m * ldc);
    for (int64_t i = 0; beta == 0 && i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] = NAN;
    return c;
}

/* C [m, n] (leading dimension ldc) within tol_rel x scale of the fp64 reference, and its padding
 * columns the bytes of c0's; `what` names the call in the failure. */
static void expect_gemm(const char *what, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                        float beta, const float *c, const float *c0, int64_t ldc, const double *want,
                        const double *scale, double tol_rel) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double got = c[i * ldc + j], tol = tol_rel * (scale[i * n + j] + 1e-30);
            if (!(fabs(got - want[i * n + j]) <= tol))
                ck_abort_msg("%s, %c%c %lldx%lldx%lld, alpha %g beta %g: C[%lld,%lld] = %.9g, fp64 %.9g", what,
                             ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, alpha, beta,
                             (long long)i, (long long)j, got, want[i * n + j]);
        }
        for (int64_t j = n; j < ldc; j++)   /* the padding is left alone */
            ck_assert(memcmp(&c[i * ldc + j], &c0[i * ldc + j], sizeof(float)) == 0);
    }
}

START_TEST(sgemm_each_library_against_fp64) {
    ct_err err = {0};
    ck_assert_int_eq(ct_cpu_blas_load(&err), CT_OK);
    static const int64_t shapes[][5] = {/* ta tb m n k */
        {0, 1, 128, 128, 784}, {1, 0, 512, 104, 128}, {1, 0, 10, 512, 128}, {1, 0, 288, 196, 64},
        {0, 0, 128, 512, 512}, {0, 0, 32, 784, 9},    {0, 1, 32, 9, 784},   {0, 0, 256, 512, 10},
        {1, 1, 37, 53, 29},    {0, 0, 1, 1, 1},       {1, 1, 7, 130, 600}};
    static const float alphas[] = {1.0f, 0.7f}, betas[] = {0.0f, 1.0f};
    int libs_run = 0;
    for (int lib = CT_GEMM_OPENBLAS; lib <= CT_GEMM_ONEDNN; lib++) {
        if (!ct_cpu_gemm_lib_loaded((ct_gemm_lib)lib)) continue;
        libs_run++;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            bool ta = shapes[s][0], tb = shapes[s][1];
            int64_t m = shapes[s][2], n = shapes[s][3], k = shapes[s][4];
            int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
            float *a = rnd((ta ? k : m) * lda, 400 + s, -1, 1), *b = rnd((tb ? n : k) * ldb, 500 + s, -1, 1);
            float *c0 = rnd(m * ldc, 600 + s, -1, 1);
            double *want = malloc((size_t)(m * n) * sizeof(double)), *scale = malloc((size_t)(m * n) * sizeof(double));
            for (int v = 0; v < 2; v++) {
                float alpha = alphas[v], beta = betas[v];
                float *c = gemm_c(c0, m, n, ldc, beta), *picked = gemm_c(c0, m, n, ldc, beta);
                sgemm_ref(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want, scale);
                ct_cpu_sgemm_with((ct_gemm_lib)lib, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
                char what[32];
                snprintf(what, sizeof what, "library %d", lib);
                expect_gemm(what, ta, tb, m, n, k, alpha, beta, c, c0, ldc, want, scale, 1e-6 * sqrt((double)k + 1));
                if (ct_cpu_gemm_lib_for(ta, tb, m, n, k) == (ct_gemm_lib)lib) {
                    ct_cpu_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, picked, ldc);
                    ck_assert(memcmp(picked, c, (size_t)(m * ldc) * sizeof(float)) == 0);
                }
                free(c), free(picked);
            }
            free(a), free(b), free(c0), free(want), free(scale);
        }
    }
    ck_assert_int_ge(libs_run, 1);
    /* the picks follow the measured classes when both are there and nothing is forced */
    const char *forced = getenv("CTRAIN_CPU_GEMM");
    if (ct_cpu_gemm_lib_loaded(CT_GEMM_ONEDNN) && (!forced || !*forced || !strcmp(forced, "auto"))) {
        ck_assert_int_eq(ct_cpu_gemm_lib_for(false, true, 128, 128, 784), CT_GEMM_ONEDNN);
        ck_assert_int_eq(ct_cpu_gemm_lib_for(true, false, 512, 104, 128), CT_GEMM_OPENBLAS);
        ck_assert_int_eq(ct_cpu_gemm_lib_for(true, false, 10, 512, 128), CT_GEMM_ONEDNN);
        ck_assert_int_eq(ct_cpu_gemm_lib_for(false, false, 128, 512, 512), CT_GEMM_OPENBLAS);
        ck_assert_int_eq(ct_cpu_gemm_lib_for(false, false, 32, 784, 9), CT_GEMM_ONEDNN);
    }
}
END_TEST

/* oneDNN's GEMM with signals arriving all the time (SIGALRM every 200 us, a handler that uses
 * some stack): each call's result is unchanged and the heap intact. Without the signal mask of
 * cpu_onednn.c this aborted in free() within a few calls ("corrupted size vs. prev_size"). */
static volatile sig_atomic_t alarms;
static void on_alarm(int sig) {
    volatile char scratch[256];
    for (int i = 0; i < 256; i++) scratch[i] = (char)sig;
    alarms = alarms + (scratch[255] == (char)sig);
}

START_TEST(onednn_gemm_under_signals) {
    ct_err err = {0};
    ck_assert_int_eq(ct_cpu_blas_load(&err), CT_OK);
    if (!ct_cpu_gemm_lib_loaded(CT_GEMM_ONEDNN)) return; /* nothing to check without it */
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGALRM, &sa, &old), 0);
    static const int64_t shapes[][5] = {{0, 1, 256, 256, 2048}, {1, 0, 4, 2048, 256}, {0, 0, 256, 1024, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        bool ta = shapes[s][0], tb = shapes[s][1];
        int64_t m = shapes[s][2], n = shapes[s][3], k = shapes[s][4], lda = ta ? m : k, ldb = tb ? k : n;
        float *a = rnd(m * k, 700 + s, -1, 1), *b = rnd(k * n, 710 + s, -1, 1);
        float *want = malloc((size_t)(m * n) * 4), *got = malloc((size_t)(m * n) * 4);
        ct_cpu_sgemm_with(CT_GEMM_ONEDNN, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, want, n);
        struct itimerval every = {{0, 200}, {0, 200}}, off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &every, NULL);
        for (int r = 0; r < 60; r++) {
            ct_cpu_sgemm_with(CT_GEMM_ONEDNN, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, got, n);
            ck_assert(memcmp(got, want, (size_t)(m * n) * 4) == 0);
            void *churn = malloc(1 << 16);   /* lets malloc see a corrupted heap */
            free(churn);
        }
        setitimer(ITIMER_REAL, &off, NULL);
        free(a), free(b), free(want), free(got);
    }
    ck_assert_int_gt(alarms, 0);
    sigaction(SIGALRM, &old, NULL);
}
END_TEST

/* oneDNN's matmul primitive as cpu_onednn_bf16.c runs it (a primitive per tile shape cached per
 * thread, strided operands, alpha as an output scale, beta as a sum post-op), against fp64 sums of
 * the operands' values, on the shapes the linear layers make (tiles split by rows and by columns,
 * both transposes, padded leading dimensions that must stay untouched, beta 0 over a NaN-poisoned
 * C), and the same bits on 1 and 2 threads. bf16: the native path, where the CPU multiplies bf16;
 * fp32: the same code with fp32 operands, which runs on any CPU (this project's AVX2 build machine
 * has no bf16 matmul in oneDNN at all, so that is what checks the plumbing here). */
static void matmul_against_fp64(bool bf16) {
    static const int64_t shapes[][5] = {/* ta tb m n k */
        {0, 1, 128, 512, 784}, {1, 0, 512, 104, 128}, {0, 0, 512, 128, 512}, {0, 1, 37, 1000, 29},
        {1, 1, 7, 130, 600}, {0, 0, 1, 1, 1}};
    static const float alphas[] = {1.0f, 0.7f}, betas[] = {0.0f, 1.0f};
    for (int round = 0; round < 2; round++)   /* the second round finds every primitive cached */
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            bool ta = shapes[s][0], tb = shapes[s][1];
            int64_t m = shapes[s][2], n = shapes[s][3], k = shapes[s][4];
            int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
            int64_t a_n = (ta ? k : m) * lda, b_n = (tb ? n : k) * ldb;
            float *a = rnd(a_n, 800 + s, -1, 1), *b = rnd(b_n, 810 + s, -1, 1), *c0 = rnd(m * ldc, 820 + s, -1, 1);
            uint16_t *a16 = malloc((size_t)a_n * 2), *b16 = malloc((size_t)b_n * 2);
            ct_cpu_cast_range(a16, CT_BF16, a, CT_F32, 0, a_n);
            ct_cpu_cast_range(b16, CT_BF16, b, CT_F32, 0, b_n);
            if (bf16) {   /* the values the GEMM sees, exactly */
                ct_cpu_cast_range(a, CT_F32, a16, CT_BF16, 0, a_n);
                ct_cpu_cast_range(b, CT_F32, b16, CT_BF16, 0, b_n);
            }
            double *want = malloc((size_t)(m * n) * sizeof(double)), *scale = malloc((size_t)(m * n) * sizeof(double));
            for (int v = 0; v < 2; v++) {
                float alpha = alphas[v], beta = betas[v];
                float *c1 = gemm_c(c0, m, n, ldc, beta), *c2 = gemm_c(c0, m, n, ldc, beta);
                sgemm_ref(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want, scale);
                if (bf16) {
                    ct_cpu_bf16_gemm(be1, ta, tb, m, n, k, alpha, a16, lda, b16, ldb, beta, c1, ldc);
                    ct_cpu_bf16_gemm(be2, ta, tb, m, n, k, alpha, a16, lda, b16, ldb, beta, c2, ldc);
                } else {
                    ck_assert(ct_cpu_onednn_matmul_f32(be1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c1, ldc));
                    ck_assert(ct_cpu_onednn_matmul_f32(be2, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c2, ldc));
                }
                ck_assert_msg(memcmp(c1, c2, (size_t)(m * ldc) * sizeof(float)) == 0,
                              "%s %c%c %lldx%lldx%lld: 1 and 2 threads differ", bf16 ? "bf16" : "fp32",
                              ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k);
                /* each product exact, the sums within a few fp32 roundings of the magnitudes */
                expect_gemm(bf16 ? "bf16" : "fp32", ta, tb, m, n, k, alpha, beta, c1, c0, ldc, want, scale,
                            4.0 * (double)(k + 2) * 0x1p-24);
                free(c1), free(c2);
            }
            free(a), free(b), free(c0), free(a16), free(b16), free(want), free(scale);
        }
}

START_TEST(onednn_matmul_plumbing_fp32) {
    ct_err err = {0};
    ck_assert_int_eq(ct_cpu_blas_load(&err), CT_OK);
    if (!ct_cpu_gemm_lib_loaded(CT_GEMM_ONEDNN)) return; /* nothing to check without oneDNN */
    matmul_against_fp64(false);
}
END_TEST

/* Where the CPU has no native bf16, the start block's line must say that bf16 computes in fp32;
 * where it has (or CTRAIN_CPU_BF16=emulate writes its arithmetic out in C), the line says which,
 * and ct_cpu_bf16_gemm is held to the fp64 reference. */
START_TEST(bf16_gemm_native_or_said) {
    ct_err err = {0};
    ck_assert_int_eq(ct_cpu_blas_load(&err), CT_OK);
    const char *note = ct_cpu_bf16_note();
    ck_assert_ptr_nonnull(note);
    if (!ct_cpu_bf16_native()) {
        ck_assert_ptr_nonnull(strstr(note, "computed in fp32"));
        fprintf(stderr, "test_cpu_ops: bf16_gemm_native_or_said: not native here (%s)\n", note);
        return;
    }
    ck_assert_ptr_nonnull(strstr(note, ct_cpu_bf16_emulation() ? "emulated" : "natively"));
    matmul_against_fp64(true);
}
END_TEST

START_TEST(upload_tickets) {
    float *src = rnd(777, 300, -1, 1), *dst = calloc(777, 4);
    uint64_t t1 = be2->queue.upload(be2, dst, src, 777 * 4, be2->queue.compute_mark(be2));
    ck_assert_uint_gt(t1, 0);
    ck_assert(be2->queue.upload_done(be2, t1, false));
    ck_assert(memcmp(dst, src, 777 * 4) == 0);
    uint64_t t2 = be2->queue.upload(be2, dst, src, 4, 0);
    ck_assert_uint_gt(t2, t1);
    ck_assert(be2->queue.upload_done(be2, t2, true));
    free(src), free(dst);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, f16_conversions);
    tcase_add_test(tc, bf16_conversions);
    tcase_add_test(tc, cast_from_u8);
    tcase_add_test(tc, bf16_casts_match_scalar);
    tcase_add_test(tc, dropout_mask_statistics);
    tcase_add_test(tc, act_backward_in_place);
    tcase_add_test(tc, conv2d_backward_dw_only);
    tcase_add_test(tc, conv2d_act_pool_matches_the_ops_apart);
    tcase_add_test(tc, reduction_order_pinned);
    tcase_add_test(tc, all_finite_every_position);
    tcase_add_test(tc, pool_stress);
    tcase_add_test(tc, backend_create_and_memory);
    tcase_add_test(tc, mem_stats_per_category);
    tcase_add_test(tc, upload_tickets);
    tcase_add_test(tc, sgemm_each_library_against_fp64);
    tcase_add_test(tc, onednn_gemm_under_signals);
    tcase_add_test(tc, onednn_matmul_plumbing_fp32);
    tcase_add_test(tc, bf16_gemm_native_or_said);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

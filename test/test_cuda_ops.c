/* test_cuda_ops.c: every CUDA backend op against the CPU backend (the reference).
 *
 * Inputs are fresh Philox draws each run (seed printed; CT_TEST_SEED=N repeats a run), never
 * zeros. Every GPU output that an op writes (rather than accumulates into) is poisoned with NaN
 * (or a byte pattern for integer outputs) before the op, so an element the kernel forgets to write
 * shows up. Results are compared by relative error ||gpu - cpu|| / ||cpu|| with the per-dtype
 * tolerances below; integer outputs (argmax, dropout masks, correct counts, casts) must match
 * exactly.
 *
 * Without a usable GPU (or in a build without CUDA) it prints "no CUDA device: skipped" and exits
 * 77, which the test runner reports as skipped. Check's fork mode is off: a CUDA context does not
 * survive fork(), and the probe has already created one in this process. */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/rng.h"
#ifdef CT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

#define TOL_F32 1e-5
#define TOL_TF32 1e-3
#define TOL_16 1e-2

static ct_backend *cpu, *gpu;
static uint64_t seed;
static uint64_t stream_ctr; /* every random array draws from its own stream */

/* ---- helpers ---- */

/* n uniform values in [lo, hi), never exactly zero. */
static float *hrand(int64_t n, float lo, float hi) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, stream_ctr++);
    for (int64_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * ct_rng_uniform(&r);
        x[i] = v != 0.0f ? v : (hi + lo) * 0.5f + 0.125f;
    }
    return x;
}

static float *hcopy(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* Device copy of host data. */
static void *up(const void *h, size_t bytes) {
    void *d = gpu->alloc(gpu, bytes);
    ck_assert_ptr_nonnull(d);
    gpu->copy_h2d(gpu, d, h, bytes);
    return d;
}

/* Device float buffer full of NaN. */
static float *poison(int64_t n) {
    float *d = gpu->alloc(gpu, (size_t)(n > 0 ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(d);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    gpu->copy_h2d(gpu, d, h, (size_t)n * sizeof(float));
    free(h);
    return d;
}

/* Device buffer of `bytes` bytes all equal to 0x5A (integer outputs). */
static void *poison_bytes(size_t bytes) {
    void *d = gpu->alloc(gpu, bytes ? bytes : 1);
    ck_assert_ptr_nonnull(d);
    void *h = malloc(bytes ? bytes : 1);
    memset(h, 0x5A, bytes);
    gpu->copy_h2d(gpu, d, h, bytes);
    free(h);
    return d;
}

static void *down(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    gpu->copy_d2h(gpu, h, d, bytes);
    return h;
}

static double rel_err(const float *got, const float *want, int64_t n, int64_t *first_bad) {
    double num = 0.0, den = 0.0;
    *first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i]) && *first_bad < 0) *first_bad = i;
        if (isnan(want[i])) continue;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* GPU buffer d (n floats) against the CPU result h. */
static void expect_rel(const char *what, const float *d, const float *h, int64_t n, double tol) {
    float *g = down(d, (size_t)n * sizeof(float));
    int64_t bad;
    double e = rel_err(g, h, n, &bad);
    ck_assert_msg(bad < 0, "%s: element %lld is %g on the GPU, %g on the CPU (unwritten?)", what,
                  (long long)bad, bad >= 0 ? g[bad] : 0.0, bad >= 0 ? h[bad] : 0.0);
    ck_assert_msg(e <= tol, "%s: relative error %.3g > %.1g (n=%lld, seed %llu)", what, e, tol,
                  (long long)n, (unsigned long long)seed);
    free(g);
}

static void expect_same_bytes(const char *what, const void *d, const void *h, size_t bytes) {
    unsigned char *g = down(d, bytes);
    const unsigned char *c = h;
    for (size_t i = 0; i < bytes; i++)
        ck_assert_msg(g[i] == c[i], "%s: byte %zu is 0x%02x on the GPU, 0x%02x on the CPU", what,
                      i, g[i], c[i]);
    free(g);
}

static void expect_scalar(const char *what, double got, double want, double tol) {
    double e = fabs(got - want) / (fabs(want) > 0 ? fabs(want) : 1.0);
    ck_assert_msg(e <= tol, "%s: GPU %.10g, CPU %.10g (relative %.3g > %.1g)", what, got, want, e,
                  tol);
}

static void gfree(void *d) { gpu->free(gpu, d); }

/* ---- memory ---- */

START_TEST(memory_and_copies) {
    int64_t n = 100003;
    float *h = hrand(n, -1, 1);
    /* pageable and pinned sources, device-to-device, memset */
    float *d = up(h, (size_t)n * 4);
    float *pin = gpu->alloc_host_pinned(gpu, (size_t)n * 4);
    ck_assert_ptr_nonnull(pin);
    memcpy(pin, h, (size_t)n * 4);
    float *d2 = poison(n);
    gpu->copy_h2d(gpu, d2, pin, (size_t)n * 4);
    memset(pin, 0, (size_t)n * 4); /* the copy must be complete once copy_h2d returned */
    expect_same_bytes("h2d pinned", d2, h, (size_t)n * 4);
    float *d3 = poison(n);
    gpu->copy_d2d(gpu, d3, d, (size_t)n * 4);
    expect_same_bytes("d2d", d3, h, (size_t)n * 4);
    gpu->copy_d2h(gpu, pin, d, (size_t)n * 4);
    ck_assert(memcmp(pin, h, (size_t)n * 4) == 0);
    gpu->memset0(gpu, d3, 400);
    float *back = down(d3, 800);
    for (int i = 0; i < 100; i++) ck_assert(back[i] == 0.0f);
    for (int i = 100; i < 200; i++) ck_assert(back[i] == h[i]);
    free(back);
    gpu->free_host_pinned(gpu, pin);
    /* the caching allocator reuses a freed block of the same size without cudaMalloc */
#ifdef CT_HAVE_CUDA
    ct_cuda_mem_stats s0, s1;
    gfree(d3);
    ct_cuda_get_mem_stats(gpu, &s0);
    void *again = gpu->alloc(gpu, (size_t)n * 4);
    ct_cuda_get_mem_stats(gpu, &s1);
    ck_assert_uint_eq(s1.n_cuda_malloc, s0.n_cuda_malloc);
    ck_assert_uint_ge(s1.live_bytes, s0.live_bytes + (size_t)n * 4);
    ck_assert_uint_ge(gpu->peak_bytes(gpu), s1.live_bytes);
    ck_assert((uintptr_t)again % 64 == 0);
    gfree(again);
#else
    gfree(d3);
#endif
    gpu->sync(gpu);
    gfree(d), gfree(d2);
    free(h);
}
END_TEST

/* ---- GEMM ---- */

static uint16_t *to16(const float *x, int64_t n, ct_dtype dt) {
    uint16_t *y = malloc((size_t)(n > 0 ? n : 1) * 2);
    cpu->cast(cpu, y, dt, x, CT_F32, n);
    return y;
}

/* One GEMM on both backends. C starts random (same on both) when beta != 0, else the GPU's is NaN. */
static void gemm_case(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta,
                      ct_dtype adt, ct_dtype bdt, ct_dtype cdt, double tol, const char *what) {
    int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
    int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    float *a = hrand(na, -1, 1), *b = hrand(nb, -1, 1), *c = hrand(nc, -1, 1);
    size_t ea = ct_dtype_size(adt), eb = ct_dtype_size(bdt), ec = ct_dtype_size(cdt);
    void *ha = adt == CT_F32 ? (void *)hcopy(a, na) : (void *)to16(a, na, adt);
    void *hb = bdt == CT_F32 ? (void *)hcopy(b, nb) : (void *)to16(b, nb, bdt);
    void *hc = cdt == CT_F32 ? (void *)hcopy(c, nc) : (void *)to16(c, nc, cdt);
    void *da = up(ha, (size_t)na * ea), *db = up(hb, (size_t)nb * eb);
    void *dc;
    if (beta != 0.0f || cdt != CT_F32) {
        dc = up(hc, (size_t)nc * ec);
    } else {
        /* poison the rows' n columns only: padding must stay as it was */
        float *pc = hcopy(c, nc);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) pc[i * ldc + j] = NAN;
        dc = up(pc, (size_t)nc * 4);
        free(pc);
    }
    cpu->gemm(cpu, ta, tb, m, n, k, alpha, ha, adt, lda, hb, bdt, ldb, beta, hc, cdt, ldc);
    gpu->gemm(gpu, ta, tb, m, n, k, alpha, da, adt, lda, db, bdt, ldb, beta, dc, cdt, ldc);
    float *want = malloc((size_t)nc * 4), *gotf = malloc((size_t)nc * 4);
    void *got = down(dc, (size_t)nc * ec);
    cpu->cast(cpu, want, CT_F32, hc, cdt, nc);
    cpu->cast(cpu, gotf, CT_F32, got, cdt, nc);
    float *dgot = up(gotf, (size_t)nc * 4);
    expect_rel(what, dgot, want, nc, tol); /* includes the padding columns: they must match too */
    gfree(dgot), gfree(da), gfree(db), gfree(dc);
    free(a), free(b), free(c), free(ha), free(hb), free(hc), free(want), free(gotf), free(got);
}

START_TEST(gemm_fp32_all_transposes) {
    const int64_t dims[][3] = {{1, 1, 1}, {37, 53, 29}, {128, 64, 256}, {5, 300, 1000}};
    char what[64];
    for (int d = 0; d < 4; d++)
        for (int t = 0; t < 4; t++) {
            snprintf(what, sizeof what, "gemm f32 dims %d ta %d tb %d", d, t & 1, (t >> 1) & 1);
            gemm_case(t & 1, t & 2, dims[d][0], dims[d][1], dims[d][2], 0.7f, 0.3f, CT_F32,
                      CT_F32, CT_F32, TOL_F32, what);
            gemm_case(t & 1, t & 2, dims[d][0], dims[d][1], dims[d][2], 1.0f, 0.0f, CT_F32,
                      CT_F32, CT_F32, TOL_F32, what);
        }
    gemm_case(false, false, 9, 11, 0, 1.0f, 0.5f, CT_F32, CT_F32, CT_F32, TOL_F32, "gemm k=0");
    gemm_case(false, false, 9, 11, 0, 1.0f, 0.0f, CT_F32, CT_F32, CT_F32, TOL_F32, "gemm k=0 b=0");
}
END_TEST

START_TEST(gemm_tf32_and_16bit) {
#ifdef CT_HAVE_CUDA
    ct_cuda_set_tf32(gpu, true);
    gemm_case(false, true, 64, 96, 512, 1.0f, 0.0f, CT_F32, CT_F32, CT_F32, TOL_TF32, "gemm tf32");
    ct_cuda_set_tf32(gpu, false);
#endif
    const ct_dtype h[2] = {CT_F16, CT_BF16};
    for (int i = 0; i < 2; i++) {
        gemm_case(false, false, 33, 65, 130, 1.0f, 0.0f, h[i], h[i], CT_F32, TOL_16, "gemm 16->32");
        gemm_case(true, false, 33, 65, 130, 0.5f, 1.0f, h[i], h[i], CT_F32, TOL_16, "gemm 16->32 ta");
        gemm_case(false, true, 64, 64, 64, 1.0f, 0.0f, h[i], h[i], h[i], TOL_16, "gemm 16->16");
        gemm_case(true, true, 17, 31, 47, 1.0f, 0.5f, h[i], h[i], h[i], TOL_16, "gemm 16->16 tt");
        /* mixes cuBLASLt lacks: promoted to fp32 */
        gemm_case(false, true, 20, 30, 40, 1.0f, 0.0f, h[i], CT_F32, CT_F32, TOL_16, "gemm mix a16");
        gemm_case(false, false, 20, 30, 40, 1.0f, 0.25f, CT_F32, CT_F32, h[i], TOL_16, "gemm f32->16");
    }
}
END_TEST

START_TEST(gemm_batched_op) {
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int64_t m = 19, n = 23, k = 31, batch = 5;
        int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
        int64_t sa = (ta ? k : m) * lda + 7, sb = (tb ? n : k) * ldb + 5, sc = m * ldc + 1;
        float *a = hrand(sa * batch, -1, 1), *b = hrand(sb * batch, -1, 1);
        float *c = hrand(sc * batch, -1, 1);
        float *da = up(a, (size_t)(sa * batch) * 4), *db = up(b, (size_t)(sb * batch) * 4);
        float *dc = up(c, (size_t)(sc * batch) * 4);
        cpu->gemm_batched(cpu, ta, tb, m, n, k, 0.9f, a, lda, sa, b, ldb, sb, 0.4f, c, ldc, sc, batch);
        gpu->gemm_batched(gpu, ta, tb, m, n, k, 0.9f, da, lda, sa, db, ldb, sb, 0.4f, dc, ldc, sc, batch);
        expect_rel("gemm_batched", dc, c, sc * batch, TOL_F32);
        gfree(da), gfree(db), gfree(dc);
        free(a), free(b), free(c);
    }
}
END_TEST

/* ---- element-wise ---- */

START_TEST(vector_ops) {
    int64_t n = 100003;
    float *x = hrand(n, -2, 2), *y = hrand(n, -2, 2);
    float *dx = up(x, (size_t)n * 4), *dy = up(y, (size_t)n * 4);
    float *out = poison(n);
    gpu->fill(gpu, out, 0.375f, n);
    float *want = malloc((size_t)n * 4);
    cpu->fill(cpu, want, 0.375f, n);
    expect_rel("fill", out, want, n, 0);
    gpu->add(gpu, out, dx, dy, n);
    cpu->add(cpu, want, x, y, n);
    expect_rel("add", out, want, n, TOL_F32);
    gpu->axpy(gpu, out, -0.7f, dx, n);
    cpu->axpy(cpu, want, -0.7f, x, n);
    expect_rel("axpy", out, want, n, TOL_F32);
    gpu->scale(gpu, out, 1.5f, n);
    cpu->scale(cpu, want, 1.5f, n);
    expect_rel("scale", out, want, n, TOL_F32);
    /* copy_rows into the middle of a wider matrix, then accumulate */
    int64_t rows = 37, cols = 19, ldx = 23, ldy = 50, col0 = 7;
    float *src = hrand(rows * ldx, -1, 1), *dst = hrand(rows * ldy, -1, 1);
    float *dsrc = up(src, (size_t)(rows * ldx) * 4), *ddst = up(dst, (size_t)(rows * ldy) * 4);
    for (int acc = 0; acc < 2; acc++) {
        cpu->copy_rows(cpu, dst + col0, ldy, src, ldx, rows, cols, acc);
        gpu->copy_rows(gpu, ddst + col0, ldy, dsrc, ldx, rows, cols, acc);
        expect_rel(acc ? "copy_rows accumulate" : "copy_rows", ddst, dst, rows * ldy, TOL_F32);
    }
    gfree(dx), gfree(dy), gfree(out), gfree(dsrc), gfree(ddst);
    free(x), free(y), free(want), free(src), free(dst);
}
END_TEST

START_TEST(cast_op) {
    int64_t n = 70001;
    float *x = hrand(n, -70000, 70000);
    x[0] = NAN, x[1] = 1e-6f, x[2] = -3e-8f, x[3] = INFINITY, x[4] = 65520.0f;
    const ct_dtype dts[3] = {CT_F32, CT_F16, CT_BF16};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            ct_dtype from = dts[i], to = dts[j];
            size_t ef = ct_dtype_size(from), et = ct_dtype_size(to);
            void *src = malloc((size_t)n * ef), *want = malloc((size_t)n * et);
            cpu->cast(cpu, src, from, x, CT_F32, n);
            cpu->cast(cpu, want, to, src, from, n);
            void *dsrc = up(src, (size_t)n * ef), *ddst = poison_bytes((size_t)n * et);
            gpu->cast(gpu, ddst, to, dsrc, from, n);
            char what[32];
            snprintf(what, sizeof what, "cast %d->%d", (int)from, (int)to);
            expect_same_bytes(what, ddst, want, (size_t)n * et); /* bit-exact */
            gfree(dsrc), gfree(ddst);
            free(src), free(want);
        }
    free(x);
}
END_TEST

START_TEST(round_to_op) {
    /* Mixed precision's rounding in place: bit-exact with the CPU (NaN payloads aside, so none). */
    int64_t n = 70001;
    float *x = hrand(n, -70000, 70000);
    x[1] = 1e-6f, x[2] = -3e-8f, x[3] = INFINITY, x[4] = 65520.0f, x[5] = 1.0f + 0x1p-11f, x[6] = 0x1.8p-24f;
    for (int64_t i = 7; i < n; i += 3) x[i] *= 1e-9f;   /* fp16 subnormals */
    const ct_dtype dts[2] = {CT_F16, CT_BF16};
    for (int i = 0; i < 2; i++) {
        float *want = hcopy(x, n);
        cpu->round_to(cpu, want, n, dts[i]);
        float *d = up(x, (size_t)n * sizeof(float));
        gpu->round_to(gpu, d, n, dts[i]);
        expect_same_bytes(dts[i] == CT_F16 ? "round_to f16" : "round_to bf16", d, want, (size_t)n * sizeof(float));
        gfree(d);
        free(want);
    }
    free(x);
}
END_TEST

START_TEST(activations) {
    int64_t n = 50021;
    float *x = hrand(n, -6, 6), *dyv = hrand(n, -1, 1);
    float *dx = up(x, (size_t)n * 4), *ddy = up(dyv, (size_t)n * 4);
    float *y = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
    for (int a = CT_ACT_NONE; a <= CT_ACT_SIGMOID; a++) {
        float *dyo = poison(n), *dgo = poison(n);
        cpu->act_forward(cpu, y, x, n, (ct_act)a, 0.1f);
        gpu->act_forward(gpu, dyo, dx, n, (ct_act)a, 0.1f);
        char what[48];
        snprintf(what, sizeof what, "act_forward %d", a);
        expect_rel(what, dyo, y, n, TOL_F32);
        cpu->act_backward(cpu, g, dyv, x, y, n, (ct_act)a, 0.1f);
        gpu->act_backward(gpu, dgo, ddy, dx, dyo, n, (ct_act)a, 0.1f);
        snprintf(what, sizeof what, "act_backward %d", a);
        expect_rel(what, dgo, g, n, TOL_F32);
        gfree(dyo), gfree(dgo);
    }
    gfree(dx), gfree(ddy);
    free(x), free(dyv), free(y), free(g);
}
END_TEST

START_TEST(bias_act_and_bias_backward) {
    const int64_t shapes[][3] = {{33, 130, 1}, {7, 16, 49}, {1000, 10, 1}, {3, 5, 1025}};
    for (int s = 0; s < 4; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], inner = shapes[s][2];
        int64_t n = rows * cols * inner;
        float *x = hrand(n, -2, 2), *bias = hrand(cols, -1, 1), *db = hrand(cols, -1, 1);
        float *dx = up(x, (size_t)n * 4), *dbias = up(bias, (size_t)cols * 4);
        float *ddb = up(db, (size_t)cols * 4);
        cpu->bias_act_forward(cpu, x, bias, rows, cols, inner, CT_ACT_GELU, 0.0f);
        gpu->bias_act_forward(gpu, dx, dbias, rows, cols, inner, CT_ACT_GELU, 0.0f);
        expect_rel("bias_act_forward", dx, x, n, TOL_F32);
        cpu->bias_backward(cpu, db, x, rows, cols, inner);
        gpu->bias_backward(gpu, ddb, dx, rows, cols, inner);
        expect_rel("bias_backward", ddb, db, cols, TOL_F32);
        gfree(dx), gfree(dbias), gfree(ddb);
        free(x), free(bias), free(db);
    }
}
END_TEST

START_TEST(dropout_op) {
    const int64_t sizes[] = {1, 5, 4099, 100003};
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        float *x = hrand(n, -1, 1), *dyv = hrand(n, -1, 1);
        float *y = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
        uint8_t *mask = malloc((size_t)n);
        float *dx = up(x, (size_t)n * 4), *ddy = up(dyv, (size_t)n * 4);
        float *dyo = poison(n), *dgo = poison(n);
        uint8_t *dmask = poison_bytes((size_t)n);
        cpu->dropout_forward(cpu, y, mask, x, n, 0.3f, seed, 12345 + (uint64_t)s);
        gpu->dropout_forward(gpu, dyo, dmask, dx, n, 0.3f, seed, 12345 + (uint64_t)s);
        expect_same_bytes("dropout mask", dmask, mask, (size_t)n);
        expect_rel("dropout forward", dyo, y, n, TOL_F32);
        cpu->dropout_backward(cpu, g, dyv, mask, n, 0.3f);
        gpu->dropout_backward(gpu, dgo, ddy, dmask, n, 0.3f);
        expect_rel("dropout backward", dgo, g, n, TOL_F32);
        gfree(dx), gfree(ddy), gfree(dyo), gfree(dgo), gfree(dmask);
        free(x), free(dyv), free(y), free(g), free(mask);
    }
}
END_TEST

/* ---- convolution support and pooling ---- */

static ct_conv2d_geom conv_geom(int64_t c, int64_t h, int64_t w, int64_t k, int64_t s, int64_t p,
                                int64_t d, int64_t groups) {
    ct_conv2d_geom g = {.n = 1, .c = c, .h = h, .w = w, .oc = 8, .kh = k, .kw = k, .stride_h = s,
                        .stride_w = s, .pad_h = p, .pad_w = p, .dil_h = d, .dil_w = d,
                        .groups = groups};
    g.oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
    g.ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
    return g;
}

START_TEST(im2col_col2im) {
    ct_conv2d_geom gs[3] = {conv_geom(3, 28, 28, 3, 1, 1, 1, 1), conv_geom(4, 13, 11, 3, 2, 1, 1, 2),
                            conv_geom(6, 15, 17, 3, 2, 2, 2, 3)};
    for (int t = 0; t < 3; t++) {
        const ct_conv2d_geom *g = &gs[t];
        int64_t cg = g->c / g->groups, nimg = g->c * g->h * g->w;
        int64_t ncol = cg * g->kh * g->kw * g->oh * g->ow;
        float *img = hrand(nimg, -1, 1);
        float *dimg = up(img, (size_t)nimg * 4);
        for (int64_t grp = 0; grp < g->groups; grp++) {
            float *col = malloc((size_t)ncol * 4), *dcol = poison(ncol);
            cpu->im2col(cpu, col, img, g, grp);
            gpu->im2col(gpu, dcol, dimg, g, grp);
            expect_rel("im2col", dcol, col, ncol, 0); /* a gather: exact */
            /* col2im of fresh values into a random image (it accumulates) */
            float *c2 = hrand(ncol, -1, 1), *acc = hrand(nimg, -1, 1);
            float *dc2 = up(c2, (size_t)ncol * 4), *dacc = up(acc, (size_t)nimg * 4);
            cpu->col2im(cpu, acc, c2, g, grp);
            gpu->col2im(gpu, dacc, dc2, g, grp);
            expect_rel("col2im", dacc, acc, nimg, TOL_F32);
            gfree(dcol), gfree(dc2), gfree(dacc);
            free(col), free(c2), free(acc);
        }
        gfree(dimg);
        free(img);
    }
}
END_TEST

static ct_pool2d_geom pool_geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t s,
                                int64_t p, bool include_pad) {
    ct_pool2d_geom g = {.n = n, .c = c, .h = h, .w = w, .kh = k, .kw = k, .stride_h = s,
                        .stride_w = s, .pad_h = p, .pad_w = p, .count_include_pad = include_pad};
    g.oh = (h + 2 * p - k) / s + 1;
    g.ow = (w + 2 * p - k) / s + 1;
    return g;
}

START_TEST(pooling) {
    ct_pool2d_geom gs[3] = {pool_geom(4, 3, 28, 28, 2, 2, 0, true), pool_geom(2, 5, 13, 11, 3, 2, 1, true),
                            pool_geom(3, 2, 9, 10, 3, 1, 1, false)};
    for (int t = 0; t < 3; t++) {
        const ct_pool2d_geom *g = &gs[t];
        int64_t nx = g->n * g->c * g->h * g->w, ny = g->n * g->c * g->oh * g->ow;
        float *x = hrand(nx, -3, 3), *dyv = hrand(ny, -1, 1);
        float *dx = up(x, (size_t)nx * 4), *ddy = up(dyv, (size_t)ny * 4);
        float *y = malloc((size_t)ny * 4), *gx = malloc((size_t)nx * 4);
        int32_t *am = malloc((size_t)ny * 4);
        float *dyo = poison(ny), *dgx = poison(nx);
        int32_t *dam = poison_bytes((size_t)ny * 4);
        cpu->maxpool2d_forward(cpu, y, am, x, g);
        gpu->maxpool2d_forward(gpu, dyo, dam, dx, g);
        expect_rel("maxpool forward", dyo, y, ny, 0);
        expect_same_bytes("maxpool argmax", dam, am, (size_t)ny * 4);
        cpu->maxpool2d_backward(cpu, gx, dyv, am, g);
        gpu->maxpool2d_backward(gpu, dgx, ddy, dam, g);
        expect_rel("maxpool backward", dgx, gx, nx, TOL_F32);
        gfree(dyo), gfree(dgx);
        dyo = poison(ny), dgx = poison(nx);
        cpu->avgpool2d_forward(cpu, y, x, g);
        gpu->avgpool2d_forward(gpu, dyo, dx, g);
        expect_rel("avgpool forward", dyo, y, ny, TOL_F32);
        cpu->avgpool2d_backward(cpu, gx, dyv, g);
        gpu->avgpool2d_backward(gpu, dgx, ddy, g);
        expect_rel("avgpool backward", dgx, gx, nx, TOL_F32);
        gfree(dx), gfree(ddy), gfree(dyo), gfree(dgx), gfree(dam);
        free(x), free(dyv), free(y), free(gx), free(am);
    }
}
END_TEST

/* ---- normalization ---- */

START_TEST(batchnorm) {
    const int64_t shapes[][3] = {{32, 16, 49}, {64, 100, 1}, {3, 7, 1031}};
    for (int s = 0; s < 3; s++) {
        int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], total = n * c * hw;
        float *x = hrand(total, -2, 3), *gamma = hrand(c, 0.5f, 1.5f), *beta = hrand(c, -1, 1);
        float *rm = hrand(c, -0.1f, 0.1f), *rv = hrand(c, 0.9f, 1.1f), *dyv = hrand(total, -1, 1);
        float *dg = hrand(c, -1, 1), *dbt = hrand(c, -1, 1);
        float *d_x = up(x, (size_t)total * 4), *d_g = up(gamma, (size_t)c * 4);
        float *d_b = up(beta, (size_t)c * 4), *d_rm = up(rm, (size_t)c * 4);
        float *d_rv = up(rv, (size_t)c * 4), *d_dy = up(dyv, (size_t)total * 4);
        float *d_dg = up(dg, (size_t)c * 4), *d_dbt = up(dbt, (size_t)c * 4);
        float *y = malloc((size_t)total * 4), *sm = malloc((size_t)c * 4), *si = malloc((size_t)c * 4);
        float *d_y = poison(total), *d_sm = poison(c), *d_si = poison(c);
        cpu->batchnorm_forward(cpu, y, x, gamma, beta, rm, rv, sm, si, n, c, hw, 1e-5f, 0.1f, true);
        gpu->batchnorm_forward(gpu, d_y, d_x, d_g, d_b, d_rm, d_rv, d_sm, d_si, n, c, hw, 1e-5f,
                               0.1f, true);
        expect_rel("bn forward y", d_y, y, total, TOL_F32);
        expect_rel("bn save_mean", d_sm, sm, c, TOL_F32);
        expect_rel("bn save_invstd", d_si, si, c, TOL_F32);
        expect_rel("bn running_mean", d_rm, rm, c, TOL_F32);
        expect_rel("bn running_var", d_rv, rv, c, TOL_F32);
        float *gx = malloc((size_t)total * 4), *d_gx = poison(total);
        cpu->batchnorm_backward(cpu, gx, dg, dbt, dyv, x, gamma, sm, si, n, c, hw);
        gpu->batchnorm_backward(gpu, d_gx, d_dg, d_dbt, d_dy, d_x, d_g, d_sm, d_si, n, c, hw);
        expect_rel("bn backward dx", d_gx, gx, total, TOL_F32);
        expect_rel("bn backward dgamma", d_dg, dg, c, TOL_F32);
        expect_rel("bn backward dbeta", d_dbt, dbt, c, TOL_F32);
        gfree(d_y);
        d_y = poison(total);
        cpu->batchnorm_forward(cpu, y, x, gamma, beta, rm, rv, NULL, NULL, n, c, hw, 1e-5f, 0.1f, false);
        gpu->batchnorm_forward(gpu, d_y, d_x, d_g, d_b, d_rm, d_rv, NULL, NULL, n, c, hw, 1e-5f,
                               0.1f, false);
        expect_rel("bn eval y", d_y, y, total, TOL_F32);
        gfree(d_x), gfree(d_g), gfree(d_b), gfree(d_rm), gfree(d_rv), gfree(d_dy), gfree(d_dg);
        gfree(d_dbt), gfree(d_y), gfree(d_sm), gfree(d_si), gfree(d_gx);
        free(x), free(gamma), free(beta), free(rm), free(rv), free(dyv), free(dg), free(dbt);
        free(y), free(sm), free(si), free(gx);
    }
}
END_TEST

START_TEST(layernorm) {
    const int64_t shapes[][2] = {{64, 768}, {1000, 10}, {3, 5000}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], d = shapes[s][1], total = rows * d;
        float *x = hrand(total, -2, 3), *gamma = hrand(d, 0.5f, 1.5f), *beta = hrand(d, -1, 1);
        float *dyv = hrand(total, -1, 1), *dg = hrand(d, -1, 1), *dbt = hrand(d, -1, 1);
        float *d_x = up(x, (size_t)total * 4), *d_g = up(gamma, (size_t)d * 4);
        float *d_b = up(beta, (size_t)d * 4), *d_dy = up(dyv, (size_t)total * 4);
        float *d_dg = up(dg, (size_t)d * 4), *d_dbt = up(dbt, (size_t)d * 4);
        float *y = malloc((size_t)total * 4), *sm = malloc((size_t)rows * 4);
        float *sr = malloc((size_t)rows * 4), *gx = malloc((size_t)total * 4);
        float *d_y = poison(total), *d_sm = poison(rows), *d_sr = poison(rows), *d_gx = poison(total);
        cpu->layernorm_forward(cpu, y, sm, sr, x, gamma, beta, rows, d, 1e-5f);
        gpu->layernorm_forward(gpu, d_y, d_sm, d_sr, d_x, d_g, d_b, rows, d, 1e-5f);
        expect_rel("ln forward y", d_y, y, total, TOL_F32);
        expect_rel("ln save_mean", d_sm, sm, rows, TOL_F32);
        expect_rel("ln save_rstd", d_sr, sr, rows, TOL_F32);
        cpu->layernorm_backward(cpu, gx, dg, dbt, dyv, x, gamma, sm, sr, rows, d);
        gpu->layernorm_backward(gpu, d_gx, d_dg, d_dbt, d_dy, d_x, d_g, d_sm, d_sr, rows, d);
        expect_rel("ln backward dx", d_gx, gx, total, TOL_F32);
        expect_rel("ln backward dgamma", d_dg, dg, d, TOL_F32);
        expect_rel("ln backward dbeta", d_dbt, dbt, d, TOL_F32);
        gfree(d_x), gfree(d_g), gfree(d_b), gfree(d_dy), gfree(d_dg), gfree(d_dbt), gfree(d_y);
        gfree(d_sm), gfree(d_sr), gfree(d_gx);
        free(x), free(gamma), free(beta), free(dyv), free(dg), free(dbt), free(y), free(sm);
        free(sr), free(gx);
    }
}
END_TEST

/* ---- embedding ---- */

START_TEST(embedding) {
    int64_t vocab = 1000, dim = 67, n_ids = 4099;
    int32_t *ids = malloc((size_t)n_ids * 4);
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, stream_ctr++);
    /* a skewed distribution: many repeats of a few ids, plus ids outside the table */
    for (int64_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)(i % 5 == 0 ? ct_rng_below(&r, 8) : ct_rng_below(&r, (uint32_t)vocab));
    ids[3] = -1;
    ids[10] = (int32_t)vocab + 5; /* skipped by the backward; the forward's table must be larger */
    float *table = hrand((vocab + 10) * dim, -1, 1), *dyv = hrand(n_ids * dim, -1, 1);
    float *dt = hrand(vocab * dim, -1, 1);
    int32_t *d_ids = up(ids, (size_t)n_ids * 4);
    float *d_table = up(table, (size_t)((vocab + 10) * dim) * 4);
    float *d_dy = up(dyv, (size_t)(n_ids * dim) * 4), *d_dt = up(dt, (size_t)(vocab * dim) * 4);
    float *y = malloc((size_t)(n_ids * dim) * 4), *d_y = poison(n_ids * dim);
    cpu->embedding_forward(cpu, y, ids, table, n_ids, dim);
    gpu->embedding_forward(gpu, d_y, d_ids, d_table, n_ids, dim);
    expect_rel("embedding forward", d_y, y, n_ids * dim, 0);
    cpu->embedding_backward(cpu, dt, dyv, ids, n_ids, vocab, dim);
    gpu->embedding_backward(gpu, d_dt, d_dy, d_ids, n_ids, vocab, dim);
    /* same summation order on both: bit-exact */
    expect_same_bytes("embedding backward", d_dt, dt, (size_t)(vocab * dim) * 4);
    gfree(d_ids), gfree(d_table), gfree(d_dy), gfree(d_dt), gfree(d_y);
    free(ids), free(table), free(dyv), free(dt), free(y);
}
END_TEST

/* ---- losses and reductions ---- */

START_TEST(softmax_cross_entropy) {
    const int64_t shapes[][2] = {{256, 10}, {33, 1000}, {4, 50257}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], classes = shapes[s][1];
        float *x = hrand(rows * classes, -8, 8);
        int32_t *labels = malloc((size_t)rows * 4);
        ct_rng r;
        ct_rng_init(&r, seed, CT_RNG_INIT, stream_ctr++);
        for (int64_t i = 0; i < rows; i++) labels[i] = (int32_t)ct_rng_below(&r, (uint32_t)classes);
        if (rows > 3) labels[1] = -100, labels[2] = (int32_t)classes; /* ignored rows */
        /* make some rows' argmax the label so `correct` is not trivially 0 */
        for (int64_t i = 0; i < rows; i += 3)
            if (labels[i] >= 0 && labels[i] < classes) x[i * classes + labels[i]] = 20.0f;
        float *d_x = up(x, (size_t)(rows * classes) * 4);
        int32_t *d_l = up(labels, (size_t)rows * 4);
        for (int ls = 0; ls < 2; ls++) {
            float smoothing = ls ? 0.1f : 0.0f;
            float *g = malloc((size_t)(rows * classes) * 4), *d_g = poison(rows * classes);
            float lc = -1, lg = -2;
            int64_t cc = -1, cg = -2;
            cpu->softmax_xent(cpu, g, &lc, &cc, x, labels, rows, classes, smoothing, 64.0f);
            gpu->softmax_xent(gpu, d_g, &lg, &cg, d_x, d_l, rows, classes, smoothing, 64.0f);
            expect_scalar("xent loss", lg, lc, TOL_F32);
            ck_assert_int_eq(cg, cc);
            ck_assert_int_gt(cc, 0);
            expect_rel("xent dlogits", d_g, g, rows * classes, TOL_F32);
            gfree(d_g);
            free(g);
        }
        gfree(d_x), gfree(d_l);
        free(x), free(labels);
    }
}
END_TEST

START_TEST(mse_and_bce) {
    int64_t rows = 129, cols = 37, n = rows * cols;
    float *p = hrand(n, -3, 3), *t = hrand(n, 0, 1);
    float *d_p = up(p, (size_t)n * 4), *d_t = up(t, (size_t)n * 4);
    float *g = malloc((size_t)n * 4), *d_g = poison(n);
    float lc, lg;
    cpu->mse_loss(cpu, g, &lc, p, t, rows, cols, 8.0f);
    gpu->mse_loss(gpu, d_g, &lg, d_p, d_t, rows, cols, 8.0f);
    expect_scalar("mse loss", lg, lc, TOL_F32);
    expect_rel("mse grad", d_g, g, n, TOL_F32);
    gfree(d_g);
    d_g = poison(n);
    cpu->bce_logits_loss(cpu, g, &lc, p, t, rows, cols, 8.0f);
    gpu->bce_logits_loss(gpu, d_g, &lg, d_p, d_t, rows, cols, 8.0f);
    expect_scalar("bce loss", lg, lc, TOL_F32);
    expect_rel("bce grad", d_g, g, n, TOL_F32);
    gfree(d_p), gfree(d_t), gfree(d_g);
    free(p), free(t), free(g);
}
END_TEST

START_TEST(reductions) {
    const int64_t sizes[] = {1, 1000, 100003, 20000000};
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        float *x = hrand(n, -1, 1);
        float *d = up(x, (size_t)n * 4);
        expect_scalar("sum_squares", gpu->sum_squares(gpu, d, n), cpu->sum_squares(cpu, x, n), 1e-10);
        ck_assert(gpu->all_finite(gpu, d, n));
        float bad[2] = {INFINITY, NAN};
        for (int b = 0; b < 2; b++) {
            gpu->copy_h2d(gpu, d + n / 2, &bad[b], 4);
            ck_assert(!gpu->all_finite(gpu, d, n));
            gpu->copy_h2d(gpu, d + n / 2, &x[n / 2], 4);
        }
        ck_assert(gpu->all_finite(gpu, d, n));
        gfree(d);
        free(x);
    }
}
END_TEST

/* ---- optimizers ---- */

START_TEST(adam_both_modes) {
    int64_t n = 100003;
    for (int mode = 0; mode < 2; mode++) {
        float *p = hrand(n, -1, 1), *g = hrand(n, -1, 1), *m = hrand(n, -0.1f, 0.1f);
        float *v = hrand(n, 0.001f, 0.01f);
        float *d_p = up(p, (size_t)n * 4), *d_g = up(g, (size_t)n * 4), *d_m = up(m, (size_t)n * 4);
        float *d_v = up(v, (size_t)n * 4);
        ct_adam_args a = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                          .weight_decay = 0.05f, .bias_c1 = 1 - 0.9f * 0.9f,
                          .bias_c2 = 1 - 0.999f * 0.999f, .grad_scale = 0.5f, .decoupled = mode};
        for (int step = 0; step < 3; step++) {
            cpu->adam_step(cpu, p, g, m, v, n, &a);
            gpu->adam_step(gpu, d_p, d_g, d_m, d_v, n, &a);
        }
        expect_rel("adam param", d_p, p, n, TOL_F32);
        expect_rel("adam m", d_m, m, n, TOL_F32);
        expect_rel("adam v", d_v, v, n, TOL_F32);
        gfree(d_p), gfree(d_g), gfree(d_m), gfree(d_v);
        free(p), free(g), free(m), free(v);
    }
}
END_TEST

START_TEST(sgd_variants) {
    int64_t n = 50001;
    for (int variant = 0; variant < 4; variant++) {
        float *p = hrand(n, -1, 1), *g = hrand(n, -1, 1), *mom = hrand(n, -0.1f, 0.1f);
        float *d_p = up(p, (size_t)n * 4), *d_g = up(g, (size_t)n * 4);
        float *d_mom = up(mom, (size_t)n * 4);
        ct_sgd_args a = {.lr = 0.1f, .momentum = variant ? 0.9f : 0.0f, .dampening = 0.1f,
                         .weight_decay = 1e-4f, .grad_scale = 0.25f, .nesterov = variant == 2,
                         .first_step = variant == 3};
        cpu->sgd_step(cpu, p, g, mom, n, &a);
        gpu->sgd_step(gpu, d_p, d_g, d_mom, n, &a);
        expect_rel("sgd param", d_p, p, n, TOL_F32);
        expect_rel("sgd momentum", d_mom, mom, n, TOL_F32);
        gfree(d_p), gfree(d_g), gfree(d_mom);
        free(p), free(g), free(mom);
    }
}
END_TEST

START_TEST(lamb_direction_op) {
    int64_t n = 70001;
    for (int inside = 0; inside < 2; inside++) {
        float *p = hrand(n, -1, 1), *g = hrand(n, -1, 1), *m = hrand(n, -0.1f, 0.1f);
        float *v = hrand(n, 0.001f, 0.01f), *u = malloc((size_t)n * 4);
        float *d_p = up(p, (size_t)n * 4), *d_g = up(g, (size_t)n * 4), *d_m = up(m, (size_t)n * 4);
        float *d_v = up(v, (size_t)n * 4), *d_u = poison(n);
        ct_lamb_args a = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f,
                          .bias_c1 = 0.1f, .bias_c2 = 0.001f, .grad_scale = 1.0f,
                          .eps_inside_sqrt = inside};
        double wc, uc, wg, ug;
        cpu->lamb_direction(cpu, u, p, g, m, v, n, &a, &wc, &uc);
        gpu->lamb_direction(gpu, d_u, d_p, d_g, d_m, d_v, n, &a, &wg, &ug);
        expect_rel("lamb update", d_u, u, n, TOL_F32);
        expect_rel("lamb m", d_m, m, n, TOL_F32);
        expect_rel("lamb v", d_v, v, n, TOL_F32);
        expect_scalar("lamb ||w||", wg, wc, TOL_F32);
        expect_scalar("lamb ||u||", ug, uc, TOL_F32);
        gfree(d_p), gfree(d_g), gfree(d_m), gfree(d_v), gfree(d_u);
        free(p), free(g), free(m), free(v), free(u);
    }
}
END_TEST

/* Every function pointer after `destroy` is an op: all must be filled (a new op added to
 * backend.h without a CUDA kernel shows up here). */
START_TEST(op_table_complete) {
    size_t first = offsetof(ct_backend, destroy), n = (sizeof(ct_backend) - first) / sizeof(void *);
    for (size_t i = 0; i < n; i++) {
        void *fn = NULL;
        memcpy(&fn, (const char *)gpu + first + i * sizeof(void *), sizeof fn);
        ck_assert_msg(fn != NULL, "op table entry %zu (after destroy) is NULL", i);
    }
}
END_TEST

START_TEST(backend_errors) {
    ct_backend *be = NULL;
    ct_err err = {0};
    ck_assert_int_ne(ct_backend_create("cuda:999", 1, &be, &err), CT_OK);
    ck_assert_ptr_null(be);
    ck_assert_msg(strstr(err.msg, "999") != NULL, "message names the device: %s", err.msg);
    ck_assert_msg(strstr(gpu->device_desc, "sm_") != NULL, "device_desc: %s", gpu->device_desc);
}
END_TEST

int main(void) {
    if (!ct_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *env = getenv("CT_TEST_SEED");
    seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    printf("test_cuda_ops: seed %llu (CT_TEST_SEED=%llu repeats this run)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    cpu = ct_cpu_backend_create(0);
    ct_err err = {0};
    if (ct_backend_create("cuda", 0, &gpu, &err) != CT_OK || !cpu) {
        fprintf(stderr, "cannot create the backends: %s\n", err.msg);
        return 1;
    }
    printf("device: %s\n", gpu->device_desc);

    Suite *s = suite_create("cuda_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, op_table_complete);
    tcase_add_test(tc, memory_and_copies);
    tcase_add_test(tc, gemm_fp32_all_transposes);
    tcase_add_test(tc, gemm_tf32_and_16bit);
    tcase_add_test(tc, gemm_batched_op);
    tcase_add_test(tc, vector_ops);
    tcase_add_test(tc, cast_op);
    tcase_add_test(tc, round_to_op);
    tcase_add_test(tc, activations);
    tcase_add_test(tc, bias_act_and_bias_backward);
    tcase_add_test(tc, dropout_op);
    tcase_add_test(tc, im2col_col2im);
    tcase_add_test(tc, pooling);
    tcase_add_test(tc, batchnorm);
    tcase_add_test(tc, layernorm);
    tcase_add_test(tc, embedding);
    tcase_add_test(tc, softmax_cross_entropy);
    tcase_add_test(tc, mse_and_bce);
    tcase_add_test(tc, reductions);
    tcase_add_test(tc, adam_both_modes);
    tcase_add_test(tc, sgd_variants);
    tcase_add_test(tc, lamb_direction_op);
    tcase_add_test(tc, backend_errors);
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

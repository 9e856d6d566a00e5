/* test_cuda_ops.c: what the CUDA backend is checked for beyond its ops against the CPU backend
 * (those are the rows of test_ops.c, run by `make test-cuda` with CT_TEST_DEVICE=cuda): a complete
 * op table, memory and copies (pinned, device to device, the caching allocator), TF32 GEMMs,
 * the whole-batch convolution against a direct double convolution (with and without bias, dw
 * accumulated twice without dx and db), the fused linear layer (cuBLASLt epilogues) against
 * gemm + bias_act, the optimizers' fused 16-bit copy against rounding the GPU's own parameters,
 * and device errors.
 *
 * Inputs are fresh Philox draws each run (seed printed; CT_TEST_SEED=N repeats a run), never
 * zeros. Every GPU output that an op writes (rather than accumulates into) is poisoned with NaN
 * (or a byte pattern for integer outputs) before the op, so an element the kernel forgets to write
 * shows up. Results are compared element by element: |gpu - ref| <= rtol (|ref| + rms(ref)), rtol
 * by dtype below (about three ulps of a 16-bit output; the rms of the reference is the atol of
 * elements where a sum cancelled), so a few wrong elements among many fail as surely as all of
 * them. Ops that take a dtype run in f32, f16 and bf16: inputs are rounded to the dtype on the
 * host, so the references see exactly what the GPU reads.
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

#include "core/backend/backend.h"
#include "core/device/device.h"
#include "core/util/rng.h"
#include "test/conv_ref.h"
#include "test/cuda_pair.h"
#ifdef CT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

/* rtol of the elementwise bound: fp32, TF32 GEMMs (10-bit operands: a product is off by up to
 * 2^-10, a sum of k of them by ~4e-4 of the output's rms), and about three ulps of fp16 and bf16
 * (the output's rounding, a bias rounded separately, fp32 differences under them) */
#define TOL_F32 1e-5
#define TOL_TF32 4e-3
#define TOL_F16 3e-3
#define TOL_BF16 2.4e-2

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
    void *d = gpu->mem.alloc(gpu, bytes, CT_MEM_ACTIVATIONS);
    ck_assert_ptr_nonnull(d);
    gpu->mem.copy_h2d(gpu, d, h, bytes);
    return d;
}

/* Device float buffer full of NaN. */
static float *poison(int64_t n) {
    float *d = gpu->mem.alloc(gpu, (size_t)(n > 0 ? n : 1) * sizeof(float), CT_MEM_ACTIVATIONS);
    ck_assert_ptr_nonnull(d);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    gpu->mem.copy_h2d(gpu, d, h, (size_t)n * sizeof(float));
    free(h);
    return d;
}

/* Device buffer of `bytes` bytes all equal to 0x5A (integer outputs). */
static void *poison_bytes(size_t bytes) {
    void *d = gpu->mem.alloc(gpu, bytes ? bytes : 1, CT_MEM_ACTIVATIONS);
    ck_assert_ptr_nonnull(d);
    void *h = malloc(bytes ? bytes : 1);
    memset(h, 0x5A, bytes);
    gpu->mem.copy_h2d(gpu, d, h, bytes);
    free(h);
    return d;
}

static void *down(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    gpu->mem.copy_d2h(gpu, h, d, bytes);
    return h;
}

/* Host arrays: the GPU's result g against the reference h, element by element:
 * |g - h| <= rtol (|h| + rms(h)); a NaN must be a NaN on both sides (an unwritten element is NaN). */
static void check_close(const char *what, const float *g, const float *h, int64_t n, double rtol) {
    double sq = 0.0;
    int64_t finite = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(h[i])) sq += (double)h[i] * h[i], finite++;
    double rms = finite ? sqrt(sq / (double)finite) : 0.0, worst_ratio = 0.0;
    int64_t bad = 0, worst = -1;
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(isnan(g[i]) == isnan(h[i]), "%s: element %lld is %g on the GPU, %g on the CPU (unwritten?)",
                      what, (long long)i, g[i], h[i]);
        if (isnan(h[i])) continue;
        double d = fabs((double)g[i] - h[i]), allowed = rtol * (fabs((double)h[i]) + rms);
        double ratio = allowed > 0.0 ? d / allowed : (d > 0.0 ? INFINITY : 0.0);
        if (ratio > 1.0) bad++;
        if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
    ck_assert_msg(bad == 0, "%s: %lld of %lld elements off by more than %.1g (|ref| + rms %.3g), worst [%lld]: "
                  "GPU %.9g, reference %.9g (seed %llu)", what, (long long)bad, (long long)n, rtol, rms,
                  (long long)worst, worst >= 0 ? g[worst] : 0.0, worst >= 0 ? h[worst] : 0.0,
                  (unsigned long long)seed);
}

/* GPU buffer d (n floats) against the reference h. */
static void expect_close(const char *what, const float *d, const float *h, int64_t n, double rtol) {
    float *g = down(d, (size_t)n * sizeof(float));
    check_close(what, g, h, n, rtol);
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

static void gfree(void *d) { gpu->mem.free(gpu, d); }

/* ---- typed arrays (op table v2: activations in f32, f16 or bf16) ---- */

static const ct_dtype DTS[3] = {CT_F32, CT_F16, CT_BF16};
static double tol_of(ct_dtype dt) { return dt == CT_F16 ? TOL_F16 : dt == CT_BF16 ? TOL_BF16 : TOL_F32; }

/* x (fp32) stored in dt on the host, rounded by the CPU backend's cast. */
static void *hdt(const float *x, int64_t n, ct_dtype dt) {
    void *y = malloc((size_t)(n > 0 ? n : 1) * ct_dtype_size(dt));
    cpu->elt.cast(cpu, y, dt, x, CT_F32, n);
    return y;
}

/* Host array of n elements of dt as fp32. */
static float *hf32(const void *x, int64_t n, ct_dtype dt) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    cpu->elt.cast(cpu, y, CT_F32, x, dt, n);
    return y;
}

/* Device copy of host data already stored in dt. */
static void *upd(const void *h, int64_t n, ct_dtype dt) { return up(h, (size_t)n * ct_dtype_size(dt)); }

/* Device buffer of n NaNs in dt. */
static void *poison_dt(int64_t n, ct_dtype dt) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = NAN;
    void *hd = hdt(h, n, dt);
    void *d = upd(hd, n, dt);
    free(h), free(hd);
    return d;
}

/* ---- memory ---- */

START_TEST(memory_and_copies) {
    int64_t n = 100003;
    float *h = hrand(n, -1, 1);
    /* pageable and pinned sources, device-to-device, memset */
    float *d = up(h, (size_t)n * 4);
    float *pin = gpu->mem.alloc_host_pinned(gpu, (size_t)n * 4, CT_MEM_WORKSPACE);
    ck_assert_ptr_nonnull(pin);
    memcpy(pin, h, (size_t)n * 4);
    float *d2 = poison(n);
    gpu->mem.copy_h2d(gpu, d2, pin, (size_t)n * 4);
    memset(pin, 0, (size_t)n * 4); /* the copy must be complete once copy_h2d returned */
    expect_same_bytes("h2d pinned", d2, h, (size_t)n * 4);
    float *d3 = poison(n);
    gpu->mem.copy_d2d(gpu, d3, d, (size_t)n * 4);
    expect_same_bytes("d2d", d3, h, (size_t)n * 4);
    gpu->mem.copy_d2h(gpu, pin, d, (size_t)n * 4);
    ck_assert(memcmp(pin, h, (size_t)n * 4) == 0);
    gpu->mem.memset0(gpu, d3, 400);
    float *back = down(d3, 800);
    for (int i = 0; i < 100; i++) ck_assert(back[i] == 0.0f);
    for (int i = 100; i < 200; i++) ck_assert(back[i] == h[i]);
    free(back);
    gpu->mem.free_host_pinned(gpu, pin);
    /* the caching allocator reuses a freed block of the same size without cudaMalloc */
#ifdef CT_HAVE_CUDA
    ct_cuda_mem_stats s0, s1;
    gfree(d3);
    ct_cuda_get_mem_stats(gpu, &s0);
    void *again = gpu->mem.alloc(gpu, (size_t)n * 4, CT_MEM_ACTIVATIONS);
    ct_cuda_get_mem_stats(gpu, &s1);
    ck_assert_uint_eq(s1.n_cuda_malloc, s0.n_cuda_malloc);
    ck_assert_uint_ge(s1.live_bytes, s0.live_bytes + (size_t)n * 4);
    ck_assert_uint_ge(gpu->mem.peak_bytes(gpu), s1.live_bytes);
    ck_assert((uintptr_t)again % 64 == 0);
    gfree(again);
#else
    gfree(d3);
#endif
    gpu->queue.sync(gpu);
    gfree(d), gfree(d2);
    free(h);
}
END_TEST

/* ---- GEMM ---- */

static uint16_t *to16(const float *x, int64_t n, ct_dtype dt) {
    uint16_t *y = malloc((size_t)(n > 0 ? n : 1) * 2);
    cpu->elt.cast(cpu, y, dt, x, CT_F32, n);
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
    cpu->blas.gemm(cpu, ta, tb, m, n, k, alpha, ha, adt, lda, hb, bdt, ldb, beta, hc, cdt, ldc);
    gpu->blas.gemm(gpu, ta, tb, m, n, k, alpha, da, adt, lda, db, bdt, ldb, beta, dc, cdt, ldc);
    float *want = malloc((size_t)nc * 4), *gotf = malloc((size_t)nc * 4);
    void *got = down(dc, (size_t)nc * ec);
    cpu->elt.cast(cpu, want, CT_F32, hc, cdt, nc);
    cpu->elt.cast(cpu, gotf, CT_F32, got, cdt, nc);
    float *dgot = up(gotf, (size_t)nc * 4);
    expect_close(what, dgot, want, nc, tol); /* includes the padding columns: they must match too */
    gfree(dgot), gfree(da), gfree(db), gfree(dc);
    free(a), free(b), free(c), free(ha), free(hb), free(hc), free(want), free(gotf), free(got);
}

/* TF32 tensor cores for fp32 GEMMs (ct_cuda_set_tf32, off by default): within 1e-3 of the CPU.
 * (A build without CUDA never gets here: main exits 77 first.) */
START_TEST(gemm_tf32) {
#ifdef CT_HAVE_CUDA
    ct_cuda_set_tf32(gpu, true);
#endif
    gemm_case(false, true, 64, 96, 512, 1.0f, 0.0f, CT_F32, CT_F32, CT_F32, TOL_TF32, "gemm tf32");
#ifdef CT_HAVE_CUDA
    ct_cuda_set_tf32(gpu, false);
#endif
}
END_TEST

/* ---- whole-batch convolution and the fused linear layer, against direct references ---- */

static ct_conv2d_geom conv_geom(int64_t c, int64_t h, int64_t w, int64_t k, int64_t s, int64_t p,
                                int64_t d, int64_t groups) {
    ct_conv2d_geom g = {.n = 1, .c = c, .h = h, .w = w, .oc = 8, .kh = k, .kw = k, .stride_h = s,
                        .stride_w = s, .pad_h = p, .pad_w = p, .dil_h = d, .dil_w = d,
                        .groups = groups};
    g.oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
    g.ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
    return g;
}

/* n floats widened to double (NULL stays NULL). */
static double *widen(const float *x, int64_t n) {
    if (!x) return NULL;
    double *d = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* test/conv_ref.h's direct convolution on fp32 values: y (+ bias) and dx rounded to fp32, dw and
 * db added to in double. The independent reference for the batched ops. */
static void conv_ref(const ct_conv2d_geom *g, const float *x, const float *w, const float *b,
                     float *y, const float *dy, float *dx, double *dw, double *db) {
    int64_t nx = g->n * g->c * g->h * g->w, ny = g->n * g->oc * g->oh * g->ow;
    double *xd = widen(x, nx), *wd = widen(w, g->oc * (g->c / g->groups) * g->kh * g->kw);
    double *bd = widen(b, g->oc), *dyd = widen(dy, ny);
    double *yd = y ? malloc((size_t)ny * sizeof(double)) : NULL, *dxd = dx ? malloc((size_t)nx * sizeof(double)) : NULL;
    conv_direct(g, xd, wd, bd, yd, dyd, dxd, dw, db);
    for (int64_t i = 0; y && i < ny; i++) y[i] = (float)yd[i];
    for (int64_t i = 0; dx && i < nx; i++) dx[i] = (float)dxd[i];
    free(xd), free(wd), free(bd), free(dyd), free(yd), free(dxd);
}

START_TEST(conv2d_batched) {
    ct_conv2d_geom gs[3] = {conv_geom(3, 12, 12, 3, 1, 1, 1, 1), conv_geom(4, 13, 11, 3, 2, 1, 1, 2),
                            conv_geom(6, 9, 10, 3, 2, 2, 2, 3)};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
            ct_conv2d_geom g = gs[s];
            g.n = 5;
            g.oc = 3 * g.groups; /* out channels divisible by the groups */
            int64_t nx = g.n * g.c * g.h * g.w, ny = g.n * g.oc * g.oh * g.ow;
            int64_t nw = g.oc * (g.c / g.groups) * g.kh * g.kw;
            /* inputs rounded to dt first, so the reference sees exactly what the GPU reads */
            float *x = hrand(nx, -1, 1), *w = hrand(nw, -0.5f, 0.5f), *b = hrand(g.oc, -1, 1);
            float *dyv = hrand(ny, -1, 1), *dw0 = hrand(nw, -1, 1), *db0 = hrand(g.oc, -1, 1);
            void *hx = hdt(x, nx, dt), *hw = hdt(w, nw, dt), *hb = hdt(b, g.oc, dt);
            void *hdy = hdt(dyv, ny, dt);
            float *xr = hf32(hx, nx, dt), *wr = hf32(hw, nw, dt), *br = hf32(hb, g.oc, dt);
            float *dyr = hf32(hdy, ny, dt);
            void *dx_ = upd(hx, nx, dt), *dw_ = upd(hw, nw, dt), *db_ = upd(hb, g.oc, dt);
            void *ddy = upd(hdy, ny, dt), *dy_out = poison_dt(ny, dt), *dgx = poison_dt(nx, dt);
            float *ddw = up(dw0, (size_t)nw * 4), *ddb = up(db0, (size_t)g.oc * 4);
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                float *yref = malloc((size_t)ny * 4);
                conv_ref(&g, xr, wr, with_bias ? br : NULL, yref, NULL, NULL, NULL, NULL);
                gpu->conv.conv2d_forward(gpu, dy_out, dx_, dw_, with_bias ? db_ : NULL, &g, dt);
                void *got = down(dy_out, (size_t)ny * es);
                float *gf = hf32(got, ny, dt);
                check_close(with_bias ? "conv2d_forward bias" : "conv2d_forward", gf, yref, ny,
                          tol_of(dt));
                free(yref), free(got), free(gf);
            }
            float *gx = malloc((size_t)nx * 4);
            double *gw = calloc((size_t)nw, sizeof(double)), *gb = calloc((size_t)g.oc, sizeof(double));
            conv_ref(&g, xr, wr, NULL, NULL, dyr, gx, gw, gb);
            float *wantw = malloc((size_t)nw * 4), *wantb = malloc((size_t)g.oc * 4);
            for (int64_t i = 0; i < nw; i++) wantw[i] = (float)(dw0[i] + gw[i]);
            for (int64_t i = 0; i < g.oc; i++) wantb[i] = (float)(db0[i] + gb[i]);
            gpu->conv.conv2d_backward(gpu, dgx, ddw, ddb, ddy, dx_, dw_, &g, dt);
            void *got = down(dgx, (size_t)nx * es);
            float *gf = hf32(got, nx, dt);
            check_close("conv2d_backward dx", gf, gx, nx, tol_of(dt));
            /* dw and db are fp32 sums of exact products of the rounded inputs */
            expect_close("conv2d_backward dw", ddw, wantw, nw, dt == CT_F32 ? TOL_F32 : 1e-5);
            expect_close("conv2d_backward db", ddb, wantb, g.oc, TOL_F32);
            /* dx may be NULL (first layer) and db too: dw accumulates again */
            for (int64_t i = 0; i < nw; i++) wantw[i] = (float)(wantw[i] + gw[i]);
            gpu->conv.conv2d_backward(gpu, NULL, ddw, NULL, ddy, dx_, dw_, &g, dt);
            expect_close("conv2d_backward dw twice", ddw, wantw, nw, dt == CT_F32 ? TOL_F32 : 1e-5);
            gfree(dx_), gfree(dw_), gfree(db_), gfree(ddy), gfree(dy_out), gfree(dgx), gfree(ddw);
            gfree(ddb);
            free(x), free(w), free(b), free(dyv), free(dw0), free(db0), free(hx), free(hw);
            free(hb), free(hdy), free(xr), free(wr), free(br), free(dyr), free(gx), free(gw);
            free(gb), free(wantw), free(wantb), free(got), free(gf);
        }
}
END_TEST

/* linear_forward against gemm + bias_act on the CPU (fp32 from the rounded inputs). With relu,
 * row 5 of x holds a NaN: that output row must be NaN, not the 0 of a max(x, 0) epilogue. */
START_TEST(linear_forward_op) {
    const ct_act acts[5] = {CT_ACT_NONE, CT_ACT_RELU, CT_ACT_GELU_TANH, CT_ACT_GELU, CT_ACT_LEAKY_RELU};
    int64_t rows = 67, in = 96, out = 40;
    float *x = hrand(rows * in, -1, 1), *w = hrand(out * in, -0.3f, 0.3f), *b = hrand(out, -1, 1);
    float *x_nan = malloc((size_t)(rows * in) * sizeof(float));
    memcpy(x_nan, x, (size_t)(rows * in) * sizeof(float));
    x_nan[5 * in + 7] = NAN;
    for (int t = 0; t < 3; t++) {
        ct_dtype dt = DTS[t];
        size_t es = ct_dtype_size(dt);
        void *hx = hdt(x, rows * in, dt), *hw = hdt(w, out * in, dt), *hb = hdt(b, out, dt);
        void *hxn = hdt(x_nan, rows * in, dt);
        float *xr = hf32(hx, rows * in, dt), *wr = hf32(hw, out * in, dt), *br = hf32(hb, out, dt);
        float *xrn = hf32(hxn, rows * in, dt);
        void *dx = upd(hx, rows * in, dt), *dw = upd(hw, out * in, dt), *db = upd(hb, out, dt);
        void *dxn = upd(hxn, rows * in, dt);
        for (int a = 0; a < 5; a++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                bool nan_in = acts[a] == CT_ACT_RELU;
                float *want = malloc((size_t)(rows * out) * 4);
                cpu->blas.gemm(cpu, false, true, rows, out, in, 1.0f, nan_in ? xrn : xr, CT_F32, in, wr, CT_F32, in,
                          0.0f, want, CT_F32, out);
                cpu->elt.bias_act_forward(cpu, want, with_bias ? br : NULL, rows, out, 1, acts[a], 0.1f,
                                      CT_F32);
                void *dy = poison_dt(rows * out, dt);
                gpu->blas.linear_forward(gpu, dy, nan_in ? dxn : dx, dw, with_bias ? db : NULL, rows, in, out,
                                         acts[a], 0.1f, dt);
                void *got = down(dy, (size_t)(rows * out) * es);
                float *gf = hf32(got, rows * out, dt);
                char what[64];
                snprintf(what, sizeof what, "linear_forward act %d bias %d [%s]", (int)acts[a],
                         with_bias, ct_dtype_name(dt));
                check_close(what, gf, want, rows * out, tol_of(dt));
                gfree(dy);
                free(want), free(got), free(gf);
            }
        gfree(dx), gfree(dw), gfree(db), gfree(dxn);
        free(hx), free(hw), free(hb), free(xr), free(wr), free(br), free(hxn), free(xrn);
    }
    free(x), free(w), free(b), free(x_nan);
}
END_TEST

/* ---- the optimizers' fused 16-bit copy ---- */

/* The fused 16-bit copy: adam_step and sgd_step write copy[i] = the updated param rounded to
 * copy_dt, bit for bit what rounding the GPU's own fp32 result gives. */
START_TEST(optimizer_fused_copy) {
    int64_t n = 65537;
    static const ct_dtype dts[] = {CT_F16, CT_BF16};
    for (int di = 0; di < 2; di++)
        for (int sgd = 0; sgd < 2; sgd++) {
            float *p = hrand(n, -1, 1), *g = hrand(n, -1, 1), *m = hrand(n, -0.1f, 0.1f);
            float *v = hrand(n, 0.001f, 0.01f);
            float *d_p = up(p, (size_t)n * 4), *d_g = up(g, (size_t)n * 4), *d_m = up(m, (size_t)n * 4);
            float *d_v = up(v, (size_t)n * 4);
            void *d_copy = poison_bytes((size_t)n * 2);
            if (sgd) {
                ct_sgd_args a = {.lr = 0.1f, .momentum = 0.9f, .grad_scale = 0.5f, .copy = d_copy,
                                 .copy_dt = dts[di]};
                gpu->optim.sgd_step(gpu, d_p, d_g, d_m, n, &a);
            } else {
                ct_adam_args a = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                  .bias_c1 = 0.1f, .bias_c2 = 0.001f, .grad_scale = 0.5f,
                                  .decoupled = true, .copy = d_copy, .copy_dt = dts[di]};
                gpu->optim.adam_step(gpu, d_p, d_g, d_m, d_v, n, &a);
            }
            float *pg = down(d_p, (size_t)n * 4);
            uint16_t *cg = down(d_copy, (size_t)n * 2);
            for (int64_t i = 0; i < n; i++) {
                uint16_t want = dts[di] == CT_F16 ? ct_f32_to_f16(pg[i]) : ct_f32_to_bf16(pg[i]);
                ck_assert_msg(cg[i] == want, "%s %s copy[%lld] = 0x%04x, expected 0x%04x",
                              sgd ? "sgd" : "adam", ct_dtype_name(dts[di]), (long long)i, cg[i], want);
            }
            gfree(d_p), gfree(d_g), gfree(d_m), gfree(d_v), gfree(d_copy);
            free(p), free(g), free(m), free(v), free(pg), free(cg);
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
    int rc = cuda_pair_open("cuda", &cpu, &gpu);
    if (rc) return rc;
    const char *env = getenv("CT_TEST_SEED");
    seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    printf("test_cuda_ops: seed %llu (CT_TEST_SEED=%llu repeats this run)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    printf("device: %s\n", gpu->device_desc);

    Suite *s = suite_create("cuda_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, op_table_complete);
    tcase_add_test(tc, memory_and_copies);
    tcase_add_test(tc, gemm_tf32);
    tcase_add_test(tc, conv2d_batched);
    tcase_add_test(tc, linear_forward_op);
    tcase_add_test(tc, optimizer_fused_copy);
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

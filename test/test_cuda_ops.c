/* test_cuda_ops.c: every CUDA backend op against the CPU backend (the reference).
 *
 * Inputs are fresh Philox draws each run (seed printed; CT_TEST_SEED=N repeats a run), never
 * zeros. Every GPU output that an op writes (rather than accumulates into) is poisoned with NaN
 * (or a byte pattern for integer outputs) before the op, so an element the kernel forgets to write
 * shows up. Results are compared by relative error ||gpu - cpu|| / ||cpu|| with the per-dtype
 * tolerances below; integer outputs (argmax, dropout masks, correct counts, casts) must match
 * exactly. Every op that takes a dtype runs in f32, f16 and bf16: inputs are rounded to the dtype
 * on the host, both backends read the same bits, and the outputs are compared as fp32. The
 * batched convolution and linear_forward are checked against direct fp32/double references.
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
#include "core/util/rng.h"
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

/* Host arrays: the GPU's result g against the CPU's h. */
static void check_rel(const char *what, const float *g, const float *h, int64_t n, double tol) {
    int64_t bad;
    double e = rel_err(g, h, n, &bad);
    ck_assert_msg(bad < 0, "%s: element %lld is %g on the GPU, %g on the CPU (unwritten?)", what,
                  (long long)bad, bad >= 0 ? g[bad] : 0.0, bad >= 0 ? h[bad] : 0.0);
    ck_assert_msg(e <= tol, "%s: relative error %.3g > %.1g (n=%lld, seed %llu)", what, e, tol,
                  (long long)n, (unsigned long long)seed);
}

/* GPU buffer d (n floats) against the CPU result h. */
static void expect_rel(const char *what, const float *d, const float *h, int64_t n, double tol) {
    float *g = down(d, (size_t)n * sizeof(float));
    check_rel(what, g, h, n, tol);
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

static void gfree(void *d) { gpu->mem.free(gpu, d); }

/* ---- typed arrays (op table v2: activations in f32, f16 or bf16) ---- */

static const ct_dtype DTS[3] = {CT_F32, CT_F16, CT_BF16};
static double tol_of(ct_dtype dt) { return dt == CT_F32 ? TOL_F32 : TOL_16; }

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

/* Device array d (dt) against the host array h (dt), both compared as fp32. */
static void expect_rel_dt(const char *what, const void *d, const void *h, int64_t n, ct_dtype dt,
                          double tol) {
    void *g = down(d, (size_t)n * ct_dtype_size(dt));
    float *gf = hf32(g, n, dt), *hf = hf32(h, n, dt);
    char msg[96];
    snprintf(msg, sizeof msg, "%s [%s]", what, ct_dtype_name(dt));
    check_rel(msg, gf, hf, n, tol);
    free(g), free(gf), free(hf);
}

/* ---- memory ---- */

START_TEST(memory_and_copies) {
    int64_t n = 100003;
    float *h = hrand(n, -1, 1);
    /* pageable and pinned sources, device-to-device, memset */
    float *d = up(h, (size_t)n * 4);
    float *pin = gpu->mem.alloc_host_pinned(gpu, (size_t)n * 4);
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
        cpu->blas.gemm_batched(cpu, ta, tb, m, n, k, 0.9f, a, lda, sa, b, ldb, sb, 0.4f, c, ldc, sc, batch);
        gpu->blas.gemm_batched(gpu, ta, tb, m, n, k, 0.9f, da, lda, sa, db, ldb, sb, 0.4f, dc, ldc, sc, batch);
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
    for (int t = 0; t < 3; t++) {
        ct_dtype dt = DTS[t];
        double tol = tol_of(dt);
        size_t es = ct_dtype_size(dt);
        void *hx = hdt(x, n, dt), *hy = hdt(y, n, dt), *want = malloc((size_t)n * es);
        void *dx = upd(hx, n, dt), *dy = upd(hy, n, dt), *out = poison_dt(n, dt);
        gpu->elt.fill(gpu, out, 0.375f, n, dt);
        cpu->elt.fill(cpu, want, 0.375f, n, dt);
        expect_rel_dt("fill", out, want, n, dt, 0);
        gpu->elt.add(gpu, out, dx, dy, n, dt);
        cpu->elt.add(cpu, want, hx, hy, n, dt);
        expect_rel_dt("add", out, want, n, dt, tol);
        gpu->elt.axpy(gpu, out, -0.7f, dx, n, dt);
        cpu->elt.axpy(cpu, want, -0.7f, hx, n, dt);
        expect_rel_dt("axpy", out, want, n, dt, tol);
        gpu->elt.scale(gpu, out, 1.5f, n, dt);
        cpu->elt.scale(cpu, want, 1.5f, n, dt);
        expect_rel_dt("scale", out, want, n, dt, tol);
        /* copy_rows into the middle of a wider matrix, then accumulate */
        int64_t rows = 37, cols = 19, ldx = 23, ldy = 50, col0 = 7;
        float *src = hrand(rows * ldx, -1, 1), *dst = hrand(rows * ldy, -1, 1);
        void *hs = hdt(src, rows * ldx, dt), *hd = hdt(dst, rows * ldy, dt);
        void *dsrc = upd(hs, rows * ldx, dt), *ddst = upd(hd, rows * ldy, dt);
        for (int acc = 0; acc < 2; acc++) {
            cpu->elt.copy_rows(cpu, (char *)hd + col0 * es, ldy, hs, ldx, rows, cols, acc, dt);
            gpu->elt.copy_rows(gpu, (char *)ddst + col0 * es, ldy, dsrc, ldx, rows, cols, acc, dt);
            expect_rel_dt(acc ? "copy_rows accumulate" : "copy_rows", ddst, hd, rows * ldy, dt, tol);
        }
        gfree(dx), gfree(dy), gfree(out), gfree(dsrc), gfree(ddst);
        free(hx), free(hy), free(want), free(src), free(dst), free(hs), free(hd);
    }
    free(x), free(y);
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
            cpu->elt.cast(cpu, src, from, x, CT_F32, n);
            cpu->elt.cast(cpu, want, to, src, from, n);
            void *dsrc = up(src, (size_t)n * ef), *ddst = poison_bytes((size_t)n * et);
            gpu->elt.cast(gpu, ddst, to, dsrc, from, n);
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
        cpu->elt.round_to(cpu, want, n, dts[i]);
        float *d = up(x, (size_t)n * sizeof(float));
        gpu->elt.round_to(gpu, d, n, dts[i]);
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
    for (int t = 0; t < 3; t++) {
        ct_dtype dt = DTS[t];
        size_t es = ct_dtype_size(dt);
        void *hx = hdt(x, n, dt), *hdy = hdt(dyv, n, dt);
        void *dx = upd(hx, n, dt), *ddy = upd(hdy, n, dt);
        void *y = malloc((size_t)n * es), *g = malloc((size_t)n * es);
        for (int a = CT_ACT_NONE; a <= CT_ACT_SIGMOID; a++) {
            void *dyo = poison_dt(n, dt), *dgo = poison_dt(n, dt);
            cpu->elt.act_forward(cpu, y, hx, n, (ct_act)a, 0.1f, dt);
            gpu->elt.act_forward(gpu, dyo, dx, n, (ct_act)a, 0.1f, dt);
            char what[48];
            snprintf(what, sizeof what, "act_forward %d", a);
            expect_rel_dt(what, dyo, y, n, dt, tol_of(dt));
            /* y from each backend's own forward, as a layer would pass it */
            cpu->elt.act_backward(cpu, g, hdy, hx, y, n, (ct_act)a, 0.1f, dt);
            gpu->elt.act_backward(gpu, dgo, ddy, dx, dyo, n, (ct_act)a, 0.1f, dt);
            snprintf(what, sizeof what, "act_backward %d", a);
            expect_rel_dt(what, dgo, g, n, dt, tol_of(dt));
            gfree(dyo), gfree(dgo);
        }
        gfree(dx), gfree(ddy);
        free(hx), free(hdy), free(y), free(g);
    }
    free(x), free(dyv);
}
END_TEST

START_TEST(bias_act_and_bias_backward) {
    const int64_t shapes[][3] = {{33, 130, 1}, {7, 16, 49}, {1000, 10, 1}, {3, 5, 1025}};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 4; s++) {
            ct_dtype dt = DTS[t];
            int64_t rows = shapes[s][0], cols = shapes[s][1], inner = shapes[s][2];
            int64_t n = rows * cols * inner;
            float *x = hrand(n, -2, 2), *bias = hrand(cols, -1, 1), *db = hrand(cols, -1, 1);
            void *hx = hdt(x, n, dt), *hb = hdt(bias, cols, dt);
            void *dx = upd(hx, n, dt), *dbias = upd(hb, cols, dt);
            float *ddb = up(db, (size_t)cols * 4);
            cpu->elt.bias_act_forward(cpu, hx, hb, rows, cols, inner, CT_ACT_GELU, 0.0f, dt);
            gpu->elt.bias_act_forward(gpu, dx, dbias, rows, cols, inner, CT_ACT_GELU, 0.0f, dt);
            expect_rel_dt("bias_act_forward", dx, hx, n, dt, tol_of(dt));
            /* both reduce the CPU's result, so the sums see the same inputs: fp32 tolerance */
            void *dsame = upd(hx, n, dt);
            cpu->elt.bias_backward(cpu, db, hx, rows, cols, inner, dt);
            gpu->elt.bias_backward(gpu, ddb, dsame, rows, cols, inner, dt);
            expect_rel("bias_backward", ddb, db, cols, TOL_F32);
            gfree(dx), gfree(dbias), gfree(ddb), gfree(dsame);
            free(x), free(bias), free(db), free(hx), free(hb);
        }
}
END_TEST

START_TEST(dropout_op) {
    const int64_t sizes[] = {1, 5, 4099, 100003};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 4; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
            int64_t n = sizes[s];
            float *x = hrand(n, -1, 1), *dyv = hrand(n, -1, 1);
            void *hx = hdt(x, n, dt), *hdy = hdt(dyv, n, dt);
            void *y = malloc((size_t)n * es), *g = malloc((size_t)n * es);
            uint8_t *mask = malloc((size_t)n);
            void *dx = upd(hx, n, dt), *ddy = upd(hdy, n, dt);
            void *dyo = poison_dt(n, dt), *dgo = poison_dt(n, dt);
            uint8_t *dmask = poison_bytes((size_t)n);
            cpu->elt.dropout_forward(cpu, y, mask, hx, n, 0.3f, seed, 12345 + (uint64_t)s, dt);
            gpu->elt.dropout_forward(gpu, dyo, dmask, dx, n, 0.3f, seed, 12345 + (uint64_t)s, dt);
            expect_same_bytes("dropout mask", dmask, mask, (size_t)n);
            expect_rel_dt("dropout forward", dyo, y, n, dt, tol_of(dt));
            cpu->elt.dropout_backward(cpu, g, hdy, mask, n, 0.3f, dt);
            gpu->elt.dropout_backward(gpu, dgo, ddy, dmask, n, 0.3f, dt);
            expect_rel_dt("dropout backward", dgo, g, n, dt, tol_of(dt));
            gfree(dx), gfree(ddy), gfree(dyo), gfree(dgo), gfree(dmask);
            free(x), free(dyv), free(hx), free(hdy), free(y), free(g), free(mask);
        }
}
END_TEST

START_TEST(normalize_u8_op) {
    ct_u8_normalize p = {.n = 5, .c = 3, .h = 17, .w = 23, .mean = {0.485f, 0.456f, 0.406f},
                         .std = {0.229f, 0.224f, 0.225f}};
    int64_t total = p.n * p.c * p.h * p.w;
    uint8_t *x = malloc((size_t)total), flip[5] = {0, 1, 1, 0, 1};
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, stream_ctr++);
    for (int64_t i = 0; i < total; i++) x[i] = (uint8_t)ct_rng_below(&r, 256);
    uint8_t *dxu = up(x, (size_t)total), *dflip = up(flip, sizeof flip);
    for (int t = 0; t < 3; t++)
        for (int f = 0; f < 2; f++) {
            ct_dtype dt = DTS[t];
            void *want = malloc((size_t)total * ct_dtype_size(dt)), *d = poison_dt(total, dt);
            cpu->elt.normalize_u8(cpu, want, x, f ? flip : NULL, &p, dt);
            gpu->elt.normalize_u8(gpu, d, dxu, f ? dflip : NULL, &p, dt);
            expect_rel_dt(f ? "normalize_u8 flip" : "normalize_u8", d, want, total, dt, tol_of(dt));
            gfree(d);
            free(want);
        }
    gfree(dxu), gfree(dflip);
    free(x);
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
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
            const ct_conv2d_geom *g = &gs[s];
            int64_t cg = g->c / g->groups, nimg = g->c * g->h * g->w;
            int64_t ncol = cg * g->kh * g->kw * g->oh * g->ow;
            float *img = hrand(nimg, -1, 1);
            void *himg = hdt(img, nimg, dt), *dimg = upd(himg, nimg, dt);
            for (int64_t grp = 0; grp < g->groups; grp++) {
                void *col = malloc((size_t)ncol * es), *dcol = poison_dt(ncol, dt);
                cpu->conv.im2col(cpu, col, himg, g, grp, dt);
                gpu->conv.im2col(gpu, dcol, dimg, g, grp, dt);
                expect_same_bytes("im2col", dcol, col, (size_t)ncol * es); /* a gather: exact */
                /* col2im of fresh values into a random image (it accumulates) */
                float *c2 = hrand(ncol, -1, 1), *acc = hrand(nimg, -1, 1);
                void *hc2 = hdt(c2, ncol, dt), *hacc = hdt(acc, nimg, dt);
                void *dc2 = upd(hc2, ncol, dt), *dacc = upd(hacc, nimg, dt);
                cpu->conv.col2im(cpu, hacc, hc2, g, grp, dt);
                gpu->conv.col2im(gpu, dacc, dc2, g, grp, dt);
                expect_rel_dt("col2im", dacc, hacc, nimg, dt, tol_of(dt));
                gfree(dcol), gfree(dc2), gfree(dacc);
                free(col), free(c2), free(acc), free(hc2), free(hacc);
            }
            gfree(dimg);
            free(img), free(himg);
        }
}
END_TEST

/* Direct convolution in double on fp32 values: y[n, oc, oh, ow] (+ bias), and its gradients
 * dx (written), dw and db (added to). The independent reference for the batched ops. */
static int64_t conv_in(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
    return o * stride - pad + k * dil;
}

static void conv_ref(const ct_conv2d_geom *g, const float *x, const float *w, const float *b,
                     float *y, const float *dy, float *dx, double *dw, double *db) {
    int64_t cg = g->c / g->groups, ocg = g->oc / g->groups;
    if (dx) memset(dx, 0, (size_t)(g->n * g->c * g->h * g->w) * sizeof(float));
    double *dxa = dx ? calloc((size_t)(g->n * g->c * g->h * g->w), sizeof(double)) : NULL;
    for (int64_t i = 0; i < g->n; i++)
        for (int64_t o = 0; o < g->oc; o++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t at = ((i * g->oc + o) * g->oh + oy) * g->ow + ox;
                    double acc = b ? b[o] : 0.0, go = dy ? dy[at] : 0.0;
                    if (db) db[o] += go;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t iy = conv_in(oy, ky, g->stride_h, g->pad_h, g->dil_h);
                                int64_t ix = conv_in(ox, kx, g->stride_w, g->pad_w, g->dil_w);
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                int64_t ch = (o / ocg) * cg + ci;
                                int64_t xi = ((i * g->c + ch) * g->h + iy) * g->w + ix;
                                int64_t wi = ((o * cg + ci) * g->kh + ky) * g->kw + kx;
                                acc += (double)x[xi] * w[wi];
                                if (dw) dw[wi] += go * x[xi];
                                if (dxa) dxa[xi] += go * w[wi];
                            }
                    if (y) y[at] = (float)acc;
                }
    if (dx)
        for (int64_t i = 0; i < g->n * g->c * g->h * g->w; i++) dx[i] = (float)dxa[i];
    free(dxa);
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
                check_rel(with_bias ? "conv2d_forward bias" : "conv2d_forward", gf, yref, ny,
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
            check_rel("conv2d_backward dx", gf, gx, nx, tol_of(dt));
            /* dw and db are fp32 sums of exact products of the rounded inputs */
            expect_rel("conv2d_backward dw", ddw, wantw, nw, dt == CT_F32 ? TOL_F32 : 1e-5);
            expect_rel("conv2d_backward db", ddb, wantb, g.oc, TOL_F32);
            /* dx may be NULL (first layer) and db too: dw accumulates again */
            for (int64_t i = 0; i < nw; i++) wantw[i] = (float)(wantw[i] + gw[i]);
            gpu->conv.conv2d_backward(gpu, NULL, ddw, NULL, ddy, dx_, dw_, &g, dt);
            expect_rel("conv2d_backward dw twice", ddw, wantw, nw, dt == CT_F32 ? TOL_F32 : 1e-5);
            gfree(dx_), gfree(dw_), gfree(db_), gfree(ddy), gfree(dy_out), gfree(dgx), gfree(ddw);
            gfree(ddb);
            free(x), free(w), free(b), free(dyv), free(dw0), free(db0), free(hx), free(hw);
            free(hb), free(hdy), free(xr), free(wr), free(br), free(dyr), free(gx), free(gw);
            free(gb), free(wantw), free(wantb), free(got), free(gf);
        }
}
END_TEST

/* linear_forward against gemm + bias_act on the CPU (fp32 from the rounded inputs). */
START_TEST(linear_forward_op) {
    const ct_act acts[5] = {CT_ACT_NONE, CT_ACT_RELU, CT_ACT_GELU_TANH, CT_ACT_GELU, CT_ACT_LEAKY_RELU};
    int64_t rows = 67, in = 96, out = 40;
    float *x = hrand(rows * in, -1, 1), *w = hrand(out * in, -0.3f, 0.3f), *b = hrand(out, -1, 1);
    for (int t = 0; t < 3; t++) {
        ct_dtype dt = DTS[t];
        size_t es = ct_dtype_size(dt);
        void *hx = hdt(x, rows * in, dt), *hw = hdt(w, out * in, dt), *hb = hdt(b, out, dt);
        float *xr = hf32(hx, rows * in, dt), *wr = hf32(hw, out * in, dt), *br = hf32(hb, out, dt);
        void *dx = upd(hx, rows * in, dt), *dw = upd(hw, out * in, dt), *db = upd(hb, out, dt);
        for (int a = 0; a < 5; a++)
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                float *want = malloc((size_t)(rows * out) * 4);
                cpu->blas.gemm(cpu, false, true, rows, out, in, 1.0f, xr, CT_F32, in, wr, CT_F32, in,
                          0.0f, want, CT_F32, out);
                cpu->elt.bias_act_forward(cpu, want, with_bias ? br : NULL, rows, out, 1, acts[a], 0.1f,
                                      CT_F32);
                void *dy = poison_dt(rows * out, dt);
                gpu->blas.linear_forward(gpu, dy, dx, dw, with_bias ? db : NULL, rows, in, out, acts[a],
                                    0.1f, dt);
                void *got = down(dy, (size_t)(rows * out) * es);
                float *gf = hf32(got, rows * out, dt);
                char what[64];
                snprintf(what, sizeof what, "linear_forward act %d bias %d [%s]", (int)acts[a],
                         with_bias, ct_dtype_name(dt));
                check_rel(what, gf, want, rows * out, tol_of(dt));
                gfree(dy);
                free(want), free(got), free(gf);
            }
        gfree(dx), gfree(dw), gfree(db);
        free(hx), free(hw), free(hb), free(xr), free(wr), free(br);
    }
    free(x), free(w), free(b);
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
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
            double tol = tol_of(dt);
            const ct_pool2d_geom *g = &gs[s];
            int64_t nx = g->n * g->c * g->h * g->w, ny = g->n * g->c * g->oh * g->ow;
            float *x = hrand(nx, -3, 3), *dyv = hrand(ny, -1, 1);
            void *hx = hdt(x, nx, dt), *hdy = hdt(dyv, ny, dt);
            void *dx = upd(hx, nx, dt), *ddy = upd(hdy, ny, dt);
            void *y = malloc((size_t)ny * es), *gx = malloc((size_t)nx * es);
            int32_t *am = malloc((size_t)ny * 4);
            void *dyo = poison_dt(ny, dt), *dgx = poison_dt(nx, dt);
            int32_t *dam = poison_bytes((size_t)ny * 4);
            cpu->conv.maxpool2d_forward(cpu, y, am, hx, g, dt);
            gpu->conv.maxpool2d_forward(gpu, dyo, dam, dx, g, dt);
            expect_same_bytes("maxpool forward", dyo, y, (size_t)ny * es);
            expect_same_bytes("maxpool argmax", dam, am, (size_t)ny * 4);
            cpu->conv.maxpool2d_backward(cpu, gx, hdy, am, g, dt);
            gpu->conv.maxpool2d_backward(gpu, dgx, ddy, dam, g, dt);
            expect_rel_dt("maxpool backward", dgx, gx, nx, dt, tol);
            gfree(dyo), gfree(dgx);
            dyo = poison_dt(ny, dt), dgx = poison_dt(nx, dt);
            cpu->conv.avgpool2d_forward(cpu, y, hx, g, dt);
            gpu->conv.avgpool2d_forward(gpu, dyo, dx, g, dt);
            expect_rel_dt("avgpool forward", dyo, y, ny, dt, tol);
            cpu->conv.avgpool2d_backward(cpu, gx, hdy, g, dt);
            gpu->conv.avgpool2d_backward(gpu, dgx, ddy, g, dt);
            expect_rel_dt("avgpool backward", dgx, gx, nx, dt, tol);
            gfree(dx), gfree(ddy), gfree(dyo), gfree(dgx), gfree(dam);
            free(x), free(dyv), free(hx), free(hdy), free(y), free(gx), free(am);
        }
}
END_TEST

/* ---- normalization ---- */

START_TEST(batchnorm) {
    const int64_t shapes[][3] = {{8, 16, 49}, {64, 10, 1}, {2, 3, 4099}};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
            double tol = tol_of(dt);
            int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], total = n * c * hw;
            float *x = hrand(total, -2, 3), *gamma = hrand(c, 0.5f, 1.5f), *beta = hrand(c, -1, 1);
            float *rm = hrand(c, -0.1f, 0.1f), *rv = hrand(c, 0.5f, 1.5f), *dyv = hrand(total, -1, 1);
            float *dg = hrand(c, -1, 1), *dbt = hrand(c, -1, 1);
            void *hx = hdt(x, total, dt), *hg = hdt(gamma, c, dt), *hb = hdt(beta, c, dt);
            void *hdy = hdt(dyv, total, dt);
            void *d_x = upd(hx, total, dt), *d_g = upd(hg, c, dt), *d_b = upd(hb, c, dt);
            void *d_dy = upd(hdy, total, dt);
            float *d_rm = up(rm, (size_t)c * 4), *d_rv = up(rv, (size_t)c * 4);
            float *d_dg = up(dg, (size_t)c * 4), *d_dbt = up(dbt, (size_t)c * 4);
            void *y = malloc((size_t)total * es);
            float *sm = malloc((size_t)c * 4), *si = malloc((size_t)c * 4);
            void *d_y = poison_dt(total, dt);
            float *d_sm = poison(c), *d_si = poison(c);
            cpu->norm.batchnorm_forward(cpu, y, hx, hg, hb, rm, rv, sm, si, n, c, hw, 1e-5f, 0.1f, true, dt);
            gpu->norm.batchnorm_forward(gpu, d_y, d_x, d_g, d_b, d_rm, d_rv, d_sm, d_si, n, c, hw, 1e-5f,
                                   0.1f, true, dt);
            expect_rel_dt("bn forward y", d_y, y, total, dt, tol);
            expect_rel("bn save_mean", d_sm, sm, c, TOL_F32);
            expect_rel("bn save_invstd", d_si, si, c, TOL_F32);
            expect_rel("bn running_mean", d_rm, rm, c, TOL_F32);
            expect_rel("bn running_var", d_rv, rv, c, TOL_F32);
            void *gx = malloc((size_t)total * es), *d_gx = poison_dt(total, dt);
            cpu->norm.batchnorm_backward(cpu, gx, dg, dbt, hdy, hx, hg, sm, si, n, c, hw, dt);
            gpu->norm.batchnorm_backward(gpu, d_gx, d_dg, d_dbt, d_dy, d_x, d_g, d_sm, d_si, n, c, hw, dt);
            expect_rel_dt("bn backward dx", d_gx, gx, total, dt, tol);
            expect_rel("bn backward dgamma", d_dg, dg, c, dt == CT_F32 ? TOL_F32 : 1e-4);
            expect_rel("bn backward dbeta", d_dbt, dbt, c, TOL_F32);
            gfree(d_y);
            d_y = poison_dt(total, dt);
            cpu->norm.batchnorm_forward(cpu, y, hx, hg, hb, rm, rv, NULL, NULL, n, c, hw, 1e-5f, 0.1f,
                                   false, dt);
            gpu->norm.batchnorm_forward(gpu, d_y, d_x, d_g, d_b, d_rm, d_rv, NULL, NULL, n, c, hw, 1e-5f,
                                   0.1f, false, dt);
            expect_rel_dt("bn eval y", d_y, y, total, dt, tol);
            gfree(d_x), gfree(d_g), gfree(d_b), gfree(d_rm), gfree(d_rv), gfree(d_dy), gfree(d_dg);
            gfree(d_dbt), gfree(d_y), gfree(d_sm), gfree(d_si), gfree(d_gx);
            free(x), free(gamma), free(beta), free(rm), free(rv), free(dyv), free(dg), free(dbt);
            free(hx), free(hg), free(hb), free(hdy), free(y), free(sm), free(si), free(gx);
        }
}
END_TEST

START_TEST(layernorm) {
    const int64_t shapes[][2] = {{64, 768}, {1000, 10}, {3, 5000}};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
            double tol = tol_of(dt);
            int64_t rows = shapes[s][0], d = shapes[s][1], total = rows * d;
            float *x = hrand(total, -2, 3), *gamma = hrand(d, 0.5f, 1.5f), *beta = hrand(d, -1, 1);
            float *dyv = hrand(total, -1, 1), *dg = hrand(d, -1, 1), *dbt = hrand(d, -1, 1);
            void *hx = hdt(x, total, dt), *hg = hdt(gamma, d, dt), *hb = hdt(beta, d, dt);
            void *hdy = hdt(dyv, total, dt);
            void *d_x = upd(hx, total, dt), *d_g = upd(hg, d, dt), *d_b = upd(hb, d, dt);
            void *d_dy = upd(hdy, total, dt);
            float *d_dg = up(dg, (size_t)d * 4), *d_dbt = up(dbt, (size_t)d * 4);
            void *y = malloc((size_t)total * es), *gx = malloc((size_t)total * es);
            float *sm = malloc((size_t)rows * 4), *sr = malloc((size_t)rows * 4);
            void *d_y = poison_dt(total, dt), *d_gx = poison_dt(total, dt);
            float *d_sm = poison(rows), *d_sr = poison(rows);
            cpu->norm.layernorm_forward(cpu, y, sm, sr, hx, hg, hb, rows, d, 1e-5f, dt);
            gpu->norm.layernorm_forward(gpu, d_y, d_sm, d_sr, d_x, d_g, d_b, rows, d, 1e-5f, dt);
            expect_rel_dt("ln forward y", d_y, y, total, dt, tol);
            expect_rel("ln save_mean", d_sm, sm, rows, TOL_F32);
            expect_rel("ln save_rstd", d_sr, sr, rows, TOL_F32);
            cpu->norm.layernorm_backward(cpu, gx, dg, dbt, hdy, hx, hg, sm, sr, rows, d, dt);
            gpu->norm.layernorm_backward(gpu, d_gx, d_dg, d_dbt, d_dy, d_x, d_g, d_sm, d_sr, rows, d, dt);
            expect_rel_dt("ln backward dx", d_gx, gx, total, dt, tol);
            expect_rel("ln backward dgamma", d_dg, dg, d, dt == CT_F32 ? TOL_F32 : 1e-4);
            expect_rel("ln backward dbeta", d_dbt, dbt, d, TOL_F32);
            gfree(d_x), gfree(d_g), gfree(d_b), gfree(d_dy), gfree(d_dg), gfree(d_dbt), gfree(d_y);
            gfree(d_sm), gfree(d_sr), gfree(d_gx);
            free(x), free(gamma), free(beta), free(dyv), free(dg), free(dbt), free(hx), free(hg);
            free(hb), free(hdy), free(y), free(gx), free(sm), free(sr);
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
    int32_t *d_ids = up(ids, (size_t)n_ids * 4);
    for (int t = 0; t < 3; t++) {
        ct_dtype dt = DTS[t];
        size_t es = ct_dtype_size(dt);
        int64_t ntab = (vocab + 10) * dim;
        float *table = hrand(ntab, -1, 1), *dyv = hrand(n_ids * dim, -1, 1);
        float *dtab = hrand(vocab * dim, -1, 1);
        void *htab = hdt(table, ntab, dt), *hdy = hdt(dyv, n_ids * dim, dt);
        void *d_table = upd(htab, ntab, dt), *d_dy = upd(hdy, n_ids * dim, dt);
        float *d_dt = up(dtab, (size_t)(vocab * dim) * 4);
        void *y = malloc((size_t)(n_ids * dim) * es), *d_y = poison_dt(n_ids * dim, dt);
        cpu->embed.embedding_forward(cpu, y, ids, htab, n_ids, dim, dt);
        gpu->embed.embedding_forward(gpu, d_y, d_ids, d_table, n_ids, dim, dt);
        expect_same_bytes("embedding forward", d_y, y, (size_t)(n_ids * dim) * es);
        cpu->embed.embedding_backward(cpu, dtab, hdy, ids, n_ids, vocab, dim, dt);
        gpu->embed.embedding_backward(gpu, d_dt, d_dy, d_ids, n_ids, vocab, dim, dt);
        /* same summation order (positions in order, fp32) on both: bit-exact */
        expect_same_bytes("embedding backward", d_dt, dtab, (size_t)(vocab * dim) * 4);
        gfree(d_table), gfree(d_dy), gfree(d_dt), gfree(d_y);
        free(table), free(dyv), free(dtab), free(htab), free(hdy), free(y);
    }
    gfree(d_ids);
    free(ids);
}
END_TEST

/* ---- losses and reductions ---- */

/* The device result pair {mean loss, correct count} of a loss op. */
static void read_result(const float *d_res, float out[2]) { gpu->mem.copy_d2h(gpu, out, d_res, 2 * sizeof(float)); }

START_TEST(softmax_cross_entropy) {
    const int64_t shapes[][2] = {{256, 10}, {33, 1000}, {4, 50257}};
    float *d_res = poison(2);
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 3; s++) {
            ct_dtype dt = DTS[t];
            size_t es = ct_dtype_size(dt);
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
            void *hx = hdt(x, rows * classes, dt), *d_x = upd(hx, rows * classes, dt);
            int32_t *d_l = up(labels, (size_t)rows * 4);
            for (int ls = 0; ls < 2; ls++) {
                float smoothing = ls ? 0.1f : 0.0f;
                void *g = malloc((size_t)(rows * classes) * es), *d_g = poison_dt(rows * classes, dt);
                float rc[2] = {-1, -1}, rg[2];
                float nan2[2] = {NAN, NAN};
                gpu->mem.copy_h2d(gpu, d_res, nan2, sizeof nan2);
                cpu->loss.softmax_xent(cpu, g, rc, hx, labels, rows, classes, smoothing, 64.0f, dt);
                gpu->loss.softmax_xent(gpu, d_g, d_res, d_x, d_l, rows, classes, smoothing, 64.0f, dt);
                read_result(d_res, rg);
                expect_scalar("xent loss", rg[0], rc[0], TOL_F32);
                ck_assert_float_eq(rg[1], rc[1]);
                ck_assert(rc[1] > 0.0f);
                expect_rel_dt("xent dlogits", d_g, g, rows * classes, dt, tol_of(dt));
                gfree(d_g);
                free(g);
            }
            gfree(d_x), gfree(d_l);
            free(x), free(labels), free(hx);
        }
    gfree(d_res);
}
END_TEST

START_TEST(mse_and_bce) {
    int64_t rows = 129, cols = 37, n = rows * cols;
    float *p = hrand(n, -3, 3), *t = hrand(n, 0, 1);
    float *d_t = up(t, (size_t)n * 4), *d_res = poison(2);
    for (int k = 0; k < 3; k++) {
        ct_dtype dt = DTS[k];
        size_t es = ct_dtype_size(dt);
        void *hp = hdt(p, n, dt), *d_p = upd(hp, n, dt);
        void *g = malloc((size_t)n * es), *d_g = poison_dt(n, dt);
        float rc[2], rg[2];
        cpu->loss.mse_loss(cpu, g, rc, hp, t, rows, cols, 8.0f, dt);
        gpu->loss.mse_loss(gpu, d_g, d_res, d_p, d_t, rows, cols, 8.0f, dt);
        read_result(d_res, rg);
        expect_scalar("mse loss", rg[0], rc[0], TOL_F32);
        ck_assert_float_eq(rg[1], 0.0f);
        expect_rel_dt("mse grad", d_g, g, n, dt, tol_of(dt));
        gfree(d_g);
        d_g = poison_dt(n, dt);
        gfree(d_res);
        d_res = poison(2);
        cpu->loss.bce_logits_loss(cpu, g, rc, hp, t, rows, cols, 8.0f, dt);
        gpu->loss.bce_logits_loss(gpu, d_g, d_res, d_p, d_t, rows, cols, 8.0f, dt);
        read_result(d_res, rg);
        expect_scalar("bce loss", rg[0], rc[0], TOL_F32);
        expect_rel_dt("bce grad", d_g, g, n, dt, tol_of(dt));
        /* loss only (no gradient buffer) */
        gpu->loss.mse_loss(gpu, NULL, d_res, d_p, d_t, rows, cols, 8.0f, dt);
        cpu->loss.mse_loss(cpu, NULL, rc, hp, t, rows, cols, 8.0f, dt);
        read_result(d_res, rg);
        expect_scalar("mse loss only", rg[0], rc[0], TOL_F32);
        gfree(d_p), gfree(d_g);
        free(hp), free(g);
    }
    gfree(d_t), gfree(d_res);
    free(p), free(t);
}
END_TEST

START_TEST(reductions) {
    const int64_t sizes[] = {1, 1000, 100003, 20000000};
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        float *x = hrand(n, -1, 1);
        float *d = up(x, (size_t)n * 4);
        expect_scalar("sum_squares", gpu->optim.sum_squares(gpu, d, n), cpu->optim.sum_squares(cpu, x, n), 1e-10);
        ck_assert(gpu->optim.all_finite(gpu, d, n));
        float bad[2] = {INFINITY, NAN};
        for (int b = 0; b < 2; b++) {
            gpu->mem.copy_h2d(gpu, d + n / 2, &bad[b], 4);
            ck_assert(!gpu->optim.all_finite(gpu, d, n));
            gpu->mem.copy_h2d(gpu, d + n / 2, &x[n / 2], 4);
        }
        ck_assert(gpu->optim.all_finite(gpu, d, n));
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
            cpu->optim.adam_step(cpu, p, g, m, v, n, &a);
            gpu->optim.adam_step(gpu, d_p, d_g, d_m, d_v, n, &a);
        }
        expect_rel("adam param", d_p, p, n, TOL_F32);
        expect_rel("adam m", d_m, m, n, TOL_F32);
        expect_rel("adam v", d_v, v, n, TOL_F32);
        gfree(d_p), gfree(d_g), gfree(d_m), gfree(d_v);
        free(p), free(g), free(m), free(v);
    }
}
END_TEST

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

START_TEST(sgd_variants) {
    int64_t n = 50001;
    for (int variant = 0; variant < 4; variant++) {
        float *p = hrand(n, -1, 1), *g = hrand(n, -1, 1), *mom = hrand(n, -0.1f, 0.1f);
        float *d_p = up(p, (size_t)n * 4), *d_g = up(g, (size_t)n * 4);
        float *d_mom = up(mom, (size_t)n * 4);
        ct_sgd_args a = {.lr = 0.1f, .momentum = variant ? 0.9f : 0.0f, .dampening = 0.1f,
                         .weight_decay = 1e-4f, .grad_scale = 0.25f, .nesterov = variant == 2,
                         .first_step = variant == 3};
        cpu->optim.sgd_step(cpu, p, g, mom, n, &a);
        gpu->optim.sgd_step(gpu, d_p, d_g, d_mom, n, &a);
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
        cpu->optim.lamb_direction(cpu, u, p, g, m, v, n, &a, &wc, &uc);
        gpu->optim.lamb_direction(gpu, d_u, d_p, d_g, d_m, d_v, n, &a, &wg, &ug);
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
    tcase_add_test(tc, normalize_u8_op);
    tcase_add_test(tc, im2col_col2im);
    tcase_add_test(tc, conv2d_batched);
    tcase_add_test(tc, linear_forward_op);
    tcase_add_test(tc, pooling);
    tcase_add_test(tc, batchnorm);
    tcase_add_test(tc, layernorm);
    tcase_add_test(tc, embedding);
    tcase_add_test(tc, softmax_cross_entropy);
    tcase_add_test(tc, mse_and_bce);
    tcase_add_test(tc, reductions);
    tcase_add_test(tc, adam_both_modes);
    tcase_add_test(tc, sgd_variants);
    tcase_add_test(tc, optimizer_fused_copy);
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

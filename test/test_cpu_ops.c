/* test_cpu_ops.c: every CPU backend op against a plain double-precision reference written here,
 * on random inputs (Philox) and odd sizes; bitwise determinism across thread counts; fp16/bf16
 * conversions. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
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

/* ---- helpers ---- */

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

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* |got - want| <= atol + rtol * |want| for every element; reports the first failure. */
static void expect_close(const char *what, const float *got, const double *want, int64_t n,
                         double rtol, double atol) {
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        ck_assert_msg(err <= atol + rtol * fabs(want[i]), "%s[%lld]: got %.9g want %.9g", what,
                      (long long)i, got[i], want[i]);
    }
}

static void expect_scalar(const char *what, double got, double want, double rtol, double atol) {
    ck_assert_msg(fabs(got - want) <= atol + rtol * fabs(want), "%s: got %.12g want %.12g", what, got,
                  want);
}

static void expect_bits(const char *what, const void *a, const void *b, size_t bytes) {
    ck_assert_msg(memcmp(a, b, bytes) == 0, "%s differs between 1 and 2 threads", what);
}

static const int64_t SIZES[] = {1, 7, 33, 1000, 100003};

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

START_TEST(cast_op) {
    int64_t n = 100003;
    float *x = rnd(n, 1, -70000.0f, 70000.0f);
    x[0] = NAN;
    x[1] = 1e-6f;
    uint16_t *h = malloc((size_t)n * 2), *b = malloc((size_t)n * 2);
    float *back = malloc((size_t)n * 4);
    be2->elt.cast(be2, h, CT_F16, x, CT_F32, n);
    be2->elt.cast(be2, b, CT_BF16, x, CT_F32, n);
    for (int64_t i = 0; i < n; i++) {
        ck_assert_uint_eq(h[i], ct_f32_to_f16(x[i]));
        ck_assert_uint_eq(b[i], ct_f32_to_bf16(x[i]));
    }
    be2->elt.cast(be2, back, CT_F32, h, CT_F16, n);
    for (int64_t i = 0; i < n; i++) ck_assert(memcmp(&back[i], &(float){ct_f16_to_f32(h[i])}, 4) == 0);
    be1->elt.cast(be1, back, CT_F32, b, CT_BF16, n);
    for (int64_t i = 0; i < n; i++) ck_assert(memcmp(&back[i], &(float){ct_bf16_to_f32(b[i])}, 4) == 0);
    uint8_t u8[5] = {0, 1, 7, 200, 255};
    be1->elt.cast(be1, back, CT_F32, u8, CT_U8, 5);
    ck_assert(back[3] == 200.0f && back[4] == 255.0f);
    free(x);
    free(h);
    free(b);
    free(back);
}
END_TEST

/* ---- GEMM ---- */

/* C = alpha op(A) op(B) + beta C in double; A, B, C are row-major with leading dims. */
static void ref_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, double beta, const float *c0,
                     int64_t ldc, double *out) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) {
                double av = ta ? a[p * lda + i] : a[i * lda + p];
                double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += av * bv;
            }
            out[i * n + j] = alpha * s + beta * c0[i * ldc + j];
        }
}

START_TEST(gemm_all_transposes) {
    const int64_t dims[][3] = {{1, 1, 1}, {7, 33, 5}, {33, 7, 1000}, {64, 50, 3}};
    for (size_t d = 0; d < 4; d++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t m = dims[d][0], n = dims[d][1], k = dims[d][2];
            int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
            float *a = rnd((ta ? k : m) * lda, 10 + t, -1, 1), *b = rnd((tb ? n : k) * ldb, 20 + t, -1, 1);
            float *c = rnd(m * ldc, 30 + t, -1, 1), *c0 = copyf(c, m * ldc);
            double *want = dalloc(m * n);
            ref_gemm(ta, tb, m, n, k, 0.7, a, lda, b, ldb, 0.3, c0, ldc, want);
            be2->blas.gemm(be2, ta, tb, m, n, k, 0.7f, a, CT_F32, lda, b, CT_F32, ldb, 0.3f, c, CT_F32, ldc);
            for (int64_t i = 0; i < m; i++) {
                expect_close("gemm", c + i * ldc, want + i * n, n, 1e-4, 1e-4 * sqrt((double)k));
                /* the padding columns of C are untouched */
                for (int64_t j = n; j < ldc; j++) ck_assert(c[i * ldc + j] == c0[i * ldc + j]);
            }
            free(a), free(b), free(c), free(c0), free(want);
        }
}
END_TEST

/* Shapes big enough to be cut into tiles: same bits on 1 and 2 threads, right values. */
START_TEST(gemm_tiled_threads) {
    const int64_t dims[][3] = {{128, 512, 784}, {784, 512, 128}, {64, 196, 288}, {1000, 33, 300}};
    for (size_t d = 0; d < CT_ARRAY_LEN(dims); d++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t m = dims[d][0], n = dims[d][1], k = dims[d][2];
            int64_t lda = ta ? m : k, ldb = tb ? k : n;
            float *a = rnd(m * k, 300 + t, -1, 1), *b = rnd(k * n, 310 + t, -1, 1);
            float *c1 = rnd(m * n, 320, -1, 1), *c2 = copyf(c1, m * n), *c0 = copyf(c1, m * n);
            be1->blas.gemm(be1, ta, tb, m, n, k, 1.0f, a, CT_F32, lda, b, CT_F32, ldb, 1.0f, c1, CT_F32, n);
            be2->blas.gemm(be2, ta, tb, m, n, k, 1.0f, a, CT_F32, lda, b, CT_F32, ldb, 1.0f, c2, CT_F32, n);
            expect_bits("tiled gemm", c1, c2, (size_t)(m * n) * 4);
            /* spot-check rows spread over every tile against double */
            for (int64_t i = 0; i < m; i += 1 + m / 9) {
                double *want = dalloc(n);
                for (int64_t jj = 0; jj < n; jj++) {
                    double s = c0[i * n + jj];
                    for (int64_t p = 0; p < k; p++)
                        s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[jj * ldb + p] : b[p * ldb + jj]);
                    want[jj] = s;
                }
                expect_close("tiled gemm", c2 + i * n, want, n, 1e-4, 1e-4 * sqrt((double)k));
                free(want);
            }
            free(a), free(b), free(c1), free(c2), free(c0);
        }
}
END_TEST

START_TEST(gemm_16bit_and_batched) {
    int64_t m = 9, n = 17, k = 40;
    float *a = rnd(m * k, 40, -2, 2), *b = rnd(k * n, 41, -2, 2), *c0 = rnd(m * n, 42, -1, 1);
    uint16_t *ah = malloc((size_t)(m * k) * 2), *bh = malloc((size_t)(k * n) * 2), *ch = malloc((size_t)(m * n) * 2);
    for (ct_dtype dt = CT_F16; dt <= CT_BF16; dt++) {
        float *ar = malloc((size_t)(m * k) * 4), *br = malloc((size_t)(k * n) * 4), *cr = malloc((size_t)(m * n) * 4);
        be1->elt.cast(be1, ah, dt, a, CT_F32, m * k);
        be1->elt.cast(be1, bh, dt, b, CT_F32, k * n);
        be1->elt.cast(be1, ch, dt, c0, CT_F32, m * n);
        be1->elt.cast(be1, ar, CT_F32, ah, dt, m * k);
        be1->elt.cast(be1, br, CT_F32, bh, dt, k * n);
        be1->elt.cast(be1, cr, CT_F32, ch, dt, m * n);
        double *want = dalloc(m * n);
        ref_gemm(false, false, m, n, k, 1.0, ar, k, br, n, 0.5, cr, n, want);
        /* 16-bit inputs, fp32 output */
        float *c = copyf(cr, m * n);
        be2->blas.gemm(be2, false, false, m, n, k, 1.0f, ah, dt, k, bh, dt, n, 0.5f, c, CT_F32, n);
        expect_close("gemm16 f32 out", c, want, m * n, 1e-5, 1e-4);
        /* 16-bit output: one rounding of the fp32 result */
        be2->blas.gemm(be2, false, false, m, n, k, 1.0f, ah, dt, k, bh, dt, n, 0.5f, ch, dt, n);
        be1->elt.cast(be1, c, CT_F32, ch, dt, m * n);
        expect_close("gemm16 16-bit out", c, want, m * n, dt == CT_F16 ? 1e-3 : 8e-3, 1e-3);
        free(ar), free(br), free(cr), free(c), free(want);
    }
    /* batched: 37 small GEMMs with strides, B transposed (run as parallel batch items) */
    int64_t batch = 37, sa = m * k + 5, sb = n * k + 2, sc = m * n + 1;
    float *A = rnd(batch * sa, 43, -1, 1), *B = rnd(batch * sb, 44, -1, 1), *C = rnd(batch * sc, 45, -1, 1);
    float *C0 = copyf(C, batch * sc);
    float *C1 = copyf(C, batch * sc);
    be2->blas.gemm_batched(be2, false, true, m, n, k, 2.0f, A, k, sa, B, k, sb, 1.0f, C, n, sc, batch);
    be1->blas.gemm_batched(be1, false, true, m, n, k, 2.0f, A, k, sa, B, k, sb, 1.0f, C1, n, sc, batch);
    expect_bits("gemm_batched", C, C1, (size_t)(batch * sc) * 4);
    free(C1);
    for (int64_t i = 0; i < batch; i++) {
        double *want = dalloc(m * n);
        ref_gemm(false, true, m, n, k, 2.0, A + i * sa, k, B + i * sb, k, 1.0, C0 + i * sc, n, want);
        expect_close("gemm_batched", C + i * sc, want, m * n, 1e-4, 1e-4);
        free(want);
    }
    /* k = 0: C = beta * C */
    float *c2 = rnd(m * n, 46, -1, 1), *c2_0 = copyf(c2, m * n);
    be2->blas.gemm(be2, false, false, m, n, 0, 1.0f, a, CT_F32, 1, b, CT_F32, n, 0.5f, c2, CT_F32, n);
    for (int64_t i = 0; i < m * n; i++) ck_assert(c2[i] == 0.5f * c2_0[i]);
    free(c2), free(c2_0);
    free(a), free(b), free(c0), free(ah), free(bh), free(ch), free(A), free(B), free(C), free(C0);
}
END_TEST

/* ---- element-wise ---- */

START_TEST(vector_ops) {
    for (size_t s = 0; s < CT_ARRAY_LEN(SIZES); s++) {
        int64_t n = SIZES[s];
        float *x = rnd(n, 50, -3, 3), *y = rnd(n, 51, -3, 3), *z = malloc((size_t)n * 4);
        double *want = dalloc(n);
        be2->elt.add(be2, z, x, y, n, CT_F32);
        for (int64_t i = 0; i < n; i++) want[i] = (double)x[i] + y[i];
        expect_close("add", z, want, n, 1e-7, 0);
        be2->elt.axpy(be2, z, -0.25f, x, n, CT_F32);
        for (int64_t i = 0; i < n; i++) want[i] += -0.25 * x[i];
        expect_close("axpy", z, want, n, 1e-6, 1e-6);
        be2->elt.scale(be2, z, 3.0f, n, CT_F32);
        for (int64_t i = 0; i < n; i++) want[i] *= 3.0;
        expect_close("scale", z, want, n, 1e-6, 1e-6);
        be2->elt.fill(be2, z, 1.5f, n, CT_F32);
        for (int64_t i = 0; i < n; i++) ck_assert(z[i] == 1.5f);
        free(x), free(y), free(z), free(want);
    }
}
END_TEST

START_TEST(copy_rows_op) {
    int64_t rows = 37, cols = 11, ldx = 13, ldy = 29, col0 = 5;
    float *x = rnd(rows * ldx, 52, -1, 1), *y = rnd(rows * ldy, 53, -1, 1), *y0 = copyf(y, rows * ldy);
    be2->elt.copy_rows(be2, y + col0, ldy, x, ldx, rows, cols, false, CT_F32);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < ldy; j++) {
            float want = (j >= col0 && j < col0 + cols) ? x[r * ldx + j - col0] : y0[r * ldy + j];
            ck_assert(y[r * ldy + j] == want);
        }
    be2->elt.copy_rows(be2, y + col0, ldy, x, ldx, rows, cols, true, CT_F32);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) ck_assert(y[r * ldy + col0 + j] == 2.0f * x[r * ldx + j]);
    free(x), free(y), free(y0);
}
END_TEST

/* ---- activations: forward against double formulas, backward against central differences ---- */

static double ref_act(double x, ct_act act, double alpha) {
    switch (act) {
    case CT_ACT_NONE: return x;
    case CT_ACT_RELU: return x > 0 ? x : 0;
    case CT_ACT_LEAKY_RELU: return x > 0 ? x : alpha * x;
    case CT_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case CT_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case CT_ACT_SILU: return x / (1 + exp(-x));
    case CT_ACT_TANH: return tanh(x);
    case CT_ACT_SIGMOID: return 1 / (1 + exp(-x));
    }
    return 0;
}

START_TEST(activations) {
    const ct_act acts[] = {CT_ACT_NONE, CT_ACT_RELU, CT_ACT_LEAKY_RELU, CT_ACT_GELU, CT_ACT_GELU_TANH,
                           CT_ACT_SILU, CT_ACT_TANH, CT_ACT_SIGMOID};
    for (size_t s = 0; s < CT_ARRAY_LEN(SIZES); s++)
        for (size_t a = 0; a < CT_ARRAY_LEN(acts); a++) {
            int64_t n = SIZES[s];
            float *x = rnd(n, 60 + a, -6, 6), *dy = rnd(n, 70 + a, -1, 1);
            /* keep x away from the kinks of relu so the finite difference is meaningful */
            for (int64_t i = 0; i < n; i++)
                if (fabsf(x[i]) < 1e-3f) x[i] = 0.5f;
            float *y = malloc((size_t)n * 4), *dx = malloc((size_t)n * 4);
            double *want = dalloc(n), *dwant = dalloc(n);
            be2->elt.act_forward(be2, y, x, n, acts[a], 0.1f, CT_F32);
            be2->elt.act_backward(be2, dx, dy, x, y, n, acts[a], 0.1f, CT_F32);
            for (int64_t i = 0; i < n; i++) {
                double h = 1e-5;
                want[i] = ref_act(x[i], acts[a], 0.1f);
                dwant[i] = dy[i] * (ref_act(x[i] + h, acts[a], 0.1f) - ref_act(x[i] - h, acts[a], 0.1f)) / (2 * h);
            }
            char what[64];
            snprintf(what, sizeof what, "act %d forward", (int)acts[a]);
            expect_close(what, y, want, n, 1e-5, 1e-6);
            snprintf(what, sizeof what, "act %d backward", (int)acts[a]);
            expect_close(what, dx, dwant, n, 1e-4, 1e-5);
            /* in place: dx aliasing dy */
            be2->elt.act_backward(be2, dy, dy, x, y, n, acts[a], 0.1f, CT_F32);
            ck_assert(memcmp(dy, dx, (size_t)n * 4) == 0);
            free(x), free(dy), free(y), free(dx), free(want), free(dwant);
        }
}
END_TEST

START_TEST(bias_act_and_bias_backward) {
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 33, 1}, {33, 7, 1}, {5, 3, 49}, {2, 64, 196}, {300, 10, 1}};
    for (size_t s = 0; s < CT_ARRAY_LEN(shapes); s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], inner = shapes[s][2], n = rows * cols * inner;
        float *x = rnd(n, 80, -2, 2), *bias = rnd(cols, 81, -1, 1), *x0 = copyf(x, n);
        double *want = dalloc(n);
        be2->elt.bias_act_forward(be2, x, bias, rows, cols, inner, CT_ACT_GELU, 0.0f, CT_F32);
        for (int64_t i = 0; i < n; i++) want[i] = ref_act((double)x0[i] + bias[(i / inner) % cols], CT_ACT_GELU, 0);
        expect_close("bias_act", x, want, n, 1e-5, 1e-6);
        /* db accumulates */
        float *db = rnd(cols, 82, -1, 1);
        double *dwant = dalloc(cols);
        for (int64_t j = 0; j < cols; j++) dwant[j] = db[j];
        for (int64_t i = 0; i < n; i++) dwant[(i / inner) % cols] += x0[i];
        be2->elt.bias_backward(be2, db, x0, rows, cols, inner, CT_F32);
        expect_close("bias_backward", db, dwant, cols, 1e-5, 1e-5);
        /* 1 thread gives the same bits */
        float *db1 = rnd(cols, 82, -1, 1);
        be1->elt.bias_backward(be1, db1, x0, rows, cols, inner, CT_F32);
        expect_bits("bias_backward", db, db1, (size_t)cols * 4);
        free(x), free(bias), free(x0), free(want), free(db), free(dwant), free(db1);
    }
}
END_TEST

/* ---- dropout ---- */

START_TEST(dropout_mask_and_threads) {
    for (size_t s = 0; s < CT_ARRAY_LEN(SIZES); s++) {
        int64_t n = SIZES[s];
        float p = 0.3f;
        float *x = rnd(n, 90, -1, 1), *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4);
        uint8_t *m1 = malloc((size_t)n), *m2 = malloc((size_t)n);
        be1->elt.dropout_forward(be1, y1, m1, x, n, p, 7, 11, CT_F32);
        be2->elt.dropout_forward(be2, y2, m2, x, n, p, 7, 11, CT_F32);
        expect_bits("dropout y", y1, y2, (size_t)n * 4);
        expect_bits("dropout mask", m1, m2, (size_t)n);
        int64_t kept = 0;
        for (int64_t i = 0; i < n; i++) {
            int keep = (double)ct_rng_at(7, CT_RNG_DROPOUT, 11, (uint64_t)i) >= (double)p * 4294967296.0;
            ck_assert_int_eq(m1[i], keep);
            ck_assert(y1[i] == (keep ? x[i] * (1.0f / (1.0f - p)) : 0.0f));
            kept += keep;
        }
        if (n >= 1000) ck_assert(fabs((double)kept / n - 0.7) < 0.05);
        float *dy = rnd(n, 91, -1, 1), *dx = malloc((size_t)n * 4);
        be2->elt.dropout_backward(be2, dx, dy, m1, n, p, CT_F32);
        for (int64_t i = 0; i < n; i++) ck_assert(dx[i] == (m1[i] ? dy[i] * (1.0f / (1.0f - p)) : 0.0f));
        free(x), free(y1), free(y2), free(m1), free(m2), free(dy), free(dx);
    }
    /* p = 0 keeps everything unchanged, p = 1 drops everything */
    {
        int64_t n = 777;
        float *x = rnd(n, 93, -1, 1), *y = malloc((size_t)n * 4);
        uint8_t *m = malloc((size_t)n);
        be2->elt.dropout_forward(be2, y, m, x, n, 0.0f, 7, 1, CT_F32);
        ck_assert(memcmp(x, y, (size_t)n * 4) == 0);
        be2->elt.dropout_forward(be2, y, m, x, n, 1.0f, 7, 1, CT_F32);
        for (int64_t i = 0; i < n; i++) ck_assert(y[i] == 0.0f && m[i] == 0);
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

/* ---- convolution: im2col + GEMM against direct convolution, col2im as im2col's adjoint ---- */

static void fill_out_dims(ct_conv2d_geom *g) {
    g->oh = (g->h + 2 * g->pad_h - g->dil_h * (g->kh - 1) - 1) / g->stride_h + 1;
    g->ow = (g->w + 2 * g->pad_w - g->dil_w * (g->kw - 1) - 1) / g->stride_w + 1;
}

START_TEST(im2col_col2im) {
    ct_conv2d_geom geoms[] = {
        {.n = 1, .c = 3, .h = 7, .w = 9, .oc = 4, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
         .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1},
        {.n = 1, .c = 4, .h = 11, .w = 8, .oc = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 3,
         .pad_h = 2, .pad_w = 1, .dil_h = 2, .dil_w = 1, .groups = 2},
        {.n = 1, .c = 1, .h = 1, .w = 1, .oc = 1, .kh = 1, .kw = 1, .stride_h = 1, .stride_w = 1,
         .pad_h = 0, .pad_w = 0, .dil_h = 1, .dil_w = 1, .groups = 1},
        {.n = 1, .c = 6, .h = 28, .w = 28, .oc = 6, .kh = 5, .kw = 5, .stride_h = 1, .stride_w = 2,
         .pad_h = 2, .pad_w = 2, .dil_h = 1, .dil_w = 1, .groups = 3},
        /* "same" unit-stride shapes (the shifted-copy path), incl. dilation and uneven padding */
        {.n = 1, .c = 2, .h = 6, .w = 5, .oc = 3, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
         .pad_h = 2, .pad_w = 2, .dil_h = 2, .dil_w = 2, .groups = 1},
        {.n = 1, .c = 3, .h = 4, .w = 7, .oc = 2, .kh = 2, .kw = 3, .stride_h = 1, .stride_w = 1,
         .pad_h = 0, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1},
        {.n = 1, .c = 1, .h = 3, .w = 3, .oc = 1, .kh = 7, .kw = 7, .stride_h = 1, .stride_w = 1,
         .pad_h = 3, .pad_w = 3, .dil_h = 1, .dil_w = 1, .groups = 1},
    };
    for (size_t gi = 0; gi < CT_ARRAY_LEN(geoms); gi++) {
        ct_conv2d_geom *g = &geoms[gi];
        fill_out_dims(g);
        int64_t cg = g->c / g->groups, ocg = g->oc / g->groups, kg = cg * g->kh * g->kw, p = g->oh * g->ow;
        float *img = rnd(g->c * g->h * g->w, 100 + gi, -1, 1), *w = rnd(g->oc * kg, 110 + gi, -1, 1);
        float *col = malloc((size_t)(kg * p) * 4), *col1 = malloc((size_t)(kg * p) * 4);
        float *y = malloc((size_t)(g->oc * p) * 4);
        for (int64_t grp = 0; grp < g->groups; grp++) {
            be2->conv.im2col(be2, col, img, g, grp, CT_F32);
            be1->conv.im2col(be1, col1, img, g, grp, CT_F32);
            expect_bits("im2col", col, col1, (size_t)(kg * p) * 4);
            be2->blas.gemm(be2, false, false, ocg, p, kg, 1.0f, w + grp * ocg * kg, CT_F32, kg, col, CT_F32, p,
                      0.0f, y + grp * ocg * p, CT_F32, p);
        }
        /* direct convolution in double */
        double *want = dalloc(g->oc * p);
        for (int64_t o = 0; o < g->oc; o++) {
            int64_t grp = o / ocg;
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    double s = 0;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->stride_h - g->pad_h + ky * g->dil_h;
                                int64_t ix = ox * g->stride_w - g->pad_w + kx * g->dil_w;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                s += (double)w[((o * cg + ci) * g->kh + ky) * g->kw + kx] *
                                     img[((grp * cg + ci) * g->h + iy) * g->w + ix];
                            }
                    want[(o * g->oh + oy) * g->ow + ox] = s;
                }
        }
        expect_close("conv via im2col", y, want, g->oc * p, 1e-5, 1e-5);
        /* adjoint: <im2col(img), c> == <img, col2im(c)> per group */
        float *c = rnd(kg * p, 120 + gi, -1, 1);
        float *back = calloc((size_t)(g->c * g->h * g->w), 4), *back1 = calloc((size_t)(g->c * g->h * g->w), 4);
        for (int64_t grp = 0; grp < g->groups; grp++) {
            be2->conv.im2col(be2, col, img, g, grp, CT_F32);
            memset(back, 0, (size_t)(g->c * g->h * g->w) * 4);
            be2->conv.col2im(be2, back, c, g, grp, CT_F32);
            memset(back1, 0, (size_t)(g->c * g->h * g->w) * 4);
            be1->conv.col2im(be1, back1, c, g, grp, CT_F32);
            expect_bits("col2im", back, back1, (size_t)(g->c * g->h * g->w) * 4);
            double lhs = 0, rhs = 0;
            for (int64_t i = 0; i < kg * p; i++) lhs += (double)col[i] * c[i];
            for (int64_t i = 0; i < g->c * g->h * g->w; i++) rhs += (double)img[i] * back[i];
            expect_scalar("col2im adjoint", rhs, lhs, 1e-5, 1e-5);
            /* channels outside the group stay zero */
            for (int64_t i = 0; i < g->c * g->h * g->w; i++) {
                int64_t ch = i / (g->h * g->w);
                if (ch / cg != grp) ck_assert(back[i] == 0.0f);
            }
        }
        free(img), free(w), free(col), free(col1), free(y), free(want), free(c), free(back), free(back1);
    }
}
END_TEST

/* Whole-batch conv2d ops against per-image im2col + GEMM in double; 1 and 2 threads give the same
 * bits. 19 images: dw's fixed blocks of 8 images end in a partial block. */
static void conv_batch_reference(const ct_conv2d_geom *g, const float *x, const float *w,
                                 const float *bias, const float *dy, double *y, double *dx, double *dw) {
    int64_t cg = g->c / g->groups, ocg = g->oc / g->groups, kg = cg * g->kh * g->kw, p = g->oh * g->ow;
    int64_t in_sz = g->c * g->h * g->w;
    float *col = malloc((size_t)(kg * p) * 4), *one = calloc((size_t)in_sz, 4);
    double *dcol = dalloc(kg * p);
    for (int64_t i = 0; i < g->n; i++)
        for (int64_t grp = 0; grp < g->groups; grp++) {
            be1->conv.im2col(be1, col, x + i * in_sz, g, grp, CT_F32);
            const float *wg = w + grp * ocg * kg, *dyg = dy + (i * g->oc + grp * ocg) * p;
            for (int64_t o = 0; o < ocg; o++)
                for (int64_t q = 0; q < p; q++) {
                    double s = bias ? bias[grp * ocg + o] : 0.0;
                    for (int64_t r = 0; r < kg; r++) s += (double)wg[o * kg + r] * col[r * p + q];
                    y[(i * g->oc + grp * ocg + o) * p + q] = s;
                }
            for (int64_t o = 0; o < ocg; o++)
                for (int64_t r = 0; r < kg; r++)
                    for (int64_t q = 0; q < p; q++) dw[(grp * ocg + o) * kg + r] += (double)dyg[o * p + q] * col[r * p + q];
            for (int64_t r = 0; r < kg; r++)
                for (int64_t q = 0; q < p; q++) {
                    double s = 0;
                    for (int64_t o = 0; o < ocg; o++) s += (double)wg[o * kg + r] * dyg[o * p + q];
                    dcol[r * p + q] = s;
                }
            /* col2im is linear: push each dcol entry through it with a one-hot column */
            for (int64_t r = 0; r < kg * p; r++) col[r] = 0.0f;
            for (int64_t r = 0; r < kg * p; r++) {
                col[r] = 1.0f;
                memset(one, 0, (size_t)in_sz * 4);
                be1->conv.col2im(be1, one, col, g, grp, CT_F32);
                for (int64_t e = 0; e < in_sz; e++)
                    if (one[e] != 0.0f) dx[i * in_sz + e] += dcol[r] * one[e];
                col[r] = 0.0f;
            }
        }
    free(col), free(one), free(dcol);
}

START_TEST(conv2d_batch_ops) {
    ct_conv2d_geom geoms[] = {
        {.n = 19, .c = 3, .h = 7, .w = 6, .oc = 4, .kh = 3, .kw = 3, .stride_h = 1, .stride_w = 1,
         .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1},
        {.n = 19, .c = 4, .h = 9, .w = 8, .oc = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 1,
         .pad_h = 2, .pad_w = 1, .dil_h = 2, .dil_w = 1, .groups = 2},
    };
    for (size_t gi = 0; gi < CT_ARRAY_LEN(geoms); gi++) {
        ct_conv2d_geom *g = &geoms[gi];
        fill_out_dims(g);
        int64_t kg = g->c / g->groups * g->kh * g->kw, p = g->oh * g->ow, in_sz = g->c * g->h * g->w;
        int64_t nx = g->n * in_sz, ny = g->n * g->oc * p, nw = g->oc * kg;
        float *x = rnd(nx, 200 + gi, -1, 1), *w = rnd(nw, 210 + gi, -1, 1), *b = rnd(g->oc, 220 + gi, -1, 1);
        float *dy = rnd(ny, 230 + gi, -1, 1), *dw0 = rnd(nw, 240 + gi, -1, 1);
        float *y1 = malloc((size_t)ny * 4), *y2 = malloc((size_t)ny * 4);
        float *dx1 = rnd(nx, 250, -1, 1), *dx2 = rnd(nx, 251, -1, 1);   /* overwritten */
        float *dw1 = copyf(dw0, nw), *dw2 = copyf(dw0, nw), *dw3 = copyf(dw0, nw);
        double *yr = dalloc(ny), *dxr = dalloc(nx), *dwr = dalloc(nw);
        for (int64_t e = 0; e < nw; e++) dwr[e] = dw0[e];
        conv_batch_reference(g, x, w, b, dy, yr, dxr, dwr);
        be1->conv.conv2d_forward(be1, y1, x, w, b, g, CT_F32);
        be2->conv.conv2d_forward(be2, y2, x, w, b, g, CT_F32);
        expect_close("conv2d_forward", y2, yr, ny, 1e-5, 1e-5);
        expect_bits("conv2d_forward threads", y1, y2, (size_t)ny * 4);
        float *db1 = copyf(b, g->oc), *db2 = copyf(b, g->oc);   /* db accumulates too */
        double *dbr = dalloc(g->oc);
        for (int64_t e = 0; e < ny; e++) dbr[(e / p) % g->oc] += dy[e];
        for (int64_t o = 0; o < g->oc; o++) dbr[o] += b[o];
        be1->conv.conv2d_backward(be1, dx1, dw1, db1, dy, x, w, g, CT_F32);
        be2->conv.conv2d_backward(be2, dx2, dw2, db2, dy, x, w, g, CT_F32);
        expect_close("conv2d_backward dx", dx2, dxr, nx, 1e-5, 1e-5);
        expect_close("conv2d_backward dw", dw2, dwr, nw, 1e-4, 1e-4);
        expect_close("conv2d_backward db", db2, dbr, g->oc, 1e-5, 1e-5);
        expect_bits("conv2d_backward dx threads", dx1, dx2, (size_t)nx * 4);
        expect_bits("conv2d_backward dw threads", dw1, dw2, (size_t)nw * 4);
        expect_bits("conv2d_backward db threads", db1, db2, (size_t)g->oc * 4);
        be2->conv.conv2d_backward(be2, NULL, dw3, NULL, dy, x, w, g, CT_F32);    /* no dx, no db: same dw */
        expect_bits("conv2d_backward dw without dx", dw3, dw2, (size_t)nw * 4);
        free(db1), free(db2), free(dbr);
        be2->conv.conv2d_forward(be2, y2, x, w, NULL, g, CT_F32);           /* no bias */
        for (int64_t e = 0; e < ny; e++) yr[e] -= b[(e / p) % g->oc];
        expect_close("conv2d_forward without bias", y2, yr, ny, 1e-5, 1e-5);
        free(x), free(w), free(b), free(dy), free(dw0), free(y1), free(y2), free(dx1), free(dx2);
        free(dw1), free(dw2), free(dw3), free(yr), free(dxr), free(dwr);
    }
}
END_TEST

/* ---- pooling ---- */

static void pool_dims(ct_pool2d_geom *g) {
    g->oh = (g->h + 2 * g->pad_h - g->kh) / g->stride_h + 1;
    g->ow = (g->w + 2 * g->pad_w - g->kw) / g->stride_w + 1;
}

START_TEST(maxpool) {
    ct_pool2d_geom geoms[] = {
        {.n = 2, .c = 3, .h = 8, .w = 8, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
        {.n = 1, .c = 5, .h = 7, .w = 9, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1},
        {.n = 1, .c = 1, .h = 1, .w = 1, .kh = 1, .kw = 1, .stride_h = 1, .stride_w = 1},
        {.n = 3, .c = 2, .h = 7, .w = 9, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
        {.n = 2, .c = 3, .h = 9, .w = 9, .kh = 3, .kw = 3, .stride_h = 3, .stride_w = 3},
    };
    for (size_t gi = 0; gi < CT_ARRAY_LEN(geoms); gi++) {
        ct_pool2d_geom *g = &geoms[gi];
        pool_dims(g);
        int64_t planes = g->n * g->c, in = planes * g->h * g->w, out = planes * g->oh * g->ow;
        float *x = rnd(in, 130 + gi, -1, 1);
        /* quantise so ties are common: the first maximum in window order must win */
        for (int64_t i = 0; i < in; i++) x[i] = roundf(x[i] * 2.0f);
        float *y = malloc((size_t)out * 4), *dy = rnd(out, 140 + gi, -1, 1);
        float *dx = rnd(in, 141, 5, 6), *dx1 = rnd(in, 142, 5, 6);
        int32_t *am = malloc((size_t)out * 4);
        double *want = dalloc(out), *dwant = dalloc(in);
        be2->conv.maxpool2d_forward(be2, y, am, x, g, CT_F32);
        be2->conv.maxpool2d_backward(be2, dx, dy, am, g, CT_F32);
        be1->conv.maxpool2d_backward(be1, dx1, dy, am, g, CT_F32);
        expect_bits("maxpool backward", dx, dx1, (size_t)in * 4);
        for (int64_t pl = 0; pl < planes; pl++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    double best = -INFINITY;
                    int64_t bi = -1;
                    for (int64_t ky = 0; ky < g->kh; ky++)
                        for (int64_t kx = 0; kx < g->kw; kx++) {
                            int64_t iy = oy * g->stride_h - g->pad_h + ky, ix = ox * g->stride_w - g->pad_w + kx;
                            if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                            double v = x[(pl * g->h + iy) * g->w + ix];
                            if (bi < 0 || v > best) best = v, bi = iy * g->w + ix;
                        }
                    int64_t o = (pl * g->oh + oy) * g->ow + ox;
                    want[o] = best;
                    ck_assert_int_eq(am[o], bi);
                    dwant[pl * g->h * g->w + bi] += dy[o];
                }
        expect_close("maxpool", y, want, out, 0, 0);
        expect_close("maxpool backward", dx, dwant, in, 1e-6, 1e-6);
        /* NaN wins its window, as in torch: put one at the last element of output 0's window */
        if (g->pad_h == 0 && g->pad_w == 0) {
            int64_t at = (g->kh - 1) * g->w + (g->kw - 1);
            x[at] = NAN;
            be2->conv.maxpool2d_forward(be2, y, am, x, g, CT_F32);
            ck_assert(isnan(y[0]));
            ck_assert_int_eq(am[0], at);
        }
        free(x), free(y), free(dy), free(dx), free(dx1), free(am), free(want), free(dwant);
    }
}
END_TEST

START_TEST(avgpool) {
    for (int include = 0; include < 2; include++) {
        ct_pool2d_geom geoms[] = {
            {.n = 2, .c = 3, .h = 8, .w = 8, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2},
            {.n = 1, .c = 5, .h = 7, .w = 9, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1},
            {.n = 3, .c = 2, .h = 5, .w = 5, .kh = 5, .kw = 5, .stride_h = 1, .stride_w = 1},
        };
        for (size_t gi = 0; gi < CT_ARRAY_LEN(geoms); gi++) {
            ct_pool2d_geom *g = &geoms[gi];
            g->count_include_pad = include;
            pool_dims(g);
            int64_t planes = g->n * g->c, in = planes * g->h * g->w, out = planes * g->oh * g->ow;
            float *x = rnd(in, 150 + gi, -1, 1), *y = malloc((size_t)out * 4), *dy = rnd(out, 160 + gi, -1, 1);
            float *dx = rnd(in, 161, 5, 6);
            double *want = dalloc(out), *dwant = dalloc(in);
            be2->conv.avgpool2d_forward(be2, y, x, g, CT_F32);
            be2->conv.avgpool2d_backward(be2, dx, dy, g, CT_F32);
            for (int64_t pl = 0; pl < planes; pl++)
                for (int64_t oy = 0; oy < g->oh; oy++)
                    for (int64_t ox = 0; ox < g->ow; ox++) {
                        double s = 0;
                        int64_t cnt = 0;
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->stride_h - g->pad_h + ky, ix = ox * g->stride_w - g->pad_w + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                s += x[(pl * g->h + iy) * g->w + ix];
                                cnt++;
                            }
                        double div = include ? (double)(g->kh * g->kw) : (double)cnt;
                        int64_t o = (pl * g->oh + oy) * g->ow + ox;
                        want[o] = s / div;
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t iy = oy * g->stride_h - g->pad_h + ky, ix = ox * g->stride_w - g->pad_w + kx;
                                if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w) continue;
                                dwant[(pl * g->h + iy) * g->w + ix] += dy[o] / div;
                            }
                    }
            expect_close("avgpool", y, want, out, 1e-6, 1e-6);
            expect_close("avgpool backward", dx, dwant, in, 1e-5, 1e-6);
            free(x), free(y), free(dy), free(dx), free(want), free(dwant);
        }
    }
}
END_TEST

/* ---- batch norm ---- */

START_TEST(batchnorm) {
    const int64_t shapes[][3] = {{4, 3, 25}, {1, 7, 33}, {16, 33, 1}, {2, 1, 1000}};
    for (size_t s = 0; s < CT_ARRAY_LEN(shapes); s++) {
        int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], tot = n * c * hw, m = n * hw;
        float *x = rnd(tot, 170 + s, -2, 3), *gamma = rnd(c, 171, 0.5f, 1.5f), *beta = rnd(c, 172, -1, 1);
        float *rm = rnd(c, 173, -0.1f, 0.1f), *rv = rnd(c, 174, 0.9f, 1.1f), *rm0 = copyf(rm, c), *rv0 = copyf(rv, c);
        float *y = malloc((size_t)tot * 4), *mean = malloc((size_t)c * 4), *istd = malloc((size_t)c * 4);
        float eps = 1e-5f, mom = 0.1f;
        be2->norm.batchnorm_forward(be2, y, x, gamma, beta, rm, rv, mean, istd, n, c, hw, eps, mom, true, CT_F32);
        double *want = dalloc(tot), *dmean = dalloc(c), *dvar = dalloc(c);
        for (int64_t ch = 0; ch < c; ch++) {
            double s1 = 0, s2 = 0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < hw; j++) s1 += x[(i * c + ch) * hw + j];
            double mu = s1 / m;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < hw; j++) s2 += pow(x[(i * c + ch) * hw + j] - mu, 2);
            dmean[ch] = mu;
            dvar[ch] = s2 / m;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < hw; j++) {
                    int64_t k = (i * c + ch) * hw + j;
                    want[k] = (x[k] - mu) / sqrt(dvar[ch] + eps) * gamma[ch] + beta[ch];
                }
            expect_scalar("bn mean", mean[ch], mu, 1e-5, 1e-6);
            expect_scalar("bn invstd", istd[ch], 1 / sqrt(dvar[ch] + eps), 1e-5, 0);
            expect_scalar("bn running_mean", rm[ch], 0.9 * rm0[ch] + 0.1 * mu, 1e-5, 1e-6);
            double unbiased = m > 1 ? s2 / (m - 1) : s2;
            expect_scalar("bn running_var", rv[ch], 0.9 * rv0[ch] + 0.1 * unbiased, 1e-5, 1e-6);
        }
        expect_close("bn forward", y, want, tot, 1e-4, 1e-5);
        /* backward against the analytic gradient in double */
        float *dy = rnd(tot, 175, -1, 1), *dx = malloc((size_t)tot * 4);
        float *dg = rnd(c, 176, -1, 1), *db = rnd(c, 177, -1, 1), *dg0 = copyf(dg, c), *db0 = copyf(db, c);
        be2->norm.batchnorm_backward(be2, dx, dg, db, dy, x, gamma, mean, istd, n, c, hw, CT_F32);
        double *dxw = dalloc(tot), *dgw = dalloc(c), *dbw = dalloc(c);
        for (int64_t ch = 0; ch < c; ch++) {
            double is = 1 / sqrt(dvar[ch] + eps), sdy = 0, sdyx = 0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < hw; j++) {
                    int64_t k = (i * c + ch) * hw + j;
                    sdy += dy[k];
                    sdyx += dy[k] * (x[k] - dmean[ch]) * is;
                }
            dgw[ch] = dg0[ch] + sdyx;
            dbw[ch] = db0[ch] + sdy;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < hw; j++) {
                    int64_t k = (i * c + ch) * hw + j;
                    double xh = (x[k] - dmean[ch]) * is;
                    dxw[k] = gamma[ch] * is * (dy[k] - sdy / m - xh * sdyx / m);
                }
        }
        expect_close("bn dx", dx, dxw, tot, 1e-3, 1e-4);
        expect_close("bn dgamma", dg, dgw, c, 1e-4, 1e-4);
        expect_close("bn dbeta", db, dbw, c, 1e-5, 1e-5);
        /* eval mode uses the running statistics */
        be2->norm.batchnorm_forward(be2, y, x, gamma, beta, rm, rv, NULL, NULL, n, c, hw, eps, mom, false, CT_F32);
        for (int64_t k = 0; k < tot; k++) {
            int64_t ch = (k / hw) % c;
            want[k] = (x[k] - rm[ch]) / sqrt(rv[ch] + eps) * gamma[ch] + beta[ch];
        }
        expect_close("bn eval", y, want, tot, 1e-4, 1e-5);
        free(x), free(gamma), free(beta), free(rm), free(rv), free(rm0), free(rv0), free(y), free(mean);
        free(istd), free(want), free(dmean), free(dvar), free(dy), free(dx), free(dg), free(db), free(dg0);
        free(db0), free(dxw), free(dgw), free(dbw);
    }
}
END_TEST

/* ---- layer norm ---- */

START_TEST(layernorm) {
    const int64_t shapes[][2] = {{1, 1}, {7, 33}, {33, 7}, {3, 1000}, {300, 64}};
    for (size_t s = 0; s < CT_ARRAY_LEN(shapes); s++) {
        int64_t rows = shapes[s][0], d = shapes[s][1], tot = rows * d;
        float *x = rnd(tot, 180 + s, -2, 3), *gamma = rnd(d, 181, 0.5f, 1.5f), *beta = rnd(d, 182, -1, 1);
        float *y = malloc((size_t)tot * 4), *mean = malloc((size_t)rows * 4), *rstd = malloc((size_t)rows * 4);
        float eps = 1e-5f;
        be2->norm.layernorm_forward(be2, y, mean, rstd, x, gamma, beta, rows, d, eps, CT_F32);
        float *dy = rnd(tot, 183, -1, 1), *dx = malloc((size_t)tot * 4);
        float *dg = rnd(d, 184, -1, 1), *db = rnd(d, 185, -1, 1), *dg0 = copyf(dg, d), *db0 = copyf(db, d);
        be2->norm.layernorm_backward(be2, dx, dg, db, dy, x, gamma, mean, rstd, rows, d, CT_F32);
        double *want = dalloc(tot), *dxw = dalloc(tot), *dgw = dalloc(d), *dbw = dalloc(d);
        for (int64_t j = 0; j < d; j++) dgw[j] = dg0[j], dbw[j] = db0[j];
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * d, *dyr = dy + r * d;
            double mu = 0, var = 0;
            for (int64_t j = 0; j < d; j++) mu += xr[j];
            mu /= d;
            for (int64_t j = 0; j < d; j++) var += pow(xr[j] - mu, 2);
            var /= d;
            double rs = 1 / sqrt(var + eps), sg = 0, sgx = 0;
            expect_scalar("ln mean", mean[r], mu, 1e-5, 1e-6);
            expect_scalar("ln rstd", rstd[r], rs, 1e-4, 0);
            for (int64_t j = 0; j < d; j++) {
                double xh = (xr[j] - mu) * rs;
                want[r * d + j] = xh * gamma[j] + beta[j];
                sg += dyr[j] * gamma[j];
                sgx += dyr[j] * gamma[j] * xh;
                dgw[j] += dyr[j] * xh;
                dbw[j] += dyr[j];
            }
            for (int64_t j = 0; j < d; j++) {
                double xh = (xr[j] - mu) * rs;
                dxw[r * d + j] = rs * (dyr[j] * gamma[j] - sg / d - xh * sgx / d);
            }
        }
        expect_close("ln forward", y, want, tot, 1e-4, 1e-5);
        expect_close("ln dx", dx, dxw, tot, 1e-3, 1e-4);
        expect_close("ln dgamma", dg, dgw, d, 1e-4, 1e-4);
        expect_close("ln dbeta", db, dbw, d, 1e-5, 1e-5);
        /* same bits with 1 thread */
        float *dx1 = malloc((size_t)tot * 4), *dg1 = copyf(dg0, d), *db1 = copyf(db0, d);
        be1->norm.layernorm_backward(be1, dx1, dg1, db1, dy, x, gamma, mean, rstd, rows, d, CT_F32);
        expect_bits("ln dx", dx, dx1, (size_t)tot * 4);
        expect_bits("ln dgamma", dg, dg1, (size_t)d * 4);
        free(x), free(gamma), free(beta), free(y), free(mean), free(rstd), free(dy), free(dx), free(dg);
        free(db), free(dg0), free(db0), free(want), free(dxw), free(dgw), free(dbw), free(dx1), free(dg1), free(db1);
    }
}
END_TEST

/* ---- embedding ---- */

START_TEST(embedding) {
    int64_t vocab = 50, dim = 33, n_ids = 1000;
    float *table = rnd(vocab * dim, 190, -1, 1), *y = malloc((size_t)(n_ids * dim) * 4);
    int32_t *ids = malloc((size_t)n_ids * 4);
    ct_rng r;
    ct_rng_init(&r, 5, CT_RNG_INIT, 191);
    for (int64_t i = 0; i < n_ids; i++) ids[i] = (int32_t)ct_rng_below(&r, (uint32_t)vocab);
    be2->embed.embedding_forward(be2, y, ids, table, n_ids, dim, CT_F32);
    for (int64_t i = 0; i < n_ids; i++) ck_assert(memcmp(y + i * dim, table + ids[i] * dim, (size_t)dim * 4) == 0);
    float *dy = rnd(n_ids * dim, 192, -1, 1), *dt = rnd(vocab * dim, 193, -1, 1), *dt1 = copyf(dt, vocab * dim);
    double *want = dalloc(vocab * dim);
    for (int64_t i = 0; i < vocab * dim; i++) want[i] = dt[i];
    for (int64_t i = 0; i < n_ids; i++)
        for (int64_t j = 0; j < dim; j++) want[ids[i] * dim + j] += dy[i * dim + j];
    be2->embed.embedding_backward(be2, dt, dy, ids, n_ids, vocab, dim, CT_F32);
    be1->embed.embedding_backward(be1, dt1, dy, ids, n_ids, vocab, dim, CT_F32);
    expect_close("embedding backward", dt, want, vocab * dim, 1e-5, 1e-5);
    expect_bits("embedding backward", dt, dt1, (size_t)(vocab * dim) * 4);
    free(table), free(y), free(ids), free(dy), free(dt), free(dt1), free(want);
}
END_TEST

/* ---- losses: value against double formulas, gradient against central differences ---- */

static double ref_xent(const float *x, const int32_t *labels, int64_t rows, int64_t C, double eps,
                       const double *bump, int64_t bump_at, double h, int64_t *correct) {
    double total = 0;
    int64_t valid = 0;
    if (correct) *correct = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (labels[r] < 0) continue;
        valid++;
        double mx = -INFINITY, se = 0, sx = 0;
        int64_t arg = 0;
        for (int64_t j = 0; j < C; j++) {
            double v = x[r * C + j] + (r * C + j == bump_at ? h : 0) + (bump ? 0 : 0);
            if (v > mx) mx = v, arg = j;
        }
        for (int64_t j = 0; j < C; j++) {
            double v = x[r * C + j] + (r * C + j == bump_at ? h : 0);
            se += exp(v - mx);
            sx += v;
        }
        double lse = mx + log(se);
        double xl = x[r * C + labels[r]] + (r * C + labels[r] == bump_at ? h : 0);
        total += (1 - eps) * (lse - xl) + eps * (lse - sx / C);
        if (correct) *correct += arg == labels[r];
    }
    return valid ? total / valid : 0;
}

START_TEST(softmax_cross_entropy) {
    const int64_t shapes[][2] = {{1, 1}, {7, 10}, {33, 7}, {5, 1000}, {300, 3}};
    for (size_t s = 0; s < CT_ARRAY_LEN(shapes); s++)
        for (int sm = 0; sm < 2; sm++) {
            int64_t rows = shapes[s][0], C = shapes[s][1];
            double eps = sm ? 0.1 : 0.0;
            float *x = rnd(rows * C, 200 + s, -4, 4), *g = malloc((size_t)(rows * C) * 4);
            int32_t *lab = malloc((size_t)rows * 4);
            ct_rng r;
            ct_rng_init(&r, 6, CT_RNG_INIT, 201 + s);
            for (int64_t i = 0; i < rows; i++) lab[i] = (int32_t)ct_rng_below(&r, (uint32_t)C);
            if (rows > 3) lab[2] = -100; /* ignored row */
            float res[2] = {-1, -1};
            int64_t want_correct = 0;
            be2->loss.softmax_xent(be2, g, res, x, lab, rows, C, (float)eps, 2.0f, CT_F32);
            float loss = res[0];
            int64_t correct = (int64_t)res[1];
            double want = ref_xent(x, lab, rows, C, eps, NULL, -1, 0, &want_correct);
            expect_scalar("xent loss", loss, want, 1e-5, 1e-6);
            ck_assert_int_eq(correct, want_correct);
            /* gradient (times grad_scale 2) by central differences of the double loss, on a sample */
            for (int64_t i = 0; i < rows * C; i += 1 + rows * C / 50) {
                double h = 1e-4;
                double fd = (ref_xent(x, lab, rows, C, eps, NULL, i, h, NULL) -
                             ref_xent(x, lab, rows, C, eps, NULL, i, -h, NULL)) / (2 * h);
                expect_scalar("xent grad", g[i], 2 * fd, 1e-3, 1e-6);
            }
            /* same bits with 1 thread */
            float res1[2], *g1 = malloc((size_t)(rows * C) * 4);
            be1->loss.softmax_xent(be1, g1, res1, x, lab, rows, C, (float)eps, 2.0f, CT_F32);
            ck_assert(memcmp(res, res1, sizeof res) == 0);
            expect_bits("xent grad", g, g1, (size_t)(rows * C) * 4);
            free(x), free(g), free(lab), free(g1);
        }
}
END_TEST

START_TEST(mse_and_bce) {
    for (size_t s = 0; s < CT_ARRAY_LEN(SIZES); s++) {
        int64_t n = SIZES[s], rows = n % 7 == 0 ? 7 : 1, cols = n / rows;
        float *x = rnd(n, 210, -30, 30), *t = rnd(n, 211, -1, 1), *tb = rnd(n, 212, 0, 1);
        float *g = malloc((size_t)n * 4), loss = 0, res[2] = {-1, -1};
        double *gw = dalloc(n), want = 0;
        be2->loss.mse_loss(be2, g, res, x, t, rows, cols, 0.5f, CT_F32);
        loss = res[0];
        ck_assert(res[1] == 0.0f);
        for (int64_t i = 0; i < n; i++) {
            double d = (double)x[i] - t[i];
            want += d * d;
            gw[i] = 0.5 * 2 * d / n;
        }
        expect_scalar("mse", loss, want / n, 1e-5, 0);
        expect_close("mse grad", g, gw, n, 1e-5, 1e-12);
        /* BCE with logits: large |x| must not overflow */
        x[0] = 100.0f;
        be2->loss.bce_logits_loss(be2, g, res, x, tb, rows, cols, 1.0f, CT_F32);
        loss = res[0];
        want = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = x[i], sig = 1 / (1 + exp(-v));
            want += -(tb[i] * log(sig > 0 ? sig : 1e-300) + (1 - tb[i]) * (v > 20 ? -v : log1p(-sig)));
            gw[i] = (sig - tb[i]) / n;
        }
        expect_scalar("bce", loss, want / n, 1e-4, 0);
        expect_close("bce grad", g, gw, n, 1e-4, 1e-9);
        ck_assert(isfinite(loss));
        free(x), free(t), free(tb), free(g), free(gw);
    }
}
END_TEST

/* ---- reductions ---- */

START_TEST(reductions_and_threads) {
    for (size_t s = 0; s < CT_ARRAY_LEN(SIZES); s++) {
        int64_t n = SIZES[s];
        float *x = rnd(n, 220, -3, 3);
        double want = 0;
        for (int64_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        double got1 = be1->optim.sum_squares(be1, x, n), got2 = be2->optim.sum_squares(be2, x, n);
        expect_scalar("sum_squares", got2, want, 1e-12, 0);
        ck_assert(memcmp(&got1, &got2, sizeof got1) == 0);
        ck_assert(be2->optim.all_finite(be2, x, n));
        const float bad[] = {INFINITY, -INFINITY, NAN};
        for (int b = 0; b < 3; b++) {
            float keep = x[n - 1];
            x[n - 1] = bad[b];
            ck_assert(!be2->optim.all_finite(be2, x, n));
            ck_assert(!be1->optim.all_finite(be1, x, n));
            x[n - 1] = keep;
        }
        free(x);
    }
    /* a long sum: same bits on 1 and 2 threads */
    int64_t n = 3000017;
    float *x = rnd(n, 221, -1, 1);
    double a = be1->optim.sum_squares(be1, x, n), b = be2->optim.sum_squares(be2, x, n);
    ck_assert(memcmp(&a, &b, sizeof a) == 0);
    free(x);
}
END_TEST

/* ---- optimizers ---- */

START_TEST(adam_both_modes) {
    int64_t n = 100003;
    for (int decoupled = 0; decoupled < 2; decoupled++) {
        float *p = rnd(n, 230, -1, 1), *g = rnd(n, 231, -1, 1), *m = rnd(n, 232, -0.1f, 0.1f), *v = rnd(n, 233, 0, 0.01f);
        float *p1 = copyf(p, n), *m1 = copyf(m, n), *v1 = copyf(v, n);
        double *pw = dalloc(n), *mw = dalloc(n), *vw = dalloc(n);
        ct_adam_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f,
                          .bias_c1 = 1 - 0.9f * 0.9f, .bias_c2 = 1 - 0.999f * 0.999f, .grad_scale = 0.5f,
                          .decoupled = decoupled};
        /* the reference uses the fp32 hyper-parameters exactly as the op receives them */
        double b1 = a.beta1, b2 = a.beta2, wd = a.weight_decay, lr = a.lr, eps = a.eps;
        for (int64_t i = 0; i < n; i++) {
            double gi = g[i] * 0.5, pi = p[i];
            if (!decoupled) gi += wd * pi;
            mw[i] = b1 * m[i] + (1 - b1) * gi;
            vw[i] = b2 * v[i] + (1 - b2) * gi * gi;
            double upd = (mw[i] / a.bias_c1) / (sqrt(vw[i] / a.bias_c2) + eps);
            if (decoupled) upd += wd * pi;
            pw[i] = pi - lr * upd;
        }
        be2->optim.adam_step(be2, p, g, m, v, n, &a);
        be1->optim.adam_step(be1, p1, g, m1, v1, n, &a);
        expect_close("adam m", m, mw, n, 1e-5, 1e-7);
        expect_close("adam v", v, vw, n, 1e-5, 1e-12);
        expect_close("adam p", p, pw, n, 1e-5, 1e-6);
        expect_bits("adam p", p, p1, (size_t)n * 4);
        expect_bits("adam v", v, v1, (size_t)n * 4);
        free(p), free(g), free(m), free(v), free(p1), free(m1), free(v1), free(pw), free(mw), free(vw);
    }
}
END_TEST

START_TEST(sgd_variants) {
    int64_t n = 1000;
    /* {momentum, dampening, weight_decay, nesterov, first_step} */
    const float cfg[][5] = {{0, 0, 0, 0, 1}, {0.9f, 0, 1e-2f, 0, 1}, {0.9f, 0, 1e-2f, 0, 0},
                            {0.9f, 0.1f, 0, 0, 0}, {0.9f, 0, 1e-3f, 1, 0}, {0.9f, 0, 1e-3f, 1, 1}};
    for (size_t c = 0; c < CT_ARRAY_LEN(cfg); c++) {
        float *p = rnd(n, 240, -1, 1), *g = rnd(n, 241, -1, 1), *b = rnd(n, 242, -0.5f, 0.5f);
        double *pw = dalloc(n), *bw = dalloc(n);
        ct_sgd_args a = {.lr = 0.1f, .momentum = cfg[c][0], .dampening = cfg[c][1], .weight_decay = cfg[c][2],
                         .grad_scale = 2.0f, .nesterov = cfg[c][3] != 0, .first_step = cfg[c][4] != 0};
        for (int64_t i = 0; i < n; i++) {
            double d = g[i] * 2.0 + a.weight_decay * (double)p[i];
            bw[i] = b[i];
            if (a.momentum != 0) {
                bw[i] = a.first_step ? d : a.momentum * (double)b[i] + (1 - a.dampening) * d;
                d = a.nesterov ? d + a.momentum * bw[i] : bw[i];
            }
            pw[i] = p[i] - 0.1 * d;
        }
        be2->optim.sgd_step(be2, p, g, b, n, &a);
        expect_close("sgd p", p, pw, n, 1e-5, 1e-6);
        expect_close("sgd buf", b, bw, n, 1e-5, 1e-6);
        free(p), free(g), free(b), free(pw), free(bw);
    }
}
END_TEST

START_TEST(lamb_direction_op) {
    int64_t n = 33333;
    for (int inside = 0; inside < 2; inside++) {
        float *p = rnd(n, 250, -1, 1), *g = rnd(n, 251, -1, 1), *m = rnd(n, 252, -0.1f, 0.1f), *v = rnd(n, 253, 0, 0.01f);
        float *u = malloc((size_t)n * 4), *p1 = copyf(p, n), *m1 = copyf(m, n), *v1 = copyf(v, n), *u1 = malloc((size_t)n * 4);
        double *uw = dalloc(n), wn = 0, un = 0, wsq = 0, usq = 0;
        ct_lamb_args a = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f,
                          .bias_c1 = 0.19f, .bias_c2 = 0.002f, .grad_scale = 0.25f, .eps_inside_sqrt = inside};
        double b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
        for (int64_t i = 0; i < n; i++) {
            double gi = g[i] * 0.25, mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
            double vh = vi / a.bias_c2, den = inside ? sqrt(vh + eps) : sqrt(vh) + eps;
            uw[i] = mi / a.bias_c1 / den + wd * p[i];
            wsq += (double)p[i] * p[i];
            usq += uw[i] * uw[i];
        }
        be2->optim.lamb_direction(be2, u, p, g, m, v, n, &a, &wn, &un);
        expect_close("lamb update", u, uw, n, 1e-4, 1e-6);
        expect_scalar("lamb w_norm", wn, sqrt(wsq), 1e-9, 0);
        expect_scalar("lamb u_norm", un, sqrt(usq), 1e-4, 0);
        double wn1, un1;
        be1->optim.lamb_direction(be1, u1, p1, g, m1, v1, n, &a, &wn1, &un1);
        ck_assert(memcmp(&un, &un1, sizeof un) == 0);
        expect_bits("lamb update", u, u1, (size_t)n * 4);
        free(p), free(g), free(m), free(v), free(u), free(p1), free(m1), free(v1), free(u1), free(uw);
    }
}
END_TEST

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

/* ---- 16-bit storage: every dtype op equals the fp32 op on the widened inputs, its 16-bit
 * outputs rounded once (backend.h). One table: each case lists its arguments by role; the checker
 * makes random inputs, runs the op in dt on 16-bit copies and in fp32 on the widened values, and
 * compares bit for bit (and the dt run on 1 vs 2 threads). ---- */

typedef enum {
    ARG_IN,      /* activation/parameter input in dt */
    ARG_OUT,     /* activation output in dt (written only) */
    ARG_IO,      /* activation in dt, read and written */
    ARG_F32_IN,  /* fp32 input (targets) */
    ARG_F32_OUT, /* fp32 output (param grads, statistics, loss result) */
    ARG_F32_IO,  /* fp32 read and written (running stats, gemm C in fp32) */
    ARG_I32_IN,  /* int32 in [0, hi) (labels, ids) */
    ARG_RAW_OUT, /* bytes compared as they are (masks, argmax) */
} dt_role;

typedef struct {
    dt_role role;
    int64_t n;   /* elements (bytes for ARG_RAW_OUT) */
    float lo, hi;
} dt_arg;

#define DT_MAX_ARGS 8
typedef struct {
    const char *name;
    void (*run)(ct_backend *be, void **a, ct_dtype dt);
    bool special; /* sprinkle fp16-overflowing values and subnormals into the dt inputs */
    dt_arg args[DT_MAX_ARGS];
} dt_case;

static const ct_conv2d_geom DT_CONV = {.n = 3, .c = 4, .h = 9, .w = 8, .oc = 5, .kh = 3, .kw = 3,
                                       .stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1,
                                       .dil_h = 1, .dil_w = 1, .groups = 1, .oh = 9, .ow = 8};
static const ct_pool2d_geom DT_POOL = {.n = 2, .c = 3, .h = 9, .w = 8, .kh = 3, .kw = 2,
                                       .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 0,
                                       .oh = 5, .ow = 4, .count_include_pad = true};
enum { DT_N = 3001, DT_ROWS = 37, DT_COLS = 24, DT_CONV_X = 3 * 4 * 9 * 8, DT_CONV_Y = 3 * 5 * 9 * 8,
       DT_CONV_W = 5 * 4 * 9, DT_COL = 4 * 9 * 9 * 8, DT_IMG = 4 * 9 * 8, DT_POOL_X = 2 * 3 * 9 * 8,
       DT_POOL_Y = 2 * 3 * 5 * 4 };

static void dt_fill(ct_backend *be, void **a, ct_dtype dt) { be->elt.fill(be, a[0], 7e4f, DT_N, dt); }
static void dt_scale(ct_backend *be, void **a, ct_dtype dt) { be->elt.scale(be, a[0], 1.7f, DT_N, dt); }
static void dt_axpy(ct_backend *be, void **a, ct_dtype dt) { be->elt.axpy(be, a[0], -0.3f, a[1], DT_N, dt); }
static void dt_add(ct_backend *be, void **a, ct_dtype dt) { be->elt.add(be, a[0], a[1], a[2], DT_N, dt); }
static void dt_copy_rows(ct_backend *be, void **a, ct_dtype dt) {
    be->elt.copy_rows(be, a[0], DT_COLS + 3, a[1], DT_COLS, DT_ROWS, DT_COLS - 2, false, dt);
    be->elt.copy_rows(be, a[2], DT_COLS + 3, a[1], DT_COLS, DT_ROWS, DT_COLS - 2, true, dt);
}
static void dt_bias_act(ct_backend *be, void **a, ct_dtype dt) {
    be->elt.bias_act_forward(be, a[0], a[1], DT_ROWS, DT_COLS, 1, CT_ACT_GELU, 0, dt);
    be->elt.bias_act_forward(be, a[2], a[1], 3, DT_COLS, 5, CT_ACT_LEAKY_RELU, 0.1f, dt);
    be->elt.bias_backward(be, a[3], a[4], DT_ROWS, DT_COLS, 1, dt);
}
static void dt_act(ct_backend *be, void **a, ct_dtype dt) {
    /* y and dx hold one DT_N block per activation; backward reads y from its own input (a[4]),
     * as a layer reads the stored 16-bit y */
    size_t blk = DT_N * ct_dtype_size(dt);
    for (ct_act act = CT_ACT_NONE; act <= CT_ACT_SIGMOID; act++) {
        void *y = (char *)a[0] + act * blk, *dx = (char *)a[1] + act * blk;
        be->elt.act_forward(be, y, a[2], DT_N, act, 0.2f, dt);
        be->elt.act_backward(be, dx, a[3], a[2], a[4], DT_N, act, 0.2f, dt);
    }
}
static void dt_dropout(ct_backend *be, void **a, ct_dtype dt) {
    be->elt.dropout_forward(be, a[0], a[1], a[2], DT_N, 0.3f, 9, 4, dt);
    be->elt.dropout_backward(be, a[3], a[4], a[1], DT_N, 0.3f, dt);
}
static void dt_embedding(ct_backend *be, void **a, ct_dtype dt) {
    be->embed.embedding_forward(be, a[0], a[1], a[2], DT_ROWS, DT_COLS, dt);
    be->embed.embedding_backward(be, a[3], a[4], a[1], DT_ROWS, 50, DT_COLS, dt);
}
static void dt_im2col(ct_backend *be, void **a, ct_dtype dt) {
    be->conv.im2col(be, a[0], a[1], &DT_CONV, 0, dt);
    be->conv.col2im(be, a[2], a[3], &DT_CONV, 0, dt);
}
static void dt_conv(ct_backend *be, void **a, ct_dtype dt) {
    be->conv.conv2d_forward(be, a[0], a[1], a[2], a[3], &DT_CONV, dt);
    be->conv.conv2d_backward(be, a[4], a[5], a[6], a[7], a[1], a[2], &DT_CONV, dt);
}
static void dt_maxpool(ct_backend *be, void **a, ct_dtype dt) {
    be->conv.maxpool2d_forward(be, a[0], a[1], a[2], &DT_POOL, dt);
    be->conv.maxpool2d_backward(be, a[3], a[4], a[1], &DT_POOL, dt);
}
static void dt_avgpool(ct_backend *be, void **a, ct_dtype dt) {
    be->conv.avgpool2d_forward(be, a[0], a[1], &DT_POOL, dt);
    be->conv.avgpool2d_backward(be, a[2], a[3], &DT_POOL, dt);
}
static void dt_batchnorm(ct_backend *be, void **a, ct_dtype dt) {
    float *st = a[3]; /* running mean, var, save mean, invstd: [4, 4] */
    be->norm.batchnorm_forward(be, a[0], a[1], a[2], (char *)a[2] + 4 * ct_dtype_size(dt), st, st + 4, st + 8,
                          st + 12, 3, 4, 17, 1e-5f, 0.1f, true, dt);
    be->norm.batchnorm_backward(be, a[4], a[5], a[6], a[7], a[1], a[2], st + 8, st + 12, 3, 4, 17, dt);
    be->norm.batchnorm_forward(be, a[0], a[1], a[2], (char *)a[2] + 4 * ct_dtype_size(dt), st, st + 4, st + 8,
                          st + 12, 3, 4, 17, 1e-5f, 0.1f, false, dt);
}
static void dt_layernorm(ct_backend *be, void **a, ct_dtype dt) {
    float *st = a[3];
    be->norm.layernorm_forward(be, a[0], st, st + DT_ROWS, a[1], a[2], (char *)a[2] + DT_COLS * ct_dtype_size(dt),
                          DT_ROWS, DT_COLS, 1e-5f, dt);
    be->norm.layernorm_backward(be, a[4], a[5], a[6], a[7], a[1], a[2], st, st + DT_ROWS, DT_ROWS, DT_COLS, dt);
}
static void dt_losses(ct_backend *be, void **a, ct_dtype dt) {
    float *res = a[3];
    be->loss.softmax_xent(be, a[0], res, a[1], a[2], DT_ROWS, DT_COLS, 0.1f, 3.0f, dt);
    be->loss.mse_loss(be, a[4], res + 2, a[1], a[5], DT_ROWS, DT_COLS, 0.5f, dt);
    be->loss.bce_logits_loss(be, a[6], res + 4, a[1], a[7], DT_ROWS, DT_COLS, 1.0f, dt);
}
static void dt_gemm(ct_backend *be, void **a, ct_dtype dt) {
    /* C in dt (beta 0.5 reads it) and C in fp32 accumulating (beta 1), each transpose */
    be->blas.gemm(be, false, true, DT_ROWS, 19, DT_COLS, 1.0f, a[0], dt, DT_COLS, a[1], dt, DT_COLS, 0.5f, a[2],
             dt, 19);
    be->blas.gemm(be, true, false, DT_COLS, DT_COLS, DT_ROWS, 0.7f, a[0], dt, DT_COLS, a[0], dt, DT_COLS, 1.0f,
             a[3], CT_F32, DT_COLS);
}

static const dt_case DT_CASES[] = {
    {"fill", dt_fill, true, {{ARG_OUT, DT_N, -1, 1}}},
    {"scale", dt_scale, true, {{ARG_IO, DT_N, -5e4f, 5e4f}}},
    {"axpy", dt_axpy, true, {{ARG_IO, DT_N, -3, 3}, {ARG_IN, DT_N, -3, 3}}},
    {"add", dt_add, true, {{ARG_OUT, DT_N, -1, 1}, {ARG_IN, DT_N, -4e4f, 4e4f}, {ARG_IN, DT_N, -4e4f, 4e4f}}},
    {"copy_rows", dt_copy_rows, true,
     {{ARG_IO, DT_ROWS * (DT_COLS + 3), -2, 2}, {ARG_IN, DT_ROWS * DT_COLS, -2, 2},
      {ARG_IO, DT_ROWS * (DT_COLS + 3), -2, 2}}},
    {"bias_act", dt_bias_act, true,
     {{ARG_IO, DT_ROWS * DT_COLS, -3, 3}, {ARG_IN, DT_COLS, -1, 1}, {ARG_IO, 3 * DT_COLS * 5, -3, 3},
      {ARG_F32_OUT, DT_COLS, 0, 1}, {ARG_IN, DT_ROWS * DT_COLS, -1, 1}}},
    {"activations", dt_act, true,
     {{ARG_OUT, 8 * DT_N, -1, 1}, {ARG_OUT, 8 * DT_N, -1, 1}, {ARG_IN, DT_N, -6, 6}, {ARG_IN, DT_N, -2, 2},
      {ARG_IN, DT_N, -1, 1}}},
    {"dropout", dt_dropout, true,
     {{ARG_OUT, DT_N, -1, 1}, {ARG_RAW_OUT, DT_N, 0, 0}, {ARG_IN, DT_N, -3, 3}, {ARG_OUT, DT_N, -1, 1},
      {ARG_IN, DT_N, -3, 3}}},
    {"embedding", dt_embedding, false,
     {{ARG_OUT, DT_ROWS * DT_COLS, -1, 1}, {ARG_I32_IN, DT_ROWS, 0, 50}, {ARG_IN, 50 * DT_COLS, -1, 1},
      {ARG_F32_OUT, 50 * DT_COLS, 0, 1}, {ARG_IN, DT_ROWS * DT_COLS, -1, 1}}},
    {"im2col_col2im", dt_im2col, false,
     {{ARG_OUT, DT_COL, -1, 1}, {ARG_IN, DT_IMG, -2, 2}, {ARG_IO, DT_IMG, -1, 1}, {ARG_IN, DT_COL, -2, 2}}},
    {"conv2d", dt_conv, false,
     {{ARG_OUT, DT_CONV_Y, -1, 1}, {ARG_IN, DT_CONV_X, -2, 2}, {ARG_IN, DT_CONV_W, -0.5f, 0.5f},
      {ARG_IN, 5, -1, 1}, {ARG_OUT, DT_CONV_X, -1, 1}, {ARG_F32_OUT, DT_CONV_W, 0, 1},
      {ARG_F32_OUT, 5, 0, 1}, {ARG_IN, DT_CONV_Y, -1, 1}}},
    {"maxpool2d", dt_maxpool, false,
     {{ARG_OUT, DT_POOL_Y, -1, 1}, {ARG_RAW_OUT, DT_POOL_Y * 4, 0, 0}, {ARG_IN, DT_POOL_X, -3, 3},
      {ARG_OUT, DT_POOL_X, -1, 1}, {ARG_IN, DT_POOL_Y, -1, 1}}},
    {"avgpool2d", dt_avgpool, false,
     {{ARG_OUT, DT_POOL_Y, -1, 1}, {ARG_IN, DT_POOL_X, -3, 3}, {ARG_OUT, DT_POOL_X, -1, 1},
      {ARG_IN, DT_POOL_Y, -1, 1}}},
    {"batchnorm", dt_batchnorm, false,
     {{ARG_OUT, 3 * 4 * 17, -1, 1}, {ARG_IN, 3 * 4 * 17, -2, 3}, {ARG_IN, 8, 0.5f, 1.5f},
      {ARG_F32_IO, 16, 0.5f, 1.5f}, {ARG_OUT, 3 * 4 * 17, -1, 1}, {ARG_F32_OUT, 4, 0, 1},
      {ARG_F32_OUT, 4, 0, 1}, {ARG_IN, 3 * 4 * 17, -1, 1}}},
    {"layernorm", dt_layernorm, false,
     {{ARG_OUT, DT_ROWS * DT_COLS, -1, 1}, {ARG_IN, DT_ROWS * DT_COLS, -2, 3}, {ARG_IN, 2 * DT_COLS, 0.5f, 1.5f},
      {ARG_F32_OUT, 2 * DT_ROWS, 0, 1}, {ARG_OUT, DT_ROWS * DT_COLS, -1, 1}, {ARG_F32_OUT, DT_COLS, 0, 1},
      {ARG_F32_OUT, DT_COLS, 0, 1}, {ARG_IN, DT_ROWS * DT_COLS, -1, 1}}},
    {"losses", dt_losses, false,
     {{ARG_OUT, DT_ROWS * DT_COLS, -1, 1}, {ARG_IN, DT_ROWS * DT_COLS, -6, 6}, {ARG_I32_IN, DT_ROWS, 0, DT_COLS},
      {ARG_F32_OUT, 6, 0, 1}, {ARG_OUT, DT_ROWS * DT_COLS, -1, 1}, {ARG_F32_IN, DT_ROWS * DT_COLS, -1, 1},
      {ARG_OUT, DT_ROWS * DT_COLS, -1, 1}, {ARG_F32_IN, DT_ROWS * DT_COLS, 0, 1}}},
    {"gemm", dt_gemm, false,
     {{ARG_IN, DT_ROWS * DT_COLS, -2, 2}, {ARG_IN, 19 * DT_COLS, -2, 2}, {ARG_IO, DT_ROWS * 19, -2, 2},
      {ARG_F32_IO, DT_COLS * DT_COLS, -2, 2}}},
};

static bool dt_is16(dt_role r) { return r == ARG_IN || r == ARG_OUT || r == ARG_IO; }

static uint16_t dt_round(float v, ct_dtype dt) { return dt == CT_F16 ? ct_f32_to_f16(v) : ct_f32_to_bf16(v); }
static float dt_widen(uint16_t h, ct_dtype dt) { return dt == CT_F16 ? ct_f16_to_f32(h) : ct_bf16_to_f32(h); }

/* Random fp32 values for one argument, already representable in dt for the 16-bit roles. */
static void *dt_make(const dt_arg *a, uint64_t stream, bool special, ct_dtype dt) {
    if (a->role == ARG_RAW_OUT) {
        uint8_t *b = malloc((size_t)a->n);
        memset(b, 0xa5, (size_t)a->n);
        return b;
    }
    if (a->role == ARG_I32_IN) {
        int32_t *ids = malloc((size_t)a->n * 4);
        ct_rng r;
        ct_rng_init(&r, 77, CT_RNG_INIT, stream);
        for (int64_t i = 0; i < a->n; i++) ids[i] = (int32_t)ct_rng_below(&r, (uint32_t)a->hi);
        return ids;
    }
    static const float specials[] = {7e4f, -7e4f, 65504.0f, 3e-6f, -1e-7f, 1e-40f, 0.0f, -0.0f};
    float *x = rnd(a->n, stream, a->lo, a->hi);
    if (!dt_is16(a->role)) return x;
    for (int64_t i = 0; i < a->n; i++) {
        if (special && i % 29 == 3) x[i] = specials[(i / 29) % CT_ARRAY_LEN(specials)];
        x[i] = dt_widen(dt_round(x[i], dt), dt);
    }
    return x;
}

static size_t dt_bytes(const dt_arg *a, ct_dtype dt) {
    if (a->role == ARG_RAW_OUT) return (size_t)a->n;
    return (size_t)a->n * (dt_is16(a->role) ? ct_dtype_size(dt) : 4);
}

/* Runs c in dt on 16-bit copies of ref32's values (on be) into a fresh set of buffers. */
static void **dt_run16(const dt_case *c, int nargs, float **ref32, ct_backend *be, ct_dtype dt) {
    void **a = calloc(DT_MAX_ARGS, sizeof *a);
    for (int i = 0; i < nargs; i++) {
        const dt_arg *g = &c->args[i];
        a[i] = malloc(dt_bytes(g, dt) + 1);
        if (dt_is16(g->role)) {
            uint16_t *h = a[i];
            for (int64_t j = 0; j < g->n; j++) h[j] = dt_round(ref32[i][j], dt);
        } else {
            memcpy(a[i], ref32[i], dt_bytes(g, dt));
        }
    }
    c->run(be, a, dt);
    return a;
}

static void dt_check_case(const dt_case *c, ct_dtype dt) {
    int nargs = 0;
    while (nargs < DT_MAX_ARGS && c->args[nargs].n > 0) nargs++;
    float *ref[DT_MAX_ARGS] = {0}, *f32[DT_MAX_ARGS] = {0};
    for (int i = 0; i < nargs; i++) {
        ref[i] = dt_make(&c->args[i], 1000 + 31 * i + (uint64_t)dt, c->special, dt);
        size_t b = dt_bytes(&c->args[i], CT_F32);
        f32[i] = malloc(b + 1);
        memcpy(f32[i], ref[i], b);
    }
    void **h2 = dt_run16(c, nargs, ref, be2, dt), **h1 = dt_run16(c, nargs, ref, be1, dt);
    c->run(be2, (void **)f32, CT_F32);
    for (int i = 0; i < nargs; i++) {
        const dt_arg *g = &c->args[i];
        ck_assert_msg(memcmp(h1[i], h2[i], dt_bytes(g, dt)) == 0, "%s %s arg %d: 1 vs 2 threads", c->name,
                      ct_dtype_name(dt), i);
        if (!dt_is16(g->role)) {
            const uint8_t *p = h2[i], *q = (const uint8_t *)f32[i];
            for (size_t j = 0; j < dt_bytes(g, dt); j += 4) {
                float u, v;
                memcpy(&u, p + j, 4), memcpy(&v, q + j, 4);
                ck_assert_msg(memcmp(p + j, q + j, g->role == ARG_RAW_OUT ? 1 : 4) == 0 || (isnan(u) && isnan(v)),
                              "%s %s arg %d [%zu]: %.9g vs fp32 op %.9g", c->name, ct_dtype_name(dt), i, j / 4, u, v);
            }
            continue;
        }
        const uint16_t *h = h2[i];
        for (int64_t j = 0; j < g->n; j++) {
            uint16_t want = dt_round(f32[i][j], dt);
            ck_assert_msg(h[j] == want || (isnan(dt_widen(h[j], dt)) && isnan(f32[i][j])),
                          "%s %s arg %d [%lld]: 0x%04x, fp32 op rounded 0x%04x (%.9g)", c->name,
                          ct_dtype_name(dt), i, (long long)j, h[j], want, f32[i][j]);
        }
    }
    for (int i = 0; i < nargs; i++) free(ref[i]), free(f32[i]), free(h1[i]), free(h2[i]);
    free(h1), free(h2);
}

START_TEST(dtype_ops_match_fp32) {
    ct_dtype dt = _i ? CT_BF16 : CT_F16;
    for (size_t k = 0; k < CT_ARRAY_LEN(DT_CASES); k++) {
        dt_check_case(&DT_CASES[k], dt);
    }
}
END_TEST

/* ---- memory accounting, upload tickets, on-device normalisation ---- */

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
    /* pinned host memory is the loader's and not counted */
    void *pin = be2->mem.alloc_host_pinned(be2, 4096);
    ct_mem_stats m2;
    be2->mem.mem_stats(be2, &m2);
    ck_assert_uint_eq(m2.current_total, m.current_total);
    be2->mem.free_host_pinned(be2, pin);
    be2->mem.free(be2, a), be2->mem.free(be2, b), be2->mem.free(be2, d);
    be2->mem.mem_stats(be2, &m);
    for (int k = 0; k < CT_MEM_CAT_COUNT; k++) ck_assert_uint_eq(m.current[k], m0.current[k]);
    ck_assert_uint_eq(be2->mem.peak_bytes(be2), 0);
    ck_assert_str_eq(ct_mem_cat_name(CT_MEM_PARAMS), "params");
    ck_assert_str_eq(ct_mem_cat_name(CT_MEM_LOADER), "loader");
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

START_TEST(normalize_u8_flip) {
    ct_u8_normalize p = {.n = 3, .c = 3, .h = 5, .w = 7, .mean = {0.5f, 0.25f, 0.1f}, .std = {0.3f, 0.2f, 0.7f}};
    int64_t n = p.n * p.c * p.h * p.w;
    uint8_t *x = malloc((size_t)n), flip[3] = {0, 1, 1};
    ct_rng r;
    ct_rng_init(&r, 5, CT_RNG_INIT, 301);
    for (int64_t i = 0; i < n; i++) x[i] = (uint8_t)ct_rng_below(&r, 256);
    float *y = malloc((size_t)n * 4);
    uint16_t *y16 = malloc((size_t)n * 2);
    be2->elt.normalize_u8(be2, y, x, flip, &p, CT_F32);
    for (int dti = 0; dti < 2; dti++) {
        ct_dtype dt = dti ? CT_BF16 : CT_F16;
        be2->elt.normalize_u8(be2, y16, x, flip, &p, dt);
        for (int64_t i = 0; i < p.n; i++)
            for (int64_t c = 0; c < p.c; c++)
                for (int64_t h = 0; h < p.h; h++)
                    for (int64_t w = 0; w < p.w; w++) {
                        int64_t o = ((i * p.c + c) * p.h + h) * p.w + w;
                        int64_t sw = flip[i] ? p.w - 1 - w : w;
                        float want = ((float)x[((i * p.c + c) * p.h + h) * p.w + sw] / 255.0f - p.mean[c]) / p.std[c];
                        ck_assert_msg(memcmp(&y[o], &want, 4) == 0, "normalize_u8 [%lld]: %.9g want %.9g",
                                      (long long)o, y[o], want);
                        ck_assert_uint_eq(y16[o], dt_round(want, dt));
                    }
    }
    be2->elt.normalize_u8(be2, y, x, NULL, &p, CT_F32); /* no flip array: nothing mirrored */
    float want0 = ((float)x[p.w - 1] / 255.0f - p.mean[0]) / p.std[0];
    ck_assert(memcmp(&y[p.w - 1], &want0, 4) == 0);
    free(x), free(y), free(y16);
}
END_TEST

START_TEST(loss_result_buffer) {
    /* result[0] = mean loss, result[1] = correct count, in backend memory */
    int64_t rows = 9, C = 4;
    float *x = rnd(rows * C, 310, -3, 3), *g = malloc((size_t)(rows * C) * 4);
    int32_t lab[9];
    int64_t want_correct = 0;
    for (int64_t i = 0; i < rows; i++) {
        lab[i] = (int32_t)((i * 7) % C);
        int64_t best = 0;
        for (int64_t j = 1; j < C; j++)
            if (x[i * C + j] > x[i * C + best]) best = j;
        want_correct += best == lab[i];
    }
    float *res = be2->mem.alloc(be2, 2 * sizeof(float), CT_MEM_WORKSPACE);
    res[0] = res[1] = -1;
    be2->loss.softmax_xent(be2, g, res, x, lab, rows, C, 0.0f, 1.0f, CT_F32);
    ck_assert_float_eq(res[1], (float)want_correct);
    ck_assert(res[0] > 0 && isfinite(res[0]));
    res[1] = -1;
    be2->loss.mse_loss(be2, g, res, x, x, rows, C, 1.0f, CT_F32);
    ck_assert_float_eq(res[0], 0.0f);
    ck_assert_float_eq(res[1], 0.0f);
    be2->mem.free(be2, res);
    free(x), free(g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, f16_conversions);
    tcase_add_test(tc, bf16_conversions);
    tcase_add_test(tc, cast_op);
    tcase_add_test(tc, gemm_all_transposes);
    tcase_add_test(tc, gemm_tiled_threads);
    tcase_add_test(tc, gemm_16bit_and_batched);
    tcase_add_test(tc, vector_ops);
    tcase_add_test(tc, copy_rows_op);
    tcase_add_test(tc, activations);
    tcase_add_test(tc, bias_act_and_bias_backward);
    tcase_add_test(tc, dropout_mask_and_threads);
    tcase_add_test(tc, im2col_col2im);
    tcase_add_test(tc, conv2d_batch_ops);
    tcase_add_test(tc, maxpool);
    tcase_add_test(tc, avgpool);
    tcase_add_test(tc, batchnorm);
    tcase_add_test(tc, layernorm);
    tcase_add_test(tc, embedding);
    tcase_add_test(tc, softmax_cross_entropy);
    tcase_add_test(tc, mse_and_bce);
    tcase_add_test(tc, reductions_and_threads);
    tcase_add_test(tc, adam_both_modes);
    tcase_add_test(tc, sgd_variants);
    tcase_add_test(tc, lamb_direction_op);
    tcase_add_test(tc, pool_stress);
    tcase_add_test(tc, backend_create_and_memory);
    tcase_add_loop_test(tc, dtype_ops_match_fp32, 0, 2);
    tcase_add_test(tc, mem_stats_per_category);
    tcase_add_test(tc, upload_tickets);
    tcase_add_test(tc, normalize_u8_flip);
    tcase_add_test(tc, loss_result_buffer);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

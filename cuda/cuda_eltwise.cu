/* cuda_eltwise.cu: element-wise ops, casts, bias + activation, dropout.
 *
 * Kernels are grid-stride loops over int64 indices, so any n works with any grid. */
#include "cuda/cuda_internal.h"
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_reduce.cuh"
#include "cuda/cuda_rng.cuh"

extern "C" {
#include "core/util/rng.h"
}

/* ---- basic element-wise (storage T, fp32 arithmetic) ---- */

template <typename T> __global__ void k_fill(T *x, float v, int64_t n) {
    T s = ct_st<T>(v);
    GRID_STRIDE(i, n) x[i] = s;
}
template <typename T> __global__ void k_scale(T *x, float s, int64_t n) {
    GRID_STRIDE(i, n) x[i] = ct_st<T>(ct_ld(x[i]) * s);
}
template <typename T> __global__ void k_axpy(T *y, float a, const T *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] = ct_st<T>(ct_ld(y[i]) + a * ct_ld(x[i]));
}
template <typename T> __global__ void k_add(T *y, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(i, n) y[i] = ct_st<T>(ct_ld(a[i]) + ct_ld(b[i]));
}

static void cu_fill(ct_backend *be, void *x, float v, int64_t n, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T, LAUNCH(be, n, k_fill<T>, (T *)x, v, n));
}
static void cu_scale(ct_backend *be, void *x, float s, int64_t n, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T, LAUNCH(be, n, k_scale<T>, (T *)x, s, n));
}
static void cu_axpy(ct_backend *be, void *y, float a, const void *x, int64_t n, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T, LAUNCH(be, n, k_axpy<T>, (T *)y, a, (const T *)x, n));
}
static void cu_add(ct_backend *be, void *y, const void *a, const void *b, int64_t n, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T, LAUNCH(be, n, k_add<T>, (T *)y, (const T *)a, (const T *)b, n));
}

template <typename T>
__global__ void k_copy_rows(T *y, int64_t ldy, const T *x, int64_t ldx, int64_t rows, int64_t cols,
                            bool accumulate) {
    GRID_STRIDE(idx, rows * cols) {
        int64_t r = idx / cols, j = idx - r * cols;
        T v = x[r * ldx + j];
        if (accumulate) y[r * ldy + j] = ct_st<T>(ct_ld(y[r * ldy + j]) + ct_ld(v));
        else y[r * ldy + j] = v;
    }
}

static void cu_copy_rows(ct_backend *be, void *y, int64_t ldy, const void *x, int64_t ldx,
                         int64_t rows, int64_t cols, bool accumulate, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, rows * cols, k_copy_rows<T>, (T *)y, ldy, (const T *)x, ldx, rows,
                          cols, accumulate));
}

/* ---- casts ---- */

__global__ void k_cast_2d(void *y, int y_dt, int64_t ldy, int64_t sy, const void *x, int x_dt,
                          int64_t ldx, int64_t sx, int64_t rows, int64_t cols, int64_t batch) {
    int64_t per = rows * cols;
    GRID_STRIDE(idx, per * batch) {
        int64_t b = idx / per, rem = idx - b * per;
        int64_t r = rem / cols, j = rem - r * cols;
        ct_dev_store(y, y_dt, b * sy + r * ldy + j, ct_dev_load(x, x_dt, b * sx + r * ldx + j));
    }
}

void ct_cuda_cast_2d(ct_backend *be, void *y, ct_dtype y_dt, int64_t ldy, int64_t sy, const void *x,
                     ct_dtype x_dt, int64_t ldx, int64_t sx, int64_t rows, int64_t cols,
                     int64_t batch) {
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(y_dt) && ct_cuda_float_dtype(x_dt),
                    "cast supports f32, f16 and bf16 only");
    LAUNCH(be, rows * cols * batch, k_cast_2d, y, (int)y_dt, ldy, sy, x, (int)x_dt, ldx, sx, rows,
           cols, batch);
}

__global__ void k_scale_2d(void *c, int c_dt, int64_t ldc, int64_t sc, float beta, int64_t rows,
                           int64_t cols, int64_t batch) {
    int64_t per = rows * cols;
    GRID_STRIDE(idx, per * batch) {
        int64_t b = idx / per, rem = idx - b * per;
        int64_t r = rem / cols, j = rem - r * cols;
        int64_t at = b * sc + r * ldc + j;
        ct_dev_store(c, c_dt, at, beta == 0.0f ? 0.0f : beta * ct_dev_load(c, c_dt, at));
    }
}

void ct_cuda_scale_2d(ct_backend *be, void *c, ct_dtype c_dt, int64_t ldc, int64_t sc, float beta,
                      int64_t rows, int64_t cols, int64_t batch) {
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(c_dt), "scale supports f32, f16 and bf16 only");
    LAUNCH(be, rows * cols * batch, k_scale_2d, c, (int)c_dt, ldc, sc, beta, rows, cols, batch);
}

/* Contiguous casts: typed kernels for the hot path (master fp32 -> compute copy each step). */
__global__ void k_cast_f32_to_f16(uint16_t *y, const float *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] = ct_dev_f32_to_f16(x[i]);
}
__global__ void k_cast_f32_to_bf16(uint16_t *y, const float *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] = ct_dev_f32_to_bf16(x[i]);
}
__global__ void k_cast_f16_to_f32(float *y, const uint16_t *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] = ct_dev_f16_to_f32(x[i]);
}
__global__ void k_cast_bf16_to_f32(float *y, const uint16_t *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] = ct_dev_bf16_to_f32(x[i]);
}

/* Mixed precision: fp32 storage holding exactly 16-bit values (round trip through the hardware's
 * round-to-nearest-even conversions; overflow gives inf, NaN stays NaN). */
__global__ void k_round_f16(float *x, int64_t n) { GRID_STRIDE(i, n) x[i] = __half2float(__float2half_rn(x[i])); }
__global__ void k_round_bf16(float *x, int64_t n) {
    GRID_STRIDE(i, n) x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

static void cu_round_to(ct_backend *be, float *x, int64_t n, ct_dtype dt) {
    if (n <= 0) return;
    if (dt == CT_F16) LAUNCH(be, n, k_round_f16, x, n);
    else if (dt == CT_BF16) LAUNCH(be, n, k_round_bf16, x, n);
}

static void cu_cast(ct_backend *be, void *y, ct_dtype y_dt, const void *x, ct_dtype x_dt, int64_t n) {
    CT_CUDA_REQUIRE((unsigned)y_dt < CT_DTYPE_COUNT && (unsigned)x_dt < CT_DTYPE_COUNT,
                    "cast: unknown dtype");
    if (n <= 0) return;
    if (y_dt == x_dt) {
        if (y != x)
            CT_CUDA_CHECK(cudaMemcpyAsync(y, x, (size_t)n * ct_dtype_size(x_dt),
                                          cudaMemcpyDeviceToDevice, ct_cuda_stream(be)));
    } else if (x_dt == CT_F32 && y_dt == CT_F16) {
        LAUNCH(be, n, k_cast_f32_to_f16, (uint16_t *)y, (const float *)x, n);
    } else if (x_dt == CT_F32 && y_dt == CT_BF16) {
        LAUNCH(be, n, k_cast_f32_to_bf16, (uint16_t *)y, (const float *)x, n);
    } else if (x_dt == CT_F16 && y_dt == CT_F32) {
        LAUNCH(be, n, k_cast_f16_to_f32, (float *)y, (const uint16_t *)x, n);
    } else if (x_dt == CT_BF16 && y_dt == CT_F32) {
        LAUNCH(be, n, k_cast_bf16_to_f32, (float *)y, (const uint16_t *)x, n);
    } else { /* every other pair goes through float, as the host does */
        LAUNCH(be, n, k_cast_2d, y, (int)y_dt, n, 0, x, (int)x_dt, n, 0, 1, n, 1);
    }
}

/* ---- activations ---- */

#define CT_SQRT1_2 0.70710678118654752f
#define CT_INV_SQRT_2PI 0.39894228040143268f
#define CT_GELU_K0 0.79788456080286536f /* sqrt(2/pi), the CPU's CT_SQRT_2_PI */
#define CT_GELU_K1 0.044715f

/* The formulas are core/cpu/cpu_eltwise.c's, operation for operation: the same expression in the
 * same order, and every product that feeds an addition written __fmul_rn, because the CPU (ISO C,
 * no contraction) rounds it and nvcc would otherwise fuse it into an FMA. Near a zero of the
 * derivative (gelu' crosses 0 at x = -0.75) the sum cancels, and an FMA there changes the
 * result's leading digits. What remains between the two backends is expf/erff/tanhf, within an
 * ulp or two of glibc's. */
__device__ __forceinline__ float dev_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* 1 + exp(-2u), u = sqrt(2/pi) (x + 0.044715 x^3): gelu_tanh(x) = x / it, and
 * 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / it (one expf, no cancellation where tanh(u) is near -1) */
__device__ __forceinline__ float gelu_tanh_den(float x) {
    float inner = x + __fmul_rn(__fmul_rn(CT_GELU_K1 * x, x), x);
    return 1.0f + expf(-2.0f * CT_GELU_K0 * inner);
}

__device__ __forceinline__ float act_f(float x, int act, float alpha) {
    switch (act) {
    case CT_ACT_RELU: return x <= 0.0f ? 0.0f : x; /* NaN stays NaN, as in PyTorch */
    case CT_ACT_LEAKY_RELU: return x > 0.0f ? x : alpha * x;
    case CT_ACT_GELU: return 0.5f * x * (1.0f + erff(x * CT_SQRT1_2));
    case CT_ACT_GELU_TANH: return x / gelu_tanh_den(x);
    case CT_ACT_SILU: return x / (1.0f + expf(-x));
    case CT_ACT_TANH: return tanhf(x);
    case CT_ACT_SIGMOID: return dev_sigmoid(x);
    default: return x;
    }
}

/* dy * act'(x) with v = x[i] (or y[i] = act(x) where the derivative is cheaper from it; the
 * other may be NULL, see backend.h). */
template <typename T>
__device__ __forceinline__ float act_grad(float dy, const T *x, const T *y, int64_t i, int act,
                                          float alpha) {
    switch (act) {
    case CT_ACT_RELU: {
        float v = x ? ct_ld(x[i]) : ct_ld(y[i]);
        return v > 0.0f ? dy : 0.0f;
    }
    case CT_ACT_LEAKY_RELU: {
        float v = x ? ct_ld(x[i]) : ct_ld(y[i]);
        return v > 0.0f ? dy : alpha * dy;
    }
    case CT_ACT_GELU: {
        float v = ct_ld(x[i]);
        float cdf = 0.5f * (1.0f + erff(v * CT_SQRT1_2));
        float pdf = CT_INV_SQRT_2PI * expf(-0.5f * v * v);
        return dy * (cdf + __fmul_rn(v, pdf));
    }
    case CT_ACT_GELU_TANH: {
        /* s = sigmoid(2u), 0.5 (1 - tanh(u)^2) = 2 s (1 - s) */
        float v = ct_ld(x[i]);
        float s = 1.0f / gelu_tanh_den(v);
        float dinner = CT_GELU_K0 * (1.0f + __fmul_rn(3.0f * CT_GELU_K1 * v, v));
        return dy * (s + __fmul_rn(2.0f * v * s * (1.0f - s), dinner));
    }
    case CT_ACT_SILU: {
        float v = ct_ld(x[i]);
        float s = dev_sigmoid(v);
        return dy * s * (1.0f + __fmul_rn(v, 1.0f - s));
    }
    case CT_ACT_TANH: {
        float t = y ? ct_ld(y[i]) : tanhf(ct_ld(x[i]));
        return dy * (1.0f - __fmul_rn(t, t));
    }
    case CT_ACT_SIGMOID: {
        float s = y ? ct_ld(y[i]) : dev_sigmoid(ct_ld(x[i]));
        return dy * s * (1.0f - s);
    }
    default: return dy;
    }
}

template <typename T>
__global__ void k_act_forward(T *y, const T *x, int64_t n, int act, float alpha) {
    GRID_STRIDE(i, n) y[i] = ct_st<T>(act_f(ct_ld(x[i]), act, alpha));
}

template <typename T>
__global__ void k_act_backward(T *dx, const T *dy, const T *x, const T *y, int64_t n, int act,
                               float alpha) {
    GRID_STRIDE(i, n) dx[i] = ct_st<T>(act_grad(ct_ld(dy[i]), x, y, i, act, alpha));
}

static bool act_needs_x(ct_act act) {
    return act == CT_ACT_GELU || act == CT_ACT_GELU_TANH || act == CT_ACT_SILU ||
           act == CT_ACT_LEAKY_RELU; /* alpha <= 0: the sign of y does not give the sign of x */
}

static void cu_act_forward(ct_backend *be, void *y, const void *x, int64_t n, ct_act act,
                           float alpha, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T, LAUNCH(be, n, k_act_forward<T>, (T *)y, (const T *)x, n, (int)act, alpha));
}

static void cu_act_backward(ct_backend *be, void *dx, const void *dy, const void *x, const void *y,
                            int64_t n, ct_act act, float alpha, ct_dtype dt) {
    bool y_ok = y && (!act_needs_x(act) || (act == CT_ACT_LEAKY_RELU && alpha > 0.0f));
    CT_CUDA_REQUIRE(x || y_ok, "act_backward needs x for this activation");
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, n, k_act_backward<T>, (T *)dx, (const T *)dy, (const T *)x,
                          (const T *)y, n, (int)act, alpha));
}

/* x[rows, cols, inner] += bias[cols]; then act in place (one rounding). */
template <typename T>
__global__ void k_bias_act(T *x, const T *bias, int64_t total, int64_t cols, int64_t inner, int act,
                           float alpha) {
    GRID_STRIDE(idx, total) {
        float v = ct_ld(x[idx]);
        if (bias) v += ct_ld(bias[(idx / inner) % cols]);
        x[idx] = ct_st<T>(act_f(v, act, alpha));
    }
}

static void cu_bias_act_forward(ct_backend *be, void *x, const void *bias, int64_t rows,
                                int64_t cols, int64_t inner, ct_act act, float alpha, ct_dtype dt) {
    if (inner < 1) inner = 1; /* as the CPU backend: no inner dimension */
    if (!bias && act == CT_ACT_NONE) return;
    int64_t total = rows * cols * inner;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, total, k_bias_act<T>, (T *)x, (const T *)bias, total, cols, inner,
                          (int)act, alpha));
}

/* db[c] += sum over rows and inner of dy[r, c, i]. */
template <typename T> struct bias_grad_f {
    const T *dy;
    int64_t cols, inner;
    __device__ void operator()(int64_t r, int64_t c, int64_t i, double *out) const {
        out[0] = ct_ld(dy[(r * cols + c) * inner + i]);
    }
};
/* dst[c] += (float)sum, rounded as the CPU backend rounds it */
struct add_into_f {
    float *dst;
    __device__ void operator()(int64_t c, const double *s) const { dst[c] += (float)s[0]; }
};

static void cu_bias_backward(ct_backend *be, float *db, const void *dy, int64_t rows, int64_t cols,
                             int64_t inner, ct_dtype dt) {
    if (inner < 1) inner = 1;
    add_into_f g = {db};
    CT_DT_DISPATCH(dt, T, {
        bias_grad_f<T> f = {(const T *)dy, cols, inner};
        ct_cuda_reduce_rci<1>(be, rows, cols, inner, f, g);
    });
}

/* ---- dropout ---- */

/* One thread per Philox block: elements 4b .. 4b+3 use the block's 4 words, as ct_rng_at does. */
template <typename T>
__global__ void k_dropout_forward(T *y, uint8_t *mask, const T *x, int64_t n, uint64_t thresh,
                                  float keep_scale, uint64_t key, uint64_t stream) {
    int64_t n_blocks = (n + 3) / 4;
    GRID_STRIDE(b, n_blocks) {
        uint4 w = ct_dev_philox_block(key, stream, (uint64_t)b);
        uint32_t words[4] = {w.x, w.y, w.z, w.w};
        for (int k = 0; k < 4; k++) {
            int64_t i = b * 4 + k;
            if (i >= n) break;
            bool keep = (uint64_t)words[k] >= thresh;
            mask[i] = keep ? 1 : 0;
            y[i] = ct_st<T>(keep ? ct_ld(x[i]) * keep_scale : 0.0f);
        }
    }
}

template <typename T>
__global__ void k_dropout_backward(T *dx, const T *dy, const uint8_t *mask, int64_t n,
                                   float keep_scale) {
    GRID_STRIDE(i, n) dx[i] = ct_st<T>(mask[i] ? ct_ld(dy[i]) * keep_scale : 0.0f);
}

static float keep_scale_of(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

static void cu_dropout_forward(ct_backend *be, void *y, uint8_t *mask, const void *x, int64_t n,
                               float p, uint64_t seed, uint64_t stream, ct_dtype dt) {
    /* dropped when word < floor(p * 2^32), exactly as the CPU backend computes it */
    double t = (double)p * 4294967296.0;
    uint64_t thresh = t <= 0.0 ? 0 : (uint64_t)t;
    uint64_t key = ct_cuda_rng_key(seed, CT_RNG_DROPOUT);
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, (n + 3) / 4, k_dropout_forward<T>, (T *)y, mask, (const T *)x, n,
                          thresh, keep_scale_of(p), key, stream));
}

static void cu_dropout_backward(ct_backend *be, void *dx, const void *dy, const uint8_t *mask,
                                int64_t n, float p, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, n, k_dropout_backward<T>, (T *)dx, (const T *)dy, mask, n,
                          keep_scale_of(p)));
}

/* ---- parameter initialisation (formula in backend.h) ---- */

/* One thread per element, which uses words 0 and 1 of its own Philox block. The double
 * arithmetic is written with explicit round-to-nearest intrinsics: nvcc would otherwise fuse
 * a + (b - a) * u into an FMA, and the uniform draw would no longer be the CPU's bit for bit. */
__global__ void k_init_fill(float *x, int64_t first, int64_t n, int kind, double a, double b,
                            uint64_t key, uint64_t stream) {
    GRID_STRIDE(i, n) {
        if (kind == CT_DRAW_CONSTANT) {
            x[i] = __double2float_rn(a);
            continue;
        }
        uint4 w = ct_dev_philox_block(key, stream, (uint64_t)(first + i));
        if (kind == CT_DRAW_UNIFORM) {
            double u = __dmul_rn((double)w.x, 0x1p-32);
            x[i] = __double2float_rn(__dadd_rn(a, __dmul_rn(__dsub_rn(b, a), u)));
        } else {
            double u1 = __dmul_rn(__dadd_rn((double)w.x, 1.0), 0x1p-32);
            double u2 = __dmul_rn((double)w.y, 0x1p-32);
            /* cospi(2 u2) = cos(2 pi u2) without rounding 2 pi first */
            double z = __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cospi(__dmul_rn(2.0, u2)));
            x[i] = __double2float_rn(__dadd_rn(a, __dmul_rn(b, z)));
        }
    }
}

static void cu_init_fill(ct_backend *be, float *x, int64_t first, int64_t n, const ct_init_dist *d,
                         uint64_t seed, uint64_t stream) {
    CT_CUDA_REQUIRE(d->kind == CT_DRAW_CONSTANT || d->kind == CT_DRAW_UNIFORM ||
                        d->kind == CT_DRAW_NORMAL,
                    "init_fill: unknown draw kind");
    LAUNCH(be, n, k_init_fill, x, first, n, (int)d->kind, d->a, d->b, ct_cuda_rng_key(seed, CT_RNG_INIT),
           stream);
}

void ct_cuda_eltwise_install(ct_backend *be) {
    be->elt.fill = cu_fill;
    be->elt.scale = cu_scale;
    be->elt.axpy = cu_axpy;
    be->elt.add = cu_add;
    be->elt.copy_rows = cu_copy_rows;
    be->elt.cast = cu_cast;
    be->elt.round_to = cu_round_to;
    be->elt.bias_act_forward = cu_bias_act_forward;
    be->elt.bias_backward = cu_bias_backward;
    be->elt.act_forward = cu_act_forward;
    be->elt.act_backward = cu_act_backward;
    be->elt.dropout_forward = cu_dropout_forward;
    be->elt.dropout_backward = cu_dropout_backward;
    be->elt.normalize_u8 = ct_cuda_normalize_u8;
    be->elt.init_fill = cu_init_fill;
}

/* cuda_loss.cu: losses with their gradients, and the host-visible reductions.
 *
 * Semantics are core/cpu/cpu_loss.c's (PyTorch's): cross entropy with label smoothing, where a
 * label outside [0, classes) marks an ignored row (no loss, zero gradient, not counted in the
 * mean); MSE and BCE-with-logits average over every element. Probabilities exist only in fp32
 * registers: the kernel writes the gradient, never a softmax. Loss sums are deterministic
 * (cuda_reduce.cuh); the mean and the correct count are written to the caller's device `result`
 * by a one-thread kernel, so a loss never waits for the host (the step can be graph-captured). */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_reduce.cuh"

/* ---- softmax cross entropy ---- */

struct xent_valid_f {
    const int32_t *labels;
    int64_t classes;
    __device__ void operator()(int64_t r, double *out) const {
        int32_t l = labels[r];
        out[0] = (l >= 0 && l < classes) ? 1.0 : 0.0;
    }
};

/* First maximum wins, as the CPU's left-to-right scan: ties go to the smaller index. */
__device__ __forceinline__ void argmax_merge(float &v, int64_t &i, float v2, int64_t i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

/* One block per row of ld elements, the first `classes` of them predicted (the rest vocabulary
 * padding: gradient 0). stats[r] = {loss of the row, 1 if argmax == label}. valid_dev[0]: number
 * of rows with a valid label (the mean's divisor). dlogits may be logits: every read of the row
 * comes before the block-wide sums' barriers, and after them each thread writes only the
 * elements it reads. */
template <typename T>
__global__ void k_softmax_xent(T *dlogits, double *stats, const T *logits, const int32_t *labels,
                               const double *valid_dev, int64_t classes, int64_t ld, float smoothing,
                               float grad_scale) {
    __shared__ double shd[32];
    __shared__ float shv[32];
    __shared__ int64_t shi[32];
    int64_t r = blockIdx.x;
    const T *x = logits + r * ld;
    T *g = dlogits ? dlogits + r * ld : NULL;
    int32_t label = labels[r];
    if (g)
        for (int64_t j = classes + threadIdx.x; j < ld; j += blockDim.x) g[j] = ct_st<T>(0.0f);
    if (label < 0 || label >= classes) { /* ignored row: whole block takes this branch */
        if (g)
            for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) g[j] = ct_st<T>(0.0f);
        if (threadIdx.x == 0) stats[2 * r] = stats[2 * r + 1] = 0.0;
        return;
    }
    /* read before any thread can overwrite it in place */
    float x_label = ct_ld(x[label]);
    /* max and its first index */
    float best = -INFINITY;
    int64_t arg = INT64_MAX;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) argmax_merge(best, arg, ct_ld(x[j]), j);
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        int64_t i2 = __shfl_xor_sync(0xffffffffu, arg, o);
        argmax_merge(best, arg, v2, i2);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shv[warp] = best;
        shi[warp] = arg;
    }
    __syncthreads();
    best = -INFINITY;
    arg = INT64_MAX;
    for (int w = 0; w < nw; w++) argmax_merge(best, arg, shv[w], shi[w]);
    float mx = best;
    /* sum of exp(x - max) and of x, in double */
    double se = 0.0, sx = 0.0;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
        float xj = ct_ld(x[j]);
        se += (double)expf(xj - mx);
        sx += xj;
    }
    se = ct_block_sum(se, shd);
    sx = ct_block_sum(sx, shd);
    double lse = (double)mx + log(se);
    if (threadIdx.x == 0) {
        double nll = lse - (double)x_label;
        double smooth = lse - sx / (double)classes;
        stats[2 * r] = (1.0 - (double)smoothing) * nll + (double)smoothing * smooth;
        stats[2 * r + 1] = arg == (int64_t)label ? 1.0 : 0.0;
    }
    if (!g) return;
    double valid = valid_dev[0];
    float grad_mul = valid > 0.0 ? grad_scale / (float)valid : 0.0f;
    float off = smoothing / (float)classes;
    float flse = (float)lse;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
        float p = expf(ct_ld(x[j]) - flse);
        float gj = (p - off) * grad_mul;
        if (j == label) gj -= (1.0f - smoothing) * grad_mul;
        g[j] = ct_st<T>(gj);
    }
}

struct pair_f {
    const double *stats;
    __device__ void operator()(int64_t r, double *out) const {
        out[0] = stats[2 * r];
        out[1] = stats[2 * r + 1];
    }
};

/* result[0] = sums[1] / sums[0] (0 when nothing counted), result[1] = sums[2]; with div_n > 0
 * the divisor is div_n instead (element-wise losses: sums = {total}, no correct count). */
__global__ void k_loss_result(float *result, const double *sums, double div_n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (div_n > 0.0) {
        result[0] = (float)(sums[0] / div_n);
        result[1] = 0.0f;
    } else {
        result[0] = sums[0] > 0.0 ? (float)(sums[1] / sums[0]) : 0.0f;
        result[1] = (float)sums[2];
    }
}

static void write_result(ct_backend *be, float *result, const double *sums, double div_n) {
    if (!result) return;
    k_loss_result<<<1, 32, 0, ct_cuda_stream(be)>>>(result, sums, div_n);
    CT_CUDA_LAUNCH_CHECK();
}

static void zero_result(ct_backend *be, float *result) {
    if (result)
        CT_CUDA_CHECK(cudaMemsetAsync(result, 0, 2 * sizeof(float), ct_cuda_stream(be)));
}

static void cu_softmax_xent(ct_backend *be, void *dlogits, float *result, const void *logits,
                            const int32_t *labels, int64_t rows, int64_t classes, int64_t ld,
                            float label_smoothing, float grad_scale, ct_dtype dt) {
    CT_CUDA_REQUIRE(rows >= 0 && classes >= 1 && ld >= classes && rows <= INT32_MAX, "softmax_xent: bad shape");
    if (rows == 0) {
        zero_result(be, result);
        return;
    }
    /* dev: [valid, loss_sum, correct_sum] */
    double *dev = (double *)CT_CUDA_SCRATCH(be, 4 * sizeof(double));
    double *stats = (double *)CT_CUDA_SCRATCH(be, (size_t)rows * 2 * sizeof(double));
    xent_valid_f fv = {labels, classes};
    ct_cuda_sum_1d<1>(be, rows, fv, dev);
    int threads = classes >= 1024 ? 256 : classes > 64 ? 128 : 32;
    CT_DT_DISPATCH(dt, T, {
        k_softmax_xent<T><<<(unsigned)rows, threads, 0, ct_cuda_stream(be)>>>(
            (T *)dlogits, stats, (const T *)logits, labels, dev, classes, ld, label_smoothing,
            grad_scale);
        CT_CUDA_LAUNCH_CHECK();
    });
    if (result) {
        pair_f fp = {stats};
        ct_cuda_sum_1d<2>(be, rows, fp, dev + 1);
        write_result(be, result, dev, 0.0);
    }
    ct_cuda_scratch_free(be, stats);
    ct_cuda_scratch_free(be, dev);
}

/* ---- element-wise losses: f writes the gradient and returns the loss term ---- */

template <typename T> struct mse_f {
    T *grad;
    const T *x;
    const float *t;
    float grad_mul;
    __device__ void operator()(int64_t i, double *out) const {
        float d = ct_ld(x[i]) - t[i];
        out[0] = (double)d * d;
        if (grad) grad[i] = ct_st<T>(2.0f * d * grad_mul);
    }
};

template <typename T> struct bce_f {
    T *grad;
    const T *x;
    const float *t;
    float grad_mul;
    __device__ void operator()(int64_t i, double *out) const {
        float xi = ct_ld(x[i]), ti = t[i];
        /* max(x, 0) - x t + log(1 + e^-|x|): no overflow for large |x| */
        out[0] = (double)(xi > 0.0f ? xi : 0.0f) - (double)xi * ti + log1p(exp(-fabs((double)xi)));
        if (grad) grad[i] = ct_st<T>((1.0f / (1.0f + expf(-xi)) - ti) * grad_mul);
    }
};

template <class F>
static void elementwise_loss(ct_backend *be, F f, float *result, int64_t n) {
    if (n <= 0) {
        zero_result(be, result);
        return;
    }
    double *dev = (double *)CT_CUDA_SCRATCH(be, sizeof(double));
    ct_cuda_sum_1d<1>(be, n, f, dev);
    write_result(be, result, dev, (double)n);
    ct_cuda_scratch_free(be, dev);
}

static void cu_mse_loss(ct_backend *be, void *dpred, float *result, const void *pred,
                        const float *target, int64_t n_rows, int64_t n_cols, float grad_scale,
                        ct_dtype dt) {
    int64_t n = n_rows * n_cols;
    float mul = n > 0 ? grad_scale / (float)n : 0.0f;
    CT_DT_DISPATCH(dt, T, {
        mse_f<T> f = {(T *)dpred, (const T *)pred, target, mul};
        elementwise_loss(be, f, result, n);
    });
}

static void cu_bce_logits_loss(ct_backend *be, void *dlogits, float *result, const void *logits,
                               const float *target, int64_t n_rows, int64_t n_cols,
                               float grad_scale, ct_dtype dt) {
    int64_t n = n_rows * n_cols;
    float mul = n > 0 ? grad_scale / (float)n : 0.0f;
    CT_DT_DISPATCH(dt, T, {
        bce_f<T> f = {(T *)dlogits, (const T *)logits, target, mul};
        elementwise_loss(be, f, result, n);
    });
}

/* ---- reductions to the host ---- */

struct sumsq_f {
    const float *x;
    __device__ void operator()(int64_t i, double *out) const { out[0] = (double)x[i] * x[i]; }
};

struct nonfinite_f {
    const float *x;
    __device__ void operator()(int64_t i, double *out) const { out[0] = isfinite(x[i]) ? 0.0 : 1.0; }
};

static double cu_sum_squares(ct_backend *be, const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    double *dev = (double *)CT_CUDA_SCRATCH(be, sizeof(double));
    sumsq_f f = {x};
    ct_cuda_sum_1d<1>(be, n, f, dev);
    double total;
    ct_cuda_read_result(be, &total, dev, sizeof total);
    ct_cuda_scratch_free(be, dev);
    return total;
}

static bool cu_all_finite(ct_backend *be, const float *x, int64_t n) {
    if (n <= 0) return true;
    double *dev = (double *)CT_CUDA_SCRATCH(be, sizeof(double));
    nonfinite_f f = {x};
    ct_cuda_sum_1d<1>(be, n, f, dev);
    double bad;
    ct_cuda_read_result(be, &bad, dev, sizeof bad);
    ct_cuda_scratch_free(be, dev);
    return bad == 0.0;
}

void ct_cuda_loss_install(ct_backend *be) {
    be->loss.softmax_xent = cu_softmax_xent;
    be->loss.mse_loss = cu_mse_loss;
    be->loss.bce_logits_loss = cu_bce_logits_loss;
    be->optim.sum_squares = cu_sum_squares;
    be->optim.all_finite = cu_all_finite;
}

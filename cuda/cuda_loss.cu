/* cuda_loss.cu: losses with their gradients, and the host-visible reductions.
 *
 * Semantics are core/cpu/cpu_loss.c's (PyTorch's): cross entropy with label smoothing, where a
 * label outside [0, classes) marks an ignored row (no loss, zero gradient, not counted in the
 * mean); MSE and BCE-with-logits average over every element. Probabilities exist only in fp32
 * registers: the kernel writes the gradient, never a softmax. Loss sums are deterministic
 * (cuda_reduce.cuh) and copied to the host only when the caller asks for them. */
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

/* One block per row. stats[r] = {loss of the row, 1 if argmax == label}. valid_dev[0]: number of
 * rows with a valid label (the mean's divisor). */
__global__ void k_softmax_xent(float *dlogits, double *stats, const float *logits,
                               const int32_t *labels, const double *valid_dev, int64_t classes,
                               float smoothing, float grad_scale) {
    __shared__ double shd[32];
    __shared__ float shv[32];
    __shared__ int64_t shi[32];
    int64_t r = blockIdx.x;
    const float *x = logits + r * classes;
    float *g = dlogits ? dlogits + r * classes : NULL;
    int32_t label = labels[r];
    if (label < 0 || label >= classes) { /* ignored row: whole block takes this branch */
        if (g)
            for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) g[j] = 0.0f;
        if (threadIdx.x == 0) stats[2 * r] = stats[2 * r + 1] = 0.0;
        return;
    }
    /* max and its first index */
    float best = -INFINITY;
    int64_t arg = INT64_MAX;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) argmax_merge(best, arg, x[j], j);
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
        se += (double)expf(x[j] - mx);
        sx += x[j];
    }
    se = ct_block_sum(se, shd);
    sx = ct_block_sum(sx, shd);
    double lse = (double)mx + log(se);
    if (threadIdx.x == 0) {
        double nll = lse - (double)x[label];
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
        float p = expf(x[j] - flse);
        float gj = (p - off) * grad_mul;
        if (j == label) gj -= (1.0f - smoothing) * grad_mul;
        g[j] = gj;
    }
}

struct pair_f {
    const double *stats;
    __device__ void operator()(int64_t r, double *out) const {
        out[0] = stats[2 * r];
        out[1] = stats[2 * r + 1];
    }
};

static void cu_softmax_xent(ct_backend *be, float *dlogits, float *loss_host, int64_t *correct_host,
                            const float *logits, const int32_t *labels, int64_t rows,
                            int64_t classes, float label_smoothing, float grad_scale) {
    CT_CUDA_REQUIRE(rows >= 0 && classes >= 1 && rows <= INT32_MAX, "softmax_xent: bad shape");
    if (rows == 0) {
        if (loss_host) *loss_host = 0.0f;
        if (correct_host) *correct_host = 0;
        return;
    }
    /* dev: [valid, loss_sum, correct_sum] */
    double *dev = (double *)CT_CUDA_SCRATCH(be, 4 * sizeof(double));
    double *stats = (double *)CT_CUDA_SCRATCH(be, (size_t)rows * 2 * sizeof(double));
    xent_valid_f fv = {labels, classes};
    ct_cuda_sum_1d<1>(be, rows, fv, dev);
    int threads = classes >= 1024 ? 256 : classes > 64 ? 128 : 32;
    k_softmax_xent<<<(unsigned)rows, threads, 0, ct_cuda_stream(be)>>>(
        dlogits, stats, logits, labels, dev, classes, label_smoothing, grad_scale);
    CT_CUDA_LAUNCH_CHECK();
    if (loss_host || correct_host) {
        pair_f fp = {stats};
        ct_cuda_sum_1d<2>(be, rows, fp, dev + 1);
        double h[3];
        ct_cuda_read_result(be, h, dev, sizeof h);
        if (loss_host) *loss_host = h[0] > 0.0 ? (float)(h[1] / h[0]) : 0.0f;
        if (correct_host) *correct_host = (int64_t)h[2];
    }
    ct_cuda_scratch_free(be, stats);
    ct_cuda_scratch_free(be, dev);
}

/* ---- element-wise losses: f writes the gradient and returns the loss term ---- */

struct mse_f {
    float *grad;
    const float *x, *t;
    float grad_mul;
    __device__ void operator()(int64_t i, double *out) const {
        float d = x[i] - t[i];
        out[0] = (double)d * d;
        if (grad) grad[i] = 2.0f * d * grad_mul;
    }
};

struct bce_f {
    float *grad;
    const float *x, *t;
    float grad_mul;
    __device__ void operator()(int64_t i, double *out) const {
        float xi = x[i], ti = t[i];
        /* max(x, 0) - x t + log(1 + e^-|x|): no overflow for large |x| */
        out[0] = (double)(xi > 0.0f ? xi : 0.0f) - (double)xi * ti + log1p(exp(-fabs((double)xi)));
        if (grad) grad[i] = (1.0f / (1.0f + expf(-xi)) - ti) * grad_mul;
    }
};

template <class F>
static void elementwise_loss(ct_backend *be, F f, float *loss_host, int64_t n) {
    double *dev = (double *)CT_CUDA_SCRATCH(be, sizeof(double));
    ct_cuda_sum_1d<1>(be, n, f, dev);
    if (loss_host) {
        double total;
        ct_cuda_read_result(be, &total, dev, sizeof total);
        *loss_host = n > 0 ? (float)(total / (double)n) : 0.0f;
    }
    ct_cuda_scratch_free(be, dev);
}

static void cu_mse_loss(ct_backend *be, float *dpred, float *loss_host, const float *pred,
                        const float *target, int64_t n_rows, int64_t n_cols, float grad_scale) {
    int64_t n = n_rows * n_cols;
    mse_f f = {dpred, pred, target, n > 0 ? grad_scale / (float)n : 0.0f};
    elementwise_loss(be, f, loss_host, n);
}

static void cu_bce_logits_loss(ct_backend *be, float *dlogits, float *loss_host, const float *logits,
                               const float *target, int64_t n_rows, int64_t n_cols,
                               float grad_scale) {
    int64_t n = n_rows * n_cols;
    bce_f f = {dlogits, logits, target, n > 0 ? grad_scale / (float)n : 0.0f};
    elementwise_loss(be, f, loss_host, n);
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
    be->softmax_xent = cu_softmax_xent;
    be->mse_loss = cu_mse_loss;
    be->bce_logits_loss = cu_bce_logits_loss;
    be->sum_squares = cu_sum_squares;
    be->all_finite = cu_all_finite;
}

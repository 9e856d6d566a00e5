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

/* Online softmax statistics of some logits of a row: m their maximum, s = sum of exp(x - m) in
 * double (rescaled whenever m grows), arg the first index of the maximum. A thread folds its
 * elements in index order; states merge symmetrically (merge(a, b) == merge(b, a) bit for bit),
 * so a butterfly leaves every lane with the same state. */
struct xent_state {
    double m, s;
    int64_t arg;
};

__device__ __forceinline__ xent_state xent_empty() { return {-(double)INFINITY, 0.0, INT64_MAX}; }

/* One exp per element, whichever way the maximum goes (no divergent second exp when some lanes
 * find a new maximum): e = exp(-|x - m|). x == m (also -inf == -inf, while no finite logit was
 * seen) counts exp(0) = 1 without computing exp(-inf - -inf) = NaN; a later, larger maximum
 * rescales it to 0. A NaN logit makes s NaN, as on the CPU. Ties keep the smaller index (the CPU's
 * left-to-right scan); a thread's first element is its argmax candidate even when it is -inf. */
__device__ __forceinline__ void xent_fold(xent_state &st, float xf, int64_t j) {
    double x = (double)xf;
    bool grows = x > st.m;
    double e = x == st.m ? 1.0 : exp(grows ? st.m - x : x - st.m);
    st.s = grows ? st.s * e + 1.0 : st.s + e;
    st.m = grows ? x : st.m;
    st.arg = grows || st.arg == INT64_MAX ? j : st.arg;
}

/* s of a state expressed against the maximum m >= st.m */
__device__ __forceinline__ double xent_rescaled(const xent_state &st, double m) {
    return st.m == m ? st.s : st.s * exp(st.m - m);
}

__device__ __forceinline__ xent_state xent_merge(const xent_state &a, const xent_state &b) {
    xent_state r;
    r.m = a.m > b.m ? a.m : b.m;
    r.s = xent_rescaled(a, r.m) + xent_rescaled(b, r.m);
    r.arg = a.m > b.m ? a.arg : b.m > a.m ? b.arg : (a.arg < b.arg ? a.arg : b.arg);
    return r;
}

__device__ __forceinline__ xent_state xent_warp_merge(xent_state st) {
    for (int o = 16; o > 0; o >>= 1) {
        xent_state other;
        other.m = __shfl_xor_sync(0xffffffffu, st.m, o);
        other.s = __shfl_xor_sync(0xffffffffu, st.s, o);
        other.arg = __shfl_xor_sync(0xffffffffu, st.arg, o);
        st = xent_merge(st, other);
    }
    return st;
}

/* A row is dealt to the block's threads in chunks of 16 bytes (XENT_N elements): chunk c is
 * thread c % blockDim.x's, and a thread visits its chunks in order, XENT_UNROLL of them per
 * iteration (their loads in flight together). So which thread folds which element, and in which
 * order, depends only on (classes, blockDim.x), never on the row's address: a 16-byte aligned row
 * is read with one vector load per chunk, any other row element by element, with the same
 * results. */
template <typename T> struct __align__(16) xent_chunk {
    static constexpr int N = 16 / (int)sizeof(T);
    T e[N];
};
#define XENT_UNROLL 2
#define XENT_THREADS_MAX 256

/* Elements [c N, c N + N) of the row, those below `classes`, widened to fp32 (the rest 0). */
template <typename T>
__device__ __forceinline__ void xent_load(float *v, const T *x, int64_t c, int64_t classes,
                                          bool aligned) {
    constexpr int N = xent_chunk<T>::N;
    int64_t j0 = c * N;
    if (aligned && j0 + N <= classes) {
        xent_chunk<T> ch = *reinterpret_cast<const xent_chunk<T> *>(x + j0);
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = ct_ld(ch.e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = j0 + i < classes ? ct_ld(x[j0 + i]) : 0.0f;
    }
}

template <typename T>
__device__ __forceinline__ void xent_store(T *g, const float *v, int64_t c, int64_t classes,
                                           bool aligned) {
    constexpr int N = xent_chunk<T>::N;
    int64_t j0 = c * N;
    if (aligned && j0 + N <= classes) {
        xent_chunk<T> ch;
#pragma unroll
        for (int i = 0; i < N; i++) ch.e[i] = ct_st<T>(v[i]);
        *reinterpret_cast<xent_chunk<T> *>(g + j0) = ch;
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            if (j0 + i < classes) g[j0 + i] = ct_st<T>(v[i]);
    }
}

static __device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* One block per row of ld elements, the first `classes` of them predicted (the rest vocabulary
 * padding: gradient 0). stats[r] = {loss of the row, 1 if argmax == label}. valid_dev[0]: number
 * of rows with a valid label (the mean's divisor).
 *
 * Two passes over the row, with core/cpu/cpu_loss.c's arithmetic: pass 1 folds the maximum, its
 * index, the sum of exp(x - max) (exp in double) and the sum of x; pass 2 writes
 * p = (float)exp((double)x - lse) and the gradient from it, each float operation rounded on its
 * own as on the CPU (no FMA contraction). dlogits may be logits: every read of pass 1 comes before
 * the block-wide merge's barriers, and in pass 2 each thread writes only the chunks it reads. */
template <typename T>
__global__ void __launch_bounds__(XENT_THREADS_MAX)
k_softmax_xent(T *dlogits, double *stats, const T *logits, const int32_t *labels,
               const double *valid_dev, int64_t classes, int64_t ld, float smoothing,
               float grad_scale) {
    constexpr int N = xent_chunk<T>::N;
    __shared__ double shs[32], shm[32], shx[32];
    __shared__ int64_t sha[32];
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
    int64_t n_chunks = (classes + N - 1) / N;
    int64_t stride = blockDim.x;
    bool x_aligned = aligned16(x);

    /* pass 1: max, argmax, sum of exp(x - max), sum of x */
    xent_state st = xent_empty();
    double sx = 0.0;
    for (int64_t c0 = threadIdx.x; c0 < n_chunks; c0 += XENT_UNROLL * stride) {
        float v[XENT_UNROLL][N];
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++)
            if (c0 + u * stride < n_chunks) xent_load(v[u], x, c0 + u * stride, classes, x_aligned);
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++) {
            int64_t j0 = (c0 + u * stride) * N;
            if (c0 + u * stride >= n_chunks) break;
#pragma unroll
            for (int i = 0; i < N; i++)
                if (j0 + i < classes) {
                    xent_fold(st, v[u][i], j0 + i);
                    sx += v[u][i];
                }
        }
    }
    st = xent_warp_merge(st);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        shm[warp] = st.m;
        shs[warp] = st.s;
        sha[warp] = st.arg;
    }
    __syncthreads();
    /* every thread folds the warps' states in warp order: the same bits everywhere */
    st = xent_empty();
    for (int w = 0; w < nw; w++) st = xent_merge(st, xent_state{shm[w], shs[w], sha[w]});
    sx = ct_block_sum(sx, shx);
    double lse = st.m + log(st.s);
    if (threadIdx.x == 0) {
        double nll = lse - (double)x_label;
        double smooth = lse - sx / (double)classes;
        stats[2 * r] = __dadd_rn(__dmul_rn(1.0 - (double)smoothing, nll), __dmul_rn((double)smoothing, smooth));
        stats[2 * r + 1] = st.arg == (int64_t)label ? 1.0 : 0.0;
    }
    if (!g) return;

    /* pass 2: the gradient (p - smoothing / classes) grad_mul, less (1 - smoothing) grad_mul at
     * the label */
    double valid = valid_dev[0];
    float grad_mul = valid > 0.0 ? grad_scale / (float)valid : 0.0f;
    float off = smoothing / (float)classes;
    float label_term = __fmul_rn(1.0f - smoothing, grad_mul);
    bool g_aligned = aligned16(g);
    for (int64_t c0 = threadIdx.x; c0 < n_chunks; c0 += XENT_UNROLL * stride) {
        float v[XENT_UNROLL][N];
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++)
            if (c0 + u * stride < n_chunks) xent_load(v[u], x, c0 + u * stride, classes, x_aligned);
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++) {
            int64_t c = c0 + u * stride, j0 = c * N;
            if (c >= n_chunks) break;
#pragma unroll
            for (int i = 0; i < N; i++) {
                float p = (float)exp((double)v[u][i] - lse);
                float gj = __fmul_rn(p - off, grad_mul);
                v[u][i] = j0 + i == (int64_t)label ? gj - label_term : gj;
            }
            xent_store(g, v[u], c, classes, g_aligned);
        }
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

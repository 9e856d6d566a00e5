/* cuda_rmsnorm.cu: RMSNorm over the last dimension (backend.h, rmsnorm_forward/backward), the
 * formulas of core/cpu/cpu_rmsnorm.c: one block per row, its sums in double over a fixed block
 * tree; the weight gradient through the deterministic per-column reduction (cuda_reduce.cuh).
 * Products that feed a subtraction are __fmul_rn, as the CPU rounds every product (no FMA). */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_reduce.cuh"

#define RMS_THREADS 128

template <typename T>
__global__ void k_rms_fwd(T *y, float *save_rstd, const T *x, const T *gamma, int64_t d, float eps) {
    __shared__ double sh[32];
    int64_t r = blockIdx.x;
    const T *xr = x + r * d;
    T *yr = y + r * d;
    double sq = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        double v = ct_ld(xr[j]);
        sq += v * v;
    }
    sq = ct_block_sum(sq, sh);
    float rstd = (float)(1.0 / sqrt(sq / (double)d + (double)eps));
    if (threadIdx.x == 0 && save_rstd) save_rstd[r] = rstd;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        yr[j] = ct_st<T>(__fmul_rn(__fmul_rn(ct_ld(xr[j]), rstd), gamma ? ct_ld(gamma[j]) : 1.0f));
}

template <typename T>
__global__ void k_rms_bwd_dx(T *dx, const T *dy, const T *x, const T *gamma, const float *rstd, int64_t d) {
    __shared__ double sh[32];
    int64_t r = blockIdx.x;
    const T *xr = x + r * d, *dyr = dy + r * d;
    T *dxr = dx + r * d;
    float rs = rstd[r];
    double sgx = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        sgx += (double)__fmul_rn(ct_ld(dyr[j]), gamma ? ct_ld(gamma[j]) : 1.0f) * (double)ct_ld(xr[j]);
    sgx = ct_block_sum(sgx, sh);
    float m = (float)(sgx / (double)d * (double)rs * (double)rs);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float g = __fmul_rn(ct_ld(dyr[j]), gamma ? ct_ld(gamma[j]) : 1.0f);
        dxr[j] = ct_st<T>(__fmul_rn(rs, g - __fmul_rn(ct_ld(xr[j]), m)));
    }
}

template <typename T> struct rms_gamma_f {
    const T *x, *dy;
    const float *rstd;
    int64_t d;
    __device__ void operator()(int64_t r, int64_t j, int64_t i, double *out) const {
        int64_t at = r * d + j;
        out[0] = (double)ct_ld(dy[at]) * (double)__fmul_rn(ct_ld(x[at]), rstd[r]);
    }
};
struct rms_gamma_g {
    float *dgamma;
    __device__ void operator()(int64_t j, const double *s) const { dgamma[j] += (float)s[0]; }
};

static void check_rows(int64_t rows) { CT_CUDA_REQUIRE(rows <= INT32_MAX, "rmsnorm: more than 2^31 rows"); }

static void cu_rmsnorm_forward(ct_backend *be, void *y, float *save_rstd, const void *x, const void *gamma,
                               int64_t rows, int64_t d, float eps, ct_dtype dt) {
    if (d <= 0 || rows <= 0) return;
    check_rows(rows);
    CT_DT_DISPATCH(dt, T, {
        k_rms_fwd<T><<<(unsigned)rows, RMS_THREADS, 0, ct_cuda_stream(be)>>>((T *)y, save_rstd, (const T *)x,
                                                                             (const T *)gamma, d, eps);
        CT_CUDA_LAUNCH_CHECK();
    });
}

static void cu_rmsnorm_backward(ct_backend *be, void *dx, float *dgamma, const void *dy, const void *x,
                                const void *gamma, const float *save_rstd, int64_t rows, int64_t d, ct_dtype dt) {
    if (d <= 0 || rows <= 0) return;
    check_rows(rows);
    CT_DT_DISPATCH(dt, T, {
        if (dx) {
            k_rms_bwd_dx<T><<<(unsigned)rows, RMS_THREADS, 0, ct_cuda_stream(be)>>>(
                (T *)dx, (const T *)dy, (const T *)x, (const T *)gamma, save_rstd, d);
            CT_CUDA_LAUNCH_CHECK();
        }
        if (dgamma) {
            rms_gamma_f<T> f = {(const T *)x, (const T *)dy, save_rstd, d};
            rms_gamma_g g = {dgamma};
            ct_cuda_reduce_rci<1>(be, rows, d, 1, f, g);
        }
    });
}

void ct_cuda_rmsnorm_install(ct_backend *be) {
    be->norm.rmsnorm_forward = cu_rmsnorm_forward;
    be->norm.rmsnorm_backward = cu_rmsnorm_backward;
}

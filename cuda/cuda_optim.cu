/* cuda_optim.cu: fused optimizer updates on flat fp32 master buffers.
 *
 * Formulas are core/cpu/cpu_optim.c's, operation for operation (DeepSpeed FusedAdam, torch SGD,
 * FusedLamb's direction), so a step on the GPU matches a step on the CPU to float rounding.
 * grad_scale folds unscaling, predivision and the clip coefficient into the one pass, which also
 * writes the 16-bit copy of the updated parameters when asked (args.copy). */

#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_reduce.cuh"

#include <math.h>

/* copy[i] = p rounded to the copy's dtype (nothing without a copy). */
__device__ __forceinline__ void store_copy(void *copy, ct_dtype dt, int64_t i, float p) {
    if (!copy) return;
    if (dt == CT_F16) ((__half *)copy)[i] = __float2half_rn(p);
    else ((__nv_bfloat16 *)copy)[i] = __float2bfloat16_rn(p);
}

__global__ void k_adam(float *p, const float *grad, float *m, float *v, int64_t n, ct_adam_args a,
                       float inv_bc1, float inv_sqrt_bc2) {
    float l2 = a.decoupled ? 0.0f : a.weight_decay, wd = a.decoupled ? a.weight_decay : 0.0f;
    GRID_STRIDE(i, n) {
        float pi = p[i];
        float gi = grad[i] * a.grad_scale + l2 * pi;
        float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
        float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) * inv_sqrt_bc2 + a.eps;
        float update = (mi * inv_bc1) / denom + wd * pi;
        float np = pi - a.lr * update;
        p[i] = np;
        store_copy(a.copy, a.copy_dt, i, np);
    }
}

static void cu_adam_step(ct_backend *be, float *param, const float *grad, float *m, float *v,
                         int64_t n, const ct_adam_args *a) {
    if (n <= 0) return;
    /* the same host-side reciprocals as the CPU backend */
    float inv_bc1 = 1.0f / a->bias_c1, inv_sqrt_bc2 = 1.0f / sqrtf(a->bias_c2);
    k_adam<<<ct_cuda_grid(be, n, CT_CUDA_THREADS), CT_CUDA_THREADS, 0, ct_cuda_stream(be)>>>(
        param, grad, m, v, n, *a, inv_bc1, inv_sqrt_bc2);
    CT_CUDA_LAUNCH_CHECK();
}

__global__ void k_sgd(float *p, const float *grad, float *buf, int64_t n, ct_sgd_args a) {
    bool use_mom = a.momentum != 0.0f && buf;
    GRID_STRIDE(i, n) {
        float pi = p[i];
        float d = grad[i] * a.grad_scale + a.weight_decay * pi;
        if (use_mom) {
            float b = a.first_step ? d : a.momentum * buf[i] + (1.0f - a.dampening) * d;
            buf[i] = b;
            d = a.nesterov ? d + a.momentum * b : b;
        }
        float np = pi - a.lr * d;
        p[i] = np;
        store_copy(a.copy, a.copy_dt, i, np);
    }
}

static void cu_sgd_step(ct_backend *be, float *param, const float *grad, float *mom, int64_t n,
                        const ct_sgd_args *a) {
    if (n <= 0) return;
    k_sgd<<<ct_cuda_grid(be, n, CT_CUDA_THREADS), CT_CUDA_THREADS, 0, ct_cuda_stream(be)>>>(
        param, grad, mom, n, *a);
    CT_CUDA_LAUNCH_CHECK();
}

/* Lamb direction for element i (updates m, v, writes upd); returns {p^2, upd^2}. */
struct lamb_f {
    float *upd, *m, *v;
    const float *param, *grad;
    ct_lamb_args a;
    float inv_bc1, inv_bc2;
    __device__ void operator()(int64_t i, double *out) const {
        float gi = grad[i] * a.grad_scale, p = param[i];
        float mi = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
        float vi = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float v_hat = vi * inv_bc2;
        float denom = a.eps_inside_sqrt ? sqrtf(v_hat + a.eps) : sqrtf(v_hat) + a.eps;
        float u = mi * inv_bc1 / denom + a.weight_decay * p;
        upd[i] = u;
        out[0] = (double)p * p;
        out[1] = (double)u * u;
    }
};

static void cu_lamb_direction(ct_backend *be, float *upd, const float *param, const float *grad,
                              float *m, float *v, int64_t n, const ct_lamb_args *a,
                              double *w_norm_host, double *u_norm_host) {
    double *dev = (double *)CT_CUDA_SCRATCH(be, 2 * sizeof(double));
    lamb_f f = {upd, m, v, param, grad, *a, 1.0f / a->bias_c1, 1.0f / a->bias_c2};
    ct_cuda_sum_1d<2>(be, n > 0 ? n : 0, f, dev);
    double h[2];
    ct_cuda_read_result(be, h, dev, sizeof h);
    ct_cuda_scratch_free(be, dev);
    if (w_norm_host) *w_norm_host = sqrt(h[0]);
    if (u_norm_host) *u_norm_host = sqrt(h[1]);
}

void ct_cuda_optim_install(ct_backend *be) {
    be->optim.adam_step = cu_adam_step;
    be->optim.sgd_step = cu_sgd_step;
    be->optim.lamb_direction = cu_lamb_direction;
}

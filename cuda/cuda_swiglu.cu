/* cuda_swiglu.cu: SwiGLU over a fused gate-and-up projection (backend.h, swiglu_forward and
 * swiglu_backward), core/cpu/cpu_swiglu.c's formulas element by element; products that feed an
 * addition are __fmul_rn, as the CPU rounds each (no FMA contraction). */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"

template <typename T> __global__ void k_swiglu_fwd(T *y, const T *x, int64_t n, int64_t f) {
    GRID_STRIDE(i, n) {
        int64_t r = i / f, j = i - r * f;
        float g = ct_ld(x[r * 2 * f + j]), u = ct_ld(x[r * 2 * f + f + j]);
        y[i] = ct_st<T>(__fmul_rn(g / (1.0f + expf(-g)), u));
    }
}

template <typename T> __global__ void k_swiglu_bwd(T *dx, const T *dy, const T *x, int64_t n, int64_t f) {
    GRID_STRIDE(i, n) {
        int64_t r = i / f, j = i - r * f;
        float g = ct_ld(x[r * 2 * f + j]), u = ct_ld(x[r * 2 * f + f + j]), d = ct_ld(dy[i]);
        float s = 1.0f / (1.0f + expf(-g));
        dx[r * 2 * f + f + j] = ct_st<T>(__fmul_rn(d, __fmul_rn(g, s)));
        float ds = __fmul_rn(s, 1.0f + __fmul_rn(g, 1.0f - s));
        dx[r * 2 * f + j] = ct_st<T>(__fmul_rn(__fmul_rn(d, u), ds));
    }
}

static void cu_swiglu_forward(ct_backend *be, void *y, const void *x, int64_t rows, int64_t f, ct_dtype dt) {
    if (rows <= 0 || f <= 0) return;
    CT_DT_DISPATCH(dt, T, LAUNCH(be, rows * f, k_swiglu_fwd<T>, (T *)y, (const T *)x, rows * f, f));
}

static void cu_swiglu_backward(ct_backend *be, void *dx, const void *dy, const void *x, int64_t rows, int64_t f,
                               ct_dtype dt) {
    if (rows <= 0 || f <= 0) return;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, rows * f, k_swiglu_bwd<T>, (T *)dx, (const T *)dy, (const T *)x, rows * f, f));
}

void ct_cuda_swiglu_install(ct_backend *be) {
    be->elt.swiglu_forward = cu_swiglu_forward;
    be->elt.swiglu_backward = cu_swiglu_backward;
}

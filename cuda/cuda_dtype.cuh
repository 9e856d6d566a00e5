/* cuda_dtype.cuh: typed storage for activation ops (core/backend/backend.h, "dtypes of op
 * arguments").
 *
 * A kernel is one template over its storage type T (float, __half or __nv_bfloat16); it loads
 * with ct_ld (exact widening to fp32), computes in fp32 and stores with ct_st<T> (one rounding,
 * to nearest even). The launch site picks T from the run-time ct_dtype with CT_DT_DISPATCH. */
#ifndef CT_CUDA_DTYPE_CUH
#define CT_CUDA_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_internal.h"

__device__ __forceinline__ float ct_ld(float v) { return v; }
__device__ __forceinline__ float ct_ld(__half v) { return __half2float(v); }
__device__ __forceinline__ float ct_ld(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T ct_st(float v);
template <> __device__ __forceinline__ float ct_st<float>(float v) { return v; }
template <> __device__ __forceinline__ __half ct_st<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 ct_st<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

/* Run the statement(s) with T bound to the storage type of dt (f32, f16 or bf16 only). */
#define CT_DT_DISPATCH(dt, T, ...)                                                               \
    do {                                                                                         \
        switch (dt) {                                                                            \
        case CT_F32: {                                                                           \
            typedef float T;                                                                     \
            __VA_ARGS__;                                                                         \
        } break;                                                                                 \
        case CT_F16: {                                                                           \
            typedef __half T;                                                                    \
            __VA_ARGS__;                                                                         \
        } break;                                                                                 \
        case CT_BF16: {                                                                          \
            typedef __nv_bfloat16 T;                                                             \
            __VA_ARGS__;                                                                         \
        } break;                                                                                 \
        default: CT_CUDA_REQUIRE(false, "op dtype must be f32, f16 or bf16");                   \
        }                                                                                        \
    } while (0)

#endif

/* cuda_rope.cu: rotary position embeddings with grouped-query heads (backend.h, rope_gqa_forward
 * and rope_gqa_backward), core/cpu/cpu_rope.c's arithmetic: one block per token (b, t), whose
 * threads first compute the cosines and sines of t's angles into shared memory (the fp32
 * frequency steps of transformers, cos and sin in double of the fp32 angle, rounded once), then
 * write the token's outputs, each element by one thread. Products that feed an addition are
 * __fmul_rn, as the CPU rounds each product; a kv head's gradient is summed over its query heads
 * in head order before it is rotated back, as on the CPU. No atomics. */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"

#define ROPE_THREADS 128
#define ROPE_MAX_PAIRS 1024

/* cs[0, half) cosines, cs[half, 2 half) sines of position pos's angles (nothing when !rotate). */
__device__ void rope_angles(float *cs, int64_t half, int64_t D, double theta, double factor, int64_t pos) {
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
        float e = __fdiv_rn((float)(2 * i), (float)D);
        float f = __fdiv_rn(1.0f, (float)pow((double)(float)theta, (double)e));
        if (factor != 1.0) f = __fdiv_rn(f, (float)factor);
        float a = __fmul_rn((float)pos, f);
        cs[i] = (float)cos((double)a);
        cs[half + i] = (float)sin((double)a);
    }
    __syncthreads();
}

/* Element j of a head turned (sign 1) or turned back (-1) from its pair (a: element i, b: i + D/2). */
__device__ __forceinline__ float rope_turn(float a, float b, float c, float s, bool second, bool back) {
    if (!back) return second ? __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)) : __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    return second ? __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s)) : __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}

template <typename T>
__global__ void k_rope_fwd(T *y, const T *x, int64_t T_, int64_t H, int64_t KV, int64_t D, double theta,
                           double factor, int64_t pos0) {
    extern __shared__ float cs[];
    int64_t row = blockIdx.x, t = row % T_, half = D / 2, rep = H / KV;
    bool rotate = theta != 0.0;
    if (rotate) rope_angles(cs, half, D, theta, factor, pos0 + t);
    const T *xr = x + row * (H + 2 * KV) * D;
    T *yr = y + row * 3 * H * D;
    for (int64_t e = threadIdx.x; e < 3 * H * D; e += blockDim.x) {
        int64_t which = e / (H * D), h = (e / D) % H, j = e % D;
        int64_t src = which == 0 ? h : which == 1 ? H + h / rep : H + KV + h / rep;
        const T *xh = xr + src * D;
        if (which == 2 || !rotate || j >= 2 * half) {
            yr[e] = xh[j];
            continue;
        }
        bool second = j >= half;
        int64_t i = second ? j - half : j;
        yr[e] = ct_st<T>(rope_turn(ct_ld(xh[i]), ct_ld(xh[half + i]), cs[i], cs[half + i], second, false));
    }
}

/* The gradient of element j of source head hh (< H + 2 KV) before the rotation back: a q head's
 * own, or a kv head's summed over its query heads in head order. */
template <typename T>
__device__ __forceinline__ float rope_grad_in(const T *dr, int64_t hh, int64_t j, int64_t H, int64_t KV, int64_t D) {
    if (hh < H) return ct_ld(dr[hh * D + j]);
    int64_t rep = H / KV, base = hh < H + KV ? H : 2 * H, g = hh < H + KV ? hh - H : hh - H - KV;
    float s = ct_ld(dr[(base + g * rep) * D + j]);
    for (int64_t h = 1; h < rep; h++) s = __fadd_rn(s, ct_ld(dr[(base + g * rep + h) * D + j]));
    return s;
}

template <typename T>
__global__ void k_rope_bwd(T *dx, const T *dqkv, int64_t T_, int64_t H, int64_t KV, int64_t D, double theta,
                           double factor, int64_t pos0) {
    extern __shared__ float cs[];
    int64_t row = blockIdx.x, t = row % T_, half = D / 2;
    bool rotate = theta != 0.0;
    if (rotate) rope_angles(cs, half, D, theta, factor, pos0 + t);
    const T *dr = dqkv + row * 3 * H * D;
    T *out = dx + row * (H + 2 * KV) * D;
    for (int64_t e = threadIdx.x; e < (H + 2 * KV) * D; e += blockDim.x) {
        int64_t hh = e / D, j = e % D;
        if (hh >= H + KV || !rotate || j >= 2 * half) {
            out[e] = ct_st<T>(rope_grad_in(dr, hh, j, H, KV, D));
            continue;
        }
        bool second = j >= half;
        int64_t i = second ? j - half : j;
        float a = rope_grad_in(dr, hh, i, H, KV, D), b = rope_grad_in(dr, hh, half + i, H, KV, D);
        out[e] = ct_st<T>(rope_turn(a, b, cs[i], cs[half + i], second, true));
    }
}

static void check(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    CT_CUDA_REQUIRE(KV > 0 && H % KV == 0, "rope_gqa: kv heads must divide heads");
    CT_CUDA_REQUIRE(D / 2 <= ROPE_MAX_PAIRS, "rope_gqa: head dim above 2048");
    CT_CUDA_REQUIRE(B * T <= INT32_MAX, "rope_gqa: more than 2^31 tokens");
}

static void cu_rope_gqa_forward(ct_backend *be, void *qkv, const void *x, int64_t B, int64_t T, int64_t H,
                                int64_t KV, int64_t D, const ct_rope *r, ct_dtype dt) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    check(B, T, H, KV, D);
    size_t shared = (size_t)(D / 2) * 2 * sizeof(float);
    CT_DT_DISPATCH(dt, T_, {
        k_rope_fwd<T_><<<(unsigned)(B * T), ROPE_THREADS, shared, ct_cuda_stream(be)>>>(
            (T_ *)qkv, (const T_ *)x, T, H, KV, D, r->theta, r->factor, r->pos0);
        CT_CUDA_LAUNCH_CHECK();
    });
}

static void cu_rope_gqa_backward(ct_backend *be, void *dx, const void *dqkv, int64_t B, int64_t T, int64_t H,
                                 int64_t KV, int64_t D, const ct_rope *r, ct_dtype dt) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    check(B, T, H, KV, D);
    size_t shared = (size_t)(D / 2) * 2 * sizeof(float);
    CT_DT_DISPATCH(dt, T_, {
        k_rope_bwd<T_><<<(unsigned)(B * T), ROPE_THREADS, shared, ct_cuda_stream(be)>>>(
            (T_ *)dx, (const T_ *)dqkv, T, H, KV, D, r->theta, r->factor, r->pos0);
        CT_CUDA_LAUNCH_CHECK();
    });
}

void ct_cuda_rope_install(ct_backend *be) {
    be->attn.rope_gqa_forward = cu_rope_gqa_forward;
    be->attn.rope_gqa_backward = cu_rope_gqa_backward;
}

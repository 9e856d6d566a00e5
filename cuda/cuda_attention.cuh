/* cuda_attention.cuh: what the attention files share: the dropout rule of an attention
 * probability, and the tensor-core path's entry points (cuda_attention_mma.cu), which
 * cuda_attention.cu calls when they apply. */
#ifndef CT_CUDA_ATTENTION_CUH
#define CT_CUDA_ATTENTION_CUH

#include "cuda/cuda_internal.h"
#include "cuda/cuda_rng.cuh"

/* keep(b,h,t,j) of element e = (bh T + t) T + j: word e of the dropout stream (ct_rng_at: word
 * e & 3 of Philox block e >> 2), kept (scaled by keep_scale) when it is >= thresh = floor(p 2^32). */
__device__ __forceinline__ float attn_keep(uint64_t key, uint64_t stream, uint64_t e,
                                           uint64_t thresh, float keep_scale) {
    uint4 w = ct_dev_philox_block(key, stream, e >> 2);
    unsigned k = (unsigned)(e & 3);
    uint32_t word = k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
    return (uint64_t)word >= thresh ? keep_scale : 0.0f;
}

/* The register-resident tensor-core kernels (cuda_attention_mma.cu): taken for fp16/bf16, D of 32,
 * 64 or 128, and every buffer given (NULL: not used) 16-byte aligned (the tile loads are 16-byte
 * copies). forward: y and lse; backward: dq, dk, dv into dqkv, with dsum[bh T + t] = dy_t . y_t
 * computed by the caller. init allows the kernels their shared memory (over 48 KiB); once, at
 * backend creation. */
bool ct_cuda_attn_mma_usable(ct_dtype dt, int64_t D, const void *a, const void *b, const void *c,
                             const void *d);
void ct_cuda_attn_mma_init(void);
void ct_cuda_attn_mma_forward(cudaStream_t st, void *y, float *lse, const void *qkv, int64_t B,
                              int64_t T, int64_t H, int64_t D, float scale, uint64_t thresh,
                              float keep_scale, uint64_t key, uint64_t stream, ct_dtype dt);
void ct_cuda_attn_mma_backward(cudaStream_t st, void *dqkv, const void *dy, const void *qkv,
                               const float *lse, const float *dsum, int64_t B, int64_t T, int64_t H,
                               int64_t D, float scale, uint64_t thresh, float keep_scale, uint64_t key,
                               uint64_t stream, ct_dtype dt);

#endif

/* cuda_rng.cuh: core/util/rng.c's keyed Philox4x32-10 streams as device functions, bit for bit.
 *
 *   key     = splitmix64(seed) XOR (purpose << 32)      (key word 0 = low 32 bits)
 *   counter = { block_lo, block_hi, stream_lo, stream_hi }
 *   word i of a stream = output word (i % 4) of block (i / 4)
 * The key is computed once on the host (ct_cuda_rng_key) and passed to kernels. */
#ifndef CT_CUDA_RNG_CUH
#define CT_CUDA_RNG_CUH

#include <stdint.h>

/* splitmix64 finaliser, as rng.c's mix64. */
static inline uint64_t ct_cuda_rng_key(uint64_t seed, uint32_t purpose) {
    uint64_t x = seed + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x ^ ((uint64_t)purpose << 32);
}

/* One block: the 4 words of (key, stream, block). */
__device__ __forceinline__ uint4 ct_dev_philox_block(uint64_t key, uint64_t stream, uint64_t block) {
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
        uint32_t lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return make_uint4(c0, c1, c2, c3);
}

#endif

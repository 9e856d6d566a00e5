/* rng.h: counter-based random numbers (Philox4x32-10), keyed by (seed, purpose, index).
 *
 * Every random draw in ctrain is a pure function of (seed, purpose, counter): parameter init,
 * dropout masks, shuffles and augmentation are reproducible, identical on CPU and GPU, independent
 * of thread count, and resumable from a step number alone. There is no generator state to save. */
#ifndef CT_RNG_H
#define CT_RNG_H

#include <stdint.h>

/* Purposes: the high word of the key, so streams for different uses never overlap. */
enum {
    CT_RNG_INIT = 1,      /* parameter initialisation: index = parameter tensor id */
    CT_RNG_DROPOUT = 2,   /* index = (step, layer) */
    CT_RNG_SHUFFLE = 3,   /* index = epoch */
    CT_RNG_AUGMENT = 4,   /* index = (epoch, sample) */
    CT_RNG_SAMPLE = 5,    /* text generation's token draws: index = 0 */
};

typedef struct { uint32_t v[4]; } ct_philox_ctr;

/* One Philox4x32-10 block: 4 x 32 random bits for (key, counter). */
ct_philox_ctr ct_philox4x32(uint64_t key, ct_philox_ctr ctr);

/* A stream: key = mix(seed, purpose), counter = (index_hi, index_lo, position). */
typedef struct ct_rng {
    uint64_t key;
    uint64_t stream;      /* index chosen by the caller (tensor id, step*K+layer, epoch, ...) */
    uint64_t pos;         /* position in 4-word blocks */
    uint32_t buf[4];
    int avail;
} ct_rng;

void ct_rng_init(ct_rng *r, uint64_t seed, uint32_t purpose, uint64_t stream);
/* Position the stream at block `block` (each block yields 4 uint32). */
void ct_rng_seek(ct_rng *r, uint64_t block);
uint32_t ct_rng_u32(ct_rng *r);
/* Uniform in [0, 1) with 24 random bits (float) / 53 bits (double). */
float ct_rng_uniform(ct_rng *r);
double ct_rng_uniform_f64(ct_rng *r);
/* Standard normal (Box-Muller on two uniforms). */
float ct_rng_normal(ct_rng *r);
/* Uniform integer in [0, n) without modulo bias. */
uint32_t ct_rng_below(ct_rng *r, uint32_t n);

/* Element i of a stream without a stream object: 32 random bits for (seed, purpose, stream, i).
 * This is what parallel kernels use (dropout on CPU threads and on the GPU alike). */
uint32_t ct_rng_at(uint64_t seed, uint32_t purpose, uint64_t stream, uint64_t i);

/* Fisher-Yates permutation of 0..n-1 from (seed, CT_RNG_SHUFFLE, epoch). */
void ct_rng_permutation(uint64_t seed, uint64_t epoch, uint32_t *perm, uint32_t n);

#endif

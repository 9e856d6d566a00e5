/* rng.c: Philox4x32-10 (Salmon et al., SC'11) and the keyed streams built on it.
 *
 * Stream layout (the CUDA backend must reproduce it bit for bit):
 *   key     = splitmix64(seed) XOR (purpose << 32)      (key word 0 = low 32 bits)
 *   counter = { block_lo, block_hi, stream_lo, stream_hi }
 *   word i of a stream = output word (i % 4) of block (i / 4)
 * so ct_rng_at(seed, purpose, stream, i) equals the i-th ct_rng_u32() of a stream object
 * initialised with the same arguments. */
#include "core/util/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

static inline void philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

ct_philox_ctr ct_philox4x32(uint64_t key, ct_philox_ctr ctr) {
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        philox_round(ctr.v, k0, k1);
    }
    return ctr;
}

/* splitmix64 finaliser: spreads nearby seeds (0, 1, 2, ...) over the whole key space. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t rng_key(uint64_t seed, uint32_t purpose) {
    return mix64(seed) ^ ((uint64_t)purpose << 32);
}

static ct_philox_ctr rng_block(uint64_t key, uint64_t stream, uint64_t block) {
    ct_philox_ctr c = {{(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                        (uint32_t)(stream >> 32)}};
    return ct_philox4x32(key, c);
}

void ct_rng_init(ct_rng *r, uint64_t seed, uint32_t purpose, uint64_t stream) {
    r->key = rng_key(seed, purpose);
    r->stream = stream;
    r->pos = 0;
    r->avail = 0;
}

void ct_rng_seek(ct_rng *r, uint64_t block) {
    r->pos = block;
    r->avail = 0;
}

uint32_t ct_rng_u32(ct_rng *r) {
    if (r->avail == 0) {
        ct_philox_ctr o = rng_block(r->key, r->stream, r->pos++);
        for (int i = 0; i < 4; i++) r->buf[i] = o.v[i];
        r->avail = 4;
    }
    return r->buf[4 - r->avail--];
}

float ct_rng_uniform(ct_rng *r) {
    return (float)(ct_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
}

double ct_rng_uniform_f64(ct_rng *r) {
    uint64_t hi = ct_rng_u32(r) >> 5, lo = ct_rng_u32(r) >> 6; /* 27 + 26 = 53 bits */
    return (double)((hi << 26) | lo) * (1.0 / 9007199254740992.0);
}

float ct_rng_normal(ct_rng *r) {
    /* u1 in (0, 1] so log never sees 0; computed in double so the tails are not clipped early */
    double u1 = ((double)(ct_rng_u32(r) >> 8) + 1.0) * (1.0 / 16777216.0);
    double u2 = (double)(ct_rng_u32(r) >> 8) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint32_t ct_rng_below(ct_rng *r, uint32_t n) {
    if (n <= 1) return 0;
    /* Lemire's multiply-shift; reject the few low products that would bias the result */
    uint64_t m = (uint64_t)ct_rng_u32(r) * n;
    uint32_t low = (uint32_t)m;
    if (low < n) {
        uint32_t threshold = (uint32_t)(-n) % n;
        while (low < threshold) {
            m = (uint64_t)ct_rng_u32(r) * n;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

uint32_t ct_rng_at(uint64_t seed, uint32_t purpose, uint64_t stream, uint64_t i) {
    ct_philox_ctr o = rng_block(rng_key(seed, purpose), stream, i >> 2);
    return o.v[i & 3];
}

void ct_rng_permutation(uint64_t seed, uint64_t epoch, uint32_t *perm, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) perm[i] = i;
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_SHUFFLE, epoch);
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = ct_rng_below(&r, i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

/* cpu_init.c: init_fill, parameter initialisation (formula in backend.h).
 *
 * Element i depends on (seed, stream, i) alone, so the pool may cut [0, n) anywhere. A plain loop
 * over ct_philox4x32 and libm's log and cos took ~40 ns per normal draw here (5 s for 124M
 * parameters on one core). What makes it an order of magnitude faster:
 *  - Philox runs on 2, 4 or 8 counters at once in vector registers (SSE2, AVX2, AVX-512), one
 *    64-bit lane per counter, whose 32x32->64-bit multiply is exactly Philox's; compilers do not
 *    find that form by themselves. Odd ends and other CPUs call rng.c's ct_philox4x32, and
 *    test_backend checks every element of every path against it.
 *  - ln and cos are straight-line double arithmetic (no libm, no branches), so the compiler
 *    vectorises them, and their bits do not depend on the C library: +, -, *, / and sqrt are
 *    correctly rounded everywhere, and nothing is fused into an FMA.
 *  - The same batch code is compiled for baseline x86-64, AVX2 and AVX-512 and picked at run time;
 *    from the above, all give the same bits. */
#include <math.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"
#include "core/util/rng.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CT_INIT_X86 1
#endif

/* -std=c11 already keeps gcc from contracting a * b + c into an FMA (which AVX-512 would allow);
 * it is repeated here because the bits of every element depend on it. clang contracts by default. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Counters per batch: the batch's arrays (4 x 8 bytes per counter) stay in L1. */
#define CT_INIT_BATCH 256

typedef struct init_ctx {
    float *x;                    /* element i goes to x[i - base] */
    int64_t base;
    ct_init_draw kind;
    double a, b, span;           /* span = b - a (uniform) */
    uint64_t key, stream;
} init_ctx;

static inline double bits_f64(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
static inline uint64_t f64_bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* The low 32 bits of w as a double, exactly, with 64-bit integer operations only (x86 before
 * AVX-512 has no vector conversion from unsigned or 64-bit integers to double). */
static inline double u32_f64(uint64_t w) {
    return bits_f64(0x4330000000000000ull | (w & 0xFFFFFFFFull)) - 4503599627370496.0;
}

/* ln 2 split so that e * LN2_HI is exact for any binary exponent e. */
#define LN2_HI 0x1.62e42p-1
#define LN2_LO 0x1.fdf473de6af28p-22
#define SQRT2_BITS 0x3FF6A09E667F3BCDull /* sqrt(2) rounded down */
#define TWO_PI_2M32 0x1.921fb54442d18p-30 /* 2 pi / 2^32 */

/* ln x for a positive normal double. x = 2^e m with m in [sqrt(2)/2, sqrt(2)); f = m - 1 is
 * exact, s = f / (2 + f) is at most 0.172 and ln m = 2 atanh s = f - s f + s R(s^2), written so
 * that the rounding of the small terms hardly reaches the result (within ~1 ulp). R's series
 * (2/3 z + 2/5 z^2 + ...) is cut where its next term is below 2^-60 of ln m, and evaluated by
 * Estrin's scheme: Horner's chain of dependent multiply-adds left the vector units waiting. */
static inline double init_log(double x) {
    uint64_t u = f64_bits(x);
    uint64_t mant = u & 0x000FFFFFFFFFFFFFull;
    /* m > sqrt(2) is decided and applied with integer arithmetic on the bits (big = 1: halve m):
     * gcc neither if-converts a floating-point comparison nor a conditional multiply (either
     * could raise a flag), and SSE2 has no 64-bit comparison; any of them keeps the loop scalar */
    uint64_t big = ((SQRT2_BITS & 0x000FFFFFFFFFFFFFull) - mant) >> 63;
    double m = bits_f64(mant | (0x3FF0000000000000ull - (big << 52)));
    double e = bits_f64(0x4330000000000000ull | ((u >> 52) + big)) - (4503599627370496.0 + 1023.0);
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s, z2 = z * z, z4 = z2 * z2;
    double p = ((2.0 / 5.0 + z * (2.0 / 7.0)) + z2 * (2.0 / 9.0 + z * (2.0 / 11.0))) +
               z4 * ((2.0 / 13.0 + z * (2.0 / 15.0)) + z2 * (2.0 / 17.0 + z * (2.0 / 19.0))) +
               (z4 * z4) * (2.0 / 21.0);
    double r = z * (2.0 / 3.0 + z * p);
    double hfsq = 0.5 * f * f;
    return (e * LN2_HI + f) - (hfsq - (s * (hfsq + r) + e * LN2_LO));
}

/* cos(2 pi w / 2^32) for a 32-bit w. The quadrant and the octant come from w's bits, so the
 * reduction is exact and the series see an angle in [0, pi/4], where Taylor series cut after the
 * theta^16 (cos) and theta^17 (sin) terms are within 2^-58 of the value. The choices are masks
 * on 64-bit integers, the width of a double, rather than comparisons and selects, so that the
 * loop vectorises even for SSE2. */
static inline double init_cos_turn(uint64_t w) {
    uint64_t q = w >> 30, r = w & 0x3FFFFFFFu;
    /* beyond pi/4 in its quadrant: take the complement; all ones when past */
    uint64_t past = 0 - ((0x20000000u - r) >> 63);
    uint64_t rr = ((r ^ past) - past) + (past & 0x40000000u);
    double t = (bits_f64(0x4330000000000000ull | rr) - 4503599627370496.0) * TWO_PI_2M32;
    double t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    /* the two largest terms of each series last, the rest by Estrin's scheme */
    double pc = ((1.0 / 24.0 - t2 * (1.0 / 720.0)) +
                 t4 * (1.0 / 40320.0 - t2 * (1.0 / 3628800.0))) +
                t8 * ((1.0 / 479001600.0 - t2 * (1.0 / 87178291200.0)) +
                      t4 * (1.0 / 20922789888000.0));
    double c = 1.0 + t2 * (-0.5 + t2 * pc);
    double ps = ((1.0 / 120.0 - t2 * (1.0 / 5040.0)) +
                 t4 * (1.0 / 362880.0 - t2 * (1.0 / 39916800.0))) +
                t8 * ((1.0 / 6227020800.0 - t2 * (1.0 / 1307674368000.0)) +
                      t4 * (1.0 / 355687428096000.0));
    double s = t + t * (t2 * (-1.0 / 6.0 + t2 * ps));
    /* cos and sin of the angle within the quadrant, then cos of quadrant q plus that angle:
     * sin in the odd quadrants, negative in quadrants 1 and 2 (the sign bit flipped) */
    uint64_t cb = f64_bits(c), sb = f64_bits(s);
    uint64_t cq = (cb & ~past) | (sb & past), sq = (sb & ~past) | (cb & past);
    uint64_t odd = 0 - (q & 1u);
    return bits_f64(((cq & ~odd) | (sq & odd)) ^ (((q + 1u) & 2u) << 62));
}

/* Philox words 0 and 1 of counters i0 .. i0 + n - 1 into the low halves of w0[j], w1[j]. */
static void philox_scalar(const init_ctx *k, int64_t i0, int n, uint64_t *w0, uint64_t *w1) {
    for (int j = 0; j < n; j++) {
        uint64_t i = (uint64_t)(i0 + j);
        ct_philox_ctr c = {{(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)k->stream,
                            (uint32_t)(k->stream >> 32)}};
        ct_philox_ctr w = ct_philox4x32(k->key, c);
        w0[j] = w.v[0];
        w1[j] = w.v[1];
    }
}

static void sqrt_scalar(double *v, int n) {
    for (int j = 0; j < n; j++) v[j] = sqrt(v[j]);
}

#ifdef CT_INIT_X86
/* Philox4x32-10 (rng.c's philox_round) on 64-bit lanes holding the 32-bit words: mul_epu32
 * multiplies the low halves into the full 64-bit product, and the high halves of the lanes may
 * hold garbage, because only low halves are ever multiplied or kept. Two vectors of counters go
 * through the rounds together: one alone waits on each multiply's latency. */
#define PHILOX_ROUND(V, MUL, SRL, XOR, c0, c1, c2, c3, r)                                        \
    do {                                                                                         \
        V p0 = MUL(c0, m0), p1 = MUL(c2, m1);                                                    \
        c0 = XOR(XOR(SRL(p1, 32), c1), key0[r]);                                                 \
        c2 = XOR(XOR(SRL(p0, 32), c3), key1[r]);                                                 \
        c1 = p1;                                                                                 \
        c3 = p0;                                                                                 \
    } while (0)
#define PHILOX_LANES(V, MUL, SRL, XOR, SET1, LANES)                                              \
    V m0 = SET1(0xD2511F53), m1 = SET1(0xCD9E8D57);                                              \
    V key0[10], key1[10];                                                                        \
    for (int r = 0; r < 10; r++) {                                                               \
        key0[r] = SET1((uint32_t)k->key + (uint32_t)r * 0x9E3779B9u);                           \
        key1[r] = SET1((uint32_t)(k->key >> 32) + (uint32_t)r * 0xBB67AE85u);                   \
    }                                                                                            \
    const V s0 = SET1((uint32_t)k->stream), s1 = SET1((uint32_t)(k->stream >> 32));              \
    int j = 0;                                                                                   \
    for (; j + 2 * (LANES) <= n; j += 2 * (LANES)) {                                             \
        uint64_t ctr[2 * (LANES)];                                                               \
        for (int l = 0; l < 2 * (LANES); l++) ctr[l] = (uint64_t)(i0 + j + l);                   \
        V a0, a1, a2 = s0, a3 = s1, b0, b1, b2 = s0, b3 = s1;                                    \
        memcpy(&a0, ctr, sizeof a0);                                                             \
        memcpy(&b0, ctr + (LANES), sizeof b0);                                                   \
        a1 = SRL(a0, 32);                                                                        \
        b1 = SRL(b0, 32);                                                                        \
        _Pragma("GCC unroll 10") for (int r = 0; r < 10; r++) {                                  \
            PHILOX_ROUND(V, MUL, SRL, XOR, a0, a1, a2, a3, r);                                   \
            PHILOX_ROUND(V, MUL, SRL, XOR, b0, b1, b2, b3, r);                                   \
        }                                                                                        \
        memcpy(w0 + j, &a0, sizeof a0);                                                          \
        memcpy(w1 + j, &a1, sizeof a1);                                                          \
        memcpy(w0 + j + (LANES), &b0, sizeof b0);                                                \
        memcpy(w1 + j + (LANES), &b1, sizeof b1);                                                \
    }                                                                                            \
    if (j < n) philox_scalar(k, i0 + j, n - j, w0 + j, w1 + j);

/* SSE2 is part of x86-64: the baseline kernel gets two lanes */
static void philox_sse2(const init_ctx *k, int64_t i0, int n, uint64_t *w0, uint64_t *w1) {
    PHILOX_LANES(__m128i, _mm_mul_epu32, _mm_srli_epi64, _mm_xor_si128, _mm_set1_epi64x, 2)
}
static void sqrt_sse2(double *v, int n) {
    int j = 0;
    for (; j + 2 <= n; j += 2) _mm_storeu_pd(v + j, _mm_sqrt_pd(_mm_loadu_pd(v + j)));
    sqrt_scalar(v + j, n - j);
}
__attribute__((target("avx2"))) static void philox_avx2(const init_ctx *k, int64_t i0, int n,
                                                         uint64_t *w0, uint64_t *w1) {
    PHILOX_LANES(__m256i, _mm256_mul_epu32, _mm256_srli_epi64, _mm256_xor_si256,
                 _mm256_set1_epi64x, 4)
}
__attribute__((target("avx2"))) static void sqrt_avx2(double *v, int n) {
    int j = 0;
    for (; j + 4 <= n; j += 4) _mm256_storeu_pd(v + j, _mm256_sqrt_pd(_mm256_loadu_pd(v + j)));
    sqrt_scalar(v + j, n - j);
}
__attribute__((target("avx512f"))) static void philox_avx512(const init_ctx *k, int64_t i0, int n,
                                                              uint64_t *w0, uint64_t *w1) {
    PHILOX_LANES(__m512i, _mm512_mul_epu32, _mm512_srli_epi64, _mm512_xor_si512,
                 _mm512_set1_epi64, 8)
}
__attribute__((target("avx512f"))) static void sqrt_avx512(double *v, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) _mm512_storeu_pd(v + j, _mm512_sqrt_pd(_mm512_loadu_pd(v + j)));
    sqrt_scalar(v + j, n - j);
}
#endif

typedef void (*philox_fn)(const init_ctx *k, int64_t i0, int n, uint64_t *w0, uint64_t *w1);
typedef void (*sqrt_fn)(double *v, int n);

/* Elements [i0, i0 + n), n <= CT_INIT_BATCH. Inlined into one function per instruction set, so
 * that the loops here are vectorised for it. */
static inline __attribute__((always_inline)) void init_batch(const init_ctx *k, int64_t i0, int n,
                                                             philox_fn philox, sqrt_fn vsqrt) {
    uint64_t w0[CT_INIT_BATCH], w1[CT_INIT_BATCH];
    philox(k, i0, n, w0, w1);
    float *restrict x = k->x + (i0 - k->base);
    const double a = k->a, b = k->b, span = k->span;
    if (k->kind == CT_DRAW_UNIFORM) {
        for (int j = 0; j < n; j++) x[j] = (float)(a + span * (u32_f64(w0[j]) * 0x1p-32));
        return;
    }
    /* sqrt has a pass of its own: gcc 12 keeps a call for errno beside an inline sqrt whatever
     * the flags say, and a call stops the vectoriser */
    double rad[CT_INIT_BATCH], cs[CT_INIT_BATCH];
    for (int j = 0; j < n; j++) {
        rad[j] = -2.0 * init_log((u32_f64(w0[j]) + 1.0) * 0x1p-32);
        cs[j] = init_cos_turn(w1[j] & 0xFFFFFFFFull);
    }
    vsqrt(rad, n);
    for (int j = 0; j < n; j++) x[j] = (float)(a + b * (rad[j] * cs[j]));
}

#define INIT_RANGE_BODY(PHILOX, SQRT)                                                            \
    for (int64_t i = i0; i < i1; i += CT_INIT_BATCH)                                             \
        init_batch(k, i, (int)(i1 - i < CT_INIT_BATCH ? i1 - i : CT_INIT_BATCH), PHILOX, SQRT);

static void init_range_base(const init_ctx *k, int64_t i0, int64_t i1) {
#ifdef CT_INIT_X86
    INIT_RANGE_BODY(philox_sse2, sqrt_sse2)
#else
    INIT_RANGE_BODY(philox_scalar, sqrt_scalar)
#endif
}
#ifdef CT_INIT_X86
__attribute__((target("avx2"))) static void init_range_avx2(const init_ctx *k, int64_t i0,
                                                             int64_t i1) {
    INIT_RANGE_BODY(philox_avx2, sqrt_avx2)
}
__attribute__((target("avx512f"))) static void init_range_avx512(const init_ctx *k, int64_t i0,
                                                                 int64_t i1) {
    INIT_RANGE_BODY(philox_avx512, sqrt_avx512)
}
#endif

/* The widest of the kernels this CPU runs, or `isa` when it is given and supported. */
static int init_isa(int isa) {
    int best = 0;
#ifdef CT_INIT_X86
    if (__builtin_cpu_supports("avx2")) best = 1;
    if (__builtin_cpu_supports("avx512f")) best = 2;
#endif
    return isa < 0 ? best : isa <= best ? isa : -1;
}

static void init_run(const init_ctx *k, int64_t i0, int64_t i1, int isa) {
    if (k->kind == CT_DRAW_CONSTANT) {
        float v = (float)k->a;
        for (int64_t i = i0; i < i1; i++) k->x[i - k->base] = v;
        return;
    }
    switch (isa) {
#ifdef CT_INIT_X86
    case 2: init_range_avx512(k, i0, i1); return;
    case 1: init_range_avx2(k, i0, i1); return;
#endif
    default: init_range_base(k, i0, i1); return;
    }
}

typedef struct pool_ctx {
    init_ctx k;
    int isa;
} pool_ctx;

/* The pool splits [0, n); the draws are those of elements first + i. */
static void init_range(void *c, int64_t i0, int64_t i1) {
    const pool_ctx *p = c;
    init_run(&p->k, p->k.base + i0, p->k.base + i1, p->isa);
}

static init_ctx init_setup(float *x, const ct_init_dist *d, uint64_t seed, uint64_t stream) {
    if (d->kind != CT_DRAW_CONSTANT && d->kind != CT_DRAW_UNIFORM && d->kind != CT_DRAW_NORMAL)
        ct_fatal("init_fill: unknown draw kind %d", (int)d->kind);
    ct_rng r; /* for its key only: the derivation stays in rng.c */
    ct_rng_init(&r, seed, CT_RNG_INIT, stream);
    return (init_ctx){.x = x, .kind = d->kind, .a = d->a, .b = d->b, .span = d->b - d->a,
                      .key = r.key, .stream = stream};
}

bool ct_cpu_init_fill_isa(float *x, int64_t i0, int64_t n, const ct_init_dist *d, uint64_t seed,
                          uint64_t stream, int isa) {
    init_ctx k = init_setup(x, d, seed, stream);
    if (isa < 0 || init_isa(isa) < 0) return false;
    k.base = i0;
    init_run(&k, i0, i0 + n, isa);
    return true;
}

static void cpu_init_fill(ct_backend *be, float *x, int64_t first, int64_t n, const ct_init_dist *d,
                          uint64_t seed, uint64_t stream) {
    pool_ctx p = {init_setup(x, d, seed, stream), init_isa(-1)};
    p.k.base = first;
    if (n > 0) ct_cpu_parallel(ct_cpu_pool_of(be), n, CT_CPU_GRAIN / 4, init_range, &p);
}

void ct_cpu_init_install(ct_backend *be) { be->elt.init_fill = cpu_init_fill; }

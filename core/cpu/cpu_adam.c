/* cpu_adam.c: the Adam/AdamW element kernel of the CPU backend, one per instruction set.
 *
 * The update (DeepSpeed's FusedAdam, cpu_optim.c has the formula) is evaluated in exactly the
 * same order, with the same roundings, by every kernel: multiplications, additions, divisions and
 * square roots are correctly rounded IEEE operations in scalar code, SSE, AVX2 and AVX-512 alike,
 * and no kernel fuses a multiply-add (the AVX2 kernel is not compiled for FMA; the build is
 * -std=c11, which turns contraction off, so the AVX-512 intrinsics stay separate operations too).
 * So the kernels agree bit for bit with each other and with the scalar reference, and since every
 * element is updated on its own, with any thread count. test_backend checks each kernel this CPU
 * runs against the baseline one, bitwise.
 *
 * The weight decay terms are always evaluated (l2 * p, wd * p with a zero factor when unused), as
 * the scalar formula does: skipping them would change the sign of a zero update.
 *
 * The 16-bit copy of the updated parameters is written in the same pass: fp16 from the vector
 * registers (F16C / AVX-512 round to nearest even, the bits of ct_f32_to_f16), bf16 and the
 * baseline kernel's copies through ct_cpu_cast_range on each block while it is still in L1. */
#include <math.h>
#include <stdbool.h>

#include "core/cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CT_ADAM_X86 1
#endif

/* Elements per block: the baseline kernel's square-root buffer, and the unit of the copy. */
enum { ADAM_BLOCK = 512 };

/* The update's scalars, computed once per call: the same float values the formula uses. */
typedef struct adam_k {
    float lr, b1, b2, c1, c2, eps, l2, wd, scale, bc1, bc2;
} adam_k;

static adam_k adam_consts(const ct_adam_args *a) {
    return (adam_k){.lr = a->lr, .b1 = a->beta1, .b2 = a->beta2, .c1 = 1.0f - a->beta1,
                    .c2 = 1.0f - a->beta2, .eps = a->eps,
                    .l2 = a->decoupled ? 0.0f : a->weight_decay,
                    .wd = a->decoupled ? a->weight_decay : 0.0f, .scale = a->grad_scale,
                    .bc1 = a->bias_c1, .bc2 = a->bias_c2};
}

/* A plain sqrtf loop stays scalar: without -fno-math-errno gcc must keep a branch to set errno
 * for negative inputs, and the optimize attribute/pragma cannot lift that. */
void ct_cpu_sqrt_block(float *y, const float *x, int64_t n) {
    int64_t i = 0;
#if defined(__SSE2__)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = sqrtf(x[i]);
}

/* The baseline kernel on [s, s + n), n <= ADAM_BLOCK: moments first, then the square roots,
 * then the update, so every pass is a loop the compiler vectorises for the baseline ISA. */
static void adam_block_base(const adam_k *k, float *restrict p, const float *restrict g,
                            float *restrict m, float *restrict v, int64_t s, int64_t n) {
    float denom[ADAM_BLOCK]; /* sqrt(v_hat) */
    for (int64_t j = 0; j < n; j++) {
        int64_t i = s + j;
        float gi = g[i] * k->scale + k->l2 * p[i];
        m[i] = k->b1 * m[i] + k->c1 * gi;
        v[i] = k->b2 * v[i] + k->c2 * gi * gi;
        denom[j] = v[i] / k->bc2;
    }
    ct_cpu_sqrt_block(denom, denom, n);
    for (int64_t j = 0; j < n; j++) {
        int64_t i = s + j;
        float update = (m[i] / k->bc1) / (denom[j] + k->eps) + k->wd * p[i];
        p[i] -= k->lr * update;
    }
}

#ifdef CT_ADAM_X86
/* The vector loop over [s, s + n) for an ISA's vector type V (LANES floats) and its operations:
 * the same operations in the same order as adam_block_base, then STORE16 writes the 16-bit copy
 * of the new parameters when there is one. Returns where the scalar tail starts.
 * A bias correction that is exactly 1 (1 - beta^t rounds to 1.0f after ~170 steps at beta1 0.9,
 * ~17,000 at beta2 0.999; always without bias correction) is not divided by: x / 1 is x exactly
 * in IEEE arithmetic, so the bits are the formula's. The divider is what bounds this loop (three
 * divisions and a square root per element), and at batch 32 Adam is a fifth of the MLP's step. */
#define ADAM_LOOP(LANES, V, LOAD, STORE, ADD, SUB, MUL, DIV, SQRT, SET1, STORE16)                 \
    int64_t i = s;                                                                                \
    bool unit_bc1 = k->bc1 == 1.0f, unit_bc2 = k->bc2 == 1.0f; /* see ADAM_LOOP's comment */     \
    for (; i + (LANES) <= s + n; i += (LANES)) {                                                  \
        V pv = LOAD(p + i), gi = ADD(MUL(LOAD(g + i), SET1(k->scale)), MUL(SET1(k->l2), pv));     \
        V mv = ADD(MUL(SET1(k->b1), LOAD(m + i)), MUL(SET1(k->c1), gi));                          \
        V vv = ADD(MUL(SET1(k->b2), LOAD(v + i)), MUL(MUL(SET1(k->c2), gi), gi));                 \
        STORE(m + i, mv);                                                                         \
        STORE(v + i, vv);                                                                         \
        V v_hat = unit_bc2 ? vv : DIV(vv, SET1(k->bc2));                                          \
        V m_hat = unit_bc1 ? mv : DIV(mv, SET1(k->bc1));                                          \
        V denom = ADD(SQRT(v_hat), SET1(k->eps));                                                 \
        V update = ADD(DIV(m_hat, denom), MUL(SET1(k->wd), pv));                                  \
        V pn = SUB(pv, MUL(SET1(k->lr), update));                                                 \
        STORE(p + i, pn);                                                                         \
        if (h16) STORE16(h16 + i, pn, bf16);                                                      \
    }                                                                                             \
    return i;

/* The 16-bit copy of LANES new parameters x from the vector registers into y. fp16: the
 * conversion instruction (F16_STORE), round to nearest even. bf16: ct_f32_to_bf16 on every 32-bit
 * lane of the integer vector u (round to nearest even by adding 0x7fff plus the kept lowest bit;
 * PICK_NAN takes the quietened NaN where x is one), then narrowed to 16 bits (NARROW_STORE). */
#define STORE16_BODY(VI, CAST, SRLI, AND, ADD, OR, SET1, F16_STORE, PICK_NAN, NARROW_STORE)       \
    if (!bf16) {                                                                                  \
        F16_STORE(y, x);                                                                          \
        return;                                                                                   \
    }                                                                                             \
    VI u = CAST(x);                                                                               \
    VI rounded = SRLI(ADD(u, ADD(SET1(0x7fff), AND(SRLI(u, 16), SET1(1)))), 16);                  \
    VI quiet = OR(SRLI(u, 16), SET1(0x40));                                                       \
    NARROW_STORE(y, PICK_NAN(u, rounded, quiet)); /* every lane below 2^16 */

#define AVX2 __attribute__((target("avx2,f16c"))) static inline
AVX2 void f16_store_avx2(uint16_t *y, __m256 x) {
    _mm_storeu_si128((__m128i *)y, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
AVX2 __m256i pick_nan_avx2(__m256i u, __m256i rounded, __m256i quiet) {
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    return _mm256_blendv_epi8(rounded, quiet, _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000)));
}
/* packus narrows within each 128-bit half; the permute brings the halves' results together */
AVX2 void narrow_store_avx2(uint16_t *y, __m256i h) {
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    _mm_storeu_si128((__m128i *)y, _mm256_castsi256_si128(packed));
}
AVX2 void store16_avx2(uint16_t *y, __m256 x, bool bf16) {
    STORE16_BODY(__m256i, _mm256_castps_si256, _mm256_srli_epi32, _mm256_and_si256,
                 _mm256_add_epi32, _mm256_or_si256, _mm256_set1_epi32, f16_store_avx2,
                 pick_nan_avx2, narrow_store_avx2)
}

#define AVX512 __attribute__((target("avx512f"))) static inline
AVX512 void f16_store_avx512(uint16_t *y, __m512 x) {
    _mm256_storeu_si256((__m256i *)y, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
AVX512 __m512i pick_nan_avx512(__m512i u, __m512i rounded, __m512i quiet) {
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000)),
                                   rounded, quiet);
}
AVX512 void narrow_store_avx512(uint16_t *y, __m512i h) { /* vpmovdw truncates: h < 2^16 */
    _mm256_storeu_si256((__m256i *)y, _mm512_cvtepi32_epi16(h));
}
AVX512 void store16_avx512(uint16_t *y, __m512 x, bool bf16) {
    STORE16_BODY(__m512i, _mm512_castps_si512, _mm512_srli_epi32, _mm512_and_si512,
                 _mm512_add_epi32, _mm512_or_si512, _mm512_set1_epi32, f16_store_avx512,
                 pick_nan_avx512, narrow_store_avx512)
}

/* The vector kernels over [s, s + n): h16 is the 16-bit copy or NULL; they return where the
 * scalar tail starts. AVX2 (no FMA, see the top) with F16C for the fp16 copy, 8 elements a
 * vector; AVX-512F, 16. */
#define ADAM_BLOCK_FN(TARGET, NAME)                                                               \
    __attribute__((target(TARGET))) static int64_t NAME(const adam_k *k, float *p, const float *g, \
                                                        float *m, float *v, uint16_t *h16,         \
                                                        bool bf16, int64_t s, int64_t n)
ADAM_BLOCK_FN("avx2,f16c", adam_block_avx2) {
    ADAM_LOOP(8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, _mm256_sub_ps,
              _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps, _mm256_set1_ps, store16_avx2)
}
ADAM_BLOCK_FN("avx512f", adam_block_avx512) {
    ADAM_LOOP(16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_sub_ps,
              _mm512_mul_ps, _mm512_div_ps, _mm512_sqrt_ps, _mm512_set1_ps, store16_avx512)
}
#endif

int ct_cpu_adam_isa(int isa) {
    int best = 0;
#ifdef CT_ADAM_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) best = 1;
    if (best == 1 && __builtin_cpu_supports("avx512f")) best = 2;
#endif
    return isa < 0 ? best : isa <= best ? isa : -1;
}

void ct_cpu_adam_range(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1,
                       const ct_adam_args *a, int isa) {
    adam_k k = adam_consts(a);
    /* the vector kernels write a 16-bit copy from their registers; the baseline kernel's copy (and
     * the vector kernels' tails) go through the cast per block */
    bool bf16 = a->copy_dt == CT_BF16;
    uint16_t *h16 = isa > 0 && a->copy && (a->copy_dt == CT_F16 || bf16) ? a->copy : NULL;
    for (int64_t s = i0; s < i1; s += ADAM_BLOCK) {
        int64_t n = i1 - s < ADAM_BLOCK ? i1 - s : ADAM_BLOCK, tail = s;
#ifdef CT_ADAM_X86
        if (isa == 2) tail = adam_block_avx512(&k, p, g, m, v, h16, bf16, s, n);
        else if (isa == 1) tail = adam_block_avx2(&k, p, g, m, v, h16, bf16, s, n);
#endif
        if (tail < s + n) adam_block_base(&k, p, g, m, v, tail, s + n - tail);
        if (a->copy) {
            int64_t from = h16 ? tail : s; /* the vector part already has its fp16 copy */
            if (from < s + n) ct_cpu_cast_range(a->copy, a->copy_dt, p, CT_F32, from, s + n);
        }
    }
}

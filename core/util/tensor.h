/* tensor.h: dtypes, shapes and tensor descriptors; fp16/bf16 scalar conversions.
 *
 * A tensor is a view: dtype, shape, and a pointer into memory owned elsewhere (usually one flat
 * buffer carved into named views). Shapes are row-major, outermost first; activations are
 * [N, C, H, W] or [N, F] or [N, T, F]. */
#ifndef CT_TENSOR_H
#define CT_TENSOR_H

#include <stdint.h>
#include <string.h>

#include "core/util/common.h"

typedef enum { CT_F32 = 0, CT_F16, CT_BF16, CT_I32, CT_I64, CT_U8, CT_U16, CT_DTYPE_COUNT } ct_dtype;

static inline size_t ct_dtype_size(ct_dtype t) {
    static const size_t sz[CT_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1, 2};
    return (unsigned)t < CT_DTYPE_COUNT ? sz[t] : 0;
}
const char *ct_dtype_name(ct_dtype t);              /* "f32", "f16", "bf16", ... */
const char *ct_dtype_safetensors_name(ct_dtype t);  /* "F32", "F16", "BF16", "I32", ... */

#define CT_MAX_DIMS 6
typedef struct ct_shape {
    int ndim;
    int64_t d[CT_MAX_DIMS];
} ct_shape;

static inline int64_t ct_shape_numel(const ct_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}
static inline int ct_shape_eq(const ct_shape *a, const ct_shape *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->d[i] != b->d[i]) return 0;
    return 1;
}
ct_shape ct_shape_make(int ndim, const int64_t *d);
/* "[N, 64, 14, 14]"-style text into buf; returns buf. */
const char *ct_shape_str(const ct_shape *s, char *buf, size_t n);

typedef enum { CT_HOST = 0, CT_DEVICE } ct_memspace;

/* Address of element i of an array of dtype dt (activations and 16-bit parameters are not
 * float*), and the bytes of n elements. */
static inline void *ct_elem(void *p, int64_t i, ct_dtype dt) {
    return (char *)p + i * (int64_t)ct_dtype_size(dt);
}
static inline const void *ct_celem(const void *p, int64_t i, ct_dtype dt) {
    return (const char *)p + i * (int64_t)ct_dtype_size(dt);
}
static inline size_t ct_nbytes(int64_t n, ct_dtype dt) { return (size_t)n * ct_dtype_size(dt); }

typedef struct ct_tensor {
    void *data;
    ct_dtype dtype;
    ct_shape shape;
    ct_memspace space;
} ct_tensor;

/* ---- scalar fp16 / bf16 conversion, round-to-nearest-even, NaN/Inf preserved ---- */
static inline uint32_t ct__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ct__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t ct_f32_to_bf16(float f) {
    uint32_t u = ct__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float ct_bf16_to_f32(uint16_t h) { return ct__bits_f32((uint32_t)h << 16); }

static inline uint16_t ct_f32_to_f16(float f) {
    uint32_t u = ct__f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* rounds to >= 65520: Inf */
    if (a < 0x38800000u) {                                           /* subnormal or zero in f16 */
        /* value = a as float; f16 subnormal unit is 2^-24: round(value * 2^24) with RNE */
        float v = ct__bits_f32(a) * 16777216.0f;                     /* exact: power-of-two scale */
        uint32_t r = (uint32_t)v;
        float frac = v - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t mant = a & 0x7fffffu;
    uint32_t exp = (a >> 23) - 112u;                                 /* rebias 127 -> 15 */
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;        /* carry may bump exponent: ok */
    return (uint16_t)(sign | h);
}
static inline float ct_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);                /* subnormal: mant * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) return ct__bits_f32(sign | 0x7f800000u | (mant << 13));
    return ct__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

#endif

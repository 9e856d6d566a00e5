/* cpu_attention.c: causal multi-head attention over a fused qkv (backend.h, ct_backend_attn), the
 * CPU reference of the CUDA kernels and the CPU backend's own.
 *
 * One task per (sequence b, head h): its q, k, v columns of qkv are read, its y rows and its dq,
 * dk, dv columns of dqkv written, so tasks share nothing and no bit depends on the thread count.
 * Within a task every sum runs in a fixed order (keys, then queries, increasing). Scores live in
 * one row of T floats per task at a time: the forward keeps the log-sum-exp per row, and the
 * backward recomputes the row's probabilities from q, k and it, as the GPU kernels do.
 *
 * Layouts: qkv [B, T, 3, H, D] (token (b, t): q of head h at (b T + t) 3HD + h D, k at + HD,
 * v at + 2HD), y and dy [B, T, H, D], lse [B, H, T]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"
#include "core/util/rng.h"

typedef struct {
    float *y, *lse, *dqkv;
    const float *qkv, *dy, *yin, *lse_in;
    int64_t T, H, D;
    float scale, p, keep_scale;
    uint64_t threshold; /* a draw below it drops the probability: p * 2^32 */
    uint64_t seed, stream;
} attn_ctx;

/* keep[j] for j in [0, t]: 0 when score (b h, t, j) is dropped, else 1 / (1 - p); the draw of
 * element e = (bh T + t) T + j is word e of the dropout stream (dropout_forward's rule). */
static void row_keep(const attn_ctx *k, int64_t bh, int64_t t, float *keep) {
    if (k->p <= 0.0f) {
        for (int64_t j = 0; j <= t; j++) keep[j] = 1.0f;
        return;
    }
    uint64_t e0 = ((uint64_t)bh * (uint64_t)k->T + (uint64_t)t) * (uint64_t)k->T;
    ct_rng r;
    ct_rng_init(&r, k->seed, CT_RNG_DROPOUT, k->stream);
    ct_rng_seek(&r, e0 >> 2);
    for (uint64_t s = 0; s < (e0 & 3); s++) (void)ct_rng_u32(&r);
    for (int64_t j = 0; j <= t; j++) keep[j] = (uint64_t)ct_rng_u32(&r) >= k->threshold ? k->keep_scale : 0.0f;
}

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Scores s[j] = q_t . k_j * scale for j <= t; returns their maximum. */
static float row_scores(const attn_ctx *k, const float *q_t, const float *k0, int64_t t, float *s) {
    int64_t ld = 3 * k->H * k->D;
    float m = -INFINITY;
    for (int64_t j = 0; j <= t; j++) {
        s[j] = dot(q_t, k0 + j * ld, k->D) * k->scale;
        if (s[j] > m) m = s[j];
    }
    return m;
}

static void fwd_range(void *ctx, int64_t bh0, int64_t bh1) {
    const attn_ctx *k = ctx;
    int64_t T = k->T, H = k->H, D = k->D, ld = 3 * H * D;
    float *s = ct_xmalloc((size_t)(2 * T) * sizeof(float)), *keep = s + T;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        int64_t b = bh / H, h = bh % H;
        const float *q0 = k->qkv + b * T * ld + h * D, *k0 = q0 + H * D, *v0 = q0 + 2 * H * D;
        for (int64_t t = 0; t < T; t++) {
            float m = row_scores(k, q0 + t * ld, k0, t, s);
            float l = 0.0f;
            for (int64_t j = 0; j <= t; j++) l += (s[j] = expf(s[j] - m));
            row_keep(k, bh, t, keep);
            float *y = k->y + ((b * T + t) * H + h) * D, inv = 1.0f / l;
            memset(y, 0, (size_t)D * sizeof(float));
            for (int64_t j = 0; j <= t; j++) {
                float w = s[j] * inv * keep[j];
                const float *v = v0 + j * ld;
                for (int64_t d = 0; d < D; d++) y[d] += w * v[d];
            }
            k->lse[bh * T + t] = m + logf(l);
        }
    }
    free(s);
}

/* Per (b, h): dq row by row; dk and dv accumulated over the queries in increasing order. */
static void bwd_range(void *ctx, int64_t bh0, int64_t bh1) {
    const attn_ctx *k = ctx;
    int64_t T = k->T, H = k->H, D = k->D, ld = 3 * H * D;
    float *s = ct_xmalloc((size_t)(2 * T) * sizeof(float)), *keep = s + T;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        int64_t b = bh / H, h = bh % H;
        const float *q0 = k->qkv + b * T * ld + h * D, *k0 = q0 + H * D, *v0 = q0 + 2 * H * D;
        float *dq0 = k->dqkv + b * T * ld + h * D, *dk0 = dq0 + H * D, *dv0 = dq0 + 2 * H * D;
        for (int64_t t = 0; t < T; t++) {
            memset(dk0 + t * ld, 0, (size_t)D * sizeof(float));
            memset(dv0 + t * ld, 0, (size_t)D * sizeof(float));
        }
        for (int64_t t = 0; t < T; t++) {
            const float *q = q0 + t * ld, *dy = k->dy + ((b * T + t) * H + h) * D;
            const float *y = k->yin + ((b * T + t) * H + h) * D;
            float lse = k->lse_in[bh * T + t], dsum = dot(dy, y, D);
            row_scores(k, q, k0, t, s);
            row_keep(k, bh, t, keep);
            float *dq = dq0 + t * ld;
            memset(dq, 0, (size_t)D * sizeof(float));
            for (int64_t j = 0; j <= t; j++) {
                float p = expf(s[j] - lse), pk = p * keep[j];
                const float *kj = k0 + j * ld, *vj = v0 + j * ld;
                float ds = p * (keep[j] * dot(dy, vj, D) - dsum) * k->scale;
                float *dk = dk0 + j * ld, *dv = dv0 + j * ld;
                for (int64_t d = 0; d < D; d++) {
                    dq[d] += ds * kj[d];
                    dk[d] += ds * q[d];
                    dv[d] += pk * dy[d];
                }
            }
        }
    }
    free(s);
}

static attn_ctx ctx_for(int64_t T, int64_t H, int64_t D, float p, uint64_t seed, uint64_t stream) {
    attn_ctx k = {.T = T, .H = H, .D = D, .scale = (float)(1.0 / sqrt((double)D)), .p = p,
                  .keep_scale = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p),
                  .threshold = p <= 0.0f ? 0 : (uint64_t)((double)p * 4294967296.0), .seed = seed, .stream = stream};
    return k;
}

/* Work per (b, h) is about T^2 D: one task each, several when T is short. */
static int64_t attn_grain(int64_t T, int64_t D) { return ct_cpu_ceil_div(CT_CPU_GRAIN, T * T * D + 1); }

void ct_cpu_f32_causal_attention_forward(ct_backend *be, float *y, float *lse, const float *qkv, int64_t B,
                                         int64_t T, int64_t H, int64_t D, float p, uint64_t seed, uint64_t stream) {
    attn_ctx k = ctx_for(T, H, D, p, seed, stream);
    k.y = y, k.lse = lse, k.qkv = qkv;
    ct_cpu_parallel(ct_cpu_pool_of(be), B * H, attn_grain(T, D), fwd_range, &k);
}

void ct_cpu_f32_causal_attention_backward(ct_backend *be, float *dqkv, const float *dy, const float *qkv,
                                          const float *y, const float *lse, int64_t B, int64_t T, int64_t H,
                                          int64_t D, float p, uint64_t seed, uint64_t stream) {
    attn_ctx k = ctx_for(T, H, D, p, seed, stream);
    k.dqkv = dqkv, k.dy = dy, k.qkv = qkv, k.yin = y, k.lse_in = lse;
    ct_cpu_parallel(ct_cpu_pool_of(be), B * H, attn_grain(T, D), bwd_range, &k);
}

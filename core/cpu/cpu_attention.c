/* cpu_attention.c: causal multi-head attention over a fused qkv (backend.h, ct_backend_attn), the
 * CPU reference of the CUDA kernels and the CPU backend's own.
 *
 * One task per (sequence b, head h): its q, k, v columns of qkv are read, its y rows and its dq,
 * dk, dv columns of dqkv written, so tasks share nothing and no bit depends on the thread count
 * (the GEMMs inside a task run on that task's thread). A task holds the scores of its head as a
 * T x T scratch while it runs (GEMMs make the T^2 D products fast; the masked half is computed
 * and ignored); nothing of it is kept: the forward keeps the log-sum-exp per row, and the
 * backward recomputes the probabilities from q, k and it, as the GPU kernels do.
 *
 * Layouts: qkv [B, T, 3, H, D] (token (b, t): q of head h at (b T + t) 3HD + h D, k at + HD,
 * v at + 2HD), y and dy [B, T, H, D], lse [B, H, T].
 *
 * kv_attention_forward (generation over a key/value cache [B, KV, cap, D] x 2) stores the new
 * tokens' k and v, then runs one task per (b, t, kv head g): the H/KV query heads of the group
 * are the rows of one score GEMM against the cache's keys 0 .. pos0 + t, softmax per row as the
 * forward above does it, and one GEMM with the values, so a token's attention costs what the
 * cache holds, not the window. */
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

/* One (b, h)'s operands: q, k, v rows (stride 3HD) in qkv and rows of y/dy (stride HD). */
typedef struct {
    int64_t ld, ldy;
    const float *q, *k, *v;
    size_t y; /* offset of row 0 of the head in y / dy */
} head_view;

static head_view head_of(const attn_ctx *c, int64_t bh) {
    int64_t b = bh / c->H, h = bh % c->H, HD = c->H * c->D;
    head_view v = {.ld = 3 * HD, .ldy = HD};
    v.q = c->qkv + b * c->T * 3 * HD + h * c->D;
    v.k = v.q + HD;
    v.v = v.q + 2 * HD;
    v.y = (size_t)(b * c->T * HD + h * c->D);
    return v;
}

/* S [T, T] = q k^T / sqrt(D) for every pair; only j <= t is used. One GEMM: the T^2 D products
 * at BLAS speed beat skipping the masked half. */
static void scores(const attn_ctx *c, const head_view *v, float *S) {
    ct_cpu_sgemm(false, true, c->T, c->T, c->D, c->scale, v->q, v->ld, v->k, v->ld, 0.0f, S, c->T);
}

static void fwd_range(void *ctx, int64_t bh0, int64_t bh1) {
    const attn_ctx *c = ctx;
    int64_t T = c->T, D = c->D;
    float *S = ct_xmalloc((size_t)(T * T + T) * sizeof(float)), *keep = S + T * T;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        head_view v = head_of(c, bh);
        scores(c, &v, S);
        for (int64_t t = 0; t < T; t++) {
            float *row = S + t * T, m = -INFINITY, l = 0.0f;
            for (int64_t j = 0; j <= t; j++) m = row[j] > m ? row[j] : m;
            for (int64_t j = 0; j <= t; j++) l += (row[j] = expf(row[j] - m));
            row_keep(c, bh, t, keep);
            float inv = 1.0f / l;
            for (int64_t j = 0; j <= t; j++) row[j] *= inv * keep[j];
            for (int64_t j = t + 1; j < T; j++) row[j] = 0.0f;
            c->lse[bh * T + t] = m + logf(l);
        }
        /* y [T, D] (rows HD apart) = P keep v */
        ct_cpu_sgemm(false, false, T, D, T, 1.0f, S, T, v.v, v.ld, 0.0f, c->y + v.y, v.ldy);
    }
    free(S);
}

/* Per (b, h), with P = exp(S - lse) recomputed: dP = dy v^T, dS = P (keep dP - dy . y) / sqrt(D),
 * dq = dS k, dk = dS^T q, dv = (P keep)^T dy: five GEMMs over T x T. */
static void bwd_range(void *ctx, int64_t bh0, int64_t bh1) {
    const attn_ctx *c = ctx;
    int64_t T = c->T, D = c->D;
    float *P = ct_xmalloc((size_t)(2 * T * T + T) * sizeof(float)), *dS = P + T * T, *keep = dS + T * T;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        head_view v = head_of(c, bh);
        const float *dy = c->dy + v.y, *y = c->yin + v.y;
        scores(c, &v, P);
        ct_cpu_sgemm(false, true, T, T, D, 1.0f, dy, v.ldy, v.v, v.ld, 0.0f, dS, T);
        for (int64_t t = 0; t < T; t++) {
            float *p = P + t * T, *ds = dS + t * T, lse = c->lse_in[bh * T + t];
            float dsum = dot(dy + t * v.ldy, y + t * v.ldy, D);
            row_keep(c, bh, t, keep);
            for (int64_t j = 0; j <= t; j++) {
                p[j] = expf(p[j] - lse);
                ds[j] = p[j] * (keep[j] * ds[j] - dsum) * c->scale;
                p[j] *= keep[j];
            }
            for (int64_t j = t + 1; j < T; j++) p[j] = ds[j] = 0.0f;
        }
        float *dq = c->dqkv + (v.q - c->qkv), *dk = c->dqkv + (v.k - c->qkv), *dv = c->dqkv + (v.v - c->qkv);
        ct_cpu_sgemm(false, false, T, D, T, 1.0f, dS, T, v.k, v.ld, 0.0f, dq, v.ld);
        ct_cpu_sgemm(true, false, T, D, T, 1.0f, dS, T, v.q, v.ld, 0.0f, dk, v.ld);
        ct_cpu_sgemm(true, false, T, D, T, 1.0f, P, T, dy, v.ldy, 0.0f, dv, v.ld);
    }
    free(P);
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

/* ---- attention over a key/value cache ---- */

typedef struct {
    float *y;
    const float *qkv, *K, *V;    /* K, V: the caches [B, KV, cap, D] */
    int64_t T, pos0, cap, H, KV, D;
    float scale;
} kv_ctx;

/* Tasks (b, t, g): the H/KV query heads of kv head g for token (b, t), rows of one score GEMM
 * against keys 0 .. pos0 + t, then of one GEMM with the values (y's heads of the group are
 * contiguous, as their q rows are). */
static void kv_range(void *ctx, int64_t i0, int64_t i1) {
    const kv_ctx *c = ctx;
    int64_t H = c->H, KV = c->KV, D = c->D, rep = H / KV, HD = H * D;
    float *S = ct_xmalloc((size_t)(rep * (c->pos0 + c->T)) * sizeof(float));
    for (int64_t i = i0; i < i1; i++) {
        int64_t g = i % KV, bt = i / KV, b = bt / c->T, t = bt % c->T, L = c->pos0 + t + 1;
        const float *q = c->qkv + bt * 3 * HD + g * rep * D;
        size_t head = (size_t)((b * KV + g) * c->cap * D);
        ct_cpu_sgemm(false, true, rep, L, D, c->scale, q, D, c->K + head, D, 0.0f, S, L);
        for (int64_t r = 0; r < rep; r++) {
            float *row = S + r * L, m = -INFINITY, l = 0.0f;
            for (int64_t j = 0; j < L; j++) m = row[j] > m ? row[j] : m;
            for (int64_t j = 0; j < L; j++) l += (row[j] = expf(row[j] - m));
            float inv = 1.0f / l;
            for (int64_t j = 0; j < L; j++) row[j] *= inv;
        }
        ct_cpu_sgemm(false, false, rep, D, L, 1.0f, S, L, c->V + head, D, 0.0f, c->y + bt * HD + g * rep * D, D);
    }
    free(S);
}

void ct_cpu_f32_kv_attention_forward(ct_backend *be, float *y, float *kv, const float *qkv, int64_t B, int64_t T,
                                     int64_t pos0, int64_t cap, int64_t H, int64_t KV, int64_t D) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    if (KV <= 0 || H % KV || pos0 < 0 || pos0 + T > cap)
        ct_fatal("kv_attention: %lld heads, %lld kv heads, tokens %lld..%lld of a cache of %lld: kv heads must "
                 "divide heads and the tokens fit the cache", (long long)H, (long long)KV, (long long)pos0,
                 (long long)(pos0 + T - 1), (long long)cap);
    int64_t rep = H / KV, HD = H * D;
    float *K = kv, *V = kv + B * KV * cap * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t g = 0; g < KV; g++) {
                const float *src = qkv + (b * T + t) * 3 * HD + g * rep * D;
                size_t at = (size_t)(((b * KV + g) * cap + pos0 + t) * D);
                memcpy(K + at, src + HD, (size_t)D * sizeof(float));
                memcpy(V + at, src + 2 * HD, (size_t)D * sizeof(float));
            }
    if (!y) return;
    kv_ctx c = {.y = y, .qkv = qkv, .K = K, .V = V, .T = T, .pos0 = pos0, .cap = cap, .H = H, .KV = KV, .D = D,
                .scale = (float)(1.0 / sqrt((double)D))};
    int64_t work = rep * (pos0 + T) * D * 2;
    ct_cpu_parallel(ct_cpu_pool_of(be), B * T * KV, ct_cpu_ceil_div(CT_CPU_GRAIN, work + 1), kv_range, &c);
}

/* cpu_rope.c: rotary position embeddings and grouped-query heads (backend.h, rope_gqa_forward and
 * rope_gqa_backward): from a fused projection [B, T, H + 2 KV, D] to the attention's
 * [B, T, 3, H, D] and back.
 *
 * One task per position t: it computes the cosines and sines of t's angles (a block of at most
 * PAIRS frequencies at a time, in double from the fp32 angle, rounded once) and applies them to
 * every sequence and head at t, so tasks share nothing and no bit depends on the thread count. The
 * frequencies follow transformers' fp32 steps (backend.h); the rotation pairs element i of a head
 * with element i + D/2 (Hugging Face's rotate_half), so Hugging Face's q_proj and k_proj rows load
 * as they are. Backward sums a kv head's gradients over its query heads in head order (fp32), then
 * rotates the sum back. */
#include <math.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

enum { PAIRS = 64 };           /* frequencies per block of cosines and sines */
enum { MAX_PAIRS = 1024 };     /* head dims up to 2048 (the attention takes 128) */

typedef struct {
    float *out;
    const float *in;
    int64_t B, T, H, KV, D;
    const ct_rope *r;
    float freq[MAX_PAIRS];     /* the D / 2 frequencies, computed once per call */
} rope_ctx;

/* Frequency i of D / 2, transformers' fp32 steps: 1 / theta^(2i / D), then / factor. */
static float frequency(const ct_rope *r, int64_t i, int64_t D) {
    float e = (float)(2 * i) / (float)D;
    float f = 1.0f / (float)pow((double)(float)r->theta, (double)e);
    return r->factor != 1.0 ? f / (float)r->factor : f;
}

/* cos and sin of the angles of pairs [i0, i0 + n) at position t. */
static void angles(const rope_ctx *k, int64_t t, int64_t i0, int64_t n, float *c, float *s) {
    float pos = (float)(k->r->pos0 + t);
    for (int64_t i = 0; i < n; i++) {
        float a = pos * k->freq[i0 + i];
        c[i] = (float)cos((double)a);
        s[i] = (float)sin((double)a);
    }
}

/* y = x turned by the angles (sign +1) or back (sign -1), pairs [i0, i0 + n) of one head. */
static void turn(float *y, const float *x, int64_t half, int64_t i0, int64_t n, const float *c, const float *s,
                 bool back) {
    const float *x1 = x + i0, *x2 = x + half + i0;
    float *y1 = y + i0, *y2 = y + half + i0;
    if (back)
        for (int64_t i = 0; i < n; i++) {
            float a = x1[i], b = x2[i];
            y1[i] = a * c[i] + b * s[i];
            y2[i] = b * c[i] - a * s[i];
        }
    else
        for (int64_t i = 0; i < n; i++) {
            float a = x1[i], b = x2[i];
            y1[i] = a * c[i] - b * s[i];
            y2[i] = b * c[i] + a * s[i];
        }
}

static void fwd_range(void *ctxp, int64_t t0, int64_t t1) {
    const rope_ctx *k = ctxp;
    int64_t H = k->H, KV = k->KV, D = k->D, rep = H / KV, half = D / 2;
    bool rotate = k->r->theta != 0.0;
    float c[PAIRS], s[PAIRS];
    for (int64_t t = t0; t < t1; t++)
        for (int64_t b = 0; b < k->B; b++) {
            const float *x = k->in + (b * k->T + t) * (H + 2 * KV) * D;
            float *y = k->out + (b * k->T + t) * 3 * H * D;
            /* q, then k rotated once per kv head; v copied */
            memcpy(y, x, (size_t)(H * D) * sizeof(float));
            for (int64_t g = 0; g < KV; g++) memcpy(y + (H + g * rep) * D, x + (H + g) * D, (size_t)D * sizeof(float));
            for (int64_t i0 = 0; rotate && i0 < half; i0 += PAIRS) {
                int64_t n = half - i0 < PAIRS ? half - i0 : PAIRS;
                angles(k, t, i0, n, c, s);
                for (int64_t h = 0; h < H; h++) turn(y + h * D, x + h * D, half, i0, n, c, s, false);
                for (int64_t g = 0; g < KV; g++) turn(y + (H + g * rep) * D, x + (H + g) * D, half, i0, n, c, s, false);
            }
            for (int64_t h = 0; h < H; h++) {
                int64_t g = h / rep;
                if (h % rep) memcpy(y + (H + h) * D, y + (H + g * rep) * D, (size_t)D * sizeof(float));
                memcpy(y + (2 * H + h) * D, x + (H + KV + g) * D, (size_t)D * sizeof(float));
            }
        }
}

/* sum[D] = the gradients of the rep query heads of kv head g, in head order (fp32). */
static void group_sum(float *sum, const float *d, int64_t g, int64_t rep, int64_t D) {
    memcpy(sum, d + g * rep * D, (size_t)D * sizeof(float));
    for (int64_t h = 1; h < rep; h++) {
        const float *o = d + (g * rep + h) * D;
        for (int64_t i = 0; i < D; i++) sum[i] += o[i];
    }
}

static void bwd_range(void *ctxp, int64_t t0, int64_t t1) {
    const rope_ctx *k = ctxp;
    int64_t H = k->H, KV = k->KV, D = k->D, rep = H / KV, half = D / 2;
    bool rotate = k->r->theta != 0.0;
    float c[PAIRS], s[PAIRS];
    for (int64_t t = t0; t < t1; t++)
        for (int64_t b = 0; b < k->B; b++) {
            const float *d = k->in + (b * k->T + t) * 3 * H * D;
            float *dx = k->out + (b * k->T + t) * (H + 2 * KV) * D;
            /* dx's k rows first hold the group sums, rotated back in place below (a pair is read
             * before it is written) */
            memcpy(dx, d, (size_t)(H * D) * sizeof(float));
            for (int64_t g = 0; g < KV; g++) {
                group_sum(dx + (H + g) * D, d + H * D, g, rep, D);
                group_sum(dx + (H + KV + g) * D, d + 2 * H * D, g, rep, D);
            }
            for (int64_t i0 = 0; rotate && i0 < half; i0 += PAIRS) {
                int64_t n = half - i0 < PAIRS ? half - i0 : PAIRS;
                angles(k, t, i0, n, c, s);
                for (int64_t h = 0; h < H + KV; h++) turn(dx + h * D, dx + h * D, half, i0, n, c, s, true);
            }
        }
}

static void run(ct_backend *be, float *out, const float *in, int64_t B, int64_t T, int64_t H, int64_t KV,
                int64_t D, const ct_rope *r, ct_cpu_range_fn fn) {
    if (B <= 0 || T <= 0 || H <= 0 || KV <= 0 || D <= 0) return;
    if (H % KV || D / 2 > MAX_PAIRS) ct_fatal("rope_gqa: %lld heads, %lld kv heads, head dim %lld: kv heads must "
                                              "divide heads and the head dim be at most %d", (long long)H,
                                              (long long)KV, (long long)D, 2 * MAX_PAIRS);
    rope_ctx k = {.out = out, .in = in, .B = B, .T = T, .H = H, .KV = KV, .D = D, .r = r};
    for (int64_t i = 0; r->theta != 0.0 && i < D / 2; i++) k.freq[i] = frequency(r, i, D);
    int64_t per_t = B * (5 * H + 2 * KV) * D;
    ct_cpu_parallel(ct_cpu_pool_of(be), T, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, per_t), fn, &k);
}

void ct_cpu_f32_rope_gqa_forward(ct_backend *be, float *qkv, const float *x, int64_t B, int64_t T, int64_t H,
                                 int64_t KV, int64_t D, const ct_rope *r) {
    run(be, qkv, x, B, T, H, KV, D, r, fwd_range);
}

void ct_cpu_f32_rope_gqa_backward(ct_backend *be, float *dx, const float *dqkv, int64_t B, int64_t T, int64_t H,
                                  int64_t KV, int64_t D, const ct_rope *r) {
    run(be, dx, dqkv, B, T, H, KV, D, r, bwd_range);
}

/* cpu_dtype.c: the CPU backend's ops on fp32, fp16 and bf16 storage.
 *
 * The kernels in the other cpu_*.c files compute on fp32 arrays (ct_cpu_f32_*). An op called
 * with dt == CT_F32 goes straight to them. With a 16-bit dt, each 16-bit argument is widened
 * exactly into a scratch buffer (F16C where present, through the cast op, over the thread pool),
 * the fp32 kernel runs, and each 16-bit output is rounded once, to nearest even, as it is stored
 * back. This is by construction "the fp32 op on the widened inputs, then round": the definition of
 * a 16-bit op in backend.h, and what test_ops checks bit for bit. The extra passes are
 * memory-bound and small next to the GEMMs (docs/BENCHMARKS.md).
 *
 * Every op is one entry of CPU_DTYPE_OPS below, which generates its wrapper and installs it.
 *
 * Scratch: CT_CPU_SLOTS growable buffers in the backend (ct_cpu.slot), reused by every call: no
 * allocation per call once they have grown. Ops are called from one thread at a time. */
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

/* Scratch slot s with room for n floats (grown on demand, contents not kept; counted as
 * workspace in mem_stats, except on the capped device: ct_cpu_scratch_alloc). */
float *ct_cpu_scratch(ct_backend *be, int s, int64_t n) {
    ct_cpu *cpu = be->impl;
    size_t need = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
    if (cpu->slot_cap[s] < need) {
        be->mem.free(be, cpu->slot[s]);
        cpu->slot[s] = ct_cpu_scratch_alloc(be, need);
        if (!cpu->slot[s]) ct_die_oom(need);
        cpu->slot_cap[s] = need;
    }
    return cpu->slot[s];
}

/* fp32 view of input x[n] in dt (NULL stays NULL). */
static const float *in32(ct_backend *be, int s, const void *x, int64_t n, ct_dtype dt) {
    if (!x || dt == CT_F32) return x;
    float *w = ct_cpu_scratch(be, s, n);
    be->elt.cast(be, w, CT_F32, x, dt, n);
    return w;
}

/* fp32 buffer for output y[n] in dt: y itself in fp32, else scratch (read = true: widened first,
 * for outputs the op also reads). */
static float *out32(ct_backend *be, int s, void *y, int64_t n, ct_dtype dt, bool read) {
    if (!y || dt == CT_F32) return y;
    float *w = ct_cpu_scratch(be, s, n);
    if (read) be->elt.cast(be, w, CT_F32, y, dt, n);
    return w;
}

/* The outputs of one call that live in scratch until the kernel has run. */
typedef struct {
    void *y[CT_CPU_SLOTS];
    const float *w[CT_CPU_SLOTS];
    int64_t n[CT_CPU_SLOTS];
    int count;
} pending;

static float *remember(pending *p, void *y, float *w, int64_t n) {
    p->y[p->count] = y, p->w[p->count] = w, p->n[p->count] = n;
    p->count++;
    return w;
}

/* Store every scratch output back into its 16-bit array, rounding once. */
static void store_all(ct_backend *be, const pending *p, ct_dtype dt) {
    for (int i = 0; i < p->count; i++)
        if (p->y[i] && dt != CT_F32) be->elt.cast(be, p->y[i], dt, p->w[i], CT_F32, p->n[i]);
}

/* ---- what the list's entries say about their 16-bit arguments ----
 * Each one is a statement run in the order listed, before the fp32 kernel; the k-th converted
 * argument uses scratch slot k (outputs are listed first, so they take slot 0; an op converts at
 * most CT_CPU_SLOTS arguments).
 *   IN(p, n)     input p (n elements) is widened into scratch; the kernel reads F(p)
 *   OUT(p, n)    output p: the kernel writes F(p) (scratch), which is rounded into p afterwards
 *   INOUT(p, n)  output the kernel also reads: widened before, rounded back afterwards
 *   DIRECT(e)    e handles the call without widening (returns true then): 16-bit data that is
 *                only moved, or work that needs no conversion
 *   BEFORE(s)    statement s runs first (e.g. drops an input the kernel will not read)
 *   NONE         no argument is converted (the call moves 16-bit data as it is)
 * With dt == CT_F32 none of them copies anything: F(p) is p. */
#define F(p) p##_f32
#define IN(p, n) const float *F(p) = in32(be, slot++, p, n, dt);
#define OUT(p, n) float *F(p) = remember(&out, p, out32(be, slot++, p, n, dt, false), n);
#define INOUT(p, n) float *F(p) = remember(&out, p, out32(be, slot++, p, n, dt, true), n);
#define DIRECT(e) if (e) return;
#define BEFORE(s) s;
#define NONE

/* ---- helpers of the entries ---- */

static int64_t inner1(int64_t inner) { return inner > 1 ? inner : 1; }
static int64_t conv_in_numel(const ct_conv2d_geom *g) { return g->c * g->h * g->w; }
static int64_t conv_w_numel(const ct_conv2d_geom *g) { return g->oc * (g->c / g->groups) * g->kh * g->kw; }
static int64_t conv_out_numel(const ct_conv2d_geom *g) { return g->n * g->oc * g->oh * g->ow; }
/* The fused 2x2 max-pool's output (conv2d_act_pool) */
static int64_t conv_pool_numel(const ct_conv2d_geom *g) { return g->n * g->oc * (g->oh / 2) * (g->ow / 2); }
static int64_t conv_col_numel(const ct_conv2d_geom *g) {
    return g->c / g->groups * g->kh * g->kw * g->oh * g->ow;
}
static int64_t pool_in(const ct_pool2d_geom *g) { return g->n * g->c * g->h * g->w; }
static int64_t pool_out(const ct_pool2d_geom *g) { return g->n * g->c * g->oh * g->ow; }
/* Elements from the first row's start to the last row's end of a strided [rows, cols] block. */
static int64_t rows_span(int64_t rows, int64_t ld, int64_t cols) { return (rows - 1) * ld + cols; }

/* copy_rows without conversion: nothing to do, fp32, or a plain copy, which moves 16-bit values
 * unchanged. Only the accumulating 16-bit form is widened: the rows' span of y is widened, summed
 * and stored back; elements between the rows round-trip exactly. */
static bool copy_rows_direct(ct_backend *be, void *y, int64_t ldy, const void *x, int64_t ldx,
                             int64_t rows, int64_t cols, bool accumulate, ct_dtype dt) {
    if (rows <= 0 || cols <= 0) return true;
    if (dt == CT_F32) {
        ct_cpu_f32_copy_rows(be, y, ldy, x, ldx, rows, cols, accumulate);
        return true;
    }
    if (accumulate) return false;
    size_t es = ct_dtype_size(dt);
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)y + (size_t)(r * ldy) * es, (const char *)x + (size_t)(r * ldx) * es, (size_t)cols * es);
    return true;
}

/* Which of x and y the fp32 kernel reads for act (the other is passed as NULL, so it is not
 * widened: ReLU prefers x, tanh/sigmoid prefer y, GELU/SiLU need x). */
static void act_backward_inputs(ct_act act, const void **x, const void **y, ct_dtype dt) {
    if (dt == CT_F32) return;
    switch (act) {
    case CT_ACT_NONE: *x = *y = NULL; break;
    case CT_ACT_RELU:
    case CT_ACT_LEAKY_RELU: if (*x) *y = NULL; break;
    case CT_ACT_TANH:
    case CT_ACT_SIGMOID: if (*y) *x = NULL; break;
    default: *y = NULL; break;
    }
}

/* An embedding lookup copies 16-bit rows unchanged; as the fp32 kernel, a negative id reads as
 * zeros (the data pipeline validates the rest). */
static void embedding_lookup(ct_backend *be, void *y, const int32_t *ids, const void *table, int64_t n_ids,
                             int64_t dim, ct_dtype dt) {
    if (dt == CT_F32) {
        ct_cpu_f32_embedding_forward(be, y, ids, table, n_ids, dim);
        return;
    }
    size_t row = (size_t)dim * ct_dtype_size(dt);
    for (int64_t i = 0; i < n_ids; i++) {
        char *dst = (char *)y + (size_t)i * row;
        if (ids[i] < 0) memset(dst, 0, row);
        else memcpy(dst, (const char *)table + (size_t)ids[i] * row, row);
    }
}

/* The losses' result pair stays in "device" (host) memory: result[0] the mean loss, result[1] the
 * correct predictions (cross entropy) or 0. */
static void xent_f32(ct_backend *be, float *dlogits, float *result, const float *logits, const int32_t *labels,
                     int64_t rows, int64_t classes, int64_t ld, float label_smoothing, float grad_scale) {
    int64_t correct = 0;
    ct_cpu_f32_softmax_xent(be, dlogits, &result[0], &correct, logits, labels, rows, classes, ld, label_smoothing,
                            grad_scale);
    result[1] = (float)correct;
}

static void mse_f32(ct_backend *be, float *dpred, float *result, const float *pred, const float *target,
                    int64_t n_rows, int64_t n_cols, float grad_scale) {
    ct_cpu_f32_mse_loss(be, dpred, &result[0], pred, target, n_rows, n_cols, grad_scale);
    result[1] = 0.0f;
}

static void bce_f32(ct_backend *be, float *dlogits, float *result, const float *logits, const float *target,
                    int64_t n_rows, int64_t n_cols, float grad_scale) {
    ct_cpu_f32_bce_logits_loss(be, dlogits, &result[0], logits, target, n_rows, n_cols, grad_scale);
    result[1] = 0.0f;
}

/* data.transform.on_device: the same expression as the datasets' host tables. */
static int64_t u8_numel(const ct_u8_normalize *p) { return p->n * p->c * p->h * p->w; }
static void normalize_u8_f32(float *y, const uint8_t *x, const uint8_t *flip, const ct_u8_normalize *p) {
    int64_t plane = p->h * p->w;
    for (int64_t i = 0; i < p->n; i++)
        for (int64_t ch = 0; ch < p->c; ch++) {
            float lut[256];
            for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - p->mean[ch]) / p->std[ch];
            const uint8_t *src = x + (i * p->c + ch) * plane;
            float *dst = y + (i * p->c + ch) * plane;
            bool mirror = flip && flip[i];
            for (int64_t r = 0; r < p->h; r++)
                for (int64_t col = 0; col < p->w; col++)
                    dst[r * p->w + col] = lut[src[r * p->w + (mirror ? p->w - 1 - col : col)]];
        }
}

/* ---- the list: one entry per op ----
 *   OP(table, name, (parameters after `be`), what happens to the arguments, fp32 kernel call)
 * Arguments not named in the third column (fp32 gradients and statistics, masks, ids, targets)
 * are passed to the kernel as they are. */
#define CPU_DTYPE_OPS(OP)                                                                                              \
    /* element-wise */                                                                                                 \
    OP(elt, fill, (void *x, float v, int64_t n, ct_dtype dt),                                                          \
       OUT(x, n),                                                                                                      \
       ct_cpu_f32_fill(be, F(x), v, n))                                                                                \
    OP(elt, scale, (void *x, float s, int64_t n, ct_dtype dt),                                                         \
       INOUT(x, n),                                                                                                    \
       ct_cpu_f32_scale(be, F(x), s, n))                                                                               \
    OP(elt, axpy, (void *y, float a, const void *x, int64_t n, ct_dtype dt),                                           \
       INOUT(y, n) IN(x, n),                                                                                           \
       ct_cpu_f32_axpy(be, F(y), a, F(x), n))                                                                          \
    OP(elt, add, (void *y, const void *a, const void *b, int64_t n, ct_dtype dt),                                      \
       OUT(y, n) IN(a, n) IN(b, n),                                                                                    \
       ct_cpu_f32_add(be, F(y), F(a), F(b), n))                                                                        \
    OP(elt, copy_rows,                                                                                                 \
       (void *y, int64_t ldy, const void *x, int64_t ldx, int64_t rows, int64_t cols, bool accumulate,                 \
        ct_dtype dt),                                                                                                  \
       DIRECT(copy_rows_direct(be, y, ldy, x, ldx, rows, cols, accumulate, dt))                                        \
       INOUT(y, rows_span(rows, ldy, cols)) IN(x, rows_span(rows, ldx, cols)),                                         \
       ct_cpu_f32_copy_rows(be, F(y), ldy, F(x), ldx, rows, cols, true))                                               \
    OP(elt, normalize_u8, (void *y, const uint8_t *x, const uint8_t *flip, const ct_u8_normalize *p, ct_dtype dt),     \
       OUT(y, u8_numel(p)),                                                                                            \
       normalize_u8_f32(F(y), x, flip, p))                                                                             \
    OP(elt, bias_act_forward,                                                                                          \
       (void *x, const void *bias, int64_t rows, int64_t cols, int64_t inner, ct_act act, float alpha, ct_dtype dt),   \
       INOUT(x, rows * cols * inner1(inner)) IN(bias, cols),                                                           \
       ct_cpu_f32_bias_act_forward(be, F(x), F(bias), rows, cols, inner, act, alpha))                                  \
    OP(elt, bias_backward, (float *db, const void *dy, int64_t rows, int64_t cols, int64_t inner, ct_dtype dt),        \
       IN(dy, rows * cols * inner1(inner)),                                                                            \
       ct_cpu_f32_bias_backward(be, db, F(dy), rows, cols, inner))                                                     \
    OP(elt, act_forward, (void *y, const void *x, int64_t n, ct_act act, float alpha, ct_dtype dt),                    \
       OUT(y, n) IN(x, n),                                                                                             \
       ct_cpu_f32_act_forward(be, F(y), F(x), n, act, alpha))                                                          \
    OP(elt, act_backward,                                                                                              \
       (void *dx, const void *dy, const void *x, const void *y, int64_t n, ct_act act, float alpha, ct_dtype dt),      \
       BEFORE(act_backward_inputs(act, &x, &y, dt)) OUT(dx, n) IN(dy, n) IN(x, n) IN(y, n),                            \
       ct_cpu_f32_act_backward(be, F(dx), F(dy), F(x), F(y), n, act, alpha))                                           \
    OP(elt, dropout_forward,                                                                                           \
       (void *y, uint8_t *mask, const void *x, int64_t n, float p, uint64_t seed, uint64_t stream, ct_dtype dt),       \
       OUT(y, n) IN(x, n),                                                                                             \
       ct_cpu_f32_dropout_forward(be, F(y), mask, F(x), n, p, seed, stream))                                           \
    OP(elt, dropout_backward, (void *dx, const void *dy, const uint8_t *mask, int64_t n, float p, ct_dtype dt),        \
       OUT(dx, n) IN(dy, n),                                                                                           \
       ct_cpu_f32_dropout_backward(be, F(dx), F(dy), mask, n, p))                                                      \
    /* embedding */                                                                                                    \
    OP(embed, embedding_forward,                                                                                       \
       (void *y, const int32_t *ids, const void *table, int64_t n_ids, int64_t dim, ct_dtype dt),                      \
       NONE,                                                                                                           \
       embedding_lookup(be, y, ids, table, n_ids, dim, dt))                                                            \
    OP(embed, embedding_backward,                                                                                      \
       (float *dtable, const void *dy, const int32_t *ids, int64_t n_ids, int64_t vocab, int64_t dim, ct_dtype dt),    \
       IN(dy, n_ids * dim),                                                                                            \
       ct_cpu_f32_embedding_backward(be, dtable, F(dy), ids, n_ids, vocab, dim))                                       \
    /* convolution and pooling */                                                                                      \
    OP(conv, im2col, (void *col, const void *img, const ct_conv2d_geom *g, int64_t group, ct_dtype dt),                \
       OUT(col, conv_col_numel(g)) IN(img, conv_in_numel(g)),                                                          \
       ct_cpu_f32_im2col(be, F(col), F(img), g, group))                                                                \
    OP(conv, col2im, (void *img, const void *col, const ct_conv2d_geom *g, int64_t group, ct_dtype dt),                \
       INOUT(img, conv_in_numel(g)) IN(col, conv_col_numel(g)),                                                        \
       ct_cpu_f32_col2im(be, F(img), F(col), g, group))                                                                \
    OP(conv, conv2d_forward,                                                                                           \
       (void *y, const void *x, const void *w, const void *bias, const ct_conv2d_geom *g, ct_dtype dt),                \
       OUT(y, conv_out_numel(g)) IN(x, g->n * conv_in_numel(g)) IN(w, conv_w_numel(g)) IN(bias, g->oc),                \
       ct_cpu_f32_conv2d_forward(be, F(y), F(x), F(w), F(bias), g))                                                    \
    OP(conv, conv2d_backward,                                                                                          \
       (void *dx, float *dw, float *db, const void *dy, const void *x, const void *w, const ct_conv2d_geom *g,         \
        ct_dtype dt),                                                                                                  \
       OUT(dx, g->n * conv_in_numel(g)) IN(dy, conv_out_numel(g)) IN(x, g->n * conv_in_numel(g))                       \
       IN(w, conv_w_numel(g)),                                                                                         \
       ct_cpu_f32_conv2d_backward(be, F(dx), dw, db, F(dy), F(x), F(w), g))                                            \
    OP(conv, conv2d_act_forward,                                                                                       \
       (void *y, const void *x, const void *w, const void *bias, const ct_conv2d_geom *g, ct_act act, ct_dtype dt),    \
       OUT(y, conv_out_numel(g)) IN(x, g->n * conv_in_numel(g)) IN(w, conv_w_numel(g)) IN(bias, g->oc),                \
       ct_cpu_f32_conv2d_act_forward(be, F(y), F(x), F(w), F(bias), g, act))                                           \
    OP(conv, conv2d_act_backward,                                                                                      \
       (void *dx, float *dw, float *db, const void *dy, const void *y, const void *x, const void *w,                   \
        const ct_conv2d_geom *g, ct_act act, ct_dtype dt),                                                             \
       OUT(dx, g->n * conv_in_numel(g)) IN(dy, conv_out_numel(g)) IN(y, conv_out_numel(g))                             \
       IN(x, g->n * conv_in_numel(g)) IN(w, conv_w_numel(g)),                                                          \
       ct_cpu_f32_conv2d_act_backward(be, F(dx), dw, db, F(dy), F(y), F(x), F(w), g, act))                             \
    OP(conv, conv2d_act_pool_forward,                                                                                  \
       (void *y, int32_t *argmax, const void *x, const void *w, const void *bias, const ct_conv2d_geom *g, ct_act act, \
        ct_dtype dt),                                                                                                  \
       OUT(y, conv_pool_numel(g)) IN(x, g->n * conv_in_numel(g)) IN(w, conv_w_numel(g)) IN(bias, g->oc),               \
       ct_cpu_f32_conv2d_act_pool_forward(be, F(y), argmax, F(x), F(w), F(bias), g, act, dt))                          \
    OP(conv, conv2d_act_pool_backward,                                                                                 \
       (void *dx, float *dw, float *db, const void *dy, const void *y, const int32_t *argmax, const void *x,           \
        const void *w, const ct_conv2d_geom *g, ct_act act, ct_dtype dt),                                              \
       OUT(dx, g->n * conv_in_numel(g)) IN(dy, conv_pool_numel(g)) IN(y, conv_pool_numel(g))                           \
       IN(x, g->n * conv_in_numel(g)) IN(w, conv_w_numel(g)),                                                          \
       ct_cpu_f32_conv2d_act_pool_backward(be, F(dx), dw, db, F(dy), F(y), argmax, F(x), F(w), g, act))                \
    OP(conv, maxpool2d_forward, (void *y, int32_t *argmax, const void *x, const ct_pool2d_geom *g, ct_dtype dt),       \
       OUT(y, pool_out(g)) IN(x, pool_in(g)),                                                                          \
       ct_cpu_f32_maxpool2d_forward(be, F(y), argmax, F(x), g))                                                        \
    OP(conv, maxpool2d_backward,                                                                                       \
       (void *dx, const void *dy, const int32_t *argmax, const ct_pool2d_geom *g, ct_dtype dt),                        \
       OUT(dx, pool_in(g)) IN(dy, pool_out(g)),                                                                        \
       ct_cpu_f32_maxpool2d_backward(be, F(dx), F(dy), argmax, g))                                                     \
    OP(conv, avgpool2d_forward, (void *y, const void *x, const ct_pool2d_geom *g, ct_dtype dt),                        \
       OUT(y, pool_out(g)) IN(x, pool_in(g)),                                                                          \
       ct_cpu_f32_avgpool2d_forward(be, F(y), F(x), g))                                                                \
    OP(conv, avgpool2d_backward, (void *dx, const void *dy, const ct_pool2d_geom *g, ct_dtype dt),                     \
       OUT(dx, pool_in(g)) IN(dy, pool_out(g)),                                                                        \
       ct_cpu_f32_avgpool2d_backward(be, F(dx), F(dy), g))                                                             \
    /* normalization */                                                                                                \
    OP(norm, batchnorm_forward,                                                                                        \
       (void *y, const void *x, const void *gamma, const void *beta, float *running_mean, float *running_var,          \
        float *save_mean, float *save_invstd, int64_t n, int64_t c, int64_t hw, float eps, float momentum,             \
        bool train, ct_dtype dt),                                                                                      \
       OUT(y, n * c * hw) IN(x, n * c * hw) IN(gamma, c) IN(beta, c),                                                  \
       ct_cpu_f32_batchnorm_forward(be, F(y), F(x), F(gamma), F(beta), running_mean, running_var, save_mean,           \
                                    save_invstd, n, c, hw, eps, momentum, train))                                      \
    OP(norm, batchnorm_backward,                                                                                       \
       (void *dx, float *dgamma, float *dbeta, const void *dy, const void *x, const void *gamma,                       \
        const float *save_mean, const float *save_invstd, int64_t n, int64_t c, int64_t hw, ct_dtype dt),              \
       OUT(dx, n * c * hw) IN(dy, n * c * hw) IN(x, n * c * hw) IN(gamma, c),                                          \
       ct_cpu_f32_batchnorm_backward(be, F(dx), dgamma, dbeta, F(dy), F(x), F(gamma), save_mean, save_invstd,          \
                                     n, c, hw))                                                                        \
    OP(norm, layernorm_forward,                                                                                        \
       (void *y, float *save_mean, float *save_rstd, const void *x, const void *gamma, const void *beta,               \
        int64_t rows, int64_t d, float eps, ct_dtype dt),                                                              \
       OUT(y, rows * d) IN(x, rows * d) IN(gamma, d) IN(beta, d),                                                      \
       ct_cpu_f32_layernorm_forward(be, F(y), save_mean, save_rstd, F(x), F(gamma), F(beta), rows, d, eps))            \
    OP(norm, layernorm_backward,                                                                                       \
       (void *dx, float *dgamma, float *dbeta, const void *dy, const void *x, const void *gamma,                       \
        const float *save_mean, const float *save_rstd, int64_t rows, int64_t d, ct_dtype dt),                         \
       OUT(dx, rows * d) IN(dy, rows * d) IN(x, rows * d) IN(gamma, d),                                                \
       ct_cpu_f32_layernorm_backward(be, F(dx), dgamma, dbeta, F(dy), F(x), F(gamma), save_mean, save_rstd,            \
                                     rows, d))                                                                         \
    /* attention */                                                                                                    \
    OP(attn, causal_attention_forward,                                                                                 \
       (void *y, float *lse, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D, float p, uint64_t seed,      \
        uint64_t stream, ct_dtype dt),                                                                                 \
       OUT(y, B * T * H * D) IN(qkv, B * T * 3 * H * D),                                                               \
       ct_cpu_f32_causal_attention_forward(be, F(y), lse, F(qkv), B, T, H, D, p, seed, stream))                        \
    OP(attn, causal_attention_backward,                                                                                \
       (void *dqkv, const void *dy, const void *qkv, const void *y, const float *lse, int64_t B, int64_t T, int64_t H,  \
        int64_t D, float p, uint64_t seed, uint64_t stream, ct_dtype dt),                                              \
       OUT(dqkv, B * T * 3 * H * D) IN(dy, B * T * H * D) IN(qkv, B * T * 3 * H * D) IN(y, B * T * H * D),             \
       ct_cpu_f32_causal_attention_backward(be, F(dqkv), F(dy), F(qkv), F(y), lse, B, T, H, D, p, seed, stream))       \
    /* losses */                                                                                                       \
    OP(loss, softmax_xent,                                                                                             \
       (void *dlogits, float *result, const void *logits, const int32_t *labels, int64_t rows, int64_t classes,        \
        int64_t ld, float label_smoothing, float grad_scale, ct_dtype dt),                                             \
       OUT(dlogits, rows * ld) IN(logits, rows * ld),                                                                  \
       xent_f32(be, F(dlogits), result, F(logits), labels, rows, classes, ld, label_smoothing, grad_scale))            \
    OP(loss, mse_loss,                                                                                                 \
       (void *dpred, float *result, const void *pred, const float *target, int64_t n_rows, int64_t n_cols,             \
        float grad_scale, ct_dtype dt),                                                                                \
       OUT(dpred, n_rows * n_cols) IN(pred, n_rows * n_cols),                                                          \
       mse_f32(be, F(dpred), result, F(pred), target, n_rows, n_cols, grad_scale))                                     \
    OP(loss, bce_logits_loss,                                                                                          \
       (void *dlogits, float *result, const void *logits, const float *target, int64_t n_rows, int64_t n_cols,         \
        float grad_scale, ct_dtype dt),                                                                                \
       OUT(dlogits, n_rows * n_cols) IN(logits, n_rows * n_cols),                                                      \
       bce_f32(be, F(dlogits), result, F(logits), target, n_rows, n_cols, grad_scale))                                 \
    /* Llama-family blocks: RMSNorm, SwiGLU, rotary positions with grouped-query heads */                              \
    OP(norm, rmsnorm_forward,                                                                                          \
       (void *y, float *save_rstd, const void *x, const void *gamma, int64_t rows, int64_t d, float eps, ct_dtype dt), \
       OUT(y, rows * d) IN(x, rows * d) IN(gamma, d),                                                                  \
       ct_cpu_f32_rmsnorm_forward(be, F(y), save_rstd, F(x), F(gamma), rows, d, eps))                                  \
    OP(norm, rmsnorm_backward,                                                                                         \
       (void *dx, float *dgamma, const void *dy, const void *x, const void *gamma, const float *save_rstd,             \
        int64_t rows, int64_t d, ct_dtype dt),                                                                         \
       OUT(dx, rows * d) IN(dy, rows * d) IN(x, rows * d) IN(gamma, d),                                                \
       ct_cpu_f32_rmsnorm_backward(be, F(dx), dgamma, F(dy), F(x), F(gamma), save_rstd, rows, d))                      \
    OP(elt, swiglu_forward, (void *y, const void *x, int64_t rows, int64_t f, ct_dtype dt),                            \
       OUT(y, rows * f) IN(x, rows * 2 * f),                                                                           \
       ct_cpu_f32_swiglu_forward(be, F(y), F(x), rows, f))                                                             \
    OP(elt, swiglu_backward, (void *dx, const void *dy, const void *x, int64_t rows, int64_t f, ct_dtype dt),          \
       OUT(dx, rows * 2 * f) IN(dy, rows * f) IN(x, rows * 2 * f),                                                     \
       ct_cpu_f32_swiglu_backward(be, F(dx), F(dy), F(x), rows, f))                                                    \
    OP(attn, rope_gqa_forward,                                                                                         \
       (void *qkv, const void *x, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const ct_rope *r,            \
        ct_dtype dt),                                                                                                  \
       OUT(qkv, B * T * 3 * H * D) IN(x, B * T * (H + 2 * KV) * D),                                                    \
       ct_cpu_f32_rope_gqa_forward(be, F(qkv), F(x), B, T, H, KV, D, r))                                               \
    OP(attn, rope_gqa_backward,                                                                                        \
       (void *dx, const void *dqkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const ct_rope *r,          \
        ct_dtype dt),                                                                                                  \
       OUT(dx, B * T * (H + 2 * KV) * D) IN(dqkv, B * T * 3 * H * D),                                                  \
       ct_cpu_f32_rope_gqa_backward(be, F(dx), F(dqkv), B, T, H, KV, D, r))                                            \
    OP(attn, kv_attention_forward,                                                                                     \
       (void *y, void *kv, const void *qkv, int64_t B, int64_t T, int64_t pos0, int64_t cap, int64_t H, int64_t KV,     \
        int64_t D, ct_dtype dt),                                                                                       \
       OUT(y, B * T * H * D) INOUT(kv, 2 * B * KV * cap * D) IN(qkv, B * T * 3 * H * D),                               \
       ct_cpu_f32_kv_attention_forward(be, F(y), F(kv), F(qkv), B, T, pos0, cap, H, KV, D))

/* Each entry becomes cpu_<name>: its arguments as the entry says, the kernel, the outputs
 * rounded back. */
#define PARAMS(...) __VA_ARGS__
#define DEFINE_OP(table, name, params, args, call)                                                                     \
    static void cpu_##name(ct_backend *be, PARAMS params) {                                                            \
        int slot = 0;                                                                                                  \
        pending out = {.count = 0};                                                                                    \
        args call;                                                                                                     \
        store_all(be, &out, dt);                                                                                       \
        (void)slot;                                                                                                    \
    }
CPU_DTYPE_OPS(DEFINE_OP)

#define INSTALL_OP(table, name, params, args, call) be->table.name = cpu_##name;
void ct_cpu_dtype_install(ct_backend *be) { CPU_DTYPE_OPS(INSTALL_OP) }

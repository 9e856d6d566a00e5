/* cpu_dtype.c: the CPU backend's ops on fp32, fp16 and bf16 storage.
 *
 * The kernels in the other cpu_*.c files compute on fp32 arrays (ct_cpu_f32_*). An op called
 * with dt == CT_F32 goes straight to them. With a 16-bit dt, each 16-bit argument is widened
 * exactly into a scratch buffer (F16C where present, through the cast op, over the thread pool),
 * the fp32 kernel runs, and each 16-bit output is rounded once, to nearest even, as it is stored
 * back. This is by construction "the fp32 op on the widened inputs, then round": the definition of
 * a 16-bit op in backend.h, and what test_cpu_ops checks bit for bit. The extra passes are
 * memory-bound and small next to the GEMMs (docs/BENCHMARKS.md).
 *
 * Scratch: CT_CPU_SLOTS growable buffers in the backend (ct_cpu.slot), reused by every call: no
 * allocation per call once they have grown. Ops are called from one thread at a time. */
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

/* Scratch slot s with room for n floats (grown on demand, contents not kept; counted as
 * workspace in mem_stats). */
float *ct_cpu_scratch(ct_backend *be, int s, int64_t n) {
    ct_cpu *cpu = be->impl;
    size_t need = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
    if (cpu->slot_cap[s] < need) {
        be->mem.free(be, cpu->slot[s]);
        cpu->slot[s] = be->mem.alloc(be, need, CT_MEM_WORKSPACE);
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

/* Store an out32 buffer back into y (rounding once). */
static void store(ct_backend *be, void *y, const float *w, int64_t n, ct_dtype dt) {
    if (y && dt != CT_F32) be->elt.cast(be, y, dt, w, CT_F32, n);
}

/* ---- element-wise ---- */

static void cpu_fill(ct_backend *be, void *x, float v, int64_t n, ct_dtype dt) {
    float *w = out32(be, 0, x, n, dt, false);
    ct_cpu_f32_fill(be, w, v, n);
    store(be, x, w, n, dt);
}

static void cpu_scale(ct_backend *be, void *x, float s, int64_t n, ct_dtype dt) {
    float *w = out32(be, 0, x, n, dt, true);
    ct_cpu_f32_scale(be, w, s, n);
    store(be, x, w, n, dt);
}

static void cpu_axpy(ct_backend *be, void *y, float a, const void *x, int64_t n, ct_dtype dt) {
    const float *xw = in32(be, 1, x, n, dt);
    float *yw = out32(be, 0, y, n, dt, true);
    ct_cpu_f32_axpy(be, yw, a, xw, n);
    store(be, y, yw, n, dt);
}

static void cpu_add(ct_backend *be, void *y, const void *a, const void *b, int64_t n, ct_dtype dt) {
    const float *aw = in32(be, 1, a, n, dt), *bw = in32(be, 2, b, n, dt);
    float *yw = out32(be, 0, y, n, dt, false);
    ct_cpu_f32_add(be, yw, aw, bw, n);
    store(be, y, yw, n, dt);
}

/* A plain strided copy moves 16-bit values unchanged, so only the accumulating form converts:
 * the rows' span of y ((rows - 1) * ldy + cols elements) is widened, summed and stored back;
 * elements between the rows round-trip exactly. */
static void cpu_copy_rows(ct_backend *be, void *y, int64_t ldy, const void *x, int64_t ldx,
                          int64_t rows, int64_t cols, bool accumulate, ct_dtype dt) {
    if (rows <= 0 || cols <= 0) return;
    if (dt == CT_F32) {
        ct_cpu_f32_copy_rows(be, y, ldy, x, ldx, rows, cols, accumulate);
        return;
    }
    size_t es = ct_dtype_size(dt);
    if (!accumulate) {
        for (int64_t r = 0; r < rows; r++)
            memcpy((char *)y + (size_t)(r * ldy) * es, (const char *)x + (size_t)(r * ldx) * es,
                   (size_t)cols * es);
        return;
    }
    int64_t ny = (rows - 1) * ldy + cols, nx = (rows - 1) * ldx + cols;
    const float *xw = in32(be, 1, x, nx, dt);
    float *yw = out32(be, 0, y, ny, dt, true);
    ct_cpu_f32_copy_rows(be, yw, ldy, xw, ldx, rows, cols, true);
    store(be, y, yw, ny, dt);
}

static void cpu_bias_act_forward(ct_backend *be, void *x, const void *bias, int64_t rows, int64_t cols,
                                 int64_t inner, ct_act act, float alpha, ct_dtype dt) {
    int64_t n = rows * cols * (inner > 1 ? inner : 1);
    const float *bw = in32(be, 1, bias, cols, dt);
    float *xw = out32(be, 0, x, n, dt, true);
    ct_cpu_f32_bias_act_forward(be, xw, bw, rows, cols, inner, act, alpha);
    store(be, x, xw, n, dt);
}

static void cpu_bias_backward(ct_backend *be, float *db, const void *dy, int64_t rows, int64_t cols,
                              int64_t inner, ct_dtype dt) {
    ct_cpu_f32_bias_backward(be, db, in32(be, 0, dy, rows * cols * (inner > 1 ? inner : 1), dt), rows,
                             cols, inner);
}

static void cpu_act_forward(ct_backend *be, void *y, const void *x, int64_t n, ct_act act, float alpha,
                            ct_dtype dt) {
    const float *xw = in32(be, 1, x, n, dt);
    float *yw = out32(be, 0, y, n, dt, false);
    ct_cpu_f32_act_forward(be, yw, xw, n, act, alpha);
    store(be, y, yw, n, dt);
}

/* Which of x and y the fp32 kernel reads for act (the other is passed as NULL, so it is not
 * widened: ReLU prefers x, tanh/sigmoid prefer y, GELU/SiLU need x). */
static void act_backward_inputs(ct_act act, const void **x, const void **y) {
    switch (act) {
    case CT_ACT_NONE: *x = *y = NULL; break;
    case CT_ACT_RELU:
    case CT_ACT_LEAKY_RELU: if (*x) *y = NULL; break;
    case CT_ACT_TANH:
    case CT_ACT_SIGMOID: if (*y) *x = NULL; break;
    default: *y = NULL; break;
    }
}

static void cpu_act_backward(ct_backend *be, void *dx, const void *dy, const void *x, const void *y,
                             int64_t n, ct_act act, float alpha, ct_dtype dt) {
    if (dt != CT_F32) act_backward_inputs(act, &x, &y);
    const float *dyw = in32(be, 1, dy, n, dt), *xw = in32(be, 2, x, n, dt), *yw = in32(be, 3, y, n, dt);
    float *dxw = out32(be, 0, dx, n, dt, false);
    ct_cpu_f32_act_backward(be, dxw, dyw, xw, yw, n, act, alpha);
    store(be, dx, dxw, n, dt);
}

static void cpu_dropout_forward(ct_backend *be, void *y, uint8_t *mask, const void *x, int64_t n, float p,
                                uint64_t seed, uint64_t stream, ct_dtype dt) {
    const float *xw = in32(be, 1, x, n, dt);
    float *yw = out32(be, 0, y, n, dt, false);
    ct_cpu_f32_dropout_forward(be, yw, mask, xw, n, p, seed, stream);
    store(be, y, yw, n, dt);
}

static void cpu_dropout_backward(ct_backend *be, void *dx, const void *dy, const uint8_t *mask, int64_t n,
                                 float p, ct_dtype dt) {
    const float *dyw = in32(be, 1, dy, n, dt);
    float *dxw = out32(be, 0, dx, n, dt, false);
    ct_cpu_f32_dropout_backward(be, dxw, dyw, mask, n, p);
    store(be, dx, dxw, n, dt);
}

/* ---- embedding: a lookup copies 16-bit rows unchanged ---- */

static void cpu_embedding_forward(ct_backend *be, void *y, const int32_t *ids, const void *table,
                                  int64_t n_ids, int64_t dim, ct_dtype dt) {
    if (dt == CT_F32) {
        ct_cpu_f32_embedding_forward(be, y, ids, table, n_ids, dim);
        return;
    }
    /* as the fp32 kernel: a negative id reads as zeros; the data pipeline validates the rest */
    size_t row = (size_t)dim * ct_dtype_size(dt);
    for (int64_t i = 0; i < n_ids; i++) {
        char *dst = (char *)y + (size_t)i * row;
        if (ids[i] < 0) memset(dst, 0, row);
        else memcpy(dst, (const char *)table + (size_t)ids[i] * row, row);
    }
}

static void cpu_embedding_backward(ct_backend *be, float *dtable, const void *dy, const int32_t *ids,
                                   int64_t n_ids, int64_t vocab, int64_t dim, ct_dtype dt) {
    ct_cpu_f32_embedding_backward(be, dtable, in32(be, 0, dy, n_ids * dim, dt), ids, n_ids, vocab, dim);
}

/* ---- convolution ---- */

static int64_t conv_in_numel(const ct_conv2d_geom *g) { return g->c * g->h * g->w; }
static int64_t conv_w_numel(const ct_conv2d_geom *g) { return g->oc * (g->c / g->groups) * g->kh * g->kw; }
static int64_t conv_col_numel(const ct_conv2d_geom *g) {
    return g->c / g->groups * g->kh * g->kw * g->oh * g->ow;
}

static void cpu_im2col(ct_backend *be, void *col, const void *img, const ct_conv2d_geom *g, int64_t group,
                       ct_dtype dt) {
    const float *iw = in32(be, 1, img, conv_in_numel(g), dt);
    float *cw = out32(be, 0, col, conv_col_numel(g), dt, false);
    ct_cpu_f32_im2col(be, cw, iw, g, group);
    store(be, col, cw, conv_col_numel(g), dt);
}

static void cpu_col2im(ct_backend *be, void *img, const void *col, const ct_conv2d_geom *g, int64_t group,
                       ct_dtype dt) {
    const float *cw = in32(be, 1, col, conv_col_numel(g), dt);
    float *iw = out32(be, 0, img, conv_in_numel(g), dt, true);
    ct_cpu_f32_col2im(be, iw, cw, g, group);
    store(be, img, iw, conv_in_numel(g), dt);
}

static void cpu_conv2d_forward(ct_backend *be, void *y, const void *x, const void *w, const void *bias,
                               const ct_conv2d_geom *g, ct_dtype dt) {
    int64_t ny = g->n * g->oc * g->oh * g->ow;
    const float *xw = in32(be, 1, x, g->n * conv_in_numel(g), dt), *ww = in32(be, 2, w, conv_w_numel(g), dt);
    const float *bw = in32(be, 3, bias, g->oc, dt);
    float *yw = out32(be, 0, y, ny, dt, false);
    ct_cpu_f32_conv2d_forward(be, yw, xw, ww, bw, g);
    store(be, y, yw, ny, dt);
}

static void cpu_conv2d_backward(ct_backend *be, void *dx, float *dw, float *db, const void *dy, const void *x,
                                const void *w, const ct_conv2d_geom *g, ct_dtype dt) {
    int64_t nx = g->n * conv_in_numel(g);
    const float *dyw = in32(be, 1, dy, g->n * g->oc * g->oh * g->ow, dt);
    const float *xw = in32(be, 2, x, nx, dt), *ww = in32(be, 3, w, conv_w_numel(g), dt);
    float *dxw = out32(be, 0, dx, nx, dt, false);
    ct_cpu_f32_conv2d_backward(be, dxw, dw, db, dyw, xw, ww, g);
    store(be, dx, dxw, nx, dt);
}

/* ---- pooling ---- */

static int64_t pool_in(const ct_pool2d_geom *g) { return g->n * g->c * g->h * g->w; }
static int64_t pool_out(const ct_pool2d_geom *g) { return g->n * g->c * g->oh * g->ow; }

static void cpu_maxpool2d_forward(ct_backend *be, void *y, int32_t *argmax, const void *x,
                                  const ct_pool2d_geom *g, ct_dtype dt) {
    const float *xw = in32(be, 1, x, pool_in(g), dt);
    float *yw = out32(be, 0, y, pool_out(g), dt, false);
    ct_cpu_f32_maxpool2d_forward(be, yw, argmax, xw, g);
    store(be, y, yw, pool_out(g), dt);
}

static void cpu_maxpool2d_backward(ct_backend *be, void *dx, const void *dy, const int32_t *argmax,
                                   const ct_pool2d_geom *g, ct_dtype dt) {
    const float *dyw = in32(be, 1, dy, pool_out(g), dt);
    float *dxw = out32(be, 0, dx, pool_in(g), dt, false);
    ct_cpu_f32_maxpool2d_backward(be, dxw, dyw, argmax, g);
    store(be, dx, dxw, pool_in(g), dt);
}

static void cpu_avgpool2d_forward(ct_backend *be, void *y, const void *x, const ct_pool2d_geom *g,
                                  ct_dtype dt) {
    const float *xw = in32(be, 1, x, pool_in(g), dt);
    float *yw = out32(be, 0, y, pool_out(g), dt, false);
    ct_cpu_f32_avgpool2d_forward(be, yw, xw, g);
    store(be, y, yw, pool_out(g), dt);
}

static void cpu_avgpool2d_backward(ct_backend *be, void *dx, const void *dy, const ct_pool2d_geom *g,
                                   ct_dtype dt) {
    const float *dyw = in32(be, 1, dy, pool_out(g), dt);
    float *dxw = out32(be, 0, dx, pool_in(g), dt, false);
    ct_cpu_f32_avgpool2d_backward(be, dxw, dyw, g);
    store(be, dx, dxw, pool_in(g), dt);
}

/* ---- normalization ---- */

static void cpu_batchnorm_forward(ct_backend *be, void *y, const void *x, const void *gamma, const void *beta,
                                  float *running_mean, float *running_var, float *save_mean,
                                  float *save_invstd, int64_t n, int64_t c, int64_t hw, float eps,
                                  float momentum, bool train, ct_dtype dt) {
    int64_t nx = n * c * hw;
    const float *xw = in32(be, 1, x, nx, dt), *gw = in32(be, 2, gamma, c, dt), *bw = in32(be, 3, beta, c, dt);
    float *yw = out32(be, 0, y, nx, dt, false);
    ct_cpu_f32_batchnorm_forward(be, yw, xw, gw, bw, running_mean, running_var, save_mean, save_invstd, n, c,
                                 hw, eps, momentum, train);
    store(be, y, yw, nx, dt);
}

static void cpu_batchnorm_backward(ct_backend *be, void *dx, float *dgamma, float *dbeta, const void *dy,
                                   const void *x, const void *gamma, const float *save_mean,
                                   const float *save_invstd, int64_t n, int64_t c, int64_t hw, ct_dtype dt) {
    int64_t nx = n * c * hw;
    const float *dyw = in32(be, 1, dy, nx, dt), *xw = in32(be, 2, x, nx, dt), *gw = in32(be, 3, gamma, c, dt);
    float *dxw = out32(be, 0, dx, nx, dt, false);
    ct_cpu_f32_batchnorm_backward(be, dxw, dgamma, dbeta, dyw, xw, gw, save_mean, save_invstd, n, c, hw);
    store(be, dx, dxw, nx, dt);
}

static void cpu_layernorm_forward(ct_backend *be, void *y, float *save_mean, float *save_rstd, const void *x,
                                  const void *gamma, const void *beta, int64_t rows, int64_t d, float eps,
                                  ct_dtype dt) {
    const float *xw = in32(be, 1, x, rows * d, dt), *gw = in32(be, 2, gamma, d, dt), *bw = in32(be, 3, beta, d, dt);
    float *yw = out32(be, 0, y, rows * d, dt, false);
    ct_cpu_f32_layernorm_forward(be, yw, save_mean, save_rstd, xw, gw, bw, rows, d, eps);
    store(be, y, yw, rows * d, dt);
}

static void cpu_layernorm_backward(ct_backend *be, void *dx, float *dgamma, float *dbeta, const void *dy,
                                   const void *x, const void *gamma, const float *save_mean,
                                   const float *save_rstd, int64_t rows, int64_t d, ct_dtype dt) {
    const float *dyw = in32(be, 1, dy, rows * d, dt), *xw = in32(be, 2, x, rows * d, dt);
    const float *gw = in32(be, 3, gamma, d, dt);
    float *dxw = out32(be, 0, dx, rows * d, dt, false);
    ct_cpu_f32_layernorm_backward(be, dxw, dgamma, dbeta, dyw, xw, gw, save_mean, save_rstd, rows, d);
    store(be, dx, dxw, rows * d, dt);
}

/* ---- losses: the result pair stays in "device" (host) memory ---- */

static void cpu_softmax_xent(ct_backend *be, void *dlogits, float *result, const void *logits,
                             const int32_t *labels, int64_t rows, int64_t classes, float label_smoothing,
                             float grad_scale, ct_dtype dt) {
    int64_t n = rows * classes, correct = 0;
    const float *lw = in32(be, 1, logits, n, dt);
    float *dw = out32(be, 0, dlogits, n, dt, false);
    ct_cpu_f32_softmax_xent(be, dw, &result[0], &correct, lw, labels, rows, classes, label_smoothing,
                            grad_scale);
    result[1] = (float)correct;
    store(be, dlogits, dw, n, dt);
}

static void cpu_mse_loss(ct_backend *be, void *dpred, float *result, const void *pred, const float *target,
                         int64_t n_rows, int64_t n_cols, float grad_scale, ct_dtype dt) {
    int64_t n = n_rows * n_cols;
    const float *pw = in32(be, 1, pred, n, dt);
    float *dw = out32(be, 0, dpred, n, dt, false);
    ct_cpu_f32_mse_loss(be, dw, &result[0], pw, target, n_rows, n_cols, grad_scale);
    result[1] = 0.0f;
    store(be, dpred, dw, n, dt);
}

static void cpu_bce_logits_loss(ct_backend *be, void *dlogits, float *result, const void *logits,
                                const float *target, int64_t n_rows, int64_t n_cols, float grad_scale,
                                ct_dtype dt) {
    int64_t n = n_rows * n_cols;
    const float *lw = in32(be, 1, logits, n, dt);
    float *dw = out32(be, 0, dlogits, n, dt, false);
    ct_cpu_f32_bce_logits_loss(be, dw, &result[0], lw, target, n_rows, n_cols, grad_scale);
    result[1] = 0.0f;
    store(be, dlogits, dw, n, dt);
}

/* ---- data.transform.on_device: the same expression as the datasets' host tables ---- */

static void cpu_normalize_u8(ct_backend *be, void *y, const uint8_t *x, const uint8_t *flip,
                             const ct_u8_normalize *p, ct_dtype dt) {
    int64_t plane = p->h * p->w, n = p->n * p->c * plane;
    float *yw = out32(be, 0, y, n, dt, false);
    for (int64_t i = 0; i < p->n; i++)
        for (int64_t ch = 0; ch < p->c; ch++) {
            float lut[256];
            for (int v = 0; v < 256; v++) lut[v] = ((float)v / 255.0f - p->mean[ch]) / p->std[ch];
            const uint8_t *src = x + (i * p->c + ch) * plane;
            float *dst = yw + (i * p->c + ch) * plane;
            bool mirror = flip && flip[i];
            for (int64_t r = 0; r < p->h; r++)
                for (int64_t col = 0; col < p->w; col++)
                    dst[r * p->w + col] = lut[src[r * p->w + (mirror ? p->w - 1 - col : col)]];
        }
    store(be, y, yw, n, dt);
}

void ct_cpu_dtype_install(ct_backend *be) {
    be->elt.fill = cpu_fill;
    be->elt.scale = cpu_scale;
    be->elt.axpy = cpu_axpy;
    be->elt.add = cpu_add;
    be->elt.copy_rows = cpu_copy_rows;
    be->elt.normalize_u8 = cpu_normalize_u8;
    be->elt.bias_act_forward = cpu_bias_act_forward;
    be->elt.bias_backward = cpu_bias_backward;
    be->elt.act_forward = cpu_act_forward;
    be->elt.act_backward = cpu_act_backward;
    be->elt.dropout_forward = cpu_dropout_forward;
    be->elt.dropout_backward = cpu_dropout_backward;
    be->embed.embedding_forward = cpu_embedding_forward;
    be->embed.embedding_backward = cpu_embedding_backward;
    be->conv.im2col = cpu_im2col;
    be->conv.col2im = cpu_col2im;
    be->conv.conv2d_forward = cpu_conv2d_forward;
    be->conv.conv2d_backward = cpu_conv2d_backward;
    be->conv.maxpool2d_forward = cpu_maxpool2d_forward;
    be->conv.maxpool2d_backward = cpu_maxpool2d_backward;
    be->conv.avgpool2d_forward = cpu_avgpool2d_forward;
    be->conv.avgpool2d_backward = cpu_avgpool2d_backward;
    be->norm.batchnorm_forward = cpu_batchnorm_forward;
    be->norm.batchnorm_backward = cpu_batchnorm_backward;
    be->norm.layernorm_forward = cpu_layernorm_forward;
    be->norm.layernorm_backward = cpu_layernorm_backward;
    be->loss.softmax_xent = cpu_softmax_xent;
    be->loss.mse_loss = cpu_mse_loss;
    be->loss.bce_logits_loss = cpu_bce_logits_loss;
}

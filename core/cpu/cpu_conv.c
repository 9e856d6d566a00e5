/* cpu_conv.c: im2col / col2im for convolution as GEMM, and whole-batch conv2d forward/backward
 * built from them (images in parallel, see below).
 *
 * col has one row per (channel in group, ky, kx) and one column per output pixel:
 *   col[(c * kh + ky) * kw + kx, oy * ow + ox] = img[c0 + c, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw]
 * (zero outside the image). img points at one image [C, H, W]; `group` selects channels
 * c0 = group * C/groups onwards. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/common.h"
#include "core/cpu/cpu_internal.h"

typedef struct {
    float *col;
    float *img;
    const float *ccol;
    const float *cimg;
    const ct_conv2d_geom *g;
    int64_t c0; /* first channel of the group */
    int64_t ld; /* floats from one col row to the next: oh * ow, or more for several images */
} conv_ctx;

/* Output columns [ox0, ox1) whose input column ix = ox*sw - pw + kx*dw lies inside [0, w). */
static void valid_cols(const ct_conv2d_geom *g, int64_t kx, int64_t *ox0, int64_t *ox1) {
    int64_t off = kx * g->dil_w - g->pad_w;
    int64_t lo = off >= 0 ? 0 : ct_cpu_ceil_div(-off, g->stride_w);
    int64_t hi = g->w - off <= 0 ? 0 : ct_cpu_ceil_div(g->w - off, g->stride_w);
    if (hi > g->ow) hi = g->ow;
    if (lo > hi) lo = hi;
    *ox0 = lo;
    *ox1 = hi;
}

/* Output rows [oy0, oy1) whose input row iy = oy*sh - ph + ky*dh lies inside [0, h). */
static void valid_rows(const ct_conv2d_geom *g, int64_t ky, int64_t *oy0, int64_t *oy1) {
    int64_t off = ky * g->dil_h - g->pad_h;
    int64_t lo = off >= 0 ? 0 : ct_cpu_ceil_div(-off, g->stride_h);
    int64_t hi = g->h - off <= 0 ? 0 : ct_cpu_ceil_div(g->h - off, g->stride_h);
    if (hi > g->oh) hi = g->oh;
    if (lo > hi) lo = hi;
    *oy0 = lo;
    *oy1 = hi;
}

/* "Same"-shaped unit-stride convolutions (ow == w, stride 1): col row (ky, kx) is the input
 * plane shifted by (ky*dh - ph) rows and (kx*dw - pw) columns, so it is one long copy followed by
 * zeroing what fell outside the image. Per output row, the general loop spent more time on loop
 * setup than on its 14 or 28 floats (perf: 12% of a CNN step). */
static void im2col_row_shifted(const ct_conv2d_geom *g, const float *plane, float *out, int64_t ky,
                               int64_t kx) {
    int64_t n = g->oh * g->ow, oy0, oy1, ox0, ox1;
    valid_rows(g, ky, &oy0, &oy1);
    valid_cols(g, kx, &ox0, &ox1);
    int64_t shift = (ky * g->dil_h - g->pad_h) * g->w + (kx * g->dil_w - g->pad_w);
    int64_t lo = oy0 * g->ow, hi = oy1 * g->ow; /* output span of the valid rows */
    /* the linear copy may not read outside the plane: clip, the clipped ends are zeroed below */
    int64_t a = lo + shift < 0 ? -shift : lo, b = hi + shift > g->h * g->w ? g->h * g->w - shift : hi;
    memset(out, 0, (size_t)lo * sizeof(float));
    if (b > a) memcpy(out + a, plane + a + shift, (size_t)(b - a) * sizeof(float));
    memset(out + hi, 0, (size_t)(n - hi) * sizeof(float));
    for (int64_t oy = oy0; oy < oy1; oy++) {
        float *o = out + oy * g->ow;
        for (int64_t ox = 0; ox < ox0; ox++) o[ox] = 0.0f;
        for (int64_t ox = ox1; ox < g->ow; ox++) o[ox] = 0.0f;
    }
}

static void im2col_range(void *c, int64_t r0, int64_t r1) {
    conv_ctx *k = c;
    const ct_conv2d_geom *g = k->g;
    bool shifted = g->stride_h == 1 && g->stride_w == 1 && g->ow == g->w;
    for (int64_t r = r0; r < r1; r++) {
        int64_t kx = r % g->kw, ky = (r / g->kw) % g->kh, ch = r / (g->kw * g->kh);
        const float *plane = k->cimg + (k->c0 + ch) * g->h * g->w;
        float *out = k->col + r * k->ld;
        if (shifted) {
            im2col_row_shifted(g, plane, out, ky, kx);
            continue;
        }
        int64_t ox0, ox1;
        valid_cols(g, kx, &ox0, &ox1);
        for (int64_t oy = 0; oy < g->oh; oy++) {
            float *o = out + oy * g->ow;
            int64_t iy = oy * g->stride_h - g->pad_h + ky * g->dil_h;
            if (iy < 0 || iy >= g->h) {
                memset(o, 0, (size_t)g->ow * sizeof(float));
                continue;
            }
            const float *in = plane + iy * g->w;
            int64_t off = kx * g->dil_w - g->pad_w;
            for (int64_t ox = 0; ox < ox0; ox++) o[ox] = 0.0f;
            if (g->stride_w == 1) {
                const float *restrict src = in + off;
                for (int64_t ox = ox0; ox < ox1; ox++) o[ox] = src[ox];
            } else
                for (int64_t ox = ox0; ox < ox1; ox++) o[ox] = in[ox * g->stride_w + off];
            for (int64_t ox = ox1; ox < g->ow; ox++) o[ox] = 0.0f;
        }
    }
}

/* Channels [c0, c1) of the group: each channel's kh*kw rows are added in a fixed order, and no
 * two threads touch the same channel. */
static void col2im_range(void *c, int64_t ch0, int64_t ch1) {
    conv_ctx *k = c;
    const ct_conv2d_geom *g = k->g;
    for (int64_t ch = ch0; ch < ch1; ch++) {
        float *plane = k->img + (k->c0 + ch) * g->h * g->w;
        for (int64_t ky = 0; ky < g->kh; ky++) {
            for (int64_t kx = 0; kx < g->kw; kx++) {
                const float *src = k->ccol + ((ch * g->kh + ky) * g->kw + kx) * k->ld;
                int64_t ox0, ox1;
                valid_cols(g, kx, &ox0, &ox1);
                for (int64_t oy = 0; oy < g->oh; oy++) {
                    int64_t iy = oy * g->stride_h - g->pad_h + ky * g->dil_h;
                    if (iy < 0 || iy >= g->h) continue;
                    float *dst = plane + iy * g->w;
                    int64_t off = kx * g->dil_w - g->pad_w;
                    const float *s = src + oy * g->ow;
                    if (g->stride_w == 1) {
                        float *restrict d = dst + off; /* unit stride: a loop the compiler vectorises */
                        for (int64_t ox = ox0; ox < ox1; ox++) d[ox] += s[ox];
                    } else {
                        for (int64_t ox = ox0; ox < ox1; ox++) dst[ox * g->stride_w + off] += s[ox];
                    }
                }
            }
        }
    }
}

/* The adjoint of im2col_row_shifted for col row (ky, kx): plane += the row shifted back, as one
 * long add. The row's entries that im2col would zero (their input lies outside the image) are
 * zeroed in col first, so the add may run across the ends of rows: col is scratch here. Every
 * input element gets at most one term per (ky, kx) row, in the order col2im_range adds them, so
 * the result has the same bits. */
static void col2im_row_shifted(const ct_conv2d_geom *g, float *plane, float *col, int64_t ky,
                               int64_t kx) {
    int64_t oy0, oy1, ox0, ox1;
    valid_rows(g, ky, &oy0, &oy1);
    valid_cols(g, kx, &ox0, &ox1);
    int64_t shift = (ky * g->dil_h - g->pad_h) * g->w + (kx * g->dil_w - g->pad_w);
    int64_t lo = oy0 * g->ow, hi = oy1 * g->ow;
    int64_t a = lo + shift < 0 ? -shift : lo, b = hi + shift > g->h * g->w ? g->h * g->w - shift : hi;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        float *o = col + oy * g->ow;
        for (int64_t ox = 0; ox < ox0; ox++) o[ox] = 0.0f;
        for (int64_t ox = ox1; ox < g->ow; ox++) o[ox] = 0.0f;
    }
    if (b <= a) return;
    float *restrict d = plane + a + shift;
    const float *restrict s = col + a;
    for (int64_t q = 0; q < b - a; q++) d[q] += s[q];
}

void ct_cpu_f32_im2col(ct_backend *be, float *col, const float *img, const ct_conv2d_geom *g,
                       int64_t group) {
    int64_t cg = g->c / g->groups;
    conv_ctx c = {.col = col, .cimg = img, .g = g, .c0 = group * cg, .ld = g->oh * g->ow};
    int64_t rows = cg * g->kh * g->kw, per_row = g->oh * g->ow;
    ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN, per_row > 0 ? per_row : 1),
                    im2col_range, &c);
}

void ct_cpu_f32_col2im(ct_backend *be, float *img, const float *col, const ct_conv2d_geom *g,
                       int64_t group) {
    int64_t cg = g->c / g->groups;
    conv_ctx c = {.img = img, .ccol = col, .g = g, .c0 = group * cg, .ld = g->oh * g->ow};
    int64_t per_ch = g->kh * g->kw * g->oh * g->ow;
    ct_cpu_parallel(ct_cpu_pool_of(be), cg, ct_cpu_ceil_div(CT_CPU_GRAIN, per_ch > 0 ? per_ch : 1),
                    col2im_range, &c);
}

/* ---- whole-batch convolution: images in parallel ----
 * Each piece of work is a run of whole images, done by one thread with serial im2col/col2im and
 * single-threaded GEMMs on its own column buffer. Per image and op, handing the work to the pool
 * cost more than the work itself (conv1's GEMM is 32x784x9). Forward and dx are per image, so
 * their bits do not depend on who computes them; dw sums over the batch, in fixed blocks of
 * CONV_DW_IMAGES images (one partial per block, then the partials in block order), so it has the
 * same bits for any thread count. */
#define CONV_DW_IMAGES 8

typedef struct {
    const ct_conv2d_geom *g;
    float *y, *dx, *partial;     /* partial: [blocks, oc * kg] dw of each block of images */
    double *bpartial;            /* [blocks, oc] db of each block, or NULL */
    const float *x, *w, *bias, *dy;
    const float *y_act;          /* fused ReLU backward: the ReLU's output [n, oc, oh, ow], whose
                                    sign is the mask applied to dy; NULL: dy is the conv's own */
    float *dw, *db;
    int64_t blocks;
    bool relu;                   /* fused ReLU: y = ReLU(conv + bias), dy masked by its sign */
    /* Fused 2x2 max-pool (conv2d_act_pool): y and dy are the pool's [n, oc, oh/2, ow/2]. */
    int32_t *argmax;             /* forward: the pool's argmax, written; NULL: no pool */
    const int32_t *cargmax;      /* backward: the same, read; NULL: no pool */
    const float *y_pool;         /* backward: the pool's output, whose sign is the ReLU's mask */
    ct_dtype stored;             /* forward: the activation's storage dtype, whose values the
                                    pool compares */
} batch_ctx;

static int64_t conv_kg(const ct_conv2d_geom *g) { return g->c / g->groups * g->kh * g->kw; }

/* col [kg, p] (rows ld floats apart) = im2col of image x for one group, on the calling thread. */
static void im2col_serial(float *col, int64_t ld, const float *x, const ct_conv2d_geom *g,
                          int64_t group) {
    conv_ctx c = {.col = col, .cimg = x, .g = g, .c0 = group * (g->c / g->groups), .ld = ld};
    im2col_range(&c, 0, conv_kg(g));
}

/* img += col2im(col) for one group, on the calling thread; col [kg, p] (rows ld floats apart) is
 * scratch (modified). */
static void col2im_serial(float *img, float *col, int64_t ld, const ct_conv2d_geom *g, int64_t group) {
    int64_t cg = g->c / g->groups, c0 = group * cg;
    if (!(g->stride_h == 1 && g->stride_w == 1 && g->ow == g->w)) {
        conv_ctx c = {.img = img, .ccol = col, .g = g, .c0 = c0, .ld = ld};
        col2im_range(&c, 0, cg);
        return;
    }
    for (int64_t ch = 0; ch < cg; ch++)
        for (int64_t ky = 0; ky < g->kh; ky++)
            for (int64_t kx = 0; kx < g->kw; kx++)
                col2im_row_shifted(g, img + (c0 + ch) * g->h * g->w,
                                   col + ((ch * g->kh + ky) * g->kw + kx) * ld, ky, kx);
}

/* One output channel's line of p floats: + bias (when given), then ReLU when asked, in one pass
 * while the image's output is still in cache. ReLU(v + b) here is the same float as the separate
 * bias pass followed by the relu layer's (cpu_eltwise.c): one rounding of the add, then the same
 * comparison (NaN stays NaN). */
static void bias_relu_line(float *restrict row, int64_t p, const float *bias, bool relu) {
    /* only called with a bias or ReLU: adding a zero bias would turn -0 into +0 */
    float b = bias ? *bias : 0.0f;
    if (!relu) {
        for (int64_t j = 0; j < p; j++) row[j] += b;
        return;
    }
    if (bias)
        for (int64_t j = 0; j < p; j++) {
            float v = row[j] + b;
            row[j] = v <= 0.0f ? 0.0f : v;
        }
    else
        for (int64_t j = 0; j < p; j++) {
            float v = row[j];
            row[j] = v <= 0.0f ? 0.0f : v;
        }
}

/* The fused max-pool over one output plane [oh, ow] (n and c: one plane at a time). */
static ct_pool2d_geom pool_geom(const ct_conv2d_geom *g) {
    return (ct_pool2d_geom){.n = 1, .c = 1, .h = g->oh, .w = g->ow, .kh = 2, .kw = 2, .stride_h = 2,
                            .stride_w = 2, .oh = g->oh / 2, .ow = g->ow / 2};
}

static void conv_fwd_images(void *ctx, int64_t i0, int64_t i1) {
    batch_ctx *k = ctx;
    const ct_conv2d_geom *g = k->g;
    int64_t kg = conv_kg(g), p = g->oh * g->ow, ocg = g->oc / g->groups;
    ct_pool2d_geom pg = pool_geom(g);
    int64_t pp = pg.oh * pg.ow;
    bool pool = k->argmax != NULL;
    /* col [kg, p]; with the pool, the image's full output [oc, p] too: it never leaves here */
    float *col = ct_xmalloc((size_t)(kg * p + (pool ? g->oc * p : 0)) * sizeof(float));
    for (int64_t i = i0; i < i1; i++) {
        const float *x = k->x + i * g->c * g->h * g->w;
        float *y = pool ? col + kg * p : k->y + i * g->oc * p;
        for (int64_t grp = 0; grp < g->groups; grp++) {
            im2col_serial(col, p, x, g, grp);
            /* y_grp [ocg, p] = w_grp [ocg, kg] col [kg, p] */
            ct_cpu_sgemm(false, false, ocg, p, kg, 1.0f, k->w + grp * ocg * kg, kg, col, p, 0.0f,
                         y + grp * ocg * p, p);
        }
        /* per channel while the image's output is still in cache: bias and ReLU, then the pool
         * over the values as the unfused pool would read them back from dt */
        for (int64_t o = 0; o < g->oc; o++) {
            float *line = y + o * p;
            if (k->bias || k->relu) bias_relu_line(line, p, k->bias ? k->bias + o : NULL, k->relu);
            if (!pool) continue;
            ct_cpu_round_range(line, p, k->stored);
            int64_t plane = (i * g->oc + o) * pp;
            ct_cpu_maxpool2x2_plane(line, k->y + plane, k->argmax + plane, &pg);
        }
    }
    free(col);
}

void ct_cpu_f32_conv2d_forward(ct_backend *be, float *y, const float *x, const float *w,
                               const float *bias, const ct_conv2d_geom *g) {
    ct_cpu_f32_conv2d_act_forward(be, y, x, w, bias, g, CT_ACT_NONE);
}

void ct_cpu_f32_conv2d_act_forward(ct_backend *be, float *y, const float *x, const float *w,
                                   const float *bias, const ct_conv2d_geom *g, ct_act act) {
    batch_ctx c = {.g = g, .y = y, .x = x, .w = w, .bias = bias, .relu = act == CT_ACT_RELU};
    ct_cpu_parallel(ct_cpu_pool_of(be), g->n, 1, conv_fwd_images, &c);
}

void ct_cpu_f32_conv2d_act_pool_forward(ct_backend *be, float *y, int32_t *argmax, const float *x,
                                        const float *w, const float *bias, const ct_conv2d_geom *g,
                                        ct_act act, ct_dtype dt) {
    batch_ctx c = {.g = g, .y = y, .x = x, .w = w, .bias = bias, .relu = act == CT_ACT_RELU,
                   .argmax = argmax, .stored = dt};
    ct_cpu_parallel(ct_cpu_pool_of(be), g->n, 1, conv_fwd_images, &c);
}

/* out[i] = dy[i] where the ReLU's output y[i] > 0, else 0: the same test and the same floats as
 * the relu layer's backward (cpu_eltwise.c, reading the sign from y); returns out. */
static const float *relu_mask(float *restrict out, const float *restrict dy, const float *restrict y,
                              int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float d = dy[j];
        out[j] = y[j] > 0.0f ? d : 0.0f;
    }
    return out;
}

/* out [planes, p] = the gradient of the conv's output when a 2x2 max-pool followed, from the
 * pool's dy and y [planes, pp] and argmax: what maxpool2d_backward writes (0 + dy at each window's
 * argmax, zero elsewhere: -0 becomes +0 there too), masked by the ReLU's sign at the selected
 * element, which is the pool's output (relu_mask: elsewhere the gradient is zero either way);
 * returns out. */
static const float *unpool_mask(float *restrict out, const float *restrict dy, const float *restrict y,
                                const int32_t *restrict am, int64_t planes, int64_t p, int64_t pp,
                                bool relu) {
    memset(out, 0, (size_t)(planes * p) * sizeof(float));
    for (int64_t c = 0; c < planes; c++)
        for (int64_t q = 0; q < pp; q++) {
            float d = 0.0f + dy[c * pp + q];
            out[c * p + am[c * pp + q]] = !relu || y[c * pp + q] > 0.0f ? d : 0.0f;
        }
    return out;
}

/* Image i's gradient of the conv's output [oc, p]: dy itself, or built in scratch (masked,
 * [oc, p]) for a fused ReLU and pool. */
static const float *image_dy(const batch_ctx *k, int64_t i, float *masked) {
    const ct_conv2d_geom *g = k->g;
    int64_t p = g->oh * g->ow, pp = (g->oh / 2) * (g->ow / 2);
    if (k->cargmax)
        return unpool_mask(masked, k->dy + i * g->oc * pp, k->y_pool + i * g->oc * pp,
                           k->cargmax + i * g->oc * pp, g->oc, p, pp, k->relu);
    const float *dy = k->dy + i * g->oc * p;
    return k->y_act ? relu_mask(masked, dy, k->y_act + i * g->oc * p, g->oc * p) : dy;
}

/* Blocks [b0, b1) of CONV_DW_IMAGES images: the block's dw and db partials, and dx of its images.
 * Per image, not with the block's images side by side in one GEMM: that measured slower here
 * (the copy of dy into [oc, block * p] cost more than the longer K gained). */
static void conv_bwd_blocks(void *ctx, int64_t b0, int64_t b1) {
    batch_ctx *k = ctx;
    const ct_conv2d_geom *g = k->g;
    int64_t kg = conv_kg(g), p = g->oh * g->ow, ocg = g->oc / g->groups, in_sz = g->c * g->h * g->w;
    /* col, dcol [kg, p]; masked [oc, p]: one image's dy through the fused ReLU's mask (image_dy) */
    int64_t masked_n = k->y_act || k->cargmax ? g->oc * p : 0;
    float *col = ct_xmalloc((size_t)(2 * kg * p + masked_n) * sizeof(float)), *dcol = col + kg * p;
    float *masked = dcol + kg * p;
    for (int64_t b = b0; b < b1; b++) {
        float *part = k->partial + b * g->oc * kg;                       /* [oc, kg] */
        double *bpart = k->bpartial ? k->bpartial + b * g->oc : NULL;   /* [oc] */
        for (int64_t o = 0; bpart && o < g->oc; o++) bpart[o] = 0.0;
        int64_t i_end = (b + 1) * CONV_DW_IMAGES < g->n ? (b + 1) * CONV_DW_IMAGES : g->n;
        for (int64_t i = b * CONV_DW_IMAGES; i < i_end; i++) {
            const float *dy = image_dy(k, i, masked);
            float *dx = k->dx ? k->dx + i * in_sz : NULL;
            if (dx) memset(dx, 0, (size_t)in_sz * sizeof(float));
            for (int64_t o = 0; bpart && o < g->oc; o++) bpart[o] += ct_cpu_sum(dy + o * p, p);
            for (int64_t grp = 0; grp < g->groups; grp++) {
                const float *dy_g = dy + grp * ocg * p, *w_g = k->w + grp * ocg * kg;
                im2col_serial(col, p, k->x + i * in_sz, g, grp);
                /* part_grp [ocg, kg] (+)= dy_grp [ocg, p] col^T [p, kg] */
                ct_cpu_sgemm(false, true, ocg, kg, p, 1.0f, dy_g, p, col, p,
                             i == b * CONV_DW_IMAGES ? 0.0f : 1.0f, part + grp * ocg * kg, kg);
                if (!dx) continue;
                /* dcol [kg, p] = w_grp^T [kg, ocg] dy_grp [ocg, p] */
                ct_cpu_sgemm(true, false, kg, p, ocg, 1.0f, w_g, kg, dy_g, p, 0.0f, dcol, p);
                col2im_serial(dx, dcol, p, g, grp);
            }
        }
    }
    free(col);
}

/* dw[e] += the blocks' partials in block order, for elements [e0, e1). */
static void conv_dw_sum(void *ctx, int64_t e0, int64_t e1) {
    batch_ctx *k = ctx;
    int64_t stride = k->g->oc * conv_kg(k->g);
    for (int64_t b = 0; b < k->blocks; b++) {
        float *restrict dw = k->dw;
        const float *restrict part = k->partial + b * stride;
        for (int64_t e = e0; e < e1; e++) dw[e] += part[e];
    }
}

/* The whole backward; c says where dy comes from (batch_ctx: dy, y_act, relu, cargmax, y_pool)
 * and holds the rest of the arguments. */
static void conv_backward(ct_backend *be, batch_ctx c) {
    const ct_conv2d_geom *g = c.g;
    float *db = c.db;
    int64_t blocks = ct_cpu_ceil_div(g->n, CONV_DW_IMAGES), wsz = g->oc * conv_kg(g);
    c.blocks = blocks;
    c.partial = ct_xmalloc((size_t)(blocks * wsz) * sizeof(float));
    if (db) c.bpartial = ct_xmalloc((size_t)(blocks * g->oc) * sizeof(double));
    ct_cpu_parallel(ct_cpu_pool_of(be), blocks, 1, conv_bwd_blocks, &c);
    ct_cpu_parallel(ct_cpu_pool_of(be), wsz, CT_CPU_GRAIN / blocks + 1, conv_dw_sum, &c);
    for (int64_t o = 0; db && o < g->oc; o++) {   /* the blocks' bias sums in block order */
        double acc = 0.0;
        for (int64_t b = 0; b < blocks; b++) acc += c.bpartial[b * g->oc + o];
        db[o] += (float)acc;
    }
    free(c.partial);
    free(c.bpartial);
}

void ct_cpu_f32_conv2d_backward(ct_backend *be, float *dx, float *dw, float *db, const float *dy,
                                const float *x, const float *w, const ct_conv2d_geom *g) {
    conv_backward(be, (batch_ctx){.g = g, .dx = dx, .dw = dw, .db = db, .dy = dy, .x = x, .w = w});
}

void ct_cpu_f32_conv2d_act_backward(ct_backend *be, float *dx, float *dw, float *db, const float *dy,
                                    const float *y, const float *x, const float *w,
                                    const ct_conv2d_geom *g, ct_act act) {
    conv_backward(be, (batch_ctx){.g = g, .dx = dx, .dw = dw, .db = db, .dy = dy, .x = x, .w = w,
                                  .y_act = act == CT_ACT_RELU ? y : NULL});
}

void ct_cpu_f32_conv2d_act_pool_backward(ct_backend *be, float *dx, float *dw, float *db, const float *dy,
                                         const float *y, const int32_t *argmax, const float *x,
                                         const float *w, const ct_conv2d_geom *g, ct_act act) {
    conv_backward(be, (batch_ctx){.g = g, .dx = dx, .dw = dw, .db = db, .dy = dy, .x = x, .w = w,
                                  .relu = act == CT_ACT_RELU, .cargmax = argmax, .y_pool = y});
}

void ct_cpu_conv_install(ct_backend *be) {
}

/* cuda_conv.cu: im2col / col2im and 2-D pooling (NCHW).
 *
 * Layouts are the CPU backend's (core/cpu/cpu_conv.c, cpu_pool2d.c):
 *   col[(c * kh + ky) * kw + kx, oy * ow + ox] = img[c0 + c, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw]
 * Backward passes gather instead of scatter: one thread owns one input pixel and adds the
 * contributions in the order the CPU's scatter loop adds them, so no atomics are needed and the
 * bits match the reference. */
#include "cuda/cuda_internal.h"

/* ct_conv2d_geom / ct_pool2d_geom are passed by value: host pointers are not readable here. */

__global__ void k_im2col(float *col, const float *img, ct_conv2d_geom g, int64_t c0, int64_t total) {
    int64_t pix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t row = idx / pix, p = idx - row * pix;
        int64_t kx = row % g.kw, ky = (row / g.kw) % g.kh, ch = row / (g.kw * g.kh);
        int64_t oy = p / g.ow, ox = p - oy * g.ow;
        int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dil_h;
        int64_t ix = ox * g.stride_w - g.pad_w + kx * g.dil_w;
        float v = 0.0f;
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) v = img[((c0 + ch) * g.h + iy) * g.w + ix];
        col[idx] = v;
    }
}

/* One thread per pixel of the group's channels: img += sum over (ky, kx) in order of the column
 * entry that read this pixel (at most one per (ky, kx) since strides are >= 1). */
__global__ void k_col2im(float *img, const float *col, ct_conv2d_geom g, int64_t c0, int64_t total) {
    int64_t plane = g.h * g.w, pix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t ch = idx / plane, rem = idx - ch * plane;
        int64_t iy = rem / g.w, ix = rem - iy * g.w;
        float *dst = img + (c0 + ch) * plane + rem;
        float acc = *dst;
        for (int64_t ky = 0; ky < g.kh; ky++) {
            int64_t ty = iy + g.pad_h - ky * g.dil_h;
            if (ty < 0 || ty % g.stride_h) continue;
            int64_t oy = ty / g.stride_h;
            if (oy >= g.oh) continue;
            for (int64_t kx = 0; kx < g.kw; kx++) {
                int64_t tx = ix + g.pad_w - kx * g.dil_w;
                if (tx < 0 || tx % g.stride_w) continue;
                int64_t ox = tx / g.stride_w;
                if (ox >= g.ow) continue;
                acc += col[((ch * g.kh + ky) * g.kw + kx) * pix + oy * g.ow + ox];
            }
        }
        *dst = acc;
    }
}

static void check_conv(const ct_conv2d_geom *g, int64_t group) {
    CT_CUDA_REQUIRE(g->groups >= 1 && g->c % g->groups == 0 && group >= 0 && group < g->groups,
                    "conv geometry: bad groups");
    CT_CUDA_REQUIRE(g->stride_h >= 1 && g->stride_w >= 1 && g->dil_h >= 1 && g->dil_w >= 1,
                    "conv geometry: stride and dilation must be >= 1");
}

static void cu_im2col(ct_backend *be, float *col, const float *img, const ct_conv2d_geom *g,
                      int64_t group) {
    check_conv(g, group);
    int64_t cg = g->c / g->groups;
    int64_t total = cg * g->kh * g->kw * g->oh * g->ow;
    LAUNCH(be, total, k_im2col, col, img, *g, group * cg, total);
}

static void cu_col2im(ct_backend *be, float *img, const float *col, const ct_conv2d_geom *g,
                      int64_t group) {
    check_conv(g, group);
    int64_t cg = g->c / g->groups;
    int64_t total = cg * g->h * g->w;
    LAUNCH(be, total, k_col2im, img, col, *g, group * cg, total);
}

/* ---- pooling ---- */

/* Window of output (oy, ox), clipped as core/cpu/cpu_pool2d.c's pool_window. */
struct pool_win {
    int64_t y0, y1, x0, x1;
    float divisor;
};

__device__ __forceinline__ pool_win pool_window(const ct_pool2d_geom &g, int64_t oy, int64_t ox) {
    pool_win w;
    w.y0 = oy * g.stride_h - g.pad_h;
    w.x0 = ox * g.stride_w - g.pad_w;
    w.y1 = w.y0 + g.kh;
    w.x1 = w.x0 + g.kw;
    if (w.y1 > g.h + g.pad_h) w.y1 = g.h + g.pad_h;
    if (w.x1 > g.w + g.pad_w) w.x1 = g.w + g.pad_w;
    int64_t padded = (w.y1 - w.y0) * (w.x1 - w.x0);
    if (w.y0 < 0) w.y0 = 0;
    if (w.x0 < 0) w.x0 = 0;
    if (w.y1 > g.h) w.y1 = g.h;
    if (w.x1 > g.w) w.x1 = g.w;
    int64_t inside = (w.y1 - w.y0) * (w.x1 - w.x0);
    int64_t div = g.count_include_pad ? padded : inside;
    w.divisor = div > 0 ? (float)div : 1.0f;
    return w;
}

/* Outputs whose (unclipped) window starts at o*s - pad and spans k cells and covers input i:
 * o in [lo, hi]. Empty when lo > hi. */
__device__ __forceinline__ void covering(int64_t i, int64_t pad, int64_t k, int64_t s, int64_t n_out,
                                         int64_t *lo, int64_t *hi) {
    int64_t t = i + pad - k + 1; /* o*s >= t */
    int64_t l = t <= 0 ? 0 : (t + s - 1) / s;
    int64_t h = (i + pad) / s;   /* o*s <= i + pad; i + pad >= 0 */
    if (h > n_out - 1) h = n_out - 1;
    *lo = l;
    *hi = h;
}

__global__ void k_maxpool_fwd(float *y, int32_t *argmax, const float *x, ct_pool2d_geom g,
                              int64_t total) {
    int64_t opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / opix, o = idx - p * opix;
        int64_t oy = o / g.ow, ox = o - oy * g.ow;
        const float *xp = x + p * g.h * g.w;
        pool_win w = pool_window(g, oy, ox);
        float best = -INFINITY;
        int64_t best_i = -1;
        for (int64_t iy = w.y0; iy < w.y1; iy++) {
            for (int64_t ix = w.x0; ix < w.x1; ix++) {
                float v = xp[iy * g.w + ix];
                if (v > best || isnan(v) || best_i < 0) {
                    best = v;
                    best_i = iy * g.w + ix;
                }
            }
        }
        y[idx] = best;
        if (argmax) argmax[idx] = (int32_t)best_i;
    }
}

__global__ void k_maxpool_bwd(float *dx, const float *dy, const int32_t *argmax, ct_pool2d_geom g,
                              int64_t total) {
    int64_t plane = g.h * g.w, opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / plane, i = idx - p * plane;
        int64_t iy = i / g.w, ix = i - iy * g.w;
        const float *dyp = dy + p * opix;
        const int32_t *am = argmax + p * opix;
        int64_t oy0, oy1, ox0, ox1;
        covering(iy, g.pad_h, g.kh, g.stride_h, g.oh, &oy0, &oy1);
        covering(ix, g.pad_w, g.kw, g.stride_w, g.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int64_t oy = oy0; oy <= oy1; oy++)
            for (int64_t ox = ox0; ox <= ox1; ox++) {
                int64_t o = oy * g.ow + ox;
                if (am[o] == i) acc += dyp[o];
            }
        dx[idx] = acc;
    }
}

__global__ void k_avgpool_fwd(float *y, const float *x, ct_pool2d_geom g, int64_t total) {
    int64_t opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / opix, o = idx - p * opix;
        int64_t oy = o / g.ow, ox = o - oy * g.ow;
        const float *xp = x + p * g.h * g.w;
        pool_win w = pool_window(g, oy, ox);
        float sum = 0.0f;
        for (int64_t iy = w.y0; iy < w.y1; iy++)
            for (int64_t ix = w.x0; ix < w.x1; ix++) sum += xp[iy * g.w + ix];
        y[idx] = sum / w.divisor;
    }
}

__global__ void k_avgpool_bwd(float *dx, const float *dy, ct_pool2d_geom g, int64_t total) {
    int64_t plane = g.h * g.w, opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / plane, i = idx - p * plane;
        int64_t iy = i / g.w, ix = i - iy * g.w;
        const float *dyp = dy + p * opix;
        int64_t oy0, oy1, ox0, ox1;
        covering(iy, g.pad_h, g.kh, g.stride_h, g.oh, &oy0, &oy1);
        covering(ix, g.pad_w, g.kw, g.stride_w, g.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int64_t oy = oy0; oy <= oy1; oy++)
            for (int64_t ox = ox0; ox <= ox1; ox++) {
                pool_win w = pool_window(g, oy, ox);
                /* the clipped window may exclude this pixel only through padding; it never does
                 * for a real pixel, but keep the CPU's exact membership test */
                if (iy < w.y0 || iy >= w.y1 || ix < w.x0 || ix >= w.x1) continue;
                acc += dyp[oy * g.ow + ox] / w.divisor;
            }
        dx[idx] = acc;
    }
}

static void check_pool(const ct_pool2d_geom *g) {
    CT_CUDA_REQUIRE(g->stride_h >= 1 && g->stride_w >= 1 && g->kh >= 1 && g->kw >= 1 &&
                        g->pad_h >= 0 && g->pad_w >= 0,
                    "pool geometry: kernel and stride must be >= 1, padding >= 0");
}

static void cu_maxpool2d_forward(ct_backend *be, float *y, int32_t *argmax, const float *x,
                                 const ct_pool2d_geom *g) {
    check_pool(g);
    int64_t total = g->n * g->c * g->oh * g->ow;
    LAUNCH(be, total, k_maxpool_fwd, y, argmax, x, *g, total);
}

static void cu_maxpool2d_backward(ct_backend *be, float *dx, const float *dy, const int32_t *argmax,
                                  const ct_pool2d_geom *g) {
    check_pool(g);
    int64_t total = g->n * g->c * g->h * g->w;
    LAUNCH(be, total, k_maxpool_bwd, dx, dy, argmax, *g, total);
}

static void cu_avgpool2d_forward(ct_backend *be, float *y, const float *x, const ct_pool2d_geom *g) {
    check_pool(g);
    int64_t total = g->n * g->c * g->oh * g->ow;
    LAUNCH(be, total, k_avgpool_fwd, y, x, *g, total);
}

static void cu_avgpool2d_backward(ct_backend *be, float *dx, const float *dy,
                                  const ct_pool2d_geom *g) {
    check_pool(g);
    int64_t total = g->n * g->c * g->h * g->w;
    LAUNCH(be, total, k_avgpool_bwd, dx, dy, *g, total);
}

void ct_cuda_conv_install(ct_backend *be) {
    be->im2col = cu_im2col;
    be->col2im = cu_col2im;
    be->maxpool2d_forward = cu_maxpool2d_forward;
    be->maxpool2d_backward = cu_maxpool2d_backward;
    be->avgpool2d_forward = cu_avgpool2d_forward;
    be->avgpool2d_backward = cu_avgpool2d_backward;
}

/* cuda_conv.cu: im2col / col2im and 2-D pooling (NCHW).
 *
 * Layouts are the CPU backend's (core/cpu/cpu_conv.c, cpu_pooling.c):
 *   col[(c * kh + ky) * kw + kx, oy * ow + ox] = img[c0 + c, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw]
 * Backward passes gather instead of scatter: one thread owns one input pixel and adds the
 * contributions in the order the CPU's scatter loop adds them, so no atomics are needed and the
 * bits match the reference. */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"

/* ct_conv2d_geom / ct_pool2d_geom are passed by value: host pointers are not readable here. */

/* Batched layout: col[row, b * ldb_img + p] for images b < nb, row < ch_rows * kh * kw counted
 * from channel c0; one image (ldb_img = 0 unused) is the op table's im2col. img points at image 0,
 * images are c * h * w apart. */
template <typename T>
__global__ void k_im2col(T *col, const T *img, ct_conv2d_geom g, int64_t c0, int64_t rows,
                         int64_t nb) {
    int64_t pix = g.oh * g.ow, total = rows * nb * pix;
    GRID_STRIDE(idx, total) {
        int64_t row = idx / (nb * pix), q = idx - row * (nb * pix);
        int64_t b = q / pix, p = q - b * pix;
        int64_t kx = row % g.kw, ky = (row / g.kw) % g.kh, ch = row / (g.kw * g.kh);
        int64_t oy = p / g.ow, ox = p - oy * g.ow;
        int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dil_h;
        int64_t ix = ox * g.stride_w - g.pad_w + kx * g.dil_w;
        T v = ct_st<T>(0.0f);
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
            v = img[((b * g.c + c0 + ch) * g.h + iy) * g.w + ix];
        col[idx] = v;
    }
}

/* One thread per input pixel of channels [c0, c0 + chans) of nb images: img (+)= the sum over
 * (ky, kx) in order of the column entries that read this pixel (at most one per (ky, kx) since
 * strides are >= 1), formed in fp32 and stored once. col is laid out as k_im2col writes it, in
 * any float type C. accumulate = false overwrites img (whole-batch backward). */
template <typename T, typename C>
__global__ void k_col2im(T *img, const C *col, ct_conv2d_geom g, int64_t c0, int64_t chans,
                         int64_t nb, bool accumulate) {
    int64_t plane = g.h * g.w, pix = g.oh * g.ow, total = nb * chans * plane;
    GRID_STRIDE(idx, total) {
        int64_t b = idx / (chans * plane), rem0 = idx - b * (chans * plane);
        int64_t ch = rem0 / plane, rem = rem0 - ch * plane;
        int64_t iy = rem / g.w, ix = rem - iy * g.w;
        T *dst = img + (b * g.c + c0 + ch) * plane + rem;
        float acc = accumulate ? ct_ld(*dst) : 0.0f;
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
                acc += ct_ld(col[((ch * g.kh + ky) * g.kw + kx) * (nb * pix) + b * pix +
                                 oy * g.ow + ox]);
            }
        }
        *dst = ct_st<T>(acc);
    }
}

static void check_conv(const ct_conv2d_geom *g, int64_t group) {
    CT_CUDA_REQUIRE(g->groups >= 1 && g->c % g->groups == 0 && group >= 0 && group < g->groups,
                    "conv geometry: bad groups");
    CT_CUDA_REQUIRE(g->stride_h >= 1 && g->stride_w >= 1 && g->dil_h >= 1 && g->dil_w >= 1,
                    "conv geometry: stride and dilation must be >= 1");
}

static void cu_im2col(ct_backend *be, void *col, const void *img, const ct_conv2d_geom *g,
                      int64_t group, ct_dtype dt) {
    check_conv(g, group);
    int64_t cg = g->c / g->groups, rows = cg * g->kh * g->kw;
    int64_t total = rows * g->oh * g->ow;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, total, k_im2col<T>, (T *)col, (const T *)img, *g, group * cg, rows,
                          (int64_t)1));
}

static void cu_col2im(ct_backend *be, void *img, const void *col, const ct_conv2d_geom *g,
                      int64_t group, ct_dtype dt) {
    check_conv(g, group);
    int64_t cg = g->c / g->groups;
    int64_t total = cg * g->h * g->w;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, total, (k_col2im<T, T>), (T *)img, (const T *)col, *g, group * cg, cg,
                          (int64_t)1, true));
}

/* ---- whole-batch convolution ----
 * Images are processed in chunks of nb (scratch bounded by CT_CONV_SCRATCH). For a chunk:
 *   col [c*kh*kw, nb*P] (dt)  = im2col of every image side by side (P = oh*ow); rows of group gi
 *                               are gi*K .. (gi+1)*K - 1 with K = c/groups * kh * kw
 *   forward:  yr[oc, nb*P] (fp32) = W[gi] [ocg, K] col[gi]     one GEMM batched over groups
 *             y[b, o, p] = yr[o, b*P + p] + bias[o]              one kernel, one rounding
 *   backward: dyr[oc, nb*P] (dt) = dy rearranged
 *             dw[gi] += dyr[gi] col[gi]^T (fp32, beta 1)       chunks add in order: deterministic
 *             dcol[gi] (fp32) = W[gi]^T dyr[gi]; dx = col2im(dcol)
 *             db via bias_backward over the whole batch. */
#define CT_CONV_SCRATCH ((int64_t)256 << 20)

/* y[b, o, p] = rd(yr[o, b*P + p] + bias[o]) (and the reverse rearrangement for dy below). */
template <typename T>
__global__ void k_conv_out(T *y, const float *yr, const T *bias, int64_t oc, int64_t pix,
                           int64_t nb) {
    GRID_STRIDE(idx, nb * oc * pix) {
        int64_t b = idx / (oc * pix), rem = idx - b * (oc * pix);
        int64_t o = rem / pix, p = rem - o * pix;
        float v = yr[o * (nb * pix) + b * pix + p];
        if (bias) v += ct_ld(bias[o]);
        y[idx] = ct_st<T>(v);
    }
}

/* dyr[o, b*P + p] = dy[b, o, p] */
template <typename T>
__global__ void k_conv_dy_rearrange(T *dyr, const T *dy, int64_t oc, int64_t pix, int64_t nb) {
    GRID_STRIDE(idx, nb * oc * pix) {
        int64_t b = idx / (oc * pix), rem = idx - b * (oc * pix);
        int64_t o = rem / pix, p = rem - o * pix;
        dyr[o * (nb * pix) + b * pix + p] = dy[idx];
    }
}

/* Images per chunk: bytes_per_image * nb <= CT_CONV_SCRATCH, at least 1. */
static int64_t conv_chunk(const ct_conv2d_geom *g, int64_t bytes_per_image) {
    int64_t nb = bytes_per_image > 0 ? CT_CONV_SCRATCH / bytes_per_image : g->n;
    if (nb > g->n) nb = g->n;
    return nb < 1 ? 1 : nb;
}

static void cu_conv2d_forward(ct_backend *be, void *y, const void *x, const void *w,
                              const void *bias, const ct_conv2d_geom *g, ct_dtype dt) {
    check_conv(g, 0);
    CT_CUDA_REQUIRE(g->oc % g->groups == 0, "conv geometry: out channels not divisible by groups");
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(dt), "conv2d: dtype must be f32, f16 or bf16");
    int64_t pix = g->oh * g->ow, rows = g->c * g->kh * g->kw;
    int64_t kg = rows / g->groups, ocg = g->oc / g->groups;
    if (g->n <= 0 || pix <= 0 || g->oc <= 0) return;
    size_t es = ct_dtype_size(dt);
    int64_t nb = conv_chunk(g, pix * (rows * (int64_t)es + g->oc * 4));
    void *col = CT_CUDA_SCRATCH(be, (size_t)(rows * nb * pix) * es);
    float *yr = (float *)CT_CUDA_SCRATCH(be, (size_t)(g->oc * nb * pix) * sizeof(float));
    for (int64_t b0 = 0; b0 < g->n; b0 += nb) {
        int64_t cnt = g->n - b0 < nb ? g->n - b0 : nb;
        int64_t np = cnt * pix;
        const char *xb = (const char *)x + (size_t)(b0 * g->c * g->h * g->w) * es;
        char *yb = (char *)y + (size_t)(b0 * g->oc * pix) * es;
        CT_DT_DISPATCH(dt, T,
                       LAUNCH(be, rows * np, k_im2col<T>, (T *)col, (const T *)xb, *g, (int64_t)0,
                              rows, cnt));
        /* yr[gi] [ocg, np] = W[gi] [ocg, kg] col[gi] [kg, np] */
        ct_cuda_gemm_strided(be, false, false, ocg, np, kg, 1.0f, w, dt, kg, ocg * kg, col, dt, np,
                             kg * np, 0.0f, yr, CT_F32, np, ocg * np, g->groups);
        CT_DT_DISPATCH(dt, T,
                       LAUNCH(be, cnt * g->oc * pix, k_conv_out<T>, (T *)yb, yr, (const T *)bias,
                              g->oc, pix, cnt));
    }
    ct_cuda_scratch_free(be, yr);
    ct_cuda_scratch_free(be, col);
}

static void cu_conv2d_backward(ct_backend *be, void *dx, float *dw, float *db, const void *dy,
                               const void *x, const void *w, const ct_conv2d_geom *g, ct_dtype dt) {
    check_conv(g, 0);
    CT_CUDA_REQUIRE(g->oc % g->groups == 0, "conv geometry: out channels not divisible by groups");
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(dt), "conv2d: dtype must be f32, f16 or bf16");
    int64_t pix = g->oh * g->ow, rows = g->c * g->kh * g->kw;
    int64_t kg = rows / g->groups, ocg = g->oc / g->groups;
    if (g->n <= 0) return;
    if (pix <= 0 || g->oc <= 0) { /* empty output: no gradient reaches x */
        if (dx)
            CT_CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)(g->n * g->c * g->h * g->w) *
                                                     ct_dtype_size(dt), ct_cuda_stream(be)));
        return;
    }
    if (db) be->elt.bias_backward(be, db, dy, g->n, g->oc, pix, dt);
    size_t es = ct_dtype_size(dt);
    int64_t per_image = pix * (rows * (int64_t)es + g->oc * (int64_t)es + (dx ? rows * 4 : 0));
    int64_t nb = conv_chunk(g, per_image);
    void *col = CT_CUDA_SCRATCH(be, (size_t)(rows * nb * pix) * es);
    void *dyr = CT_CUDA_SCRATCH(be, (size_t)(g->oc * nb * pix) * es);
    float *dcol = dx ? (float *)CT_CUDA_SCRATCH(be, (size_t)(rows * nb * pix) * sizeof(float)) : NULL;
    for (int64_t b0 = 0; b0 < g->n; b0 += nb) {
        int64_t cnt = g->n - b0 < nb ? g->n - b0 : nb;
        int64_t np = cnt * pix;
        const char *xb = (const char *)x + (size_t)(b0 * g->c * g->h * g->w) * es;
        const char *dyb = (const char *)dy + (size_t)(b0 * g->oc * pix) * es;
        CT_DT_DISPATCH(dt, T, {
            LAUNCH(be, cnt * g->oc * pix, k_conv_dy_rearrange<T>, (T *)dyr, (const T *)dyb, g->oc,
                   pix, cnt);
            LAUNCH(be, rows * np, k_im2col<T>, (T *)col, (const T *)xb, *g, (int64_t)0, rows, cnt);
        });
        /* dw[gi] [ocg, kg] += dyr[gi] [ocg, np] col[gi]^T [np, kg] */
        ct_cuda_gemm_strided(be, false, true, ocg, kg, np, 1.0f, dyr, dt, np, ocg * np, col, dt, np,
                             kg * np, 1.0f, dw, CT_F32, kg, ocg * kg, g->groups);
        if (!dx) continue;
        /* dcol[gi] [kg, np] = W[gi]^T [kg, ocg] dyr[gi] [ocg, np] */
        ct_cuda_gemm_strided(be, true, false, kg, np, ocg, 1.0f, w, dt, kg, ocg * kg, dyr, dt, np,
                             ocg * np, 0.0f, dcol, CT_F32, np, kg * np, g->groups);
        char *dxb = (char *)dx + (size_t)(b0 * g->c * g->h * g->w) * es;
        CT_DT_DISPATCH(dt, T,
                       LAUNCH(be, cnt * g->c * g->h * g->w, (k_col2im<T, float>), (T *)dxb, dcol, *g,
                              (int64_t)0, g->c, cnt, false));
    }
    if (dcol) ct_cuda_scratch_free(be, dcol);
    ct_cuda_scratch_free(be, dyr);
    ct_cuda_scratch_free(be, col);
}

/* ---- pooling ---- */

/* Window of output (oy, ox), clipped as core/cpu/cpu_pooling.c's pool_window. */
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

template <typename T>
__global__ void k_maxpool_fwd(T *y, int32_t *argmax, const T *x, ct_pool2d_geom g,
                              int64_t total) {
    int64_t opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / opix, o = idx - p * opix;
        int64_t oy = o / g.ow, ox = o - oy * g.ow;
        const T *xp = x + p * g.h * g.w;
        pool_win w = pool_window(g, oy, ox);
        float best = -INFINITY;
        int64_t best_i = -1;
        for (int64_t iy = w.y0; iy < w.y1; iy++) {
            for (int64_t ix = w.x0; ix < w.x1; ix++) {
                float v = ct_ld(xp[iy * g.w + ix]);
                if (v > best || isnan(v) || best_i < 0) {
                    best = v;
                    best_i = iy * g.w + ix;
                }
            }
        }
        y[idx] = ct_st<T>(best);
        if (argmax) argmax[idx] = (int32_t)best_i;
    }
}

template <typename T>
__global__ void k_maxpool_bwd(T *dx, const T *dy, const int32_t *argmax, ct_pool2d_geom g,
                              int64_t total) {
    int64_t plane = g.h * g.w, opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / plane, i = idx - p * plane;
        int64_t iy = i / g.w, ix = i - iy * g.w;
        const T *dyp = dy + p * opix;
        const int32_t *am = argmax + p * opix;
        int64_t oy0, oy1, ox0, ox1;
        covering(iy, g.pad_h, g.kh, g.stride_h, g.oh, &oy0, &oy1);
        covering(ix, g.pad_w, g.kw, g.stride_w, g.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int64_t oy = oy0; oy <= oy1; oy++)
            for (int64_t ox = ox0; ox <= ox1; ox++) {
                int64_t o = oy * g.ow + ox;
                if (am[o] == i) acc += ct_ld(dyp[o]);
            }
        dx[idx] = ct_st<T>(acc);
    }
}

template <typename T>
__global__ void k_avgpool_fwd(T *y, const T *x, ct_pool2d_geom g, int64_t total) {
    int64_t opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / opix, o = idx - p * opix;
        int64_t oy = o / g.ow, ox = o - oy * g.ow;
        const T *xp = x + p * g.h * g.w;
        pool_win w = pool_window(g, oy, ox);
        float sum = 0.0f;
        for (int64_t iy = w.y0; iy < w.y1; iy++)
            for (int64_t ix = w.x0; ix < w.x1; ix++) sum += ct_ld(xp[iy * g.w + ix]);
        y[idx] = ct_st<T>(sum / w.divisor);
    }
}

template <typename T>
__global__ void k_avgpool_bwd(T *dx, const T *dy, ct_pool2d_geom g, int64_t total) {
    int64_t plane = g.h * g.w, opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / plane, i = idx - p * plane;
        int64_t iy = i / g.w, ix = i - iy * g.w;
        const T *dyp = dy + p * opix;
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
                acc += ct_ld(dyp[oy * g.ow + ox]) / w.divisor;
            }
        dx[idx] = ct_st<T>(acc);
    }
}

static void check_pool(const ct_pool2d_geom *g) {
    CT_CUDA_REQUIRE(g->stride_h >= 1 && g->stride_w >= 1 && g->kh >= 1 && g->kw >= 1 &&
                        g->pad_h >= 0 && g->pad_w >= 0,
                    "pool geometry: kernel and stride must be >= 1, padding >= 0");
}

static void cu_maxpool2d_forward(ct_backend *be, void *y, int32_t *argmax, const void *x,
                                 const ct_pool2d_geom *g, ct_dtype dt) {
    check_pool(g);
    int64_t total = g->n * g->c * g->oh * g->ow;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, total, k_maxpool_fwd<T>, (T *)y, argmax, (const T *)x, *g, total));
}

static void cu_maxpool2d_backward(ct_backend *be, void *dx, const void *dy, const int32_t *argmax,
                                  const ct_pool2d_geom *g, ct_dtype dt) {
    check_pool(g);
    int64_t total = g->n * g->c * g->h * g->w;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, total, k_maxpool_bwd<T>, (T *)dx, (const T *)dy, argmax, *g, total));
}

static void cu_avgpool2d_forward(ct_backend *be, void *y, const void *x, const ct_pool2d_geom *g,
                                 ct_dtype dt) {
    check_pool(g);
    int64_t total = g->n * g->c * g->oh * g->ow;
    CT_DT_DISPATCH(dt, T, LAUNCH(be, total, k_avgpool_fwd<T>, (T *)y, (const T *)x, *g, total));
}

static void cu_avgpool2d_backward(ct_backend *be, void *dx, const void *dy, const ct_pool2d_geom *g,
                                  ct_dtype dt) {
    check_pool(g);
    int64_t total = g->n * g->c * g->h * g->w;
    CT_DT_DISPATCH(dt, T, LAUNCH(be, total, k_avgpool_bwd<T>, (T *)dx, (const T *)dy, *g, total));
}

void ct_cuda_conv_install(ct_backend *be) {
    be->conv.im2col = cu_im2col;
    be->conv.col2im = cu_col2im;
    be->conv.conv2d_forward = cu_conv2d_forward;
    be->conv.conv2d_backward = cu_conv2d_backward;
    be->conv.maxpool2d_forward = cu_maxpool2d_forward;
    be->conv.maxpool2d_backward = cu_maxpool2d_backward;
    be->conv.avgpool2d_forward = cu_avgpool2d_forward;
    be->conv.avgpool2d_backward = cu_avgpool2d_backward;
}

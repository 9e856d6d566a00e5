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

/* Column rows r < rows: group gi = r / kgp, row rr = r - gi * kgp inside it; rr >= kg is a zero
 * padding row, else (ch * kh + ky) * kw + kx for channel c0 + gi * (c / groups) + ch. Columns
 * b * P + p for images b < nb and pixels p < P = oh * ow. img points at image 0, images c * h * w
 * apart. The op table's one-image im2col is nb = 1, kgp = kg = rows, c0 = the group's first
 * channel. One plane per row. */
template <typename T>
__global__ void k_im2col(T *col, const T *img, ct_conv2d_geom g, int64_t c0, int kg, int kgp,
                         int64_t rows, int nb) {
    const int pix = (int)(g.oh * g.ow), cols = nb * pix, ow = (int)g.ow, h = (int)g.h, w = (int)g.w;
    const int kh = (int)g.kh, kw = (int)g.kw, sh = (int)g.stride_h, sw = (int)g.stride_w;
    const int64_t plane = g.h * g.w, cg = g.c / g.groups;
    PLANE_STRIDE(r, rows) {
        const int gi = (int)(r / kgp), rr = (int)(r - (int64_t)gi * kgp);
        const bool zero = rr >= kg;
        const int kx = rr % kw, ky = (rr / kw) % kh;
        const int64_t ch = c0 + gi * cg + rr / (kw * kh);
        const int iy0 = ky * (int)g.dil_h - (int)g.pad_h, ix0 = kx * (int)g.dil_w - (int)g.pad_w;
        const T *src = img + ch * plane;
        T *dst = col + r * cols;
        INNER_STRIDE(q, cols) {
            T v = ct_st<T>(0.0f);
            if (!zero) {
                const int b = q / pix, p = q - b * pix, oy = p / ow, ox = p - oy * ow;
                const int iy = oy * sh + iy0, ix = ox * sw + ix0;
                if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = src[b * g.c * plane + iy * w + ix];
            }
            dst[q] = v;
        }
    }
}

/* One thread per input pixel of channels [c0, c0 + chans) of nb images: img (+)= the sum over
 * (ky, kx) in order of the column entries that read this pixel (at most one per (ky, kx) since
 * strides are >= 1), formed in fp32 and stored once. col is laid out as k_im2col writes it (groups
 * of kgp rows, cg channels a group), in any float type C. accumulate = false overwrites img
 * (whole-batch backward). One plane per (image, channel). */
template <typename T, typename C>
__global__ void k_col2im(T *img, const C *col, ct_conv2d_geom g, int64_t c0, int64_t chans,
                         int64_t cg, int kgp, int nb, bool accumulate) {
    const int pix = (int)(g.oh * g.ow), cols = nb * pix, plane = (int)(g.h * g.w), w = (int)g.w;
    const int kh = (int)g.kh, kw = (int)g.kw, sh = (int)g.stride_h, sw = (int)g.stride_w;
    const int oh = (int)g.oh, ow = (int)g.ow, ph = (int)g.pad_h, pw = (int)g.pad_w;
    const int dh = (int)g.dil_h, dw = (int)g.dil_w;
    PLANE_STRIDE(pl, nb * chans) {
        const int64_t b = pl / chans, ch = pl - b * chans, gi = ch / cg;
        const C *src = col + (gi * kgp + (ch - gi * cg) * kh * kw) * cols + b * pix;
        T *dst = img + (b * g.c + c0 + ch) * plane;
        INNER_STRIDE(i, plane) {
            const int iy = i / w, ix = i - iy * w;
            float acc = accumulate ? ct_ld(dst[i]) : 0.0f;
            for (int ky = 0; ky < kh; ky++) {
                const int ty = iy + ph - ky * dh;
                if (ty < 0 || ty % sh) continue;
                const int oy = ty / sh;
                if (oy >= oh) continue;
                for (int kx = 0; kx < kw; kx++) {
                    const int tx = ix + pw - kx * dw;
                    if (tx < 0 || tx % sw) continue;
                    const int ox = tx / sw;
                    if (ox >= ow) continue;
                    acc += ct_ld(src[(int64_t)(ky * kw + kx) * cols + oy * ow + ox]);
                }
            }
            dst[i] = ct_st<T>(acc);
        }
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
    CT_DT_DISPATCH(dt, T,
                   LAUNCH_PLANES(be, rows, g->oh * g->ow, k_im2col<T>, (T *)col, (const T *)img, *g,
                                 group * cg, (int)rows, (int)rows, rows, 1));
}

static void cu_col2im(ct_backend *be, void *img, const void *col, const ct_conv2d_geom *g,
                      int64_t group, ct_dtype dt) {
    check_conv(g, group);
    int64_t cg = g->c / g->groups;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH_PLANES(be, cg, g->h * g->w, (k_col2im<T, T>), (T *)img, (const T *)col, *g,
                                 group * cg, cg, cg, (int)(cg * g->kh * g->kw), 1, true));
}

/* ---- whole-batch convolution ----
 * Images are processed in chunks of nb (ct_conv2d_chunk_images, core/backend/backend.h: the
 * scratch, one block, stays under CT_CONV_CHUNK_BYTES, and the memory plan counts it). Each
 * group's K = c/groups * kh * kw column rows are padded with zero rows to Kp, a multiple of 8
 * (ct_conv2d_group_rows); when K != Kp the weights are copied into Wp [oc, Kp] with zero columns,
 * so that every GEMM operand is 16-byte aligned. For a chunk:
 *   col [groups * Kp, nb*P] (dt) = im2col of every image side by side (P = oh*ow)
 *   forward:  yr[oc, nb*P] (fp32) = W[gi] [ocg, Kp] col[gi]    one GEMM batched over groups
 *             y[b, o, p] = yr[o, b*P + p] + bias[o]             one kernel, one rounding
 *   backward: dyr[oc, nb*P] (dt) = dy rearranged
 *             dw[gi] += dyr[gi] col[gi]^T (fp32, beta 1)      chunks add in order: deterministic
 *               (padded: into dWp [oc, Kp] over the chunks, then dw += its first K columns)
 *             dcol[gi] (fp32) = W[gi]^T dyr[gi]; dx = col2im(dcol)
 *             db via bias_backward over the whole batch. */

/* y[b, o, p] = rd(yr[o, b*P + p] + bias[o]) (and the reverse rearrangement for dy below). One
 * flat grid: the plane form (a block per (b, o)) measured 15% slower at P = 196 (ncu, H100). */
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

/* The buffers of one whole-batch pass, carved from one scratch block (ct_conv2d_scratch_bytes). */
typedef struct conv_pass {
    int64_t pix, kg, kgp, rows, ocg, nb;   /* rows = groups * kgp */
    void *col, *dyr, *wp;                  /* col [rows, nb*P], dyr [oc, nb*P], wp [oc, kgp] (dt) */
    float *yr, *dcol, *dwp;                /* yr [oc, nb*P], dcol [rows, nb*P], dwp [oc, kgp] */
    void *block;
} conv_pass;

static char *carve(char **at, size_t bytes) {
    char *p = *at;
    *at += (bytes + CT_CONV_SCRATCH_ALIGN - 1) / CT_CONV_SCRATCH_ALIGN * CT_CONV_SCRATCH_ALIGN;
    return p;
}

static conv_pass conv_pass_begin(ct_backend *be, const ct_conv2d_geom *g, ct_dtype dt, const void *w,
                                 bool backward, bool dx) {
    size_t es = ct_dtype_size(dt), bytes = ct_conv2d_scratch_bytes(g, es);
    conv_pass c = {};
    c.pix = g->oh * g->ow;
    c.kg = g->c / g->groups * g->kh * g->kw;
    c.kgp = ct_conv2d_group_rows(g);
    c.rows = g->groups * c.kgp;
    c.ocg = g->oc / g->groups;
    c.nb = ct_conv2d_chunk_images(g, es);
    CT_CUDA_REQUIRE(c.nb * c.pix <= INT32_MAX && c.kgp <= INT32_MAX, "convolution chunk too large");
    c.block = CT_CUDA_SCRATCH(be, bytes);
    char *at = (char *)c.block, *end = at + bytes;
    size_t cols = (size_t)(c.nb * c.pix);
    c.col = carve(&at, (size_t)c.rows * cols * es);
    if (!backward) c.yr = (float *)carve(&at, (size_t)g->oc * cols * sizeof(float));
    else {
        c.dyr = carve(&at, (size_t)g->oc * cols * es);
        if (dx) c.dcol = (float *)carve(&at, (size_t)c.rows * cols * sizeof(float));
    }
    if (c.kgp != c.kg) {
        c.wp = carve(&at, (size_t)(g->oc * c.kgp) * es);
        if (backward) c.dwp = (float *)carve(&at, (size_t)(g->oc * c.kgp) * sizeof(float));
        /* wp [oc, kgp] = w [oc, kg] and zero columns */
        CT_CUDA_CHECK(cudaMemsetAsync(c.wp, 0, (size_t)(g->oc * c.kgp) * es, ct_cuda_stream(be)));
        be->elt.copy_rows(be, c.wp, c.kgp, w, c.kg, g->oc, c.kg, false, dt);
    }
    CT_CUDA_REQUIRE(at <= end, "convolution scratch carved past its block");
    return c;
}

static void cu_conv2d_forward(ct_backend *be, void *y, const void *x, const void *w,
                              const void *bias, const ct_conv2d_geom *g, ct_dtype dt) {
    check_conv(g, 0);
    CT_CUDA_REQUIRE(g->oc % g->groups == 0, "conv geometry: out channels not divisible by groups");
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(dt), "conv2d: dtype must be f32, f16 or bf16");
    if (g->n <= 0 || g->oh * g->ow <= 0 || g->oc <= 0) return;
    size_t es = ct_dtype_size(dt);
    conv_pass c = conv_pass_begin(be, g, dt, w, false, false);
    const void *wk = c.wp ? c.wp : w;   /* [oc, kgp] */
    for (int64_t b0 = 0; b0 < g->n; b0 += c.nb) {
        int64_t cnt = g->n - b0 < c.nb ? g->n - b0 : c.nb;
        int64_t np = cnt * c.pix;
        const char *xb = (const char *)x + (size_t)(b0 * g->c * g->h * g->w) * es;
        char *yb = (char *)y + (size_t)(b0 * g->oc * c.pix) * es;
        CT_DT_DISPATCH(dt, T,
                       LAUNCH_PLANES(be, c.rows, np, k_im2col<T>, (T *)c.col, (const T *)xb, *g,
                                     (int64_t)0, (int)c.kg, (int)c.kgp, c.rows, (int)cnt));
        /* yr[gi] [ocg, np] = W[gi] [ocg, kgp] col[gi] [kgp, np] */
        ct_cuda_gemm_strided(be, false, false, c.ocg, np, c.kgp, 1.0f, wk, dt, c.kgp, c.ocg * c.kgp,
                             c.col, dt, np, c.kgp * np, 0.0f, c.yr, CT_F32, np, c.ocg * np, g->groups);
        CT_DT_DISPATCH(dt, T,
                       LAUNCH(be, cnt * g->oc * c.pix, k_conv_out<T>, (T *)yb, c.yr, (const T *)bias,
                              g->oc, c.pix, cnt));
    }
    ct_cuda_scratch_free(be, c.block);
}

static void cu_conv2d_backward(ct_backend *be, void *dx, float *dw, float *db, const void *dy,
                               const void *x, const void *w, const ct_conv2d_geom *g, ct_dtype dt) {
    check_conv(g, 0);
    CT_CUDA_REQUIRE(g->oc % g->groups == 0, "conv geometry: out channels not divisible by groups");
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(dt), "conv2d: dtype must be f32, f16 or bf16");
    if (g->n <= 0) return;
    if (g->oh * g->ow <= 0 || g->oc <= 0) { /* empty output: no gradient reaches x */
        if (dx)
            CT_CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)(g->n * g->c * g->h * g->w) *
                                                     ct_dtype_size(dt), ct_cuda_stream(be)));
        return;
    }
    if (db) be->elt.bias_backward(be, db, dy, g->n, g->oc, g->oh * g->ow, dt);
    size_t es = ct_dtype_size(dt);
    conv_pass c = conv_pass_begin(be, g, dt, w, true, dx != NULL);
    const void *wk = c.wp ? c.wp : w;
    float *dwk = c.dwp ? c.dwp : dw;    /* [oc, kgp] */
    for (int64_t b0 = 0; b0 < g->n; b0 += c.nb) {
        int64_t cnt = g->n - b0 < c.nb ? g->n - b0 : c.nb;
        int64_t np = cnt * c.pix;
        const char *xb = (const char *)x + (size_t)(b0 * g->c * g->h * g->w) * es;
        const char *dyb = (const char *)dy + (size_t)(b0 * g->oc * c.pix) * es;
        CT_DT_DISPATCH(dt, T, {
            LAUNCH(be, cnt * g->oc * c.pix, k_conv_dy_rearrange<T>, (T *)c.dyr, (const T *)dyb, g->oc,
                   c.pix, cnt);
            LAUNCH_PLANES(be, c.rows, np, k_im2col<T>, (T *)c.col, (const T *)xb, *g, (int64_t)0,
                          (int)c.kg, (int)c.kgp, c.rows, (int)cnt);
        });
        /* dw[gi] [ocg, kgp] += dyr[gi] [ocg, np] col[gi]^T [np, kgp] (the padded copy starts at 0) */
        float beta = c.dwp && b0 == 0 ? 0.0f : 1.0f;
        ct_cuda_gemm_strided(be, false, true, c.ocg, c.kgp, np, 1.0f, c.dyr, dt, np, c.ocg * np, c.col,
                             dt, np, c.kgp * np, beta, dwk, CT_F32, c.kgp, c.ocg * c.kgp, g->groups);
        if (!dx) continue;
        /* dcol[gi] [kgp, np] = W[gi]^T [kgp, ocg] dyr[gi] [ocg, np] */
        ct_cuda_gemm_strided(be, true, false, c.kgp, np, c.ocg, 1.0f, wk, dt, c.kgp, c.ocg * c.kgp, c.dyr,
                             dt, np, c.ocg * np, 0.0f, c.dcol, CT_F32, np, c.kgp * np, g->groups);
        char *dxb = (char *)dx + (size_t)(b0 * g->c * g->h * g->w) * es;
        CT_DT_DISPATCH(dt, T,
                       LAUNCH_PLANES(be, cnt * g->c, g->h * g->w, (k_col2im<T, float>), (T *)dxb, c.dcol,
                                     *g, (int64_t)0, g->c, g->c / g->groups, (int)c.kgp, (int)cnt, false));
    }
    if (c.dwp) be->elt.copy_rows(be, dw, c.kg, c.dwp, c.kgp, g->oc, c.kg, true, CT_F32);   /* dw += dwp[:, :kg] */
    ct_cuda_scratch_free(be, c.block);
}

/* ---- pooling ---- */

/* Window of output (oy, ox), clipped as core/cpu/cpu_pooling.c's pool_window; I is the index
 * type (int inside a plane, int64_t elsewhere). */
template <typename I> struct pool_win {
    I y0, y1, x0, x1;
    float divisor;
};

template <typename I>
__device__ __forceinline__ pool_win<I> pool_window(const ct_pool2d_geom &g, I oy, I ox) {
    const I kh = (I)g.kh, kw = (I)g.kw, ph = (I)g.pad_h, pw = (I)g.pad_w, h = (I)g.h, w_ = (I)g.w;
    pool_win<I> w;
    w.y0 = oy * (I)g.stride_h - ph;
    w.x0 = ox * (I)g.stride_w - pw;
    w.y1 = w.y0 + kh;
    w.x1 = w.x0 + kw;
    if (w.y1 > h + ph) w.y1 = h + ph;
    if (w.x1 > w_ + pw) w.x1 = w_ + pw;
    I padded = (w.y1 - w.y0) * (w.x1 - w.x0);
    if (w.y0 < 0) w.y0 = 0;
    if (w.x0 < 0) w.x0 = 0;
    if (w.y1 > h) w.y1 = h;
    if (w.x1 > w_) w.x1 = w_;
    I inside = (w.y1 - w.y0) * (w.x1 - w.x0);
    I div = g.count_include_pad ? padded : inside;
    w.divisor = div > 0 ? (float)div : 1.0f;
    return w;
}

/* Outputs whose (unclipped) window starts at o*s - pad and spans k cells and covers input i:
 * o in [lo, hi]. Empty when lo > hi. */
template <typename I>
__device__ __forceinline__ void covering(I i, I pad, I k, I s, I n_out, I *lo, I *hi) {
    I t = i + pad - k + 1; /* o*s >= t */
    I l = t <= 0 ? 0 : (t + s - 1) / s;
    I h = (i + pad) / s;   /* o*s <= i + pad; i + pad >= 0 */
    if (h > n_out - 1) h = n_out - 1;
    *lo = l;
    *hi = h;
}

/* One plane per (image, channel); the first of equal maxima wins, NaN wins (the CPU's rule). */
template <typename T>
__global__ void k_maxpool_fwd(T *y, int32_t *argmax, const T *x, ct_pool2d_geom g, int64_t planes) {
    const int opix = (int)(g.oh * g.ow), ow = (int)g.ow, w = (int)g.w, plane = (int)(g.h * g.w);
    PLANE_STRIDE(pl, planes) {
        const T *xp = x + pl * plane;
        INNER_STRIDE(o, opix) {
            const int oy = o / ow, ox = o - oy * ow;
            pool_win<int> win = pool_window<int>(g, oy, ox);
            float best = -INFINITY;
            int best_i = -1;
            for (int iy = win.y0; iy < win.y1; iy++)
                for (int ix = win.x0; ix < win.x1; ix++) {
                    float v = ct_ld(xp[iy * w + ix]);
                    if (v > best || isnan(v) || best_i < 0) {
                        best = v;
                        best_i = iy * w + ix;
                    }
                }
            y[pl * opix + o] = ct_st<T>(best);
            if (argmax) argmax[pl * opix + o] = best_i;
        }
    }
}

/* One thread per input pixel: the sum of the gradients of the outputs whose argmax it is. */
template <typename T>
__global__ void k_maxpool_bwd(T *dx, const T *dy, const int32_t *argmax, ct_pool2d_geom g, int64_t planes) {
    const int opix = (int)(g.oh * g.ow), ow = (int)g.ow, w = (int)g.w, plane = (int)(g.h * g.w);
    PLANE_STRIDE(pl, planes) {
        const T *dyp = dy + pl * opix;
        const int32_t *am = argmax + pl * opix;
        INNER_STRIDE(i, plane) {
            const int iy = i / w, ix = i - iy * w;
            int oy0, oy1, ox0, ox1;
            covering<int>(iy, (int)g.pad_h, (int)g.kh, (int)g.stride_h, (int)g.oh, &oy0, &oy1);
            covering<int>(ix, (int)g.pad_w, (int)g.kw, (int)g.stride_w, ow, &ox0, &ox1);
            float acc = 0.0f;
            for (int oy = oy0; oy <= oy1; oy++)
                for (int ox = ox0; ox <= ox1; ox++) {
                    const int o = oy * ow + ox;
                    if (am[o] == i) acc += ct_ld(dyp[o]);
                }
            dx[pl * plane + i] = ct_st<T>(acc);
        }
    }
}

template <typename T>
__global__ void k_avgpool_fwd(T *y, const T *x, ct_pool2d_geom g, int64_t total) {
    int64_t opix = g.oh * g.ow;
    GRID_STRIDE(idx, total) {
        int64_t p = idx / opix, o = idx - p * opix;
        int64_t oy = o / g.ow, ox = o - oy * g.ow;
        const T *xp = x + p * g.h * g.w;
        pool_win<int64_t> w = pool_window<int64_t>(g, oy, ox);
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
        covering<int64_t>(iy, g.pad_h, g.kh, g.stride_h, g.oh, &oy0, &oy1);
        covering<int64_t>(ix, g.pad_w, g.kw, g.stride_w, g.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int64_t oy = oy0; oy <= oy1; oy++)
            for (int64_t ox = ox0; ox <= ox1; ox++) {
                pool_win<int64_t> w = pool_window<int64_t>(g, oy, ox);
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
    int64_t planes = g->n * g->c;
    CT_CUDA_REQUIRE(g->h * g->w <= INT32_MAX, "pool: a plane of more than 2^31 pixels");
    CT_DT_DISPATCH(dt, T,
                   LAUNCH_PLANES(be, planes, g->oh * g->ow, k_maxpool_fwd<T>, (T *)y, argmax, (const T *)x,
                                 *g, planes));
}

static void cu_maxpool2d_backward(ct_backend *be, void *dx, const void *dy, const int32_t *argmax,
                                  const ct_pool2d_geom *g, ct_dtype dt) {
    check_pool(g);
    int64_t planes = g->n * g->c;
    CT_DT_DISPATCH(dt, T,
                   LAUNCH_PLANES(be, planes, g->h * g->w, k_maxpool_bwd<T>, (T *)dx, (const T *)dy, argmax,
                                 *g, planes));
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

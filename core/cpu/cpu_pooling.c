/* cpu_pooling.c: max and average pooling over NCHW, one (n, c) plane per work item.
 *
 * Max pooling pads with -inf and keeps the first maximum in window order (ties), propagating NaN
 * as PyTorch does; argmax is the index inside the input plane (iy * w + ix). Average pooling
 * follows PyTorch's divisor rule: the window is clipped to the padded input for
 * count_include_pad, and to the real input otherwise. */
#include <math.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

typedef struct {
    float *out;
    const float *in;
    int32_t *argmax;
    const int32_t *cargmax;
    const ct_pool2d_geom *g;
} pool_ctx;

/* Window of output (oy, ox): input rows [y0, y1), cols [x0, x1) and the avgpool divisor. */
typedef struct {
    int64_t y0, y1, x0, x1;
    float divisor;
} window;

static window pool_window(const ct_pool2d_geom *g, int64_t oy, int64_t ox) {
    window w;
    w.y0 = oy * g->stride_h - g->pad_h;
    w.x0 = ox * g->stride_w - g->pad_w;
    w.y1 = w.y0 + g->kh;
    w.x1 = w.x0 + g->kw;
    if (w.y1 > g->h + g->pad_h) w.y1 = g->h + g->pad_h;
    if (w.x1 > g->w + g->pad_w) w.x1 = g->w + g->pad_w;
    int64_t padded = (w.y1 - w.y0) * (w.x1 - w.x0);
    if (w.y0 < 0) w.y0 = 0;
    if (w.x0 < 0) w.x0 = 0;
    if (w.y1 > g->h) w.y1 = g->h;
    if (w.x1 > g->w) w.x1 = g->w;
    int64_t inside = (w.y1 - w.y0) * (w.x1 - w.x0);
    int64_t div = g->count_include_pad ? padded : inside;
    w.divisor = div > 0 ? (float)div : 1.0f;
    return w;
}

/* take = v > best or v is NaN (NaN propagates, as in torch), without a short-circuit branch */
static inline bool max_takes(float v, float best) { return (v > best) | (v != v); }

/* take ? v : best, and take ? a : b, through bit masks: a select the compiler cannot turn back
 * into a branch (it did, once the loop below was no longer inlined into its caller: the pool then
 * took 2.5 times as long, perf). The bits of v or best are moved unchanged (NaN payloads too). */
static inline float pick_f(bool take, float v, float best) {
    uint32_t m = 0u - (uint32_t)take, a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, &best, sizeof b);
    a = (a & m) | (b & ~m);
    memcpy(&v, &a, sizeof v);
    return v;
}
static inline int32_t pick_i(bool take, int32_t a, int32_t b) {
    int32_t m = -(int32_t)take;
    return (a & m) | (b & ~m);
}

/* 2x2 windows, stride 2, no padding: the common case gets a branch-free loop over a row of
 * outputs. After a ReLU the winner's position in a window is random, and the compare-and-branch
 * of the general loop mispredicted often enough to cost as much as the conv GEMMs (perf: 25% of
 * a CNN step). */
void ct_cpu_maxpool2x2_plane(const float *x, float *y, int32_t *am, const ct_pool2d_geom *g) {
    /* geometry in locals: the stores below could alias *g as far as the compiler knows */
    int64_t w = g->w, oh = g->oh, ow = g->ow;
    for (int64_t oy = 0; oy < oh; oy++) {
        const float *r0 = x + 2 * oy * w, *r1 = r0 + w;
        float *yo = y + oy * ow;
        int32_t *ao = am + oy * ow, base = (int32_t)(2 * oy * w);
        for (int64_t ox = 0; ox < ow; ox++) {
            float best = r0[2 * ox], v;
            int32_t off = 0;
            bool t;
            v = r0[2 * ox + 1];
            t = max_takes(v, best);
            best = pick_f(t, v, best);
            off = pick_i(t, 1, off);
            v = r1[2 * ox];
            t = max_takes(v, best);
            best = pick_f(t, v, best);
            off = pick_i(t, (int32_t)w, off);
            v = r1[2 * ox + 1];
            t = max_takes(v, best);
            best = pick_f(t, v, best);
            off = pick_i(t, (int32_t)w + 1, off);
            yo[ox] = best;
            ao[ox] = base + (int32_t)(2 * ox) + off;
        }
    }
}

static void maxpool_fwd_range(void *c, int64_t p0, int64_t p1) {
    pool_ctx *k = c;
    /* geometry in locals: the stores below could alias *k->g as far as the compiler knows */
    const ct_pool2d_geom g = *k->g;
    bool two_by_two = g.kh == 2 && g.kw == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
                      g.pad_w == 0 && k->argmax && 2 * g.oh <= g.h && 2 * g.ow <= g.w;
    for (int64_t p = p0; p < p1; p++) {
        const float *x = k->in + p * g.h * g.w;
        float *y = k->out + p * g.oh * g.ow;
        int32_t *am = k->argmax ? k->argmax + p * g.oh * g.ow : NULL;
        if (two_by_two) {
            ct_cpu_maxpool2x2_plane(x, y, am, &g);
            continue;
        }
        for (int64_t oy = 0; oy < g.oh; oy++) {
            int64_t y0 = oy * g.stride_h - g.pad_h, y1 = y0 + g.kh;
            y0 = y0 < 0 ? 0 : y0;
            y1 = y1 > g.h ? g.h : y1;
            for (int64_t ox = 0; ox < g.ow; ox++) {
                int64_t x0 = ox * g.stride_w - g.pad_w, x1 = x0 + g.kw;
                x0 = x0 < 0 ? 0 : x0;
                x1 = x1 > g.w ? g.w : x1;
                /* the window's first element starts the search, so an all -inf window still
                 * names an input (-1 only for a window entirely in the padding) */
                float best = -INFINITY;
                int64_t best_i = -1;
                if (y0 < y1 && x0 < x1) {
                    best_i = y0 * g.w + x0;
                    best = x[best_i];
                }
                for (int64_t iy = y0; iy < y1; iy++) {
                    const float *row = x + iy * g.w;
                    for (int64_t ix = x0; ix < x1; ix++) {
                        float v = row[ix];
                        bool t = max_takes(v, best);
                        best = t ? v : best;
                        best_i = t ? iy * g.w + ix : best_i;
                    }
                }
                y[oy * g.ow + ox] = best;
                if (am) am[oy * g.ow + ox] = (int32_t)best_i;
            }
        }
    }
}

static void maxpool_bwd_range(void *c, int64_t p0, int64_t p1) {
    pool_ctx *k = c;
    const ct_pool2d_geom *g = k->g;
    for (int64_t p = p0; p < p1; p++) {
        float *dx = k->out + p * g->h * g->w;
        const float *dy = k->in + p * g->oh * g->ow;
        const int32_t *am = k->cargmax + p * g->oh * g->ow;
        memset(dx, 0, (size_t)(g->h * g->w) * sizeof(float));
        for (int64_t o = 0; o < g->oh * g->ow; o++)
            if (am[o] >= 0) dx[am[o]] += dy[o];
    }
}

static void avgpool_fwd_range(void *c, int64_t p0, int64_t p1) {
    pool_ctx *k = c;
    const ct_pool2d_geom *g = k->g;
    for (int64_t p = p0; p < p1; p++) {
        const float *x = k->in + p * g->h * g->w;
        float *y = k->out + p * g->oh * g->ow;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            for (int64_t ox = 0; ox < g->ow; ox++) {
                window w = pool_window(g, oy, ox);
                float sum = 0.0f;
                for (int64_t iy = w.y0; iy < w.y1; iy++)
                    for (int64_t ix = w.x0; ix < w.x1; ix++) sum += x[iy * g->w + ix];
                y[oy * g->ow + ox] = sum / w.divisor;
            }
        }
    }
}

static void avgpool_bwd_range(void *c, int64_t p0, int64_t p1) {
    pool_ctx *k = c;
    const ct_pool2d_geom *g = k->g;
    for (int64_t p = p0; p < p1; p++) {
        float *dx = k->out + p * g->h * g->w;
        const float *dy = k->in + p * g->oh * g->ow;
        memset(dx, 0, (size_t)(g->h * g->w) * sizeof(float));
        for (int64_t oy = 0; oy < g->oh; oy++) {
            for (int64_t ox = 0; ox < g->ow; ox++) {
                window w = pool_window(g, oy, ox);
                float d = dy[oy * g->ow + ox] / w.divisor;
                for (int64_t iy = w.y0; iy < w.y1; iy++)
                    for (int64_t ix = w.x0; ix < w.x1; ix++) dx[iy * g->w + ix] += d;
            }
        }
    }
}

static int64_t plane_grain(const ct_pool2d_geom *g) {
    int64_t work = g->h * g->w + g->oh * g->ow * g->kh * g->kw;
    return ct_cpu_ceil_div(CT_CPU_GRAIN, work > 0 ? work : 1);
}

void ct_cpu_f32_maxpool2d_forward(ct_backend *be, float *y, int32_t *argmax, const float *x,
                                  const ct_pool2d_geom *g) {
    pool_ctx c = {.out = y, .in = x, .argmax = argmax, .g = g};
    ct_cpu_parallel(ct_cpu_pool_of(be), g->n * g->c, plane_grain(g), maxpool_fwd_range, &c);
}

void ct_cpu_f32_maxpool2d_backward(ct_backend *be, float *dx, const float *dy, const int32_t *argmax,
                                   const ct_pool2d_geom *g) {
    pool_ctx c = {.out = dx, .in = dy, .cargmax = argmax, .g = g};
    ct_cpu_parallel(ct_cpu_pool_of(be), g->n * g->c, plane_grain(g), maxpool_bwd_range, &c);
}

void ct_cpu_f32_avgpool2d_forward(ct_backend *be, float *y, const float *x, const ct_pool2d_geom *g) {
    pool_ctx c = {.out = y, .in = x, .g = g};
    ct_cpu_parallel(ct_cpu_pool_of(be), g->n * g->c, plane_grain(g), avgpool_fwd_range, &c);
}

void ct_cpu_f32_avgpool2d_backward(ct_backend *be, float *dx, const float *dy, const ct_pool2d_geom *g) {
    pool_ctx c = {.out = dx, .in = dy, .g = g};
    ct_cpu_parallel(ct_cpu_pool_of(be), g->n * g->c, plane_grain(g), avgpool_bwd_range, &c);
}

void ct_cpu_pooling_install(ct_backend *be) {
}

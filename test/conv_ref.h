/* conv_ref.h: direct 2-D convolution in double, the independent reference for the convolution
 * ops (test_ops' rows, test_cuda_ops' whole-batch check). Shared so there is one reference. */
#ifndef CT_TEST_CONV_REF_H
#define CT_TEST_CONV_REF_H

#include <string.h>

#include "core/backend/backend.h"

/* Input index of output position o, kernel tap t; -1 in the padding. */
static inline int64_t conv_at(int64_t o, int64_t t, int64_t stride, int64_t pad, int64_t dil, int64_t size) {
    int64_t i = o * stride - pad + t * dil;
    return i >= 0 && i < size ? i : -1;
}

/* Direct convolution in double: y (+ bias) from x and w; with dy: dx (written), dw and db
 * (added to). Any of the outputs may be NULL. */
static inline void conv_direct(const ct_conv2d_geom *g, const double *x, const double *w, const double *b, double *y,
                        const double *dy, double *dx, double *dw, double *db) {
    int64_t cg = g->c / g->groups, ocg = g->oc / g->groups;
    if (dx) memset(dx, 0, (size_t)(g->n * g->c * g->h * g->w) * sizeof(double));
    for (int64_t i = 0; i < g->n; i++)
        for (int64_t o = 0; o < g->oc; o++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t at = ((i * g->oc + o) * g->oh + oy) * g->ow + ox;
                    double acc = b ? b[o] : 0.0, go = dy ? dy[at] : 0.0;
                    if (db) db[o] += go;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t iy = conv_at(oy, ky, g->stride_h, g->pad_h, g->dil_h, g->h);
                                int64_t ix = conv_at(ox, kx, g->stride_w, g->pad_w, g->dil_w, g->w);
                                if (iy < 0 || ix < 0) continue;
                                int64_t xi = ((i * g->c + (o / ocg) * cg + ci) * g->h + iy) * g->w + ix;
                                int64_t wi = ((o * cg + ci) * g->kh + ky) * g->kw + kx;
                                acc += x[xi] * w[wi];
                                if (dw) dw[wi] += go * x[xi];
                                if (dx) dx[xi] += go * w[wi];
                            }
                    if (y) y[at] = acc;
                }
}

#endif

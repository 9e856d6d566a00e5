/* plot.h: curves of a run as one PNG (`ctrain plot`, cmd/plot.c): panels stacked over a shared x
 * axis, each with its series as lines (or marked points), a title with a legend, and labelled
 * ticks. Drawn into an RGB canvas here (lines, squares, a built-in 5x7 pixel font) and written
 * with libpng, which ctrain links already for its image datasets: no drawing library, no font
 * files, the same pixels on every machine. */
#ifndef CT_REPORT_PLOT_H
#define CT_REPORT_PLOT_H

#include <stdint.h>

#include "core/util/common.h"

typedef struct ct_plot_series {
    const char *label;           /* in the panel's legend */
    const double *x, *y;         /* [n]; a point with a non-finite y is left out (a gap) */
    int n;
    uint32_t rgb;                /* 0xRRGGBB */
    bool points;                 /* also mark every point (evals: a few points) */
} ct_plot_series;

#define CT_PLOT_MAX_SERIES 8
typedef struct ct_plot_panel {
    const char *title;
    ct_plot_series series[CT_PLOT_MAX_SERIES];
    int n_series;
} ct_plot_panel;

#define CT_PLOT_MIN_SIDE 160
#define CT_PLOT_MAX_SIDE 8192

/* Draw the panels top to bottom on a width x height white canvas, x labelled `x_label` under the
 * last one, and write it to path as an 8-bit RGB PNG. Panels without a finite point are drawn
 * empty ("no data"). CT_ERR_CONFIG for a size outside [CT_PLOT_MIN_SIDE, CT_PLOT_MAX_SIDE],
 * CT_ERR_RUNTIME naming path when it cannot be written. */
int ct_plot_png(const ct_plot_panel *panels, int n_panels, const char *x_label, int width, int height,
                const char *path, ct_err *err);

#endif

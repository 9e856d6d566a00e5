/* canvas.h: an RGB raster for `ctrain plot`: lines, rectangles, text in a built-in 5x7 font, and a
 * PNG encoder (libpng, already a dependency). Small on purpose: the plots need axes, ticks, a few
 * curves and labels, and a drawing library (cairo) would bring fontconfig, freetype and pixman into
 * every bundle for that. */
#ifndef CT_REPORT_CANVAS_H
#define CT_REPORT_CANVAS_H

#include <stdint.h>

#include "core/util/common.h"

typedef struct ct_canvas {
    int w, h;
    uint8_t *rgb;                /* [h, w, 3], row-major */
} ct_canvas;

#define CT_GLYPH_W 5             /* font cell: 5 x 7 pixels, drawn with one blank column after */
#define CT_GLYPH_H 7

/* A white canvas of w x h (1..16384 each); CT_ERR_RUNTIME when memory is short. */
int ct_canvas_init(ct_canvas *c, int w, int h, ct_err *err);
void ct_canvas_free(ct_canvas *c);

/* Colour as 0xRRGGBB. Drawing clips to the canvas. */
void ct_canvas_fill(ct_canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb);   /* [x0,x1] x [y0,y1] */
/* A line between two points (pixel centres at integers), `width` pixels wide (1 or more). */
void ct_canvas_line(ct_canvas *c, double x0, double y0, double x1, double y1, int width, uint32_t rgb);
/* Text with its top-left corner at (x, y), each font pixel scale x scale; characters the font
 * lacks are drawn as a box, upper case as lower case. Returns the width drawn. */
int ct_canvas_text(ct_canvas *c, int x, int y, const char *s, int scale, uint32_t rgb);
int ct_canvas_text_width(const char *s, int scale);

/* The canvas as a PNG file, written atomically (a temporary file renamed over path). */
int ct_canvas_write_png(const ct_canvas *c, const char *path, ct_err *err);

#endif

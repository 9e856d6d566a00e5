/* plot.c: the canvas, its drawing, the 5x7 font and the PNG writer of `ctrain plot` (plot.h). */
#include "core/report/plot.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct canvas {
    int w, h;
    uint8_t *px;                 /* [h][w][3] RGB */
} canvas;

static void put(canvas *c, int x, int y, uint32_t rgb) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    uint8_t *p = c->px + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    p[0] = (uint8_t)(rgb >> 16), p[1] = (uint8_t)(rgb >> 8), p[2] = (uint8_t)rgb;
}

/* [x0, x1) x [y0, y1) */
static void fill(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb) {
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) put(c, x, y, rgb);
}

/* Bresenham's line with a square brush of `thick` pixels. */
static void line(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb, int thick) {
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, e = dx + dy;
    for (;;) {
        fill(c, x0 - thick / 2, y0 - thick / 2, x0 - thick / 2 + thick, y0 - thick / 2 + thick, rgb);
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * e;
        if (e2 >= dy) e += dy, x0 += sx;
        if (e2 <= dx) e += dx, y0 += sy;
    }
}

/* ---- a 5x7 pixel font: each glyph is 7 rows of 5 bits, the leftmost pixel the highest bit ---- */

static const char glyph_chars[] = "0123456789.-+%:/()abcdefghiklmnoprstuvwxy ";
static const uint8_t glyphs[][7] = {
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}, /* 0 1 */
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}, /* 2 3 */
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}, /* 4 5 */
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}, /* 6 7 */
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}, /* 8 9 */
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}, {0x00, 0x00, 0x00, 0x0E, 0x00, 0x00, 0x00}, /* . - */
    {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}, {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}, /* + % */
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}, {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}, /* : / */
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}, {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}, /* ( ) */
    {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}, {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}, /* a b */
    {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}, {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}, /* c d */
    {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}, {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}, /* e f */
    {0x00, 0x00, 0x0F, 0x11, 0x0F, 0x01, 0x0E}, {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}, /* g h */
    {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}, {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}, /* i k */
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}, /* l m */
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}, {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}, /* n o */
    {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}, {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}, /* p r */
    {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}, {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}, /* s t */
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}, {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}, /* u v */
    {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}, {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}, /* w x */
    {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E}, {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /* y ' ' */
};
_Static_assert(sizeof glyph_chars - 1 == sizeof glyphs / sizeof glyphs[0], "a glyph for every character");

/* A character the font lacks is drawn as a hollow box. */
static const uint8_t unknown_glyph[7] = {0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F};

static const uint8_t *glyph(char ch) {
    if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');   /* one case */
    const char *p = ch ? strchr(glyph_chars, ch) : NULL;
    return p ? glyphs[p - glyph_chars] : unknown_glyph;
}

static int text_width(const char *s, int scale) { return (int)strlen(s) * 6 * scale - scale; }

/* Text with its top left corner at (x, y), each font pixel scale x scale. */
static void text(canvas *c, int x, int y, const char *s, uint32_t rgb, int scale) {
    for (; *s; s++, x += 6 * scale) {
        const uint8_t *g = glyph(*s);
        for (int r = 0; r < 7; r++)
            for (int b = 0; b < 5; b++)
                if (g[r] & (0x10 >> b)) fill(c, x + b * scale, y + r * scale, x + (b + 1) * scale, y + (r + 1) * scale, rgb);
    }
}

/* ---- layout ---- */

enum { WHITE = 0xFFFFFF, BLACK = 0x202020, FRAME = 0x808080, GRID = 0xE4E4E4 };
#define TICKS 4

typedef struct range {
    double lo, hi;
} range;

static void widen(range *r, double v) {
    if (!isfinite(v)) return;
    if (v < r->lo) r->lo = v;
    if (v > r->hi) r->hi = v;
}

/* A range that can be drawn: not empty, not a single value. */
static void settle(range *r, double pad) {
    if (r->lo > r->hi) r->lo = 0, r->hi = 1;
    double span = r->hi - r->lo;
    if (!(span > 1e-12 * fmax(1.0, fabs(r->hi)))) {
        double d = fmax(fabs(r->hi) * 0.05, 1e-6);
        r->lo -= d, r->hi += d;
        span = r->hi - r->lo;
    }
    r->lo -= pad * span, r->hi += pad * span;
}

static int map(double v, range r, int a, int b) { return (int)lround(a + (v - r.lo) / (r.hi - r.lo) * (b - a)); }

/* "0.125", "3.2e-05", "1200" */
static void number(double v, char *buf, size_t n) {
    snprintf(buf, n, "%.3g", fabs(v) < 1e-300 ? 0.0 : v);
}

typedef struct frame {
    int x0, y0, x1, y1;          /* the plot area (inclusive) */
} frame;

static void draw_panel(canvas *c, const ct_plot_panel *p, frame f, range xr, int top, int scale) {
    int cw = 6 * scale;
    /* title and legend */
    text(c, f.x0, top, p->title, BLACK, scale);
    int lx = f.x0 + text_width(p->title, scale) + 3 * cw;
    for (int s = 0; s < p->n_series; s++) {
        fill(c, lx, top, lx + 2 * cw, top + 7 * scale, p->series[s].rgb);
        lx += 2 * cw + cw;
        text(c, lx, top, p->series[s].label, BLACK, scale);
        lx += text_width(p->series[s].label, scale) + 2 * cw;
    }
    range yr = {INFINITY, -INFINITY};
    for (int s = 0; s < p->n_series; s++)
        for (int i = 0; i < p->series[s].n; i++)
            if (isfinite(p->series[s].x[i])) widen(&yr, p->series[s].y[i]);
    bool empty = yr.lo > yr.hi;
    settle(&yr, 0.05);
    char buf[32];
    for (int t = 0; t <= TICKS; t++) {   /* grid, y labels */
        double v = yr.lo + (yr.hi - yr.lo) * t / TICKS;
        int y = map(v, yr, f.y1, f.y0), x = map(xr.lo + (xr.hi - xr.lo) * t / TICKS, xr, f.x0, f.x1);
        line(c, f.x0, y, f.x1, y, GRID, 1);
        line(c, x, f.y0, x, f.y1, GRID, 1);
        if (empty) continue;
        number(v, buf, sizeof buf);
        text(c, f.x0 - cw - text_width(buf, scale), y - 3 * scale, buf, BLACK, scale);
    }
    line(c, f.x0, f.y0, f.x1, f.y0, FRAME, 1);
    line(c, f.x0, f.y1, f.x1, f.y1, FRAME, 1);
    line(c, f.x0, f.y0, f.x0, f.y1, FRAME, 1);
    line(c, f.x1, f.y0, f.x1, f.y1, FRAME, 1);
    if (empty) {
        text(c, (f.x0 + f.x1 - text_width("no data", scale)) / 2, (f.y0 + f.y1) / 2, "no data", FRAME, scale);
        return;
    }
    for (int s = 0; s < p->n_series; s++) {
        const ct_plot_series *se = &p->series[s];
        bool have = false;
        int px = 0, py = 0;
        for (int i = 0; i < se->n; i++) {
            if (!isfinite(se->x[i]) || !isfinite(se->y[i])) {
                have = false;   /* a gap */
                continue;
            }
            int x = map(se->x[i], xr, f.x0, f.x1), y = map(se->y[i], yr, f.y1, f.y0);
            if (have) line(c, px, py, x, y, se->rgb, 2 * scale);
            if (se->points) fill(c, x - 2 * scale, y - 2 * scale, x + 2 * scale + 1, y + 2 * scale + 1, se->rgb);
            have = true, px = x, py = y;
        }
    }
}

/* ---- PNG ---- */

static int write_png(const canvas *c, const char *path, ct_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot write: %s", path, strerror(errno));
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_write_struct(&png, NULL);
        fclose(f);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: libpng could not start", path);
    }
    /* nothing set between here and a longjmp back is read after it but png, info and f */
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: writing the PNG failed", path);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) png_write_row(png, c->px + (size_t)y * (size_t)c->w * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    if (fclose(f) != 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot write: %s", path, strerror(errno));
    return CT_OK;
}

int ct_plot_png(const ct_plot_panel *panels, int n_panels, const char *x_label, int width, int height,
                const char *path, ct_err *err) {
    if (width < CT_PLOT_MIN_SIDE || height < CT_PLOT_MIN_SIDE || width > CT_PLOT_MAX_SIDE || height > CT_PLOT_MAX_SIDE)
        return ct_errf(err, CT_ERR_CONFIG, "plot size %dx%d: each side must be %d to %d pixels", width, height,
                       CT_PLOT_MIN_SIDE, CT_PLOT_MAX_SIDE);
    if (n_panels < 1) return ct_errf(err, CT_ERR_CONFIG, "nothing to plot");
    canvas c = {width, height, ct_xmalloc((size_t)width * (size_t)height * 3)};
    memset(c.px, 0xFF, (size_t)width * (size_t)height * 3);
    int scale = width >= 800 && height >= 600 ? 2 : 1, ch = 7 * scale, cw = 6 * scale;
    int left = 10 * cw + 8, right = 3 * cw, top = 8, bottom = 2 * ch + 24;
    int panel_h = (height - top - bottom) / n_panels;
    range xr = {INFINITY, -INFINITY};
    for (int p = 0; p < n_panels; p++)
        for (int s = 0; s < panels[p].n_series; s++)
            for (int i = 0; i < panels[p].series[s].n; i++)
                if (isfinite(panels[p].series[s].y[i])) widen(&xr, panels[p].series[s].x[i]);
    settle(&xr, 0.0);
    for (int p = 0; p < n_panels; p++) {
        int py = top + p * panel_h;
        frame f = {left, py + ch + 8, width - right, py + panel_h - 8};
        if (f.y1 - f.y0 < 8) continue;   /* too small to draw */
        draw_panel(&c, &panels[p], f, xr, py, scale);
    }
    /* x ticks and label under the last panel */
    int base = top + n_panels * panel_h - 8;
    char buf[32];
    for (int t = 0; t <= TICKS; t++) {
        double v = xr.lo + (xr.hi - xr.lo) * t / TICKS;
        int x = map(v, xr, left, width - right);
        line(&c, x, base, x, base + 4 * scale, FRAME, 1);
        if (xr.hi - xr.lo >= 10) snprintf(buf, sizeof buf, "%.0f", v);
        else number(v, buf, sizeof buf);
        text(&c, x - text_width(buf, scale) / 2, base + 6 * scale, buf, BLACK, scale);
    }
    if (x_label)
        text(&c, (left + width - right - text_width(x_label, scale)) / 2, base + 6 * scale + ch + 8, x_label, BLACK,
             scale);
    int rc = write_png(&c, path, err);
    free(c.px);
    return rc;
}

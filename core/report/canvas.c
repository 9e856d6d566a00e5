/* canvas.c: the raster behind `ctrain plot` (canvas.h). */
#include "core/report/canvas.h"

#include <math.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/fs.h"

/* The font: per glyph 7 rows of 5 bits, the leftmost pixel in bit 4. Drawn for this project. */
typedef struct glyph {
    char c;
    uint8_t rows[CT_GLYPH_H];
} glyph;

static const glyph font[] = {
    {' ', {0, 0, 0, 0, 0, 0, 0}},
    {'0', {0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e}}, {'1', {0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e}},
    {'2', {0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f}}, {'3', {0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e}},
    {'4', {0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02}}, {'5', {0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e}},
    {'6', {0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e}}, {'7', {0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e}}, {'9', {0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c}},
    {'.', {0, 0, 0, 0, 0, 0x0c, 0x0c}},                {'-', {0, 0, 0, 0x1f, 0, 0, 0}},
    {'+', {0, 0x04, 0x04, 0x1f, 0x04, 0x04, 0}},       {'_', {0, 0, 0, 0, 0, 0, 0x1f}},
    {'/', {0x01, 0x02, 0x02, 0x04, 0x08, 0x08, 0x10}}, {':', {0, 0x0c, 0x0c, 0, 0x0c, 0x0c, 0}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {'=', {0, 0, 0x1f, 0, 0x1f, 0, 0}},
    {',', {0, 0, 0, 0, 0x0c, 0x04, 0x08}},             {'\'', {0x04, 0x04, 0x08, 0, 0, 0, 0}},
    {'a', {0, 0, 0x0e, 0x01, 0x0f, 0x11, 0x0f}},       {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1e}},
    {'c', {0, 0, 0x0e, 0x10, 0x10, 0x11, 0x0e}},       {'d', {0x01, 0x01, 0x0d, 0x13, 0x11, 0x11, 0x0f}},
    {'e', {0, 0, 0x0e, 0x11, 0x1f, 0x10, 0x0e}},       {'f', {0x06, 0x09, 0x08, 0x1c, 0x08, 0x08, 0x08}},
    {'g', {0, 0x0f, 0x11, 0x11, 0x0f, 0x01, 0x0e}},    {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0, 0x0c, 0x04, 0x04, 0x04, 0x0e}},    {'j', {0x02, 0, 0x06, 0x02, 0x02, 0x12, 0x0c}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, {'l', {0x0c, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e}},
    {'m', {0, 0, 0x1a, 0x15, 0x15, 0x11, 0x11}},       {'n', {0, 0, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0, 0, 0x0e, 0x11, 0x11, 0x11, 0x0e}},       {'p', {0, 0, 0x1e, 0x11, 0x1e, 0x10, 0x10}},
    {'q', {0, 0, 0x0d, 0x13, 0x0f, 0x01, 0x01}},       {'r', {0, 0, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0, 0, 0x0e, 0x10, 0x0e, 0x01, 0x1e}},       {'t', {0x08, 0x08, 0x1c, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0, 0, 0x11, 0x11, 0x11, 0x13, 0x0d}},       {'v', {0, 0, 0x11, 0x11, 0x11, 0x0a, 0x04}},
    {'w', {0, 0, 0x11, 0x11, 0x15, 0x15, 0x0a}},       {'x', {0, 0, 0x11, 0x0a, 0x04, 0x0a, 0x11}},
    {'y', {0, 0, 0x11, 0x11, 0x0f, 0x01, 0x0e}},       {'z', {0, 0, 0x1f, 0x02, 0x04, 0x08, 0x1f}},
};
static const glyph missing = {'?', {0x1f, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1f}};

static const glyph *glyph_of(char c) {
    if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
    for (size_t i = 0; i < sizeof font / sizeof font[0]; i++)
        if (font[i].c == c) return &font[i];
    return &missing;
}

int ct_canvas_init(ct_canvas *c, int w, int h, ct_err *err) {
    c->w = c->h = 0;
    c->rgb = NULL;
    if (w < 1 || h < 1 || w > 16384 || h > 16384)
        return ct_errf(err, CT_ERR_CONFIG, "image size %dx%d: each side must be 1..16384", w, h);
    c->rgb = malloc((size_t)w * (size_t)h * 3);
    if (!c->rgb) return ct_errf(err, CT_ERR_RUNTIME, "out of memory for a %dx%d image", w, h);
    memset(c->rgb, 0xff, (size_t)w * (size_t)h * 3);
    c->w = w;
    c->h = h;
    return CT_OK;
}

void ct_canvas_free(ct_canvas *c) {
    free(c->rgb);
    c->rgb = NULL;
    c->w = c->h = 0;
}

/* Blend colour rgb over pixel (x, y) with coverage a in [0, 1]. */
static void plot_px(ct_canvas *c, int x, int y, uint32_t rgb, double a) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h || a <= 0.0) return;
    if (a > 1.0) a = 1.0;
    uint8_t *p = c->rgb + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    for (int k = 0; k < 3; k++) {
        double src = (double)((rgb >> (16 - 8 * k)) & 0xff);
        p[k] = (uint8_t)lround(p[k] * (1.0 - a) + src * a);
    }
}

void ct_canvas_fill(ct_canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb) {
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++) plot_px(c, x, y, rgb, 1.0);
}

/* Anti-aliased by distance: every pixel within width/2 + 0.5 of the segment gets coverage by how
 * far inside it is. Simple, and plenty for a few thousand points. */
void ct_canvas_line(ct_canvas *c, double x0, double y0, double x1, double y1, int width, uint32_t rgb) {
    if (!isfinite(x0) || !isfinite(y0) || !isfinite(x1) || !isfinite(y1)) return;
    double r = (width < 1 ? 1 : width) / 2.0;
    double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    int xa = (int)floor(fmin(x0, x1) - r - 1), xb = (int)ceil(fmax(x0, x1) + r + 1);
    int ya = (int)floor(fmin(y0, y1) - r - 1), yb = (int)ceil(fmax(y0, y1) + r + 1);
    if (xa < 0) xa = 0;
    if (ya < 0) ya = 0;
    if (xb >= c->w) xb = c->w - 1;
    if (yb >= c->h) yb = c->h - 1;
    for (int y = ya; y <= yb; y++)
        for (int x = xa; x <= xb; x++) {
            double t = len2 > 0 ? ((x - x0) * dx + (y - y0) * dy) / len2 : 0.0;
            if (t < 0) t = 0;
            if (t > 1) t = 1;
            double ex = x - (x0 + t * dx), ey = y - (y0 + t * dy);
            double d = sqrt(ex * ex + ey * ey);
            plot_px(c, x, y, rgb, r + 0.5 - d);
        }
}

int ct_canvas_text_width(const char *s, int scale) {
    size_t n = strlen(s);
    return n ? (int)n * (CT_GLYPH_W + 1) * scale - scale : 0;
}

int ct_canvas_text(ct_canvas *c, int x, int y, const char *s, int scale, uint32_t rgb) {
    int at = x;
    for (const char *p = s; *p; p++) {
        const glyph *g = glyph_of(*p);
        for (int row = 0; row < CT_GLYPH_H; row++)
            for (int col = 0; col < CT_GLYPH_W; col++)
                if (g->rows[row] & (0x10 >> col))
                    ct_canvas_fill(c, at + col * scale, y + row * scale, at + col * scale + scale - 1,
                                   y + row * scale + scale - 1, rgb);
        at += (CT_GLYPH_W + 1) * scale;
    }
    return at - x;
}

/* ---- PNG ---- */

typedef struct png_buf {
    uint8_t *data;
    size_t len, cap;
    bool oom;
} png_buf;

static void png_buf_write(png_structp png, png_bytep data, png_size_t n) {
    png_buf *b = png_get_io_ptr(png);
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 65536;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

static void png_buf_flush(png_structp png) { (void)png; }

int ct_canvas_write_png(const ct_canvas *c, const char *path, ct_err *err) {
    png_buf b = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: out of memory starting the PNG encoder", path);
    }
    png_bytep *rows = malloc(sizeof(png_bytep) * (size_t)c->h);
    if (!rows) {
        png_destroy_write_struct(&png, &info);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: out of memory", path);
    }
    if (setjmp(png_jmpbuf(png))) {   /* libpng reports its own failures by longjmp */
        png_destroy_write_struct(&png, &info);
        free(rows);
        free(b.data);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: the PNG encoder failed", path);
    }
    png_set_write_fn(png, &b, png_buf_write, png_buf_flush);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    for (int y = 0; y < c->h; y++) rows[y] = c->rgb + (size_t)y * (size_t)c->w * 3;
    png_set_rows(png, info, rows);
    png_write_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    int rc = b.oom ? ct_errf(err, CT_ERR_RUNTIME, "%s: out of memory encoding the PNG", path)
                   : ct_fs_write_atomic(path, b.data, b.len, err);
    free(b.data);
    return rc;
}

/* plot.c: `ctrain plot` and `ctrain compare` (plot.h). */
#include "core/report/plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/canvas.h"
#include "core/util/fs.h"

/* ---- reading a run ---- */

typedef struct series {
    double *x, *y;
    int n, cap;
} series;

enum { S_LOSS, S_EVAL_LOSS, S_ACC, S_PPL, S_LR, S_COUNT };

typedef struct run {
    const char *dir;
    char name[64];               /* the directory's last component, for legends and tables */
    series s[S_COUNT];
    long last_step;
} run;

static void series_add(series *s, double x, double y) {
    if (!isfinite(x) || !isfinite(y)) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->x = ct_xrealloc(s->x, sizeof(double) * (size_t)s->cap);
        s->y = ct_xrealloc(s->y, sizeof(double) * (size_t)s->cap);
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

static void run_free(run *r) {
    for (int k = 0; k < S_COUNT; k++) free(r->s[k].x), free(r->s[k].y);
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void run_name(run *r) {
    char path[1024];
    snprintf(path, sizeof path, "%s", r->dir);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
    const char *slash = strrchr(path, '/');
    snprintf(r->name, sizeof r->name, "%s", slash && slash[1] ? slash + 1 : path);
}

/* One metrics.jsonl into r. A line that is not a JSON object is skipped: the last one when it has
 * no newline yet (the run is still writing it) silently, any other with a warning naming it (a run
 * killed inside a write left part of a record, which a resume wrote on after). */
static int run_read(run *r, ct_warnings *warn, ct_err *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
    run_name(r);
    FILE *f = fopen(path, "r");
    if (!f)
        return ct_errf(err, CT_ERR_DATA, "%s: cannot open: %s (is %s a run directory? every run writes "
                       "metrics.jsonl into its train.run_dir)", path, strerror(errno), r->dir);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = CT_OK;
    long skipped = 0, first_bad = 0;
    for (long no = 1; (len = getline(&line, &cap, f)) > 0; no++) {
        bool complete = line[len - 1] == '\n';
        cJSON *o = cJSON_ParseWithLength(line, (size_t)len);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            if (!complete) break;
            if (!skipped++) first_bad = no;
            continue;
        }
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
        double step = num(o, "step");
        if (isfinite(step) && step > r->last_step) r->last_step = (long)step;
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "train")) {
            series_add(&r->s[S_LOSS], step, num(o, "loss"));
            series_add(&r->s[S_LR], step, num(o, "lr"));
        } else if (cJSON_IsString(type) && !strcmp(type->valuestring, "eval")) {
            series_add(&r->s[S_EVAL_LOSS], step, num(o, "eval_loss"));
            series_add(&r->s[S_ACC], step, num(o, "eval_accuracy"));
            series_add(&r->s[S_PPL], step, num(o, "eval_perplexity"));
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    char more[64] = "";
    if (skipped > 1) snprintf(more, sizeof more, ", and %ld more such line%s", skipped - 1, skipped > 2 ? "s" : "");
    if (skipped)
        ct_warnf(warn, "%s:%ld: not a JSON object (metrics.jsonl has one per line); skipped%s (a run killed while "
                 "writing one leaves part of a record)", path, first_bad, more);
    if (!rc && r->s[S_LOSS].n == 0 && r->s[S_EVAL_LOSS].n == 0)
        rc = ct_errf(err, CT_ERR_DATA, "%s: no train or eval rows yet (the run logs one every "
                     "steps_per_print steps)", path);
    return rc;
}

static int runs_read(const char *const *dirs, int n, run **out, ct_warnings *warn, ct_err *err) {
    run *r = ct_xcalloc((size_t)n, sizeof *r);
    int rc = CT_OK;
    for (int i = 0; i < n && !rc; i++) {
        r[i].dir = dirs[i];
        rc = run_read(&r[i], warn, err);
    }
    if (rc) {
        for (int i = 0; i < n; i++) run_free(&r[i]);
        free(r);
        return rc;
    }
    *out = r;
    return CT_OK;
}

/* ---- drawing ---- */

static const uint32_t palette[] = {0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e, 0x9467bd, 0x8c564b, 0xe377c2, 0x17becf};
#define GRID 0xe4e4e4
#define AXIS 0x404040
#define INK 0x202020

typedef struct range {
    double lo, hi;
} range;

static range range_of(const run *r, int n, const int *which, int n_which) {
    range g = {INFINITY, -INFINITY};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_which; k++)
            for (int j = 0; j < r[i].s[which[k]].n; j++) {
                double v = r[i].s[which[k]].y[j];
                if (v < g.lo) g.lo = v;
                if (v > g.hi) g.hi = v;
            }
    if (!(g.lo <= g.hi)) return (range){0, 1};
    if (g.hi - g.lo < 1e-12 * fmax(1.0, fabs(g.hi))) {   /* a flat series: give it some room */
        double pad = g.hi != 0 ? fabs(g.hi) * 0.1 : 1.0;
        return (range){g.lo - pad, g.hi + pad};
    }
    double pad = (g.hi - g.lo) * 0.05;
    return (range){g.lo - pad, g.hi + pad};
}

/* A tick spacing of 1, 2 or 5 times a power of ten giving about `want` ticks over the range. */
static double tick_step(range r, int want) {
    double raw = (r.hi - r.lo) / want, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void tick_label(double v, double step, char *buf, size_t n) {
    v = round(v / step) * step;
    if (fabs(v) < step * 1e-9) v = 0.0;
    snprintf(buf, n, "%.4g", v);
}

typedef struct panel {
    int x0, y0, x1, y1;          /* the plotting area, in pixels */
    range xr, yr;
} panel;

static double px_x(const panel *p, double x) { return p->x0 + (x - p->xr.lo) / (p->xr.hi - p->xr.lo) * (p->x1 - p->x0); }
static double px_y(const panel *p, double y) { return p->y1 - (y - p->yr.lo) / (p->yr.hi - p->yr.lo) * (p->y1 - p->y0); }

static void draw_axes(ct_canvas *c, const panel *p, int scale) {
    int th = CT_GLYPH_H * scale;
    char b[32];
    double ys = tick_step(p->yr, 4);
    for (double v = ceil(p->yr.lo / ys) * ys; v <= p->yr.hi + ys * 1e-9; v += ys) {
        int y = (int)lround(px_y(p, v));
        ct_canvas_fill(c, p->x0, y, p->x1, y, GRID);
        tick_label(v, ys, b, sizeof b);
        ct_canvas_text(c, p->x0 - 6 * scale - ct_canvas_text_width(b, scale), y - th / 2, b, scale, INK);
    }
    double xs = tick_step(p->xr, 6);
    for (double v = ceil(p->xr.lo / xs) * xs; v <= p->xr.hi + xs * 1e-9; v += xs) {
        int x = (int)lround(px_x(p, v));
        ct_canvas_fill(c, x, p->y0, x, p->y1, GRID);
        tick_label(v, xs, b, sizeof b);
        ct_canvas_text(c, x - ct_canvas_text_width(b, scale) / 2, p->y1 + 4 * scale, b, scale, INK);
    }
    ct_canvas_fill(c, p->x0, p->y0, p->x0, p->y1, AXIS);
    ct_canvas_fill(c, p->x0, p->y1, p->x1, p->y1, AXIS);
}

/* The panel's title on a white label over its top-left corner (drawn after the curves). */
static void draw_title(ct_canvas *c, const panel *p, const char *title, int scale) {
    int x = p->x0 + 6 * scale, y = p->y0 + 4 * scale;
    ct_canvas_fill(c, x - 3 * scale, y - 2 * scale, x + ct_canvas_text_width(title, scale) + 3 * scale,
                   y + (CT_GLYPH_H + 2) * scale, 0xffffff);
    ct_canvas_text(c, x, y, title, scale, INK);
}

static void draw_series(ct_canvas *c, const panel *p, const series *s, int width, bool dots, uint32_t rgb) {
    for (int j = 1; j < s->n; j++)
        ct_canvas_line(c, px_x(p, s->x[j - 1]), px_y(p, s->y[j - 1]), px_x(p, s->x[j]), px_y(p, s->y[j]),
                       width, rgb);
    for (int j = 0; dots && j < s->n; j++) {
        double x = px_x(p, s->x[j]), y = px_y(p, s->y[j]);
        ct_canvas_line(c, x, y, x, y, width + 3, rgb);
    }
}

static bool any_rows(const run *r, int n, int which) {
    for (int i = 0; i < n; i++)
        if (r[i].s[which].n > 0) return true;
    return false;
}

static void draw(ct_canvas *c, const run *r, int n) {
    int scale = c->w >= 900 && c->h >= 600 ? 2 : 1, th = CT_GLYPH_H * scale;
    /* legend: a colour mark and the run's name, left to right, wrapping */
    int lx = 10 * scale, ly = 8 * scale;
    for (int i = 0; i < n; i++) {
        int w = 14 * scale + ct_canvas_text_width(r[i].name, scale) + 16 * scale;
        if (lx + w > c->w && lx > 10 * scale) lx = 10 * scale, ly += th + 6 * scale;
        uint32_t col = palette[i % (int)(sizeof palette / sizeof palette[0])];
        ct_canvas_fill(c, lx, ly + th / 2 - scale, lx + 10 * scale, ly + th / 2 + scale, col);
        ct_canvas_text(c, lx + 14 * scale, ly, r[i].name, scale, INK);
        lx += w;
    }
    int metric = any_rows(r, n, S_ACC) ? S_ACC : any_rows(r, n, S_PPL) ? S_PPL : -1;
    int panels = metric >= 0 ? 3 : 2;
    int top = ly + th + 10 * scale, bottom = c->h - 6 * scale - th;
    int left = 12 * scale + ct_canvas_text_width("-0.0000", scale), right = c->w - 12 * scale;
    int gap = th + 14 * scale, ph = (bottom - top - gap * (panels - 1) - th - 4 * scale) / panels;
    if (ph < 10 || right - left < 10) return;   /* too small to draw more than the legend */
    range xr = {INFINITY, -INFINITY};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < S_COUNT; k++)
            for (int j = 0; j < r[i].s[k].n; j++) {
                xr.lo = fmin(xr.lo, r[i].s[k].x[j]);
                xr.hi = fmax(xr.hi, r[i].s[k].x[j]);
            }
    if (!(xr.hi > xr.lo)) xr = (range){xr.lo - 1, xr.lo + 1};
    static const int loss_k[] = {S_LOSS, S_EVAL_LOSS};
    const struct { const int *which; int n_which; const char *title; } spec[3] = {
        {loss_k, 2, "loss (line: train, dots: eval)"},
        {&metric, 1, metric == S_ACC ? "eval accuracy" : "eval perplexity"},
        {(const int[]){S_LR}, 1, "learning rate"},
    };
    int y = top;
    for (int k = 0; k < 3; k++) {
        if (k == 1 && metric < 0) continue;
        panel p = {left, y, right, y + ph, xr, range_of(r, n, spec[k].which, spec[k].n_which)};
        draw_axes(c, &p, scale);
        for (int i = 0; i < n; i++) {
            uint32_t col = palette[i % (int)(sizeof palette / sizeof palette[0])];
            for (int m = 0; m < spec[k].n_which; m++) {
                int w = spec[k].which[m];
                draw_series(c, &p, &r[i].s[w], w == S_LOSS || w == S_LR ? scale : 2 * scale, w != S_LOSS && w != S_LR,
                            col);
            }
        }
        draw_title(c, &p, spec[k].title, scale);
        y += ph + gap;
    }
    ct_canvas_text(c, (left + right - ct_canvas_text_width("step", scale)) / 2, c->h - 4 * scale - th, "step", scale,
                   INK);
}

int ct_plot_runs(const char *const *run_dirs, int n, const char *out, int w, int h, ct_warnings *warn,
                 ct_err *err) {
    if (n < 1) return ct_errf(err, CT_ERR_CONFIG, "no run directory to plot");
    run *r = NULL;
    int rc = runs_read(run_dirs, n, &r, warn, err);
    if (rc) return rc;
    ct_canvas c;
    if (!(rc = ct_fs_check_output_file(out, err)) && !(rc = ct_canvas_init(&c, w, h, err))) {
        draw(&c, r, n);
        rc = ct_canvas_write_png(&c, out, err);
        ct_canvas_free(&c);
    }
    for (int i = 0; i < n; i++) run_free(&r[i]);
    free(r);
    return rc;
}

/* ---- compare ---- */

typedef struct row {
    const run *r;
    double loss, eval_loss, metric;
    char lr[24], batch[24], micro[24], precision[8], optimizer[24], seed[24];
} row;

static double last(const series *s) { return s->n ? s->y[s->n - 1] : NAN; }

/* A config value as text ("-" when absent). */
static void cfg_text(const cJSON *root, const char *a, const char *b, const char *c, char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    if (c) v = cJSON_GetObjectItemCaseSensitive(v, c);
    if (cJSON_IsNumber(v)) snprintf(out, n, "%.6g", v->valuedouble);
    else if (cJSON_IsString(v)) snprintf(out, n, "%s", v->valuestring);
    else snprintf(out, n, "-");
}

static bool cfg_true(const cJSON *root, const char *a, const char *b) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, a), b));
}

static void row_config(row *w, const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len = 0;
    char *text = ct_fs_read_small(path, (size_t)16 << 20, &len);
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    cfg_text(root, "optimizer", "params", "lr", w->lr, sizeof w->lr);
    cfg_text(root, "train_batch_size", NULL, NULL, w->batch, sizeof w->batch);
    cfg_text(root, "train_micro_batch_size_per_gpu", NULL, NULL, w->micro, sizeof w->micro);
    cfg_text(root, "optimizer", "type", NULL, w->optimizer, sizeof w->optimizer);
    cfg_text(root, "train", "seed", NULL, w->seed, sizeof w->seed);
    snprintf(w->precision, sizeof w->precision, "%s",
             !root ? "-" : cfg_true(root, "bf16", "enabled") ? "bf16" : cfg_true(root, "fp16", "enabled") ? "fp16" : "fp32");
    cJSON_Delete(root);
}

static int by_eval_loss(const void *a, const void *b) {
    double x = ((const row *)a)->eval_loss, y = ((const row *)b)->eval_loss;
    return (x > y) - (x < y);
}

static void fmt_num(double v, char *out, size_t n) {
    if (isfinite(v)) snprintf(out, n, "%.4f", v);
    else snprintf(out, n, "-");
}

int ct_compare_runs(const char *const *run_dirs, int n, FILE *f, ct_warnings *warn, ct_err *err) {
    if (n < 1) return ct_errf(err, CT_ERR_CONFIG, "no run directory to compare");
    run *r = NULL;
    int rc = runs_read(run_dirs, n, &r, warn, err);
    if (rc) return rc;
    row *rows = ct_xcalloc((size_t)n, sizeof *rows);
    bool all_eval = true, acc = any_rows(r, n, S_ACC);
    int name_w = 3;
    for (int i = 0; i < n; i++) {
        row *w = &rows[i];
        w->r = &r[i];
        w->loss = last(&r[i].s[S_LOSS]);
        w->eval_loss = last(&r[i].s[S_EVAL_LOSS]);
        w->metric = last(&r[i].s[acc ? S_ACC : S_PPL]);
        all_eval = all_eval && isfinite(w->eval_loss);
        row_config(w, r[i].dir);
        int l = (int)strlen(r[i].name);
        if (l > name_w) name_w = l;
    }
    if (all_eval) qsort(rows, (size_t)n, sizeof *rows, by_eval_loss);
    fprintf(f, "%-*s %8s %10s %10s %10s %10s %6s %6s %6s %-8s %6s\n", name_w, "run", "steps", "loss", "eval_loss",
            acc ? "eval_acc" : "eval_ppl", "lr", "batch", "micro", "dtype", "optim", "seed");
    for (int i = 0; i < n; i++) {
        const row *w = &rows[i];
        char a[24], b[24], c[24];
        fmt_num(w->loss, a, sizeof a);
        fmt_num(w->eval_loss, b, sizeof b);
        fmt_num(w->metric, c, sizeof c);
        fprintf(f, "%-*s %8ld %10s %10s %10s %10s %6s %6s %6s %-8s %6s\n", name_w, w->r->name, w->r->last_step, a, b, c,
                w->lr, w->batch, w->micro, w->precision, w->optimizer, w->seed);
    }
    if (all_eval && n > 1) fprintf(f, "(sorted by eval loss, best first)\n");
    free(rows);
    for (int i = 0; i < n; i++) run_free(&r[i]);
    free(r);
    return CT_OK;
}

/* plot.c: `ctrain plot` (a run's curves from its metrics.jsonl as one PNG) and `ctrain compare`
 * (several runs side by side: a table, and their curves together) (commands.h). */
#include "cmd/commands.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/plot.h"
#include "core/util/fs.h"

const char ct_plot_usage[] = "usage: ctrain plot RUN_DIR [--out FILE.png] [--size WIDTHxHEIGHT]";
const char ct_compare_usage[] = "usage: ctrain compare RUN_DIR... [--out FILE.png] [--size WIDTHxHEIGHT]";

/* A growing series of (x, y). */
typedef struct points {
    double *x, *y;
    int n, cap;
} points;

static void push(points *p, double x, double y) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->x = ct_xrealloc(p->x, (size_t)p->cap * sizeof *p->x);
        p->y = ct_xrealloc(p->y, (size_t)p->cap * sizeof *p->y);
    }
    p->x[p->n] = x, p->y[p->n] = y, p->n++;
}

static bool any_finite(const points *p) {
    for (int i = 0; i < p->n; i++)
        if (isfinite(p->y[i])) return true;
    return false;
}

/* A number member, NAN when absent or null (metrics.jsonl writes null for what does not apply). */
static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

typedef struct curves {
    points loss, lr, eval_loss, eval_acc;
} curves;

/* metrics.jsonl (docs/cli.md, "Output"): one object per logged step ("type": "train") and per eval. */
static int read_metrics(const char *path, curves *c, ct_err *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return ct_errf(err, errno == ENOENT ? CT_ERR_CONFIG : CT_ERR_DATA, "%s: %s (plot reads the metrics.jsonl every "
                       "run writes in its run directory, train.run_dir)", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long no = 0;
    int rc = CT_OK;
    while (!rc && getline(&line, &cap, f) > 0) {
        no++;
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        cJSON *o = cJSON_Parse(line);
        const cJSON *type = o ? cJSON_GetObjectItemCaseSensitive(o, "type") : NULL;
        double step = num(o, "step");
        if (!cJSON_IsString(type) || !isfinite(step)) {
            /* a run killed mid-write leaves a partial last line: that one is skipped */
            if (!feof(f)) rc = ct_errf(err, CT_ERR_DATA, "%s:%ld: not a metrics record (a JSON object with \"type\" "
                                       "and \"step\")", path, no);
        } else if (!strcmp(type->valuestring, "train")) {
            push(&c->loss, step, num(o, "loss"));
            push(&c->lr, step, num(o, "lr"));
        } else if (!strcmp(type->valuestring, "eval")) {
            push(&c->eval_loss, step, num(o, "eval_loss"));
            push(&c->eval_acc, step, num(o, "eval_accuracy"));
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (!rc && c->loss.n == 0 && c->eval_loss.n == 0)
        rc = ct_errf(err, CT_ERR_DATA, "%s: no step or eval records to plot", path);
    return rc;
}

static int parse_size(const char *s, int *w, int *h, ct_err *err) {
    char *end;
    long a = strtol(s, &end, 10), b = *end == 'x' ? strtol(end + 1, &end, 10) : 0;
    if (*end || a < CT_PLOT_MIN_SIDE || b < CT_PLOT_MIN_SIDE || a > CT_PLOT_MAX_SIDE || b > CT_PLOT_MAX_SIDE)
        return ct_errf(err, CT_ERR_CONFIG, "plot: --size \"%s\": expected WIDTHxHEIGHT, each %d to %d pixels (e.g. "
                       "1000x750)\n%s", s, CT_PLOT_MIN_SIDE, CT_PLOT_MAX_SIDE, ct_plot_usage);
    *w = (int)a, *h = (int)b;
    return CT_OK;
}

static void free_points(points *p) {
    free(p->x);
    free(p->y);
}

int ct_plot_main(int argc, char **argv, ct_err *err) {
    const char *dir = NULL, *out = NULL, *v;
    int w = 1000, h = 750;
    for (int i = 1; i < argc; i++) {
        if ((v = ct_cli_option_value(argc, argv, &i, "--out"))) {
            if (!*v) return ct_errf(err, CT_ERR_CONFIG, "plot: --out needs a file\n%s", ct_plot_usage);
            out = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--size"))) {
            int rc = parse_size(v, &w, &h, err);
            if (rc) return rc;
        } else if (argv[i][0] == '-' || dir) {
            return ct_errf(err, CT_ERR_CONFIG, "plot: unexpected argument \"%s\"\n%s", argv[i], ct_plot_usage);
        } else {
            dir = argv[i];
        }
    }
    if (!dir) return ct_errf(err, CT_ERR_CONFIG, "plot: RUN_DIR is required\n%s", ct_plot_usage);
    char metrics[4200], png[4200];
    int rc = ct_fs_join(metrics, sizeof metrics, dir, "metrics.jsonl", err);
    if (rc) return rc;
    if (!out) {
        if ((rc = ct_fs_join(png, sizeof png, dir, "curves.png", err))) return rc;
        out = png;
    }
    curves c = {0};
    rc = read_metrics(metrics, &c, err);
    if (!rc) {
        /* loss (train, eval), the eval accuracy when a classifier has one, the learning rate */
        ct_plot_panel panels[3];
        int n = 0;
        panels[n++] = (ct_plot_panel){.title = "loss", .n_series = 2, .series = {
            {.label = "train", .x = c.loss.x, .y = c.loss.y, .n = c.loss.n, .rgb = 0x1F77B4},
            {.label = "eval", .x = c.eval_loss.x, .y = c.eval_loss.y, .n = c.eval_loss.n, .rgb = 0xD62728,
             .points = true}}};
        if (any_finite(&c.eval_acc))
            panels[n++] = (ct_plot_panel){.title = "eval accuracy", .n_series = 1, .series = {
                {.label = "eval", .x = c.eval_acc.x, .y = c.eval_acc.y, .n = c.eval_acc.n, .rgb = 0x2CA02C,
                 .points = true}}};
        panels[n++] = (ct_plot_panel){.title = "learning rate", .n_series = 1, .series = {
            {.label = "lr", .x = c.lr.x, .y = c.lr.y, .n = c.lr.n, .rgb = 0xFF7F0E}}};
        rc = ct_plot_png(panels, n, "step", w, h, out, err);
    }
    if (!rc) printf("wrote %s (%dx%d): %d step records, %d evals\n", out, w, h, c.loss.n, c.eval_loss.n);
    free_points(&c.loss), free_points(&c.lr), free_points(&c.eval_loss), free_points(&c.eval_acc);
    return rc;
}

/* ---- compare ---- */

/* One run of the comparison: its curves and what its config.json says. */
typedef struct run_row {
    const char *dir;
    curves c;
    double lr;
    long batch;
    char precision[8];
} run_row;

/* The last finite value of a series (NAN: none). */
static double last(const points *p) {
    for (int i = p->n - 1; i >= 0; i--)
        if (isfinite(p->y[i])) return p->y[i];
    return NAN;
}

/* lr, batch and precision from the run's resolved config (<run_dir>/config.json); NAN/0/"?" when
 * it is not there (a run refused before its start wrote none). */
static void read_run_config(run_row *r) {
    char path[4200];
    r->lr = NAN, r->batch = 0;
    snprintf(r->precision, sizeof r->precision, "?");
    snprintf(path, sizeof path, "%s/config.json", r->dir);
    size_t len;
    char *text = ct_fs_read_small(path, (size_t)64 << 20, &len);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!cfg) return;
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(cfg, "optimizer");
    const cJSON *params = opt ? cJSON_GetObjectItemCaseSensitive(opt, "params") : NULL;
    r->lr = params ? num(params, "lr") : NAN;
    double b = num(cfg, "train_batch_size");
    r->batch = isfinite(b) ? (long)b : 0;
    const cJSON *bf = cJSON_GetObjectItemCaseSensitive(cfg, "bf16"), *fp = cJSON_GetObjectItemCaseSensitive(cfg, "fp16");
    bool bf16 = bf && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bf, "enabled"));
    bool fp16 = fp && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fp, "enabled"));
    snprintf(r->precision, sizeof r->precision, "%s", bf16 ? "bf16" : fp16 ? "fp16" : "fp32");
    cJSON_Delete(cfg);
}

/* Best first: by the last eval loss, runs without one after those with one. */
static int by_eval_loss(const void *a, const void *b) {
    double x = last(&((const run_row *)a)->c.eval_loss), y = last(&((const run_row *)b)->c.eval_loss);
    if (isnan(x) || isnan(y)) return isnan(x) - isnan(y);
    return (x > y) - (x < y);
}

static void cell(double v, const char *fmt, char *buf, size_t n) {
    if (isfinite(v)) snprintf(buf, n, fmt, v);
    else snprintf(buf, n, "-");
}

static void print_table(const run_row *rows, int n) {
    printf("%3s %10s %10s %9s %9s %6s %5s  %s\n", "#", "eval_loss", "train_loss", "accuracy", "lr", "batch", "prec",
           "run");
    for (int i = 0; i < n; i++) {
        const run_row *r = &rows[i];
        char el[32], tl[32], acc[32], lr[32];
        cell(last(&r->c.eval_loss), "%.4f", el, sizeof el);
        cell(last(&r->c.loss), "%.4f", tl, sizeof tl);
        cell(last(&r->c.eval_acc), "%.4f", acc, sizeof acc);
        cell(r->lr, "%.3g", lr, sizeof lr);
        printf("%3d %10s %10s %9s %9s %6ld %5s  %s\n", i + 1, el, tl, acc, lr, r->batch, r->precision, r->dir);
    }
}

/* The train and eval loss of up to CT_PLOT_MAX_SERIES runs, labelled by their row numbers. */
static int plot_runs(const run_row *rows, int n, int w, int h, const char *out, ct_err *err) {
    static const uint32_t palette[CT_PLOT_MAX_SERIES] = {0x1F77B4, 0xD62728, 0x2CA02C, 0xFF7F0E,
                                                         0x9467BD, 0x8C564B, 0xE377C2, 0x17BECF};
    static const char *const labels[CT_PLOT_MAX_SERIES] = {"1", "2", "3", "4", "5", "6", "7", "8"};
    if (n > CT_PLOT_MAX_SERIES) {
        fprintf(stderr, "ctrain: warning: compare: curves of the first %d runs of the table only\n", CT_PLOT_MAX_SERIES);
        n = CT_PLOT_MAX_SERIES;
    }
    ct_plot_panel panels[2] = {{.title = "train loss", .n_series = n}, {.title = "eval loss", .n_series = n}};
    for (int i = 0; i < n; i++) {
        const curves *c = &rows[i].c;
        panels[0].series[i] = (ct_plot_series){.label = labels[i], .x = c->loss.x, .y = c->loss.y, .n = c->loss.n,
                                               .rgb = palette[i]};
        panels[1].series[i] = (ct_plot_series){.label = labels[i], .x = c->eval_loss.x, .y = c->eval_loss.y,
                                               .n = c->eval_loss.n, .rgb = palette[i], .points = true};
    }
    int rc = ct_plot_png(panels, 2, "step", w, h, out, err);
    if (!rc) printf("wrote %s (%dx%d): the curves of runs 1-%d\n", out, w, h, n);
    return rc;
}

int ct_compare_main(int argc, char **argv, ct_err *err) {
    const char *out = NULL, *v;
    int w = 1000, h = 750, n = 0, rc = CT_OK;
    run_row *rows = ct_xcalloc((size_t)argc, sizeof *rows);
    for (int i = 1; i < argc && !rc; i++) {
        if ((v = ct_cli_option_value(argc, argv, &i, "--out"))) {
            if (!*v) rc = ct_errf(err, CT_ERR_CONFIG, "compare: --out needs a file\n%s", ct_compare_usage);
            out = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--size"))) {
            rc = parse_size(v, &w, &h, err);
        } else if (argv[i][0] == '-') {
            rc = ct_errf(err, CT_ERR_CONFIG, "compare: unknown option \"%s\"\n%s", argv[i], ct_compare_usage);
        } else {
            rows[n++].dir = argv[i];
        }
    }
    if (!rc && n == 0) rc = ct_errf(err, CT_ERR_CONFIG, "compare: give one or more run directories\n%s", ct_compare_usage);
    for (int i = 0; i < n && !rc; i++) {
        char metrics[4200];
        rc = ct_fs_join(metrics, sizeof metrics, rows[i].dir, "metrics.jsonl", err);
        if (!rc) rc = read_metrics(metrics, &rows[i].c, err);
        read_run_config(&rows[i]);
    }
    if (!rc) {
        qsort(rows, (size_t)n, sizeof *rows, by_eval_loss);
        print_table(rows, n);
        if (out) rc = plot_runs(rows, n, w, h, out, err);
    }
    for (int i = 0; i < n; i++) {
        curves *c = &rows[i].c;
        free_points(&c->loss), free_points(&c->lr), free_points(&c->eval_loss), free_points(&c->eval_acc);
    }
    free(rows);
    return rc;
}

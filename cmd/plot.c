/* plot.c: `ctrain plot` (commands.h): a run's curves from its metrics.jsonl as one PNG. */
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

/* plot.c: `ctrain plot` and `ctrain compare` (commands.h); the work is core/report/plot.c's. */
#include "cmd/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/owned.h"
#include "core/report/plot.h"

const char ct_plot_usage[] = "usage: ctrain plot RUN_DIR... [--out FILE.png] [--size WxH]";
const char ct_compare_usage[] = "usage: ctrain compare RUN_DIR... [--plot FILE.png] [--size WxH]";

typedef struct plot_args {
    const char **dirs;
    int n;
    const char *out;
    int w, h;
} plot_args;

/* "1200x800" -> w, h (each 64..16384). */
static bool parse_size(const char *s, int *w, int *h) {
    char *end;
    errno = 0;
    long a = strtol(s, &end, 10);
    if (end == s || *end != 'x' || errno) return false;
    const char *t = end + 1;
    long b = strtol(t, &end, 10);
    if (end == t || *end || errno || a < 64 || b < 64 || a > 16384 || b > 16384) return false;
    *w = (int)a;
    *h = (int)b;
    return true;
}

static int parse(int argc, char **argv, const char *out_opt, const char *usage, plot_args *a, ct_err *err) {
    *a = (plot_args){.dirs = ct_xcalloc((size_t)argc, sizeof(char *)), .w = 1200, .h = 800};
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = ct_cli_option_value(argc, argv, &i, out_opt))) a->out = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--size"))) {
            if (!parse_size(v, &a->w, &a->h))
                return ct_errf(err, CT_ERR_CONFIG, "%s: --size %s: expected WxH, each 64..16384 (e.g. 1200x800)\n%s",
                               argv[0], v, usage);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return ct_errf(err, CT_ERR_CONFIG, "%s: unknown option \"%s\"\n%s", argv[0], argv[i], usage);
        } else {
            a->dirs[a->n++] = argv[i];
        }
    }
    if (a->n == 0) return ct_errf(err, CT_ERR_CONFIG, "%s: give at least one run directory\n%s", argv[0], usage);
    return CT_OK;
}

static void print_warnings(ct_warnings *w) {
    for (int i = 0; i < w->n; i++) {
        ct_fputs_printable_line("ctrain: warning: ", w->items[i], stderr);
    }
    ct_warnings_free(w);
}

/* The picture must not replace a file a run keeps (its metrics.jsonl, a checkpoint's). */
static int check_out(const char *cmd, const char *opt, const char *out, ct_err *err) {
    char why[2 * 4096 + 100];
    if (!out || !ct_owned_output(out, why, sizeof why)) return CT_OK;
    return ct_errf(err, CT_ERR_CONFIG, "%s: %s %s is %s; the picture would replace a file ctrain keeps there. Give "
                   "another name, e.g. %s curves.png", cmd, opt, out, why, opt);
}

int ct_plot_main(int argc, char **argv, ct_err *err) {
    plot_args a;
    int rc = parse(argc, argv, "--out", ct_plot_usage, &a, err);
    char def[4200];
    if (!rc && !a.out) {   /* one run: beside its metrics; several: here */
        if (a.n == 1) snprintf(def, sizeof def, "%s/curves.png", a.dirs[0]);
        else snprintf(def, sizeof def, "curves.png");
        a.out = def;
    }
    if (!rc) rc = check_out("plot", "--out", a.out, err);
    ct_warnings warn = {0};
    if (!rc) rc = ct_plot_runs(a.dirs, a.n, a.out, a.w, a.h, &warn, err);
    print_warnings(&warn);
    if (!rc) printf("wrote %s (%dx%d, %d run%s)\n", a.out, a.w, a.h, a.n, a.n == 1 ? "" : "s");
    free(a.dirs);
    return rc;
}

int ct_compare_main(int argc, char **argv, ct_err *err) {
    plot_args a;
    int rc = parse(argc, argv, "--plot", ct_compare_usage, &a, err);
    if (!rc) rc = check_out("compare", "--plot", a.out, err);
    ct_warnings warn = {0};
    if (!rc) rc = ct_compare_runs(a.dirs, a.n, stdout, &warn, err);
    print_warnings(&warn);
    if (!rc && a.out) {
        rc = ct_plot_runs(a.dirs, a.n, a.out, a.w, a.h, NULL, err);   /* the warnings were said */
        if (!rc) printf("wrote %s\n", a.out);
    }
    free(a.dirs);
    return rc;
}

/* profile.c: the flops profiler's table (profile.h): grouping by module depth, totals, text. */
#include "core/report/profile.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/report.h"

/* Length of the first `depth` dot-separated parts of name ("h.3.attn", 2 -> 3: "h.3"). */
static size_t prefix_len(const char *name, long depth) {
    size_t i = 0;
    for (long d = 0; name[i]; i++)
        if (name[i] == '.' && ++d == depth) break;
    return i;
}

static void add_row(ct_profile_row *into, const ct_profile_row *r) {
    into->layers += r->layers;
    into->params += r->params;
    into->fwd_flops += r->fwd_flops;
    into->fwd_s += r->fwd_s;
    into->bwd_s += r->bwd_s;
    if (strcmp(into->type, r->type) != 0) snprintf(into->type, sizeof into->type, "-");
}

int ct_profile_group(ct_profile_row *rows, int n, long depth) {
    if (depth < 1) return n;
    int out = 0;
    for (int i = 0; i < n; i++) {
        ct_profile_row r = rows[i];
        r.name[prefix_len(r.name, depth)] = '\0';
        int g = 0;
        while (g < out && strcmp(rows[g].name, r.name) != 0) g++;
        if (g < out) add_row(&rows[g], &r);
        else rows[out++] = r;
    }
    return out;
}

ct_profile_row ct_profile_total(const ct_profile_row *rows, int n) {
    ct_profile_row t = {.name = "total"};
    if (n > 0) snprintf(t.type, sizeof t.type, "%s", rows[0].type);
    for (int i = 0; i < n; i++) add_row(&t, &rows[i]);
    return t;
}

double ct_profile_row_flops_per_s(const ct_profile_row *r) {
    double s = r->fwd_s + r->bwd_s;
    return s > 0 ? 3.0 * r->fwd_flops / s : NAN;
}

typedef struct writer {
    void (*line)(void *ctx, const char *text);
    void *ctx;
} writer;

static void say(const writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const writer *w, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    w->line(w->ctx, buf);
}

/* "218.4 G" or "-" when not measured. */
static const char *rate(double flops_per_s, char *buf, size_t n) {
    if (!isfinite(flops_per_s)) return snprintf(buf, n, "-"), buf;
    return ct_fmt_count(flops_per_s, buf, n);
}

/* One table line. The numbers are exact enough to add up again (the test reads them back):
 * params as integers, FLOPs to 6 digits, times in microseconds. */
static void row_line(const writer *w, int width, int twidth, const ct_profile_row *r, double step_s) {
    double s = r->fwd_s + r->bwd_s;
    char fs[32];
    say(w, "  %-*s %-*s %12lld %14.6g %11.3f %11.3f %11.3f %7.1f%% %10s", width, r->name, twidth, r->type,
        (long long)r->params, r->fwd_flops, 1e3 * r->fwd_s, 1e3 * r->bwd_s, 1e3 * s,
        step_s > 0 ? 100 * s / step_s : NAN, rate(ct_profile_row_flops_per_s(r), fs, sizeof fs));
}

/* Up to k rows by total time, largest first ("fc1 1.412 ms (11.4%)"). */
static void top_line(const writer *w, const ct_profile_row *rows, int n, long k, double step_s) {
    if (k <= 0 || n == 0) return;
    if (k > n) k = n;
    char text[1024];
    size_t used = (size_t)snprintf(text, sizeof text, "top %ld module%s by time:", k, k > 1 ? "s" : "");
    bool *taken = ct_xcalloc((size_t)n, sizeof *taken);
    for (long t = 0; t < k && used < sizeof text; t++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && (best < 0 || rows[i].fwd_s + rows[i].bwd_s > rows[best].fwd_s + rows[best].bwd_s))
                best = i;
        taken[best] = true;
        double s = rows[best].fwd_s + rows[best].bwd_s;
        used += (size_t)snprintf(text + used, sizeof text - used, "%s %s %.3f ms (%.1f%%)", t ? "," : "",
                                 rows[best].name, 1e3 * s, step_s > 0 ? 100 * s / step_s : NAN);
    }
    free(taken);
    say(w, "%s", text);
}

void ct_profile_write(const ct_profile_info *info, const ct_profile_row *rows, int n,
                      void (*line)(void *ctx, const char *text), void *ctx) {
    writer w = {line, ctx};
    int width = 5, twidth = 4;
    for (int i = 0; i < n; i++) {
        if ((int)strlen(rows[i].name) > width) width = (int)strlen(rows[i].name);
        if ((int)strlen(rows[i].type) > twidth) twidth = (int)strlen(rows[i].type);
    }
    ct_profile_row total = ct_profile_total(rows, n);
    say(&w, "flops profiler: step %ld, %lld samples, %.3f ms, on %s", info->step, (long long)info->samples,
        1e3 * info->step_s, info->device ? info->device : "?");
    say(&w, "  %-*s %-*s %12s %14s %11s %11s %11s %8s %10s", width, "layer", twidth, "type", "params", "fwd FLOPs",
        "fwd ms", "bwd ms", "total ms", "% step", "FLOP/s");
    if (info->detailed)
        for (int i = 0; i < n; i++) row_line(&w, width, twidth, &rows[i], info->step_s);
    row_line(&w, width, twidth, &total, info->step_s);
    double layers_s = total.fwd_s + total.bwd_s, rest = info->step_s - layers_s;
    say(&w, "outside the layers (data wait, loss, optimizer, host work): %.3f ms (%.1f%% of the step)", 1e3 * rest,
        info->step_s > 0 ? 100 * rest / info->step_s : NAN);
    top_line(&w, rows, n, info->top_modules, info->step_s);
    /* FLOP/s columns count training as 3 x forward; the model line uses the model's own count
     * (a transformer's 6N + attention), the one MFU is reported with everywhere else. */
    char tf[32], ach[32], pk[32];
    double achieved = info->step_s > 0 ? info->train_flops / info->step_s : NAN;
    ct_fmt_count(info->train_flops, tf, sizeof tf);
    rate(achieved, ach, sizeof ach);
    if (info->peak_flops > 0 && isfinite(achieved))
        say(&w, "model: %s FLOPs a training step, %s FLOP/s achieved over the step; MFU %.2f%% of the "
            "device's %s FLOP/s peak", tf, ach, 100 * achieved / info->peak_flops,
            ct_fmt_count(info->peak_flops, pk, sizeof pk));
    else
        say(&w, "model: %s FLOPs a training step, %s FLOP/s achieved over the step; MFU not reported (no "
            "peak known for this device)", tf, ach);
}

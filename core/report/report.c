/* report.c: progress lines on stderr and the JSON summary (formats in report.h, train.h). */
#include "core/report/report.h"

#include "core/report/nvml.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/report/nvml.h"
#include "core/util/fs.h"

/* ---- formatting ---- */

const char *ct_fmt_bytes(double b, char *buf, size_t n) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

const char *ct_fmt_count(double c, char *buf, size_t n) {
    if (c >= 1e9) snprintf(buf, n, "%.1f G", c / 1e9);
    else if (c >= 1e6) snprintf(buf, n, "%.1f M", c / 1e6);
    else if (c >= 1e3) snprintf(buf, n, "%.1f k", c / 1e3);
    else snprintf(buf, n, "%.0f", c);
    return buf;
}

const char *ct_fmt_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.1fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    return buf;
}

double ct_process_age_s(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return NAN;
    char line[1024];
    size_t len = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[len] = '\0';
    /* Field 2 (comm) may contain spaces: count fields after its closing parenthesis. */
    char *p = strrchr(line, ')');
    if (!p) return NAN;
    unsigned long long start = 0;
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') {
            field++;
            if (field == 22) start = strtoull(p + 1, NULL, 10);
        }
    struct timespec ts;
    long hz = sysconf(_SC_CLK_TCK);
    if (field != 22 || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts) != 0) return NAN;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - (double)start / (double)hz;
}

size_t ct_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports kilobytes */
}

/* ---- progress ---- */

void ct_report_init(ct_report *r, FILE *out, bool quiet, long steps_per_print) {
    memset(r, 0, sizeof *r);
    r->out = out;
    r->quiet = quiet;
    r->tty = out && isatty(fileno(out));
    r->steps_per_print = steps_per_print;
    r->log_every = steps_per_print; /* until ct_report_plan knows the run's length */
    r->plain = steps_per_print > 0 || !r->tty;
    r->t0 = r->win_t0 = r->last_draw = ct_now();
}

/* After a write: when it failed (EPIPE: the reader of the pipe went away, as in `ctrain ... 2>&1 |
 * head -1`; EIO: the terminal was closed), stop writing. Progress is for a reader; the run itself
 * goes on, saves and ends with its summary (the CLI ignores SIGPIPE so that the write fails
 * instead of killing the process). */
static void check_stream(ct_report *r) {
    if (!ferror(r->out)) return;
    r->quiet = true;
    r->redrawn = false;
}

/* Remove the redrawn progress line before printing a plain one. */
static void clear_progress(ct_report *r) {
    if (r->redrawn) fputs("\r\033[K", r->out);
    r->redrawn = false;
}

void ct_report_line(ct_report *r, const char *fmt, ...) {
    if (r->quiet) return;
    clear_progress(r);
    /* a line may quote names from data files: control bytes escaped (ct_fputs_printable_line) */
    char stack[2048], *line = stack;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(stack, sizeof stack, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof stack && (line = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(line, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    ct_fputs_printable_line("", line ? line : stack, r->out);
    if (line != stack) free(line);
    fflush(r->out);
    check_stream(r);
}

void ct_report_train_start(ct_report *r) { r->t0 = r->win_t0 = r->last_draw = ct_now(); }

static double eta_s(const ct_report *r, const ct_step_event *e, double now) {
    if (e->total_steps <= 0 || e->step <= 0) return NAN;
    return (now - r->t0) / (double)e->step * (double)(e->total_steps - e->step);
}

double ct_report_mfu(const ct_report *r, double samples_per_s, double tokens_per_s) {
    if (!(r->peak_flops > 0) || !(r->train_flops_per_sample > 0)) return NAN;
    double flops = r->tokens_per_sample > 0
                       ? tokens_per_s * r->train_flops_per_sample / (double)r->tokens_per_sample
                       : samples_per_s * r->train_flops_per_sample;
    return isfinite(flops) ? flops / r->peak_flops : NAN;
}

/* "1234 samples/s", or "158000 tokens/s" for a language model; "  MFU 41.3%" after it where
 * the device's peak is known. */
static const char *rate_text(const ct_report *r, double samples_per_s, double tokens_per_s, char *buf, size_t n) {
    int k;
    if (r->tokens_per_sample > 0) k = snprintf(buf, n, "%.0f tokens/s", tokens_per_s);
    else k = snprintf(buf, n, "%.0f samples/s", samples_per_s);
    double mfu = ct_report_mfu(r, samples_per_s, tokens_per_s);
    if (isfinite(mfu) && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "  MFU %.1f%%", 100 * mfu);
    return buf;
}

long ct_report_default_interval(long total_steps) {
    if (total_steps <= 0) return 10;
    enum { MAX_LINES = 50 };
    for (long decade = 1;; decade *= 10)
        for (int m = 0; m < 3; m++) {
            static const int mant[3] = {1, 2, 5};
            long every = mant[m] * decade;
            if ((total_steps + every - 1) / every <= MAX_LINES) return every;
        }
}

void ct_report_plan(ct_report *r, long total_steps) {
    r->log_every = r->steps_per_print > 0 ? r->steps_per_print : ct_report_default_interval(total_steps);
    /* a terminal without steps_per_print has the redrawn line instead of plain ones */
    r->plain = r->steps_per_print > 0 || !r->tty;
}

bool ct_report_closes_window(const ct_report *r, long step) { return r->log_every > 0 && step % r->log_every == 0; }

static void reset_window(ct_report *r, double now) {
    r->win_loss = 0;
    r->win_n = 0;
    r->win_samples = 0;
    r->win_tokens = 0;
    r->win_wait = 0;
    r->win_t0 = now;
}

/* "scale 65536 (3 skipped)" under fp16, else "". */
static const char *scale_text(const ct_step_event *e, char *buf, size_t n) {
    buf[0] = 0;
    if (e->loss_scale > 0 && e->skipped_steps > 0)
        snprintf(buf, n, "  scale %.10g (%ld skipped)", e->loss_scale, e->skipped_steps);
    else if (e->loss_scale > 0)
        snprintf(buf, n, "  scale %.10g", e->loss_scale);
    return buf;
}

/* NVML's view of the GPU at a window's end, into w and the run's totals; "  gpu 93% 61.2/79.6 GiB"
 * for the line ("" without NVML or when it answers with an error). */
static const char *gpu_text(ct_report *r, ct_report_window *w, char *buf, size_t n) {
    ct_gpu_sample g;
    buf[0] = '\0';
    w->gpu_util = w->gpu_mem_used = NAN;
    if (!r->gpu || !ct_nvml_sample(r->gpu, &g)) return buf;
    w->gpu_util = g.util, w->gpu_mem_used = g.mem_used;
    r->gpu_util_sum += g.util;
    r->gpu_n++;
    r->gpu_mem_peak = fmax(r->gpu_mem_peak, g.mem_used);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    snprintf(buf, n, "  gpu %.0f%% %.1f/%.1f GiB", g.util, g.mem_used / gib, g.mem_total / gib);
    return buf;
}

void ct_report_gpu_summary(const ct_report *r, double *util, double *mem_peak) {
    *util = r->gpu_n > 0 ? r->gpu_util_sum / (double)r->gpu_n : NAN;
    *mem_peak = r->gpu_n > 0 ? r->gpu_mem_peak : NAN;
}

/* The progress line redrawn in place on a terminal: at most 4 times a second, and always at the
 * run's last step, so that a run shorter than a quarter second still shows where it ended. */
static void redraw(ct_report *r, const ct_step_event *e, double now, const char *gpu) {
    bool last = e->total_steps > 0 && e->step >= e->total_steps;
    if (now - r->last_draw <= 0.25 && !last) return;
    double dt = fmax(now - r->win_t0, 1e-9), rate = (double)r->win_samples / dt;
    double wait_pct = 100 * r->win_wait / dt;
    double loss = r->ema_n > 0 ? r->ema_loss / (1 - pow(0.95, (double)r->ema_n)) : NAN;
    char eta[32], total[32] = "", rt[80], scale[80];
    if (e->total_steps > 0) snprintf(total, sizeof total, "/%ld", e->total_steps);
    fprintf(r->out, "\r\033[Kstep %ld%s  epoch %d/%d  loss %.4f  lr %.2e%s  %s  data %.1f%%%s  ETA %s", e->step,
            total, e->epoch, e->epochs, loss, e->lr, scale_text(e, scale, sizeof scale),
            rate_text(r, rate, (double)r->win_tokens / dt, rt, sizeof rt), wait_pct, gpu,
            ct_fmt_duration(eta_s(r, e, now), eta, sizeof eta));
    fflush(r->out);
    r->redrawn = true;
    r->last_draw = now;
    check_stream(r);
}

bool ct_report_step(ct_report *r, const ct_step_event *e, ct_report_window *w) {
    if (!isnan(e->loss)) { /* NaN: every record of the step was skipped as corrupt */
        r->win_loss += e->loss;
        r->win_n++;
        r->ema_loss = 0.95 * r->ema_loss + 0.05 * e->loss; /* smoothing over ~20 steps */
        r->ema_n++;
    }
    r->win_samples += e->samples;
    r->win_tokens += e->tokens;
    r->win_wait += e->data_wait_s;
    r->epoch_wait += e->data_wait_s;
    double now = ct_now();
    if (!ct_report_closes_window(r, e->step)) {
        if (r->tty && !r->quiet) redraw(r, e, now, "");
        return false;
    }
    double dt = fmax(now - r->win_t0, 1e-9);
    *w = (ct_report_window){.loss = r->win_n ? r->win_loss / (double)r->win_n : NAN,
                            .samples_per_s = (double)r->win_samples / dt,
                            .tokens_per_s = r->tokens_per_sample > 0 ? (double)r->win_tokens / dt : NAN,
                            .data_wait_share = r->win_wait / dt, .wall_s = now - r->t0};
    char gpu[64];
    gpu_text(r, w, gpu, sizeof gpu);   /* once a window: an NVML query is a driver call */
    if (r->plain && !r->quiet) {
        char eta[32], total[32] = "", scale[80], rt[80];
        if (e->total_steps > 0) snprintf(total, sizeof total, "/%ld", e->total_steps);
        ct_report_line(r, "step %ld%s  epoch %d/%d  loss %.4f  lr %.2e  grad-norm %.3g%s  %s  data %.1f%%%s  ETA %s",
                       e->step, total, e->epoch, e->epochs, w->loss, e->lr, e->grad_norm,
                       scale_text(e, scale, sizeof scale),
                       rate_text(r, w->samples_per_s, (double)r->win_tokens / dt, rt, sizeof rt),
                       100 * w->data_wait_share, gpu, ct_fmt_duration(eta_s(r, e, now), eta, sizeof eta));
    } else if (r->tty && !r->quiet) {
        redraw(r, e, now, gpu);
    }
    reset_window(r, now);
    return true;
}

void ct_report_eval(ct_report *r, long step, int epoch, double loss, double accuracy, int64_t n,
                    double secs) {
    char acc[48] = "", ppl[32] = "";
    if (isfinite(accuracy)) snprintf(acc, sizeof acc, "  accuracy %.2f%%", 100 * accuracy);
    /* a language model's loss is nats per token: its perplexity is exp(loss) */
    if (r->tokens_per_sample > 0 && isfinite(loss)) snprintf(ppl, sizeof ppl, "  ppl %.2f", exp(loss));
    ct_report_line(r, "eval  step %ld  epoch %d  loss %.4f%s%s  (%lld samples, %.2fs)", step, epoch, loss, ppl,
                   acc, (long long)n, secs);
}

void ct_report_epoch(ct_report *r, int epoch, int epochs, long step, double train_loss, double secs,
                     double samples_per_s, double tokens_per_s) {
    if (r->log_every == 0) reset_window(r, ct_now()); /* no print windows: the epoch is the window */
    char d[32], rt[80];
    ct_report_line(r, "epoch %d/%d done  step %ld  train loss %.4f  %s  %s  data wait %.1f%%",
                   epoch, epochs, step, train_loss, ct_fmt_duration(secs, d, sizeof d),
                   rate_text(r, samples_per_s, tokens_per_s, rt, sizeof rt), 100 * r->epoch_wait / fmax(secs, 1e-9));
    r->epoch_wait = 0;
}

void ct_report_end(ct_report *r, const ct_summary *s) {
    char d[32], ev[96] = "", acc[48] = "";
    if (isfinite(s->eval_loss)) snprintf(ev, sizeof ev, " · eval loss %.4g", s->eval_loss);
    if (isfinite(s->eval_accuracy)) snprintf(acc, sizeof acc, " · accuracy %.1f%%", 100 * s->eval_accuracy);
    const char *what = strcmp(s->status, "ok") == 0 ? "done" : s->status;
    ct_report_line(r, "%s in %s · %ld steps%s%s", what, ct_fmt_duration(s->wall_s, d, sizeof d),
                   s->steps, ev, acc);
    if (isfinite(s->data_wait_share))
        ct_report_line(r, "data wait %.1f%% of training-step time", 100 * s->data_wait_share);
}

/* ---- summary ---- */

void ct_summary_init(ct_summary *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->status, sizeof s->status, "error");
    s->train_loss = s->eval_loss = s->eval_accuracy = NAN;
    s->tokens_per_s = s->loss_scale = s->samples_per_s = s->mfu = NAN;
    s->first_step_s = NAN;
    s->data_wait_share = NAN;
    s->gpu_util = s->gpu_mem_used_peak = NAN;
}

static void put_num(FILE *f, const char *key, double v, const char *fmt) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

/* JSON string with the escapes RFC 8259 requires. */
static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* "key":{"params":N,...} with one entry per memory category. */
static void put_by_cat(FILE *f, const char *key, const size_t *bytes) {
    fprintf(f, ",\"%s\":{", key);
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++)
        fprintf(f, "%s\"%s\":%zu", c ? "," : "", ct_mem_cat_name((ct_mem_cat)c), bytes[c]);
    fputc('}', f);
}

/* "hparams":{"lr":...,"train_batch_size":...,...,"seed":...} */
static void put_hparams(FILE *f, const ct_summary_hparams *h) {
    fputs(",\"hparams\":{\"lr\":", f);
    if (isfinite(h->lr)) fprintf(f, "%.6g", h->lr);
    else fputs("null", f);
    fprintf(f, ",\"train_batch_size\":%ld,\"train_micro_batch_size_per_gpu\":%ld,\"gradient_accumulation_steps\":%ld,"
            "\"world_size\":%d,\"precision\":", h->train_batch_size, h->micro_batch, h->grad_accum, h->world_size);
    put_str(f, h->precision);
    fputs(",\"optimizer\":", f);
    put_str(f, h->optimizer);
    fputs(",\"scheduler\":", f);
    if (h->scheduler[0]) put_str(f, h->scheduler);
    else fputs("null", f);
    fprintf(f, ",\"seed\":%llu}", h->seed);
}

void ct_summary_write(const ct_summary *s, FILE *f) {
    fputs("{\"status\":", f);
    put_str(f, s->status);
    fprintf(f, ",\"steps\":%ld,\"epochs\":%d", s->steps, s->epochs);
    put_num(f, "train_loss", s->train_loss, "%.6g");
    put_num(f, "eval_loss", s->eval_loss, "%.6g");
    put_num(f, "eval_accuracy", s->eval_accuracy, "%.6g");
    put_num(f, "wall_s", s->wall_s, "%.3f");
    put_num(f, "samples_per_s", s->samples_per_s, "%.1f");
    put_num(f, "tokens_per_s", s->tokens_per_s, "%.1f");
    put_num(f, "mfu", s->mfu, "%.4f");
    fprintf(f, ",\"peak_host_bytes\":%zu,\"peak_device_bytes\":%zu", s->peak_host_bytes,
            s->peak_device_bytes);
    put_num(f, "loss_scale", s->loss_scale, "%.6g");
    fprintf(f, ",\"skipped_steps\":%ld,\"skipped_records\":%lld,\"run_dir\":", s->skipped_steps,
            (long long)s->skipped_records);
    put_str(f, s->run_dir);
    put_num(f, "first_step_s", s->first_step_s, "%.3f");
    put_num(f, "data_wait_share", s->data_wait_share, "%.4f");
    put_num(f, "gpu_util", s->gpu_util, "%.1f");
    put_num(f, "gpu_mem_used_peak_bytes", s->gpu_mem_used_peak, "%.0f");
    if (s->has_mem_stats) put_by_cat(f, "peak_bytes_by_category", s->peak_by_cat);
    if (s->has_plan) put_by_cat(f, "planned_bytes_by_category", s->planned_by_cat);
    if (s->has_host_figures) {
        put_by_cat(f, "peak_host_bytes_by_category", s->peak_host_by_cat);
        put_by_cat(f, "planned_host_bytes_by_category", s->planned_host_by_cat);
    }
    if (s->hparams.set) put_hparams(f, &s->hparams);
    if (s->error[0]) {
        fputs(",\"error\":", f);
        put_str(f, s->error);
    }
    fputs("}\n", f);
    fflush(f);
}

int ct_summary_save(const ct_summary *s, const char *path, ct_err *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return ct_errf(err, CT_ERR_RUNTIME, "%s: %s", path, strerror(errno));
    ct_summary_write(s, f);
    fclose(f);
    int rc = ct_fs_write_atomic(path, text, len, err);
    free(text);
    return rc;
}

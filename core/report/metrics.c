/* metrics.c: metrics.jsonl, csv_monitor and tensorboard files from a writer thread (formats in metrics.h). */
#include "core/report/metrics.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/report/tfevents.h"
#include "core/util/fs.h"

/* ---- Python's float repr ---- */

const char *ct_fmt_pyfloat(double v, char *buf, size_t n) {
    if (isnan(v)) return snprintf(buf, n, "nan"), buf;
    if (isinf(v)) return snprintf(buf, n, v < 0 ? "-inf" : "inf"), buf;
    if (v == 0) return snprintf(buf, n, signbit(v) ? "-0.0" : "0.0"), buf;
    /* the shortest %e that reads back as v: its digits and decimal exponent. 17 digits always read
     * back, and if p digits do, p + 1 do (the nearer rounding): so most doubles (16 or 17 digits)
     * take two tries, round ones a binary search below 16, instead of up to 17 tries in a row --
     * this runs for every csv row, on every step. */
    char e[40];
    int lo = 1, hi = 16;
    snprintf(e, sizeof e, "%.15e", v);
    if (strtod(e, NULL) != v) lo = hi = 17;
    while (lo < hi) {
        int p = (lo + hi) / 2;
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) hi = p;
        else lo = p + 1;
    }
    snprintf(e, sizeof e, "%.*e", lo - 1, v);
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(s + 1);
    char out[64];
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) { /* 0.000ddd */
            out[k++] = '0', out[k++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else {         /* ddd.ddd, "ddd.0" when whole */
            for (int i = 0; i <= exp10; i++) out[k++] = i < nd ? digits[i] : '0';
            out[k++] = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) out[k++] = digits[i];
            else
                out[k++] = '0';
        }
        out[k] = 0;
    } else { /* d.ddde+XX, at least two exponent digits */
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, sizeof out - k, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(buf, n, "%s", out);
    return buf;
}

/* ---- the queue ---- */

typedef enum { REC_STEP, REC_EVAL, REC_MONITOR } rec_kind;

typedef struct record {
    rec_kind kind;
    double unix_time;            /* when it was queued: the event files' wall_time */
    union {
        ct_metric_step step;
        ct_metric_eval eval;
        ct_metric_monitor mon;
    } u;
} record;

/* The csv_monitor files, in DeepSpeed's names (Train/Samples/<m> with "/" -> "_"). */
enum { CSV_LOSS, CSV_LR, CSV_SCALE, CSV_COUNT };
static const char *const csv_metric[CSV_COUNT] = {"train_loss", "lr", "loss_scale"};

struct ct_metrics {
    pthread_mutex_t mu;
    pthread_cond_t wake;         /* writer: records, a flush request or stop */
    pthread_cond_t flushed;      /* flushers: done_gen caught up */
    record *ring;
    size_t cap, head, len;       /* records ring[head .. head+len) (mod cap) */
    long dropped;
    unsigned long flush_gen, done_gen;
    bool stop;
    bool idle;                   /* the writer waits with nothing pending: the next record wakes it */
    pthread_t thread;

    /* the writer's own (no lock) */
    FILE *jsonl;
    char jsonl_path[1100];
    char csv_dir[1100];
    bool append;
    FILE *csv[CSV_COUNT];        /* opened at a metric's first row */
    FILE *tb;                    /* the tensorboard event file (NULL: none) */
    char tb_path[1400];
    char failed[1700];           /* the first write that failed ("" : none) */
};

static void fail_once(ct_metrics *m, const char *path) {
    if (m->failed[0]) return;
    ct_err e = {0};   /* a full disk or ulimit -f says so, and what to do */
    ct_fs_write_error(&e, path, "write", errno ? errno : EIO);
    snprintf(m->failed, sizeof m->failed, "%.1600s", e.msg);
}

/* JSON: a number, or null where it is not finite (JSON has no NaN). */
static void put_num(FILE *f, const char *key, double v) {
    char b[40];
    fprintf(f, ",\"%s\":%s", key, isfinite(v) ? ct_fmt_pyfloat(v, b, sizeof b) : "null");
}

static void write_step(ct_metrics *m, const ct_metric_step *s) {
    if (!m->jsonl) return;
    FILE *f = m->jsonl;
    fprintf(f, "{\"type\":\"train\",\"step\":%ld,\"epoch\":%d", s->step, s->epoch);
    put_num(f, "loss", s->loss);
    put_num(f, "lr", s->lr);
    put_num(f, "loss_scale", s->loss_scale);
    put_num(f, "samples_per_s", s->samples_per_s);
    put_num(f, "tokens_per_s", s->tokens_per_s);
    put_num(f, "data_wait_share", s->data_wait_share);
    put_num(f, "wall_s", s->wall_s);
    if (s->breakdown) {
        put_num(f, "data_wait_ms", s->data_wait_ms);
        put_num(f, "forward_ms", s->forward_ms);
        put_num(f, "backward_ms", s->backward_ms);
        put_num(f, "optimizer_ms", s->optimizer_ms);
        put_num(f, "step_ms", s->step_ms);
    }
    if (s->gpu) {
        put_num(f, "gpu_util", s->gpu_util);
        put_num(f, "gpu_mem_used", s->gpu_mem_used);
    }
    fputs("}\n", f);
}

/* One tensorboard scalar (nothing without the event file or for a NaN: TensorBoard would plot it
 * as a gap-less spike, csv_monitor has no row for it either). */
static void write_tb(ct_metrics *m, double unix_time, int64_t step, const char *tag, double v) {
    if (!m->tb || isnan(v)) return;
    unsigned char ev[CT_TFEVENT_MAX];
    size_t n = ct_tfevent_scalar(ev, unix_time, step, tag, (float)v);
    if (ct_tfrecord_write(m->tb, ev, n) != 0) fail_once(m, m->tb_path);
}

static void write_eval(ct_metrics *m, double unix_time, const ct_metric_eval *e) {
    write_tb(m, unix_time, e->samples, "Eval/Samples/eval_loss", e->loss);
    write_tb(m, unix_time, e->samples, "Eval/Samples/eval_accuracy", e->accuracy);
    if (!m->jsonl) return;
    FILE *f = m->jsonl;
    fprintf(f, "{\"type\":\"eval\",\"step\":%ld,\"epoch\":%d", e->step, e->epoch);
    put_num(f, "eval_loss", e->loss);
    put_num(f, "eval_accuracy", e->accuracy);
    put_num(f, "eval_perplexity", e->perplexity);
    put_num(f, "wall_s", e->wall_s);
    fputs("}\n", f);
}

/* A csv_monitor row; the file and its header row come with the metric's first row. A resumed run
 * appends to the file and writes the header only into an empty one (DeepSpeed writes it again at
 * every restart, in the middle of the file). */
static void write_csv(ct_metrics *m, int which, int64_t step, double v) {
    char path[1200];
    if (!m->csv[which]) {
        snprintf(path, sizeof path, "%s/Train_Samples_%s.csv", m->csv_dir, csv_metric[which]);
        m->csv[which] = fopen(path, m->append ? "a" : "w");
        if (!m->csv[which]) {
            fail_once(m, path);
            return;
        }
        if (ftell(m->csv[which]) == 0) fprintf(m->csv[which], "step,%s\r\n", csv_metric[which]);
    }
    char b[40];
    fprintf(m->csv[which], "%lld,%s\r\n", (long long)step, ct_fmt_pyfloat(v, b, sizeof b));
}

static void write_monitor(ct_metrics *m, double unix_time, const ct_metric_monitor *s) {
    write_tb(m, unix_time, s->samples_before, "Train/Samples/train_loss", s->loss);
    write_tb(m, unix_time, s->samples_after, "Train/Samples/lr", s->lr);
    write_tb(m, unix_time, s->samples_after, "Train/Samples/loss_scale", s->loss_scale);
    if (!m->csv_dir[0]) return;
    write_csv(m, CSV_LOSS, s->samples_before, s->loss);
    write_csv(m, CSV_LR, s->samples_after, s->lr);
    if (!isnan(s->loss_scale)) write_csv(m, CSV_SCALE, s->samples_after, s->loss_scale);
}

static void write_record(ct_metrics *m, const record *r) {
    if (m->failed[0]) return; /* after a failed write: nothing more (the close reports it) */
    if (r->kind == REC_STEP) write_step(m, &r->u.step);
    else if (r->kind == REC_EVAL) write_eval(m, r->unix_time, &r->u.eval);
    else write_monitor(m, r->unix_time, &r->u.mon);
}

/* fflush every open file; a failure is the file's first failed write. */
static void flush_files(ct_metrics *m) {
    if (m->jsonl && (fflush(m->jsonl) != 0 || ferror(m->jsonl))) fail_once(m, m->jsonl_path);
    if (m->tb && (fflush(m->tb) != 0 || ferror(m->tb))) fail_once(m, m->tb_path);
    for (int i = 0; i < CSV_COUNT; i++)
        if (m->csv[i] && (fflush(m->csv[i]) != 0 || ferror(m->csv[i]))) {
            char path[1200];
            snprintf(path, sizeof path, "%s/Train_Samples_%s.csv", m->csv_dir, csv_metric[i]);
            fail_once(m, path);
        }
}

/* How long a written record may sit in stdio's buffers before the files are flushed: the writer
 * wakes about once per period, not once per step (a wake-up and a write(2) per file every step
 * cost a small model's step a few percent). A flush request (a signal's path) and the close flush
 * at once; a killed process loses at most this much of the history. TensorBoard's own writer
 * flushes every 120 s. */
#define FLUSH_PERIOD_S 1.0

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void wait_until(ct_metrics *m, double t) {
    struct timespec ts = {.tv_sec = (time_t)t};
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&m->wake, &m->mu, &ts);   /* the wake condition is on CLOCK_MONOTONIC */
}

/* Write what is queued, in batches copied out under the lock (the I/O runs without it). */
static void drain(ct_metrics *m) {
    enum { BATCH = 64 };
    record batch[BATCH];
    while (m->len > 0) {
        size_t k = 0;
        while (m->len > 0 && k < BATCH) {
            batch[k++] = m->ring[m->head];
            m->head = (m->head + 1) % m->cap;
            m->len--;
        }
        pthread_mutex_unlock(&m->mu);
        for (size_t i = 0; i < k; i++) write_record(m, &batch[i]);
        pthread_mutex_lock(&m->mu);
    }
}

/* The writer: asleep until a record arrives, then it gathers records for FLUSH_PERIOD_S (or
 * until the queue is half full), writes them and flushes the files. */
static void *writer_main(void *arg) {
    ct_metrics *m = arg;
    bool dirty = false;          /* written since the last flush */
    double due = 0;              /* when what is pending must be on disk */
    pthread_mutex_lock(&m->mu);
    for (;;) {
        bool asked = m->stop || m->done_gen != m->flush_gen;
        if (!asked && m->len < m->cap / 2) {
            if (m->len == 0 && !dirty) {
                m->idle = true;
                pthread_cond_wait(&m->wake, &m->mu);
                m->idle = false;
                due = mono_now() + FLUSH_PERIOD_S;
                continue;
            }
            if (mono_now() < due) {
                wait_until(m, due);
                continue;
            }
        }
        dirty |= m->len > 0;
        drain(m);
        asked = m->stop || m->done_gen != m->flush_gen;
        if (!asked && mono_now() < due) continue;   /* drained early (the queue filled): flush at `due` */
        unsigned long gen = m->flush_gen;
        pthread_mutex_unlock(&m->mu);
        flush_files(m);
        pthread_mutex_lock(&m->mu);
        dirty = false;
        m->done_gen = gen;
        pthread_cond_broadcast(&m->flushed);
        if (m->stop && m->len == 0 && m->done_gen == m->flush_gen) break;
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void push(ct_metrics *m, record *r) {
    if (!m) return;
    r->unix_time = unix_now();
    pthread_mutex_lock(&m->mu);
    if (m->len == m->cap) {
        m->dropped++;
    } else {
        m->ring[(m->head + m->len) % m->cap] = *r;
        m->len++;
        /* the writer gathers records for a while (writer_main): wake it only from its sleep, or
         * when the queue is half full */
        if (m->idle || m->len == m->cap / 2) pthread_cond_signal(&m->wake);
    }
    pthread_mutex_unlock(&m->mu);
}

void ct_metrics_step(ct_metrics *m, const ct_metric_step *s) { push(m, &(record){.kind = REC_STEP, .u.step = *s}); }
void ct_metrics_eval(ct_metrics *m, const ct_metric_eval *e) { push(m, &(record){.kind = REC_EVAL, .u.eval = *e}); }
void ct_metrics_monitor(ct_metrics *m, const ct_metric_monitor *s) {
    if (m && (m->csv_dir[0] || m->tb)) push(m, &(record){.kind = REC_MONITOR, .u.mon = *s});
}

void ct_metrics_flush(ct_metrics *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    unsigned long gen = ++m->flush_gen;
    pthread_cond_signal(&m->wake);
    while (m->done_gen < gen) pthread_cond_wait(&m->flushed, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

static void free_metrics(ct_metrics *m) {
    if (m->jsonl) fclose(m->jsonl);
    if (m->tb) fclose(m->tb);
    for (int i = 0; i < CSV_COUNT; i++)
        if (m->csv[i]) fclose(m->csv[i]);
    pthread_cond_destroy(&m->flushed);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->mu);
    free(m->ring);
    free(m);
}

/* Remove the event files an earlier run left in dir: TensorBoard reads every one of them as this
 * run's (a resumed run keeps them: its new file continues theirs). */
static int remove_event_files(const char *dir, int *removed, ct_err *err) {
    DIR *d = opendir(dir);
    if (!d) return ct_errf(err, CT_ERR_RUNTIME, "tensorboard: cannot read %s: %s", dir, strerror(errno));
    static const char prefix[] = "events.out.tfevents.";
    int rc = CT_OK;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0) continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (remove(path) == 0) (*removed)++;
        else if (errno != ENOENT)
            rc = ct_errf(err, CT_ERR_RUNTIME, "tensorboard: cannot replace %s: %s", path, strerror(errno));
    }
    closedir(d);
    return rc;
}

/* Create dir and this run's event file, its first event the format's version. */
static int open_tb(ct_metrics *m, const char *dir, bool append, int *removed, ct_err *err) {
    int rc = ct_fs_mkdirs(dir, err);
    if (!rc && !append) rc = remove_event_files(dir, removed, err);
    if (rc) return rc;
    double now = unix_now();
    char name[400];
    ct_tfevents_filename(name, sizeof name, now);
    snprintf(m->tb_path, sizeof m->tb_path, "%s/%s", dir, name);
    m->tb = fopen(m->tb_path, "wb");
    if (!m->tb) return ct_errf(err, CT_ERR_RUNTIME, "tensorboard: %s: %s", m->tb_path, strerror(errno));
    unsigned char ev[CT_TFEVENT_MAX];
    size_t n = ct_tfevent_version(ev, now);
    if (ct_tfrecord_write(m->tb, ev, n) != 0 || fflush(m->tb) != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "tensorboard: %s: %s", m->tb_path, strerror(errno));
    return CT_OK;
}

/* Whether a file is empty or ends with a newline (false: a partial last line). */
static bool ends_line(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return true;
    struct stat st;
    char last = '\n';
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1)
        last = '\n';
    close(fd);
    return last == '\n';
}

int ct_metrics_open(const ct_metrics_opts *o, ct_metrics **out, ct_err *err) {
    *out = NULL;
    ct_metrics *m = ct_xcalloc(1, sizeof *m);
    m->cap = o->queue_len ? o->queue_len : 4096;
    m->ring = ct_xcalloc(m->cap, sizeof *m->ring);
    m->append = o->append;
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* the writer's timed waits (mono_now) */
    pthread_cond_init(&m->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&m->flushed, NULL);
    int rc = CT_OK, csv_removed = 0, tb_removed = 0;
    if (o->csv_dir) {
        snprintf(m->csv_dir, sizeof m->csv_dir, "%s", o->csv_dir);
        rc = ct_fs_mkdirs(o->csv_dir, err);
        /* a fresh run starts its metrics afresh: another run's rows would read as this one's */
        for (int i = 0; !rc && !o->append && i < CSV_COUNT; i++) {
            char path[1200];
            snprintf(path, sizeof path, "%s/Train_Samples_%s.csv", m->csv_dir, csv_metric[i]);
            if (remove(path) == 0) csv_removed++;
            else if (errno != ENOENT)
                rc = ct_errf(err, CT_ERR_RUNTIME, "csv_monitor: cannot replace %s: %s", path, strerror(errno));
        }
    }
    if (!rc && o->tb_dir) rc = open_tb(m, o->tb_dir, o->append, &tb_removed, err);
    /* replacing an earlier run's history is said, never silent (resume to continue it instead) */
    if (o->notice_n) {
        o->notice[0] = '\0';
        if (csv_removed || tb_removed)
            snprintf(o->notice, o->notice_n, "a fresh run replaced an earlier run's %s%s%s%s%s (--resume continues them)",
                     csv_removed ? "csv_monitor files in " : "", csv_removed ? o->csv_dir : "",
                     csv_removed && tb_removed ? " and " : "", tb_removed ? "TensorBoard event files in " : "",
                     tb_removed ? o->tb_dir : "");
    }
    if (!rc && o->jsonl_path) {
        snprintf(m->jsonl_path, sizeof m->jsonl_path, "%s", o->jsonl_path);
        m->jsonl = fopen(o->jsonl_path, o->append ? "a" : "w");
        if (!m->jsonl) rc = ct_errf(err, CT_ERR_RUNTIME, "%s: %s", o->jsonl_path, strerror(errno));
        /* a run killed inside a write left a partial last line: a resume starts on a fresh one, so
         * the part stays one bad line (plot skips it) instead of gluing onto the next record */
        else if (o->append && !ends_line(o->jsonl_path)) fputc('\n', m->jsonl);
    }
    if (!rc && pthread_create(&m->thread, NULL, writer_main, m) != 0)
        rc = ct_errf(err, CT_ERR_RUNTIME, "cannot start the metrics writer thread");
    if (rc) {
        free_metrics(m);
        return rc;
    }
    *out = m;
    return CT_OK;
}

int ct_metrics_close(ct_metrics *m, ct_err *err) {
    if (!m) return CT_OK;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    m->flush_gen++;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    int rc = CT_OK;
    if (m->failed[0])
        rc = ct_errf(err, CT_ERR_RUNTIME, "metrics: later metrics were not written: %s", m->failed);
    else if (m->dropped > 0)
        rc = ct_errf(err, CT_ERR_RUNTIME, "metrics: %ld records dropped (the writer fell behind the training "
                     "steps; the files miss them)", m->dropped);
    free_metrics(m);
    return rc;
}

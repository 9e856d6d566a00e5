/* metrics.h: the run's metric history on disk, written by a background thread.
 *
 * Files (rank 0 only; the trainer decides):
 *   <run_dir>/metrics.jsonl   one JSON object per logged step (the print window's means, every
 *                             steps_per_print steps or the default interval) and one per eval.
 *   csv_monitor               DeepSpeed's layout: <output_path>/<job_name>/Train_Samples_<m>.csv
 *                             per metric m (train_loss, lr, loss_scale under fp16), first row
 *                             "step,<m>", then "<global samples>,<value>" every optimizer step,
 *                             rows ended by "\r\n" (Python's csv.writer) and values as Python
 *                             prints a float.
 *   tensorboard               DeepSpeed's directory <output_path>/<job_name>, one event file per run
 *                             (core/report/tfevents.h: events.out.tfevents.<time>.<host>.<pid>.0)
 *                             with the csv_monitor scalars under DeepSpeed's tags
 *                             (Train/Samples/train_loss, .../lr, .../loss_scale under fp16) and each
 *                             eval's Eval/Samples/eval_loss and Eval/Samples/eval_accuracy (a
 *                             classifier's), all at the global samples as DeepSpeed's x-axis.
 *
 * The training thread only copies a record into a bounded queue under a mutex the writer holds
 * for a copy, never for I/O: it never waits for the disk. The writer gathers records and writes and
 * flushes about once a second (ct_metrics_flush and ct_metrics_close at once). When the writer falls behind and the
 * queue is full, records are dropped and counted (ct_metrics_close says how many). A write that
 * fails (a full disk) stops the writer; ct_metrics_close reports it. Training goes on in both
 * cases: the history is for the user, the run's result is its checkpoints and summary. */
#ifndef CT_METRICS_H
#define CT_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/util/common.h"

typedef struct ct_metrics ct_metrics;

/* One logged step: means over the print window that ended at `step`. NAN where not known
 * (loss_scale when not fp16, tokens_per_s unless a language model). */
typedef struct ct_metric_step {
    long step;
    int epoch;                   /* 1-based */
    double loss, lr, loss_scale;
    double samples_per_s, tokens_per_s;
    double data_wait_share;      /* of the window's wall time, in [0, 1] */
    double wall_s;               /* seconds since training started */
    /* wall_clock_breakdown: the window's mean milliseconds per step of each phase (in the record
     * only when `breakdown`) */
    bool breakdown;
    double data_wait_ms, forward_ms, backward_ms, optimizer_ms, step_ms;
    /* NVML at the window's end (in the record only when `gpu`): utilisation percent, bytes in use */
    bool gpu;
    double gpu_util, gpu_mem_used;
} ct_metric_step;

typedef struct ct_metric_eval {
    long step;
    int64_t samples;             /* global samples trained on when the eval ran */
    int epoch;
    double loss, accuracy;       /* accuracy NAN unless a classifier */
    double perplexity;           /* exp(loss) for a language model, else NAN */
    double wall_s;
} ct_metric_eval;

/* One optimizer step as DeepSpeed's monitors log it: train_loss at the global samples before the
 * step (DeepSpeed logs it in backward), lr and loss_scale (the ones the next step uses) at the
 * samples after it (logged after the optimizer and scheduler step). */
typedef struct ct_metric_monitor {
    int64_t samples_before, samples_after;
    double loss, lr;
    double loss_scale;           /* NAN when not fp16: no loss_scale file */
} ct_metric_monitor;

typedef struct ct_metrics_opts {
    const char *jsonl_path;      /* NULL: no metrics.jsonl */
    const char *csv_dir;         /* NULL: no csv_monitor (else <output_path>/<job_name>) */
    const char *tb_dir;          /* NULL: no tensorboard event file (else <output_path>/<job_name>) */
    bool append;                 /* a resumed run continues the files; else they start empty */
    size_t queue_len;            /* records the queue holds; 0: 4096 */
    char *notice;                /* when not NULL: what a fresh start replaced of an earlier run's */
    size_t notice_n;             /* csv and event files, for one warning line ("" when nothing) */
} ct_metrics_opts;

/* Create csv_dir and tb_dir, open the jsonl and event files and start the writer. CT_ERR_RUNTIME naming the path. */
int ct_metrics_open(const ct_metrics_opts *o, ct_metrics **out, ct_err *err);
/* Queue a record (never waits for I/O). */
void ct_metrics_step(ct_metrics *m, const ct_metric_step *s);
void ct_metrics_eval(ct_metrics *m, const ct_metric_eval *e);
void ct_metrics_monitor(ct_metrics *m, const ct_metric_monitor *s);
/* Wait until everything queued so far is written and flushed to the files (a stop signal's path,
 * before the process exits). */
void ct_metrics_flush(ct_metrics *m);
/* Flush, stop the writer, close the files. CT_ERR_RUNTIME when a write failed or records were
 * dropped (the message says which file and how many); the files are closed either way. NULL: ok. */
int ct_metrics_close(ct_metrics *m, ct_err *err);

/* v as Python's repr(float) writes it ("0.1", "65536.0", "1e-05", "nan", "inf"): the shortest
 * digits that read back as v, positional for decimal exponents -4..15, else d.ddde+XX. */
const char *ct_fmt_pyfloat(double v, char *buf, size_t n);

#endif

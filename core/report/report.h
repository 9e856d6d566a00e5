/* report.h: what the training loop tells its user while it runs (stderr), and the summary
 * (ct_summary: the one JSON line every run ends with).
 *
 * The reporter receives events (start, step done, eval done, epoch done, end) and formats them.
 * Steps are grouped in print windows of log_every steps: steps_per_print when the config gives it,
 * else ct_report_default_interval of the run's planned steps (20-50 windows a run). When a window
 * ends, its means go to metrics.jsonl (the caller, from ct_report_step's answer) and, unless
 * stderr is a terminal without steps_per_print, to a plain "step ..." line. On a terminal a
 * progress line is redrawn in place between them. Each epoch ends with a line. --quiet silences
 * everything but errors and the summary; so does the first write that fails (a closed pipe or
 * terminal): the run goes on without its progress lines. */
#ifndef CT_REPORT_H
#define CT_REPORT_H

#include <stdio.h>

#include "core/backend/backend.h"
#include "core/util/common.h"

/* The resolved hyperparameters a run trained with, for sweep scripts that tabulate summaries
 * ("hparams" in the summary; absent when the config did not load). */
typedef struct ct_summary_hparams {
    bool set;
    double lr;                   /* optimizer.params.lr (the peak, before the schedule) */
    long train_batch_size, micro_batch, grad_accum;
    int world_size;
    char precision[8];           /* fp32, fp16, bf16 */
    char optimizer[32];          /* as the config names it ("AdamW") */
    char scheduler[32];          /* "" when none */
    unsigned long long seed;
} ct_summary_hparams;

/* The summary printed at the end of every run (docs/cli.md lists the keys; scripts rely on
 * them). */
typedef struct ct_summary {
    char status[16];             /* ok, early_stopped, diverged, interrupted, error */
    long steps;                  /* optimizer steps (applied + skipped) */
    int epochs;                  /* epochs started */
    double train_loss;           /* mean loss over the last steps_per_print window / last epoch */
    double eval_loss;            /* NAN when no eval ran */
    double eval_accuracy;        /* NAN when not a classification task or no eval */
    double wall_s;
    double samples_per_s;
    double tokens_per_s;         /* NAN unless a language model */
    double mfu;                  /* model FLOPs utilisation in [0, 1]; NAN when the device's peak
                                    is unknown (ct_device_peak_flops) */
    size_t peak_host_bytes;
    size_t peak_device_bytes;
    double loss_scale;           /* NAN when not fp16 */
    long skipped_steps;
    int64_t skipped_records;     /* data.skip_corrupt: distinct records skipped, train + eval sets */
    char run_dir[1024];
    char error[512];             /* first line of the error when status is "error" */
    double first_step_s;         /* process age when the first training step began; NAN if none */
    double data_wait_share;      /* fraction of training-step time spent waiting for the loader */
    double gpu_util;             /* NVML: mean GPU utilisation (percent) of the print windows' ends;
                                    NAN without NVML (a CPU run) */
    double gpu_mem_used_peak;    /* NVML: the most device memory in use (bytes, every process) */
    /* Peak bytes per memory category (backend.h ct_mem_cat: device memory on a GPU, the
     * backend's host allocations on the CPU); written as "peak_bytes_by_category". */
    size_t peak_by_cat[CT_MEM_CAT_COUNT];
    bool has_mem_stats;
    /* The memory plan made at start (core/train/plan.h), by category: "planned_bytes_by_category",
     * to hold against the peaks. */
    size_t planned_by_cat[CT_MEM_CAT_COUNT];
    bool has_plan;
    /* On a device (a GPU, the capped device): the host memory beside it by category, measured
     * (pinned allocations, and the pageable host state of offload_optimizer with pin_memory false)
     * and planned: "peak_host_bytes_by_category", "planned_host_bytes_by_category". */
    size_t peak_host_by_cat[CT_MEM_CAT_COUNT], planned_host_by_cat[CT_MEM_CAT_COUNT];
    bool has_host_figures;
    /* --summary names a file the run reads (its config, a dataset file) or one of ctrain's own
     * (a checkpoint's, the run directory's lock): the run was refused and the file must be left
     * alone (the line goes to stdout only). */
    bool summary_file_refused;
    ct_summary_hparams hparams;  /* written as "hparams" when set */
} ct_summary;

void ct_summary_init(ct_summary *s);

/* The dense bf16/fp16 tensor-core peak in FLOP/s of the device a backend describes
 * (be->device_desc: "NVIDIA H100 80GB HBM3, sm_90, 79 GiB"), from a table of known GPUs (peak.c);
 * 0 when unknown (a CPU, an unlisted GPU): no MFU is reported then. */
double ct_device_peak_flops(const char *device_desc);
/* One line of JSON, no trailing newline in the buffer-less form: writes it plus "\n" to f. */
void ct_summary_write(const ct_summary *s, FILE *f);
/* The line into path atomically (ct_fs_write_atomic: a reader sees the old summary or the new
 * one, never a part; a full disk leaves the old one). CT_ERR_RUNTIME naming path. */
int ct_summary_save(const ct_summary *s, const char *path, ct_err *err);

typedef struct ct_report {
    FILE *out;
    bool quiet;
    bool tty;                    /* out is a terminal: the progress line is redrawn */
    bool redrawn;                /* a progress line is on screen and must be cleared first */
    long steps_per_print;        /* the config's; 0: not given (DeepSpeed's null) */
    long log_every;              /* steps per print window (ct_report_plan); 0: no windows */
    bool plain;                  /* print a plain line at each window's end */
    double ema_loss;             /* the progress line's smoothed loss (bias-corrected EMA) */
    long ema_n;
    int64_t tokens_per_sample;   /* a language model's sequence length: rates in tokens/s, eval
                                    with perplexity; 0 otherwise */
    double train_flops_per_sample; /* ct_graph_train_flops_per_sample */
    double peak_flops;           /* the device's (ct_device_peak_flops); 0: unknown, no MFU */
    double t0;                   /* ct_now() when training started */
    double last_draw;
    double win_loss;             /* loss sum / count over the current print window */
    long win_n;
    double win_t0;               /* ct_now() at the window start */
    int64_t win_samples;
    int64_t win_tokens;          /* a language model's tokens in the window (curriculum learning
                                    cuts samples short: tokens are not samples x T) */
    double win_wait;             /* seconds the loop waited for data in the window */
    double epoch_wait;           /* ... in the current epoch */
    struct ct_nvml *gpu;         /* NVML for the run's GPU (nvml.h; not owned); NULL: no GPU figures */
    double gpu_util_sum;         /* the samples taken at each window's end, for the summary */
    long gpu_n;
    double gpu_mem_peak;         /* bytes in use on the device, the most a sample saw */
} ct_report;

/* MFU of a rate: the training FLOPs per second over r->peak_flops; NAN when the peak is unknown.
 * A language model's FLOPs go by its tokens (tokens_per_s x the FLOPs per token at full length:
 * a curriculum's shorter sequences cost slightly less attention than that counts), any other's
 * by samples_per_s. */
double ct_report_mfu(const ct_report *r, double samples_per_s, double tokens_per_s);

/* One optimizer step, as the loop saw it. */
typedef struct ct_step_event {
    long step, total_steps;      /* 1-based step done; total planned (0 = unknown) */
    int epoch, epochs;           /* 1-based */
    long epoch_step, epoch_steps;
    double loss;                 /* mean loss of this step */
    double lr, grad_norm;
    int64_t samples;             /* samples in this step */
    int64_t tokens;              /* a language model's tokens in this step (samples x the length
                                    they were cut to); 0 otherwise */
    double loss_scale;           /* fp16: the loss scale the next step uses; 0 when not fp16 */
    long skipped_steps;          /* fp16: steps skipped for gradient overflow so far */
    double data_wait_s;          /* seconds this step waited for its batches */
} ct_step_event;

void ct_report_init(ct_report *r, FILE *out, bool quiet, long steps_per_print);
/* The default print interval of a run of total_steps steps: the smallest of 1, 2, 5, 10, 20, 50,
 * ... that gives at most 50 windows, so a run prints 20 to 50 step lines (fewer only when it has
 * fewer than 20 steps: one a step); 10 (DeepSpeed's documented default) when total_steps <= 0. */
long ct_report_default_interval(long total_steps);
/* Once the run's planned steps are known: log_every and plain (see above). */
void ct_report_plan(ct_report *r, long total_steps);
/* Whether step (1-based) closes a print window: the steps whose plain line shows the gradient
 * norm. It depends on the config and the planned steps only, never on the terminal, --quiet or
 * the rank, so every rank gives the same answer (the loop computes the norm on these steps). */
bool ct_report_closes_window(const ct_report *r, long step);

/* The means of a print window that ended (what metrics.jsonl records of a step). */
typedef struct ct_report_window {
    double loss;                 /* NAN when every step of the window was skipped */
    double samples_per_s, tokens_per_s; /* tokens_per_s NAN unless a language model */
    double data_wait_share;
    double wall_s;               /* since ct_report_train_start */
    double gpu_util;             /* NVML at the window's end (percent; bytes); NAN without r->gpu */
    double gpu_mem_used;
} ct_report_window;
/* Print a line of the start block / plan (no trailing newline needed). printf-style. */
void ct_report_line(ct_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_report_train_start(ct_report *r);
/* Count the step into the window; true when it ended a window (*w then holds its means). */
bool ct_report_step(ct_report *r, const ct_step_event *e, ct_report_window *w);
void ct_report_eval(ct_report *r, long step, int epoch, double loss, double accuracy, int64_t n,
                    double secs);
void ct_report_epoch(ct_report *r, int epoch, int epochs, long step, double train_loss, double secs,
                     double samples_per_s, double tokens_per_s);
/* The summary's GPU figures from the windows' NVML samples: mean utilisation (percent) and the
 * most memory in use (bytes); NAN for both without samples. */
void ct_report_gpu_summary(const ct_report *r, double *util, double *mem_peak);
/* "done in 41.2s · 2345 steps · eval loss 0.33 · accuracy 88.9%" (or the status when not ok). */
void ct_report_end(ct_report *r, const ct_summary *s);

/* Formatting helpers shared with the plan printout. */
const char *ct_fmt_bytes(double bytes, char *buf, size_t n);   /* "2.6 MiB" */
const char *ct_fmt_count(double count, char *buf, size_t n);   /* "669.7 k", "124.4 M" */
const char *ct_fmt_duration(double s, char *buf, size_t n);    /* "41.2s", "7m03s", "11h02m" */

/* Seconds since this process started (from /proc; 10 ms resolution), NAN when unknown. */
double ct_process_age_s(void);
/* Peak resident set size of this process in bytes (getrusage). */
size_t ct_peak_rss_bytes(void);

#endif

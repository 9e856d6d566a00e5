/* bench_logging.c: what the run's metric history costs a training step (issue 16: "metrics +
 * TensorBoard + breakdown on cost < 1% of step time on the fmnist MLP").
 *
 * Drives core/report/metrics.h exactly as the training loop does (core/train/loop.c after_step):
 * every optimizer step queues a monitor record (a csv row per metric and a TensorBoard event per
 * scalar), every `every` steps a metrics.jsonl record with the wall_clock_breakdown fields; the
 * breakdown's own cost, the clock reads around each phase, is counted too (five a step). The
 * files go to a temporary directory (on the same disk as the run's would be: TMPDIR).
 *
 * The figure is CPU time, not wall time: the process's CPU clock counts the training thread's
 * queueing and the writer thread's formatting and writes alike, so it is the cost to a machine
 * whose cores are all busy training (the worst case for a background thread), and it is steady
 * on a loaded machine where a wall-time difference of 1% drowns in noise. Divide by the step time
 * of the model (bench/bench_logging.sh measures the fmnist MLP's in the same run).
 *
 * Each figure is the CPU time with the files on minus the same paced loop without them, the median
 * (and range) of 5 interleaved pairs. Prints one JSON line per cadence:
 *   {"every": K, "steps": N, "pause_us": P, "cpu_us_per_step_median": ..., "min": ..., "max": ...}
 * Build and run: bench/bench_logging.sh (it builds this file against build/libctrain.a). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/report/metrics.h"
#include "core/util/common.h"
#include "core/util/fs.h"
#include "bench/bench_common.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The loop's clock reads of wall_clock_breakdown (data wait, forward, backward, optimizer, step). */
static volatile double g_sink;
static void breakdown_marks(void) {
    for (int i = 0; i < 5; i++) g_sink += wall_now();
}

/* A step's pause: the writer thread runs beside a training thread that spends this long per
 * step elsewhere (a real step), not beside a loop that only queues records, which would outrun
 * any writer (the queue then drops records and says so). Sleeping costs no CPU time. */
static void pause_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* N paced steps; with `on`, every output open and a jsonl record every `every` steps; without,
 * the same loop and pauses with no metrics (the baseline: the pauses' system calls). The process
 * CPU seconds from the first step until the files are flushed and closed. */
static int run(const char *dir, bool on, long steps, long every, long pace, double *cpu_s) {
    char jsonl[1200], csv[1200], tb[1200];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", dir);
    snprintf(csv, sizeof csv, "%s/csv", dir);
    snprintf(tb, sizeof tb, "%s/tb", dir);
    ct_metrics_opts o = {.jsonl_path = jsonl, .csv_dir = csv, .tb_dir = tb};
    ct_metrics *m = NULL;
    ct_err err = {0};
    if (on && ct_metrics_open(&o, &m, &err)) {
        fprintf(stderr, "bench_logging: %s\n", err.msg);
        return 1;
    }
    double c0 = cpu_now();
    for (long s = 1; s <= steps; s++) {
        pause_us(pace);
        if (on) breakdown_marks();
        double loss = 2.3 / (1.0 + 1e-3 * (double)s), lr = 1e-3 * (1.0 - (double)s / (double)steps);
        if (s % every == 0) {
            ct_metric_step ms = {.step = s, .epoch = 1 + (int)(s / 469), .loss = loss, .lr = lr,
                                 .loss_scale = 65536.0, .samples_per_s = 95000.0 + (double)(s % 97),
                                 .tokens_per_s = NAN, .data_wait_share = 0.01, .wall_s = 1e-3 * (double)s,
                                 .breakdown = true, .data_wait_ms = 0.01, .forward_ms = 0.4,
                                 .backward_ms = 0.8, .optimizer_ms = 0.2, .step_ms = 1.4};
            ct_metrics_step(m, &ms);
        }
        ct_metrics_monitor(m, &(ct_metric_monitor){.samples_before = 128 * (s - 1), .samples_after = 128 * s,
                                                   .loss = loss, .lr = lr, .loss_scale = 65536.0});
    }
    int rc = ct_metrics_close(m, &err);   /* flushed and closed: every record written */
    *cpu_s = cpu_now() - c0;
    if (rc) fprintf(stderr, "bench_logging: %s\n", err.msg);
    return rc;
}

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 10000, pace = argc > 2 ? atol(argv[2]) : 200;
    const char *tmp = getenv("TMPDIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/bench-logging-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (steps <= 0 || pace < 0 || pace >= 1000000 || !mkdtemp(dir)) {
        fprintf(stderr, "usage: bench_logging [steps > 0] [pause us a step, < 1e6]; TMPDIR must be writable\n");
        return 2;
    }
    /* every step (steps_per_print 1: the most a config can ask) and every 50 (fmnist_mlp's default
     * interval: 2345 steps in 5 epochs, at most 50 lines) */
    static const long cadence[] = {1, 50};
    enum { ROUNDS = 5 };
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        double d[ROUNDS];
        for (int r = 0; r < ROUNDS && !rc; r++) {   /* on and off interleaved: load falls on both */
            char sub[1100];
            snprintf(sub, sizeof sub, "%s/r%d-%d", dir, i, r);
            if (mkdir(sub, 0755) != 0) {
                fprintf(stderr, "bench_logging: cannot make %s\n", sub);
                rc = 1;
                break;
            }
            double con = 0, coff = 0;
            rc = run(sub, true, steps, cadence[i], pace, &con);
            if (!rc) rc = run(sub, false, steps, cadence[i], pace, &coff);
            d[r] = con - coff;
        }
        if (rc) break;
        qsort(d, ROUNDS, sizeof *d, cmp_double);
        printf("{\"every\": %ld, \"steps\": %ld, \"pause_us\": %ld, \"cpu_us_per_step_median\": %.3f, "
               "\"min\": %.3f, \"max\": %.3f}\n", cadence[i], steps, pace, 1e6 * d[ROUNDS / 2] / (double)steps,
               1e6 * d[0] / (double)steps, 1e6 * d[ROUNDS - 1] / (double)steps);
    }
    ct_fs_remove_tree(dir);
    return rc;
}

/* bench_reduce.c: the CPU backend's reductions and what the global gradient norm costs an AdamW
 * step (issue 18, "no wasted reductions").
 *
 * Prints one JSON line per measurement:
 *   reduce   GB/s of each reduction, on one thread over one 4096-element chunk (in L1: the loop
 *            itself) and through the backend over 1 Mi and 64 Mi floats (in cache / from memory)
 *   adamw    ms of an AdamW step over 67,108,864 parameters with clipping off: the update alone
 *            (what the loop runs on a step that needs no norm) and the sum of squares + update
 *            (what it ran on every step before)
 * Each figure is the median and minimum over rounds that interleave the variants, so load from
 * other processes on a shared machine falls on all of them alike.
 * Build (docs/BENCHMARKS.md, "No wasted reductions", has the numbers):
 *   make CUDA=0 build/libctrain.a
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. bench/bench_reduce.c build/libctrain.a -lm -ldl -pthread \
 *      -o build/bench_reduce
 *   build/bench_reduce [threads]          (default 2) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/cpu/cpu_internal.h"
#include "core/optim/optim.h"
#include "core/util/rng.h"
#include "bench/bench_common.h"

enum { ROUNDS = 9 };

/* Median and minimum of ROUNDS timings (sorts t). */
static void med_min(double *t, double *med, double *min) {
    qsort(t, ROUNDS, sizeof *t, cmp_double);
    *med = t[ROUNDS / 2];
    *min = t[0];
}

/* A sink the compiler cannot drop the reductions into. */
static volatile double g_sink;

/* ---- reductions ---- */

enum { N_KERNELS = 5 };
static const char *const KERNEL_NAMES[N_KERNELS] = {"sum", "sum_squares", "sum_sq_dev", "backend_sum_squares",
                                                    "backend_all_finite"};

/* Runs kernel k over x[0, n); reps times for the one-chunk (in L1) case. */
static void run_kernel(ct_backend *be, int k, const float *x, int64_t n, int reps) {
    double s = 0;
    for (int r = 0; r < reps; r++) {
        switch (k) {
        case 0: s += ct_cpu_sum(x, n); break;
        case 1: s += ct_cpu_sum_squares(x, n); break;
        case 2: s += ct_cpu_sum_sq_dev(x, n, 0.125); break;
        case 3: s += be->optim.sum_squares(be, x, n); break;
        case 4: s += be->optim.all_finite(be, x, n); break;
        }
    }
    g_sink = s;
}

static void bench_reductions(ct_backend *be, int threads) {
    /* one chunk, repeated: the loop's own speed; then the backend's over memory sizes */
    const struct { const char *where; int64_t n; int reps; int first_kernel; } cases[] = {
        {"one_chunk_l1", CT_CPU_CHUNK, 20000, 0},
        {"1Mi_floats", 1 << 20, 40, 3},
        {"64Mi_floats", 64 << 20, 2, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float *x = rnd(cases[c].n, 7);
        double t[N_KERNELS][ROUNDS];
        run_kernel(be, cases[c].first_kernel, x, cases[c].n, 1); /* touch the pages */
        for (int r = 0; r < ROUNDS; r++)
            for (int k = cases[c].first_kernel; k < N_KERNELS; k++) {
                double t0 = ct_now();
                run_kernel(be, k, x, cases[c].n, cases[c].reps);
                t[k][r] = ct_now() - t0;
            }
        for (int k = cases[c].first_kernel; k < N_KERNELS; k++) {
            double med, min, bytes = 4.0 * (double)cases[c].n * cases[c].reps;
            med_min(t[k], &med, &min);
            printf("{\"bench\": \"reduce\", \"kernel\": \"%s\", \"size\": \"%s\", \"threads\": %d, "
                   "\"gbps_median\": %.2f, \"gbps_best\": %.2f}\n",
                   KERNEL_NAMES[k], cases[c].where, k >= 3 ? threads : 1, bytes / med * 1e-9, bytes / min * 1e-9);
        }
        free(x);
    }
}

/* ---- an AdamW step over 67M parameters, clipping off ---- */

static void bench_adamw(ct_backend *be, int threads) {
    const int64_t n = 64 << 20; /* 67,108,864 */
    /* a weight (decayed) and a bias-like tail (not), as a model's views would be */
    const ct_optim_tensor tensors[] = {{0, n - 4096, true}, {n - 4096, 4096, false}};
    ct_optimizer_cfg c;
    memset(&c, 0, sizeof c);
    c.type = CT_OPT_ADAMW;
    c.lr = 1e-3, c.beta1 = 0.9, c.beta2 = 0.999, c.eps = 1e-8, c.weight_decay = 0.01;
    c.adam_w_mode = true, c.bias_correction = true;
    ct_optim *o = NULL;
    ct_err err = {0};
    if (ct_optim_create(&c, NULL, 0.0, be, tensors, 2, 0, n, &o, &err)) {
        fprintf(stderr, "bench_reduce: %s\n", err.msg);
        return;
    }
    float *master = rnd(n, 11), *grads = rnd(n, 12);
    ct_optim_target tg = {.master = master, .grads = grads};
    ct_optim_stats st;
    ct_optim_apply(o, &tg, 1.0f, NAN, &st); /* the first touch of the state */
    double t[2][ROUNDS];
    for (int r = 0; r < ROUNDS; r++)
        for (int v = 0; v < 2; v++) {
            double t0 = ct_now();
            double norm = v ? sqrt(ct_optim_grad_sumsq(o, grads)) : NAN;
            ct_optim_apply(o, &tg, 1.0f, norm, &st);
            t[v][r] = ct_now() - t0;
        }
    const char *names[2] = {"update_alone", "norm_and_update"};
    double med[2], min[2];
    for (int v = 0; v < 2; v++) med_min(t[v], &med[v], &min[v]);
    for (int v = 0; v < 2; v++)
        printf("{\"bench\": \"adamw\", \"params\": %lld, \"threads\": %d, \"variant\": \"%s\", "
               "\"ms_median\": %.1f, \"ms_best\": %.1f, \"vs_update_alone_median\": %.3f}\n",
               (long long)n, threads, names[v], med[v] * 1e3, min[v] * 1e3, med[v] / med[0]);
    ct_optim_free(o);
    free(master);
    free(grads);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    ct_backend *be = ct_cpu_backend_create(threads > 0 ? threads : 2);
    if (!be) {
        fprintf(stderr, "bench_reduce: the CPU backend did not start\n");
        return 1;
    }
    printf("{\"bench\": \"device\", \"desc\": \"%s\"}\n", be->device_desc);
    bench_reductions(be, threads);
    bench_adamw(be, threads);
    ct_backend_destroy(be);
    return 0;
}

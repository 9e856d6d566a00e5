/* bench_gemm_paths.c: OpenBLAS against oneDNN for every single-threaded GEMM the Fashion-MNIST MLP
 * and CNN run (issue 18: "measure each shape class and say which path a shape takes").
 *
 * The shapes are the calls as the CPU backend makes them: a layer's GEMM cut into the tiles the
 * pool runs (ct_cpu_gemm_tile_shape), and the CNN's per-image convolution GEMMs (cpu_conv.c), at
 * batch 32, 128 and 512. Each is timed on one thread through ct_cpu_sgemm_with, with both
 * libraries alternating within every round, so load from other processes falls on both alike.
 * Prints one JSON line per shape: microseconds (median and minimum over the rounds) of each
 * library in this thread's CPU time, their ratio (oneDNN / OpenBLAS, of the medians) and the library ct_cpu_sgemm picks.
 * Build (docs/BENCHMARKS.md, "oneDNN or OpenBLAS per shape", has the numbers):
 *   make CUDA=0 build/libctrain.a
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. bench/bench_gemm_paths.c build/libctrain.a -lm -ldl -pthread \
 *      -o build/bench_gemm_paths
 *   build/bench_gemm_paths [rounds]          (default 9) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/cpu/cpu_internal.h"
#include "core/util/common.h"
#include "bench/bench_common.h"

enum { MAX_ROUNDS = 31 };

typedef struct {
    const char *name; /* model layer and pass */
    bool ta, tb;
    int64_t m, n, k;  /* the layer's whole GEMM (tiled) or one image's (per_image) */
    bool per_image;
} gemm_shape;

/* This thread's CPU seconds: on a machine shared with other jobs, wall time mostly measures
 * their load; a single-threaded GEMM's CPU time does not. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of one call, repeated for ~30 ms. */
static double time_call(ct_gemm_lib lib, const gemm_shape *s, int64_t m, int64_t n, const float *a,
                        const float *b, float *c) {
    int64_t lda = s->ta ? m : s->k, ldb = s->tb ? s->k : n;
    int64_t reps = (int64_t)(3e8 / ((double)m * n * s->k)) + 1;
    double t = thread_cpu_s();
    for (int64_t r = 0; r < reps; r++)
        ct_cpu_sgemm_with(lib, s->ta, s->tb, m, n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
    return (thread_cpu_s() - t) / (double)reps;
}

static void bench_shape(const gemm_shape *s, int batch, int rounds) {
    int64_t m = s->m, n = s->n;
    if (!s->per_image) ct_cpu_gemm_tile_shape(s->m, s->n, s->k, &m, &n);
    float *a = rnd(m * s->k, 1), *b = rnd(s->k * n, 2), *c = rnd(m * n, 3);
    double t[2][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int lib = 0; lib < 2; lib++) t[lib][r] = time_call((ct_gemm_lib)lib, s, m, n, a, b, c);
    qsort(t[0], (size_t)rounds, sizeof(double), cmp_double);
    qsort(t[1], (size_t)rounds, sizeof(double), cmp_double);
    double ob = t[0][rounds / 2], dn = t[1][rounds / 2];
    printf("{\"shape\": \"%s\", \"batch\": %d, \"op\": \"%c%c\", \"call\": [%lld, %lld, %lld], "
           "\"calls_per_step\": %lld, \"openblas_us\": %.1f, \"openblas_min_us\": %.1f, "
           "\"onednn_us\": %.1f, \"onednn_min_us\": %.1f, \"ratio\": %.2f, \"picked\": \"%s\"}\n",
           s->name, batch, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', (long long)m, (long long)n,
           (long long)s->k, (long long)(s->per_image ? batch : ct_cpu_ceil_div(s->m, m) * ct_cpu_ceil_div(s->n, n)), ob * 1e6,
           t[0][0] * 1e6, dn * 1e6, t[1][0] * 1e6, dn / ob,
           ct_cpu_gemm_lib_for(s->ta, s->tb, m, n, s->k) == CT_GEMM_ONEDNN ? "onednn" : "openblas");
    fflush(stdout);
    free(a);
    free(b);
    free(c);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 9;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_gemm_paths: rounds must be 1 to %d\n", MAX_ROUNDS);
        return 2;
    }
    ct_err err = {0};
    if (ct_cpu_blas_load(&err) || !ct_cpu_gemm_lib_loaded(CT_GEMM_ONEDNN)) {
        fprintf(stderr, "bench_gemm_paths: %s\n", err.msg[0] ? err.msg : "oneDNN (libdnnl.so.2) not installed");
        return 1;
    }
    for (int batch = 32; batch <= 512; batch *= 4) {
        int64_t B = batch;
        /* linear: y = x W^T (NT), dW = dy^T x (TN), dx = dy W (NN); conv: per image (cpu_conv.c) */
        const gemm_shape shapes[] = {
            {"mlp fc1 fwd", false, true, B, 512, 784, false},
            {"mlp fc2 fwd", false, true, B, 512, 512, false},
            {"mlp fc3 fwd", false, true, B, 10, 512, false},
            {"mlp fc1 dW", true, false, 512, 784, B, false},
            {"mlp fc2 dW", true, false, 512, 512, B, false},
            {"mlp fc3 dW", true, false, 10, 512, B, false},
            {"mlp fc2 dx", false, false, B, 512, 512, false},
            {"mlp fc3 dx", false, false, B, 512, 10, false},
            {"cnn conv1 fwd", false, false, 32, 784, 9, true},
            {"cnn conv2 fwd", false, false, 64, 196, 288, true},
            {"cnn conv1 dW", false, true, 32, 9, 784, true},
            {"cnn conv2 dW", false, true, 64, 288, 196, true},
            {"cnn conv2 dcol", true, false, 288, 196, 64, true},
            {"cnn fc1 fwd", false, true, B, 128, 3136, false},
            {"cnn fc1 dW", true, false, 128, 3136, B, false},
            {"cnn fc1 dx", false, false, B, 3136, 128, false},
            {"cnn fc2 fwd", false, true, B, 10, 128, false},
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (shapes[i].per_image && batch != 128) continue; /* the same call at every batch */
            bench_shape(&shapes[i], batch, rounds);
        }
    }
    return 0;
}

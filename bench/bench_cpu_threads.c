/* bench_cpu_threads.c: how the CPU backend should split cores between OpenBLAS and its own pool.
 *
 * Prints one JSON line per measurement: sgemm throughput on 1 and 2 OpenBLAS threads and with
 * the backend's pool tiles, whether 1- and 2-thread OpenBLAS agree bitwise, the CPU that
 * OpenBLAS's idle threads burn after a call, and an MLP step and a CNN conv block built from
 * backend ops under three schemes:
 *   serial     pool 1 thread, OpenBLAS 1 thread
 *   blas       pool 2 threads for element-wise ops, GEMM on OpenBLAS with 2 threads
 *   pool       pool 2 threads for everything, GEMM cut into tiles on the pool (the backend's)
 * Build (docs/BENCHMARKS.md, "CPU backend threading", has the numbers):
 *   make CUDA=0 BUILD=build-cpu build-cpu/libctrain.a
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. -I/usr/include/openblas bench/bench_cpu_threads.c \
 *      build-cpu/libctrain.a -lopenblas -lm -pthread -o build-cpu/bench_cpu_threads */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/util/rng.h"
#include "bench/bench_common.h"

/* GEMM through the backend, or straight to OpenBLAS (set by the scheme being measured). */
static bool g_direct_blas;

/* Best of `reps` timings of fn: the machine is shared, the minimum is the least disturbed. */
typedef void (*bench_fn)(void *ctx);
static double best_of(int reps, bench_fn fn, void *ctx) {
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = ct_now();
        fn(ctx);
        double t = ct_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* Process CPU seconds (all threads, user + system): shows threads that spin while idle. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

typedef struct {
    ct_backend *be;
    int64_t m, n, k;
    float *a, *b, *c;
} gemm_ctx;

static void step_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

static void run_gemm(void *p) {
    gemm_ctx *g = p;
    step_gemm(g->be, false, false, g->m, g->n, g->k, g->a, g->k, g->b, g->n, 0.0f, g->c, g->n);
}

static void bench_gemm(ct_backend *be) {
    const int64_t shapes[][3] = {{128, 512, 784}, {128, 512, 512}, {25088, 64, 288}, {64, 196, 288}};
    for (int s = 0; s < 4; s++) {
        gemm_ctx g = {be, shapes[s][0], shapes[s][1], shapes[s][2], NULL, NULL, NULL};
        g.a = rnd(g.m * g.k, 1);
        g.b = rnd(g.k * g.n, 2);
        g.c = rnd(g.m * g.n, 3);
        float *ref = malloc((size_t)(g.m * g.n) * 4);
        double ms[3];
        bool same[3];
        for (int v = 0; v < 3; v++) { /* OpenBLAS 1 thread, OpenBLAS 2 threads, pool tiles */
            g_direct_blas = v < 2;
            openblas_set_num_threads(v == 1 ? 2 : 1);
            run_gemm(&g);
            ms[v] = best_of(20, run_gemm, &g) * 1e3;
            if (v == 0) memcpy(ref, g.c, (size_t)(g.m * g.n) * 4);
            same[v] = memcmp(ref, g.c, (size_t)(g.m * g.n) * 4) == 0;
        }
        openblas_set_num_threads(1);
        double gf = 2.0 * g.m * g.n * g.k / 1e6;
        printf("{\"bench\": \"sgemm\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"blas1_ms\": %.4f, "
               "\"blas2_ms\": %.4f, \"pool2_tiles_ms\": %.4f, \"blas1_gflops\": %.1f, \"blas2_gflops\": %.1f, "
               "\"pool2_tiles_gflops\": %.1f, \"blas2_same_bits_as_blas1\": %s}\n",
               (long long)g.m, (long long)g.n, (long long)g.k, ms[0], ms[1], ms[2], gf / ms[0], gf / ms[1],
               gf / ms[2], same[1] ? "true" : "false");
        free(g.a), free(g.b), free(g.c), free(ref);
    }
}

/* CPU time OpenBLAS's worker threads burn while the caller sleeps 200 ms after a 2-thread GEMM. */
static void bench_idle_spin(ct_backend *be) {
    gemm_ctx g = {be, 512, 512, 512, rnd(512 * 512, 1), rnd(512 * 512, 2), rnd(512 * 512, 3)};
    struct timespec settle = {0, 300000000}, tick = {0, 10000000};
    for (int t = 1; t <= 2; t++) {
        g_direct_blas = true;
        openblas_set_num_threads(t);
        nanosleep(&settle, NULL); /* let threads still spinning from earlier calls go to sleep */
        run_gemm(&g);
        double c0 = cpu_seconds(), t0 = ct_now();
        while (ct_now() - t0 < 0.2) nanosleep(&tick, NULL);
        printf("{\"bench\": \"openblas_idle_cpu\", \"blas_threads\": %d, \"cpu_ms_in_200ms_idle\": %.1f}\n", t,
               (cpu_seconds() - c0) * 1e3);
    }
    openblas_set_num_threads(1);
    g_direct_blas = false;
    free(g.a), free(g.b), free(g.c);
}

/* GEMM as the step functions issue it: through the backend, or straight to OpenBLAS with its
 * own threads (the "blas" scheme). */
static void step_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (g_direct_blas)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m,
                    (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    else
        be->blas.gemm(be, ta, tb, m, n, k, 1.0f, a, CT_F32, lda, b, CT_F32, ldb, beta, c, CT_F32, ldc);
}

/* ---- MLP 784-512-512-10, batch 128: forward, backward, Adam ---- */
typedef struct {
    ct_backend *be;
    int64_t b, d[4];
    float *x, *w[3], *bias[3], *h[3], *dh[3], *dw[3], *db[3], *dx, *m, *v, *params, *grads;
    int32_t *labels;
    int64_t n_params;
} mlp_ctx;

static void mlp_init(mlp_ctx *c, ct_backend *be) {
    c->be = be;
    c->b = 128;
    const int64_t d[4] = {784, 512, 512, 10};
    for (int i = 0; i < 4; i++) c->d[i] = d[i];
    c->n_params = 0;
    for (int i = 0; i < 3; i++) c->n_params += d[i] * d[i + 1] + d[i + 1];
    c->params = rnd(c->n_params, 10);
    c->grads = rnd(c->n_params, 11);
    c->m = rnd(c->n_params, 12);
    c->v = rnd(c->n_params, 13);
    for (int64_t i = 0; i < c->n_params; i++) c->v[i] *= c->v[i];
    int64_t off = 0;
    for (int i = 0; i < 3; i++) {
        c->w[i] = c->params + off;
        c->dw[i] = c->grads + off;
        off += d[i] * d[i + 1];
        c->bias[i] = c->params + off;
        c->db[i] = c->grads + off;
        off += d[i + 1];
        c->h[i] = rnd(c->b * d[i + 1], 20 + i);
        c->dh[i] = rnd(c->b * d[i + 1], 30 + i);
    }
    c->x = rnd(c->b * d[0], 40);
    c->dx = rnd(c->b * d[0], 41);
    c->labels = malloc((size_t)c->b * 4);
    for (int64_t i = 0; i < c->b; i++) c->labels[i] = (int32_t)(i % 10);
}

static void mlp_step(void *p) {
    mlp_ctx *c = p;
    ct_backend *be = c->be;
    const float *in = c->x;
    for (int i = 0; i < 3; i++) {
        step_gemm(be, false, true, c->b, c->d[i + 1], c->d[i], in, c->d[i], c->w[i], c->d[i], 0.0f, c->h[i],
                  c->d[i + 1]);
        be->elt.bias_act_forward(be, c->h[i], c->bias[i], c->b, c->d[i + 1], 1, i < 2 ? CT_ACT_RELU : CT_ACT_NONE, 0,
                             CT_F32);
        in = c->h[i];
    }
    float loss[2];
    be->loss.softmax_xent(be, c->dh[2], loss, c->h[2], c->labels, c->b, 10, 10, 0.0f, 1.0f, CT_F32);
    be->mem.memset0(be, c->grads, (size_t)c->n_params * 4);
    for (int i = 2; i >= 0; i--) {
        const float *xin = i ? c->h[i - 1] : c->x;
        step_gemm(be, true, false, c->d[i + 1], c->d[i], c->b, c->dh[i], c->d[i + 1], xin, c->d[i], 1.0f,
                  c->dw[i], c->d[i]);
        be->elt.bias_backward(be, c->db[i], c->dh[i], c->b, c->d[i + 1], 1, CT_F32);
        float *dxin = i ? c->dh[i - 1] : c->dx;
        step_gemm(be, false, false, c->b, c->d[i], c->d[i + 1], c->dh[i], c->d[i + 1], c->w[i], c->d[i], 0.0f,
                  dxin, c->d[i]);
        if (i) be->elt.act_backward(be, dxin, dxin, NULL, c->h[i - 1], c->b * c->d[i], CT_ACT_RELU, 0, CT_F32);
    }
    (void)be->optim.sum_squares(be, c->grads, c->n_params);
    ct_adam_args a = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 0.001f, 1.0f, false};
    be->optim.adam_step(be, c->params, c->grads, c->m, c->v, c->n_params, &a);
}

/* ---- CNN conv block: [128, 32, 14, 14] -> conv 64 3x3 pad 1 (im2col + GEMM per image), relu,
 * maxpool 2, and its backward (GEMMs + col2im) ---- */
typedef struct {
    ct_backend *be;
    ct_conv2d_geom g;
    ct_pool2d_geom pg;
    float *x, *w, *col, *y, *dy, *dw, *dx, *pooled, *dpooled;
    int32_t *argmax;
} cnn_ctx;

static void cnn_init(cnn_ctx *c, ct_backend *be) {
    c->be = be;
    c->g = (ct_conv2d_geom){128, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 14, 14};
    c->pg = (ct_pool2d_geom){128, 64, 14, 14, 2, 2, 2, 2, 0, 0, 7, 7, true};
    c->x = rnd(128 * 32 * 196, 50);
    c->w = rnd(64 * 288, 51);
    c->dw = rnd(64 * 288, 52);
    c->col = rnd(288 * 196, 53);
    c->y = rnd(128 * 64 * 196, 54);
    c->dy = rnd(128 * 64 * 196, 55);
    c->dx = rnd(128 * 32 * 196, 56);
    c->pooled = rnd(128 * 64 * 49, 57);
    c->dpooled = rnd(128 * 64 * 49, 58);
    c->argmax = malloc(128 * 64 * 49 * 4);
}

static void cnn_step(void *p) {
    cnn_ctx *c = p;
    ct_backend *be = c->be;
    const int64_t in_sz = 32 * 196, out_sz = 64 * 196;
    for (int64_t i = 0; i < 128; i++) {
        be->conv.im2col(be, c->col, c->x + i * in_sz, &c->g, 0, CT_F32);
        step_gemm(be, false, false, 64, 196, 288, c->w, 288, c->col, 196, 0.0f, c->y + i * out_sz, 196);
    }
    be->elt.bias_act_forward(be, c->y, c->w, 128, 64, 196, CT_ACT_RELU, 0, CT_F32);
    be->conv.maxpool2d_forward(be, c->pooled, c->argmax, c->y, &c->pg, CT_F32);
    be->conv.maxpool2d_backward(be, c->dy, c->dpooled, c->argmax, &c->pg, CT_F32);
    be->elt.act_backward(be, c->dy, c->dy, NULL, c->y, 128 * out_sz, CT_ACT_RELU, 0, CT_F32);
    be->mem.memset0(be, c->dx, 128 * in_sz * 4);
    for (int64_t i = 0; i < 128; i++) {
        be->conv.im2col(be, c->col, c->x + i * in_sz, &c->g, 0, CT_F32);
        step_gemm(be, false, true, 64, 288, 196, c->dy + i * out_sz, 196, c->col, 196, 1.0f, c->dw, 288);
        step_gemm(be, true, false, 288, 196, 64, c->w, 288, c->dy + i * out_sz, 196, 0.0f, c->col, 196);
        be->conv.col2im(be, c->dx + i * in_sz, c->col, &c->g, 0, CT_F32);
    }
}

enum { REPS = 7, SCHEMES = 3 };

int main(void) {
    ct_backend *be2 = ct_cpu_backend_create(2);
    printf("{\"bench\": \"device\", \"desc\": \"%s\"}\n", be2->device_desc);
    bench_gemm(be2);
    bench_idle_spin(be2);
    /* interleaved rounds, so load from other processes on a shared machine falls on every scheme
     * alike; median and min over REPS rounds */
    const char *names[SCHEMES] = {"serial", "blas", "pool"};
    const int pool_threads[SCHEMES] = {1, 2, 2}, blas_threads[SCHEMES] = {1, 2, 1};
    ct_backend *bes[3] = {NULL, ct_cpu_backend_create(1), be2};
    mlp_ctx mlp[3];
    cnn_ctx cnn[3];
    for (int p = 1; p <= 2; p++) {
        mlp_init(&mlp[p], bes[p]);
        cnn_init(&cnn[p], bes[p]);
    }
    double t_mlp[SCHEMES][REPS], t_cnn[SCHEMES][REPS], cpu_mlp[SCHEMES][REPS], cpu_cnn[SCHEMES][REPS];
    for (int r = 0; r < REPS; r++)
        for (int s = 0; s < SCHEMES; s++) {
            int pool = pool_threads[s];
            /* OpenBLAS workers keep spinning ~150 ms after the "blas" scheme's last call: let them
             * stop so that they do not slow the next scheme down */
            struct timespec settle = {0, 300000000};
            nanosleep(&settle, NULL);
            g_direct_blas = blas_threads[s] > 1;
            openblas_set_num_threads(blas_threads[s]);
            mlp_step(&mlp[pool]);
            double c0 = cpu_seconds(), t0 = ct_now();
            for (int i = 0; i < 10; i++) mlp_step(&mlp[pool]);
            t_mlp[s][r] = (ct_now() - t0) / 10;
            cpu_mlp[s][r] = (cpu_seconds() - c0) / 10;
            c0 = cpu_seconds();
            t0 = ct_now();
            for (int i = 0; i < 2; i++) cnn_step(&cnn[pool]);
            t_cnn[s][r] = (ct_now() - t0) / 2;
            cpu_cnn[s][r] = (cpu_seconds() - c0) / 2;
        }
    openblas_set_num_threads(1);
    for (int s = 0; s < SCHEMES; s++) {
        double *rows[4] = {t_mlp[s], t_cnn[s], cpu_mlp[s], cpu_cnn[s]};
        for (int k = 0; k < 4; k++) qsort(rows[k], REPS, sizeof(double), cmp_double);
        printf("{\"bench\": \"step\", \"scheme\": \"%s\", \"pool_threads\": %d, \"blas_threads\": %d, "
               "\"mlp_ms_median\": %.3f, \"mlp_ms_min\": %.3f, \"mlp_cpu_ms\": %.3f, "
               "\"cnn_block_ms_median\": %.3f, \"cnn_block_ms_min\": %.3f, \"cnn_cpu_ms\": %.3f}\n",
               names[s], pool_threads[s], blas_threads[s], t_mlp[s][REPS / 2] * 1e3, t_mlp[s][0] * 1e3,
               cpu_mlp[s][REPS / 2] * 1e3, t_cnn[s][REPS / 2] * 1e3, t_cnn[s][0] * 1e3,
               cpu_cnn[s][REPS / 2] * 1e3);
    }
    ct_backend_destroy(bes[1]);
    ct_backend_destroy(be2);
    return 0;
}

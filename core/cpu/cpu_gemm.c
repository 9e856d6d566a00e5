/* cpu_gemm.c: GEMM through OpenBLAS's cblas_sgemm (row-major), run on the backend's pool.
 *
 * OpenBLAS is kept at one thread and a large GEMM is cut into fixed tiles (a block of rows or
 * columns of C, chosen from the shape alone) that pool workers compute with independent
 * single-threaded cblas_sgemm calls. Measured on the 2-core machine (docs/BENCHMARKS.md,
 * "CPU backend threading"): OpenBLAS's own threads give different bits for 1 and 2 threads
 * (K = 784), and after every call they spin in sched_yield for ~150 ms, taking a core from the
 * pool and the data loader. Fixed tiles give the same bits for any thread count and never spin.
 * This is not a nested pool: the tiles run on the pool, OpenBLAS itself never starts threads.
 *
 * Each single-threaded GEMM (a tile here, or one image's GEMM in cpu_conv.c) goes to OpenBLAS or,
 * where it is installed, oneDNN (cpu_onednn.c): ct_cpu_gemm_lib_for picks by the call's shape
 * class, from measurements on this machine (docs/BENCHMARKS.md, "oneDNN or OpenBLAS per
 * shape"). The choice depends on the shape and on which libraries loaded, never on the thread
 * count. CTRAIN_CPU_GEMM (auto, openblas, onednn) forces one library for every shape, for
 * comparisons and tests.
 *
 * 16-bit operands are widened to fp32 scratch first (fp32 accumulate, as on the GPU); a 16-bit C
 * is computed in fp32 and rounded once at the end. Where the CPU multiplies bf16 natively
 * (AVX512-BF16, AMX), bf16 x bf16 goes to oneDNN's bf16 matmul instead (cpu_onednn_bf16.c).
 *
 * OpenBLAS is loaded with dlopen on first use, not linked: a linked OpenBLAS (pthreads build)
 * starts a thread per core in its constructor, before main, and raises SIGINT when one cannot be
 * made (a low ulimit -v or -u), so ctrain would exit 130 as if interrupted before it could say
 * why. Loaded here after the CLI set OPENBLAS_NUM_THREADS=1 it starts none, a failure to load is
 * an error message, and commands that do no arithmetic (config, info) never load it. */
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

/* Tiling. A tile repacks the operand it does not split (A for column tiles, B for row tiles):
 * neither library lets a caller pack an operand once and share it, so every tile past the first
 * packs it again. That measured ~12/edge of the tile's own time (16 tiles of 32 columns: +40% CPU
 * for 128x512x784), so tiles keep an edge of at least MIN_EDGE, carry at least TILE_MACS
 * multiply-adds, split C along its longer side (the operand repacked is then the smaller one) and
 * come in powers of two so that 2 or 4 threads share them evenly. At most 4: 8 tiles took 10% more
 * CPU than 4 for the MLP's first weight gradient (512x784x512, 8 tiles of 104 columns), about 2%
 * of the MLP's GEMM time at batch 128 and 512 (docs/BENCHMARKS.md, "GEMM tiles and the MLP's
 * step"), and 4 tiles still give 2 threads two pieces each. */
#define TILE_MACS (1 << 20)
#define MIN_EDGE 96
#define MAX_TILES 4
#define TILE_ALIGN 8

/* The entry points ctrain uses, filled once by blas_load and read-only afterwards. */
typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
                         const enum CBLAS_TRANSPOSE, const blasint, const blasint, const blasint,
                         const float, const float *, const blasint, const float *, const blasint,
                         const float, float *, const blasint);
typedef struct blas_lib {
    sgemm_fn sgemm;
    void (*set_num_threads)(int);
    char *(*get_config)(void);
    bool onednn;                 /* oneDNN loaded too (cpu_onednn.c) */
    int forced;                  /* CTRAIN_CPU_GEMM: -1 auto, else the ct_gemm_lib every GEMM takes */
    char desc[160];              /* "OpenBLAS ... + oneDNN 2.6.3": the backend's device line */
    char error[512];             /* why it could not be loaded; "" when loaded */
} blas_lib;

static blas_lib g_blas;
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;

/* After OpenBLAS loaded: what CTRAIN_CPU_GEMM asks for (an error in g_blas when it names no
 * library, or oneDNN where it is not installed), and oneDNN unless OpenBLAS alone is asked for
 * (loading it costs about 8 MB of resident memory, docs/BENCHMARKS.md). */
static void gemm_libs_choose(void) {
    const char *want = getenv("CTRAIN_CPU_GEMM");
    g_blas.forced = -1;
    if (want && *want && strcmp(want, "auto") != 0) {
        if (!strcmp(want, "openblas"))
            g_blas.forced = CT_GEMM_OPENBLAS;
        else if (!strcmp(want, "onednn"))
            g_blas.forced = CT_GEMM_ONEDNN;
        else
            snprintf(g_blas.error, sizeof g_blas.error, "environment variable CTRAIN_CPU_GEMM=\"%.40s\" "
                     "names no GEMM library\n  Use auto (the default: per shape), openblas or onednn", want);
    }
    const char *bf16 = getenv("CTRAIN_CPU_BF16");   /* read by cpu_onednn_bf16.c */
    if (bf16 && *bf16 && strcmp(bf16, "auto") != 0 && strcmp(bf16, "widen") != 0 && strcmp(bf16, "emulate") != 0)
        snprintf(g_blas.error, sizeof g_blas.error, "environment variable CTRAIN_CPU_BF16=\"%.40s\" "
                 "is not a choice\n  Use auto (the default: native bf16 products where the CPU has "
                 "them), widen (always fp32) or emulate (the native path's arithmetic in C, for tests)", bf16);
    g_blas.onednn = g_blas.forced != CT_GEMM_OPENBLAS && ct_cpu_onednn_load();
    if (g_blas.forced == CT_GEMM_ONEDNN && !g_blas.onednn)
        snprintf(g_blas.error, sizeof g_blas.error, "CTRAIN_CPU_GEMM=onednn, but oneDNN cannot be "
                 "loaded (libdnnl.so.2)\n  Install it (apt-get install libdnnl2), or unset "
                 "CTRAIN_CPU_GEMM to use OpenBLAS alone");
    const char *ob = g_blas.get_config ? g_blas.get_config() : "OpenBLAS";
    snprintf(g_blas.desc, sizeof g_blas.desc, "%s%s%s", ob, g_blas.onednn ? " + " : "",
             g_blas.onednn ? ct_cpu_onednn_desc() : "");
}

static void blas_load(void) {
    /* Debian's libopenblas.so.0 is the alternatives link to the installed build; the bundle puts
     * a copy in lib/ beside ctrain, found through the executable's rpath. */
    static const char *const names[] = {"libopenblas.so.0", "libopenblas.so"};
    void *h = NULL;
    char why[320] = "not found";
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        const char *e = h ? NULL : dlerror();   /* the first name's reason is the one that counts */
        if (i == 0 && e) snprintf(why, sizeof why, "%s", e);
    }
    if (!h) {
        bool missing = strstr(why, "No such file") || !strcmp(why, "not found");
        snprintf(g_blas.error, sizeof g_blas.error, "cannot load OpenBLAS: %s\n  %s", why, missing
                 ? "Install it: make deps, or apt-get install libopenblas0"
                 : "It is installed: a process limit is the likely cause (ulimit -v for memory, "
                   "ulimit -n for open files)");
        return;
    }
    *(void **)&g_blas.sgemm = dlsym(h, "cblas_sgemm");
    *(void **)&g_blas.set_num_threads = dlsym(h, "openblas_set_num_threads");
    *(void **)&g_blas.get_config = dlsym(h, "openblas_get_config");
    if (!g_blas.sgemm || !g_blas.set_num_threads) {
        snprintf(g_blas.error, sizeof g_blas.error, "the OpenBLAS loaded (libopenblas.so.0) lacks "
                 "cblas_sgemm or openblas_set_num_threads; install Debian's libopenblas0");
        return;
    }
    g_blas.set_num_threads(1);
    gemm_libs_choose();
}

int ct_cpu_blas_load(ct_err *err) {
    pthread_once(&g_blas_once, blas_load);
    return g_blas.error[0] ? ct_errf(err, CT_ERR_RUNTIME, "%s", g_blas.error) : CT_OK;
}

const char *ct_cpu_blas_config(void) {
    return g_blas.desc[0] ? g_blas.desc : NULL;
}

bool ct_cpu_gemm_lib_loaded(ct_gemm_lib lib) {
    return lib == CT_GEMM_OPENBLAS ? g_blas.sgemm != NULL : g_blas.onednn;
}

/* The library for one single-threaded GEMM, from its shape class. Measured on the 2-core AMD EPYC
 * (AVX2) with bench/bench_gemm_paths.c, in CPU time per call (docs/BENCHMARKS.md, "oneDNN or
 * OpenBLAS per shape"): oneDNN was 10-60% faster on every call of the Fashion-MNIST MLP and CNN
 * but two kinds, where OpenBLAS was 10-25% faster:
 * - A transposed with a long inner dimension (a linear layer's dW = dy^T x at batch >= 128:
 *   [512 x 104 x 128] 1.12x, [128 x 512 x 128] 1.18x); with a short side (fc3's 10 rows) or a
 *   short k (batch 32, a convolution's dcol with k = 64) oneDNN wins again (0.47-0.83x);
 * - NN with both n and k >= 512 ([128 x 512 x 512], dx of a 512-wide layer at batch 512: 1.26x). */
static bool onednn_faster(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
    if (ta && !tb && k >= 128 && m >= 64 && n >= 64) return false;
    if (!ta && !tb && n >= 512 && k >= 512) return false;
    return true;
}

ct_gemm_lib ct_cpu_gemm_lib_for(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
    if (g_blas.forced >= 0) return (ct_gemm_lib)g_blas.forced;
    if (!g_blas.onednn) return CT_GEMM_OPENBLAS;
    return onednn_faster(ta, tb, m, n, k) ? CT_GEMM_ONEDNN : CT_GEMM_OPENBLAS;
}

void ct_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    ct_cpu_sgemm_with(ct_cpu_gemm_lib_for(ta, tb, m, n, k), ta, tb, m, n, k, alpha, a, lda, b, ldb,
                      beta, c, ldc);
}

void ct_cpu_sgemm_with(ct_gemm_lib lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                       float beta, float *c, int64_t ldc) {
    if (lib == CT_GEMM_ONEDNN) {
        ct_cpu_onednn_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    g_blas.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                 (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb,
                 beta, c, (blasint)ldc);
}

/* OpenBLAS's per-thread GEMM buffer: Debian's 0.3.21 maps 128 MiB (BUFFER_SIZE) in
 * blas_memory_alloc for each calling thread (seen with gdb in a run under ulimit -v). */
#define CT_CPU_BLAS_BUFFER ((size_t)128 << 20)

size_t ct_cpu_backend_reserved_bytes(int threads) {
    /* threads - 1 pool workers and the calling thread */
    return (size_t)ct_cpu_threads_for(threads) * CT_CPU_BLAS_BUFFER;
}

typedef struct {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} gemm_job;

static void gemm_tiles(void *ctx, int64_t t0, int64_t t1) {
    gemm_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        ct_gemm_tile tl = ct_cpu_gemm_tile_at(j->ta, j->tb, j->m, j->n, j->k, j->lda, j->ldb, j->ldc, t);
        ct_cpu_sgemm(j->ta, j->tb, tl.m, tl.n, j->k, j->alpha, j->a + tl.a, j->lda, j->b + tl.b, j->ldb, j->beta,
                     j->c + tl.c, j->ldc);
    }
}

/* Number of tiles for an m x n x k GEMM along its longer side of C: from the shape alone. */
static int64_t tile_count(int64_t m, int64_t n, int64_t k) {
    int64_t edge = m >= n ? m : n;
    int64_t limit = (m * n * k) / TILE_MACS;
    if (limit > edge / MIN_EDGE) limit = edge / MIN_EDGE;
    int64_t tiles = 1;
    while (tiles * 2 <= limit && tiles * 2 <= MAX_TILES) tiles *= 2;
    return tiles;
}

/* Rows (m >= n: C is split by rows) or columns of C per tile: from the shape alone. */
static int64_t tile_edge(int64_t m, int64_t n, int64_t k) {
    int64_t edge = m >= n ? m : n;
    return ct_cpu_ceil_div(ct_cpu_ceil_div(edge, tile_count(m, n, k)), TILE_ALIGN) * TILE_ALIGN;
}

int64_t ct_cpu_gemm_tiles(int64_t m, int64_t n, int64_t k) {
    return ct_cpu_ceil_div(m >= n ? m : n, tile_edge(m, n, k));
}

ct_gemm_tile ct_cpu_gemm_tile_at(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                 int64_t ldc, int64_t t) {
    int64_t edge = tile_edge(m, n, k), lo = t * edge, total = m >= n ? m : n;
    int64_t hi = lo + edge < total ? lo + edge : total;
    if (m >= n)   /* rows lo..hi of op(A) and C */
        return (ct_gemm_tile){.m = hi - lo, .n = n, .a = ta ? lo : lo * lda, .b = 0, .c = lo * ldc};
    /* columns lo..hi of op(B) and C */
    return (ct_gemm_tile){.m = m, .n = hi - lo, .a = 0, .b = tb ? lo * ldb : lo, .c = lo};
}

void ct_cpu_gemm_tile_shape(int64_t m, int64_t n, int64_t k, int64_t *tile_m, int64_t *tile_n) {
    ct_gemm_tile first = ct_cpu_gemm_tile_at(false, false, m, n, k, 0, 0, 0, 0);
    *tile_m = first.m;
    *tile_n = first.n;
}

/* fp32 GEMM: the tiling depends on (m, n, k) only, never on the thread count. */
static void sgemm_tiled(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc) {
    gemm_job j = {ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    ct_cpu_parallel(ct_cpu_pool_of(be), ct_cpu_gemm_tiles(m, n, k), 1, gemm_tiles, &j);
}

/* Rows x cols of a row-major matrix with leading dimension ld, as dense fp32 [rows, cols] in
 * scratch slot s (one cast over the pool when the rows are contiguous). */
static float *widen(ct_backend *be, int s, const void *x, ct_dtype dt, int64_t rows, int64_t cols,
                    int64_t ld) {
    float *w = ct_cpu_scratch(be, s, rows * cols);
    if (ld == cols) {
        be->elt.cast(be, w, CT_F32, x, dt, rows * cols);
        return w;
    }
    for (int64_t r = 0; r < rows; r++) {
        const char *row = (const char *)x + (size_t)(r * ld) * ct_dtype_size(dt);
        be->elt.cast(be, w + r * cols, CT_F32, row, dt, cols);
    }
    return w;
}

static void narrow(ct_backend *be, void *y, ct_dtype dt, const float *w, int64_t rows, int64_t cols,
                   int64_t ld) {
    if (ld == cols) {
        be->elt.cast(be, y, dt, w, CT_F32, rows * cols);
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        char *row = (char *)y + (size_t)(r * ld) * ct_dtype_size(dt);
        be->elt.cast(be, row, dt, w + r * cols, CT_F32, cols);
    }
}

static void cpu_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const void *a, ct_dtype a_dt, int64_t lda, const void *b, ct_dtype b_dt,
                     int64_t ldb, float beta, void *c, ct_dtype c_dt, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    float *cw = NULL;
    const float *af = a, *bf = b;
    float *cf = c;
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    /* bf16 times bf16 on a CPU that multiplies bf16: no widening (cpu_onednn_bf16.c) */
    bool native = a_dt == CT_BF16 && b_dt == CT_BF16 && k > 0 && ct_cpu_bf16_native();
    if (a_dt != CT_F32 && !native) {
        af = widen(be, 0, a, a_dt, a_rows, a_cols, lda);
        lda = a_cols;
    }
    if (b_dt != CT_F32 && !native) {
        bf = widen(be, 1, b, b_dt, b_rows, b_cols, ldb);
        ldb = b_cols;
    }
    int64_t ldc_f = ldc;
    if (c_dt != CT_F32) {
        /* beta == 0: C is only written (BLAS does not read it then), so it need not be widened */
        cf = cw = beta != 0.0f ? widen(be, 2, c, c_dt, m, n, ldc) : ct_cpu_scratch(be, 2, m * n);
        ldc_f = n;
    }
    if (k <= 0) {
        /* BLAS leaves C untouched when alpha*AB vanishes only for beta == 1; do it explicitly */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) cf[i * ldc_f + j] = beta == 0.0f ? 0.0f : beta * cf[i * ldc_f + j];
    } else if (native) {
        ct_cpu_bf16_gemm(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cf, ldc_f);
    } else {
        sgemm_tiled(be, ta, tb, m, n, k, alpha, af, lda, bf, ldb, beta, cf, ldc_f);
    }
    if (cw) narrow(be, c, c_dt, cw, m, n, ldc);
}

typedef struct {
    gemm_job g;
    int64_t sa, sb, sc;
} batch_job;

/* Batch items [i0, i1): one single-threaded GEMM each. */
static void gemm_batch_items(void *ctx, int64_t i0, int64_t i1) {
    const batch_job *j = ctx;
    const gemm_job *g = &j->g;
    for (int64_t i = i0; i < i1; i++)
        ct_cpu_sgemm(g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->a + i * j->sa, g->lda, g->b + i * j->sb, g->ldb,
                     g->beta, g->c + i * j->sc, g->ldc);
}

static void cpu_gemm_batched(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                             float alpha, const float *a, int64_t lda, int64_t sa, const float *b,
                             int64_t ldb, int64_t sb, float beta, float *c, int64_t ldc, int64_t sc,
                             int64_t batch) {
    if (m <= 0 || n <= 0 || batch <= 0) return;
    if (k <= 0 || tile_count(m, n, k) > 1) {
        /* each GEMM is big enough to be tiled by itself */
        for (int64_t i = 0; i < batch; i++)
            cpu_gemm(be, ta, tb, m, n, k, alpha, a + i * sa, CT_F32, lda, b + i * sb, CT_F32, ldb,
                     beta, c + i * sc, CT_F32, ldc);
        return;
    }
    /* small GEMMs (attention heads): the batch items themselves are the parallel work */
    batch_job j = {{ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c}, sa, sb, sc};
    ct_cpu_parallel(ct_cpu_pool_of(be), batch, ct_cpu_ceil_div(TILE_MACS, m * n * k), gemm_batch_items, &j);
}

void ct_cpu_gemm_install(ct_backend *be) {
    be->blas.gemm = cpu_gemm;
    be->blas.gemm_batched = cpu_gemm_batched;
}

/* cpu_onednn_bf16.c: bf16 x bf16 GEMMs computed as bf16 on the CPUs that multiply bf16 natively
 * (AVX512-BF16, AMX-BF16), through oneDNN's matmul primitive (libdnnl.so.2, loaded by
 * cpu_onednn.c).
 *
 * Why: without it a 16-bit run on the CPU widens both operands to fp32 scratch and calls the fp32
 * GEMM (cpu_gemm.c), so bf16 costs fp32's GEMM plus the casts and runs slower than fp32 (issue 18;
 * docs/BENCHMARKS.md). AVX512-BF16's vdpbf16ps adds two bf16 products into each fp32 lane per
 * instruction and AMX multiplies whole tiles, from operands half the size: that is where PyTorch's
 * bf16 autocast gets its 2x over fp32 on such CPUs.
 *
 * Results: the product of two bf16 numbers is exact in fp32 either way. What differs from the
 * widened fp32 GEMM is the order of the fp32 sums (the kernels add products in pairs) and, with
 * these instructions, denormal operands and results flushed to zero. So a bf16 run on such a CPU
 * does not give the bits of one on a CPU without it, as a GPU's does not either; the difference is
 * that of two fp32 summation orders (docs/DESIGN-NOTES.md, "bf16 on the CPU"). On one CPU the
 * bits do not depend on the thread count: the tiles are cpu_gemm.c's (ct_cpu_gemm_tile_at,
 * from the shape alone), each computed by one primitive on one thread.
 *
 * When: ct_cpu_bf16_native() holds when oneDNN loaded, the CPU reports AVX512-BF16 or AMX-BF16
 * (cpuid), oneDNN makes a bf16 matmul with code generated for it (not its reference loops), and a
 * check GEMM on random values agrees with an fp64 reference. CTRAIN_CPU_BF16=widen turns it off
 * (cpu_gemm.c rejects values other than auto, widen and emulate), and so does CTRAIN_CPU_GEMM=openblas
 * (every product on OpenBLAS: test/e2e_bitwise.sh's recorded hashes hold on any CPU). Debian's oneDNN 2.6 has no bf16 matmul
 * below AVX-512 at all: on this project's 2-core AVX2 machine it is never taken, and nothing here
 * has run yet (docs/BENCHMARKS.md says what is measured where). CTRAIN_CPU_BF16=emulate takes
 * this path on any CPU with the instructions' arithmetic written out in C instead of oneDNN
 * (cpu_bf16_emulate.c), so that the tests' expectations of it run everywhere.
 *
 * Primitives: creating one generates code for a shape (tens of microseconds to milliseconds), so
 * each thread keeps the primitives of the shapes it ran in a small cache of its own, with its own
 * stream, memory objects and scratchpad (scratchpad mode "user": nothing oneDNN holds is shared
 * between threads but the engine). A thread's cache is freed when the thread ends.
 *
 * The same code runs fp32 operands too (ct_cpu_onednn_matmul_f32), which oneDNN implements on
 * every x86-64 CPU: test_cpu_ops uses it to run the primitive cache, the strides, alpha and beta
 * and the tiles here, where the bf16 path itself cannot run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"
#include "core/util/common.h"

#if defined(__has_include)
#if __has_include(<oneapi/dnnl/dnnl.h>)
#define CT_HAVE_DNNL_H 1
#endif
#endif

#ifndef CT_HAVE_DNNL_H

/* Native only as the emulation (CTRAIN_CPU_BF16=emulate, cpu_bf16_emulate.c). */
bool ct_cpu_bf16_native(void) { return ct_cpu_bf16_emulation() != NULL; }
const char *ct_cpu_bf16_note(void) {
    const char *emulated = ct_cpu_bf16_emulation();
    return emulated ? emulated : "bf16 is computed in fp32 on the CPU (this ctrain was built without oneDNN's "
                                 "headers, libdnnl-dev): 16-bit storage saves memory, not time";
}
void ct_cpu_bf16_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                      int64_t ldc) {
    /* called only when ct_cpu_bf16_native(): emulated */
    ct_cpu_bf16_gemm_emulated(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
bool ct_cpu_onednn_matmul_f32(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                              int64_t ldc) {
    (void)be, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b;
    (void)ldb, (void)beta, (void)c, (void)ldc;
    return false;
}

#else

#include <cpuid.h>
#include <math.h>
#include <pthread.h>

#include <oneapi/dnnl/dnnl.h>

/* The entry points, filled once by bf16_load and read-only afterwards (the header gives their
 * types; the library is loaded with dlopen, never linked). */
typedef struct bf16_lib {
    __typeof__(dnnl_engine_create) *engine_create;
    __typeof__(dnnl_stream_create) *stream_create;
    __typeof__(dnnl_stream_destroy) *stream_destroy;
    __typeof__(dnnl_stream_wait) *stream_wait;
    __typeof__(dnnl_memory_desc_init_by_strides) *md_init;
    __typeof__(dnnl_memory_desc_get_size) *md_size;
    __typeof__(dnnl_matmul_desc_init) *matmul_desc_init;
    __typeof__(dnnl_primitive_attr_create) *attr_create;
    __typeof__(dnnl_primitive_attr_destroy) *attr_destroy;
    __typeof__(dnnl_primitive_attr_set_scratchpad_mode) *attr_scratchpad;
    __typeof__(dnnl_primitive_attr_set_output_scales) *attr_scales;
    __typeof__(dnnl_primitive_attr_set_post_ops) *attr_post_ops;
    __typeof__(dnnl_post_ops_create) *post_ops_create;
    __typeof__(dnnl_post_ops_destroy) *post_ops_destroy;
    __typeof__(dnnl_post_ops_append_sum) *post_ops_sum;
    __typeof__(dnnl_primitive_desc_create) *pd_create;
    __typeof__(dnnl_primitive_desc_destroy) *pd_destroy;
    __typeof__(dnnl_primitive_desc_query) *pd_query;
    __typeof__(dnnl_primitive_desc_query_md) *pd_query_md;
    __typeof__(dnnl_primitive_create) *prim_create;
    __typeof__(dnnl_primitive_destroy) *prim_destroy;
    __typeof__(dnnl_primitive_execute) *prim_execute;
    __typeof__(dnnl_memory_create) *mem_create;
    __typeof__(dnnl_memory_set_data_handle) *mem_set;
    __typeof__(dnnl_memory_destroy) *mem_destroy;

    dnnl_engine_t engine;        /* the CPU engine, shared by every thread (oneDNN allows it) */
    pthread_key_t cache_key;     /* each thread's primitive cache */
    bool ready;                  /* the above are set (matmul_load) */
    bool native;
    char impl[64];               /* the implementation oneDNN chose for the check GEMM */
    char note[320];              /* the start block's line: native and how, or why widened */
} bf16_lib;

static bf16_lib g_bf;
static pthread_once_t g_bf_once = PTHREAD_ONCE_INIT;

/* ---- one thread's primitives ---- */

#define CACHE_SLOTS 32

typedef struct shape_key {
    bool f32;                    /* fp32 operands instead of bf16 (the test's path, see below) */
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
} shape_key;

typedef struct compiled {
    shape_key key;
    uint64_t last_use;           /* the thread's clock at its last call: the oldest goes first */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
    void *scratch_buf;
} compiled;

typedef struct thread_cache {
    dnnl_stream_t stream;
    uint64_t clock;
    int n;
    compiled slot[CACHE_SLOTS];
} thread_cache;

static bool same_shape(const shape_key *x, const shape_key *y) {
    return x->f32 == y->f32 && x->ta == y->ta && x->tb == y->tb && x->m == y->m && x->n == y->n && x->k == y->k &&
           x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc && x->alpha == y->alpha && x->beta == y->beta;
}

static void compiled_free(compiled *e) {
    if (e->prim) g_bf.prim_destroy(e->prim);
    dnnl_memory_t *mems[] = {&e->a, &e->b, &e->c, &e->scratch};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        if (*mems[i]) g_bf.mem_destroy(*mems[i]);
    free(e->scratch_buf);
    memset(e, 0, sizeof *e);
}

static void cache_free(void *p) {
    thread_cache *tc = p;
    for (int i = 0; i < tc->n; i++) compiled_free(&tc->slot[i]);
    if (tc->stream) g_bf.stream_destroy(tc->stream);
    free(tc);
}

static thread_cache *my_cache(void) {
    thread_cache *tc = pthread_getspecific(g_bf.cache_key);
    if (tc) return tc;
    tc = calloc(1, sizeof *tc);
    if (!tc) return NULL;
    if (g_bf.stream_create(&tc->stream, g_bf.engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(g_bf.cache_key, tc) != 0) {
        cache_free(tc);
        return NULL;
    }
    return tc;
}

/* Row-major [rows, cols] with leading dimension ld, or its transpose when t (stored [cols, rows]). */
static dnnl_status_t matrix_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, bool t,
                               dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols}, strides = {t ? 1 : ld, t ? ld : 1};
    return g_bf.md_init(md, 2, dims, dt, strides);
}

/* The primitive for C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C with A, B bf16 (or fp32) and C fp32:
 * A is the matmul's source, B its weights; alpha an output scale and beta a sum post-op. impl
 * (optional) gets the implementation's name. False when oneDNN cannot make it. */
static bool compile(compiled *e, const shape_key *k, char *impl, size_t impl_n) {
    memset(e, 0, sizeof *e);
    e->key = *k;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_matmul_desc_t op;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_data_type_t dt = k->f32 ? dnnl_f32 : dnnl_bf16;
    bool ok = matrix_md(&a_md, k->m, k->k, k->lda, k->ta, dt) == dnnl_success &&
              matrix_md(&b_md, k->k, k->n, k->ldb, k->tb, dt) == dnnl_success &&
              matrix_md(&c_md, k->m, k->n, k->ldc, false, dnnl_f32) == dnnl_success &&
              g_bf.matmul_desc_init(&op, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
              g_bf.attr_create(&attr) == dnnl_success &&
              g_bf.attr_scratchpad(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && k->alpha != 1.0f) ok = g_bf.attr_scales(attr, 1, 0, &k->alpha) == dnnl_success;
    if (ok && k->beta != 0.0f)
        ok = g_bf.post_ops_create(&po) == dnnl_success && g_bf.post_ops_sum(po, k->beta) == dnnl_success &&
             g_bf.attr_post_ops(attr, po) == dnnl_success;
    ok = ok && g_bf.pd_create(&pd, &op, attr, g_bf.engine, NULL) == dnnl_success;
    const char *name = NULL;
    if (ok && g_bf.pd_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name && impl)
        snprintf(impl, impl_n, "%s", name);
    /* the reference loops are correct and slow: widening beats them */
    ok = ok && name && strncmp(name, "ref", 3) != 0;
    const dnnl_memory_desc_t *s_md = ok ? g_bf.pd_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    size_t s_bytes = s_md ? g_bf.md_size(s_md) : 0;
    if (ok && s_bytes > 0) ok = (e->scratch_buf = malloc(s_bytes)) != NULL;
    ok = ok && g_bf.prim_create(&e->prim, pd) == dnnl_success &&
         g_bf.mem_create(&e->a, &a_md, g_bf.engine, DNNL_MEMORY_NONE) == dnnl_success &&
         g_bf.mem_create(&e->b, &b_md, g_bf.engine, DNNL_MEMORY_NONE) == dnnl_success &&
         g_bf.mem_create(&e->c, &c_md, g_bf.engine, DNNL_MEMORY_NONE) == dnnl_success &&
         (!s_md || s_bytes == 0 || g_bf.mem_create(&e->scratch, s_md, g_bf.engine, e->scratch_buf) == dnnl_success);
    if (pd) g_bf.pd_destroy(pd);
    if (po) g_bf.post_ops_destroy(po);
    if (attr) g_bf.attr_destroy(attr);
    if (!ok) compiled_free(e);
    return ok;
}

/* This thread's primitive for the shape, made on first use; NULL when oneDNN cannot make it. */
static compiled *lookup(thread_cache *tc, const shape_key *k) {
    tc->clock++;
    for (int i = 0; i < tc->n; i++)
        if (same_shape(&tc->slot[i].key, k)) {
            tc->slot[i].last_use = tc->clock;
            return &tc->slot[i];
        }
    if (tc->n == CACHE_SLOTS) {   /* full: the least recently used one goes, the last takes its place */
        int lru = 0;
        for (int i = 1; i < CACHE_SLOTS; i++)
            if (tc->slot[i].last_use < tc->slot[lru].last_use) lru = i;
        compiled_free(&tc->slot[lru]);
        tc->slot[lru] = tc->slot[--tc->n];
        memset(&tc->slot[tc->n], 0, sizeof tc->slot[0]);
    }
    compiled *e = &tc->slot[tc->n];
    if (!compile(e, k, NULL, 0)) return NULL;   /* e is left empty */
    e->last_use = tc->clock;
    tc->n++;
    return e;
}

static bool run(thread_cache *tc, compiled *e, const void *a, const void *b, float *c) {
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_SCRATCHPAD, e->scratch}};
    sigset_t old;
    ct_cpu_onednn_enter(&old);
    bool ok = g_bf.mem_set(e->a, (void *)a) == dnnl_success && g_bf.mem_set(e->b, (void *)b) == dnnl_success &&
              g_bf.mem_set(e->c, c) == dnnl_success &&
              g_bf.prim_execute(e->prim, tc->stream, e->scratch ? 4 : 3, args) == dnnl_success &&
              g_bf.stream_wait(tc->stream) == dnnl_success;
    ct_cpu_onednn_leave(&old);
    return ok;
}

/* A tile oneDNN could not take (it failed to make or run its primitive: out of memory): widened
 * to fp32 and computed by the fp32 GEMM, on this thread. Its bits then differ from the native
 * ones; this happens only when an allocation inside oneDNN fails. */
static void tile_widened(const shape_key *k, const void *a, const void *b, float *c) {
    if (k->f32) {
        ct_cpu_sgemm(k->ta, k->tb, k->m, k->n, k->k, k->alpha, a, k->lda, b, k->ldb, k->beta, c, k->ldc);
        return;
    }
    const uint16_t *a16 = a, *b16 = b;
    int64_t a_rows = k->ta ? k->k : k->m, a_cols = k->ta ? k->m : k->k;
    int64_t b_rows = k->tb ? k->n : k->k, b_cols = k->tb ? k->k : k->n;
    float *af = ct_xmalloc(sizeof(float) * (size_t)(a_rows * a_cols));
    float *bf = ct_xmalloc(sizeof(float) * (size_t)(b_rows * b_cols));
    for (int64_t r = 0; r < a_rows; r++) ct_cpu_cast_range(af + r * a_cols, CT_F32, a16 + r * k->lda, CT_BF16, 0, a_cols);
    for (int64_t r = 0; r < b_rows; r++) ct_cpu_cast_range(bf + r * b_cols, CT_F32, b16 + r * k->ldb, CT_BF16, 0, b_cols);
    ct_cpu_sgemm(k->ta, k->tb, k->m, k->n, k->k, k->alpha, af, a_cols, bf, b_cols, k->beta, c, k->ldc);
    free(af), free(bf);
}

static bool matmul_ready(void);

/* ---- the tiles over the pool ---- */

typedef struct bf16_job {
    shape_key whole;
    const char *a, *b;           /* bytes: the element size is the key's */
    float *c;
} bf16_job;

static void bf16_tiles(void *ctx, int64_t t0, int64_t t1) {
    const bf16_job *j = ctx;
    const shape_key *w = &j->whole;
    size_t es = w->f32 ? sizeof(float) : sizeof(uint16_t);
    thread_cache *tc = my_cache();
    for (int64_t t = t0; t < t1; t++) {
        ct_gemm_tile tl = ct_cpu_gemm_tile_at(w->ta, w->tb, w->m, w->n, w->k, w->lda, w->ldb, w->ldc, t);
        shape_key k = *w;
        k.m = tl.m, k.n = tl.n;
        const char *a = j->a + (size_t)tl.a * es, *b = j->b + (size_t)tl.b * es;
        float *c = j->c + tl.c;
        compiled *e = tc ? lookup(tc, &k) : NULL;
        if (!e || !run(tc, e, a, b, c)) tile_widened(&k, a, b, c);
    }
}

static void matmul_tiled(ct_backend *be, bool f32, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    bf16_job j = {{f32, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta}, a, b, c};
    ct_cpu_parallel(ct_cpu_pool_of(be), ct_cpu_gemm_tiles(m, n, k), 1, bf16_tiles, &j);
}

void ct_cpu_bf16_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                      int64_t ldc) {
    if (ct_cpu_bf16_emulation())
        ct_cpu_bf16_gemm_emulated(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        matmul_tiled(be, false, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool ct_cpu_onednn_matmul_f32(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                              int64_t ldc) {
    if (!matmul_ready()) return false;
    matmul_tiled(be, true, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return true;
}

/* ---- deciding, once ---- */

static bool cpu_multiplies_bf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    bool amx_bf16 = d & (1u << 22);
    unsigned leaves = a;
    bool avx512_bf16 = leaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
    return amx_bf16 || avx512_bf16;
}

static bool load_symbols(void) {
    struct { void **fn; const char *name; } want[] = {
        {(void **)&g_bf.engine_create, "dnnl_engine_create"},
        {(void **)&g_bf.stream_create, "dnnl_stream_create"},
        {(void **)&g_bf.stream_destroy, "dnnl_stream_destroy"},
        {(void **)&g_bf.stream_wait, "dnnl_stream_wait"},
        {(void **)&g_bf.md_init, "dnnl_memory_desc_init_by_strides"},
        {(void **)&g_bf.md_size, "dnnl_memory_desc_get_size"},
        {(void **)&g_bf.matmul_desc_init, "dnnl_matmul_desc_init"},
        {(void **)&g_bf.attr_create, "dnnl_primitive_attr_create"},
        {(void **)&g_bf.attr_destroy, "dnnl_primitive_attr_destroy"},
        {(void **)&g_bf.attr_scratchpad, "dnnl_primitive_attr_set_scratchpad_mode"},
        {(void **)&g_bf.attr_scales, "dnnl_primitive_attr_set_output_scales"},
        {(void **)&g_bf.attr_post_ops, "dnnl_primitive_attr_set_post_ops"},
        {(void **)&g_bf.post_ops_create, "dnnl_post_ops_create"},
        {(void **)&g_bf.post_ops_destroy, "dnnl_post_ops_destroy"},
        {(void **)&g_bf.post_ops_sum, "dnnl_post_ops_append_sum"},
        {(void **)&g_bf.pd_create, "dnnl_primitive_desc_create"},
        {(void **)&g_bf.pd_destroy, "dnnl_primitive_desc_destroy"},
        {(void **)&g_bf.pd_query, "dnnl_primitive_desc_query"},
        {(void **)&g_bf.pd_query_md, "dnnl_primitive_desc_query_md"},
        {(void **)&g_bf.prim_create, "dnnl_primitive_create"},
        {(void **)&g_bf.prim_destroy, "dnnl_primitive_destroy"},
        {(void **)&g_bf.prim_execute, "dnnl_primitive_execute"},
        {(void **)&g_bf.mem_create, "dnnl_memory_create"},
        {(void **)&g_bf.mem_set, "dnnl_memory_set_data_handle"},
        {(void **)&g_bf.mem_destroy, "dnnl_memory_destroy"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!(*want[i].fn = ct_cpu_onednn_symbol(want[i].name))) return false;
    return true;
}

/* The check GEMMs: odd sizes, both transposes of the linear layers (forward x W^T, dW = dy^T x),
 * alpha and beta, against fp64 sums of the same bf16 values. A kernel that adds in another order
 * is within a few fp32 roundings of the sum of magnitudes; a wrong stride or a dropped scale is
 * far outside. Returns the worst error relative to that bound (> 1: failed), or -1 when oneDNN
 * could not make or run one. */
static double check_gemms(thread_cache *tc) {
    static const shape_key shapes[] = {{false, false, true, 37, 29, 53, 53 + 3, 53, 29, 1.0f, 0.0f},
                                       {false, true, false, 24, 40, 33, 24, 40 + 5, 40 + 2, 0.5f, 1.0f}};
    double worst = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape_key *k = &shapes[s];
        int64_t a_n = (k->ta ? k->k : k->m) * k->lda, b_n = (k->tb ? k->n : k->k) * k->ldb, c_n = k->m * k->ldc;
        float *af = malloc(sizeof(float) * (size_t)(a_n + b_n + 2 * c_n));
        uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)(a_n + b_n));
        if (!af || !a16) {
            free(af), free(a16);
            return -1;
        }
        float *bf = af + a_n, *c = bf + b_n, *c0 = c + c_n;
        uint16_t *b16 = a16 + a_n;
        uint64_t x = 0x9e3779b97f4a7c15ull + s;
        for (int64_t i = 0; i < a_n + b_n + c_n; i++) {   /* uniform in (-1, 1), then rounded to bf16 */
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            af[i] = (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
        }
        ct_cpu_cast_range(a16, CT_BF16, af, CT_F32, 0, a_n + b_n);
        ct_cpu_cast_range(af, CT_F32, a16, CT_BF16, 0, a_n + b_n);
        memcpy(c0, c, sizeof(float) * (size_t)c_n);
        compiled e;
        bool ok = compile(&e, k, g_bf.impl, sizeof g_bf.impl) && run(tc, &e, a16, b16, c);
        if (e.prim) compiled_free(&e);
        for (int64_t i = 0; ok && i < k->m; i++)
            for (int64_t j = 0; j < k->n; j++) {
                double acc = 0, mag = 0;
                for (int64_t p = 0; p < k->k; p++) {
                    double t = (double)(k->ta ? af[p * k->lda + i] : af[i * k->lda + p]) *
                               (k->tb ? bf[j * k->ldb + p] : bf[p * k->ldb + j]);
                    acc += t, mag += fabs(t);
                }
                double want = k->alpha * acc + k->beta * (double)c0[i * k->ldc + j];
                double bound = 4.0 * (double)(k->k + 2) * 0x1p-24 * (fabs(k->alpha) * mag + fabs(k->beta * c0[i * k->ldc + j]));
                double err = fabs((double)c[i * k->ldc + j] - want) / (bound + 1e-30);
                if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
            }
        free(af), free(a16);
        if (!ok) return -1;
    }
    return worst;
}

/* The matmul machinery, whatever the CPU: oneDNN's entry points, the engine and the per-thread
 * caches (once). */
static void matmul_load(void) {
    g_bf.ready = ct_cpu_onednn_load() && load_symbols() &&
                 g_bf.engine_create(&g_bf.engine, dnnl_cpu, 0) == dnnl_success &&
                 pthread_key_create(&g_bf.cache_key, cache_free) == 0;
}

static pthread_once_t g_matmul_once = PTHREAD_ONCE_INIT;

static bool matmul_ready(void) {
    pthread_once(&g_matmul_once, matmul_load);
    return g_bf.ready;
}

static void bf16_load(void) {
    const char *emulated = ct_cpu_bf16_emulation();
    if (emulated) {   /* the native path on any CPU, its arithmetic in C (cpu_bf16_emulate.c) */
        g_bf.native = true;
        snprintf(g_bf.note, sizeof g_bf.note, "%s", emulated);
        return;
    }
    const char *want = getenv("CTRAIN_CPU_BF16");
    if (want && !strcmp(want, "widen")) {
        snprintf(g_bf.note, sizeof g_bf.note, "bf16 is computed in fp32 on the CPU "
                 "(CTRAIN_CPU_BF16=widen): 16-bit storage saves memory, not time");
        return;
    }
    if (!cpu_multiplies_bf16()) {
        snprintf(g_bf.note, sizeof g_bf.note, "bf16 is computed in fp32 on this CPU (it has no "
                 "AVX512-BF16 or AMX): 16-bit storage halves activation memory but costs time; fp32 "
                 "trains faster here");
        return;
    }
    if (!ct_cpu_gemm_lib_loaded(CT_GEMM_ONEDNN) && ct_cpu_gemm_lib_loaded(CT_GEMM_OPENBLAS)) {
        /* CTRAIN_CPU_GEMM=openblas: one library for every product, bf16 ones included */
        snprintf(g_bf.note, sizeof g_bf.note, "bf16 is computed in fp32: this CPU multiplies bf16 "
                 "natively, but %s", ct_cpu_onednn_load() ? "CTRAIN_CPU_GEMM=openblas keeps every "
                 "product on OpenBLAS" : "oneDNN (libdnnl.so.2) is not installed: install libdnnl2 for native bf16");
        return;
    }
    thread_cache *tc = matmul_ready() ? my_cache() : NULL;
    if (!tc) {
        snprintf(g_bf.note, sizeof g_bf.note, "bf16 is computed in fp32: this CPU multiplies bf16 "
                 "natively, but oneDNN (libdnnl.so.2) %s", ct_cpu_onednn_load()
                 ? "could not be set up for it" : "is not installed: install libdnnl2 for native bf16");
        return;
    }
    double worst = check_gemms(tc);
    if (worst < 0 || worst > 1) {
        snprintf(g_bf.note, sizeof g_bf.note, "bf16 is computed in fp32: this CPU multiplies bf16 "
                 "natively, but %s %s", ct_cpu_onednn_desc(), worst < 0
                 ? "made no native bf16 matmul for it" : "failed ctrain's check of its bf16 matmul");
        if (worst > 1)
            snprintf(g_bf.note + strlen(g_bf.note), sizeof g_bf.note - strlen(g_bf.note),
                     " (%s: error %.3g times the bound)", g_bf.impl, worst);
        return;
    }
    g_bf.native = true;
    snprintf(g_bf.note, sizeof g_bf.note, "bf16 matrix products run natively (%s, %s); the other bf16 "
             "ops compute in fp32", ct_cpu_onednn_desc(), g_bf.impl);
}

bool ct_cpu_bf16_native(void) {
    pthread_once(&g_bf_once, bf16_load);
    return g_bf.native;
}

const char *ct_cpu_bf16_note(void) {
    pthread_once(&g_bf_once, bf16_load);
    return g_bf.note;
}

#endif

/* cpu_internal.h: what the CPU backend's files share (not part of the public op table).
 *
 * Threading: one pool of persistent workers runs every op, GEMM included: OpenBLAS stays at one
 * thread and a large GEMM is cut into fixed tiles computed by pool workers (cpu_gemm.c says why),
 * so there is exactly one set of threads. Work is split into ranges whose boundaries may depend
 * on the thread count, so every op is written so that its result does not: element-wise ops are
 * independent per element, GEMM tiles depend on the shape only, and reductions sum fixed-size
 * chunks (CT_CPU_CHUNK elements, in double) and then the chunk results in chunk order. */
#ifndef CT_CPU_INTERNAL_H
#define CT_CPU_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"

/* The build is -O2, where gcc 12 runs its vectoriser with the "very cheap" cost model: a loop
 * whose trip count is not a known multiple of the vector width stays scalar, which is every loop
 * here. The kernels are written as simple restrict-pointer loops for the vectoriser, so the CPU
 * backend's files ask for the ordinary cost model (measured: docs/BENCHMARKS.md). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

/* Elements per reduction chunk: fixed, so sums have the same bits for any thread count. */
#define CT_CPU_CHUNK 4096
/* Below this many elements an element-wise op is not worth handing to the workers. */
#define CT_CPU_GRAIN 16384

typedef struct ct_cpu_pool ct_cpu_pool;
ct_cpu_pool *ct_cpu_pool_create(int threads); /* NULL when a thread cannot be started (errno: why) */
void ct_cpu_pool_destroy(ct_cpu_pool *p);

/* fn(ctx, begin, end) over a partition of [0, n) into contiguous pieces of at least `grain` items
 * (at most 4 per thread; the whole range on the calling thread when n <= grain), claimed by
 * whichever thread is free. Returns when all pieces are done. Safe to call from several
 * threads and from inside fn: a call that finds the pool busy runs serially. */
typedef void (*ct_cpu_range_fn)(void *ctx, int64_t begin, int64_t end);
void ct_cpu_parallel(ct_cpu_pool *p, int64_t n, int64_t grain, ct_cpu_range_fn fn, void *ctx);

/* Deterministic chunked reduction: fn(ctx, chunk, out) writes k partial values (double) for chunk
 * `chunk` of [0, n_chunks); total[k] = sum over chunks in chunk order. */
typedef void (*ct_cpu_chunk_fn)(void *ctx, int64_t chunk, double *out);
void ct_cpu_reduce_chunks(ct_cpu_pool *p, int64_t n_chunks, int k, ct_cpu_chunk_fn fn, void *ctx,
                          double *total);

/* Sum (of squares) of n floats in double with a fixed summation order (cpu_reduce.c). */
double ct_cpu_sum(const float *x, int64_t n);
double ct_cpu_sum_squares(const float *x, int64_t n);
double ct_cpu_sum_sq_dev(const float *x, int64_t n, double mean); /* sum of (x - mean)^2 */

/* Backend-private state behind ct_backend.impl. */
#define CT_CPU_SLOTS 5   /* the most arguments an op converts: conv2d_act_backward's dx, dy, y, x, w */
typedef struct ct_cpu {
    ct_cpu_pool *pool;
    int threads;
    void *slot[CT_CPU_SLOTS];     /* fp32 scratch of the 16-bit ops (cpu_dtype.c) */
    size_t slot_cap[CT_CPU_SLOTS];
    pthread_mutex_t mem_mu;       /* the loader's threads allocate pinned slots too */
    ct_mem_stats mem;             /* per-category bytes of cpu_alloc (cpu_backend.c) */
    size_t limit;                 /* train.memory_limit_gb in bytes: alloc fails past it (0: none) */
    uint64_t copies;              /* upload and download tickets handed out (one sequence) */
    struct ct_capped *capped;     /* the capped device's state (cpu_capped.c); NULL: the CPU */
    double timer_at[CT_TIMER_MARKS]; /* ct_now() of mark m in slot m % CT_TIMER_MARKS */
    uint64_t timer_last;          /* the newest timing mark handed out */
} ct_cpu;

static inline ct_cpu_pool *ct_cpu_pool_of(ct_backend *be) { return ((ct_cpu *)be->impl)->pool; }

/* The CPU backend's memory functions, which the capped device keeps (cpu_backend.c): device
 * memory is cpu_alloc's counted, capped pool, pinned memory its counted host blocks. */
void *ct_cpu_mem_alloc(ct_backend *be, size_t bytes, ct_mem_cat cat);
void ct_cpu_mem_free(ct_backend *be, void *p);
/* A block for ct_cpu_scratch (freed with mem.free): device workspace, or on the capped device
 * host memory outside its pool (cpu_backend.c says why). NULL when memory runs out. */
void *ct_cpu_scratch_alloc(ct_backend *be, size_t bytes);


static inline int64_t ct_cpu_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Elements [*i0, *i1) of reduction chunk `chunk` over n elements. */
static inline void ct_cpu_chunk_bounds(int64_t chunk, int64_t n, int64_t *i0, int64_t *i1) {
    *i0 = chunk * CT_CPU_CHUNK;
    *i1 = *i0 + CT_CPU_CHUNK < n ? *i0 + CT_CPU_CHUNK : n;
}

/* Growable fp32 scratch slot s (0 .. CT_CPU_SLOTS-1) of the backend, room for n floats; the
 * 16-bit ops (cpu_dtype.c, the GEMM) widen their operands into it. Contents are not kept. */
float *ct_cpu_scratch(ct_backend *be, int s, int64_t n);

/* The fp32 kernels of the ops that take a dtype; cpu_dtype.c installs the dtype-generic ops on
 * top of them (loss values go to *loss_host / *correct_host). */
void ct_cpu_f32_im2col(ct_backend *be, float *col, const float *img, const ct_conv2d_geom *g, int64_t group);
void ct_cpu_f32_col2im(ct_backend *be, float *img, const float *col, const ct_conv2d_geom *g, int64_t group);
void ct_cpu_f32_conv2d_forward(ct_backend *be, float *y, const float *x, const float *w, const float *bias, const ct_conv2d_geom *g);
void ct_cpu_f32_conv2d_backward(ct_backend *be, float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, const ct_conv2d_geom *g);
/* conv2d with a fused activation (act: CT_ACT_RELU, or CT_ACT_NONE: the plain conv). */
void ct_cpu_f32_conv2d_act_forward(ct_backend *be, float *y, const float *x, const float *w, const float *bias, const ct_conv2d_geom *g, ct_act act);
void ct_cpu_f32_conv2d_act_backward(ct_backend *be, float *dx, float *dw, float *db, const float *dy, const float *y, const float *x, const float *w, const ct_conv2d_geom *g, ct_act act);
/* conv2d + act + the 2x2 stride-2 max-pool of its output (backend.h, conv2d_act_pool_*); forward
 * compares the activations as stored in dt (rounded to it when 16-bit). */
void ct_cpu_f32_conv2d_act_pool_forward(ct_backend *be, float *y, int32_t *argmax, const float *x, const float *w, const float *bias, const ct_conv2d_geom *g, ct_act act, ct_dtype dt);
void ct_cpu_f32_conv2d_act_pool_backward(ct_backend *be, float *dx, float *dw, float *db, const float *dy, const float *y, const int32_t *argmax, const float *x, const float *w, const ct_conv2d_geom *g, ct_act act);
void ct_cpu_f32_fill(ct_backend *be, float *x, float v, int64_t n);
void ct_cpu_f32_scale(ct_backend *be, float *x, float s, int64_t n);
void ct_cpu_f32_axpy(ct_backend *be, float *y, float a, const float *x, int64_t n);
void ct_cpu_f32_add(ct_backend *be, float *y, const float *a, const float *b, int64_t n);
void ct_cpu_f32_copy_rows(ct_backend *be, float *y, int64_t ldy, const float *x, int64_t ldx, int64_t rows, int64_t cols, bool accumulate);
void ct_cpu_f32_act_forward(ct_backend *be, float *y, const float *x, int64_t n, ct_act act, float alpha);
void ct_cpu_f32_act_backward(ct_backend *be, float *dx, const float *dy, const float *x, const float *y, int64_t n, ct_act act, float alpha);
void ct_cpu_f32_bias_act_forward(ct_backend *be, float *x, const float *bias, int64_t rows, int64_t cols, int64_t inner, ct_act act, float alpha);
void ct_cpu_f32_bias_backward(ct_backend *be, float *db, const float *dy, int64_t rows, int64_t cols, int64_t inner);
void ct_cpu_f32_dropout_forward(ct_backend *be, float *y, uint8_t *mask, const float *x, int64_t n, float p, uint64_t seed, uint64_t stream);
void ct_cpu_f32_dropout_backward(ct_backend *be, float *dx, const float *dy, const uint8_t *mask, int64_t n, float p);
void ct_cpu_f32_embedding_forward(ct_backend *be, float *y, const int32_t *ids, const float *table, int64_t n_ids, int64_t dim);
void ct_cpu_f32_embedding_backward(ct_backend *be, float *dtable, const float *dy, const int32_t *ids, int64_t n_ids, int64_t vocab, int64_t dim);
void ct_cpu_f32_softmax_xent(ct_backend *be, float *dlogits, float *loss_host, int64_t *correct_host, const float *logits, const int32_t *labels, int64_t rows, int64_t classes, int64_t ld, float label_smoothing, float grad_scale);
void ct_cpu_f32_mse_loss(ct_backend *be, float *dpred, float *loss_host, const float *pred, const float *target, int64_t n_rows, int64_t n_cols, float grad_scale);
void ct_cpu_f32_bce_logits_loss(ct_backend *be, float *dlogits, float *loss_host, const float *logits, const float *target, int64_t n_rows, int64_t n_cols, float grad_scale);
void ct_cpu_f32_batchnorm_forward(ct_backend *be, float *y, const float *x, const float *gamma, const float *beta, float *running_mean, float *running_var, float *save_mean, float *save_invstd, int64_t n, int64_t c, int64_t hw, float eps, float momentum, bool train);
void ct_cpu_f32_batchnorm_backward(ct_backend *be, float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, const float *gamma, const float *save_mean, const float *save_invstd, int64_t n, int64_t c, int64_t hw);
void ct_cpu_f32_layernorm_forward(ct_backend *be, float *y, float *save_mean, float *save_rstd, const float *x, const float *gamma, const float *beta, int64_t rows, int64_t d, float eps);
void ct_cpu_f32_layernorm_backward(ct_backend *be, float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, const float *gamma, const float *save_mean, const float *save_rstd, int64_t rows, int64_t d);
void ct_cpu_f32_causal_attention_forward(ct_backend *be, float *y, float *lse, const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, float p, uint64_t seed, uint64_t stream);
void ct_cpu_f32_causal_attention_backward(ct_backend *be, float *dqkv, const float *dy, const float *qkv, const float *y, const float *lse, int64_t B, int64_t T, int64_t H, int64_t D, float p, uint64_t seed, uint64_t stream);
void ct_cpu_f32_kv_attention_forward(ct_backend *be, float *y, float *kv, const float *qkv, int64_t B, int64_t T, int64_t pos0, int64_t cap, int64_t H, int64_t KV, int64_t D);
void ct_cpu_f32_rmsnorm_forward(ct_backend *be, float *y, float *save_rstd, const float *x, const float *gamma, int64_t rows, int64_t d, float eps);
void ct_cpu_f32_rmsnorm_backward(ct_backend *be, float *dx, float *dgamma, const float *dy, const float *x, const float *gamma, const float *save_rstd, int64_t rows, int64_t d);
void ct_cpu_f32_swiglu_forward(ct_backend *be, float *y, const float *x, int64_t rows, int64_t f);
void ct_cpu_f32_swiglu_backward(ct_backend *be, float *dx, const float *dy, const float *x, int64_t rows, int64_t f);
void ct_cpu_f32_rope_gqa_forward(ct_backend *be, float *qkv, const float *x, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const ct_rope *r);
void ct_cpu_f32_rope_gqa_backward(ct_backend *be, float *dx, const float *dqkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const ct_rope *r);
void ct_cpu_f32_maxpool2d_forward(ct_backend *be, float *y, int32_t *argmax, const float *x, const ct_pool2d_geom *g);
void ct_cpu_f32_maxpool2d_backward(ct_backend *be, float *dx, const float *dy, const int32_t *argmax, const ct_pool2d_geom *g);
void ct_cpu_f32_avgpool2d_forward(ct_backend *be, float *y, const float *x, const ct_pool2d_geom *g);
void ct_cpu_f32_avgpool2d_backward(ct_backend *be, float *dx, const float *dy, const ct_pool2d_geom *g);

/* The 2x2, stride-2, unpadded max-pool of one plane [g->h, g->w] into y [g->oh, g->ow] and its
 * argmax (iy * w + ix), on the calling thread: maxpool2d_forward's loop for that window, which the
 * fused conv2d + pool calls on each channel it has just computed (cpu_pooling.c). */
void ct_cpu_maxpool2x2_plane(const float *x, float *y, int32_t *am, const ct_pool2d_geom *g);
/* x[0, n) rounded in place to the nearest value of dt (CT_F16, CT_BF16; else nothing), on the
 * calling thread: the round_to op's loop (cpu_eltwise.c). */
void ct_cpu_round_range(float *x, int64_t n, ct_dtype dt);

/* y[i] = x[i] converted, for i in [i0, i1), on the calling thread (the cast op's inner loop; F16C
 * where present): for kernels that convert what they just computed. */
void ct_cpu_cast_range(void *y, ct_dtype y_dt, const void *x, ct_dtype x_dt, int64_t i0, int64_t i1);

/* init_fill's elements i0 .. i0 + n - 1 into x[0, n), on the calling thread, with one instruction
 * set (0: baseline, 1: AVX2, 2: AVX-512); false when this CPU lacks it. The op picks the widest
 * there is; test_backend runs every one against its reference, at counters past 2^32 too. */
bool ct_cpu_init_fill_isa(float *x, int64_t i0, int64_t n, const ct_init_dist *d, uint64_t seed,
                          uint64_t stream, int isa);

/* Adam/AdamW on elements [i0, i1) of the flat buffers, the 16-bit copy (a->copy) included, on
 * the calling thread, with one instruction set (0: baseline, 1: AVX2 with F16C, 2: AVX-512F);
 * every kernel gives the same bits (cpu_adam.c says why). ct_cpu_adam_isa(-1) is the widest this
 * CPU runs; ct_cpu_adam_isa(isa) is isa when this CPU runs it, else -1. */
int ct_cpu_adam_isa(int isa);
/* y[i] = sqrt(x[i]) for i < n, SSE where present (y may equal x): the optimizers' square roots. */
void ct_cpu_sqrt_block(float *y, const float *x, int64_t n);
void ct_cpu_adam_range(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1,
                       const ct_adam_args *a, int isa);

/* Each file fills its part of the op table. */
void ct_cpu_gemm_install(ct_backend *be);
void ct_cpu_eltwise_install(ct_backend *be);
void ct_cpu_conv_install(ct_backend *be);
void ct_cpu_pooling_install(ct_backend *be);
void ct_cpu_norm_install(ct_backend *be);
void ct_cpu_loss_install(ct_backend *be);
void ct_cpu_optim_install(ct_backend *be);
void ct_cpu_reduce_install(ct_backend *be);
void ct_cpu_dtype_install(ct_backend *be);
void ct_cpu_init_install(ct_backend *be);

/* Row-major single-threaded fp32 GEMM, C = alpha op(A) op(B) + beta C (m x n, k inner; m, n, k
 * > 0), on the calling thread, through the library ct_cpu_gemm_lib_for picks for the shape
 * (cpu_gemm.c; ct_cpu_blas_load loads them). C is not read when beta == 0. */
void ct_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* The GEMM libraries a single-threaded GEMM can go to. */
typedef enum { CT_GEMM_OPENBLAS, CT_GEMM_ONEDNN } ct_gemm_lib;
/* Which one ct_cpu_sgemm uses for this shape: from the shape, CTRAIN_CPU_GEMM and the libraries
 * loaded only (never the thread count). */
ct_gemm_lib ct_cpu_gemm_lib_for(bool ta, bool tb, int64_t m, int64_t n, int64_t k);
bool ct_cpu_gemm_lib_loaded(ct_gemm_lib lib);
/* ct_cpu_sgemm through the given library (loaded: ct_cpu_gemm_lib_loaded): tests and benchmarks. */
void ct_cpu_sgemm_with(ct_gemm_lib lib, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                       float beta, float *c, int64_t ldc);
/* The tiles of a backend GEMM C = op(A) op(B) of this shape, which the pool runs (blocks of rows of
 * C when m >= n, else of columns; from the shape alone, never the thread count): how many, and
 * tile t: its block of C is m x n, and its operands start a, b, c elements into A, B, C (leading
 * dimensions lda, ldb, ldc). ct_cpu_gemm_tile_shape: the first tile's m and n. */
typedef struct ct_gemm_tile {
    int64_t m, n, a, b, c;
} ct_gemm_tile;
int64_t ct_cpu_gemm_tiles(int64_t m, int64_t n, int64_t k);
ct_gemm_tile ct_cpu_gemm_tile_at(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                 int64_t ldc, int64_t t);
void ct_cpu_gemm_tile_shape(int64_t m, int64_t n, int64_t k, int64_t *tile_m, int64_t *tile_n);

/* oneDNN (cpu_onednn.c): loaded when installed (false otherwise; never an error), its version
 * line ("oneDNN 2.6.3") or NULL, and its GEMM on the calling thread alone. */
bool ct_cpu_onednn_load(void);
const char *ct_cpu_onednn_desc(void);
void ct_cpu_onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);
/* Another entry point of the oneDNN loaded (NULL when it is not, or lacks it), and the bracket
 * around every call into it: the thread's asynchronous signals blocked and its OpenMP threads held
 * to one (cpu_onednn.c says why), then restored. */
void *ct_cpu_onednn_symbol(const char *name);
void ct_cpu_onednn_enter(sigset_t *old);
void ct_cpu_onednn_leave(const sigset_t *old);

/* bf16 GEMMs computed as bf16 where the CPU multiplies bf16 natively (cpu_onednn_bf16.c):
 * whether they are (loads oneDNN and checks once), a line for the start of a run saying how or
 * why not, and C = alpha op(A) op(B) + beta C over the pool, A and B bf16, C fp32, in the
 * tiles of ct_cpu_gemm_tile_at. */
bool ct_cpu_bf16_native(void);
const char *ct_cpu_bf16_note(void);
void ct_cpu_bf16_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                      int64_t ldc);
/* CTRAIN_CPU_BF16=emulate (cpu_bf16_emulate.c, for tests): the start block's note when it is set,
 * else NULL; then ct_cpu_bf16_native() holds on any CPU and ct_cpu_bf16_gemm runs
 * ct_cpu_bf16_gemm_emulated, AVX512-BF16's arithmetic written out in C, in the same tiles. */
const char *ct_cpu_bf16_emulation(void);
void ct_cpu_bf16_gemm_emulated(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc);
/* The same machinery with fp32 operands, on any CPU oneDNN runs on (false: oneDNN not loaded):
 * for the test of the bf16 path's plumbing where bf16 itself cannot run. */
bool ct_cpu_onednn_matmul_f32(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                              int64_t ldc);
/* The GEMM libraries loaded (openblas_get_config(), " + oneDNN x.y.z" when it loaded), or NULL. */
const char *ct_cpu_blas_config(void);

#endif

/* cuda_internal.h: what the CUDA backend's files share (not part of the public op table).
 *
 * Every op is queued on the backend's compute stream; host-visible results (losses, norms,
 * finite checks) are reduced on the device into a small buffer and copied to pinned host memory
 * before the op returns. Reductions are deterministic: partial sums over fixed chunks whose
 * boundaries depend only on the problem size (never on the SM count), combined by fixed-order tree
 * reductions; no floating-point atomics anywhere.
 *
 * Errors: an internal CUDA/cuBLAS failure cannot be a user error, and the op table returns void,
 * so the check macros hand the call, file and line to ct_fatal (core/util/common.h), whose handler
 * decides how the process ends (ctrain: message and exit code CT_ERR_RUNTIME). */
#ifndef CT_CUDA_INTERNAL_H
#define CT_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

extern "C" {
#include "core/backend/backend.h"
}

/* ---- checks ---- */
void ct_cuda_fail_at(const char *what, const char *detail, const char *call, const char *file,
                     int line) __attribute__((noreturn));
void ct_cuda_check_at(cudaError_t e, const char *call, const char *file, int line);
void ct_cublas_check_at(cublasStatus_t s, const char *call, const char *file, int line);
#define CT_CUDA_CHECK(call) ct_cuda_check_at((call), #call, __FILE__, __LINE__)
#define CT_CUBLAS_CHECK(call) ct_cublas_check_at((call), #call, __FILE__, __LINE__)
/* After every kernel launch: catches bad launch configurations at the launch site. */
#define CT_CUDA_LAUNCH_CHECK() ct_cuda_check_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
/* A precondition the caller (not the user) broke: unsupported dtype, negative size. */
#define CT_CUDA_REQUIRE(cond, msg)                                                               \
    do {                                                                                         \
        if (!(cond)) ct_cuda_fail_at("internal", (msg), #cond, __FILE__, __LINE__);              \
    } while (0)

/* ---- caching device allocator ----
 * Blocks are rounded up to size classes (8 per power of two, at least 512 bytes) and kept on a
 * free list per class when freed, so a training step that repeats its allocations never calls
 * cudaMalloc/cudaFree after the first step. Every op runs on the compute stream, so a block freed
 * by the host and handed out again is only touched by later work on that stream. */
typedef struct ct_cuda_block {
    void *ptr;
    size_t bytes;                 /* rounded size (the class) */
    int cat;                      /* ct_mem_cat it is counted under while live */
    bool scratch;                 /* from ct_cuda_scratch: returns to the scratch pool */
} ct_cuda_block;

/* A growable list of blocks (free list, blocks a capture owns). */
typedef struct ct_cuda_blocks {
    ct_cuda_block *v;
    size_t n, cap;
} ct_cuda_blocks;

typedef struct ct_cuda_alloc {
    pthread_mutex_t mu;
    ct_cuda_block *live;          /* open-addressing table keyed by ptr: live blocks */
    size_t live_cap, live_n;
    ct_cuda_block *free_blocks;   /* cached free blocks, unsorted */
    size_t free_cap, free_n;
    size_t live_bytes, peak_live_bytes;
    size_t cat_bytes[CT_MEM_CAT_COUNT], cat_peak[CT_MEM_CAT_COUNT];
    /* Graph capture (cuda_graph.cu): blocks freed while capturing may be reused by the same
     * capture only (the graph's kernels keep their addresses), so they go to `captured`, which the
     * graph owns from capture_end until graph_free. Without a cached block a capture calls
     * cudaMalloc under a relaxed capture mode (capture_mallocs counts those). */
    bool capturing;
    ct_cuda_blocks captured;
    uint64_t capture_mallocs;
    /* Op scratch (ct_cuda_scratch: taken and freed inside one op) has a pool of its own that
     * be->alloc never draws from and the cache release never frees. Every graph and every direct
     * op runs on the one compute stream, so all of them can share these blocks: a graph's kernels
     * bake in scratch addresses that only ever serve work ordered before or after the replay.
     * (Without the pool each captured graph owned a private copy of all scratch.) */
    ct_cuda_blocks scratch_pool;
    size_t reserved_bytes, peak_reserved_bytes;   /* cudaMalloc'd, live + cached */
    /* Pinned host memory (alloc_host_pinned) by category: mem_stats' host figures. */
    size_t host_bytes[CT_MEM_CAT_COUNT], host_peak[CT_MEM_CAT_COUNT], host_total, host_peak_total;
    uint64_t n_cuda_malloc;       /* for tests: the step loop must not raise it */
} ct_cuda_alloc;

/* ---- GEMM plan cache (cuBLASLt descriptors and the heuristic's algorithm per shape) ---- */
#define CT_CUDA_GEMM_CACHE 256   /* conv layers use up to 3 plans per shape, plus a last chunk */
typedef struct ct_cuda_gemm_key {
    int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
    int ta, tb, a_dt, b_dt, c_dt, align, tf32;
    int bias_align;               /* the epilogue bias pointer's own alignment (0: no bias) */
    int epi;                      /* cublasLtEpilogue_t (linear_forward); 0: plain GEMM */
} ct_cuda_gemm_key;

typedef struct ct_cuda_gemm_plan {
    ct_cuda_gemm_key key;
    int used;
    int has_algo;                 /* 0: the heuristic found nothing (the caller falls back) */
    uint64_t last_use;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} ct_cuda_gemm_plan;

/* Pinned staging ring for uploads: copy_h2d copies the caller's bytes into a slot and queues the
 * DMA from there, so it returns at once and the caller may reuse its buffer; a slot is reused only
 * after its event says the previous upload from it finished (it always has, a few steps later). */
#define CT_CUDA_STAGES 4
#define CT_CUDA_STAGE_MAX ((size_t)64 << 20) /* larger uploads (checkpoints) go direct, waiting */
typedef struct ct_cuda_stage {
    void *buf;
    size_t cap;
    cudaEvent_t done;
    bool pending;                 /* an upload from buf may still be running */
} ct_cuda_stage;

/* Tickets of the copy stream, uploads and downloads alike (one sequence, because one stream runs
 * them in order): ticket t is recorded in event t % CT_CUDA_COPY_EVENTS; an event is reused only
 * after the copy it marked is known to be finished. Used from the trainer's thread only (as every
 * op), so it has no lock. Graphs must be freed (graph_free) before destroy. */
#define CT_CUDA_COPY_EVENTS 16
typedef struct ct_cuda_copy_ring {
    cudaEvent_t ev[CT_CUDA_COPY_EVENTS];
    uint64_t ticket[CT_CUDA_COPY_EVENTS];    /* ticket last recorded in ev[i] (0: none) */
    uint64_t next;                /* the last ticket handed out */
    uint64_t done;                /* every ticket <= done has finished */
    /* compute_mark m is recorded in mark_ev[m % CT_CUDA_COPY_EVENTS]; a newer mark in the same
     * event only moves a copy's wait later, which is safe */
    cudaEvent_t mark_ev[CT_CUDA_COPY_EVENTS];
    uint64_t mark_next;
} ct_cuda_copy_ring;

/* be->timer_mark: mark m is a timing event recorded in ev[m % CT_TIMER_MARKS] (backend.h says
 * how long it stays valid). Separate from the copy ring's marks, which are created without
 * timing because timing makes every record and wait dearer. */
typedef struct ct_cuda_timer_ring {
    cudaEvent_t ev[CT_TIMER_MARKS];
    uint64_t last;                /* the newest mark handed out */
} ct_cuda_timer_ring;

/* Backend-private state behind ct_backend.impl. */
typedef struct ct_cuda {
    int device;
    int sm_count;
    cudaStream_t compute;         /* every kernel, GEMM, memset and D2D/D2H copy */
    cudaStream_t copy;            /* uploads and downloads from/to pinned memory */
    cudaEvent_t ev_compute;       /* compute stream reached this point (copy waits: dst free) */
    cudaEvent_t ev_copy;          /* upload finished (compute waits: dst ready) */
    cublasLtHandle_t lt;
    void *lt_workspace;           /* cuBLASLt workspace, allocated once */
    size_t lt_workspace_bytes;
    bool tf32;                    /* TF32 tensor cores for fp32 GEMMs (off unless asked) */
    int attn_path;                /* CTRAIN_CUDA_ATTENTION: 0 fastest that applies, 2 reference */
    ct_cuda_gemm_plan plans[CT_CUDA_GEMM_CACHE];
    uint64_t plan_clock;
    void *host_scratch;           /* pinned, CT_CUDA_HOST_SCRATCH bytes: reduction results */
    ct_cuda_stage stage[CT_CUDA_STAGES];
    int stage_next;
    ct_cuda_copy_ring cq;
    ct_cuda_timer_ring timer;
    ct_cuda_alloc mem;
} ct_cuda;

#define CT_CUDA_HOST_SCRATCH 4096

static inline ct_cuda *ct_cuda_of(ct_backend *be) { return (ct_cuda *)be->impl; }
static inline cudaStream_t ct_cuda_stream(ct_backend *be) { return ct_cuda_of(be)->compute; }

/* Device scratch from the caching allocator; exits on failure (internal buffers, small). */
void *ct_cuda_scratch(ct_backend *be, size_t bytes, const char *file, int line);
#define CT_CUDA_SCRATCH(be, bytes) ct_cuda_scratch((be), (bytes), __FILE__, __LINE__)
void ct_cuda_scratch_free(ct_backend *be, void *p);
/* Copy `bytes` (<= CT_CUDA_HOST_SCRATCH) from the device to host memory and wait for it. */
void ct_cuda_read_result(ct_backend *be, void *dst_host, const void *src_dev, size_t bytes);

/* ---- launch helpers ---- */
#define CT_CUDA_THREADS 256
/* Grid for a grid-stride loop over n items: enough blocks to fill the device, never more than
 * needed. Results of element-wise kernels do not depend on it. */
static inline unsigned ct_cuda_grid(ct_backend *be, int64_t n, int threads) {
    int64_t want = (n + threads - 1) / threads;
    int64_t cap = (int64_t)ct_cuda_of(be)->sm_count * 32;
    if (want > cap) want = cap;
    if (want < 1) want = 1;
    return (unsigned)want;
}

/* Element-wise kernels loop over their items with a grid stride, so any grid size is correct. */
#define GRID_STRIDE(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (int64_t)gridDim.x * blockDim.x)

/* Kernels over planes (an image channel, a matrix row): blockIdx.y walks the planes, the threads of
 * blockIdx.x the items of one plane, with 32-bit index math inside the plane (a 64-bit division
 * is an emulated routine of tens of instructions; the per-plane constants are computed once per
 * block). The caller checks that a plane's items fit an int (CT_CUDA_REQUIRE). */
#define PLANE_STRIDE(pl, planes) for (int64_t pl = blockIdx.y; pl < (planes); pl += gridDim.y)
#define INNER_STRIDE(i, n) \
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < (n); i += (int)(gridDim.x * blockDim.x))

static inline dim3 ct_cuda_plane_grid(ct_backend *be, int64_t planes, int64_t per_plane) {
    int64_t x = (per_plane + CT_CUDA_THREADS - 1) / CT_CUDA_THREADS;
    int64_t cap = (int64_t)ct_cuda_of(be)->sm_count * 8;
    if (x > cap) x = cap;
    return dim3((unsigned)(x < 1 ? 1 : x), (unsigned)(planes < 65535 ? (planes < 1 ? 1 : planes) : 65535));
}

/* Launch a PLANE_STRIDE kernel over `planes` planes of `per_plane` items each. */
#define LAUNCH_PLANES(be, planes, per_plane, kernel, ...)                                         \
    do {                                                                                         \
        if ((planes) > 0 && (per_plane) > 0) {                                                   \
            CT_CUDA_REQUIRE((per_plane) <= INT32_MAX, "a plane of more than 2^31 items");       \
            kernel<<<ct_cuda_plane_grid((be), (planes), (per_plane)), CT_CUDA_THREADS, 0,        \
                     ct_cuda_stream(be)>>>(__VA_ARGS__);                                         \
            CT_CUDA_LAUNCH_CHECK();                                                              \
        }                                                                                        \
    } while (0)

/* Launch `kernel` over n items on the compute stream (nothing when n is 0), then check the launch. */
#define LAUNCH(be, n, kernel, ...)                                                               \
    do {                                                                                         \
        if ((n) > 0) {                                                                           \
            kernel<<<ct_cuda_grid((be), (n), CT_CUDA_THREADS), CT_CUDA_THREADS, 0,               \
                     ct_cuda_stream(be)>>>(__VA_ARGS__);                                         \
            CT_CUDA_LAUNCH_CHECK();                                                              \
        }                                                                                        \
    } while (0)

/* Fixed-size chunks for deterministic two-pass reductions: the chunk count depends only on n. */
#define CT_CUDA_RED_THREADS 256
#define CT_CUDA_RED_CHUNK 16384
#define CT_CUDA_RED_MAX_CHUNKS 1024
static inline int64_t ct_cuda_red_chunks(int64_t n) {
    int64_t c = (n + CT_CUDA_RED_CHUNK - 1) / CT_CUDA_RED_CHUNK;
    if (c > CT_CUDA_RED_MAX_CHUNKS) c = CT_CUDA_RED_MAX_CHUNKS;
    return c < 1 ? 1 : c;
}

/* ---- device helpers shared by the kernels ---- */
#ifdef __CUDACC__
/* Fixed-order sum over a warp (butterfly): every lane ends with the same bits. */
template <typename T>
__device__ __forceinline__ T ct_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float ct_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Fixed-order sum over a block (blockDim.x a multiple of 32, <= 1024); `sh` holds 32 T.
 * Every thread gets the result. Callers that reuse `sh` must __syncthreads() first. */
template <typename T>
__device__ __forceinline__ T ct_block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ct_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : T(0);
    r = ct_warp_sum(r);
    return r;
}
__device__ __forceinline__ float ct_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ct_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return ct_warp_max(r);
}
#endif

/* ---- fp16 / bf16 storage on the device: the same bits as core/util/tensor.h's host conversions ---- */
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
__device__ __forceinline__ uint16_t ct_dev_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float ct_dev_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}
/* __float2half_rn rounds to nearest even with overflow to Inf at 65520, as the host code does;
 * only NaN needs care (the host writes sign | 0x7e00). */
__device__ __forceinline__ uint16_t ct_dev_f32_to_f16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));
}
/* Bit for bit the host's conversion (hardware cvt may canonicalise NaN payloads). */
__device__ __forceinline__ float ct_dev_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* subnormal: mant * 2^-24, exact */
        return sign ? -v : v;
    }
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
/* Element i of an array of any ct_dtype as float, and back (cold paths: dtype known at run time).
 * Integer stores round to nearest even, as the host's lrintf does. */
__device__ __forceinline__ float ct_dev_load(const void *p, int dt, int64_t i) {
    switch (dt) {
    case CT_F32: return ((const float *)p)[i];
    case CT_F16: return ct_dev_f16_to_f32(((const uint16_t *)p)[i]);
    case CT_BF16: return ct_dev_bf16_to_f32(((const uint16_t *)p)[i]);
    case CT_I32: return (float)((const int32_t *)p)[i];
    case CT_I64: return (float)((const int64_t *)p)[i];
    case CT_U8: return (float)((const uint8_t *)p)[i];
    case CT_U16: return (float)((const uint16_t *)p)[i];
    default: return 0.0f;
    }
}
__device__ __forceinline__ void ct_dev_store(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case CT_F32: ((float *)p)[i] = v; break;
    case CT_F16: ((uint16_t *)p)[i] = ct_dev_f32_to_f16(v); break;
    case CT_BF16: ((uint16_t *)p)[i] = ct_dev_f32_to_bf16(v); break;
    case CT_I32: ((int32_t *)p)[i] = (int32_t)__float2ll_rn(v); break;
    case CT_I64: ((int64_t *)p)[i] = (int64_t)__float2ll_rn(v); break;
    case CT_U8: ((uint8_t *)p)[i] = (uint8_t)__float2ll_rn(v); break;
    case CT_U16: ((uint16_t *)p)[i] = (uint16_t)__float2ll_rn(v); break;
    default: break;
    }
}
#endif
static inline bool ct_cuda_float_dtype(ct_dtype t) { return t == CT_F32 || t == CT_F16 || t == CT_BF16; }

/* y[r * ldy + j] = x[r * ldx + j] converted between float dtypes, for every batch item
 * (element strides sy, sx), r < rows, j < cols (cuda_eltwise.cu). */
void ct_cuda_cast_2d(ct_backend *be, void *y, ct_dtype y_dt, int64_t ldy, int64_t sy, const void *x,
                     ct_dtype x_dt, int64_t ldx, int64_t sx, int64_t rows, int64_t cols,
                     int64_t batch);
/* c[b * sc + r * ldc + j] *= beta (beta == 0 writes 0 whatever c held) (cuda_eltwise.cu). */
void ct_cuda_scale_2d(ct_backend *be, void *c, ct_dtype c_dt, int64_t ldc, int64_t sc, float beta,
                      int64_t rows, int64_t cols, int64_t batch);

/* Each file fills its part of the op table. */
void ct_cuda_mem_install(ct_backend *be);
void ct_cuda_gemm_install(ct_backend *be);
void ct_cuda_eltwise_install(ct_backend *be);
void ct_cuda_conv_install(ct_backend *be);
void ct_cuda_norm_install(ct_backend *be);
void ct_cuda_attn_install(ct_backend *be);          /* causal attention (cuda_attention.cu) */
void ct_cuda_loss_install(ct_backend *be);
void ct_cuda_optim_install(ct_backend *be);
void ct_cuda_graph_install(ct_backend *be);         /* capture_* (cuda_graph.cu) */
void ct_cuda_rmsnorm_install(ct_backend *be);       /* rmsnorm_* (cuda_rmsnorm.cu) */
void ct_cuda_swiglu_install(ct_backend *be);        /* swiglu_* (cuda_swiglu.cu) */
void ct_cuda_rope_install(ct_backend *be);          /* rope_gqa_* (cuda_rope.cu) */

/* Allocator lifecycle (cuda_mem.cu). */
void ct_cuda_alloc_init(ct_cuda_alloc *a);
void ct_cuda_alloc_release_all(ct_cuda_alloc *a);   /* cudaFree every block; at destroy */
/* Upload staging ring: events created at init; buffers and events released at destroy
 * (strict: report failures; otherwise ignore them, for unwinding a failed creation). */
bool ct_cuda_stages_init(ct_cuda *cu);
void ct_cuda_stages_release(ct_cuda *cu, bool strict);
/* Allocator side of graph capture (cuda_mem.cu). begin: start routing frees to the capture;
 * end: stop, move the capture's blocks to *owned and return the bytes the capture could not get
 * from the cache (non-zero: the capture is unusable). give_back: return a graph's blocks to the
 * free list (graph_free, or a failed capture). */
void ct_cuda_alloc_capture_begin(ct_cuda_alloc *a);
void ct_cuda_alloc_capture_end(ct_cuda_alloc *a, ct_cuda_blocks *owned);
void ct_cuda_alloc_give_back(ct_cuda_alloc *a, ct_cuda_blocks *owned);
/* The copy ring's and the timer ring's events: created at init, destroyed at teardown (strict as
 * for the stages). */
bool ct_cuda_queue_events_init(ct_cuda *cu);
void ct_cuda_queue_events_release(ct_cuda *cu, bool strict);
/* A host-synchronizing or copy-stream call while capturing is a caller bug: fail loudly. */
void ct_cuda_require_not_capturing(ct_backend *be, const char *what);
/* GEMM plan cache teardown (cuda_gemm.cu). */
void ct_cuda_gemm_plans_destroy(ct_cuda *cu);

/* ---- op table v2 helpers (cuda_gemm.cu, cuda_transform.cu) ---- */
/* Strided-batched C = alpha op(A) op(B) + beta C for any float dtypes (cuBLASLt where native,
 * fp32 copies otherwise); element strides sa, sb, sc (0: the same matrix for every item). */
void ct_cuda_gemm_strided(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const void *a, ct_dtype a_dt, int64_t lda, int64_t sa,
                          const void *b, ct_dtype b_dt, int64_t ldb, int64_t sb, float beta, void *c,
                          ct_dtype c_dt, int64_t ldc, int64_t sc, int64_t batch);
/* The op table's normalize_u8 (cuda_transform.cu). */
void ct_cuda_normalize_u8(ct_backend *be, void *y, const uint8_t *x, const uint8_t *flip,
                          const ct_u8_normalize *p, ct_dtype dt);

#endif

/* backend.h: the op table every backend implements.
 *
 * Layers, the executor and the optimizer call only these functions; no layer contains a device
 * #ifdef. The CPU backend (core/cpu/) is the reference: every CUDA op is tested against it.
 *
 * Conventions
 *  - All pointers are in the backend's memory space (host memory for CPU) unless named *_host.
 *  - Sizes and counts are int64_t; matrices are row-major; "ld" is the row stride in elements.
 *  - Activations and the parameters ops read are stored in the op's `dt` (fp32, fp16 or bf16);
 *    gradients of parameters, statistics and optimizer state are fp32 (see "dtypes of op
 *    arguments" below and docs/DESIGN-NOTES.md, "Precision").
 *  - Every op is deterministic: the same inputs give the same bits whatever the thread count
 *    (reductions use a fixed chunking; no atomics).
 *  - Ops that take `seed`/`stream` draw random numbers with ct_rng_at() (core/util/rng.h), so CPU and
 *    GPU produce the same masks.
 *  - Backward ops ACCUMULATE into parameter gradients (dw += ...) and WRITE input gradients
 *    (dx = ...) unless their comment says otherwise.
 */
#ifndef CT_BACKEND_H
#define CT_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "core/util/common.h"
#include "core/util/tensor.h"

typedef enum {
    CT_ACT_NONE = 0,
    CT_ACT_RELU,
    CT_ACT_LEAKY_RELU,   /* alpha = negative slope */
    CT_ACT_GELU,         /* exact erf form */
    CT_ACT_GELU_TANH,    /* tanh approximation */
    CT_ACT_SILU,
    CT_ACT_TANH,
    CT_ACT_SIGMOID,
} ct_act;

typedef enum { CT_LOSS_CROSS_ENTROPY = 0, CT_LOSS_MSE, CT_LOSS_BCE_WITH_LOGITS } ct_loss_kind;

/* 2-D convolution geometry (NCHW input, OIHW weight with I = C/groups). */
typedef struct ct_conv2d_geom {
    int64_t n, c, h, w;          /* input */
    int64_t oc, kh, kw;          /* weight [oc, c/groups, kh, kw] */
    int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
    int64_t oh, ow;              /* output, filled by the caller from the formula */
} ct_conv2d_geom;

/* A device backend's whole-batch convolution (cuda/cuda_conv.cu) runs over chunks of images whose
 * scratch stays under CT_CONV_CHUNK_BYTES, all of it in one block. Each group's column rows
 * (c/groups * kh * kw) are padded with zero rows to a multiple of 8 (ct_conv2d_group_rows), so
 * that every GEMM operand is 16-byte aligned: cuBLASLt takes far slower kernels otherwise, and a
 * 1-channel 3x3 convolution has 9 rows. Per image of a chunk, with R the padded rows and
 * P = oh*ow pixels: the im2col columns [R, P] in the compute dtype, then forward the fp32
 * products [oc, P], backward the rearranged dy [oc, P] and the fp32 column gradients [R, P]; per
 * pass, with padded rows, the padded weights [oc, R/groups] and their fp32 gradient; 256 bytes
 * of alignment per buffer. Defined here, once, so the memory plan (the layer hook
 * device_scratch_bytes) counts what the backend takes. Chunks of 16 MiB keep every GEMM at least
 * one image wide while the scratch stays small next to the activations. */
#define CT_CONV_CHUNK_BYTES ((int64_t)16 << 20)
#define CT_CONV_SCRATCH_ALIGN 256

static inline int64_t ct_conv2d_group_rows(const ct_conv2d_geom *g) {
    int64_t kg = g->c / g->groups * g->kh * g->kw;
    return (kg + 7) / 8 * 8;
}

static inline int64_t ct_conv2d_image_scratch(const ct_conv2d_geom *g, size_t es) {
    int64_t rows = g->groups * ct_conv2d_group_rows(g), pix = g->oh * g->ow;
    int64_t fwd = g->oc * 4, bwd = g->oc * (int64_t)es + rows * 4;
    return pix * (rows * (int64_t)es + (fwd > bwd ? fwd : bwd));
}

/* Images a chunk can hold: as many as fit CT_CONV_CHUNK_BYTES, at least 1. */
static inline int64_t ct_conv2d_chunk_capacity(const ct_conv2d_geom *g, size_t es) {
    int64_t per = ct_conv2d_image_scratch(g, es);
    int64_t nb = per > 0 ? CT_CONV_CHUNK_BYTES / per : 1;
    return nb < 1 ? 1 : nb;
}

/* Images per chunk of a batch of g->n. */
static inline int64_t ct_conv2d_chunk_images(const ct_conv2d_geom *g, size_t es) {
    int64_t nb = ct_conv2d_chunk_capacity(g, es);
    return nb < g->n ? nb : (g->n < 1 ? 1 : g->n);
}

/* The one scratch block of a whole-batch pass, sized for a full chunk whatever the batch: every
 * convolution of a model, and a short last batch, then asks for about CT_CONV_CHUNK_BYTES, one
 * size class of the allocator, so a single pooled block serves them all. */
static inline size_t ct_conv2d_scratch_bytes(const ct_conv2d_geom *g, size_t es) {
    int64_t kg = g->c / g->groups * g->kh * g->kw, kgp = ct_conv2d_group_rows(g);
    int64_t padded = kgp != kg ? g->oc * kgp * ((int64_t)es + 4) : 0;
    return (size_t)(ct_conv2d_chunk_capacity(g, es) * ct_conv2d_image_scratch(g, es) + padded +
                    5 * CT_CONV_SCRATCH_ALIGN);
}

/* Rotary position embeddings (rope_gqa_forward): the base theta of the frequencies (0: no
 * rotation), a divisor of every frequency (Hugging Face's "linear" rope_scaling factor; 1: none)
 * and the position of a sequence's first token (0 in training; a generation step with a KV cache
 * passes its position). */
typedef struct ct_rope {
    double theta;
    double factor;
    int64_t pos0;
} ct_rope;

/* 2-D pooling geometry (NCHW). */
typedef struct ct_pool2d_geom {
    int64_t n, c, h, w;
    int64_t kh, kw, stride_h, stride_w, pad_h, pad_w;
    int64_t oh, ow;
    bool count_include_pad;      /* avgpool: PyTorch default true */
} ct_pool2d_geom;

/* Fused optimizer step arguments. grad_scale multiplies every gradient before use: it folds
 * 1/loss_scale, gradient_predivide and the global-norm clip coefficient into one pass. When copy is
 * not NULL the same pass also writes copy[i] = the updated param[i] rounded to copy_dt (CT_F16 or
 * CT_BF16): the compute-dtype parameters forward/backward read (the parameter store, core/params/store.h). */
typedef struct ct_adam_args {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_c1, bias_c2;      /* 1 - beta1^t, 1 - beta2^t (1, 1 without bias correction) */
    float grad_scale;
    bool decoupled;              /* AdamW-style weight decay (adam_w_mode) */
    void *copy;                  /* [n] 16-bit copy of the updated parameters, or NULL */
    ct_dtype copy_dt;
} ct_adam_args;

typedef struct ct_sgd_args {
    float lr, momentum, dampening, weight_decay;
    float grad_scale;
    bool nesterov;
    bool first_step;             /* momentum buffer initialised to the gradient, as torch does */
    void *copy;                  /* as in ct_adam_args */
    ct_dtype copy_dt;
} ct_sgd_args;

typedef struct ct_lamb_args {
    float beta1, beta2, eps, weight_decay;
    float bias_c1, bias_c2;
    float grad_scale;
    bool eps_inside_sqrt;
} ct_lamb_args;

/* What device memory is for: the caching allocator keeps current and peak bytes per category so
 * the reports can say where memory went (docs/DESIGN-NOTES.md, "Memory accounting"). */
typedef enum {
    CT_MEM_PARAMS = 0,           /* parameters as forward/backward use them (compute dtype copy) */
    CT_MEM_MASTER,               /* fp32 master weights (and non-trainable buffers) */
    CT_MEM_GRADS,                /* fp32 parameter gradients */
    CT_MEM_OPTIM,                /* optimizer state (moments, momentum) */
    CT_MEM_ACTIVATIONS,          /* activations, their gradients, forward-to-backward state */
    CT_MEM_WORKSPACE,            /* op scratch, GEMM workspace, reductions */
    CT_MEM_LOADER,               /* device copies of loader batches */
    CT_MEM_CAT_COUNT
} ct_mem_cat;
const char *ct_mem_cat_name(ct_mem_cat c);   /* "params", "master", ... (summary keys) */

typedef struct ct_mem_stats {
    size_t current[CT_MEM_CAT_COUNT], peak[CT_MEM_CAT_COUNT];
    size_t current_total, peak_total;        /* all categories together (peak of the sum) */
    size_t reserved;                         /* device: bytes cudaMalloc'd (live + cached) */
    /* Pinned host memory (alloc_host_pinned) by the category it was asked for, counted apart:
     * on a device it is not device memory (ZeRO-Offload's master and optimizer state, the
     * loader's slots, offloaded activations). */
    size_t host_current[CT_MEM_CAT_COUNT], host_peak[CT_MEM_CAT_COUNT];
    size_t host_current_total, host_peak_total;
} ct_mem_stats;

/* data.transform.on_device: the loader uploads uint8 pixels and the backend normalises (and
 * flips) them. Up to CT_NORM_MAX_CHANNELS channels. */
#define CT_NORM_MAX_CHANNELS 4
typedef struct ct_u8_normalize {
    int64_t n, c, h, w;                      /* x [n, c, h, w] uint8 */
    float mean[CT_NORM_MAX_CHANNELS];        /* y = (x / 255 - mean[ch]) / std[ch] */
    float std[CT_NORM_MAX_CHANNELS];
} ct_u8_normalize;

typedef struct ct_backend ct_backend;

/* ---- memory: allocation and synchronous copies ---- */
typedef struct ct_backend_mem {
    /* NULL on failure; 64-byte aligned. Bytes are counted under `cat` until freed. */
    void *(*alloc)(ct_backend *be, size_t bytes, ct_mem_cat cat);
    void (*free)(ct_backend *be, void *p);
    /* Page-locked host memory a copy (upload, download) may read or write, 64-byte aligned,
     * counted under `cat` in mem_stats' host figures (CPU: plain aligned memory); NULL on failure. */
    void *(*alloc_host_pinned)(ct_backend *be, size_t bytes, ct_mem_cat cat);
    void (*free_host_pinned)(ct_backend *be, void *p);
    /* Synchronous from the caller's view: src_host may be reused when it returns. */
    void (*copy_h2d)(ct_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*copy_d2h)(ct_backend *be, void *dst_host, const void *src, size_t bytes);
    void (*copy_d2d)(ct_backend *be, void *dst, const void *src, size_t bytes);
    void (*memset0)(ct_backend *be, void *p, size_t bytes);
    size_t (*peak_bytes)(ct_backend *be);                  /* device bytes at peak (0 for CPU) */
    void (*mem_stats)(ct_backend *be, ct_mem_stats *out);  /* per category (CPU: host bytes) */
} ct_backend_mem;

/* ---- the work queue: ordering marks and asynchronous copies ---- */
typedef struct ct_backend_queue {
    void (*sync)(ct_backend *be);                          /* wait for all queued work */
    /* A point in the work queued so far (CUDA: an event on the compute stream), > 0; 0 where
     * there is nothing to wait for (CPU). */
    uint64_t (*compute_mark)(ct_backend *be);
    /* Asynchronous upload straight from pinned memory (alloc_host_pinned): queued on the copy
     * stream, ordered before any op queued after this call that reads dst. after = 0: also after
     * every op queued before this call (dst may still be in use); after = a compute_mark: only
     * after the ops queued before that mark (dst was last read there), so the copy overlaps the
     * work queued since (the loader's double-buffered batches). src must stay untouched until
     * upload_done(ticket) is true. Returns the ticket (> 0). CPU: a memcpy, done at once. */
    uint64_t (*upload)(ct_backend *be, void *dst, const void *src_pinned, size_t bytes, uint64_t after);
    /* True when the upload with this ticket (and every earlier one) has finished reading its
     * source; wait: block until it has. */
    bool (*upload_done)(ct_backend *be, uint64_t ticket, bool wait);
    /* Asynchronous download into pinned memory (alloc_host_pinned), upload's twin: queued on the
     * copy stream. after = 0: after every op queued before this call (src's producers); after =
     * a compute_mark: only after the ops queued before that mark (src was last written there),
     * so the copy overlaps the work queued since, which must not write src. Ops queued after
     * this call run after the copy (they may overwrite or free src). dst_pinned holds the bytes
     * once download_done(ticket) is true. Returns the ticket (> 0). CPU: a memcpy, done at once. */
    uint64_t (*download)(ct_backend *be, void *dst_pinned, const void *src, size_t bytes,
                         uint64_t after);
    /* True when the download with this ticket has landed in dst_pinned; wait: block until it has.
     * Uploads and downloads draw tickets from one increasing sequence (one copy stream) and
     * finish in ticket order: done(t) implies every copy with an earlier ticket is done. */
    bool (*download_done)(ct_backend *be, uint64_t ticket, bool wait);

    /* Timing marks: a per-phase breakdown of queued work without a host sync per phase.
     * timer_mark returns a point in the compute queue (> 0; CUDA: a timing event recorded on the
     * compute stream; CPU: ops have finished when they return, so the mark is ct_now()). Marks
     * come from a ring of CT_TIMER_MARKS slots: a mark stays valid until CT_TIMER_MARKS newer
     * marks have been taken (ct_timer_mark_live). timer_elapsed returns the seconds from mark a
     * to mark b (negative when b comes first), waiting until the queue has passed both; NAN when
     * either mark is 0, was never handed out or has been recycled. Not during a capture. */
    uint64_t (*timer_mark)(ct_backend *be);
    double (*timer_elapsed)(ct_backend *be, uint64_t a, uint64_t b);

} ct_backend_queue;

/* Slots of the timing-mark ring: enough for every phase of a few steps between two reads. */
#define CT_TIMER_MARKS 256
/* The validity rule both backends apply: `last` is the newest mark handed out. */
static inline bool ct_timer_mark_live(uint64_t mark, uint64_t last) {
    return mark > 0 && mark <= last && last - mark < CT_TIMER_MARKS;
}

/* ---- whole-step capture ---- */
typedef struct ct_backend_capture {
    /* Whole-step capture (CUDA graphs); all NULL where unsupported (CPU).
     * begin: ops queued until end are recorded, not run (no op that returns a
     * host value, no alloc/free of memory used after the capture, no upload may be called in
     * between). end returns a handle (NULL and err filled if the capture failed);
     * replay queues the recorded work again with the same pointers and scalars. */
    int (*begin)(ct_backend *be, ct_err *err);
    void *(*end)(ct_backend *be, ct_err *err);
    void (*replay)(ct_backend *be, void *graph);
    void (*free)(ct_backend *be, void *graph);
} ct_backend_capture;

/* ---- kernels ---- */
/* ---- dtypes of op arguments ----
 * Ops that take `ct_dtype dt` read and write their ACTIVATION-like arguments (x, y, dx, dy,
 * col, img, logits, dlogits, pred) and the PARAMETERS they read (weights, bias, gamma, beta,
 * embedding table) in dt: CT_F32, CT_F16 or CT_BF16 (mixed precision keeps both in 16 bits,
 * core/optim/amp.h). Parameter GRADIENTS (dw, db, dgamma, dbeta, dtable), statistics (running and
 * saved mean/var), masks, indices, targets and everything of the optimizer are fp32 (int
 * where said). Arithmetic is fp32 (or wider); a 16-bit result is rounded once, to nearest
 * even, when stored, and 16-bit inputs are read exactly. */


/* ---- matrix products ---- */
typedef struct ct_backend_blas {
    /* GEMM: C[M,N] = alpha * op(A) op(B) + beta * C, row-major, fp32 accumulate.
     * op(A) is [M,K] (A is [K,M] when ta), op(B) is [K,N] (B is [N,K] when tb).
     * a and b share one dtype (F32, F16 or BF16); c is F32 or that dtype. Batched form: `batch`
     * GEMMs with element strides sa, sb, sc, all fp32. */
    void (*gemm)(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const void *a, ct_dtype a_dt, int64_t lda, const void *b, ct_dtype b_dt, int64_t ldb,
                 float beta, void *c, ct_dtype c_dt, int64_t ldc);
    void (*gemm_batched)(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda, int64_t sa, const float *b,
                         int64_t ldb, int64_t sb, float beta, float *c, int64_t ldc, int64_t sc,
                         int64_t batch);
    /* Optional fused linear layer (cuBLASLt epilogue on CUDA): y[rows, out] = act(x[rows, in]
     * w[out, in]^T + bias[out]); bias may be NULL. NULL op: the layer runs gemm + bias_act. */
    void (*linear_forward)(ct_backend *be, void *y, const void *x, const void *w, const void *bias,
                           int64_t rows, int64_t in, int64_t out, ct_act act, float alpha,
                           ct_dtype dt);

} ct_backend_blas;

/* Parameter initialisation draws (init_fill). */
typedef enum { CT_DRAW_CONSTANT, CT_DRAW_UNIFORM, CT_DRAW_NORMAL } ct_init_draw;
typedef struct ct_init_dist {
    ct_init_draw kind;
    double a, b;                 /* constant: a; uniform: [a, b); normal: mean a, std b */
} ct_init_dist;

/* ---- element-wise ---- */
typedef struct ct_backend_elt {
    void (*fill)(ct_backend *be, void *x, float v, int64_t n, ct_dtype dt);
    void (*scale)(ct_backend *be, void *x, float s, int64_t n, ct_dtype dt);          /* x *= s */
    void (*axpy)(ct_backend *be, void *y, float a, const void *x, int64_t n, ct_dtype dt); /* y += a x */
    void (*add)(ct_backend *be, void *y, const void *a, const void *b, int64_t n, ct_dtype dt); /* y = a + b */
    /* y[r, col0 + j] = x[r, j] for r < rows, j < cols (strided row copy; concat and its backward).
     * accumulate: y += x instead of y = x. */
    void (*copy_rows)(ct_backend *be, void *y, int64_t ldy, const void *x, int64_t ldx,
                      int64_t rows, int64_t cols, bool accumulate, ct_dtype dt);
    /* y = x converted between any two of F32, F16, BF16 (n elements; same dtype: a copy). */
    void (*cast)(ct_backend *be, void *y, ct_dtype y_dt, const void *x, ct_dtype x_dt, int64_t n);
    /* x[n] (fp32) rounded in place to the nearest value of dt (CT_F16 or CT_BF16; CT_F32:
     * nothing): round to nearest even, overflow -> +-inf, underflow -> subnormal or signed zero,
     * NaN stays NaN. */
    void (*round_to)(ct_backend *be, float *x, int64_t n, ct_dtype dt);
    /* data.transform.on_device: y [n, c, h, w] (dt) = normalised x (uint8, same shape);
     * flip[i] != 0 mirrors sample i left-right (flip may be NULL: none). */
    void (*normalize_u8)(ct_backend *be, void *y, const uint8_t *x, const uint8_t *flip,
                         const ct_u8_normalize *p, ct_dtype dt);

    /* x[rows, cols] += bias[cols] broadcast over rows; then the activation in place.
     * With "inner" > 1 the layout is [rows, cols, inner] (bias per channel of NCHW).
     * bias may be NULL (activation only). */
    void (*bias_act_forward)(ct_backend *be, void *x, const void *bias, int64_t rows, int64_t cols,
                             int64_t inner, ct_act act, float alpha, ct_dtype dt);
    /* db[cols] (fp32) += sum over rows (and inner) of dy. */
    void (*bias_backward)(ct_backend *be, float *db, const void *dy, int64_t rows, int64_t cols,
                          int64_t inner, ct_dtype dt);
    /* y = act(x); dx = dy * act'(x) (y is act(x), given because some derivatives use it).
     * dx may alias dy; y may alias x in the forward. In the backward, x may be NULL for
     * relu, leaky_relu (alpha > 0), tanh and sigmoid, and y may be NULL for every other. */
    void (*act_forward)(ct_backend *be, void *y, const void *x, int64_t n, ct_act act, float alpha,
                        ct_dtype dt);
    void (*act_backward)(ct_backend *be, void *dx, const void *dy, const void *x, const void *y,
                         int64_t n, ct_act act, float alpha, ct_dtype dt);

    /* Dropout: y = x * mask / (1 - p); mask bit i drawn from ct_rng_at(seed, CT_RNG_DROPOUT,
     * stream, i) < p * 2^32 -> dropped. mask (uint8) is stored for backward (1 = kept).
     * p >= 1 drops everything (y = 0). */
    void (*dropout_forward)(ct_backend *be, void *y, uint8_t *mask, const void *x, int64_t n,
                            float p, uint64_t seed, uint64_t stream, ct_dtype dt);
    void (*dropout_backward)(ct_backend *be, void *dx, const void *dy, const uint8_t *mask,
                             int64_t n, float p, ct_dtype dt);

    /* Parameter initialisation: x[0, n) (fp32) holds draws first .. first + n - 1 of d; draw i
     * depends only on (seed, stream, i), so any thread count, any slice of a tensor (a ZeRO
     * shard initialises only its own part) and the GPU give the same values. With
     * w = ct_philox4x32(key, {i_lo, i_hi, stream_lo, stream_hi}) and key the one ct_rng_init
     * derives for (seed, CT_RNG_INIT, stream) (so w.v[k] = ct_rng_at(seed, CT_RNG_INIT, stream,
     * 4 i + k)), and everything in double until the one rounding to float:
     *   constant: x[i] = (float)a
     *   uniform:  u = w0 * 2^-32;                    x[i] = (float)(a + (b - a) * u)
     *   normal:   u1 = (w0 + 1) * 2^-32 in (0, 1],  u2 = w1 * 2^-32,
     *             z = sqrt(-2 ln u1) * cos(2 pi u2); x[i] = (float)(a + b * z)
     * Constant and uniform are bitwise the same on every backend. ln and cos are not correctly
     * rounded anywhere: the CPU evaluates them with its own routines (cpu_init.c, within ~1 ulp
     * of double, the same bits on every x86-64 and for every libm), CUDA with its log and cospi,
     * so normal draws agree within 2 ulp of float. */
    void (*init_fill)(ct_backend *be, float *x, int64_t first, int64_t n, const ct_init_dist *d,
                      uint64_t seed, uint64_t stream);
    /* SwiGLU (Llama's MLP): each row of x [rows, 2f] holds the gate (columns [0, f)) and the up
     * projection ([f, 2f)) of one fused linear; y [rows, f] = silu(gate) * up, silu(g) =
     * g / (1 + exp(-g)). Backward: dx [rows, 2f] written: d gate = dy * up * silu'(gate),
     * d up = dy * silu(gate). */
    void (*swiglu_forward)(ct_backend *be, void *y, const void *x, int64_t rows, int64_t f, ct_dtype dt);
    void (*swiglu_backward)(ct_backend *be, void *dx, const void *dy, const void *x, int64_t rows,
                            int64_t f, ct_dtype dt);

} ct_backend_elt;

/* ---- convolution and pooling ---- */
typedef struct ct_backend_conv {
    /* col[(c/groups per group) * kh * kw, oh * ow] for one image and one group.
     * img points at the image [c, h, w] (all channels); group selects channels
     * group * c/groups onwards. Row (ci * kh + ky) * kw + kx, column oy * ow + ox. */
    void (*im2col)(ct_backend *be, void *col, const void *img, const ct_conv2d_geom *g,
                   int64_t group, ct_dtype dt);
    /* img += col2im(col) for one image and one group (img must be zeroed by the caller first).
     * The sum is formed in fp32 and stored once. */
    void (*col2im)(ct_backend *be, void *img, const void *col, const ct_conv2d_geom *g,
                   int64_t group, ct_dtype dt);
    /* Optional whole-batch convolution; NULL makes the conv2d layer run im2col + gemm per image
     * and group instead.
     *   forward:  y [n, oc, oh, ow] = conv(x [n, c, h, w], w [oc, c/groups, kh, kw]) + bias[oc]
     *             (bias may be NULL)
     *   backward: dw += dL/dw and db += dL/dbias (fp32, summed over the batch in a fixed order;
     *             db may be NULL); dx = dL/dx, overwritten (dx may be NULL). */
    void (*conv2d_forward)(ct_backend *be, void *y, const void *x, const void *w,
                           const void *bias, const ct_conv2d_geom *g, ct_dtype dt);
    void (*conv2d_backward)(ct_backend *be, void *dx, float *dw, float *db, const void *dy,
                            const void *x, const void *w, const ct_conv2d_geom *g, ct_dtype dt);

    /* Optional: conv2d with the activation that follows it fused into the same pass over the
     * output (act: CT_ACT_RELU; CT_ACT_NONE is the plain conv).
     *   forward:  y = act(conv(x, w) + bias), bitwise what conv2d_forward then act_forward give
     *   backward: dy is the gradient of act's output and y that output (the mask's source); the
     *             rest as conv2d_backward, bitwise what act_backward then conv2d_backward give.
     * NULL (CUDA, or CTRAIN_CPU_FUSE=0): the graph runs the two layers apart (core/graph/fuse.c). */
    void (*conv2d_act_forward)(ct_backend *be, void *y, const void *x, const void *w,
                               const void *bias, const ct_conv2d_geom *g, ct_act act, ct_dtype dt);
    void (*conv2d_act_backward)(ct_backend *be, void *dx, float *dw, float *db, const void *dy,
                                const void *y, const void *x, const void *w, const ct_conv2d_geom *g,
                                ct_act act, ct_dtype dt);
    /* Optional: conv2d_act_forward/backward with the 2x2, stride-2, unpadded max-pool of its
     * output in the same pass (ph = oh / 2, pw = ow / 2; rows and columns past 2 ph, 2 pw are
     * dropped, as maxpool2d_forward drops them). The full-size activation is neither written nor
     * read: per image it stays in the backend's scratch.
     *   forward:  y [n, oc, ph, pw] and argmax [n, oc, ph, pw] are what maxpool2d_forward writes
     *             over act(conv(x, w) + bias) stored in dt (16-bit: the values are rounded before
     *             they are compared, so ties fall where the unfused pool sees them)
     *   backward: dy [n, oc, ph, pw] is the pool's output gradient, y its output (act's mask: the
     *             selected element's activation), argmax forward's; the rest as conv2d_backward,
     *             bitwise what maxpool2d_backward, act_backward, conv2d_backward give in turn.
     * NULL (CUDA, or CTRAIN_CPU_FUSE=0): the max-pool runs as a layer of its own. */
    void (*conv2d_act_pool_forward)(ct_backend *be, void *y, int32_t *argmax, const void *x,
                                    const void *w, const void *bias, const ct_conv2d_geom *g,
                                    ct_act act, ct_dtype dt);
    void (*conv2d_act_pool_backward)(ct_backend *be, void *dx, float *dw, float *db, const void *dy,
                                     const void *y, const int32_t *argmax, const void *x,
                                     const void *w, const ct_conv2d_geom *g, ct_act act, ct_dtype dt);

    /* Pooling. */
    /* argmax[n, c, oh, ow] = iy * w + ix inside the input plane (PyTorch's indices); may be
     * NULL in eval. Padding counts as -inf, the first maximum in window order wins, NaN wins. */
    void (*maxpool2d_forward)(ct_backend *be, void *y, int32_t *argmax, const void *x,
                              const ct_pool2d_geom *g, ct_dtype dt);
    void (*maxpool2d_backward)(ct_backend *be, void *dx, const void *dy, const int32_t *argmax,
                               const ct_pool2d_geom *g, ct_dtype dt);   /* dx written (zeroed first) */
    void (*avgpool2d_forward)(ct_backend *be, void *y, const void *x, const ct_pool2d_geom *g,
                              ct_dtype dt);
    void (*avgpool2d_backward)(ct_backend *be, void *dx, const void *dy, const ct_pool2d_geom *g,
                               ct_dtype dt);                            /* dx written (zeroed first) */

} ct_backend_conv;

/* ---- normalization ---- */
typedef struct ct_backend_norm {
    /* Statistics in fp32/fp64 internally; running/saved stats fp32. */
    /* BatchNorm over [N, C, HW]. train: batch statistics, saves mean and inv_std[C], updates
     * running stats with momentum (PyTorch: unbiased variance in running_var). eval: uses running.
     * gamma/beta may be NULL (affine off); running stats may be NULL in train (not tracked);
     * save_* may be NULL in eval. Backward: dgamma/dbeta accumulate, either may be NULL, and dx
     * may be NULL (parameter gradients only). */
    void (*batchnorm_forward)(ct_backend *be, void *y, const void *x, const void *gamma,
                              const void *beta, float *running_mean, float *running_var,
                              float *save_mean, float *save_invstd, int64_t n, int64_t c, int64_t hw,
                              float eps, float momentum, bool train, ct_dtype dt);
    void (*batchnorm_backward)(ct_backend *be, void *dx, float *dgamma, float *dbeta, const void *dy,
                               const void *x, const void *gamma, const float *save_mean,
                               const float *save_invstd, int64_t n, int64_t c, int64_t hw,
                               ct_dtype dt);
    /* LayerNorm over the last dimension d of [rows, d]; saves mean and rstd[rows].
     * gamma/beta may be NULL; backward: dgamma/dbeta accumulate (either may be NULL), dx may be
     * NULL. */
    void (*layernorm_forward)(ct_backend *be, void *y, float *save_mean, float *save_rstd,
                              const void *x, const void *gamma, const void *beta, int64_t rows,
                              int64_t d, float eps, ct_dtype dt);
    void (*layernorm_backward)(ct_backend *be, void *dx, float *dgamma, float *dbeta, const void *dy,
                               const void *x, const void *gamma, const float *save_mean,
                               const float *save_rstd, int64_t rows, int64_t d, ct_dtype dt);
    /* RMSNorm over the last dimension d of [rows, d] (Llama's): y = x * rstd * gamma with
     * rstd = 1 / sqrt(mean_j x_j^2 + eps) (the mean in double), saved as save_rstd[rows] (fp32);
     * gamma may be NULL (no weight). Backward: dgamma[d] (fp32) += sum over rows of
     * dy * x * rstd (may be NULL); dx = rstd * (g - x * rstd^2 * mean_j(g_j x_j)) with
     * g = dy * gamma, written (may be NULL). */
    void (*rmsnorm_forward)(ct_backend *be, void *y, float *save_rstd, const void *x, const void *gamma,
                            int64_t rows, int64_t d, float eps, ct_dtype dt);
    void (*rmsnorm_backward)(ct_backend *be, void *dx, float *dgamma, const void *dy, const void *x,
                             const void *gamma, const float *save_rstd, int64_t rows, int64_t d,
                             ct_dtype dt);

} ct_backend_norm;

/* ---- embedding lookup ---- */
typedef struct ct_backend_embed {
    void (*embedding_forward)(ct_backend *be, void *y, const int32_t *ids, const void *table,
                              int64_t n_ids, int64_t dim, ct_dtype dt);
    /* dtable (fp32) += scatter(dy); deterministic (no atomics). An id outside [0, vocab) reads
     * as a zero row and receives no gradient (the data pipeline validates ids). */
    void (*embedding_backward)(ct_backend *be, float *dtable, const void *dy, const int32_t *ids,
                               int64_t n_ids, int64_t vocab, int64_t dim, ct_dtype dt);

} ct_backend_embed;

/* ---- attention ---- */
typedef struct ct_backend_attn {
    /* Causal multi-head scaled-dot-product attention over a fused qkv projection, B sequences of
     * T tokens, H heads of D (C = H * D, D <= 128):
     *   qkv [B, T, 3, H, D] (dt): per token q, then k, then v (a linear layer with out = 3C);
     *   y   [B, T, H, D]    (dt): y[b,t,h] = sum_{j <= t} P[b,h,t,j] * keep(b,h,t,j) * v[b,j,h],
     *   P[b,h,t,:] = softmax_j (q[b,t,h] . k[b,j,h] / sqrt(D)) over j <= t;
     *   lse [B, H, T] (fp32, written): the natural log-sum-exp of each row's scaled scores, all
     *   backward keeps: it recomputes the scores from q and k, no T x T matrix is stored.
     * Attention dropout with probability p (0: none): keep(b,h,t,j) = 0 when
     * ct_rng_at(seed, CT_RNG_DROPOUT, stream, e) < p * 2^32 for e = ((b H + h) T + t) T + j (the
     * rule of dropout_forward, element e), else 1 / (1 - p); backward draws the same words.
     * Scores, softmax and sums are fp32 whatever dt is; one rounding per 16-bit store;
     * deterministic (no atomics, a fixed order of every sum). */
    void (*causal_attention_forward)(ct_backend *be, void *y, float *lse, const void *qkv, int64_t B,
                                     int64_t T, int64_t H, int64_t D, float p, uint64_t seed,
                                     uint64_t stream, ct_dtype dt);
    /* dqkv [B, T, 3, H, D] (dt) WRITTEN (dq, dk, dv) from dy [B, T, H, D], the forward's qkv, y and
     * lse, and the same p, seed, stream. dqkv may not alias qkv, y or dy. */
    void (*causal_attention_backward)(ct_backend *be, void *dqkv, const void *dy, const void *qkv,
                                      const void *y, const float *lse, int64_t B, int64_t T, int64_t H,
                                      int64_t D, float p, uint64_t seed, uint64_t stream, ct_dtype dt);
    /* Rotary position embeddings and grouped-query heads, between a fused projection and
     * causal_attention_forward: x [B, T, H + 2 KV, D] (dt) holds per token the q of H heads, the k
     * of KV heads and the v of KV heads (KV divides H); qkv [B, T, 3, H, D] (dt, written) is the
     * attention's input: q and k rotated, k and v of kv head g serving query heads
     * g H/KV .. (g + 1) H/KV - 1 (Hugging Face's repeat_kv). Rotation (Hugging Face's half-split
     * "rotate_half" layout, D even; none when r->theta is 0): element i < D/2 of a head and
     * element i + D/2 are turned by the angle a = (float)(r->pos0 + t) * f_i, with
     *   f_i = (float)(1 / (float)pow(theta, (float)(2 i) / (float)D)) / r->factor (fp32 steps),
     *   y_i = x_i cos a - x_{i+D/2} sin a,   y_{i+D/2} = x_{i+D/2} cos a + x_i sin a,
     * cos a and sin a of the fp32 angle rounded to fp32 (what transformers computes in fp32).
     * Backward: dx [B, T, H + 2 KV, D] WRITTEN from dqkv: rotated back by -a and summed over the
     * H/KV query heads of each kv head in head order, in fp32 with one rounding. */
    void (*rope_gqa_forward)(ct_backend *be, void *qkv, const void *x, int64_t B, int64_t T, int64_t H,
                             int64_t KV, int64_t D, const ct_rope *r, ct_dtype dt);
    void (*rope_gqa_backward)(ct_backend *be, void *dx, const void *dqkv, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D, const ct_rope *r, ct_dtype dt);
    /* Attention of new tokens over a key/value cache (generation: core/train/generate.c). B
     * sequences whose T new tokens sit at positions pos0 .. pos0 + T - 1 (pos0 + T <= cap); qkv
     * [B, T, 3, H, D] (dt) is their attention input as causal_attention_forward reads it (q and k
     * already rotated, k and v repeated over each kv head's H/KV query heads: rope_gqa_forward's
     * output, or the fused projection itself when KV = H without rotation). kv (dt) holds the
     * cache: K [B, KV, cap, D], then V [B, KV, cap, D] (one kv head's rows of D contiguous).
     * First the new tokens' k and v are stored: K[b, g, pos0 + t] = k of query head g H/KV of token
     * (b, t), V the same from v (copied as stored, no rounding); no other element of kv changes.
     * Then, unless y is NULL (store only: a prefill whose attention ran as
     * causal_attention_forward), y [B, T, H, D] (dt) is written:
     *   y[b,t,h] = sum_{j <= pos0 + t} P_j V[b, g, j],  P = softmax_j (q[b,t,h] . K[b, g, j] / sqrt(D)),
     * g = h / (H/KV): causal attention whose keys before pos0 come from the cache. No dropout.
     * Scores, softmax and sums in fp32, one rounding per 16-bit store, deterministic. */
    void (*kv_attention_forward)(ct_backend *be, void *y, void *kv, const void *qkv, int64_t B, int64_t T,
                                 int64_t pos0, int64_t cap, int64_t H, int64_t KV, int64_t D, ct_dtype dt);
} ct_backend_attn;

/* ---- losses ---- */
typedef struct ct_backend_loss {
    /* Mean over the batch; write dlogits = d(loss_mean)/dlogits * grad_scale.
     * The results stay in backend memory so a step can be queued (and captured) without waiting:
     * result[0] = mean loss, result[1] = correct argmax predictions (cross entropy; 0 for the
     * others), both fp32 (counts are exact below 2^24 rows); read them with copy_d2h.
     * softmax_xent = torch.nn.functional.cross_entropy(label_smoothing=eps): per row
     * (1 - eps) * -log p[label] + eps * mean_j(-log p[j]); a label < 0 (or >= classes) is
     * ignored like ignore_index: no loss, no gradient, not counted in the mean. MSE and BCE
     * average over all n_rows * n_cols elements; their targets are fp32. dlogits/dpred may be
     * NULL (loss only). Softmax and the sums are fp32 whatever dt is.
     * softmax_xent's rows are ld >= classes elements apart: the columns [classes, ld) are a
     * padded vocabulary's rows (GPT-2's 50257 padded to 50304), never predicted: no probability,
     * not the argmax, gradient 0. Every loss may write its gradient over its input
     * (dlogits == logits, dpred == pred): a vocabulary-sized logits buffer then holds its own
     * gradient, and the planner counts one buffer, not two. */
    void (*softmax_xent)(ct_backend *be, void *dlogits, float *result, const void *logits,
                         const int32_t *labels, int64_t rows, int64_t classes, int64_t ld,
                         float label_smoothing, float grad_scale, ct_dtype dt);
    void (*mse_loss)(ct_backend *be, void *dpred, float *result, const void *pred,
                     const float *target, int64_t n_rows, int64_t n_cols, float grad_scale,
                     ct_dtype dt);
    void (*bce_logits_loss)(ct_backend *be, void *dlogits, float *result, const void *logits,
                            const float *target, int64_t n_rows, int64_t n_cols, float grad_scale,
                            ct_dtype dt);

} ct_backend_loss;

/* ---- optimizer: reductions and fused updates ---- */
typedef struct ct_backend_optim {
    /* Reductions over fp32 gradients (results to host; deterministic). */
    double (*sum_squares)(ct_backend *be, const float *x, int64_t n);
    bool (*all_finite)(ct_backend *be, const float *x, int64_t n);

    /* Fused updates of fp32 master weights. */
    void (*adam_step)(ct_backend *be, float *param, const float *grad, float *m, float *v, int64_t n,
                      const ct_adam_args *a);
    void (*sgd_step)(ct_backend *be, float *param, const float *grad, float *mom, int64_t n,
                     const ct_sgd_args *a);
    /* Lamb, per parameter tensor: writes the Adam-style update direction into upd and returns
     * ||param|| and ||upd|| in *w_norm_host, *u_norm_host. The caller computes the trust ratio
     * and applies param -= lr * trust * upd with axpy. */
    void (*lamb_direction)(ct_backend *be, float *upd, const float *param, const float *grad,
                           float *m, float *v, int64_t n, const ct_lamb_args *a,
                           double *w_norm_host, double *u_norm_host);
} ct_backend_optim;

/* The op table, grouped by concern: be->mem.alloc(be, ...), be->blas.gemm(be, ...). It crosses
 * the dlopen boundary of libctrain_cuda.so, so its layout is versioned: CT_BACKEND_ABI changes
 * whenever a member is added, removed, reordered or changes signature, and a CUDA library built
 * against another version is refused when it is loaded (backend.c). */
#define CT_BACKEND_ABI 13
struct ct_backend {
    const char *name;            /* "cpu", "cuda", "capped" (the CPU's capped device) */
    char device_desc[128];       /* "x86-64, 2 threads, OpenBLAS 0.3.21" / "NVIDIA H100 ... sm_90" */
    char pci_bus_id[32];         /* a GPU's "0000:3B:00.0" (NVML finds it by this); "" on the CPU */
    void *impl;                  /* backend-private state (thread pool, streams, allocator) */
    int threads;                 /* CPU: worker threads in use */
    size_t memory_bytes;         /* the device's memory (a GPU's total, the capped device's cap);
                                    0: host memory, no capacity of its own */
    void (*destroy)(ct_backend *be);

    ct_backend_mem mem;
    ct_backend_queue queue;
    ct_backend_capture capture;
    ct_backend_blas blas;
    ct_backend_elt elt;
    ct_backend_conv conv;
    ct_backend_norm norm;
    ct_backend_embed embed;
    ct_backend_attn attn;
    ct_backend_loss loss;
    ct_backend_optim optim;
};

/* Where a buffer lives: the device memory of `be`, or host memory beside it, from which `host`
 * (a CPU backend) computes: pinned by `be` (alloc_host_pinned: its copies may read and write it) or
 * `host`'s own memory. ZeRO-Offload keeps the fp32 master, the gradients it accumulates and the
 * optimizer state in host memory (core/params/store.h, core/optim/optim.h). */
typedef struct ct_mem_place {
    ct_backend *be;              /* the training device */
    ct_backend *host;            /* NULL: device memory; else host memory, computed on by host */
    bool pinned;                 /* host memory: pinned by be, else host's */
} ct_mem_place;

static inline ct_mem_place ct_mem_device(ct_backend *be) { return (ct_mem_place){be, NULL, false}; }
/* The backend whose ops read and write the place's memory. */
static inline ct_backend *ct_place_ops(const ct_mem_place *m) { return m->host ? m->host : m->be; }
static inline void *ct_place_alloc(const ct_mem_place *m, size_t bytes, ct_mem_cat cat) {
    if (!m->host) return m->be->mem.alloc(m->be, bytes, cat);
    return m->pinned ? m->be->mem.alloc_host_pinned(m->be, bytes, cat) : m->host->mem.alloc(m->host, bytes, cat);
}
static inline void ct_place_free(const ct_mem_place *m, void *p) {
    if (!p) return;
    if (!m->host) m->be->mem.free(m->be, p);
    else if (m->pinned) m->be->mem.free_host_pinned(m->be, p);
    else m->host->mem.free(m->host, p);
}
static inline void ct_place_zero(const ct_mem_place *m, void *p, size_t bytes) {
    ct_backend *ops = ct_place_ops(m);
    ops->mem.memset0(ops, p, bytes);
}

/* A function the library of backend `be` exports besides its op table (the CUDA library's NCCL
 * communicator: core/dist/comm_open.c), or NULL: none such, or a backend compiled into ctrain. */
void *ct_backend_symbol(ct_backend *be, const char *name);

/* Free a backend made by ct_backend_create (core/device/device.h) or a backend's own create. */
void ct_backend_destroy(ct_backend *be);

/* What a backend's memory is, for the code that moves state between host and device:
 * separate: not the host's (a GPU, the capped device): copies go through uploads, downloads and
 * staging; host_addressable: host code may read and write it (the CPU, the capped device), so the
 * MPI communicator runs on it; cpu_kernels: its ops are the CPU backend's kernels (the CPU, the
 * capped device). */
bool ct_backend_separate_memory(const ct_backend *be);
bool ct_backend_host_addressable(const ct_backend *be);
bool ct_backend_cpu_kernels(const ct_backend *be);

#endif

/* backend.h: the op table every backend implements.
 *
 * Layers, the executor and the optimizer call only these functions; no layer contains a device
 * #ifdef. The CPU backend (core/cpu/) is the reference: every CUDA op is tested against it.
 *
 * Conventions
 *  - All pointers are in the backend's memory space (host memory for CPU) unless named *_host.
 *  - Sizes and counts are int64_t; matrices are row-major; "ld" is the row stride in elements.
 *  - Activations are fp32 in this version; GEMM and cast take dtypes so mixed precision can store
 *    params/activations in 16 bits with fp32 accumulation (see docs/DESIGN-NOTES.md).
 *  - Every op is deterministic: the same inputs give the same bits whatever the thread count
 *    (reductions use a fixed chunking; no atomics).
 *  - Ops that take `seed`/`stream` draw random numbers with ct_rng_at() (core/rng.h), so CPU and
 *    GPU produce the same masks.
 *  - Backward ops ACCUMULATE into parameter gradients (dw += ...) and WRITE input gradients
 *    (dx = ...) unless their comment says otherwise.
 */
#ifndef CT_BACKEND_H
#define CT_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "core/common.h"
#include "core/tensor.h"

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

/* 2-D pooling geometry (NCHW). */
typedef struct ct_pool2d_geom {
    int64_t n, c, h, w;
    int64_t kh, kw, stride_h, stride_w, pad_h, pad_w;
    int64_t oh, ow;
    bool count_include_pad;      /* avgpool: PyTorch default true */
} ct_pool2d_geom;

/* Fused optimizer step arguments. grad_scale multiplies every gradient before use: it folds
 * 1/loss_scale, gradient_predivide and the global-norm clip coefficient into one pass. */
typedef struct ct_adam_args {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_c1, bias_c2;      /* 1 - beta1^t, 1 - beta2^t (1, 1 without bias correction) */
    float grad_scale;
    bool decoupled;              /* AdamW-style weight decay (adam_w_mode) */
} ct_adam_args;

typedef struct ct_sgd_args {
    float lr, momentum, dampening, weight_decay;
    float grad_scale;
    bool nesterov;
    bool first_step;             /* momentum buffer initialised to the gradient, as torch does */
} ct_sgd_args;

typedef struct ct_lamb_args {
    float beta1, beta2, eps, weight_decay;
    float bias_c1, bias_c2;
    float grad_scale;
    bool eps_inside_sqrt;
} ct_lamb_args;

typedef struct ct_backend ct_backend;
struct ct_backend {
    const char *name;            /* "cpu", "cuda" */
    char device_desc[128];       /* "x86-64, 2 threads, OpenBLAS 0.3.21" / "NVIDIA H100 ... sm_90" */
    void *impl;                  /* backend-private state (thread pool, streams, allocator) */
    int threads;                 /* CPU: worker threads in use */

    void (*destroy)(ct_backend *be);

    /* ---- memory ---- */
    void *(*alloc)(ct_backend *be, size_t bytes);          /* NULL on failure; 64-byte aligned */
    void (*free)(ct_backend *be, void *p);
    void *(*alloc_host_pinned)(ct_backend *be, size_t bytes); /* CPU: plain aligned memory */
    void (*free_host_pinned)(ct_backend *be, void *p);
    void (*copy_h2d)(ct_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*copy_d2h)(ct_backend *be, void *dst_host, const void *src, size_t bytes);
    void (*copy_d2d)(ct_backend *be, void *dst, const void *src, size_t bytes);
    void (*memset0)(ct_backend *be, void *p, size_t bytes);
    void (*sync)(ct_backend *be);                          /* wait for all queued work */
    size_t (*peak_bytes)(ct_backend *be);                  /* device bytes at peak (0 for CPU) */

    /* ---- GEMM: C[M,N] = alpha * op(A) op(B) + beta * C, row-major, fp32 accumulate.
     * op(A) is [M,K] (A is [K,M] when ta), op(B) is [K,N] (B is [N,K] when tb).
     * a/b/c dtypes: CT_F32 everywhere in this version; CT_F16/CT_BF16 inputs allowed where the
     * backend reports support. Batched form: `batch` GEMMs with element strides sa, sb, sc. */
    void (*gemm)(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const void *a, ct_dtype a_dt, int64_t lda, const void *b, ct_dtype b_dt, int64_t ldb,
                 float beta, void *c, ct_dtype c_dt, int64_t ldc);
    void (*gemm_batched)(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda, int64_t sa, const float *b,
                         int64_t ldb, int64_t sb, float beta, float *c, int64_t ldc, int64_t sc,
                         int64_t batch);

    /* ---- element-wise ---- */
    void (*fill)(ct_backend *be, float *x, float v, int64_t n);
    void (*scale)(ct_backend *be, float *x, float s, int64_t n);            /* x *= s */
    void (*axpy)(ct_backend *be, float *y, float a, const float *x, int64_t n); /* y += a x */
    void (*add)(ct_backend *be, float *y, const float *a, const float *b, int64_t n); /* y = a + b */
    /* y[r, col0 + j] = x[r, j] for r < rows, j < cols (strided row copy; concat and its backward).
     * accumulate: y += x instead of y = x. */
    void (*copy_rows)(ct_backend *be, float *y, int64_t ldy, const float *x, int64_t ldx,
                      int64_t rows, int64_t cols, bool accumulate);
    /* y = x (float) -> dtype, and back. n elements. */
    void (*cast)(ct_backend *be, void *y, ct_dtype y_dt, const void *x, ct_dtype x_dt, int64_t n);
    /* x[n] rounded in place to the nearest value of dt (CT_F16 or CT_BF16; CT_F32: nothing):
     * round to nearest even, overflow -> +-inf, underflow -> subnormal or signed zero, NaN stays
     * NaN. Mixed precision calls it on activations and their gradients, so fp32 storage holds
     * exactly the 16-bit values a GPU would hold (docs/DESIGN-NOTES.md, "Precision"). */
    void (*round_to)(ct_backend *be, float *x, int64_t n, ct_dtype dt);

    /* x[rows, cols] += bias[cols] broadcast over rows; then the activation in place.
     * With "inner" > 1 the layout is [rows, cols, inner] (bias per channel of NCHW).
     * bias may be NULL (activation only). */
    void (*bias_act_forward)(ct_backend *be, float *x, const float *bias, int64_t rows, int64_t cols,
                             int64_t inner, ct_act act, float alpha);
    /* db[cols] += sum over rows (and inner) of dy. */
    void (*bias_backward)(ct_backend *be, float *db, const float *dy, int64_t rows, int64_t cols,
                          int64_t inner);
    /* y = act(x); dx = dy * act'(x) (y is act(x), given because some derivatives use it).
     * dx may alias dy; y may alias x in the forward. In the backward, x may be NULL for
     * relu, leaky_relu (alpha > 0), tanh and sigmoid, and y may be NULL for every other. */
    void (*act_forward)(ct_backend *be, float *y, const float *x, int64_t n, ct_act act, float alpha);
    void (*act_backward)(ct_backend *be, float *dx, const float *dy, const float *x, const float *y,
                         int64_t n, ct_act act, float alpha);

    /* Dropout: y = x * mask / (1 - p); mask bit i drawn from ct_rng_at(seed, CT_RNG_DROPOUT,
     * stream, i) < p * 2^32 -> dropped. mask (uint8) is stored for backward (1 = kept).
     * p >= 1 drops everything (y = 0). */
    void (*dropout_forward)(ct_backend *be, float *y, uint8_t *mask, const float *x, int64_t n,
                            float p, uint64_t seed, uint64_t stream);
    void (*dropout_backward)(ct_backend *be, float *dx, const float *dy, const uint8_t *mask,
                             int64_t n, float p);

    /* ---- convolution support ---- */
    /* col[(c/groups per group) * kh * kw, oh * ow] for one image and one group.
     * img points at the image [c, h, w] (all channels); group selects channels
     * group * c/groups onwards. Row (ci * kh + ky) * kw + kx, column oy * ow + ox. */
    void (*im2col)(ct_backend *be, float *col, const float *img, const ct_conv2d_geom *g, int64_t group);
    /* img += col2im(col) for one image and one group (img must be zeroed by the caller first). */
    void (*col2im)(ct_backend *be, float *img, const float *col, const ct_conv2d_geom *g, int64_t group);
    /* Optional whole-batch convolution; NULL (the CUDA backend) makes the conv2d layer run
     * im2col + gemm per image and group instead. The CPU backend runs whole images in parallel
     * (a training step of small per-image ops spent its time handing each one to the threads).
     *   forward:  y [n, oc, oh, ow] = conv(x [n, c, h, w], w [oc, c/groups, kh, kw]) + bias[oc]
     *             (bias may be NULL)
     *   backward: dw += dL/dw and db += dL/dbias (summed over the batch in a fixed order, db
     *             in double as bias_backward does; db may be NULL); dx = dL/dx, overwritten (dx
     *             may be NULL). */
    void (*conv2d_forward)(ct_backend *be, float *y, const float *x, const float *w,
                           const float *bias, const ct_conv2d_geom *g);
    void (*conv2d_backward)(ct_backend *be, float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, const ct_conv2d_geom *g);

    /* ---- pooling ---- */
    /* argmax[n, c, oh, ow] = iy * w + ix inside the input plane (PyTorch's indices); may be
     * NULL in eval. Padding counts as -inf, the first maximum in window order wins, NaN wins. */
    void (*maxpool2d_forward)(ct_backend *be, float *y, int32_t *argmax, const float *x,
                              const ct_pool2d_geom *g);
    void (*maxpool2d_backward)(ct_backend *be, float *dx, const float *dy, const int32_t *argmax,
                               const ct_pool2d_geom *g);             /* dx written (zeroed first) */
    void (*avgpool2d_forward)(ct_backend *be, float *y, const float *x, const ct_pool2d_geom *g);
    void (*avgpool2d_backward)(ct_backend *be, float *dx, const float *dy,
                               const ct_pool2d_geom *g);             /* dx written (zeroed first) */

    /* ---- normalization (statistics in fp32/fp64 internally) ---- */
    /* BatchNorm over [N, C, HW]. train: batch statistics, saves mean and inv_std[C], updates
     * running stats with momentum (PyTorch: unbiased variance in running_var). eval: uses running.
     * gamma/beta may be NULL (affine off); running stats may be NULL in train (not tracked);
     * save_* may be NULL in eval. Backward: dgamma/dbeta accumulate, either may be NULL, and dx
     * may be NULL (parameter gradients only). */
    void (*batchnorm_forward)(ct_backend *be, float *y, const float *x, const float *gamma,
                              const float *beta, float *running_mean, float *running_var,
                              float *save_mean, float *save_invstd, int64_t n, int64_t c, int64_t hw,
                              float eps, float momentum, bool train);
    void (*batchnorm_backward)(ct_backend *be, float *dx, float *dgamma, float *dbeta, const float *dy,
                               const float *x, const float *gamma, const float *save_mean,
                               const float *save_invstd, int64_t n, int64_t c, int64_t hw);
    /* LayerNorm over the last dimension d of [rows, d]; saves mean and rstd[rows].
     * gamma/beta may be NULL; backward: dgamma/dbeta accumulate (either may be NULL), dx may be
     * NULL. */
    void (*layernorm_forward)(ct_backend *be, float *y, float *save_mean, float *save_rstd,
                              const float *x, const float *gamma, const float *beta, int64_t rows,
                              int64_t d, float eps);
    void (*layernorm_backward)(ct_backend *be, float *dx, float *dgamma, float *dbeta, const float *dy,
                               const float *x, const float *gamma, const float *save_mean,
                               const float *save_rstd, int64_t rows, int64_t d);

    /* ---- embedding ---- */
    void (*embedding_forward)(ct_backend *be, float *y, const int32_t *ids, const float *table,
                              int64_t n_ids, int64_t dim);
    /* dtable += scatter(dy); deterministic (no atomics). An id outside [0, vocab) reads as a
     * zero row and receives no gradient (the data pipeline validates ids). */
    void (*embedding_backward)(ct_backend *be, float *dtable, const float *dy, const int32_t *ids,
                               int64_t n_ids, int64_t vocab, int64_t dim);

    /* ---- losses: mean over the batch; write dlogits = d(loss_mean)/dlogits * grad_scale.
     * Returns nothing; loss (fp32 scalar) and, for cross entropy, the number of correct argmax
     * predictions are written to *loss_host / *correct_host after completion.
     * softmax_xent = torch.nn.functional.cross_entropy(label_smoothing=eps): per row
     * (1 - eps) * -log p[label] + eps * mean_j(-log p[j]); a label < 0 (or >= classes) is
     * ignored like ignore_index: no loss, no gradient, not counted in the mean. MSE and BCE
     * average over all n_rows * n_cols elements. dlogits/dpred may be NULL (loss only), and so
     * may correct_host. */
    void (*softmax_xent)(ct_backend *be, float *dlogits, float *loss_host, int64_t *correct_host,
                         const float *logits, const int32_t *labels, int64_t rows, int64_t classes,
                         float label_smoothing, float grad_scale);
    void (*mse_loss)(ct_backend *be, float *dpred, float *loss_host, const float *pred,
                     const float *target, int64_t n_rows, int64_t n_cols, float grad_scale);
    void (*bce_logits_loss)(ct_backend *be, float *dlogits, float *loss_host, const float *logits,
                            const float *target, int64_t n_rows, int64_t n_cols, float grad_scale);

    /* ---- reductions (results to host; deterministic) ---- */
    double (*sum_squares)(ct_backend *be, const float *x, int64_t n);
    bool (*all_finite)(ct_backend *be, const float *x, int64_t n);

    /* ---- fused optimizer updates on fp32 master weights ---- */
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
};

/* Create a backend by name: "cpu" or "cuda[:N]". threads: CPU workers (0 = all cores). */
int ct_backend_create(const char *device, int threads, ct_backend **out, ct_err *err);
void ct_backend_destroy(ct_backend *be);
/* True when a CUDA device is usable (driver present, device count > 0). */
bool ct_cuda_available(void);

/* The CPU backend, always compiled in. threads: pool workers and OpenBLAS threads (0 = online
 * cores). Returns NULL only when threads cannot be started. */
ct_backend *ct_cpu_backend_create(int threads);

#ifdef CT_HAVE_CUDA
/* Provided by cuda/ when the binary is built with nvcc. */
bool ct_cuda_probe(void);                                   /* driver present and >= 1 device */
ct_backend *ct_cuda_backend_create(int device, ct_err *err); /* NULL with err filled on failure */
#endif

#endif

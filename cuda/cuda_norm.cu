/* cuda_norm.cu: batch norm over [N, C, HW], layer norm over the last dimension, embeddings.
 *
 * Statistics in double, reduced in a fixed order (cuda_reduce.cuh for per-channel sums, fixed
 * block trees for per-row sums); the element formulas are core/cpu/cpu_norm.c's, so results agree
 * with the CPU reference to float rounding. Where a product feeds an addition that can cancel,
 * it is written __fmul_rn: the CPU (ISO C, no contraction) rounds every product, and nvcc's
 * default FMA contraction would not. Embedding backward sorts (id, position) pairs with a
 * stable radix sort and lets one warp own each distinct id: rows are summed in position order,
 * as on the CPU, with no atomics. */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"
#include "cuda/cuda_reduce.cuh"

#include <cub/device/device_radix_sort.cuh>

/* ---- batch norm ---- */

/* Per-channel values the normalisation kernels read. */
typedef struct {
    double mean;        /* batch mean (pass 1 result) */
    float scale, shift; /* forward: y = x * scale + shift */
    float mean_dy, mean_dy_xhat, g; /* backward */
} bn_chan;

template <typename T> struct bn_x_f {
    const T *x;
    int64_t c, hw;
    __device__ void operator()(int64_t r, int64_t ch, int64_t i, double *out) const {
        out[0] = ct_ld(x[(r * c + ch) * hw + i]);
    }
};
struct bn_mean_g {
    bn_chan *st;
    int64_t m;
    __device__ void operator()(int64_t ch, const double *s) const { st[ch].mean = s[0] / (double)m; }
};
template <typename T> struct bn_sq_f {
    const T *x;
    const bn_chan *st;
    int64_t c, hw;
    __device__ void operator()(int64_t r, int64_t ch, int64_t i, double *out) const {
        double d = (double)ct_ld(x[(r * c + ch) * hw + i]) - st[ch].mean;
        out[0] = d * d;
    }
};
template <typename T> struct bn_finish_g {
    bn_chan *st;
    const T *gamma, *beta;
    float *running_mean, *running_var, *save_mean, *save_invstd;
    int64_t m;
    float eps, momentum;
    __device__ void operator()(int64_t ch, const double *s) const {
        double var = s[0] / (double)m;
        float mean = (float)st[ch].mean;
        float invstd = (float)(1.0 / sqrt(var + (double)eps));
        if (save_mean) save_mean[ch] = mean;
        if (save_invstd) save_invstd[ch] = invstd;
        if (running_mean) running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * mean;
        if (running_var) {
            double unbiased = m > 1 ? s[0] / (double)(m - 1) : var;
            running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * (float)unbiased;
        }
        float scale = invstd * (gamma ? ct_ld(gamma[ch]) : 1.0f);
        st[ch].scale = scale;
        st[ch].shift = (beta ? ct_ld(beta[ch]) : 0.0f) - mean * scale;
    }
};

template <typename T>
__global__ void k_bn_eval_coef(bn_chan *st, const T *gamma, const T *beta,
                               const float *running_mean, const float *running_var, int64_t c,
                               float eps) {
    GRID_STRIDE(ch, c) {
        float mean = running_mean[ch];
        float invstd = (float)(1.0 / sqrt((double)running_var[ch] + (double)eps));
        float scale = invstd * (gamma ? ct_ld(gamma[ch]) : 1.0f);
        st[ch].scale = scale;
        st[ch].shift = (beta ? ct_ld(beta[ch]) : 0.0f) - mean * scale;
    }
}

template <typename T>
__global__ void k_bn_apply(T *y, const T *x, const bn_chan *st, int64_t total, int64_t c,
                           int64_t hw) {
    GRID_STRIDE(idx, total) {
        const bn_chan &s = st[(idx / hw) % c];
        y[idx] = ct_st<T>(ct_ld(x[idx]) * s.scale + s.shift);
    }
}

template <typename T>
static void bn_forward(ct_backend *be, T *y, const T *x, const T *gamma, const T *beta,
                       float *running_mean, float *running_var, float *save_mean,
                       float *save_invstd, int64_t n, int64_t c, int64_t hw, float eps,
                       float momentum, bool train) {
    bn_chan *st = (bn_chan *)CT_CUDA_SCRATCH(be, (size_t)c * sizeof(bn_chan));
    if (train) {
        int64_t m = n * hw;
        bn_x_f<T> fx = {x, c, hw};
        bn_mean_g gm = {st, m > 0 ? m : 1};
        ct_cuda_reduce_rci<1>(be, n, c, hw, fx, gm);
        bn_sq_f<T> fsq = {x, st, c, hw};
        bn_finish_g<T> gf = {st, gamma, beta, running_mean, running_var, save_mean, save_invstd,
                             m > 0 ? m : 1, eps, momentum};
        ct_cuda_reduce_rci<1>(be, n, c, hw, fsq, gf);
    } else {
        CT_CUDA_REQUIRE(running_mean && running_var, "batchnorm eval needs running statistics");
        LAUNCH(be, c, k_bn_eval_coef<T>, st, gamma, beta, running_mean, running_var, c, eps);
    }
    int64_t total = n * c * hw;
    LAUNCH(be, total, k_bn_apply<T>, y, x, st, total, c, hw);
    ct_cuda_scratch_free(be, st);
}

static void cu_batchnorm_forward(ct_backend *be, void *y, const void *x, const void *gamma,
                                 const void *beta, float *running_mean, float *running_var,
                                 float *save_mean, float *save_invstd, int64_t n, int64_t c,
                                 int64_t hw, float eps, float momentum, bool train, ct_dtype dt) {
    CT_CUDA_REQUIRE(n >= 0 && c >= 0 && hw >= 1, "batchnorm: bad shape");
    if (c == 0) return;
    CT_DT_DISPATCH(dt, T,
                   bn_forward<T>(be, (T *)y, (const T *)x, (const T *)gamma, (const T *)beta,
                                 running_mean, running_var, save_mean, save_invstd, n, c, hw, eps,
                                 momentum, train));
}

template <typename T> struct bn_bwd_f {
    const T *x, *dy;
    const float *mean, *invstd;
    int64_t c, hw;
    __device__ void operator()(int64_t r, int64_t ch, int64_t i, double *out) const {
        int64_t at = (r * c + ch) * hw + i;
        float xhat = (ct_ld(x[at]) - mean[ch]) * invstd[ch];
        float d = ct_ld(dy[at]);
        out[0] = d;
        out[1] = (double)d * xhat;
    }
};
template <typename T> struct bn_bwd_g {
    bn_chan *st;
    float *dgamma, *dbeta;
    const T *gamma;
    const float *invstd;
    int64_t m;
    __device__ void operator()(int64_t ch, const double *s) const {
        if (dgamma) dgamma[ch] += (float)s[1];
        if (dbeta) dbeta[ch] += (float)s[0];
        st[ch].g = (gamma ? ct_ld(gamma[ch]) : 1.0f) * invstd[ch];
        st[ch].mean_dy = (float)(s[0] / (double)m);
        st[ch].mean_dy_xhat = (float)(s[1] / (double)m);
    }
};

template <typename T>
__global__ void k_bn_dx(T *dx, const T *dy, const T *x, const float *mean,
                        const float *invstd, const bn_chan *st, int64_t total, int64_t c,
                        int64_t hw) {
    GRID_STRIDE(idx, total) {
        int64_t ch = (idx / hw) % c;
        const bn_chan &s = st[ch];
        float xhat = (ct_ld(x[idx]) - mean[ch]) * invstd[ch];
        dx[idx] = ct_st<T>(s.g * (ct_ld(dy[idx]) - s.mean_dy - xhat * s.mean_dy_xhat));
    }
}

template <typename T>
static void bn_backward(ct_backend *be, T *dx, float *dgamma, float *dbeta, const T *dy, const T *x,
                        const T *gamma, const float *save_mean, const float *save_invstd, int64_t n,
                        int64_t c, int64_t hw) {
    bn_chan *st = (bn_chan *)CT_CUDA_SCRATCH(be, (size_t)c * sizeof(bn_chan));
    int64_t m = n * hw;
    bn_bwd_f<T> f = {x, dy, save_mean, save_invstd, c, hw};
    bn_bwd_g<T> g = {st, dgamma, dbeta, gamma, save_invstd, m > 0 ? m : 1};
    ct_cuda_reduce_rci<2>(be, n, c, hw, f, g);
    if (dx) {
        int64_t total = n * c * hw;
        LAUNCH(be, total, k_bn_dx<T>, dx, dy, x, save_mean, save_invstd, st, total, c, hw);
    }
    ct_cuda_scratch_free(be, st);
}

static void cu_batchnorm_backward(ct_backend *be, void *dx, float *dgamma, float *dbeta,
                                  const void *dy, const void *x, const void *gamma,
                                  const float *save_mean, const float *save_invstd, int64_t n,
                                  int64_t c, int64_t hw, ct_dtype dt) {
    CT_CUDA_REQUIRE(n >= 0 && c >= 0 && hw >= 1, "batchnorm: bad shape");
    if (c == 0) return;
    CT_DT_DISPATCH(dt, T,
                   bn_backward<T>(be, (T *)dx, dgamma, dbeta, (const T *)dy, (const T *)x,
                                  (const T *)gamma, save_mean, save_invstd, n, c, hw));
}

/* ---- layer norm: one block per row ---- */

#define LN_THREADS 128

template <typename T>
__global__ void k_ln_fwd(T *y, float *save_mean, float *save_rstd, const T *x, const T *gamma,
                         const T *beta, int64_t d, float eps) {
    __shared__ double sh[32];
    int64_t r = blockIdx.x;
    const T *xr = x + r * d;
    T *yr = y + r * d;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += ct_ld(xr[j]);
    double mean = ct_block_sum(s, sh) / (double)d;
    double sq = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        double t = (double)ct_ld(xr[j]) - mean;
        sq += t * t;
    }
    sq = ct_block_sum(sq, sh);
    float fmean = (float)mean;
    float rstd = (float)(1.0 / sqrt(sq / (double)d + (double)eps));
    if (threadIdx.x == 0) {
        if (save_mean) save_mean[r] = fmean;
        if (save_rstd) save_rstd[r] = rstd;
    }
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float v = (ct_ld(xr[j]) - fmean) * rstd;
        yr[j] = ct_st<T>(__fmul_rn(v, gamma ? ct_ld(gamma[j]) : 1.0f) + (beta ? ct_ld(beta[j]) : 0.0f));
    }
}

template <typename T>
__global__ void k_ln_bwd_dx(T *dx, const T *dy, const T *x, const T *gamma, const float *mean,
                            const float *rstd, int64_t d) {
    __shared__ double sh[32];
    int64_t r = blockIdx.x;
    const T *xr = x + r * d, *dyr = dy + r * d;
    T *dxr = dx + r * d;
    float mu = mean[r], rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        float g = __fmul_rn(ct_ld(dyr[j]), gamma ? ct_ld(gamma[j]) : 1.0f);
        sg += g;
        sgx += (double)g * ((ct_ld(xr[j]) - mu) * rs);
    }
    sg = ct_block_sum(sg, sh);
    sgx = ct_block_sum(sgx, sh);
    float mean_g = (float)(sg / (double)d), mean_gx = (float)(sgx / (double)d);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        /* the CPU's rstd (g - mean_g - xhat mean_gx) with every product rounded on its own: an
         * FMA would keep dy gamma unrounded against mean_g, made from the rounded products, and
         * a constant row (g == mean_g, xhat == 0) would give rstd times that rounding error
         * instead of 0 */
        float g = __fmul_rn(ct_ld(dyr[j]), gamma ? ct_ld(gamma[j]) : 1.0f);
        float xhat = (ct_ld(xr[j]) - mu) * rs;
        dxr[j] = ct_st<T>(rs * (g - mean_g - __fmul_rn(xhat, mean_gx)));
    }
}

static void check_rows(int64_t rows) {
    CT_CUDA_REQUIRE(rows <= INT32_MAX, "layernorm: more than 2^31 rows");
}

static void cu_layernorm_forward(ct_backend *be, void *y, float *save_mean, float *save_rstd,
                                 const void *x, const void *gamma, const void *beta, int64_t rows,
                                 int64_t d, float eps, ct_dtype dt) {
    if (d <= 0 || rows <= 0) return;
    check_rows(rows);
    CT_DT_DISPATCH(dt, T, {
        k_ln_fwd<T><<<(unsigned)rows, LN_THREADS, 0, ct_cuda_stream(be)>>>(
            (T *)y, save_mean, save_rstd, (const T *)x, (const T *)gamma, (const T *)beta, d, eps);
        CT_CUDA_LAUNCH_CHECK();
    });
}

template <typename T> struct ln_param_f {
    const T *x, *dy;
    const float *mean, *rstd;
    int64_t d;
    __device__ void operator()(int64_t r, int64_t j, int64_t i, double *out) const {
        int64_t at = r * d + j;
        float g = ct_ld(dy[at]);
        out[0] = (double)g * ((ct_ld(x[at]) - mean[r]) * rstd[r]);
        out[1] = g;
    }
};
struct ln_param_g {
    float *dgamma, *dbeta;
    __device__ void operator()(int64_t j, const double *s) const {
        if (dgamma) dgamma[j] += (float)s[0];
        if (dbeta) dbeta[j] += (float)s[1];
    }
};

static void cu_layernorm_backward(ct_backend *be, void *dx, float *dgamma, float *dbeta,
                                  const void *dy, const void *x, const void *gamma,
                                  const float *save_mean, const float *save_rstd, int64_t rows,
                                  int64_t d, ct_dtype dt) {
    if (d <= 0 || rows <= 0) return;
    check_rows(rows);
    CT_DT_DISPATCH(dt, T, {
        if (dx) {
            k_ln_bwd_dx<T><<<(unsigned)rows, LN_THREADS, 0, ct_cuda_stream(be)>>>(
                (T *)dx, (const T *)dy, (const T *)x, (const T *)gamma, save_mean, save_rstd, d);
            CT_CUDA_LAUNCH_CHECK();
        }
        if (dgamma || dbeta) {
            ln_param_f<T> f = {(const T *)x, (const T *)dy, save_mean, save_rstd, d};
            ln_param_g g = {dgamma, dbeta};
            ct_cuda_reduce_rci<2>(be, rows, d, 1, f, g);
        }
    });
}

/* ---- embedding ---- */

template <typename T>
__global__ void k_embed_fwd(T *y, const int32_t *ids, const T *table, int64_t n_ids, int64_t dim) {
    GRID_STRIDE(idx, n_ids * dim) {
        int64_t i = idx / dim, j = idx - i * dim;
        int32_t id = ids[i];
        /* as the CPU: ids are validated upstream; a negative id reads as zeros */
        y[idx] = id < 0 ? ct_st<T>(0.0f) : table[(int64_t)id * dim + j];
    }
}

static void cu_embedding_forward(ct_backend *be, void *y, const int32_t *ids, const void *table,
                                 int64_t n_ids, int64_t dim, ct_dtype dt) {
    CT_DT_DISPATCH(dt, T,
                   LAUNCH(be, n_ids * dim, k_embed_fwd<T>, (T *)y, ids, (const T *)table, n_ids,
                          dim));
}

/* keys: the id, or `vocab` (sorts last, skipped) when outside the table; vals: the position. */
__global__ void k_embed_keys(uint32_t *keys, uint32_t *vals, const int32_t *ids, int64_t n,
                             int64_t vocab) {
    GRID_STRIDE(i, n) {
        int32_t id = ids[i];
        keys[i] = (id >= 0 && id < vocab) ? (uint32_t)id : (uint32_t)vocab;
        vals[i] = (uint32_t)i;
    }
}

/* One warp per sorted position; the warp at the head of a run of equal ids adds the run's dy rows
 * (in position order, the sort being stable) into that id's table row (fp32). */
template <typename T>
__global__ void k_embed_bwd(float *dtable, const T *dy, const uint32_t *keys, const uint32_t *vals,
                            int64_t n, int64_t vocab, int64_t dim) {
    int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t n_warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t s = warp; s < n; s += n_warps) {
        uint32_t key = keys[s];
        if (key >= (uint64_t)vocab || (s > 0 && keys[s - 1] == key)) continue;
        float *row = dtable + (int64_t)key * dim;
        for (int64_t j = lane; j < dim; j += 32) {
            float acc = row[j];
            for (int64_t t = s; t < n && keys[t] == key; t++)
                acc += ct_ld(dy[(int64_t)vals[t] * dim + j]);
            row[j] = acc;
        }
    }
}

static void cu_embedding_backward(ct_backend *be, float *dtable, const void *dy, const int32_t *ids,
                                  int64_t n_ids, int64_t vocab, int64_t dim, ct_dtype dt) {
    if (n_ids <= 0 || dim <= 0 || vocab <= 0) return;
    CT_CUDA_REQUIRE(n_ids <= INT32_MAX && vocab < UINT32_MAX, "embedding: too many ids or rows");
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(dt), "embedding: dtype must be f32, f16 or bf16");
    cudaStream_t st = ct_cuda_stream(be);
    size_t n = (size_t)n_ids;
    uint32_t *buf = (uint32_t *)CT_CUDA_SCRATCH(be, 4 * n * sizeof(uint32_t));
    uint32_t *keys_in = buf, *vals_in = buf + n, *keys = buf + 2 * n, *vals = buf + 3 * n;
    LAUNCH(be, n_ids, k_embed_keys, keys_in, vals_in, ids, n_ids, vocab);
    int end_bit = 1;
    while (end_bit < 32 && ((uint64_t)vocab >> end_bit) != 0) end_bit++; /* vocab itself fits */
    size_t temp_bytes = 0;
    CT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, keys_in, keys, vals_in, vals,
                                                  (int)n_ids, 0, end_bit, st));
    void *temp = CT_CUDA_SCRATCH(be, temp_bytes ? temp_bytes : 1);
    CT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, vals_in, vals,
                                                  (int)n_ids, 0, end_bit, st));
    unsigned grid = ct_cuda_grid(be, n_ids * 32, CT_CUDA_THREADS);
    CT_DT_DISPATCH(dt, T, {
        k_embed_bwd<T><<<grid, CT_CUDA_THREADS, 0, st>>>(dtable, (const T *)dy, keys, vals, n_ids,
                                                          vocab, dim);
        CT_CUDA_LAUNCH_CHECK();
    });
    ct_cuda_scratch_free(be, temp);
    ct_cuda_scratch_free(be, buf);
}

void ct_cuda_norm_install(ct_backend *be) {
    be->norm.batchnorm_forward = cu_batchnorm_forward;
    be->norm.batchnorm_backward = cu_batchnorm_backward;
    be->norm.layernorm_forward = cu_layernorm_forward;
    be->norm.layernorm_backward = cu_layernorm_backward;
    be->embed.embedding_forward = cu_embedding_forward;
    be->embed.embedding_backward = cu_embedding_backward;
}

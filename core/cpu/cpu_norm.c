/* cpu_norm.c: batch norm over [N, C, HW] and layer norm over the last dimension.
 *
 * Statistics are accumulated in double, in a fixed order per channel (batch norm) or per row and
 * per column (layer norm), so threads never share a sum. Semantics follow PyTorch: biased
 * variance normalises, the unbiased one goes into running_var, and
 * running = (1 - momentum) * running + momentum * batch. */
#include <math.h>

#include "core/cpu/cpu_internal.h"

typedef struct {
    float *y;
    const float *x, *dy;
    const float *gamma, *beta;
    float *running_mean, *running_var;
    float *save_mean, *save_invstd;
    float *dgamma, *dbeta;
    const float *cmean, *cinvstd;
    int64_t n, c, hw;
    float eps, momentum;
    bool train;
} bn_ctx;

static void bn_fwd_range(void *ctxp, int64_t c0, int64_t c1) {
    bn_ctx *k = ctxp;
    int64_t m = k->n * k->hw;
    for (int64_t ch = c0; ch < c1; ch++) {
        float mean, invstd;
        if (k->train) {
            double sum = 0.0;
            for (int64_t i = 0; i < k->n; i++) sum += ct_cpu_sum(k->x + (i * k->c + ch) * k->hw, k->hw);
            double dmean = sum / (double)m, sq = 0.0;
            for (int64_t i = 0; i < k->n; i++)
                sq += ct_cpu_sum_sq_dev(k->x + (i * k->c + ch) * k->hw, k->hw, dmean);
            double var = sq / (double)m;
            mean = (float)dmean;
            invstd = (float)(1.0 / sqrt(var + (double)k->eps));
            if (k->save_mean) k->save_mean[ch] = mean;
            if (k->save_invstd) k->save_invstd[ch] = invstd;
            if (k->running_mean)
                k->running_mean[ch] = (1.0f - k->momentum) * k->running_mean[ch] + k->momentum * mean;
            if (k->running_var) {
                double unbiased = m > 1 ? sq / (double)(m - 1) : var;
                k->running_var[ch] = (1.0f - k->momentum) * k->running_var[ch] +
                                     k->momentum * (float)unbiased;
            }
        } else {
            mean = k->running_mean[ch];
            invstd = (float)(1.0 / sqrt((double)k->running_var[ch] + (double)k->eps));
        }
        float scale = invstd * (k->gamma ? k->gamma[ch] : 1.0f);
        float shift = (k->beta ? k->beta[ch] : 0.0f) - mean * scale;
        for (int64_t i = 0; i < k->n; i++) {
            const float *x = k->x + (i * k->c + ch) * k->hw;
            float *y = k->y + (i * k->c + ch) * k->hw;
            for (int64_t j = 0; j < k->hw; j++) y[j] = x[j] * scale + shift;
        }
    }
}

static void bn_bwd_range(void *ctxp, int64_t c0, int64_t c1) {
    bn_ctx *k = ctxp;
    int64_t m = k->n * k->hw;
    for (int64_t ch = c0; ch < c1; ch++) {
        float mean = k->cmean[ch], invstd = k->cinvstd[ch];
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t i = 0; i < k->n; i++) {
            const float *x = k->x + (i * k->c + ch) * k->hw;
            const float *dy = k->dy + (i * k->c + ch) * k->hw;
            for (int64_t j = 0; j < k->hw; j++) {
                sum_dy += dy[j];
                sum_dy_xhat += (double)dy[j] * ((x[j] - mean) * invstd);
            }
        }
        if (k->dgamma) k->dgamma[ch] += (float)sum_dy_xhat;
        if (k->dbeta) k->dbeta[ch] += (float)sum_dy;
        if (!k->y) continue;
        float g = (k->gamma ? k->gamma[ch] : 1.0f) * invstd;
        float mean_dy = (float)(sum_dy / (double)m), mean_dy_xhat = (float)(sum_dy_xhat / (double)m);
        for (int64_t i = 0; i < k->n; i++) {
            const float *x = k->x + (i * k->c + ch) * k->hw;
            const float *dy = k->dy + (i * k->c + ch) * k->hw;
            float *dx = k->y + (i * k->c + ch) * k->hw;
            for (int64_t j = 0; j < k->hw; j++) {
                float xhat = (x[j] - mean) * invstd;
                dx[j] = g * (dy[j] - mean_dy - xhat * mean_dy_xhat);
            }
        }
    }
}

static int64_t channel_grain(int64_t n, int64_t hw) {
    int64_t per = n * hw;
    return ct_cpu_ceil_div(CT_CPU_GRAIN / 4, per > 0 ? per : 1);
}

void ct_cpu_f32_batchnorm_forward(ct_backend *be, float *y, const float *x, const float *gamma,
                                  const float *beta, float *running_mean, float *running_var,
                                  float *save_mean, float *save_invstd, int64_t n, int64_t c,
                                  int64_t hw, float eps, float momentum, bool train) {
    bn_ctx k = {.y = y, .x = x, .gamma = gamma, .beta = beta, .running_mean = running_mean,
                .running_var = running_var, .save_mean = save_mean, .save_invstd = save_invstd,
                .n = n, .c = c, .hw = hw, .eps = eps, .momentum = momentum, .train = train};
    ct_cpu_parallel(ct_cpu_pool_of(be), c, channel_grain(n, hw), bn_fwd_range, &k);
}

void ct_cpu_f32_batchnorm_backward(ct_backend *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *gamma,
                                   const float *save_mean, const float *save_invstd, int64_t n,
                                   int64_t c, int64_t hw) {
    bn_ctx k = {.y = dx, .x = x, .dy = dy, .gamma = gamma, .dgamma = dgamma, .dbeta = dbeta,
                .cmean = save_mean, .cinvstd = save_invstd, .n = n, .c = c, .hw = hw};
    ct_cpu_parallel(ct_cpu_pool_of(be), c, channel_grain(n, hw), bn_bwd_range, &k);
}

/* ---- layer norm ---- */

typedef struct {
    float *out;
    float *save_mean, *save_rstd;
    const float *x, *dy, *gamma, *beta;
    const float *cmean, *crstd;
    float *dgamma, *dbeta;
    int64_t rows, d;
    float eps;
} ln_ctx;

static void ln_fwd_range(void *ctxp, int64_t r0, int64_t r1) {
    ln_ctx *k = ctxp;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = k->x + r * k->d;
        float *y = k->out + r * k->d;
        double mean = ct_cpu_sum(x, k->d) / (double)k->d;
        double sq = ct_cpu_sum_sq_dev(x, k->d, mean);
        float fmean = (float)mean;
        float rstd = (float)(1.0 / sqrt(sq / (double)k->d + (double)k->eps));
        if (k->save_mean) k->save_mean[r] = fmean;
        if (k->save_rstd) k->save_rstd[r] = rstd;
        for (int64_t j = 0; j < k->d; j++) {
            float v = (x[j] - fmean) * rstd;
            y[j] = v * (k->gamma ? k->gamma[j] : 1.0f) + (k->beta ? k->beta[j] : 0.0f);
        }
    }
}

static void ln_bwd_dx_range(void *ctxp, int64_t r0, int64_t r1) {
    ln_ctx *k = ctxp;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = k->x + r * k->d, *dy = k->dy + r * k->d;
        float *dx = k->out + r * k->d;
        float mean = k->cmean[r], rstd = k->crstd[r];
        double sum_g = 0.0, sum_g_xhat = 0.0;
        for (int64_t j = 0; j < k->d; j++) {
            float g = dy[j] * (k->gamma ? k->gamma[j] : 1.0f);
            sum_g += g;
            sum_g_xhat += (double)g * ((x[j] - mean) * rstd);
        }
        float mean_g = (float)(sum_g / (double)k->d), mean_gx = (float)(sum_g_xhat / (double)k->d);
        for (int64_t j = 0; j < k->d; j++) {
            float g = dy[j] * (k->gamma ? k->gamma[j] : 1.0f);
            float xhat = (x[j] - mean) * rstd;
            dx[j] = rstd * (g - mean_g - xhat * mean_gx);
        }
    }
}

/* dgamma/dbeta columns [j0, j1): rows are visited in order, so each column's sum is fixed. */
static void ln_bwd_params_range(void *ctxp, int64_t j0, int64_t j1) {
    ln_ctx *k = ctxp;
    enum { BLOCK = 256 };
    double ag[BLOCK], ab[BLOCK];
    for (int64_t b0 = j0; b0 < j1; b0 += BLOCK) {
        int64_t bn = j1 - b0 < BLOCK ? j1 - b0 : BLOCK;
        for (int64_t j = 0; j < bn; j++) ag[j] = ab[j] = 0.0;
        for (int64_t r = 0; r < k->rows; r++) {
            const float *x = k->x + r * k->d + b0, *dy = k->dy + r * k->d + b0;
            float mean = k->cmean[r], rstd = k->crstd[r];
            for (int64_t j = 0; j < bn; j++) {
                ag[j] += (double)dy[j] * ((x[j] - mean) * rstd);
                ab[j] += dy[j];
            }
        }
        for (int64_t j = 0; j < bn; j++) {
            if (k->dgamma) k->dgamma[b0 + j] += (float)ag[j];
            if (k->dbeta) k->dbeta[b0 + j] += (float)ab[j];
        }
    }
}

void ct_cpu_f32_layernorm_forward(ct_backend *be, float *y, float *save_mean, float *save_rstd,
                                  const float *x, const float *gamma, const float *beta,
                                  int64_t rows, int64_t d, float eps) {
    if (d <= 0) return;
    ln_ctx k = {.out = y, .save_mean = save_mean, .save_rstd = save_rstd, .x = x, .gamma = gamma,
                .beta = beta, .rows = rows, .d = d, .eps = eps};
    ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, d), ln_fwd_range, &k);
}

void ct_cpu_f32_layernorm_backward(ct_backend *be, float *dx, float *dgamma, float *dbeta,
                                   const float *dy, const float *x, const float *gamma,
                                   const float *save_mean, const float *save_rstd, int64_t rows,
                                   int64_t d) {
    if (d <= 0) return;
    ln_ctx k = {.out = dx, .x = x, .dy = dy, .gamma = gamma, .cmean = save_mean, .crstd = save_rstd,
                .dgamma = dgamma, .dbeta = dbeta, .rows = rows, .d = d};
    if (dx)
        ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, d), ln_bwd_dx_range, &k);
    if (dgamma || dbeta)
        ct_cpu_parallel(ct_cpu_pool_of(be), d, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, rows > 0 ? rows : 1),
                        ln_bwd_params_range, &k);
}

void ct_cpu_norm_install(ct_backend *be) {
}

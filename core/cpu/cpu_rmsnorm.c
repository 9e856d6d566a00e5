/* cpu_rmsnorm.c: RMSNorm over the last dimension (backend.h, rmsnorm_forward/backward), Llama's
 * normalisation: no mean is subtracted and there is no bias.
 *
 * Every row's sum of squares and sum of dy * gamma * x is taken in double in a fixed order
 * (cpu_reduce.c's), and the weight gradient is summed over rows in row order per column, so
 * threads never share a sum and no bit depends on the thread count. The element loops are plain
 * restrict-free float loops the vectoriser takes. */
#include <math.h>

#include "core/cpu/cpu_internal.h"

typedef struct {
    float *out;                 /* y (forward) or dx (backward) */
    float *save_rstd, *dgamma;
    const float *x, *dy, *gamma, *rstd;
    int64_t rows, d;
    float eps;
} rms_ctx;

static void rms_fwd_range(void *ctxp, int64_t r0, int64_t r1) {
    rms_ctx *k = ctxp;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = k->x + r * k->d;
        float *y = k->out + r * k->d;
        float rstd = (float)(1.0 / sqrt(ct_cpu_sum_squares(x, k->d) / (double)k->d + (double)k->eps));
        if (k->save_rstd) k->save_rstd[r] = rstd;
        if (k->gamma)
            for (int64_t j = 0; j < k->d; j++) y[j] = x[j] * rstd * k->gamma[j];
        else
            for (int64_t j = 0; j < k->d; j++) y[j] = x[j] * rstd;
    }
}

/* dx = rstd (g - x rstd^2 mean(g x)), g = dy gamma: the gradient of x rstd through rstd's
 * dependence on every x of the row. */
static void rms_bwd_dx_range(void *ctxp, int64_t r0, int64_t r1) {
    rms_ctx *k = ctxp;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = k->x + r * k->d, *dy = k->dy + r * k->d;
        float *dx = k->out + r * k->d;
        float rstd = k->rstd[r];
        double sgx = 0.0;
        for (int64_t j = 0; j < k->d; j++) sgx += (double)(dy[j] * (k->gamma ? k->gamma[j] : 1.0f)) * x[j];
        float m = (float)(sgx / (double)k->d * (double)rstd * (double)rstd);
        for (int64_t j = 0; j < k->d; j++) {
            float g = dy[j] * (k->gamma ? k->gamma[j] : 1.0f);
            dx[j] = rstd * (g - x[j] * m);
        }
    }
}

/* dgamma columns [j0, j1): rows in order, so each column's sum is fixed. */
static void rms_bwd_gamma_range(void *ctxp, int64_t j0, int64_t j1) {
    rms_ctx *k = ctxp;
    enum { BLOCK = 256 };
    double acc[BLOCK];
    for (int64_t b0 = j0; b0 < j1; b0 += BLOCK) {
        int64_t bn = j1 - b0 < BLOCK ? j1 - b0 : BLOCK;
        for (int64_t j = 0; j < bn; j++) acc[j] = 0.0;
        for (int64_t r = 0; r < k->rows; r++) {
            const float *x = k->x + r * k->d + b0, *dy = k->dy + r * k->d + b0;
            float rstd = k->rstd[r];
            for (int64_t j = 0; j < bn; j++) acc[j] += (double)dy[j] * (x[j] * rstd);
        }
        for (int64_t j = 0; j < bn; j++) k->dgamma[b0 + j] += (float)acc[j];
    }
}

void ct_cpu_f32_rmsnorm_forward(ct_backend *be, float *y, float *save_rstd, const float *x, const float *gamma,
                                int64_t rows, int64_t d, float eps) {
    if (d <= 0 || rows <= 0) return;
    rms_ctx k = {.out = y, .save_rstd = save_rstd, .x = x, .gamma = gamma, .rows = rows, .d = d, .eps = eps};
    ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, d), rms_fwd_range, &k);
}

void ct_cpu_f32_rmsnorm_backward(ct_backend *be, float *dx, float *dgamma, const float *dy, const float *x,
                                 const float *gamma, const float *save_rstd, int64_t rows, int64_t d) {
    if (d <= 0 || rows <= 0) return;
    rms_ctx k = {.out = dx, .dgamma = dgamma, .x = x, .dy = dy, .gamma = gamma, .rstd = save_rstd,
                 .rows = rows, .d = d};
    if (dx) ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, d), rms_bwd_dx_range, &k);
    if (dgamma) ct_cpu_parallel(ct_cpu_pool_of(be), d, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, rows), rms_bwd_gamma_range, &k);
}

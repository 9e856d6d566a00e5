/* cpu_swiglu.c: SwiGLU, Llama's MLP activation (backend.h, swiglu_forward/backward): each row of
 * the fused gate-and-up projection [rows, 2f] gives y = silu(gate) * up [rows, f]. Independent
 * per element, so the rows are cut between threads freely. silu is the act op's formula
 * (g / (1 + exp(-g)), cpu_eltwise.c), so swiglu over [gate, up] equals silu then a product. */
#include <math.h>

#include "core/cpu/cpu_internal.h"

typedef struct {
    float *out;
    const float *x, *dy;
    int64_t f;
} swiglu_ctx;

static void fwd_range(void *ctxp, int64_t r0, int64_t r1) {
    swiglu_ctx *k = ctxp;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = k->x + r * 2 * k->f, *u = g + k->f;
        float *y = k->out + r * k->f;
        for (int64_t j = 0; j < k->f; j++) y[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

/* d up = dy silu(g); d gate = dy up silu'(g), silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). */
static void bwd_range(void *ctxp, int64_t r0, int64_t r1) {
    swiglu_ctx *k = ctxp;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = k->x + r * 2 * k->f, *u = g + k->f, *dy = k->dy + r * k->f;
        float *dg = k->out + r * 2 * k->f, *du = dg + k->f;
        for (int64_t j = 0; j < k->f; j++) {
            float s = 1.0f / (1.0f + expf(-g[j]));
            du[j] = dy[j] * (g[j] * s);
            dg[j] = dy[j] * u[j] * (s * (1.0f + g[j] * (1.0f - s)));
        }
    }
}

void ct_cpu_f32_swiglu_forward(ct_backend *be, float *y, const float *x, int64_t rows, int64_t f) {
    if (rows <= 0 || f <= 0) return;
    swiglu_ctx k = {.out = y, .x = x, .f = f};
    ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, f), fwd_range, &k);
}

void ct_cpu_f32_swiglu_backward(ct_backend *be, float *dx, const float *dy, const float *x, int64_t rows, int64_t f) {
    if (rows <= 0 || f <= 0) return;
    swiglu_ctx k = {.out = dx, .x = x, .dy = dy, .f = f};
    ct_cpu_parallel(ct_cpu_pool_of(be), rows, ct_cpu_ceil_div(CT_CPU_GRAIN / 4, f), bwd_range, &k);
}

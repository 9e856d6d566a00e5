/* init.c: parameter and buffer initialisation (ct_param_store_init), PyTorch's default schemes
 * unless a layer says "init". View i draws from the Philox stream (seed, CT_RNG_INIT, i), so
 * values depend only on the seed and the model, not on thread count or device. */
#include <math.h>
#include <stdlib.h>

#include "core/params/store.h"
#include "core/util/rng.h"

/* Gain of kaiming init for leaky_relu with negative slope a (a = 0: ReLU, sqrt(2)). */
static double kaiming_gain(double a) { return sqrt(2.0 / (1.0 + a * a)); }

static void fill_view(const ct_param_view *v, float *out, uint64_t seed, int index) {
    const ct_init_spec *s = &v->init;
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, (uint64_t)index);
    double fan_in = (double)(s->fan_in > 0 ? s->fan_in : 1), fan_sum = (double)(s->fan_in + s->fan_out);
    double lo = 0, hi = 0, mean = 0, std = 0;
    bool normal = false;
    switch (s->kind) {
    case CT_INIT_DEFAULT:
    case CT_INIT_ZEROS: lo = hi = 0; break;
    case CT_INIT_ONES: lo = hi = 1; break;
    case CT_INIT_CONSTANT: lo = hi = s->a; break;
    case CT_INIT_UNIFORM: lo = s->a, hi = s->b; break;
    case CT_INIT_NORMAL: normal = true, mean = s->a, std = s->b; break;
    case CT_INIT_KAIMING_UNIFORM: hi = kaiming_gain(s->a) * sqrt(3.0 / fan_in), lo = -hi; break;
    case CT_INIT_KAIMING_NORMAL: normal = true, std = kaiming_gain(s->a) / sqrt(fan_in); break;
    case CT_INIT_XAVIER_UNIFORM: hi = s->a * sqrt(6.0 / (fan_sum > 0 ? fan_sum : 1)), lo = -hi; break;
    case CT_INIT_XAVIER_NORMAL: normal = true, std = s->a * sqrt(2.0 / (fan_sum > 0 ? fan_sum : 1)); break;
    }
    for (int64_t i = 0; i < v->numel; i++)
        out[i] = normal ? (float)(mean + std * ct_rng_normal(&r))
                        : (float)(lo + (hi - lo) * ct_rng_uniform(&r));
}

/* The part of view v inside [lo, hi) of its space, as [*a, *b) relative to the view. */
static bool clip(const ct_param_view *v, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
    *a = v->offset < lo ? lo - v->offset : 0;
    *b = v->offset + v->numel > hi ? hi - v->offset : v->numel;
    return *a < *b;
}

void ct_param_store_init(ct_param_store *s, uint64_t seed) {
    const ct_param_layout *L = s->layout;
    int64_t max = 1;
    for (int i = 0; i < L->n_views; i++)
        if (L->views[i].numel > max) max = L->views[i].numel;
    float *host = ct_xmalloc((size_t)max * sizeof(float));
    for (int i = 0; i < L->n_views; i++) {
        const ct_param_view *v = &L->views[i];
        int64_t a = 0, b = v->numel;
        if (v->trainable && !clip(v, s->lo, s->hi, &a, &b)) continue;
        float *dst = v->trainable ? s->master + (v->offset + a - s->lo) : s->buffers + v->offset;
        fill_view(v, host, seed, i);
        s->be->mem.copy_h2d(s->be, dst, host + a, (size_t)(b - a) * sizeof(float));
    }
    free(host);
    ct_param_store_refresh(s);
}

/* init.c: parameter and buffer initialisation (ct_param_store_init), PyTorch's default schemes
 * unless a layer says "init". Element e of view i is draw e of the Philox stream
 * (seed, CT_RNG_INIT, i) (backend.h, init_fill), so values depend only on the seed and the model,
 * not on thread count, device or how the space is sharded. */
#include <math.h>

#include "core/params/store.h"

/* Gain of kaiming init for leaky_relu with negative slope a (a = 0: ReLU, sqrt(2)). */
static double kaiming_gain(double a) { return sqrt(2.0 / (1.0 + a * a)); }

/* The draw of a view's elements: its init scheme with the fans resolved (PyTorch's formulas). */
static ct_init_dist view_dist(const ct_param_view *v) {
    const ct_init_spec *s = &v->init;
    double fan_in = (double)(s->fan_in > 0 ? s->fan_in : 1), fan_sum = (double)(s->fan_in + s->fan_out);
    double k;
    switch (s->kind) {
    case CT_INIT_ONES: return (ct_init_dist){CT_DRAW_CONSTANT, 1.0, 0.0};
    case CT_INIT_CONSTANT: return (ct_init_dist){CT_DRAW_CONSTANT, s->a, 0.0};
    case CT_INIT_UNIFORM: return (ct_init_dist){CT_DRAW_UNIFORM, s->a, s->b};
    case CT_INIT_NORMAL: return (ct_init_dist){CT_DRAW_NORMAL, s->a, s->b};
    case CT_INIT_KAIMING_UNIFORM:
        k = kaiming_gain(s->a) * sqrt(3.0 / fan_in);
        return (ct_init_dist){CT_DRAW_UNIFORM, -k, k};
    case CT_INIT_KAIMING_NORMAL: return (ct_init_dist){CT_DRAW_NORMAL, 0.0, kaiming_gain(s->a) / sqrt(fan_in)};
    case CT_INIT_XAVIER_UNIFORM:
        k = s->a * sqrt(6.0 / (fan_sum > 0 ? fan_sum : 1));
        return (ct_init_dist){CT_DRAW_UNIFORM, -k, k};
    case CT_INIT_XAVIER_NORMAL:
        return (ct_init_dist){CT_DRAW_NORMAL, 0.0, s->a * sqrt(2.0 / (fan_sum > 0 ? fan_sum : 1))};
    case CT_INIT_DEFAULT:
    case CT_INIT_ZEROS: break;
    }
    return (ct_init_dist){CT_DRAW_CONSTANT, 0.0, 0.0};
}

/* The part of view v inside [lo, hi) of its space, as [*a, *b) relative to the view. */
static bool clip(const ct_param_view *v, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
    *a = v->offset < lo ? lo - v->offset : 0;
    *b = v->offset + v->numel > hi ? hi - v->offset : v->numel;
    return *a < *b;
}

/* Every view of the master's range and every buffer, drawn on the backend in parallel (the
 * backend's init_fill: element e of view i is draw e of stream i), so a shard initialises only
 * its own part and still gets the values of the whole; then the compute copy. */
void ct_param_store_init(ct_param_store *s, uint64_t seed) {
    const ct_param_layout *L = s->layout;
    for (int i = 0; i < L->n_views; i++) {
        const ct_param_view *v = &L->views[i];
        if (v->trainable) continue;
        ct_init_dist d = view_dist(v);
        s->be->elt.init_fill(s->be, s->buffers + v->offset, 0, v->numel, &d, seed, (uint64_t)i);
    }
    if (!s->master) return;   /* swapped: the trainer fills the swap's chunks (init_master) */
    ct_param_store_init_master(s, seed, s->lo, s->hi, s->master);
    ct_param_store_refresh(s);
}

void ct_param_store_init_master(const ct_param_store *s, uint64_t seed, int64_t a, int64_t b, float *dst) {
    const ct_param_layout *L = s->layout;
    /* the master on the backend that holds it (ZeRO-Offload: the CPU beside the device) */
    ct_backend *ops = ct_place_ops(&s->state_at);
    ops->mem.memset0(ops, dst, (size_t)(b - a) * sizeof(float));   /* the padding between views */
    for (int i = 0; i < L->n_views; i++) {
        const ct_param_view *v = &L->views[i];
        int64_t x, y;
        if (!v->trainable || !clip(v, a, b, &x, &y)) continue;
        ct_init_dist d = view_dist(v);
        ops->elt.init_fill(ops, dst + (v->offset + x - a), x, y - x, &d, seed, (uint64_t)i);
    }
}

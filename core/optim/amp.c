/* amp.c: the precision policy and the loss scaler (semantics in amp.h). */
#include "core/optim/amp.h"

#include <math.h>
#include <stdlib.h>

#include "core/util/common.h"

void ct_scaler_init_dynamic(ct_loss_scaler *s, double init_scale, long window, double min_scale,
                            int hysteresis, bool consecutive) {
    *s = (ct_loss_scaler){.dynamic = true, .scale = init_scale, .min_scale = min_scale,
                          .window = window > 0 ? window : 1, .hysteresis = hysteresis,
                          .budget = hysteresis, .consecutive = consecutive, .iter = 0,
                          .last_overflow_iter = -1};
}

void ct_scaler_init_static(ct_loss_scaler *s, double scale) {
    *s = (ct_loss_scaler){.dynamic = false, .scale = scale, .min_scale = scale, .window = 1,
                          .hysteresis = 1, .budget = 1, .last_overflow_iter = -1};
}

void ct_scaler_init_config(ct_loss_scaler *s, const ct_fp16_cfg *c) {
    if (c->loss_scale > 0) {
        ct_scaler_init_static(s, c->loss_scale);
        return;
    }
    /* Documented defaults even when the keys are absent (docs/config.md: DeepSpeed's code then
     * uses its class defaults 2^32 and hysteresis 1). */
    ct_scaler_init_dynamic(s, ldexp(1.0, c->initial_scale_power), c->loss_scale_window,
                           c->min_loss_scale, c->hysteresis, c->consecutive_hysteresis);
}

static ct_scale_event on_overflow(ct_loss_scaler *s) {
    ct_scale_event ev;
    if (s->hysteresis <= 1 || s->budget <= 1) { /* <= : a restored budget of 0 must not spin */
        if (s->scale == s->min_scale) return CT_SCALE_AT_MIN; /* DeepSpeed raises here */
        s->scale = fmax(s->scale / 2, s->min_scale);
        ev = CT_SCALE_HALVED;
    } else {
        s->budget--;
        ev = CT_SCALE_HYSTERESIS;
    }
    s->last_overflow_iter = s->iter;
    return ev;
}

static ct_scale_event on_clean(ct_loss_scaler *s) {
    if (s->consecutive) s->budget = s->hysteresis;
    if ((s->iter - s->last_overflow_iter) % s->window != 0) return CT_SCALE_KEPT;
    if (!s->consecutive) s->budget = s->hysteresis;
    s->scale *= 2;
    return CT_SCALE_DOUBLED;
}

ct_scale_event ct_scaler_update(ct_loss_scaler *s, bool overflow) {
    ct_scale_event ev;
    if (!s->dynamic) ev = overflow ? CT_SCALE_STATIC_SKIP : CT_SCALE_KEPT;
    else ev = overflow ? on_overflow(s) : on_clean(s);
    if (ev != CT_SCALE_AT_MIN) s->iter++;
    return ev;
}

long ct_scaler_good_steps(const ct_loss_scaler *s) { return s->iter - s->last_overflow_iter - 1; }

void ct_scaler_restore(ct_loss_scaler *s, double scale, long good_steps, int budget) {
    if (!s->dynamic) return;
    s->scale = scale;
    s->budget = budget;
    s->iter = good_steps;        /* iter - last_overflow_iter - 1 == good_steps */
    s->last_overflow_iter = -1;
}

ct_dtype ct_amp_compute_dtype(const ct_config *cfg) {
    if (cfg->fp16.enabled) return CT_F16;
    return cfg->bf16 ? CT_BF16 : CT_F32;
}

void ct_amp_init(ct_amp *a, const ct_config *cfg) {
    *a = (ct_amp){.compute = ct_amp_compute_dtype(cfg)};
    a->scaling = a->compute == CT_F16;
    if (a->scaling) ct_scaler_init_config(&a->scaler, &cfg->fp16);
    else ct_scaler_init_static(&a->scaler, 1.0);
}

float ct_amp_loss_scale(const ct_amp *a) { return a->scaling ? (float)a->scaler.scale : 1.0f; }

double ct_amp_report_scale(const ct_amp *a) { return a->scaling ? a->scaler.scale : NAN; }

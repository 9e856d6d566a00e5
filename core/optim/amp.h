/* amp.h: mixed precision: the precision policy and DeepSpeed's dynamic loss scaler.
 *
 * Policy (fp16.enabled or bf16.enabled in the config; both is a config error):
 *  - master weights, gradients (accumulated over micro-batches) and optimizer state: fp32;
 *  - parameters as forward/backward use them: a real 16-bit copy of the master (CT_F16 or
 *    CT_BF16, round to nearest even), which the parameter store holds (core/params/store.h) and
 *    the optimizer's fused update rewrites; the ops read it directly (GEMMs on 16-bit operands,
 *    fp32 accumulation);
 *  - activations and activation gradients: stored in 16 bits by the graph (ct_graph_build's dt);
 *    losses, softmax and norm statistics are computed in fp32; parameter gradients accumulate in
 *    fp32.
 *  - fp16 only: the loss is scaled before backward (loss x scale / accumulation) and the scale
 *    follows the scaler below; bf16 has fp32's range and needs no scaling (scale 1).
 *
 * The scaler is DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py) rule for
 * rule (DeepSpeed's documentation of the fp16 section and loss_scaler.py). Per optimizer
 * update, with overflow = some gradient is inf or NaN:
 *   overflow:    if hysteresis == 1 or the budget left is 1: at min_scale -> fatal, else
 *                scale = max(scale / 2, min_scale); otherwise the budget drops by one and the scale
 *                stays. Either way the step is skipped and the overflow's iteration remembered.
 *   no overflow: consecutive_hysteresis refills the budget; every loss_scale_window-th update
 *                since the last overflow (counting from iteration 0 at the start) refills it
 *                (when not consecutive) and doubles the scale, without upper bound.
 *   then the iteration counter advances.
 * A static scale (fp16.loss_scale > 0) never changes; overflowing updates are still skipped. */
#ifndef CT_AMP_H
#define CT_AMP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/util/tensor.h"

typedef struct ct_loss_scaler {
    bool dynamic;                /* false: static scale */
    double scale;                /* DeepSpeed cur_scale */
    double min_scale;
    long window;                 /* scale_window */
    int hysteresis;              /* delayed_shift */
    int budget;                  /* cur_hysteresis */
    bool consecutive;            /* consecutive_hysteresis */
    long iter;                   /* cur_iter: updates seen (applied and skipped) */
    long last_overflow_iter;     /* -1 before any overflow */
} ct_loss_scaler;

/* What one update did to the scale (for the log and the error message). */
typedef enum {
    CT_SCALE_KEPT = 0,           /* clean update, scale unchanged */
    CT_SCALE_DOUBLED,            /* clean update completing a window */
    CT_SCALE_HYSTERESIS,         /* overflow: budget reduced, scale unchanged, step skipped */
    CT_SCALE_HALVED,             /* overflow: scale lowered (clamped at min), step skipped */
    CT_SCALE_STATIC_SKIP,        /* overflow with a static scale: step skipped */
    CT_SCALE_AT_MIN,             /* overflow at the minimum scale: the run cannot go on */
} ct_scale_event;

void ct_scaler_init_dynamic(ct_loss_scaler *s, double init_scale, long window, double min_scale,
                            int hysteresis, bool consecutive);
void ct_scaler_init_static(ct_loss_scaler *s, double scale);
/* From the fp16 section: loss_scale 0 -> dynamic with 2^initial_scale_power, else static. */
void ct_scaler_init_config(ct_loss_scaler *s, const ct_fp16_cfg *c);
/* One optimizer update (overflow or not) at the gradient-accumulation boundary. */
ct_scale_event ct_scaler_update(ct_loss_scaler *s, bool overflow);

/* Checkpoints (ct_ckpt_state loss_scale, scaler_good_steps, scaler_hysteresis): the doubling
 * depends only on the clean updates since the last overflow, so three numbers restore a dynamic
 * scaler exactly. Restoring a static scaler changes nothing (its scale comes from the config). */
long ct_scaler_good_steps(const ct_loss_scaler *s);
void ct_scaler_restore(ct_loss_scaler *s, double scale, long good_steps, int budget);

/* The dtype parameters and activations use in forward/backward under cfg: CT_F16, CT_BF16 or
 * CT_F32. */
ct_dtype ct_amp_compute_dtype(const ct_config *cfg);

typedef struct ct_amp {
    ct_dtype compute;            /* CT_F32, CT_F16 or CT_BF16 */
    bool scaling;                /* fp16: loss scaling on */
    ct_loss_scaler scaler;       /* fp16 only */
    long skipped;                /* updates skipped for overflow */
} ct_amp;

/* The policy for cfg. */
void ct_amp_init(ct_amp *a, const ct_config *cfg);
/* Loss multiplier for backward: the current scale (fp16), 1 otherwise. */
float ct_amp_loss_scale(const ct_amp *a);
/* For the report and the summary: the current scale under fp16, NAN otherwise. */
double ct_amp_report_scale(const ct_amp *a);

#endif

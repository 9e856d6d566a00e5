/* optim.h: SGD, Adam, AdamW and Lamb over flat fp32 master buffers.
 *
 * One backend allocation holds, back to back: params [n], grads [n] and the optimizer state
 * (Adam/AdamW/Lamb: m [n], v [n]; SGD with momentum: mom [n]; plain SGD: nothing), so the
 * update is one fused pass per tensor group, ZeRO can slice it and checkpoints name views into it.
 *
 * A step is: global gradient norm (always computed, for the log) -> clip coefficient when
 * gradient_clipping > 0 -> the fused update via the backend with the LR of the schedule.
 * Clipping, 1/loss_scale and any pre-division are folded into the kernels' grad_scale, so the
 * gradients are read once and never rewritten.
 *
 * Semantics:
 *  - Adam/AdamW as DeepSpeed's FusedAdam: adam_w_mode (default true) decays weights decoupled,
 *    p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p); with adam_w_mode false, wd * p is added to
 *    the gradient (L2). Type "AdamW" is always decoupled.
 *  - SGD as torch.optim.SGD: L2 weight decay into the gradient, momentum buffer initialised to the
 *    first gradient, dampening, nesterov.
 *  - Lamb as DeepSpeed's FusedLamb: per parameter tensor, u = m / (sqrt(v) + eps) + wd * p (m, v
 *    not bias-corrected), trust = ||p|| / ||u|| clamped to [min_coeff, max_coeff] (1 when either
 *    norm is 0), p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * trust * u.
 *  - Weight decay applies only to tensors whose view has weight_decay = true (the graph marks
 *    biases and norm parameters false), the split Hugging Face's Trainer and most recipes use.
 *  - Learning rate: ct_sched_lr(sched, lr, t) with DeepSpeed's convention: update #k uses
 *    t = k - 2 (t = -1 for the first update); only applied updates advance t.
 */
#ifndef CT_OPTIM_H
#define CT_OPTIM_H

#include "core/backend/backend.h"
#include "core/util/common.h"
#include "core/config/config.h"

struct ct_graph;

/* A run of consecutive parameters sharing one treatment: a parameter tensor (Lamb needs each
 * tensor alone for its trust ratio) or, for the element-wise optimizers, merged neighbours. */
typedef struct ct_optim_tensor {
    int64_t offset, numel;       /* in elements, inside the flat parameter buffer */
    bool weight_decay;
} ct_optim_tensor;

typedef struct ct_optim {
    ct_optimizer_cfg cfg;
    ct_scheduler_cfg sched;
    double clip;                 /* gradient_clipping; 0 = off */
    ct_backend *be;

    int64_t n;                   /* trainable elements */
    void *block;                 /* optimizer state (m, v or mom, Lamb scratch); NULL for plain SGD */
    float *params;               /* [n] fp32 master weights */
    float *grads;                /* [n] accumulated gradients */
    float *m, *v;                /* [n] each: Adam/AdamW/Lamb moments (NULL for SGD) */
    float *mom;                  /* [n] SGD momentum buffer (NULL without momentum) */
    float *scratch;              /* [max tensor numel] Lamb update direction */
    void *copy;                  /* [n] compute-dtype copy every update refreshes (NULL: none) */
    ct_dtype copy_dt;            /* CT_F16 or CT_BF16 */

    ct_optim_tensor *tensors;    /* one per parameter tensor, in buffer order */
    int n_tensors;
    ct_optim_tensor *runs;       /* tensors merged where weight_decay agrees (element-wise opts) */
    int n_runs;

    long applied;                /* applied updates so far (Adam bias correction uses applied+1) */
    long sched_t;                /* DeepSpeed last_batch_iteration: -1 before the first update */
} ct_optim;

/* Mixed precision: every applied update also writes the updated parameters, rounded to dt, into
 * copy ([n], backend memory; fused into the Adam/SGD pass). NULL: no copy. */
void ct_optim_set_copy(ct_optim *o, void *copy, ct_dtype dt);

/* Result of one step, for the log and the summary. */
typedef struct ct_optim_stats {
    double grad_norm;            /* global L2 norm of the unscaled gradients (before clipping) */
    double clip_coef;            /* factor applied by clipping (1 when not clipped) */
    double lr;                   /* learning rate used by this update */
} ct_optim_stats;

/* Create over explicit tensors (covering [0, n_params) in order). Allocates on `be`; params,
 * grads and state start zeroed. */
ct_optim *ct_optim_create(const ct_optimizer_cfg *ocfg, const ct_scheduler_cfg *scfg, double clip,
                          ct_backend *be, const ct_optim_tensor *tensors, int n_tensors,
                          int64_t n_params);
/* Create for the trainable views of a graph, with the config's optimizer, scheduler and clip. */
ct_optim *ct_optim_create_for_graph(const ct_config *cfg, ct_backend *be, const struct ct_graph *g);
void ct_optim_free(ct_optim *o);

/* Bytes of the single allocation, by category, for the memory plan. */
size_t ct_optim_param_bytes(const ct_optim *o);
size_t ct_optim_state_bytes(const ct_optim *o);
/* The same estimate before anything is allocated. */
size_t ct_optim_state_bytes_for(ct_opt_type type, double momentum, int64_t n_params);

void ct_optim_zero_grad(ct_optim *o);

/* Learning rate the next update will use. */
double ct_optim_next_lr(const ct_optim *o);

/* One update. grad_scale multiplies the gradients before anything else (1 / loss_scale, 1 for
 * fp32). The clip coefficient is computed on the scaled gradients. */
void ct_optim_step(ct_optim *o, float grad_scale, ct_optim_stats *stats);
/* The same update when every gradient is finite; otherwise nothing changes (parameters, state,
 * applied count, schedule), stats gets grad_norm NAN and the LR the next update will use, and the
 * result is false. The overflow check and the global norm are one pass over the gradients
 * (mixed precision: grad_scale = 1 / loss_scale; the clip coefficient is folded in too). */
bool ct_optim_step_finite(ct_optim *o, float grad_scale, ct_optim_stats *stats);

#endif

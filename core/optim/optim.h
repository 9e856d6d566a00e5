/* optim.h: SGD, Adam, AdamW and Lamb over a range of the flat parameter space.
 *
 * The optimizer owns only its state (Adam/AdamW/Lamb: m, v; SGD with momentum: mom; plain SGD:
 * nothing), for the range [lo, hi) of the flat parameter space it was created for, indexed from
 * lo: the whole space without ZeRO, this rank's shard with it. The parameters it updates, the
 * gradients it reads and the compute-dtype copy it refreshes belong to the parameter store
 * (core/params/store.h) and are passed to each update as a ct_optim_target.
 *
 * A step is: the sum of squares of the gradients (ct_optim_grad_sumsq, this range only) ->
 * summed over ranks by the caller -> ct_optim_apply with the global norm, which computes the clip
 * coefficient when gradient_clipping > 0 and runs the fused update with the LR of the schedule.
 * The sum of squares is a full pass over the gradients: a caller that needs no norm (no clipping,
 * ct_optim_needs_norm false; no overflow check; no log line showing it) skips it and passes NAN.
 * Clipping, 1/loss_scale and any pre-division are folded into the kernels' grad_scale, so the
 * gradients are read once and never rewritten. A non-finite sum of squares means some gradient
 * overflowed (squares summed in double cannot overflow from finite floats): the caller skips.
 *
 * Semantics:
 *  - Adam/AdamW as DeepSpeed's FusedAdam: adam_w_mode (default true) decays weights decoupled,
 *    p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p); with adam_w_mode false, wd * p is added to
 *    the gradient (L2). Type "AdamW" is always decoupled.
 *  - SGD as torch.optim.SGD: L2 weight decay into the gradient, momentum buffer initialised to the
 *    first gradient, dampening, nesterov.
 *  - Lamb as DeepSpeed's FusedLamb: per parameter tensor, u = m / (sqrt(v) + eps) + wd * p (m, v
 *    not bias-corrected), trust = ||p|| / ||u|| clamped to [min_coeff, max_coeff] (1 when either
 *    norm is 0), p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * trust * u. Its trust ratio needs
 *    whole tensors, so a Lamb range must not cut one.
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

/* A run of consecutive parameters sharing one treatment: a parameter tensor (Lamb needs each
 * tensor alone for its trust ratio) or, for the element-wise optimizers, merged neighbours (with
 * the zero padding between views, which no update moves). Offsets are in the flat space. */
typedef struct ct_optim_tensor {
    int64_t offset, numel;
    bool weight_decay;
} ct_optim_tensor;

typedef struct ct_optim {
    ct_optimizer_cfg cfg;
    ct_scheduler_cfg sched;
    double clip;                 /* gradient_clipping; 0 = off */
    ct_backend *be;              /* computes the updates: the training device's, or with
                                    ZeRO-Offload the CPU backend beside it */
    ct_mem_place state_at;       /* where the state lives (be's memory unless offloaded) */
    bool external;               /* the caller keeps the state (an NVMe swap's files) and hands each
                                    update the state of its range (ct_optim_target.state) */

    int64_t lo, hi;              /* the range of the flat space this optimizer updates */
    void *block;                 /* its state (m, v or mom, Lamb scratch); NULL for plain SGD */
    float *m, *v;                /* [hi - lo] each: Adam/AdamW/Lamb moments (NULL for SGD) */
    float *mom;                  /* [hi - lo] SGD momentum buffer (NULL without momentum) */
    float *scratch;              /* [max tensor numel] Lamb update direction */

    ct_optim_tensor *tensors;    /* one per parameter tensor inside [lo, hi), in offset order */
    int n_tensors;
    ct_optim_tensor *runs;       /* tensors merged where weight_decay agrees (element-wise opts) */
    int n_runs;

    long applied;                /* applied updates so far (Adam bias correction uses applied+1) */
    long sched_t;                /* DeepSpeed last_batch_iteration: -1 before the first update */
} ct_optim;

#define CT_OPTIM_MAX_SLOTS 3   /* state arrays an optimizer keeps at most (ct_optim_slots) */

/* What one update writes and reads, each pointer at element lo of the range (backend memory). */
typedef struct ct_optim_target {
    float *master;               /* fp32 master weights [hi - lo] */
    const float *grads;          /* fp32 gradients [hi - lo] */
    void *copy;                  /* [hi - lo] compute-dtype copy the same pass writes, or NULL */
    ct_dtype copy_dt;            /* CT_F16, CT_BF16 (or CT_F32 for a separate fp32 copy) */
    /* An optimizer whose state is external: that state, in ct_optim_slots' order (Adam: exp_avg,
     * exp_avg_sq; SGD: momentum_buffer), each at element lo like the others. Else unused. */
    float *state[CT_OPTIM_MAX_SLOTS];
} ct_optim_target;

/* Result of one step, for the log and the summary. */
typedef struct ct_optim_stats {
    double grad_norm;            /* global L2 norm of the unscaled gradients (before clipping);
                                    NAN when the step did not compute it or skipped */
    double clip_coef;            /* factor applied by clipping (1 when not clipped) */
    double lr;                   /* learning rate used by this update */
} ct_optim_stats;

/* Create over the tensors of the flat space (in offset order; those outside [lo, hi) are left
 * out, and for the element-wise optimizers one that straddles a bound is cut there). Allocates
 * the state on `be`, zeroed. CT_ERR_CONFIG when Lamb's range cuts a tensor; CT_ERR_RUNTIME when
 * memory runs out. */
int ct_optim_create(const ct_optimizer_cfg *ocfg, const ct_scheduler_cfg *scfg, double clip,
                    ct_backend *be, const ct_optim_tensor *tensors, int n_tensors, int64_t lo,
                    int64_t hi, ct_optim **out, ct_err *err);
/* The same with the state in `state_at` (ZeRO-Offload: host memory, the CPU backend `be`
 * computing on it and on the master and gradients each update is given). state_at NULL: no state
 * of its own at all (o->external): the caller keeps it (ZeRO-Infinity's NVMe offload, in swap
 * files) and every update gets its range's state in the target; not for Lamb (CT_ERR_CONFIG),
 * whose trust ratio needs a scratch as large as a tensor. */
int ct_optim_create_in(const ct_optimizer_cfg *ocfg, const ct_scheduler_cfg *scfg, double clip,
                       ct_backend *be, const ct_mem_place *state_at, const ct_optim_tensor *tensors,
                       int n_tensors, int64_t lo, int64_t hi, ct_optim **out, ct_err *err);
void ct_optim_free(ct_optim *o);

/* Bytes of state for `numel` elements, for the memory plan (before anything is allocated). */
size_t ct_optim_state_bytes_for(ct_opt_type type, double momentum, int64_t numel);
size_t ct_optim_state_bytes(const ct_optim *o);

/* The optimizer's state as named slots (checkpoints: "<view>.<name>"), each [hi - lo] from lo,
 * in a fixed order; returns the count (at most CT_OPTIM_MAX_SLOTS). PyTorch's state_dict names. */
int ct_optim_slots(const ct_optim *o, const char *names[CT_OPTIM_MAX_SLOTS], float *data[CT_OPTIM_MAX_SLOTS]);
/* The slots' names an optimizer of this type keeps (before one exists: an NVMe swap's arrays). */
int ct_optim_slot_names(ct_opt_type type, double momentum, const char *names[CT_OPTIM_MAX_SLOTS]);
/* The optimizer's type as written in checkpoints ("Adam", "AdamW", "SGD", "Lamb"). */
const char *ct_optim_type_name(const ct_optim *o);

/* Learning rate the next update will use. */
double ct_optim_next_lr(const ct_optim *o);

/* Sum of squares (in double) of the gradients of [lo, hi); grads_lo points at element lo. */
double ct_optim_grad_sumsq(const ct_optim *o, const float *grads_lo);

/* Whether an update needs the global norm itself: gradient clipping is on. */
bool ct_optim_needs_norm(const ct_optim *o);

/* One update of [lo, hi). grad_scale multiplies the gradients before anything else (1 / loss_scale,
 * 1 for fp32); grad_norm is the GLOBAL norm of the scaled gradients (sqrt of the sum of squares
 * over every rank, times grad_scale): the clip coefficient comes from it. NAN when the caller did
 * not compute it, which only an optimizer that does not need it may be given (no clipping); the
 * stats then say NAN too. */
void ct_optim_apply(ct_optim *o, const ct_optim_target *t, float grad_scale, double grad_norm,
                    ct_optim_stats *stats);
/* ct_optim_apply in pieces, for a caller that steps [lo, hi) a range at a time and moves each
 * range's result on while the next is stepped (ZeRO-Offload: core/zero/offload.c). begin fixes
 * what every range shares (the clip coefficient from the global norm, the LR and betas of the
 * schedule); update_range steps the elements [a, b) (cut to [lo, hi)), each pointer of t at
 * element a, giving the bits ct_optim_apply gives them (every update is element-wise, and Lamb's
 * ranges must hold whole tensors: false, and nothing done, when [a, b) cuts one); end counts the
 * update (Adam's bias correction, the schedule) and fills stats. Between begin and end the ranges
 * may come in any order, each once. */
typedef struct ct_optim_update {
    double lr, beta1, beta2;
    float gscale;                /* grad_scale times the clip coefficient */
    ct_optim_stats stats;
} ct_optim_update;
void ct_optim_update_begin(ct_optim *o, float grad_scale, double grad_norm, ct_optim_update *u);
bool ct_optim_update_range(ct_optim *o, const ct_optim_update *u, const ct_optim_target *t, int64_t a, int64_t b);
void ct_optim_update_end(ct_optim *o, const ct_optim_update *u, ct_optim_stats *stats);

/* The same update when the global sum of squares of the gradients (over every rank, before
 * grad_scale) is finite; otherwise nothing changes (parameters, state, applied count, schedule),
 * stats get grad_norm NAN and the LR the next update will use, and the result is false: an
 * overflowing fp16 step is skipped. */
bool ct_optim_apply_finite(ct_optim *o, const ct_optim_target *t, float grad_scale, double global_sumsq,
                           ct_optim_stats *stats);

#endif

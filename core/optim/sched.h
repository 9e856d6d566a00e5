/* sched.h: DeepSpeed's learning-rate schedules as pure functions of the step counter.
 *
 * t is DeepSpeed's last_batch_iteration: -1 at construction, +1 after every APPLIED optimizer
 * update (never after an overflow-skipped one). Update #1 therefore uses ct_sched_lr(.., -1),
 * update #k uses ct_sched_lr(.., k - 2). Being pure functions of t, schedules resume from t alone. */
#ifndef CT_SCHED_H
#define CT_SCHED_H

#include "core/config/config.h"

/* Learning rate at iteration t. base_lr is the optimizer's configured lr (used by
 * WarmupCosineLR and when there is no scheduler). */
double ct_sched_lr(const ct_scheduler_cfg *s, double base_lr, long t);

/* OneCycle momentum cycling: writes beta1/beta2 at iteration t and returns true when the
 * schedule overrides them (beta2 forced to 0.99, as DeepSpeed does); false otherwise. */
bool ct_sched_betas(const ct_scheduler_cfg *s, long t, double *beta1, double *beta2);

/* total_num_steps "auto" is stored as -1 by the config: the trainer calls this once it knows the
 * run's total optimizer steps (epochs x steps per epoch, or max_steps), and the schedule then ends
 * with the run. A fixed total is kept; when the run is so much longer that some of its updates
 * come after the total (update k uses t = k - 2), warn (n bytes) receives one line saying so
 * ("scheduler.params.total_num_steps: ..."); otherwise warn is "". Only WarmupDecayLR and
 * WarmupCosineLR have a total. */
void ct_sched_resolve_total(ct_scheduler_cfg *s, long run_total_steps, char *warn, size_t n);

/* DeepSpeed's legacy curriculum schedule: the difficulty (for curriculum_type "seqlen", the
 * sequence length) of the step whose update is number s (DeepSpeed's global_steps + 1, so 1 for
 * the first step), given the difficulty in force before it (min_difficulty at the start). As in
 * DeepSpeed, the difficulty changes only while the one in force is below max_difficulty.
 * fixed_linear/fixed_root: floor((s / total)^(1 / root) * (max - min) + min), rounded down to a
 * multiple of difficulty_step, at most max; fixed_discrete: difficulty[i] for the first i with
 * s <= max_step[i], the last difficulty after the last max_step; custom: unchanged. */
long ct_curriculum_difficulty(const ct_curriculum_cfg *c, long s, long current);

#endif

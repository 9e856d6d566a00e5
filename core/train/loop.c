/* loop.c: epochs, optimizer steps made of micro-batches, eval, early stopping, stop signals.
 *
 * One optimizer step consumes train_batch_size samples (the last one of an epoch fewer when
 * data.drop_last is false) as micro-batches of at most train_micro_batch_size_per_gpu. Each
 * micro-batch's loss gradient is weighted by its share of the step's samples (n_i / n, which is
 * 1 / gradient_accumulation_steps for full steps), so k micro-batches of b give the gradient of
 * one batch of k*b up to float rounding. Micro-batches come in order from the threaded loaders
 * (core/data/loader.h): the train stream runs on across epochs, reshuffled per epoch.
 *
 * The host waits for the device once per optimizer step: each micro-batch's loss is added into
 * an accumulator on the device and read when the step's micro-batches are queued (an fp16
 * forward overflow shows as a non-finite sum). Data-parallel ranks meet through the
 * communicator: the gradient sum, the global sum of squares (norm and overflow), the all-gather of
 * a shard update, the loss sum. Each rank runs the micro-batches of its slice of the step (the
 * train loader gives it only those: ct_loader_rank_slice) weighted by their share of the whole
 * step's samples, so the sum over ranks is the gradient one process computes; a stop signal is
 * agreed with the loss sum, so every rank stops after the same step. */
#include <math.h>
#include <signal.h>
#include <string.h>

#include "core/train/generate.h"
#include "core/train/internal.h"
#include "core/train/nvme.h"
#include "core/zero/offload.h"

/* Whether this rank's master is the whole space (no ZeRO partition): then it updates every
 * parameter itself and holds the summed gradients of all of them. */
static bool holds_all(const ct_param_store *p) { return p->lo == 0 && p->hi == p->layout->n_params; }

/* The flat buffers as the executor reads them. ZeRO-2 has no whole gradients, ZeRO-3 no whole
 * parameters either: the partition's hooks point every layer at scratch (core/zero/partition.h). */
static ct_exec_bufs exec_bufs(const ct_trainer *t) {
    const ct_param_store *p = t->m.params;
    return (ct_exec_bufs){.params = p->part_params ? NULL : p->params, .grads = p->part_grads ? NULL : p->grads,
                          .buffers = p->buffers};
}

/* Every rank's compute copy complete again after its part changed (an update, a load): the
 * all-gather of the parts, in place, in calls of zero_optimization.allgather_bucket_size elements
 * (0: one), or under ZeRO-3 the persistent views' (the others are gathered layer by layer).
 * Collective; nothing to do when this rank holds everything. */
static int share_params(ct_trainer *t, ct_err *err) {
    const ct_param_store *p = t->m.params;
    if (p->part_params) return ct_partition_refresh(t->m.part, err);
    if (holds_all(p)) return CT_OK;
    int64_t n = p->layout->n_params, bucket = (int64_t)t->cfg->zero.allgather_bucket_size;
    if (bucket <= 0 || bucket > n) bucket = n;
    for (int64_t at = 0; at < n; at += bucket) {
        int64_t end = n - at < bucket ? n : at + bucket;
        int rc = t->comm->all_gather_range(t->comm, ct_elem(p->params, at, p->compute),
                                           ct_elem(p->params, p->lo, p->compute), n, at, end, p->compute, err);
        if (rc) return rc;
    }
    return CT_OK;
}

/* Add the last loss (times `weight` samples) and its correct count into the accumulator. */
static void accumulate_loss(ct_trainer *t, const ct_graph *g, float weight) {
    ct_backend *be = t->be;
    const float *r = ct_graph_loss_result(g);
    be->elt.axpy(be, t->m.loss_acc, weight, r, 1, CT_F32);
    be->elt.axpy(be, t->m.loss_acc + 1, 1.0f, r + 1, 1, CT_F32);
}

/* Read (and wait for) the accumulator: loss sum, correct count. */
static void read_loss_acc(ct_trainer *t, double *sum, double *correct) {
    float acc[2];
    t->be->mem.copy_d2h(t->be, acc, t->m.loss_acc, sizeof acc);
    *sum = acc[0];
    *correct = acc[1];
}

/* CT_ERR_DATA for data.<which> whose records were all skipped as corrupt (data.skip_corrupt):
 * `what` says of what ("of epoch 2", "read in this run's 5 steps"), the first skipped ones named in
 * warnings. A run that trained on nothing, or an eval of nothing, is not a success. */
static int all_skipped(const ct_trainer *t, const char *which, const ct_dataset *ds, const ct_loader *l,
                       const char *what, ct_err *err) {
    return ct_errf(err, CT_ERR_DATA, "data.%s (%s): every record %s was skipped as corrupt (data.skip_corrupt; "
                   "%lld distinct records skipped so far, the first ones named above): %s.\n  Fix or replace the "
                   "data; without data.skip_corrupt the first corrupt record stops the run, naming it.", which,
                   ds->source, what, (long long)ct_loader_skipped(l),
                   strcmp(which, "eval") ? "nothing was trained, and nothing is saved" : "there is no eval loss");
}

/* One pass over the eval set: the eval loader's stream is unshuffled, so every pass (one of its
 * epochs) sees the same batches. */
int ct_trainer_evaluate(ct_trainer *t, double *loss, double *accuracy, ct_err *err) {
    int64_t n = 0;
    ct_loader_batch b = {0};
    ct_exec_bufs bufs = exec_bufs(t);   /* the compute copy the updates keep fresh */
    t->be->mem.memset0(t->be, t->m.loss_acc, 2 * sizeof(float));
    do {
        int rc = ct_loader_next(t->d.eval_l, &b, err);
        if (rc) return rc;
        if (b.n == 0) continue; /* every record of the batch skipped as corrupt */
        ct_step_io io = {.input = b.input, .input_dt = b.input_dtype, .target = b.target, .n = b.n,
                         .train = false, .seed = t->cfg->train.seed, .loss_grad_scale = 1.0f,
                         .defer_loss = true};
        rc = ct_graph_forward(t->m.g, &bufs, &io, &t->m.hooks, err);
        if (rc) return rc;
        accumulate_loss(t, t->m.g, (float)b.n);
        n += b.n;
    } while (!b.last_of_epoch);
    if (n == 0) return all_skipped(t, "eval", t->d.eval_ds, t->d.eval_l, "of the eval set", err);
    double sum, correct;
    read_loss_acc(t, &sum, &correct);
    *loss = sum / (double)n;
    /* correct counts labels: one per sample for a classifier, one per position for a sequence */
    int64_t labels = n * ct_shape_numel(&t->m.info->target_shape);
    *accuracy = t->m.info->classes > 0 && labels ? correct / (double)labels : NAN;
    return CT_OK;
}

/* wall_clock_breakdown: seconds per phase, summed over the steps of a print window. Data wait is
 * host time in the loader; forward, backward and optimizer (its gradient all-reduce included)
 * are the backend's timer marks (timer_mark/timer_elapsed: clock_gettime on the CPU, timing
 * events on the compute queue elsewhere); step is the host's wall time of the whole step. */
typedef struct phase_times {
    double data_wait, forward, backward, optimizer, step;
    long steps;
    long profiled;               /* the flops profiler's step, when in this window: not counted */
} phase_times;

/* Loop position and running totals. */
typedef struct loop_state {
    long step;                   /* optimizer steps done */
    int epoch;                   /* 0-based current epoch */
    uint64_t micro;              /* micro-batches done: keys the dropout stream */
    double epoch_loss;           /* sum of step losses in this epoch */
    long epoch_n;
    double train_s;              /* seconds spent in training steps (not eval) */
    double wait_s;               /* of which waiting for the loader */
    double step_wait_s;          /* waiting for the loader in the last step */
    int64_t samples;             /* training samples processed */
    int64_t tokens;              /* a language model's tokens processed (curriculum: cut samples) */
    int64_t step_len;            /* the sequence length of the last step (curriculum learning) */
    double best;                 /* early stopping: best metric so far */
    int bad_evals;
    long best_at;                /* early stopping: step of `best` (-1: unknown) */
    long last_eval_step;
    long epoch_step;             /* optimizer steps done in this epoch (the progress line) */
    long epoch_steps;            /* steps this epoch has in all (after a resume with another
                                    train_batch_size: those done plus those left) */
    int64_t epoch_pos;           /* samples of this epoch's order done: the loader position */
    int64_t epoch_end;           /* where this epoch ends in that order (ct_loader_epoch_end) */
    int stop_sig;                /* several ranks: the stop signal any rank had by the last step */
    double best_value;           /* best/: best train.best_metric so far (NAN: none) */
    long best_step;
    long saved_step;             /* step of the checkpoint last written or resumed (-1: none) */
    long saved_eval_step;        /* last_eval_step at that time */
    double epoch_t0;             /* when this process began the epoch (the epoch line) */
    int64_t epoch_s0;            /* samples at that time */
    int64_t epoch_k0;            /* tokens at that time */
    phase_times window;          /* wall_clock_breakdown: this print window's sums so far */
    /* data.skip_corrupt: samples the steps trained on (all ranks), to refuse a run or an epoch
     * whose every record was skipped: nothing trained is not a success */
    int64_t step_trained;        /* in the last step */
    int64_t epoch_trained;       /* in this epoch's steps made by this process */
    bool epoch_whole;            /* this process made the epoch's steps from its first sample */
    int64_t run_trained;         /* in every step of this process */
    long run_steps;              /* steps this process made */
} loop_state;

/* The optimizer update of this process's range given the global sum of squares of the
 * gradients (skipped when it is not finite; returns whether it updated), then the compute copy of
 * every other rank's range by all-gather (nothing to do for one rank). */
static int update(ct_trainer *t, float grad_scale, double sumsq, bool *applied, ct_optim_stats *st,
                  ct_err *err) {
    ct_param_store *p = t->m.params;
    ct_optim_target tg = {.master = p->master, .grads = ct_param_store_part_grads(p)};
    if (ct_param_store_has_copy(p)) {
        tg.copy = ct_param_store_part_params(p);
        tg.copy_dt = p->compute;
    }
    /* fp32/bf16: every step updates (a NaN then shows in the loss; sumsq is NAN when the step did
     * not need the norm); fp16 skips a step whose sum of squares overflowed */
    *applied = !t->m.amp.scaling || isfinite(sumsq);
    double norm = sqrt(sumsq) * grad_scale;
    /* a skip touches nothing: no pass over the swap files either */
    if (!*applied) ct_optim_apply_finite(t->m.opt, &tg, grad_scale, sumsq, st);   /* the skip's stats */
    else if (t->m.nvme) {
        int rc = ct_offload_apply_swap(t->m.opt, p, ct_nvme_swap(t->m.nvme), grad_scale, norm, st, err);
        if (rc) return rc;
    } else if (p->host_state) ct_offload_apply(t->m.opt, p, grad_scale, norm, st);
    else ct_optim_apply(t->m.opt, &tg, grad_scale, norm, st);
    if (!*applied || (!ct_param_store_has_copy(p) && !p->part_params)) return CT_OK;
    return share_params(t, err);
}

/* Whether step (1-based) computes the global gradient norm: clipping needs it, the fp16 loss
 * scaler's overflow check is its sum of squares, and a plain step line shows it. The sum of
 * squares is a pass over every gradient (5% of a small MLP's epoch), so the other steps skip it:
 * fp32 and bf16 without clipping take no overflow check, as in PyTorch and DeepSpeed's bf16 (a
 * NaN shows in the loss). Every rank decides alike (config, step number and --quiet, never the
 * rank's terminal): under ZeRO the sum of squares is all-reduced. */
static bool needs_grad_norm(const ct_trainer *t, long step) {
    return ct_optim_needs_norm(t->m.opt) || t->m.amp.scaling ||
           (!t->opts.quiet && ct_report_closes_window(&t->obs.rep, step));
}

/* The update closing a step. The gradients are summed over ranks; when the step needs it
 * (needs_grad_norm) their sum of squares gives the global norm and, when not finite, the
 * overflow (NAN otherwise: the stats say the norm was not computed). fp32/bf16: the update. fp16: 1/scale
 * and the clip coefficient go into the update's grad_scale; an overflow skips the update
 * (weights, optimizer state and schedule stay as they are) and the scaler lowers the scale
 * (core/optim/amp.h). forward_overflow: a micro-batch's loss was inf or NaN in fp16 (an
 * activation overflowed), which DeepSpeed treats like a gradient overflow. step: the 1-based step
 * number. grad_scale: the rescale for samples skipped as corrupt (1 otherwise). */
static int apply_update(ct_trainer *t, long step, float grad_scale, bool forward_overflow,
                        ct_optim_stats *st, ct_err *err) {
    ct_amp *a = &t->m.amp;
    ct_param_store *p = t->m.params;
    ct_comm *c = t->comm;
    /* the gradients summed over ranks: stages 0-1 all-reduce them in buckets (core/zero/grad_buckets.h),
     * stages 2 and 3 reduce-scattered every layer's to their owners as backward finished it
     * (core/zero/partition.h); either may still be in flight (overlap_comm) */
    int rc = p->part_grads ? ct_partition_flush(t->m.part, err) : ct_grad_buckets_finish(t->m.buckets, err);
    if (rc) return rc;   /* the ranks' micro-batches were weighted by the whole step: a sum */
    double ss = NAN;
    if (needs_grad_norm(t, step)) {
        ss = ct_optim_grad_sumsq(t->m.opt, ct_param_store_part_grads(p));
        /* every rank now holds the summed gradients; the sum of squares is over ranks only when
         * each holds a shard of them */
        if (!holds_all(p) && (rc = c->all_reduce_host(c, &ss, 1, CT_REDUCE_SUM, err))) return rc;
    }
    bool ok;
    if (!a->scaling) return update(t, grad_scale, ss, &ok, st, err);
    double tried = a->scaler.scale;
    if (forward_overflow) ss = NAN;   /* skipped like a gradient overflow */
    if ((rc = update(t, (float)(grad_scale / tried), ss, &ok, st, err))) return rc;
    ct_scale_event ev = ct_scaler_update(&a->scaler, !ok);
    t->sum->loss_scale = a->scaler.scale;
    if (ok) return CT_OK;
    const char *what = forward_overflow ? "fp16 overflow in the forward pass (loss not finite)"
                                        : "gradient overflow";
    if (ev == CT_SCALE_AT_MIN) {
        return ct_errf(err, CT_ERR_DIVERGED,
                       "loss scale at its minimum (%.10g) and still %s at step %ld.\n"
                       "  fp16 cannot represent this model's values; use \"bf16\": {\"enabled\": "
                       "true}. %s%s", tried, what, step,
                       t->ck.last[0] ? "Last good checkpoint: " : "No checkpoint was saved in this run.",
                       t->ck.last);
    }
    t->sum->skipped_steps = ++a->skipped;   /* the step counts (global step) but did not update */
    if (ev == CT_SCALE_HALVED)
        ct_report_line(&t->obs.rep, "step %ld: %s at loss scale %.10g; step skipped, scale lowered to "
                       "%.10g", step, what, tried, a->scaler.scale);
    else if (ev == CT_SCALE_HYSTERESIS)
        ct_report_line(&t->obs.rep, "step %ld: %s at loss scale %.10g; step skipped, scale kept "
                       "(hysteresis %d left)", step, what, tried, a->scaler.budget);
    else
        ct_report_line(&t->obs.rep, "step %ld: %s at static loss scale %.10g; step skipped", step, what,
                       tried);
    return CT_OK;
}

/* ZeRO-2/3: a micro-batch this rank has no samples for (its slice of a short last step is shorter
 * than rank 0's, or its records were all skipped as corrupt) still joins every layer's gathers and
 * gradient reduce-scatters, with nothing of its own to add (core/zero/partition.h): the executor walks the layers
 * calling the hooks only. */
static int idle_micro(ct_trainer *t, ct_graph *g, const ct_exec_bufs *bufs, const ct_exec_hooks *hooks,
                      ct_err *err) {
    ct_step_io io = {.n = 1, .train = true, .hooks_only = true};
    int n = ct_graph_info_get(g)->n_layers;
    int rc = ct_graph_forward_range(g, 0, n, CT_PASS_FORWARD, bufs, &io, hooks, err);
    return rc ? rc : ct_graph_backward_range(g, 0, n, bufs, &io, hooks, err);
}

/* One optimizer step over the next n samples (ceil(n / micro) micro-batches of the loader).
 * Returns CT_OK or an error; *loss = mean loss. */
static int train_step(ct_trainer *t, loop_state *ls, int64_t n, double *loss, ct_optim_stats *st,
                      ct_err *err) {
    const ct_config *cfg = t->cfg;
    ct_trainer_model *m = &t->m;
    int64_t mb = cfg->micro_batch, seen = 0;
    /* curriculum learning: this step's sequence length, and the graph built for it */
    int64_t len = ct_curriculum_len(t, ls->step + 1);
    ct_graph *g = m->g;
    ct_step_runner *runner = &m->runner;
    int rc0 = ct_curriculum_graph(t, len, &g, &runner, err);
    if (rc0) return rc0;
    ls->step_len = len;
    ct_param_store_zero_grads(m->params);
    t->be->mem.memset0(t->be, m->loss_acc, 2 * sizeof(float));
    ls->step_wait_s = 0;
    /* Mixed precision: forward/backward read the 16-bit copy of the master, which the last update
     * wrote (ct_trainer_fit refreshed it at the start); the loss is scaled. */
    ct_exec_bufs bufs = exec_bufs(t);
    float scale = ct_amp_loss_scale(&m->amp);
    int64_t lo = 0, hi = n;   /* this rank's samples of the step */
    int64_t walks = 0;        /* ZeRO-2/3: the layer walks every rank makes, rank 0's micro-batches */
    if (t->comm->world > 1) {
        int64_t per = cfg->train_batch_size / t->comm->world, lo0, hi0;
        ct_loader_rank_slice(n, per, t->comm->rank, &lo, &hi);
        ct_loader_rank_slice(n, per, 0, &lo0, &hi0);   /* rank 0's slice is the longest */
        if (m->part) walks = (hi0 - lo0 + mb - 1) / mb;
    }
    for (int64_t start = lo; start < hi; start += mb) {
        ct_loader_batch b;
        int rc = ct_loader_next(t->d.train_l, &b, err);
        if (rc) return rc;
        ls->step_wait_s += ct_loader_last_wait(t->d.train_l);
        int64_t k = b.n;
        if (k == 0 && m->part && (rc = idle_micro(t, g, &bufs, &m->hooks, err))) return rc;
        walks--;
        if (k == 0) continue; /* every record of the batch skipped as corrupt */
        seen += k;
        const void *input, *target;
        ct_curriculum_cut(t, b.input, b.target, k, len, &input, &target);
        ct_step_io io = {.input = input, .input_dt = b.input_dtype, .target = target, .n = k,
                         .train = true, .seed = cfg->train.seed, .step = ls->micro++,
                         .loss_grad_scale = (float)k / (float)n * scale};
        uint64_t m0 = runner->timed ? t->be->queue.timer_mark(t->be) : 0;
        const ct_exec_hooks *hooks = ct_trainer_profiler_hooks(t, ls->step + 1, g);
        if (m->buckets) ct_grad_buckets_arm(m->buckets, start + mb >= hi);   /* its backward reduces */
        if ((rc = ct_step_run(runner, &bufs, &io, hooks, err))) return rc;
        if (runner->timed) {
            uint64_t m2 = t->be->queue.timer_mark(t->be);
            ls->window.forward += t->be->queue.timer_elapsed(t->be, m0, runner->fwd_end);
            ls->window.backward += t->be->queue.timer_elapsed(t->be, runner->fwd_end, m2);
        }
        accumulate_loss(t, g, (float)k);
    }
    for (; walks > 0; walks--) {
        int rc = idle_micro(t, g, &bufs, &m->hooks, err);
        if (rc) return rc;
    }
    double sum, correct, totals[2], stop = t->opts.stop_signal ? *t->opts.stop_signal : 0;
    read_loss_acc(t, &sum, &correct);
    totals[0] = sum, totals[1] = (double)seen;
    int rc = t->comm->all_reduce_host(t->comm, totals, 2, CT_REDUCE_SUM, err);
    if (!rc && t->comm->world > 1) rc = t->comm->all_reduce_host(t->comm, &stop, 1, CT_REDUCE_MAX, err);
    if (rc) return rc;
    ls->stop_sig = (int)stop;
    ls->step_trained = (int64_t)totals[1];
    if (totals[1] == 0) { /* every record of the step skipped as corrupt: no update, no loss */
        *loss = NAN;
        *st = (ct_optim_stats){.grad_norm = NAN, .clip_coef = 1.0, .lr = ct_optim_next_lr(m->opt)};
        return CT_OK;
    }
    /* A non-finite loss: an fp16 activation overflowed (skipped like a gradient overflow), or
     * training diverged. */
    bool overflow = !isfinite(totals[0]);
    if (overflow && !m->amp.scaling)
        return ct_errf(err, CT_ERR_DIVERGED,
                       "training diverged: loss is %s at step %ld (epoch %d). Lower the learning "
                       "rate (optimizer.params.lr) or set gradient_clipping (e.g. 1.0).",
                       isnan(totals[0]) ? "NaN" : "infinite", ls->step + 1, ls->epoch + 1);
    *loss = overflow ? NAN : totals[0] / totals[1];   /* a skipped step adds nothing to the mean */
    /* Micro-batches were weighted k / n; when skip_corrupt dropped records, rescale so the
     * gradient is the mean over the samples actually seen. */
    uint64_t m0 = runner->timed ? t->be->queue.timer_mark(t->be) : 0;
    rc = apply_update(t, ls->step + 1, (float)((double)n / totals[1]), overflow, st, err);
    if (!rc && runner->timed)
        ls->window.optimizer += t->be->queue.timer_elapsed(t->be, m0, t->be->queue.timer_mark(t->be));
    return rc;
}

/* ---- checkpoints: the loop's state <-> state.json ---- */

static void to_ckpt_state(const ct_trainer *t, const loop_state *ls, ct_ckpt_state *st) {
    const ct_amp *a = &t->m.amp;
    ct_ckpt_state_init(st);
    st->step = ls->step;
    st->applied = t->m.opt->applied;
    st->sched_t = t->m.opt->sched_t;
    st->skipped_steps = a->skipped;
    st->epoch = ls->epoch;
    st->epoch_step = ls->epoch_step;
    st->epoch_sample = (long)ls->epoch_pos;
    st->epoch_loss_sum = ls->epoch_loss;
    st->epoch_loss_n = ls->epoch_n;
    st->last_eval_step = ls->last_eval_step;
    st->samples_seen = (long)ls->samples;
    st->micro_step = (long)ls->micro;
    st->seed = t->cfg->train.seed;
    if (a->scaling) {
        st->loss_scale = a->scaler.scale;
        st->scaler_good_steps = ct_scaler_good_steps(&a->scaler);
        st->scaler_hysteresis = a->scaler.budget;
    }
    st->best_value = ls->best_value;
    st->best_step = ls->best_step;
    st->es_best = ls->best;
    st->es_best_step = ls->best_at;
    st->es_bad_evals = ls->bad_evals;
    st->train_loss = t->sum->train_loss;
    memcpy(st->config_hash, t->ck.config_hash, sizeof st->config_hash);
    memcpy(st->train_data, t->ck.train_data, sizeof st->train_data);
    memcpy(st->eval_data, t->ck.eval_data, sizeof st->eval_data);
}

/* Continue where the checkpoint left off: counters, running sums, the loss scaler, and the train
 * loader at the next sample of the epoch's order, whatever the batch sizes are now (the loader
 * cuts the rest of the epoch into this run's micro-batches and steps: ct_loader_seek). A position
 * past the end of the data set cannot be one in this epoch (a hand-edited state.json, or another
 * data set): CT_ERR_DATA rather than resuming somewhere else. A checkpoint written before
 * epoch_sample was recorded has it derived from epoch_step (checkpoint.c, resume). */
static int from_ckpt_state(ct_trainer *t, const ct_ckpt_state *st, loop_state *ls, ct_err *err) {
    int64_t count = t->d.train_ds->count;
    if (st->epoch_sample > count) {
        char what[160];
        long per = t->ck.position_step_samples;
        if (per > 0) /* derived from epoch_step */
            snprintf(what, sizeof what, "epoch_step: %ld steps of %ld samples (its train_batch_size) reach "
                     "sample %ld, which", st->epoch_step, per, st->epoch_sample);
        else
            snprintf(what, sizeof what, "epoch_sample: %ld", st->epoch_sample);
        return ct_errf(err, CT_ERR_DATA, "%s/state.json: %s is beyond the epoch (%lld samples in data.train %s); "
                       "the file was edited, or the data set changed since it was saved: resume from another "
                       "checkpoint or start fresh", t->ck.last, what, (long long)count, t->d.train_ds->source);
    }
    ct_amp *a = &t->m.amp;
    ls->step = st->step;
    ls->epoch = st->epoch;
    ls->epoch_step = st->epoch_step;
    ls->epoch_pos = st->epoch_sample;
    ls->micro = (uint64_t)st->micro_step;
    ls->epoch_loss = st->epoch_loss_sum;
    ls->epoch_n = st->epoch_loss_n;
    ls->samples = st->samples_seen;
    ls->best = st->es_best;
    ls->best_at = st->es_best_step;
    ls->bad_evals = st->es_bad_evals;
    ls->last_eval_step = st->last_eval_step;
    ls->best_value = st->best_value;
    ls->best_step = st->best_step;
    ls->saved_step = st->step;
    ls->saved_eval_step = st->last_eval_step;
    a->skipped = st->skipped_steps;
    if (a->scaling)
        ct_scaler_restore(&a->scaler, st->loss_scale, st->scaler_good_steps, st->scaler_hysteresis);
    t->sum->steps = st->step;
    t->sum->epochs = st->epoch + 1;
    t->sum->train_loss = st->train_loss;
    /* The loader goes on to the next epoch by itself when nothing is left of this one; the loop
     * then finds this epoch done (ct_loader_epoch_end <= epoch_pos). */
    ct_loader_seek(t->d.train_l, st->epoch, st->epoch_sample);
    return CT_OK;
}

static int save_now(ct_trainer *t, loop_state *ls, ct_err *err) {
    ct_ckpt_state st;
    to_ckpt_state(t, ls, &st);
    int rc = ct_trainer_ckpt_save(t, &st, err);
    if (rc) return rc;
    ls->saved_step = ls->step;
    ls->saved_eval_step = ls->last_eval_step;
    return CT_OK;
}

/* The value of a metric name (train.best_metric, early_stopping.metric) after an eval. */
static double metric_value(const ct_trainer *t, const char *name, double loss, double acc) {
    if (strcmp(name, "eval_accuracy") == 0) return acc;
    if (strcmp(name, "train_loss") == 0) return t->sum->train_loss;
    return loss;
}

/* best/ holds the model with the best train.best_metric so far (accuracy higher, losses lower). */
static int update_best(ct_trainer *t, loop_state *ls, double m, ct_err *err) {
    if (isnan(m) || strcmp(t->cfg->train.best_metric, "none") == 0) return CT_OK;
    bool higher = strcmp(t->cfg->train.best_metric, "eval_accuracy") == 0;
    if (!isnan(ls->best_value) && !(higher ? m > ls->best_value : m < ls->best_value)) return CT_OK;
    ls->best_value = m;
    ls->best_step = ls->step;
    ct_ckpt_state st;
    to_ckpt_state(t, ls, &st);
    return ct_trainer_ckpt_save_best(t, &st, err);
}

/* Eval now; update the summary and early stopping. *stop set when patience ran out. */
static int do_eval(ct_trainer *t, loop_state *ls, bool *stop, ct_err *err) {
    if (!t->d.eval_ds || ls->last_eval_step == ls->step) return CT_OK;
    double t0 = ct_now(), loss, acc;
    int rc = ct_trainer_evaluate(t, &loss, &acc, err);
    if (rc) return rc;
    ls->last_eval_step = ls->step;
    t->sum->eval_loss = loss;
    t->sum->eval_accuracy = acc;
    if (t->opts.on_eval) t->opts.on_eval(t->opts.on_step_ctx, ls->step);
    ct_report_eval(&t->obs.rep, ls->step, ls->epoch + 1, loss, acc, t->d.eval_ds->count, ct_now() - t0);
    ct_metrics_eval(t->obs.metrics, &(ct_metric_eval){
        .step = ls->step, .samples = ls->samples, .epoch = ls->epoch + 1, .loss = loss, .accuracy = acc,
        .perplexity = t->obs.rep.tokens_per_sample > 0 ? exp(loss) : NAN, .wall_s = ct_now() - t->obs.rep.t0});

    const ct_early_stop_cfg *es = &t->cfg->train.early_stopping;
    if (es->enabled) {
        double m = metric_value(t, es->metric, loss, acc);
        double gain = es->mode_max ? m - ls->best : ls->best - m;
        if (isnan(m)) {
            /* no value this time (every eval record skipped): neither better nor worse */
        } else if (isnan(ls->best) || gain > es->min_delta) {
            ls->best = m;
            ls->best_at = ls->step;
            ls->bad_evals = 0;
        } else if (++ls->bad_evals >= es->patience) {
            char at[48] = "";
            if (ls->best_at >= 0) snprintf(at, sizeof at, " at step %ld", ls->best_at);
            ct_report_line(&t->obs.rep, "early stopping: %s did not improve by %g for %d evals; best %.4g%s",
                           es->metric, es->min_delta, es->patience, ls->best, at);
            *stop = true;
        }
    }
    return update_best(t, ls, metric_value(t, t->cfg->train.best_metric, loss, acc), err);
}

/* The exit code and name of a stop signal. SIGHUP (the terminal closed) stops the run as SIGTERM
 * does: nobody is left to answer, so the step finishes and a checkpoint is saved. */
static int stop_code(int sig) {
    return sig == SIGTERM ? CT_EXIT_SIGTERM : sig == SIGHUP ? CT_EXIT_SIGHUP : CT_EXIT_SIGINT;
}
static const char *stop_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGINT"; }

/* Loop control besides CT_OK ("go on") and the error/exit codes: the run ended normally. */
#define LOOP_DONE (-1)

/* Eval now and early stopping's verdict: LOOP_DONE (status early_stopped) when patience ran out. */
static int eval_point(ct_trainer *t, loop_state *ls, ct_err *err) {
    bool stop = false;
    int rc = do_eval(t, ls, &stop, err);
    if (rc || !stop) return rc;
    ct_trainer_set_status(t, "early_stopped", NULL);
    return LOOP_DONE;
}

/* The epoch line, once its last step is done. */
static void report_epoch(ct_trainer *t, const loop_state *ls) {
    double secs = ct_now() - ls->epoch_t0;
    if (ls->epoch_n > 0 && ls->samples > ls->epoch_s0)
        ct_report_epoch(&t->obs.rep, ls->epoch + 1, t->d.epochs_planned, ls->step,
                        ls->epoch_loss / (double)ls->epoch_n, secs,
                        (double)(ls->samples - ls->epoch_s0) / fmax(secs, 1e-9),
                        (double)(ls->tokens - ls->epoch_k0) / fmax(secs, 1e-9));
}

/* train.sample_every: 64 bytes continuing a newline (temperature 0.8, top-k 40, drawn from the
 * stream (train.seed, sample, step) so a run prints the same samples again), as one report line
 * with newlines, quotes and unprintable bytes escaped. The training graph's activations are
 * overwritten; parameters, random streams and the loss are not, so training goes on bit for bit
 * as without it. */
static int print_sample(ct_trainer *t, long step, ct_err *err) {
    enum { N = 64 };
    int32_t ids[N + 1] = {'\n'};
    float logits[256];
    ct_rng rng;
    ct_rng_init(&rng, t->cfg->train.seed, CT_RNG_SAMPLE, (uint64_t)step);
    char text[4 * N + 1];
    size_t k = 0;
    for (int i = 1; i <= N; i++) {
        int rc = ct_lm_next_logits(t->m.sampler, ids, i, logits, err);
        if (rc) return rc;
        int c = ids[i] = ct_sample_token(logits, 256, 0.8, 40, &rng);
        if (c == '\n') k += (size_t)snprintf(text + k, sizeof text - k, "\\n");
        else if (c == '"' || c == '\\') k += (size_t)snprintf(text + k, sizeof text - k, "\\%c", c);
        else if (c < 32 || c > 126) k += (size_t)snprintf(text + k, sizeof text - k, "\\x%02x", c);
        else text[k++] = (char)c, text[k] = 0;
    }
    ct_report_line(&t->obs.rep, "sample (step %ld): \"%s\"", step, text);
    return CT_OK;
}

/* Bookkeeping, reporting, eval, checkpoint and stop checks after an optimizer step, in this
 * order: the eval of the step (every eval_interval steps; with eval_interval 0 at each epoch's
 * end; and at the run's end) comes before its checkpoint, so that the checkpoint's state.json
 * holds that eval and agrees with best/, and a checkpoint saved at the run's end is not saved
 * again by finish_run. */
/* wall_clock_breakdown at the end of a print window: the means per step of its phases, as one
 * line and in the window's metrics record; the sums start again. */
static void report_breakdown(ct_trainer *t, loop_state *ls, ct_metric_step *ms) {
    phase_times *p = &ls->window;
    double per = p->steps > 0 ? 1e3 / (double)p->steps : NAN;
    ms->breakdown = true;
    ms->data_wait_ms = p->data_wait * per, ms->forward_ms = p->forward * per;
    ms->backward_ms = p->backward * per, ms->optimizer_ms = p->optimizer * per, ms->step_ms = p->step * per;
    char left_out[64] = "";
    if (p->profiled) snprintf(left_out, sizeof left_out, " (step %ld profiled, left out)", p->profiled);
    ct_report_line(&t->obs.rep, "time (ms) per step, mean of steps %ld-%ld%s: data wait %.3f | forward %.3f | "
                   "backward %.3f | optimizer %.3f | step %.3f", ls->step - p->steps - (p->profiled > 0) + 1,
                   ls->step, left_out, ms->data_wait_ms, ms->forward_ms, ms->backward_ms, ms->optimizer_ms,
                   ms->step_ms);
    *p = (phase_times){0};
}

/* activation_checkpointing.profile at the end of a print window: the checkpointed segments'
 * forward, recompute and backward, mean ms per micro-batch, in all and segment by segment (as
 * DeepSpeed's profile logs each checkpointed function's forward and backward); the sums start
 * again. */
static void report_segment_times(ct_trainer *t) {
    int n;
    const ct_segment_times *st = ct_graph_segment_times(t->m.g, &n);
    if (!st || st[0].micro_batches == 0) return;
    double f = 0, r = 0, b = 0;
    char each[768] = "";
    size_t at = 0;
    for (int s = 0; s < n; s++) {
        double per = st[s].micro_batches > 0 ? 1e3 / (double)st[s].micro_batches : 0.0;
        f += st[s].forward_s * per, r += st[s].recompute_s * per, b += st[s].backward_s * per;
        int w = snprintf(each + at, sizeof each - at, "%s%.2f/%.2f/%.2f", s ? " " : "", st[s].forward_s * per,
                         st[s].recompute_s * per, st[s].backward_s * per);
        if (w < 0 || (size_t)w >= sizeof each - at) break;   /* a very deep model: the first ones */
        at += (size_t)w;
    }
    ct_report_line(&t->obs.rep, "activation checkpointing profile, ms per micro-batch (%ld): forward %.2f | "
                   "recompute %.2f | backward %.2f; by segment, forward/recompute/backward: %s",
                   st[0].micro_batches, f, r, b, each);
    ct_graph_segment_times_reset(t->m.g);
}

static int after_step(ct_trainer *t, loop_state *ls, double loss, const ct_optim_stats *st,
                      int64_t n, ct_err *err) {
    ls->step++;
    ls->epoch_step++;
    if (!isnan(loss)) { /* NaN: a step whose records were all skipped as corrupt */
        ls->epoch_loss += loss;
        ls->epoch_n++;
    }
    int64_t tokens = t->obs.rep.tokens_per_sample > 0 ? n * ls->step_len : 0;
    ls->samples += n;
    ls->tokens += tokens;
    ls->epoch_pos += n;
    ls->epoch_trained += ls->step_trained;
    ls->run_trained += ls->step_trained;
    ls->run_steps++;
    t->sum->steps = ls->step;
    t->sum->train_loss = ls->epoch_loss / (double)ls->epoch_n;
    if (t->obs.on_step) t->obs.on_step(t->obs.on_step_ctx, ls->step, loss);
    ct_step_event e = {.step = ls->step, .total_steps = t->d.total_steps, .epoch = ls->epoch + 1,
                       .epochs = t->d.epochs_planned,
                       .epoch_step = ls->epoch_step, .epoch_steps = ls->epoch_steps, .loss = loss, .lr = st->lr,
                       .grad_norm = st->grad_norm, .samples = n, .tokens = tokens,
                       .loss_scale = t->m.amp.scaling ? t->m.amp.scaler.scale : 0,
                       .skipped_steps = t->m.amp.skipped, .data_wait_s = ls->step_wait_s};
    ct_report_window w;
    if (ct_report_step(&t->obs.rep, &e, &w)) {
        ct_metric_step ms = {
            .step = ls->step, .epoch = ls->epoch + 1, .loss = w.loss, .lr = st->lr,
            .loss_scale = t->m.amp.scaling ? t->m.amp.scaler.scale : NAN, .samples_per_s = w.samples_per_s,
            .tokens_per_s = w.tokens_per_s, .data_wait_share = w.data_wait_share, .wall_s = w.wall_s,
            .gpu = !isnan(w.gpu_util), .gpu_util = w.gpu_util, .gpu_mem_used = w.gpu_mem_used};
        if (t->cfg->wall_clock_breakdown) report_breakdown(t, ls, &ms);
        report_segment_times(t);
        ct_metrics_step(t->obs.metrics, &ms);
    }
    ct_metrics_monitor(t->obs.metrics, &(ct_metric_monitor){
        .samples_before = ls->samples - n, .samples_after = ls->samples, .loss = loss,
        .lr = ct_optim_next_lr(t->m.opt), .loss_scale = t->m.amp.scaling ? t->m.amp.scaler.scale : NAN});
    long sample_every = t->cfg->train.sample_every;   /* under --quiet nobody would see it */
    if (sample_every > 0 && !t->obs.rep.quiet && ls->step % sample_every == 0) {
        int rc = print_sample(t, ls->step, err);
        if (rc) return rc;
    }
    bool epoch_done = ls->epoch_pos >= ls->epoch_end, last = ls->step >= t->d.total_steps;
    if (epoch_done) report_epoch(t, ls);
    char what[64];
    if (epoch_done && ls->epoch_whole && ls->epoch_trained == 0) {
        snprintf(what, sizeof what, "of epoch %d", ls->epoch + 1);
        return all_skipped(t, "train", t->d.train_ds, t->d.train_l, what, err);
    }
    if (last && ls->run_trained == 0) {
        snprintf(what, sizeof what, "read in this run's %ld step%s", ls->run_steps, ls->run_steps == 1 ? "" : "s");
        return all_skipped(t, "train", t->d.train_ds, t->d.train_l, what, err);
    }

    /* A pending stop signal skips the epoch's and the run's end eval (the run stops soon; a
     * resume from the checkpoint it saves makes that eval, see run_epoch), not an interval's. */
    long every = t->cfg->train.eval_interval;
    /* one process reads its flag; ranks act on the one they agreed in the step */
    int sig = t->comm->world > 1 ? ls->stop_sig : t->opts.stop_signal ? *t->opts.stop_signal : 0;
    bool signalled = sig != 0;
    bool eval_due = (every > 0 && ls->step % every == 0) ||
                    (!signalled && ((every == 0 && epoch_done) || last));
    int verdict = eval_due ? eval_point(t, ls, err) : CT_OK;
    if (verdict > 0) return verdict;
    long save_every = t->cfg->train.save_interval;
    if (save_every > 0 && ls->step % save_every == 0) {
        int rc = save_now(t, ls, err);
        if (rc) return rc;
    }
    if (verdict == LOOP_DONE) return LOOP_DONE; /* early stopping */
    if (signalled) {
        int rc = ls->saved_step == ls->step ? CT_OK : save_now(t, ls, err);
        if (rc) return rc; /* a failed save is an error, not an interruption */
        ct_metrics_flush(t->obs.metrics); /* the history up to the checkpoint is on disk */
        ct_trainer_set_status(t, "interrupted", NULL);
        ct_errf(err, stop_code(sig), "interrupted by %s after step %ld; saved %s", stop_name(sig), ls->step,
                t->cfg->checkpoint_enabled ? t->ck.last : "nothing (checkpoint.enabled false)");
        ct_report_line(&t->obs.rep, "%s", err->msg);
        return err->code;
    }
    return last ? LOOP_DONE : CT_OK;
}

/* One epoch of steps of train_batch_size samples, the last one fewer when the epoch ends first
 * (data.drop_last false); after_step makes the evals, saves and the epoch line. The epoch ends
 * where the loader says (a resume with another train_batch_size ends it after the last whole step
 * from where it resumed, under drop_last). A run resumed from a checkpoint of an epoch's last step
 * starts with that epoch done: the epoch-end eval a stop signal skipped then is made now. */
static int run_epoch(ct_trainer *t, loop_state *ls, ct_err *err) {
    int64_t gb = t->cfg->train_batch_size;
    if (ls->epoch_pos == 0) { /* else resumed inside this epoch: its sums go on */
        ls->epoch_loss = 0;
        ls->epoch_n = 0;
    }
    ls->epoch_whole = ls->epoch_pos == 0;
    ls->epoch_trained = 0;
    t->sum->epochs = ls->epoch + 1;
    ls->epoch_t0 = ct_now();
    ls->epoch_s0 = ls->samples;
    ls->epoch_k0 = ls->tokens;
    ls->epoch_end = ct_loader_epoch_end(t->d.train_l, ls->epoch);
    if (ls->epoch_pos >= ls->epoch_end)
        return ls->step > 0 && t->cfg->train.eval_interval == 0 ? eval_point(t, ls, err) : CT_OK;
    ls->epoch_steps = ls->epoch_step + (long)((ls->epoch_end - ls->epoch_pos + gb - 1) / gb);
    int end = CT_OK;
    while (ls->epoch_pos < ls->epoch_end && end == CT_OK) {
        int64_t k = ls->epoch_end - ls->epoch_pos < gb ? ls->epoch_end - ls->epoch_pos : gb;
        if (ls->step == 0) {
            t->sum->first_step_s = ct_process_age_s();
            ct_report_line(&t->obs.rep, "first step %.2fs after launch", t->sum->first_step_s);
        }
        double ts = ct_now(), loss = 0;
        ct_optim_stats st;
        phase_times before = ls->window;
        int rc = train_step(t, ls, k, &loss, &st, err);
        ls->train_s += ct_now() - ts;
        ls->wait_s += ls->step_wait_s;
        ls->window.data_wait += ls->step_wait_s;
        ls->window.step += ct_now() - ts;
        ls->window.steps++;
        if (rc) return rc;
        if (ct_trainer_profiler_step(t, ls->step + 1)) {   /* timed per layer: not a typical step */
            ls->window = before;
            ls->window.profiled = ls->step + 1;
            ct_trainer_profiler_report(t, ls->step + 1, k, ct_now() - ts);
        }
        end = after_step(t, ls, loss, &st, k, err);
    }
    return end;
}

/* The end of a run that finished (ok or early_stopped): save unless nothing changed since the
 * last checkpoint. A resumed run whose steps were already done only evaluates. */
static int finish_run(ct_trainer *t, loop_state *ls, ct_err *err) {
    if (isnan(t->sum->eval_loss) && t->d.eval_ds) {
        bool stop = false;
        ls->last_eval_step = -1; /* the summary needs the numbers even if this step was evaluated */
        int rc = do_eval(t, ls, &stop, err);
        if (rc) return rc;
    }
    if (ls->saved_step == ls->step && ls->saved_eval_step == ls->last_eval_step) return CT_OK;
    return save_now(t, ls, err);
}

int ct_trainer_fit(ct_trainer *t, ct_err *err) {
    loop_state ls = {.best = NAN, .best_at = -1, .last_eval_step = -1, .best_value = NAN,
                     .best_step = -1, .saved_step = -1, .saved_eval_step = -1};
    int rc = t->ck.resumed ? from_ckpt_state(t, &t->ck.resume_state, &ls, err) : CT_OK;
    if (rc) {
        ct_trainer_set_status(t, "error", err);
        ct_trainer_finish(t);
        return rc;
    }
    /* the master as initialised, resumed or loaded; from here on every update refreshes the copy
     * (under ZeRO each rank casts its part, and the ranks gather the others') */
    rc = ct_trainer_refresh_params(t, err);
    if (!rc) rc = share_params(t, err);
    if (rc) {
        ct_trainer_set_status(t, "error", err);
        ct_trainer_finish(t);
        return rc;
    }
    ct_trainer_set_status(t, "ok", NULL);
    t->sum->loss_scale = ct_amp_report_scale(&t->m.amp);
    t->sum->skipped_steps = t->m.amp.skipped;
    if ((rc = ct_trainer_observe_start(t, err))) {
        ct_trainer_set_status(t, "error", err);
        ct_trainer_finish(t);
        return rc;
    }
    ct_report_train_start(&t->obs.rep);
    rc = ls.step >= t->d.total_steps ? LOOP_DONE : CT_OK;
    if (rc == LOOP_DONE)
        ct_report_line(&t->obs.rep, "the checkpoint is at step %ld: the %ld planned steps are done", ls.step,
                       t->d.total_steps);
    while (rc == CT_OK) {
        rc = run_epoch(t, &ls, err);
        if (rc == CT_OK) { /* the epoch is complete and the run goes on */
            ls.epoch++;
            ls.epoch_step = 0;
            ls.epoch_pos = 0;
        }
    }
    if (rc == LOOP_DONE) rc = finish_run(t, &ls, err);
    if (rc == CT_ERR_DIVERGED && !strstr(err->msg, "checkpoint"))
        ct_err_append(err, "  %s%s", t->ck.last[0] ? "Last good checkpoint: " : "No checkpoint was "
                      "saved in this run.", t->ck.last);
    t->sum->samples_per_s = ls.train_s > 0 ? (double)ls.samples / ls.train_s : NAN;
    if (t->obs.rep.tokens_per_sample > 0)   /* a language model: tokens as the steps cut them */
        t->sum->tokens_per_s = ls.train_s > 0 ? (double)ls.tokens / ls.train_s : NAN;
    t->sum->mfu = ct_report_mfu(&t->obs.rep, t->sum->samples_per_s, t->sum->tokens_per_s);
    ct_report_gpu_summary(&t->obs.rep, &t->sum->gpu_util, &t->sum->gpu_mem_used_peak);
    t->sum->data_wait_share = ls.train_s > 0 ? ls.wait_s / ls.train_s : NAN;
    if (rc == CT_ERR_DIVERGED) ct_trainer_set_status(t, "diverged", err);
    else if (rc && strcmp(t->sum->status, "interrupted") != 0) ct_trainer_set_status(t, "error", err);
    ct_trainer_observe_end(t);
    ct_trainer_finish(t);
    ct_report_end(&t->obs.rep, t->sum);
    return rc;
}

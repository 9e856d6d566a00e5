/* train_loop.c: epochs, optimizer steps made of micro-batches, eval, early stopping, stop signals.
 *
 * One optimizer step consumes train_batch_size samples (the last one of an epoch fewer when
 * data.drop_last is false) as micro-batches of at most train_micro_batch_size_per_gpu. Each
 * micro-batch's loss gradient is weighted by its share of the step's samples (n_i / n, which is
 * 1 / gradient_accumulation_steps for full steps), so k micro-batches of b give the gradient of
 * one batch of k*b up to float rounding. Micro-batches come in order from the threaded loaders
 * (core/data/loader.h): the train stream runs on across epochs, reshuffled per epoch. */
#include <math.h>
#include <signal.h>
#include <string.h>

#include "core/train_impl.h"

/* One pass over the eval set: the eval loader's stream is unshuffled, so every pass (one of its
 * epochs) sees the same batches. */
int ct_trainer_evaluate(ct_trainer *t, double *loss, double *accuracy, ct_err *err) {
    int64_t n = 0, correct = 0;
    double sum = 0;
    ct_loader_batch b = {0};
    const float *params = ct_amp_refresh_params(t->amp, t->opt->params);
    do {
        int rc = ct_loader_next(t->eval_l, &b, err);
        if (rc) return rc;
        if (b.n == 0) continue; /* every record of the batch skipped as corrupt */
        ct_step_io io = {.input = b.input, .target = b.target, .n = b.n, .train = false,
                         .seed = t->cfg->train.seed, .loss_grad_scale = 1.0f};
        rc = ct_graph_forward(t->g, params, t->buffers, &io, NULL, err);
        if (rc) return rc;
        sum += (double)io.loss * (double)b.n;
        correct += io.correct;
        n += b.n;
    } while (!b.last_of_epoch);
    *loss = n ? sum / (double)n : NAN;
    *accuracy = t->info->classes > 0 && n ? (double)correct / (double)n : NAN;
    return CT_OK;
}

/* Loop position and running totals. */
typedef struct loop_state {
    long step;                   /* optimizer steps done */
    int epoch;                   /* 0-based current epoch */
    uint64_t micro;              /* micro-batches done: keys the dropout stream */
    double epoch_loss;           /* sum of step losses in this epoch */
    long epoch_n;
    double train_s;              /* seconds spent in training steps (not eval) */
    int64_t samples;             /* training samples processed */
    double best;                 /* early stopping: best metric so far */
    int bad_evals;
    long last_eval_step;
} loop_state;

/* The update closing a step. fp32/bf16: the optimizer step. fp16: one pass over the gradients
 * gives the overflow check and the global norm; 1/scale and the clip coefficient go into the
 * update's grad_scale; an overflow skips the update (weights, optimizer state and schedule stay as
 * they are) and the scaler lowers the scale (core/amp.h). step: the 1-based step number. */
static int apply_update(ct_trainer *t, long step, ct_optim_stats *st, ct_err *err) {
    ct_amp *a = t->amp;
    if (!a->scaling) {
        ct_optim_step(t->opt, 1.0f, st);
        return CT_OK;
    }
    double tried = a->scaler.scale;
    bool ok = ct_optim_step_finite(t->opt, (float)(1.0 / tried), st);
    ct_scale_event ev = ct_scaler_update(&a->scaler, !ok);
    t->sum->loss_scale = a->scaler.scale;
    if (ok) return CT_OK;
    t->sum->skipped_steps = ++a->skipped;
    if (ev == CT_SCALE_AT_MIN) {
        return ct_errf(err, CT_ERR_DIVERGED,
                       "loss scale at its minimum (%g) and gradients still overflow at step %ld.\n"
                       "  fp16 cannot represent this model's gradients; use \"bf16\": {\"enabled\": "
                       "true}. %s%s", tried, step,
                       t->last_ckpt[0] ? "Last good checkpoint: " : "No checkpoint was saved in this run.",
                       t->last_ckpt);
    }
    if (ev == CT_SCALE_HALVED)
        ct_report_line(&t->rep, "step %ld: gradient overflow at loss scale %g; step skipped, scale "
                       "lowered to %g", step, tried, a->scaler.scale);
    else if (ev == CT_SCALE_HYSTERESIS)
        ct_report_line(&t->rep, "step %ld: gradient overflow at loss scale %g; step skipped, scale "
                       "kept (hysteresis %d left)", step, tried, a->scaler.budget);
    else
        ct_report_line(&t->rep, "step %ld: gradient overflow at static loss scale %g; step skipped",
                       step, tried);
    return CT_OK;
}

/* One optimizer step over the next n samples (ceil(n / micro) micro-batches of the loader).
 * Returns CT_OK or an error; *loss = mean loss. */
static int train_step(ct_trainer *t, loop_state *ls, int64_t n, double *loss, ct_optim_stats *st,
                      ct_err *err) {
    const ct_config *cfg = t->cfg;
    int64_t mb = cfg->micro_batch, seen = 0;
    double sum = 0;
    ct_optim_zero_grad(t->opt);
    /* Mixed precision: forward/backward read the 16-bit copy of the master; the loss is scaled. */
    const float *params = ct_amp_refresh_params(t->amp, t->opt->params);
    float scale = ct_amp_loss_scale(t->amp);
    for (int64_t start = 0; start < n; start += mb) {
        ct_loader_batch b;
        int rc = ct_loader_next(t->train_l, &b, err);
        if (rc) return rc;
        int64_t k = b.n;
        if (k == 0) continue; /* every record of the batch skipped as corrupt */
        seen += k;
        ct_step_io io = {.input = b.input, .target = b.target, .n = k, .train = true,
                         .seed = cfg->train.seed, .step = ls->micro++,
                         .loss_grad_scale = (float)k / (float)n * scale};
        rc = ct_graph_forward(t->g, params, t->buffers, &io, NULL, err);
        if (rc) return rc;
        if (!isfinite(io.loss))
            return ct_errf(err, CT_ERR_DIVERGED,
                           "training diverged: loss is %s at step %ld (epoch %d). Lower the learning "
                           "rate (optimizer.params.lr) or set gradient_clipping (e.g. 1.0).%s",
                           isnan(io.loss) ? "NaN" : "infinite", ls->step + 1, ls->epoch + 1,
                           t->amp->compute == CT_F16 ? "\n  In fp16, activations above 65504 "
                           "overflow; \"bf16\": {\"enabled\": true} has fp32's range." : "");
        rc = ct_graph_backward(t->g, params, t->opt->grads, &io, NULL, err);
        if (rc) return rc;
        sum += (double)io.loss * (double)k;
    }
    *loss = seen ? sum / (double)seen : NAN;
    return apply_update(t, ls->step + 1, st, err);
}

/* Eval now; update the summary and early stopping. *stop set when patience ran out. */
static int do_eval(ct_trainer *t, loop_state *ls, bool *stop, ct_err *err) {
    if (!t->eval_ds || ls->last_eval_step == ls->step) return CT_OK;
    double t0 = ct_now(), loss, acc;
    int rc = ct_trainer_evaluate(t, &loss, &acc, err);
    if (rc) return rc;
    ls->last_eval_step = ls->step;
    t->sum->eval_loss = loss;
    t->sum->eval_accuracy = acc;
    ct_report_eval(&t->rep, ls->step, ls->epoch + 1, loss, acc, t->eval_ds->count, ct_now() - t0);

    const ct_early_stop_cfg *es = &t->cfg->train.early_stopping;
    if (!es->enabled) return CT_OK;
    double m = strcmp(es->metric, "eval_accuracy") == 0 ? acc : loss;
    double gain = es->mode_max ? m - ls->best : ls->best - m;
    if (isnan(ls->best) || gain > es->min_delta) {
        ls->best = m;
        ls->bad_evals = 0;
    } else if (++ls->bad_evals >= es->patience) {
        ct_report_line(&t->rep, "early stopping: %s did not improve by more than %g for %d evals "
                       "(best %.4g)", es->metric, es->min_delta, es->patience, ls->best);
        *stop = true;
    }
    return CT_OK;
}

static int stop_code(int sig) { return sig == SIGTERM ? CT_EXIT_SIGTERM : CT_EXIT_SIGINT; }

/* Loop control besides CT_OK ("go on") and the error/exit codes: the run ended normally. */
#define LOOP_DONE (-1)

/* Bookkeeping, reporting, eval and stop checks after an optimizer step. */
static int after_step(ct_trainer *t, loop_state *ls, double loss, const ct_optim_stats *st,
                      int64_t n, ct_err *err) {
    ls->step++;
    ls->epoch_loss += loss;
    ls->epoch_n++;
    ls->samples += n;
    t->sum->steps = ls->step;
    t->sum->train_loss = ls->epoch_loss / (double)ls->epoch_n;
    if (t->on_step) t->on_step(t->on_step_ctx, ls->step, loss);
    ct_step_event e = {.step = ls->step, .total_steps = t->total_steps, .epoch = ls->epoch + 1,
                       .epochs = t->epochs_planned,
                       .epoch_step = (ls->step - 1) % t->steps_per_epoch + 1,
                       .epoch_steps = t->steps_per_epoch, .loss = loss, .lr = st->lr,
                       .grad_norm = st->grad_norm, .samples = n,
                       .loss_scale = t->amp->scaling ? t->amp->scaler.scale : 0};
    ct_report_step(&t->rep, &e);

    bool stop = false;
    long every = t->cfg->train.eval_interval;
    if (every > 0 && ls->step % every == 0) {
        int rc = do_eval(t, ls, &stop, err);
        if (rc) return rc;
    }
    if (stop) {
        ct_trainer_set_status(t, "early_stopped", NULL);
        return LOOP_DONE;
    }
    if (t->opts.stop_signal && *t->opts.stop_signal) {
        int sig = *t->opts.stop_signal;
        ct_trainer_set_status(t, "interrupted", NULL);
        ct_errf(err, stop_code(sig), "interrupted by %s after step %ld; stopped cleanly (no "
                "checkpoint: this version does not write checkpoints yet)",
                sig == SIGTERM ? "SIGTERM" : "SIGINT", ls->step);
        ct_report_line(&t->rep, "%s", err->msg);
        return err->code;
    }
    return ls->step >= t->total_steps ? LOOP_DONE : CT_OK;
}

/* One epoch: steps, the epoch line, and the end-of-epoch (or end-of-run) eval. */
static int run_epoch(ct_trainer *t, loop_state *ls, ct_err *err) {
    int64_t n = t->epoch_samples, gb = t->cfg->train_batch_size;
    ls->epoch_loss = 0;
    ls->epoch_n = 0;
    t->sum->epochs = ls->epoch + 1;
    double t0 = ct_now();
    int64_t s0 = ls->samples;
    int end = CT_OK;
    long s = 0;
    for (; s < t->steps_per_epoch && end == CT_OK; s++) {
        int64_t start = s * gb, k = n - start < gb ? n - start : gb;
        if (ls->step == 0) {
            t->sum->first_step_s = ct_process_age_s();
            ct_report_line(&t->rep, "first step %.2fs after launch", t->sum->first_step_s);
        }
        double ts = ct_now(), loss = 0;
        ct_optim_stats st;
        int rc = train_step(t, ls, k, &loss, &st, err);
        ls->train_s += ct_now() - ts;
        if (rc) return rc;
        end = after_step(t, ls, loss, &st, k, err);
    }
    if (end > 0) return end; /* error or signal: no eval */
    double secs = ct_now() - t0;
    if (s == t->steps_per_epoch)
        ct_report_epoch(&t->rep, ls->epoch + 1, t->epochs_planned, ls->step,
                        ls->epoch_loss / (double)ls->epoch_n, secs,
                        (double)(ls->samples - s0) / fmax(secs, 1e-9));
    /* Eval at each epoch's end (eval_interval 0) and at the end of the run. */
    if (t->cfg->train.eval_interval == 0 || end == LOOP_DONE) {
        bool stop = false;
        int rc = do_eval(t, ls, &stop, err);
        if (rc) return rc;
        if (stop && end == CT_OK) {
            ct_trainer_set_status(t, "early_stopped", NULL);
            end = LOOP_DONE;
        }
    }
    return end;
}

int ct_trainer_fit(ct_trainer *t, ct_err *err) {
    loop_state ls = {.best = NAN, .last_eval_step = -1};
    ct_trainer_set_status(t, "ok", NULL);
    t->sum->loss_scale = ct_amp_report_scale(t->amp);
    t->sum->skipped_steps = t->amp->skipped;
    ct_report_train_start(&t->rep);
    int rc = CT_OK;
    for (ls.epoch = 0; rc == CT_OK; ls.epoch++) rc = run_epoch(t, &ls, err);
    if (rc == LOOP_DONE) rc = CT_OK;
    t->sum->samples_per_s = ls.train_s > 0 ? (double)ls.samples / ls.train_s : NAN;
    if (rc == CT_ERR_DIVERGED) ct_trainer_set_status(t, "diverged", err);
    else if (rc && strcmp(t->sum->status, "interrupted") != 0) ct_trainer_set_status(t, "error", err);
    ct_trainer_finish(t);
    ct_report_end(&t->rep, t->sum);
    return rc;
}

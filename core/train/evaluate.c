/* evaluate.c: a saved checkpoint loaded into a fresh trainer and evaluated: `ctrain eval`
 * (ct_train_eval_checkpoint), and --smoke's last stage (ct_train_load_eval: the checkpoint a run
 * saved, read back, so a broken save or load fails the smoke run). */
#include <math.h>

#include "core/train/internal.h"

int ct_train_load_eval(const ct_config *cfg, const char *dir, long *step, double *loss, double *accuracy,
                       ct_err *err) {
    ct_run_opts ro = {.quiet = true, .weights_from_checkpoint = true, .forward_only = true};
    ct_summary s;
    ct_summary_init(&s);
    ct_trainer *t = NULL;
    *loss = *accuracy = NAN;
    int rc = ct_trainer_open_bare(cfg, &ro, &s, &t, err);
    ct_ckpt_state st;
    if (!rc) rc = ct_trainer_ckpt_load_model(t, dir, &st, err);
    if (!rc) *step = st.step;
    if (!rc && t->d.eval_ds) rc = ct_trainer_evaluate(t, loss, accuracy, err);
    ct_trainer_close(t);
    return rc;
}

int ct_train_eval_checkpoint(const ct_config *cfg, const ct_run_opts *opts, const char *dir, ct_summary *s,
                             ct_err *err) {
    ct_run_opts ro = {.quiet = opts->quiet, .summary_path = opts->summary_path, .weights_from_checkpoint = true,
                      .forward_only = true};
    ct_trainer *t = NULL;
    int rc = ct_trainer_open_bare(cfg, &ro, s, &t, err);
    if (!rc && !t->d.eval_ds)
        rc = ct_errf(err, CT_ERR_CONFIG, "%s: data.eval: missing; ctrain eval needs an eval set "
                     "(e.g. {\"format\": \"idx\", \"images\": ..., \"labels\": ...})", cfg->path);
    ct_ckpt_state st;
    if (!rc) rc = ct_trainer_ckpt_load_model(t, dir, &st, err);
    double loss = 0, acc = 0, t0 = ct_now();
    if (!rc) rc = ct_trainer_evaluate(t, &loss, &acc, err);
    if (!rc) {
        ct_trainer_set_status(t, "ok", NULL);
        s->steps = st.step;
        s->epochs = st.epoch + (st.epoch_step > 0 ? 1 : 0);
        s->train_loss = st.train_loss;
        s->eval_loss = loss;
        s->eval_accuracy = acc;
        ct_report_eval(&t->obs.rep, st.step, st.epoch + 1, loss, acc, t->d.eval_ds->count, ct_now() - t0);
        ct_report_line(&t->obs.rep, "evaluated %s (step %ld) on data.eval", t->ck.last, st.step);
    } else {
        ct_trainer_set_status(t, "error", err);
    }
    ct_trainer_finish(t);
    ct_trainer_close(t);
    return rc;
}

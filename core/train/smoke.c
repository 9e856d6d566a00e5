/* smoke.c: --smoke's last stage (train.h ct_train_load_eval): the checkpoint a run saved, loaded
 * into a fresh trainer and evaluated, so a broken save or load fails the smoke run. */
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

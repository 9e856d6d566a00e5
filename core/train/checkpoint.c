/* checkpoint.c: the trainer's side of checkpoints: which tensors a checkpoint holds, the run
 * directory's config.json, resume (--resume), model.init_from, saving global_step<N> and best/,
 * and `ctrain eval`. The file format and the crash-safe protocol are ckpt.c's; the loop decides
 * when to save (loop.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/train/internal.h"
#include "core/util/fs.h"

/* ---- host staging: a device backend's buffers are copied through host memory ---- */

/* Pairs (device buffer, host buffer in ck, floats) for everything a checkpoint holds: the master
 * of the store's range, the buffers, the optimizer's slots (in ct_optim_slots' order, which is
 * ck's). */
typedef struct ck_pair {
    float *dev, *host;
    int64_t n;
} ck_pair;

static int ck_pairs(const ct_trainer *t, ck_pair out[2 + CT_CKPT_MAX_SLOTS]) {
    const ct_param_store *p = t->m.params;
    const ct_ckpt_tensors *ck = &t->ck.ck;
    int k = 0;
    out[k++] = (ck_pair){p->master, ck->params, p->hi - p->lo};
    if (ck->n_buffers > 0) out[k++] = (ck_pair){p->buffers, ck->buffers, ck->n_buffers};
    const char *names[CT_OPTIM_MAX_SLOTS];
    float *state[CT_OPTIM_MAX_SLOTS];
    int n = ct_optim_slots(t->m.opt, names, state);
    for (int s = 0; s < n; s++) out[k++] = (ck_pair){state[s], ck->slot[s], p->hi - p->lo};
    return k;
}

static void ck_to_host(ct_trainer *t) {
    if (!t->ck.staged) return;
    ck_pair p[2 + CT_CKPT_MAX_SLOTS];
    int k = ck_pairs(t, p);
    t->be->queue.sync(t->be);
    for (int i = 0; i < k; i++) t->be->mem.copy_d2h(t->be, p[i].host, p[i].dev, (size_t)p[i].n * sizeof(float));
}

static void ck_to_device(ct_trainer *t) {
    if (!t->ck.staged) return;
    ck_pair p[2 + CT_CKPT_MAX_SLOTS];
    int k = ck_pairs(t, p);
    for (int i = 0; i < k; i++) t->be->mem.copy_h2d(t->be, p[i].dev, p[i].host, (size_t)p[i].n * sizeof(float));
    t->be->queue.sync(t->be);
}

/* ck over the store's and the optimizer's buffers; on a device backend over host copies. */
static void ck_setup(ct_trainer *t) {
    ct_param_store *p = t->m.params;
    ct_ckpt_tensors *ck = &t->ck.ck;
    ct_ckpt_tensors_for(p->layout, t->m.opt, p->lo, p->hi, p->master, p->buffers, ck);
    if (strcmp(t->be->name, "cpu") == 0) return;
    t->ck.staged = true;
    size_t np = (size_t)(p->hi - p->lo) + 1;
    ck->params = ct_xcalloc(np, sizeof(float));
    ck->buffers = ct_xcalloc((size_t)ck->n_buffers + 1, sizeof(float));
    for (int s = 0; s < ck->n_slots; s++) ck->slot[s] = ct_xcalloc(np, sizeof(float));
}

void ct_trainer_ckpt_close(ct_trainer *t) {
    ct_ckpt_tensors *ck = &t->ck.ck;
    if (t->ck.staged) {
        free(ck->params);
        free(ck->buffers);
        for (int s = 0; s < ck->n_slots; s++) free(ck->slot[s]);
    }
    memset(ck, 0, sizeof *ck);
    t->ck.staged = false;
}

static void print_warnings(ct_warnings *w) {
    for (int i = 0; i < w->n; i++) fprintf(stderr, "ctrain: warning: %s\n", w->items[i]);
    ct_warnings_free(w);
}

/* ---- start of a run ---- */

/* <run_dir>/config.json: the resolved config, so a run directory says how it was made. */
static int write_run_config(ct_trainer *t, ct_err *err) {
    const char *dir = t->cfg->train.run_dir;
    int rc = ct_fs_mkdirs(dir, err);
    if (rc) return rc;
    char *json = ct_config_to_json(t->cfg);
    size_t len = strlen(json);
    json = ct_xrealloc(json, len + 2);
    json[len++] = '\n';
    json[len] = '\0';
    rc = ct_fs_replace_file(dir, "config.json", json, len, err);
    free(json);
    return rc;
}

/* Each "path: old -> new" line of the config diff, indented under a heading. */
static void report_config_diff(ct_trainer *t, const cJSON *saved) {
    char diff[4096];
    int n = ct_ckpt_config_diff(saved, t->cfg->resolved, diff, sizeof diff);
    if (n == 0) return;
    ct_report_line(&t->obs.rep, "config changed since the checkpoint (%d difference%s):", n, n == 1 ? "" : "s");
    for (char *line = strtok(diff, "\n"); line; line = strtok(NULL, "\n"))
        ct_report_line(&t->obs.rep, "  %s", line);
}

static int resume(ct_trainer *t, ct_err *err) {
    const ct_config *cfg = t->cfg;
    char dir[4096];
    ct_warnings warn = {0};
    int rc = ct_ckpt_resolve(t->opts.resume, cfg->train.save_dir, dir, sizeof dir, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    if (!dir[0]) {
        ct_report_line(&t->obs.rep, "resume auto: no checkpoint in %s yet; starting fresh", cfg->train.save_dir);
        return CT_OK;
    }
    ct_ckpt_state st;
    cJSON *saved = NULL;
    rc = ct_ckpt_load(dir, &t->ck.ck, CT_CKPT_LOAD_ALL, &st, &saved, err);
    if (rc) return rc;
    ck_to_device(t);
    t->m.opt->applied = st.applied;
    t->m.opt->sched_t = st.sched_t;
    t->ck.resumed = true;
    t->ck.resume_state = st;
    snprintf(t->ck.last, sizeof t->ck.last, "%s", dir);
    ct_report_line(&t->obs.rep, "resuming from %s at step %ld (epoch %d, step %ld of the epoch)", dir, st.step,
                   st.epoch + 1, st.epoch_step);
    report_config_diff(t, saved);
    cJSON_Delete(saved);
    return CT_OK;
}

/* model.init_from (relative to the config's directory) with model.init_strict (default true). */
static int init_from(ct_trainer *t, ct_err *err) {
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(t->cfg->model, "init_from");
    if (!cJSON_IsString(file) || !file->valuestring[0]) return CT_OK;
    bool strict = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(t->cfg->model, "init_strict"));
    char path[4096];
    ct_config_resolve_path(t->cfg, file->valuestring, path, sizeof path);
    ct_warnings warn = {0};
    int n = 0;
    ck_to_host(t); /* the seed's initialisation stays where the file has no tensor */
    int rc = ct_ckpt_init_from(path, &t->ck.ck, strict, &n, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    ck_to_device(t);
    ct_report_line(&t->obs.rep, "init_from %s: %d of %d tensors loaded%s", path, n, t->ck.ck.n_views,
                   n < t->ck.ck.n_views ? " (init_strict false; the rest keep their initialisation)" : "");
    return CT_OK;
}

int ct_trainer_ckpt_start(ct_trainer *t, ct_err *err) {
    ck_setup(t);
    ct_ckpt_config_hash(t->cfg->resolved, t->ck.config_hash);
    int rc = t->opts.dry_run ? CT_OK : write_run_config(t, err);
    if (!rc && t->opts.resume) rc = resume(t, err);
    if (!rc && !t->ck.resumed) rc = init_from(t, err);
    return rc;
}

/* ---- saving ---- */

int ct_trainer_ckpt_save(ct_trainer *t, const ct_ckpt_state *st, ct_err *err) {
    double t0 = ct_now();
    ck_to_host(t);
    ct_ckpt_save_opts o = {.keep_last = t->cfg->train.keep_last};
    char dir[4096];
    int rc = ct_ckpt_save(t->cfg->train.save_dir, &t->ck.ck, st, t->cfg->resolved, &o, dir, sizeof dir, err);
    if (rc) return rc;
    snprintf(t->ck.last, sizeof t->ck.last, "%s", dir);
    ct_report_line(&t->obs.rep, "saved %s (%.2fs)", dir, ct_now() - t0);
    return CT_OK;
}

int ct_trainer_ckpt_save_best(ct_trainer *t, const ct_ckpt_state *st, ct_err *err) {
    ck_to_host(t);
    return ct_ckpt_save_best(t->cfg->train.save_dir, &t->ck.ck, st, t->cfg->resolved, err);
}

int ct_trainer_ckpt_load_model(ct_trainer *t, const char *dir, ct_ckpt_state *st, ct_err *err) {
    if (!t->ck.ck.views) ck_setup(t);
    char resolved[4096];
    ct_warnings warn = {0};
    int rc = ct_ckpt_resolve(dir, NULL, resolved, sizeof resolved, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    ck_to_host(t); /* optimizer slots are not loaded: keep the device's values in the copies */
    rc = ct_ckpt_load(resolved, &t->ck.ck, CT_CKPT_LOAD_MODEL | CT_CKPT_LOAD_STATE, st, NULL, err);
    if (rc) return rc;
    ck_to_device(t);
    ct_param_store_refresh(t->m.params);   /* the 16-bit copy evaluation reads */
    snprintf(t->ck.last, sizeof t->ck.last, "%s", resolved);
    return CT_OK;
}

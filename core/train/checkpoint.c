/* train_ckpt.c: the trainer's side of checkpoints: which tensors a checkpoint holds, the run
 * directory's config.json, resume (--resume), model.init_from, saving global_step<N> and best/,
 * and `ctrain eval`. The file format and the crash-safe protocol are ckpt.c's; the loop decides
 * when to save (train_loop.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/fs.h"
#include "core/train/internal.h"

/* ---- host staging: a device backend's buffers are copied through host memory ---- */

/* Pairs (device buffer, host buffer in ck, floats) for everything a checkpoint holds. */
typedef struct ck_pair {
    float *dev, *host;
    int64_t n;
} ck_pair;

static int ck_pairs(const ct_trainer *t, ck_pair out[3 + CT_CKPT_MAX_SLOTS]) {
    int k = 0, s = 0;
    out[k++] = (ck_pair){t->opt->params, t->ck.params, t->ck.n_params};
    if (t->ck.n_buffers > 0) out[k++] = (ck_pair){t->buffers, t->ck.buffers, t->ck.n_buffers};
    /* The same order as ct_ckpt_tensors_for assigns slots. */
    float *slots[] = {t->opt->m, t->opt->v, t->opt->mom};
    for (int i = 0; i < CT_ARRAY_LEN(slots) && s < t->ck.n_slots; i++)
        if (slots[i]) out[k++] = (ck_pair){slots[i], t->ck.slot[s++], t->ck.n_params};
    return k;
}

static void ck_to_host(ct_trainer *t) {
    if (!t->ck_staged) return;
    ck_pair p[3 + CT_CKPT_MAX_SLOTS];
    int k = ck_pairs(t, p);
    t->be->queue.sync(t->be);
    for (int i = 0; i < k; i++) t->be->mem.copy_d2h(t->be, p[i].host, p[i].dev, (size_t)p[i].n * sizeof(float));
}

static void ck_to_device(ct_trainer *t) {
    if (!t->ck_staged) return;
    ck_pair p[3 + CT_CKPT_MAX_SLOTS];
    int k = ck_pairs(t, p);
    for (int i = 0; i < k; i++) t->be->mem.copy_h2d(t->be, p[i].dev, p[i].host, (size_t)p[i].n * sizeof(float));
    t->be->queue.sync(t->be);
}

/* ck over the optimizer's buffers; on a device backend over host copies of them. */
static void ck_setup(ct_trainer *t) {
    ct_ckpt_tensors_for(t->g, t->opt, NULL, t->buffers, &t->ck);
    if (strcmp(t->be->name, "cpu") == 0) return;
    t->ck_staged = true;
    size_t np = (size_t)t->ck.n_params + 1;
    t->ck.params = ct_xcalloc(np, sizeof(float));
    t->ck.buffers = ct_xcalloc((size_t)t->ck.n_buffers + 1, sizeof(float));
    for (int s = 0; s < t->ck.n_slots; s++) t->ck.slot[s] = ct_xcalloc(np, sizeof(float));
}

void ct_trainer_ckpt_close(ct_trainer *t) {
    if (t->ck_staged) {
        free(t->ck.params);
        free(t->ck.buffers);
        for (int s = 0; s < t->ck.n_slots; s++) free(t->ck.slot[s]);
    }
    ct_ckpt_tensors_free(&t->ck);
    t->ck_staged = false;
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
    ct_report_line(&t->rep, "config changed since the checkpoint (%d difference%s):", n, n == 1 ? "" : "s");
    for (char *line = strtok(diff, "\n"); line; line = strtok(NULL, "\n"))
        ct_report_line(&t->rep, "  %s", line);
}

static int resume(ct_trainer *t, ct_err *err) {
    const ct_config *cfg = t->cfg;
    char dir[4096];
    ct_warnings warn = {0};
    int rc = ct_ckpt_resolve(t->opts.resume, cfg->train.save_dir, dir, sizeof dir, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    if (!dir[0]) {
        ct_report_line(&t->rep, "resume auto: no checkpoint in %s yet; starting fresh", cfg->train.save_dir);
        return CT_OK;
    }
    ct_ckpt_state st;
    cJSON *saved = NULL;
    rc = ct_ckpt_load(dir, &t->ck, CT_CKPT_LOAD_ALL, &st, &saved, err);
    if (rc) return rc;
    ck_to_device(t);
    t->opt->applied = st.applied;
    t->opt->sched_t = st.sched_t;
    t->resumed = true;
    t->resume_state = st;
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", dir);
    ct_report_line(&t->rep, "resuming from %s at step %ld (epoch %d, step %ld of the epoch)", dir, st.step,
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
    int rc = ct_ckpt_init_from(path, &t->ck, strict, &n, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    ck_to_device(t);
    ct_report_line(&t->rep, "init_from %s: %d of %d tensors loaded%s", path, n, t->ck.n_views,
                   n < t->ck.n_views ? " (init_strict false; the rest keep their initialisation)" : "");
    return CT_OK;
}

int ct_trainer_ckpt_start(ct_trainer *t, ct_err *err) {
    ck_setup(t);
    ct_ckpt_config_hash(t->cfg->resolved, t->config_hash);
    int rc = t->opts.dry_run ? CT_OK : write_run_config(t, err);
    if (!rc && t->opts.resume) rc = resume(t, err);
    if (!rc && !t->resumed) rc = init_from(t, err);
    return rc;
}

/* ---- saving ---- */

int ct_trainer_ckpt_save(ct_trainer *t, const ct_ckpt_state *st, ct_err *err) {
    double t0 = ct_now();
    ck_to_host(t);
    ct_ckpt_save_opts o = {.keep_last = t->cfg->train.keep_last};
    char dir[4096];
    int rc = ct_ckpt_save(t->cfg->train.save_dir, &t->ck, st, t->cfg->resolved, &o, dir, sizeof dir, err);
    if (rc) return rc;
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", dir);
    ct_report_line(&t->rep, "saved %s (%.2fs)", dir, ct_now() - t0);
    return CT_OK;
}

int ct_trainer_ckpt_save_best(ct_trainer *t, const ct_ckpt_state *st, ct_err *err) {
    ck_to_host(t);
    return ct_ckpt_save_best(t->cfg->train.save_dir, &t->ck, st, t->cfg->resolved, err);
}

int ct_trainer_ckpt_load_model(ct_trainer *t, const char *dir, ct_ckpt_state *st, ct_err *err) {
    if (!t->ck.views) ck_setup(t);
    char resolved[4096];
    ct_warnings warn = {0};
    int rc = ct_ckpt_resolve(dir, NULL, resolved, sizeof resolved, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    ck_to_host(t); /* optimizer slots are not loaded: keep the device's values in the copies */
    rc = ct_ckpt_load(resolved, &t->ck, CT_CKPT_LOAD_MODEL | CT_CKPT_LOAD_STATE, st, NULL, err);
    if (rc) return rc;
    ck_to_device(t);
    ct_amp_refresh_params(t->amp, t->opt->params);   /* the 16-bit copy evaluation reads */
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", resolved);
    return CT_OK;
}

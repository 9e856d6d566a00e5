/* checkpoint.c: the trainer's side of checkpoints: which tensors a checkpoint holds, the run
 * directory (outputs checked, its lock, whose run it holds, its config.json), resume (--resume),
 * model.init_from, saving global_step<N> and best/, keep_last at the start, and `ctrain eval`. The file format and the crash-safe protocol are ckpt.c's; the loop decides
 * when to save (loop.c). */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/ckpt/mapped.h"
#include "core/ckpt/owned.h"
#include "core/graph/hf_gpt2.h"
#include "core/graph/hf_llama.h"
#include "core/train/internal.h"
#include "core/train/nvme.h"
#include "core/util/fs.h"

/* ---- the tensors a checkpoint holds: the store's and the optimizer's own buffers ---- */

/* A device backend's memory, reached through its synchronous copies: ckpt moves a checkpoint's
 * values through one bounded staging buffer (ckpt.h's ct_ckpt_mem), never a whole copy. */
static int device_to_host(void *ctx, const float *base, int64_t at, int64_t n, float *dst_host, ct_err *err) {
    ct_backend *be = ctx;
    be->mem.copy_d2h(be, dst_host, base + at, (size_t)n * sizeof(float));
    return CT_OK;
}

static int device_from_host(void *ctx, float *base, int64_t at, int64_t n, const float *src_host, ct_err *err) {
    ct_backend *be = ctx;
    be->mem.copy_h2d(be, base + at, src_host, (size_t)n * sizeof(float));
    return CT_OK;
}

/* ck over this rank's range of the store's master and buffers and of the optimizer's slots, where
 * they are: nothing is allocated or copied. Host memory (the CPU backend's, or ZeRO-Offload's
 * master and optimizer state) is written and read in place; a device's memory is reached through
 * its copies. A run of several ranks under ZeRO holds a part of the space: its checkpoints are
 * per-rank shards. */
static void ck_setup(ct_trainer *t) {
    ct_param_store *p = t->m.params;
    ct_ckpt_tensors *ck = &t->ck.ck;
    ct_ckpt_tensors_for(p->layout, t->m.opt, p->lo, p->hi, p->master, p->buffers, ck);
    if (t->m.nvme) ct_nvme_ckpt_tensors(t->m.nvme, ck);   /* in swap files, reached by element */
    if (!ct_backend_separate_memory(t->be)) return;
    t->ck.device = (ct_ckpt_mem){.ctx = t->be, .to_host = device_to_host, .from_host = device_from_host};
    ck->buffers_mem = &t->ck.device;
    if (p->host_state) return;   /* offload_optimizer: master and optimizer state in host memory (or files) */
    ck->params_mem = &t->ck.device;
    for (int s = 0; s < ck->n_slots; s++) ck->slot_mem[s] = &t->ck.device;
}

void ct_trainer_ckpt_close(ct_trainer *t) {
    memset(&t->ck.ck, 0, sizeof t->ck.ck);
    if (t->ck.locked) close(t->ck.lock_fd); /* the run directory is free again */
    t->ck.locked = false;
}

static void print_warnings(ct_warnings *w) {
    for (int i = 0; i < w->n; i++) {
        ct_fputs_printable_line("ctrain: warning: ", w->items[i], stderr);   /* they may quote names from files */
    }
    ct_warnings_free(w);
}

/* ---- the run directory, before the set-up: outputs, lock, whose run it holds ---- */

/* An output path that cannot be written is the user's to fix (another path, permissions), so it
 * exits 2; checked before the set-up instead of failing at the first save, an epoch later. */
static int output_error(const char *what, const char *flag, const ct_err *e, ct_err *err) {
    return ct_errf(err, CT_ERR_CONFIG, "%s: %s\n  Nothing was trained. Give a path that can be "
                   "written (%s) or fix the directory's permissions.", what, e->msg, flag);
}

/* --summary must not replace one of ctrain's own files: a checkpoint's (anything in
 * train.save_dir), run_dir/config.json, run_dir/metrics.jsonl or run_dir/.lock (the lock lives on
 * its inode), nor one another run keeps (core/ckpt/owned.h). The summary file is then left alone,
 * also on the way out. */
static int check_summary_path(const ct_trainer *t, ct_err *err) {
    const char *out = t->opts.summary_path;
    const ct_train_cfg *tc = &t->cfg->train;
    static const char *const own[] = {"config.json", ".lock", "metrics.jsonl"};
    char where[2 * PATH_MAX + 100] = "";
    if (ct_fs_within(out, tc->save_dir))
        snprintf(where, sizeof where, "inside train.save_dir %.100s, where the checkpoints are",
                 tc->save_dir);
    for (int i = 0; i < CT_ARRAY_LEN(own) && !where[0]; i++) {
        char a[PATH_MAX], b[PATH_MAX], mine[4200];
        snprintf(mine, sizeof mine, "%s/%s", tc->run_dir, own[i]);
        if (ct_fs_resolve(out, a, sizeof a) && ct_fs_resolve(mine, b, sizeof b) && !strcmp(a, b))
            snprintf(where, sizeof where, "the run directory's %s", own[i]);
    }
    if (!where[0]) ct_owned_output(out, where, sizeof where);
    if (!where[0]) return CT_OK;
    t->sum->summary_file_refused = true;
    return ct_errf(err, CT_ERR_CONFIG, "--summary %s is %s; the summary would replace a file "
                   "ctrain keeps there.\n  Nothing was trained. Give the summary another path, "
                   "e.g. --summary %s/summary.json", out, where, tc->run_dir);
}

static int check_outputs(const ct_trainer *t, ct_err *err) {
    const ct_train_cfg *tc = &t->cfg->train;
    ct_err e = {0};
    if (ct_fs_check_dir_writable(tc->run_dir, &e))
        return output_error("train.run_dir", "--set train.run_dir=DIR", &e, err);
    if (ct_fs_check_dir_writable(tc->save_dir, &e))
        return output_error("train.save_dir", "--set train.save_dir=DIR", &e, err);
    if (t->opts.summary_path && ct_fs_check_output_file(t->opts.summary_path, &e))
        return output_error("--summary", "--summary FILE", &e, err);
    return t->opts.summary_path ? check_summary_path(t, err) : CT_OK;
}

/* run_dir/.lock holds "<pid>\n<config file>\n": the pid of the run holding the directory (or that
 * held it last) and the config file that run_dir/config.json was made from, so a refusal can
 * name both. */
typedef struct lock_note {
    long pid;                    /* 0: unknown */
    char config[PATH_MAX];       /* "": unknown */
} lock_note;

static void parse_note(const char *text, lock_note *n) {
    char *end;
    *n = (lock_note){.pid = strtol(text, &end, 10)};
    if (end == text || *end != '\n') {
        n->pid = 0;
        return;
    }
    snprintf(n->config, sizeof n->config, "%.*s", (int)strcspn(end + 1, "\n"), end + 1);
}

/* The config file as an absolute path when it can be had (a note outlives the working
 * directory it was written from). */
static void config_file(const ct_config *cfg, char *out, size_t n) {
    char abs[PATH_MAX];
    snprintf(out, n, "%s", realpath(cfg->path, abs) ? abs : cfg->path);
}

static int write_note(ct_trainer *t, const char *config, ct_err *err) {
    char path[4096], note[PATH_MAX + 32];
    int rc = ct_fs_join(path, sizeof path, t->cfg->train.run_dir, ".lock", err);
    snprintf(note, sizeof note, "%ld\n%s\n", (long)getpid(), config);
    return rc ? rc : ct_fs_lock_note(t->ck.lock_fd, path, note, err);
}

static cJSON *read_config_json(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = ct_fs_read_small(path, 64u << 20, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

/* The refusal of check_owner: both config files, the settings that differ, what to do. */
static int refuse_other_run(const ct_trainer *t, const char *record, const lock_note *last,
                            const cJSON *saved, const char *newest, ct_err *err) {
    const ct_config *cfg = t->cfg;
    char mine[PATH_MAX], diff[1500];
    config_file(cfg, mine, sizeof mine);
    int n = ct_ckpt_experiment_diff(saved, cfg, diff, sizeof diff);
    ct_errf(err, CT_ERR_CONFIG, "train.run_dir %s holds the checkpoints of another config (newest "
            "%s): %s, made from %s, differs from this run's %s in %d setting%s:", cfg->train.run_dir,
            newest, record, last->config[0] ? last->config : "a config file not recorded", mine, n,
            n == 1 ? "" : "s");
    int shown = 0;
    for (char *line = strtok(diff, "\n"); line && shown < 8; line = strtok(NULL, "\n"), shown++)
        ct_err_append(err, "    %s", line);
    if (n > shown) ct_err_append(err, "    ... and %d more", n - shown);
    ct_err_append(err, "  Running here would put this run's checkpoints among that run's%s. Give this run "
                  "its own directory: --set train.run_dir=runs/NAME (or train.run_dir in the config). "
                  "To continue that run with these settings, resume it by name: --resume %s",
                  t->opts.resume ? " and continue from its weights" : ", replacing those of the same steps",
                  cfg->train.save_dir);
    return CT_ERR_CONFIG;
}

/* Whose run the directory holds: the one run_dir/config.json records (else, for a run_dir
 * without one or a save_dir shared between run directories, the config.json of the newest
 * complete checkpoint in save_dir). A run of another experiment (ct_ckpt_same_experiment: more
 * than run length, outputs or logging changed) would put its checkpoints among that run's,
 * replace those of the same steps, and with --resume auto continue from its weights: refused,
 * unless no complete checkpoint is there to take over, or --resume names the checkpoint (the
 * change is then the user's decision, and the resume lists it). */
static int check_owner(ct_trainer *t, const lock_note *last, ct_err *err) {
    const ct_config *cfg = t->cfg;
    const char *resume = t->opts.resume;
    char newest[4096], record[4200];
    ct_ckpt_resolve("auto", cfg->train.save_dir, newest, sizeof newest, NULL, NULL);
    if (!newest[0] || (resume && strcmp(resume, "auto") != 0)) return CT_OK;
    snprintf(record, sizeof record, "%s/config.json", cfg->train.run_dir);
    cJSON *saved = read_config_json(cfg->train.run_dir);
    const lock_note unknown = {0};
    if (!saved) { /* the note's config file was that of run_dir/config.json: not this one's */
        snprintf(record, sizeof record, "%s/config.json", newest);
        saved = read_config_json(newest);
        last = &unknown;
    }
    int rc = CT_OK;
    if (saved && !ct_ckpt_same_experiment(saved, cfg))
        rc = refuse_other_run(t, record, last, saved, newest, err);
    else if (!resume)
        ct_warnf(&t->obs.warn, "%s holds checkpoints of this config up to %s; this run starts from "
                 "step 0 (no --resume) and replaces those of the steps it saves; --resume auto "
                 "would continue instead", cfg->train.save_dir, newest);
    cJSON_Delete(saved);
    return rc;
}

int ct_trainer_rundir_open(ct_trainer *t, ct_err *err) {
    const char *run_dir = t->cfg->train.run_dir;
    char path[4096], text[PATH_MAX + 32];
    int fd = -1;
    int rc = check_outputs(t, err);
    if (!rc) rc = ct_fs_join(path, sizeof path, run_dir, ".lock", err);
    if (!rc) rc = ct_fs_lock(path, &fd, text, sizeof text, err);
    if (rc) return rc;
    lock_note last;
    parse_note(text, &last);
    if (fd < 0) {
        char pid[32] = "unknown";
        if (last.pid > 0) snprintf(pid, sizeof pid, "%ld", last.pid);
        return ct_errf(err, CT_ERR_CONFIG, "train.run_dir %s is in use by another ctrain run (pid %s, "
                       "which holds %s); two runs in one directory would overwrite each other's "
                       "checkpoints.\n  Wait for it to end, or give this run its own directory: "
                       "--set train.run_dir=DIR", run_dir, pid, path);
    }
    t->ck.locked = true;
    t->ck.lock_fd = fd;
    rc = check_owner(t, &last, err);
    /* this run's pid now; the config line changes with run_dir/config.json (write_run_config) */
    return rc ? rc : write_note(t, last.config, err);
}

/* ---- start of a run ---- */

/* <run_dir>/config.json: the resolved config, so a run directory says how it was made; and the
 * config file it came from in the lock's note. */
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
    char mine[PATH_MAX];
    config_file(t->cfg, mine, sizeof mine);
    if (!rc && t->ck.locked) rc = write_note(t, mine, err);
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

/* A checkpoint written before epoch_sample was recorded gives its loader position as epoch_step,
 * steps of the train_batch_size of its own config (saved: its config.json). An epoch without
 * drop_last ends with a shorter step: epoch_step then reaches the epoch's end, not beyond. */
static void old_position(ct_trainer *t, ct_ckpt_state *st, const cJSON *saved) {
    if (st->epoch_sample >= 0) return;
    const cJSON *gb = cJSON_GetObjectItemCaseSensitive(saved, "train_batch_size");
    long per = cJSON_IsNumber(gb) && gb->valuedouble >= 1 ? (long)gb->valuedouble : t->cfg->train_batch_size;
    long count = (long)t->d.train_ds->count;
    st->epoch_sample = st->epoch_step * per;
    if (st->epoch_sample > count && st->epoch_sample - per < count) st->epoch_sample = count;
    t->ck.position_step_samples = per;
}

/* ---- the data a checkpoint was trained on ---- */

_Static_assert(CT_CKPT_FINGERPRINT == CT_DATASET_FINGERPRINT, "a fingerprint fits state.json's field");

/* The fingerprints of this run's data sets, once they are open (a checkpoint records them),
 * unless the ranks' check (trainer.c) took them already. */
static int fingerprint_data(ct_trainer *t, ct_err *err) {
    int rc = t->ck.train_data[0] ? CT_OK : ct_dataset_fingerprint(t->d.train_ds, t->ck.train_data, err);
    if (!rc && t->d.eval_ds && !t->ck.eval_data[0])
        rc = ct_dataset_fingerprint(t->d.eval_ds, t->ck.eval_data, err);
    return rc;
}

/* A fingerprint's fields ("v1 files=N bytes=B content=X mtime=Y"); false when it is not one. */
typedef struct data_fp {
    long long files;
    unsigned long long bytes;
    char content[17], mtime[17];
} data_fp;

static bool parse_fp(const char *text, data_fp *f) {
    int used = 0;
    return sscanf(text, "v1 files=%lld bytes=%llu content=%16[0-9a-f] mtime=%16[0-9a-f]%n", &f->files,
                  &f->bytes, f->content, f->mtime, &used) == 4 && text[used] == '\0';
}

/* Compare data.<which> with the data the checkpoint in dir recorded. Files, bytes or sampled
 * content differing: the data changed, and the resume would go on at the same sample position of
 * another data set: a warning naming what differs, or with --strict-resume CT_ERR_DATA. Only the
 * modification times differing: the same files rewritten or copied (cp without -p): a note.
 * Nothing recorded (a checkpoint from before fingerprints, or no such data set then): nothing to
 * compare. */
static int check_data(ct_trainer *t, const char *which, const ct_dataset *ds, const char *saved,
                      const char *mine, const char *dir, ct_warnings *warn, ct_err *err) {
    if (!saved[0] || !mine[0] || strcmp(saved, mine) == 0) return CT_OK;
    data_fp a, b;
    char what[256] = "";
    if (!parse_fp(saved, &a) || !parse_fp(mine, &b)) {
        snprintf(what, sizeof what, "its fingerprint is not comparable (\"%.40s\")", saved);
    } else {
        if (a.files != b.files) snprintf(what, sizeof what, "files %lld -> %lld; ", a.files, b.files);
        if (a.bytes != b.bytes)
            snprintf(what + strlen(what), sizeof what - strlen(what), "bytes %llu -> %llu; ", a.bytes, b.bytes);
        if (strcmp(a.content, b.content) != 0)
            snprintf(what + strlen(what), sizeof what - strlen(what), "content differs (names, sizes or "
                     "the first bytes of its files); ");
        if (!what[0]) {
            ct_report_line(&t->obs.rep, "note: data.%s (%s): the same files, sizes and sampled bytes as when "
                           "%s was saved, but rewritten or copied since (other modification times)", which,
                           ds->source, dir);
            return CT_OK;
        }
        what[strlen(what) - 2] = '\0';
    }
    if (t->opts.strict_resume)
        return ct_errf(err, CT_ERR_DATA, "data.%s (%s) changed since %s was saved: %s. --strict-resume "
                       "refuses to continue a run on other data.\n  Put back the data the checkpoint was "
                       "trained on, or resume without --strict-resume to go on with this data.", which,
                       ds->source, dir, what);
    ct_warnf(warn, "data.%s (%s) changed since %s was saved: %s; the run goes on at the checkpoint's "
             "position in this data's order (--strict-resume refuses instead)", which, ds->source, dir, what);
    return CT_OK;
}

static int resume(ct_trainer *t, ct_err *err) {
    char dir[4096];
    ct_warnings warn = {0};
    int rc = ct_ckpt_resolve(t->opts.resume, t->ck.save_dir, dir, sizeof dir, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    if (!dir[0]) {
        ct_report_line(&t->obs.rep, "resume auto: no checkpoint in %s yet; starting fresh", t->ck.save_dir);
        return CT_OK;
    }
    ct_ckpt_state st;
    cJSON *saved = NULL;
    rc = ct_ckpt_load(dir, &t->ck.ck, CT_CKPT_LOAD_ALL, &st, &saved, err);
    if (rc) return rc;
    if (st.state_changed)
        ct_warnf(&warn, "%s/state.json changed after ctrain saved it (edited by hand, or damaged: "
                 "its checksum differs); its values are used as they are now: step %ld, epoch %d, "
                 "sample %ld of the epoch, scheduler step %ld", dir, st.step, st.epoch + 1,
                 st.epoch_sample, st.sched_t);
    rc = check_data(t, "train", t->d.train_ds, st.train_data, t->ck.train_data, dir, &warn, err);
    if (!rc && t->d.eval_ds) rc = check_data(t, "eval", t->d.eval_ds, st.eval_data, t->ck.eval_data, dir, &warn, err);
    print_warnings(&warn);
    if (rc) {
        cJSON_Delete(saved);
        return rc;
    }
    old_position(t, &st, saved);
    t->m.opt->applied = st.applied;
    t->m.opt->sched_t = st.sched_t;
    t->ck.resumed = true;
    t->ck.resume_state = st;
    snprintf(t->ck.last, sizeof t->ck.last, "%s", dir);
    ct_report_line(&t->obs.rep, "resuming from %s at step %ld (epoch %d, step %ld of the epoch, sample %ld of "
                   "its order)", dir, st.step, st.epoch + 1, st.epoch_step, st.epoch_sample);
    report_config_diff(t, saved);
    cJSON_Delete(saved);
    return CT_OK;
}

/* Whether the file's tensor names are Hugging Face's GPT-2 ones (core/graph/hf_gpt2.h). A file
 * that cannot be read is not: ct_ckpt_init_from then reports why. */
static bool holds_hf_gpt2(const char *path) {
    ct_err e = {0};
    ct_st_file *f = ct_st_open(path, &e);
    if (!f) return false;
    const char **names = ct_xcalloc((size_t)f->n_tensors + 1, sizeof *names);
    for (int i = 0; i < f->n_tensors; i++) names[i] = f->tensors[i].name;
    bool hf = ct_hf_gpt2_names(names, f->n_tensors);
    free(names);
    ct_st_close(f);
    return hf;
}

/* A GPT-2 model.safetensors through the graph's map: always whole (the map names every tensor;
 * init_strict false is for ctrain's own names, and loading part of GPT-2 is refused the same). */
static int init_from_hf_gpt2(ct_trainer *t, const char *path, bool strict, int *n, ct_warnings *warn,
                             ct_err *err) {
    ct_tensor_map map;
    int rc = ct_hf_gpt2_map(t->m.g, &map, err);
    if (rc) {
        char why[CT_ERR_MSG];
        snprintf(why, sizeof why, "%s", err->msg);
        return ct_errf(err, rc, "model.init_from %s holds GPT-2 weights in Hugging Face's names, but %s",
                       path, why);
    }
    if (!strict)
        ct_warnf(warn, "model.init_strict false does not apply to a Hugging Face GPT-2 file: every "
                 "tensor must match, and all are loaded");
    rc = ct_ckpt_init_from_map(path, &t->ck.ck, &map, n, err);
    ct_tensor_map_free(&map);
    return rc;
}

/* A Hugging Face model directory (ct_ckpt_is_hf_dir: config.json with a model_type, then
 * model.safetensors or its shards with their index): its config.json must describe the model (core/graph/hf_llama.h), then every tensor is
 * loaded through the map. GPT-2's directories go through GPT-2's map. */
static int init_from_hf_dir(ct_trainer *t, const char *dir, bool strict, int *n, ct_warnings *warn, const char **what,
                            ct_err *err) {
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    ct_json_doc *doc = ct_json_parse_file(cfg_path, warn, err);
    if (!doc) return err->code;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(ct_json_root(doc), "model_type");
    char **files = NULL;
    int n_files = 0, rc = CT_OK;
    if (cJSON_IsString(type) && strcmp(type->valuestring, "gpt2") == 0) {
        ct_json_free(doc);
        char file[4200];
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        *what = " (Hugging Face GPT-2 layout)";
        return init_from_hf_gpt2(t, file, strict, n, warn, err);
    }
    *what = " (Hugging Face Llama layout)";
    ct_tensor_map map = {0};
    rc = ct_hf_llama_check_config(t->m.g, doc, warn, err);
    if (!rc) rc = ct_hf_llama_map(t->m.g, &map, err);
    if (rc && err->msg[0] && strncmp(err->msg, "the model is not", 16) == 0) {
        char why[CT_ERR_MSG];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = ct_errf(err, rc, "model.init_from %s holds a Llama in Hugging Face's layout, but %s", dir, why);
    }
    if (!rc && !strict)
        ct_warnf(warn, "model.init_strict false does not apply to a Hugging Face Llama directory: every tensor must "
                 "match, and all are loaded");
    if (!rc) rc = ct_ckpt_hf_weight_files(dir, &files, &n_files, err);
    if (!rc) rc = ct_ckpt_init_from_map_files((const char *const *)files, n_files, dir, &t->ck.ck, &map, n, err);
    ct_ckpt_free_files(files, n_files);
    ct_tensor_map_free(&map);
    ct_json_free(doc);
    return rc;
}

/* A directory with weights in Hugging Face's file names and no config.json: neither a model
 * directory (config.json says its shape) nor a ctrain checkpoint (which always has one). */
static bool weights_without_config(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (!ct_fs_is_dir(dir) || ct_fs_exists(p)) return false;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    bool single = ct_fs_exists(p);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    return single || ct_fs_exists(p);
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
    const char *what = "";
    int rc;
    if (ct_ckpt_is_hf_dir(path)) {
        rc = init_from_hf_dir(t, path, strict, &n, &warn, &what, err);
    } else if (weights_without_config(path)) {
        rc = ct_errf(err, CT_ERR_CONFIG, "model.init_from %s: model.safetensors without config.json; a Hugging Face "
                     "model directory holds both (save_pretrained writes them), a ctrain checkpoint also its "
                     "COMPLETE marker", path);
    } else if (holds_hf_gpt2(path)) {
        what = " (Hugging Face GPT-2 layout)";
        rc = init_from_hf_gpt2(t, path, strict, &n, &warn, err);
    } else {
        rc = ct_ckpt_init_from(path, &t->ck.ck, strict, &n, &warn, err);
    }
    print_warnings(&warn);
    if (rc) return rc;
    ct_report_line(&t->obs.rep, "init_from %s%s: %d of %d tensors loaded%s", path, what, n, t->ck.ck.n_views,
                   n < t->ck.ck.n_views ? " (init_strict false; the rest keep their initialisation)" : "");
    return CT_OK;
}

/* keep_last at the start as well: a run killed between updating latest and pruning left more
 * checkpoints than keep_last, and a resume that only evaluates never saves. Anchored at the
 * checkpoint latest names, or the one this run resumed from when that is older (it must survive
 * until this run saves); incomplete and other configs' checkpoints are reported, never removed. */
static void start_prune(ct_trainer *t) {
    const ct_train_cfg *tc = &t->cfg->train;
    char dir[4096];
    long anchor = -1;
    ct_ckpt_resolve("auto", tc->save_dir, dir, sizeof dir, NULL, NULL);
    const char *base = strrchr(dir, '/');
    if (dir[0] && sscanf(base ? base + 1 : dir, "global_step%ld", &anchor) != 1) anchor = -1;
    if (t->ck.resumed && t->ck.resume_state.step < anchor) anchor = t->ck.resume_state.step;
    ct_warnings w = {0};
    ct_ckpt_prune(tc->save_dir, anchor, tc->keep_last, t->cfg, &w);
    print_warnings(&w);
}

int ct_trainer_ckpt_start(ct_trainer *t, ct_err *err) {
    ck_setup(t);
    ct_ckpt_config_hash(t->cfg->resolved, t->ck.config_hash);
    bool writer = ct_trainer_rank(t) == 0;   /* every rank reads; rank 0 writes */
    int rc = t->opts.dry_run || !writer ? CT_OK : write_run_config(t, err);
    if (!rc) rc = fingerprint_data(t, err);
    if (!rc && t->opts.resume) rc = resume(t, err);
    if (!rc && !t->ck.resumed) rc = init_from(t, err);
    if (!rc && !t->opts.dry_run && writer) start_prune(t);
    return rc;
}

/* ---- saving ---- */

/* Every rank's value, in rank order, on every rank (collective): each puts its own at its index of
 * a sum. all[world]; exact for integers below 2^53 (CRC-32s, flags, pids). */
static int each_rank(ct_comm *c, double mine, double *all, ct_err *err) {
    memset(all, 0, (size_t)c->world * sizeof *all);
    all[c->rank] = mine;
    return c->all_reduce_host(c, all, c->world, CT_REDUCE_SUM, err);
}

/* The outcome of every rank, agreed: *first_failed receives the lowest rank that failed (-1:
 * none). Collective. */
static int agree(ct_trainer *t, bool failed, int *first_failed, ct_err *err) {
    double *v = ct_xmalloc((size_t)t->comm->world * sizeof *v);
    int rc = each_rank(t->comm, failed, v, err);
    *first_failed = -1;
    for (int r = 0; r < t->comm->world && !rc && *first_failed < 0; r++)
        if (v[r] != 0) *first_failed = r;
    free(v);
    return rc;
}

/* A rank's own error when it failed, else one naming the rank that did (which printed why). */
static int save_failed(const ct_trainer *t, const char *name, int rank, const ct_err *mine, ct_err *err) {
    if (rank == t->comm->rank) {
        *err = *mine;
        return mine->code ? mine->code : CT_ERR_RUNTIME;
    }
    return ct_errf(err, CT_ERR_RUNTIME, "checkpoint %s/%s was not saved: rank %d of %d failed (its error says "
                   "why); the previous checkpoint is kept", t->ck.save_dir, name, rank, t->comm->world);
}

/* Every rank's CRC-32 of its shard, in rank order (collective). */
static int gather_crcs(ct_comm *c, uint32_t mine, uint32_t *all, ct_err *err) {
    double *v = ct_xmalloc((size_t)c->world * sizeof *v);
    int rc = each_rank(c, mine, v, err);
    for (int r = 0; r < c->world; r++) all[r] = (uint32_t)v[r];
    free(v);
    return rc;
}

/* ZeRO over several ranks: every rank writes its own part (a shard) into the temporary directory
 * rank 0 made; rank 0, once every shard is written, the rest and the marker (ckpt.h, "the sharded
 * save"). Nothing is gathered. Collective; the ranks agree on the outcome of each step, so a
 * failure on any rank fails the save on all of them, and the previous checkpoint stays. */
static int save_shards(ct_trainer *t, const char *name, const ct_ckpt_state *st, char *out, size_t out_n,
                       ct_err *err) {
    ct_comm *c = t->comm;
    const char *save_dir = t->ck.save_dir;
    ct_err mine = {0};
    int bad;
    /* 1. rank 0 prepares save_dir and the temporary directory, named by its pid */
    double pid = c->rank == 0 ? (double)getpid() : 0;
    int rc = c->rank == 0 ? ct_ckpt_begin(save_dir, name, (long)pid, &mine) : CT_OK;
    int cc = agree(t, rc != 0, &bad, err);
    if (!cc) cc = c->all_reduce_host(c, &pid, 1, CT_REDUCE_SUM, err);
    if (cc || bad >= 0) return cc ? cc : save_failed(t, name, bad, &mine, err);
    /* 2. every rank its shard; rank 0 learns their checksums */
    char tmp[4096];
    uint32_t crc = 0, *crcs = ct_xcalloc((size_t)c->world, sizeof *crcs);
    rc = ct_ckpt_tmp_dir(save_dir, name, (long)pid, tmp, sizeof tmp, &mine);
    if (!rc) rc = ct_ckpt_shard_write(tmp, &t->ck.ck, c->rank, c->world, &crc, &mine);
    cc = agree(t, rc != 0, &bad, err);
    if (!cc) cc = gather_crcs(c, crc, crcs, err);
    /* 3. rank 0: the index, the buffers, state.json, config.json, the marker, the rename, latest:
     * only from here on does the checkpoint count */
    if (!cc && c->rank == 0 && bad >= 0) ct_ckpt_abort(save_dir, name, (long)pid, NULL);
    if (!cc && c->rank == 0 && bad < 0) {
        ct_ckpt_save_opts o = {.keep_last = t->cfg->train.keep_last, .owner = t->cfg};
        rc = ct_ckpt_commit_shards(save_dir, name, (long)pid, &t->ck.ck, c->world, crcs, st, t->cfg->resolved,
                                   &o, NULL, 0, &mine);
    }
    free(crcs);
    if (!cc && bad < 0) cc = agree(t, rc != 0, &bad, err);
    if (cc || bad >= 0) return cc ? cc : save_failed(t, name, bad, &mine, err);
    if (snprintf(out, out_n, "%s/%s", save_dir, name) >= (int)out_n)   /* saved; only its name is too long */
        return ct_errf(err, CT_ERR_RUNTIME, "checkpoint %s in %s: the path is longer than %zu bytes", name, save_dir,
                       out_n - 1);
    return CT_OK;
}

/* Save checkpoint `name` (a global_step, or best/) of this run's state: per-rank shards when the
 * ranks hold parts, else one file set that rank 0 writes. Collective under ZeRO. out: its path
 * (every rank that saved). */
static int save_as(ct_trainer *t, const char *name, const ct_ckpt_state *st, char *out, size_t out_n, ct_err *err) {
    out[0] = 0;
    t->be->queue.sync(t->be);   /* the last update's values are in the buffers */
    if (!ct_ckpt_tensors_whole(&t->ck.ck)) return save_shards(t, name, st, out, out_n, err);
    if (ct_trainer_rank(t) != 0) return CT_OK;   /* rank 0 holds all of it, as every rank does */
    if (strcmp(name, "best") == 0) return ct_ckpt_save_best(t->ck.save_dir, &t->ck.ck, st, t->cfg->resolved, err);
    ct_ckpt_save_opts o = {.keep_last = t->cfg->train.keep_last, .owner = t->cfg};
    return ct_ckpt_save(t->ck.save_dir, &t->ck.ck, st, t->cfg->resolved, &o, out, out_n, err);
}

int ct_trainer_ckpt_save(ct_trainer *t, const ct_ckpt_state *st, ct_err *err) {
    if (!t->cfg->checkpoint_enabled) return CT_OK;   /* checkpoint.enabled false: a sweep's point */
    double t0 = ct_now();
    char tag[CT_CKPT_TAG], dir[4096];
    ct_ckpt_tag(st->step, tag);
    int rc = save_as(t, tag, st, dir, sizeof dir, err);
    if (rc || !dir[0]) return rc;
    snprintf(t->ck.last, sizeof t->ck.last, "%s", dir);
    ct_report_line(&t->obs.rep, "saved %s (%.2fs)", dir, ct_now() - t0);
    return CT_OK;
}

int ct_trainer_ckpt_save_best(ct_trainer *t, const ct_ckpt_state *st, ct_err *err) {
    if (!t->cfg->checkpoint_enabled) return CT_OK;
    char dir[4096];
    return save_as(t, "best", st, dir, sizeof dir, err);
}

int ct_trainer_ckpt_load_model(ct_trainer *t, const char *dir, ct_ckpt_state *st, ct_err *err) {
    if (!t->ck.ck.views) ck_setup(t);
    char resolved[4096];
    ct_warnings warn = {0};
    int rc = ct_ckpt_resolve(dir, NULL, resolved, sizeof resolved, &warn, err);
    print_warnings(&warn);
    if (rc) return rc;
    rc = ct_ckpt_load(resolved, &t->ck.ck, CT_CKPT_LOAD_MODEL | CT_CKPT_LOAD_STATE, st, NULL, err);
    if (rc) return rc;
    rc = ct_trainer_refresh_params(t, err);   /* the 16-bit copy evaluation reads */
    if (rc) return rc;
    snprintf(t->ck.last, sizeof t->ck.last, "%s", resolved);
    return CT_OK;
}

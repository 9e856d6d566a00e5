/* short_run.c: `ctrain --config X --smoke` and `ctrain --config X --profile N` (commands.h): a
 * short run of the config in a temporary directory, set up as config overrides so that the run
 * itself is an ordinary one (the same loading, checks and code paths as a real run).
 *
 * --smoke: a few steps at a small micro-batch, one eval batch, the checkpoint saved at the end and
 * then loaded back into a fresh trainer and evaluated again; every stage must work (exit 0 only
 * then) and the reloaded model must give the eval loss the run ended with. --profile N: N steps at
 * the config's own batch, the flops profiler at step min(2, N) and the bottleneck report. Both
 * leave nothing behind: the directory is removed at the end. */
#include "cmd/commands.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/ckpt/ckpt.h"
#include "core/config/config.h"
#include "core/report/report.h"
#include "core/train/fit.h"
#include "core/train/plan.h"
#include "core/train/train.h"
#include "core/util/limits.h"
#include "core/util/fs.h"

#define SMOKE_STEPS 3
#define SMOKE_MAX_MICRO 4
#define SMOKE_MAX_MICRO_CUT 2   /* micro-batch of a model whose sequences were cut: 64 tokens */

static void add_long(ct_cli_overrides *ov, const char *key, long v) {
    char s[32];
    snprintf(s, sizeof s, "%ld", v);
    ct_cli_overrides_add(ov, key, s);
}

/* A JSON string of s (a path: quotes and backslashes escaped). */
static void add_path(ct_cli_overrides *ov, const char *key, const char *s) {
    char q[2200];
    size_t k = 0;
    q[k++] = '"';
    for (; *s && k < sizeof q - 3; s++) {
        if (*s == '"' || *s == '\\') q[k++] = '\\';
        q[k++] = *s;
    }
    q[k++] = '"';
    q[k] = '\0';
    ct_cli_overrides_add(ov, key, q);
}

/* data.<split>.seq_len of a token data set, or 0. */
static long token_seq_len(const ct_config *cfg, const char *split) {
    const cJSON *d = cfg->data ? cJSON_GetObjectItemCaseSensitive(cfg->data, split) : NULL;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(d, "format");
    const cJSON *len = cJSON_GetObjectItemCaseSensitive(d, "seq_len");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tokens") != 0 || !cJSON_IsNumber(len)) return 0;
    return (long)len->valuedouble;
}

/* --smoke of a language model: sequences cut to CT_SMOKE_MAX_SEQ tokens (the model's input and both
 * splits' seq_len) at a micro-batch of at most 2, so that a GPT-2 124M config checks its whole
 * path in seconds on a CPU (64 tokens a micro-batch: a forward and backward of 124M parameters
 * is about 50 GFLOP). The
 * parameters do not change (the position table is sized by max_len, not by the input), so the
 * checkpoint is the config's own; --dry-run plans the config's full shapes. A config with
 * curriculum_learning keeps its lengths (the schedule names them). */
static bool smoke_cut_sequences(const ct_config *cfg, ct_cli_overrides *ov, long *cut_from) {
    long seq = token_seq_len(cfg, "train");
    if (seq <= CT_SMOKE_MAX_SEQ || cfg->curriculum.enabled) return false;
    char v[32];
    snprintf(v, sizeof v, "[%d]", CT_SMOKE_MAX_SEQ);
    ct_cli_overrides_add(ov, "model.input", v);
    add_long(ov, "data.train.seq_len", CT_SMOKE_MAX_SEQ);
    if (token_seq_len(cfg, "eval") > CT_SMOKE_MAX_SEQ) add_long(ov, "data.eval.seq_len", CT_SMOKE_MAX_SEQ);
    *cut_from = seq;
    return true;
}

/* Where the short run's directory goes: TMPDIR when it is set; else, for --smoke, /dev/shm (a
 * RAM-backed tmpfs) when it has room for the checkpoint twice over and the machine has that much
 * memory available besides the run's own, since the checkpoint is written, read back and removed
 * within seconds: GPT-2 124M's 1.7 GiB take 1.3 s there against 4.5-5.4 s on this machine's ext4
 * /tmp (its fsyncs wait for the disk); else /tmp. */
static const char *short_run_root(const ct_config *cfg, bool smoke) {
    const char *tmp = getenv("TMPDIR");
    if (tmp && tmp[0]) return tmp;
    struct statvfs fs;
    ct_run_plan plan;
    ct_err e = {0};
    if (!smoke || statvfs("/dev/shm", &fs) != 0 || access("/dev/shm", W_OK | X_OK) != 0 ||
        ct_fit_plan(cfg, false, 1, 0, &plan, &e) != CT_OK)
        return "/tmp";
    double ckpt = (double)plan.bytes[CT_MEM_MASTER] + (double)plan.bytes[CT_MEM_OPTIM];
    double room = (double)fs.f_bavail * (double)fs.f_frsize;
    double spare = (double)ct_host_available_bytes() - (double)plan.total;
    return room >= 2 * ckpt && spare >= 2 * ckpt ? "/dev/shm" : "/tmp";
}

int ct_short_run_prepare(const ct_config *cfg, long profile_steps, ct_cli_overrides *ov, char *dir, size_t n,
                         long *seq_cut_from, ct_err *err) {
    *seq_cut_from = 0;
    const char *root = short_run_root(cfg, !profile_steps);
    snprintf(dir, n, "%s/ctrain-%s-XXXXXX", root, profile_steps ? "profile" : "smoke");
    bool made = mkdtemp(dir) != NULL;
    if (!made && strcmp(root, "/dev/shm") == 0) {   /* the fast place failed: the usual one */
        snprintf(dir, n, "/tmp/ctrain-smoke-XXXXXX");
        made = mkdtemp(dir) != NULL;
    }
    if (!made)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot make a temporary directory (%s); set TMPDIR to a writable "
                       "one", dir, strerror(errno));
    char path[2048];
    snprintf(path, sizeof path, "%s/run", dir);
    add_path(ov, "train.run_dir", path);
    snprintf(path, sizeof path, "%s/run/checkpoints", dir);
    add_path(ov, "train.save_dir", path);
    add_long(ov, "train.max_steps", profile_steps ? profile_steps : SMOKE_STEPS);
    add_long(ov, "train.eval_interval", 0);      /* one eval, at the end */
    add_long(ov, "train.save_interval", 0);      /* one checkpoint, at the end */
    ct_cli_overrides_add(ov, "train.best_metric", "\"none\"");   /* not a second copy of it in best/ */
    /* --smoke saves and loads one; a profiling run leaves nothing */
    ct_cli_overrides_add(ov, "checkpoint.enabled", profile_steps ? "false" : "true");
    add_long(ov, "train.sample_every", 0);
    /* outputs the config sends elsewhere go into the temporary directory too */
    if (cfg->csv_monitor.enabled) ct_cli_overrides_add(ov, "csv_monitor.output_path", "\"\"");
    if (cfg->tensorboard.enabled) ct_cli_overrides_add(ov, "tensorboard.output_path", "\"\"");
    long micro = cfg->micro_batch, accum = cfg->grad_accum;
    if (!profile_steps) {   /* the path, not the throughput: a small batch, accumulation kept if any */
        long max_micro = smoke_cut_sequences(cfg, ov, seq_cut_from) ? SMOKE_MAX_MICRO_CUT : SMOKE_MAX_MICRO;
        if (micro > max_micro) micro = max_micro;
        if (accum > 2) accum = 2;
        add_long(ov, "train_micro_batch_size_per_gpu", micro);
        add_long(ov, "gradient_accumulation_steps", accum);
        add_long(ov, "train_batch_size", micro * accum * (cfg->world_size > 0 ? cfg->world_size : 1));
    }
    if (cfg->data && cJSON_GetObjectItemCaseSensitive(cfg->data, "eval")) add_long(ov, "data.eval.limit", micro);
    if (profile_steps) {
        ct_cli_overrides_add(ov, "flops_profiler.enabled", "true");
        add_long(ov, "flops_profiler.profile_step", profile_steps < 2 ? profile_steps : 2);
    } else if (cfg->flops_profiler.output_file[0]) {
        snprintf(path, sizeof path, "%s/flops_profile.txt", dir);
        add_path(ov, "flops_profiler.output_file", path);
    }
    return CT_OK;
}

int ct_smoke_verify(const ct_config *cfg, const ct_summary *s, ct_err *err) {
    if (strcmp(s->status, "ok") != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "smoke: the run ended with status \"%s\"", s->status);
    bool has_eval = cfg->data && cJSON_GetObjectItemCaseSensitive(cfg->data, "eval");
    if (has_eval && !isfinite(s->eval_loss))
        return ct_errf(err, CT_ERR_RUNTIME, "smoke: the eval batch gave no finite loss (%g)", s->eval_loss);
    char ckpt[4096];
    ct_ckpt_resolve("auto", cfg->train.save_dir, ckpt, sizeof ckpt, NULL, NULL);
    if (!ckpt[0] || !ct_fs_is_dir(ckpt))
        return ct_errf(err, CT_ERR_RUNTIME, "smoke: no checkpoint was saved in %s", cfg->train.save_dir);
    long step = -1;
    double loss, acc;
    int rc = ct_train_load_eval(cfg, ckpt, &step, &loss, &acc, err);
    if (rc) {
        ct_err_append(err, "  (smoke: loading back %s)", ckpt);
        return rc;
    }
    if (step != s->steps)
        return ct_errf(err, CT_ERR_RUNTIME, "smoke: %s holds step %ld, the run made %ld", ckpt, step, s->steps);
    /* the same weights on the same batch: the same loss, bit for bit on one machine */
    if (has_eval && !(loss == s->eval_loss))
        return ct_errf(err, CT_ERR_RUNTIME, "smoke: the checkpoint loaded back gives eval loss %.9g, the run ended "
                       "with %.9g", loss, s->eval_loss);
    return CT_OK;
}

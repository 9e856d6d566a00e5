/* run_dir.c: the default run directory of a training run (commands.h ct_cli_default_run_dir).
 *
 * A config that gives no train.run_dir resolves to runs/<config name>. Every fresh run of it gets
 * its own directory under that, runs/<name>/<UTC date-time>, made with mkdir so two runs started
 * in the same second get -2, -3, ... and never share one; runs/<name>/latest is a symbolic link to
 * the newest, replaced atomically (a sweep of many points keeps every point's checkpoints and
 * best/). --resume auto continues the run `latest` names (a directory of the layout before this,
 * runs/<name> holding checkpoints itself, is continued as it is); with nothing to continue it
 * starts a fresh one. */
#include "cmd/commands.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/config/config.h"
#include "core/util/fs.h"

/* Set run_dir (and a save_dir that follows it) in the typed and the resolved config. */
static void set_dirs(ct_config *cfg, const char *run_dir) {
    ct_train_cfg *t = &cfg->train;
    snprintf(t->run_dir, sizeof t->run_dir, "%s", run_dir);
    if (t->save_dir_default) snprintf(t->save_dir, sizeof t->save_dir, "%.1000s/checkpoints", t->run_dir);
    cJSON *train = cfg->resolved ? cJSON_GetObjectItemCaseSensitive(cfg->resolved, "train") : NULL;
    if (!cJSON_IsObject(train)) return;
    cJSON_ReplaceItemInObjectCaseSensitive(train, "run_dir", cJSON_CreateString(t->run_dir));
    if (t->save_dir_default) cJSON_ReplaceItemInObjectCaseSensitive(train, "save_dir", cJSON_CreateString(t->save_dir));
}

/* base/latest -> name, replacing an older link in one rename. A failure is a warning: the run
 * itself is fine. */
static void point_latest(const char *base, const char *name) {
    char tmp[1200], link[1100];
    snprintf(link, sizeof link, "%s/latest", base);
    snprintf(tmp, sizeof tmp, "%s/.latest.%ld", base, (long)getpid());
    unlink(tmp);
    if (symlink(name, tmp) != 0 || rename(tmp, link) != 0) {
        fprintf(stderr, "ctrain: warning: cannot point %s at %s (%s); the run goes on in %s/%s\n", link, name,
                strerror(errno), base, name);
        unlink(tmp);
    }
}

/* A fresh base/<UTC yyyymmdd-hhmmss>[-k], made here (mkdir fails on an existing one). */
static int fresh_dir(ct_config *cfg, const char *base, ct_err *err) {
    int rc = ct_fs_mkdirs(base, err);
    if (rc) return rc;
    char stamp[32], name[48], path[1100];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int k = 1; k < 1000; k++) {
        if (k == 1) snprintf(name, sizeof name, "%s", stamp);
        else snprintf(name, sizeof name, "%s-%d", stamp, k);
        snprintf(path, sizeof path, "%s/%s", base, name);
        if (mkdir(path, 0777) == 0) {
            set_dirs(cfg, path);
            point_latest(base, name);
            return CT_OK;
        }
        if (errno != EEXIST)
            return ct_errf(err, CT_ERR_CONFIG, "train.run_dir: cannot make %s (%s); give train.run_dir a writable "
                           "directory", path, strerror(errno));
    }
    return ct_errf(err, CT_ERR_CONFIG, "train.run_dir: %s/%s-* all taken; give train.run_dir", base, stamp);
}

int ct_cli_default_run_dir(ct_config *cfg, const char *resume, int rank, ct_err *err) {
    if (!cfg->train.run_dir_default || rank > 0) return CT_OK;
    char base[1024], latest[1100], old[1100];
    snprintf(base, sizeof base, "%s", cfg->train.run_dir);
    if (resume && strcmp(resume, "auto") == 0) {
        snprintf(latest, sizeof latest, "%s/latest", base);
        char target[1024];
        ssize_t n = readlink(latest, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            char path[2200];
            if (target[0] == '/') snprintf(path, sizeof path, "%s", target);
            else snprintf(path, sizeof path, "%s/%s", base, target);
            struct stat st;
            int found = stat(path, &st), e = errno;
            if (found == 0 && S_ISDIR(st.st_mode)) {
                set_dirs(cfg, path);
                return CT_OK;
            }
            /* the run it names is gone: continuing "the latest run" from a new one would start it
             * again from step 0 */
            return ct_errf(err, CT_ERR_DATA, "--resume auto: %s names %s, which %s: the run to continue is not "
                           "there.\n  Nothing was trained. To start a fresh run deliberately, run without --resume "
                           "(a new directory under %s); to continue another, --resume DIR.", latest, target,
                           found == 0 ? "is not a directory" : e == ENOENT ? "does not exist"
                           : e == ELOOP ? "is a loop of symbolic links" : strerror(e), base);
        }
        /* the layout before per-run directories: runs/<name> itself holds the run */
        snprintf(old, sizeof old, "%s/config.json", base);
        if (ct_fs_exists(old)) return CT_OK;
    }
    return fresh_dir(cfg, base, err);
}

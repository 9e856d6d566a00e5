/* owned.c: see owned.h. */
#include "core/ckpt/owned.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/ckpt/ckpt.h"
#include "core/util/fs.h"

static bool holds(const char *dir, const char *name) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return ct_fs_exists(p);
}

static bool starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool is_run_dir(const char *dir) { return holds(dir, ".lock") && holds(dir, "config.json"); }

/* The names a save_dir's checkpoints and their save protocol use. */
static bool save_dir_name(const char *name) {
    return !strcmp(name, "latest") || !strcmp(name, "best") || starts(name, "global_step") ||
           starts(name, ".tmp-") || starts(name, ".old-") || starts(name, "latest.tmp-");
}

static bool run_dir_name(const char *name) {
    return !strcmp(name, ".lock") || !strcmp(name, "config.json") || !strcmp(name, "metrics.jsonl");
}

static bool monitor_name(const char *name) {
    return starts(name, "Train_Samples_") || starts(name, "events.out.tfevents.");
}

bool ct_owned_output(const char *path, char *why, size_t n) {
    char full[PATH_MAX], dir[PATH_MAX], up[PATH_MAX];
    if (!ct_fs_resolve(path, full, sizeof full)) return false;
    ct_fs_parent(full, dir, sizeof dir);
    ct_fs_parent(dir, up, sizeof up);
    const char *name = strrchr(full, '/') ? strrchr(full, '/') + 1 : full;
    const char *sub = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    const char *kind = NULL, *where = dir;
    char shown[2 * PATH_MAX + 2];
    snprintf(shown, sizeof shown, "%s", name);
    if (holds(dir, CT_CKPT_MARKER) || (holds(dir, "model.safetensors") && holds(dir, "state.json"))) {
        kind = "the checkpoint directory";
    } else if ((holds(dir, "latest") || starts(name, "global_step")) && save_dir_name(name)) {
        kind = "the save_dir";
    } else if (is_run_dir(dir) && run_dir_name(name)) {
        kind = "the run directory";
    } else if (monitor_name(name) && is_run_dir(up)) {   /* csv_monitor's, tensorboard's folder */
        kind = "the run directory";
        where = up;
        snprintf(shown, sizeof shown, "%s/%s", sub, name);
    }
    if (kind && why) snprintf(why, n, "%s %s's %s", kind, where, shown);
    return kind != NULL;
}

/* eval.c: `ctrain eval` (commands.h). */
#include "cmd/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/owned.h"
#include "core/data/dataset.h"
#include "core/device/device.h"
#include "core/train/train.h"
#include "core/util/fs.h"

const char ct_eval_usage[] =
    "usage: ctrain eval --config FILE --checkpoint DIR [--set KEY=VALUE ...] [--device DEV] [--seed N] "
    "[--quiet] [--summary FILE]";

typedef struct eval_args {
    const char *config, *checkpoint, *summary;
    ct_cli_overrides ov;         /* as a run takes them: --set, --KEY=VALUE, KEY=VALUE, --device, --seed */
    bool quiet;
} eval_args;

static int eval_parse(int argc, char **argv, eval_args *a, ct_err *err) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool taken = false;
        ct_err bad = {0};
        if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q")) {
            a->quiet = true;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--config"))) {
            a->config = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--checkpoint"))) {
            a->checkpoint = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--summary"))) {
            a->summary = v;
        } else if (ct_cli_take_override(argc, argv, &i, &a->ov, &taken, &bad)) {
            return ct_errf(err, bad.code, "eval: %s\n%s", bad.msg, ct_eval_usage);
        } else if (!taken) {
            return ct_errf(err, CT_ERR_CONFIG, "eval: unexpected argument \"%s\"\n%s", argv[i], ct_eval_usage);
        }
    }
    if (!a->config || !a->config[0] || !a->checkpoint || !a->checkpoint[0])
        return ct_errf(err, CT_ERR_CONFIG, "eval: %s is required\n%s",
                       a->config && a->config[0] ? "--checkpoint DIR" : "--config FILE", ct_eval_usage);
    return CT_OK;
}

/* --summary must not replace what eval reads: the config (also before it is loaded: a config
 * that fails to load still gets its error summary) or a file of the checkpoint. The dataset's
 * files are checked by the set-up once the data is open. */
static int check_summary_path(const eval_args *a, ct_summary *s, ct_err *err) {
    if (!a->summary) return CT_OK;
    char owned[2 * 4096 + 100];   /* a file of a run or a checkpoint (a run's metrics.jsonl, latest) */
    if (ct_owned_output(a->summary, owned, sizeof owned)) {
        s->summary_file_refused = true;
        return ct_errf(err, CT_ERR_CONFIG, "--summary %s is %s; the summary would replace a file ctrain keeps "
                       "there.\n  Give the summary another path: --summary FILE", a->summary, owned);
    }
    const char *input = ct_fs_same_file(a->summary, a->config) ? a->config
                        : ct_fs_within(a->summary, a->checkpoint) ? a->checkpoint : NULL;
    if (!input) return CT_OK;
    s->summary_file_refused = true;
    return ct_errf(err, CT_ERR_CONFIG, "--summary %s would replace %s, an input of this "
                   "evaluation.\n  Give the summary another path: --summary FILE", a->summary, input);
}

static int write_summary(const ct_summary *s, const char *path, ct_err *err) {
    ct_summary_write(s, stdout);
    if (!path || s->summary_file_refused) return CT_OK;
    return ct_summary_save(s, path, err);
}

int ct_eval_main(int argc, char **argv, ct_err *err) {
    eval_args a = {0};
    int rc = eval_parse(argc, argv, &a, err);
    if (rc) {
        ct_cli_overrides_free(&a.ov);
        return rc;
    }
    bool gpu = ct_cuda_available(); /* probed once; every GPU the backend builds for has bf16 */
    ct_config_opts co = {.path = a.config, .overrides = a.ov.items, .n_overrides = a.ov.n,
                         .world_size = 1, .has_gpu = gpu, .gpu_supports_bf16 = gpu};
    co.formats = ct_dataset_formats(&co.n_formats);
    ct_warnings warn = {0};
    ct_config *cfg = NULL;
    ct_summary s;
    ct_summary_init(&s);
    rc = check_summary_path(&a, &s, err);
    if (!rc) rc = ct_config_load(&co, &cfg, &warn, err);
    for (int i = 0; i < warn.n; i++) fprintf(stderr, "ctrain: warning: %s\n", warn.items[i]);
    ct_warnings_free(&warn);
    ct_run_opts ro = {.quiet = a.quiet, .summary_path = a.summary};
    if (!rc) rc = ct_train_eval_checkpoint(cfg, &ro, a.checkpoint, &s, err);
    if (rc) snprintf(s.error, sizeof s.error, "%.*s", (int)strcspn(err->msg, "\n"), err->msg);
    ct_err werr = {0};
    int wrc = write_summary(&s, a.summary, &werr);
    if (!rc && wrc) {
        *err = werr;
        rc = wrc;
    }
    ct_config_free(cfg);
    ct_cli_overrides_free(&a.ov);
    return rc;
}

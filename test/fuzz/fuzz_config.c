/* fuzz_config.c: libFuzzer target for the whole config loader (core/config/ on top of
 * core/util/json.c): arbitrary bytes as a config file, loaded at world sizes 1 and 8, with and
 * without overrides. Promises checked besides the sanitizers': every failure is a config error
 * (exit code 2) with a non-empty message that names the file; every success gives a resolved
 * config that prints as JSON and a batch triple that satisfies DeepSpeed's rule.
 * Build and run: test/fuzz/run_fuzz.sh fuzz_config SECONDS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/dataset.h"
#include "core/config/config.h"

static void check(int ok) {
    if (!ok) __builtin_trap();
}

static void load_once(const char *path, int world, const char *const *ovs, int n_ovs) {
    ct_config_opts opts = {.path = path, .overrides = ovs, .n_overrides = n_ovs, .world_size = world};
    opts.formats = ct_dataset_formats(&opts.n_formats);
    ct_config *cfg = NULL;
    ct_warnings warn = {0};
    ct_err err = {0};
    int rc = ct_config_load(&opts, &cfg, &warn, &err);
    if (rc) {
        check(rc == CT_ERR_CONFIG);
        check(err.msg[0] != '\0');
        check(cfg == NULL);
    } else {
        check(cfg != NULL);
        check(cfg->micro_batch > 0 && cfg->grad_accum > 0);
        check(cfg->train_batch_size == cfg->micro_batch * cfg->grad_accum * world);
        char *json = ct_config_to_json(cfg);
        check(json != NULL);
        free(json);
        ct_config_free(cfg);
    }
    ct_warnings_free(&warn);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/ctrain-fuzz-config-%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    static const char *const ovs[] = {"train_batch_size=auto", "zero_optimization.stage=2",
                                      "optimizer.params.lr=0.5", "fp16.enabled=auto"};
    load_once(path, 1, NULL, 0);
    load_once(path, 8, NULL, 0);
    load_once(path, 3, ovs, CT_ARRAY_LEN(ovs));
    return 0;
}

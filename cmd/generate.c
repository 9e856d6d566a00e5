/* generate.c: `ctrain generate` (commands.h). */
#include "cmd/commands.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "core/ckpt/ckpt.h"
#include "core/config/config.h"
#include "core/device/device.h"
#include "core/report/report.h"
#include "core/train/generate.h"
#include "core/util/fs.h"

#define GEN_PATH 4096

const char ct_generate_usage[] =
    "usage: ctrain generate --checkpoint DIR (--prompt TEXT | --prompt-ids I,J,...) [--config FILE] "
    "[--tokens N] [--temperature T] [--top-k K] [--seed S] [--device DEV] [--no-kv-cache]";

typedef struct gen_args {
    const char *checkpoint, *config, *prompt, *prompt_ids, *device;
    long tokens, top_k;
    double temperature;
    unsigned long long seed;
    bool no_cache;
} gen_args;

static int bad_value(const char *opt, const char *v, const char *want, ct_err *err) {
    return ct_errf(err, CT_ERR_CONFIG, "generate: %s %s: expected %s\n%s", opt, v, want, ct_generate_usage);
}

static int gen_parse(int argc, char **argv, gen_args *a, ct_err *err) {
    *a = (gen_args){.tokens = 256, .temperature = 0.8, .top_k = 0, .seed = 1337};
    for (int i = 1; i < argc; i++) {
        const char *v;
        char *end = NULL;
        errno = 0;
        if ((v = ct_cli_option_value(argc, argv, &i, "--checkpoint"))) a->checkpoint = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--config"))) a->config = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--prompt"))) a->prompt = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--prompt-ids"))) a->prompt_ids = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--device"))) a->device = v;
        else if (!strcmp(argv[i], "--no-kv-cache")) a->no_cache = true;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--tokens"))) {
            a->tokens = strtol(v, &end, 10);
            if (!*v || *end || errno || a->tokens < 1 || a->tokens > 1000000)
                return bad_value("--tokens", v, "an integer in [1, 1000000]", err);
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--top-k"))) {
            a->top_k = strtol(v, &end, 10);
            if (!*v || *end || errno || a->top_k < 0) return bad_value("--top-k", v, "an integer >= 0 (0: all)", err);
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--temperature"))) {
            a->temperature = strtod(v, &end);
            if (!*v || *end || errno || !isfinite(a->temperature) || a->temperature < 0 || a->temperature > 100)
                return bad_value("--temperature", v, "a number in [0, 100] (0: always the likeliest token)", err);
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--seed"))) {
            a->seed = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-') return bad_value("--seed", v, "an integer >= 0", err);
        } else {
            return ct_errf(err, CT_ERR_CONFIG, "generate: unexpected argument \"%s\"\n%s", argv[i], ct_generate_usage);
        }
    }
    if (!a->checkpoint || !a->checkpoint[0])
        return ct_errf(err, CT_ERR_CONFIG, "generate: --checkpoint DIR is required\n%s", ct_generate_usage);
    if (!a->prompt == !a->prompt_ids)
        return ct_errf(err, CT_ERR_CONFIG, "generate: give one of --prompt TEXT (a byte-level model) or "
                       "--prompt-ids I,J,... (token ids)\n%s", ct_generate_usage);
    return CT_OK;
}

/* "12,7,300" -> ids; each in [0, classes). */
static int parse_ids(const char *s, int64_t classes, int32_t **ids, int64_t *n, ct_err *err) {
    int64_t cap = 16;
    *ids = ct_xmalloc(sizeof(int32_t) * (size_t)cap);
    *n = 0;
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= classes || (*end && *end != ','))
            return ct_errf(err, CT_ERR_CONFIG, "generate: --prompt-ids %s: expected comma-separated token ids in "
                           "[0, %lld) (the model's classes)", s, (long long)classes);
        if (*n == cap) *ids = ct_xrealloc(*ids, sizeof(int32_t) * (size_t)(cap *= 2));
        (*ids)[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return ct_errf(err, CT_ERR_CONFIG, "generate: --prompt-ids is empty");
    return CT_OK;
}

/* The prompt as ids: its bytes for a byte-level model (an empty one starts from a newline). */
static int prompt_ids(const gen_args *a, int64_t classes, int32_t **ids, int64_t *n, int64_t cap, ct_err *err) {
    if (a->prompt_ids) return parse_ids(a->prompt_ids, classes, ids, n, err);
    if (classes != 256)
        return ct_errf(err, CT_ERR_CONFIG, "generate: --prompt TEXT is for byte-level models (256 classes); "
                       "this model predicts %lld: give token ids with --prompt-ids", (long long)classes);
    size_t len = strlen(a->prompt);
    *ids = ct_xmalloc(sizeof(int32_t) * (len + (size_t)cap + 1));
    *n = 0;
    if (len == 0) {
        fprintf(stderr, "ctrain: note: empty prompt: starting from a newline\n");
        (*ids)[(*n)++] = '\n';
    }
    for (size_t i = 0; i < len; i++) (*ids)[(*n)++] = (unsigned char)a->prompt[i];
    return CT_OK;
}

/* The config: --config, else the one the checkpoint saved (its data need not exist). */
static int load_config(const gen_args *a, const char *dir, ct_config **cfg, ct_err *err) {
    char saved[GEN_PATH] = "";
    if (!a->config && ct_fs_join(saved, sizeof saved, dir, "config.json", err)) return err->code;
    char device[80] = "";
    const char *ov[1] = {device};
    if (a->device) snprintf(device, sizeof device, "train.device=\"%.60s\"", a->device);
    bool gpu = ct_cuda_available();
    ct_config_opts co = {.path = a->config ? a->config : saved, .overrides = ov, .n_overrides = a->device ? 1 : 0,
                         .world_size = 1, .has_gpu = gpu, .gpu_supports_bf16 = gpu};
    ct_warnings warn = {0};
    int rc = ct_config_load(&co, cfg, &warn, err);
    ct_warnings_free(&warn);   /* the training run showed them */
    return rc;
}

/* The key/value cache, and what the start line says of it: its size, or why there is none. */
static int cache_on(ct_lm *m, const ct_config *cfg, char *line, size_t n, ct_err *err) {
    char why[160];
    int rc = ct_lm_cache(m, cfg, why, sizeof why, err);
    if (rc) return rc;
    if (!ct_lm_cached(m)) {
        snprintf(line, n, "no kv cache: the model %s", why);
        return CT_OK;
    }
    char size[32];
    snprintf(line, n, "kv cache %s", ct_fmt_bytes((double)ct_lm_cache_bytes(m), size, sizeof size));
    return CT_OK;
}

/* The closing line: tokens per second, and how many tokens the cache answered. */
static void report_speed(const ct_lm *m, long tokens, double secs) {
    int64_t decoded, windows;
    ct_lm_counts(m, &decoded, &windows);
    fprintf(stderr, "generated %ld tokens in %.2f s (%.1f tokens/s): %lld from the kv cache, %lld by a "
            "forward from position 0\n", tokens, secs, secs > 0 ? (double)tokens / secs : 0.0, (long long)decoded,
            (long long)windows);
}

static void emit(const int32_t *ids, int64_t n, bool bytes, bool first) {
    for (int64_t i = 0; i < n; i++) {
        if (bytes) putchar(ids[i] ? ids[i] : ' ');   /* never a NUL in text output */
        else printf("%s%d", first && i == 0 ? "" : ",", ids[i]);
    }
    fflush(stdout);
}

int ct_generate_main(int argc, char **argv, ct_err *err) {
    gen_args a;
    int rc = gen_parse(argc, argv, &a, err);
    if (rc) return rc;
    char dir[GEN_PATH];
    ct_warnings warn = {0};
    rc = ct_ckpt_resolve(a.checkpoint, NULL, dir, sizeof dir, &warn, err);
    for (int i = 0; i < warn.n; i++) fprintf(stderr, "ctrain: warning: %s\n", warn.items[i]);
    ct_warnings_free(&warn);
    if (!rc && !dir[0])
        rc = ct_errf(err, CT_ERR_DATA, "generate: %s holds no complete checkpoint", a.checkpoint);
    ct_config *cfg = NULL;
    if (!rc) rc = load_config(&a, dir, &cfg, err);
    ct_lm *m = NULL;
    if (!rc) rc = ct_lm_open(cfg, dir, &m, &warn, err);
    for (int i = 0; i < warn.n; i++) fprintf(stderr, "ctrain: warning: %s\n", warn.items[i]);
    ct_warnings_free(&warn);
    char cache[200] = "no kv cache (--no-kv-cache)";
    if (!rc && !a.no_cache) rc = cache_on(m, cfg, cache, sizeof cache, err);
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!rc) rc = prompt_ids(&a, ct_lm_classes(m), &ids, &n, a.tokens, err);
    if (!rc && a.prompt_ids) ids = ct_xrealloc(ids, sizeof(int32_t) * (size_t)(n + a.tokens));
    if (!rc) {
        int64_t T = ct_lm_context(m), classes = ct_lm_classes(m);
        bool bytes = a.prompt != NULL;
        if (n > T)
            fprintf(stderr, "ctrain: note: the prompt has %lld tokens; the model sees the last %lld (its context)\n",
                    (long long)n, (long long)T);
        fprintf(stderr, "generate: %s · %s · %s · %ld tokens · temperature %g · top-k %ld · seed %llu\n", dir,
                ct_lm_device(m), cache, a.tokens, a.temperature, a.top_k, a.seed);
        emit(ids, n, bytes, true);
        float *logits = ct_xmalloc(sizeof(float) * (size_t)classes);
        ct_rng rng;
        ct_rng_init(&rng, a.seed, CT_RNG_SAMPLE, 0);
        double t0 = ct_now();
        for (long t = 0; t < a.tokens && !rc; t++) {
            rc = ct_lm_next_logits(m, ids, n, logits, err);
            if (rc) break;
            ids[n] = ct_sample_token(logits, classes, a.temperature, a.top_k, &rng);
            emit(ids + n, 1, bytes, false);
            n++;
        }
        putchar('\n');
        fflush(stdout);
        if (!rc) report_speed(m, a.tokens, ct_now() - t0);
        free(logits);
    }
    free(ids);
    ct_lm_close(m);
    ct_config_free(cfg);
    return rc;
}

/* ctrain.c: the command line. Argument parsing, subcommands, signals and exit codes; no training
 * logic lives here (core/train/ has it). Every failure path prints one "ctrain: error:" message
 * and exits with the documented code (README.md, docs/ctrain.1). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "cmd/commands.h"
#include "core/ckpt/ckpt.h"
#include "core/util/common.h"
#include "core/util/fs.h"
#include "core/config/config.h"
#include "core/train/train.h"

static const char USAGE[] =
    "usage: ctrain --config FILE [options] [KEY=VALUE ...]\n"
    "       ctrain config check FILE [--world-size N]\n"
    "       ctrain pack --from image_folder|idx|text SRC --out DIR [--shard-size MB] [--compress]\n"
    "       ctrain info FILE.safetensors|CHECKPOINT_DIR|SAVE_DIR|SHARD_FILE|SHARD_DIR\n"
    "       ctrain export --checkpoint DIR --out FILE.safetensors [--dtype fp32|fp16|bf16]\n"
    "       ctrain eval --config FILE --checkpoint DIR [--set KEY=VALUE ...] [--summary FILE]\n"
    "       ctrain bench-data --config FILE [--workers N] [--batches N] [--eval]\n"
    "       ctrain plot ...   (not implemented yet)\n"
    "\n"
    "Train a neural network from a DeepSpeed-style JSON config.\n"
    "\n"
    "options:\n"
    "  --config FILE        the config (DeepSpeed keys plus \"model\", \"data\", \"train\")\n"
    "  --set KEY=VALUE      override a config value; KEY is a dotted path, VALUE is JSON or a\n"
    "                       string (repeatable). Also accepted as --KEY=VALUE and as KEY=VALUE.\n"
    "  --model FILE         take the \"model\" section from FILE\n"
    "  --data FILE          take the \"data\" section from FILE\n"
    "  --print-config       print the fully resolved config as JSON and exit\n"
    "  --dry-run            validate and build the model, print its memory plan and exit\n"
    "                       (no data opened, nothing allocated)\n"
    "  --device DEV         auto, cpu, cuda or cuda:N (same as --set train.device=DEV)\n"
    "  --seed N             random seed (same as --set train.seed=N)\n"
    "  --resume auto|DIR    resume from the latest checkpoint (or start fresh) or from DIR\n"
    "  --summary FILE       also write the final JSON summary line to FILE\n"
    "  --quiet              print only errors, warnings and the summary\n"
    "  --world-size N       data-parallel ranks for the batch rule (default: from the launcher)\n"
    "  --version            print the version and the compiled-in backends\n"
    "  --help               print this help\n"
    "  --local_rank=N       accepted and ignored (added by DeepSpeed's launcher)\n"
    "\n"
    "exit codes: 0 ok, 1 runtime failure, 2 usage or config error, 3 data error,\n"
    "            4 training diverged, 130/143 interrupted by SIGINT/SIGTERM.\n";

/* The only process-wide state: the signal that asked us to stop. Written by the handler only. */
static volatile sig_atomic_t g_stop_signal;

static void on_signal(int sig) {
    if (g_stop_signal == SIGINT && sig == SIGINT) _exit(CT_EXIT_SIGINT); /* second ^C: now */
    g_stop_signal = sig;
}

static void print_error(const char *msg) {
    /* First line after the prefix; following lines as written (already indented by the caller). */
    fprintf(stderr, "ctrain: error: %s\n", msg);
}

static void print_warnings(const ct_warnings *w) {
    for (int i = 0; i < w->n; i++) fprintf(stderr, "ctrain: warning: %s\n", w->items[i]);
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "ctrain: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n  Run 'ctrain --help' for the options.\n");
    return CT_ERR_CONFIG;
}

static void print_version(void) {
    printf("ctrain %s\n", CT_VERSION);
#ifdef CT_HAVE_CUDA
    printf("backends: cpu, cuda\n");
#else
    printf("backends: cpu\n");
#endif
}

/* World size from the launcher's environment (OpenMPI, PMI, torchrun-style). */
static int world_size_from_env(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"};
    for (int i = 0; i < CT_ARRAY_LEN(vars); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end == '\0' && n >= 1 && n <= 1 << 20) return (int)n;
        }
    }
    return 1;
}

static int parse_world_size(const char *s, int *out) {
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    if (errno || *end || n < 1 || n > 1 << 20) return usage_error("--world-size: expected a positive integer, got \"%s\"", s);
    *out = (int)n;
    return CT_OK;
}

typedef struct cli_args {
    const char *config, *model, *data, *resume, *summary;
    const char **overrides;
    int n_overrides;
    char **owned;               /* override strings built here (--device, --seed) */
    int n_owned;
    bool print_config, dry_run, quiet;
    int world_size;
} cli_args;

static void add_override(cli_args *a, const char *kv) {
    a->overrides = ct_xrealloc(a->overrides, (size_t)(a->n_overrides + 1) * sizeof *a->overrides);
    a->overrides[a->n_overrides++] = kv;
}

static void add_owned_override(cli_args *a, const char *key, const char *value) {
    size_t n = strlen(key) + strlen(value) + 2;
    char *s = ct_xmalloc(n);
    snprintf(s, n, "%s=%s", key, value);
    a->owned = ct_xrealloc(a->owned, (size_t)(a->n_owned + 1) * sizeof *a->owned);
    a->owned[a->n_owned++] = s;
    add_override(a, s);
}

/* An override KEY=VALUE is well formed when KEY is a non-empty dotted path. */
static bool is_override(const char *s) {
    const char *eq = strchr(s, '=');
    if (!eq || eq == s) return false;
    for (const char *p = s; p < eq; p++)
        if (!(*p == '.' || *p == '_' || *p == '-' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            return false;
    return s[0] != '.' && eq[-1] != '.';
}

static int parse_args(int argc, char **argv, cli_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(USAGE, stdout);
            exit(0);
        } else if (!strcmp(arg, "--version")) {
            print_version();
            exit(0);
        } else if (!strcmp(arg, "--print-config")) {
            a->print_config = true;
        } else if (!strcmp(arg, "--dry-run")) {
            a->dry_run = true;
        } else if (!strcmp(arg, "--quiet") || !strcmp(arg, "-q")) {
            a->quiet = true;
        } else if (!strncmp(arg, "--local_rank", 12) && (arg[12] == '=' || arg[12] == '\0')) {
            if (arg[12] == '\0' && i + 1 < argc) i++; /* "--local_rank N": skip the value too */
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--config"))) {
            if (!*v) return usage_error("%s needs a file", "--config");
            a->config = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--model"))) {
            if (!*v) return usage_error("%s needs a file", "--model");
            a->model = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--data"))) {
            if (!*v) return usage_error("%s needs a file", "--data");
            a->data = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--resume"))) {
            if (!*v) return usage_error("%s needs \"auto\" or a checkpoint directory", "--resume");
            a->resume = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--summary"))) {
            if (!*v) return usage_error("%s needs a file", "--summary");
            a->summary = v;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--device"))) {
            if (!*v) return usage_error("%s needs auto, cpu, cuda or cuda:N", "--device");
            /* Quote it: the override value must be a JSON string. */
            char quoted[96];
            if (strlen(v) > 64) return usage_error("--device: \"%s\" is not a device (auto, cpu, cuda, cuda:N)", v);
            snprintf(quoted, sizeof quoted, "\"%s\"", v);
            add_owned_override(a, "train.device", quoted);
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--seed"))) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-') return usage_error("--seed: expected a non-negative integer, got \"%s\"", v);
            (void)s;
            add_owned_override(a, "train.seed", v);
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--world-size"))) {
            int rc = parse_world_size(v, &a->world_size);
            if (rc) return rc;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--set"))) {
            if (!is_override(v)) return usage_error("--set: expected KEY=VALUE with a dotted KEY, got \"%s\"", v);
            add_override(a, v);
        } else if (arg[0] == '-' && arg[1] == '-' && is_override(arg + 2)) {
            add_override(a, arg + 2); /* --optimizer.params.lr=3e-4, as sweep agents write it */
        } else if (arg[0] != '-' && is_override(arg)) {
            add_override(a, arg);     /* optimizer.params.lr=3e-4 */
        } else if (arg[0] == '-') {
            return usage_error("unknown option \"%s\"", arg);
        } else {
            return usage_error("unexpected argument \"%s\" (overrides are KEY=VALUE)", arg);
        }
    }
    return CT_OK;
}

static int cmd_config(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "check") != 0)
        return usage_error("%s", "usage: ctrain config check FILE [--world-size N]");
    const char *file = NULL;
    int world = world_size_from_env();
    for (int i = 3; i < argc; i++) {
        const char *v;
        if ((v = ct_cli_option_value(argc, argv, &i, "--world-size"))) {
            int rc = parse_world_size(v, &world);
            if (rc) return rc;
        } else if (argv[i][0] == '-') {
            return usage_error("config check: unknown option \"%s\"", argv[i]);
        } else if (!file) {
            file = argv[i];
        } else {
            return usage_error("config check: unexpected argument \"%s\"", argv[i]);
        }
    }
    if (!file) return usage_error("%s", "config check needs a FILE");
    ct_warnings warn = {0};
    ct_err err = {0};
    int rc = ct_config_check(file, world, stdout, &warn, &err);
    print_warnings(&warn);
    ct_warnings_free(&warn);
    if (rc) print_error(err.msg);
    return rc;
}

/* A subcommand implemented in core/: it returns a status and fills err; we print and exit. */
static int run_subcommand(int (*fn)(int, char **, ct_err *), int argc, char **argv) {
    ct_err err = {0};
    int rc = fn(argc, argv, &err);
    if (rc) print_error(err.msg[0] ? err.msg : "failed");
    return rc;
}

/* The summary line into path atomically (temporary file, fsync, rename): a reader sees the old
 * summary or the new one, never a part, and a full disk leaves the old one in place. */
static int write_summary_file(const ct_summary *s, const char *path, ct_err *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return ct_errf(err, CT_ERR_RUNTIME, "%s: %s", path, strerror(errno));
    ct_summary_write(s, f);
    fclose(f);
    int rc = ct_fs_write_atomic(path, text, len, err);
    free(text);
    return rc;
}

/* --summary FILE once the run is over (its directory was checked at start). A write that fails
 * is reported; it fails the run (exit 1) unless the run succeeded and its result is safely in a
 * checkpoint: the complete one latest names, at the summary's step. Then the status stays 0, so
 * a restart loop (until ctrain --resume auto --summary S; do :; done) ends; the line is on stdout
 * as well. */
static int save_summary(const ct_summary *s, const char *path, const ct_config *cfg, int rc) {
    ct_err err = {0};
    if (write_summary_file(s, path, &err) == CT_OK) return rc;
    char dir[4096], tail[64];
    ct_ckpt_resolve("auto", cfg->train.save_dir, dir, sizeof dir, NULL, NULL);
    size_t n = strlen(dir), k = (size_t)snprintf(tail, sizeof tail, "/global_step%ld", s->steps);
    if (rc != CT_OK || n < k || strcmp(dir + n - k, tail) != 0) {
        fprintf(stderr, "ctrain: error: cannot write --summary %s (%s)\n", path, err.msg);
        return rc ? rc : CT_ERR_RUNTIME;
    }
    fprintf(stderr, "ctrain: warning: cannot write --summary %s (%s); the run succeeded and its "
            "result is saved in %s, so the exit status stays 0 (the summary line is on stdout)\n",
            path, err.msg, dir);
    return rc;
}

static int run_training(cli_args *a) {
    ct_config_opts opts = {
        .path = a->config,
        .model_path = a->model,
        .data_path = a->data,
        .overrides = a->overrides,
        .n_overrides = a->n_overrides,
        .world_size = a->world_size ? a->world_size : world_size_from_env(),
    };
    /* Probed once (it loads the driver and the CUDA runtime). Every GPU the CUDA backend is built
     * for (sm_80 and newer) has bf16. */
    opts.has_gpu = opts.gpu_supports_bf16 = ct_cuda_available();
    ct_warnings warn = {0};
    ct_err err = {0};
    ct_config *cfg = NULL;
    ct_summary summary;
    ct_summary_init(&summary);
    bool is_run = !a->print_config && !a->dry_run;

    int rc = ct_config_load(&opts, &cfg, &warn, &err);
    print_warnings(&warn);
    ct_warnings_free(&warn);
    if (rc) {
        print_error(err.msg);
        if (is_run) {
            snprintf(summary.status, sizeof summary.status, "error");
            snprintf(summary.error, sizeof summary.error, "%.*s", (int)strcspn(err.msg, "\n"), err.msg);
            ct_summary_write(&summary, stdout);
        }
        return rc;
    }
    if (a->print_config) {
        char *json = ct_config_to_json(cfg);
        puts(json);
        free(json);
        ct_config_free(cfg);
        return CT_OK;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    ct_run_opts ro = {
        .resume = a->resume,
        .summary_path = a->summary,
        .quiet = a->quiet,
        .dry_run = a->dry_run,
        .stop_signal = (volatile int *)&g_stop_signal,
    };
    rc = ct_train_run(cfg, &ro, &summary, &err);
    if (rc && rc != CT_EXIT_SIGINT && rc != CT_EXIT_SIGTERM) print_error(err.msg);
    if (is_run) {
        ct_summary_write(&summary, stdout);
        if (a->summary) rc = save_summary(&summary, a->summary, cfg, rc);
    }
    ct_config_free(cfg);
    return rc;
}

/* Library code ends an internal failure (out of memory, a CUDA error) in ct_fatal; the command
 * line reports it like every other runtime error. */
static void on_fatal(void *ctx, const char *msg) {
    print_error(msg);
    exit(CT_ERR_RUNTIME);
}

int main(int argc, char **argv) {
    ct_set_fatal_handler(on_fatal, NULL);
    if (argc >= 2 && argv[1][0] != '-' && !is_override(argv[1])) {
        static const char *later[] = {"plot"};
        if (!strcmp(argv[1], "config")) return cmd_config(argc, argv);
        if (!strcmp(argv[1], "pack")) return run_subcommand(ct_pack_main, argc - 1, argv + 1);
        if (!strcmp(argv[1], "info")) return run_subcommand(ct_info_main, argc - 1, argv + 1);
        if (!strcmp(argv[1], "export")) return run_subcommand(ct_export_main, argc - 1, argv + 1);
        if (!strcmp(argv[1], "eval")) return run_subcommand(ct_eval_main, argc - 1, argv + 1);
        if (!strcmp(argv[1], "bench-data")) return run_subcommand(ct_bench_data_main, argc - 1, argv + 1);
        for (int i = 0; i < CT_ARRAY_LEN(later); i++) {
            if (!strcmp(argv[1], later[i])) {
                fprintf(stderr, "ctrain: error: '%s' is not implemented yet in ctrain %s\n", argv[1], CT_VERSION);
                return CT_ERR_CONFIG;
            }
        }
        return usage_error("unknown command \"%s\" (commands: config check; or --config FILE to train)", argv[1]);
    }
    cli_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc == CT_OK) {
        if (!a.config) {
            rc = usage_error("%s", "no config given: ctrain --config FILE");
        } else {
            rc = run_training(&a);
        }
    }
    for (int i = 0; i < a.n_owned; i++) free(a.owned[i]);
    free(a.owned);
    free(a.overrides);
    return rc;
}

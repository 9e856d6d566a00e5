/* ctrain.c: the command line. Argument parsing, subcommands, signals and exit codes; no training
 * logic lives here (core/train/ has it). Every failure path prints one "ctrain: error:" message
 * and exits with the documented code (README.md, docs/ctrain.1). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "cmd/commands.h"
#include "core/ckpt/ckpt.h"
#include "core/ckpt/owned.h"
#include "core/device/device.h"
#include "core/dist/launch.h"
#include "core/util/common.h"
#include "core/util/fs.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/report/report.h"
#include "core/train/fit.h"
#include "core/train/train.h"
#include "core/util/limits.h"

/* --help: the training run's synopsis, then each subcommand's (from its row in commands[] below),
 * then this. */
static const char USAGE_RUN[] = "usage: ctrain --config FILE [options] [KEY=VALUE ...]\n";
static const char USAGE[] =
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
    "  --dry-run            validate and build the model, print its memory plan and a table of\n"
    "                       what fits (micro-batches, checkpointing) and exit (no data opened,\n"
    "                       nothing allocated)\n"
    "  --device-memory SIZE with --dry-run: plan for a device of SIZE (24GiB, 512MiB, 80GB)\n"
    "                       (default: the capped device's or the GPU's own)\n"
    "  --host-memory SIZE   with --dry-run: the host memory beside the device for the table\n"
    "                       of ZeRO stages and offload (default: MemAvailable now)\n"
    "  --device DEV         auto, cpu, cuda or cuda:N (same as --set train.device=DEV)\n"
    "  --seed N             random seed (same as --set train.seed=N)\n"
    "  --resume auto|DIR    resume from the latest checkpoint (or start fresh) or from DIR\n"
    "  --strict-resume      with --resume: exit 3 when the data changed since the checkpoint\n"
    "                       (otherwise a warning)\n"
    "  --summary FILE       also write the final JSON summary line to FILE\n"
    "  --quiet              print only errors, warnings and the summary\n"
    "  --smoke              check the whole path in seconds: 3 steps at a micro-batch of at most\n"
    "                       4, one eval batch, the checkpoint saved and loaded back, in a\n"
    "                       temporary directory; exit 0 only if every stage worked\n"
    "  --profile N          a profiling run of N steps in a temporary directory: the flops\n"
    "                       profiler's table at step min(2, N) and the bottleneck report\n"
    "  --world-size N       data-parallel ranks for the batch rule (default: from the launcher)\n"
    "  --version            print the version and the compiled-in backends\n"
    "  --help               print this help\n"
    "  --local_rank=N       accepted and ignored (added by DeepSpeed's launcher)\n"
    "\n"
    "exit codes: 0 ok, 1 runtime failure, 2 usage or config error, 3 data error,\n"
    "            4 training diverged, 130/143/129 stopped by SIGINT/SIGTERM/SIGHUP after\n"
    "            saving (a second SIGINT exits 130 at once, without saving).\n";

/* Messages may quote names read from files (a feature, a tar member, a path): they reach the
 * terminal with control bytes escaped, in one write (ct_fputs_printable_line). */
static void print_line(const char *prefix, const char *msg) {
    ct_fputs_printable_line(prefix, msg, stderr);
}

static void print_error(const char *msg) {
    /* First line after the prefix; following lines as written (already indented by the caller). */
    print_line("ctrain: error: ", msg);
}

static void print_warnings(const ct_warnings *w) {
    for (int i = 0; i < w->n; i++) print_line("ctrain: warning: ", w->items[i]);
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

/* Rank and world size from the launcher's environment (core/dist/launch.h): mpirun's, a PMI
 * launcher's or torchrun-style variables. A bad value is a usage error naming the variable: taking
 * it as 1 would apply the batch rule to another world than the launcher's. */
static int launch_from_env(ct_launch *out) {
    ct_err err = {0};
    if (ct_launch_from_env(out, &err) == CT_OK) return CT_OK;
    return usage_error("%s", err.msg);
}

/* A size option (--device-memory, --host-memory): "80GB", "512MiB" (ct_parse_bytes). */
static int parse_size_option(const char *name, const char *v, size_t *out) {
    char why[256], msg[320];
    if (!ct_parse_bytes(v, out, why, sizeof why)) return CT_OK;
    snprintf(msg, sizeof msg, "%s: %s", name, why);
    return usage_error("%s", msg);
}

static int parse_world_size(const char *s, int *out) {
    char *end;
    errno = 0;
    long n = strtol(s, &end, 10);
    if (errno || *end || n < 1 || n > 1 << 20) return usage_error("--world-size: expected a positive integer, got \"%s\"", s);
    *out = (int)n;
    return CT_OK;
}

static void print_help(FILE *f);

typedef struct cli_args {
    const char *config, *model, *data, *resume, *summary;
    ct_cli_overrides ov;        /* --set and its other forms, --device, --seed (cmd/overrides.c) */
    bool print_config, dry_run, quiet, strict_resume;
    bool smoke;                 /* --smoke */
    long profile_steps;         /* --profile N; 0: not given */
    int world_size;             /* --world-size N (0: not given; the launcher's then) */
    ct_launch launch;           /* rank and world: the launcher's, or rank 0 of --world-size */
    size_t device_memory;       /* --device-memory, bytes; 0: not given */
    size_t host_memory;         /* --host-memory, bytes; 0: not given */
} cli_args;

static int parse_args(int argc, char **argv, cli_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            print_help(stdout);
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
        } else if (!strcmp(arg, "--strict-resume")) {
            a->strict_resume = true;
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
        } else if (!strcmp(arg, "--smoke")) {
            a->smoke = true;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--profile"))) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || !*v || *end || n < 1 || n > 1000000)
                return usage_error("--profile: expected a number of steps (1 or more), got \"%s\"", v);
            a->profile_steps = n;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--world-size"))) {
            int rc = parse_world_size(v, &a->world_size);
            if (rc) return rc;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--device-memory"))) {
            int rc = parse_size_option("--device-memory", v, &a->device_memory);
            if (rc) return rc;
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--host-memory"))) {
            int rc = parse_size_option("--host-memory", v, &a->host_memory);
            if (rc) return rc;
        } else {
            bool taken;
            ct_err err = {0};
            if (ct_cli_take_override(argc, argv, &i, &a->ov, &taken, &err)) return usage_error("%s", err.msg);
            if (taken) continue;
            if (arg[0] == '-') return usage_error("unknown option \"%s\"", arg);
            return usage_error("unexpected argument \"%s\" (overrides are KEY=VALUE)", arg);
        }
    }
    return CT_OK;
}

static const char config_usage[] = "usage: ctrain config check FILE [--world-size N]";

/* `ctrain config check`: argv[0] is "config". It prints its own warnings and errors. */
static int cmd_config(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "check") != 0) return usage_error("%s", config_usage);
    const char *file = NULL;
    int world = 0;
    for (int i = 2; i < argc; i++) {
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
    if (!world) {
        ct_launch l;
        int rc = launch_from_env(&l);
        if (rc) return rc;
        world = l.world;
    }
    ct_warnings warn = {0};
    ct_err err = {0};
    ct_config_opts opts = {.path = file, .world_size = world};
    opts.formats = ct_dataset_formats(&opts.n_formats);
    int rc = ct_config_check(&opts, stdout, &warn, &err);
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

/* ---- stop signals ----
 * The handler of SIGINT, SIGTERM and SIGHUP only writes the signal's number into a pipe (write(2)
 * is async-signal-safe, and it works whichever thread the signal lands on: the pool's, the
 * loader's, the CUDA runtime's). A thread of the run reads the pipe and does the rest outside any handler, so it
 * may print and write files. The first signal asks the loop to stop after the current step (it
 * saves a checkpoint and the run exits 128 + the signal: 129 SIGHUP, 130 SIGINT, 143 SIGTERM); a
 * SIGINT after it exits at once, without saving, with one line and the summary as of the last
 * step (status interrupted). A signal before this process has finished a step (the set-up:
 * opening, inflating and scanning data files, building the model; or inside the first step) exits
 * at once the same way, with 128 + the signal: nothing was trained that a checkpoint could keep,
 * and the set-up has no step after which to stop. SIGHUP is handled like SIGTERM, since a closed
 * terminal leaves nobody to answer, unless it was ignored when ctrain started (nohup): then it
 * stays ignored. */

/* The signal that asked the run to stop (0: none); the trainer reads it after every step. */
static volatile sig_atomic_t g_stop_signal;

static struct {
    pthread_mutex_t mu;
    const ct_summary *live;      /* the summary the trainer fills (main thread) */
    ct_summary last;             /* a copy as of the last step, under mu */
    bool stepped;                /* last is from a step of this process (not a resumed run's start) */
    bool finished;               /* ct_train_run returned: main writes the summary itself */
    const char *summary_path;    /* --summary FILE */
    bool quiet;
    double t0;
    char oom_note[2048];         /* the trainer's plan and choices, printed after an out-of-memory
                                    that ends the process (on_fatal) */
    char scratch_dir[1024];      /* --smoke's or --profile's temporary directory ("": none), removed
                                    by an exit at once */
} g_watch = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ct_run_opts.on_step: keep a copy of the summary (the trainer updated it before this call). */
static void watch_step(void *ctx, long step, double loss) {
    pthread_mutex_lock(&g_watch.mu);
    g_watch.last = *g_watch.live;
    g_watch.stepped = true;
    pthread_mutex_unlock(&g_watch.mu);
}

/* ct_run_opts.on_eval: the copy again, now holding the eval's numbers. */
static void watch_eval(void *ctx, long step) {
    pthread_mutex_lock(&g_watch.mu);
    g_watch.last = *g_watch.live;
    pthread_mutex_unlock(&g_watch.mu);
}

static const char *signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "signal";
}

static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return; /* a dead stream: nothing more to do with it */
        buf += n;
        len -= (size_t)n;
    }
}

/* The summary line of a process that ends at once (exit_now, on_fatal), written with write(2): on
 * stdout, and in --summary once a step has finished (the set-up has then checked that the path names
 * no input of the run, a dataset file it would replace; before that, stdout alone). */
static void write_summary_now(ct_summary *s, bool stepped) {
    s->wall_s = ct_now() - g_watch.t0;
    s->peak_host_bytes = ct_peak_rss_bytes();
    char *line = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&line, &len);
    if (f) {
        ct_summary_write(s, f);
        fclose(f);
    }
    if (line) write_all(STDOUT_FILENO, line, len);
    if (line && g_watch.summary_path && stepped) {
        int fd = open(g_watch.summary_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd >= 0) {
            write_all(fd, line, len);
            close(fd);
        }
    }
}

/* Exit at once on signal sig: the second SIGINT, or a stop before this process finished a step
 * (the set-up, the first step: nothing trained yet that a checkpoint could keep). The summary is
 * as of the last step (status interrupted). The main thread may be anywhere (inside a step, inside
 * a save, inflating a data file), so no exit handler or stdio flush runs: the lines are formatted
 * here and written with write(2), and the process ends with _exit(128 + sig). */
static void exit_now(int sig) {
    pthread_mutex_lock(&g_watch.mu);
    ct_summary s = g_watch.last;
    bool stepped = g_watch.stepped;
    pthread_mutex_unlock(&g_watch.mu);
    snprintf(s.status, sizeof s.status, "interrupted");
    char msg[200], scratch[sizeof g_watch.scratch_dir];
    if (stepped) {   /* the second SIGINT (a first signal after a step stops after the step) */
        snprintf(s.error, sizeof s.error, "second interrupt: exited without saving after step %ld", s.steps);
        snprintf(msg, sizeof msg, "ctrain: second interrupt: exiting now without saving\n");
    } else {
        snprintf(s.error, sizeof s.error, "%s before the run's first step: exited at once (nothing trained, "
                 "nothing to save)", signal_name(sig));
        snprintf(msg, sizeof msg, "ctrain: %s before the run's first step: exiting now (nothing trained yet, "
                 "nothing to save)\n", signal_name(sig));
    }
    pthread_mutex_lock(&g_watch.mu);
    snprintf(scratch, sizeof scratch, "%s", g_watch.scratch_dir);
    pthread_mutex_unlock(&g_watch.mu);
    write_all(STDERR_FILENO, msg, strlen(msg));
    write_summary_now(&s, stepped);
    if (scratch[0]) ct_fs_remove_tree(scratch);   /* --smoke's, --profile's */
    _exit(128 + sig);
}

static int g_signal_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(g_signal_pipe[1], &b, 1) < 0) { /* full (non-blocking): stops are already queued */ }
    errno = saved;
}

static void *watch_signals(void *arg) {
    for (;;) {
        unsigned char b;
        ssize_t n = read(g_signal_pipe[0], &b, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1) return NULL;
        int sig = b;
        pthread_mutex_lock(&g_watch.mu);
        bool finished = g_watch.finished;
        pthread_mutex_unlock(&g_watch.mu);
        if (finished) continue; /* the run is over; main prints the summary and exits */
        pthread_mutex_lock(&g_watch.mu);
        bool stepped = g_watch.stepped;
        pthread_mutex_unlock(&g_watch.mu);
        if (g_stop_signal) {
            if (sig == SIGINT) exit_now(sig);
            continue;           /* already stopping */
        }
        if (!stepped) exit_now(sig);   /* the set-up or the first step: nothing to save yet */
        g_stop_signal = sig;
        if (!g_watch.quiet)     /* at once: the step and the save may take a while */
            fprintf(stderr, "%sctrain: %s: stopping after the current step, saving a checkpoint and exiting %d%s\n",
                    isatty(STDERR_FILENO) ? "\n" : "", signal_name(sig), 128 + sig,
                    sig == SIGINT ? "; interrupt again to exit now without saving" : "");
    }
    return NULL;
}

/* Start the thread that answers the stop signals, then route the signals to it. */
static void watch_start(const cli_args *a) {
    g_watch.summary_path = a->summary;
    g_watch.quiet = a->quiet;
    g_watch.t0 = ct_now();
    ct_summary_init(&g_watch.last);
    pthread_t th;
    int e = pipe2(g_signal_pipe, O_CLOEXEC);
    /* The handler must never block: a full pipe already holds a stop. */
    if (!e) e = fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK);
    if (!e) e = pthread_create(&th, NULL, watch_signals, NULL);
    if (e) {
        fprintf(stderr, "ctrain: warning: cannot watch for SIGINT/SIGTERM (%s): they will end the run without "
                "saving\n", strerror(e > 0 ? e : errno));
        return;
    }
    pthread_detach(th);
    /* A shell starts background jobs with SIGINT ignored; `kill -INT` still stops a run, as it
     * always did. SA_RESTART: the main thread's reads and writes go on after the handler. */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (sigaction(SIGHUP, NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, NULL); /* nohup */
}

/* --summary FILE once the run is over (its directory was checked at start). A write that fails
 * is reported; it fails the run (exit 1) unless the run succeeded and its result is safely in a
 * checkpoint: the complete one latest names, at the summary's step. Then the status stays 0, so
 * a restart loop (until ctrain --resume auto --summary S; do :; done) ends; the line is on stdout
 * as well. */
static int save_summary(const ct_summary *s, const char *path, const ct_config *cfg, int rc) {
    ct_err err = {0};
    if (s->summary_file_refused) return rc;
    if (ct_summary_save(s, path, &err) == CT_OK) return rc;
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

/* --summary FILE for a run refused before it started (its config did not load), so that a sweep
 * script finds every point it launched, failed ones with their error. The file must not be one of
 * the run's own inputs (the config, --model, --data) nor a file ctrain keeps in a run or checkpoint
 * directory (core/ckpt/owned.h): those are refused like at a run's start. A summary that cannot be
 * written is said, and the config error's exit code stays. */
static void save_error_summary(const ct_summary *s, const cli_args *a) {
    if (!a->summary) return;
    char owned[2 * 4096 + 100];
    if (ct_owned_output(a->summary, owned, sizeof owned)) {
        fprintf(stderr, "ctrain: error: --summary %s is %s, which it would replace; the summary is on stdout "
                "only\n", a->summary, owned);
        return;
    }
    const char *inputs[] = {a->config, a->model, a->data};
    for (int i = 0; i < 3; i++)
        if (inputs[i] && ct_fs_same_file(a->summary, inputs[i])) {
            fprintf(stderr, "ctrain: error: --summary %s would replace %s, an input of this run; the summary "
                    "is on stdout only\n", a->summary, inputs[i]);
            return;
        }
    ct_err err = {0};
    if (ct_summary_save(s, a->summary, &err))
        fprintf(stderr, "ctrain: error: cannot write --summary %s (%s)\n", a->summary, err.msg);
}

/* A run refused before it started: the error, and for a run (not --print-config or --dry-run)
 * the summary line with status "error" on stdout and in --summary FILE. Returns rc. */
static int refuse_run(ct_summary *summary, const cli_args *a, bool is_run, const ct_err *err, int rc) {
    print_error(err->msg);
    if (is_run && a->launch.rank == 0) {   /* one summary per run */
        snprintf(summary->status, sizeof summary->status, "error");
        snprintf(summary->error, sizeof summary->error, "%.*s", (int)strcspn(err->msg, "\n"), err->msg);
        ct_summary_write(summary, stdout);
        save_error_summary(summary, a);
    }
    return rc;
}

/* --smoke's last stages after a run that succeeded: the checkpoint loaded back (short_run.c).
 * A failure turns the summary's status into "error" with the stage's message. */
static int smoke_verify(const ct_config *cfg, ct_summary *s, bool quiet, ct_err *err) {
    int rc = ct_smoke_verify(cfg, s, err);
    if (rc) {
        print_error(err->msg);
        snprintf(s->status, sizeof s->status, "error");
        snprintf(s->error, sizeof s->error, "%.*s", (int)strcspn(err->msg, "\n"), err->msg);
        return rc;
    }
    if (!quiet)
        fprintf(stderr, "smoke: ok in %.1fs: %ld steps, %s, checkpoint saved and loaded back%s\n",
                ct_now() - g_watch.t0, s->steps, isfinite(s->eval_loss) ? "one eval batch" : "no eval set",
                isfinite(s->eval_loss) ? " (the same eval loss)" : "");
    return CT_OK;
}

static int run_training(cli_args *a) {
    ct_config_opts opts = {
        .path = a->config,
        .model_path = a->model,
        .data_path = a->data,
        .overrides = a->ov.items,
        .n_overrides = a->ov.n,
        .world_size = a->world_size,
    };
    opts.formats = ct_dataset_formats(&opts.n_formats);
    bool is_run = !a->print_config && !a->dry_run;
    if (is_run) watch_start(a);
    /* Probed once (it loads the driver and the CUDA runtime). Every GPU the CUDA backend is built
     * for (sm_80 and newer) has bf16. */
    opts.has_gpu = opts.gpu_supports_bf16 = ct_cuda_available();
    ct_warnings warn = {0};
    ct_err err = {0};
    ct_config *cfg = NULL;
    ct_summary summary;
    ct_summary_init(&summary);

    int rc = ct_config_load(&opts, &cfg, &warn, &err);
    /* --smoke, --profile: the same config again with the short run's overrides after the user's */
    char short_dir[1024] = "";
    if (!rc && is_run && (a->smoke || a->profile_steps)) {
        long seq_cut_from = 0;
        rc = ct_short_run_prepare(cfg, a->profile_steps, &a->ov, short_dir, sizeof short_dir, &seq_cut_from, &err);
        pthread_mutex_lock(&g_watch.mu);
        snprintf(g_watch.scratch_dir, sizeof g_watch.scratch_dir, "%s", short_dir);
        pthread_mutex_unlock(&g_watch.mu);
        if (!rc && seq_cut_from && !a->quiet && a->launch.rank == 0)
            fprintf(stderr, "smoke: sequences cut from %ld to %d tokens, micro-batch at most 2 (the path, not the "
                    "shapes: --dry-run plans the config's own)\n", seq_cut_from, CT_SMOKE_MAX_SEQ);
        ct_config_free(cfg);
        cfg = NULL;
        ct_warnings_free(&warn);   /* the reload says them again */
        opts.overrides = a->ov.items;
        opts.n_overrides = a->ov.n;
        if (!rc) rc = ct_config_load(&opts, &cfg, &warn, &err);
    }
    if (a->launch.rank == 0) print_warnings(&warn);   /* once per run, not once per rank */
    ct_warnings_free(&warn);
    if (rc) {
        if (short_dir[0]) ct_fs_remove_tree(short_dir);
        return refuse_run(&summary, a, is_run, &err, rc);
    }
    if (a->print_config) {
        char *json = ct_config_to_json(cfg);
        puts(json);
        free(json);
        ct_config_free(cfg);
        return CT_OK;
    }

    /* train_micro_batch_size_per_gpu "auto": chosen from the memory plan (core/train/fit.h) */
    char batch_note[512];
    ct_plan_target target;
    rc = ct_run_plan_target(cfg, opts.has_gpu, &target, &err);
    if (!rc) rc = ct_fit_auto_micro_batch(cfg, target.device || a->device_memory,
                                          a->device_memory ? a->device_memory : target.capacity,
                                          batch_note, sizeof batch_note, &err);
    if (rc) {
        ct_config_free(cfg);
        if (short_dir[0]) ct_fs_remove_tree(short_dir);
        return refuse_run(&summary, a, is_run, &err, rc);
    }

    /* A reader of the log that goes away (`ctrain ... 2>&1 | head -1`) must not kill the run: the
     * write fails with EPIPE instead, the reporter goes quiet, and the run trains, saves and
     * writes --summary. */
    signal(SIGPIPE, SIG_IGN);

    ct_run_opts ro = {
        .resume = a->resume,
        .strict_resume = a->strict_resume,
        .summary_path = a->summary,
        .quiet = a->quiet,
        .dry_run = a->dry_run,
        .device_memory = a->device_memory,
        .host_memory = a->host_memory,
        .batch_note = batch_note,
        .oom_note = g_watch.oom_note,
        .oom_note_n = sizeof g_watch.oom_note,
        .stop_signal = (volatile int *)&g_stop_signal,
        .on_step = is_run ? watch_step : NULL,
        .on_eval = is_run ? watch_eval : NULL,
        .launch = &a->launch,
        .profile_steps = a->profile_steps,
    };
    /* no train.run_dir: a directory of its own under runs/<name> (cmd/run_dir.c) */
    if (is_run && (rc = ct_cli_default_run_dir(cfg, a->resume, a->launch.rank, &err))) {
        ct_config_free(cfg);
        return refuse_run(&summary, a, is_run, &err, rc);
    }
    pthread_mutex_lock(&g_watch.mu);
    g_watch.live = &summary;
    snprintf(g_watch.last.run_dir, sizeof g_watch.last.run_dir, "%s", cfg->train.run_dir);
    pthread_mutex_unlock(&g_watch.mu);
    rc = ct_train_run(cfg, &ro, &summary, &err);
    pthread_mutex_lock(&g_watch.mu);
    g_watch.finished = true;
    pthread_mutex_unlock(&g_watch.mu);
    if (rc && rc != CT_EXIT_SIGINT && rc != CT_EXIT_SIGTERM && rc != CT_EXIT_SIGHUP) print_error(err.msg);
    if (a->smoke && rc == CT_OK) rc = smoke_verify(cfg, &summary, a->quiet, &err);
    if (short_dir[0]) ct_fs_remove_tree(short_dir);
    if (is_run && a->launch.rank == 0) {   /* one summary per run: rank 0's */
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
    /* past train.memory_limit_gb: the plan and what to change (set at start; read-only since) */
    if (strstr(msg, "out of") && g_watch.oom_note[0]) fprintf(stderr, "%s\n", g_watch.oom_note);
    fflush(NULL);
    pthread_mutex_lock(&g_watch.mu);
    bool run = g_watch.t0 > 0 && !g_watch.finished, stepped = g_watch.stepped;
    ct_summary s = g_watch.last;
    pthread_mutex_unlock(&g_watch.mu);
    if (run) {   /* a run's summary line, status error, as for every other way a run ends */
        snprintf(s.status, sizeof s.status, "error");
        snprintf(s.error, sizeof s.error, "%.*s", (int)strcspn(msg, "\n"), msg);
        write_summary_now(&s, stepped);
    }
    _exit(CT_ERR_RUNTIME);   /* as main ends: no library destructors (see main) */
}

/* The subcommands, one row each: dispatch, `ctrain NAME --help` (the usage, exit 0), the synopsis
 * in `ctrain --help` and the list an unknown command gets all read this table. test/e2e_cli.sh
 * checks each row against the man page's SYNOPSIS and docs/cli.md. A row has main (reports
 * through err; run_subcommand prints) or run (prints its own messages). */
static const struct command {
    const char *name;
    int (*main)(int argc, char **argv, ct_err *err);
    int (*run)(int argc, char **argv);
    const char *usage;           /* "usage: ctrain NAME ..." (more forms on lines of their own) */
} commands[] = {
    {"config", NULL, cmd_config, config_usage},
    {"eval", ct_eval_main, NULL, ct_eval_usage},
    {"info", ct_info_main, NULL, ct_info_usage},
    {"export", ct_export_main, NULL, ct_export_usage},
    {"pack", ct_pack_main, NULL, ct_pack_usage},
    {"bench-data", ct_bench_data_main, NULL, ct_bench_data_usage},
    {"generate", ct_generate_main, NULL, ct_generate_usage},
    {"plot", ct_plot_main, NULL, ct_plot_usage},
    {"compare", ct_compare_main, NULL, ct_compare_usage},
};

/* One synopsis line of --help: "       " + text, folded at spaces outside brackets ("[--dtype
 * fp32|fp16]" stays whole) to lines of at most 100 columns, each further line indented deeper. */
static void print_synopsis_line(const char *text, size_t len, FILE *f) {
    const size_t width = 100, indent = 7, more = 19;
    size_t col = indent;
    fprintf(f, "%*s", (int)indent, "");
    while (len) {
        size_t word = 0;
        for (int depth = 0; word < len && (depth > 0 || text[word] != ' '); word++)
            depth += (text[word] == '[' || text[word] == '(') - (text[word] == ']' || text[word] == ')');
        if (col > indent && col + 1 + word > width) {
            fprintf(f, "\n%*s", (int)more, "");
            col = more;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(text, 1, word, f);
        col += word;
        while (word < len && text[word] == ' ') word++;
        text += word;
        len -= word;
    }
    fputc('\n', f);
}

/* A row's usage, each of its forms as a synopsis line ("usage: " and the indents dropped). */
static void print_synopsis(const char *usage, FILE *f) {
    while (*usage) {
        size_t n = strcspn(usage, "\n");
        const char *line = usage;
        if (!strncmp(line, "usage: ", 7)) line += 7;
        while (*line == ' ') line++;
        print_synopsis_line(line, n - (size_t)(line - usage), f);
        usage += n + (usage[n] == '\n');
    }
}

static void print_help(FILE *f) {
    fputs(USAGE_RUN, f);
    for (int i = 0; i < CT_ARRAY_LEN(commands); i++) print_synopsis(commands[i].usage, f);
    fputs(USAGE, f);
}

static bool wants_help(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
    return false;
}

static int run_command(int argc, char **argv) {
    if (argc >= 2 && argv[1][0] != '-' && !ct_cli_is_override(argv[1])) {
        for (int i = 0; i < CT_ARRAY_LEN(commands); i++) {
            const struct command *c = &commands[i];
            if (strcmp(argv[1], c->name) != 0) continue;
            if (wants_help(argc, argv)) {
                puts(c->usage);
                return CT_OK;
            }
            return c->main ? run_subcommand(c->main, argc - 1, argv + 1) : c->run(argc - 1, argv + 1);
        }
        char what[256];
        int n = snprintf(what, sizeof what, "unknown command \"%.64s\" (commands:", argv[1]);
        for (int i = 0; i < CT_ARRAY_LEN(commands); i++)
            n += snprintf(what + n, sizeof what - (size_t)n, " %s", commands[i].name);
        snprintf(what + n, sizeof what - (size_t)n, "; or --config FILE to train)");
        return usage_error("%s", what);
    }
    cli_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc == CT_OK && (a.smoke || a.profile_steps) && (a.resume || a.dry_run || a.print_config))
        rc = usage_error("%s", "--smoke and --profile make a fresh run in a temporary directory: they take no "
                         "--resume, --dry-run or --print-config");
    if (rc == CT_OK && a.smoke && a.profile_steps)
        rc = usage_error("%s", "--smoke and --profile are two kinds of short run: give one");
    if (rc == CT_OK && a.device_memory && !a.dry_run)
        rc = usage_error("%s", "--device-memory plans for another device and needs --dry-run (to cap a run's "
                         "memory, set train.memory_limit_gb)");
    if (rc == CT_OK && a.host_memory && !a.dry_run)
        rc = usage_error("%s", "--host-memory says what --dry-run's table of ZeRO stages and offload plans for, "
                         "and needs --dry-run");
    if (rc == CT_OK && a.world_size) ct_launch_given(&a.launch, a.world_size); /* --world-size wins */
    else if (rc == CT_OK) rc = launch_from_env(&a.launch);
    if (rc == CT_OK) a.world_size = a.launch.world;
    if (rc == CT_OK) {
        if (!a.config) {
            rc = usage_error("%s", "no config given: ctrain --config FILE");
        } else {
            rc = run_training(&a);
        }
    }
    ct_cli_overrides_free(&a.ov);
    return rc;
}

/* The process ends with _exit, after flushing stdio: ctrain closes and syncs its own files itself,
 * and library destructors must not run. OpenBLAS's joins its server threads, and a server thread
 * whose buffer could not be mapped (ulimit -v) retries that mmap forever, so a normal exit would
 * hang after the error message had been printed. */
int main(int argc, char **argv) {
    /* Before any thread exists: OpenBLAS reads this when the CPU backend loads it, and starts no
     * threads of its own (ctrain runs single-threaded GEMMs on its pool; core/cpu/cpu_gemm.c). */
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    /* A write past the file-size limit (ulimit -f) raises SIGXFSZ, whose default action kills the
     * process without a word (exit 153): ignored, the write fails with EFBIG instead, and that
     * write's error names the file as a full disk's (ENOSPC) does, and the summary is written. */
    signal(SIGXFSZ, SIG_IGN);
    ct_set_fatal_handler(on_fatal, NULL);
    int rc = run_command(argc, argv);
    fflush(NULL);
    _exit(rc);
}

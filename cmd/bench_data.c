/* bench_data.c: `ctrain bench-data` (commands.h). */
#include "cmd/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/loader.h"
#include "core/device/device.h"

#define BENCH_USAGE "usage: ctrain bench-data --config FILE [--workers N] [--batches N] [--eval]"
const char ct_bench_data_usage[] = BENCH_USAGE;

typedef struct bench_args {
    const char *config;
    int workers;                 /* -1: from the config */
    long batches;                /* 0: one epoch */
    bool eval;
} bench_args;

/* A decimal integer in lo..hi, or a usage error naming the option and what it got (strtol
 * alone took "-1", "2x" and, saturating, a 20-digit count). */
static int int_option(const char *opt, const char *v, long lo, long hi, const char *what, long *out,
                      ct_err *err) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!v[0] || *end || errno == ERANGE || x < lo || x > hi)
        return ct_errf(err, CT_ERR_CONFIG, "bench-data: %s: expected %s (an integer %ld..%ld), got \"%s\"\n"
                       BENCH_USAGE, opt, what, lo, hi, v);
    *out = x;
    return CT_OK;
}

static int parse(int argc, char **argv, bench_args *a, ct_err *err) {
    *a = (bench_args){.workers = -1};
    for (int i = 1; i < argc; i++) {
        bool v = i + 1 < argc;
        long n = 0;
        int rc = CT_OK;
        if (strcmp(argv[i], "--config") == 0 && v) {
            a->config = argv[++i];
        } else if (strcmp(argv[i], "--eval") == 0) {
            a->eval = true;
        } else if (strcmp(argv[i], "--workers") == 0 && v) { /* data.workers' range; 0: one per core */
            rc = int_option(argv[i], argv[i + 1], 0, 1024, "loader threads, 0 for one per core", &n, err);
            a->workers = (int)n;
            i++;
        } else if (strcmp(argv[i], "--batches") == 0 && v) {
            rc = int_option(argv[i], argv[i + 1], 1, 1000000000, "a number of batches", &n, err);
            a->batches = n;
            i++;
        } else {
            rc = ct_errf(err, CT_ERR_CONFIG, "bench-data: unexpected argument \"%s\"\n" BENCH_USAGE, argv[i]);
        }
        if (rc) return rc;
    }
    if (!a->config) return ct_errf(err, CT_ERR_CONFIG, "bench-data: --config FILE is required\n" BENCH_USAGE);
    return CT_OK;
}

/* data.skip_corrupt's lines as the loader meets the records (loader.h). */
static void print_warning(void *ctx, const char *line) {
    fprintf(stderr, "ctrain: warning: %s\n", line);
}

static int run(const bench_args *a, ct_config *cfg, ct_warnings *warn, ct_err *err) {
    const char *which = a->eval ? "eval" : "train";
    ct_dataset *ds = NULL;
    int rc = ct_dataset_open(cfg, which, &ds, err);
    if (!rc && !ds) rc = ct_errf(err, CT_ERR_CONFIG, "%s: no data.%s dataset to benchmark", cfg->path, which);
    if (rc) return rc;
    ct_backend *be = NULL;
    ct_loader_opts o;
    ct_loader *l = NULL;
    rc = ct_backend_create("cpu", 1, &be, err);   /* says why it could not start */
    if (!rc) rc = ct_loader_opts_from_config(cfg, ds, !a->eval, ds->classes, &o, err);
    if (!rc && a->workers >= 0) o.workers = a->workers;
    o.warn_fn = print_warning;
    double t0 = ct_now();
    if (!rc) rc = ct_loader_init(&l, be, ds, &o, warn, err);
    long nb = 0;
    int64_t samples = 0;
    if (!rc) nb = a->batches ? a->batches : (long)ct_loader_batches_per_epoch(l);
    for (long i = 0; i < nb && !rc; i++) {
        ct_loader_batch b;
        rc = ct_loader_next(l, &b, err);
        samples += rc ? 0 : b.n;
    }
    double secs = ct_now() - t0;
    if (!rc)
        printf("{\"bench\": \"data\", \"format\": \"%s\", \"source\": \"%s\", \"workers\": %d, \"batch\": %lld, "
               "\"samples\": %lld, \"seconds\": %.4f, \"samples_per_s\": %.1f, \"wait_s\": %.4f, "
               "\"skipped\": %lld}\n", ds->format, ds->source, o.workers ? o.workers : 0,
               (long long)o.batch, (long long)samples, secs, (double)samples / secs,
               ct_loader_total_wait(l), (long long)ct_loader_skipped(l));
    ct_loader_free(l);
    if (be) ct_backend_destroy(be);
    ct_dataset_close(ds);
    return rc;
}

int ct_bench_data_main(int argc, char **argv, ct_err *err) {
    bench_args a;
    int rc = parse(argc, argv, &a, err);
    if (rc) return rc;
    ct_config_opts co = {.path = a.config, .world_size = 1};
    co.formats = ct_dataset_formats(&co.n_formats);
    ct_config *cfg = NULL;
    ct_warnings warn = {0};
    rc = ct_config_load(&co, &cfg, &warn, err);
    if (!rc) rc = run(&a, cfg, &warn, err);
    for (int i = 0; i < warn.n; i++) fprintf(stderr, "ctrain: warning: %s\n", warn.items[i]);
    ct_warnings_free(&warn);
    ct_config_free(cfg);
    return rc;
}

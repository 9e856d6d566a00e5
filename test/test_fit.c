/* test_fit.c: what fits (core/train/fit.h) and the size parser behind --device-memory
 * (core/util/limits.h): sizes good and bad; the largest-micro-batch arithmetic on synthetic plans;
 * the suggestions, the auto micro-batch and an out-of-memory of the CPU backend on a real (tiny)
 * model under synthetic limits. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/dataset.h"
#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/cpu/cpu.h"
#include "core/graph/graph.h"
#include "core/train/fit.h"
#include "core/train/plan.h"
#include "core/util/limits.h"

static char tmpdir[64];

/* ---- sizes ---- */

START_TEST(sizes_parse) {
    static const struct { const char *s; size_t want; } good[] = {
        {"24GiB", (size_t)24 << 30}, {"512MiB", (size_t)512 << 20}, {"80GB", 80000000000ull},
        {"1.5gib", (size_t)3 << 29},  {"1B", 1},                       {"4KiB", 4096},
        {"2tb", 2000000000000ull},    {"0.5KiB", 512},                 {"10kb", 10000},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t v = 0;
        char why[256] = "";
        ck_assert_msg(ct_parse_bytes(good[i].s, &v, why, sizeof why) == 0, "%s: %s", good[i].s, why);
        ck_assert_msg(v == good[i].want, "%s: got %zu, want %zu", good[i].s, v, good[i].want);
    }
}
END_TEST

START_TEST(sizes_refused) {
    /* each must fail with a message that says what a size looks like or what was wrong */
    static const char *const bad[] = {
        "",       "24",      "GiB",      "-1GiB",    "+1GiB",   " 24GiB",  "24 GiB",  "24GiB ",
        "0GiB",   "0.1B",    "1e3MiB",   "0x10MiB",  "infGiB",  "nanGiB",  "24Gi",    "24GIBS",
        "24XB",   "1..5GiB", ".GiB",     "24GiB24",  "9999999999999999999999TiB", "24mib\n", "5,5GB",
        "NaN",    "\t",      "1GiB\x01",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v = 12345;
        char why[256] = "";
        ck_assert_msg(ct_parse_bytes(bad[i], &v, why, sizeof why) == -1, "\"%s\" was accepted as %zu", bad[i], v);
        ck_assert_msg(why[0] != '\0', "\"%s\": no reason given", bad[i]);
        ck_assert_msg(v == 0, "\"%s\": out left at %zu", bad[i], v);
    }
    size_t v;
    char why[256];
    ct_parse_bytes("24", &v, why, sizeof why);
    ck_assert_msg(strstr(why, "no unit") && strstr(why, "24GiB"), "%s", why);
    ct_parse_bytes("24XB", &v, why, sizeof why);
    ck_assert_msg(strstr(why, "unknown unit \"XB\""), "%s", why);
}
END_TEST

/* ---- the arithmetic ---- */

/* peak(m) = base + per_sample × m, and SIZE_MAX for the micro-batches in `broken`. */
typedef struct linear_peak {
    size_t base, per_sample;
    long broken;
    int calls;
} linear_peak;

static size_t peak_of(void *ctx, long m) {
    linear_peak *p = ctx;
    p->calls++;
    return m == p->broken ? SIZE_MAX : p->base + p->per_sample * (size_t)m;
}

START_TEST(largest_micro_arithmetic) {
    linear_peak p = {100, 10, 0, 0};
    /* 100 + 10 m <= 200: m <= 10; the divisors of 24 below that: 8 */
    ck_assert_int_eq(ct_fit_largest_micro(24, 24, 200, peak_of, &p), 8);
    ck_assert_int_eq(ct_fit_largest_micro(24, 24, 1000, peak_of, &p), 24);     /* everything fits */
    ck_assert_int_eq(ct_fit_largest_micro(24, 5, 1000, peak_of, &p), 4);       /* capped, a divisor */
    ck_assert_int_eq(ct_fit_largest_micro(24, 100, 1000, peak_of, &p), 24);    /* never above the batch */
    ck_assert_int_eq(ct_fit_largest_micro(24, 24, 109, peak_of, &p), 0);       /* not even 1 */
    ck_assert_int_eq(ct_fit_largest_micro(24, 24, 110, peak_of, &p), 1);       /* exactly 1 */
    ck_assert_int_eq(ct_fit_largest_micro(7, 7, 150, peak_of, &p), 1);         /* a prime batch: 1 or 7 */
    ck_assert_int_eq(ct_fit_largest_micro(7, 7, 170, peak_of, &p), 7);
    p.broken = 8;                                                              /* unplannable: skipped */
    ck_assert_int_eq(ct_fit_largest_micro(24, 24, 200, peak_of, &p), 6);
    /* only divisors are planned: 1000 has 16 of them */
    p = (linear_peak){0, 1, 0, 0};
    ck_assert_int_eq(ct_fit_largest_micro(1000, 1000, 0, peak_of, &p), 0);
    ck_assert_int_eq(p.calls, 16);
}
END_TEST

/* ---- a real model ---- */

/* The config `text`, written to tmpdir/name and loaded with the overrides sets[0..n) (KEY=VALUE)
 * for `world` ranks. */
static ct_config *load_text_with(const char *name, const char *text, const char *const *sets, int n, int world) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ct_config_opts o = {.path = path, .overrides = sets, .n_overrides = n, .world_size = world};
    o.formats = ct_dataset_formats(&o.n_formats);
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err err = {0};
    int rc = ct_config_load(&o, &cfg, &w, &err);
    ct_warnings_free(&w);
    ck_assert_msg(rc == CT_OK, "%s", err.msg);
    return cfg;
}

/* The config `text`, written to tmpdir/name and loaded (train.memory_limit_gb set when > 0). */
static ct_config *load_text(const char *name, const char *text, double limit_gb) {
    char set[64];
    snprintf(set, sizeof set, "train.memory_limit_gb=%.17g", limit_gb);
    const char *sets[] = {set};
    return load_text_with(name, text, sets, limit_gb > 0 ? 1 : 0, 1);
}

/* An MLP of 6 blocks [linear 256, gelu, linear 128] on 16 features, batch 512 (plans of a few MiB:
 * activations grow with the micro-batch, checkpointing every block drops each block's inner
 * outputs). micro: a number or "\"auto\"". */
static void mlp_text(char *text, size_t n, const char *micro) {
    snprintf(text, n,
             "{\"train_batch_size\": 512, \"train_micro_batch_size_per_gpu\": %s,\n"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},\n"
             " \"model\": {\"input\": [16], \"loss\": {\"type\": \"cross_entropy\"}, \"layers\": [\n"
             "   {\"type\": \"linear\", \"name\": \"in\", \"out\": 128},\n"
             "   {\"type\": \"repeat\", \"times\": 6, \"layers\": [\n"
             "     {\"type\": \"linear\", \"name\": \"fc\", \"out\": 256}, {\"type\": \"gelu\", \"name\": \"act\"},\n"
             "     {\"type\": \"linear\", \"name\": \"proj\", \"out\": 128}]},\n"
             "   {\"type\": \"linear\", \"name\": \"head\", \"out\": 4}]},\n"
             " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"none.csv\"}},\n"
             " \"train\": {\"device\": \"cpu\"}}\n", micro);
}

static ct_config *load_mlp(const char *micro, double limit_gb) {
    char text[2048];
    mlp_text(text, sizeof text, micro);
    return load_text("mlp.json", text, limit_gb);
}

/* The MLP at micro-batch 64 with overrides, for `world` ranks. */
static ct_config *load_mlp_with(const char *const *sets, int n, int world) {
    char text[2048];
    mlp_text(text, sizeof text, "64");
    return load_text_with("mlp.json", text, sets, n, world);
}

static size_t plan_total(const ct_config *cfg, long micro, long segments) {
    ct_run_plan p;
    ct_err err = {0};
    ck_assert_int_eq(ct_fit_plan(cfg, false, micro, segments, &p, &err), CT_OK);
    return p.total;
}

#define GIB 1073741824.0

START_TEST(plan_is_the_runs_plan) {
    /* the configured choice is exactly what a run builds and plans */
    ct_config *cfg = load_mlp("512", 0);
    ct_graph *g = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_graph_build(cfg, cfg->micro_batch, CT_F32, &g, &err), CT_OK);
    ct_run_plan run;
    ct_run_plan_make(cfg, g, false, &run);
    ck_assert_uint_eq(plan_total(cfg, 512, CT_SEGMENTS_CONFIG), run.total);
    ct_graph_free(g);
    /* 6 blocks; checkpointing every block plans less at the same micro-batch; more samples more */
    ck_assert_int_eq(ct_fit_every_block(cfg, &err), 6);
    ck_assert_uint_lt(plan_total(cfg, 512, 6), plan_total(cfg, 512, 0));
    ck_assert_uint_lt(plan_total(cfg, 256, 0), plan_total(cfg, 512, 0));
    ct_config_free(cfg);
}
END_TEST

/* A device plan counts the chunked whole-batch convolution's scratch (core/backend/backend.h),
 * which the CUDA backend takes outside the arena; a CPU plan does not. The Fashion-MNIST CNN at
 * micro-batch 128 in bf16: conv1 (1->32, 28x28) fits whole, conv2 (32->64, 14x14, 363,776 B an
 * image) runs in chunks of 46 images under the 16 MiB bound and is the larger. */
/* ct_fit_table's rows, collected into one text. */
static void collect_row(void *ctx, const char *text) {
    char *all = ctx;
    strncat(all, text, 8191 - strlen(all));
    strncat(all, "\n", 8191 - strlen(all));
}

/* The planned peak of the table row whose checkpointing column is `what` at micro-batch 512. */
static double row_mib(const char *table, const char *what) {
    for (const char *at = table; (at = strstr(at, what)); at++) {
        const char *line = at;
        while (line > table && line[-1] != '\n') line--;
        long micro = 0;
        double mib = 0;
        if (sscanf(line, " %ld", &micro) == 1 && micro == 512 && sscanf(at + strlen(what), " %lf MiB", &mib) == 1)
            return mib;
    }
    ck_abort_msg("no row \"%s\" at 512 in:\n%s", what, table);
    return 0;
}

/* On a device the table plans every block with its kept outputs offloaded (cpu_checkpointing):
 * less than every block alone; on the CPU (host memory is the training memory) no such row. */
START_TEST(table_plans_offload_on_a_device) {
    ct_config *cfg = load_mlp("512", 0);
    char *table = calloc(1, 8192);
    ct_err err = {0};
    ck_assert_int_eq(ct_fit_table(cfg, true, 0, collect_row, table, &err), CT_OK);
    double ckpt = row_mib(table, "every block (6 segments) "), off = row_mib(table, "every block (6 segments) + offload");
    ck_assert_msg(off < ckpt, "offload %.1f MiB, every block %.1f MiB:\n%s", off, ckpt, table);
    table[0] = 0;
    ck_assert_int_eq(ct_fit_table(cfg, false, 0, collect_row, table, &err), CT_OK);
    ck_assert_msg(!strstr(table, "offload"), "%s", table);
    free(table);
    ct_config_free(cfg);
}
END_TEST

START_TEST(device_plan_counts_conv_scratch) {
    ct_config *cfg = load_text("cnn.json",
        "{\"train_batch_size\": 128, \"train_micro_batch_size_per_gpu\": 128,\n"
        " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-3}},\n"
        " \"model\": {\"input\": [1, 28, 28], \"loss\": {\"type\": \"cross_entropy\"}, \"layers\": [\n"
        "   {\"type\": \"conv2d\", \"name\": \"conv1\", \"out\": 32, \"kernel\": 3, \"padding\": 1},\n"
        "   {\"type\": \"maxpool2d\", \"name\": \"pool1\", \"kernel\": 2},\n"
        "   {\"type\": \"conv2d\", \"name\": \"conv2\", \"out\": 64, \"kernel\": 3, \"padding\": 1},\n"
        "   {\"type\": \"flatten\", \"name\": \"flatten\"},\n"
        "   {\"type\": \"linear\", \"name\": \"fc\", \"out\": 10}]},\n"
        " \"data\": {\"train\": {\"format\": \"csv\", \"path\": \"none.csv\"}},\n"
        " \"train\": {\"device\": \"cpu\"}}\n", 0);
    ct_graph *g = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_graph_build(cfg, 128, CT_BF16, &g, &err), CT_OK);
    ct_conv2d_geom c2 = {.n = 128, .c = 32, .h = 14, .w = 14, .oc = 64, .kh = 3, .kw = 3, .stride_h = 1,
                         .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1,
                         .oh = 14, .ow = 14};
    ck_assert_int_eq(ct_conv2d_image_scratch(&c2, 2), 196 * (288 * 2 + 64 * 2 + 288 * 4));
    ck_assert_int_eq(ct_conv2d_chunk_images(&c2, 2), 46);
    ck_assert_uint_eq(ct_graph_plan(g)->device_scratch, 46 * 363776 + 5 * CT_CONV_SCRATCH_ALIGN);
    /* conv1's 9 rows are padded to 16: 784 * (16 * 2 + 32 * 4) bytes an image, all 128 in one
     * chunk, the block sized for a full chunk (133 images), plus the padded weights and their
     * gradient (32 x 16 x (2 + 4)) */
    ct_conv2d_geom c1 = {.n = 128, .c = 1, .h = 28, .w = 28, .oc = 32, .kh = 3, .kw = 3, .stride_h = 1,
                         .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1,
                         .oh = 28, .ow = 28};
    ck_assert_int_eq(ct_conv2d_group_rows(&c1), 16);
    ck_assert_int_eq(ct_conv2d_chunk_images(&c1, 2), 128);
    ck_assert_uint_eq(ct_conv2d_scratch_bytes(&c1, 2), 133 * 784 * 160 + 32 * 16 * 6 + 5 * CT_CONV_SCRATCH_ALIGN);
    /* a short batch asks for the same block */
    c1.n = 96;
    ck_assert_int_eq(ct_conv2d_chunk_images(&c1, 2), 96);
    ck_assert_uint_eq(ct_conv2d_scratch_bytes(&c1, 2), 133 * 784 * 160 + 32 * 16 * 6 + 5 * CT_CONV_SCRATCH_ALIGN);
    ct_run_plan host, dev;
    ct_run_plan_make(cfg, g, false, &host);
    ct_run_plan_make(cfg, g, true, &dev);
    ck_assert_uint_eq(dev.bytes[CT_MEM_WORKSPACE] - host.bytes[CT_MEM_WORKSPACE], ct_graph_plan(g)->device_scratch);
    ck_assert_uint_eq(dev.bytes[CT_MEM_ACTIVATIONS], host.bytes[CT_MEM_ACTIVATIONS]);
    /* bounds: a batch that fits whole is one chunk; an image larger than the bound is a chunk of 1 */
    c2.n = 8;
    ck_assert_int_eq(ct_conv2d_chunk_images(&c2, 2), 8);
    c2.h = c2.w = c2.oh = c2.ow = 224;
    ck_assert_int_eq(ct_conv2d_chunk_images(&c2, 2), 1);
    ct_graph_free(g);
    ct_config_free(cfg);
}
END_TEST

START_TEST(suggestions_from_the_plan) {
    ct_config *cfg = load_mlp("512", 0);
    /* a limit between the plans of micro-batch 256 and 512, above every block at 512 */
    size_t p256 = plan_total(cfg, 256, CT_SEGMENTS_CONFIG), p512 = plan_total(cfg, 512, CT_SEGMENTS_CONFIG);
    size_t every512 = plan_total(cfg, 512, 6);
    ck_assert_uint_lt(every512, p512);
    size_t limit = (p256 > every512 ? p256 : every512) + 1;
    ck_assert_uint_lt(limit, p512);
    char text[1024];
    ct_fit_suggest(cfg, false, limit, text, sizeof text);
    ck_assert_msg(strstr(text, "micro-batch 256 with gradient accumulation 2 fits in"), "%s", text);
    ck_assert_msg(strstr(text, "or checkpoint every block (activation_checkpointing.number_checkpoints 6)"), "%s", text);
    ck_assert_msg(strstr(text, "at micro-batch 512"), "%s", text);
    /* the error of a run over its limit: exit 1, breakdown, suggestions */
    ct_err err = {0};
    ct_run_plan p;
    ck_assert_int_eq(ct_fit_plan(cfg, false, 512, CT_SEGMENTS_CONFIG, &p, &err), CT_OK);
    ck_assert_int_eq(ct_fit_over_limit(cfg, &p, limit, "train.memory_limit_gb 0.01", &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "planned: params 0 B, master") && strstr(err.msg, "micro-batch 256"), "%s", err.msg);
    /* below every micro-batch 1: nothing fits, and the message says what the fixed part needs */
    ct_fit_suggest(cfg, false, plan_total(cfg, 1, 6) - 1, text, sizeof text);
    ck_assert_msg(strstr(text, "nothing fits in") && strstr(text, "micro-batch 1 with every block checkpointed"),
                  "%s", text);
    ct_config_free(cfg);
}
END_TEST

START_TEST(auto_micro_batch_under_limits) {
    ct_config *probe = load_mlp("\"auto\"", 0);
    ck_assert(probe->micro_batch_auto);
    /* no limit: the batch rule's derivation stays, and the note says so */
    char note[512];
    ct_err err = {0};
    ck_assert_int_eq(ct_fit_auto_micro_batch(probe, false, 0, note, sizeof note, &err), CT_OK);
    ck_assert_int_eq(probe->micro_batch, 512);
    ck_assert_msg(strstr(note, "no memory limit is known"), "%s", note);
    size_t p1 = plan_total(probe, 1, CT_SEGMENTS_CONFIG), p2 = plan_total(probe, 2, CT_SEGMENTS_CONFIG);
    size_t p4 = plan_total(probe, 4, CT_SEGMENTS_CONFIG);
    ck_assert_uint_lt(p2, p4);
    ct_config_free(probe);

    /* a limit whose 90% lies between the plans of micro-batch 2 and 4: 2, accumulation 256 */
    double gb = ((double)p2 + (double)(p4 - p2) / 2) / CT_FIT_AUTO_MARGIN / GIB;
    ct_config *cfg = load_mlp("\"auto\"", gb);
    ck_assert_int_eq(ct_fit_auto_micro_batch(cfg, false, 0, note, sizeof note, &err), CT_OK);
    ck_assert_int_eq(cfg->micro_batch, 2);
    ck_assert_int_eq(cfg->grad_accum, 256);
    ck_assert_int_eq(cfg->micro_batch * cfg->grad_accum * cfg->world_size, cfg->train_batch_size);
    ck_assert_msg(strstr(note, "2 × accumulation 256") && strstr(note, "train.memory_limit_gb"), "%s", note);
    ct_config_free(cfg);

    /* --device-memory below the limit wins: only micro-batch 1 */
    cfg = load_mlp("\"auto\"", 1.0);
    size_t dev = (size_t)(((double)p1 + (double)(p2 - p1) / 2) / CT_FIT_AUTO_MARGIN);
    ck_assert_uint_gt(p2, p1);
    ck_assert_int_eq(ct_fit_auto_micro_batch(cfg, false, dev, note, sizeof note, &err), CT_OK);
    ck_assert_int_eq(cfg->micro_batch, 1);
    ck_assert_int_eq(cfg->grad_accum, 512);
    ck_assert_msg(strstr(note, "--device-memory"), "%s", note);
    ct_config_free(cfg);

    /* nothing fits: CT_ERR_RUNTIME, the micro-batch untouched */
    cfg = load_mlp("\"auto\"", (double)p1 / 2 / GIB);
    ck_assert_int_eq(ct_fit_auto_micro_batch(cfg, false, 0, note, sizeof note, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "not even micro-batch 1 fits") && strstr(err.msg, "nothing fits in"), "%s", err.msg);
    ct_config_free(cfg);

    /* a fixed micro-batch is not "auto": nothing changes, no note */
    cfg = load_mlp("64", (double)p1 / 2 / GIB);
    ck_assert(!cfg->micro_batch_auto);
    ck_assert_int_eq(ct_fit_auto_micro_batch(cfg, false, 0, note, sizeof note, &err), CT_OK);
    ck_assert_int_eq(cfg->micro_batch, 64);
    ck_assert_str_eq(note, "");
    ct_config_free(cfg);
}
END_TEST

/* ---- ZeRO stage and offload ---- */

/* Every ZeRO test's sub_group_size: an NVMe swap's buffers then hold chunks of this many elements
 * whatever the model's size, so its rows' plans grow evenly with the blocks as the others' do (a
 * model under sub_group_size has buffers of its own size, rounded to the disk's blocks). */
#define SUB_GROUP "zero_optimization.sub_group_size=4096"

/* The overrides that set a row's stage and offload (as a user writes them), plus `extra`. */
static int row_sets(int stage, ct_fit_offload o, const char **sets, const char *extra) {
    static const char *const dev[] = {[CT_OFFLOAD_NONE] = "\"none\"", [CT_OFFLOAD_CPU] = "\"cpu\"",
                                      [CT_OFFLOAD_NVME] = "\"nvme\""};
    static char st[4][48], opt[3][80], par[3][80], nvme_path[128];
    int n = 0, od = ct_fit_offload_optimizer(o), pd = ct_fit_offload_param(o);
    snprintf(st[stage], sizeof st[stage], "zero_optimization.stage=%d", stage);
    snprintf(opt[od], sizeof opt[od], "zero_optimization.offload_optimizer.device=%s", dev[od]);
    snprintf(par[pd], sizeof par[pd], "zero_optimization.offload_param.device=%s", dev[pd]);
    snprintf(nvme_path, sizeof nvme_path, "zero_optimization.offload_optimizer.nvme_path=\"%s/swap\"", tmpdir);
    sets[n++] = st[stage];
    sets[n++] = opt[od];
    sets[n++] = par[pd];
    sets[n++] = SUB_GROUP;
    if (od == CT_OFFLOAD_NVME) sets[n++] = nvme_path;
    if (extra) sets[n++] = extra;
    return n;
}

/* The MLP for the ZeRO tests: SUB_GROUP and `extra` (NULL: none) over `world` ranks. */
static ct_config *load_zero_mlp(const char *extra, int world) {
    const char *sets[] = {SUB_GROUP, extra};
    return load_mlp_with(sets, extra ? 2 : 1, world);
}

/* The device plan of the MLP with a row's settings written in its config, `blocks` repeats. */
static ct_run_plan row_plan(int stage, ct_fit_offload o, int world, long blocks, int64_t *params) {
    char times[64];
    snprintf(times, sizeof times, "model.layers.1.times=%ld", blocks);
    const char *sets[6];
    int n = row_sets(stage, o, sets, times);
    ct_config *c = load_mlp_with(sets, n, world);
    ct_run_plan p;
    ct_err err = {0};
    ck_assert_int_eq(ct_fit_plan(c, true, c->micro_batch, CT_SEGMENTS_CONFIG, &p, &err), CT_OK);
    if (params) {
        ct_graph *g = NULL;
        ck_assert_int_eq(ct_graph_build(c, c->micro_batch, CT_F32, &g, &err), CT_OK);
        *params = ct_graph_info_get(g)->n_param_elems;
        ct_graph_free(g);
    }
    ct_config_free(c);
    return p;
}

/* Each row is the plan of the config that says the row's settings itself; offload moves the
 * master, gradients and optimizer state from the device to the host. */
START_TEST(zero_rows_are_the_runs_plans) {
    for (int world = 1; world <= 2; world++) {
        ct_config *cfg = load_zero_mlp(NULL, world);
        ct_fit_zero_row rows[CT_FIT_ZERO_ROWS];
        ct_fit_family fam;
        ct_err err = {0};
        ck_assert_int_eq(ct_fit_zero_rows(cfg, (ct_fit_memory){0, 0}, rows, &fam, &err), CT_OK);
        ck_assert_int_eq(fam.layer, 1);
        ck_assert_int_eq(fam.blocks, 6);
        for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) {
            ct_run_plan p = row_plan(rows[r].stage, rows[r].offload, world, 6, NULL);
            ck_assert_msg(rows[r].device == p.total && rows[r].host == p.host_total,
                          "world %d, stage %d offload %d: row %zu/%zu, run %zu/%zu", world, rows[r].stage,
                          rows[r].offload, rows[r].device, rows[r].host, p.total, p.host_total);
            ck_assert_int_eq(rows[r].disk, p.nvme ? p.swap_disk : 0);
            ck_assert(p.nvme == (rows[r].offload >= CT_FIT_OFFLOAD_NVME));
            ck_assert_int_eq(rows[r].fits, -1);          /* no device memory given */
            ck_assert_int_eq(rows[r].max_blocks, -1);
            ck_assert_str_eq(rows[r].refused, "");
        }
        /* rows 0, 1, 2, 3: stage 0, stage 1, stage 1 + optimizer offload, stage 1 + NVMe */
        ck_assert_uint_gt(rows[0].device, rows[2].device);
        ck_assert_uint_eq(rows[0].host, 0);
        ck_assert_uint_gt(rows[2].host, 0);
        ck_assert_int_eq(rows[1].runs_stage, world == 1 ? 0 : 1);
        ck_assert_int_eq(rows[2].runs_stage, 2);       /* stage 1 + offload takes stage 2's path */
        ck_assert_int_eq(rows[3].runs_stage, 2);
        ck_assert_int_gt(rows[3].disk, 0);
        ck_assert_uint_eq(rows[3].device, rows[2].device);   /* the same device memory as offload to host */
        ck_assert(rows[9].offload == CT_FIT_OFFLOAD_BOTH && rows[11].offload == CT_FIT_OFFLOAD_NVME_PARAMS);
        ck_assert_int_eq(rows[9].runs_stage, 3);
        ck_assert_int_eq(rows[11].runs_stage, 3);
        ct_config_free(cfg);
    }
    /* Lamb: the offloaded rows are refused as the run refuses them */
    ct_config *cfg = load_zero_mlp("optimizer.type=\"Lamb\"", 1);
    ct_fit_zero_row rows[CT_FIT_ZERO_ROWS];
    ct_fit_family fam;
    ct_err err = {0};
    ck_assert_int_eq(ct_fit_zero_rows(cfg, (ct_fit_memory){(size_t)1 << 40, (size_t)1 << 40}, rows, &fam, &err), CT_OK);
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) {
        bool off = rows[r].offload != CT_FIT_NO_OFFLOAD;
        ck_assert_msg(off == (strstr(rows[r].refused, "Lamb") != NULL), "row %d: \"%s\"", r, rows[r].refused);
        ck_assert_int_eq(rows[r].fits, off ? 0 : 1);
    }
    ct_config_free(cfg);
}
END_TEST

/* The largest model of each row is the largest repeat count whose own plan (the config with that
 * count, planned from scratch) fits, found here by trying every count; its bound is the memory
 * that count + 1 passes. On 1 rank and on 2 (whose host memory the ranks share). */
START_TEST(largest_model_is_the_largest_that_fits) {
    for (int world = 1; world <= 2; world++) {
        /* a device that holds 20 blocks with optimizer offload at stage 2, a host 10 blocks' worth
         * of its offloaded state: some rows bound by each */
        ct_run_plan dev20 = row_plan(2, CT_FIT_OFFLOAD_OPTIMIZER, world, 20, NULL);
        ct_run_plan host10 = row_plan(2, CT_FIT_OFFLOAD_OPTIMIZER, world, 10, NULL);
        ct_fit_memory mem = {dev20.total + 100, host10.host_total * (size_t)world + 100};
        ct_config *cfg = load_zero_mlp(NULL, world);
        ct_fit_zero_row rows[CT_FIT_ZERO_ROWS];
        ct_fit_family fam;
        ct_err err = {0};
        ck_assert_int_eq(ct_fit_zero_rows(cfg, mem, rows, &fam, &err), CT_OK);
        ck_assert(fam.affine);
        bool seen_host = false, seen_device = false;
        for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) {
            long n = 0;
            ct_run_plan p;
            int64_t params = 0, params_n = 0;
            for (;;) {   /* the first count that does not fit */
                p = row_plan(rows[r].stage, rows[r].offload, world, n + 1, &params);
                if (p.total > mem.device || p.host_total * (size_t)world > mem.host) break;
                n++;
                params_n = params;
                ck_assert_int_lt(n, 400);
            }
            ck_assert_msg(rows[r].max_blocks == n, "world %d, row %d: %ld blocks, every count tried: %ld", world, r,
                          rows[r].max_blocks, n);
            if (n > 0) ck_assert_int_eq(rows[r].max_params, params_n);
            const char *bound = p.total > mem.device ? "device" : "host";
            ck_assert_msg(!strcmp(rows[r].bound, bound), "world %d, row %d: bound %s, %s at %ld", world, r,
                          rows[r].bound, bound, n + 1);
            seen_host |= !strcmp(bound, "host");
            seen_device |= !strcmp(bound, "device");
            /* fits: the configured 6 blocks are within the largest */
            ck_assert_int_eq(rows[r].fits, n >= 6);
        }
        ck_assert(seen_host && seen_device);
        ct_config_free(cfg);
    }
}
END_TEST

/* The ranks of a world share the host memory: 2 ranks whose offloaded state (per rank) fits it once
 * but not twice do not fit, and the largest model is bound by the host; twice that memory fits. */
START_TEST(ranks_share_the_host_memory) {
    ct_run_plan two = row_plan(2, CT_FIT_OFFLOAD_OPTIMIZER, 2, 6, NULL);
    ct_config *cfg = load_zero_mlp(NULL, 2);
    for (int twice = 0; twice <= 1; twice++) {
        ct_fit_memory mem = {(size_t)1 << 40, twice ? 2 * two.host_total : two.host_total + two.host_total / 2};
        ct_fit_zero_row rows[CT_FIT_ZERO_ROWS];
        ct_fit_family fam;
        ct_err err = {0};
        ck_assert_int_eq(ct_fit_zero_rows(cfg, mem, rows, &fam, &err), CT_OK);
        ck_assert_int_eq(rows[5].stage, 2);
        ck_assert_int_eq(rows[5].offload, CT_FIT_OFFLOAD_OPTIMIZER);
        ck_assert_uint_eq(rows[5].host, two.host_total);
        ck_assert_int_eq(rows[5].fits, twice);
        ck_assert_int_eq(rows[4].fits, 1);   /* stage 2 without offload needs no host memory */
        ck_assert_str_eq(rows[5].bound, "host");
        if (twice) ck_assert_int_ge(rows[5].max_blocks, 6);
        else ck_assert_int_lt(rows[5].max_blocks, 6);
    }
    ct_config_free(cfg);
}
END_TEST

/* The cheapest that fits: the least moved to host memory, then the lowest stage. */
START_TEST(cheapest_row_that_fits) {
    ct_fit_zero_row rows[CT_FIT_ZERO_ROWS];
    static const int stage[] = {0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3};
    static const ct_fit_offload off[] = {
        CT_FIT_NO_OFFLOAD, CT_FIT_NO_OFFLOAD,        CT_FIT_OFFLOAD_OPTIMIZER, CT_FIT_OFFLOAD_NVME,
        CT_FIT_NO_OFFLOAD, CT_FIT_OFFLOAD_OPTIMIZER, CT_FIT_OFFLOAD_NVME,      CT_FIT_NO_OFFLOAD,
        CT_FIT_OFFLOAD_OPTIMIZER, CT_FIT_OFFLOAD_BOTH, CT_FIT_OFFLOAD_NVME, CT_FIT_OFFLOAD_NVME_PARAMS};
    for (int r = 0; r < CT_FIT_ZERO_ROWS; r++) rows[r] = (ct_fit_zero_row){.stage = stage[r], .offload = off[r]};
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), -1);
    rows[11].fits = rows[10].fits = 1;
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 10);     /* NVMe alone before NVMe and the parameters */
    rows[9].fits = 1;
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 9);      /* host memory before NVMe */
    rows[8].fits = rows[6].fits = 1;
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 8);      /* the optimizer to host memory before to NVMe */
    rows[5].fits = 1;
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 5);      /* stage 2 before 3 */
    rows[2].fits = 1;
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 2);
    rows[7].fits = 1;
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 7);      /* no offload before any offload */
    rows[0].fits = -1;                                    /* not known is not fits */
    ck_assert_int_eq(ct_fit_zero_cheapest(rows), 7);
}
END_TEST

/* The line of `table` that holds `mark`, or NULL. */
static const char *line_of(const char *table, const char *mark) {
    const char *line = strstr(table, mark);
    while (line && line > table && line[-1] != '\n') line--;
    return line;
}

/* The table's text: the config's row and the cheapest marked (the config offloading the optimizer
 * and parameters to host memory, then the optimizer to NVMe); the NVMe note; the rule's line. */
START_TEST(zero_table_marks_rows) {
    char nvme_path[128];
    snprintf(nvme_path, sizeof nvme_path, "zero_optimization.offload_optimizer.nvme_path=\"%s/swap\"", tmpdir);
    const char *both[] = {"zero_optimization.stage=3", "zero_optimization.offload_optimizer.device=\"cpu\"",
                          "zero_optimization.offload_param.device=\"cpu\"", SUB_GROUP};
    const char *nvme[] = {"zero_optimization.stage=2", "zero_optimization.offload_optimizer.device=\"nvme\"",
                          nvme_path, SUB_GROUP};
    const char *own_row[] = {"      3  optimizer + params", "      2  nvme "};
    for (int k = 0; k < 2; k++) {
        ct_config *cfg = load_mlp_with(k ? nvme : both, 4, 1);
        ct_run_plan dev = row_plan(2, CT_FIT_OFFLOAD_OPTIMIZER, 1, 6, NULL);
        char *table = calloc(1, 8192);
        ct_err err = {0};
        ck_assert_int_eq(ct_fit_zero_table(cfg, (ct_fit_memory){dev.total, (size_t)1 << 40}, collect_row, table, &err),
                         CT_OK);
        const char *line = line_of(table, "<- this config");
        ck_assert_msg(line && strncmp(line, own_row[k], strlen(own_row[k])) == 0, "%s", table);
        line = line_of(table, "cheapest that fits");
        ck_assert_msg(line && strncmp(line, "      1  optimizer ", 18) == 0, "%s", table);
        ck_assert_msg(strstr(table, "model.layers.1's \"times\" (6 here)"), "%s", table);
        ck_assert_msg(strstr(table, "(nvme: offload_optimizer \"nvme\", the fp32 master and optimizer state in swap files"),
                      "%s", table);
        free(table);
        ct_config_free(cfg);
    }
}
END_TEST

START_TEST(cpu_out_of_memory_explained) {
    ct_config *cfg = load_mlp("512", 0);
    ct_graph *g = NULL;
    ct_err err = {0};
    ck_assert_int_eq(ct_graph_build(cfg, 512, CT_F32, &g, &err), CT_OK);
    ct_run_plan plan;
    ct_run_plan_make(cfg, g, false, &plan);
    ct_backend *be = ct_cpu_backend_create(1);
    ck_assert_ptr_nonnull(be);
    /* capped below the arena: the allocation fails as a device out of memory does */
    ct_cpu_backend_set_limit(be, plan.act.total - 1);
    ck_assert_int_eq(ct_graph_bind(g, be, NULL, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "out of memory allocating activations"), "%s", err.msg);
    ck_assert_int_eq(ct_fit_explain_oom(cfg, &plan, plan.act.total - 1, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "planned: params") && strstr(err.msg, "micro-batch"), "%s", err.msg);
    /* and at the cap it fits */
    ct_cpu_backend_set_limit(be, plan.act.total);
    ck_assert_int_eq(ct_graph_bind(g, be, NULL, &err), CT_OK);
    ct_graph_free(g);
    ct_backend_destroy(be);
    ct_config_free(cfg);
}
END_TEST

static Suite *fit_suite(void) {
    Suite *s = suite_create("fit");
    TCase *tc = tcase_create("fit");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, sizes_parse);
    tcase_add_test(tc, sizes_refused);
    tcase_add_test(tc, largest_micro_arithmetic);
    tcase_add_test(tc, plan_is_the_runs_plan);
    tcase_add_test(tc, device_plan_counts_conv_scratch);
    tcase_add_test(tc, table_plans_offload_on_a_device);
    tcase_add_test(tc, suggestions_from_the_plan);
    tcase_add_test(tc, auto_micro_batch_under_limits);
    tcase_add_test(tc, cpu_out_of_memory_explained);
    tcase_add_test(tc, zero_rows_are_the_runs_plans);
    tcase_add_test(tc, largest_model_is_the_largest_that_fits);
    tcase_add_test(tc, ranks_share_the_host_memory);
    tcase_add_test(tc, cheapest_row_that_fits);
    tcase_add_test(tc, zero_table_marks_rows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_fit_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    SRunner *sr = srunner_create(fit_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return failed ? 1 : 0;
}

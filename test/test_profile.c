/* test_profile.c: the flops profiler's table (core/report/profile.h): grouping by module depth,
 * the total row against the rows it sums (read back from the printed text), the share and FLOP/s
 * columns, MFU only with a known peak (random rows, never zeros); and each rule of the bottleneck
 * report (core/report/bottleneck.h) on synthetic measurements: it fires past its threshold with
 * the config change named, and stays quiet below it. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/bottleneck.h"
#include "core/report/profile.h"

/* Random rows named like a repeated block's layers: "h.<i/3>.<part>" and a last "head". */
static int random_rows(ct_profile_row *rows, int n, unsigned seed) {
    srand(seed);
    static const char *const parts[] = {"ln", "attn", "mlp"};
    static const char *const types[] = {"layernorm", "causal_self_attention", "linear"};
    for (int i = 0; i < n; i++) {
        ct_profile_row *r = &rows[i];
        memset(r, 0, sizeof *r);
        if (i == n - 1) snprintf(r->name, sizeof r->name, "head"), snprintf(r->type, sizeof r->type, "linear");
        else snprintf(r->name, sizeof r->name, "h.%d.%s", i / 3, parts[i % 3]),
             snprintf(r->type, sizeof r->type, "%s", types[i % 3]);
        r->layers = 1;
        r->params = 1 + rand() % 100000;
        r->fwd_flops = 1e6 * (1 + rand() % 1000);
        r->fwd_s = 1e-4 * (1 + rand() % 100);
        r->bwd_s = 1e-4 * (1 + rand() % 200);
    }
    return n;
}

START_TEST(group_by_depth_sums) {
    enum { N = 13 };
    ct_profile_row rows[N], orig[N];
    random_rows(orig, N, 7);
    /* depth 1: "h" (12 layers) and "head" */
    memcpy(rows, orig, sizeof rows);
    int n = ct_profile_group(rows, N, 1);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(rows[0].name, "h");
    ck_assert_str_eq(rows[0].type, "-");   /* several types */
    ck_assert_int_eq(rows[0].layers, N - 1);
    ck_assert_str_eq(rows[1].name, "head");
    ck_assert_str_eq(rows[1].type, "linear");
    int64_t params = 0;
    double flops = 0, fwd = 0, bwd = 0;
    for (int i = 0; i < N - 1; i++)
        params += orig[i].params, flops += orig[i].fwd_flops, fwd += orig[i].fwd_s, bwd += orig[i].bwd_s;
    ck_assert_int_eq(rows[0].params, params);
    ck_assert_double_eq_tol(rows[0].fwd_flops, flops, 1e-6 * flops);
    ck_assert_double_eq_tol(rows[0].fwd_s, fwd, 1e-12);
    ck_assert_double_eq_tol(rows[0].bwd_s, bwd, 1e-12);
    /* depth 2: one row per block instance, in order */
    memcpy(rows, orig, sizeof rows);
    n = ct_profile_group(rows, N, 2);
    ck_assert_int_eq(n, 5);
    ck_assert_str_eq(rows[0].name, "h.0");
    ck_assert_str_eq(rows[3].name, "h.3");
    ck_assert_int_eq(rows[3].layers, 3);
    ck_assert_int_eq(rows[3].params, orig[9].params + orig[10].params + orig[11].params);
    /* depth past every name, and depth -1: unchanged */
    memcpy(rows, orig, sizeof rows);
    ck_assert_int_eq(ct_profile_group(rows, N, 5), N);
    ck_assert_int_eq(ct_profile_group(rows, N, -1), N);
    ck_assert_int_eq(memcmp(rows, orig, sizeof rows), 0);
    /* the total is the same at every depth */
    ct_profile_row a = ct_profile_total(orig, N);
    memcpy(rows, orig, sizeof rows);
    n = ct_profile_group(rows, N, 2);
    ct_profile_row b = ct_profile_total(rows, n);
    ck_assert_int_eq(a.params, b.params);
    ck_assert_int_eq(a.layers, N);
    ck_assert_int_eq(b.layers, N);
    ck_assert_double_eq_tol(a.fwd_s + a.bwd_s, b.fwd_s + b.bwd_s, 1e-12);
}
END_TEST

typedef struct text {
    char lines[64][512];
    int n;
} text;

static void collect(void *ctx, const char *line) {
    text *t = ctx;
    ck_assert_int_lt(t->n, 64);
    snprintf(t->lines[t->n++], sizeof t->lines[0], "%s", line);
}

/* One table line read back: name type params flops fwd_ms bwd_ms total_ms share% rate. */
typedef struct parsed {
    char name[128], type[64];
    long long params;
    double flops, fwd_ms, bwd_ms, total_ms, share;
} parsed;

static bool parse_row(const char *line, parsed *p) {
    return sscanf(line, " %127s %63s %lld %lf %lf %lf %lf %lf%%", p->name, p->type, &p->params, &p->flops,
                  &p->fwd_ms, &p->bwd_ms, &p->total_ms, &p->share) == 8;
}

/* The printed rows add up to the printed total row; shares are of the step; MFU needs a peak. */
START_TEST(table_sums_match) {
    enum { N = 10 };
    ct_profile_row rows[N];
    random_rows(rows, N, 11);
    ct_profile_row total = ct_profile_total(rows, N);
    double step_s = 1.25 * (total.fwd_s + total.bwd_s);
    ct_profile_info info = {.step = 3, .samples = 64, .step_s = step_s, .train_flops = 3 * total.fwd_flops,
                            .device = "test device", .top_modules = 3, .detailed = true};
    text t = {0};
    ct_profile_write(&info, rows, N, collect, &t);
    parsed sum = {0}, tot = {0};
    int data_rows = 0;
    bool have_total = false;
    for (int i = 0; i < t.n; i++) {
        parsed p;
        if (!parse_row(t.lines[i], &p)) continue;
        if (!strcmp(p.name, "total")) {
            tot = p;
            have_total = true;
            continue;
        }
        data_rows++;
        sum.params += p.params, sum.flops += p.flops, sum.fwd_ms += p.fwd_ms, sum.bwd_ms += p.bwd_ms;
        sum.total_ms += p.total_ms, sum.share += p.share;
        ck_assert_double_eq_tol(p.fwd_ms + p.bwd_ms, p.total_ms, 2e-3);
    }
    ck_assert_int_eq(data_rows, N);
    ck_assert(have_total);
    ck_assert_int_eq(sum.params, tot.params);
    ck_assert_double_eq_tol(sum.flops, tot.flops, 1e-5 * tot.flops);
    ck_assert_double_eq_tol(sum.fwd_ms, tot.fwd_ms, N * 1e-3);
    ck_assert_double_eq_tol(sum.bwd_ms, tot.bwd_ms, N * 1e-3);
    ck_assert_double_eq_tol(sum.share, tot.share, N * 0.1);
    ck_assert_double_eq_tol(tot.share, 80.0, 0.1);   /* layers are 1/1.25 of the step */
    /* the rest of the step, the top modules, and no MFU without a peak */
    bool rest = false, top = false, no_mfu = false;
    for (int i = 0; i < t.n; i++) {
        rest |= strstr(t.lines[i], "outside the layers") && strstr(t.lines[i], "(20.0% of the step)");
        top |= strncmp(t.lines[i], "top 3 modules by time:", 22) == 0;
        no_mfu |= strstr(t.lines[i], "MFU not reported") != NULL;
    }
    ck_assert(rest && top && no_mfu);
    /* with a peak: MFU = train FLOPs / step time / peak */
    info.peak_flops = 4 * info.train_flops / step_s;   /* 25% */
    info.detailed = false;
    t.n = 0;
    ct_profile_write(&info, rows, N, collect, &t);
    bool mfu = false;
    data_rows = 0;
    for (int i = 0; i < t.n; i++) {
        parsed p;
        if (parse_row(t.lines[i], &p) && strcmp(p.name, "total") != 0) data_rows++;
        mfu |= strstr(t.lines[i], "MFU 25.00%") != NULL;
    }
    ck_assert_int_eq(data_rows, 0);   /* not detailed: the total row alone */
    ck_assert(mfu);
}
END_TEST

START_TEST(row_rate) {
    ct_profile_row r = {.fwd_flops = 2e9, .fwd_s = 0.01, .bwd_s = 0.02};
    ck_assert_double_eq_tol(ct_profile_row_flops_per_s(&r), 3 * 2e9 / 0.03, 1);
    r.fwd_s = r.bwd_s = 0;
    ck_assert(isnan(ct_profile_row_flops_per_s(&r)));
}
END_TEST

/* A run with nothing wrong: CPU, fp32, the loader keeping up. */
static ct_run_measures healthy(void) {
    return (ct_run_measures){.steps = 100, .data_wait_share = 0.02, .workers = 4, .cores = 16, .format = "idx",
                             .source = "/d/train-images-idx3-ubyte.gz", .precision = "fp32", .micro_batch = 16,
                             .accum = 2, .initial_scale = NAN, .final_scale = NAN};
}

/* The findings of m; exactly `want` must fire, the first with rule `rule`. */
static ct_finding find_one(const ct_run_measures *m, int want, const char *rule) {
    ct_finding f[8];
    memset(f, 0, sizeof f);
    int n = ct_bottleneck_find(m, f, 8);
    ck_assert_int_eq(n, want);
    if (want) ck_assert_str_eq(f[0].rule, rule);
    return f[0];
}

static void has(const char *text, const char *part) {
    ck_assert_msg(strstr(text, part) != NULL, "\"%s\" lacks \"%s\"", text, part);
}

START_TEST(rule_nothing_on_a_healthy_run) {
    ct_run_measures m = healthy();
    find_one(&m, 0, NULL);
    m.data_wait_share = NAN;   /* unknown: no claim */
    find_one(&m, 0, NULL);
}
END_TEST

START_TEST(rule_data_wait) {
    ct_run_measures m = healthy();
    m.data_wait_share = 0.42;
    ct_finding f = find_one(&m, 1, "data_wait");
    has(f.what, "42%");
    has(f.fix, "\"data\": {\"workers\": 16} (this run: 4, 16 cores)");
    has(f.fix, "\"data\": {\"cache\": true}");
    has(f.fix, "ctrain pack --from idx /d/train-images-idx3-ubyte.gz --out SHARDS");
    has(f.fix, "\"format\": \"shard\"");
    m.data_wait_share = 0.099;   /* under the threshold */
    find_one(&m, 0, NULL);
    /* every core, cached, already shards: what is left */
    m = healthy();
    m.data_wait_share = 0.3, m.workers = 16, m.cache = true, m.format = "shard";
    f = find_one(&m, 1, "data_wait");
    ck_assert(strstr(f.fix, "workers") == NULL && strstr(f.fix, "pack") == NULL);
    has(f.fix, "faster disk");
    /* token files cannot be packed further: no pack command */
    m.format = "tokens", m.cache = false;
    f = find_one(&m, 1, "data_wait");
    ck_assert(strstr(f.fix, "ctrain pack") == NULL);
    has(f.fix, "\"cache\": true");
}
END_TEST

START_TEST(rule_precision) {
    ct_run_measures m = healthy();
    m.gpu = true, m.sm = 90;
    ct_finding f = find_one(&m, 1, "precision");
    has(f.what, "sm_90");
    has(f.fix, "\"bf16\": {\"enabled\": true}");
    m.sm = 75;   /* tensor cores, no bf16 */
    f = find_one(&m, 1, "precision");
    has(f.fix, "\"fp16\": {\"enabled\": true}");
    m.sm = 61;   /* no tensor cores */
    find_one(&m, 0, NULL);
    m.sm = 90, m.precision = "bf16";
    find_one(&m, 0, NULL);
    m.precision = "fp32", m.gpu = false;   /* the CPU */
    find_one(&m, 0, NULL);
}
END_TEST

START_TEST(rule_memory) {
    ct_run_measures m = healthy();
    m.gpu = true, m.sm = 90, m.precision = "bf16";
    m.device_bytes = (size_t)80 << 30, m.peak_bytes = (size_t)12 << 30;
    m.fits_micro = 32, m.fits_accum = 1;
    ct_finding f = find_one(&m, 1, "memory");
    has(f.what, "12.0 GiB of 80.0 GiB (15%)");
    has(f.fix, "\"train_micro_batch_size_per_gpu\": 32 with \"gradient_accumulation_steps\": 1");
    has(f.fix, "this run: 16 x 2");
    m.peak_bytes = (size_t)48 << 30;   /* 60% used */
    find_one(&m, 0, NULL);
    m.peak_bytes = (size_t)12 << 30, m.fits_micro = 16;   /* the planner finds nothing larger */
    find_one(&m, 0, NULL);
    m.fits_micro = 32, m.device_bytes = 0;   /* unknown device size */
    find_one(&m, 0, NULL);
}
END_TEST

START_TEST(rule_loss_scale_collapse) {
    ct_run_measures m = healthy();
    m.precision = "fp16", m.initial_scale = 65536, m.min_scale = 1, m.final_scale = 2, m.skipped_steps = 40;
    ct_finding f = find_one(&m, 1, "loss_scale");   /* collapse, not "initial scale" */
    has(f.what, "collapsed: 2 at the end (started at 65536, floor 1)");
    has(f.fix, "\"bf16\": {\"enabled\": true}");
    m.final_scale = 1024, m.skipped_steps = 0;   /* well above the floor */
    find_one(&m, 0, NULL);
    m.min_scale = 128, m.final_scale = 1024;     /* within 16x of a raised floor */
    find_one(&m, 1, "loss_scale");
}
END_TEST

START_TEST(rule_skipped_steps) {
    ct_run_measures m = healthy();
    m.precision = "fp16", m.initial_scale = ldexp(1, 32), m.min_scale = 1, m.final_scale = ldexp(1, 20);
    m.skipped_steps = 12;
    ct_finding f = find_one(&m, 1, "skipped_steps");
    has(f.what, "12 of 100 steps skipped (12%)");
    has(f.fix, "\"fp16\": {\"initial_scale_power\": 21}");
    has(f.fix, "started at 2^32");
    m.skipped_steps = 5;   /* 5%: not more than the threshold */
    find_one(&m, 0, NULL);
    m.initial_scale = NAN, m.skipped_steps = 50;   /* not fp16 */
    find_one(&m, 0, NULL);
}
END_TEST

/* Several rules at once, in rule order; the count even past max. */
START_TEST(rules_order_and_max) {
    ct_run_measures m = healthy();
    m.data_wait_share = 0.5, m.gpu = true, m.sm = 80;
    m.device_bytes = (size_t)40 << 30, m.peak_bytes = (size_t)1 << 30, m.fits_micro = 64, m.fits_accum = 1;
    ct_finding f[3];
    ck_assert_int_eq(ct_bottleneck_find(&m, f, 3), 3);
    ck_assert_str_eq(f[0].rule, "data_wait");
    ck_assert_str_eq(f[1].rule, "precision");
    ck_assert_str_eq(f[2].rule, "memory");
    ck_assert_int_eq(ct_bottleneck_find(&m, f, 1), 3);
    ck_assert_int_eq(ct_bottleneck_find(&m, NULL, 0), 3);
}
END_TEST

START_TEST(device_description) {
    ck_assert_int_eq(ct_device_sm("NVIDIA H100 80GB HBM3, sm_90, 79 GiB"), 90);
    ck_assert_uint_eq(ct_device_bytes("NVIDIA H100 80GB HBM3, sm_90, 79 GiB"), (size_t)79 << 30);
    ck_assert_int_eq(ct_device_sm("AMD EPYC, 2 threads, OpenBLAS 0.3.21"), 0);
    ck_assert_uint_eq(ct_device_bytes("AMD EPYC, 2 threads, OpenBLAS 0.3.21"), 0);
    ck_assert_uint_eq(ct_device_bytes(NULL), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("profile");
    tcase_add_test(tc, group_by_depth_sums);
    tcase_add_test(tc, table_sums_match);
    tcase_add_test(tc, row_rate);
    tcase_add_test(tc, rule_nothing_on_a_healthy_run);
    tcase_add_test(tc, rule_data_wait);
    tcase_add_test(tc, rule_precision);
    tcase_add_test(tc, rule_memory);
    tcase_add_test(tc, rule_loss_scale_collapse);
    tcase_add_test(tc, rule_skipped_steps);
    tcase_add_test(tc, rules_order_and_max);
    tcase_add_test(tc, device_description);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

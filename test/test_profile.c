/* test_profile.c: the flops profiler's table (core/report/profile.h): grouping by module depth,
 * the total row against the rows it sums (read back from the printed text), the share and FLOP/s
 * columns, MFU only with a known peak. Random rows, never zeros. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void) {
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("profile");
    tcase_add_test(tc, group_by_depth_sums);
    tcase_add_test(tc, table_sums_match);
    tcase_add_test(tc, row_rate);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

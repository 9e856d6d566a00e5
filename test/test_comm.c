/* test_comm.c: the single-process communicator (core/dist/comm.h). Over one rank a reduction is
 * the identity and a scatter or gather a copy; the table is the one MPI and NCCL will fill, so
 * its contract is checked here: in place where the header says so, copies where it does not, and
 * an error for a root that does not exist. Also what needs no second process: the ranks' check
 * that they were started alike (agree.h: the items of a config, their digest, the first key that
 * differs, text through the host all-reduce) and the watchdogs' decision (watchdog.h: a wait past
 * the timeout, a stop signal a stuck rank cannot act on). test_comm_mpi runs the check on 3 ranks.
 * And the ZeRO partition's arithmetic (ct_comm_shard, and ct_comm_shard_range against the owned
 * elements one by one), and the communicator of threads (test/thread_comm.h) that
 * test_partition's ranks meet over, against sums over every rank's values on 1 to 4 ranks. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/dist/agree.h"
#include "core/dist/comm.h"
#include "core/dist/watchdog.h"
#include "core/util/rng.h"
#include "test/thread_comm.h"

static float *random_floats(ct_backend *be, int64_t n, uint64_t stream) {
    float *x = be->mem.alloc(be, (size_t)n * sizeof(float), CT_MEM_WORKSPACE);
    ct_rng r;
    ct_rng_init(&r, 5, CT_RNG_AUGMENT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = (float)ct_rng_normal(&r);   /* CPU backend: host memory */
    return x;
}

START_TEST(one_rank) {
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = ct_comm_single(be);
    ck_assert_int_eq(c->rank, 0);
    ck_assert_int_eq(c->world, 1);
    ck_assert_ptr_eq(c->be, be);
    enum { N = 1000 };
    float *a = random_floats(be, N, 1), *b = random_floats(be, N, 2), keep[N];
    memcpy(keep, a, sizeof keep);
    ct_err err = {0};
    /* a sum over one rank changes nothing */
    ck_assert_int_eq(c->all_reduce(c, a, N, CT_F32, CT_REDUCE_SUM, &err), CT_OK);
    ck_assert_mem_eq(a, keep, sizeof keep);
    /* scatter and gather over one rank copy the whole buffer, or nothing when in place */
    ck_assert_int_eq(c->reduce_scatter(c, b, a, N, CT_F32, CT_REDUCE_SUM, &err), CT_OK);
    ck_assert_mem_eq(b, keep, sizeof keep);
    memset(b, 0, sizeof keep);
    ck_assert_int_eq(c->all_gather(c, b, a, N / 2, CT_BF16, &err), CT_OK);   /* the element size counts */
    ck_assert_mem_eq(b, keep, N / 2 * sizeof(uint16_t));
    for (int i = N / 4; i < N; i++) ck_assert_int_eq(((uint32_t *)b)[i], 0);
    ck_assert_int_eq(c->all_gather(c, a, a, N, CT_F32, &err), CT_OK);
    ck_assert_mem_eq(a, keep, sizeof keep);
    /* broadcast from rank 0, the only rank; another root is an error naming it */
    ck_assert_int_eq(c->broadcast(c, a, N, CT_F32, 0, &err), CT_OK);
    ck_assert_int_eq(c->broadcast(c, a, N, CT_F32, 1, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "rank 1"), "%s", err.msg);
    /* host values */
    double v[3] = {1.5, -2.0, 1e300};
    ck_assert_int_eq(c->all_reduce_host(c, v, 3, CT_REDUCE_MAX, &err), CT_OK);
    ck_assert(v[0] == 1.5 && v[1] == -2.0 && v[2] == 1e300);
    ck_assert_int_eq(c->barrier(c, &err), CT_OK);
    /* the shard collectives over one rank: its part is everything, nothing moves */
    memcpy(keep, a, sizeof keep);
    ck_assert_int_eq(c->reduce_scatter_shards(c, a, N, CT_F32, CT_REDUCE_SUM, &err), CT_OK);
    ck_assert_int_eq(c->all_gather_shards(c, a, N, CT_F32, &err), CT_OK);
    ck_assert_mem_eq(a, keep, sizeof keep);
    /* the non-blocking forms complete at start (a NULL request, which test and wait take) */
    ct_comm_req *q = (ct_comm_req *)&q;
    bool done = false;
    ck_assert_int_eq(c->start_all_reduce(c, a, N, CT_F32, CT_REDUCE_SUM, &q, &err), CT_OK);
    ck_assert_ptr_null(q);
    ck_assert_int_eq(c->test(c, q, &done, &err), CT_OK);
    ck_assert(done);
    ck_assert_int_eq(c->wait(c, q, &err), CT_OK);
    ck_assert_mem_eq(a, keep, sizeof keep);
    memset(b, 0, sizeof keep);
    ck_assert_int_eq(c->start_all_gather_range(c, b, a, N, 100, 300, CT_F32, &q, &err), CT_OK);
    ck_assert_int_eq(c->wait(c, q, &err), CT_OK);
    ck_assert_mem_eq(b, keep + 100, 200 * sizeof(float));
    memset(b, 0, sizeof keep);
    ck_assert_int_eq(c->start_reduce_scatter_range(c, b, a + 7, N, 7, 19, CT_F32, &q, &err), CT_OK);
    ck_assert_int_eq(c->wait(c, q, &err), CT_OK);
    ck_assert_mem_eq(b, keep + 7, 12 * sizeof(float));
    be->mem.free(be, a);
    be->mem.free(be, b);
    ct_comm_destroy(c);
    ct_backend_destroy(be);
}
END_TEST

/* The ZeRO partition: the parts of every rank are disjoint, in rank order, cover [0, n), and are
 * ceil(n / world) long but for the last ones (shorter or empty when world does not divide n). */
START_TEST(partition) {
    static const int64_t sizes[] = {0, 1, 5, 119, 128, 1000003};
    for (int i = 0; i < (int)(sizeof sizes / sizeof sizes[0]); i++)
        for (int world = 1; world <= 7; world++) {
            int64_t n = sizes[i], part = (n + world - 1) / world, at = 0;
            for (int r = 0; r < world; r++) {
                int64_t lo, hi;
                ct_comm_shard(n, world, r, &lo, &hi);
                ck_assert_int_eq(lo, at);
                ck_assert_int_ge(hi, lo);
                ck_assert_int_le(hi - lo, part);
                if (hi < n) ck_assert_int_eq(hi - lo, part);
                at = hi;
            }
            ck_assert_int_eq(at, n);
        }
}
END_TEST

/* The part of a range a rank owns (ct_comm_shard_range, what every range collective and ZeRO-2/3's
 * reductions use to find their share): element by element, exactly the elements of [a, b) in the
 * rank's part, for every range of small spaces and world sizes up to 7 (parts that do not divide,
 * empty last parts); an empty result is lo == hi (anywhere). */
START_TEST(shard_range_is_the_owned_part) {
    static const int64_t sizes[] = {1, 5, 13, 24};
    for (int si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); si++)
        for (int world = 1; world <= 7; world++)
            for (int rank = 0; rank < world; rank++) {
                int64_t n = sizes[si], plo, phi;
                ct_comm_shard(n, world, rank, &plo, &phi);
                for (int64_t a = 0; a <= n; a++)
                    for (int64_t b = a; b <= n; b++) {
                        int64_t lo, hi, first = -1, count = 0;
                        ct_comm_shard_range(n, world, rank, a, b, &lo, &hi);
                        for (int64_t e = a; e < b; e++)
                            if (e >= plo && e < phi) {
                                if (first < 0) first = e;
                                count++;
                            }
                        ck_assert_msg(hi - lo == count && (count == 0 || lo == first),
                                      "n %lld world %d rank %d [%lld, %lld): [%lld, %lld), owns %lld from %lld",
                                      (long long)n, world, rank, (long long)a, (long long)b, (long long)lo,
                                      (long long)hi, (long long)count, (long long)first);
                        ck_assert(lo <= hi && (lo == hi || (lo >= a && hi <= b)));
                    }
            }
}
END_TEST

/* ---- the communicator of threads (test/thread_comm.h) that test_partition's ranks use ---- */

enum { TN = 119 };   /* parts of 40, 40, 39 over 3 ranks */

/* Rank r's values of buffer `stream`. */
static void rank_values(float *x, int64_t n, int rank, uint64_t stream) {
    ct_rng g;
    ct_rng_init(&g, 100 + (uint64_t)rank, CT_RNG_AUGMENT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = (float)ct_rng_normal(&g);
}

typedef struct tc_case {
    tcomm_world *w;
} tc_case;

/* Each rank checks its results against sums over every rank's values, which it computes itself. */
static void tc_rank_main(int rank, void *ctx) {
    tc_case *k = ctx;
    int W = k->w->world;
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = tcomm_open(k->w, rank, be);
    ct_err err = {0};
    float mine[TN], other[TN], sum[TN], buf[TN], got[TN];
    rank_values(mine, TN, rank, 1);
    for (int64_t i = 0; i < TN; i++) sum[i] = 0;
    for (int q = 0; q < W; q++) {
        rank_values(other, TN, q, 1);
        for (int64_t i = 0; i < TN; i++) sum[i] += other[i];
    }
    /* all-reduce, blocking and not (the result only at wait: NaN bytes before) */
    memcpy(buf, mine, sizeof buf);
    ck_assert_int_eq(c->all_reduce(c, buf, TN, CT_F32, CT_REDUCE_SUM, &err), CT_OK);
    for (int64_t i = 0; i < TN; i++) ck_assert_float_eq_tol(buf[i], sum[i], 1e-5);
    ct_comm_req *q;
    memcpy(buf, mine, sizeof buf);
    ck_assert_int_eq(c->start_all_reduce(c, buf, TN, CT_F32, CT_REDUCE_SUM, &q, &err), CT_OK);
    ck_assert(isnan(buf[0]) && isnan(buf[TN - 1]));
    ck_assert_int_eq(c->wait(c, q, &err), CT_OK);
    for (int64_t i = 0; i < TN; i++) ck_assert_float_eq_tol(buf[i], sum[i], 1e-5);
    /* ranges that cross parts: the reduce-scatter's share, the gather's whole range */
    int64_t ranges[][2] = {{0, TN}, {3, 50}, {39, 41}, {80, 119}, {10, 11}};
    for (int r = 0; r < 5; r++) {
        int64_t a = ranges[r][0], b = ranges[r][1], lo, hi, plo, phi;
        ct_comm_shard_range(TN, W, rank, a, b, &lo, &hi);
        ct_comm_shard(TN, W, rank, &plo, &phi);
        memset(got, 0, sizeof got);
        ck_assert_int_eq(c->start_reduce_scatter_range(c, got, mine + a, TN, a, b, CT_F32, &q, &err), CT_OK);
        ck_assert_int_eq(c->wait(c, q, &err), CT_OK);
        for (int64_t e = lo; e < hi; e++) ck_assert_float_eq_tol(got[e - lo], sum[e], 1e-5);
        /* every rank's part holds its values of the whole space there */
        float part[TN];
        for (int64_t e = plo; e < phi; e++) {
            rank_values(other, TN, rank, 2);
            part[e - plo] = other[e];
        }
        ck_assert_int_eq(c->all_gather_range(c, got, part, TN, a, b, CT_F32, &err), CT_OK);
        for (int64_t e = a; e < b; e++) {
            int owner = 0;
            for (int o = 0; o < W; o++) {
                int64_t olo, ohi;
                ct_comm_shard(TN, W, o, &olo, &ohi);
                if (e >= olo && e < ohi) owner = o;
            }
            rank_values(other, TN, owner, 2);
            ck_assert_float_eq(got[e - a], other[e]);
        }
    }
    /* host values and the shard collectives */
    double h[2] = {rank + 0.5, -rank};
    ck_assert_int_eq(c->all_reduce_host(c, h, 2, CT_REDUCE_MAX, &err), CT_OK);
    ck_assert(h[0] == W - 0.5 && h[1] == 0);
    memcpy(buf, mine, sizeof buf);
    ck_assert_int_eq(c->reduce_scatter_shards(c, buf, TN, CT_F32, CT_REDUCE_SUM, &err), CT_OK);
    int64_t plo, phi;
    ct_comm_shard(TN, W, rank, &plo, &phi);
    for (int64_t e = plo; e < phi; e++) ck_assert_float_eq_tol(buf[e], sum[e], 1e-5);
    ck_assert_int_eq(c->all_gather_shards(c, buf, TN, CT_F32, &err), CT_OK);
    for (int64_t e = 0; e < TN; e++) ck_assert_float_eq_tol(buf[e], sum[e], 1e-5);
    ck_assert_int_eq(c->barrier(c, &err), CT_OK);
    tcomm_close(c);
    ct_backend_destroy(be);
}

START_TEST(thread_comm_collectives) {
    for (int world = 1; world <= 4; world++) {
        tc_case k = {tcomm_world_create(world)};
        tcomm_run(world, tc_rank_main, &k);
        tcomm_world_free(k.w);
    }
}
END_TEST

/* The leaves of a config, keyed by path, valued by compact JSON; what may differ per rank left out
 * (and only that: a key that merely starts with the same letters stays). */
START_TEST(agree_items) {
    cJSON *doc = cJSON_Parse("{\"lr\": 0.05, \"model\": {\"input\": [13, 2], \"layers\": [{\"out\": 6}, {}]},"
                             " \"opt\": {}, \"train\": {\"run_dir\": \"r\", \"run_dirs\": 1, \"seed\": \"3\","
                             " \"run_dir_x\": {\"a\": true}}}");
    ck_assert_ptr_nonnull(doc);
    static const char *const skip[] = {"train.run_dir"};
    ct_agree_list l = {0};
    ct_agree_add_json(&l, doc, skip, 1);
    static const char *const want[][2] = {
        {"lr", "0.05"}, {"model.input[0]", "13"}, {"model.input[1]", "2"}, {"model.layers[0].out", "6"},
        {"model.layers[1]", "{}"}, {"opt", "{}"}, {"train.run_dirs", "1"}, {"train.seed", "\"3\""},
        {"train.run_dir_x.a", "true"}};
    ck_assert_int_eq(l.n, CT_ARRAY_LEN(want));
    for (int i = 0; i < l.n; i++) {
        ck_assert_str_eq(l.items[i].key, want[i][0]);
        ck_assert_str_eq(l.items[i].value, want[i][1]);
    }
    ct_agree_free(&l);
    cJSON_Delete(doc);
}
END_TEST

/* Random keys and values: the digest of a list is that of the same items in another order, and
 * changes with any one value, key, or where a key ends and its value begins; the first difference
 * is found on either side. */
START_TEST(agree_digest_and_difference) {
    enum { N = 200 };
    ct_rng g;
    ct_rng_init(&g, 11, CT_RNG_AUGMENT, 3);
    ct_agree_list a = {0}, b = {0};
    char key[N][24], val[N][24];
    for (int i = 0; i < N; i++) {
        snprintf(key[i], sizeof key[i], "k%d.%08x", i, (unsigned)(ct_rng_uniform(&g) * 4e9));
        snprintf(val[i], sizeof val[i], "%.9g", ct_rng_normal(&g));
        ct_agree_add(&a, key[i], val[i]);
    }
    for (int i = N - 1; i >= 0; i--) ct_agree_add(&b, key[i], val[i]);   /* the same, reversed */
    int in_ref, in_mine;
    ck_assert_uint_eq(ct_agree_digest(&a), ct_agree_digest(&b));
    ck_assert_uint_lt(ct_agree_digest(&a), 1ull << 52);
    ck_assert(!ct_agree_first_difference(&a, &b, &in_ref, &in_mine));
    /* one value changed in the middle of the reversed list */
    free(b.items[N / 3].value);
    b.items[N / 3].value = ct_xstrdup("0.5");
    ck_assert_uint_ne(ct_agree_digest(&a), ct_agree_digest(&b));
    ck_assert(ct_agree_first_difference(&a, &b, &in_ref, &in_mine));
    ck_assert_str_eq(a.items[in_ref].key, b.items[N / 3].key);
    ck_assert_int_eq(in_mine, N / 3);
    ct_agree_free(&b);
    /* a key missing: found at its place in the reference; a key only mine has: after all of them */
    for (int i = 0; i < N; i++)
        if (i != 150) ct_agree_add(&b, key[i], val[i]);
    ck_assert(ct_agree_first_difference(&a, &b, &in_ref, &in_mine));
    ck_assert(in_ref == 150 && in_mine == -1);
    ck_assert(ct_agree_first_difference(&b, &a, &in_ref, &in_mine));
    ck_assert(in_ref == -1 && in_mine == 150);
    ct_agree_free(&b);
    /* where a key ends and its value begins counts */
    ct_agree_list c = {0}, d = {0};
    ct_agree_add(&c, "ab", "c");
    ct_agree_add(&d, "a", "bc");
    ck_assert_uint_ne(ct_agree_digest(&c), ct_agree_digest(&d));
    ct_agree_free(&a), ct_agree_free(&c), ct_agree_free(&d);
}
END_TEST

/* Text through the host all-reduce, six bytes to a double: every byte value, lengths that are not a
 * multiple of six; over one rank the sum is the identity, so what comes back is what went. */
START_TEST(agree_text) {
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = ct_comm_single(be);
    ct_rng g;
    ct_rng_init(&g, 12, CT_RNG_AUGMENT, 4);
    static const size_t lens[] = {0, 1, 5, 6, 7, 1001};
    for (int k = 0; k < CT_ARRAY_LEN(lens); k++) {
        char text[1002];
        for (size_t i = 0; i < lens[k]; i++) text[i] = (char)(1 + (int)(ct_rng_uniform(&g) * 255) % 255);
        text[lens[k]] = '\0';
        char *out = NULL;
        ct_err err = {0};
        ck_assert_int_eq(ct_agree_send_text(c, 0, text, lens[k], &out, &err), CT_OK);
        ck_assert_uint_eq(strlen(out), lens[k]);
        ck_assert_mem_eq(out, text, lens[k]);
        free(out);
    }
    /* one rank agrees with itself */
    ct_agree_list l = {0};
    ct_agree_add(&l, "lr", "0.05");
    ct_err err = {0};
    ck_assert_int_eq(ct_comm_agree(c, &l, &err), CT_OK);
    ct_agree_free(&l);
    ct_comm_destroy(c);
    ct_backend_destroy(be);
}
END_TEST

/* The watchdogs' decision: a call past the timeout ends the rank; a stop signal that came while the
 * rank was already waiting ends it once the timeout has passed since the signal (60 s when waits are
 * unbounded); a stop that came before the call began, or no call, never does. */
START_TEST(watchdog_decision) {
    static const struct {
        int timeout;
        double waited, stop_age;
        bool due;
    } cases[] = {
        {3, 2.9, -1, false}, {3, 3.0, -1, true}, {3, -1, 100, false}, {0, 1e6, -1, false},
        {3, 1.0, 2.9, false}, {3, 1.0, 3.0, true}, {0, 1e6, 59.5, false}, {0, 1e6, 60.0, true},
        {0, 0.1, 61, true},
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++)
        ck_assert_msg(ct_watchdog_due(cases[i].timeout, cases[i].waited, cases[i].stop_age) == cases[i].due,
                      "case %d", i);
    /* the stop flag as a watchdog follows it */
    volatile int flag = 0;
    ct_stop_follow s = {.flag = &flag};
    ck_assert(ct_watchdog_stop_age(&s, 10.0, 5.0) < 0);           /* no signal */
    flag = SIGTERM;
    ck_assert(ct_watchdog_stop_age(&s, 10.0, 5.0) == 0.0);        /* seen now, in a call since 5 */
    ck_assert(ct_watchdog_stop_age(&s, 12.5, 5.0) == 2.5);
    ck_assert(ct_watchdog_stop_age(&s, 12.5, 11.0) < 0);          /* the call began after it: moving */
    ck_assert_int_eq(s.sig, SIGTERM);
    ct_stop_follow none = {.flag = NULL};
    ck_assert(ct_watchdog_stop_age(&none, 10.0, 5.0) < 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("single");
    tcase_add_test(tc, one_rank);
    tcase_add_test(tc, partition);
    tcase_add_test(tc, shard_range_is_the_owned_part);
    tcase_add_test(tc, thread_comm_collectives);
    tcase_add_test(tc, agree_items);
    tcase_add_test(tc, agree_digest_and_difference);
    tcase_add_test(tc, agree_text);
    tcase_add_test(tc, watchdog_decision);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

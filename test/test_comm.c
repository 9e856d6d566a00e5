/* test_comm.c: the single-process communicator (core/dist/comm.h). Over one rank a reduction is
 * the identity and a scatter or gather a copy; the table is the one MPI and NCCL will fill, so
 * its contract is checked here: in place where the header says so, copies where it does not, and
 * an error for a root that does not exist. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "core/dist/comm.h"
#include "core/util/rng.h"

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

int main(void) {
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("single");
    tcase_add_test(tc, one_rank);
    tcase_add_test(tc, partition);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

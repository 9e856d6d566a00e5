/* test_comm_mpi.c: the MPI communicator (core/dist/comm_mpi.c, build/libctrain_mpi.so) against
 * sums computed here. Run without mpirun, it runs itself under `mpirun -np 3` (and fails when mpirun
 * is not installed: `make deps` installs it); each rank fills its buffers from Philox keyed by its rank, so every rank can
 * compute every other rank's values and hence the exact result of each collective. Three ranks, and
 * a partition of 119 elements (parts 40, 40, 39), so nothing divides evenly. Checked: all-reduce
 * (sum and max, fp32 and int32), reduce-scatter and all-gather of equal parts (in place and not;
 * bf16 moves bit for bit), broadcast from rank 1 and a root that does not exist, the shard
 * collectives over the ZeRO partition, ZeRO-2/3's range gather and reduce-scatter (blocking and
 * non-blocking, several in flight), the host
 * all-reduce, barrier, and the refusal of an fp16 reduction; and the ranks' check that they were
 * started alike (agree.h): the same items (in any order) agree, and a value that differs on one
 * rank, or a key that one rank lacks, stops every rank naming the ranks and the first key, with a
 * list long enough to take several thousand doubles. Not a Check suite: Check's forked tests and
 * MPI do not mix. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cpu/cpu.h"
#include "core/dist/agree.h"
#include "core/dist/comm.h"
#include "core/dist/launch.h"
#include "core/util/rng.h"

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* Rank r's values of buffer `stream`: n floats. */
static void fill(float *x, int64_t n, int rank, uint64_t stream) {
    ct_rng g;
    ct_rng_init(&g, 1000 + (uint64_t)rank, CT_RNG_AUGMENT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = (float)ct_rng_normal(&g);
}

/* The sum over ranks of element i, added in rank order as MPI's reduction is not bound to: compared
 * with a tolerance of a few ulps. */
static void sum_over(float *out, int64_t n, int world, uint64_t stream) {
    float *tmp = malloc((size_t)n * sizeof *tmp);
    memset(out, 0, (size_t)n * sizeof *out);
    for (int r = 0; r < world; r++) {
        fill(tmp, n, r, stream);
        for (int64_t i = 0; i < n; i++) out[i] += tmp[i];
    }
    free(tmp);
}

static bool close_to(float a, float b) { return fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)); }

static void check_all_reduce(ct_comm *c) {
    enum { N = 1000 };
    float x[N], want[N];
    ct_err err = {0};
    fill(x, N, c->rank, 1);
    sum_over(want, N, c->world, 1);
    EXPECT(c->all_reduce(c, x, N, CT_F32, CT_REDUCE_SUM, &err) == CT_OK, "all_reduce: %s", err.msg);
    for (int i = 0; i < N; i++) EXPECT(close_to(x[i], want[i]), "all_reduce sum [%d]: %g, want %g", i, x[i], want[i]);
    int32_t k[3] = {c->rank, -c->rank, 7};
    EXPECT(c->all_reduce(c, k, 3, CT_I32, CT_REDUCE_MAX, &err) == CT_OK, "all_reduce i32: %s", err.msg);
    EXPECT(k[0] == c->world - 1 && k[1] == 0 && k[2] == 7, "all_reduce max i32: %d %d %d", k[0], k[1], k[2]);
    uint16_t h[4] = {0};
    EXPECT(c->all_reduce(c, h, 4, CT_F16, CT_REDUCE_SUM, &err) == CT_ERR_RUNTIME && strstr(err.msg, "fp16"),
           "an fp16 reduction is refused naming the dtype: %s", err.msg);
}

static void check_equal_parts(ct_comm *c) {
    enum { P = 50 };   /* per rank */
    int64_t n = (int64_t)P * c->world;
    float *src = malloc((size_t)n * sizeof *src), *want = malloc((size_t)n * sizeof *want), dst[P];
    ct_err err = {0};
    fill(src, n, c->rank, 2);
    sum_over(want, n, c->world, 2);
    EXPECT(c->reduce_scatter(c, dst, src, P, CT_F32, CT_REDUCE_SUM, &err) == CT_OK, "reduce_scatter: %s", err.msg);
    for (int i = 0; i < P; i++)
        EXPECT(close_to(dst[i], want[c->rank * P + i]), "reduce_scatter [%d]: %g, want %g", i, dst[i],
               want[c->rank * P + i]);
    /* all-gather, not in place (bf16: bits move unchanged), then in place (fp32) */
    uint16_t mine[P], *all = calloc((size_t)n, sizeof *all);
    for (int i = 0; i < P; i++) mine[i] = (uint16_t)(c->rank * 1000 + i);
    EXPECT(c->all_gather(c, all, mine, P, CT_BF16, &err) == CT_OK, "all_gather: %s", err.msg);
    for (int r = 0; r < c->world; r++)
        for (int i = 0; i < P; i++) EXPECT(all[r * P + i] == r * 1000 + i, "all_gather bf16 [%d][%d]: %u", r, i, all[r * P + i]);
    float *g = calloc((size_t)n, sizeof *g);
    fill(g + c->rank * P, P, c->rank, 3);
    EXPECT(c->all_gather(c, g, g + c->rank * P, P, CT_F32, &err) == CT_OK, "all_gather in place: %s", err.msg);
    for (int r = 0; r < c->world; r++) {
        fill(dst, P, r, 3);
        EXPECT(memcmp(g + r * P, dst, sizeof dst) == 0, "all_gather in place: rank %d's part differs", r);
    }
    free(src), free(want), free(all), free(g);
}

static void check_broadcast(ct_comm *c) {
    enum { N = 77 };
    float x[N], want[N];
    ct_err err = {0};
    fill(x, N, c->rank, 4);
    fill(want, N, 1, 4);
    EXPECT(c->broadcast(c, x, N, CT_F32, 1, &err) == CT_OK, "broadcast: %s", err.msg);
    EXPECT(memcmp(x, want, sizeof x) == 0, "broadcast from rank 1: values differ");
    EXPECT(c->broadcast(c, x, N, CT_F32, c->world, &err) == CT_ERR_RUNTIME && strstr(err.msg, "rank 3"),
           "broadcast from a rank that does not exist: %s", err.msg);
}

/* The ZeRO partition of 119 elements: reduce-scatter into each part, then gather the parts. */
static void check_shards(ct_comm *c) {
    enum { N = 119 };
    float x[N], want[N];
    ct_err err = {0};
    int64_t lo, hi;
    ct_comm_shard(N, c->world, c->rank, &lo, &hi);
    fill(x, N, c->rank, 5);
    sum_over(want, N, c->world, 5);
    EXPECT(c->reduce_scatter_shards(c, x, N, CT_F32, CT_REDUCE_SUM, &err) == CT_OK, "reduce_scatter_shards: %s", err.msg);
    for (int64_t i = lo; i < hi; i++)
        EXPECT(close_to(x[i], want[i]), "reduce_scatter_shards [%lld]: %g, want %g", (long long)i, x[i], want[i]);
    /* every rank now gathers the others' sums: all of want */
    EXPECT(c->all_gather_shards(c, x, N, CT_F32, &err) == CT_OK, "all_gather_shards: %s", err.msg);
    for (int i = 0; i < N; i++) EXPECT(close_to(x[i], want[i]), "all_gather_shards [%d]: %g, want %g", i, x[i], want[i]);
    /* 16-bit parts move bit for bit */
    uint16_t h[N];
    for (int i = 0; i < N; i++) h[i] = i >= lo && i < hi ? (uint16_t)(i * 3 + 1) : 0xffff;
    EXPECT(c->all_gather_shards(c, h, N, CT_F16, &err) == CT_OK, "all_gather_shards f16: %s", err.msg);
    for (int i = 0; i < N; i++) EXPECT(h[i] == i * 3 + 1, "all_gather_shards f16 [%d]: %u", i, h[i]);
}

/* ZeRO-3's range collectives over the same partition (parts [0,40) [40,80) [80,119)): ranges
 * inside one part, across two and three parts, and an empty share. */
static void check_ranges(ct_comm *c) {
    enum { N = 119 };
    static const int64_t ranges[][2] = {{3, 17}, {35, 45}, {0, 119}, {70, 119}, {100, 101}};
    float part[N], src[N], dst[N + 1], want[N];   /* dst: one more, to see a write past the end */
    ct_err err = {0};
    int64_t plo, phi;
    ct_comm_shard(N, c->world, c->rank, &plo, &phi);
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        int64_t a = ranges[k][0], b = ranges[k][1], lo, hi;
        /* gather: element i is i * 0.5 + 1 in whichever rank owns it */
        for (int64_t i = plo; i < phi; i++) part[i - plo] = (float)i * 0.5f + 1.0f;
        for (int64_t i = 0; i <= N; i++) dst[i] = -7.0f;
        EXPECT(c->all_gather_range(c, dst, part, N, a, b, CT_F32, &err) == CT_OK, "all_gather_range: %s", err.msg);
        for (int64_t i = a; i < b; i++)
            EXPECT(dst[i - a] == (float)i * 0.5f + 1.0f, "all_gather_range [%lld, %lld) at %lld: %g", (long long)a,
                   (long long)b, (long long)i, dst[i - a]);
        EXPECT(dst[b - a] == -7.0f, "all_gather_range [%lld, %lld) wrote past its end", (long long)a, (long long)b);
        /* reduce-scatter: each rank's random [a, b), the sums of this rank's share */
        fill(src, b - a, c->rank, 20 + k);
        sum_over(want, b - a, c->world, 20 + k);
        ct_comm_shard_range(N, c->world, c->rank, a, b, &lo, &hi);
        for (int64_t i = 0; i <= N; i++) dst[i] = -7.0f;
        EXPECT(c->reduce_scatter_range(c, dst, src, N, a, b, CT_F32, &err) == CT_OK, "reduce_scatter_range: %s",
               err.msg);
        for (int64_t i = lo; i < hi; i++)
            EXPECT(close_to(dst[i - lo], want[i - a]), "reduce_scatter_range [%lld, %lld) at %lld: %g, want %g",
                   (long long)a, (long long)b, (long long)i, dst[i - lo], want[i - a]);
        EXPECT(dst[hi - lo] == -7.0f, "reduce_scatter_range [%lld, %lld) wrote past this rank's share",
               (long long)a, (long long)b);
    }
    /* in place: each rank's part already at its place in the whole buffer, gathered in 3 pieces */
    float whole[N];
    for (int64_t i = 0; i < N; i++) whole[i] = i >= plo && i < phi ? (float)i - 0.5f : -7.0f;
    for (int64_t a = 0; a < N; a += 50) {
        int64_t b = a + 50 < N ? a + 50 : N;
        EXPECT(c->all_gather_range(c, whole + a, whole + plo, N, a, b, CT_F32, &err) == CT_OK,
               "all_gather_range in place [%lld, %lld): %s", (long long)a, (long long)b, err.msg);
    }
    for (int i = 0; i < N; i++) EXPECT(whole[i] == (float)i - 0.5f, "all_gather_range in place at %d: %g", i, whole[i]);
    /* 16-bit parameters move bit for bit */
    uint16_t h[N], hp[N];
    for (int64_t i = plo; i < phi; i++) hp[i - plo] = (uint16_t)(i * 5 + 2);
    EXPECT(c->all_gather_range(c, h, hp, N, 30, 90, CT_BF16, &err) == CT_OK, "all_gather_range bf16: %s", err.msg);
    for (int i = 30; i < 90; i++) EXPECT(h[i - 30] == i * 5 + 2, "all_gather_range bf16 [%d]: %u", i, h[i - 30]);
}

/* The non-blocking forms: several in flight at once (an all-reduce, a range reduce-scatter and a
 * range gather over the 119-element partition), tested until done in one order and waited for in
 * another; each result equal to its blocking form's up to the order of the additions (OpenMPI's
 * non-blocking algorithms are other ones), the gather bit for bit. */
static void check_non_blocking(ct_comm *c) {
    enum { N = 119, M = 5000 };
    float *x = malloc(M * sizeof *x), *want = malloc(M * sizeof *want), src[N], dst[N + 1], sums[N];
    float part[N], gathered[N + 1];
    ct_err err = {0};
    int64_t plo, phi, lo, hi;
    ct_comm_shard(N, c->world, c->rank, &plo, &phi);
    ct_comm_shard_range(N, c->world, c->rank, 10, 100, &lo, &hi);
    fill(x, M, c->rank, 30);
    sum_over(want, M, c->world, 30);
    fill(src, 90, c->rank, 31);
    sum_over(sums, 90, c->world, 31);
    for (int64_t i = plo; i < phi; i++) part[i - plo] = (float)i * 0.25f - 3.0f;
    for (int i = 0; i <= N; i++) dst[i] = gathered[i] = -7.0f;
    ct_comm_req *q[3] = {0};
    EXPECT(c->start_all_reduce(c, x, M, CT_F32, CT_REDUCE_SUM, &q[0], &err) == CT_OK, "start_all_reduce: %s", err.msg);
    EXPECT(c->start_reduce_scatter_range(c, dst, src, N, 10, 100, CT_F32, &q[1], &err) == CT_OK,
           "start_reduce_scatter_range: %s", err.msg);
    EXPECT(c->start_all_gather_range(c, gathered, part, N, 5, 117, CT_F32, &q[2], &err) == CT_OK,
           "start_all_gather_range: %s", err.msg);
    EXPECT(q[0] && q[1] && q[2], "a request for each collective started on %d ranks", c->world);
    bool done = false;
    for (int spins = 0; !done && spins < 1000000; spins++)
        EXPECT(c->test(c, q[1], &done, &err) == CT_OK, "test: %s", err.msg);
    EXPECT(done, "the reduce-scatter completes under test alone");
    for (int k = 2; k >= 0; k--) EXPECT(c->wait(c, q[k], &err) == CT_OK, "wait %d: %s", k, err.msg);
    for (int i = 0; i < M; i++) EXPECT(close_to(x[i], want[i]), "start_all_reduce [%d]: %g, want %g", i, x[i], want[i]);
    for (int64_t i = lo; i < hi; i++)
        EXPECT(close_to(dst[i - lo], sums[i - 10]), "start_reduce_scatter_range at %lld: %g, want %g", (long long)i,
               dst[i - lo], sums[i - 10]);
    EXPECT(dst[hi - lo] == -7.0f, "start_reduce_scatter_range wrote past this rank's share");
    for (int i = 5; i < 117; i++)
        EXPECT(gathered[i - 5] == (float)i * 0.25f - 3.0f, "start_all_gather_range at %d: %g", i, gathered[i - 5]);
    EXPECT(gathered[112] == -7.0f, "start_all_gather_range wrote past its end");
    /* every rank gets the same bits from a non-blocking sum: the ranks' weights stay equal */
    double h = 0;
    for (int i = 0; i < M; i++) h += (double)x[i] * (double)(i + 1);
    double lo_h = h, hi_h = h;
    EXPECT(c->all_reduce_host(c, &lo_h, 1, CT_REDUCE_MAX, &err) == CT_OK && (hi_h = -h,
           c->all_reduce_host(c, &hi_h, 1, CT_REDUCE_MAX, &err) == CT_OK), "all_reduce_host: %s", err.msg);
    EXPECT(lo_h == h && -hi_h == h, "the non-blocking all-reduce gave the ranks different sums");
    uint16_t hbits[4] = {0};
    EXPECT(c->start_all_reduce(c, hbits, 4, CT_F16, CT_REDUCE_SUM, &q[0], &err) == CT_ERR_RUNTIME &&
           strstr(err.msg, "fp16") && !q[0], "an fp16 non-blocking reduction is refused naming the dtype: %s", err.msg);
    free(x), free(want);
}

static void check_host(ct_comm *c) {
    double v[2] = {c->rank + 0.5, -c->rank};
    ct_err err = {0};
    EXPECT(c->all_reduce_host(c, v, 2, CT_REDUCE_SUM, &err) == CT_OK, "all_reduce_host: %s", err.msg);
    double s = 0;
    for (int r = 0; r < c->world; r++) s += r;
    EXPECT(v[0] == s + 0.5 * c->world && v[1] == -s, "all_reduce_host: %g %g", v[0], v[1]);
    EXPECT(c->barrier(c, &err) == CT_OK, "barrier: %s", err.msg);
}

/* A config-like list of n random items, the same on every rank (drawn from one stream). */
static void agree_list(ct_agree_list *l, int n) {
    ct_rng g;
    ct_rng_init(&g, 77, CT_RNG_AUGMENT, 9);
    for (int i = 0; i < n; i++) {
        char key[48], val[32];
        snprintf(key, sizeof key, "section%d.key%08x", i % 7, (unsigned)(ct_rng_uniform(&g) * 4e9));
        snprintf(val, sizeof val, "%.9g", ct_rng_normal(&g));
        ct_agree_add(l, key, val);
    }
}

/* ct_comm_agree on every rank with lists that rank `who` changes by `change` (none: -1). */
static int agree_with(ct_comm *c, int n, int who, void (*change)(ct_agree_list *), ct_err *err) {
    ct_agree_list l = {0};
    agree_list(&l, n);
    if (c->rank == who) change(&l);
    int rc = ct_comm_agree(c, &l, err);
    ct_agree_free(&l);
    return rc;
}

static void set_lr(ct_agree_list *l) {
    free(l->items[5].key), free(l->items[5].value);
    l->items[5].key = ct_xstrdup("optimizer.params.lr");
    l->items[5].value = ct_xstrdup("0.1");
}
static void set_lr_ref(ct_agree_list *l) {   /* everyone's item 5, as the ranks that agree have it */
    free(l->items[5].key), free(l->items[5].value);
    l->items[5].key = ct_xstrdup("optimizer.params.lr");
    l->items[5].value = ct_xstrdup("0.05");
}
static void reverse(ct_agree_list *l) {
    for (int i = 0, j = l->n - 1; i < j; i++, j--) {
        ct_agree_item t = l->items[i];
        l->items[i] = l->items[j], l->items[j] = t;
    }
}
static void drop_last(ct_agree_list *l) {
    l->n--;
    free(l->items[l->n].key), free(l->items[l->n].value);
}
static void change_last(ct_agree_list *l) {
    free(l->items[l->n - 1].value);
    l->items[l->n - 1].value = ct_xstrdup("\"another\"");
}

static void check_agree(ct_comm *c) {
    ct_err err = {0};
    /* the same items agree, in any order (rank 1 lists them backwards) */
    EXPECT(agree_with(c, 300, -1, NULL, &err) == CT_OK, "the same lists: %s", err.msg);
    EXPECT(agree_with(c, 300, 1, reverse, &err) == CT_OK, "the same items in another order: %s", err.msg);
    /* rank 2 was given another lr: every rank stops; rank 0 and rank 2 say which key and values */
    ct_agree_list l = {0};
    agree_list(&l, 300);
    set_lr_ref(&l);
    if (c->rank == 2) set_lr(&l);
    int rc = ct_comm_agree(c, &l, &err);
    ct_agree_free(&l);
    EXPECT(rc == CT_ERR_CONFIG, "another lr on rank 2: status %d", rc);
    if (c->rank != 1)
        EXPECT(strstr(err.msg, "ranks 0 and 2 were started with different configs or data: optimizer.params.lr is "
                      "0.05 on rank 0 and 0.1 on rank 2"), "rank %d: %s", c->rank, err.msg);
    else
        EXPECT(strstr(err.msg, "rank 1 of 3: stopped before training: rank 2 was started with another config"),
               "rank 1: %s", err.msg);
    /* a list of 4000 items (~200 KB of text to send) whose last value differs on rank 1, and whose
     * last key rank 2 lacks: rank 1 is the first that differs; both are named */
    rc = agree_with(c, 4000, 1, change_last, &err);
    EXPECT(rc == CT_ERR_CONFIG, "another last value on rank 1: status %d", rc);
    if (c->rank != 2)
        EXPECT(strstr(err.msg, "and \"another\" on rank 1 (the first key that differs)"), "rank %d: %s", c->rank,
               err.msg);
    else
        EXPECT(strstr(err.msg, "rank 1 was started with another config or data than rank 0"), "rank 2: %s", err.msg);
    ct_agree_list a = {0};
    agree_list(&a, 4000);
    if (c->rank == 1) change_last(&a);
    if (c->rank == 2) drop_last(&a);
    rc = ct_comm_agree(c, &a, &err);
    char want[200];
    snprintf(want, sizeof want, "%s is", a.n ? a.items[3999 < a.n ? 3999 : 0].key : "?");
    ct_agree_free(&a);
    EXPECT(rc == CT_ERR_CONFIG && strstr(err.msg, "ranks 1 and 2 differ from rank 0"), "rank %d: %s", c->rank,
           err.msg);
    if (c->rank == 0) EXPECT(strstr(err.msg, want), "rank 0 names the last key (%s): %s", want, err.msg);
}

/* Not a rank yet: run this program as 3 ranks. */
static int launch_self(const char *self) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        /* a failure, not a skip: `make deps` installs it (openmpi-bin) */
        printf("FAIL missing dependency: mpirun (Debian's openmpi-bin); make deps installs it\n");
        return 1;
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np 3 '%s'", self);
    int st = system(cmd);
    return st == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (!getenv("OMPI_COMM_WORLD_SIZE")) return launch_self(argv[0]);
    ct_launch l;
    ct_err err = {0};
    if (ct_launch_from_env(&l, &err)) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    ct_backend *be = ct_cpu_backend_create(1);
    ct_comm *c = NULL;
    if (ct_comm_open(be, &l, &c, &err)) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    EXPECT(!strcmp(c->name, "mpi") && c->world == 3 && c->rank == l.rank, "%s rank %d of %d", c->name, c->rank, c->world);
    check_all_reduce(c);
    check_equal_parts(c);
    check_broadcast(c);
    check_shards(c);
    check_ranges(c);
    check_non_blocking(c);
    check_host(c);
    check_agree(c);
    if (c->rank == 0) printf("%s: %d failure(s) on rank 0\n", argv[0], failures);
    c->failed = failures > 0;   /* a failing rank leaves at once; mpirun ends the rest */
    ct_comm_destroy(c);
    ct_backend_destroy(be);
    return failures ? 1 : 0;
}

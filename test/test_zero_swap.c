/* test_zero_swap.c: the NVMe swap engine (core/zero/aio.h) and the swapper of fp32 arrays
 * (core/zero/swap.h).
 *
 * Data: random arrays round-trip bit for bit through the files for sizes that are not multiples
 * of the block, the chunk or the alignment, with every buffer count; the CPU backend's Adam over
 * the swapped chunks equals the same steps over whole in-memory arrays bit for bit; a checkpoint
 * streamed out of a swap and back in, and a kill -9 in the middle of a step followed by a resume
 * from the checkpoint, give the bytes of an uninterrupted run; a fuzz of random sizes, buffer
 * counts, budgets, masks and passes against an in-memory shadow.
 * The pipeline: with injected (delayed, gated) system calls, the read of chunk i+1 starts while the
 * caller holds chunk i and the write of chunk i-1 is still running when chunk i is handed out
 * (the test would hang at a gate, then fail, if either waited); one buffer overlaps nothing; the
 * host memory stays inside the budget.
 * Errors: a full file system (tmpfs of 256 KiB where mounting is allowed, ulimit -f everywhere),
 * ENOSPC and EIO in the middle of a pass, a file truncated underneath, a path that is missing, not
 * a directory or read-only, a budget too small, the cancel flag, a file system refusing O_DIRECT:
 * each a status naming the file (and the offset and operation for I/O). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/util/fs.h"
#include "core/util/rng.h"
#include "core/zero/aio.h"
#include "core/zero/swap.h"

static char tmpdir[256];
static bool direct_ok; /* tmpdir's file system takes O_DIRECT (not tmpfs before Linux 6.6) */

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_swap_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char p[300];
    snprintf(p, sizeof p, "%s/probe", tmpdir);
    int fd = open(p, O_RDWR | O_CREAT | O_DIRECT, 0600);
    direct_ok = fd >= 0;
    if (fd >= 0) close(fd);
    unlink(p);
}
static void teardown(void) { ck_assert_int_eq(ct_fs_remove_tree(tmpdir), 0); }

static const char *const NAMES[] = {"master", "exp_avg", "exp_avg_sq", "extra0", "extra1"};

/* n normal floats of stream `stream` (never all zeros; v-like arrays take the absolute value). */
static float *rnd(int64_t n, uint64_t stream, bool positive) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    ct_rng r;
    ct_rng_init(&r, 7, CT_RNG_INIT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = positive ? fabsf(ct_rng_normal(&r)) * 1e-3f : ct_rng_normal(&r);
    return x;
}

static ct_swap_opts opts(int k, int64_t n, int buffers, size_t budget) {
    ct_swap_opts o = {.nvme_path = tmpdir, .tag = "test", .n_arrays = k, .names = NAMES, .n = n,
                      .buffer_count = buffers, .host_bytes = budget, .aio = ct_aio_defaults()};
    o.aio.queue_depth = 4;
    return o;
}

/* The budget that gives chunks of `chunk` elements. */
static size_t budget_for(int k, int buffers, int64_t chunk) {
    return (size_t)k * (size_t)buffers * (size_t)chunk * 4 + CT_AIO_ALIGN;
}

static int count_entries(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* Run fn(arg) in a child process (mount namespaces, rlimits and kill -9 stay there): its exit
 * status, 77 when it could not set up what it needed. */
static int in_child(int (*fn)(void *), void *arg) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) _exit(fn(arg));
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define CHILD_CHECK(cond, ...)                                                                                 \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fprintf(stderr, "\n");                                                                             \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Injected system calls: delays, gates, faults, and a log of what ran when                    */

typedef struct io_event {
    bool write;
    int fd;
    int64_t off;
    size_t len;
    double t0, t1;               /* t1 = 0: still running */
} io_event;

typedef struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int delay_us;                /* every pread/pwrite sleeps this long */
    bool refuse_direct;          /* open with O_DIRECT: -EINVAL (tmpfs before Linux 6.6) */
    int fail_errno;              /* the fail_at-th pwrite (or pread with fail_reads) fails with it */
    int fail_at, calls;
    bool fail_reads;
    bool gate_writes_at_zero;    /* a pwrite at offset 0 waits for gate_open (at most 5 s) */
    bool gate_open, gate_timed_out;
    bool hold_reads;             /* every pread waits for reads_released (at most 10 s) */
    bool reads_released;
    io_event ev[8192];
    int n_ev;
    int running, max_running;
} fake;

static double now_s(void) { return ct_now(); }

static void fake_init(fake *f) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
}

static void fake_free(fake *f) {
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
}

static int fake_open(void *ctx, const char *path, int flags, int mode) {
    fake *f = ctx;
    if (f->refuse_direct && (flags & O_DIRECT)) return -EINVAL;
    int fd = open(path, flags, mode);
    return fd < 0 ? -errno : fd;
}

/* Wait on the fake's condition until *flag or `secs` pass; false on timeout. */
static bool wait_flag(fake *f, const bool *flag, double secs) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += (time_t)secs;
    while (!*flag)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &t) == ETIMEDOUT) return *flag;
    return true;
}

static ssize_t fake_io(fake *f, bool write, int fd, void *buf, size_t n, int64_t off) {
    pthread_mutex_lock(&f->mu);
    int e = f->n_ev < 8192 ? f->n_ev++ : 8191;
    f->ev[e] = (io_event){write, fd, off, n, now_s(), 0};
    if (++f->running > f->max_running) f->max_running = f->running;
    bool fail = f->fail_errno && write != f->fail_reads && ++f->calls == f->fail_at;
    pthread_cond_broadcast(&f->cv);
    if (write && off == 0 && f->gate_writes_at_zero && !wait_flag(f, &f->gate_open, 5)) f->gate_timed_out = true;
    if (!write && f->hold_reads) wait_flag(f, &f->reads_released, 10);
    int delay = f->delay_us;
    pthread_mutex_unlock(&f->mu);
    if (delay) usleep((useconds_t)delay);
    ssize_t r = fail ? -f->fail_errno : write ? pwrite(fd, buf, n, off) : pread(fd, buf, n, off);
    if (r < 0 && !fail) r = -errno;
    pthread_mutex_lock(&f->mu);
    f->ev[e].t1 = now_s();
    f->running--;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return r;
}

static ssize_t fake_pread(void *ctx, int fd, void *buf, size_t n, int64_t off) {
    return fake_io(ctx, false, fd, buf, n, off);
}
static ssize_t fake_pwrite(void *ctx, int fd, const void *buf, size_t n, int64_t off) {
    return fake_io(ctx, true, fd, (void *)buf, n, off);
}

static ct_aio_sys fake_sys(fake *f) { return (ct_aio_sys){fake_open, fake_pread, fake_pwrite, f}; }

/* Has a read (write) at byte offset off started (finished)? */
static bool seen(fake *f, bool write, int64_t off, bool finished) {
    pthread_mutex_lock(&f->mu);
    bool s = false;
    for (int i = 0; i < f->n_ev && !s; i++)
        s = f->ev[i].write == write && f->ev[i].off == off && (!finished || f->ev[i].t1 > 0);
    pthread_mutex_unlock(&f->mu);
    return s;
}

/* Wait up to 5 s for a read (write) at off to start. */
static bool starts(fake *f, bool write, int64_t off) {
    for (int i = 0; i < 500; i++) {
        if (seen(f, write, off, false)) return true;
        usleep(10000);
    }
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* The engine                                                                                  */

START_TEST(aio_round_trip_pieces) {
    /* lengths of 1..9 blocks with block sizes of 1, 3 and 4 blocks: pieces that do not divide the
     * job, jobs shorter than a piece */
    const size_t blocks[] = {CT_AIO_ALIGN, 3 * CT_AIO_ALIGN, 4 * CT_AIO_ALIGN};
    for (int b = 0; b < 3; b++) {
        ct_aio_opts o = ct_aio_defaults();
        o.block_size = blocks[b];
        o.queue_depth = 3;
        o.threads = 2;
        ct_aio *a;
        ct_err err = {0};
        ck_assert_int_eq(ct_aio_create(&o, &a, &err), CT_OK);
        ck_assert_int_eq(ct_aio_workers(a), 6);
        char path[512];
        snprintf(path, sizeof path, "%s/a%d", tmpdir, b);
        const int64_t size = 64 * CT_AIO_ALIGN;
        ct_aio_file f;
        ck_assert_int_eq(ct_aio_create_file(a, path, size, &f, &err), CT_OK);
        ck_assert(f.direct == direct_ok);
        char *src = ct_aio_alloc((size_t)size), *dst = ct_aio_alloc((size_t)size);
        ct_rng r;
        ct_rng_init(&r, 1, CT_RNG_INIT, (uint64_t)b);
        for (int64_t i = 0; i < size; i++) src[i] = (char)ct_rng_u32(&r);
        memset(dst, 0x5a, (size_t)size);
        ct_aio_job w[9], rd[9];
        int64_t off = 0;
        for (int j = 0; j < 9; j++) { /* 1 + 2 + ... + 9 = 45 blocks, all queued before any wait */
            ct_aio_write(a, &w[j], &f, src + off, (size_t)(j + 1) * CT_AIO_ALIGN, off, NULL);
            off += (j + 1) * CT_AIO_ALIGN;
        }
        for (int j = 0; j < 9; j++) ck_assert_int_eq(ct_aio_wait(a, &w[j], &err), CT_OK);
        off = 0;
        for (int j = 0; j < 9; j++) {
            ct_aio_read(a, &rd[j], &f, dst + off, (size_t)(j + 1) * CT_AIO_ALIGN, off, NULL);
            off += (j + 1) * CT_AIO_ALIGN;
        }
        for (int j = 0; j < 9; j++) ck_assert_int_eq(ct_aio_wait(a, &rd[j], &err), CT_OK);
        ck_assert(!memcmp(src, dst, (size_t)off));
        ct_aio_counts c = ct_aio_stats(a);
        ck_assert_int_eq(c.bytes_written, off);
        ck_assert_int_eq(c.bytes_read, off);
        ck_assert_int_le(c.max_in_flight, 6);
        ct_aio_job z;
        ct_aio_read(a, &z, &f, dst, 0, 0, NULL); /* nothing to do: done at once */
        ck_assert(ct_aio_done(a, &z));
        ck_assert_int_eq(ct_aio_close_file(&f, true, &err), CT_OK);
        ck_assert(!ct_fs_exists(path));
        ct_aio_release(src);
        ct_aio_release(dst);
        ct_aio_free(a);
    }
}
END_TEST

START_TEST(aio_options_refused) {
    ct_aio *a;
    ct_err err = {0};
    ct_aio_opts o = ct_aio_defaults();
    o.block_size = 1000;
    ck_assert_int_eq(ct_aio_create(&o, &a, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "aio.block_size: expected a positive multiple of 4096 bytes"), "%s", err.msg);
    o = ct_aio_defaults();
    o.queue_depth = 0;
    ck_assert_int_eq(ct_aio_create(&o, &a, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "aio.queue_depth"), "%s", err.msg);
    o = ct_aio_defaults();
    o.threads = 0;
    ck_assert_int_eq(ct_aio_create(&o, &a, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "aio.intra_op_parallelism"), "%s", err.msg);
    /* the config's aio section: intra_op_parallelism x queue_depth workers */
    ct_aio_cfg c = {.block_size = 262144, .queue_depth = 3, .intra_op_parallelism = 2, .overlap_events = true};
    o = ct_aio_from_config(&c);
    ck_assert_uint_eq(o.block_size, 262144);
    ck_assert_int_eq(ct_aio_create(&o, &a, &err), CT_OK);
    ck_assert_int_eq(ct_aio_workers(a), 6);
    ct_aio_free(a);
}
END_TEST

START_TEST(aio_short_read_names_file) {
    ct_aio_opts o = ct_aio_defaults();
    ct_aio *a;
    ct_err err = {0};
    ck_assert_int_eq(ct_aio_create(&o, &a, &err), CT_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/short", tmpdir);
    ct_aio_file f;
    ck_assert_int_eq(ct_aio_create_file(a, path, 4 * CT_AIO_ALIGN, &f, &err), CT_OK);
    ck_assert_int_eq(truncate(path, CT_AIO_ALIGN), 0);
    ck_assert_int_eq(ct_aio_check_file(&f, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "is 4096 bytes, expected 16384") &&
                  strstr(err.msg, "truncated while in use"), "%s", err.msg);
    char *buf = ct_aio_alloc(4 * CT_AIO_ALIGN);
    ct_aio_job j;
    ct_aio_read(a, &j, &f, buf, 4 * CT_AIO_ALIGN, 0, NULL);
    ck_assert_int_eq(ct_aio_wait(a, &j, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "read of 16384 bytes at offset 0 found only 4096") &&
                  strstr(err.msg, "shorter than expected"), "%s", err.msg);
    ct_aio_release(buf);
    ct_aio_close_file(&f, true, NULL);
    ct_aio_free(a);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Round trips                                                                                 */

/* Load random arrays, read them back, compare bits; the directory and files, then none left. */
static void round_trip(int k, int64_t n, int buffers, int64_t chunk, unsigned seed) {
    ct_swap_opts o = opts(k, n, buffers, budget_for(k, buffers, chunk));
    ct_swap *s;
    ct_err err = {0};
    ct_warnings w = {0};
    ck_assert_msg(ct_swap_open(&o, &s, &w, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(w.n, direct_ok ? 0 : 1); /* the warning that O_DIRECT is refused */
    int64_t want_chunk = chunk < ((n + 1023) / 1024) * 1024 ? chunk : ((n + 1023) / 1024) * 1024;
    ck_assert_int_eq(ct_swap_chunk_elems(s), want_chunk);
    ck_assert_int_eq(ct_swap_chunks(s), (n + want_chunk - 1) / want_chunk);
    ck_assert_uint_le(ct_swap_host_bytes(s), o.host_bytes);
    ck_assert(ct_swap_direct(s) == direct_ok);
    ct_warnings_free(&w);
    float *src[5], *dst[5];
    for (int i = 0; i < k; i++) {
        src[i] = rnd(n, seed * 10 + (unsigned)i, false);
        dst[i] = calloc((size_t)n, sizeof(float));
    }
    ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, (const float *const *)src, &err), CT_OK);
    ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, dst, &err), CT_OK);
    for (int i = 0; i < k; i++) {
        ck_assert_msg(!memcmp(src[i], dst[i], (size_t)n * 4), "array %d of %lld, %d buffers, chunk %lld", i,
                      (long long)n, buffers, (long long)chunk);
        /* the file: padded to the block, in the run's own directory */
        char path[4400];
        snprintf(path, sizeof path, "%s/%s.swap", ct_swap_dir(s), NAMES[i]);
        struct stat st;
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_int_eq(st.st_size, ct_aio_round_up(n * 4));
        free(src[i]);
        free(dst[i]);
    }
    struct stat st;
    ck_assert_int_eq(stat(ct_swap_dir(s), &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    ck_assert_ptr_nonnull(strstr(ct_swap_dir(s), "/ctrain-swap-test-rank0-"));
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    ck_assert_int_eq(count_entries(tmpdir), 0);
}

START_TEST(swap_round_trip_sizes) {
    /* sizes around the block (1024 floats) and the chunk; chunks of 1, 3 and 5 blocks */
    const int64_t sizes[] = {1, 7, 1023, 1024, 1025, 3071, 3072, 3073, 10000, 65537};
    const int64_t chunks[] = {1024, 3072, 5120};
    unsigned seed = 1;
    for (int si = 0; si < CT_ARRAY_LEN(sizes); si++)
        for (int ci = 0; ci < 3; ci++)
            for (int b = 1; b <= 4; b++) round_trip(1 + (int)((si + ci + b) % 3), sizes[si], b, chunks[ci], seed++);
}
END_TEST

START_TEST(swap_budget_decides_chunk) {
    ct_swap_opts o = opts(3, 1000000, 4, (size_t)10 << 20);
    /* (10 MiB - 4 KiB) / 12 buffers = 873,472 bytes -> 213 blocks of 1024 floats */
    ck_assert_int_eq(ct_swap_chunk_for(&o), 213 * 1024);
    o.max_chunk = 100000; /* sub_group_size: rounded down to the block */
    ck_assert_int_eq(ct_swap_chunk_for(&o), 97 * 1024);
    o.max_chunk = 10;     /* at least one block */
    ck_assert_int_eq(ct_swap_chunk_for(&o), 1024);
    o.max_chunk = 0;
    o.n = 5000;           /* no larger than the array */
    ck_assert_int_eq(ct_swap_chunk_for(&o), 5120);
    ck_assert_int_eq(ct_swap_file_bytes(&o), 3 * 20480);
    o.host_bytes = 12 * CT_AIO_ALIGN; /* one block short of 12 blocks + the alignment block */
    ck_assert_int_eq(ct_swap_chunk_for(&o), 0);
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "a host budget of 49152 bytes is too small for 4 buffers of 3 arrays; it needs at "
                                  "least 53248 bytes"), "%s", err.msg);
    ck_assert_int_eq(count_entries(tmpdir), 0);
}
END_TEST

/* The caller's allocator (pin_memory: the backend's pinned memory) with a misaligned result: the
 * swap aligns inside it and stays within the budget; the bytes asked are counted. */
typedef struct counting_alloc {
    size_t live, peak;
    int calls;
} counting_alloc;

static void *alloc_misaligned(void *ctx, size_t bytes) {
    counting_alloc *c = ctx;
    c->live += bytes;
    if (c->live > c->peak) c->peak = c->live;
    c->calls++;
    char *p = malloc(bytes + 64 + sizeof(size_t));
    memcpy(p, &bytes, sizeof bytes);
    return p + 64 + sizeof(size_t) - 16; /* 16-byte aligned, not 4096 */
}

static void free_misaligned(void *ctx, void *p) {
    counting_alloc *c = ctx;
    char *raw = (char *)p - (64 + sizeof(size_t) - 16);
    size_t bytes;
    memcpy(&bytes, raw, sizeof bytes);
    c->live -= bytes;
    free(raw);
}

START_TEST(swap_host_memory_within_budget) {
    counting_alloc c = {0};
    const int64_t n = 50000;
    ct_swap_opts o = opts(3, n, 4, 300000);
    o.alloc = alloc_misaligned;
    o.free = free_misaligned;
    o.alloc_ctx = &c;
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    ck_assert_int_eq(c.calls, 1);
    ck_assert_uint_le(c.peak, o.host_bytes);
    ck_assert_int_eq(ct_swap_chunk_elems(s), 6 * 1024); /* (300000 - 4096) / 12 = 24658 -> 6 blocks */
    float *src[3], *dst[3];
    for (int i = 0; i < 3; i++) {
        src[i] = rnd(n, 100 + (unsigned)i, false);
        dst[i] = calloc((size_t)n, 4);
    }
    ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, (const float *const *)src, &err), CT_OK);
    ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, dst, &err), CT_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert(!memcmp(src[i], dst[i], (size_t)n * 4));
        free(src[i]);
        free(dst[i]);
    }
    ck_assert_uint_le(c.peak, o.host_bytes);
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    ck_assert_uint_eq(c.live, 0);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The optimizer step over chunks                                                              */

static ct_adam_args adam_args(int step, void *copy) {
    ct_adam_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                      .grad_scale = 1.0f / 1024, .decoupled = true, .copy = copy, .copy_dt = CT_BF16};
    a.bias_c1 = 1.0f - powf(a.beta1, (float)step);
    a.bias_c2 = 1.0f - powf(a.beta2, (float)step);
    return a;
}

/* One Adam step of the swapped state: master, exp_avg, exp_avg_sq walked in chunks, the
 * gradients and the bf16 copy host arrays indexed by the chunk's range (as the offloaded
 * optimizer's pinned gradients and compute copy are). Stops holding chunk stop_at (-1: none) and
 * calls at_stop, which does not return (kill -9). */
static int swapped_adam_step(ct_backend *be, ct_swap *s, const float *grads, uint16_t *copy, int step,
                             int64_t stop_at, void (*at_stop)(void), ct_err *err) {
    int rc = ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, err);
    ct_swap_chunk c;
    while (!rc && !(rc = ct_swap_next(s, &c, err)) && c.n) {
        if (c.index == stop_at) at_stop();
        ct_adam_args a = adam_args(step, copy + c.lo);
        be->optim.adam_step(be, c.a[0], grads + c.lo, c.a[1], c.a[2], c.n, &a);
        rc = ct_swap_release(s, &c, err);
    }
    ct_err e2 = {0};
    int r = ct_swap_end(s, &e2);
    if (!rc && r) {
        rc = r;
        *err = e2;
    }
    return rc;
}

START_TEST(swap_adam_equals_in_memory) {
    const int64_t n = 100003; /* a last chunk of 3,235 floats: not a multiple of any vector width */
    ct_backend *be = ct_cpu_backend_create(2);
    ck_assert_ptr_nonnull(be);
    float *p = rnd(n, 1, false), *m = rnd(n, 2, false), *v = rnd(n, 3, true);
    uint16_t *copy_ref = calloc((size_t)n, 2), *copy_sw = calloc((size_t)n, 2);
    ct_swap_opts o = opts(3, n, 4, budget_for(3, 4, 8 * 1024));
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    const float *init[3] = {p, m, v};
    ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, init, &err), CT_OK);
    for (int step = 1; step <= 3; step++) {
        float *g = rnd(n, 1000 + (unsigned)step, false);
        ct_adam_args a = adam_args(step, copy_ref);
        be->optim.adam_step(be, p, g, m, v, n, &a);
        ck_assert_msg(swapped_adam_step(be, s, g, copy_sw, step, -1, NULL, &err) == CT_OK, "%s", err.msg);
        ck_assert(!memcmp(copy_ref, copy_sw, (size_t)n * 2));
        free(g);
    }
    float *out[3] = {calloc((size_t)n, 4), calloc((size_t)n, 4), calloc((size_t)n, 4)};
    ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, out, &err), CT_OK);
    ck_assert(!memcmp(out[0], p, (size_t)n * 4));
    ck_assert(!memcmp(out[1], m, (size_t)n * 4));
    ck_assert(!memcmp(out[2], v, (size_t)n * 4));
    ct_aio_counts io = ct_swap_io_stats(s);
    /* 3 update passes read and write every array's file once each; load and store once more */
    ck_assert_int_eq(io.bytes_read, 4 * 3 * ct_aio_round_up(n * 4));
    ck_assert_int_eq(io.bytes_written, 4 * 3 * ct_aio_round_up(n * 4));
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    for (int i = 0; i < 3; i++) free(out[i]);
    free(p), free(m), free(v), free(copy_ref), free(copy_sw);
    be->destroy(be);
}
END_TEST

/* A checkpoint stream: the arrays drained one after another into a file, read back the same way
 * into a new swap (as a save and a resume do, in the swap's bounded memory). */
typedef struct stream {
    FILE *f;
    int64_t next_elem[CT_SWAP_MAX_ARRAYS];
    int last_k;
} stream;

static int to_stream(void *ctx, int k, int64_t lo, int64_t n, const float *src, ct_err *err) {
    stream *st = ctx;
    if (k < st->last_k || lo != st->next_elem[k]) return ct_errf(err, CT_ERR_RUNTIME, "out of order: %d %lld", k,
                                                                 (long long)lo);
    st->last_k = k;
    st->next_elem[k] = lo + n;
    return fwrite(src, 4, (size_t)n, st->f) == (size_t)n ? CT_OK : ct_errf(err, CT_ERR_RUNTIME, "fwrite");
}

static int from_stream(void *ctx, int k, int64_t lo, int64_t n, float *dst, ct_err *err) {
    stream *st = ctx;
    if (k < st->last_k || lo != st->next_elem[k]) return ct_errf(err, CT_ERR_RUNTIME, "out of order");
    st->last_k = k;
    st->next_elem[k] = lo + n;
    return fread(dst, 4, (size_t)n, st->f) == (size_t)n ? CT_OK : ct_errf(err, CT_ERR_DATA, "short checkpoint");
}

static int save_stream(ct_swap *s, const char *path, ct_err *err) {
    stream st = {.f = fopen(path, "wb")};
    if (!st.f) return ct_errf(err, CT_ERR_RUNTIME, "%s", path);
    int rc = ct_swap_drain(s, CT_SWAP_ALL, to_stream, &st, err);
    if (fflush(st.f) || fsync(fileno(st.f))) rc = rc ? rc : ct_errf(err, CT_ERR_RUNTIME, "fsync");
    fclose(st.f);
    return rc;
}

static int load_stream(ct_swap *s, const char *path, ct_err *err) {
    stream st = {.f = fopen(path, "rb")};
    if (!st.f) return ct_errf(err, CT_ERR_RUNTIME, "%s", path);
    int rc = ct_swap_fill(s, CT_SWAP_ALL, from_stream, &st, err);
    fclose(st.f);
    return rc;
}

START_TEST(swap_checkpoint_stream_round_trip) {
    const int64_t n = 30001;
    float *src[3] = {rnd(n, 11, false), rnd(n, 12, false), rnd(n, 13, true)};
    ct_swap_opts o = opts(3, n, 2, budget_for(3, 2, 2048));
    ct_swap *a, *b;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &a, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_swap_load_host(a, CT_SWAP_ALL, (const float *const *)src, &err), CT_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt.bin", tmpdir);
    ck_assert_msg(save_stream(a, path, &err) == CT_OK, "%s", err.msg);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_size, 3 * n * 4); /* the arrays' bytes, no padding */
    ck_assert_int_eq(ct_swap_close(a, &err), CT_OK);
    o.buffer_count = 3; /* another chunking reads the same stream */
    o.host_bytes = budget_for(3, 3, 5120);
    ck_assert_int_eq(ct_swap_open(&o, &b, NULL, &err), CT_OK);
    ck_assert_msg(load_stream(b, path, &err) == CT_OK, "%s", err.msg);
    float *out[3] = {calloc((size_t)n, 4), calloc((size_t)n, 4), calloc((size_t)n, 4)};
    ck_assert_int_eq(ct_swap_store_host(b, CT_SWAP_ALL, out, &err), CT_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert(!memcmp(src[i], out[i], (size_t)n * 4));
        free(src[i]);
        free(out[i]);
    }
    /* a checkpoint shorter than the state: the fill callback's error comes back */
    ck_assert_int_eq(truncate(path, n * 4 + 100), 0);
    ck_assert_int_eq(load_stream(b, path, &err), CT_ERR_DATA);
    ck_assert_str_eq(err.msg, "short checkpoint");
    ck_assert_int_eq(ct_swap_close(b, &err), CT_OK);
}
END_TEST

/* kill -9 in the middle of step 2 (chunks 0..2 of 5 written back, 3 held, the files half old and
 * half new), then a new process resumes from the checkpoint saved after step 1: its state after
 * step 2 equals an uninterrupted run's, bit for bit, and the dead run's directory is removed. */
enum { K9_N = 5 * 2048 - 17 };
static int k9_pipe[2];

static void k9_stop(void) {
    if (write(k9_pipe[1], "m", 1) != 1) _exit(3);
    for (;;) pause();
}

static int k9_child(void *arg) {
    const char *ckpt = arg;
    ct_backend *be = ct_cpu_backend_create(1);
    ct_swap_opts o = opts(3, K9_N, 3, budget_for(3, 3, 2048));
    ct_swap *s;
    ct_err err = {0};
    CHILD_CHECK(be && ct_swap_open(&o, &s, NULL, &err) == CT_OK, "%s", err.msg);
    const float *init[3] = {rnd(K9_N, 21, false), rnd(K9_N, 22, false), rnd(K9_N, 23, true)};
    uint16_t *copy = calloc(K9_N, 2);
    CHILD_CHECK(ct_swap_load_host(s, CT_SWAP_ALL, init, &err) == CT_OK, "%s", err.msg);
    float *g1 = rnd(K9_N, 31, false), *g2 = rnd(K9_N, 32, false);
    CHILD_CHECK(swapped_adam_step(be, s, g1, copy, 1, -1, NULL, &err) == CT_OK, "%s", err.msg);
    CHILD_CHECK(save_stream(s, ckpt, &err) == CT_OK, "%s", err.msg);
    swapped_adam_step(be, s, g2, copy, 2, 3, k9_stop, &err);
    return 2; /* not reached: killed at chunk 3 */
}

START_TEST(swap_kill9_resume_same_bytes) {
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/step1.ckpt", tmpdir);
    ck_assert_int_eq(pipe(k9_pipe), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) _exit(k9_child(ckpt));
    char m;
    ck_assert_int_eq(read(k9_pipe[0], &m, 1), 1); /* the child holds chunk 3 of step 2 */
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(k9_pipe[0]);
    close(k9_pipe[1]);
    ck_assert_int_eq(count_entries(tmpdir), 2); /* the checkpoint and the dead run's swap directory */

    /* the uninterrupted run, in memory */
    ct_backend *be = ct_cpu_backend_create(1);
    float *p = rnd(K9_N, 21, false), *mm = rnd(K9_N, 22, false), *v = rnd(K9_N, 23, true);
    float *g1 = rnd(K9_N, 31, false), *g2 = rnd(K9_N, 32, false);
    uint16_t *copy_ref = calloc(K9_N, 2), *copy = calloc(K9_N, 2);
    ct_adam_args a1 = adam_args(1, copy_ref), a2 = adam_args(2, copy_ref);
    be->optim.adam_step(be, p, g1, mm, v, K9_N, &a1);
    be->optim.adam_step(be, p, g2, mm, v, K9_N, &a2);

    /* the resume */
    ct_swap_opts o = opts(3, K9_N, 4, budget_for(3, 4, 3072));
    ct_swap *s;
    ct_err err = {0};
    ct_warnings w = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, &w, &err), CT_OK);
    ck_assert_int_eq(w.n, direct_ok ? 1 : 2); /* (and the O_DIRECT warning after it) */
    ck_assert_msg(strstr(w.items[0], "NVMe swap: removed ") && strstr(w.items[0], "ctrain-swap-test-rank0-") &&
                  strstr(w.items[0], "left by a run that ended without cleaning up"), "%s", w.items[0]);
    ck_assert_int_eq(count_entries(tmpdir), 2); /* the checkpoint and this run's directory */
    ck_assert_msg(load_stream(s, ckpt, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(swapped_adam_step(be, s, g2, copy, 2, -1, NULL, &err), CT_OK);
    float *out[3] = {calloc(K9_N, 4), calloc(K9_N, 4), calloc(K9_N, 4)};
    ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, out, &err), CT_OK);
    ck_assert(!memcmp(out[0], p, K9_N * 4));
    ck_assert(!memcmp(out[1], mm, K9_N * 4));
    ck_assert(!memcmp(out[2], v, K9_N * 4));
    ck_assert(!memcmp(copy, copy_ref, K9_N * 2));
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    ct_warnings_free(&w);
    for (int i = 0; i < 3; i++) free(out[i]);
    free(p), free(mm), free(v), free(g1), free(g2), free(copy_ref), free(copy);
    be->destroy(be);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The pipeline                                                                                */

/* One array of 6 chunks of one block each, 3 buffers: while the caller holds chunk i, the read of
 * chunk i+1 starts; the write of chunk 0 is held at a gate until the caller has chunk 1 (a swap
 * that waited for the write before handing out chunk 1 would sit at the gate for 5 s and fail). */
START_TEST(swap_reads_ahead_and_writes_behind) {
    fake f;
    fake_init(&f);
    ct_aio_sys sys = fake_sys(&f);
    const int64_t chunk = 1024, n = 6 * chunk;
    ct_swap_opts o = opts(1, n, 3, budget_for(1, 3, chunk));
    o.aio.sys = &sys;
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    pthread_mutex_lock(&f.mu); /* after the open's probe write at offset 0 */
    f.gate_writes_at_zero = true;
    f.n_ev = 0;
    pthread_mutex_unlock(&f.mu);
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, &err), CT_OK);
    ct_swap_chunk c;
    for (int64_t i = 0; i < 6; i++) {
        ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_OK);
        ck_assert_int_eq(c.index, i);
        ck_assert_int_eq(c.lo, i * chunk);
        if (i == 1) { /* chunk 0's write is still at the gate while the caller has chunk 1 */
            ck_assert(starts(&f, true, 0));
            ck_assert(!seen(&f, true, 0, true));
            pthread_mutex_lock(&f.mu);
            f.gate_open = true;
            pthread_cond_broadcast(&f.cv);
            pthread_mutex_unlock(&f.mu);
        }
        if (i + 1 < 6) ck_assert_msg(starts(&f, false, (i + 1) * chunk * 4), "no read ahead of chunk %lld", (long long)i + 1);
        for (int64_t j = 0; j < c.n; j++) c.a[0][j] = (float)(i * chunk + j);
        ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
    }
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_OK);
    ck_assert_int_eq(c.n, 0);
    ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
    ck_assert(!f.gate_timed_out);
    float *out[1] = {malloc(n * 4)};
    ck_assert_int_eq(ct_swap_store_host(s, 1, out, &err), CT_OK);
    for (int64_t j = 0; j < n; j++) ck_assert_float_eq(out[0][j], (float)j);
    free(out[0]);
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    fake_free(&f);
}
END_TEST

/* One buffer: nothing overlaps, the next chunk's read starts only after the release. */
START_TEST(swap_one_buffer_overlaps_nothing) {
    fake f;
    fake_init(&f);
    ct_aio_sys sys = fake_sys(&f);
    const int64_t chunk = 1024, n = 4 * chunk;
    ct_swap_opts o = opts(2, n, 1, budget_for(2, 1, chunk));
    o.aio.sys = &sys;
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, &err), CT_OK);
    ct_swap_chunk c;
    for (int64_t i = 0; i < 4; i++) {
        ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_OK);
        usleep(20000);
        ck_assert(!seen(&f, false, (i + 1) * chunk * 4, false));
        ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
    }
    ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    fake_free(&f);
}
END_TEST

/* The pass's time with slow I/O (10 ms a request) and a slow step (10 ms a chunk): serial with 1
 * buffer; with 2 the other buffer's write and read (20 ms) bound each chunk; with 3 and 4 the
 * reads run ahead in parallel with the writes. Prints the times; the 3- and 4-buffer passes take
 * under 70% of the serial one (sleep-bound, so a busy machine does not change the ratio much). */
static double timed_pass(int buffers, int *max_running) {
    fake f;
    fake_init(&f);
    f.delay_us = 10000;
    ct_aio_sys sys = fake_sys(&f);
    const int64_t chunk = 1024, n = 10 * chunk;
    ct_swap_opts o = opts(1, n, buffers, budget_for(1, buffers, chunk));
    o.aio.sys = &sys;
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    double t0 = now_s();
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, &err), CT_OK);
    ct_swap_chunk c;
    while (!ct_swap_next(s, &c, &err) && c.n) {
        usleep(10000);
        ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
    }
    ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
    double t = now_s() - t0;
    *max_running = f.max_running;
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    fake_free(&f);
    return t;
}

START_TEST(swap_pipeline_depth_saves_time) {
    int r1, r2, r3, r4;
    double t1 = timed_pass(1, &r1), t2 = timed_pass(2, &r2), t3 = timed_pass(3, &r3), t4 = timed_pass(4, &r4);
    printf("swap pass of 10 chunks, 10 ms I/O and 10 ms step each: 1 buffer %.0f ms (%d request at once), "
           "2 buffers %.0f ms (%d), 3 buffers %.0f ms (%d), 4 buffers %.0f ms (%d)\n", t1 * 1e3, r1, t2 * 1e3, r2,
           t3 * 1e3, r3, t4 * 1e3, r4);
    ck_assert_int_eq(r1, 1);
    ck_assert_int_ge(r3, 2);
    ck_assert_msg(t2 < t1 && t3 < 0.7 * t1 && t4 < 0.7 * t1, "1 buffer %.3f s, 2: %.3f s, 3: %.3f s, 4: %.3f s", t1,
                  t2, t3, t4);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

START_TEST(swap_write_error_names_file) {
    const int errs[] = {ENOSPC, EIO};
    const char *texts[] = {"No space left on device", "Input/output error"};
    for (int e = 0; e < 2; e++) {
        fake f;
        fake_init(&f);
        f.fail_errno = errs[e];
        f.fail_at = 5; /* open wrote a probe block into each file; then master's chunk 0 in 2 pieces */
        ct_aio_sys sys = fake_sys(&f);
        ct_swap_opts o = opts(3, 8000, 3, budget_for(3, 3, 4096));
        o.aio.sys = &sys;
        o.aio.block_size = 8192;
        o.aio.threads = 1;
        o.aio.queue_depth = 1; /* one worker: the writes run in the order queued */
        ct_swap *s;
        ct_err err = {0};
        ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
        float *src[3] = {rnd(8000, 1, false), rnd(8000, 2, false), rnd(8000, 3, false)};
        ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, (const float *const *)src, &err), CT_ERR_RUNTIME);
        ck_assert_msg(strstr(err.msg, ct_swap_dir(s)) && strstr(err.msg, "/master.swap: write of 8192 bytes at offset 8192 failed: ") &&
                      strstr(err.msg, texts[e]), "%s", err.msg);
        ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
        ck_assert_int_eq(count_entries(tmpdir), 0);
        for (int i = 0; i < 3; i++) free(src[i]);
        fake_free(&f);
    }
}
END_TEST

START_TEST(swap_read_error_names_file_and_offset) {
    fake f;
    fake_init(&f);
    f.fail_errno = EIO;
    f.fail_reads = true;
    f.fail_at = 4; /* chunk 1 of the first array (the reads of chunk 0 are 1..3) */
    ct_aio_sys sys = fake_sys(&f);
    ct_swap_opts o = opts(3, 8000, 2, budget_for(3, 2, 2048));
    o.aio.sys = &sys;
    o.aio.threads = 1;
    o.aio.queue_depth = 1; /* one worker: the reads run in the order queued */
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_READ, CT_SWAP_ALL, &err), CT_OK);
    ct_swap_chunk c;
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_OK);
    ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/master.swap: read of 8192 bytes at offset 8192 failed: Input/output error"), "%s",
                  err.msg);
    ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    fake_free(&f);
}
END_TEST

START_TEST(swap_truncated_underneath) {
    ct_swap_opts o = opts(2, 5000, 1, budget_for(2, 1, 1024));
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    char path[4400];
    snprintf(path, sizeof path, "%s/exp_avg.swap", ct_swap_dir(s));
    /* during a pass: the read of a later chunk finds the file short */
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, &err), CT_OK);
    ct_swap_chunk c;
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_OK);
    ck_assert_int_eq(truncate(path, 8192), 0);
    ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_OK); /* chunk 1: bytes 4096..8191, still there */
    ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "read of 4096 bytes at offset 8192 found only 0") &&
                  strstr(err.msg, "shorter than expected"), "%s", err.msg);
    ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
    /* before a pass: refused at once, naming the sizes */
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_READ, CT_SWAP_ALL, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "is 8192 bytes, expected 20480"), "%s", err.msg);
    /* a pass over the other array is fine */
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_READ, 1u, &err), CT_OK);
    ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
}
END_TEST

/* Mount a tmpfs of `opts` over dir in a mount namespace of this (child) process alone. */
static bool private_tmpfs(const char *dir, unsigned long flags, const char *mopts) {
    return unshare(CLONE_NEWNS) == 0 && mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0 &&
           mount("tmpfs", dir, "tmpfs", flags, mopts) == 0;
}

static int full_tmpfs_child(void *arg) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/small", tmpdir);
    if (!private_tmpfs(dir, 0, "size=256k")) return 77;
    ct_err err = {0};
    /* the directory check sees the free space */
    ct_swap_opts o = opts(3, 1 << 20, 2, budget_for(3, 2, 1024));
    o.nvme_path = dir;
    ct_swap *s;
    CHILD_CHECK(ct_swap_open(&o, &s, NULL, &err) == CT_ERR_RUNTIME, "opened");
    CHILD_CHECK(strstr(err.msg, dir) && strstr(err.msg, "the swap files need 12.0 MiB and its file system has 256.0 KiB free"), "%s", err.msg);
    /* the reservation itself, past what the check saw */
    ct_aio *a;
    ct_aio_opts ao = ct_aio_defaults();
    CHILD_CHECK(ct_aio_create(&ao, &a, &err) == CT_OK, "%s", err.msg);
    char path[600];
    snprintf(path, sizeof path, "%s/big.swap", dir);
    ct_aio_file f;
    CHILD_CHECK(ct_aio_create_file(a, path, 1 << 20, &f, &err) == CT_ERR_RUNTIME, "created");
    CHILD_CHECK(strstr(err.msg, path) && strstr(err.msg, "cannot reserve 1.0 MiB for the swap file: No space left "
                                                          "on device") && strstr(err.msg, "free on its file system"),
                "%s", err.msg);
    CHILD_CHECK(!ct_fs_exists(path), "left %s", path);
    ct_aio_free(a);
    return 0;
}

static int fsize_limit_child(void *arg) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 77;
    ct_swap_opts o = opts(3, 1 << 18, 2, budget_for(3, 2, 1024)); /* 1 MiB a file */
    ct_swap *s;
    ct_err err = {0};
    CHILD_CHECK(ct_swap_open(&o, &s, NULL, &err) == CT_ERR_RUNTIME, "opened");
    CHILD_CHECK(strstr(err.msg, tmpdir) && strstr(err.msg, "/master.swap: cannot reserve") &&
                strstr(err.msg, "ulimit -f"), "%s", err.msg);
    CHILD_CHECK(count_entries(tmpdir) == 1, "left files"); /* "small", made by the parent */
    return 0;
}

START_TEST(swap_no_space) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/small", tmpdir);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    int rc = in_child(full_tmpfs_child, NULL);
    if (rc == 77) printf("swap_no_space: no permission to mount a tmpfs here; the file size limit case only\n");
    else ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(in_child(fsize_limit_child, NULL), 0);
}
END_TEST

static int read_only_child(void *arg) {
    const char *dir = arg;
    if (!private_tmpfs(dir, MS_RDONLY, "size=64k")) return 77;
    ct_err err = {0};
    CHILD_CHECK(ct_swap_check_dir(dir, 0, "zero_optimization.offload_optimizer.nvme_path", &err) == CT_ERR_CONFIG,
                "accepted");
    CHILD_CHECK(strstr(err.msg, "zero_optimization.offload_optimizer.nvme_path: ") && strstr(err.msg, dir) &&
                strstr(err.msg, "cannot create files in it: Read-only file system"), "%s", err.msg);
    return 0;
}

START_TEST(swap_dir_refused) {
    ct_err err = {0};
    const char *key = "zero_optimization.offload_optimizer.nvme_path";
    ck_assert_int_eq(ct_swap_check_dir("", 0, key, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "zero_optimization.offload_optimizer.nvme_path: not set"), "%s", err.msg);
    char p[600];
    snprintf(p, sizeof p, "%s/missing", tmpdir);
    ck_assert_int_eq(ct_swap_check_dir(p, 0, key, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "No such file or directory; create it (mkdir -p)"), "%s",
                  err.msg);
    snprintf(p, sizeof p, "%s/file", tmpdir);
    ck_assert_int_eq(ct_fs_write_sync(p, "x", 1, &err), CT_OK);
    ck_assert_int_eq(ct_swap_check_dir(p, 0, key, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "not a directory"), "%s", err.msg);
    ck_assert_int_eq(unlink(p), 0);
    /* the swap refuses it too, before making anything */
    ct_swap_opts o = opts(1, 100, 1, budget_for(1, 1, 1024));
    o.nvme_path = p;
    ct_swap *s;
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "nvme_path: ") && strstr(err.msg, p), "%s", err.msg);
    /* read-only: a read-only mount where this process may mount, else a mode without write (not
     * for root, who writes anyway), else /proc */
    snprintf(p, sizeof p, "%s/ro", tmpdir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    int rc = in_child(read_only_child, p);
    if (rc == 77 && geteuid() != 0) {
        ck_assert_int_eq(chmod(p, 0500), 0);
        ck_assert_int_eq(ct_swap_check_dir(p, 0, key, &err), CT_ERR_CONFIG);
        ck_assert_msg(strstr(err.msg, p) && strstr(err.msg, "cannot create files in it: Permission denied"), "%s",
                      err.msg);
        ck_assert_int_eq(chmod(p, 0700), 0);
    } else if (rc == 77) {
        ck_assert_int_eq(ct_swap_check_dir("/proc", 0, key, &err), CT_ERR_CONFIG);
        ck_assert_msg(strstr(err.msg, "/proc: cannot create files in it"), "%s", err.msg);
    } else {
        ck_assert_int_eq(rc, 0);
    }
    /* not enough room for the files */
    ck_assert_int_eq(ct_swap_check_dir(tmpdir, (int64_t)1 << 60, key, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, tmpdir) && strstr(err.msg, "the swap files need 1048576.0 TiB"), "%s",
                  err.msg);
}
END_TEST

/* The cancel flag ends a wait for a read that does not come back. */
typedef struct canceller {
    atomic_bool *flag;
} canceller;

static void *cancel_later(void *arg) {
    usleep(100000);
    atomic_store(((canceller *)arg)->flag, true);
    return NULL;
}

START_TEST(swap_cancel_ends_waits) {
    fake f;
    fake_init(&f);
    f.hold_reads = true;
    ct_aio_sys sys = fake_sys(&f);
    atomic_bool stop = false;
    ct_swap_opts o = opts(2, 10000, 3, budget_for(2, 3, 2048));
    o.aio.sys = &sys;
    o.aio.cancel = &stop;
    ct_swap *s;
    ct_err err = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_swap_begin(s, CT_SWAP_READ, CT_SWAP_ALL, &err), CT_OK);
    pthread_t th;
    canceller cc = {&stop};
    ck_assert_int_eq(pthread_create(&th, NULL, cancel_later, &cc), 0);
    double t0 = now_s();
    ct_swap_chunk c;
    ck_assert_int_eq(ct_swap_next(s, &c, &err), CT_ERR_RUNTIME);
    double t = now_s() - t0;
    ck_assert_msg(t < 2.0, "the wait took %.2f s", t);
    ck_assert_msg(strstr(err.msg, ".swap: read of 8192 bytes at offset 0 cancelled"), "%s", err.msg);
    pthread_join(th, NULL);
    pthread_mutex_lock(&f.mu); /* let the held reads finish, so that close can join the workers */
    f.reads_released = true;
    pthread_cond_broadcast(&f.cv);
    pthread_mutex_unlock(&f.mu);
    ct_swap_end(s, &err);
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    ck_assert_int_eq(count_entries(tmpdir), 0);
    fake_free(&f);
}
END_TEST

/* A file system that refuses O_DIRECT: buffered files, one warning, the same bytes. */
START_TEST(swap_without_direct_io) {
    fake f;
    fake_init(&f);
    f.refuse_direct = true;
    ct_aio_sys sys = fake_sys(&f);
    const int64_t n = 7777;
    ct_swap_opts o = opts(3, n, 2, budget_for(3, 2, 2048));
    o.aio.sys = &sys;
    ct_swap *s;
    ct_err err = {0};
    ct_warnings w = {0};
    ck_assert_int_eq(ct_swap_open(&o, &s, &w, &err), CT_OK);
    ck_assert(!ct_swap_direct(s));
    ck_assert_int_eq(w.n, 1);
    ck_assert_msg(strstr(w.items[0], ct_swap_dir(s)) && strstr(w.items[0], "refuses direct I/O (O_DIRECT: Invalid "
                                                                           "argument); using buffered I/O"),
                  "%s", w.items[0]);
    float *src[3] = {rnd(n, 1, false), rnd(n, 2, false), rnd(n, 3, false)};
    float *dst[3] = {calloc(n, 4), calloc(n, 4), calloc(n, 4)};
    ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, (const float *const *)src, &err), CT_OK);
    ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, dst, &err), CT_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert(!memcmp(src[i], dst[i], n * 4));
        free(src[i]);
        free(dst[i]);
    }
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    ct_warnings_free(&w);
    fake_free(&f);
}
END_TEST

/* Two live swaps under one path: neither removes the other's directory; each removes its own. */
START_TEST(swap_live_directories_stay) {
    ct_swap_opts o = opts(1, 100, 1, budget_for(1, 1, 1024));
    ct_swap *a, *b;
    ct_err err = {0};
    ct_warnings w = {0};
    ck_assert_int_eq(ct_swap_open(&o, &a, &w, &err), CT_OK);
    o.rank = 1;
    ck_assert_int_eq(ct_swap_open(&o, &b, &w, &err), CT_OK);
    ck_assert_int_eq(w.n, direct_ok ? 0 : 2); /* no stale directory removed */
    ck_assert_str_ne(ct_swap_dir(a), ct_swap_dir(b));
    ck_assert_ptr_nonnull(strstr(ct_swap_dir(b), "ctrain-swap-test-rank1-"));
    ck_assert(ct_fs_is_dir(ct_swap_dir(a)) && ct_fs_is_dir(ct_swap_dir(b)));
    ck_assert_int_eq(count_entries(tmpdir), 2);
    ck_assert_int_eq(ct_swap_close(a, &err), CT_OK);
    ck_assert_int_eq(count_entries(tmpdir), 1);
    ck_assert_int_eq(ct_swap_close(b, &err), CT_OK);
    ck_assert_int_eq(count_entries(tmpdir), 0);
    ct_warnings_free(&w);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Fuzz: random shapes and passes against an in-memory shadow                                  */

/* Between passes any range of an array is read and written in place, whatever its alignment and
 * length (one element, a block's edge, more than the buffers hold at once): the elements around a
 * written range keep their values, and a pass afterwards sees what was written. */
START_TEST(swap_ranges_read_and_written) {
    enum { N = 50000 };
    ct_swap_opts o = opts(3, N, 2, budget_for(3, 2, 2048)); /* 48 KiB of buffers: ranges in pieces */
    ct_swap *s;
    ct_err err = {0};
    ck_assert_msg(ct_swap_open(&o, &s, NULL, &err) == CT_OK, "%s", err.msg);
    float *shadow[3];
    for (int i = 0; i < 3; i++) shadow[i] = rnd(N, 60 + (uint64_t)i, false);
    ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, (const float *const *)shadow, &err), CT_OK);
    static const int64_t ranges[][2] = {{0, 1}, {1, 1}, {1023, 2}, {1024, 1024}, {1000, 30000}, {N - 1, 1},
                                        {N - 3000, 3000}, {0, N}, {12345, 0}, {4095, 4099}};
    for (size_t t = 0; t < CT_ARRAY_LEN(ranges); t++) {
        int k = (int)(t % 3);
        int64_t at = ranges[t][0], n = ranges[t][1];
        float *x = rnd(n, 70 + t, false), *y = calloc((size_t)(n ? n : 1), 4);
        ck_assert_int_eq(ct_swap_read(s, k, at, n, y, &err), CT_OK);
        ck_assert_msg(!memcmp(y, shadow[k] + at, (size_t)n * 4), "read [%lld, +%lld)", (long long)at, (long long)n);
        ck_assert_int_eq(ct_swap_write(s, k, at, n, x, &err), CT_OK);
        memcpy(shadow[k] + at, x, (size_t)n * 4);
        free(x);
        free(y);
    }
    /* every element, through a pass: the written ranges and everything around them */
    float *out[3];
    for (int i = 0; i < 3; i++) out[i] = calloc(N, 4);
    ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, out, &err), CT_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(!memcmp(out[i], shadow[i], N * 4), "array %d", i);
        free(out[i]);
        free(shadow[i]);
    }
    ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
}
END_TEST

START_TEST(swap_fuzz_against_shadow) {
    ct_rng r;
    ct_rng_init(&r, 99, CT_RNG_INIT, 0);
    for (int iter = 0; iter < 40; iter++) {
        int k = 1 + (int)ct_rng_below(&r, 4), buffers = 1 + (int)ct_rng_below(&r, 5);
        int64_t n = 1 + ct_rng_below(&r, 40000);
        int64_t chunk = 1024 * (1 + ct_rng_below(&r, 12));
        ct_swap_opts o = opts(k, n, buffers, budget_for(k, buffers, chunk) + ct_rng_below(&r, 4000));
        if (ct_rng_below(&r, 3) == 0) o.max_chunk = 1 + ct_rng_below(&r, 8000);
        o.aio.block_size = CT_AIO_ALIGN * (1 + ct_rng_below(&r, 8));
        o.aio.queue_depth = 1 + (int)ct_rng_below(&r, 4);
        o.aio.threads = 1 + (int)ct_rng_below(&r, 2);
        ct_swap *s;
        ct_err err = {0};
        ck_assert_msg(ct_swap_open(&o, &s, NULL, &err) == CT_OK, "%s", err.msg);
        float *shadow[4];
        for (int i = 0; i < k; i++) shadow[i] = rnd(n, (uint64_t)(iter * 10 + i), false);
        ck_assert_int_eq(ct_swap_load_host(s, CT_SWAP_ALL, (const float *const *)shadow, &err), CT_OK);
        for (int op = 0; op < 6; op++) {
            if (ct_rng_below(&r, 4) == 0) { /* between passes: a range read or written, as a checkpoint does */
                int a = (int)ct_rng_below(&r, (uint32_t)k);
                int64_t at = ct_rng_below(&r, (uint32_t)n), len = ct_rng_below(&r, (uint32_t)(n - at + 1));
                float *x = rnd(len, (uint64_t)(1000 + iter * 10 + op), false);
                if (ct_rng_below(&r, 2)) {
                    ck_assert_int_eq(ct_swap_write(s, a, at, len, x, &err), CT_OK);
                    memcpy(shadow[a] + at, x, (size_t)len * 4);
                } else {
                    ck_assert_int_eq(ct_swap_read(s, a, at, len, x, &err), CT_OK);
                    ck_assert(!memcmp(x, shadow[a] + at, (size_t)len * 4));
                }
                free(x);
                continue;
            }
            unsigned mask = 1 + ct_rng_below(&r, (1u << k) - 1);
            ct_swap_mode mode = (ct_swap_mode)ct_rng_below(&r, 3);
            int64_t stop_after = ct_rng_below(&r, 4) == 0 ? (int64_t)ct_rng_below(&r, (uint32_t)ct_swap_chunks(s)) : -1;
            ck_assert_int_eq(ct_swap_begin(s, mode, mask, &err), CT_OK);
            ct_swap_chunk c;
            int64_t covered = 0;
            while (!ct_swap_next(s, &c, &err) && c.n) {
                ck_assert_int_eq(c.lo, covered);
                covered += c.n;
                if (c.index == stop_after) break; /* held, never released: nothing written */
                for (int i = 0; i < k; i++) {
                    if (!((mask >> i) & 1u)) {
                        ck_assert_ptr_null(c.a[i]);
                        continue;
                    }
                    float *sh = shadow[i] + c.lo;
                    if (mode != CT_SWAP_FILL) ck_assert(!memcmp(c.a[i], sh, (size_t)c.n * 4));
                    for (int64_t j = 0; j < c.n; j++) {
                        float x = mode == CT_SWAP_FILL ? (float)(op * 1000 + i) + (float)j * 0.5f
                                                       : c.a[i][j] * 0.75f + (float)op;
                        c.a[i][j] = x;
                        if (mode != CT_SWAP_READ) sh[j] = x; /* READ writes nothing back */
                    }
                }
                ck_assert_int_eq(ct_swap_release(s, &c, &err), CT_OK);
            }
            if (stop_after < 0) ck_assert_int_eq(covered, n);
            ck_assert_int_eq(ct_swap_end(s, &err), CT_OK);
        }
        float *out[4];
        for (int i = 0; i < k; i++) out[i] = calloc((size_t)n, 4);
        ck_assert_int_eq(ct_swap_store_host(s, CT_SWAP_ALL, out, &err), CT_OK);
        for (int i = 0; i < k; i++) {
            ck_assert_msg(!memcmp(out[i], shadow[i], (size_t)n * 4), "iteration %d array %d", iter, i);
            free(out[i]);
            free(shadow[i]);
        }
        ck_assert_int_eq(ct_swap_close(s, &err), CT_OK);
    }
    ck_assert_int_eq(count_entries(tmpdir), 0);
}
END_TEST

int main(void) {
    Suite *su = suite_create("zero_swap");
    TCase *tc = tcase_create("zero_swap");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, aio_round_trip_pieces);
    tcase_add_test(tc, aio_options_refused);
    tcase_add_test(tc, aio_short_read_names_file);
    tcase_add_test(tc, swap_round_trip_sizes);
    tcase_add_test(tc, swap_budget_decides_chunk);
    tcase_add_test(tc, swap_host_memory_within_budget);
    tcase_add_test(tc, swap_adam_equals_in_memory);
    tcase_add_test(tc, swap_checkpoint_stream_round_trip);
    tcase_add_test(tc, swap_ranges_read_and_written);
    tcase_add_test(tc, swap_kill9_resume_same_bytes);
    tcase_add_test(tc, swap_reads_ahead_and_writes_behind);
    tcase_add_test(tc, swap_one_buffer_overlaps_nothing);
    tcase_add_test(tc, swap_pipeline_depth_saves_time);
    tcase_add_test(tc, swap_write_error_names_file);
    tcase_add_test(tc, swap_read_error_names_file_and_offset);
    tcase_add_test(tc, swap_truncated_underneath);
    tcase_add_test(tc, swap_no_space);
    tcase_add_test(tc, swap_dir_refused);
    tcase_add_test(tc, swap_cancel_ends_waits);
    tcase_add_test(tc, swap_without_direct_io);
    tcase_add_test(tc, swap_live_directories_stay);
    tcase_add_test(tc, swap_fuzz_against_shadow);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}

/* bench_swap.c: read and write throughput of the NVMe swap engine (core/zero/aio.h) and of an
 * optimizer-step pass of the swapper (core/zero/swap.h) on one directory's disk, against plain
 * buffered I/O of the same bytes.
 *
 * Usage: bench_swap DIR MIB BLOCK_KIB QUEUE_DEPTH THREADS [buffered]
 * Prints one line per measurement, "name GB/s seconds"; "buffered" adds plain buffered I/O. Writes are timed up to fdatasync (the
 * bytes are on the disk); buffered reads start after posix_fadvise(DONTNEED) has dropped the
 * file's pages, so nothing comes from the page cache. bench/bench_swap.sh builds and runs it with
 * dd beside it (docs/BENCHMARKS.md, "NVMe swap engine"). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/zero/aio.h"
#include "core/zero/swap.h"

#define JOB_BYTES (64 << 20) /* one job per 64 MiB, as a swap chunk would be */

static void die(const ct_err *e) {
    fprintf(stderr, "bench_swap: %s\n", e->msg);
    exit(1);
}

static void report(const char *name, int64_t bytes, double secs) {
    printf("%-28s %6.2f GB/s %8.3f s\n", name, (double)bytes / secs / 1e9, secs);
    fflush(stdout);
}

/* The engine: the whole file in JOB_BYTES jobs, all queued at once, then waited for. */
static double engine_pass(ct_aio *a, ct_aio_file *f, char *buf, int64_t bytes, bool write) {
    int n = (int)((bytes + JOB_BYTES - 1) / JOB_BYTES);
    ct_aio_job *jobs = calloc((size_t)n, sizeof *jobs);
    ct_err e = {0};
    double t0 = ct_now();
    for (int i = 0; i < n; i++) {
        int64_t off = (int64_t)i * JOB_BYTES, len = bytes - off < JOB_BYTES ? bytes - off : JOB_BYTES;
        if (write) ct_aio_write(a, &jobs[i], f, buf + off, (size_t)len, off, NULL);
        else ct_aio_read(a, &jobs[i], f, buf + off, (size_t)len, off, NULL);
    }
    for (int i = 0; i < n; i++)
        if (ct_aio_wait(a, &jobs[i], &e)) die(&e);
    if (write) fdatasync(f->fd);
    double t = ct_now() - t0;
    free(jobs);
    return t;
}

/* Plain buffered I/O, one thread, 1 MiB at a time: what a naive swap would do. */
static double buffered_pass(const char *path, char *buf, int64_t bytes, bool write) {
    int fd = open(path, write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0600);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    if (!write) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    double t0 = ct_now();
    for (int64_t off = 0; off < bytes; off += 1 << 20) {
        size_t n = (size_t)(bytes - off < (1 << 20) ? bytes - off : (1 << 20));
        ssize_t r = write ? pwrite(fd, buf + off, n, off) : pread(fd, buf + off, n, off);
        if (r != (ssize_t)n) {
            perror(path);
            exit(1);
        }
    }
    if (write) fdatasync(fd);
    double t = ct_now() - t0;
    if (write) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return t;
}

/* A swap of 3 arrays (master, exp_avg, exp_avg_sq) of n floats: one UPDATE pass that touches
 * every element, so the bytes read and written are 2 x 12 n. */
static void swap_pass(const char *dir, int64_t bytes, ct_aio_opts aio) {
    const char *names[] = {"master", "exp_avg", "exp_avg_sq"};
    ct_swap_opts o = {.nvme_path = dir, .tag = "bench", .n_arrays = 3, .names = names, .n = bytes / 12,
                      .buffer_count = 4, .host_bytes = (size_t)4 * 3 * (16 << 20), .aio = aio};
    ct_swap *s;
    ct_err e = {0};
    if (ct_swap_open(&o, &s, NULL, &e)) die(&e);
    double t0 = ct_now();
    if (ct_swap_begin(s, CT_SWAP_FILL, CT_SWAP_ALL, &e)) die(&e);
    ct_swap_chunk c;
    int rc;
    while (!(rc = ct_swap_next(s, &c, &e)) && c.n) {
        for (int k = 0; k < 3; k++) memset(c.a[k], k, (size_t)c.n * 4);
        if (ct_swap_release(s, &c, &e)) die(&e);
    }
    if (rc || ct_swap_end(s, &e)) die(&e);
    report("swap fill (write)", 12 * o.n, ct_now() - t0);
    t0 = ct_now();
    if (ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, &e)) die(&e);
    while (!(rc = ct_swap_next(s, &c, &e)) && c.n) {
        for (int64_t i = 0; i < c.n; i++) c.a[0][i] += c.a[1][i] * c.a[2][i];
        if (ct_swap_release(s, &c, &e)) die(&e);
    }
    if (rc || ct_swap_end(s, &e)) die(&e);
    report("swap update (read+write)", 24 * o.n, ct_now() - t0);
    if (ct_swap_close(s, &e)) die(&e);
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: bench_swap DIR MIB BLOCK_KIB QUEUE_DEPTH THREADS [buffered]\n");
        return 2;
    }
    const char *dir = argv[1];
    int64_t bytes = atoll(argv[2]) << 20;
    ct_aio_opts o = ct_aio_defaults();
    o.block_size = (size_t)atoll(argv[3]) << 10;
    o.queue_depth = atoi(argv[4]);
    o.threads = atoi(argv[5]);
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_swap.%d", dir, (int)getpid());
    char *buf = ct_aio_alloc((size_t)bytes);
    for (int64_t i = 0; i < bytes; i++) buf[i] = (char)(i * 7 + (i >> 12));

    ct_aio *a;
    ct_aio_file f;
    ct_err e = {0};
    if (ct_aio_create(&o, &a, &e) || ct_aio_create_file(a, path, bytes, &f, &e)) die(&e);
    printf("# %s: %lld MiB, block %zu KiB, queue depth %d, threads %d (%d workers), O_DIRECT %s\n", dir,
           (long long)(bytes >> 20), o.block_size >> 10, o.queue_depth, o.threads, ct_aio_workers(a),
           f.direct ? "yes" : "no");
    report("engine write", bytes, engine_pass(a, &f, buf, bytes, true));
    report("engine read", bytes, engine_pass(a, &f, buf, bytes, false));
    ct_aio_close_file(&f, true, NULL);
    ct_aio_free(a);

    if (argc == 7 && !strcmp(argv[6], "buffered")) {
        report("buffered write (1 thread)", bytes, buffered_pass(path, buf, bytes, true));
        report("buffered read (1 thread)", bytes, buffered_pass(path, buf, bytes, false));
        unlink(path);
    }
    ct_aio_release(buf);
    swap_pass(dir, bytes, o);
    return 0;
}

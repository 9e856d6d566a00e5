/* aio.h: asynchronous file I/O for NVMe offload (ZeRO-Infinity's swap files, core/zero/swap.h).
 *
 * A job reads or writes one contiguous range of a file from or into one host buffer. The engine
 * cuts it into pieces of at most block_size bytes (DeepSpeed's aio.block_size) and a pool of
 * worker threads runs the pieces with pread/pwrite, in submission order, as many at once as there
 * are workers: intra_op_parallelism x queue_depth (aio.intra_op_parallelism threads, each keeping
 * aio.queue_depth requests in flight, as DeepSpeed's libaio threads do; a blocking pread is one
 * request, so a worker is one slot of that queue). Submitting never blocks; waiting for a job
 * blocks until its last piece is done, or until the cancel flag is set.
 *
 * Files are opened with O_DIRECT, so swapped state does not pass through (and fill) the page
 * cache: buffers, offsets and lengths must then be multiples of CT_AIO_ALIGN (ct_aio_alloc gives
 * such buffers). A file system that refuses O_DIRECT (at open, or at the first write: some FUSE
 * and network file systems) gets buffered I/O instead, and the file says so (ct_aio_file_direct)
 * so that the caller can warn once. liburing is not used: on this project's test machine a pool
 * of pread/pwrite threads moves as many bytes as the disk allows (docs/BENCHMARKS.md, "NVMe swap
 * engine"), and it needs no library and no io_uring permission (containers often forbid it).
 *
 * Every failure is a CT_ERR_RUNTIME naming the file, the operation, the offset and the length:
 * an errno (ENOSPC, EIO, ...), a read that found the file shorter than the job (truncated while in
 * use), a write that wrote nothing. The first failing piece of a job is the one reported; the
 * job's other pieces are not started once one failed. */
#ifndef CT_ZERO_AIO_H
#define CT_ZERO_AIO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/config/config.h"
#include "core/util/common.h"

/* Alignment of O_DIRECT buffers, offsets and lengths: the largest logical block size of the
 * drives in use (4096 B: 4Kn NVMe drives; 512 B drives accept it too). The config checks
 * aio.block_size against the same number. */
#define CT_AIO_ALIGN CT_AIO_BLOCK_ALIGN

/* The system calls the engine makes; tests replace them to add delays or faults. Each returns
 * what the system call returns, but -errno instead of -1. NULL members: the real calls. */
typedef struct ct_aio_sys {
    int (*open)(void *ctx, const char *path, int flags, int mode);
    ssize_t (*pread)(void *ctx, int fd, void *buf, size_t n, int64_t off);
    ssize_t (*pwrite)(void *ctx, int fd, const void *buf, size_t n, int64_t off);
    void *ctx;
} ct_aio_sys;

typedef struct ct_aio_opts {
    size_t block_size;          /* bytes per request: a multiple of CT_AIO_ALIGN (aio.block_size) */
    int queue_depth;            /* requests in flight per thread (aio.queue_depth), >= 1 */
    int threads;                /* aio.intra_op_parallelism, >= 1 */
    const ct_aio_sys *sys;      /* NULL: the real system calls */
    const atomic_bool *cancel;  /* may be NULL; when it becomes true, waits return an error and
                                   pieces not started yet are dropped */
} ct_aio_opts;

/* DeepSpeed's aio defaults: block 1 MiB, queue depth 8, one thread. */
ct_aio_opts ct_aio_defaults(void);
/* The options of the config's "aio" section (sys and cancel NULL). single_submit and
 * overlap_events change nothing here: every request is its own pread/pwrite, and a worker starts
 * the next request as soon as its last one completes (docs/config.md). */
ct_aio_opts ct_aio_from_config(const ct_aio_cfg *c);

typedef struct ct_aio ct_aio;

/* A file the engine reads and writes. */
typedef struct ct_aio_file {
    int fd;
    bool direct;                /* opened with O_DIRECT and a direct write worked */
    int direct_errno;           /* !direct: why the file system refused O_DIRECT */
    int64_t size;               /* bytes reserved at open */
    char path[4096];
} ct_aio_file;

/* One read or write; owned by the caller, filled by ct_aio_read/ct_aio_write. The job and its
 * buffer must stay valid until ct_aio_wait returned CT_OK or ct_aio_done was true (after a
 * cancelled wait: until ct_aio_free returns). The members are the engine's. */
typedef struct ct_aio_job {
    ct_aio_file *file;
    bool write;
    char *buf;
    size_t len;
    int64_t off;
    const struct ct_aio_job *after;  /* starts once this one is done (NULL: at once) */
    size_t issued;              /* bytes handed to workers so far */
    int in_flight;              /* pieces being read or written now */
    bool done, cancelled;
    int err_errno;              /* first failure: errno, or 0 for a short read/write */
    int64_t err_off;            /* its piece's offset, length and bytes moved */
    size_t err_len, err_got;
    struct ct_aio_job *next_queued;
} ct_aio_job;

/* Counters for tests and benchmarks (ct_aio_stats). */
typedef struct ct_aio_counts {
    int64_t bytes_read, bytes_written;
    int64_t pieces;             /* requests completed */
    int max_in_flight;          /* most requests running at once */
} ct_aio_counts;

/* Start the workers. CT_ERR_CONFIG for options out of range (block size not a multiple of
 * CT_AIO_ALIGN, queue depth or threads < 1), naming the aio key. */
int ct_aio_create(const ct_aio_opts *o, ct_aio **out, ct_err *err);
/* Finish the requests that are running (queued ones of a cancelled engine are dropped), stop the
 * workers, free the engine. NULL: nothing. */
void ct_aio_free(ct_aio *a);
/* Workers (intra_op_parallelism x queue_depth). */
int ct_aio_workers(const ct_aio *a);
ct_aio_counts ct_aio_stats(ct_aio *a);

/* Host memory for I/O buffers: bytes rounded up to CT_AIO_ALIGN, aligned to it (ct_fatal when
 * the host is out of memory); free with ct_aio_release. */
void *ct_aio_alloc(size_t bytes);
void ct_aio_release(void *p);
/* x rounded up to a multiple of CT_AIO_ALIGN. */
static inline int64_t ct_aio_round_up(int64_t x) {
    return (x + CT_AIO_ALIGN - 1) / CT_AIO_ALIGN * CT_AIO_ALIGN;
}

/* Create a new file at path (O_EXCL: an existing file is an error) and reserve `size` bytes on
 * its file system (posix_fallocate; a file system that cannot, ftruncate), so that a disk too
 * small fails here, naming the file, the bytes and what is free, and not in the middle of a step.
 * O_DIRECT is tried first (f->direct says whether it held). size is a multiple of CT_AIO_ALIGN. */
int ct_aio_create_file(ct_aio *a, const char *path, int64_t size, ct_aio_file *f, ct_err *err);
/* Check that f is still the size it was reserved at (nothing truncated it underneath): a
 * CT_ERR_RUNTIME naming the file, its size and the size expected otherwise. */
int ct_aio_check_file(const ct_aio_file *f, ct_err *err);
/* Close (the file stays) and, when unlink, remove it. Errors: CT_ERR_RUNTIME naming the file. */
int ct_aio_close_file(ct_aio_file *f, bool unlink_it, ct_err *err);

/* Queue a read of len bytes at off into buf, or a write of buf to off. Never blocks. With an
 * O_DIRECT file, buf, len and off must be multiples of CT_AIO_ALIGN (ct_fatal otherwise: a
 * caller's bug). len 0: done at once. after (may be NULL): a job queued earlier that must finish
 * before this one starts (a read into the buffer a write is still taking from); jobs queued
 * behind a waiting one may start before it. */
void ct_aio_read(ct_aio *a, ct_aio_job *j, ct_aio_file *f, void *buf, size_t len, int64_t off,
                 const ct_aio_job *after);
void ct_aio_write(ct_aio *a, ct_aio_job *j, ct_aio_file *f, const void *buf, size_t len, int64_t off,
                  const ct_aio_job *after);
/* True once every piece of j has finished (successfully or not); does not block. */
bool ct_aio_done(ct_aio *a, const ct_aio_job *j);
/* Block until j has finished: CT_OK, or CT_ERR_RUNTIME naming the file, the operation, the
 * offset and the cause; or cancelled (the cancel flag), naming what was being waited for. */
int ct_aio_wait(ct_aio *a, ct_aio_job *j, ct_err *err);

#endif

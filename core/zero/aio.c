/* aio.c: see aio.h. One queue of jobs under one mutex; each worker takes the next piece of the
 * first job that has pieces left, runs it without the lock and reports back. */
#include "core/zero/aio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "core/report/report.h"

struct ct_aio {
    ct_aio_opts o;
    pthread_mutex_t mu;
    pthread_cond_t work;        /* a piece was queued, or shutdown */
    pthread_cond_t done;        /* a job finished */
    ct_aio_job *head, *tail;    /* jobs with pieces not handed out yet, in submission order */
    bool shutdown;
    int n_workers;
    pthread_t *workers;
    int in_flight;
    ct_aio_counts counts;
};

/* ------------------------------------------------------------------------------------------ */
/* The system calls, real or the test's                                                        */

static int sys_open(const ct_aio *a, const char *path, int flags, int mode) {
    if (a->o.sys && a->o.sys->open) return a->o.sys->open(a->o.sys->ctx, path, flags, mode);
    int fd = open(path, flags, mode);
    return fd < 0 ? -errno : fd;
}

static ssize_t sys_pread(const ct_aio *a, int fd, void *buf, size_t n, int64_t off) {
    if (a->o.sys && a->o.sys->pread) return a->o.sys->pread(a->o.sys->ctx, fd, buf, n, off);
    ssize_t r = pread(fd, buf, n, (off_t)off);
    return r < 0 ? -errno : r;
}

static ssize_t sys_pwrite(const ct_aio *a, int fd, const void *buf, size_t n, int64_t off) {
    if (a->o.sys && a->o.sys->pwrite) return a->o.sys->pwrite(a->o.sys->ctx, fd, buf, n, off);
    ssize_t r = pwrite(fd, buf, n, (off_t)off);
    return r < 0 ? -errno : r;
}

/* One piece, all of it: retried on EINTR and on partial transfers. Returns the bytes moved (n on
 * success; fewer when the file ended or a write moved nothing) or -errno. */
static ssize_t piece_io(const ct_aio *a, int fd, bool write, char *buf, size_t n, int64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = write ? sys_pwrite(a, fd, buf + got, n - got, off + (int64_t)got)
                          : sys_pread(a, fd, buf + got, n - got, off + (int64_t)got);
        if (r == -EINTR) continue;
        if (r < 0) return r;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* ------------------------------------------------------------------------------------------ */
/* Workers                                                                                     */

static void unqueue(ct_aio *a, ct_aio_job *j, ct_aio_job *prev) {
    if (prev) prev->next_queued = j->next_queued;
    else a->head = j->next_queued;
    if (a->tail == j) a->tail = prev;
}

static void finish_if_done(ct_aio *a, ct_aio_job *j) {
    if (j->issued == j->len && j->in_flight == 0 && !j->done) {
        j->done = true;
        pthread_cond_broadcast(&a->done);
        pthread_cond_broadcast(&a->work); /* jobs queued after it may start now */
    }
}

/* The cancel flag is up: no queued piece starts; jobs finish as their running pieces do. */
static void drop_queued(ct_aio *a) {
    while (a->head) {
        ct_aio_job *j = a->head;
        unqueue(a, j, NULL);
        j->cancelled = true;
        j->issued = j->len;
        finish_if_done(a, j);
    }
}

static bool cancelled(const ct_aio *a) { return a->o.cancel && atomic_load(a->o.cancel); }

/* The first queued job that may start: its `after` job (if any) has finished. */
static ct_aio_job *ready_job(ct_aio *a, ct_aio_job **prev_out) {
    ct_aio_job *prev = NULL;
    for (ct_aio_job *j = a->head; j; prev = j, j = j->next_queued)
        if (!j->after || j->after->done) {
            *prev_out = prev;
            return j;
        }
    return NULL;
}

static void *worker_main(void *arg) {
    ct_aio *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        if (a->head && cancelled(a)) drop_queued(a);
        ct_aio_job *prev = NULL, *j = ready_job(a, &prev);
        if (!j) {
            if (a->shutdown && !a->head) break;
            pthread_cond_wait(&a->work, &a->mu);
            continue;
        }
        size_t off = j->issued, n = j->len - off;
        if (n > a->o.block_size) n = a->o.block_size;
        j->issued += n;
        j->in_flight++;
        if (j->issued == j->len) unqueue(a, j, prev);
        if (++a->in_flight > a->counts.max_in_flight) a->counts.max_in_flight = a->in_flight;
        pthread_mutex_unlock(&a->mu);

        ssize_t r = piece_io(a, j->file->fd, j->write, j->buf + off, n, j->off + (int64_t)off);

        pthread_mutex_lock(&a->mu);
        a->in_flight--;
        a->counts.pieces++;
        if (r > 0) *(j->write ? &a->counts.bytes_written : &a->counts.bytes_read) += r;
        if (r != (ssize_t)n && !j->err_len) { /* the job's first failure; its other pieces are not run */
            j->err_errno = r < 0 ? (int)-r : 0;
            j->err_off = j->off + (int64_t)off;
            j->err_len = n;
            j->err_got = r > 0 ? (size_t)r : 0;
            if (j->issued < j->len) { /* still queued: take it out */
                j->issued = j->len;
                ct_aio_job *q = a->head, *qprev = NULL;
                while (q && q != j) qprev = q, q = q->next_queued;
                if (q) unqueue(a, j, qprev);
            }
        }
        j->in_flight--;
        finish_if_done(a, j);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Engine                                                                                      */

ct_aio_opts ct_aio_defaults(void) {
    ct_aio_opts o = {.block_size = 1048576, .queue_depth = 8, .threads = 1};
    return o;
}

ct_aio_opts ct_aio_from_config(const ct_aio_cfg *c) {
    ct_aio_opts o = {.block_size = (size_t)c->block_size, .queue_depth = c->queue_depth,
                     .threads = c->intra_op_parallelism};
    return o;
}

int ct_aio_create(const ct_aio_opts *o, ct_aio **out, ct_err *err) {
    *out = NULL;
    if (o->block_size < CT_AIO_ALIGN || o->block_size % CT_AIO_ALIGN)
        return ct_errf(err, CT_ERR_CONFIG, "aio.block_size: expected a positive multiple of %d bytes (direct I/O "
                       "moves whole blocks), got %zu", CT_AIO_ALIGN, o->block_size);
    if (o->queue_depth < 1 || o->queue_depth > 1024)
        return ct_errf(err, CT_ERR_CONFIG, "aio.queue_depth: expected 1..1024, got %d", o->queue_depth);
    if (o->threads < 1 || o->threads > 256)
        return ct_errf(err, CT_ERR_CONFIG, "aio.intra_op_parallelism: expected 1..256, got %d", o->threads);
    ct_aio *a = ct_xcalloc(1, sizeof *a);
    a->o = *o;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_cond_init(&a->done, NULL);
    int want = o->threads * o->queue_depth;
    if (want > 1024) want = 1024;
    a->workers = ct_xcalloc((size_t)want, sizeof *a->workers);
    for (; a->n_workers < want; a->n_workers++) {
        int rc = pthread_create(&a->workers[a->n_workers], NULL, worker_main, a);
        if (rc) {
            ct_aio_free(a);
            return ct_errf(err, CT_ERR_RUNTIME, "NVMe swap: cannot start I/O thread %d of %d: %s", a->n_workers + 1,
                           want, strerror(rc));
        }
    }
    *out = a;
    return CT_OK;
}

void ct_aio_free(ct_aio *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->shutdown = true;
    if (cancelled(a)) drop_queued(a);
    pthread_cond_broadcast(&a->work);
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < a->n_workers; i++) pthread_join(a->workers[i], NULL);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    pthread_mutex_destroy(&a->mu);
    free(a->workers);
    free(a);
}

int ct_aio_workers(const ct_aio *a) { return a->n_workers; }

ct_aio_counts ct_aio_stats(ct_aio *a) {
    pthread_mutex_lock(&a->mu);
    ct_aio_counts c = a->counts;
    pthread_mutex_unlock(&a->mu);
    return c;
}

void *ct_aio_alloc(size_t bytes) {
    size_t n = (size_t)ct_aio_round_up((int64_t)(bytes ? bytes : 1));
    void *p = NULL;
    if (posix_memalign(&p, CT_AIO_ALIGN, n) != 0) ct_die_oom(n);
    return p;
}

void ct_aio_release(void *p) { free(p); }

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                       */

/* Reserve the file's bytes now: a full disk fails here, not in a step. */
static int reserve(ct_aio_file *f, ct_err *err) {
    if (f->size == 0) return CT_OK;
    int e = posix_fallocate(f->fd, 0, (off_t)f->size);
    if (e == EOPNOTSUPP || e == EINVAL || e == ENOSYS) /* the file system cannot: just size it */
        e = ftruncate(f->fd, (off_t)f->size) == 0 ? 0 : errno;
    if (!e) return CT_OK;
    char need[32], avail[32];
    struct statvfs sv;
    if (e == ENOSPC && fstatvfs(f->fd, &sv) == 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot reserve %s for the swap file: %s (%s free on its file "
                       "system)", f->path, ct_fmt_bytes((double)f->size, need, sizeof need), strerror(e),
                       ct_fmt_bytes((double)(int64_t)sv.f_bavail * (int64_t)sv.f_frsize, avail, sizeof avail));
    if (e == EFBIG)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot reserve %s for the swap file: %s (the file size limit, "
                       "ulimit -f, is below it)", f->path, ct_fmt_bytes((double)f->size, need, sizeof need), strerror(e));
    return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot reserve %s for the swap file: %s", f->path,
                   ct_fmt_bytes((double)f->size, need, sizeof need), strerror(e));
}

/* Some file systems take O_DIRECT at open and refuse it at the first transfer (EINVAL): try one
 * block now, while the file's content does not matter yet. */
static int direct_write_works(const ct_aio *a, int fd) {
    void *blk = ct_aio_alloc(CT_AIO_ALIGN);
    memset(blk, 0, CT_AIO_ALIGN);
    ssize_t r = piece_io(a, fd, true, blk, CT_AIO_ALIGN, 0);
    ct_aio_release(blk);
    return r == CT_AIO_ALIGN ? 0 : r < 0 ? (int)-r : EIO;
}

int ct_aio_create_file(ct_aio *a, const char *path, int64_t size, ct_aio_file *f, ct_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->size = size;
    if (snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path)
        return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", path);
    if (size % CT_AIO_ALIGN) ct_fatal("ct_aio_create_file: size %lld is not a multiple of %d", (long long)size,
                                      CT_AIO_ALIGN);
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    int fd = sys_open(a, path, flags | O_DIRECT, 0600);
    f->direct = fd >= 0;
    if (fd == -EINVAL) { /* the file system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE) */
        f->direct_errno = EINVAL;
        fd = sys_open(a, path, flags, 0600);
    }
    if (fd < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create the swap file: %s", path, strerror(-fd));
    f->fd = fd;
    int rc = reserve(f, err);
    if (!rc && f->direct && size >= CT_AIO_ALIGN) {
        int e = direct_write_works(a, fd);
        if (e == EINVAL) { /* reopen the same file without O_DIRECT */
            int fd2 = sys_open(a, path, O_RDWR | O_CLOEXEC, 0600);
            if (fd2 < 0) {
                rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot reopen the swap file: %s", path, strerror(-fd2));
            } else {
                close(fd);
                f->fd = fd2;
                f->direct = false;
                f->direct_errno = EINVAL;
            }
        } else if (e) {
            rc = ct_errf(err, CT_ERR_RUNTIME, "%s: write of %d bytes at offset 0 failed: %s", path, CT_AIO_ALIGN,
                         strerror(e));
        }
    }
    if (rc) {
        close(f->fd);
        unlink(path);
        f->fd = -1;
    }
    return rc;
}

int ct_aio_check_file(const ct_aio_file *f, ct_err *err) {
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot stat the swap file: %s", f->path, strerror(errno));
    if ((int64_t)st.st_size < f->size)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: the swap file is %lld bytes, expected %lld: it was truncated while "
                       "in use (another process writing under nvme_path?)", f->path, (long long)st.st_size,
                       (long long)f->size);
    return CT_OK;
}

int ct_aio_close_file(ct_aio_file *f, bool unlink_it, ct_err *err) {
    int rc = CT_OK;
    if (f->fd >= 0 && close(f->fd) != 0)
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot close the swap file: %s", f->path, strerror(errno));
    f->fd = -1;
    if (unlink_it && unlink(f->path) != 0 && errno != ENOENT && !rc)
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot remove the swap file: %s", f->path, strerror(errno));
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Jobs                                                                                        */

static void submit(ct_aio *a, ct_aio_job *j, ct_aio_file *f, bool write, void *buf, size_t len, int64_t off,
                   const ct_aio_job *after) {
    if (f->direct && (((uintptr_t)buf | len | (uint64_t)off) % CT_AIO_ALIGN))
        ct_fatal("ct_aio: %s of %zu bytes at offset %lld from %p is not aligned to %d bytes", write ? "write" : "read",
                 len, (long long)off, buf, CT_AIO_ALIGN);
    memset(j, 0, sizeof *j);
    j->file = f;
    j->write = write;
    j->buf = buf;
    j->len = len;
    j->off = off;
    j->after = after;
    pthread_mutex_lock(&a->mu);
    if (len == 0) {
        j->done = true;
    } else {
        if (a->tail) a->tail->next_queued = j;
        else a->head = j;
        a->tail = j;
        pthread_cond_broadcast(&a->work);
    }
    pthread_mutex_unlock(&a->mu);
}

void ct_aio_read(ct_aio *a, ct_aio_job *j, ct_aio_file *f, void *buf, size_t len, int64_t off,
                 const ct_aio_job *after) {
    submit(a, j, f, false, buf, len, off, after);
}

void ct_aio_write(ct_aio *a, ct_aio_job *j, ct_aio_file *f, const void *buf, size_t len, int64_t off,
                  const ct_aio_job *after) {
    submit(a, j, f, true, (void *)buf, len, off, after);
}

bool ct_aio_done(ct_aio *a, const ct_aio_job *j) {
    pthread_mutex_lock(&a->mu);
    bool d = j->done;
    pthread_mutex_unlock(&a->mu);
    return d;
}

static int job_error(const ct_aio_job *j, ct_err *err) {
    const char *op = j->write ? "write" : "read";
    if (j->err_errno)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: %s of %zu bytes at offset %lld failed: %s", j->file->path, op,
                       j->err_len, (long long)j->err_off, strerror(j->err_errno));
    if (!j->write)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: read of %zu bytes at offset %lld found only %zu: the swap file is "
                       "shorter than expected (truncated while in use?)", j->file->path, j->err_len,
                       (long long)j->err_off, j->err_got);
    return ct_errf(err, CT_ERR_RUNTIME, "%s: write of %zu bytes at offset %lld stopped after %zu bytes",
                   j->file->path, j->err_len, (long long)j->err_off, j->err_got);
}

int ct_aio_wait(ct_aio *a, ct_aio_job *j, ct_err *err) {
    pthread_mutex_lock(&a->mu);
    while (!j->done && !cancelled(a)) {
        if (!a->o.cancel) {
            pthread_cond_wait(&a->done, &a->mu);
            continue;
        }
        /* nobody signals the cancel flag to this condition: look at it every 50 ms */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 50 * 1000000L;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&a->done, &a->mu, &t);
    }
    bool done = j->done, failed = j->err_len != 0, was_cancelled = j->cancelled || !done;
    if (!done) drop_queued(a); /* cancelled: what has not started will not */
    pthread_mutex_unlock(&a->mu);
    if (failed) return job_error(j, err);
    if (was_cancelled)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: %s of %zu bytes at offset %lld cancelled (stopping)", j->file->path,
                       j->write ? "write" : "read", j->len, (long long)j->off);
    return CT_OK;
}

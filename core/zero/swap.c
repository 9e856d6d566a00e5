/* swap.c: see swap.h. A pass gives chunk c the buffer c % buffer_count; releasing chunk c queues
 * its writes and, behind them in the I/O engine, the reads of chunk c + buffer_count into the same
 * buffer, so the engine keeps buffer_count - 1 chunks reading ahead without the caller's help. */
#include "core/zero/swap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/report/report.h"
#include "core/util/fs.h"

#define FLOATS_PER_BLOCK (CT_AIO_ALIGN / (int64_t)sizeof(float))
#define DIR_PREFIX "ctrain-swap-"
#define LOCK_NAME ".lock"
#define FILE_SUFFIX ".swap"

/* Chunk c of a pass lives in buffer c % buffer_count: its reads are queued when chunk
 * c - buffer_count is released, behind that chunk's writes from the same buffer. */
typedef struct slot {
    int64_t chunk;               /* the chunk whose reads were queued last (-1: none) */
    bool writes_queued;          /* wjob holds the writes of the chunk before it, not waited for yet */
    float *buf[CT_SWAP_MAX_ARRAYS];
    ct_aio_job rjob[CT_SWAP_MAX_ARRAYS], wjob[CT_SWAP_MAX_ARRAYS];
} slot;

struct ct_swap {
    int n_arrays, buffer_count;
    int64_t n, chunk, n_chunks;
    char dir[4096];
    bool dir_made;               /* dir is this swap's (remove it at close) */
    int lock_fd;
    ct_aio *aio;
    ct_aio_file file[CT_SWAP_MAX_ARRAYS];
    int n_files;                 /* created so far */
    void *mem_raw;               /* the buffers' memory as allocated */
    size_t host_bytes;
    void (*free_fn)(void *ctx, void *p);
    void *alloc_ctx;
    slot *slots;
    /* the pass */
    bool in_pass;
    ct_swap_mode mode;
    unsigned mask;
    int64_t next_give;           /* the chunk ct_swap_next hands out next */
    bool held;                   /* the caller holds chunk next_give */
};

/* ------------------------------------------------------------------------------------------ */
/* Sizes                                                                                       */

static int64_t array_file_bytes(int64_t n) { return ct_aio_round_up(n * (int64_t)sizeof(float)); }

int64_t ct_swap_file_bytes(const ct_swap_opts *o) { return o->n_arrays * array_file_bytes(o->n); }

int64_t ct_swap_chunk_for(const ct_swap_opts *o) {
    if (o->buffer_count < 1 || o->n_arrays < 1 || o->n < 1 || o->host_bytes <= CT_AIO_ALIGN) return 0;
    /* one block of the budget is kept for aligning memory from the caller's allocator */
    int64_t per = (int64_t)((o->host_bytes - CT_AIO_ALIGN) / ((size_t)o->buffer_count * (size_t)o->n_arrays));
    int64_t chunk = per / CT_AIO_ALIGN * FLOATS_PER_BLOCK;
    if (chunk == 0) return 0;
    /* no larger than the array, nor than max_chunk; at least one block (alignment) */
    int64_t cap = (o->n + FLOATS_PER_BLOCK - 1) / FLOATS_PER_BLOCK * FLOATS_PER_BLOCK;
    if (o->max_chunk > 0 && o->max_chunk < cap)
        cap = o->max_chunk < FLOATS_PER_BLOCK ? FLOATS_PER_BLOCK : o->max_chunk / FLOATS_PER_BLOCK * FLOATS_PER_BLOCK;
    return chunk < cap ? chunk : cap;
}

const char *ct_swap_dir(const ct_swap *s) { return s->dir; }
int64_t ct_swap_chunk_elems(const ct_swap *s) { return s->chunk; }
int64_t ct_swap_chunks(const ct_swap *s) { return s->n_chunks; }
size_t ct_swap_host_bytes(const ct_swap *s) { return s->host_bytes; }
ct_aio_counts ct_swap_io_stats(const ct_swap *s) { return ct_aio_stats(s->aio); }

bool ct_swap_direct(const ct_swap *s) {
    for (int k = 0; k < s->n_arrays; k++)
        if (!s->file[k].direct) return false;
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* The directory                                                                               */

int ct_swap_check_dir(const char *path, int64_t bytes, const char *what_key, ct_err *err) {
    const char *key = what_key ? what_key : "nvme_path";
    if (!path || !*path)
        return ct_errf(err, CT_ERR_CONFIG, "%s: not set: NVMe offload needs a directory on the drive to swap to "
                       "(e.g. \"/local_nvme\")", key);
    struct stat st;
    if (stat(path, &st) != 0)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s: %s%s", key, path, strerror(errno),
                       errno == ENOENT ? "; create it (mkdir -p) or give the NVMe drive's mount point" : "");
    if (!S_ISDIR(st.st_mode)) return ct_errf(err, CT_ERR_CONFIG, "%s: %s: not a directory", key, path);
    /* create a file, as the swap will: access(2) says yes to root on a read-only mount */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.ctrain-probe-XXXXXX", path);
    int fd = mkstemp(probe);
    if (fd < 0) return ct_errf(err, CT_ERR_CONFIG, "%s: %s: cannot create files in it: %s", key, path, strerror(errno));
    close(fd);
    unlink(probe);
    struct statvfs sv;
    if (bytes > 0 && statvfs(path, &sv) == 0 && (int64_t)sv.f_bavail * (int64_t)sv.f_frsize < bytes) {
        char need[32], have[32];
        return ct_errf(err, CT_ERR_RUNTIME, "%s: %s: the swap files need %s and its file system has %s free",
                       key, path, ct_fmt_bytes((double)bytes, need, sizeof need),
                       ct_fmt_bytes((double)(int64_t)sv.f_bavail * (int64_t)sv.f_frsize, have, sizeof have));
    }
    return CT_OK;
}

/* Remove what a swap directory holds (its .swap files and lock) and the directory; the bytes
 * freed into *freed. Anything else in it stays, and so does the directory then. */
static int remove_swap_dir(const char *dir, int64_t *freed) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    char p[4400];
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name), sl = strlen(FILE_SUFFIX);
        bool ours = !strcmp(e->d_name, LOCK_NAME) || (len > sl && !strcmp(e->d_name + len - sl, FILE_SUFFIX));
        if (!ours) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        struct stat st;
        if (freed && lstat(p, &st) == 0) *freed += (int64_t)st.st_blocks * 512;
        unlink(p);
    }
    closedir(d);
    return rmdir(dir);
}

/* Directories of swaps whose process died (kill -9, a crash): their lock is free. A directory
 * without a lock file is being created (the lock appears in it locked, by a rename) and stays. */
static void remove_stale(const char *nvme_path, ct_warnings *w) {
    DIR *d = opendir(nvme_path);
    if (!d) return;
    struct dirent *e;
    char sub[4400], lock[4500];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, DIR_PREFIX, strlen(DIR_PREFIX))) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", nvme_path, e->d_name) >= (int)sizeof sub ||
            snprintf(lock, sizeof lock, "%s/%s", sub, LOCK_NAME) >= (int)sizeof lock)
            continue;
        struct stat st;
        if (lstat(sub, &st) != 0 || !S_ISDIR(st.st_mode) || lstat(lock, &st) != 0) continue;
        int fd = -1;
        ct_err ignored = {0};
        if (ct_fs_lock(lock, &fd, NULL, 0, &ignored) || fd < 0) continue; /* alive, or not ours to judge */
        int64_t freed = 0;
        int rc = remove_swap_dir(sub, &freed), e = errno;
        close(fd);
        char g[32];
        if (rc != 0 && e == ENOENT) continue; /* another rank removed it first */
        if (rc == 0)
            ct_warnf(w, "NVMe swap: removed %s (%s), left by a run that ended without cleaning up", sub,
                     ct_fmt_bytes((double)freed, g, sizeof g));
        else
            ct_warnf(w, "NVMe swap: %s was left by a run that ended without cleaning up; its swap files are "
                     "removed, but it holds other files and stays", sub);
    }
    closedir(d);
}

/* The lock appears already locked: it is taken under a temporary name and renamed into place, so
 * remove_stale in another process never finds it free while this one lives. */
static int take_lock(ct_swap *s, ct_err *err) {
    char tmp[4200], lock[4200];
    snprintf(tmp, sizeof tmp, "%s/.lock-new", s->dir);
    snprintf(lock, sizeof lock, "%s/%s", s->dir, LOCK_NAME);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create: %s", tmp, strerror(errno));
    char note[64];
    int len = snprintf(note, sizeof note, "pid %ld\n", (long)getpid());
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || write(fd, note, (size_t)len) != len || rename(tmp, lock) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot take the swap directory's lock: %s", lock, strerror(e));
    }
    s->lock_fd = fd;
    return CT_OK;
}

static int make_dir(ct_swap *s, const ct_swap_opts *o, ct_err *err) {
    if (snprintf(s->dir, sizeof s->dir, "%s/" DIR_PREFIX "%s-rank%d-XXXXXX", o->nvme_path, o->tag ? o->tag : "state",
                 o->rank) >= (int)sizeof s->dir - 64)
        return ct_errf(err, CT_ERR_CONFIG, "nvme_path too long: %s", o->nvme_path);
    if (!mkdtemp(s->dir)) /* mode 0700, a name no other process has */
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create the swap directory: %s", o->nvme_path, strerror(errno));
    s->dir_made = true;
    return take_lock(s, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Open and close                                                                              */

static bool name_ok(const char *name) {
    if (!name || !*name || strlen(name) > 64 || name[0] == '.') return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '.' || *p == '-'))
            return false;
    return true;
}

static void alloc_buffers(ct_swap *s, const ct_swap_opts *o) {
    size_t per = (size_t)s->chunk * sizeof(float);
    s->host_bytes = per * (size_t)s->n_arrays * (size_t)s->buffer_count;
    char *base;
    if (o->alloc) { /* any alignment: take one block more and align inside */
        s->mem_raw = o->alloc(o->alloc_ctx, s->host_bytes + CT_AIO_ALIGN);
        if (!s->mem_raw) ct_die_oom(s->host_bytes + CT_AIO_ALIGN);
        base = (char *)ct_aio_round_up((int64_t)(uintptr_t)s->mem_raw);
        s->free_fn = o->free;
        s->alloc_ctx = o->alloc_ctx;
    } else {
        s->mem_raw = ct_aio_alloc(s->host_bytes);
        base = s->mem_raw;
    }
    s->slots = ct_xcalloc((size_t)s->buffer_count, sizeof *s->slots);
    for (int b = 0; b < s->buffer_count; b++) {
        s->slots[b].chunk = -1;
        for (int k = 0; k < s->n_arrays; k++)
            s->slots[b].buf[k] = (float *)(base + ((size_t)b * (size_t)s->n_arrays + (size_t)k) * per);
    }
}

int ct_swap_open(const ct_swap_opts *o, ct_swap **out, ct_warnings *w, ct_err *err) {
    *out = NULL;
    if (o->n_arrays < 1 || o->n_arrays > CT_SWAP_MAX_ARRAYS || o->n < 1 || o->buffer_count < 1)
        ct_fatal("ct_swap_open: %d arrays of %lld elements, %d buffers", o->n_arrays, (long long)o->n,
                 o->buffer_count);
    for (int k = 0; k < o->n_arrays; k++)
        if (!name_ok(o->names[k])) ct_fatal("ct_swap_open: array name \"%s\"", o->names[k] ? o->names[k] : "(null)");
    int64_t chunk = ct_swap_chunk_for(o);
    if (chunk == 0)
        return ct_errf(err, CT_ERR_CONFIG, "NVMe swap: a host budget of %zu bytes is too small for %d buffers of %d "
                       "arrays; it needs at least %lld bytes (one %d-byte block each, and one to align them)", o->host_bytes,
                       o->buffer_count, o->n_arrays, (long long)(o->buffer_count * o->n_arrays + 1) * CT_AIO_ALIGN,
                       CT_AIO_ALIGN);
    int rc = ct_swap_check_dir(o->nvme_path, ct_swap_file_bytes(o), "nvme_path", err);
    if (rc) return rc;
    remove_stale(o->nvme_path, w);

    ct_swap *s = ct_xcalloc(1, sizeof *s);
    s->n_arrays = o->n_arrays;
    s->buffer_count = o->buffer_count;
    s->n = o->n;
    s->chunk = chunk;
    s->n_chunks = (o->n + chunk - 1) / chunk;
    s->lock_fd = -1;
    rc = ct_aio_create(&o->aio, &s->aio, err);
    if (!rc) rc = make_dir(s, o, err);
    for (int k = 0; !rc && k < o->n_arrays; k++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s" FILE_SUFFIX, s->dir, o->names[k]);
        rc = ct_aio_create_file(s->aio, path, array_file_bytes(o->n), &s->file[k], err);
        if (!rc) s->n_files++;
    }
    if (rc) {
        ct_swap_close(s, NULL);
        return rc;
    }
    if (!ct_swap_direct(s)) {
        int k = 0;
        while (s->file[k].direct) k++;
        ct_warnf(w, "NVMe swap: %s: the file system refuses direct I/O (O_DIRECT: %s); using buffered I/O, so the "
                 "page cache holds swapped state too and host memory use can exceed the swap's budget", s->dir,
                 strerror(s->file[k].direct_errno));
    }
    alloc_buffers(s, o);
    *out = s;
    return CT_OK;
}

int ct_swap_close(ct_swap *s, ct_err *err) {
    if (!s) return CT_OK;
    ct_err local = {0};
    if (s->in_pass) ct_swap_end(s, &local);
    ct_aio_free(s->aio); /* joins the workers: no buffer is in use after this */
    int rc = local.code;
    for (int k = 0; k < s->n_files; k++) {
        int r = ct_aio_close_file(&s->file[k], true, rc ? NULL : &local);
        if (!rc) rc = r;
    }
    if (s->dir_made) {
        char lock[4200];
        snprintf(lock, sizeof lock, "%s/%s", s->dir, LOCK_NAME);
        unlink(lock);
        if (s->lock_fd >= 0) close(s->lock_fd);
        if (rmdir(s->dir) != 0 && !rc)
            rc = ct_errf(&local, CT_ERR_RUNTIME, "%s: cannot remove the swap directory: %s", s->dir, strerror(errno));
    }
    if (s->mem_raw) {
        if (s->free_fn) s->free_fn(s->alloc_ctx, s->mem_raw);
        else ct_aio_release(s->mem_raw);
    }
    free(s->slots);
    free(s);
    if (rc && err) *err = local;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Passes                                                                                      */

static int64_t chunk_lo(const ct_swap *s, int64_t c) { return c * s->chunk; }
static int64_t chunk_n(const ct_swap *s, int64_t c) {
    int64_t left = s->n - chunk_lo(s, c);
    return left < s->chunk ? left : s->chunk;
}
static size_t chunk_io(const ct_swap *s, int64_t c) {
    return (size_t)ct_aio_round_up(chunk_n(s, c) * (int64_t)sizeof(float));
}
static bool in_mask(const ct_swap *s, int k) { return (s->mask >> k) & 1u; }
static slot *slot_of(ct_swap *s, int64_t c) { return &s->slots[c % s->buffer_count]; }

/* Queue the reads of chunk c into its slot, each behind the write still taking from that array's
 * buffer (the chunk buffer_count before it). FILL reads nothing. */
static void queue_reads(ct_swap *s, int64_t c) {
    slot *sl = slot_of(s, c);
    bool writing = sl->writes_queued;
    for (int k = 0; k < s->n_arrays; k++) {
        memset(&sl->rjob[k], 0, sizeof sl->rjob[k]);
        if (!in_mask(s, k)) continue;
        if (s->mode == CT_SWAP_FILL) sl->rjob[k].done = true;
        else ct_aio_read(s->aio, &sl->rjob[k], &s->file[k], sl->buf[k], chunk_io(s, c),
                         chunk_lo(s, c) * (int64_t)sizeof(float), writing ? &sl->wjob[k] : NULL);
    }
    sl->chunk = c;
}

/* Wait for the jobs of one set (a slot's reads or its writes) of the arrays in the pass: the
 * first error. */
static int wait_jobs(ct_swap *s, ct_aio_job *jobs, ct_err *err) {
    int rc = CT_OK;
    for (int k = 0; k < s->n_arrays; k++) {
        if (!in_mask(s, k)) continue;
        ct_err e = {0};
        int r = ct_aio_wait(s->aio, &jobs[k], &e);
        if (r && !rc) {
            rc = r;
            if (err) *err = e;
        }
    }
    return rc;
}

int ct_swap_begin(ct_swap *s, ct_swap_mode mode, unsigned mask, ct_err *err) {
    if (s->in_pass) ct_fatal("ct_swap_begin: %s: a pass is already running", s->dir);
    mask &= (1u << s->n_arrays) - 1;
    for (int k = 0; k < s->n_arrays; k++) {
        if (!((mask >> k) & 1u)) continue;
        int rc = ct_aio_check_file(&s->file[k], err);
        if (rc) return rc;
    }
    s->in_pass = true;
    s->mode = mode;
    s->mask = mask;
    s->next_give = 0;
    s->held = false;
    for (int b = 0; b < s->buffer_count; b++) s->slots[b].writes_queued = false;
    for (int64_t c = 0; c < s->buffer_count && c < s->n_chunks; c++) queue_reads(s, c);
    return CT_OK;
}

int ct_swap_next(ct_swap *s, ct_swap_chunk *c, ct_err *err) {
    memset(c, 0, sizeof *c);
    if (!s->in_pass || s->held)
        ct_fatal("ct_swap_next: %s: %s", s->dir, s->in_pass ? "the previous chunk was not released" : "no pass");
    int64_t ci = s->next_give;
    c->index = ci;
    if (ci == s->n_chunks) return CT_OK;
    slot *sl = slot_of(s, ci);
    s->held = true;
    /* the write of the chunk this buffer held before (FILL: nothing else orders it), then the reads */
    int rc = sl->writes_queued ? wait_jobs(s, sl->wjob, err) : CT_OK;
    sl->writes_queued = false;
    int r = wait_jobs(s, sl->rjob, rc ? NULL : err);
    if (!rc) rc = r;
    c->lo = chunk_lo(s, ci);
    c->n = chunk_n(s, ci);
    for (int k = 0; k < s->n_arrays; k++) {
        c->a[k] = in_mask(s, k) ? sl->buf[k] : NULL;
        if (c->a[k] && s->mode == CT_SWAP_FILL) /* the padding after the array's end: defined bytes */
            memset(c->a[k] + c->n, 0, chunk_io(s, ci) - (size_t)c->n * sizeof(float));
    }
    return rc;
}

int ct_swap_release(ct_swap *s, ct_swap_chunk *c, ct_err *err) {
    if (!s->in_pass || !s->held || c->index != s->next_give)
        ct_fatal("ct_swap_release: %s: chunk %lld is not the one held", s->dir, (long long)c->index);
    int64_t ci = s->next_give++;
    slot *sl = slot_of(s, ci);
    s->held = false;
    if (s->mode != CT_SWAP_READ) {
        for (int k = 0; k < s->n_arrays; k++)
            if (in_mask(s, k))
                ct_aio_write(s->aio, &sl->wjob[k], &s->file[k], sl->buf[k], chunk_io(s, ci),
                             chunk_lo(s, ci) * (int64_t)sizeof(float), NULL);
        sl->writes_queued = true;
    }
    if (ci + s->buffer_count < s->n_chunks) queue_reads(s, ci + s->buffer_count);
    memset(c, 0, sizeof *c);
    return CT_OK;
}

int ct_swap_end(ct_swap *s, ct_err *err) {
    if (!s->in_pass) return CT_OK;
    int rc = CT_OK;
    for (int b = 0; b < s->buffer_count; b++) {
        slot *sl = &s->slots[b];
        /* reads queued ahead that nobody took: waited for (their buffers), never an error */
        if (sl->chunk >= s->next_give) wait_jobs(s, sl->rjob, NULL);
        if (sl->writes_queued) {
            int r = wait_jobs(s, sl->wjob, rc ? NULL : err);
            if (!rc) rc = r;
            sl->writes_queued = false;
        }
        sl->chunk = -1;
    }
    s->in_pass = false;
    s->held = false;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Any range, between passes                                                                   */

/* The buffers' memory as one bounce buffer (they are contiguous, from slot 0's first array). */
static char *bounce(const ct_swap *s) { return (char *)s->slots[0].buf[0]; }
static int64_t bounce_bytes(const ct_swap *s) { return (int64_t)s->host_bytes / CT_AIO_ALIGN * CT_AIO_ALIGN; }

static void check_range(const ct_swap *s, const char *what, int k, int64_t at, int64_t n) {
    if (s->in_pass || k < 0 || k >= s->n_arrays || at < 0 || n < 0 || at > s->n - n)
        ct_fatal("%s: %s: array %d, [%lld, +%lld) of %lld%s", what, s->dir, k, (long long)at, (long long)n,
                 (long long)s->n, s->in_pass ? " during a pass" : "");
}

/* One synchronous job of the engine: len bytes at off of array k's file, from or into buf. */
static int io_now(ct_swap *s, bool write, int k, char *buf, int64_t len, int64_t off, ct_err *err) {
    ct_aio_job j;
    memset(&j, 0, sizeof j);
    if (write) ct_aio_write(s->aio, &j, &s->file[k], buf, (size_t)len, off, NULL);
    else ct_aio_read(s->aio, &j, &s->file[k], buf, (size_t)len, off, NULL);
    return ct_aio_wait(s->aio, &j, err);
}

/* The file bytes [lo0, hi0) of array k, widened to whole blocks, go through the bounce buffer in
 * pieces: into out (a read) or from in (a write), whose byte 0 is the file's byte lo0. */
static int range_io(ct_swap *s, int k, int64_t lo0, int64_t hi0, char *out, const char *in, ct_err *err) {
    bool write = in != NULL;
    int64_t a = lo0 / CT_AIO_ALIGN * CT_AIO_ALIGN, b = ct_aio_round_up(hi0), step = bounce_bytes(s);
    char *buf = bounce(s);
    int rc = CT_OK;
    for (int64_t pa = a; pa < b && !rc; pa += step) {
        int64_t pb = b - pa < step ? b : pa + step;
        int64_t lo = lo0 > pa ? lo0 : pa, hi = hi0 < pb ? hi0 : pb;
        if (!write) {
            rc = io_now(s, false, k, buf, pb - pa, pa, err);
            if (!rc) memcpy(out + (lo - lo0), buf + (lo - pa), (size_t)(hi - lo));
            continue;
        }
        /* a block the range only partly covers keeps the bytes around it: read it first */
        if (lo > pa) rc = io_now(s, false, k, buf, CT_AIO_ALIGN, pa, err);
        int64_t last = pb - CT_AIO_ALIGN;
        if (!rc && hi < pb && (last > pa || lo == pa)) rc = io_now(s, false, k, buf + (last - pa), CT_AIO_ALIGN, last, err);
        if (rc) break;
        memcpy(buf + (lo - pa), in + (lo - lo0), (size_t)(hi - lo));
        rc = io_now(s, true, k, buf, pb - pa, pa, err);
    }
    return rc;
}

int ct_swap_read(ct_swap *s, int k, int64_t at, int64_t n, float *dst, ct_err *err) {
    check_range(s, "ct_swap_read", k, at, n);
    if (n == 0) return CT_OK;
    int rc = ct_aio_check_file(&s->file[k], err);
    return rc ? rc : range_io(s, k, at * (int64_t)sizeof(float), (at + n) * (int64_t)sizeof(float), (char *)dst, NULL, err);
}

int ct_swap_write(ct_swap *s, int k, int64_t at, int64_t n, const float *src, ct_err *err) {
    check_range(s, "ct_swap_write", k, at, n);
    if (n == 0) return CT_OK;
    int rc = ct_aio_check_file(&s->file[k], err);
    return rc ? rc : range_io(s, k, at * (int64_t)sizeof(float), (at + n) * (int64_t)sizeof(float), NULL, (const char *)src, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Whole arrays                                                                                */

static int one_pass(ct_swap *s, ct_swap_mode mode, int k, ct_swap_fill_fn fill, ct_swap_drain_fn drain, void *ctx,
                    ct_err *err) {
    int rc = ct_swap_begin(s, mode, 1u << k, err);
    ct_swap_chunk c;
    while (!rc && !(rc = ct_swap_next(s, &c, err)) && c.n) {
        rc = mode == CT_SWAP_FILL ? fill(ctx, k, c.lo, c.n, c.a[k], err) : drain(ctx, k, c.lo, c.n, c.a[k], err);
        if (!rc) rc = ct_swap_release(s, &c, err);
    }
    ct_err e2 = {0};
    int r = ct_swap_end(s, &e2);
    if (!rc && r) {
        rc = r;
        if (err) *err = e2;
    }
    return rc;
}

int ct_swap_fill(ct_swap *s, unsigned mask, ct_swap_fill_fn fill, void *ctx, ct_err *err) {
    int rc = CT_OK;
    for (int k = 0; !rc && k < s->n_arrays; k++)
        if ((mask >> k) & 1u) rc = one_pass(s, CT_SWAP_FILL, k, fill, NULL, ctx, err);
    return rc;
}

int ct_swap_drain(ct_swap *s, unsigned mask, ct_swap_drain_fn drain, void *ctx, ct_err *err) {
    int rc = CT_OK;
    for (int k = 0; !rc && k < s->n_arrays; k++)
        if ((mask >> k) & 1u) rc = one_pass(s, CT_SWAP_READ, k, NULL, drain, ctx, err);
    return rc;
}

static int copy_in(void *ctx, int k, int64_t lo, int64_t n, float *dst, ct_err *err) {
    memcpy(dst, ((const float *const *)ctx)[k] + lo, (size_t)n * sizeof(float));
    return CT_OK;
}

static int copy_out(void *ctx, int k, int64_t lo, int64_t n, const float *src, ct_err *err) {
    memcpy(((float *const *)ctx)[k] + lo, src, (size_t)n * sizeof(float));
    return CT_OK;
}

int ct_swap_load_host(ct_swap *s, unsigned mask, const float *const *src, ct_err *err) {
    return ct_swap_fill(s, mask, copy_in, (void *)src, err);
}

int ct_swap_store_host(ct_swap *s, unsigned mask, float *const *dst, ct_err *err) {
    return ct_swap_drain(s, mask, copy_out, (void *)dst, err);
}

/* fs.c: see fs.h. */
#include "core/util/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

ssize_t ct_fs_read_at(int fd, void *buf, size_t n, int64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int ct_fs_open_input(const char *path) { return open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); }

static const char *file_kind(unsigned mode) {
    return S_ISFIFO(mode) ? "a FIFO" : S_ISSOCK(mode) ? "a socket" : S_ISCHR(mode) ? "a character device"
           : S_ISBLK(mode) ? "a block device" : S_ISDIR(mode) ? "a directory" : "a special file";
}

int ct_fs_not_regular(ct_err *err, int code, const char *path, unsigned mode, const char *what) {
    return ct_errf(err, code, "%s: %s, not a regular file%s%s%s: ctrain reads data and weights from regular files "
                   "only (%s)", path, file_kind(mode), what ? " (expected " : "", what ? what : "", what ? ")" : "",
                   S_ISFIFO(mode) || S_ISSOCK(mode) ? "a pipe blocks until a writer comes and cannot be read twice"
                   : S_ISDIR(mode) ? "name a file in it" : "a device has no size");
}

int ct_fs_open_regular(const char *path, int code, const char *what, int *fd, ct_err *err) {
    *fd = ct_fs_open_input(path);
    if (*fd < 0) return ct_errf(err, ct_err_io(errno, code), "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = CT_OK;
    if (fstat(*fd, &st) != 0) rc = ct_errf(err, ct_err_io(errno, code), "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = ct_fs_not_regular(err, code, path, st.st_mode, what);
    if (rc) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int ct_fs_write_error(ct_err *err, const char *path, const char *op, int e) {
    ct_errf(err, CT_ERR_RUNTIME, "%s: %s failed: %s", path, op, strerror(e));
    struct rlimit rl;
    if (e == ENOSPC)
        ct_err_append(err, "  The file system holding it is full: free space there, or write elsewhere.");
    else if (e == EDQUOT)
        ct_err_append(err, "  Your disk quota there is used up: free space, or write elsewhere.");
    else if (e == EFBIG && getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        ct_err_append(err, "  The file-size limit of this process (ulimit -f) is %llu bytes: raise it (ulimit -f "
                      "unlimited) and run again.", (unsigned long long)rl.rlim_cur);
    else if (e == EFBIG)
        ct_err_append(err, "  The file is larger than the file system or the process allows.");
    return CT_ERR_RUNTIME;
}

int ct_fs_join(char *out, size_t n, const char *a, const char *b, ct_err *err) {
    int k = snprintf(out, n, "%s/%s", a, b);
    if (k < 0 || (size_t)k >= n)
        return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s/%s", a, b);
    return CT_OK;
}

int ct_fs_mkdirs(const char *path, ct_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create directory: %s", tmp,
                           strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create directory: %s", tmp, strerror(errno));
    if (!ct_fs_is_dir(tmp)) return ct_errf(err, CT_ERR_RUNTIME, "%s: not a directory", tmp);
    return CT_OK;
}

int ct_fs_fsync(int fd) {
    /* a device, a FIFO or a terminal has nothing to flush to a disk: EINVAL (or EROFS) */
    return fsync(fd) == 0 || errno == EINVAL || errno == EROFS ? 0 : -1;
}

/* ct_fs_write_sync of `path`, its errors naming `shown` (the file an atomic write replaces, not its
 * temporary name). */
static int write_sync_as(const char *path, const char *shown, const void *data, size_t len, ct_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create: %s", shown, strerror(errno));
    const char *p = data;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : ENOSPC;   /* no progress: nothing more fits */
            close(fd);
            return ct_fs_write_error(err, shown, "write", e);
        }
        p += k;
        len -= (size_t)k;
    }
    if (ct_fs_fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return ct_fs_write_error(err, shown, "fsync", e);
    }
    if (close(fd) != 0) return ct_fs_write_error(err, shown, "close", errno);
    return CT_OK;
}

int ct_fs_write_sync(const char *path, const void *data, size_t len, ct_err *err) {
    return write_sync_as(path, path, data, len, err);
}

int ct_fs_sync_dir(const char *path, ct_err *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot open directory: %s", path,
                               strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* Some file systems refuse fsync on directories (EINVAL); the data is then as safe as it gets. */
    if (rc != 0 && e != EINVAL)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: fsync failed: %s", path, strerror(e));
    return CT_OK;
}

char *ct_fs_read_small(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = ct_xmalloc(max + 2);
    size_t n = fread(buf, 1, max + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > max) {
        free(buf);
        errno = bad ? EIO : EFBIG;
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int fs_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    int rc = (flag == FTW_DP || flag == FTW_D) ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

int ct_fs_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    return nftw(path, fs_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

bool ct_fs_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool ct_fs_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void ct_fs_parent(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* The temporary name ct_fs_write_atomic writes first (in the same directory, so the rename is
 * atomic); ct_fs_check_output_file probes the same name. */
static int tmp_name(const char *path, char *out, size_t n, ct_err *err) {
    int k = snprintf(out, n, "%s.tmp-%ld", path, (long)getpid());
    if (k < 0 || (size_t)k >= n) return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", path);
    return CT_OK;
}

/* Where an output named `path` really goes. A symbolic link to a regular file, or to nothing yet:
 * the file it names, so the link stays a link (renaming over it would replace the link itself, and
 * a link in /dev such as /dev/stdout with it). Something that is not a regular file (/dev/null,
 * /dev/full, a FIFO, a terminal): a stream, written in place through the name (renaming over a
 * device would replace the device: `--summary /dev/null` as root turned /dev/null into a regular
 * file). Else path itself. */
typedef struct output_target {
    char path[PATH_MAX];
    bool stream;
} output_target;

static int resolve_output(const char *path, output_target *t, ct_err *err) {
    struct stat st, lst;
    bool exists = stat(path, &st) == 0, link = lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode);
    t->stream = exists && !S_ISREG(st.st_mode);
    if (exists && S_ISDIR(st.st_mode)) return ct_errf(err, CT_ERR_RUNTIME, "%s: is a directory", path);
    if (link && exists && !t->stream) {
        if (!realpath(path, t->path))
            return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot resolve the link: %s", path, strerror(errno));
        return CT_OK;
    }
    if (link && !exists) {   /* the name it holds, relative to the link's directory */
        char to[PATH_MAX], dir[PATH_MAX];
        ssize_t k = readlink(path, to, sizeof to - 1);
        if (k < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot read the link: %s", path, strerror(errno));
        to[k] = '\0';
        ct_fs_parent(path, dir, sizeof dir);
        int n = to[0] == '/' ? snprintf(t->path, sizeof t->path, "%s", to)
                             : snprintf(t->path, sizeof t->path, "%s/%s", dir, to);
        return n < (int)sizeof t->path ? CT_OK : ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", path);
    }
    if (snprintf(t->path, sizeof t->path, "%s", path) >= (int)sizeof t->path)
        return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", path);
    return CT_OK;
}

int ct_fs_out_begin(const char *path, ct_fs_out *o, ct_err *err) {
    output_target t;
    int rc = resolve_output(path, &t, err);
    if (rc) return rc;
    o->in_place = t.stream;
    snprintf(o->final, sizeof o->final, "%s", t.path);
    if (o->in_place) {
        snprintf(o->write_to, sizeof o->write_to, "%s", path);   /* through the name */
        return CT_OK;
    }
    return tmp_name(o->final, o->write_to, sizeof o->write_to, err);
}

int ct_fs_out_commit(const ct_fs_out *o, int rc, ct_err *err) {
    if (o->in_place) return rc;
    if (rc) {
        unlink(o->write_to);
        return rc;
    }
    if (rename(o->write_to, o->final) != 0) {
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot rename to %s: %s", o->write_to, o->final,
                     strerror(errno));
        unlink(o->write_to);
        return rc;
    }
    char dir[4096];
    ct_fs_parent(o->final, dir, sizeof dir);
    return ct_fs_sync_dir(dir, err);
}

int ct_fs_write_atomic(const char *path, const void *data, size_t len, ct_err *err) {
    ct_fs_out o;
    int rc = ct_fs_out_begin(path, &o, err);
    if (rc) return rc;
    return ct_fs_out_commit(&o, write_sync_as(o.write_to, path, data, len, err), err);
}

int ct_fs_replace_file(const char *dir, const char *name, const void *data, size_t len,
                       ct_err *err) {
    char path[4096];
    int rc = ct_fs_join(path, sizeof path, dir, name, err);
    return rc ? rc : ct_fs_write_atomic(path, data, len, err);
}

bool ct_fs_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

bool ct_fs_resolve(const char *path, char *out, size_t n) {
    char buf[PATH_MAX];
    if (realpath(path, buf)) return (size_t)snprintf(out, n, "%s", buf) < n;
    /* not there yet: its parent, resolved, plus its name */
    char parent[PATH_MAX];
    ct_fs_parent(path, parent, sizeof parent);
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    if (!realpath(parent, buf) || !*name || !strcmp(name, ".") || !strcmp(name, "..")) return false;
    return (size_t)snprintf(out, n, "%s/%s", strcmp(buf, "/") ? buf : "", name) < n;
}

bool ct_fs_within(const char *path, const char *dir) {
    char p[PATH_MAX], d[PATH_MAX];
    if (!ct_fs_resolve(path, p, sizeof p) || !ct_fs_resolve(dir, d, sizeof d)) return false;
    size_t n = strlen(d);
    if (n == 1) return true; /* dir is "/" */
    return strncmp(p, d, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

/* Create and remove `probe`: the one test that sees every reason a file cannot be made there
 * (permissions, a read-only mount, no inodes), also for root, whom access(2) would let pass. */
static int probe_create(const char *probe, const char *what, ct_err *err) {
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create files there: %s", what,
                       strerror(errno));
    close(fd);
    unlink(probe);
    return CT_OK;
}

int ct_fs_check_dir_writable(const char *dir, ct_err *err) {
    int rc = ct_fs_mkdirs(dir, err);
    if (rc) return rc;
    char probe[4200];
    if (snprintf(probe, sizeof probe, "%s/.ctrain-probe-%ld", dir, (long)getpid()) >=
        (int)sizeof probe)
        return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", dir);
    return probe_create(probe, dir, err);
}

int ct_fs_check_output_file(const char *name, ct_err *err) {
    char dir[4096], tmp[PATH_MAX + 32];
    output_target t;
    int rc = resolve_output(name, &t, err);
    if (rc) return rc;
    if (t.stream) {
        struct stat st;
        /* a FIFO is left alone (opening it for writing waits for, or without O_NONBLOCK fails
         * for lack of, a reader that may come by the end); a device must open for writing */
        if (stat(name, &st) == 0 && S_ISFIFO(st.st_mode)) return CT_OK;
        int fd = open(name, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) close(fd);
        return fd >= 0 ? CT_OK
               : ct_errf(err, CT_ERR_RUNTIME, "%s: cannot open for writing: %s", name, strerror(errno));
    }
    const char *path = t.path;
    ct_fs_parent(path, dir, sizeof dir);
    struct stat st;
    if (stat(dir, &st) != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: directory %s: %s", path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ct_errf(err, CT_ERR_RUNTIME, "%s: %s is not a directory", path, dir);
    rc = tmp_name(path, tmp, sizeof tmp, err);
    return rc ? rc : probe_create(tmp, path, err);
}

int ct_fs_lock(const char *path, int *fd, char *note, size_t note_n, ct_err *err) {
    *fd = -1;
    if (note && note_n) note[0] = 0;
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot open: %s", path, strerror(errno));
    int locked = flock(f, LOCK_EX | LOCK_NB);
    int e = errno;
    if (note && note_n) {
        ssize_t k = pread(f, note, note_n - 1, 0);
        note[k > 0 ? k : 0] = 0;
    }
    if (locked == 0) {
        *fd = f;
        return CT_OK;
    }
    close(f);
    if (e == EWOULDBLOCK) return CT_OK;
    return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot lock: %s", path, strerror(e));
}

int ct_fs_lock_note(int fd, const char *path, const char *note, ct_err *err) {
    size_t len = strlen(note);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, note, len, 0) != (ssize_t)len)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot write: %s", path, strerror(errno));
    return CT_OK;
}

/* fs.c: see fs.h. */
#include "core/util/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int ct_fs_write_sync(const char *path, const void *data, size_t len, ct_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create: %s", path, strerror(errno));
    const char *p = data;
    while (len > 0) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = errno;
            close(fd);
            return ct_errf(err, CT_ERR_RUNTIME, "%s: write failed: %s", path, strerror(e));
        }
        p += k;
        len -= (size_t)k;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: close failed: %s", path, strerror(errno));
    return CT_OK;
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

int ct_fs_replace_file(const char *dir, const char *name, const void *data, size_t len,
                       ct_err *err) {
    char path[4096], tmp[4200];
    int rc = ct_fs_join(path, sizeof path, dir, name, err);
    if (rc) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    rc = ct_fs_write_sync(tmp, data, len, err);
    if (rc) {
        unlink(tmp);
        return rc;
    }
    if (rename(tmp, path) != 0) {
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot rename to %s: %s", tmp, path,
                     strerror(errno));
        unlink(tmp);
        return rc;
    }
    return ct_fs_sync_dir(dir, err);
}

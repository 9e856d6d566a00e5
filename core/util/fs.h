/* fs.h: small file-system helpers: paths, mkdir -p, durable writes and renames (checkpoints,
 * shards, pack). */
#ifndef CT_UTIL_FS_H
#define CT_UTIL_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/util/common.h"

/* Read n bytes at offset off of fd (pread, retried on EINTR and short reads): the bytes read, fewer
 * than n only at the end of the file, or -1 with errno set. */
ssize_t ct_fs_read_at(int fd, void *buf, size_t n, int64_t off);
/* open(2) of an input (a data file, weights) for reading, with O_NONBLOCK: a FIFO opens at once
 * instead of blocking until a writer comes (reads of a regular file do not care); the caller then
 * refuses what fstat says is not a regular file, with ct_fs_not_regular. fd, or -1 with errno. */
int ct_fs_open_input(const char *path);
/* ct_fs_open_input and the check: *fd of a regular file and CT_OK, or *fd = -1 and `code` for a
 * file that is not regular (ct_err_io(errno, code) when it cannot be opened), err naming it. `what`
 * (may be NULL): what the file should be, for the message ("an HDF5 file"). */
int ct_fs_open_regular(const char *path, int code, const char *what, int *fd, ct_err *err);
/* "PATH: not a regular file but a FIFO (...)" as `code`, for an input whose mode is not S_IFREG. */
int ct_fs_not_regular(ct_err *err, int code, const char *path, unsigned mode, const char *what);
/* Why a write failed with errno e, as an error naming path and the operation ("write", "fsync"):
 * a full disk (ENOSPC), a quota (EDQUOT) or the file-size limit (EFBIG: ulimit -f, with its value)
 * get a line saying so and what to do. CT_ERR_RUNTIME. */
int ct_fs_write_error(ct_err *err, const char *path, const char *op, int e);

/* a + "/" + b into out; CT_ERR_RUNTIME when it does not fit. */
int ct_fs_join(char *out, size_t n, const char *a, const char *b, ct_err *err);
/* mkdir -p (mode 0755). */
int ct_fs_mkdirs(const char *path, ct_err *err);
/* fsync(2) that succeeds for files that cannot be synced (a device, a FIFO: EINVAL, EROFS);
 * -1 with errno set otherwise. */
int ct_fs_fsync(int fd);
/* Write the whole file (truncate), fsync, close. */
int ct_fs_write_sync(const char *path, const void *data, size_t len, ct_err *err);
/* fsync a directory so renames and creations inside it are durable. */
int ct_fs_sync_dir(const char *path, ct_err *err);
/* Read a whole file of at most max bytes, NUL-terminated (caller frees); NULL with errno set
 * (EFBIG when larger). */
char *ct_fs_read_small(const char *path, size_t max, size_t *len);
/* Remove a file or a directory tree (no symlinks followed). Missing: success. */
int ct_fs_remove_tree(const char *path);
bool ct_fs_is_dir(const char *path);
bool ct_fs_exists(const char *path);
/* The directory part of path into out: "a/b" for "a/b/c", "." for "c", "/" for "/c". */
void ct_fs_parent(const char *path, char *out, size_t n);
/* Write path atomically: path.tmp-<pid>, fsync, rename over path, fsync its directory. A reader
 * sees the old content or the new, never a part; on failure the old file is untouched. A symbolic
 * link to a file: the file it names is replaced, the link stays. Not a regular file (/dev/null,
 * /dev/stdout to a pipe, a FIFO) or a link that names nothing yet: written in place through the
 * name (a device is never replaced). A directory: an error. */
int ct_fs_write_atomic(const char *path, const void *data, size_t len, ct_err *err);
/* The same for a file another writer produces (a large file written piece by piece):
 * ct_fs_out_begin says where to write (write_to: a temporary name beside the final file, or the
 * name itself for a device or FIFO), ct_fs_out_commit(o, rc) takes the writer's result and puts
 * the file in place (rename, directory fsync), or removes the temporary when rc failed. */
typedef struct ct_fs_out {
    char write_to[4200];
    char final[4096];            /* the file replaced: path, or the file a link to it names */
    bool in_place;
} ct_fs_out;
int ct_fs_out_begin(const char *path, ct_fs_out *o, ct_err *err);
int ct_fs_out_commit(const ct_fs_out *o, int rc, ct_err *err);
/* ct_fs_write_atomic of dir/name. */
int ct_fs_replace_file(const char *dir, const char *name, const void *data, size_t len,
                       ct_err *err);
/* True when both paths exist and are the same file (device and inode, symlinks followed): two
 * names, a hard link or a symlink of one file compare equal. */
bool ct_fs_same_file(const char *a, const char *b);
/* path made absolute with links resolved (realpath), also when path itself does not exist yet
 * (its parent must): false when it cannot be resolved or does not fit in n. */
bool ct_fs_resolve(const char *path, char *out, size_t n);
/* True when path is dir or lies below it, both resolved with ct_fs_resolve (false when either
 * cannot be). */
bool ct_fs_within(const char *path, const char *dir);
/* Create dir (mkdir -p) and check that files can be created in it (a probe file is created and
 * removed), so an unwritable output directory is found before the work that fills it.
 * CT_ERR_RUNTIME naming the path and the reason. */
int ct_fs_check_dir_writable(const char *dir, ct_err *err);
/* Check that ct_fs_write_atomic(path) can succeed without touching path: path is not a
 * directory, its directory exists, and the temporary name can be created there (created and
 * removed); a device must open for writing (a FIFO is not opened). CT_ERR_RUNTIME naming the
 * path and the reason. */
int ct_fs_check_output_file(const char *path, ct_err *err);
/* An exclusive lock on path (created 0644 when missing), taken without waiting with flock(2):
 * the kernel drops it when *fd is closed or the process dies, so a killed holder never leaves a
 * stale lock. note (may be NULL) receives the file's text: what the holder, or the last holder,
 * wrote with ct_fs_lock_note. Taken: *fd holds it. Held by another open file (another process,
 * or another open in this one): *fd = -1 and CT_OK. I/O errors: CT_ERR_RUNTIME naming the path. */
int ct_fs_lock(const char *path, int *fd, char *note, size_t note_n, ct_err *err);
/* Replace the text of a lock file taken with ct_fs_lock (path: for messages). */
int ct_fs_lock_note(int fd, const char *path, const char *note, ct_err *err);

#endif

/* fs.h: small file-system helpers: paths, mkdir -p, durable writes and renames (checkpoints,
 * shards, pack). */
#ifndef CT_UTIL_FS_H
#define CT_UTIL_FS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/util/common.h"

/* a + "/" + b into out; CT_ERR_RUNTIME when it does not fit. */
int ct_fs_join(char *out, size_t n, const char *a, const char *b, ct_err *err);
/* mkdir -p (mode 0755). */
int ct_fs_mkdirs(const char *path, ct_err *err);
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
 * sees the old content or the new, never a part; on failure the old file is untouched. */
int ct_fs_write_atomic(const char *path, const void *data, size_t len, ct_err *err);
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
 * removed). CT_ERR_RUNTIME naming the path and the reason. */
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

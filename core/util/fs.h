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
/* Write via path.tmp-<pid>, fsync, rename over path, fsync the parent directory `dir`. */
int ct_fs_replace_file(const char *dir, const char *name, const void *data, size_t len,
                       ct_err *err);

#endif

/* hdf5_lib.c: loading libhdf5 (hdf5_lib.h says why with dlopen), its lock, and the checks on a
 * file before libhdf5 reads it. */
#include "core/data/hdf5_lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util/fs.h"

/* ---------------- before libhdf5: the signature and the superblock ---------------- */

static const uint8_t h5_signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

static uint64_t le_uint(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The superblock is at 0 or, after a user block (h5py's userblock_size), at 512, 1024, 2048, ...
 * (HDF5 file format specification, "Format Signature and Superblock"): its offset and its first 64
 * bytes (zero past the end of the file) into sb; -1 when there is none. */
static int64_t find_superblock(int fd, uint64_t size, uint8_t sb[64]) {
    for (uint64_t off = 0; off + 8 <= size; off = off ? 2 * off : 512) {
        ssize_t got = ct_fs_read_at(fd, sb, 64, (int64_t)off);
        if (got >= 8 && !memcmp(sb, h5_signature, 8)) {
            if (got < 64) memset(sb + got, 0, 64 - (size_t)got);
            return (int64_t)off;
        }
    }
    return -1;
}

int64_t ct_h5_superblock_offset(const char *path) {
    int fd = ct_fs_open_input(path);
    if (fd < 0) return -1;
    struct stat st;
    uint8_t sb[64];
    int64_t at = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? find_superblock(fd, (uint64_t)st.st_size, sb) : -1;
    close(fd);
    return at;
}

bool ct_h5_is_file(const char *path) {
    int fd = ct_fs_open_input(path);
    if (fd < 0) return false;
    struct stat st;
    uint8_t sb[64];
    bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && find_superblock(fd, (uint64_t)st.st_size, sb) >= 0;
    close(fd);
    return ok;
}

int ct_h5_precheck(const char *path, ct_err *err) {
    int fd, rc = ct_fs_open_regular(path, CT_ERR_DATA, "an HDF5 file", &fd, err);   /* a FIFO: refused */
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ct_errf(err, ct_err_io(e, CT_ERR_DATA), "%s: cannot stat: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t sb[64];
    int64_t at = find_superblock(fd, size, sb);
    close(fd);
    if (at < 0)
        return ct_errf(err, CT_ERR_DATA, "%s: not an HDF5 file (no HDF5 signature \\211HDF\\r\\n\\032\\n at offset "
                       "0, 512, 1024, ...: %s)", path, size < 8 ? "the file is shorter than 8 bytes" :
                       "another format, or a file whose start was lost");
    int version = sb[8], offsets, eof_at;
    if (version == 0 || version == 1) { /* sizes at 13, 14; addresses after 24 (v0) or 28 (v1) bytes */
        offsets = sb[13];
        eof_at = (version == 0 ? 24 : 28) + 2 * offsets;
    } else if (version == 2 || version == 3) { /* sizes at 9, 10; base, extension, EOF from 12 */
        offsets = sb[9];
        eof_at = 12 + 2 * offsets;
    } else {
        return ct_errf(err, CT_ERR_DATA, "%s: HDF5 superblock version %d at offset %lld (libhdf5 writes 0 to 3: a "
                       "corrupt file, or one from a newer HDF5)", path, version, (long long)at);
    }
    if (offsets != 2 && offsets != 4 && offsets != 8 && offsets != 16)
        return ct_errf(err, CT_ERR_DATA, "%s: corrupt HDF5 superblock at offset %lld: %d-byte addresses (2, 4, 8 or "
                       "16 expected)", path, (long long)at, offsets);
    if (offsets == 16) return CT_OK; /* addresses wider than 64 bits: left to libhdf5 */
    /* The end-of-file address as libhdf5 records it is the file's size, the user block included
     * (h5py's userblock_size=512: base address 512, end 2800 in a 2800-byte file), not an address
     * relative to the base: adding the base counted the user block twice. */
    uint64_t eof = le_uint(sb + eof_at, offsets);
    if (eof > size)
        return ct_errf(err, CT_ERR_DATA, "%s: truncated: the HDF5 superblock says the file ends at byte %llu, it has "
                       "%llu bytes (a copy or download cut short?)", path, (unsigned long long)eof,
                       (unsigned long long)size);
    return CT_OK;
}

/* ---------------- loading ---------------- */

#ifdef CT_HAVE_HDF5
typedef struct h5_loaded {
    ct_h5 fn;
    char error[700]; /* why it could not be loaded; "" when loaded */
} h5_loaded;

static h5_loaded g_h5;
static pthread_once_t g_h5_once = PTHREAD_ONCE_INIT;

/* Debian 12's runtime (libhdf5-103-1), then the development link (libhdf5-dev), then the names
 * of other distributions' builds. */
static const char *const lib_names[] = {"libhdf5_serial.so.103", "libhdf5_serial.so", "libhdf5.so.103",
                                        "libhdf5.so.200", "libhdf5.so.310", "libhdf5.so"};

static bool bind(void *h, const char *name, void **slot, char *missing, size_t n) {
    *slot = dlsym(h, name);
    if (!*slot && !missing[0]) snprintf(missing, n, "%s", name);
    return *slot != NULL;
}

static void h5_load_once(void) {
    const char *env = getenv("CTRAIN_HDF5_LIB");
    void *h = NULL;
    char why[400] = "", tried[300] = "";
    int n = env && *env ? 1 : CT_ARRAY_LEN(lib_names);
    for (int i = 0; i < n && !h; i++) {
        const char *name = env && *env ? env : lib_names[i];
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        const char *e = h ? NULL : dlerror();
        if (i == 0 && e) snprintf(why, sizeof why, "%s", e); /* the first name's reason is the one that counts */
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", name);
    }
    if (!h) {
        snprintf(g_h5.error, sizeof g_h5.error, "cannot load libhdf5 (tried %s): %s\n  HDF5 files are read through "
                 "libhdf5, loaded only when a dataset is HDF5; install it: make deps, or apt-get install "
                 "libhdf5-103-1 (Debian 12; libhdf5-dev brings it)", tried, why);
        return;
    }
    ct_h5 *f = &g_h5.fn;
    char missing[80] = "";
    bool ok = true;
#define BIND(name) ok &= bind(h, #name, (void **)&f->name, missing, sizeof missing)
    BIND(H5open); BIND(H5get_libversion); BIND(H5Eset_auto2); BIND(H5Ewalk2); BIND(H5Eclear2);
    BIND(H5Fopen); BIND(H5Fclose); BIND(H5Gget_info); BIND(H5Lget_name_by_idx); BIND(H5Lexists);
    BIND(H5Dopen2); BIND(H5Dclose); BIND(H5Dget_space); BIND(H5Dget_type); BIND(H5Dget_create_plist); BIND(H5Dget_storage_size);
    BIND(H5Dget_chunk_info_by_coord); BIND(H5Dget_offset); BIND(H5Dread); BIND(H5Pclose); BIND(H5Pget_layout);
    BIND(H5Pget_nfilters); BIND(H5Pget_filter2); BIND(H5Pget_chunk);
    BIND(H5Pget_external_count); BIND(H5Pfill_value_defined); BIND(H5Pget_fill_value);
    BIND(H5Sclose); BIND(H5Sget_simple_extent_type); BIND(H5Sget_simple_extent_ndims);
    BIND(H5Sget_simple_extent_dims); BIND(H5Tget_class); BIND(H5Tget_size);
    BIND(H5Tget_sign); BIND(H5Tget_order); BIND(H5Tclose);
#undef BIND
    unsigned major = 0, minor = 0, release = 0;
    if (ok && f->H5open() < 0) snprintf(missing, sizeof missing, "(H5open failed)");
    else if (ok) f->H5get_libversion(&major, &minor, &release);
    if (!ok || missing[0] || major != H5_VERS_MAJOR) {
        snprintf(g_h5.error, sizeof g_h5.error, "%s is not a libhdf5 this ctrain can use: %s%s (built with the headers "
                 "of HDF5 %d.%d, found %u.%u.%u); install Debian's libhdf5-dev and rebuild", env && *env ? env :
                 "libhdf5", missing[0] ? "it lacks " : "another major version", missing, H5_VERS_MAJOR,
                 H5_VERS_MINOR, major, minor, release);
        return;
    }
    f->H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* errors come back as ctrain's messages, not on stderr */
}

int ct_h5_load(const ct_h5 **out, ct_err *err) {
    pthread_once(&g_h5_once, h5_load_once);
    *out = g_h5.error[0] ? NULL : &g_h5.fn;
    return g_h5.error[0] ? ct_errf(err, CT_ERR_RUNTIME, "%s", g_h5.error) : CT_OK;
}

typedef struct why_ctx {
    char *out;
    size_t n;
} why_ctx;

static herr_t innermost(unsigned k, const H5E_error2_t *e, void *ctx) {
    why_ctx *w = ctx;
    if (k == 0 && e->desc) snprintf(w->out, w->n, "%s", e->desc); /* walked upward: 0 is where it was found */
    return 0;
}

void ct_h5_why(const ct_h5 *h5, char *out, size_t n) {
    out[0] = '\0';
    why_ctx w = {out, n};
    h5->H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &w);
    h5->H5Eclear2(H5E_DEFAULT);
}
#endif

/* hdf5_lib.h: libhdf5, loaded with dlopen the first time an HDF5 file is read (by the metadata
 * probe, hdf5_probe.c, its only user), and the checks ctrain makes on a file before libhdf5
 * parses it.
 *
 * Why dlopen and not a link: libhdf5 (Debian's libhdf5-103-1, serial) pulls in 35 shared libraries
 * (libcurl, libcrypto, libssh2, ...; about 19 MB) that every run would map and that the GPU test
 * bundle would have to carry (test/bundle.sh, 64 MiB in all). Loaded on first use, a run that
 * reads no HDF5 never touches it, and a machine without it trains every other format; a run that
 * needs it and cannot load it gets CT_ERR_RUNTIME naming the package. The headers (libhdf5-dev)
 * give the functions' types at build time; a build without them leaves the format out and says so.
 *
 * Only the HDF5 metadata probe calls it (hdf5_probe.h: in a child process, or in a probe
 * executable): libhdf5 1.10 crashes on corrupt files, so the process that reads the samples loads
 * it at most (to fork the probe) and never runs it on a file. That also makes its global state and
 * locking moot: a probe is one thread. */
#ifndef CT_DATA_HDF5_LIB_H
#define CT_DATA_HDF5_LIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/util/common.h"

#if defined(__has_include)
#if __has_include(<hdf5/serial/hdf5.h>)
#include <hdf5/serial/hdf5.h> /* Debian's libhdf5-dev */
#define CT_HAVE_HDF5 1
#elif __has_include(<hdf5.h>)
#include <hdf5.h>
#define CT_HAVE_HDF5 1
#endif
#endif

#ifdef CT_HAVE_HDF5
/* The functions ctrain calls, typed by the headers. */
#define CT_H5_FN(name) __typeof__(name) *name
typedef struct ct_h5 {
    CT_H5_FN(H5open);
    CT_H5_FN(H5get_libversion);
    CT_H5_FN(H5Eset_auto2);
    CT_H5_FN(H5Ewalk2);
    CT_H5_FN(H5Eclear2);
    CT_H5_FN(H5Fopen);
    CT_H5_FN(H5Fclose);
    CT_H5_FN(H5Gget_info);
    CT_H5_FN(H5Lget_name_by_idx);
    CT_H5_FN(H5Lexists);
    CT_H5_FN(H5Dopen2);
    CT_H5_FN(H5Dclose);
    CT_H5_FN(H5Dget_space);
    CT_H5_FN(H5Dget_type);
    CT_H5_FN(H5Dget_create_plist);
    CT_H5_FN(H5Dget_offset);
    CT_H5_FN(H5Dget_storage_size);
    CT_H5_FN(H5Dget_chunk_info_by_coord);
    CT_H5_FN(H5Dread);
    CT_H5_FN(H5Pclose);
    CT_H5_FN(H5Pget_layout);
    CT_H5_FN(H5Pget_nfilters);
    CT_H5_FN(H5Pget_filter2);
    CT_H5_FN(H5Pget_chunk);
    CT_H5_FN(H5Pget_external_count);
    CT_H5_FN(H5Pfill_value_defined);
    CT_H5_FN(H5Pget_fill_value);
    CT_H5_FN(H5Sclose);
    CT_H5_FN(H5Sget_simple_extent_type);
    CT_H5_FN(H5Sget_simple_extent_ndims);
    CT_H5_FN(H5Sget_simple_extent_dims);
    CT_H5_FN(H5Tget_class);
    CT_H5_FN(H5Tget_size);
    CT_H5_FN(H5Tget_sign);
    CT_H5_FN(H5Tget_order);
    CT_H5_FN(H5Tclose);
} ct_h5;
#undef CT_H5_FN

/* H5F_ACC_RDONLY's value: the header's macro calls H5check_version and H5open, which a dlopen'ed
 * library does not provide at link time. */
#define CT_H5F_ACC_RDONLY 0x0000u

/* The library, loaded on the first call (once per process; later calls return the same table).
 * CT_ERR_RUNTIME naming the package to install when it cannot be loaded. $CTRAIN_HDF5_LIB, when
 * set, is the only file tried (tests use it to stand in for a machine without libhdf5). */
int ct_h5_load(const ct_h5 **out, ct_err *err);

/* The innermost message of libhdf5's error stack ("truncated file: eof = ..."), for the messages
 * ctrain writes; "" when there is none. Call right after the failing call. */
void ct_h5_why(const ct_h5 *h5, char *out, size_t n);
#endif

/* The checks made before libhdf5 sees a file: it can be opened and read, it has the HDF5
 * signature at offset 0 or 512, 1024, 2048, ... (a user block), its superblock's version is one
 * libhdf5 writes (0 to 3) and the end-of-file address it records is within the file (a file cut
 * short, as a copy stopped midway leaves it). CT_ERR_DATA naming the file and what is wrong. */
int ct_h5_precheck(const char *path, ct_err *err);

/* Whether path is an HDF5 file (the signature at offset 0, or after a user block at 512, 1024,
 * ...), for `ctrain info`. */
bool ct_h5_is_file(const char *path);
/* The offset of the superblock (the user block's size: 0 without one), or -1 when it has none. */
int64_t ct_h5_superblock_offset(const char *path);

#endif

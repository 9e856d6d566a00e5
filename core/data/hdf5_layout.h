/* hdf5_layout.h: where an HDF5 dataset's bytes are in its file, as libhdf5 resolved them in a
 * child process (hdf5_probe.h), and the message that carries them to the reading process.
 *
 * Why: libhdf5 1.10 (Debian's, not ours to fix) crashes on corrupt files, in its metadata parsers
 * and in H5Dread alike (fuzz_hdf5). So libhdf5 runs only in a child: it opens the file, finds the
 * two datasets and resolves, per dataset, the shape, the element type, the storage (a contiguous
 * range, the compact bytes, or every allocated chunk's address, size and filter mask), the filter
 * pipeline and the fill value, and writes them to a pipe as one reply (below). The reading
 * process checks that reply as hostile input (ct_h5_reply_decode: every range inside the file,
 * counts bounded, no product overflows) and then reads samples with pread and its own filters
 * (hdf5_rows.h). Nothing in the reply is trusted before that check.
 *
 * The reply, little-endian throughout (version CT_H5_REPLY_VERSION):
 *   "CTH5" u32 version, u32 code (CT_OK, or the ct_err code of what the child found wrong),
 *   u32 text bytes, the text (the error message, or `ctrain info`'s listing), u32 datasets (0 or
 *   2), then per dataset:
 *     u32 ndim, u64 dims[ndim], u32 class (ct_h5_class), u32 element bytes, u32 flags (bit 0
 *     little-endian, bit 1 signed), u32 fill bytes (0 or the element bytes), the fill bytes,
 *     u32 filters, per filter u32 id, u32 flags, u32 client values, u32 values[that many],
 *     u32 storage (ct_h5_storage), and per storage:
 *       contiguous: u64 address, u64 size     compact: u64 size, the bytes
 *       chunked: u64 chunk dims[ndim], u64 chunks, per chunk (row-major over the chunk grid)
 *                u64 address (CT_H5_UNALLOCATED: not written, the fill value), u64 size, u32 mask
 *       unallocated: nothing (every element is the fill value) */
#ifndef CT_DATA_HDF5_LAYOUT_H
#define CT_DATA_HDF5_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/util/common.h"

enum {
    CT_H5_REPLY_VERSION = 1,
    CT_H5_MAX_RANK = 5,
    CT_H5_MAX_FILTERS = 8,      /* HDF5 allows 32; real pipelines have 1 to 3 */
    CT_H5_MAX_CD = 8,           /* client values per filter (deflate 1, shuffle 1, szip 4) */
    CT_H5_MAX_ELEM = 16,        /* the widest element whose fill value is sent (wider types are refused) */
    CT_H5_COMPACT_MAX = 65536,  /* the format's limit on compact data */
};
#define CT_H5_UNALLOCATED UINT64_MAX
#define CT_H5_MAX_CHUNKS ((uint64_t)1 << 22) /* chunk grid cells per dataset (4M: 80 MB of reply) */
#define CT_H5_REPLY_MAX ((size_t)128 << 20)  /* bytes a reply may have */
#define CT_H5_TEXT_MAX ((uint32_t)1 << 20)

/* HDF5's type classes (H5T_class_t's values): ctrain reads integers and floats, and names the
 * others in its refusals. */
typedef enum { CT_H5_CLASS_INT = 0, CT_H5_CLASS_FLOAT = 1, CT_H5_CLASS_LAST = 10 } ct_h5_class;
typedef enum {
    CT_H5_CONTIGUOUS = 0,
    CT_H5_COMPACT = 1,
    CT_H5_CHUNKED = 2,
    CT_H5_NOT_WRITTEN = 3, /* contiguous storage never allocated: all fill value */
} ct_h5_storage;

/* HDF5's filter ids (H5Zpublic.h) that ctrain decodes itself; others are refused at open. */
enum { CT_H5_FILTER_DEFLATE = 1, CT_H5_FILTER_SHUFFLE = 2, CT_H5_FILTER_FLETCHER32 = 3, CT_H5_FILTER_SZIP = 4 };

typedef struct ct_h5_filter {
    uint32_t id, flags, ncd;
    uint32_t cd[CT_H5_MAX_CD];
} ct_h5_filter;

typedef struct ct_h5_chunk {
    uint64_t addr; /* CT_H5_UNALLOCATED: never written */
    uint64_t size; /* stored (filtered) bytes */
    uint32_t mask; /* bit k set: filter k was skipped for this chunk */
} ct_h5_chunk;

/* One dataset, as the reply gives it (checked by ct_h5_reply_decode). */
typedef struct ct_h5_layout {
    int ndim;
    int64_t dims[CT_H5_MAX_RANK];
    ct_h5_class cls;
    uint32_t elem;               /* bytes per element as stored */
    bool little, is_signed;      /* byte order (one-byte elements: true), integer sign */
    uint8_t fill[CT_H5_MAX_ELEM]; /* the fill value as stored (zeros when the file sets none) */
    int nfilters;
    ct_h5_filter filters[CT_H5_MAX_FILTERS];
    ct_h5_storage storage;
    uint64_t addr, size;          /* contiguous */
    uint8_t *compact;             /* compact: [size] bytes, owned */
    int64_t chunk[CT_H5_MAX_RANK]; /* chunked: chunk dims */
    int64_t grid[CT_H5_MAX_RANK];  /* chunks along each dimension: ceil(dims / chunk) */
    uint64_t nchunks;              /* product of grid */
    ct_h5_chunk *chunks;           /* [nchunks], row-major over grid, owned */
    uint64_t stored;               /* bytes stored in the file for it (the sum of chunk sizes, at most the file size) */
} ct_h5_layout;

/* A reply: the child's verdict and, when CT_OK and datasets were asked for, their layouts. */
typedef struct ct_h5_reply {
    int code;   /* CT_OK, CT_ERR_DATA or CT_ERR_RUNTIME */
    char *text; /* NUL-terminated, owned; "" when none */
    int nlayouts;
    ct_h5_layout layouts[2];
} ct_h5_reply;

/* "uint8", "float32", "int16 big-endian", "compound (12 bytes)", ... of l's element type. */
void ct_h5_type_text(const ct_h5_layout *l, char *out, size_t n);

/* Bytes of one element row-major block: product of dims (from dimension `from`) x elem; false on
 * overflow past 2^62. */
bool ct_h5_block_bytes(const int64_t *dims, int from, int ndim, uint64_t elem, uint64_t *out);

/* ---- the child's side: building a reply (a growing buffer; ct_xmalloc on failure) ---- */
typedef struct ct_h5_writer {
    uint8_t *p;
    size_t n, cap;
} ct_h5_writer;
void ct_h5_put_u32(ct_h5_writer *w, uint32_t v);
void ct_h5_put_u64(ct_h5_writer *w, uint64_t v);
void ct_h5_put_bytes(ct_h5_writer *w, const void *p, size_t n);
/* The header: magic, version, code, text, number of datasets to follow. */
void ct_h5_put_header(ct_h5_writer *w, int code, const char *text, uint32_t datasets);
/* One dataset (the layout as the child filled it; nchunks and chunks for chunked storage). */
void ct_h5_put_layout(ct_h5_writer *w, const ct_h5_layout *l);

/* ---- the reader's side ---- */
/* Decode reply[0..n) of a file of file_size bytes into r, checking every field: a corrupt reply
 * (not one the child wrote, or one libhdf5 filled from a corrupt file) is CT_ERR_DATA naming
 * `path`, the dataset (names: the two datasets asked for) and what is wrong. r is freed with
 * ct_h5_reply_free either way. */
int ct_h5_reply_decode(const uint8_t *reply, size_t n, uint64_t file_size, const char *path,
                       const char *const names[2], ct_h5_reply *r, ct_err *err);
void ct_h5_reply_free(ct_h5_reply *r);
void ct_h5_layout_free(ct_h5_layout *l);

#endif

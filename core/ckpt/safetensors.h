/* safetensors.h: reader and writer for the safetensors format (huggingface/safetensors).
 *
 * Layout: u64 N (little-endian) | N bytes of UTF-8 JSON header | byte buffer. The header maps
 * tensor names to {"dtype", "shape", "data_offsets": [BEGIN, END]} (offsets relative to the byte
 * buffer, END exclusive) and may hold "__metadata__", a flat string -> string map.
 *
 * Writer: tensors laid out by descending dtype size, then name (as the reference writer does, so
 * every tensor is naturally aligned), header keys in that order after "__metadata__", the header
 * padded with spaces so the buffer starts at a multiple of 8.
 *
 * Reader: the file is mapped read-only and validated completely before anything is returned:
 * header length within bounds, valid UTF-8 JSON object starting with '{', known dtypes, integer
 * shapes and offsets without overflow, shape product x dtype size == byte range, ranges contiguous
 * from 0 with no gaps or overlap and ending exactly at the end of the file, no duplicate names.
 * Any violation is CT_ERR_DATA naming the file and what is wrong; never a crash (fuzzed:
 * test/fuzz/fuzz_safetensors.c). Host byte order must be little-endian. */
#ifndef CT_SAFETENSORS_H
#define CT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/util/common.h"
#include "core/util/tensor.h"

#define CT_ST_MAX_HEADER 100000000u /* the reference reader's MAX_HEADER_SIZE */

/* One tensor of a file being read. */
typedef struct ct_st_tensor {
    char *name;
    const char *dtype;       /* canonical safetensors name: "F32", "BF16", "F8_E4M3", ... */
    int dtype_bits;          /* 32, 16, 8, 6, 4, 1 (BOOL counts as 8) */
    int ct_dtype;            /* the matching ct_dtype, or -1 when ctrain has none */
    ct_shape shape;
    uint64_t begin, end;     /* byte range inside the buffer */
    const uint8_t *data;     /* begin..end of the mapped file; may be unaligned */
    bool mapped;             /* data is in the file's own mapping (ct_st_open), not caller memory */
} ct_st_tensor;

typedef struct ct_st_file {
    char *path;              /* as given, for messages */
    ct_st_tensor *tensors;   /* sorted by name */
    int n_tensors;
    char **meta_keys, **meta_vals; /* __metadata__, in file order */
    int n_meta;
    uint64_t header_len;     /* N */
    size_t file_size;
    void *map;               /* owned mapping (NULL when parsed from caller memory) */
} ct_st_file;

/* Open and validate a file. On failure returns NULL and fills err (CT_ERR_DATA, or
 * CT_ERR_RUNTIME when the file cannot be opened: the message says which). */
ct_st_file *ct_st_open(const char *path, ct_err *err);
/* Validate `len` bytes in memory (not copied: they must outlive the result). `name` is used in
 * messages. */
ct_st_file *ct_st_parse(const void *buf, size_t len, const char *name, ct_err *err);
void ct_st_close(ct_st_file *f);

/* Tensor by name, or NULL. */
const ct_st_tensor *ct_st_find(const ct_st_file *f, const char *name);
/* Metadata value by key, or NULL. */
const char *ct_st_meta(const ct_st_file *f, const char *key);
int64_t ct_st_numel(const ct_st_tensor *t);

/* Copy a F32, F16 or BF16 tensor into dst as fp32 (n must equal its element count).
 * Returns false for other dtypes or a count mismatch. */
bool ct_st_read_f32(const ct_st_tensor *t, float *dst, int64_t n);
/* Elements [first, first + n) of the tensor (flat, row-major) into dst as fp32; false for other
 * dtypes or a range outside the tensor. Of a file opened with ct_st_open, the whole pages read are
 * then dropped from the process's memory (madvise), so reading a file in pieces never holds more
 * of it than a piece. */
bool ct_st_read_f32_range(const ct_st_tensor *t, int64_t first, int64_t n, float *dst);

/* Byte size of a safetensors dtype name, in bits; 0 when unknown. */
int ct_st_dtype_bits(const char *name);

/* ---- writer ---- */

/* The most floats a file's staging buffer for fill entries holds (4 MiB). */
#define CT_ST_FILL_FLOATS ((int64_t)1 << 20)

typedef struct ct_st_entry {
    const char *name;
    ct_dtype dtype;          /* stored dtype */
    ct_shape shape;
    const void *data;        /* numel x dtype size bytes in `dtype`; or NULL and from_f32 set */
    const float *from_f32;   /* when set: fp32 source converted to dtype (F32, F16 or BF16) */
    /* When set (data and from_f32 NULL): the fp32 values are asked for in chunks, fill writing
     * elements [first, first + n) of the tensor into dst, and converted as from_f32's are. The
     * writer stages them in one buffer of at most CT_ST_FILL_FLOATS floats per file, so a tensor
     * that is not in host memory (a device's, or spread over other files) is written without a
     * whole copy of it. A non-zero return (err filled) aborts the write. */
    int (*fill)(void *ctx, int64_t first, int64_t n, float *dst, ct_err *err);
    void *fill_ctx;
} ct_st_entry;

/* Write a file at `path` (created or truncated; mode 0644) and fsync it. Metadata: n_meta
 * key/value strings (may be 0). Entries need not be sorted; names must be unique.
 * Errors: CT_ERR_RUNTIME naming the path and the system error; CT_ERR_CONFIG for unusable input
 * (duplicate names, unsupported conversion). */
int ct_st_write(const char *path, const ct_st_entry *entries, int n, const char *const *meta_keys,
                const char *const *meta_vals, int n_meta, ct_err *err);
/* ct_st_write, and *crc receives the CRC-32 (zlib's crc32) of every byte written, computed as
 * they are written (a checkpoint records it without reading the file back). */
int ct_st_write_crc(const char *path, const ct_st_entry *entries, int n, const char *const *meta_keys,
                    const char *const *meta_vals, int n_meta, uint32_t *crc, ct_err *err);

#endif

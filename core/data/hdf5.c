/* hdf5.c: HDF5 files (h5py's, Keras's, PyTables' arrays), read through libhdf5 (hdf5_lib.h: loaded
 * with dlopen on first use).
 *
 * Entry fields: {"format": "hdf5", "path": "data/fmnist.h5", "images": "images", "labels":
 * "labels", "limit": N}. "images" and "labels" name two datasets of the file (a path such as
 * "train/x" reaches into groups; defaults "images" and "labels"). Both have the samples along
 * their first dimension, and the same number of them:
 *   - images: [N, H, W] (one channel: samples [1, H, W], as IDX), [N, C, H, W], [N, F] or up to
 *     5 dimensions in all; uint8 (pixels: scaled to [0, 1], then normalised with
 *     data.transform.normalize, the table every 8-bit format shares, so the same pixels give the
 *     same floats as IDX, PNG or shards), or float32/float64 (values as stored, normalised per
 *     channel). Channels-last arrays ([N, H, W, C]) are read as stored: transpose them when
 *     writing the file.
 *   - labels: [N] of integers (any width or sign, class indices >= 0), or [N] / [N, K] of floats
 *     (regression targets).
 * Any layout libhdf5 reads (contiguous, compact, chunked) with any filter it has (gzip, shuffle,
 * fletcher32, szip; LZF and other plugins only where installed).
 *
 * Access: random, by sample. The labels are read whole at open (every label checked, the class
 * count known). A sample of a contiguous, unfiltered dataset stored little-endian is read with one
 * pread at its offset (no lock: the loader's workers read in parallel); of any other dataset,
 * through libhdf5 under its lock, a block of samples (a chunk's rows) at a time, the blocks kept
 * decoded up to 256 MiB per dataset, so that a shuffled epoch decompresses each chunk once
 * (BLOCK_CACHE_MAX below).
 *
 * Bad input: the shapes, element types and counts are checked at open, before any data is read, and
 * errors name the file and the dataset (CT_ERR_DATA: exit 3). The file's signature and superblock
 * are checked before libhdf5 parses it (hdf5_lib.h), and the metadata is parsed in a child process
 * first (survives_in_child: libhdf5 1.10 crashes on some corrupt files); what libhdf5 finds wrong (a corrupt
 * object header, a chunk that does not decompress) comes back as its message, at open or at
 * decode (where data.skip_corrupt can count it). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/hdf5_info.h"
#include "core/data/hdf5_lib.h"
#include "core/data/transform.h"
#include "core/util/fs.h"

#ifdef CT_HAVE_HDF5

enum { MAX_NAME = 256, MAX_RANK = 5 };
/* Samples read through libhdf5 are read in blocks of consecutive samples (a chunk's rows), kept
 * decoded, up to BLOCK_CACHE_MAX bytes per dataset; past that, one sample per read, through a
 * libhdf5 chunk cache of CHUNK_CACHE bytes. Why: one H5Dread costs about 100 us whatever it reads
 * (the chunk index walk, the selection), so a sample per call capped the reader near 10,000
 * samples/s; a block per call costs that once per chunk. */
#define BLOCK_CACHE_MAX ((size_t)256 << 20)
#define BLOCK_MAX ((size_t)16 << 20)
#define CHUNK_CACHE ((size_t)16 << 20)
enum { UNCHUNKED_BLOCK_ROWS = 64 };

typedef enum { EL_U8, EL_F32, EL_F64, EL_INT, EL_OTHER } elem_kind;

/* One dataset of the file, as checked at open. */
typedef struct h5_array {
    char name[MAX_NAME];
    const char *role;            /* "images" or "labels", for messages */
    hid_t dset, space;           /* space: the file's dataspace, the hyperslab selected per read */
    int ndim;
    int64_t dims[MAX_RANK];
    elem_kind kind;
    size_t elem;                 /* bytes per element as stored */
    bool little;                 /* stored little-endian (or one byte) */
    int64_t offset;              /* contiguous, unfiltered, allocated: its file offset; else -1 */
    int64_t chunk_rows;          /* chunked: the chunks' first dimension; else 0 */
    char type_text[48];          /* "uint8", "float32", "int16 big-endian", ... */
} h5_array;

typedef struct h5_impl {
    const ct_h5 *h5;
    hid_t file;
    int fd;                      /* for pread of contiguous samples */
    h5_array img, lab;
    int64_t per;                 /* elements per sample */
    /* Blocks of block_rows samples read through libhdf5 and kept (see BLOCK_CACHE_MAX): blocks[k]
     * holds samples [k * block_rows, ...), NULL until read; set once under the lock, read without
     * it (atomic loads), freed at close. cached: their bytes (under the lock). */
    int64_t block_rows, nblocks;
    uint8_t **blocks;
    size_t cached;
    int64_t channels, plane;     /* per = channels x plane */
    int32_t *labels;             /* [count] class indices, or NULL */
    float *targets;              /* [count][tdim] float targets, or NULL */
    int64_t tdim;
    float *mean, *std;           /* [channels] */
    float *lut;                  /* uint8 images: [channels][256] */
} h5_impl;

/* ---------------- describing a dataset ---------------- */

static void type_text(const ct_h5 *h5, hid_t t, h5_array *a) {
    H5T_class_t cls = h5->H5Tget_class(t);
    size_t size = h5->H5Tget_size(t);
    H5T_order_t order = h5->H5Tget_order(t);
    a->elem = size;
    a->little = size == 1 || order == H5T_ORDER_LE;
    const char *end = size > 1 && order == H5T_ORDER_BE ? " big-endian" : "";
    if (cls == H5T_INTEGER) {
        bool sign = h5->H5Tget_sign(t) == H5T_SGN_2;
        a->kind = size == 1 && !sign ? EL_U8 : EL_INT;
        snprintf(a->type_text, sizeof a->type_text, "%sint%zu%s", sign ? "" : "u", 8 * size, end);
    } else if (cls == H5T_FLOAT && (size == 4 || size == 8)) {
        a->kind = size == 4 ? EL_F32 : EL_F64;
        snprintf(a->type_text, sizeof a->type_text, "float%zu%s", 8 * size, end);
    } else {
        static const char *const names[] = {"integer", "float", "time", "string", "bitfield", "opaque",
                                            "compound", "reference", "enum", "variable-length", "array"};
        a->kind = EL_OTHER;
        snprintf(a->type_text, sizeof a->type_text, "%s (%zu bytes)",
                 cls >= 0 && cls < (int)CT_ARRAY_LEN(names) ? names[cls] : "unknown type", size);
    }
}

/* "a, b, c" of the links in the file's root group, for a missing dataset's message. */
static void root_names(const ct_h5 *h5, hid_t file, char *out, size_t n) {
    H5G_info_t info;
    size_t used = 0;
    out[0] = '\0';
    if (h5->H5Gget_info(file, &info) < 0) return;
    for (hsize_t k = 0; k < info.nlinks; k++) {
        char name[MAX_NAME];
        if (h5->H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof name, H5P_DEFAULT) < 0)
            break;
        if (used + strlen(name) + 8 >= n) { /* room for ", ..." */
            memcpy(out + used, ", ...", 6);
            return;
        }
        used += (size_t)sprintf(out + used, "%s%s", used ? ", " : "", name);
    }
}

/* Open dataset a->name of the file (lock held): its shape, element type and storage. */
static int describe(h5_impl *im, const char *path, h5_array *a, hid_t dapl, ct_err *err) {
    const ct_h5 *h5 = im->h5;
    char why[400];
    a->dset = a->space = -1;
    a->offset = -1;
    htri_t exists = h5->H5Lexists(im->file, a->name, H5P_DEFAULT);
    if (exists <= 0) {
        char names[400];
        h5->H5Eclear2(H5E_DEFAULT);
        root_names(h5, im->file, names, sizeof names);
        return ct_errf(err, CT_ERR_DATA, "%s: no dataset \"%s\" (%s) in the file; its root group has: %s (set the "
                       "entry's \"%s\", or pack's --features, to one of them)", path, a->name, a->role, names[0] ? names : "nothing",
                       a->role);
    }
    a->dset = h5->H5Dopen2(im->file, a->name, dapl);
    if (a->dset < 0) {
        ct_h5_why(h5, why, sizeof why);
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\" (%s) is not a dataset that can be opened (a group?): %s", path,
                       a->name, a->role, why);
    }
    a->space = h5->H5Dget_space(a->dset);
    hid_t t = h5->H5Dget_type(a->dset);
    if (a->space < 0 || t < 0) {
        ct_h5_why(h5, why, sizeof why);
        if (t >= 0) h5->H5Tclose(t);
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): cannot read its shape or type: %s", path, a->name,
                       a->role, why);
    }
    type_text(h5, t, a);
    h5->H5Tclose(t);
    int nd = h5->H5Sget_simple_extent_type(a->space) == H5S_SIMPLE ? h5->H5Sget_simple_extent_ndims(a->space) : 0;
    hsize_t dims[H5S_MAX_RANK], maxdims[H5S_MAX_RANK];
    if (nd < 1 || nd > MAX_RANK || h5->H5Sget_simple_extent_dims(a->space, dims, maxdims) != nd)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) has %d dimensions (%s): expected the samples along "
                       "the first of 1 to %d", path, a->name, a->role, nd, nd ? "too many" : "a scalar or empty",
                       MAX_RANK);
    a->ndim = nd;
    for (int d = 0; d < nd; d++) {
        if (dims[d] == 0 || dims[d] > ((hsize_t)1 << 40))
            return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): dimension %d has %llu elements", path, a->name,
                           a->role, d, (unsigned long long)dims[d]);
        a->dims[d] = (int64_t)dims[d];
    }
    /* Never trust the header with an allocation: what the dataset declares must be stored in the
     * file, compressed at most 1032:1 (deflate's limit), before ctrain sizes buffers by it. */
    uint64_t declared = a->elem ? a->elem : 1, stored = h5->H5Dget_storage_size(a->dset);
    bool overflow = false;
    for (int d = 0; d < nd; d++) overflow |= __builtin_mul_overflow(declared, (uint64_t)a->dims[d], &declared);
    if (overflow || (declared > (1 << 20) && (declared - (1 << 20)) / 1032 > stored))
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) declares %s%llu bytes but the file stores %llu for "
                       "it: a corrupt header, or chunks never written (write every sample)", path, a->name, a->role,
                       overflow ? "more than " : "", overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)declared,
                       (unsigned long long)stored);
    hid_t dcpl = h5->H5Dget_create_plist(a->dset);
    if (dcpl >= 0) {
        H5D_layout_t layout = h5->H5Pget_layout(dcpl);
        bool plain = layout == H5D_CONTIGUOUS && h5->H5Pget_nfilters(dcpl) == 0 && h5->H5Pget_external_count(dcpl) == 0;
        hsize_t chunk[H5S_MAX_RANK];
        int cn = layout == H5D_CHUNKED ? h5->H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) : 0;
        haddr_t off = plain ? h5->H5Dget_offset(a->dset) : HADDR_UNDEF;
        if (off != HADDR_UNDEF && off <= (haddr_t)INT64_MAX) a->offset = (int64_t)off;
        h5->H5Pclose(dcpl);
        /* A chunk larger than a fixed dimension cannot be written (H5Pset_chunk refuses it): it is a
         * corrupt layout message, on which libhdf5 1.10 reads past its chunk buffer (fuzz_hdf5). */
        bool bad = layout == H5D_CHUNKED && cn != nd;
        for (int d = 0; layout == H5D_CHUNKED && d < nd && !bad; d++)
            bad = chunk[d] < 1 || (maxdims[d] != H5S_UNLIMITED && chunk[d] > maxdims[d]);
        if (bad) {
            char text[200] = "[";
            for (int d = 0; d < cn && d < H5S_MAX_RANK; d++)
                snprintf(text + strlen(text), sizeof text - strlen(text), "%s%llu", d ? ", " : "", (unsigned long long)chunk[d]);
            return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): chunks %s] do not fit its fixed shape of %d "
                           "dimensions: a corrupt layout message", path, a->name, a->role, text, nd);
        }
        if (layout == H5D_CHUNKED) a->chunk_rows = (int64_t)(chunk[0] < dims[0] ? chunk[0] : dims[0]);
    }
    h5->H5Eclear2(H5E_DEFAULT);
    return CT_OK;
}

static void shape_text(const h5_array *a, char *out, size_t n) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < a->ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, "%s%lld", d ? ", " : "", (long long)a->dims[d]);
    if (used < n) snprintf(out + used, n - used, "]");
}

/* The images: uint8 or float, 2 to 5 dimensions, a contiguous dataset within the file. */
static int check_images(h5_impl *im, const char *path, ct_dataset *ds, ct_err *err) {
    h5_array *a = &im->img;
    char shape[160];
    shape_text(a, shape, sizeof shape);
    if (a->kind != EL_U8 && a->kind != EL_F32 && a->kind != EL_F64)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images) holds %s elements: expected uint8 (pixels) or "
                       "float32/float64 (convert it when writing the file, e.g. h5py's astype)", path, a->name,
                       a->type_text);
    if (a->ndim < 2)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images) has shape %s: expected [N, ...] with the "
                       "samples along the first dimension ([N, H, W], [N, C, H, W] or [N, F])", path, a->name, shape);
    ct_shape s = {0};
    if (a->ndim == 3) s = (ct_shape){.ndim = 3, .d = {1, a->dims[1], a->dims[2]}}; /* [N, H, W]: one channel, as IDX */
    else
        for (int d = 1; d < a->ndim; d++) s.d[s.ndim++] = a->dims[d];
    int64_t per = ct_shape_numel(&s);
    if (per > ((int64_t)1 << 30))
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images) has shape %s: %lld elements per sample (at most "
                       "2^30)", path, a->name, shape, (long long)per);
    struct stat st;
    if (a->offset >= 0 && fstat(im->fd, &st) == 0) { /* contiguous: every sample must be inside the file */
        uint64_t need = (uint64_t)a->dims[0] * (uint64_t)per * a->elem;
        if ((uint64_t)a->offset > (uint64_t)st.st_size || need > (uint64_t)st.st_size - (uint64_t)a->offset)
            return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images): its %llu bytes from offset %lld run past the "
                           "end of the file (%lld bytes): truncated", path, a->name, (unsigned long long)need,
                           (long long)a->offset, (long long)st.st_size);
    }
    if (!a->little || (a->kind != EL_U8 && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)) a->offset = -1; /* libhdf5 converts */
    ds->sample_shape = s;
    im->per = per;
    im->channels = s.ndim == 3 ? s.d[0] : 1;
    im->plane = per / im->channels;
    return CT_OK;
}

/* The labels: as many as images; read whole (lock held) and checked. */
static int read_labels(h5_impl *im, const char *path, ct_dataset *ds, ct_err *err) {
    const ct_h5 *h5 = im->h5;
    h5_array *a = &im->lab;
    char shape[160], why[400];
    shape_text(a, shape, sizeof shape);
    bool classes = a->kind == EL_U8 || a->kind == EL_INT;
    if (a->kind == EL_OTHER || (classes && a->ndim != 1) || a->ndim > 2)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels) is %s with shape %s: expected [N] integers "
                       "(class indices) or [N] / [N, K] floats (targets)", path, a->name, a->type_text, shape);
    if (a->dims[0] != im->img.dims[0])
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels) has %lld samples, dataset \"%s\" (images) "
                       "%lld: they must have the same first dimension", path, a->name, (long long)a->dims[0],
                       im->img.name, (long long)im->img.dims[0]);
    int64_t n = a->dims[0], k = a->ndim == 2 ? a->dims[1] : 1;
    if (k > (1 << 20))
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels) has shape %s: more than 2^20 targets per sample",
                       path, a->name, shape);
    void *buf = ct_xmalloc((size_t)(n * k) * (classes ? sizeof(int64_t) : sizeof(float)));
    if (h5->H5Dread(a->dset, classes ? h5->native_i64 : h5->native_f32, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        ct_h5_why(h5, why, sizeof why);
        free(buf);
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels): cannot read it: %s", path, a->name, why);
    }
    if (!classes) {
        im->targets = buf;
        im->tdim = k;
        ds->target_dtype = CT_F32;
        ds->target_shape = (ct_shape){.ndim = 1, .d = {k}};
        snprintf(ds->label_note, sizeof ds->label_note, "%.900s: dataset \"%.200s\" holds %s targets, not class indices",
                 path, a->name, a->type_text);
        return CT_OK;
    }
    const int64_t *v = buf;
    int64_t top = 0, at = 0;
    im->labels = ct_xmalloc((size_t)n * sizeof *im->labels);
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] > INT32_MAX) {
            int64_t bad = v[i];
            free(buf);
            return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels): sample %lld has label %lld, not a class "
                           "index (0 to 2^31-1)", path, a->name, (long long)i, (long long)bad);
        }
        im->labels[i] = (int32_t)v[i];
        if (v[i] > top) top = v[i], at = i;
    }
    free(buf);
    ds->target_dtype = CT_I32;
    ds->classes = top + 1;
    snprintf(ds->label_note, sizeof ds->label_note, "%.900s: dataset \"%.200s\" sample %lld has label %lld, the largest",
             path, a->name, (long long)at, (long long)top);
    return CT_OK;
}

/* ---------------- reading a sample ---------------- */

/* Samples [first, first + rows) of the images through libhdf5 into buf, as native elements (lock
 * held). false with libhdf5's reason in why. */
static bool read_rows(const h5_impl *im, int64_t first, int64_t rows, void *buf, char *why, size_t n) {
    const ct_h5 *h5 = im->h5;
    const h5_array *a = &im->img;
    hsize_t start[MAX_RANK] = {(hsize_t)first}, count[MAX_RANK] = {(hsize_t)rows};
    for (int d = 1; d < a->ndim; d++) count[d] = (hsize_t)a->dims[d];
    hid_t mem = a->kind == EL_U8 ? h5->native_u8 : a->kind == EL_F32 ? h5->native_f32 : h5->native_f64;
    /* the memory space has the selection's shape: with a flat one libhdf5 took a path ~7x slower */
    hid_t memspace = h5->H5Screate_simple(a->ndim, count, NULL);
    bool ok = memspace >= 0 && h5->H5Sselect_hyperslab(a->space, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
              h5->H5Dread(a->dset, mem, memspace, a->space, H5P_DEFAULT, buf) >= 0;
    if (!ok) ct_h5_why(h5, why, n);
    if (memspace >= 0) h5->H5Sclose(memspace);
    return ok;
}

/* Sample i's stored elements (im->per of im->img.elem bytes, little-endian) into buf. */
static int read_sample(const ct_dataset *ds, int64_t i, void *buf, ct_err *err) {
    const h5_impl *im = ds->impl;
    const h5_array *a = &im->img;
    size_t bytes = (size_t)im->per * a->elem;
    if (a->offset >= 0) {
        ssize_t got = ct_fs_read_at(im->fd, buf, bytes, a->offset + i * (int64_t)bytes);
        if (got == (ssize_t)bytes) return CT_OK;
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images): sample %lld: %s", ds->source, a->name,
                       (long long)i, got < 0 ? strerror(errno) : "the file ends inside it (truncated since it was opened?)");
    }
    /* through libhdf5: the sample's block, read and kept if it is not yet and the budget allows */
    h5_impl *own = ds->impl; /* the blocks are filled by whichever worker reads first */
    int64_t k = i / im->block_rows;
    uint8_t *block = __atomic_load_n(&own->blocks[k], __ATOMIC_ACQUIRE);
    char why[400] = "";
    bool ok = true;
    if (!block) {
        ct_h5_lock(im->h5);
        block = own->blocks[k]; /* another worker may have read it meanwhile */
        int64_t first = k * im->block_rows, rows = a->dims[0] - first < im->block_rows ? a->dims[0] - first : im->block_rows;
        size_t block_bytes = (size_t)rows * bytes;
        if (!block && own->cached + block_bytes <= BLOCK_CACHE_MAX) {
            uint8_t *b = ct_xmalloc(block_bytes);
            ok = read_rows(im, first, rows, b, why, sizeof why);
            if (ok) {
                own->cached += block_bytes;
                __atomic_store_n(&own->blocks[k], b, __ATOMIC_RELEASE);
                block = b;
            } else { /* the sample alone, so that only samples that cannot be read fail */
                free(b);
                ok = read_rows(im, i, 1, buf, why, sizeof why);
            }
        } else if (!block) {
            ok = read_rows(im, i, 1, buf, why, sizeof why);
        }
        ct_h5_unlock();
    }
    if (block) memcpy(buf, block + (size_t)(i - k * im->block_rows) * bytes, bytes);
    return ok ? CT_OK : ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images): sample %lld: libhdf5 cannot read it: %s",
                                ds->source, a->name, (long long)i, why);
}

static int check_index(const ct_dataset *ds, int64_t i, ct_err *err) {
    if (i >= 0 && i < ds->count) return CT_OK;
    return ct_errf(err, CT_ERR_DATA, "%s: sample %lld out of range (%lld samples)", ds->source, (long long)i,
                   (long long)ds->count);
}

static void write_target(const h5_impl *im, int64_t i, void *target) {
    if (!target) return;
    if (im->labels) *(int32_t *)target = im->labels[i];
    else memcpy(target, im->targets + i * im->tdim, (size_t)im->tdim * sizeof(float));
}

static int h5_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    const h5_impl *im = ds->impl;
    int rc = check_index(ds, i, err);
    if (rc) return rc;
    uint8_t *buf = ct_xmalloc((size_t)im->per * im->img.elem);
    rc = read_sample(ds, i, buf, err);
    float *x = input; /* [channels, plane] */
    for (int64_t c = 0; !rc && c < im->channels; c++) {
        int64_t lo = c * im->plane, hi = lo + im->plane;
        if (im->img.kind == EL_U8) {
            const float *lut = im->lut + 256 * c;
            for (int64_t j = lo; j < hi; j++) x[j] = lut[buf[j]];
        } else if (im->img.kind == EL_F32) { /* as IDX computes it: in double, rounded once */
            const float *v = (const float *)buf;
            for (int64_t j = lo; j < hi; j++) x[j] = (float)(((double)v[j] - im->mean[c]) / im->std[c]);
        } else {
            const double *v = (const double *)buf;
            for (int64_t j = lo; j < hi; j++) x[j] = (float)((v[j] - im->mean[c]) / im->std[c]);
        }
    }
    free(buf);
    if (!rc) write_target(im, i, target);
    return rc;
}

/* data.transform.on_device: the stored pixels of uint8 images. */
static int h5_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err) {
    const h5_impl *im = ds->impl;
    int rc = check_index(ds, i, err);
    if (!rc) rc = read_sample(ds, i, input, err);
    if (!rc) write_target(im, i, target);
    return rc;
}

static void h5_close(ct_dataset *ds) {
    h5_impl *im = ds->impl;
    if (im) {
        if (im->h5) {
            ct_h5_lock(im->h5);
            const h5_array *arrays[] = {&im->img, &im->lab};
            for (int k = 0; k < 2; k++) {
                if (arrays[k]->space >= 0) im->h5->H5Sclose(arrays[k]->space);
                if (arrays[k]->dset >= 0) im->h5->H5Dclose(arrays[k]->dset);
            }
            if (im->file >= 0) im->h5->H5Fclose(im->file);
            im->h5->H5Eclear2(H5E_DEFAULT);
            ct_h5_unlock();
        }
        if (im->fd >= 0) close(im->fd);
        for (int64_t k = 0; im->blocks && k < im->nblocks; k++) free(im->blocks[k]);
        free(im->blocks);
        free(im->labels);
        free(im->targets);
        free(im->mean);
        free(im->std);
        free(im->lut);
        free(im);
    }
    free(ds);
}

/* ---------------- opening ---------------- */

static int name_field(const ct_config *cfg, const cJSON *entry, const char *path, const char *key, char *out,
                      ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, key);
    if (!v) {
        snprintf(out, MAX_NAME, "%s", key);
        return CT_OK;
    }
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= MAX_NAME)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: expected the name of a dataset in the HDF5 file, such as \"%s\" "
                       "or \"train/%s\"", where, path, key, key, key);
    snprintf(out, MAX_NAME, "%s", v->valuestring);
    return CT_OK;
}

static int parse_entry(const ct_config *cfg, const cJSON *entry, const char *path, h5_impl *im, char *file,
                       size_t n, int64_t *limit, ct_err *err) {
    char where[1200];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "path");
    ct_config_where(cfg, v ? v : entry, where, sizeof where);
    if (!v || !cJSON_IsString(v) || !v->valuestring[0])
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.path: %s (expected the path of an HDF5 file, such as "
                       "\"data/fmnist.h5\")", where, path, v ? "not a file path" : "missing");
    ct_config_resolve_path(cfg, v->valuestring, file, n);
    int rc = name_field(cfg, entry, path, "images", im->img.name, err);
    if (!rc) rc = name_field(cfg, entry, path, "labels", im->lab.name, err);
    if (rc) return rc;
    v = cJSON_GetObjectItemCaseSensitive(entry, "limit");
    if (v) {
        ct_config_where(cfg, v, where, sizeof where);
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 1e12)
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.limit: expected a positive integer (samples to use)", where, path);
        *limit = (int64_t)v->valuedouble;
    }
    return CT_OK;
}

/* libhdf5 1.10 crashes on some corrupt files (fuzz_hdf5: a memcpy into a NULL buffer under
 * H5Gget_info, the malloc of a size read from a mutated symbol table node having failed). So the
 * metadata ctrain reads is first parsed in a child process, fork()ed with the lock held (no thread
 * is inside libhdf5 then): a child killed by a signal is a file libhdf5 cannot parse safely, and
 * ctrain reports it (exit 3) instead of crashing. The child's errors are ignored: the parent's own
 * pass reports them. It costs one fork and a second metadata parse per open; the sample reads
 * later (chunk index lookups, decompression) are not covered. */
static int survives_in_child(const char *path, void (*parse)(void *), void *ctx, ct_err *err) {
    fflush(NULL); /* nothing buffered is written twice */
    pid_t pid = fork();
    if (pid < 0) return CT_OK; /* no process to spare: go on without the probe */
    if (pid == 0) {
        parse(ctx);
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return CT_OK;
    char how[96]; /* a signal; or an exit status, as a sanitizer's crash handler leaves it */
    if (WIFSIGNALED(status)) snprintf(how, sizeof how, "signal %d, %s", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(how, sizeof how, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return ct_errf(err, CT_ERR_DATA, "%s: libhdf5 crashed (%s) reading the file's metadata: a corrupt file (the parse "
                   "ran in a child process first, so ctrain can say so)", path, how);
}

static int open_file(h5_impl *im, ct_dataset *ds, ct_err *err);

typedef struct open_probe {
    h5_impl *im;
    ct_dataset *ds;
} open_probe;

static void open_in_child(void *ctx) {
    open_probe *p = ctx;
    ct_err e = {0};
    open_file(p->im, p->ds, &e);
}

/* The file and both datasets, checked (lock held). */
static int open_file(h5_impl *im, ct_dataset *ds, ct_err *err) {
    const ct_h5 *h5 = im->h5;
    const char *path = ds->source;
    char why[400];
    im->file = h5->H5Fopen(path, CT_H5F_ACC_RDONLY, H5P_DEFAULT);
    if (im->file < 0) {
        ct_h5_why(h5, why, sizeof why);
        return ct_errf(err, CT_ERR_DATA, "%s: libhdf5 cannot open it: %s", path, why);
    }
    /* libhdf5's chunk cache serves the reads past BLOCK_CACHE_MAX */
    hid_t dapl = h5->H5Pcreate(h5->dataset_access);
    if (dapl >= 0) h5->H5Pset_chunk_cache(dapl, 10007, CHUNK_CACHE, 1.0);
    int rc = describe(im, path, &im->img, dapl, err);
    if (!rc) rc = describe(im, path, &im->lab, H5P_DEFAULT, err);
    if (dapl >= 0) h5->H5Pclose(dapl);
    if (!rc) rc = check_images(im, path, ds, err);
    if (!rc) rc = read_labels(im, path, ds, err);
    if (!rc && im->img.offset < 0) { /* read through libhdf5: blocks of a chunk's rows, at most BLOCK_MAX bytes */
        int64_t sample_bytes = im->per * (int64_t)im->img.elem;
        int64_t rows = im->img.chunk_rows ? im->img.chunk_rows : UNCHUNKED_BLOCK_ROWS;
        if (rows > (int64_t)BLOCK_MAX / sample_bytes) rows = (int64_t)BLOCK_MAX / sample_bytes;
        im->block_rows = rows < 1 ? 1 : rows;
        im->nblocks = (im->img.dims[0] + im->block_rows - 1) / im->block_rows;
        im->blocks = ct_xcalloc((size_t)im->nblocks, sizeof *im->blocks);
    }
    return rc;
}

int ct_hdf5_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out, ct_err *err) {
    *out = NULL;
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    h5_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "hdf5";
    ds->decode = h5_decode;
    ds->close = h5_close;
    im->fd = -1;
    im->file = -1;
    im->img = (h5_array){.role = "images", .dset = -1, .space = -1};
    im->lab = (h5_array){.role = "labels", .dset = -1, .space = -1};
    int64_t limit = 0;
    int rc = parse_entry(cfg, entry, path, im, ds->source, sizeof ds->source, &limit, err);
    if (!rc) rc = ct_h5_precheck(ds->source, err);
    if (!rc) {
        im->fd = open(ds->source, O_RDONLY | O_CLOEXEC);
        if (im->fd < 0) rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", ds->source, strerror(errno));
    }
    const ct_h5 *h5 = NULL;
    if (!rc) rc = ct_h5_load(&h5, err);
    if (!rc) {
        ct_h5_lock(h5);
        im->h5 = h5;
        open_probe probe = {im, ds};
        rc = survives_in_child(ds->source, open_in_child, &probe, err);
        if (!rc) rc = open_file(im, ds, err);
        ct_h5_unlock();
    }
    if (!rc) {
        ds->count = limit > 0 && limit < im->img.dims[0] ? limit : im->img.dims[0];
        ds->sample_dtype = CT_F32;
        im->mean = ct_xmalloc((size_t)im->channels * sizeof *im->mean);
        im->std = ct_xmalloc((size_t)im->channels * sizeof *im->std);
        rc = ct_data_normalize_parse(cfg, im->channels, im->mean, im->std, err);
    }
    if (!rc && im->img.kind == EL_U8) {
        im->lut = ct_data_u8_lut(im->channels, im->mean, im->std);
        ds->decode_u8 = h5_decode_u8;
    }
    if (rc) {
        h5_close(ds);
        return rc;
    }
    *out = ds;
    return CT_OK;
}

/* ---------------- ctrain info ---------------- */

bool ct_hdf5_is_file(const char *path) {
    return ct_h5_is_file(path);
}

/* One line for the link `name` of the root group (lock held). */
static void info_link(const ct_h5 *h5, hid_t file, const char *name, FILE *out) {
    h5_array a = {.role = "info", .dset = -1, .space = -1, .offset = -1};
    snprintf(a.name, sizeof a.name, "%s", name);
    a.dset = h5->H5Dopen2(file, name, H5P_DEFAULT);
    if (a.dset < 0) {
        h5->H5Eclear2(H5E_DEFAULT);
        fprintf(out, "    %s: not a dataset (a group or another object)\n", name);
        return;
    }
    hid_t t = h5->H5Dget_type(a.dset);
    if (t >= 0) {
        type_text(h5, t, &a);
        h5->H5Tclose(t);
    }
    hid_t space = h5->H5Dget_space(a.dset);
    hsize_t dims[H5S_MAX_RANK];
    int nd = space >= 0 ? h5->H5Sget_simple_extent_dims(space, dims, NULL) : -1;
    fprintf(out, "    %s: %s [", name, a.type_text);
    for (int d = 0; d < nd; d++) fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    fprintf(out, "]");
    hid_t dcpl = h5->H5Dget_create_plist(a.dset);
    H5D_layout_t layout = dcpl >= 0 ? h5->H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    if (layout == H5D_CHUNKED) {
        hsize_t chunk[H5S_MAX_RANK];
        int cn = h5->H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
        fprintf(out, ", chunked [");
        for (int d = 0; d < cn; d++) fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)chunk[d]);
        fprintf(out, "]");
        int nf = h5->H5Pget_nfilters(dcpl);
        for (int k = 0; k < nf; k++) {
            char fname[64] = "";
            unsigned flags, config, cd[8];
            size_t ncd = 8;
            h5->H5Pget_filter2(dcpl, (unsigned)k, &flags, &ncd, cd, sizeof fname, fname, &config);
            fprintf(out, "%s%s", k ? ", " : ", filters: ", fname[0] ? fname : "unnamed");
        }
    } else {
        fprintf(out, ", %s", layout == H5D_CONTIGUOUS ? "contiguous" : layout == H5D_COMPACT ? "compact" : "other layout");
    }
    fputc('\n', out);
    if (dcpl >= 0) h5->H5Pclose(dcpl);
    if (space >= 0) h5->H5Sclose(space);
    h5->H5Dclose(a.dset);
    h5->H5Eclear2(H5E_DEFAULT);
}

/* ct_hdf5_info's listing (lock held). */
static int info_locked(const ct_h5 *h5, const char *path, FILE *out, ct_err *err) {
    int rc = CT_OK;
    char why[400];
    hid_t file = h5->H5Fopen(path, CT_H5F_ACC_RDONLY, H5P_DEFAULT);
    H5G_info_t info;
    if (file < 0 || h5->H5Gget_info(file, &info) < 0) {
        ct_h5_why(h5, why, sizeof why);
        rc = ct_errf(err, CT_ERR_DATA, "%s: libhdf5 cannot read it: %s", path, why);
    } else {
        fprintf(out, "hdf5 file: %s\n  root group: %llu links\n", path, (unsigned long long)info.nlinks);
        for (hsize_t k = 0; k < info.nlinks && k < 200; k++) {
            char name[MAX_NAME];
            if (h5->H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof name, H5P_DEFAULT) < 0)
                break;
            info_link(h5, file, name, out);
        }
        fprintf(out, "  read it with {\"format\": \"hdf5\", \"path\": \"%s\", \"images\": DATASET, \"labels\": "
                "DATASET}\n", path);
    }
    if (file >= 0) h5->H5Fclose(file);
    h5->H5Eclear2(H5E_DEFAULT);
    return rc;
}

typedef struct info_probe {
    const ct_h5 *h5;
    const char *path;
} info_probe;

static void info_in_child(void *ctx) {
    info_probe *p = ctx;
    FILE *devnull = fopen("/dev/null", "w");
    ct_err e = {0};
    if (devnull) info_locked(p->h5, p->path, devnull, &e);
}

int ct_hdf5_info(const char *path, FILE *out, ct_err *err) {
    const ct_h5 *h5 = NULL;
    int rc = ct_h5_precheck(path, err);
    if (!rc) rc = ct_h5_load(&h5, err);
    if (rc) return rc;
    ct_h5_lock(h5);
    info_probe probe = {h5, path};
    rc = survives_in_child(path, info_in_child, &probe, err);
    if (!rc) rc = info_locked(h5, path, out, err);
    ct_h5_unlock();
    return rc;
}

#else /* built without libhdf5's headers */

static int no_hdf5(const char *what, ct_err *err) {
    return ct_errf(err, CT_ERR_RUNTIME, "%s: this ctrain was built without HDF5 support (libhdf5's headers were "
                   "missing); install them and rebuild: make deps && make", what);
}

int ct_hdf5_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out, ct_err *err) {
    (void)cfg, (void)entry;
    *out = NULL;
    return no_hdf5(path, err);
}

bool ct_hdf5_is_file(const char *path) {
    return ct_h5_is_file(path);
}

int ct_hdf5_info(const char *path, FILE *out, ct_err *err) {
    (void)out;
    return no_hdf5(path, err);
}

#endif

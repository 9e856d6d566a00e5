/* hdf5.c: HDF5 files (h5py's, Keras's, PyTables' arrays) through the dataset seam.
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
 * Any layout (contiguous, compact, chunked, chunks never written: the fill value) with the
 * filters ctrain decodes itself: deflate (gzip), shuffle, fletcher32. A dataset with another
 * filter (szip, lzf, blosc and other plugins) is refused at open naming the filter, with the
 * h5repack command that rewrites it.
 *
 * How it reads: libhdf5 (Debian's 1.10, which crashes on some corrupt files) runs only in a child
 * process, the metadata probe (hdf5_probe.h), which resolves where each dataset's bytes are
 * (hdf5_layout.h). This process checks that answer as hostile input and reads the samples itself
 * (hdf5_rows.h): one pread per sample of a contiguous dataset; for a chunked one, a block of
 * samples (a chunk's rows) at a time, decoded once and kept up to 256 MiB per dataset, so that a
 * shuffled epoch decompresses each chunk once (BLOCK_CACHE_MAX). No lock: the loader's workers
 * read in parallel, and a block two of them decode at once is kept once. The labels are read
 * whole at open (every label checked, the class count known), converted from any integer width,
 * sign and byte order.
 *
 * Bad input: the shapes, element types and counts are checked at open, before any data is read, and
 * errors name the file and the dataset (CT_ERR_DATA: exit 3). The file's signature and superblock
 * are checked first (hdf5_lib.h); a probe that crashes is a corrupt file (exit 3); a chunk that
 * does not decode fails its samples at decode (where data.skip_corrupt can count it). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util/fs.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/hdf5_info.h"
#include "core/data/hdf5_layout.h"
#include "core/data/hdf5_lib.h"
#include "core/data/hdf5_probe.h"
#include "core/data/hdf5_rows.h"
#include "core/data/transform.h"

enum { MAX_NAME = 256 };
/* Chunked samples are read in blocks of consecutive samples (a chunk's rows, at most BLOCK_MAX
 * bytes), kept decoded up to BLOCK_CACHE_MAX bytes per dataset; past that, one sample per read
 * (its chunks decoded each time). Why: decompressing a 64-sample chunk for each of its samples
 * costs 64x the inflate of reading it once. */
#define BLOCK_CACHE_MAX ((size_t)256 << 20)
#define BLOCK_MAX ((size_t)16 << 20)

typedef enum { EL_U8, EL_F32, EL_F64, EL_INT, EL_OTHER } elem_kind;

/* One dataset of the file, as checked at open. */
typedef struct h5_array {
    char name[MAX_NAME];
    const char *role;            /* "images" or "labels", for messages */
    ct_h5_layout l;              /* where its bytes are (checked by ct_h5_reply_decode) */
    elem_kind kind;
    char type_text[48];          /* "uint8", "float32", "int16 big-endian", ... */
} h5_array;

typedef struct h5_impl {
    int fd;                      /* pread by every worker */
    h5_array img, lab;
    int64_t per;                 /* elements per sample */
    /* Chunked images: blocks of block_rows samples kept decoded (see BLOCK_CACHE_MAX): blocks[k]
     * holds samples [k * block_rows, ...) as native elements, NULL until read; published with a
     * compare-and-swap by the worker that decoded it, read with atomic loads, freed at close.
     * cached: their bytes (atomic). */
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

static void describe_type(h5_array *a) {
    const ct_h5_layout *l = &a->l;
    ct_h5_type_text(l, a->type_text, sizeof a->type_text);
    bool whole = l->elem == 1 || l->elem == 2 || l->elem == 4 || l->elem == 8;
    if (l->cls == CT_H5_CLASS_INT && whole) a->kind = l->elem == 1 && !l->is_signed ? EL_U8 : EL_INT;
    else if (l->cls == CT_H5_CLASS_FLOAT && (l->elem == 4 || l->elem == 8)) a->kind = l->elem == 4 ? EL_F32 : EL_F64;
    else a->kind = EL_OTHER;
}

/* What the probe resolved for one dataset, checked against what this reader reads: the bytes it
 * declares must be stored in the file (compressed at most 1032:1, deflate's limit) before any
 * buffer is sized by them, and its filters must be ones ctrain decodes. */
static int check_array(const char *path, h5_array *a, ct_err *err) {
    const ct_h5_layout *l = &a->l;
    describe_type(a);
    uint64_t declared = 0;
    bool fits = ct_h5_block_bytes(l->dims, 0, l->ndim, l->elem, &declared);
    if (!fits || (declared > (1 << 20) && (declared - (1 << 20)) / 1032 > l->stored))
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) declares %s%llu bytes but the file stores %llu for "
                       "it: a corrupt header, or chunks never written (write every sample)", path, a->name, a->role,
                       fits ? "" : "more than ", fits ? (unsigned long long)declared : (1ull << 62),
                       (unsigned long long)l->stored);
    for (int k = 0; k < l->nfilters; k++) {
        if (ct_h5_filter_known(l->filters[k].id)) continue;
        char name[64];
        ct_h5_filter_name(l->filters[k].id, name, sizeof name);
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) is stored with the %s filter, which ctrain does not "
                       "decode (it decodes deflate/gzip, shuffle and fletcher32; `ctrain pack --from hdf5` reads "
                       "through the same reader); rewrite the file without it: h5repack -f NONE %s OUT.h5 (or -f "
                       "GZIP=4 to keep it compressed)", path, a->name, a->role, name, path);
    }
    return CT_OK;
}

static void shape_text(const h5_array *a, char *out, size_t n) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < a->l.ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, "%s%lld", d ? ", " : "", (long long)a->l.dims[d]);
    if (used < n) snprintf(out + used, n - used, "]");
}

/* Elements stored in byte order `little` into the host's, in place. */
static void to_native(uint8_t *p, size_t count, uint32_t elem, bool little) {
    bool host_little = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
    if (elem < 2 || little == host_little) return;
    for (size_t i = 0; i < count; i++, p += elem)
        for (uint32_t b = 0; b < elem / 2; b++) {
            uint8_t t = p[b];
            p[b] = p[elem - 1 - b];
            p[elem - 1 - b] = t;
        }
}

/* The images: uint8 or float, 2 to 5 dimensions. */
static int check_images(h5_impl *im, const char *path, ct_dataset *ds, ct_err *err) {
    h5_array *a = &im->img;
    char shape[160];
    shape_text(a, shape, sizeof shape);
    if (a->kind != EL_U8 && a->kind != EL_F32 && a->kind != EL_F64)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images) holds %s elements: expected uint8 (pixels) or "
                       "float32/float64 (convert it when writing the file, e.g. h5py's astype)", path, a->name,
                       a->type_text);
    if (a->l.ndim < 2)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images) has shape %s: expected [N, ...] with the "
                       "samples along the first dimension ([N, H, W], [N, C, H, W] or [N, F])", path, a->name, shape);
    ct_shape s = {0};
    const int64_t *dims = a->l.dims;
    if (a->l.ndim == 3) s = (ct_shape){.ndim = 3, .d = {1, dims[1], dims[2]}}; /* [N, H, W]: one channel, as IDX */
    else
        for (int d = 1; d < a->l.ndim; d++) s.d[s.ndim++] = dims[d];
    int64_t per = ct_shape_numel(&s);
    if (per > ((int64_t)1 << 30))
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images) has shape %s: %lld elements per sample (at most "
                       "2^30)", path, a->name, shape, (long long)per);
    ds->sample_shape = s;
    im->per = per;
    im->channels = s.ndim == 3 ? s.d[0] : 1;
    im->plane = per / im->channels;
    return CT_OK;
}

/* Stored integer element p (elem bytes, byte order, sign) as an int64 (unsigned values past
 * INT64_MAX: INT64_MAX, which no label accepts). */
static int64_t stored_int(const uint8_t *p, const ct_h5_layout *l) {
    uint64_t v = 0;
    for (uint32_t b = 0; b < l->elem; b++) v |= (uint64_t)p[l->little ? b : l->elem - 1 - b] << (8 * b);
    if (l->is_signed && l->elem < 8 && (v >> (8 * l->elem - 1) & 1)) v |= ~(uint64_t)0 << (8 * l->elem);
    if (!l->is_signed && v > (uint64_t)INT64_MAX) return INT64_MAX;
    return (int64_t)v;
}

/* Stored float element p (4 or 8 bytes, byte order) as float, rounded once from double. */
static float stored_float(const uint8_t *p, const ct_h5_layout *l) {
    uint8_t native[8];
    memcpy(native, p, l->elem);
    to_native(native, 1, l->elem, l->little);
    if (l->elem == 4) {
        float f;
        memcpy(&f, native, 4);
        return f;
    }
    double d;
    memcpy(&d, native, 8);
    return (float)d;
}

/* The labels: as many as images; read whole and checked. */
static int read_labels(h5_impl *im, const char *path, ct_dataset *ds, ct_err *err) {
    h5_array *a = &im->lab;
    const ct_h5_layout *l = &a->l;
    char shape[160], why[400];
    shape_text(a, shape, sizeof shape);
    bool classes = a->kind == EL_U8 || a->kind == EL_INT;
    if (a->kind == EL_OTHER || (classes && l->ndim != 1) || l->ndim > 2)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels) is %s with shape %s: expected [N] integers "
                       "(class indices) or [N] / [N, K] floats (targets)", path, a->name, a->type_text, shape);
    if (l->dims[0] != im->img.l.dims[0])
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels) has %lld samples, dataset \"%s\" (images) "
                       "%lld: they must have the same first dimension", path, a->name, (long long)l->dims[0],
                       im->img.name, (long long)im->img.l.dims[0]);
    int64_t n = l->dims[0], k = l->ndim == 2 ? l->dims[1] : 1;
    if (k > (1 << 20))
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels) has shape %s: more than 2^20 targets per sample",
                       path, a->name, shape);
    char what[1400];
    snprintf(what, sizeof what, "%s: dataset \"%s\" (labels), %lld x %lld values", path, a->name, (long long)n,
             (long long)k);
    uint8_t *raw = ct_try_malloc((size_t)(n * k) * l->elem, what, err); /* bounded by what the file stores (check_array) */
    if (!raw) return CT_ERR_RUNTIME;
    if (!ct_h5_read_rows(l, im->fd, 0, n, raw, why, sizeof why)) {
        free(raw);
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels): cannot read it: %s", path, a->name, why);
    }
    if (!classes) {
        if (!(im->targets = ct_try_malloc((size_t)(n * k) * sizeof(float), what, err))) {
            free(raw);
            return CT_ERR_RUNTIME;
        }
        for (int64_t j = 0; j < n * k; j++) im->targets[j] = stored_float(raw + (size_t)j * l->elem, l);
        free(raw);
        im->tdim = k;
        ds->target_dtype = CT_F32;
        ds->target_shape = (ct_shape){.ndim = 1, .d = {k}};
        snprintf(ds->label_note, sizeof ds->label_note, "%.900s: dataset \"%.200s\" holds %s targets, not class indices",
                 path, a->name, a->type_text);
        return CT_OK;
    }
    int64_t top = 0, at = 0;
    if (!(im->labels = ct_try_malloc((size_t)n * sizeof *im->labels, what, err))) {
        free(raw);
        return CT_ERR_RUNTIME;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = stored_int(raw + (size_t)i * l->elem, l);
        if (v < 0 || v > INT32_MAX) {
            free(raw);
            return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (labels): sample %lld has label %lld, not a class "
                           "index (0 to 2^31-1)", path, a->name, (long long)i, (long long)v);
        }
        im->labels[i] = (int32_t)v;
        if (v > top) top = v, at = i;
    }
    free(raw);
    ds->target_dtype = CT_I32;
    ds->classes = top + 1;
    snprintf(ds->label_note, sizeof ds->label_note, "%.900s: dataset \"%.200s\" sample %lld has label %lld, the largest",
             path, a->name, (long long)at, (long long)top);
    return CT_OK;
}

/* ---------------- reading a sample ---------------- */

/* Rows [first, first + rows) of the images as native elements into buf. */
static bool read_native(const h5_impl *im, int64_t first, int64_t rows, uint8_t *buf, char *why, size_t n) {
    const ct_h5_layout *l = &im->img.l;
    if (!ct_h5_read_rows(l, im->fd, first, rows, buf, why, n)) return false;
    to_native(buf, (size_t)(rows * im->per), l->elem, l->little);
    return true;
}

/* The block of sample i (chunked images), decoded and kept if the budget allows; NULL when it is
 * not kept (the caller reads the sample alone). */
static const uint8_t *block_of(const ct_dataset *ds, int64_t i) {
    h5_impl *im = ds->impl; /* the blocks are filled by whichever worker reads first */
    int64_t k = i / im->block_rows;
    uint8_t *block = __atomic_load_n(&im->blocks[k], __ATOMIC_ACQUIRE);
    if (block) return block;
    int64_t first = k * im->block_rows, rows = im->img.l.dims[0] - first;
    if (rows > im->block_rows) rows = im->block_rows;
    size_t bytes = (size_t)(rows * im->per) * im->img.l.elem;
    if (__atomic_add_fetch(&im->cached, bytes, __ATOMIC_RELAXED) > BLOCK_CACHE_MAX) {
        __atomic_sub_fetch(&im->cached, bytes, __ATOMIC_RELAXED);
        return NULL;
    }
    uint8_t *b = malloc(bytes);
    if (!b) {   /* no room to cache the block: its samples are read one by one */
        __atomic_sub_fetch(&im->cached, bytes, __ATOMIC_RELAXED);
        return NULL;
    }
    char why[400];
    uint8_t *expected = NULL;
    if (!read_native(im, first, rows, b, why, sizeof why)) { /* the sample alone, so only bad samples fail */
        free(b);
        __atomic_sub_fetch(&im->cached, bytes, __ATOMIC_RELAXED);
        return NULL;
    }
    if (__atomic_compare_exchange_n(&im->blocks[k], &expected, b, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return b;
    free(b); /* another worker decoded it meanwhile: keep theirs */
    __atomic_sub_fetch(&im->cached, bytes, __ATOMIC_RELAXED);
    return expected;
}

/* Sample i's elements (im->per of im->img.l.elem bytes, native byte order) into buf. */
static int read_sample(const ct_dataset *ds, int64_t i, uint8_t *buf, ct_err *err) {
    const h5_impl *im = ds->impl;
    size_t bytes = (size_t)im->per * im->img.l.elem;
    const uint8_t *block = im->blocks ? block_of(ds, i) : NULL;
    if (block) {
        memcpy(buf, block + (size_t)(i - i / im->block_rows * im->block_rows) * bytes, bytes);
        return CT_OK;
    }
    char why[400];
    if (read_native(im, i, 1, buf, why, sizeof why)) return CT_OK;
    return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (images): sample %lld: %s", ds->source, im->img.name,
                   (long long)i, why);
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
    char what[sizeof ds->source + 64];
    snprintf(what, sizeof what, "%s: sample %lld", ds->source, (long long)i);
    uint8_t *buf = ct_try_malloc((size_t)im->per * im->img.l.elem, what, err);
    if (!buf) return CT_ERR_RUNTIME;
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
        if (im->fd >= 0) close(im->fd);
        for (int64_t k = 0; im->blocks && k < im->nblocks; k++) free(im->blocks[k]);
        free(im->blocks);
        ct_h5_layout_free(&im->img.l);
        ct_h5_layout_free(&im->lab.l);
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

/* The probe's answer for both datasets, checked; the labels read. */
static int open_file(h5_impl *im, ct_dataset *ds, ct_err *err) {
    const char *path = ds->source;
    ct_h5_reply r;
    int rc = ct_h5_probe(path, im->img.name, im->lab.name, &r, err);
    if (rc) return rc;
    im->img.l = r.layouts[0]; /* owned by im from here */
    im->lab.l = r.layouts[1];
    r.nlayouts = 0;
    ct_h5_reply_free(&r);
    rc = check_array(path, &im->img, err);
    if (!rc) rc = check_array(path, &im->lab, err);
    if (!rc) rc = check_images(im, path, ds, err);
    if (!rc) rc = read_labels(im, path, ds, err);
    if (!rc && im->img.l.storage == CT_H5_CHUNKED) { /* blocks of a chunk's rows, at most BLOCK_MAX bytes */
        int64_t sample_bytes = im->per * (int64_t)im->img.l.elem;
        int64_t rows = im->img.l.chunk[0] < im->img.l.dims[0] ? im->img.l.chunk[0] : im->img.l.dims[0];
        if (rows > (int64_t)BLOCK_MAX / sample_bytes) rows = (int64_t)BLOCK_MAX / sample_bytes;
        im->block_rows = rows < 1 ? 1 : rows;
        im->nblocks = (im->img.l.dims[0] + im->block_rows - 1) / im->block_rows;
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
    im->img.role = "images";
    im->lab.role = "labels";
    int64_t limit = 0;
    int rc = parse_entry(cfg, entry, path, im, ds->source, sizeof ds->source, &limit, err);
    if (!rc) rc = ct_h5_precheck(ds->source, err);
    if (!rc) {
        im->fd = ct_fs_open_input(ds->source);   /* checked regular by ct_h5_precheck */
        if (im->fd < 0) rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", ds->source, strerror(errno));
    }
    if (!rc) rc = open_file(im, ds, err);
    if (!rc) {
        ds->count = limit > 0 && limit < im->img.l.dims[0] ? limit : im->img.l.dims[0];
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

int ct_hdf5_info(const char *path, FILE *out, ct_err *err) {
    ct_h5_reply r;
    int rc = ct_h5_precheck(path, err);
    if (!rc) rc = ct_h5_probe(path, NULL, NULL, &r, err);
    if (rc) return rc;
    fputs(r.text, out);
    ct_h5_reply_free(&r);
    return CT_OK;
}

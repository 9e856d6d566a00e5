/* idx.c: IDX files (MNIST / Fashion-MNIST), plain or gzip-compressed.
 *
 * Format: magic 00 00 TT DD (TT element type, DD number of dimensions), DD big-endian u32 sizes,
 * then the elements in C order, big-endian. Both files are read whole at open (Fashion-MNIST's
 * training images are 47 MB as u8), kept in their stored type, and decoded per sample: u8 pixels
 * are scaled to [0, 1], then normalised per channel with data.transform.normalize.
 *
 * Entry fields: {"format": "idx", "images": FILE, "labels": FILE, "limit": N (optional: use the
 * first N samples)}. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/transform.h"
#include "core/util/fs.h"

enum { IDX_U8 = 0x08, IDX_I8 = 0x09, IDX_I16 = 0x0B, IDX_I32 = 0x0C, IDX_F32 = 0x0D, IDX_F64 = 0x0E };
#define IDX_MAX_DIMS 5

typedef struct idx_file {
    char path[1024];
    int type;                    /* IDX_* */
    int elem;                    /* bytes per element */
    int ndim;
    int64_t dims[IDX_MAX_DIMS];
    uint8_t *data;               /* dims[0] * per_item elements, big-endian as stored */
    int64_t per_item;            /* elements per item (product of dims[1..]) */
} idx_file;

typedef struct idx_impl {
    idx_file images;
    char labels_path[1024];      /* for ct_dataset_fingerprint (the labels are decoded at open) */
    int32_t *labels;             /* [count] decoded */
    int64_t channels, plane;     /* sample = channels x plane elements */
    float *mean, *std;           /* [channels] */
    float *lut;                  /* u8 images: [channels][256] decoded values */
} idx_impl;

static int elem_size(int type) {
    switch (type) {
    case IDX_U8:
    case IDX_I8: return 1;
    case IDX_I16: return 2;
    case IDX_I32:
    case IDX_F32: return 4;
    case IDX_F64: return 8;
    default: return 0;
    }
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Element i of a big-endian array as double. */
static double elem_at(const uint8_t *data, int type, int64_t i) {
    switch (type) {
    case IDX_U8: return data[i];
    case IDX_I8: return (int8_t)data[i];
    case IDX_I16: {
        const uint8_t *p = data + 2 * i;
        return (int16_t)(uint16_t)(p[0] << 8 | p[1]);
    }
    case IDX_I32: return (int32_t)be32(data + 4 * i);
    case IDX_F32: {
        uint32_t u = be32(data + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: {
        uint64_t u = (uint64_t)be32(data + 8 * i) << 32 | be32(data + 8 * i + 4);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    }
}

/* Read exactly n bytes at uncompressed offset *off; CT_ERR_DATA naming file and offset when short. */
static int read_exact(gzFile f, const char *path, void *buf, size_t n, uint64_t *off, const char *what,
                      ct_err *err) {
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
        int got = gzread(f, (uint8_t *)buf + done, (unsigned)chunk);
        if (got < 0) {
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            return ct_errf(err, CT_ERR_DATA, "%s: unreadable at byte offset %llu while reading %s: %s",
                           path, (unsigned long long)(*off + done), what,
                           zerr == Z_ERRNO ? strerror(errno) : msg);
        }
        if (got == 0)
            return ct_errf(err, CT_ERR_DATA,
                           "%s: truncated at byte offset %llu%s: %s needs %zu bytes, the file has %zu",
                           path, (unsigned long long)(*off + done),
                           gzdirect(f) ? "" : " (uncompressed)", what, n, done);
        done += (size_t)got;
    }
    *off += n;
    return CT_OK;
}

/* Read a whole IDX file into f. `field` names the config field for messages. */
static int idx_read(const char *path, const char *field, idx_file *out, ct_err *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    int fd, rc = ct_fs_open_regular(path, CT_ERR_DATA, "an IDX file", &fd, err);   /* a FIFO: refused */
    if (rc) {
        char why[CT_ERR_MSG];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        return ct_errf(err, rc, "%s: %s", field, why);
    }
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot open %s: out of memory", field, path);
    }
    gzbuffer(f, 1u << 17);
    uint64_t off = 0;
    uint8_t head[4 + 4 * IDX_MAX_DIMS];
    rc = read_exact(f, path, head, 4, &off, "the IDX magic number", err);
    if (rc) goto fail;
    out->type = head[2];
    out->ndim = head[3];
    out->elem = elem_size(out->type);
    if (head[0] != 0 || head[1] != 0 || out->elem == 0 || out->ndim < 1 || out->ndim > IDX_MAX_DIMS) {
        rc = ct_errf(err, CT_ERR_DATA,
                     "%s: not an IDX file: magic %02x %02x %02x %02x (expected 00 00 TT DD with TT one "
                     "of 08 09 0B 0C 0D 0E and DD 1..%d)", path, head[0], head[1], head[2], head[3],
                     IDX_MAX_DIMS);
        goto fail;
    }
    rc = read_exact(f, path, head + 4, 4 * (size_t)out->ndim, &off, "the dimension sizes", err);
    if (rc) goto fail;
    uint64_t total = 1;
    for (int d = 0; d < out->ndim; d++) {
        out->dims[d] = be32(head + 4 + 4 * d);
        if (out->dims[d] == 0) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: dimension %d has size 0", path, d);
            goto fail;
        }
        total *= (uint64_t)out->dims[d];
        if (total > ((uint64_t)1 << 38)) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: header sizes give more than 2^38 elements", path);
            goto fail;
        }
    }
    out->per_item = (int64_t)(total / (uint64_t)out->dims[0]);
    size_t bytes = (size_t)total * (size_t)out->elem;
    /* Never trust the header with an allocation: the data must fit in the file. Deflate expands
     * at most ~1032:1, so a .gz file bounds its content too (a 44-byte file cannot claim 4 GB). */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        uint64_t fsize = (uint64_t)st.st_size, header = 4 + 4 * (uint64_t)out->ndim;
        bool gz = gzdirect(f) == 0;
        uint64_t limit = gz ? fsize * 1032 + 4096 : (fsize > header ? fsize - header : 0);
        if ((uint64_t)bytes > limit && gz) {
            rc = ct_errf(err, CT_ERR_DATA,
                         "%s: truncated or not an IDX file: the header declares %llu bytes of data, more "
                         "than %llu compressed bytes can hold", path, (unsigned long long)bytes,
                         (unsigned long long)fsize);
            goto fail;
        }
        if ((uint64_t)bytes > limit) {
            rc = ct_errf(err, CT_ERR_DATA,
                         "%s: truncated at byte offset %llu: the header declares %llu bytes of data after "
                         "its %llu header bytes", path, (unsigned long long)fsize, (unsigned long long)bytes,
                         (unsigned long long)header);
            goto fail;
        }
    }
    out->data = malloc(bytes);
    if (!out->data) {
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: out of memory reading %zu bytes", path, bytes);
        goto fail;
    }
    char what[160];
    snprintf(what, sizeof what, "the data of %lld records", (long long)out->dims[0]);
    rc = read_exact(f, path, out->data, bytes, &off, what, err);
    if (rc) goto fail;
    uint8_t extra;
    if (gzread(f, &extra, 1) > 0) {
        rc = ct_errf(err, CT_ERR_DATA, "%s: more bytes than the header describes (data should end at "
                     "byte offset %llu)", path, (unsigned long long)off);
        goto fail;
    }
    gzclose(f);
    return CT_OK;
fail:
    gzclose(f);
    free(out->data);
    out->data = NULL;
    return rc;
}

static void idx_close(ct_dataset *ds) {
    idx_impl *im = ds->impl;
    if (im) {
        free(im->images.data);
        free(im->labels);
        free(im->mean);
        free(im->std);
        free(im->lut);
        free(im);
    }
    free(ds);
}

static int idx_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    const idx_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld out of range (%lld records)", ds->source,
                       (long long)i, (long long)ds->count);
    float *x = input; /* [channels, plane] */
    const idx_file *f = &im->images;
    if (im->lut) {
        const uint8_t *src = f->data + i * f->per_item;
        for (int64_t c = 0; c < im->channels; c++) {
            const float *lut = im->lut + 256 * c;
            for (int64_t j = 0; j < im->plane; j++) x[c * im->plane + j] = lut[src[c * im->plane + j]];
        }
    } else {
        for (int64_t c = 0; c < im->channels; c++)
            for (int64_t j = 0; j < im->plane; j++) {
                int64_t k = c * im->plane + j;
                x[k] = (float)((elem_at(f->data, f->type, i * f->per_item + k) - im->mean[c]) / im->std[c]);
            }
    }
    if (target) *(int32_t *)target = im->labels[i];
    return CT_OK;
}

/* data.transform.on_device: the stored u8 pixels of sample i (only u8 IDX files). */
static int idx_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err) {
    const idx_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld out of range (%lld records)", ds->source,
                       (long long)i, (long long)ds->count);
    memcpy(input, im->images.data + i * im->images.per_item, (size_t)(im->channels * im->plane));
    if (target) *(int32_t *)target = im->labels[i];
    return CT_OK;
}

static const char *idx_file_at(const ct_dataset *ds, int64_t k) {
    const idx_impl *im = ds->impl;
    return k == 0 ? im->images.path : k == 1 ? im->labels_path : NULL;
}

/* Required string field of the entry, resolved against the config's directory. */
static int path_field(const ct_config *cfg, const cJSON *entry, const char *path, const char *key,
                      char *out, size_t n, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, key);
    char where[1200];
    ct_config_where(cfg, v ? v : entry, where, sizeof where);
    if (!v)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: missing (expected the path of an IDX %s file)",
                       where, path, key, key);
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: expected a file path (string)", where, path, key);
    ct_config_resolve_path(cfg, v->valuestring, out, n);
    return CT_OK;
}

static int check_fields(const ct_config *cfg, const cJSON *entry, const char *path, int64_t *limit,
                        ct_err *err) {
    static const char *const known[] = {"format", "images", "labels", "limit"};
    char where[1200];
    const cJSON *item;
    *limit = 0;
    cJSON_ArrayForEach(item, entry) {
        bool ok = false;
        for (int i = 0; i < CT_ARRAY_LEN(known); i++) ok |= strcmp(item->string, known[i]) == 0;
        ct_config_where(cfg, item, where, sizeof where);
        if (!ok) {
            const char *s = ct_suggest(item->string, known, CT_ARRAY_LEN(known));
            ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: unknown key for format idx (expected images, "
                    "labels, limit)", where, path, item->string);
            if (s) ct_err_append(err, "did you mean \"%s\"?", s);
            return CT_ERR_CONFIG;
        }
        if (strcmp(item->string, "limit") == 0) {
            double d = cJSON_IsNumber(item) ? item->valuedouble : -1;
            if (d < 1 || d != floor(d) || d > 1e12)
                return ct_errf(err, CT_ERR_CONFIG, "%s: %s.limit: expected a positive integer (samples "
                               "to use)", where, path);
            *limit = (int64_t)d;
        }
    }
    return CT_OK;
}

/* Labels: one dimension of integers >= 0, as many as images. */
static int decode_labels(const idx_file *lf, const idx_file *img, idx_impl *im, int64_t count,
                         ct_dataset *ds, ct_err *err) {
    if (lf->ndim != 1 || lf->type == IDX_F32 || lf->type == IDX_F64)
        return ct_errf(err, CT_ERR_DATA, "%s: expected a 1-dimensional IDX file of integer labels "
                       "(magic 00 00 08 01), got type 0x%02X with %d dimensions", lf->path, lf->type,
                       lf->ndim);
    if (lf->dims[0] != img->dims[0])
        return ct_errf(err, CT_ERR_DATA, "%s has %lld labels but %s has %lld images", lf->path,
                       (long long)lf->dims[0], img->path, (long long)img->dims[0]);
    char what[sizeof lf->path + 40];
    snprintf(what, sizeof what, "%s: %lld labels", lf->path, (long long)count);
    if (!(im->labels = ct_try_malloc((size_t)count * sizeof *im->labels, what, err))) return CT_ERR_RUNTIME;
    int32_t maxl = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < count; i++) {
        double v = elem_at(lf->data, lf->type, i);
        if (v < 0)
            return ct_errf(err, CT_ERR_DATA, "%s: record %lld: label %.0f is negative", lf->path,
                           (long long)i, v);
        im->labels[i] = (int32_t)v;
        if (im->labels[i] > maxl) {
            maxl = im->labels[i];
            at = i;
        }
    }
    ds->classes = (int64_t)maxl + 1;
    /* ds->source is the images file: a message about labels must name this one. */
    snprintf(ds->label_note, sizeof ds->label_note, "%s: record %lld has label %d, the largest", lf->path,
             (long long)at, maxl);
    return CT_OK;
}

/* Sample shape: N x H x W images become [1, H, W]; other ranks keep their dimensions. */
static void sample_geometry(const idx_file *f, ct_dataset *ds, idx_impl *im) {
    ct_shape s = {0};
    if (f->ndim == 3) {
        s.ndim = 3;
        s.d[0] = 1;
        s.d[1] = f->dims[1];
        s.d[2] = f->dims[2];
    } else {
        s.ndim = f->ndim - 1;
        for (int d = 1; d < f->ndim; d++) s.d[d - 1] = f->dims[d];
    }
    ds->sample_shape = s;
    im->channels = s.ndim == 3 ? s.d[0] : 1;
    im->plane = f->per_item / im->channels;
}

int ct_idx_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                ct_err *err) {
    *out = NULL;
    int64_t limit;
    char img_path[1024], lab_path[1024];
    int rc = check_fields(cfg, entry, path, &limit, err);
    if (!rc) rc = path_field(cfg, entry, path, "images", img_path, sizeof img_path, err);
    if (!rc) rc = path_field(cfg, entry, path, "labels", lab_path, sizeof lab_path, err);
    if (rc) return rc;

    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    idx_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "idx";
    ds->decode = idx_decode;
    ds->file = idx_file_at;
    ds->close = idx_close;
    snprintf(ds->source, sizeof ds->source, "%s", img_path);
    snprintf(im->labels_path, sizeof im->labels_path, "%s", lab_path);

    char field[96];
    idx_file lf = {0};
    snprintf(field, sizeof field, "%s.images", path);
    rc = idx_read(img_path, field, &im->images, err);
    if (!rc && im->images.ndim < 2)
        rc = ct_errf(err, CT_ERR_DATA, "%s: expected images (N x H x W or N x features), got a "
                     "1-dimensional IDX file", img_path);
    snprintf(field, sizeof field, "%s.labels", path);
    if (!rc) rc = idx_read(lab_path, field, &lf, err);
    ds->count = im->images.dims[0];
    if (limit > 0 && limit < ds->count) ds->count = limit;
    if (!rc) rc = decode_labels(&lf, &im->images, im, ds->count, ds, err);
    free(lf.data);
    if (rc) {
        idx_close(ds);
        return rc;
    }
    sample_geometry(&im->images, ds, im);
    ds->sample_dtype = CT_F32;
    ds->target_shape.ndim = 0;
    ds->target_dtype = CT_I32;

    im->mean = ct_xmalloc((size_t)im->channels * sizeof(float));
    im->std = ct_xmalloc((size_t)im->channels * sizeof(float));
    rc = ct_data_normalize_parse(cfg, im->channels, im->mean, im->std, err);
    if (rc) {
        idx_close(ds);
        return rc;
    }
    if (im->images.type == IDX_U8) {
        /* Scale to [0, 1], then normalise: one table lookup per pixel at decode. */
        im->lut = ct_data_u8_lut(im->channels, im->mean, im->std);
        ds->decode_u8 = idx_decode_u8;
    }
    *out = ds;
    return CT_OK;
}

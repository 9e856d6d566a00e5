/* shard.c: ctrain's packed format, writer and mmap reader (see shard.h, docs/formats.md).
 *
 * Entry fields: {"format": "shard", "path": DIR or FILE.cts, "limit": N}. Checked at open: the
 * magic, version, header CRC, file size (catches truncation), index CRC, every index entry's
 * bounds and sizes, and the same sample geometry in every shard. Checked per record at decode:
 * the record CRC (so a flipped byte anywhere is caught exactly where it is read), decompression,
 * and the label range. u8 records are scaled to [0, 1] and normalised like images; f32 records
 * are normalised as stored. */
#include "core/data/shard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/util/fs.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/transform.h"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

static uint32_t crc(const uint8_t *p, size_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) { /* zlib takes uInt lengths */
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

static size_t encoding_size(uint32_t enc) { return enc == CT_SHARD_U8 ? 1 : enc == CT_SHARD_F32 ? 4 : 0; }

/* ---------------- writer ---------------- */

static int has_shards(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        found |= n > 4 && strcmp(e->d_name + n - 4, ".cts") == 0;
    }
    closedir(d);
    return found;
}

static int start_shard(ct_shard_writer *w, ct_err *err) {
    snprintf(w->final, sizeof w->final, "%s/shard-%06d.cts", w->dir, w->shard_no);
    snprintf(w->tmp, sizeof w->tmp, "%s/.shard-%06d.cts.tmp", w->dir, w->shard_no);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create: %s", w->tmp, strerror(errno));
    uint8_t zero[CT_SHARD_HEADER] = {0};
    if (fwrite(zero, 1, sizeof zero, w->f) != sizeof zero)
        return ct_fs_write_error(err, w->tmp, "write", errno);
    w->data_end = CT_SHARD_HEADER;
    w->n_in_shard = 0;
    return CT_OK;
}

/* Index, then the header with both CRCs; rename into place. */
static int finish_shard(ct_shard_writer *w, ct_err *err) {
    size_t ib = (size_t)w->n_in_shard * CT_SHARD_ENTRY;
    uint8_t h[CT_SHARD_HEADER] = {0};
    memcpy(h, CT_SHARD_MAGIC, 8);
    put32(h + 8, CT_SHARD_VERSION);
    put32(h + 12, w->encoding);
    put64(h + 16, w->n_in_shard);
    put64(h + 24, w->data_end);
    put32(h + 32, (uint32_t)w->shape.ndim);
    for (int d = 0; d < w->shape.ndim; d++) put32(h + 36 + 4 * d, (uint32_t)w->shape.d[d]);
    put32(h + 52, w->classes);
    put32(h + 56, crc(w->index, ib));
    put32(h + 60, crc(h, 60));
    bool ok = fwrite(w->index, 1, ib, w->f) == ib && fseek(w->f, 0, SEEK_SET) == 0 &&
              fwrite(h, 1, sizeof h, w->f) == sizeof h && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    ok &= fclose(w->f) == 0;
    w->f = NULL;
    if (!ok || rename(w->tmp, w->final) != 0)
        return ct_fs_write_error(err, w->final, "write", errno);
    w->shard_no++;
    return CT_OK;
}

int ct_shard_writer_open(ct_shard_writer *w, const char *dir, uint32_t encoding, const ct_shape *shape,
                         uint32_t classes, size_t shard_bytes, bool compress, ct_err *err) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    if (shape->ndim < 1 || shape->ndim > 4 || !encoding_size(encoding))
        return ct_errf(err, CT_ERR_CONFIG, "%s: cannot pack samples of %d dimensions", dir, shape->ndim);
    w->encoding = encoding;
    w->shape = *shape;
    w->classes = classes;
    w->raw_bytes = (size_t)ct_shape_numel(shape) * encoding_size(encoding);
    w->shard_bytes = shard_bytes ? shard_bytes : (size_t)256 << 20;
    w->compress = compress;
    int rc = ct_fs_mkdirs(dir, err); /* like mkdir -p: --out may name a new nested folder */
    if (rc) return rc;
    if (has_shards(dir))
        return ct_errf(err, CT_ERR_CONFIG, "%s already holds .cts shards; remove them or choose "
                       "another --out directory", dir);
    return start_shard(w, err);
}

int ct_shard_write(ct_shard_writer *w, const void *record, int32_t label, ct_err *err) {
    if (w->data_end - CT_SHARD_HEADER >= w->shard_bytes) {
        int rc = finish_shard(w, err);
        if (!rc) rc = start_shard(w, err);
        if (rc) return rc;
    }
    const uint8_t *stored = record;
    uLongf zn = 0;
    uint32_t flags = 0;
    if (w->compress) {
        size_t bound = compressBound((uLong)w->raw_bytes);
        if (w->zcap < bound) {
            w->zbuf = ct_xrealloc(w->zbuf, bound);
            w->zcap = bound;
        }
        zn = (uLongf)bound;
        if (compress2(w->zbuf, &zn, record, (uLong)w->raw_bytes, Z_DEFAULT_COMPRESSION) == Z_OK &&
            zn < w->raw_bytes) {
            stored = w->zbuf;
            flags = CT_SHARD_ZLIB;
        }
    }
    size_t n = flags ? (size_t)zn : w->raw_bytes;
    if (fwrite(stored, 1, n, w->f) != n)
        return ct_fs_write_error(err, w->tmp, "write", errno);
    if (w->n_in_shard == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 1024;
        w->index = ct_xrealloc(w->index, (size_t)w->cap * CT_SHARD_ENTRY);
    }
    uint8_t *e = w->index + w->n_in_shard * CT_SHARD_ENTRY;
    put64(e, w->data_end);
    put32(e + 8, (uint32_t)n);
    put32(e + 12, (uint32_t)w->raw_bytes);
    put32(e + 16, crc(stored, n));
    put32(e + 20, (uint32_t)label);
    put32(e + 24, flags);
    put32(e + 28, 0);
    w->data_end += n;
    w->n_in_shard++;
    w->total++;
    return CT_OK;
}

void ct_shard_writer_discard(ct_shard_writer *w) {
    if (w->f) {
        fclose(w->f);
        remove(w->tmp);
        w->f = NULL;
    }
    free(w->index);
    free(w->zbuf);
    w->index = w->zbuf = NULL;
}

int ct_shard_writer_close(ct_shard_writer *w, ct_err *err) {
    int rc = CT_OK;
    if (w->f && (w->n_in_shard > 0 || w->shard_no == 0)) rc = finish_shard(w, err);
    ct_shard_writer_discard(w);
    return rc;
}

/* ---------------- reader ---------------- */

typedef struct shard_file {
    char path[1100];
    const uint8_t *map;
    size_t size;
    int64_t base, count;         /* global index of its first record; records */
} shard_file;

typedef struct shard_impl {
    shard_file *files;
    int nfiles;
    uint32_t encoding;
    size_t raw_bytes;
    int64_t channels, plane;
    float *lut;                  /* u8: [channels][256] */
    float mean[64], std[64];     /* f32: per channel (channels <= 64), else 0 / 1 */
} shard_impl;

static void shard_close(ct_dataset *ds) {
    shard_impl *im = ds->impl;
    if (im) {
        for (int i = 0; i < im->nfiles; i++)
            if (im->files[i].map) munmap((void *)im->files[i].map, im->files[i].size);
        free(im->files);
        free(im->lut);
        free(im);
    }
    free(ds);
}

/* Header and index of one mapped shard; fills geometry on the first, compares on the rest. */
static int check_shard(shard_file *f, ct_dataset *ds, shard_impl *im, bool first, ct_err *err) {
    const uint8_t *m = f->map;
    if (f->size < CT_SHARD_HEADER)
        return ct_errf(err, CT_ERR_DATA, "%s: truncated: %zu bytes, a shard header alone is %u", f->path,
                       f->size, CT_SHARD_HEADER);
    if (memcmp(m, CT_SHARD_MAGIC, 8) != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: not a ctrain shard (wrong magic number at offset 0)", f->path);
    if (get32(m + 60) != crc(m, 60))
        return ct_errf(err, CT_ERR_DATA, "%s: header checksum mismatch (stored 0x%08x, computed 0x%08x): "
                       "the shard is corrupt", f->path, get32(m + 60), crc(m, 60));
    if (get32(m + 8) != CT_SHARD_VERSION)
        return ct_errf(err, CT_ERR_DATA, "%s: shard version %u, this ctrain reads version %u", f->path,
                       get32(m + 8), CT_SHARD_VERSION);
    uint32_t enc = get32(m + 12), ndim = get32(m + 32);
    uint64_t count = get64(m + 16), ioff = get64(m + 24);
    if (!encoding_size(enc) || ndim < 1 || ndim > 4)
        return ct_errf(err, CT_ERR_DATA, "%s: unknown record encoding %u or %u dimensions", f->path, enc, ndim);
    ct_shape s = {.ndim = (int)ndim};
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        s.d[d] = get32(m + 36 + 4 * d);
        numel *= (uint64_t)s.d[d];
        if (s.d[d] == 0 || numel > (1u << 30))
            return ct_errf(err, CT_ERR_DATA, "%s: bad sample shape in the header", f->path);
    }
    if (count > (1u << 31) || ioff < CT_SHARD_HEADER || ioff > f->size ||
        (f->size - ioff) / CT_SHARD_ENTRY != count || (f->size - ioff) % CT_SHARD_ENTRY != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: truncated or extended: %zu bytes, the header gives %llu "
                       "records with the index at offset %llu (expected %llu bytes)", f->path, f->size,
                       (unsigned long long)count, (unsigned long long)ioff,
                       (unsigned long long)(ioff + count * CT_SHARD_ENTRY));
    const uint8_t *idx = m + ioff;
    if (crc(idx, (size_t)count * CT_SHARD_ENTRY) != get32(m + 56))
        return ct_errf(err, CT_ERR_DATA, "%s: index checksum mismatch at offset %llu: the shard is corrupt",
                       f->path, (unsigned long long)ioff);
    size_t raw = (size_t)numel * encoding_size(enc);
    for (uint64_t r = 0; r < count; r++) {
        const uint8_t *e = idx + r * CT_SHARD_ENTRY;
        uint64_t off = get64(e), stored = get32(e + 8);
        uint32_t flags = get32(e + 24);
        if (off < CT_SHARD_HEADER || off > ioff || stored > ioff - off || get32(e + 12) != raw ||
            (flags & ~(uint32_t)CT_SHARD_ZLIB) || (!(flags & CT_SHARD_ZLIB) && stored != raw))
            return ct_errf(err, CT_ERR_DATA, "%s: record %llu: index entry out of bounds or with wrong "
                           "sizes", f->path, (unsigned long long)r);
    }
    if (first) {
        im->encoding = enc;
        ds->sample_shape = s;
        ds->classes = get32(m + 52);
        im->raw_bytes = raw;
    } else if (enc != im->encoding || !ct_shape_eq(&s, &ds->sample_shape) ||
               (int64_t)get32(m + 52) != ds->classes) {
        return ct_errf(err, CT_ERR_DATA, "%s: sample encoding, shape or classes differ from %s", f->path,
                       im->files[0].path);
    }
    f->count = (int64_t)count;
    return CT_OK;
}

static int map_file(shard_file *f, ct_err *err) {
    int fd, rc = ct_fs_open_regular(f->path, CT_ERR_DATA, "a shard file", &fd, err);   /* a FIFO: refused */
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot stat: %s", f->path, strerror(errno));
    } else if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot map: %s", f->path, strerror(errno));
        else f->map = p;
    }
    f->size = (size_t)st.st_size;
    close(fd);
    return rc;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const shard_file *)a)->path, ((const shard_file *)b)->path);
}

/* path: a .cts file, or a directory whose *.cts files are the shards in name order. */
static int list_shards(const char *path, shard_impl *im, ct_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        im->files = ct_xcalloc(1, sizeof *im->files);
        snprintf(im->files[0].path, sizeof im->files[0].path, "%s", path);
        im->nfiles = 1;
        return CT_OK;
    }
    DIR *d = opendir(path);
    if (!d) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot read directory: %s", path, strerror(errno));
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || n < 5 || strcmp(e->d_name + n - 4, ".cts") != 0) continue;
        if (im->nfiles == cap) {
            cap = cap ? 2 * cap : 16;
            im->files = ct_xrealloc(im->files, (size_t)cap * sizeof *im->files);
        }
        memset(&im->files[im->nfiles], 0, sizeof *im->files);
        snprintf(im->files[im->nfiles++].path, sizeof im->files[0].path, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (im->nfiles == 0) return ct_errf(err, CT_ERR_DATA, "%s: no .cts shard files (write them with ctrain pack)", path);
    qsort(im->files, (size_t)im->nfiles, sizeof *im->files, cmp_name);
    return CT_OK;
}

/* Locate record i, check its checksum and label, and inflate it into raw (raw_bytes) when it is
 * compressed. *rec: the record's bytes (raw, or the mapping itself when stored plain). */
static int shard_fetch(const ct_dataset *ds, int64_t i, uint8_t *raw, const uint8_t **rec,
                       int32_t *label, ct_err *err) {
    const shard_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld out of range", ds->source, (long long)i);
    int lo = 0, hi = im->nfiles - 1;
    while (lo < hi) { /* last shard whose base <= i */
        int mid = (lo + hi + 1) / 2;
        if (im->files[mid].base <= i) lo = mid;
        else hi = mid - 1;
    }
    const shard_file *f = &im->files[lo];
    int64_t r = i - f->base;
    const uint8_t *e = f->map + get64(f->map + 24) + (size_t)r * CT_SHARD_ENTRY;
    *rec = f->map + get64(e);
    uint32_t stored = get32(e + 8), want = get32(e + 16), got = crc(*rec, stored);
    if (got != want)
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld at offset %llu: checksum mismatch (stored "
                       "0x%08x, computed 0x%08x): the shard is corrupt", f->path, (long long)r,
                       (unsigned long long)get64(e), want, got);
    *label = (int32_t)get32(e + 20);
    if (*label < 0 || (ds->classes > 0 && *label >= ds->classes))
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld: label %d is outside the shard's %lld classes",
                       f->path, (long long)r, *label, (long long)ds->classes);
    if (get32(e + 24) & CT_SHARD_ZLIB) {
        uLongf n = (uLongf)im->raw_bytes;
        if (uncompress(raw, &n, *rec, stored) != Z_OK || n != im->raw_bytes)
            return ct_errf(err, CT_ERR_DATA, "%s: record %lld: zlib data does not decompress to %zu bytes",
                           f->path, (long long)r, im->raw_bytes);
        *rec = raw;
    }
    return CT_OK;
}

static int shard_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    const shard_impl *im = ds->impl;
    float *x = input;
    size_t numel = im->raw_bytes / encoding_size(im->encoding);
    /* Raw bytes go at the end of the float output, so u8 -> f32 can expand in place front to back. */
    uint8_t *raw = (uint8_t *)input + numel * sizeof(float) - im->raw_bytes;
    const uint8_t *rec;
    int32_t label;
    int rc = shard_fetch(ds, i, raw, &rec, &label, err);
    if (rc) return rc;
    if (im->encoding == CT_SHARD_U8) {
        for (int64_t c = 0; c < im->channels; c++) {
            const float *lut = im->lut + 256 * c;
            for (int64_t j = 0; j < im->plane; j++) x[c * im->plane + j] = lut[rec[c * im->plane + j]];
        }
    } else {
        if (rec != raw) memcpy(x, rec, im->raw_bytes);
        for (int64_t c = 0; c < im->channels; c++)
            for (int64_t j = 0; j < im->plane; j++) {
                float v = x[c * im->plane + j];
                x[c * im->plane + j] = (v - im->mean[c]) / im->std[c];
            }
    }
    if (target) *(int32_t *)target = label;
    return CT_OK;
}

/* data.transform.on_device: the stored pixels of a u8 shard record. */
static int shard_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err) {
    const shard_impl *im = ds->impl;
    const uint8_t *rec;
    int32_t label;
    int rc = shard_fetch(ds, i, input, &rec, &label, err);
    if (rc) return rc;
    if (rec != input) memcpy(input, rec, im->raw_bytes);
    if (target) *(int32_t *)target = label;
    return CT_OK;
}

static const char *shard_file_at(const ct_dataset *ds, int64_t k) {
    const shard_impl *im = ds->impl;
    return k < im->nfiles ? im->files[k].path : NULL;
}

int ct_shard_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                  ct_err *err) {
    *out = NULL;
    char where[1200], file[1024];
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(entry, "path");
    const cJSON *lim = cJSON_GetObjectItemCaseSensitive(entry, "limit");
    ct_config_where(cfg, p ? p : entry, where, sizeof where);
    if (!cJSON_IsString(p) || !p->valuestring[0])
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.path: %s (expected the directory written by ctrain "
                       "pack, or one .cts file)", where, path, p ? "expected a string" : "missing");
    const cJSON *it;
    cJSON_ArrayForEach(it, entry) {
        if (strcmp(it->string, "format") && strcmp(it->string, "path") && strcmp(it->string, "limit")) {
            ct_config_where(cfg, it, where, sizeof where);
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: unknown key for format shard (expected path, "
                           "limit)", where, path, it->string);
        }
    }
    if (lim && (!cJSON_IsNumber(lim) || lim->valuedouble < 1)) {
        ct_config_where(cfg, lim, where, sizeof where);
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.limit: expected a positive integer", where, path);
    }
    ct_config_resolve_path(cfg, p->valuestring, file, sizeof file);
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    shard_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "shard";
    ds->decode = shard_decode;
    ds->file = shard_file_at;
    ds->close = shard_close;
    snprintf(ds->source, sizeof ds->source, "%s", file);
    int rc = list_shards(file, im, err);
    for (int i = 0; i < im->nfiles && !rc; i++) {
        rc = map_file(&im->files[i], err);
        if (!rc) rc = check_shard(&im->files[i], ds, im, i == 0, err);
        im->files[i].base = ds->count;
        ds->count += im->files[i].count;
    }
    if (!rc && ds->count == 0) rc = ct_errf(err, CT_ERR_DATA, "%s: the shards hold no records", file);
    if (!rc && ds->classes > 0)
        snprintf(ds->label_note, sizeof ds->label_note, "%s: %lld classes in the shard header (as ctrain "
                 "pack recorded them)", im->files[0].path, (long long)ds->classes);
    if (!rc) {
        if (lim && lim->valuedouble < (double)ds->count) ds->count = (int64_t)lim->valuedouble;
        ds->sample_dtype = CT_F32;
        ds->target_dtype = CT_I32;
        const ct_shape *s = &ds->sample_shape;
        im->channels = s->ndim == 3 && s->d[0] <= 64 ? s->d[0] : 1;
        im->plane = ct_shape_numel(s) / im->channels;
        rc = ct_data_normalize_parse(cfg, im->channels, im->mean, im->std, err);
    }
    if (!rc && im->encoding == CT_SHARD_U8) {
        ds->decode_u8 = shard_decode_u8;
        im->lut = ct_data_u8_lut(im->channels, im->mean, im->std);
    }
    if (rc) {
        shard_close(ds);
        return rc;
    }
    *out = ds;
    return CT_OK;
}

/* `ctrain info` on a shard file or directory: validate headers and indexes (not the records'
 * checksums, which a full read checks) and print the geometry and counts. */
int ct_shard_info(const char *path, FILE *out, ct_err *err) {
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    shard_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->close = shard_close;
    int rc = list_shards(path, im, err);
    int64_t total = 0;
    uint64_t bytes = 0, compressed = 0;
    for (int i = 0; !rc && i < im->nfiles; i++) {
        rc = map_file(&im->files[i], err);
        if (!rc) rc = check_shard(&im->files[i], ds, im, i == 0, err);
        if (rc) break;
        shard_file *f = &im->files[i];
        total += f->count;
        bytes += f->size;
        const uint8_t *idx = f->map + get64(f->map + 24);
        for (int64_t r = 0; r < f->count; r++)
            if (get32(idx + r * CT_SHARD_ENTRY + 24) & CT_SHARD_ZLIB) compressed++;
    }
    if (!rc) {
        char shape[96];
        fprintf(out, "shard dataset %s\n", path);
        fprintf(out, "  files    %d (%.1f MiB)\n", im->nfiles, (double)bytes / (1 << 20));
        fprintf(out, "  records  %lld (%llu zlib-compressed)\n", (long long)total, (unsigned long long)compressed);
        fprintf(out, "  sample   %s %s, %lld classes\n", ct_shape_str(&ds->sample_shape, shape, sizeof shape),
                im->encoding == CT_SHARD_U8 ? "u8" : "f32", (long long)ds->classes);
    }
    shard_close(ds);
    return rc;
}

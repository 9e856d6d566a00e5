/* tfrecord.c: TFRecord files of tf.Example records, TensorFlow's dataset format.
 *
 * Entry fields: {"format": "tfrecord", "path": "data/train-{00000..00003}.tfrecord" or a list of
 * paths, "input": "image", "label": "label", "shape": [1, 28, 28], "index": "data/train-{00000..00003}.index",
 * "limit": N}; brace patterns as pathlist.h expands them.
 *
 * Records: the framing of core/util/tfrecord.h, both CRCs verified; each record's data is a
 * tf.Example (core/data/tfexample.h). "input" names the feature of the model input:
 *   - a bytes_list of one PNG or JPEG (by its signature): decoded by libpng or libjpeg-turbo
 *     (imagedec.h), [C, H, W] scaled to [0, 1] and normalised with data.transform.normalize;
 *     "shape" [C, H, W], when given, sets the channels decoded (1 gray, 3 RGB, ...) and must
 *     match the image size;
 *   - a bytes_list of one raw byte string: uint8 values in "shape" (C order; default [bytes]),
 *     scaled to [0, 1] and normalised like pixels (TensorFlow's `image.tobytes()` convention);
 *   - a float_list or int64_list: the values as stored in "shape" (default [values]), normalised
 *     per channel when the shape is [C, H, W] with C <= 4.
 * "label" names an int64_list of one class index (>= 0), or a float_list of regression targets.
 * Every record must match the first's kinds, shape and image size.
 *
 * Access: the records are located once at open, then decode reads record i by offset, so the
 * loader's threads, shuffling, rank slicing, resume at the exact sample, caching and skip_corrupt
 * work unchanged. Without "index", the open reads every file sequentially (both CRCs checked,
 * every label read: the class count is known); with "index" (one index file per TFRecord file, in
 * the format of the tfrecord package's tfrecord2idx and DALI: a line "OFFSET BYTES" per record)
 * the open reads only the index files, and labels are checked against the model as records are
 * read. A bad length CRC or a record cut short by the end of the file stops the open, naming the
 * file, the record and its offset (nothing after it can be located). A bad data CRC, a record that
 * is not a tf.Example, a missing feature or one of another kind, count or image size is
 * CT_ERR_DATA at decode naming the file, the record and the feature (data.skip_corrupt counts it).
 *
 * Compressed files (TFRecordOptions(compression_type="GZIP" or "ZLIB"): the whole file is one
 * gzip or zlib stream, whatever its name) are recognised by their first bytes when they are not a
 * valid record header, inflated whole into memory at open (a stream cannot be read at an offset),
 * and then read from there like a plain file; offsets (messages, index files) are those of the
 * inflated bytes. A stream cut short or corrupt stops the open naming the file and the byte. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/pathlist.h"
#include "core/data/imagedec.h"
#include "core/data/tfexample.h"
#include "core/data/tfrecord.h"
#include "core/data/transform.h"
#include "core/util/fs.h"
#include "core/util/tfrecord.h"

enum { IN_IMAGE, IN_RAW, IN_NUM }; /* the input: an encoded image (PNG, JPEG), raw uint8 bytes, float/int64 values */
/* MAX_OPEN: files kept open for decode (more are opened per read, not to run out of descriptors) */
enum { MAX_RECORD = 1 << 30, MAX_NAME = 256, MAX_OPEN = 256 };

typedef struct tfr_record {
    int64_t off;                 /* its header's offset in the file */
    int64_t len;                 /* its data bytes */
    int32_t file;
} tfr_record;

typedef struct tfr_impl {
    ct_pathlist files, indexes;  /* indexes.n == 0: none */
    int64_t *file_start;         /* [files.n]: the dataset index of each file's record 0 */
    char input[MAX_NAME], label[MAX_NAME];
    tfr_record *recs;
    int64_t count, cap;
    int in;                      /* IN_* */
    ct_tfx_kind in_kind;         /* the input feature's list kind (IN_NUM: float or int64) */
    ct_shape shape;              /* the input's shape as decoded */
    bool shape_given;
    int c;                       /* channels normalised separately (1 unless [C<=4, H, W]) */
    bool label_class;            /* int64 class index, else float targets */
    int64_t label_count;         /* float targets: values per record */
    int64_t top_label, top_at;   /* the largest class index seen by the scan, and its record (-1: none) */
    int64_t bad_crc, first_bad;  /* records the scan found with a bad data CRC, and the first of them */
    float *lut;                  /* [c][256]: bytes -> normalised floats */
    int *fds;                    /* [files.n] kept open for decode (pread is thread-safe), or NULL */
    uint8_t **mem;               /* [files.n] compressed files' inflated bytes (NULL: a plain file) */
    int64_t *mem_len;            /* [files.n] */
    float mean[4], std[4];
} tfr_impl;

/* ---------------- compressed files ---------------- */

/* A gzip member or a zlib stream starts so (RFC 1952, RFC 1950: CM 8, the header check). */
static bool compressed_magic(const uint8_t *h, size_t n) {
    return n >= 2 && ((h[0] == 0x1f && h[1] == 0x8b) || ((h[0] & 0x0f) == 8 && (h[0] >> 4) <= 7 && (h[0] * 256 + h[1]) % 31 == 0));
}

/* The framing of the bytes inflated so far, walked as they come: every record header that is
 * complete (its length's CRC, at most MAX_RECORD bytes) is checked at once, so a stream that does not
 * inflate to TFRecord records (a compression bomb of zeros, another file compressed) stops at its
 * first bad header instead of being inflated whole first. */
typedef struct frame_walk {
    uint64_t next;               /* inflated offset of the next record header */
    int64_t records;             /* headers checked */
} frame_walk;

static int walk_frames(const char *file, const uint8_t *buf, size_t len, frame_walk *w, ct_err *err) {
    while (w->next + CT_TFRECORD_HEAD <= len) {
        uint64_t n;
        if (!ct_tfrecord_head_check(buf + w->next, &n))
            return ct_errf(err, CT_ERR_DATA, "%s: compressed (gzip or zlib), but what it inflates to is not TFRecord "
                           "records: record %lld at inflated byte %llu has a bad length CRC (inflating stopped there)",
                           file, (long long)w->records, (unsigned long long)w->next);
        if (n > MAX_RECORD)
            return ct_errf(err, CT_ERR_DATA, "%s: compressed (gzip or zlib): record %lld at inflated byte %llu is %llu "
                           "bytes (at most 1 GiB read; inflating stopped there)", file, (long long)w->records,
                           (unsigned long long)w->next, (unsigned long long)n);
        w->next += n + CT_TFRECORD_FRAMING;
        w->records++;
    }
    return CT_OK;
}

/* in[0, n) inflated (gzip members one after another, or one zlib stream) into *out (caller frees),
 * the framing checked as the bytes come (walk_frames). CT_ERR_DATA naming the file and the
 * compressed byte where it fails, or the record whose header is bad; a buffer that cannot grow is
 * CT_ERR_RUNTIME naming the file and the bytes asked for. */
static int inflate_all(const char *file, const uint8_t *in, size_t n, uint8_t **out, int64_t *out_len, ct_err *err) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) return ct_errf(err, CT_ERR_RUNTIME, "%s: zlib cannot start", file); /* 32: gzip or zlib */
    size_t cap = n * 4 + 4096, len = 0;
    uint8_t *buf = malloc(cap);
    z.next_in = (uint8_t *)in;
    z.avail_in = 0;
    size_t fed = 0;
    int zr = Z_OK, rc = CT_OK;
    frame_walk w = {0};
    bool oom = !buf;
    while (!oom) {
        if (z.avail_in == 0 && fed < n) {
            size_t step = n - fed > (1u << 30) ? (1u << 30) : n - fed;
            z.next_in = (uint8_t *)in + fed;
            z.avail_in = (uInt)step;
            fed += step;
        }
        if (len == cap) {
            uint8_t *more = realloc(buf, 2 * cap);
            if ((oom = !more)) break;
            buf = more;
            cap *= 2;
        }
        size_t room = cap - len > (1u << 26) ? (1u << 26) : cap - len;   /* 64 MiB at a time: the framing
                                                                          * is checked between them */
        z.next_out = buf + len;
        z.avail_out = (uInt)room;
        zr = inflate(&z, Z_NO_FLUSH);
        len += room - z.avail_out;
        if ((rc = walk_frames(file, buf, len, &w, err))) break;
        if (zr == Z_STREAM_END) {
            if (z.avail_in == 0 && fed == n) break;
            if (inflateReset(&z) != Z_OK) break; /* another gzip member follows */
            continue;
        }
        if (zr != Z_OK && !(zr == Z_BUF_ERROR && z.avail_out == 0)) break;
        if (zr == Z_OK && z.avail_in == 0 && fed == n && z.avail_out != 0) { zr = Z_BUF_ERROR; break; } /* input ended mid-stream */
    }
    size_t at = (size_t)(z.next_in - in);
    inflateEnd(&z);
    if (oom) {
        size_t asked = buf ? 2 * cap : cap;
        free(buf);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: compressed (gzip or zlib): out of host memory inflating it (%zu "
                       "bytes asked, %zu inflated from %zu of its %zu compressed bytes). Decompress it to a file "
                       "(gunzip) and read that, or give the process more memory.", file, asked, len, at, n);
    }
    if (!rc && zr != Z_STREAM_END)
        rc = ct_errf(err, CT_ERR_DATA, "%s: compressed (gzip or zlib) and %s at compressed byte %zu of %zu", file,
                     zr == Z_BUF_ERROR ? "cut short: the stream ends" : "corrupt", at, n);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = (int64_t)len;
    return CT_OK;
}

/* File k: a compressed file is inflated into im->mem[k]; a plain one (its first record header's CRC
 * holds, or no compression signature) is left to the readers. */
static int load_compressed(tfr_impl *im, int k, ct_err *err) {
    const char *file = im->files.paths[k];
    int fd, rc = ct_fs_open_regular(file, CT_ERR_DATA, "a TFRecord file", &fd, err);   /* the first open: a FIFO refused */
    if (rc) return rc;
    uint8_t head[CT_TFRECORD_HEAD];
    uint64_t n;
    ssize_t got = ct_fs_read_at(fd, head, sizeof head, 0);
    close(fd);
    if (got < 2 || (got == (ssize_t)sizeof head && ct_tfrecord_head_check(head, &n)) || !compressed_magic(head, (size_t)got))
        return CT_OK;
    uint8_t *raw = NULL;
    size_t cap = 0, len = 0;
    rc = ct_read_file(file, &raw, &cap, &len, err);
    if (!rc) {
        if (!im->mem) {
            im->mem = ct_xcalloc((size_t)im->files.n, sizeof *im->mem);
            im->mem_len = ct_xcalloc((size_t)im->files.n, sizeof *im->mem_len);
        }
        rc = inflate_all(file, raw, len, &im->mem[k], &im->mem_len[k], err);
    }
    free(raw);
    return rc;
}

static void free_compressed(tfr_impl *im) {
    for (int k = 0; im->mem && k < im->files.n; k++) free(im->mem[k]);
    free(im->mem);
    free(im->mem_len);
    im->mem = NULL;
    im->mem_len = NULL;
}

/* ---------------- locating the records ---------------- */

static void add_record(tfr_impl *im, int file, int64_t off, int64_t len) {
    if (im->count == im->cap) {
        im->cap = im->cap ? 2 * im->cap : 1024;
        im->recs = ct_xrealloc(im->recs, (size_t)im->cap * sizeof *im->recs);
    }
    im->recs[im->count++] = (tfr_record){.off = off, .len = len, .file = file};
}

/* The scan's note of a record's class label (int64_list of one value >= 0), for the class count. */
static void note_label(tfr_impl *im, const uint8_t *data, size_t n) {
    ct_tfx_feature f;
    const char *why;
    int64_t v;
    if (!ct_tfx_find(data, n, im->label, &f, &why) || f.kind != CT_TFX_INT64 || f.count != 1) return;
    ct_tfx_int64s(&f, &v);
    if (v > im->top_label && v <= INT32_MAX) {
        im->top_label = v;
        im->top_at = im->count - 1;
    }
}

/* Read file k from start to end: every record located, both CRCs checked, its label noted. */
static int scan_file(tfr_impl *im, int k, int64_t limit, ct_err *err) {
    const char *file = im->files.paths[k];
    bool inflated = im->mem && im->mem[k];
    if (inflated && im->mem_len[k] == 0) return CT_OK; /* no records (fmemopen refuses a size of 0) */
    FILE *f = inflated ? fmemopen(im->mem[k], (size_t)im->mem_len[k], "rb") : fopen(file, "rb");
    if (!f) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", file, strerror(errno));
    struct stat st;
    int64_t fsize = inflated ? im->mem_len[k] : fstat(fileno(f), &st) == 0 ? (int64_t)st.st_size : 0;
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    uint8_t *buf = NULL;
    size_t cap = 0;
    int64_t off = 0, rec = 0;
    int rc = CT_OK;
    while (!rc && (limit <= 0 || im->count < limit)) {
        uint8_t head[CT_TFRECORD_HEAD];
        size_t got = fread(head, 1, sizeof head, f);
        if (got == 0 && !ferror(f)) break;
        uint64_t n = 0;
        if (got < sizeof head) {
            rc = ferror(f) ? ct_errf(err, CT_ERR_DATA, "%s: cannot read at offset %lld: %s", file, (long long)off,
                                     strerror(errno))
                           : ct_errf(err, CT_ERR_DATA, "%s: record %lld at offset %lld: truncated header (%zu of "
                                     "12 bytes)", file, (long long)rec, (long long)off, got);
        } else if (!ct_tfrecord_head_check(head, &n)) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: record %lld at offset %lld: bad length CRC (a corrupt record "
                         "header, or not a TFRecord file)", file, (long long)rec, (long long)off);
        } else if (fsize - off < CT_TFRECORD_FRAMING || n > (uint64_t)(fsize - off - CT_TFRECORD_FRAMING)) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: record %lld at offset %lld: truncated: %llu bytes of data and "
                         "a 4-byte CRC, the file ends %lld bytes after the header", file, (long long)rec,
                         (long long)off, (unsigned long long)n, (long long)(fsize - off - CT_TFRECORD_HEAD));
        } else if (n > MAX_RECORD) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: record %lld at offset %lld: %llu bytes (at most 1 GiB read)", file,
                         (long long)rec, (long long)off, (unsigned long long)n);
        }
        if (rc) break;
        if (n + CT_TFRECORD_TAIL > cap) { /* grows by doubling, but never past twice the largest record */
            size_t want = 2 * cap > (size_t)n + CT_TFRECORD_TAIL ? 2 * cap : (size_t)n + CT_TFRECORD_TAIL;
            char what[1400];
            snprintf(what, sizeof what, "%s: record %lld at offset %lld (%llu bytes)", file, (long long)rec,
                     (long long)off, (unsigned long long)n);
            uint8_t *more = ct_try_realloc(buf, want, what, err);
            if (!more) {
                rc = CT_ERR_RUNTIME;
                break;
            }
            buf = more;
            cap = want;
        }
        if (fread(buf, 1, (size_t)n + CT_TFRECORD_TAIL, f) != (size_t)n + CT_TFRECORD_TAIL) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: record %lld at offset %lld: cannot read its data", file,
                         (long long)rec, (long long)off);
            break;
        }
        add_record(im, k, off, (int64_t)n);
        if (ct_tfrecord_tail_check(buf + n, buf, (size_t)n)) note_label(im, buf, (size_t)n);
        else if (!im->bad_crc++) im->first_bad = im->count - 1; /* decode names it (skip_corrupt can skip it) */
        off += (int64_t)n + CT_TFRECORD_FRAMING;
        rec++;
    }
    free(buf);
    fclose(f);
    return rc;
}

/* File k's records from its index file: lines "OFFSET BYTES" (BYTES with the 16 bytes of framing). */
static int read_index(tfr_impl *im, int k, int64_t limit, ct_err *err) {
    const char *file = im->files.paths[k], *index = im->indexes.paths[k];
    struct stat st;
    if (stat(file, &st) != 0) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", file, strerror(errno));
    if (im->mem && im->mem[k]) st.st_size = (off_t)im->mem_len[k]; /* offsets in the inflated bytes */
    int fd, rc = ct_fs_open_regular(index, CT_ERR_DATA, "a tfrecord2idx index file", &fd, err);
    if (rc) return rc;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot open: %s", index, strerror(errno));
    }
    char line[256];
    rc = CT_OK;
    for (int64_t no = 1; !rc && (limit <= 0 || im->count < limit) && fgets(line, sizeof line, f); no++) {
        long long off, bytes;
        char tail;
        int got = sscanf(line, "%lld %lld %c", &off, &bytes, &tail);
        if (got == EOF) continue; /* a blank line */
        if (got != 2 || off < 0 || bytes < CT_TFRECORD_FRAMING || bytes - CT_TFRECORD_FRAMING > MAX_RECORD)
            rc = ct_errf(err, CT_ERR_DATA, "%s:%lld: expected \"OFFSET BYTES\" (a record's offset and its size "
                         "with the 16 bytes of framing, as tfrecord2idx writes), got \"%.*s\"", index, (long long)no,
                         (int)strcspn(line, "\n"), line);
        else if (off > (long long)st.st_size - bytes)
            rc = ct_errf(err, CT_ERR_DATA, "%s:%lld: the record at offset %lld (%lld bytes) runs past the end of "
                         "%s (%lld bytes): the index is not this file's", index, (long long)no, off, bytes, file,
                         (long long)st.st_size);
        else
            add_record(im, k, off, bytes - CT_TFRECORD_FRAMING);
    }
    fclose(f);
    return rc;
}

/* ---------------- reading a record ---------------- */

/* "FILE: record K (offset O)" of dataset record i. */
static void record_name(const tfr_impl *im, int64_t i, char *out, size_t n) {
    const tfr_record *r = &im->recs[i];
    snprintf(out, n, "%s: record %lld (offset %lld)", im->files.paths[r->file],
             (long long)(i - im->file_start[r->file]), (long long)r->off);
}

/* CT_ERR_DATA: "FILE: record K (offset O): " and the message (the name is built only on errors:
 * decode is the hot path). */
__attribute__((format(printf, 4, 5))) static int record_err(const tfr_impl *im, int64_t i, ct_err *err,
                                                             const char *fmt, ...) {
    char what[1200], msg[1600];
    record_name(im, i, what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_errf(err, CT_ERR_DATA, "%s: %s", what, msg);
}

/* Record i with its framing, CRCs checked, into *base (caller frees); *data = its data. *bad_crc
 * (may be NULL): the error is the data's CRC, a record data.skip_corrupt may skip. */
static int read_record_at(const tfr_impl *im, int64_t i, uint8_t **base, const uint8_t **data, bool *bad_crc,
                          ct_err *err) {
    if (bad_crc) *bad_crc = false;
    const tfr_record *r = &im->recs[i];
    const char *file = im->files.paths[r->file];
    size_t total = (size_t)r->len + CT_TFRECORD_FRAMING;
    char what[1200 + 40];
    record_name(im, i, what, sizeof what - 40);
    strcat(what, " (a buffer for the record)");
    uint8_t *b = ct_try_malloc(total, what, err);   /* up to 1 GiB, as the file says */
    if (!b) return CT_ERR_RUNTIME;
    ssize_t got;
    int e = 0;
    if (im->mem && im->mem[r->file]) { /* an inflated compressed file */
        int64_t left = im->mem_len[r->file] - r->off;
        got = left < 0 ? 0 : left < (int64_t)total ? (ssize_t)left : (ssize_t)total;
        if (got > 0) memcpy(b, im->mem[r->file] + r->off, (size_t)got);
    } else {
        int fd = im->fds ? im->fds[r->file] : -1;
        bool own = fd < 0; /* no descriptor kept open: one for this read */
        if (own) fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            e = errno;
            free(b);
            return ct_errf(err, ct_err_io(e, CT_ERR_DATA), "%s: cannot open: %s", file, strerror(e));
        }
        got = ct_fs_read_at(fd, b, total, r->off);
        e = errno;
        if (own) close(fd);
    }
    uint64_t n = 0;
    int rc = CT_OK;
    if (got != (ssize_t)total)
        rc = record_err(im, i, err, "%s", got < 0 ? strerror(e) : "truncated (the file ends inside it)");
    else if (!ct_tfrecord_head_check(b, &n))
        rc = record_err(im, i, err, "bad length CRC (a corrupt record header%s)",
                        im->indexes.n ? ", or an index that is not this file's" : "");
    else if (n != (uint64_t)r->len)
        rc = record_err(im, i, err, "the header says %llu bytes, the index %lld: the index is not this file's",
                        (unsigned long long)n, (long long)r->len);
    else if (!ct_tfrecord_tail_check(b + CT_TFRECORD_HEAD + n, b + CT_TFRECORD_HEAD, (size_t)n)) {
        rc = record_err(im, i, err, "bad data CRC (the record is corrupt)");
        if (bad_crc) *bad_crc = true;
    }
    if (rc) {
        free(b);
        return rc;
    }
    *base = b;
    *data = b + CT_TFRECORD_HEAD;
    return CT_OK;
}

static int read_record(const tfr_impl *im, int64_t i, uint8_t **base, const uint8_t **data, ct_err *err) {
    return read_record_at(im, i, base, data, NULL, err);
}

typedef struct names_ctx {
    char *out;
    size_t n, used;
} names_ctx;

static void add_name(void *ctx, const char *name, size_t len, const ct_tfx_feature *f) {
    names_ctx *c = ctx;
    if (c->used + 8 >= c->n) return;
    char shown[80];   /* a name from the file: control bytes escaped */
    ct_printable(shown, sizeof shown, name, len, CT_PRINT_NAME);
    int k = snprintf(c->out + c->used, c->n - c->used, "%s%s", c->used ? ", " : "", shown);
    c->used = k < 0 ? c->n : c->used + (size_t)k < c->n ? c->used + (size_t)k : c->n;
}

/* Feature `name` (role: "input" or "label") of record i's Example data[0..n), present. */
static int find_feature(const tfr_impl *im, int64_t i, const uint8_t *data, size_t n, const char *name,
                        const char *role, ct_tfx_feature *f, ct_err *err) {
    const char *why = "";
    if (!ct_tfx_find(data, n, name, f, &why)) return record_err(im, i, err, "not a tf.Example: %s", why);
    if (f->kind != CT_TFX_MISSING) return CT_OK;
    char names[400] = "";
    names_ctx c = {names, sizeof names, 0};
    ct_tfx_each(data, n, add_name, &c, &why);
    return record_err(im, i, err, "feature \"%s\" (%s) is missing; the record has: %s", name, role,
                      names[0] ? names : "no features");
}

static void shape_text(const ct_shape *s, char *out, size_t n) {
    size_t used = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < s->ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, "%s%lld", d ? ", " : "", (long long)s->d[d]);
    if (used < n) snprintf(out + used, n - used, "]");
}

/* Bytes in channel planes of `per` values: raw copies, else each normalised by its channel's table. */
static void bytes_to_input(const tfr_impl *im, const uint8_t *p, int64_t per, void *input, bool raw) {
    if (raw) {
        memcpy(input, p, (size_t)(per * im->c));
        return;
    }
    float *x = input;
    for (int ch = 0; ch < im->c; ch++) {
        const float *lut = im->lut + 256 * ch;
        for (int64_t j = ch * per; j < (ch + 1) * per; j++) x[j] = lut[p[j]];
    }
}

/* Record i's input (its Example: data[0..n)) into input: floats, or the bytes when raw. */
static int decode_input(const tfr_impl *im, int64_t i, const uint8_t *data, size_t n, void *input, bool raw,
                        ct_err *err) {
    ct_tfx_feature f;
    int rc = find_feature(im, i, data, n, im->input, "input", &f, err);
    if (rc) return rc;
    int64_t numel = ct_shape_numel(&im->shape), per = numel / im->c;
    char shape[96];
    bool bytes = im->in != IN_NUM;
    if (f.kind != im->in_kind && (bytes || f.kind == CT_TFX_BYTES))
        return record_err(im, i, err, "feature \"%s\" (input) is a %s, expected a %s like the first record", im->input,
                          ct_tfx_kind_name(f.kind), ct_tfx_kind_name(im->in_kind));
    if (bytes && f.count != 1)
        return record_err(im, i, err, "feature \"%s\" (input) holds %lld byte strings, expected one", im->input,
                          (long long)f.count);
    if (!bytes) {
        if (f.count != numel) {
            shape_text(&im->shape, shape, sizeof shape);
            return record_err(im, i, err, "feature \"%s\" (input) has %lld values, expected %lld (shape %s)",
                              im->input, (long long)f.count, (long long)numel, shape);
        }
        float *x = input;
        ct_tfx_floats(&f, x);
        for (int ch = 0; ch < im->c; ch++)
            for (int64_t j = ch * per; j < (ch + 1) * per; j++) x[j] = (x[j] - im->mean[ch]) / im->std[ch];
        return CT_OK;
    }
    const uint8_t *p;
    size_t len;
    ct_tfx_bytes(&f, 0, &p, &len);
    if (im->in == IN_RAW) {
        if ((int64_t)len != numel) {
            shape_text(&im->shape, shape, sizeof shape);
            return record_err(im, i, err, "feature \"%s\" (input) has %zu bytes, expected %lld (uint8, shape %s)",
                              im->input, len, (long long)numel, shape);
        }
        bytes_to_input(im, p, per, input, raw);
        return CT_OK;
    }
    ct_image8 img = {0};
    rc = ct_image_decode(p, len, "", (int)im->shape.d[0], (size_t)1 << 30, &img, err); /* message: ": why" */
    if (rc) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = record_err(im, i, err, "feature \"%s\" (input)%s", im->input, why);
    } else if (img.h != im->shape.d[1] || img.w != im->shape.d[2]) {
        rc = record_err(im, i, err, "feature \"%s\" (input): image is %dx%d (HxW), expected %lldx%lld like the first "
                        "record", im->input, img.h, img.w, (long long)im->shape.d[1], (long long)im->shape.d[2]);
    } else {
        ct_image8_planar(&img, im->lut, raw ? input : NULL, raw ? NULL : input);
    }
    ct_image8_free(&img);
    return rc;
}

static int decode_label(const tfr_impl *im, int64_t i, const uint8_t *data, size_t n, void *target, ct_err *err) {
    ct_tfx_feature f;
    int rc = find_feature(im, i, data, n, im->label, "label", &f, err);
    if (rc) return rc;
    if (im->label_class) {
        if (f.kind != CT_TFX_INT64 || f.count != 1)
            return record_err(im, i, err, "feature \"%s\" (label) is a %s of %lld values, expected an int64_list of "
                              "one class index like the first record", im->label, ct_tfx_kind_name(f.kind),
                              (long long)f.count);
        int64_t v;
        ct_tfx_int64s(&f, &v);
        if (v < 0 || v > INT32_MAX)
            return record_err(im, i, err, "feature \"%s\" (label): %lld is not a class index (0 or more)", im->label,
                              (long long)v);
        if (target) *(int32_t *)target = (int32_t)v;
        return CT_OK;
    }
    if (f.kind != CT_TFX_FLOAT || f.count != im->label_count)
        return record_err(im, i, err, "feature \"%s\" (label) is a %s of %lld values, expected a float_list of %lld "
                          "like the first record", im->label, ct_tfx_kind_name(f.kind), (long long)f.count,
                          (long long)im->label_count);
    if (target) ct_tfx_floats(&f, target);
    return CT_OK;
}

static int decode_as(const ct_dataset *ds, int64_t i, void *input, void *target, bool raw, ct_err *err) {
    const tfr_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: sample %lld out of range (%lld samples)", ds->source, (long long)i,
                       (long long)ds->count);
    uint8_t *base;
    const uint8_t *data;
    int rc = read_record(im, i, &base, &data, err);
    if (rc) return rc;
    size_t n = (size_t)im->recs[i].len;
    rc = decode_input(im, i, data, n, input, raw, err);
    if (!rc) rc = decode_label(im, i, data, n, target, err);
    free(base);
    return rc;
}

static int tfr_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    return decode_as(ds, i, input, target, false, err);
}

static int tfr_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err) {
    return decode_as(ds, i, input, target, true, err);
}

static const char *tfr_file(const ct_dataset *ds, int64_t k) {
    const tfr_impl *im = ds->impl;
    if (k < im->files.n) return im->files.paths[k];
    return k - im->files.n < im->indexes.n ? im->indexes.paths[k - im->files.n] : NULL;
}

static int64_t tfr_shard_start(const ct_dataset *ds, int64_t k) {
    const tfr_impl *im = ds->impl;
    return k < im->files.n ? im->file_start[k] : -1;
}

static void tfr_close(ct_dataset *ds) {
    tfr_impl *im = ds->impl;
    if (im) {
        for (int k = 0; im->fds && k < im->files.n; k++)
            if (im->fds[k] >= 0) close(im->fds[k]);
        free(im->fds);
        free_compressed(im);
        ct_pathlist_free(&im->files); /* after the loop above and free_compressed: it empties files.n */
        ct_pathlist_free(&im->indexes);
        free(im->file_start);
        free(im->recs);
        free(im->lut);
        free(im);
    }
    free(ds);
}

/* ---------------- opening ---------------- */

static int name_field(const ct_config *cfg, const cJSON *entry, const char *path, const char *key,
                      const char *fallback, char *out, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, key);
    if (!v) {
        snprintf(out, MAX_NAME, "%s", fallback);
        return CT_OK;
    }
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= MAX_NAME)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: expected the name of a tf.Example feature, such as \"%s\"",
                       where, path, key, fallback);
    snprintf(out, MAX_NAME, "%s", v->valuestring);
    return CT_OK;
}

static int parse_entry(const ct_config *cfg, const cJSON *entry, const char *path, tfr_impl *im, int64_t *limit,
                       ct_err *err) {
    char where[1200];
    int rc = ct_pathlist_parse(&im->files, cfg, entry, path, "path", "paths of TFRecord files",
                               "data/train-{00000..00003}.tfrecord", err);
    if (!rc) rc = name_field(cfg, entry, path, "input", "image", im->input, err);
    if (!rc) rc = name_field(cfg, entry, path, "label", "label", im->label, err);
    if (rc) return rc;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "index");
    if (v) {
        rc = ct_pathlist_parse(&im->indexes, cfg, entry, path, "index", "paths of index files",
                               "data/train-{00000..00003}.index", err);
        ct_config_where(cfg, v, where, sizeof where);
        if (!rc && im->indexes.n != im->files.n)
            rc = ct_errf(err, CT_ERR_CONFIG, "%s: %s.index: %d index files for %d TFRecord files (one per file, in "
                         "the same order)", where, path, im->indexes.n, im->files.n);
        if (rc) return rc;
    }
    v = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (v) {
        ct_config_where(cfg, v, where, sizeof where);
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
        bool ok = n >= 1 && n <= 4;
        const cJSON *d;
        int64_t numel = 1;
        cJSON_ArrayForEach(d, v) {
            ok &= cJSON_IsNumber(d) && d->valuedouble == floor(d->valuedouble) && d->valuedouble >= 1 &&
                  d->valuedouble <= (1 << 30) && (numel *= (int64_t)d->valuedouble) <= (1 << 30);
            if (ok) im->shape.d[im->shape.ndim++] = (int64_t)d->valuedouble;
        }
        if (!ok)
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.shape: expected 1 to 4 positive integers, such as [1, 28, 28] "
                           "(the input's shape per sample)", where, path);
        im->shape_given = true;
    }
    v = cJSON_GetObjectItemCaseSensitive(entry, "limit");
    if (v) {
        ct_config_where(cfg, v, where, sizeof where);
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 2e9)
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.limit: expected an integer in 1..2000000000", where, path);
        *limit = (int64_t)v->valuedouble;
    }
    return CT_OK;
}

/* The input's and label's kinds and the input's shape, from the first record whose data CRC holds
 * (a record before it with a bad one fails at decode, where data.skip_corrupt can skip it; when
 * every record has one, the first one's error). */
static int probe_first(ct_dataset *ds, tfr_impl *im, ct_err *err) {
    uint8_t *base = NULL;
    const uint8_t *data;
    ct_err first = {0};
    int64_t i = 0;
    for (;; i++) {
        bool bad_crc;
        int rc = read_record_at(im, i, &base, &data, &bad_crc, err);
        if (rc == CT_OK) break;
        if (!bad_crc) return rc;
        if (i == 0) first = *err;
        if (i + 1 == im->count) {
            *err = first;
            ct_err_append(err, "  All %lld records have a bad data CRC: nothing can be read from them.",
                          (long long)im->count);
            return rc;
        }
    }
    size_t n = (size_t)im->recs[i].len;
    char what[1200], shape[96];
    record_name(im, i, what, sizeof what);
    ct_tfx_feature in, lab;
    int rc = find_feature(im, i, data, n, im->input, "input", &in, err);
    if (!rc) rc = find_feature(im, i, data, n, im->label, "label", &lab, err);
    if (rc) goto done;
    im->in_kind = in.kind;
    shape_text(&im->shape, shape, sizeof shape);
    if (in.kind == CT_TFX_BYTES) {
        const uint8_t *p = NULL;
        size_t len = 0;
        if (in.count == 1) ct_tfx_bytes(&in, 0, &p, &len);
        if (in.count != 1) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: feature \"%s\" (input) holds %lld byte strings, expected one (an "
                         "encoded image or raw bytes)", what, im->input, (long long)in.count);
        } else if (ct_image_sniff(p, len) != CT_IMAGE_UNKNOWN) {
            int h, w, c;
            char field[1600];
            snprintf(field, sizeof field, "%s: feature \"%s\" (input)", what, im->input);
            im->in = IN_IMAGE;
            rc = ct_image_info(p, len, field, &h, &w, &c, err);
            if (!rc && im->shape_given && (im->shape.ndim != 3 || im->shape.d[0] > 4 || im->shape.d[1] != h ||
                                           im->shape.d[2] != w))
                rc = ct_errf(err, CT_ERR_DATA, "%s: a %dx%d image with %d channels, but shape is %s (expected [C, %d, "
                             "%d] with C 1 to 4)", field, h, w, c, shape, h, w);
            if (!rc && !im->shape_given) {
                if (c > 4) rc = ct_errf(err, CT_ERR_DATA, "%s: %d channels", field, c);
                im->shape = (ct_shape){.ndim = 3, .d = {c, h, w}};
            }
        } else {
            im->in = IN_RAW;
            if (!im->shape_given) im->shape = (ct_shape){.ndim = 1, .d = {(int64_t)len}};
            else if (ct_shape_numel(&im->shape) != (int64_t)len)
                rc = ct_errf(err, CT_ERR_DATA, "%s: feature \"%s\" (input) has %zu bytes (not a PNG or JPEG: raw uint8 "
                             "values), but shape %s holds %lld", what, im->input, len, shape,
                             (long long)ct_shape_numel(&im->shape));
        }
    } else {
        im->in = IN_NUM;
        if (!im->shape_given) im->shape = (ct_shape){.ndim = 1, .d = {in.count}};
        else if (ct_shape_numel(&im->shape) != in.count)
            rc = ct_errf(err, CT_ERR_DATA, "%s: feature \"%s\" (input) is a %s of %lld values, but shape %s holds "
                         "%lld", what, im->input, ct_tfx_kind_name(in.kind), (long long)in.count, shape,
                         (long long)ct_shape_numel(&im->shape));
        if (!rc && in.count == 0)
            rc = ct_errf(err, CT_ERR_DATA, "%s: feature \"%s\" (input) is empty", what, im->input);
    }
    if (rc) goto done;
    if (lab.kind == CT_TFX_INT64 && lab.count == 1) {
        im->label_class = true;
    } else if (lab.kind == CT_TFX_FLOAT && lab.count >= 1) {
        im->label_count = lab.count;
    } else {
        rc = ct_errf(err, CT_ERR_DATA, "%s: feature \"%s\" (label) is a %s of %lld values, expected an int64_list of "
                     "one class index, or a float_list of targets", what, im->label, ct_tfx_kind_name(lab.kind),
                     (long long)lab.count);
        goto done;
    }
    ds->sample_shape = im->shape;
    bool chw = im->shape.ndim == 3 && im->shape.d[0] <= 4;
    im->c = chw ? (int)im->shape.d[0] : 1;
    if (im->in != IN_NUM) ds->decode_u8 = tfr_decode_u8; /* 8-bit values (the loader checks the channels) */
done:
    free(base);
    return rc;
}

int ct_tfrecord_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out, ct_err *err) {
    *out = NULL;
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    tfr_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "tfrecord";
    ds->decode = tfr_decode;
    ds->file = tfr_file;
    ds->shard_start = tfr_shard_start;
    ds->close = tfr_close;
    im->top_label = -1;
    int64_t limit = 0;
    int rc = parse_entry(cfg, entry, path, im, &limit, err);
    if (!rc) {
        snprintf(ds->source, sizeof ds->source, "%s", im->files.paths[0]);
        im->file_start = ct_xcalloc((size_t)im->files.n, sizeof *im->file_start);
    }
    for (int k = 0; k < im->files.n && !rc; k++) {
        im->file_start[k] = im->count;
        if (limit > 0 && im->count >= limit) continue;
        rc = load_compressed(im, k, err);
        if (!rc) rc = im->indexes.n ? read_index(im, k, limit, err) : scan_file(im, k, limit, err);
    }
    if (!rc && im->count == 0) rc = ct_errf(err, CT_ERR_DATA, "%s: no records", ds->source);
    if (!rc && im->files.n <= MAX_OPEN) {
        im->fds = ct_xmalloc((size_t)im->files.n * sizeof *im->fds);
        for (int k = 0; k < im->files.n; k++) im->fds[k] = open(im->files.paths[k], O_RDONLY | O_CLOEXEC); /* -1: read_record opens it and says why not */
    }
    if (!rc) rc = probe_first(ds, im, err);
    if (!rc) {
        ds->count = im->count;
        ds->sample_dtype = CT_F32;
        if (im->label_class) {
            ds->target_dtype = CT_I32;
            ds->classes = im->top_label + 1; /* 0 with an index: the loader checks each label */
            if (im->top_label >= 0) {
                char where[1200];
                record_name(im, im->top_at, where, sizeof where);
                snprintf(ds->label_note, sizeof ds->label_note, "%.1100s has label %lld, the largest", where,
                         (long long)im->top_label);
            } else if (im->indexes.n) {
                snprintf(ds->label_note, sizeof ds->label_note, "%s: labels are read as records are (an index "
                         "file was given)", ds->source);
            }
        } else {
            ds->target_dtype = CT_F32;
            ds->target_shape = (ct_shape){.ndim = 1, .d = {im->label_count}};
            snprintf(ds->label_note, sizeof ds->label_note, "%.800s: feature \"%.200s\" is a float_list of %lld targets, "
                     "not class indices", ds->source, im->label, (long long)im->label_count);
        }
        rc = ct_data_normalize_parse(cfg, im->c, im->mean, im->std, err);
        if (!rc) im->lut = ct_data_u8_lut(im->c, im->mean, im->std);
    }
    if (rc) {
        tfr_close(ds);
        return rc;
    }
    *out = ds;
    return CT_OK;
}

/* ---------------- ctrain info ---------------- */

bool ct_tfrecord_is_file(const char *path) {
    int fd = ct_fs_open_input(path);
    if (fd < 0) return false;
    uint8_t head[CT_TFRECORD_HEAD], in[4096];
    uint64_t n;
    ssize_t got = ct_fs_read_at(fd, in, sizeof in, 0);
    close(fd);
    if (got >= (ssize_t)sizeof head && ct_tfrecord_head_check(in, &n)) return true;
    if (got < 2 || !compressed_magic(in, (size_t)got)) return false;
    /* compressed: the first record header, inflated from the file's first bytes */
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) return false;
    z.next_in = in;
    z.avail_in = (uInt)got;
    z.next_out = head;
    z.avail_out = sizeof head;
    int zr = inflate(&z, Z_SYNC_FLUSH);
    bool ok = (zr == Z_OK || zr == Z_STREAM_END) && z.avail_out == 0 && ct_tfrecord_head_check(head, &n);
    inflateEnd(&z);
    return ok;
}

typedef struct info_ctx {
    FILE *out;
} info_ctx;

static void info_feature(void *ctx, const char *name, size_t len, const ct_tfx_feature *f) {
    info_ctx *c = ctx;
    char shown[240];  /* a name from the file: control bytes escaped */
    fprintf(c->out, "    %s: %s of %lld", ct_printable(shown, sizeof shown, name, len, CT_PRINT_NAME),
            ct_tfx_kind_name(f->kind), (long long)f->count);
    if (f->kind == CT_TFX_BYTES && f->count == 1) {
        const uint8_t *p;
        size_t n;
        ct_tfx_bytes(f, 0, &p, &n);
        ct_image_format fmt = ct_image_sniff(p, n);
        fprintf(c->out, " (%zu bytes%s)", n, fmt == CT_IMAGE_PNG ? ", PNG" : fmt == CT_IMAGE_JPEG ? ", JPEG" : "");
    }
    fputc('\n', c->out);
}

int ct_tfrecord_info(const char *path, FILE *out, ct_err *err) {
    tfr_impl *im = ct_xcalloc(1, sizeof *im);
    im->top_label = -1;
    im->files.n = 1; /* path as given: no brace expansion */
    im->files.paths = ct_xmalloc(sizeof *im->files.paths);
    im->files.paths[0] = ct_xstrdup(path);
    int64_t start = 0;
    im->file_start = &start;
    int rc = load_compressed(im, 0, err);
    if (!rc) rc = scan_file(im, 0, 0, err);
    uint8_t *base = NULL;
    const uint8_t *data = NULL;
    if (!rc && im->count) rc = read_record(im, 0, &base, &data, err);
    if (!rc) {
        int64_t bytes = 0;
        for (int64_t i = 0; i < im->count; i++) bytes += im->recs[i].len;
        fprintf(out, "tfrecord file: %s\n", path);
        if (im->mem && im->mem[0])
            fprintf(out, "  compressed (gzip or zlib): %lld bytes inflated\n", (long long)im->mem_len[0]);
        fprintf(out, "  records: %lld, %lld bytes of data; %lld with a bad data CRC\n", (long long)im->count,
                (long long)bytes, (long long)im->bad_crc);
        if (data) {
            const char *why = "";
            info_ctx c = {out};
            fprintf(out, "  first record's features (tf.Example):\n");
            if (!ct_tfx_each(data, (size_t)im->recs[0].len, info_feature, &c, &why))
                fprintf(out, "    not a tf.Example: %s\n", why);
        }
        fprintf(out, "  read it with {\"format\": \"tfrecord\", \"path\": \"%s\", \"input\": FEATURE, \"label\": "
                "FEATURE}\n", path);
        if (im->bad_crc) /* all said above; the exit status says it too */
            rc = record_err(im, im->first_bad, err, "bad data CRC (the record is corrupt; %lld of %lld records are)",
                            (long long)im->bad_crc, (long long)im->count);
    }
    free(base);
    im->file_start = NULL;
    free_compressed(im);
    ct_pathlist_free(&im->files);
    free(im->recs);
    free(im);
    return rc;
}

/* webdataset.c: WebDataset tar shards (https://github.com/webdataset/webdataset conventions).
 *
 * Entry fields: {"format": "webdataset", "urls": "data/shard-{000000..000127}.tar" or a list of
 * paths, "image": "png" | "jpg" | "npy", "label": "cls" | "txt" | ..., "limit": N}; brace patterns as
 * pathlist.h expands them.
 *
 * Samples: the members of a shard grouped by key, as WebDataset groups them: a member's key is its
 * name up to the first dot after the last slash, the rest is its extension (lower-cased); a new
 * sample starts when the key changes. "image" names the extension of the input (.png, .jpg, .jpeg:
 * an encoded image, decoded by its signature through libpng or libjpeg-turbo, imagedec.h; .npy
 * float32 or uint8 arrays, C order, little-endian), "label" the extension of an ASCII
 * integer class index. Other members are ignored, as are directories, links and members without
 * a dot.
 *
 * Why a small ustar reader and not libarchive: no new dependency; shards are read sequentially
 * once at open and then by offset, which a 512-byte-header walk does directly; and every error
 * can name the exact file, member and byte offset. It reads POSIX ustar (the prefix field), GNU
 * long names ('L') and base-256 sizes, and pax headers ('x': path and size; Python's tarfile
 * writes pax by default); each header's checksum is verified.
 *
 * Access: one sequential scan of every shard at open builds an index (per sample: its shard, the
 * offset and size of its image member, its label), and decode then reads sample i by offset.
 * The loader's threads, shuffling (a permutation of all samples from the seed, which mixes more
 * than WebDataset's shuffle buffer), rank slicing, resume at the exact sample and skip_corrupt
 * work unchanged. Structural errors (bad header checksum, a member cut short by the end of the
 * file) stop the open with CT_ERR_DATA naming the shard, member and offset: nothing after them
 * can be located. A sample without its image or label, an unparsable label, a bad .npy header,
 * dtype or shape, or a corrupt PNG is CT_ERR_DATA at decode (so data.skip_corrupt counts it). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/imagedec.h"
#include "core/data/pathlist.h"
#include "core/data/transform.h"
#include "core/data/webdataset.h"
#include "core/util/fs.h"

enum { TAR_BLOCK = 512, MAX_NAME = 4096 };
enum { KIND_IMAGE, KIND_NPY }; /* an encoded image (PNG or JPEG, by its signature), or a .npy array */
enum { LABEL_OK, LABEL_MISSING, LABEL_BAD };

typedef struct wds_sample {
    int32_t shard;
    int32_t label;
    uint8_t label_state;         /* LABEL_* */
    int64_t off, size;           /* image member's data; size < 0: no image member */
    int64_t key;                 /* offset of the key in keys */
} wds_sample;

typedef struct wds_impl {
    ct_pathlist shards;          /* the .tar files */
    char image_ext[32], label_ext[32];
    int kind;                    /* KIND_* */
    wds_sample *samples;
    int64_t count, cap;
    char *keys;                  /* NUL-terminated keys, back to back */
    size_t keys_len, keys_cap;
    /* geometry of the input, from the first sample */
    int c, h, w;                 /* image */
    ct_shape npy_shape;          /* npy */
    bool npy_u8;
    float *lut;                  /* [c][256]: u8 pixels -> normalised floats */
    float mean[4], std[4];
} wds_impl;

/* ---------------- ustar reader ---------------- */

/* An octal field (NUL/space terminated) or a GNU base-256 number (high bit of the first byte). */
static bool tar_number(const uint8_t *f, int n, int64_t *out) {
    int64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80) return false; /* negative or absurdly large */
        for (int i = 1; i < n; i++) {
            if (v > (INT64_MAX >> 8)) return false;
            v = v << 8 | f[i];
        }
        *out = v;
        return true;
    }
    int i = 0;
    while (i < n && f[i] == ' ') i++;
    bool any = false;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v > (INT64_MAX >> 3)) return false;
        v = v << 3 | (f[i] - '0');
        any = true;
    }
    for (; i < n; i++)
        if (f[i] != ' ' && f[i] != '\0') return false;
    *out = v;
    return any;
}

static bool all_zero(const uint8_t *b) {
    for (int i = 0; i < TAR_BLOCK; i++)
        if (b[i]) return false;
    return true;
}

/* A pax extended header's records ("LEN key=value\n"): path and size override the next header's. */
static int pax_parse(const char *file, int64_t at, const char *p, size_t n, char *name, int64_t *size,
                     ct_err *err) {
    size_t i = 0;
    while (i < n) {
        char *end;
        long len = strtol(p + i, &end, 10);
        if (len <= 0 || (size_t)len > n - i || end >= p + i + len - 1 || *end != ' ' ||
            p[i + (size_t)len - 1] != '\n')
            return ct_errf(err, CT_ERR_DATA, "%s: pax header at offset %lld: malformed record", file,
                           (long long)at);
        const char *kv = end + 1, *eq = memchr(kv, '=', (size_t)(p + i + len - 1 - kv));
        if (eq) {
            size_t klen = (size_t)(eq - kv), vlen = (size_t)(p + i + len - 1 - (eq + 1));
            if (klen == 4 && !memcmp(kv, "path", 4) && vlen < MAX_NAME) {
                memcpy(name, eq + 1, vlen);
                name[vlen] = '\0';
            } else if (klen == 4 && !memcmp(kv, "size", 4)) {
                char num[32];
                snprintf(num, sizeof num, "%.*s", (int)(vlen < 31 ? vlen : 31), eq + 1);
                long long s = strtoll(num, &end, 10);
                if (*end || s < 0)
                    return ct_errf(err, CT_ERR_DATA, "%s: pax header at offset %lld: bad size \"%s\"",
                                   file, (long long)at, num);
                *size = s;
            }
        }
        i += (size_t)len;
    }
    return CT_OK;
}

/* ---------------- the index ---------------- */

static int64_t add_key(wds_impl *im, const char *key, size_t n) {
    if (im->keys_len + n + 1 > im->keys_cap) {
        im->keys_cap = (im->keys_cap + n + 1) * 2;
        im->keys = ct_xrealloc(im->keys, im->keys_cap);
    }
    int64_t at = (int64_t)im->keys_len;
    memcpy(im->keys + at, key, n);
    im->keys[at + (int64_t)n] = '\0';
    im->keys_len += n + 1;
    return at;
}

static wds_sample *new_sample(wds_impl *im, int shard, const char *key, size_t klen) {
    if (im->count == im->cap) {
        im->cap = im->cap ? 2 * im->cap : 1024;
        im->samples = ct_xrealloc(im->samples, (size_t)im->cap * sizeof *im->samples);
    }
    wds_sample *s = &im->samples[im->count++];
    *s = (wds_sample){.shard = shard, .label_state = LABEL_MISSING, .size = -1, .key = add_key(im, key, klen)};
    return s;
}

typedef struct index_ctx {
    wds_impl *im;
    int shard;
    int64_t limit;               /* stop once a sample past it starts (0: none) */
} index_ctx;

/* Names from a tar file reach messages through shown(): escaped (ct_printable), so a member name
 * cannot put control bytes or a line of its own on the terminal. MAX_NAME bytes of name may take 4
 * each escaped; the messages show the first SHOWN bytes. */
enum { SHOWN = 400 };
static const char *shown(const char *name, size_t len, char out[SHOWN]) {
    return ct_printable(out, SHOWN, name, len, CT_PRINT_NAME);
}

static int two_members(const char *file, const char *name, const char *ext, ct_err *err) {
    const char *slash = strrchr(name, '/'), *dot = strchr(slash ? slash + 1 : name, '.');
    char a[SHOWN], b[SHOWN];
    return ct_errf(err, CT_ERR_DATA, "%s: member %s: sample \"%s\" has two .%s members", file,
                   shown(name, strlen(name), a), shown(name, (size_t)(dot - name), b), ext);
}

/* One regular member: its key and extension, then the image or label of the current sample. */
static int index_member(void *ctx, int fd, const char *name, int64_t off, int64_t size, bool *stop,
                        ct_err *err) {
    const index_ctx *ix = ctx;
    wds_impl *im = ix->im;
    int shard = ix->shard;
    const char *file = im->shards.paths[shard];
    const char *slash = strrchr(name, '/'), *base = slash ? slash + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base || !strncmp(base, "__", 2)) return CT_OK; /* not a sample field */
    size_t klen = (size_t)(dot - name);
    char ext[64];
    size_t elen = strlen(dot + 1);
    if (elen >= sizeof ext) return CT_OK;
    for (size_t i = 0; i <= elen; i++) ext[i] = (char)tolower((unsigned char)dot[1 + i]);
    wds_sample *s = im->count ? &im->samples[im->count - 1] : NULL;
    if (!s || s->shard != shard || strlen(im->keys + s->key) != klen || memcmp(im->keys + s->key, name, klen)) {
        if (ix->limit > 0 && im->count == ix->limit) {
            *stop = true;
            return CT_OK;
        }
        s = new_sample(im, shard, name, klen);
    }
    if (strcmp(ext, im->image_ext) == 0) {
        if (s->size >= 0) return two_members(file, name, ext, err);
        s->off = off;
        s->size = size;
    } else if (strcmp(ext, im->label_ext) == 0) {
        if (s->label_state != LABEL_MISSING) return two_members(file, name, ext, err);
        char txt[40] = {0};
        s->label_state = LABEL_BAD;
        if (size < (int64_t)sizeof txt && ct_fs_read_at(fd, txt, (size_t)size, off) == size) {
            char *end;
            errno = 0;
            long v = strtol(txt, &end, 10);
            while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t') end++;
            if (end != txt && !*end && !errno && v >= 0 && v <= INT32_MAX) {
                s->label = (int32_t)v;
                s->label_state = LABEL_OK;
            }
        }
    }
    return CT_OK;
}

/* Called for each regular member of a shard (name, the offset and size of its data); *stop ends
 * the walk early. */
typedef int (*tar_visit)(void *ctx, int fd, const char *name, int64_t off, int64_t size, bool *stop,
                         ct_err *err);

/* One sequential pass over a shard's headers, calling visit for each regular member. */
static int tar_walk(const char *file, tar_visit visit, void *ctx, ct_err *err) {
    int fd, rc = ct_fs_open_regular(file, CT_ERR_DATA, "a tar file", &fd, err);   /* a FIFO: refused */
    if (rc) return rc;
    off_t end_off = lseek(fd, 0, SEEK_END);
    int64_t fsize = end_off < 0 ? 0 : (int64_t)end_off, off = 0;
    char *name = ct_xmalloc(MAX_NAME), *next_name = ct_xmalloc(MAX_NAME), *extra = NULL;
    next_name[0] = '\0';
    int64_t next_size = -1;
    uint8_t h[TAR_BLOCK];
    rc = CT_OK;
    bool stop = false;
    while (!rc && !stop) {
        ssize_t got = ct_fs_read_at(fd, h, TAR_BLOCK, off);
        if (got < 0) {
            rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot read at offset %lld: %s", file,
                         (long long)off, strerror(errno));
            break;
        }
        if (got == 0) break; /* the end without the two zero blocks: accepted, as tar does */
        if (got < TAR_BLOCK) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: truncated: a partial tar header at offset %lld (%zd of "
                         "512 bytes)", file, (long long)off, got);
            break;
        }
        if (all_zero(h)) break; /* end-of-archive marker */
        /* The header checksum: the sum of its bytes with the checksum field read as spaces. */
        int64_t stored;
        uint32_t sum = 0;
        int32_t ssum = 0;
        for (int i = 0; i < TAR_BLOCK; i++) {
            uint8_t b = (i >= 148 && i < 156) ? ' ' : h[i];
            sum += b;
            ssum += (int8_t)b;
        }
        char hname[101], hshown[SHOWN], nshown[SHOWN];
        snprintf(hname, sizeof hname, "%.100s", (const char *)h);
        shown(hname, strlen(hname), hshown);
        if (!tar_number(h + 148, 8, &stored) || (stored != (int64_t)sum && stored != (int64_t)ssum)) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: bad tar header checksum at offset %lld (member \"%s\"): "
                         "not a tar file, or corrupt here", file, (long long)off, hshown);
            break;
        }
        int64_t size;
        if (!tar_number(h + 124, 12, &size)) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: member \"%s\" at offset %lld: bad size field", file, hshown,
                         (long long)off);
            break;
        }
        char type = (char)h[156];
        if (next_size >= 0 && (type == '0' || type == '\0' || type == '7')) size = next_size;
        int64_t data = off + TAR_BLOCK;
        if (size > fsize - data) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: member \"%s\" truncated: %lld bytes at offset %lld, the "
                         "file ends after %lld", file, next_name[0] ? shown(next_name, strlen(next_name), nshown) : hshown,
                         (long long)size,
                         (long long)data, (long long)(fsize - data));
            break;
        }
        if (type == 'L' || type == 'x') { /* GNU long name / pax header: applies to the next member */
            if (size > (1 << 20)) {
                rc = ct_errf(err, CT_ERR_DATA, "%s: extended header at offset %lld is %lld bytes (at most "
                             "1 MiB read)", file, (long long)off, (long long)size);
                break;
            }
            extra = ct_xrealloc(extra, (size_t)size + 1);
            if (ct_fs_read_at(fd, extra, (size_t)size, data) != size) {
                rc = ct_errf(err, CT_ERR_DATA, "%s: cannot read the extended header at offset %lld", file,
                             (long long)off);
                break;
            }
            extra[size] = '\0';
            if (type == 'L') snprintf(next_name, MAX_NAME, "%s", extra);
            else rc = pax_parse(file, off, extra, (size_t)size, next_name, &next_size, err);
        } else {
            if (next_name[0]) {
                snprintf(name, MAX_NAME, "%s", next_name);
            } else if (!memcmp(h + 257, "ustar\0", 6) && h[345]) { /* POSIX: prefix "/" name (GNU
                                                                     * keeps times there) */
                snprintf(name, MAX_NAME, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
            } else {
                snprintf(name, MAX_NAME, "%s", hname);
            }
            if (type == '0' || type == '\0' || type == '7') rc = visit(ctx, fd, name, data, size, &stop, err);
            else if (type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6') size = 0;
            next_name[0] = '\0';
            next_size = -1;
        }
        off = data + (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    }
    free(name);
    free(next_name);
    free(extra);
    close(fd);
    return rc;
}

/* ---------------- decoding ---------------- */

/* Sample i's image member into *buf; errors name the shard, the sample's key and the field. */
static int read_image(const wds_impl *im, int64_t i, uint8_t **buf, size_t *len, ct_err *err) {
    const wds_sample *s = &im->samples[i];
    const char *file = im->shards.paths[s->shard];
    char key[SHOWN];
    shown(im->keys + s->key, strlen(im->keys + s->key), key);
    if (s->size < 0)
        return ct_errf(err, CT_ERR_DATA, "%s: sample \"%s\" has no %s.%s member (field \"image\")", file,
                       key, key, im->image_ext);
    if (s->label_state == LABEL_MISSING)
        return ct_errf(err, CT_ERR_DATA, "%s: sample \"%s\" has no %s.%s member (field \"label\")", file,
                       key, key, im->label_ext);
    if (s->label_state == LABEL_BAD)
        return ct_errf(err, CT_ERR_DATA, "%s: member %s.%s (field \"label\"): expected a class index, "
                       "a non-negative integer in ASCII", file, key, im->label_ext);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", file, strerror(errno));
    char what[1500];
    snprintf(what, sizeof what, "%s: member %s.%s (%lld bytes)", file, key, im->image_ext, (long long)s->size);
    *buf = ct_try_malloc((size_t)s->size + 1, what, err);   /* as large as the tar says, within the file */
    if (!*buf) {
        close(fd);
        return CT_ERR_RUNTIME;
    }
    *len = (size_t)s->size;
    ssize_t got = ct_fs_read_at(fd, *buf, *len, s->off);
    int e = errno;
    close(fd);
    if (got != (ssize_t)*len) {
        free(*buf);
        *buf = NULL;
        return ct_errf(err, CT_ERR_DATA, "%s: member %s.%s (field \"image\"): %s at offset %lld", file, key,
                       im->image_ext, got < 0 ? strerror(e) : "truncated", (long long)s->off);
    }
    return CT_OK;
}

static int npy_header(const char *hdr, size_t n, size_t start, size_t hl, const char *what, bool *u8,
                      ct_shape *shape, size_t *data, ct_err *err);

/* A .npy member: dtype ('<f4' or '|u1'), C order, its shape; *data = offset of the array. */
static int npy_parse(const uint8_t *b, size_t n, const char *what, bool *u8, ct_shape *shape, size_t *data,
                     ct_err *err) {
    if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: not a .npy array (no \\x93NUMPY magic)", what);
    size_t start = b[6] == 1 ? 10 : 12; /* version 1: a 2-byte header length, 2 and 3: 4 bytes */
    if ((b[6] != 1 && b[6] != 2 && b[6] != 3) || n < start)
        return ct_errf(err, CT_ERR_DATA, "%s: bad .npy header (version %u)", what, b[6]);
    size_t hl = (size_t)b[8] | (size_t)b[9] << 8;
    if (start == 12) hl |= (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (hl > n - start || hl > 65536)
        return ct_errf(err, CT_ERR_DATA, "%s: bad .npy header (version %u, %zu bytes)", what, b[6], hl);
    char *hdr = ct_xmalloc(hl + 1); /* not on the stack: workers' stacks are small */
    memcpy(hdr, b + start, hl);
    hdr[hl] = '\0';
    int rc = npy_header(hdr, n, start, hl, what, u8, shape, data, err);
    free(hdr);
    return rc;
}

/* The header's dictionary (NUL-terminated text). */
static int npy_header(const char *hdr, size_t n, size_t start, size_t hl, const char *what, bool *u8,
                      ct_shape *shape, size_t *data, ct_err *err) {
    const char *d = strstr(hdr, "'descr':"), *o = strstr(hdr, "'fortran_order':"), *s = strstr(hdr, "'shape':");
    if (!d || !o || !s) return ct_errf(err, CT_ERR_DATA, "%s: .npy header without descr, fortran_order and shape", what);
    d += 8;
    while (*d == ' ') d++;
    if (!strncmp(d, "'<f4'", 5)) *u8 = false;
    else if (!strncmp(d, "'|u1'", 5) || !strncmp(d, "'<u1'", 5)) *u8 = true;
    else {
        const char *q = strchr(d + 1, '\'');
        return ct_errf(err, CT_ERR_DATA, "%s: .npy dtype %.*s is not supported (expected '<f4' float32 or "
                       "'|u1' uint8, little-endian)", what, q ? (int)(q - d + 1) : 8, d);
    }
    o += 16;
    while (*o == ' ') o++;
    if (strncmp(o, "False", 5) != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: .npy array in Fortran order (expected C order)", what);
    s = strchr(s, '(');
    ct_shape sh = {0};
    double numel = 1;   /* in double: a product of huge dimensions must not wrap */
    char text[120] = "";
    for (s = s ? s + 1 : NULL; s && *s && *s != ')';) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0)
            return ct_errf(err, CT_ERR_DATA, "%s: .npy shape has a dimension that is not a positive integer (\"%.20s\")",
                           what, s);
        if (sh.ndim == 4)
            return ct_errf(err, CT_ERR_DATA, "%s: .npy shape has more than 4 dimensions (ctrain takes 1 to 4)", what);
        numel *= (double)v;
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%lld", sh.ndim ? ", " : "", v);
        sh.d[sh.ndim++] = v;
        s = end;
        while (*s == ',' || *s == ' ') s++;
    }
    if (!s || sh.ndim == 0)
        return ct_errf(err, CT_ERR_DATA, "%s: .npy shape %s: expected 1 to 4 positive dimensions", what,
                       s ? "()" : "unreadable");
    if (numel > (double)(1u << 30))
        return ct_errf(err, CT_ERR_DATA, "%s: .npy shape (%s) holds %.3g values; a sample holds at most 2^30 "
                       "(%u)", what, text, numel, 1u << 30);
    *shape = sh;
    *data = start + hl;
    uint64_t bytes = (uint64_t)numel * (*u8 ? 1 : 4);
    if ((n - *data) != bytes)
        return ct_errf(err, CT_ERR_DATA, "%s: .npy data is %zu bytes, its header says %llu", what, n - *data,
                       (unsigned long long)bytes);
    return CT_OK;
}

/* Sample i: input as normalised floats, or (raw) as uint8 [c, h, w] for data.transform.on_device. */
static int decode_as(const ct_dataset *ds, int64_t i, void *input, void *target, bool raw, ct_err *err) {
    const wds_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: sample %lld out of range (%lld samples)", ds->source,
                       (long long)i, (long long)ds->count);
    const wds_sample *s = &im->samples[i];
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_image(im, i, &buf, &len, err);
    if (rc) return rc;
    char what[1400], key[SHOWN];
    snprintf(what, sizeof what, "%s: member %s.%s (field \"image\")", im->shards.paths[s->shard],
             shown(im->keys + s->key, strlen(im->keys + s->key), key), im->image_ext);
    if (im->kind == KIND_IMAGE) {
        ct_image8 img = {0};
        rc = ct_image_decode(buf, len, what, im->c, (size_t)1 << 30, &img, err);
        if (!rc && (img.h != im->h || img.w != im->w))
            rc = ct_errf(err, CT_ERR_DATA, "%s: image is %dx%d (HxW), expected %dx%d like the first sample",
                         what, img.h, img.w, im->h, im->w);
        if (!rc) ct_image8_planar(&img, im->lut, raw ? input : NULL, raw ? NULL : input);
        ct_image8_free(&img);
    } else {
        bool u8;
        ct_shape sh;
        size_t at;
        rc = npy_parse(buf, len, what, &u8, &sh, &at, err);
        if (!rc && (u8 != im->npy_u8 || !ct_shape_eq(&sh, &im->npy_shape)))
            rc = ct_errf(err, CT_ERR_DATA, "%s: dtype %s shape [%lld, ...] (%d dims) differs from the first "
                         "sample's (%s, %d dims)", what, u8 ? "uint8" : "float32", (long long)sh.d[0], sh.ndim,
                         im->npy_u8 ? "uint8" : "float32", im->npy_shape.ndim);
        int64_t numel = ct_shape_numel(&im->npy_shape);
        int64_t per = im->npy_shape.ndim == 3 ? im->npy_shape.d[1] * im->npy_shape.d[2] : numel;
        for (int64_t j = 0; j < numel && !rc; j++) {
            int ch = im->npy_shape.ndim == 3 && im->npy_shape.d[0] <= 4 ? (int)(j / per) : 0;
            if (u8 && raw) {
                ((uint8_t *)input)[j] = buf[at + (size_t)j];
            } else if (u8) {
                ((float *)input)[j] = im->lut[256 * ch + buf[at + (size_t)j]];
            } else {
                const uint8_t *p = buf + at + 4 * (size_t)j;
                uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                float v;
                memcpy(&v, &bits, 4);
                ((float *)input)[j] = (v - im->mean[ch]) / im->std[ch];
            }
        }
    }
    free(buf);
    if (!rc && target) *(int32_t *)target = s->label;
    return rc;
}

static int wds_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    return decode_as(ds, i, input, target, false, err);
}

static int wds_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err) {
    return decode_as(ds, i, input, target, true, err);
}

static const char *wds_file(const ct_dataset *ds, int64_t k) {
    const wds_impl *im = ds->impl;
    return k < im->shards.n ? im->shards.paths[k] : NULL;
}

/* The first sample of shard k: samples are in shard order, so the first whose shard is >= k. */
static int64_t wds_shard_start(const ct_dataset *ds, int64_t k) {
    const wds_impl *im = ds->impl;
    if (k >= im->shards.n) return -1;
    int64_t lo = 0, hi = im->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (im->samples[mid].shard < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void wds_close(ct_dataset *ds) {
    wds_impl *im = ds->impl;
    if (im) {
        ct_pathlist_free(&im->shards);
        free(im->samples);
        free(im->keys);
        free(im->lut);
        free(im);
    }
    free(ds);
}

/* ---------------- opening ---------------- */

static int ext_field(const ct_config *cfg, const cJSON *entry, const char *path, const char *key,
                     const char *fallback, char *out, size_t n, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, key);
    char where[1200];
    ct_config_where(cfg, v ? v : entry, where, sizeof where);
    if (!v) {
        snprintf(out, n, "%s", fallback);
        return CT_OK;
    }
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= n || strchr(v->valuestring, '/'))
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: expected a member extension such as \"%s\"", where,
                       path, key, fallback);
    const char *s = v->valuestring + (v->valuestring[0] == '.');
    for (size_t i = 0; i <= strlen(s); i++) out[i] = (char)tolower((unsigned char)s[i]);
    return CT_OK;
}

static int parse_entry(const ct_config *cfg, const cJSON *entry, const char *path, wds_impl *im,
                       int64_t *limit, ct_err *err) {
    char where[1200];
    int rc = ct_pathlist_parse(&im->shards, cfg, entry, path, "urls", "paths of .tar shards",
                               "data/shard-{000000..000127}.tar", err);
    if (rc) return rc;
    rc = ext_field(cfg, entry, path, "image", "png", im->image_ext, sizeof im->image_ext, err);
    if (!rc) rc = ext_field(cfg, entry, path, "label", "cls", im->label_ext, sizeof im->label_ext, err);
    if (rc) return rc;
    size_t n = strlen(im->image_ext);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "image");
    ct_config_where(cfg, v ? v : entry, where, sizeof where);
    bool image = (n >= 3 && (!strcmp(im->image_ext + n - 3, "png") || !strcmp(im->image_ext + n - 3, "jpg"))) ||
                 (n >= 4 && !strcmp(im->image_ext + n - 4, "jpeg"));
    if (image) im->kind = KIND_IMAGE;
    else if (n >= 3 && !strcmp(im->image_ext + n - 3, "npy")) im->kind = KIND_NPY;
    else
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.image: \"%s\": expected an extension ending in png, jpg, jpeg or npy "
                       "(the input member)", where, path, im->image_ext);
    if (!strcmp(im->image_ext, im->label_ext))
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.label: the same extension as image", where, path);
    v = cJSON_GetObjectItemCaseSensitive(entry, "limit");
    if (v) {
        ct_config_where(cfg, v, where, sizeof where);
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 2e9)
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.limit: expected an integer in 1..2000000000", where, path);
        *limit = (int64_t)v->valuedouble;
    }
    return CT_OK;
}

/* The input's geometry from the first sample that has an image. */
static int probe_first(ct_dataset *ds, wds_impl *im, ct_err *err) {
    int64_t i = 0;
    while (i < im->count && (im->samples[i].size < 0 || im->samples[i].label_state != LABEL_OK)) i++;
    if (i == im->count)
        return ct_errf(err, CT_ERR_DATA, "%s: no sample has both a .%s and a .%s member", ds->source,
                       im->image_ext, im->label_ext);
    uint8_t *buf;
    size_t len;
    int rc = read_image(im, i, &buf, &len, err);
    if (rc) return rc;
    const wds_sample *s = &im->samples[i];
    char what[1400], key[SHOWN];
    snprintf(what, sizeof what, "%s: member %s.%s (field \"image\")", im->shards.paths[s->shard],
             shown(im->keys + s->key, strlen(im->keys + s->key), key), im->image_ext);
    if (im->kind == KIND_IMAGE) {
        rc = ct_image_info(buf, len, what, &im->h, &im->w, &im->c, err);
        if (!rc && im->c > 4) rc = ct_errf(err, CT_ERR_DATA, "%s: %d channels", what, im->c);
        ds->sample_shape = (ct_shape){.ndim = 3, .d = {im->c, im->h, im->w}};
    } else {
        size_t at;
        rc = npy_parse(buf, len, what, &im->npy_u8, &im->npy_shape, &at, err);
        ds->sample_shape = im->npy_shape;
        im->c = im->npy_shape.ndim == 3 && im->npy_shape.d[0] <= 4 ? (int)im->npy_shape.d[0] : 1;
    }
    free(buf);
    return rc;
}

int ct_webdataset_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                       ct_err *err) {
    *out = NULL;
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    wds_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "webdataset";
    ds->decode = wds_decode;
    ds->file = wds_file;
    ds->shard_start = wds_shard_start;
    ds->close = wds_close;
    int64_t limit = 0;
    int rc = parse_entry(cfg, entry, path, im, &limit, err);
    if (!rc) snprintf(ds->source, sizeof ds->source, "%s", im->shards.paths[0]);
    for (int k = 0; k < im->shards.n && !rc && (limit <= 0 || im->count < limit); k++) {
        index_ctx ix = {im, k, limit};
        rc = tar_walk(im->shards.paths[k], index_member, &ix, err);
    }
    if (!rc && im->count == 0)
        rc = ct_errf(err, CT_ERR_DATA, "%s: no samples (no member has a key and an extension)", ds->source);
    if (!rc) rc = probe_first(ds, im, err);
    if (!rc) {
        ds->count = im->count;
        ds->sample_dtype = CT_F32;
        ds->target_dtype = CT_I32;
        int64_t top = -1, at = 0;
        for (int64_t i = 0; i < im->count; i++)
            if (im->samples[i].label_state == LABEL_OK && im->samples[i].label > top) {
                top = im->samples[i].label;
                at = i;
            }
        ds->classes = top + 1;
        const wds_sample *s = &im->samples[at];
        char key[SHOWN];
        snprintf(ds->label_note, sizeof ds->label_note, "%s: member %s.%s has label %lld, the largest",
                 im->shards.paths[s->shard], shown(im->keys + s->key, strlen(im->keys + s->key), key),
                 im->label_ext, (long long)top);
        bool chw_u8 = im->npy_u8 && im->npy_shape.ndim == 3 && im->npy_shape.d[0] <= 4;
        if (im->kind == KIND_IMAGE || chw_u8) ds->decode_u8 = wds_decode_u8; /* [C, H, W] 8-bit only */
        rc = ct_data_normalize_parse(cfg, im->c, im->mean, im->std, err);
        if (!rc) im->lut = ct_data_u8_lut(im->c, im->mean, im->std);
    }
    if (rc) {
        wds_close(ds);
        return rc;
    }
    *out = ds;
    return CT_OK;
}

/* ---------------- ctrain info ---------------- */

enum { INFO_EXTS = 32 };

typedef struct info_ctx {
    char last_key[MAX_NAME], first_key[MAX_NAME];
    int64_t samples, members, bytes;
    char ext[INFO_EXTS][64];
    int64_t ext_count[INFO_EXTS];
    int n_ext;
    bool more_exts;
} info_ctx;

static int info_member(void *ctx, int fd, const char *name, int64_t off, int64_t size, bool *stop,
                       ct_err *err) {
    info_ctx *c = ctx;
    const char *slash = strrchr(name, '/'), *base = slash ? slash + 1 : name;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base || !strncmp(base, "__", 2)) return CT_OK;
    size_t klen = (size_t)(dot - name);
    c->members++;
    c->bytes += size;
    if (strlen(c->last_key) != klen || strncmp(c->last_key, name, klen) != 0) {
        snprintf(c->last_key, sizeof c->last_key, "%.*s", (int)klen, name);
        if (!c->samples++) snprintf(c->first_key, sizeof c->first_key, "%s", c->last_key);
    }
    char ext[64];
    snprintf(ext, sizeof ext, "%s", dot + 1);
    for (char *p = ext; *p; p++) *p = (char)tolower((unsigned char)*p);
    for (int k = 0; k < c->n_ext; k++)
        if (!strcmp(c->ext[k], ext)) {
            c->ext_count[k]++;
            return CT_OK;
        }
    if (c->n_ext == INFO_EXTS) {
        c->more_exts = true;
        return CT_OK;
    }
    snprintf(c->ext[c->n_ext], sizeof c->ext[0], "%s", ext);
    c->ext_count[c->n_ext++] = 1;
    return CT_OK;
}

bool ct_webdataset_is_tar(const char *path) {
    size_t n = strlen(path);
    if (n < 4 || strcasecmp(path + n - 4, ".tar") != 0) return false;
    int fd = ct_fs_open_input(path);
    if (fd < 0) return false;
    uint8_t h[TAR_BLOCK];
    bool ok = ct_fs_read_at(fd, h, TAR_BLOCK, 0) == TAR_BLOCK && (!memcmp(h + 257, "ustar", 5) || all_zero(h));
    close(fd);
    return ok;
}

int ct_webdataset_info(const char *path, FILE *out, ct_err *err) {
    info_ctx *c = ct_xcalloc(1, sizeof *c);
    int rc = tar_walk(path, info_member, c, err);
    if (!rc) {
        fprintf(out, "webdataset shard: %s\n", path);
        fprintf(out, "  samples: %lld (members grouped by key)\n", (long long)c->samples);
        fprintf(out, "  members: %lld, %lld bytes of data\n", (long long)c->members, (long long)c->bytes);
        fprintf(out, "  fields (extension: members):");
        char name[SHOWN];
        for (int k = 0; k < c->n_ext; k++)
            fprintf(out, "%s %s: %lld", k ? "," : "", shown(c->ext[k], strlen(c->ext[k]), name), (long long)c->ext_count[k]);
        fprintf(out, "%s\n", c->more_exts ? ", ..." : "");
        if (c->samples) fprintf(out, "  first sample: %s\n", shown(c->first_key, strlen(c->first_key), name));
        fprintf(out, "  read it with {\"format\": \"webdataset\", \"urls\": \"%s\", \"image\": EXT, \"label\": EXT}\n",
                path);
    }
    free(c);
    return rc;
}

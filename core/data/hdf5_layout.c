/* hdf5_layout.c: the probe's reply (hdf5_layout.h): written by the child, decoded and checked as
 * hostile input by the reading process. */
#include "core/data/hdf5_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t magic[4] = {'C', 'T', 'H', '5'};

bool ct_h5_block_bytes(const int64_t *dims, int from, int ndim, uint64_t elem, uint64_t *out) {
    uint64_t n = elem;
    for (int d = from; d < ndim; d++)
        if (dims[d] < 0 || __builtin_mul_overflow(n, (uint64_t)dims[d], &n)) return false;
    *out = n;
    return n <= ((uint64_t)1 << 62);
}

void ct_h5_type_text(const ct_h5_layout *l, char *out, size_t n) {
    const char *end = l->elem > 1 && !l->little ? " big-endian" : "";
    if (l->cls == CT_H5_CLASS_INT) {
        snprintf(out, n, "%sint%u%s", l->is_signed ? "" : "u", 8 * l->elem, end);
    } else if (l->cls == CT_H5_CLASS_FLOAT) {
        snprintf(out, n, "float%u%s", 8 * l->elem, end);
    } else {
        static const char *const names[] = {"integer", "float", "time", "string", "bitfield", "opaque",
                                            "compound", "reference", "enum", "variable-length", "array"};
        snprintf(out, n, "%s (%u bytes)", l->cls <= CT_H5_CLASS_LAST ? names[l->cls] : "unknown type", l->elem);
    }
}

/* ---------------- writing (the child) ---------------- */

void ct_h5_put_bytes(ct_h5_writer *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + n) cap *= 2;
        uint8_t *q = ct_xmalloc(cap);
        if (w->n) memcpy(q, w->p, w->n);
        free(w->p);
        w->p = q;
        w->cap = cap;
    }
    if (n) memcpy(w->p + w->n, p, n);
    w->n += n;
}

void ct_h5_put_u32(ct_h5_writer *w, uint32_t v) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
    ct_h5_put_bytes(w, b, 4);
}

void ct_h5_put_u64(ct_h5_writer *w, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    ct_h5_put_bytes(w, b, 8);
}

void ct_h5_put_header(ct_h5_writer *w, int code, const char *text, uint32_t datasets) {
    size_t len = strlen(text);
    if (len > CT_H5_TEXT_MAX) len = CT_H5_TEXT_MAX;
    ct_h5_put_bytes(w, magic, 4);
    ct_h5_put_u32(w, CT_H5_REPLY_VERSION);
    ct_h5_put_u32(w, (uint32_t)code);
    ct_h5_put_u32(w, (uint32_t)len);
    ct_h5_put_bytes(w, text, len);
    ct_h5_put_u32(w, datasets);
}

void ct_h5_put_layout(ct_h5_writer *w, const ct_h5_layout *l) {
    ct_h5_put_u32(w, (uint32_t)l->ndim);
    for (int d = 0; d < l->ndim; d++) ct_h5_put_u64(w, (uint64_t)l->dims[d]);
    ct_h5_put_u32(w, (uint32_t)l->cls);
    ct_h5_put_u32(w, l->elem);
    ct_h5_put_u32(w, (l->little ? 1u : 0u) | (l->is_signed ? 2u : 0u));
    uint32_t fill = l->elem <= CT_H5_MAX_ELEM ? l->elem : 0;
    ct_h5_put_u32(w, fill);
    ct_h5_put_bytes(w, l->fill, fill);
    ct_h5_put_u32(w, (uint32_t)l->nfilters);
    for (int k = 0; k < l->nfilters; k++) {
        const ct_h5_filter *f = &l->filters[k];
        ct_h5_put_u32(w, f->id);
        ct_h5_put_u32(w, f->flags);
        ct_h5_put_u32(w, f->ncd);
        for (uint32_t c = 0; c < f->ncd && c < CT_H5_MAX_CD; c++) ct_h5_put_u32(w, f->cd[c]);
    }
    ct_h5_put_u32(w, (uint32_t)l->storage);
    if (l->storage == CT_H5_CONTIGUOUS) {
        ct_h5_put_u64(w, l->addr);
        ct_h5_put_u64(w, l->size);
    } else if (l->storage == CT_H5_COMPACT) {
        ct_h5_put_u64(w, l->size);
        ct_h5_put_bytes(w, l->compact, (size_t)l->size);
    } else if (l->storage == CT_H5_CHUNKED) {
        for (int d = 0; d < l->ndim; d++) ct_h5_put_u64(w, (uint64_t)l->chunk[d]);
        ct_h5_put_u64(w, l->nchunks);
        for (uint64_t c = 0; c < l->nchunks; c++) {
            ct_h5_put_u64(w, l->chunks[c].addr);
            ct_h5_put_u64(w, l->chunks[c].size);
            ct_h5_put_u32(w, l->chunks[c].mask);
        }
    }
}

/* ---------------- reading (the reading process: hostile input) ---------------- */

typedef struct cursor {
    const uint8_t *p;
    size_t n, at;
    bool short_read; /* the reply ended before a field */
} cursor;

static const uint8_t *take(cursor *c, size_t n) {
    if (c->short_read || n > c->n - c->at) {
        c->short_read = true;
        return NULL;
    }
    const uint8_t *p = c->p + c->at;
    c->at += n;
    return p;
}

static uint64_t get_le(cursor *c, int bytes) {
    const uint8_t *p = take(c, (size_t)bytes);
    uint64_t v = 0;
    for (int i = bytes - 1; p && i >= 0; i--) v = v << 8 | p[i];
    return v;
}
#define GET32(c) ((uint32_t)get_le((c), 4))
#define GET64(c) get_le((c), 8)

/* The reply is corrupt: what, naming the file and (when known) the dataset. */
static int corrupt(ct_err *err, const char *path, const char *dataset, const char *what) {
    if (dataset)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\": %s (a corrupt file: libhdf5 resolved it to storage "
                       "that cannot be read)", path, dataset, what);
    return ct_errf(err, CT_ERR_DATA, "%s: the HDF5 metadata probe's reply is corrupt: %s", path, what);
}

/* Shape, element type and fill value. */
static int decode_type(cursor *c, ct_h5_layout *l, const char *path, const char *name, ct_err *err) {
    uint32_t ndim = GET32(c);
    if (c->short_read || ndim < 1 || ndim > CT_H5_MAX_RANK) return corrupt(err, path, name, "a rank outside 1 to 5");
    l->ndim = (int)ndim;
    for (int d = 0; d < l->ndim; d++) {
        uint64_t v = GET64(c);
        if (v < 1 || v > ((uint64_t)1 << 40)) return corrupt(err, path, name, "a dimension outside 1 to 2^40");
        l->dims[d] = (int64_t)v;
    }
    uint32_t cls = GET32(c), elem = GET32(c), flags = GET32(c), fill = GET32(c);
    if (c->short_read || cls > CT_H5_CLASS_LAST || elem < 1 || elem > 65536 || flags > 3 ||
        (fill != 0 && (fill != elem || fill > CT_H5_MAX_ELEM)))
        return corrupt(err, path, name, "an element type outside what the probe sends");
    l->cls = (ct_h5_class)cls;
    l->elem = elem;
    l->little = flags & 1;
    l->is_signed = flags & 2;
    const uint8_t *f = take(c, fill);
    if (c->short_read) return corrupt(err, path, name, "the reply ends inside the fill value");
    memset(l->fill, 0, sizeof l->fill);
    if (fill) memcpy(l->fill, f, fill);
    return CT_OK;
}

static int decode_filters(cursor *c, ct_h5_layout *l, const char *path, const char *name, ct_err *err) {
    uint32_t n = GET32(c);
    if (c->short_read || n > CT_H5_MAX_FILTERS) return corrupt(err, path, name, "more than 8 filters");
    l->nfilters = (int)n;
    for (uint32_t k = 0; k < n; k++) {
        ct_h5_filter *f = &l->filters[k];
        f->id = GET32(c);
        f->flags = GET32(c);
        f->ncd = GET32(c);
        if (c->short_read || f->id > 65535 || f->ncd > CT_H5_MAX_CD)
            return corrupt(err, path, name, "a filter with an id past 65535 or more than 8 client values");
        for (uint32_t v = 0; v < f->ncd; v++) f->cd[v] = GET32(c);
    }
    return c->short_read ? corrupt(err, path, name, "the reply ends inside the filters") : CT_OK;
}

/* Chunked storage: the chunk dims, the grid, every chunk inside the file and no larger than its
 * stored bytes can decode to. */
static int decode_chunks(cursor *c, ct_h5_layout *l, uint64_t file_size, const char *path, const char *name,
                         ct_err *err) {
    char what[300];
    uint64_t cells = 1;
    for (int d = 0; d < l->ndim; d++) {
        uint64_t v = GET64(c);
        if (v < 1 || v > ((uint64_t)1 << 32)) return corrupt(err, path, name, "a chunk dimension outside 1 to 2^32");
        l->chunk[d] = (int64_t)v;
        l->grid[d] = (l->dims[d] + l->chunk[d] - 1) / l->chunk[d];
        if (__builtin_mul_overflow(cells, (uint64_t)l->grid[d], &cells)) cells = UINT64_MAX;
    }
    uint64_t chunk_bytes = 0;
    if (!ct_h5_block_bytes(l->chunk, 0, l->ndim, l->elem, &chunk_bytes) || chunk_bytes > ((uint64_t)1 << 32))
        return corrupt(err, path, name, "chunks of more than 4 GiB (HDF5's own limit)");
    uint64_t n = GET64(c);
    if (c->short_read || n != cells || cells > CT_H5_MAX_CHUNKS) {
        snprintf(what, sizeof what, "a chunk grid of %llu cells (the shape and chunk dims give %llu; at most %llu)",
                 (unsigned long long)n, (unsigned long long)cells, (unsigned long long)CT_H5_MAX_CHUNKS);
        return corrupt(err, path, name, what);
    }
    /* 20 bytes a chunk must be there before sizing anything by the count */
    if (n > (c->n - c->at) / 20) return corrupt(err, path, name, "the reply ends inside the chunk list");
    l->nchunks = n;
    l->chunks = ct_xcalloc((size_t)n, sizeof *l->chunks);
    bool unfiltered = l->nfilters == 0;
    for (uint64_t k = 0; k < n; k++) {
        ct_h5_chunk *ch = &l->chunks[k];
        ch->addr = GET64(c);
        ch->size = GET64(c);
        ch->mask = GET32(c);
        if (ch->addr == CT_H5_UNALLOCATED) continue;
        const char *bad = NULL;
        if (ch->addr > file_size || ch->size > file_size - ch->addr) bad = "runs past the end of the file";
        else if (ch->size == 0) bad = "has no bytes";
        /* unfiltered, a chunk is its bytes; filtered, deflate expands at most 1032:1 */
        else if (unfiltered && ch->size != chunk_bytes) bad = "is not the size of a chunk";
        else if (!unfiltered && chunk_bytes / 1032 > ch->size + 64) bad = "is too small to hold a chunk";
        if (bad) {
            snprintf(what, sizeof what, "chunk %llu (%llu bytes at byte %llu) %s (%llu bytes; chunks of %llu bytes)",
                     (unsigned long long)k, (unsigned long long)ch->size, (unsigned long long)ch->addr, bad,
                     (unsigned long long)file_size, (unsigned long long)chunk_bytes);
            return corrupt(err, path, name, what);
        }
        l->stored += ch->size;
    }
    /* chunks may claim the same bytes (a corrupt index): the file cannot store more than it has,
     * and what a dataset may declare is bounded by what it stores (hdf5.c) */
    if (l->stored > file_size) l->stored = file_size;
    return CT_OK;
}

static int decode_layout(cursor *c, ct_h5_layout *l, uint64_t file_size, const char *path, const char *name,
                         ct_err *err) {
    int rc = decode_type(c, l, path, name, err);
    if (!rc) rc = decode_filters(c, l, path, name, err);
    if (rc) return rc;
    uint64_t total = 0;
    if (!ct_h5_block_bytes(l->dims, 0, l->ndim, l->elem, &total)) return corrupt(err, path, name, "more than 2^62 bytes");
    uint32_t storage = GET32(c);
    if (c->short_read || storage > CT_H5_NOT_WRITTEN) return corrupt(err, path, name, "an unknown storage layout");
    l->storage = (ct_h5_storage)storage;
    if (l->storage != CT_H5_CHUNKED && l->nfilters) return corrupt(err, path, name, "filters on storage that is not chunked");
    char what[200];
    if (l->storage == CT_H5_CONTIGUOUS) {
        l->addr = GET64(c);
        l->size = GET64(c);
        if (c->short_read || l->addr > file_size || l->size > file_size - l->addr || l->size < total) {
            snprintf(what, sizeof what, "its %llu bytes at byte %llu run past the end of the file (%llu bytes): truncated",
                     (unsigned long long)total, (unsigned long long)l->addr, (unsigned long long)file_size);
            return corrupt(err, path, name, what);
        }
        l->stored = l->size;
    } else if (l->storage == CT_H5_COMPACT) {
        l->size = GET64(c);
        const uint8_t *p = l->size == total && total <= CT_H5_COMPACT_MAX ? take(c, (size_t)total) : NULL;
        if (!p) return corrupt(err, path, name, "compact data that is not the dataset's size, or past 64 KiB");
        l->compact = ct_xmalloc((size_t)total);
        memcpy(l->compact, p, (size_t)total);
        l->stored = total;
    } else if (l->storage == CT_H5_CHUNKED) {
        return decode_chunks(c, l, file_size, path, name, err);
    }
    return CT_OK;
}

int ct_h5_reply_decode(const uint8_t *reply, size_t n, uint64_t file_size, const char *path,
                       const char *const names[2], ct_h5_reply *r, ct_err *err) {
    memset(r, 0, sizeof *r);
    cursor c = {reply, n, 0, false};
    const uint8_t *m = take(&c, 4);
    uint32_t version = GET32(&c);
    if (!m || memcmp(m, magic, 4) || version != CT_H5_REPLY_VERSION)
        return corrupt(err, path, NULL, "no CTH5 header of version 1 (a probe of another ctrain?)");
    uint32_t code = GET32(&c), len = GET32(&c);
    const uint8_t *text = len <= CT_H5_TEXT_MAX ? take(&c, len) : NULL;
    if (!text || (code != CT_OK && code != CT_ERR_DATA && code != CT_ERR_RUNTIME))
        return corrupt(err, path, NULL, "a status or text outside what the probe sends");
    r->code = (int)code;
    r->text = ct_xmalloc((size_t)len + 1);
    memcpy(r->text, text, len);
    r->text[len] = '\0';
    for (uint32_t i = 0; i < len; i++) /* text for a terminal: no control bytes but newlines and tabs */
        if ((uint8_t)r->text[i] < 0x20 && r->text[i] != '\n' && r->text[i] != '\t') r->text[i] = '?';
    uint32_t datasets = GET32(&c);
    if (c.short_read || datasets > 2 || (code != CT_OK && datasets))
        return corrupt(err, path, NULL, "a dataset count other than 0 or 2");
    for (uint32_t k = 0; k < datasets; k++) {
        r->nlayouts = (int)k + 1;
        int rc = decode_layout(&c, &r->layouts[k], file_size, path, names[k], err);
        if (rc) return rc;
    }
    if (c.at != n) return corrupt(err, path, NULL, "bytes after the last dataset");
    return CT_OK;
}

void ct_h5_layout_free(ct_h5_layout *l) {
    free(l->compact);
    free(l->chunks);
    l->compact = NULL;
    l->chunks = NULL;
}

void ct_h5_reply_free(ct_h5_reply *r) {
    for (int k = 0; k < r->nlayouts; k++) ct_h5_layout_free(&r->layouts[k]);
    free(r->text);
    memset(r, 0, sizeof *r);
}

/* hdf5_rows.c: a dataset's rows from its resolved layout (hdf5_rows.h). */
#include "core/data/hdf5_rows.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/hdf5_filters.h"
#include "core/util/fs.h"

bool ct_h5_filter_known(uint32_t id) {
    return id == CT_H5_FILTER_DEFLATE || id == CT_H5_FILTER_SHUFFLE || id == CT_H5_FILTER_FLETCHER32;
}

void ct_h5_filter_name(uint32_t id, char *out, size_t n) {
    /* HDF5's own filters (H5Zpublic.h) and the registered plugins users meet most */
    static const struct { uint32_t id; const char *name; } names[] = {
        {1, "deflate"}, {2, "shuffle"}, {3, "fletcher32"}, {4, "szip"}, {5, "nbit"}, {6, "scaleoffset"},
        {307, "bzip2"}, {32000, "lzf"}, {32001, "blosc"}, {32004, "lz4"}, {32008, "bitshuffle"},
        {32015, "zstd"}, {32026, "blosc2"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (names[k].id == id) {
            snprintf(out, n, "%s (filter %u)", names[k].name, id);
            return;
        }
    snprintf(out, n, "filter %u", id);
}

static bool pread_all(int fd, void *dst, uint64_t n, uint64_t at, char *why, size_t why_n) {
    ssize_t got = ct_fs_read_at(fd, dst, (size_t)n, (int64_t)at);
    if (got == (ssize_t)n) return true;
    snprintf(why, why_n, "%llu bytes at byte %llu: %s", (unsigned long long)n, (unsigned long long)at,
             got < 0 ? strerror(errno) : "the file ends inside them (truncated since it was opened?)");
    return false;
}

/* Chunk ch of l, decoded into out[0..chunk_bytes): its stored bytes, then its filters from the
 * last to the first (a filter whose bit is set in the chunk's mask was skipped when writing). */
static bool load_chunk(const ct_h5_layout *l, int fd, const ct_h5_chunk *ch, uint64_t chunk_bytes, uint8_t *out,
                       char *why, size_t why_n) {
    uint32_t applied = 0;
    for (int k = 0; k < l->nfilters; k++) applied |= !(ch->mask >> k & 1) << k;
    if (!applied) { /* stored as is: its size was checked against the chunk's at open */
        if (ch->size != chunk_bytes) {
            snprintf(why, why_n, "an unfiltered chunk of %llu bytes (chunks have %llu)", (unsigned long long)ch->size,
                     (unsigned long long)chunk_bytes);
            return false;
        }
        return pread_all(fd, out, chunk_bytes, ch->addr, why, why_n);
    }
    /* every stage fits cap: the chunk plus a checksum per fletcher32 stage after deflate */
    size_t cap = (size_t)chunk_bytes + 4 * (size_t)l->nfilters;
    size_t n = (size_t)ch->size;
    uint8_t *cur = malloc(n > cap ? n : cap), *next = malloc(cap);
    if (!cur || !next) {   /* sizes the file gives: an error naming them, not the end of the process */
        free(cur);
        free(next);
        snprintf(why, why_n, "out of host memory: %zu bytes to undo its filters", (n > cap ? n : cap) + cap);
        return false;
    }
    bool ok = pread_all(fd, cur, ch->size, ch->addr, why, why_n);
    for (int k = l->nfilters - 1; ok && k >= 0; k--) {
        if (!(applied >> k & 1)) continue;
        const ct_h5_filter *f = &l->filters[k];
        if (f->id == CT_H5_FILTER_DEFLATE) {
            ok = ct_h5_inflate(cur, n, next, cap, &n, why, why_n);
        } else if (f->id == CT_H5_FILTER_SHUFFLE) {
            size_t elem = f->ncd >= 1 && f->cd[0] >= 1 && f->cd[0] <= 64 ? f->cd[0] : l->elem;
            if (n > cap) {
                snprintf(why, why_n, "shuffle: %zu bytes, more than a chunk's %llu", n, (unsigned long long)chunk_bytes);
                ok = false;
            } else {
                ct_h5_unshuffle(cur, n, elem, next);
            }
        } else if (f->id == CT_H5_FILTER_FLETCHER32) {
            ok = ct_h5_fletcher32_check(cur, n, &n);
            if (!ok) snprintf(why, why_n, "fletcher32: the chunk's checksum does not match its bytes (corrupt data)");
            continue; /* stripped in place */
        } else { /* refused at open; a mask cannot bring it back */
            char name[64];
            ct_h5_filter_name(f->id, name, sizeof name);
            snprintf(why, why_n, "%s: not decoded by ctrain", name);
            ok = false;
        }
        uint8_t *t = cur; /* the stage's output becomes the next stage's input */
        cur = next;
        next = t;
    }
    if (ok && n != chunk_bytes) {
        snprintf(why, why_n, "the chunk decodes to %zu bytes, not the %llu of a chunk", n, (unsigned long long)chunk_bytes);
        ok = false;
    }
    if (ok) memcpy(out, cur, (size_t)chunk_bytes);
    free(cur);
    free(next);
    return ok;
}

/* The box lo..hi (dataset coordinates, hi exclusive) from src (a block whose origin is src_at
 * and extent src_dims; NULL: the fill value) into dst (origin dst_at, extent dst_dims). The last
 * dimension is copied as runs. */
static void copy_box(const ct_h5_layout *l, const int64_t *lo, const int64_t *hi, const uint8_t *src,
                     const int64_t *src_at, const int64_t *src_dims, uint8_t *dst, const int64_t *dst_at,
                     const int64_t *dst_dims) {
    int nd = l->ndim, last = nd - 1;
    size_t run = (size_t)(hi[last] - lo[last]) * l->elem;
    int64_t x[CT_H5_MAX_RANK];
    memcpy(x, lo, sizeof x);
    bool fill_zero = true;
    for (uint32_t b = 0; b < l->elem; b++) fill_zero &= l->fill[b] == 0;
    for (;;) {
        int64_t s = 0, d = 0; /* element offsets of x in the source and the destination */
        for (int k = 0; k < nd; k++) {
            s = s * src_dims[k] + (x[k] - src_at[k]);
            d = d * dst_dims[k] + (x[k] - dst_at[k]);
        }
        uint8_t *to = dst + (size_t)d * l->elem;
        if (src) memcpy(to, src + (size_t)s * l->elem, run);
        else if (fill_zero) memset(to, 0, run);
        else
            for (size_t b = 0; b < run; b += l->elem) memcpy(to + b, l->fill, l->elem);
        int k = last - 1; /* the odometer over every dimension but the last */
        while (k >= 0 && ++x[k] == hi[k]) x[k] = lo[k], k--;
        if (k < 0) break;
    }
}

static bool read_chunked(const ct_h5_layout *l, int fd, int64_t first, int64_t rows, uint8_t *dst, char *why,
                         size_t why_n) {
    int nd = l->ndim;
    uint64_t chunk_bytes = 0;
    ct_h5_block_bytes(l->chunk, 0, nd, l->elem, &chunk_bytes); /* checked at open */
    int64_t want_lo[CT_H5_MAX_RANK] = {first}, want_hi[CT_H5_MAX_RANK] = {first + rows};
    int64_t dst_dims[CT_H5_MAX_RANK] = {rows};
    for (int d = 1; d < nd; d++) want_hi[d] = dst_dims[d] = l->dims[d];
    /* the chunks that hold the rows: grid rows g_lo..g_hi, every grid cell of the other dims */
    int64_t g_lo[CT_H5_MAX_RANK] = {first / l->chunk[0]}, g_hi[CT_H5_MAX_RANK] = {(first + rows - 1) / l->chunk[0] + 1};
    for (int d = 1; d < nd; d++) g_hi[d] = l->grid[d];
    int64_t g[CT_H5_MAX_RANK];
    memcpy(g, g_lo, sizeof g);
    uint8_t *buf = NULL;
    bool ok = true;
    while (ok) {
        uint64_t cell = 0;
        int64_t at[CT_H5_MAX_RANK], lo[CT_H5_MAX_RANK], hi[CT_H5_MAX_RANK];
        for (int d = 0; d < nd; d++) {
            cell = cell * (uint64_t)l->grid[d] + (uint64_t)g[d];
            at[d] = g[d] * l->chunk[d];
            lo[d] = at[d] > want_lo[d] ? at[d] : want_lo[d];
            int64_t end = at[d] + l->chunk[d];
            hi[d] = end < want_hi[d] ? end : want_hi[d]; /* an edge chunk: clipped to the shape */
        }
        const ct_h5_chunk *ch = &l->chunks[cell];
        if (ch->addr == CT_H5_UNALLOCATED) {
            copy_box(l, lo, hi, NULL, at, l->chunk, dst, want_lo, dst_dims);
        } else {
            if (!buf) buf = malloc((size_t)chunk_bytes);
            char reason[300] = "out of host memory for the chunk";
            ok = buf && load_chunk(l, fd, ch, chunk_bytes, buf, reason, sizeof reason);
            if (ok) copy_box(l, lo, hi, buf, at, l->chunk, dst, want_lo, dst_dims);
            else snprintf(why, why_n, "chunk %llu (%llu bytes at byte %llu): %s", (unsigned long long)cell,
                          (unsigned long long)ch->size, (unsigned long long)ch->addr, reason);
        }
        int d = nd - 1;
        while (d >= 0 && ++g[d] == g_hi[d]) g[d] = g_lo[d], d--;
        if (d < 0) break;
    }
    free(buf);
    return ok;
}

bool ct_h5_read_rows(const ct_h5_layout *l, int fd, int64_t first, int64_t rows, uint8_t *dst, char *why, size_t n) {
    uint64_t row_bytes = 0;
    ct_h5_block_bytes(l->dims, 1, l->ndim, l->elem, &row_bytes); /* checked at open */
    uint64_t at = (uint64_t)first * row_bytes, bytes = (uint64_t)rows * row_bytes;
    switch (l->storage) {
    case CT_H5_CONTIGUOUS: return pread_all(fd, dst, bytes, l->addr + at, why, n);
    case CT_H5_COMPACT: memcpy(dst, l->compact + at, (size_t)bytes); return true;
    case CT_H5_CHUNKED: return read_chunked(l, fd, first, rows, dst, why, n);
    case CT_H5_NOT_WRITTEN: break;
    }
    int64_t lo[CT_H5_MAX_RANK] = {first}, hi[CT_H5_MAX_RANK] = {first + rows}, dims[CT_H5_MAX_RANK] = {rows};
    for (int d = 1; d < l->ndim; d++) hi[d] = dims[d] = l->dims[d];
    copy_box(l, lo, hi, NULL, lo, dims, dst, lo, dims);
    return true;
}

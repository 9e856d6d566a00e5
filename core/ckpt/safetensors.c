/* safetensors.c: see safetensors.h. */
#include "core/ckpt/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/util/fs.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* Integers in the header arrive as JSON doubles: above 2^53 they are no longer exact. */
#define ST_MAX_INT 9007199254740992.0

static const struct {
    const char *name;
    int bits;
    int ct;
} st_dtypes[] = {
    {"BOOL", 8, -1},     {"U8", 8, CT_U8},      {"I8", 8, -1},          {"F8_E5M2", 8, -1},
    {"F8_E4M3", 8, -1},  {"F8_E8M0", 8, -1},    {"F8_E4M3FNUZ", 8, -1}, {"F8_E5M2FNUZ", 8, -1},
    {"I16", 16, -1},     {"U16", 16, CT_U16},   {"F16", 16, CT_F16},    {"BF16", 16, CT_BF16},
    {"I32", 32, CT_I32}, {"U32", 32, -1},       {"F32", 32, CT_F32},    {"F64", 64, -1},
    {"I64", 64, CT_I64}, {"U64", 64, -1},       {"C64", 64, -1},        {"F4", 4, -1},
    {"F6_E2M3", 6, -1},  {"F6_E3M2", 6, -1},
};

static int st_dtype_index(const char *name) {
    for (int i = 0; i < CT_ARRAY_LEN(st_dtypes); i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return i;
    return -1;
}

int ct_st_dtype_bits(const char *name) {
    int i = st_dtype_index(name);
    return i < 0 ? 0 : st_dtypes[i].bits;
}

/* "FILE: not a valid safetensors file: WHAT" as CT_ERR_DATA. */
static int st_bad(ct_err *err, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int st_bad(ct_err *err, const char *file, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ct_errf(err, CT_ERR_DATA, "%s: not a valid safetensors file: %s", file, what);
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF, no NUL). Returns the offset of the
 * first bad byte or len when all is well. */
static size_t st_utf8_check(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c == 0) return i;
        if (c < 0x80) { i++; continue; }
        int extra;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) { extra = 1; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { extra = 2; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { extra = 3; cp = c & 0x07; }
        else return i;
        if (len - i <= (size_t)extra) return i;
        for (int k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((extra == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (extra == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return i;
        i += (size_t)extra + 1;
    }
    return len;
}

/* A JSON number that is an integer in [0, 2^53]. */
static bool st_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d > ST_MAX_INT || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

void ct_st_close(ct_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    if (f->map) munmap(f->map, f->file_size);
    free(f->path);
    free(f);
}

static int st_parse_meta(ct_st_file *f, const cJSON *meta, ct_err *err) {
    if (!cJSON_IsObject(meta)) return st_bad(err, f->path, "__metadata__ is not an object");
    int n = cJSON_GetArraySize(meta);
    f->meta_keys = ct_xcalloc((size_t)n + 1, sizeof(char *));
    f->meta_vals = ct_xcalloc((size_t)n + 1, sizeof(char *));
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return st_bad(err, f->path, "__metadata__ \"%s\" is not a string", m->string);
        for (int i = 0; i < f->n_meta; i++)
            if (strcmp(f->meta_keys[i], m->string) == 0)
                return st_bad(err, f->path, "__metadata__ has \"%s\" twice", m->string);
        f->meta_keys[f->n_meta] = ct_xstrdup(m->string);
        f->meta_vals[f->n_meta] = ct_xstrdup(m->valuestring);
        f->n_meta++;
    }
    return CT_OK;
}

/* One header member "NAME": {"dtype", "shape", "data_offsets"} into t (name not yet set). */
static int st_parse_tensor(const ct_st_file *f, const cJSON *m, ct_st_tensor *t, ct_err *err) {
    const char *name = m->string;
    if (!cJSON_IsObject(m)) return st_bad(err, f->path, "tensor \"%s\": not an object", name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(m, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(m, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(m, "data_offsets");
    if (!cJSON_IsString(dt)) return st_bad(err, f->path, "tensor \"%s\": no dtype string", name);
    int di = st_dtype_index(dt->valuestring);
    if (di < 0)
        return st_bad(err, f->path, "tensor \"%s\": unknown dtype \"%.32s\"", name, dt->valuestring);
    t->dtype = st_dtypes[di].name;
    t->dtype_bits = st_dtypes[di].bits;
    t->ct_dtype = st_dtypes[di].ct;
    if (!cJSON_IsArray(sh)) return st_bad(err, f->path, "tensor \"%s\": no shape array", name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > CT_MAX_DIMS)
        return st_bad(err, f->path, "tensor \"%s\": %d dimensions (ctrain reads at most %d)", name,
                      nd, CT_MAX_DIMS);
    t->shape.ndim = nd;
    uint64_t numel = 1;
    int k = 0;
    for (const cJSON *d = sh->child; d; d = d->next, k++) {
        uint64_t v;
        if (!st_uint(d, &v))
            return st_bad(err, f->path, "tensor \"%s\": shape[%d] is not a non-negative integer",
                          name, k);
        t->shape.d[k] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel))
            return st_bad(err, f->path, "tensor \"%s\": shape product overflows", name);
    }
    uint64_t bits;
    if (__builtin_mul_overflow(numel, (uint64_t)t->dtype_bits, &bits))
        return st_bad(err, f->path, "tensor \"%s\": byte size overflows", name);
    if (bits % 8)
        return st_bad(err, f->path, "tensor \"%s\": %llu elements of %s do not fill whole bytes",
                      name, (unsigned long long)numel, t->dtype);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !st_uint(off->child, &t->begin) ||
        !st_uint(off->child->next, &t->end))
        return st_bad(err, f->path, "tensor \"%s\": data_offsets is not [BEGIN, END] integers",
                      name);
    if (t->end < t->begin)
        return st_bad(err, f->path, "tensor \"%s\": data_offsets [%llu, %llu] end before begin",
                      name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != bits / 8)
        return st_bad(err, f->path,
                      "tensor \"%s\": shape and dtype %s need %llu bytes, data_offsets give %llu",
                      name, t->dtype, (unsigned long long)(bits / 8),
                      (unsigned long long)(t->end - t->begin));
    return CT_OK;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const ct_st_tensor *)a)->name, ((const ct_st_tensor *)b)->name);
}
static int st_cmp_range(const void *a, const void *b) {
    const ct_st_tensor *x = *(const ct_st_tensor *const *)a, *y = *(const ct_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The byte ranges must tile [0, buf_len) exactly: no gap, no overlap, nothing after the end. */
static int st_check_ranges(ct_st_file *f, uint64_t buf_len, ct_err *err) {
    int n = f->n_tensors;
    const ct_st_tensor **by = ct_xmalloc(sizeof(*by) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) by[i] = &f->tensors[i];
    qsort(by, (size_t)n, sizeof(*by), st_cmp_range);
    uint64_t expect = 0;
    int rc = CT_OK;
    for (int i = 0; i < n && rc == CT_OK; i++) {
        if (by[i]->begin != expect)
            rc = st_bad(err, f->path, "tensor \"%s\": data_offsets [%llu, %llu] %s (expected begin %llu)",
                        by[i]->name, (unsigned long long)by[i]->begin,
                        (unsigned long long)by[i]->end,
                        by[i]->begin < expect ? "overlap another tensor" : "leave a gap",
                        (unsigned long long)expect);
        expect = by[i]->end;
    }
    if (rc == CT_OK && expect != buf_len)
        rc = st_bad(err, f->path,
                    expect > buf_len
                        ? "tensor data needs %llu bytes after the header, the file has %llu (truncated?)"
                        : "tensor data ends at %llu bytes after the header, the file has %llu",
                    (unsigned long long)expect, (unsigned long long)buf_len);
    free(by);
    return rc;
}

static int st_parse_header(ct_st_file *f, const uint8_t *hdr, size_t hlen, ct_err *err) {
    if (hlen == 0 || hdr[0] != '{') return st_bad(err, f->path, "header does not start with '{'");
    size_t bad = st_utf8_check(hdr, hlen);
    if (bad != hlen) return st_bad(err, f->path, "header is not UTF-8 text (byte %zu)", bad + 8);
    while (hlen > 0 && (hdr[hlen - 1] == ' ' || hdr[hlen - 1] == '\n' || hdr[hlen - 1] == '\r' ||
                        hdr[hlen - 1] == '\t'))
        hlen--;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)hdr, hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= (const char *)hdr ? (size_t)(end - (const char *)hdr) : 0;
        return st_bad(err, f->path, "header is not valid JSON (near byte %zu)", at + 8);
    }
    int rc = CT_OK;
    if (end != (const char *)hdr + hlen)
        rc = st_bad(err, f->path, "header has text after its JSON object (byte %zu)",
                    (size_t)(end - (const char *)hdr) + 8);
    else if (!cJSON_IsObject(root))
        rc = st_bad(err, f->path, "header is not a JSON object");
    int n = rc == CT_OK ? cJSON_GetArraySize(root) : 0;
    f->tensors = ct_xcalloc((size_t)n + 1, sizeof(ct_st_tensor));
    bool seen_meta = false;
    for (const cJSON *m = rc == CT_OK ? root->child : NULL; m && rc == CT_OK; m = m->next) {
        if (strcmp(m->string, "__metadata__") == 0) {
            rc = seen_meta ? st_bad(err, f->path, "__metadata__ appears twice")
                           : st_parse_meta(f, m, err);
            seen_meta = true;
            continue;
        }
        ct_st_tensor *t = &f->tensors[f->n_tensors];
        rc = st_parse_tensor(f, m, t, err);
        if (rc == CT_OK) {
            t->name = ct_xstrdup(m->string);
            f->n_tensors++;
        }
    }
    cJSON_Delete(root);
    if (rc != CT_OK) return rc;
    qsort(f->tensors, (size_t)f->n_tensors, sizeof(ct_st_tensor), st_cmp_name);
    for (int i = 1; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
            return st_bad(err, f->path, "tensor \"%s\" appears twice", f->tensors[i].name);
    return CT_OK;
}

ct_st_file *ct_st_parse(const void *buf, size_t len, const char *name, ct_err *err) {
    const uint8_t *b = buf;
    ct_st_file *f = ct_xcalloc(1, sizeof *f);
    f->path = ct_xstrdup(name);
    f->file_size = len;
    int rc;
    uint64_t n = 0;
    if (len < 8) {
        rc = st_bad(err, name, "%zu bytes, shorter than the 8-byte header length", len);
    } else {
        memcpy(&n, b, 8);
        f->header_len = n;
        if (n > CT_ST_MAX_HEADER)
            rc = st_bad(err, name, "header length %llu exceeds the limit of %u bytes",
                        (unsigned long long)n, CT_ST_MAX_HEADER);
        else if (n > len - 8)
            rc = st_bad(err, name, "header length %llu exceeds the %zu bytes after it (truncated?)",
                        (unsigned long long)n, len - 8);
        else
            rc = st_parse_header(f, b + 8, (size_t)n, err);
    }
    if (rc == CT_OK) rc = st_check_ranges(f, (uint64_t)(len - 8 - n), err);
    if (rc != CT_OK) {
        ct_st_close(f);
        return NULL;
    }
    for (int i = 0; i < f->n_tensors; i++) f->tensors[i].data = b + 8 + n + f->tensors[i].begin;
    return f;
}

ct_st_file *ct_st_open(const char *path, ct_err *err) {
    int fd;
    if (ct_fs_open_regular(path, CT_ERR_DATA, "a safetensors file", &fd, err)) return NULL;   /* a FIFO: refused */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            ct_errf(err, CT_ERR_RUNTIME, "%s: cannot map %zu bytes: %s", path, size,
                    strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd);
    static const uint8_t empty[1] = {0};
    ct_st_file *f = ct_st_parse(map ? map : empty, size, path, err);
    if (!f) {
        if (map) munmap(map, size);
        return NULL;
    }
    f->map = map;
    for (int i = 0; i < f->n_tensors; i++) f->tensors[i].mapped = map != NULL;
    return f;
}

const ct_st_tensor *ct_st_find(const ct_st_file *f, const char *name) {
    ct_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof(ct_st_tensor), st_cmp_name);
}

const char *ct_st_meta(const ct_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
    return NULL;
}

int64_t ct_st_numel(const ct_st_tensor *t) { return ct_shape_numel(&t->shape); }

bool ct_st_read_f32(const ct_st_tensor *t, float *dst, int64_t n) {
    return n == ct_st_numel(t) && ct_st_read_f32_range(t, 0, n, dst);
}

/* The whole pages of a mapped file's bytes [p, p + len) leave this process's memory (they are read
 * again from the file, or the page cache, when touched again: the mapping is private and never
 * written). A reader that streams a large file through a small buffer so stays small itself. */
static void release_pages(const uint8_t *p, size_t len) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + len) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

bool ct_st_read_f32_range(const ct_st_tensor *t, int64_t first, int64_t n, float *dst) {
    if (first < 0 || n < 0 || first > ct_st_numel(t) - n) return false;
    if (t->ct_dtype != CT_F32 && t->ct_dtype != CT_F16 && t->ct_dtype != CT_BF16) return false;
    size_t es = t->ct_dtype == CT_F32 ? 4 : 2;
    const uint8_t *src = t->data + es * (size_t)first;
    if (t->ct_dtype == CT_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2); /* data may be unaligned */
            dst[i] = t->ct_dtype == CT_F16 ? ct_f16_to_f32(h) : ct_bf16_to_f32(h);
        }
    }
    if (t->mapped) release_pages(src, es * (size_t)n);
    return true;
}

/* ---- writer ---- */

typedef struct st_buf {
    char *p;
    size_t n, cap;
} st_buf;

static void st_put(st_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = ct_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void st_putf(st_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void st_putf(st_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    st_put(b, tmp, (size_t)k);
}
/* JSON string: quotes and backslashes escaped, control characters as \u00XX. */
static void st_put_str(st_buf *b, const char *s) {
    st_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            st_put(b, e, 2);
        } else if (c < 0x20) {
            st_putf(b, "\\u%04x", c);
        } else {
            st_put(b, (const char *)&c, 1);
        }
    }
    st_put(b, "\"", 1);
}

typedef struct st_order {
    const ct_st_entry *e;
    uint64_t begin, end;
} st_order;

/* Descending dtype size, then name: the reference writer's order, which aligns every tensor. */
static int st_cmp_write(const void *a, const void *b) {
    const ct_st_entry *x = ((const st_order *)a)->e, *y = ((const st_order *)b)->e;
    size_t sx = ct_dtype_size(x->dtype), sy = ct_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The file being written, and the CRC-32 (zlib's) of the bytes written so far. */
typedef struct st_out {
    int fd;
    const char *path;
    uLong crc;
} st_out;

static int st_write_all(st_out *o, const void *p, size_t n, ct_err *err) {
    const unsigned char *c = p;
    while (n > 0) {
        ssize_t k = write(o->fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return ct_fs_write_error(err, o->path, "write", k < 0 ? errno : ENOSPC);
        o->crc = crc32(o->crc, c, (uInt)k);
        c += k;
        n -= (size_t)k;
    }
    return CT_OK;
}

/* fp32 values src[k] written as dtype (F32 as they are; F16, BF16 rounded to nearest even). */
static int st_write_converted(st_out *o, const float *src, int64_t k, ct_dtype dtype, ct_err *err) {
    if (dtype == CT_F32) return st_write_all(o, src, (size_t)k * 4, err);
    enum { CHUNK = 16384 };
    uint16_t tmp[CHUNK];
    for (int64_t i = 0; i < k; i += CHUNK) {
        int64_t m = k - i < CHUNK ? k - i : CHUNK;
        for (int64_t j = 0; j < m; j++)
            tmp[j] = dtype == CT_F16 ? ct_f32_to_f16(src[i + j]) : ct_f32_to_bf16(src[i + j]);
        int rc = st_write_all(o, tmp, (size_t)m * 2, err);
        if (rc) return rc;
    }
    return CT_OK;
}

/* stage: the file's one staging buffer for fill entries, CT_ST_FILL_FLOATS floats (or fewer when
 * no entry needs them all), allocated by the caller. */
static int st_write_entry(st_out *o, const ct_st_entry *e, float *stage, int64_t stage_n, ct_err *err) {
    int64_t n = ct_shape_numel(&e->shape);
    if (e->fill) {
        for (int64_t at = 0; at < n; at += stage_n) {
            int64_t k = n - at < stage_n ? n - at : stage_n;
            int rc = e->fill(e->fill_ctx, at, k, stage, err);
            if (!rc) rc = st_write_converted(o, stage, k, e->dtype, err);
            if (rc) return rc;
        }
        return CT_OK;
    }
    if (!e->from_f32) return st_write_all(o, e->data, (size_t)n * ct_dtype_size(e->dtype), err);
    return st_write_converted(o, e->from_f32, n, e->dtype, err);
}

/* Floats the staging buffer needs: the largest fill entry's, at most CT_ST_FILL_FLOATS. */
static int64_t st_stage_floats(const ct_st_entry *entries, int n) {
    int64_t most = 0;
    for (int i = 0; i < n; i++) {
        int64_t k = entries[i].fill ? ct_shape_numel(&entries[i].shape) : 0;
        if (k > most) most = k;
    }
    return most < CT_ST_FILL_FLOATS ? most : CT_ST_FILL_FLOATS;
}

/* Header JSON for entries in file order, padded with spaces to a multiple of 8. */
static void st_build_header(st_buf *h, const st_order *ord, int n, const char *const *mk,
                            const char *const *mv, int n_meta) {
    st_put(h, "{", 1);
    if (n_meta > 0) {
        st_put(h, "\"__metadata__\":{", 16);
        for (int i = 0; i < n_meta; i++) {
            if (i) st_put(h, ",", 1);
            st_put_str(h, mk[i]);
            st_put(h, ":", 1);
            st_put_str(h, mv[i]);
        }
        st_put(h, "}", 1);
    }
    for (int i = 0; i < n; i++) {
        const ct_st_entry *e = ord[i].e;
        if (i || n_meta > 0) st_put(h, ",", 1);
        st_put_str(h, e->name);
        st_putf(h, ":{\"dtype\":\"%s\",\"shape\":[", ct_dtype_safetensors_name(e->dtype));
        for (int d = 0; d < e->shape.ndim; d++) st_putf(h, d ? ",%lld" : "%lld", (long long)e->shape.d[d]);
        st_putf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)ord[i].begin,
                (unsigned long long)ord[i].end);
    }
    st_put(h, "}", 1);
    while (h->n % 8) st_put(h, " ", 1);
}

static int st_check_entries(const st_order *ord, int n, ct_err *err) {
    for (int i = 0; i < n; i++) {
        const ct_st_entry *e = ord[i].e;
        if ((unsigned)e->dtype >= CT_DTYPE_COUNT || e->shape.ndim < 0 || e->shape.ndim > CT_MAX_DIMS)
            return ct_errf(err, CT_ERR_CONFIG, "safetensors writer: tensor \"%s\": bad dtype or rank",
                           e->name);
        if ((e->from_f32 || e->fill) && e->dtype != CT_F32 && e->dtype != CT_F16 && e->dtype != CT_BF16)
            return ct_errf(err, CT_ERR_CONFIG,
                           "safetensors writer: tensor \"%s\": fp32 converts only to F32, F16, BF16",
                           e->name);
        if (i > 0 && strcmp(ord[i - 1].e->name, e->name) == 0)
            return ct_errf(err, CT_ERR_CONFIG, "safetensors writer: tensor \"%s\" given twice",
                           e->name);
        if (st_utf8_check((const uint8_t *)e->name, strlen(e->name)) != strlen(e->name))
            return ct_errf(err, CT_ERR_CONFIG, "safetensors writer: tensor name is not UTF-8");
    }
    return CT_OK;
}

static int st_cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const st_order *)a)->e->name, ((const st_order *)b)->e->name);
}

int ct_st_write(const char *path, const ct_st_entry *entries, int n, const char *const *meta_keys,
                const char *const *meta_vals, int n_meta, ct_err *err) {
    return ct_st_write_crc(path, entries, n, meta_keys, meta_vals, n_meta, NULL, err);
}

int ct_st_write_crc(const char *path, const ct_st_entry *entries, int n, const char *const *meta_keys,
                    const char *const *meta_vals, int n_meta, uint32_t *crc, ct_err *err) {
    st_order *ord = ct_xcalloc((size_t)n + 1, sizeof *ord);
    for (int i = 0; i < n; i++) ord[i].e = &entries[i];
    qsort(ord, (size_t)n, sizeof *ord, st_cmp_entry_name);
    int rc = st_check_entries(ord, n, err);
    if (rc) {
        free(ord);
        return rc;
    }
    qsort(ord, (size_t)n, sizeof *ord, st_cmp_write);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        ord[i].begin = off;
        off += (uint64_t)ct_shape_numel(&ord[i].e->shape) * ct_dtype_size(ord[i].e->dtype);
        ord[i].end = off;
    }
    st_buf h = {0};
    st_build_header(&h, ord, n, meta_keys, meta_vals, n_meta);

    st_out o = {.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), .path = path,
                .crc = crc32(0L, Z_NULL, 0)};
    if (o.fd < 0) {
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create: %s", path, strerror(errno));
    } else {
        uint64_t hlen = h.n;
        rc = st_write_all(&o, &hlen, 8, err);
        if (!rc) rc = st_write_all(&o, h.p, h.n, err);
        int64_t stage_n = st_stage_floats(entries, n);
        float *stage = stage_n > 0 ? ct_xmalloc((size_t)stage_n * sizeof *stage) : NULL;
        for (int i = 0; i < n && !rc; i++) rc = st_write_entry(&o, ord[i].e, stage, stage_n, err);
        free(stage);
        if (!rc && ct_fs_fsync(o.fd) != 0)
            rc = ct_fs_write_error(err, path, "fsync", errno);
        struct stat st;   /* a partial file is removed; a device written through is not a file */
        bool regular = fstat(o.fd, &st) == 0 && S_ISREG(st.st_mode);
        if (close(o.fd) != 0 && !rc)
            rc = ct_fs_write_error(err, path, "close", errno);
        if (rc && regular) unlink(path);
    }
    if (!rc && crc) *crc = (uint32_t)o.crc;
    free(h.p);
    free(ord);
    return rc;
}

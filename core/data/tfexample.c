/* tfexample.c: a protobuf wire reader and tf.Example on top of it (tfexample.h). */
#include "core/data/tfexample.h"

#include <string.h>

/* protobuf wire types */
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

/* A message being read: p moves from the start to end. */
typedef struct pb_reader {
    const uint8_t *p, *end;
} pb_reader;

/* One field: its number and wire type, the value of a varint or fixed field in v, the bytes of a
 * length-delimited one in s[0..len). */
typedef struct pb_field {
    uint64_t num;
    unsigned wire;
    uint64_t v;
    const uint8_t *s;
    size_t len;
} pb_field;

static bool pb_varint(pb_reader *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 70 && r->p < r->end; shift += 7) {
        uint8_t b = *r->p++;
        if (shift == 63 && b > 1) return false; /* more than 64 bits */
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false; /* cut short, or longer than 10 bytes */
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The next field: 1, 0 at the end of the message, -1 when malformed (*why says how). */
static int pb_next(pb_reader *r, pb_field *f, const char **why) {
    if (r->p == r->end) return 0;
    uint64_t key;
    if (!pb_varint(r, &key)) return *why = "a field key runs past the end of its message", -1;
    f->num = key >> 3;
    f->wire = (unsigned)(key & 7);
    f->v = 0;
    f->s = r->p; /* no bytes unless length-delimited, but never a NULL to compute from */
    f->len = 0;
    if (f->num == 0) return *why = "field number 0", -1;
    switch (f->wire) {
    case WIRE_VARINT:
        if (!pb_varint(r, &f->v)) return *why = "a varint runs past the end of its message", -1;
        return 1;
    case WIRE_FIXED64:
    case WIRE_FIXED32: {
        size_t n = f->wire == WIRE_FIXED64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) return *why = "a fixed-size value runs past the end of its message", -1;
        f->v = le(r->p, (int)n);
        r->p += n;
        return 1;
    }
    case WIRE_LEN: {
        uint64_t n;
        if (!pb_varint(r, &n) || n > (uint64_t)(r->end - r->p))
            return *why = "a length-delimited field runs past the end of its message", -1;
        f->s = r->p;
        f->len = (size_t)n;
        r->p += n;
        return 1;
    }
    default:
        return *why = "a field of wire type 3, 4, 6 or 7 (groups are not in tf.Example)", -1;
    }
}

const char *ct_tfx_kind_name(ct_tfx_kind kind) {
    switch (kind) {
    case CT_TFX_BYTES: return "bytes_list";
    case CT_TFX_FLOAT: return "float_list";
    case CT_TFX_INT64: return "int64_list";
    default: return "missing";
    }
}

/* Count a list's values, checking its wire encoding. */
static bool count_values(ct_tfx_feature *f, const char **why) {
    pb_reader r = {f->list, f->list + f->list_len};
    pb_field v;
    int got;
    f->count = 0;
    while ((got = pb_next(&r, &v, why)) == 1) {
        if (v.num != 1) continue;
        if (f->kind == CT_TFX_BYTES) {
            if (v.wire != WIRE_LEN) return *why = "a bytes_list value is not length-delimited", false;
            f->count++;
        } else if (f->kind == CT_TFX_FLOAT) {
            if (v.wire == WIRE_FIXED32) f->count++;
            else if (v.wire == WIRE_LEN && v.len % 4 == 0) f->count += (int64_t)(v.len / 4);
            else return *why = "a float_list value is neither a float nor a packed run of floats", false;
        } else if (v.wire == WIRE_VARINT) {
            f->count++;
        } else if (v.wire == WIRE_LEN) {
            pb_reader packed = {v.s, v.s + v.len};
            uint64_t x;
            while (packed.p < packed.end) {
                if (!pb_varint(&packed, &x)) return *why = "a packed int64_list is cut short", false;
                f->count++;
            }
        } else {
            return *why = "an int64_list value is neither a varint nor a packed run of varints", false;
        }
    }
    return got == 0;
}

/* A Feature message: its (last) kind and list. */
static bool read_feature(const uint8_t *s, size_t n, ct_tfx_feature *out, const char **why) {
    pb_reader r = {s, s + n};
    pb_field f;
    int got;
    *out = (ct_tfx_feature){.kind = CT_TFX_MISSING};
    while ((got = pb_next(&r, &f, why)) == 1) {
        if (f.num < 1 || f.num > 3) continue;
        if (f.wire != WIRE_LEN) return *why = "a Feature's list is not length-delimited", false;
        *out = (ct_tfx_feature){.kind = f.num == 1   ? CT_TFX_BYTES
                                        : f.num == 2 ? CT_TFX_FLOAT
                                                     : CT_TFX_INT64,
                                .list = f.s, .list_len = f.len};
    }
    if (got < 0) return false;
    if (out->kind == CT_TFX_MISSING) return true; /* a Feature with no list set: treated as absent */
    return count_values(out, why);
}

/* Each map entry of each Features of the Example: visit(key, value). */
typedef bool (*entry_fn)(void *ctx, const uint8_t *key, size_t key_len, const uint8_t *value, size_t value_len,
                         const char **why);

static bool each_entry(const uint8_t *buf, size_t n, entry_fn fn, void *ctx, const char **why) {
    if (n == 0) return true; /* an empty Example (buf may be NULL then) */
    pb_reader ex = {buf, buf + n};
    pb_field f;
    int got;
    while ((got = pb_next(&ex, &f, why)) == 1) {
        if (f.num != 1) continue;
        if (f.wire != WIRE_LEN) return *why = "Example.features is not a message", false;
        pb_reader feats = {f.s, f.s + f.len};
        pb_field e;
        int got_e;
        while ((got_e = pb_next(&feats, &e, why)) == 1) {
            if (e.num != 1) continue;
            if (e.wire != WIRE_LEN) return *why = "a Features map entry is not a message", false;
            pb_reader entry = {e.s, e.s + e.len};
            pb_field kv;
            const uint8_t *key = (const uint8_t *)"", *value = NULL;
            size_t key_len = 0, value_len = 0;
            int got_kv;
            while ((got_kv = pb_next(&entry, &kv, why)) == 1) {
                if ((kv.num == 1 || kv.num == 2) && kv.wire != WIRE_LEN)
                    return *why = "a Features map entry's key or value is not length-delimited", false;
                if (kv.num == 1) key = kv.s, key_len = kv.len;
                else if (kv.num == 2) value = kv.s, value_len = kv.len;
            }
            if (got_kv < 0 || !fn(ctx, key, key_len, value, value_len, why)) return false;
        }
        if (got_e < 0) return false;
    }
    return got == 0;
}

typedef struct find_ctx {
    const char *name;
    size_t name_len;
    ct_tfx_feature *out;
} find_ctx;

static bool find_entry(void *ctx, const uint8_t *key, size_t key_len, const uint8_t *value, size_t value_len,
                       const char **why) {
    find_ctx *c = ctx;
    if (key_len != c->name_len || memcmp(key, c->name, key_len) != 0) return true;
    if (!value) {
        *c->out = (ct_tfx_feature){.kind = CT_TFX_MISSING};
        return true;
    }
    return read_feature(value, value_len, c->out, why);
}

bool ct_tfx_find(const uint8_t *buf, size_t n, const char *name, ct_tfx_feature *out, const char **why) {
    *out = (ct_tfx_feature){.kind = CT_TFX_MISSING};
    find_ctx c = {name, strlen(name), out};
    return each_entry(buf, n, find_entry, &c, why);
}

typedef struct each_ctx {
    ct_tfx_visit visit;
    void *ctx;
} each_ctx;

static bool visit_entry(void *ctx, const uint8_t *key, size_t key_len, const uint8_t *value, size_t value_len,
                        const char **why) {
    each_ctx *c = ctx;
    ct_tfx_feature f = {.kind = CT_TFX_MISSING};
    if (value && !read_feature(value, value_len, &f, why)) return false;
    c->visit(c->ctx, (const char *)key, key_len, &f);
    return true;
}

bool ct_tfx_each(const uint8_t *buf, size_t n, ct_tfx_visit visit, void *ctx, const char **why) {
    each_ctx c = {visit, ctx};
    return each_entry(buf, n, visit_entry, &c, why);
}

/* The values of a list that count_values accepted (no error can occur; a missing feature has no
 * list and no values): float_list values into fo; int64_list values into io, or into fo as floats
 * when io is NULL. */
static void read_values(const ct_tfx_feature *f, float *fo, int64_t *io) {
    if (!f->list) return;
    pb_reader r = {f->list, f->list + f->list_len};
    pb_field v;
    const char *why;
    int64_t k = 0;
    while (k < f->count && pb_next(&r, &v, &why) == 1) {
        if (v.num != 1) continue;
        if (f->kind == CT_TFX_FLOAT) {
            bool one = v.wire == WIRE_FIXED32;
            for (size_t j = 0; (one ? j == 0 : j + 4 <= v.len) && k < f->count; j += 4) {
                uint32_t bits = one ? (uint32_t)v.v : (uint32_t)le(v.s + j, 4);
                memcpy(&fo[k++], &bits, 4);
            }
            continue;
        }
        pb_reader packed = {v.s, v.s + v.len}; /* wire type 2: a packed run, else one varint */
        uint64_t x = v.v;
        for (bool one = v.wire == WIRE_VARINT; k < f->count && (one || pb_varint(&packed, &x)); one = false) {
            if (io) io[k++] = (int64_t)x;
            else fo[k++] = (float)(int64_t)x;
            if (one) break;
        }
    }
}

void ct_tfx_floats(const ct_tfx_feature *f, float *out) { read_values(f, out, NULL); }

void ct_tfx_int64s(const ct_tfx_feature *f, int64_t *out) { read_values(f, NULL, out); }

void ct_tfx_bytes(const ct_tfx_feature *f, int64_t k, const uint8_t **p, size_t *len) {
    *p = NULL;
    *len = 0;
    if (!f->list) return;
    pb_reader r = {f->list, f->list + f->list_len};
    pb_field v;
    const char *why;
    while (pb_next(&r, &v, &why) == 1) {
        if (v.num != 1) continue;
        if (k-- == 0) {
            *p = v.s;
            *len = v.len;
            return;
        }
    }
}

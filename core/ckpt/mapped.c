/* mapped.c: init_from and export through a tensor map (mapped.h). */
#include "core/ckpt/mapped.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINES 12

/* The shape an entry has in the file: the view's, with `rows` rows, transposed when it is. */
static ct_shape file_shape(const ct_param_view *v, const ct_tmap_entry *e) {
    ct_shape s = v->shape;
    s.d[0] = e->rows;
    if (e->transpose && s.ndim == 2) {
        int64_t d0 = s.d[0];
        s.d[0] = s.d[1];
        s.d[1] = d0;
    }
    return s;
}

/* Elements per row of the view (everything after the first dimension). */
static int64_t row_elems(const ct_param_view *v) {
    int64_t n = 1;
    for (int i = 1; i < v->shape.ndim; i++) n *= v->shape.d[i];
    return n;
}

/* file [rows, cols] (transposed: [cols, rows]) -> view [>= rows, cols], the rows past zero. */
static void to_view(const float *file, const ct_tmap_entry *e, const ct_param_view *v, float *dst) {
    int64_t cols = row_elems(v);
    if (e->transpose)
        for (int64_t r = 0; r < e->rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = file[c * e->rows + r];
    else
        memcpy(dst, file, (size_t)(e->rows * cols) * sizeof *dst);
    memset(dst + e->rows * cols, 0, (size_t)(v->numel - e->rows * cols) * sizeof *dst);
}

/* The inverse: view -> the file's layout (its first `rows` rows). */
static void to_file(const float *view, const ct_tmap_entry *e, const ct_param_view *v, float *dst) {
    int64_t cols = row_elems(v);
    if (e->transpose)
        for (int64_t r = 0; r < e->rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[c * e->rows + r] = view[r * cols + c];
    else
        memcpy(dst, view, (size_t)(e->rows * cols) * sizeof *dst);
}

/* One line of the mismatch list; past MAX_LINES only counted. */
static void mismatch(ct_err *err, int *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void mismatch(ct_err *err, int *n, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (*n < MAX_LINES) ct_err_append(err, "  %s", line);
    (*n)++;
}

/* The file's tensor for a name of the map: prefix + name, or name; marks it used. */
static const ct_st_tensor *find(const ct_st_file *f, const ct_tensor_map *m, const char *name, bool *used) {
    const ct_st_tensor *x = NULL;
    if (m->prefix && m->prefix[0]) {
        char full[2 * CT_TMAP_NAME];
        snprintf(full, sizeof full, "%s%s", m->prefix, name);
        x = ct_st_find(f, full);
    }
    if (!x) x = ct_st_find(f, name);
    if (x) used[x - f->tensors] = true;
    return x;
}

static float *read_all(const ct_st_tensor *x) {
    int64_t n = ct_st_numel(x);
    float *buf = ct_xmalloc((size_t)(n ? n : 1) * sizeof *buf);
    ct_st_read_f32(x, buf, n);
    return buf;
}

/* A duplicate's tensor equals its original's (the entry of the same view that is no duplicate). */
static bool same_as_original(const ct_st_file *f, const ct_tensor_map *m, const ct_tmap_entry *dup,
                             const ct_st_tensor *x, bool *used, const char **original) {
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        if (e->duplicate || e->view != dup->view) continue;
        *original = e->name;
        const ct_st_tensor *o = find(f, m, e->name, used);
        if (!o || !ct_shape_eq(&o->shape, &x->shape)) return false;
        float *a = read_all(o), *b = read_all(x);
        bool same = memcmp(a, b, (size_t)ct_st_numel(x) * sizeof *a) == 0;
        free(a);
        free(b);
        return same;
    }
    *original = "?";
    return false;
}

/* Every mismatch between the file and the map into err; returns their number. */
static int check_file(const ct_st_file *f, const ct_ckpt_tensors *t, const ct_tensor_map *m, ct_err *err) {
    bool *used = ct_xcalloc((size_t)f->n_tensors + 1, 1);
    int bad = 0;
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        const ct_param_view *v = &t->views[e->view];
        const ct_st_tensor *x = find(f, m, e->name, used);
        ct_shape want = file_shape(v, e);
        char a[96], b[96], c[96];
        const char *original;
        if (!x) {
            if (!e->duplicate)
                mismatch(err, &bad, "%s %s: not in the file (the model's %s)", e->name,
                         ct_shape_str(&want, a, sizeof a), v->name);
        } else if (!ct_shape_eq(&x->shape, &want)) {
            mismatch(err, &bad, "%s: %s in the file, %s expected (the model's %s is %s%s)", x->name,
                     ct_shape_str(&x->shape, a, sizeof a), ct_shape_str(&want, b, sizeof b), v->name,
                     ct_shape_str(&v->shape, c, sizeof c), e->transpose ? ", stored transposed" : "");
        } else if (x->ct_dtype != CT_F32 && x->ct_dtype != CT_F16 && x->ct_dtype != CT_BF16) {
            mismatch(err, &bad, "%s: dtype %s, expected F32, F16 or BF16", x->name, x->dtype);
        } else if (e->duplicate && !same_as_original(f, m, e, x, used, &original)) {
            mismatch(err, &bad, "%s differs from %s: the model's head is tied to %s, so the file's "
                     "must be a copy of it", x->name, original, v->name);
        }
    }
    for (int i = 0; i < m->n_ignored; i++) find(f, m, m->ignored[i], used);
    for (int i = 0; i < f->n_tensors; i++)
        if (!used[i]) mismatch(err, &bad, "%s: in the file, not a tensor of the model's %s layout", f->tensors[i].name, m->layout);
    free(used);
    return bad;
}

int ct_ckpt_init_from_map(const char *file, const ct_ckpt_tensors *t, const ct_tensor_map *m,
                          int *n_loaded, ct_err *err) {
    if (n_loaded) *n_loaded = 0;
    int64_t first, k;
    for (int i = 0; i < m->n; i++)
        if (m->entries[i].view < 0 || m->entries[i].view >= t->n_views ||
            !ct_ckpt_view_part(t, &t->views[m->entries[i].view], &first, &k))
            return ct_errf(err, CT_ERR_RUNTIME, "init_from: %s maps to no view inside the buffers", m->entries[i].name);
    ct_st_file *f = ct_st_open(file, err);
    if (!f) return err && err->code ? err->code : CT_ERR_DATA;
    ct_errf(err, CT_ERR_CONFIG, "model.init_from %s (layout %s) does not match the model:", file, m->layout);
    int bad = check_file(f, t, m, err);
    if (bad > MAX_LINES) ct_err_append(err, "  ... and %d more", bad - MAX_LINES);
    if (bad) {
        if (m->hint) ct_err_append(err, "%s", m->hint);
        ct_st_close(f);
        return CT_ERR_CONFIG;
    }
    bool *used = ct_xcalloc((size_t)f->n_tensors + 1, 1);
    int loaded = 0;
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        if (e->duplicate) continue;
        /* one view at a time in the model's layout (a transpose needs all of it), then the part of
         * it this rank holds into t's memory */
        const ct_param_view *v = &t->views[e->view];
        float *values = read_all(find(f, m, e->name, used));
        float *view = ct_xmalloc((size_t)(v->numel ? v->numel : 1) * sizeof *view);
        to_view(values, e, v, view);
        ct_ckpt_put_view(t, v, view);
        free(view);
        free(values);
        loaded++;
    }
    free(used);
    ct_st_close(f);
    if (err) *err = (ct_err){0};
    if (n_loaded) *n_loaded = loaded;
    return CT_OK;
}

int ct_ckpt_map_export(const ct_ckpt_source *src, const ct_param_view *views, const ct_tensor_map *m,
                       ct_dtype dtype, ct_mapped_export *out, ct_err *err) {
    *out = (ct_mapped_export){0};
    out->entries = ct_xcalloc((size_t)m->n + 1, sizeof *out->entries);
    out->names = ct_xcalloc((size_t)m->n + 1, sizeof *out->names);
    out->data = ct_xcalloc((size_t)m->n + 1, sizeof *out->data);
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        if (e->duplicate) continue;
        const ct_param_view *v = &views[e->view];
        const ct_ckpt_src_tensor *x = ct_ckpt_source_find(src, v->name);
        char a[96], b[96];
        if (!x || !ct_shape_eq(&x->shape, &v->shape) || ct_shape_numel(&x->shape) != v->numel)
            return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" is %s%s, the model of its config needs "
                           "%s (for %s's %s)", src->path, v->name, x ? "of shape " : "missing",
                           x ? ct_shape_str(&x->shape, a, sizeof a) : "",
                           ct_shape_str(&v->shape, b, sizeof b), m->layout, e->name);
        float *values = ct_xmalloc((size_t)(v->numel ? v->numel : 1) * sizeof *values);
        if (!ct_ckpt_source_read(src, x, 0, v->numel, values)) {
            free(values);
            return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" has dtype %s, expected F32, F16 or BF16",
                           src->path, v->name, x->dtype);
        }
        ct_shape fs = file_shape(v, e);
        float *file = ct_xmalloc((size_t)(ct_shape_numel(&fs) ? ct_shape_numel(&fs) : 1) * sizeof *file);
        to_file(values, e, v, file);
        free(values);
        size_t len = strlen(e->name) + (m->write_prefix ? strlen(m->write_prefix) : 0) + 1;
        char *name = ct_xmalloc(len);
        snprintf(name, len, "%s%s", m->write_prefix ? m->write_prefix : "", e->name);
        out->names[out->n] = name;
        out->data[out->n] = file;
        out->entries[out->n] = (ct_st_entry){.name = name, .dtype = dtype, .shape = fs, .from_f32 = file};
        out->n++;
    }
    return CT_OK;
}

void ct_mapped_export_free(ct_mapped_export *x) {
    for (int i = 0; i < x->n; i++) {
        free(x->names[i]);
        free(x->data[i]);
    }
    free(x->names);
    free(x->data);
    free(x->entries);
    *x = (ct_mapped_export){0};
}

/* mapped.c: init_from and export through a tensor map (mapped.h). */
#include "core/ckpt/mapped.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/source.h"
#include "core/util/fs.h"

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

/* file [rows, cols] (transposed: [cols, rows]) -> the view's rows [row0, row0 + rows). */
static void to_view(const float *file, const ct_tmap_entry *e, const ct_param_view *v, float *view) {
    int64_t cols = row_elems(v);
    float *dst = view + e->row0 * cols;
    if (e->transpose)
        for (int64_t r = 0; r < e->rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = file[c * e->rows + r];
    else
        memcpy(dst, file, (size_t)(e->rows * cols) * sizeof *dst);
}

/* The inverse: the view's rows [row0, row0 + rows) -> the file's layout. */
static void to_file(const float *view, const ct_tmap_entry *e, const ct_param_view *v, float *dst) {
    int64_t cols = row_elems(v);
    const float *src = view + e->row0 * cols;
    if (e->transpose)
        for (int64_t r = 0; r < e->rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[c * e->rows + r] = src[r * cols + c];
    else
        memcpy(dst, src, (size_t)(e->rows * cols) * sizeof *dst);
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

/* The files one init_from reads (a Hugging Face model's shards), and which of their tensors a map
 * entry or an ignored name has claimed. */
typedef struct {
    ct_st_file **f;
    int n;
    bool **used;
} file_set;

static const ct_st_tensor *find_in(const file_set *fs, const char *name, int *which) {
    for (int i = 0; i < fs->n; i++) {
        const ct_st_tensor *x = ct_st_find(fs->f[i], name);
        if (x) {
            *which = i;
            return x;
        }
    }
    return NULL;
}

/* The tensor for a name of the map: prefix + name, or name, in whichever file holds it; marks it
 * used. */
static const ct_st_tensor *find(const file_set *fs, const ct_tensor_map *m, const char *name) {
    const ct_st_tensor *x = NULL;
    int which = 0;
    if (m->prefix && m->prefix[0]) {
        char full[2 * CT_TMAP_NAME];
        snprintf(full, sizeof full, "%s%s", m->prefix, name);
        x = find_in(fs, full, &which);
    }
    if (!x) x = find_in(fs, name, &which);
    if (x) fs->used[which][x - fs->f[which]->tensors] = true;
    return x;
}

static float *read_all(const ct_st_tensor *x) {
    int64_t n = ct_st_numel(x);
    float *buf = ct_xmalloc((size_t)(n ? n : 1) * sizeof *buf);
    ct_st_read_f32(x, buf, n);
    return buf;
}

/* A duplicate's tensor equals its original's (the entry of the same view that is no duplicate). */
static bool same_as_original(const file_set *fs, const ct_tensor_map *m, const ct_tmap_entry *dup,
                             const ct_st_tensor *x, const char **original) {
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        if (e->duplicate || e->view != dup->view) continue;
        *original = e->name;
        const ct_st_tensor *o = find(fs, m, e->name);
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

/* The same name in two of the files (a model's shards hold each tensor once). */
static void check_twice(const file_set *fs, ct_err *err, int *bad) {
    for (int i = 0; i < fs->n; i++)
        for (int k = 0; k < fs->f[i]->n_tensors; k++)
            for (int j = i + 1; j < fs->n; j++)
                if (ct_st_find(fs->f[j], fs->f[i]->tensors[k].name))
                    mismatch(err, bad, "%s: in both %s and %s", fs->f[i]->tensors[k].name, fs->f[i]->path,
                             fs->f[j]->path);
}

/* Every mismatch between the files and the map into err; returns their number. */
static int check_files(const file_set *fs, const ct_ckpt_tensors *t, const ct_tensor_map *m, ct_err *err) {
    int bad = 0;
    check_twice(fs, err, &bad);
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        const ct_param_view *v = &t->views[e->view];
        const ct_st_tensor *x = find(fs, m, e->name);
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
        } else if (e->duplicate && !same_as_original(fs, m, e, x, &original)) {
            mismatch(err, &bad, "%s differs from %s: the model's head is tied to %s, so the file's "
                     "must be a copy of it", x->name, original, v->name);
        }
    }
    for (int i = 0; i < m->n_ignored; i++) find(fs, m, m->ignored[i]);
    for (int k = 0; k < fs->n; k++)
        for (int i = 0; i < fs->f[k]->n_tensors; i++)
            if (!fs->used[k][i])
                mismatch(err, &bad, "%s: in the file%s%s, not a tensor of the model's %s layout", fs->f[k]->tensors[i].name,
                         fs->n > 1 ? " " : "", fs->n > 1 ? fs->f[k]->path : "", m->layout);
    return bad;
}

static void close_set(file_set *fs) {
    for (int i = 0; i < fs->n; i++) {
        ct_st_close(fs->f[i]);
        free(fs->used[i]);
    }
    free(fs->f);
    free(fs->used);
}

/* Open every file, or none (CT_ERR_DATA naming the one that fails). */
static int open_set(const char *const *files, int n, file_set *fs, ct_err *err) {
    *fs = (file_set){.f = ct_xcalloc((size_t)n + 1, sizeof *fs->f), .used = ct_xcalloc((size_t)n + 1, sizeof *fs->used)};
    for (int i = 0; i < n; i++) {
        ct_st_file *f = ct_st_open(files[i], err);
        if (!f) {
            close_set(fs);
            return err && err->code ? err->code : CT_ERR_DATA;
        }
        fs->f[fs->n] = f;
        fs->used[fs->n++] = ct_xcalloc((size_t)f->n_tensors + 1, 1);
    }
    return CT_OK;
}

int ct_ckpt_init_from_map_files(const char *const *files, int n_files, const char *what, const ct_ckpt_tensors *t,
                                const ct_tensor_map *m, int *n_loaded, ct_err *err) {
    if (n_loaded) *n_loaded = 0;
    int64_t first, k;
    for (int i = 0; i < m->n; i++)
        if (m->entries[i].view < 0 || m->entries[i].view >= t->n_views ||
            !ct_ckpt_view_part(t, &t->views[m->entries[i].view], &first, &k))
            return ct_errf(err, CT_ERR_RUNTIME, "init_from: %s maps to no view inside the buffers", m->entries[i].name);
    file_set fs;
    int rc = open_set(files, n_files, &fs, err);
    if (rc) return rc;
    ct_errf(err, CT_ERR_CONFIG, "model.init_from %s (layout %s) does not match the model:", what, m->layout);
    int bad = check_files(&fs, t, m, err);
    if (bad > MAX_LINES) ct_err_append(err, "  ... and %d more", bad - MAX_LINES);
    if (bad) {
        if (m->hint) ct_err_append(err, "%s", m->hint);
        close_set(&fs);
        return CT_ERR_CONFIG;
    }
    /* one view at a time in the model's layout (a transpose needs all of it), from zeros (rows no
     * entry covers, a padded vocabulary's, stay zero) with every row block the map has for it (q,
     * k and v of a fused projection), then the part of it this rank holds into t's memory */
    if (err) *err = (ct_err){0};   /* the files match: no mismatch to report */
    int loaded = 0;
    bool *filled = ct_xcalloc((size_t)t->n_views + 1, 1);
    for (int i = 0; i < m->n; i++) {
        const ct_tmap_entry *e = &m->entries[i];
        if (e->duplicate || filled[e->view]) continue;
        const ct_param_view *v = &t->views[e->view];
        float *view = ct_xcalloc((size_t)(v->numel ? v->numel : 1), sizeof *view);
        for (int j = i; j < m->n; j++) {
            if (m->entries[j].duplicate || m->entries[j].view != e->view) continue;
            float *values = read_all(find(&fs, m, m->entries[j].name));
            to_view(values, &m->entries[j], v, view);
            free(values);
        }
        rc = ct_ckpt_put_view(t, v, view, err);
        free(view);
        if (rc) break;
        filled[e->view] = true;
        loaded++;
    }
    free(filled);
    close_set(&fs);
    if (rc) return rc;
    if (n_loaded) *n_loaded = loaded;
    return CT_OK;
}

int ct_ckpt_init_from_map(const char *file, const ct_ckpt_tensors *t, const ct_tensor_map *m, int *n_loaded,
                          ct_err *err) {
    return ct_ckpt_init_from_map_files(&file, 1, file, t, m, n_loaded, err);
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

/* ---- a Hugging Face model directory's weight files ---- */

void ct_ckpt_free_files(char **files, int n) {
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
}

static char *joined(const char *dir, const char *name) {
    size_t len = strlen(dir) + strlen(name) + 2;
    char *p = ct_xmalloc(len);
    snprintf(p, len, "%s/%s", dir, name);
    return p;
}

/* The files model.safetensors.index.json's weight_map names, each once, in order. */
static int index_files(const char *dir, const char *index, char ***files, int *n, ct_err *err) {
    size_t len = 0;
    char *text = ct_fs_read_small(index, (size_t)64 << 20, &len);
    if (!text) return ct_errf(err, CT_ERR_DATA, "%s: %s", index, strerror(errno));
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map) || !map->child) {
        cJSON_Delete(root);
        return ct_errf(err, CT_ERR_DATA, "%s: not a safetensors index (JSON with a \"weight_map\" from tensor names "
                       "to files)", index);
    }
    int cap = cJSON_GetArraySize(map), rc = CT_OK;
    *files = ct_xcalloc((size_t)cap + 1, sizeof **files);
    *n = 0;
    for (const cJSON *e = map->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/')) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: weight_map[\"%s\"]: expected a file name in %s", index, e->string, dir);
            break;
        }
        bool seen = false;
        for (int i = 0; i < *n && !seen; i++) seen = strcmp(strrchr((*files)[i], '/') + 1, e->valuestring) == 0;
        if (seen) continue;
        (*files)[(*n)++] = joined(dir, e->valuestring);
        if (!ct_fs_exists((*files)[*n - 1]))
            rc = ct_errf(err, CT_ERR_CONFIG, "%s: %s names %s, which is not there: the model's weights are "
                         "incomplete", dir, index, e->valuestring);
    }
    cJSON_Delete(root);
    if (rc) ct_ckpt_free_files(*files, *n), *files = NULL, *n = 0;
    return rc;
}

int ct_ckpt_hf_weight_files(const char *dir, char ***files, int *n, ct_err *err) {
    char *index = joined(dir, "model.safetensors.index.json"), *single = joined(dir, "model.safetensors");
    int rc = CT_OK;
    *files = NULL, *n = 0;
    if (ct_fs_exists(index)) {
        rc = index_files(dir, index, files, n, err);
    } else if (ct_fs_exists(single)) {
        *files = ct_xcalloc(2, sizeof **files);
        (*files)[(*n)++] = single;
        single = NULL;
    } else {
        rc = ct_errf(err, CT_ERR_CONFIG, "%s: no model.safetensors and no model.safetensors.index.json: a Hugging "
                     "Face model directory holds its weights in one of them (save_pretrained writes them; "
                     "pytorch_model.bin is not read)", dir);
    }
    free(index);
    free(single);
    return rc;
}

bool ct_ckpt_is_hf_dir(const char *dir) {
    if (!ct_fs_is_dir(dir) || ct_ckpt_is_complete(dir) || ct_ckpt_dir_sharded(dir)) return false;
    char *path = joined(dir, "config.json");
    char *text = ct_fs_read_small(path, (size_t)1 << 20, NULL);
    free(path);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    bool hf = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cfg, "model_type"));
    cJSON_Delete(cfg);
    return hf;
}

/* image_folder.c: root/<class>/<file>.png, one directory per class.
 *
 * The class index is the position of the directory name in byte-wise sorted order (what
 * torchvision's ImageFolder does); files are taken in sorted order within each class, so sample i
 * is the same file on every machine. An eval folder takes the train folder's indices by class
 * name instead (ct_dataset_match_classes), so it may hold only some of the classes. A class
 * directory without images is an error. Files not ending in .png (any case) and names starting
 * with '.' are ignored.
 *
 * Entry fields: {"format": "image_folder", "root": DIR, "size": [H, W] (default: the first
 * image's), "channels": 1 | 2 | 3 | 4 (default: the first image's), "resize": "none" (default:
 * a differently sized image is an error) | "bilinear" | "crop" (center crop, zero padding where
 * the image is smaller), "limit": N (N files spread evenly over the sorted list)}. Decoded samples are [channels, H, W] float, scaled to [0, 1]
 * and normalised with data.transform.normalize. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/transform.h"
#include "core/data/pngdec.h"

typedef enum { RESIZE_NONE, RESIZE_BILINEAR, RESIZE_CROP } resize_mode;

typedef struct folder_impl {
    char root[1024];
    char **files;                /* [count] full paths */
    int32_t *labels;             /* [count] */
    int64_t n_alloc;
    char **classes;              /* [n_classes] directory names */
    int64_t n_classes;
    int h, w, c;
    resize_mode resize;
    float *lut;                  /* [c][256]: pixel value -> normalised float */
} folder_impl;

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_png_name(const char *s) {
    size_t n = strlen(s);
    return s[0] != '.' && n > 4 && strcasecmp(s + n - 4, ".png") == 0;
}

/* Sorted names in dir that pass `keep` (directories when dirs, else PNG files). */
static int list_dir(const char *dir, bool dirs, char ***out, int64_t *n, ct_err *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot read directory: %s", dir, strerror(errno));
    int64_t cap = 0;
    struct dirent *e;
    char path[2048];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        bool is_dir = e->d_type == DT_DIR;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            DIR *probe = opendir(path);
            is_dir = probe != NULL;
            if (probe) closedir(probe);
        }
        if (dirs ? !is_dir : (is_dir || !is_png_name(e->d_name))) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            *out = ct_xrealloc(*out, (size_t)cap * sizeof **out);
        }
        (*out)[(*n)++] = ct_xstrdup(e->d_name);
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return CT_OK;
}

static void free_names(char **names, int64_t n) {
    for (int64_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

static void folder_close(ct_dataset *ds) {
    folder_impl *im = ds->impl;
    if (im) {
        free_names(im->files, im->n_alloc);
        free_names(im->classes, im->n_classes);
        free(im->labels);
        free(im->lut);
        free(im);
    }
    free(ds);
}

static int scan(folder_impl *im, int64_t limit, int64_t *count, ct_err *err) {
    int rc = list_dir(im->root, true, &im->classes, &im->n_classes, err);
    if (rc) return rc;
    if (im->n_classes == 0)
        return ct_errf(err, CT_ERR_DATA, "%s: no class directories (expected ROOT/<class>/<file>.png)",
                       im->root);
    int64_t n = 0, cap = 0;
    char dir[2048];
    for (int64_t k = 0; k < im->n_classes; k++) {
        snprintf(dir, sizeof dir, "%s/%s", im->root, im->classes[k]);
        char **names;
        int64_t m;
        rc = list_dir(dir, false, &names, &m, err);
        if (rc) return rc;
        /* An empty class would still take a label (its place in the sorted list): the model
         * would be asked for a class no image has, and a message about labels would name a
         * label no file carries. Refused, as torchvision's ImageFolder does. */
        if (m == 0)
            return ct_errf(err, CT_ERR_DATA, "%s: class directory holds no .png files (every "
                           "directory under %s is a class); remove it or add images", dir, im->root);
        for (int64_t j = 0; j < m; j++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                im->files = ct_xrealloc(im->files, (size_t)cap * sizeof *im->files);
                im->labels = ct_xrealloc(im->labels, (size_t)cap * sizeof *im->labels);
            }
            size_t len = strlen(dir) + strlen(names[j]) + 2;
            im->files[n] = ct_xmalloc(len);
            snprintf(im->files[n], len, "%s/%s", dir, names[j]);
            im->labels[n++] = (int32_t)k;
            im->n_alloc = n;
        }
        free_names(names, m);
    }
    if (limit > 0 && limit < n) { /* spread over the classes, not the first classes only */
        char **files = ct_xmalloc((size_t)limit * sizeof *files);
        int32_t *labels = ct_xmalloc((size_t)limit * sizeof *labels);
        for (int64_t i = 0, next = 0; i < n; i++) {
            if (next < limit && i == next * n / limit) {
                files[next] = im->files[i];
                labels[next++] = im->labels[i];
            } else {
                free(im->files[i]);
            }
        }
        free(im->files);
        free(im->labels);
        im->files = files;
        im->labels = labels;
        im->n_alloc = n = limit;
    }
    *count = n;
    return CT_OK;
}

/* Bilinear resample (half-pixel centres, edges clamped) of channel ch to [h, w] floats in 0..255. */
static void resize_bilinear(const ct_image8 *src, int ch, int h, int w, float *out) {
    float sy = (float)src->h / (float)h, sx = (float)src->w / (float)w;
    for (int y = 0; y < h; y++) {
        float fy = ((float)y + 0.5f) * sy - 0.5f;
        if (fy < 0) fy = 0;
        int y0 = (int)fy, y1 = y0 + 1 < src->h ? y0 + 1 : src->h - 1;
        float wy = fy - (float)y0;
        for (int x = 0; x < w; x++) {
            float fx = ((float)x + 0.5f) * sx - 0.5f;
            if (fx < 0) fx = 0;
            int x0 = (int)fx, x1 = x0 + 1 < src->w ? x0 + 1 : src->w - 1;
            float wx = fx - (float)x0;
            const uint8_t *r0 = src->px + (size_t)y0 * src->w * src->c;
            const uint8_t *r1 = src->px + (size_t)y1 * src->w * src->c;
            float top = r0[x0 * src->c + ch] * (1 - wx) + r0[x1 * src->c + ch] * wx;
            float bot = r1[x0 * src->c + ch] * (1 - wx) + r1[x1 * src->c + ch] * wx;
            out[(size_t)y * w + x] = top * (1 - wy) + bot * wy;
        }
    }
}

static const char *folder_file_at(const ct_dataset *ds, int64_t k) {
    const folder_impl *im = ds->impl;
    return k < ds->count ? im->files[k] : NULL;
}

/* Labels by another dataset's class list (dataset.h, use_classes). */
static void folder_use_classes(ct_dataset *ds, const int32_t *map, int64_t classes,
                               const char *const *names) {
    folder_impl *im = ds->impl;
    for (int64_t i = 0; i < ds->count; i++) im->labels[i] = map[im->labels[i]];
    free_names(im->classes, im->n_classes);
    im->classes = ct_xmalloc((size_t)classes * sizeof *im->classes);
    for (int64_t k = 0; k < classes; k++) im->classes[k] = ct_xstrdup(names[k]);
    im->n_classes = ds->classes = classes;
    ds->class_names = (const char *const *)im->classes;
}

/* Interleaved 8-bit image -> [c, h, w] normalised floats, resizing as configured. */
static void to_planes(const folder_impl *im, const ct_image8 *img, float *x) {
    size_t plane = (size_t)im->h * im->w;
    for (int ch = 0; ch < im->c; ch++) {
        const float *lut = im->lut + 256 * ch;
        float *dst = x + ch * plane;
        if (im->resize == RESIZE_BILINEAR && (img->h != im->h || img->w != im->w)) {
            resize_bilinear(img, ch, im->h, im->w, dst);
            float scale = lut[255] - lut[0], base = lut[0];
            for (size_t j = 0; j < plane; j++) dst[j] = base + dst[j] * (scale / 255.0f);
            continue;
        }
        if (img->h == im->h && img->w == im->w) {
            const uint8_t *src = img->px + ch;
            for (size_t j = 0; j < plane; j++) dst[j] = lut[src[j * (size_t)img->c]];
            continue;
        }
        int oy = (img->h - im->h) / 2, ox = (img->w - im->w) / 2;
        for (int y = 0; y < im->h; y++) {
            int sy = y + oy;
            for (int xx = 0; xx < im->w; xx++) {
                int sx = xx + ox;
                bool in = sy >= 0 && sy < img->h && sx >= 0 && sx < img->w;
                dst[(size_t)y * im->w + xx] =
                    lut[in ? img->px[((size_t)sy * img->w + sx) * img->c + ch] : 0];
            }
        }
    }
}

/* Interleaved 8-bit image -> [c, h, w] uint8 (data.transform.on_device). The same geometry as
 * to_planes; bilinear results are rounded to the nearest 8-bit value (the float path keeps them
 * unrounded, so only that mode differs slightly from the host-normalised input). */
static void to_planes_u8(const folder_impl *im, const ct_image8 *img, uint8_t *x) {
    size_t plane = (size_t)im->h * im->w;
    bool resample = im->resize == RESIZE_BILINEAR && (img->h != im->h || img->w != im->w);
    float *tmp = resample ? ct_xmalloc(plane * sizeof *tmp) : NULL;
    int oy = (img->h - im->h) / 2, ox = (img->w - im->w) / 2;
    for (int ch = 0; ch < im->c; ch++) {
        uint8_t *dst = x + ch * plane;
        if (resample) {
            resize_bilinear(img, ch, im->h, im->w, tmp);
            for (size_t j = 0; j < plane; j++) {
                long v = lrintf(tmp[j]);
                dst[j] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
            continue;
        }
        for (int y = 0; y < im->h; y++)
            for (int xx = 0; xx < im->w; xx++) {
                int sy = y + oy, sx = xx + ox; /* offsets are 0 when the sizes match */
                bool in = sy >= 0 && sy < img->h && sx >= 0 && sx < img->w;
                dst[(size_t)y * im->w + xx] = in ? img->px[((size_t)sy * img->w + sx) * img->c + ch] : 0;
            }
    }
    free(tmp);
}

/* Read, decode and check the size of image i; the caller frees *img. */
static int load_image(const ct_dataset *ds, int64_t i, ct_image8 *img, ct_err *err) {
    const folder_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld out of range (%lld images)", im->root,
                       (long long)i, (long long)ds->count);
    const char *path = im->files[i];
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    int rc = ct_read_file(path, &buf, &cap, &len, err);
    if (!rc) rc = ct_png_decode(buf, len, path, im->c, (size_t)1 << 30, img, err);
    if (!rc && im->resize == RESIZE_NONE && (img->h != im->h || img->w != im->w))
        rc = ct_errf(err, CT_ERR_DATA, "%s: image is %dx%d (HxW), expected %dx%d; set \"resize\": "
                     "\"bilinear\" or \"crop\" in the dataset entry to convert it", path, img->h, img->w,
                     im->h, im->w);
    free(buf);
    return rc;
}

/* Image i as normalised floats, or (raw) as its uint8 pixels for data.transform.on_device. */
static int decode_as(const ct_dataset *ds, int64_t i, void *input, void *target, bool raw, ct_err *err) {
    const folder_impl *im = ds->impl;
    ct_image8 img = {0};
    int rc = load_image(ds, i, &img, err);
    if (!rc && raw) to_planes_u8(im, &img, input);
    else if (!rc) to_planes(im, &img, input);
    if (!rc && target) *(int32_t *)target = im->labels[i];
    ct_image8_free(&img);
    return rc;
}

static int folder_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target,
                            ct_err *err) {
    return decode_as(ds, i, input, target, true, err);
}

static int folder_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    return decode_as(ds, i, input, target, false, err);
}

static int entry_int(const ct_config *cfg, const cJSON *v, const char *path, const char *key, int lo,
                     int hi, int *out, ct_err *err) {
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: expected an integer in %d..%d", where, path, key,
                       lo, hi);
    *out = (int)v->valuedouble;
    return CT_OK;
}

/* Fields other than root (read by the opener). */
static int parse_fields(const ct_config *cfg, const cJSON *entry, const char *path, folder_impl *im,
                        int64_t *limit, ct_err *err) {
    static const char *const known[] = {"format", "root", "size", "channels", "resize", "limit"};
    char where[1200];
    const cJSON *it;
    int rc = CT_OK;
    cJSON_ArrayForEach(it, entry) {
        ct_config_where(cfg, it, where, sizeof where);
        const char *k = it->string;
        if (strcmp(k, "size") == 0) {
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
                return ct_errf(err, CT_ERR_CONFIG, "%s: %s.size: expected [H, W]", where, path);
            rc = entry_int(cfg, cJSON_GetArrayItem(it, 0), path, "size[0]", 1, 65535, &im->h, err);
            if (!rc) rc = entry_int(cfg, cJSON_GetArrayItem(it, 1), path, "size[1]", 1, 65535, &im->w, err);
        } else if (strcmp(k, "channels") == 0) {
            rc = entry_int(cfg, it, path, "channels", 1, 4, &im->c, err);
        } else if (strcmp(k, "limit") == 0) {
            int l = 0;
            rc = entry_int(cfg, it, path, "limit", 1, 2000000000, &l, err);
            *limit = l;
        } else if (strcmp(k, "resize") == 0) {
            const char *s = cJSON_IsString(it) ? it->valuestring : "";
            if (strcmp(s, "none") == 0) im->resize = RESIZE_NONE;
            else if (strcmp(s, "bilinear") == 0) im->resize = RESIZE_BILINEAR;
            else if (strcmp(s, "crop") == 0) im->resize = RESIZE_CROP;
            else
                return ct_errf(err, CT_ERR_CONFIG, "%s: %s.resize: expected \"none\", \"bilinear\" or "
                               "\"crop\"", where, path);
        } else {
            bool ok = false;
            for (int i = 0; i < CT_ARRAY_LEN(known); i++) ok |= strcmp(k, known[i]) == 0;
            if (!ok) {
                ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: unknown key for format image_folder (expected "
                        "root, size, channels, resize, limit)", where, path, k);
                const char *s = ct_suggest(k, known, CT_ARRAY_LEN(known));
                if (s) ct_err_append(err, "did you mean \"%s\"?", s);
                return CT_ERR_CONFIG;
            }
        }
        if (rc) return rc;
    }
    return CT_OK;
}

/* Size and channels not given: take them from the first image. */
static int probe_first(folder_impl *im, ct_err *err) {
    if (im->h && im->c) return CT_OK;
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    int h, w, c;
    int rc = ct_read_file(im->files[0], &buf, &cap, &len, err);
    if (!rc) rc = ct_png_info(buf, len, im->files[0], &h, &w, &c, err);
    free(buf);
    if (rc) return rc;
    if (!im->h) {
        im->h = h;
        im->w = w;
    }
    if (!im->c) im->c = c;
    return CT_OK;
}

int ct_image_folder_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                         ct_err *err) {
    *out = NULL;
    const cJSON *root = cJSON_GetObjectItemCaseSensitive(entry, "root");
    char where[1200];
    ct_config_where(cfg, root ? root : entry, where, sizeof where);
    if (!cJSON_IsString(root) || !root->valuestring[0])
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.root: %s (expected the directory holding one "
                       "sub-directory per class)", where, path, root ? "expected a string" : "missing");
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    folder_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "image_folder";
    ds->decode = folder_decode;
    ds->decode_u8 = folder_decode_u8;
    ds->use_classes = folder_use_classes;
    ds->file = folder_file_at;
    ds->close = folder_close;
    ct_config_resolve_path(cfg, root->valuestring, im->root, sizeof im->root);
    snprintf(ds->source, sizeof ds->source, "%s", im->root);
    int64_t limit = 0;
    int rc = parse_fields(cfg, entry, path, im, &limit, err);
    if (!rc) rc = scan(im, limit, &ds->count, err);
    if (!rc) rc = probe_first(im, err);
    if (!rc) {
        ds->sample_shape = (ct_shape){.ndim = 3, .d = {im->c, im->h, im->w}};
        ds->sample_dtype = CT_F32;
        ds->target_dtype = CT_I32;
        ds->classes = im->n_classes;
        ds->class_names = (const char *const *)im->classes;
        snprintf(ds->label_note, sizeof ds->label_note, "%s: %lld class directories, \"%s\" to \"%s\"",
                 im->root, (long long)im->n_classes, im->classes[0], im->classes[im->n_classes - 1]);
        float mean[4], std[4];
        rc = ct_data_normalize_parse(cfg, im->c, mean, std, err);
        if (!rc) im->lut = ct_data_u8_lut(im->c, mean, std);
    }
    if (rc) {
        folder_close(ds);
        return rc;
    }
    *out = ds;
    return CT_OK;
}

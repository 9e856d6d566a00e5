/* dataset.c: open data.<which> by its "format" (the openers are in formats.h). The transform
 * parsing the openers share is in transform.c, below them. */
#include "core/data/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/data/formats.h"

static void list_names(const char *const *names, int64_t count, char *out, size_t n);

/* Every format, from its row in formats.def: name, entry keys, opener (docs/formats.md). */
static const ct_data_format formats[] = {
#define CT_FORMAT(name, ...) {#name, {__VA_ARGS__}, ct_##name##_open},
#include "core/data/formats.def"
#undef CT_FORMAT
};

const ct_data_format *ct_dataset_formats(int *n) {
    *n = CT_ARRAY_LEN(formats);
    return formats;
}

int ct_dataset_open(const ct_config *cfg, const char *which, ct_dataset **out, ct_err *err) {
    *out = NULL;
    char path[64], where[1200];
    snprintf(path, sizeof path, "data.%s", which);
    const cJSON *entry = cfg->data ? cJSON_GetObjectItemCaseSensitive(cfg->data, which) : NULL;
    if (!entry) return CT_OK;
    ct_config_where(cfg, entry, where, sizeof where);
    if (!cJSON_IsObject(entry))
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s: expected an object with \"format\" and its files",
                       where, path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(entry, "format");
    const char *names[CT_ARRAY_LEN(formats)];
    for (int i = 0; i < CT_ARRAY_LEN(formats); i++) names[i] = formats[i].name;
    char expected[256];
    list_names(names, CT_ARRAY_LEN(names), expected, sizeof expected);
    if (!fmt)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.format: missing (expected one of %s)", where, path, expected);
    ct_config_where(cfg, fmt, where, sizeof where);
    if (!cJSON_IsString(fmt))
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.format: expected a string such as \"idx\"", where, path);
    for (int i = 0; i < CT_ARRAY_LEN(formats); i++)
        if (strcmp(fmt->valuestring, formats[i].name) == 0) return formats[i].open(cfg, entry, path, out, err);
    const char *s = ct_suggest(fmt->valuestring, names, CT_ARRAY_LEN(formats));
    ct_errf(err, CT_ERR_CONFIG, "%s: %s.format: expected one of %s, got \"%s\"", where, path, expected,
            fmt->valuestring);
    if (s) ct_err_append(err, "did you mean \"%s\"?", s);
    return CT_ERR_CONFIG;
}

void ct_dataset_close(ct_dataset *ds) {
    if (ds && ds->close) ds->close(ds);
}

/* "a, b, c" (the first names, then "..." when they do not fit n bytes). */
static void list_names(const char *const *names, int64_t count, char *out, size_t n) {
    size_t used = 0;
    out[0] = '\0';
    for (int64_t k = 0; k < count; k++) {
        const char *sep = k ? ", " : "";
        size_t need = strlen(sep) + strlen(names[k]);
        if (used + need + 5 >= n) { /* room for ", ..." */
            snprintf(out + used, n - used, "%s...", sep);
            return;
        }
        used += (size_t)snprintf(out + used, n - used, "%s%s", sep, names[k]);
    }
}

int ct_dataset_match_classes(ct_dataset *ds, const char *which, const ct_dataset *ref,
                             const char *ref_which, ct_err *err) {
    if (!ds->class_names || !ref->class_names) return CT_OK; /* labels are indices: take them as they are */
    int32_t *map = ct_xmalloc((size_t)(ds->classes ? ds->classes : 1) * sizeof *map);
    int rc = CT_OK;
    for (int64_t k = 0; k < ds->classes && !rc; k++) {
        map[k] = -1;
        for (int64_t j = 0; j < ref->classes && map[k] < 0; j++)
            if (strcmp(ds->class_names[k], ref->class_names[j]) == 0) map[k] = (int32_t)j;
        if (map[k] >= 0) continue;
        char known[400];
        list_names(ref->class_names, ref->classes, known, sizeof known);
        rc = ct_errf(err, CT_ERR_DATA, "data.%s (%s): class \"%s\" is not one of the %lld classes of "
                     "data.%s (%s: %s)", which, ds->source, ds->class_names[k], (long long)ref->classes,
                     ref_which, ref->source, known);
        ct_err_append(err, "classes are matched by name so that labels mean the same in both sets; "
                      "remove or rename that class in data.%s, or add it to data.%s", which, ref_which);
    }
    if (!rc) ds->use_classes(ds, map, ref->classes, ref->class_names);
    free(map);
    return rc;
}

/* ---- fingerprint ---- */

enum { FP_HEAD = 4096, FP_HEADS = 64 };

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(v >> (8 * i));
    return fnv1a(h, le, 8);
}

static const char *fp_file(const ct_dataset *ds, int64_t k) {
    return ds->file ? ds->file(ds, k) : k == 0 ? ds->source : NULL;
}

/* The name a file is known by in the hash: relative to the source, so a dataset moved or mounted
 * elsewhere keeps its fingerprint. */
static const char *fp_name(const ct_dataset *ds, const char *path) {
    size_t n = strlen(ds->source);
    if (strncmp(path, ds->source, n) == 0 && (path[n] == '/' || path[n] == '\0'))
        return path + n + (path[n] == '/');
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The first FP_HEAD bytes of path (fewer when it is shorter) into the content hash. */
static int fp_head(const char *path, uint64_t *h, ct_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", path, strerror(errno));
    uint8_t buf[FP_HEAD];
    size_t got = 0;
    ssize_t r = 1;
    while (got < sizeof buf && r != 0) {
        r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        got += (size_t)r;
    }
    int e = errno;
    close(fd);
    if (r < 0) return ct_errf(err, ct_err_io(e, CT_ERR_DATA), "%s: cannot read: %s", path, strerror(e));
    *h = fnv1a(*h, buf, got);
    return CT_OK;
}

const char *ct_dataset_reads_file(const ct_dataset *ds, const char *path) {
    struct stat out, in;
    if (stat(path, &out) != 0) return NULL;
    for (int64_t k = 0; fp_file(ds, k); k++) {
        const char *file = fp_file(ds, k);
        if (stat(file, &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino) return file;
    }
    return NULL;
}

int ct_dataset_fingerprint(const ct_dataset *ds, char *out, ct_err *err) {
    int64_t n = 0;
    while (fp_file(ds, n)) n++;
    uint64_t content = 0xcbf29ce484222325ULL, mtime = content, bytes = 0;
    int64_t next_head = 0; /* the files whose heads are hashed: j * n / FP_HEADS, j = 0, 1, ... */
    for (int64_t k = 0, j = 0; k < n; k++) {
        const char *path = fp_file(ds, k);
        struct stat st;
        if (stat(path, &st) != 0)
            return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot stat: %s", path, strerror(errno));
        const char *name = fp_name(ds, path);
        content = fnv1a(content, name, strlen(name) + 1);
        content = fnv_u64(content, (uint64_t)st.st_size);
        mtime = fnv_u64(mtime, (uint64_t)st.st_mtim.tv_sec);
        mtime = fnv_u64(mtime, (uint64_t)st.st_mtim.tv_nsec);
        bytes += (uint64_t)st.st_size;
        if (k == next_head && S_ISREG(st.st_mode)) {
            int rc = fp_head(path, &content, err);
            if (rc) return rc;
        }
        if (k == next_head) next_head = n <= FP_HEADS ? k + 1 : ++j * n / FP_HEADS;
    }
    snprintf(out, CT_DATASET_FINGERPRINT, "v1 files=%lld bytes=%llu content=%016llx mtime=%016llx",
             (long long)n, (unsigned long long)bytes, (unsigned long long)content,
             (unsigned long long)mtime);
    return CT_OK;
}

/* dataset.c: open data.<which> by its "format" (the openers are in formats.h). The transform
 * parsing the openers share is in transform.c, below them. */
#include "core/data/dataset.h"

#include <stdlib.h>
#include <string.h>

#include "core/data/formats.h"

/* Every format by its "format" name (docs/formats.md); a new one is one line here, its opener in
 * formats.h, and its entry keys in core/config/ctrain_sections.c (docs/ADDING.md). */
static const struct {
    const char *name;
    int (*open)(const ct_config *, const cJSON *, const char *, ct_dataset **, ct_err *);
} formats[] = {
    {"idx", ct_idx_open},
    {"image_folder", ct_image_folder_open},
    {"shard", ct_shard_open},
    {"tokens", ct_tokens_open},
    {"csv", ct_csv_open},
};

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
    if (!fmt)
        return ct_errf(err, CT_ERR_CONFIG,
                       "%s: %s.format: missing (expected one of idx, image_folder, shard, tokens, csv)",
                       where, path);
    ct_config_where(cfg, fmt, where, sizeof where);
    if (!cJSON_IsString(fmt))
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.format: expected a string such as \"idx\"", where, path);
    const char *names[CT_ARRAY_LEN(formats)];
    for (int i = 0; i < CT_ARRAY_LEN(formats); i++) {
        names[i] = formats[i].name;
        if (strcmp(fmt->valuestring, formats[i].name) != 0) continue;
        if (!formats[i].open)
            return ct_errf(err, CT_ERR_CONFIG,
                           "%s: %s.format: format \"%s\" is not implemented yet (available now: idx)",
                           where, path, fmt->valuestring);
        return formats[i].open(cfg, entry, path, out, err);
    }
    const char *s = ct_suggest(fmt->valuestring, names, CT_ARRAY_LEN(formats));
    ct_errf(err, CT_ERR_CONFIG,
            "%s: %s.format: expected one of idx, image_folder, shard, tokens, csv, got \"%s\"", where,
            path, fmt->valuestring);
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

/* transform.c: data.transform.normalize, and the check that data.transform holds only the
 * transforms ctrain knows (the augmentations themselves are parsed by the loader). */
#include "core/data/transform.h"

#include <math.h>
#include <string.h>

/* Read a number array of 1 or `channels` entries into out. */
static int read_channels(const ct_config *cfg, const cJSON *arr, const char *key, int64_t channels,
                         bool positive, float *out, ct_err *err) {
    char where[1200];
    ct_config_where(cfg, arr, where, sizeof where);
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (cJSON_IsNumber(arr)) n = 1;
    if (n != 1 && n != channels)
        return ct_errf(err, CT_ERR_CONFIG,
                       "%s: data.transform.normalize.%s: expected a number or an array of 1 or %lld "
                       "numbers (one per channel)", where, key, (long long)channels);
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_IsNumber(arr) ? arr : cJSON_GetArrayItem(arr, i);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || (positive && v->valuedouble <= 0))
            return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.normalize.%s[%d]: expected a %s number",
                           where, key, i, positive ? "positive" : "finite");
        out[i] = (float)v->valuedouble;
    }
    for (int64_t c = n; c < channels; c++) out[c] = out[0];
    return CT_OK;
}

int ct_data_normalize_parse(const ct_config *cfg, int64_t channels, float *mean, float *std,
                            ct_err *err) {
    for (int64_t c = 0; c < channels; c++) {
        mean[c] = 0.0f;
        std[c] = 1.0f;
    }
    const cJSON *tr = cfg->data ? cJSON_GetObjectItemCaseSensitive(cfg->data, "transform") : NULL;
    if (!tr) return CT_OK;
    char where[1200];
    ct_config_where(cfg, tr, where, sizeof where);
    if (!cJSON_IsObject(tr))
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform: expected an object", where);
    /* The augmentations are parsed by the loader (loader.c); anything else is an error here. */
    static const char *const known[] = {"normalize", "random_crop", "hflip", "on_device"};
    const cJSON *item;
    cJSON_ArrayForEach(item, tr) {
        bool ok = false;
        for (int i = 0; i < CT_ARRAY_LEN(known); i++) ok |= strcmp(item->string, known[i]) == 0;
        if (!ok) {
            ct_config_where(cfg, item, where, sizeof where);
            const char *sug = ct_suggest(item->string, known, CT_ARRAY_LEN(known));
            ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.%s: unknown transform (expected normalize, "
                    "random_crop, hflip, on_device)", where, item->string);
            if (sug) ct_err_append(err, "did you mean \"%s\"?", sug);
            return CT_ERR_CONFIG;
        }
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tr, "normalize");
    if (!norm) return CT_OK;
    ct_config_where(cfg, norm, where, sizeof where);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(norm, "mean");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(norm, "std");
    if (!cJSON_IsObject(norm) || !m || !s)
        return ct_errf(err, CT_ERR_CONFIG,
                       "%s: data.transform.normalize: expected {\"mean\": [..], \"std\": [..]}", where);
    cJSON_ArrayForEach(item, norm) {
        if (strcmp(item->string, "mean") != 0 && strcmp(item->string, "std") != 0) {
            ct_config_where(cfg, item, where, sizeof where);
            return ct_errf(err, CT_ERR_CONFIG,
                           "%s: data.transform.normalize.%s: unknown key (expected mean, std)", where,
                           item->string);
        }
    }
    int rc = read_channels(cfg, m, "mean", channels, false, mean, err);
    if (rc == CT_OK) rc = read_channels(cfg, s, "std", channels, true, std, err);
    return rc;
}

float *ct_data_u8_lut(int64_t channels, const float *mean, const float *std) {
    float *lut = ct_xmalloc((size_t)channels * 256 * sizeof(float));
    for (int64_t c = 0; c < channels; c++)
        for (int v = 0; v < 256; v++) lut[256 * c + v] = ((float)v / 255.0f - mean[c]) / std[c];
    return lut;
}

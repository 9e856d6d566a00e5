/* loader_opts.c: the loader's options from the config (ct_loader_opts_from_config, loader.h):
 * data's flags and counts, the train-time augmentation and data.transform.on_device, each checked
 * and, when wrong, a config error naming the key where the file set it. */
#include <math.h>
#include <string.h>

#include "core/data/loader.h"
#include "core/data/order.h"
#include "core/data/transform.h"

static bool data_flag(const cJSON *data, const char *key, bool dflt) {
    const cJSON *v = data ? cJSON_GetObjectItemCaseSensitive(data, key) : NULL;
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int data_int(const ct_config *cfg, const cJSON *data, const char *key, int lo, int dflt,
                    int *out, ct_err *err) {
    const cJSON *v = data ? cJSON_GetObjectItemCaseSensitive(data, key) : NULL;
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return CT_OK;
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > 1024)
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.%s: expected an integer in %d..1024", where, key, lo);
    *out = (int)v->valuedouble;
    return CT_OK;
}

/* data.transform.random_crop {"padding": P} (or just P) and data.transform.hflip true. */
static int parse_augment(const ct_config *cfg, const cJSON *tr, ct_augment *a, ct_err *err) {
    memset(a, 0, sizeof *a);
    if (!cJSON_IsObject(tr)) return CT_OK;
    char where[1200];
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(tr, "random_crop");
    if (rc) {
        const cJSON *p = cJSON_IsObject(rc) ? cJSON_GetObjectItemCaseSensitive(rc, "padding") : rc;
        ct_config_where(cfg, p ? p : rc, where, sizeof where);
        if (!cJSON_IsNumber(p) || p->valuedouble != floor(p->valuedouble) || p->valuedouble < 0 ||
            p->valuedouble > 1024)
            return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.random_crop: expected {\"padding\": "
                           "P} with P an integer in 0..1024", where);
        a->crop_pad = (int)p->valuedouble;
    }
    const cJSON *hf = cJSON_GetObjectItemCaseSensitive(tr, "hflip");
    if (hf) {
        ct_config_where(cfg, hf, where, sizeof where);
        if (!cJSON_IsBool(hf))
            return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.hflip: expected true or false", where);
        a->hflip = cJSON_IsTrue(hf);
    }
    return CT_OK;
}

/* data.transform.on_device true: the dataset must hold 8-bit images of <= 4 channels. */
static int parse_on_device(const ct_config *cfg, const cJSON *tr, const ct_dataset *ds,
                           ct_loader_opts *o, ct_err *err) {
    o->device_dtype = CT_F32;
    const cJSON *v = cJSON_IsObject(tr) ? cJSON_GetObjectItemCaseSensitive(tr, "on_device") : NULL;
    if (!v) return CT_OK;
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsBool(v))
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.on_device: expected true or false", where);
    o->on_device = cJSON_IsTrue(v);
    if (!o->on_device) return CT_OK;
    int64_t c = ds->sample_shape.ndim == 3 ? ds->sample_shape.d[0] : 1;
    if (!ds->decode_u8 || c > CT_NORM_MAX_CHANNELS)
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.on_device: needs 8-bit images with at "
                       "most %d channels, but the %s data in %s %s; set it to false", where,
                       CT_NORM_MAX_CHANNELS, ds->format, ds->source,
                       ds->decode_u8 ? "has more channels" : "is not stored as 8-bit pixels");
    return ct_data_normalize_parse(cfg, c, o->mean, o->std, err);
}

int ct_loader_opts_from_config(const ct_config *cfg, const ct_dataset *ds, bool train,
                               int64_t classes, ct_loader_opts *o, ct_err *err) {
    memset(o, 0, sizeof *o);
    const cJSON *data = cfg->data;
    o->batch = cfg->micro_batch;
    o->step_samples = cfg->train_batch_size;
    o->seed = cfg->train.seed;
    o->classes = classes;
    o->shuffle = train && data_flag(data, "shuffle", true);
    o->drop_last = train && data_flag(data, "drop_last", true);
    o->cache = data_flag(data, "cache", false);
    o->skip_corrupt = data_flag(data, "skip_corrupt", false);
    int rc = data_int(cfg, data, "workers", 0, 0, &o->workers, err);
    if (!rc) rc = data_int(cfg, data, "prefetch", 1, 4, &o->prefetch, err);
    if (!rc) rc = ct_order_buffer_parse(cfg, &o->shuffle_buffer, err);
    const cJSON *tr = data ? cJSON_GetObjectItemCaseSensitive(data, "transform") : NULL;
    if (!rc && train) rc = parse_augment(cfg, tr, &o->aug, err);
    if (!rc) rc = parse_on_device(cfg, tr, ds, o, err);
    if (rc) return rc;
    if ((o->aug.crop_pad || o->aug.hflip) && ds->sample_shape.ndim == 3 && ds->sample_dtype == CT_F32 &&
        ds->sample_shape.d[0] <= 4) {
        float mean[4], std[4];
        rc = ct_data_normalize_parse(cfg, ds->sample_shape.d[0], mean, std, err);
        for (int c = 0; c < 4 && !rc && c < ds->sample_shape.d[0]; c++) o->pad_value[c] = -mean[c] / std[c];
    } else if (o->aug.crop_pad || o->aug.hflip) {
        rc = ct_errf(err, CT_ERR_CONFIG, "data.transform: random_crop and hflip need image samples "
                     "[C, H, W] of floats with C <= 4, %s gives %d dimensions", ds->source,
                     ds->sample_shape.ndim);
    }
    return rc;
}

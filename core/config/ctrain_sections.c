/* ctrain_sections.c: ctrain's own sections "model", "data" and "train" (docs/config.md). Unknown
 * keys are errors. Layer fields and dataset details are left to the graph builder and the
 * readers; this file checks the shape of the sections and fills the train defaults. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config/internal.h"

/* ------------------------------------------------------------------------------------------ */
/* ctrain's own sections                                                                       */

int ct_rd_model(ct_rd *r, const cJSON *root) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!ct_rd_given(m)) return CT_OK;
    char shown[128];
    if (!cJSON_IsObject(m))
        return ct_rd_fail(r, m, "model", "expected an object, got %s", ct_rd_show(m, shown, sizeof shown));
    static const char *const keys[] = {"input", "layers", "loss", "init_from", "init_strict"};
    int rc = ct_rd_keys(r, m, "model", keys, CT_ARRAY_LEN(keys), true);
    if (rc) return rc;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(m, "layers");
    if (layers) {
        if (!cJSON_IsArray(layers))
            return ct_rd_fail(r, layers, "model.layers", "expected an array of layer objects, got %s",
                              ct_rd_show(layers, shown, sizeof shown));
        int i = 0;
        for (const cJSON *l = layers->child; l; l = l->next, i++) {
            char path[64];
            snprintf(path, sizeof path, "model.layers[%d]", i);
            if (!cJSON_IsObject(l))
                return ct_rd_fail(r, l, path, "expected a layer object such as {\"type\": \"linear\", \"out\": 10}, "
                                  "got %s", ct_rd_show(l, shown, sizeof shown));
        }
    }
    double x;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "init_from");
    if (ct_rd_given(v) && (rc = ct_rd_value(r, v, "model.init_from", CT_K_STR, 0, 0, false, &x))) return rc;
    v = cJSON_GetObjectItemCaseSensitive(m, "init_strict");
    if (ct_rd_given(v) && (rc = ct_rd_value(r, v, "model.init_strict", CT_K_BOOL, 0, 1, false, &x))) return rc;
    v = cJSON_GetObjectItemCaseSensitive(m, "loss");
    if (ct_rd_given(v) && !cJSON_IsObject(v))
        return ct_rd_fail(r, v, "model.loss", "expected an object such as {\"type\": \"cross_entropy\"}, got %s",
                          ct_rd_show(v, shown, sizeof shown));
    r->cfg->model = m;
    return CT_OK;
}

/* The keys every dataset entry takes; the rest are its format's (ct_data_format.keys). */
static const char *const ds_common[] = {"format", "transform", "limit"};
#define CT_MAX_FORMATS 32

/* A dataset entry against the formats the caller gave (ct_config_opts.formats, core/data's
 * formats[]): a known "format", and no key its format does not take. */
static int read_dataset(ct_rd *r, const cJSON *e, const char *path) {
    char shown[128], fp[96], expected[512];
    if (!cJSON_IsObject(e))
        return ct_rd_fail(r, e, path, "expected an object such as {\"format\": \"idx\", ...}, got %s",
                          ct_rd_show(e, shown, sizeof shown));
    const ct_data_format *formats = r->opts->formats;
    int n_formats = r->opts->n_formats < CT_MAX_FORMATS ? r->opts->n_formats : CT_MAX_FORMATS;
    if (!formats) return CT_OK;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "format");
    snprintf(fp, sizeof fp, "%s.format", path);
    const char *names[CT_MAX_FORMATS];
    size_t used = 0;
    int k = -1;
    for (int i = 0; i < n_formats; i++) {
        names[i] = formats[i].name;
        if (used < sizeof expected)
            used += (size_t)snprintf(expected + used, sizeof expected - used, "%s%s", i ? ", " : "", names[i]);
        if (f && cJSON_IsString(f) && strcmp(f->valuestring, names[i]) == 0) k = i;
    }
    if (k < 0) {
        const char *best = f && cJSON_IsString(f) ? ct_suggest(f->valuestring, names, n_formats) : NULL;
        return ct_rd_fail(r, f ? f : e, fp, "expected one of %s, got %s%s%s%s", expected,
                          ct_rd_show(f, shown, sizeof shown), best ? "; did you mean " : "", best ? best : "",
                          best ? "?" : "");
    }
    const char *known[CT_ARRAY_LEN(ds_common) + CT_ARRAY_LEN(formats[0].keys)];
    int n = 0;
    for (int i = 0; i < CT_ARRAY_LEN(ds_common); i++) known[n++] = ds_common[i];
    for (int i = 0; i < CT_ARRAY_LEN(formats[k].keys) && formats[k].keys[i]; i++) known[n++] = formats[k].keys[i];
    return ct_rd_keys(r, e, path, known, n, true);
}

static const ct_field data_fields[] = {
    CT_C_INT("workers", 0, CT_NOT_IDENTITY), CT_C_INT("prefetch", 1, CT_NOT_IDENTITY), CT_C_BOOL("shuffle"),
    CT_C_INT("shuffle_buffer", 1),           CT_C_BOOL("drop_last"),
    CT_C_BOOL("cache", CT_NOT_IDENTITY),     CT_C_BOOL("skip_corrupt"), CT_C_ANY("transform"),
};
static const char *const data_custom[] = {"train", "eval"};
static const ct_section data_sec = {"data", data_fields, CT_ARRAY_LEN(data_fields), data_custom, 2, true, false, false,
                                    false};

int ct_rd_data(ct_rd *r, const cJSON *root) {
    /* where the pixels are normalised (validated by the loader, core/data/transform.c) */
    ct_rd_not_identity(r, "data.transform.on_device");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "data");
    if (!ct_rd_given(d)) return CT_OK;
    char dummy[1];
    int rc = ct_rd_section(r, d, "data", &data_sec, dummy);
    if (rc) return rc;
    const char *which[] = {"train", "eval"};
    for (int i = 0; i < 2; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(d, which[i]);
        char path[32];
        snprintf(path, sizeof path, "data.%s", which[i]);
        if (ct_rd_given(e) && (rc = read_dataset(r, e, path))) return rc;
    }
    r->cfg->data = d;
    return CT_OK;
}

static const ct_field train_fields[] = {
    CT_F_INT(ct_train_cfg, epochs, 5, 0, 2147483647, CT_NOT_IDENTITY),
    CT_F_LONG(ct_train_cfg, max_steps, 0, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_F_LONG(ct_train_cfg, eval_interval, 0, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_F_LONG(ct_train_cfg, sample_every, 0, 0, CT_BIG),
    CT_ROW("seed", NULL, CT_K_INT, CT_S_U64, offsetof(ct_train_cfg, seed), 0, 42, 0, CT_BIG, NULL),
    CT_F_STR(ct_train_cfg, device, "auto", CT_NOT_IDENTITY),
    CT_F_STR(ct_train_cfg, run_dir, "", CT_NOT_IDENTITY),
    CT_F_STR(ct_train_cfg, save_dir, "", CT_NOT_IDENTITY),
    CT_F_LONG(ct_train_cfg, save_interval, 0, 0, CT_BIG, CT_NOT_IDENTITY),
    CT_F_INT(ct_train_cfg, keep_last, 3, 0, 1000000, CT_NOT_IDENTITY),
    CT_F_STR(ct_train_cfg, best_metric, "eval_loss", CT_NOT_IDENTITY),
    CT_F_INT(ct_train_cfg, threads, 0, 0, 4096, CT_NOT_IDENTITY),
    CT_F_NUM(ct_train_cfg, memory_limit_gb, 0.0, 0, 1e9, CT_NOT_IDENTITY),
    CT_F_NUM(ct_train_cfg, host_memory_limit_gb, 0.0, 0, 1e9, CT_NOT_IDENTITY),
};
static const char *const train_custom[] = {"early_stopping", "cuda_graph"};
static const ct_section train_sec = {"train", train_fields, CT_ARRAY_LEN(train_fields), train_custom,
                                     CT_ARRAY_LEN(train_custom), true, false,
                                     false, false};

typedef struct es_raw {
    char metric[32], mode[8];
    int patience;
    double min_delta;
} es_raw;
static const ct_field es_fields[] = {
    CT_F_STR(es_raw, metric, "eval_loss"),
    CT_F_STR(es_raw, mode, ""),
    CT_F_INT(es_raw, patience, 3, 0, 1000000000),
    CT_F_NUM(es_raw, min_delta, 0.0, 0, CT_INF),
};
static const ct_section es_sec = {"train.early_stopping", es_fields, CT_ARRAY_LEN(es_fields), NULL, 0, true, false,
                                  false, true};
static const char *const metrics[] = {"eval_loss", "eval_accuracy", "train_loss"};

static int check_metric(ct_rd *r, const cJSON *sec, const char *key, const char *path, const char *val) {
    for (int i = 0; i < CT_ARRAY_LEN(metrics); i++)
        if (strcmp(val, metrics[i]) == 0) return CT_OK;
    const char *best = ct_suggest(val, metrics, CT_ARRAY_LEN(metrics));
    return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(sec, key), path,
                      "expected eval_loss, eval_accuracy or train_loss, got \"%s\"%s%s%s", val,
                      best ? "; did you mean " : "", best ? best : "", best ? "?" : "");
}

static bool valid_device(const char *d) {
    if (!strcmp(d, "auto") || !strcmp(d, "cpu") || !strcmp(d, "cuda")) return true;
    if (strncmp(d, "cuda:", 5) || !d[5]) return false;
    for (const char *p = d + 5; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return strlen(d + 5) < 4;
}

/* train.cuda_graph: true, false or "auto". */
static int read_cuda_graph(ct_rd *r, const cJSON *sec, int *out) {
    ct_rd_not_identity(r, "train.cuda_graph");   /* how fast, not what is trained */
    const cJSON *v = ct_rd_given(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "cuda_graph") : NULL;
    *out = CT_CUDA_GRAPH_AUTO;
    if (!ct_rd_given(v) || (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0)) return CT_OK;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? CT_CUDA_GRAPH_ON : CT_CUDA_GRAPH_OFF;
        return CT_OK;
    }
    return ct_rd_fail(r, v, "train.cuda_graph", "expected true, false or \"auto\"");
}

int ct_rd_train(ct_rd *r, const cJSON *root) {
    ct_train_cfg *t = &r->cfg->train;
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "train");
    int rc = ct_rd_section(r, sec, "train", &train_sec, t);
    if (!rc) rc = read_cuda_graph(r, sec, &t->cuda_graph);
    if (rc) return rc;
    if (!valid_device(t->device))
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(sec, "device"), "train.device",
                          "expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"", t->device);
    if (t->epochs == 0 && t->max_steps == 0)
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(sec, "epochs"), "train.epochs",
                          "0 with train.max_steps 0 leaves nothing to train; set one of them");
    /* "none": no best/ copy (a second checkpoint's worth of disk and write time; --smoke) */
    rc = strcmp(t->best_metric, "none") ? check_metric(r, sec, "best_metric", "train.best_metric", t->best_metric) : CT_OK;
    if (rc) return rc;
    t->run_dir_default = !t->run_dir[0];
    t->save_dir_default = !t->save_dir[0];
    if (!t->run_dir[0]) snprintf(t->run_dir, sizeof t->run_dir, "runs/%.900s", r->cfg->name);
    if (!t->save_dir[0]) snprintf(t->save_dir, sizeof t->save_dir, "%.1000s/checkpoints", t->run_dir);
    const cJSON *es = ct_rd_given(sec) ? cJSON_GetObjectItemCaseSensitive(sec, "early_stopping") : NULL;
    es_raw e;
    rc = ct_rd_section(r, es, "train.early_stopping", &es_sec, &e);
    if (rc) return rc;
    t->early_stopping.enabled = ct_rd_given(es);
    if (!ct_rd_given(es)) {
        snprintf(t->early_stopping.metric, sizeof t->early_stopping.metric, "%s", e.metric);
        t->early_stopping.patience = e.patience;
        return CT_OK;
    }
    rc = check_metric(r, es, "metric", "train.early_stopping.metric", e.metric);
    if (rc) return rc;
    if (e.mode[0] && strcmp(e.mode, "min") && strcmp(e.mode, "max"))
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(es, "mode"), "train.early_stopping.mode",
                          "expected \"min\" or \"max\", got \"%s\"", e.mode);
    snprintf(t->early_stopping.metric, sizeof t->early_stopping.metric, "%s", e.metric);
    /* Default mode follows the metric: accuracy goes up, losses go down. */
    t->early_stopping.mode_max = e.mode[0] ? strcmp(e.mode, "max") == 0 : strcmp(e.metric, "eval_accuracy") == 0;
    t->early_stopping.patience = e.patience;
    t->early_stopping.min_delta = e.min_delta;
    return CT_OK;
}


cJSON *ct_rd_emit_train(const ct_train_cfg *t) {
    cJSON *out = ct_rd_emit(&train_sec, t, NULL);
    if (t->cuda_graph == CT_CUDA_GRAPH_AUTO) cJSON_AddStringToObject(out, "cuda_graph", "auto");
    else cJSON_AddBoolToObject(out, "cuda_graph", t->cuda_graph == CT_CUDA_GRAPH_ON);
    if (t->early_stopping.enabled) {
        cJSON *es = cJSON_CreateObject();
        cJSON_AddStringToObject(es, "metric", t->early_stopping.metric);
        cJSON_AddStringToObject(es, "mode", t->early_stopping.mode_max ? "max" : "min");
        cJSON_AddNumberToObject(es, "patience", t->early_stopping.patience);
        cJSON_AddNumberToObject(es, "min_delta", t->early_stopping.min_delta);
        cJSON_AddItemToObject(out, "early_stopping", es);
    }
    return out;
}

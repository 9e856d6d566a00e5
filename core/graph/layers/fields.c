/* fields.c: error messages that name the layer, and typed readers for layer config fields. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/graph/layer.h"

const char *ct_model_where(const ct_config *cfg, const cJSON *node, char *buf, size_t n) {
    buf[0] = '\0';
    /* A config filled by hand (tests) has no document: no position to give. */
    if (cfg && node && (cfg->doc || cfg->model_doc)) ct_config_where(cfg, node, buf, n);
    return buf;
}

int ct_layer_errf(const ct_layer *l, ct_err *err, const cJSON *node, const char *fmt, ...) {
    char where[512], text[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ct_model_where(l->cfg, node ? node : l->node, where, sizeof where);
    return ct_errf(err, CT_ERR_CONFIG, "%s%s%s \"%s\" (%s): %s", where, where[0] ? ": " : "",
                   l->path, l->name, l->type ? l->type->name : "?", text);
}

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* An integral JSON number that fits int64 comfortably. */
static bool json_int(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9.0e15) return false;
    *out = (int64_t)d;
    return true;
}

int ct_layer_int(const ct_layer *l, const char *key, bool required, int64_t def, int64_t min,
                 int64_t *out, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, key);
    if (!v) {
        if (required) return ct_layer_errf(l, err, NULL, "missing field \"%s\" (an integer >= %lld)",
                                           key, (long long)min);
        *out = def;
        return CT_OK;
    }
    int64_t x;
    if (!json_int(v, &x)) return ct_layer_errf(l, err, v, "%s: expected an integer, got %s", key,
                                              json_kind(v));
    if (x < min) return ct_layer_errf(l, err, v, "%s: expected an integer >= %lld, got %lld", key,
                                      (long long)min, (long long)x);
    if (x > INT32_MAX) return ct_layer_errf(l, err, v, "%s: %lld is too large (at most %d)", key,
                                            (long long)x, INT32_MAX);
    *out = x;
    return CT_OK;
}

int ct_layer_int2(const ct_layer *l, const char *key, bool required, int64_t def, int64_t min,
                  int64_t out[2], ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, key);
    if (!v || !cJSON_IsArray(v)) {
        int64_t x;
        int rc = ct_layer_int(l, key, required, def, min, &x, err);
        if (rc == CT_OK) out[0] = out[1] = x;
        return rc;
    }
    if (cJSON_GetArraySize(v) != 2)
        return ct_layer_errf(l, err, v, "%s: expected an integer or [h, w], got an array of %d",
                             key, cJSON_GetArraySize(v));
    for (int i = 0; i < 2; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!json_int(e, &out[i]) || out[i] < min || out[i] > INT32_MAX)
            return ct_layer_errf(l, err, e, "%s[%d]: expected an integer >= %lld", key, i,
                                 (long long)min);
    }
    return CT_OK;
}

int ct_layer_num(const ct_layer *l, const char *key, double def, double lo, double hi, bool hi_open,
                 double *out, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, key);
    if (!v) {
        *out = def;
        return CT_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return ct_layer_errf(l, err, v, "%s: expected a number, got %s", key, json_kind(v));
    double x = v->valuedouble;
    if (x < lo || x > hi || (hi_open && x == hi))
        return ct_layer_errf(l, err, v, "%s: expected a number in [%g, %g%c, got %g", key, lo, hi,
                             hi_open ? ')' : ']', x);
    *out = x;
    return CT_OK;
}

int ct_layer_bool(const ct_layer *l, const char *key, bool def, bool *out, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, key);
    if (!v) {
        *out = def;
        return CT_OK;
    }
    if (!cJSON_IsBool(v))
        return ct_layer_errf(l, err, v, "%s: expected true or false, got %s", key, json_kind(v));
    *out = cJSON_IsTrue(v);
    return CT_OK;
}

int ct_layer_choice(const ct_layer *l, const char *key, const char *const *choices, int n,
                    int def_index, int *out, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(l->node, key);
    if (!v) {
        *out = def_index;
        return CT_OK;
    }
    if (cJSON_IsString(v))
        for (int i = 0; i < n; i++)
            if (strcmp(v->valuestring, choices[i]) == 0) {
                *out = i;
                return CT_OK;
            }
    char list[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "", choices[i]);
    const char *near = cJSON_IsString(v) ? ct_suggest(v->valuestring, choices, n) : NULL;
    if (near) return ct_layer_errf(l, err, v, "%s: expected one of %s, got \"%s\"; did you mean \"%s\"?",
                                   key, list, v->valuestring, near);
    return ct_layer_errf(l, err, v, "%s: expected one of %s", key, list);
}

/* Unknown keys are errors inside ctrain's sections, with the closest allowed key suggested. */
int ct_model_check_keys(const ct_config *cfg, const ct_layer *l, const cJSON *obj, const char *path,
                        const char *const *allowed, int n_allowed, ct_err *err) {
    for (const cJSON *k = obj->child; k; k = k->next) {
        bool ok = false;
        for (int i = 0; i < n_allowed && !ok; i++) ok = strcmp(k->string, allowed[i]) == 0;
        if (ok) continue;
        const char *near = ct_suggest(k->string, allowed, n_allowed);
        char hint[160] = "";
        if (near) snprintf(hint, sizeof hint, "; did you mean \"%s\"?", near);
        if (l) return ct_layer_errf(l, err, k, "unknown field \"%s\"%s", k->string, hint);
        char where[512];
        ct_model_where(cfg, k, where, sizeof where);
        return ct_errf(err, CT_ERR_CONFIG, "%s%s%s: unknown key \"%s\"%s", where, where[0] ? ": " : "",
                       path, k->string, hint);
    }
    return CT_OK;
}

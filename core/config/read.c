/* read.c: the table-driven section reader shared by every config section.
 *
 * Type rules: integers must be integral (5e8 is fine, 1500.5 is not), booleans are true/false or
 * 0/1, null means "use the default", "auto" in a non-string key means "use ctrain's default"
 * (callers give "auto" a finer meaning where DeepSpeed's integrations do). Sections that DeepSpeed
 * validates with pydantic additionally take pydantic's "lax" forms: numeric strings ("500") and
 * boolean words ("yes", "off"). */
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/config/internal.h"

/* Positions and paths: public (the graph builder and the dataset readers use them too), and
 * defined here, below the section readers that call them, so that config.c, which calls the
 * readers, stays the facade on top (no file of core/config calls back up into config.c). */

const char *ct_config_where(const ct_config *cfg, const cJSON *node, char *buf, size_t n) {
    struct ct_json_doc *docs[3] = {cfg->doc, cfg->model_doc, cfg->data_doc};
    if (node) {
        for (int i = 0; i < 3; i++) {
            int line, col;
            if (docs[i] && (ct_json_pos(docs[i], node, &line, &col) || ct_json_origin(docs[i], node)))
                return ct_json_where(docs[i], node, buf, n);
        }
    }
    snprintf(buf, n, "%s", cfg->path);
    return buf;
}

void ct_config_resolve_path(const ct_config *cfg, const char *rel, char *out, size_t n) {
    if (rel[0] == '/' || !cfg->dir[0] || strcmp(cfg->dir, ".") == 0)
        snprintf(out, n, "%s", rel);
    else
        snprintf(out, n, "%s/%s", cfg->dir, rel);
}

const char *ct_rd_join(char *buf, size_t n, const char *path, const char *key) {
    if (!path || !*path)
        snprintf(buf, n, "%s", key);
    else
        snprintf(buf, n, "%s.%s", path, key);
    return buf;
}

const char *ct_rd_show(const cJSON *v, char *buf, size_t n) {
    if (!v) {
        snprintf(buf, n, "nothing");
        return buf;
    }
    char *s = cJSON_PrintUnformatted(v);
    if (!s) {
        snprintf(buf, n, "a value");
        return buf;
    }
    size_t len = strlen(s);
    if (len + 1 > n && n > 4) {
        memcpy(buf, s, n - 4);
        strcpy(buf + n - 4, "...");
    } else {
        snprintf(buf, n, "%s", s);
    }
    free(s);
    return buf;
}

bool ct_rd_given(const cJSON *v) { return v && !cJSON_IsNull(v); }

bool ct_rd_is_auto(const cJSON *v) {
    return v && cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0;
}

ct_source ct_rd_source(const ct_rd *r, const cJSON *v) {
    if (!v || cJSON_IsNull(v)) return CT_SRC_DEFAULT;
    if (r->cfg->doc && ct_json_origin(r->cfg->doc, v)) return CT_SRC_OVERRIDE;
    return CT_SRC_FILE;
}

/* "FILE:LINE:COL: PATH: " or, for a value set by an override, "FILE: --set PATH: ". */
static void vformat(ct_rd *r, char *out, size_t n, const cJSON *node, const char *path, const char *fmt,
                    va_list ap) {
    char where[1200];
    const char *origin = node && r->cfg->doc ? ct_json_origin(r->cfg->doc, node) : NULL;
    int k;
    if (origin && strncmp(origin, "--set ", 6) == 0) {
        bool same = path && strcmp(origin + 6, path) == 0;
        k = path && *path && !same ? snprintf(out, n, "%s: %s: %s: ", r->cfg->path, origin, path)
                                   : snprintf(out, n, "%s: %s: ", r->cfg->path, origin);
    } else {
        ct_config_where(r->cfg, node, where, sizeof where);
        k = path && *path ? snprintf(out, n, "%s: %s: ", where, path) : snprintf(out, n, "%s: ", where);
    }
    if (k < 0) k = 0;
    if ((size_t)k < n) vsnprintf(out + k, n - (size_t)k, fmt, ap);
}

int ct_rd_fail(ct_rd *r, const cJSON *node, const char *path, const char *fmt, ...) {
    char msg[CT_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vformat(r, msg, sizeof msg, node, path, fmt, ap);
    va_end(ap);
    return ct_errf(r->err, CT_ERR_CONFIG, "%s", msg);
}

void ct_rd_warn(ct_rd *r, const cJSON *node, const char *path, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vformat(r, msg, sizeof msg, node, path, fmt, ap);
    va_end(ap);
    ct_warnf(r->warn, "%s", msg);
}

void ct_rd_add_unused(ct_rd *r, const char *path) {
    for (int i = 0; i < r->n_unused; i++)
        if (strcmp(r->unused[i], path) == 0) return;
    if (r->n_unused == r->cap_unused) {
        r->cap_unused = r->cap_unused ? 2 * r->cap_unused : 16;
        r->unused = ct_xrealloc(r->unused, (size_t)r->cap_unused * sizeof *r->unused);
    }
    r->unused[r->n_unused++] = ct_xstrdup(path);
}

/* x as the shortest text that reads back as x (%.1g to %.17g): 0.999, not 0.99899999999999999911. */
static void shortest(double x, char *out, size_t n) {
    if (x == floor(x) && fabs(x) < 1e15) {   /* an integer as one: 1000000000, not 1e+09 */
        snprintf(out, n, "%.0f", x);
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(out, n, "%.*g", digits, x);
        if (strtod(out, NULL) == x) return;
    }
}

/* A bound that is the double next to a short number (1 - 2^-52 next to 1, the largest beta): that
 * number, with the interval open on that side, "[0, 1)", not "[0, 0.99999999999999978]". */
static bool open_bound(double x, double toward, char *out, size_t n) {
    char mine[32];
    shortest(x, mine, sizeof mine);
    shortest(nextafter(x, toward), out, n);
    return strlen(out) < 8 && strlen(mine) >= 16;
}

/* "an integer 0..3", "a number >= 0", "a number in [0, 1)", ... */
static const char *describe(ct_kind kind, double lo, double hi, char *buf, size_t n) {
    const char *what = kind == CT_K_INT ? "an integer" : "a number";
    bool has_lo = lo > -1e307, has_hi = hi < (kind == CT_K_INT ? 2147483647.0 : 1e307);
    char a[32], b[32];
    bool open_lo = kind == CT_K_NUM && open_bound(lo, -INFINITY, a, sizeof a);
    bool open_hi = kind == CT_K_NUM && open_bound(hi, INFINITY, b, sizeof b);
    if (!open_lo) shortest(lo, a, sizeof a);
    if (!open_hi) shortest(hi, b, sizeof b);
    if (kind == CT_K_NUM && lo == DBL_MIN)
        snprintf(buf, n, "%s > 0", what);
    else if (has_lo && has_hi && kind == CT_K_INT)
        snprintf(buf, n, "%s %s..%s", what, a, b);
    else if (has_lo && has_hi)
        snprintf(buf, n, "%s in %s%s, %s%s", what, open_lo ? "(" : "[", a, b, open_hi ? ")" : "]");
    else if (has_lo)
        snprintf(buf, n, "%s %s %s", what, open_lo ? ">" : ">=", a);
    else if (has_hi)
        snprintf(buf, n, "%s %s %s", what, open_hi ? "<" : "<=", b);
    else
        snprintf(buf, n, "%s", what);
    return buf;
}

/* A number that JSON or --set wrote but a double cannot hold (1e999): " (out of the range of a
 * double, about ±1.8e308)" to say so, else "". */
static const char *out_of_range(const cJSON *v) {
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (cJSON_IsString(v)) {
        char *end = NULL;
        x = strtod(v->valuestring, &end);
        while (end && isspace((unsigned char)*end)) end++;
        if (!end || end == v->valuestring || *end) return "";
    }
    return isinf(x) ? ": a number out of the range of a double (about ±1.8e308)" : "";
}

int ct_rd_lax_bool(const char *s) {
    static const char *const no[] = {"0", "off", "f", "false", "n", "no"};
    static const char *const yes[] = {"1", "on", "t", "true", "y", "yes"};
    for (int i = 0; i < CT_ARRAY_LEN(no); i++)
        if (strcasecmp(s, no[i]) == 0) return 0;
    for (int i = 0; i < CT_ARRAY_LEN(yes); i++)
        if (strcasecmp(s, yes[i]) == 0) return 1;
    return -1;
}

/* A numeric string as pydantic's lax mode reads it: integers only for int fields. */
static bool lax_number(const char *s, ct_kind kind, double *out) {
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return false;
    char *end = NULL;
    double x;
    if (kind == CT_K_INT) {
        long long v = strtoll(s, &end, 10);
        x = (double)v;
    } else {
        x = strtod(s, &end);
    }
    while (end && isspace((unsigned char)*end)) end++;
    if (!end || *end || !isfinite(x)) return false;
    *out = x;
    return true;
}

int ct_rd_value(ct_rd *r, const cJSON *v, const char *path, ct_kind kind, double lo, double hi, bool lax,
                double *out) {
    char shown[128], desc[96];
    *out = 0;
    switch (kind) {
    case CT_K_ANY:
        return CT_OK;
    case CT_K_STR:
        if (cJSON_IsString(v)) return CT_OK;
        return ct_rd_fail(r, v, path, "expected a string, got %s", ct_rd_show(v, shown, sizeof shown));
    case CT_K_BOOL:
        if (cJSON_IsBool(v)) {
            *out = cJSON_IsTrue(v) ? 1 : 0;
            return CT_OK;
        }
        if (cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)) {
            *out = v->valuedouble;
            return CT_OK;
        }
        if (lax && cJSON_IsString(v) && ct_rd_lax_bool(v->valuestring) >= 0) {
            *out = ct_rd_lax_bool(v->valuestring);
            return CT_OK;
        }
        return ct_rd_fail(r, v, path, "expected true or false, got %s", ct_rd_show(v, shown, sizeof shown));
    case CT_K_INT:
    case CT_K_NUM: {
        double x = 0;
        bool ok = false;
        if (cJSON_IsNumber(v)) {
            x = v->valuedouble;
            ok = isfinite(x);
        } else if (lax && cJSON_IsString(v)) {
            ok = lax_number(v->valuestring, kind, &x);
        }
        if (ok && kind == CT_K_INT) ok = x == floor(x) && fabs(x) <= CT_BIG;
        if (!ok || x < lo || x > hi) {
            const char *extra = out_of_range(v);
            if (cJSON_IsNumber(v) && kind == CT_K_INT && isfinite(v->valuedouble) &&
                v->valuedouble != floor(v->valuedouble))
                extra = " (a number with a fractional part)";
            return ct_rd_fail(r, v, path, "expected %s, got %s%s", describe(kind, lo, hi, desc, sizeof desc),
                              ct_rd_show(v, shown, sizeof shown), extra);
        }
        *out = x;
        return CT_OK;
    }
    }
    return CT_OK;
}

static const ct_field *find_field(const ct_section *sec, const char *key, const char **other) {
    for (int i = 0; i < sec->n_fields; i++) {
        const ct_field *f = &sec->fields[i];
        if (strcmp(f->key, key) == 0) {
            *other = f->alias;
            return f;
        }
        if (f->alias && strcmp(f->alias, key) == 0) {
            *other = f->key;
            return f;
        }
    }
    return NULL;
}

static bool in_list(const char *key, const char *const *list, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0) return true;
    return false;
}

/* The key of the override that set `node` ("optimizer.params.lr"), or NULL when the file did. */
static const char *override_key(const ct_rd *r, const cJSON *node) {
    const char *origin = r->cfg->doc ? ct_json_origin(r->cfg->doc, node) : NULL;
    return origin && strncmp(origin, "--set ", 6) == 0 ? origin + 6 : NULL;
}

/* An override named an unknown key: keep the first for ct_rd_check_overrides. The suggestion of
 * its own section is completed with the rest of the override's path (--set optimzer.params.lr ->
 * optimizer.params.lr). */
static void remember_bad_override(ct_rd *r, const cJSON *m, const char *full, const char *path, const char *best,
                                  const char *key) {
    if (r->bad_override) return;
    r->bad_override = m;
    snprintf(r->bad_path, sizeof r->bad_path, "%s", full);
    r->bad_sug[0] = '\0';
    if (!best) return;
    size_t len = strlen(full);
    const char *rest = strncmp(key, full, len) == 0 && (key[len] == '.' || key[len] == '\0') ? key + len : "";
    char sug[512];
    snprintf(r->bad_sug, sizeof r->bad_sug, "%s%s", ct_rd_join(sug, sizeof sug, path, best), rest);
}

/* Report an unknown key with the closest known one. */
static int unknown_key(ct_rd *r, const cJSON *m, const char *path, const char *const *cands, int n,
                       bool strict) {
    char full[512], sug[512];
    ct_rd_join(full, sizeof full, path, m->string);
    const char *best = ct_suggest(m->string, cands, n);
    if (best) ct_rd_join(sug, sizeof sug, path, best);
    const char *ov = override_key(r, m);
    if (ov && !strict) { /* refused later, with a hint that may come from another section */
        remember_bad_override(r, m, full, path, best, ov);
        return CT_OK;
    }
    if (strict) {
        if (best) return ct_rd_fail(r, m, full, "unknown key; did you mean %s?", sug);
        ct_rd_fail(r, m, full, "unknown key");
        if (n <= 16) {
            char list[1024] = "";
            for (int i = 0; i < n; i++) {
                size_t len = strlen(list);
                snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", cands[i]);
            }
            ct_err_append(r->err, "  %s takes: %s", path && *path ? path : "the top level", list);
        }
        return CT_ERR_CONFIG;
    }
    if (best)
        ct_rd_warn(r, m, full, "unknown key (ignored); did you mean %s?", sug);
    else
        ct_rd_warn(r, m, full, "unknown key (ignored)");
    return CT_OK;
}

/* Candidate names for suggestions: fields, aliases, custom keys (freed by the caller). */
static const char **candidates(const ct_section *sec, int *n) {
    const char **c = ct_xmalloc((size_t)(2 * sec->n_fields + sec->n_custom + 1) * sizeof *c);
    int k = 0;
    for (int i = 0; i < sec->n_fields; i++) {
        c[k++] = sec->fields[i].key;
        if (sec->fields[i].alias) c[k++] = sec->fields[i].alias;
    }
    for (int i = 0; i < sec->n_custom; i++) c[k++] = sec->custom[i];
    *n = k;
    return c;
}

int ct_rd_keys(ct_rd *r, const cJSON *obj, const char *path, const char *const *known, int n, bool strict) {
    if (!obj || !cJSON_IsObject(obj)) return CT_OK;
    for (const cJSON *m = obj->child; m; m = m->next) {
        if (in_list(m->string, known, n)) continue;
        int rc = unknown_key(r, m, path, known, n, strict);
        if (rc) return rc;
    }
    return CT_OK;
}

static void store(const ct_field *f, void *dst, double x, const char *s) {
    char *p = (char *)dst + f->off;
    switch (f->store) {
    case CT_S_NONE:
    case CT_S_CHECK: break;
    case CT_S_BOOL: *(bool *)p = x != 0; break;
    case CT_S_U64: *(uint64_t *)p = (uint64_t)x; break;
    case CT_S_INT: *(int *)p = (int)x; break;
    case CT_S_LONG: *(long *)p = (long)x; break;
    case CT_S_DBL: *(double *)p = x; break;
    case CT_S_STR: snprintf(p, f->cap, "%s", s ? s : ""); break;
    }
}

static int read_field(ct_rd *r, const ct_section *sec, const ct_field *f, const cJSON *v, const char *path,
                      void *dst) {
    if (cJSON_IsNull(v)) return CT_OK;
    if (f->kind != CT_K_STR && ct_rd_is_auto(v)) return CT_OK; /* "auto": the default */
    double x;
    int rc = ct_rd_value(r, v, path, f->kind, f->lo, f->hi, sec->lax, &x);
    if (rc) return rc;
    if (f->kind == CT_K_STR && f->store == CT_S_STR && strlen(v->valuestring) >= f->cap)
        return ct_rd_fail(r, v, path, "too long (at most %zu characters)", f->cap - 1);
    store(f, dst, x, f->kind == CT_K_STR ? v->valuestring : NULL);
    if (f->store == CT_S_NONE && !sec->whole) ct_rd_add_unused(r, path);
    return CT_OK;
}

/* Keep the section's table for suggestions across sections (once per path). */
static void remember_section(ct_rd *r, const char *path, const ct_section *sec) {
    for (int i = 0; i < r->n_seen; i++)
        if (r->seen[i].sec == sec && strcmp(r->seen[i].path, path) == 0) return;
    if (r->n_seen == CT_RD_MAX_SEEN) return;
    snprintf(r->seen[r->n_seen].path, sizeof r->seen[r->n_seen].path, "%s", path);
    r->seen[r->n_seen++].sec = sec;
}

/* Add path to a list of paths once. */
static void add_path(char ***list, int *n, int *cap, const char *path) {
    for (int i = 0; i < *n; i++)
        if (strcmp((*list)[i], path) == 0) return;
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 32;
        *list = ct_xrealloc(*list, (size_t)*cap * sizeof **list);
    }
    (*list)[(*n)++] = ct_xstrdup(path);
}

void ct_rd_not_identity(ct_rd *r, const char *path) {
    add_path(&r->cfg->not_identity, &r->cfg->n_not_identity, &r->cfg->cap_not_identity, path);
}

/* The section's rows into cfg->rows, and its flags: the whole section, or its flagged keys,
 * outside the identity. */
static void section_rows(ct_rd *r, const char *path, const ct_section *sec) {
    char full[512];
    if (sec->not_identity) ct_rd_not_identity(r, path);
    for (int i = 0; i < sec->n_fields; i++) {
        ct_rd_join(full, sizeof full, path, sec->fields[i].key);
        add_path(&r->cfg->rows, &r->cfg->n_rows, &r->cfg->cap_rows, full);
        if (sec->fields[i].not_identity && !sec->not_identity) ct_rd_not_identity(r, full);
    }
}

int ct_rd_section(ct_rd *r, const cJSON *obj, const char *path, const ct_section *sec, void *dst) {
    remember_section(r, path, sec);
    section_rows(r, path, sec);
    for (int i = 0; i < sec->n_fields; i++) store(&sec->fields[i], dst, sec->fields[i].def, sec->fields[i].sdef);
    if (!obj || cJSON_IsNull(obj)) return CT_OK;
    char shown[128], full[512];
    if (!cJSON_IsObject(obj))
        return ct_rd_fail(r, obj, path, "expected an object, got %s", ct_rd_show(obj, shown, sizeof shown));
    int nc;
    const char **cands = candidates(sec, &nc);
    int rc = CT_OK;
    for (const cJSON *m = obj->child; m && !rc; m = m->next) {
        const char *other = NULL;
        const ct_field *f = find_field(sec, m->string, &other);
        ct_rd_join(full, sizeof full, path, m->string);
        if (!f) {
            if (!in_list(m->string, sec->custom, sec->n_custom))
                rc = unknown_key(r, m, path, cands, nc, sec->strict);
            continue;
        }
        const cJSON *twin = other ? cJSON_GetObjectItemCaseSensitive(obj, other) : NULL;
        if (twin) {
            char where[1200];
            rc = ct_rd_fail(r, m, full, "given twice, also as %s.%s (%s); keep one", path, other,
                            ct_config_where(r->cfg, twin, where, sizeof where));
            break;
        }
        rc = read_field(r, sec, f, m, full, dst);
    }
    free(cands);
    return rc;
}

static void emit_field(cJSON *out, const ct_field *f, const void *src) {
    const char *p = (const char *)src + f->off;
    switch (f->store) {
    case CT_S_NONE:
    case CT_S_CHECK: break;
    case CT_S_BOOL: cJSON_AddBoolToObject(out, f->key, *(const bool *)p); break;
    case CT_S_U64: cJSON_AddNumberToObject(out, f->key, (double)*(const uint64_t *)p); break;
    case CT_S_INT: cJSON_AddNumberToObject(out, f->key, *(const int *)p); break;
    case CT_S_LONG: cJSON_AddNumberToObject(out, f->key, (double)*(const long *)p); break;
    case CT_S_DBL: cJSON_AddNumberToObject(out, f->key, *(const double *)p); break;
    case CT_S_STR: cJSON_AddStringToObject(out, f->key, p); break;
    }
}

cJSON *ct_rd_emit(const ct_section *sec, const void *src, const cJSON *in) {
    cJSON *out = cJSON_CreateObject();
    for (int i = 0; i < sec->n_fields; i++) {
        const ct_field *f = &sec->fields[i];
        if (f->store != CT_S_NONE && f->store != CT_S_CHECK) {
            emit_field(out, f, src);
            continue;
        }
        if (!in || !cJSON_IsObject(in)) continue;
        const char *name = f->key;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, name);
        if (!v && f->alias) v = cJSON_GetObjectItemCaseSensitive(in, name = f->alias);
        if (v) cJSON_AddItemToObject(out, name, cJSON_Duplicate(v, 1));
    }
    return out;
}

/* "did you mean" over every section read: the keys named `leaf` (up to three), else the closest
 * one. out is "" when nothing is close. */
static void suggest_anywhere(const ct_rd *r, const char *leaf, char *out, size_t n) {
    enum { MAX_KEYS = 1024 };
    const char *names[MAX_KEYS] = {NULL}, *paths[MAX_KEYS] = {NULL};
    int k = 0;
    for (int s = 0; s < r->n_seen; s++) {
        const ct_section *sec = r->seen[s].sec;
        for (int i = 0; i < sec->n_fields && k + 2 <= MAX_KEYS; i++) {
            paths[k] = r->seen[s].path, names[k++] = sec->fields[i].key;
            if (sec->fields[i].alias) paths[k] = r->seen[s].path, names[k++] = sec->fields[i].alias;
        }
        for (int i = 0; i < sec->n_custom && k < MAX_KEYS; i++) paths[k] = r->seen[s].path, names[k++] = sec->custom[i];
    }
    char one[512];
    size_t used = 0;
    int exact = 0;
    out[0] = '\0';
    for (int i = 0; i < k && exact < 3 && used < n; i++) {
        if (strcmp(names[i], leaf) != 0) continue;
        used += (size_t)snprintf(out + used, n - used, "%s%s", exact ? " or " : "",
                                 ct_rd_join(one, sizeof one, paths[i], names[i]));
        exact++;
    }
    if (exact) return;
    const char *best = ct_suggest(leaf, names, k);
    for (int i = 0; best && i < k; i++)
        if (names[i] == best) {
            snprintf(out, n, "%s", ct_rd_join(one, sizeof one, paths[i], names[i]));
            return;
        }
}

int ct_rd_check_overrides(ct_rd *r) {
    if (!r->bad_override) return CT_OK;
    char sug[1024];
    snprintf(sug, sizeof sug, "%s", r->bad_sug);
    if (!sug[0]) {
        const char *key = override_key(r, r->bad_override);
        const char *dot = strrchr(key, '.');
        suggest_anywhere(r, dot ? dot + 1 : key, sug, sizeof sug);
    }
    if (sug[0]) return ct_rd_fail(r, r->bad_override, r->bad_path, "unknown key; did you mean %s?", sug);
    return ct_rd_fail(r, r->bad_override, r->bad_path, "unknown key; an override must name a key ctrain reads "
                      "(docs/config.md lists them; in the file an unknown key is only a warning)");
}

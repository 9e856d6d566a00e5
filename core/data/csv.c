/* csv.c: tabular data, numeric columns and one label column.
 *
 * Entry fields: {"format": "csv", "path": FILE, "label_column": NAME or 0-based INDEX (default:
 * the last column), "limit": N}. The first line is a header when any of its fields is not a
 * number. Fields are separated by commas; blank lines are skipped; numbers are decimal only.
 * Samples are [features] float (as written: normalise in the file or with a BatchNorm); labels
 * that are all non-negative integers are class indices (int32), otherwise float regression
 * targets [1], and label_note names the line that decided it. Parsed whole at open; a malformed
 * row is CT_ERR_DATA naming FILE:LINE and the column. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/pngdec.h"

typedef struct csv_impl {
    float *x;                    /* [rows, features] */
    float *y;                    /* [rows] labels as read */
    int64_t features;
} csv_impl;

static void csv_close(ct_dataset *ds) {
    csv_impl *im = ds->impl;
    if (im) {
        free(im->x);
        free(im->y);
        free(im);
    }
    free(ds);
}

static int csv_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    const csv_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: row %lld out of range", ds->source, (long long)i);
    memcpy(input, im->x + i * im->features, (size_t)im->features * sizeof(float));
    if (!target) return CT_OK;
    if (ds->target_dtype == CT_I32) *(int32_t *)target = (int32_t)im->y[i];
    else *(float *)target = im->y[i];
    return CT_OK;
}

/* Split line (modified in place) at commas into fields[0..*n). */
static int split(char *line, char **fields, int max) {
    int n = 0;
    for (char *p = line;; p++) {
        if (n == max) return max + 1;
        fields[n++] = p;
        p = strchr(p, ',');
        if (!p) break;
        *p = 0;
    }
    return n;
}

/* A decimal number ("12", "-0.5", "3e-2") with optional blanks around it. strtod alone also
 * reads C's hexadecimal forms ("0x10" as 16, "0x1p3"), which no CSV of numbers means: the
 * number must be exactly the run of decimal characters strtod would start with. */
static bool parse_num(const char *s, float *out) {
    while (*s == ' ' || *s == '\t') s++;
    size_t decimal = strspn(s, "0123456789+-.eE");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || end != s + decimal) return false;
    while (*end == ' ' || *end == '\t' || *end == '\r') end++;
    if (*end || !isfinite(v) || errno == ERANGE) return false;
    *out = (float)v;
    return true;
}

enum { CSV_MAX_COLS = 4096 };

typedef struct csv_parse {
    const char *file;
    const cJSON *label_spec;     /* string name, number index, or NULL (last) */
    int label;                   /* resolved column */
    int cols;
    int64_t rows, cap, limit;
    float max_label;             /* the largest label and its line */
    int64_t max_line;
    int64_t odd_line;            /* first line whose label is not a class index (0: none) */
    char odd_text[48];           /* that label as written */
} csv_parse;

/* Note the label of data row `line`: the largest so far, or the first that is no class index. */
static void note_label(csv_parse *p, const char *field, float v, int64_t line) {
    bool cls = v >= 0 && v == floorf(v) && v < 1e7f;
    if (!cls && !p->odd_line) {
        p->odd_line = line;
        field += strspn(field, " \t");
        snprintf(p->odd_text, sizeof p->odd_text, "%.*s", (int)strcspn(field, " \t\r"), field);
    }
    if (p->rows == 0 || v > p->max_label) {
        p->max_label = v;
        p->max_line = line;
    }
}

static int resolve_label(csv_parse *p, char **fields, int n, bool header, ct_err *err) {
    const cJSON *s = p->label_spec;
    p->label = n - 1;
    if (cJSON_IsNumber(s)) p->label = (int)s->valuedouble;
    if (cJSON_IsString(s)) {
        p->label = -1;
        for (int c = 0; header && c < n; c++) {
            char *f = fields[c];
            while (*f == ' ') f++;
            size_t len = strcspn(f, " \r\t");
            if (len == strlen(s->valuestring) && strncmp(f, s->valuestring, len) == 0) p->label = c;
        }
        if (p->label < 0)
            return ct_errf(err, CT_ERR_DATA, "%s:1: no column named \"%s\" in the %s", p->file,
                           s->valuestring, header ? "header" : "file (it has no header line)");
    }
    if (p->label < 0 || p->label >= n || n < 2)
        return ct_errf(err, CT_ERR_DATA, "%s:1: label column %d does not exist (%d columns; at least one "
                       "feature and the label are needed)", p->file, p->label, n);
    return CT_OK;
}

static int parse_rows(char *text, csv_parse *p, csv_impl *im, ct_err *err) {
    char **fields = ct_xmalloc((CSV_MAX_COLS + 1) * sizeof *fields);
    int rc = CT_OK;
    int64_t line_no = 0;
    bool first = true;
    for (char *line = text, *next; line && rc == CT_OK; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        line_no++;
        if (line[strspn(line, " \t\r")] == 0) continue;
        if (p->limit && p->rows >= p->limit) break;
        int n = split(line, fields, CSV_MAX_COLS);
        if (n > CSV_MAX_COLS) {
            rc = ct_errf(err, CT_ERR_DATA, "%s:%lld: more than %d columns", p->file, (long long)line_no, CSV_MAX_COLS);
            break;
        }
        if (first) {
            float v;
            bool header = false;
            for (int c = 0; c < n; c++) header |= !parse_num(fields[c], &v);
            rc = resolve_label(p, fields, n, header, err);
            p->cols = n;
            im->features = n - 1;
            first = false;
            if (header || rc) continue;
        }
        if (n != p->cols) {
            rc = ct_errf(err, CT_ERR_DATA, "%s:%lld: %d fields, the first row has %d", p->file,
                         (long long)line_no, n, p->cols);
            break;
        }
        if (p->rows == p->cap) {   /* as many rows as the file has */
            int64_t cap = p->cap ? 2 * p->cap : 1024;
            char what[1200];
            snprintf(what, sizeof what, "%s: the values of %lld rows", p->file, (long long)cap);
            float *x = ct_try_realloc(im->x, (size_t)cap * (size_t)im->features * sizeof(float), what, err);
            if (x) im->x = x;
            float *y = x ? ct_try_realloc(im->y, (size_t)cap * sizeof(float), what, err) : NULL;
            if (y) im->y = y;
            if (!x || !y) {
                rc = CT_ERR_RUNTIME;
                break;
            }
            p->cap = cap;
        }
        float *row = im->x + p->rows * im->features;
        for (int c = 0, k = 0; c < n && rc == CT_OK; c++) {
            float v;
            if (!parse_num(fields[c], &v))
                rc = ct_errf(err, CT_ERR_DATA, "%s:%lld: column %d: \"%.40s\" is not a decimal number",
                             p->file, (long long)line_no, c + 1, fields[c]);
            else if (c == p->label) {
                im->y[p->rows] = v;
                note_label(p, fields[c], v, line_no);
            } else {
                row[k++] = v;
            }
        }
        p->rows++;
    }
    free(fields);
    if (!rc && p->rows == 0) rc = ct_errf(err, CT_ERR_DATA, "%s: no data rows", p->file);
    return rc;
}

int ct_csv_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                ct_err *err) {
    *out = NULL;
    char where[1200], file[1024] = "";
    csv_parse p = {0};
    const cJSON *it;
    cJSON_ArrayForEach(it, entry) {
        ct_config_where(cfg, it, where, sizeof where);
        const char *k = it->string;
        if (strcmp(k, "path") == 0 && cJSON_IsString(it) && it->valuestring[0])
            ct_config_resolve_path(cfg, it->valuestring, file, sizeof file);
        else if (strcmp(k, "label_column") == 0 &&
                 (cJSON_IsString(it) || (cJSON_IsNumber(it) && it->valuedouble >= 0 &&
                                         it->valuedouble == floor(it->valuedouble) && it->valuedouble < CSV_MAX_COLS)))
            p.label_spec = it;
        else if (strcmp(k, "limit") == 0 && cJSON_IsNumber(it) && it->valuedouble >= 1)
            p.limit = (int64_t)it->valuedouble;
        else if (strcmp(k, "format") != 0)
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: %s", where, path, k,
                           strcmp(k, "path") == 0 ? "expected a file path (string)"
                           : strcmp(k, "label_column") == 0 ? "expected a column name or 0-based index"
                           : strcmp(k, "limit") == 0 ? "expected a positive integer"
                           : "unknown key for format csv (expected path, label_column, limit)");
    }
    if (!file[0]) {
        ct_config_where(cfg, entry, where, sizeof where);
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.path: missing (expected a CSV file)", where, path);
    }
    p.file = file;
    uint8_t *text = NULL;
    size_t cap = 0, len = 0;
    int rc = ct_read_file(file, &text, &cap, &len, err);
    if (rc) return rc;
    text[len] = 0;
    if (memchr(text, 0, len)) {
        free(text);
        return ct_errf(err, CT_ERR_DATA, "%s: contains NUL bytes: not a text CSV file", file);
    }
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    csv_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "csv";
    ds->decode = csv_decode;
    ds->close = csv_close;
    snprintf(ds->source, sizeof ds->source, "%s", file);
    rc = parse_rows((char *)text, &p, im, err);
    free(text);
    if (rc) {
        csv_close(ds);
        return rc;
    }
    ds->count = p.rows;
    ds->sample_shape = (ct_shape){.ndim = 1, .d = {im->features}};
    ds->sample_dtype = CT_F32;
    bool classes = p.odd_line == 0;
    ds->target_dtype = classes ? CT_I32 : CT_F32;
    ds->target_shape = classes ? (ct_shape){0} : (ct_shape){.ndim = 1, .d = {1}};
    ds->classes = classes ? (int64_t)p.max_label + 1 : 0;
    /* One stray label decides the kind of the whole column: a message about targets must say
     * which line did it. */
    if (classes)
        snprintf(ds->label_note, sizeof ds->label_note, "%s:%lld has label %lld, the largest", file,
                 (long long)p.max_line, (long long)p.max_label);
    else
        snprintf(ds->label_note, sizeof ds->label_note, "%s:%lld: label \"%s\" is not a class index "
                 "(an integer 0 or more), so the label column was read as regression targets (float [1])",
                 file, (long long)p.odd_line, p.odd_text);
    *out = ds;
    return CT_OK;
}

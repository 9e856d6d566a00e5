/* pathlist.c: brace patterns and lists of paths (pathlist.h). */
#include "core/data/pathlist.h"

#include <ctype.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_PATHS = 1000000 };

static void add_path(ct_pathlist *l, const char *path) {
    if (l->n % 64 == 0) l->paths = ct_xrealloc(l->paths, (size_t)(l->n + 64) * sizeof *l->paths);
    l->paths[l->n++] = ct_xstrdup(path);
}

/* Expand the first brace group of pattern (recursively for the rest). */
int ct_pathlist_expand(ct_pathlist *l, const char *pattern, const char *where, ct_err *err) {
    const char *open = strchr(pattern, '{');
    if (!open) {
        if (strchr(pattern, '}'))
            return ct_errf(err, CT_ERR_CONFIG, "%s: \"}\" without \"{\" in \"%s\"", where, pattern);
        if (l->n >= MAX_PATHS)
            return ct_errf(err, CT_ERR_CONFIG, "%s: \"%s\" names more than %d files", where, pattern, MAX_PATHS);
        add_path(l, pattern);
        return CT_OK;
    }
    const char *close = strchr(open, '}');
    if (!close)
        return ct_errf(err, CT_ERR_CONFIG, "%s: \"{\" without \"}\" in \"%s\"", where, pattern);
    size_t head = (size_t)(open - pattern), inner = (size_t)(close - open - 1);
    char body[256];
    if (inner >= sizeof body)
        return ct_errf(err, CT_ERR_CONFIG, "%s: brace group too long in \"%s\"", where, pattern);
    memcpy(body, open + 1, inner);
    body[inner] = '\0';
    size_t plen = strlen(pattern) + 64;
    char *next = ct_xmalloc(plen + inner);
    int rc = CT_OK;
    const char *dots = strstr(body, "..");
    if (dots && !strchr(body, ',')) {
        char a[128], b[128];
        snprintf(a, sizeof a, "%.*s", (int)(dots - body), body);
        snprintf(b, sizeof b, "%s", dots + 2);
        char *ea, *eb;
        long long lo = strtoll(a, &ea, 10), hi = strtoll(b, &eb, 10);
        if (!a[0] || !b[0] || *ea || *eb || !isdigit((unsigned char)a[0]) || !isdigit((unsigned char)b[0]) || hi < lo)
            rc = ct_errf(err, CT_ERR_CONFIG, "%s: brace range \"{%s}\" in \"%s\": expected {A..B} with "
                         "integers A <= B, such as {000000..000127}", where, body, pattern);
        else if (hi - lo + 1 > MAX_PATHS - l->n)
            rc = ct_errf(err, CT_ERR_CONFIG, "%s: \"%s\" names more than %d files", where, pattern, MAX_PATHS);
        int width = a[0] == '0' ? (int)strlen(a) : 0; /* zero padding kept, as braceexpand does */
        for (long long v = lo; v <= hi && !rc; v++) {
            snprintf(next, plen + inner, "%.*s%0*lld%s", (int)head, pattern, width, v, close + 1);
            rc = ct_pathlist_expand(l, next, where, err);
        }
    } else {
        char *save = NULL;
        for (char *alt = strtok_r(body, ",", &save); alt && !rc; alt = strtok_r(NULL, ",", &save)) {
            snprintf(next, plen + inner, "%.*s%s%s", (int)head, pattern, alt, close + 1);
            rc = ct_pathlist_expand(l, next, where, err);
        }
    }
    free(next);
    return rc;
}

/* A URL ("http://...", "s3://...", WebDataset's "pipe:cmd"): ctrain reads local files, and a URL
 * taken for a path would fail as "No such file" without saying why. */
static bool is_url(const char *s) {
    if (!strncmp(s, "pipe:", 5)) return true;
    const char *p = s;
    while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.') p++;
    return p > s && isalpha((unsigned char)s[0]) && !strncmp(p, "://", 3);
}

static int url_refused(const char *where, const char *path, const char *key, const char *url, ct_err *err) {
    return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: \"%.200s\" is a URL; ctrain reads local files only, not URLs "
                   "or pipes (download the files first, then give their paths or a brace pattern)", where, path,
                   key, url);
}

int ct_pathlist_parse(ct_pathlist *l, const ct_config *cfg, const cJSON *entry, const char *path,
                      const char *key, const char *what, const char *example, ct_err *err) {
    char where[1200], resolved[1100];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, key);
    ct_config_where(cfg, v ? v : entry, where, sizeof where);
    if (cJSON_IsString(v) && is_url(v->valuestring)) return url_refused(where, path, key, v->valuestring, err);
    if (cJSON_IsString(v) && v->valuestring[0]) {
        ct_config_resolve_path(cfg, v->valuestring, resolved, sizeof resolved);
        return ct_pathlist_expand(l, resolved, where, err);
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: %s (expected a path or brace pattern such as "
                       "\"%s\", or a list of paths)", where, path, key,
                       v ? "expected a non-empty string or list" : "missing", example);
    const cJSON *u;
    cJSON_ArrayForEach(u, v) {
        if (!cJSON_IsString(u) || !u->valuestring[0]) {
            ct_config_where(cfg, u, where, sizeof where);
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: expected %s (strings)", where, path, key, what);
        }
        if (is_url(u->valuestring)) {
            ct_config_where(cfg, u, where, sizeof where);
            return url_refused(where, path, key, u->valuestring, err);
        }
        ct_config_resolve_path(cfg, u->valuestring, resolved, sizeof resolved);
        add_path(l, resolved);
    }
    return CT_OK;
}

static int by_bytes(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool is_glob(const char *path) { return strpbrk(path, "*?[") && access(path, F_OK) != 0; }

/* The matches of pattern onto the end of out, in byte order. */
static int glob_onto(ct_pathlist *out, const char *pattern, const char *where, ct_err *err) {
    glob_t g;
    int r = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (r == GLOB_NOMATCH)
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\" matches no file (a glob: * and ? match within one "
                       "directory level; a relative path is relative to the config file)", where, pattern);
    if (r != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\": the glob failed (%s)", where, pattern,
                       r == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
    int rc = CT_OK;
    if (g.gl_pathc > (size_t)(MAX_PATHS - out->n))
        rc = ct_errf(err, CT_ERR_CONFIG, "%s: \"%s\" names more than %d files", where, pattern, MAX_PATHS);
    else {
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, by_bytes);
        for (size_t i = 0; i < g.gl_pathc; i++) add_path(out, g.gl_pathv[i]);
    }
    globfree(&g);
    return rc;
}

int ct_pathlist_glob(ct_pathlist *l, const char *where, ct_err *err) {
    bool any = false;
    for (int i = 0; i < l->n && !any; i++) any = is_glob(l->paths[i]);
    if (!any) return CT_OK;
    ct_pathlist out = {0};
    int rc = CT_OK;
    for (int i = 0; i < l->n && !rc; i++) {
        if (is_glob(l->paths[i])) rc = glob_onto(&out, l->paths[i], where, err);
        else add_path(&out, l->paths[i]);
    }
    if (rc) {
        ct_pathlist_free(&out);
        return rc;
    }
    ct_pathlist_free(l);
    *l = out;
    return CT_OK;
}

void ct_pathlist_free(ct_pathlist *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    l->paths = NULL;
    l->n = 0;
}

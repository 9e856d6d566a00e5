/* agree.c: the ranks' check that they were started alike (agree.h). */
#include "core/dist/agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the list ---- */

void ct_agree_add(ct_agree_list *l, const char *key, const char *value) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        ct_agree_item *grown = realloc(l->items, (size_t)l->cap * sizeof *grown);
        if (!grown) ct_fatal("out of memory listing the config's keys for the ranks' check (%d keys)", l->cap);
        l->items = grown;
    }
    l->items[l->n++] = (ct_agree_item){ct_xstrdup(key), ct_xstrdup(value)};
}

void ct_agree_free(ct_agree_list *l) {
    for (int i = 0; i < l->n; i++) free(l->items[i].key), free(l->items[i].value);
    free(l->items);
    *l = (ct_agree_list){0};
}

/* path is a skip path, or under one. */
static bool skipped(const char *path, const char *const *skip, int n_skip) {
    for (int i = 0; i < n_skip; i++) {
        size_t k = strlen(skip[i]);
        if (strncmp(path, skip[i], k) == 0 && (path[k] == '\0' || path[k] == '.' || path[k] == '[')) return true;
    }
    return false;
}

enum { PATH_MAX_LEN = 1024 };

static void add_leaves(ct_agree_list *l, const cJSON *v, const char *path, const char *const *skip, int n_skip) {
    if (path[0] && skipped(path, skip, n_skip)) return;
    bool container = cJSON_IsObject(v) || cJSON_IsArray(v);
    if (!container || !v->child) {
        char *text = cJSON_PrintUnformatted(v);
        ct_agree_add(l, path, text ? text : "?");
        free(text);
        return;
    }
    int i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        char sub[PATH_MAX_LEN];
        if (cJSON_IsArray(v)) snprintf(sub, sizeof sub, "%s[%d]", path, i);
        else snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", m->string ? m->string : "");
        add_leaves(l, m, sub, skip, n_skip);
    }
}

void ct_agree_add_json(ct_agree_list *l, const cJSON *doc, const char *const *skip, int n_skip) {
    if (doc) add_leaves(l, doc, "", skip, n_skip);
}

/* FNV-1a of s and its terminating NUL ("ab","c" is not "a","bc"), continuing from h. */
static uint64_t fnv(uint64_t h, const char *s) {
    for (const char *p = s;; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ull;
        if (!*p) return h;
    }
}

/* A sum of the items' hashes: the same for the same items in another order (two files of one config
 * with their keys written in another order agree; an array's order is in its keys, "[0]", "[1]"). */
uint64_t ct_agree_digest(const ct_agree_list *l) {
    uint64_t sum = 0;
    for (int i = 0; i < l->n; i++) sum += fnv(fnv(0xcbf29ce484222325ull, l->items[i].key), l->items[i].value);
    return sum & ((1ull << 52) - 1);
}

/* The index of key in l, looking at `hint` first (lists of one config are mostly aligned); -1. */
static int find_key(const ct_agree_list *l, const char *key, int hint) {
    if (hint >= 0 && hint < l->n && strcmp(l->items[hint].key, key) == 0) return hint;
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->items[i].key, key) == 0) return i;
    return -1;
}

bool ct_agree_first_difference(const ct_agree_list *ref, const ct_agree_list *mine, int *in_ref, int *in_mine) {
    for (int i = 0; i < ref->n; i++) {
        int j = find_key(mine, ref->items[i].key, i);
        if (j < 0 || strcmp(mine->items[j].value, ref->items[i].value) != 0) {
            *in_ref = i, *in_mine = j;
            return true;
        }
    }
    for (int j = 0; j < mine->n; j++)
        if (find_key(ref, mine->items[j].key, j) < 0) {
            *in_ref = -1, *in_mine = j;
            return true;
        }
    *in_ref = *in_mine = -1;
    return false;
}

/* ---- text over the host all-reduce ---- */

enum { BYTES_PER_DOUBLE = 6 };   /* 48 bits: every value exact in a double, and so is their sum */

int ct_agree_send_text(ct_comm *c, int from, const char *bytes, size_t n, char **out, ct_err *err) {
    *out = NULL;
    double len = c->rank == from ? (double)n : 0;
    int rc = c->all_reduce_host(c, &len, 1, CT_REDUCE_MAX, err);
    if (rc) return rc;
    size_t total = (size_t)len, words = (total + BYTES_PER_DOUBLE - 1) / BYTES_PER_DOUBLE;
    double *w = ct_xcalloc(words ? words : 1, sizeof *w);
    for (size_t i = 0; c->rank == from && i < total; i++)
        w[i / BYTES_PER_DOUBLE] += (double)(unsigned char)bytes[i] * (double)(1ull << (8 * (i % BYTES_PER_DOUBLE)));
    if (words) rc = c->all_reduce_host(c, w, (int)words, CT_REDUCE_SUM, err);
    if (!rc) {
        char *s = ct_xmalloc(total + 1);
        for (size_t i = 0; i < total; i++) {
            uint64_t word = (uint64_t)w[i / BYTES_PER_DOUBLE];
            s[i] = (char)((word >> (8 * (i % BYTES_PER_DOUBLE))) & 0xff);
        }
        s[total] = '\0';
        *out = s;
    }
    free(w);
    return rc;
}

/* ---- the check ---- */

/* The list as JSON text, [[key, value], ...] (malloc'd). */
static char *list_text(const ct_agree_list *l) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < l->n; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(l->items[i].key));
        cJSON_AddItemToArray(pair, cJSON_CreateString(l->items[i].value));
        cJSON_AddItemToArray(a, pair);
    }
    char *text = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    if (!text) ct_fatal("out of memory writing the config's keys for the ranks' check");
    return text;
}

static void list_parse(const char *text, ct_agree_list *l) {
    cJSON *a = cJSON_Parse(text);
    for (const cJSON *pair = a ? a->child : NULL; pair; pair = pair->next) {
        const cJSON *k = cJSON_GetArrayItem(pair, 0), *v = cJSON_GetArrayItem(pair, 1);
        if (cJSON_IsString(k) && cJSON_IsString(v)) ct_agree_add(l, k->valuestring, v->valuestring);
    }
    cJSON_Delete(a);
}

/* What the first differing rank found: [key, its value or null, rank 0's value or null]. */
typedef struct finding {
    char key[512], mine[160], ref[160];
} finding;

/* A value for the message: quoted as it is, shortened past 150 bytes; "absent" for none. */
static void shown(char *dst, size_t n, const char *v) {
    if (!v) snprintf(dst, n, "absent");
    else if (strlen(v) > 150) snprintf(dst, n, "%.147s...", v);
    else snprintf(dst, n, "%s", v);
}

static char *finding_text(const ct_agree_list *ref, const ct_agree_list *mine) {
    int i, j;
    cJSON *a = cJSON_CreateArray();
    if (ct_agree_first_difference(ref, mine, &i, &j)) {
        cJSON_AddItemToArray(a, cJSON_CreateString(i >= 0 ? ref->items[i].key : mine->items[j].key));
        cJSON_AddItemToArray(a, j >= 0 ? cJSON_CreateString(mine->items[j].value) : cJSON_CreateNull());
        cJSON_AddItemToArray(a, i >= 0 ? cJSON_CreateString(ref->items[i].value) : cJSON_CreateNull());
    }
    char *text = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    if (!text) ct_fatal("out of memory writing the ranks' difference");
    return text;
}

static void finding_parse(const char *text, finding *f) {
    *f = (finding){"", "absent", "absent"};
    cJSON *a = cJSON_Parse(text);
    const cJSON *k = cJSON_GetArrayItem(a, 0), *m = cJSON_GetArrayItem(a, 1), *r = cJSON_GetArrayItem(a, 2);
    if (cJSON_IsString(k)) snprintf(f->key, sizeof f->key, "%s", k->valuestring);
    shown(f->mine, sizeof f->mine, cJSON_IsString(m) ? m->valuestring : NULL);
    shown(f->ref, sizeof f->ref, cJSON_IsString(r) ? r->valuestring : NULL);
    cJSON_Delete(a);
}

/* "1", "1 and 3", "1, 3 and 5", at most 8 named, into buf. */
static void rank_list(const double *differs, int world, char *buf, size_t n) {
    int count = 0, named = 0;
    for (int r = 0; r < world; r++) count += differs[r] != 0;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < world && named < 8 && used < n; r++) {
        if (!differs[r]) continue;
        named++;
        const char *sep = named == 1 ? "" : named == count ? " and " : ", ";
        used += (size_t)snprintf(buf + used, n - used, "%s%d", sep, r);
    }
    if (named < count && used < n) snprintf(buf + used, n - used, " and %d more", count - named);
}

/* The message every rank stops with, once all know the differing ranks and the finding. */
static int disagree(ct_comm *c, const double *differs, int first, const finding *f, bool differ_self,
                    ct_err *err) {
    char ranks[160];
    rank_list(differs, c->world, ranks, sizeof ranks);
    if (c->rank != 0 && !differ_self)
        return ct_errf(err, CT_ERR_CONFIG, "rank %d of %d: stopped before training: rank%s %s %s started with "
                       "another config or data than rank 0 (rank 0 says which key)", c->rank, c->world,
                       strchr(ranks, ' ') ? "s" : "", ranks, strchr(ranks, ' ') ? "were" : "was");
    char more[200] = "";
    if (strchr(ranks, ' ')) snprintf(more, sizeof more, "; ranks %s differ from rank 0", ranks);
    return ct_errf(err, CT_ERR_CONFIG, "ranks 0 and %d were started with different configs or data: %s is %s on rank "
                   "0 and %s on rank %d (the first key that differs%s).\n  Start every rank with the same config "
                   "file, --set options and data (a launcher gives each rank the same command line)", first,
                   f->key, f->ref, f->mine, first, more);
}

int ct_comm_agree(ct_comm *c, const ct_agree_list *mine, ct_err *err) {
    if (c->world <= 1) return CT_OK;
    double d = (double)ct_agree_digest(mine);
    double v[3] = {d, -d, c->rank == 0 ? d : -1};   /* max, -min, rank 0's */
    int rc = c->all_reduce_host(c, v, 3, CT_REDUCE_MAX, err);
    if (rc || v[0] == -v[1]) return rc;
    bool differ_self = d != v[2];
    double *differs = ct_xcalloc((size_t)c->world, sizeof *differs);
    differs[c->rank] = differ_self;
    rc = c->all_reduce_host(c, differs, c->world, CT_REDUCE_MAX, err);
    int first = 1;
    while (!rc && first < c->world && !differs[first]) first++;
    if (!rc && first == c->world) /* digests differ, yet none from rank 0's: cannot happen */
        rc = ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: the ranks' config digests disagree, but none differs from "
                     "rank 0's", c->rank, c->world);
    char *ref_text = NULL, *found_text = NULL, *sent = c->rank == 0 ? list_text(mine) : NULL;
    if (!rc) rc = ct_agree_send_text(c, 0, sent, sent ? strlen(sent) : 0, &ref_text, err);
    free(sent);
    sent = NULL;
    ct_agree_list ref = {0};
    if (!rc && c->rank == first) {
        list_parse(ref_text, &ref);
        sent = finding_text(&ref, mine);
    }
    if (!rc) rc = ct_agree_send_text(c, first, sent, sent ? strlen(sent) : 0, &found_text, err);
    if (!rc) {
        finding f;
        finding_parse(found_text, &f);
        rc = disagree(c, differs, first, &f, differ_self, err);
    }
    ct_agree_free(&ref);
    free(sent), free(ref_text), free(found_text), free(differs);
    return rc;
}

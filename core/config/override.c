/* override.c: --model/--data splicing and --set KEY=VALUE overrides.
 *
 * Both edit the parsed tree before any section is read, so everything downstream (validation,
 * "auto", the batch rule, --print-config) sees one tree. Nodes keep their source positions: a
 * section taken from another file keeps that file's positions (its children are moved, not
 * copied), and an override's nodes carry the origin "--set KEY". */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/internal.h"

/* Give `node` and everything under it the origin text (so messages say an override set it). */
static void set_origin_deep(ct_json_doc *doc, const cJSON *node, const char *origin) {
    ct_json_set_origin(doc, node, origin);
    for (const cJSON *c = node->child; c; c = c->next) set_origin_deep(doc, c, origin);
}

/* Put `item` in place of `old` (same position in the parent), keeping `old` alive in
 * cfg->retired: position tables are keyed by node, so a freed node's address must not be reused
 * while the documents live. */
static void replace_node(ct_config *cfg, cJSON *parent, cJSON *old, cJSON *item, const char *key) {
    if (key) {
        size_t n = strlen(key) + 1;
        item->string = cJSON_malloc(n);
        memcpy(item->string, key, n);
    }
    /* Linked by hand: cJSON 1.7.15 (Debian 12) loses an item inserted into the middle of a list
     * with cJSON_InsertItemInArray, and cJSON_ReplaceItemViaPointer frees the old node.
     * cJSON's invariant: parent->child->prev is the last item. */
    item->next = old->next;
    if (old == parent->child) {
        item->prev = old->prev == old ? item : old->prev; /* first item: prev is the last one */
        parent->child = item;
    } else {
        item->prev = old->prev;
        old->prev->next = item;
    }
    if (old->next)
        old->next->prev = item;
    else
        parent->child->prev = item; /* old was the last item */
    old->prev = old->next = NULL;
    cJSON_AddItemToArray(cfg->retired, old);
}

static void put_member(ct_config *cfg, cJSON *obj, const char *key, cJSON *item) {
    cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (old)
        replace_node(cfg, obj, old, item, key);
    else
        cJSON_AddItemToObject(obj, key, item);
}

/* Load a section file. A file that is itself a full config (has the section as a member and not
 * the section's own keys) contributes that member. */
static int load_section(ct_rd *r, const char *section, const char *file, const char *marker,
                        ct_json_doc **doc_out, cJSON **sec_out) {
    ct_json_doc *doc = ct_json_parse_file(file, r->warn, r->err);
    if (!doc) return r->err ? r->err->code : CT_ERR_CONFIG;
    *doc_out = doc;
    cJSON *root = ct_json_root(doc);
    if (!cJSON_IsObject(root)) {
        char shown[128];
        return ct_errf(r->err, CT_ERR_CONFIG, "%s: the %s file must hold a JSON object, got %s", file, section,
                       ct_rd_show(root, shown, sizeof shown));
    }
    cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, section);
    if (inner && !cJSON_GetObjectItemCaseSensitive(root, marker)) {
        if (!cJSON_IsObject(inner)) {
            char shown[128], where[1200];
            return ct_errf(r->err, CT_ERR_CONFIG, "%s: %s: expected an object, got %s",
                           ct_json_where(doc, inner, where, sizeof where), section,
                           ct_rd_show(inner, shown, sizeof shown));
        }
        root = inner;
    }
    *sec_out = root;
    return CT_OK;
}

static int splice_one(ct_rd *r, cJSON *root, const char *section, const char *opt_path, const char *marker,
                      struct ct_json_doc **doc_slot) {
    ct_config *cfg = r->cfg;
    cJSON *cur = cJSON_GetObjectItemCaseSensitive(root, section);
    char file[2048];
    if (opt_path) {
        snprintf(file, sizeof file, "%s", opt_path); /* command-line paths are relative to the cwd */
    } else if (cur && cJSON_IsString(cur)) {
        ct_config_resolve_path(cfg, cur->valuestring, file, sizeof file);
    } else if (cur && !cJSON_IsObject(cur) && !cJSON_IsNull(cur)) {
        char shown[128];
        return ct_rd_fail(r, cur, section, "expected an object or the path of a JSON file, got %s",
                          ct_rd_show(cur, shown, sizeof shown));
    } else {
        return CT_OK;
    }
    cJSON *src = NULL;
    int rc = load_section(r, section, file, marker, doc_slot, &src);
    if (rc) {
        if (!opt_path && cur) { /* say which key named the file */
            char where[1200];
            ct_config_where(cfg, cur, where, sizeof where);
            ct_err_append(r->err, "  (%s is named by %s at %s)", file, section, where);
        }
        return rc;
    }
    /* Move the children, so they keep their positions in the section file. */
    cJSON *moved = cJSON_CreateObject();
    moved->child = src->child;
    src->child = NULL;
    put_member(cfg, root, section, moved);
    ct_json_set_origin(cfg->doc, moved, file);
    return CT_OK;
}

int ct_cfg_splice_sections(ct_rd *r, cJSON *root, bool use_opts) {
    struct ct_json_doc **slots[2] = {&r->cfg->model_doc, &r->cfg->data_doc};
    const char *names[2] = {"model", "data"}, *markers[2] = {"layers", "train"};
    const char *paths[2] = {use_opts ? r->opts->model_path : NULL, use_opts ? r->opts->data_path : NULL};
    for (int i = 0; i < 2; i++) {
        const cJSON *cur = cJSON_GetObjectItemCaseSensitive(root, names[i]);
        if (!use_opts && !cJSON_IsString(cur)) continue; /* second pass: only paths set by --set */
        if (*slots[i] && !use_opts) {
            return ct_rd_fail(r, cur, names[i], "was already taken from another file; set it once");
        }
        int rc = splice_one(r, root, names[i], paths[i], markers[i], slots[i]);
        if (rc) return rc;
    }
    return CT_OK;
}

/* Take every null member out of the objects under `node`, keeping them alive in cfg->retired (see
 * replace_node). Array elements are values, not keys: they stay. */
static void drop_null_members(ct_config *cfg, cJSON *node) {
    cJSON *c = node->child;
    while (c) {
        cJSON *next = c->next;
        if (cJSON_IsObject(node) && cJSON_IsNull(c))
            cJSON_AddItemToArray(cfg->retired, cJSON_DetachItemViaPointer(node, c));
        else if (cJSON_IsObject(c) || cJSON_IsArray(c))
            drop_null_members(cfg, c);
        c = next;
    }
}

void ct_cfg_drop_nulls(ct_config *cfg, cJSON *root) {
    static const char *const own[] = {"model", "data"};
    for (int i = 0; i < CT_ARRAY_LEN(own); i++) {
        cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, own[i]);
        if (cJSON_IsObject(sec)) drop_null_members(cfg, sec);
    }
}

static bool is_index(const char *s, size_t len) {
    if (len == 0 || len > 9) return false;
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)s[i])) return false;
    return true;
}

/* The override value: JSON when it parses as JSON, else the text as a string. */
static cJSON *parse_value(const char *text, const char *origin) {
    ct_warnings w = {0};
    ct_err e = {0};
    ct_json_doc *d = ct_json_parse(text, strlen(text), origin, &w, &e);
    cJSON *v = NULL;
    if (d && w.n == 0) v = cJSON_Duplicate(ct_json_root(d), 1);
    if (d) ct_json_free(d);
    ct_warnings_free(&w);
    return v ? v : cJSON_CreateString(text);
}

static int apply_one(ct_rd *r, cJSON *root, const char *ov) {
    ct_config *cfg = r->cfg;
    const char *eq = strchr(ov, '=');
    if (!eq || eq == ov)
        return ct_errf(r->err, CT_ERR_CONFIG, "override \"%s\": expected KEY=VALUE with a dotted KEY such as "
                       "optimizer.params.lr=3e-4", ov);
    size_t klen = (size_t)(eq - ov);
    char *key = ct_xmalloc(klen + 1);
    memcpy(key, ov, klen);
    key[klen] = 0;
    char origin[600];
    snprintf(origin, sizeof origin, "--set %.500s", key);

    int rc = CT_OK;
    cJSON *node = root;
    const char *seg = key;
    char done[1024] = ""; /* the path walked so far, for messages */
    for (;;) {
        const char *dot = strchr(seg, '.');
        size_t len = dot ? (size_t)(dot - seg) : strlen(seg);
        if (len == 0) {
            rc = ct_errf(r->err, CT_ERR_CONFIG, "%s: empty component in the key path", origin);
            break;
        }
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(len < 511 ? len : 511), seg);
        bool last = dot == NULL;
        cJSON *child = NULL;
        bool in_array = cJSON_IsArray(node);
        if (in_array) {
            if (!is_index(name, len) || atoi(name) >= cJSON_GetArraySize(node)) {
                rc = ct_errf(r->err, CT_ERR_CONFIG, "%s: %s is an array of %d; \"%s\" is not an index into it",
                             origin, done, cJSON_GetArraySize(node), name);
                break;
            }
            child = cJSON_GetArrayItem(node, atoi(name));
        } else {
            child = cJSON_GetObjectItemCaseSensitive(node, name);
        }
        if (last) {
            cJSON *val = parse_value(eq + 1, origin);
            if (child)
                replace_node(cfg, node, child, val, in_array ? NULL : name);
            else
                cJSON_AddItemToObject(node, name, val);
            set_origin_deep(cfg->doc, val, origin);
            break;
        }
        if (!child) {
            child = cJSON_CreateObject();
            cJSON_AddItemToObject(node, name, child);
            ct_json_set_origin(cfg->doc, child, origin);
        } else if (!cJSON_IsObject(child) && !cJSON_IsArray(child)) {
            char shown[128], where[1200];
            size_t dl = strlen(done);
            snprintf(done + dl, sizeof done - dl, "%s%s", dl ? "." : "", name);
            rc = ct_errf(r->err, CT_ERR_CONFIG, "%s: %s is %s (%s), not an object; cannot set a key inside it",
                         origin, done, ct_rd_show(child, shown, sizeof shown),
                         ct_config_where(cfg, child, where, sizeof where));
            break;
        }
        size_t dl = strlen(done);
        snprintf(done + dl, sizeof done - dl, "%s%s", dl ? "." : "", name);
        node = child;
        seg = dot + 1;
    }
    free(key);
    return rc;
}

int ct_cfg_apply_overrides(ct_rd *r, cJSON *root) {
    for (int i = 0; i < r->opts->n_overrides; i++) {
        int rc = apply_one(r, root, r->opts->overrides[i]);
        if (rc) return rc;
    }
    return CT_OK;
}

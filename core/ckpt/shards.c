/* shards.c: per-rank checkpoint shards, written and read by range (shards.h). */
#include "core/ckpt/shards.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/ckpt/stage.h"
#include "core/util/fs.h"

#define SHARDS_VERSION 1
#define MAX_WORLD 1000000
#define MAX_INT53 9007199254740992.0

void ct_ckpt_shard_file_name(int rank, int world, char out[CT_SHARDS_NAME]) {
    snprintf(out, CT_SHARDS_NAME, "zero_shard_%d_of_%d.safetensors", rank, world);
}

/* ---------------------------------------------------------------- writing */

int ct_ckpt_shard_write(const char *dir, const ct_ckpt_tensors *t, int rank, int world, uint32_t *crc, ct_err *err) {
    int64_t k = t->hi - t->lo;
    ct_shape shape = ct_shape_make(1, &k);
    ct_st_entry e[1 + CT_CKPT_MAX_SLOTS];
    ct_ckpt_loc span[1 + CT_CKPT_MAX_SLOTS];
    ct_ckpt_entry(&e[0], "master", shape, (ct_ckpt_loc){t->params_mem, t->params, 0}, &span[0]);
    for (int s = 0; s < t->n_slots; s++)
        ct_ckpt_entry(&e[1 + s], t->slot_name[s], shape, (ct_ckpt_loc){t->slot_mem[s], t->slot[s], 0}, &span[1 + s]);
    char desc[256], slots[128], name[CT_SHARDS_NAME], path[4200];
    snprintf(desc, sizeof desc, "{\"rank\": %d, \"world\": %d, \"lo\": %" PRId64 ", \"hi\": %" PRId64
             ", \"n_params\": %" PRId64 "}", rank, world, t->lo, t->hi, t->n_params);
    ct_ckpt_slot_list(t, slots, sizeof slots);
    const char *mk[] = {"format", CT_SHARD_META, "optimizer", "slots", "ctrain_version"};
    const char *mv[] = {CT_SHARDS_FORMAT, desc, t->optimizer, slots, CT_VERSION};
    ct_ckpt_shard_file_name(rank, world, name);
    int rc = ct_fs_join(path, sizeof path, dir, name, err);
    return rc ? rc : ct_st_write_crc(path, e, 1 + t->n_slots, mk, mv, 5, crc, err);
}

static cJSON *index_json(const ct_ckpt_tensors *t, int world) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", CT_SHARDS_FORMAT);
    cJSON_AddNumberToObject(j, "version", SHARDS_VERSION);
    cJSON_AddNumberToObject(j, "world", world);
    cJSON_AddNumberToObject(j, "n_params", (double)t->n_params);
    cJSON_AddNumberToObject(j, "n_buffers", (double)t->n_buffers);
    cJSON_AddStringToObject(j, "optimizer", t->optimizer);
    cJSON *slots = cJSON_AddArrayToObject(j, "slots");
    for (int s = 0; s < t->n_slots; s++) cJSON_AddItemToArray(slots, cJSON_CreateString(t->slot_name[s]));
    cJSON *files = cJSON_AddArrayToObject(j, "shards");
    for (int r = 0; r < world; r++) {
        char name[CT_SHARDS_NAME];
        ct_ckpt_shard_file_name(r, world, name);
        cJSON_AddItemToArray(files, cJSON_CreateString(name));
    }
    cJSON *views = cJSON_AddArrayToObject(j, "views");
    for (int i = 0; i < t->n_views; i++) {
        const ct_param_view *v = &t->views[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", v->name);
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < v->shape.ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)v->shape.d[d]));
        cJSON_AddNumberToObject(o, "offset", (double)v->offset);
        cJSON_AddBoolToObject(o, "trainable", v->trainable);
        cJSON_AddItemToArray(views, o);
    }
    return j;
}

static int write_buffers(const char *dir, const ct_ckpt_tensors *t, uint32_t *crc, ct_err *err) {
    ct_st_entry *e = ct_xcalloc((size_t)t->n_views + 1, sizeof *e);
    ct_ckpt_loc *span = ct_xcalloc((size_t)t->n_views + 1, sizeof *span);
    int n = 0, rc = CT_OK;
    for (int i = 0; i < t->n_views && !rc; i++) {
        const ct_param_view *v = &t->views[i];
        if (v->trainable) continue;
        if (!ct_ckpt_view_in_bounds(t, v))
            rc = ct_errf(err, CT_ERR_RUNTIME, "checkpoint: view \"%s\" lies outside its buffer", v->name);
        else {
            ct_ckpt_entry(&e[n], v->name, v->shape, ct_ckpt_view_loc(t, v, 0), &span[n]);
            n++;
        }
    }
    const char *mk[] = {"format", "ctrain_version"};
    const char *mv[] = {"pt", CT_VERSION};
    char path[4200];
    if (!rc) rc = ct_fs_join(path, sizeof path, dir, CT_SHARDS_BUFFERS, err);
    if (!rc) rc = ct_st_write_crc(path, e, n, mk, mv, 2, crc, err);
    free(span);
    free(e);
    return rc;
}

int ct_ckpt_shard_write_index(const char *dir, const ct_ckpt_tensors *t, int world, uint32_t crc[2], ct_err *err) {
    cJSON *j = index_json(t, world);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    size_t len = strlen(text);
    text = ct_xrealloc(text, len + 2);
    text[len++] = '\n';
    char path[4200];
    int rc = ct_fs_join(path, sizeof path, dir, CT_SHARDS_INDEX, err);
    if (!rc) rc = ct_fs_write_sync(path, text, len, err);
    crc[0] = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)text, (uInt)len);
    free(text);
    return rc ? rc : write_buffers(dir, t, &crc[1], err);
}

/* ---------------------------------------------------------------- the index */

static bool json_int(const cJSON *o, const char *key, int64_t lo, double hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > hi)
        return false;
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool json_str(const cJSON *o, const char *key, char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) return false;
    snprintf(out, n, "%s", v->valuestring);
    return true;
}

/* A file name the index may give: plain (no directory part), of the size a name has. */
static bool plain_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..") && strlen(s) < CT_SHARDS_NAME;
}

static int parse_view(const cJSON *o, const ct_ckpt_shard_set *s, ct_param_view *v, int i, ct_err *err) {
    memset(v, 0, sizeof *v);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "trainable");
    int nd = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    if (!json_str(o, "name", v->name, sizeof v->name) || !v->name[0] || nd < 0 || nd > CT_MAX_DIMS ||
        !json_int(o, "offset", 0, MAX_INT53, &v->offset) || !cJSON_IsBool(tr))
        return ct_errf(err, CT_ERR_DATA, "%s: views[%d]: expected {\"name\", \"shape\" (at most %d sizes), "
                       "\"offset\", \"trainable\"}", s->index_path, i, CT_MAX_DIMS);
    v->trainable = cJSON_IsTrue(tr);
    v->shape.ndim = nd;
    double numel = 1;
    for (int d = 0; d < nd; d++) {
        const cJSON *x = cJSON_GetArrayItem(shape, d);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble) ||
            x->valuedouble > MAX_INT53)
            return ct_errf(err, CT_ERR_DATA, "%s: views[%d] (\"%s\"): a size of its shape is not an integer >= 0",
                           s->index_path, i, v->name);
        v->shape.d[d] = (int64_t)x->valuedouble;
        numel *= x->valuedouble;
    }
    int64_t extent = v->trainable ? s->n_params : s->n_buffers;
    if (numel > (double)extent || (double)v->offset + numel > (double)extent)
        return ct_errf(err, CT_ERR_DATA, "%s: views[%d] (\"%s\"): offset %" PRId64 " and %.0f elements lie "
                       "outside the %s space of %" PRId64, s->index_path, i, v->name, v->offset, numel,
                       v->trainable ? "parameter" : "buffer", extent);
    v->numel = (int64_t)numel;
    return CT_OK;
}

static int cmp_view_name(const void *a, const void *b) {
    return strcmp(((const ct_param_view *)a)->name, ((const ct_param_view *)b)->name);
}

static int parse_index(const cJSON *j, ct_ckpt_shard_set *s, ct_err *err) {
    int64_t version = 0, world = 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsObject(j) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, CT_SHARDS_FORMAT) != 0 ||
        !json_int(j, "version", 1, 1e9, &version))
        return ct_errf(err, CT_ERR_DATA, "%s: not an index of checkpoint shards (\"format\": \"%s\" and "
                       "\"version\" expected)", s->index_path, CT_SHARDS_FORMAT);
    if (version != SHARDS_VERSION)
        return ct_errf(err, CT_ERR_DATA, "%s: shard index version %" PRId64 ", this ctrain reads version %d "
                       "(written by a newer ctrain?)", s->index_path, version, SHARDS_VERSION);
    if (!json_int(j, "world", 1, MAX_WORLD, &world) || !json_int(j, "n_params", 0, MAX_INT53, &s->n_params) ||
        !json_int(j, "n_buffers", 0, MAX_INT53, &s->n_buffers) ||
        !json_str(j, "optimizer", s->optimizer, sizeof s->optimizer))
        return ct_errf(err, CT_ERR_DATA, "%s: \"world\" (1 to %d), \"n_params\", \"n_buffers\" (integers >= 0) "
                       "and \"optimizer\" (a string) expected", s->index_path, MAX_WORLD);
    s->world = (int)world;
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(j, "slots");
    int ns = cJSON_IsArray(slots) ? cJSON_GetArraySize(slots) : -1;
    if (ns < 0 || ns > CT_CKPT_MAX_SLOTS)
        return ct_errf(err, CT_ERR_DATA, "%s: \"slots\": expected an array of at most %d names", s->index_path,
                       CT_CKPT_MAX_SLOTS);
    s->n_slots = ns;
    for (int i = 0; i < ns; i++) {
        const cJSON *x = cJSON_GetArrayItem(slots, i);
        if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) >= sizeof s->slot_name[i] ||
            strchr(x->valuestring, ',') || strcmp(x->valuestring, "master") == 0)
            return ct_errf(err, CT_ERR_DATA, "%s: \"slots\"[%d]: expected a slot name", s->index_path, i);
        snprintf(s->slot_name[i], sizeof s->slot_name[i], "%s", x->valuestring);
        snprintf(s->slots + strlen(s->slots), sizeof s->slots - strlen(s->slots), "%s%s", i ? "," : "",
                 x->valuestring);
    }
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "shards");
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) != s->world)
        return ct_errf(err, CT_ERR_DATA, "%s: \"shards\": expected an array of %d file names (\"world\")",
                       s->index_path, s->world);
    s->shards = ct_xcalloc((size_t)s->world, sizeof *s->shards);
    for (int r = 0; r < s->world; r++) {
        const cJSON *x = cJSON_GetArrayItem(files, r);
        if (!cJSON_IsString(x) || !plain_name(x->valuestring))
            return ct_errf(err, CT_ERR_DATA, "%s: \"shards\"[%d]: expected a file name in the checkpoint "
                           "directory", s->index_path, r);
        snprintf(s->shards[r].file, sizeof s->shards[r].file, "%s", x->valuestring);
        for (int q = 0; q < r; q++)
            if (strcmp(s->shards[q].file, s->shards[r].file) == 0)
                return ct_errf(err, CT_ERR_DATA, "%s: \"shards\" names %s twice", s->index_path, s->shards[r].file);
    }
    const cJSON *views = cJSON_GetObjectItemCaseSensitive(j, "views");
    if (!cJSON_IsArray(views))
        return ct_errf(err, CT_ERR_DATA, "%s: \"views\": expected an array", s->index_path);
    s->n_views = cJSON_GetArraySize(views);
    s->views = ct_xcalloc((size_t)s->n_views + 1, sizeof *s->views);
    for (int i = 0; i < s->n_views; i++) {
        int rc = parse_view(cJSON_GetArrayItem(views, i), s, &s->views[i], i, err);
        if (rc) return rc;
    }
    qsort(s->views, (size_t)s->n_views, sizeof *s->views, cmp_view_name);
    for (int i = 1; i < s->n_views; i++)
        if (strcmp(s->views[i - 1].name, s->views[i].name) == 0)
            return ct_errf(err, CT_ERR_DATA, "%s: \"views\" names %s twice", s->index_path, s->views[i].name);
    return CT_OK;
}

const ct_param_view *ct_ckpt_shard_set_view(const ct_ckpt_shard_set *s, const char *name) {
    ct_param_view key;
    snprintf(key.name, sizeof key.name, "%s", name);
    return bsearch(&key, s->views, (size_t)s->n_views, sizeof *s->views, cmp_view_name);
}

/* ---------------------------------------------------------------- the shards */

/* The tensor `name` of a shard: F32, 1-D, hi - lo elements. */
static int shard_tensor(const ct_ckpt_shard *sh, const char *name, const ct_st_tensor **out, ct_err *err) {
    const ct_st_tensor *x = ct_st_find(sh->f, name);
    if (!x) return ct_errf(err, CT_ERR_DATA, "%s: no tensor \"%s\"", sh->path, name);
    if (x->ct_dtype != CT_F32 || x->shape.ndim != 1 || x->shape.d[0] != sh->hi - sh->lo)
        return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" is %s of %" PRId64 " elements; its range [%" PRId64
                       ", %" PRId64 ") needs F32 [%" PRId64 "]", sh->path, name, x->dtype, ct_st_numel(x), sh->lo,
                       sh->hi, sh->hi - sh->lo);
    *out = x;
    return CT_OK;
}

/* A shard's description (its metadata) against the index, then its tensors. */
static int check_shard(const ct_ckpt_shard_set *s, ct_ckpt_shard *sh, ct_err *err) {
    const char *meta = ct_st_meta(sh->f, CT_SHARD_META);
    cJSON *d = meta ? cJSON_Parse(meta) : NULL;
    int64_t rank, world, n_params;
    bool ok = d && json_int(d, "rank", 0, MAX_WORLD, &rank) && json_int(d, "world", 1, MAX_WORLD, &world) &&
              json_int(d, "lo", 0, MAX_INT53, &sh->lo) && json_int(d, "hi", 0, MAX_INT53, &sh->hi) &&
              json_int(d, "n_params", 0, MAX_INT53, &n_params);
    cJSON_Delete(d);
    if (!ok)
        return ct_errf(err, CT_ERR_DATA, "%s: no valid shard description (metadata \"%s\": {\"rank\", \"world\", "
                       "\"lo\", \"hi\", \"n_params\"} as integers)", sh->path, CT_SHARD_META);
    if (n_params != s->n_params)
        return ct_errf(err, CT_ERR_DATA, "%s: a shard of %" PRId64 " parameters, but %s describes %" PRId64
                       ": it belongs to another checkpoint", sh->path, n_params, s->index_path, s->n_params);
    if (world != s->world)
        return ct_errf(err, CT_ERR_DATA, "%s: a shard of %" PRId64 " ranks, but %s lists %d shards: it belongs to "
                       "another checkpoint", sh->path, world, s->index_path, s->world);
    if (sh->lo > sh->hi || sh->hi > s->n_params)
        return ct_errf(err, CT_ERR_DATA, "%s: range [%" PRId64 ", %" PRId64 ") is not inside [0, %" PRId64 ")",
                       sh->path, sh->lo, sh->hi, s->n_params);
    const char *slots = ct_st_meta(sh->f, "slots");
    if (!slots || strcmp(slots, s->slots) != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: optimizer slots \"%s\", but %s says \"%s\"", sh->path,
                       slots ? slots : "(none)", s->index_path, s->slots);
    int rc = shard_tensor(sh, "master", &sh->master, err);
    for (int k = 0; k < s->n_slots && !rc; k++) rc = shard_tensor(sh, s->slot_name[k], &sh->slot[k], err);
    if (!rc && sh->f->n_tensors != 1 + s->n_slots)
        rc = ct_errf(err, CT_ERR_DATA, "%s: %d tensors, expected %d (\"master\" and the slots)", sh->path,
                     sh->f->n_tensors, 1 + s->n_slots);
    return rc;
}

static int cmp_shard_range(const void *a, const void *b) {
    const ct_ckpt_shard *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->hi < y->hi ? -1 : x->hi > y->hi;
}

/* The ranges, in order, cover [0, n_params) exactly: no element in two shards, none in no shard.
 * (An empty range overlaps nothing.) */
static int check_coverage(ct_ckpt_shard_set *s, ct_err *err) {
    qsort(s->shards, (size_t)s->world, sizeof *s->shards, cmp_shard_range);
    int64_t covered = 0;
    const ct_ckpt_shard *prev = NULL;
    for (int r = 0; r < s->world; r++) {
        const ct_ckpt_shard *sh = &s->shards[r];
        if (sh->lo == sh->hi) continue;
        if (sh->lo < covered)
            return ct_errf(err, CT_ERR_DATA, "%s: range [%" PRId64 ", %" PRId64 ") overlaps [%" PRId64 ", %" PRId64
                           ") of %s: the shards are not one partition", sh->path, sh->lo, sh->hi, prev->lo,
                           prev->hi, prev->path);
        if (sh->lo > covered)
            return ct_errf(err, CT_ERR_DATA, "%s: range [%" PRId64 ", %" PRId64 ") leaves elements [%" PRId64
                           ", %" PRId64 ") in no shard (after %s): a shard is missing", sh->path, sh->lo, sh->hi,
                           covered, sh->lo, prev ? prev->file : "the start");
        covered = sh->hi;
        prev = sh;
    }
    if (covered != s->n_params)
        return ct_errf(err, CT_ERR_DATA, "%s: the last range ends at %" PRId64 ", leaving elements [%" PRId64 ", %"
                       PRId64 ") in no shard: a shard is missing", prev ? prev->path : s->index_path, covered,
                       covered, s->n_params);
    return CT_OK;
}

/* buffers.safetensors: exactly the index's non-trainable views, F32 of their shapes. */
static int check_buffers(const ct_ckpt_shard_set *s, ct_err *err) {
    int expect = 0;
    char a[96], b[96];
    for (int i = 0; i < s->n_views; i++) {
        const ct_param_view *v = &s->views[i];
        if (v->trainable) continue;
        expect++;
        const ct_st_tensor *x = ct_st_find(s->buffers, v->name);
        if (!x || x->ct_dtype != CT_F32 || !ct_shape_eq(&x->shape, &v->shape))
            return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" is %s; %s says F32 %s", s->buffers->path, v->name,
                           x ? ct_shape_str(&x->shape, a, sizeof a) : "missing", s->index_path,
                           ct_shape_str(&v->shape, b, sizeof b));
    }
    if (s->buffers->n_tensors != expect)
        return ct_errf(err, CT_ERR_DATA, "%s: %d tensors, but %s lists %d buffers", s->buffers->path,
                       s->buffers->n_tensors, s->index_path, expect);
    return CT_OK;
}

static int open_shards(const char *dir, ct_ckpt_shard_set *s, ct_err *err) {
    for (int r = 0; r < s->world; r++) {
        ct_ckpt_shard *sh = &s->shards[r];
        int rc = ct_fs_join(sh->path, sizeof sh->path, dir, sh->file, err);
        if (!rc && !(sh->f = ct_st_open(sh->path, err))) {
            rc = err && err->code ? err->code : CT_ERR_DATA;
            ct_err_append(err, "  (shard %d of the %d that %s lists)", r, s->world, s->index_path);
        }
        if (!rc) rc = check_shard(s, sh, err);
        if (rc) return rc;
    }
    char path[4200];
    int rc = ct_fs_join(path, sizeof path, dir, CT_SHARDS_BUFFERS, err);
    if (!rc && !(s->buffers = ct_st_open(path, err))) rc = err && err->code ? err->code : CT_ERR_DATA;
    if (!rc) rc = check_buffers(s, err);
    return rc ? rc : check_coverage(s, err);
}

int ct_ckpt_shard_set_open(const char *dir, ct_ckpt_shard_set **out, ct_err *err) {
    *out = NULL;
    ct_ckpt_shard_set *s = ct_xcalloc(1, sizeof *s);
    int rc = ct_fs_join(s->index_path, sizeof s->index_path, dir, CT_SHARDS_INDEX, err);
    char *text = rc ? NULL : ct_fs_read_small(s->index_path, 64u << 20, NULL);
    if (!rc && !text)
        rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot read: %s", s->index_path, strerror(errno));
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!rc && !j) rc = ct_errf(err, CT_ERR_DATA, "%s: not valid JSON", s->index_path);
    if (!rc) rc = parse_index(j, s, err);
    cJSON_Delete(j);
    if (!rc) rc = open_shards(dir, s, err);
    if (rc) {
        ct_ckpt_shard_set_close(s);
        return rc;
    }
    *out = s;
    return CT_OK;
}

void ct_ckpt_shard_set_close(ct_ckpt_shard_set *s) {
    if (!s) return;
    for (int r = 0; s->shards && r < s->world; r++) ct_st_close(s->shards[r].f);
    ct_st_close(s->buffers);
    free(s->shards);
    free(s->views);
    free(s);
}

/* ---------------------------------------------------------------- reading by range */

bool ct_ckpt_shard_overlaps(const ct_ckpt_shard *sh, int64_t a, int64_t b) {
    return sh->lo < b && a < sh->hi && sh->lo < sh->hi && a < b;
}

bool ct_ckpt_shard_set_read(const ct_ckpt_shard_set *s, int slot, int64_t a, int64_t b, float *dst) {
    if (a < 0 || b < a || b > s->n_params || slot < -1 || slot >= s->n_slots) return false;
    int64_t done = 0;
    for (int r = 0; r < s->world; r++) {
        const ct_ckpt_shard *sh = &s->shards[r];
        if (!ct_ckpt_shard_overlaps(sh, a, b)) continue;
        int64_t lo = a > sh->lo ? a : sh->lo, hi = b < sh->hi ? b : sh->hi;
        const ct_st_tensor *x = slot < 0 ? sh->master : sh->slot[slot];
        if (!ct_st_read_f32_range(x, lo - sh->lo, hi - lo, dst + (lo - a))) return false;
        done += hi - lo;
    }
    return done == b - a;   /* the coverage check makes it so; a set built otherwise is refused */
}

/* ckpt.c: checkpoint save (crash-safe protocol), resolve and load; see ckpt.h. */
#include "core/ckpt/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/util/fs.h"
#include "core/optim/optim.h"
#include "core/ckpt/safetensors.h"
#include "core/ckpt/shards.h"
#include "core/ckpt/source.h"
#include "core/ckpt/stage.h"

#define CKPT_MODEL "model.safetensors"
#define CKPT_OPTIM "optimizer.safetensors"
#define CKPT_STATE "state.json"
#define CKPT_CONFIG "config.json"
#define CKPT_PATH 4096

/* The marker records the CRC-32 of every file but config.json, and a load compares those of the
 * tensor files it reads (and of a sharded checkpoint's index) before anything is used; state.json's
 * is only compared to warn: state.json and config.json are text a user may edit, checked by
 * parsing them. */

/* ---------------------------------------------------------------- tensors and state */

void ct_ckpt_tensors_for(const ct_param_layout *L, const struct ct_optim *o, int64_t lo, int64_t hi,
                         float *params, float *buffers, ct_ckpt_tensors *out) {
    *out = (ct_ckpt_tensors){.views = L->views, .n_views = L->n_views, .n_params = L->n_params, .lo = lo,
                             .hi = hi, .params = params, .buffers = buffers, .n_buffers = L->n_buffers};
    if (!o) return;
    snprintf(out->optimizer, sizeof out->optimizer, "%s", ct_optim_type_name(o));
    const char *names[CT_OPTIM_MAX_SLOTS];
    float *data[CT_OPTIM_MAX_SLOTS];
    out->n_slots = ct_optim_slots(o, names, data);
    for (int s = 0; s < out->n_slots; s++) out->slot_name[s] = names[s], out->slot[s] = data[s];
}

void ct_ckpt_state_init(ct_ckpt_state *s) {
    memset(s, 0, sizeof *s);
    s->sched_t = -1;
    s->loss_scale = 1.0;
    s->best_value = NAN;
    s->es_best = NAN;
    s->best_step = -1;
    s->es_best_step = -1;
    s->last_eval_step = -1;
    s->epoch_sample = -1;
    s->train_loss = NAN;
    snprintf(s->version, sizeof s->version, "%s", CT_VERSION);
}

void ct_ckpt_config_hash(const cJSON *resolved, char out[17]) {
    char *text = resolved ? cJSON_PrintUnformatted(resolved) : NULL;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = text ? text : "null"; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ull;
    }
    free(text);
    snprintf(out, 17, "%016" PRIx64, h);
}

/* Remove the member at a dotted path ("data.transform.on_device") when it is there. */
static void delete_path(cJSON *root, const char *path) {
    char part[64];
    const char *dot;
    while (cJSON_IsObject(root) && (dot = strchr(path, '.'))) {
        snprintf(part, sizeof part, "%.*s", (int)(dot - path), path);
        root = cJSON_GetObjectItemCaseSensitive(root, part);
        path = dot + 1;
    }
    if (cJSON_IsObject(root)) cJSON_DeleteItemFromObjectCaseSensitive(root, path);
}

/* The experiment a resolved config describes: a copy without the keys outside cfg's identity
 * (cfg->not_identity), the same ones for both sides of a comparison. */
static cJSON *config_identity(const cJSON *resolved, const ct_config *cfg) {
    cJSON *c = resolved ? cJSON_Duplicate(resolved, 1) : cJSON_CreateNull();
    for (int i = 0; i < cfg->n_not_identity; i++) delete_path(c, cfg->not_identity[i]);
    return c;
}

/* Drop from a and b, at every depth, the object members the other lacks: a key one resolved
 * config does not have was not recorded there (written by a ctrain version before or after the
 * key existed), so it cannot tell two experiments apart. */
static void keep_common(cJSON *a, cJSON *b) {
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) return;
    for (cJSON *x = a->child, *next; x; x = next) {
        next = x->next;
        cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
        if (y) keep_common(x, y);
        else cJSON_Delete(cJSON_DetachItemViaPointer(a, x));
    }
    for (cJSON *y = b->child, *next; y; y = next) {
        next = y->next;
        if (!cJSON_GetObjectItemCaseSensitive(a, y->string)) cJSON_Delete(cJSON_DetachItemViaPointer(b, y));
    }
}

int ct_ckpt_experiment_diff(const cJSON *saved, const ct_config *cfg, char *buf, size_t n) {
    cJSON *ia = config_identity(saved, cfg), *ib = config_identity(cfg->resolved, cfg);
    keep_common(ia, ib);
    char none[1];
    int k = ct_ckpt_config_diff(ia, ib, buf ? buf : none, buf ? n : sizeof none);
    cJSON_Delete(ia);
    cJSON_Delete(ib);
    return k;
}

bool ct_ckpt_same_experiment(const cJSON *saved, const ct_config *cfg) {
    return ct_ckpt_experiment_diff(saved, cfg, NULL, 0) == 0;
}

bool ct_ckpt_view_in_bounds(const ct_ckpt_tensors *t, const ct_param_view *v) {
    int64_t lo = v->trainable ? t->lo : 0, hi = v->trainable ? t->hi : t->n_buffers;
    bool held = v->trainable ? t->params || t->params_mem : t->buffers != NULL;
    return held && v->offset >= lo && v->numel >= 0 && v->offset + v->numel <= hi &&
           ct_shape_numel(&v->shape) == v->numel;
}

bool ct_ckpt_view_part(const ct_ckpt_tensors *t, const ct_param_view *v, int64_t *first, int64_t *n) {
    *first = *n = 0;
    if (v->numel < 0 || v->offset < 0 || ct_shape_numel(&v->shape) != v->numel) return false;
    if (!v->trainable) {
        *n = v->numel;
        return t->buffers && v->offset + v->numel <= t->n_buffers;
    }
    if (v->offset + v->numel > t->n_params) return false;
    int64_t a = v->offset > t->lo ? v->offset : t->lo, b = v->offset + v->numel < t->hi ? v->offset + v->numel : t->hi;
    if (b > a) {
        *first = a - v->offset;
        *n = b - a;
    }
    return *n == 0 || t->params || t->params_mem;   /* memory without addresses has no pointer */
}

bool ct_ckpt_tensors_whole(const ct_ckpt_tensors *t) { return t->lo == 0 && t->hi == t->n_params; }

/* ---------------------------------------------------------------- state.json */

/* cJSON prints doubles with 15 significant digits when they compare "close enough", which can
 * lose the last bit; a resume must see exactly what was saved, so write 17 digits. */
static void add_exact(cJSON *j, const char *key, double v) {
    if (!isfinite(v)) {
        cJSON_AddNullToObject(j, key);
        return;
    }
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    cJSON_AddItemToObject(j, key, cJSON_CreateRaw(buf));
}

static cJSON *state_to_json(const ct_ckpt_state *s, const ct_ckpt_tensors *t) {
    cJSON *j = cJSON_CreateObject();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
    cJSON_AddNumberToObject(j, "step", (double)s->step);
    cJSON_AddNumberToObject(j, "applied", (double)s->applied);
    cJSON_AddNumberToObject(j, "sched_t", (double)s->sched_t);
    cJSON_AddNumberToObject(j, "skipped_steps", (double)s->skipped_steps);
    cJSON_AddNumberToObject(j, "epoch", s->epoch);
    cJSON_AddNumberToObject(j, "epoch_step", (double)s->epoch_step);
    if (s->epoch_sample >= 0) cJSON_AddNumberToObject(j, "epoch_sample", (double)s->epoch_sample);
    cJSON_AddNumberToObject(j, "samples_seen", (double)s->samples_seen);
    cJSON_AddNumberToObject(j, "micro_step", (double)s->micro_step);
    cJSON_AddStringToObject(j, "seed", seed); /* a string: u64 does not fit a JSON double */
    add_exact(j, "loss_scale", s->loss_scale);
    cJSON_AddNumberToObject(j, "scaler_good_steps", (double)s->scaler_good_steps);
    cJSON_AddNumberToObject(j, "scaler_hysteresis", s->scaler_hysteresis);
    add_exact(j, "best_value", s->best_value);
    cJSON_AddNumberToObject(j, "best_step", (double)s->best_step);
    add_exact(j, "es_best", s->es_best);
    cJSON_AddNumberToObject(j, "es_bad_evals", s->es_bad_evals);
    cJSON_AddNumberToObject(j, "es_best_step", (double)s->es_best_step);
    add_exact(j, "train_loss", s->train_loss);
    add_exact(j, "epoch_loss_sum", s->epoch_loss_sum);
    cJSON_AddNumberToObject(j, "epoch_loss_n", (double)s->epoch_loss_n);
    cJSON_AddNumberToObject(j, "last_eval_step", (double)s->last_eval_step);
    cJSON_AddStringToObject(j, "optimizer", t->optimizer);
    cJSON_AddStringToObject(j, "config_hash", s->config_hash);
    if (s->train_data[0] || s->eval_data[0]) {
        cJSON *d = cJSON_AddObjectToObject(j, "data_fingerprint");
        if (s->train_data[0]) cJSON_AddStringToObject(d, "train", s->train_data);
        if (s->eval_data[0]) cJSON_AddStringToObject(d, "eval", s->eval_data);
    }
    cJSON_AddStringToObject(j, "ctrain_version", s->version[0] ? s->version : CT_VERSION);
    return j;
}

static int state_long(const cJSON *j, const char *key, long *out, const char *file, ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 9007199254740992.0)
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\": expected an integer", file, key);
    *out = (long)v->valuedouble;
    return CT_OK;
}

static int state_double(const cJSON *j, const char *key, double *out, const char *file,
                        ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsNull(v)) { *out = NAN; return CT_OK; }
    if (!cJSON_IsNumber(v))
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\": expected a number or null", file, key);
    *out = v->valuedouble;
    return CT_OK;
}

static int state_string(const cJSON *j, const char *key, char *out, size_t n, const char *file,
                        ct_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n)
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\": expected a string of at most %zu bytes",
                       file, key, n - 1);
    snprintf(out, n, "%s", v->valuestring);
    return CT_OK;
}

static int state_from_json(const cJSON *j, ct_ckpt_state *s, const char *file, ct_err *err) {
    if (!cJSON_IsObject(j)) return ct_errf(err, CT_ERR_DATA, "%s: not a JSON object", file);
    ct_ckpt_state_init(s);
    struct { const char *key; long *dst; } longs[] = {
        {"step", &s->step}, {"applied", &s->applied}, {"sched_t", &s->sched_t},
        {"skipped_steps", &s->skipped_steps}, {"epoch_step", &s->epoch_step},
        {"samples_seen", &s->samples_seen}, {"micro_step", &s->micro_step},
        {"scaler_good_steps", &s->scaler_good_steps}, {"best_step", &s->best_step},
        {"epoch_loss_n", &s->epoch_loss_n}, {"last_eval_step", &s->last_eval_step}};
    for (int i = 0; i < CT_ARRAY_LEN(longs); i++) {
        int rc = state_long(j, longs[i].key, longs[i].dst, file, err);
        if (rc) return rc;
    }
    long epoch, hyst, bad;
    char seed[32];
    int rc = state_long(j, "epoch", &epoch, file, err);
    if (!rc) rc = state_long(j, "scaler_hysteresis", &hyst, file, err);
    if (!rc) rc = state_long(j, "es_bad_evals", &bad, file, err);
    /* Added after the first checkpoints were written: optional. */
    if (!rc && cJSON_GetObjectItemCaseSensitive(j, "es_best_step"))
        rc = state_long(j, "es_best_step", &s->es_best_step, file, err);
    bool has_sample = cJSON_GetObjectItemCaseSensitive(j, "epoch_sample") != NULL;
    if (!rc && has_sample) rc = state_long(j, "epoch_sample", &s->epoch_sample, file, err);
    if (!rc && has_sample && s->epoch_sample < 0)
        rc = ct_errf(err, CT_ERR_DATA, "%s: \"epoch_sample\": expected an integer >= 0", file);
    if (!rc) rc = state_double(j, "loss_scale", &s->loss_scale, file, err);
    if (!rc) rc = state_double(j, "best_value", &s->best_value, file, err);
    if (!rc) rc = state_double(j, "es_best", &s->es_best, file, err);
    if (!rc) rc = state_double(j, "train_loss", &s->train_loss, file, err);
    if (!rc) rc = state_double(j, "epoch_loss_sum", &s->epoch_loss_sum, file, err);
    if (!rc) rc = state_string(j, "seed", seed, sizeof seed, file, err);
    if (!rc) rc = state_string(j, "config_hash", s->config_hash, sizeof s->config_hash, file, err);
    if (!rc) rc = state_string(j, "ctrain_version", s->version, sizeof s->version, file, err);
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(j, "data_fingerprint");
    if (!rc && fp && !cJSON_IsObject(fp))
        rc = ct_errf(err, CT_ERR_DATA, "%s: \"data_fingerprint\": expected an object", file);
    if (!rc && cJSON_GetObjectItemCaseSensitive(fp, "train"))
        rc = state_string(fp, "train", s->train_data, sizeof s->train_data, file, err);
    if (!rc && cJSON_GetObjectItemCaseSensitive(fp, "eval"))
        rc = state_string(fp, "eval", s->eval_data, sizeof s->eval_data, file, err);
    if (rc) return rc;
    char *end = NULL;
    errno = 0;
    unsigned long long sv = strtoull(seed, &end, 10);
    if (errno || !seed[0] || *end || seed[0] == '-')
        return ct_errf(err, CT_ERR_DATA, "%s: \"seed\": expected a decimal u64 string", file);
    if (s->step < 0 || epoch < 0 || epoch > 1000000000L || s->epoch_step < 0 || hyst < 0 ||
        hyst > 1000000000L || bad < 0 || bad > 1000000000L)
        return ct_errf(err, CT_ERR_DATA, "%s: negative or out-of-range counter", file);
    s->seed = sv;
    s->epoch = (int)epoch;
    s->scaler_hysteresis = (int)hyst;
    s->es_bad_evals = (int)bad;
    return CT_OK;
}

/* ---------------------------------------------------------------- writing a directory */

static int fault(const ct_ckpt_save_opts *o, const char *stage, ct_err *err) {
    if (o && o->fault && o->fault(o->fault_ctx, stage))
        return ct_errf(err, CT_ERR_RUNTIME, "checkpoint save aborted after %s (fault injected)",
                       stage);
    return CT_OK;
}

/* model.safetensors: every view by name, straight from t's memory (a device's in chunks through
 * the writer's one staging buffer). */
static int write_model(const char *dir, const ct_ckpt_tensors *t, const char *tag, uint32_t *crc,
                       ct_err *err) {
    ct_st_entry *e = ct_xcalloc((size_t)t->n_views + 1, sizeof *e);
    ct_ckpt_loc *span = ct_xcalloc((size_t)t->n_views + 1, sizeof *span);
    int rc = CT_OK;
    for (int i = 0; i < t->n_views && !rc; i++) {
        const ct_param_view *v = &t->views[i];
        if (!ct_ckpt_view_in_bounds(t, v))
            rc = ct_errf(err, CT_ERR_RUNTIME, "checkpoint: view \"%s\" lies outside its buffer", v->name);
        else
            ct_ckpt_entry(&e[i], v->name, v->shape, ct_ckpt_view_loc(t, v, 0), &span[i]);
    }
    const char *mk[] = {"format", "ctrain_version", "tag"};
    const char *mv[] = {"pt", CT_VERSION, tag};
    char path[CKPT_PATH];
    if (!rc) rc = ct_fs_join(path, sizeof path, dir, CKPT_MODEL, err);
    if (!rc) rc = ct_st_write_crc(path, e, t->n_views, mk, mv, 3, crc, err);
    free(span);
    free(e);
    return rc;
}

void ct_ckpt_slot_list(const ct_ckpt_tensors *t, char *buf, size_t n) {
    buf[0] = 0;
    for (int s = 0; s < t->n_slots; s++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", s ? "," : "", t->slot_name[s]);
}

static int write_optim(const char *dir, const ct_ckpt_tensors *t, uint32_t *crc, ct_err *err) {
    int cap = t->n_views * (t->n_slots ? t->n_slots : 1) + 1, n = 0;
    ct_st_entry *e = ct_xcalloc((size_t)cap, sizeof *e);
    ct_ckpt_loc *span = ct_xcalloc((size_t)cap, sizeof *span);
    char (*names)[160] = ct_xcalloc((size_t)cap, sizeof *names);
    for (int i = 0; i < t->n_views; i++) {
        const ct_param_view *v = &t->views[i];
        if (!v->trainable) continue;
        for (int s = 0; s < t->n_slots; s++, n++) {
            snprintf(names[n], sizeof names[n], "%s.%s", v->name, t->slot_name[s]);
            ct_ckpt_entry(&e[n], names[n], v->shape, ct_ckpt_slot_loc(t, s, v, 0), &span[n]);
        }
    }
    char slots[128];
    ct_ckpt_slot_list(t, slots, sizeof slots);
    const char *mk[] = {"optimizer", "slots", "ctrain_version"};
    const char *mv[] = {t->optimizer, slots, CT_VERSION};
    char path[CKPT_PATH];
    int rc = ct_fs_join(path, sizeof path, dir, CKPT_OPTIM, err);
    if (!rc) rc = ct_st_write_crc(path, e, n, mk, mv, 3, crc, err);
    free(names);
    free(span);
    free(e);
    return rc;
}

static int write_json(const char *dir, const char *name, const cJSON *j, ct_err *err) {
    char path[CKPT_PATH];
    int rc = ct_fs_join(path, sizeof path, dir, name, err);
    if (rc) return rc;
    char *text = j ? cJSON_Print(j) : NULL;
    const char *body = text ? text : "null";
    char *withnl = ct_xmalloc(strlen(body) + 2);
    sprintf(withnl, "%s\n", body);
    rc = ct_fs_write_sync(path, withnl, strlen(withnl), err);
    free(withnl);
    free(text);
    return rc;
}

/* CRC-32 of a whole file. */
static int file_crc(const char *path, uint32_t *out, ct_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = ct_xmalloc(CHUNK);
    uLong crc = crc32(0L, Z_NULL, 0);
    size_t k;
    while ((k = fread(buf, 1, CHUNK, f)) > 0) crc = crc32(crc, buf, (uInt)k);
    int bad = ferror(f), e = errno;
    fclose(f);
    free(buf);
    if (bad) return ct_errf(err, ct_err_io(e, CT_ERR_DATA), "%s: cannot read: %s", path, strerror(e));
    *out = (uint32_t)crc;
    return CT_OK;
}

/* A file the marker lists, and the CRC-32 of its bytes as written (config.json: none). */
typedef struct marker_file {
    char name[CT_SHARDS_NAME];
    bool has_crc;
    uint32_t crc;
} marker_file;

/* The marker lists every file with its size, so a truncated file is caught before parsing, and
 * the CRC-32 of each but config.json (computed while writing it), so flipped bytes are caught
 * before a tensor is used, and a resume can say that state.json changed since (it is text a user
 * may edit: a warning, not a refusal). */
static int write_marker(const char *dir, const char *tag, const marker_file *files, int n, ct_err *err) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "tag", tag);
    cJSON *f = cJSON_AddObjectToObject(j, "files");
    cJSON *c = cJSON_CreateObject();
    int rc = CT_OK;
    for (int i = 0; i < n && !rc; i++) {
        char path[CKPT_PATH];
        struct stat st;
        rc = ct_fs_join(path, sizeof path, dir, files[i].name, err);
        if (!rc && stat(path, &st) != 0)
            rc = ct_errf(err, CT_ERR_RUNTIME, "%s: %s", path, strerror(errno));
        if (!rc) cJSON_AddNumberToObject(f, files[i].name, (double)st.st_size);
        char hex[9];
        snprintf(hex, sizeof hex, "%08" PRIx32, files[i].crc);
        if (files[i].has_crc) cJSON_AddStringToObject(c, files[i].name, hex);
    }
    cJSON_AddItemToObject(j, "crc32", c);
    if (!rc) rc = write_json(dir, CT_CKPT_MARKER, j, err);
    cJSON_Delete(j);
    return rc;
}

static marker_file with_crc(const char *name, uint32_t crc) {
    marker_file m = {.has_crc = true, .crc = crc};
    snprintf(m.name, sizeof m.name, "%s", name);
    return m;
}

/* state.json, config.json, the marker listing them after `files` (n of them, written already):
 * the last steps of every save into the temporary directory dir. */
static int write_rest(const char *dir, const ct_ckpt_tensors *t, const ct_ckpt_state *s, const cJSON *config,
                      const char *tag, marker_file *files, int n, const ct_ckpt_save_opts *o, ct_err *err) {
    char state_path[CKPT_PATH];
    uint32_t state_crc = 0;
    cJSON *sj = state_to_json(s, t);
    int rc = write_json(dir, CKPT_STATE, sj, err);
    cJSON_Delete(sj);
    if (!rc) rc = ct_fs_join(state_path, sizeof state_path, dir, CKPT_STATE, err);
    if (!rc) rc = file_crc(state_path, &state_crc, err);   /* a few hundred bytes, just written */
    if (!rc) rc = fault(o, CKPT_STATE, err);
    if (!rc) rc = write_json(dir, CKPT_CONFIG, config, err);
    if (!rc) rc = fault(o, CKPT_CONFIG, err);
    files[n++] = with_crc(CKPT_STATE, state_crc);
    files[n] = (marker_file){.name = CKPT_CONFIG};
    if (!rc) rc = write_marker(dir, tag, files, n + 1, err);
    if (!rc) rc = fault(o, CT_CKPT_MARKER, err);
    if (!rc) rc = ct_fs_sync_dir(dir, err);
    return rc;
}

static int write_all(const char *dir, const ct_ckpt_tensors *t, const ct_ckpt_state *s,
                     const cJSON *config, const char *tag, const ct_ckpt_save_opts *o,
                     ct_err *err) {
    uint32_t crc[2];
    int rc = write_model(dir, t, tag, &crc[0], err);
    if (!rc) rc = fault(o, CKPT_MODEL, err);
    if (!rc) rc = write_optim(dir, t, &crc[1], err);
    if (!rc) rc = fault(o, CKPT_OPTIM, err);
    marker_file files[4] = {with_crc(CKPT_MODEL, crc[0]), with_crc(CKPT_OPTIM, crc[1])};
    return rc ? rc : write_rest(dir, t, s, config, tag, files, 2, o, err);
}

/* A stale ".tmp-<name>-<pid>" or ".old-<name>-<pid>" whose <name> is missing: a save died between
 * moving the old checkpoint aside and renaming the new one into place. Put a complete one back
 * instead of deleting the only copy. Returns true when it was moved into place. */
static bool recover_stale(const char *save_dir, const char *nm) {
    const char *start = nm + 5, *dash = strrchr(nm, '-');
    if (!dash || dash <= start) return false;
    char name[256], final[CKPT_PATH], path[CKPT_PATH];
    snprintf(name, sizeof name, "%.*s", (int)(dash - start), start);
    if (snprintf(final, sizeof final, "%s/%s", save_dir, name) >= (int)sizeof final ||
        snprintf(path, sizeof path, "%s/%s", save_dir, nm) >= (int)sizeof path)
        return false;
    if (ct_fs_exists(final) || !ct_ckpt_is_complete(path) || rename(path, final) != 0) return false;
    ct_fs_sync_dir(save_dir, NULL);
    return true;
}

/* Leftovers of saves that died (".tmp-*", ".old-*", "latest.tmp-*", and ".del-*" of a keep_last
 * removal, with a pid that is ours or no longer running) are removed before a new save, after
 * recover_stale() had its chance: the new copy (".tmp-") first, then the one moved aside
 * (".old-"). */
static void remove_stale(const char *save_dir) {
    static const char *const passes[] = {".tmp-", ".old-", "latest.tmp-", ".del-"};
    for (int pass = 0; pass < CT_ARRAY_LEN(passes); pass++) {
        DIR *d = opendir(save_dir);
        if (!d) return;
        struct dirent *de;
        while ((de = readdir(d))) {
            const char *nm = de->d_name;
            if (strncmp(nm, passes[pass], strlen(passes[pass])) != 0) continue;
            const char *dash = strrchr(nm, '-');
            long pid = dash ? strtol(dash + 1, NULL, 10) : 0;
            if (pid <= 0 || (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)))
                continue;
            if (pass < 2 && recover_stale(save_dir, nm)) continue;
            char path[CKPT_PATH];
            if (snprintf(path, sizeof path, "%s/%s", save_dir, nm) < (int)sizeof path)
                ct_fs_remove_tree(path);
        }
        closedir(d);
    }
}

/* Rename tmp to <save_dir>/<name>, moving an existing one aside first (rename(2) cannot replace
 * a non-empty directory), then fsync save_dir and drop the old one. An existing directory that is
 * not a complete checkpoint was not written by a save (another tool's, such as DeepSpeed's
 * checkpoint of the same step, or an interrupted copy): it is moved to <name>.incomplete-<pid>
 * and kept. */
static int install_dir(const char *save_dir, const char *tmp, const char *name,
                       const ct_ckpt_save_opts *o, ct_err *err) {
    char final[CKPT_PATH], old[CKPT_PATH];
    int rc = ct_fs_join(final, sizeof final, save_dir, name, err);
    if (rc) return rc;
    bool had_old = ct_fs_exists(final), keep_old = had_old && !ct_ckpt_is_complete(final);
    snprintf(old, sizeof old, keep_old ? "%s/%s.incomplete-%ld" : "%s/.old-%s-%ld", save_dir, name,
             (long)getpid());
    if (had_old && rename(final, old) != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot move aside: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        rc = ct_errf(err, CT_ERR_RUNTIME, "%s: cannot rename to %s: %s", tmp, final,
                     strerror(errno));
        if (had_old) rename(old, final); /* put the previous one back */
        return rc;
    }
    rc = fault(o, "rename", err);
    if (!rc) rc = ct_fs_sync_dir(save_dir, err);
    if (!rc && had_old && !keep_old) ct_fs_remove_tree(old);
    return rc;
}

/* global_step<N> with N all digits -> N, else -1. */
static long tag_step(const char *name) {
    if (strncmp(name, "global_step", 11) != 0 || !name[11]) return -1;
    long v = 0;
    for (const char *p = name + 11; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000000000L) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_long_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the global_step* directories in save_dir, newest first (caller frees). */
static long *list_steps(const char *save_dir, int *n_out) {
    int n = 0, cap = 16;
    long *steps = ct_xmalloc(sizeof(long) * (size_t)cap);
    DIR *d = opendir(save_dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        long s = tag_step(de->d_name);
        if (s < 0) continue;
        if (n == cap) steps = ct_xrealloc(steps, sizeof(long) * (size_t)(cap *= 2));
        steps[n++] = s;
    }
    if (d) closedir(d);
    qsort(steps, (size_t)n, sizeof(long), cmp_long_desc);
    *n_out = n;
    return steps;
}

static int read_json_file(const char *dir, const char *name, cJSON **out, ct_err *err);

typedef enum { PRUNE_OWNED, PRUNE_INCOMPLETE, PRUNE_FOREIGN } prune_kind;

/* What keep_last may do with dir: count and remove it only when it is a complete checkpoint of
 * owner's experiment. */
static prune_kind classify(const char *dir, const ct_config *owner) {
    if (!ct_ckpt_is_complete(dir)) return PRUNE_INCOMPLETE;
    if (!owner) return PRUNE_OWNED;
    cJSON *saved = NULL;
    bool same = read_json_file(dir, CKPT_CONFIG, &saved, NULL) == CT_OK &&
                ct_ckpt_same_experiment(saved, owner);
    cJSON_Delete(saved);
    return same ? PRUNE_OWNED : PRUNE_FOREIGN;
}

/* A checkpoint keep_last removes is first renamed to .del-<tag>-<pid> (atomic): a process killed
 * while deleting its files leaves no global_step* with a marker and files missing, only scratch
 * that the next save removes. */
static void remove_checkpoint(const char *save_dir, const char *path, long step) {
    char del[CKPT_PATH];
    if (snprintf(del, sizeof del, "%s/.del-global_step%ld-%ld", save_dir, step, (long)getpid()) >= (int)sizeof del ||
        rename(path, del) != 0)
        snprintf(del, sizeof del, "%s", path);
    ct_fs_remove_tree(del);
}

void ct_ckpt_prune(const char *save_dir, long anchor, int keep_last, const ct_config *owner,
                   ct_warnings *warn) {
    int n;
    long *steps = list_steps(save_dir, &n);
    int kept = 1; /* the anchor */
    for (int i = 0; i < n; i++) {
        bool removable = keep_last > 0 && steps[i] < anchor;
        if (!removable && !warn) continue;
        char path[CKPT_PATH];
        snprintf(path, sizeof path, "%s/global_step%ld", save_dir, steps[i]);
        prune_kind k = classify(path, owner);
        if (k == PRUNE_INCOMPLETE && warn)
            ct_warnf(warn, "%s: not a complete checkpoint (no valid %s marker): never loaded, and "
                     "not removed by keep_last; delete it yourself if it is not needed", path,
                     CT_CKPT_MARKER);
        else if (k == PRUNE_FOREIGN && warn)
            ct_warnf(warn, "%s: saved by another config (its %s differs in more than run length, "
                     "outputs or logging): keep_last neither counts nor removes it", path,
                     CKPT_CONFIG);
        if (k != PRUNE_OWNED || !removable) continue;
        if (kept < keep_last) {
            kept++;
            continue;
        }
        remove_checkpoint(save_dir, path, steps[i]);
    }
    free(steps);
}

/* <save_dir>/.tmp-<name>-<pid>: the temporary directory of a save whose (rank 0's) process is pid. */
int ct_ckpt_tmp_dir(const char *save_dir, const char *name, long pid, char *tmp, size_t n, ct_err *err) {
    if (snprintf(tmp, n, "%s/.tmp-%s-%ld", save_dir, name, pid) >= (int)n)
        return ct_errf(err, CT_ERR_RUNTIME, "path too long: %s", save_dir);
    return CT_OK;
}

int ct_ckpt_begin(const char *save_dir, const char *name, long pid, ct_err *err) {
    char tmp[CKPT_PATH];
    int rc = ct_fs_mkdirs(save_dir, err);
    if (!rc) rc = ct_ckpt_tmp_dir(save_dir, name, pid, tmp, sizeof tmp, err);
    if (rc) return rc;
    remove_stale(save_dir);
    ct_fs_remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create directory: %s", tmp, strerror(errno));
    return CT_OK;
}

void ct_ckpt_abort(const char *save_dir, const char *name, long pid, const ct_ckpt_save_opts *o) {
    char tmp[CKPT_PATH];
    /* A failed save (disk full, ...) frees its space; with a fault hook (tests) the leftovers
     * stay, as after a real crash. */
    if (!(o && o->fault) && ct_ckpt_tmp_dir(save_dir, name, pid, tmp, sizeof tmp, NULL) == CT_OK)
        ct_fs_remove_tree(tmp);
}

/* The written temporary directory takes its place as <save_dir>/<name>; for a global_step (not
 * best/) latest is replaced, then keep_last applied. */
static int finish(const char *save_dir, const char *name, const char *tmp, const ct_ckpt_state *state,
                  const ct_ckpt_save_opts *opts, char *out_dir, size_t out_n, ct_err *err) {
    bool step = strcmp(name, "best") != 0;
    int rc = install_dir(save_dir, tmp, name, opts, err);
    if (!rc && step && !(opts && opts->skip_latest)) {
        rc = ct_fs_replace_file(save_dir, "latest", name, strlen(name), err);
        if (!rc) rc = fault(opts, "latest", err);
    }
    if (rc) return rc;
    if (step && opts) ct_ckpt_prune(save_dir, state->step, opts->keep_last, opts->owner, NULL);
    if (out_dir) snprintf(out_dir, out_n, "%s/%s", save_dir, name);
    return CT_OK;
}

static int save_as(const char *save_dir, const char *name, const ct_ckpt_tensors *t,
                   const ct_ckpt_state *s, const cJSON *config, const ct_ckpt_save_opts *o,
                   char *out_dir, size_t out_n, ct_err *err) {
    long pid = (long)getpid();
    char tmp[CKPT_PATH];
    int rc = ct_ckpt_begin(save_dir, name, pid, err);
    if (!rc) rc = ct_ckpt_tmp_dir(save_dir, name, pid, tmp, sizeof tmp, err);
    if (rc) return rc;
    rc = write_all(tmp, t, s, config, name, o, err);
    if (!rc) rc = finish(save_dir, name, tmp, s, o, out_dir, out_n, err);
    if (rc) ct_ckpt_abort(save_dir, name, pid, o);
    return rc;
}

void ct_ckpt_tag(long step, char out[CT_CKPT_TAG]) { snprintf(out, CT_CKPT_TAG, "global_step%ld", step); }

int ct_ckpt_save(const char *save_dir, const ct_ckpt_tensors *t, const ct_ckpt_state *state,
                 const cJSON *config, const ct_ckpt_save_opts *opts, char *out_dir, size_t out_n,
                 ct_err *err) {
    char tag[CT_CKPT_TAG];
    ct_ckpt_tag(state->step, tag);
    return save_as(save_dir, tag, t, state, config, opts, out_dir, out_n, err);
}

int ct_ckpt_save_best(const char *save_dir, const ct_ckpt_tensors *t, const ct_ckpt_state *state,
                      const cJSON *config, ct_err *err) {
    return save_as(save_dir, "best", t, state, config, NULL, NULL, 0, err);
}

int ct_ckpt_commit_shards(const char *save_dir, const char *name, long pid, const ct_ckpt_tensors *t, int world,
                          const uint32_t *crc, const ct_ckpt_state *state, const cJSON *config,
                          const ct_ckpt_save_opts *opts, char *out_dir, size_t out_n, ct_err *err) {
    char tmp[CKPT_PATH];
    uint32_t index_crc[2];
    marker_file *files = ct_xcalloc((size_t)world + 4, sizeof *files);
    int rc = ct_ckpt_tmp_dir(save_dir, name, pid, tmp, sizeof tmp, err);
    if (!rc) rc = ct_ckpt_shard_write_index(tmp, t, world, index_crc, err);
    for (int r = 0; r < world; r++) {
        char shard[CT_SHARDS_NAME];
        ct_ckpt_shard_file_name(r, world, shard);
        files[r] = with_crc(shard, crc[r]);
    }
    files[world] = with_crc(CT_SHARDS_INDEX, index_crc[0]);
    files[world + 1] = with_crc(CT_SHARDS_BUFFERS, index_crc[1]);
    if (!rc) rc = fault(opts, CT_SHARDS_INDEX, err);
    if (!rc) rc = write_rest(tmp, t, state, config, name, files, world + 2, opts, err);
    if (!rc) rc = finish(save_dir, name, tmp, state, opts, out_dir, out_n, err);
    if (rc) ct_ckpt_abort(save_dir, name, pid, opts);
    free(files);
    return rc;
}

/* ---------------------------------------------------------------- completeness and resolve */

/* CT_OK when dir's marker lists files that exist with those sizes; CT_ERR_DATA saying why not. */
static int check_marker(const char *dir, ct_err *err) {
    char path[CKPT_PATH];
    int rc = ct_fs_join(path, sizeof path, dir, CT_CKPT_MARKER, err);
    if (rc) return rc;
    char *text = ct_fs_read_small(path, 16u << 20, NULL);   /* a sharded one lists every rank's file */
    if (!text)
        return ct_errf(err, CT_ERR_DATA, "%s: incomplete checkpoint (no readable %s marker)", dir,
                       CT_CKPT_MARKER);
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    /* one file set (model.safetensors), or per-rank shards (their index) */
    if (!cJSON_IsObject(files) || (!cJSON_GetObjectItemCaseSensitive(files, CKPT_MODEL) &&
                                   !cJSON_GetObjectItemCaseSensitive(files, CT_SHARDS_INDEX)))
        rc = ct_errf(err, CT_ERR_DATA, "%s: marker is not valid", path);
    for (const cJSON *f = rc ? NULL : files->child; f && !rc; f = f->next) {
        char fp[CKPT_PATH];
        struct stat st;
        if (strchr(f->string, '/') || !cJSON_IsNumber(f) || f->valuedouble < 0) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: marker is not valid", path);
        } else if (ct_fs_join(fp, sizeof fp, dir, f->string, err) != CT_OK ||
                   stat(fp, &st) != 0) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: missing (listed in %s)", fp, CT_CKPT_MARKER);
        } else if ((double)st.st_size != f->valuedouble) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: %lld bytes, the checkpoint wrote %.0f (truncated or "
                         "modified)", fp, (long long)st.st_size, f->valuedouble);
        }
    }
    cJSON_Delete(j);
    return rc;
}

bool ct_ckpt_is_complete(const char *dir) { return check_marker(dir, NULL) == CT_OK; }


/* Where to resume from when the checkpoint dir cannot be trusted: the newest complete
 * global_step* beside it (in its parent directory), older than it when dir is a global_step<N>
 * itself. out = "" when there is none. */
static void previous_complete(const char *dir, char *out, size_t n) {
    char self[CKPT_PATH], parent[CKPT_PATH];
    snprintf(self, sizeof self, "%s", dir);
    for (size_t len = strlen(self); len > 1 && self[len - 1] == '/'; len--) self[len - 1] = 0;
    const char *base = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
    long step = tag_step(base);
    ct_fs_parent(self, parent, sizeof parent);
    out[0] = 0;
    int k;
    long *steps = list_steps(parent, &k);
    for (int i = 0; i < k && !out[0]; i++) {
        char path[CKPT_PATH];
        if ((step >= 0 && steps[i] >= step) ||
            snprintf(path, sizeof path, "%s/global_step%ld", parent, steps[i]) >= (int)sizeof path)
            continue;
        if (ct_ckpt_is_complete(path) && snprintf(out, n, "%s", path) >= (int)n) out[0] = 0;
    }
    free(steps);
}

/* Compare the CRC-32 the marker recorded for each of the n files `names` with the file's bytes
 * now. *n_checked (may be NULL): files compared; 0 when the marker records none (written before
 * checksums were: such a checkpoint is trusted on its sizes, as it was then). A mismatch is
 * CT_ERR_DATA naming the file and the checkpoint to take instead. */
static int verify_crcs(const char *dir, const char *const *names, int n, int *n_checked, ct_err *err) {
    if (n_checked) *n_checked = 0;
    cJSON *m = NULL;
    int rc = read_json_file(dir, CT_CKPT_MARKER, &m, err);
    const cJSON *sums = rc ? NULL : cJSON_GetObjectItemCaseSensitive(m, "crc32");
    for (int i = 0; i < n && sums && !rc; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(sums, names[i]);
        char path[CKPT_PATH], *end = NULL;
        unsigned long want = cJSON_IsString(v) ? strtoul(v->valuestring, &end, 16) : 0;
        uint32_t have = 0;
        rc = ct_fs_join(path, sizeof path, dir, names[i], err);
        if (!rc && (!end || *end || strlen(v->valuestring) != 8))
            rc = ct_errf(err, CT_ERR_DATA, "%s/%s: marker is not valid (crc32 of %s)", dir,
                         CT_CKPT_MARKER, names[i]);
        if (!rc) rc = file_crc(path, &have, err);
        if (rc) break;
        if (n_checked) ++*n_checked;
        if (have == (uint32_t)want) continue;
        char prev[CKPT_PATH];
        previous_complete(dir, prev, sizeof prev);
        rc = ct_errf(err, CT_ERR_DATA, "%s: checksum mismatch: CRC-32 %08" PRIx32 ", but checkpoint %s "
                     "recorded %08lx when it wrote the file: its bytes changed after the save (a disk, "
                     "memory or copy error, or an edit), so the checkpoint cannot be trusted; nothing "
                     "was loaded from it.", path, have, dir, want);
        if (prev[0])
            ct_err_append(err, "  Resume from another checkpoint: --resume %s (the previous complete one)",
                          prev);
        else
            ct_err_append(err, "  There is no other complete checkpoint beside it: restore this one "
                          "from a copy, or start again without --resume.");
    }
    cJSON_Delete(m);
    return rc;
}

/* The files of dir's marker whose checksum a load compares: all but state.json and config.json
 * (text a user may edit). *n receives their number; the caller frees the list. */
static char **checked_files(const char *dir, int *n) {
    cJSON *m = NULL;
    *n = 0;
    if (read_json_file(dir, CT_CKPT_MARKER, &m, NULL)) return NULL;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files");
    char **names = ct_xcalloc((size_t)cJSON_GetArraySize(files) + 1, sizeof *names);
    for (const cJSON *f = cJSON_IsObject(files) ? files->child : NULL; f; f = f->next)
        if (strcmp(f->string, CKPT_STATE) != 0 && strcmp(f->string, CKPT_CONFIG) != 0)
            names[(*n)++] = ct_xstrdup(f->string);
    cJSON_Delete(m);
    return names;
}

int ct_ckpt_verify(const char *dir, int *n_checked, ct_err *err) {
    if (n_checked) *n_checked = 0;
    int rc = check_marker(dir, err);
    if (rc) return rc;
    int n;
    char **names = checked_files(dir, &n);
    rc = verify_crcs(dir, (const char *const *)names, n, n_checked, err);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

/* Newest complete global_step* in save_dir into out, or "" when none. */
static void newest_complete(const char *save_dir, char *out, size_t n) {
    int k;
    long *steps = list_steps(save_dir, &k);
    out[0] = 0;
    for (int i = 0; i < k; i++) {
        char path[CKPT_PATH];
        snprintf(path, sizeof path, "%s/global_step%ld", save_dir, steps[i]);
        if (ct_ckpt_is_complete(path)) {
            snprintf(out, n, "%s", path);
            break;
        }
    }
    free(steps);
}

/* Through `latest`, falling back to the newest complete checkpoint. */
static void resolve_save_dir(const char *save_dir, char *out, size_t n, ct_warnings *warn) {
    char path[CKPT_PATH];
    out[0] = 0;
    snprintf(path, sizeof path, "%s/latest", save_dir);
    char *tag = ct_fs_read_small(path, 255, NULL);
    int e = errno;
    if (tag) {
        tag[strcspn(tag, "\r\n")] = 0;
        char dir[CKPT_PATH];
        bool plain = tag[0] && !strchr(tag, '/') && strcmp(tag, ".") && strcmp(tag, "..");
        if (plain && snprintf(dir, sizeof dir, "%s/%s", save_dir, tag) < (int)sizeof dir &&
            ct_ckpt_is_complete(dir)) {
            snprintf(out, n, "%s", dir);
            free(tag);
            return;
        }
    }
    newest_complete(save_dir, out, n);
    if (out[0] && warn)
        ct_warnf(warn, "%s/latest %s%s; resuming from the newest complete checkpoint %s", save_dir,
                 tag ? "names a missing or incomplete checkpoint" : e == ENOENT ? "is missing" : "cannot be read: ",
                 tag || e == ENOENT ? "" : strerror(e), out);
    free(tag);
}

/* --resume auto found nothing to load in save_dir: CT_OK (a fresh start) when nothing was ever
 * saved there (no latest, no global_step*); else CT_ERR_DATA saying what is damaged: a resume asked
 * to continue a run must not quietly start it again from step 0. */
static int nothing_to_resume(const char *save_dir, ct_err *err) {
    char path[CKPT_PATH], newest[CKPT_PATH];
    struct stat st;
    snprintf(path, sizeof path, "%s/latest", save_dir);
    bool latest = lstat(path, &st) == 0;
    int k;
    long *steps = list_steps(save_dir, &k);
    if (k > 0) snprintf(newest, sizeof newest, "%s/global_step%ld", save_dir, steps[0]);
    free(steps);
    if (!latest && k == 0) return CT_OK;
    ct_err why = {0};
    if (k > 0) {
        check_marker(newest, &why);
    } else {
        size_t len;
        char *tag = ct_fs_read_small(path, 255, &len);
        if (!tag) ct_errf(&why, CT_ERR_DATA, "%s: cannot be read: %s", path, strerror(errno));
        else ct_errf(&why, CT_ERR_DATA, "%s names \"%.*s\", which is not there", path, (int)strcspn(tag, "\r\n"), tag);
        free(tag);
    }
    ct_errf(err, CT_ERR_DATA, "--resume auto: %s holds no checkpoint that can be loaded%s%s: %s", save_dir,
            k > 0 ? "; the newest, " : "", k > 0 ? newest : "", why.msg);
    ct_err_append(err, "  Nothing was loaded and nothing trained. To start fresh deliberately, run without "
                  "--resume (its checkpoints go beside these, which are never loaded), or move %s aside.", save_dir);
    return CT_ERR_DATA;
}

int ct_ckpt_resolve(const char *spec, const char *save_dir, char *out, size_t n,
                    ct_warnings *warn, ct_err *err) {
    out[0] = 0;
    if (strcmp(spec, "auto") == 0) {
        if (!save_dir || !ct_fs_is_dir(save_dir)) return CT_OK;
        resolve_save_dir(save_dir, out, n, warn);
        return out[0] ? CT_OK : nothing_to_resume(save_dir, err);
    }
    if (!ct_fs_is_dir(spec))
        return ct_errf(err, CT_ERR_DATA, "%s: no such checkpoint directory", spec);
    /* A checkpoint directory itself (complete or not), or a save_dir holding several. */
    char marker[CKPT_PATH], model[CKPT_PATH];
    snprintf(marker, sizeof marker, "%s/%s", spec, CT_CKPT_MARKER);
    snprintf(model, sizeof model, "%s/%s", spec, CKPT_MODEL);
    const char *base = strrchr(spec, '/') ? strrchr(spec, '/') + 1 : spec;
    if (ct_fs_exists(marker) || ct_fs_exists(model) || ct_ckpt_dir_sharded(spec) || tag_step(base) >= 0) {
        int rc = check_marker(spec, err);
        if (rc) return rc;
        snprintf(out, n, "%s", spec);
        return CT_OK;
    }
    resolve_save_dir(spec, out, n, warn);
    if (!out[0])
        return ct_errf(err, CT_ERR_DATA, "%s: no complete checkpoint here (no %s marker, and no "
                       "complete global_step* directory)", spec, CT_CKPT_MARKER);
    return CT_OK;
}

/* ---------------------------------------------------------------- loading */

/* Appends one mismatch line; after 12 lines only counts. */
typedef struct mismatch_list {
    ct_err *err;
    int n;
    ct_warnings *warn;           /* when set, each line also becomes a warning */
    const char *warn_prefix;
} mismatch_list;

static void mismatch(mismatch_list *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(mismatch_list *m, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (m->warn) ct_warnf(m->warn, "%s%s", m->warn_prefix, line);
    if (m->n < 12 && m->err) ct_err_append(m->err, "  %s", line);
    m->n++;
}

static bool view_named(const ct_ckpt_tensors *t, const char *name) {
    for (int i = 0; i < t->n_views; i++)
        if (strcmp(t->views[i].name, name) == 0) return true;
    return false;
}

/* Match the model's views against a source's tensors. any_dtype: F16/BF16 accepted (init_from).
 * Returns the number of views that match. */
static int match_views(const ct_ckpt_source *src, const ct_ckpt_tensors *t, bool any_dtype,
                       mismatch_list *m, bool *ok) {
    int matched = 0;
    for (int i = 0; i < t->n_views; i++) {
        const ct_param_view *v = &t->views[i];
        const ct_ckpt_src_tensor *x = ct_ckpt_source_find(src, v->name);
        char a[96], b[96];
        if (!x) {
            mismatch(m, "%s %s: in the model, not in %s", v->name, ct_shape_str(&v->shape, a, sizeof a),
                     src->path);
        } else if (!ct_shape_eq(&x->shape, &v->shape)) {
            mismatch(m, "%s: %s in %s, %s in the model", v->name, ct_shape_str(&x->shape, a, sizeof a),
                     src->path, ct_shape_str(&v->shape, b, sizeof b));
        } else if (x->ct_dtype != CT_F32 &&
                   !(any_dtype && (x->ct_dtype == CT_F16 || x->ct_dtype == CT_BF16))) {
            mismatch(m, "%s: dtype %s in %s, expected F32%s", v->name, x->dtype, src->path,
                     any_dtype ? ", F16 or BF16" : "");
        } else {
            matched++;
            continue;
        }
        ok[i] = false;
    }
    for (int i = 0; i < src->n_tensors; i++)
        if (!view_named(t, src->tensors[i].name))
            mismatch(m, "%s: in %s, not in the model", src->tensors[i].name, src->path);
    return matched;
}

/* The part of every view (ok[i], or all when ok is NULL) that t holds, from the source. */
static int copy_views(const ct_ckpt_source *src, const ct_ckpt_tensors *t, const bool *ok, ct_err *err) {
    for (int i = 0; i < t->n_views; i++) {
        if (ok && !ok[i]) continue;
        const ct_param_view *v = &t->views[i];
        int64_t first, n;
        ct_ckpt_view_part(t, v, &first, &n);
        int rc = n > 0 ? ct_ckpt_source_load(src, ct_ckpt_source_find(src, v->name), first, n,
                                             ct_ckpt_view_loc(t, v, first), err) : CT_OK;
        if (rc) return rc;
    }
    return CT_OK;
}

/* Every view's part must lie inside t's buffers (a caller's error otherwise). */
static int check_parts(const ct_ckpt_tensors *t, const char *what, ct_err *err) {
    int64_t first, n;
    for (int i = 0; i < t->n_views; i++)
        if (!ct_ckpt_view_part(t, &t->views[i], &first, &n))
            return ct_errf(err, CT_ERR_RUNTIME, "%s: view \"%s\" lies outside its buffer", what, t->views[i].name);
    return CT_OK;
}

static int check_model(const ct_ckpt_source *src, const ct_ckpt_tensors *t, const char *dir,
                       ct_err *err) {
    int rc = check_parts(t, "checkpoint", err);
    if (rc) return rc;
    ct_errf(err, CT_ERR_CONFIG, "checkpoint %s does not fit the model (changed layers?):", dir);
    mismatch_list m = {.err = err};
    bool *ok = ct_xcalloc((size_t)t->n_views + 1, 1);
    match_views(src, t, false, &m, ok);
    free(ok);
    if (m.n > 12) ct_err_append(err, "  ... and %d more", m.n - 12);
    if (m.n == 0 && err) *err = (ct_err){0};
    return m.n ? CT_ERR_CONFIG : CT_OK;
}

/* Optimizer state: same slots as the current optimizer, one F32 tensor per trainable view. */
static int check_optim(const ct_ckpt_source *src, const ct_ckpt_tensors *t, const char *dir,
                       ct_err *err) {
    char want[128];
    ct_ckpt_slot_list(t, want, sizeof want);
    const char *have = ct_ckpt_source_slots(src);
    const char *opt = ct_ckpt_source_optimizer(src);
    if (!have || strcmp(have, want) != 0)
        return ct_errf(err, CT_ERR_CONFIG,
                       "checkpoint %s holds optimizer state of %s (%s); the config's optimizer %s "
                       "needs %s. Resume with the same optimizer, or use model.init_from to start "
                       "from the weights only.",
                       dir, opt ? opt : "?", have ? (have[0] ? have : "no state") : "?",
                       t->optimizer, want[0] ? want : "no state");
    const char *file = src->optim ? src->optim->path : src->path;
    int expect = 0;
    for (int i = 0; i < t->n_views; i++) {
        const ct_param_view *v = &t->views[i];
        if (!v->trainable) continue;
        for (int s = 0; s < t->n_slots; s++, expect++)
            if (!ct_ckpt_source_has_slot(src, v->name, t->slot_name[s], &v->shape))
                return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s.%s\" is missing, or of the wrong dtype or "
                               "shape", file, v->name, t->slot_name[s]);
    }
    if (src->optim && src->optim->n_tensors != expect)
        return ct_errf(err, CT_ERR_DATA, "%s: %d tensors, expected %d", file, src->optim->n_tensors, expect);
    return CT_OK;
}

static int copy_optim(const ct_ckpt_source *src, const ct_ckpt_tensors *t, ct_err *err) {
    for (int i = 0; i < t->n_views; i++) {
        const ct_param_view *v = &t->views[i];
        int64_t first, n;
        ct_ckpt_view_part(t, v, &first, &n);
        if (!v->trainable || n == 0) continue;
        for (int s = 0; s < t->n_slots; s++) {
            int rc = ct_ckpt_source_load_slot(src, v->name, t->slot_name[s], first, n, ct_ckpt_slot_loc(t, s, v, first), err);
            if (rc) return rc;
        }
    }
    return CT_OK;
}

static int read_json_file(const char *dir, const char *name, cJSON **out, ct_err *err) {
    char path[CKPT_PATH];
    int rc = ct_fs_join(path, sizeof path, dir, name, err);
    if (rc) return rc;
    char *text = ct_fs_read_small(path, 64u << 20, NULL);
    if (!text) return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot read: %s", path, strerror(errno));
    *out = cJSON_Parse(text);
    free(text);
    if (!*out) return ct_errf(err, CT_ERR_DATA, "%s: not valid JSON", path);
    return CT_OK;
}

/* state.json no longer has the CRC-32 the marker recorded for it (none recorded: false). */
static bool state_changed(const char *dir) {
    cJSON *m = NULL;
    ct_err e = {0};
    if (read_json_file(dir, CT_CKPT_MARKER, &m, &e)) return false;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "crc32"),
                                                      CKPT_STATE);
    char path[CKPT_PATH];
    uint32_t have = 0;
    bool changed = cJSON_IsString(v) && !ct_fs_join(path, sizeof path, dir, CKPT_STATE, &e) &&
                   !file_crc(path, &have, &e) && strtoul(v->valuestring, NULL, 16) != have;
    cJSON_Delete(m);
    return changed;
}

/* The tensors of a complete checkpoint, their bytes checked first (a flipped bit can leave a
 * valid header and plausible values): the files a load of `what` into t's range reads. One file
 * set: model.safetensors, optimizer.safetensors. Shards: the index, the buffers (the model), and
 * the shards that hold any of [t->lo, t->hi), opened (and checked to fit together) in between. */
static int open_checked(const char *dir, const ct_ckpt_tensors *t, int what, ct_ckpt_source *src, ct_err *err) {
    bool model = what & CT_CKPT_LOAD_MODEL, optim = what & CT_CKPT_LOAD_OPTIM;
    if (!ct_ckpt_dir_sharded(dir)) {
        const char *names[2];
        int n = 0;
        if (model) names[n++] = CKPT_MODEL;
        if (optim) names[n++] = CKPT_OPTIM;
        int rc = verify_crcs(dir, names, n, NULL, err);
        return rc ? rc : ct_ckpt_source_open_dir(dir, optim, src, err);
    }
    const char *head[] = {CT_SHARDS_INDEX, CT_SHARDS_BUFFERS};
    int rc = verify_crcs(dir, head, model ? 2 : 1, NULL, err);
    if (!rc) rc = ct_ckpt_source_open_dir(dir, optim, src, err);
    if (rc) return rc;
    const ct_ckpt_shard_set *set = src->shards;
    const char **names = ct_xcalloc((size_t)set->world + 1, sizeof *names);
    int n = 0;
    for (int r = 0; r < set->world; r++)
        if (ct_ckpt_shard_overlaps(&set->shards[r], t->lo, t->hi)) names[n++] = set->shards[r].file;
    rc = verify_crcs(dir, names, n, NULL, err);
    free(names);
    return rc;
}

int ct_ckpt_load(const char *dir, const ct_ckpt_tensors *t, int what, ct_ckpt_state *state,
                 cJSON **config_out, ct_err *err) {
    ct_ckpt_source src = {0};
    cJSON *sj = NULL;
    ct_ckpt_state st;
    bool tensors = what & (CT_CKPT_LOAD_MODEL | CT_CKPT_LOAD_OPTIM);
    int rc = check_marker(dir, err);
    if (!rc && tensors) rc = open_checked(dir, t, what, &src, err);
    if (!rc && (what & CT_CKPT_LOAD_MODEL)) rc = check_model(&src, t, dir, err);
    if (!rc && (what & CT_CKPT_LOAD_OPTIM)) rc = check_optim(&src, t, dir, err);
    if (!rc && (what & CT_CKPT_LOAD_STATE)) {
        char path[CKPT_PATH];
        rc = read_json_file(dir, CKPT_STATE, &sj, err);
        if (!rc) rc = ct_fs_join(path, sizeof path, dir, CKPT_STATE, err);
        if (!rc) rc = state_from_json(sj, &st, path, err);
        if (!rc) st.state_changed = state_changed(dir);
    }
    if (!rc && config_out) rc = read_json_file(dir, CKPT_CONFIG, config_out, err);
    /* Everything validated: only now touch the caller's buffers. */
    if (!rc && (what & CT_CKPT_LOAD_MODEL)) rc = copy_views(&src, t, NULL, err);
    if (!rc && (what & CT_CKPT_LOAD_OPTIM)) rc = copy_optim(&src, t, err);
    if (!rc && sj && state) *state = st;
    ct_ckpt_source_close(&src);
    cJSON_Delete(sj);
    return rc;
}

/* ---------------------------------------------------------------- init_from */

/* model.init_from's tensors: a safetensors file, or a checkpoint (a directory of either kind, or
 * a save_dir: its latest), its model's bytes checked. */
static int open_init_source(const char *file, const ct_ckpt_tensors *t, ct_ckpt_source *src, ct_err *err) {
    if (!ct_fs_is_dir(file)) return ct_ckpt_source_open_file(file, src, err);
    char dir[CKPT_PATH];
    int rc = ct_ckpt_resolve(file, NULL, dir, sizeof dir, NULL, err);
    if (!rc) rc = check_marker(dir, err);
    return rc ? rc : open_checked(dir, t, CT_CKPT_LOAD_MODEL, src, err);
}

int ct_ckpt_init_from(const char *file, const ct_ckpt_tensors *t, bool strict, int *n_loaded,
                      ct_warnings *warn, ct_err *err) {
    if (n_loaded) *n_loaded = 0;
    int rc = check_parts(t, "init_from", err);
    ct_ckpt_source src = {0};
    if (!rc) rc = open_init_source(file, t, &src, err);
    if (rc) return rc;
    bool *ok = ct_xmalloc((size_t)t->n_views + 1);
    memset(ok, 1, (size_t)t->n_views + 1);
    ct_errf(err, CT_ERR_CONFIG, "model.init_from %s does not match the model%s:", file,
            strict ? " (set \"init_strict\": false to load the matching tensors only)" : "");
    mismatch_list m = {.err = err, .warn = strict ? NULL : warn,
                       .warn_prefix = "model.init_from: "};
    int matched = match_views(&src, t, true, &m, ok);
    if (m.n > 12) ct_err_append(err, "  ... and %d more", m.n - 12);
    if (strict && m.n) rc = CT_ERR_CONFIG;
    else if (matched == 0 && t->n_views > 0) rc = CT_ERR_CONFIG;
    if (!rc) {
        if (err) *err = (ct_err){0};
        rc = copy_views(&src, t, ok, err);
        if (!rc && n_loaded) *n_loaded = matched;
    }
    free(ok);
    ct_ckpt_source_close(&src);
    return rc;
}

/* A whole view's values (host memory) into the part of it t holds. */
static int from_values(const void *ctx, int64_t first, int64_t k, float *dst, ct_err *err) {
    memcpy(dst, (const float *)ctx + first, (size_t)k * sizeof *dst);
    return CT_OK;
}

int ct_ckpt_put_view(const ct_ckpt_tensors *t, const ct_param_view *v, const float *values, ct_err *err) {
    int64_t first, n;
    if (!ct_ckpt_view_part(t, v, &first, &n))
        return ct_errf(err, CT_ERR_RUNTIME, "view \"%s\" lies outside its buffer", v->name);
    return n == 0 ? CT_OK : ct_ckpt_load_into(ct_ckpt_view_loc(t, v, first), n, from_values, values + first, err);
}

/* ---------------------------------------------------------------- config diff */

static void diff_line(char *buf, size_t n, const char *path, const cJSON *a, const cJSON *b) {
    char *ta = a ? cJSON_PrintUnformatted(a) : NULL, *tb = b ? cJSON_PrintUnformatted(b) : NULL;
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, "%s%s: %.60s -> %.60s", len ? "\n" : "", path,
             ta ? ta : "(absent)", tb ? tb : "(absent)");
    free(ta);
    free(tb);
}

static int diff_rec(const cJSON *a, const cJSON *b, const char *path, char *buf, size_t n) {
    if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
        int k = 0;
        char sub[512];
        for (const cJSON *x = a->child; x; x = x->next) {
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", x->string);
            k += diff_rec(x, cJSON_GetObjectItemCaseSensitive(b, x->string), sub, buf, n);
        }
        for (const cJSON *y = b->child; y; y = y->next)
            if (!cJSON_GetObjectItemCaseSensitive(a, y->string)) {
                snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", y->string);
                diff_line(buf, n, sub, NULL, y);
                k++;
            }
        return k;
    }
    if (a && b && cJSON_Compare(a, b, 1)) return 0;
    diff_line(buf, n, path[0] ? path : "(root)", a, b);
    return 1;
}

int ct_ckpt_config_diff(const cJSON *saved, const cJSON *current, char *buf, size_t n) {
    if (n) buf[0] = 0;
    return diff_rec(saved, current, "", buf, n);
}

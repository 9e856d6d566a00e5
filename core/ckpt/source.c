/* source.c: the tensors a load reads, from one file set, per-rank shards or one file (source.h). */
#include "core/ckpt/source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/stage.h"
#include "core/util/fs.h"

bool ct_ckpt_dir_sharded(const char *dir) {
    char path[4200];
    return ct_fs_join(path, sizeof path, dir, CT_SHARDS_INDEX, NULL) == CT_OK && ct_fs_exists(path);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const ct_ckpt_src_tensor *)a)->name, ((const ct_ckpt_src_tensor *)b)->name);
}

/* The model's tensors of a file: every tensor of it. */
static void list_file(ct_ckpt_source *s, const ct_st_file *f) {
    s->n_tensors = f->n_tensors;
    s->tensors = ct_xcalloc((size_t)f->n_tensors + 1, sizeof *s->tensors);
    for (int i = 0; i < f->n_tensors; i++) {
        const ct_st_tensor *x = &f->tensors[i];
        s->tensors[i] = (ct_ckpt_src_tensor){.name = x->name, .shape = x->shape, .dtype = x->dtype,
                                             .ct_dtype = x->ct_dtype, .st = x, .offset = -1};
    }
}

/* The model's tensors of shards: the views of the saving layout, trainable ones in the shards,
 * buffers in buffers.safetensors (checked to be there when the set was opened). */
static void list_shards(ct_ckpt_source *s) {
    const ct_ckpt_shard_set *set = s->shards;
    s->n_tensors = set->n_views;
    s->tensors = ct_xcalloc((size_t)set->n_views + 1, sizeof *s->tensors);
    for (int i = 0; i < set->n_views; i++) {
        const ct_param_view *v = &set->views[i];
        s->tensors[i] = (ct_ckpt_src_tensor){.name = v->name, .shape = v->shape, .dtype = "F32",
                                             .ct_dtype = CT_F32, .offset = v->trainable ? v->offset : -1,
                                             .st = v->trainable ? NULL : ct_st_find(set->buffers, v->name)};
    }
}

static int open_file(const char *dir, const char *name, ct_st_file **out, ct_err *err) {
    char path[4200];
    int rc = ct_fs_join(path, sizeof path, dir, name, err);
    if (!rc && !(*out = ct_st_open(path, err))) rc = err && err->code ? err->code : CT_ERR_DATA;
    return rc;
}

int ct_ckpt_source_open_dir(const char *dir, bool optim, ct_ckpt_source *out, ct_err *err) {
    *out = (ct_ckpt_source){0};
    int rc;
    if (ct_ckpt_dir_sharded(dir)) {
        rc = ct_fs_join(out->path, sizeof out->path, dir, CT_SHARDS_INDEX, err);
        if (!rc) rc = ct_ckpt_shard_set_open(dir, &out->shards, err);
        if (!rc) list_shards(out);
    } else {
        rc = ct_fs_join(out->path, sizeof out->path, dir, "model.safetensors", err);
        if (!rc) rc = open_file(dir, "model.safetensors", &out->model, err);
        if (!rc && optim) rc = open_file(dir, "optimizer.safetensors", &out->optim, err);
        if (!rc) list_file(out, out->model);
    }
    if (rc) ct_ckpt_source_close(out);
    return rc;
}

int ct_ckpt_source_open_file(const char *path, ct_ckpt_source *out, ct_err *err) {
    *out = (ct_ckpt_source){0};
    snprintf(out->path, sizeof out->path, "%s", path);
    out->model = ct_st_open(path, err);
    if (!out->model) return err && err->code ? err->code : CT_ERR_DATA;
    list_file(out, out->model);
    return CT_OK;
}

void ct_ckpt_source_close(ct_ckpt_source *s) {
    ct_st_close(s->model);
    ct_st_close(s->optim);
    ct_ckpt_shard_set_close(s->shards);
    free(s->tensors);
    *s = (ct_ckpt_source){0};
}

const ct_ckpt_src_tensor *ct_ckpt_source_find(const ct_ckpt_source *s, const char *name) {
    ct_ckpt_src_tensor key = {.name = name};
    return bsearch(&key, s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_tensor_name);
}

bool ct_ckpt_source_read(const ct_ckpt_source *s, const ct_ckpt_src_tensor *x, int64_t first, int64_t n, float *dst) {
    if (x->st) return ct_st_read_f32_range(x->st, first, n, dst);
    if (!s->shards || first < 0 || n < 0 || first > ct_shape_numel(&x->shape) - n) return false;
    return ct_ckpt_shard_set_read(s->shards, -1, x->offset + first, x->offset + first + n, dst);
}

/* A read of one tensor (or slot) from element `first` on, for ct_ckpt_load_into. */
typedef struct range_read {
    const ct_ckpt_source *s;
    const ct_ckpt_src_tensor *x; /* a model tensor, or NULL: */
    const ct_st_tensor *slot_st; /* a slot in optimizer.safetensors, or */
    int slot;                    /* a slot of shards, at flat offset `offset` */
    int64_t offset, first;
    const char *view, *slot_name; /* a slot's names, for messages */
} range_read;

static int read_at(const void *ctx, int64_t at, int64_t k, float *dst, ct_err *err) {
    const range_read *r = ctx;
    bool ok;
    if (r->x) ok = ct_ckpt_source_read(r->s, r->x, r->first + at, k, dst);
    else if (r->slot_st) ok = ct_st_read_f32_range(r->slot_st, r->first + at, k, dst);
    else ok = ct_ckpt_shard_set_read(r->s->shards, r->slot, r->offset + r->first + at, r->offset + r->first + at + k, dst);
    if (ok) return CT_OK;
    if (r->x) return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" cannot be read", r->s->path, r->x->name);
    return ct_errf(err, CT_ERR_DATA, "%s: \"%s.%s\" cannot be read", r->s->path, r->view, r->slot_name);
}

int ct_ckpt_source_load(const ct_ckpt_source *s, const ct_ckpt_src_tensor *x, int64_t first, int64_t n,
                        ct_ckpt_loc dst, ct_err *err) {
    range_read r = {.s = s, .x = x, .first = first};
    return ct_ckpt_load_into(dst, n, read_at, &r, err);
}

const char *ct_ckpt_source_optimizer(const ct_ckpt_source *s) {
    return s->shards ? s->shards->optimizer : s->optim ? ct_st_meta(s->optim, "optimizer") : NULL;
}

const char *ct_ckpt_source_slots(const ct_ckpt_source *s) {
    return s->shards ? s->shards->slots : s->optim ? ct_st_meta(s->optim, "slots") : NULL;
}

/* Where slot `slot` of `view` is: a tensor of optimizer.safetensors, or (shards) the slot's index
 * and the view's flat offset. False when it is not there. */
static bool find_slot(const ct_ckpt_source *s, const char *view, const char *slot, range_read *r) {
    if (s->optim) {
        char name[200];
        snprintf(name, sizeof name, "%s.%s", view, slot);
        r->slot_st = ct_st_find(s->optim, name);
        return r->slot_st != NULL;
    }
    const ct_param_view *v = s->shards ? ct_ckpt_shard_set_view(s->shards, view) : NULL;
    if (!v || !v->trainable) return false;
    for (int k = 0; k < s->shards->n_slots; k++)
        if (strcmp(s->shards->slot_name[k], slot) == 0) {
            r->slot = k;
            r->offset = v->offset;
            return true;
        }
    return false;
}

bool ct_ckpt_source_has_slot(const ct_ckpt_source *s, const char *view, const char *slot, const ct_shape *shape) {
    range_read r = {.s = s};
    if (!find_slot(s, view, slot, &r)) return false;
    if (r.slot_st) return r.slot_st->ct_dtype == CT_F32 && ct_shape_eq(&r.slot_st->shape, shape);
    return ct_shape_eq(&ct_ckpt_shard_set_view(s->shards, view)->shape, shape);
}

int ct_ckpt_source_load_slot(const ct_ckpt_source *s, const char *view, const char *slot, int64_t first,
                             int64_t n, ct_ckpt_loc dst, ct_err *err) {
    range_read r = {.s = s, .first = first, .view = view, .slot_name = slot};
    if (!find_slot(s, view, slot, &r))
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s.%s\" is missing", s->path, view, slot);
    return ct_ckpt_load_into(dst, n, read_at, &r, err);
}

/* loader.c: worker threads filling a ring of batch slots in stream order (see loader.h).
 *
 * Batch g of the stream goes to slot g % prefetch. Workers claim batch numbers in increasing
 * order under the mutex, fill the slot without it, and mark it READY; the trainer takes batch
 * `next_take` when its slot is READY, and frees it on its next call. Claims are limited to the
 * trainer's epoch and the one after it, so two cached permutations (indexed by epoch % 2) cover
 * every batch being filled. A seek bumps the generation: batches of the old generation still
 * being filled are thrown away when their worker finishes. */
#include "core/data/loader.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/formats.h"
#include "core/rng.h"

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_TAKEN };
enum { CACHE_EMPTY, CACHE_READY, CACHE_WRITING };

typedef struct slot {
    void *in, *tgt;              /* pinned host: [batch, sample], [batch, target] */
    int state;
    int64_t g, n;
    uint64_t gen;
    int rc;
    ct_err err;
} slot;

struct ct_loader {
    ct_backend *be;
    const ct_dataset *ds;
    ct_loader_opts o;
    size_t in_bytes, tgt_bytes;
    int64_t epoch_samples, bpe;
    bool class_targets;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    slot *slots;
    int nslots;
    int64_t next_claim, next_take;
    uint64_t gen;
    bool stop;
    int taken;                   /* slot held by the trainer, -1 when none */
    uint32_t *perm[2];           /* shuffle: permutation of epoch perm_epoch[k], k = epoch % 2 */
    int64_t perm_epoch[2];

    uint8_t *cache;              /* [count, in_bytes + tgt_bytes] decoded samples, or NULL */
    _Atomic uint8_t *cstate;     /* [count] CACHE_* */
    _Atomic uint8_t *bad;        /* [count] 1 = skipped as corrupt (counted once) */
    _Atomic int64_t skipped;

    void *dev_in, *dev_tgt;      /* device backends: where ct_loader_next copies the slot */
    bool staged;
    double last_wait, total_wait;

    pthread_t *threads;
    int nthreads;
};

static int64_t online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* ---- options ---- */

static bool data_flag(const cJSON *data, const char *key, bool dflt) {
    const cJSON *v = data ? cJSON_GetObjectItemCaseSensitive(data, key) : NULL;
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int data_int(const ct_config *cfg, const cJSON *data, const char *key, int lo, int dflt,
                    int *out, ct_err *err) {
    const cJSON *v = data ? cJSON_GetObjectItemCaseSensitive(data, key) : NULL;
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return CT_OK;
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > 1024)
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.%s: expected an integer in %d..1024", where, key, lo);
    *out = (int)v->valuedouble;
    return CT_OK;
}

/* data.transform.random_crop {"padding": P} (or just P) and data.transform.hflip true. */
static int parse_augment(const ct_config *cfg, const cJSON *tr, ct_augment *a, ct_err *err) {
    memset(a, 0, sizeof *a);
    if (!cJSON_IsObject(tr)) return CT_OK;
    char where[1200];
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(tr, "random_crop");
    if (rc) {
        const cJSON *p = cJSON_IsObject(rc) ? cJSON_GetObjectItemCaseSensitive(rc, "padding") : rc;
        ct_config_where(cfg, p ? p : rc, where, sizeof where);
        if (!cJSON_IsNumber(p) || p->valuedouble != floor(p->valuedouble) || p->valuedouble < 0 ||
            p->valuedouble > 1024)
            return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.random_crop: expected {\"padding\": "
                           "P} with P an integer in 0..1024", where);
        a->crop_pad = (int)p->valuedouble;
    }
    const cJSON *hf = cJSON_GetObjectItemCaseSensitive(tr, "hflip");
    if (hf) {
        ct_config_where(cfg, hf, where, sizeof where);
        if (!cJSON_IsBool(hf))
            return ct_errf(err, CT_ERR_CONFIG, "%s: data.transform.hflip: expected true or false", where);
        a->hflip = cJSON_IsTrue(hf);
    }
    return CT_OK;
}

int ct_loader_opts_from_config(const ct_config *cfg, const ct_dataset *ds, bool train,
                               int64_t classes, ct_loader_opts *o, ct_err *err) {
    memset(o, 0, sizeof *o);
    const cJSON *data = cfg->data;
    o->batch = cfg->micro_batch;
    o->step_samples = cfg->train_batch_size;
    o->seed = cfg->train.seed;
    o->classes = classes;
    o->shuffle = train && data_flag(data, "shuffle", true);
    o->drop_last = train && data_flag(data, "drop_last", true);
    o->cache = data_flag(data, "cache", false);
    o->skip_corrupt = data_flag(data, "skip_corrupt", false);
    int rc = data_int(cfg, data, "workers", 0, 0, &o->workers, err);
    if (!rc) rc = data_int(cfg, data, "prefetch", 1, 4, &o->prefetch, err);
    const cJSON *tr = data ? cJSON_GetObjectItemCaseSensitive(data, "transform") : NULL;
    if (!rc && train) rc = parse_augment(cfg, tr, &o->aug, err);
    if (rc) return rc;
    if ((o->aug.crop_pad || o->aug.hflip) && ds->sample_shape.ndim == 3 && ds->sample_dtype == CT_F32 &&
        ds->sample_shape.d[0] <= 4) {
        float mean[4], std[4];
        rc = ct_data_normalize_parse(cfg, ds->sample_shape.d[0], mean, std, err);
        for (int c = 0; c < 4 && !rc && c < ds->sample_shape.d[0]; c++) o->pad_value[c] = -mean[c] / std[c];
    } else if (o->aug.crop_pad || o->aug.hflip) {
        rc = ct_errf(err, CT_ERR_CONFIG, "data.transform: random_crop and hflip need image samples "
                     "[C, H, W] of floats with C <= 4, %s gives %d dimensions", ds->source,
                     ds->sample_shape.ndim);
    }
    return rc;
}

/* ---- filling a batch ---- */

/* Random crop with padding, then horizontal flip, of one [C, H, W] float sample in place. */
static void augment(const ct_loader *l, int64_t epoch, int64_t idx, float *x, float *scratch) {
    const ct_augment *a = &l->o.aug;
    if (!a->crop_pad && !a->hflip) return;
    const ct_shape *s = &l->ds->sample_shape;
    int64_t C = s->d[0], H = s->d[1], W = s->d[2], p = a->crop_pad;
    ct_rng r;
    ct_rng_init(&r, l->o.seed, CT_RNG_AUGMENT, (uint64_t)epoch * (uint64_t)l->ds->count + (uint64_t)idx);
    int64_t oy = p ? ct_rng_below(&r, (uint32_t)(2 * p + 1)) - p : 0;
    int64_t ox = p ? ct_rng_below(&r, (uint32_t)(2 * p + 1)) - p : 0;
    bool flip = a->hflip && (ct_rng_u32(&r) & 1);
    memcpy(scratch, x, (size_t)(C * H * W) * sizeof *x);
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t xx = 0; xx < W; xx++) {
                int64_t sy = y + oy, sx = (flip ? W - 1 - xx : xx) + ox;
                bool in = sy >= 0 && sy < H && sx >= 0 && sx < W;
                x[(c * H + y) * W + xx] = in ? scratch[(c * H + sy) * W + sx] : l->o.pad_value[c];
            }
}

static int check_label(const ct_loader *l, int64_t idx, const void *tgt, ct_err *err) {
    if (!l->class_targets) return CT_OK;
    int32_t label;
    memcpy(&label, tgt, sizeof label);
    if (label >= 0 && label < l->o.classes) return CT_OK;
    return ct_errf(err, CT_ERR_DATA, "%s: record %lld: label %d is outside the model's %lld classes "
                   "(0..%lld)", l->ds->source, (long long)idx, label, (long long)l->o.classes,
                   (long long)l->o.classes - 1);
}

/* Decoded, label-checked sample idx (from the cache when it holds it). */
static int load_sample(ct_loader *l, int64_t idx, uint8_t *in, uint8_t *tgt, ct_err *err) {
    uint8_t *c = l->cache ? l->cache + (size_t)idx * (l->in_bytes + l->tgt_bytes) : NULL;
    if (c && atomic_load_explicit(&l->cstate[idx], memory_order_acquire) == CACHE_READY) {
        memcpy(in, c, l->in_bytes);
        memcpy(tgt, c + l->in_bytes, l->tgt_bytes);
        return CT_OK;
    }
    int rc = l->ds->decode(l->ds, idx, in, tgt, err);
    if (!rc) rc = check_label(l, idx, tgt, err);
    uint8_t expect = CACHE_EMPTY;
    if (!rc && c &&
        atomic_compare_exchange_strong(&l->cstate[idx], &expect, (uint8_t)CACHE_WRITING)) {
        memcpy(c, in, l->in_bytes);
        memcpy(c + l->in_bytes, tgt, l->tgt_bytes);
        atomic_store_explicit(&l->cstate[idx], (uint8_t)CACHE_READY, memory_order_release);
    }
    return rc;
}

/* Assemble batch s->g into slot s. Runs without the mutex. */
static void fill(ct_loader *l, slot *s, const uint32_t *perm, float *scratch) {
    int64_t epoch = s->g / l->bpe, start = (s->g % l->bpe) * l->o.batch;
    int64_t n = l->epoch_samples - start < l->o.batch ? l->epoch_samples - start : l->o.batch;
    int64_t out = 0;
    s->rc = CT_OK;
    for (int64_t j = 0; j < n; j++) {
        int64_t idx = perm ? perm[start + j] : start + j;
        uint8_t *in = (uint8_t *)s->in + (size_t)out * l->in_bytes;
        uint8_t *tgt = (uint8_t *)s->tgt + (size_t)out * l->tgt_bytes;
        int rc = load_sample(l, idx, in, tgt, &s->err);
        if (rc == CT_ERR_DATA && l->o.skip_corrupt) {
            if (atomic_exchange(&l->bad[idx], 1) == 0) atomic_fetch_add(&l->skipped, 1);
            continue;
        }
        if (rc) {
            s->rc = rc;
            break;
        }
        augment(l, epoch, idx, (float *)in, scratch);
        out++;
    }
    s->n = out;
}

/* Permutation of `epoch`, computing it on first use. Called with the mutex held. */
static const uint32_t *epoch_perm(ct_loader *l, int64_t epoch) {
    if (!l->o.shuffle) return NULL;
    int k = (int)(epoch % 2);
    if (l->perm_epoch[k] != epoch) {
        ct_rng_permutation(l->o.seed, (uint64_t)epoch, l->perm[k], (uint32_t)l->ds->count);
        l->perm_epoch[k] = epoch;
    }
    return l->perm[k];
}

static void *worker_main(void *arg) {
    ct_loader *l = arg;
    bool aug = l->o.aug.crop_pad || l->o.aug.hflip;
    float *scratch = aug ? ct_xmalloc(l->in_bytes) : NULL;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        int64_t g = l->next_claim;
        slot *s = &l->slots[g % l->nslots];
        if (s->state != SLOT_FREE || g / l->bpe > l->next_take / l->bpe + 1) {
            pthread_cond_wait(&l->cv_work, &l->mu);
            continue;
        }
        s->state = SLOT_FILLING;
        s->g = g;
        s->gen = l->gen;
        l->next_claim++;
        const uint32_t *perm = epoch_perm(l, g / l->bpe);
        pthread_mutex_unlock(&l->mu);
        fill(l, s, perm, scratch);
        pthread_mutex_lock(&l->mu);
        s->state = s->gen == l->gen ? SLOT_READY : SLOT_FREE;
        pthread_cond_broadcast(&l->cv_ready);
        pthread_cond_broadcast(&l->cv_work);
    }
    pthread_mutex_unlock(&l->mu);
    free(scratch);
    return NULL;
}

/* ---- lifecycle ---- */

/* cache: true only when the decoded set takes at most half of the free memory. */
static void setup_cache(ct_loader *l, ct_warnings *warn) {
    if (!l->o.cache) return;
    double need = (double)l->ds->count * (double)(l->in_bytes + l->tgt_bytes);
    double avail = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (need > 0.5 * avail) {
        if (warn)
            ct_warnf(warn, "data.cache: the decoded %s set needs %.1f GB but only %.1f GB of memory is "
                     "free; running without a cache", l->ds->format, need / 1e9, avail / 1e9);
        return;
    }
    l->cache = malloc((size_t)need);
    if (!l->cache) {
        if (warn) ct_warnf(warn, "data.cache: could not allocate %.1f GB; running without a cache", need / 1e9);
        return;
    }
    l->cstate = ct_xcalloc((size_t)l->ds->count, 1);
}

static int alloc_buffers(ct_loader *l, ct_err *err) {
    ct_backend *be = l->be;
    size_t bin = (size_t)l->o.batch * l->in_bytes, btg = (size_t)l->o.batch * l->tgt_bytes;
    l->slots = ct_xcalloc((size_t)l->nslots, sizeof *l->slots);
    bool ok = true;
    for (int i = 0; i < l->nslots; i++) {
        l->slots[i].in = be->alloc_host_pinned(be, bin ? bin : 1);
        l->slots[i].tgt = be->alloc_host_pinned(be, btg ? btg : 1);
        ok &= l->slots[i].in && l->slots[i].tgt;
    }
    l->staged = strcmp(be->name, "cpu") != 0;
    if (l->staged) {
        l->dev_in = be->alloc(be, bin ? bin : 1);
        l->dev_tgt = be->alloc(be, btg ? btg : 1);
        ok &= l->dev_in && l->dev_tgt;
    }
    if (!ok)
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %d batch slots of %lld samples",
                       l->nslots, (long long)l->o.batch);
    return CT_OK;
}

int ct_loader_init(ct_loader **out, ct_backend *be, const ct_dataset *ds, const ct_loader_opts *o,
                   ct_warnings *warn, ct_err *err) {
    *out = NULL;
    if (o->batch < 1 || ds->count < 1 || ds->count > UINT32_MAX)
        return ct_errf(err, CT_ERR_CONFIG, "%s: cannot load batches of %lld from %lld samples",
                       ds->source, (long long)o->batch, (long long)ds->count);
    ct_loader *l = ct_xcalloc(1, sizeof *l);
    l->be = be;
    l->ds = ds;
    l->o = *o;
    if (l->o.workers <= 0) l->o.workers = (int)online_cores();
    if (l->o.prefetch <= 0) l->o.prefetch = 4;
    l->nslots = l->o.prefetch;
    l->in_bytes = (size_t)ct_shape_numel(&ds->sample_shape) * ct_dtype_size(ds->sample_dtype);
    l->tgt_bytes = (size_t)ct_shape_numel(&ds->target_shape) * ct_dtype_size(ds->target_dtype);
    l->class_targets = ds->target_dtype == CT_I32 && ds->target_shape.ndim == 0 && o->classes > 0;
    int64_t step = o->step_samples > 0 ? o->step_samples : o->batch;
    l->epoch_samples = o->drop_last ? ds->count / step * step : ds->count;
    if (l->epoch_samples == 0) {
        free(l);
        return ct_errf(err, CT_ERR_CONFIG, "%s: %lld samples make no full batch of %lld with "
                       "data.drop_last true; use a smaller batch or set data.drop_last false",
                       ds->source, (long long)ds->count, (long long)step);
    }
    l->bpe = (l->epoch_samples + o->batch - 1) / o->batch;
    l->taken = -1;
    l->perm_epoch[0] = l->perm_epoch[1] = -1;
    if (o->shuffle)
        for (int k = 0; k < 2; k++) l->perm[k] = ct_xmalloc((size_t)ds->count * sizeof(uint32_t));
    if (o->skip_corrupt) l->bad = ct_xcalloc((size_t)ds->count, 1);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    int rc = alloc_buffers(l, err);
    if (rc) {
        ct_loader_free(l);
        return rc;
    }
    setup_cache(l, warn);
    l->threads = ct_xcalloc((size_t)l->o.workers, sizeof *l->threads);
    for (int i = 0; i < l->o.workers; i++) {
        if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) {
            int wanted = l->o.workers; /* resolved count (o->workers may be 0 = auto) */
            ct_loader_free(l);
            return ct_errf(err, CT_ERR_RUNTIME, "cannot start data loader thread %d of %d", i + 1, wanted);
        }
        l->nthreads++;
    }
    *out = l;
    return CT_OK;
}

int ct_loader_next(ct_loader *l, ct_loader_batch *b, ct_err *err) {
    pthread_mutex_lock(&l->mu);
    if (l->taken >= 0) {
        l->slots[l->taken].state = SLOT_FREE;
        l->taken = -1;
        pthread_cond_broadcast(&l->cv_work);
    }
    int k = (int)(l->next_take % l->nslots);
    slot *s = &l->slots[k];
    double t0 = ct_now();
    while (!(s->state == SLOT_READY && s->g == l->next_take)) pthread_cond_wait(&l->cv_ready, &l->mu);
    l->last_wait = ct_now() - t0;
    l->total_wait += l->last_wait;
    s->state = SLOT_TAKEN;
    l->taken = k;
    l->next_take++;
    pthread_cond_broadcast(&l->cv_work); /* the epoch window may have moved */
    pthread_mutex_unlock(&l->mu);
    if (s->rc) {
        if (err) *err = s->err;
        return s->rc;
    }
    b->n = s->n;
    b->epoch = s->g / l->bpe;
    b->index = s->g % l->bpe;
    b->last_of_epoch = b->index == l->bpe - 1;
    b->input = s->in;
    b->target = s->tgt;
    if (l->staged) {
        l->be->copy_h2d(l->be, l->dev_in, s->in, (size_t)s->n * l->in_bytes);
        l->be->copy_h2d(l->be, l->dev_tgt, s->tgt, (size_t)s->n * l->tgt_bytes);
        b->input = l->dev_in;
        b->target = l->dev_tgt;
    }
    return CT_OK;
}

void ct_loader_position(const ct_loader *l, int64_t *epoch, int64_t *batch) {
    pthread_mutex_lock((pthread_mutex_t *)&l->mu);
    *epoch = l->next_take / l->bpe;
    *batch = l->next_take % l->bpe;
    pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
}

void ct_loader_seek(ct_loader *l, int64_t epoch, int64_t batch) {
    pthread_mutex_lock(&l->mu);
    l->gen++;
    for (;;) {
        bool filling = false;
        for (int i = 0; i < l->nslots; i++) filling |= l->slots[i].state == SLOT_FILLING;
        if (!filling) break;
        pthread_cond_wait(&l->cv_ready, &l->mu);
    }
    for (int i = 0; i < l->nslots; i++) l->slots[i].state = SLOT_FREE;
    l->taken = -1;
    l->next_claim = l->next_take = epoch * l->bpe + batch;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
}

int64_t ct_loader_batches_per_epoch(const ct_loader *l) { return l->bpe; }
double ct_loader_last_wait(const ct_loader *l) { return l->last_wait; }
double ct_loader_total_wait(const ct_loader *l) { return l->total_wait; }
int64_t ct_loader_skipped(const ct_loader *l) { return atomic_load(&((ct_loader *)l)->skipped); }

void ct_loader_free(ct_loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
    free(l->threads);
    for (int i = 0; l->slots && i < l->nslots; i++) {
        if (l->slots[i].in) l->be->free_host_pinned(l->be, l->slots[i].in);
        if (l->slots[i].tgt) l->be->free_host_pinned(l->be, l->slots[i].tgt);
    }
    free(l->slots);
    if (l->dev_in) l->be->free(l->be, l->dev_in);
    if (l->dev_tgt) l->be->free(l->be, l->dev_tgt);
    free(l->perm[0]);
    free(l->perm[1]);
    free(l->cache);
    free((void *)l->cstate);
    free((void *)l->bad);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    free(l);
}

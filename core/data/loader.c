/* loader.c: worker threads filling a ring of batch slots in stream order (see loader.h).
 *
 * Batch g of the stream (counted from the last seek; ct_loader_init is a seek to sample 0 of
 * epoch 0) goes to slot g % prefetch. Workers claim batch numbers in increasing order under the
 * mutex, fill the slot without it, and mark it READY; the trainer takes batch `next_take` when its
 * slot is READY, and frees it on its next call. Claims are limited to the trainer's epoch and the
 * one after it, so two cached permutations (indexed by epoch % 2) cover every batch being filled.
 * A seek bumps the generation: batches of the old generation still being filled are thrown away
 * when their worker finishes.
 *
 * Positions are samples of an epoch's order, not batches, so that a seek lands on the same sample
 * whatever the micro-batch: after a seek to (epoch e, sample p) the stream is the rest of epoch e
 * in micro-batches starting at p (its first `base_batches` batches), then whole epochs from
 * their first sample.
 *
 * Staged mode (device backends, and on_device): the taken slot is uploaded with be->upload into
 * one of two sets of device buffers (alternate batches; the upload waits only for the steps that
 * read its set two batches ago, so it overlaps the step queued in between) and parked UPLOADING
 * with its ticket; it becomes FREE once upload_done(ticket) (polled without waiting on each call;
 * waited for only when the trainer would wait anyway). */
#include "core/data/loader.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/data/order.h"
#include "core/data/transform.h"
#include "core/util/rng.h"

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_TAKEN, SLOT_UPLOADING };
enum { BAD_NONE, BAD_COUNTED, BAD_NAMED };     /* skip_corrupt: a record's state */
enum { SKIP_MSG = 512 };                       /* bytes kept of a skipped record's error */
enum { CACHE_EMPTY, CACHE_READY, CACHE_WRITING };

typedef struct slot {
    void *in, *tgt;              /* pinned host: [batch, sample] (+ [batch] flip bytes when u8),
                                    [batch, target] */
    int state;
    uint64_t ticket;             /* UPLOADING: the upload that reads this slot last */
    int64_t g, n;
    int64_t epoch, start, want; /* batch g: `want` samples of epoch's order from `start` */
    uint64_t gen;
    int rc;
    ct_err err;
    /* skip_corrupt: the records this batch skipped, and the errors of the first
     * CT_LOADER_SKIPS_NAMED of them (enough: see note_skips) */
    int64_t *skip_idx;           /* [batch] */
    char (*skip_msg)[SKIP_MSG];  /* [CT_LOADER_SKIPS_NAMED] */
    int n_skip;
} slot;

struct ct_loader {
    ct_backend *be;
    const ct_dataset *ds;
    ct_loader_opts o;
    size_t in_bytes, tgt_bytes;
    int64_t epoch_samples, bpe;  /* an epoch from its start: samples used (drop_last), batches
                                    of this loader's stream (its rank's share) */
    int64_t all_bpe;             /* batches of an epoch over all ranks */
    int64_t step;                /* drop_last cuts epochs to whole steps of this many samples */
    int64_t per_rank, accum;     /* world > 1: a rank's samples of a full step, its batches */
    /* The stream since the last seek: batches [0, base_batches) are the rest of base_epoch from
     * sample base_off to base_end; then epochs base_epoch + 1, ... of bpe batches each. */
    int64_t base_epoch, base_off, base_end, base_batches;
    /* The epoch a seek asked for and where the stream's part of it ends: base_epoch and base_end,
     * or when nothing was left of it, the sample asked for (the stream then starts at the next
     * epoch, and the caller's epoch must end where it stands, not at the usual end). */
    int64_t sought_epoch, sought_end;
    bool class_targets;
    bool id_samples;             /* int32 samples checked against o.ids_below */

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
    /* skip_corrupt, kept on the taker's thread in stream order (note_skips), so the records
     * named and the counts do not depend on which worker met a record first */
    uint8_t *bad;                /* [count] BAD_* */
    int64_t skipped;             /* distinct records skipped */
    int named;                   /* records named in a warning (up to CT_LOADER_SKIPS_NAMED) */
    int64_t skip_epoch;          /* the epoch the two counts below are for */
    int64_t epoch_skips, epoch_unnamed;

    /* Staged: two sets of device buffers, used by alternate batches, so the upload of the next
     * batch overlaps the steps queued on the current one (it waits only for the compute_mark
     * taken when its set's previous batch had been fully queued: dev_mark). */
    void *dev_in[2], *dev_tgt[2]; /* the batch as the trainer sees it */
    uint8_t *dev_px[2];          /* u8: uploaded pixels [batch, sample] + flip bytes [batch] */
    uint64_t dev_mark[2];        /* 0: wait for everything queued */
    int dev_next;                /* the set the next batch uses */
    bool staged;                 /* upload the slot instead of handing it out */
    bool u8;                     /* on_device path: slots hold uint8 pixels */
    uint64_t last_ticket;        /* the newest upload queued */
    double last_wait, total_wait;

    pthread_t *threads;
    int nthreads;
};

static int64_t online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* ---- filling a batch ---- */

/* The augmentation of sample idx in `epoch`: crop offsets and flip, from Philox. */
static void augment_draw(const ct_loader *l, int64_t epoch, int64_t idx, int64_t *oy, int64_t *ox,
                         bool *flip) {
    const ct_augment *a = &l->o.aug;
    int64_t p = a->crop_pad;
    ct_rng r;
    ct_rng_init(&r, l->o.seed, CT_RNG_AUGMENT, (uint64_t)epoch * (uint64_t)l->ds->count + (uint64_t)idx);
    *oy = p ? ct_rng_below(&r, (uint32_t)(2 * p + 1)) - p : 0;
    *ox = p ? ct_rng_below(&r, (uint32_t)(2 * p + 1)) - p : 0;
    *flip = a->hflip && (ct_rng_u32(&r) & 1);
}

/* on_device: random crop of one [C, H, W] uint8 sample in place, padding with pixel 0; the flip
 * is left to normalize_u8 (returned in *flip). */
static void augment_u8(const ct_loader *l, int64_t epoch, int64_t idx, uint8_t *x, uint8_t *scratch,
                       uint8_t *flip) {
    const ct_augment *a = &l->o.aug;
    *flip = 0;
    if (!a->crop_pad && !a->hflip) return;
    const ct_shape *s = &l->ds->sample_shape;
    int64_t C = s->d[0], H = s->d[1], W = s->d[2], oy, ox;
    bool fl;
    augment_draw(l, epoch, idx, &oy, &ox, &fl);
    *flip = fl;
    if (!oy && !ox) return;
    memcpy(scratch, x, (size_t)(C * H * W));
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t xx = 0; xx < W; xx++) {
                int64_t sy = y + oy, sx = xx + ox;
                bool in = sy >= 0 && sy < H && sx >= 0 && sx < W;
                x[(c * H + y) * W + xx] = in ? scratch[(c * H + sy) * W + sx] : 0;
            }
}

/* Random crop with padding, then horizontal flip, of one [C, H, W] float sample in place. */
static void augment(const ct_loader *l, int64_t epoch, int64_t idx, float *x, float *scratch) {
    const ct_augment *a = &l->o.aug;
    if (!a->crop_pad && !a->hflip) return;
    const ct_shape *s = &l->ds->sample_shape;
    int64_t C = s->d[0], H = s->d[1], W = s->d[2], oy, ox;
    bool flip;
    augment_draw(l, epoch, idx, &oy, &ox, &flip);
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

/* Token ids past the model's embedding table: a data error naming the record and the position. */
static int check_ids(const ct_loader *l, int64_t idx, const void *in, ct_err *err) {
    if (!l->id_samples) return CT_OK;
    const int32_t *ids = in;
    int64_t n = ct_shape_numel(&l->ds->sample_shape);
    for (int64_t t = 0; t < n; t++) {
        if (ids[t] >= 0 && ids[t] < l->o.ids_below) continue;
        char at[1200] = "";
        if (l->ds->where) {
            at[0] = ' ', at[1] = '(';
            l->ds->where(l->ds, idx, t, at + 2, sizeof at - 3);
            strcat(at, ")");
        }
        return ct_errf(err, CT_ERR_DATA, "%s: record %lld, position %lld%s: token id %d is outside the "
                       "model's embedding vocabulary of %lld (0..%lld)\n  The data was tokenized with "
                       "another vocabulary than the model's: set the embedding's \"vocab\" to the "
                       "tokenizer's (GPT-2: 50257, or 50304 padded), or re-tokenize the data",
                       l->ds->source, (long long)idx, (long long)t, at, ids[t], (long long)l->o.ids_below,
                       (long long)l->o.ids_below - 1);
    }
    return CT_OK;
}

/* Decoded, label-checked sample idx (from the cache when it holds it). */
static int load_sample(ct_loader *l, int64_t idx, uint8_t *in, uint8_t *tgt, ct_err *err) {
    uint8_t *c = l->cache ? l->cache + (size_t)idx * (l->in_bytes + l->tgt_bytes) : NULL;
    if (c && atomic_load_explicit(&l->cstate[idx], memory_order_acquire) == CACHE_READY) {
        memcpy(in, c, l->in_bytes);
        memcpy(tgt, c + l->in_bytes, l->tgt_bytes);
        return CT_OK;
    }
    int rc = l->u8 ? l->ds->decode_u8(l->ds, idx, in, tgt, err) : l->ds->decode(l->ds, idx, in, tgt, err);
    if (!rc) rc = check_label(l, idx, tgt, err);
    if (!rc) rc = check_ids(l, idx, in, err);
    uint8_t expect = CACHE_EMPTY;
    if (!rc && c &&
        atomic_compare_exchange_strong(&l->cstate[idx], &expect, (uint8_t)CACHE_WRITING)) {
        memcpy(c, in, l->in_bytes);
        memcpy(c + l->in_bytes, tgt, l->tgt_bytes);
        atomic_store_explicit(&l->cstate[idx], (uint8_t)CACHE_READY, memory_order_release);
    }
    return rc;
}

void ct_loader_rank_slice(int64_t n, int64_t per_rank, int rank, int64_t *lo, int64_t *hi) {
    int64_t a = (int64_t)rank * per_rank, b = a + per_rank;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

static bool sliced(const ct_loader *l) { return l->o.world > 1; }

/* The batches of this loader's stream in a part of an epoch of len samples (from its start or a
 * seek): all of them, or the rank's micro-batches of each step. */
static int64_t segment_batches(const ct_loader *l, int64_t len) {
    if (!sliced(l)) return (len + l->o.batch - 1) / l->o.batch;
    int64_t lo, hi;
    ct_loader_rank_slice(len % l->step, l->per_rank, l->o.rank, &lo, &hi);
    return len / l->step * l->accum + (hi - lo + l->o.batch - 1) / l->o.batch;
}

/* Batch g of a segment that starts at sample `from` and ends at `end`: its first sample, and
 * where the samples it may take end (the segment's end, or the end of the rank's slice of g's
 * step). */
static void segment_batch(const ct_loader *l, int64_t g, int64_t from, int64_t end, int64_t *start,
                          int64_t *stop) {
    if (!sliced(l)) {
        *start = from + g * l->o.batch;
        *stop = end;
        return;
    }
    int64_t s = g / l->accum, step0 = from + s * l->step, lo, hi;
    int64_t n = end - step0 < l->step ? end - step0 : l->step;
    ct_loader_rank_slice(n, l->per_rank, l->o.rank, &lo, &hi);
    *start = step0 + lo + g % l->accum * l->o.batch;
    *stop = step0 + hi;
}

/* Where batch g of the stream lies: its epoch, its first sample in that epoch's order, and where
 * the samples it may take end (it holds min(batch, *end - *start) samples). */
static void batch_at(const ct_loader *l, int64_t g, int64_t *epoch, int64_t *start, int64_t *end) {
    if (g < l->base_batches) {
        *epoch = l->base_epoch;
        segment_batch(l, g, l->base_off, l->base_end, start, end);
        return;
    }
    g -= l->base_batches;
    *epoch = l->base_epoch + 1 + g / l->bpe;
    segment_batch(l, g % l->bpe, 0, l->epoch_samples, start, end);
}

/* Whether batch g of the stream is the last of its epoch. */
static bool last_of_epoch(const ct_loader *l, int64_t g) {
    if (g < l->base_batches) return g == l->base_batches - 1;
    return (g - l->base_batches) % l->bpe == l->bpe - 1;
}

static int64_t epoch_of(const ct_loader *l, int64_t g) {
    int64_t e, start, end;
    batch_at(l, g, &e, &start, &end);
    return e;
}

/* Where an epoch entered at sample `from` ends: with drop_last after the last whole step from
 * there (a resume with another train_batch_size keeps every step full; from sample 0 that is
 * epoch_samples), else at the last sample. At most `from`: nothing is left. */
static int64_t epoch_end_from(const ct_loader *l, int64_t from) {
    int64_t count = l->ds->count;
    if (from >= count) return from;
    return l->o.drop_last ? from + (count - from) / l->step * l->step : count;
}

/* Assemble batch s->g into slot s (its position was set when it was claimed). Runs without the
 * mutex. */
static void fill(ct_loader *l, slot *s, const uint32_t *perm, void *scratch) {
    int64_t epoch = s->epoch, start = s->start, n = s->want;
    int64_t out = 0;
    s->rc = CT_OK;
    s->n_skip = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t idx = perm ? perm[start + j] : start + j;
        uint8_t *in = (uint8_t *)s->in + (size_t)out * l->in_bytes;
        uint8_t *tgt = (uint8_t *)s->tgt + (size_t)out * l->tgt_bytes;
        int rc = load_sample(l, idx, in, tgt, &s->err);
        if (rc == CT_ERR_DATA && l->o.skip_corrupt) {
            if (s->n_skip < CT_LOADER_SKIPS_NAMED) {
                const char *m = s->err.msg;
                snprintf(s->skip_msg[s->n_skip], SKIP_MSG, "%.*s", (int)strcspn(m, "\n"), m);
            }
            s->skip_idx[s->n_skip++] = idx;
            continue;
        }
        if (rc) {
            s->rc = rc;
            break;
        }
        if (l->u8) {
            uint8_t *flips = (uint8_t *)s->in + (size_t)l->o.batch * l->in_bytes;
            augment_u8(l, epoch, idx, in, scratch, &flips[out]);
        } else {
            augment(l, epoch, idx, (float *)in, scratch);
        }
        out++;
    }
    s->n = out;
}

/* Permutation of `epoch`, computing it on first use. Called with the mutex held. */
static const uint32_t *epoch_perm(ct_loader *l, int64_t epoch) {
    if (!l->o.shuffle) return NULL;
    int k = (int)(epoch % 2);
    if (l->perm_epoch[k] != epoch) {
        if (l->o.shuffle_buffer > 0) ct_order_shuffle_buffer(l->ds, l->o.seed, (uint64_t)epoch, l->o.shuffle_buffer, l->perm[k]);
        else ct_rng_permutation(l->o.seed, (uint64_t)epoch, l->perm[k], (uint32_t)l->ds->count);
        l->perm_epoch[k] = epoch;
    }
    return l->perm[k];
}

static void *worker_main(void *arg) {
    ct_loader *l = arg;
    bool aug = l->o.aug.crop_pad || l->o.aug.hflip;
    void *scratch = aug ? ct_xmalloc(l->in_bytes) : NULL;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        int64_t g = l->next_claim;
        slot *s = &l->slots[g % l->nslots];
        if (s->state != SLOT_FREE || epoch_of(l, g) > epoch_of(l, l->next_take) + 1) {
            pthread_cond_wait(&l->cv_work, &l->mu);
            continue;
        }
        s->state = SLOT_FILLING;
        int64_t end;
        s->g = g;
        batch_at(l, g, &s->epoch, &s->start, &end);
        s->want = end - s->start < l->o.batch ? end - s->start : l->o.batch;
        s->gen = l->gen;
        l->next_claim++;
        const uint32_t *perm = epoch_perm(l, s->epoch);
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
    l->cstate = calloc((size_t)l->ds->count, 1);
    if (!l->cstate) {
        free(l->cache);
        l->cache = NULL;
        if (warn) ct_warnf(warn, "data.cache: could not allocate its %lld sample marks; running without a cache",
                           (long long)l->ds->count);
    }
}

/* Bytes of one slot's input: the samples, plus one flip byte per sample on the u8 path. */
static size_t slot_in_bytes(const ct_loader *l) {
    return (size_t)l->o.batch * (l->in_bytes + (l->u8 ? 1 : 0));
}

/* The device copies of one of the two batch buffers: the input as the model reads it, the
 * targets, and on the u8 path the uint8 pixels with their flip bytes as uploaded. */
typedef struct dev_sizes {
    size_t in, tgt, px;
} dev_sizes;

static dev_sizes device_sizes(int64_t batch, int64_t sample_numel, ct_dtype sample_dt,
                              int64_t target_numel, ct_dtype target_dt, bool u8, ct_dtype device_dt) {
    dev_sizes d;
    d.px = u8 ? (size_t)batch * ((size_t)sample_numel + 1) : 0;
    d.in = u8 ? (size_t)(batch * sample_numel) * ct_dtype_size(device_dt)
              : (size_t)(batch * sample_numel) * ct_dtype_size(sample_dt);
    d.tgt = (size_t)(batch * target_numel) * ct_dtype_size(target_dt);
    return d;
}

static size_t at_least1(size_t n) { return n ? n : 1; }

size_t ct_loader_device_bytes(int64_t batch, int64_t sample_numel, ct_dtype sample_dt,
                              int64_t target_numel, ct_dtype target_dt, bool u8, ct_dtype device_dt) {
    dev_sizes d = device_sizes(batch, sample_numel, sample_dt, target_numel, target_dt, u8, device_dt);
    return 2 * (at_least1(d.in) + at_least1(d.tgt) + (u8 ? at_least1(d.px) : 0));
}

static int alloc_buffers(ct_loader *l, ct_err *err) {
    ct_backend *be = l->be;
    size_t bin = slot_in_bytes(l), btg = (size_t)l->o.batch * l->tgt_bytes;
    l->slots = ct_xcalloc((size_t)l->nslots, sizeof *l->slots);
    bool ok = true;
    for (int i = 0; i < l->nslots; i++) {
        l->slots[i].in = be->mem.alloc_host_pinned(be, bin ? bin : 1, CT_MEM_LOADER);
        l->slots[i].tgt = be->mem.alloc_host_pinned(be, btg ? btg : 1, CT_MEM_LOADER);
        ok &= l->slots[i].in && l->slots[i].tgt;
        if (l->o.skip_corrupt) {
            l->slots[i].skip_idx = ct_xmalloc((size_t)l->o.batch * sizeof *l->slots[i].skip_idx);
            l->slots[i].skip_msg = ct_xmalloc(CT_LOADER_SKIPS_NAMED * sizeof *l->slots[i].skip_msg);
        }
    }
    if (l->staged) {
        dev_sizes d = device_sizes(l->o.batch, ct_shape_numel(&l->ds->sample_shape), l->ds->sample_dtype,
                                   ct_shape_numel(&l->ds->target_shape), l->ds->target_dtype, l->u8,
                                   l->o.device_dtype);
        for (int k = 0; k < 2; k++) {
            l->dev_in[k] = be->mem.alloc(be, at_least1(d.in), CT_MEM_LOADER);
            l->dev_tgt[k] = be->mem.alloc(be, at_least1(d.tgt), CT_MEM_LOADER);
            ok &= l->dev_in[k] && l->dev_tgt[k];
            if (l->u8) {
                l->dev_px[k] = be->mem.alloc(be, at_least1(d.px), CT_MEM_LOADER);
                ok &= l->dev_px[k] != NULL;
            }
        }
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
    bool on_cpu = !ct_backend_separate_memory(be);   /* the capped device takes a GPU's uploads */
    l->u8 = o->on_device && ds->decode_u8 && (!on_cpu || o->on_device_cpu);
    l->staged = !on_cpu || l->u8;
    l->in_bytes = (size_t)ct_shape_numel(&ds->sample_shape) * (l->u8 ? 1 : ct_dtype_size(ds->sample_dtype));
    l->tgt_bytes = (size_t)ct_shape_numel(&ds->target_shape) * ct_dtype_size(ds->target_dtype);
    l->class_targets = ds->target_dtype == CT_I32 && ds->target_shape.ndim == 0 && o->classes > 0;
    l->id_samples = ds->sample_dtype == CT_I32 && !l->u8 && o->ids_below > 0;
    l->step = o->step_samples > 0 ? o->step_samples : o->batch;
    l->epoch_samples = epoch_end_from(l, 0);
    if (l->epoch_samples == 0) {
        int64_t step = l->step;
        free(l);
        return ct_errf(err, CT_ERR_CONFIG, "%s: %lld samples make no full batch of %lld with "
                       "data.drop_last true; use a smaller batch or set data.drop_last false",
                       ds->source, (long long)ds->count, (long long)step);
    }
    if (o->world > 1) {
        l->per_rank = l->step / o->world;
        l->accum = l->per_rank / o->batch;
        if (l->step % o->world || l->per_rank % o->batch) {
            int64_t step = l->step;
            free(l);
            return ct_errf(err, CT_ERR_CONFIG, "a step of %lld samples does not split into %d ranks' "
                           "micro-batches of %lld: train_batch_size must be micro-batch x accumulation x "
                           "world size", (long long)step, o->world, (long long)o->batch);
        }
    }
    l->bpe = segment_batches(l, l->epoch_samples);
    l->all_bpe = (l->epoch_samples + o->batch - 1) / o->batch;
    if (l->bpe == 0) {   /* a short epoch (drop_last false) with nothing for this rank */
        int64_t n = l->epoch_samples;
        free(l);
        return ct_errf(err, CT_ERR_CONFIG, "%s: an epoch of %lld samples leaves rank %d of %d nothing to "
                       "train on; use fewer ranks or a smaller batch", ds->source, (long long)n, o->rank,
                       o->world);
    }
    l->base_end = l->sought_end = l->epoch_samples;   /* the stream from (epoch 0, sample 0) */
    l->base_batches = l->bpe;
    l->taken = -1;
    l->perm_epoch[0] = l->perm_epoch[1] = -1;
    l->skip_epoch = -1;
    /* sized by the data set: a failure names it (the run writes its summary), not a source line */
    char what[sizeof ds->source + 80];
    snprintf(what, sizeof what, "the shuffle order of %s (%lld samples)", ds->source, (long long)ds->count);
    int rc = CT_OK;
    for (int k = 0; k < 2 && o->shuffle && !rc; k++)
        if (!(l->perm[k] = ct_try_malloc((size_t)ds->count * sizeof(uint32_t), what, err))) rc = CT_ERR_RUNTIME;
    snprintf(what, sizeof what, "data.skip_corrupt's record marks of %s (%lld samples)", ds->source, (long long)ds->count);
    if (!rc && o->skip_corrupt && !(l->bad = ct_try_calloc((size_t)ds->count, 1, what, err))) rc = CT_ERR_RUNTIME;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    if (!rc) rc = alloc_buffers(l, err);
    if (rc) {
        ct_loader_free(l);
        return rc;
    }
    setup_cache(l, warn);
    l->threads = ct_xcalloc((size_t)l->o.workers, sizeof *l->threads);
    for (int i = 0; i < l->o.workers; i++) {
        int why = pthread_create(&l->threads[i], NULL, worker_main, l);
        if (why != 0) {
            int wanted = l->o.workers; /* resolved count (o->workers may be 0 = auto) */
            ct_loader_free(l);
            return ct_errf(err, CT_ERR_RUNTIME, "cannot start data loader thread %d of %d: %s\n"
                           "  Use fewer loader threads (data.workers), or raise the process or "
                           "memory limits (ulimit -u, -v)", i + 1, wanted, strerror(why));
        }
        l->nthreads++;
    }
    *out = l;
    return CT_OK;
}

/* Slots whose upload has finished go back to the workers. Called with the mutex held; only the
 * trainer's thread changes UPLOADING slots. */
static bool uploaded(const ct_loader *l, uint64_t ticket, bool wait) {
    return !l->be->queue.upload_done || l->be->queue.upload_done(l->be, ticket, wait);
}

static void reclaim_uploaded(ct_loader *l) {
    bool freed = false;
    for (int i = 0; i < l->nslots; i++) {
        slot *s = &l->slots[i];
        if (s->state == SLOT_UPLOADING && uploaded(l, s->ticket, false)) {
            s->state = SLOT_FREE;
            freed = true;
        }
    }
    if (freed) pthread_cond_broadcast(&l->cv_work);
}

/* Wait (without the mutex) for every queued upload; returns with the mutex held again. */
static void wait_uploads_unlocked(ct_loader *l) {
    bool any = false;
    for (int i = 0; i < l->nslots; i++) any |= l->slots[i].state == SLOT_UPLOADING;
    if (!any) return;
    pthread_mutex_unlock(&l->mu);
    (void)uploaded(l, l->last_ticket, true);
    pthread_mutex_lock(&l->mu);
    reclaim_uploaded(l);
}

/* Queue one upload from a slot once the ops queued before `after` are done (a plain copy where
 * the backend has no upload). */
static uint64_t put(ct_loader *l, void *dst, const void *src, size_t bytes, uint64_t after) {
    ct_backend *be = l->be;
    if (!be->queue.upload) {
        be->mem.copy_h2d(be, dst, src, bytes);
        return l->last_ticket;
    }
    l->last_ticket = be->queue.upload(be, dst, src, bytes, after);
    return l->last_ticket;
}

/* Staged: upload slot s and (u8) normalise it on the backend; the slot is parked UPLOADING. */
static void stage(ct_loader *l, slot *s, ct_loader_batch *b) {
    ct_backend *be = l->be;
    int k = l->dev_next;
    l->dev_next ^= 1;
    /* Every op reading the other set (the previous batch) is queued by now: mark it free from
     * here. This batch's set was marked at the previous call. */
    uint64_t after = l->dev_mark[k];
    l->dev_mark[k ^ 1] = be->queue.compute_mark ? be->queue.compute_mark(be) : 0;
    void *dev_in = l->dev_in[k], *dev_tgt = l->dev_tgt[k];
    uint8_t *dev_px = l->dev_px[k];
    size_t px = (size_t)s->n * l->in_bytes;
    put(l, l->u8 ? (void *)dev_px : dev_in, s->in, px, after);
    size_t flip_off = (size_t)l->o.batch * l->in_bytes;
    bool flips = l->u8 && l->o.aug.hflip;
    if (flips) put(l, dev_px + flip_off, (uint8_t *)s->in + flip_off, (size_t)s->n, after);
    uint64_t t = put(l, dev_tgt, s->tgt, (size_t)s->n * l->tgt_bytes, after);
    if (l->u8 && s->n > 0) {
        const ct_shape *sh = &l->ds->sample_shape;
        ct_u8_normalize p = {.n = s->n, .c = sh->ndim == 3 ? sh->d[0] : 1};
        p.h = sh->ndim == 3 ? sh->d[1] : 1;
        p.w = (int64_t)l->in_bytes / (p.c * p.h);
        for (int c = 0; c < CT_NORM_MAX_CHANNELS; c++) {
            p.mean[c] = c < p.c ? l->o.mean[c] : 0.0f;
            p.std[c] = c < p.c ? l->o.std[c] : 1.0f;
        }
        be->elt.normalize_u8(be, dev_in, dev_px, flips ? dev_px + flip_off : NULL, &p,
                         l->o.device_dtype);
    }
    b->input = dev_in;
    b->target = dev_tgt;
    b->input_dtype = l->u8 ? l->o.device_dtype : l->ds->sample_dtype;
    pthread_mutex_lock(&l->mu);
    s->ticket = t;
    s->state = SLOT_UPLOADING;
    l->taken = -1;
    reclaim_uploaded(l);
    pthread_mutex_unlock(&l->mu);
}

static void say(const ct_loader *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const ct_loader *l, const char *fmt, ...) {
    if (!l->o.warn_fn) return;
    char line[SKIP_MSG + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char shown[4 * sizeof line];   /* a record's error may quote names from the file */
    l->o.warn_fn(l->o.warn_ctx, ct_printable(shown, sizeof shown, line, strlen(line), CT_PRINT_NAME));
}

/* skip_corrupt bookkeeping of the batch just taken: count each record once, name the first
 * CT_LOADER_SKIPS_NAMED, and at the end of an epoch count the skips not named (a bad file seen
 * every epoch is named once, not every epoch). The slot kept the errors of its first
 * CT_LOADER_SKIPS_NAMED skips, which holds every record still to be named: until that many are
 * named, every record skipped before has been named, so at most `named` skips of the batch come
 * before its first unnamed one. */
static void note_skips(ct_loader *l, const slot *s, int64_t epoch, bool last_of_epoch) {
    if (epoch != l->skip_epoch) {
        l->skip_epoch = epoch;
        l->epoch_skips = l->epoch_unnamed = 0;
    }
    for (int j = 0; j < s->n_skip; j++) {
        uint8_t *st = &l->bad[s->skip_idx[j]];
        l->epoch_skips++;
        if (*st == BAD_NONE) {
            l->skipped++;
            *st = BAD_COUNTED;
            if (l->named < CT_LOADER_SKIPS_NAMED && j < CT_LOADER_SKIPS_NAMED) {
                *st = BAD_NAMED;
                l->named++;
                say(l, "data.skip_corrupt: skipped %s%s", s->skip_msg[j],
                    l->named == CT_LOADER_SKIPS_NAMED ? " (further corrupt records are counted, not "
                                                        "named: one line per epoch)" : "");
            }
        }
        l->epoch_unnamed += *st != BAD_NAMED;
    }
    if (last_of_epoch && l->epoch_unnamed)
        say(l, "data.skip_corrupt: %s: epoch %lld skipped %lld corrupt records, %lld of them not named "
            "above (%lld distinct so far)", l->ds->source, (long long)epoch + 1, (long long)l->epoch_skips,
            (long long)l->epoch_unnamed, (long long)l->skipped);
}

int ct_loader_next(ct_loader *l, ct_loader_batch *b, ct_err *err) {
    pthread_mutex_lock(&l->mu);
    if (l->taken >= 0) {
        l->slots[l->taken].state = SLOT_FREE;
        l->taken = -1;
        pthread_cond_broadcast(&l->cv_work);
    }
    if (l->staged) reclaim_uploaded(l);
    int k = (int)(l->next_take % l->nslots);
    slot *s = &l->slots[k];
    double t0 = ct_now();
    while (!(s->state == SLOT_READY && s->g == l->next_take)) {
        if (l->staged) wait_uploads_unlocked(l); /* workers may need those slots */
        if (s->state == SLOT_READY && s->g == l->next_take) break;
        pthread_cond_wait(&l->cv_ready, &l->mu);
    }
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
    int64_t end;
    batch_at(l, s->g, &b->epoch, &b->start, &end);
    b->last_of_epoch = last_of_epoch(l, s->g);
    b->input = s->in;
    b->target = s->tgt;
    b->input_dtype = l->ds->sample_dtype;
    if (l->bad) note_skips(l, s, b->epoch, b->last_of_epoch);
    if (l->staged) stage(l, s, b);
    return CT_OK;
}

void ct_loader_position(const ct_loader *l, int64_t *epoch, int64_t *sample) {
    pthread_mutex_lock((pthread_mutex_t *)&l->mu);
    int64_t end;
    batch_at(l, l->next_take, epoch, sample, &end);
    pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
}

int64_t ct_loader_epoch_end(const ct_loader *l, int64_t epoch) {
    return epoch == l->base_epoch ? l->base_end : epoch == l->sought_epoch ? l->sought_end : l->epoch_samples;
}

void ct_loader_seek(ct_loader *l, int64_t epoch, int64_t sample) {
    pthread_mutex_lock(&l->mu);
    l->gen++;
    if (l->staged) wait_uploads_unlocked(l); /* the DMA must be done reading before refills */
    for (;;) {
        bool filling = false;
        for (int i = 0; i < l->nslots; i++) filling |= l->slots[i].state == SLOT_FILLING;
        if (!filling) break;
        pthread_cond_wait(&l->cv_ready, &l->mu);
    }
    for (int i = 0; i < l->nslots; i++) l->slots[i].state = SLOT_FREE;
    l->taken = -1;
    /* No fill is running now (the loop above), so the base the workers read can change. */
    int64_t from = sample < 0 ? 0 : sample;
    int64_t end = epoch_end_from(l, from);
    l->sought_epoch = epoch;
    l->sought_end = end > from ? end : from;
    if (end <= from) { /* nothing left of that epoch: the next one from its start */
        epoch++;
        from = 0;
        end = l->epoch_samples;
    }
    l->base_epoch = epoch;
    l->base_off = from;
    l->base_end = end;
    l->base_batches = segment_batches(l, end - from);
    l->next_claim = l->next_take = 0;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
}

int64_t ct_loader_batches_per_epoch(const ct_loader *l) { return l->all_bpe; }
double ct_loader_last_wait(const ct_loader *l) { return l->last_wait; }
double ct_loader_total_wait(const ct_loader *l) { return l->total_wait; }
int64_t ct_loader_skipped(const ct_loader *l) { return l->skipped; }

void ct_loader_free(ct_loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_work);
    if (l->staged && l->slots) wait_uploads_unlocked(l); /* before the slots are freed */
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
    free(l->threads);
    for (int i = 0; l->slots && i < l->nslots; i++) {
        if (l->slots[i].in) l->be->mem.free_host_pinned(l->be, l->slots[i].in);
        if (l->slots[i].tgt) l->be->mem.free_host_pinned(l->be, l->slots[i].tgt);
        free(l->slots[i].skip_idx);
        free(l->slots[i].skip_msg);
    }
    free(l->slots);
    for (int k = 0; k < 2; k++) {
        if (l->dev_in[k]) l->be->mem.free(l->be, l->dev_in[k]);
        if (l->dev_tgt[k]) l->be->mem.free(l->be, l->dev_tgt[k]);
        if (l->dev_px[k]) l->be->mem.free(l->be, l->dev_px[k]);
    }
    free(l->perm[0]);
    free(l->perm[1]);
    free(l->cache);
    free((void *)l->cstate);
    free(l->bad);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    free(l);
}

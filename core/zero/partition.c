/* partition.c: ZeRO stages 2 and 3 around every layer: stage 3's parameter gathers, both stages'
 * gradient reduce-scatters (partition.h). */
#include "core/zero/partition.h"

#include <stdlib.h>

#include "core/graph/layer.h"

/* A run of a layer's views adjacent in the flat space, gathered (stage 3) and reduced by one
 * collective each. */
typedef struct part_span {
    int64_t a, b;                /* the flat range [a, b) */
    int64_t at;                  /* its place in the layer's scratch (elements, aligned) */
    int64_t persist_at;          /* a persistent view: its place in the packed buffer; else -1 */
} part_span;

/* The spans of every layer, and the persistent views' packing: a pure function of the layout and
 * the threshold, shared by the plan and the allocation. */
typedef struct part_layout {
    part_span *spans;
    int *first;                  /* [n_layers + 1]: layer j's spans are [first[j], first[j + 1]) */
    int64_t *persist_at;         /* [n_views]: a persistent view's place in the packed buffer, or -1 */
    int64_t persist_elems;       /* the packed buffer */
    int64_t scratch_elems;       /* the most any layer's spans take in scratch */
    int64_t share_elems;         /* the most of one layer's spans one rank owns (each span at most
                                    a rank's part) */
    int64_t *layer_elems;        /* [n_layers]: layer j's place in scratch (aligned; 0: no spans) */
    int64_t all_layer_elems;     /* their sum */
    int world;
} part_layout;

static int64_t align_up(int64_t x) { return (x + CT_VIEW_ALIGN - 1) / CT_VIEW_ALIGN * CT_VIEW_ALIGN; }

static int by_offset(const void *x, const void *y, void *ctx) {
    const ct_param_layout *L = ctx;
    int64_t a = L->views[*(const int *)x].offset, b = L->views[*(const int *)y].offset;
    return (a > b) - (a < b);
}

/* Layer j's trainable views in offset order (a layer has at most CT_LAYER_MAX_PARAMS). */
static int layer_views(const ct_param_layout *L, int j, int out[CT_LAYER_MAX_PARAMS]) {
    int n = 0;
    for (int s = 0; s < ct_param_layout_layer_specs(L, j); s++) {
        int v = ct_param_layout_layer_view(L, j, s);
        if (v >= 0 && L->views[v].trainable) out[n++] = v;
    }
    qsort_r(out, (size_t)n, sizeof *out, by_offset, (void *)L);
    return n;
}

static void part_layout_make(const ct_param_layout *L, double threshold, int world, part_layout *z) {
    *z = (part_layout){.world = world, .first = ct_xcalloc((size_t)L->n_layers + 1, sizeof(int)),
                     .persist_at = ct_xmalloc((size_t)(L->n_views ? L->n_views : 1) * sizeof(int64_t))};
    for (int v = 0; v < L->n_views; v++) {
        z->persist_at[v] = -1;
        if (L->views[v].trainable && (double)L->views[v].numel < threshold) {
            z->persist_at[v] = z->persist_elems;
            z->persist_elems += align_up(L->views[v].numel);
        }
    }
    z->spans = ct_xmalloc((size_t)(L->n_layers * CT_LAYER_MAX_PARAMS + 1) * sizeof *z->spans);
    z->layer_elems = ct_xcalloc((size_t)(L->n_layers ? L->n_layers : 1), sizeof(int64_t));
    int64_t part = world > 0 ? (L->n_params + world - 1) / world : L->n_params;
    int n = 0;
    for (int j = 0; j < L->n_layers; j++) {
        z->first[j] = n;
        int views[CT_LAYER_MAX_PARAMS], k = layer_views(L, j, views);
        int64_t at = 0;
        for (int i = 0; i < k; i++) {
            const ct_param_view *v = &L->views[views[i]];
            int64_t end = v->offset + v->numel;
            part_span *last = n > z->first[j] ? &z->spans[n - 1] : NULL;
            bool persistent = z->persist_at[views[i]] >= 0;
            /* a gathered view next to the previous gathered one extends its span */
            if (last && !persistent && last->persist_at < 0 && align_up(last->b) == v->offset) {
                at += end - last->b;
                last->b = end;
            } else {
                at = align_up(at);
                z->spans[n++] = (part_span){.a = v->offset, .b = end, .at = at,
                                          .persist_at = z->persist_at[views[i]]};
                at += v->numel;
            }
        }
        /* what one rank can own of the layer's spans, all in flight at once */
        int64_t share = 0;
        for (int k = z->first[j]; k < n; k++) {
            int64_t len = z->spans[k].b - z->spans[k].a;
            share += align_up(len < part ? len : part);
        }
        if (share > z->share_elems) z->share_elems = share;
        z->layer_elems[j] = align_up(at);
        z->all_layer_elems += z->layer_elems[j];
        if (at > z->scratch_elems) z->scratch_elems = at;
    }
    z->first[L->n_layers] = n;
    z->scratch_elems = align_up(z->scratch_elems);
}

static void part_layout_free(part_layout *z) {
    free(z->spans);
    free(z->first);
    free(z->persist_at);
    free(z->layer_elems);
}

/* How many layers' gradients are in flight at once: with overlap, the layer's whose reduction
 * runs and the one computing below it. */
static int grad_slots(const ct_partition_opts *o) { return o->overlap ? 2 : 1; }

/* The gather buffer (stage 3): the running layer's parameters, and as many prefetched ones as the
 * prefetch bucket allows (no more than all the layers take, nor than max_live_parameters). */
static int64_t gather_elems(const part_layout *z, const ct_partition_opts *o) {
    int64_t ahead = o->prefetch_elems < z->all_layer_elems ? o->prefetch_elems : z->all_layer_elems;
    if (ahead < 0) ahead = 0;
    int64_t live = z->scratch_elems + ahead;
    if (live > o->max_live_elems) live = o->max_live_elems;
    return live > z->scratch_elems ? live : z->scratch_elems;
}

/* The shares a slot receives on the device: none under offload with one process, whose gradients
 * go down straight from the scratch. */
static int64_t device_share(const part_layout *z, const ct_partition_opts *o) {
    return o->offload && z->world == 1 ? 0 : z->share_elems;
}

/* Offload: each slot's landing buffer for the shares a layer's download brings down. */
static size_t landing_bytes(const part_layout *z, const ct_partition_opts *o) {
    return (size_t)grad_slots(o) * (size_t)(z->share_elems + 1) * sizeof(float);
}

/* Bytes by category of the buffers below; the workspace is the gather buffer (stage 3; 64-byte
 * aligned), then for each gradient slot a layer's gradients (fp32) and this rank's shares; with
 * offload, each slot's landing buffer for the shares in pinned host memory (host may be NULL
 * without offload). */
static void part_bytes(const part_layout *z, const ct_partition_opts *o, ct_dtype compute, int stage,
                       size_t bytes[CT_MEM_CAT_COUNT], size_t host[CT_MEM_CAT_COUNT], size_t *grads_at) {
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) {
        bytes[c] = 0;
        if (host) host[c] = 0;
    }
    if (stage == 3 && z->persist_elems) bytes[CT_MEM_PARAMS] = ct_nbytes(z->persist_elems, compute);
    *grads_at = stage == 3 ? (ct_nbytes(gather_elems(z, o), compute) + 63) / 64 * 64 : 0;
    bytes[CT_MEM_WORKSPACE] = *grads_at + (size_t)grad_slots(o) * (size_t)(z->scratch_elems + device_share(z, o) + 1) *
                                              sizeof(float);
    if (o->offload) host[CT_MEM_WORKSPACE] = landing_bytes(z, o);
}

ct_partition_opts ct_partition_opts_from(const ct_zero_cfg *z) {
    return (ct_partition_opts){.persistence_threshold = z->param_persistence_threshold, .overlap = z->overlap_comm,
                               .prefetch_elems = (int64_t)z->prefetch_bucket_size,
                               .max_live_elems = (int64_t)z->max_live_parameters,
                               .max_reuse_elems = (int64_t)z->max_reuse_distance};
}

void ct_partition_plan(const ct_param_layout *L, ct_dtype compute, int stage, const ct_partition_opts *o, int world,
                       size_t bytes[CT_MEM_CAT_COUNT], size_t host[CT_MEM_CAT_COUNT]) {
    part_layout z;
    size_t grads_at;
    part_layout_make(L, stage == 3 ? o->persistence_threshold : 0, world, &z);
    part_bytes(&z, o, compute, stage, bytes, host, &grads_at);
    part_layout_free(&z);
}

/* A layer's gradients and the reduce-scatters of its spans (overlap: in flight). */
typedef struct grad_slot {
    float *grads;                /* [scratch_elems] */
    float *share;                /* [share_elems]: this rank's shares of the layer's spans */
    int layer;                   /* whose reductions are in flight; -1: none */
    ct_comm_req *req[CT_LAYER_MAX_PARAMS];
    float *landing;              /* offload: [share_elems] pinned, the shares downloaded */
    uint64_t ticket;             /* offload: the last download into landing (0: none queued) */
} grad_slot;

/* A layer's parameters in the gather buffer, gathered or on their way. */
typedef struct gathered {
    int key;                     /* pass * n_layers + layer */
    int64_t at, elems;           /* its place in the buffer */
    ct_comm_req *req[CT_LAYER_MAX_PARAMS];
    bool waited;
} gathered;

enum { GATHER_QUEUE = 64 };      /* layers in the gather buffer at once, at most */

struct ct_partition {
    ct_param_store *p;
    ct_comm *c;
    ct_backend *be;
    bool gather;                 /* stage 3: the parameters are partitioned too */
    ct_partition_opts o;
    part_layout z;
    void *work;                  /* the workspace allocation holding the buffers below */
    void *gbuf;                  /* [gbuf_elems] compute: the gathered layers (a ring, in queue order) */
    int64_t gbuf_elems;
    grad_slot slot[2];
    int n_slots, next_slot;      /* the next backward takes slot[next_slot], the oldest */
    gathered queue[GATHER_QUEUE];/* in gather order; queue[head] is the running layer's (or the
                                    last one's) */
    int head, count;
    int *next_key;               /* [3 * n_layers]: the gathering (pass, layer) seen after this one */
    int prev_key;                /* the last gathering (pass, layer) of this walk; -1: none */
    long prefetched, prefetch_used, reused;
    void *persist;               /* [persist_elems] compute: the persistent views, whole (stage 3) */
    ct_backend *acc;             /* adds the shares into the part's gradients: be, or with offload the
                                    CPU backend beside it (the store's state_at) */
    void *landing;               /* offload: the slots' landing buffers, pinned */
    uint64_t last_upload;        /* parameters in host memory, one process: the last gather's upload */
};

static int key_of(const ct_partition *z, ct_pass pass, int j) { return (int)pass * z->p->layout->n_layers + j; }

/* The gathers of a queue entry (those still in flight) waited for. */
static int gathered_wait(ct_partition *z, gathered *e, ct_err *err) {
    for (int k = 0; k < CT_LAYER_MAX_PARAMS && !e->waited; k++) {
        int rc = z->c->wait(z->c, e->req[k], err);
        e->req[k] = NULL;
        if (rc) return rc;
    }
    e->waited = true;   /* an upload needs no wait: the ops queued after it see its bytes */
    return CT_OK;
}

/* Parameters in host memory (offload_param) with one process: elements [a, b) of the part go up
 * into dst, the whole of the gather (a copy on the copy stream, prefetched like a collective).
 * Several processes gather them with the communicator, which reads the host part (MPI: the CPU's
 * and the capped device's memory). */
static bool uploads_params(const ct_partition *z) { return z->p->host_params && z->c->world == 1; }

static uint64_t upload_params(ct_partition *z, void *dst, int64_t a, int64_t b) {
    const ct_param_store *p = z->p;
    const void *src = ct_celem(ct_param_store_part_params(p), a - p->lo, p->compute);
    return z->be->queue.upload(z->be, dst, src, ct_nbytes(b - a, p->compute), 0);
}

static int queue_pop(ct_partition *z, ct_err *err) {
    int rc = gathered_wait(z, &z->queue[z->head], err);
    z->head = (z->head + 1) % GATHER_QUEUE;
    z->count--;
    return rc;
}

/* Every gathered layer dropped (waited for first: MPI still writes into them, and an upload may
 * still read the host part the optimizer is about to write). */
static int queue_clear(ct_partition *z, ct_err *err) {
    int rc = CT_OK;
    while (z->count > 0 && !rc) rc = queue_pop(z, err);
    if (z->last_upload) z->be->queue.upload_done(z->be, z->last_upload, true);
    return rc;
}

/* A place of `elems` in the ring after the queue's last entry, or -1 when it does not fit. */
static int64_t gbuf_place(const ct_partition *z, int64_t elems) {
    if (z->count == 0) return elems <= z->gbuf_elems ? 0 : -1;
    const gathered *first = &z->queue[z->head], *last = &z->queue[(z->head + z->count - 1) % GATHER_QUEUE];
    int64_t end = last->at + last->elems;
    if (end > first->at) {   /* the entries run from first to last without wrapping */
        if (end + elems <= z->gbuf_elems) return end;
        return elems <= first->at ? 0 : -1;
    }
    return end + elems <= first->at ? end : -1;
}

static int64_t queue_live(const ct_partition *z) {
    int64_t live = 0;
    for (int i = 0; i < z->count; i++) live += z->queue[(z->head + i) % GATHER_QUEUE].elems;
    return live;
}

/* Start the gathers of layer (key) j's spans into the buffer at `at`, as the queue's last entry. */
static int gather_start(ct_partition *z, int key, int64_t at, ct_err *err) {
    const ct_param_layout *L = z->p->layout;
    int j = key % L->n_layers;
    gathered *e = &z->queue[(z->head + z->count) % GATHER_QUEUE];
    *e = (gathered){.key = key, .at = at, .elems = z->z.layer_elems[j]};
    z->count++;
    const void *part = ct_param_store_part_params(z->p);
    ct_dtype dt = z->p->compute;
    for (int k = z->z.first[j]; k < z->z.first[j + 1]; k++) {
        const part_span *sp = &z->z.spans[k];
        if (sp->persist_at >= 0) continue;
        void *dst = ct_elem(z->gbuf, at + sp->at, dt);
        if (uploads_params(z)) {
            z->last_upload = upload_params(z, dst, sp->a, sp->b);
            continue;
        }
        int rc = z->c->start_all_gather_range(z->c, dst, part, L->n_params, sp->a, sp->b, dt,
                                              &e->req[k - z->z.first[j]], err);
        if (rc) return rc;
    }
    return CT_OK;
}

/* Whether layer j gathers anything (a span that is not persistent). */
static bool gathers(const ct_partition *z, int j) {
    for (int k = z->z.first[j]; k < z->z.first[j + 1]; k++)
        if (z->z.spans[k].persist_at < 0) return true;
    return false;
}

/* Whether the gathering use `key` keeps the parameters of the use before it, `prev` (the same layer
 * again, nothing gathered in between: the last layer's forward then backward, a checkpointed
 * segment's recompute then backward): stage3_max_reuse_distance > 0. */
static bool reuses(const ct_partition *z, int prev, int key) {
    int n = z->p->layout->n_layers;
    return z->o.max_reuse_elems > 0 && prev >= 0 && prev % n == key % n;
}

/* The layers expected after `key` started gathering while it runs: those already queued are
 * skipped if they are next, a mismatch stops (the queue's order is no longer the walk's); a use
 * that will keep the parameters of the one before needs no gather. */
static int prefetch(ct_partition *z, int key, ct_err *err) {
    const ct_param_layout *L = z->p->layout;
    int64_t ahead = 0, live = queue_live(z);
    int qi = 1;   /* the queue entry after the running layer's */
    int prev = key;
    for (int k = z->next_key[key], steps = 0; k >= 0 && steps < 3 * L->n_layers;
         prev = k, k = z->next_key[k], steps++) {
        if (reuses(z, prev, k)) continue;
        int64_t elems = z->z.layer_elems[k % L->n_layers];
        ahead += elems;
        if (qi < z->count) {
            if (z->queue[(z->head + qi) % GATHER_QUEUE].key != k) return CT_OK;
            qi++;
            continue;
        }
        if (ahead > z->o.prefetch_elems || live + elems > z->o.max_live_elems || z->count == GATHER_QUEUE)
            return CT_OK;
        int64_t at = gbuf_place(z, elems);
        if (at < 0) return CT_OK;
        int rc = gather_start(z, k, at, err);
        if (rc) return rc;
        live += elems;
        z->prefetched++;
        qi++;
    }
    return CT_OK;
}

/* Stage 3: layer j's parameters for `pass` in the gather buffer, at *at: those of the use before
 * when it was the same layer (reuses), else the prefetched entry if the queue has it next, else
 * gathered now; then the next layers' prefetch started. */
static int gather_layer(ct_partition *z, int j, ct_pass pass, int64_t *at, ct_err *err) {
    int key = key_of(z, pass, j), rc = CT_OK;
    /* learn the walk's order; a micro-batch boundary (backward to forward) is not followed */
    if (z->prev_key >= 0 && !(z->prev_key / z->p->layout->n_layers == CT_PASS_BACKWARD && pass == CT_PASS_FORWARD))
        z->next_key[z->prev_key] = key;
    z->prev_key = key;
    if (z->count > 0 && reuses(z, z->queue[z->head].key, key)) {   /* kept: no gather */
        z->queue[z->head].key = key;
        z->reused++;
    } else {
        if (z->count > 0) rc = queue_pop(z, err);   /* the layer that ran before: released */
        bool queued = false;
        for (int i = 0; i < z->count && !rc; i++) queued |= z->queue[(z->head + i) % GATHER_QUEUE].key == key;
        while (!rc && z->count > 0 && (!queued || z->queue[z->head].key != key)) rc = queue_pop(z, err);   /* unused */
        if (!rc && z->count == 0) rc = gather_start(z, key, 0, err);
        else if (!rc) z->prefetch_used++;
        if (!rc) rc = gathered_wait(z, &z->queue[z->head], err);
    }
    *at = z->queue[z->head].at;
    return rc ? rc : z->o.prefetch_elems > 0 ? prefetch(z, key, err) : CT_OK;
}

/* Offload: the shares of a slot's spans downloaded into its landing buffer. One process (no
 * reduce-scatter to wait for) queues them as soon as the layer's backward is done; several wait
 * for each span's reduce-scatter first (MPI writes the share from the host). */
static void slot_download(ct_partition *z, grad_slot *s, int k, int64_t share_at, int64_t n) {
    const float *src = z->c->world == 1 ? s->grads + z->z.spans[k].at : s->share + share_at;
    s->ticket = z->be->queue.download(z->be, s->landing + share_at, src, (size_t)n * sizeof(float), 0);
}

/* A slot's reductions completed: this rank's shares added to its part's gradients, span by span
 * in order (the order of the additions is that of the blocking form). With offload the shares
 * are added from the landing buffer, in host memory, by the CPU backend beside the device. */
static int slot_complete(ct_partition *z, grad_slot *s, ct_err *err) {
    if (s->layer < 0) return CT_OK;
    const ct_param_store *p = z->p;
    int64_t n = p->layout->n_params, share_at = 0;
    float *grads = ct_param_store_part_grads(p);
    int first = z->z.first[s->layer], rc = CT_OK;
    for (int k = first; k < z->z.first[s->layer + 1]; k++) {
        int wrc = z->c->wait(z->c, s->req[k - first], err);
        s->req[k - first] = NULL;
        if (!rc) rc = wrc;
        if (rc) continue;
        int64_t lo, hi;
        ct_comm_shard_range(n, z->c->world, z->c->rank, z->z.spans[k].a, z->z.spans[k].b, &lo, &hi);
        if (s->landing && z->c->world > 1 && hi > lo) slot_download(z, s, k, share_at, hi - lo);
        share_at += align_up(hi - lo);
    }
    if (s->landing && s->ticket) z->be->queue.download_done(z->be, s->ticket, true);
    const float *shares = s->landing ? s->landing : s->share;
    share_at = 0;
    for (int k = first; k < z->z.first[s->layer + 1] && !rc; k++) {
        int64_t lo, hi;
        ct_comm_shard_range(n, z->c->world, z->c->rank, z->z.spans[k].a, z->z.spans[k].b, &lo, &hi);
        if (hi > lo) z->acc->elt.axpy(z->acc, grads + (lo - p->lo), 1.0f, shares + share_at, hi - lo, CT_F32);
        share_at += align_up(hi - lo);
    }
    s->layer = -1;
    s->ticket = 0;
    return rc;
}

void ct_partition_free(ct_partition *z) {
    if (!z) return;
    /* collectives still in flight (the last evaluation's prefetch) complete before MPI ends, unless
     * this rank ends on an error (the others may never join them) */
    if (!z->c->failed) {
        for (int i = 0; i < z->n_slots; i++) slot_complete(z, &z->slot[i], NULL);
        queue_clear(z, NULL);
    }
    if (z->work) z->be->mem.free(z->be, z->work);
    if (z->persist) z->be->mem.free(z->be, z->persist);
    if (z->landing) z->be->mem.free_host_pinned(z->be, z->landing);
    part_layout_free(&z->z);
    free(z->next_key);
    free(z);
}

int ct_partition_create(ct_param_store *p, ct_comm *c, const ct_partition_opts *o, ct_partition **out,
                        ct_err *err) {
    *out = NULL;
    if (!p->part_grads)
        return ct_errf(err, CT_ERR_RUNTIME, "ZeRO partition hooks over a parameter store that is not partitioned");
    int stage = p->part_params ? 3 : 2;
    ct_partition *z = ct_xcalloc(1, sizeof *z);
    *z = (ct_partition){.p = p, .c = c, .be = p->be, .gather = p->part_params, .o = *o, .n_slots = grad_slots(o),
                        .prev_key = -1, .acc = ct_place_ops(&p->state_at)};
    z->o.offload = p->host_state;
    z->next_key = ct_xmalloc((size_t)(3 * p->layout->n_layers + 1) * sizeof(int));
    for (int k = 0; k < 3 * p->layout->n_layers; k++) z->next_key[k] = -1;
    for (int i = 0; i < 2; i++) z->slot[i].layer = -1;
    part_layout_make(p->layout, stage == 3 ? o->persistence_threshold : 0, c->world, &z->z);
    size_t b[CT_MEM_CAT_COUNT], h[CT_MEM_CAT_COUNT], grads_at;
    part_bytes(&z->z, &z->o, p->compute, stage, b, h, &grads_at);
    z->work = z->be->mem.alloc(z->be, b[CT_MEM_WORKSPACE], CT_MEM_WORKSPACE);
    if (b[CT_MEM_PARAMS]) z->persist = z->be->mem.alloc(z->be, b[CT_MEM_PARAMS], CT_MEM_PARAMS);
    if (z->o.offload) z->landing = z->be->mem.alloc_host_pinned(z->be, h[CT_MEM_WORKSPACE], CT_MEM_WORKSPACE);
    if (!z->work || (b[CT_MEM_PARAMS] && !z->persist) || (z->o.offload && !z->landing)) {
        ct_partition_free(z);
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %.1f MiB of ZeRO gather and reduction "
                       "buffers on %s%s", (double)(b[CT_MEM_PARAMS] + b[CT_MEM_WORKSPACE]) / 1048576.0, p->be->name,
                       z->o.offload ? " and their pinned landing buffers in host memory" : "");
    }
    z->be->mem.memset0(z->be, z->work, b[CT_MEM_WORKSPACE]);
    if (z->persist) z->be->mem.memset0(z->be, z->persist, b[CT_MEM_PARAMS]);
    z->gbuf = z->work;
    z->gbuf_elems = stage == 3 ? gather_elems(&z->z, o) : 0;
    float *f = (float *)((char *)z->work + grads_at);
    for (int i = 0; i < z->n_slots; i++) {
        z->slot[i].grads = f;
        z->slot[i].share = f + z->z.scratch_elems;
        f += z->z.scratch_elems + device_share(&z->z, &z->o) + 1;
        if (z->landing) z->slot[i].landing = (float *)z->landing + (size_t)i * (size_t)(z->z.share_elems + 1);
    }
    *out = z;
    return CT_OK;
}

int ct_partition_refresh(ct_partition *z, ct_err *err) {
    const ct_param_layout *L = z->p->layout;
    void *part = ct_param_store_part_params(z->p);
    int rc = queue_clear(z, err);   /* gathered before the part changed */
    uint64_t ticket = 0;
    for (int v = 0; v < L->n_views && z->gather && !rc; v++) {
        if (z->z.persist_at[v] < 0) continue;
        const ct_param_view *pv = &L->views[v];
        void *dst = ct_elem(z->persist, z->z.persist_at[v], z->p->compute);
        if (uploads_params(z)) ticket = upload_params(z, dst, pv->offset, pv->offset + pv->numel);
        else rc = z->c->all_gather_range(z->c, dst, part, L->n_params, pv->offset, pv->offset + pv->numel,
                                         z->p->compute, err);
    }
    if (ticket) z->be->queue.upload_done(z->be, ticket, true);   /* the host part may change after this */
    return rc;
}

int ct_partition_flush(ct_partition *z, ct_err *err) {
    int rc = CT_OK;
    for (int i = 0; i < z->n_slots && !rc; i++) rc = slot_complete(z, &z->slot[(z->next_slot + i) % z->n_slots], err);
    if (!rc) rc = queue_clear(z, err);
    z->prev_key = -1;   /* the next walk starts a step: no order learnt across it */
    return rc;
}

void ct_partition_prefetch_counts(const ct_partition *z, long *started, long *used, long *reused) {
    *started = z->prefetched;
    *used = z->prefetch_used;
    *reused = z->reused;
}

/* The span of layer j that holds flat offset `off`. */
static const part_span *span_of(const ct_partition *z, int j, int64_t off) {
    for (int k = z->z.first[j]; k < z->z.first[j + 1]; k++)
        if (off >= z->z.spans[k].a && off < z->z.spans[k].b) return &z->z.spans[k];
    return NULL;   /* not reached: every trainable view of the layer is in one of its spans */
}

/* Move every collective in flight on (OpenMPI advances them only inside MPI calls). */
static int progress(ct_partition *z, ct_err *err) {
    bool done;
    for (int i = 0; i < z->n_slots; i++)
        for (int k = 0; k < CT_LAYER_MAX_PARAMS; k++)
            if (z->slot[i].req[k]) {
                int rc = z->c->test(z->c, z->slot[i].req[k], &done, err);
                if (rc) return rc;
            }
    for (int i = 0; i < z->count; i++) {
        gathered *e = &z->queue[(z->head + i) % GATHER_QUEUE];
        for (int k = 0; k < CT_LAYER_MAX_PARAMS && !e->waited; k++)
            if (e->req[k]) {
                int rc = z->c->test(z->c, e->req[k], &done, err);
                if (rc) return rc;
            }
    }
    return CT_OK;
}

/* Stage 3: the layer's spans gathered (or prefetched) and the layer pointed at them. Both stages,
 * in backward: the layer pointed at zeroed gradients in the next slot (whose earlier reductions
 * complete first). */
static int part_prepare(void *ctx, int j, ct_pass pass, ct_layer_io *io, ct_err *err) {
    ct_partition *z = ctx;
    const ct_param_layout *L = z->p->layout;
    ct_dtype dt = z->p->compute;
    bool backward = pass == CT_PASS_BACKWARD;
    int first = z->z.first[j], end = z->z.first[j + 1];
    if (first == end || (!z->gather && !backward)) return CT_OK;   /* nothing to gather or point at */
    int64_t at = 0;
    if (z->gather && gathers(z, j)) {
        int rc = gather_layer(z, j, pass, &at, err);
        if (rc) return rc;
    }
    grad_slot *s = &z->slot[z->next_slot];
    if (backward) {
        int rc = slot_complete(z, s, err);
        if (rc) return rc;
        z->be->mem.memset0(z->be, s->grads, (size_t)z->z.layer_elems[j] * sizeof(float));
    }
    for (int k = 0; k < ct_param_layout_layer_specs(L, j); k++) {
        int v = ct_param_layout_layer_view(L, j, k);
        if (v < 0 || !L->views[v].trainable) continue;
        const part_span *sp = span_of(z, j, L->views[v].offset);
        int64_t in = L->views[v].offset - sp->a;
        if (z->gather)
            io->p[k] = sp->persist_at >= 0 ? ct_elem(z->persist, sp->persist_at + in, dt)
                                           : ct_elem(z->gbuf, at + sp->at + in, dt);
        io->dp[k] = backward ? s->grads + sp->at + in : NULL;
    }
    return CT_OK;
}

/* After a layer's backward: the reduce-scatters of its gradients to their owners started (and,
 * without overlap, completed); after any layer, what is in flight moved on. */
static int part_after(void *ctx, int j, ct_pass pass, const ct_layer_io *io, ct_err *err) {
    ct_partition *z = ctx;
    int first = z->z.first[j], end = z->z.first[j + 1];
    if (pass == CT_PASS_BACKWARD && first < end) {
        int64_t n = z->p->layout->n_params, share_at = 0;
        grad_slot *s = &z->slot[z->next_slot];
        z->next_slot = (z->next_slot + 1) % z->n_slots;
        s->layer = j;
        for (int k = first; k < end; k++) {
            const part_span *sp = &z->z.spans[k];
            int64_t lo, hi;
            ct_comm_shard_range(n, z->c->world, z->c->rank, sp->a, sp->b, &lo, &hi);
            /* offload, one process: the reduction is the identity; the gradients go down at once */
            int rc = s->landing && z->c->world == 1
                         ? (slot_download(z, s, k, share_at, hi - lo), CT_OK)
                         : z->c->start_reduce_scatter_range(z->c, s->share + share_at, s->grads + sp->at, n, sp->a,
                                                            sp->b, CT_F32, &s->req[k - first], err);
            if (rc) return rc;
            share_at += align_up(hi - lo);
        }
        if (!z->o.overlap) return slot_complete(z, s, err);
    }
    return progress(z, err);
}

ct_exec_hooks ct_partition_hooks(ct_partition *z) {
    return (ct_exec_hooks){.ctx = z, .prepare = part_prepare, .after = part_after, .host_work = true};
}

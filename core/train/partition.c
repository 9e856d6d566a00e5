/* partition.c: ZeRO stages 2 and 3 around every layer: stage 3's parameter gathers, both stages'
 * gradient reduce-scatters (partition.h). */
#include "core/train/partition.h"

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
    int64_t share_elems;         /* the most of a span one rank owns: the longest span, at most a
                                    rank's part */
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
    *z = (part_layout){.first = ct_xcalloc((size_t)L->n_layers + 1, sizeof(int)),
                     .persist_at = ct_xmalloc((size_t)(L->n_views ? L->n_views : 1) * sizeof(int64_t))};
    for (int v = 0; v < L->n_views; v++) {
        z->persist_at[v] = -1;
        if (L->views[v].trainable && (double)L->views[v].numel < threshold) {
            z->persist_at[v] = z->persist_elems;
            z->persist_elems += align_up(L->views[v].numel);
        }
    }
    z->spans = ct_xmalloc((size_t)(L->n_layers * CT_LAYER_MAX_PARAMS + 1) * sizeof *z->spans);
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
            int64_t len = z->spans[n - 1].b - z->spans[n - 1].a;
            if (len > z->share_elems) z->share_elems = len;
        }
        if (at > z->scratch_elems) z->scratch_elems = at;
    }
    z->first[L->n_layers] = n;
    int64_t part = world > 0 ? (L->n_params + world - 1) / world : L->n_params;
    if (z->share_elems > part) z->share_elems = part;
}

static void part_layout_free(part_layout *z) {
    free(z->spans);
    free(z->first);
    free(z->persist_at);
}

/* Bytes by category of the buffers below; the scratch of stage 2 has no gathered parameters. */
static void part_bytes(const part_layout *z, ct_dtype compute, int stage, size_t bytes[CT_MEM_CAT_COUNT],
                       size_t *grads_at) {
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) bytes[c] = 0;
    if (stage == 3 && z->persist_elems) bytes[CT_MEM_PARAMS] = ct_nbytes(z->persist_elems, compute);
    /* the workspace: gathered parameters (64-byte aligned), then the fp32 gradients and share */
    *grads_at = stage == 3 ? (ct_nbytes(z->scratch_elems, compute) + 63) / 64 * 64 : 0;
    bytes[CT_MEM_WORKSPACE] = *grads_at + (size_t)(z->scratch_elems + z->share_elems + 1) * sizeof(float);
}

void ct_partition_plan(const ct_param_layout *L, ct_dtype compute, int stage, double threshold, int world,
                       size_t bytes[CT_MEM_CAT_COUNT]) {
    part_layout z;
    size_t grads_at;
    part_layout_make(L, stage == 3 ? threshold : 0, world, &z);
    part_bytes(&z, compute, stage, bytes, &grads_at);
    part_layout_free(&z);
}

struct ct_partition {
    ct_param_store *p;
    ct_comm *c;
    ct_backend *be;
    bool gather;                 /* stage 3: the parameters are partitioned too */
    part_layout z;
    void *work;                  /* the workspace allocation holding the three buffers below */
    void *scratch;               /* [scratch_elems] compute: the running layer's gathered parameters */
    float *grad_scratch;         /* [scratch_elems]: the running layer's gradients, before reduction */
    float *share;                /* [share_elems]: this rank's share of a span's reduced gradients */
    void *persist;               /* [persist_elems] compute: the persistent views, whole (stage 3) */
};

void ct_partition_free(ct_partition *z) {
    if (!z) return;
    if (z->work) z->be->mem.free(z->be, z->work);
    if (z->persist) z->be->mem.free(z->be, z->persist);
    part_layout_free(&z->z);
    free(z);
}

int ct_partition_create(ct_param_store *p, ct_comm *c, double threshold, ct_partition **out, ct_err *err) {
    *out = NULL;
    if (!p->part_grads)
        return ct_errf(err, CT_ERR_RUNTIME, "ZeRO partition hooks over a parameter store that is not partitioned");
    int stage = p->part_params ? 3 : 2;
    ct_partition *z = ct_xcalloc(1, sizeof *z);
    *z = (ct_partition){.p = p, .c = c, .be = p->be, .gather = p->part_params};
    part_layout_make(p->layout, stage == 3 ? threshold : 0, c->world, &z->z);
    size_t b[CT_MEM_CAT_COUNT], grads_at;
    part_bytes(&z->z, p->compute, stage, b, &grads_at);
    z->work = z->be->mem.alloc(z->be, b[CT_MEM_WORKSPACE], CT_MEM_WORKSPACE);
    if (b[CT_MEM_PARAMS]) z->persist = z->be->mem.alloc(z->be, b[CT_MEM_PARAMS], CT_MEM_PARAMS);
    if (!z->work || (b[CT_MEM_PARAMS] && !z->persist)) {
        ct_partition_free(z);
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %.1f MiB of ZeRO gather and reduction "
                       "buffers on %s", (double)(b[CT_MEM_PARAMS] + b[CT_MEM_WORKSPACE]) / 1048576.0, p->be->name);
    }
    z->be->mem.memset0(z->be, z->work, b[CT_MEM_WORKSPACE]);
    if (z->persist) z->be->mem.memset0(z->be, z->persist, b[CT_MEM_PARAMS]);
    z->scratch = z->work;
    z->grad_scratch = (float *)((char *)z->work + grads_at);
    z->share = z->grad_scratch + z->z.scratch_elems;
    *out = z;
    return CT_OK;
}

int ct_partition_refresh(ct_partition *z, ct_err *err) {
    const ct_param_layout *L = z->p->layout;
    void *part = ct_param_store_part_params(z->p);
    for (int v = 0; v < L->n_views && z->gather; v++) {
        if (z->z.persist_at[v] < 0) continue;
        const ct_param_view *pv = &L->views[v];
        int rc = z->c->all_gather_range(z->c, ct_elem(z->persist, z->z.persist_at[v], z->p->compute), part,
                                        L->n_params, pv->offset, pv->offset + pv->numel, z->p->compute, err);
        if (rc) return rc;
    }
    return CT_OK;
}

/* The span of layer j that holds flat offset `off`. */
static const part_span *span_of(const ct_partition *z, int j, int64_t off) {
    for (int k = z->z.first[j]; k < z->z.first[j + 1]; k++)
        if (off >= z->z.spans[k].a && off < z->z.spans[k].b) return &z->z.spans[k];
    return NULL;   /* not reached: every trainable view of the layer is in one of its spans */
}

/* Stage 3: gather the layer's spans and point it at them. Both stages, in backward: point it at
 * zeroed gradients. */
static int part_prepare(void *ctx, int j, ct_pass pass, ct_layer_io *io, ct_err *err) {
    ct_partition *z = ctx;
    const ct_param_layout *L = z->p->layout;
    ct_dtype dt = z->p->compute;
    bool backward = pass == CT_PASS_BACKWARD;
    int first = z->z.first[j], end = z->z.first[j + 1];
    if (first == end || (!z->gather && !backward)) return CT_OK;   /* nothing to gather or point at */
    void *part = z->gather ? ct_param_store_part_params(z->p) : NULL;
    for (int k = first; k < end && z->gather; k++) {
        const part_span *sp = &z->z.spans[k];
        if (sp->persist_at >= 0) continue;
        int rc = z->c->all_gather_range(z->c, ct_elem(z->scratch, sp->at, dt), part, L->n_params, sp->a, sp->b,
                                        dt, err);
        if (rc) return rc;
    }
    if (backward) {
        const part_span *last = &z->z.spans[end - 1];
        z->be->mem.memset0(z->be, z->grad_scratch, (size_t)(last->at + last->b - last->a) * sizeof(float));
    }
    for (int s = 0; s < ct_param_layout_layer_specs(L, j); s++) {
        int v = ct_param_layout_layer_view(L, j, s);
        if (v < 0 || !L->views[v].trainable) continue;
        const part_span *sp = span_of(z, j, L->views[v].offset);
        int64_t in = L->views[v].offset - sp->a;
        if (z->gather)
            io->p[s] = sp->persist_at >= 0 ? ct_elem(z->persist, sp->persist_at + in, dt)
                                           : ct_elem(z->scratch, sp->at + in, dt);
        io->dp[s] = backward ? z->grad_scratch + sp->at + in : NULL;
    }
    return CT_OK;
}

/* After a layer's backward: its gradients summed over ranks into their owners' parts. */
static int part_after(void *ctx, int j, ct_pass pass, const ct_layer_io *io, ct_err *err) {
    if (pass != CT_PASS_BACKWARD) return CT_OK;
    ct_partition *z = ctx;
    const ct_param_store *p = z->p;
    int64_t n = p->layout->n_params;
    float *grads = ct_param_store_part_grads(p);
    for (int k = z->z.first[j]; k < z->z.first[j + 1]; k++) {
        const part_span *sp = &z->z.spans[k];
        int rc = z->c->reduce_scatter_range(z->c, z->share, z->grad_scratch + sp->at, n, sp->a, sp->b, CT_F32, err);
        if (rc) return rc;
        int64_t lo, hi;
        ct_comm_shard_range(n, z->c->world, z->c->rank, sp->a, sp->b, &lo, &hi);
        if (hi > lo) z->be->elt.axpy(z->be, grads + (lo - p->lo), 1.0f, z->share, hi - lo, CT_F32);
    }
    return CT_OK;
}

ct_exec_hooks ct_partition_hooks(ct_partition *z) {
    return (ct_exec_hooks){.ctx = z, .prepare = part_prepare, .after = part_after, .host_work = true};
}

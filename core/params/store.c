/* store.c: the flat parameter buffers of a run (store.h). */
#include "core/params/store.h"

#include <stdlib.h>

static size_t fp32_bytes(int64_t n) { return (size_t)(n > 0 ? n : 1) * sizeof(float); }

/* A compute copy of its own: 16-bit, the whole space while the master holds a part, or a device
 * copy of a master that lives in host memory. */
static bool copy_needed(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts,
                        const ct_store_offload *off) {
    /* parameters offloaded in fp32: the pinned master is them (a pageable one, or one in swap
     * files, needs a pinned copy) */
    if (off && off->params) return compute != CT_F32 || !off->pinned || off->swapped;
    return off || compute != CT_F32 || (!(parts & CT_STORE_PART_PARAMS) && (lo != 0 || hi != L->n_params));
}

/* Offload: the compute copy goes up from staging, except in fp32 from a pinned master (a swapped
 * one is not in memory); parameters in host memory do not go up with the step. */
static bool stages(ct_dtype compute, const ct_store_offload *off) {
    return off && !off->params && !(compute == CT_F32 && off->pinned && !off->swapped);
}

static int64_t stage_elems(int64_t lo, int64_t hi, const ct_store_offload *off) {
    int64_t n = off->chunk > 0 && off->chunk < hi - lo ? off->chunk : hi - lo;
    return n > 0 ? n : 1;
}

void ct_param_store_plan_in(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts,
                            const ct_store_offload *off, size_t dev[CT_MEM_CAT_COUNT], size_t host[CT_MEM_CAT_COUNT]) {
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) {
        dev[c] = 0;
        if (host) host[c] = 0;
    }
    int64_t grads = parts & CT_STORE_PART_GRADS ? hi - lo : L->n_params;
    int64_t params = parts & CT_STORE_PART_PARAMS ? hi - lo : L->n_params;
    size_t *state = off ? host : dev;   /* the master of [lo, hi) and the gradients */
    state[CT_MEM_MASTER] = off && off->swapped ? 0 : fp32_bytes(hi - lo);
    dev[CT_MEM_MASTER] += fp32_bytes(L->n_buffers);
    state[CT_MEM_GRADS] = parts & CT_STORE_NO_GRADS ? 0 : fp32_bytes(grads);
    if (copy_needed(L, compute, lo, hi, parts, off))
        (off && off->params ? host : dev)[CT_MEM_PARAMS] = ct_nbytes(params > 0 ? params : 1, compute);
    if (stages(compute, off)) host[CT_MEM_WORKSPACE] = 2 * ct_nbytes(stage_elems(lo, hi, off), compute);
}

void ct_param_store_plan(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts,
                         size_t bytes[CT_MEM_CAT_COUNT]) {
    ct_param_store_plan_in(L, compute, lo, hi, parts, NULL, bytes, NULL);
}

int ct_param_store_create(const ct_param_layout *L, ct_backend *be, ct_dtype compute, int64_t lo,
                          int64_t hi, unsigned parts, ct_param_store **out, ct_err *err) {
    return ct_param_store_create_in(L, be, compute, lo, hi, parts, NULL, out, err);
}

int ct_param_store_create_in(const ct_param_layout *L, ct_backend *be, ct_dtype compute, int64_t lo, int64_t hi,
                             unsigned parts, const ct_store_offload *off, ct_param_store **out, ct_err *err) {
    *out = NULL;
    if (off && !(parts & CT_STORE_PART_GRADS))
        return ct_errf(err, CT_ERR_RUNTIME, "a parameter store with its master in host memory needs partitioned "
                       "gradients (the partition's hooks bring them down)");
    ct_param_store *s = ct_xcalloc(1, sizeof *s);
    *s = (ct_param_store){.layout = L, .be = be, .compute = compute, .lo = lo, .hi = hi,
                          .part_grads = parts & CT_STORE_PART_GRADS, .part_params = parts & CT_STORE_PART_PARAMS,
                          .state_at = off ? (ct_mem_place){be, off->host, off->pinned} : ct_mem_device(be),
                          .host_state = off != NULL, .host_params = off && off->params};
    size_t b[CT_MEM_CAT_COUNT], h[CT_MEM_CAT_COUNT];
    ct_param_store_plan_in(L, compute, lo, hi, parts, off, b, h);
    size_t master = fp32_bytes(hi - lo), buffers = fp32_bytes(L->n_buffers);
    size_t grads = off ? h[CT_MEM_GRADS] : b[CT_MEM_GRADS];
    bool swapped = off && off->swapped;
    s->master = swapped ? NULL : ct_place_alloc(&s->state_at, master, CT_MEM_MASTER);
    s->buffers = be->mem.alloc(be, buffers, CT_MEM_MASTER);
    s->grads = grads ? ct_place_alloc(&s->state_at, grads, CT_MEM_GRADS) : NULL;
    size_t params = s->host_params ? h[CT_MEM_PARAMS] : b[CT_MEM_PARAMS];
    if (!params) s->params = s->master;
    else if (s->host_params) s->params = be->mem.alloc_host_pinned(be, params, CT_MEM_PARAMS);   /* uploads read it */
    else s->params = be->mem.alloc(be, params, CT_MEM_PARAMS);
    bool staged = stages(compute, off);
    if (off) s->stage_elems = stage_elems(lo, hi, off);
    for (int i = 0; i < 2 && staged; i++)
        s->stage[i] = be->mem.alloc_host_pinned(be, h[CT_MEM_WORKSPACE] / 2, CT_MEM_WORKSPACE);
    if ((!s->master && !swapped) || !s->buffers || (!s->grads && grads) || !s->params || (staged && (!s->stage[0] || !s->stage[1]))) {
        size_t total = 0, host_total = 0;
        for (int c = 0; c < CT_MEM_CAT_COUNT; c++) total += b[c], host_total += h[c];
        ct_param_store_free(s);
        if (off)
            return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %.1f MiB of parameters on %s and %.1f MiB "
                           "of fp32 master weights and gradients in %s host memory", (double)total / 1048576.0,
                           be->name, (double)host_total / 1048576.0, off->pinned ? "pinned" : "pageable");
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %.1f MiB of parameters and "
                       "gradients on %s", (double)total / 1048576.0, be->name);
    }
    if (s->master) ct_place_zero(&s->state_at, s->master, master);
    be->mem.memset0(be, s->buffers, buffers);
    if (s->grads) ct_place_zero(&s->state_at, s->grads, grads);
    if (params) {
        ct_backend *ops = s->host_params ? ct_place_ops(&s->state_at) : be;
        ops->mem.memset0(ops, s->params, params);
    }
    *out = s;
    return CT_OK;
}

void ct_param_store_free(ct_param_store *s) {
    if (!s) return;
    ct_backend *be = s->be;
    if (s->host_state) ct_param_store_uploads_wait(s);   /* the copies may still read the staging */
    if (s->params && s->params != s->master) {
        if (s->host_params) be->mem.free_host_pinned(be, s->params);
        else be->mem.free(be, s->params);
    }
    if (s->master) ct_place_free(&s->state_at, s->master);
    if (s->buffers) be->mem.free(be, s->buffers);
    if (s->grads) ct_place_free(&s->state_at, s->grads);
    for (int i = 0; i < 2; i++)
        if (s->stage[i]) be->mem.free_host_pinned(be, s->stage[i]);
    free(s);
}

bool ct_param_store_has_copy(const ct_param_store *s) { return s->params != (void *)s->master; }

void *ct_param_store_part_params(const ct_param_store *s) {
    return ct_elem(s->params, s->part_params ? 0 : s->lo, s->compute);
}

float *ct_param_store_part_grads(const ct_param_store *s) {
    return s->grads ? s->grads + (s->part_grads ? 0 : s->lo) : NULL;
}

void *ct_param_store_stage(ct_param_store *s, int64_t a, int64_t b) {
    if (s->host_params) return ct_param_store_has_copy(s) ? ct_elem(ct_param_store_part_params(s), a - s->lo, s->compute) : NULL;
    void *buf = s->stage[s->stage_next];
    if (!buf) return NULL;
    uint64_t t = s->stage_ticket[s->stage_next];
    if (t) s->be->queue.upload_done(s->be, t, true);   /* its last upload has read it */
    return buf;
}

void ct_param_store_upload(ct_param_store *s, int64_t a, int64_t b) {
    if (s->host_params) return;   /* the partition uploads them layer by layer */
    const void *src = s->stage[s->stage_next] ? s->stage[s->stage_next] : (const void *)(s->master + (a - s->lo));
    void *dst = ct_elem(ct_param_store_part_params(s), a - s->lo, s->compute);
    s->last_upload = s->be->queue.upload(s->be, dst, src, ct_nbytes(b - a, s->compute), 0);
    s->stage_ticket[s->stage_next] = s->last_upload;
    s->stage_next ^= 1;
}

void ct_param_store_uploads_wait(ct_param_store *s) {
    if (s->last_upload) s->be->queue.upload_done(s->be, s->last_upload, true);
}

void ct_param_store_refresh(ct_param_store *s) {
    if (!ct_param_store_has_copy(s)) return;
    if (!s->master) ct_fatal("ct_param_store_refresh: the master is in swap files (refresh it chunk by chunk)");
    if (!s->host_state) {
        s->be->elt.cast(s->be, ct_param_store_part_params(s), s->compute, s->master, CT_F32, s->hi - s->lo);
        return;
    }
    ct_param_store_refresh_range(s, s->lo, s->hi, s->master);
    ct_param_store_uploads_wait(s);
}

void ct_param_store_refresh_range(ct_param_store *s, int64_t a, int64_t b, const float *master_ab) {
    if (!s->host_state || a < s->lo || b > s->hi) ct_fatal("ct_param_store_refresh_range: [%lld, %lld)", (long long)a, (long long)b);
    if (!ct_param_store_has_copy(s)) return;
    ct_backend *host = s->state_at.host;
    if (s->host_params) {   /* a cast in host memory; the partition uploads from there */
        host->elt.cast(host, ct_elem(ct_param_store_part_params(s), a - s->lo, s->compute), s->compute, master_ab,
                       CT_F32, b - a);
        return;
    }
    for (int64_t x = a; x < b; x += s->stage_elems) {
        int64_t y = b - x < s->stage_elems ? b : x + s->stage_elems;
        void *buf = ct_param_store_stage(s, x, y);
        if (buf) host->elt.cast(host, buf, s->compute, master_ab + (x - a), CT_F32, y - x);
        ct_param_store_upload(s, x, y);
    }
}

void ct_param_store_zero_grads(ct_param_store *s) {
    if (!s->grads) return; /* an evaluating store has none */
    ct_place_zero(&s->state_at, s->grads, fp32_bytes(s->part_grads ? s->hi - s->lo : s->layout->n_params));
}

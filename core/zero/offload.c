/* offload.c: ZeRO-Offload's optimizer step, a chunk of the host master at a time (offload.h). */
#include "core/zero/offload.h"

/* Elements [a, b) of the store's range: master, state (NULL: the optimizer's own) and their
 * elements a in host memory, the gradients the store's. Stepped in pieces of stage_elems, each
 * piece's compute copy written into staging by the same pass and its upload queued at once. */
static void step_range(ct_optim *o, const ct_optim_update *u, ct_param_store *p, int64_t a, int64_t b, float *master,
                       float *const *state) {
    const float *grads = ct_param_store_part_grads(p);
    for (int64_t x = a; x < b; x += p->stage_elems) {
        int64_t y = b - x < p->stage_elems ? b : x + p->stage_elems;
        void *staging = ct_param_store_stage(p, x, y);   /* free once its last upload has read it */
        ct_optim_target tg = {.master = master + (x - a), .grads = grads + (x - p->lo), .copy = staging,
                              .copy_dt = p->compute};
        for (int s = 0; state && s < CT_OPTIM_MAX_SLOTS; s++) tg.state[s] = state[s] ? state[s] + (x - a) : NULL;
        ct_optim_update_range(o, u, &tg, x, y);
        ct_param_store_upload(p, x, y);   /* runs while the next piece is stepped */
    }
}

void ct_offload_apply(ct_optim *o, ct_param_store *p, float grad_scale, double grad_norm, ct_optim_stats *stats) {
    ct_optim_update u;
    ct_optim_update_begin(o, grad_scale, grad_norm, &u);
    step_range(o, &u, p, p->lo, p->hi, p->master, NULL);
    ct_param_store_uploads_wait(p);
    ct_optim_update_end(o, &u, stats);
}

int ct_offload_apply_swap(ct_optim *o, ct_param_store *p, ct_swap *s, float grad_scale, double grad_norm,
                          ct_optim_stats *stats, ct_err *err) {
    ct_optim_update u;
    ct_optim_update_begin(o, grad_scale, grad_norm, &u);
    int rc = ct_swap_begin(s, CT_SWAP_UPDATE, CT_SWAP_ALL, err);
    ct_swap_chunk c;
    /* array 0 is the master, 1.. the optimizer's slots (core/train/nvme.h) */
    while (!rc && !(rc = ct_swap_next(s, &c, err)) && c.n) {
        step_range(o, &u, p, p->lo + c.lo, p->lo + c.lo + c.n, c.a[0], c.a + 1);
        rc = ct_swap_release(s, &c, err);   /* written back while the next chunks are stepped */
    }
    ct_err end_err = {0};
    int end = ct_swap_end(s, &end_err);
    if (!rc && end) {
        rc = end;
        if (err) *err = end_err;
    }
    ct_param_store_uploads_wait(p);
    if (!rc) ct_optim_update_end(o, &u, stats);
    return rc;
}

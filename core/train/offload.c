/* offload.c: ZeRO-Offload's optimizer step, a chunk of the host master at a time (offload.h). */
#include "core/train/offload.h"

void ct_offload_apply(ct_optim *o, ct_param_store *p, float grad_scale, double grad_norm, ct_optim_stats *stats) {
    ct_optim_update u;
    ct_optim_update_begin(o, grad_scale, grad_norm, &u);
    const float *grads = ct_param_store_part_grads(p);
    for (int64_t a = p->lo; a < p->hi; a += p->stage_elems) {
        int64_t b = p->hi - a < p->stage_elems ? p->hi : a + p->stage_elems;
        void *staging = ct_param_store_stage(p, a, b);   /* free once its last upload has read it */
        ct_optim_target tg = {.master = p->master + (a - p->lo), .grads = grads + (a - p->lo), .copy = staging,
                              .copy_dt = p->compute};
        ct_optim_update_range(o, &u, &tg, a, b);
        ct_param_store_upload(p, a, b);   /* runs while the next chunk is stepped */
    }
    ct_param_store_uploads_wait(p);
    ct_optim_update_end(o, &u, stats);
}

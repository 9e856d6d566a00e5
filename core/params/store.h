/* store.h: the parameter store owns the flat buffers of a run (layout.h says what is where).
 *
 *   master   fp32 master weights of the range [lo, hi) this process updates: the whole space
 *            [0, n_params) without ZeRO, a shard with it. Element lo is master[0].
 *   params   [n_params] the parameters forward and backward read, in the compute dtype. In fp32
 *            with the whole range this is the master itself; otherwise a copy the optimizer's
 *            fused update writes (and an all-gather completes under ZeRO).
 *   grads    [n_params] fp32 gradients, accumulated over micro-batches.
 *   buffers  [n_buffers] fp32 non-trainable state (running statistics), always whole.
 *
 * Partitioned (core/zero/partition.h): at ZeRO stage 2 grads, at stage 3 params too, hold only
 * [lo, hi), element lo at index 0 (in fp32 the partitioned params is the master itself); layers
 * then reach them through scratch buffers the executor's hooks point them at, never directly.
 *
 * ZeRO-Offload (ct_param_store_create_in with a ct_store_offload): the master and the partitioned
 * gradients live in host memory (pinned by the device backend, or the host CPU backend's own with
 * pin_memory false), where the CPU backend `host` initialises them, accumulates into them and steps
 * them; the device keeps the compute copy (also in fp32: a copy of its own) and the buffers. The
 * compute copy goes up a chunk at a time through two pinned staging buffers (ct_param_store_stage,
 * _upload, _uploads_wait), or in fp32 with pinned memory straight from the master.
 *
 * NVMe offload (ct_store_offload.swapped): the master of [lo, hi) is not in the store at all
 * (master NULL): it lives in swap files the trainer walks chunk by chunk (core/zero/swap.h), and
 * the store gives those chunks their initial values (ct_param_store_init_master) and takes the
 * compute copy from them (ct_param_store_refresh_range); the copy is always one of its own, staged.
 *
 * The optimizer owns only its state and steps the (master, grads, params) range it is given
 * (core/optim/optim.h). Layers get their pointers from the executor, which offsets these buffers
 * by the views; a prepare hook may redirect them (core/graph/graph.h). */
#ifndef CT_PARAMS_STORE_H
#define CT_PARAMS_STORE_H

#include "core/backend/backend.h"
#include "core/params/layout.h"

typedef struct ct_param_store {
    const ct_param_layout *layout;
    ct_backend *be;
    ct_dtype compute;            /* CT_F32, CT_F16 or CT_BF16 */
    int64_t lo, hi;              /* the master's range */
    bool part_grads;             /* ZeRO-2 and 3: grads is [hi - lo] */
    bool part_params;            /* ZeRO-3: params is [hi - lo] too */
    float *master;               /* [hi - lo]; NULL when swapped (NVMe offload) */
    void *params;                /* [n_params] in compute (== master when fp32 and whole);
                                    part_params: [hi - lo] (== master in fp32) */
    float *grads;                /* [n_params]; part_grads: [hi - lo] */
    float *buffers;              /* [n_buffers] (NULL when there are none) */
    ct_mem_place state_at;       /* where master and grads live: be's memory, or host memory */
    bool host_state;             /* ZeRO-Offload: they are in host memory (state_at.host computes) */
    bool host_params;            /* ...and params too (offload_param: pinned, the part at stage 3) */
    int64_t stage_elems;         /* host_state: elements per upload of the compute copy */
    void *stage[2];              /* host_state: pinned staging of the compute copy; NULL: uploads read
                                    the master itself (fp32, pinned) */
    uint64_t stage_ticket[2];    /* the last upload from each staging buffer (0: none) */
    int stage_next;
    uint64_t last_upload;
} ct_param_store;

/* Bytes the store allocates per memory category (pure: the planner's numbers). */
/* What a store holds of the range [lo, hi) only, besides the master (ZeRO stages 2 and 3). */
enum { CT_STORE_WHOLE = 0, CT_STORE_PART_GRADS = 1u, CT_STORE_PART_PARAMS = 2u,
       CT_STORE_NO_GRADS = 4u /* no gradient buffer at all: a store that only evaluates (grads NULL) */ };

void ct_param_store_plan(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts,
                         size_t bytes[CT_MEM_CAT_COUNT]);

/* Allocate on be, everything zeroed. lo, hi: the master's range (0, L->n_params for all);
 * parts: CT_STORE_PART_* flags, the buffers that hold that range only.
 * CT_ERR_RUNTIME naming the bytes when memory runs out. */
int ct_param_store_create(const ct_param_layout *L, ct_backend *be, ct_dtype compute, int64_t lo,
                          int64_t hi, unsigned parts, ct_param_store **out, ct_err *err);

/* ZeRO-Offload's host side: the CPU backend that computes on the host state, whether it is pinned
 * (offload_optimizer.pin_memory), and the elements of each upload of the compute copy. */
typedef struct ct_store_offload {
    ct_backend *host;
    bool pinned;
    int64_t chunk;
    bool params;                 /* offload_param (stage 3: CT_STORE_PART_PARAMS): the compute-dtype
                                    part in pinned host memory too (the master itself in fp32 when
                                    that is pinned), which the optimizer's pass writes and the
                                    partition uploads layer by layer */
    bool swapped;                /* NVMe offload: no master buffer (the trainer's swap files hold
                                    it); the compute copy a copy of its own in fp32 too */
} ct_store_offload;
/* As ct_param_store_plan and _create; with off, the master and the gradients (which must be
 * partitioned: CT_STORE_PART_GRADS) in host memory, counted in host[] (and the staging buffers,
 * workspace), the rest in dev[]. host may be NULL without off. */
void ct_param_store_plan_in(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts,
                            const ct_store_offload *off, size_t dev[CT_MEM_CAT_COUNT], size_t host[CT_MEM_CAT_COUNT]);
int ct_param_store_create_in(const ct_param_layout *L, ct_backend *be, ct_dtype compute, int64_t lo, int64_t hi,
                             unsigned parts, const ct_store_offload *off, ct_param_store **out, ct_err *err);

/* ZeRO-Offload: the compute copy of [a, b) (at most stage_elems elements of [lo, hi)) goes up in
 * two calls: stage returns where to write it in the compute dtype (a staging buffer, once its last
 * upload has read it), or NULL when the upload reads the master itself (fp32, pinned); upload then
 * queues its copy to the device. uploads_wait returns when every upload has landed (the staging is
 * free and host code may read the device's copy). With the parameters in host memory too
 * (host_params) stage returns their place there (NULL when they are the master) and nothing goes
 * up: the partition uploads them layer by layer. */
void *ct_param_store_stage(ct_param_store *s, int64_t a, int64_t b);
void ct_param_store_upload(ct_param_store *s, int64_t a, int64_t b);
void ct_param_store_uploads_wait(ct_param_store *s);
void ct_param_store_free(ct_param_store *s);

/* Parameters and buffers from Philox keyed by (seed, CT_RNG_INIT, view index, element), the
 * layer's init scheme applied (PyTorch's defaults unless "init" says otherwise): the master of
 * [lo, hi) and the buffers; then the compute copy. Values depend only on the seed and the model.
 * A swapped store (no master) initialises its buffers only: see ct_param_store_init_master. */
void ct_param_store_init(ct_param_store *s, uint64_t seed);
/* The initial master of the flat range [a, b) (inside [lo, hi)) into dst[b - a], in the memory of
 * the backend that computes on the master (ct_place_ops(&s->state_at)): the elements of every
 * trainable view, drawn as ct_param_store_init draws them, and zeros between views. Any range
 * gives the values of the whole: a swap's chunks are filled one by one. */
void ct_param_store_init_master(const ct_param_store *s, uint64_t seed, int64_t a, int64_t b, float *dst);

/* The compute copy from the master, after the master changed outside the optimizer (a loaded
 * checkpoint, init_from): a cast, or nothing when params is the master; with the master in host
 * memory, cast a chunk at a time into staging and uploaded (waited for). */
void ct_param_store_refresh(ct_param_store *s);
/* Host state (ZeRO-Offload): the compute copy of [a, b) from master values in host memory
 * (master_ab: element a), cast into staging and its uploads queued (the caller waits with
 * ct_param_store_uploads_wait), or with the parameters in host memory cast there. A swapped store
 * refreshes so, chunk by chunk of its swap. */
void ct_param_store_refresh_range(ct_param_store *s, int64_t a, int64_t b, const float *master_ab);

void ct_param_store_zero_grads(ct_param_store *s);

/* True when params is a copy of its own (16-bit, or a shard's whole fp32 copy) that every update
 * of the master must also write. */
bool ct_param_store_has_copy(const ct_param_store *s);

/* Element lo of the compute copy and of the gradients: where the master's range starts in them
 * (whole buffers: offset lo; partitioned ones: their start). */
void *ct_param_store_part_params(const ct_param_store *s);
float *ct_param_store_part_grads(const ct_param_store *s);

#endif

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
 * Partitioned (core/train/partition.h): at ZeRO stage 2 grads, at stage 3 params too, hold only
 * [lo, hi), element lo at index 0 (in fp32 the partitioned params is the master itself); layers
 * then reach them through scratch buffers the executor's hooks point them at, never directly.
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
    float *master;               /* [hi - lo] */
    void *params;                /* [n_params] in compute (== master when fp32 and whole);
                                    part_params: [hi - lo] (== master in fp32) */
    float *grads;                /* [n_params]; part_grads: [hi - lo] */
    float *buffers;              /* [n_buffers] (NULL when there are none) */
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
void ct_param_store_free(ct_param_store *s);

/* Parameters and buffers from Philox keyed by (seed, CT_RNG_INIT, view index, element), the
 * layer's init scheme applied (PyTorch's defaults unless "init" says otherwise): the master of
 * [lo, hi) and the buffers; then the compute copy. Values depend only on the seed and the model. */
void ct_param_store_init(ct_param_store *s, uint64_t seed);

/* The compute copy from the master, after the master changed outside the optimizer (a loaded
 * checkpoint, init_from): a cast, or nothing when params is the master. */
void ct_param_store_refresh(ct_param_store *s);

void ct_param_store_zero_grads(ct_param_store *s);

/* True when params is a copy of its own (16-bit, or a shard's whole fp32 copy) that every update
 * of the master must also write. */
bool ct_param_store_has_copy(const ct_param_store *s);

/* Element lo of the compute copy and of the gradients: where the master's range starts in them
 * (whole buffers: offset lo; partitioned ones: their start). */
void *ct_param_store_part_params(const ct_param_store *s);
float *ct_param_store_part_grads(const ct_param_store *s);

#endif

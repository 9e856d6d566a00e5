/* zero3.h: ZeRO stage 3 on the executor's hooks: parameters partitioned across ranks.
 *
 * Each rank's parameter store is partitioned (core/params/store.h): it holds the master, the
 * compute copy and the gradients of its part [lo, hi) of the flat space only (ct_comm_shard, the
 * partition stages 1 and 2 use for the master, so checkpoints and the optimizer are unchanged).
 * Before a layer runs forward, recompute or backward, the prepare hook gathers the parameters it
 * reads into one scratch buffer (all_gather_range: each rank sends what of its part falls in the
 * layer's spans) and points the layer at them; the next layer's gather overwrites them, so at
 * most one layer's parameters are whole at a time. In backward the layer's gradients go into a
 * zeroed scratch, and the after hook reduce-scatters them to their owners (reduce_scatter_range),
 * which add them to their part's gradients: every micro-batch, as DeepSpeed does.
 *
 * Views of fewer than stage3_param_persistence_threshold elements stay whole on every rank (one
 * packed buffer, gathered again after every update: ct_zero3_refresh): no collective per layer
 * for biases and norms. Their gradients take the same reduce-scatter as the others'.
 *
 * A layer's views are grouped into spans: runs of views adjacent in the flat space (with the
 * alignment padding between them, which is zero everywhere), one collective per span; a tied view
 * (declared by another layer) is a span of its own, gathered by each layer that reads it. */
#ifndef CT_TRAIN_ZERO3_H
#define CT_TRAIN_ZERO3_H

#include "core/dist/comm.h"
#include "core/graph/graph.h"
#include "core/params/store.h"

typedef struct ct_zero3 ct_zero3;

/* Bytes ZeRO-3's buffers take per rank, by category (pure: the memory plan): the gather scratch
 * and the persistent views (params), the gradient scratch and the received share (grads). */
void ct_zero3_plan(const ct_param_layout *L, ct_dtype compute, double persistence_threshold,
                   size_t bytes[CT_MEM_CAT_COUNT]);

/* Over a partitioned store p (p->partitioned) and its communicator. CT_ERR_RUNTIME when memory
 * runs out. */
int ct_zero3_create(ct_param_store *p, ct_comm *c, double persistence_threshold, ct_zero3 **out, ct_err *err);
void ct_zero3_free(ct_zero3 *z);

/* The hooks of a training step and of evaluation (host_work: they call the communicator). */
ct_exec_hooks ct_zero3_hooks(ct_zero3 *z);

/* After the store's part of the compute copy changed (an update, a load): the persistent views
 * gathered again. Collective. */
int ct_zero3_refresh(ct_zero3 *z, ct_err *err);

#endif

/* partition.h: ZeRO stages 2 and 3 on the executor's hooks: gradients, and at stage 3 parameters,
 * partitioned across ranks.
 *
 * The parameter store is partitioned (core/params/store.h): at stage 2 its gradients, at stage 3
 * its compute-dtype parameters too, hold only the rank's part [lo, hi) of the flat space
 * (ct_comm_shard, the partition of the master and optimizer state, so checkpoints and the
 * optimizer step are those of stage 1).
 *
 * Stage 3: before a layer runs forward, recompute or backward, the prepare hook gathers the
 * parameters it reads into one scratch buffer (all_gather_range: each rank sends what of its part
 * falls in the layer's spans) and points the layer at them; the next layer's gather overwrites
 * them, so at most one layer's parameters are whole at a time.
 *
 * Both stages: in backward the layer's gradients go into a zeroed scratch, and the after hook
 * reduce-scatters them to their owners (reduce_scatter_range), which add them to their part's
 * gradients; every micro-batch, as DeepSpeed does. So no rank ever holds the whole gradient.
 *
 * Views of fewer than stage3_param_persistence_threshold elements stay whole on every rank at
 * stage 3 (one packed buffer, gathered again after every update: ct_partition_refresh): no
 * collective per layer for biases and norms. Their gradients take the same reduce-scatter.
 *
 * A layer's views are grouped into spans: runs of views adjacent in the flat space (with the
 * alignment padding between them, zero everywhere), one collective per span; a tied view (declared
 * by another layer) is a span of its own, gathered and reduced by each layer that reads it.
 *
 * Every rank must walk the layers the same number of times per step (the collectives pair up by
 * order): a rank short of micro-batches walks with ct_step_io.hooks_only. */
#ifndef CT_TRAIN_PARTITION_H
#define CT_TRAIN_PARTITION_H

#include "core/dist/comm.h"
#include "core/graph/graph.h"
#include "core/params/store.h"

typedef struct ct_partition ct_partition;

/* Bytes the partition's buffers take per rank of `world`, by category (pure: the memory plan):
 * the persistent views (params, stage 3); the gather scratch, the gradient scratch and the share
 * received of a span (workspace: like DeepSpeed's buckets, outside ZeRO's per-rank formulas).
 * stage: 2 or 3. */
void ct_partition_plan(const ct_param_layout *L, ct_dtype compute, int stage, double persistence_threshold,
                       int world, size_t bytes[CT_MEM_CAT_COUNT]);

/* Over store p (its gradients partitioned; at stage 3 its parameters too) and its communicator.
 * CT_ERR_RUNTIME when memory runs out. */
int ct_partition_create(ct_param_store *p, ct_comm *c, double persistence_threshold, ct_partition **out,
                        ct_err *err);
void ct_partition_free(ct_partition *z);

/* The hooks of a training step and of evaluation (host_work: they call the communicator). */
ct_exec_hooks ct_partition_hooks(ct_partition *z);

/* After the store's part of the compute copy changed (an update, a load): the persistent views
 * gathered again (stage 3; nothing at stage 2). Collective. */
int ct_partition_refresh(ct_partition *z, ct_err *err);

#endif

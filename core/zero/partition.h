/* partition.h: ZeRO stages 2 and 3 on the executor's hooks: gradients, and at stage 3 parameters,
 * partitioned across ranks.
 *
 * The parameter store is partitioned (core/params/store.h): at stage 2 its gradients, at stage 3
 * its compute-dtype parameters too, hold only the rank's part [lo, hi) of the flat space
 * (ct_comm_shard, the partition of the master and optimizer state, so checkpoints and the
 * optimizer step are those of stage 1).
 *
 * Stage 3: before a layer runs forward, recompute or backward, the prepare hook gathers the
 * parameters it reads into the gather buffer (all_gather_range: each rank sends what of its part
 * falls in the layer's spans) and points the layer at them; the next layer's gather releases
 * them, so without prefetch at most one layer's parameters are whole at a time.
 *
 * Both stages: in backward the layer's gradients go into a zeroed scratch, and the after hook
 * reduce-scatters them to their owners (reduce_scatter_range), which add them to their part's
 * gradients; every micro-batch, as DeepSpeed does. So no rank ever holds the whole gradient.
 *
 * With the parameters in host memory too (offload_param, the store's host_params) one process's
 * gathers are uploads of the layer's spans from the host part into the gather buffer (prefetched,
 * reused and released as the gathers are); several processes' gathers read the host part with
 * the communicator. The persistent views go up again at every refresh.
 *
 * ZeRO-Offload (the store's gradients in host memory, store.h): each share is downloaded into a
 * pinned landing buffer of its slot (one process: straight from the scratch as soon as the
 * layer's backward is done, the reduction being the identity) and added to the part's gradients
 * there by the CPU backend beside the device, when the slot completes: with overlap_comm two
 * layers later, so the download runs during the layer below's backward.
 *
 * Views of fewer than stage3_param_persistence_threshold elements stay whole on every rank at
 * stage 3 (one packed buffer, gathered again after every update: ct_partition_refresh): no
 * collective per layer for biases and norms. Their gradients take the same reduce-scatter.
 *
 * A layer's views are grouped into spans: runs of views adjacent in the flat space (with the
 * alignment padding between them, zero everywhere), one collective per span; a tied view (declared
 * by another layer) is a span of its own, gathered and reduced by each layer that reads it.
 *
 * Overlap (zero_optimization.overlap_comm): a layer's gradient reduce-scatter is started in its
 * after hook and completed (added to the owners' gradients) when its scratch is needed again, two
 * layers later, or at ct_partition_flush: it runs while the layer below computes its backward.
 * Without overlap each is waited for at once. Both use the same non-blocking reduce-scatter, and
 * the additions into the part's gradients keep their order, so the gradients are the same bits.
 *
 * Stage 3 prefetch: the hooks learn the order in which the layers gather (forward, recompute with
 * activation checkpointing, backward; each (pass, layer) remembers which gathering (pass, layer)
 * came next), and from the second micro-batch on, once a layer has its parameters, they start the
 * gathers of the next ones in that order (non-blocking) while it runs: as many layers as fit in
 * stage3_prefetch_bucket_size elements, never more gathered elements at once (the running layer's
 * and the prefetched ones') than stage3_max_live_parameters, except that the running layer is
 * always gathered whole. A prefetch the walk does not use (the order changed: evaluation after
 * training) is waited for and dropped. Nothing is prefetched across a micro-batch boundary (from a
 * backward to the next forward), nor kept across an update (ct_partition_flush drops it).
 *
 * Reuse (stage3_max_reuse_distance > 0): a layer gathered again by the very next gathering use
 * (the last layer's forward then backward; with activation checkpointing a segment's last layer,
 * recomputed then run backward; layer 0's backward, then the next micro-batch's forward) keeps
 * its parameters instead: a reuse distance of 0 elements.
 * Longer distances are not tracked: a layer is released when another one gathers.
 *
 * Every rank must walk the layers the same number of times per step (the collectives pair up by
 * order): a rank short of micro-batches walks with ct_step_io.hooks_only. The prefetch decisions
 * depend only on that walk and the config, so every rank starts the same gathers in the same
 * order. */
#ifndef CT_ZERO_PARTITION_H
#define CT_ZERO_PARTITION_H

#include "core/dist/comm.h"
#include "core/graph/graph.h"
#include "core/config/config.h"
#include "core/params/store.h"

typedef struct ct_partition ct_partition;

/* The zero_optimization keys the partition acts on. */
typedef struct ct_partition_opts {
    double persistence_threshold;  /* stage3_param_persistence_threshold: smaller views stay whole */
    bool overlap;                  /* overlap_comm */
    int64_t prefetch_elems;        /* stage3_prefetch_bucket_size: gathered ahead at most (0: none) */
    int64_t max_live_elems;        /* stage3_max_live_parameters */
    int64_t max_reuse_elems;       /* stage3_max_reuse_distance: > 0 keeps a layer's parameters for
                                      its next use when nothing is gathered in between */
    bool offload;                  /* ZeRO-Offload: the part's gradients are in host memory (the
                                      store's host_state; ct_partition_create takes it from there) */
} ct_partition_opts;

ct_partition_opts ct_partition_opts_from(const ct_zero_cfg *z);

/* Bytes the partition's buffers take per rank of `world`, by category (pure: the memory plan):
 * the persistent views (params, stage 3); the gather buffer (the running layer's parameters and
 * the prefetched ones), the gradient scratch (two layers' with overlap) and the shares received
 * (workspace: like DeepSpeed's buckets, outside ZeRO's per-rank formulas); with offload, in host[]
 * (NULL allowed without), the pinned landing buffers the shares are downloaded into. stage: 2 or 3. */
void ct_partition_plan(const ct_param_layout *L, ct_dtype compute, int stage, const ct_partition_opts *o,
                       int world, size_t bytes[CT_MEM_CAT_COUNT], size_t host[CT_MEM_CAT_COUNT]);

/* Over store p (its gradients partitioned; at stage 3 its parameters too) and its communicator.
 * CT_ERR_RUNTIME when memory runs out. */
int ct_partition_create(ct_param_store *p, ct_comm *c, const ct_partition_opts *o, ct_partition **out,
                        ct_err *err);
void ct_partition_free(ct_partition *z);

/* The hooks of a training step and of evaluation (host_work: they call the communicator). */
ct_exec_hooks ct_partition_hooks(ct_partition *z);

/* After the store's part of the compute copy changed (an update, a load): the persistent views
 * gathered again (stage 3; nothing at stage 2), prefetched gathers dropped. Collective. */
int ct_partition_refresh(ct_partition *z, ct_err *err);

/* Before the step's gradients are read (norm, overflow, update): every reduce-scatter in flight
 * completed into the part's gradients; prefetched parameters dropped (the update changes them).
 * Collective. */
int ct_partition_flush(ct_partition *z, ct_err *err);

/* Gathers this rank started ahead of their layer, those of them it used, and the uses that kept
 * the parameters of the use before (tests). */
void ct_partition_prefetch_counts(const ct_partition *z, long *started, long *used, long *reused);

#endif

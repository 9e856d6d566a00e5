/* plan.h: the memory plan of a run, before anything is allocated.
 *
 * A pure function of the config, the built graph (core/graph/graph.h: shapes and the activation
 * plan) and the backend kind: the bytes each memory category will hold at its peak (backend.h
 * ct_mem_cat), as the allocations of the parameter store, the optimizer, the graph's arena and
 * the loader will make them. --dry-run prints it without creating a backend or opening data; a
 * run prints it at start, and the summary's peak_bytes_by_category can be held against it. */
#ifndef CT_TRAIN_PLAN_H
#define CT_TRAIN_PLAN_H

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/graph/graph.h"

typedef struct ct_run_plan {
    size_t bytes[CT_MEM_CAT_COUNT];  /* per category; activations = the graph's whole arena (its
                                        layer workspace included: one allocation); workspace = the
                                        trainer's loss accumulator. Not planned: the CPU backend's
                                        fp32 copies of 16-bit arguments (workspace), which grow to
                                        their size in the first step */
    ct_act_plan act;                 /* the activations by lifetime */
    size_t total;
    bool device;                     /* planned for a device backend (else host memory) */
} ct_run_plan;

/* The ZeRO stage this run partitions at: zero_optimization.stage 1, 2 or 3 with several ranks; 0
 * otherwise (one process holds everything whatever the stage asks for). */
int ct_run_plan_zero_stage(const ct_config *cfg);

/* What the parameter store of a ZeRO stage holds of its rank's part only (CT_STORE_PART_*, core/
 * params/store.h): stage 2 the gradients, stage 3 the parameters too. */
unsigned ct_run_plan_store_parts(int stage);

/* device: the backend will be a GPU (loader batches then have device copies). The bytes are per
 * rank: under ZeRO the master and optimizer state of rank 0's part (the largest, ct_comm_shard);
 * the gradients whole at stage 1, rank 0's part at stages 2 and 3; the compute copy whole at
 * stages 1 and 2, rank 0's part at stage 3; at stages 2 and 3 the partition's scratch in the
 * workspace (core/train/partition.h). */
void ct_run_plan_make(const ct_config *cfg, const ct_graph *g, bool device, ct_run_plan *out);

/* The plan of a run that only evaluates (ct_run_opts.forward_only): p without its gradients and
 * optimizer state. */
void ct_run_plan_forward_only(ct_run_plan *p);

#endif

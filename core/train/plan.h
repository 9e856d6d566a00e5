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
#include "core/zero/stage.h"   /* the stage rule: which ZeRO stage and offload a run runs */

typedef struct ct_run_plan {
    size_t bytes[CT_MEM_CAT_COUNT];  /* per category; activations = the graph's whole arena (its
                                        layer workspace included: one allocation); workspace = the
                                        trainer's loss accumulator. Not planned: the CPU backend's
                                        fp32 copies of 16-bit arguments (workspace), which grow to
                                        their size in the first step */
    ct_act_plan act;                 /* the activations by lifetime */
    size_t total;
    bool device;                     /* planned for a device backend (else host memory) */
    /* On a device, the host memory beside it, per category (pinned unless offload_optimizer's
     * pin_memory is false): ZeRO-Offload's fp32 master, gradients and optimizer state, its staging
     * and landing buffers (workspace), offloaded activations (cpu_checkpointing). Not planned: the
     * loader's pinned slots. */
    size_t host[CT_MEM_CAT_COUNT];
    size_t host_total;
    bool offload;                    /* ZeRO-Offload of the optimizer (ct_zero_offload) */
    /* NVMe offload (ct_zero_nvme): the master and optimizer state in swap files, whose buffers
     * are the host's optimizer bytes (host[CT_MEM_OPTIM]; no master there) */
    bool nvme;
    size_t swap_host;                /* the swap's buffers (and one block to align them) */
    int64_t swap_disk;               /* its files under nvme_path */
    int64_t swap_elems;              /* the part whose state they hold (rank 0's) */
} ct_run_plan;

/* What a run of cfg will train on, known without creating its backend (--dry-run, the auto
 * micro-batch): a device (train.device "cuda"/"cuda:N", or "auto" where has_gpu; or the capped
 * device, CTRAIN_CAPPED_DEVICE, for "cpu" and "auto" without a GPU), its name as the start block
 * prints it, and its memory when known before it starts (the capped device's size; 0 for a
 * GPU). CT_ERR_CONFIG when CTRAIN_CAPPED_DEVICE cannot be read. */
typedef struct ct_plan_target {
    bool device;
    const char *name;            /* "cpu", "cuda", "capped" */
    size_t capacity;
} ct_plan_target;
int ct_run_plan_target(const ct_config *cfg, bool has_gpu, ct_plan_target *out, ct_err *err);

/* device: the backend will be a device (a GPU, the capped device: loader batches then have device
 * copies, and offload_optimizer moves state to host memory). The bytes are per
 * rank: under ZeRO the master and optimizer state of rank 0's part (the largest, ct_comm_shard);
 * the gradients whole at stage 1, rank 0's part at stages 2 and 3; the compute copy whole at
 * stages 1 and 2, rank 0's part at stage 3; at stages 2 and 3 the partition's scratch in the
 * workspace (core/zero/partition.h). */
void ct_run_plan_make(const ct_config *cfg, const ct_graph *g, bool device, ct_run_plan *out);

/* The plan of a run that only evaluates (ct_run_opts.forward_only): p without its gradients and
 * optimizer state. */
void ct_run_plan_forward_only(ct_run_plan *p);

#endif

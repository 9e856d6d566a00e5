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
    /* On a device, the host memory beside it, per category (pinned unless offload_optimizer's
     * pin_memory is false): ZeRO-Offload's fp32 master, gradients and optimizer state, its staging
     * and landing buffers (workspace), offloaded activations (cpu_checkpointing). Not planned: the
     * loader's pinned slots. */
    size_t host[CT_MEM_CAT_COUNT];
    size_t host_total;
    bool offload;                    /* ZeRO-Offload of the optimizer (ct_run_plan_offload) */
    /* NVMe offload (ct_run_plan_nvme): the master and optimizer state in swap files, whose buffers
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

/* ZeRO-Offload of the optimizer: zero_optimization.offload_optimizer.device "cpu" or "nvme" (stage
 * 1-3) on a device (a GPU, the capped device): the fp32 master, the gradients and the optimizer
 * state in host memory (or, with "nvme", the master and state in swap files), the optimizer step
 * on the CPU. On the CPU backend that memory is host memory already and "cpu" moves nothing: false;
 * "nvme" still takes the master and state out of memory there: true, the CPU's memory standing in
 * for the device's (the copies are memcpy). */
bool ct_run_plan_offload(const ct_config *cfg, bool device);

/* NVMe offload of the optimizer (ZeRO-Infinity): offload_optimizer.device "nvme" at stages 1-3, on
 * any backend: the fp32 master and optimizer state of the rank's part in swap files under
 * nvme_path (core/train/nvme.h), the rest as ZeRO-Offload's. */
bool ct_run_plan_nvme(const ct_config *cfg, bool device);

/* ZeRO-Offload of the parameters too (ZeRO-Infinity's CPU case): offload_param.device "cpu" at
 * stage 3 with optimizer offload on a device: the compute-dtype parameters of the rank's part live
 * in pinned host memory, uploaded into the gather buffer layer by layer. On the CPU backend they
 * are in host memory already: false. */
bool ct_run_plan_offload_params(const ct_config *cfg, bool device);

/* The elements of the host master each upload of the compute copy carries under ZeRO-Offload
 * (the optimizer steps one such chunk while the last one goes up): sub_group_size, at most
 * CT_OFFLOAD_MAX_CHUNK. */
#define CT_OFFLOAD_MAX_CHUNK ((int64_t)1 << 22)
int64_t ct_run_plan_offload_chunk(const ct_config *cfg);

/* The ZeRO stage whose machinery this run runs: zero_optimization.stage 1, 2 or 3 with several
 * ranks, 0 otherwise (one process holds everything whatever the stage asks for), except under
 * ZeRO-Offload (device: see ct_run_plan_offload), which takes stage 2's gradient path (each
 * layer's gradients brought down to host memory as backward produces them) at stage 1 and, with
 * one process, at stages 1-3; with parameter offload too (ct_run_plan_offload_params), stage 3
 * whatever the number of processes. */
int ct_run_plan_zero_stage(const ct_config *cfg, bool device);
/* The same without any offload (a run that only evaluates): the stage with several ranks, else 0. */
int ct_run_plan_partition_stage(const ct_config *cfg);

/* What the parameter store of a ZeRO stage holds of its rank's part only (CT_STORE_PART_*, core/
 * params/store.h): stage 2 the gradients, stage 3 the parameters too. */
unsigned ct_run_plan_store_parts(int stage);

/* device: the backend will be a device (a GPU, the capped device: loader batches then have device
 * copies, and offload_optimizer moves state to host memory). The bytes are per
 * rank: under ZeRO the master and optimizer state of rank 0's part (the largest, ct_comm_shard);
 * the gradients whole at stage 1, rank 0's part at stages 2 and 3; the compute copy whole at
 * stages 1 and 2, rank 0's part at stage 3; at stages 2 and 3 the partition's scratch in the
 * workspace (core/train/partition.h). */
void ct_run_plan_make(const ct_config *cfg, const ct_graph *g, bool device, ct_run_plan *out);

/* The plan of a run that only evaluates (ct_run_opts.forward_only): p without its gradients and
 * optimizer state. */
void ct_run_plan_forward_only(ct_run_plan *p);

#endif

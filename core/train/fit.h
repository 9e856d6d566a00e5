/* fit.h: what fits in a memory budget, from the run's own plan (plan.h).
 *
 * Every figure here is ct_run_plan_make over a graph built (core/graph/graph.h, no backend, no
 * allocation) with the choice's micro-batch and checkpointing, so it is the plan the run with that
 * choice would print and be held to, not a second estimate. Used by --dry-run's table, by
 * train.memory_limit_gb's check and the out-of-memory message (the suggestions), and by the
 * "auto" micro-batch. Choices keep train_batch_size: the micro-batch divides its per-rank share
 * and gradient accumulation follows DeepSpeed's rule (train = micro × accumulation × world). */
#ifndef CT_TRAIN_FIT_H
#define CT_TRAIN_FIT_H

#include "core/train/plan.h"

/* The auto micro-batch takes the largest whose plan stays under this share of the limit: the plan
 * leaves out the CPU backend's fp32 copies of 16-bit arguments, OpenBLAS's buffers and a GPU's
 * CUDA context and allocator slack, so a pick at 100% would fail in its first step. */
#define CT_FIT_AUTO_MARGIN 0.90

/* One run the plan is asked about. */
typedef struct ct_fit_choice {
    long micro, accum;      /* the micro-batch and the accumulation the batch rule gives it */
    long segments;          /* CT_SEGMENTS_CONFIG (core/graph/graph.h): the config's checkpointing;
                               0: none; N: number_checkpoints N (marks ignored) */
    size_t peak;            /* the plan's total */
} ct_fit_choice;

/* The plan of the run with micro-batch `micro` and checkpointing `segments` (as above); device
 * as ct_run_plan_make. Errors are the graph builder's. */
int ct_fit_plan(const ct_config *cfg, bool device, long micro, long segments, ct_run_plan *out, ct_err *err);

/* The checkpointing choice "every block": one segment per block instance (number_checkpoints =
 * ct_graph_blocks); 0 when the model has no blocks (checkpointing then has no natural unit). */
long ct_fit_every_block(const ct_config *cfg, ct_err *err);

/* The largest micro-batch m <= max_micro that divides per_rank and whose peak(ctx, m) is at most
 * budget; 0 when none does. peak returns SIZE_MAX when it cannot plan m. Pure: the arithmetic of
 * the suggestions and of the auto micro-batch, testable with any peak function. */
long ct_fit_largest_micro(long per_rank, long max_micro, size_t budget, size_t (*peak)(void *ctx, long micro),
                          void *ctx);

/* The suggestions for a run that does not fit `limit` bytes, as lines of text ("  - micro-batch 8
 * with gradient accumulation 4 fits in 21.3 GiB", "  - or checkpoint every block ...: 14.0 GiB"),
 * or the one line saying that nothing does (what the model's fixed part alone needs). */
void ct_fit_suggest(const ct_config *cfg, bool device, size_t limit, char *out, size_t n);

/* The breakdown of a plan in one line: "params 1.0 MiB, master ..., loader 0 B · all 9.0 MiB". */
void ct_fit_describe(const ct_run_plan *p, char *out, size_t n);

/* The error of a run whose plan is over `limit` (what: "train.memory_limit_gb 0.01 (10.2 MiB)"),
 * or of an allocation that failed (`err` already says what was being allocated): the planned
 * breakdown and the suggestions appended. Returns CT_ERR_RUNTIME. */
int ct_fit_over_limit(const ct_config *cfg, const ct_run_plan *p, size_t limit, const char *what, ct_err *err);
int ct_fit_explain_oom(const ct_config *cfg, const ct_run_plan *p, size_t limit, ct_err *err);

/* For a run whose plan fits under `limit` but which may still run out (what the plan does not
 * count: the CPU backend's fp32 copies of 16-bit arguments grow in the first step): the lines to
 * print after such an out-of-memory, the plan and the choices that plan less (within 90% of the
 * limit, and below this plan). */
void ct_fit_oom_note(const ct_config *cfg, const ct_run_plan *p, size_t limit, char *out, size_t n);

/* The --dry-run table: the choices that apply (micro-batches from the configured one halving to 1
 * and doubling up to the per-rank batch, those that divide it; checkpointing as configured, off,
 * every block) with each plan's peak and, when limit > 0, whether it fits. One line per row into
 * line(ctx, text). */
int ct_fit_table(const ct_config *cfg, bool device, size_t limit, void (*line)(void *ctx, const char *text),
                 void *ctx, ct_err *err);

/* The memory a run may plan for: the smaller of device_memory (--device-memory; 0: not given) and
 * train.memory_limit_gb; 0 when neither is known. *source names where it came from. */
size_t ct_fit_limit(const ct_config *cfg, size_t device_memory, const char **source);

/* train_micro_batch_size_per_gpu "auto" (cfg->micro_batch_auto): with a limit (ct_fit_limit), the
 * largest micro-batch dividing the per-rank batch whose plan is within CT_FIT_AUTO_MARGIN of it,
 * accumulation following; without one, the batch rule's derivation stays (the host's free memory
 * is not used: what is trained would then depend on what else runs on the machine). `note` says
 * what was chosen and why (empty when the micro-batch is not "auto"). CT_ERR_RUNTIME when not even
 * micro-batch 1 fits, with the suggestions. */
int ct_fit_auto_micro_batch(ct_config *cfg, bool device, size_t device_memory, char *note, size_t note_n,
                            ct_err *err);

/* ---- ZeRO stage and offload: what fits a device and its host (--dry-run's second table) ---- */

/* What a row of the table moves out of device memory, in the order the cheapest row is chosen
 * (the least moved and the fastest path first): nothing; the optimizer to host memory
 * (offload_optimizer "cpu": the fp32 master, gradients and optimizer state; stages 1-3); the
 * parameters too (offload_param "cpu", stage 3); the optimizer to NVMe (offload_optimizer "nvme":
 * the master and optimizer state in swap files under nvme_path, the gradients in host memory); the
 * parameters to host memory beside that (stage 3). */
typedef enum ct_fit_offload {
    CT_FIT_NO_OFFLOAD,
    CT_FIT_OFFLOAD_OPTIMIZER,
    CT_FIT_OFFLOAD_BOTH,
    CT_FIT_OFFLOAD_NVME,
    CT_FIT_OFFLOAD_NVME_PARAMS,
} ct_fit_offload;

/* The offload devices a row sets: offload_optimizer's and offload_param's (ct_offload_cfg.device). */
ct_offload_device ct_fit_offload_optimizer(ct_fit_offload o);
ct_offload_device ct_fit_offload_param(ct_fit_offload o);

/* The memory the table is for, in bytes; 0: not known. `device` is one device's (each rank has
 * one); `host` is one machine's, shared by all of cfg->world_size ranks. */
typedef struct ct_fit_memory {
    size_t device, host;
} ct_fit_memory;

/* stage 0; 1 and 2 without offload, with the optimizer's to host memory and to NVMe; 3 without,
 * with the optimizer's, with both, with the optimizer's to NVMe, and with that and the parameters' */
#define CT_FIT_ZERO_ROWS 12

/* One row: the config with zero_optimization.stage and the offload devices set as the row says,
 * everything else (micro-batch, checkpointing, world size, pin_memory) as configured, planned for
 * a device by ct_run_plan_make: the plan a run with that setting prints and is held to. */
typedef struct ct_fit_zero_row {
    int stage;                   /* zero_optimization.stage */
    ct_fit_offload offload;
    int runs_stage;              /* the machinery the run runs (ct_zero_stage: one process
                                    without offload trains as stage 0) */
    char refused[160];           /* not "": the run stops at start (exit 2), and why, shortened */
    size_t device, host;         /* the plan's device and host totals, per rank */
    int64_t disk;                /* NVMe rows: the swap files' bytes per rank (counted in neither
                                    memory, not checked against the disk); else 0 */
    int fits;                    /* 1: device <= memory.device and world × host <= memory.host (when
                                    known); 0: not; -1: the device's memory is not known */
    /* The largest model of the config's family (ct_fit_family): the repeat count whose plan fits,
     * from the plans at the configured count n and n + 1 (each block adds the same bytes); 0: not
     * even one block fits; -1: not known (no family, or the device's memory not known). */
    long max_blocks;
    int64_t max_params;          /* its trainable elements */
    const char *bound;           /* what max_blocks + 1 would exceed: "device" or "host" memory, or
                                    "repeat": CT_GRAPH_REPEAT_MAX, the most a repeat takes */
    bool estimate;               /* the row's plans at n, n + 1 and n + 2 blocks did not grow by the
                                    same bytes (an NVMe swap's buffers growing with a small model up
                                    to sub_group_size): max_blocks extrapolates the first step */
} ct_fit_zero_row;

/* The model family the largest-model column scales: the model's one top-level "repeat" layer, its
 * "times" changed, width and everything else kept. */
typedef struct ct_fit_family {
    int layer;                   /* index in model.layers; -1: none (no repeat, or several) */
    long blocks;                 /* its configured times */
    bool affine;                 /* the plans at n, n + 1 and n + 2 blocks grew by the same bytes in
                                    every row (the extrapolation is then exact; else see the rows'
                                    estimate) */
} ct_fit_family;

/* The rows (in the order above) and the family; rows' max_blocks need memory.device. */
int ct_fit_zero_rows(const ct_config *cfg, ct_fit_memory memory, ct_fit_zero_row rows[CT_FIT_ZERO_ROWS],
                     ct_fit_family *family, ct_err *err);

/* The cheapest row that fits, -1 when none does or the device's memory is not known: the least
 * moved to host memory first (none, then the optimizer, then the parameters too), then the lowest
 * stage (the least communication). */
int ct_fit_zero_cheapest(const ct_fit_zero_row rows[CT_FIT_ZERO_ROWS]);

/* --dry-run's table of the rows, one line per row into line(ctx, text), with the config's own row
 * and the cheapest that fits marked, and lines saying how the largest model was found. */
int ct_fit_zero_table(const ct_config *cfg, ct_fit_memory memory, void (*line)(void *ctx, const char *text),
                      void *ctx, ct_err *err);

#endif

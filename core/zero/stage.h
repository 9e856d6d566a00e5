/* stage.h: the stage rule: which ZeRO stage's machinery a run runs, and whether it offloads the
 * optimizer (to host memory or to NVMe) and the parameters. Pure functions of the config and of
 * whether the backend is a device; the memory plan (core/train/plan.h), --dry-run and the trainer
 * all decide by them, so the plan and the run cannot disagree. */
#ifndef CT_ZERO_STAGE_H
#define CT_ZERO_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/config/config.h"

/* ZeRO-Offload of the optimizer: zero_optimization.offload_optimizer.device "cpu" or "nvme" (stage
 * 1-3) on a device (a GPU, the capped device): the fp32 master, the gradients and the optimizer
 * state in host memory (or, with "nvme", the master and state in swap files), the optimizer step
 * on the CPU. On the CPU backend that memory is host memory already and "cpu" moves nothing: false;
 * "nvme" still takes the master and state out of memory there: true, the CPU's memory standing in
 * for the device's (the copies are memcpy). */
bool ct_zero_offload(const ct_config *cfg, bool device);

/* NVMe offload of the optimizer (ZeRO-Infinity): offload_optimizer.device "nvme" at stages 1-3, on
 * any backend: the fp32 master and optimizer state of the rank's part in swap files under
 * nvme_path (core/train/nvme.h), the rest as ZeRO-Offload's. */
bool ct_zero_nvme(const ct_config *cfg, bool device);

/* ZeRO-Offload of the parameters too (ZeRO-Infinity's CPU case): offload_param.device "cpu" at
 * stage 3 with optimizer offload on a device: the compute-dtype parameters of the rank's part live
 * in pinned host memory, uploaded into the gather buffer layer by layer. On the CPU backend they
 * are in host memory already: false. */
bool ct_zero_offload_params(const ct_config *cfg, bool device);

/* The elements of the host master each upload of the compute copy carries under ZeRO-Offload
 * (the optimizer steps one such chunk while the last one goes up): sub_group_size, at most
 * CT_OFFLOAD_MAX_CHUNK. */
#define CT_OFFLOAD_MAX_CHUNK ((int64_t)1 << 22)
int64_t ct_zero_offload_chunk(const ct_config *cfg);

/* The ZeRO stage whose machinery this run runs: zero_optimization.stage 1, 2 or 3 with several
 * ranks, 0 otherwise (one process holds everything whatever the stage asks for), except under
 * ZeRO-Offload (device: see ct_zero_offload), which takes stage 2's gradient path (each
 * layer's gradients brought down to host memory as backward produces them) at stage 1 and, with
 * one process, at stages 1-3; with parameter offload too (ct_zero_offload_params), stage 3
 * whatever the number of processes. */
int ct_zero_stage(const ct_config *cfg, bool device);
/* The same without any offload (a run that only evaluates): the stage with several ranks, else 0. */
int ct_zero_partition_stage(const ct_config *cfg);

/* What the parameter store of a ZeRO stage holds of its rank's part only (CT_STORE_PART_*, core/
 * params/store.h): stage 2 the gradients, stage 3 the parameters too. */
unsigned ct_zero_store_parts(int stage);

#endif

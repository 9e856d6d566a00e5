/* offload.h: ZeRO-Offload's optimizer step (zero_optimization.offload_optimizer.device "cpu" on a
 * device: a GPU, or the capped device), and ZeRO-Infinity's with the state in NVMe swap files
 * (device "nvme", core/train/nvme.h).
 *
 * The parameter store keeps the fp32 master and this rank's gradients in host memory, and the
 * optimizer its state beside them (core/params/store.h, core/optim/optim.h: ct_optim_create_in);
 * the partition's hooks brought every layer's gradients down and added them there as backward
 * produced them (core/zero/partition.h). The step then runs on the CPU backend beside the device
 * (the SIMD Adam of core/cpu/cpu_adam.c), a chunk of the master at a time (the store's
 * stage_elems: sub_group_size, at most CT_OFFLOAD_MAX_CHUNK): each chunk is stepped, its compute
 * copy written into a pinned staging buffer by the same pass, and its upload queued, so the copy
 * of one chunk overlaps the step of the next; the step returns once every upload has landed (the
 * device's copy is complete for the next forward, and for a gather of it that host code makes).
 * The same update as ct_optim_apply, bit for bit: every update is element-wise. */
#ifndef CT_ZERO_OFFLOAD_H
#define CT_ZERO_OFFLOAD_H

#include "core/optim/optim.h"
#include "core/params/store.h"
#include "core/zero/swap.h"

/* ct_optim_apply over the store's host master (p->host_state), chunk by chunk. An overflowing
 * fp16 step is skipped before it gets here (nothing moves). */
void ct_offload_apply(ct_optim *o, ct_param_store *p, float grad_scale, double grad_norm, ct_optim_stats *stats);

/* The same with the master and the optimizer's state in swap files (a swapped store, an optimizer
 * with external state): one UPDATE pass of the swap, whose chunks are read ahead and written behind
 * while the CPU steps the current one (in pieces of the store's stage_elems, each piece's compute
 * copy uploaded while the next is stepped). The first I/O error (CT_ERR_RUNTIME naming the file);
 * the update is counted (Adam's step, the schedule) only when every write landed. */
int ct_offload_apply_swap(ct_optim *o, ct_param_store *p, ct_swap *s, float grad_scale, double grad_norm,
                          ct_optim_stats *stats, ct_err *err);

#endif

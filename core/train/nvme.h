/* nvme.h: ZeRO-Infinity's NVMe offload of the optimizer (zero_optimization.offload_optimizer.device
 * "nvme"): the trainer's side of the swap of core/zero/swap.h.
 *
 * The run is ZeRO-Offload's (core/zero/offload.h: gradients in host memory, the CPU Adam, the
 * compute copy staged up chunk by chunk), except that the fp32 master and the optimizer state of
 * the rank's part [lo, hi) are never whole in host memory: they live in files under nvme_path, one
 * per array (master, then the optimizer's slots: exp_avg and exp_avg_sq for Adam), and host memory
 * holds only the swap's buffers: buffer_count buffers of one chunk of every array, a chunk being
 * min(sub_group_size, CT_OFFLOAD_MAX_CHUNK, hi - lo) elements (DeepSpeed's optimizer swap unit
 * and buffer count). A step is one pass of the swap (read ahead, write behind); a fresh run fills
 * the master's chunks from the initialiser (the moments start as the files' zeros); checkpoints
 * reach the arrays by range (ct_swap_read and ct_swap_write behind ckpt's ct_ckpt_mem), so a save
 * streams them out and a resume (from any world size) or model.init_from streams them in, through
 * the same bounded buffers. The files are scratch: never read after a restart. */
#ifndef CT_TRAIN_NVME_H
#define CT_TRAIN_NVME_H

#include "core/backend/backend.h"
#include "core/ckpt/ckpt.h"
#include "core/config/config.h"
#include "core/optim/optim.h"
#include "core/params/store.h"
#include "core/train/plan.h"
#include "core/zero/swap.h"

#define CT_NVME_MAX_ARRAYS (1 + CT_OPTIM_MAX_SLOTS)
#define CT_NVME_PATH_KEY "zero_optimization.offload_optimizer.nvme_path"

/* The swap of a part of n elements for rank `rank` (names: the master's and the optimizer's slots,
 * kept by the caller). Pure: the plan and --dry-run size it without opening anything. */
void ct_nvme_swap_opts(const ct_config *cfg, int64_t n, int rank, const char **names, ct_swap_opts *out);
/* What the swap of such a part takes: host bytes (its buffers and one block to align them, as the
 * trainer allocates them) and bytes on disk (its files). */
size_t ct_nvme_host_bytes(const ct_config *cfg, int64_t n);
int64_t ct_nvme_disk_bytes(const ct_config *cfg, int64_t n);

/* The start block's (and --dry-run's) line for a plan with NVMe offload: the files' bytes and
 * where, the arrays, the buffers and their chunk. */
void ct_nvme_describe(const ct_config *cfg, const ct_run_plan *p, char *out, size_t n);

/* The host memory a run plans, against the host's limit: train.host_memory_limit_gb, and on the
 * CPU backend (p->device false: its memory is host memory, the plan's device and host sides both)
 * train.memory_limit_gb too, the smaller. Over it: CT_ERR_RUNTIME before anything is allocated,
 * naming the limit and the host plan, and what would fit: NVMe offload (the master and the
 * optimizer state in files, g planned again with it), or with NVMe offload already, a smaller
 * sub_group_size (the swap's buffers). CT_OK without a limit or within it, and on the CPU backend
 * without offload when NVMe offload would not fit either (the memory limit's own check then
 * suggests a smaller micro-batch or checkpointing). */
int ct_nvme_check_host_limit(const ct_config *cfg, const ct_graph *g, const ct_run_plan *p, ct_err *err);

typedef struct ct_nvme ct_nvme;

/* Check nvme_path (ct_swap_check_dir: CT_ERR_CONFIG naming the key and the path for a missing,
 * not-a-directory or read-only path; CT_ERR_RUNTIME when its file system is too small) and open
 * the swap of [lo, hi) for this rank: its buffers pinned by `be` (offload_optimizer.pin_memory) or
 * `host`'s own memory, counted as optimizer state. Its warnings (a stale directory removed,
 * O_DIRECT refused) go to w. */
int ct_nvme_open(const ct_config *cfg, ct_backend *be, ct_backend *host, int64_t lo, int64_t hi, int rank,
                 ct_nvme **out, ct_warnings *w, ct_err *err);
/* Remove the files and free the buffers; the first error (a file that cannot be removed). NULL: CT_OK. */
int ct_nvme_close(ct_nvme *nv, ct_err *err);
ct_swap *ct_nvme_swap(ct_nvme *nv);

/* A fresh run's master: every chunk drawn by the store's initialiser (ct_param_store_init_master). */
int ct_nvme_init_master(ct_nvme *nv, const ct_param_store *p, uint64_t seed, ct_err *err);
/* The compute copy from the master in the files (a READ pass: ct_param_store_refresh_range per
 * chunk), every upload landed when it returns. */
int ct_nvme_refresh(ct_nvme *nv, ct_param_store *p, ct_err *err);
/* ck's master and slots in the files: NULL pointers reached by element through the swap. */
void ct_nvme_ckpt_tensors(ct_nvme *nv, ct_ckpt_tensors *ck);

#endif

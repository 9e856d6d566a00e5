/* cpu.h: the CPU backend's entry points (core/cpu/): the backend, its memory cap and start-up
 * figures, and the capped device. Its ops are the op table of core/backend/backend.h; a backend by
 * device name ("cpu", "auto") comes from core/device/device.h. */
#ifndef CT_CPU_H
#define CT_CPU_H

#include <stdbool.h>
#include <stddef.h>

#include "core/backend/backend.h"

/* The CPU backend, always compiled in. threads: pool workers and OpenBLAS threads (0 = online
 * cores). Returns NULL when threads cannot be started or OpenBLAS cannot be loaded
 * (ct_cpu_blas_load first to say why), with errno saying why. */
ct_backend *ct_cpu_backend_create(int threads);
/* Load OpenBLAS (dlopen, once per process; the CPU backend's GEMMs need it) and keep it at one
 * thread. CT_ERR_RUNTIME saying what is missing. ct_cpu_backend_create calls it too. */
int ct_cpu_blas_load(ct_err *err);
/* The thread count ct_cpu_backend_create starts for a train.threads setting (0: online cores). */
int ct_cpu_threads_for(int threads);
/* Address space the CPU backend with `threads` workers maps besides its allocations: OpenBLAS
 * gives every thread that calls a GEMM (the pool's workers and the calling thread) a buffer of
 * its own on first use, and retries forever when that mmap fails, so a run checks it against
 * ulimit -v at start (core/train/trainer.c). */
size_t ct_cpu_backend_reserved_bytes(int threads);
/* Cap the CPU backend's memory (train.memory_limit_gb): an alloc that would take its bytes in use
 * past `bytes` returns NULL, as a device out of memory does. 0: no cap. */
void ct_cpu_backend_set_limit(ct_backend *be, size_t bytes);
/* A line for the start of a run that computes in dt on the CPU backend: whether its bf16 matrix
 * products run natively (AVX512-BF16/AMX through oneDNN) or in fp32 and why, and that fp16 always
 * computes in fp32 (so that turning on mixed precision on a CPU says what it buys); NULL for fp32. */
const char *ct_cpu_backend_precision_note(ct_dtype dt);

/* The capped device (core/cpu/cpu_capped.c): the CPU backend behaving as a separate device of
 * `cap` bytes, the test bed of what a GPU run moves between host and device (ZeRO-Offload).
 *  - mem.alloc is device memory: its own pool, accounted by category, and NULL past `cap` as
 *    cudaMalloc fails (peak_bytes and mem_stats report it); alloc_host_pinned is host memory,
 *    counted in mem_stats' host figures, never against the cap;
 *  - upload and download are real copies made by one copy thread in ticket order, throttled to
 *    `gbps` GB/s when > 0, so a copy waited for too late or read too early reads wrong bytes;
 *  - every op (and copy_h2d/d2h/d2d, memset0, free) first waits for the copies queued before it,
 *    which keeps backend.h's contract for ops that run on the calling thread;
 *  - name "capped"; memory_bytes = cap. Its memory stays host-addressable: MPI reaches it.
 * NULL as ct_cpu_backend_create fails (errno). */
ct_backend *ct_capped_backend_create(int threads, size_t cap, double gbps);
/* CTRAIN_CAPPED_DEVICE's value, "SIZE[,gbps=G]": SIZE in bytes or with a unit (64MiB, 1.5GiB,
 * 512KiB, 2GB), G > 0 in GB/s (absent: copies at memory speed). CT_ERR_CONFIG naming the
 * variable and the accepted forms. */
int ct_capped_parse(const char *text, size_t *cap, double *gbps, ct_err *err);

#endif

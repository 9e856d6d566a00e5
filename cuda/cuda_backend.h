/* cuda_backend.h: the CUDA backend's entry points (C linkage; included by C and CUDA code).
 *
 * Compiled only when nvcc exists (the build defines CT_HAVE_CUDA). ctrain itself never links
 * them: core/device/device.c finds ct_cuda_backend_abi, ct_cuda_probe and ct_cuda_backend_create
 * in the library with dlsym (ct_cuda_lib, core/device/device.h). */
#ifndef CT_CUDA_BACKEND_H
#define CT_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CT_BACKEND_ABI and sizeof(ct_backend) as this library was compiled: the loader (core/device/
 * device.c) refuses a library whose op table does not match the executable's. */
int ct_cuda_backend_abi(size_t *table_bytes);

/* True when the CUDA runtime finds a driver and at least one device. Never aborts: any error
 * from cudaGetDeviceCount (no driver, driver too old, no device) means false. */
bool ct_cuda_probe(void);

/* The CUDA backend on device `device`. NULL with err filled (CT_ERR_RUNTIME) when the device is
 * not usable: no driver, no such device, or a stream/cuBLASLt handle cannot be created. */
ct_backend *ct_cuda_backend_create(int device, ct_err *err);

/* CT_OK when this library has code for a device of compute capability major.minor (8.0 or newer,
 * and covered by the Makefile's CUDA_ARCH); else CT_ERR_RUNTIME naming the device, its capability
 * and what the library holds. Needs no GPU (the backend calls it with the device's properties). */
int ct_cuda_check_capability(int device, const char *name, int major, int minor, ct_err *err);

/* TF32 tensor cores for fp32 GEMMs: off by default (bit-comparable with the CPU within 1e-5);
 * the config turns it on explicitly. `be` must be a CUDA backend. */
void ct_cuda_set_tf32(ct_backend *be, bool on);

/* Device memory accounting of the caching allocator, in bytes. live: handed out now; reserved:
 * obtained from cudaMalloc (live + cached free blocks); n_cuda_malloc: cudaMalloc calls so far
 * (a steady-state training step must not raise it). */
typedef struct ct_cuda_mem_stats {
    size_t live_bytes, peak_live_bytes;
    size_t reserved_bytes, peak_reserved_bytes;
    uint64_t n_cuda_malloc;
} ct_cuda_mem_stats;
void ct_cuda_get_mem_stats(ct_backend *be, ct_cuda_mem_stats *out);

#ifdef __cplusplus
}
#endif

#endif

/* device.h: a backend by device name, the factory above the backends (docs/DESIGN.md, "Modules").
 *
 * "cpu" is the CPU backend (core/cpu/cpu.h), or the capped device when CTRAIN_CAPPED_DEVICE is
 * set; "cuda" and "cuda:N" load the CUDA backend from libctrain_cuda.so with dlopen, only when
 * the NVIDIA driver is there (CPU runs never map cuBLASLt), after checking that the library was
 * built for this op table; "auto" is the first GPU when one is usable, else the CPU. */
#ifndef CT_DEVICE_H
#define CT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/backend/backend.h"

/* Create a backend by name: "auto", "cpu", "cuda" or "cuda:N". threads: CPU workers (0 = all
 * cores). With the environment variable CTRAIN_CAPPED_DEVICE set, "cpu" (and "auto" without a
 * GPU) is the capped device instead (ct_capped_backend_create); a value it cannot read is
 * CT_ERR_CONFIG. Free it with ct_backend_destroy. */
int ct_backend_create(const char *device, int threads, ct_backend **out, ct_err *err);
/* As ct_backend_create, and for device "auto": when the NVIDIA driver is there but the CUDA
 * backend library is missing or fails to load, the run goes on on the CPU and *notice says why in
 * one line, with the loader's own reason (dlerror) whole; "" otherwise. */
int ct_backend_create_noting(const char *device, int threads, ct_backend **out, char *notice,
                             size_t notice_n, ct_err *err);
/* True when a CUDA device is usable (driver present, the library loads, device count > 0). */
bool ct_cuda_available(void);

/* Whether CTRAIN_CAPPED_DEVICE is set (*on), and its size and bandwidth; ct_capped_parse's error
 * when it cannot be read. What "cpu" means for ct_backend_create, and for a plan made without a
 * backend (--dry-run, the auto micro-batch). */
int ct_capped_env(bool *on, size_t *cap, double *gbps, ct_err *err);

#ifdef CT_HAVE_CUDA
/* Open a CUDA backend library (libctrain_cuda.so) and check that it was built for this op table
 * (CT_BACKEND_ABI and sizeof(ct_backend)); a mismatch is CT_ERR_RUNTIME naming both versions.
 * probe and create are the library's ct_cuda_probe and ct_cuda_backend_create
 * (cuda/cuda_backend.h). */
typedef struct ct_cuda_lib {
    bool (*probe)(void);
    ct_backend *(*create)(int device, ct_err *err);
} ct_cuda_lib;
int ct_cuda_lib_open(const char *path, ct_cuda_lib *out, ct_err *err);
#endif

#endif

/* cuda_pair.h: the two backends a GPU test compares, the CPU backend (the reference) and a CUDA
 * backend. Shared by test_cuda_ops, test_cuda_queue and test_ops' CUDA mode. */
#ifndef CT_TEST_CUDA_PAIR_H
#define CT_TEST_CUDA_PAIR_H

#include <stdio.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/device/device.h"

/* Create both on `device` ("cuda", "cuda:N", or "capped": the CPU's capped device of
 * CTRAIN_CAPPED_DEVICE, 1 GiB when unset). Returns 0; or 77 after printing "no CUDA device:
 * skipped" when no GPU is usable (the test runner reports exit 77 as skipped); or 1 after saying
 * why a backend could not be created. */
static inline int cuda_pair_open(const char *device, ct_backend **cpu, ct_backend **gpu) {
    if (strcmp(device, "capped") == 0) {
        ct_err err = {0};
        bool on;
        size_t cap;
        double gbps;
        if (ct_capped_env(&on, &cap, &gbps, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        *cpu = ct_cpu_backend_create(0);
        *gpu = ct_capped_backend_create(0, on ? cap : (size_t)1 << 30, gbps);
        return *cpu && *gpu ? 0 : 1;
    }
    if (!ct_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    ct_err err = {0};
    *cpu = ct_cpu_backend_create(0);
    if (!*cpu || ct_backend_create(device, 0, gpu, &err) != CT_OK) {
        fprintf(stderr, "cannot create the backends: %s\n", err.msg[0] ? err.msg : "no CPU backend");
        return 1;
    }
    return 0;
}

#endif

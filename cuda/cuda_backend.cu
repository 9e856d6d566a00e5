/* cuda_backend.cu: device probe, backend creation and teardown, checked-call reporting. */
#include "cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_backend.h"
}

/* cuBLASLt workspace: room for the split-K kernels the heuristic picks for small and mid-size
 * GEMMs. NVIDIA suggests 32 MiB on Hopper for the largest GEMMs; the small models this targets
 * do not need it, and it counts against peak device memory. */
#define CT_CUDA_LT_WORKSPACE (4u << 20)

void ct_cuda_fail_at(const char *what, const char *detail, const char *call, const char *file,
                     int line) {
    ct_fatal("%s failure: %s\n  in %s at %s:%d", what, detail, call, file, line);
}

void ct_cuda_check_at(cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return;
    char detail[256];
    snprintf(detail, sizeof detail, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    ct_cuda_fail_at("CUDA", detail, call, file, line);
}

void ct_cublas_check_at(cublasStatus_t s, const char *call, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    char detail[256];
    snprintf(detail, sizeof detail, "%s (status %d)", cublasLtGetStatusString(s), (int)s);
    ct_cuda_fail_at("cuBLAS", detail, call, file, line);
}

extern "C" int ct_cuda_backend_abi(size_t *table_bytes) {
    *table_bytes = sizeof(ct_backend);
    return CT_BACKEND_ABI;
}

extern "C" bool ct_cuda_probe(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

extern "C" void ct_cuda_set_tf32(ct_backend *be, bool on) { ct_cuda_of(be)->tf32 = on; }

/* strict: a normal destroy, where a failing call is an internal error worth reporting; not
 * strict: unwinding a failed creation, where the device may be unusable and we only release. */
#define CT_TEARDOWN(call)                                                                        \
    do {                                                                                         \
        if (strict) CT_CUDA_CHECK(call);                                                         \
        else (void)(call);                                                                       \
    } while (0)

static void teardown(ct_cuda *cu, bool strict) {
    CT_TEARDOWN(cudaSetDevice(cu->device));
    CT_TEARDOWN(cudaDeviceSynchronize());
    ct_cuda_gemm_plans_destroy(cu);
    if (cu->lt) {
        if (strict) CT_CUBLAS_CHECK(cublasLtDestroy(cu->lt));
        else (void)cublasLtDestroy(cu->lt);
    }
    if (cu->lt_workspace) CT_TEARDOWN(cudaFree(cu->lt_workspace));
    if (cu->host_scratch) CT_TEARDOWN(cudaFreeHost(cu->host_scratch));
    ct_cuda_alloc_release_all(&cu->mem);
    ct_cuda_stages_release(cu, strict);
    ct_cuda_queue_events_release(cu, strict);
    if (cu->ev_compute) CT_TEARDOWN(cudaEventDestroy(cu->ev_compute));
    if (cu->ev_copy) CT_TEARDOWN(cudaEventDestroy(cu->ev_copy));
    if (cu->compute) CT_TEARDOWN(cudaStreamDestroy(cu->compute));
    if (cu->copy) CT_TEARDOWN(cudaStreamDestroy(cu->copy));
    if (!strict) (void)cudaGetLastError();
}

static void cu_destroy(ct_backend *be) {
    if (!be) return;
    ct_cuda *cu = ct_cuda_of(be);
    if (cu) {
        teardown(cu, true);
        free(cu);
    }
    free(be);
}

/* Runs one setup call; on failure fills err and returns false (creation must not exit). */
static bool setup_ok(cudaError_t e, const char *what, ct_err *err) {
    if (e == cudaSuccess) return true;
    ct_errf(err, CT_ERR_RUNTIME, "CUDA device setup failed: %s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return false;
}

/* "NVIDIA H100 80GB HBM3, sm_90, 79 GiB" (the name already starts with NVIDIA on most boards). */
static void describe(ct_backend *be, const cudaDeviceProp *prop) {
    const char *vendor = strncmp(prop->name, "NVIDIA", 6) == 0 ? "" : "NVIDIA ";
    snprintf(be->device_desc, sizeof be->device_desc, "%s%.80s, sm_%d%d, %.0f GiB", vendor,
             prop->name, prop->major, prop->minor,
             (double)prop->totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    be->memory_bytes = prop->totalGlobalMem;
}

static bool init_state(ct_cuda *cu, int device, ct_err *err) {
    cu->device = device;
    ct_cuda_alloc_init(&cu->mem);
    if (!setup_ok(cudaSetDevice(device), "cudaSetDevice", err)) return false;
    if (!setup_ok(cudaDeviceGetAttribute(&cu->sm_count, cudaDevAttrMultiProcessorCount, device),
                  "cudaDeviceGetAttribute", err))
        return false;
    if (!setup_ok(cudaStreamCreateWithFlags(&cu->compute, cudaStreamNonBlocking),
                  "cudaStreamCreate (compute)", err) ||
        !setup_ok(cudaStreamCreateWithFlags(&cu->copy, cudaStreamNonBlocking),
                  "cudaStreamCreate (copy)", err) ||
        !setup_ok(cudaEventCreateWithFlags(&cu->ev_compute, cudaEventDisableTiming),
                  "cudaEventCreate", err) ||
        !setup_ok(cudaEventCreateWithFlags(&cu->ev_copy, cudaEventDisableTiming),
                  "cudaEventCreate", err) ||
        !setup_ok(cudaHostAlloc(&cu->host_scratch, CT_CUDA_HOST_SCRATCH, cudaHostAllocDefault),
                  "cudaHostAlloc (result buffer)", err) ||
        !setup_ok(cudaMalloc(&cu->lt_workspace, CT_CUDA_LT_WORKSPACE),
                  "cudaMalloc (cuBLASLt workspace)", err))
        return false;
    if (!ct_cuda_stages_init(cu) || !ct_cuda_queue_events_init(cu)) {
        ct_errf(err, CT_ERR_RUNTIME,
                "CUDA device setup failed: cudaEventCreate (copy and timer rings)");
        return false;
    }
    cu->lt_workspace_bytes = CT_CUDA_LT_WORKSPACE;
    cublasStatus_t s = cublasLtCreate(&cu->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cu->lt = NULL;
        ct_errf(err, CT_ERR_RUNTIME, "cuBLASLt initialisation failed: %s",
                cublasLtGetStatusString(s));
        return false;
    }
    return true;
}

/* What the library holds (the Makefile's CUDA_ARCH): machine code sm_XY, PTX compute_XY. */
#ifndef CT_CUDA_BUILT_FOR
#define CT_CUDA_BUILT_FOR sm_80/sm_90/compute_90
#endif
#define CT_STR_(x) #x
#define CT_STR(x) CT_STR_(x)
static const char built_for[] = CT_STR(CT_CUDA_BUILT_FOR);

/* Whether one of `codes` ("sm_80/sm_90/compute_90") runs on compute capability cc (10 * major +
 * minor): machine code sm_XY on the same major with a minor of at least Y (sm_XYa: on XY only);
 * PTX compute_XY, which the driver compiles, on any cc of at least XY. */
static bool built_code_runs_on(const char *codes, int cc) {
    for (const char *p = codes; *p;) {
        bool ptx = strncmp(p, "compute_", 8) == 0, sass = strncmp(p, "sm_", 3) == 0;
        const char *num = p + (ptx ? 8 : sass ? 3 : 0);
        char *end = NULL;
        long v = (ptx || sass) ? strtol(num, &end, 10) : -1;
        if (v > 0) {
            bool exact = end && *end == 'a';
            if (ptx && cc >= v) return true;
            if (sass && (exact ? cc == v : cc / 10 == v / 10 && cc >= v)) return true;
        }
        const char *slash = strchr(p, '/');
        if (!slash) break;
        p = slash + 1;
    }
    return false;
}

/* sm_80 is the floor whatever CUDA_ARCH says: the kernels compute in bf16 and the config takes
 * bf16 support for granted on every GPU (cmd/ctrain.c). Older GPUs (V100, T4) would pass a
 * device query and then fail at the first launch with "no kernel image". */
extern "C" int ct_cuda_check_capability(int device, const char *name, int major, int minor, ct_err *err) {
    int cc = 10 * major + minor;
    if (cc >= 80 && built_code_runs_on(built_for, cc)) return CT_OK;
    if (cc < 80)
        return ct_errf(err, CT_ERR_RUNTIME,
                       "CUDA device %d (%s) has compute capability %d.%d; ctrain needs 8.0 or newer (A100, "
                       "A10, L4, RTX 30xx, H100 and later): its CUDA library holds code for %s (Makefile "
                       "CUDA_ARCH).\n  Use --device cpu.", device, name, major, minor, built_for);
    return ct_errf(err, CT_ERR_RUNTIME,
                   "CUDA device %d (%s) has compute capability %d.%d; this ctrain's CUDA library holds "
                   "code for %s (Makefile CUDA_ARCH), none of which runs on it.\n  Rebuild with "
                   "make CUDA_ARCH='-gencode arch=compute_%d,code=sm_%d', or use --device cpu.",
                   device, name, major, minor, built_for, cc, cc);
}

extern "C" ct_backend *ct_cuda_backend_create(int device, ct_err *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        int rt = 0;
        (void)cudaRuntimeGetVersion(&rt);
        const char *why = cudaGetErrorString(e);
        if (e == cudaErrorInsufficientDriver)
            why = "no NVIDIA driver found, or it is older than the CUDA runtime ctrain was built with";
        else if (e == cudaErrorNoDevice)
            why = "the NVIDIA driver sees no GPU";
        ct_errf(err, CT_ERR_RUNTIME,
                "no usable CUDA device: %s (CUDA runtime %d.%d, %s)\n"
                "  Use --device cpu, or \"train.device\": \"auto\" to fall back to the CPU.",
                why, rt / 1000, (rt % 1000) / 10, cudaGetErrorName(e));
        return NULL;
    }
    if (device < 0 || device >= count) {
        if (count == 0)
            ct_errf(err, CT_ERR_RUNTIME,
                    "no CUDA device found\n"
                    "  Use --device cpu, or \"train.device\": \"auto\" to fall back to the CPU.");
        else
            ct_errf(err, CT_ERR_RUNTIME, "CUDA device %d does not exist (this machine has %d: 0..%d)",
                    device, count, count - 1);
        return NULL;
    }
    cudaDeviceProp prop;
    if (!setup_ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", err))
        return NULL;
    if (ct_cuda_check_capability(device, prop.name, prop.major, prop.minor, err)) return NULL;

    ct_backend *be = (ct_backend *)ct_xcalloc(1, sizeof *be);
    ct_cuda *cu = (ct_cuda *)ct_xcalloc(1, sizeof *cu);
    be->impl = cu;
    be->name = "cuda";
    be->threads = 1;
    if (!init_state(cu, device, err)) {
        teardown(cu, false);
        free(cu);
        free(be);
        return NULL;
    }
    describe(be, &prop);
    /* NVML's name for this device (core/report/nvml.h); without it, no GPU utilisation figures */
    if (cudaDeviceGetPCIBusId(be->pci_bus_id, (int)sizeof be->pci_bus_id, device) != cudaSuccess) {
        be->pci_bus_id[0] = '\0';
        (void)cudaGetLastError();
    }
    be->destroy = cu_destroy;
    ct_cuda_mem_install(be);
    ct_cuda_gemm_install(be);
    ct_cuda_eltwise_install(be);
    ct_cuda_conv_install(be);
    ct_cuda_norm_install(be);
    ct_cuda_attn_install(be);
    ct_cuda_loss_install(be);
    ct_cuda_optim_install(be);
    ct_cuda_graph_install(be);
    ct_cuda_rmsnorm_install(be);
    ct_cuda_swiglu_install(be);
    ct_cuda_rope_install(be);
    return be;
}

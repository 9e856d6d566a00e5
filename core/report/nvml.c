/* nvml.c: NVML loaded with dlopen (nvml.h). The few types used are declared here as nvml.h of
 * the driver defines them (the header is not needed to build ctrain). */
#include "core/report/nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/util/common.h"

typedef int nvml_return;         /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef void *nvml_device;       /* nvmlDevice_t */
typedef struct nvml_utilization {
    unsigned int gpu, memory;    /* percent */
} nvml_utilization;
typedef struct nvml_memory {
    unsigned long long total, free, used;   /* bytes */
} nvml_memory;

struct ct_nvml {
    void *lib;
    nvml_device dev;
    nvml_return (*shutdown)(void);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
    nvml_return (*memory)(nvml_device, nvml_memory *);
};

/* NVML's words for an error code, when its library says them. */
static const char *error_text(void *lib, nvml_return r) {
    const char *(*text)(nvml_return) = (const char *(*)(nvml_return))dlsym(lib, "nvmlErrorString");
    const char *s = text ? text(r) : NULL;
    return s ? s : "error";
}

ct_nvml *ct_nvml_open(const char *pci_bus_id, char *why, size_t why_n) {
    const char *path = getenv("CTRAIN_NVML_LIBRARY");
    if (!path || !path[0]) path = "libnvidia-ml.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, why_n, "%s", e ? e : path);
        return NULL;
    }
    nvml_return (*init)(void) = (nvml_return(*)(void))dlsym(lib, "nvmlInit_v2");
    nvml_return (*by_bus)(const char *, nvml_device *) =
        (nvml_return(*)(const char *, nvml_device *))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    ct_nvml n = {.lib = lib,
                 .shutdown = (nvml_return(*)(void))dlsym(lib, "nvmlShutdown"),
                 .utilization = (nvml_return(*)(nvml_device, nvml_utilization *))dlsym(
                     lib, "nvmlDeviceGetUtilizationRates"),
                 .memory = (nvml_return(*)(nvml_device, nvml_memory *))dlsym(lib, "nvmlDeviceGetMemoryInfo")};
    if (!init || !by_bus || !n.shutdown || !n.utilization || !n.memory) {
        snprintf(why, why_n, "%s: not the NVML this ctrain knows (a function is missing)", path);
        dlclose(lib);
        return NULL;
    }
    nvml_return r = init();
    if (r != 0) {
        snprintf(why, why_n, "nvmlInit: %s", error_text(lib, r));
        dlclose(lib);
        return NULL;
    }
    r = by_bus(pci_bus_id, &n.dev);
    if (r != 0) {
        snprintf(why, why_n, "NVML has no device at PCI bus id %s: %s", pci_bus_id, error_text(lib, r));
        n.shutdown();
        dlclose(lib);
        return NULL;
    }
    ct_nvml *out = ct_xcalloc(1, sizeof *out);
    *out = n;
    return out;
}

bool ct_nvml_sample(ct_nvml *n, ct_gpu_sample *out) {
    nvml_utilization u;
    nvml_memory m;
    if (!n || n->utilization(n->dev, &u) != 0 || n->memory(n->dev, &m) != 0) return false;
    *out = (ct_gpu_sample){.util = u.gpu, .mem_used = (double)m.used, .mem_total = (double)m.total};
    return true;
}

void ct_nvml_close(ct_nvml *n) {
    if (!n) return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

/* nvml.h: the GPU's utilisation and memory as NVIDIA's management library reports them, for the
 * step lines, metrics.jsonl and the summary (issue 16).
 *
 * NVML (libnvidia-ml.so.1) comes with the driver, not with the CUDA toolkit, so it is loaded at
 * run time like the CUDA library: a machine without it trains the same and reports no GPU
 * figures. The device is found by its PCI bus id (the CUDA backend's be->pci_bus_id), since CUDA's
 * device numbering (CUDA_VISIBLE_DEVICES, fastest first) and NVML's (PCI order, all devices) differ.
 *
 * The figures are the whole device's: utilisation is the share of NVML's last sample period
 * (1/6 s to 1 s, by product) in which a kernel ran, memory the bytes in use by every process. They
 * complement ctrain's own peak_bytes_by_category (what ctrain allocated), not replace it. */
#ifndef CT_NVML_H
#define CT_NVML_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ct_nvml ct_nvml;

typedef struct ct_gpu_sample {
    double util;                 /* percent of the last sample period with a kernel running */
    double mem_used, mem_total;  /* bytes */
} ct_gpu_sample;

/* Load NVML and find the device at pci_bus_id ("0000:3B:00.0"). NULL when it cannot, with the
 * reason in why ("libnvidia-ml.so.1: cannot open shared object file", "nvmlInit: Driver Not
 * Loaded"). The library is CTRAIN_NVML_LIBRARY when that is set (an unusual install), else
 * libnvidia-ml.so.1. */
ct_nvml *ct_nvml_open(const char *pci_bus_id, char *why, size_t why_n);
/* The device now; false (out untouched) when NVML answers with an error. */
bool ct_nvml_sample(ct_nvml *n, ct_gpu_sample *out);
void ct_nvml_close(ct_nvml *n);

#endif

/* plan.h: the memory plan of a run, before anything is allocated.
 *
 * A pure function of the config, the built graph (core/graph/graph.h: shapes and the activation
 * plan) and the backend kind: the bytes each memory category will hold at its peak (backend.h
 * ct_mem_cat), as the allocations of the parameter store, the optimizer, the graph's arena and
 * the loader will make them. --dry-run prints it without creating a backend or opening data; a
 * run prints it at start, and the summary's peak_bytes_by_category can be held against it. */
#ifndef CT_TRAIN_PLAN_H
#define CT_TRAIN_PLAN_H

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/graph/graph.h"

typedef struct ct_run_plan {
    size_t bytes[CT_MEM_CAT_COUNT];  /* per category; activations = the graph's whole arena
                                        (ct_act_plan.total, its layer workspace included: one
                                        allocation); workspace = the trainer's loss accumulator
                                        plus backend_scratch */
    ct_act_plan act;                 /* the activations by lifetime */
    size_t backend_scratch;          /* of the workspace: the backend's own op scratch (the CPU's
                                        fp32 copies of 16-bit arguments); 0 today: not planned
                                        yet (test/e2e_plan.sh leaves it out) */
    size_t total;
    bool device;                     /* planned for a device backend (else host memory) */
} ct_run_plan;

/* device: the backend will be a GPU (loader batches then have device copies). */
void ct_run_plan_make(const ct_config *cfg, const ct_graph *g, bool device, ct_run_plan *out);

#endif

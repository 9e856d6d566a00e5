/* profile.h: the flops profiler's report (flops_profiler in the config): one optimizer step seen
 * layer by layer, with each layer's parameters, FLOPs, measured time, share of the step and
 * achieved FLOP/s, and the model's FLOPs and MFU where the device's peak is known.
 *
 * This file only groups and formats numbers; core/train/profiler.c measures them (backend timer
 * marks around every layer at the profiled step). Time columns are the profiled step's sums over
 * its micro-batches; a checkpointed segment's recompute pass counts as backward time. */
#ifndef CT_REPORT_PROFILE_H
#define CT_REPORT_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "core/util/common.h"

/* One line of the table: a layer, or (module_depth) the layers whose names share a prefix. */
typedef struct ct_profile_row {
    char name[128];
    char type[32];               /* the layer type; "-" for a group of several types */
    int layers;                  /* layers summed into the row */
    int64_t params;              /* trainable elements the layers declare (a tied tensor counts
                                    once, at the layer that owns it) */
    double fwd_flops;            /* forward FLOPs over the step's samples */
    double fwd_s, bwd_s;         /* seconds in forward, and in backward (recompute included) */
} ct_profile_row;

/* What the table's header and footer say about the step. */
typedef struct ct_profile_info {
    long step;                   /* the profiled optimizer step (1-based) */
    int64_t samples;             /* samples in it */
    double step_s;               /* its wall time: data wait, layers, loss, optimizer */
    double train_flops;          /* the model's training FLOPs of the step
                                    (ct_graph_train_flops_per_sample x samples) */
    double peak_flops;           /* the device's dense 16-bit peak (ct_device_peak_flops); 0:
                                    unknown, no MFU */
    const char *device;          /* the backend's description */
    long top_modules;            /* modules listed by time after the table (0: none) */
    bool detailed;               /* print the table of every row */
} ct_profile_info;

/* Merge rows whose names agree on their first `depth` dot-separated parts ("h.3.attn" at depth 2
 * is "h.3"): sums in the first row of each group, named by the prefix, in the order groups first
 * appear. depth < 1 leaves the rows as they are. Returns the new count (rows rewritten in place). */
int ct_profile_group(ct_profile_row *rows, int n, long depth);
/* The sums of every row, as one row called "total". */
ct_profile_row ct_profile_total(const ct_profile_row *rows, int n);
/* Achieved FLOP/s of a row: training FLOPs (3 x forward, backward counted as twice forward) over
 * its forward + backward seconds; NAN when no time was measured. */
double ct_profile_row_flops_per_s(const ct_profile_row *r);
/* The report: header, the table (info->detailed), the total row, the top modules by time, and
 * the step's model FLOPs, achieved FLOP/s and MFU. Each line through `line` (the run's reporter,
 * or a file). */
void ct_profile_write(const ct_profile_info *info, const ct_profile_row *rows, int n,
                      void (*line)(void *ctx, const char *text), void *ctx);

#endif

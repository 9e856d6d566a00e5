/* bottleneck.h: the bottleneck report every run ends with (and `ctrain --profile N`): rules over
 * the run's measured numbers, each naming the config change that addresses what it found.
 *
 * Pure: the trainer fills a ct_run_measures (core/train/summary.c) and ct_bottleneck_find
 * applies the rules, so each rule is tested on synthetic measurements (test/test_profile.c). */
#ifndef CT_REPORT_BOTTLENECK_H
#define CT_REPORT_BOTTLENECK_H

#include <stddef.h>
#include <stdint.h>

#include "core/util/common.h"

/* What a run measured and how it was configured, as far as the rules need it. Unknown numbers
 * are NAN (shares, scales) or 0 (counts, bytes). */
typedef struct ct_run_measures {
    long steps;                  /* optimizer steps done (applied + skipped) */
    /* data */
    double data_wait_share;      /* of training-step time spent waiting for the loader */
    int workers;                 /* loader threads the run used */
    int cores;                   /* online cores */
    bool cache;                  /* data.cache */
    const char *format;          /* the train set's format ("idx", "image_folder", "shard", ...) */
    const char *source;          /* its path as the config gives it (for the pack command) */
    /* precision and device */
    const char *precision;       /* "fp32", "fp16" or "bf16" */
    bool gpu;                    /* a GPU backend */
    int sm;                      /* its compute capability x 10 (90 for sm_90); 0: unknown */
    /* memory (a GPU's) */
    size_t device_bytes;         /* the device's memory; 0: unknown (the CPU) */
    size_t peak_bytes;           /* the run's peak device bytes */
    long micro_batch, accum;     /* as configured */
    long fits_micro, fits_accum; /* the planner's largest micro-batch within CT_FIT_AUTO_MARGIN of
                                    device_bytes, and the accumulation it takes; 0: not asked */
    /* fp16's dynamic loss scale */
    double initial_scale;        /* 2^initial_scale_power; NAN when not fp16 */
    double final_scale;          /* the scale at the end */
    double min_scale;            /* fp16.min_loss_scale */
    long skipped_steps;          /* steps skipped for overflow */
} ct_run_measures;

/* One thing the rules found: what was measured, and the change that addresses it. */
typedef struct ct_finding {
    char rule[16];               /* data_wait, precision, memory, loss_scale, skipped_steps */
    char what[256];
    char fix[768];
} ct_finding;

/* The thresholds (the docs quote them). */
#define CT_BOTTLENECK_DATA_WAIT 0.10     /* data wait above this share of step time */
#define CT_BOTTLENECK_MEMORY_USED 0.50   /* peak device memory below this share of the device */
#define CT_BOTTLENECK_SKIPPED 0.05       /* skipped steps above this share of the steps */
#define CT_BOTTLENECK_SCALE_FLOOR 16.0   /* a final scale within this factor of min_scale: collapsed */

/* Apply every rule to m; up to max findings into out, in rule order (data wait, precision,
 * memory, loss scale collapse, skipped steps). Returns how many rules fired (even past max). */
int ct_bottleneck_find(const ct_run_measures *m, ct_finding *out, int max);
/* The compute capability in a CUDA device description ("..., sm_90, 79 GiB" -> 90) and its
 * memory in bytes (79 GiB); 0 for what is not there (a CPU's description). */
int ct_device_sm(const char *device_desc);
size_t ct_device_bytes(const char *device_desc);

#endif

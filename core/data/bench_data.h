/* bench_data.h: `ctrain bench-data --config FILE [--workers N] [--batches N] [--eval]`:
 * throughput of the data pipeline alone (read, decode, normalise, augment, collate into batches
 * through the threaded loader, no model), printed as one JSON line on stdout:
 *   {"bench": "data", "format": ..., "source": ..., "workers": N, "batch": B, "samples": S,
 *    "seconds": T, "samples_per_s": R, "skipped": K}
 * Without --batches it runs one epoch. bench/bench_data.py compares it with torchvision. */
#ifndef CT_DATA_BENCH_DATA_H
#define CT_DATA_BENCH_DATA_H

#include "core/common.h"

/* argv[0] is "bench-data". Returns CT_OK or the config / data error (err filled). */
int ct_bench_data_main(int argc, char **argv, ct_err *err);

#endif

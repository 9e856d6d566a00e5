/* plot.h: `ctrain plot` and `ctrain compare`: the curves and the final numbers of one or more run
 * directories, read from what every run writes there (metrics.jsonl, config.json). */
#ifndef CT_REPORT_PLOT_H
#define CT_REPORT_PLOT_H

#include <stdio.h>

#include "core/util/common.h"

/* One PNG of w x h at out: train and eval loss, the eval metric (accuracy, or perplexity for a
 * model without classes) and the learning rate against the step, one colour per run with a
 * legend. CT_ERR_DATA naming the file for a metrics.jsonl that is missing or holds no row; a line
 * that is not JSON is skipped, with a warning into warn (may be NULL) naming the file and line,
 * unless it is the last one without a newline (a run still writing it); CT_ERR_RUNTIME when out
 * cannot be written (checked before drawing). */
int ct_plot_runs(const char *const *run_dirs, int n, const char *out, int w, int h, ct_warnings *warn,
                 ct_err *err);

/* A table of the runs to f: steps, last train loss, last eval loss and metric, and the
 * hyperparameters of their config.json (lr, batch, micro-batch, precision, optimizer, seed),
 * sorted by eval loss when every run has one. */
int ct_compare_runs(const char *const *run_dirs, int n, FILE *f, ct_warnings *warn, ct_err *err);

#endif

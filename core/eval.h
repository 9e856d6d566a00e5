/* eval.h: `ctrain eval --config FILE --checkpoint DIR [--set KEY=VALUE ...] [--quiet]
 *                      [--summary FILE]`
 *
 * Builds the model of the config, loads the weights (and buffers) of a checkpoint directory or a
 * save_dir (then its latest), evaluates on data.eval and prints the summary line (status,
 * steps = the checkpoint's step, eval_loss, eval_accuracy) to stdout. argv[0] is "eval". Returns
 * the exit status with err filled: CT_ERR_CONFIG for usage or a checkpoint that does not fit the
 * model, CT_ERR_DATA for an unreadable checkpoint or data. */
#ifndef CT_EVAL_H
#define CT_EVAL_H

#include "core/common.h"

int ct_eval_main(int argc, char **argv, ct_err *err);

#endif

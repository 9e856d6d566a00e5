/* ckpt_cli.h: the checkpoint subcommands, wired into cmd/ctrain.c.
 *
 *   ctrain info PATH
 *       PATH: a safetensors file (tensors, dtypes, shapes, metadata), a checkpoint directory
 *       (state.json summary, files, tensors) or a save_dir (its checkpoints, latest, best; then the
 *       one latest names).
 *   ctrain export --checkpoint DIR --out FILE.safetensors [--dtype fp32|fp16|bf16]
 *       DIR: a checkpoint directory or a save_dir (then its latest). Writes the model weights
 *       (buffers included), fp32 tensors converted to --dtype, atomically (tmp + rename).
 *
 * argv[0] is the subcommand name. Output goes to stdout; the return value is the exit status
 * (CT_OK, CT_ERR_CONFIG for usage errors, CT_ERR_DATA for unreadable files) with err filled. */
#ifndef CT_CKPT_CLI_H
#define CT_CKPT_CLI_H

#include "core/common.h"

int ct_info_main(int argc, char **argv, ct_err *err);
int ct_export_main(int argc, char **argv, ct_err *err);

#endif

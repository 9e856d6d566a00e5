/* commands.h: the subcommands of cmd/ctrain.c. Each takes its own argv (argv[0] is the
 * subcommand's name), prints to stdout, and returns the exit status with err filled:
 * CT_OK, CT_ERR_CONFIG (usage, or a config/checkpoint that does not fit), CT_ERR_DATA (unreadable
 * or corrupt input) or CT_ERR_RUNTIME (cannot write).
 *
 *   ctrain eval --config FILE --checkpoint DIR [--set KEY=VALUE ...] [--device DEV] [--seed N]
 *               [--quiet] [--summary FILE]
 *       (eval.c) builds the model of the config, loads the weights (and buffers) of a checkpoint
 *       directory or a save_dir (then its latest), evaluates on data.eval and prints the summary
 *       line (status, steps = the checkpoint's step, eval_loss, eval_accuracy). Overrides are
 *       taken as for a run (ct_cli_take_override).
 *   ctrain info PATH                                                         (info_export.c)
 *       PATH: a safetensors file (tensors, dtypes, shapes, metadata), a checkpoint directory
 *       (state.json summary, files, tensors), a save_dir (its checkpoints, latest, best; then the
 *       one latest names), or a shard file or directory.
 *   ctrain export --checkpoint DIR --out FILE.safetensors [--dtype fp32|fp16|bf16]
 *       (info_export.c) writes the model weights (buffers included) of a checkpoint directory or
 *       save_dir (then its latest), fp32 tensors converted to --dtype, atomically.
 *   ctrain pack --from image_folder ROOT --out DIR [--shard-size MB] [--compress]      (pack.c)
 *   ctrain pack --from idx IMAGES [--labels LABELS] --out DIR [--shard-size MB] [--compress]
 *   ctrain pack --from text FILE... --out DIR [--eval-fraction F]
 *                    (byte-level tokens of the files in order: DIR/tokens.bin, or with F
 *                    DIR/train.bin and DIR/eval.bin = the last F of the bytes)
 *       Images are stored as decoded u8 pixels [C, H, W] (idx files of other element types as
 *       f32) in shard-NNNNNN.cts files; use them with {"format": "shard", "path": DIR}. For idx,
 *       LABELS defaults to IMAGES with "images-idx3" replaced by "labels-idx1" (MNIST's names).
 *   ctrain bench-data --config FILE [--workers N] [--batches N] [--eval]           (bench_data.c)
 *       throughput of the data pipeline alone (read, decode, normalise, augment, collate through
 *       the threaded loader, no model) as one JSON line: {"bench": "data", "format", "source",
 *       "workers", "batch", "samples", "seconds", "samples_per_s", "skipped"}. Without --batches
 *       it runs one epoch. bench/bench_data.py compares it with torchvision. */
#ifndef CT_CMD_COMMANDS_H
#define CT_CMD_COMMANDS_H

#include "core/util/common.h"

/* The options that become config overrides, shared by a run and `ctrain eval` (overrides.c), in
 * command-line order: --set KEY=VALUE, --KEY=VALUE and KEY=VALUE (the forms sweep agents write),
 * --device D (train.device) and --seed N (train.seed). */
typedef struct ct_cli_overrides {
    const char **items;          /* "KEY=VALUE", for ct_config_opts.overrides */
    int n;
    char **owned;                /* the items built here (--device, --seed) */
    int n_owned;
} ct_cli_overrides;
/* s is KEY=VALUE with a non-empty dotted KEY. */
bool ct_cli_is_override(const char *s);
/* When argv[*i] is one of those options, take it (*i moves past a separate value) and set *taken;
 * CT_ERR_CONFIG with err filled when its value is malformed. *taken false: argv[*i] is something
 * else, for the caller to handle. Call it after the caller's own options: "--world-size=2" has
 * the shape of an override. */
int ct_cli_take_override(int argc, char **argv, int *i, ct_cli_overrides *o, bool *taken, ct_err *err);
void ct_cli_overrides_free(ct_cli_overrides *o);

int ct_eval_main(int argc, char **argv, ct_err *err);
int ct_info_main(int argc, char **argv, ct_err *err);
int ct_export_main(int argc, char **argv, ct_err *err);
int ct_pack_main(int argc, char **argv, ct_err *err);
int ct_bench_data_main(int argc, char **argv, ct_err *err);
/* Their usage lines ("usage: ctrain eval ..."), for errors and for --help. */
extern const char ct_eval_usage[], ct_info_usage[], ct_export_usage[], ct_pack_usage[],
    ct_bench_data_usage[];

#endif

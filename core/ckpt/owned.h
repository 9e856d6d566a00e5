/* owned.h: the files ctrain keeps in run directories, save_dirs and checkpoint directories, which
 * no output a user names may replace: `export --out`, `--summary` (of a run or of `ctrain eval`),
 * `plot --out` and `compare --plot` are refused there (an export over a run's `latest` or
 * `metrics.jsonl` destroyed them for good).
 *
 * What counts, for an output at PATH in directory DIR (both with links resolved):
 *   - DIR is a checkpoint directory (it holds COMPLETE, or model.safetensors with state.json: an
 *     export's directory holding a model.safetensors alone is not one): any name;
 *   - DIR is a save_dir (it holds `latest` or a global_step* directory): `latest`, `best`,
 *     `global_step*` and the save protocol's `.tmp-*`, `.old-*`, `latest.tmp-*`;
 *   - DIR is a run directory (it holds ctrain's `.lock` and `config.json`): `.lock`, `config.json`,
 *     `metrics.jsonl`;
 *   - DIR's parent is a run directory (csv_monitor's and tensorboard's folders): their files,
 *     `Train_Samples_*.csv` and `events.out.tfevents.*`. */
#ifndef CT_CKPT_OWNED_H
#define CT_CKPT_OWNED_H

#include <stdbool.h>
#include <stddef.h>

/* True when an output at path would replace or go into one of those files; why (may be NULL)
 * receives which, as "the run directory runs/c's metrics.jsonl". */
bool ct_owned_output(const char *path, char *why, size_t n);

#endif

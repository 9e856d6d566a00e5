/* ckpt.h: checkpoint directories: save (crash-safe), resolve, load, best/, init_from.
 *
 * Layout (DeepSpeed's naming, safetensors content):
 *   <save_dir>/latest                      the tag of the newest complete checkpoint, no newline
 *   <save_dir>/global_step<N>/model.safetensors      fp32 master weights and buffers, named views
 *   <save_dir>/global_step<N>/optimizer.safetensors  "<view>.exp_avg", "<view>.exp_avg_sq", ...
 *   <save_dir>/global_step<N>/state.json   counters, loader position, scaler, scheduler, hashes
 *   <save_dir>/global_step<N>/config.json  the resolved config of the run that saved it
 *   <save_dir>/global_step<N>/COMPLETE     written last: {"tag", "files": {name: bytes},
 *                                          "crc32": {tensor file: CRC-32 as 8 hex digits}}
 *   <save_dir>/best/                       the same files, for the best metric so far
 * Protocol: files are written into <save_dir>/.tmp-<tag>-<pid>/ and fsynced, the marker last;
 * the directory is fsynced and renamed into place; save_dir is fsynced; then latest is replaced
 * by writing latest.tmp-<pid>, fsync, rename, fsync save_dir. Only after that are checkpoints
 * beyond keep_last deleted (ct_ckpt_prune: complete ones of the same experiment only). A
 * directory without a valid COMPLETE is never loaded and never deleted.
 *
 * A partitioned run (ZeRO stages 1-3 over several ranks) saves per-rank shards instead of the two
 * tensor files: every rank writes its own part of the master and optimizer state, and rank 0 the
 * index, the buffers, state.json, config.json and the marker (shards.h; docs/checkpoints.md). A
 * load reads either kind into any range [lo, hi) of the flat space, so a checkpoint resumes on
 * any number of ranks.
 *
 * Tensors are addressed through ct_ckpt_tensors: pointers to named ranges of the flat fp32
 * buffers (the layout's views), in host memory or in a device's, or arrays without addresses at
 * all, such as an NVMe swap's files (ct_ckpt_mem: then moved through one bounded host staging
 * buffer, never a whole copy). */
#ifndef CT_CKPT_H
#define CT_CKPT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/util/common.h"
#include "core/config/config.h"
#include "core/params/layout.h"

#define CT_CKPT_MARKER "COMPLETE"
#define CT_CKPT_MAX_SLOTS 4
/* Bytes of a data set's fingerprint (ct_dataset_fingerprint's CT_DATASET_FINGERPRINT: the train
 * module checks that they agree; ckpt comes before data and cannot include it). */
#define CT_CKPT_FINGERPRINT 96

struct ct_optim;

/* Memory that ckpt cannot read or write in place: a device's, or memory with no addresses at all
 * (an NVMe swap's files, core/zero/swap.h). ckpt moves values through a host staging buffer of at
 * most CT_CKPT_STAGE_FLOATS floats with these copies, which name a place as (base, at): element
 * `at` of the array whose element 0 is `base`, the pointer the ct_ckpt_tensors field holds (a
 * device's memory: base + at; memory without addresses has base NULL and goes by `at` alone).
 * Synchronous: dst_host holds the values, src_host may be reused, when they return. A failure
 * (an I/O error, which names the file) is returned and ends the save or the load. */
typedef struct ct_ckpt_mem {
    void *ctx;
    int (*to_host)(void *ctx, const float *base, int64_t at, int64_t n, float *dst_host, ct_err *err);
    int (*from_host)(void *ctx, float *base, int64_t at, int64_t n, const float *src_host, ct_err *err);
} ct_ckpt_mem;
#define CT_CKPT_STAGE_FLOATS ((int64_t)1 << 20)

/* Where the tensors of a run live. The trainable tensors are held for the range [lo, hi) of the
 * flat parameter space (layout.h): the whole space, or a rank's part; a view may lie partly in
 * it (a part's boundary may cut a tensor): a load fills the elements inside [lo, hi). */
typedef struct ct_ckpt_tensors {
    const ct_param_view *views;  /* the layout's views: trainable ones in params, others in buffers */
    int n_views;
    int64_t n_params;            /* the flat space's extent (layout.h), padding included */
    int64_t lo, hi;              /* params[0] and each slot[s][0] are element lo */
    float *params;               /* [hi - lo] fp32 master weights (NULL in memory without addresses) */
    float *buffers;              /* [n_buffers] running statistics (may be NULL when none) */
    int64_t n_buffers;
    /* Optimizer state, each [hi - lo] aligned with params: saved as "<view>.<slot name>" for
     * every trainable view. */
    int n_slots;
    const char *slot_name[CT_CKPT_MAX_SLOTS]; /* "exp_avg", "exp_avg_sq", "momentum_buffer" */
    float *slot[CT_CKPT_MAX_SLOTS];
    char optimizer[32];          /* optimizer type, recorded and checked on load ("AdamW") */
    /* The memory each pointer is in: NULL for host memory, used in place (the CPU backend, an
     * offloaded optimizer's pinned state), else a device's. */
    const ct_ckpt_mem *params_mem, *buffers_mem, *slot_mem[CT_CKPT_MAX_SLOTS];
} ct_ckpt_tensors;

/* Address the views of a layout over [lo, hi): params and buffers and the state of an optimizer
 * over the same range (ct_optim_slots: its names, and its buffers as the slot pointers), all in
 * host memory (a caller whose buffers are a device's sets the *_mem fields). o may be NULL: no
 * optimizer state, as for `ctrain eval`. Nothing is allocated. */
void ct_ckpt_tensors_for(const ct_param_layout *L, const struct ct_optim *o, int64_t lo, int64_t hi,
                         float *params, float *buffers, ct_ckpt_tensors *out);

/* Whether view v's range lies inside the buffers t holds (and v's element count agrees with its
 * shape). */
bool ct_ckpt_view_in_bounds(const ct_ckpt_tensors *t, const ct_param_view *v);
/* The elements of view v that t holds: [*first, *first + *n) of the view (all of a buffer; of a
 * trainable view its intersection with [lo, hi), maybe none). False when v's shape and count
 * disagree or it lies outside the flat space. */
bool ct_ckpt_view_part(const ct_ckpt_tensors *t, const ct_param_view *v, int64_t *first, int64_t *n);
/* Whether t holds the whole flat space (one process, or ZeRO stage 0), or a rank's part. */
bool ct_ckpt_tensors_whole(const ct_ckpt_tensors *t);

/* Everything besides tensors that a resume restores. */
typedef struct ct_ckpt_state {
    long step;                   /* optimizer steps taken (applied + skipped): the tag number */
    long applied;                /* applied updates (Adam bias correction) */
    long sched_t;                /* scheduler last_batch_iteration */
    long skipped_steps;          /* overflow-skipped steps */
    int epoch;                   /* epoch in progress, 0-based */
    long epoch_step;             /* optimizer steps done in this epoch (of the sizes they had) */
    long epoch_sample;           /* the loader position: samples of this epoch's order done (the
                                  * order is a function of (seed, epoch), not of batch sizes: the
                                  * next sample is order[epoch_sample]); -1: not recorded (a
                                  * checkpoint written before it: epoch_step x its config's
                                  * train_batch_size) */
    double epoch_loss_sum;       /* running sum of step losses in this epoch (summary train_loss) */
    long epoch_loss_n;           /* steps in that sum */
    long last_eval_step;         /* step of the last eval (-1: none) */
    long samples_seen;
    long micro_step;             /* dropout RNG counter (ct_step_io.step) */
    uint64_t seed;               /* train.seed of the run (all RNG streams derive from it) */
    double loss_scale;           /* dynamic loss scaler: current scale (1 when not fp16) */
    long scaler_good_steps;      /* steps since the last overflow */
    int scaler_hysteresis;       /* remaining hysteresis */
    double best_value;           /* best/: best value of train.best_metric so far (NAN: none) */
    long best_step;              /* step of best_value (-1: none) */
    double es_best;              /* early stopping: best value of its metric (NAN: none yet) */
    int es_bad_evals;            /* early stopping: evals without improvement */
    long es_best_step;           /* early stopping: step of es_best (-1: none; optional on load) */
    double train_loss;           /* last reported train loss (NAN: none) */
    char config_hash[17];        /* ct_ckpt_config_hash of the resolved config */
    /* ct_dataset_fingerprint of data.train and data.eval as the run opened them ("": none, or
     * a checkpoint written before they were recorded), compared on resume */
    char train_data[CT_CKPT_FINGERPRINT], eval_data[CT_CKPT_FINGERPRINT];
    char version[32];            /* ctrain version that wrote it */
    /* On load: state.json's bytes differ from the CRC-32 the marker recorded (edited by hand, or
     * damaged). Its values are still used (hand edits are allowed); the caller warns. */
    bool state_changed;
} ct_ckpt_state;

void ct_ckpt_state_init(ct_ckpt_state *s);

/* FNV-1a 64 of the compact JSON text, as 16 hex digits. */
void ct_ckpt_config_hash(const cJSON *resolved, char out[17]);

/* Whether a saved resolved config (a checkpoint's or run directory's config.json) describes the
 * experiment of cfg: equal to cfg->resolved but for the keys that say only where the outputs go,
 * how long to train, how often to evaluate, where and how fast to run and what to print
 * (cfg->not_identity: the flags on their rows in core/config/, docs/checkpoints.md), and for keys
 * only one of them has (not recorded by the ctrain version that wrote the other). Key order does
 * not matter. */
bool ct_ckpt_same_experiment(const cJSON *saved, const ct_config *cfg);
/* The differences that make them two experiments, one "path: saved -> cfg's" per line into buf
 * (as ct_ckpt_config_diff); returns their number (0: the same experiment). */
int ct_ckpt_experiment_diff(const cJSON *saved, const ct_config *cfg, char *buf, size_t n);

typedef struct ct_ckpt_save_opts {
    int keep_last;               /* keep this many global_step* (the new one included); 0 = all */
    /* The run's config: keep_last counts and removes only complete checkpoints whose config.json
     * is the same experiment (ct_ckpt_same_experiment). NULL: every complete one. */
    const ct_config *owner;
    bool skip_latest;            /* do not update latest (best/ uses this) */
    /* Test hook: called after each stage ("model.safetensors", "optimizer.safetensors",
     * "state.json", "config.json", "COMPLETE", "rename", "latest"); non-zero aborts the save
     * as if the process had died there (nothing is cleaned up). */
    int (*fault)(void *ctx, const char *stage);
    void *fault_ctx;
} ct_ckpt_save_opts;

/* Save <save_dir>/global_step<state->step> (save_dir is created when missing). config: the
 * resolved config (may be NULL: config.json then holds null). out_dir (may be NULL) receives the
 * checkpoint's path. Errors are CT_ERR_RUNTIME naming the path. */
int ct_ckpt_save(const char *save_dir, const ct_ckpt_tensors *t, const ct_ckpt_state *state,
                 const cJSON *config, const ct_ckpt_save_opts *opts, char *out_dir, size_t out_n,
                 ct_err *err);

/* keep_last over save_dir, relative to the checkpoint of step `anchor` (the one just saved, or
 * at the start of a run the one it continues from): keep it and the keep_last - 1 newest older
 * checkpoints, remove the older ones. Only complete checkpoints of owner's experiment (NULL: any)
 * are counted or removed; those of higher steps than anchor (left by a run resumed from further
 * back) are never removed. A global_step* without a valid marker (an interrupted copy, another
 * tool's checkpoint such as DeepSpeed's, which shares the names) or of another experiment is
 * never removed; with warn, each one gets a warning saying so. keep_last <= 0: nothing removed. */
void ct_ckpt_prune(const char *save_dir, long anchor, int keep_last, const ct_config *owner,
                   ct_warnings *warn);

/* Save the same content as <save_dir>/best, replacing the previous best atomically. */
int ct_ckpt_save_best(const char *save_dir, const ct_ckpt_tensors *t, const ct_ckpt_state *state,
                      const cJSON *config, ct_err *err);

#define CT_CKPT_TAG 32
/* "global_step<step>": the name of a step's checkpoint directory. */
void ct_ckpt_tag(long step, char out[CT_CKPT_TAG]);

/* ---- the sharded save of a partitioned run (shards.h): every rank writes its part, rank 0 the
 * rest. ckpt knows no communicator, so the caller runs the steps with its collectives between:
 *   1. rank 0: ct_ckpt_begin (save_dir prepared, the temporary directory made)
 *   2. every rank, once rank 0 says 1 succeeded: ct_ckpt_shard_write into ct_ckpt_tmp_dir
 *   3. rank 0, once every rank says its shard is written (and its CRC-32): ct_ckpt_commit_shards
 *      (the index, the buffers, state.json, config.json, the marker; then as ct_ckpt_save: the
 *      directory renamed into place, latest, keep_last), or ct_ckpt_abort when a rank failed.
 * The protocol of ct_ckpt_save holds: the checkpoint exists only once the marker, written after
 * every rank's shard, is in place, so a process killed at any moment of a save, on any rank,
 * leaves the previous checkpoint and `latest` as they were. name: ct_ckpt_tag's, or "best" (no
 * latest, no keep_last). pid: rank 0's process id, which names the temporary directory (a later
 * save removes it once that process is gone). */
int ct_ckpt_begin(const char *save_dir, const char *name, long pid, ct_err *err);
/* <save_dir>/.tmp-<name>-<pid> into tmp. */
int ct_ckpt_tmp_dir(const char *save_dir, const char *name, long pid, char *tmp, size_t n, ct_err *err);
/* crc[world]: the CRC-32 of every rank's shard, as ct_ckpt_shard_write gave it. */
int ct_ckpt_commit_shards(const char *save_dir, const char *name, long pid, const ct_ckpt_tensors *t, int world,
                          const uint32_t *crc, const ct_ckpt_state *state, const cJSON *config,
                          const ct_ckpt_save_opts *opts, char *out_dir, size_t out_n, ct_err *err);
/* Remove the temporary directory of a save that failed (kept when opts has a fault hook, as after a
 * crash). */
void ct_ckpt_abort(const char *save_dir, const char *name, long pid, const ct_ckpt_save_opts *opts);

/* Resolve what to load. spec: "auto" -> <save_dir>/latest, or when latest is missing or names
 * an incomplete checkpoint, the newest complete global_step* (with a warning); nothing ever saved
 * there (no save_dir, no latest, no global_step*) -> out = "" and CT_OK (start fresh); latest or
 * global_step* directories but none complete -> CT_ERR_DATA naming the damaged file and how to
 * start fresh deliberately (a resume must not quietly restart a run from step 0). Otherwise spec
 * is a checkpoint directory, or a save_dir holding `latest` (resolved through it). A given spec
 * that holds no complete checkpoint is CT_ERR_DATA naming it. */
int ct_ckpt_resolve(const char *spec, const char *save_dir, char *out, size_t n,
                    ct_warnings *warn, ct_err *err);

/* True when dir holds a marker whose listed files exist with the listed sizes. */
bool ct_ckpt_is_complete(const char *dir);

/* Whether the tensor files of a complete checkpoint still hold the bytes written: their CRC-32
 * against the marker's (`ctrain info`; ct_ckpt_load does the same for the files it reads). CT_OK
 * when they match; *n_checked (may be NULL) receives the number of files compared, 0 for a
 * checkpoint whose marker records no checksums (written by a version before them: trusted on its
 * sizes). Incomplete, or a mismatch: CT_ERR_DATA naming the file, the checkpoint and the
 * previous complete checkpoint beside it to resume from instead. Reads every byte. */
int ct_ckpt_verify(const char *dir, int *n_checked, ct_err *err);

enum { CT_CKPT_LOAD_MODEL = 1, CT_CKPT_LOAD_OPTIM = 2, CT_CKPT_LOAD_STATE = 4,
       CT_CKPT_LOAD_ALL = 7 };

/* Load a complete checkpoint directory (one file set or shards) into t's range (and state, and
 * *config_out when not NULL: the saved config, caller frees with cJSON_Delete): of every view the
 * elements inside [t->lo, t->hi), read from the files that hold them and no others. Everything is
 * validated before anything is written into t: first the CRC-32 of the tensor files it reads (as
 * ct_ckpt_verify; a mismatch is CT_ERR_DATA naming the file and the checkpoint to resume from
 * instead), then a tensor missing, extra or of another shape than the model's view is
 * CT_ERR_CONFIG naming the tensor and both shapes; optimizer state for another optimizer is
 * CT_ERR_CONFIG; a corrupt or truncated file, or shards that do not fit together, CT_ERR_DATA
 * naming the file. */
int ct_ckpt_load(const char *dir, const ct_ckpt_tensors *t, int what, ct_ckpt_state *state,
                 cJSON **config_out, ct_err *err);

/* Differences between a saved and the current resolved config, one "path: old -> new" per
 * line into buf (empty when equal); returns the number of differences. */
int ct_ckpt_config_diff(const cJSON *saved, const cJSON *current, char *buf, size_t n);

/* model.init_from: load weights by name from any safetensors file (F32, F16 or BF16), or from a
 * checkpoint directory of either kind (or a save_dir: its latest), into the params/buffers of t
 * (the part of each view inside t's range). Mismatches (missing in the file, other shape, unusable dtype, unused in
 * the model) are listed: strict -> CT_ERR_CONFIG listing them and nothing loaded; not strict ->
 * matching tensors loaded, one warning per mismatch, CT_ERR_CONFIG only when nothing matches.
 * n_loaded (may be NULL) receives the number of tensors loaded. Corrupt file: CT_ERR_DATA. */
int ct_ckpt_init_from(const char *file, const ct_ckpt_tensors *t, bool strict, int *n_loaded,
                      ct_warnings *warn, ct_err *err);

/* values[v->numel]: a whole view's values in host memory, of which the part t holds goes into t
 * (through a staging buffer when t's memory is a device's or has no addresses). CT_ERR_RUNTIME
 * when v lies outside t's space, or the memory's error. */
int ct_ckpt_put_view(const ct_ckpt_tensors *t, const ct_param_view *v, const float *values, ct_err *err);
/* The slot names of t, comma-separated ("exp_avg,exp_avg_sq": the files' "slots" metadata). */
void ct_ckpt_slot_list(const ct_ckpt_tensors *t, char *buf, size_t n);

#endif

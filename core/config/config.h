/* config.h: DeepSpeed-style JSON -> typed, validated, fully resolved configuration.
 *
 * ct_config_load() reads the file (core/util/json.h: strict JSON + the Hjson forms of real
 * DeepSpeed files), splices in --model/--data files and "model"/"data" given as paths, applies
 * overrides (--set KEY=VALUE, dotted paths), checks every key (unknown keys: error inside ctrain's
 * sections, zero_optimization, its offload blocks and the monitor sections; warning elsewhere,
 * with a "did you mean"), resolves "auto", derives the batch triple with DeepSpeed's rule, and
 * fills defaults. Every error names the file, the JSON path, the value and what was expected, and
 * is CT_ERR_CONFIG. docs/config.md documents every key.
 *
 * The typed struct holds what the engine acts on. The "model" and "data" sections stay as cJSON
 * (owned by the config) because the graph builder and the dataset readers validate their own
 * fields; ct_config_where() gives them "FILE:LINE:COL" for messages. */
#ifndef CT_CONFIG_H
#define CT_CONFIG_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "core/util/common.h"

/* Micro-batch used when every batch key is "auto" or absent but at least one is "auto" (the value
 * Hugging Face's per_device_train_batch_size defaults to). docs/config.md. */
#define CT_CONFIG_DEFAULT_MICRO_BATCH 8

/* Where a value came from, for messages ("train_batch_size was set in the file; micro ... --set"). */
typedef enum { CT_SRC_DEFAULT = 0, CT_SRC_FILE, CT_SRC_OVERRIDE, CT_SRC_DERIVED, CT_SRC_AUTO } ct_source;

typedef enum { CT_OPT_ADAM = 0, CT_OPT_ADAMW, CT_OPT_SGD, CT_OPT_LAMB } ct_opt_type;

typedef struct ct_optimizer_cfg {
    ct_opt_type type;
    char type_name[32];     /* as written in the file ("AdamW") */
    double lr;              /* 1e-3 (Adam/AdamW/Lamb); SGD requires it in torch, ctrain default 1e-2 */
    double beta1, beta2;    /* 0.9, 0.999 */
    double eps;             /* 1e-8 */
    double weight_decay;    /* 0 */
    bool adam_w_mode;       /* true: decoupled weight decay (DeepSpeed: "Adam" means AdamW by default) */
    bool bias_correction;   /* true */
    double momentum, dampening; /* SGD: 0, 0 */
    bool nesterov;          /* SGD: false */
    double max_coeff, min_coeff; /* Lamb trust-ratio clamp: 10.0, 0.01 */
    bool eps_inside_sqrt;   /* Lamb: false */
} ct_optimizer_cfg;

typedef enum {
    CT_SCHED_NONE = 0,
    CT_SCHED_WARMUP_LR,
    CT_SCHED_WARMUP_DECAY_LR,
    CT_SCHED_WARMUP_COSINE_LR,
    CT_SCHED_ONE_CYCLE,
    CT_SCHED_LR_RANGE_TEST,
} ct_sched_type;

typedef enum { CT_WARMUP_LOG = 0, CT_WARMUP_LINEAR } ct_warmup_type;

typedef struct ct_scheduler_cfg {
    ct_sched_type type;
    /* WarmupLR, WarmupDecayLR */
    double warmup_min_lr, warmup_max_lr;
    long warmup_num_steps;
    ct_warmup_type warmup_type;
    long total_num_steps;              /* WarmupDecayLR, WarmupCosineLR; -1 ("auto") = the run's
                                          total optimizer steps, filled in by the trainer */
    /* WarmupCosineLR */
    double warmup_min_ratio, cos_min_ratio;
    /* OneCycle */
    double cycle_min_lr, cycle_max_lr, decay_lr_rate;
    long cycle_first_step_size, cycle_second_step_size, decay_step_size;
    bool cycle_momentum;
    double cycle_min_mom, cycle_max_mom, decay_mom_rate;
    /* LRRangeTest */
    double lr_range_test_min_lr, lr_range_test_step_rate;
    long lr_range_test_step_size;
    bool lr_range_test_staircase;
} ct_scheduler_cfg;

typedef struct ct_fp16_cfg {
    bool enabled;
    double loss_scale;          /* 0 = dynamic */
    int initial_scale_power;    /* 16 */
    int loss_scale_window;      /* 1000 */
    int hysteresis;             /* 2 */
    bool consecutive_hysteresis;/* false */
    double min_loss_scale;      /* 1 */
    bool auto_cast;             /* false */
} ct_fp16_cfg;

typedef enum { CT_OFFLOAD_NONE = 0, CT_OFFLOAD_CPU, CT_OFFLOAD_NVME } ct_offload_device;

/* An offload block's NVMe keys (core/zero/swap.h; device "nvme" is refused until the trainer
 * drives the swap: docs/distributed.md, "NVMe offload"). */
typedef struct ct_nvme_cfg {
    char path[4096];            /* nvme_path; "" = null */
    long buffer_count;          /* host buffers of the swap: offload_optimizer 4, offload_param 5 */
    long buffer_size;           /* offload_param only: elements per buffer, 1e8 */
    long max_in_cpu;            /* offload_param only: elements kept in host memory, 1e9 */
} ct_nvme_cfg;

typedef struct ct_offload_cfg {
    ct_offload_device device;
    bool pin_memory;
    double ratio;               /* offload_optimizer only; 1.0 */
    ct_nvme_cfg nvme;
} ct_offload_cfg;

/* The top-level "aio" section: the NVMe swap engine's settings (core/zero/aio.h, whose
 * ct_aio_from_config turns them into its options). */
#define CT_AIO_BLOCK_ALIGN 4096     /* direct I/O's block: aio.block_size is a multiple of it */
typedef struct ct_aio_cfg {
    long block_size;            /* bytes per request, 1048576; a multiple of 4096 */
    int queue_depth;            /* requests in flight per thread, 8 */
    int intra_op_parallelism;   /* I/O threads, 1 (DeepSpeed's older name: thread_count) */
    bool single_submit;         /* false; no effect: each request is its own system call */
    bool overlap_events;        /* true; no effect: completions never wait for a batch */
    bool use_gds;               /* false; true is refused (no GPUDirect Storage) */
} ct_aio_cfg;

typedef struct ct_zero_cfg {
    int stage;                  /* 0..3 */
    ct_offload_cfg offload_optimizer, offload_param;
    bool overlap_comm, contiguous_gradients, reduce_scatter;
    bool overlap_comm_by_stage; /* overlap_comm not given (or "auto"): it follows the stage, true
                                   at 3 as DeepSpeed's default (what fit.c's rows at other stages
                                   need to know) */
    double reduce_bucket_size, allgather_bucket_size;
    double prefetch_bucket_size, param_persistence_threshold, max_live_parameters,
        max_reuse_distance, sub_group_size;
    bool gather_16bit_weights_on_model_save;
} ct_zero_cfg;

/* Legacy top-level curriculum_learning (DeepSpeed's CurriculumScheduler): the difficulty (the
 * sequence length for curriculum_type "seqlen") by step, ct_curriculum_difficulty (sched.h). */
typedef enum {
    CT_CURRICULUM_FIXED_LINEAR = 0,
    CT_CURRICULUM_FIXED_ROOT,
    CT_CURRICULUM_FIXED_DISCRETE,
    CT_CURRICULUM_CUSTOM,       /* DeepSpeed calls a user function: nothing ctrain can run */
} ct_curriculum_schedule;

#define CT_CURRICULUM_MAX_STAGES 64 /* fixed_discrete: entries of "difficulty" */

typedef struct ct_curriculum_cfg {
    bool enabled;
    char type[32];              /* curriculum_type: "seqlen" is the one DeepSpeed's engine acts on */
    ct_curriculum_schedule schedule;
    long min_difficulty, max_difficulty;
    long total_curriculum_step, difficulty_step; /* fixed_linear, fixed_root */
    double root_degree;                          /* fixed_root; 1 for fixed_linear */
    int stages;                                  /* fixed_discrete: difficulty[stages], */
    long difficulty[CT_CURRICULUM_MAX_STAGES];   /* max_step[stages - 1] */
    long max_step[CT_CURRICULUM_MAX_STAGES - 1];
} ct_curriculum_cfg;

/* DeepSpeed settings ctrain accepts and validates but does not act on yet (ZeRO's are in
 * ct_zero_cfg): ct_config_not_yet() lists those switched on. */
typedef struct ct_pending_cfg {
    bool partition_activations; /* activation_checkpointing.partition_activations (a no-op
                                   without model parallelism: accepted, no line) */
    bool contiguous_memory_optimization; /* activation_checkpointing.*: a no-op likewise (the
                                   activations are one contiguous arena already) */
    bool cpu_checkpointing;     /* activation_checkpointing.cpu_checkpointing: activation offload
                                   (core/graph/offload.c; a line when nothing is checkpointed) */
    long number_checkpoints;    /* activation_checkpointing.number_checkpoints; 0 = null. Acted on:
                                   that many even checkpointed segments (core/graph/segments.c) */
    bool synchronize_checkpoint_boundary; /* activation_checkpointing.*: a device wait at each
                                   edge of a checkpointed segment's passes (core/graph/exec.c) */
    bool profile;               /* activation_checkpointing.profile: each checkpointed segment's
                                   forward, recompute and backward timed (exec.c), reported with
                                   the step lines (core/train/loop.c) */
    bool curriculum;            /* curriculum_learning.enabled (the legacy top-level section) */
    bool data_curriculum;       /* data_efficiency.data_sampling.curriculum_learning.enabled */
    bool eigenvalue;            /* eigenvalue.enabled: DeepSpeed uses it only for MoQ (refused) */
    bool compile;               /* compile.enabled or compile.deepcompile: nothing to compile */
} ct_pending_cfg;

/* A DeepSpeed monitor section (tensorboard, csv_monitor: the same three keys). */
typedef struct ct_monitor_cfg {
    bool enabled;               /* false */
    char output_path[1024];     /* "": the files go under run_dir (DeepSpeed: the cwd) */
    char job_name[256];         /* "DeepSpeedJobName" */
} ct_monitor_cfg;

/* flops_profiler (DeepSpeed's keys and defaults): a per-layer table of one step, printed by
 * core/train/profiler.c. */
typedef struct ct_flops_profiler_cfg {
    bool enabled;               /* false */
    long profile_step;          /* 1: the optimizer step (1-based) that is profiled */
    long module_depth;          /* -1: every layer; d >= 1: layers grouped by the first d parts of
                                   their dotted names */
    long top_modules;           /* 1: the aggregated list names this many modules by time */
    bool detailed;              /* true: the table of every layer (module) */
    char output_file[1024];     /* "": the report goes to stderr with the run's other lines */
} ct_flops_profiler_cfg;

typedef struct ct_early_stop_cfg {
    bool enabled;               /* true when the section is present */
    char metric[32];            /* "eval_loss" */
    bool mode_max;              /* mode "max" */
    int patience;               /* 3 */
    double min_delta;           /* 0 */
} ct_early_stop_cfg;

typedef struct ct_train_cfg {
    int epochs;                 /* 5 */
    long max_steps;             /* 0 = no limit */
    long eval_interval;         /* 0 = each epoch */
    long sample_every;          /* a byte-level language model prints a generated sample every N
                                   steps; 0 = never */
    uint64_t seed;              /* 42 */
    char device[32];            /* "auto" | "cpu" | "cuda" | "cuda:N" */
    char run_dir[1024];         /* resolved: "runs/<config name>" by default */
    char save_dir[1024];        /* resolved: "<run_dir>/checkpoints" by default */
    bool run_dir_default;       /* run_dir was not given: a training run picks a fresh
                                   runs/<name>/<timestamp> (cmd/run_dir.c) */
    bool save_dir_default;      /* save_dir was not given: it follows run_dir */
    long save_interval;         /* 0 = only at the end */
    int keep_last;              /* 3 */
    char best_metric[32];       /* "eval_loss" */
    ct_early_stop_cfg early_stopping;
    int threads;                /* CPU worker threads; 0 = number of cores */
    int cuda_graph;             /* CT_CUDA_GRAPH_AUTO (default), _OFF or _ON */
    double memory_limit_gb;     /* usable memory of the device (host memory on the CPU), GiB;
                                   0 = the device's own. A plan above it exits 1 at start */
    double host_memory_limit_gb; /* usable host memory beside a device (ZeRO-Offload's state, its
                                   staging, NVMe swap buffers), GiB; 0 = none. On the CPU backend
                                   host memory is its memory: the smaller of the two limits */
} ct_train_cfg;

/* train.cuda_graph: "auto" replays captured steps when the backend and model allow it. */
enum { CT_CUDA_GRAPH_AUTO = -1, CT_CUDA_GRAPH_OFF = 0, CT_CUDA_GRAPH_ON = 1 };

typedef struct ct_config {
    char path[1024];            /* the config file as given */
    char dir[1024];             /* its directory: relative data paths resolve against it */
    char name[256];             /* file name without extension: default run name */

    /* Batch triple after DeepSpeed's derivation; the sources say where each came from. */
    long train_batch_size, micro_batch, grad_accum;
    ct_source train_batch_src, micro_batch_src, grad_accum_src;
    bool micro_batch_auto;      /* train_micro_batch_size_per_gpu "auto" with a fixed train_batch_size
                                   (accumulation not given): micro_batch is the rule's derivation
                                   until ct_fit_auto_micro_batch (core/train/fit.h) picks one */
    int world_size;

    ct_optimizer_cfg optimizer;
    ct_scheduler_cfg scheduler;
    ct_fp16_cfg fp16;
    bool bf16;
    double gradient_clipping;   /* 0 = off (DeepSpeed's code default; its docs say 1.0) */
    bool prescale_gradients;
    double gradient_predivide_factor;
    long steps_per_print;       /* 0 = DeepSpeed's null: ctrain prints per epoch / TTY progress */
    bool wall_clock_breakdown, memory_breakdown;
    ct_zero_cfg zero;
    ct_aio_cfg aio;
    ct_curriculum_cfg curriculum;
    ct_pending_cfg pending;     /* accepted, not used yet: see ct_config_not_yet() */
    ct_monitor_cfg csv_monitor; /* acted on: core/report/metrics.h */
    ct_monitor_cfg tensorboard; /* acted on: core/report/metrics.h */
    ct_flops_profiler_cfg flops_profiler; /* acted on: core/train/profiler.c */
    bool checkpoint_enabled;    /* checkpoint.enabled (ctrain's key, true): false writes no
                                   checkpoint at all (sweeps); DeepSpeed's other checkpoint keys
                                   are read, not used */
    bool wandb;                 /* wandb.enabled: validated; enabled gets a "not supported yet" line */
    ct_train_cfg train;

    /* ctrain sections kept as JSON; validated by their consumers. Owned by the config. */
    const cJSON *model;         /* object */
    const cJSON *data;          /* object */

    cJSON *resolved;            /* the whole resolved config (defaults filled, "auto" resolved) */
    struct ct_json_doc *doc;    /* the parsed file(s), for positions */
    struct ct_json_doc *model_doc, *data_doc; /* when taken from other files */
    cJSON *retired;             /* nodes replaced after parsing, kept alive so positions stay valid */
    /* The dotted paths of the keys and sections that do not change what is trained (where
     * outputs go, how long, how often to evaluate, where and how fast, what is printed), from the
     * flags on their rows in core/config/: a run may change them and stay the same experiment
     * (core/ckpt's ct_ckpt_same_experiment). */
    char **not_identity;
    int n_not_identity, cap_not_identity;
    /* The dotted path of every key of every section table the reader used for this config (its
     * rows, read or defaulted): what the tests check docs/config.md against. */
    char **rows;
    int n_rows, cap_rows;
} ct_config;

/* One dataset format: its "format" name, the keys its entries take besides format, transform and
 * limit, and its opener. The rows are core/data's formats[] (core/data/formats.def); the config
 * reader checks data.train and data.eval against the rows it is given (ct_config_opts.formats)
 * and never calls an opener. */
struct ct_dataset;
typedef struct ct_data_format {
    const char *name;
    const char *keys[7];
    int (*open)(const ct_config *cfg, const cJSON *entry, const char *path, struct ct_dataset **out,
                ct_err *err);
} ct_data_format;

/* Inputs of ct_config_load(): the file and what the command line adds. */
typedef struct ct_config_opts {
    const char *path;           /* config file */
    const char *model_path;     /* --model FILE, or NULL */
    const char *data_path;      /* --data FILE, or NULL */
    const char *const *overrides; /* "KEY=VALUE" strings from --set, --KEY=VALUE and KEY=VALUE */
    int n_overrides;
    int world_size;             /* data-parallel ranks (1 unless launched by mpirun or given) */
    bool has_gpu;               /* for "auto" precision: bf16 where supported, fp16 on other GPUs */
    bool gpu_supports_bf16;
    /* The dataset formats (ct_dataset_formats, core/data/dataset.h) that data.train and
     * data.eval are checked against: a known "format" and only its keys. NULL: the entries are
     * checked for being objects only (a caller that never opens data: the tests of other
     * sections). */
    const ct_data_format *formats;
    int n_formats;
} ct_config_opts;

int ct_config_load(const ct_config_opts *opts, ct_config **out, ct_warnings *warn, ct_err *err);
void ct_config_free(ct_config *cfg);

/* The fully resolved config as pretty JSON (caller frees). */
char *ct_config_to_json(const ct_config *cfg);

/* "FILE:LINE:COL" of a node inside cfg->model or cfg->data (or the origin of an override). */
const char *ct_config_where(const ct_config *cfg, const cJSON *node, char *buf, size_t n);

/* Resolve a data path relative to the config file's directory unless absolute. */
void ct_config_resolve_path(const ct_config *cfg, const char *rel, char *out, size_t n);

/* One setting a loaded config switches on that ctrain accepts but does not implement yet. */
typedef struct ct_not_yet {
    char path[160];             /* JSON path: "zero_optimization.stage",
                                   "activation_checkpointing.cpu_checkpointing" */
    char text[480];             /* one line, for a warning: "zero_optimization.stage 2: accepted, not
                                   used yet: this version trains without ZeRO partitioning (...)" */
} ct_not_yet;

/* More than there are such settings: an array of this size always holds all of them. */
#define CT_NOT_YET_MAX 16

/* Every accepted-but-not-yet-implemented setting that cfg switches on (ZeRO stage >= 1 and its CPU
 * offload, activation offload (cpu_checkpointing) with nothing checkpointed, curriculum learning,
 * the FLOPS profiler;
 * docs/config.md, "Accepted, not used yet"), in that order. Writes at most `max` entries to out
 * (out may be NULL when max is 0) and returns how many there are. The trainer prints each text
 * as a warning at start; `ctrain config check` lists them. The "keys read but not used" warning of
 * ct_config_load() leaves out what these lines already say. */
int ct_config_not_yet(const ct_config *cfg, ct_not_yet *out, int max);

/* `ctrain config check FILE [--world-size N]`: load opts->path (opts->world_size, opts->formats;
 * no overrides, no GPU assumed) and print
 * a short summary to `out`: batch triple with sources, precision, optimizer, scheduler, the ZeRO
 * stage asked for, and under "accepted, not used yet:" the lines of ct_config_not_yet().
 * Returns CT_OK or the load error (err filled; warnings in warn). */
int ct_config_check(const ct_config_opts *opts, FILE *out, ct_warnings *warn, ct_err *err);

/* "file", "--set", "derived", "default", "auto": for messages. */
const char *ct_source_name(ct_source s);

#endif

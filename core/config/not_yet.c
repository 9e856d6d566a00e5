/* not_yet.c: the DeepSpeed settings ctrain accepts but does not implement yet, said plainly.
 *
 * A config key ctrain accepts must do what DeepSpeed does with it, or say that it does not. The
 * settings below are validated like the rest (so a file DeepSpeed rejects is rejected), and when
 * a config switches one on, ct_config_not_yet() gives it one line: the trainer prints them as
 * warnings at start, `ctrain config check` lists them. The sections these lines speak for are left
 * out of the generic "keys read but not used" warning (ct_rd_drop_explained), so nothing is said
 * twice; what a line does not cover (data_efficiency's other members, say) stays listed there. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/internal.h"

/* One line, and the JSON path of the part of the config it speaks for ("" when none of the
 * generic warning's entries is under it). */
typedef struct item {
    ct_not_yet line;
    const char *covers;
} item;

typedef struct list {
    item *items;
    int n, max;
} list;

static void add(list *l, const char *covers, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add(list *l, const char *covers, const char *path, const char *fmt, ...) {
    if (l->n < l->max) {
        item *it = &l->items[l->n];
        snprintf(it->line.path, sizeof it->line.path, "%s", path);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->line.text, sizeof it->line.text, fmt, ap);
        va_end(ap);
        it->covers = covers;
    }
    l->n++;
}

/* A "checkpoint": true anywhere in the model section (layers, repeats, block types). */
static bool has_checkpoint_mark(const cJSON *v) {
    if (!v) return false;
    if (v->string && strcmp(v->string, "checkpoint") == 0 && cJSON_IsTrue(v)) return true;
    for (const cJSON *c = v->child; c; c = c->next)
        if (has_checkpoint_mark(c)) return true;
    return false;
}

static const cJSON *lookup(const cJSON *root, const char *path);

/* Keys the reader validated (zero.c's CT_U_ rows) and keeps no value of, read back from the
 * document, overrides applied, as the reader took them (pydantic's lax words and numeric strings). */
static bool doc_on(const cJSON *root, const char *path) {
    const cJSON *v = lookup(root, path);
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return ct_rd_lax_bool(v->valuestring) == 1;
    return cJSON_IsTrue(v);
}

static double doc_number(const cJSON *root, const char *path) {
    const cJSON *v = lookup(root, path);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    return cJSON_IsString(v) ? strtod(v->valuestring, NULL) : 0;
}

/* ZeRO++ changes only how stage 3's collectives move bytes between ranks (and, quantized, adds
 * its rounding): DeepSpeed reads it at stage 3 only, and one process has no collectives. */
static void collect_zeropp(const ct_config *cfg, const cJSON *root, list *l) {
    if (cfg->zero.stage != 3 || cfg->world_size <= 1) return;
    static const struct {
        const char *path, *what;   /* the path is also the line's `covers`: static, as add() keeps it */
    } quantized[] = {
        {"zero_optimization.zero_quantized_weights", "the parameters stage 3 all-gathers"},
        {"zero_optimization.zero_quantized_nontrainable_weights", "the frozen parameters stage 3 all-gathers"},
        {"zero_optimization.zero_quantized_gradients", "the gradients stage 3 reduces"},
    };
    for (size_t i = 0; i < sizeof quantized / sizeof quantized[0]; i++) {
        const char *path = quantized[i].path;
        if (doc_on(root, path))
            add(l, path, path,
                "%s true: accepted, not used yet: this version trains without ZeRO++'s quantized communication "
                "(DeepSpeed sends %s as quantized blocks; ctrain sends them at full precision: more bytes between "
                "ranks, no quantization error)", path, quantized[i].what);
    }
    double hpz = doc_number(root, "zero_optimization.zero_hpz_partition_size");
    if (hpz > 1)
        add(l, "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_hpz_partition_size",
            "zero_optimization.zero_hpz_partition_size %.0f: accepted, not used yet: this version trains without "
            "ZeRO++'s hierarchical partitioning (a second copy of the parameters split among %.0f ranks of a node, "
            "so that backward's all-gathers stay inside it); ctrain's all-gathers span every rank",
            hpz, hpz);
}

static void collect(const ct_config *cfg, list *l) {
    const cJSON *root = cfg->doc ? ct_json_root(cfg->doc) : NULL;
    const ct_zero_cfg *z = &cfg->zero;
    const char *ny = "accepted, not used yet: this version trains without";
    /* Stages 1 to 3 partition with several ranks (mpirun); one process has nothing to split, unless
     * it offloads the optimizer to host memory, which the trainer says once it knows the device. */
    if (z->stage >= 1 && cfg->world_size <= 1 && z->offload_optimizer.device == CT_OFFLOAD_NONE)
        add(l, "zero_optimization", "zero_optimization.stage",
            "zero_optimization.stage %d: accepted, not used yet: one process has nothing to partition, so it "
            "trains as stage 0 (it holds all optimizer state, gradients and parameters); under mpirun -np N, "
            "stages 1 and 2 split the fp32 master and optimizer state N ways, and stage 3 the parameters and "
            "gradients too", z->stage);
    /* The reader has already switched off what DeepSpeed ignores: optimizer offload at stage 0,
     * parameter offload below stage 3 (with a warning); parameter offload to NVMe is an error.
     * Optimizer offload (to host memory or NVMe) and parameter offload are done (core/zero/
     * offload.c, partition.c, core/train/nvme.c); the trainer says what they do once it knows the
     * device (on the CPU backend nothing moves). */

    const ct_pending_cfg *p = &cfg->pending;
    /* Activation checkpointing (layers' "checkpoint", number_checkpoints) and its offload
     * (cpu_checkpointing, core/graph/offload.c) are done, and partition_activations is a no-op
     * without model parallelism: no line. Offload without anything checkpointed does nothing. */
    if (p->cpu_checkpointing && p->number_checkpoints <= 0 && !has_checkpoint_mark(cfg->model))
        add(l, "", "activation_checkpointing.cpu_checkpointing",
            "activation_checkpointing.cpu_checkpointing true: does nothing here: no layer is checkpointed, "
            "and offload moves only what checkpointed segments keep for backward to host memory (set "
            "activation_checkpointing.number_checkpoints, or mark layers \"checkpoint\": true)");
    if (p->curriculum && cfg->curriculum.schedule == CT_CURRICULUM_CUSTOM)
        add(l, "curriculum_learning", "curriculum_learning.schedule_type",
            "curriculum_learning.schedule_type custom: %s a custom curriculum (DeepSpeed calls a function of the "
            "user's script for the difficulty; ctrain has none to call, so every step sees full-length "
            "samples)", ny);
    else if (p->curriculum)
        add(l, "curriculum_learning", "curriculum_learning.curriculum_type",
            "curriculum_learning.curriculum_type \"%s\": %s curriculum learning of this type (only \"seqlen\" "
            "cuts sequences, as in DeepSpeed's engine, which leaves other types to the user's model code; every "
            "step sees full-length samples)", cfg->curriculum.type, ny);
    if (p->data_curriculum)
        add(l, "data_efficiency.data_sampling", "data_efficiency.data_sampling.curriculum_learning.enabled",
            "data_efficiency.data_sampling.curriculum_learning.enabled true: %s curriculum data sampling "
            "(batches come from the data loader's shuffle, not by difficulty)", ny);
    /* Switches that cannot change what is trained here (the features that would are refused when
     * the config is read, ds_sections.c). */
    if (p->eigenvalue)
        add(l, "eigenvalue", "eigenvalue.enabled",
            "eigenvalue.enabled true: %s Hessian eigenvalues, which DeepSpeed computes only to schedule "
            "quantize_training (MoQ), not enabled here: training is the same without them", ny);
    if (p->compile)
        add(l, "compile", "compile",
            "compile: %s compiling (ctrain runs its own kernels; there is no PyTorch model for DeepSpeed's "
            "compiler): training is the same without it", ny);
    collect_zeropp(cfg, root, l);
    /* DeepSpeed's engine does not read sparse_attention: it is for the model's own code (its
     * SparseSelfAttention layers, built from this section). ctrain's attention is its own. */
    if (cJSON_IsObject(lookup(root, "sparse_attention")))
        add(l, "sparse_attention", "sparse_attention",
            "sparse_attention: %s block-sparse attention (DeepSpeed hands this section to the model's own "
            "SparseSelfAttention layers; ctrain's attention layers are dense: every position attends to every "
            "earlier one, at dense attention's cost)", ny);
    /* csv_monitor and tensorboard are written (core/report/metrics.h); wandb is not. */
    if (cfg->wandb)
        add(l, "wandb", "wandb.enabled",
            "wandb.enabled true: not supported yet: nothing is sent to Weights & Biases; the metrics are in "
            "<run_dir>/metrics.jsonl (and csv_monitor's CSV files when enabled)");
}

int ct_config_not_yet(const ct_config *cfg, ct_not_yet *out, int max) {
    if (!cfg) return 0;
    item items[CT_NOT_YET_MAX];
    list l = {items, 0, CT_NOT_YET_MAX};
    collect(cfg, &l);
    for (int i = 0; i < l.n && i < max && i < CT_NOT_YET_MAX; i++) out[i] = items[i].line;
    return l.n;
}

/* ------------------------------------------------------------------------------------------ */
/* The generic warning without what the lines above already say                               */

static bool at_or_under(const char *path, const char *prefix) {
    size_t n = strlen(prefix);
    return n && strncmp(path, prefix, n) == 0 && (path[n] == 0 || path[n] == '.');
}

/* The JSON value at a dotted path below root, or NULL. */
static const cJSON *lookup(const cJSON *root, const char *path) {
    char key[256];
    const cJSON *v = root;
    while (v && *path) {
        size_t k = strcspn(path, ".");
        if (k >= sizeof key) return NULL;
        memcpy(key, path, k);
        key[k] = 0;
        v = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, key) : NULL;
        path += k + (path[k] == '.');
    }
    return v;
}

/* Keep `path` in the new list, leave it out when a line covers it, or, when a line covers only
 * part of it, keep its other members one by one ("data_efficiency" -> "data_efficiency.data_routing"). */
static void keep(ct_rd *r, const cJSON *root, const char *path, const item *items, int n, int depth) {
    for (int i = 0; i < n; i++)
        if (at_or_under(path, items[i].covers)) return;
    bool partly = false;
    for (int i = 0; i < n && !partly; i++) partly = at_or_under(items[i].covers, path);
    const cJSON *v = partly ? lookup(root, path) : NULL;
    if (!partly || !cJSON_IsObject(v) || depth > 8) {
        ct_rd_add_unused(r, path);
        return;
    }
    for (const cJSON *m = v->child; m; m = m->next) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s.%s", path, m->string);
        keep(r, root, sub, items, n, depth + 1);
    }
}

void ct_rd_drop_explained(ct_rd *r) {
    item items[CT_NOT_YET_MAX];
    list l = {items, 0, CT_NOT_YET_MAX};
    collect(r->cfg, &l);
    if (l.n == 0 || r->n_unused == 0) return;
    char **old = r->unused;
    int n_old = r->n_unused;
    r->unused = NULL;
    r->n_unused = r->cap_unused = 0;
    const cJSON *root = r->cfg->doc ? ct_json_root(r->cfg->doc) : NULL;
    for (int i = 0; i < n_old; i++) {
        keep(r, root, old[i], items, l.n < CT_NOT_YET_MAX ? l.n : CT_NOT_YET_MAX, 0);
        free(old[i]);
    }
    free(old);
}

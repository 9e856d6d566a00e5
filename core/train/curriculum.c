/* curriculum.c: curriculum learning by sequence length (DeepSpeed's legacy curriculum_learning
 * with curriculum_type "seqlen"): every training step's samples are cut to the length the
 * schedule gives for that step, as DeepSpeed's engine passes curriculum_seqlen to the model,
 * which keeps tokens[:, :seqlen] and labels[:, :seqlen]. Eval runs at full length.
 *
 * Shapes stay static per graph: each length gets its own graph, built the first time a step
 * needs it, sharing the parameter store and the full-length graph's activation arena (a shorter
 * sequence plans fewer bytes; a graph that would not fit gets an arena of its own), and its own
 * step runner, so a captured step is replayed per length. A truncated micro-batch is copied
 * into a [micro, T] buffer of backend memory (token ids and labels move as 4-byte words). */
#include <stdlib.h>
#include <string.h>

#include "core/optim/sched.h"
#include "core/train/internal.h"

int ct_curriculum_check(const ct_config *cfg, const ct_graph *g, ct_err *err) {
    if (!ct_curriculum_acts(cfg)) return CT_OK;
    const ct_curriculum_cfg *c = &cfg->curriculum;
    const ct_graph_info *gi = ct_graph_info_get(g);
    if (gi->input_dtype != CT_I32 || gi->input_shape.ndim != 1 || gi->target_dtype != CT_I32 ||
        gi->target_shape.ndim != 1 || gi->target_shape.d[0] != gi->input_shape.d[0])
        return ct_errf(err, CT_ERR_CONFIG, "%s: curriculum_learning (seqlen) cuts token sequences: the model "
                       "must take token ids [T] and predict a token per position (a language model such as "
                       "configs/tiny_lm.json); disable curriculum_learning for this model", cfg->path);
    int64_t T = gi->input_shape.d[0];
    if (c->max_difficulty > T || c->min_difficulty < 1 || c->min_difficulty > c->max_difficulty)
        return ct_errf(err, CT_ERR_CONFIG, "%s: curriculum_learning: min_difficulty %ld and max_difficulty %ld "
                       "must satisfy 1 <= min <= max <= the model's sequence length %lld (model.input)",
                       cfg->path, c->min_difficulty, c->max_difficulty, (long long)T);
    for (int i = 0; c->schedule == CT_CURRICULUM_FIXED_DISCRETE && i < c->stages; i++)
        if (c->difficulty[i] < 1 || c->difficulty[i] > T)
            return ct_errf(err, CT_ERR_CONFIG, "%s: curriculum_learning.schedule_config.difficulty[%d] = %ld is "
                           "not a sequence length in [1, %lld] (model.input)", cfg->path, i, c->difficulty[i],
                           (long long)T);
    /* one set of weights must serve every length: build (pure) at the shortest and compare */
    ct_graph *short_g = NULL;
    int rc = ct_graph_build_seq(cfg, 1, ct_graph_compute_dtype(g), c->min_difficulty, &short_g, err);
    if (!rc && !ct_param_layout_same(ct_graph_layout(short_g), ct_graph_layout(g)))
        rc = ct_errf(err, CT_ERR_CONFIG, "%s: curriculum_learning: the model's parameters change with the "
                     "sequence length (at %ld positions they differ from model.input's); size position tables "
                     "by max_len (position_embedding) so one set of weights serves every length", cfg->path,
                     c->min_difficulty);
    ct_graph_free(short_g);
    return rc;
}

int ct_curriculum_setup(ct_trainer *t, ct_err *err) {
    ct_trainer_curriculum *cu = &t->cur;
    cu->len = t->m.info->input_shape.d[0];
    if (!ct_curriculum_acts(t->cfg)) return CT_OK;
    int rc = ct_curriculum_check(t->cfg, t->m.g, err);
    if (rc) return rc;
    size_t bytes = (size_t)(t->cfg->micro_batch * cu->len) * sizeof(int32_t);
    cu->input = t->be->mem.alloc(t->be, bytes, CT_MEM_ACTIVATIONS);
    cu->target = t->be->mem.alloc(t->be, bytes, CT_MEM_ACTIVATIONS);
    if (!cu->input || !cu->target)
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating the curriculum's truncated batch (2 x %zu "
                       "bytes on %s)", bytes, t->be->name);
    cu->len = t->cfg->curriculum.min_difficulty;
    cu->at_step = 0;
    return CT_OK;
}

bool ct_curriculum_acts(const ct_config *cfg) {
    return cfg->curriculum.enabled && strcmp(cfg->curriculum.type, "seqlen") == 0 &&
           cfg->curriculum.schedule != CT_CURRICULUM_CUSTOM;
}

int64_t ct_curriculum_len(ct_trainer *t, long step) {
    const ct_curriculum_cfg *c = &t->cfg->curriculum;
    ct_trainer_curriculum *cu = &t->cur;
    if (!ct_curriculum_acts(t->cfg)) return cu->len;
    if (step < cu->at_step) cu->len = c->min_difficulty, cu->at_step = 0;   /* replay from the start */
    /* DeepSpeed updates the difficulty once per step and keeps it once it reached the maximum:
     * walking every step (a resume walks from 0) gives the same length as the run it continues */
    for (long s = cu->at_step + 1; s <= step; s++) cu->len = ct_curriculum_difficulty(c, s, cu->len);
    cu->at_step = step;
    return cu->len;
}

/* The graph (and step runner) for sequences of len positions; the full-length one at T. */
int ct_curriculum_graph(ct_trainer *t, int64_t len, ct_graph **g, ct_step_runner **runner, ct_err *err) {
    ct_trainer_curriculum *cu = &t->cur;
    if (len == t->m.info->input_shape.d[0]) {
        *g = t->m.g, *runner = &t->m.runner;
        return CT_OK;
    }
    for (int i = 0; i < cu->n; i++)
        if (cu->graphs[i].len == len) {
            *g = cu->graphs[i].g, *runner = &cu->graphs[i].runner;
            return CT_OK;
        }
    ct_graph *ng = NULL;
    int rc = ct_graph_build_seq(t->cfg, t->cfg->micro_batch, ct_graph_compute_dtype(t->m.g), len, &ng, err);
    if (!rc && !ct_param_layout_same(ct_graph_layout(ng), ct_graph_layout(t->m.g)))   /* checked at setup */
        rc = ct_errf(err, CT_ERR_RUNTIME, "curriculum: the graph for %lld positions has other parameters",
                     (long long)len);
    bool fits = !rc && ct_graph_plan(ng)->total <= ct_graph_plan(t->m.g)->total;
    if (!rc) rc = ct_graph_bind(ng, t->be, fits ? ct_graph_arena(t->m.g) : NULL, err);
    char notice[256];
    ct_seq_graph sg = {.len = len, .g = ng};
    if (!rc) rc = ct_step_runner_init(&sg.runner, t->be, ng, t->cfg->train.cuda_graph, notice, sizeof notice, err);
    if (rc) {
        ct_graph_free(ng);
        return rc;
    }
    sg.runner.timed = t->cfg->wall_clock_breakdown;
    cu->graphs = ct_xrealloc(cu->graphs, sizeof *cu->graphs * (size_t)(cu->n + 1));
    cu->graphs[cu->n++] = sg;
    *g = ng, *runner = &cu->graphs[cu->n - 1].runner;
    return CT_OK;
}

void ct_curriculum_cut(ct_trainer *t, const void *input, const void *target, int64_t n, int64_t len,
                       const void **input_out, const void **target_out) {
    ct_backend *be = t->be;
    int64_t T = t->m.info->input_shape.d[0];
    *input_out = input, *target_out = target;
    if (len >= T) return;
    /* int32 ids as fp32 words: copy_rows without accumulate moves the bits untouched */
    be->elt.copy_rows(be, t->cur.input, len, input, T, n, len, false, CT_F32);
    be->elt.copy_rows(be, t->cur.target, len, target, T, n, len, false, CT_F32);
    *input_out = t->cur.input, *target_out = t->cur.target;
}

void ct_curriculum_free(ct_trainer *t) {
    ct_trainer_curriculum *cu = &t->cur;
    for (int i = 0; i < cu->n; i++) {
        ct_step_runner_reset(&cu->graphs[i].runner);
        ct_graph_free(cu->graphs[i].g);
    }
    free(cu->graphs);
    if (cu->input) t->be->mem.free(t->be, cu->input);
    if (cu->target) t->be->mem.free(t->be, cu->target);
    memset(cu, 0, sizeof *cu);
}

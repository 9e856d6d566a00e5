/* profiler.c: flops_profiler: at flops_profiler.profile_step, every layer's forward and backward
 * timed with executor hooks, then the table of core/report/profile.h.
 *
 * The timing goes through the backend's timer marks (backend.h timer_mark/timer_elapsed): a mark
 * before a layer (after the trainer's own prepare hook, so a gather it does is not the layer's
 * time) and one after its work is queued, read at once. On the CPU a mark is the clock and ops
 * have finished when they return. On CUDA a mark is an event recorded on the compute stream and
 * reading it waits for the stream to pass it: the profiled step syncs the host once per layer,
 * which costs that step some overlap but leaves each layer's time the device time between its
 * two events; nothing else is needed there. The profiled step is never replayed from a capture
 * (hooks.host_work), since a replay runs no hooks, and its phases are left out of
 * wall_clock_breakdown's window (its marks recycle the ring the breakdown's marks live in). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/report/profile.h"
#include "core/train/internal.h"

struct ct_profiler {
    const ct_flops_profiler_cfg *cfg;
    ct_backend *be;
    const ct_exec_hooks *inner;  /* the trainer's own hooks, run inside the profiler's */
    ct_exec_hooks hooks;
    const ct_graph *g;           /* the graph of the profiled step (curriculum: its length's) */
    int n;                       /* its layers */
    uint64_t *mark;              /* [n] the mark taken when layer j began */
    double *fwd_s, *bwd_s;       /* [n] sums over the step's micro-batches */
    bool done;                   /* the profile was reported (one per run) */
};

static int prof_prepare(void *ctx, int j, ct_pass pass, struct ct_layer_io *io, ct_err *err) {
    ct_profiler *p = ctx;
    if (p->inner->prepare) {
        int rc = p->inner->prepare(p->inner->ctx, j, pass, io, err);
        if (rc) return rc;
    }
    if (j >= 0 && j < p->n) p->mark[j] = p->be->queue.timer_mark(p->be);
    return CT_OK;
}

static int prof_after(void *ctx, int j, ct_pass pass, const struct ct_layer_io *io, ct_err *err) {
    ct_profiler *p = ctx;
    if (j >= 0 && j < p->n) {
        double s = p->be->queue.timer_elapsed(p->be, p->mark[j], p->be->queue.timer_mark(p->be));
        if (s > 0) *(pass == CT_PASS_FORWARD ? &p->fwd_s[j] : &p->bwd_s[j]) += s;
    }
    return p->inner->after ? p->inner->after(p->inner->ctx, j, pass, io, err) : CT_OK;
}

int ct_trainer_profiler_open(ct_trainer *t, ct_err *err) {
    const ct_flops_profiler_cfg *c = &t->cfg->flops_profiler;
    if (!c->enabled || (t->comm && t->comm->rank != 0)) return CT_OK;
    if (!t->be->queue.timer_mark || !t->be->queue.timer_elapsed) {
        ct_report_line(&t->obs.rep, "flops profiler: the %s backend has no timer marks; no profile", t->be->name);
        return CT_OK;
    }
    if (c->profile_step > t->d.total_steps) {
        fprintf(stderr, "ctrain: warning: flops_profiler.profile_step %ld is past the run's %ld steps: no profile\n",
                c->profile_step, t->d.total_steps);
        return CT_OK;
    }
    if (c->output_file[0]) {   /* an unwritable file is found now, not after the step */
        FILE *f = fopen(c->output_file, "a");
        if (!f)
            return ct_errf(err, CT_ERR_CONFIG, "flops_profiler.output_file \"%s\": %s", c->output_file,
                           strerror(errno));
        fclose(f);
    }
    ct_profiler *p = ct_xcalloc(1, sizeof *p);
    p->cfg = c;
    p->be = t->be;
    p->inner = &t->m.hooks;
    p->hooks = (ct_exec_hooks){.ctx = p, .prepare = prof_prepare, .after = prof_after, .host_work = true};
    t->obs.prof = p;
    return CT_OK;
}

const ct_exec_hooks *ct_trainer_profiler_hooks(ct_trainer *t, long step, const ct_graph *g) {
    ct_profiler *p = t->obs.prof;
    if (!p || p->done || step != p->cfg->profile_step) return &t->m.hooks;
    if (p->g != g) {   /* the first micro-batch of the step */
        p->g = g;
        p->n = ct_graph_info_get(g)->n_layers;
        free(p->mark), free(p->fwd_s), free(p->bwd_s);
        p->mark = ct_xcalloc((size_t)p->n, sizeof *p->mark);
        p->fwd_s = ct_xcalloc((size_t)p->n, sizeof *p->fwd_s);
        p->bwd_s = ct_xcalloc((size_t)p->n, sizeof *p->bwd_s);
    }
    return &p->hooks;
}

bool ct_trainer_profiler_step(const ct_trainer *t, long step) {
    const ct_profiler *p = t->obs.prof;
    return p && !p->done && p->g && step == p->cfg->profile_step;
}

static void to_report(void *ctx, const char *text) { ct_report_line(ctx, "%s", text); }
static void to_file(void *ctx, const char *text) { fprintf(ctx, "%s\n", text); }

void ct_trainer_profiler_report(ct_trainer *t, long step, int64_t samples, double step_s) {
    ct_profiler *p = t->obs.prof;
    if (!ct_trainer_profiler_step(t, step)) return;
    p->done = true;
    ct_profile_row *rows = ct_xcalloc((size_t)p->n, sizeof *rows);
    for (int j = 0; j < p->n; j++) {
        ct_profile_row *r = &rows[j];
        snprintf(r->name, sizeof r->name, "%s", ct_graph_layer_name(p->g, j));
        snprintf(r->type, sizeof r->type, "%s", ct_graph_layer_type(p->g, j));
        r->layers = 1;
        r->params = ct_graph_layer_params(p->g, j);
        r->fwd_flops = ct_graph_layer_flops(p->g, j) * (double)samples;
        r->fwd_s = p->fwd_s[j];
        r->bwd_s = p->bwd_s[j];
    }
    int n = ct_profile_group(rows, p->n, p->cfg->module_depth);
    ct_profile_info info = {.step = step, .samples = samples, .step_s = step_s,
                            .train_flops = ct_graph_train_flops_per_sample(p->g) * (double)samples,
                            .peak_flops = t->obs.rep.peak_flops, .device = t->be->device_desc,
                            .top_modules = p->cfg->top_modules, .detailed = p->cfg->detailed};
    const char *path = p->cfg->output_file;
    FILE *f = path[0] ? fopen(path, "w") : NULL;
    if (f) {
        ct_profile_write(&info, rows, n, to_file, f);
        if (fclose(f) == 0) ct_report_line(&t->obs.rep, "flops profiler: step %ld written to %s", step, path);
        else fprintf(stderr, "ctrain: warning: flops_profiler.output_file %s: %s\n", path, strerror(errno));
    } else {
        if (path[0]) fprintf(stderr, "ctrain: warning: flops_profiler.output_file %s: %s; the profile follows "
                             "here\n", path, strerror(errno));
        ct_profile_write(&info, rows, n, to_report, &t->obs.rep);
    }
    free(rows);
}

void ct_trainer_profiler_close(ct_trainer *t) {
    ct_profiler *p = t->obs.prof;
    if (!p) return;
    free(p->mark), free(p->fwd_s), free(p->bwd_s);
    free(p);
    t->obs.prof = NULL;
}

/* segments.c: which layers activation checkpointing recomputes. A segment is a run of layers
 * [lo, hi) that keeps only what enters it (and what leaves it) through backward: plan.c counts
 * its inner outputs and saved state busy only in forward and again from the recompute, so other
 * buffers use their bytes in between, and the executor runs the segment's forward again
 * (CT_PASS_RECOMPUTE) right before its backward (exec.c).
 *
 * Segments come from the config in one of two ways, never both:
 * - layers marked "checkpoint": true: each run of consecutive marked layers expanded in the same
 *   block instance (one iteration of a "repeat", one transformer_block, or the top level between
 *   blocks) is one segment, so a checkpointed transformer_block is a segment per block;
 * - activation_checkpointing.number_checkpoints N over an unmarked model: N segments of (as
 *   nearly as possible) equal layer counts.
 * The last layer never belongs to a segment: its output holds the loss's gradient once the loss
 * has run (plan.c writes it over the logits), and recomputing it there would overwrite that.
 *
 * The recompute runs only the layers of a segment that backward needs (ct_graph_mark_recompute):
 * one whose saved state (aux: dropout masks, normalisation statistics, attention's log-sum-exp)
 * only forward makes; one whose output a backward in the segment reads (its own, or a reader's
 * that reads its input), unless that output is kept anyway; and the producers those read. In a
 * checkpointed transformer_block that leaves out fc2 and res2: fc2's output is read only by the
 * residual add, whose backward copies dy, and res2's is the kept block output. */
#include <stdlib.h>

#include "core/graph/internal.h"

static void add_segment(ct_graph *g, int lo, int hi) {
    if (hi > g->n_nodes - 1) hi = g->n_nodes - 1;   /* never the last layer (see above) */
    if (hi <= lo) return;
    g->segs = ct_xrealloc(g->segs, sizeof(ct_ckpt_seg) * (size_t)(g->n_segs + 1));
    g->segs[g->n_segs++] = (ct_ckpt_seg){lo, hi};
}

static void segments_from_marks(ct_graph *g) {
    for (int j = 0; j < g->n_nodes;) {
        if (!g->nodes[j].l.checkpoint) {
            j++;
            continue;
        }
        int lo = j;
        while (j < g->n_nodes && g->nodes[j].l.checkpoint && g->nodes[j].group == g->nodes[lo].group) j++;
        add_segment(g, lo, j);
    }
}

static void even_segments(ct_graph *g, long n_segments) {
    int64_t layers = g->n_nodes - 1;   /* all but the last */
    if (layers < 1) return;
    int64_t n = n_segments < layers ? n_segments : layers;
    for (int64_t k = 0; k < n; k++) add_segment(g, (int)(k * layers / n), (int)((k + 1) * layers / n));
}

int ct_graph_segments(ct_graph *g, const ct_config *cfg, long choice, ct_err *err) {
    for (int j = 0; j < g->n_nodes; j++) g->nodes[j].seg = -1;
    if (choice != CT_SEGMENTS_CONFIG) {   /* a planned alternative: the marks do not count */
        if (choice > 0) even_segments(g, choice);
        for (int s = 0; s < g->n_segs; s++)
            for (int j = g->segs[s].lo; j < g->segs[s].hi; j++) g->nodes[j].seg = s;
        return CT_OK;
    }
    const ct_layer *marked = NULL;
    for (int j = 0; j < g->n_nodes && !marked; j++)
        if (g->nodes[j].l.checkpoint) marked = &g->nodes[j].l;
    long n = cfg->pending.number_checkpoints;
    if (marked && n > 0)
        return ct_layer_errf(marked, err, NULL, "\"checkpoint\": true and activation_checkpointing."
                             "number_checkpoints %ld both choose the segments to recompute; use one "
                             "(remove number_checkpoints to keep the marked layers)", n);
    if (marked) segments_from_marks(g);
    else if (n > 0) even_segments(g, n);
    for (int s = 0; s < g->n_segs; s++)
        for (int j = g->segs[s].lo; j < g->segs[s].hi; j++) g->nodes[j].seg = s;
    /* activation_checkpointing.profile: the executor adds each segment's times here */
    if (cfg->pending.profile && g->n_segs > 0) g->seg_times = ct_xcalloc((size_t)g->n_segs, sizeof(ct_segment_times));
    return CT_OK;
}

/* Whether segment layer j (the segment ends before hi) must run again in its recompute, its
 * readers in the segment (after it) decided already. */
static bool needs_recompute(const ct_graph *g, const int *alias, int j, int hi) {
    const ct_gnode *gn = &g->nodes[j];
    if (gn->l.type->aux_bytes) return true;   /* its saved state: only forward makes it */
    for (int k = j + 1; k < hi; k++)          /* one running in place over it starts from its output */
        if (alias[k] == j && g->nodes[k].recomputed) return true;
    if (gn->kept) return false;               /* its output is there through backward */
    if (gn->runs_backward && gn->l.type->backward_reads_output) return true;
    for (int k = j + 1; k < hi; k++) {
        const ct_gnode *r = &g->nodes[k];
        bool reads = false;
        for (int i = 0; i < r->l.n_in; i++) reads |= r->l.in_from[i] == j;
        if (reads && (r->recomputed || (r->runs_backward && ct_layer_backward_reads_input(&r->l)))) return true;
    }
    return false;
}

void ct_graph_mark_recompute(ct_graph *g, const int *alias) {
    for (int j = 0; j < g->n_nodes; j++) g->nodes[j].recomputed = false;
    for (int s = 0; s < g->n_segs; s++) {
        int lo = g->segs[s].lo, hi = g->segs[s].hi;
        for (int j = hi - 1; j >= lo; j--) g->nodes[j].recomputed = needs_recompute(g, alias, j, hi);
        /* A recomputed layer writes its output again into the buffer that the layers running in
         * place over it (in the segment: plan.c) then hold their own outputs in: they run again
         * after it, so the buffer ends with the value their backwards read. */
        for (int j = lo; j < hi; j++)
            if (alias[j] >= 0 && g->nodes[alias[j]].recomputed) g->nodes[j].recomputed = true;
    }
}

int ct_graph_blocks(const ct_graph *g) {
    /* group ids grow along the layers, so a new id starts a new instance */
    int n = 0, last = -1;
    for (int j = 0; j < g->n_nodes; j++)
        if (g->nodes[j].in_block && g->nodes[j].group != last) {
            last = g->nodes[j].group;
            n++;
        }
    return n;
}

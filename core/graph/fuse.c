/* fuse.c: layers that run as one, decided when the graph is bound to a backend.
 *
 * An element-wise activation that runs in place over its producer's output (plan.c: y_from, so
 * the producer's output has no other reader) is applied by the producer itself when the
 * producer's type can do that on this backend (fuse_act: the CPU's conv2d + relu): in forward
 * where the producer writes its output, in backward where it reads its output gradient, masked
 * with the activation's output. The activations are then read and written once less per pass,
 * and the results are the same bits (backend.h, conv2d_act_forward). The activation layer keeps
 * its place in the walk and its hooks (profiler, ZeRO) but computes nothing; its input gradient,
 * the producer's dy, is then never written, and the producer's backward reads the activation's
 * dy instead (exec.c).
 *
 * Not fused: layers in checkpointed segments (a recompute runs a segment's layers one by one),
 * and a pair whose backward would not run together (one of them gets no gradient). */
#include "core/graph/internal.h"

static bool fusable(const ct_graph *g, int j, int src, ct_act act) {
    const ct_gnode *a = &g->nodes[j], *p = &g->nodes[src];
    return act != CT_ACT_NONE && p->l.type->fuse_act && p->fused_with < 0 && a->seg < 0 && p->seg < 0 &&
           a->runs_backward == p->runs_backward && a->l.n_in == 1 && a->tmp_off[0] < 0 &&
           p->l.type->fuse_act(&p->l, g->be, act);
}

void ct_graph_fuse(ct_graph *g) {
    for (int j = 0; j < g->n_nodes; j++) {
        g->nodes[j].fused_with = g->nodes[j].fused_into = -1;
        g->nodes[j].fused_act = CT_ACT_NONE;
    }
    for (int j = 0; j < g->n_nodes; j++) {
        ct_gnode *a = &g->nodes[j];
        int src = a->y_from;
        if (src < 0 || !a->l.type->fusable_act) continue;
        ct_act act = a->l.type->fusable_act(&a->l);
        if (!fusable(g, j, src, act)) continue;
        a->fused_into = src;
        g->nodes[src].fused_with = j;
        g->nodes[src].fused_act = act;
    }
}

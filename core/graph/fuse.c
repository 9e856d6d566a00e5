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
 * A 2x2 max-pool that is the activation's only reader is taken over too where the producer's type
 * can (fuse_pool: the CPU's conv2d + relu): per image, the pool runs over the activation while it
 * is in cache, and backward puts the pool's gradient at the argmax of each window, masked, in the
 * producer's scratch. The activation itself is then neither written nor read. The pool's output,
 * argmax and gradient are written in the producer's forward and read in its backward: plan.c
 * keeps them busy that long wherever the graph's shape allows the fusion (ct_graph_pool_producer),
 * so that the plan does not depend on the backend.
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

/* The number of layers reading layer j's output. */
static int readers(const ct_graph *g, int j) {
    int n = 0;
    for (int k = j + 1; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].l.n_in; i++) n += g->nodes[k].l.in_from[i] == j;
    return n;
}

int ct_graph_pool_producer(const ct_graph *g, int q) {
    const ct_gnode *pool = &g->nodes[q];
    if (!pool->l.type->fusable_pool || pool->l.n_in != 1 || pool->l.in_from[0] < 0 ||
        !pool->l.type->fusable_pool(&pool->l))
        return -1;
    int a = pool->l.in_from[0];
    const ct_gnode *act = &g->nodes[a];
    int src = act->y_from;
    if (src < 0 || !act->l.type->fusable_act || act->l.type->fusable_act(&act->l) == CT_ACT_NONE) return -1;
    const ct_gnode *p = &g->nodes[src];
    bool together = pool->seg < 0 && act->seg < 0 && p->seg < 0 && pool->runs_backward == act->runs_backward &&
                    act->runs_backward == p->runs_backward && pool->tmp_off[0] < 0 && act->tmp_off[0] < 0;
    return together && p->l.type->fuse_pool && p->l.type->fuse_act && readers(g, a) == 1 ? src : -1;
}

void ct_graph_fuse(ct_graph *g) {
    for (int j = 0; j < g->n_nodes; j++) {
        g->nodes[j].fused_with = g->nodes[j].fused_into = g->nodes[j].fused_pool = -1;
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
    for (int q = 0; q < g->n_nodes; q++) {
        int src = ct_graph_pool_producer(g, q);
        if (src < 0 || g->nodes[src].fused_with != g->nodes[q].l.in_from[0] ||
            !g->nodes[src].l.type->fuse_pool(&g->nodes[src].l, g->be))
            continue;
        g->nodes[q].fused_into = src;
        g->nodes[src].fused_pool = q;
    }
}

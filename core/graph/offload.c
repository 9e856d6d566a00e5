/* offload.c: activation offload (activation_checkpointing.cpu_checkpointing, as DeepSpeed's
 * "move checkpointed activations to CPU").
 *
 * With checkpointing, what backward needs of a checkpointed segment is what it keeps: its last
 * output and any output read after it (gn->kept, plan.c). Without offload each of those has its
 * own device buffer for the whole step. With offload a kept output is used on the device only
 * twice: in forward, from its layer to its last reader, and in backward, from the first
 * recompute or backward that reads it to the last. In between it waits in pinned host memory, so
 * kept outputs share device slots by lifetime: intervals on the step's schedule (recompute
 * included), coloured greedily, best fit.
 *
 * The copies are the backend's asynchronous download and upload. A copy call makes the compute
 * work queued after it wait for the copy, and its `after` mark lets the copy start earlier, so
 * each copy is called as late as possible and marked as early as possible:
 * - download: marked when the value is final (its last writer), called once the segment after
 *   its last reader has run forward (its slot is not reused before), so it overlaps that work;
 * - upload: marked when backward enters the segment above the one that first needs it (its slot
 *   is free from there), called right before the first use, so it overlaps that segment's
 *   recompute and backward: one segment of prefetch.
 * A kept output that nothing would run around while it is away (the top segment's, read by the
 * head) is not moved: it keeps its slot from its forward to its last backward use. */
#include <limits.h>
#include <stdlib.h>

#include "core/graph/internal.h"

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* The step on one time axis: forward layer j at time j, the loss at n, then backward as exec.c
 * walks it (entering a segment from above recomputes its layers, then each layer's backward). */
static void schedule(ct_graph *g) {
    int n = g->n_nodes, t = n + 1;
    for (int j = 0; j < n; j++) g->nodes[j].t_recompute = -1;
    for (int j = n - 1; j >= 0; j--) {
        ct_gnode *gn = &g->nodes[j];
        if (gn->seg >= 0 && j == g->segs[gn->seg].hi - 1)
            for (int r = g->segs[gn->seg].lo; r <= j; r++) g->nodes[r].t_recompute = t++;
        gn->t_backward = t++;
    }
}

/* A closed interval of schedule times; empty while hi < lo. */
typedef struct span {
    int lo, hi;
} span;

static void touch(span *s, int t) {
    if (t < 0) return;
    if (t < s->lo) s->lo = t;
    if (t > s->hi) s->hi = t;
}

static bool overlap(span a, span b) { return a.lo <= b.hi && b.lo <= a.hi; }

/* When the buffer of owner o (every layer j with root[j] == o writes it: o and the layers running
 * in place over it) is used: in forward (writes, reads) and from the loss on (recomputes that
 * write or read it, backwards of its writers and readers). *written: the last forward writer. */
static void uses(const ct_graph *g, const int *root, int o, span *fw, span *bw, int *written) {
    int n = g->n_nodes;
    *fw = *bw = (span){INT_MAX, -1};
    *written = o;
    for (int j = o; j < n; j++) {
        const ct_gnode *gn = &g->nodes[j];
        bool member = root[j] == o, reads = false;
        for (int i = 0; i < gn->l.n_in; i++) reads |= gn->l.in_from[i] >= 0 && root[gn->l.in_from[i]] == o;
        if (!member && !reads) continue;
        if (member) *written = j;
        touch(fw, j);
        touch(bw, gn->t_recompute);
        if (gn->runs_backward) touch(bw, gn->t_backward);
        if (member && j == n - 1) touch(bw, n);   /* the loss reads the last output */
    }
}

/* When recomputing segment s starts. */
static int recompute_start(const ct_graph *g, int s) { return g->nodes[g->segs[s].lo].t_recompute; }

/* Where item `it` may leave and come back (see the top of the file); false when it stays. */
static bool plan_moves(const ct_graph *g, ct_offload_item *it, span fw, span bw) {
    int n = g->n_nodes;
    it->download_at = fw.hi;
    for (int s = 0; s < g->n_segs; s++)
        if (g->segs[s].lo > fw.hi) {
            it->download_at = g->segs[s].hi - 1;
            break;
        }
    if (bw.hi < 0 || bw.lo <= n) return false;
    /* the segment backward is in when the item is first needed, and the one before it */
    int here = -1, mark = n + 1;
    for (int s = 0; s < g->n_segs; s++) {
        int rs = recompute_start(g, s);
        if (rs <= bw.lo && rs > here) here = rs;
    }
    for (int s = 0; s < g->n_segs; s++) {
        int rs = recompute_start(g, s);
        if (here >= 0 && rs < here && rs > mark) mark = rs;
    }
    it->upload_at = bw.lo;
    it->upload_mark = mark < bw.lo ? mark : bw.lo;
    for (int s = 0; s < g->n_segs; s++)   /* does any segment run while it is away? */
        if (g->segs[s].lo > it->download_at || recompute_start(g, s) < it->upload_mark) return true;
    return false;
}

/* A device slot: its size and the intervals it is busy. */
typedef struct slot {
    size_t size;
    span *busy;
    int n_busy;
} slot;

static bool slot_free(const slot *s, const span *want, int n_want) {
    for (int i = 0; i < s->n_busy; i++)
        for (int k = 0; k < n_want; k++)
            if (overlap(s->busy[i], want[k])) return false;
    return true;
}

size_t ct_offload_plan(ct_graph *g, const int *alias, size_t *host) {
    int n = g->n_nodes;
    schedule(g);
    free(g->off);
    g->off = NULL;
    g->n_off = 0;
    *host = 0;
    if (!g->offload || g->n_segs == 0) return 0;
    int *root = ct_xmalloc(sizeof(int) * (size_t)n);
    for (int j = 0; j < n; j++) root[j] = alias[j] < 0 ? j : root[alias[j]];
    g->off = ct_xcalloc((size_t)n, sizeof(ct_offload_item));
    slot *slots = ct_xcalloc((size_t)n, sizeof(slot));
    int n_slots = 0;
    size_t esz = ct_dtype_size(g->dt);
    for (int o = 0; o < n; o++) {
        const ct_gnode *gn = &g->nodes[o];
        if (gn->seg < 0 || !gn->kept || alias[o] >= 0) continue;
        ct_offload_item *it = &g->off[g->n_off++];
        *it = (ct_offload_item){.owner = o, .bytes = (size_t)(g->batch * ct_layer_out_numel(&gn->l)) * esz};
        span fw, bw, want[2];
        uses(g, root, o, &fw, &bw, &it->written);
        it->moved = plan_moves(g, it, fw, bw);
        int n_want = 1;
        if (it->moved) {
            want[0] = (span){o, it->download_at};
            want[1] = (span){it->upload_mark, bw.hi};
            n_want = 2;
            it->host_off = *host;
            *host += align64(it->bytes);
        } else {
            want[0] = (span){o, fw.hi > bw.hi ? fw.hi : bw.hi};
        }
        /* best fit among the free slots, else the largest free one grown, else a new one */
        int best = -1;
        size_t need = align64(it->bytes);
        for (int s = 0; s < n_slots; s++) {
            if (!slot_free(&slots[s], want, n_want)) continue;
            bool fits = slots[s].size >= need, best_fits = best >= 0 && slots[best].size >= need;
            if (best < 0 || (fits && (!best_fits || slots[s].size < slots[best].size)) ||
                (!fits && !best_fits && slots[s].size > slots[best].size))
                best = s;
        }
        if (best < 0) best = n_slots++;
        if (slots[best].size < need) slots[best].size = need;
        slot *sl = &slots[best];
        sl->busy = ct_xrealloc(sl->busy, sizeof(span) * (size_t)(sl->n_busy + n_want));
        for (int k = 0; k < n_want; k++) sl->busy[sl->n_busy++] = want[k];
        it->slot = (size_t)best;   /* a slot index until the offsets are known */
    }
    size_t *at = ct_xmalloc(sizeof(size_t) * (size_t)(n_slots ? n_slots : 1)), total = 0;
    for (int s = 0; s < n_slots; s++) {
        at[s] = total;
        total += slots[s].size;
        free(slots[s].busy);
    }
    for (int i = 0; i < g->n_off; i++) g->off[i].slot = at[g->off[i].slot];
    free(at), free(slots), free(root);
    return total;
}

/* The marks and copies due at time t of the step, downloads (forward) or uploads (backward): a
 * copy waits for its item's mark, and copies the first n samples (a short micro-batch's). */
static void copies_due(ct_graph *g, bool down, int t, int64_t n) {
    ct_backend *be = g->be;
    for (int i = 0; i < g->n_off; i++) {
        ct_offload_item *it = &g->off[i];
        if (!it->moved) continue;
        if ((down ? it->written : it->upload_mark) == t) it->mark = be->queue.compute_mark(be);
        if ((down ? it->download_at : it->upload_at) != t) continue;
        void *host = (char *)g->host + it->host_off, *dev = g->nodes[it->owner].y;
        size_t bytes = it->bytes / (size_t)g->batch * (size_t)n;
        if (down) be->queue.download(be, host, dev, bytes, it->mark);
        else be->queue.upload(be, dev, host, bytes, it->mark);
        it->mark = 0;
    }
}

void ct_offload_after_forward(ct_graph *g, int j, int64_t n) { copies_due(g, true, j, n); }

void ct_offload_before(ct_graph *g, int t, int64_t n) { copies_due(g, false, t, n); }

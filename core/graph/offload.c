/* offload.c: activation offload (activation_checkpointing.cpu_checkpointing, as DeepSpeed's
 * "move checkpointed activations to CPU").
 *
 * With checkpointing, what backward needs of a checkpointed segment is what it keeps: its last
 * output and any output read after it (gn->kept, plan.c). Without offload each of those is busy
 * on the device from its forward to its last use in backward. With offload a kept output is used on the device only
 * twice: in forward, from its layer to its last reader, and in backward, from the first
 * recompute or backward that reads it to the last. In between it waits in pinned host memory, so
 * its device bytes are busy over those two intervals of the step's schedule only, and plan.c
 * places it with every other buffer by lifetime.
 *
 * The copies are the backend's asynchronous download and upload. A copy call makes the compute
 * work queued after it wait for the copy, and its `after` mark lets the copy start earlier, so
 * each copy is called as late as possible and marked as early as possible:
 * - download: marked when the value is final (its last writer), called once the segment after
 *   its last reader has run forward (its bytes are not reused before), so it overlaps that work;
 * - upload: marked when backward enters the segment above the one that first needs it (its bytes
 *   are free from there), called right before the first use, so it overlaps that segment's
 *   recompute and backward: one segment of prefetch.
 * A kept output that nothing would run around while it is away (the top segment's, read by the
 * head) is not moved: plan.c places it as any other output. */
#include <stdlib.h>

#include "core/graph/internal.h"

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Where item `it` may leave and come back (see the top of the file); false when it stays. */
static bool plan_moves(const ct_graph *g, ct_offload_item *it, ct_span fw, ct_span bw) {
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
        int rs = ct_segment_entry(g, s);
        if (rs <= bw.lo && rs > here) here = rs;
    }
    for (int s = 0; s < g->n_segs; s++) {
        int rs = ct_segment_entry(g, s);
        if (here >= 0 && rs < here && rs > mark) mark = rs;
    }
    it->upload_at = bw.lo;
    it->upload_mark = mark < bw.lo ? mark : bw.lo;
    for (int s = 0; s < g->n_segs; s++)   /* does any segment run while it is away? */
        if (g->segs[s].lo > it->download_at || ct_segment_entry(g, s) < it->upload_mark) return true;
    return false;
}

void ct_offload_plan(ct_graph *g, const int *alias, size_t *host) {
    int n = g->n_nodes;
    free(g->off);
    g->off = NULL;
    g->n_off = 0;
    *host = 0;
    if (!g->offload || g->n_segs == 0) return;
    int *root = ct_xmalloc(sizeof(int) * (size_t)n);
    for (int j = 0; j < n; j++) root[j] = alias[j] < 0 ? j : root[alias[j]];
    g->off = ct_xcalloc((size_t)n, sizeof(ct_offload_item));
    size_t esz = ct_dtype_size(g->dt);
    for (int o = 0; o < n; o++) {
        const ct_gnode *gn = &g->nodes[o];
        if (gn->seg < 0 || !gn->kept || alias[o] >= 0) continue;
        ct_offload_item *it = &g->off[g->n_off];
        *it = (ct_offload_item){.owner = o, .bytes = (size_t)(g->batch * ct_layer_out_numel(&gn->l)) * esz};
        ct_span fw, bw;
        ct_buffer_uses(g, root, o, &fw, &bw, &it->written);
        if (!plan_moves(g, it, fw, bw)) continue;   /* an ordinary output: plan.c places it */
        /* on the device from its forward to its download, and from its upload on */
        it->busy[0] = (ct_span){o, it->download_at};
        it->busy[1] = (ct_span){it->upload_mark, bw.hi};
        it->host_off = *host;
        *host += align64(it->bytes);
        g->n_off++;
    }
    free(root);
}

/* The marks and copies due at time t of the step, downloads (forward) or uploads (backward): a
 * copy waits for its item's mark, and copies the first n samples (a short micro-batch's). */
static void copies_due(ct_graph *g, bool down, int t, int64_t n) {
    ct_backend *be = g->be;
    for (int i = 0; i < g->n_off; i++) {
        ct_offload_item *it = &g->off[i];
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

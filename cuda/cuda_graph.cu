/* cuda_graph.cu: whole-step capture with CUDA graphs (be->capture_begin / capture_end / replay /
 * graph_free).
 *
 * The compute stream is captured in thread-local mode, so the loader's worker threads (which
 * never touch the device) are unaffected. While capturing, the caching allocator serves cached
 * blocks first (cudaMalloc under a relaxed capture mode when none fits) and keeps every block
 * freed during the capture for the graph: the recorded kernels hold those addresses, and a replay
 * must find them unchanged (cuda_mem.cu). Op scratch is the exception: it comes from a pool that
 * all graphs and direct ops share, since all of them run in order on the compute stream. Uploads,
 * copies to the host, syncs and host-visible reductions fail loudly during a capture: they use
 * the copy stream, events or a host wait, which a graph cannot hold. */
#include "cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct ct_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ct_cuda_blocks owned;         /* scratch blocks the recorded kernels use */
} ct_cuda_graph;

static int cu_capture_begin(ct_backend *be, ct_err *err) {
    ct_cuda *cu = ct_cuda_of(be);
    if (cu->mem.capturing)
        return ct_errf(err, CT_ERR_RUNTIME, "CUDA graph capture: a capture is already running");
    ct_cuda_alloc_capture_begin(&cu->mem);
    cudaError_t e = cudaStreamBeginCapture(cu->compute, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ct_cuda_blocks owned;
        (void)ct_cuda_alloc_capture_end(&cu->mem, &owned);
        ct_cuda_alloc_give_back(&cu->mem, &owned);
        return ct_errf(err, CT_ERR_RUNTIME, "CUDA graph capture could not start: %s",
                       cudaGetErrorString(e));
    }
    return CT_OK;
}

/* A failed capture recorded nothing that will ever run: its blocks go back to the cache. */
static void *capture_failed(ct_cuda *cu, cudaGraph_t graph, ct_cuda_blocks *owned) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    ct_cuda_alloc_give_back(&cu->mem, owned);
    return NULL;
}

static void *cu_capture_end(ct_backend *be, ct_err *err) {
    ct_cuda *cu = ct_cuda_of(be);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cu->compute, &graph);
    ct_cuda_blocks owned;
    ct_cuda_alloc_capture_end(&cu->mem, &owned);
    if (e != cudaSuccess || !graph) {
        ct_errf(err, CT_ERR_RUNTIME, "CUDA graph capture failed: %s (an op not allowed in a graph "
                "ran during the captured step)", cudaGetErrorString(e));
        return capture_failed(cu, graph, &owned);
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) {
        ct_errf(err, CT_ERR_RUNTIME, "CUDA graph instantiation failed: %s", cudaGetErrorString(e));
        return capture_failed(cu, graph, &owned);
    }
    ct_cuda_graph *g = (ct_cuda_graph *)ct_xcalloc(1, sizeof *g);
    g->graph = graph;
    g->exec = exec;
    g->owned = owned;
    return g;
}

static void cu_replay(ct_backend *be, void *graph) {
    ct_cuda_graph *g = (ct_cuda_graph *)graph;
    CT_CUDA_REQUIRE(g != NULL, "replay of a NULL graph");
    CT_CUDA_CHECK(cudaGraphLaunch(g->exec, ct_cuda_stream(be)));
}

static void cu_graph_free(ct_backend *be, void *graph) {
    ct_cuda_graph *g = (ct_cuda_graph *)graph;
    if (!g) return;
    /* Let queued replays finish first (graph_free is rare: end of run, or a new capture). */
    CT_CUDA_CHECK(cudaStreamSynchronize(ct_cuda_stream(be)));
    CT_CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    CT_CUDA_CHECK(cudaGraphDestroy(g->graph));
    ct_cuda_alloc_give_back(&ct_cuda_of(be)->mem, &g->owned);
    free(g);
}

void ct_cuda_graph_install(ct_backend *be) {
    be->capture.begin = cu_capture_begin;
    be->capture.end = cu_capture_end;
    be->capture.replay = cu_replay;
    be->capture.free = cu_graph_free;
}

/* bench_init.c: how long parameter initialisation takes (ct_param_store_init: the backend's
 * init_fill per view), for the model of a config, on the CPU backend with 1 and all threads.
 *
 * Prints one JSON line per thread count: {"bench": "init", "params": N, "threads": T,
 * "seconds": best of 3}. docs/BENCHMARKS.md, "Parameter initialisation", has the numbers.
 * Build and run (a GPT-2-124M-shaped config is in the comment of that section):
 *   make CUDA=0 all
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. -I/usr/include/cjson bench/bench_init.c build/libctrain.a \
 *      -lcjson -lpng -lz -lopenblas -lm -pthread -ldl -o build/bench_init
 *   build/bench_init CONFIG.json */
#include <stdio.h>

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/cpu/cpu.h"
#include "core/graph/graph.h"
#include "core/params/store.h"

static double time_init(const ct_graph *g, int threads) {
    ct_backend *be = ct_cpu_backend_create(threads);
    const ct_param_layout *L = ct_graph_layout(g);
    ct_param_store *s = NULL;
    ct_err err = {0};
    if (!be || ct_param_store_create(L, be, CT_F32, 0, L->n_params, CT_STORE_WHOLE, &s, &err)) {
        fprintf(stderr, "bench_init: %s\n", err.msg[0] ? err.msg : "no backend");
        return -1;
    }
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = ct_now();
        ct_param_store_init(s, 42 + (uint64_t)r);
        double t = ct_now() - t0;
        if (t < best) best = t;
    }
    ct_param_store_free(s);
    ct_backend_destroy(be);
    return best;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bench_init CONFIG.json\n");
        return 2;
    }
    ct_config_opts o = {.path = argv[1], .world_size = 1};
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err err = {0};
    ct_graph *g = NULL;
    if (ct_config_load(&o, &cfg, &w, &err) || ct_graph_build(cfg, 1, CT_F32, &g, &err)) {
        fprintf(stderr, "bench_init: %s\n", err.msg);
        return 1;
    }
    int64_t n = ct_graph_info_get(g)->n_param_elems;
    ct_backend *probe = ct_cpu_backend_create(0);   /* what train.threads 0 would use */
    int all = probe->threads;
    ct_backend_destroy(probe);
    for (int t = 1; t <= all; t *= 2) {
        double s = time_init(g, t);
        if (s < 0) return 1;
        printf("{\"bench\": \"init\", \"params\": %lld, \"threads\": %d, \"seconds\": %.3f}\n", (long long)n, t, s);
        if (t < all && t * 2 > all) t = all / 2;   /* end on the full count */
    }
    ct_graph_free(g);
    ct_config_free(cfg);
    ct_warnings_free(&w);
    return 0;
}

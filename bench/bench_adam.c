/* bench_adam.c: the CPU backend's AdamW step over one flat buffer of n parameters.
 *
 * Usage: bench_adam N THREADS STEPS ISA COPY
 *   ISA   -1: the kernel the backend picks; 0 baseline, 1 AVX2, 2 AVX-512 (refused when absent)
 *   COPY  none, f16 or bf16: also write the 16-bit copy of the parameters (mixed precision)
 * Runs one untimed step, then STEPS timed ones, and prints one JSON line with every step's
 * seconds. bench/bench_adam.py builds and runs it beside torch.optim.AdamW (docs/BENCHMARKS.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/cpu_internal.h"
#include "core/util/common.h"
#include "core/util/rng.h"

static float *rnd(int64_t n, uint64_t stream, float lo, float span) {
    float *x = malloc((size_t)n * sizeof(float));
    if (!x) return NULL;
    ct_rng r;
    ct_rng_init(&r, 1, CT_RNG_INIT, stream);
    for (int64_t i = 0; i < n; i++) x[i] = lo + span * ct_rng_uniform(&r);
    return x;
}

typedef struct {
    float *p, *g, *m, *v;
    const ct_adam_args *a;
    int isa;
} step_ctx;

static void step_range(void *c, int64_t i0, int64_t i1) {
    const step_ctx *s = c;
    ct_cpu_adam_range(s->p, s->g, s->m, s->v, i0, i1, s->a, s->isa);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s N THREADS STEPS ISA none|f16|bf16\n", argv[0]);
        return 2;
    }
    int64_t n = atoll(argv[1]);
    int threads = atoi(argv[2]), steps = atoi(argv[3]), isa = atoi(argv[4]);
    const char *copy = argv[5];
    ct_dtype copy_dt = !strcmp(copy, "f16") ? CT_F16 : !strcmp(copy, "bf16") ? CT_BF16 : CT_F32;
    if (n <= 0 || steps <= 0 || (copy_dt == CT_F32 && strcmp(copy, "none"))) {
        fprintf(stderr, "bench_adam: bad arguments (N and STEPS > 0, COPY none|f16|bf16)\n");
        return 2;
    }
    int chosen = ct_cpu_adam_isa(isa);
    if (chosen < 0) {
        fprintf(stderr, "bench_adam: this CPU has no kernel %d\n", isa);
        return 2;
    }
    ct_backend *be = ct_cpu_backend_create(threads);
    float *p = rnd(n, 1, -1.0f, 2.0f), *g = rnd(n, 2, -1e-2f, 2e-2f), *m = rnd(n, 3, -1e-3f, 2e-3f),
          *v = rnd(n, 4, 0.0f, 1e-5f);
    void *h = copy_dt == CT_F32 ? NULL : malloc((size_t)n * 2);
    if (!be || !p || !g || !m || !v || (copy_dt != CT_F32 && !h)) {
        fprintf(stderr, "bench_adam: out of memory or no backend\n");
        return 1;
    }
    ct_adam_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                      .weight_decay = 0.01f, .bias_c1 = 0.1f, .bias_c2 = 0.001f,
                      .grad_scale = 1.0f, .decoupled = true, .copy = h, .copy_dt = copy_dt};
    step_ctx c = {p, g, m, v, &a, chosen};
    printf("{\"impl\": \"ctrain\", \"n\": %lld, \"threads\": %d, \"isa\": %d, \"copy\": \"%s\", "
           "\"seconds\": [",
           (long long)n, be->threads, chosen, copy);
    for (int s = 0; s <= steps; s++) {
        double t0 = ct_now();
        ct_cpu_parallel(ct_cpu_pool_of(be), n, CT_CPU_GRAIN / 4, step_range, &c);
        double t = ct_now() - t0;
        if (s > 0) printf("%s%.6f", s > 1 ? ", " : "", t);
    }
    printf("]}\n");
    ct_backend_destroy(be);
    free(p), free(g), free(m), free(v), free(h);
    return 0;
}

/* cpu_bf16_emulate.c: the native bf16 GEMM path with the instructions' arithmetic written out in C
 * (CTRAIN_CPU_BF16=emulate), so that the path can be tested on CPUs without AVX512-BF16 or AMX.
 *
 * Why: the native path (cpu_onednn_bf16.c) is taken only where cpuid reports AVX512-BF16 or
 * AMX-BF16. Its results differ from the widened path's in the last fp32 bits, and tests written on
 * a machine without it once expected the widened bits there (issue 28: test_ops and
 * e2e_gemm_paths failed on an AMX Xeon). With emulate, every CPU runs what differs on such a
 * machine: cpu_gemm.c's native branch (bf16 operands passed through unwidened, the fp32 result
 * rounded to a 16-bit C once), the tiles on the pool, and a summation that is not the fp32 GEMM's,
 * so the tests' expectations for the native path run everywhere (test/e2e_gemm_paths.sh).
 *
 * What is emulated: AVX512-BF16's VDPBF16PS as Intel's SDM describes it. Each fp32 lane of C
 * accumulates its dot product two bf16 pairs per instruction, the odd element of the pair first:
 * acc += a[2i+1] b[2i+1], then acc += a[2i] b[2i], each addition rounded to nearest even in fp32;
 * denormal operands are read as zero (DAZ) and denormal results written as zero (FTZ), whatever
 * MXCSR says. A bf16 x bf16 product is exact in fp32 (8 x 8 significant bits), so what differs from
 * the widened GEMM is the order of the additions and the flushing. oneDNN then applies alpha as an
 * output scale and beta as a sum post-op in fp32 (so here: fl(fl(alpha acc) + fl(beta c))).
 * Not emulated: the order in which a real kernel blocks k (AMX tiles of 32 bf16 values, oneDNN's
 * k blocking), which no test may depend on anyway: they compare the native path with an fp64
 * reference within a bound that holds for any order (test/test_ops.c, gemm_16bit).
 *
 * Cost: scalar C, vectorised over the columns of C by the compiler; a few times slower than the
 * widened GEMM. For tests only; the start block's note says when it is on. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"
#include "core/util/common.h"
#include "core/util/tensor.h"

static bool g_emulate;
static pthread_once_t g_emulate_once = PTHREAD_ONCE_INIT;

static void emulate_read(void) {
    const char *want = getenv("CTRAIN_CPU_BF16");   /* cpu_gemm.c refuses values it does not know */
    g_emulate = want && !strcmp(want, "emulate");
}

const char *ct_cpu_bf16_emulation(void) {
    pthread_once(&g_emulate_once, emulate_read);
    return g_emulate ? "bf16 matrix products are emulated in C as AVX512-BF16 computes them "
                       "(CTRAIN_CPU_BF16=emulate: for tests, slower than fp32); the other bf16 ops "
                       "compute in fp32"
                     : NULL;
}

/* What the bf16 instructions do to a denormal operand or result: a zero of the same sign. */
static inline float flushed(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

/* One tile, C [m, n] (leading dimension ldc) = alpha op(A) op(B) + beta C, on the calling thread;
 * bp: room for k x n floats (op(B) widened, denormals flushed), acc: room for n. */
static void emulated_tile(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                          int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc,
                          float *restrict bp, float *restrict acc) {
    for (int64_t p = 0; p < k; p++)
        for (int64_t j = 0; j < n; j++) bp[p * n + j] = flushed(ct_bf16_to_f32(tb ? b[j * ldb + p] : b[p * ldb + j]));
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) acc[j] = 0.0f;
        for (int64_t p = 0; p < k; p += 2) {
            /* a pair (p, p + 1), odd first; an odd k's last pair has a zero second element */
            if (p + 1 < k) {
                float a1 = flushed(ct_bf16_to_f32(ta ? a[(p + 1) * lda + i] : a[i * lda + p + 1]));
                const float *restrict b1 = bp + (p + 1) * n;
                for (int64_t j = 0; j < n; j++) acc[j] = flushed(acc[j] + a1 * b1[j]);
            }
            float a0 = flushed(ct_bf16_to_f32(ta ? a[p * lda + i] : a[i * lda + p]));
            const float *restrict b0 = bp + p * n;
            for (int64_t j = 0; j < n; j++) acc[j] = flushed(acc[j] + a0 * b0[j]);
        }
        float *restrict ci = c + i * ldc;
        for (int64_t j = 0; j < n; j++) {
            float y = flushed(alpha * acc[j]);
            ci[j] = beta != 0.0f ? flushed(y + flushed(beta * ci[j])) : y;   /* beta 0: C is not read */
        }
    }
}

typedef struct {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const uint16_t *a, *b;
    float *c;
} emulated_job;

static void emulated_tiles(void *ctx, int64_t t0, int64_t t1) {
    const emulated_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        ct_gemm_tile tl = ct_cpu_gemm_tile_at(j->ta, j->tb, j->m, j->n, j->k, j->lda, j->ldb, j->ldc, t);
        float *bp = ct_xmalloc(sizeof(float) * (size_t)(j->k * tl.n + tl.n));
        emulated_tile(j->ta, j->tb, tl.m, tl.n, j->k, j->alpha, j->a + tl.a, j->lda, j->b + tl.b, j->ldb, j->beta,
                      j->c + tl.c, j->ldc, bp, bp + j->k * tl.n);
        free(bp);
    }
}

void ct_cpu_bf16_gemm_emulated(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc) {
    emulated_job j = {ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    ct_cpu_parallel(ct_cpu_pool_of(be), ct_cpu_gemm_tiles(m, n, k), 1, emulated_tiles, &j);
}

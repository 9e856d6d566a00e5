/* cpu_onednn.c: oneDNN's single-threaded fp32 GEMM (dnnl_sgemm), loaded with dlopen when present.
 *
 * oneDNN is an optional second GEMM library beside OpenBLAS: for the shape classes where it
 * measured faster (cpu_gemm.c, gemm_lib_for; docs/BENCHMARKS.md, "oneDNN or OpenBLAS per shape")
 * the GEMM tiles call it instead. Like OpenBLAS it is loaded, not linked:
 * - the CUDA bundle (test/bundle.sh) stays within its 64 MiB: libdnnl.so.2 is 40 MB, which the
 *   GPU runs do not need; where it is missing every GEMM takes OpenBLAS, with the same results
 *   up to rounding;
 * - commands that do no arithmetic never map it (it pulls in libstdc++, libgomp and libOpenCL).
 *
 * Determinism: Debian's build threads with OpenMP. A primitive called from a thread that is not in
 * an OpenMP team uses omp_get_max_threads() of that thread, so every call first sets that thread's
 * OpenMP thread count to 1 (a thread-local setting in libgomp, whatever OMP_NUM_THREADS says):
 * each GEMM tile then runs entirely on the pool thread that calls it, OpenMP starts no threads,
 * and the tiles depend on the shape only (cpu_gemm.c), so the bits do not depend on the thread
 * count. ONEDNN_MAX_CPU_ISA (read by oneDNN itself) caps the instruction set it generates code
 * for; every ISA gives correct results (test_cpu_ops runs the GEMM rows under SSE4.1 too).
 *
 * Signals: a signal handled on a thread while it is inside Debian's oneDNN 2.6 GEMM corrupts the
 * heap (measured: SIGALRM every 200 us with an empty handler aborted in free() within a few
 * calls; e2e_signals' SIGHUP during a step crashed 2 runs in 3; OpenBLAS is not affected). The
 * kernel's signal frame is written below the interrupted stack pointer, so the generated code
 * presumably keeps data there. Each call therefore runs with the asynchronous signals blocked on
 * its thread; one that arrives meanwhile is delivered when the call returns (within
 * milliseconds), and ctrain's handlers only note it for the step loop anyway. Two
 * pthread_sigmask calls cost about a microsecond, against 7 us and more per call here. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

typedef int (*dnnl_sgemm_fn)(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                             float *c, int64_t ldc);
typedef struct dnnl_version_info {   /* dnnl_version_t of dnnl_types.h (2.x) */
    int major, minor, patch;
    const char *hash;
    unsigned cpu_runtime, gpu_runtime;
} dnnl_version_info;

/* Filled once by onednn_load, read-only afterwards. */
typedef struct onednn_lib {
    void *handle;                /* libdnnl.so.2, for the matmul primitive's entry points */
    dnnl_sgemm_fn sgemm;
    void (*omp_set_num_threads)(int);
    char desc[48];               /* "oneDNN 2.6.3", or "" when not loaded */
} onednn_lib;

static onednn_lib g_dnnl;
static pthread_once_t g_dnnl_once = PTHREAD_ONCE_INIT;

static void onednn_load(void) {
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;   /* optional: OpenBLAS takes every GEMM */
    g_dnnl.handle = h;
    /* dlsym on the handle also searches its dependencies, libgomp among them */
    *(void **)&g_dnnl.sgemm = dlsym(h, "dnnl_sgemm");
    *(void **)&g_dnnl.omp_set_num_threads = dlsym(h, "omp_set_num_threads");
    const dnnl_version_info *(*version)(void) = NULL;
    *(void **)&version = dlsym(h, "dnnl_version");
    if (!g_dnnl.sgemm || !g_dnnl.omp_set_num_threads) {
        /* another build (TBB or threadpool runtime): its threads are not ours to pin, so not used */
        g_dnnl.sgemm = NULL;
        return;
    }
    const dnnl_version_info *v = version ? version() : NULL;
    if (v)
        snprintf(g_dnnl.desc, sizeof g_dnnl.desc, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    else
        snprintf(g_dnnl.desc, sizeof g_dnnl.desc, "oneDNN");
}

bool ct_cpu_onednn_load(void) {
    pthread_once(&g_dnnl_once, onednn_load);
    return g_dnnl.sgemm != NULL;
}

const char *ct_cpu_onednn_desc(void) {
    return ct_cpu_onednn_load() ? g_dnnl.desc : NULL;
}

void *ct_cpu_onednn_symbol(const char *name) {
    return ct_cpu_onednn_load() ? dlsym(g_dnnl.handle, name) : NULL;
}

/* Every signal but those a fault raises on the thread itself (those must not be blocked). */
static void async_signals(sigset_t *set) {
    sigfillset(set);
    static const int sync[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof sync / sizeof sync[0]; i++) sigdelset(set, sync[i]);
}

void ct_cpu_onednn_enter(sigset_t *old) {
    sigset_t block;
    async_signals(&block);
    pthread_sigmask(SIG_BLOCK, &block, old);   /* see "Signals" above */
    g_dnnl.omp_set_num_threads(1);   /* this thread only: the tile stays on it (see above) */
}

void ct_cpu_onednn_leave(const sigset_t *old) {
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

void ct_cpu_onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    sigset_t old;
    ct_cpu_onednn_enter(&old);
    /* dnnl_sgemm is row-major like cblas_sgemm with CblasRowMajor; it fails only on bad arguments,
     * which cpu_gemm.c never passes (m, n, k > 0, leading dimensions >= the rows) */
    g_dnnl.sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    ct_cpu_onednn_leave(&old);
}

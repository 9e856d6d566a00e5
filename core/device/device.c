/* device.c: a backend by device name ("cpu", "auto", "cuda", "cuda:N"): the CPU backend or the
 * capped device (core/cpu/cpu.h), or the CUDA backend loaded from libctrain_cuda.so. */
#include "core/device/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cpu/cpu.h"

#ifdef CT_HAVE_CUDA
#include <dlfcn.h>

/* The CUDA backend lives in libctrain_cuda.so, loaded only when the NVIDIA driver is present, so
 * CPU runs never map cuBLASLt (~210 MB resident, ~0.1 s). dlopen is reference-counted and returns
 * the same handle when called again, so nothing is cached here. */
typedef struct cuda_entry {
    ct_cuda_lib lib;
    char tried[1024];   /* where we looked, for the error message */
    char refused[CT_ERR_MSG]; /* why a library that exists could not be used ("" when none) */
} cuda_entry;

static bool driver_present(char *why, size_t n) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        if (why) snprintf(why, n, "%s", dlerror());
        return false;
    }
    return true; /* kept loaded: the CUDA runtime opens it again anyway */
}

int ct_cuda_lib_open(const char *path, ct_cuda_lib *out, ct_err *err) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    /* dlerror's text whole: it names the missing dependency or symbol (libcublasLt.so.13, ...) */
    if (!h) return ct_errf(err, CT_ERR_RUNTIME, "%s: %s (`ldd %s` shows what it needs and what is missing)",
                           path, dlerror(), path);
    int (*abi)(size_t *) = (int (*)(size_t *))dlsym(h, "ct_cuda_backend_abi");
    out->probe = (bool (*)(void))dlsym(h, "ct_cuda_probe");
    out->create = (ct_backend * (*)(int, ct_err *)) dlsym(h, "ct_cuda_backend_create");
    if (!out->probe || !out->create) {
        dlclose(h);
        return ct_errf(err, CT_ERR_RUNTIME, "%s is not a ctrain CUDA backend (no ct_cuda_probe or "
                       "ct_cuda_backend_create)", path);
    }
    /* The op table crosses this boundary: a library built against another layout would call
     * through the wrong slots. */
    size_t bytes = 0;
    int version = abi ? abi(&bytes) : 0;
    if (version == CT_BACKEND_ABI && bytes == sizeof(ct_backend)) return CT_OK;
    dlclose(h);
    if (!abi)
        return ct_errf(err, CT_ERR_RUNTIME, "%s was built by an older ctrain (no op table version; this "
                       "ctrain has version %d): rebuild it with this ctrain (make)", path, CT_BACKEND_ABI);
    return ct_errf(err, CT_ERR_RUNTIME, "%s was built for op table version %d (%zu bytes); this ctrain "
                   "has version %d (%zu bytes): rebuild it with this ctrain (make)", path, version, bytes,
                   CT_BACKEND_ABI, sizeof(ct_backend));
}

/* Candidates, in order: $CTRAIN_CUDA_LIB; beside the executable (build/); bundle/lib/;
 * <prefix>/lib/ctrain/ (make install); the parent folder (build/test/ binaries); the sibling lib/
 * (bundle/test/ binaries). The first that loads is used; one that loads but is refused ends the
 * search with its reason. */
static bool load_cuda_lib(cuda_entry *e) {
    char exe[1024], dir[1024], cand[6][1200];
    int n = 0;
    const char *env = getenv("CTRAIN_CUDA_LIB");
    if (env && *env) snprintf(cand[n++], sizeof cand[0], "%s", env);
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        snprintf(dir, sizeof dir, "%s", exe);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        snprintf(cand[n++], sizeof cand[0], "%s/libctrain_cuda.so", dir);
        snprintf(cand[n++], sizeof cand[0], "%s/lib/libctrain_cuda.so", dir);
        snprintf(cand[n++], sizeof cand[0], "%s/../lib/ctrain/libctrain_cuda.so", dir);
        snprintf(cand[n++], sizeof cand[0], "%s/../libctrain_cuda.so", dir);
        snprintf(cand[n++], sizeof cand[0], "%s/../lib/libctrain_cuda.so", dir);
    }
    e->tried[0] = e->refused[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (access(cand[i], F_OK) != 0) {
            size_t used = strlen(e->tried);
            snprintf(e->tried + used, sizeof e->tried - used, "%s%s", used ? ", " : "", cand[i]);
            continue;
        }
        ct_err why = {0};
        if (ct_cuda_lib_open(cand[i], &e->lib, &why) == CT_OK) return true;
        snprintf(e->refused, sizeof e->refused, "%s", why.msg);
        return false;
    }
    return false;
}
#endif

#ifdef CT_HAVE_CUDA
/* Why the CUDA backend library cannot be used, in one line: the loader's whole reason when one was
 * found (a missing libcublasLt.so.13, an undefined symbol, another op table), else where it was
 * looked for. */
static void lib_failure(const cuda_entry *e, char *why, size_t n) {
    if (e->refused[0]) snprintf(why, n, "the CUDA backend library: %s", e->refused);
    else snprintf(why, n, "the CUDA backend library libctrain_cuda.so was not found (looked in: %s); "
                  "set CTRAIN_CUDA_LIB to its path", e->tried);
}
#endif

/* why (may be NULL) is set only when the NVIDIA driver is there but the CUDA backend library is
 * missing or cannot be loaded: a GPU machine that will train on the CPU, which must not pass
 * unnoticed. No driver, or a driver that sees no device, is the ordinary CPU machine: why "". */
static bool cuda_usable(char *why, size_t n) {
    if (why && n) why[0] = '\0';
#ifdef CT_HAVE_CUDA
    if (!driver_present(NULL, 0)) return false;
    cuda_entry e;
    if (!load_cuda_lib(&e)) {
        if (why && n) lib_failure(&e, why, n);
        return false;
    }
    return e.lib.probe();
#else
    return false;
#endif
}

bool ct_cuda_available(void) { return cuda_usable(NULL, 0); }

/* "cuda" -> 0, "cuda:N" -> N; -1 when the text after "cuda" is not ":<non-negative integer>". */
static int parse_cuda_index(const char *device) {
    const char *rest = device + 4;
    if (*rest == '\0') return 0;
    if (*rest != ':' || rest[1] < '0' || rest[1] > '9') return -1;
    errno = 0;
    char *end = NULL;
    long idx = strtol(rest + 1, &end, 10);
    if (errno || *end != '\0' || idx > 1024) return -1;
    return (int)idx;
}

static int create_cuda(int index, ct_backend **out, ct_err *err) {
#ifdef CT_HAVE_CUDA
    char why[512];
    if (!driver_present(why, sizeof why))
        return ct_errf(err, CT_ERR_RUNTIME, "no usable CUDA device: the NVIDIA driver is not installed "
                       "(%s); use --device cpu", why);
    cuda_entry e;
    if (!load_cuda_lib(&e)) {
        char why_lib[CT_ERR_MSG + 64];
        lib_failure(&e, why_lib, sizeof why_lib);
        return ct_errf(err, CT_ERR_RUNTIME, "%s", why_lib);
    }
    ct_backend *be = e.lib.create(index, err);
    if (!be) return err && err->code ? err->code : CT_ERR_RUNTIME;
    *out = be;
    return CT_OK;
#else
    (void)index;
    (void)out;
    return ct_errf(err, CT_ERR_RUNTIME,
                   "this ctrain was built without CUDA (rebuild where nvcc is available)");
#endif
}

static int create_cpu(int threads, ct_backend **out, ct_err *err) {
    const char *fuse = getenv("CTRAIN_CPU_FUSE"); /* read by ct_cpu_backend_create */
    if (fuse && strcmp(fuse, "0") != 0 && strcmp(fuse, "1") != 0)
        return ct_errf(err, CT_ERR_CONFIG, "environment variable CTRAIN_CPU_FUSE=\"%.40s\": expected 0 (a convolution "
                       "and its ReLU as two passes) or 1 (one pass, the default); or unset it", fuse);
    /* CTRAIN_CAPPED_DEVICE: the CPU as a device of that size (tests, CI: ZeRO-Offload without a GPU) */
    bool capped = false;
    size_t cap = 0;
    double gbps = 0;
    int rc = ct_capped_env(&capped, &cap, &gbps, err);
    if (!rc) rc = ct_cpu_blas_load(err);
    if (rc) return rc;
    int n = ct_cpu_threads_for(threads);
    ct_backend *be = capped ? ct_capped_backend_create(threads, cap, gbps) : ct_cpu_backend_create(threads);
    if (!be) {
        int why = errno;
        return ct_errf(err, CT_ERR_RUNTIME, "cannot start %d CPU worker threads (train.threads %d%s): %s; "
                       "set train.threads lower, or raise the process or memory limits (ulimit -u, -v)",
                       n, threads, threads > 0 ? "" : ": one per online core", strerror(why));
    }
    *out = be;
    return CT_OK;
}

int ct_backend_create_noting(const char *device, int threads, ct_backend **out, char *notice,
                             size_t notice_n, ct_err *err) {
    *out = NULL;
    if (notice_n) notice[0] = '\0';
    if (!device || strcmp(device, "auto") == 0) {
        char why[CT_ERR_MSG + 64];
        if (cuda_usable(why, sizeof why)) return create_cuda(0, out, err);
        if (why[0] && notice_n)
            snprintf(notice, notice_n, "train.device \"auto\": training on the CPU: %s", why);
        return create_cpu(threads, out, err);
    }
    if (strcmp(device, "cpu") == 0) return create_cpu(threads, out, err);
    if (strncmp(device, "cuda", 4) == 0) {
        int index = parse_cuda_index(device);
        if (index >= 0) return create_cuda(index, out, err);
    }
    return ct_errf(err, CT_ERR_CONFIG,
                   "train.device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"",
                   device);
}

int ct_backend_create(const char *device, int threads, ct_backend **out, ct_err *err) {
    return ct_backend_create_noting(device, threads, out, NULL, 0, err);
}

int ct_capped_env(bool *on, size_t *cap, double *gbps, ct_err *err) {
    const char *v = getenv("CTRAIN_CAPPED_DEVICE");
    *on = v != NULL;
    *cap = 0;
    *gbps = 0;
    return v ? ct_capped_parse(v, cap, gbps, err) : CT_OK;
}

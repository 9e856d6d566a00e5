/* backend.c: pick a backend by device name ("cpu", "auto", "cuda", "cuda:N"). */
#include "core/backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool ct_cuda_available(void) {
#ifdef CT_HAVE_CUDA
    return ct_cuda_probe();
#else
    return false;
#endif
}

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
    ct_backend *be = ct_cuda_backend_create(index, err);
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
    ct_backend *be = ct_cpu_backend_create(threads);
    if (!be) return ct_errf(err, CT_ERR_RUNTIME, "cannot start %d CPU worker threads", threads);
    *out = be;
    return CT_OK;
}

int ct_backend_create(const char *device, int threads, ct_backend **out, ct_err *err) {
    *out = NULL;
    if (!device || strcmp(device, "auto") == 0) {
        if (ct_cuda_available()) return create_cuda(0, out, err);
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

void ct_backend_destroy(ct_backend *be) {
    if (be && be->destroy) be->destroy(be);
}

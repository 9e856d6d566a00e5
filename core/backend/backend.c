/* backend.c: what every backend shares beside its op table: destroy, what its memory is, a
 * function of the library it came from. Making one by name is core/device/device.c's. */
#include "core/backend/backend.h"

#include <string.h>

#ifdef CT_HAVE_CUDA
#include <dlfcn.h>
#endif

void *ct_backend_symbol(ct_backend *be, const char *name) {
#ifdef CT_HAVE_CUDA
    /* the library that holds be's functions, found by address: it is loaded (be came from it), so
     * RTLD_NOLOAD only takes another reference, dropped again below */
    Dl_info info;
    if (!be || strcmp(be->name, "cuda") != 0 || !dladdr((void *)be->destroy, &info) || !info.dli_fname) return NULL;
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return NULL;
    void *sym = dlsym(h, name);
    dlclose(h);
    return sym;
#else
    (void)be;
    (void)name;
    return NULL;
#endif
}

void ct_backend_destroy(ct_backend *be) {
    if (be && be->destroy) be->destroy(be);
}

bool ct_backend_separate_memory(const ct_backend *be) { return strcmp(be->name, "cpu") != 0; }

bool ct_backend_host_addressable(const ct_backend *be) {
    return strcmp(be->name, "cpu") == 0 || strcmp(be->name, "capped") == 0;
}

bool ct_backend_cpu_kernels(const ct_backend *be) { return ct_backend_host_addressable(be); }

const char *ct_mem_cat_name(ct_mem_cat c) {
    static const char *const names[CT_MEM_CAT_COUNT] = {"params", "master", "grads", "optim",
                                                        "activations", "workspace", "loader"};
    return (unsigned)c < CT_MEM_CAT_COUNT ? names[c] : "unknown";
}

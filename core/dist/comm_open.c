/* comm_open.c: the communicator a launch needs (comm.h, ct_comm_open): one process, or MPI from
 * libctrain_mpi.so, loaded here with dlopen.
 *
 * Why a library of its own: linking libmpi into ctrain would map it (and its network stack) in
 * every run, and a plain `ctrain --config X` must stay as it was; the library is opened only when
 * a launcher's variables say the process is one rank of several (mpirun's, or torchrun's
 * WORLD_SIZE: then the library joins the ranks itself, rendezvous.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dist/comm.h"
#include "core/dist/launch.h"

typedef int (*mpi_abi_fn)(size_t *);
typedef int (*mpi_create_fn)(ct_backend *, const ct_launch *, ct_comm **, ct_err *);

/* Candidates, in order: $CTRAIN_MPI_LIB; beside the executable (build/); bundle/lib/;
 * <prefix>/lib/ctrain/ (make install); the parent folder (build/test/ binaries). */
static int candidates(char cand[][1200], int max) {
    int n = 0;
    const char *env = getenv("CTRAIN_MPI_LIB");
    if (env && *env) snprintf(cand[n++], sizeof cand[0], "%s", env);
    char exe[1024];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return n;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    const char *rel[] = {"libctrain_mpi.so", "lib/libctrain_mpi.so", "../lib/ctrain/libctrain_mpi.so",
                         "../libctrain_mpi.so"};
    for (int i = 0; i < CT_ARRAY_LEN(rel) && n < max; i++) snprintf(cand[n++], sizeof cand[0], "%s/%s", exe, rel[i]);
    return n;
}

/* RTLD_GLOBAL: OpenMPI's components, which libmpi opens itself, resolve libmpi's and
 * libopen-pal's symbols from the global scope. */
static int load_mpi(ct_backend *be, const ct_launch *l, ct_comm **out, ct_err *err) {
    char cand[5][1200], tried[1024] = "";
    int n = candidates(cand, 5);
    for (int i = 0; i < n; i++) {
        if (access(cand[i], F_OK) != 0) {
            size_t used = strlen(tried);
            if (used + strlen(cand[i]) + 3 < sizeof tried)
                snprintf(tried + used, sizeof tried - used, "%s%.1200s", used ? ", " : "", cand[i]);
            continue;
        }
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_GLOBAL);
        if (!h) return ct_errf(err, CT_ERR_RUNTIME, "%s: %s (`ldd %s` shows what it needs)", cand[i], dlerror(), cand[i]);
        mpi_abi_fn abi = (mpi_abi_fn)dlsym(h, "ct_comm_mpi_abi");
        mpi_create_fn create = (mpi_create_fn)dlsym(h, "ct_comm_mpi_create");
        size_t bytes = 0;
        int version = abi ? abi(&bytes) : 0;
        if (!create || version != CT_COMM_ABI || bytes != sizeof(ct_comm))
            return ct_errf(err, CT_ERR_RUNTIME, "%s was built for another ctrain (communicator table version "
                           "%d, %zu bytes; this ctrain has %d, %zu bytes): rebuild it with this ctrain (make)",
                           cand[i], version, bytes, CT_COMM_ABI, sizeof(ct_comm));
        return create(be, l, out, err);
    }
    return ct_errf(err, CT_ERR_RUNTIME, "data-parallel training over MPI needs libctrain_mpi.so, which "
                   "was not found (looked for %s).\n  Build it with OpenMPI's headers installed (make deps; "
                   "make), or set CTRAIN_MPI_LIB to its path", tried);
}

int ct_comm_open(ct_backend *be, const ct_launch *l, ct_comm **out, ct_err *err) {
    *out = NULL;
    if (!l || l->world <= 1) {
        *out = ct_comm_single(be);
        return CT_OK;
    }
    if (l->launcher == CT_LAUNCH_NONE)
        return ct_errf(err, CT_ERR_CONFIG, "--world-size %d plans for %d ranks; training with them needs a "
                       "launcher.\n  Launch the ranks with mpirun -np %d ctrain --config FILE (OpenMPI; add "
                       "--hostfile FILE for several hosts), or with torchrun", l->world, l->world, l->world);
    if (l->launcher == CT_LAUNCH_ENV && (!l->rank_given || !l->master_addr[0] || !l->master_port)) {
        const char *missing = !l->rank_given ? "RANK" : !l->master_addr[0] ? "MASTER_ADDR" : "MASTER_PORT";
        return ct_errf(err, CT_ERR_CONFIG, "WORLD_SIZE=%d without %s: a torchrun-style launch gives every process "
                       "RANK (0 to %d), and MASTER_ADDR and MASTER_PORT (rank 0's host and a free TCP port, where "
                       "the ranks meet).\n  Set them (torchrun does), or launch with mpirun -np %d ctrain --config FILE",
                       l->world, missing, l->world - 1, l->world);
    }
    if (strcmp(be->name, "cpu") != 0)
        return ct_errf(err, CT_ERR_CONFIG, "%d ranks on the %s backend: data parallelism runs on the CPU "
                       "backend (MPI on host buffers); NCCL for GPUs is not implemented yet. Set "
                       "train.device to \"cpu\"", l->world, be->name);
    int rc = load_mpi(be, l, out, err);
    if (rc) return rc;
    ct_comm *c = *out;
    if (c->rank == l->rank && c->world == l->world) return CT_OK;
    rc = ct_errf(err, CT_ERR_RUNTIME, "MPI says rank %d of %d but %s says rank %d of %d: the process was "
                 "not started by the mpirun whose variables it has", c->rank, c->world, ct_launch_name(l),
                 l->rank, l->world);
    c->failed = true;
    ct_comm_destroy(c);
    *out = NULL;
    return rc;
}

/* comm_open.c: the communicator a launch needs (comm.h, ct_comm_open): one process; MPI from
 * libctrain_mpi.so, loaded here with dlopen (CPU ranks); or NCCL from the CUDA library (GPU ranks).
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
#include "core/dist/rendezvous.h"

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

/* MPI's rank and size against the launcher's: a process started with another mpirun's variables
 * (or with them set by hand, two processes claiming one rank) would train another world than the
 * one it believes in. A launch error, as a bad variable is: CT_ERR_CONFIG. (Under mpirun itself two
 * processes cannot share a rank: mpirun numbers them.) */
static int check_mpi_rank(const ct_comm *c, const ct_launch *l, ct_err *err) {
    if (c->rank == l->rank && c->world == l->world) return CT_OK;
    return ct_errf(err, CT_ERR_CONFIG, "MPI says this process is rank %d of %d, but %s says rank %d of %d: it "
                   "was not started by the launcher whose variables it has.\n  Start the ranks with mpirun -np %d "
                   "(or unset the variables)", c->rank, c->world, ct_launch_name(l), l->rank, l->world, l->world);
}

/* The CUDA library's NCCL entry points (cuda/cuda_comm_nccl.cu). */
typedef int (*nccl_id_fn)(char *hex, size_t hex_n, ct_err *err);
typedef int (*nccl_create_fn)(ct_backend *be, int rank, int world, const char *id_hex, ct_comm *host, int timeout_s,
                              volatile int *stop_signal, ct_comm **out, ct_err *err);

/* GPU ranks: NCCL on device buffers. Rank 0 makes NCCL's unique id and the others get it over what
 * the launch has: the TCP rendezvous (torchrun's variables: rendezvous.h) or MPI (mpirun: its
 * communicator then stays for host values). One rank (CTRAIN_COMM=nccl) needs neither. */
static int open_nccl(ct_backend *be, const ct_launch *l, ct_comm **out, ct_err *err) {
    nccl_id_fn unique_id = (nccl_id_fn)ct_backend_symbol(be, "ct_cuda_nccl_unique_id");
    nccl_create_fn create = (nccl_create_fn)ct_backend_symbol(be, "ct_cuda_comm_nccl_open");
    if (!unique_id || !create)
        return ct_errf(err, CT_ERR_RUNTIME, "this CUDA backend library has no NCCL communicator: rebuild it "
                       "with this ctrain (make)");
    char id[CT_RDZV_LINE_MAX] = "";
    ct_comm *host = NULL;
    ct_rdzv r = {.to_root = -1};
    int rc = CT_OK;
    if (l->world > 1 && l->launcher == CT_LAUNCH_ENV) {
        rc = ct_rdzv_open(&r, l, err);
        if (!rc && l->rank == 0) rc = unique_id(id, sizeof id, err);
        if (!rc) rc = ct_rdzv_share(&r, id, err);
        ct_rdzv_close(&r);
    } else if (l->world > 1) {
        /* mpirun: MPI for the id, and for host values afterwards */
        rc = load_mpi(be, l, &host, err);
        if (!rc) rc = check_mpi_rank(host, l, err);
        enum { ID_HEX = 257 };   /* NCCL's 128-byte id as hex, and its end */
        if (!rc && l->rank == 0) rc = unique_id(id, ID_HEX, err);
        /* a failed rank 0 still joins the broadcast, with an empty id the others refuse */
        if (host) {
            int brc = host->broadcast(host, id, ID_HEX, CT_U8, 0, err);
            rc = rc ? rc : brc;
        }
    } else {
        rc = unique_id(id, sizeof id, err);
    }
    if (!rc) rc = create(be, l->rank, l->world, id, host, l->comm_timeout_s, l->stop_signal, out, err);
    else if (host) {
        host->failed = true;
        ct_comm_destroy(host);
    }
    return rc;
}

int ct_comm_open(ct_backend *be, const ct_launch *l, ct_comm **out, ct_err *err) {
    *out = NULL;
    bool gpu = !ct_backend_host_addressable(be);   /* MPI runs on the CPU's and the capped device's memory */
    if (!l || (l->world <= 1 && !(gpu && l->nccl_always))) {
        *out = ct_comm_single(be);
        return CT_OK;
    }
    if (l->world > 1 && l->launcher == CT_LAUNCH_NONE)
        return ct_errf(err, CT_ERR_CONFIG, "--world-size %d plans for %d ranks; training with them needs a "
                       "launcher.\n  Launch the ranks with mpirun -np %d ctrain --config FILE (OpenMPI; add "
                       "--hostfile FILE for several hosts), or with torchrun", l->world, l->world, l->world);
    if (l->world > 1 && l->launcher == CT_LAUNCH_ENV && (!l->rank_given || !l->master_addr[0] || !l->master_port)) {
        const char *missing = !l->rank_given ? "RANK" : !l->master_addr[0] ? "MASTER_ADDR" : "MASTER_PORT";
        return ct_errf(err, CT_ERR_CONFIG, "WORLD_SIZE=%d without %s: a torchrun-style launch gives every process "
                       "RANK (0 to %d), and MASTER_ADDR and MASTER_PORT (rank 0's host and a free TCP port, where "
                       "the ranks meet).\n  Set them (torchrun does), or launch with mpirun -np %d ctrain --config FILE",
                       l->world, missing, l->world - 1, l->world);
    }
    if (gpu) return open_nccl(be, l, out, err);
    int rc = load_mpi(be, l, out, err);
    if (rc) return rc;
    ct_comm *c = *out;
    if (!(rc = check_mpi_rank(c, l, err))) return CT_OK;
    c->failed = true;
    ct_comm_destroy(c);
    *out = NULL;
    return rc;
}

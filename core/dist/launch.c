/* launch.c: rank and world size from the launcher's environment (launch.h). */
#include "core/dist/launch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variables one launcher family sets. */
typedef struct family {
    ct_launcher launcher;
    const char *size, *rank, *local_rank;
} family;

static const family families[] = {
    {CT_LAUNCH_OPENMPI, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {CT_LAUNCH_PMI, "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"},
    {CT_LAUNCH_ENV, "WORLD_SIZE", "RANK", "LOCAL_RANK"},
};

enum { MAX_WORLD = 1 << 20 };

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* An integer in [lo, hi] from variable `name` (its value v), or CT_ERR_CONFIG saying what was
 * expected. */
static int env_int(const char *name, const char *v, long lo, long hi, const char *expected, int *out,
                   ct_err *err) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi)
        return ct_errf(err, CT_ERR_CONFIG, "%s=\"%.64s\" in the environment: expected %s; fix or unset "
                       "it, or give --world-size N", name, v, expected);
    *out = (int)n;
    return CT_OK;
}

void ct_launch_given(ct_launch *out, int world) {
    *out = (ct_launch){.launcher = CT_LAUNCH_NONE, .rank = 0, .world = world > 0 ? world : 1, .size_var = "",
                       .comm_timeout_s = CT_COMM_TIMEOUT_DEFAULT};
}

static int read_family(const family *f, const char *size, ct_launch *out, ct_err *err) {
    int rc = env_int(f->size, size, 1, MAX_WORLD, "the launcher's world size, a positive integer", &out->world, err);
    if (rc) return rc;
    out->launcher = f->launcher;
    out->size_var = f->size;
    /* no rank variable: rank 0 (`ctrain config check` needs only the size; a run of several ranks
     * under torchrun-style variables without RANK is refused where the ranks meet, ct_comm_open) */
    const char *rank = env(f->rank);
    char expected[96];
    snprintf(expected, sizeof expected, "this process's rank, 0 to %d (%s=%d)", out->world - 1, f->size, out->world);
    if (rank && (rc = env_int(f->rank, rank, 0, out->world - 1, expected, &out->rank, err))) return rc;
    out->rank_given = rank != NULL;
    const char *local = env(f->local_rank);
    if (local && (rc = env_int(f->local_rank, local, 0, MAX_WORLD - 1, "the rank on this host, a "
                               "non-negative integer", &out->local_rank, err)))
        return rc;
    if (f->launcher != CT_LAUNCH_ENV) return CT_OK;
    const char *addr = env("MASTER_ADDR"), *port = env("MASTER_PORT");
    if (addr) snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
    if (port) rc = env_int("MASTER_PORT", port, 1, 65535, "a TCP port, 1 to 65535", &out->master_port, err);
    return rc;
}

int ct_launch_from_env(ct_launch *out, ct_err *err) {
    ct_launch_given(out, 1);
    const char *timeout = env("CTRAIN_COMM_TIMEOUT");
    if (timeout && env_int("CTRAIN_COMM_TIMEOUT", timeout, 0, 86400, "seconds a rank waits for the others in "
                           "one collective, 0 to 86400 (0: no limit; default 60)", &out->comm_timeout_s, err))
        return CT_ERR_CONFIG;
    const char *comm = env("CTRAIN_COMM");
    if (comm && strcmp(comm, "nccl") != 0)
        return ct_errf(err, CT_ERR_CONFIG, "CTRAIN_COMM=\"%.64s\" in the environment: expected nccl (a GPU run of "
                       "one rank over NCCL) or unset", comm);
    out->nccl_always = comm != NULL;
    for (int i = 0; i < CT_ARRAY_LEN(families); i++) {
        const char *size = env(families[i].size);
        if (size) return read_family(&families[i], size, out, err);
    }
    return CT_OK;
}

const char *ct_launch_name(const ct_launch *l) {
    switch (l->launcher) {
    case CT_LAUNCH_OPENMPI: return "mpirun (OMPI_COMM_WORLD_SIZE)";
    case CT_LAUNCH_PMI: return "a PMI launcher (PMI_SIZE)";
    case CT_LAUNCH_ENV: return "WORLD_SIZE";
    default: return "--world-size";
    }
}

/* launch.h: who this process is among the ranks of a data-parallel run, from its launcher.
 *
 * Launchers say it in the environment: OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE, _RANK,
 * _LOCAL_RANK), an MPICH-style PMI launcher (PMI_SIZE, PMI_RANK, MPI_LOCALRANKID), and torchrun
 * or DeepSpeed's launcher (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). The first
 * family whose size variable is set decides; none set is one process, rank 0 of 1. A value that
 * is not what the launcher would write (WORLD_SIZE=abc, RANK >= WORLD_SIZE, a port outside
 * 1..65535) is a config error naming the variable: guessing would train another world than the
 * launcher's, or hang waiting for ranks that do not exist. CTRAIN_COMM_TIMEOUT (seconds, default 60,
 * 0 for none) bounds how long a rank waits in one collective, as torch's init_process_group
 * timeout does; not an integer in 0..86400 is a config error too. CTRAIN_COMM=nccl makes a GPU
 * run of one rank use NCCL all the same (to check it on one GPU); another value is an error. */
#ifndef CT_DIST_LAUNCH_H
#define CT_DIST_LAUNCH_H

#include <stdbool.h>

#include "core/util/common.h"

typedef enum {
    CT_LAUNCH_NONE = 0,          /* no launcher variable: one process (or --world-size) */
    CT_LAUNCH_OPENMPI,           /* mpirun of OpenMPI */
    CT_LAUNCH_PMI,               /* an MPICH-style PMI launcher */
    CT_LAUNCH_ENV,               /* torchrun-style WORLD_SIZE / RANK */
} ct_launcher;

typedef struct ct_launch {
    ct_launcher launcher;
    int rank, world, local_rank;
    bool rank_given;             /* the family's rank variable was set (RANK, ...) */
    const char *size_var;        /* the variable that gave the world size ("" for none) */
    char master_addr[256];       /* CT_LAUNCH_ENV: MASTER_ADDR ("" when unset) */
    int master_port;             /* CT_LAUNCH_ENV: MASTER_PORT (0 when unset) */
    int comm_timeout_s;          /* CTRAIN_COMM_TIMEOUT: seconds a rank waits in one collective
                                    before it ends the job (a rank stopped answering); 0: forever */
    bool nccl_always;            /* CTRAIN_COMM=nccl: the CUDA backend uses NCCL even for one rank
                                    (a GPU check of the NCCL communicator on one GPU) */
    volatile int *stop_signal;   /* not from the environment: the CLI's stop flag (SIGINT, SIGTERM,
                                    SIGHUP; the trainer's ct_run_opts.stop_signal), or NULL. The
                                    communicator's watchdog ends a rank stuck in a wait that a stop
                                    signal cannot reach (watchdog.h), and the rendezvous stops waiting */
} ct_launch;

#define CT_COMM_TIMEOUT_DEFAULT 60

/* The launch as the environment describes it (*out is rank 0 of 1 when nothing is set).
 * CT_ERR_CONFIG naming the variable and its value for a bad one. */
int ct_launch_from_env(ct_launch *out, ct_err *err);

/* One process told its world size on the command line (--world-size N): rank 0 of N, no
 * launcher. */
void ct_launch_given(ct_launch *out, int world);

/* "mpirun (OMPI_COMM_WORLD_SIZE)", "WORLD_SIZE", "--world-size": for messages. */
const char *ct_launch_name(const ct_launch *l);

#endif

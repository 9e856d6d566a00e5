/* rendezvous.h: how the ranks of a torchrun-style launch (WORLD_SIZE, RANK, MASTER_ADDR,
 * MASTER_PORT, no mpirun) find each other before MPI exists among them.
 *
 * A bootstrap, not a transport: rank 0 listens on a TCP port of MASTER_ADDR, every other rank
 * connects and says who it is, and a few short text lines go over these sockets (the address of
 * OpenMPI's rendezvous server, MPI's port name, whose turn it is to join). Training data never
 * does: once the ranks are one MPI communicator (comm_mpi.c) the sockets are closed. This is what
 * NCCL's unique-id exchange and torch's TCPStore do for their process groups.
 *
 * Why OpenMPI needs a server: processes that no mpirun started are MPI "singletons", each in a job
 * of its own, and OpenMPI 4 connects two jobs (MPI_Comm_connect / MPI_Comm_accept) only through a
 * data server both know: `ompi-server`, which rank 0 starts here as its child and whose address
 * it sends to the others before any of them calls MPI_Init (OMPI_MCA_pmix_server_uri).
 *
 * GPU ranks use the same bootstrap for NCCL's unique id (core/dist/comm_open.c), without MPI.
 *
 * Every wait is bounded by the timeout given (CTRAIN_COMM_TIMEOUT): a rank that never comes, a
 * server that does not start, a rank 0 that is not there are errors naming what was waited for.
 * Part of ctrain itself (libctrain.a); libctrain_mpi.so calls it from there (-rdynamic). */
#ifndef CT_DIST_RENDEZVOUS_H
#define CT_DIST_RENDEZVOUS_H

#include <sys/types.h>

#include "core/dist/launch.h"
#include "core/util/common.h"

enum { CT_RDZV_LINE_MAX = 4096 };

typedef struct ct_rdzv {
    int rank, world;
    int timeout_s;               /* bound on every wait, seconds; 0: none (CTRAIN_COMM_TIMEOUT=0) */
    int *peer;                   /* rank 0: peer[r] = the socket of rank r (peer[0] = -1) */
    int to_root;                 /* other ranks: the socket to rank 0 */
    char **who;                  /* rank 0: who[r] = "pid P on host H" of rank r, for a message
                                    about a second process that says it is rank r */
    pid_t server;                /* rank 0: the ompi-server it started (0: none) */
    volatile int *stop;          /* the CLI's stop flag (ct_launch.stop_signal): a stop signal ends a
                                    wait at once, with 128 + the signal (nothing trained yet) */
} ct_rdzv;

/* The TCP port the rendezvous listens on: MASTER_PORT, or MASTER_PORT + 1 under torchrun's
 * static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent holds MASTER_PORT for its
 * own store). */
int ct_rdzv_port(const ct_launch *l);

/* Every rank: meet on MASTER_ADDR:port. Rank 0 waits for the world - 1 others (each checked: the
 * same world size and ctrain, a rank not seen yet); the others connect, retrying until rank 0
 * listens. Two processes of one rank are CT_ERR_CONFIG naming both (pid and host), on rank 0 and on
 * every rank it heard (rank 0 sends them its refusal); a second RANK=0 finds the port taken, asks
 * what holds it, and ends with the same message. */
int ct_rdzv_open(ct_rdzv *r, const ct_launch *l, ct_err *err);

/* Rank 0: send one line (no newline in it) to rank `to`. */
int ct_rdzv_send(ct_rdzv *r, int to, const char *line, ct_err *err);
/* Other ranks: the next line from rank 0, without its newline, into line[CT_RDZV_LINE_MAX]; rank
 * 0's refusal of the launch is its error (its code and message). */
int ct_rdzv_recv(ct_rdzv *r, char *line, ct_err *err);
/* Every rank: rank 0's line[CT_RDZV_LINE_MAX] (an address, an id) sent to every other rank, which
 * receives it into its own line. */
int ct_rdzv_share(ct_rdzv *r, char *line, ct_err *err);

/* Rank 0: start OpenMPI's `ompi-server` (found on PATH) as a child that ends with this process,
 * and read its address into uri[CT_RDZV_LINE_MAX]. */
int ct_rdzv_start_server(ct_rdzv *r, char *uri, ct_err *err);

/* Close the sockets (the ranks are joined, or failed). */
void ct_rdzv_close_sockets(ct_rdzv *r);
/* Close the sockets and stop the server (after MPI_Finalize, or on failure). */
void ct_rdzv_close(ct_rdzv *r);

#endif

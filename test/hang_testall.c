/* hang_testall.c: an LD_PRELOAD shim for test/e2e_dist.sh that makes MPI_Testall never return after
 * its first CT_HANG_AFTER calls (default 100): a rank stuck inside OpenMPI, as one was seen to be
 * after a peer died (issue 28). The watchdog must end such a rank within CTRAIN_COMM_TIMEOUT, and a
 * stop signal must end it too. Built by the test with mpicc; the real call is PMPI_Testall. */
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status statuses[]) {
    static long calls;
    const char *after = getenv("CT_HANG_AFTER");
    if (++calls > (after ? atol(after) : 100))
        for (;;) sleep(1000);   /* a signal handler may run; the call still never returns */
    return PMPI_Testall(count, reqs, flag, statuses);
}

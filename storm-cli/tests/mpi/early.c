/* Rank 2 leaves without MPI_Finalize while the others wait in a barrier. The first barrier
 * makes sure every rank is wired up before it leaves: on one host, MPICH's transport (UCX)
 * attaches each peer's shared memory during MPI_Init, and fails there, aborting the job
 * another way, if that peer is already gone. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 2) exit(0);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}

/* Rank 1 calls MPI_Abort(7) while the others wait in a barrier (once every rank is wired
 * up: see early.c). */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) { fprintf(stderr, "rank 1 aborting\n"); MPI_Abort(MPI_COMM_WORLD, 7); }
    MPI_Barrier(MPI_COMM_WORLD);
    sleep(60);
    MPI_Finalize();
    return 0;
}

/* Rank 1 (by the launcher's PMI_RANK) exits with code 3 before MPI_Init; the others call
 * MPI_Init, where they wait for it. mpirun ends such a job in about a second, with 3. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    const char *rank = getenv("PMI_RANK");
    if (rank && strcmp(rank, "1") == 0) exit(3);
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}

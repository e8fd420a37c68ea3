/* Once every rank is wired up (see early.c), rank 1 fails as argv[1] says: "exit" calls
 * exit(1), "segv" dies of SIGSEGV; the others wait in a barrier. What mpirun gives: 1, 139. */
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        if (argc > 1 && strcmp(argv[1], "segv") == 0) raise(SIGSEGV);
        exit(1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    sleep(60);
    MPI_Finalize();
    return 0;
}

/* Many small collectives over a few seconds: an MPI job that is stopped and resumed by
 * gang scheduling throughout its run. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    int rank, size, iters = argc > 1 ? atoi(argv[1]) : 2000;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long total = 0;
    for (int i = 0; i < iters; i++) {
        int mine = rank + i, sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        total += sum;
        struct timespec ts = {0, 500000};
        nanosleep(&ts, NULL);
    }
    printf("rank %d of %d total=%ld\n", rank, size, total);
    MPI_Finalize();
    return 0;
}

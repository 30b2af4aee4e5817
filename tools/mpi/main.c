/*
 * iha-mpi - the command-line tool of libiha_mpi (doc/mpi.md, doc/cli.md), run under mpirun:
 *   mpirun -n R iha-mpi bench [options]                         (bench.c)
 *   mpirun -n R iha-mpi forward --in DIR --out FILE [options]   (forward.c)
 */
#include <stdio.h>
#include <string.h>

#include "mpi/commands.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int R = 1, rank = 0, code = 2;
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc >= 2 && strcmp(argv[1], "bench") == 0)
        code = mpi_cmd_bench(argc - 1, argv + 1, R, rank);
    else if (argc >= 2 && strcmp(argv[1], "forward") == 0)
        code = mpi_cmd_forward(argc - 1, argv + 1, R, rank);
    else if (rank == 0)
        fprintf(stderr, "usage: mpirun -n R iha-mpi bench|forward [options]   (iha-mpi COMMAND --help)\n");
    MPI_Finalize();
    return code;
}

/*
 * iha-mpi - the command-line tool of libiha_mpi (doc/mpi.md, doc/cli.md), run under mpirun:
 *   mpirun -n R iha-mpi bench [options]                         (bench.c)
 *   mpirun -n R iha-mpi forward --in DIR --out FILE [options]   (forward.c)
 * Its --help lists the commands as the iha command's does, which its manual pages are made
 * from (tools/man/).
 */
#include <stdio.h>
#include <string.h>

#include "mpi/commands.h"

static void print_usage(FILE *out)
{
    fprintf(out, "usage: mpirun -n R iha-mpi <command> [options]\n"
                 "       iha-mpi --help\n\n"
                 "Interleaved Head Attention with the sequence split over the ranks of MPI_COMM_WORLD.\n\n"
                 "commands:\n"
                 "  bench      time ring attention (or the whole layer) over the ranks\n"
                 "  forward    run one IHA layer over the ranks on the .npy files of a directory\n\n"
                 "Run 'iha-mpi <command> --help' for the options of a command.\n");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int R = 1, rank = 0, code = 2;
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc >= 2 && strcmp(argv[1], "bench") == 0) {
        code = mpi_cmd_bench(argc - 1, argv + 1, R, rank);
    } else if (argc >= 2 && strcmp(argv[1], "forward") == 0) {
        code = mpi_cmd_forward(argc - 1, argv + 1, R, rank);
    } else if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        if (rank == 0)
            print_usage(stdout);
        code = 0;
    } else if (rank == 0) {
        if (argc >= 2)
            fprintf(stderr, "iha-mpi: unknown command '%s'\n\n", argv[1]);
        print_usage(stderr);
    }
    MPI_Finalize();
    return code;
}

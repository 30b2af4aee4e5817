/*
 * commands.h - the commands of iha-mpi (tools/mpi/), each run by every rank of
 * MPI_COMM_WORLD with the command's own arguments (argv[0] is the command's name); each returns
 * the exit status, the same on every rank.
 */
#ifndef IHA_TOOLS_MPI_COMMANDS_H
#define IHA_TOOLS_MPI_COMMANDS_H

#include "common/args.h"
#include "iha_mpi.h"

/* "iha-mpi bench": the ring's time, balance and hidden communication, and the layer's (bench.c). */
int mpi_cmd_bench(int argc, char **argv, int R, int rank);

/* "iha-mpi forward": iha forward's layer over the ranks (forward.c). */
int mpi_cmd_forward(int argc, char **argv, int R, int rank);

/* The names of iha_mpi_layout's values, in order, NULL-terminated (--layout). */
extern const char *const layout_names[];

#endif

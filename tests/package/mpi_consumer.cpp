// A C++17 application of libiha_mpi, built by CI's package stage with pkg-config iha_mpi and
// nothing else (-Wall -Wextra -pedantic -Werror), and run under mpirun on 2 ranks or alone:
// iha_mpi.h must compile and link from C++ without MPI's C++ bindings. Each rank checks the
// tokens it holds against iha_mpi_split and that a refused call names its reason.
#include <iha_mpi.h>

#include <cstdio>
#include <cstring>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const std::size_t tokens = 10;
    iha_mpi_run runs[2];
    std::size_t first = 0, count = 0;
    iha_mpi_split(tokens, ranks, rank, &first, &count);
    int failed = iha_mpi_runs(tokens, ranks, rank, IHA_MPI_CONTIGUOUS, runs) != 1 || runs[0].first != first ||
                 runs[0].count != count;
    const iha_buffer none{};
    const iha_status refused =
        iha_mpi_attention(nullptr, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, nullptr, nullptr, none, none, none, none, none);
    if (refused == IHA_OK || std::strlen(iha_mpi_message()) == 0)
        failed = 1;
    std::printf("rank %d of %d: tokens %zu..%zu, a call without a context: %s (%s)\n", rank, ranks, first,
                first + count, iha_status_name(refused), iha_mpi_message());
    MPI_Finalize();
    return failed;
}

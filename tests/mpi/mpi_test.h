/*
 * mpi_test.h - what the tests run under mpirun share: a failure count per rank, the check
 * macro, a seeded generator, device buffers, relative errors and the rows of a rank's runs.
 */
#ifndef IHA_TEST_MPI_TEST_H
#define IHA_TEST_MPI_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "iha_mpi.h"

extern int mpi_test_rank, mpi_test_failures;

#define MPI_CHECK(cond, ...)                                                                                           \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "rank %d: ", mpi_test_rank);                                                               \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            ++mpi_test_failures;                                                                                       \
        }                                                                                                              \
    } while (0)

/* Uniform in [-scale, scale) from a seeded sequence. */
void mpi_test_seed(uint64_t seed);
float mpi_test_random(float scale);

/* A device buffer of n floats holding x (uninitialised when x is NULL), and a blocking read. */
cl_mem mpi_test_buffer(iha_context *ctx, const float *x, size_t n);
void mpi_test_read(iha_context *ctx, cl_mem m, float *x, size_t n);

double mpi_test_rel_l2(const float *a, const double *b, size_t n);

/* The rows of this rank's runs out of a tensor of the whole sequence, [slabs][tokens * k][w]
 * (k rows per token), into [slabs][count * k][w] in run order; returns count. */
size_t mpi_test_gather(const float *whole, float *mine, size_t slabs, size_t tokens, size_t k, size_t w,
                       const iha_mpi_run runs[2]);
size_t mpi_test_gather_d(const double *whole, double *mine, size_t slabs, size_t tokens, size_t k, size_t w,
                         const iha_mpi_run runs[2]);

/* Creates the context on every rank (nonzero on every rank when one failed). */
int mpi_test_context(iha_context **ctx);

/* The failures of every rank summed, printed by rank 0 under `name`; the exit status. */
int mpi_test_finish(const char *name, int ranks);

#endif

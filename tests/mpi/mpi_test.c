/* mpi_test.c - the shared pieces of the tests under mpirun (mpi_test.h). */
#include "mpi_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mpi_test_rank, mpi_test_failures;

static uint64_t state;

void mpi_test_seed(uint64_t seed) { state = seed; }

float mpi_test_random(float scale)
{
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return scale * ((float)((state >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f);
}

cl_mem mpi_test_buffer(iha_context *ctx, const float *x, size_t n)
{
    cl_int e;
    cl_mem m = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, (n ? n : 1) * sizeof(float), NULL, &e);
    if (m != NULL && x != NULL)
        clEnqueueWriteBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL);
    return m;
}

void mpi_test_read(iha_context *ctx, cl_mem m, float *x, size_t n)
{
    clEnqueueReadBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL);
}

double mpi_test_rel_l2(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        const double e = (double)a[i] - b[i];
        num += e * e;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define GATHER(type)                                                                                                   \
    size_t count = runs[0].count + runs[1].count, at = 0;                                                              \
    for (size_t s = 0; s < slabs; ++s)                                                                                 \
        for (int i = 0; i < 2; ++i) {                                                                                  \
            const size_t n = runs[i].count * k * w;                                                                    \
            memcpy(mine + at, whole + (s * tokens * k + runs[i].first * k) * w, n * sizeof(type));                     \
            at += n;                                                                                                   \
        }                                                                                                              \
    return count

size_t mpi_test_gather(const float *whole, float *mine, size_t slabs, size_t tokens, size_t k, size_t w,
                       const iha_mpi_run runs[2])
{
    GATHER(float);
}

size_t mpi_test_gather_d(const double *whole, double *mine, size_t slabs, size_t tokens, size_t k, size_t w,
                         const iha_mpi_run runs[2])
{
    GATHER(double);
}

int mpi_test_context(iha_context **ctx)
{
    char message[256] = "";
    iha_context_options co;
    iha_context_options_init(&co);
    *ctx = NULL;
    const int ok = iha_context_create(ctx, &co, message, sizeof message) == IHA_OK;
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        if (!ok) fprintf(stderr, "rank %d: iha_context_create: %s\n", mpi_test_rank, message);
        iha_context_free(*ctx);
        *ctx = NULL;
        return 1;
    }
    return 0;
}

int mpi_test_finish(const char *name, int ranks)
{
    int total = 0;
    MPI_Allreduce(&mpi_test_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (mpi_test_rank == 0) printf("%s: %d ranks, %d failures\n", name, ranks, total);
    return total == 0 ? 0 : 1;
}

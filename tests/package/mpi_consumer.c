/*
 * An application of libiha_mpi, built by CI's package stage (.ci/package.sh) against an
 * installed iha, through find_package(iha COMPONENTS mpi) and through pkg-config iha_mpi, and
 * run under mpirun on 2 ranks (or alone, as one rank). Each rank says which tokens it holds
 * (iha_mpi_runs), checks that a refused call names its reason (iha_mpi_message), then runs
 * iha_mpi_attention over a sequence split across the ranks and checks its rows of o against
 * iha_attention over the whole sequence on its own device.
 */
#include <iha_mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, H = 2, N = 8, P = 2, DH = 8 };

static cl_mem device_copy(iha_context *ctx, const float *x, size_t n)
{
    cl_int e = CL_SUCCESS;
    cl_mem m = clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, n * sizeof(float), NULL, &e);
    if (m != NULL && x != NULL &&
        clEnqueueWriteBuffer(iha_context_cl_queue(ctx), m, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL) !=
            CL_SUCCESS) {
        clReleaseMemObject(m);
        return NULL;
    }
    return m;
}

/* Rows first .. first + rows - 1 of each [b][h] slab of a [B][H][N*P][DH] tensor. */
static void take_rows(const float *all, size_t first, size_t rows, float *mine)
{
    for (size_t s = 0; s < (size_t)B * H; ++s)
        for (size_t t = 0; t < rows * DH; ++t) mine[s * rows * DH + t] = all[(s * N * P + first) * DH + t];
}

/* 1 when this rank's rows of iha_mpi_attention match iha_attention's. */
static int check_attention(iha_context *ctx, int rank, const iha_mpi_run *run)
{
    const size_t all_n = (size_t)B * H * N * P * DH, rows = run->count * P, mine_n = (size_t)B * H * rows * DH;
    float *host = malloc((3 * all_n + 3 * mine_n + 2 * mine_n) * sizeof(float));
    if (host == NULL) return 0;
    float *q = host, *k = q + all_n, *v = k + all_n, *mq = v + all_n, *mk = mq + mine_n, *mv = mk + mine_n;
    float *ring = mv + mine_n, *single = ring + mine_n;
    unsigned seed = 7; /* the same tensors on every rank */
    for (size_t i = 0; i < 3 * all_n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        q[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
    take_rows(q, run->first * P, rows, mq);
    take_rows(k, run->first * P, rows, mk);
    take_rows(v, run->first * P, rows, mv);

    const iha_shape shape = {.batch = B, .tokens = N, .model_dim = H * DH, .heads = H, .head_dim = DH, .pseudo = P};
    iha_attention_options options;
    iha_attention_options_init(&options);
    options.mask = IHA_MASK_CAUSAL;
    cl_mem m[9] = {device_copy(ctx, q, all_n),    device_copy(ctx, k, all_n),         device_copy(ctx, v, all_n),
                   device_copy(ctx, NULL, all_n), device_copy(ctx, NULL, all_n / DH), device_copy(ctx, mq, mine_n),
                   device_copy(ctx, mk, mine_n),  device_copy(ctx, mv, mine_n),       device_copy(ctx, NULL, mine_n)};
    int ok = 1;
    for (int i = 0; i < 9; ++i) ok = ok && m[i] != NULL;
    iha_status single_st = IHA_ERROR_HOST_MEMORY, ring_st = IHA_ERROR_HOST_MEMORY;
    if (ok) {
        single_st = iha_attention(ctx, &shape, &options, (iha_buffer){m[0], 0}, (iha_buffer){m[1], 0},
                                  (iha_buffer){m[2], 0}, (iha_buffer){m[3], 0}, (iha_buffer){m[4], 0});
        /* Collective: every rank makes the call, whatever its own single-device result. */
        ring_st = iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &shape, &options, (iha_buffer){m[5], 0},
                                    (iha_buffer){m[6], 0}, (iha_buffer){m[7], 0}, (iha_buffer){m[8], 0},
                                    (iha_buffer){NULL, 0});
    } else {
        MPI_Abort(MPI_COMM_WORLD, 1); /* the other ranks would wait in the collective call */
    }
    if (single_st != IHA_OK) fprintf(stderr, "rank %d: iha_attention: %s\n", rank, iha_context_message(ctx));
    if (ring_st != IHA_OK) fprintf(stderr, "rank %d: iha_mpi_attention: %s\n", rank, iha_mpi_message());
    ok = single_st == IHA_OK && ring_st == IHA_OK;
    float *o = q; /* q is not read past this point: its memory holds o */
    cl_command_queue queue = iha_context_cl_queue(ctx);
    ok = ok && clEnqueueReadBuffer(queue, m[3], CL_TRUE, 0, all_n * sizeof(float), o, 0, NULL, NULL) == CL_SUCCESS &&
         clEnqueueReadBuffer(queue, m[8], CL_TRUE, 0, mine_n * sizeof(float), ring, 0, NULL, NULL) == CL_SUCCESS;
    double worst = 0.0;
    if (ok) {
        take_rows(o, run->first * P, rows, single);
        for (size_t i = 0; i < mine_n; ++i) {
            const double e = fabs((double)ring[i] - (double)single[i]);
            worst = e > worst || isnan(e) ? e : worst;
        }
        ok = worst <= 1e-5;
        printf("rank %d: iha_mpi_attention over %zu of %d tokens, largest difference from iha_attention %.2e\n", rank,
               run->count, N, worst);
    }
    for (int i = 0; i < 9; ++i)
        if (m[i] != NULL) clReleaseMemObject(m[i]);
    free(host);
    return ok;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int R = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    iha_mpi_run runs[2];
    int ok = iha_mpi_runs(N, R, rank, IHA_MPI_CONTIGUOUS, runs) == 1 && runs[0].count > 0;
    printf("iha_mpi %s: rank %d of %d holds tokens %zu to %zu of %d\n", iha_version_string(), rank, R, runs[0].first,
           runs[0].first + runs[0].count - 1, N);

    iha_context_options context_options;
    iha_context_options_init(&context_options);
    iha_context *ctx = NULL;
    char why[512];
    if (iha_context_create(&ctx, &context_options, why, sizeof why) != IHA_OK) {
        fprintf(stderr, "rank %d: no context: %s\n", rank, why);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* A refusal is agreed on by every rank and names its reason. */
    const iha_shape empty = {.batch = B, .tokens = 0, .model_dim = H * DH, .heads = H, .head_dim = DH, .pseudo = P};
    iha_attention_options options;
    iha_attention_options_init(&options);
    const iha_buffer none = {NULL, 0};
    const iha_status refused =
        iha_mpi_attention(ctx, MPI_COMM_WORLD, IHA_MPI_CONTIGUOUS, &empty, &options, none, none, none, none, none);
    if (refused == IHA_OK || iha_mpi_message()[0] == '\0') {
        fprintf(stderr, "rank %d: an empty sequence was not refused with a message\n", rank);
        ok = 0;
    } else if (rank == 0) {
        printf("refused as it should be: %s\n", iha_mpi_message());
    }

    ok = check_attention(ctx, rank, &runs[0]) && ok;
    iha_context_free(ctx);
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) printf("iha_mpi consumer on %d ranks: %s\n", R, all_ok ? "ok" : "FAILED");
    MPI_Finalize();
    return all_ok ? 0 : 1;
}

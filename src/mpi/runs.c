/* A rank's runs as the ring uses them: which pairs of runs a mask hides, and the run-major
 * layout in which blocks travel (each run a contiguous tensor), to and from the rank's own. */
#include <string.h>

#include "mpi/ring.h"

iha_mpi_run mpi_ring_run(const mpi_ring *ring, int j, int b) { return ring->runs[2 * j + b]; }

size_t mpi_run_offset(const mpi_ring *ring, int j, int b, size_t w)
{
    return b == 0 ? 0 : ring->slabs * ring->runs[2 * j].count * ring->pseudo * w;
}

int mpi_pair_hidden(const iha_attention_options *options, iha_mpi_run q, iha_mpi_run k)
{
    return (options->mask == IHA_MASK_CAUSAL || options->mask == IHA_MASK_TOKEN_CAUSAL) && k.first >= q.first + q.count;
}

int mpi_block_visible(const iha_attention_options *options, const mpi_ring *ring, int j)
{
    for (int a = 0; a < ring->nruns; ++a)
        for (int b = 0; b < ring->nruns; ++b)
            if (!mpi_pair_hidden(options, mpi_ring_run(ring, ring->rank, a), mpi_ring_run(ring, j, b))) return 1;
    return 0;
}

/* Run b's rows within each slab of rank j's layout: first row and rows. */
static void run_rows(const mpi_ring *ring, int j, int b, size_t *row, size_t *rows)
{
    *row = b == 0 ? 0 : ring->runs[2 * j].count * ring->pseudo;
    *rows = ring->runs[2 * j + b].count * ring->pseudo;
}

static void host_reorder(const mpi_ring *ring, int j, const float *src, float *dst, size_t w, int to_runs)
{
    const size_t all = mpi_ring_tokens(ring, j) * ring->pseudo;
    for (int b = 0; b < ring->nruns; ++b) {
        size_t row, rows;
        run_rows(ring, j, b, &row, &rows);
        const float *run_base = (to_runs ? dst : src) + mpi_run_offset(ring, j, b, w);
        for (size_t s = 0; s < ring->slabs; ++s) {
            const size_t laid = (s * all + row) * w, packed = s * rows * w;
            if (to_runs)
                memcpy((float *)run_base + packed, src + laid, rows * w * sizeof(float));
            else
                memcpy(dst + laid, run_base + packed, rows * w * sizeof(float));
        }
    }
}

void mpi_host_to_runs(const mpi_ring *ring, int j, const float *src, float *dst, size_t w)
{
    host_reorder(ring, j, src, dst, w, 1);
}

void mpi_host_from_runs(const mpi_ring *ring, int j, const float *src, float *dst, size_t w)
{
    host_reorder(ring, j, src, dst, w, 0);
}

static iha_status device_reorder(iha_context *ctx, const mpi_ring *ring, iha_buffer src, iha_buffer dst, size_t w,
                                 int to_runs)
{
    const size_t all = mpi_ring_tokens(ring, ring->rank) * ring->pseudo;
    iha_status st = IHA_OK;
    for (int b = 0; b < ring->nruns && st == IHA_OK; ++b) {
        size_t row, rows;
        run_rows(ring, ring->rank, b, &row, &rows);
        const size_t off = mpi_run_offset(ring, ring->rank, b, w);
        if (to_runs)
            st = mpi_copy_rows(ctx, src, all, row, (iha_buffer){dst.mem, dst.offset + off}, rows, 0, rows, w,
                               ring->slabs);
        else
            st = mpi_copy_rows(ctx, (iha_buffer){src.mem, src.offset + off}, rows, 0, dst, all, row, rows, w,
                               ring->slabs);
    }
    return st;
}

iha_status mpi_device_to_runs(iha_context *ctx, const mpi_ring *ring, iha_buffer src, iha_buffer dst, size_t w)
{
    return device_reorder(ctx, ring, src, dst, w, 1);
}

iha_status mpi_device_from_runs(iha_context *ctx, const mpi_ring *ring, iha_buffer src, iha_buffer dst, size_t w)
{
    return device_reorder(ctx, ring, src, dst, w, 0);
}

/* The ring's shared pieces: the split and the layouts' runs, argument checks every
 * rank agrees on, host and device staging (src/mpi/runs.c: the runs as the ring uses them). */
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/ring.h"

static _Thread_local char mpi_message[512];

const char *iha_mpi_message(void) { return mpi_message; }

iha_status mpi_fail(iha_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mpi_message, sizeof mpi_message, fmt, ap);
    va_end(ap);
    return status;
}

void iha_mpi_split(size_t tokens, int ranks, int rank, size_t *first, size_t *count)
{
    size_t f = 0, c = 0;
    if (ranks > 0 && rank >= 0 && rank < ranks) {
        const size_t R = (size_t)ranks, r = (size_t)rank, base = tokens / R, extra = tokens % R;
        f = r * base + (r < extra ? r : extra);
        c = base + (r < extra ? 1 : 0);
    }
    if (first != NULL) *first = f;
    if (count != NULL) *count = c;
}

int iha_mpi_runs(size_t tokens, int ranks, int rank, iha_mpi_layout layout, iha_mpi_run runs[2])
{
    if (runs == NULL) return 0;
    runs[0] = runs[1] = (iha_mpi_run){0, 0};
    if (ranks <= 0 || rank < 0 || rank >= ranks) return 0;
    if (layout == IHA_MPI_CONTIGUOUS) {
        iha_mpi_split(tokens, ranks, rank, &runs[0].first, &runs[0].count);
        return 1;
    }
    if (layout != IHA_MPI_ZIGZAG || ranks > INT_MAX / 2) return 0;
    iha_mpi_split(tokens, 2 * ranks, rank, &runs[0].first, &runs[0].count);
    iha_mpi_split(tokens, 2 * ranks, 2 * ranks - 1 - rank, &runs[1].first, &runs[1].count);
    return 2;
}

iha_status mpi_copy_rows(iha_context *ctx, iha_buffer src, size_t src_rows, size_t src_row, iha_buffer dst,
                         size_t dst_rows, size_t dst_row, size_t rows, size_t row_floats, size_t slabs)
{
    if (rows == 0 || row_floats == 0 || slabs == 0) return IHA_OK;
    const size_t f = sizeof(float), pitch_s = src_rows * row_floats * f, pitch_d = dst_rows * row_floats * f;
    const size_t so[3] = {(src.offset + src_row * row_floats) * f, 0, 0};
    const size_t doff[3] = {(dst.offset + dst_row * row_floats) * f, 0, 0};
    const size_t region[3] = {rows * row_floats * f, slabs, 1};
    const cl_int e = clEnqueueCopyBufferRect(iha_context_cl_queue(ctx), src.mem, dst.mem, so, doff, region, pitch_s, 0,
                                             pitch_d, 0, 0, NULL, NULL);
    if (e != CL_SUCCESS)
        return mpi_fail(IHA_ERROR_OPENCL, "copying rows between device buffers: clEnqueueCopyBufferRect failed (%d)",
                        (int)e);
    return IHA_OK;
}

size_t mpi_ring_tokens(const mpi_ring *ring, int j) { return ring->runs[2 * j].count + ring->runs[2 * j + 1].count; }

static int mul_ok(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

iha_status mpi_comm_open(mpi_ring *ring, MPI_Comm comm, const char *call)
{
    mpi_message[0] = '\0';
    ring->runs = NULL;
    ring->nruns = 1;
    ring->comm = comm;
    if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &ring->R) != MPI_SUCCESS ||
        MPI_Comm_rank(comm, &ring->rank) != MPI_SUCCESS || ring->R < 1) {
        ring->R = 0;
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: comm is not a usable communicator", call);
    }
    ring->next = (ring->rank + 1) % ring->R;
    ring->prev = (ring->rank + ring->R - 1) % ring->R;
    return IHA_OK;
}

int mpi_fingerprint(const iha_shape *shape, const iha_attention_options *options, int layout, uint64_t extra,
                    uint64_t v[MPI_FINGERPRINT])
{
    static const iha_shape none_shape;
    static const iha_attention_options none_options;
    const iha_shape *s = shape != NULL ? shape : &none_shape;
    const iha_attention_options *o = options != NULL ? options : &none_options;
    uint32_t scale, base;
    memcpy(&scale, &o->scale, sizeof scale);
    memcpy(&base, &o->rope_base, sizeof base);
    const uint64_t all[MPI_FINGERPRINT] = {(uint64_t)layout,
                                           s->batch,
                                           s->tokens,
                                           s->model_dim,
                                           s->heads,
                                           s->head_dim,
                                           s->pseudo,
                                           (uint64_t)o->mask,
                                           (uint64_t)o->window,
                                           scale,
                                           (uint64_t)o->rope,
                                           base,
                                           (uint64_t)o->storage,
                                           (uint64_t)o->weight_storage,
                                           (uint64_t)o->accumulate,
                                           o->seq_count,
                                           extra};
    memcpy(v, all, sizeof all);
    return MPI_FINGERPRINT;
}

iha_status mpi_same_everywhere(const mpi_ring *ring, const uint64_t v[MPI_FINGERPRINT], const char *call)
{
    static const char *const names[MPI_FINGERPRINT] = {"layout",
                                                       "shape->batch",
                                                       "shape->tokens",
                                                       "shape->model_dim",
                                                       "shape->heads",
                                                       "shape->head_dim",
                                                       "shape->pseudo",
                                                       "options->mask",
                                                       "options->window",
                                                       "options->scale",
                                                       "options->rope",
                                                       "options->rope_base",
                                                       "options->storage",
                                                       "options->weight_storage",
                                                       "options->accumulate",
                                                       "options->seq_count",
                                                       "the gradients asked for"};
    /* The largest value and the largest complement give every field's maximum and minimum. */
    uint64_t both[2 * MPI_FINGERPRINT], out[2 * MPI_FINGERPRINT];
    for (int i = 0; i < MPI_FINGERPRINT; ++i) {
        both[i] = v[i];
        both[MPI_FINGERPRINT + i] = ~v[i];
    }
    if (MPI_Allreduce(both, out, 2 * MPI_FINGERPRINT, MPI_UINT64_T, MPI_MAX, ring->comm) != MPI_SUCCESS)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: MPI_Allreduce failed", call);
    for (int i = 0; i < MPI_FINGERPRINT; ++i)
        if (out[i] != ~out[MPI_FINGERPRINT + i])
            return mpi_fail(IHA_ERROR_INVALID_ARGUMENT,
                            "%s: the ranks passed different %s; every rank must pass the same", call, names[i]);
    return IHA_OK;
}

/* What mpi_ring_open checks on this rank alone. */
static iha_status ring_check(mpi_ring *ring, iha_mpi_layout layout, const iha_shape *shape,
                             const iha_attention_options *options, const char *call)
{
    ring->runs = calloc(2 * (size_t)ring->R, sizeof *ring->runs);
    if (ring->runs == NULL) return mpi_fail(IHA_ERROR_HOST_MEMORY, "%s: no host memory for the split", call);
    if (shape == NULL || options == NULL)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: shape and options must not be NULL", call);
    if (shape->batch == 0 || shape->heads == 0 || shape->head_dim == 0 || shape->pseudo == 0)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: batch, heads, head_dim and pseudo must be at least 1", call);
    if (layout != IHA_MPI_CONTIGUOUS && layout != IHA_MPI_ZIGZAG)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: layout %d is not an iha_mpi_layout", call, (int)layout);
    if (shape->tokens < (size_t)ring->R)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: %zu tokens over %d ranks; every rank needs at least one", call,
                        shape->tokens, ring->R);
    /* Every zig-zag chunk must hold a token: an empty run would be a key block of 0 tokens. */
    if (layout == IHA_MPI_ZIGZAG && (ring->R > INT_MAX / 2 || shape->tokens < 2 * (size_t)ring->R))
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT,
                        "%s: %zu tokens over %d ranks in zig-zag; each rank holds two chunks, so at least %zu tokens "
                        "are needed",
                        call, shape->tokens, ring->R, 2 * (size_t)ring->R);
    if (options->storage != IHA_STORAGE_F32 || options->seq_lens != NULL || options->rope != 0)
        return mpi_fail(IHA_ERROR_UNSUPPORTED,
                        "%s takes float32 tensors without packed sequences or "
                        "rotary (storage F32, seq_lens NULL, "
                        "rope 0)",
                        call);
    ring->max_tokens = 0;
    for (int j = 0; j < ring->R; ++j) {
        ring->nruns = iha_mpi_runs(shape->tokens, ring->R, j, layout, &ring->runs[2 * j]);
        if (mpi_ring_tokens(ring, j) > ring->max_tokens) ring->max_tokens = mpi_ring_tokens(ring, j);
    }
    ring->pseudo = shape->pseudo;
    ring->head_dim = shape->head_dim;
    size_t blk;
    if (!mul_ok(shape->batch, shape->heads, &ring->slabs) || !mul_ok(ring->slabs, shape->pseudo, &ring->lse_elems) ||
        !mul_ok(ring->lse_elems, shape->head_dim, &ring->row_elems) || !mul_ok(ring->row_elems, ring->max_tokens, &blk))
        return mpi_fail(IHA_ERROR_SIZE_OVERFLOW, "%s: the block sizes overflow size_t", call);
    if (blk > INT_MAX / 4)
        return mpi_fail(IHA_ERROR_UNSUPPORTED, "%s: a block of %zu floats exceeds one MPI message's int count", call,
                        blk);
    return IHA_OK;
}

iha_status mpi_ring_open(mpi_ring *ring, MPI_Comm comm, iha_mpi_layout layout, const iha_shape *shape,
                         const iha_attention_options *options, const char *call)
{
    iha_status st = mpi_comm_open(ring, comm, call);
    if (ring->R == 0) return st;
    /* First what every rank must pass alike, so that a mismatch reads the same on every rank. */
    uint64_t v[MPI_FINGERPRINT];
    mpi_fingerprint(shape, options, (int)layout, 0, v);
    st = mpi_same_everywhere(ring, v, call);
    return st != IHA_OK ? st : ring_check(ring, layout, shape, options, call);
}

void mpi_ring_close(mpi_ring *ring)
{
    free(ring->runs);
    ring->runs = NULL;
}

iha_status mpi_check_buffer(iha_buffer b, size_t floats, const char *call, const char *name)
{
    if (b.mem == NULL) return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: %s.mem is NULL", call, name);
    size_t bytes = 0;
    if (clGetMemObjectInfo(b.mem, CL_MEM_SIZE, sizeof bytes, &bytes, NULL) != CL_SUCCESS)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: %s.mem is not a buffer", call, name);
    if (b.offset > bytes / sizeof(float) || floats > bytes / sizeof(float) - b.offset)
        return mpi_fail(IHA_ERROR_BUFFER_TOO_SMALL, "%s: %s holds %zu floats past its offset %zu; %zu needed", call,
                        name, bytes / sizeof(float) - (b.offset < bytes / sizeof(float) ? b.offset : 0), b.offset,
                        floats);
    return IHA_OK;
}

iha_status mpi_check_apart(iha_buffer a, size_t na, const char *a_name, iha_buffer b, size_t nb, const char *b_name,
                           const char *call)
{
    if (a.mem == NULL || a.mem != b.mem || na == 0 || nb == 0) return IHA_OK;
    if (a.offset < b.offset + nb && b.offset < a.offset + na)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: %s overlaps %s in the same buffer", call, a_name, b_name);
    return IHA_OK;
}

iha_status mpi_agree(const mpi_ring *ring, iha_status local, const char *call)
{
    /* The lowest failing rank, or R when none failed. */
    int mine = local == IHA_OK ? ring->R : ring->rank, lowest = ring->R;
    if (MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, ring->comm) != MPI_SUCCESS)
        return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: MPI_Allreduce failed", call);
    if (lowest == ring->R) return IHA_OK;
    /* Every rank gets the reason the lowest failing rank gave, so that any rank can report it. */
    char reason[sizeof mpi_message];
    memcpy(reason, mpi_message, sizeof reason);
    MPI_Bcast(reason, (int)sizeof reason, MPI_CHAR, lowest, ring->comm);
    reason[sizeof reason - 1] = '\0';
    if (local != IHA_OK) return local;
    return mpi_fail(IHA_ERROR_INVALID_ARGUMENT, "%s: rank %d refused the call or failed: %s", call, lowest, reason);
}

iha_status mpi_read(iha_context *ctx, iha_buffer src, float *dst, size_t floats)
{
    const cl_int e = clEnqueueReadBuffer(iha_context_cl_queue(ctx), src.mem, CL_TRUE, src.offset * sizeof(float),
                                         floats * sizeof(float), dst, 0, NULL, NULL);
    return e == CL_SUCCESS ? IHA_OK : mpi_fail(IHA_ERROR_OPENCL, "clEnqueueReadBuffer failed (%d)", (int)e);
}

iha_status mpi_write(iha_context *ctx, const float *src, iha_buffer dst, size_t floats)
{
    const cl_int e = clEnqueueWriteBuffer(iha_context_cl_queue(ctx), dst.mem, CL_TRUE, dst.offset * sizeof(float),
                                          floats * sizeof(float), src, 0, NULL, NULL);
    return e == CL_SUCCESS ? IHA_OK : mpi_fail(IHA_ERROR_OPENCL, "clEnqueueWriteBuffer failed (%d)", (int)e);
}

cl_command_queue mpi_upload_queue(iha_context *ctx)
{
    cl_int e = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(iha_context_cl_context(ctx), iha_context_cl_device(ctx), 0, &e);
    return e == CL_SUCCESS ? q : NULL;
}

iha_status mpi_upload(iha_context *ctx, cl_command_queue q, const float *src, iha_buffer k, iha_buffer v, size_t floats,
                      cl_event *done)
{
    *done = NULL;
    if (q == NULL) {
        iha_status st = mpi_write(ctx, src, k, floats);
        return st == IHA_OK ? mpi_write(ctx, src + floats, v, floats) : st;
    }
    const size_t f = sizeof(float);
    cl_event first = NULL;
    cl_int e = clEnqueueWriteBuffer(q, k.mem, CL_FALSE, k.offset * f, floats * f, src, 0, NULL, &first);
    if (e == CL_SUCCESS)
        e = clEnqueueWriteBuffer(q, v.mem, CL_FALSE, v.offset * f, floats * f, src + floats, 1, &first, done);
    if (first != NULL) clReleaseEvent(first);
    if (e == CL_SUCCESS) e = clFlush(q);
    if (e != CL_SUCCESS) {
        if (*done != NULL) clWaitForEvents(1, done), clReleaseEvent(*done);
        *done = NULL;
        clFinish(q);
        return mpi_fail(IHA_ERROR_OPENCL, "clEnqueueWriteBuffer of a block failed (%d)", (int)e);
    }
    return IHA_OK;
}

iha_status mpi_upload_wait(cl_event *done)
{
    if (*done == NULL) return IHA_OK;
    cl_int status = CL_COMPLETE;
    cl_int e = clWaitForEvents(1, done);
    if (e == CL_SUCCESS) e = clGetEventInfo(*done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    clReleaseEvent(*done);
    *done = NULL;
    if (e != CL_SUCCESS || status < 0)
        return mpi_fail(IHA_ERROR_OPENCL, "the upload of a block failed (%d)", (int)(e != CL_SUCCESS ? e : status));
    return IHA_OK;
}

cl_mem mpi_device_buffer(iha_context *ctx, size_t floats, const char *call)
{
    cl_int e = CL_SUCCESS;
    cl_mem m =
        clCreateBuffer(iha_context_cl_context(ctx), CL_MEM_READ_WRITE, (floats ? floats : 1) * sizeof(float), NULL, &e);
    if (m == NULL || e != CL_SUCCESS) {
        mpi_fail(IHA_ERROR_DEVICE_MEMORY, "%s: a staging buffer of %zu floats could not be made (%d)", call, floats,
                 (int)e);
        return NULL;
    }
    return m;
}

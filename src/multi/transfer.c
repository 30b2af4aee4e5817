/* Moving blocks between the contexts: staging buffers in each context's workspace, key and value
 * blocks read to host memory once, non-blocking writes and reads, and the call's end on every
 * context. */
#include <stdlib.h>

#include "layer/plan.h"
#include "multi/multi.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/loop_limit.h"

iha_status multi_staging(const multi_run *m, size_t i, int slot, size_t floats, cl_mem *out)
{
    const iha_status st = iha__workspace_get(m->ctx[i], slot, floats * sizeof(float), out);
    return st == IHA_OK ? st : multi_fail_part(m, i, st, "staging buffer");
}

static iha_status cl_failed(const multi_run *m, size_t i, cl_int err, const char *what)
{
    return multi_fail_part(m, i, iha__fail_cl(m->ctx[i], err, what), NULL);
}

iha_status multi_write(const multi_run *m, size_t i, const float *src, cl_mem dst, size_t floats)
{
    const cl_int err =
        clEnqueueWriteBuffer(m->ctx[i]->queue, dst, CL_FALSE, 0, floats * sizeof(float), src, 0, NULL, NULL);
    return err == CL_SUCCESS ? IHA_OK : cl_failed(m, i, err, "clEnqueueWriteBuffer (staging)");
}

iha_status multi_read(const multi_run *m, size_t i, cl_mem src, float *dst, size_t floats, cl_event *event)
{
    const cl_int err =
        clEnqueueReadBuffer(m->ctx[i]->queue, src, CL_FALSE, 0, floats * sizeof(float), dst, 0, NULL, event);
    return err == CL_SUCCESS ? IHA_OK : cl_failed(m, i, err, "clEnqueueReadBuffer (staging)");
}

iha_status multi_flush(const multi_run *m, size_t i)
{
    const cl_int err = clFlush(m->ctx[i]->queue);
    return err == CL_SUCCESS ? IHA_OK : cl_failed(m, i, err, "clFlush");
}

float *multi_host_block(const multi_run *m, float *host, size_t j) { return host + 2 * m->start[j] * m->row_elems; }

iha_status multi_read_blocks(multi_run *m, const iha_buffer *kt, const iha_buffer *vt, float *host)
{
    for (size_t j = 0; j < m->R; ++j) {
        if (!multi_needed(m, j)) continue;
        const size_t n = multi_part_elems(m, j), bytes = n * sizeof(float);
        float *k = multi_host_block(m, host, j);
        cl_command_queue q = m->ctx[j]->queue;
        /* The queue is in order: the value block's read ends after the key block's. */
        cl_int err = clEnqueueReadBuffer(q, kt[j].mem, CL_FALSE, kt[j].offset * sizeof(float), bytes, k, 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueReadBuffer(q, vt[j].mem, CL_FALSE, vt[j].offset * sizeof(float), bytes, k + n, 0, NULL,
                                      &m->ready[j]);
        if (err == CL_SUCCESS) err = clFlush(q);
        if (err != CL_SUCCESS) return cl_failed(m, j, err, "clEnqueueReadBuffer (key and value block)");
    }
    return IHA_OK;
}

iha_status multi_ready(multi_run *m, size_t j)
{
    if (m->ready[j] == NULL) return IHA_OK;
    const cl_int err = clWaitForEvents(1, &m->ready[j]);
    clReleaseEvent(m->ready[j]);
    m->ready[j] = NULL;
    return err == CL_SUCCESS ? IHA_OK : cl_failed(m, j, err, "clWaitForEvents (key and value block)");
}

iha_status multi_finish(multi_run *m, iha_status st)
{
    /* Every queue finishes, whatever failed: its transfers read and write host memory that the
     * caller frees next. */
    for (size_t i = 0; i < m->R; ++i) {
        const cl_int err = clFinish(m->ctx[i]->queue);
        if (err != CL_SUCCESS && st == IHA_OK) st = cl_failed(m, i, err, "clFinish");
    }
    for (size_t i = 0; i < m->R; ++i) {
        const iha_status end = iha__call_end(m->ctx[i], st);
        if (end != IHA_OK && st == IHA_OK) st = multi_fail_part(m, i, end, NULL);
    }
    return st;
}

/* iha_forward_host: the layer for applications without OpenCL code. Copies the tensors into
 * temporary device buffers, runs iha_forward and reads z back, blocking. */
#include <stdlib.h>

#include "layer/plan.h"
#include "runtime/error.h"

enum { HOST_X, HOST_Z, HOST_WQ, HOST_WK, HOST_WV, HOST_WO, HOST_AQ, HOST_AK, HOST_AV, HOST_R, HOST_COUNT };

/* Copies a host tensor into a new device buffer in `storage`, an iha_storage. */
static iha_status upload(iha_context *ctx, const float *src, size_t elems, int storage, cl_mem *out, const char *name)
{
    const int half = storage != IHA_STORAGE_F32;
    IHA_RETURN_ERROR_IF(src == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "host tensor %s is NULL", name);
    const void *data = src;
    uint16_t *halves = NULL;
    if (half) {
        halves = malloc(elems * sizeof *halves);
        IHA_RETURN_ERROR_IF(halves == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory converting %s", name);
        if (storage == IHA_STORAGE_BF16)
            iha_bf16_from_float(src, halves, elems);
        else
            iha_half_from_float(src, halves, elems);
        data = halves;
    }
    cl_int err = CL_SUCCESS;
    *out = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, elems * (half ? 2 : 4), (void *)data,
                          &err);
    free(halves);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer (host tensor)");
    return IHA_OK;
}

/* Reads z back (blocking), from 16 bits when the activations are half or bfloat16. */
static iha_status download(iha_context *ctx, const iha_plan *p, cl_mem m, float *z)
{
    if (!p->act_half) {
        IHA_CL_CHECK(ctx, clEnqueueReadBuffer(ctx->queue, m, CL_TRUE, 0, p->x_elems * sizeof(float), z, 0, NULL, NULL),
                     "clEnqueueReadBuffer (z)");
        return IHA_OK;
    }
    uint16_t *halves = malloc(p->x_elems * sizeof *halves);
    IHA_RETURN_ERROR_IF(halves == NULL, ctx, IHA_ERROR_HOST_MEMORY, "out of host memory converting z");
    cl_int err = clEnqueueReadBuffer(ctx->queue, m, CL_TRUE, 0, p->x_elems * sizeof *halves, halves, 0, NULL, NULL);
    if (err == CL_SUCCESS && p->act_storage == IHA_STORAGE_BF16)
        iha_bf16_to_float(halves, z, p->x_elems);
    else if (err == CL_SUCCESS)
        iha_half_to_float(halves, z, p->x_elems);
    free(halves);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clEnqueueReadBuffer (z)");
    return IHA_OK;
}

/* iha_forward_host with its temporary device buffers in m (the caller releases them). */
static iha_status forward_through_device(iha_context *ctx, const iha_shape *shape,
                                         const iha_attention_options *options, const iha_host_weights *w,
                                         const float *x, float *z, cl_mem *m)
{
    iha_plan p;
    IHA_FORWARD_IF_ERROR(iha__plan_make(ctx, shape, options, 1, &p));
    IHA_RETURN_ERROR_IF(w == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "weights is NULL");
    IHA_RETURN_ERROR_IF(z == NULL, ctx, IHA_ERROR_INVALID_ARGUMENT, "host tensor z is NULL");
    const int nulls = (w->alpha_q == NULL) + (w->alpha_k == NULL) + (w->alpha_v == NULL) + (w->r == NULL);
    IHA_RETURN_ERROR_IF(nulls != 0 && nulls != 4, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "give all of alpha_q, alpha_k, alpha_v and r, or (with pseudo == 1) none of them");
    IHA_RETURN_ERROR_IF(nulls == 4 && p.dims.P != 1, ctx, IHA_ERROR_INVALID_ARGUMENT,
                        "alpha_q, alpha_k, alpha_v and r may be NULL (identity) only when pseudo == 1, not %zu",
                        p.dims.P);

    IHA_FORWARD_IF_ERROR(upload(ctx, x, p.x_elems, p.act_storage, &m[HOST_X], "x"));
    IHA_FORWARD_IF_ERROR(upload(ctx, w->wq, p.w_elems, p.weight_storage, &m[HOST_WQ], "wq"));
    IHA_FORWARD_IF_ERROR(upload(ctx, w->wk, p.w_elems, p.weight_storage, &m[HOST_WK], "wk"));
    IHA_FORWARD_IF_ERROR(upload(ctx, w->wv, p.w_elems, p.weight_storage, &m[HOST_WV], "wv"));
    IHA_FORWARD_IF_ERROR(upload(ctx, w->wo, p.w_elems, p.weight_storage, &m[HOST_WO], "wo"));
    if (nulls == 0) {
        IHA_FORWARD_IF_ERROR(upload(ctx, w->alpha_q, p.mix_elems, p.weight_storage, &m[HOST_AQ], "alpha_q"));
        IHA_FORWARD_IF_ERROR(upload(ctx, w->alpha_k, p.mix_elems, p.weight_storage, &m[HOST_AK], "alpha_k"));
        IHA_FORWARD_IF_ERROR(upload(ctx, w->alpha_v, p.mix_elems, p.weight_storage, &m[HOST_AV], "alpha_v"));
        IHA_FORWARD_IF_ERROR(upload(ctx, w->r, p.mix_elems, p.weight_storage, &m[HOST_R], "r"));
    }
    cl_int err = CL_SUCCESS;
    m[HOST_Z] = clCreateBuffer(ctx->cl_ctx, CL_MEM_WRITE_ONLY, p.x_elems * p.act_bytes, NULL, &err);
    if (err != CL_SUCCESS) return iha__fail_cl(ctx, err, "clCreateBuffer (z)");

    const iha_layer_weights dw = {{m[HOST_WQ], 0}, {m[HOST_WK], 0}, {m[HOST_WV], 0}, {m[HOST_WO], 0},
                                  {m[HOST_AQ], 0}, {m[HOST_AK], 0}, {m[HOST_AV], 0}, {m[HOST_R], 0}};
    IHA_FORWARD_IF_ERROR(iha_forward(ctx, shape, options, &dw, (iha_buffer){m[HOST_X], 0}, (iha_buffer){m[HOST_Z], 0}));
    return download(ctx, &p, m[HOST_Z], z);
}

iha_status iha_forward_host(iha_context *ctx, const iha_shape *shape, const iha_attention_options *options,
                            const iha_host_weights *weights, const float *x, float *z)
{
    if (ctx == NULL) return IHA_ERROR_INVALID_ARGUMENT;
    cl_mem m[HOST_COUNT] = {0};
    iha_status st = forward_through_device(ctx, shape, options, weights, x, z, m);
    if (st != IHA_OK) clFinish(ctx->queue); /* the temporaries may still be in use */
    for (int i = 0; i < HOST_COUNT; ++i)
        if (m[i]) clReleaseMemObject(m[i]);
    return st;
}
